//! The CPU backend: C emission ([`emit`]), compilation and the kernel cache ([`compiler`]),
//! the GEMM behind its matrix products ([`gemm`]) and the geometry by which it reads a
//! convolution's image, padded and split into phases ([`phases`]), and the runtime that loads the compiled
//! module and runs programs with it ([`runtime`]).

pub mod compiler;
pub mod emit;
pub mod gemm;
pub mod phases;
pub mod runtime;

pub use runtime::{CpuExecutable, module_source};
