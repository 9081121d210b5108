//! The RON graph format: reading with located errors, and writing back losslessly.
//!
//! ```ron
//! Graph(
//!     name: "example",
//!     inputs: [Input(name: "x", dtype: "f32", shape: [64, 512])],
//!     nodes: [
//!         Node(name: "i", op: "sigmoid", args: ["x"]),
//!         Node(name: "m", op: "mean", args: ["i"], attrs: {"axes": [1], "keepdim": true}),
//!     ],
//!     outputs: ["m"],
//! )
//! ```
//! Attribute values are written bare; their types come from the op catalogue. Saving writes one
//! input or node per line, attributes sorted by name, so `load(save(g)) == g` and saving twice
//! gives the same text.

use super::check::{Part, TypeMap, check_parts};
use super::{Graph, Input, Node};
use crate::attr::{AttrValue, Attrs};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, suggest};
use crate::rules::Catalogue;
use crate::rules::ron_file::{self, RonDocument};
use crate::span::Step;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Deserialize)]
#[serde(rename = "Graph", deny_unknown_fields)]
struct GraphFile {
    name: String,
    #[serde(default)]
    inputs: Vec<InputFile>,
    #[serde(default)]
    nodes: Vec<NodeFile>,
    outputs: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename = "Input", deny_unknown_fields)]
struct InputFile {
    name: String,
    dtype: String,
    shape: Vec<Dim>,
    /// A `.npy` file holding this input's stored value (a model's weights), relative to the
    /// graph file's directory and inside it.
    #[serde(default)]
    value: Option<String>,
}

/// One dimension as written: any integer, so that a negative one (`-1`, how some exporters
/// write "unknown") reaches [`convert`], which refuses it at its position with a message about
/// dimensions instead of RON's "Integer is out of bounds".
struct Dim(i128);

impl<'de> Deserialize<'de> for Dim {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Dim, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Dim;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a dimension (a non-negative integer)")
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Dim, E> {
                Ok(Dim(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Dim, E> {
                Ok(Dim(v.into()))
            }
            fn visit_i128<E>(self, v: i128) -> std::result::Result<Dim, E> {
                Ok(Dim(v))
            }
            fn visit_u128<E>(self, v: u128) -> std::result::Result<Dim, E> {
                Ok(Dim(i128::try_from(v).unwrap_or(i128::MAX)))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The stored-value files graph inputs name (`value: "w.npy"`), by input name, as written
/// (relative to the graph file's directory).
pub type StoredValues = BTreeMap<String, String>;

/// A stored-value file as a graph file names it, and where: a problem reading the value is
/// reported at its `value` field, not at the top of the graph file.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredFile {
    /// The path as written, relative to the graph file's directory.
    pub file: String,
    /// The `value` field, with the input's name as the node.
    pub site: crate::error::Site,
}

/// The stored-value files of a graph file's inputs, by input name.
pub type StoredFiles = BTreeMap<String, StoredFile>;

#[derive(Deserialize)]
#[serde(rename = "Node", deny_unknown_fields)]
struct NodeFile {
    name: String,
    op: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    attrs: BTreeMap<String, ron::Value>,
}

/// Reads, validates and type-checks a graph file.
pub fn load(path: &Path, catalogue: &Catalogue) -> Result<(Graph, TypeMap)> {
    let text = ron_file::read_file(path, crate::file_limits::FileKind::Graph)?;
    parse(&text, &path.display().to_string(), catalogue)
}

/// Reads a graph file and the stored-value files its inputs name.
pub fn load_with_values(
    path: &Path,
    catalogue: &Catalogue,
) -> Result<(Graph, TypeMap, StoredFiles)> {
    let text = ron_file::read_file(path, crate::file_limits::FileKind::Graph)?;
    parse_with_values(&text, &path.display().to_string(), catalogue)
}

/// Parses graph text; `file` is the name used in error messages.
pub fn parse(text: &str, file: &str, catalogue: &Catalogue) -> Result<(Graph, TypeMap)> {
    parse_with_values(text, file, catalogue).map(|(graph, types, _)| (graph, types))
}

/// Parses graph text and the stored-value files its inputs name. A value path must be
/// relative and stay inside the graph's directory: a graph file from elsewhere cannot make a
/// command read arbitrary files.
pub fn parse_with_values(
    text: &str,
    file: &str,
    catalogue: &Catalogue,
) -> Result<(Graph, TypeMap, StoredFiles)> {
    let doc: RonDocument<GraphFile> = ron_file::parse(text, file)?;
    let graph = convert(&doc, catalogue)?;
    let mut values = StoredFiles::new();
    for (index, input) in doc.value.inputs.iter().enumerate() {
        let Some(value) = &input.value else { continue };
        let relative = Path::new(value);
        let path = [
            Step::field("inputs"),
            Step::Index(index),
            Step::field("value"),
        ];
        let site = doc.site(&path).with_node(&input.name);
        if relative.as_os_str().is_empty()
            || !relative
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(Error::new(
                site,
                ErrorKind::Input(format!(
                    "value `{value}` must be a relative path inside the graph file's directory"
                )),
            ));
        }
        values.insert(
            input.name.clone(),
            StoredFile {
                file: value.clone(),
                site,
            },
        );
    }
    // Composite ops are replaced by their bodies before the check; a problem anywhere is
    // reported at the node the file wrote.
    let checked = super::expand::expand_parts(&graph, catalogue).and_then(|(expanded, origin)| {
        check_parts(&expanded, catalogue)
            .map(|types| (expanded, types))
            .map_err(|p| super::expand::map_part(p, &origin))
    });
    match checked {
        Ok((expanded, types)) => Ok((expanded, types, values)),
        Err(problem) => {
            let path = part_path(&problem.part);
            let mut site = doc.site(&path);
            site.node = part_name(&graph, &problem.part);
            Err(Error::new(site, problem.kind))
        }
    }
}

/// Where a graph part is written in the file.
fn part_path(part: &Part) -> Vec<Step> {
    match part {
        Part::Graph => vec![],
        Part::Outputs => vec![Step::field("outputs")],
        Part::Input { index, field } => vec![
            Step::field("inputs"),
            Step::Index(*index),
            Step::field(field),
        ],
        Part::Node { index, field } => {
            vec![
                Step::field("nodes"),
                Step::Index(*index),
                Step::field(field),
            ]
        }
        Part::Arg { node, arg } => vec![
            Step::field("nodes"),
            Step::Index(*node),
            Step::field("args"),
            Step::Index(*arg),
        ],
        Part::Attr { node, attr } => vec![
            Step::field("nodes"),
            Step::Index(*node),
            Step::field("attrs"),
            Step::key(attr),
        ],
        Part::Output { index } => vec![Step::field("outputs"), Step::Index(*index)],
    }
}

fn part_name(graph: &Graph, part: &Part) -> Option<String> {
    match part {
        Part::Graph | Part::Outputs | Part::Output { .. } => None,
        Part::Input { index, .. } => Some(graph.inputs[*index].name.clone()),
        Part::Node { index, .. }
        | Part::Arg { node: index, .. }
        | Part::Attr { node: index, .. } => Some(graph.nodes[*index].name.clone()),
    }
}

/// Turns the file structs into a [`Graph`], typing attribute values by the catalogue.
fn convert(doc: &RonDocument<GraphFile>, catalogue: &Catalogue) -> Result<Graph> {
    let file = &doc.value;
    let mut inputs = Vec::with_capacity(file.inputs.len());
    for (index, input) in file.inputs.iter().enumerate() {
        let dtype = DType::from_name(&input.dtype).ok_or_else(|| {
            let path = [
                Step::field("inputs"),
                Step::Index(index),
                Step::field("dtype"),
            ];
            Error::new(
                doc.site(&path).with_node(&input.name),
                ErrorKind::DType(format!(
                    "unknown dtype `{}`{}; the dtypes are {}",
                    input.dtype,
                    crate::error::hint(&input.dtype, DType::ALL.map(|d| d.name())),
                    DType::ALL.map(|d| d.name()).join(", ")
                )),
            )
        })?;
        let mut shape = Vec::with_capacity(input.shape.len());
        for (axis, &Dim(dim)) in input.shape.iter().enumerate() {
            let size = usize::try_from(dim).map_err(|_| {
                let path = [
                    Step::field("inputs"),
                    Step::Index(index),
                    Step::field("shape"),
                    Step::Index(axis),
                ];
                let why = if dim < 0 {
                    "dimensions must be non-negative integers"
                } else {
                    "that is more than this machine can address"
                };
                Error::new(
                    doc.site(&path).with_node(&input.name),
                    ErrorKind::Shape(format!("dimension {axis} is {dim}; {why}")),
                )
            })?;
            shape.push(size);
        }
        inputs.push(Input {
            name: input.name.clone(),
            dtype,
            shape,
        });
    }
    let mut nodes = Vec::with_capacity(file.nodes.len());
    for (index, node) in file.nodes.iter().enumerate() {
        let mut attrs = Attrs::new();
        // An unknown op is reported by the checker, with a suggestion; its attributes cannot be
        // typed, so they are dropped here.
        let declared = catalogue.declared_attrs(&node.op);
        if let Some(declared) = declared {
            for (name, value) in &node.attrs {
                let path = [
                    Step::field("nodes"),
                    Step::Index(index),
                    Step::field("attrs"),
                    Step::key(name),
                ];
                let spec = declared.iter().find(|a| &a.name == name).ok_or_else(|| {
                    let position = doc
                        .spans
                        .key_position(&path)
                        .unwrap_or_else(|| doc.spans.nearest(&path));
                    Error::new(
                        crate::error::Site::file(&doc.file, position).with_node(&node.name),
                        ErrorKind::UnknownAttr {
                            op: node.op.clone(),
                            attr: name.clone(),
                            suggestion: suggest(name, declared.iter().map(|a| a.name.as_str())),
                        },
                    )
                })?;
                let written = doc.spans.bare_name(&path);
                let typed =
                    AttrValue::from_bare_written(value, spec.ty, written).map_err(|mismatch| {
                        Error::new(
                            doc.site(&path).with_node(&node.name),
                            ErrorKind::AttrType {
                                attr: name.clone(),
                                expected: spec.ty.to_string(),
                                found: mismatch.found,
                            },
                        )
                    })?;
                attrs.insert(name.clone(), typed);
            }
        }
        nodes.push(Node {
            name: node.name.clone(),
            op: node.op.clone(),
            args: node.args.clone(),
            attrs,
        });
    }
    Ok(Graph {
        name: file.name.clone(),
        inputs,
        nodes,
        outputs: file.outputs.clone(),
    })
}

/// Writes a graph in the file format (one input or node per line).
pub fn to_ron(graph: &Graph) -> String {
    to_ron_with_values(graph, &StoredValues::new())
}

/// Writes a graph whose inputs in `values` name their stored-value files.
pub fn to_ron_with_values(graph: &Graph, values: &StoredValues) -> String {
    let mut out = String::from("Graph(\n");
    out += &format!("    name: {},\n", quote(&graph.name));
    out += "    inputs: [\n";
    for input in &graph.inputs {
        let value = values
            .get(&input.name)
            .map(|v| format!(", value: {}", quote(v)))
            .unwrap_or_default();
        out += &format!(
            "        Input(name: {}, dtype: {}, shape: {:?}{value}),\n",
            quote(&input.name),
            quote(input.dtype.name()),
            input.shape
        );
    }
    out += "    ],\n    nodes: [\n";
    for node in &graph.nodes {
        out += &format!(
            "        Node(name: {}, op: {}",
            quote(&node.name),
            quote(&node.op)
        );
        if !node.args.is_empty() {
            let args: Vec<String> = node.args.iter().map(|a| quote(a)).collect();
            out += &format!(", args: [{}]", args.join(", "));
        }
        if !node.attrs.is_empty() {
            let attrs: Vec<String> = node
                .attrs
                .iter()
                .map(|(k, v)| format!("{}: {}", quote(k), bare(v)))
                .collect();
            out += &format!(", attrs: {{{}}}", attrs.join(", "));
        }
        out += "),\n";
    }
    let outputs: Vec<String> = graph.outputs.iter().map(|o| quote(o)).collect();
    out += &format!("    ],\n    outputs: [{}],\n)\n", outputs.join(", "));
    out
}

/// Writes a graph file.
pub fn save(graph: &Graph, path: &Path) -> Result<()> {
    std::fs::write(path, to_ron(graph)).map_err(|e| {
        Error::new(
            crate::error::Site::whole_file(&path.display().to_string()),
            ErrorKind::Io {
                path: path.display().to_string(),
                message: e.to_string(),
            },
        )
    })
}

/// A RON string literal (escaped by ron itself, so any name survives the round trip).
fn quote(s: &str) -> String {
    ron::to_string(s).expect("strings always serialize")
}

fn bare(value: &AttrValue) -> String {
    match value {
        // `{:?}` keeps a decimal point or exponent, so the value re-reads as a float, and
        // prints the shortest text that round-trips.
        AttrValue::Float(v) if v.is_nan() => "NaN".into(),
        AttrValue::Float(v) if v.is_infinite() => {
            if *v > 0.0 {
                "inf".into()
            } else {
                "-inf".into()
            }
        }
        AttrValue::Float(v) => format!("{v:?}"),
        AttrValue::Int(v) => v.to_string(),
        AttrValue::Bool(b) => b.to_string(),
        AttrValue::Ints(v) => format!("{v:?}"),
        AttrValue::DType(d) => quote(d.name()),
    }
}
