//! Layout, reduction and matmul semantics, on whole arrays.
//!
//! Reductions accumulate in f64 and round once to the result dtype: the oracle should be at
//! least as accurate as any kernel it judges. Matmul runs at the compute precision of its dtype
//! (f32 for f16/bf16/f32, as cuBLAS does with f32 accumulation) through ndarray's GEMM.

use crate::attr::Attrs;
use crate::dtype::DType;
use crate::graph::TensorType;
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::rules::Builtin;
use crate::tensor::Tensor;
use ndarray::{Array2, ArrayD, ArrayView2, Axis, IxDyn, Slice};

pub(super) fn apply(
    builtin: Builtin,
    args: &[&Tensor],
    attrs: &Attrs,
    out: &TensorType,
) -> Result<Tensor, String> {
    let shapes: Vec<&[usize]> = args.iter().map(|t| t.shape()).collect();
    let (plan, _) = plan_builtin(builtin, &shapes, attrs)?;
    let x = &args[0].data;
    let data: ArrayD<f64> = match plan {
        BuiltinPlan::BroadcastTo(shape) => x
            .broadcast(IxDyn(&shape))
            .ok_or("broadcast failed")?
            .to_owned(),
        BuiltinPlan::Reshape(shape) => x
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(&shape))
            .map_err(|e| e.to_string())?,
        BuiltinPlan::Transpose(perm) => x
            .view()
            .permuted_axes(IxDyn(&perm))
            .as_standard_layout()
            .into_owned(),
        BuiltinPlan::Slice(r) => {
            let end = r.start + r.len.saturating_sub(1) * r.step + usize::from(r.len > 0);
            x.slice_axis(
                Axis(r.axis),
                Slice::new(r.start as isize, Some(end as isize), r.step as isize),
            )
            .to_owned()
        }
        BuiltinPlan::Concat(axis) => {
            // Operands meet at the result dtype before they are joined.
            let converted: Vec<ArrayD<f64>> = args
                .iter()
                .map(|t| t.data.mapv(|v| out.dtype.round(v)))
                .collect();
            let views: Vec<_> = converted.iter().map(|a| a.view()).collect();
            ndarray::concatenate(Axis(axis), &views).map_err(|e| e.to_string())?
        }
        BuiltinPlan::Reduce {
            builtin,
            axes,
            keepdim,
        } => reduce(x, builtin, &axes, keepdim),
        BuiltinPlan::SumToSize(target) => sum_to_size(x, &target)?,
        BuiltinPlan::MatMul => matmul(args[0], args[1], out)?,
    };
    Ok(Tensor::from_array(out.dtype, data))
}

fn reduce(x: &ArrayD<f64>, builtin: Builtin, axes: &[usize], keepdim: bool) -> ArrayD<f64> {
    // Standard layout first: ndarray sums lanes along the smallest-stride axis with unrolled
    // partial sums and other axes one slice at a time, so without this the same values could
    // sum differently (catastrophic cancellation, last bits) depending on how the operand
    // happens to be stored (a concat along axis 1 is not row-major).
    if x.is_empty() {
        // Summing axis by axis would build intermediates as large as the other axes (a
        // [2^32, 0] input has a [2^32] partial sum): answer directly. Mean of nothing is NaN;
        // reduce_max of nothing only reaches here with an empty result.
        let fill = match builtin {
            Builtin::Mean => f64::NAN,
            Builtin::ReduceMax => f64::NEG_INFINITY,
            _ => 0.0,
        };
        let shape = crate::shape::reduced_shape(x.shape(), axes, keepdim);
        return ArrayD::from_elem(IxDyn(&shape), fill);
    }
    let mut acc = x.as_standard_layout().into_owned();
    // Highest axis first, so the remaining axis numbers stay valid.
    for &axis in axes.iter().rev() {
        acc = match builtin {
            Builtin::ReduceMax => acc.map_axis(Axis(axis), |lane| {
                lane.iter().copied().fold(f64::NEG_INFINITY, |m, v| {
                    if m.is_nan() || v.is_nan() {
                        f64::NAN
                    } else {
                        m.max(v)
                    }
                })
            }),
            _ => acc.sum_axis(Axis(axis)),
        };
    }
    if builtin == Builtin::Mean {
        let count: usize = axes.iter().map(|&a| x.shape()[a]).product();
        // 0 / 0 gives NaN for the mean of nothing, as NumPy and PyTorch do.
        acc.mapv_inplace(|v| v / count as f64);
    }
    if keepdim {
        for &axis in axes {
            acc.insert_axis_inplace(Axis(axis));
        }
    }
    acc
}

fn sum_to_size(x: &ArrayD<f64>, target: &[usize]) -> Result<ArrayD<f64>, String> {
    let lead = x.ndim() - target.len();
    if x.is_empty() {
        // As in `reduce`: no partial sums as large as the other axes of an empty input.
        return Ok(ArrayD::zeros(IxDyn(target)));
    }
    // Standard layout, so the summation order depends on the shape only (see `reduce`).
    let mut acc = x.as_standard_layout().into_owned();
    for axis in (0..x.ndim()).rev() {
        let reduce = axis < lead || (target[axis - lead] == 1 && x.shape()[axis] != 1);
        if reduce {
            acc = acc.sum_axis(Axis(axis));
            if axis >= lead {
                acc.insert_axis_inplace(Axis(axis));
            }
        }
    }
    acc.into_shape_with_order(IxDyn(target))
        .map_err(|e| e.to_string())
}

/// NumPy matmul through ndarray's GEMM, looping over broadcast batch dimensions.
fn matmul(a: &Tensor, b: &Tensor, out: &TensorType) -> Result<ArrayD<f64>, String> {
    // Promote 1-D operands to matrices, as NumPy does.
    let a2 = if a.data.ndim() == 1 {
        a.data.clone().insert_axis(Axis(0))
    } else {
        a.data.clone()
    };
    let b2 = if b.data.ndim() == 1 {
        b.data.clone().insert_axis(Axis(1))
    } else {
        b.data.clone()
    };
    let (n, k) = (a2.shape()[a2.ndim() - 2], a2.shape()[a2.ndim() - 1]);
    let m = b2.shape()[b2.ndim() - 1];
    let batch =
        crate::shape::broadcast(&a2.shape()[..a2.ndim() - 2], &b2.shape()[..b2.ndim() - 2])?;
    let full = |arr: &ArrayD<f64>, rows, cols| {
        let mut shape = batch.clone();
        shape.extend([rows, cols]);
        // Row-major whatever the operand's layout (`to_owned` keeps a column-major one, which
        // the reshapes below cannot take).
        arr.broadcast(IxDyn(&shape))
            .map(|v| v.as_standard_layout().into_owned())
            .ok_or_else(|| "matmul batch broadcast failed".to_string())
    };
    let (a3, b3) = (full(&a2, n, k)?, full(&b2, k, m)?);
    let batches = crate::shape::numel(&batch);
    let a3 = a3
        .into_shape_with_order((batches, n, k))
        .map_err(|e| e.to_string())?;
    let b3 = b3
        .into_shape_with_order((batches, k, m))
        .map_err(|e| e.to_string())?;
    let f32_compute = !out.dtype.compute_is_f64();
    let mut result = Vec::with_capacity(batches * n * m);
    for i in 0..batches {
        let (ai, bi) = (a3.index_axis(Axis(0), i), b3.index_axis(Axis(0), i));
        let product: Array2<f64> = if f32_compute {
            gemm_f32(ai, bi, out.dtype)
        } else {
            ai.dot(&bi)
        };
        result.extend(product.iter().copied());
    }
    ArrayD::from_shape_vec(IxDyn(&out.shape), result).map_err(|e| e.to_string())
}

/// A product at f32 precision, operands first rounded to the result dtype.
fn gemm_f32(a: ArrayView2<f64>, b: ArrayView2<f64>, dtype: DType) -> Array2<f64> {
    let a32 = a.mapv(|v| dtype.round(v) as f32);
    let b32 = b.mapv(|v| dtype.round(v) as f32);
    a32.dot(&b32).mapv(f64::from)
}
