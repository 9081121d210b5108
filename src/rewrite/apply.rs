//! The checked applier: a rule's right-hand side is type-checked before anything is added.
//!
//! egg's own pattern applier adds the right-hand side and unions it, whatever it denotes. In
//! fusebox every class has one dtype and shape, and a rule that changes either is wrong. So the
//! applier here first evaluates the rule's conditions, then computes the type (and constant) of
//! the right-hand side from the class data of the substitution, exactly as the analysis would:
//!
//! - ill-typed (a shape that does not broadcast, a dtype an op refuses): the instance is
//!   skipped and counted in [`TypeAnalysis::ill_typed`] under the rule's name; conditions are
//!   meant to exclude these, but a skipped instance is harmless;
//! - well-typed but of another type than the matched class, or another known constant: the
//!   rule is unsound. That is recorded in [`TypeAnalysis::conflicts`], naming the rule, and
//!   nothing is unioned; the runner turns a conflict into an error;
//! - otherwise the right-hand side is added and unioned with the matched class.

use super::condition::Condition;
use crate::egraph::analysis::{Constant, IllTyped, op_data};
use crate::egraph::{ClassData, ENode, FuseGraph, TypeAnalysis};
use egg::{Applier, ENodeOrVar, Id, Language, PatternAst, Subst, Symbol};

/// Applies one direction of a rule.
pub(crate) struct CheckedApplier {
    /// The rule's name (without the reverse suffix): ill-typed counts are kept under it.
    pub rule: String,
    /// `NAME` or `NAME (reverse)`, for messages.
    pub direction: String,
    pub when: Vec<Condition>,
    pub compute: Vec<super::Compute>,
    pub build: PatternAst<ENode>,
}

/// The class data the term `pattern` would have under `subst`, computed without adding it:
/// `Err` with the reason when it is ill-typed.
pub fn instance_data(
    egraph: &FuseGraph,
    pattern: &PatternAst<ENode>,
    subst: &Subst,
) -> Result<ClassData, IllTyped> {
    let mut data: Vec<ClassData> = Vec::with_capacity(pattern.len());
    for node in pattern.as_ref() {
        let d = match node {
            ENodeOrVar::Var(v) => {
                let id = subst
                    .get(*v)
                    .ok_or_else(|| IllTyped::Unbound(v.to_string()))?;
                egraph[*id].data.clone()
            }
            ENodeOrVar::ENode(ENode::Attr(leaf)) => ClassData::Attr(leaf.clone()),
            ENodeOrVar::ENode(ENode::Input(name)) => match egraph.analysis.inputs.get(name) {
                Some(ty) => ClassData::Tensor(crate::egraph::TensorData {
                    ty: ty.clone(),
                    constant: None,
                    origin: egraph.analysis.input_origin(*name),
                }),
                None => return Err(IllTyped::NotAnInput(name.to_string())),
            },
            ENodeOrVar::ENode(ENode::Op(name, children)) => ClassData::Tensor(op_data(
                &egraph.analysis.catalogue,
                name.as_str(),
                children,
                |id| data[usize::from(id)].clone(),
            )?),
        };
        if let ClassData::Invalid(why) = &d {
            return Err(why.clone());
        }
        data.push(d);
    }
    data.pop().ok_or(IllTyped::EmptyPattern)
}

fn same_constant(a: Option<Constant>, b: Option<Constant>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x.same(y),
        _ => true,
    }
}

fn record(egraph: &mut FuseGraph, conflict: String) {
    if !egraph.analysis.conflicts.contains(&conflict) {
        egraph.analysis.conflicts.push(conflict);
    }
}

impl Applier<ENode, TypeAnalysis> for CheckedApplier {
    fn apply_one(
        &self,
        egraph: &mut FuseGraph,
        eclass: Id,
        subst: &Subst,
        _searcher_ast: Option<&PatternAst<ENode>>,
        _rule_name: Symbol,
    ) -> Vec<Id> {
        if !self.when.iter().all(|c| c.holds(egraph, eclass, subst)) {
            return Vec::new();
        }
        let Some(matched) = egraph[eclass].data.tensor().cloned() else {
            return Vec::new();
        };
        // Computed attributes join the substitution; a declined computation skips the
        // match as a failed condition would.
        let extended;
        let subst = if self.compute.is_empty() {
            subst
        } else {
            match super::compute::extend(&self.compute, egraph, subst) {
                Some(s) => {
                    extended = s;
                    &extended
                }
                None => return Vec::new(),
            }
        };
        let built = match instance_data(egraph, &self.build, subst) {
            Ok(ClassData::Tensor(t)) => t,
            Ok(_) | Err(_) => {
                *egraph
                    .analysis
                    .ill_typed
                    .entry(self.rule.clone())
                    .or_default() += 1;
                return Vec::new();
            }
        };
        if built.ty != matched.ty {
            record(
                egraph,
                format!(
                    "rule `{}` is unsound: it rewrote {} into {}",
                    self.direction, matched.ty, built.ty
                ),
            );
            return Vec::new();
        }
        if !same_constant(matched.constant, built.constant) {
            record(
                egraph,
                format!(
                    "rule `{}` is unsound: it rewrote the constant {} into {} ({})",
                    self.direction,
                    matched.constant.map_or("?".to_string(), |c| c.to_string()),
                    built.constant.map_or("?".to_string(), |c| c.to_string()),
                    matched.ty
                ),
            );
            return Vec::new();
        }
        let mut ids: Vec<Id> = Vec::with_capacity(self.build.len());
        for node in self.build.as_ref() {
            let id = match node {
                // Bound: `instance_data` checked every variable above.
                ENodeOrVar::Var(v) => subst[*v],
                ENodeOrVar::ENode(e) => egraph.add(e.clone().map_children(|c| ids[usize::from(c)])),
            };
            ids.push(id);
        }
        let Some(&id) = ids.last() else {
            return Vec::new();
        };
        if egraph.union(eclass, id) {
            vec![eclass]
        } else {
            Vec::new()
        }
    }
}
