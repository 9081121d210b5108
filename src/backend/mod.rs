//! Backends: turning kernel IR into code that runs, and running it.
//!
//! [`cpu`] emits C, compiles it with the system C compiler and loads the result. Both
//! compilers keep what they build in [`cache`], a content-addressed store on disk. The C and
//! the CUDA emitters spell scalar values through one trait, [`spelling`], so that what they
//! agree on is written once.

pub mod cache;
pub mod cpu;
pub mod cuda;
pub(crate) mod spelling;
