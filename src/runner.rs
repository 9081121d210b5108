//! From a graph to a compiled program, and timing it: what `fusebox run` and `fusebox bench` do
//! on a compiled backend, available to library users too.
//!
//! [`lower_graph`] runs the one pipeline ([`crate::optimize::optimize`]: the AMP policy, then
//! optimization, or with `fusion: false` one kernel per op, the fair unfused baseline through
//! the same code generator) and lowers its partition. [`prepare`] compiles the result for a
//! [`Target`] (the CPU's C compiler, or a GPU), and [`bench()`] runs it on seeded random inputs
//! and reports the median time per run, which excludes compilation and file I/O. Nothing here
//! knows which backend it drives.

use crate::backend::{BenchFacts, Executable, Target};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::Graph;
use crate::hoist::Hoist;
use crate::lower;
use crate::optimize::{Optimized, Options, Report, optimize};
use crate::partition::{KernelCount, Partition};
use crate::rules::{Catalogue, RuleSet};
use crate::runtime::buffer::Buffer;
use serde::Serialize;
use std::time::Instant;

/// A graph compiled for one backend.
pub struct Prepared<E: Executable> {
    pub executable: E,
    /// The partition the program runs: its kernels and their modeled cost and bytes.
    pub partition: Partition,
    /// Milliseconds spent optimizing (0 without fusion), and compiling and loading (little
    /// on a cache hit).
    pub optimize_ms: f64,
    pub compile_ms: f64,
    /// What the backend's compiler and caches did for this program.
    pub compile: E::CompileStats,
    /// What [`optimize`] did: kernels, bytes and modeled cost before and after.
    pub report: Report,
    /// What computes the values the program reads as inputs but the fixed inputs alone
    /// determine ([`Options::fixed`]); `None` when there are none.
    pub hoist: Option<Hoist>,
    /// The ops the hoist is evaluated with.
    pub catalogue: Catalogue,
}

impl<E: Executable> Prepared<E> {
    /// Seeded random inputs for `graph` (the reference evaluator's `random_input`), in the
    /// order the program takes them.
    pub fn random_inputs(&self, graph: &Graph, seed: u64) -> Result<Vec<Buffer>> {
        self.inputs(graph, &crate::eval::Tensors::new(), seed)
    }

    /// The inputs of `graph` in the order the program takes them: the value `given` holds
    /// for an input, else a seeded random one (as [`Prepared::random_inputs`]); the hoisted
    /// values among them are computed from those of the fixed inputs.
    pub fn inputs(
        &self,
        graph: &Graph,
        given: &crate::eval::Tensors,
        seed: u64,
    ) -> Result<Vec<Buffer>> {
        let mut values = crate::eval::Tensors::new();
        for (index, input) in graph.inputs.iter().enumerate() {
            let value = match given.get(&input.name) {
                Some(value) => value.clone(),
                None => crate::eval::try_random_input(graph, index, seed)?,
            };
            values.insert(input.name.clone(), value);
        }
        if let Some(hoist) = &self.hoist {
            let hoisted = hoist.values(&self.catalogue, &values)?;
            values.extend(hoisted);
        }
        self.executable
            .program()
            .dag
            .inputs
            .iter()
            .map(|input| {
                let value = values
                    .get(&input.name)
                    .expect("the program's inputs are the graph's and the hoisted values");
                Buffer::try_from_tensor(value)
                    .map_err(|e| Error::at_node(&input.name, ErrorKind::Input(e.to_string())))
            })
            .collect()
    }
}

/// Optimizes (or not), lowers and compiles `graph` for `target`. The target is opened first,
/// so a machine without the device fails at once, before optimizing.
pub fn prepare<T: Target>(
    graph: &Graph,
    rules: &RuleSet,
    options: &Options,
    target: &T,
) -> Result<Prepared<T::Executable>> {
    target.open()?;
    let (program, optimized, optimize_ms) = lower_optimized(graph, rules, options)?;
    let start = Instant::now();
    let executable = target.build(program)?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Prepared {
        compile: executable.compile_stats(),
        executable,
        partition: optimized.partition,
        report: optimized.report,
        hoist: optimized.hoist,
        catalogue: rules.ops.clone(),
        optimize_ms,
        compile_ms,
    })
}

/// The pipeline ([`optimize`]) and lowering: the part of [`prepare`] every backend shares.
/// Returns the program, its partition and the milliseconds spent optimizing (0 without
/// fusion).
pub fn lower_graph(
    graph: &Graph,
    rules: &RuleSet,
    options: &Options,
) -> Result<(lower::Program, Partition, f64)> {
    let (program, optimized, optimize_ms) = lower_optimized(graph, rules, options)?;
    Ok((program, optimized.partition, optimize_ms))
}

/// [`lower_graph`], keeping all of what [`optimize`] returned (its report too).
fn lower_optimized(
    graph: &Graph,
    rules: &RuleSet,
    options: &Options,
) -> Result<(lower::Program, Optimized, f64)> {
    let start = Instant::now();
    let optimized = optimize(graph, rules, options)?;
    let optimize_ms = if options.fusion {
        start.elapsed().as_secs_f64() * 1e3
    } else {
        0.0
    };
    let program = lower::lower(&optimized.dag, &optimized.partition)?;
    Ok((program, optimized, optimize_ms))
}

/// What `fusebox bench` reports.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub graph: String,
    pub backend: &'static str,
    pub fusion: bool,
    pub amp: Option<String>,
    /// Kernels and library calls per run, counted apart as every report counts them
    /// (serialized as `kernels` and `library_calls`).
    #[serde(flatten)]
    pub count: KernelCount,
    /// Bytes read and written at kernel boundaries per run (the partition's count).
    pub bytes: u64,
    pub iters: usize,
    /// Median time of one run, in milliseconds.
    pub median_ms: f64,
    pub min_ms: f64,
    /// `bytes` over the median time.
    pub gbps: f64,
    /// What the backend says about the machine.
    #[serde(flatten)]
    pub facts: BenchFacts,
    pub optimize_ms: f64,
    pub compile_ms: f64,
    /// Kernel sources compiled for this run, and found compiled in the cache (on disk or in
    /// the compiler's memory): a second size of a model with symbolic dimensions compiles
    /// nothing when its kernels are the first size's.
    pub kernels_compiled: usize,
    pub kernels_cached: usize,
    /// Intermediate buffer bytes with reuse by liveness, and without.
    pub scratch_bytes: usize,
    pub scratch_bytes_unshared: usize,
}

/// Runs `prepared` `iters` times (after warm-up) on the values `given` holds and seeded random
/// values for the other inputs, and reports the median time per run, as the backend times it
/// (wall clock on the CPU, device events on a GPU, where a device-to-device copy of the same
/// bytes is timed alongside).
pub fn bench<E: Executable>(
    prepared: &mut Prepared<E>,
    graph: &Graph,
    options: &Options,
    iters: usize,
    given: &crate::eval::Tensors,
    seed: u64,
) -> Result<BenchReport> {
    let inputs = prepared.inputs(graph, given, seed)?;
    let builds: crate::backend::cache::CompileStats = prepared.compile.into();
    let exe = &mut prepared.executable;
    let times = exe.time_runs(&inputs, iters)?;
    let median_ms = times[times.len() / 2];
    let bytes = prepared.partition.cost.bytes;
    Ok(BenchReport {
        graph: graph.name.clone(),
        backend: E::BACKEND,
        fusion: options.fusion,
        amp: options.amp.clone(),
        count: prepared.partition.count(),
        bytes,
        iters: times.len(),
        median_ms,
        min_ms: times[0],
        gbps: bytes as f64 / (median_ms * 1e6),
        facts: exe.bench_facts(bytes, iters)?,
        optimize_ms: prepared.optimize_ms,
        compile_ms: prepared.compile_ms,
        kernels_compiled: builds.compiled,
        kernels_cached: builds.disk_hits + builds.memory_hits,
        scratch_bytes: exe.memory_plan().total_bytes(),
        scratch_bytes_unshared: exe.memory_plan().unshared_bytes,
    })
}
