//! Rule files: everything a user may change about fusebox is data, read from RON.

pub mod amp;
pub mod aten;
pub mod builtin;
pub mod composite;
pub mod cost;
pub mod fusion;
pub mod gradients;
pub mod onnx;
pub mod ops;
pub mod ron_file;
pub mod set;

pub use amp::{AmpRules, Conditional, Policy, Treatment};
pub use builtin::{Builtin, BuiltinAttr, BuiltinAttrs};
pub use composite::{BodyArg, BodyAttr, Composite};
pub use cost::{CostModel, Primitive, Profile, Reads, Reductions};
pub use fusion::{FusionRules, Role, RowArithmetic};
pub use gradients::GradientRules;
pub use onnx::MapTable;
pub use ops::{Catalogue, DtypeClass, DtypeRule, OpDef, OpKind, OpSpec, Semantics};
pub use set::RuleSet;
