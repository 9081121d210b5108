//! Reverse-mode automatic differentiation of graphs: the joint forward + backward graph.
//!
//! The backward pass is built from data alone. A pointwise op's gradient is the catalogue's
//! gradient op for it, derived from the op's `derivatives` formula in `ops.ron` (so a
//! user-declared op is differentiable without Rust); every other op's gradient is a template
//! of `gradients.ron`. Where an operand was broadcast, its gradient is summed down to its
//! shape (`sum_to_size`, by linearity kept out of the pointwise kernel that computes it);
//! where the op computed in another dtype, the gradient is cast back. Gradients of a value
//! used several times are added with the op the templates name for it.
//!
//! The result is an ordinary graph: its inputs are the original inputs and one cotangent per
//! floating-point output (`grad_<output>`), its outputs the original outputs and one gradient
//! per differentiated input (`grad_<input>`). Checking, optimizing, AMP, both backends and
//! [`split`] take it like any other graph.
//!
//! ```
//! use fusebox::autodiff::{grad, Wrt};
//! use fusebox::graph::GraphBuilder;
//! use fusebox::dtype::DType;
//! use fusebox::rules::RuleSet;
//!
//! let mut b = GraphBuilder::new("square");
//! let x = b.input("x", DType::F32, &[4]);
//! let y = b.op("y", "mul", &[&x, &x]);
//! let rules = RuleSet::defaults();
//! let joint = grad(&b.finish(&[&y]), &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
//! assert_eq!(joint.graph.outputs, ["y", "grad_x"]);
//! assert_eq!(joint.cotangents, [("y".to_string(), "grad_y".to_string())]);
//! ```

mod env;
pub mod split;
pub mod verify;

use crate::attr::{AttrValue, Attrs};
use crate::error::{Error, ErrorKind, Result, hint};
use crate::graph::check::{TensorType, infer_op, plan_builtin, resolve_attrs};
use crate::graph::{Graph, Input, Node, check};
use crate::rules::builtin::BuiltinAttrs;
use crate::rules::{Builtin, Catalogue, GradientRules, OpDef, OpKind};
use env::{Env, facts};
use std::collections::{BTreeSet, HashMap};

/// Which inputs to differentiate with respect to.
#[derive(Debug, Clone, PartialEq)]
pub enum Wrt {
    /// Every input of a floating-point dtype.
    AllFloatInputs,
    /// These inputs, each of which must exist and be floating-point.
    Inputs(Vec<String>),
}

/// A joint forward + backward graph, and how its new names relate to the original graph.
#[derive(Debug, Clone, PartialEq)]
pub struct JointGraph {
    pub graph: Graph,
    /// `(output, cotangent input)` for every floating-point output, in output order.
    pub cotangents: Vec<(String, String)>,
    /// `(input, gradient output)` for every differentiated input, in input order.
    pub gradients: Vec<(String, String)>,
    /// Names that could not be `grad_<name>` because the graph already used that name, as
    /// `(wanted, given)`.
    pub renamed: Vec<(String, String)>,
    /// Indices into [`GradientRules::rules`] of the templates applied.
    pub templates_used: BTreeSet<usize>,
}

/// The joint forward + backward graph of `graph` (see the module documentation).
pub fn grad(
    graph: &Graph,
    catalogue: &Catalogue,
    templates: &GradientRules,
    wrt: &Wrt,
) -> Result<JointGraph> {
    let types = check(graph, catalogue)?;
    let wrt_names = chosen_inputs(graph, &types, wrt)?;
    let mut builder = Backward::new(graph, catalogue, templates, types);

    // Cotangents first, then the gradient outputs' names: both are reserved before any
    // intermediate name is made.
    let mut cotangents = Vec::new();
    let mut seen_outputs = BTreeSet::new();
    for output in &graph.outputs {
        let ty = builder.types[output].clone();
        if !ty.dtype.is_float() || !seen_outputs.insert(output.clone()) {
            continue;
        }
        let name = builder.fresh_reported(&format!("grad_{output}"));
        builder.inputs.push(Input {
            name: name.clone(),
            dtype: ty.dtype,
            shape: ty.shape.clone(),
        });
        builder.types.insert(name.clone(), ty);
        cotangents.push((output.clone(), name));
    }
    let gradient_names: Vec<(String, String)> = wrt_names
        .iter()
        .map(|x| (x.clone(), builder.fresh_reported(&format!("grad_{x}"))))
        .collect();

    let active = active_values(graph, &wrt_names);
    for (output, cotangent) in &cotangents {
        if active.contains(output.as_str()) {
            builder.contribute(output, cotangent.clone());
        }
    }
    for node in graph.nodes.iter().rev() {
        if active.contains(node.name.as_str()) {
            builder.backward_node(node, &active)?;
        }
    }

    let mut outputs = graph.outputs.clone();
    for (input, name) in &gradient_names {
        builder.finish_gradient(input, name)?;
        outputs.push(name.clone());
    }
    let mut inputs = graph.inputs.clone();
    inputs.extend(builder.inputs);
    let mut nodes = graph.nodes.clone();
    nodes.extend(builder.nodes);
    Ok(JointGraph {
        graph: Graph {
            name: format!("{}_grad", graph.name),
            inputs,
            nodes,
            outputs,
        },
        cotangents,
        gradients: gradient_names,
        renamed: builder.renamed,
        templates_used: builder.templates_used,
    })
}

/// The inputs `wrt` selects, in input order, each checked to exist and be floating-point.
fn chosen_inputs(graph: &Graph, types: &check::TypeMap, wrt: &Wrt) -> Result<Vec<String>> {
    match wrt {
        Wrt::AllFloatInputs => Ok(graph
            .inputs
            .iter()
            .filter(|i| i.dtype.is_float())
            .map(|i| i.name.clone())
            .collect()),
        Wrt::Inputs(names) => {
            let mut chosen = BTreeSet::new();
            for name in names {
                let Some(input) = graph.input(name) else {
                    return Err(Error::input(format!(
                        "cannot differentiate with respect to `{name}`: it is not an input of the graph{}",
                        hint(name, graph.inputs.iter().map(|i| i.name.as_str()))
                    )));
                };
                if !types[name].dtype.is_float() {
                    return Err(Error::input(format!(
                        "cannot differentiate with respect to `{name}`: it is {}, and only floating-point inputs have gradients",
                        input.dtype
                    )));
                }
                chosen.insert(name.as_str());
            }
            Ok(graph
                .inputs
                .iter()
                .filter(|i| chosen.contains(i.name.as_str()))
                .map(|i| i.name.clone())
                .collect())
        }
    }
}

/// The values that depend on a differentiated input: only these carry gradients.
fn active_values<'a>(graph: &'a Graph, wrt: &'a [String]) -> BTreeSet<&'a str> {
    let mut active: BTreeSet<&str> = wrt.iter().map(String::as_str).collect();
    for node in &graph.nodes {
        if node.args.iter().any(|a| active.contains(a.as_str())) {
            active.insert(&node.name);
        }
    }
    active
}

/// The backward nodes being built, with the types of every value so far.
struct Backward<'a> {
    catalogue: &'a Catalogue,
    templates: &'a GradientRules,
    types: check::TypeMap,
    taken: BTreeSet<String>,
    inputs: Vec<Input>,
    nodes: Vec<Node>,
    /// The gradient contributions each value has received, in the order they arrived.
    contributions: HashMap<String, Vec<String>>,
    renamed: Vec<(String, String)>,
    templates_used: BTreeSet<usize>,
}

impl<'a> Backward<'a> {
    fn new(
        graph: &Graph,
        catalogue: &'a Catalogue,
        templates: &'a GradientRules,
        types: check::TypeMap,
    ) -> Backward<'a> {
        let taken = graph
            .inputs
            .iter()
            .map(|i| i.name.clone())
            .chain(graph.nodes.iter().map(|n| n.name.clone()))
            .collect();
        Backward {
            catalogue,
            templates,
            types,
            taken,
            inputs: Vec::new(),
            nodes: Vec::new(),
            contributions: HashMap::new(),
            renamed: Vec::new(),
            templates_used: BTreeSet::new(),
        }
    }

    /// `wanted`, or `wanted_2`, `wanted_3`, … when taken; the name is reserved.
    fn fresh(&mut self, wanted: &str) -> String {
        let mut name = wanted.to_string();
        let mut n = 1;
        while self.taken.contains(&name) {
            n += 1;
            name = format!("{wanted}_{n}");
        }
        self.taken.insert(name.clone());
        name
    }

    /// [`Self::fresh`] for a name the user sees (a cotangent or a gradient output): a changed
    /// name is recorded for the report.
    fn fresh_reported(&mut self, wanted: &str) -> String {
        let name = self.fresh(wanted);
        if name != wanted {
            self.renamed.push((wanted.to_string(), name.clone()));
        }
        name
    }

    fn contribute(&mut self, value: &str, gradient: String) {
        self.contributions
            .entry(value.to_string())
            .or_default()
            .push(gradient);
    }

    /// Adds a node applying `op` and returns its name; its type is inferred at once, so a
    /// template that builds an ill-typed node fails here, naming the forward node.
    fn add_node(
        &mut self,
        wanted: &str,
        op: &str,
        args: Vec<String>,
        attrs: Attrs,
        forward: &str,
    ) -> Result<String> {
        let def = self.op(op, forward)?;
        let located = |kind: ErrorKind| {
            Error::at_node(
                forward,
                ErrorKind::Rule(format!("building the gradient with `{op}`: {kind}")),
            )
        };
        let resolved = resolve_attrs(&def, &attrs).map_err(|(_, kind)| located(kind))?;
        let arg_types: Vec<TensorType> = args.iter().map(|a| self.types[a].clone()).collect();
        if !def.accepts_arity(args.len()) {
            return Err(located(ErrorKind::Arity {
                op: op.to_string(),
                expected: def.arity_text(),
                got: args.len(),
            }));
        }
        let ty = infer_op(&def, &arg_types, &resolved).map_err(|(_, kind)| located(kind))?;
        let name = self.fresh(wanted);
        self.types.insert(name.clone(), ty);
        self.nodes.push(Node {
            name: name.clone(),
            op: op.to_string(),
            args,
            attrs,
        });
        Ok(name)
    }

    fn op(&self, name: &str, forward: &str) -> Result<std::sync::Arc<OpDef>> {
        self.catalogue.get(name).cloned().ok_or_else(|| {
            Error::at_node(
                forward,
                ErrorKind::UnknownOp {
                    op: name.to_string(),
                    suggestion: None,
                },
            )
        })
    }

    /// The sum of the contributions to `value` (the first one alone when there is one).
    fn total(&mut self, value: &str, forward: &str) -> Result<Option<String>> {
        let Some(parts) = self.contributions.remove(value) else {
            return Ok(None);
        };
        let mut parts = parts.into_iter();
        let mut total = parts.next().expect("contributions are pushed, never empty");
        let accumulate = self.templates.accumulate().to_string();
        for part in parts {
            total = self.add_node(
                &format!("d_{value}"),
                &accumulate,
                vec![total, part],
                Attrs::new(),
                forward,
            )?;
        }
        Ok(Some(total))
    }

    /// Propagates the gradient reaching `node` to each of its active floating-point args.
    fn backward_node(&mut self, node: &Node, active: &BTreeSet<&str>) -> Result<()> {
        let Some(g) = self.total(&node.name, &node.name)? else {
            return Ok(());
        };
        let op = self.op(&node.op, &node.name)?;
        for (index, arg) in node.args.iter().enumerate() {
            if !active.contains(arg.as_str()) || !self.types[arg].dtype.is_float() {
                continue;
            }
            let operand = op.operand_name(index).to_string();
            let part = self.operand_gradient(node, &op, index, &operand, &g)?;
            let part = self.fit(part, arg, &node.name)?;
            self.contribute(arg, part);
        }
        Ok(())
    }

    /// The gradient of `node` with respect to its `index`-th argument: a template of
    /// `gradients.ron` when one applies, else the catalogue's gradient op.
    fn operand_gradient(
        &mut self,
        node: &Node,
        op: &OpDef,
        index: usize,
        operand: &str,
        g: &str,
    ) -> Result<String> {
        if let Some(result) = self.apply_template(node, op, index, operand, g)? {
            return Ok(result);
        }
        if op.derivatives.get(operand) == Some(&crate::formula::Expr::Var("g".into())) {
            // The gradient passes through unchanged (add, a cast): no node for it.
            return Ok(g.to_string());
        }
        if let Some(gradient_op) = self.catalogue.gradient(op.name(), operand).cloned() {
            let args = gradient_op
                .spec
                .operands
                .iter()
                .map(|name| match name.as_str() {
                    "y" => node.name.clone(),
                    "g" => g.to_string(),
                    operand => {
                        let at = (0..node.args.len())
                            .find(|&i| op.operand_name(i) == operand)
                            .expect("gradient ops read the op's own operands");
                        node.args[at].clone()
                    }
                })
                .collect();
            return self.add_node(
                &format!("d_{}.{operand}", node.name),
                gradient_op.name(),
                args,
                node.attrs.clone(),
                &node.name,
            );
        }
        let why = match op.kind() {
            OpKind::Pointwise => format!(
                "`{}` declares no derivative for operand `{operand}` in ops.ron",
                op.name()
            ),
            _ => format!(
                "gradients.ron has no template for operand `{operand}` of `{}` that applies here",
                op.name()
            ),
        };
        Err(Error::at_node(
            &node.name,
            ErrorKind::Rule(format!("cannot differentiate: {why}")),
        ))
    }

    /// Instantiates the first template for `op`'s `operand` whose condition holds. Templates
    /// are found by the op's name, or by the name of the catalogue's op for its built-in (so
    /// an op a rule file declares with `builtin: "sum"` uses the template of `sum`).
    fn apply_template(
        &mut self,
        node: &Node,
        op: &OpDef,
        index: usize,
        operand: &str,
        g: &str,
    ) -> Result<Option<String>> {
        let by_builtin = op
            .builtin()
            .and_then(|b| self.catalogue.builtin(b))
            .map(|def| def.name().to_string());
        let templates = self.templates;
        let for_op = |name: &str| {
            let name = name.to_string();
            templates
                .rules()
                .iter()
                .enumerate()
                .filter(move |(_, rule)| rule.op == name && rule.operand == operand)
        };
        let mut candidates: Vec<_> = for_op(op.name()).collect();
        if candidates.is_empty()
            && let Some(name) = &by_builtin
        {
            candidates = for_op(name).collect();
        }
        if candidates.is_empty() {
            return Ok(None);
        }
        let rule_error = |message: String| {
            Error::at_node(
                &node.name,
                ErrorKind::Rule(format!(
                    "gradient template for operand `{operand}` of `{}` ({}): {message}",
                    op.name(),
                    templates.file
                )),
            )
        };
        // Template values: the op's operands (a variadic operand means this argument), then
        // y and g, then the template's own nodes.
        let mut bound: HashMap<String, String> = HashMap::new();
        for (i, arg) in node.args.iter().enumerate() {
            let name = op.operand_name(i);
            if name != operand || i == index {
                bound.entry(name.to_string()).or_insert_with(|| arg.clone());
            }
        }
        bound.insert(operand.to_string(), node.args[index].clone());
        bound.insert("y".into(), node.name.clone());
        bound.insert("g".into(), g.to_string());
        let node_facts = self.node_facts(node, op, index)?;

        let mut chosen = None;
        for (rule_index, rule) in candidates {
            let env = Env::new(&bound, &self.types, &node_facts);
            let applies = match &rule.when {
                None => true,
                Some(condition) => condition
                    .holds(&env)
                    .map_err(|e| rule_error(e.to_string()))?,
            };
            if applies {
                chosen = Some(rule.clone());
                self.templates_used.insert(rule_index);
                break;
            }
        }
        let Some(rule) = chosen else {
            return Ok(None);
        };
        let mut last = None;
        for template in &rule.nodes {
            let env = Env::new(&bound, &self.types, &node_facts);
            let mut attrs = Attrs::new();
            for (name, expr) in &template.attrs {
                let value = expr
                    .eval(&env)
                    .map_err(|e| rule_error(format!("node `{}`, `{name}`: {e}", template.name)))?;
                attrs.insert(name.clone(), value);
            }
            let args = template.args.iter().map(|a| bound[a].clone()).collect();
            let made = self.add_node(
                &format!("d_{}.{}", node.name, template.name),
                &template.op,
                args,
                attrs,
                &node.name,
            )?;
            bound.insert(template.name.clone(), made.clone());
            last = Some(made);
        }
        Ok(last)
    }

    /// What the forward node's built-in resolved its attributes to, for templates to read.
    fn node_facts(&self, node: &Node, op: &OpDef, index: usize) -> Result<Attrs> {
        let resolved =
            resolve_attrs(op, &node.attrs).map_err(|(_, kind)| Error::at_node(&node.name, kind))?;
        let shapes: Vec<&[usize]> = node
            .args
            .iter()
            .map(|a| self.types[a].shape.as_slice())
            .collect();
        let plan = match op.builtin() {
            Some(b) if !matches!(b, Builtin::Cast | Builtin::Const) => Some(
                plan_builtin(b, &shapes, &resolved)
                    .map_err(|m| Error::at_node(&node.name, ErrorKind::Shape(m.to_string())))?
                    .0,
            ),
            _ => None,
        };
        let mut all = facts(plan.as_ref(), &shapes, index);
        all.insert(
            "rank".into(),
            AttrValue::Int(self.types[&node.name].shape.len() as i64),
        );
        Ok(all)
    }

    /// `gradient` summed down to the shape of `value` where broadcasting widened it, and cast
    /// to `value`'s dtype where the op computed in another.
    fn fit(&mut self, gradient: String, value: &str, forward: &str) -> Result<String> {
        let want = self.types[value].clone();
        let have = self.types[&gradient].clone();
        let mut fitted = gradient;
        if have.shape != want.shape {
            if !crate::shape::broadcasts_to(&want.shape, &have.shape) {
                return Err(Error::at_node(
                    forward,
                    ErrorKind::Rule(format!(
                        "the gradient built for `{value}` has shape {:?}, which does not sum down to `{value}`'s shape {:?}",
                        have.shape, want.shape
                    )),
                ));
            }
            let op = self.builtin_op(Builtin::SumToSize, forward)?;
            fitted = self.add_node(
                &format!("d_{value}.summed"),
                &op,
                vec![fitted],
                BuiltinAttrs::shape(&want.shape).to_attrs(),
                forward,
            )?;
        }
        if have.dtype != want.dtype {
            fitted = self.cast(fitted, want.dtype, &format!("d_{value}.cast"), forward)?;
        }
        Ok(fitted)
    }

    fn cast(
        &mut self,
        value: String,
        dtype: crate::dtype::DType,
        wanted: &str,
        forward: &str,
    ) -> Result<String> {
        let op = self.builtin_op(Builtin::Cast, forward)?;
        self.add_node(
            wanted,
            &op,
            vec![value],
            BuiltinAttrs::Cast { dtype }.to_attrs(),
            forward,
        )
    }

    fn builtin_op(&self, builtin: Builtin, forward: &str) -> Result<String> {
        self.catalogue
            .builtin(builtin)
            .map(|op| op.name().to_string())
            .ok_or_else(|| {
                Error::at_node(
                    forward,
                    ErrorKind::Rule(format!(
                        "differentiating needs an op declared with `builtin: \"{}\"`, and the catalogue has none",
                        builtin.name()
                    )),
                )
            })
    }

    /// Makes the gradient of input `input` the node called `name`: the sum of its
    /// contributions, or zeros where the outputs do not depend on it.
    fn finish_gradient(&mut self, input: &str, name: &str) -> Result<()> {
        let ty = self.types[input].clone();
        match self.total(input, input)? {
            Some(total) if self.renamable(&total) => {
                // A node this pass made for this gradient alone: it takes the output's name.
                self.rename(&total, name);
            }
            Some(shared) => {
                // A cotangent input (the input is itself an output), or a value other
                // gradients use too: the output is a copy of it.
                let made = self.cast(shared, ty.dtype, name, input)?;
                self.rename(&made, name);
            }
            None => {
                let zero = self.zeros_like(&ty, input)?;
                self.rename(&zero, name);
            }
        }
        Ok(())
    }

    /// Whether `value` is a backward node that nothing else reads and no other gradient
    /// output will be: only then may it be renamed to a gradient output's name.
    fn renamable(&self, value: &str) -> bool {
        self.nodes.iter().any(|n| n.name == value)
            && !self.nodes.iter().any(|n| n.args.iter().any(|a| a == value))
            && !self
                .contributions
                .values()
                .any(|parts| parts.iter().any(|p| p == value))
    }

    /// Zeros of `ty`: a constant broadcast to the shape.
    fn zeros_like(&mut self, ty: &TensorType, forward: &str) -> Result<String> {
        let constant = self.builtin_op(Builtin::Const, forward)?;
        let zero = self.add_node(
            &format!("zero_{forward}"),
            &constant,
            Vec::new(),
            BuiltinAttrs::Const {
                value: 0.0,
                dtype: ty.dtype,
            }
            .to_attrs(),
            forward,
        )?;
        let broadcast = self.builtin_op(Builtin::BroadcastTo, forward)?;
        self.add_node(
            &format!("zeros_{forward}"),
            &broadcast,
            vec![zero],
            BuiltinAttrs::shape(&ty.shape).to_attrs(),
            forward,
        )
    }

    /// Renames a node this pass made (and every use of it) to the reserved name `to`.
    fn rename(&mut self, from: &str, to: &str) {
        if from == to {
            return;
        }
        for node in &mut self.nodes {
            if node.name == from {
                node.name = to.to_string();
            }
            for arg in &mut node.args {
                if arg == from {
                    *arg = to.to_string();
                }
            }
        }
        if let Some(ty) = self.types.remove(from) {
            self.types.insert(to.to_string(), ty);
        }
    }
}
