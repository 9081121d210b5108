//! `fusebox ops`: the op catalogue, one row per op (built-in, formula or composite).

use super::check::table;
use super::{OpsArgs, load_rules};
use crate::error::Result;
use crate::rules::RuleSet;

/// `ops`: the catalogue of the rule set `--rules` lays over the defaults.
pub(super) fn ops(args: &OpsArgs) -> Result<String> {
    let rules = load_rules(args.rules.as_deref())?;
    Ok(list_ops(&rules))
}

/// One row per op: name, kind, operands, and its formula (or the built-in it is, or a
/// composite's parts).
fn list_ops(rules: &RuleSet) -> String {
    let rows: Vec<[String; 4]> = rules
        .ops
        .ops()
        .map(|op| {
            let what = match op.formula() {
                Some(f) => f.to_string(),
                None => format!("builtin {}", op.builtin().map(|b| b.name()).unwrap_or("?")),
            };
            [
                op.name().to_string(),
                format!("{:?}", op.kind()).to_lowercase(),
                format!("({})", op.spec.operands.join(", ")),
                what,
            ]
        })
        .collect();
    let composites = rules.ops.composites().map(|c| {
        let parts: Vec<&str> = c.body.iter().map(|n| n.op.as_str()).collect();
        [
            c.name().to_string(),
            "composite".to_string(),
            format!("({})", c.spec.operands.join(", ")),
            parts.join(" → "),
        ]
    });
    let rows: Vec<[String; 4]> = rows.into_iter().chain(composites).collect();
    table(&rows)
}
