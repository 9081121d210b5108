//! ONNX `Resize`, written at import as gathers and weighted sums: nearest, linear and cubic
//! interpolation, one resized axis at a time (separable, as ONNX's reference computes it).
//!
//! The output sizes are static, so every output position's source coordinate, its taps (the
//! input positions it reads, clamped to the axis as the definition's edge padding does) and
//! their weights are known at import. An axis is then a `gather` per tap, with a constant
//! index per output position, and for linear (2 taps) and cubic (4) interpolation the taps
//! multiplied by constant weights along the axis and added: pointwise work that fuses with
//! the gathers into one kernel.
//!
//! Supported: `scales` or `sizes` (with `keep_aspect_ratio_policy`), `axes`, every
//! `coordinate_transformation_mode` (`tf_crop_and_resize` with its region of interest and
//! `extrapolation_value`: a position mapped outside the input reads no tap and adds the
//! value), every `nearest_mode`, `cubic_coeff_a`, `exclude_outside` and `antialias`.
//!
//! With `antialias`, a linear or cubic filter is stretched by `1 / scale` when an axis shrinks
//! (`scale < 1`), as ONNX defines it: the triangle (or Keys' cubic) is evaluated at
//! `scale · (i − ratio)` for the taps `i` around the coordinate, which are then `2/scale`
//! (or `4/scale`) wide, and the weights are divided by their sum. Shrinking an axis 4× reads
//! 8 (linear) or 16 (cubic) input positions per output position instead of 2 or 4, each a
//! gather and a multiply-add fused into the same kernel; an axis that would need more than
//! `MAX_TAPS` is refused at the node.

use super::proto::Attr;
use super::structural::{Attrs, float_attr, int_attr, ints_attr, text_attr};
use super::{ImportError, Importer, Imports, Val};
use crate::dtype::DType;
use onnx_protobuf::NodeProto;

/// The largest output size accepted on one resized axis: each of its positions is a
/// constant index and weight per tap, written at import, so it is held to the importer's
/// bound on the constants it computes (`fold::FOLD_LIMIT`); a few bytes of `scales` cannot
/// ask for gigabytes of them.
const MAX_SIZE: f64 = super::fold::FOLD_LIMIT as f64;

/// The most input positions one output position may read on an axis (an antialiased filter
/// shrinking by `scale` reads about `4 / scale` for cubic): each tap is a gather, a multiply
/// and an add in the graph.
const MAX_TAPS: usize = 64;

/// How one resized axis reads its input: per tap, the input position each output position
/// reads and its weight, and per output position whether it lies outside a crop's input
/// (its weights are then 0 and it takes the extrapolation value).
struct Taps {
    index: Vec<Vec<i64>>,
    weight: Vec<Vec<f64>>,
    outside: Vec<bool>,
}

/// The interpolation of one axis.
#[derive(Clone, Copy)]
enum Mode<'a> {
    Nearest(&'a str),
    Linear { antialias: bool },
    Cubic { a: f64, antialias: bool },
}

impl Mode<'_> {
    /// The first tap's offset from the input position just before the coordinate, and the
    /// number of taps, on an axis resized by `scale`: the filter's half-width (1 for linear,
    /// 2 for cubic), stretched by `1 / scale` when an antialiased axis shrinks, as ONNX's
    /// `floor(-support / scale) + 1` and `2 - 2 · first`.
    fn footprint(self, scale: f64) -> (i64, usize) {
        let (support, antialias) = match self {
            Mode::Nearest(_) => return (1, 1),
            Mode::Linear { antialias, .. } => (1.0, antialias),
            Mode::Cubic { antialias, .. } => (2.0, antialias),
        };
        let stretch = if antialias { scale.min(1.0) } else { 1.0 };
        let first = (-support / stretch).floor() as i64 + 1;
        (first, (2 - 2 * first) as usize)
    }

    /// The weights of the taps `first..` for a coordinate `ratio` past the position before it
    /// (in (0, 1]), on an axis resized by `scale`.
    fn weights(self, first: i64, count: usize, ratio: f64, scale: f64) -> Vec<f64> {
        match self {
            Mode::Nearest(_) => vec![1.0],
            Mode::Linear { antialias: false } => vec![1.0 - ratio, ratio],
            Mode::Cubic {
                a,
                antialias: false,
                ..
            } => cubic(ratio, a).to_vec(),
            Mode::Linear { .. } | Mode::Cubic { .. } => {
                let stretch = scale.min(1.0);
                let at = |i: usize| (((first + i as i64) as f64 - ratio) * stretch).abs();
                let w: Vec<f64> = (0..count)
                    .map(|i| match self {
                        Mode::Cubic { a, .. } => keys(at(i), a),
                        _ => (1.0 - at(i)).clamp(0.0, 1.0),
                    })
                    .collect();
                let total: f64 = w.iter().sum();
                w.into_iter().map(|w| w / total).collect()
            }
        }
    }
}

/// Keys' cubic convolution kernel with parameter `a` at distance `x ≥ 0`.
fn keys(x: f64, a: f64) -> f64 {
    if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

/// How one axis maps output positions to input coordinates: ONNX's
/// `coordinate_transformation_mode`, and for `tf_crop_and_resize` the region of interest
/// (start and end, as fractions of the axis) and the value of positions mapped outside it.
#[derive(Clone, Copy)]
struct Transform<'a> {
    mode: &'a str,
    roi: (f64, f64),
    extrapolation: f64,
}

/// The coordinate in the input that output position `x` maps to, for an axis of `input`
/// elements resized to `output` by `scale`, or `None` where `tf_crop_and_resize` maps it
/// outside the input (it takes the extrapolation value). Where the definition speaks of the
/// output's width it means `scale · input`, which differs from the (rounded down) output size
/// when `scales` are given.
fn source(
    t: Transform<'_>,
    x: f64,
    scale: f64,
    input: usize,
    output: usize,
) -> Imports<Option<f64>> {
    let n = input as f64;
    let width = scale * n;
    let (start, end) = t.roi;
    Ok(Some(match t.mode {
        "half_pixel" => (x + 0.5) / scale - 0.5,
        "pytorch_half_pixel" if width == 1.0 => -0.5,
        "pytorch_half_pixel" => (x + 0.5) / scale - 0.5,
        "align_corners" if width == 1.0 => 0.0,
        "align_corners" => x * (n - 1.0) / (width - 1.0),
        "asymmetric" => x / scale,
        "tf_half_pixel_for_nn" => (x + 0.5) / scale,
        "half_pixel_symmetric" => {
            let adjustment = output as f64 / width;
            let offset = n / 2.0 * (1.0 - adjustment);
            offset + (x + 0.5) / scale - 0.5
        }
        "tf_crop_and_resize" => {
            let at = match width == 1.0 {
                true => (end - start) * (n - 1.0) / 2.0,
                false => x * (end - start) * (n - 1.0) / (width - 1.0),
            } + start * (n - 1.0);
            if at < 0.0 || at > n - 1.0 {
                return Ok(None);
            }
            at
        }
        other => {
            return Err(ImportError::Malformed(format!(
                "coordinate_transformation_mode `{other}` is not one ONNX defines"
            )));
        }
    }))
}

/// The cubic convolution weights of the four taps around a coordinate `ratio` past the
/// second one (Keys' kernel with parameter `a`).
fn cubic(ratio: f64, a: f64) -> [f64; 4] {
    let near = |t: f64| ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
    let far = |t: f64| ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a;
    [
        far(ratio + 1.0),
        near(ratio),
        near(1.0 - ratio),
        far(2.0 - ratio),
    ]
}

/// The taps of an axis of `input` elements resized to `output` by `scale`.
fn taps(
    mode: Mode<'_>,
    transform: Transform<'_>,
    scale: f64,
    input: usize,
    output: usize,
    exclude_outside: bool,
) -> Imports<Taps> {
    let last = input as i64 - 1;
    let (first, n) = mode.footprint(scale);
    if n > MAX_TAPS {
        return Err(ImportError::Unsupported(format!(
            "Resize with antialias by {scale}: {n} input positions per output position, more \
             than {MAX_TAPS}"
        )));
    }
    let mut index = vec![Vec::with_capacity(output); n];
    let mut weight = vec![Vec::with_capacity(output); n];
    let mut outside = Vec::with_capacity(output);
    for x in 0..output {
        let Some(at) = source(transform, x as f64, scale, input, output)? else {
            index.iter_mut().for_each(|i| i.push(0));
            weight.iter_mut().for_each(|w| w.push(0.0));
            outside.push(true);
            continue;
        };
        // The tap before the coordinate and how far past it the coordinate lies, in (0, 1]:
        // a coordinate on a position counts as a whole step past the one before.
        let below = at.floor();
        let (base, ratio) = match at == below {
            true => (below as i64 - 1, 1.0),
            false => (below as i64, at - below),
        };
        let positions: Vec<i64> = match mode {
            Mode::Nearest(rounding) => {
                let up = match rounding {
                    "round_prefer_floor" => ratio > 0.5,
                    "round_prefer_ceil" => ratio >= 0.5,
                    "floor" => ratio == 1.0,
                    "ceil" => true,
                    other => {
                        return Err(ImportError::Malformed(format!(
                            "nearest_mode `{other}` is not one ONNX defines"
                        )));
                    }
                };
                vec![base + i64::from(up)]
            }
            _ => (0..n as i64).map(|i| base + first + i).collect(),
        };
        let mut w = mode.weights(first, n, ratio, scale);
        if exclude_outside {
            // Taps outside the axis weigh nothing and the rest are scaled to sum to 1 (a
            // position with no tap inside keeps its zeros, as ONNX's reference does).
            for (p, w) in positions.iter().zip(w.iter_mut()) {
                if !(0..=last).contains(p) {
                    *w = 0.0;
                }
            }
            let total: f64 = w.iter().sum();
            if total != 0.0 {
                w.iter_mut().for_each(|w| *w /= total);
            }
        }
        for t in 0..n {
            index[t].push(positions[t].clamp(0, last));
            weight[t].push(w[t]);
        }
        outside.push(false);
    }
    Ok(Taps {
        index,
        weight,
        outside,
    })
}

/// `x` resized along `axis` to `output` elements by `scale`.
#[allow(clippy::too_many_arguments)]
fn resize_axis(
    im: &mut Importer,
    x: &Val,
    axis: usize,
    scale: f64,
    output: usize,
    mode: Mode<'_>,
    transform: Transform<'_>,
    name: &str,
    exclude_outside: bool,
) -> Imports {
    let input = x.shape()[axis];
    let taps = taps(mode, transform, scale, input, output, exclude_outside)?;
    let count = taps.index.len();
    let at = [("axis", Attr::Int(axis as i64))];
    // A constant along the axis, broadcast over the others.
    let mut along = vec![1; x.shape().len()];
    along[axis] = output;
    let cropped = taps.outside.contains(&true);
    let mut sum: Option<Val> = None;
    for t in 0..count {
        let indices = Val::ints(DType::I64, &[output], taps.index[t].clone())?;
        let read = im.onnx("Gather", &[x, &indices], &at, &format!("{name}.t{t}"))?;
        let term = match mode {
            Mode::Nearest(_) if !cropped => read,
            _ => {
                let w = Val::floats(x.dtype(), &along, taps.weight[t].clone())?;
                im.onnx("Mul", &[&read, &w], &[], &format!("{name}.w{t}"))?
            }
        };
        sum = Some(match sum {
            None => term,
            Some(s) => im.onnx("Add", &[&s, &term], &[], &format!("{name}.s{t}"))?,
        });
    }
    let sum = sum.ok_or_else(|| ImportError::Malformed("Resize with no taps".into()))?;
    match cropped {
        false => Ok(sum),
        true => {
            let outside = taps.outside.iter();
            let c = outside.map(|&o| if o { transform.extrapolation } else { 0.0 });
            let c = Val::floats(x.dtype(), &along, c.collect())?;
            im.onnx("Add", &[&sum, &c], &[], &format!("{name}.outside"))
        }
    }
}

/// A constant float input of `count` values, or `None` where the input is absent or empty.
fn constant_floats(
    im: &Importer,
    node: &NodeProto,
    i: usize,
    what: &str,
) -> Imports<Option<Vec<f64>>> {
    let Some(v) = im.input(node, i)? else {
        return Ok(None);
    };
    let t = im.demand(&v).ok_or_else(|| {
        ImportError::Unsupported(format!(
            "Resize's `{what}` must be a constant (fusebox shapes are static)"
        ))
    })?;
    let values = t.values();
    Ok((!values.is_empty()).then_some(values))
}

/// Resize (opset 13 on): see the module documentation.
pub(super) fn resize(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    let transform = text_attr(attrs, "coordinate_transformation_mode", "half_pixel")?;
    let policy = text_attr(attrs, "keep_aspect_ratio_policy", "stretch")?;
    let antialias = int_attr(attrs, "antialias").unwrap_or(0) != 0;
    let exclude_outside = int_attr(attrs, "exclude_outside").unwrap_or(0) != 0;
    let mode = match text_attr(attrs, "mode", "nearest")? {
        "nearest" => Mode::Nearest(text_attr(attrs, "nearest_mode", "round_prefer_floor")?),
        "linear" => Mode::Linear { antialias },
        "cubic" => Mode::Cubic {
            a: float_attr(attrs, "cubic_coeff_a").unwrap_or(-0.75),
            antialias,
        },
        other => {
            return Err(ImportError::Malformed(format!(
                "mode `{other}` is none of nearest, linear, cubic"
            )));
        }
    };
    if !x.dtype().is_float() {
        return Err(ImportError::Unsupported(format!(
            "Resize of {} values (fusebox resizes floats)",
            x.dtype()
        )));
    }
    // In the order given: `scales` and `sizes` follow it.
    let axes: Vec<usize> = match ints_attr(attrs, "axes") {
        Some(a) => {
            let mut axes = Vec::with_capacity(a.len());
            for &v in &a {
                let axis = if v < 0 { v + rank as i64 } else { v };
                match usize::try_from(axis) {
                    Ok(axis) if axis < rank && !axes.contains(&axis) => axes.push(axis),
                    _ => {
                        return Err(ImportError::Malformed(format!(
                            "axes {a:?} must be distinct axes of a rank-{rank} input"
                        )));
                    }
                }
            }
            axes
        }
        None => (0..rank).collect(),
    };
    let inputs: Vec<f64> = axes.iter().map(|&a| x.shape()[a] as f64).collect();
    let (scales, sizes): (Vec<f64>, Vec<f64>) = match (
        constant_floats(im, node, 3, "sizes")?,
        constant_floats(im, node, 2, "scales")?,
    ) {
        (Some(sizes), _) if sizes.len() == axes.len() => {
            let mut scales: Vec<f64> = sizes.iter().zip(&inputs).map(|(s, n)| s / n).collect();
            let sizes = match policy {
                "stretch" => sizes,
                "not_larger" | "not_smaller" => {
                    let pick = scales.iter().copied();
                    let scale = match policy {
                        "not_larger" => pick.fold(f64::INFINITY, f64::min),
                        _ => pick.fold(f64::NEG_INFINITY, f64::max),
                    };
                    scales = vec![scale; axes.len()];
                    inputs.iter().map(|n| (scale * n + 0.5).floor()).collect()
                }
                other => {
                    return Err(ImportError::Malformed(format!(
                        "keep_aspect_ratio_policy `{other}` is none of stretch, not_larger, not_smaller"
                    )));
                }
            };
            (scales, sizes)
        }
        (None, Some(scales)) if scales.len() == axes.len() => {
            let sizes = scales
                .iter()
                .zip(&inputs)
                .map(|(s, n)| (s * n).floor())
                .collect();
            (scales, sizes)
        }
        _ => {
            return Err(ImportError::Malformed(format!(
                "Resize needs {} scales or sizes (one per resized axis)",
                axes.len()
            )));
        }
    };
    // The region of interest (a crop's; starts, then ends, per resized axis).
    let roi = match transform {
        "tf_crop_and_resize" => match constant_floats(im, node, 1, "roi")? {
            Some(r) if r.len() == 2 * axes.len() && r.iter().all(|v| v.is_finite()) => r,
            Some(r) if r.len() == 2 * rank && r.iter().all(|v| v.is_finite()) => {
                let (starts, ends) = r.split_at(rank);
                let pick = |v: &[f64]| axes.iter().map(|&a| v[a]).collect::<Vec<f64>>();
                [pick(starts), pick(ends)].concat()
            }
            _ => {
                return Err(ImportError::Malformed(format!(
                    "tf_crop_and_resize needs a roi of {} finite values (starts, then ends)",
                    2 * axes.len()
                )));
            }
        },
        _ => [vec![0.0; axes.len()], vec![1.0; axes.len()]].concat(),
    };
    let extrapolation = float_attr(attrs, "extrapolation_value").unwrap_or(0.0);
    let mut y = x.clone();
    for (i, &axis) in axes.iter().enumerate() {
        let (scale, size) = (scales[i], sizes[i]);
        let t = Transform {
            mode: transform,
            roi: (roi[i], roi[axes.len() + i]),
            extrapolation,
        };
        if !(scale.is_finite() && scale > 0.0 && (1.0..=MAX_SIZE).contains(&size)) {
            return Err(ImportError::Malformed(format!(
                "Resize of axis {axis} by {scale} to {size}: the scale must be positive and the size from 1 to {MAX_SIZE}"
            )));
        }
        let size = size as usize;
        if size == x.shape()[axis] && scale == 1.0 && t.roi == (0.0, 1.0) {
            continue;
        }
        let name = format!("{out}.a{axis}");
        y = resize_axis(im, &y, axis, scale, size, mode, t, &name, exclude_outside)?;
    }
    let shape = y.shape().to_vec();
    Ok(vec![im.reshape(&y, &shape, out)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF_PIXEL: Transform<'static> = Transform {
        mode: "half_pixel",
        roi: (0.0, 1.0),
        extrapolation: 0.0,
    };

    #[test]
    fn antialiasing_stretches_the_filter_only_when_an_axis_shrinks() {
        let linear = Mode::Linear { antialias: true };
        let cubic = Mode::Cubic {
            a: -0.75,
            antialias: true,
        };
        assert_eq!(linear.footprint(0.3), (-3, 8));
        assert_eq!(cubic.footprint(0.3), (-6, 14));
        assert_eq!(linear.footprint(2.0), (0, 2));
        assert_eq!(cubic.footprint(1.0), (-1, 4));
        // Growing, the antialiased filter is the plain one (its weights already sum to 1).
        for ratio in [0.25, 0.5, 1.0] {
            let plain = Mode::Cubic {
                a: -0.75,
                antialias: false,
            };
            let (a, b) = (
                cubic.weights(-1, 4, ratio, 1.5),
                plain.weights(-1, 4, ratio, 1.5),
            );
            assert!(
                a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-12),
                "{a:?} {b:?}"
            );
        }
        // Shrinking to a half: a triangle twice as wide, sampled at the taps, normalized.
        let w = linear.weights(-1, 4, 0.5, 0.5);
        assert_eq!(w, vec![0.125, 0.375, 0.375, 0.125]);
    }

    #[test]
    fn every_position_of_a_shrunk_axis_reads_weights_summing_to_one() {
        for mode in [
            Mode::Linear { antialias: true },
            Mode::Cubic {
                a: -0.5,
                antialias: true,
            },
        ] {
            for exclude_outside in [false, true] {
                let t = taps(mode, HALF_PIXEL, 0.35, 17, 5, exclude_outside).unwrap();
                for x in 0..5 {
                    let total: f64 = t.weight.iter().map(|w| w[x]).sum();
                    assert!((total - 1.0).abs() < 1e-12, "position {x}: {total}");
                    assert!(t.index.iter().all(|i| (0..17).contains(&i[x])));
                }
            }
        }
    }

    #[test]
    fn a_filter_wider_than_the_tap_limit_is_refused() {
        let cubic = Mode::Cubic {
            a: -0.75,
            antialias: true,
        };
        let Err(e) = taps(cubic, HALF_PIXEL, 0.01, 1000, 10, false) else {
            panic!("a 400-tap filter was accepted");
        };
        assert!(e.to_string().contains("more than 64"), "{e}");
    }
}
