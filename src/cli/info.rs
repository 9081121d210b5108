//! `fusebox info`: the version, the embedded rules and the CUDA libraries found.

use crate::rules::RuleSet;

/// The version, the rules, and where the CUDA libraries were found (or what is missing and
/// how to get it); the probes load libraries but never touch a GPU.
pub(super) fn info() -> String {
    let rules = RuleSet::defaults();
    format!(
        "fusebox {}\nembedded rules: {} ops\n{}",
        env!("CARGO_PKG_VERSION"),
        rules.ops.len(),
        crate::backend::cuda::libs::describe()
    )
}
