//! Replacing composite ops by their bodies (see [`crate::rules::composite`]).
//!
//! Expansion happens when a graph is read (a RON file, an ONNX model, a graph built in Rust
//! and passed to [`expand`]), before checking, so everything after — rewrites, fusion,
//! automatic differentiation, the backends — sees only catalogue ops. The inner nodes of a use
//! `s = softmax(x)` are named `s.m`, `s.e`, … (with `_1`, `_2` added where a name is taken);
//! the body's last node takes the use's own name, so outputs and later args still find it.

use super::check::{Part, Problem, TypeMap, check_parts, infer_node};
use super::{Graph, Node};
use crate::attr::{AttrValue, Attrs};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::rules::composite::{Expansion, MAX_COMPOSITE_DEPTH, MAX_EXPANDED_OPS};
use crate::rules::{BodyArg, BodyAttr, Catalogue, Composite};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Where expanded nodes go: a graph being built ([`expand_parts`]) or the ONNX importer, which
/// folds constants as nodes arrive.
pub trait Sink {
    type Value: Clone;
    /// The dtype of a value (what `$operand.dtype` in a body reads).
    fn dtype(&mut self, value: &Self::Value) -> std::result::Result<DType, ErrorKind>;
    /// Applies catalogue op `op`. `name` is the node's name; `last` says whether it is the
    /// outermost use's result, which must keep exactly that name.
    fn emit(
        &mut self,
        op: &str,
        args: Vec<Self::Value>,
        attrs: Attrs,
        name: &str,
        last: bool,
    ) -> std::result::Result<Self::Value, ErrorKind>;
    /// How many nodes the sink holds so far: a use of a composite may not take it past
    /// [`MAX_EXPANDED_NODES`], so a model of many uses is bounded as a whole, not only per use.
    fn emitted(&self) -> usize;
}

/// Why a use of a composite could not be expanded.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The use has the wrong number of args.
    Arity(ErrorKind),
    /// An attribute of the use (named, or `None` for a missing one) is wrong.
    Attr(Option<String>, ErrorKind),
    /// A node of the body failed (its shapes or dtypes do not fit these args).
    Inside(ErrorKind),
}

impl Fault {
    pub fn kind(self) -> ErrorKind {
        match self {
            Fault::Arity(k) | Fault::Attr(_, k) | Fault::Inside(k) => k,
        }
    }
}

/// The most nodes a graph may have once its composites are expanded (262,144): four times
/// [`MAX_EXPANDED_OPS`], far beyond real models (a large transformer imported from ONNX is
/// some ten thousand nodes), and small enough that checking it stays a matter of a second
/// and a few hundred MB.
pub const MAX_EXPANDED_NODES: usize = 1 << 18;

/// Refuses a use of `composite` whose expansion is beyond the limits (loading `ops.ron`
/// refuses such composites, but a later file may redefine an op a composite uses),
/// or that would take the nodes emitted so far (`emitted`) past [`MAX_EXPANDED_NODES`]. The
/// message names the chain of composites; the use's node is where the caller reports it.
pub fn check_use(
    catalogue: &Catalogue,
    composite: &Composite,
    emitted: usize,
    memo: &mut BTreeMap<String, Expansion>,
) -> std::result::Result<(), Fault> {
    let expansion = catalogue.expansion(composite.name(), memo);
    let total = emitted.saturating_add(expansion.ops);
    if expansion.fits() && total <= MAX_EXPANDED_NODES {
        return Ok(());
    }
    let (chain, _) = catalogue.expansion_chain(composite.name(), memo);
    let count = if expansion.ops == usize::MAX {
        "more than 2^64".to_string()
    } else {
        expansion.ops.to_string()
    };
    let msg = if expansion.ops > MAX_EXPANDED_OPS {
        format!(
            "composite `{}` expands to {count} ops ({chain}), more than the limit of {MAX_EXPANDED_OPS}",
            composite.name()
        )
    } else if expansion.depth > MAX_COMPOSITE_DEPTH {
        format!(
            "composite `{}` nests {} composites deep ({chain}), more than the limit of {MAX_COMPOSITE_DEPTH}",
            composite.name(),
            expansion.depth
        )
    } else {
        format!(
            "expanding composite `{}` ({chain}, {count} ops) here makes the graph more than {MAX_EXPANDED_NODES} nodes",
            composite.name()
        )
    };
    Err(Fault::Inside(ErrorKind::Input(msg)))
}

/// Emits the body of `composite` applied to `args` with the use's `attrs` into `sink`, and
/// returns the body's result. Inner composites expand in turn (the catalogue refuses cycles
/// when it loads, so this ends). The use is first held to the limits ([`check_use`]), so no
/// caller — a graph file, an ONNX model — can expand a composite of unbounded size.
pub fn instantiate<S: Sink>(
    catalogue: &Catalogue,
    composite: &Composite,
    args: Vec<S::Value>,
    attrs: &Attrs,
    name: &str,
    last: bool,
    sink: &mut S,
) -> std::result::Result<S::Value, Fault> {
    check_use(catalogue, composite, sink.emitted(), &mut BTreeMap::new())?;
    instantiate_checked(catalogue, composite, args, attrs, name, last, sink)
}

/// [`instantiate`] once the use is known to be within the limits.
fn instantiate_checked<S: Sink>(
    catalogue: &Catalogue,
    composite: &Composite,
    args: Vec<S::Value>,
    attrs: &Attrs,
    name: &str,
    last: bool,
    sink: &mut S,
) -> std::result::Result<S::Value, Fault> {
    if args.len() != composite.spec.operands.len() {
        return Err(Fault::Arity(ErrorKind::Arity {
            op: composite.name().to_string(),
            expected: composite.spec.operands.len().to_string(),
            got: args.len(),
        }));
    }
    let bound = composite
        .bind_attrs(attrs)
        .map_err(|(attr, kind)| Fault::Attr(attr, kind))?;
    let mut values: Vec<S::Value> = Vec::with_capacity(composite.body.len());
    for (n, node) in composite.body.iter().enumerate() {
        let inside = |kind: ErrorKind| {
            Fault::Inside(ErrorKind::Input(format!(
                "in the body of composite `{}`, node `{}` (`{}`): {kind}",
                composite.name(),
                node.name,
                node.op
            )))
        };
        let node_args: Vec<S::Value> = node
            .args
            .iter()
            .map(|a| match *a {
                BodyArg::Operand(i) => args[i].clone(),
                BodyArg::Node(i) => values[i].clone(),
            })
            .collect();
        let mut node_attrs = Attrs::new();
        for (key, value) in &node.attrs {
            let resolved = match value {
                BodyAttr::Value(v) => Some(v.clone()),
                BodyAttr::Attr { name, to_list } => match (bound.get(name), to_list) {
                    (Some(AttrValue::Int(i)), true) => Some(AttrValue::Ints(vec![*i])),
                    (v, _) => v.cloned(),
                },
                BodyAttr::DTypeOf(i) => {
                    Some(AttrValue::DType(sink.dtype(&args[*i]).map_err(inside)?))
                }
            };
            if let Some(v) = resolved {
                node_attrs.insert(key.clone(), v);
            }
        }
        let is_last = n + 1 == composite.body.len();
        let inner_name = if is_last {
            name.to_string()
        } else {
            format!("{name}.{}", node.name)
        };
        let value = match catalogue.composite(&node.op) {
            Some(inner) => instantiate_checked(
                catalogue,
                inner,
                node_args,
                &node_attrs,
                &inner_name,
                last && is_last,
                sink,
            )
            .map_err(|f| inside(f.kind()))?,
            None => sink
                .emit(
                    &node.op,
                    node_args,
                    node_attrs,
                    &inner_name,
                    last && is_last,
                )
                .map_err(inside)?,
        };
        values.push(value);
    }
    values.pop().ok_or_else(|| {
        Fault::Inside(ErrorKind::Rule(format!(
            "composite `{}` has no nodes",
            composite.name()
        )))
    })
}

/// Builds the expanded graph node by node, typing each so that bodies can read dtypes.
struct GraphSink<'a> {
    catalogue: &'a Catalogue,
    nodes: Vec<Node>,
    types: TypeMap,
    taken: HashSet<String>,
    /// Per name, the suffix to try first when it is taken: every lower one is taken already
    /// (names are only ever added), so the search resumes there instead of counting from 1
    /// each time — the results of nested bodies share their use's name, and a composite
    /// expanding to thousands of ops would otherwise probe quadratically many names.
    next_suffix: HashMap<String, usize>,
}

impl Sink for GraphSink<'_> {
    type Value = String;

    fn emitted(&self) -> usize {
        self.nodes.len()
    }

    fn dtype(&mut self, value: &String) -> std::result::Result<DType, ErrorKind> {
        self.types
            .get(value)
            .map(|t| t.dtype)
            .ok_or_else(|| ErrorKind::Input(format!("`{value}` has no type here")))
    }

    fn emit(
        &mut self,
        op: &str,
        args: Vec<String>,
        attrs: Attrs,
        name: &str,
        last: bool,
    ) -> std::result::Result<String, ErrorKind> {
        let name = if last {
            name.to_string()
        } else {
            let mut fresh = name.to_string();
            let mut i = self.next_suffix.get(name).copied().unwrap_or(1);
            while self.taken.contains(&fresh) {
                fresh = format!("{name}_{i}");
                i += 1;
            }
            self.next_suffix.insert(name.to_string(), i);
            fresh
        };
        self.taken.insert(name.clone());
        let node = Node {
            name: name.clone(),
            op: op.to_string(),
            args,
            attrs,
        };
        let arg_types = node
            .args
            .iter()
            .map(|a| self.types.get(a).cloned())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ErrorKind::Input("an argument has no type".into()))?;
        let ty =
            infer_node(&node, self.nodes.len(), &arg_types, self.catalogue).map_err(|p| p.kind)?;
        self.types.insert(name.clone(), ty);
        self.nodes.push(node);
        Ok(name)
    }
}

/// Expands every composite node of `graph`. Also returns, for each node of the result, the
/// index of the node of `graph` it came from, so a later check's problem can be reported where
/// the user wrote it. Problems are given in terms of `graph`'s parts.
pub fn expand_parts(
    graph: &Graph,
    catalogue: &Catalogue,
) -> std::result::Result<(Graph, Vec<usize>), Problem> {
    if graph
        .nodes
        .iter()
        .all(|n| catalogue.composite(&n.op).is_none())
    {
        return Ok((graph.clone(), (0..graph.nodes.len()).collect()));
    }
    let mut sink = GraphSink {
        catalogue,
        nodes: Vec::with_capacity(graph.nodes.len()),
        types: TypeMap::new(),
        taken: graph
            .inputs
            .iter()
            .map(|i| i.name.clone())
            .chain(graph.nodes.iter().map(|n| n.name.clone()))
            .collect(),
        next_suffix: HashMap::new(),
    };
    for input in &graph.inputs {
        sink.types.insert(
            input.name.clone(),
            super::TensorType {
                dtype: input.dtype,
                shape: input.shape.clone(),
            },
        );
    }
    let mut origin = Vec::with_capacity(graph.nodes.len());
    let mut memo = BTreeMap::new();
    for (index, node) in graph.nodes.iter().enumerate() {
        let Some(composite) = catalogue.composite(&node.op) else {
            // An ordinary node is copied; it is typed when it can be, so a later body can
            // read its dtype. One that cannot is reported by the check of the whole graph.
            if let Some(arg_types) = node
                .args
                .iter()
                .map(|a| sink.types.get(a).cloned())
                .collect::<Option<Vec<_>>>()
                && let Ok(ty) = infer_node(node, sink.nodes.len(), &arg_types, catalogue)
            {
                sink.types.insert(node.name.clone(), ty);
            }
            sink.nodes.push(node.clone());
            origin.push(index);
            continue;
        };
        if let Some(arg) = node.args.iter().position(|a| !sink.types.contains_key(a)) {
            return Err(untyped_arg(
                graph,
                &sink.nodes,
                &origin,
                index,
                arg,
                catalogue,
            ));
        }
        let before = sink.nodes.len();
        // The limits first, with the graph's count so far: the use is where they are passed.
        let result = check_use(catalogue, composite, before, &mut memo).and_then(|()| {
            instantiate_checked(
                catalogue,
                composite,
                node.args.clone(),
                &node.attrs,
                &node.name,
                true,
                &mut sink,
            )
        });
        match result {
            Ok(_) => origin.extend(std::iter::repeat_n(index, sink.nodes.len() - before)),
            Err(Fault::Arity(kind)) => {
                return Err(Problem {
                    part: Part::Node {
                        index,
                        field: "args",
                    },
                    kind,
                });
            }
            Err(Fault::Attr(Some(attr), kind)) => {
                return Err(Problem {
                    part: Part::Attr { node: index, attr },
                    kind,
                });
            }
            Err(Fault::Attr(None, kind)) => {
                return Err(Problem {
                    part: Part::Node {
                        index,
                        field: "attrs",
                    },
                    kind,
                });
            }
            Err(Fault::Inside(kind)) => {
                return Err(Problem {
                    part: Part::Node { index, field: "op" },
                    kind,
                });
            }
        }
    }
    Ok((
        Graph {
            name: graph.name.clone(),
            inputs: graph.inputs.clone(),
            nodes: sink.nodes,
            outputs: graph.outputs.clone(),
        },
        origin,
    ))
}

/// The problem with argument `arg` of composite node `index`, which has no type: whatever the
/// check of the nodes before it finds, else that the name is not defined before it.
fn untyped_arg(
    graph: &Graph,
    done: &[Node],
    origin: &[usize],
    index: usize,
    arg: usize,
    catalogue: &Catalogue,
) -> Problem {
    let name = &graph.nodes[index].args[arg];
    let prefix = Graph {
        name: graph.name.clone(),
        inputs: graph.inputs.clone(),
        nodes: done.to_vec(),
        outputs: vec![name.clone()],
    };
    match check_parts(&prefix, catalogue) {
        Err(problem) if !matches!(problem.part, Part::Output { .. } | Part::Outputs) => {
            map_part(problem, origin)
        }
        _ => {
            let kind = if *name == graph.nodes[index].name {
                ErrorKind::Cycle { name: name.clone() }
            } else if let Some(later) = graph.nodes.iter().position(|n| &n.name == name) {
                ErrorKind::UseBeforeDefinition {
                    name: name.clone(),
                    index: later,
                }
            } else {
                ErrorKind::UnknownName {
                    name: name.clone(),
                    suggestion: crate::error::suggest(
                        name,
                        graph
                            .inputs
                            .iter()
                            .map(|i| i.name.as_str())
                            .chain(graph.nodes[..index].iter().map(|n| n.name.as_str())),
                    ),
                }
            };
            Problem {
                part: Part::Arg { node: index, arg },
                kind,
            }
        }
    }
}

/// A problem found in the expanded graph, moved to the node of the original graph it came
/// from. A node that is a body's part is reported at its use's `op`, with its own name in the
/// message.
pub fn map_part(problem: Problem, origin: &[usize]) -> Problem {
    let from = |i: usize| origin.get(i).copied().unwrap_or(i);
    let part = match problem.part {
        Part::Node { index, field } => Part::Node {
            index: from(index),
            field,
        },
        Part::Arg { node, arg } => Part::Arg {
            node: from(node),
            arg,
        },
        Part::Attr { node, attr } => Part::Attr {
            node: from(node),
            attr,
        },
        other => other,
    };
    Problem {
        part,
        kind: problem.kind,
    }
}

/// Expands a graph built in Rust; errors name the node they concern.
pub fn expand(graph: &Graph, catalogue: &Catalogue) -> Result<Graph> {
    expand_parts(graph, catalogue).map(|(g, _)| g).map_err(|p| {
        let name = match &p.part {
            Part::Node { index, .. } | Part::Arg { node: index, .. } => {
                graph.nodes[*index].name.clone()
            }
            Part::Attr { node, .. } => graph.nodes[*node].name.clone(),
            Part::Input { index, .. } => graph.inputs[*index].name.clone(),
            _ => graph.name.clone(),
        };
        Error::at_node(&name, p.kind)
    })
}
