//! `onnx.ron`: the table from ONNX op types to small graphs of catalogue ops, read by the
//! importer ([`crate::onnx`]).
//!
//! The table is data so that supporting another ONNX op whose meaning the catalogue can
//! express is a few lines of RON, not a match arm; the file's header documents the template
//! language. A rule directory's `onnx.ron` replaces the embedded table as a whole, like
//! `amp.ron`. [`MapTable::load_str`] reads it with located errors, and checks what can be
//! checked without a model: no Map is for an op type the importer handles in code
//! ([`STRUCTURAL`]), every template op (and chain op) is in the catalogue, every
//! attribute a template sets is one its op declares, and every template arg names an input
//! (`$N`, `$*`) or an earlier node.

use crate::dtype::{Category, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::rules::{Catalogue, ron_file};
use crate::span::Step;
use serde::Deserialize;
use std::collections::BTreeMap;

/// ONNX ops the importer handles in code: their catalogue form depends on shapes or constant
/// values known only at import. The one list of them: the importer (`crate::onnx`) registers
/// one handler for each (a test there checks the two agree), and this table's loader refuses a
/// Map for any of them (it would never be consulted).
pub const STRUCTURAL: [&str; 38] = [
    "Constant",
    "ConstantOfShape",
    "Shape",
    "Gather",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Expand",
    "Slice",
    "Split",
    "LSTM",
    "GRU",
    "RNN",
    "ArgMax",
    "ArgMin",
    "OneHot",
    "Tile",
    "Trilu",
    "GatherND",
    "Range",
    "TopK",
    "CumSum",
    "ScatterElements",
    "ScatterND",
    "ReduceProd",
    "CumProd",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "BatchNormalization",
    "Pad",
    "InstanceNormalization",
    "GroupNormalization",
    "Resize",
];

/// The table embedded in the binary.
pub const DEFAULT: &str = include_str!("../../rules/onnx.ron");

/// One ONNX op type (under the Map's `when` conditions) and the catalogue graph it becomes.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
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

/// The input index of a dtype condition key (`"$0.dtype"` → 0), or `None` for an attribute
/// condition.
pub fn dtype_condition(key: &str) -> Option<usize> {
    key.strip_prefix('$')?.strip_suffix(".dtype")?.parse().ok()
}

/// The input index of a run-time condition key, `$N.run_time` (`true` when input N is present
/// and not a constant at import: a Clip whose bounds are computed).
pub fn run_time_condition(key: &str) -> Option<usize> {
    key.strip_prefix('$')?
        .strip_suffix(".run_time")?
        .parse()
        .ok()
}

/// Whether `dtype` is what a dtype condition's value names: a dtype (`"i32"`) or a category
/// (`"integer"`, `"float"`, `"bool"`).
pub fn dtype_matches(dtype: DType, want: &str) -> bool {
    match want {
        "integer" => dtype.category() == Category::Integer,
        "float" => dtype.category() == Category::Float,
        "bool" => dtype.category() == Category::Bool,
        name => dtype.name() == name,
    }
}

/// Checks a `when`/`unless` map's dtype conditions: `$N.dtype` keys need a string value that
/// names a dtype or a category, or a list of them (any of which holds); other keys (ONNX
/// attributes) take any value.
/// A `when`/`unless` condition that names no dtype condition this table can test.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ConditionError {
    #[error(
        "condition `{0}`: a `$` condition is written `$N.dtype` (the dtype of input N) or `$N.run_time` (input N is not a constant)"
    )]
    Key(String),
    #[error("condition `{0}` must be true or false")]
    Flag(String),
    #[error(
        "condition `{key}` must name a dtype or one of \"integer\", \"float\", \"bool\" (or a list of them), not {found}"
    )]
    Value { key: String, found: String },
}

fn check_conditions(
    conditions: &BTreeMap<String, ron::Value>,
) -> std::result::Result<(), ConditionError> {
    for (key, value) in conditions {
        if run_time_condition(key).is_some() {
            if !matches!(value, ron::Value::Bool(_)) {
                return Err(ConditionError::Flag(key.clone()));
            }
        } else if key.starts_with('$') {
            if dtype_condition(key).is_none() {
                return Err(ConditionError::Key(key.clone()));
            }
            let known = |s: &str| {
                ["integer", "float", "bool"].contains(&s)
                    || DType::ALL.iter().any(|d| d.name() == s)
            };
            match value {
                ron::Value::String(s) if known(s) => {}
                // Any of several dtypes or categories.
                ron::Value::Seq(items)
                    if !items.is_empty()
                        && items
                            .iter()
                            .all(|i| matches!(i, ron::Value::String(s) if known(s))) => {}
                other => {
                    return Err(ConditionError::Value {
                        key: key.clone(),
                        found: format!("{other:?}"),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The loaded table.
#[derive(Debug, Clone)]
pub struct MapTable {
    pub maps: Vec<Mapping>,
    /// The file it was read from, as errors name it.
    pub file: String,
}

impl MapTable {
    /// The embedded table (checked by the test suite, so this cannot fail in a release).
    pub fn defaults(catalogue: &Catalogue) -> MapTable {
        MapTable::load_str(DEFAULT, "rules/onnx.ron", catalogue)
            .expect("the embedded rules/onnx.ron is checked by tests")
    }

    /// Reads a table whose templates name ops of `catalogue`; `file` names it in errors.
    pub fn load_str(text: &str, file: &str, catalogue: &Catalogue) -> Result<MapTable> {
        let doc: ron_file::RonDocument<Vec<Mapping>> = ron_file::parse(text, file)?;
        // An op the catalogue lacks, or an attribute its op does not declare, would otherwise
        // surface only when a model uses that Map, as an import error about the table.
        let unknown_op = |op: &str, path: &[Step]| {
            Error::new(
                doc.site(path),
                ErrorKind::Rule(format!(
                    "op `{op}` is not in the catalogue{}",
                    crate::error::hint(
                        op,
                        catalogue
                            .ops()
                            .map(|o| o.name())
                            .chain(catalogue.composite_names())
                    )
                )),
            )
        };
        for (m, map) in doc.value.iter().enumerate() {
            // The importer handles these op types in code and never consults the table for
            // them, so a Map for one would be silently ignored: refuse it where it is written.
            if STRUCTURAL.contains(&map.onnx.as_str()) {
                return Err(Error::new(
                    doc.site(&[Step::Index(m), Step::field("onnx")]),
                    ErrorKind::Rule(format!(
                        "`{}` is handled by the importer itself (its catalogue form depends on shapes and constants known only at import), so a Map for it would never be used; the op types handled in code are {}",
                        map.onnx,
                        STRUCTURAL.join(", ")
                    )),
                ));
            }
            check_conditions(&map.when).map_err(|message| {
                Error::new(
                    doc.site(&[Step::Index(m), Step::field("when")]),
                    ErrorKind::Rule(message.to_string()),
                )
            })?;
            if let Some(op) = &map.chain
                && catalogue.declared_attrs(op).is_none()
            {
                return Err(unknown_op(op, &[Step::Index(m), Step::field("chain")]));
            }
            let mut names: Vec<&str> = Vec::new();
            for (n, node) in map.nodes.iter().enumerate() {
                let at = |field: &'static str| {
                    [
                        Step::Index(m),
                        Step::field("nodes"),
                        Step::Index(n),
                        Step::field(field),
                    ]
                };
                for (field, conditions) in [("when", &node.when), ("unless", &node.unless)] {
                    check_conditions(conditions).map_err(|message| {
                        Error::new(doc.site(&at(field)), ErrorKind::Rule(message.to_string()))
                    })?;
                }
                let Some(attrs) = catalogue.declared_attrs(&node.op) else {
                    return Err(unknown_op(&node.op, &at("op")));
                };
                if let Some(k) = node
                    .attrs
                    .keys()
                    .find(|k| !attrs.iter().any(|a| &a.name == *k))
                {
                    return Err(Error::new(
                        doc.site(&at("attrs")),
                        ErrorKind::Rule(format!("op `{}` has no attribute `{k}`", node.op)),
                    ));
                }
                for (a, written) in node.args.iter().enumerate() {
                    let known = |arg: &str| {
                        arg == "$*"
                            || arg
                                .strip_prefix('$')
                                .is_some_and(|i| i.parse::<usize>().is_ok())
                            || names.contains(&arg)
                    };
                    if let Some(arg) = written.split('|').find(|alt| !known(alt)) {
                        let mut path = at("args").to_vec();
                        path.push(Step::Index(a));
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
        Ok(MapTable {
            maps: doc.value,
            file: file.to_string(),
        })
    }

    /// The ONNX op types some Map handles.
    pub fn op_types(&self) -> std::collections::BTreeSet<&str> {
        self.maps.iter().map(|m| m.onnx.as_str()).collect()
    }

    /// Whether some Map handles `op_type`.
    pub fn knows(&self, op_type: &str) -> bool {
        self.maps.iter().any(|m| m.onnx == op_type)
    }
}
