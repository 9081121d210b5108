//! fusebox optimizes tensor computation graphs by equality saturation, with every op, casting
//! policy, fusion rule and rewrite written as data in RON rule files.
//!
//! The modules follow the data flow (the book's architecture chapter has one line per module
//! and which may use which, checked by `tests/architecture.rs`):
//!
//! - foundations: [`dtype`], [`shape`], [`span`], [`formula`], [`attr`], [`error`], [`tensor`];
//! - the rules as data: [`rules`] (op catalogue, AMP policies, fusion legality, cost profiles,
//!   and [`rules::RuleSet`], a rule directory over the embedded defaults);
//! - the graph and its oracle: [`graph`] (IR, file format, checker), [`eval`] (the reference
//!   evaluator every later stage is tested against), [`amp`] (cast insertion), [`dag`];
//! - the optimizer: [`egraph`], [`rewrite`], [`saturate`], [`extract`], [`hoist`] (what the
//!   weights alone determine, computed once), [`partition`], joined by
//!   [`optimize`], the one pipeline entry, and described by [`explain`];
//! - code: [`lower`] (the size-free kernel IR), [`runtime`] (host buffers, memory plan, reference
//!   matmul, IR interpreter), [`backend`] (the `Target`/`Executable` boundary, with the
//!   [`backend::cpu`] and [`backend::cuda`] backends);
//! - on top: [`runner`] (compile and time for any backend), [`model`] (load, compile and run a
//!   whole model by name: the one path for library users, with a runnable example) and [`cli`].

pub mod amp;
pub mod aten;
pub mod attr;
pub mod autodiff;
pub mod backend;
pub mod cli;
pub mod dag;
pub mod dtype;
pub mod egraph;
pub mod error;
pub mod eval;
pub mod explain;
pub mod extract;
pub mod file_limits;
pub mod formula;
pub mod graph;
pub mod hoist;
pub mod lower;
pub mod model;
pub mod onnx;
pub mod optimize;
pub mod partition;
pub mod rewrite;
pub mod rule_check;
pub mod rules;
pub mod runner;
pub mod runtime;
pub mod saturate;
pub mod shape;
pub mod span;
pub mod tensor;

pub use error::{Error, ErrorKind, Result};
