//! The CUDA backend: CUDA C emitted from the same kernel IR as the CPU backend ([`emit`], with
//! the launch ABI in [`abi`]), compiled to PTX by NVRTC through cudarc ([`nvrtc`], finding the
//! libraries with [`libs`]), and run on one stream with no host synchronization between
//! kernels ([`runtime`]).
//!
//! Everything here builds and every non-GPU test passes on a machine without CUDA: cudarc
//! loads its libraries at run time, and [`libs`] checks they exist before any cudarc call
//! (cudarc panics otherwise).

pub mod abi;
pub mod emit;
pub mod libs;
pub mod nvrtc;
pub mod runtime;
