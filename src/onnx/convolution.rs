//! The ops of convolutional networks, written at import as catalogue ops: `Conv`,
//! `ConvTranspose`, `MaxPool`, `AveragePool`, `GlobalAveragePool`, `GlobalMaxPool` and `Pad`.
//!
//! A window op reads, for each offset `o` of its kernel window, the input shifted by `o` and
//! strided by the stride: a `slice` per spatial axis (start `o·dilation`, step `stride`), a
//! view that no kernel copies. Padding is a `concat` of the input with constant slabs (zeros,
//! or the dtype's lowest value for a maximum), read by ranges.
//!
//! - **Pooling** combines the shifted views pointwise (`max`, or a sum divided by the number
//!   of elements each window counts), so a pool is one fused kernel over its output.
//! - **Conv** stacks the shifted views of every offset as a new axis beside the channels
//!   (the *im2col* matrix, `[N, C·K, P]` for `K` offsets and `P` output positions, written
//!   once by one fused kernel) and multiplies the weight `[M, C·K]` by it: one GEMM (one per
//!   group, batched) whose bias add and whatever pointwise ops follow (a batch norm's scale
//!   and shift, an activation, a residual add) are its epilogue.
//!
//! Every value is exactly what the ONNX definitions give up to rounding: the GEMM adds each
//! window's `C·K` products in its own order, as any convolution does.

use super::normalization::per_channel;
use super::proto::Attr;
use super::structural::{Attrs, float_attr, int_attr, ints_attr, text_attr};
use super::{ImportError, Importer, Imports, Val};
use onnx_protobuf::NodeProto;

/// The most offsets a window may have (`Π kernel`): each is a view and an operand of the
/// im2col `concat` or of the pool's combination, so the graph grows with them (a 1-D window of
/// 1024 imports and optimizes in about half a second on the development machine, one of 4096
/// in 16 s).
pub(crate) const MAX_WINDOW_OFFSETS: usize = 1024;

/// The largest kernel size, stride, dilation or padding accepted on one axis: far beyond any
/// model's, and small enough that the window arithmetic cannot overflow.
const MAX_EXTENT: i64 = 1 << 24;

/// The window of a Conv or pool over `spatial` input sizes: per spatial axis the kernel size,
/// stride, dilation, the padding before and after, and the output size.
struct Window {
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    before: Vec<usize>,
    after: Vec<usize>,
    out: Vec<usize>,
}

/// A per-spatial-axis attribute of `s` positive values (`default` each when absent).
fn per_axis(attrs: &Attrs, name: &str, s: usize, default: usize) -> Imports<Vec<usize>> {
    match ints_attr(attrs, name) {
        None => Ok(vec![default; s]),
        Some(v) if v.len() == s && v.iter().all(|&x| (1..=MAX_EXTENT).contains(&x)) => {
            Ok(v.iter().map(|&x| x as usize).collect())
        }
        Some(v) => Err(ImportError::Malformed(format!(
            "{name} {v:?} must be {s} values from 1 to {MAX_EXTENT}, one per spatial axis"
        ))),
    }
}

/// A window's kernel sizes: each from 1 to `MAX_EXTENT`, at most `MAX_WINDOW_OFFSETS` offsets.
fn check_kernel(kernel: &[usize]) -> Imports<()> {
    let offsets = kernel
        .iter()
        .try_fold(1usize, |n, &k| n.checked_mul(k))
        .filter(|&n| n <= MAX_WINDOW_OFFSETS);
    if offsets.is_none() || kernel.iter().any(|&k| k == 0 || k as i64 > MAX_EXTENT) {
        return Err(ImportError::Unsupported(format!(
            "a window of {kernel:?}: fusebox expands a window into one view per offset, at most {MAX_WINDOW_OFFSETS}"
        )));
    }
    Ok(())
}

impl Window {
    /// The window of a node with `kernel` sizes over the `spatial` input sizes, from its
    /// `strides`, `dilations`, `pads` or `auto_pad`, and `ceil_mode` (pools).
    fn of(attrs: &Attrs, kernel: Vec<usize>, spatial: &[usize]) -> Imports<Window> {
        let s = spatial.len();
        check_kernel(&kernel)?;
        let strides = per_axis(attrs, "strides", s, 1)?;
        let dilations = per_axis(attrs, "dilations", s, 1)?;
        let ceil = int_attr(attrs, "ceil_mode").unwrap_or(0) != 0;
        let span = |i: usize| (kernel[i] - 1) * dilations[i] + 1;
        let auto_pad = text_attr(attrs, "auto_pad", "NOTSET")?;
        let (mut before, mut after) = (vec![0usize; s], vec![0usize; s]);
        match auto_pad {
            "NOTSET" => {
                if let Some(pads) = ints_attr(attrs, "pads") {
                    if pads.len() != 2 * s || pads.iter().any(|&p| !(0..=MAX_EXTENT).contains(&p)) {
                        return Err(ImportError::Malformed(format!(
                            "pads {pads:?} must be {} values from 0 to {MAX_EXTENT}",
                            2 * s
                        )));
                    }
                    for i in 0..s {
                        before[i] = pads[i] as usize;
                        after[i] = pads[s + i] as usize;
                    }
                }
            }
            "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                for i in 0..s {
                    let out = spatial[i].div_ceil(strides[i]);
                    let total =
                        ((out.max(1) - 1) * strides[i] + span(i)).saturating_sub(spatial[i]);
                    let small = total / 2;
                    (before[i], after[i]) = match auto_pad {
                        "SAME_UPPER" => (small, total - small),
                        _ => (total - small, small),
                    };
                }
            }
            other => {
                return Err(ImportError::Malformed(format!(
                    "auto_pad `{other}` is none of NOTSET, VALID, SAME_UPPER, SAME_LOWER"
                )));
            }
        }
        let mut out = Vec::with_capacity(s);
        for i in 0..s {
            let padded = spatial[i] + before[i] + after[i];
            if padded < span(i) {
                return Err(ImportError::Malformed(format!(
                    "a window of {} (kernel {}, dilation {}) does not fit spatial axis {i} of {} padded to {padded}",
                    span(i),
                    kernel[i],
                    dilations[i],
                    spatial[i]
                )));
            }
            let room = padded - span(i);
            let mut o = match ceil {
                true => room.div_ceil(strides[i]) + 1,
                false => room / strides[i] + 1,
            };
            // A last window that would start in the padding after the input is dropped.
            if ceil && (o - 1) * strides[i] >= spatial[i] + before[i] {
                o -= 1;
            }
            out.push(o);
        }
        Ok(Window {
            kernel,
            strides,
            dilations,
            before,
            after,
            out,
        })
    }

    /// Every kernel offset, row-major.
    fn offsets(&self) -> Vec<Vec<usize>> {
        let mut all = vec![Vec::new()];
        for &k in &self.kernel {
            all = all
                .into_iter()
                .flat_map(|o| {
                    (0..k).map(move |i| {
                        let mut o = o.clone();
                        o.push(i);
                        o
                    })
                })
                .collect();
        }
        all
    }

    /// How far past the padded input the last window reaches on axis `i` (ceil mode): the
    /// extra padding that keeps every slice inside it.
    fn overhang(&self, i: usize, spatial: usize) -> usize {
        let reach =
            (self.out[i] - 1) * self.strides[i] + (self.kernel[i] - 1) * self.dilations[i] + 1;
        reach.saturating_sub(spatial + self.before[i] + self.after[i])
    }
}

/// `x` padded on its spatial axes (2 and after) by `window`'s padding (and any overhang) with
/// `fill`: a `concat` with constant slabs, read by ranges.
fn padded(im: &mut Importer, x: &Val, window: &Window, fill: f64, name: &str) -> Imports {
    let value = Val::floats(x.dtype(), &[], vec![fill])?;
    let mut y = x.clone();
    for i in 0..window.kernel.len() {
        let axis = 2 + i;
        let after = window.after[i] + window.overhang(i, x.shape()[axis]);
        let mut sides = [None, None];
        for (side, (what, size)) in [("before", window.before[i]), ("after", after)]
            .into_iter()
            .enumerate()
        {
            if size > 0 {
                let slab_name = format!("{name}.pad{i}.{what}");
                sides[side] = Some(im.slab(&value, y.shape(), axis, size, &slab_name)?);
            }
        }
        let [before, after] = sides;
        y = im.surround(&y, axis, before, after, &format!("{name}.pad{i}"))?;
    }
    Ok(y)
}

/// The padded input `x` read at kernel offset `offset` of every window: a strided slice per
/// spatial axis, of the output's spatial sizes.
fn shifted(im: &mut Importer, x: &Val, window: &Window, offset: &[usize], name: &str) -> Imports {
    let mut y = x.clone();
    for (i, &o) in offset.iter().enumerate() {
        let start = (o * window.dilations[i]) as i64;
        let stride = window.strides[i] as i64;
        let end = start + (window.out[i] as i64 - 1) * stride + 1;
        y = im.slice(&y, 2 + i, start, end, stride, &format!("{name}.a{i}"))?;
    }
    Ok(y)
}

/// The windows of the padded input `x`, `[N, C, k…, out…]`: for kernel offsets that begin
/// with `prefix`, the input shifted by each offset ([`shifted`], with an axis of 1 per kernel
/// axis), stacked one kernel axis at a time. Each `concat` stacks views of one buffer at an
/// even spacing (the dilation along that axis), so a GEMM that multiplies by the windows
/// reads them from `x` itself (`partition::operand_tree`): no im2col matrix is written.
fn windows(
    im: &mut Importer,
    x: &Val,
    window: &Window,
    prefix: &mut Vec<usize>,
    name: &str,
) -> Imports {
    let s = window.kernel.len();
    if prefix.len() == s {
        let v = shifted(im, x, window, prefix, name)?;
        let mut lifted = v.shape().to_vec();
        lifted.splice(2..2, std::iter::repeat_n(1, s));
        return im.reshape(&v, &lifted, &format!("{name}.c"));
    }
    let axis = 2 + prefix.len();
    let mut pieces = Vec::with_capacity(window.kernel[prefix.len()]);
    for o in 0..window.kernel[prefix.len()] {
        prefix.push(o);
        pieces.push(windows(im, x, window, prefix, &format!("{name}.{o}"))?);
        prefix.pop();
    }
    match pieces.len() {
        1 => Ok(pieces.remove(0)),
        _ => {
            let refs: Vec<&Val> = pieces.iter().collect();
            im.onnx("Concat", &refs, &[("axis", Attr::Int(axis as i64))], name)
        }
    }
}

/// The input of a window op: rank 3 or more (`[N, C, spatial…]`).
fn image(im: &Importer, node: &NodeProto, op: &str) -> Imports<Val> {
    let x = im.required(node, 0)?;
    if x.shape().len() < 3 {
        return Err(ImportError::Malformed(format!(
            "{op} needs an input [N, C, spatial…], not {:?}",
            x.shape()
        )));
    }
    Ok(x)
}

/// A pool's `kernel_shape`, which it must have.
fn kernel_shape(attrs: &Attrs, s: usize) -> Imports<Vec<usize>> {
    match ints_attr(attrs, "kernel_shape") {
        Some(k) if k.len() == s && k.iter().all(|&x| (1..=MAX_EXTENT).contains(&x)) => {
            Ok(k.iter().map(|&x| x as usize).collect())
        }
        Some(k) => Err(ImportError::Malformed(format!(
            "kernel_shape {k:?} must be {s} sizes from 1 to {MAX_EXTENT}, one per spatial axis"
        ))),
        None => Err(ImportError::Malformed(
            "a pool needs its kernel_shape".into(),
        )),
    }
}

/// MaxPool (`ceil_mode`, `dilations`, `pads`, `auto_pad`): the maximum of the window's shifted
/// views, the padding the dtype's lowest value. The `Indices` output is refused.
pub(super) fn max_pool(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    if node.output.len() > 1 && !node.output[1].is_empty() {
        return Err(ImportError::Unsupported("MaxPool's Indices output".into()));
    }
    let x = image(im, node, "MaxPool")?;
    let s = x.shape().len() - 2;
    let window = Window::of(attrs, kernel_shape(attrs, s)?, &x.shape()[2..])?;
    let lowest = match x.dtype().int_range() {
        Some((min, _)) => min as f64,
        None => f64::NEG_INFINITY,
    };
    Ok(vec![pooled(im, &x, &window, lowest, "Max", out)?])
}

/// The views of `x` padded with `fill` at every offset of `window`, combined pairwise by the
/// ONNX op `combine` (`Max`, `Add`) in offset order.
fn pooled(
    im: &mut Importer,
    x: &Val,
    window: &Window,
    fill: f64,
    combine: &str,
    out: &str,
) -> Imports {
    let xp = padded(im, x, window, fill, &format!("{out}.x"))?;
    let mut y: Option<Val> = None;
    for (k, offset) in window.offsets().iter().enumerate() {
        let v = shifted(im, &xp, window, offset, &format!("{out}.w{k}"))?;
        y = Some(match y {
            None => v,
            Some(m) => im.onnx(combine, &[&m, &v], &[], &format!("{out}.p{k}"))?,
        });
    }
    y.ok_or(ImportError::Internal("a window without offsets"))
}

/// AveragePool (`count_include_pad`, `ceil_mode`, `dilations`, `pads`, `auto_pad`): the sum of
/// the window's shifted views over zero padding, divided per output position by the number of
/// elements its window counts (the padding too with `count_include_pad`, never the overhang
/// of `ceil_mode`), a constant computed here.
pub(super) fn average_pool(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = image(im, node, "AveragePool")?;
    let s = x.shape().len() - 2;
    let spatial = x.shape()[2..].to_vec();
    let window = Window::of(attrs, kernel_shape(attrs, s)?, &spatial)?;
    let include_pad = int_attr(attrs, "count_include_pad").unwrap_or(0) != 0;
    let sum = pooled(im, &x, &window, 0.0, "Add", out)?;
    // Per output position, the product over the axes of the elements counted along each.
    let counted = |i: usize, o: usize| -> usize {
        (0..window.kernel[i])
            .filter(|&k| {
                let at = o * window.strides[i] + k * window.dilations[i];
                let (lo, hi) = match include_pad {
                    true => (0, spatial[i] + window.before[i] + window.after[i]),
                    false => (window.before[i], window.before[i] + spatial[i]),
                };
                at >= lo && at < hi
            })
            .count()
    };
    let out_dims: Vec<i64> = window.out.iter().map(|&o| o as i64).collect();
    let (_, positions) = super::proto::element_count(&out_dims)?;
    let mut counts = Vec::with_capacity(positions);
    for p in 0..positions {
        let mut rest = p;
        let mut count = 1usize;
        for i in (0..s).rev() {
            count *= counted(i, rest % window.out[i]);
            rest /= window.out[i];
        }
        counts.push(count as f64);
    }
    let counts = Val::floats(x.dtype(), &window.out, counts)?;
    Ok(vec![im.onnx("Div", &[&sum, &counts], &[], out)?])
}

/// GlobalAveragePool and GlobalMaxPool: the mean or maximum over every spatial axis, kept.
fn global_pool(im: &mut Importer, node: &NodeProto, reduce: &str, out: &str) -> Imports<Vec<Val>> {
    let x = image(im, node, reduce)?;
    let axes: Vec<i64> = (2..x.shape().len() as i64).collect();
    let attrs = [("axes", Attr::Ints(axes)), ("keepdims", Attr::Int(1))];
    Ok(vec![im.onnx(reduce, &[&x], &attrs, out)?])
}

pub(super) fn global_average_pool(
    im: &mut Importer,
    node: &NodeProto,
    _: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    global_pool(im, node, "ReduceMean", out)
}

pub(super) fn global_max_pool(
    im: &mut Importer,
    node: &NodeProto,
    _: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    global_pool(im, node, "ReduceMax", out)
}

/// Conv (`group`, `dilations`, `strides`, `pads`, `auto_pad`; any number of spatial axes): the
/// weight `[M, C/g, k…]` read as `[g, M/g, C/g·K]` times the im2col matrix of each group
/// (see the module documentation), plus the bias per output channel.
pub(super) fn conv(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = image(im, node, "Conv")?;
    let w = im.required(node, 1)?;
    let rank = x.shape().len();
    let c = x.shape()[1];
    let m = w.shape().first().copied().unwrap_or(0);
    let g = group(attrs, &[c, m]).map_err(|groups| {
        ImportError::Malformed(format!(
            "group {groups} must divide the {c} input and {m} output channels"
        ))
    })?;
    if w.shape().len() != rank || w.shape()[1] * g != c {
        return Err(ImportError::Malformed(format!(
            "the weight {:?} must be [M, C/group, kernel…] for an input {:?} and group {g}",
            w.shape(),
            x.shape()
        )));
    }
    let kernel = w.shape()[2..].to_vec();
    check_kernel_shape(attrs, &kernel)?;
    let window = Window::of(attrs, kernel, &x.shape()[2..])?;
    convolve(im, node, &x, &w, &window, g, out)
}

/// A conv's `group` attribute (1 where absent), a positive count dividing every one of
/// `channels`; the attribute's value where it is not.
fn group(attrs: &Attrs, channels: &[usize]) -> Result<usize, i64> {
    let groups = int_attr(attrs, "group").unwrap_or(1);
    usize::try_from(groups)
        .ok()
        .filter(|&g| g >= 1 && channels.iter().all(|&n| n % g == 0))
        .ok_or(groups)
}

/// A `kernel_shape` attribute, where given, must be the weight's.
fn check_kernel_shape(attrs: &Attrs, kernel: &[usize]) -> Imports<()> {
    match ints_attr(attrs, "kernel_shape") {
        Some(k) if k.iter().map(|&v| v as usize).ne(kernel.iter().copied()) => Err(
            ImportError::Malformed(format!("kernel_shape {k:?} is not the weight's {kernel:?}")),
        ),
        _ => Ok(()),
    }
}

/// `x` (`[N, C, spatial…]`, not yet padded) convolved with `w` (`[M, C/g, k…]`) over `window`
/// in `g` groups, plus the node's bias (input 2) per output channel where it has one: the
/// windows' stack times the weight, one GEMM (batched over the groups).
fn convolve(
    im: &mut Importer,
    node: &NodeProto,
    x: &Val,
    w: &Val,
    window: &Window,
    g: usize,
    out: &str,
) -> Imports<Vec<Val>> {
    let rank = x.shape().len();
    let (n, c, m) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    let name = |part: &str| format!("{out}.{part}");
    let xp = padded(im, x, window, 0.0, &name("x"))?;
    let k: usize = window.kernel.iter().product();
    let stacked = windows(im, &xp, window, &mut Vec::new(), &name("im2col"))?;
    let p: usize = window.out.iter().product();
    let per_group = c / g * k;
    let product = if g == 1 {
        let cols = im.reshape(&stacked, &[n, per_group, p], &name("cols"))?;
        let weight = im.reshape(w, &[m, per_group], &name("weight"))?;
        im.onnx("MatMul", &[&weight, &cols], &[], &name("product"))?
    } else {
        let cols = im.reshape(&stacked, &[n, g, per_group, p], &name("cols"))?;
        let weight = im.reshape(w, &[g, m / g, per_group], &name("weight"))?;
        im.onnx("MatMul", &[&weight, &cols], &[], &name("product"))?
    };
    let mut shape = vec![n, m];
    shape.extend(&window.out);
    let y = im.reshape(&product, &shape, &name("y"))?;
    match im.input(node, 2)? {
        None => Ok(vec![im.reshape(&y, &shape, out)?]),
        Some(_) => {
            let bias = per_channel(im, node, 2, "bias", m, rank, out)?;
            Ok(vec![im.onnx("Add", &[&y, &bias], &[], out)?])
        }
    }
}

/// ConvTranspose (`group`, `strides`, `dilations`, `pads`, `output_padding`, `output_shape`,
/// `auto_pad`; any number of spatial axes): the convolution that is its adjoint. Each input
/// element lands at `i · stride`, so the input is spread by its strides (`stride − 1` zeros
/// after each element, the last ones dropped) and padded by `(k − 1) · dilation` less the
/// node's padding (negative amounts crop) on each side, `output_padding` more after; it is
/// then convolved at stride 1 and the node's dilation with the weight `[C, M/g, k…]` read
/// per group as `[M, C/g, k…]` (the group's input and output channels swapped) and reversed
/// along every spatial axis. Output sizes follow the ONNX definition: `stride · (in − 1) +
/// output_padding + (k − 1) · dilation + 1 − pads`, with the pads derived from `output_shape`
/// or `auto_pad` where given (the smaller half at the start under `SAME_UPPER`, at the end
/// otherwise).
pub(super) fn conv_transpose(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = image(im, node, "ConvTranspose")?;
    let w = im.required(node, 1)?;
    let rank = x.shape().len();
    let s = rank - 2;
    let c = x.shape()[1];
    let g = group(attrs, &[c]).map_err(|groups| {
        ImportError::Malformed(format!("group {groups} must divide the {c} input channels"))
    })?;
    if w.shape().len() != rank || w.shape()[0] != c {
        return Err(ImportError::Malformed(format!(
            "the weight {:?} must be [C, M/group, kernel…] for an input {:?}",
            w.shape(),
            x.shape()
        )));
    }
    let m = w.shape()[1] * g;
    let kernel = w.shape()[2..].to_vec();
    check_kernel_shape(attrs, &kernel)?;
    check_kernel(&kernel)?;
    let strides = per_axis(attrs, "strides", s, 1)?;
    let dilations = per_axis(attrs, "dilations", s, 1)?;
    let spatial = x.shape()[2..].to_vec();
    if spatial.contains(&0) {
        return Err(ImportError::Unsupported(format!(
            "ConvTranspose of an empty input {:?}",
            x.shape()
        )));
    }
    let extents = |name: &str, count: usize| -> Imports<Option<Vec<i64>>> {
        match ints_attr(attrs, name) {
            None => Ok(None),
            Some(v) if v.len() == count && v.iter().all(|&p| (0..=MAX_EXTENT).contains(&p)) => {
                Ok(Some(v.clone()))
            }
            Some(v) => Err(ImportError::Malformed(format!(
                "{name} {v:?} must be {count} values from 0 to {MAX_EXTENT}"
            ))),
        }
    };
    let output_padding = extents("output_padding", s)?.unwrap_or(vec![0; s]);
    // output_shape may list the batch and channels too; its spatial sizes are the last ones.
    let target = match ints_attr(attrs, "output_shape") {
        Some(v) if v.len() == rank => extents("output_shape", rank)?.map(|v| v[2..].to_vec()),
        _ => extents("output_shape", s)?,
    };
    let span = |i: usize| (kernel[i] as i64 - 1) * dilations[i] as i64 + 1;
    let full: Vec<i64> = (0..s)
        .map(|i| strides[i] as i64 * (spatial[i] as i64 - 1) + output_padding[i] + span(i))
        .collect();
    let auto_pad = text_attr(attrs, "auto_pad", "NOTSET")?;
    let pads = extents("pads", 2 * s)?;
    let natural: Vec<i64> = (0..s)
        .map(|i| spatial[i] as i64 * strides[i] as i64)
        .collect();
    let (before, after) = transposed_padding(auto_pad, pads, target.as_deref(), &full, &natural)?;
    let sizes: Vec<i64> = (0..s).map(|i| full[i] - before[i] - after[i]).collect();
    if sizes.iter().any(|&o| o < 1) || target.as_ref().is_some_and(|t| *t != sizes) {
        return Err(ImportError::Malformed(format!(
            "ConvTranspose's pads {before:?}, {after:?} give the output sizes {sizes:?}{}",
            match &target {
                Some(t) => format!(", not its output_shape {t:?}"),
                None => ", and every size must be at least 1".into(),
            }
        )));
    }
    let name = |part: &str| format!("{out}.{part}");
    // The input spread by the strides, then cut where the node's padding reaches past the
    // kernel's span (the equivalent convolution's negative padding).
    let mut spread = x.clone();
    let (mut conv_before, mut conv_after) = (vec![0usize; s], vec![0usize; s]);
    for i in 0..s {
        let axis = 2 + i;
        spread = spread_axis(im, &spread, axis, strides[i], &name(&format!("spread{i}")))?;
        let length = spread.shape()[axis] as i64;
        let lead = span(i) - 1 - before[i];
        let trail = span(i) - 1 - after[i] + output_padding[i];
        let (start, end) = ((-lead).max(0), length - (-trail).max(0));
        if start >= end {
            return Err(ImportError::Unsupported(format!(
                "ConvTranspose pads {before:?}, {after:?} that crop all of spatial axis {i}"
            )));
        }
        if start > 0 || end < length {
            let cut = name(&format!("crop{i}"));
            spread = im.slice(&spread, axis, start, end, 1, &cut)?;
        }
        (conv_before[i], conv_after[i]) = (lead.max(0) as usize, trail.max(0) as usize);
    }
    // The weight per group with its channel axes swapped, reversed along the kernel axes.
    let mut grouped = vec![g, c / g, m / g];
    grouped.extend(&kernel);
    let wg = im.reshape(&w, &grouped, &name("wg"))?;
    let mut perm: Vec<i64> = vec![0, 2, 1];
    perm.extend((3..rank + 1).map(|a| a as i64));
    let swapped = im.onnx(
        "Transpose",
        &[&wg],
        &[("perm", Attr::Ints(perm))],
        &name("wt"),
    )?;
    let mut flat = vec![m, c / g];
    flat.extend(&kernel);
    let mut weight = im.reshape(&swapped, &flat, &name("wm"))?;
    for (i, &k) in kernel.iter().enumerate() {
        if k > 1 {
            let k = k as i64;
            let part = name(&format!("flip{i}"));
            weight = super::structural::backward(im, &weight, 2 + i, (k - 1, -(k + 1), -1), &part)?;
        }
    }
    let window = Window {
        kernel,
        strides: vec![1; s],
        dilations,
        before: conv_before,
        after: conv_after,
        out: sizes.iter().map(|&o| o as usize).collect(),
    };
    convolve(im, node, &spread, &weight, &window, g, out)
}

/// A ConvTranspose's padding before and after each spatial axis, whose output would be
/// `full` elements unpadded: its `pads` (under `NOTSET`), none (`VALID`), or what gives the
/// `output_shape` (`target`) or, under `SAME_*`, `natural` (input times stride), split with
/// the smaller half first under `SAME_UPPER` and last otherwise (negative where the output
/// is larger).
fn transposed_padding(
    auto_pad: &str,
    pads: Option<Vec<i64>>,
    target: Option<&[i64]>,
    full: &[i64],
    natural: &[i64],
) -> Imports<(Vec<i64>, Vec<i64>)> {
    let s = full.len();
    let (mut before, mut after) = (vec![0i64; s], vec![0i64; s]);
    match (auto_pad, pads) {
        ("NOTSET", Some(pads)) => {
            before.copy_from_slice(&pads[..s]);
            after.copy_from_slice(&pads[s..]);
        }
        ("NOTSET" | "SAME_UPPER" | "SAME_LOWER", _) => {
            for i in 0..s {
                let want = match target {
                    Some(t) => t[i],
                    None if auto_pad == "NOTSET" => full[i],
                    None => natural[i],
                };
                let total = full[i] - want;
                let small = total.div_euclid(2);
                (before[i], after[i]) = match auto_pad {
                    "SAME_UPPER" => (small, total - small),
                    _ => (total - small, small),
                };
            }
        }
        ("VALID", _) => {}
        (other, _) => {
            return Err(ImportError::Malformed(format!(
                "auto_pad `{other}` is none of NOTSET, VALID, SAME_UPPER, SAME_LOWER"
            )));
        }
    }
    Ok((before, after))
}

/// `x` spread along `axis` by `stride`: each element followed by `stride − 1` zeros, the zeros
/// after the last one dropped (a `concat` with a zero slab along a new axis beside it, merged
/// into the axis by a reshape, then sliced).
fn spread_axis(im: &mut Importer, x: &Val, axis: usize, stride: usize, name: &str) -> Imports {
    if stride == 1 {
        return Ok(x.clone());
    }
    let n = x.shape()[axis];
    let mut lifted = x.shape().to_vec();
    lifted.insert(axis + 1, 1);
    let column = im.reshape(x, &lifted, &format!("{name}.lift"))?;
    let zero = Val::floats(x.dtype(), &[], vec![0.0])?;
    let gaps = im.slab(
        &zero,
        &lifted,
        axis + 1,
        stride - 1,
        &format!("{name}.gaps"),
    )?;
    let at = [("axis", Attr::Int(axis as i64 + 1))];
    let joined = im.onnx("Concat", &[&column, &gaps], &at, &format!("{name}.join"))?;
    let mut merged = x.shape().to_vec();
    merged[axis] = n * stride;
    let flat = im.reshape(&joined, &merged, &format!("{name}.merge"))?;
    let end = ((n - 1) * stride + 1) as i64;
    im.slice(&flat, axis, 0, end, 1, name)
}

/// Pad (`constant`, `edge`, `reflect` or `wrap` mode; the pads as an input from opset 11, an
/// attribute before; negative pads crop): per padded axis a `concat` of what comes before the
/// input, the input, and what comes after. A constant is a slab of the value, an edge the
/// first or last slice broadcast, a reflection the slices mirrored around the edge without
/// repeating it (a `gather` of the positions, as a backward `Slice`), a wrap the slices from
/// the other end.
pub(super) fn pad(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    let pads = match (im.input(node, 1)?, ints_attr(attrs, "pads")) {
        (Some(_), _) => im.ints(node, 1, "pads")?,
        (None, Some(p)) => p,
        (None, None) => return Err(ImportError::Malformed("Pad needs its pads".into())),
    };
    let axes: Vec<usize> = match im.input(node, 3)? {
        Some(_) => {
            let axes = im.ints(node, 3, "axes")?;
            crate::shape::normalize_axes(Some(&axes), rank)?
        }
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() || pads.iter().any(|p| p.unsigned_abs() > MAX_EXTENT as u64) {
        return Err(ImportError::Malformed(format!(
            "pads {pads:?} must be {} values of at most {MAX_EXTENT} in size",
            2 * axes.len()
        )));
    }
    let value = match im.input(node, 2)? {
        Some(_) => {
            let v = im.required(node, 2)?;
            let t = im.demand(&v).ok_or_else(|| {
                ImportError::Unsupported("Pad's constant_value must be a constant".into())
            })?;
            t.values().first().copied().unwrap_or(0.0)
        }
        None => float_attr(attrs, "value").unwrap_or(0.0),
    };
    let mode = text_attr(attrs, "mode", "constant")?;
    let mut y = x.clone();
    for (i, &axis) in axes.iter().enumerate() {
        let (before, after) = (pads[i], pads[axes.len() + i]);
        let part = |what: &str| format!("{out}.a{axis}.{what}");
        // Negative pads crop first.
        let n = y.shape()[axis] as i64;
        let (start, end) = (before.min(0).abs(), n - after.min(0).abs());
        if start > 0 || end < n {
            if start > end {
                return Err(ImportError::Malformed(format!(
                    "pads {pads:?} crop more than axis {axis} holds"
                )));
            }
            y = im.slice(&y, axis, start, end, 1, &part("crop"))?;
        }
        let (before, after) = (before.max(0) as usize, after.max(0) as usize);
        if before == 0 && after == 0 {
            continue;
        }
        let n = y.shape()[axis];
        let mut parts = Vec::new();
        for (side, size) in [("before", before), ("after", after)] {
            if size == 0 {
                parts.push(None);
                continue;
            }
            let name = part(side);
            let front = side == "before";
            let piece = match mode {
                "constant" => {
                    let v = Val::floats(x.dtype(), &[], vec![value])?;
                    im.slab(&v, y.shape(), axis, size, &name)?
                }
                "edge" if n > 0 => {
                    let at = if front { 0 } else { n as i64 - 1 };
                    let edge = im.slice(&y, axis, at, at + 1, 1, &format!("{name}.edge"))?;
                    im.slab(&edge, y.shape(), axis, size, &name)?
                }
                "reflect" if size < n => {
                    let (s, size) = (n as i64, size as i64);
                    // The end is exclusive; one before position 0 is written `-(s + 1)`,
                    // since a negative end counts from the end.
                    let end = s - 2 - size;
                    let bounds = match front {
                        true => (size, 0, -1),
                        false => (s - 2, if end < 0 { -(s + 1) } else { end }, -1),
                    };
                    super::structural::backward(im, &y, axis, bounds, &name)?
                }
                "wrap" if size <= n => {
                    let (s, size) = (n as i64, size as i64);
                    match front {
                        true => im.slice(&y, axis, s - size, s, 1, &name)?,
                        false => im.slice(&y, axis, 0, size, 1, &name)?,
                    }
                }
                "edge" | "reflect" | "wrap" => {
                    return Err(ImportError::Malformed(format!(
                        "{mode} padding of {size} on axis {axis} of {n} elements"
                    )));
                }
                other => {
                    return Err(ImportError::Malformed(format!(
                        "mode `{other}` is none of constant, edge, reflect, wrap"
                    )));
                }
            };
            parts.push(Some(piece));
        }
        let mut parts = parts.into_iter();
        let (before, after) = (parts.next().flatten(), parts.next().flatten());
        y = im.surround(&y, axis, before, after, &part("padded"))?;
    }
    Ok(vec![y])
}
