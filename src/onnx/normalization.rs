//! ONNX's normalizations of channels, written at import as catalogue ops:
//! `BatchNormalization` in inference (each channel by its running mean and variance),
//! `InstanceNormalization` (each channel of each sample over its spatial axes) and
//! `GroupNormalization` (each group of channels of each sample, with everything after it).
//! Each is `(x − mean) / sqrt(var + ε)`, then a scale and a shift per channel
//! (per group for GroupNormalization's opset-18 form, whose scale has one value per group).
//! Batch norm's statistics are inputs, so it is pointwise ops that join the kernel (or the
//! GEMM epilogue) before them; the others' mean and variance are row reductions, so each
//! fuses into one row kernel where its set is the innermost axes.

use super::proto::Attr;
use super::structural::{Attrs, int_attr};
use super::{ImportError, Importer, Imports, Val};
use onnx_protobuf::NodeProto;

/// The node's `epsilon` (ONNX's default 1e-5).
pub(super) fn epsilon(attrs: &Attrs) -> Imports<f64> {
    match attrs.get("epsilon") {
        None => Ok(1e-5),
        Some(Attr::Float(e)) => Ok(*e),
        Some(_) => Err(ImportError::Malformed("epsilon must be a float".into())),
    }
}

/// `(x − mean) / sqrt(var + ε)` with the mean and (biased) variance over `axes`, kept.
fn normalized(im: &mut Importer, x: &Val, axes: &[i64], eps: f64, out: &str) -> Imports {
    let name = |part: &str| format!("{out}.{part}");
    let keep = [
        ("axes", Attr::Ints(axes.to_vec())),
        ("keepdims", Attr::Int(1)),
    ];
    let mean = im.onnx("ReduceMean", &[x], &keep, &name("mean"))?;
    let centered = im.onnx("Sub", &[x, &mean], &[], &name("centered"))?;
    let square = im.onnx("Mul", &[&centered, &centered], &[], &name("square"))?;
    let var = im.onnx("ReduceMean", &[&square], &keep, &name("var"))?;
    let eps = Val::floats(x.dtype(), &[], vec![eps])?;
    let var = im.onnx("Add", &[&var, &eps], &[], &name("ve"))?;
    let root = im.onnx("Sqrt", &[&var], &[], &name("root"))?;
    im.onnx("Div", &[&centered, &root], &[], &name("normal"))
}

/// Input `i` of `node` (`what`), which must hold `count` values, one per channel (or group),
/// shaped to broadcast along axis 1 of a rank-`rank` tensor.
pub(super) fn per_channel(
    im: &mut Importer,
    node: &NodeProto,
    i: usize,
    what: &str,
    count: usize,
    rank: usize,
    out: &str,
) -> Imports {
    let v = im.required(node, i)?;
    if v.shape() != [count] {
        return Err(ImportError::Malformed(format!(
            "{what} must be [{count}], not {:?}",
            v.shape()
        )));
    }
    let mut shape = vec![1usize; rank - 1];
    shape[0] = count;
    im.reshape(&v, &shape, &format!("{out}.{what}"))
}

/// `y · scale + bias`, each a vector of `count` values shaped to broadcast along axis 1 of a
/// rank-`rank` tensor.
fn affine(
    im: &mut Importer,
    node: &NodeProto,
    y: &Val,
    count: usize,
    rank: usize,
    out: &str,
) -> Imports {
    let mut values = Vec::new();
    for (i, what) in [(1, "scale"), (2, "bias")] {
        values.push(per_channel(im, node, i, what, count, rank, out)?);
    }
    let scaled = im.onnx("Mul", &[y, &values[0]], &[], &format!("{out}.scaled"))?;
    im.onnx("Add", &[&scaled, &values[1]], &[], out)
}

/// InstanceNormalization: each channel of each sample normalized over its spatial axes, then
/// scaled and shifted per channel.
pub(super) fn instance_norm(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    if rank < 3 {
        return Err(ImportError::Malformed(format!(
            "InstanceNormalization needs [N, C, spatial…], not {:?}",
            x.shape()
        )));
    }
    let axes: Vec<i64> = (2..rank as i64).collect();
    let y = normalized(im, &x, &axes, epsilon(attrs)?, &format!("{out}.n"))?;
    Ok(vec![affine(im, node, &y, x.shape()[1], rank, out)?])
}

/// GroupNormalization (`num_groups`): each sample's channels in `num_groups` groups, each
/// group normalized over its channels and their spatial axes, then scaled and shifted per
/// channel (opset 21: `[C]`) or per group (opset 18: `[num_groups]`).
pub(super) fn group_norm(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let shape = x.shape().to_vec();
    let rank = shape.len();
    let groups = int_attr(attrs, "num_groups").unwrap_or(0);
    let c = shape.get(1).copied().unwrap_or(0);
    let g = usize::try_from(groups)
        .ok()
        .filter(|&g| rank >= 2 && g >= 1 && c % g == 0);
    let Some(g) = g else {
        return Err(ImportError::Malformed(format!(
            "num_groups {groups} must divide the channels of {shape:?}"
        )));
    };
    let rest: usize = shape[2..].iter().product();
    let grouped = im.reshape(&x, &[shape[0], g, c / g * rest], &format!("{out}.grouped"))?;
    let y = normalized(im, &grouped, &[2], epsilon(attrs)?, &format!("{out}.n"))?;
    let scale = im.required(node, 1)?;
    if scale.shape() == [g] && g != c {
        // Opset 18: one scale and shift per group, on the grouped form.
        let y = affine(im, node, &y, g, 3, &format!("{out}.affine"))?;
        return Ok(vec![im.reshape(&y, &shape, out)?]);
    }
    let y = im.reshape(&y, &shape, &format!("{out}.ungrouped"))?;
    Ok(vec![affine(im, node, &y, c, rank, out)?])
}

/// BatchNormalization in inference (`training_mode` 0): per channel `(x − mean) / sqrt(var +
/// ε) · scale + B`. Training mode and the running statistics' outputs are refused.
pub(super) fn batch_norm(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    if int_attr(attrs, "training_mode").unwrap_or(0) != 0
        || node.output.iter().skip(1).any(|o| !o.is_empty())
    {
        return Err(ImportError::Unsupported(
            "BatchNormalization in training mode (its batch statistics and running-statistics outputs)".into(),
        ));
    }
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    if rank < 2 {
        return Err(ImportError::Malformed(format!(
            "BatchNormalization needs [N, C, …], not {:?}",
            x.shape()
        )));
    }
    let channels = x.shape()[1];
    let name = |part: &str| format!("{out}.{part}");
    let mean = per_channel(im, node, 3, "mean", channels, rank, out)?;
    let var = per_channel(im, node, 4, "var", channels, rank, out)?;
    let eps = Val::floats(var.dtype(), &[], vec![epsilon(attrs)?])?;
    let var = im.onnx("Add", &[&var, &eps], &[], &name("ve"))?;
    let root = im.onnx("Sqrt", &[&var], &[], &name("root"))?;
    let centered = im.onnx("Sub", &[&x, &mean], &[], &name("centered"))?;
    let normal = im.onnx("Div", &[&centered, &root], &[], &name("normal"))?;
    Ok(vec![affine(im, node, &normal, channels, rank, out)?])
}
