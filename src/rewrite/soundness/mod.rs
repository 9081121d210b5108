//! `fusebox check-rules`: tests every rewrite rule on random instances and reports the unsound
//! ones with a concrete counterexample.
//!
//! A rewrite rule claims that wherever its left-hand side matches and its conditions hold, the
//! right-hand side computes the same tensor. Saturation trusts that claim completely: one wrong
//! rule silently corrupts every graph it touches. So each rule (and each direction of a
//! bidirectional one) is tried on many random instances:
//!
//! 1. **Instance.** Every tensor variable gets a dtype and a shape, every attribute variable a
//!    value of its declared type. Dtypes are mostly shared within an instance; shapes come from
//!    a small pool around a random base shape (`[2, 3]` gives `[2, 3]`, `[1, 3]`, `[2, 1]`,
//!    `[3]`, `[]`, …), with the empty and all-ones cases now and then. A variable the conditions
//!    want constant (`ConstEq`, `IsConst`, …) is bound to a `const` node, broadcast when it is
//!    not a scalar. The conditions steer the draw (a `ConstEq("?one", 1.0)` makes `?one` a
//!    constant 1 most of the time) but never decide it.
//! 2. **Matching, exactly as `optimize` does.** The left-hand side is built as a real graph, type
//!    checked (an ill-typed draw is discarded), seeded into an e-graph with the same
//!    [`new_egraph`]/[`seed`] the optimizer uses, and the rule's own pattern is searched in the
//!    root class. The conditions are then decided by [`Rule::conditions_hold`] on that match:
//!    the very code that guards the rule during saturation, so a condition that is too weak is
//!    caught, not re-implemented.
//! 3. **Evaluation.** The right-hand side is built from the same bindings and both sides are
//!    run by the reference evaluator on random values: ordinary ones, then zeros of both signs,
//!    ±1, ½ and 2, then tiny (subnormal) and huge (near the dtype's maximum) magnitudes, then
//!    ±Inf and NaN.
//! 4. **Comparison.** Same dtype and shape (else the rule is not type-preserving; an ill-typed
//!    right-hand side under satisfied conditions counts too), NaN in the same places, infinities
//!    equal, finite values equal within a tolerance that scales with the magnitudes involved, and
//!    the sign of an exact zero preserved. See `Comparison` (in the source) for the tolerance and why.
//!
//! A failure is then made readable: among the first few failing instances the smallest is kept,
//! and its input elements are replaced one by one with simple values (0, 1, −1, 2, ½) as long as
//! the rule still fails, so a counterexample usually reads like `a = [1], b = [1]`.
//!
//! Everything is drawn from a seeded ChaCha stream per rule and direction, so a report is
//! reproducible from `--seed` and does not change when other rules are added.

use super::{Condition, Rule, VarKind};
use crate::attr::AttrType;
use crate::dag::Dag;
use crate::dtype::{Category, DType};
use crate::egraph::analysis::split_children;
use crate::egraph::{ENode, FuseGraph, Leaf, new_egraph, seed};
use crate::eval::{self, Tensors};
use crate::graph::{Graph, Input, Node, TensorType, check};
use crate::rules::{Builtin, Catalogue, DtypeClass, OpKind};
use crate::shape::{Shape, broadcasts_to, numel};
use crate::tensor::{Data, Tensor};
use egg::{ENodeOrVar, Pattern, Searcher, Subst, Var};
use ndarray::{ArrayD, Dimension, IxDyn};
use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};

mod build;
mod instance;
mod values;

use build::*;
use instance::*;
use values::*;

/// How hard to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    pub seed: u64,
    /// Instances (dtypes, shapes and attribute values satisfying the conditions) per rule and
    /// direction.
    pub instances: usize,
    /// Random value sets evaluated per instance; they cycle through the value flavours
    /// (ordinary, special, extreme, non-finite), so 4 or more covers each.
    pub values_per_instance: usize,
    /// Draws allowed per wanted instance before a rule whose conditions are rarely met gives
    /// up; a rule with no instance at all is reported as not exercised.
    pub tries_per_instance: usize,
}

impl Default for CheckOptions {
    /// Sized so the default rule set is checked in about a second on two cores. Every planted
    /// unsound rule of the tests is caught on each of 60 seeds with 16 instances already, so
    /// 128 leaves a wide margin for rules whose counterexamples are rarer.
    fn default() -> CheckOptions {
        CheckOptions {
            seed: 0,
            instances: 128,
            values_per_instance: 4,
            tries_per_instance: 30,
        }
    }
}

/// Which way a rule was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// lhs ⇒ rhs.
    Forward,
    /// rhs ⇒ lhs, for a bidirectional rule.
    Reverse,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::Reverse => "reverse",
        }
    }
}

/// The outcome for one rule in one direction.
#[derive(Debug, Clone)]
pub struct RuleCheck {
    pub rule: String,
    pub file: String,
    pub direction: Direction,
    /// The rule as written, `lhs => rhs` in the checked direction.
    pub text: String,
    /// Random draws made (including the ones rejected).
    pub tried: usize,
    /// Draws that matched with their conditions satisfied, and were evaluated.
    pub exercised: usize,
    /// The rule is claimed for finite values only (see [`Rule::finite_only`]).
    pub finite_only: bool,
    pub verdict: Verdict,
}

/// What the check concluded.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// No counterexample in any exercised instance.
    Sound,
    Unsound(Box<Counterexample>),
    /// No draw satisfied the conditions; says how the draws failed.
    NotExercised(String),
}

/// A concrete instance on which a rule changes the result.
#[derive(Debug, Clone)]
pub struct Counterexample {
    pub failure: Failure,
    /// Both sides with the variables bound: tensor variables by name (`a`), constants and
    /// attributes spelled out.
    pub lhs: String,
    pub rhs: String,
    /// `?var` and what it was bound to, for every variable of the rule.
    pub bindings: Vec<(String, String)>,
    /// The value of every tensor variable, by name: the inputs, and the constants as full
    /// tensors (empty for a type failure, which needs no values).
    pub inputs: Vec<(String, Tensor)>,
    pub lhs_value: Option<Tensor>,
    pub rhs_value: Option<Tensor>,
}

/// How the two sides disagreed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The right-hand side has another dtype or shape.
    TypeChanged { lhs: TensorType, rhs: TensorType },
    /// The right-hand side does not type-check although the conditions hold.
    RhsIllTyped(String),
    /// The reference evaluator refused the right-hand side but not the left.
    RhsEvalFailed(String),
    /// An element differs beyond the tolerance.
    Value {
        index: Vec<usize>,
        lhs: f64,
        rhs: f64,
        /// What exactly differs: the size of the difference against the tolerance, a NaN on
        /// one side, the sign of a zero.
        why: String,
    },
}

impl Failure {
    /// The short class of failure, for JSON and for tests.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::TypeChanged { .. } => "not type-preserving",
            Failure::RhsIllTyped(_) => "right-hand side ill-typed",
            Failure::RhsEvalFailed(_) => "right-hand side fails to evaluate",
            Failure::Value { .. } => "different values",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::TypeChanged { lhs, rhs } => write!(
                f,
                "not type-preserving: the left-hand side is {lhs}, the right-hand side {rhs}"
            ),
            Failure::RhsIllTyped(why) => write!(
                f,
                "not type-preserving: the conditions hold but the right-hand side is ill-typed: {why}"
            ),
            Failure::RhsEvalFailed(why) => {
                write!(f, "the right-hand side fails to evaluate: {why}")
            }
            Failure::Value {
                index,
                lhs,
                rhs,
                why,
            } => write!(
                f,
                "at {index:?}: left {} vs right {}: {why}",
                number(*lhs),
                number(*rhs)
            ),
        }
    }
}

/// Every rule checked.
#[derive(Debug, Clone)]
pub struct Report {
    pub options: CheckOptions,
    pub checks: Vec<RuleCheck>,
}

impl Report {
    pub fn unsound(&self) -> impl Iterator<Item = &RuleCheck> {
        self.checks
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Unsound(_)))
    }

    pub fn not_exercised(&self) -> impl Iterator<Item = &RuleCheck> {
        self.checks
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::NotExercised(_)))
    }

    /// True when no rule is unsound (rules that could not be exercised are only warnings:
    /// they prove nothing either way, and a rule set should not fail for a condition that is
    /// merely hard to satisfy at random).
    pub fn is_sound(&self) -> bool {
        self.unsound().next().is_none()
    }

    /// The rules (not directions) that are unsound in some direction, as (file, name), in
    /// the order checked.
    pub fn unsound_rules(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for c in self.unsound() {
            if !out.contains(&(c.file.as_str(), c.rule.as_str())) {
                out.push((c.file.as_str(), c.rule.as_str()));
            }
        }
        out
    }

    /// Rules counted once each: unsound if a direction is, else not exercised if a direction
    /// was not, else sound.
    fn rule_counts(&self) -> (usize, usize, usize) {
        let mut verdicts: BTreeMap<(&str, &str), u8> = BTreeMap::new();
        for c in &self.checks {
            let rank = match c.verdict {
                Verdict::Sound => 0,
                Verdict::NotExercised(_) => 1,
                Verdict::Unsound(_) => 2,
            };
            let slot = verdicts.entry((&c.file, &c.rule)).or_insert(0);
            *slot = (*slot).max(rank);
        }
        let count = |r: u8| verdicts.values().filter(|&&v| v == r).count();
        (count(0), count(2), count(1))
    }

    /// The report for a person: each unsound rule with its counterexample, each unexercised
    /// rule as a warning, then a summary line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for check in &self.checks {
            match &check.verdict {
                Verdict::Unsound(cx) => render_unsound(&mut out, check, cx),
                Verdict::NotExercised(why) => {
                    let _ = writeln!(
                        out,
                        "warning: rule `{}`{} ({}) was not exercised: {why}",
                        check.rule,
                        direction_suffix(check.direction),
                        check.file
                    );
                }
                Verdict::Sound => {}
            }
        }
        let mut finite: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.finite_only)
            .map(|c| c.rule.as_str())
            .collect();
        finite.dedup();
        if !finite.is_empty() {
            let _ = writeln!(
                out,
                "note: checked on finite values only (exact in real arithmetic, not under \
                 Inf/NaN, signed zeros or underflow): {}",
                finite.join(", ")
            );
        }
        let (sound, unsound, unexercised) = self.rule_counts();
        let instances: usize = self.checks.iter().map(|c| c.exercised).sum();
        let _ = writeln!(
            out,
            "check-rules: {} rules ({} directions), {instances} instances (seed {}): \
             {sound} sound, {unsound} unsound, {unexercised} not exercised",
            sound + unsound + unexercised,
            self.checks.len(),
            self.options.seed,
        );
        out
    }

    /// One JSON object: the options, counts, and one entry per rule and direction (with the
    /// counterexample of an unsound one).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let (sound, unsound, unexercised) = self.rule_counts();
        let checks: Vec<serde_json::Value> = self
            .checks
            .iter()
            .map(|c| {
                let mut entry = json!({
                    "rule": c.rule,
                    "file": c.file,
                    "direction": c.direction.name(),
                    "rewrite": c.text,
                    "tried": c.tried,
                    "exercised": c.exercised,
                });
                let (verdict, detail) = match &c.verdict {
                    Verdict::Sound => ("sound", None),
                    Verdict::NotExercised(why) => ("not exercised", Some(json!(why))),
                    Verdict::Unsound(cx) => ("unsound", Some(counterexample_json(cx))),
                };
                entry["verdict"] = json!(verdict);
                match (verdict, detail) {
                    ("unsound", Some(d)) => entry["counterexample"] = d,
                    (_, Some(d)) => entry["reason"] = d,
                    _ => {}
                }
                entry
            })
            .collect();
        json!({
            "seed": self.options.seed,
            "instances": self.options.instances,
            "values_per_instance": self.options.values_per_instance,
            "sound": self.is_sound(),
            "rules": sound + unsound + unexercised,
            "unsound": unsound,
            "not_exercised": unexercised,
            "checks": checks,
        })
    }
}

fn direction_suffix(direction: Direction) -> &'static str {
    match direction {
        Direction::Forward => "",
        Direction::Reverse => " (reverse direction)",
    }
}

fn render_unsound(out: &mut String, check: &RuleCheck, cx: &Counterexample) {
    let _ = writeln!(
        out,
        "UNSOUND: rule `{}`{} ({})",
        check.rule,
        direction_suffix(check.direction),
        check.file
    );
    let _ = writeln!(out, "  rewrite:  {}", check.text);
    let _ = writeln!(out, "  problem:  {}", cx.failure);
    let _ = writeln!(out, "  instance: {} => {}", cx.lhs, cx.rhs);
    for (var, what) in &cx.bindings {
        let _ = writeln!(out, "    {var} = {what}");
    }
    for (name, tensor) in &cx.inputs {
        let _ = writeln!(out, "    {name} = {}", tensor_text(tensor));
    }
    if let Some(v) = &cx.lhs_value {
        let _ = writeln!(out, "  left:  {}", tensor_text(v));
    }
    if let Some(v) = &cx.rhs_value {
        let _ = writeln!(out, "  right: {}", tensor_text(v));
    }
}

fn counterexample_json(cx: &Counterexample) -> serde_json::Value {
    use serde_json::json;
    let values = |t: &Tensor| -> Vec<serde_json::Value> {
        t.floats()
            .iter()
            .map(|&v| {
                if v.is_finite() {
                    json!(v)
                } else {
                    json!(number(v))
                }
            })
            .collect()
    };
    let tensor =
        |t: &Tensor| json!({"dtype": t.dtype.name(), "shape": t.shape(), "values": values(t)});
    let mut obj = json!({
        "problem": cx.failure.kind(),
        "message": cx.failure.to_string(),
        "lhs": cx.lhs,
        "rhs": cx.rhs,
        "bindings": cx.bindings.iter().cloned().collect::<BTreeMap<_, _>>(),
        "inputs": cx.inputs.iter().map(|(n, t)| (n.clone(), tensor(t))).collect::<BTreeMap<_, _>>(),
    });
    if let Failure::Value { index, .. } = &cx.failure {
        obj["index"] = json!(index);
    }
    if let Some(v) = &cx.lhs_value {
        obj["lhs_value"] = tensor(v);
    }
    if let Some(v) = &cx.rhs_value {
        obj["rhs_value"] = tensor(v);
    }
    obj
}

/// A number as a person writes it: `1`, `-0.0`, `0.5`, `1e30`, `inf`, `NaN`.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else if v == 0.0 && v.is_sign_negative() {
        "-0.0".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:?}")
    }
}

/// `f32[2, 3] [[1, 2, 3], [4, 5, 6]]`.
fn tensor_text(t: &Tensor) -> String {
    fn nested(out: &mut String, t: &Tensor, data: &[f64], shape: &[usize]) {
        if shape.is_empty() {
            out.push_str(&element(t.dtype, data[0]));
            return;
        }
        out.push('[');
        let stride: usize = shape[1..].iter().product();
        for i in 0..shape[0] {
            if i > 0 {
                out.push_str(", ");
            }
            nested(out, t, &data[i * stride..(i + 1) * stride], &shape[1..]);
        }
        out.push(']');
    }
    let data = t.values();
    let mut out = format!("{}{:?} ", t.dtype, t.shape());
    nested(&mut out, t, &data, t.shape());
    out
}

fn element(dtype: DType, v: f64) -> String {
    if dtype == DType::Bool {
        (v != 0.0).to_string()
    } else {
        number(v)
    }
}

/// Checks every rule in both directions where it has two.
pub fn check_rules(rules: &[Rule], catalogue: &Catalogue, options: &CheckOptions) -> Report {
    let jobs: Vec<(&Rule, Direction)> = rules
        .iter()
        .flat_map(|r| {
            let reverse = r.bidirectional.then_some((r, Direction::Reverse));
            std::iter::once((r, Direction::Forward)).chain(reverse)
        })
        .collect();
    // Rules are independent and each draws from its own stream, so checking them on several
    // threads changes nothing but the time.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(rule, direction)) = jobs.get(i) else {
                        break;
                    };
                    let check = check_direction(rule, direction, catalogue, options);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(check);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    Report {
        options: options.clone(),
        checks: results
            .into_iter()
            .map(|r| r.expect("every job ran"))
            .collect(),
    }
}

/// Checks one rule in one direction.
pub fn check_direction(
    rule: &Rule,
    direction: Direction,
    catalogue: &Catalogue,
    options: &CheckOptions,
) -> RuleCheck {
    let plan = Plan::new(rule, direction, catalogue);
    let mut rng = crate::tensor::seeded_rng(options.seed);
    rng.set_stream(stream_id(&rule.file, &rule.name, direction));
    let budget = options.instances.max(1) * options.tries_per_instance.max(1);
    let mut tried = 0;
    let mut exercised = 0;
    let mut rejected: BTreeMap<&'static str, (usize, String)> = BTreeMap::new();
    let mut found: Vec<Counterexample> = Vec::new();
    let mut since_first = 0;
    while exercised < options.instances && tried < budget {
        tried += 1;
        let mut instance = plan.generate(&mut rng);
        let prepared = match plan.prepare(&mut instance) {
            Ok(p) => p,
            Err(reject) => {
                let entry = rejected.entry(reject.kind).or_insert((0, reject.detail));
                entry.0 += 1;
                continue;
            }
        };
        exercised += 1;
        if let Some(cx) = plan.try_instance(&instance, &prepared, options, &mut rng) {
            found.push(cx);
        }
        // A few more failing instances give a choice of the smallest; then stop.
        if !found.is_empty() {
            since_first += 1;
            if since_first >= 12 || found.len() >= 4 {
                break;
            }
        }
    }
    let verdict = if let Some(best) = found.into_iter().min_by_key(Counterexample::size) {
        Verdict::Unsound(Box::new(best))
    } else if exercised == 0 {
        let mut why = format!("none of {tried} random instances could be used");
        let parts: Vec<String> = rejected
            .iter()
            .map(|(kind, (n, example))| format!("{n} {kind} (e.g. {example})"))
            .collect();
        if !parts.is_empty() {
            let _ = write!(why, ": {}", parts.join("; "));
        }
        Verdict::NotExercised(why)
    } else {
        Verdict::Sound
    };
    RuleCheck {
        rule: rule.name.clone(),
        file: rule.file.clone(),
        direction,
        text: format!("{} => {}", plan.from.ast, plan.to.ast),
        tried,
        exercised,
        finite_only: rule.finite_only,
        verdict,
    }
}

/// A stream per rule and direction (FNV-1a of its file, name and direction), so one rule's
/// draws do not depend on which other rules are checked.
fn stream_id(file: &str, name: &str, direction: Direction) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in file
        .bytes()
        .chain([0])
        .chain(name.bytes())
        .chain([direction as u8])
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Counterexample {
    /// Smaller is easier to read: type failures first, then fewer input elements.
    fn size(&self) -> usize {
        match self.failure {
            Failure::Value { .. } | Failure::RhsEvalFailed(_) => {
                1 + self.inputs.iter().map(|(_, t)| t.data.len()).sum::<usize>()
            }
            _ => 0,
        }
    }
}
