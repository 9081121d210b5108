//! ONNX ops that relate every pair of positions along one axis: `TopK`, `CumSum`,
//! `ScatterElements` and `ScatterND` (a ScatterElements over rows).
//!
//! Each is written as ONNX ops the op table imports over a pairwise view of its operands: the
//! operand reshaped to put a size-1 axis beside `axis`, so that comparing it with itself (or
//! with the positions `0..n`) broadcasts to an `[…, n, n, …]` block whose second axis a
//! reduction then folds away. Fused, the block is never stored: each output element is a
//! reduction over one row of it. The work is quadratic in the axis, which is what these ops
//! meet in models (a mixture-of-experts gate picks the top 2 of 8 experts; a cumulative sum
//! runs along a sequence); an axis so long that the block has more than 2^28 elements per
//! operand row set is refused by the shape rules at the node.
//!
//! - **TopK**: the rank of each element is the number of elements that come before it (larger,
//!   or smallest first with `largest = 0`; equal ones by position, so ties keep the lower index
//!   first as the specification asks; NaN counts as larger than every number, as in PyTorch).
//!   Output position `j` is the element of rank `j`; its value is a `GatherElements` of it.
//! - **CumSum**: each output sums the inputs at the positions a mask admits (up to and
//!   including its own; `exclusive` leaves its own out, `reverse` runs from the end).
//! - **ScatterElements**: each position of `data` along the axis collects the updates whose
//!   index names it: the last one in index order (`reduction = none`), their maximum (`max`)
//!   or minimum (`min`), or their product (`mul`, folded by `products`); a position no index
//!   names keeps its value. Their sum (`add`) is not pairwise: it is the catalogue's
//!   `scatter_add`, whose kernel adds each update once.

use super::proto::Attr;
use super::selection::{as_int64, from_the_end, positions};
use super::structural::{Attrs, int_attr, text_attr};
use super::{ImportError, Importer, Imports, Val};
use crate::dtype::{Category, DType};
use crate::rules::{Builtin, BuiltinAttrs};
use onnx_protobuf::NodeProto;

/// ONNX's code for int64, the type of the positions and ranks.
const INT64: i64 = 7;

/// `x` with a size-1 axis inserted at `at`.
fn lift(im: &mut Importer, x: &Val, at: usize, name: &str) -> Imports {
    let mut shape = x.shape().to_vec();
    shape.insert(at, 1);
    im.reshape(x, &shape, name)
}

/// The attributes of a reduction over `axis` that drops it.
fn over(axis: usize) -> [(&'static str, Attr); 2] {
    [
        ("axes", Attr::Ints(vec![axis as i64])),
        ("keepdims", Attr::Int(0)),
    ]
}

/// The lowest value of `dtype` (`low`) or the highest: -inf and +inf for floats.
fn far_end(dtype: DType, low: bool) -> Imports {
    match (dtype.int_range(), low) {
        (Some((min, _)), true) => Val::ints(dtype, &[], vec![min]),
        (Some((_, max)), false) => Val::ints(dtype, &[], vec![max]),
        (None, true) => Val::floats(dtype, &[], vec![f64::NEG_INFINITY]),
        (None, false) => Val::floats(dtype, &[], vec![f64::INFINITY]),
    }
}

/// A scatter's `reduction` attribute (`none` by default); only `none` for bool data, which
/// has no sum or order to combine by.
fn reduction(attrs: &Attrs, dtype: DType) -> Imports<String> {
    let reduction = text_attr(attrs, "reduction", "none")?.to_string();
    if dtype.category() == Category::Bool && reduction != "none" {
        return Err(ImportError::Unsupported(format!(
            "reduction `{reduction}` of bool data"
        )));
    }
    Ok(reduction)
}

/// The one value of input `i`, a constant (`what` names it in errors).
pub(super) fn one_int(im: &Importer, node: &NodeProto, i: usize, what: &str) -> Imports<i64> {
    match im.ints(node, i, what)?[..] {
        [v] => Ok(v),
        ref other => Err(ImportError::Malformed(format!(
            "`{what}` must hold one value, not {}",
            other.len()
        ))),
    }
}

/// TopK: the `k` largest (or smallest) elements along `axis` and their positions, sorted,
/// ties by position.
pub(super) fn top_k(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let k = one_int(im, node, 1, "k")?;
    let rank = x.shape().len();
    let axis = crate::shape::normalize_axis(int_attr(attrs, "axis").unwrap_or(-1), rank)?;
    let largest = int_attr(attrs, "largest").unwrap_or(1) != 0;
    let n = x.shape()[axis];
    let k = usize::try_from(k).ok().filter(|&k| k <= n).ok_or_else(|| {
        ImportError::Malformed(format!("k = {k} is not between 0 and the axis' {n}"))
    })?;
    // Element i (along `axis`) against element m (along `axis + 1`).
    let xi = lift(im, &x, axis + 1, &format!("{out}.i"))?;
    let xm = lift(im, &x, axis, &format!("{out}.m"))?;
    let (pi, pm) = (
        positions(n, axis, rank + 1)?,
        positions(n, axis + 1, rank + 1)?,
    );
    let name = |part: &str| format!("{out}.{part}");
    let order = if largest { "Greater" } else { "Less" };
    let mut before = im.onnx(order, &[&xm, &xi], &[], &name("before"))?;
    let mut equal = im.onnx("Equal", &[&xm, &xi], &[], &name("equal"))?;
    if x.dtype().is_float() {
        // NaN is larger than every number: first when largest, last when smallest.
        let nan = |im: &mut Importer, v: &Val, part: &str| -> Imports {
            let same = im.onnx("Equal", &[v, v], &[], &name(part))?;
            im.onnx("Not", &[&same], &[], &name(part))
        };
        let (nan_m, nan_i) = (nan(im, &xm, "nan_m")?, nan(im, &xi, "nan_i")?);
        let (first, second) = if largest {
            (&nan_m, &nan_i)
        } else {
            (&nan_i, &nan_m)
        };
        let not_second = im.onnx("Not", &[second], &[], &name("numbered"))?;
        let nan_first = im.onnx("And", &[first, &not_second], &[], &name("nan_first"))?;
        before = im.onnx("Or", &[&before, &nan_first], &[], &name("before"))?;
        let both_nan = im.onnx("And", &[&nan_m, &nan_i], &[], &name("both_nan"))?;
        equal = im.onnx("Or", &[&equal, &both_nan], &[], &name("equal"))?;
    }
    let earlier = im.onnx("Less", &[&pm, &pi], &[], &name("earlier"))?;
    let tie = im.onnx("And", &[&equal, &earlier], &[], &name("tie"))?;
    let ahead = im.onnx("Or", &[&before, &tie], &[], &name("ahead"))?;
    let to_int = [("to", Attr::Int(INT64))];
    let ahead = im.onnx("Cast", &[&ahead], &to_int, &name("ahead"))?;
    let ranks = im.onnx("ReduceSum", &[&ahead], &over(axis + 1), &name("rank"))?;
    // Output position j (along `axis`) takes the element i (along `axis + 1`) of rank j: the
    // ranks are a permutation of 0..n, so exactly one matches.
    let ranks = lift(im, &ranks, axis, &name("rank"))?;
    let (slot, element) = (
        positions(k, axis, rank + 1)?,
        positions(n, axis + 1, rank + 1)?,
    );
    let holds = im.onnx("Equal", &[&ranks, &slot], &[], &name("holds"))?;
    let zero = Val::ints(DType::I64, &[], vec![0])?;
    let picked = im.onnx("Where", &[&holds, &element, &zero], &[], &name("picked"))?;
    let indices = im.onnx("ReduceSum", &[&picked], &over(axis + 1), &name("indices"))?;
    let at = [("axis", Attr::Int(axis as i64))];
    let values = im.onnx("GatherElements", &[&x, &indices], &at, out)?;
    Ok(vec![values, indices])
}

/// CumSum along the constant `axis` (input 1), inclusive or `exclusive`, forward or `reverse`.
pub(super) fn cum_sum(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    let axis = crate::shape::normalize_axis(one_int(im, node, 1, "axis")?, rank)?;
    let exclusive = int_attr(attrs, "exclusive").unwrap_or(0) != 0;
    let reverse = int_attr(attrs, "reverse").unwrap_or(0) != 0;
    let n = x.shape()[axis];
    let name = |part: &str| format!("{out}.{part}");
    // Output i (along `axis`) sums input m (along `axis + 1`) where the mask admits m.
    let xm = lift(im, &x, axis, &name("m"))?;
    let (pi, pm) = (
        positions(n, axis, rank + 1)?,
        positions(n, axis + 1, rank + 1)?,
    );
    let admit = match (reverse, exclusive) {
        (false, false) => "LessOrEqual",
        (false, true) => "Less",
        (true, false) => "GreaterOrEqual",
        (true, true) => "Greater",
    };
    let admitted = im.onnx(admit, &[&pm, &pi], &[], &name("admitted"))?;
    let zero = Val::floats(x.dtype(), &[], vec![0.0])?;
    let terms = im.onnx("Where", &[&admitted, &xm, &zero], &[], &name("terms"))?;
    Ok(vec![im.onnx(
        "ReduceSum",
        &[&terms],
        &over(axis + 1),
        out,
    )?])
}

/// ScatterElements: `data` with each position along `axis` that an index names replaced by (or
/// combined with) the updates naming it. The indices and updates must match `data` on every
/// other axis (PyTorch's `scatter` of a full-size source); negative indices count from the end.
pub(super) fn scatter_elements(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let data = im.required(node, 0)?;
    let indices = im.required(node, 1)?;
    let updates = im.required(node, 2)?;
    let rank = data.shape().len();
    let axis = crate::shape::normalize_axis(int_attr(attrs, "axis").unwrap_or(0), rank)?;
    let reduction = reduction(attrs, data.dtype())?;
    // A sum is the catalogue's scatter_add, which takes indices smaller than data off the
    // axis, as the specification does; the pairwise forms of the others need them equal.
    let fits = |a: usize, m: usize, n: usize| a == axis || m == n || (reduction == "add" && m < n);
    let same_elsewhere = indices.shape().len() == rank
        && (0..rank).all(|a| fits(a, indices.shape()[a], data.shape()[a]));
    if indices.shape() != updates.shape() || !same_elsewhere {
        let relation = if reduction == "add" {
            "no larger than"
        } else {
            "equal to"
        };
        return Err(ImportError::Unsupported(format!(
            "indices {:?} and updates {:?} must have one shape, {relation} data's {:?} on every axis but {axis}",
            indices.shape(),
            updates.shape(),
            data.shape()
        )));
    }
    if updates.dtype() != data.dtype() {
        return Err(ImportError::Malformed(format!(
            "updates are {}, data {}",
            updates.dtype(),
            data.dtype()
        )));
    }
    let indices = as_int64(im, indices, &format!("{out}.indices"))?;
    Ok(vec![scatter_along(
        im, &data, &indices, &updates, axis, &reduction, out,
    )?])
}

/// `data` with each position along `axis` that an i64 index names combined with the updates
/// naming it (`reduction`), the others kept: ScatterElements once its operands are checked. A
/// sum is the catalogue's scatter_add (linear in the updates, with a kernel of its own); the
/// other reductions are pairwise (see the module documentation).
fn scatter_along(
    im: &mut Importer,
    data: &Val,
    indices: &Val,
    updates: &Val,
    axis: usize,
    reduction: &str,
    out: &str,
) -> Imports {
    if reduction == "add" {
        let args = [data.clone(), indices.clone(), updates.clone()];
        let at = BuiltinAttrs::Gather { axis: axis as i64 };
        return im.emit_builtin(Builtin::ScatterAdd, &args, at, out, true);
    }
    let rank = data.shape().len();
    let name = |part: &str| format!("{out}.{part}");
    let (n, m) = (data.shape()[axis], indices.shape()[axis]);
    let count = Val::ints(DType::I64, &[], vec![n as i64])?;
    let zero = Val::ints(DType::I64, &[], vec![0])?;
    let indices = from_the_end(im, indices, &count, out)?;
    // Position p of data (along `axis`) against update u (along `axis + 1`).
    let index_u = lift(im, &indices, axis, &name("index_u"))?;
    let update_u = lift(im, updates, axis, &name("update_u"))?;
    let position = positions(n, axis, rank + 1)?;
    let hit = im.onnx("Equal", &[&index_u, &position], &[], &name("hit"))?;
    let to_int = [("to", Attr::Int(INT64))];
    let hits = im.onnx("Cast", &[&hit], &to_int, &name("hits"))?;
    let hits = im.onnx("ReduceSum", &[&hits], &over(axis + 1), &name("hits"))?;
    let named = im.onnx("Greater", &[&hits, &zero], &[], &name("named"))?;
    let combined = match reduction {
        "none" => {
            // The last update in index order wins, as in the specification's reference.
            let order = positions(m, axis + 1, rank + 1)?;
            let absent = Val::ints(DType::I64, &[], vec![-1])?;
            let order = im.onnx("Where", &[&hit, &order, &absent], &[], &name("order"))?;
            let last = im.onnx("ReduceMax", &[&order], &over(axis + 1), &name("last"))?;
            let last = im.onnx("Where", &[&named, &last, &zero], &[], &name("last"))?;
            let at = [("axis", Attr::Int(axis as i64))];
            im.onnx("GatherElements", &[updates, &last], &at, &name("taken"))?
        }
        "max" | "min" => {
            let (reduce, combine) = match reduction {
                "max" => ("ReduceMax", "Max"),
                _ => ("ReduceMin", "Min"),
            };
            // The absent terms are the type's far end, which never wins (positions no update
            // names at all are left out by `named` below).
            let filler = far_end(data.dtype(), reduction == "max")?;
            let terms = im.onnx("Where", &[&hit, &update_u, &filler], &[], &name("terms"))?;
            let extreme = im.onnx(reduce, &[&terms], &over(axis + 1), &name("extreme"))?;
            im.onnx(combine, &[data, &extreme], &[], &name("combined"))?
        }
        "mul" => {
            // The absent terms are 1; their product along the updates (`products`).
            let one = super::products::one(data.dtype())?;
            let terms = im.onnx("Where", &[&hit, &update_u, &one], &[], &name("terms"))?;
            let product = super::products::product_along(im, &terms, axis + 1, &name("product"))?;
            let product = im.reshape(&product, data.shape(), &name("product"))?;
            im.onnx("Mul", &[data, &product], &[], &name("combined"))?
        }
        other => {
            return Err(ImportError::Unsupported(format!(
                "reduction `{other}`: fusebox scatters with none, add, mul, max and min"
            )));
        }
    };
    im.onnx("Where", &[&named, &combined, data], &[], out)
}

/// ScatterND: `data` with the slices the index tuples name (each the last axis of `indices`,
/// `q` coordinates into the first `q` axes of `data`) combined with their updates. It is a
/// ScatterElements along one axis once `data` is read as `[P, R]` (the `P` positions of its
/// first `q` axes, each a row of the `R` elements after them) and each tuple as the row it
/// names; a tuple with a coordinate out of range names no row (its update is dropped).
pub(super) fn scatter_nd(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let data = im.required(node, 0)?;
    let indices = im.required(node, 1)?;
    let updates = im.required(node, 2)?;
    let reduction = reduction(attrs, data.dtype())?;
    let shape = data.shape().to_vec();
    let (tuples, q) = match indices.shape().split_last() {
        Some((&q, tuples)) if (1..=shape.len()).contains(&q) => (tuples.to_vec(), q),
        _ => {
            return Err(ImportError::Malformed(format!(
                "indices {:?} must end in an axis of 1 to {} coordinates",
                indices.shape(),
                shape.len()
            )));
        }
    };
    let mut expected = tuples.clone();
    expected.extend_from_slice(&shape[q..]);
    if updates.shape() != expected.as_slice() || updates.dtype() != data.dtype() {
        return Err(ImportError::Malformed(format!(
            "updates are {} {:?}; indices {:?} into data {} {shape:?} need {} {expected:?}",
            updates.dtype(),
            updates.shape(),
            indices.shape(),
            data.dtype(),
            data.dtype()
        )));
    }
    let name = |part: &str| format!("{out}.{part}");
    let rows: usize = shape[..q].iter().product();
    let row: usize = shape[q..].iter().product();
    let count: usize = tuples.iter().product();
    let indices = as_int64(im, indices, &name("indices"))?;
    let tuple = im.reshape(&indices, &[count, q], &name("tuple"))?;
    let linear = tuple_rows(im, &tuple, &shape[..q], rows as i64, out)?;
    let linear = im.reshape(&linear, &[count, 1], &name("linear"))?;
    let linear = im.emit_builtin(
        crate::rules::Builtin::BroadcastTo,
        &[linear],
        crate::rules::builtin::BuiltinAttrs::shape(&[count, row]),
        &name("linear"),
        false,
    )?;
    let data_rows = im.reshape(&data, &[rows, row], &name("data"))?;
    let update_rows = im.reshape(&updates, &[count, row], &name("updates"))?;
    let scattered = scatter_along(
        im,
        &data_rows,
        &linear,
        &update_rows,
        0,
        &reduction,
        &name("rows"),
    )?;
    Ok(vec![im.reshape(&scattered, &shape, out)?])
}

/// The row each index tuple names (`tuples` is `[count, q]` i64, each `q` coordinates into
/// `sizes`, negative ones from the end): the row-major position among the `Π sizes` rows, or
/// `nowhere` for a tuple with a coordinate out of range. ScatterND and GatherND read their
/// data as rows this way.
pub(super) fn tuple_rows(
    im: &mut Importer,
    tuples: &Val,
    sizes: &[usize],
    nowhere: i64,
    out: &str,
) -> Imports {
    let name = |part: &str| format!("{out}.{part}");
    let q = sizes.len();
    let strides: Vec<i64> = (0..q)
        .map(|d| sizes[d + 1..].iter().product::<usize>() as i64)
        .collect();
    let sizes = Val::ints(DType::I64, &[q], sizes.iter().map(|&d| d as i64).collect())?;
    let strides = Val::ints(DType::I64, &[q], strides)?;
    let zero = Val::ints(DType::I64, &[], vec![0])?;
    let tuple = from_the_end(im, tuples, &sizes, out)?;
    let above = im.onnx("GreaterOrEqual", &[&tuple, &zero], &[], &name("above"))?;
    let below = im.onnx("Less", &[&tuple, &sizes], &[], &name("below"))?;
    let inside = im.onnx("And", &[&above, &below], &[], &name("inside"))?;
    let to_int = [("to", Attr::Int(INT64))];
    let inside = im.onnx("Cast", &[&inside], &to_int, &name("inside"))?;
    let inside = im.onnx("ReduceSum", &[&inside], &over(1), &name("inside"))?;
    let all = Val::ints(DType::I64, &[], vec![q as i64])?;
    let valid = im.onnx("Equal", &[&inside, &all], &[], &name("valid"))?;
    let offsets = im.onnx("Mul", &[&tuple, &strides], &[], &name("offsets"))?;
    let linear = im.onnx("ReduceSum", &[&offsets], &over(1), &name("linear"))?;
    let nowhere = Val::ints(DType::I64, &[], vec![nowhere])?;
    im.onnx("Where", &[&valid, &linear, &nowhere], &[], &name("row"))
}
