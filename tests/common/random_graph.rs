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
    /// `x[start:end:step]` along `axis`, with negative bounds and steps above 1.
    SteppedSlice {
        a: usize,
        axis: i64,
        start: i64,
        end: Option<i64>,
        step: i64,
    },
    /// `torch.chunk`: `parts` slices of one value along `axis` that cover it (the last one
    /// shorter when the length does not divide), each a value, and the product of the first
    /// two (the LSTM cell reads its gates this way).
    Chunk {
        a: usize,
        axis: i64,
        parts: usize,
    },
    /// A contiguous reshape to a target derived from the value's shape (see [`reshape_target`]).
    ReshapeTo(usize, usize),
    /// The same reshape of the value's transpose: the elements are read out of order.
    ReshapeTransposed(usize, usize),
    /// Three values concatenated along `axis`.
    Concat3(usize, usize, usize, i64),
    /// A reshape (target by `kind`, see [`reshape_target`]) of a view whose axes are not
    /// contiguous with each other, by `form`: 0 a slice of every second column from a negative
    /// start, 1 a transpose split, transposed back and reshaped again (two reshape
    /// boundaries), 2 every second row, transposed. No strides express these; they fuse as
    /// index maps.
    ReshapeStrided {
        a: usize,
        form: usize,
        kind: usize,
    },
    /// `then(x, reduce(x, axes = [-1], keepdim))`: a reduction over the last axis read back
    /// along its rows by a pointwise consumer (a row kernel when it fuses).
    RowConsumed {
        reduce: &'static str,
        a: usize,
        then: &'static str,
    },
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
/// comparisons and maxima), and their dtypes (every integer width, signed and unsigned),
/// with casts out to floats and back.
pub const INT_UNARY: [&str; 3] = ["neg", "abs", "relu"];
pub const INT_BINARY: [&str; 6] = ["add", "sub", "mul", "max", "min", "matmul"];
pub const INT_REDUCE: [&str; 2] = ["sum", "reduce_max"];
pub const INT_DTYPES: [DType; 7] = [
    DType::I32,
    DType::I64,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::U32,
];
pub const INT_CASTS: [DType; 10] = [
    DType::I32,
    DType::I64,
    DType::I64,
    DType::F64,
    DType::F32,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::U32,
];

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
        2 => stepped_slices(),
        2 => chunks(),
        1 => contiguous_reshapes(),
        1 => transposed_reshapes(),
        1 => strided_reshapes(),
        1 => three_way_concats(),
    ]
    .boxed()
}

/// Reshapes of sliced and doubly transposed views ([`Step::ReshapeStrided`]).
pub fn strided_reshapes() -> BoxedStrategy<Step> {
    (0usize..64, 0usize..3, 0usize..5)
        .prop_map(|(a, form, kind)| Step::ReshapeStrided { a, form, kind })
        .boxed()
}

/// Row reductions consumed along their rows ([`Step::RowConsumed`]): the three reductions
/// under the consumers softmax and layernorm use. Mixed into a step strategy, they put row
/// kernels into the random graphs.
pub fn row_reductions_with_consumers() -> BoxedStrategy<Step> {
    (0..REDUCE.len(), 0usize..64, 0..4usize)
        .prop_map(|(r, a, t)| Step::RowConsumed {
            reduce: REDUCE[r],
            a,
            then: ["sub", "div", "mul", "add"][t],
        })
        .boxed()
}

/// Slices with steps of 1 to 3 and bounds that may be negative, past either end, or absent,
/// along the first or last axis.
pub fn stepped_slices() -> BoxedStrategy<Step> {
    (
        0usize..64,
        prop_oneof![Just(0i64), Just(-1), Just(1)],
        -4i64..4,
        prop_oneof![
            Just(None),
            Just(Some(-1)),
            Just(Some(2)),
            Just(Some(5)),
            Just(Some(-3))
        ],
        1i64..=3,
    )
        .prop_map(|(a, axis, start, end, step)| Step::SteppedSlice {
            a,
            axis,
            start,
            end,
            step,
        })
        .boxed()
}

/// Chunks of 2 to 4 pieces along the first or last axis.
pub fn chunks() -> BoxedStrategy<Step> {
    (0usize..64, prop_oneof![Just(0i64), Just(-1)], 2usize..=4)
        .prop_map(|(a, axis, parts)| Step::Chunk { a, axis, parts })
        .boxed()
}

/// Reshapes that keep the elements' order: flatten, a leading 1, merged or split axes, the
/// dims reversed.
pub fn contiguous_reshapes() -> BoxedStrategy<Step> {
    (0usize..64, 0usize..5)
        .prop_map(|(a, k)| Step::ReshapeTo(a, k))
        .boxed()
}

/// Reshapes of a transposed value, which read the elements out of order (floordiv/mod
/// indexing where the layout is an index map).
pub fn transposed_reshapes() -> BoxedStrategy<Step> {
    (0usize..64, 0usize..5)
        .prop_map(|(a, k)| Step::ReshapeTransposed(a, k))
        .boxed()
}

/// Concats of three values along the first or last axis.
pub fn three_way_concats() -> BoxedStrategy<Step> {
    (0usize..64, 0usize..64, 0usize..64, -1i64..=0)
        .prop_map(|(a, b, c, axis)| Step::Concat3(a, b, c, axis))
        .boxed()
}

/// A reshape target with `shape`'s element count, by `kind`: 0 flattens, 1 adds a leading 1,
/// 2 merges the first two axes (or makes a column of a vector), 3 splits the first axis with
/// a factor 2 or 3 (or appends a 1), 4 reverses the dims.
pub fn reshape_target(shape: &[usize], kind: usize) -> Vec<i64> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    match kind % 5 {
        0 => vec![-1],
        1 => std::iter::once(1).chain(dims).collect(),
        2 if dims.len() >= 2 => std::iter::once(dims[0] * dims[1])
            .chain(dims[2..].iter().copied())
            .collect(),
        2 => vec![-1, 1],
        3 => match dims
            .iter()
            .position(|&d| d > 1 && (d % 2 == 0 || d % 3 == 0))
        {
            Some(i) => {
                let f = if dims[i] % 2 == 0 { 2 } else { 3 };
                let mut out = dims[..i].to_vec();
                out.extend([f, dims[i] / f]);
                out.extend(&dims[i + 1..]);
                out
            }
            None => dims.into_iter().chain(std::iter::once(1)).collect(),
        },
        _ => dims.into_iter().rev().collect(),
    }
}

/// The `(start, end)` of each piece of `torch.chunk(parts)` over a length: pieces of
/// `ceil(len / parts)`, the last shorter, fewer pieces when they run out; an empty axis gives
/// one empty piece.
pub fn chunk_bounds(len: usize, parts: usize) -> Vec<(i64, i64)> {
    if len == 0 {
        return vec![(0, 0)];
    }
    let size = len.div_ceil(parts.max(1));
    (0..len)
        .step_by(size)
        .map(|start| (start as i64, (start + size).min(len) as i64))
        .collect()
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
    // The type of every value so far, for the steps whose attributes depend on a shape.
    let mut types: graph::TypeMap = b
        .clone()
        .finish(&[])
        .inputs
        .iter()
        .map(|i| {
            (
                i.name.clone(),
                fusebox::graph::TensorType {
                    dtype: i.dtype,
                    shape: i.shape.clone(),
                },
            )
        })
        .collect();
    for (k, step) in steps.iter().enumerate() {
        let name = format!("v{k}");
        let mut trial = b.clone();
        let shape_of = |i: usize| types[&pick(&values, i)].shape.clone();
        let mut made = vec![name.clone()];
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
            Step::SteppedSlice {
                a,
                axis,
                start,
                end,
                step,
            } => {
                let mut attrs = vec![
                    ("axis", AttrValue::Int(*axis)),
                    ("start", AttrValue::Int(*start)),
                    ("step", AttrValue::Int(*step)),
                ];
                if let Some(end) = end {
                    attrs.push(("end", AttrValue::Int(*end)));
                }
                trial.op_with(&name, "slice", &[&pick(&values, *a)], &attrs);
            }
            Step::Chunk { a, axis, parts } => {
                made = build_chunk(
                    &mut trial,
                    &name,
                    &pick(&values, *a),
                    &shape_of(*a),
                    *axis,
                    *parts,
                );
            }
            Step::ReshapeTo(a, kind) => {
                let target = reshape_target(&shape_of(*a), *kind);
                trial.op_with(
                    &name,
                    "reshape",
                    &[&pick(&values, *a)],
                    &[("shape", AttrValue::Ints(target))],
                );
            }
            Step::ReshapeTransposed(a, kind) => {
                let mut transposed = shape_of(*a);
                transposed.reverse();
                let moved = format!("{name}_t");
                trial.op(&moved, "transpose", &[&pick(&values, *a)]);
                trial.op_with(
                    &name,
                    "reshape",
                    &[&moved],
                    &[("shape", AttrValue::Ints(reshape_target(&transposed, *kind)))],
                );
            }
            Step::ReshapeStrided { a, form, kind } => {
                let shape = shape_of(*a);
                let x = pick(&values, *a);
                let first = format!("{name}_v");
                let viewed = match form % 3 {
                    0 => {
                        trial.op_with(
                            &first,
                            "slice",
                            &[&x],
                            &[
                                ("axis", AttrValue::Int(-1)),
                                ("start", AttrValue::Int(-5)),
                                ("step", AttrValue::Int(2)),
                            ],
                        );
                        let mut s = shape.clone();
                        if let Some(last) = s.last_mut() {
                            let start = last.saturating_sub(5);
                            *last = (*last - start).div_ceil(2);
                        }
                        s
                    }
                    1 => {
                        let mut t = shape.clone();
                        t.reverse();
                        let split = reshape_target(&t, 3);
                        let (t1, r1) = (format!("{name}_t"), format!("{name}_s"));
                        trial.op(&t1, "transpose", &[&x]);
                        trial.op_with(
                            &r1,
                            "reshape",
                            &[&t1],
                            &[("shape", AttrValue::Ints(split.clone()))],
                        );
                        trial.op(&first, "transpose", &[&r1]);
                        split.iter().rev().map(|&d| d as usize).collect()
                    }
                    _ => {
                        let rows = format!("{name}_r");
                        trial.op_with(
                            &rows,
                            "slice",
                            &[&x],
                            &[("axis", AttrValue::Int(0)), ("step", AttrValue::Int(2))],
                        );
                        trial.op(&first, "transpose", &[&rows]);
                        let mut s = shape.clone();
                        if let Some(d) = s.first_mut() {
                            *d = d.div_ceil(2);
                        }
                        s.reverse();
                        s
                    }
                };
                trial.op_with(
                    &name,
                    "reshape",
                    &[&first],
                    &[("shape", AttrValue::Ints(reshape_target(&viewed, *kind)))],
                );
            }
            Step::Concat3(a, c, d, axis) => {
                trial.op_with(
                    &name,
                    "concat",
                    &[&pick(&values, *a), &pick(&values, *c), &pick(&values, *d)],
                    &[("axis", AttrValue::Int(*axis))],
                );
            }
            Step::RowConsumed { reduce, a, then } => {
                let x = pick(&values, *a);
                let reduced = format!("{name}_r");
                trial.op_with(
                    &reduced,
                    reduce,
                    &[&x],
                    &[
                        ("axes", AttrValue::Ints(vec![-1])),
                        ("keepdim", true.into()),
                    ],
                );
                trial.op(&name, then, &[&x, &reduced]);
            }
        }
        let refs: Vec<&str> = made.iter().map(String::as_str).collect();
        let candidate = trial.clone().finish(&refs);
        if let Ok(checked) = graph::check(&candidate, catalogue) {
            if checked
                .values()
                .any(|t| fusebox::shape::numel(&t.shape) > MAX_VALUE_ELEMENTS)
            {
                continue;
            }
            b = trial;
            types = checked;
            values.extend(made);
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

/// The pieces of `torch.chunk(x, parts, axis)` named `{name}_0`, `{name}_1`, …, and `name`
/// the product of the first two when there are two of one shape: the values the step makes.
/// A scalar (no axis to split) gets no pieces, which fails the step's check.
fn build_chunk(
    b: &mut GraphBuilder,
    name: &str,
    x: &str,
    shape: &[usize],
    axis: i64,
    parts: usize,
) -> Vec<String> {
    let rank = shape.len() as i64;
    if rank == 0 {
        return vec![name.to_string()];
    }
    let resolved = if axis < 0 { axis + rank } else { axis } as usize;
    let mut pieces = Vec::new();
    for (i, (start, end)) in chunk_bounds(shape[resolved], parts).into_iter().enumerate() {
        let piece = format!("{name}_{i}");
        b.op_with(
            &piece,
            "slice",
            &[x],
            &[
                ("axis", AttrValue::Int(axis)),
                ("start", AttrValue::Int(start)),
                ("end", AttrValue::Int(end)),
            ],
        );
        pieces.push(piece);
    }
    let len = |i: usize| chunk_bounds(shape[resolved], parts)[i];
    if pieces.len() >= 2 && len(0).1 - len(0).0 == len(1).1 - len(1).0 {
        b.op(name, "mul", &[&pieces[0], &pieces[1]]);
        pieces.push(name.to_string());
    }
    pieces
}

/// The most elements a value of a random graph may have: a step making a larger one is
/// skipped, as one that does not type-check is. Chained concats multiply sizes (thirteen
/// three-way concats of a `[64, 700]` value would be 7·10¹⁰ elements), and the reference
/// holds every value as f64, so without a bound a rare draw exhausts the machine's memory.
/// 2²⁰ is 23 times the largest input shape, and 8 MiB per value in the reference.
const MAX_VALUE_ELEMENTS: usize = 1 << 20;

/// The environment variable that scales every random-graph property test's case count, for
/// a larger run than CI's (`FUSEBOX_GRAPH_CASES_SCALE=10 cargo test`).
pub const CASES_SCALE_VAR: &str = "FUSEBOX_GRAPH_CASES_SCALE";

/// `base` cases, times [`CASES_SCALE_VAR`] when it is set to a positive number. The bases are
/// sized for CI on two cores; a scale below 1 makes a quick local run.
pub fn cases(base: u32) -> u32 {
    let scale = std::env::var(CASES_SCALE_VAR)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0);
    match scale {
        Some(s) => ((f64::from(base) * s).ceil() as u32).max(1),
        None => base,
    }
}

/// Whether every value `graph` computes from `inputs` (each input and each node) is finite.
/// That is the premise of the `finite_only` rules: they are equalities of real arithmetic, so
/// they say nothing where a value has none: an empty sum divided by zero (0/0) is NaN before
/// `sum-to-size-div` moves the division into the sum and 0 after it.
pub fn every_value_finite(graph: &Graph, inputs: &Tensors) -> bool {
    eval::evaluate_all(graph, &rules().ops, inputs)
        .map(|values| {
            values
                .values()
                .all(|t| t.values().iter().all(|v| v.is_finite()))
        })
        .unwrap_or(false)
}

/// The `Options::strict_ieee` a comparison with the reference on [`inputs`]`(graph, seed,
/// specials)` needs: strict with NaN/Inf inputs, and also where finite inputs still make a
/// non-finite value inside the graph (a 0/0 of an empty sum, a log of a negative), since the
/// `finite_only` rules promise nothing there. Everywhere else those rules stay on, so the
/// fused forms they make are compared too.
pub fn strict_ieee_for(graph: &Graph, seed: u64, specials: bool) -> bool {
    specials || !every_value_finite(graph, &inputs(graph, seed, specials))
}

/// Random inputs, with NaN, ±Inf and ±0 planted in about one element in eight when
/// `specials` is set; integer inputs always get [`INT_EXTREMES`] (wrapped to their dtype)
/// planted in about one element in three.
pub fn inputs(graph: &Graph, seed: u64, specials: bool) -> Tensors {
    let mut tensors = eval::random_inputs(graph, seed);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    // In the graph's input order (`Tensors` is a hash map, whose order changes from one
    // process to the next), so that a seed gives the same inputs everywhere.
    for input in &graph.inputs {
        let Some(t) = tensors.get_mut(&input.name) else {
            continue;
        };
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
    assert_close(name, a, b, tolerance(a.dtype))
}

/// [`assert_same`] with a relative tolerance given by the caller: for an output whose values
/// went through a narrower dtype than its own (an f32 output of an AMP graph computed in f16
/// holds f16 roundings), the narrower dtype's tolerance.
pub fn assert_close(name: &str, a: &Tensor, b: &Tensor, rtol: f64) -> Result<(), String> {
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

/// The default rule set, parsed once per test binary: parsing and locating the embedded RON
/// files costs more than a small random graph's whole optimize-lower-run cycle, and the
/// property tests ask for the rules several times per case.
pub fn rules() -> &'static RuleSet {
    static RULES: std::sync::OnceLock<RuleSet> = std::sync::OnceLock::new();
    RULES.get_or_init(RuleSet::defaults)
}

/// `program`'s input buffers, in its dag's input order, from the tensors named in `inputs`.
pub fn input_buffers(
    program: &fusebox::lower::Program,
    inputs: &Tensors,
) -> Vec<fusebox::runtime::buffer::Buffer> {
    program
        .dag
        .inputs
        .iter()
        .map(|i| fusebox::runtime::buffer::Buffer::from_tensor(&inputs[&i.name]))
        .collect()
}

/// One operand of a [`ConcatRecipe`]'s concat: how it is made, its length along the concat's
/// axis (0 makes an empty segment), its input dtype and the unary op it may apply.
#[derive(Debug, Clone)]
pub struct ConcatPart {
    /// 0: a slice of a wider input (a view); 1: a unary op of an input; 2: an input plus a
    /// vector broadcast against it; 3: a broadcast_to of an input of size 1 off the axis,
    /// then a unary op; 4: an input read as it is.
    pub kind: usize,
    pub len: usize,
    pub dtype: usize,
    pub op: usize,
}

/// A graph around one concat, aimed at reading it by ranges: operands from memory, views and
/// ops that only the concat reads, empty segments, negative axes, broadcast operands, mixed
/// f32/f16/bf16 operands (concat promotes), and consumers that read it in several ways.
#[derive(Debug, Clone)]
pub struct ConcatRecipe {
    /// The extent of the axis the concat does not join.
    pub across: usize,
    /// 0, 1, -1 or -2 over rank-2 operands.
    pub axis: i64,
    pub parts: Vec<ConcatPart>,
    /// 0: the concat is the output; 1: a unary op of it; 2: it plus a broadcast vector; 3:
    /// its sum over axis 0 and a unary op of it (two readers in two kernels); 4: it and a
    /// unary op of it, both outputs; 5: the keepdim maximum of its rows (axis 1) and a unary
    /// op of it; 6: the mean of its rows without keepdim; 7: the softmax of its rows; 8: its
    /// rows less their keepdim mean. A reduction along the concat's axis gathers several
    /// operands; one along the other axis lets the kernel run as pieces, and with the rows'
    /// consumers (7, 8, and 5 when they fuse) as one row kernel per segment.
    pub consumer: usize,
    pub consumer_op: usize,
}

/// Recipes for [`build_concat`]: 1 to 4 operands of lengths 0 to 3, across 0 to 4.
pub fn concat_recipes() -> BoxedStrategy<ConcatRecipe> {
    let part = (0usize..5, 0usize..4, 0usize..4, 0usize..UNARY.len()).prop_map(
        |(kind, len, dtype, op)| ConcatPart {
            kind,
            len,
            dtype,
            op,
        },
    );
    (
        0usize..5,
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(-2)],
        prop::collection::vec(part, 1..5),
        0usize..9,
        0usize..UNARY.len(),
    )
        .prop_map(
            |(across, axis, parts, consumer, consumer_op)| ConcatRecipe {
                across,
                axis,
                parts,
                consumer,
                consumer_op,
            },
        )
        .boxed()
}

/// The graph of `recipe`, or `None` when it does not type-check (a unary op that rejects
/// its operand's dtype).
pub fn build_concat(catalogue: &fusebox::rules::Catalogue, recipe: &ConcatRecipe) -> Option<Graph> {
    let ax = recipe.axis.rem_euclid(2) as usize;
    let shape = |len: usize, across: usize| -> Vec<usize> {
        if ax == 0 {
            vec![len, across]
        } else {
            vec![across, len]
        }
    };
    let mut b = GraphBuilder::new("concat");
    let mut operands = Vec::new();
    for (i, part) in recipe.parts.iter().enumerate() {
        let dtype = DTYPES[part.dtype % DTYPES.len()];
        let own = shape(part.len, recipe.across);
        let name = format!("p{i}");
        let operand = match part.kind {
            0 => {
                let wide = b.input(&format!("w{i}"), dtype, &shape(part.len + 3, recipe.across));
                b.op_with(
                    &name,
                    "slice",
                    &[&wide],
                    &[
                        ("axis", AttrValue::Int(recipe.axis)),
                        ("start", AttrValue::Int(1)),
                        ("end", AttrValue::Int(1 + part.len as i64)),
                    ],
                )
            }
            1 => {
                let x = b.input(&format!("x{i}"), dtype, &own);
                b.op(&name, UNARY[part.op], &[&x])
            }
            2 => {
                let x = b.input(&format!("x{i}"), dtype, &own);
                let v = b.input(&format!("v{i}"), dtype, &shape(part.len, 1));
                b.op(&name, "add", &[&x, &v])
            }
            3 => {
                let x = b.input(&format!("x{i}"), dtype, &shape(part.len, 1));
                let to: Vec<i64> = own.iter().map(|&d| d as i64).collect();
                let wide = b.op_with(
                    &format!("bc{i}"),
                    "broadcast_to",
                    &[&x],
                    &[("shape", AttrValue::Ints(to))],
                );
                b.op(&name, UNARY[part.op], &[&wide])
            }
            _ => b.input(&format!("x{i}"), dtype, &own),
        };
        operands.push(operand);
    }
    let args: Vec<&str> = operands.iter().map(String::as_str).collect();
    let c = b.op_with(
        "c",
        "concat",
        &args,
        &[("axis", AttrValue::Int(recipe.axis))],
    );
    let op = UNARY[recipe.consumer_op % UNARY.len()];
    let outputs: Vec<String> = match recipe.consumer % 9 {
        0 => vec![c],
        1 => vec![b.op("out", op, &[&c])],
        2 => {
            let total: usize = recipe.parts.iter().map(|p| p.len).sum();
            let along = if ax == 0 { vec![total, 1] } else { vec![total] };
            let v = b.input("bias", DType::F32, &along);
            vec![b.op("out", "add", &[&c, &v])]
        }
        3 => {
            let s = b.op_with("s", "sum", &[&c], &[("axes", AttrValue::Ints(vec![0]))]);
            vec![s, b.op("out", op, &[&c])]
        }
        4 => vec![c.clone(), b.op("out", op, &[&c])],
        5 => {
            let m = super::row_graphs::last_axis(&mut b, "m", "reduce_max", &c);
            vec![m, b.op("out", op, &[&c])]
        }
        6 => vec![b.op_with("m", "mean", &[&c], &[("axes", AttrValue::Ints(vec![-1]))])],
        7 => vec![b.op_with("out", "softmax", &[&c], &[("axis", AttrValue::Int(-1))])],
        _ => {
            let m = super::row_graphs::last_axis(&mut b, "m", "mean", &c);
            vec![b.op("out", "sub", &[&c, &m])]
        }
    };
    let names: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let graph = b.finish(&names);
    graph::check(&graph, catalogue).ok()?;
    Some(graph)
}
