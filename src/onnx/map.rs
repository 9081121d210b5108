//! `rules/onnx.ron`: the table from ONNX op types to small graphs of catalogue ops.
//!
//! The table is data so that supporting another ONNX op whose meaning the catalogue can
//! express is a few lines of RON, not a match arm; the file's header documents the template
//! language. [`MapTable::load_str`] reads it with located errors, and checks what can be
//! checked without a model: every template arg names an input (`$N`, `$*`) or an earlier node.

use crate::error::{Error, ErrorKind, Result};
use crate::rules::ron_file;
use crate::span::Step;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The table embedded in the binary.
pub const DEFAULT: &str = include_str!("../../rules/onnx.ron");

/// One ONNX op type (under the Map's `when` conditions) and the catalogue graph it becomes.
#[derive(Debug, Deserialize)]
#[serde(rename = "Map", deny_unknown_fields)]
pub struct Mapping {
    pub onnx: String,
    /// ONNX attribute values this Map applies to (after defaults).
    #[serde(default)]
    pub when: BTreeMap<String, ron::Value>,
    /// Defaults of the ONNX op's attributes, as the ONNX specification gives them.
    #[serde(default)]
    pub attrs: BTreeMap<String, ron::Value>,
    /// A binary catalogue op that first folds every input, left to right, into `$0`.
    #[serde(default)]
    pub chain: Option<String>,
    #[serde(default)]
    pub nodes: Vec<Template>,
    /// Template nodes that are the ONNX node's second, third, … outputs.
    #[serde(default)]
    pub outputs: Vec<String>,
}

/// One catalogue node of a Map's graph.
#[derive(Debug, Deserialize)]
#[serde(rename = "Node", deny_unknown_fields)]
pub struct Template {
    #[serde(default)]
    pub name: Option<String>,
    pub op: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub attrs: BTreeMap<String, ron::Value>,
    #[serde(default)]
    pub when: BTreeMap<String, ron::Value>,
    #[serde(default)]
    pub unless: BTreeMap<String, ron::Value>,
    #[serde(default)]
    pub needs: Vec<String>,
}

/// The loaded table.
#[derive(Debug)]
pub struct MapTable {
    pub maps: Vec<Mapping>,
}

impl MapTable {
    /// The embedded table (checked by the test suite, so this cannot fail in a release).
    pub fn defaults() -> Result<MapTable> {
        MapTable::load_str(DEFAULT, "rules/onnx.ron")
    }

    /// Reads a table; `file` names it in errors.
    pub fn load_str(text: &str, file: &str) -> Result<MapTable> {
        let doc: ron_file::RonDocument<Vec<Mapping>> = ron_file::parse(text, file)?;
        for (m, map) in doc.value.iter().enumerate() {
            let mut names: Vec<&str> = Vec::new();
            for (n, node) in map.nodes.iter().enumerate() {
                for (a, written) in node.args.iter().enumerate() {
                    let known = |arg: &str| {
                        arg == "$*"
                            || arg
                                .strip_prefix('$')
                                .is_some_and(|i| i.parse::<usize>().is_ok())
                            || names.contains(&arg)
                    };
                    if let Some(arg) = written.split('|').find(|alt| !known(alt)) {
                        let path = [
                            Step::Index(m),
                            Step::field("nodes"),
                            Step::Index(n),
                            Step::field("args"),
                            Step::Index(a),
                        ];
                        return Err(Error::new(
                            doc.site(&path),
                            ErrorKind::Rule(format!(
                                "{}: `{arg}` is neither an input ($0, $1, …, $*) nor an earlier node",
                                map.onnx
                            )),
                        ));
                    }
                }
                if let Some(name) = &node.name {
                    names.push(name);
                }
            }
        }
        Ok(MapTable { maps: doc.value })
    }

    /// Whether some Map handles `op_type`.
    pub fn knows(&self, op_type: &str) -> bool {
        self.maps.iter().any(|m| m.onnx == op_type)
    }
}
