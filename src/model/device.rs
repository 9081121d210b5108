//! Runs on GPU memory the caller owns, on the caller's stream: another runtime's CUDA tensors
//! (PyTorch's) read and written in place, the run queued on that runtime's current stream, so
//! a binding adds neither a copy nor a host wait.

use super::host::{cache_stored, in_input_order};
use super::{Compiled, Engine};
use crate::backend::Executable;
use crate::backend::cuda::runtime::{CuStream, DeviceBuffer};
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// A contiguous array of `dtype` and `shape` at device address `address`, in GPU memory the
/// caller owns (f16 and bf16 as their 16-bit patterns, bool as one byte).
#[derive(Debug, Clone)]
pub struct DeviceArray {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub address: u64,
}

impl DeviceArray {
    fn aligned(&self) -> bool {
        self.address.is_multiple_of(self.dtype.size_bytes() as u64)
    }
}

impl Compiled {
    /// The ordinal of the GPU whose memory [`Compiled::run_device_arrays`] takes: that of a
    /// model compiled for CUDA at fixed sizes; `None` for the other backends and for a model
    /// that compiles per input size (it runs on host arrays, through [`Compiled::run`]).
    pub fn device_memory(&self) -> Option<usize> {
        match &self.current.engine {
            Engine::Cuda(prepared) if self.resize.is_none() => {
                Some(prepared.executable.device().info().ordinal)
            }
            _ => None,
        }
    }

    /// Queues a run of a model compiled for CUDA on `stream` (PyTorch's
    /// `torch.cuda.current_stream().cuda_stream`; null for the legacy default stream), reading
    /// `inputs` by name (an input not given reads its stored value, uploaded once) and writing
    /// `outputs` in [`Compiled::output_names`]' order, all in the caller's device memory.
    /// Returns once the run is queued: the outputs are ready for work queued on `stream` after
    /// it, and nothing waits on the host. Types are checked; addresses cannot be.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the model's device in its primary context (the one
    /// PyTorch and the CUDA runtime use). Each array is contiguous on that device and stays
    /// allocated until the queued run has finished (PyTorch's caching allocator keeps a
    /// tensor's block for work on the stream it was allocated on); no output overlaps another
    /// array.
    pub unsafe fn run_device_arrays(
        &mut self,
        inputs: &BTreeMap<String, DeviceArray>,
        outputs: &[DeviceArray],
        stream: CuStream,
    ) -> Result<()> {
        if self.resize.is_some() {
            return Err(Error::input(
                "this model compiles one executable per input size, so it runs on host arrays \
                 only; compile it with its sizes fixed to run on device memory",
            ));
        }
        if !matches!(self.current.engine, Engine::Cuda(_)) {
            return Err(Error::input(format!(
                "device arrays were given to a model compiled for {}; compile it for cuda",
                self.describe()
            )));
        }
        if let Some(array) = inputs.values().chain(outputs).find(|a| !a.aligned()) {
            return Err(Error::input(format!(
                "a {} array at {:#x} is not aligned to its element",
                array.dtype, array.address
            )));
        }
        if let Some(name) = inputs
            .keys()
            .find(|name| self.current.rehoists(std::iter::once(name.as_str())))
        {
            return Err(Error::at_node(
                name,
                crate::error::ErrorKind::Input(
                    "this stored value was used at compile time to compute values the kernels \
                     read (a folded weight); give it on the host (`run`), which computes them \
                     again, or compile the model with it as a value of its own"
                        .into(),
                ),
            ));
        }
        let Engine::Cuda(prepared) = &mut self.current.engine else {
            unreachable!("checked above")
        };
        let executable = &mut prepared.executable;
        let device = executable.device().clone();
        let dag = &executable.program().dag;
        let (stored, hoisted) = (&self.current.stored, &self.current.hoisted);
        cache_stored(
            &dag.inputs,
            inputs,
            |name| stored.get(name).or_else(|| hoisted.get(name)),
            &mut self.device_stored,
            |host| DeviceBuffer::upload(&device, &host),
        )?;
        let (addresses, types): (Vec<u64>, Vec<_>) = in_input_order(
            &dag.inputs,
            inputs,
            |a| (a.address, (a.dtype, a.shape.as_slice())),
            |name| {
                let b = self.device_stored.get(name)?;
                Some((b.device_ptr(), (b.dtype, b.shape.as_slice())))
            },
        )?
        .into_iter()
        .unzip();
        executable.program().check_inputs(types.into_iter())?;
        executable
            .program()
            .check_outputs(outputs.iter().map(|o| (o.dtype, o.shape.as_slice())))?;
        let outs: Vec<u64> = outputs.iter().map(|o| o.address).collect();
        // SAFETY: every type is checked; the caller vouches for the stream and the arrays, and
        // the stored buffers live in `self`, which outlives the run only if the caller keeps
        // the model (the device stream's fence orders their reuse after the run otherwise).
        unsafe { executable.run_on_stream(stream, &addresses, &outs) }
    }
}
