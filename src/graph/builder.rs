//! Building graphs from Rust.
//!
//! ```
//! use fusebox::graph::GraphBuilder;
//! use fusebox::dtype::DType;
//! use fusebox::rules::Catalogue;
//!
//! let mut b = GraphBuilder::new("tail");
//! let x = b.input("x", DType::F32, &[4, 8]);
//! let s = b.op("s", "sigmoid", &[&x]);
//! let m = b.op_with("m", "mean", &[&s], &[("axes", vec![1i64].into())]);
//! let graph = b.finish(&[&s, &m]);
//! let types = fusebox::graph::check(&graph, &Catalogue::defaults()).unwrap();
//! assert_eq!(types["m"].shape, vec![4]);
//! ```

use super::{Graph, Input, Node};
use crate::attr::{AttrValue, Attrs};
use crate::dtype::DType;
use crate::rules::Builtin;
use crate::rules::builtin::BuiltinAttr;

/// Accumulates inputs and nodes in order; [`GraphBuilder::finish`] yields the graph, which
/// [`check`](fn@super::check) then validates.
#[derive(Debug, Clone)]
pub struct GraphBuilder {
    graph: Graph,
}

impl GraphBuilder {
    pub fn new(name: &str) -> GraphBuilder {
        GraphBuilder {
            graph: Graph {
                name: name.to_string(),
                inputs: Vec::new(),
                nodes: Vec::new(),
                outputs: Vec::new(),
            },
        }
    }

    /// Adds an input and returns its name, for use as an argument.
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> String {
        self.graph.inputs.push(Input {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
        });
        name.to_string()
    }

    /// Adds a node without attributes.
    pub fn op(&mut self, name: &str, op: &str, args: &[&str]) -> String {
        self.op_with(name, op, args, &[])
    }

    /// Adds a node with attributes.
    pub fn op_with(
        &mut self,
        name: &str,
        op: &str,
        args: &[&str],
        attrs: &[(&str, AttrValue)],
    ) -> String {
        self.graph.nodes.push(Node {
            name: name.to_string(),
            op: op.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<Attrs>(),
        });
        name.to_string()
    }

    /// Adds a scalar constant of the given dtype: a node of the op the default catalogue
    /// declares as the `const` built-in (a catalogue that renames it needs [`Self::op_with`]).
    pub fn constant(&mut self, name: &str, value: f64, dtype: DType) -> String {
        self.op_with(
            name,
            Builtin::Const.name(),
            &[],
            &[
                (BuiltinAttr::Value.name(), AttrValue::Float(value)),
                (BuiltinAttr::Dtype.name(), AttrValue::DType(dtype)),
            ],
        )
    }

    /// Adds a scalar integer constant of an integer dtype, exact whatever its magnitude (see
    /// [`Self::constant`] for the op it uses).
    pub fn constant_int(&mut self, name: &str, value: i64, dtype: DType) -> String {
        self.op_with(
            name,
            Builtin::Const.name(),
            &[],
            &[
                (BuiltinAttr::Value.name(), AttrValue::Int(value)),
                (BuiltinAttr::Dtype.name(), AttrValue::DType(dtype)),
            ],
        )
    }

    pub fn finish(mut self, outputs: &[&str]) -> Graph {
        self.graph.outputs = outputs.iter().map(|o| o.to_string()).collect();
        self.graph
    }
}

impl From<Vec<i64>> for AttrValue {
    fn from(v: Vec<i64>) -> AttrValue {
        AttrValue::Ints(v)
    }
}

impl From<f64> for AttrValue {
    fn from(v: f64) -> AttrValue {
        AttrValue::Float(v)
    }
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> AttrValue {
        AttrValue::Int(v)
    }
}

impl From<bool> for AttrValue {
    fn from(v: bool) -> AttrValue {
        AttrValue::Bool(v)
    }
}

impl From<DType> for AttrValue {
    fn from(v: DType) -> AttrValue {
        AttrValue::DType(v)
    }
}
