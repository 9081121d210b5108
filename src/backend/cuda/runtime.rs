//! Running a lowered [`Program`](crate::lower::Program) on an NVIDIA GPU: the CUDA twin of the
//! CPU runtime in [`crate::backend::cpu::runtime`].
//!
//! # Execution model
//!
//! A [`CudaExecutable`] is built once per program. The device-independent half is a
//! [`plan::DevicePlan`]: the program's steps as a flat list of device operations. Its kernels
//! (and the small conversion kernels matrix products need, see [`gemm`] and [`pack`]) are
//! emitted as one CUDA C module, compiled to PTX by NVRTC (cached on disk by the compiler) and
//! loaded into the device's context (cached in memory by source, across executables: two
//! programs with the same kernels share one loaded module). Intermediate buffers are planned
//! by liveness with the CPU executor's [`MemoryPlan`](crate::runtime::memory::MemoryPlan) and
//! taken from the device's [`pool`] once, at build time.
//!
//! A run is a sequence of asynchronous operations on **one stream per device**: kernel launches
//! (each [`abi::plan`](super::abi::plan) launch in order, with its parameter block), cuBLAS
//! calls, and device-to-device copies for aliased outputs. Nothing waits on the host between
//! them: CUDA runs the work of one stream in order, so a kernel sees everything earlier
//! kernels wrote without a synchronization, and a host wait would only leave the GPU idle
//! while the next launch is prepared. The host waits once, when outputs are read back
//! ([`Executable::run_tensors`](crate::backend::Executable::run_tensors), [`DeviceBuffer::download`]).
//!
//! One stream per device is also what makes the buffer pool safe without events: a buffer
//! given back to the pool on the host may still be in use by queued work, but whoever takes it
//! next can only use it through work queued later on the same stream, which runs after.
//!
//! A run can also go to a stream the caller owns (PyTorch's current stream,
//! [`CudaExecutable::run_on_stream`]). Two events keep the one-stream order then
//! ([`Device::on_caller_stream`]): the caller's stream waits for the device stream before the
//! run, and the device stream waits for the caller's after it, both on the GPU. Every run is
//! still ordered through the device stream, so the pool and the cuBLAS workspace need nothing
//! more, and the host never waits.
//!
//! With [`CudaOptions::cuda_graph`], the first run is captured into a CUDA graph (on a
//! private stream, so work other threads queue on the device stream cannot leak into it) and
//! later runs with the same input and output buffers replay it with one launch.
//!
//! # Without a GPU
//!
//! cudarc loads the CUDA libraries at run time and panics when one is missing, so nothing here
//! calls cudarc before [`probe`] has checked every library it needs; on a machine without
//! CUDA, [`Device::get`] returns an error naming what is missing.

pub mod conv;
mod device;
mod executable;
pub mod gemm;
pub mod lt;
mod modules;
pub mod pack;
pub mod plan;
pub mod pool;
pub mod probe;

pub use device::{Device, DeviceInfo, Event};
pub use executable::{CuStream, CudaExecutable, CudaOptions, ModuleStats};
pub use pool::DeviceBuffer;

use crate::error::{Error, Result};

/// A failed CUDA driver call, naming what was being done.
pub(crate) fn driver_error(what: &str, error: cudarc::driver::DriverError) -> Error {
    Error::backend(format!("CUDA driver: {what}: {error:?}"))
}

/// A failed cuBLAS call, naming what was being done.
pub(crate) fn cublas_error(what: &str, error: cudarc::cublas::result::CublasError) -> Error {
    Error::backend(format!("cuBLAS: {what}: {error:?}"))
}

/// Shorthand for results of the driver API.
pub(crate) trait DriverResult<T> {
    fn or_driver(self, what: &str) -> Result<T>;
}

impl<T> DriverResult<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn or_driver(self, what: &str) -> Result<T> {
        self.map_err(|e| driver_error(what, e))
    }
}
