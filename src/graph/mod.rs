//! The tensor graph: named inputs with static shapes, nodes applying catalogue ops to earlier
//! values, and named outputs.
//!
//! A graph is plain data. [`check`](check::check) validates it against a
//! [`Catalogue`](crate::rules::Catalogue) and infers every value's dtype and shape;
//! [`file`](mod@file) reads and writes the RON graph format; [`builder`] builds graphs from Rust;
//! [`expand`] replaces composite ops by the catalogue ops they are made of.

pub mod builder;
pub mod check;
pub mod dims;
pub mod expand;
pub mod file;
pub mod synthetic;

pub use builder::GraphBuilder;
pub use check::{TensorType, TypeMap, check};

use crate::attr::Attrs;
use crate::dtype::DType;
use crate::shape::Shape;

/// A tensor computation graph. Values are named; every name is unique across inputs and nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    pub name: String,
    pub inputs: Vec<Input>,
    /// In dependency order: a node's args name inputs or earlier nodes.
    pub nodes: Vec<Node>,
    /// Names of the values the graph returns.
    pub outputs: Vec<String>,
}

/// A graph input with its dtype and static shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub name: String,
    pub dtype: DType,
    pub shape: Shape,
}

/// One op application. `attrs` holds only what was written; defaults come from the catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: String,
    pub args: Vec<String>,
    pub attrs: Attrs,
}

impl Graph {
    pub fn input(&self, name: &str) -> Option<&Input> {
        self.inputs.iter().find(|i| i.name == name)
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }
}
