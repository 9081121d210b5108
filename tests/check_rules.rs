//! `fusebox check-rules`: the default rewrite rules pass, planted unsound rules are each caught
//! with a concrete counterexample, and sound rules that only differ by rounding pass.
//!
//! The planted rules live in `tests/fixtures/unsound_rules/planted/rewrites/planted.ron`, the
//! sound controls in `tests/fixtures/unsound_rules/sound/rewrites/sound.ron`. Counterexamples
//! are checked against values computed here independently (std's `exp`, the `half` crate's
//! f16 rounding), never against the evaluator's own output alone.

use fusebox::rewrite::soundness::{
    CheckOptions, Counterexample, Direction, Failure, Report, Verdict, check_rules,
};
use fusebox::rewrite::{Rule, default_rules, load_rules};
use fusebox::rules::Catalogue;
use fusebox::tensor::Tensor;
use std::path::Path;
use std::process::Command;

const PLANTED: &str = "tests/fixtures/unsound_rules/planted/rewrites/planted.ron";
const SOUND: &str = "tests/fixtures/unsound_rules/sound/rewrites/sound.ron";

fn load(file: &str, catalogue: &Catalogue) -> Vec<Rule> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    load_rules(&text, file, catalogue).expect("fixture rules load")
}

fn options(seed: u64) -> CheckOptions {
    CheckOptions {
        seed,
        ..CheckOptions::default()
    }
}

/// The counterexample for `name` (forward direction); panics with the report if it passed.
fn caught<'r>(report: &'r Report, name: &str) -> &'r Counterexample {
    let check = report
        .checks
        .iter()
        .find(|c| c.rule == name && c.direction == Direction::Forward)
        .unwrap_or_else(|| panic!("rule {name} was not checked"));
    match &check.verdict {
        Verdict::Unsound(cx) => cx,
        other => panic!(
            "rule {name} should be unsound, got {other:?}\n{}",
            report.render()
        ),
    }
}

/// The element of an input that lines up with output element `index` under NumPy
/// broadcasting (right-aligned; a dimension of 1 repeats).
fn element_at(t: &Tensor, index: &[usize]) -> f64 {
    let shape = t.shape();
    let offset = index.len() - shape.len();
    let at: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { index[offset + i] })
        .collect();
    t.floats()[ndarray::IxDyn(&at)]
}

fn input<'c>(cx: &'c Counterexample, name: &str) -> &'c Tensor {
    &cx.inputs
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("input {name} in {:?}", cx.inputs))
        .1
}

fn value_failure(cx: &Counterexample) -> (Vec<usize>, f64, f64, String) {
    match &cx.failure {
        Failure::Value {
            index,
            lhs,
            rhs,
            why,
        } => (index.clone(), *lhs, *rhs, why.clone()),
        other => panic!("expected a value counterexample, got {other}"),
    }
}

#[test]
fn default_rules_are_sound_and_all_exercised() {
    let catalogue = Catalogue::defaults();
    let rules = default_rules(&catalogue);
    assert!(!rules.is_empty());
    let report = check_rules(&rules, &catalogue, &CheckOptions::default());
    assert!(report.is_sound(), "{}", report.render());
    // A rule the checker never instantiates is not checked at all: every default rule must be
    // exercised, and well beyond a handful of instances.
    for check in &report.checks {
        assert!(
            check.exercised >= 8,
            "rule `{}` ({:?}) exercised only {} times in {} tries: {:?}",
            check.rule,
            check.direction,
            check.exercised,
            check.tried,
            check.verdict
        );
    }
    let directions: usize = rules.iter().map(|r| 1 + usize::from(r.bidirectional)).sum();
    assert_eq!(report.checks.len(), directions);
}

#[test]
fn every_planted_rule_is_caught_on_every_seed() {
    let catalogue = Catalogue::defaults();
    let rules = load(PLANTED, &catalogue);
    assert_eq!(rules.len(), 8);
    for seed in 0..6 {
        let report = check_rules(&rules, &catalogue, &options(seed));
        assert_eq!(
            report.unsound().count(),
            rules.len(),
            "seed {seed}:\n{}",
            report.render()
        );
        for check in &report.checks {
            assert_eq!(check.file, PLANTED);
        }
    }
}

#[test]
fn exp_of_a_sum_is_caught_with_the_values_that_show_it() {
    let catalogue = Catalogue::defaults();
    let report = check_rules(&load(PLANTED, &catalogue), &catalogue, &options(0));
    let cx = caught(&report, "planted-exp-of-sum");
    let (index, lhs, rhs, _) = value_failure(cx);
    let a = element_at(input(cx, "a"), &index);
    let b = element_at(input(cx, "b"), &index);
    let dtype = input(cx, "a").dtype;
    // The two sides at the reported element, recomputed with std (half types round to about
    // 3 significant digits, so compare loosely; the two formulas differ far more).
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-2 * x.abs().max(1e-3) || x == y;
    if dtype.is_float() && (a + b).is_finite() {
        assert!(close(lhs, (a + b).exp()), "exp({a} + {b}) vs {lhs}");
        assert!(
            close(rhs, a.exp() + b.exp()),
            "exp({a}) + exp({b}) vs {rhs}"
        );
    }
    assert!(lhs != rhs);
}

#[test]
fn an_f16_round_trip_is_caught_in_f32() {
    let catalogue = Catalogue::defaults();
    for seed in 0..4 {
        let report = check_rules(&load(PLANTED, &catalogue), &catalogue, &options(seed));
        let cx = caught(&report, "planted-drop-f16-round-trip");
        let (index, lhs, rhs, _) = value_failure(cx);
        let x = element_at(input(cx, "x"), &index);
        assert_eq!(input(cx, "x").dtype, fusebox::dtype::DType::F32);
        // Left: x rounded to f16 and back (the half crate, independently); right: x itself.
        let round_trip = f64::from(half::f16::from_f32(x as f32).to_f32());
        assert!(
            lhs.to_bits() == round_trip.to_bits() || (lhs.is_nan() && round_trip.is_nan()),
            "seed {seed}: lhs {lhs} vs f16({x}) = {round_trip}"
        );
        assert_eq!(rhs.to_bits(), x.to_bits());
        assert_ne!(lhs.to_bits(), rhs.to_bits());
    }
}

#[test]
fn a_sum_pulled_out_of_a_product_is_caught() {
    let catalogue = Catalogue::defaults();
    let report = check_rules(&load(PLANTED, &catalogue), &catalogue, &options(0));
    let cx = caught(&report, "planted-sum-to-size-of-product");
    let (_, lhs, rhs, _) = value_failure(cx);
    assert!(lhs != rhs);
    // A reduction really happened: the result has fewer elements than the operands.
    let out = cx.lhs_value.as_ref().expect("values");
    assert!(out.len() < input(cx, "a").len());
}

#[test]
fn inf_times_zero_is_caught() {
    let catalogue = Catalogue::defaults();
    for seed in 0..4 {
        let report = check_rules(&load(PLANTED, &catalogue), &catalogue, &options(seed));
        // |x| * 0 is +0.0 for every finite x, so only a non-finite x can show the difference:
        // inf * 0 and NaN * 0 are NaN.
        let cx = caught(&report, "planted-magnitude-times-zero");
        let (index, lhs, rhs, why) = value_failure(cx);
        let x = element_at(input(cx, "x"), &index);
        assert!(!x.is_finite(), "seed {seed}: x = {x}");
        assert!(lhs.is_nan() && rhs == 0.0, "seed {seed}: {lhs} vs {rhs}");
        assert!(why.contains("NaN"), "{why}");
        // x * 0 has two counterexamples, both real: a non-finite x (NaN), a negative x (-0.0).
        let cx = caught(&report, "planted-mul-by-zero");
        let (index, lhs, rhs, _) = value_failure(cx);
        let x = element_at(input(cx, "x"), &index);
        assert!(
            (lhs.is_nan() && !x.is_finite())
                || (lhs == 0.0 && lhs.is_sign_negative() && x < 0.0 && rhs == 0.0),
            "seed {seed}: x = {x}, {lhs} vs {rhs}"
        );
    }
}

#[test]
fn adding_zero_is_caught_by_negative_zero() {
    let catalogue = Catalogue::defaults();
    for seed in 0..4 {
        let report = check_rules(&load(PLANTED, &catalogue), &catalogue, &options(seed));
        let cx = caught(&report, "planted-add-zero");
        let (index, lhs, rhs, why) = value_failure(cx);
        let x = element_at(input(cx, "x"), &index);
        // -0.0 + 0.0 = +0.0 in IEEE arithmetic; the rule claims it is x = -0.0.
        assert!(x == 0.0 && x.is_sign_negative(), "seed {seed}: x = {x}");
        assert!(lhs == 0.0 && lhs.is_sign_positive());
        assert!(rhs == 0.0 && rhs.is_sign_negative());
        assert!(why.contains("sign"), "{why}");
    }
}

#[test]
fn dropping_an_arbitrary_cast_is_not_type_preserving() {
    let catalogue = Catalogue::defaults();
    let report = check_rules(&load(PLANTED, &catalogue), &catalogue, &options(0));
    let cx = caught(&report, "planted-drop-any-cast");
    match &cx.failure {
        Failure::TypeChanged { lhs, rhs } => {
            assert_ne!(lhs.dtype, rhs.dtype);
            assert_eq!(lhs.shape, rhs.shape);
            // The left side's dtype is the cast's target, as bound in the instance.
            let t = &cx.bindings.iter().find(|(v, _)| v == "?t").expect("?t").1;
            assert_eq!(t, lhs.dtype.name());
        }
        other => panic!("expected a type change, got {other}"),
    }
    assert!(cx.inputs.is_empty(), "a type failure needs no values");
}

#[test]
fn sound_rules_pass_in_both_directions() {
    let catalogue = Catalogue::defaults();
    let rules = load(SOUND, &catalogue);
    for seed in 0..4 {
        let report = check_rules(&rules, &catalogue, &options(seed));
        assert!(report.is_sound(), "seed {seed}:\n{}", report.render());
        assert_eq!(report.not_exercised().count(), 0, "{}", report.render());
        let reverse = report
            .checks
            .iter()
            .filter(|c| c.direction == Direction::Reverse)
            .count();
        assert_eq!(reverse, 1, "control-sub-as-add-neg is checked both ways");
    }
}

#[test]
fn a_rule_whose_conditions_never_hold_is_reported_not_exercised() {
    let catalogue = Catalogue::defaults();
    // A tensor cannot be both f16 and f32: nothing ever satisfies this.
    let text = r#"[Rule(name: "never", lhs: "(neg ?x)", rhs: "?x",
                      when: [DtypeIn("?x", ["f16"]), DtypeIn("?x", ["f32"])])]"#;
    let rules = load_rules(text, "never.ron", &catalogue).expect("loads");
    let opts = CheckOptions {
        instances: 4,
        ..CheckOptions::default()
    };
    let report = check_rules(&rules, &catalogue, &opts);
    assert!(report.is_sound(), "unexercised is a warning, not a failure");
    assert_eq!(report.not_exercised().count(), 1);
    let text = report.render();
    assert!(
        text.contains("warning: rule `never` (never.ron) was not exercised"),
        "{text}"
    );
    assert!(text.contains("failing the conditions"), "{text}");
}

#[test]
fn reports_are_reproducible_from_the_seed() {
    let catalogue = Catalogue::defaults();
    let rules = load(PLANTED, &catalogue);
    let a = check_rules(&rules, &catalogue, &options(7)).render();
    let b = check_rules(&rules, &catalogue, &options(7)).render();
    assert_eq!(a, b);
}

fn fusebox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("fusebox runs")
}

#[test]
fn cli_exits_nonzero_and_names_each_unsound_rule_and_its_file() {
    let out = fusebox(&[
        "check-rules",
        "--rules",
        "tests/fixtures/unsound_rules/planted",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for name in [
        "planted-exp-of-sum",
        "planted-drop-f16-round-trip",
        "planted-sum-to-size-of-product",
        "planted-mul-by-zero",
        "planted-magnitude-times-zero",
        "planted-add-zero",
        "planted-drop-any-cast",
    ] {
        assert!(
            stdout.contains(&format!("UNSOUND: rule `{name}`")),
            "{name} in\n{stdout}"
        );
        assert!(stderr.contains(&format!("`{name}`")), "{name} in\n{stderr}");
    }
    assert!(stdout.contains("planted.ron"), "{stdout}");
    assert!(stderr.contains("planted.ron"), "{stderr}");
}

#[test]
fn cli_passes_the_default_rules() {
    let out = fusebox(&["check-rules"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(", 0 unsound, 0 not exercised"), "{stdout}");
}

#[test]
fn cli_json_has_one_entry_per_rule_direction() {
    let out = fusebox(&[
        "check-rules",
        "--rules",
        "tests/fixtures/unsound_rules/planted",
        "--json",
        "--seed",
        "3",
        "--instances",
        "32",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(json["seed"], 3);
    assert_eq!(json["instances"], 32);
    assert_eq!(json["sound"], false);
    let checks = json["checks"].as_array().expect("checks");
    // The default rules are checked too (the directory is laid over them); they are sound.
    let planted: Vec<_> = checks
        .iter()
        .filter(|c| {
            c["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("planted.ron"))
        })
        .collect();
    assert_eq!(planted.len(), 8);
    assert!(planted.iter().all(|c| c["verdict"] == "unsound"));
    let exp = checks
        .iter()
        .find(|c| c["rule"] == "planted-exp-of-sum")
        .expect("exp-of-sum listed");
    assert_eq!(exp["verdict"], "unsound");
    let file = exp["file"].as_str().expect("file");
    assert!(file.ends_with("planted.ron"), "{file}");
    assert_eq!(exp["counterexample"]["problem"], "different values");
    let cast = checks
        .iter()
        .find(|c| c["rule"] == "planted-drop-any-cast")
        .expect("drop-any-cast listed");
    assert_eq!(cast["counterexample"]["problem"], "not type-preserving");
}

// ------------------------------------------------------------------ computed attributes

/// `[1,2,0]` or `none` (the reversed axes of `rank`) as a permutation.
fn perm(text: &str, rank: usize) -> Vec<usize> {
    if text == "none" {
        return (0..rank).rev().collect();
    }
    text.trim_matches(['[', ']'])
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let a: i64 = p.trim().parse().expect("an integer");
            if a < 0 {
                (a + rank as i64) as usize
            } else {
                a as usize
            }
        })
        .collect()
}

fn binding<'c>(cx: &'c Counterexample, var: &str) -> &'c str {
    &cx.bindings
        .iter()
        .find(|(v, _)| v == var)
        .unwrap_or_else(|| panic!("{var} in {:?}", cx.bindings))
        .1
}

/// The rank of a tensor binding, from its type (`input `x`: f32[2, 3, 4]`).
fn rank_of(binding: &str) -> usize {
    let dims = binding.rsplit('[').next().unwrap().trim_end_matches(']');
    dims.split(',').filter(|d| !d.trim().is_empty()).count()
}

/// Computed attributes are checked like everything else: composing two permutations in the
/// wrong order, or two slices with inner and outer swapped, is caught on every seed, and the
/// permutation the bad rule computed differs from the composition worked out here.
#[test]
fn a_computation_composing_in_the_wrong_order_is_caught() {
    let catalogue = Catalogue::defaults();
    let text = r#"[
        Rule(name: "planted-perm-backwards", lhs: "(transpose (transpose ?x ?p) ?q)",
             rhs: "(transpose ?x ?r)",
             compute: [ComposePerm(into: "?r", x: "?x", inner: "?q", outer: "?p")]),
        Rule(name: "planted-slices-swapped", lhs: "(slice (slice ?x ?a ?s1 ?e1 ?k1) ?a ?s2 ?e2 ?k2)",
             rhs: "(slice ?x ?a ?s ?e ?k)",
             compute: [ComposeSlices(into: ["?s", "?e", "?k"], x: "?x", axis: "?a",
                                     inner: ["?s2", "?e2", "?k2"], outer: ["?s1", "?e1", "?k1"])]),
    ]"#;
    let rules = load_rules(text, "planted.ron", &catalogue).unwrap();
    for seed in 0..4 {
        let report = check_rules(&rules, &catalogue, &options(seed));
        assert_eq!(
            report.unsound_rules(),
            [
                ("planted.ron", "planted-perm-backwards"),
                ("planted.ron", "planted-slices-swapped")
            ],
            "seed {seed}:\n{}",
            report.render()
        );
        let cx = caught(&report, "planted-perm-backwards");
        let rank = rank_of(binding(cx, "?x"));
        let p = perm(binding(cx, "?p"), rank);
        let q = perm(binding(cx, "?q"), rank);
        let r = perm(binding(cx, "?r"), rank);
        let composed: Vec<usize> = q.iter().map(|&i| p[i]).collect();
        assert_ne!(r, composed, "seed {seed}: {:?}", cx.bindings);
    }
}
