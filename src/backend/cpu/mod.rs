//! The CPU backend: C emission ([`emit`]), compilation and the kernel cache ([`compiler`]),
//! the GEMM behind its matrix products ([`gemm`]) and the phase split it reads a strided
//! convolution's image through ([`phases`]), and the runtime that loads the compiled
//! module and runs programs with it ([`runtime`]).

pub mod compiler;
pub mod emit;
pub mod gemm;
pub mod phases;
pub mod runtime;

pub use runtime::{CpuExecutable, module_source};
