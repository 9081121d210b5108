//! How a library call reads an operand through the casts and layout ops it absorbed: the
//! index map from the operand's value to the buffer the call actually reads.
//!
//! The absorbed ops form a tree below the call's operand. Along a chain (each op the single
//! operand of the next) the views' maps compose, from the buffer outward, and casts move
//! nothing. A `concat` joins the chain when its operands are views of one buffer that lie at
//! evenly spaced offsets with one stride pattern: stacked, they are one strided view with
//! the spacing as the concat axis's stride. That is how a convolution's im2col matrix (the
//! image's windows, one shifted slice per kernel offset, stacked) becomes a view of the
//! image that the GEMM packs from, instead of a copy nine times the image's size.
//!
//! Below the windows, a concat of the image between slabs of zeros (its padding, one concat
//! per padded axis) joins as a [`Padding`]: the view then addresses the padded image, which
//! is never written; the reader makes the zeros (the CPU GEMM while it packs) or builds the
//! padded buffer itself.

use crate::dag::{Dag, Value};
use crate::dtype::DType;
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::rules::{Builtin, BuiltinAttrs};
use crate::shape::{IndexMap, Padding, Strided};

/// What a library call reads for one operand: the buffer of `source`, through `map` (from the
/// operand's value to that buffer), rounded through `casts` (outermost last). Where `padding`
/// is given, `map` addresses that padding of `source` instead of its buffer.
#[derive(Debug, Clone)]
pub struct OperandTree {
    pub source: Value,
    pub map: IndexMap,
    pub casts: Vec<DType>,
    pub padding: Option<Padding>,
}

/// The operand tree below `arg` made of the nodes `member` admits: casts, layout views and
/// stacking concats, down to the first value that is not a member. `None` where a member has
/// no index map (it is no view), or a concat's operands do not stack into one view.
pub fn operand_tree(dag: &Dag, arg: Value, member: &dyn Fn(usize) -> bool) -> Option<OperandTree> {
    let Value::Node(p) = arg else {
        return Some(leaf(dag, arg));
    };
    if !member(p) {
        return Some(leaf(dag, arg));
    }
    let node = &dag.nodes[p];
    let builtin = node.op.builtin()?;
    let first = *node.args.first()?;
    if builtin == Builtin::Cast {
        let mut below = operand_tree(dag, first, member)?;
        below.casts.push(node.ty.dtype);
        return Some(below);
    }
    let shapes: Vec<&[usize]> = node
        .args
        .iter()
        .map(|&a| dag.ty(a).shape.as_slice())
        .collect();
    let (plan, _) = plan_builtin(builtin, &shapes, &node.attrs).ok()?;
    if let BuiltinPlan::Concat(axis) = plan {
        if let Some(padded) = padded_tree(dag, p, member) {
            return Some(padded);
        }
        return stacked_tree(dag, &node.args, axis, member);
    }
    let below = operand_tree(dag, first, member)?;
    let map = plan.index_map(&below.map, shapes[0], &node.ty.shape)?;
    Some(OperandTree { map, ..below })
}

/// A value read as stored.
fn leaf(dag: &Dag, v: Value) -> OperandTree {
    OperandTree {
        source: v,
        map: IndexMap::contiguous(&dag.ty(v).shape),
        casts: Vec::new(),
        padding: None,
    }
}

/// Whether `v` is zeros: a `const` of +0 seen through broadcasts and reshapes (a padding
/// slab; +0 only, so that a product over padding is exactly the one over written zeros).
pub fn zero_slab(dag: &Dag, v: Value) -> bool {
    let mut at = v;
    while let Value::Node(p) = at {
        let node = &dag.nodes[p];
        match node.op.builtin() {
            Some(Builtin::BroadcastTo | Builtin::Reshape) => at = node.args[0],
            Some(Builtin::Const) => {
                return matches!(
                    BuiltinAttrs::read(Builtin::Const, &node.attrs),
                    Ok(BuiltinAttrs::Const { value, .. }) if value == 0.0 && value.is_sign_positive()
                );
            }
            _ => return false,
        }
    }
    false
}

/// A concat of one operand between zero slabs ([`zero_slab`]): one axis of a padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroPadding {
    /// The concat's axis.
    pub axis: usize,
    /// The padded operand's position among the concat's args.
    pub middle: usize,
    /// The zeros before and after it along `axis`.
    pub before: usize,
    pub after: usize,
}

/// Node `c` as a [`ZeroPadding`], where it is one.
pub fn zero_padding(dag: &Dag, c: usize) -> Option<ZeroPadding> {
    let node = &dag.nodes[c];
    if node.op.builtin() != Some(Builtin::Concat) {
        return None;
    }
    let shapes: Vec<&[usize]> = node.args.iter().map(|&a| &dag.ty(a).shape[..]).collect();
    let Ok((BuiltinPlan::Concat(axis), _)) = plan_builtin(Builtin::Concat, &shapes, &node.attrs)
    else {
        return None;
    };
    let mut middle = None;
    for (i, &a) in node.args.iter().enumerate() {
        if !zero_slab(dag, a) {
            if middle.is_some() {
                return None;
            }
            middle = Some(i);
        }
    }
    let middle = middle?;
    let extent = |pieces: &[&[usize]]| -> usize { pieces.iter().map(|s| s[axis]).sum() };
    let (before, after) = (extent(&shapes[..middle]), extent(&shapes[middle + 1..]));
    (before + after > 0).then_some(ZeroPadding {
        axis,
        middle,
        before,
        after,
    })
}

/// A zero padding ([`zero_padding`]) of an operand read as stored, or of such a padding
/// along another axis, as one [`Padding`] of the stored value, its map the padded shape's
/// row-major offsets.
fn padded_tree(dag: &Dag, c: usize, member: &dyn Fn(usize) -> bool) -> Option<OperandTree> {
    let ZeroPadding {
        axis,
        middle,
        before,
        after,
    } = zero_padding(dag, c)?;
    let node = &dag.nodes[c];
    let inner = node.args[middle];
    let below = operand_tree(dag, inner, member)?;
    let inner_shape = &dag.ty(inner).shape;
    let source_shape = &dag.ty(below.source).shape;
    let plain = below.casts.is_empty()
        && below.map.as_strided() == Some(&Strided::contiguous(inner_shape))
        && (below.padding.is_some() || source_shape == inner_shape);
    if !plain {
        return None;
    }
    let padding = Padding::around(below.padding.as_ref(), source_shape, axis, before, after);
    Some(OperandTree {
        source: below.source,
        map: IndexMap::contiguous(&node.ty.shape),
        casts: Vec::new(),
        padding: Some(padding),
    })
}

/// The concat along `axis` of `pieces` as one view, where every piece is a strided view
/// (no casts) of one buffer and they stack ([`stack`]).
fn stacked_tree(
    dag: &Dag,
    pieces: &[Value],
    axis: usize,
    member: &dyn Fn(usize) -> bool,
) -> Option<OperandTree> {
    let mut source = None;
    let mut padding = None;
    let mut views = Vec::with_capacity(pieces.len());
    for &piece in pieces {
        let tree = operand_tree(dag, piece, member)?;
        if !tree.casts.is_empty() || source.is_some_and(|s| s != tree.source) {
            return None;
        }
        if source.is_some() && padding != tree.padding {
            return None;
        }
        source = Some(tree.source);
        padding = tree.padding;
        views.push((
            tree.map.as_strided()?.clone(),
            dag.ty(piece).shape.as_slice(),
        ));
    }
    Some(OperandTree {
        source: source?,
        map: IndexMap::strided(stack(&views, axis)?),
        casts: Vec::new(),
        padding,
    })
}

/// Strided views (each with its shape) concatenated along `axis`, as one strided view of their
/// buffer, where that is one: every piece of the same shape and the same strides (on the axes
/// longer than 1), and the pieces' first elements evenly spaced by the piece's extent along
/// `axis` (`size · stride`), or, for pieces one element long there, by any one step, which
/// becomes the stride of the stacked axis.
pub fn stack(pieces: &[(Strided, &[usize])], axis: usize) -> Option<Strided> {
    let ((first, shape), rest) = pieces.split_first()?;
    if axis >= shape.len() || shape.contains(&0) {
        return None;
    }
    let moving = |s: &Strided| -> Vec<i64> {
        let mut moving: Vec<i64> = shape
            .iter()
            .zip(&s.strides)
            .map(|(&n, &t)| if n == 1 { 0 } else { t })
            .collect();
        moving[axis] = 0;
        moving
    };
    let step = match (shape[axis], rest.first()) {
        (_, None) => return Some(first.clone()),
        (1, Some((second, _))) => second.offset.checked_sub(first.offset)?,
        (n, Some(_)) => first.strides[axis].checked_mul(n as i64)?,
    };
    let pattern = moving(first);
    for (i, (piece, piece_shape)) in pieces.iter().enumerate() {
        let at = first.offset.checked_add(step.checked_mul(i as i64)?)?;
        let same_stride = shape[axis] == 1 || piece.strides[axis] == first.strides[axis];
        if *piece_shape != *shape || piece.offset != at || moving(piece) != pattern || !same_stride
        {
            return None;
        }
    }
    let mut strides = first.strides.clone();
    if shape[axis] == 1 {
        strides[axis] = step;
    }
    Some(Strided {
        offset: first.offset,
        strides,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::SplitAxes;

    fn view(offset: i64, strides: &[i64]) -> Strided {
        Strided {
            offset,
            strides: strides.to_vec(),
        }
    }

    /// The multi-index of row-major position `q` in `shape`.
    fn unravel(q: usize, shape: &[usize]) -> Vec<usize> {
        let mut idx = vec![0; shape.len()];
        let mut rest = q;
        for d in (0..shape.len()).rev() {
            idx[d] = rest % shape[d];
            rest /= shape[d];
        }
        idx
    }

    /// Every element of the stacked view is the element of the piece it falls in.
    fn check_stack(pieces: &[(Strided, &[usize])], axis: usize) {
        let stacked = stack(pieces, axis).expect("stacks");
        let mut shape = pieces[0].1.to_vec();
        shape[axis] *= pieces.len();
        let per = pieces[0].1[axis];
        let numel: usize = shape.iter().product();
        for q in 0..numel {
            let idx = unravel(q, &shape);
            let (k, within) = (idx[axis] / per, idx[axis] % per);
            let mut local = idx.clone();
            local[axis] = within;
            let at = |s: &Strided, i: &[usize]| {
                s.offset
                    + i.iter()
                        .zip(&s.strides)
                        .map(|(&i, &t)| i as i64 * t)
                        .sum::<i64>()
            };
            assert_eq!(at(&stacked, &idx), at(&pieces[k].0, &local), "{idx:?}");
        }
    }

    #[test]
    fn evenly_spaced_views_stack() {
        // Three windows of a [2, 10] image, one element long on the stacked axis, 2 apart.
        let shape = [2usize, 1, 4];
        let pieces: Vec<_> = (0..3)
            .map(|i| (view(2 * i, &[10, 999, 1]), &shape[..]))
            .collect();
        check_stack(&pieces, 1);
        assert_eq!(stack(&pieces, 1).unwrap().strides, vec![10, 2, 1]);
        // Pieces two long on the axis: the next one starts where the last one ends.
        let shape = [2usize, 3];
        let pieces: Vec<_> = (0..4).map(|i| (view(6 * i, &[3, 1]), &shape[..])).collect();
        check_stack(&pieces, 0);
        // A step that goes backwards.
        let shape = [1usize, 5];
        let pieces: Vec<_> = (0..3)
            .map(|i| (view(20 - 7 * i, &[0, 2]), &shape[..]))
            .collect();
        check_stack(&pieces, 0);
    }

    #[test]
    fn uneven_or_mismatched_views_do_not_stack() {
        let shape = [1usize, 4];
        let spaced = |offsets: &[i64], strides: &[&[i64]]| -> Option<Strided> {
            let pieces: Vec<_> = offsets
                .iter()
                .zip(strides)
                .map(|(&o, s)| (view(o, s), &shape[..]))
                .collect();
            stack(&pieces, 0)
        };
        assert!(spaced(&[0, 2, 5], &[&[0, 1], &[0, 1], &[0, 1]]).is_none());
        assert!(spaced(&[0, 2, 4], &[&[0, 1], &[0, 2], &[0, 1]]).is_none());
        assert!(spaced(&[0, 2, 4], &[&[0, 1], &[0, 1], &[0, 1]]).is_some());
        // Longer pieces must touch end to end.
        let long = [2usize, 4];
        let pieces = [(view(0, &[4, 1]), &long[..]), (view(9, &[4, 1]), &long[..])];
        assert!(stack(&pieces, 0).is_none());
        let empty = [0usize, 4];
        assert!(stack(&[(view(0, &[4, 1]), &empty[..])], 0).is_none());
    }

    /// The element `split_strided` reads for each index is the one the map reads.
    fn check_split(map: &IndexMap, shape: &[usize]) -> SplitAxes {
        let (strided, split) = map.split_strided(shape).expect("splits");
        let split = split.expect("has sub-axes");
        let numel: usize = shape.iter().product();
        for q in 0..numel {
            let idx = unravel(q, shape);
            let mut at = strided.offset;
            for (d, &i) in idx.iter().enumerate() {
                let mut rest = i;
                for (n, s) in split.axis(&strided, d).into_iter().rev() {
                    at += (rest % n) as i64 * s;
                    rest /= n;
                }
            }
            assert_eq!(at, map.element(&idx), "{idx:?}");
        }
        split
    }

    #[test]
    fn an_im2col_reshape_splits_into_the_windows_axes() {
        // A [2, 3, 6, 7] image read as windows [N, C, KH=2, KW=3, OH=4, OW=3] (stride 1 down,
        // 2 across), then as the matrix [N, C·6, 12].
        let windows = IndexMap::strided(view(1, &[126, 42, 7, 1, 7, 2]));
        let fine = [2usize, 3, 2, 3, 4, 3];
        let matrix = windows.reshape(&fine, &[2, 18, 12]);
        assert!(matrix.as_strided().is_none());
        let split = check_split(&matrix, &[2, 18, 12]);
        assert_eq!(split.counts, vec![1, 3, 2]);
        // The batch and the channels merge in the stage (they are contiguous); the split
        // pulls them apart again.
        let merged = IndexMap::strided(view(0, &[126, 42, 7, 1, 7, 1])).reshape(&fine, &[6, 6, 12]);
        check_split(&merged, &[6, 6, 12]);
    }

    #[test]
    fn maps_that_cut_across_sub_axes_do_not_split() {
        // [4, 6] transposed, then read as [4, 6]: 4 is neither whole 6s nor a divisor of 6.
        let map = IndexMap::strided(view(0, &[1, 4])).reshape(&[6, 4], &[4, 6]);
        assert!(map.split_strided(&[4, 6]).is_none());
        // Read as [3, 8] it splits: 3 of 6 (two apart), then the rest of 6 and the 4.
        let map = IndexMap::strided(view(0, &[1, 4])).reshape(&[6, 4], &[3, 8]);
        check_split(&map, &[3, 8]);
        // A view of a reshape that is transposed again has a strided outer: no split.
        let map = IndexMap::strided(view(0, &[1, 4]))
            .reshape(&[6, 4], &[4, 6])
            .transpose(&[1, 0]);
        assert!(map.split_strided(&[6, 4]).is_none());
    }
}
