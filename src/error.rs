//! Typed errors that always say where: a file with line and column, a node, or both.
//!
//! Users write graphs and rule files by hand, so an error that cannot be located is nearly
//! useless. Every loader error carries a [`Site`] with a file position; errors about graphs built
//! through the Rust API name the node instead. An ONNX model is protobuf, with no lines to
//! point into: its errors name the model file and the node with its op type.

use crate::span::Position;
use std::fmt;

/// Where a problem is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Site {
    /// The file the problem is in, as the user named it.
    pub file: Option<String>,
    /// Line and column inside `file`.
    pub position: Option<Position>,
    /// The graph node the problem concerns.
    pub node: Option<String>,
    /// The rule-file op the problem concerns.
    pub op: Option<String>,
    /// The op type of `node` where the node is not a fusebox graph node (an ONNX node, whose
    /// op type is how a user finds it in a model viewer): shown with the node.
    pub node_op: Option<String>,
}

impl Site {
    pub fn file(file: &str, position: Position) -> Site {
        Site {
            file: Some(file.to_string()),
            position: Some(position),
            ..Site::default()
        }
    }

    /// A problem with a file as a whole (it cannot be read, it should not be there): reported
    /// at its first character so that every file error still has a position.
    pub fn whole_file(file: &str) -> Site {
        Site::file(file, Position { line: 1, column: 1 })
    }

    /// A file without lines and columns (an ONNX model, which is protobuf): named alone.
    pub fn model(file: &str) -> Site {
        Site {
            file: Some(file.to_string()),
            ..Site::default()
        }
    }

    pub fn node(node: &str) -> Site {
        Site {
            node: Some(node.to_string()),
            ..Site::default()
        }
    }

    pub fn with_node(mut self, node: &str) -> Site {
        self.node = Some(node.to_string());
        self
    }

    /// Names the node and its op type, `node `/chunk/Div` (Div)`: an ONNX node.
    pub fn with_node_op(mut self, node: &str, op_type: &str) -> Site {
        self.node = Some(node.to_string());
        self.node_op = Some(op_type.to_string());
        self
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        match (&self.file, self.position) {
            (Some(file), Some(p)) => parts.push(format!("{file}:{}:{}", p.line, p.column)),
            (Some(file), None) => parts.push(file.clone()),
            (None, Some(p)) => parts.push(format!("{}:{}", p.line, p.column)),
            (None, None) => {}
        }
        match (&self.node, &self.node_op) {
            (Some(node), Some(op)) => parts.push(format!("node `{node}` ({op})")),
            (Some(node), None) => parts.push(format!("node `{node}`")),
            (None, _) => {}
        }
        if let Some(op) = &self.op {
            parts.push(format!("op `{op}`"));
        }
        f.write_str(&parts.join(": "))
    }
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ErrorKind {
    #[error("RON syntax: {0}")]
    Syntax(String),
    #[error("cannot read `{path}`: {message}")]
    Io { path: String, message: String },
    /// A file (or standard output) fusebox was asked to write could not be written. No file
    /// position: the file is fusebox's output, not input it read.
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
    #[error("unknown op `{op}`{}", did_you_mean(suggestion))]
    UnknownOp {
        op: String,
        suggestion: Option<String>,
    },
    #[error("op `{op}` takes {expected} argument(s), got {got}")]
    Arity {
        op: String,
        expected: String,
        got: usize,
    },
    #[error("op `{op}` needs attribute `{attr}`")]
    MissingAttr { op: String, attr: String },
    #[error("op `{op}` has no attribute `{attr}`{}", did_you_mean(suggestion))]
    UnknownAttr {
        op: String,
        attr: String,
        suggestion: Option<String>,
    },
    #[error("attribute `{attr}` must be {expected}, found {found}")]
    AttrType {
        attr: String,
        expected: String,
        found: String,
    },
    #[error(
        "`{name}` is not a graph input or an earlier node{}",
        did_you_mean(suggestion)
    )]
    UnknownName {
        name: String,
        suggestion: Option<String>,
    },
    #[error(
        "`{name}` is used before it is defined (it is defined later, as node {index}): args must name inputs or earlier nodes"
    )]
    UseBeforeDefinition { name: String, index: usize },
    #[error("cycle: node `{name}` depends on itself")]
    Cycle { name: String },
    #[error("duplicate name `{name}`")]
    Duplicate { name: String },
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("dtype mismatch: {0}")]
    DType(String),
    #[error("formula `{formula}`: {message}")]
    Formula { formula: String, message: String },
    #[error("invalid rule: {0}")]
    Rule(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("evaluation failed: {0}")]
    Eval(String),
    /// The lowering could not turn a partition into kernels (an internal invariant broke).
    #[error("lowering: {0}")]
    Lower(String),
    /// A kernel backend failed: the C compiler, loading a library, a cache directory.
    #[error("backend: {0}")]
    Backend(String),
    /// A report or a graph could not be turned into text.
    #[error("cannot write {what} as text: {message}")]
    Serialize { what: String, message: String },
}

fn did_you_mean(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    }
}

/// A located error.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    /// Boxed so that `Result<T, Error>` stays small on the success path.
    pub site: Box<Site>,
    pub kind: ErrorKind,
}

impl Error {
    pub fn new(site: Site, kind: ErrorKind) -> Error {
        Error {
            site: Box::new(site),
            kind,
        }
    }

    pub fn at_node(node: &str, kind: ErrorKind) -> Error {
        Error::new(Site::node(node), kind)
    }

    /// A backend failure (the C compiler, a CUDA call, a cache directory) with no better site
    /// than the whole run.
    pub fn backend(message: impl Into<String>) -> Error {
        Error::new(Site::default(), ErrorKind::Backend(message.into()))
    }

    /// A request that cannot be met as given (a flag combination, a missing or ill-formed
    /// input value), not tied to a place in a file.
    pub fn input(message: impl Into<String>) -> Error {
        Error::new(Site::default(), ErrorKind::Input(message.into()))
    }

    /// Writing `path` (an output file, the kernel cache, `standard output`) failed.
    pub fn write(path: impl fmt::Display, message: impl fmt::Display) -> Error {
        Error::new(
            Site::default(),
            ErrorKind::Write {
                path: path.to_string(),
                message: message.to_string(),
            },
        )
    }

    /// `what` (a report, a graph) could not be serialized.
    pub fn serialize(what: &str, error: impl fmt::Display) -> Error {
        Error::new(
            Site::default(),
            ErrorKind::Serialize {
                what: what.to_string(),
                message: error.to_string(),
            },
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let site = self.site.to_string();
        if site.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{site}: {}", self.kind)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `" (did you mean `x`?)"` when a candidate is close to `name`, else the empty string: the
/// tail every "unknown name" message ends with.
pub fn hint<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    did_you_mean(&suggest(name, candidates))
}

/// The candidate closest to `name`, if it is close enough to be a plausible typo.
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_pick_close_names_only() {
        let ops = ["sigmoid", "sum", "sub", "silu"];
        assert_eq!(suggest("sigmod", ops), Some("sigmoid".into()));
        assert_eq!(suggest("matmul", ops), None);
    }

    #[test]
    fn display_names_file_position_and_node() {
        let e = Error::new(
            Site::file("g.ron", Position { line: 3, column: 7 }).with_node("t"),
            ErrorKind::UnknownOp {
                op: "sigmod".into(),
                suggestion: Some("sigmoid".into()),
            },
        );
        assert_eq!(
            e.to_string(),
            "g.ron:3:7: node `t`: unknown op `sigmod` (did you mean `sigmoid`?)"
        );
    }

    #[test]
    fn an_onnx_site_names_the_model_and_the_node_with_its_op_type_but_no_position() {
        let e = Error::new(
            Site::model("m.onnx").with_node_op("/chunk/Div", "Div"),
            ErrorKind::Input("no".into()),
        );
        assert_eq!(
            e.to_string(),
            "m.onnx: node `/chunk/Div` (Div): invalid input: no"
        );
    }
}
