//! Axis folding: which outer axes of a launch fold into the innermost one, stated once for
//! every backend.
//!
//! A kernel is compiled for stride patterns, not sizes, so a `[N, 1]` or `[N, 8]` domain of
//! contiguous tensors may arrive at run time. Folding an outer axis `d` into the innermost
//! one (its size multiplied into the inner size, its own set to 1) lets such a domain run as
//! one long row: longer vector loops, fewer coordinate divisions per element. Strides and
//! offsets stay as they are (a folded axis has size 1, so its coordinate is 0).
//!
//! Axes fold innermost first, while each folds: `d` folds when its size is 1 or when every
//! argument passes its [`FoldCondition`]s ([`fold_conditions`]), which hold exactly when the
//! argument's stride on `d` is its step over the whole (already folded) inner axis, so that
//! every element keeps its address. Patterns decide first: an argument broadcast along `d`
//! but moving along the inner axis (or the reverse, with a unit stride on `d`) never folds,
//! which keeps "a store broadcast along an axis is written where its index is 0" intact, and
//! a reduction output folds only where `d` and the inner axis are both kept (or both
//! reduced). Nothing folds when the sizes are not all positive, in a row kernel (its inner
//! axis is the row its reductions run over) or in a kernel reading a concat by ranges (the
//! ranges are coordinates along one axis).
//!
//! The C kernels spell the conditions as C, evaluated at the start of every launch
//! (`backend::cpu::emit`); the CUDA host evaluates them once per launch ([`folded_sizes`])
//! and hands the kernel the folded sizes.

use crate::lower::ir::{Arg, Axis, KernelIr, Launch};

/// One argument's condition for folding an outer axis `d`: its stride on `d` (1 for a `Unit`
/// axis, the run-time stride for a `Strided` one) equals its step over the inner axis: the
/// inner size for a `Unit` inner axis, the inner stride times the inner size for a `Strided`
/// one, 0 for a `Broadcast` one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoldCondition {
    pub arg: usize,
    /// The argument's pattern on `d`: `Unit` or `Strided`.
    pub outer: Axis,
    /// The argument's pattern on the innermost axis.
    pub inner: Axis,
}

/// Whether any launch of `ir` may fold axes: rank 2 or more, not a row kernel, no ranges.
pub fn may_fold(ir: &KernelIr) -> bool {
    ir.rank >= 2 && !ir.is_row_kernel() && !ir.has_ranges()
}

/// The conditions under which outer axis `d` (of size other than 1) folds into the innermost
/// axis, one per argument that moves on either: all must hold. `None` when the patterns alone
/// refuse; an empty list when they alone allow.
pub fn fold_conditions(ir: &KernelIr, d: usize) -> Option<Vec<FoldCondition>> {
    let inner = ir.rank - 1;
    let mut conditions = Vec::new();
    for (arg, view) in ir.views().enumerate() {
        if let Arg::Reduction(r) = ir.arg(arg) {
            let reduced = &ir.reductions[r].reduced;
            if reduced[d] != reduced[inner] {
                // Folding would mix reduced and kept coordinates.
                return None;
            }
            if reduced[d] {
                continue;
            }
        }
        match (view.axes[d], view.axes[inner]) {
            (Axis::Broadcast, Axis::Broadcast) => {}
            (Axis::Broadcast, _) | (Axis::Unit, Axis::Broadcast) => return None,
            (outer, inner) => conditions.push(FoldCondition { arg, outer, inner }),
        }
    }
    Some(conditions)
}

/// The sizes of `launch` after folding (see the module documentation): what the CUDA host
/// hands its kernels, and what the C kernels compute in their preamble.
pub fn folded_sizes(ir: &KernelIr, launch: &Launch) -> Vec<i64> {
    let mut n = launch.sizes.clone();
    if !may_fold(ir) || n.len() != ir.rank || n.iter().any(|&s| s <= 0) {
        return n;
    }
    let inner = ir.rank - 1;
    for d in (0..inner).rev() {
        let folds = n[d] == 1
            || fold_conditions(ir, d)
                .is_some_and(|conditions| conditions.iter().all(|c| holds(c, launch, d, n[inner])));
        if !folds {
            break;
        }
        n[inner] *= n[d];
        n[d] = 1;
    }
    n
}

/// Whether `condition` holds for outer axis `d` of `launch` when the inner size is `len`.
fn holds(condition: &FoldCondition, launch: &Launch, d: usize, len: i64) -> bool {
    let stride = |axis: usize, pattern: Axis| -> i128 {
        match pattern {
            Axis::Broadcast => 0,
            Axis::Unit => 1,
            Axis::Strided => launch
                .strides
                .get(condition.arg)
                .and_then(|s| s.get(axis))
                .copied()
                .map_or(0, i128::from),
        }
    };
    let inner = launch.sizes.len() - 1;
    stride(d, condition.outer) == stride(inner, condition.inner) * i128::from(len)
}
