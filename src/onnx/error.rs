//! Why a model cannot be imported, by kind: what fusebox does not import, what breaks ONNX's
//! own rules, what the rule set's op table gets wrong, and the typed errors of the protobuf
//! reader, the shape rules and the catalogue's ops beneath them.
//!
//! The kinds are what a caller acts on: a model that is beyond fusebox (an op, an attribute
//! value, a run-time shape) needs fusebox extended or the model exported differently, a
//! malformed model needs its exporter fixed, a rule-set fault needs the rules fixed. At the
//! top the importer places each error at its node and reports it as an
//! [`ErrorKind::Input`](crate::error::ErrorKind::Input) with the same text.

use super::proto::ProtoError;
use crate::error::ErrorKind;
use crate::shape::ShapeError;
use std::collections::BTreeMap;

/// Why a model, or one of its nodes, cannot be imported.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImportError {
    /// The model uses something fusebox does not import: an attribute value or input form no
    /// mapping covers, a run-time value where fusebox needs a constant (its shapes are static),
    /// an output beyond the ones fusebox produces, an integer semantics it refuses to change.
    #[error("{0}")]
    Unsupported(String),
    /// The op types (with the nodes that use each) that neither the op table nor the importer
    /// handles: the list a "what would this model need" tool reads.
    #[error("the model uses {} op type(s) fusebox cannot import:\n{}", .0.len(), op_list(.0))]
    UnsupportedOps(BTreeMap<String, Vec<String>>),
    /// The model breaks ONNX's own rules: a missing required input, an attribute of the
    /// wrong type, an index out of range, a value name defined twice, a value used before
    /// it is computed.
    #[error("{0}")]
    Malformed(String),
    /// The rule set is at fault, not the model: its op table names an op the catalogue lacks,
    /// an attribute the op does not have, a value no template node computes.
    #[error("{0}")]
    RuleSet(String),
    /// A tensor, attribute or dimension list of the model cannot be read.
    #[error(transparent)]
    Proto(#[from] ProtoError),
    /// A shape rule refused the node's shapes or axes.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A catalogue op refused the arguments or attributes the node was imported as, or
    /// evaluating it on constants failed.
    #[error(transparent)]
    Op(#[from] ErrorKind),
    /// An invariant of the importer itself broke (a shape it computed does not fit).
    #[error("{0}")]
    Internal(&'static str),
    /// `source`, at the part of the model `context` names (an initializer, a graph input or
    /// output, a constant being folded).
    #[error("{context}: {source}")]
    In {
        context: String,
        source: Box<ImportError>,
    },
}

impl ImportError {
    /// This error, at the part of the model `context` names.
    pub fn within(self, context: impl Into<String>) -> ImportError {
        ImportError::In {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The error beneath any [`ImportError::In`] contexts.
    pub fn root(&self) -> &ImportError {
        match self {
            ImportError::In { source, .. } => source.root(),
            other => other,
        }
    }

    /// Whether the model is beyond what fusebox imports rather than wrong: an unsupported
    /// op, attribute value, input form or element type.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self.root(),
            ImportError::Unsupported(_)
                | ImportError::UnsupportedOps(_)
                | ImportError::Proto(
                    ProtoError::ElementType { .. }
                        | ProtoError::AttributeType { .. }
                        | ProtoError::Segmented
                )
        )
    }
}

/// One line per op type: `  Op: node, node`.
fn op_list(missing: &BTreeMap<String, Vec<String>>) -> String {
    let lines: Vec<String> = missing
        .iter()
        .map(|(op, nodes)| format!("  {op}: {}", nodes.join(", ")))
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_keeps_the_kind_and_prefixes_the_message() {
        let e = ImportError::Proto(ProtoError::ElementType { code: 8 }).within("input `x`");
        assert_eq!(
            e.to_string(),
            "input `x`: element type STRING is not one fusebox has"
        );
        assert!(e.is_unsupported());
        let e = ImportError::Malformed("input 1 is required".into()).within("output `y`");
        assert!(!e.is_unsupported());
        assert!(matches!(e.root(), ImportError::Malformed(_)));
    }

    #[test]
    fn unsupported_ops_list_each_op_with_its_nodes() {
        let ops = BTreeMap::from([
            ("Loop".to_string(), vec!["l".to_string()]),
            (
                "com.x.Op".to_string(),
                vec!["a".to_string(), "b".to_string()],
            ),
        ]);
        assert_eq!(
            ImportError::UnsupportedOps(ops).to_string(),
            "the model uses 2 op type(s) fusebox cannot import:\n  Loop: l\n  com.x.Op: a, b"
        );
    }
}
