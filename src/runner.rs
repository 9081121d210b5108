//! From a graph file to a compiled program, and timing it: what `fusebox run --backend cpu`
//! and `fusebox bench` do, available to library users too.
//!
//! [`prepare`] applies the AMP policy (if any), optimizes (or, with `fusion: false`, keeps one
//! kernel per op: the fair unfused baseline through the same code generator), lowers, and
//! compiles. [`bench()`] then runs the compiled program on seeded random inputs and reports the
//! median wall time per run, which excludes compilation and file I/O.
//!
//! [`prepare_cuda`] and [`bench_cuda`] do the same for the GPU: the same optimized and lowered
//! program, run by [`crate::backend::cuda::runtime`], timed with CUDA events.

use crate::backend::cpu::compiler::{CompileStats, Compiler};
use crate::backend::cuda::runtime::{CudaExecutable, CudaOptions, Device, ModuleStats};
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
        program_inputs(self.executable.program(), graph, seed)
    }
}

/// Seeded random inputs for `graph` in the order `program` takes them.
fn program_inputs(program: &lower::Program, graph: &Graph, seed: u64) -> Vec<Buffer> {
    program
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
    Ok(Prepared {
        executable,
        partition,
        optimize_ms,
        compile_ms,
        compile: compiler.stats().since(&before),
    })
}

/// Applies AMP, optimizes (or, without fusion, partitions one kernel per op) and lowers:
/// the part of [`prepare`] every backend shares. Returns the program, its partition and the
/// milliseconds spent optimizing (0 without fusion).
pub fn lower_graph(
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
    /// Threads the kernels may use (OpenMP's default, or OMP_NUM_THREADS); CPU only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// The GPU, for the cuda backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Whether runs were replayed from a captured CUDA graph (cuda backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_graph: Option<bool>,
    /// Device operations queued per run: kernel launches (a reduction may take several),
    /// cuBLAS calls, fills and copies (cuda backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launches: Option<usize>,
    /// GB/s of a device-to-device copy moving the same bytes, timed the same way in the same
    /// process: what `gbps` would be at copy speed (cuda backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_gbps: Option<f64>,
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
        threads: Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
        device: None,
        cuda_graph: None,
        launches: None,
        copy_gbps: None,
        optimize_ms: prepared.optimize_ms,
        compile_ms: prepared.compile_ms,
        scratch_bytes: exe.memory_plan().total_bytes(),
        scratch_bytes_unshared: exe.memory_plan().unshared_bytes,
    })
}

/// The cost profile a GPU run is optimized for.
pub const CUDA_PROFILE: &str = "h200";

/// A graph compiled for a GPU.
pub struct CudaPrepared {
    pub executable: CudaExecutable,
    /// The partition the program runs.
    pub partition: Partition,
    /// Milliseconds spent optimizing (0 without fusion), and compiling and loading the module
    /// (little on a cache hit).
    pub optimize_ms: f64,
    pub compile_ms: f64,
    /// What NVRTC and the module cache did for this program.
    pub compile: ModuleStats,
}

/// Optimizes (or not), lowers, compiles with NVRTC and loads `graph` on the GPU `cuda` names.
/// The device is opened first, so a machine without CUDA fails at once, before optimizing.
pub fn prepare_cuda(
    graph: &Graph,
    rules: &RuleSet,
    options: &RunOptions,
    cuda: &CudaOptions,
) -> Result<CudaPrepared> {
    Device::get(cuda.device)?;
    let (program, partition, optimize_ms) = lower_graph(graph, rules, options)?;
    let start = Instant::now();
    let executable = CudaExecutable::new(program, cuda)?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    let compile = executable.module_stats();
    Ok(CudaPrepared {
        executable,
        partition,
        optimize_ms,
        compile_ms,
        compile,
    })
}

/// Runs before timing: the first run pays for loading (and, with CUDA graphs, capturing);
/// a few more let clocks and caches settle.
const CUDA_WARMUP_RUNS: usize = 3;

/// The median and the minimum of per-run times (milliseconds), timed on the device with
/// events between back-to-back runs: `iters` runs are queued without a host wait, an event
/// recorded after each, and each time is the gap between consecutive events. When queueing
/// is slower than the GPU, the gaps show the queueing: that is what a run costs.
fn time_device(
    device: &Device,
    iters: usize,
    mut run: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let iters = iters.max(1);
    let events = (0..=iters)
        .map(|_| device.event())
        .collect::<Result<Vec<_>>>()?;
    events[0].record(device)?;
    for event in &events[1..] {
        run()?;
        event.record(device)?;
    }
    device.synchronize()?;
    let mut times = events
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]))
        .collect::<Result<Vec<_>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// Runs `prepared` `iters` times on the GPU (after warm-up runs) on seeded random inputs
/// that stay on the device, and reports the median device time per run, with the bandwidth of
/// a device-to-device copy of the same bytes measured alongside.
pub fn bench_cuda(
    prepared: &mut CudaPrepared,
    graph: &Graph,
    options: &RunOptions,
    iters: usize,
    seed: u64,
) -> Result<BenchReport> {
    let exe = &mut prepared.executable;
    let device = exe.device().clone();
    let inputs = exe.upload_inputs(&program_inputs(exe.program(), graph, seed))?;
    let mut outputs = exe.output_buffers()?;
    for _ in 0..CUDA_WARMUP_RUNS {
        exe.run_device(&inputs, &mut outputs)?;
    }
    device.synchronize()?;
    let times = time_device(&device, iters, || exe.run_device(&inputs, &mut outputs))?;
    let median_ms = times[times.len() / 2];
    let bytes = prepared.partition.cost.bytes;
    // A copy moving `bytes`: half read, half written.
    let half = (bytes / 2).max(1) as usize;
    let (src, dst) = (
        crate::backend::cuda::runtime::DeviceBuffer::raw(&device, half)?,
        crate::backend::cuda::runtime::DeviceBuffer::raw(&device, half)?,
    );
    let copy = time_device(&device, iters, || device.copy_buffer(&dst, &src))?;
    let copy_ms = copy[copy.len() / 2];
    Ok(BenchReport {
        graph: graph.name.clone(),
        backend: "cuda",
        fusion: options.fusion,
        amp: options.amp.clone(),
        kernels: prepared.partition.kernels.len(),
        bytes,
        iters: times.len(),
        median_ms,
        min_ms: times[0],
        gbps: bytes as f64 / (median_ms * 1e6),
        threads: None,
        device: Some(device.info().to_string()),
        cuda_graph: Some(exe.options().cuda_graph),
        launches: Some(exe.launches_per_run()),
        copy_gbps: Some((2 * half) as f64 / (copy_ms * 1e6)),
        optimize_ms: prepared.optimize_ms,
        compile_ms: prepared.compile_ms,
        scratch_bytes: exe.memory_plan().total_bytes(),
        scratch_bytes_unshared: exe.memory_plan().unshared_bytes,
    })
}
