//! Merging a kernel's trailing domain axes into one, for an epilogue that a GEMM runs on its
//! product's tiles.
//!
//! A GEMM cuts its product `[batch…, M, N]` into tiles of rows and columns, and runs its
//! epilogue over each tile's block of the product's domain. An epilogue written over the
//! product with its last axis split (a convolution's `[N, M, P]` read as `[N, M, H, W]`) has
//! no such blocks: a tile's columns are a run of positions that crosses image rows. It runs
//! per tile once its split axes are merged back into one, which keeps every element where it
//! was exactly when each value it reads or writes moves along the split axes as along one
//! axis: the outer axis's stride is the inner one's step over the whole inner axis (a
//! contiguous tensor, the product's reshape), or neither moves (a per-channel scale or
//! shift, broadcast along both).

use super::ir::{Axis, KernelIr, Launch};

/// `ir` and `launch` with their domain axes from `first` on merged into one, where every
/// argument moves along them as along one axis; `false`, with both unchanged, where one does
/// not, or where the kernel is not plain pointwise (reductions, ranges, gathers, index maps,
/// scatters), whose code depends on its axes.
pub fn merge_trailing_axes(ir: &mut KernelIr, launch: &mut Launch, first: usize) -> bool {
    let plain = ir.reductions.is_empty()
        && launch.ranges.is_empty()
        && launch.gathers.is_empty()
        && launch.maps.iter().all(Vec::is_empty)
        && ir.loads.iter().all(|v| v.stages.is_empty())
        && ir.stores.iter().all(|s| s.scatter.is_none());
    if !plain || first >= ir.rank {
        return false;
    }
    let (mut merged_ir, mut merged_launch) = (ir.clone(), launch.clone());
    while merged_ir.rank > first + 1 {
        if !merge_last_two(&mut merged_ir, &mut merged_launch) {
            return false;
        }
    }
    (*ir, *launch) = (merged_ir, merged_launch);
    true
}

/// The domain's last two axes merged into one (see [`merge_trailing_axes`]); `false` where
/// an argument does not move along them as along one axis, leaving `ir` and `launch` part
/// merged (the caller works on copies).
fn merge_last_two(ir: &mut KernelIr, launch: &mut Launch) -> bool {
    let r = ir.rank;
    let (outer, inner) = (launch.sizes[r - 2], launch.sizes[r - 1]);
    let views = ir
        .loads
        .iter_mut()
        .chain(ir.stores.iter_mut().map(|s| &mut s.view));
    for (view, strides) in views.zip(&mut launch.strides) {
        let (k0, k1) = (view.axes[r - 2], view.axes[r - 1]);
        let (s0, s1) = (strides[r - 2], strides[r - 1]);
        let (kind, stride) = if outer == 1 {
            (k1, s1)
        } else if inner == 1 {
            let kind = match k0 {
                Axis::Broadcast => k0,
                _ => Axis::Strided,
            };
            (kind, s0)
        } else if k0 == Axis::Broadcast && k1 == Axis::Broadcast {
            (Axis::Broadcast, 0)
        } else if k0 != Axis::Broadcast && k1 != Axis::Broadcast && s0 == s1.saturating_mul(inner) {
            (k1, s1)
        } else {
            return false;
        };
        view.axes.truncate(r - 1);
        view.axes[r - 2] = kind;
        strides.truncate(r - 1);
        strides[r - 2] = stride;
    }
    launch.sizes.truncate(r - 1);
    launch.sizes[r - 2] = outer * inner;
    ir.rank = r - 1;
    true
}
