//! A program loaded on the GPU, and the loop that queues one run of it.
//!
//! Building an executable turns the program's steps into a flat list of device operations
//! (kernel launches with their launch plans, cuBLAS calls with the conversions around them,
//! zero fills, copies), loads the module holding every kernel, and takes every buffer a run
//! needs from the pool: intermediates by liveness, reduction scratch, matmul temporaries. A
//! run then only queues that list on a stream: no allocation, no compilation, no host wait,
//! which is also what lets a run be captured into a CUDA graph.

use super::DriverResult;
use super::conv::ConvCall;
pub use super::device::CuStream;
use super::device::Device;
use super::lt::{LtCall, LtPointers};
use super::plan::{Buf, DevicePlan, Libraries, Op};
use super::pool::DeviceBuffer;
use crate::backend::cuda::abi;
use crate::backend::cuda::emit::EmitOptions;
use crate::backend::cuda::nvrtc::CompileStats;
use crate::backend::{BenchFacts, Executable, Target};
use crate::dag::Value;
use crate::error::{Error, Result};
use crate::lower::Program;
use crate::runtime::buffer::Buffer;
use crate::runtime::memory::MemoryPlan;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaGraph, CudaStream};
use std::ffi::c_void;
use std::sync::Arc;

/// How to run a program on the GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaOptions {
    /// The device ordinal.
    pub device: usize,
    /// Capture a run into a CUDA graph and replay it while the input and output buffers stay
    /// the same (one launch per run instead of one per kernel).
    pub cuda_graph: bool,
    /// Reductions without float atomics, so results are bitwise reproducible run to run.
    pub deterministic: bool,
    /// Convolutions as im2col GEMMs through cuBLAS even where cuDNN is found (which runs
    /// them otherwise, see [`super::conv`]): the path of machines without cuDNN.
    pub gemm_convolutions: bool,
    /// Products whose epilogue (bias, residual, scale, ReLU or tanh GELU) cuBLASLt can run
    /// run it in the GEMM ([`super::lt`]) instead of a kernel after it. Off by default until
    /// checked on a GPU.
    pub lt_epilogues: bool,
}

/// What building an executable cost in compilation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModuleStats {
    /// What NVRTC did (compiled, or found the PTX in its memory or disk cache). All zero when
    /// the module was already loaded.
    pub nvrtc: CompileStats,
    /// Whether the module was already loaded in the device's context.
    pub loaded_already: bool,
}

impl From<ModuleStats> for crate::backend::cache::CompileStats {
    /// NVRTC's counters: what compiling the module's source cost (loading it is not a build).
    fn from(stats: ModuleStats) -> Self {
        stats.nvrtc
    }
}

/// A run captured as a CUDA graph, valid for the input and output addresses it was captured
/// with.
struct Captured {
    io: Vec<u64>,
    graph: CudaGraph,
    _stream: Arc<CudaStream>,
}

// SAFETY: CUDA graph objects may be used from any thread with the context bound (every entry
// point binds it), as long as no two threads use one at the same time; `Captured` is only
// reached through `&mut CudaExecutable`, so moving it between threads is all that happens.
unsafe impl Send for Captured {}

/// A kernel operation's functions, looked up once: per launch, one per entry point it may
/// take ([`abi::GpuLaunch::entries`]; `None` where a row kernel's text has no such path), and
/// which word of its parameter block names the one to take ([`abi::GpuLaunch::pick`]).
struct KernelFunctions {
    vec_word: usize,
    launches: Vec<Vec<Option<CudaFunction>>>,
}

/// A program ready to run on a GPU.
pub struct CudaExecutable {
    program: Program,
    device: Arc<Device>,
    options: CudaOptions,
    plan: DevicePlan,
    /// Per operation of `plan.ops`: a kernel's functions (`None` for other operations).
    functions: Vec<Option<KernelFunctions>>,
    /// Per operation of `plan.ops`: a convolution's cuDNN descriptors or a GEMM's cuBLASLt
    /// ones (`None` for others).
    prepared: Vec<Option<Prepared>>,
    /// The cuDNN workspace: the most any convolution's algorithm needs.
    workspace: Option<DeviceBuffer>,
    memory: MemoryPlan,
    slots: Vec<DeviceBuffer>,
    scratch: Vec<DeviceBuffer>,
    temps: Vec<DeviceBuffer>,
    stats: ModuleStats,
    captured: Option<Captured>,
    /// Whether a run was queued outside a capture (see [`CudaExecutable::queue_run`]).
    warmed: bool,
}

impl CudaExecutable {
    /// Compiles (or finds) and loads `program`'s kernels on the device `options` names and
    /// takes the buffers a run needs. Fails cleanly, naming what is missing, on a machine
    /// without CUDA.
    pub fn new(program: Program, options: &CudaOptions) -> Result<CudaExecutable> {
        let device = Device::get(options.device)?;
        device.bind()?;
        let emit_options = EmitOptions {
            deterministic: options.deterministic,
        };
        let sm_count = device.info().sm_count;
        // cuDNN and cuBLASLt are looked for (and loaded) only by a plan that calls them, and
        // their descriptors and algorithms are chosen now (creation allocates, which a graph
        // capture forbids). Where one is missing, or offers no algorithm fusebox may use for
        // one of its calls, the program is planned again without it.
        let mut libraries = Libraries {
            cudnn: !options.gemm_convolutions,
            lt_epilogues: options.lt_epilogues,
        };
        let (plan, prepared) = loop {
            let plan = DevicePlan::new(&program, &emit_options, sm_count, libraries)?;
            match prepare_library_calls(&device, &plan) {
                Ok(prepared) => break (plan, prepared),
                Err(Refused::Cudnn) if libraries.cudnn => libraries.cudnn = false,
                Err(Refused::Lt) if libraries.lt_epilogues => libraries.lt_epilogues = false,
                Err(_) => return Err(Error::backend("a library call planned without its library")),
            }
        };
        // Device-wide counters: another thread building at the same time shows up here too.
        let nvrtc_before = device.compiler.stats();
        let hits_before = device.modules.counts().1;
        let module = device.module(&plan.source)?;
        let stats = ModuleStats {
            nvrtc: device.compiler.stats().since(&nvrtc_before),
            loaded_already: device.modules.counts().1 > hits_before,
        };
        let functions = plan
            .ops
            .iter()
            .map(|op| match op {
                Op::Kernel(call) => {
                    let launches = call
                        .plan
                        .launches
                        .iter()
                        .map(|l| {
                            l.entries()
                                .iter()
                                .map(|e| (!e.is_empty()).then(|| module.function(e)).transpose())
                                .collect::<Result<Vec<_>>>()
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let vec_word = abi::param_layout(&plan.kernels[call.kernel]).vec / 8;
                    Ok(Some(KernelFunctions { vec_word, launches }))
                }
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        if plan.uses_blas() {
            // Created now, not during a run: creation allocates, which a graph capture forbids.
            device.with_blas(|_| Ok(()))?;
        }
        let workspace_bytes = prepared
            .iter()
            .filter_map(|p| match p {
                Some(Prepared::Conv(c)) => Some(c.workspace),
                _ => None,
            })
            .max();
        let workspace = match workspace_bytes {
            Some(bytes) if bytes > 0 => Some(DeviceBuffer::raw(&device, bytes)?),
            _ => None,
        };
        let raw = |bytes: &usize| DeviceBuffer::raw(&device, *bytes);
        let memory = MemoryPlan::without(&program, &plan.unwritten);
        let slots = memory.slot_bytes.iter().map(raw).collect::<Result<_>>()?;
        let scratch = plan.scratch_bytes.iter().map(raw).collect::<Result<_>>()?;
        let temps = plan.temp_bytes.iter().map(raw).collect::<Result<_>>()?;
        Ok(CudaExecutable {
            program,
            device,
            options: options.clone(),
            plan,
            functions,
            prepared,
            workspace,
            memory,
            slots,
            scratch,
            temps,
            stats,
            captured: None,
            warmed: false,
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// The operations a run queues.
    pub fn plan(&self) -> &DevicePlan {
        &self.plan
    }

    /// Kernel launches, cuBLAS calls, fills and copies queued per run.
    pub fn launches_per_run(&self) -> usize {
        self.plan.launches()
    }

    /// Device buffers for the outputs (contents unspecified), in `dag.outputs` order.
    pub fn output_buffers(&self) -> Result<Vec<DeviceBuffer>> {
        let dag = &self.program.dag;
        dag.outputs
            .iter()
            .map(|o| {
                let ty = dag.ty(o.value);
                DeviceBuffer::uninit(&self.device, ty.dtype, &ty.shape)
            })
            .collect()
    }

    /// Copies host inputs (in `dag.inputs` order) to the device.
    pub fn upload_inputs(&self, inputs: &[Buffer]) -> Result<Vec<DeviceBuffer>> {
        self.program
            .check_inputs(inputs.iter().map(|b| (b.dtype, b.shape.as_slice())))?;
        inputs
            .iter()
            .map(|b| DeviceBuffer::upload(&self.device, b))
            .collect()
    }

    /// Queues one run: `inputs` in `dag.inputs` order, results into `outputs` (from
    /// [`CudaExecutable::output_buffers`]). Returns without waiting: the results are there
    /// for work queued later on the device (and for [`DeviceBuffer::download`]).
    pub fn run_device(
        &mut self,
        inputs: &[DeviceBuffer],
        outputs: &mut [DeviceBuffer],
    ) -> Result<()> {
        self.check_device_buffers(inputs, outputs)?;
        self.device.bind()?;
        let ins: Vec<u64> = inputs.iter().map(DeviceBuffer::device_ptr).collect();
        let outs: Vec<u64> = outputs.iter().map(DeviceBuffer::device_ptr).collect();
        self.queue_run(self.device.cu_stream(), &ins, &outs)
    }

    /// Queues one run on `stream`, a stream of the caller's (PyTorch's current stream), reading
    /// the inputs at `ins` (in `dag.inputs` order) and writing the results at `outs` (in
    /// `dag.outputs` order), memory the caller owns. Returns without waiting; the results are
    /// there for work the caller queues on `stream` later. The run is ordered with everything
    /// fusebox queues on the device ([`Device::on_caller_stream`]).
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of this device's (primary) context; each address holds a
    /// contiguous array of its value's dtype and shape on this device, valid until the queued
    /// work has run; no output overlaps another array.
    pub unsafe fn run_on_stream(
        &mut self,
        stream: CuStream,
        ins: &[u64],
        outs: &[u64],
    ) -> Result<()> {
        self.check_counts(ins.len(), outs.len())?;
        let device = self.device.clone();
        // SAFETY: the caller vouches for `stream`.
        unsafe { device.on_caller_stream(stream, |s| self.queue_run(s, ins, outs)) }
    }

    /// Queues one run on `stream`: the captured CUDA graph when the options ask for one (captured
    /// anew when the input and output addresses changed), else every operation in order.
    fn queue_run(&mut self, stream: CuStream, ins: &[u64], outs: &[u64]) -> Result<()> {
        if !self.options.cuda_graph {
            return self.enqueue(stream, ins, outs);
        }
        let io: Vec<u64> = ins.iter().chain(outs).copied().collect();
        if self.captured.as_ref().is_none_or(|c| c.io != io) {
            self.captured = None;
            // cuDNN (and cuBLASLt) may set themselves up on a call's first run (loading
            // kernels), which a capture forbids: such a plan runs once plainly before its
            // first capture.
            if !self.warmed && self.prepared.iter().any(Option::is_some) {
                self.enqueue(stream, ins, outs)?;
                self.warmed = true;
            }
            self.captured = self.capture(ins, outs, io)?;
        }
        match &self.captured {
            // SAFETY: the graph's kernels read and write the executable's own buffers and the
            // io buffers it was captured with, which `io` proved are the ones given now.
            Some(c) => {
                unsafe { cudarc::driver::result::graph::launch(c.graph.cu_graph_exec(), stream) }
                    .or_driver("launching the CUDA graph")
            }
            None => self.enqueue(stream, ins, outs),
        }
    }

    /// Records one run into a CUDA graph. The capture uses a stream of its own, so nothing
    /// another thread queues on the device stream meanwhile can end up in the graph; the
    /// graph is then launched on the device stream, in order with everything else.
    fn capture(&self, ins: &[u64], outs: &[u64], io: Vec<u64>) -> Result<Option<Captured>> {
        let stream = self.device.new_stream()?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .or_driver("starting a CUDA graph capture")?;
        let queued = self.enqueue(stream.cu_stream(), ins, outs);
        // The capture must end even when queueing failed, or the stream stays capturing.
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        queued?;
        let graph = ended.or_driver("instantiating the CUDA graph")?;
        Ok(graph.map(|graph| Captured {
            io,
            graph,
            _stream: stream,
        }))
    }

    /// An error unless a run is given as many inputs and outputs as the graph has.
    fn check_counts(&self, inputs: usize, outputs: usize) -> Result<()> {
        let dag = &self.program.dag;
        if inputs != dag.inputs.len() || outputs != dag.outputs.len() {
            return Err(Error::backend(format!(
                "{inputs} inputs and {outputs} outputs given, the graph has {} and {}",
                dag.inputs.len(),
                dag.outputs.len()
            )));
        }
        Ok(())
    }

    fn check_device_buffers(
        &self,
        inputs: &[DeviceBuffer],
        outputs: &[DeviceBuffer],
    ) -> Result<()> {
        self.check_counts(inputs.len(), outputs.len())?;
        let dag = &self.program.dag;
        let ordinal = self.device.info().ordinal;
        self.program
            .check_inputs(inputs.iter().map(|b| (b.dtype, b.shape.as_slice())))?;
        for (buf, output) in outputs.iter().zip(&dag.outputs) {
            let ty = dag.ty(output.value);
            if buf.dtype != ty.dtype || buf.shape != ty.shape {
                return Err(Error::backend(format!(
                    "output buffer for `{}` must be {} {:?}",
                    output.name, ty.dtype, ty.shape
                )));
            }
        }
        if let Some(b) = inputs
            .iter()
            .chain(outputs)
            .find(|b| b.device().info().ordinal != ordinal)
        {
            return Err(Error::backend(format!(
                "a buffer on device {} was given to a program on device {ordinal}",
                b.device().info().ordinal
            )));
        }
        Ok(())
    }

    /// The device address of `b` in a run with these input and output addresses.
    fn address(&self, b: Buf, ins: &[u64], outs: &[u64]) -> u64 {
        match b {
            Buf::Temp(i) => self.temps[i].device_ptr(),
            Buf::Output(k) => outs[k],
            Buf::Value(Value::Input(i)) => ins[i],
            Buf::Value(Value::Node(n)) => match (self.plan.output_of[n], self.memory.slot_of[n]) {
                (Some(k), _) => outs[k],
                (None, Some(s)) => self.slots[s].device_ptr(),
                // Nothing reads a value no step writes (literals are inlined into kernels).
                (None, None) => 0,
            },
        }
    }

    /// Queues every operation of one run on `stream`, in order, without waiting.
    fn enqueue(&self, stream: CuStream, ins: &[u64], outs: &[u64]) -> Result<()> {
        let scratch: Vec<u64> = self.scratch.iter().map(DeviceBuffer::device_ptr).collect();
        let ops = self.plan.ops.iter().zip(&self.functions);
        for ((op, functions), prepared) in ops.zip(&self.prepared) {
            match op {
                Op::Kernel(call) => {
                    let Some(functions) = functions.as_ref().filter(|f| !f.launches.is_empty())
                    else {
                        continue;
                    };
                    let ptrs: Vec<u64> = call
                        .args
                        .iter()
                        .map(|&b| self.address(b, ins, outs))
                        .collect();
                    let ir = &self.plan.kernels[call.kernel];
                    let used = &scratch[..call.plan.scratch_bytes.len()];
                    let mut words = abi::param_words(ir, &call.launch, &ptrs, used);
                    for (entries, l) in functions.launches.iter().zip(&call.plan.launches) {
                        let pick = l.pick(&words, functions.vec_word);
                        let entry = &l.entries()[pick];
                        let Some(function) = &entries[pick] else {
                            return Err(Error::backend(format!(
                                "no function loaded for entry point `{entry}`"
                            )));
                        };
                        let mut params = [words.as_mut_ptr() as *mut c_void];
                        // SAFETY: the function belongs to a module the device keeps loaded; its
                        // one parameter is the block `abi::param_words` laid out for it, which
                        // the driver copies before returning; the plan checked every view lies
                        // inside its buffer, and every buffer outlives the queued work (see the
                        // pool's reuse rule).
                        unsafe {
                            cudarc::driver::result::launch_kernel(
                                function.cu_function(),
                                l.grid,
                                l.block,
                                l.shared_bytes,
                                stream,
                                &mut params,
                            )
                        }
                        .map_err(|e| super::driver_error(&format!("launching `{entry}`"), e))?;
                    }
                }
                Op::Gemm {
                    epilogue: Some(epilogue),
                    a,
                    b,
                    c,
                    ..
                } => {
                    let Some(Prepared::Lt(call)) = prepared else {
                        return Err(Error::backend(
                            "an epilogue without its cuBLASLt descriptors",
                        ));
                    };
                    let at = LtPointers {
                        a: self.address(*a, ins, outs),
                        b: self.address(*b, ins, outs),
                        bias: epilogue.bias.map(|(buf, _)| self.address(buf, ins, outs)),
                        residual: epilogue.residual.map(|buf| self.address(buf, ins, outs)),
                        out: self.address(*c, ins, outs),
                    };
                    self.device.with_lt(|lt| lt.matmul(stream, call, at))?;
                }
                Op::Gemm {
                    types,
                    shape,
                    a,
                    b,
                    c,
                    epilogue: None,
                } => {
                    let ptrs = (
                        self.address(*a, ins, outs),
                        self.address(*b, ins, outs),
                        self.address(*c, ins, outs),
                    );
                    self.device
                        .with_blas(|blas| blas.gemm(stream, types, shape, ptrs))?;
                }
                Op::Conv { x, w, y, .. } => {
                    let Some(Prepared::Conv(call)) = prepared else {
                        return Err(Error::backend(
                            "a convolution without its cuDNN descriptors",
                        ));
                    };
                    let ptrs = (
                        self.address(*x, ins, outs),
                        self.address(*w, ins, outs),
                        self.address(*y, ins, outs),
                    );
                    let workspace = self.workspace.as_ref().map_or(0, DeviceBuffer::device_ptr);
                    self.device
                        .with_dnn(|dnn| dnn.forward(stream, call, ptrs, workspace))?;
                }
                Op::Zero { dst, bytes } => {
                    self.device
                        .zero(self.address(*dst, ins, outs), *bytes, stream)?;
                }
                Op::Copy { dst, src, bytes } => {
                    self.device.copy(
                        self.address(*dst, ins, outs),
                        self.address(*src, ins, outs),
                        *bytes,
                        stream,
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// What a library needs prepared for one operation: a convolution's cuDNN descriptors and
/// algorithm, or a GEMM's cuBLASLt ones.
enum Prepared {
    Conv(ConvCall),
    Lt(LtCall),
}

/// The library that could not run a call of the plan.
#[derive(Debug)]
enum Refused {
    Cudnn,
    Lt,
}

/// Per operation of `plan`, what its library needs prepared (`None` for operations that call
/// no library but cuBLAS).
fn prepare_library_calls(
    device: &Device,
    plan: &DevicePlan,
) -> std::result::Result<Vec<Option<Prepared>>, Refused> {
    if plan.convolutions().next().is_some() && !crate::backend::cuda::libs::cudnn_available() {
        return Err(Refused::Cudnn);
    }
    plan.ops
        .iter()
        .map(|op| match op {
            Op::Conv {
                geometry, dtype, ..
            } => device
                .with_dnn(|dnn| dnn.prepare(geometry, *dtype))
                .map(|c| Some(Prepared::Conv(c)))
                .map_err(|_| Refused::Cudnn),
            Op::Gemm {
                types,
                shape,
                epilogue: Some(epilogue),
                ..
            } => device
                .with_lt(|lt| lt.prepare(types, shape, epilogue))
                .map(|c| Some(Prepared::Lt(c)))
                .map_err(|_| Refused::Lt),
            _ => Ok(None),
        })
        .collect()
}

/// Runs before timing: the first run pays for loading (and, with CUDA graphs, capturing);
/// a few more let clocks and caches settle.
const WARMUP_RUNS: usize = 3;

/// Per-run times (milliseconds, sorted), timed on the device with events between back-to-back
/// runs: `iters` runs are queued without a host wait, an event recorded after each, and each
/// time is the gap between consecutive events. When queueing is slower than the GPU, the gaps
/// show the queueing: that is what a run costs.
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

impl Target for CudaOptions {
    type Executable = CudaExecutable;
    const PROFILE: &'static str = "h200";

    fn open(&self) -> Result<()> {
        Device::get(self.device).map(|_| ())
    }

    fn build(&self, program: Program) -> Result<CudaExecutable> {
        CudaExecutable::new(program, self)
    }
}

impl Executable for CudaExecutable {
    const BACKEND: &'static str = "cuda";
    type CompileStats = ModuleStats;

    fn program(&self) -> &Program {
        &self.program
    }

    fn memory_plan(&self) -> &MemoryPlan {
        &self.memory
    }

    /// The CUDA C that was compiled (the program's kernels and the conversion kernels).
    fn source(&self) -> &str {
        &self.plan.source
    }

    fn compile_stats(&self) -> ModuleStats {
        self.stats
    }

    fn describe(&self) -> String {
        format!("cuda ({})", self.device.info())
    }

    /// Runs on host buffers: uploads the inputs, runs, downloads into `outputs` (host buffers
    /// of the outputs' dtypes and shapes, in `dag.outputs` order), and waits once, at the end.
    fn run_into(&mut self, inputs: &[Buffer], outputs: &mut [Buffer]) -> Result<()> {
        let device_inputs = self.upload_inputs(inputs)?;
        let mut device_outputs = self.output_buffers()?;
        self.run_device(&device_inputs, &mut device_outputs)?;
        if outputs.len() != device_outputs.len() {
            return Err(Error::backend(format!(
                "{} output buffers given, the graph has {} outputs",
                outputs.len(),
                device_outputs.len()
            )));
        }
        for (d, h) in device_outputs.iter().zip(outputs.iter_mut()) {
            d.download_into(h)?;
        }
        self.device.synchronize()
    }

    /// Device time per run, inputs and outputs staying on the device, after warm-up runs.
    fn time_runs(&mut self, inputs: &[Buffer], iters: usize) -> Result<Vec<f64>> {
        let device = self.device.clone();
        let inputs = self.upload_inputs(inputs)?;
        let mut outputs = self.output_buffers()?;
        for _ in 0..WARMUP_RUNS {
            self.run_device(&inputs, &mut outputs)?;
        }
        device.synchronize()?;
        time_device(&device, iters, || self.run_device(&inputs, &mut outputs))
    }

    /// The device, whether runs replay a CUDA graph, operations per run, and the bandwidth of
    /// a device-to-device copy moving `bytes` (half read, half written), timed alike.
    fn bench_facts(&self, bytes: u64, iters: usize) -> Result<BenchFacts> {
        let device = &self.device;
        let half = (bytes / 2).max(1) as usize;
        let (src, dst) = (
            DeviceBuffer::raw(device, half)?,
            DeviceBuffer::raw(device, half)?,
        );
        let copy = time_device(device, iters, || device.copy_buffer(&dst, &src))?;
        let copy_ms = copy[copy.len() / 2];
        Ok(BenchFacts {
            device: Some(device.info().to_string()),
            cuda_graph: Some(self.options.cuda_graph),
            launches: Some(self.launches_per_run()),
            cudnn_convolutions: Some(self.plan.convolutions().count()),
            lt_epilogues: Some(self.plan.lt_epilogues()),
            copy_gbps: Some((2 * half) as f64 / (copy_ms * 1e6)),
            ..BenchFacts::default()
        })
    }
}
