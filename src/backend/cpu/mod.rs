//! The CPU backend: C emission ([`emit`]), compilation and the kernel cache ([`compiler`]).

pub mod compiler;
pub mod emit;
