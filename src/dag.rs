//! A checked graph in index form: every value typed, every op resolved, attributes complete.
//!
//! [`Graph`] is the user's contract (names, a file format); the stages after checking want
//! indices instead of names. The e-graph is built from a `Dag`, extraction produces one, and
//! the partitioner and the cost model read one, so they never look a name up in a map.

use crate::attr::Attrs;
use crate::error::Result;
use crate::graph::check::resolve_attrs;
use crate::graph::{Graph, Input, Node, TensorType, check};
use crate::rules::{Builtin, Catalogue, OpDef};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A value: a graph input or the result of a node, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Input(usize),
    Node(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct DagInput {
    pub name: String,
    pub ty: TensorType,
}

/// One op application. `attrs` is complete: catalogue defaults are filled in.
#[derive(Debug, Clone)]
pub struct DagNode {
    /// A name for the value; unique within the dag only after [`Dag::to_graph`].
    pub name: String,
    pub op: Arc<OpDef>,
    pub attrs: Attrs,
    pub args: Vec<Value>,
    pub ty: TensorType,
}

/// A named graph output.
#[derive(Debug, Clone, PartialEq)]
pub struct DagOutput {
    pub name: String,
    pub value: Value,
}

/// A graph in index form. Nodes are in dependency order: a node's args are inputs or earlier
/// nodes.
#[derive(Debug, Clone)]
pub struct Dag {
    pub name: String,
    pub inputs: Vec<DagInput>,
    pub nodes: Vec<DagNode>,
    pub outputs: Vec<DagOutput>,
    /// The catalogue's cast op ([`Catalogue::builtin`]), with which [`Dag::to_graph`] writes
    /// output copies; `None` when the catalogue has no cast op.
    pub cast: Option<Arc<OpDef>>,
}

impl Dag {
    /// Checks `graph` against `catalogue` and converts it.
    pub fn from_graph(graph: &Graph, catalogue: &Catalogue) -> Result<Dag> {
        let types = check(graph, catalogue)?;
        let mut index: HashMap<&str, Value> = HashMap::new();
        let inputs = graph
            .inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                index.insert(&input.name, Value::Input(i));
                DagInput {
                    name: input.name.clone(),
                    ty: types[&input.name].clone(),
                }
            })
            .collect();
        let mut nodes = Vec::with_capacity(graph.nodes.len());
        for (i, node) in graph.nodes.iter().enumerate() {
            let op = catalogue.get(&node.op).expect("checked").clone();
            let attrs = resolve_attrs(&op, &node.attrs).expect("checked");
            nodes.push(DagNode {
                name: node.name.clone(),
                args: node.args.iter().map(|a| index[a.as_str()]).collect(),
                op,
                attrs,
                ty: types[&node.name].clone(),
            });
            index.insert(&node.name, Value::Node(i));
        }
        let outputs = graph
            .outputs
            .iter()
            .map(|name| DagOutput {
                name: name.clone(),
                value: index[name.as_str()],
            })
            .collect();
        Ok(Dag {
            name: graph.name.clone(),
            inputs,
            nodes,
            outputs,
            cast: catalogue.builtin(Builtin::Cast).cloned(),
        })
    }

    pub fn ty(&self, value: Value) -> &TensorType {
        match value {
            Value::Input(i) => &self.inputs[i].ty,
            Value::Node(i) => &self.nodes[i].ty,
        }
    }

    pub fn value_name(&self, value: Value) -> &str {
        match value {
            Value::Input(i) => &self.inputs[i].name,
            Value::Node(i) => &self.nodes[i].name,
        }
    }

    /// For every node, the indices of the nodes that use it (once per use).
    pub fn users(&self) -> Vec<Vec<usize>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            for arg in &node.args {
                if let Value::Node(p) = arg {
                    users[*p].push(i);
                }
            }
        }
        users
    }

    /// This dag without the nodes no output depends on, the rest renumbered in order.
    /// Extraction only builds what the outputs reach, so the input fused as written must not
    /// carry more: a dead library call would still run, and a dead epilogue has no result to
    /// store.
    pub fn without_dead_nodes(mut self) -> Dag {
        let mut live = vec![false; self.nodes.len()];
        for out in &self.outputs {
            if let Value::Node(i) = out.value {
                live[i] = true;
            }
        }
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                for arg in &self.nodes[i].args {
                    if let Value::Node(p) = arg {
                        live[*p] = true;
                    }
                }
            }
        }
        if live.iter().all(|&l| l) {
            return self;
        }
        let mut renumbered = vec![usize::MAX; live.len()];
        let mut next = 0;
        for (i, &l) in live.iter().enumerate() {
            if l {
                renumbered[i] = next;
                next += 1;
            }
        }
        let renumber = |v: Value| match v {
            Value::Node(i) => Value::Node(renumbered[i]),
            input => input,
        };
        let nodes = std::mem::take(&mut self.nodes);
        self.nodes = nodes
            .into_iter()
            .zip(&live)
            .filter(|(_, l)| **l)
            .map(|(mut node, _)| {
                node.args = node.args.into_iter().map(renumber).collect();
                node
            })
            .collect();
        for out in &mut self.outputs {
            out.value = renumber(out.value);
        }
        self
    }

    /// This dag with each computed constant (a value made from literals alone, such as the
    /// zero slabs of a padding, `broadcast_to` of a literal) computed anew for every node that
    /// reads it: it costs nothing to recompute in whatever kernel reads it, while one node
    /// shared by two library calls would belong to one kernel and be written to memory for
    /// the other. Extraction merges equal constants (two convolutions' paddings share their
    /// slabs); partitioning wants them apart again. The literals themselves stay shared.
    /// Returns `None` when no computed constant is read twice.
    pub fn with_constants_unshared(&self) -> Option<Dag> {
        let n = self.nodes.len();
        let mut constant = vec![false; n];
        let mut uses = vec![0usize; n];
        for (i, node) in self.nodes.iter().enumerate() {
            constant[i] = node
                .args
                .iter()
                .all(|a| matches!(a, Value::Node(j) if constant[*j]));
            for arg in &node.args {
                if let Value::Node(j) = *arg {
                    uses[j] += 1;
                }
            }
        }
        for out in &self.outputs {
            if let Value::Node(j) = out.value {
                uses[j] += 1;
            }
        }
        // Computed constants are copied per reader; literals are not.
        let copied: Vec<bool> = (0..n)
            .map(|i| constant[i] && !self.nodes[i].op.is_literal())
            .collect();
        if !(0..n).any(|i| copied[i] && uses[i] > 1) {
            return None;
        }
        struct Rebuild<'d> {
            dag: &'d Dag,
            copied: Vec<bool>,
            nodes: Vec<DagNode>,
            index: Vec<usize>,
        }
        impl Rebuild<'_> {
            /// `v` for the reader being emitted: a copied constant is made anew once per
            /// reader (`copies` holds this reader's).
            fn arg(&mut self, v: Value, copies: &mut HashMap<usize, usize>) -> Value {
                let Value::Node(j) = v else { return v };
                if !self.copied[j] {
                    return Value::Node(self.index[j]);
                }
                if let Some(&k) = copies.get(&j) {
                    return Value::Node(k);
                }
                let node = &self.dag.nodes[j];
                let args = node.args.iter().map(|&a| self.arg(a, copies)).collect();
                self.nodes.push(DagNode {
                    args,
                    ..node.clone()
                });
                copies.insert(j, self.nodes.len() - 1);
                Value::Node(self.nodes.len() - 1)
            }
        }
        let mut r = Rebuild {
            dag: self,
            copied,
            nodes: Vec::with_capacity(n),
            index: vec![usize::MAX; n],
        };
        for (i, node) in self.nodes.iter().enumerate() {
            if r.copied[i] {
                continue;
            }
            let mut copies = HashMap::new();
            let args = node.args.iter().map(|&a| r.arg(a, &mut copies)).collect();
            r.nodes.push(DagNode {
                args,
                ..node.clone()
            });
            r.index[i] = r.nodes.len() - 1;
        }
        let outputs = self
            .outputs
            .iter()
            .map(|o| DagOutput {
                name: o.name.clone(),
                value: r.arg(o.value, &mut HashMap::new()),
            })
            .collect();
        Some(Dag {
            name: self.name.clone(),
            inputs: self.inputs.clone(),
            nodes: r.nodes,
            outputs,
            cast: self.cast.clone(),
        })
    }

    /// Whether a node's value is a graph output.
    pub fn output_mask(&self) -> Vec<bool> {
        let mut mask = vec![false; self.nodes.len()];
        for out in &self.outputs {
            if let Value::Node(i) = out.value {
                mask[i] = true;
            }
        }
        mask
    }

    /// Per node, the first graph output naming it. Executors write a node into that output's
    /// buffer and copy it to any later output naming the same node.
    pub fn first_output_of(&self) -> Vec<Option<usize>> {
        let mut first = vec![None; self.nodes.len()];
        for (k, out) in self.outputs.iter().enumerate() {
            if let Value::Node(n) = out.value
                && first[n].is_none()
            {
                first[n] = Some(k);
            }
        }
        first
    }

    /// How many nodes apply `op`.
    pub fn count_op(&self, op: &str) -> usize {
        self.nodes.iter().filter(|n| n.op.name() == op).count()
    }

    /// How many nodes apply an op declaring built-in `builtin` (casts, whatever their name).
    pub fn count_builtin(&self, builtin: Builtin) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.op.builtin() == Some(builtin))
            .count()
    }

    /// The graph a user reads and saves. Names are made unique; each output keeps its name,
    /// and an output whose value is an input or another output gets a copy node (a cast to its
    /// own dtype, with [`Dag::cast`]) so the name still refers to it; without a cast op, such
    /// an output names the value it repeats. Attributes equal to the catalogue default are
    /// left out.
    pub fn to_graph(&self) -> Graph {
        let output_names: HashSet<&str> = self.outputs.iter().map(|o| o.name.as_str()).collect();
        let mut taken: HashSet<String> = self.inputs.iter().map(|i| i.name.clone()).collect();
        // Outputs claim the node computing them first, so they keep their own names.
        let mut names: Vec<Option<String>> = vec![None; self.nodes.len()];
        let mut copies: Vec<(usize, Value)> = Vec::new();
        for (k, out) in self.outputs.iter().enumerate() {
            match out.value {
                Value::Node(i) if names[i].is_none() && !taken.contains(&out.name) => {
                    names[i] = Some(out.name.clone());
                    taken.insert(out.name.clone());
                }
                value => copies.push((k, value)),
            }
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if names[i].is_none() {
                let base = if output_names.contains(node.name.as_str()) {
                    format!("{}_value", node.name)
                } else {
                    node.name.clone()
                };
                let name = fresh(&base, &taken);
                taken.insert(name.clone());
                names[i] = Some(name);
            }
        }
        let name_of = |v: Value| match v {
            Value::Input(i) => self.inputs[i].name.clone(),
            Value::Node(i) => names[i].clone().expect("named above"),
        };
        let mut nodes: Vec<Node> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| Node {
                name: name_of(Value::Node(i)),
                op: node.op.name().to_string(),
                args: node.args.iter().map(|&a| name_of(a)).collect(),
                attrs: written_attrs(&node.op, &node.attrs),
            })
            .collect();
        let mut outputs: Vec<String> = self.outputs.iter().map(|o| o.name.clone()).collect();
        for (k, value) in copies {
            let Some(cast) = &self.cast else {
                outputs[k] = name_of(value);
                continue;
            };
            let attrs = crate::rules::BuiltinAttrs::Cast {
                dtype: self.ty(value).dtype,
            }
            .to_attrs();
            nodes.push(Node {
                name: outputs[k].clone(),
                op: cast.name().to_string(),
                args: vec![name_of(value)],
                attrs,
            });
        }
        Graph {
            name: self.name.clone(),
            inputs: self
                .inputs
                .iter()
                .map(|i| Input {
                    name: i.name.clone(),
                    dtype: i.ty.dtype,
                    shape: i.ty.shape.clone(),
                })
                .collect(),
            nodes,
            outputs,
        }
    }
}

/// `base`, or `base_2`, `base_3`, … whichever is free.
fn fresh(base: &str, taken: &HashSet<String>) -> String {
    if !taken.contains(base) {
        return base.to_string();
    }
    (2..)
        .map(|k| format!("{base}_{k}"))
        .find(|n| !taken.contains(n))
        .expect("an unbounded range has a free name")
}

/// The attributes worth writing: those that differ from the op's default.
fn written_attrs(op: &OpDef, attrs: &Attrs) -> Attrs {
    attrs
        .iter()
        .filter(|(name, value)| op.attr(name).and_then(|s| s.default.as_ref()) != Some(*value))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
