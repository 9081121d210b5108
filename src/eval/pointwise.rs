//! Pointwise ops: interpret the op's formula over broadcast operands.
//!
//! Integer ops compute in exact 64-bit integers that wrap ([`WrappingInt`]) and are wrapped
//! to the result dtype; float ops at their dtype's float precision. Integers never go through
//! f64 unless the op's dtype rule makes the result a float.

use super::EvalError;
use crate::attr::Attrs;
use crate::dtype::{Category, DType};
use crate::formula::{Bindings, Expr, Scalar, WrappingInt, evaluate};
use crate::graph::TensorType;
use crate::rules::{DtypeRule, OpDef};
use crate::tensor::{Tensor, wrap_int};
use ndarray::{ArrayD, IxDyn};

/// The dtype operands are converted to before the formula runs, as eager frameworks convert
/// every operand to the common dtype first; `None` leaves operands as they are (cast).
pub(crate) fn common_dtype(op: &OpDef, arg_dtypes: &[DType], out: DType) -> Option<DType> {
    match &op.spec.dtype {
        DtypeRule::Promote(_)
        | DtypeRule::FloatPromote(_)
        | DtypeRule::SameAs(_)
        | DtypeRule::Accumulate(_) => Some(out),
        DtypeRule::Bool => arg_dtypes.iter().copied().reduce(DType::promote),
        DtypeRule::FromAttr(_) => None,
    }
}

/// Whether operand `index` takes part in the common dtype (where's condition does not).
pub(crate) fn converts(op: &OpDef, index: usize) -> bool {
    let name = op.operand_name(index);
    match &op.spec.dtype {
        DtypeRule::Promote(names) | DtypeRule::FloatPromote(names) => {
            names.iter().any(|n| n == name)
        }
        DtypeRule::SameAs(n) | DtypeRule::Accumulate(n) => n == name,
        DtypeRule::Bool => true,
        DtypeRule::FromAttr(_) => false,
    }
}

/// Whether a pointwise op computes in exact integers ([`WrappingInt`]): its common dtype is an
/// integer type, or (a cast or a constant, which have none) its operands are all integers and
/// there is something integer to compute (an operand, or an integer result).
pub(crate) fn computes_in_integers(
    common: Option<DType>,
    arg_dtypes: &[DType],
    out: DType,
) -> bool {
    let int = |d: DType| d.category() == Category::Integer;
    match common {
        Some(c) => int(c),
        None => arg_dtypes.iter().all(|&d| int(d)) && (!arg_dtypes.is_empty() || int(out)),
    }
}

pub(super) fn apply(
    op: &OpDef,
    expr: &Expr,
    args: &[&Tensor],
    attrs: &Attrs,
    out: &TensorType,
    arg_dtypes: &[DType],
) -> Result<Tensor, EvalError> {
    let common = common_dtype(op, arg_dtypes, out.dtype);
    if computes_in_integers(common, arg_dtypes, out.dtype) {
        // Exact integers throughout: an operand is wrapped to the common dtype (a widening,
        // so exact), a bool is 0 or 1, and a float operand that takes no part in the common
        // dtype is converted as a cast to i64 converts it.
        let operands = operands(args, out, |i, t| {
            let convert = common.filter(|_| converts(op, i)).unwrap_or(DType::I64);
            Ok(t.ints().mapv(|v| WrappingInt(wrap_int(convert, v))))
        })?;
        let attr_values: Vec<(String, [WrappingInt; 1])> = attrs
            .iter()
            .filter_map(|(k, v)| v.as_i64().map(|x| (k.clone(), [WrappingInt(x)])))
            .collect();
        let values = run(op, expr, &operands, &attr_values, out)?;
        let data = ArrayD::from_shape_vec(IxDyn(&out.shape), values.iter().map(|w| w.0).collect())
            .map_err(|e| EvalError::Internal(format!("internal shape error: {e}")))?;
        return Ok(Tensor::try_from_int_array(out.dtype, data)?);
    }
    // Operands are rounded to the common dtype first, then the formula runs at that dtype's
    // compute precision: f32 for f16/bf16/f32, f64 otherwise (and for casts, which must round
    // once, from the exact value). An integer operand becomes the nearest f64 first.
    let in_f64 = common.is_none_or(|d| d.compute_is_f64()) || out.dtype == DType::F64;
    let values = if in_f64 {
        float_run::<f64>(op, expr, args, attrs, out, common)?
    } else {
        float_run::<f32>(op, expr, args, attrs, out, common)?
    };
    let data = ArrayD::from_shape_vec(IxDyn(&out.shape), values)
        .map_err(|e| EvalError::Internal(format!("internal shape error: {e}")))?;
    Ok(Tensor::try_from_array(out.dtype, data)?)
}

fn float_run<S: Scalar>(
    op: &OpDef,
    expr: &Expr,
    args: &[&Tensor],
    attrs: &Attrs,
    out: &TensorType,
    common: Option<DType>,
) -> Result<Vec<f64>, EvalError> {
    let operands = operands(args, out, |i, t| {
        // Decided once per operand: the per-element closure only rounds.
        Ok(match common.filter(|_| converts(op, i)) {
            // `DType::round` for f32, without its per-element dtype match.
            Some(DType::F32) => t.floats().mapv(|v| S::from_f64(v as f32 as f64)),
            Some(d) => t.floats().mapv(|v| S::from_f64(d.round(v))),
            None => t.floats().mapv(S::from_f64),
        })
    })?;
    let attr_values: Vec<(String, [S; 1])> = attrs
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), [S::from_f64(x)])))
        .collect();
    let result = run(op, expr, &operands, &attr_values, out)?;
    Ok(result.into_iter().map(S::to_f64).collect())
}

/// Each operand converted by `convert(index, tensor)`; a one-element operand stays a scalar,
/// anything else is broadcast to the output.
fn operands<S: Scalar>(
    args: &[&Tensor],
    out: &TensorType,
    convert: impl Fn(usize, &Tensor) -> Result<ArrayD<S>, EvalError>,
) -> Result<Vec<Vec<S>>, EvalError> {
    let mut operands = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        let converted = convert(i, arg)?;
        let values: Vec<S> = if converted.len() == 1 {
            converted.iter().copied().collect()
        } else if converted.shape() == out.shape.as_slice() && converted.is_standard_layout() {
            // Already the output's shape, in row-major order: its buffer is the operand.
            converted.into_raw_vec_and_offset().0
        } else {
            let view =
                converted
                    .broadcast(IxDyn(&out.shape))
                    .ok_or_else(|| EvalError::Broadcast {
                        from: arg.shape().to_vec(),
                        to: out.shape.clone(),
                    })?;
            // `assign` walks the innermost axis as one strided run, where `iter` steps a
            // dynamic-rank index per element (several times slower on large operands).
            let mut full = ArrayD::from_elem(IxDyn(&out.shape), S::from_f64(0.0));
            full.assign(&view);
            full.into_raw_vec_and_offset().0
        };
        operands.push(values);
    }
    Ok(operands)
}

fn run<S: Scalar>(
    op: &OpDef,
    expr: &Expr,
    operands: &[Vec<S>],
    attr_values: &[(String, [S; 1])],
    out: &TensorType,
) -> Result<Vec<S>, EvalError> {
    let len = crate::shape::numel(&out.shape);
    let mut bindings = Bindings::new(len);
    for (i, values) in operands.iter().enumerate() {
        bindings = bindings.bind(op.operand_name(i), values);
    }
    for (name, value) in attr_values {
        bindings = bindings.bind(name, value);
    }
    Ok(evaluate(expr, &bindings, len)?)
}
