//! From a graph file to a compiled program, and timing it: what `fusebox run --backend cpu`
//! and `fusebox bench` do, available to library users too.
//!
//! [`prepare`] applies the AMP policy (if any), optimizes (or, with `fusion: false`, keeps one
//! kernel per op: the fair unfused baseline through the same code generator), lowers, and
//! compiles. [`bench`] then runs the compiled program on seeded random inputs and reports the
//! median wall time per run, which excludes compilation and file I/O.

use crate::backend::cpu::compiler::{CompileStats, Compiler};
use crate::dag::Dag;
use crate::error::Result;
use crate::exec::CpuExecutable;
use crate::exec::buffer::Buffer;
use crate::graph::Graph;
use crate::lower;
use crate::optimize::{Options, optimize};
use crate::partition::{self, Partition};
use crate::rules::RuleSet;
use serde::Serialize;
use std::time::Instant;

/// How to build a program.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// An AMP policy of amp.ron (f16, bf16) applied before anything else.
    pub amp: Option<String>,
    /// Optimize and fuse; off, every op is its own kernel (no rewrites either).
    pub fusion: bool,
    /// The cost profile the optimizer prices kernels with.
    pub profile: String,
    /// Leave out rewrite rules that hold only for finite values.
    pub strict_ieee: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            amp: None,
            fusion: true,
            profile: "cpu".into(),
            strict_ieee: false,
        }
    }
}

/// A graph compiled for the CPU.
pub struct Prepared {
    pub executable: CpuExecutable,
    /// The partition the program runs: its kernels and their modeled cost and bytes.
    pub partition: Partition,
    /// Milliseconds spent optimizing (0 without fusion) and compiling (0 on a cache hit
    /// apart from loading).
    pub optimize_ms: f64,
    pub compile_ms: f64,
    /// What the compiler did for this program.
    pub compile: CompileStats,
}

impl Prepared {
    /// Seeded random inputs for `graph` (the reference evaluator's `random_input`), in the
    /// order the program takes them.
    pub fn random_inputs(&self, graph: &Graph, seed: u64) -> Vec<Buffer> {
        self.executable
            .program()
            .dag
            .inputs
            .iter()
            .map(|input| {
                let index = graph
                    .inputs
                    .iter()
                    .position(|i| i.name == input.name)
                    .expect("the program keeps the graph's inputs");
                Buffer::from_tensor(&crate::eval::random_input(graph, index, seed))
            })
            .collect()
    }
}

/// Optimizes (or not), lowers and compiles `graph`.
pub fn prepare(
    graph: &Graph,
    rules: &RuleSet,
    options: &RunOptions,
    compiler: &Compiler,
) -> Result<Prepared> {
    let (program, partition, optimize_ms) = lower_graph(graph, rules, options)?;
    let before = compiler.stats();
    let start = Instant::now();
    let executable = CpuExecutable::new(program, compiler)?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    let after = compiler.stats();
    Ok(Prepared {
        executable,
        partition,
        optimize_ms,
        compile_ms,
        compile: CompileStats {
            compiled: after.compiled - before.compiled,
            disk_hits: after.disk_hits - before.disk_hits,
            memory_hits: after.memory_hits - before.memory_hits,
            rebuilt_corrupt: after.rebuilt_corrupt - before.rebuilt_corrupt,
        },
    })
}

/// Applies AMP, optimizes (or, without fusion, partitions one kernel per op) and lowers:
/// the part of [`prepare`] every backend shares. Returns the program, its partition and the
/// milliseconds spent optimizing (0 without fusion).
fn lower_graph(
    graph: &Graph,
    rules: &RuleSet,
    options: &RunOptions,
) -> Result<(lower::Program, Partition, f64)> {
    let start = Instant::now();
    let (dag, partition) = if options.fusion {
        let optimized = optimize(
            graph,
            rules,
            &Options {
                profile: options.profile.clone(),
                strict_ieee: options.strict_ieee,
                amp: options.amp.clone(),
                ..Options::default()
            },
        )?;
        (optimized.dag, optimized.partition)
    } else {
        let graph = match &options.amp {
            Some(policy) => {
                crate::amp::insert_casts(graph, &rules.ops, rules.amp.policy(policy)?)?.graph
            }
            None => graph.clone(),
        };
        let dag = Dag::from_graph(&graph, &rules.ops)?;
        let partition = partition::unfused(&dag, rules.cost.profile(&options.profile)?);
        (dag, partition)
    };
    let optimize_ms = if options.fusion {
        start.elapsed().as_secs_f64() * 1e3
    } else {
        0.0
    };
    let program = lower::lower(&dag, &partition)?;
    Ok((program, partition, optimize_ms))
}

/// What `fusebox bench` reports.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub graph: String,
    pub backend: &'static str,
    pub fusion: bool,
    pub amp: Option<String>,
    /// Kernels per run (a library call counts as one).
    pub kernels: usize,
    /// Bytes read and written at kernel boundaries per run (the partition's count).
    pub bytes: u64,
    pub iters: usize,
    /// Median wall time of one run, in milliseconds.
    pub median_ms: f64,
    pub min_ms: f64,
    /// `bytes` over the median time.
    pub gbps: f64,
    /// Threads the kernels may use (OpenMP's default, or OMP_NUM_THREADS).
    pub threads: usize,
    pub optimize_ms: f64,
    pub compile_ms: f64,
    /// Intermediate buffer bytes with reuse by liveness, and without.
    pub scratch_bytes: usize,
    pub scratch_bytes_unshared: usize,
}

/// Runs `prepared` `iters` times (after one warm-up run) on seeded random inputs and reports
/// the median.
pub fn bench(
    prepared: &mut Prepared,
    graph: &Graph,
    options: &RunOptions,
    iters: usize,
    seed: u64,
) -> Result<BenchReport> {
    let inputs = prepared.random_inputs(graph, seed);
    let exe = &mut prepared.executable;
    let mut outputs = exe.output_buffers();
    exe.run_into(&inputs, &mut outputs)?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let start = Instant::now();
        exe.run_into(&inputs, &mut outputs)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let median_ms = times[times.len() / 2];
    let bytes = prepared.partition.cost.bytes;
    Ok(BenchReport {
        graph: graph.name.clone(),
        backend: "cpu",
        fusion: options.fusion,
        amp: options.amp.clone(),
        kernels: prepared.partition.kernels.len(),
        bytes,
        iters: times.len(),
        median_ms,
        min_ms: times[0],
        gbps: bytes as f64 / (median_ms * 1e6),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        optimize_ms: prepared.optimize_ms,
        compile_ms: prepared.compile_ms,
        scratch_bytes: exe.memory_plan().total_bytes(),
        scratch_bytes_unshared: exe.memory_plan().unshared_bytes,
    })
}
