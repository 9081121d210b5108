//! Layout, reduction and matmul semantics, on whole arrays.
//!
//! Float reductions accumulate in f64 and round once to the result dtype: the oracle should be
//! at least as accurate as any kernel it judges. Integer results (sums, maxima, products) are
//! computed on exact integers, wrapping in i64 and then to the result dtype. Matmul runs at the compute precision of its dtype
//! (f32 for f16/bf16/f32, as cuBLAS does with f32 accumulation) through ndarray's GEMM.

use super::EvalError;
use crate::attr::Attrs;
use crate::dtype::{Category, DType};
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
) -> Result<Tensor, EvalError> {
    let shapes: Vec<&[usize]> = args.iter().map(|t| t.shape()).collect();
    let (plan, _) = plan_builtin(builtin, &shapes, attrs)?;
    // Integer results are computed on exact integers, wrapping in i64 and then to the result
    // dtype (as NumPy sums and multiplies `int32` in `int32`: the low 32 bits agree).
    let int_out = out.dtype.category() == Category::Integer;
    let x = args[0];
    // Every arm ends in the result's fallible allocation.
    let result = match plan {
        BuiltinPlan::BroadcastTo(_)
        | BuiltinPlan::Reshape(_)
        | BuiltinPlan::Transpose(_)
        | BuiltinPlan::Slice(_) => {
            let t = x.map_layout(|a| layout(a, &plan), |a| layout(a, &plan))?;
            t.into_dtype(out.dtype)
        }
        BuiltinPlan::Concat(axis) => {
            // Operands meet at the result dtype before they are joined.
            // Operands already in it are not copied.
            let converted: Vec<std::borrow::Cow<Tensor>> = args
                .iter()
                .map(|&t| {
                    Ok(if t.dtype == out.dtype {
                        std::borrow::Cow::Borrowed(t)
                    } else {
                        std::borrow::Cow::Owned(t.cast(out.dtype)?)
                    })
                })
                .collect::<Result<_, EvalError>>()?;
            if int_out {
                let arrays: Vec<_> = converted.iter().map(|t| t.ints()).collect();
                let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
                let data = ndarray::concatenate(Axis(axis), &views).map_err(internal)?;
                Tensor::try_from_int_array(out.dtype, data)
            } else {
                let arrays: Vec<_> = converted.iter().map(|t| t.floats()).collect();
                let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
                let data = ndarray::concatenate(Axis(axis), &views).map_err(internal)?;
                Tensor::try_from_array(out.dtype, data)
            }
        }
        BuiltinPlan::Reduce {
            builtin,
            axes,
            keepdim,
        } => {
            if int_out {
                Tensor::try_from_int_array(
                    out.dtype,
                    reduce_ints(&x.ints(), builtin, &axes, keepdim),
                )
            } else {
                let reduced = reduce(&x.floats(), builtin, &axes, keepdim);
                let reduced = match builtin {
                    Builtin::ReduceMax => reduced,
                    _ => from_positive_zero(reduced),
                };
                Tensor::try_from_array(out.dtype, reduced)
            }
        }
        BuiltinPlan::SumToSize(target) => {
            if int_out {
                let summed = sum_to_size(&x.ints(), &target, wrapping_sum_axis)?;
                Tensor::try_from_int_array(out.dtype, summed)
            } else {
                let summed = sum_to_size(&x.floats(), &target, |a, axis| a.sum_axis(axis))?;
                Tensor::try_from_array(out.dtype, from_positive_zero(summed))
            }
        }
        BuiltinPlan::MatMul if int_out => {
            let product = matmul_ints(&args[0].cast(out.dtype)?, &args[1].cast(out.dtype)?, out)?;
            Tensor::try_from_int_array(out.dtype, product)
        }
        BuiltinPlan::MatMul => Tensor::try_from_array(
            out.dtype,
            matmul(&args[0].floats(), &args[1].floats(), out)?,
        ),
        BuiltinPlan::Gather { axis } | BuiltinPlan::GatherElements { axis } => {
            let elements = matches!(plan, BuiltinPlan::GatherElements { .. });
            let indices = args[1].ints();
            let picks = gathered(x.shape(), &indices, axis, elements, &out.shape)?;
            if int_out {
                let values = picked(&x.ints(), &picks, 0, &out.shape)?;
                Tensor::try_from_int_array(out.dtype, values)
            } else {
                // A float result reads NaN at an index out of range; a bool one, false.
                let fill = if out.dtype.is_float() { f64::NAN } else { 0.0 };
                Tensor::try_from_array(out.dtype, picked(&x.floats(), &picks, fill, &out.shape)?)
            }
        }
        BuiltinPlan::ScatterAdd { axis } => {
            let indices = args[1].ints();
            let updates = args[2];
            // Each update's place in the result (data's shape), in the updates' row-major
            // order: the order the additions happen in.
            let places = gathered(x.shape(), &indices, axis, true, updates.shape())?;
            if int_out {
                let values = scattered(&x.ints(), &updates.ints(), &places, |a, b| {
                    crate::tensor::wrap_int(out.dtype, a.wrapping_add(b))
                })?;
                Tensor::try_from_int_array(out.dtype, values)
            } else {
                let values = scattered(&x.floats(), &updates.floats(), &places, |a, b| {
                    out.dtype.round(a + b)
                })?;
                Tensor::try_from_array(out.dtype, values)
            }
        }
    };
    Ok(result?)
}

/// For each element of a gather's result (row-major, of shape `out`), the row-major position
/// in `data` (of shape `data`) it reads, or `None` where its index is out of range. An index
/// `k` along an axis of size `n` is valid for `-n <= k < n`, a negative one counting from the
/// end (as ONNX and NumPy say); any other reads the fill value. `gather` (`elements` false)
/// replaces the axis by the index tensor's axes; `gather_elements` reads, at each point, the
/// index at that point in place of its own coordinate along `axis`.
fn gathered(
    data: &[usize],
    indices: &ArrayD<i64>,
    axis: usize,
    elements: bool,
    out: &[usize],
) -> Result<Vec<Option<usize>>, EvalError> {
    let row_major = |shape: &[usize]| {
        let mut strides = vec![1usize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        strides
    };
    let strides = row_major(data);
    let indices = indices.as_standard_layout();
    let flat = indices
        .as_slice()
        .ok_or_else(|| EvalError::Internal("layout".into()))?;
    let index_strides = row_major(indices.shape());
    // Where each result axis moves in the index tensor and in `data` (`axis` itself, read
    // from the index, moves nowhere in `data`).
    let (index_step, data_step): (Vec<usize>, Vec<usize>) = if elements {
        let data_step = (0..out.len()).map(|d| if d == axis { 0 } else { strides[d] });
        // A scatter's indices may be broadcast along an axis of the updates (size 1 there).
        let index_step = (0..out.len()).map(|d| {
            if indices.shape()[d] == out[d] {
                index_strides[d]
            } else {
                0
            }
        });
        (index_step.collect(), data_step.collect())
    } else {
        let q = indices.ndim();
        (0..out.len())
            .map(|d| match d {
                d if d < axis => (0, strides[d]),
                d if d < axis + q => (index_strides[d - axis], 0),
                d => (0, strides[d + 1 - q]),
            })
            .unzip()
    };
    let n = data[axis] as i64;
    let count = crate::shape::numel(out);
    let mut picks = crate::tensor::try_vec(count, out)?;
    let mut point = vec![0usize; out.len()];
    for _ in 0..count {
        let at = |step: &[usize]| point.iter().zip(step).map(|(p, s)| p * s).sum::<usize>();
        let k = flat[at(&index_step)];
        let k = if k < 0 { k.wrapping_add(n) } else { k };
        picks.push(
            (0..n)
                .contains(&k)
                .then(|| at(&data_step) + k as usize * strides[axis]),
        );
        // The next point, row-major.
        for d in (0..point.len()).rev() {
            point[d] += 1;
            if point[d] < out[d] {
                break;
            }
            point[d] = 0;
        }
    }
    Ok(picks)
}

/// The elements of `data` at `picks` (row-major positions; `fill` where `None`), as an array
/// of `shape`.
fn picked<T: Copy>(
    data: &ArrayD<T>,
    picks: &[Option<usize>],
    fill: T,
    shape: &[usize],
) -> Result<ArrayD<T>, EvalError> {
    let data = data.as_standard_layout();
    let flat = data
        .as_slice()
        .ok_or_else(|| EvalError::Internal("layout".into()))?;
    let mut values = crate::tensor::try_vec(picks.len(), shape)?;
    values.extend(picks.iter().map(|p| p.map_or(fill, |i| flat[i])));
    shaped(shape, values)
}

/// `data` with each of `updates` (row-major) added at its place, in order, each sum rounded to
/// the result's dtype by `add` (so that every backend, adding in the same order, agrees bit
/// for bit); an update whose index is out of range (`None`) is dropped.
fn scattered<T: Copy>(
    data: &ArrayD<T>,
    updates: &ArrayD<T>,
    places: &[Option<usize>],
    add: impl Fn(T, T) -> T,
) -> Result<ArrayD<T>, EvalError> {
    let updates = updates.as_standard_layout();
    let updates = updates
        .as_slice()
        .ok_or_else(|| EvalError::Internal("layout".into()))?;
    let data = data.as_standard_layout();
    let flat = data
        .as_slice()
        .ok_or_else(|| EvalError::Internal("layout".into()))?;
    let mut values = crate::tensor::try_vec(flat.len(), data.shape())?;
    values.extend_from_slice(flat);
    for (place, &update) in places.iter().zip(updates) {
        if let Some(i) = *place {
            values[i] = add(values[i], update);
        }
    }
    shaped(data.shape(), values)
}

/// `values` (row-major) as an array of `shape`.
fn shaped<T>(shape: &[usize], values: Vec<T>) -> Result<ArrayD<T>, EvalError> {
    ArrayD::from_shape_vec(IxDyn(shape), values).map_err(internal)
}

/// A float sum as an accumulator that starts at +0 gives it, as the kernels' do: where no
/// element was added (an axis of one element kept as it is, or nothing reduced), a -0 becomes
/// +0, as `+0 + -0` is. Every other value is unchanged.
fn from_positive_zero(sum: ArrayD<f64>) -> ArrayD<f64> {
    sum.mapv_into(|v| v + 0.0)
}

/// ndarray's refusal of a shape the plan computed: an internal invariant broke.
fn internal(e: ndarray::ShapeError) -> EvalError {
    EvalError::Internal(e.to_string())
}

/// A layout op's rearrangement, the same for every element type.
fn layout<T: Clone>(x: &ArrayD<T>, plan: &BuiltinPlan) -> Result<ArrayD<T>, EvalError> {
    Ok(match plan {
        BuiltinPlan::BroadcastTo(shape) => x
            .broadcast(IxDyn(shape))
            .ok_or_else(|| EvalError::Internal("broadcast failed".into()))?
            .to_owned(),
        BuiltinPlan::Reshape(shape) => x
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(shape))
            .map_err(internal)?,
        BuiltinPlan::Transpose(perm) => x
            .view()
            .permuted_axes(IxDyn(perm))
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
        _ => return Err(EvalError::Internal("not a layout op".into())),
    })
}

/// [`reduce`] on exact integers: sums wrap in i64, maxima compare as integers.
fn reduce_ints(x: &ArrayD<i64>, builtin: Builtin, axes: &[usize], keepdim: bool) -> ArrayD<i64> {
    if x.is_empty() {
        // An integer reduce_max of nothing only reaches here with an empty result (the
        // checker refuses the others).
        let shape = crate::shape::reduced_shape(x.shape(), axes, keepdim);
        return ArrayD::zeros(IxDyn(&shape));
    }
    let mut acc = x.as_standard_layout().into_owned();
    // Highest axis first, so the remaining axis numbers stay valid.
    for &axis in axes.iter().rev() {
        acc = match builtin {
            Builtin::ReduceMax => acc.map_axis(Axis(axis), |lane| {
                lane.iter().copied().max().unwrap_or(i64::MIN)
            }),
            _ => wrapping_sum_axis(&acc, Axis(axis)),
        };
    }
    if keepdim {
        for &axis in axes {
            acc.insert_axis_inplace(Axis(axis));
        }
    }
    acc
}

fn reduce(x: &ArrayD<f64>, builtin: Builtin, axes: &[usize], keepdim: bool) -> ArrayD<f64> {
    // Standard layout first: ndarray sums lanes along the smallest-stride axis with unrolled
    // partial sums and other axes one slice at a time, so without this the same values could
    // sum differently (catastrophic cancellation, last bits) depending on how the operand
    // happens to be stored (a concat along axis 1 is not row-major).
    if x.is_empty() {
        // Summing axis by axis would build intermediates as large as the other axes (a
        // [2^32, 0] input has a [2^32] partial sum): answer directly. Mean of nothing is NaN,
        // and reduce_max of nothing -inf (its identity, as in every backend).
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

/// Sums `x` down to `target` (the leading axes and the axes where `target` has size 1), one
/// axis at a time with `sum_axis`.
fn sum_to_size<T: Clone + Default>(
    x: &ArrayD<T>,
    target: &[usize],
    sum_axis: impl Fn(&ArrayD<T>, Axis) -> ArrayD<T>,
) -> Result<ArrayD<T>, EvalError> {
    let lead = x.ndim() - target.len();
    if x.is_empty() {
        // As in `reduce`: no partial sums as large as the other axes of an empty input.
        return Ok(ArrayD::from_elem(IxDyn(target), T::default()));
    }
    // Standard layout, so the summation order depends on the shape only (see `reduce`).
    let mut acc = x.as_standard_layout().into_owned();
    for axis in (0..x.ndim()).rev() {
        let reduce = axis < lead || (target[axis - lead] == 1 && x.shape()[axis] != 1);
        if reduce {
            acc = sum_axis(&acc, Axis(axis));
            if axis >= lead {
                acc.insert_axis_inplace(Axis(axis));
            }
        }
    }
    acc.into_shape_with_order(IxDyn(target)).map_err(internal)
}

/// The wrapping sum of `x` along `axis`.
fn wrapping_sum_axis(x: &ArrayD<i64>, axis: Axis) -> ArrayD<i64> {
    x.map_axis(axis, |lane| {
        lane.iter().fold(0i64, |a, &v| a.wrapping_add(v))
    })
}

/// NumPy matmul through ndarray's GEMM, looping over broadcast batch dimensions.
fn matmul(a: &ArrayD<f64>, b: &ArrayD<f64>, out: &TensorType) -> Result<ArrayD<f64>, EvalError> {
    let f32_compute = !out.dtype.compute_is_f64();
    batched(a, b, out, |ai, bi| {
        if f32_compute {
            gemm_f32(ai, bi, out.dtype)
        } else {
            ai.dot(&bi)
        }
    })
}

/// Integer matmul: products and sums wrap in i64 (`Wrapping`), as NumPy's integer matmul
/// wraps; the caller wraps the result to its dtype. Operands arrive already in that dtype.
fn matmul_ints(a: &Tensor, b: &Tensor, out: &TensorType) -> Result<ArrayD<i64>, EvalError> {
    use std::num::Wrapping;
    let (a, b) = (a.ints().mapv(Wrapping), b.ints().mapv(Wrapping));
    let product = batched(&a, &b, out, |ai, bi| ai.dot(&bi))?;
    Ok(product.mapv(|w| w.0))
}

/// A matrix product per broadcast batch, computed by `product`.
fn batched<T: ndarray::LinalgScalar>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    out: &TensorType,
    product: impl Fn(ArrayView2<T>, ArrayView2<T>) -> Array2<T>,
) -> Result<ArrayD<T>, EvalError> {
    // Promote 1-D operands to matrices, as NumPy does.
    let a2 = if a.ndim() == 1 {
        a.clone().insert_axis(Axis(0))
    } else {
        a.clone()
    };
    let b2 = if b.ndim() == 1 {
        b.clone().insert_axis(Axis(1))
    } else {
        b.clone()
    };
    let (n, k) = (a2.shape()[a2.ndim() - 2], a2.shape()[a2.ndim() - 1]);
    let m = b2.shape()[b2.ndim() - 1];
    let batch =
        crate::shape::broadcast(&a2.shape()[..a2.ndim() - 2], &b2.shape()[..b2.ndim() - 2])?;
    let full = |arr: &ArrayD<T>, rows, cols| {
        let mut shape = batch.clone();
        shape.extend([rows, cols]);
        // Row-major whatever the operand's layout (`to_owned` keeps a column-major one, which
        // the reshapes below cannot take).
        arr.broadcast(IxDyn(&shape))
            .map(|v| v.as_standard_layout().into_owned())
            .ok_or_else(|| EvalError::Internal("matmul batch broadcast failed".into()))
    };
    let (a3, b3) = (full(&a2, n, k)?, full(&b2, k, m)?);
    let batches = crate::shape::numel(&batch);
    let a3 = a3
        .into_shape_with_order((batches, n, k))
        .map_err(internal)?;
    let b3 = b3
        .into_shape_with_order((batches, k, m))
        .map_err(internal)?;
    let mut result = crate::tensor::try_vec(batches * n * m, &out.shape)?;
    for i in 0..batches {
        let (ai, bi) = (a3.index_axis(Axis(0), i), b3.index_axis(Axis(0), i));
        result.extend(product(ai, bi).iter().copied());
    }
    ArrayD::from_shape_vec(IxDyn(&out.shape), result).map_err(internal)
}

/// A product at f32 precision, operands first rounded to the result dtype.
fn gemm_f32(a: ArrayView2<f64>, b: ArrayView2<f64>, dtype: DType) -> Array2<f64> {
    let a32 = a.mapv(|v| dtype.round(v) as f32);
    let b32 = b.mapv(|v| dtype.round(v) as f32);
    a32.dot(&b32).mapv(f64::from)
}
