//! ONNX ops that pick by position: `ArgMax`, `ArgMin`, `OneHot`, `Trilu` and `GatherND`, and
//! `Tile`, which repeats by position.
//!
//! Each is written as ONNX ops the op table imports, around one constant the importer makes
//! from the static shape: the positions `0..n` along the axis (an i64 tensor shaped to
//! broadcast along it). An arg-reduction compares every element with the extreme of its row
//! and keeps the first (or last) position that holds it; a one-hot compares each index with
//! the positions. Their meaning stays in the table and the catalogue.

use super::proto::Attr;
use super::structural::{Attrs, int_attr};
use super::{ImportError, Importer, Imports, Val};
use crate::dtype::DType;
use onnx_protobuf::NodeProto;

pub(super) fn arg_max(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    arg_extreme(im, node, attrs, out, "ReduceMax")
}

pub(super) fn arg_min(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    arg_extreme(im, node, attrs, out, "ReduceMin")
}

/// The position of each row's extreme along `axis` (`reduce`: ReduceMax or ReduceMin), as
/// NumPy's argmax and argmin give it: the first position holding it (the last with
/// `select_last_index`), and the first NaN where the row has one. An empty axis has no
/// position and is refused.
fn arg_extreme(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
    reduce: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let rank = x.shape().len();
    let axis = crate::shape::normalize_axis(int_attr(attrs, "axis").unwrap_or(0), rank)?;
    let keepdims = int_attr(attrs, "keepdims").unwrap_or(1) != 0;
    let last = int_attr(attrs, "select_last_index").unwrap_or(0) != 0;
    let n = x.shape()[axis];
    if n == 0 {
        return Err(ImportError::Malformed(format!(
            "axis {axis} of {:?} is empty: no position to return",
            x.shape()
        )));
    }
    let kept = [
        ("axes", Attr::Ints(vec![axis as i64])),
        ("keepdims", Attr::Int(1)),
    ];
    let extreme = im.onnx(reduce, &[&x], &kept, &format!("{out}.extreme"))?;
    let equal = im.onnx("Equal", &[&x, &extreme], &[], &format!("{out}.equal"))?;
    // A NaN is the extreme (the reduction propagates it): its own position is taken.
    let same = im.onnx("Equal", &[&x, &x], &[], &format!("{out}.same"))?;
    let nan = im.onnx("Not", &[&same], &[], &format!("{out}.nan"))?;
    let hit = im.onnx("Or", &[&equal, &nan], &[], &format!("{out}.hit"))?;
    let positions = positions(n, axis, rank)?;
    let (miss, pick) = match last {
        false => (n as i64, "ReduceMin"),
        true => (-1, "ReduceMax"),
    };
    let miss = Val::ints(DType::I64, &[], vec![miss])?;
    let candidates = im.onnx(
        "Where",
        &[&hit, &positions, &miss],
        &[],
        &format!("{out}.candidates"),
    )?;
    let picked = [
        ("axes", Attr::Ints(vec![axis as i64])),
        ("keepdims", Attr::Int(i64::from(keepdims))),
    ];
    Ok(vec![im.onnx(pick, &[&candidates], &picked, out)?])
}

/// A one-hot: `indices` (cast to i64 if they are not integers; negative ones count from the
/// end) compared with the positions `0..depth` along a new axis `axis`, `values[1]` where
/// equal and `values[0]` elsewhere. An index outside `-depth..depth` is all `values[0]`.
pub(super) fn one_hot(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let mut indices = im.required(node, 0)?;
    let depth = im.ints(node, 1, "depth")?;
    let values = im.required(node, 2)?;
    let [depth] = depth[..] else {
        return Err(ImportError::Malformed("depth must hold one value".into()));
    };
    let depth = usize::try_from(depth)
        .ok()
        .filter(|&d| d <= crate::onnx::FOLD_LIMIT)
        .ok_or_else(|| ImportError::Malformed(format!("depth {depth} is out of range")))?;
    if values.shape().iter().product::<usize>() != 2 || values.shape().len() != 1 {
        return Err(ImportError::Malformed(format!(
            "values must be [off, on], not of shape {:?}",
            values.shape()
        )));
    }
    let rank = indices.shape().len() + 1;
    let axis = crate::shape::normalize_axis(int_attr(attrs, "axis").unwrap_or(-1), rank)?;
    if indices.dtype().category() != crate::dtype::Category::Integer {
        let to = [("to", Attr::Int(7))];
        indices = im.onnx("Cast", &[&indices], &to, &format!("{out}.cast"))?;
    }
    let depth_value = Val::ints(indices.dtype(), &[], vec![depth as i64])?;
    let index = from_the_end(im, &indices, &depth_value, out)?;
    let mut lifted = indices.shape().to_vec();
    lifted.insert(axis, 1);
    let index = im.reshape(&index, &lifted, &format!("{out}.index"))?;
    let index = as_int64(im, index, &format!("{out}.index"))?;
    let positions = positions(depth, axis, rank)?;
    let hit = im.onnx("Equal", &[&index, &positions], &[], &format!("{out}.hit"))?;
    let part = |im: &mut Importer, k: i64| -> Imports {
        let name = format!("{out}.value");
        let one = im.slice(&values, 0, k, k + 1, 1, &name)?;
        im.reshape(&one, &[], &name)
    };
    let (off, on) = (part(im, 0)?, part(im, 1)?);
    Ok(vec![im.onnx("Where", &[&hit, &on, &off], &[], out)?])
}

/// Integer `indices` with each negative one counted from the end of an axis of `size` (a
/// scalar of their type): `index + size` where `index < 0`, named `{name}.index`.
pub(super) fn from_the_end(im: &mut Importer, indices: &Val, size: &Val, name: &str) -> Imports {
    let zero = Val::ints(indices.dtype(), &[], vec![0])?;
    let negative = im.onnx("Less", &[indices, &zero], &[], &format!("{name}.negative"))?;
    let wrapped = im.onnx("Add", &[indices, size], &[], &format!("{name}.wrapped"))?;
    im.onnx(
        "Where",
        &[&negative, &wrapped, indices],
        &[],
        &format!("{name}.index"),
    )
}

/// `v` as i64 (a Cast unless it is one already), named `name`.
pub(super) fn as_int64(im: &mut Importer, v: Val, name: &str) -> Imports {
    match v.dtype() {
        DType::I64 => Ok(v),
        _ => im.onnx("Cast", &[&v], &[("to", Attr::Int(7))], name),
    }
}

/// The positions `0..n` as an i64 tensor of rank `rank` that runs along `axis` (size 1 on
/// every other axis).
pub(super) fn positions(n: usize, axis: usize, rank: usize) -> Imports {
    let mut shape = vec![1; rank];
    shape[axis] = n;
    Val::ints(DType::I64, &shape, (0..n as i64).collect())
}

/// Tile: each axis repeated `repeats[a]` times, as a broadcast of the operand with a size-1
/// axis before each of its own, reshaped back (`[r, d]` rows of the axis read as `r · d`).
pub(super) fn tile(im: &mut Importer, node: &NodeProto, _: &Attrs, out: &str) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    let repeats = im.ints(node, 1, "repeats")?;
    let shape = x.shape().to_vec();
    if repeats.len() != shape.len() {
        return Err(ImportError::Malformed(format!(
            "repeats {repeats:?} must have one entry per axis of {shape:?}"
        )));
    }
    let mut lifted = Vec::new();
    let mut spread = Vec::new();
    let mut result = Vec::new();
    for (&d, &r) in shape.iter().zip(&repeats) {
        let r = usize::try_from(r).map_err(|_| {
            ImportError::Malformed(format!("repeats {repeats:?} must be non-negative"))
        })?;
        lifted.extend([1, d]);
        spread.extend([r, d]);
        result.push(
            r.checked_mul(d)
                .ok_or(ImportError::Malformed("repeats overflow".into()))?,
        );
    }
    crate::onnx::proto::element_count(&result.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
    if repeats.iter().all(|&r| r == 1) {
        return Ok(vec![x]);
    }
    let lifted = im.reshape(&x, &lifted, &format!("{out}.lifted"))?;
    let spread = im.emit_builtin(
        crate::rules::Builtin::BroadcastTo,
        &[lifted],
        crate::rules::builtin::BuiltinAttrs::shape(&spread),
        &format!("{out}.spread"),
        false,
    )?;
    Ok(vec![im.reshape(&spread, &result, out)?])
}

/// Trilu: the upper (`upper`, the default) or lower triangle of the last two axes, from
/// diagonal `k` (input 1, 0 when absent), zeros elsewhere: a mask of the column minus the row
/// (constant positions) against `k`.
pub(super) fn trilu(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let x = im.required(node, 0)?;
    // `k` may be a run-time value: only the mask depends on it.
    let k = match im.input(node, 1)? {
        Some(k) if k.shape().iter().product::<usize>() == 1 => {
            im.reshape(&k, &[], &format!("{out}.k"))?
        }
        Some(k) => {
            return Err(ImportError::Malformed(format!(
                "k must hold one value, not a tensor of shape {:?}",
                k.shape()
            )));
        }
        None => Val::ints(DType::I64, &[], vec![0])?,
    };
    let upper = int_attr(attrs, "upper").unwrap_or(1) != 0;
    let rank = x.shape().len();
    if rank < 2 {
        return Err(ImportError::Malformed(format!(
            "Trilu needs two axes, not {:?}",
            x.shape()
        )));
    }
    let (n, m) = (x.shape()[rank - 2], x.shape()[rank - 1]);
    let row = positions(n, 0, 2)?;
    let column = positions(m, 1, 2)?;
    let diagonal = im.onnx("Sub", &[&column, &row], &[], &format!("{out}.diagonal"))?;
    let keep = match upper {
        true => im.onnx(
            "GreaterOrEqual",
            &[&diagonal, &k],
            &[],
            &format!("{out}.keep"),
        )?,
        false => im.onnx("LessOrEqual", &[&diagonal, &k], &[], &format!("{out}.keep"))?,
    };
    let zero = Val::floats(x.dtype(), &[], vec![0.0])?;
    Ok(vec![im.onnx("Where", &[&keep, &x, &zero], &[], out)?])
}

/// GatherND: for each index tuple (the last axis of `indices`, `q` coordinates into the axes of
/// `data` after its `batch_dims` leading ones, which `indices` shares), the slice of `data` it
/// names. `data` is read as rows (`[B·P, R]`: the `B` batch positions, the `P` positions of the
/// `q` indexed axes, each a row of the `R` elements after them) and each tuple as its row, its
/// batch's first row added: one `gather` of rows. A tuple with a coordinate out of range
/// names no row, so it reads the gather's fill (NaN for floats; ONNX leaves it undefined).
pub(super) fn gather_nd(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    let data = im.required(node, 0)?;
    let indices = im.required(node, 1)?;
    let shape = data.shape().to_vec();
    let batch_dims = int_attr(attrs, "batch_dims").unwrap_or(0);
    let batch = match usize::try_from(batch_dims) {
        Ok(b) if b < shape.len() && b < indices.shape().len() => b,
        _ => {
            return Err(ImportError::Malformed(format!(
                "batch_dims {batch_dims} must be at least 0 and less than the ranks of data {:?} and indices {:?}",
                shape,
                indices.shape()
            )));
        }
    };
    let index_shape = indices.shape().to_vec();
    let fits = index_shape[..batch] == shape[..batch]
        && index_shape
            .last()
            .is_some_and(|&q| (1..=shape.len() - batch).contains(&q));
    if !fits || indices.dtype().category() != crate::dtype::Category::Integer {
        return Err(ImportError::Malformed(format!(
            "indices {} {index_shape:?} must share data's {batch} batch axes {:?} and end in an axis of 1 to {} integer coordinates",
            indices.dtype(),
            &shape[..batch],
            shape.len() - batch
        )));
    }
    let name = |part: &str| format!("{out}.{part}");
    let q = index_shape[index_shape.len() - 1];
    let batches: usize = shape[..batch].iter().product();
    let rows: usize = shape[batch..batch + q].iter().product();
    let row: usize = shape[batch + q..].iter().product();
    let per_batch: usize = index_shape[batch..index_shape.len() - 1].iter().product();
    let indices = as_int64(im, indices, &name("indices"))?;
    let tuples = im.reshape(&indices, &[batches * per_batch, q], &name("tuples"))?;
    // Out of range: past every row of every batch, whatever batch's rows are added.
    let all_rows = (batches * rows) as i64;
    let within = super::pairwise::tuple_rows(im, &tuples, &shape[batch..batch + q], all_rows, out)?;
    let within = im.reshape(&within, &[batches, per_batch], &name("within"))?;
    let first = Val::ints(
        DType::I64,
        &[batches, 1],
        (0..batches as i64).map(|b| b * rows as i64).collect(),
    )?;
    let picked = im.onnx("Add", &[&within, &first], &[], &name("picked"))?;
    let picked = im.reshape(&picked, &[batches * per_batch], &name("picked"))?;
    let data_rows = im.reshape(&data, &[batches * rows, row], &name("rows"))?;
    let at = [("axis", Attr::Int(0))];
    let gathered = im.onnx("Gather", &[&data_rows, &picked], &at, &name("gathered"))?;
    let mut result = index_shape[..index_shape.len() - 1].to_vec();
    result.extend_from_slice(&shape[batch + q..]);
    Ok(vec![im.reshape(&gathered, &result, out)?])
}
