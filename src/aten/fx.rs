//! The graph the `torch.compile` front end sends: an FX graph of core ATen ops written as JSON,
//! each node with its arguments by schema name and the dtype and shape of each output (from
//! the fake tensors PyTorch traced it with).
//!
//! ```json
//! {"name": "fused_0",
//!  "inputs": [{"name": "x", "dtype": "f32", "shape": [4, 32]}],
//!  "constants": [{"name": "mask", "dtype": "bool", "shape": [8, 8]}],
//!  "nodes": [{"name": "relu", "target": "aten.relu.default",
//!             "args": {"self": {"ref": "x"}},
//!             "outputs": [{"dtype": "f32", "shape": [4, 32]}]}],
//!  "outputs": [{"ref": "relu"}]}
//! ```
//!
//! An argument is a number, a bool, a string, `null`, a list, a value `{"ref": NAME,
//! "index": K}` (output K of node NAME, or an input or constant), or a dtype `{"dtype":
//! "f32"}`. A node may say which of its outputs the graph reads (`used`) and PyTorch's common
//! dtype of its operands (`common`); a constant's bytes travel beside the JSON.

use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use serde::Deserialize;
use serde_json::Value as Json;
use std::collections::BTreeMap;

/// A whole graph (or one partition of it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FxGraph {
    pub name: String,
    pub inputs: Vec<FxTensor>,
    #[serde(default)]
    pub constants: Vec<FxTensor>,
    pub nodes: Vec<FxNode>,
    pub outputs: Vec<FxRef>,
}

/// A named tensor: an input, or a constant the front end evaluated.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FxTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// The dtype and shape of one output of a node.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FxType {
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// One `call_function` node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FxNode {
    pub name: String,
    pub target: String,
    #[serde(default)]
    pub args: BTreeMap<String, Json>,
    pub outputs: Vec<FxType>,
    /// The outputs the graph reads; all of them when absent.
    #[serde(default)]
    pub used: Option<Vec<usize>>,
    /// PyTorch's common dtype of the operands (`torch.result_type`), for comparisons.
    #[serde(default)]
    pub common: Option<String>,
}

/// Output `index` of the node (or input, or constant) `node`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(deny_unknown_fields)]
pub struct FxRef {
    #[serde(rename = "ref")]
    pub node: String,
    #[serde(default)]
    pub index: usize,
}

impl FxRef {
    /// The reference an argument holds, if it is one.
    pub fn of(arg: &Json) -> Option<FxRef> {
        let object = arg.as_object()?;
        if !object.contains_key("ref") {
            return None;
        }
        serde_json::from_value(arg.clone()).ok()
    }

    /// The ONNX value name of this output: the node's name for output 0, `name:K` after.
    pub fn value_name(&self) -> String {
        if self.index == 0 {
            self.node.clone()
        } else {
            format!("{}:{}", self.node, self.index)
        }
    }
}

/// Reads a graph sent as JSON; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<FxGraph> {
    serde_json::from_str(text).map_err(|e| {
        Error::new(
            crate::error::Site::model(file),
            ErrorKind::Input(format!(
                "line {}, column {}: not an FX graph: {e}",
                e.line(),
                e.column()
            )),
        )
    })
}

/// The dtype named `name` (fusebox's spelling), or an error at `node`.
pub fn dtype(name: &str, node: &str) -> Result<DType> {
    DType::from_name(name).ok_or_else(|| {
        Error::at_node(
            node,
            ErrorKind::Input(format!("dtype `{name}` is not one fusebox has")),
        )
    })
}

/// The dtype a `{"dtype": NAME}` argument names.
pub fn dtype_arg(arg: &Json) -> Option<&str> {
    arg.as_object()?.get("dtype")?.as_str()
}

/// A number argument: a JSON number, or `{"float": "inf"}` (`"-inf"`, `"nan"`), as JSON has
/// no spelling of those.
pub fn number(arg: &Json) -> Option<f64> {
    if let Some(n) = arg.as_f64() {
        return Some(n);
    }
    match arg.as_object()?.get("float")?.as_str()? {
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" => Some(f64::NAN),
        _ => None,
    }
}
