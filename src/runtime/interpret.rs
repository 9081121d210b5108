//! A slow, obviously-correct interpreter of kernel IR.
//!
//! It runs a [`KernelIr`] launch element by element with the semantics `ir.rs` documents, so
//! the lowering can be tested against the reference evaluator without any C compiler, and a
//! disagreement between a compiled kernel and the reference can be pinned on the emitter or
//! on the lowering.

use super::buffer::Buffer;
use crate::dtype::{Category, DType};
use crate::formula::{BinOp, Func};
use crate::lower::ir::{Axis, Gathered, Instr, KernelIr, Launch, Prec, ReduceKind, Store};
use crate::lower::{Program, Step};
use crate::tensor::{float_to_int, int_to_float, wrap_int};

fn at(prec: Prec, v: f64) -> f64 {
    match prec {
        Prec::F32 => v as f32 as f64,
        _ => v,
    }
}

/// `a op b` on integers held at `Prec::I64`: wrapping arithmetic and exact comparisons;
/// division has no integer meaning and goes through f64 (see [`Prec::I64`]).
fn int_binary(op: BinOp, a: i64, b: i64) -> i64 {
    match op {
        BinOp::Add => a.wrapping_add(b),
        BinOp::Sub => a.wrapping_sub(b),
        BinOp::Mul => a.wrapping_mul(b),
        BinOp::Div => (a as f64 / b as f64) as i64,
        BinOp::Lt => i64::from(a < b),
        BinOp::Le => i64::from(a <= b),
        BinOp::Gt => i64::from(a > b),
        BinOp::Ge => i64::from(a >= b),
        BinOp::Eq => i64::from(a == b),
        BinOp::Ne => i64::from(a != b),
    }
}

/// A primitive on integers held at `Prec::I64` (see [`Prec::I64`]).
fn int_call(func: Func, x: &[i64]) -> i64 {
    match func {
        Func::Abs => x[0].wrapping_abs(),
        Func::Min => x[0].min(x[1]),
        Func::Max => x[0].max(x[1]),
        Func::Select => {
            if x[0] != 0 {
                x[1]
            } else {
                x[2]
            }
        }
        _ => {
            let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            call(func, &xs, Prec::F64) as i64
        }
    }
}

/// `x`, held at `Prec::I64`, rounded to `dtype` ([`crate::lower::ir::Instr::Round`]): the
/// result at `Prec::of(dtype)`, an integer or a float.
fn round_int(x: i64, dtype: DType) -> (f64, i64) {
    match dtype.category() {
        Category::Integer => (0.0, wrap_int(dtype, x)),
        _ => (int_to_float(dtype, x), 0),
    }
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a > b || (a == b && !a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn call(func: Func, x: &[f64], prec: Prec) -> f64 {
    let f32op = |f: fn(f32) -> f32| f64::from(f(x[0] as f32));
    let single = prec == Prec::F32;
    match func {
        Func::Exp if single => f32op(f32::exp),
        Func::Exp => x[0].exp(),
        Func::Log if single => f32op(f32::ln),
        Func::Log => x[0].ln(),
        Func::Log1p if single => f32op(f32::ln_1p),
        Func::Log1p => x[0].ln_1p(),
        Func::Expm1 if single => f32op(f32::exp_m1),
        Func::Expm1 => x[0].exp_m1(),
        Func::Sqrt if single => f32op(f32::sqrt),
        Func::Sqrt => x[0].sqrt(),
        Func::Rsqrt if single => f32op(|v| 1.0 / v.sqrt()),
        Func::Rsqrt => 1.0 / x[0].sqrt(),
        Func::Tanh if single => f32op(f32::tanh),
        Func::Tanh => x[0].tanh(),
        Func::Erf if single => f32op(libm::erff),
        Func::Erf => libm::erf(x[0]),
        Func::Abs => x[0].abs(),
        Func::Floor => x[0].floor(),
        Func::Sin if single => f32op(f32::sin),
        Func::Sin => x[0].sin(),
        Func::Cos if single => f32op(f32::cos),
        Func::Cos => x[0].cos(),
        Func::Atan if single => f32op(f32::atan),
        Func::Atan => x[0].atan(),
        Func::Min => nan_min(x[0], x[1]),
        Func::Max => nan_max(x[0], x[1]),
        Func::Pow if single => f64::from((x[0] as f32).powf(x[1] as f32)),
        Func::Pow => x[0].powf(x[1]),
        Func::Select => {
            if x[0] != 0.0 {
                x[1]
            } else {
                x[2]
            }
        }
    }
}

fn binary(op: BinOp, a: f64, b: f64) -> f64 {
    let truth = |t: bool| if t { 1.0 } else { 0.0 };
    match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => a / b,
        BinOp::Lt => truth(a < b),
        BinOp::Le => truth(a <= b),
        BinOp::Gt => truth(a > b),
        BinOp::Ge => truth(a >= b),
        BinOp::Eq => truth(a == b),
        BinOp::Ne => truth(a != b),
    }
}

/// Evaluates SSA value `i` at the current point into `vals` or `ints` (by its precision);
/// `load(view)` is the buffer of load view `view` and the index of the current point in it.
/// A row reduction's value is the row's result, set by [`run_rows`] before the passes that
/// read it, so it is left as it is. `at` is the current point and `ranges` the launch's
/// ranges: a range load outside its range reads nothing and is 0, and a select picks its
/// case by the point's index.
fn eval<'b>(
    ir: &KernelIr,
    i: usize,
    vals: &mut [f64],
    ints: &mut [i64],
    (point, ranges, gathers): (&[usize], &[(i64, i64)], &[Gathered]),
    load: impl Fn(usize) -> (&'b Buffer, usize),
) {
    let instr = &ir.body[i];
    let prec = ir.prec(i);
    let inside = |axis: usize, range: usize| {
        let (start, end) = ranges[range];
        (start..end).contains(&(point[axis] as i64))
    };
    let pick = |axis: usize, rs: &[usize], cases: &[usize]| -> usize {
        rs.iter()
            .position(|&r| (point[axis] as i64) < ranges[r].1)
            .map_or(cases[cases.len() - 1], |s| cases[s])
    };
    // A gather's element, `None` where its index is out of range (see `Instr::GatherLoad`).
    let gathered = |view: usize, index: usize, gather: usize| {
        let Gathered { stride, extent } = gathers[gather];
        let k = ints[index];
        (k >= -extent && k < extent).then(|| {
            let k = if k < 0 { k + extent } else { k };
            let (b, at) = load(view);
            (b, (at as i64 + k * stride) as usize)
        })
    };
    if prec == Prec::I64 {
        ints[i] = match instr {
            Instr::GatherLoad {
                view,
                index,
                gather,
            } => gathered(*view, *index, *gather).map_or(0, |(b, at)| b.get_int(at)),
            Instr::Load { view } => {
                let (b, at) = load(*view);
                b.get_int(at)
            }
            Instr::RangeLoad { view, axis, range } => {
                if inside(*axis, *range) {
                    let (b, at) = load(*view);
                    b.get_int(at)
                } else {
                    0
                }
            }
            Instr::Select {
                axis,
                ranges: rs,
                cases,
                ..
            } => ints[pick(*axis, rs, cases)],
            Instr::Int { value } => *value,
            Instr::Round { x, dtype } if ir.prec(*x) == Prec::I64 => round_int(ints[*x], *dtype).1,
            Instr::Round { x, dtype } => float_to_int(*dtype, vals[*x]),
            Instr::Neg { x, .. } => ints[*x].wrapping_neg(),
            Instr::Binary { op, a, b, .. } => int_binary(*op, ints[*a], ints[*b]),
            Instr::Call { func, args, .. } => {
                let xs: Vec<i64> = args.iter().map(|&a| ints[a]).collect();
                int_call(*func, &xs)
            }
            Instr::Const { value, .. } => *value as i64,
            Instr::Widen { x } => vals[*x] as i64,
            Instr::RowReduce { .. } => return,
        };
        return;
    }
    vals[i] = match instr {
        Instr::Int { value } => *value as f64,
        Instr::GatherLoad {
            view,
            index,
            gather,
        } => {
            let fill = if ir.loads[*view].dtype.is_float() {
                f64::NAN
            } else {
                0.0
            };
            gathered(*view, *index, *gather).map_or(fill, |(b, at)| b.get(at))
        }
        Instr::Round { x, dtype } if ir.prec(*x) == Prec::I64 => round_int(ints[*x], *dtype).0,
        Instr::Load { view } => {
            let (b, at) = load(*view);
            b.get(at)
        }
        Instr::RangeLoad { view, axis, range } => {
            if inside(*axis, *range) {
                let (b, at) = load(*view);
                b.get(at)
            } else {
                0.0
            }
        }
        Instr::Select {
            axis,
            ranges: rs,
            cases,
            ..
        } => vals[pick(*axis, rs, cases)],
        Instr::Const { value, .. } => *value,
        Instr::Widen { x } => vals[*x],
        Instr::RowReduce { .. } => return,
        Instr::Round { x, dtype } => dtype.round(vals[*x]),
        Instr::Neg { x, .. } => -vals[*x],
        Instr::Binary { op, a, b, .. } => at(prec, binary(*op, vals[*a], vals[*b])),
        Instr::Call { func, args, .. } => {
            let xs: Vec<f64> = args.iter().map(|&a| vals[a]).collect();
            at(prec, call(*func, &xs, prec))
        }
    };
}

/// Runs one launch. `buffers` are the arguments in [`KernelIr::views`] order.
pub fn run(ir: &KernelIr, launch: &Launch, buffers: &mut [&mut Buffer]) {
    if ir.is_row_kernel() {
        run_rows(ir, launch, buffers);
        return;
    }
    let rank = ir.rank;
    let sizes: Vec<usize> = launch.sizes.iter().map(|&s| s as usize).collect();
    let total: usize = sizes.iter().product();
    let loads = ir.loads.len();
    let stores = ir.stores.len();
    // Reduction accumulators, by output element; integer outputs accumulate in `iacc`.
    let int_out = |r: usize| Prec::of(ir.reductions[r].view.dtype) == Prec::I64;
    let mut iacc: Vec<Vec<i64>> = ir
        .reductions
        .iter()
        .enumerate()
        .map(|(r, red)| {
            let init = match red.kind {
                ReduceKind::Max => i64::MIN,
                _ => 0,
            };
            vec![
                init;
                if int_out(r) {
                    buffers[loads + stores + r].len()
                } else {
                    0
                }
            ]
        })
        .collect();
    let mut acc: Vec<Vec<f64>> = ir
        .reductions
        .iter()
        .enumerate()
        .map(|(r, red)| {
            let init = match red.kind {
                ReduceKind::Max => f64::NEG_INFINITY,
                _ => 0.0,
            };
            vec![init; buffers[loads + stores + r].len()]
        })
        .collect();
    let index = |arg: usize, coord: &[usize]| element_index(launch, arg, coord);
    let mut coord = vec![0usize; rank];
    // Each SSA value lives in `vals` (float and bool precisions) or `ints` (`Prec::I64`).
    let mut vals = vec![0f64; ir.body.len()];
    let mut ints = vec![0i64; ir.body.len()];
    for flat in 0..total {
        let mut rest = flat;
        for d in (0..rank).rev() {
            coord[d] = rest % sizes[d];
            rest /= sizes[d];
        }
        for i in 0..ir.body.len() {
            eval(
                ir,
                i,
                &mut vals,
                &mut ints,
                (&coord, &launch.ranges, &launch.gathers),
                |view| (&*buffers[view], index(view, &coord)),
            );
        }
        for (s, store) in ir.stores.iter().enumerate() {
            let arg = loads + s;
            if store.scatter.is_some() {
                let at = element_index(launch, arg, &coord);
                scatter_add(ir, launch, store, (&vals, &ints), at, buffers[arg]);
                continue;
            }
            let first = (0..rank).all(|d| launch.strides[arg][d] != 0 || coord[d] == 0);
            if first {
                let i = index(arg, &coord);
                if ir.prec(store.value) == Prec::I64 {
                    buffers[arg].set_int(i, ints[store.value]);
                } else {
                    buffers[arg].set(i, vals[store.value]);
                }
            }
        }
        for (r, red) in ir.reductions.iter().enumerate() {
            let arg = loads + stores + r;
            let i = index(arg, &coord);
            if int_out(r) {
                let v = ints[red.value];
                let a = &mut iacc[r][i];
                *a = match red.kind {
                    ReduceKind::Max => (*a).max(v),
                    _ => a.wrapping_add(v),
                };
                continue;
            }
            let v = vals[red.value];
            let a = &mut acc[r][i];
            *a = match red.kind {
                ReduceKind::Max => {
                    if a.is_nan() || v.is_nan() {
                        f64::NAN
                    } else {
                        a.max(v)
                    }
                }
                _ => *a + v,
            };
        }
    }
    // Each result goes where the output's view puts it (its own buffer, or its segment of a
    // concat written in place), visited through the kept axes so that an empty reduced axis
    // still writes the identity, and nothing outside the view is touched.
    for (r, red) in ir.reductions.iter().enumerate() {
        let arg = loads + stores + r;
        let count: usize = (0..rank)
            .filter(|&d| red.reduced[d])
            .map(|d| sizes[d])
            .product();
        for_each_point(&arg_extent(ir, launch, arg), |at| {
            let i = index(arg, at);
            if int_out(r) {
                buffers[arg].set_int(i, iacc[r][i]);
                return;
            }
            let a = acc[r][i];
            let v = if red.kind == ReduceKind::Mean {
                a / count as f64
            } else {
                a
            };
            buffers[arg].set(i, v);
        });
    }
}

/// Adds the value of scatter store `store` into `buffer` where its index moves element `at`
/// (the view's own at the current point), rounded to the buffer's dtype
/// ([`crate::lower::ir::Scatter`]); an index out of range adds nothing.
fn scatter_add(
    ir: &KernelIr,
    launch: &Launch,
    store: &Store,
    (vals, ints): (&[f64], &[i64]),
    at: usize,
    buffer: &mut Buffer,
) {
    let Some(scatter) = store.scatter else {
        return;
    };
    let Gathered { stride, extent } = launch.gathers[scatter.gather];
    let k = ints[scatter.index];
    if k < -extent || k >= extent {
        return;
    }
    let k = if k < 0 { k + extent } else { k };
    let at = (at as i64 + k * stride) as usize;
    let dtype = store.view.dtype;
    if ir.prec(store.value) == Prec::I64 {
        let sum = buffer.get_int(at).wrapping_add(ints[store.value]);
        buffer.set_int(at, wrap_int(dtype, sum));
    } else {
        buffer.set(at, dtype.round(buffer.get(at) + vals[store.value]));
    }
}

/// Runs one launch of a row kernel: row by row, pass by pass, as the module documentation of
/// [`crate::lower::ir`] describes. Stores with one element per row are written after the last
/// pass (from the row's results, so also for an empty row); the others in the last pass.
fn run_rows(ir: &KernelIr, launch: &Launch, buffers: &mut [&mut Buffer]) {
    let rank = ir.rank;
    let inner_axis = rank - 1;
    let sizes: Vec<usize> = launch.sizes.iter().map(|&s| s as usize).collect();
    let inner = sizes[inner_axis];
    let outer: usize = sizes[..inner_axis].iter().product();
    let loads = ir.loads.len();
    let levels = ir.levels();
    let passes = ir.passes();
    let index = |arg: usize, coord: &[usize]| element_index(launch, arg, coord);
    let needed = per_row_values(ir, inner_axis);
    let mut coord = vec![0usize; rank];
    let mut vals = vec![0f64; ir.body.len()];
    let mut ints = vec![0i64; ir.body.len()];
    for o in 0..outer {
        let mut rest = o;
        for d in (0..inner_axis).rev() {
            coord[d] = rest % sizes[d];
            rest /= sizes[d];
        }
        for pass in 0..passes {
            let last = pass + 1 == passes;
            // The row reductions accumulated in this pass: (value, float sum or max, integer).
            let reducing: Vec<usize> = (0..ir.body.len())
                .filter(|&id| {
                    levels[id] == pass + 1 && matches!(ir.body[id], Instr::RowReduce { .. })
                })
                .collect();
            let mut facc: Vec<f64> = Vec::new();
            let mut iacc: Vec<i64> = Vec::new();
            for &id in &reducing {
                let Instr::RowReduce { kind, .. } = ir.body[id] else {
                    continue;
                };
                let max = kind == ReduceKind::Max;
                facc.push(if max { f64::NEG_INFINITY } else { 0.0 });
                iacc.push(if max { i64::MIN } else { 0 });
            }
            for j in 0..inner {
                coord[inner_axis] = j;
                for (i, &level) in levels.iter().enumerate() {
                    if level <= pass {
                        eval(
                            ir,
                            i,
                            &mut vals,
                            &mut ints,
                            (&coord, &launch.ranges, &launch.gathers),
                            |view| (&*buffers[view], index(view, &coord)),
                        );
                    }
                }
                accumulate(ir, &reducing, (&vals, &ints), (&mut facc, &mut iacc));
                if last {
                    for (s, store) in ir.stores.iter().enumerate() {
                        let arg = loads + s;
                        if store.view.axes[inner_axis] == Axis::Broadcast {
                            continue;
                        }
                        let first =
                            (0..inner_axis).all(|d| launch.strides[arg][d] != 0 || coord[d] == 0);
                        if first {
                            let at = index(arg, &coord);
                            if ir.prec(store.value) == Prec::I64 {
                                buffers[arg].set_int(at, ints[store.value]);
                            } else {
                                buffers[arg].set(at, vals[store.value]);
                            }
                        }
                    }
                }
            }
            finish_row(ir, &reducing, inner, (&facc, &iacc), (&mut vals, &mut ints));
        }
        // Stores with one element per row: from the row's results, at inner index 0.
        coord[inner_axis] = 0;
        for (i, &need) in needed.iter().enumerate() {
            if need {
                eval(
                    ir,
                    i,
                    &mut vals,
                    &mut ints,
                    (&coord, &launch.ranges, &launch.gathers),
                    |view| (&*buffers[view], index(view, &coord)),
                );
            }
        }
        for (s, store) in ir.stores.iter().enumerate() {
            let arg = loads + s;
            if store.view.axes[inner_axis] != Axis::Broadcast {
                continue;
            }
            if (0..inner_axis).all(|d| launch.strides[arg][d] != 0 || coord[d] == 0) {
                let at = index(arg, &coord);
                if ir.prec(store.value) == Prec::I64 {
                    buffers[arg].set_int(at, ints[store.value]);
                } else {
                    buffers[arg].set(at, vals[store.value]);
                }
            }
        }
    }
}

/// Which values the per-row stores (those broadcast along the inner axis, one element per
/// row) need, so that an empty row loads nothing: those stores' values and, transitively,
/// their operands, stopping at row reductions (computed by the row's passes).
fn per_row_values(ir: &KernelIr, inner_axis: usize) -> Vec<bool> {
    let mut needed = vec![false; ir.body.len()];
    for store in &ir.stores {
        if store.view.axes[inner_axis] == Axis::Broadcast {
            needed[store.value] = true;
        }
    }
    for id in (0..ir.body.len()).rev() {
        if needed[id] && !matches!(ir.body[id], Instr::RowReduce { .. }) {
            for x in ir.body[id].operands() {
                needed[x] = true;
            }
        }
    }
    needed
}

/// Adds one element of the row to each of the `reducing` row reductions' accumulators
/// (`facc` for floats, `iacc` for exact integers, by position in `reducing`): sums wrap in
/// i64, a float max is NaN once any element is, as the kernels compute them.
fn accumulate(
    ir: &KernelIr,
    reducing: &[usize],
    (vals, ints): (&[f64], &[i64]),
    (facc, iacc): (&mut [f64], &mut [i64]),
) {
    for (k, &id) in reducing.iter().enumerate() {
        let Instr::RowReduce { kind, x, .. } = ir.body[id] else {
            continue;
        };
        let max = kind == ReduceKind::Max;
        if ir.prec(x) == Prec::I64 {
            let v = ints[x];
            iacc[k] = if max {
                iacc[k].max(v)
            } else {
                iacc[k].wrapping_add(v)
            };
        } else {
            let v = vals[x];
            facc[k] = match max {
                true if facc[k].is_nan() || v.is_nan() => f64::NAN,
                true => facc[k].max(v),
                false => facc[k] + v,
            };
        }
    }
}

/// The results of the `reducing` row reductions over a row of `inner` elements, from their
/// accumulators, each rounded once to its dtype (a mean divided first) into `vals` / `ints`.
fn finish_row(
    ir: &KernelIr,
    reducing: &[usize],
    inner: usize,
    (facc, iacc): (&[f64], &[i64]),
    (vals, ints): (&mut [f64], &mut [i64]),
) {
    for (k, &id) in reducing.iter().enumerate() {
        let Instr::RowReduce { kind, x, dtype } = ir.body[id] else {
            continue;
        };
        if ir.prec(x) == Prec::I64 {
            ints[id] = round_int(iacc[k], dtype).1;
            continue;
        }
        let a = if kind == ReduceKind::Mean {
            facc[k] / inner as f64
        } else {
            facc[k]
        };
        vals[id] = dtype.round(a);
    }
}

/// Why the interpreter could not run a program: a buffer it could not allocate, a matrix
/// product whose buffers disagree, or a program whose steps do not write what later steps
/// read (an internal invariant broke).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterpretError {
    #[error(transparent)]
    Alloc(#[from] crate::tensor::AllocError),
    #[error(transparent)]
    MatMul(#[from] super::matmul::MatMulError),
    #[error("load before store")]
    LoadBeforeStore,
    #[error("matmul operand missing")]
    MatMulOperandMissing,
    /// The output (named) that no step wrote.
    #[error("output `{0}` was never written")]
    OutputNotWritten(String),
}

/// The value product step `m` writes, holding `product` (its result, contiguous): the
/// product itself, or the transpose of it the step writes instead (`lower::ResultView`).
pub fn placed_product(
    program: &Program,
    m: &crate::lower::MatMulStep,
    product: Buffer,
) -> Result<(crate::dag::Value, Buffer), InterpretError> {
    let Some(result) = &m.result else {
        return Ok((m.out, product));
    };
    let ty = program.dag.ty(result.value);
    let mut placed = Buffer::try_zeroed(ty.dtype, &ty.shape)?;
    match placed.gather_from(product.elements(), &result.read) {
        true => Ok((result.value, placed)),
        false => Err(super::matmul::MatMulError::ViewOutOfBounds { operand: "result" }.into()),
    }
}

/// Runs kernel step `k` of `program` on `values`: reads its loads' buffers, writes its stores'.
fn run_step(
    program: &Program,
    k: &crate::lower::KernelStep,
    values: &mut std::collections::HashMap<crate::dag::Value, Buffer>,
) -> Result<(), InterpretError> {
    let dag = &program.dag;
    let fresh = |v: crate::dag::Value| {
        let ty = dag.ty(v);
        Buffer::try_zeroed(ty.dtype, &ty.shape)
    };
    let ir = &program.kernels[k.kernel];
    let loads = ir.loads.len();
    // A value several arguments write (a concat written in place by stores of one
    // kernel, into disjoint segments) gives each of them a copy; the first holds
    // the result once each later one has handed back the elements it reaches.
    let first_of = |a: usize| k.args[loads..a].iter().position(|&w| w == k.args[a]);
    let mut owned: Vec<Buffer> = Vec::with_capacity(k.args.len());
    for (a, &v) in k.args.iter().enumerate() {
        owned.push(if a < loads {
            values
                .get(&v)
                .cloned()
                .ok_or(InterpretError::LoadBeforeStore)?
        } else if let Some(f) = first_of(a) {
            owned[loads + f].clone()
        } else {
            values.remove(&v).map_or_else(|| fresh(v), Ok)?
        });
    }
    let mut refs: Vec<&mut Buffer> = owned.iter_mut().collect();
    run(ir, &k.launch, &mut refs);
    for a in (loads..k.args.len()).rev() {
        if let Some(f) = first_of(a) {
            let copy = owned[a].clone();
            hand_back(ir, &k.launch, a, &copy, &mut owned[loads + f]);
        }
    }
    for (a, (v, b)) in k.args.iter().zip(owned).enumerate() {
        if a >= loads && first_of(a).is_none() {
            values.insert(*v, b);
        }
    }
    Ok(())
}

/// Runs a whole program with the interpreter: `inputs` in `dag.inputs` order, outputs in
/// `dag.outputs` order.
pub fn run_program(program: &Program, inputs: &[Buffer]) -> Result<Vec<Buffer>, InterpretError> {
    use crate::dag::Value;
    use std::collections::HashMap;
    let dag = &program.dag;
    let mut values: HashMap<Value, Buffer> = HashMap::new();
    for (i, b) in inputs.iter().enumerate() {
        values.insert(Value::Input(i), b.clone());
    }
    let fresh = |v: Value| {
        let ty = dag.ty(v);
        Buffer::try_zeroed(ty.dtype, &ty.shape)
    };
    for step in &program.steps {
        match step {
            Step::Kernel(k) => run_step(program, k, &mut values)?,
            Step::MatMul(m) => {
                let a = values
                    .get(&m.a.value)
                    .ok_or(InterpretError::MatMulOperandMissing)?;
                let b = values
                    .get(&m.b.value)
                    .ok_or(InterpretError::MatMulOperandMissing)?;
                let mut out = fresh(m.out)?;
                super::matmul::matmul(a, &m.a, b, &m.b, &mut out)?;
                let (value, buffer) = placed_product(program, m, out)?;
                values.insert(value, buffer);
                // The epilogue runs after the product, over its whole shape.
                if let Some(e) = &m.epilogue {
                    run_step(program, &e.step, &mut values)?;
                }
            }
        }
    }
    dag.outputs
        .iter()
        .map(|o| {
            values
                .get(&o.value)
                .cloned()
                .ok_or_else(|| InterpretError::OutputNotWritten(o.name.clone()))
        })
        .collect()
}

/// Copies into `to` every element of `from` that argument `arg`'s view reaches over the
/// launch's domain (bytes as they are: the buffers share a dtype): a store's elements at
/// every domain point, a reduction's at every point of its kept axes (also when a reduced
/// axis is empty: its results are the identity, written all the same).
pub fn hand_back(ir: &KernelIr, launch: &Launch, arg: usize, from: &Buffer, to: &mut Buffer) {
    let width = ir.views().nth(arg).map_or(1, |v| v.dtype.size_bytes());
    let len = from.byte_len().min(to.byte_len());
    for_each_point(&arg_extent(ir, launch, arg), |coord| {
        let at = element_index(launch, arg, coord) * width;
        if at + width <= len {
            // SAFETY: both buffers hold at least `at + width` bytes, and they are distinct.
            unsafe {
                std::ptr::copy_nonoverlapping(from.as_ptr().add(at), to.as_mut_ptr().add(at), width)
            };
        }
    });
}

/// The points argument `arg`'s view is walked over: the launch's domain, with a reduction's
/// reduced axes at one point (its results are indexed by the kept axes alone, and exist
/// even where a reduced axis is empty).
fn arg_extent(ir: &KernelIr, launch: &Launch, arg: usize) -> Vec<usize> {
    let reduction = (arg + ir.reductions.len()).checked_sub(ir.arg_count());
    launch
        .sizes
        .iter()
        .enumerate()
        .map(|(d, &s)| match reduction {
            Some(r) if ir.reductions[r].reduced[d] => 1,
            _ => s.max(0) as usize,
        })
        .collect()
}

/// Calls `f` at every point of a grid of `sizes`, the last axis fastest.
fn for_each_point(sizes: &[usize], mut f: impl FnMut(&[usize])) {
    let mut coord = vec![0usize; sizes.len()];
    for _ in 0..sizes.iter().product::<usize>() {
        f(&coord);
        for d in (0..coord.len()).rev() {
            coord[d] += 1;
            if coord[d] < sizes[d] {
                break;
            }
            coord[d] = 0;
        }
    }
}

/// The element of argument `arg` at domain point `coord`: its offset plus the strided
/// coordinates, and for an index map that position through each of its stages (the launch
/// was bounds-checked, so the index is in its buffer).
fn element_index(launch: &Launch, arg: usize, coord: &[usize]) -> usize {
    let off = launch.offsets[arg]
        + coord
            .iter()
            .zip(&launch.strides[arg])
            .map(|(&c, &s)| c as i64 * s)
            .sum::<i64>();
    launch.through_map(arg, off) as usize
}
