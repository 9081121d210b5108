//! The op catalogue: every op fusebox knows, loaded from `rules/ops.ron`.
//!
//! Ops are data. A pointwise op is a formula over its operands and attributes; its derivatives
//! are formulas over the operands, the output `y` and the incoming gradient `g`. Layout,
//! reduction and opaque ops name one of a closed set of built-in semantics, so a rule file can
//! rename or re-default them but never smuggle in code.
//!
//! Two pointwise ops are built-ins too: `cast` and `const`. Their values are ordinary formulas,
//! but the engine creates such nodes itself (AMP inserts casts, constant folding adds literals,
//! the matmul lowering absorbs casts), so it finds them by role through
//! [`Catalogue::builtin`], never by name: a rule file may call them anything.

use super::builtin::Builtin;
use super::composite::{Composite, CompositeSpec};
use super::ron_file::{self, RonDocument};
use crate::attr::{AttrType, AttrValue};
use crate::dtype::{Category, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::formula::Expr;
use crate::span::Step;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

mod validate;

pub(super) use validate::is_identifier;
use validate::validate;

/// How an op may take part in fusion (TVM's pattern kinds, reduced to what fusebox needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpKind {
    /// Elementwise with NumPy broadcasting; defined by a formula.
    Pointwise,
    /// Moves or replicates elements without arithmetic (broadcast_to, reshape, transpose, …).
    Layout,
    /// Combines elements along axes (sum, mean, reduce_max, sum_to_size).
    Reduction,
    /// A library call the fuser never looks inside (matmul).
    Opaque,
}

/// How an op's result dtype follows from its operands and attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DtypeRule {
    /// The promotion of the named operands' dtypes (see [`DType::promote`]).
    Promote(Vec<String>),
    /// Like `Promote`, but integer and bool results become f32 (exp, div, sigmoid, …).
    FloatPromote(Vec<String>),
    /// Always bool (comparisons).
    Bool,
    /// The dtype given by the named attribute (cast, const).
    FromAttr(String),
    /// The named operand's dtype (layout ops, reduce_max).
    SameAs(String),
    /// The named operand's dtype, but bool and i32 accumulate into i64 (sum).
    Accumulate(String),
}

/// Which dtypes an operand accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DtypeClass {
    Any,
    Bool,
    Integer,
    Float,
    /// Anything but bool.
    Numeric,
}

impl DtypeClass {
    pub fn admits(self, dtype: DType) -> bool {
        match self {
            DtypeClass::Any => true,
            DtypeClass::Bool => dtype == DType::Bool,
            DtypeClass::Integer => dtype.category() == Category::Integer,
            DtypeClass::Float => dtype.is_float(),
            DtypeClass::Numeric => dtype != DType::Bool,
        }
    }
}

/// The attributes of one use of op `op` that declares `specs`: each given one checked against
/// its declaration, then every declared one bound, defaults filled in. An error names the
/// attribute at fault, if one is. Ops and composites bind their uses the same way.
pub fn bind_attrs(
    op: &str,
    specs: &[AttrSpec],
    given: &crate::attr::Attrs,
) -> std::result::Result<crate::attr::Attrs, (Option<String>, ErrorKind)> {
    for (name, value) in given {
        match specs.iter().find(|a| a.name == *name) {
            None => {
                return Err((
                    Some(name.clone()),
                    ErrorKind::UnknownAttr {
                        op: op.to_string(),
                        attr: name.clone(),
                        suggestion: crate::error::suggest(
                            name,
                            specs.iter().map(|a| a.name.as_str()),
                        ),
                    },
                ));
            }
            Some(spec) if !spec.ty.admits(value) => {
                return Err((
                    Some(name.clone()),
                    ErrorKind::AttrType {
                        attr: name.clone(),
                        expected: spec.ty.to_string(),
                        found: value.to_string(),
                    },
                ));
            }
            Some(_) => {}
        }
    }
    let mut bound = crate::attr::Attrs::new();
    for spec in specs {
        match given.get(&spec.name).or(spec.default.as_ref()) {
            Some(v) => {
                bound.insert(spec.name.clone(), v.clone());
            }
            None if spec.optional => {}
            None => {
                return Err((
                    None,
                    ErrorKind::MissingAttr {
                        op: op.to_string(),
                        attr: spec.name.clone(),
                    },
                ));
            }
        }
    }
    Ok(bound)
}

/// One attribute as declared in `ops.ron`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Attr", deny_unknown_fields)]
pub struct AttrSpec {
    pub name: String,
    pub ty: AttrType,
    /// Used when a node omits the attribute.
    #[serde(default)]
    pub default: Option<AttrValue>,
    /// May be absent with no default (e.g. `axes`: absent means every axis).
    #[serde(default)]
    pub optional: bool,
}

/// One op exactly as written in `ops.ron`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Op", deny_unknown_fields)]
pub struct OpSpec {
    pub name: String,
    pub kind: OpKind,
    #[serde(default)]
    pub operands: Vec<String>,
    /// The last operand may repeat (concat's inputs).
    #[serde(default)]
    pub variadic: bool,
    #[serde(default)]
    pub attrs: Vec<AttrSpec>,
    pub dtype: DtypeRule,
    /// Restrictions on operand dtypes; operands not named accept any dtype.
    #[serde(default)]
    pub accepts: BTreeMap<String, DtypeClass>,
    #[serde(default)]
    pub formula: Option<String>,
    /// Gradient formula per operand; an operand without one gets no gradient (conditions,
    /// comparison inputs).
    #[serde(default)]
    pub derivatives: BTreeMap<String, String>,
    #[serde(default)]
    pub builtin: Option<String>,
    #[serde(default)]
    pub doc: String,
}

/// What an op computes.
#[derive(Debug, Clone, PartialEq)]
pub enum Semantics {
    Formula(Expr),
    Builtin(Builtin),
}

/// A validated op: formulas parsed, names checked, built-in semantics resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDef {
    pub spec: OpSpec,
    pub semantics: Semantics,
    /// Parsed derivative formulas, by operand name.
    pub derivatives: BTreeMap<String, Expr>,
    /// The declared `builtin`: the semantics of a non-pointwise op, the role of a pointwise
    /// built-in (cast, const).
    builtin: Option<Builtin>,
    /// For a gradient op the catalogue derived: the op and operand it differentiates.
    pub gradient_of: Option<(String, String)>,
}

/// The name of the gradient op of `op` for `operand`. It is no identifier, so no declared op
/// can take it.
pub fn gradient_op_name(op: &str, operand: &str) -> String {
    format!("{op}.grad.{operand}")
}

impl OpDef {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn kind(&self) -> OpKind {
        self.spec.kind
    }

    /// The terms this op adds to the loop body of a kernel it joins: its formula's size
    /// ([`Expr::size`]: numbers, names, operators and calls) for a pointwise op, which the
    /// lowering inlines expression by expression, and 1 for anything else (a reduction's
    /// accumulation, a broadcast's index). This, not the op count, is what a C compiler's time
    /// grows with: one op with a 2,048-term formula makes a bigger function than a hundred
    /// `add`s. `max_kernel_terms` in fusion.ron bounds the sum over a kernel.
    pub fn body_terms(&self) -> usize {
        match (self.kind(), self.formula()) {
            (OpKind::Pointwise, Some(formula)) => formula.size(),
            _ => 1,
        }
    }

    pub fn attr(&self, name: &str) -> Option<&AttrSpec> {
        self.spec.attrs.iter().find(|a| a.name == name)
    }

    /// The pointwise op that computes this op's gradient with respect to `operand` from its
    /// derivative formula: the derivative becomes the formula, over the op's operands the
    /// formula reads, then `y` (the op's result) when it reads it, then `g` (the incoming
    /// gradient, which has the result's shape), with the op's attributes. Automatic differentiation applies it like any other op, so the
    /// evaluator, both emitters and fusion treat a backward pass exactly as they treat the
    /// forward one. The result has the broadcast shape of all operands and the float type
    /// they promote to; summing it down to the operand's shape and casting it to the
    /// operand's dtype is the caller's business. `None` without a derivative for `operand`
    /// or for a variadic op.
    pub fn gradient_op(&self, operand: &str) -> Option<OpDef> {
        let derivative = self.derivatives.get(operand)?;
        if self.spec.variadic {
            return None;
        }
        // Only what the formula reads: an operand the gradient does not depend on would make
        // the backward keep a value it never uses (`add`'s gradient is `g` alone).
        let used = derivative.variables();
        let mut operands: Vec<String> = self
            .spec
            .operands
            .iter()
            .filter(|o| used.contains(o))
            .cloned()
            .collect();
        if used.iter().any(|v| v == "y") {
            operands.push("y".into());
        }
        operands.push("g".into());
        let spec = OpSpec {
            name: gradient_op_name(self.name(), operand),
            kind: OpKind::Pointwise,
            dtype: DtypeRule::FloatPromote(operands.clone()),
            operands,
            variadic: false,
            attrs: self.spec.attrs.clone(),
            accepts: self
                .spec
                .accepts
                .iter()
                .filter(|(o, _)| used.contains(o))
                .map(|(o, c)| (o.clone(), *c))
                .collect(),
            formula: Some(derivative.to_string()),
            derivatives: BTreeMap::new(),
            builtin: None,
            doc: format!(
                "The gradient of `{}` with respect to `{operand}`, derived from its derivative formula.",
                self.name()
            ),
        };
        Some(OpDef {
            spec,
            semantics: Semantics::Formula(derivative.clone()),
            derivatives: BTreeMap::new(),
            builtin: None,
            gradient_of: Some((self.name().to_string(), operand.to_string())),
        })
    }

    /// The formula of a pointwise op.
    pub fn formula(&self) -> Option<&Expr> {
        match &self.semantics {
            Semantics::Formula(e) => Some(e),
            Semantics::Builtin(_) => None,
        }
    }

    /// The built-in this op declares: its semantics for layout, reduction and opaque ops;
    /// for a pointwise op, `Cast` or `Const` when it is the catalogue's cast or literal (its
    /// value is still its formula), `None` for every other pointwise op.
    pub fn builtin(&self) -> Option<Builtin> {
        self.builtin
    }

    /// Whether an application of this op is a literal: a pointwise op without operands, whose
    /// value is a function of its attributes alone (the `const` built-in, or a user's nullary
    /// op such as a `pi`). A literal is no kernel of its own: every kernel using it computes
    /// it in place. The single definition the partitioner, the lowering, the report's counts
    /// and the drawings share.
    pub fn is_literal(&self) -> bool {
        self.kind() == OpKind::Pointwise && self.spec.operands.is_empty()
    }

    /// Whether `count` arguments fit this op's operand list.
    pub fn accepts_arity(&self, count: usize) -> bool {
        let fixed = self.spec.operands.len();
        if self.spec.variadic {
            count >= fixed
        } else {
            count == fixed
        }
    }

    /// The arity as people say it: "2" or "at least 1".
    pub fn arity_text(&self) -> String {
        let fixed = self.spec.operands.len();
        if self.spec.variadic {
            format!("at least {fixed}")
        } else {
            fixed.to_string()
        }
    }

    /// The operand name that argument `index` binds to (variadic tails repeat the last name).
    pub fn operand_name(&self, index: usize) -> &str {
        let ops = &self.spec.operands;
        &ops[index.min(ops.len().saturating_sub(1))]
    }
}

/// All known ops, by name.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    ops: BTreeMap<String, Arc<OpDef>>,
    /// The gradient ops derived from the derivative formulas of `ops` (see
    /// [`OpDef::gradient_op`]), by name; rebuilt whenever an op is added or replaced.
    gradients: BTreeMap<String, Arc<OpDef>>,
    /// Per built-in, the op the engine uses when it must create a node with those semantics:
    /// the one declared last.
    builtins: BTreeMap<Builtin, String>,
    /// Ops declared as graphs over other ops, expanded before anything else reads a graph.
    composites: BTreeMap<String, Arc<Composite>>,
}

/// One entry of an `ops.ron` file: an op, or a composite (see [`super::composite`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
enum Entry {
    Op(OpSpec),
    Composite(CompositeSpec),
}

impl Entry {
    fn name(&self) -> &str {
        match self {
            Entry::Op(spec) => &spec.name,
            Entry::Composite(spec) => &spec.name,
        }
    }
}

/// The default op catalogue, embedded in the binary.
pub const DEFAULT_OPS: &str = include_str!("../../rules/ops.ron");

impl Catalogue {
    /// The embedded default catalogue.
    pub fn defaults() -> Catalogue {
        let mut catalogue = Catalogue::default();
        catalogue
            .load_str(DEFAULT_OPS, "rules/ops.ron")
            .expect("the embedded rules/ops.ron is checked by tests");
        catalogue
    }

    /// Parses and validates an `ops.ron` document and adds its ops; an op with a name already
    /// present replaces it. Nothing is added unless the whole file is valid.
    ///
    /// An op declaring a built-in becomes the catalogue's op for it ([`Catalogue::builtin`]),
    /// so a file can rename `cast` by declaring, say, `convert` with `builtin: "cast"`. A file
    /// that replaces the catalogue's last cast op with one that is no cast is refused: the
    /// engine inserts casts (AMP, output copies) and must have one.
    pub fn load_str(&mut self, text: &str, file: &str) -> Result<()> {
        let doc: RonDocument<Vec<Entry>> = ron_file::parse_with_variant_newtypes(text, file)?;
        let mut seen = BTreeMap::new();
        let mut defs = Vec::new();
        let mut pending: BTreeMap<String, &CompositeSpec> = BTreeMap::new();
        for (index, entry) in doc.value.iter().enumerate() {
            let name = entry.name();
            if seen.insert(name.to_string(), index).is_some() {
                let field = [Step::Index(index), Step::field("name")];
                return Err(Error::new(
                    doc.site(&field),
                    ErrorKind::Duplicate {
                        name: name.to_string(),
                    },
                ));
            }
            match entry {
                Entry::Op(spec) => {
                    let path = [Step::Index(index)];
                    let def = validate(spec, &doc, &path).map_err(|mut e| {
                        e.site.op.get_or_insert_with(|| spec.name.clone());
                        e
                    })?;
                    defs.push((index, def));
                }
                Entry::Composite(spec) => {
                    pending.insert(spec.name.clone(), spec);
                }
            }
        }
        let mut next = self.clone();
        for (_, def) in defs {
            // An op replaces a composite of its name as it replaces an op: a rule directory
            // may give `elu` one formula instead of the default's graph. Composites whose
            // bodies use the name then apply the op; a use that no longer fits (an attribute
            // the op lacks) is an error at that use.
            next.composites.remove(def.name());
            next.insert(def);
        }
        // Composites are checked against every op of the file and the catalogue, so a body
        // may use an op declared below it, or another composite of the file.
        let mut file_composites = Vec::new();
        for (index, entry) in doc.value.iter().enumerate() {
            let Entry::Composite(spec) = entry else {
                continue;
            };
            if next.ops.contains_key(&spec.name) || next.gradients.contains_key(&spec.name) {
                let mut site = doc.site(&[Step::Index(index), Step::field("name")]);
                site.op = Some(spec.name.clone());
                return Err(Error::new(
                    site,
                    ErrorKind::Rule(format!(
                        "`{}` is an op of the catalogue already; a composite needs a name of its own",
                        spec.name
                    )),
                ));
            }
            let composite = super::composite::validate(spec, &next, &pending, &doc, index)?;
            file_composites.push((index, spec.name.clone()));
            next.composites
                .insert(spec.name.clone(), Arc::new(composite));
        }
        super::composite::check_cycles(&next, &file_composites, &doc)?;
        super::composite::check_sizes(&next, &file_composites, &doc)?;
        if self.builtin(Builtin::Cast).is_some() && next.builtin(Builtin::Cast).is_none() {
            // Only replacing an op by name can lose a built-in: point at the replacement.
            let index = doc
                .value
                .iter()
                .position(|spec| self.builtin_of(spec.name()) == Some(Builtin::Cast))
                .unwrap_or(0);
            let name = doc.value.get(index).map(|s| s.name().to_string());
            let mut site = doc.site(&[Step::Index(index), Step::field("builtin")]);
            site.op = name.clone();
            return Err(Error::new(
                site,
                ErrorKind::Rule(format!(
                    "`{}` replaces a cast op but declares no `builtin: \"cast\"`, which leaves the catalogue without a cast; fusebox inserts casts (AMP, copies of outputs) and needs one: declare it here or on another op",
                    name.unwrap_or_default()
                )),
            ));
        }
        *self = next;
        Ok(())
    }

    /// Adds `def`, replacing an op of the same name, and makes it the op for its built-in.
    fn insert(&mut self, def: OpDef) {
        let name = def.spec.name.clone();
        let lost = self.builtin_of(&name).filter(|&b| def.builtin() != Some(b));
        if let Some(b) = def.builtin() {
            self.builtins.insert(b, name.clone());
        }
        self.gradients
            .retain(|_, grad| grad.gradient_of.as_ref().map(|(op, _)| op) != Some(&name));
        for operand in def.derivatives.keys() {
            if let Some(grad) = def.gradient_op(operand) {
                self.gradients
                    .insert(grad.name().to_string(), Arc::new(grad));
            }
        }
        self.ops.insert(name, Arc::new(def));
        if let Some(b) = lost {
            // The replaced op held a built-in its replacement does not declare: another op
            // declaring it takes over (the first by name), or the catalogue has none.
            match self.ops.values().find(|op| op.builtin() == Some(b)) {
                Some(op) => {
                    let other = op.name().to_string();
                    self.builtins.insert(b, other);
                }
                None => {
                    self.builtins.remove(&b);
                }
            }
        }
    }

    /// The built-in `name` is the catalogue's op for, if any.
    fn builtin_of(&self, name: &str) -> Option<Builtin> {
        self.builtins
            .iter()
            .find(|(_, op)| op.as_str() == name)
            .map(|(&b, _)| b)
    }

    /// The op called `name`: a declared op, or a gradient op derived from one.
    pub fn get(&self, name: &str) -> Option<&Arc<OpDef>> {
        self.ops.get(name).or_else(|| self.gradients.get(name))
    }

    /// The gradient op of `op` with respect to `operand` (see [`OpDef::gradient_op`]); `None`
    /// when `op` declares no derivative for it.
    pub fn gradient(&self, op: &str, operand: &str) -> Option<&Arc<OpDef>> {
        self.gradients.get(&gradient_op_name(op, operand))
    }

    /// The op the engine uses for built-in `b` when it creates a node itself (a cast AMP
    /// inserts, a folded constant, an output copy): the op declaring `b` that was loaded last.
    /// Other ops may declare `b` too, and are treated alike wherever the engine reads a graph
    /// (`op.builtin() == Some(b)`).
    pub fn builtin(&self, b: Builtin) -> Option<&Arc<OpDef>> {
        self.builtins.get(&b).and_then(|name| self.ops.get(name))
    }

    /// The attributes op or composite `name` declares; `None` when the catalogue has no such
    /// op.
    pub fn declared_attrs(&self, name: &str) -> Option<&[AttrSpec]> {
        self.get(name)
            .map(|op| op.spec.attrs.as_slice())
            .or_else(|| self.composite(name).map(|c| c.spec.attrs.as_slice()))
    }

    /// The composite op called `name`.
    pub fn composite(&self, name: &str) -> Option<&Arc<Composite>> {
        self.composites.get(name)
    }

    pub fn composite_names(&self) -> impl Iterator<Item = &str> {
        self.composites.keys().map(String::as_str)
    }

    pub fn composites(&self) -> impl Iterator<Item = &Arc<Composite>> {
        self.composites.values()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.ops.keys().map(String::as_str)
    }

    pub fn ops(&self) -> impl Iterator<Item = &Arc<OpDef>> {
        self.ops.values()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}
