//! The host runtime every backend shares: typed host buffers ([`buffer`]), the liveness plan
//! that decides which intermediates share memory ([`memory`]), the reference matrix product
//! ([`matmul`]) and a slow interpreter of kernel IR ([`interpret`]).
//!
//! None of this knows how kernels are compiled: it sits between the kernel IR
//! ([`crate::lower`]) and the backends ([`crate::backend`]), so a backend can plan its memory,
//! take inputs and return outputs in host buffers, and test its kernels against the
//! interpreter without reaching into another backend.

pub mod buffer;
pub mod interpret;
pub mod matmul;
pub mod memory;

use crate::error::{Error, ErrorKind, Result, Site};
use crate::eval::Tensors;
use crate::lower::Program;
use buffer::Buffer;

/// The buffers of `tensors` (keyed by input name) in the order `program` takes them; an input
/// without a value is an error naming it.
pub fn input_buffers(program: &Program, tensors: &Tensors) -> Result<Vec<Buffer>> {
    program
        .dag
        .inputs
        .iter()
        .map(|input| {
            let tensor = tensors.get(&input.name).ok_or_else(|| {
                Error::new(
                    Site::node(&input.name),
                    ErrorKind::Input(format!("no value given for input `{}`", input.name)),
                )
            })?;
            Buffer::try_from_tensor(tensor)
                .map_err(|e| Error::new(Site::node(&input.name), ErrorKind::Input(e.to_string())))
        })
        .collect()
}
