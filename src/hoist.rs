//! Values the fixed inputs alone determine, computed once instead of on every run.
//!
//! A model's stored values (its weights) are the same on every run of a compiled model, so
//! whatever is computed from them and from constants alone (a batch norm's
//! `scale / sqrt(var + eps)`, a weight scaled by the norm before it, a weight cast to bf16
//! under AMP) need not be computed per run. [`split`] cuts such values out of an extracted
//! graph: the part that stays (the run graph) reads each of them as an input, and the part cut
//! out (the [`Hoist`]) computes them from the fixed inputs. Extraction prices candidate graphs
//! by their run graph only, so a rewrite that moves arithmetic onto the weights (folding a
//! batch norm into a convolution's weights) wins exactly when the fixed inputs make it free.
//!
//! What is hoisted is bounded: a value that is only a view of a weight (a transpose, a reshape)
//! stays in the run graph, where a library call reads it through strides at no cost, and a
//! value larger than the fixed inputs it is made of (a weight broadcast to the batch) stays
//! too, since storing it would cost more memory and bytes than computing it.
//!
//! The run graph and the hoist share the names of the hoisted values: the run graph declares
//! them as inputs, the hoist returns them as outputs. Whoever runs the program computes them
//! once ([`Hoist::values`], by the reference evaluator, which is exact per op as the kernels
//! are) and again whenever a run replaces one of the fixed inputs they are made of.

use crate::dag::{Dag, DagInput, DagNode, DagOutput, Value};
use crate::egraph::Origin;
use crate::error::Result;
use crate::eval::Tensors;
use crate::graph::Graph;
use crate::rules::{Catalogue, OpKind};
use crate::shape::numel;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};

/// The part of a graph computed from its fixed inputs: a graph whose inputs are fixed inputs
/// and whose outputs are the values the run graph reads as inputs.
#[derive(Debug, Clone)]
pub struct Hoist {
    pub graph: Graph,
}

impl Hoist {
    /// The hoist of a [`Split`].
    pub fn new(hoist: &Dag) -> Hoist {
        Hoist {
            graph: hoist.to_graph(),
        }
    }

    /// The fixed inputs the hoisted values are made of.
    pub fn reads(&self) -> impl Iterator<Item = &str> {
        self.graph.inputs.iter().map(|i| i.name.as_str())
    }

    /// Each hoisted value with what it is made of: the fixed inputs it reads and its ops, in
    /// graph order (`name = op`), as the report lists them.
    pub fn describe(&self) -> Vec<HoistedValue> {
        let graph = &self.graph;
        let position: HashMap<&str, usize> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        graph
            .outputs
            .iter()
            .map(|out| {
                let mut needed = vec![false; graph.nodes.len()];
                let mut reads = BTreeSet::new();
                let mut work = vec![out.as_str()];
                while let Some(name) = work.pop() {
                    match position.get(name) {
                        Some(&i) if !needed[i] => {
                            needed[i] = true;
                            work.extend(graph.nodes[i].args.iter().map(String::as_str));
                        }
                        Some(_) => {}
                        None => {
                            reads.insert(name.to_string());
                        }
                    }
                }
                HoistedValue {
                    name: out.clone(),
                    reads: reads.into_iter().collect(),
                    ops: (0..graph.nodes.len())
                        .filter(|&i| needed[i])
                        .map(|i| format!("{} = {}", graph.nodes[i].name, graph.nodes[i].op))
                        .collect(),
                }
            })
            .collect()
    }

    /// Whether a run that gives its own values for `given` must compute the hoisted values
    /// again (it replaces a fixed input they are made of).
    pub fn depends_on<'a>(&self, mut given: impl Iterator<Item = &'a str>) -> bool {
        given.any(|name| self.reads().any(|r| r == name))
    }

    /// The hoisted values, computed from `values` (which holds every input the hoist reads,
    /// and may hold others).
    pub fn values(&self, catalogue: &Catalogue, values: &Tensors) -> Result<Tensors> {
        crate::eval::evaluate_among(&self.graph, catalogue, values)
    }
}

/// One hoisted value as the report shows it.
#[derive(Debug, Clone, Serialize)]
pub struct HoistedValue {
    /// The input name the kernels read it by.
    pub name: String,
    /// The fixed inputs it is computed from.
    pub reads: Vec<String>,
    /// `name = op` for each op computing it, in order.
    pub ops: Vec<String>,
}

/// A graph cut in two by [`split`].
#[derive(Debug, Clone)]
pub struct Split {
    /// The graph that runs every time: the hoisted values are among its inputs, the fixed
    /// inputs it no longer reads are not.
    pub run: Dag,
    /// What computes the hoisted values, in index form ([`Hoist::new`] makes the graph, for
    /// the split that is kept: extraction prices many candidates by their run graph alone).
    pub hoist: Dag,
}

/// Cuts `dag` into the values computed from the inputs named in `fixed` alone (hoisted) and
/// the rest (see the module documentation for which values are hoisted); `None` when nothing
/// is hoisted.
pub fn split(dag: &Dag, fixed: &BTreeSet<String>) -> Option<Split> {
    if fixed.is_empty() {
        return None;
    }
    let (hoisted, reads) = hoistable(dag, fixed);
    let users = dag.users();
    // The hoisted values the run graph reads: those with a reader that is not hoisted.
    let frontier: Vec<usize> = (0..dag.nodes.len())
        .filter(|&i| hoisted[i] && users[i].iter().any(|&u| !hoisted[u]))
        .collect();
    if frontier.is_empty() {
        return None;
    }
    let hoist = hoist_dag(dag, &frontier, &reads);
    Some(Split {
        run: run_dag(dag, &hoisted, &frontier, fixed, &hoist),
        hoist,
    })
}

/// Per node, whether it is hoisted: computed from fixed inputs (and constants) alone, with
/// some arithmetic along the way, no larger than the fixed inputs it reads, and not a graph
/// output (an output is the run's to write).
/// Also returns, per node, the fixed inputs it reads (by index; empty where it reads none).
fn hoistable(dag: &Dag, fixed: &BTreeSet<String>) -> (Vec<bool>, Vec<BTreeSet<usize>>) {
    let n = dag.nodes.len();
    let mut source = vec![Origin::Constant; n];
    // Whether some op on the way from the fixed inputs is arithmetic (not a view).
    let mut computes = vec![false; n];
    // The fixed inputs each Fixed node reads, for the size bound.
    let mut reads: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (i, node) in dag.nodes.iter().enumerate() {
        let mut s = Origin::Constant;
        let mut arithmetic = false;
        for &arg in &node.args {
            let (arg_source, arg_computes) = match arg {
                Value::Input(k) if fixed.contains(&dag.inputs[k].name) => {
                    reads[i].insert(k);
                    (Origin::Fixed, false)
                }
                Value::Input(_) => (Origin::Run, false),
                Value::Node(j) => {
                    if source[j] == Origin::Fixed {
                        let inner = reads[j].clone();
                        reads[i].extend(inner);
                    }
                    (source[j], computes[j])
                }
            };
            s = s.max(arg_source);
            arithmetic |= arg_computes;
        }
        source[i] = s;
        computes[i] = arithmetic || node.op.kind() != OpKind::Layout;
        if s != Origin::Fixed {
            reads[i].clear();
        }
    }
    let outputs = dag.output_mask();
    let hoisted = (0..n)
        .map(|i| {
            source[i] == Origin::Fixed
                && computes[i]
                && !outputs[i]
                && numel(&dag.nodes[i].ty.shape)
                    <= reads[i]
                        .iter()
                        .map(|&k| numel(&dag.inputs[k].ty.shape))
                        .sum::<usize>()
        })
        .collect();
    (hoisted, reads)
}

/// The hoisted nodes (and the constant nodes they read) as a graph of the fixed inputs they
/// read, returning the frontier's values.
fn hoist_dag(dag: &Dag, frontier: &[usize], reads: &[BTreeSet<usize>]) -> Dag {
    // The nodes the frontier needs: hoisted ones, and below them constants and views of fixed
    // inputs (which the run graph may read as well, where they are computed again for free).
    let mut needed = vec![false; dag.nodes.len()];
    for &i in frontier {
        needed[i] = true;
    }
    for i in (0..dag.nodes.len()).rev() {
        if needed[i] {
            for arg in &dag.nodes[i].args {
                if let Value::Node(j) = *arg {
                    needed[j] = true;
                }
            }
        }
    }
    let mut inputs: Vec<DagInput> = Vec::new();
    let mut input_of = vec![None; dag.inputs.len()];
    let mut node_of = vec![None; dag.nodes.len()];
    let mut nodes: Vec<DagNode> = Vec::new();
    for (i, node) in dag.nodes.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        let args = node
            .args
            .iter()
            .map(|&arg| match arg {
                Value::Input(k) => Value::Input(*input_of[k].get_or_insert_with(|| {
                    inputs.push(dag.inputs[k].clone());
                    inputs.len() - 1
                })),
                Value::Node(j) => Value::Node(node_of[j].expect("an argument comes first")),
            })
            .collect();
        node_of[i] = Some(nodes.len());
        nodes.push(DagNode {
            args,
            ..node.clone()
        });
    }
    let names = value_names(dag, frontier, reads);
    Dag {
        name: format!("{}.hoisted", dag.name),
        inputs,
        nodes,
        outputs: frontier
            .iter()
            .zip(names)
            .map(|(&i, name)| DagOutput {
                name,
                value: Value::Node(node_of[i].expect("needed")),
            })
            .collect(),
        cast: dag.cast.clone(),
    }
}

/// The run graph: the nodes not hoisted, reading the frontier (named as the hoist's outputs)
/// as inputs.
fn run_dag(
    dag: &Dag,
    hoisted: &[bool],
    frontier: &[usize],
    fixed: &BTreeSet<String>,
    hoist: &Dag,
) -> Dag {
    let mut read = vec![false; dag.inputs.len()];
    for (i, node) in dag.nodes.iter().enumerate() {
        if hoisted[i] {
            continue;
        }
        for arg in &node.args {
            if let Value::Input(k) = *arg {
                read[k] = true;
            }
        }
    }
    for out in &dag.outputs {
        if let Value::Input(k) = out.value {
            read[k] = true;
        }
    }
    // A fixed input only the hoist reads leaves the run graph; every other input stays,
    // read or not, so a run may still give it.
    let hoist_reads: HashSet<&str> = hoist.inputs.iter().map(|i| i.name.as_str()).collect();
    let mut inputs = Vec::new();
    let mut input_of = vec![None; dag.inputs.len()];
    for (k, input) in dag.inputs.iter().enumerate() {
        if read[k] || !fixed.contains(&input.name) || !hoist_reads.contains(input.name.as_str()) {
            input_of[k] = Some(inputs.len());
            inputs.push(input.clone());
        }
    }
    let mut value_of = vec![None; dag.nodes.len()];
    for (&i, out) in frontier.iter().zip(&hoist.outputs) {
        value_of[i] = Some(Value::Input(inputs.len()));
        inputs.push(DagInput {
            name: out.name.clone(),
            ty: dag.nodes[i].ty.clone(),
        });
    }
    let renumber = |v: Value, value_of: &[Option<Value>]| match v {
        Value::Input(k) => Value::Input(input_of[k].expect("a read input is kept")),
        Value::Node(j) => value_of[j].expect("an argument comes first"),
    };
    let mut nodes = Vec::new();
    for (i, node) in dag.nodes.iter().enumerate() {
        if hoisted[i] {
            continue;
        }
        let args = node.args.iter().map(|&a| renumber(a, &value_of)).collect();
        value_of[i] = Some(Value::Node(nodes.len()));
        nodes.push(DagNode {
            args,
            ..node.clone()
        });
    }
    let outputs = dag
        .outputs
        .iter()
        .map(|o| DagOutput {
            name: o.name.clone(),
            value: renumber(o.value, &value_of),
        })
        .collect();
    Dag {
        name: dag.name.clone(),
        inputs,
        nodes,
        outputs,
        cast: dag.cast.clone(),
    }
    .without_dead_nodes()
}

/// Names for the frontier's values, unique among the graph's inputs, outputs, other nodes and
/// each other: `W.folded` after the first fixed input `W` each is made of (the node's own name
/// is often one extraction made up).
fn value_names(dag: &Dag, frontier: &[usize], reads: &[BTreeSet<usize>]) -> Vec<String> {
    let on_frontier: HashSet<usize> = frontier.iter().copied().collect();
    let mut taken: HashSet<String> = dag
        .inputs
        .iter()
        .map(|i| i.name.clone())
        .chain(dag.outputs.iter().map(|o| o.name.clone()))
        .chain(
            (0..dag.nodes.len())
                .filter(|i| !on_frontier.contains(i))
                .map(|i| dag.nodes[i].name.clone()),
        )
        .collect();
    frontier
        .iter()
        .map(|&i| {
            let base = match reads[i].first() {
                Some(&k) => format!("{}.folded", dag.inputs[k].name),
                None => dag.nodes[i].name.clone(),
            };
            let mut name = base.clone();
            let mut k = 1;
            while !taken.insert(name.clone()) {
                name = format!("{base}.{k}");
                k += 1;
            }
            name
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::graph::GraphBuilder;
    use crate::rules::Catalogue;

    fn dag(graph: &Graph) -> Dag {
        Dag::from_graph(graph, &Catalogue::defaults()).unwrap()
    }

    fn fixed(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn input_names(dag: &Dag) -> Vec<&str> {
        dag.inputs.iter().map(|i| i.name.as_str()).collect()
    }

    /// `x @ (w * g)` with `w` and `g` fixed: the scaled weight is hoisted (and the run reads
    /// it instead of `w` and `g`); the same with nothing fixed hoists nothing.
    #[test]
    fn arithmetic_on_fixed_inputs_is_hoisted() {
        let mut b = GraphBuilder::new("g");
        let x = b.input("x", DType::F32, &[4, 3]);
        let w = b.input("w", DType::F32, &[3, 5]);
        let g = b.input("g", DType::F32, &[3, 1]);
        let s = b.op("s", "mul", &[&w, &g]);
        let y = b.op("y", "matmul", &[&x, &s]);
        let d = dag(&b.finish(&[&y]));
        let split = split(&d, &fixed(&["w", "g"])).expect("hoisted");
        let hoist = Hoist::new(&split.hoist);
        assert_eq!(hoist.graph.outputs, ["w.folded"]);
        assert_eq!(hoist.reads().collect::<Vec<_>>(), ["w", "g"]);
        assert_eq!(input_names(&split.run), ["x", "w.folded"]);
        assert_eq!(split.run.nodes.len(), 1);
        assert!(super::split(&d, &BTreeSet::new()).is_none());
        // A fixed input that a run-time value is combined with is not enough.
        assert!(super::split(&d, &fixed(&["w"])).is_none());
    }

    /// Views of a weight cost a library call nothing, so they stay; a value larger than the
    /// fixed inputs it is made of (a weight broadcast over the batch) stays, and the
    /// arithmetic below it is hoisted; a graph output is the run's to write.
    #[test]
    fn views_broadcasts_and_outputs_stay_in_the_run() {
        let mut b = GraphBuilder::new("g");
        let x = b.input("x", DType::F32, &[64, 8]);
        let w = b.input("w", DType::F32, &[8, 8]);
        let v = b.input("v", DType::F32, &[8]);
        let wt = b.op("wt", "transpose", &[&w]);
        let y = b.op("y", "matmul", &[&x, &wt]);
        let e = b.op("e", "exp", &[&v]);
        let big = b.op_with(
            "big",
            "broadcast_to",
            &[&e],
            &[("shape", vec![64i64, 8].into())],
        );
        let z = b.op("z", "add", &[&y, &big]);
        let out = b.op("out", "neg", &[&v]);
        let d = dag(&b.finish(&[&z, &out]));
        let split = split(&d, &fixed(&["w", "v"])).expect("exp(v) is hoisted");
        let hoist = Hoist::new(&split.hoist);
        assert_eq!(hoist.graph.outputs, ["v.folded"]);
        // w is still read (through its transpose), v too (by the output `out`).
        assert_eq!(input_names(&split.run), ["x", "w", "v", "v.folded"]);
        let ops: Vec<&str> = split.run.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(ops, ["transpose", "matmul", "broadcast_to", "add", "neg"]);
    }

    /// Constants alone are the kernels' to make (a padding's zeros): never hoisted, and a
    /// hoisted value that reads one gets its own copy.
    #[test]
    fn constants_stay_and_are_copied_into_the_hoist() {
        let mut b = GraphBuilder::new("g");
        let x = b.input("x", DType::F32, &[2, 3]);
        let w = b.input("w", DType::F32, &[3]);
        let one = b.op_with(
            "one",
            "const",
            &[],
            &[
                ("value", 1.0.into()),
                ("dtype", crate::attr::AttrValue::DType(DType::F32)),
            ],
        );
        let ones = b.op_with(
            "ones",
            "broadcast_to",
            &[&one],
            &[("shape", vec![2i64, 3].into())],
        );
        let wp = b.op("wp", "add", &[&w, &one]);
        let y = b.op("y", "mul", &[&x, &wp]);
        let z = b.op("z", "add", &[&y, &ones]);
        let d = dag(&b.finish(&[&z]));
        let split = split(&d, &fixed(&["w"])).expect("w + 1 is hoisted");
        let hoist = Hoist::new(&split.hoist);
        let hoist_ops: Vec<&str> = hoist.graph.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(hoist_ops, ["const", "add"]);
        let run_ops: Vec<&str> = split.run.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(run_ops, ["const", "broadcast_to", "mul", "add"]);
        assert_eq!(input_names(&split.run), ["x", "w.folded"]);
        assert!(hoist.depends_on(["w"].into_iter()));
        assert!(!hoist.depends_on(["x"].into_iter()));
    }
}
