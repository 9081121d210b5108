//! fusebox optimizes tensor computation graphs by equality saturation, with every op, casting
//! policy, fusion rule and rewrite written as data in RON rule files.
//!
//! The data flows through the modules in this order: [`graph`] (the IR, its file format and
//! checker) over the [`rules`] catalogue, the [`formula`] language that defines pointwise ops,
//! and the reference evaluator [`eval`], which is the oracle for every later stage.

pub mod amp;
pub mod attr;
pub mod backend;
pub mod cli;
pub mod dag;
pub mod dtype;
pub mod egraph;
pub mod error;
pub mod eval;
pub mod explain;
pub mod extract;
pub mod formula;
pub mod graph;
pub mod lower;
pub mod optimize;
pub mod partition;
pub mod rewrite;
pub mod rules;
pub mod runner;
pub mod runtime;
pub mod saturate;
pub mod shape;
pub mod span;
pub mod tensor;

pub use error::{Error, ErrorKind, Result};
