//! Throughput of the reference evaluator and of graph loading.
//!
//! The evaluator is an oracle, not a backend, but property tests run it thousands of times, so
//! its speed decides how many random graphs a test run can afford. Run with
//! `cargo bench --bench reference_eval`.

use criterion::{Criterion, criterion_group, criterion_main};
use fusebox::eval::{Tensors, evaluate};
use fusebox::graph::file;
use fusebox::rules::Catalogue;
use fusebox::tensor::{Tensor, seeded_rng};
use std::hint::black_box;

fn random_inputs(graph: &fusebox::graph::Graph) -> Tensors {
    let mut rng = seeded_rng(0);
    graph
        .inputs
        .iter()
        .map(|i| (i.name.clone(), Tensor::random(i.dtype, &i.shape, &mut rng)))
        .collect()
}

fn bench(c: &mut Criterion) {
    let catalogue = Catalogue::defaults();
    let root = env!("CARGO_MANIFEST_DIR");
    for example in ["gelu_bias", "layernorm_tail", "lstm_cell_backward"] {
        let path = format!("{root}/examples/{example}.ron");
        let text = std::fs::read_to_string(&path).unwrap();
        let (graph, _) = file::parse(&text, &path, &catalogue).unwrap();
        let inputs = random_inputs(&graph);
        c.bench_function(&format!("load {example}"), |b| {
            b.iter(|| file::parse(black_box(&text), &path, &catalogue).unwrap())
        });
        let mut group = c.benchmark_group("reference");
        group.sample_size(10);
        group.bench_function(example, |b| {
            b.iter(|| evaluate(&graph, &catalogue, black_box(&inputs)).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
