//! The ONNX ops the importer handles in code ([`STRUCTURAL`]): their catalogue form depends on
//! shapes or constant values known only at import (a Reshape's target is a constant input, a
//! Gather of constant indices is slices and a concat, a Shape is a constant), so no op table
//! entry can say it.
//!
//! Each op is one function, registered in [`HANDLERS`] under its ONNX op type; the importer
//! looks a node's op type up there before the op table. The built-in ops they produce are
//! found through [`Catalogue::builtin`](crate::rules::Catalogue::builtin) and given their
//! attributes through the built-ins' schema ([`BuiltinAttrs`]), never by name.

use super::fold::fits_folding;
use super::{FOLD_LIMIT, ImportError, Importer, Imports, Val, proto};
use crate::dtype::DType;
use crate::rules::Builtin;
use crate::rules::builtin::BuiltinAttrs;
use crate::rules::onnx::STRUCTURAL;
use crate::tensor::Tensor;
use onnx_protobuf::NodeProto;
use proto::Attr;
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

/// An ONNX node's attributes, by name.
pub(super) type Attrs = HashMap<String, Attr>;

/// What imports one structural node: its output values in order, or why it cannot be
/// imported.
pub(super) type Handler = fn(&mut Importer, &NodeProto, &Attrs, &str) -> Imports<Vec<Val>>;

/// The structural ops, one handler each, in the order of [`STRUCTURAL`] (a test checks that
/// the two lists agree).
const HANDLERS: [(&str, Handler); STRUCTURAL.len()] = [
    ("Constant", constant),
    ("ConstantOfShape", constant_of_shape),
    ("Shape", shape),
    ("Gather", gather),
    ("Reshape", reshape),
    ("Flatten", flatten),
    ("Squeeze", squeeze),
    ("Unsqueeze", squeeze),
    ("Expand", expand),
    ("Slice", slice),
    ("Split", split),
    ("LSTM", super::recurrent::lstm),
    ("GRU", super::recurrent::gru),
    ("RNN", super::recurrent::rnn),
    ("ArgMax", super::selection::arg_max),
    ("ArgMin", super::selection::arg_min),
    ("OneHot", super::selection::one_hot),
    ("Tile", super::selection::tile),
    ("Trilu", super::selection::trilu),
    ("GatherND", super::selection::gather_nd),
    ("Range", range),
    ("TopK", super::pairwise::top_k),
    ("CumSum", super::pairwise::cum_sum),
    ("ScatterElements", super::pairwise::scatter_elements),
    ("ScatterND", super::pairwise::scatter_nd),
    ("ReduceProd", super::products::reduce_prod),
    ("CumProd", super::products::cum_prod),
    ("Conv", super::convolution::conv),
    ("ConvTranspose", super::convolution::conv_transpose),
    ("MaxPool", super::convolution::max_pool),
    ("AveragePool", super::convolution::average_pool),
    ("GlobalAveragePool", super::convolution::global_average_pool),
    ("GlobalMaxPool", super::convolution::global_max_pool),
    ("BatchNormalization", super::normalization::batch_norm),
    ("Pad", super::convolution::pad),
    ("InstanceNormalization", super::normalization::instance_norm),
    ("GroupNormalization", super::normalization::group_norm),
    ("Resize", super::resize::resize),
];

/// The handler of ONNX op type `op_type`, if it is structural.
pub(super) fn handler(op_type: &str) -> Option<Handler> {
    HANDLERS
        .iter()
        .find(|(name, _)| *name == op_type)
        .map(|&(_, handle)| handle)
}

/// A Shape node: the dimensions of its input (from `start` to `end`), a constant.
fn shape(im: &mut Importer, node: &NodeProto, attrs: &Attrs, _: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len() as i64;
    let clip = |v: i64| (if v < 0 { v.saturating_add(rank) } else { v }).clamp(0, rank) as usize;
    let start = clip(int_attr(attrs, "start").unwrap_or(0));
    let end = clip(int_attr(attrs, "end").unwrap_or(rank));
    let dims: Vec<f64> = x.shape()[start..end.max(start)]
        .iter()
        .map(|&d| d as f64)
        .collect();
    let n = dims.len();
    let t =
        Tensor::from_values(DType::I64, &[n], dims).ok_or(ImportError::Internal("bad shape"))?;
    Ok(vec![Val::Const(Rc::new(t), None)])
}

/// A Range of constant `start`, `limit` and `delta` (scalars of one type): the constant
/// `start + i * delta` for `i` below `max(ceil((limit - start) / delta), 0)`, exact in
/// integers. Its length is a value, so a Range of run-time scalars has no static shape and is
/// refused; with symbolic dimensions bound, the exporters' `arange(seq)` is constant.
fn range(im: &mut Importer, node: &NodeProto, attrs: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let scalar = |i: usize, what: &str| -> Imports<Tensor> {
        let v = im.required(node, i)?;
        let t = im.demand(&v).ok_or_else(|| {
            ImportError::Unsupported(format!(
                "`{what}` must be a constant (a Range's length is its shape, and fusebox shapes are static), not a run-time value{}",
                super::GIVE_VALUE
            ))
        })?;
        if t.data.len() != 1 {
            return Err(ImportError::Malformed(format!(
                "`{what}` must be a scalar, not of shape {:?}",
                t.shape()
            )));
        }
        Ok(Tensor::clone(&t))
    };
    let (start, limit, delta) = (
        scalar(0, "start")?,
        scalar(1, "limit")?,
        scalar(2, "delta")?,
    );
    let dtype = start.dtype;
    if limit.dtype != dtype || delta.dtype != dtype {
        return Err(ImportError::Malformed(format!(
            "start, limit and delta must have one type, not {}, {} and {}",
            dtype, limit.dtype, delta.dtype
        )));
    }
    let too_long = |count: u128| {
        ImportError::Unsupported(format!(
            "a Range of {count} elements is longer than fusebox folds ({FOLD_LIMIT})"
        ))
    };
    let t = if dtype.category() == crate::dtype::Category::Integer {
        let [s, l, d] = [&start, &limit, &delta].map(|t| i128::from(t.int_values()[0]));
        if d == 0 {
            return Err(ImportError::Malformed("`delta` must not be 0".into()));
        }
        // ceil((l - s) / d) for either sign of d, in i128 so no i64 difference overflows.
        let span = l - s;
        let count = (span / d + i128::from(span % d != 0 && (span < 0) == (d < 0))).max(0);
        let count = u128::try_from(count).unwrap_or(0);
        if count > FOLD_LIMIT as u128 {
            return Err(too_long(count));
        }
        let values = (0..count as i128)
            .map(|i| i64::try_from(s + i * d).map_err(|_| too_long(count)))
            .collect::<Imports<Vec<i64>>>()?;
        Tensor::from_ints(dtype, &[values.len()], values)
    } else {
        let [s, l, d] = [&start, &limit, &delta].map(|t| t.values()[0]);
        let count = ((l - s) / d).ceil();
        // -inf (a step away from the limit) is an empty range; NaN and +inf have no length.
        if count.is_nan() || count == f64::INFINITY {
            return Err(ImportError::Malformed(format!(
                "Range({s}, {l}, {d}) has no finite length"
            )));
        }
        let count = count.max(0.0);
        if count > FOLD_LIMIT as f64 {
            return Err(too_long(count as u128));
        }
        // f16 and bf16 (Range 27): `start + i · delta` in f32 with `stash_type` 1 (the
        // default), else in the type itself, each operation rounded; the rest exactly, once.
        let stash_f32 = int_attr(attrs, "stash_type").unwrap_or(1) == 1;
        let element = |i: usize| match dtype {
            DType::F16 | DType::BF16 if stash_f32 => f64::from(s as f32 + (i as f32) * (d as f32)),
            DType::F16 | DType::BF16 => {
                let step = dtype.round(dtype.round(i as f64) * d);
                dtype.round(s + step)
            }
            _ => s + i as f64 * d,
        };
        let values: Vec<f64> = (0..count as usize).map(element).collect();
        Tensor::from_values(dtype, &[values.len()], values)
    }
    .ok_or(ImportError::Internal("a Range's values do not fill it"))?;
    Ok(vec![Val::Const(Rc::new(t), Some(out.to_string()))])
}

/// The stride of `picks` when they step by one positive stride (a lone index steps by 1).
fn one_stride(picks: &[i64]) -> Option<i64> {
    let step = match picks {
        [_] => 1,
        [a, b, ..] => b - a,
        [] => return None,
    };
    (step > 0 && picks.windows(2).all(|w| w[1] - w[0] == step)).then_some(step)
}

/// The most constant indices a Gather becomes slices for; more become a `gather`.
const SLICED_GATHER_MAX: usize = 8;

/// A Gather. Of a few constant indices in range (a shape's dimensions, a chunk of a tensor):
/// one `slice` per index, joined by a `concat` and reshaped to the indices' shape, which
/// kernels read as views and constant folding sees through. Of run-time indices (an embedding
/// lookup), many constant ones, or one out of range (which reads the fill, as at run time):
/// the catalogue's `gather`.
fn gather(im: &mut Importer, node: &NodeProto, attrs: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let data = im.required(node, 0)?;
    let indices = im.required(node, 1)?;
    let rank = data.shape().len();
    let axis = crate::shape::normalize_axis(int_attr(attrs, "axis").unwrap_or(0), rank)?;
    let dim = data.shape()[axis] as i64;
    let in_range = |i: i64| {
        let i = if i < 0 { i.saturating_add(dim) } else { i };
        (0..dim).contains(&i).then_some(i)
    };
    let constant = indices
        .constant()
        .filter(|idx| idx.dtype.category() == crate::dtype::Category::Integer)
        .filter(|idx| !idx.is_empty())
        .and_then(|idx| {
            let picks: Option<Vec<i64>> = idx.int_values().into_iter().map(in_range).collect();
            Some((picks?, idx.shape().to_vec()))
        });
    // Indices in a run of one stride (the positions `arange(seq)` of a position embedding)
    // are one strided slice, whatever their number: a model imported at two sequence lengths
    // then fuses alike, and reuses its kernels.
    if let Some((picks, index_shape)) = &constant
        && let Some(step) = one_stride(picks)
    {
        let first = picks[0];
        let end = first + step * (picks.len() as i64 - 1) + 1;
        let run = im.slice(&data, axis, first, end, step, out)?;
        let mut shape: Vec<usize> = data.shape()[..axis].to_vec();
        shape.extend_from_slice(index_shape);
        shape.extend_from_slice(&data.shape()[axis + 1..]);
        return Ok(vec![im.reshape(&run, &shape, out)?]);
    }
    let sliced = constant.filter(|(picks, _)| picks.len() <= SLICED_GATHER_MAX);
    let Some((picks, index_shape)) = sliced else {
        let gather = BuiltinAttrs::Gather { axis: axis as i64 };
        let args = [data, indices];
        return Ok(vec![im.emit_builtin(
            Builtin::Gather,
            &args,
            gather,
            out,
            true,
        )?]);
    };
    let mut parts = Vec::new();
    for i in picks {
        parts.push(im.slice(&data, axis, i, i + 1, 1, out)?);
    }
    let joined = if parts.len() == 1 {
        parts.remove(0)
    } else {
        let concat = BuiltinAttrs::Concat { axis: axis as i64 };
        im.emit_builtin(
            Builtin::Concat,
            &parts,
            concat,
            &format!("{out}.gather"),
            false,
        )?
    };
    let mut shape: Vec<usize> = data.shape()[..axis].to_vec();
    shape.extend_from_slice(&index_shape);
    shape.extend_from_slice(&data.shape()[axis + 1..]);
    Ok(vec![im.reshape(&joined, &shape, out)?])
}

/// A Reshape node with a constant target (a 0 copies the input's dimension unless
/// `allowzero`).
fn reshape(im: &mut Importer, node: &NodeProto, attrs: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let target = im.ints(node, 1, "shape")?;
    let allowzero = int_attr(attrs, "allowzero").unwrap_or(0) != 0;
    let mut dims = Vec::new();
    for (i, &d) in target.iter().enumerate() {
        dims.push(if d == 0 && !allowzero {
            *x.shape().get(i).ok_or_else(|| {
                ImportError::Malformed("a 0 in the shape has no input dimension to copy".into())
            })? as i64
        } else {
            d
        });
    }
    let shape = crate::shape::reshape_target(x.shape(), &dims)?;
    Ok(vec![im.reshape(&x, &shape, out)?])
}

/// A Flatten node: a reshape to two dimensions, split before `axis`.
fn flatten(im: &mut Importer, node: &NodeProto, attrs: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    let axis = int_attr(attrs, "axis").unwrap_or(1);
    let axis = if axis < 0 {
        axis.saturating_add(rank as i64)
    } else {
        axis
    };
    if axis < 0 || axis > rank as i64 {
        return Err(crate::shape::ShapeError::AxisOutOfRange { axis, rank }.into());
    }
    let (a, b) = x.shape().split_at(axis as usize);
    let shape = vec![a.iter().product(), b.iter().product()];
    Ok(vec![im.reshape(&x, &shape, out)?])
}

/// An Expand node with a constant target: a `broadcast_to` (nothing when the shape stays).
fn expand(im: &mut Importer, node: &NodeProto, _: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let target = im.ints(node, 1, "shape")?;
    let target: Vec<usize> = target
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| proto::ProtoError::NegativeDimension(d)))
        .collect::<Result<_, _>>()?;
    let shape = crate::shape::broadcast(x.shape(), &target)?;
    proto::element_count(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
    if shape.as_slice() == x.shape() {
        return Ok(vec![x]);
    }
    let target = BuiltinAttrs::shape(&shape);
    Ok(vec![im.emit_builtin(
        Builtin::BroadcastTo,
        &[x],
        target,
        out,
        true,
    )?])
}

/// A Constant node's value.
fn constant(_: &mut Importer, _: &NodeProto, attrs: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let t = match attrs.iter().next() {
        Some((name, value)) if attrs.len() == 1 => match (name.as_str(), value) {
            ("value", Attr::Tensor(t)) => t.clone(),
            ("value_float", Attr::Float(v)) => Tensor::scalar(DType::F32, *v),
            ("value_int", Attr::Int(v)) => Tensor::scalar(DType::I64, *v as f64),
            ("value_floats", Attr::Floats(v)) => {
                Tensor::from_values(DType::F32, &[v.len()], v.clone())
                    .ok_or(ImportError::Internal("bad floats"))?
            }
            ("value_ints", Attr::Ints(v)) => Tensor::from_values(
                DType::I64,
                &[v.len()],
                v.iter().map(|&i| i as f64).collect(),
            )
            .ok_or(ImportError::Internal("bad ints"))?,
            (name, _) => {
                return Err(ImportError::Unsupported(format!(
                    "attribute `{name}` is not a value fusebox reads"
                )));
            }
        },
        _ => {
            return Err(ImportError::Malformed(
                "a Constant needs exactly one value attribute".into(),
            ));
        }
    };
    Ok(vec![Val::Const(Rc::new(t), Some(out.to_string()))])
}

/// A ConstantOfShape node's value: a folded constant up to [`FOLD_LIMIT`] elements, else
/// a scalar `const` broadcast to the shape at run time (so a 1 KB model cannot make the
/// import allocate gigabytes).
fn constant_of_shape(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let shape = im.ints(node, 0, "shape")?;
    let (dims, count) = proto::element_count(&shape)?;
    let fill = match attrs.get("value") {
        Some(Attr::Tensor(t)) => t.clone(),
        None => Tensor::scalar(DType::F32, 0.0),
        Some(_) => {
            return Err(ImportError::Malformed(
                "attribute `value` must be a tensor".into(),
            ));
        }
    };
    if fill.data.len() != 1 {
        return Err(ImportError::Malformed(
            "attribute `value` must hold one element".into(),
        ));
    }
    if fits_folding(&dims) {
        let t = match fill.int_values().first() {
            Some(&v) if fill.dtype.category() == crate::dtype::Category::Integer => {
                Tensor::from_ints(fill.dtype, &dims, vec![v; count])
            }
            _ => Tensor::from_values(fill.dtype, &dims, vec![fill.values()[0]; count]),
        }
        .ok_or(ImportError::Internal("the shape does not fit"))?;
        return Ok(vec![Val::Const(Rc::new(t), Some(out.to_string()))]);
    }
    // The scalar travels as a `const` node's f64 attribute: an integer beyond 2^53 would
    // lose bits there.
    let v = fill.values()[0];
    if fill.dtype.category() == crate::dtype::Category::Integer && fill.int_values()[0] != v as i64
    {
        return Err(ImportError::Unsupported(format!(
            "the fill value {} of a {count}-element result (more than the {FOLD_LIMIT} fusebox folds at import) is not exact as a run-time constant",
            fill.int_values()[0]
        )));
    }
    let scalar = Val::Const(
        Rc::new(Tensor::scalar(fill.dtype, v)),
        Some(format!("{out}.value")),
    );
    let target = BuiltinAttrs::Shape(shape);
    Ok(vec![im.emit_builtin(
        Builtin::BroadcastTo,
        &[scalar],
        target,
        out,
        true,
    )?])
}

/// A Squeeze or Unsqueeze node: a reshape.
fn squeeze(im: &mut Importer, node: &NodeProto, attrs: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let axes = match im.input(node, 1)? {
        Some(_) => Some(im.ints(node, 1, "axes")?),
        None => ints_attr(attrs, "axes"),
    };
    let rank = x.shape().len();
    let shape: Vec<usize> = if node.op_type == "Squeeze" {
        let axes = match axes {
            Some(axes) => crate::shape::normalize_axes(Some(&axes), rank)?,
            None => (0..rank).filter(|&i| x.shape()[i] == 1).collect(),
        };
        if let Some(&a) = axes.iter().find(|&&a| x.shape()[a] != 1) {
            return Err(ImportError::Malformed(format!(
                "axis {a} has size {}, not 1",
                x.shape()[a]
            )));
        }
        (0..rank)
            .filter(|i| !axes.contains(i))
            .map(|i| x.shape()[i])
            .collect()
    } else {
        let axes = axes.ok_or_else(|| ImportError::Malformed("Unsqueeze needs axes".into()))?;
        let new_rank = rank + axes.len();
        let axes: BTreeSet<usize> = crate::shape::normalize_axes(Some(&axes), new_rank)?
            .into_iter()
            .collect();
        let mut dims = x.shape().iter();
        (0..new_rank)
            .map(|i| {
                if axes.contains(&i) {
                    1
                } else {
                    dims.next().copied().unwrap_or(1)
                }
            })
            .collect()
    };
    Ok(vec![im.reshape(&x, &shape, out)?])
}

/// A Slice node: a `slice` per sliced axis; one of a negative step (`torch.flip` exports as
/// one) a `gather` of the positions it visits.
fn slice(im: &mut Importer, node: &NodeProto, _: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let starts = im.ints(node, 1, "starts")?;
    let ends = im.ints(node, 2, "ends")?;
    let rank = x.shape().len();
    let axes = match im.input(node, 3)? {
        Some(_) => im.ints(node, 3, "axes")?,
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match im.input(node, 4)? {
        Some(_) => im.ints(node, 4, "steps")?,
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(ImportError::Malformed(
            "starts, ends, axes and steps must have one entry per sliced axis".into(),
        ));
    }
    let mut v = x;
    for i in 0..starts.len() {
        let axis = crate::shape::normalize_axis(axes[i], rank)?;
        if steps[i] == 0 {
            return Err(ImportError::Malformed(format!("step 0 on axis {axis}")));
        }
        let dim = v.shape()[axis] as i64;
        if steps[i] < 0 {
            v = backward(im, &v, axis, (starts[i], ends[i], steps[i]), out)?;
            continue;
        }
        let clip = |p: i64| (if p < 0 { p.saturating_add(dim) } else { p }).clamp(0, dim);
        let (s, e) = (clip(starts[i]), clip(ends[i]));
        if s == 0 && e == dim && steps[i] == 1 {
            continue;
        }
        v = im.slice(&v, axis, s, e.max(s), steps[i], out)?;
    }
    Ok(vec![v])
}

/// `x[start:end:step]` along `axis` for a negative `step`, as ONNX bounds it (`start` clamped
/// to `[0, dim - 1]`, `end` to `[-1, dim - 1]`, negatives counted from the end): a `gather` of
/// the positions `start, start + step, …` down to just above `end`.
pub(super) fn backward(
    im: &mut Importer,
    x: &Val,
    axis: usize,
    (start, end, step): (i64, i64, i64),
    out: &str,
) -> Imports {
    let dim = x.shape()[axis] as i64;
    let from_end = |p: i64| if p < 0 { p.saturating_add(dim) } else { p };
    // An empty axis visits nothing (and has no position to clamp `start` to).
    let first = (dim > 0).then(|| from_end(start).clamp(0, dim - 1));
    let last = from_end(end).clamp(-1, (dim - 1).max(-1));
    let positions: Vec<i64> = std::iter::successors(first, |&p| p.checked_add(step))
        .take_while(|&p| p > last)
        .collect();
    let indices = Val::ints(DType::I64, &[positions.len()], positions)?;
    let gather = BuiltinAttrs::Gather { axis: axis as i64 };
    im.emit_builtin(
        Builtin::Gather,
        &[x.clone(), indices],
        gather,
        &format!("{out}.reversed"),
        false,
    )
}

/// A Split node: one `slice` per output.
fn split(im: &mut Importer, node: &NodeProto, attrs: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    let axis = crate::shape::normalize_axis(int_attr(attrs, "axis").unwrap_or(0), rank)?;
    let dim = x.shape()[axis] as i64;
    let n = node.output.len() as i64;
    let sizes = match im.input(node, 1)? {
        Some(_) => im.ints(node, 1, "split")?,
        None => match ints_attr(attrs, "split") {
            Some(s) => s,
            None => {
                let parts = int_attr(attrs, "num_outputs").unwrap_or(n);
                if parts != n || parts < 1 {
                    return Err(ImportError::Malformed(format!(
                        "num_outputs is {parts}, but the node has {n} output(s)"
                    )));
                }
                let chunk = (dim + parts - 1) / parts;
                (0..parts)
                    .map(|p| chunk.min(dim - p * chunk).max(0))
                    .collect()
            }
        },
    };
    if sizes.len() as i64 != n {
        return Err(ImportError::Malformed(format!(
            "{} split sizes for {n} output(s)",
            sizes.len()
        )));
    }
    let total = sizes.iter().try_fold(0i64, |acc, &s| acc.checked_add(s));
    if sizes.iter().any(|&s| s < 0) || total != Some(dim) {
        return Err(ImportError::Malformed(format!(
            "split sizes {sizes:?} do not add up to the dimension {dim}"
        )));
    }
    let mut start = 0;
    let mut outs = Vec::new();
    for (k, &s) in sizes.iter().enumerate() {
        let name = node
            .output
            .get(k)
            .cloned()
            .unwrap_or_else(|| format!("{out}.{k}"));
        outs.push(im.slice(&x, axis, start, start + s, 1, &name)?);
        start += s;
    }
    Ok(outs)
}

impl Importer<'_> {
    /// Input `i`, which must be a constant, as integers (`what` names it in errors).
    pub(super) fn ints(&self, node: &NodeProto, i: usize, what: &str) -> Imports<Vec<i64>> {
        let v = self.required(node, i)?;
        let t = self.demand(&v).ok_or_else(|| {
            ImportError::Unsupported(format!(
                "`{what}` must be a constant (fusebox shapes are static), not a run-time value{}",
                super::GIVE_VALUE
            ))
        })?;
        Ok(t.values().iter().map(|&f| f as i64).collect())
    }

    /// `value` (a scalar, or a slice of size 1 along `axis`) broadcast to the shape `like`
    /// with `size` along `axis`: a slab to join to a value of that shape (padding, a scan's
    /// ones).
    pub(super) fn slab(
        &mut self,
        value: &Val,
        like: &[usize],
        axis: usize,
        size: usize,
        name: &str,
    ) -> Imports {
        let mut shape = like.to_vec();
        shape[axis] = size;
        let dims = shape.iter().map(|&d| d as i64).collect();
        let dims = Val::ints(DType::I64, &[shape.len()], dims)?;
        self.onnx("Expand", &[value, &dims], &[], name)
    }

    /// `x` with `before` and `after` (each optional) joined to it along `axis`.
    pub(super) fn surround(
        &mut self,
        x: &Val,
        axis: usize,
        before: Option<Val>,
        after: Option<Val>,
        name: &str,
    ) -> Imports {
        let parts: Vec<Val> = before.into_iter().chain([x.clone()]).chain(after).collect();
        if parts.len() == 1 {
            return Ok(x.clone());
        }
        let refs: Vec<&Val> = parts.iter().collect();
        self.onnx("Concat", &refs, &[("axis", Attr::Int(axis as i64))], name)
    }

    /// `x` reshaped to `shape` (itself when it has that shape already).
    pub(super) fn reshape(&mut self, x: &Val, shape: &[usize], name: &str) -> Imports {
        if x.shape() == shape {
            return Ok(x.clone());
        }
        let target = BuiltinAttrs::shape(shape);
        self.emit_builtin(
            Builtin::Reshape,
            std::slice::from_ref(x),
            target,
            name,
            true,
        )
    }

    /// `x[start:end:step]` along `axis`.
    pub(super) fn slice(
        &mut self,
        x: &Val,
        axis: usize,
        start: i64,
        end: i64,
        step: i64,
        name: &str,
    ) -> Imports {
        let range = BuiltinAttrs::Slice {
            axis: axis as i64,
            start,
            end: Some(end),
            step,
        };
        let base = format!("{name}.slice");
        self.emit_builtin(Builtin::Slice, std::slice::from_ref(x), range, &base, false)
    }
}

pub(super) fn int_attr(attrs: &Attrs, name: &str) -> Option<i64> {
    match attrs.get(name) {
        Some(Attr::Int(i)) => Some(*i),
        _ => None,
    }
}

pub(super) fn ints_attr(attrs: &Attrs, name: &str) -> Option<Vec<i64>> {
    match attrs.get(name) {
        Some(Attr::Ints(v)) => Some(v.clone()),
        _ => None,
    }
}

pub(super) fn float_attr(attrs: &Attrs, name: &str) -> Option<f64> {
    match attrs.get(name) {
        Some(Attr::Float(v)) => Some(*v),
        _ => None,
    }
}

/// A string attribute, `default` where absent; an attribute of another type is malformed.
pub(super) fn text_attr<'a>(attrs: &'a Attrs, name: &str, default: &'a str) -> Imports<&'a str> {
    match attrs.get(name) {
        None => Ok(default),
        Some(Attr::Str(s)) => Ok(s),
        Some(_) => Err(ImportError::Malformed(format!("{name} must be a string"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry and the rules' list of structural ops (which the op table may not map)
    /// name the same op types, so no structural op falls through to the table unhandled.
    #[test]
    fn every_structural_op_has_one_handler() {
        let names: Vec<&str> = HANDLERS.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, STRUCTURAL);
    }
}
