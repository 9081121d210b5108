//! Runs on memory the caller owns: the arrays of another runtime (NumPy's, PyTorch's CPU
//! tensors) read and written in place where the backend allows, so a binding adds no copy.

use super::{Compiled, Engine};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::buffer::Buffer;
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// A C-contiguous array of `dtype` and `shape` at `data`, in memory the caller owns (f16 and
/// bf16 as their 16-bit patterns, bool as one byte).
#[derive(Debug, Clone)]
pub struct HostArray {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: *mut u8,
}

impl HostArray {
    fn bytes(&self) -> usize {
        crate::shape::numel(&self.shape) * self.dtype.size_bytes()
    }

    /// Whether the array is aligned to its element, as the kernels read it.
    fn aligned(&self) -> bool {
        (self.data as usize).is_multiple_of(self.dtype.size_bytes())
    }

    /// A copy of the array as a tensor.
    ///
    /// # Safety
    ///
    /// `data` is valid for reads of the array's bytes.
    unsafe fn to_tensor(&self) -> Result<Tensor> {
        let mut buffer =
            Buffer::try_zeroed(self.dtype, &self.shape).map_err(|e| Error::input(e.to_string()))?;
        // SAFETY: the buffer holds exactly the array's bytes; the caller vouches for `data`.
        unsafe { std::ptr::copy_nonoverlapping(self.data, buffer.as_mut_ptr(), self.bytes()) };
        Ok(buffer.to_tensor())
    }

    /// Writes `value` into the array.
    ///
    /// # Safety
    ///
    /// `data` is valid for writes of the array's bytes.
    unsafe fn store(&self, name: &str, value: &Tensor) -> Result<()> {
        let buffer = Buffer::try_from_tensor(value).map_err(|e| Error::input(e.to_string()))?;
        if buffer.dtype != self.dtype || buffer.shape != self.shape {
            return Err(Error::at_node(
                name,
                ErrorKind::Input(format!(
                    "the output array is {} {:?}, the output {} {:?}",
                    self.dtype, self.shape, buffer.dtype, buffer.shape
                )),
            ));
        }
        // SAFETY: both hold the array's bytes; the caller vouches for `data`.
        unsafe { std::ptr::copy_nonoverlapping(buffer.as_ptr(), self.data, self.bytes()) };
        Ok(())
    }
}

impl Compiled {
    /// The names of the outputs, in the order [`Compiled::run_host`] writes them.
    pub fn output_names(&self) -> Vec<String> {
        match &self.current.engine {
            Engine::Reference(graph) => graph.outputs.clone(),
            Engine::Cpu(prepared) => dag_outputs(&prepared.executable),
            Engine::Cuda(prepared) => dag_outputs(&prepared.executable),
        }
    }

    /// Runs on arrays the caller owns: `inputs` by name (an input not given takes its stored
    /// value, as in [`Compiled::run`]), results into `outputs`, in [`Compiled::output_names`]'
    /// order. On the CPU backend, with every array of its declared dtype and shape and aligned
    /// to its element, the kernels read and write the arrays themselves; elsewhere (the
    /// reference and CUDA backends, a model that compiles per size) the arrays are copied in
    /// and out of a run of [`Compiled::run`].
    ///
    /// # Safety
    ///
    /// Each array's `data` must be valid for its bytes (reads for inputs, writes for
    /// outputs) during the call; no output may overlap another array.
    pub unsafe fn run_host(
        &mut self,
        inputs: &BTreeMap<String, HostArray>,
        outputs: &[HostArray],
    ) -> Result<()> {
        // A run that replaces a stored value the hoisted values are made of computes them
        // again, through `run`.
        let in_place = self.resize.is_none()
            && !self.current.rehoists(inputs.keys().map(String::as_str))
            && inputs.values().chain(outputs).all(HostArray::aligned)
            && matches!(self.current.engine, Engine::Cpu(_));
        if !in_place {
            let mut given = BTreeMap::new();
            for (name, array) in inputs {
                // SAFETY: the caller's contract.
                given.insert(name.clone(), unsafe { array.to_tensor() }?);
            }
            let names = self.output_names();
            if names.len() != outputs.len() {
                return Err(Error::input(format!(
                    "{} output arrays given, the model has {} outputs",
                    outputs.len(),
                    names.len()
                )));
            }
            let results = self.run(&given)?;
            for (name, array) in names.iter().zip(outputs) {
                let value = results.get(name).ok_or_else(|| {
                    Error::input(format!("internal: output `{name}` was not computed"))
                })?;
                // SAFETY: the caller's contract.
                unsafe { array.store(name, value) }?;
            }
            return Ok(());
        }
        let Engine::Cpu(prepared) = &mut self.current.engine else {
            unreachable!("checked above")
        };
        let executable = &mut prepared.executable;
        let dag = &crate::backend::Executable::program(executable).dag;
        let (stored, hoisted) = (&self.current.stored, &self.current.hoisted);
        // The stored values of the inputs not given, converted once.
        cache_stored(
            &dag.inputs,
            inputs,
            |name| stored.get(name).or_else(|| hoisted.get(name)),
            &mut self.host_stored,
            Ok,
        )?;
        let (pointers, types): (Vec<*const u8>, Vec<_>) = in_input_order(
            &dag.inputs,
            inputs,
            |a| (a.data as *const u8, (a.dtype, a.shape.as_slice())),
            |name| {
                let b = self.host_stored.get(name)?;
                Some((b.as_ptr(), (b.dtype, b.shape.as_slice())))
            },
        )?
        .into_iter()
        .unzip();
        crate::backend::Executable::program(executable).check_inputs(types.into_iter())?;
        crate::backend::Executable::program(executable)
            .check_outputs(outputs.iter().map(|o| (o.dtype, o.shape.as_slice())))?;
        let out: Vec<*mut u8> = outputs.iter().map(|o| o.data).collect();
        // SAFETY: every type is checked; the caller vouches for the arrays' memory, and the
        // stored buffers are borrowed from `self` for the call.
        unsafe { executable.run_at(&pointers, &out) }
    }
}

/// Fills `cache` with the stored value (`stored` finds it, a hoisted value too) of every
/// program input that `given` lacks and the cache does not hold yet: converted to the input's
/// dtype, in its storage format, and placed by `place` (a host buffer kept as it is, or
/// uploaded to a device). Runs on memory the caller owns read stored values from there, made
/// once per compiled model.
pub(super) fn cache_stored<'s, A, B>(
    program_inputs: &[crate::dag::DagInput],
    given: &BTreeMap<String, A>,
    stored: impl Fn(&str) -> Option<&'s Tensor>,
    cache: &mut BTreeMap<String, B>,
    place: impl Fn(Buffer) -> Result<B>,
) -> Result<()> {
    for input in program_inputs {
        if given.contains_key(&input.name) || cache.contains_key(&input.name) {
            continue;
        }
        if let Some(value) = stored(&input.name) {
            let buffer = value
                .cast(input.ty.dtype)
                .and_then(|v| Buffer::try_from_tensor(&v))
                .map_err(|e| Error::at_node(&input.name, ErrorKind::Input(e.to_string())))?;
            cache.insert(input.name.clone(), place(buffer)?);
        }
    }
    Ok(())
}

/// What a run reads for each of the program's inputs, in their order: the array given by name
/// (`given`), else the model's stored value (`stored`). A name given that the program lacks,
/// or an input with neither, is an error naming it.
pub(super) fn in_input_order<'a, A, T>(
    program_inputs: &'a [crate::dag::DagInput],
    given: &'a BTreeMap<String, A>,
    from_given: impl Fn(&'a A) -> T,
    from_stored: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>> {
    super::refuse_unknown(given.keys(), program_inputs.iter().map(|i| i.name.as_str()))?;
    let mut found = Vec::with_capacity(program_inputs.len());
    let mut missing = Vec::new();
    for input in program_inputs {
        match given.get(&input.name).map(&from_given) {
            Some(value) => found.push(value),
            None => match from_stored(&input.name) {
                Some(value) => found.push(value),
                None => missing.push(input.name.as_str()),
            },
        }
    }
    if !missing.is_empty() {
        return Err(Error::input(format!(
            "no value for input(s) {}",
            missing.join(", ")
        )));
    }
    Ok(found)
}

fn dag_outputs(executable: &impl crate::backend::Executable) -> Vec<String> {
    executable
        .program()
        .dag
        .outputs
        .iter()
        .map(|o| o.name.clone())
        .collect()
}
