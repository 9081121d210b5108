//! Splitting a joint graph into a forward and a backward graph, fused independently (as MXNet
//! fuses forward and backward apart), with the values that cross between them chosen by cost.
//!
//! The backward reads forward values. Each one is either *saved* (the forward writes it out,
//! the backward reads it back: its bytes twice, and memory held between the passes) or
//! *recomputed* in the backward from other values. As aot_autograd does, the choice is a
//! minimum cut: every forward value is a node whose capacity is its size in bytes; a value
//! the backward reads must be on the far side of the cut from the graph inputs; and a value
//! whose op is neither pointwise nor layout (a matrix product, a reduction) is never
//! recomputed, so it sits on the near side. The cheapest cut is the set of values to save:
//! chains of cheap pointwise ops are recomputed from the few tensors that feed them, and
//! expensive results are saved once.

use super::JointGraph;
use crate::error::Result;
use crate::graph::{Graph, Input, TypeMap, check};
use crate::rules::{Catalogue, OpKind};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use std::collections::{BTreeSet, HashMap, VecDeque};

/// A forward and a backward graph that together compute a joint graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// The original inputs in; the original outputs and the saved values out.
    pub forward: Graph,
    /// The saved values and the cotangents in; the gradients out.
    pub backward: Graph,
    /// The values the backward reads from the forward pass, in forward order: graph inputs
    /// (which the caller holds already, so the forward does not output them) and forward
    /// outputs the forward writes for it.
    pub saved: Vec<String>,
    /// Forward nodes the backward computes again instead of reading.
    pub recomputed: Vec<String>,
    /// Bytes of the saved values.
    pub saved_bytes: u64,
    /// Bytes of every forward value the backward reads directly: what saving everything
    /// would hold.
    pub save_all_bytes: u64,
}

/// Capacity standing for "never cut here": more than all the bytes of any graph.
const NEVER: u64 = 1 << 62;

/// Splits `joint` (from [`super::grad`] of `forward_graph`) into forward and backward graphs.
pub fn split(forward_graph: &Graph, joint: &JointGraph, catalogue: &Catalogue) -> Result<Split> {
    let types = check(&joint.graph, catalogue)?;
    let forward_values: Vec<&str> = forward_graph
        .inputs
        .iter()
        .map(|i| i.name.as_str())
        .chain(forward_graph.nodes.iter().map(|n| n.name.as_str()))
        .collect();
    let is_forward: BTreeSet<&str> = forward_values.iter().copied().collect();
    let backward_nodes = &joint.graph.nodes[forward_graph.nodes.len()..];
    let read_by_backward: BTreeSet<&str> = backward_nodes
        .iter()
        .flat_map(|n| n.args.iter().map(String::as_str))
        .filter(|v| is_forward.contains(v))
        .collect();
    let saved = min_cut(forward_graph, &read_by_backward, &types, catalogue);

    // The backward: forward nodes it must recompute (reached from what it reads without
    // passing a saved value), then the backward nodes.
    let mut recompute = BTreeSet::new();
    let mut stack: Vec<&str> = read_by_backward.iter().copied().collect();
    let nodes_by_name: HashMap<&str, &crate::graph::Node> = forward_graph
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n))
        .collect();
    while let Some(v) = stack.pop() {
        if saved.contains(v) || !recompute.insert(v) {
            continue;
        }
        if let Some(node) = nodes_by_name.get(v) {
            stack.extend(node.args.iter().map(String::as_str));
        }
    }
    let recomputed: Vec<String> = forward_graph
        .nodes
        .iter()
        .filter(|n| recompute.contains(n.name.as_str()))
        .map(|n| n.name.clone())
        .collect();
    let saved_in_order: Vec<String> = forward_values
        .iter()
        .filter(|v| saved.contains(**v))
        .map(|v| v.to_string())
        .collect();
    let input_of = |name: &str| Input {
        name: name.to_string(),
        dtype: types[name].dtype,
        shape: types[name].shape.clone(),
    };

    // A saved graph input is the caller's already: the backward takes it under its own name,
    // and the forward does not copy it out.
    let mut forward_outputs = forward_graph.outputs.clone();
    for v in &saved_in_order {
        if forward_graph.input(v).is_none() && !forward_outputs.contains(v) {
            forward_outputs.push(v.clone());
        }
    }
    let forward = Graph {
        name: format!("{}_forward", forward_graph.name),
        inputs: forward_graph.inputs.clone(),
        nodes: forward_graph.nodes.clone(),
        outputs: forward_outputs,
    };
    let mut inputs: Vec<Input> = saved_in_order.iter().map(|v| input_of(v)).collect();
    inputs.extend(joint.cotangents.iter().map(|(_, c)| input_of(c)));
    let mut nodes: Vec<crate::graph::Node> = forward_graph
        .nodes
        .iter()
        .filter(|n| recompute.contains(n.name.as_str()))
        .cloned()
        .collect();
    nodes.extend(backward_nodes.iter().cloned());
    let backward = Graph {
        name: format!("{}_backward", forward_graph.name),
        inputs,
        nodes,
        outputs: joint.gradients.iter().map(|(_, g)| g.clone()).collect(),
    };
    // Both halves must stand alone; a failure here is a bug in the cut, said as such.
    check(&forward, catalogue)?;
    check(&backward, catalogue)?;
    let bytes = |v: &str| value_bytes(&types[v]);
    Ok(Split {
        saved_bytes: saved_in_order.iter().map(|v| bytes(v)).sum(),
        save_all_bytes: read_by_backward.iter().map(|v| bytes(v)).sum(),
        forward,
        backward,
        saved: saved_in_order,
        recomputed,
    })
}

/// The bytes a value of `ty` occupies (saturating: shapes are bounded, sums of them need not be).
fn value_bytes(ty: &crate::graph::TensorType) -> u64 {
    (ty.dtype.size_bytes() as u64).saturating_mul(crate::shape::numel(&ty.shape) as u64)
}

/// The cheapest set of forward values to save (see the module documentation).
fn min_cut(
    forward: &Graph,
    read_by_backward: &BTreeSet<&str>,
    types: &TypeMap,
    catalogue: &Catalogue,
) -> BTreeSet<String> {
    let mut network: DiGraph<(), u64> = DiGraph::new();
    let source = network.add_node(());
    let sink = network.add_node(());
    // Each value is an edge `in -> out` whose capacity is its size.
    let mut ends: HashMap<&str, (NodeIndex, NodeIndex)> = HashMap::new();
    let add_value = |network: &mut DiGraph<(), u64>, name: &str| {
        let (a, b) = (network.add_node(()), network.add_node(()));
        network.add_edge(a, b, value_bytes(&types[name]).min(NEVER - 1));
        (a, b)
    };
    for input in &forward.inputs {
        let e = add_value(&mut network, &input.name);
        network.add_edge(source, e.0, NEVER);
        ends.insert(&input.name, e);
    }
    for node in &forward.nodes {
        let e = add_value(&mut network, &node.name);
        let recomputable = catalogue
            .get(&node.op)
            .is_some_and(|op| matches!(op.kind(), OpKind::Pointwise | OpKind::Layout));
        if !recomputable {
            network.add_edge(source, e.0, NEVER);
        }
        for arg in &node.args {
            network.add_edge(ends[arg.as_str()].1, e.0, NEVER);
        }
        ends.insert(&node.name, e);
    }
    for v in read_by_backward {
        network.add_edge(ends[v].1, sink, NEVER);
    }
    let (_, flows) = petgraph::algo::ford_fulkerson(&network, source, sink);
    // The near side of the cut: what the source still reaches in the residual network.
    let mut near = vec![false; network.node_count()];
    let mut queue = VecDeque::from([source]);
    near[source.index()] = true;
    while let Some(n) = queue.pop_front() {
        let forward_edges = network
            .edges(n)
            .filter(|e| flows[e.id().index()] < *e.weight())
            .map(|e| e.target());
        let backward_edges = network
            .edges_directed(n, petgraph::Direction::Incoming)
            .filter(|e| flows[e.id().index()] > 0)
            .map(|e| e.source());
        let next: Vec<NodeIndex> = forward_edges.chain(backward_edges).collect();
        for m in next {
            if !near[m.index()] {
                near[m.index()] = true;
                queue.push_back(m);
            }
        }
    }
    ends.iter()
        .filter(|(_, (a, b))| near[a.index()] && !near[b.index()])
        .map(|(name, _)| name.to_string())
        .collect()
}
