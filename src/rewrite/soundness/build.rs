//! Building both sides of a rule instance as graphs (and naming the instance in a
//! counterexample): the step between drawing an instance ([`super::instance`]) and evaluating
//! it, kept apart because its failures ([`SideError`]) say the pattern and the instance do not
//! fit, not that the rule is wrong.

use super::*;

/// Why one side of a rule, instantiated, is not a graph: the pattern and the instance's
/// bindings do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum SideError {
    /// The catalogue lacks a built-in the side needs to spell a constant.
    #[error("the op catalogue has no `{0}` built-in")]
    NoBuiltin(&'static str),
    #[error("variable {0} is not bound")]
    Unbound(String),
    #[error("the pattern names graph input ${0}")]
    GraphInput(String),
    #[error("unknown op `{0}`")]
    UnknownOp(String),
    #[error("`{0}` has the wrong number of children")]
    Children(String),
    #[error("an operand of `{0}` is not a tensor")]
    OperandNotATensor(String),
    #[error("attribute `{attr}` of `{op}` is a tensor")]
    AttrIsATensor { attr: String, op: String },
    /// A missing attribute, or one of the wrong type (as the e-graph analysis words it).
    #[error(transparent)]
    Attr(#[from] crate::egraph::analysis::IllTyped),
    #[error("the pattern is not a tensor")]
    NotATensor,
}

/// The graph of one side: every tensor variable of the instance (inputs, and constants as
/// `const` nodes broadcast to their shape), then the pattern's ops, the root last and named
/// `root_name` unless the pattern is a bare variable.
pub(super) fn build_graph(
    pattern: &Pattern<ENode>,
    instance: &Instance,
    catalogue: &Catalogue,
    root_name: &str,
) -> Result<Graph, SideError> {
    let mut graph = Graph {
        name: root_name.to_string(),
        inputs: Vec::new(),
        nodes: Vec::new(),
        outputs: Vec::new(),
    };
    // The ops the catalogue makes literals and broadcasts with, whatever their names.
    let builtin_name = |b: Builtin| {
        catalogue
            .builtin(b)
            .map(|op| op.name().to_string())
            .ok_or(SideError::NoBuiltin(b.name()))
    };
    for (var, binding) in &instance.tensors {
        let name = var_name(*var);
        match binding.constant {
            None => graph.inputs.push(Input {
                name,
                dtype: binding.ty.dtype,
                shape: binding.ty.shape.clone(),
            }),
            Some(value) => {
                let mut attrs = crate::attr::Attrs::new();
                attrs.insert("value".into(), crate::attr::AttrValue::Float(value));
                attrs.insert(
                    "dtype".into(),
                    crate::attr::AttrValue::DType(binding.ty.dtype),
                );
                let scalar = if binding.ty.shape.is_empty() {
                    name.clone()
                } else {
                    format!("{name}%scalar")
                };
                graph.nodes.push(Node {
                    name: scalar.clone(),
                    op: builtin_name(Builtin::Const)?,
                    args: Vec::new(),
                    attrs,
                });
                if !binding.ty.shape.is_empty() {
                    let mut attrs = crate::attr::Attrs::new();
                    attrs.insert(
                        "shape".into(),
                        crate::attr::AttrValue::Ints(
                            binding.ty.shape.iter().map(|&d| d as i64).collect(),
                        ),
                    );
                    graph.nodes.push(Node {
                        name,
                        op: builtin_name(Builtin::BroadcastTo)?,
                        args: vec![scalar],
                        attrs,
                    });
                }
            }
        }
    }
    let ast = pattern.ast.as_ref();
    let mut built: Vec<Option<Term>> = vec![None; ast.len()];
    for (index, node) in ast.iter().enumerate() {
        let term = match node {
            ENodeOrVar::Var(v) => {
                if let Some(leaf) = instance.attrs.get(v) {
                    Term::Leaf(leaf.clone())
                } else if instance.tensors.contains_key(v) {
                    Term::Value(var_name(*v))
                } else {
                    return Err(SideError::Unbound(v.to_string()));
                }
            }
            ENodeOrVar::ENode(ENode::Attr(leaf)) => Term::Leaf(leaf.clone()),
            ENodeOrVar::ENode(ENode::Input(name)) => {
                return Err(SideError::GraphInput(name.to_string()));
            }
            ENodeOrVar::ENode(ENode::Op(name, children)) => {
                let op = catalogue
                    .get(name.as_str())
                    .ok_or_else(|| SideError::UnknownOp(name.to_string()))?;
                let (operands, attr_ids) = split_children(op, children)
                    .ok_or_else(|| SideError::Children(name.to_string()))?;
                let mut args = Vec::new();
                for id in operands {
                    match &built[usize::from(*id)] {
                        Some(Term::Value(v)) => args.push(v.clone()),
                        _ => return Err(SideError::OperandNotATensor(name.to_string())),
                    }
                }
                let leaves = op.spec.attrs.iter().zip(attr_ids).map(|(spec, id)| {
                    match &built[usize::from(*id)] {
                        Some(Term::Leaf(leaf)) => Ok(leaf.clone()),
                        _ => Err(SideError::AttrIsATensor {
                            attr: spec.name.clone(),
                            op: name.to_string(),
                        }),
                    }
                });
                let attrs = crate::egraph::analysis::attrs_from_leaves(op, leaves)?;
                let node_name = if index + 1 == ast.len() {
                    root_name.to_string()
                } else {
                    format!("%{index}")
                };
                graph.nodes.push(Node {
                    name: node_name.clone(),
                    op: name.to_string(),
                    args,
                    attrs,
                });
                Term::Value(node_name)
            }
        };
        built[index] = Some(term);
    }
    match built.last().cloned().flatten() {
        Some(Term::Value(root)) => graph.outputs.push(root),
        _ => return Err(SideError::NotATensor),
    }
    Ok(graph)
}

#[derive(Debug, Clone)]
pub(super) enum Term {
    Value(String),
    Leaf(Leaf),
}

/// A side with its variables replaced: inputs by name, constants and attributes spelled out.
pub(super) fn describe_instance(pattern: &Pattern<ENode>, instance: &Instance) -> String {
    pub(super) fn go(
        ast: &[ENodeOrVar<ENode>],
        index: usize,
        instance: &Instance,
        out: &mut String,
    ) {
        match &ast[index] {
            ENodeOrVar::Var(v) => {
                if let Some(leaf) = instance.attrs.get(v) {
                    let _ = write!(out, "{leaf}");
                } else if let Some(t) = instance.tensors.get(v) {
                    match t.constant {
                        None => out.push_str(&var_name(*v)),
                        Some(c) if t.ty.shape.is_empty() => {
                            let _ = write!(out, "(const {} {})", Leaf::num(c), t.ty.dtype);
                        }
                        Some(c) => {
                            let shape = Leaf::Ints(t.ty.shape.iter().map(|&d| d as i64).collect());
                            let _ = write!(
                                out,
                                "(broadcast_to (const {} {}) {shape})",
                                Leaf::num(c),
                                t.ty.dtype
                            );
                        }
                    }
                } else {
                    let _ = write!(out, "{v}");
                }
            }
            ENodeOrVar::ENode(node) => {
                let children = egg::Language::children(node);
                if children.is_empty() {
                    let _ = write!(out, "{node}");
                } else {
                    let _ = write!(out, "({node}");
                    for c in children {
                        out.push(' ');
                        go(ast, usize::from(*c), instance, out);
                    }
                    out.push(')');
                }
            }
        }
    }
    let ast = pattern.ast.as_ref();
    let mut out = String::new();
    go(ast, ast.len() - 1, instance, &mut out);
    out
}
