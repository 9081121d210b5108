//! Pointwise ops: interpret the op's formula over broadcast operands.

use crate::attr::Attrs;
use crate::dtype::DType;
use crate::formula::{Bindings, Expr, Scalar, evaluate};
use crate::graph::TensorType;
use crate::rules::{DtypeRule, OpDef};
use crate::tensor::Tensor;
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

pub(super) fn apply(
    op: &OpDef,
    expr: &Expr,
    args: &[&Tensor],
    attrs: &Attrs,
    out: &TensorType,
    arg_dtypes: &[DType],
) -> Result<Tensor, String> {
    let common = common_dtype(op, arg_dtypes, out.dtype);
    // Operands are rounded to the common dtype first, then the formula runs at that dtype's
    // compute precision: f32 for f16/bf16/f32, f64 otherwise (and for casts, which must round
    // once, from the exact value).
    let in_f64 = common.is_none_or(|d| d.compute_is_f64()) || out.dtype == DType::F64;
    let values = if in_f64 {
        run::<f64>(op, expr, args, attrs, out, common)?
    } else {
        run::<f32>(op, expr, args, attrs, out, common)?
    };
    let data = ArrayD::from_shape_vec(IxDyn(&out.shape), values)
        .map_err(|e| format!("internal shape error: {e}"))?;
    Ok(Tensor::from_array(out.dtype, data))
}

fn run<S: Scalar>(
    op: &OpDef,
    expr: &Expr,
    args: &[&Tensor],
    attrs: &Attrs,
    out: &TensorType,
    common: Option<DType>,
) -> Result<Vec<f64>, String> {
    let len = crate::shape::numel(&out.shape);
    let mut operands: Vec<Vec<S>> = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        let round = |v: f64| match common {
            Some(d) if converts(op, i) => d.round(v),
            _ => v,
        };
        // A one-element operand stays a scalar; anything else is broadcast to the output.
        let values: Vec<S> = if arg.data.len() == 1 {
            vec![S::from_f64(round(
                arg.data.iter().next().copied().unwrap_or(0.0),
            ))]
        } else {
            let view = arg
                .data
                .broadcast(IxDyn(&out.shape))
                .ok_or_else(|| format!("cannot broadcast {:?} to {:?}", arg.shape(), out.shape))?;
            view.iter().map(|&v| S::from_f64(round(v))).collect()
        };
        operands.push(values);
    }
    let attr_values: Vec<(String, [S; 1])> = attrs
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), [S::from_f64(x)])))
        .collect();
    let mut bindings = Bindings::new(len);
    for (i, values) in operands.iter().enumerate() {
        bindings = bindings.bind(op.operand_name(i), values);
    }
    for (name, value) in &attr_values {
        bindings = bindings.bind(name, value);
    }
    let result = evaluate(expr, &bindings, len)?;
    Ok(result.into_iter().map(S::to_f64).collect())
}
