//! ONNX ops that multiply along an axis: `ReduceProd`, `CumProd`, and the `mul` reduction of
//! `ScatterElements` and `ScatterND`.
//!
//! The catalogue has no product reduction: its reductions are sums and maxima, which every
//! backend accumulates its own way (f32 partial sums, atomics on CUDA). A product along an axis
//! is written instead as pointwise products of slices of it: the first half of the axis
//! times the second, again and again, an odd element carried to the next level, so `n`
//! elements take `⌈log2 n⌉` levels of `Mul`, each a view pair the fused kernel reads in place.
//! A cumulative product is the same idea as a scan: at level `s = 1, 2, 4, …` each element
//! is multiplied by the one `s` before it (by 1 where there is none).
//!
//! For integers this is exact: multiplication that wraps is associative and commutative, so
//! any order gives ONNX's value. A float product is rounded to its dtype after each `Mul`, in
//! the tree's order rather than left to right; ONNX fixes no order, and both are within the
//! product's rounding of the exact value. Bool has no product and is refused.

use super::pairwise::one_int;
use super::proto::Attr;
use super::structural::{Attrs, int_attr};
use super::{ImportError, Importer, Imports, Val};
use crate::dtype::{Category, DType};
use onnx_protobuf::NodeProto;

/// `1` of `dtype`, a scalar constant.
pub(super) fn one(dtype: DType) -> Imports {
    match dtype.category() {
        Category::Float => Val::floats(dtype, &[], vec![1.0]),
        _ => Val::ints(dtype, &[], vec![1]),
    }
}

/// Refuses bool operands, which have no product.
fn numeric(x: &Val, op: &str) -> Imports<()> {
    match x.dtype().category() {
        Category::Bool => Err(ImportError::Unsupported(format!("{op} of bool values"))),
        _ => Ok(()),
    }
}

/// The product of `x` along `axis`, kept as an axis of size 1 (see the module documentation);
/// the product of nothing is 1.
pub(super) fn product_along(im: &mut Importer, x: &Val, axis: usize, name: &str) -> Imports {
    let mut n = x.shape()[axis];
    if n == 0 {
        // The sum of nothing is 0, of x's dtype and shape with the axis kept: add 1.
        let keep = [
            ("axes", Attr::Ints(vec![axis as i64])),
            ("keepdims", Attr::Int(1)),
        ];
        let zero = im.onnx("ReduceSum", &[x], &keep, &format!("{name}.empty"))?;
        return im.onnx("Add", &[&zero, &one(x.dtype())?], &[], name);
    }
    let mut y = x.clone();
    let mut level = 0;
    while n > 1 {
        let part = |what: &str| format!("{name}.l{level}.{what}");
        let half = n / 2;
        let h = half as i64;
        let first = im.slice(&y, axis, 0, h, 1, &part("a"))?;
        let second = im.slice(&y, axis, h, 2 * h, 1, &part("b"))?;
        let product = im.onnx("Mul", &[&first, &second], &[], &part("ab"))?;
        y = if n % 2 == 1 {
            let odd = im.slice(&y, axis, 2 * h, n as i64, 1, &part("odd"))?;
            let at = [("axis", Attr::Int(axis as i64))];
            im.onnx("Concat", &[&product, &odd], &at, &part("next"))?
        } else {
            product
        };
        n = half + n % 2;
        level += 1;
    }
    Ok(y)
}

/// ReduceProd over `axes` (the `axes` input from opset 18, the attribute before; every axis
/// when none are given, or none with `noop_with_empty_axes`), keeping them as size 1 with
/// `keepdims` (the default).
pub(super) fn reduce_prod(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    numeric(&x, "ReduceProd")?;
    let rank = x.shape().len();
    let axes = match (im.input(node, 1)?, attrs.get("axes")) {
        (Some(_), _) => im.ints(node, 1, "axes")?,
        (None, Some(Attr::Ints(axes))) => axes.clone(),
        (None, Some(_)) => return Err(ImportError::Malformed("axes must be integers".into())),
        (None, None) => Vec::new(),
    };
    let keepdims = int_attr(attrs, "keepdims").unwrap_or(1) != 0;
    let axes = match (axes.is_empty(), int_attr(attrs, "noop_with_empty_axes")) {
        (true, Some(noop)) if noop != 0 => return Ok(vec![x]),
        (true, _) => (0..rank).collect(),
        (false, _) => crate::shape::normalize_axes(Some(&axes), rank)?,
    };
    let mut y = x.clone();
    for &axis in &axes {
        y = product_along(im, &y, axis, &format!("{out}.axis{axis}"))?;
    }
    let kept: Vec<usize> = (0..rank)
        .filter(|d| keepdims || !axes.contains(d))
        .map(|d| y.shape()[d])
        .collect();
    Ok(vec![im.reshape(&y, &kept, out)?])
}

/// CumProd along the constant `axis` (input 1), inclusive or `exclusive`, forward or
/// `reverse`, as a scan of `⌈log2 n⌉` levels (see the module documentation).
pub(super) fn cum_prod(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    numeric(&x, "CumProd")?;
    let rank = x.shape().len();
    let axis = crate::shape::normalize_axis(one_int(im, node, 1, "axis")?, rank)?;
    let exclusive = int_attr(attrs, "exclusive").unwrap_or(0) != 0;
    let reverse = int_attr(attrs, "reverse").unwrap_or(0) != 0;
    let n = x.shape()[axis] as i64;
    // `y` shifted by `s` along the axis towards its end (its start with `reverse`), 1 where
    // nothing is shifted in.
    let shifted = |im: &mut Importer, y: &Val, s: i64, name: &str| -> Imports {
        let ones = im.slab(
            &one(y.dtype())?,
            y.shape(),
            axis,
            s as usize,
            &format!("{name}.ones"),
        )?;
        match reverse {
            false => {
                let kept = im.slice(y, axis, 0, n - s, 1, &format!("{name}.kept"))?;
                im.surround(&kept, axis, Some(ones), None, name)
            }
            true => {
                let kept = im.slice(y, axis, s, n, 1, &format!("{name}.kept"))?;
                im.surround(&kept, axis, None, Some(ones), name)
            }
        }
    };
    let mut y = x.clone();
    let mut s = 1;
    while s < n {
        let before = shifted(im, &y, s, &format!("{out}.s{s}"))?;
        y = im.onnx("Mul", &[&y, &before], &[], &format!("{out}.p{s}"))?;
        s *= 2;
    }
    if exclusive && n > 0 {
        y = shifted(im, &y, 1, &format!("{out}.exclusive"))?;
    }
    Ok(vec![im.reshape(&y, x.shape(), out)?])
}
