//! Every default op, evaluated by the reference evaluator, against values known independently
//! of it: hand-derived constants, IEEE rules, std/libm math computed here in f64, and
//! mathematical identities.

use fusebox::ErrorKind;
use fusebox::attr::AttrValue;
use fusebox::dtype::DType::{self, BF16, Bool, F16, F32, F64, I32, I64};
use fusebox::eval::{Tensors, evaluate};
use fusebox::graph::{GraphBuilder, file};
use fusebox::rules::Catalogue;
use fusebox::tensor::Tensor;
use std::sync::LazyLock;

static CATALOGUE: LazyLock<Catalogue> = LazyLock::new(Catalogue::defaults);

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// Every op of the default catalogue; each is exercised below.
const COVERED: [&str; 53] = [
    "abs",
    "add",
    "atan",
    "broadcast_to",
    "cast",
    "ceil",
    "clamp",
    "concat",
    "const",
    "cos",
    "div",
    "eq",
    "erf",
    "exp",
    "floor",
    "gather",
    "gather_elements",
    "ge",
    "gelu",
    "gelu_tanh",
    "gt",
    "le",
    "log",
    "log1p",
    "lt",
    "matmul",
    "max",
    "mean",
    "min",
    "mul",
    "ne",
    "neg",
    "pow",
    "reduce_max",
    "relu",
    "reshape",
    "round",
    "rsqrt",
    "scatter_add",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "slice",
    "softplus",
    "sqrt",
    "sub",
    "sum",
    "sum_to_size",
    "tan",
    "tanh",
    "transpose",
    "where",
];

// ------------------------------------------------------------------------------------- helpers

/// Same value, bit for bit (so -0.0 differs from +0.0), with every NaN equal to every NaN.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// An input tensor whose values must already be exact in `dtype`, so expected results can be
/// derived by hand.
fn tensor(dtype: DType, shape: &[usize], values: &[f64]) -> Tensor {
    let t = Tensor::from_values(dtype, shape, values.to_vec()).expect("values match the shape");
    for (stored, given) in t.values().iter().zip(values) {
        assert!(
            same(*stored, *given),
            "input {given} is not exact in {dtype}"
        );
    }
    t
}

fn vector(dtype: DType, values: &[f64]) -> Tensor {
    tensor(dtype, &[values.len()], values)
}

/// `op` applied to `args` (as graph inputs), with `attrs`.
fn try_apply(op: &str, attrs: &[(&str, AttrValue)], args: &[Tensor]) -> fusebox::Result<Tensor> {
    let mut b = GraphBuilder::new(op);
    let names: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, t)| b.input(&format!("in{i}"), t.dtype, t.shape()))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    b.op_with("out", op, &refs, attrs);
    let graph = b.finish(&["out"]);
    let inputs: Tensors = names.into_iter().zip(args.iter().cloned()).collect();
    Ok(evaluate(&graph, &CATALOGUE, &inputs)?
        .remove("out")
        .unwrap())
}

fn apply(op: &str, attrs: &[(&str, AttrValue)], args: &[Tensor]) -> Tensor {
    try_apply(op, attrs, args).unwrap_or_else(|e| panic!("{op}: {e}"))
}

/// The error `op` gives on `args`.
fn apply_err(op: &str, attrs: &[(&str, AttrValue)], args: &[Tensor]) -> ErrorKind {
    match try_apply(op, attrs, args) {
        Ok(t) => panic!("{op} should fail, gave {t:?}"),
        Err(e) => e.kind,
    }
}

fn unary(op: &str, dtype: DType, xs: &[f64]) -> Tensor {
    apply(op, &[], &[vector(dtype, xs)])
}

fn binary(op: &str, dtype: DType, a: &[f64], b: &[f64]) -> Tensor {
    apply(op, &[], &[vector(dtype, a), vector(dtype, b)])
}

/// Asserts dtype, shape and every value bit for bit.
#[track_caller]
fn assert_exact(t: &Tensor, dtype: DType, shape: &[usize], expected: &[f64]) {
    assert_eq!(t.dtype, dtype, "dtype of {t:?}");
    assert_eq!(t.shape(), shape, "shape of {t:?}");
    let got = t.values();
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            same(*g, *e),
            "element {i}: got {g:?}, expected {e:?} (all: {got:?})"
        );
    }
}

/// Asserts every value within `rtol` of the f64 truth (exact where the truth is 0 or infinite).
#[track_caller]
fn assert_close(what: &str, got: &[f64], truth: &[f64], rtol: f64) {
    assert_eq!(got.len(), truth.len());
    for (g, t) in got.iter().zip(truth) {
        let ok = if t.is_finite() {
            (g - t).abs() <= rtol * t.abs()
        } else {
            same(*g, *t)
        };
        assert!(
            ok,
            "{what}: got {g:e}, truth {t:e} (rel {:e})",
            ((g - t) / t).abs()
        );
    }
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

fn iota(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

// ------------------------------------------------------------------------------------- coverage

#[test]
fn every_default_op_is_covered() {
    let names: Vec<&str> = CATALOGUE.names().collect();
    assert_eq!(
        names,
        COVERED.to_vec(),
        "a default op was added or removed: test it here"
    );
}

// ------------------------------------------------------------------------------------- rounding

/// floor, ceil, round (halves to even, as NumPy and ONNX round) and sign on halves, ties,
/// signed zeros, values past 2^52, ±Inf and NaN, in f32, f16 and integers.
#[test]
fn rounding_exact_values() {
    let xs = [
        -2.5, -1.5, -0.5, -0.25, -0.0, 0.0, 0.25, 0.5, 1.5, 2.5, 2.75, 1e20, INF, -INF, NAN,
    ];
    let floor = [
        -3.0, -2.0, -1.0, -1.0, -0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 2.0, 1e20, INF, -INF, NAN,
    ];
    let ceil = [
        -2.0, -1.0, -0.0, -0.0, -0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 3.0, 1e20, INF, -INF, NAN,
    ];
    let sign = [
        -1.0, -1.0, -1.0, -1.0, -0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, NAN,
    ];
    for dtype in [F32, F64] {
        let xs: Vec<f64> = xs.iter().map(|&x| dtype.round(x)).collect();
        let want = |v: &[f64]| v.iter().map(|&x| dtype.round(x)).collect::<Vec<_>>();
        assert_exact(&unary("floor", dtype, &xs), dtype, &[15], &want(&floor));
        assert_exact(&unary("ceil", dtype, &xs), dtype, &[15], &want(&ceil));
        assert_exact(&unary("sign", dtype, &xs), dtype, &[15], &want(&sign));
        // NumPy's round gives -0 for -0.5 and -0.25; this round gives +0 there (equal values).
        let got = unary("round", dtype, &xs).values();
        let round = [
            -2.0, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 3.0, 1e20, INF, -INF, NAN,
        ];
        for (i, (&g, &w)) in got.iter().zip(&round).enumerate() {
            assert!(
                g == dtype.round(w) || (g.is_nan() && w.is_nan()),
                "round [{i}]: {g} vs {w}"
            );
        }
    }
    // Half precision: 2049 is not an f16, so x = 2048.5 is not either; halves below 1024 are.
    assert_exact(
        &unary("round", F16, &[0.5, 1.5, 2.5, 1023.5, -3.5]),
        F16,
        &[5],
        &[0.0, 2.0, 2.0, 1024.0, -4.0],
    );
    // Integers are their own floor and ceil; sign is -1, 0 or 1. (round is of floats only,
    // as ONNX's is: an integer operand is promoted.)
    let ints = [-7.0, 0.0, 5.0, 2147483647.0];
    assert_exact(&unary("floor", I32, &ints), I32, &[4], &ints);
    assert_exact(&unary("ceil", I32, &ints), I32, &[4], &ints);
    assert_exact(
        &unary("sign", I32, &ints),
        I32,
        &[4],
        &[-1.0, 0.0, 1.0, 1.0],
    );
}

// ------------------------------------------------------------------------------------- arithmetic

#[test]
fn add_sub_mul_div_neg_exact_values() {
    let a = [1.5, -2.0, 0.25, 6.0];
    let b = [2.0, 0.5, -0.25, -4.0];
    assert_exact(
        &binary("add", F32, &a, &b),
        F32,
        &[4],
        &[3.5, -1.5, 0.0, 2.0],
    );
    assert_exact(
        &binary("sub", F32, &a, &b),
        F32,
        &[4],
        &[-0.5, -2.5, 0.5, 10.0],
    );
    assert_exact(
        &binary("mul", F32, &a, &b),
        F32,
        &[4],
        &[3.0, -1.0, -0.0625, -24.0],
    );
    assert_exact(
        &binary("div", F32, &a, &b),
        F32,
        &[4],
        &[0.75, -4.0, -1.0, -1.5],
    );
    assert_exact(&unary("neg", F32, &a), F32, &[4], &[-1.5, 2.0, -0.25, -6.0]);
    // Inexact quotients are the correctly rounded f32 quotient (f64 then f32 is innocuous
    // double rounding for division).
    let q = binary("div", F32, &[1.0, 2.0, -7.0], &[3.0, 7.0, 10.0]);
    assert_exact(
        &q,
        F32,
        &[3],
        &[
            (1.0f32 / 3.0) as f64,
            (2.0f32 / 7.0) as f64,
            (-7.0f32 / 10.0) as f64,
        ],
    );
    // The same in f64 keeps f64 precision.
    let q = binary("div", F64, &[1.0], &[3.0]);
    assert_exact(&q, F64, &[1], &[1.0 / 3.0]);
    // 2^24 + 1 is not an f32.
    let s = binary("add", F32, &[16777216.0], &[1.0]);
    assert_exact(&s, F32, &[1], &[16777216.0]);
    let s = binary("add", F64, &[16777216.0], &[1.0]);
    assert_exact(&s, F64, &[1], &[16777217.0]);
}

#[test]
fn arithmetic_ieee_special_values() {
    let a = [INF, 0.0, 1.0, -1.0, 1.0, 0.0, NAN, -0.0, -0.0, INF];
    let b = [-INF, INF, 0.0, 0.0, -0.0, 0.0, 1.0, -0.0, 0.0, INF];
    assert_exact(
        &binary("add", F32, &a, &b),
        F32,
        &[10],
        &[NAN, INF, 1.0, -1.0, 1.0, 0.0, NAN, -0.0, 0.0, INF],
    );
    assert_exact(
        &binary("sub", F32, &a, &b),
        F32,
        &[10],
        &[INF, -INF, 1.0, -1.0, 1.0, 0.0, NAN, 0.0, -0.0, NAN],
    );
    assert_exact(
        &binary("mul", F32, &a, &b),
        F32,
        &[10],
        &[-INF, NAN, 0.0, -0.0, -0.0, 0.0, NAN, 0.0, -0.0, INF],
    );
    assert_exact(
        &binary("div", F32, &a, &b),
        F32,
        &[10],
        &[NAN, 0.0, INF, -INF, -INF, NAN, NAN, NAN, NAN, NAN],
    );
    assert_exact(
        &unary("neg", F32, &[0.0, -0.0, INF, -INF, NAN]),
        F32,
        &[5],
        &[-0.0, 0.0, -INF, INF, NAN],
    );
    // f32 overflow rounds to infinity.
    let big = f32::MAX as f64;
    assert_exact(&binary("add", F32, &[big], &[big]), F32, &[1], &[INF]);
    assert_exact(&binary("mul", F32, &[-big], &[2.0]), F32, &[1], &[-INF]);
}

#[test]
fn abs_max_min_relu_signed_zeros_and_nan() {
    assert_exact(
        &unary("abs", F32, &[-0.0, 0.0, -3.5, 2.0, -INF, NAN]),
        F32,
        &[6],
        &[0.0, 0.0, 3.5, 2.0, INF, NAN],
    );
    let a = [-0.0, 0.0, 1.0, NAN, 1.0, -INF, 3.0];
    let b = [0.0, -0.0, NAN, 1.0, 2.0, 5.0, -1.0];
    // max/min follow torch.maximum/minimum: NaN wins, +0 is above -0.
    assert_exact(
        &binary("max", F32, &a, &b),
        F32,
        &[7],
        &[0.0, 0.0, NAN, NAN, 2.0, 5.0, 3.0],
    );
    assert_exact(
        &binary("min", F32, &a, &b),
        F32,
        &[7],
        &[-0.0, -0.0, NAN, NAN, 1.0, -INF, -1.0],
    );
    // relu is max(x, 0): NaN stays NaN and -0 becomes +0.
    assert_exact(
        &unary("relu", F32, &[-0.0, 0.0, -2.0, 2.5, NAN, INF, -INF]),
        F32,
        &[7],
        &[0.0, 0.0, 0.0, 2.5, NAN, INF, 0.0],
    );
    // Integer operands stay integers.
    assert_exact(&unary("relu", I32, &[-3.0, 4.0]), I32, &[2], &[0.0, 4.0]);
    assert_exact(&unary("abs", I64, &[-3.0, 4.0]), I64, &[2], &[3.0, 4.0]);
    assert_exact(
        &binary("max", I32, &[-3.0, 4.0], &[1.0, 2.0]),
        I32,
        &[2],
        &[1.0, 4.0],
    );
    assert_exact(&unary("neg", I32, &[-3.0, 4.0]), I32, &[2], &[3.0, -4.0]);
}

#[test]
fn pow_values() {
    let a = [2.0, 2.0, 4.0, -2.0, -8.0, 0.0, 0.0, NAN, 1.0, 0.25, -0.0];
    let b = [
        10.0,
        -1.0,
        0.5,
        3.0,
        1.0 / 3.0,
        0.0,
        -1.0,
        0.0,
        NAN,
        -0.5,
        3.0,
    ];
    let expected = [
        1024.0, 0.5, 2.0, -8.0, NAN, // negative base, non-integer exponent
        1.0, INF, 1.0, // x^0 = 1 even for NaN
        1.0, // 1^y = 1 even for NaN
        2.0, -0.0,
    ];
    let got = binary("pow", F64, &a, &b);
    assert_exact(&got, F64, &[11], &expected);
    // f32: exact cases stay exact; others are within f32 rounding of the f64 power.
    let got = apply(
        "pow",
        &[],
        &[
            vector(F32, &[2.0, 16.0, 3.0]),
            vector(F32, &[10.0, -0.5, 2.0]),
        ],
    );
    assert_exact(&got, F32, &[3], &[1024.0, 0.25, 9.0]);
    let got = binary("pow", F32, &[9.0, 2.5, 0.75], &[-0.5, 1.5, -3.25]);
    let truth = [1.0 / 3.0, 2.5f64.powf(1.5), 0.75f64.powf(-3.25)];
    assert_close("pow f32", &got.values(), &truth, 1e-6);
    // Integer operands give f32 (like div).
    let got = binary("pow", I32, &[2.0, 2.0], &[3.0, -1.0]);
    assert_exact(&got, F32, &[2], &[8.0, 0.5]);
}

#[test]
fn clamp_defaults_bounds_and_nan() {
    let x = [-5.0, -1.0, 0.5, 2.0, 7.0, NAN, -INF, INF, -0.0];
    // Without attributes the bounds are -inf and inf: the identity.
    assert_exact(&unary("clamp", F32, &x), F32, &[9], &x);
    let both = [
        ("min", AttrValue::Float(-1.0)),
        ("max", AttrValue::Float(2.0)),
    ];
    assert_exact(
        &apply("clamp", &both, &[vector(F32, &x)]),
        F32,
        &[9],
        &[-1.0, -1.0, 0.5, 2.0, 2.0, NAN, -1.0, 2.0, -0.0],
    );
    let lower = [("min", AttrValue::Float(0.0))];
    assert_exact(
        &apply("clamp", &lower, &[vector(F32, &x)]),
        F32,
        &[9],
        &[0.0, 0.0, 0.5, 2.0, 7.0, NAN, 0.0, INF, 0.0],
    );
    let upper = [("max", AttrValue::Float(0.5))];
    assert_exact(
        &apply("clamp", &upper, &[vector(F32, &x)]),
        F32,
        &[9],
        &[-5.0, -1.0, 0.5, 0.5, 0.5, NAN, -INF, 0.5, -0.0],
    );
    // A NaN bound makes every result NaN (as torch.clamp).
    let nan_min = [("min", AttrValue::Float(NAN))];
    assert_exact(
        &apply("clamp", &nan_min, &[vector(F32, &[1.0, -1.0])]),
        F32,
        &[2],
        &[NAN, NAN],
    );
    // The bound is applied at compute precision and the result rounded to f16: 0.1 is not an
    // f16, so clamping up to it gives f16(0.1).
    let tenth = [("min", AttrValue::Float(0.1))];
    let got = apply("clamp", &tenth, &[vector(F16, &[0.0, 1.0])]);
    assert_exact(&got, F16, &[2], &[0.0999755859375, 1.0]);
}

// ------------------------------------------------------------------------------------- transcendental

/// (op, domain points, truth in f64) for the smooth unary ops.
/// An op, the points to evaluate it at, and its value in f64.
type Truth = (&'static str, Vec<f64>, fn(f64) -> f64);

fn unary_truths() -> Vec<Truth> {
    let general: Vec<f64> = vec![-1.0, -0.75, -0.5, -0.125, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0];
    let positive: Vec<f64> = vec![0.125, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 10.0, 100.0];
    // Half-based sigmoid, a different expression from the catalogue's 1 / (1 + exp(-x)).
    fn sigmoid(x: f64) -> f64 {
        0.5 * (1.0 + (0.5 * x).tanh())
    }
    vec![
        ("exp", general.clone(), f64::exp),
        ("log", positive.clone(), f64::ln),
        (
            "log1p",
            vec![-0.5, -0.125, 0.25, 1.0, 3.0, 100.0],
            f64::ln_1p,
        ),
        ("sqrt", positive.clone(), f64::sqrt),
        ("rsqrt", positive, |x| x.sqrt().recip()),
        ("sin", general.clone(), f64::sin),
        ("cos", general.clone(), f64::cos),
        ("tan", general.clone(), f64::tan),
        ("atan", general.clone(), f64::atan),
        ("tanh", general.clone(), f64::tanh),
        ("sigmoid", general.clone(), sigmoid),
        ("gelu", general.clone(), |x| {
            0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
        }),
        ("gelu_tanh", general.clone(), |x| {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }),
        ("silu", general.clone(), |x| x * sigmoid(x)),
        // Independent of the formula's libm erf: erf(x) = 1 - erfc(x).
        ("erf", general.clone(), |x| 1.0 - libm::erfc(x)),
        ("softplus", general, |x| x.exp().ln_1p()),
    ]
}

#[test]
fn smooth_unary_ops_match_f64_math_in_f32() {
    for (op, xs, truth) in unary_truths() {
        let got = unary(op, F32, &xs);
        assert_eq!(got.dtype, F32, "{op}");
        let expected: Vec<f64> = xs.iter().map(|&x| truth(x)).collect();
        assert_close(&format!("{op} f32"), &got.values(), &expected, 1e-6);
    }
}

#[test]
fn smooth_unary_ops_match_f64_math_in_f64() {
    for (op, xs, truth) in unary_truths() {
        let got = unary(op, F64, &xs);
        assert_eq!(got.dtype, F64, "{op}");
        let expected: Vec<f64> = xs.iter().map(|&x| truth(x)).collect();
        assert_close(&format!("{op} f64"), &got.values(), &expected, 1e-13);
    }
}

#[test]
fn gelu_matches_erf_closed_form_over_a_range() {
    let xs: Vec<f64> = (-40..=40).map(|i| i as f64 / 8.0).collect();
    let truth: Vec<f64> = xs
        .iter()
        .map(|&x| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)))
        .collect();
    let got = unary("gelu", F64, &xs);
    for ((g, t), x) in got.values().iter().zip(&truth).zip(&xs) {
        assert!(
            (g - t).abs() <= 1e-15 + 1e-13 * t.abs(),
            "gelu({x}) = {g}, truth {t}"
        );
    }
    // In f32, where erf's absolute error is relative to 1 + erf, compare on x >= -1 with
    // rtol 1e-6 and check the far tails' limits.
    let xs: Vec<f64> = (-8..=40).map(|i| i as f64 / 8.0).collect();
    let truth: Vec<f64> = xs
        .iter()
        .map(|&x| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)))
        .collect();
    assert_close("gelu f32", &unary("gelu", F32, &xs).values(), &truth, 1e-6);
    let tails = unary("gelu", F32, &[20.0, -20.0, 0.0]).values();
    assert_eq!(tails[0], 20.0);
    assert_eq!(tails[1].abs(), 0.0);
    assert_eq!(tails[2], 0.0);
    // gelu_tanh has the same limits; silu(x) = x * sigmoid(x) has silu(0) = 0 and
    // silu(x) -> x for large x.
    let t = unary("gelu_tanh", F32, &[20.0, -20.0, 0.0]).values();
    assert_eq!(t[0], 20.0);
    assert_eq!(t[1].abs(), 0.0);
    assert_eq!(t[2], 0.0);
    let s = unary("silu", F32, &[0.0, 100.0, -100.0]).values();
    assert_eq!(s[0], 0.0);
    assert_eq!(s[1], 100.0);
    assert!(s[2] <= 0.0 && s[2] > -1e-40, "silu(-100) = {}", s[2]);
}

#[test]
fn transcendental_special_values() {
    assert_exact(
        &unary("exp", F32, &[0.0, -0.0, INF, -INF, NAN, 100.0, -200.0]),
        F32,
        &[7],
        &[1.0, 1.0, INF, 0.0, NAN, INF, 0.0],
    );
    // e^88 fits in f32 (max 3.4e38), e^89 does not; in f16 (max 65504) e^11 fits, e^12 does not.
    let e = unary("exp", F32, &[88.0, 89.0]).values();
    assert!(e[0].is_finite() && e[1] == INF, "{e:?}");
    let e = unary("exp", F16, &[11.0, 12.0]).values();
    assert!(e[0].is_finite() && e[1] == INF, "{e:?}");
    assert_exact(
        &unary("log", F32, &[0.0, -0.0, -1.0, 1.0, INF, NAN, -INF]),
        F32,
        &[7],
        &[-INF, -INF, NAN, 0.0, INF, NAN, NAN],
    );
    assert_exact(
        &unary("log1p", F32, &[-1.0, -2.0, 0.0, -0.0, INF]),
        F32,
        &[5],
        &[-INF, NAN, 0.0, -0.0, INF],
    );
    assert_exact(
        &unary("sqrt", F32, &[-1.0, -0.0, 0.0, 4.0, INF, -INF]),
        F32,
        &[6],
        &[NAN, -0.0, 0.0, 2.0, INF, NAN],
    );
    assert_exact(
        &unary("rsqrt", F32, &[0.0, -0.0, 4.0, 0.25, INF, -1.0]),
        F32,
        &[6],
        &[INF, -INF, 0.5, 2.0, 0.0, NAN],
    );
    assert_exact(
        &unary("sin", F32, &[0.0, -0.0, INF, NAN]),
        F32,
        &[4],
        &[0.0, -0.0, NAN, NAN],
    );
    assert_exact(
        &unary("cos", F32, &[0.0, -0.0, INF]),
        F32,
        &[3],
        &[1.0, 1.0, NAN],
    );
    assert_exact(
        &unary("tanh", F32, &[0.0, -0.0, INF, -INF, 50.0, NAN]),
        F32,
        &[6],
        &[0.0, -0.0, 1.0, -1.0, 1.0, NAN],
    );
    assert_exact(
        &unary("sigmoid", F32, &[0.0, INF, -INF, NAN, 200.0, -200.0]),
        F32,
        &[6],
        &[0.5, 1.0, 0.0, NAN, 1.0, 0.0],
    );
    // Integer inputs give f32.
    assert_exact(&unary("exp", I32, &[0.0]), F32, &[1], &[1.0]);
    assert_exact(&unary("sqrt", I64, &[9.0]), F32, &[1], &[3.0]);
}

#[test]
fn softplus_is_stable_at_both_ends() {
    for dtype in [F32, F64, F16, BF16] {
        let got = unary("softplus", dtype, &[1000.0, -1000.0, INF, -INF, NAN]);
        assert_eq!(got.dtype, dtype);
        let v = got.values();
        assert_eq!(v[0], 1000.0, "{dtype}: softplus(1000) is exactly 1000");
        // log1p(exp(-1000)) underflows to zero in every dtype (e^-1000 < f64's smallest
        // subnormal).
        assert_eq!(v[1], 0.0, "{dtype}");
        assert_eq!(v[2], INF, "{dtype}");
        assert_eq!(v[3], 0.0, "{dtype}");
        assert!(v[4].is_nan(), "{dtype}");
    }
    // Near the overflow of the naive log(1 + exp(x)): softplus(100) = 100 + log1p(e^-100).
    let v = unary("softplus", F64, &[100.0, -100.0, 0.0]).values();
    assert_eq!(v[0], 100.0);
    assert_close("softplus(-100)", &v[1..2], &[(-100f64).exp()], 1e-13);
    assert_close("softplus(0)", &v[2..3], &[std::f64::consts::LN_2], 1e-15);
    // In f32, ln 2 rounds to the f32 nearest to it.
    let v = unary("softplus", F32, &[0.0]).values();
    assert_eq!(v[0], std::f64::consts::LN_2 as f32 as f64);
}

#[test]
fn half_precision_results_are_rounded_to_the_dtype() {
    // e = 2.71828..: between the f16 values 2.716796875 and 2.71875, nearer the second.
    assert_exact(&unary("exp", F16, &[1.0]), F16, &[1], &[2.71875]);
    // In bf16 (spacing 2^-6 in [2, 4)) the nearest is 2.71875 as well.
    assert_exact(&unary("exp", BF16, &[1.0]), BF16, &[1], &[2.71875]);
    // sqrt(2) = 1.41421..: f16 spacing 2^-10 gives 1448/1024 = 1.4140625.
    assert_exact(&unary("sqrt", F16, &[2.0]), F16, &[1], &[1.4140625]);
    // bf16 spacing 2^-7: 181/128 = 1.4140625 as well.
    assert_exact(&unary("sqrt", BF16, &[2.0]), BF16, &[1], &[1.4140625]);
    // 1/3 in f16: 1365/4096 = 0.333251953125 (0.3333 * 4096 = 1365.33).
    assert_exact(
        &binary("div", F16, &[1.0], &[3.0]),
        F16,
        &[1],
        &[0.333251953125],
    );
}

// ------------------------------------------------------------------------------------- comparisons

#[test]
fn comparisons_including_nan_and_signed_zero() {
    let a = [1.0, 2.0, 3.0, NAN, NAN, INF, -0.0, 1.0];
    let b = [2.0, 2.0, 2.0, 1.0, NAN, INF, 0.0, NAN];
    let cases: [(&str, [f64; 8]); 6] = [
        ("gt", [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        ("lt", [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        ("ge", [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]),
        ("le", [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]),
        ("eq", [0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]),
        ("ne", [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]),
    ];
    for (op, expected) in cases {
        for dtype in [F16, BF16, F32, F64] {
            assert_exact(&binary(op, dtype, &a, &b), Bool, &[8], &expected);
        }
    }
    // Mixed dtypes meet at the promoted dtype: f16(0.1) = 0.0999755859375 < f32(0.1).
    let h = vector(F16, &[0.0999755859375]);
    let s = vector(F32, &[0.1f32 as f64]);
    assert_exact(
        &apply("lt", &[], &[h.clone(), s.clone()]),
        Bool,
        &[1],
        &[1.0],
    );
    assert_exact(&apply("eq", &[], &[h, s]), Bool, &[1], &[0.0]);
    // Integers with floats: 3 < 3.5, and integers with integers.
    let i = vector(I32, &[3.0, 4.0]);
    let f = vector(F32, &[3.5, 3.5]);
    assert_exact(&apply("lt", &[], &[i.clone(), f]), Bool, &[2], &[1.0, 0.0]);
    let j = vector(I64, &[3.0, 5.0]);
    assert_exact(&apply("ge", &[], &[i, j]), Bool, &[2], &[1.0, 0.0]);
    // Booleans compare as 0 and 1.
    let t = vector(Bool, &[1.0, 0.0]);
    let u = vector(Bool, &[0.0, 0.0]);
    assert_exact(&apply("gt", &[], &[t, u]), Bool, &[2], &[1.0, 0.0]);
}

#[test]
fn where_selects_with_a_bool_condition() {
    let c = vector(Bool, &[1.0, 0.0, 1.0, 0.0]);
    let a = vector(F32, &[1.0, 2.0, 3.0, NAN]);
    let b = vector(F32, &[10.0, 20.0, 30.0, 40.0]);
    // The branch not taken does not leak, NaN included.
    assert_exact(
        &apply("where", &[], &[c.clone(), a, b]),
        F32,
        &[4],
        &[1.0, 20.0, 3.0, 40.0],
    );
    // Branches promote (f16 with f32 gives f32); the condition does not take part.
    let a = vector(F16, &[0.0999755859375; 4]);
    let b = vector(F32, &[0.1f32 as f64; 4]);
    assert_exact(
        &apply("where", &[], &[c, a, b]),
        F32,
        &[4],
        &[
            0.0999755859375,
            0.1f32 as f64,
            0.0999755859375,
            0.1f32 as f64,
        ],
    );
    // Broadcasting: c [3, 1], a [1, 2], b scalar.
    let c = tensor(Bool, &[3, 1], &[1.0, 0.0, 1.0]);
    let a = tensor(I32, &[1, 2], &[7.0, 8.0]);
    let b = Tensor::scalar(I32, -1.0);
    assert_exact(
        &apply("where", &[], &[c, a, b]),
        I32,
        &[3, 2],
        &[7.0, 8.0, -1.0, -1.0, 7.0, 8.0],
    );
    // A condition computed by a comparison, in a graph: where(x > 0, x, 0.5 * x).
    let mut g = GraphBuilder::new("leaky");
    let x = g.input("x", F32, &[4]);
    let zero = g.constant("zero", 0.0, F32);
    let half = g.constant("half", 0.5, F32);
    let pos = g.op("pos", "gt", &[&x, &zero]);
    let scaled = g.op("scaled", "mul", &[&half, &x]);
    let out = g.op("out", "where", &[&pos, &x, &scaled]);
    let graph = g.finish(&[&out]);
    let inputs = Tensors::from([("x".to_string(), vector(F32, &[-2.0, -0.0, 3.0, NAN]))]);
    let got = evaluate(&graph, &CATALOGUE, &inputs)
        .unwrap()
        .remove("out")
        .unwrap();
    assert_exact(&got, F32, &[4], &[-1.0, -0.0, 3.0, NAN]);
    // A non-bool condition is a dtype error.
    let err = apply_err(
        "where",
        &[],
        &[
            vector(F32, &[1.0]),
            vector(F32, &[1.0]),
            vector(F32, &[2.0]),
        ],
    );
    assert!(matches!(err, ErrorKind::DType(_)), "{err:?}");
}

// ------------------------------------------------------------------------------------- casts

fn cast(x: Tensor, to: DType) -> Tensor {
    apply("cast", &[("dtype", AttrValue::DType(to))], &[x])
}

#[test]
fn cast_f32_to_f16_rounds_to_nearest_even() {
    let p = |e: i32| 2f64.powi(e);
    let x = vector(
        F32,
        &[
            1.0 + p(-11),          // halfway between 1 and 1 + 2^-10: to even, 1
            1.0 + 3.0 * p(-11),    // halfway between 1 + 2^-10 and 1 + 2^-9: to even, 1 + 2^-9
            1.0 + p(-11) + p(-20), // just above halfway: up
            65504.0,               // the largest f16
            65519.0,               // below the midpoint to 65536: 65504
            65520.0,               // the midpoint: to even, which overflows to inf
            -65520.0,
            p(-25),       // half the smallest subnormal: to even, 0
            3.0 * p(-26), // three quarters of it: up to 2^-24
            p(-24),
            -0.0,
            NAN,
            INF,
            0.1f32 as f64,
        ],
    );
    assert_exact(
        &cast(x, F16),
        F16,
        &[14],
        &[
            1.0,
            1.0 + p(-9),
            1.0 + p(-10),
            65504.0,
            65504.0,
            INF,
            -INF,
            0.0,
            p(-24),
            p(-24),
            -0.0,
            NAN,
            INF,
            0.0999755859375,
        ],
    );
    // From f64, a cast rounds once from the exact value: 1 + 2^-11 + 2^-40 is above the
    // midpoint, although going through f32 (which drops 2^-40) would land on it and round down.
    let x = vector(F64, &[1.0 + p(-11) + p(-40)]);
    assert_exact(&cast(x, F16), F16, &[1], &[1.0 + p(-10)]);
}

#[test]
fn cast_to_bf16_f32_and_between_floats() {
    let p = |e: i32| 2f64.powi(e);
    let x = vector(
        F32,
        &[
            1.0 + p(-8),       // halfway: to even, 1
            1.0 + 3.0 * p(-9), // halfway between 1 + 2^-8 and 1 + 2^-7: to even, 1 + 2^-7
            1.0 + p(-8) + p(-20),
            1.0 + p(-8) + p(-23), // above the midpoint by the last f32 bit only: up
            f32::MAX as f64,      // rounds up past the largest bf16: inf
            -0.0,
            NAN,
        ],
    );
    assert_exact(
        &cast(x, BF16),
        BF16,
        &[7],
        &[1.0, 1.0 + p(-7), 1.0 + p(-7), 1.0 + p(-7), INF, -0.0, NAN],
    );
    // f64 to f32 rounds to nearest; f16 and bf16 to f32 are exact.
    assert_exact(
        &cast(vector(F64, &[0.1, 1e300, -1e-300]), F32),
        F32,
        &[3],
        &[0.1f32 as f64, INF, -0.0],
    );
    let h = vector(F16, &[0.0999755859375, 65504.0]);
    assert_exact(&cast(h, F32), F32, &[2], &[0.0999755859375, 65504.0]);
    let b = vector(BF16, &[1.0 + p(-7)]);
    assert_exact(&cast(b, F64), F64, &[1], &[1.0 + p(-7)]);
    // f16 to bf16: bf16 spacing at 1 is 2^-7, so 1 + 2^-10 is below the midpoint and rounds to
    // 1; 65504 lies between the bf16 values 65280 and 65536, nearer the second.
    let h = vector(F16, &[1.0 + p(-10), 65504.0]);
    assert_exact(&cast(h, BF16), BF16, &[2], &[1.0, 65536.0]);
}

#[test]
fn cast_to_integers_truncates_and_to_bool_tests_nonzero() {
    let x = vector(
        F32,
        &[2.7, -2.7, -0.5, 0.5, 1e10, -1e10, NAN, 7.0, -0.0].map(|v: f64| v as f32 as f64),
    );
    assert_exact(
        &cast(x.clone(), I32),
        I32,
        &[9],
        &[
            2.0,
            -2.0,
            0.0,
            0.0,
            i32::MAX as f64,
            i32::MIN as f64,
            0.0,
            7.0,
            0.0,
        ],
    );
    let got = cast(x, I64).values();
    assert_eq!(&got[..4], &[2.0, -2.0, 0.0, 0.0]);
    assert_eq!(got[4], 1e10f32 as f64);
    // i32 to bool is `!= 0`.
    assert_exact(
        &cast(vector(I32, &[0.0, 5.0, -1.0]), Bool),
        Bool,
        &[3],
        &[0.0, 1.0, 1.0],
    );
    // Floats to bool: -0 is false, NaN is true (as in PyTorch).
    assert_exact(
        &cast(vector(F32, &[0.0, -0.0, 0.5, NAN, -INF]), Bool),
        Bool,
        &[5],
        &[0.0, 0.0, 1.0, 1.0, 1.0],
    );
    // Bool and i32 to floats are exact; a large i32 rounds to f32.
    assert_exact(
        &cast(vector(Bool, &[1.0, 0.0]), F16),
        F16,
        &[2],
        &[1.0, 0.0],
    );
    assert_exact(
        &cast(vector(I32, &[16777217.0, -3.0]), F32),
        F32,
        &[2],
        &[16777216.0, -3.0],
    );
    // i32 to f16 past 65504 overflows to inf.
    assert_exact(&cast(vector(I32, &[70000.0]), F16), F16, &[1], &[INF]);
}

#[test]
fn const_is_a_scalar_of_its_dtype() {
    let mut g = GraphBuilder::new("consts");
    let a = g.constant("a", 0.1, F16);
    let b = g.op_with("b", "const", &[], &[("value", AttrValue::Float(0.1))]);
    let c = g.constant("c", -2.5, I32);
    let d = g.constant("d", 3.0, Bool);
    let graph = g.finish(&[&a, &b, &c, &d]);
    let out = evaluate(&graph, &CATALOGUE, &Tensors::new()).unwrap();
    assert_exact(&out["a"], F16, &[], &[0.0999755859375]);
    // The default dtype is f32.
    assert_exact(&out["b"], F32, &[], &[0.1f32 as f64]);
    assert_exact(&out["c"], I32, &[], &[-2.0]);
    assert_exact(&out["d"], Bool, &[], &[1.0]);
}

// ------------------------------------------------------------------------------------- eager rounding and promotion

#[test]
fn eager_rounding_after_every_op() {
    // (x + y) - y with x = 1, y = 2048: 2049 is halfway between the f16 values 2048 and 2050,
    // so the sum rounds to the even 2048 and the difference is 0. In f32 it is 1.
    let run = |dtype: DType, y: f64| {
        let mut g = GraphBuilder::new("eager");
        let x = g.input("x", dtype, &[1]);
        let yv = g.input("y", dtype, &[1]);
        let s = g.op("s", "add", &[&x, &yv]);
        let d = g.op("d", "sub", &[&s, &yv]);
        let graph = g.finish(&[&s, &d]);
        let inputs = Tensors::from([
            ("x".to_string(), vector(dtype, &[1.0])),
            ("y".to_string(), vector(dtype, &[y])),
        ]);
        let out = evaluate(&graph, &CATALOGUE, &inputs).unwrap();
        (out["s"].values()[0], out["d"].values()[0])
    };
    assert_eq!(run(F16, 2048.0), (2048.0, 0.0));
    assert_eq!(run(F32, 2048.0), (2049.0, 1.0));
    // bf16 keeps 8 significant bits: 257 is halfway between 256 and 258, to even 256.
    assert_eq!(run(BF16, 256.0), (256.0, 0.0));
    assert_eq!(run(F32, 256.0), (257.0, 1.0));
    // 3 + 2048 = 2051 is halfway between 2050 and 2052: to even, 2052.
    let mut g = GraphBuilder::new("eager2");
    let x = g.input("x", F16, &[1]);
    let y = g.input("y", F16, &[1]);
    let s = g.op("s", "add", &[&x, &y]);
    let graph = g.finish(&[&s]);
    let inputs = Tensors::from([
        ("x".to_string(), vector(F16, &[3.0])),
        ("y".to_string(), vector(F16, &[2048.0])),
    ]);
    let out = evaluate(&graph, &CATALOGUE, &inputs).unwrap();
    assert_exact(&out["s"], F16, &[1], &[2052.0]);
}

#[test]
fn type_promotion() {
    let p = |e: i32| 2f64.powi(e);
    // f16 + f32 -> f32, computed from the f16 value exactly.
    let got = apply(
        "add",
        &[],
        &[
            vector(F16, &[0.0999755859375]),
            vector(F32, &[0.1f32 as f64]),
        ],
    );
    assert_exact(
        &got,
        F32,
        &[1],
        &[(0.0999755859375f64 as f32 + 0.1f32) as f64],
    );
    // f16 + bf16 -> f32: 1 + 2^-10 (an f16) plus 2^-7 + 2^-14 (a bf16) is exact in f32 only.
    let got = apply(
        "add",
        &[],
        &[
            vector(F16, &[1.0 + p(-10)]),
            vector(BF16, &[p(-7) + p(-14)]),
        ],
    );
    assert_exact(&got, F32, &[1], &[1.0 + p(-7) + p(-10) + p(-14)]);
    // i32 / i32 is true division in f32.
    let got = binary("div", I32, &[7.0, 1.0, -7.0], &[2.0, 3.0, 2.0]);
    assert_exact(&got, F32, &[3], &[3.5, (1.0f32 / 3.0) as f64, -3.5]);
    // i32 + i32 stays i32; i32 + i64 is i64; i64 + f16 is f16; bool + i32 is i32.
    assert_exact(&binary("add", I32, &[2.0], &[3.0]), I32, &[1], &[5.0]);
    let got = apply("mul", &[], &[vector(I32, &[3.0]), vector(I64, &[-4.0])]);
    assert_exact(&got, I64, &[1], &[-12.0]);
    let got = apply("add", &[], &[vector(I64, &[2049.0]), vector(F16, &[0.0])]);
    assert_exact(&got, F16, &[1], &[2048.0]);
    let got = apply("add", &[], &[vector(Bool, &[1.0]), vector(I32, &[41.0])]);
    assert_exact(&got, I32, &[1], &[42.0]);
    // f32 with f64 gives f64.
    let got = apply("add", &[], &[vector(F32, &[1.0]), vector(F64, &[p(-40)])]);
    assert_exact(&got, F64, &[1], &[1.0 + p(-40)]);
    // Sum of bool counts into i64; sum of i32 is i64 too; mean of integers is f32.
    let b = vector(Bool, &[1.0, 1.0, 0.0, 1.0]);
    assert_exact(&apply("sum", &[], &[b]), I64, &[], &[3.0]);
    let i = vector(I32, &[2147483647.0, 1.0]);
    assert_exact(&apply("sum", &[], &[i]), I64, &[], &[2147483648.0]);
    let i = vector(I32, &[1.0, 2.0]);
    assert_exact(&apply("mean", &[], &[i]), F32, &[], &[1.5]);
    // reduce_max keeps the dtype.
    let i = vector(I32, &[1.0, 7.0, -3.0]);
    assert_exact(&apply("reduce_max", &[], &[i]), I32, &[], &[7.0]);
}

#[test]
fn broadcasting() {
    // [3, 1] + [1, 4] -> [3, 4].
    let a = tensor(F32, &[3, 1], &[0.0, 10.0, 20.0]);
    let b = tensor(F32, &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let expected: Vec<f64> = (0..3)
        .flat_map(|i| (1..=4).map(move |j| (10 * i + j) as f64))
        .collect();
    assert_exact(&apply("add", &[], &[a, b]), F32, &[3, 4], &expected);
    // Rank extension: [3] with [2, 3].
    let a = vector(F32, &[1.0, 2.0, 3.0]);
    let b = tensor(F32, &[2, 3], &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
    assert_exact(
        &apply("mul", &[], &[a, b]),
        F32,
        &[2, 3],
        &[10.0, 40.0, 90.0, 40.0, 100.0, 180.0],
    );
    // A scalar (shape []) with [2, 2], on either side.
    let s = Tensor::scalar(F32, 10.0);
    let m = tensor(F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    assert_exact(
        &apply("sub", &[], &[s.clone(), m.clone()]),
        F32,
        &[2, 2],
        &[9.0, 8.0, 7.0, 6.0],
    );
    assert_exact(
        &apply("sub", &[], &[m, s]),
        F32,
        &[2, 2],
        &[-9.0, -8.0, -7.0, -6.0],
    );
    // [2, 1, 3] with [4, 1] -> [2, 4, 3].
    let a = tensor(F32, &[2, 1, 3], &iota(6));
    let b = tensor(F32, &[4, 1], &[0.0, 100.0, 200.0, 300.0]);
    let got = apply("add", &[], &[a, b]);
    let expected: Vec<f64> = (0..2)
        .flat_map(|i| (0..4).flat_map(move |j| (0..3).map(move |k| (100 * j + 3 * i + k) as f64)))
        .collect();
    assert_exact(&got, F32, &[2, 4, 3], &expected);
    // Incompatible shapes are a shape error.
    let err = apply_err(
        "add",
        &[],
        &[
            tensor(F32, &[2, 3], &iota(6)),
            tensor(F32, &[3, 2], &iota(6)),
        ],
    );
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
}

#[test]
fn empty_tensors() {
    let e = tensor(F32, &[0, 3], &[]);
    // Pointwise.
    for op in ["exp", "neg", "sigmoid", "relu", "gelu", "softplus"] {
        assert_exact(&apply(op, &[], std::slice::from_ref(&e)), F32, &[0, 3], &[]);
    }
    let row = tensor(F32, &[1, 3], &[1.0, 2.0, 3.0]);
    assert_exact(
        &apply("add", &[], &[e.clone(), row.clone()]),
        F32,
        &[0, 3],
        &[],
    );
    assert_exact(
        &apply("add", &[], &[e.clone(), Tensor::scalar(F32, 1.0)]),
        F32,
        &[0, 3],
        &[],
    );
    assert_exact(
        &apply("gt", &[], &[e.clone(), row.clone()]),
        Bool,
        &[0, 3],
        &[],
    );
    let c = tensor(Bool, &[0, 1], &[]);
    assert_exact(
        &apply("where", &[], &[c, row.clone(), e.clone()]),
        F32,
        &[0, 3],
        &[],
    );
    assert_exact(
        &apply(
            "cast",
            &[("dtype", AttrValue::DType(F16))],
            std::slice::from_ref(&e),
        ),
        F16,
        &[0, 3],
        &[],
    );
    // Reductions: the sum over an empty axis is 0, the mean NaN.
    let axes0 = [("axes", ints(&[0]))];
    assert_exact(
        &apply("sum", &axes0, std::slice::from_ref(&e)),
        F32,
        &[3],
        &[0.0; 3],
    );
    assert_exact(
        &apply("sum", &[], std::slice::from_ref(&e)),
        F32,
        &[],
        &[0.0],
    );
    assert_exact(
        &apply("mean", &axes0, std::slice::from_ref(&e)),
        F32,
        &[3],
        &[NAN; 3],
    );
    assert_exact(
        &apply("mean", &[], std::slice::from_ref(&e)),
        F32,
        &[],
        &[NAN],
    );
    let axes1 = [("axes", ints(&[1]))];
    assert_exact(
        &apply("sum", &axes1, std::slice::from_ref(&e)),
        F32,
        &[0],
        &[],
    );
    assert_exact(
        &apply("mean", &axes1, std::slice::from_ref(&e)),
        F32,
        &[0],
        &[],
    );
    // reduce_max over the non-empty axis leaves an empty result; over the empty one it is
    // -inf for a float (ONNX's ReduceMax; the composite reduce_min gives +inf), and an error for
    // an integer, whose type's minimum the backends do not start from.
    assert_exact(
        &apply("reduce_max", &axes1, std::slice::from_ref(&e)),
        F32,
        &[0],
        &[],
    );
    assert_exact(
        &apply("reduce_max", &axes0, std::slice::from_ref(&e)),
        F32,
        &[3],
        &[-INF; 3],
    );
    let h = tensor(F16, &[0, 2], &[]);
    assert_exact(
        &apply("reduce_max", &axes0, std::slice::from_ref(&h)),
        F16,
        &[2],
        &[-INF; 2],
    );
    let i = tensor(I32, &[0, 3], &[]);
    let err = apply_err("reduce_max", &axes0, std::slice::from_ref(&i));
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
    let keep = [("axes", ints(&[0])), ("keepdim", AttrValue::Bool(true))];
    assert_exact(
        &apply("sum", &keep, std::slice::from_ref(&e)),
        F32,
        &[1, 3],
        &[0.0; 3],
    );
    assert_exact(
        &apply(
            "sum_to_size",
            &[("shape", ints(&[1, 3]))],
            std::slice::from_ref(&e),
        ),
        F32,
        &[1, 3],
        &[0.0; 3],
    );
    let b = tensor(Bool, &[0], &[]);
    assert_exact(&apply("sum", &[], &[b]), I64, &[], &[0.0]);
    // Layout ops.
    assert_exact(
        &apply(
            "reshape",
            &[("shape", ints(&[3, 0]))],
            std::slice::from_ref(&e),
        ),
        F32,
        &[3, 0],
        &[],
    );
    assert_exact(
        &apply(
            "reshape",
            &[("shape", ints(&[-1, 3]))],
            std::slice::from_ref(&e),
        ),
        F32,
        &[0, 3],
        &[],
    );
    assert_exact(
        &apply("transpose", &[], std::slice::from_ref(&e)),
        F32,
        &[3, 0],
        &[],
    );
    assert_exact(
        &apply(
            "slice",
            &[("axis", AttrValue::Int(1)), ("start", AttrValue::Int(1))],
            std::slice::from_ref(&e),
        ),
        F32,
        &[0, 2],
        &[],
    );
    assert_exact(
        &apply(
            "broadcast_to",
            &[("shape", ints(&[0, 3]))],
            std::slice::from_ref(&row),
        ),
        F32,
        &[0, 3],
        &[],
    );
    let two = tensor(F32, &[2, 3], &iota(6));
    assert_exact(
        &apply("concat", &[], &[e.clone(), two.clone(), e.clone()]),
        F32,
        &[2, 3],
        &iota(6),
    );
    // A slice that selects nothing.
    let v = vector(F32, &iota(5));
    assert_exact(
        &apply(
            "slice",
            &[("start", AttrValue::Int(4)), ("end", AttrValue::Int(2))],
            &[v],
        ),
        F32,
        &[0],
        &[],
    );
    // Matmul: [2, 0] @ [0, 3] is a [2, 3] of zeros; [0, 2] @ [2, 3] is [0, 3].
    let a = tensor(F32, &[2, 0], &[]);
    let b = tensor(F32, &[0, 3], &[]);
    assert_exact(&apply("matmul", &[], &[a, b]), F32, &[2, 3], &[0.0; 6]);
    let a = tensor(F32, &[0, 2], &[]);
    let b = tensor(F32, &[2, 3], &iota(6));
    assert_exact(&apply("matmul", &[], &[a, b]), F32, &[0, 3], &[]);
    let a = tensor(F64, &[0], &[]);
    let b = tensor(F64, &[0], &[]);
    assert_exact(&apply("matmul", &[], &[a, b]), F64, &[], &[0.0]);
}

// ------------------------------------------------------------------------------------- reductions

#[test]
fn reductions_over_axes() {
    // x[i, j, k] = 12 i + 4 j + k over [2, 3, 4].
    let x = tensor(F32, &[2, 3, 4], &iota(24));
    let row_sum = |i: usize, j: usize| (0..4).map(|k| (12 * i + 4 * j + k) as f64).sum::<f64>();
    let expected: Vec<f64> = (0..2)
        .flat_map(|i| (0..3).map(move |j| row_sum(i, j)))
        .collect();
    let got = apply("sum", &[("axes", ints(&[-1]))], std::slice::from_ref(&x));
    assert_exact(&got, F32, &[2, 3], &expected);
    let got = apply("sum", &[("axes", ints(&[2]))], std::slice::from_ref(&x));
    assert_exact(&got, F32, &[2, 3], &expected);
    // Mean over axes 0 and 2 with keepdim: mean over i and k of 12 i + 4 j + k = 6 + 4 j + 1.5.
    let got = apply(
        "mean",
        &[("axes", ints(&[0, -1])), ("keepdim", AttrValue::Bool(true))],
        std::slice::from_ref(&x),
    );
    assert_exact(&got, F32, &[1, 3, 1], &[7.5, 11.5, 15.5]);
    // Without axes: every axis. Sum of 0..24 = 276.
    assert_exact(
        &apply("sum", &[], std::slice::from_ref(&x)),
        F32,
        &[],
        &[276.0],
    );
    assert_exact(
        &apply("mean", &[], std::slice::from_ref(&x)),
        F32,
        &[],
        &[11.5],
    );
    let keep_all = [("keepdim", AttrValue::Bool(true))];
    assert_exact(
        &apply("sum", &keep_all, std::slice::from_ref(&x)),
        F32,
        &[1, 1, 1],
        &[276.0],
    );
    // reduce_max over axis 1: the j = 2 row.
    let got = apply(
        "reduce_max",
        &[("axes", ints(&[1]))],
        std::slice::from_ref(&x),
    );
    let expected: Vec<f64> = (0..2)
        .flat_map(|i| (0..4).map(move |k| (12 * i + 8 + k) as f64))
        .collect();
    assert_exact(&got, F32, &[2, 4], &expected);
    // An empty axes list reduces nothing.
    let got = apply("sum", &[("axes", ints(&[]))], std::slice::from_ref(&x));
    assert_exact(&got, F32, &[2, 3, 4], &iota(24));
    // Out-of-range or repeated axes are errors.
    let err = apply_err("sum", &[("axes", ints(&[3]))], std::slice::from_ref(&x));
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
    let err = apply_err("mean", &[("axes", ints(&[1, -2]))], &[x]);
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
}

#[test]
fn reduce_max_propagates_nan_and_handles_infinities() {
    let x = tensor(
        F32,
        &[3, 3],
        &[1.0, NAN, 3.0, 4.0, 5.0, 6.0, -INF, -INF, -INF],
    );
    let got = apply(
        "reduce_max",
        &[("axes", ints(&[1]))],
        std::slice::from_ref(&x),
    );
    assert_exact(&got, F32, &[3], &[NAN, 6.0, -INF]);
    assert_exact(
        &apply("reduce_max", &[], std::slice::from_ref(&x)),
        F32,
        &[],
        &[NAN],
    );
    let got = apply("reduce_max", &[("axes", ints(&[0]))], &[x]);
    assert_exact(&got, F32, &[3], &[4.0, NAN, 6.0]);
    // NaN in the first position also wins.
    let x = vector(F32, &[NAN, 1.0, INF]);
    assert_exact(&apply("reduce_max", &[], &[x]), F32, &[], &[NAN]);
    // Sum and mean propagate NaN and inf as IEEE addition does.
    let x = vector(F32, &[1.0, INF, 2.0]);
    assert_exact(
        &apply("sum", &[], std::slice::from_ref(&x)),
        F32,
        &[],
        &[INF],
    );
    assert_exact(&apply("mean", &[], &[x]), F32, &[], &[INF]);
    let x = vector(F32, &[INF, -INF]);
    assert_exact(&apply("sum", &[], &[x]), F32, &[], &[NAN]);
}

#[test]
fn reductions_accumulate_exactly_and_round_once() {
    // f16: 2048 + 1 + 1 accumulated exactly is 2050 (an f16); adding in f16 step by step
    // would give 2048 twice over.
    let x = vector(F16, &[2048.0, 1.0, 1.0]);
    assert_exact(
        &apply("sum", &[], std::slice::from_ref(&x)),
        F16,
        &[],
        &[2050.0],
    );
    // The mean of f16 stays f16: 2050 / 3 = 683.33 rounds to 683.5 (f16 spacing 0.5 there).
    assert_exact(&apply("mean", &[], &[x]), F16, &[], &[683.5]);
    // The single rounding is from the exact sum: 1 + 2^-11 + 2^-24 is just above the midpoint
    // of 1 and 1 + 2^-10 (by less than f32 can hold), so it rounds up.
    let p = |e: i32| 2f64.powi(e);
    let x = vector(F16, &[1.0, p(-11), p(-24)]);
    assert_exact(&apply("sum", &[], &[x]), F16, &[], &[1.0 + p(-10)]);
    let x = vector(BF16, &[1.0, p(-8), p(-30)]);
    assert_exact(&apply("sum", &[], &[x]), BF16, &[], &[1.0 + p(-7)]);
    // f32: 1e8 + 1 - 1e8 = 1 exactly when accumulated in f64.
    let x = vector(F32, &[1e8, 1.0, -1e8]);
    assert_exact(&apply("sum", &[], &[x]), F32, &[], &[1.0]);
    // 1/3 as a mean: the f32 nearest to (1 + 0 + 0) / 3.
    let x = vector(F32, &[1.0, 0.0, 0.0]);
    assert_exact(
        &apply("mean", &[], &[x]),
        F32,
        &[],
        &[(1.0f32 / 3.0) as f64],
    );
}

#[test]
fn sum_to_size_is_the_adjoint_of_broadcast() {
    // x[r, c] = 3 r + c over [4, 3].
    let x = tensor(F32, &[4, 3], &iota(12));
    let col = |c: usize| (0..4).map(|r| (3 * r + c) as f64).sum::<f64>();
    let row = |r: usize| (0..3).map(|c| (3 * r + c) as f64).sum::<f64>();
    let to = |shape: &[i64]| {
        apply(
            "sum_to_size",
            &[("shape", ints(shape))],
            std::slice::from_ref(&x),
        )
    };
    assert_exact(&to(&[1, 3]), F32, &[1, 3], &[col(0), col(1), col(2)]);
    assert_exact(&to(&[3]), F32, &[3], &[col(0), col(1), col(2)]);
    assert_exact(
        &to(&[4, 1]),
        F32,
        &[4, 1],
        &[row(0), row(1), row(2), row(3)],
    );
    assert_exact(&to(&[4, 3]), F32, &[4, 3], &iota(12));
    assert_exact(&to(&[]), F32, &[], &[66.0]);
    assert_exact(&to(&[1, 1]), F32, &[1, 1], &[66.0]);
    // [2, 3, 4] to [3, 1]: sum over the leading axis and the last.
    let y = tensor(F32, &[2, 3, 4], &iota(24));
    let got = apply("sum_to_size", &[("shape", ints(&[3, 1]))], &[y]);
    let expected: Vec<f64> = (0..3)
        .map(|j| {
            (0..2)
                .flat_map(|i| (0..4).map(move |k| (12 * i + 4 * j + k) as f64))
                .sum()
        })
        .collect();
    assert_exact(&got, F32, &[3, 1], &expected);
    // bool accumulates into i64.
    let b = tensor(Bool, &[2, 2], &[1.0, 1.0, 0.0, 1.0]);
    let got = apply("sum_to_size", &[("shape", ints(&[2]))], &[b]);
    assert_exact(&got, I64, &[2], &[1.0, 2.0]);
    // A target that does not broadcast to the input is a shape error.
    let err = apply_err("sum_to_size", &[("shape", ints(&[2]))], &[x]);
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
}

// ------------------------------------------------------------------------------------- layout

#[test]
fn broadcast_to_replicates() {
    let v = vector(F16, &[1.0, 2.0, 3.0]);
    let got = apply("broadcast_to", &[("shape", ints(&[2, 3]))], &[v]);
    assert_exact(&got, F16, &[2, 3], &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    let c = tensor(I32, &[3, 1], &[1.0, 2.0, 3.0]);
    let got = apply("broadcast_to", &[("shape", ints(&[2, 3, 2]))], &[c]);
    let expected: Vec<f64> = (0..2)
        .flat_map(|_| (1..=3).flat_map(|v| [v as f64, v as f64]))
        .collect();
    assert_exact(&got, I32, &[2, 3, 2], &expected);
    let s = Tensor::scalar(Bool, 1.0);
    let got = apply("broadcast_to", &[("shape", ints(&[2, 2]))], &[s]);
    assert_exact(&got, Bool, &[2, 2], &[1.0; 4]);
    let err = apply_err(
        "broadcast_to",
        &[("shape", ints(&[2, 4]))],
        &[vector(F32, &[1.0, 2.0, 3.0])],
    );
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
}

#[test]
fn reshape_is_row_major_and_infers_minus_one() {
    let x = tensor(F32, &[2, 3, 4], &iota(24));
    let got = apply(
        "reshape",
        &[("shape", ints(&[4, -1]))],
        std::slice::from_ref(&x),
    );
    assert_exact(&got, F32, &[4, 6], &iota(24));
    let got = apply(
        "reshape",
        &[("shape", ints(&[-1]))],
        std::slice::from_ref(&x),
    );
    assert_exact(&got, F32, &[24], &iota(24));
    let got = apply(
        "reshape",
        &[("shape", ints(&[2, 1, -1, 3]))],
        std::slice::from_ref(&x),
    );
    assert_exact(&got, F32, &[2, 1, 4, 3], &iota(24));
    // Reshape after a transpose reads the transposed (logical) order.
    let mut g = GraphBuilder::new("tr");
    let m = g.input("m", F32, &[2, 3]);
    let t = g.op("t", "transpose", &[&m]);
    let r = g.op_with("r", "reshape", &[&t], &[("shape", ints(&[6]))]);
    let graph = g.finish(&[&r]);
    let inputs = Tensors::from([("m".to_string(), tensor(F32, &[2, 3], &iota(6)))]);
    let out = evaluate(&graph, &CATALOGUE, &inputs).unwrap();
    assert_exact(&out["r"], F32, &[6], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    for bad in [vec![5, -1], vec![-1, -1], vec![7, 3], vec![-2, 12]] {
        let err = apply_err(
            "reshape",
            &[("shape", ints(&bad))],
            std::slice::from_ref(&x),
        );
        assert!(matches!(err, ErrorKind::Shape(_)), "{bad:?}: {err:?}");
    }
}

#[test]
fn transpose_with_and_without_perm() {
    // x[i, j, k] = 12 i + 4 j + k.
    let x = tensor(F32, &[2, 3, 4], &iota(24));
    let at = |i: usize, j: usize, k: usize| (12 * i + 4 * j + k) as f64;
    // Default: axes reversed; out[k, j, i] = x[i, j, k].
    let got = apply("transpose", &[], std::slice::from_ref(&x));
    let expected: Vec<f64> = (0..4)
        .flat_map(|k| (0..3).flat_map(move |j| (0..2).map(move |i| at(i, j, k))))
        .collect();
    assert_exact(&got, F32, &[4, 3, 2], &expected);
    // perm [1, 0, 2]: out[j, i, k] = x[i, j, k].
    let got = apply(
        "transpose",
        &[("perm", ints(&[1, 0, 2]))],
        std::slice::from_ref(&x),
    );
    let expected: Vec<f64> = (0..3)
        .flat_map(|j| (0..2).flat_map(move |i| (0..4).map(move |k| at(i, j, k))))
        .collect();
    assert_exact(&got, F32, &[3, 2, 4], &expected);
    // Negative entries count from the end: [-1, 0, 1] = [2, 0, 1]; out[k, i, j].
    let got = apply(
        "transpose",
        &[("perm", ints(&[-1, 0, 1]))],
        std::slice::from_ref(&x),
    );
    let expected: Vec<f64> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| at(i, j, k))))
        .collect();
    assert_exact(&got, F32, &[4, 2, 3], &expected);
    // A scalar and a vector are their own transposes.
    assert_exact(
        &apply("transpose", &[], &[Tensor::scalar(F32, 5.0)]),
        F32,
        &[],
        &[5.0],
    );
    for bad in [vec![0, 1], vec![0, 0, 1], vec![0, 1, 3]] {
        let err = apply_err(
            "transpose",
            &[("perm", ints(&bad))],
            std::slice::from_ref(&x),
        );
        assert!(matches!(err, ErrorKind::Shape(_)), "{bad:?}: {err:?}");
    }
}

#[test]
fn slice_follows_python_rules() {
    let v = vector(F32, &iota(10));
    let s = |attrs: &[(&str, i64)]| {
        let attrs: Vec<(&str, AttrValue)> = attrs
            .iter()
            .map(|(k, v)| (*k, AttrValue::Int(*v)))
            .collect();
        apply("slice", &attrs, std::slice::from_ref(&v))
    };
    assert_exact(&s(&[("start", -3)]), F32, &[3], &[7.0, 8.0, 9.0]);
    assert_exact(&s(&[("step", 2)]), F32, &[5], &[0.0, 2.0, 4.0, 6.0, 8.0]);
    assert_exact(&s(&[("start", -4), ("step", 2)]), F32, &[2], &[6.0, 8.0]);
    assert_exact(
        &s(&[("start", 1), ("end", -1), ("step", 3)]),
        F32,
        &[3],
        &[1.0, 4.0, 7.0],
    );
    assert_exact(&s(&[("start", 8), ("end", 100)]), F32, &[2], &[8.0, 9.0]);
    assert_exact(&s(&[("start", -100), ("end", 2)]), F32, &[2], &[0.0, 1.0]);
    assert_exact(&s(&[("start", 3), ("end", 3)]), F32, &[0], &[]);
    assert_exact(&s(&[("end", -1), ("step", 4)]), F32, &[3], &[0.0, 4.0, 8.0]);
    // Along an inner axis (axis -1 of [3, 4]): columns 1 and 3.
    let m = tensor(I32, &[3, 4], &iota(12));
    let got = apply(
        "slice",
        &[
            ("axis", AttrValue::Int(-1)),
            ("start", AttrValue::Int(1)),
            ("step", AttrValue::Int(2)),
        ],
        std::slice::from_ref(&m),
    );
    assert_exact(&got, I32, &[3, 2], &[1.0, 3.0, 5.0, 7.0, 9.0, 11.0]);
    // Along axis 0: rows -2.. = rows 1 and 2.
    let got = apply(
        "slice",
        &[("start", AttrValue::Int(-2))],
        std::slice::from_ref(&m),
    );
    assert_exact(&got, I32, &[2, 4], &iota(12)[4..]);
    // A step of zero or below is an error, and so is an axis out of range.
    for bad in [("step", 0), ("step", -1), ("axis", 2)] {
        let err = apply_err(
            "slice",
            &[(bad.0, AttrValue::Int(bad.1))],
            std::slice::from_ref(&m),
        );
        assert!(matches!(err, ErrorKind::Shape(_)), "{bad:?}: {err:?}");
    }
}

/// gather along each axis of a [2, 3] f16 table (negative axis, negative and out-of-range
/// indices: NaN), of i64 data with a rank-2 index (out of range: 0), and gather_elements
/// along the rows with a narrower index tensor.
#[test]
fn gathers_read_at_run_time_indices() {
    let m = tensor(F16, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let rows = tensor(I64, &[3], &[1.0, -2.0, 2.0]);
    let got = apply("gather", &[], &[m.clone(), rows]);
    assert_exact(
        &got,
        F16,
        &[3, 3],
        &[4.0, 5.0, 6.0, 1.0, 2.0, 3.0, NAN, NAN, NAN],
    );
    let cols = tensor(I32, &[2], &[-1.0, 0.0]);
    let got = apply(
        "gather",
        &[("axis", AttrValue::Int(-1))],
        &[m.clone(), cols],
    );
    assert_exact(&got, F16, &[2, 2], &[3.0, 1.0, 6.0, 4.0]);
    let data = tensor(I64, &[3], &[7.0, -8.0, 9.0]);
    let ids = tensor(I32, &[2, 2], &[2.0, 3.0, -3.0, -4.0]);
    assert_exact(
        &apply("gather", &[], &[data, ids]),
        I64,
        &[2, 2],
        &[9.0, 0.0, 7.0, 0.0],
    );
    let pick = tensor(I64, &[2, 2], &[2.0, 0.0, -1.0, 5.0]);
    let got = apply(
        "gather_elements",
        &[("axis", AttrValue::Int(1))],
        &[m, pick],
    );
    assert_exact(&got, F16, &[2, 2], &[3.0, 1.0, 6.0, NAN]);
}

/// scatter_add into a [2, 3] table along each axis: a repeated index adds twice, a negative
/// one counts from the end, one out of range adds nothing; bf16 rounds after each addition
/// (256 + 1 is 256 in bf16, twice), and i64 keeps every bit.
#[test]
fn scatter_add_adds_updates_at_run_time_indices() {
    let m = tensor(BF16, &[2, 3], &[256.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ids = tensor(I32, &[2, 3], &[0.0, -1.0, 2.0, 0.0, 1.0, 1.0]);
    let ones = tensor(BF16, &[2, 3], &[1.0; 6]);
    assert_exact(
        &apply("scatter_add", &[], &[m.clone(), ids, ones]),
        BF16,
        &[2, 3],
        // Column 0 adds 1 to 256 twice; column 1 reaches row 1 twice (-1 and 1); column 2's
        // index 2 is out of range and the next adds to row 1.
        &[256.0, 2.0, 3.0, 4.0, 7.0, 7.0],
    );
    let ids = tensor(I64, &[1, 2], &[-3.0, 3.0]);
    let upd = tensor(BF16, &[1, 2], &[10.0, 20.0]);
    assert_exact(
        &apply(
            "scatter_add",
            &[("axis", AttrValue::Int(-1))],
            &[m, ids, upd],
        ),
        BF16,
        &[2, 3],
        &[266.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    );
    let data = Tensor::from_ints(I64, &[2], vec![i64::MAX - 1, 0]).unwrap();
    let ids = tensor(I64, &[3], &[0.0, 1.0, -2.0]);
    let upd = Tensor::from_ints(I64, &[3], vec![1, 5, 1]).unwrap();
    let got = apply("scatter_add", &[], &[data, ids, upd]);
    assert_eq!(got.ints().as_slice().unwrap(), &[i64::MIN, 5]);
}

#[test]
fn concat_promotes_and_joins() {
    // Three inputs of three dtypes meet at f32.
    let a = tensor(F16, &[1, 2], &[0.0999755859375, 1.0]);
    let b = tensor(I32, &[2, 2], &[2.0, 3.0, 4.0, 5.0]);
    let c = tensor(F32, &[1, 2], &[0.1f32 as f64, -0.0]);
    let got = apply("concat", &[], &[a.clone(), b.clone(), c.clone()]);
    assert_exact(
        &got,
        F32,
        &[4, 2],
        &[
            0.0999755859375,
            1.0,
            2.0,
            3.0,
            4.0,
            5.0,
            0.1f32 as f64,
            -0.0,
        ],
    );
    // Along the last axis: [2, 1] ++ [2, 2] ++ [2, 3].
    let a = tensor(F32, &[2, 1], &[1.0, 2.0]);
    let b = tensor(BF16, &[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let c = tensor(I64, &[2, 3], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    let got = apply("concat", &[("axis", AttrValue::Int(-1))], &[a, b, c]);
    assert_exact(
        &got,
        F32,
        &[2, 6],
        &[
            1.0, 3.0, 4.0, 7.0, 8.0, 9.0, 2.0, 5.0, 6.0, 10.0, 11.0, 12.0,
        ],
    );
    // f16 with bf16 meets at f32; i32 with bool at i32; f16 with i64 at f16 (so a large
    // integer rounds to f16).
    let got = apply(
        "concat",
        &[],
        &[
            vector(F16, &[1.0 + 2f64.powi(-10)]),
            vector(BF16, &[1.0 + 2f64.powi(-7)]),
        ],
    );
    assert_exact(
        &got,
        F32,
        &[2],
        &[1.0 + 2f64.powi(-10), 1.0 + 2f64.powi(-7)],
    );
    let got = apply("concat", &[], &[vector(Bool, &[1.0]), vector(I32, &[-5.0])]);
    assert_exact(&got, I32, &[2], &[1.0, -5.0]);
    let got = apply(
        "concat",
        &[],
        &[vector(I64, &[2049.0]), vector(F16, &[0.5])],
    );
    assert_exact(&got, F16, &[2], &[2048.0, 0.5]);
    // One input is a copy.
    let got = apply("concat", &[], &[vector(F32, &[1.0, 2.0])]);
    assert_exact(&got, F32, &[2], &[1.0, 2.0]);
    // Mismatched shapes outside the axis are an error; so is no input at all.
    let err = apply_err(
        "concat",
        &[],
        &[
            tensor(F32, &[1, 2], &[1.0, 2.0]),
            tensor(F32, &[1, 3], &[1.0, 2.0, 3.0]),
        ],
    );
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
    let err = apply_err("concat", &[], &[]);
    assert!(matches!(err, ErrorKind::Arity { .. }), "{err:?}");
}

// ------------------------------------------------------------------------------------- matmul

/// Naive NumPy matmul in f64 over row-major data, for batched shapes [.., n, k] @ [.., k, m]
/// whose batch dims are equal or 1.
fn naive_matmul(a: &[f64], a_shape: &[usize], b: &[f64], b_shape: &[usize]) -> Vec<f64> {
    let (n, k) = (a_shape[a_shape.len() - 2], a_shape[a_shape.len() - 1]);
    let m = b_shape[b_shape.len() - 1];
    let ab = &a_shape[..a_shape.len() - 2];
    let bb = &b_shape[..b_shape.len() - 2];
    let rank = ab.len().max(bb.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (ab, bb) = (pad(ab), pad(bb));
    let batch: Vec<usize> = ab.iter().zip(&bb).map(|(x, y)| *x.max(y)).collect();
    let total: usize = batch.iter().product();
    let mut out = Vec::new();
    for flat in 0..total {
        // Batch index, then each operand's (broadcast) batch offset.
        let mut rem = flat;
        let mut idx = vec![0; rank];
        for d in (0..rank).rev() {
            idx[d] = rem % batch[d];
            rem /= batch[d];
        }
        let offset = |dims: &[usize]| {
            idx.iter()
                .zip(dims)
                .fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i })
        };
        let (ao, bo) = (offset(&ab) * n * k, offset(&bb) * k * m);
        for i in 0..n {
            for j in 0..m {
                out.push((0..k).map(|p| a[ao + i * k + p] * b[bo + p * m + j]).sum());
            }
        }
    }
    out
}

/// Operands whatever their memory layout: a concat along the last axis comes out of the
/// evaluator column-major, which the batched reshapes once rejected ("incompatible memory
/// layout"; found by the CPU property test on `[64] @ concat([x, x], -1)`).
#[test]
fn matmul_of_a_concat_along_the_last_axis() {
    let xv: Vec<f64> = (0..12).map(|i| (i % 5) as f64 - 2.0).collect();
    let x = tensor(F32, &[4, 3], &xv);
    let joined = apply("concat", &[("axis", AttrValue::Int(-1))], &[x.clone(), x]);
    let jv = joined.values();
    assert_eq!(joined.shape(), &[4, 6]);
    let v = vector(F32, &[1.0, -2.0, 3.0, 0.5]);
    let got = apply("matmul", &[], &[v, joined.clone()]);
    let expected = naive_matmul(&[1.0, -2.0, 3.0, 0.5], &[1, 4], &jv, &[4, 6]);
    assert_exact(&got, F32, &[6], &expected);
    let m = tensor(F32, &[2, 4], &iota(8));
    let got = apply("matmul", &[], &[m, joined]);
    assert_exact(
        &got,
        F32,
        &[2, 6],
        &naive_matmul(&iota(8), &[2, 4], &jv, &[4, 6]),
    );
}

#[test]
fn matmul_2d_batched_and_1d() {
    let a = tensor(F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = tensor(F32, &[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    assert_exact(
        &apply("matmul", &[], &[a, b]),
        F32,
        &[2, 2],
        &[19.0, 22.0, 43.0, 50.0],
    );
    // Batched with broadcasting: [2, 1, 2, 3] @ [3, 3, 2] -> [2, 3, 2, 2]. Small integers keep
    // every product and sum exact in f32.
    let av: Vec<f64> = (0..12).map(|i| (i % 5) as f64 - 2.0).collect();
    let bv: Vec<f64> = (0..18).map(|i| (i % 7) as f64 - 3.0).collect();
    let got = apply(
        "matmul",
        &[],
        &[
            tensor(F32, &[2, 1, 2, 3], &av),
            tensor(F32, &[3, 3, 2], &bv),
        ],
    );
    let expected = naive_matmul(&av, &[2, 1, 2, 3], &bv, &[3, 3, 2]);
    assert_exact(&got, F32, &[2, 3, 2, 2], &expected);
    // 1-D on the left: [3] @ [3, 2] -> [2]; on the right: [2, 3] @ [3] -> [2]; both: scalar.
    let v = vector(F32, &[1.0, 2.0, 3.0]);
    let m = tensor(F32, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_exact(
        &apply("matmul", &[], &[v.clone(), m]),
        F32,
        &[2],
        &[22.0, 28.0],
    );
    let m = tensor(F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_exact(
        &apply("matmul", &[], &[m, v.clone()]),
        F32,
        &[2],
        &[14.0, 32.0],
    );
    assert_exact(
        &apply("matmul", &[], &[v.clone(), v.clone()]),
        F32,
        &[],
        &[14.0],
    );
    // 1-D with a batched matrix: [3] @ [2, 3, 2] -> [2, 2].
    let bm = tensor(F32, &[2, 3, 2], &iota(12));
    let expected = naive_matmul(&[1.0, 2.0, 3.0], &[1, 3], &iota(12), &[2, 3, 2]);
    assert_exact(&apply("matmul", &[], &[v, bm]), F32, &[2, 2], &expected);
    // Integers stay exact integers; mixed f16 @ f32 gives f32.
    let a = tensor(I32, &[1, 2], &[100000.0, 3.0]);
    let b = tensor(I32, &[2, 1], &[20000.0, -1.0]);
    assert_exact(
        &apply("matmul", &[], &[a, b]),
        I32,
        &[1, 1],
        &[1999999997.0],
    );
    let a = tensor(I64, &[1, 2], &[100000.0, 3.0]);
    let b = tensor(I64, &[2, 1], &[20000.0, -1.0]);
    assert_exact(
        &apply("matmul", &[], &[a, b]),
        I64,
        &[1, 1],
        &[1999999997.0],
    );
    let a = tensor(F16, &[1, 2], &[0.0999755859375, 1.0]);
    let b = tensor(F32, &[2, 1], &[1.0, 2.0]);
    assert_exact(
        &apply("matmul", &[], &[a, b]),
        F32,
        &[1, 1],
        &[(0.0999755859375f64 as f32 + 2.0f32) as f64],
    );
    // NaN propagates; mismatched inner dimensions and scalars are errors.
    let a = tensor(F32, &[1, 2], &[NAN, 0.0]);
    let b = tensor(F32, &[2, 1], &[1.0, 1.0]);
    assert_exact(&apply("matmul", &[], &[a, b]), F32, &[1, 1], &[NAN]);
    let err = apply_err(
        "matmul",
        &[],
        &[
            tensor(F32, &[2, 3], &iota(6)),
            tensor(F32, &[2, 3], &iota(6)),
        ],
    );
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
    let err = apply_err(
        "matmul",
        &[],
        &[Tensor::scalar(F32, 1.0), tensor(F32, &[2, 3], &iota(6))],
    );
    assert!(matches!(err, ErrorKind::Shape(_)), "{err:?}");
    let err = apply_err("matmul", &[], &[vector(Bool, &[1.0]), vector(Bool, &[1.0])]);
    assert!(matches!(err, ErrorKind::DType(_)), "{err:?}");
}

#[test]
fn matmul_in_f16_accumulates_in_f32_and_rounds_the_result() {
    let p = |e: i32| 2f64.powi(e);
    // [1, 2^-11, 2^-11] . [1, 1, 1] = 1 + 2^-10 exactly in f32, an f16 value. Accumulating in
    // f16 would have lost both 2^-11 terms (each sum a tie rounding back to 1).
    let a = tensor(F16, &[1, 3], &[1.0, p(-11), p(-11)]);
    let b = tensor(F16, &[3, 1], &[1.0, 1.0, 1.0]);
    assert_exact(
        &apply("matmul", &[], &[a, b]),
        F16,
        &[1, 1],
        &[1.0 + p(-10)],
    );
    // [1, 2^-11] . [1, 1] = 1 + 2^-11, which the f16 result rounds (ties to even) to 1.
    let a = tensor(F16, &[1, 2], &[1.0, p(-11)]);
    let b = tensor(F16, &[2, 1], &[1.0, 1.0]);
    assert_exact(&apply("matmul", &[], &[a, b]), F16, &[1, 1], &[1.0]);
    // Overflow of the f16 result: 256 * 256 = 65536 > 65504 rounds to inf.
    let a = tensor(F16, &[1, 1], &[256.0]);
    let b = tensor(F16, &[1, 1], &[256.0]);
    assert_exact(&apply("matmul", &[], &[a, b]), F16, &[1, 1], &[INF]);
    // bf16: 1 + 2^-9 + 2^-9 = 1 + 2^-8, halfway between bf16 values 1 and 1 + 2^-7: to even, 1.
    let a = tensor(BF16, &[1, 3], &[1.0, p(-9), p(-9)]);
    let b = tensor(BF16, &[3, 1], &[1.0, 1.0, 1.0]);
    assert_exact(&apply("matmul", &[], &[a, b]), BF16, &[1, 1], &[1.0]);
    // f32 products of non-trivial values: within f32 rounding of the f64 product.
    let av: Vec<f64> = (0..12).map(|i| ((i as f32 * 0.37).sin()) as f64).collect();
    let bv: Vec<f64> = (0..12).map(|i| ((i as f32 * 0.91).cos()) as f64).collect();
    let got = apply(
        "matmul",
        &[],
        &[tensor(F32, &[3, 4], &av), tensor(F32, &[4, 3], &bv)],
    );
    let truth = naive_matmul(&av, &[3, 4], &bv, &[4, 3]);
    let scale: Vec<f64> = naive_matmul(
        &av.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        &[3, 4],
        &bv.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        &[4, 3],
    );
    for ((g, t), s) in got.values().iter().zip(&truth).zip(&scale) {
        // Error bound of an f32 dot product of length 4: about 4 eps times sum |a_i b_i|.
        assert!((g - t).abs() <= 5.0 * f32::EPSILON as f64 * s, "{g} vs {t}");
    }
}

// ------------------------------------------------------------------------------------- graph files

#[test]
fn graph_file_example_evaluates() {
    let text = r#"
Graph(
    name: "example",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [2, 3]),
    ],
    nodes: [
        Node(name: "i", op: "sigmoid", args: ["x"]),
        Node(name: "one", op: "const", attrs: {"value": 1.0, "dtype": "f32"}),
        Node(name: "t", op: "sub", args: ["one", "i"]),
        Node(name: "m", op: "mean", args: ["t"], attrs: {"axes": [1], "keepdim": true}),
        Node(name: "c", op: "clamp", args: ["x"], attrs: {"min": -1, "max": 1.5}),
    ],
    outputs: ["t", "m", "c"],
)
"#;
    let (graph, types) = file::parse(text, "example.ron", &CATALOGUE).unwrap();
    assert_eq!(types["m"].shape, vec![2, 1]);
    let xs = [-2.0, -0.5, 0.0, 0.5, 1.0, 1.5];
    let inputs = Tensors::from([("x".to_string(), tensor(F32, &[2, 3], &xs))]);
    let out = evaluate(&graph, &CATALOGUE, &inputs).unwrap();
    // 1 - sigmoid(x) = sigmoid(-x).
    let truth: Vec<f64> = xs.iter().map(|&x| 1.0 / (1.0 + x.exp())).collect();
    assert_close("1 - sigmoid", &out["t"].values(), &truth, 1e-6);
    let m0 = truth[..3].iter().sum::<f64>() / 3.0;
    let m1 = truth[3..].iter().sum::<f64>() / 3.0;
    assert_close("mean", &out["m"].values(), &[m0, m1], 1e-6);
    assert_exact(&out["c"], F32, &[2, 3], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
}

/// Reducing an empty tensor whose other axis is huge answers directly: summing axis by axis
/// would first build a partial sum with 2^32 elements (found by the loader fuzzer).
#[test]
fn reductions_of_empty_tensors_with_huge_axes_do_not_allocate_them() {
    let huge = 1usize << 32;
    let x = tensor(F32, &[huge, 0], &[]);
    let s = apply("sum", &[("axes", ints(&[0, 1]))], std::slice::from_ref(&x));
    assert_exact(&s, F32, &[], &[0.0]);
    let m = apply("mean", &[("axes", ints(&[0, 1]))], std::slice::from_ref(&x));
    assert!(m.values()[0].is_nan(), "mean of nothing is NaN");
    let t = apply("sum_to_size", &[("shape", ints(&[1, 0]))], &[x]);
    assert_exact(&t, F32, &[1, 0], &[]);
}
