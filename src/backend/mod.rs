//! Backends: turning kernel IR into code that runs, and running it.
//!
//! Each backend owns its whole path from a lowered [`Program`] to results: [`cpu`] emits C,
//! compiles it with the system C compiler and runs it on host threads; [`cuda`] emits CUDA C,
//! compiles it with NVRTC and runs it on one GPU stream. Both keep what they compile in
//! [`cache`], a content-addressed store on disk, spell kernel IR values in C through one trait
//! (`spelling`, so the two emitters cannot drift apart), and use the backend-neutral host
//! runtime ([`crate::runtime`]) for buffers, memory planning and the reference matmul.
//!
//! Everything above the backends ([`crate::runner`], the CLI) is written once against two
//! traits: a [`Target`] is what a program is compiled *for* (the CPU's C compiler, a GPU with
//! its options) and builds an [`Executable`], which runs and times the program.

pub mod cache;
pub mod cpu;
pub mod cuda;
pub(crate) mod spelling;

use crate::error::Result;
use crate::eval::Tensors;
use crate::lower::Program;
use crate::runtime::buffer::Buffer;
use crate::runtime::memory::MemoryPlan;
use serde::Serialize;

/// Where programs are compiled for: builds an [`Executable`] from a lowered program.
pub trait Target {
    type Executable: Executable;

    /// The `cost.ron` profile programs for this target are optimized with by default.
    const PROFILE: &'static str;

    /// Checks the target can run anything at all (a GPU backend opens its device), so a
    /// machine without one fails before time is spent optimizing.
    fn open(&self) -> Result<()> {
        Ok(())
    }

    /// Compiles (or finds in a cache) and loads `program`'s kernels.
    fn build(&self, program: Program) -> Result<Self::Executable>;
}

/// A program compiled and loaded by one backend, ready to run.
pub trait Executable {
    /// What building it cost in compilation (a backend's compile and cache counters).
    type CompileStats: Copy + std::fmt::Debug + Into<cache::CompileStats>;

    /// The backend's name as the CLI spells it (`cpu`, `cuda`).
    const BACKEND: &'static str;

    fn program(&self) -> &Program;

    /// Which intermediates share memory.
    fn memory_plan(&self) -> &MemoryPlan;

    /// The source text that was compiled.
    fn source(&self) -> &str;

    fn compile_stats(&self) -> Self::CompileStats;

    /// Where it runs, for people: `cpu`, or the GPU's name.
    fn describe(&self) -> String;

    /// Runs once: `inputs` in `dag.inputs` order, results into host `outputs` (of the outputs'
    /// dtypes and shapes, in `dag.outputs` order), and returns when they are there.
    fn run_into(&mut self, inputs: &[Buffer], outputs: &mut [Buffer]) -> Result<()>;

    /// Milliseconds per run over `iters` runs (after warm-up), sorted ascending, timed the
    /// way the backend's work is best timed (wall clock on the host, events on a GPU).
    fn time_runs(&mut self, inputs: &[Buffer], iters: usize) -> Result<Vec<f64>>;

    /// What a benchmark report says about the machine, beside the times; `bytes` is what one
    /// run moves, for backends that compare against a copy of the same size.
    fn bench_facts(&self, bytes: u64, iters: usize) -> Result<BenchFacts>;

    /// Fresh host buffers for the outputs, in `dag.outputs` order; an error naming the size
    /// when one cannot be allocated.
    fn output_buffers_host(&self) -> Result<Vec<Buffer>> {
        let dag = &self.program().dag;
        dag.outputs
            .iter()
            .map(|o| {
                let ty = dag.ty(o.value);
                Buffer::try_zeroed(ty.dtype, &ty.shape).map_err(|e| {
                    crate::error::Error::new(
                        crate::error::Site::node(&o.name),
                        crate::error::ErrorKind::Lower(e.to_string()),
                    )
                })
            })
            .collect()
    }

    /// Runs on tensors keyed by input name; returns tensors keyed by output name.
    fn run_tensors(&mut self, inputs: &Tensors) -> Result<Tensors> {
        let buffers = crate::runtime::input_buffers(self.program(), inputs)?;
        let mut outputs = self.output_buffers_host()?;
        self.run_into(&buffers, &mut outputs)?;
        Ok(self
            .program()
            .dag
            .outputs
            .iter()
            .zip(&outputs)
            .map(|(o, b)| (o.name.clone(), b.to_tensor()))
            .collect())
    }
}

/// Facts about the machine a benchmark ran on; each backend fills in what applies to it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchFacts {
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
    /// Of those, the convolutions cuDNN runs (cuda backend; the others' products are GEMMs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cudnn_convolutions: Option<usize>,
    /// Of the cuBLAS calls, the GEMMs that run their epilogue through cuBLASLt (cuda backend,
    /// with `--lt-epilogues`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lt_epilogues: Option<usize>,
    /// GB/s of a device-to-device copy moving the same bytes, timed the same way in the same
    /// process: what `gbps` would be at copy speed (cuda backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_gbps: Option<f64>,
}
