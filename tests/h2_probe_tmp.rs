use egg::Runner;
use fusebox::dag::Dag;
use fusebox::egraph::{ENode, FuseGraph, TypeAnalysis, new_egraph, seed};
use fusebox::extract::{self, ExtractOptions};
use fusebox::partition;
use fusebox::rules::RuleSet;
use std::time::Instant;

fn estimate(egraph: &FuseGraph, id: egg::Id, node: &ENode) -> f64 {
    let Some(ty) = egraph[id].data.ty() else { return 0.0 };
    if node.op_name().is_none() || node.op_name() == Some("const") { return 0.0; }
    fusebox::shape::numel(&ty.shape) as f64
}

#[test]
fn probe() {
    let rules = RuleSet::defaults();
    let profile = rules.cost.profile("h200").unwrap();
    let graph = fusebox::graph::synthetic::pointwise(10_000, 256, 1024, 1);
    let dag = Dag::from_graph(&graph, &rules.ops).unwrap();
    let mut egraph = new_egraph(&dag, &rules.ops);
    let mut seeded = seed(&mut egraph, &dag);
    egraph.rebuild();
    let rw: Vec<_> = rules.rewrites.iter().flat_map(|r| r.rewrites()).collect();
    let t = Instant::now();
    let runner: Runner<ENode, TypeAnalysis> = Runner::new(egraph.analysis.clone()).with_egraph(egraph).with_iter_limit(8).with_node_limit(100_000).with_time_limit(std::time::Duration::from_secs(20)).run(&rw);
    eprintln!("saturate {:?} {:?} nodes {} classes {}", t.elapsed(), runner.stop_reason, runner.egraph.total_number_of_nodes(), runner.egraph.number_of_classes());
    let egraph = runner.egraph;
    seeded.canonicalize(&egraph);
    let cost = |d: &Dag| partition::partition(d, &rules.fusion, profile).cost.total_us;
    let t = Instant::now();
    let c = cost(&dag);
    eprintln!("one partition {:?} cost {c}", t.elapsed());
    let t = Instant::now();
    let r = extract::extract(&egraph, &seeded, &cost, &estimate, &ExtractOptions::default());
    let t2 = Instant::now();
    let r0 = extract::greedy(&egraph, &seeded, &cost, &estimate, &ExtractOptions { local_search_budget: 0, ..ExtractOptions::default() });
    eprintln!("greedy no local {:?} evals {} cost {}", t2.elapsed(), r0.evaluations, r0.cost);
    for b in [1, 2, 5, 10] {
        let t2 = Instant::now();
        let r0 = extract::greedy(&egraph, &seeded, &cost, &estimate, &ExtractOptions { local_search_budget: b, ..ExtractOptions::default() });
        eprintln!("greedy budget {b}: {:?} evals {} cost {}", t2.elapsed(), r0.evaluations, r0.cost);
    }
    let t2 = Instant::now();
    let _ = extract::exact(&egraph, &seeded, &cost, &ExtractOptions::default());
    eprintln!("exact attempt {:?}", t2.elapsed());
    let t = Instant::now();
    let r = extract::extract(&egraph, &seeded, &cost, &estimate, &ExtractOptions::default());
    eprintln!("extract {:?} method {} evals {} cost {} original {}", t.elapsed(), r.method, r.evaluations, r.cost, r.original_cost);
}
