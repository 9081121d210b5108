//! The e-graph: every equivalent form of a graph at once.
//!
//! [`language`] defines the e-nodes (catalogue ops with attribute leaves), [`analysis`] types
//! every class and tracks constants, [`build`] moves graphs in and out.

pub mod analysis;
pub mod build;
pub mod language;

pub use analysis::{ClassData, FuseGraph, Origin, TensorData, TypeAnalysis};
pub use build::{ChoiceError, Seeded, dag_from_choice, new_egraph, seed};
pub use language::{ENode, Leaf};
