use super::*;
use crate::dag::Value;
use crate::dtype::DType;
use crate::egraph::{new_egraph, seed};
use crate::graph::{Graph, GraphBuilder};
use crate::rules::Catalogue;
use egg::{CostFunction, Extractor};

fn seed_graph(graph: &Graph) -> (FuseGraph, Seeded) {
    let catalogue = Catalogue::defaults();
    let dag = Dag::from_graph(graph, &catalogue).expect("test graph checks");
    let mut egraph = new_egraph(&dag, &catalogue);
    let seeded = seed(&mut egraph, &dag);
    egraph.rebuild();
    (egraph, seeded)
}

fn add(egraph: &mut FuseGraph, op: &str, children: &[Id]) -> Id {
    egraph.add(ENode::op(op, children.to_vec()))
}

/// A per-op price list: the estimate of an e-node, and (summed over a dag's nodes) the true
/// cost, so the greedy pass and the true cost agree and the expected answer is hand-computable.
fn price(op: &str) -> f64 {
    match op {
        "exp" => 10.0,
        "sigmoid" => 14.0,
        "add" | "neg" | "relu" | "mul" => 1.0,
        _ => 0.0,
    }
}

fn estimate(_: &FuseGraph, _: Id, node: &ENode) -> f64 {
    node.op_name().map_or(0.0, price)
}

fn dag_cost(dag: &Dag) -> f64 {
    dag.nodes.iter().map(|n| price(n.op.name())).sum()
}

fn no_local_search() -> ExtractOptions {
    ExtractOptions {
        local_search_budget: 0,
        ..ExtractOptions::default()
    }
}

/// Tree cost, as egg's own extractor computes it: a shared child is paid once per use.
struct TreeCost;

impl CostFunction<ENode> for TreeCost {
    type Cost = f64;
    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &ENode, mut costs: C) -> f64 {
        let own = enode.op_name().map_or(0.0, price);
        enode.children().iter().fold(own, |sum, &c| sum + costs(c))
    }
}

/// `o` is both `neg(sigmoid(x))` (tree cost 15, DAG cost 15) and `add(exp(x), exp(x))` (tree
/// cost 21, DAG cost 11: the `exp` is one tensor used twice).
fn shared_subterm() -> (FuseGraph, Seeded, Id) {
    let mut b = GraphBuilder::new("shared");
    let x = b.input("x", DType::F32, &[8]);
    let u = b.op("u", "sigmoid", &[&x]);
    let o = b.op("o", "neg", &[&u]);
    let (mut egraph, seeded) = seed_graph(&b.finish(&[&o]));
    let out = seeded.outputs[0].1;
    let s = add(&mut egraph, "exp", &[seeded.input_classes[0]]);
    let twice = add(&mut egraph, "add", &[s, s]);
    egraph.union(out, twice);
    egraph.rebuild();
    let out = egraph.find(out);
    (egraph, seeded, out)
}

#[test]
fn greedy_pays_a_shared_subterm_once() {
    let (egraph, seeded, out) = shared_subterm();
    // The tree extractor prefers neg(sigmoid(x)): 15 < 21.
    let (tree_cost, tree) = Extractor::new(&egraph, TreeCost).find_best(out);
    assert_eq!(tree_cost, 15.0);
    assert_eq!(tree.to_string(), "(neg (sigmoid $x))");

    // The DAG-aware pass prefers add(exp(x), exp(x)): 11 < 15, with local search off.
    let result = greedy(&egraph, &seeded, &dag_cost, &estimate, &no_local_search());
    assert_eq!(result.method, Method::Greedy);
    assert_eq!(result.cost, 11.0);
    assert_eq!(result.original_cost, 15.0);
    let ops: Vec<&str> = result.dag.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(ops, ["exp", "add"]);
    assert_eq!(result.dag.nodes[1].args, [Value::Node(0), Value::Node(0)]);
    assert_eq!(result.choice[&out].op_name(), Some("add"));

    let best = exact(&egraph, &seeded, &dag_cost, &ExtractOptions::default()).expect("small");
    assert_eq!(best.method, Method::Exact);
    assert_eq!(best.cost, 11.0);
    // Two complete choices, plus the original graph evaluated as the incumbent.
    assert_eq!(best.evaluations, 3);
}

/// `x` and `neg(neg(x))` merged: choosing `neg` in `x`'s class loops back to itself.
#[test]
fn a_class_equal_to_its_own_double_negation_never_yields_a_cycle() {
    let mut b = GraphBuilder::new("negneg");
    let x = b.input("x", DType::F32, &[4]);
    let a = b.op("a", "neg", &[&x]);
    let n = b.op("n", "neg", &[&a]);
    let o = b.op("o", "relu", &[&n]);
    let (mut egraph, seeded) = seed_graph(&b.finish(&[&o]));
    let x_class = seeded.input_classes[0];
    egraph.union(x_class, seeded.node_classes[1]);
    egraph.rebuild();
    let x_class = egraph.find(x_class);
    assert_eq!(
        egraph[x_class].nodes.len(),
        2,
        "x's class holds $x and neg(a)"
    );

    // Bait: the input looks dearer than a negation, so a cycle-blind pass would take neg.
    let bait = |_: &FuseGraph, _: Id, node: &ENode| match node {
        ENode::Input(_) => 100.0,
        _ => 1.0,
    };
    let original = original_choice(&egraph, &seeded);
    assert!(matches!(original[&x_class], ENode::Input(_)));

    for options in [no_local_search(), ExtractOptions::default()] {
        let result = greedy(&egraph, &seeded, &dag_cost, &bait, &options);
        let ops: Vec<&str> = result.dag.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(ops, ["relu"]);
        assert_eq!(result.dag.nodes[0].args, [Value::Input(0)]);
    }
    let best = exact(&egraph, &seeded, &dag_cost, &ExtractOptions::default()).expect("small");
    assert_eq!(best.dag.nodes.len(), 1);
    // One acyclic choice (the other closes the loop) plus the incumbent.
    assert_eq!(best.evaluations, 2);
}

/// A chain `x * y * y * …` where every product also holds its commuted form: 2^n choices.
fn commuted_chain(n: usize) -> (FuseGraph, Seeded) {
    let mut b = GraphBuilder::new("chain");
    let x = b.input("x", DType::F32, &[4]);
    let y = b.input("y", DType::F32, &[4]);
    let mut prev = x;
    for i in 0..n {
        prev = b.op(&format!("m{i}"), "mul", &[&prev, &y]);
    }
    let (mut egraph, seeded) = seed_graph(&b.finish(&[&prev]));
    let y_class = seeded.input_classes[1];
    for i in 0..n {
        let class = seeded.node_classes[i];
        let left = if i == 0 {
            seeded.input_classes[0]
        } else {
            seeded.node_classes[i - 1]
        };
        let swapped = add(&mut egraph, "mul", &[y_class, left]);
        egraph.union(class, swapped);
    }
    egraph.rebuild();
    (egraph, seeded)
}

#[test]
fn exact_declines_past_its_limit_and_extract_falls_back_to_greedy() {
    let (egraph, seeded) = commuted_chain(12); // 4096 choices
    let options = ExtractOptions {
        exact_limit: 4096,
        ..ExtractOptions::default()
    };
    let best = exact(&egraph, &seeded, &dag_cost, &options).expect("fits exactly");
    assert_eq!(best.evaluations, 4096 + 1);
    let tight = ExtractOptions {
        exact_limit: 4095,
        ..ExtractOptions::default()
    };
    assert!(exact(&egraph, &seeded, &dag_cost, &tight).is_none());
    let result = extract(&egraph, &seeded, &dag_cost, &estimate, &tight);
    assert_eq!(result.method, Method::Greedy);
    assert_eq!(result.cost, 12.0);
    assert_eq!(result.dag.nodes.len(), 12);
}

#[test]
fn a_long_chain_extracts_without_deep_recursion() {
    let n = 10_000;
    let (egraph, seeded) = commuted_chain(n);
    let start = std::time::Instant::now();
    let result = extract(
        &egraph,
        &seeded,
        &dag_cost,
        &estimate,
        &ExtractOptions::default(),
    );
    eprintln!(
        "{n}-class chain with 2^{n} choices: {:?}, {} evaluations",
        start.elapsed(),
        result.evaluations
    );
    assert_eq!(result.method, Method::Greedy);
    assert_eq!(result.dag.nodes.len(), n);
    assert_eq!(result.cost, n as f64);

    // One choice per class: exact, with one candidate graph (and the incumbent).
    let (egraph, seeded) = {
        let mut b = GraphBuilder::new("plain");
        let x = b.input("x", DType::F32, &[4]);
        let mut prev = x;
        for i in 0..n {
            prev = b.op(&format!("r{i}"), "relu", &[&prev]);
        }
        seed_graph(&b.finish(&[&prev]))
    };
    let result = extract(
        &egraph,
        &seeded,
        &dag_cost,
        &estimate,
        &ExtractOptions::default(),
    );
    assert_eq!(result.method, Method::Exact);
    assert_eq!(result.evaluations, 2);
    assert_eq!(result.dag.nodes.len(), n);
}

#[test]
fn local_search_fixes_what_the_estimate_gets_wrong() {
    let (egraph, seeded, out) = shared_subterm();
    // The estimate misprices `add`, so the bottom-up pass takes neg(sigmoid(x)) (2 < 6); the
    // true cost prefers add(exp(x), exp(x)) and local improvement finds it.
    let flat = |_: &FuseGraph, _: Id, node: &ENode| match node.op_name() {
        Some("add") => 5.0,
        Some(_) => 1.0,
        None => 0.0,
    };
    let without = greedy(&egraph, &seeded, &dag_cost, &flat, &no_local_search());
    assert_eq!(without.cost, 15.0);
    let with = greedy(
        &egraph,
        &seeded,
        &dag_cost,
        &flat,
        &ExtractOptions::default(),
    );
    assert_eq!(with.cost, 11.0);
    assert_eq!(with.choice[&out].op_name(), Some("add"));
}

#[test]
fn ties_keep_the_original_graph() {
    let (egraph, seeded) = commuted_chain(3);
    let result = extract(
        &egraph,
        &seeded,
        &dag_cost,
        &estimate,
        &ExtractOptions::default(),
    );
    let original = original_choice(&egraph, &seeded);
    for (id, node) in &result.choice {
        assert_eq!(&original[id], node);
    }
}
