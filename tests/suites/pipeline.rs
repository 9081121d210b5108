//! The tests of the pipeline's front half: graph and model files, rule files, rewrites and
//! their soundness checks, AMP, autodiff, extraction and the CLI's errors. Each file under
//! `tests/` is one module here: one test binary links the crate once for all of them, where
//! one binary per file linked it forty times and made CI's test build most of its run.

#[path = "../common/mod.rs"]
mod common;

#[path = "../amp.rs"]
mod amp;
#[path = "../amp_optimize.rs"]
mod amp_optimize;
#[path = "../architecture.rs"]
mod architecture;
#[path = "../aten_import.rs"]
mod aten_import;
#[path = "../autodiff.rs"]
mod autodiff;
#[path = "../builtin_ops.rs"]
mod builtin_ops;
#[path = "../check_rules.rs"]
mod check_rules;
#[path = "../cli_hardening.rs"]
mod cli_hardening;
#[path = "../composites.rs"]
mod composites;
#[path = "../custom_op.rs"]
mod custom_op;
#[path = "../derivatives.rs"]
mod derivatives;
#[path = "../errors.rs"]
mod errors;
#[path = "../extract_gap.rs"]
mod extract_gap;
#[path = "../fusion_rules.rs"]
mod fusion_rules;
#[path = "../fuzz_loaders.rs"]
mod fuzz_loaders;
#[path = "../graph_format.rs"]
mod graph_format;
#[path = "../limits.rs"]
mod limits;
#[path = "../onnx.rs"]
mod onnx;
#[path = "../onnx_conformance.rs"]
mod onnx_conformance;
#[path = "../onnx_pairwise.rs"]
mod onnx_pairwise;
#[path = "../op_values.rs"]
mod op_values;
#[path = "../optimize.rs"]
mod optimize;
#[path = "../optimize_cli.rs"]
mod optimize_cli;
#[path = "../red_team.rs"]
mod red_team;
#[path = "../redefined_ops.rs"]
mod redefined_ops;
#[path = "../rewrite_rules.rs"]
mod rewrite_rules;
