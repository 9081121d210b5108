//! Backends: turning kernel IR into code that runs, and running it.
//!
//! [`cpu`] emits C, compiles it with the system C compiler and loads the result. Both
//! compilers keep what they build in [`cache`], a content-addressed store on disk.

// The scalar C text both emitters share; the C and CUDA spellings implement it.
pub(crate) mod spelling;

pub mod cache;
pub mod cpu;
pub mod cuda;
