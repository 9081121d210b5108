//! One GPU: its context, its one stream, its buffer pool, its cuBLAS handle and its cache of
//! loaded modules, shared by every executable of the process.
//!
//! Devices are opened once per ordinal and kept for the life of the process (in a static
//! table, never dropped), so kernels loaded and memory pooled for one executable serve the
//! next one too, and nothing is torn down while another thread may still use it.

use super::DriverResult;
use super::conv::Dnn;
use super::gemm::Blas;
use super::lt::Lt;
use super::modules::ModuleCache;
use super::pool::{DeviceBuffer, Pool, bucket};
use super::probe::Libraries;
use crate::backend::cache::lock;
use crate::backend::cuda::libs::NvrtcSetup;
use crate::backend::cuda::nvrtc::{CompileOptions, NvrtcCompiler, arch_for_capability};
use crate::error::{Error, Result};
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUresult};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// What the device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) for an H100/H200.
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors: grid sizes are chosen from this.
    pub sm_count: u32,
    pub total_memory: usize,
}

impl DeviceInfo {
    /// The NVRTC target for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        arch_for_capability(self.compute_capability.0, self.compute_capability.1)
    }
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {} SMs, {:.0} GiB)",
            self.name,
            self.arch(),
            self.sm_count,
            self.total_memory as f64 / f64::from(1u32 << 30)
        )
    }
}

/// An opened GPU. Get one with [`Device::get`].
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    nvrtc: NvrtcSetup,
    pool: Mutex<Pool>,
    blas: Mutex<Option<Blas>>,
    lt: Mutex<Option<Lt>>,
    dnn: Mutex<Option<Dnn>>,
    /// The two events that order work queued on a caller's stream with the device stream
    /// ([`Device::on_caller_stream`]); the lock keeps two such runs from interleaving their
    /// fences.
    fences: Mutex<Fences>,
    pub(super) modules: ModuleCache,
    pub(super) compiler: NvrtcCompiler,
}

fn open_error(ordinal: usize, what: &str, e: DriverError) -> crate::error::Error {
    let hint = match e.0 {
        CUresult::CUDA_ERROR_NO_DEVICE => {
            ": no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
        }
        _ => "",
    };
    Error::backend(format!(
        "cannot open CUDA device {ordinal}: {what}: {e:?}{hint}"
    ))
}

impl Device {
    /// The device with this ordinal, opened on first use. Fails with a message naming what is
    /// missing when the machine has no usable CUDA driver, NVRTC, or device.
    pub fn get(ordinal: usize) -> Result<Arc<Device>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
        let mut devices = lock(DEVICES.get_or_init(Default::default));
        if let Some(device) = devices.get(&ordinal) {
            return Ok(device.clone());
        }
        Libraries::probe().require(false)?;
        let nvrtc = crate::backend::cuda::libs::nvrtc_available()?;
        let device = Arc::new(Device::open(ordinal, nvrtc)?);
        devices.insert(ordinal, device.clone());
        Ok(device)
    }

    fn open(ordinal: usize, nvrtc: NvrtcSetup) -> Result<Device> {
        let count = CudaContext::device_count().map_err(|e| open_error(ordinal, "cuInit", e))?;
        if count <= 0 {
            return Err(Error::backend(
                "the CUDA driver reports no devices (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
            ));
        }
        if ordinal >= count as usize {
            return Err(Error::backend(format!(
                "CUDA device {ordinal} was asked for, but only {count} device(s) are visible"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| open_error(ordinal, "context", e))?;
        // A stream of our own rather than the legacy default stream: it can be captured into a
        // CUDA graph and does not synchronize with other libraries' default-stream work.
        let stream = ctx
            .new_stream()
            .map_err(|e| open_error(ordinal, "stream", e))?;
        let attribute = |a: CUdevice_attribute| {
            ctx.attribute(a)
                .map_err(|e| open_error(ordinal, "device attribute", e))
        };
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(|e| open_error(ordinal, "name", e))?,
            compute_capability: (
                attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sm_count: attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                .max(1) as u32,
            total_memory: ctx
                .total_mem()
                .map_err(|e| open_error(ordinal, "memory size", e))?,
        };
        let fences = Fences {
            device_done: fence_event(&ctx, ordinal)?,
            caller_done: fence_event(&ctx, ordinal)?,
        };
        Ok(Device {
            ctx,
            stream,
            info,
            nvrtc,
            pool: Mutex::new(Pool::default()),
            blas: Mutex::new(None),
            lt: Mutex::new(None),
            dnn: Mutex::new(None),
            fences: Mutex::new(fences),
            modules: ModuleCache::default(),
            compiler: NvrtcCompiler::new(CompileOptions::from_env()),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Where NVRTC and its headers were found.
    pub fn nvrtc(&self) -> &NvrtcSetup {
        &self.nvrtc
    }

    /// The architecture kernels are compiled for: the device's own when NVRTC knows it, else
    /// the newest older one NVRTC knows.
    pub fn target_arch(&self) -> Result<String> {
        if let Some(arch) = arch_override()? {
            return Ok(arch);
        }
        let (major, minor) = self.info.compute_capability;
        choose_arch((major * 10 + minor).max(0) as u32, &self.nvrtc.archs)
    }

    /// Makes the device's context current on the calling thread (every driver call needs it;
    /// threads start with none).
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().or_driver("binding the context")
    }

    pub(super) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's one stream, on which all its work is queued.
    pub(super) fn cu_stream(&self) -> cudarc::driver::sys::CUstream {
        self.stream.cu_stream()
    }

    /// Waits until everything queued on the device has finished, reporting any error a
    /// kernel raised on the way.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .or_driver("waiting for the device")
    }

    /// A block of at least `bytes` bytes from the pool, with its bucket. Empty requests get
    /// the null address. When the device is out of memory, idle blocks are freed and the
    /// allocation retried once.
    pub(super) fn alloc(&self, bytes: usize) -> Result<(u64, usize)> {
        let size = bucket(bytes);
        if size == 0 {
            return Ok((0, 0));
        }
        let mut pool = lock(&self.pool);
        if let Some(ptr) = pool.take(size) {
            return Ok((ptr, size));
        }
        self.bind()?;
        // SAFETY: a plain allocation in the bound context.
        let ptr = match unsafe { cudarc::driver::result::malloc_sync(size) } {
            Ok(ptr) => ptr,
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                for idle in pool.drain() {
                    // SAFETY: idle blocks are owned by the pool alone; cuMemFree waits for
                    // queued work that may still use them.
                    unsafe { cudarc::driver::result::free_sync(idle) }
                        .or_driver("freeing idle memory")?;
                }
                unsafe { cudarc::driver::result::malloc_sync(size) }.map_err(|e| {
                    Error::backend(format!(
                        "CUDA device {} is out of memory allocating {size} bytes ({} bytes in \
                         use by fusebox): {e:?}",
                        self.info.ordinal, pool.live_bytes
                    ))
                })?
            }
            Err(e) => return Err(super::driver_error("allocating device memory", e)),
        };
        pool.note_allocated(size);
        Ok((ptr, size))
    }

    /// Returns a block taken with [`Device::alloc`] to the pool.
    pub(super) fn release(&self, ptr: u64, bucket: usize) {
        if bucket > 0 {
            lock(&self.pool).give(bucket, ptr);
        }
    }

    /// Bytes handed out from the pool and not returned, and bytes idle in it.
    pub fn pool_bytes(&self) -> (usize, usize) {
        let pool = lock(&self.pool);
        (pool.live_bytes, pool.idle_bytes)
    }

    /// Runs `f` with the device's cuBLAS handle, creating it on first use (with a check that
    /// the library exists: cudarc would panic otherwise).
    pub(super) fn with_blas<T>(&self, f: impl FnOnce(&mut Blas) -> Result<T>) -> Result<T> {
        let mut blas = lock(&self.blas);
        if blas.is_none() {
            Libraries::probe().require(true)?;
            self.bind()?;
            *blas = Some(Blas::new(self)?);
        }
        match blas.as_mut() {
            Some(handle) => f(handle),
            None => Err(Error::backend("cuBLAS handle missing after creation")),
        }
    }

    /// Runs `f` with the device's cuBLASLt handle, creating it on first use. cuBLASLt ships
    /// with cuBLAS (which loads it); this checks both are there (cudarc would panic otherwise).
    pub(super) fn with_lt<T>(&self, f: impl FnOnce(&mut Lt) -> Result<T>) -> Result<T> {
        let mut lt = lock(&self.lt);
        if lt.is_none() {
            Libraries::probe().require(true)?;
            // SAFETY: the probe only tries to dlopen the library by cudarc's names.
            if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
                return Err(Error::backend("cuBLASLt (libcublasLt.so.12) was not found"));
            }
            self.bind()?;
            *lt = Some(Lt::new(self)?);
        }
        match lt.as_mut() {
            Some(handle) => f(handle),
            None => Err(Error::backend("cuBLASLt handle missing after creation")),
        }
    }

    /// Runs `f` with the device's cuDNN handle, creating it on first use. Callers check
    /// [`libs::cudnn_available`](crate::backend::cuda::libs::cudnn_available) first (cudarc
    /// would panic without the library); this checks again.
    pub(super) fn with_dnn<T>(&self, f: impl FnOnce(&mut Dnn) -> Result<T>) -> Result<T> {
        let mut dnn = lock(&self.dnn);
        if dnn.is_none() {
            if !crate::backend::cuda::libs::cudnn_available() {
                return Err(Error::backend(
                    "cuDNN (libcudnn.so.9) was not found: the plan's convolutions need it",
                ));
            }
            self.bind()?;
            *dnn = Some(Dnn::new()?);
        }
        match dnn.as_mut() {
            Some(handle) => f(handle),
            None => Err(Error::backend("cuDNN handle missing after creation")),
        }
    }

    /// A timing event on this device.
    pub fn event(&self) -> Result<Event> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map(Event)
            .or_driver("creating an event")
    }

    /// Queues a copy of `bytes` bytes between device addresses.
    pub(super) fn copy(&self, dst: u64, src: u64, bytes: usize, stream: CuStream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: callers pass blocks of at least `bytes` bytes that stay allocated until the
        // copy has run (they belong to executables or buffers that outlive the stream work).
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream) }
            .or_driver("copying on the device")
    }

    /// Queues a copy of `src` into `dst` (as many bytes as the smaller holds) on the device
    /// stream.
    pub fn copy_buffer(&self, dst: &DeviceBuffer, src: &DeviceBuffer) -> Result<()> {
        self.bind()?;
        let bytes = dst.byte_len().min(src.byte_len());
        self.copy(dst.device_ptr(), src.device_ptr(), bytes, self.cu_stream())
    }

    /// Queues a zero fill of `bytes` bytes at `dst`.
    pub(super) fn zero(&self, dst: u64, bytes: usize, stream: CuStream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: as for `copy`.
        unsafe { cudarc::driver::result::memset_d8_async(dst, 0, bytes, stream) }
            .or_driver("zeroing device memory")
    }

    /// Queues work on `stream`, a stream another library owns (PyTorch's current stream), as
    /// if it were queued on the device stream: `stream` first waits for everything queued on
    /// the device stream so far, and the device stream then waits for what `queue` put on
    /// `stream`. Both waits happen on the GPU; the host never waits. The buffer pool's reuse
    /// rule (one stream orders every use of a block, see [`super::pool`]) and the one cuBLAS
    /// workspace keep holding, since every run of fusebox's is still ordered through the
    /// device stream; work the caller queues on `stream` before and after is ordered with
    /// fusebox's by `stream` itself, with no synchronization added.
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream of this device's context (or null, the legacy default
    /// stream) for as long as work queued on it may run.
    pub(super) unsafe fn on_caller_stream<T>(
        &self,
        stream: CuStream,
        queue: impl FnOnce(CuStream) -> Result<T>,
    ) -> Result<T> {
        self.bind()?;
        let f = lock(&self.fences);
        use cudarc::driver::result::{event, stream as streams};
        use cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: live events of this context; the caller vouches for `stream`.
        unsafe {
            event::record(f.device_done.cu_event(), self.cu_stream())
                .or_driver("recording the device stream's fence")?;
            streams::wait_event(stream, f.device_done.cu_event(), CU_EVENT_WAIT_DEFAULT)
                .or_driver("ordering the caller's stream after the device stream")?;
        }
        let queued = queue(stream);
        // The device stream waits even when queueing failed midway: what was queued still
        // uses the executable's buffers.
        // SAFETY: as above.
        unsafe {
            event::record(f.caller_done.cu_event(), stream)
                .or_driver("recording the caller's stream's fence")?;
            streams::wait_event(
                self.cu_stream(),
                f.caller_done.cu_event(),
                CU_EVENT_WAIT_DEFAULT,
            )
            .or_driver("ordering the device stream after the caller's stream")?;
        }
        queued
    }

    /// A fresh stream for capturing CUDA graphs.
    pub(super) fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().or_driver("creating a stream")
    }
}

/// The NVRTC target for a device of compute capability `cc` (`90` for 9.0): the device's own
/// architecture when NVRTC knows it, else the newest one NVRTC knows below it (the driver
/// compiles PTX of an older virtual architecture for a newer GPU when it loads it).
/// `FUSEBOX_CUDA_ARCH` (`sm_80`, `sm_90`, …) overrides the architecture the device reports:
/// to compile for an older target than the device (PTX runs on newer GPUs), or to compare
/// code generated for two targets on one machine. Anything but `sm_` and digits is an error.
pub fn arch_override() -> Result<Option<String>> {
    let Ok(arch) = std::env::var("FUSEBOX_CUDA_ARCH") else {
        return Ok(None);
    };
    let digits = arch.strip_prefix("sm_").unwrap_or("");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::backend(format!(
            "FUSEBOX_CUDA_ARCH must look like `sm_90`, not `{arch}`"
        )));
    }
    Ok(Some(arch))
}

pub fn choose_arch(cc: u32, nvrtc_archs: &[u32]) -> Result<String> {
    if nvrtc_archs.is_empty() || nvrtc_archs.contains(&cc) {
        return Ok(format!("sm_{cc}"));
    }
    match nvrtc_archs.iter().copied().filter(|&a| a <= cc).max() {
        Some(a) => Ok(format!("sm_{a}")),
        None => Err(Error::backend(format!(
            "this NVRTC cannot compile for the device (sm_{cc}) or any older architecture; it \
             targets sm_{}",
            nvrtc_archs
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", sm_")
        ))),
    }
}

/// A raw stream handle: operations take the stream they go to, which is the device stream
/// except while a CUDA graph is being captured.
pub type CuStream = cudarc::driver::sys::CUstream;

/// An event of `ctx` that orders streams (it times nothing).
fn fence_event(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<CudaEvent> {
    ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(|e| open_error(ordinal, "fence event", e))
}

/// The events [`Device::on_caller_stream`] records and waits on.
struct Fences {
    device_done: CudaEvent,
    caller_done: CudaEvent,
}

/// A point in the device stream's work, for timing.
pub struct Event(CudaEvent);

impl Event {
    /// Marks the current end of the device's stream.
    pub fn record(&self, device: &Device) -> Result<()> {
        device.bind()?;
        // SAFETY: both handles are live; recording only enqueues a marker.
        unsafe { cudarc::driver::result::event::record(self.0.cu_event(), device.cu_stream()) }
            .or_driver("recording an event")
    }

    /// Milliseconds of device time from `self` to `end` (waits for both).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f64> {
        self.0
            .elapsed_ms(&end.0)
            .map(f64::from)
            .or_driver("reading event times")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arch_comes_from_the_compute_capability() {
        let info = DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            total_memory: 150_000_000_000,
        };
        assert_eq!(info.arch(), "sm_90");
        assert_eq!(info.to_string(), "NVIDIA H200 (sm_90, 132 SMs, 140 GiB)");
        let ampere = DeviceInfo {
            compute_capability: (8, 6),
            ..info
        };
        assert_eq!(ampere.arch(), "sm_86");
    }

    #[test]
    fn the_target_is_the_device_or_the_newest_older_arch_nvrtc_knows() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(choose_arch(90, &archs).unwrap(), "sm_90");
        assert_eq!(choose_arch(87, &archs).unwrap(), "sm_86");
        assert_eq!(choose_arch(130, &archs).unwrap(), "sm_120");
        assert_eq!(choose_arch(90, &[]).unwrap(), "sm_90");
        let message = choose_arch(70, &archs).unwrap_err().to_string();
        assert!(message.contains("sm_75, sm_80"), "{message}");
    }

    /// On a machine without the driver, asking for a device is an error naming the driver,
    /// not a panic inside cudarc.
    #[test]
    fn without_a_driver_get_is_a_clean_error() {
        if crate::backend::cuda::libs::driver_available() {
            return;
        }
        let message = match Device::get(0) {
            Ok(_) => panic!("a device opened without a driver"),
            Err(e) => e.to_string(),
        };
        assert!(message.contains("libcuda.so.1 was not found"), "{message}");
    }
}
