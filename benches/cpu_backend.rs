//! Run time of the compiled CPU programs, fused against unfused, through the library API.
//!
//! The unfused program is the same code generator with one kernel per op, so the gap between
//! the two is what fusion buys and nothing else. Compilation happens once per program, outside
//! the timed loop (and is served from the on-disk cache after the first run, per
//! `FUSEBOX_CACHE_DIR`). Throughput is counted in compulsory bytes (every input read once,
//! every output written once), identical for both programs so their GB/s compare directly.
//! Run with `cargo bench --bench cpu_backend`; `benches/peers.py` puts the same programs next
//! to NumPy, PyTorch and JAX.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fusebox::backend::Executable;
use fusebox::backend::cpu::CpuExecutable;
use fusebox::backend::cpu::compiler::{Compiler, CompilerConfig};
use fusebox::graph::{Graph, file};
use fusebox::optimize::Options;
use fusebox::rules::RuleSet;
use fusebox::runner::{Prepared, prepare};
use fusebox::runtime::buffer::Buffer;
use std::time::Duration;

/// Seeded random inputs (uniform in [-3, 3]) in the order the program takes them.
fn inputs(prepared: &Prepared<CpuExecutable>, graph: &Graph) -> Vec<Buffer> {
    prepared
        .random_inputs(graph, 0)
        .expect("the benchmark inputs fit in memory")
}

fn bench(c: &mut Criterion) {
    let rules = RuleSet::defaults();
    let compiler = Compiler::new(CompilerConfig::from_env());
    let root = env!("CARGO_MANIFEST_DIR");
    let mut group = c.benchmark_group("cpu_backend");
    // Two cores shared with other work: few samples, short windows, and the median is what
    // criterion reports anyway.
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    for example in ["lstm_cell", "lstm_cell_backward"] {
        let path = format!("{root}/examples/{example}.ron");
        let (graph, _) = file::load(std::path::Path::new(&path), &rules.ops).unwrap();
        for fusion in [true, false] {
            let options = Options {
                fusion,
                ..Options::default()
            };
            let mut prepared = prepare(&graph, &rules, &options, &compiler).unwrap();
            let inputs = inputs(&prepared, &graph);
            let mut outputs = prepared.executable.output_buffers();
            let compulsory: usize = inputs.iter().chain(&outputs).map(Buffer::byte_len).sum();
            let label = if fusion { "fused" } else { "unfused" };
            eprintln!(
                "{example} {label}: {}, {} bytes at kernel boundaries, {compulsory} \
                 compulsory, compiled in {:.0} ms ({} compiled, {} from disk)",
                prepared.partition.count(),
                prepared.partition.cost.bytes,
                prepared.compile_ms,
                prepared.compile.compiled,
                prepared.compile.disk_hits,
            );
            group.throughput(Throughput::Bytes(compulsory as u64));
            group.bench_function(format!("{example}/{label}"), |b| {
                b.iter(|| prepared.executable.run_into(&inputs, &mut outputs).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
