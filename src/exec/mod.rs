//! The executor: runs a lowered [`Program`](crate::lower::Program) on the CPU backend.
//!
//! Compiling a program emits one C module holding each distinct kernel once, compiles it (or
//! finds it in the cache: kernels carry no sizes, so another batch size compiles nothing),
//! plans intermediate buffers by liveness ([`memory`]), and checks every launch's views lie
//! inside their buffers, so a wrong launch is an error here rather than a wild write in C.
//! Running is then a loop over steps: kernel calls and matrix products.

pub mod buffer;
mod executable;
pub use executable::{CpuExecutable, module_source};
pub(crate) mod matmul;
pub mod memory;
