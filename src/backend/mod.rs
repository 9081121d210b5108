//! Backends: turning kernel IR into code that runs, and running it.
//!
//! [`cpu`] emits C, compiles it with the system C compiler and loads the result.

pub mod cpu;
