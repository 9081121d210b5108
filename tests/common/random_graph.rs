//! Random graphs aimed where fusers break, and the comparison the property tests share.
//!
//! Shapes come from a small pool over two dims `(n, m)` — `[n, m]`, `[n, 1]`, `[1, m]`, `[m]`,
//! `[]`, and transposes — so broadcasting (`[N,1]` against `[1,M]`), size-1 and (with n or m
//! 0) size-0 dims turn up constantly. Steps cover pointwise ops, where/bool, casts between
//! f32/f16/bf16, constants (−0.0 included), broadcasts, every reduction, transposes, slices,
//! concats, reshapes and matmul. A step that does not type-check is skipped, so every graph
//! is valid.
#![allow(dead_code)]

use fusebox::attr::AttrValue;
use fusebox::dtype::DType;
use fusebox::eval::{self, Tensors};
use fusebox::graph::{self, Graph, GraphBuilder};
use fusebox::rules::RuleSet;
use fusebox::tensor::{Data, Tensor};
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

/// A recipe for one node, resolved against the values built so far (indices wrap).
#[derive(Debug, Clone)]
pub enum Step {
    Unary(&'static str, usize),
    Binary(&'static str, usize, usize),
    Compare(&'static str, usize, usize),
    Where(usize, usize, usize),
    Cast(DType, usize),
    Const(f64, DType),
    /// An exact integer constant (the integer graphs' extremes).
    IntConst(i64, DType),
    BroadcastTo(usize, usize),
    SumToSize(usize, usize),
    Reduce(&'static str, usize, i64),
    Transpose(usize),
    Slice(usize, i64),
    Concat(usize, usize, i64),
    Reshape(usize),
}

pub const UNARY: [&str; 12] = [
    "neg", "exp", "tanh", "sigmoid", "relu", "abs", "sqrt", "log1p", "gelu", "silu", "softplus",
    "rsqrt",
];
pub const BINARY: [&str; 8] = ["add", "sub", "mul", "div", "max", "min", "pow", "matmul"];
pub const COMPARE: [&str; 3] = ["gt", "le", "ne"];
pub const REDUCE: [&str; 3] = ["sum", "mean", "reduce_max"];
pub const DTYPES: [DType; 4] = [DType::F32, DType::F32, DType::F16, DType::BF16];

/// The integer graphs' ops: those that keep integers integral (wrapping arithmetic, exact
/// comparisons and maxima), and their dtypes, with casts out to floats and back.
pub const INT_UNARY: [&str; 3] = ["neg", "abs", "relu"];
pub const INT_BINARY: [&str; 6] = ["add", "sub", "mul", "max", "min", "matmul"];
pub const INT_REDUCE: [&str; 2] = ["sum", "reduce_max"];
pub const INT_DTYPES: [DType; 2] = [DType::I32, DType::I64];
pub const INT_CASTS: [DType; 5] = [DType::I32, DType::I64, DType::I64, DType::F64, DType::F32];

/// Integers where wrap-around and f64's 53 bits bite: the extremes of both widths, the
/// neighbours of 2^53 (which f64 cannot tell apart), and values whose products overflow.
pub const INT_EXTREMES: [i64; 10] = [
    i64::MIN,
    i64::MAX,
    i32::MIN as i64,
    i32::MAX as i64,
    (1 << 53) + 1,
    -(1 << 53) - 1,
    4503599627370497,
    3037000500,
    65537,
    -1,
];

pub fn shape_pool(n: usize, m: usize) -> Vec<Vec<usize>> {
    vec![
        vec![n, m],
        vec![n, 1],
        vec![1, m],
        vec![m],
        vec![],
        vec![m, n],
    ]
}

/// One step, weighted toward pointwise ops; with `layout`, transposes, slices, concats and
/// reshapes too.
pub fn step(layout: bool) -> BoxedStrategy<Step> {
    let v = 0usize..64;
    let base = prop_oneof![
        3 => (0..UNARY.len(), v.clone()).prop_map(|(o, a)| Step::Unary(UNARY[o], a)),
        4 => (0..BINARY.len(), v.clone(), v.clone()).prop_map(|(o, a, b)| Step::Binary(BINARY[o], a, b)),
        1 => (0..COMPARE.len(), v.clone(), v.clone()).prop_map(|(o, a, b)| Step::Compare(COMPARE[o], a, b)),
        1 => (v.clone(), v.clone(), v.clone()).prop_map(|(c, a, b)| Step::Where(c, a, b)),
        1 => (0..DTYPES.len(), v.clone()).prop_map(|(d, a)| Step::Cast(DTYPES[d], a)),
        1 => (prop_oneof![Just(0.0), Just(1.0), Just(-1.0), Just(2.0), Just(0.5), Just(-0.0)], 0..DTYPES.len())
            .prop_map(|(c, d)| Step::Const(c, DTYPES[d])),
        1 => (v.clone(), 0usize..6).prop_map(|(a, s)| Step::BroadcastTo(a, s)),
        2 => (v.clone(), 0usize..6).prop_map(|(a, s)| Step::SumToSize(a, s)),
        2 => (0..REDUCE.len(), v.clone(), -1i64..=1).prop_map(|(o, a, axis)| Step::Reduce(REDUCE[o], a, axis)),
    ];
    with_layout(base.boxed(), layout)
}

/// `base`, mixed (when `layout`) with transposes, slices, concats and reshapes.
fn with_layout(base: BoxedStrategy<Step>, layout: bool) -> BoxedStrategy<Step> {
    if !layout {
        return base;
    }
    let v = 0usize..64;
    prop_oneof![
        16 => base,
        1 => v.clone().prop_map(Step::Transpose),
        1 => (v.clone(), 0i64..2).prop_map(|(a, s)| Step::Slice(a, s)),
        1 => (v.clone(), v.clone(), -1i64..=0).prop_map(|(a, b, axis)| Step::Concat(a, b, axis)),
        1 => v.prop_map(Step::Reshape),
    ]
    .boxed()
}

/// One step of an integer graph: wrapping arithmetic, comparisons, where, casts between the
/// integer widths and out to floats, exact constants at the extremes, reductions, broadcasts
/// and (with `layout`) layout ops.
pub fn int_step(layout: bool) -> BoxedStrategy<Step> {
    let v = 0usize..64;
    let base = prop_oneof![
        3 => (0..INT_UNARY.len(), v.clone()).prop_map(|(o, a)| Step::Unary(INT_UNARY[o], a)),
        5 => (0..INT_BINARY.len(), v.clone(), v.clone()).prop_map(|(o, a, b)| Step::Binary(INT_BINARY[o], a, b)),
        1 => (0..COMPARE.len(), v.clone(), v.clone()).prop_map(|(o, a, b)| Step::Compare(COMPARE[o], a, b)),
        1 => (v.clone(), v.clone(), v.clone()).prop_map(|(c, a, b)| Step::Where(c, a, b)),
        2 => (0..INT_CASTS.len(), v.clone()).prop_map(|(d, a)| Step::Cast(INT_CASTS[d], a)),
        2 => (0..INT_EXTREMES.len(), 0..INT_DTYPES.len())
            .prop_map(|(c, d)| Step::IntConst(INT_EXTREMES[c], INT_DTYPES[d])),
        1 => (v.clone(), 0usize..6).prop_map(|(a, s)| Step::BroadcastTo(a, s)),
        2 => (v.clone(), 0usize..6).prop_map(|(a, s)| Step::SumToSize(a, s)),
        2 => (0..INT_REDUCE.len(), v.clone(), -1i64..=1).prop_map(|(o, a, axis)| Step::Reduce(INT_REDUCE[o], a, axis)),
    ];
    with_layout(base.boxed(), layout)
}

/// [`build`] for integer graphs: inputs are i32 and i64 (see [`int_step`]).
pub fn build_ints(
    catalogue: &fusebox::rules::Catalogue,
    dims: (usize, usize),
    input_specs: &[(usize, usize)],
    steps: &[Step],
) -> Option<Graph> {
    build_in(catalogue, dims, input_specs, steps, &INT_DTYPES)
}

/// Builds a graph from the recipe, keeping only steps that type-check. Outputs: the last two
/// values built (a multi-output graph whenever two steps succeeded).
pub fn build(
    catalogue: &fusebox::rules::Catalogue,
    dims: (usize, usize),
    input_specs: &[(usize, usize)],
    steps: &[Step],
) -> Option<Graph> {
    build_in(catalogue, dims, input_specs, steps, &DTYPES)
}

/// [`build`] with inputs drawn from `dtypes`.
fn build_in(
    catalogue: &fusebox::rules::Catalogue,
    dims: (usize, usize),
    input_specs: &[(usize, usize)],
    steps: &[Step],
    dtypes: &[DType],
) -> Option<Graph> {
    let shapes = shape_pool(dims.0, dims.1);
    let mut b = GraphBuilder::new("random");
    let mut values: Vec<String> = Vec::new();
    for (i, &(d, s)) in input_specs.iter().enumerate() {
        values.push(b.input(
            &format!("x{i}"),
            dtypes[d % dtypes.len()],
            &shapes[s % shapes.len()],
        ));
    }
    let pick = |values: &[String], i: usize| values[i % values.len()].clone();
    let ints = |s: &[usize]| AttrValue::Ints(s.iter().map(|&x| x as i64).collect());
    for (k, step) in steps.iter().enumerate() {
        let name = format!("v{k}");
        let mut trial = b.clone();
        match step {
            Step::Unary(op, a) => {
                trial.op(&name, op, &[&pick(&values, *a)]);
            }
            Step::Binary(op, a, c) | Step::Compare(op, a, c) => {
                trial.op(&name, op, &[&pick(&values, *a), &pick(&values, *c)]);
            }
            Step::Where(c, a, d) => {
                let cond = format!("{name}_c");
                trial.op(&cond, "gt", &[&pick(&values, *c), &pick(&values, *a)]);
                trial.op(
                    &name,
                    "where",
                    &[&cond, &pick(&values, *a), &pick(&values, *d)],
                );
            }
            Step::Cast(d, a) => {
                trial.op_with(
                    &name,
                    "cast",
                    &[&pick(&values, *a)],
                    &[("dtype", (*d).into())],
                );
            }
            Step::Const(c, d) => {
                trial.constant(&name, *c, *d);
            }
            Step::IntConst(c, d) => {
                trial.constant_int(&name, *c, *d);
            }
            Step::BroadcastTo(a, s) => {
                trial.op_with(
                    &name,
                    "broadcast_to",
                    &[&pick(&values, *a)],
                    &[("shape", ints(&shapes[*s]))],
                );
            }
            Step::SumToSize(a, s) => {
                trial.op_with(
                    &name,
                    "sum_to_size",
                    &[&pick(&values, *a)],
                    &[("shape", ints(&shapes[*s]))],
                );
            }
            Step::Reduce(op, a, axis) => {
                trial.op_with(
                    &name,
                    op,
                    &[&pick(&values, *a)],
                    &[
                        ("axes", AttrValue::Ints(vec![*axis])),
                        ("keepdim", (*axis == 0).into()),
                    ],
                );
            }
            Step::Transpose(a) => {
                trial.op(&name, "transpose", &[&pick(&values, *a)]);
            }
            Step::Slice(a, start) => {
                trial.op_with(
                    &name,
                    "slice",
                    &[&pick(&values, *a)],
                    &[
                        ("axis", AttrValue::Int(-1)),
                        ("start", AttrValue::Int(*start)),
                        ("step", AttrValue::Int(1 + *start)),
                    ],
                );
            }
            Step::Concat(a, c, axis) => {
                trial.op_with(
                    &name,
                    "concat",
                    &[&pick(&values, *a), &pick(&values, *c)],
                    &[("axis", AttrValue::Int(*axis))],
                );
            }
            Step::Reshape(a) => {
                trial.op_with(
                    &name,
                    "reshape",
                    &[&pick(&values, *a)],
                    &[("shape", AttrValue::Ints(vec![-1]))],
                );
            }
        }
        let candidate = trial.clone().finish(&[&name]);
        if graph::check(&candidate, catalogue).is_ok() {
            b = trial;
            values.push(name);
        }
    }
    if values.len() <= input_specs.len() {
        return None;
    }
    let n = values.len();
    let outs: Vec<&str> = if n - input_specs.len() >= 2 {
        vec![&values[n - 2], &values[n - 1]]
    } else {
        vec![&values[n - 1]]
    };
    let graph = b.finish(&outs);
    graph::check(&graph, catalogue).ok()?;
    Some(graph)
}

/// Random inputs, with NaN, ±Inf and ±0 planted in about one element in eight when
/// `specials` is set; integer inputs always get [`INT_EXTREMES`] (wrapped to their dtype)
/// planted in about one element in three.
pub fn inputs(graph: &Graph, seed: u64, specials: bool) -> Tensors {
    let mut tensors = eval::random_inputs(graph, seed);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    for t in tensors.values_mut() {
        let dtype = t.dtype;
        match &mut t.data {
            Data::Int(a) => {
                for v in a.iter_mut() {
                    if rng.random_range(0..3) == 0 {
                        let extreme = INT_EXTREMES[rng.random_range(0..INT_EXTREMES.len())];
                        *v = fusebox::tensor::wrap_int(dtype, extreme);
                    }
                }
            }
            Data::Float(a) if specials => {
                for v in a.iter_mut() {
                    if rng.random_range(0..8) == 0 {
                        let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
                        *v = dtype.round(special[rng.random_range(0..special.len())]);
                    }
                }
            }
            Data::Float(_) => {}
        }
    }
    tensors
}

/// Relative tolerance for two evaluations that round differently (fused kernels compute in
/// f32 with vector math of a few ulp; rewrites move roundings), scaled by the largest
/// magnitude in the output because reductions can cancel.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

/// `a` and `b` hold the same values: same dtype and shape, NaN exactly where the other has
/// NaN, infinities equal, finite values within the dtype's tolerance.
pub fn assert_same(name: &str, a: &Tensor, b: &Tensor) -> Result<(), String> {
    if a.dtype != b.dtype || a.shape() != b.shape() {
        return Err(format!(
            "{name}: {}{:?} vs {}{:?}",
            a.dtype,
            a.shape(),
            b.dtype,
            b.shape()
        ));
    }
    if let (Data::Int(x), Data::Int(y)) = (&a.data, &b.data) {
        // Integers are exact on every backend: equal, element for element.
        return match x.iter().zip(y.iter()).position(|(p, q)| p != q) {
            None => Ok(()),
            Some(i) => Err(format!(
                "{name}[{i}]: {} vs {} ({})",
                x.iter().nth(i).unwrap(),
                y.iter().nth(i).unwrap(),
                a.dtype
            )),
        };
    }
    let (va, vb) = (a.values(), b.values());
    let scale = va
        .iter()
        .chain(&vb)
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let rtol = tolerance(a.dtype);
    for (i, (x, y)) in va.iter().zip(&vb).enumerate() {
        let same = (x.is_nan() && y.is_nan())
            || x == y
            || (x.is_finite() && y.is_finite() && (x - y).abs() <= rtol * (x.abs() + scale));
        if !same {
            return Err(format!("{name}[{i}]: {x} vs {y} ({})", a.dtype));
        }
    }
    Ok(())
}

/// The default rule set.
pub fn rules() -> RuleSet {
    RuleSet::defaults()
}
