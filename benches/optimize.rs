//! How long `optimize()` takes: the targets are under 20 ms for `lstm_cell` and under 2 s for a
//! generated 10,000-node pointwise graph with the default limits. Run with
//! `cargo bench --bench optimize`; the book's "Rewrite rules and the cost model" chapter records
//! the figures. Each run also prints what the optimizer did (kernels, e-graph size, why
//! saturation stopped), so a timing is never read without knowing how much work it bought.

use criterion::{Criterion, criterion_group, criterion_main};
use fusebox::graph::{Graph, file, synthetic};
use fusebox::optimize::{Options, optimize};
use fusebox::rules::RuleSet;
use std::hint::black_box;

fn describe(label: &str, graph: &Graph, rules: &RuleSet) {
    let out = optimize(graph, rules, &Options::default()).expect("optimizes");
    let r = &out.report;
    eprintln!(
        "{label}: {} nodes, kernels {} -> {}, e-graph {} nodes / {} classes, {} iterations ({}), \
         extraction {} with {} evaluations, {:.1} ms",
        graph.nodes.len(),
        r.kernels_before,
        r.kernels_after,
        r.egraph.nodes,
        r.egraph.classes,
        r.egraph.iterations,
        r.egraph.stop_reason,
        r.extraction.method.expect("optimize with fusion extracts"),
        r.extraction.evaluations,
        r.time_ms
    );
}

fn bench(c: &mut Criterion) {
    let rules = RuleSet::defaults();
    let root = env!("CARGO_MANIFEST_DIR");
    let mut group = c.benchmark_group("optimize");
    for example in ["lstm_cell", "lstm_cell_backward", "mlp_block"] {
        let path = format!("{root}/examples/{example}.ron");
        let (graph, _) = file::load(std::path::Path::new(&path), &rules.ops).unwrap();
        describe(example, &graph, &rules);
        group.bench_function(example, |b| {
            b.iter(|| optimize(black_box(&graph), &rules, &Options::default()).unwrap())
        });
    }
    let big = synthetic::pointwise(10_000, 256, 256, 1);
    describe("pointwise_10000", &big, &rules);
    group.sample_size(10);
    group.bench_function("pointwise_10000", |b| {
        b.iter(|| optimize(black_box(&big), &rules, &Options::default()).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
