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
use crate::rules::{Catalogue, DtypeClass, OpKind};
use crate::shape::{Shape, broadcasts_to, numel};
use crate::tensor::Tensor;
use egg::{ENodeOrVar, Pattern, Searcher, Subst, Var};
use ndarray::{ArrayD, Dimension, IxDyn};
use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};

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
                 Inf/NaN): {}",
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
        t.data
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
        let instance = plan.generate(&mut rng);
        let prepared = match plan.prepare(&instance) {
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

// ------------------------------------------------------------------------------------------
// Instances

/// What a tensor variable is bound to.
#[derive(Debug, Clone, PartialEq)]
struct TensorVar {
    ty: TensorType,
    /// `Some(v)`: a constant (a `const` node, broadcast to the shape); `None`: a graph input.
    constant: Option<f64>,
}

/// One assignment of every variable of a rule.
#[derive(Debug, Clone, Default)]
struct Instance {
    tensors: BTreeMap<Var, TensorVar>,
    attrs: BTreeMap<Var, Leaf>,
}

/// Where a variable first occurs, which says what kind of value suits it.
#[derive(Debug, Clone)]
enum Slot {
    /// An operand, with the dtype class the op accepts there.
    Operand(Option<DtypeClass>),
    /// An attribute, by name (`shape`, `axes`, `perm`, `axis`, `value`, …), and whether the
    /// op lets it be absent (`sum` without `axes` reduces everything).
    Attr(String, bool),
}

/// Why a draw was discarded.
struct Reject {
    kind: &'static str,
    detail: String,
}

fn reject(kind: &'static str, detail: impl Into<String>) -> Reject {
    Reject {
        kind,
        detail: detail.into(),
    }
}

/// The left-hand side of an instance, checked, matched and with its conditions satisfied.
struct Prepared {
    graph: Graph,
    ty: TensorType,
}

/// Everything about a rule direction that does not change between draws.
struct Plan<'r> {
    rule: &'r Rule,
    catalogue: &'r Catalogue,
    from: &'r Pattern<ENode>,
    to: &'r Pattern<ENode>,
    tensor_vars: Vec<Var>,
    attr_vars: Vec<(Var, AttrType)>,
    slots: HashMap<Var, Slot>,
    /// Values a condition wants a tensor variable to be constant with (empty: any constant).
    constants: HashMap<Var, Vec<f64>>,
    /// Op applications in both sides: each may round once, which sizes the tolerance.
    ops: usize,
    /// Whether either side sums (reductions, matmul): the sign of a zero sum is the
    /// accumulator's convention, not a property of the rule.
    sums: bool,
}

impl<'r> Plan<'r> {
    fn new(rule: &'r Rule, direction: Direction, catalogue: &'r Catalogue) -> Plan<'r> {
        let (from, to) = match direction {
            Direction::Forward => (&rule.lhs, &rule.rhs),
            Direction::Reverse => (&rule.rhs, &rule.lhs),
        };
        let mut tensor_vars = Vec::new();
        let mut attr_vars = Vec::new();
        for (var, kind) in &rule.vars {
            match kind {
                VarKind::Tensor => tensor_vars.push(*var),
                VarKind::Attr(ty) => attr_vars.push((*var, *ty)),
            }
        }
        let mut slots = HashMap::new();
        for pattern in [from, to] {
            collect_slots(pattern, catalogue, &mut slots);
        }
        let mut constants: HashMap<Var, Vec<f64>> = HashMap::new();
        for cond in &rule.when {
            match cond {
                Condition::ConstEq(v, c) => {
                    if let Ok(v) = v.parse() {
                        constants.entry(v).or_default().push(*c);
                    }
                }
                Condition::IsConst(v) => {
                    if let Ok(v) = v.parse() {
                        constants.entry(v).or_default();
                    }
                }
                Condition::ConstPowerOfTwo(v) => {
                    if let Ok(v) = v.parse() {
                        constants.entry(v).or_default().extend([
                            2.0,
                            0.5,
                            4.0,
                            -2.0,
                            0.25,
                            1.0,
                            1024.0,
                            2f64.powi(-20),
                        ]);
                    }
                }
                _ => {}
            }
        }
        let mut ops = 0;
        let mut sums = false;
        for pattern in [from, to] {
            for node in pattern.ast.as_ref() {
                if let ENodeOrVar::ENode(ENode::Op(name, _)) = node {
                    ops += 1;
                    let kind = catalogue.get(name.as_str()).map(|op| op.kind());
                    sums |= matches!(kind, Some(OpKind::Reduction | OpKind::Opaque));
                }
            }
        }
        Plan {
            rule,
            catalogue,
            from,
            to,
            tensor_vars,
            attr_vars,
            slots,
            constants,
            ops,
            sums,
        }
    }

    /// Draws dtypes, shapes, constants and attribute values.
    fn generate(&self, rng: &mut ChaCha8Rng) -> Instance {
        let base_dtype = pick_dtype(rng);
        let base_shape = pick_shape(rng);
        let pool = shape_pool(&base_shape);
        let mut instance = Instance::default();
        for &var in &self.tensor_vars {
            let class = match self.slots.get(&var) {
                Some(Slot::Operand(class)) => *class,
                _ => None,
            };
            let dtype = dtype_for(class, base_dtype, rng);
            let shape = if rng.random_bool(0.55) {
                base_shape.clone()
            } else {
                pool[rng.random_range(0..pool.len())].clone()
            };
            let constant = match self.constants.get(&var) {
                Some(wanted) if rng.random_bool(0.85) => {
                    Some(if !wanted.is_empty() && rng.random_bool(0.8) {
                        wanted[rng.random_range(0..wanted.len())]
                    } else {
                        special_constant(rng)
                    })
                }
                _ if rng.random_bool(0.08) => Some(special_constant(rng)),
                _ => None,
            };
            instance.tensors.insert(
                var,
                TensorVar {
                    ty: TensorType { dtype, shape },
                    constant,
                },
            );
        }
        for &(var, ty) in &self.attr_vars {
            let (slot, optional) = match self.slots.get(&var) {
                Some(Slot::Attr(name, optional)) => (name.as_str(), *optional),
                _ => ("", false),
            };
            let leaf = if optional && rng.random_bool(0.15) {
                Leaf::Absent
            } else {
                attr_value(ty, slot, &instance, &pool, base_dtype, rng)
            };
            instance.attrs.insert(var, leaf);
        }
        for cond in &self.rule.when {
            if rng.random_bool(0.8) {
                apply_hint(cond, &mut instance, &base_shape, rng);
            }
        }
        instance
    }

    /// Builds and checks the left-hand side, matches the pattern in the e-graph and decides
    /// the conditions there, exactly as saturation would.
    fn prepare(&self, instance: &Instance) -> Result<Prepared, Reject> {
        let graph = build_graph(self.from, instance, self.catalogue, "lhs")
            .map_err(|e| reject("ill-typed left-hand sides", e))?;
        let dag = Dag::from_graph(&graph, self.catalogue)
            .map_err(|e| reject("ill-typed left-hand sides", e.to_string()))?;
        let lhs_eval_size: usize = dag.nodes.iter().map(|n| numel(&n.ty.shape)).sum();
        if lhs_eval_size > 1 << 16 {
            return Err(reject("instances too large", "over 65536 elements"));
        }
        let ty = dag.ty(dag.outputs[0].value).clone();
        let mut egraph = new_egraph(&dag, self.catalogue);
        let seeded = seed(&mut egraph, &dag);
        egraph.rebuild();
        let root = egraph.find(seeded.outputs[0].1);
        let subst = self.subst(instance, &dag, &seeded, &mut egraph);
        let matched = self.from.search_eclass(&egraph, root).is_some_and(|m| {
            m.substs.iter().any(|s| {
                self.matched_vars()
                    .all(|v| s.get(v).map(|&id| egraph.find(id)) == subst.get(v).copied())
            })
        });
        if !matched {
            return Err(reject(
                "draws the pattern did not match",
                format!("{} in the e-graph", self.from.ast),
            ));
        }
        if !self.rule.conditions_hold(&egraph, root, &subst) {
            return Err(reject(
                "draws failing the conditions",
                format!("{} with {}", describe_instance(self.from, instance), ty),
            ));
        }
        Ok(Prepared { graph, ty })
    }

    fn matched_vars(&self) -> impl Iterator<Item = Var> + '_ {
        self.from.vars().into_iter()
    }

    /// The e-class of every variable: inputs and constants by their value, attributes by
    /// their leaf.
    fn subst(
        &self,
        instance: &Instance,
        dag: &Dag,
        seeded: &crate::egraph::Seeded,
        egraph: &mut FuseGraph,
    ) -> Subst {
        let mut subst = Subst::with_capacity(instance.tensors.len() + instance.attrs.len());
        for (var, binding) in &instance.tensors {
            let name = var_name(*var);
            let id = if binding.constant.is_some() {
                dag.nodes
                    .iter()
                    .position(|n| n.name == name)
                    .map(|i| seeded.node_classes[i])
            } else {
                dag.inputs
                    .iter()
                    .position(|i| i.name == name)
                    .map(|i| seeded.input_classes[i])
            };
            if let Some(id) = id {
                subst.insert(*var, egraph.find(id));
            }
        }
        for (var, leaf) in &instance.attrs {
            let id = egraph.add(ENode::Attr(leaf.clone()));
            subst.insert(*var, egraph.find(id));
        }
        subst
    }

    /// Evaluates both sides on several value sets; the first failure, made small, if any.
    fn try_instance(
        &self,
        instance: &Instance,
        prepared: &Prepared,
        options: &CheckOptions,
        rng: &mut ChaCha8Rng,
    ) -> Option<Counterexample> {
        let rhs = match build_graph(self.to, instance, self.catalogue, "rhs") {
            Ok(g) => g,
            Err(why) => return Some(self.counterexample(instance, Failure::RhsIllTyped(why))),
        };
        let rhs_types = match check(&rhs, self.catalogue) {
            Ok(t) => t,
            Err(e) => {
                return Some(
                    self.counterexample(instance, Failure::RhsIllTyped(e.kind.to_string())),
                );
            }
        };
        let rhs_ty = &rhs_types[&rhs.outputs[0]];
        if *rhs_ty != prepared.ty {
            return Some(self.counterexample(
                instance,
                Failure::TypeChanged {
                    lhs: prepared.ty.clone(),
                    rhs: rhs_ty.clone(),
                },
            ));
        }
        for k in 0..options.values_per_instance.max(1) {
            // A rule claimed for finite values only is not tried on ±Inf and NaN inputs.
            if self.rule.finite_only && k % 4 == 3 {
                continue;
            }
            let inputs = draw_inputs(instance, k, rng);
            if let Outcome::Fails(..) = self.run(prepared, &rhs, &inputs) {
                let inputs = self.shrink(prepared, &rhs, inputs);
                // Evaluation is deterministic and shrinking keeps only failing inputs.
                let Outcome::Fails(failed) = self.run(prepared, &rhs, &inputs) else {
                    continue;
                };
                let (failure, l, r) = *failed;
                let mut cx = self.counterexample(instance, failure);
                cx.inputs = instance
                    .tensors
                    .iter()
                    .map(|(v, b)| {
                        let name = var_name(*v);
                        let t = match b.constant {
                            None => inputs[&name].clone(),
                            Some(c) => Tensor::from_array(
                                b.ty.dtype,
                                ArrayD::from_elem(IxDyn(&b.ty.shape), c),
                            ),
                        };
                        (name, t)
                    })
                    .collect();
                cx.lhs_value = l;
                cx.rhs_value = r;
                return Some(cx);
            }
        }
        None
    }

    /// Runs both sides on one set of inputs.
    fn run(&self, prepared: &Prepared, rhs: &Graph, inputs: &Tensors) -> Outcome {
        let Ok(left) = eval::evaluate_all(&prepared.graph, self.catalogue, inputs) else {
            return Outcome::Skipped;
        };
        let right = match eval::evaluate_all(rhs, self.catalogue, inputs) {
            Ok(r) => r,
            Err(e) => {
                return Outcome::Fails(Box::new((
                    Failure::RhsEvalFailed(e.to_string()),
                    left.get(&prepared.graph.outputs[0]).cloned(),
                    None,
                )));
            }
        };
        let l = &left[&prepared.graph.outputs[0]];
        let r = &right[&rhs.outputs[0]];
        let comparison = Comparison {
            ops: self.ops,
            sums: self.sums,
            finite_only: self.rule.finite_only,
        };
        match comparison.first_difference(l, r, left.values().chain(right.values())) {
            Some(failure) => Outcome::Fails(Box::new((failure, Some(l.clone()), Some(r.clone())))),
            None => Outcome::Holds,
        }
    }

    /// Replaces input elements with simple values while the rule still fails.
    fn shrink(&self, prepared: &Prepared, rhs: &Graph, mut inputs: Tensors) -> Tensors {
        let mut names: Vec<String> = inputs.keys().cloned().collect();
        names.sort();
        for name in names {
            let len = inputs[&name].data.len();
            let dtype = inputs[&name].dtype;
            for i in 0..len {
                let current = inputs[&name].data.as_slice().expect("standard layout")[i];
                for &candidate in simple_values(dtype) {
                    if candidate.to_bits() == current.to_bits() {
                        break;
                    }
                    let mut trial = inputs.clone();
                    let t = trial.get_mut(&name).expect("present");
                    t.data.as_slice_mut().expect("standard layout")[i] = candidate;
                    if let Outcome::Fails(..) = self.run(prepared, rhs, &trial) {
                        inputs = trial;
                        break;
                    }
                }
            }
        }
        inputs
    }

    fn counterexample(&self, instance: &Instance, failure: Failure) -> Counterexample {
        let mut bindings = Vec::new();
        for (var, b) in &instance.tensors {
            let what = match b.constant {
                Some(c) => format!("the constant {} as {}", element(b.ty.dtype, c), b.ty),
                None => format!("input `{}`: {}", var_name(*var), b.ty),
            };
            bindings.push((var.to_string(), what));
        }
        for (var, leaf) in &instance.attrs {
            bindings.push((var.to_string(), leaf.to_string()));
        }
        Counterexample {
            failure,
            lhs: describe_instance(self.from, instance),
            rhs: describe_instance(self.to, instance),
            bindings,
            inputs: Vec::new(),
            lhs_value: None,
            rhs_value: None,
        }
    }
}

enum Outcome {
    Holds,
    /// The left-hand side could not be evaluated on these values (nothing to compare).
    Skipped,
    /// How, with both sides' values where they exist (boxed: the other variants are empty).
    Fails(Box<(Failure, Option<Tensor>, Option<Tensor>)>),
}

/// Records where each variable first occurs, to draw values that suit it.
fn collect_slots(pattern: &Pattern<ENode>, catalogue: &Catalogue, slots: &mut HashMap<Var, Slot>) {
    let ast = pattern.ast.as_ref();
    for node in ast {
        let ENodeOrVar::ENode(ENode::Op(name, children)) = node else {
            continue;
        };
        let Some(op) = catalogue.get(name.as_str()) else {
            continue;
        };
        let Some((operands, attrs)) = split_children(op, children) else {
            continue;
        };
        for (i, id) in operands.iter().enumerate() {
            if let ENodeOrVar::Var(v) = &ast[usize::from(*id)] {
                let class = op.spec.accepts.get(op.operand_name(i)).copied();
                slots.entry(*v).or_insert(Slot::Operand(class));
            }
        }
        for (spec, id) in op.spec.attrs.iter().zip(attrs) {
            if let ENodeOrVar::Var(v) = &ast[usize::from(*id)] {
                slots
                    .entry(*v)
                    .or_insert_with(|| Slot::Attr(spec.name.clone(), spec.optional));
            }
        }
    }
}

/// The graph name of a variable: `?x` is `x`.
fn var_name(var: Var) -> String {
    let s = var.to_string();
    s.strip_prefix('?').unwrap_or(&s).to_string()
}

/// Mostly the common float types, now and then integers and bool (rules must hold, or
/// exclude them by their conditions, for every dtype).
fn pick_dtype(rng: &mut ChaCha8Rng) -> DType {
    const WEIGHTED: [(DType, u32); 7] = [
        (DType::F32, 8),
        (DType::F16, 4),
        (DType::BF16, 3),
        (DType::F64, 2),
        (DType::I32, 1),
        (DType::I64, 1),
        (DType::Bool, 1),
    ];
    let total: u32 = WEIGHTED.iter().map(|(_, w)| w).sum();
    let mut k = rng.random_range(0..total);
    for (d, w) in WEIGHTED {
        if k < w {
            return d;
        }
        k -= w;
    }
    DType::F32
}

const ALL_DTYPES: [DType; 7] = DType::ALL;
const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

fn dtype_for(class: Option<DtypeClass>, base: DType, rng: &mut ChaCha8Rng) -> DType {
    let admitted = |d: DType| class.is_none_or(|c| c.admits(d));
    if admitted(base) && rng.random_bool(0.8) {
        return base;
    }
    let choices: Vec<DType> = ALL_DTYPES.into_iter().filter(|&d| admitted(d)).collect();
    if choices.is_empty() {
        return base;
    }
    choices[rng.random_range(0..choices.len())]
}

/// A base shape: mostly rank 1–3 with small dims, sometimes a scalar, now and then an empty
/// or an all-ones dimension.
fn pick_shape(rng: &mut ChaCha8Rng) -> Shape {
    let rank = match rng.random_range(0..20) {
        0..2 => 0,
        2..7 => 1,
        7..16 => 2,
        _ => 3,
    };
    (0..rank)
        .map(|_| match rng.random_range(0..40) {
            0 => 0,
            1..4 => 1,
            _ => rng.random_range(2..=4),
        })
        .collect()
}

/// Shapes related to `base` by broadcasting: itself, each dim set to 1, its suffixes, `[1]`,
/// `[]` and all ones.
fn shape_pool(base: &[usize]) -> Vec<Shape> {
    let mut pool = vec![base.to_vec()];
    for i in 0..base.len() {
        let mut s = base.to_vec();
        s[i] = 1;
        pool.push(s);
        pool.push(base[i + 1..].to_vec());
    }
    pool.push(vec![1]);
    pool.push(Vec::new());
    pool.push(vec![1; base.len()]);
    pool.dedup();
    pool
}

/// Constants rules care about: the identities, signs, powers of two and extremes.
fn special_constant(rng: &mut ChaCha8Rng) -> f64 {
    const VALUES: [f64; 14] = [
        0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -2.0, 3.0, 0.25, 1e30, -1e30, 1e-30, 0.1, 1.5,
    ];
    if rng.random_bool(0.85) {
        VALUES[rng.random_range(0..VALUES.len())]
    } else {
        rng.random_range(-4.0..4.0)
    }
}

/// A value for an attribute variable, suited to the attribute it fills.
fn attr_value(
    ty: AttrType,
    slot: &str,
    instance: &Instance,
    pool: &[Shape],
    base_dtype: DType,
    rng: &mut ChaCha8Rng,
) -> Leaf {
    let tensor_shapes: Vec<&Shape> = instance.tensors.values().map(|t| &t.ty.shape).collect();
    let some_rank = if tensor_shapes.is_empty() {
        2
    } else {
        tensor_shapes[rng.random_range(0..tensor_shapes.len())].len()
    };
    match ty {
        AttrType::Float => Leaf::num(special_constant(rng)),
        AttrType::Bool => Leaf::Bool(rng.random_bool(0.5)),
        AttrType::DType => Leaf::DType(if rng.random_bool(0.5) {
            base_dtype
        } else {
            ALL_DTYPES[rng.random_range(0..ALL_DTYPES.len())]
        }),
        AttrType::Int => {
            let r = some_rank.max(1) as i64;
            Leaf::num(match slot {
                "axis" => rng.random_range(-r..r),
                "step" => rng.random_range(1..=3),
                "start" | "end" => rng.random_range(-3..=4),
                _ => rng.random_range(-2..=3),
            } as f64)
        }
        AttrType::Ints => Leaf::Ints(match slot {
            "axes" => {
                let r = some_rank as i64;
                let mut axes: Vec<i64> = (0..r).filter(|_| rng.random_bool(0.5)).collect();
                if rng.random_bool(0.3) {
                    for a in &mut axes {
                        *a -= r;
                    }
                }
                axes
            }
            "perm" => {
                let mut perm: Vec<i64> = (0..some_rank as i64).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, rng.random_range(0..=i));
                }
                perm
            }
            _ => {
                let mut choices: Vec<&Shape> = pool.iter().collect();
                choices.extend(tensor_shapes.iter().copied());
                let s = choices[rng.random_range(0..choices.len())];
                let mut s: Vec<i64> = s.iter().map(|&d| d as i64).collect();
                // Reshape targets keep the element count: the dims reversed, flattened, or
                // with one inferred (-1).
                if slot == "shape" {
                    match rng.random_range(0..10) {
                        0 => s.reverse(),
                        1 => s = vec![s.iter().product()],
                        2 if !s.is_empty() => {
                            let i = rng.random_range(0..s.len());
                            s[i] = -1;
                        }
                        _ => {}
                    }
                }
                s
            }
        }),
    }
}

/// The dtype of a tensor variable or a dtype attribute variable.
fn dtype_of(instance: &Instance, var: Var) -> Option<DType> {
    if let Some(t) = instance.tensors.get(&var) {
        return Some(t.ty.dtype);
    }
    match instance.attrs.get(&var) {
        Some(Leaf::DType(d)) => Some(*d),
        _ => None,
    }
}

fn set_dtype(instance: &mut Instance, var: Var, dtype: DType) {
    if let Some(t) = instance.tensors.get_mut(&var) {
        t.ty.dtype = dtype;
    } else if let Some(leaf @ Leaf::DType(_)) = instance.attrs.get_mut(&var) {
        *leaf = Leaf::DType(dtype);
    }
}

/// The shape of a tensor variable or an `Ints` attribute variable (when non-negative).
fn shape_of(instance: &Instance, var: Var) -> Option<Shape> {
    if let Some(t) = instance.tensors.get(&var) {
        return Some(t.ty.shape.clone());
    }
    match instance.attrs.get(&var) {
        Some(Leaf::Ints(v)) => v.iter().map(|&d| usize::try_from(d).ok()).collect(),
        _ => None,
    }
}

fn set_shape(instance: &mut Instance, var: Var, shape: &[usize]) {
    if let Some(t) = instance.tensors.get_mut(&var) {
        t.ty.shape = shape.to_vec();
    } else if let Some(leaf @ Leaf::Ints(_)) = instance.attrs.get_mut(&var) {
        *leaf = Leaf::Ints(shape.iter().map(|&d| d as i64).collect());
    }
}

/// Steers a draw toward satisfying one condition. Only a nudge: whether the condition holds
/// is decided afterwards by the rule's own code.
fn apply_hint(cond: &Condition, instance: &mut Instance, base: &[usize], rng: &mut ChaCha8Rng) {
    let var = |s: &String| s.parse::<Var>().ok();
    match cond {
        Condition::SameDtype(a, b) => {
            if let (Some(a), Some(b)) = (var(a), var(b))
                && let Some(d) = dtype_of(instance, a)
            {
                set_dtype(instance, b, d);
            }
        }
        Condition::SameShape(a, b) => {
            if let (Some(a), Some(b)) = (var(a), var(b))
                && let Some(s) = shape_of(instance, a)
            {
                set_shape(instance, b, &s);
            }
        }
        Condition::BroadcastsTo(a, b) => {
            if let (Some(a), Some(b)) = (var(a), var(b))
                && let Some(s) = shape_of(instance, b)
            {
                let pool = shape_pool(&s);
                set_shape(instance, a, &pool[rng.random_range(0..pool.len())]);
            }
        }
        Condition::Rank(v, n) => {
            if let Some(v) = var(v) {
                let shape: Shape = (0..*n).map(|i| base.get(i).copied().unwrap_or(2)).collect();
                set_shape(instance, v, &shape);
            }
        }
        Condition::DtypeIn(v, list) => {
            if let Some(v) = var(v)
                && !list.is_empty()
            {
                set_dtype(instance, v, list[rng.random_range(0..list.len())]);
            }
        }
        Condition::IsFloat(v) => {
            if let Some(v) = var(v)
                && !dtype_of(instance, v).is_some_and(DType::is_float)
            {
                set_dtype(instance, v, FLOATS[rng.random_range(0..FLOATS.len())]);
            }
        }
        Condition::Wider(a, b) => {
            const PAIRS: [(DType, DType); 9] = [
                (DType::F32, DType::F16),
                (DType::F32, DType::BF16),
                (DType::F64, DType::F32),
                (DType::F64, DType::F16),
                (DType::F64, DType::BF16),
                (DType::F64, DType::I32),
                (DType::I64, DType::I32),
                (DType::F32, DType::Bool),
                (DType::F16, DType::Bool),
            ];
            if let (Some(a), Some(b)) = (var(a), var(b)) {
                let (wide, narrow) = PAIRS[rng.random_range(0..PAIRS.len())];
                set_dtype(instance, a, wide);
                set_dtype(instance, b, narrow);
            }
        }
        // A number attribute (`(clamp ?x ?lo ?hi)`, `(const ?c ?t)`); tensor variables were
        // made constant when drawn.
        Condition::ConstEq(v, c) => {
            if let Some(v) = var(v)
                && let Some(leaf @ Leaf::Num(_)) = instance.attrs.get_mut(&v)
            {
                *leaf = Leaf::num(*c);
            }
        }
        Condition::ConstPowerOfTwo(v) => {
            if let Some(v) = var(v)
                && let Some(leaf @ Leaf::Num(_)) = instance.attrs.get_mut(&v)
            {
                let k = rng.random_range(-6..=6);
                let sign = if rng.random_bool(0.3) { -1.0 } else { 1.0 };
                *leaf = Leaf::num(sign * 2f64.powi(k));
            }
        }
        Condition::DropsLeadingAxis(s, x) => {
            if let (Some(s), Some(x)) = (var(s), var(x)) {
                let mut shape = shape_of(instance, x).unwrap_or_default();
                if shape.is_empty() {
                    shape = vec![2, 3];
                    set_shape(instance, x, &shape);
                }
                set_shape(instance, s, &shape[1..]);
            }
        }
        _ => {}
    }
}

/// The graph of one side: every tensor variable of the instance (inputs, and constants as
/// `const` nodes broadcast to their shape), then the pattern's ops, the root last and named
/// `root_name` unless the pattern is a bare variable.
fn build_graph(
    pattern: &Pattern<ENode>,
    instance: &Instance,
    catalogue: &Catalogue,
    root_name: &str,
) -> Result<Graph, String> {
    let mut graph = Graph {
        name: root_name.to_string(),
        inputs: Vec::new(),
        nodes: Vec::new(),
        outputs: Vec::new(),
    };
    for (var, binding) in &instance.tensors {
        let name = var_name(*var);
        match binding.constant {
            None => graph.inputs.push(Input {
                name,
                dtype: binding.ty.dtype,
                shape: binding.ty.shape.clone(),
            }),
            Some(value) => {
                let mut attrs = crate::attr::Attrs::new();
                attrs.insert("value".into(), crate::attr::AttrValue::Float(value));
                attrs.insert(
                    "dtype".into(),
                    crate::attr::AttrValue::DType(binding.ty.dtype),
                );
                let scalar = if binding.ty.shape.is_empty() {
                    name.clone()
                } else {
                    format!("{name}%scalar")
                };
                graph.nodes.push(Node {
                    name: scalar.clone(),
                    op: "const".into(),
                    args: Vec::new(),
                    attrs,
                });
                if !binding.ty.shape.is_empty() {
                    let mut attrs = crate::attr::Attrs::new();
                    attrs.insert(
                        "shape".into(),
                        crate::attr::AttrValue::Ints(
                            binding.ty.shape.iter().map(|&d| d as i64).collect(),
                        ),
                    );
                    graph.nodes.push(Node {
                        name,
                        op: "broadcast_to".into(),
                        args: vec![scalar],
                        attrs,
                    });
                }
            }
        }
    }
    let ast = pattern.ast.as_ref();
    let mut built: Vec<Option<Term>> = vec![None; ast.len()];
    for (index, node) in ast.iter().enumerate() {
        let term = match node {
            ENodeOrVar::Var(v) => {
                if let Some(leaf) = instance.attrs.get(v) {
                    Term::Leaf(leaf.clone())
                } else if instance.tensors.contains_key(v) {
                    Term::Value(var_name(*v))
                } else {
                    return Err(format!("variable {v} is not bound"));
                }
            }
            ENodeOrVar::ENode(ENode::Attr(leaf)) => Term::Leaf(leaf.clone()),
            ENodeOrVar::ENode(ENode::Input(name)) => {
                return Err(format!("the pattern names graph input ${name}"));
            }
            ENodeOrVar::ENode(ENode::Op(name, children)) => {
                let op = catalogue
                    .get(name.as_str())
                    .ok_or_else(|| format!("unknown op `{name}`"))?;
                let (operands, attr_ids) = split_children(op, children)
                    .ok_or_else(|| format!("`{name}` has the wrong number of children"))?;
                let mut args = Vec::new();
                for id in operands {
                    match &built[usize::from(*id)] {
                        Some(Term::Value(v)) => args.push(v.clone()),
                        _ => return Err(format!("an operand of `{name}` is not a tensor")),
                    }
                }
                let mut attrs = crate::attr::Attrs::new();
                for (spec, id) in op.spec.attrs.iter().zip(attr_ids) {
                    let Some(Term::Leaf(leaf)) = &built[usize::from(*id)] else {
                        return Err(format!("attribute `{}` of `{name}` is a tensor", spec.name));
                    };
                    if *leaf == Leaf::Absent {
                        if spec.optional {
                            continue;
                        }
                        return Err(format!("`{name}` needs attribute `{}`", spec.name));
                    }
                    let value = leaf.to_attr(spec.ty).ok_or_else(|| {
                        format!(
                            "attribute `{}` of `{name}` must be {}, not {leaf}",
                            spec.name, spec.ty
                        )
                    })?;
                    attrs.insert(spec.name.clone(), value);
                }
                let node_name = if index + 1 == ast.len() {
                    root_name.to_string()
                } else {
                    format!("%{index}")
                };
                graph.nodes.push(Node {
                    name: node_name.clone(),
                    op: name.to_string(),
                    args,
                    attrs,
                });
                Term::Value(node_name)
            }
        };
        built[index] = Some(term);
    }
    match built.last().cloned().flatten() {
        Some(Term::Value(root)) => graph.outputs.push(root),
        _ => return Err("the pattern is not a tensor".into()),
    }
    Ok(graph)
}

#[derive(Debug, Clone)]
enum Term {
    Value(String),
    Leaf(Leaf),
}

/// A side with its variables replaced: inputs by name, constants and attributes spelled out.
fn describe_instance(pattern: &Pattern<ENode>, instance: &Instance) -> String {
    fn go(ast: &[ENodeOrVar<ENode>], index: usize, instance: &Instance, out: &mut String) {
        match &ast[index] {
            ENodeOrVar::Var(v) => {
                if let Some(leaf) = instance.attrs.get(v) {
                    let _ = write!(out, "{leaf}");
                } else if let Some(t) = instance.tensors.get(v) {
                    match t.constant {
                        None => out.push_str(&var_name(*v)),
                        Some(c) if t.ty.shape.is_empty() => {
                            let _ = write!(out, "(const {} {})", Leaf::num(c), t.ty.dtype);
                        }
                        Some(c) => {
                            let shape = Leaf::Ints(t.ty.shape.iter().map(|&d| d as i64).collect());
                            let _ = write!(
                                out,
                                "(broadcast_to (const {} {}) {shape})",
                                Leaf::num(c),
                                t.ty.dtype
                            );
                        }
                    }
                } else {
                    let _ = write!(out, "{v}");
                }
            }
            ENodeOrVar::ENode(node) => {
                let children = egg::Language::children(node);
                if children.is_empty() {
                    let _ = write!(out, "{node}");
                } else {
                    let _ = write!(out, "({node}");
                    for c in children {
                        out.push(' ');
                        go(ast, usize::from(*c), instance, out);
                    }
                    out.push(')');
                }
            }
        }
    }
    let ast = pattern.ast.as_ref();
    let mut out = String::new();
    go(ast, ast.len() - 1, instance, &mut out);
    out
}

// ------------------------------------------------------------------------------------------
// Values

/// Random inputs for every input variable. `round` picks the flavour: 0 ordinary values,
/// 1 zeros of both signs and small exact values, 2 tiny and huge magnitudes, 3 with ±Inf and
/// NaN mixed in.
fn draw_inputs(instance: &Instance, round: usize, rng: &mut ChaCha8Rng) -> Tensors {
    let flavour = round % 4;
    instance
        .tensors
        .iter()
        .filter(|(_, b)| b.constant.is_none())
        .map(|(var, b)| {
            let values = (0..numel(&b.ty.shape))
                .map(|_| draw_value(b.ty.dtype, flavour, rng))
                .collect();
            let t = Tensor::from_values(b.ty.dtype, &b.ty.shape, values)
                .expect("value count matches the shape");
            (var_name(*var), t)
        })
        .collect()
}

fn draw_value(dtype: DType, flavour: usize, rng: &mut ChaCha8Rng) -> f64 {
    const SIMPLE: [f64; 10] = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, 0.25];
    match dtype.category() {
        Category::Bool => f64::from(u8::from(rng.random_bool(0.5))),
        Category::Integer => {
            let big = if dtype == DType::I32 {
                f64::from(i32::MAX)
            } else {
                2f64.powi(40)
            };
            match flavour {
                0 => rng.random_range(-10..=10) as f64,
                1 => [0.0, 1.0, -1.0, 2.0, -2.0][rng.random_range(0..5)],
                // The ends of i32's range, where negation and addition saturate.
                _ if dtype == DType::I32 && rng.random_bool(0.15) => {
                    [f64::from(i32::MIN), f64::from(i32::MAX)][rng.random_range(0..2)]
                }
                _ if rng.random_bool(0.4) => (rng.random_range(-big..big)).trunc(),
                _ => rng.random_range(-100..=100) as f64,
            }
        }
        Category::Float => {
            let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            match flavour {
                0 => rng.random_range(-3.0..3.0),
                1 if rng.random_bool(0.6) => SIMPLE[rng.random_range(0..SIMPLE.len())],
                1 => rng.random_range(-3.0..3.0),
                2 => match rng.random_range(0..10) {
                    0..3 => sign * smallest_normal(dtype) * rng.random_range(0.01..4.0),
                    3..6 => sign * largest_finite(dtype) * rng.random_range(0.25..1.0),
                    6 => sign * 0.0,
                    _ => sign * 10f64.powf(rng.random_range(-4.0..4.0)),
                },
                _ => match rng.random_range(0..8) {
                    0 => f64::INFINITY,
                    1 => f64::NEG_INFINITY,
                    2 => f64::NAN,
                    3..5 => SIMPLE[rng.random_range(0..SIMPLE.len())],
                    _ => rng.random_range(-3.0..3.0),
                },
            }
        }
    }
}

/// Values a counterexample is simplified toward, simplest first.
fn simple_values(dtype: DType) -> &'static [f64] {
    match dtype.category() {
        Category::Bool => &[0.0, 1.0],
        Category::Integer => &[0.0, 1.0, -1.0, 2.0],
        Category::Float => &[0.0, 1.0, -1.0, 2.0, 0.5, 0.1],
    }
}

/// Unit roundoff: half the distance from 1 to the next value.
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        DType::F64 => 2f64.powi(-53),
        _ => 0.0,
    }
}

fn smallest_normal(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-14),
        DType::BF16 | DType::F32 => 2f64.powi(-126),
        DType::F64 => f64::MIN_POSITIVE,
        _ => 1.0,
    }
}

fn largest_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        DType::F32 => f64::from(f32::MAX),
        DType::F64 => f64::MAX,
        DType::I32 => f64::from(i32::MAX),
        DType::I64 => i64::MAX as f64,
        DType::Bool => 1.0,
    }
}

/// How two results are compared.
///
/// Two sound forms of a computation round differently: `sum_to_size(a) + sum_to_size(b)` and
/// `sum_to_size(a + b)` differ by rounding errors as large as the *terms* (not the result)
/// when the sum cancels. So the tolerance of an element is
///
/// `2·u·(ops + 1)·(|left| + |right| + scale) + (ops + 1)·smallest_normal`
///
/// where `u` is the output dtype's unit roundoff (2⁻²⁴ for f32), `ops` the op applications of
/// both sides (each may round once), and `scale` the largest magnitude any value of either
/// side has at that element: a value whose shape broadcasts to the output's contributes
/// elementwise, any other (a value later reduced) contributes the sum of its magnitudes. For
/// f32 that is a few 1e-6 relative: an f32 → f16 → f32 round trip (error up to 2⁻¹² relative)
/// is caught, while reordered sums pass. Integer and bool results must be equal.
///
/// Non-finite values are compared exactly: NaN where the other side has NaN, infinities
/// equal. The one exception is overflow: where `scale` is within a factor 2 of the largest
/// finite value of a float dtype in play, a sound reordering can overflow on one side only,
/// so such elements are not compared.
///
/// The sign of zero is compared where it carries information: both sides exactly zero with
/// different signs fail when no side sums (`x + 0 ⇒ x` turns −0.0 into +0.0, and `1/x` tells
/// them apart). A zero sum's sign is the accumulator's convention (+0.0 + −0.0 is +0.0 in any
/// order), which no rule about sums could preserve, so it is ignored there.
///
/// A rule marked `finite_only` claims equality in real arithmetic: an element where either
/// side is infinite or NaN (a division by zero, an overflow) is outside that claim and is not
/// compared; every finite element still is.
struct Comparison {
    ops: usize,
    sums: bool,
    finite_only: bool,
}

impl Comparison {
    /// The first element that differs, if any.
    fn first_difference<'a>(
        &self,
        l: &Tensor,
        r: &Tensor,
        values: impl Iterator<Item = &'a Tensor>,
    ) -> Option<Failure> {
        let shape = l.shape().to_vec();
        let mut scale = ArrayD::<f64>::zeros(IxDyn(&shape));
        let mut overflow_limit = f64::INFINITY;
        for v in values {
            if v.dtype.is_float() {
                overflow_limit = overflow_limit.min(0.5 * largest_finite(v.dtype));
            }
            let mag = v.data.mapv(|x| if x.is_finite() { x.abs() } else { 0.0 });
            if broadcasts_to(v.shape(), &shape) {
                if let Some(b) = mag.broadcast(IxDyn(&shape)) {
                    scale.zip_mut_with(&b, |s, &m| *s = s.max(m));
                }
            } else {
                let total: f64 = mag.iter().sum();
                scale.mapv_inplace(|s| s.max(total));
            }
        }
        for ((index, &a), (&b, &s)) in l.data.indexed_iter().zip(r.data.iter().zip(&scale)) {
            if let Some(why) = self.judge(l.dtype, a, b, s, overflow_limit) {
                return Some(Failure::Value {
                    index: index.slice().to_vec(),
                    lhs: a,
                    rhs: b,
                    why,
                });
            }
        }
        None
    }

    /// Why `a` (left) and `b` (right) differ, given the magnitude `scale` at their element;
    /// `None` when they agree.
    fn judge(&self, dtype: DType, a: f64, b: f64, scale: f64, overflow: f64) -> Option<String> {
        let identical = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let non_finite = !a.is_finite() || !b.is_finite();
        let overflowed = non_finite && scale >= overflow;
        if identical || overflowed || (non_finite && self.finite_only) {
            return None;
        }
        if !dtype.is_float() {
            return (a != b).then(|| "integer and bool results must be equal".to_string());
        }
        if a.is_nan() || b.is_nan() {
            return Some("NaN on one side only".into());
        }
        if a.is_infinite() || b.is_infinite() {
            return Some("infinities must be equal".into());
        }
        if a == 0.0 && b == 0.0 {
            return (!self.sums).then(|| "the sign of an exact zero changes".to_string());
        }
        let k = (self.ops + 1) as f64;
        let tol = 2.0 * unit_roundoff(dtype) * k * (a.abs() + b.abs() + scale)
            + k * smallest_normal(dtype);
        let diff = (a - b).abs();
        (diff > tol).then(|| format!("differs by {} (tolerance {})", number(diff), number(tol)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], values: &[f64]) -> Tensor {
        Tensor::from_values(DType::F32, shape, values.to_vec()).expect("shape fits")
    }

    fn differs(cmp: &Comparison, l: &Tensor, r: &Tensor, others: &[&Tensor]) -> Option<Failure> {
        let all: Vec<&Tensor> = [l, r].into_iter().chain(others.iter().copied()).collect();
        cmp.first_difference(l, r, all.into_iter())
    }

    const POINTWISE: Comparison = Comparison {
        ops: 2,
        sums: false,
        finite_only: false,
    };
    const SUMMING: Comparison = Comparison {
        ops: 3,
        sums: true,
        finite_only: false,
    };
    const REAL: Comparison = Comparison {
        ops: 3,
        sums: true,
        finite_only: true,
    };

    #[test]
    fn finite_only_rules_skip_non_finite_elements_but_not_finite_ones() {
        // sum([0, 1]) * -inf = -inf, but sum([0 * -inf, 1 * -inf]) = NaN: outside the claim.
        let l = f32s(&[2], &[f64::NEG_INFINITY, 3.0]);
        let r = f32s(&[2], &[f64::NAN, 3.0]);
        assert!(differs(&REAL, &l, &r, &[]).is_none());
        assert!(differs(&SUMMING, &l, &r, &[]).is_some());
        // A finite difference is still a difference.
        let r = f32s(&[2], &[f64::NAN, 3.5]);
        assert!(differs(&REAL, &l, &r, &[]).is_some());
    }

    #[test]
    fn an_f16_round_trip_is_beyond_f32_tolerance() {
        // 1.1 in f16 is 1.099609375: a relative change of 3.6e-4, where f32 rounding is 6e-8.
        let x = f32s(&[1], &[1.1]);
        let trip = f32s(&[1], &[1.099609375]);
        let failure = differs(&POINTWISE, &trip, &x, &[]).expect("caught");
        assert!(matches!(failure, Failure::Value { ref index, .. } if index == &[0]));
    }

    #[test]
    fn cancellation_in_a_sum_is_rounding_not_a_difference() {
        // a + b summed two ways: 1e8 + 1 - 1e8 is 0 in f32 one way and 1 the other. The terms
        // (1e8) set the scale, so a difference of 1 is within 2·2⁻²⁴·4·1e8 ≈ 48.
        let terms = f32s(&[3], &[1e8, 1.0, -1e8]);
        let zero = f32s(&[], &[0.0]);
        let one = f32s(&[], &[1.0]);
        assert_eq!(differs(&SUMMING, &zero, &one, &[&terms]), None);
        // Without the terms the same difference is real.
        assert!(differs(&SUMMING, &zero, &one, &[]).is_some());
    }

    #[test]
    fn signed_zeros_count_unless_a_sum_made_them() {
        let pos = f32s(&[2], &[0.0, 1.0]);
        let neg = f32s(&[2], &[-0.0, 1.0]);
        let failure = differs(&POINTWISE, &pos, &neg, &[]).expect("x + 0 is not x at -0.0");
        assert!(matches!(failure, Failure::Value { ref why, .. } if why.contains("sign")));
        assert_eq!(differs(&SUMMING, &pos, &neg, &[]), None);
    }

    #[test]
    fn nan_and_infinity_must_match_exactly() {
        let nan = f32s(&[2], &[f64::NAN, 2.0]);
        let zero = f32s(&[2], &[0.0, 2.0]);
        let failure = differs(&POINTWISE, &nan, &zero, &[]).expect("inf * 0 is NaN, not 0");
        assert!(matches!(failure, Failure::Value { ref why, .. } if why.contains("NaN")));
        assert_eq!(differs(&POINTWISE, &nan, &nan.clone(), &[]), None);
        let inf = f32s(&[1], &[f64::INFINITY]);
        let ninf = f32s(&[1], &[f64::NEG_INFINITY]);
        assert!(differs(&POINTWISE, &inf, &ninf, &[]).is_some());
    }

    #[test]
    fn overflow_near_the_largest_value_is_not_compared() {
        // Summed in another order, 2e38 + 2e38 - 2e38 overflows on one side only.
        let big = f32s(&[3], &[2e38, 2e38, -2e38]);
        let inf = f32s(&[], &[f64::INFINITY]);
        let finite = f32s(&[], &[2e38]);
        assert_eq!(differs(&SUMMING, &inf, &finite, &[&big]), None);
        // Far from overflow, an infinity on one side is a difference.
        let small = f32s(&[], &[2.0]);
        assert!(differs(&SUMMING, &inf, &small, &[]).is_some());
    }

    #[test]
    fn integers_must_be_equal() {
        let a = Tensor::from_values(DType::I32, &[2], vec![1.0, 2147483647.0]).expect("fits");
        let b = Tensor::from_values(DType::I32, &[2], vec![1.0, 2147483646.0]).expect("fits");
        assert!(differs(&POINTWISE, &a, &b, &[]).is_some());
        assert_eq!(differs(&POINTWISE, &a, &a.clone(), &[]), None);
    }

    #[test]
    fn numbers_print_as_written() {
        assert_eq!(number(2.0), "2");
        assert_eq!(number(-0.0), "-0.0");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(1e30), "1e30");
        assert_eq!(number(f64::NEG_INFINITY), "-inf");
        assert_eq!(number(f64::NAN), "NaN");
        let t = f32s(&[2, 2], &[1.0, -0.0, 0.5, 3.0]);
        assert_eq!(tensor_text(&t), "f32[2, 2] [[1, -0.0], [0.5, 3]]");
    }

    #[test]
    fn the_shape_pool_broadcasts_to_its_base() {
        let pool = shape_pool(&[2, 3]);
        for s in [&[2, 3][..], &[1, 3], &[2, 1], &[3], &[1], &[], &[1, 1]] {
            assert!(pool.iter().any(|p| p == s), "{s:?} in {pool:?}");
        }
        assert!(pool.iter().all(|p| broadcasts_to(p, &[2, 3])));
    }
}
