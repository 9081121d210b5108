//! The ATen op table (`rules/aten.ron`): how the core ATen ops of a `torch.compile` graph are
//! spelled as ONNX nodes, which the ONNX table (`rules/onnx.ron`) then turns into catalogue
//! ops. One layer of meaning serves both front ends: an ATen op means what its ONNX spelling
//! means, and that is written once.
//!
//! Loading checks what would otherwise surface only when a graph uses an entry: every ONNX op
//! a template names is one the ONNX importer handles (a Map of the ONNX table or an op it
//! handles in code), every reference is well formed, and every node input names an argument
//! or an earlier node.

use crate::error::{Error, ErrorKind, Result};
use crate::rules::onnx::{MapTable, STRUCTURAL};
use crate::rules::ron_file;
use crate::span::Step;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The table embedded in the binary.
pub const DEFAULT: &str = include_str!("../../rules/aten.ron");

/// How the tensor operands of an entry are brought to one dtype before its ONNX nodes, which
/// (unlike ATen) require their operands to agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Promote {
    /// Operands are used as they are.
    #[default]
    None,
    /// Every tensor operand is cast to the dtype of the node's (first) output, and a number
    /// becomes a constant of it: arithmetic, whose result dtype is the operands' common one.
    Out,
    /// Every tensor operand is cast to the operands' common dtype under PyTorch's promotion
    /// (which the front end computes and sends), and a number becomes a constant of it:
    /// comparisons, whose result is bool.
    Common,
}

/// One ATen op (an overload, as `str(node.target)` names it: `aten.add.Tensor`) and the ONNX
/// nodes it becomes.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "Aten", deny_unknown_fields)]
pub struct AtenMap {
    pub op: String,
    /// Argument values this entry applies to (a number, a bool, a string, or `()` for an
    /// argument left as None).
    #[serde(default)]
    pub when: BTreeMap<String, ron::Value>,
    /// Argument values this entry does not apply to: it is left out when every one holds.
    #[serde(default)]
    pub unless: BTreeMap<String, ron::Value>,
    #[serde(default)]
    pub promote: Promote,
    /// How many of the op's outputs the nodes compute (the last node's first ones); a graph
    /// that reads a further output keeps the op in PyTorch.
    #[serde(default = "one")]
    pub outputs: usize,
    pub nodes: Vec<OnnxTemplate>,
}

fn one() -> usize {
    1
}

/// One ONNX node of an entry. Its inputs are references (see the table's header), its
/// attributes literal values or references.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "Onnx", deny_unknown_fields)]
pub struct OnnxTemplate {
    #[serde(default)]
    pub name: Option<String>,
    pub op: String,
    #[serde(default)]
    pub inputs: Vec<String>,
    #[serde(default)]
    pub attrs: BTreeMap<String, ron::Value>,
    /// Kept only when every one of these argument values holds.
    #[serde(default)]
    pub when: BTreeMap<String, ron::Value>,
    /// Left out when every one of these holds; a node left out stands for its first input.
    #[serde(default)]
    pub unless: BTreeMap<String, ron::Value>,
}

/// The forms a reference takes after `$NAME`: what an argument is turned into.
pub const FORMS: [&str; 7] = [
    "i64",      // an int or a list of ints as a 1-D int64 constant
    "scalar",   // an int as a 0-D int64 constant
    "shape",    // a tensor argument's shape (or `$out.shape`, the output's) as a 1-D int64 constant
    "dtype",    // (attributes) a dtype argument, or `$out.dtype`, as an ONNX type code
    "positive", // (attributes) axes, each made non-negative by the rank of the first operand
    "twice",    // (attributes) a list written twice: per-axis pads as ONNX's begins and ends
    "axis",     // (attributes) `$list.axis`: minus the list's length (a trailing-axes axis)
];

/// The loaded table.
#[derive(Debug, Clone)]
pub struct AtenTable {
    pub maps: Vec<AtenMap>,
    /// The file it was read from, as errors name it.
    pub file: String,
}

impl AtenTable {
    /// The embedded table, with only the entries whose ONNX ops `onnx` handles (a rule
    /// directory's own `onnx.ron` may leave some out: those ATen ops then stay in PyTorch).
    pub fn defaults(onnx: &MapTable) -> AtenTable {
        let doc: ron_file::RonDocument<Vec<AtenMap>> = ron_file::parse(DEFAULT, "rules/aten.ron")
            .expect("the embedded rules/aten.ron is checked by tests");
        let mut maps = doc.value;
        maps.retain(|m| {
            m.nodes
                .iter()
                .all(|n| onnx.knows(&n.op) || STRUCTURAL.contains(&n.op.as_str()))
        });
        AtenTable {
            maps,
            file: "rules/aten.ron".to_string(),
        }
    }

    /// Reads a table whose templates name ONNX ops the importer handles with `onnx`; `file`
    /// names it in errors.
    pub fn load_str(text: &str, file: &str, onnx: &MapTable) -> Result<AtenTable> {
        let doc: ron_file::RonDocument<Vec<AtenMap>> = ron_file::parse(text, file)?;
        let fail =
            |path: &[Step], message: String| Error::new(doc.site(path), ErrorKind::Rule(message));
        for (m, map) in doc.value.iter().enumerate() {
            if map.nodes.is_empty() {
                return Err(fail(
                    &[Step::Index(m), Step::field("nodes")],
                    format!("{}: an entry needs at least one node", map.op),
                ));
            }
            if map.outputs == 0 {
                return Err(fail(
                    &[Step::Index(m), Step::field("outputs")],
                    format!("{}: an entry computes at least one output", map.op),
                ));
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
                if !onnx.knows(&node.op) && !STRUCTURAL.contains(&node.op.as_str()) {
                    return Err(fail(
                        &at("op"),
                        format!(
                            "{}: `{}` is not an ONNX op the importer handles{}",
                            map.op,
                            node.op,
                            crate::error::hint(
                                &node.op,
                                onnx.op_types().into_iter().chain(STRUCTURAL)
                            )
                        ),
                    ));
                }
                for (i, written) in node.inputs.iter().enumerate() {
                    if let Err(message) = check_reference(written, &names) {
                        let mut path = at("inputs").to_vec();
                        path.push(Step::Index(i));
                        return Err(fail(&path, format!("{}: {message}", map.op)));
                    }
                }
                for (key, value) in &node.attrs {
                    if let ron::Value::String(written) = value
                        && written.starts_with('$')
                        && let Err(message) = check_reference(written, &[])
                    {
                        return Err(fail(
                            &at("attrs"),
                            format!("{}: attribute `{key}`: {message}", map.op),
                        ));
                    }
                }
                if let Some(name) = &node.name {
                    names.push(name);
                }
            }
        }
        Ok(AtenTable {
            maps: doc.value,
            file: file.to_string(),
        })
    }

    /// The entries for `op`, in the table's order (the first whose conditions hold is used).
    pub fn entries(&self, op: &str) -> Vec<&AtenMap> {
        self.maps.iter().filter(|m| m.op == op).collect()
    }

    /// The ATen ops some entry handles.
    pub fn op_names(&self) -> std::collections::BTreeSet<&str> {
        self.maps.iter().map(|m| m.op.as_str()).collect()
    }
}

/// A reference split into its argument name, its form (after the first `.`) and its fallback
/// (after `|`): `"$start.i64|0"` is `("start", Some("i64"), Some("0"))`. A bare name (an
/// earlier node) or `""` (an absent optional input) has no `$`.
pub fn split_reference(written: &str) -> Option<(&str, Option<&str>, Option<&str>)> {
    let (main, fallback) = match written.split_once('|') {
        Some((m, f)) => (m, Some(f)),
        None => (written, None),
    };
    let main = main.strip_prefix('$')?;
    Some(match main.split_once('.') {
        Some((name, form)) => (name, Some(form), fallback),
        None => (main, None, fallback),
    })
}

/// Why `written` is not a reference a template may use, given the earlier nodes' `names`.
fn check_reference(written: &str, names: &[&str]) -> std::result::Result<(), String> {
    let literal = written.parse::<f64>().is_ok()
        || written
            .strip_suffix(".i64")
            .is_some_and(|i| i.parse::<i64>().is_ok());
    if written.is_empty() || names.contains(&written) || literal {
        return Ok(());
    }
    let Some((name, form, fallback)) = split_reference(written) else {
        return Err(format!(
            "`{written}` is neither an argument ($NAME) nor an earlier node"
        ));
    };
    if name.is_empty() {
        return Err(format!("`{written}` names no argument"));
    }
    if let Some(form) = form
        && !FORMS.contains(&form)
    {
        return Err(format!(
            "`{written}`: `.{form}` is not a form of a reference (one of {})",
            FORMS.join(", ")
        ));
    }
    if let Some(fallback) = fallback
        && fallback.parse::<f64>().is_err()
        && fallback.strip_prefix('$').is_none_or(str::is_empty)
    {
        return Err(format!(
            "`{written}`: the fallback `{fallback}` is neither a number nor an argument ($NAME)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Catalogue;

    #[test]
    fn the_embedded_table_names_only_onnx_ops_the_importer_handles() {
        let onnx = MapTable::defaults(&Catalogue::defaults());
        let checked = AtenTable::load_str(DEFAULT, "rules/aten.ron", &onnx).unwrap();
        assert_eq!(checked.maps.len(), AtenTable::defaults(&onnx).maps.len());
    }

    #[test]
    fn a_table_naming_an_unknown_onnx_op_or_reference_is_refused_where_written() {
        let onnx = MapTable::defaults(&Catalogue::defaults());
        let unknown =
            r#"[Aten(op: "aten.relu.default", nodes: [Onnx(op: "Rectify", inputs: ["$self"])])]"#;
        let e = AtenTable::load_str(unknown, "a.ron", &onnx)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a.ron:1:") && e.contains("`Rectify` is not an ONNX op"),
            "{e}"
        );
        let form =
            r#"[Aten(op: "aten.relu.default", nodes: [Onnx(op: "Relu", inputs: ["$self.wide"])])]"#;
        let e = AtenTable::load_str(form, "a.ron", &onnx)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`.wide` is not a form"), "{e}");
        let later = r#"[Aten(op: "aten.relu.default", nodes: [Onnx(op: "Relu", inputs: ["y"]), Onnx(name: "y", op: "Relu", inputs: ["$self"])])]"#;
        let e = AtenTable::load_str(later, "a.ron", &onnx)
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither an argument"), "{e}");
    }
}
