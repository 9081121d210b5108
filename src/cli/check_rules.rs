//! `fusebox check-rules`: the report of [`crate::rule_check`], printed as text or JSON. What
//! is checked, and what counts as a failure, is computed there; this file only renders it.

use super::{CheckRulesArgs, load_rules, stdout_error, terminal};
use crate::autodiff::verify::{DerivativeCheck, TemplateReport};
use crate::error::{Error, ErrorKind, Result, Site};
use crate::rule_check::{COMPOSITE_TOLERANCE, CompositeCheck, CompositeOutcome, RuleSetCheck};
use std::fmt::Write as _;

/// `fusebox check-rules`: the report goes to stdout whatever the outcome, so a person (or a
/// JSON reader) sees every counterexample; an unsound rule also makes the command fail, with
/// the rules and their files named on stderr, so CI stops on it.
pub(super) fn check_rules(args: &CheckRulesArgs) -> Result<String> {
    let set = load_rules(args.rules.as_deref())?;
    let check = RuleSetCheck::run(&set, args.seed, args.instances);
    let file = &check.gradients_file;
    let text = if args.json {
        let mut value = check.rewrites.to_json();
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "gradient_templates".into(),
                templates_json(&check.templates, file),
            );
            object.insert("derivatives".into(), derivatives_json(&check.derivatives));
            object.insert("composites".into(), composites_json(&check.composites));
            object.insert(
                "onnx_table".into(),
                serde_json::json!({
                    "file": set.onnx.file,
                    "maps": set.onnx.maps.len(),
                    "op_types": set.onnx.op_types().len(),
                }),
            );
        }
        let mut t = serde_json::to_string_pretty(&value).expect("JSON values print");
        t.push('\n');
        t
    } else {
        check.rewrites.render()
            + &render_templates(&check.templates, file)
            + &render_derivatives(&check.derivatives)
            + &render_composites(&check.composites)
            + &render_onnx_table(&set.onnx)
    };
    let failures = check.failures();
    if failures.is_empty() {
        return Ok(text);
    }
    // The report goes out before the error; a reader that went away is no reason to hide
    // the failures from stderr.
    if let Err(e) = terminal::print(&text) {
        return Err(stdout_error(&e));
    }
    Err(Error::new(
        Site::default(),
        ErrorKind::Rule(failures.join("; ")),
    ))
}

/// The ONNX op table was checked as it loaded (every template op and attribute is in the
/// catalogue, every arg names an input or an earlier node); the report says which table.
fn render_onnx_table(table: &crate::rules::MapTable) -> String {
    format!(
        "check-rules: {}: {} Maps for {} ONNX op types, every template op and attribute in the catalogue\n",
        table.file,
        table.maps.len(),
        table.op_types().len()
    )
}

/// The composite part of `check-rules`: a line per wrong or unchecked composite, then a
/// summary.
fn render_composites(checks: &[CompositeCheck]) -> String {
    let mut out = String::new();
    let mut worst: f64 = 0.0;
    let (mut agree, mut wrong, mut unchecked) = (0, 0, 0);
    for check in checks {
        match &check.outcome {
            CompositeOutcome::Gradient(e) if *e <= COMPOSITE_TOLERANCE => {
                agree += 1;
                worst = worst.max(*e);
            }
            CompositeOutcome::Gradient(e) => {
                wrong += 1;
                let _ = writeln!(
                    out,
                    "WRONG GRADIENT: composite `{}`: relative error {e:.3e} against finite differences (tolerance {COMPOSITE_TOLERANCE:.0e})",
                    check.name
                );
            }
            CompositeOutcome::Unchecked(why) => {
                unchecked += 1;
                let _ = writeln!(out, "UNCHECKED: composite `{}`: {why}", check.name);
            }
        }
    }
    let _ = writeln!(
        out,
        "check-rules: {} composite ops expanded and differentiated through their parts in f64: {agree} agree with finite differences (worst relative error {worst:.1e}), {wrong} wrong, {unchecked} unchecked",
        checks.len()
    );
    out
}

/// The derivative part of `check-rules`: a line per wrong or unchecked derivative, with the
/// point that shows it, then a summary.
fn render_derivatives(checks: &[DerivativeCheck]) -> String {
    use crate::autodiff::verify::{DERIVATIVE_TOLERANCE, DerivativeOutcome};
    let mut out = String::new();
    let (mut agree, mut points, mut worst) = (0, 0, 0.0f64);
    for check in checks {
        match &check.outcome {
            DerivativeOutcome::Agrees {
                points: n,
                worst: w,
            } => {
                agree += 1;
                points += n;
                worst = worst.max(*w);
            }
            DerivativeOutcome::Wrong {
                at,
                g,
                analytic,
                numeric,
            } => {
                let values: Vec<String> = at.iter().map(|(n, v)| format!("{n} = {v}")).collect();
                let _ = writeln!(
                    out,
                    "WRONG DERIVATIVE: op `{}`, operand `{}`: `{}` gives {analytic} but central differences give {numeric}, at {}, g = {g} (tolerance {DERIVATIVE_TOLERANCE:.0e})",
                    check.op,
                    check.operand,
                    check.formula,
                    values.join(", ")
                );
            }
            DerivativeOutcome::Unchecked(why) => {
                let _ = writeln!(
                    out,
                    "UNCHECKED DERIVATIVE: op `{}`, operand `{}`: {why}",
                    check.op, check.operand
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "check-rules: {} derivative formulas of pointwise ops against central differences of their formulas in f64: {agree} agree at {points} points (worst relative error {worst:.1e}), {} wrong or unchecked",
        checks.len(),
        checks.len() - agree
    );
    out
}

/// The derivative part of `check-rules --json`.
fn derivatives_json(checks: &[DerivativeCheck]) -> serde_json::Value {
    use crate::autodiff::verify::{DERIVATIVE_TOLERANCE, DerivativeOutcome};
    let list: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| {
            let mut v = serde_json::json!({"op": c.op, "operand": c.operand, "formula": c.formula, "agrees": c.passed()});
            match &c.outcome {
                DerivativeOutcome::Agrees { points, worst } => {
                    v["points"] = (*points).into();
                    v["relative_error"] = (*worst).into();
                }
                DerivativeOutcome::Wrong { at, g, analytic, numeric } => {
                    let at: serde_json::Map<String, serde_json::Value> =
                        at.iter().map(|(n, x)| (n.clone(), (*x).into())).collect();
                    v["counterexample"] = serde_json::json!({"at": at, "g": g, "analytic": analytic, "numeric": numeric});
                }
                DerivativeOutcome::Unchecked(why) => v["unchecked"] = why.clone().into(),
            }
            v
        })
        .collect();
    serde_json::json!({"tolerance": DERIVATIVE_TOLERANCE, "checks": list})
}

/// The composite part of `check-rules --json`.
fn composites_json(checks: &[CompositeCheck]) -> serde_json::Value {
    let list: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| match &c.outcome {
            CompositeOutcome::Gradient(e) => serde_json::json!({"composite": c.name, "relative_error": e, "agrees": *e <= COMPOSITE_TOLERANCE}),
            CompositeOutcome::Unchecked(why) => serde_json::json!({"composite": c.name, "unchecked": why}),
        })
        .collect();
    serde_json::json!({"tolerance": COMPOSITE_TOLERANCE, "checks": list})
}

/// The gradient-template part of `check-rules`: a line per failing instance or unchecked
/// template, then a summary.
fn render_templates(report: &TemplateReport, file: &str) -> String {
    let mut out = String::new();
    let mut worst: f64 = 0.0;
    let mut failing = 0;
    for check in &report.instances {
        match &check.outcome {
            Ok(e) if *e <= report.tolerance => worst = worst.max(*e),
            Ok(e) => {
                failing += 1;
                let _ = writeln!(
                    out,
                    "WRONG GRADIENT: {}: relative error {e:.3e} against finite differences (tolerance {:.0e})",
                    check.instance, report.tolerance
                );
            }
            Err(why) => {
                failing += 1;
                let _ = writeln!(out, "WRONG GRADIENT: {}: {why}", check.instance);
            }
        }
    }
    for (op, operand, index) in &report.unused {
        let _ = writeln!(
            out,
            "UNCHECKED: gradient template {} (`{op}`, operand `{operand}`): no check instance uses it",
            index + 1
        );
    }
    let _ = writeln!(
        out,
        "check-rules: {} gradient checks of {file} in f64: {} agree with finite differences (worst relative error {worst:.1e}), {failing} wrong, {} templates unchecked",
        report.instances.len(),
        report.instances.len() - failing,
        report.unused.len()
    );
    out
}

/// The gradient-template part of `check-rules --json`.
fn templates_json(report: &TemplateReport, file: &str) -> serde_json::Value {
    let instances: Vec<serde_json::Value> = report
        .instances
        .iter()
        .map(|c| match &c.outcome {
            Ok(e) => serde_json::json!({"instance": c.instance, "relative_error": e, "agrees": *e <= report.tolerance}),
            Err(why) => serde_json::json!({"instance": c.instance, "error": why.to_string(), "agrees": false}),
        })
        .collect();
    let unused: Vec<serde_json::Value> = report
        .unused
        .iter()
        .map(|(op, operand, index)| serde_json::json!({"template": index + 1, "op": op, "operand": operand}))
        .collect();
    serde_json::json!({
        "file": file,
        "tolerance": report.tolerance,
        "instances": instances,
        "unchecked": unused,
        "passed": report.passed(),
    })
}
