//! Every derivative formula of the default catalogue against a central finite difference of the
//! op's own formula, both evaluated in f64 by the formula interpreter; and proof that the check
//! rejects wrong formulas.

use fusebox::formula::{self, Bindings, Expr};
use fusebox::rules::{Catalogue, DtypeClass, OpDef};
use std::collections::{BTreeMap, BTreeSet};

/// Ops whose derivatives must be among those checked.
const REQUIRED: [&str; 27] = [
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "abs",
    "pow",
    "max",
    "min",
    "clamp",
    "exp",
    "log",
    "log1p",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "gelu_tanh",
    "erf",
    "silu",
    "softplus",
    "where",
    "cast",
];

/// Points sampled per op and attribute set.
const POINTS: usize = 400;

/// A small deterministic generator (xorshift64*), so the test needs nothing but the crate.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
}

/// `expr` at one point.
fn eval(expr: &Expr, vars: &[(String, f64)]) -> f64 {
    let values: Vec<[f64; 1]> = vars.iter().map(|(_, v)| [*v]).collect();
    let mut bindings = Bindings::new(1);
    for ((name, _), value) in vars.iter().zip(&values) {
        bindings = bindings.bind(name, value);
    }
    formula::evaluate::<f64>(expr, &bindings, 1).expect("formula evaluates")[0]
}

/// Where to sample operand `operand` of `op`: inside the domain, away from singularities.
fn sample(op: &OpDef, operand: &str, rng: &mut Rng) -> f64 {
    if op.spec.accepts.get(operand) == Some(&DtypeClass::Bool) {
        return if rng.next_f64() < 0.5 { 0.0 } else { 1.0 };
    }
    match (op.name(), operand) {
        ("pow", "a") => rng.uniform(0.2, 4.0),
        ("pow", "b") => rng.uniform(-2.0, 3.0),
        ("log" | "sqrt" | "rsqrt", _) => rng.uniform(0.05, 5.0),
        ("log1p", _) => rng.uniform(-0.9, 4.0),
        ("div", "b") => {
            let magnitude = rng.uniform(0.3, 3.0);
            if rng.next_f64() < 0.5 {
                -magnitude
            } else {
                magnitude
            }
        }
        _ => rng.uniform(-3.0, 3.0),
    }
}

/// Points where the op is not differentiable (kinks and ties), which the check skips.
fn skip(op: &str, vars: &BTreeMap<String, f64>) -> bool {
    let v = |n: &str| vars[n];
    match op {
        "max" | "min" => (v("a") - v("b")).abs() < 1e-3,
        "abs" | "relu" => v("x").abs() < 1e-3,
        "clamp" => (v("x") - v("min")).abs() < 1e-3 || (v("x") - v("max")).abs() < 1e-3,
        _ => false,
    }
}

/// Attribute sets to check each op under: the defaults, plus finite bounds for clamp (whose
/// defaults, ±inf, make it the identity).
fn attribute_sets(op: &OpDef) -> Vec<BTreeMap<String, f64>> {
    let defaults: BTreeMap<String, f64> = op
        .spec
        .attrs
        .iter()
        .filter_map(|a| Some((a.name.clone(), a.default.as_ref()?.as_f64()?)))
        .collect();
    let mut sets = vec![defaults.clone()];
    if op.name() == "clamp" {
        for (min, max) in [(-1.0, 1.5), (0.0, f64::INFINITY), (f64::NEG_INFINITY, 0.5)] {
            let mut set = defaults.clone();
            set.insert("min".into(), min);
            set.insert("max".into(), max);
            sets.push(set);
        }
    }
    sets
}

/// Checks every derivative of `op` (or the replacements in `derivatives`) against central
/// differences of its formula at `POINTS` points per attribute set. Returns how many
/// (point, operand) comparisons were made.
fn check_op(op: &OpDef, derivatives: &BTreeMap<String, Expr>, seed: u64) -> Result<usize, String> {
    let f = op
        .formula()
        .ok_or_else(|| format!("{} has no formula", op.name()))?;
    let mut rng = Rng(seed | 1);
    let mut compared = 0;
    for attrs in attribute_sets(op) {
        for point in 0..POINTS {
            let mut vars: BTreeMap<String, f64> = attrs.clone();
            for operand in &op.spec.operands {
                vars.insert(operand.clone(), sample(op, operand, &mut rng));
            }
            if skip(op.name(), &vars) {
                continue;
            }
            let as_list = |vars: &BTreeMap<String, f64>| -> Vec<(String, f64)> {
                vars.iter().map(|(k, v)| (k.clone(), *v)).collect()
            };
            let y = eval(f, &as_list(&vars));
            let g = if point % 2 == 0 { 0.7 } else { -1.3 };
            for (operand, derivative) in derivatives {
                let x = vars[operand];
                let h = 1e-6 * x.abs().max(1.0);
                let mut plus = vars.clone();
                plus.insert(operand.clone(), x + h);
                let mut minus = vars.clone();
                minus.insert(operand.clone(), x - h);
                let fd = g * (eval(f, &as_list(&plus)) - eval(f, &as_list(&minus))) / (2.0 * h);
                let mut with_yg = as_list(&vars);
                with_yg.push(("y".into(), y));
                with_yg.push(("g".into(), g));
                let analytic = eval(derivative, &with_yg);
                // Written so that a NaN on either side fails.
                let agrees = (fd - analytic).abs() <= 1e-5 * analytic.abs().max(1.0);
                if !agrees {
                    return Err(format!(
                        "d{}/d{operand} = `{derivative}` gives {analytic}, finite difference {fd}, at {vars:?} with g = {g}",
                        op.name()
                    ));
                }
                compared += 1;
            }
        }
    }
    Ok(compared)
}

/// Checks every op of `catalogue` that has derivatives; returns the names checked.
fn check_catalogue(catalogue: &Catalogue) -> Result<BTreeSet<String>, String> {
    let mut checked = BTreeSet::new();
    for (i, op) in catalogue.ops().enumerate() {
        if op.derivatives.is_empty() {
            continue;
        }
        let compared = check_op(op, &op.derivatives, 0x9e37_79b9_7f4a_7c15 ^ i as u64)?;
        // Skipping kinks must leave nearly every point checked.
        let per_operand = compared / op.derivatives.len();
        assert!(
            per_operand >= POINTS * 9 / 10,
            "{}: only {per_operand} points compared",
            op.name()
        );
        checked.insert(op.name().to_string());
    }
    Ok(checked)
}

#[test]
fn every_default_derivative_matches_finite_differences() {
    let checked = check_catalogue(&Catalogue::defaults()).unwrap_or_else(|e| panic!("{e}"));
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|name| !checked.contains(*name))
        .collect();
    assert!(missing.is_empty(), "derivatives not checked: {missing:?}");
}

#[test]
fn every_differentiable_operand_has_a_derivative() {
    // Pointwise ops without derivatives are exactly those with no differentiable result:
    // comparisons (bool output) and constants (no operands). Ops with derivatives cover every
    // operand except bool conditions.
    for op in Catalogue::defaults().ops() {
        if op.formula().is_none() {
            continue;
        }
        let expected: BTreeSet<&str> = op
            .spec
            .operands
            .iter()
            .map(String::as_str)
            .filter(|o| op.spec.accepts.get(*o) != Some(&DtypeClass::Bool))
            .collect();
        let has: BTreeSet<&str> = op.derivatives.keys().map(String::as_str).collect();
        let non_differentiable =
            matches!(op.spec.dtype, fusebox::rules::DtypeRule::Bool) || op.spec.operands.is_empty();
        if non_differentiable {
            assert!(has.is_empty(), "{} should have no derivatives", op.name());
        } else {
            assert_eq!(has, expected, "{}: derivatives by operand", op.name());
        }
    }
}

#[test]
fn planted_wrong_derivatives_are_rejected() {
    let catalogue = Catalogue::defaults();
    let planted = [
        ("sigmoid", "x", "g * y"),
        ("tanh", "x", "g * (1 + y * y)"),
        ("mul", "b", "g * b"),
        ("div", "b", "g * a / (b * b)"),
        ("sub", "b", "g"),
        ("pow", "a", "g * b * pow(a, b)"),
        ("pow", "b", "g * y * log(b)"),
        ("exp", "x", "y"),
        ("log1p", "x", "g / x"),
        ("rsqrt", "x", "-0.5 * g * y * y"),
        ("sqrt", "x", "g / y"),
        ("sin", "x", "-g * cos(x)"),
        ("silu", "x", "g * (1 / (1 + exp(-x)))"),
        ("softplus", "x", "g / (1 + exp(x))"),
        ("relu", "x", "g"),
        ("abs", "x", "g"),
        ("max", "a", "select(a > b, g, 0.5 * g)"),
        ("clamp", "x", "select(x >= min, g, 0)"),
        ("where", "b", "select(c, g, 0)"),
        ("gelu", "x", "g * 0.5 * (1 + erf(x * 0.7071067811865476))"),
        // A slightly wrong constant: 0.13 instead of 3 * 0.044715 = 0.134145.
        (
            "gelu_tanh",
            "x",
            "g * (0.5 * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) + 0.5 * x * (1 - tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)) * tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * 0.7978845608028654 * (1 + 0.13 * x * x))",
        ),
    ];
    for (name, operand, wrong) in planted {
        let op = catalogue
            .get(name)
            .unwrap_or_else(|| panic!("no op {name}"));
        // The real formulas pass with this seed...
        check_op(op, &op.derivatives, 7).unwrap_or_else(|e| panic!("{e}"));
        // ...and the planted one fails.
        let mut derivatives = op.derivatives.clone();
        assert!(
            derivatives.contains_key(operand),
            "{name} has no d/d{operand}"
        );
        derivatives.insert(operand.to_string(), formula::parse(wrong).unwrap());
        let result = check_op(op, &derivatives, 7);
        assert!(
            result.is_err(),
            "the wrong d{name}/d{operand} = `{wrong}` was accepted"
        );
    }
}

#[test]
fn a_wrong_derivative_in_a_rule_file_fails_the_catalogue_check() {
    // Replacing sigmoid through ops.ron, as a user's rule directory would.
    let mut catalogue = Catalogue::defaults();
    let text = r#"[
        Op(name: "sigmoid", kind: Pointwise, operands: ["x"], dtype: FloatPromote(["x"]),
           formula: "1 / (1 + exp(-x))", derivatives: {"x": "g * y"}),
    ]"#;
    catalogue.load_str(text, "ops.ron").unwrap();
    let err = check_catalogue(&catalogue).expect_err("the wrong sigmoid derivative was accepted");
    assert!(err.contains("dsigmoid/dx"), "{err}");
}
