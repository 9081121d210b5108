//! Throughput of the reference evaluator and of graph loading.
//!
//! The evaluator is an oracle, not a backend, but property tests run it thousands of times, so
//! its speed decides how many random graphs a test run can afford. Run with
//! `cargo bench --bench reference_eval`.

use criterion::{Criterion, criterion_group, criterion_main};
use fusebox::eval::{evaluate, random_inputs};
use fusebox::graph::file;
use fusebox::rules::Catalogue;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let catalogue = Catalogue::defaults();
    let root = env!("CARGO_MANIFEST_DIR");
    for example in ["gelu_bias", "layernorm_tail", "lstm_cell_backward"] {
        let path = format!("{root}/examples/{example}.ron");
        let text = std::fs::read_to_string(&path).unwrap();
        let (graph, _) = file::parse(&text, &path, &catalogue).unwrap();
        let inputs = random_inputs(&graph, 0);
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
