//! Loop-domain refinement: index maps turned back into strides by splitting the kernel's axes.
//!
//! An index map unflattens a *position* into a stage's shape with a division and a remainder
//! per axis, per element. When the kernel's domain enumerates the positions of a stage in
//! row-major order, the division is only undoing a flattening the domain itself did: a 1-D
//! domain of 196608 reading `x.t().reshape(-1)` through a stage of shape `[384, 512]` is a
//! 2-D loop over `[384, 512]` in disguise. Splitting the domain's axes to the finest common
//! refinement of the domain and the stage's shape makes every stage axis a run of whole domain
//! axes, so the stage becomes strides over the refined domain and the load is plain strided,
//! and every other operand (contiguous or strided over the old axes) is strided over the new
//! ones too, since a row-major split of an axis is affine.
//!
//! Refinement runs after a kernel is lowered, on its IR and launch together, and decides from
//! the launch's sizes: the refined structure (which axes split into how many pieces, and so
//! the rank and patterns) becomes the kernel's identity, the piece sizes stay launch
//! arguments. A batch size that splits the same way therefore hits the same compiled kernel;
//! one that does not (no common refinement exists, as for `[6, 4]` read as `[4, 6]`) keeps
//! its index map, which is correct for every size.
//!
//! A position range can be split only where it is a contiguous row-major enumeration of the
//! whole stage: offset 0, the moving axes' strides in some order `1, n_a, n_a·n_b, …` up to
//! the stage's element count, with every stage boundary (a suffix product of its shape)
//! falling on a multiple of the stride of the domain axis it lands in, and dividing that
//! axis's size. Anything else (a slice of the enumeration, a negative stride) keeps the map.
//! Row kernels are left alone: their innermost axis is the row, and splitting it would
//! change what a row reduction reduces.

use super::ir::{Axis, KernelIr, Launch};

/// `ir` and `launch` with as many index-map stages as the domain's splits allow turned into
/// strides. Unchanged when nothing can be refined (no index map, an empty domain, a row
/// kernel, a range select, or no stage whose positions the domain enumerates).
pub(super) fn refine(ir: KernelIr, launch: Launch) -> (KernelIr, Launch) {
    let mapped = ir.views().any(|v| v.is_mapped());
    // A range select's segments are index ranges along one domain axis; splitting that axis
    // would need them split too, so kernels reading a concat keep their maps.
    let selects = !launch.ranges.is_empty();
    if !mapped
        || selects
        || ir.is_row_kernel()
        || ir.is_scatter_kernel()
        || launch.sizes.iter().any(|&n| n <= 0)
    {
        return (ir, launch);
    }
    let mut k = Refining {
        sizes: launch.sizes.clone(),
        strides: launch.strides.clone(),
        offsets: launch.offsets.clone(),
        maps: launch.maps.clone(),
        origin: (0..launch.sizes.len()).map(|d| (d, true)).collect(),
    };
    k.maps.resize(ir.arg_count(), Vec::new());
    let mut changed = false;
    for arg in 0..ir.arg_count() {
        while let Some(stage) = k.maps[arg].first().cloned() {
            let Some(splits) = k.splits(arg, &stage.sizes) else {
                break;
            };
            k.split(&splits);
            changed = true;
            let Some(strides) = k.through_stage(arg, &stage.sizes, &stage.strides) else {
                break;
            };
            k.strides[arg] = strides;
            k.offsets[arg] = stage.offset;
            k.maps[arg].remove(0);
        }
    }
    if !changed {
        return (ir, launch);
    }
    k.finish(ir)
}

/// A kernel's launch while its domain is being split.
struct Refining {
    sizes: Vec<i64>,
    strides: Vec<Vec<i64>>,
    offsets: Vec<i64>,
    maps: Vec<Vec<super::ir::MapStage>>,
    /// Per refined axis: the original axis it comes from, and whether it is that axis's
    /// innermost piece (the one a `Unit` pattern stays on).
    origin: Vec<(usize, bool)>,
}

impl Refining {
    /// Per domain axis, the sizes of the inner products at which it must split (ascending,
    /// each dividing the next and the axis size) so that argument `arg`'s positions unflatten
    /// into a stage of shape `stage` along whole axes. `None` when the positions are not a
    /// row-major enumeration of the stage that such splits can follow.
    fn splits(&self, arg: usize, stage: &[i64]) -> Option<Vec<Vec<i64>>> {
        if self.offsets[arg] != 0 || stage.iter().any(|&n| n <= 0) {
            return None;
        }
        let strides = &self.strides[arg];
        let total = stage.iter().try_fold(1i64, |c, &n| c.checked_mul(n))?;
        // Moving axes by stride, innermost first: a contiguous enumeration of 0..total.
        let mut moving: Vec<usize> = (0..self.sizes.len())
            .filter(|&d| self.sizes[d] > 1 && strides[d] != 0)
            .collect();
        moving.sort_by_key(|&d| strides[d]);
        let mut next = 1i64;
        for &d in &moving {
            if strides[d] != next {
                return None;
            }
            next = next.checked_mul(self.sizes[d])?;
        }
        if next != total {
            return None;
        }
        // Stage boundaries: the suffix products strictly inside 1..total.
        let mut bounds = Vec::new();
        let mut u = 1i64;
        for &n in stage.iter().rev().take(stage.len().saturating_sub(1)) {
            u = u.checked_mul(n)?;
            bounds.push(u);
        }
        let mut splits = vec![Vec::new(); self.sizes.len()];
        for &d in &moving {
            let (s, n) = (strides[d], self.sizes[d]);
            let end = s.checked_mul(n)?;
            for &b in bounds.iter().filter(|&&b| s < b && b < end) {
                if b % s != 0 || n % (b / s) != 0 {
                    return None;
                }
                splits[d].push(b / s);
            }
        }
        Some(splits)
    }

    /// Splits every domain axis at its inner products in `splits` (row-major: the outer piece
    /// first), re-expressing every argument's strides over the new axes.
    fn split(&mut self, splits: &[Vec<i64>]) {
        let mut sizes = Vec::new();
        let mut origin = Vec::new();
        // Per new axis: the old axis and the inner product its stride is multiplied by.
        let mut from: Vec<(usize, i64)> = Vec::new();
        for (d, &n) in self.sizes.iter().enumerate() {
            let mut cuts = vec![1i64];
            cuts.extend(&splits[d]);
            cuts.push(n);
            for w in (0..cuts.len() - 1).rev() {
                sizes.push(cuts[w + 1] / cuts[w]);
                origin.push((self.origin[d].0, self.origin[d].1 && w == 0));
                from.push((d, cuts[w]));
            }
        }
        for strides in &mut self.strides {
            *strides = from
                .iter()
                .map(|&(d, inner)| strides[d].wrapping_mul(inner))
                .collect();
        }
        self.sizes = sizes;
        self.origin = origin;
    }

    /// Argument `arg`'s positions (strides over the refined domain, a row-major enumeration
    /// of `shape` whose boundaries fall between axes) taken through a stage of `shape` and
    /// `stage_strides`: the strides of what the stage maps them to. `None` on overflow.
    fn through_stage(&self, arg: usize, shape: &[i64], stage_strides: &[i64]) -> Option<Vec<i64>> {
        // Suffix product (position stride) of each stage axis.
        let mut below = vec![1i64; shape.len()];
        for e in (0..shape.len().saturating_sub(1)).rev() {
            below[e] = below[e + 1].checked_mul(shape[e + 1])?;
        }
        self.strides[arg]
            .iter()
            .zip(&self.sizes)
            .map(|(&p, &n)| {
                if p == 0 || n == 1 {
                    return Some(0);
                }
                // The stage axis this piece lies in: the largest suffix product ≤ p.
                let e = (0..shape.len()).find(|&e| below[e] <= p)?;
                if p % below[e] != 0 {
                    return None;
                }
                stage_strides[e].checked_mul(p / below[e])
            })
            .collect()
    }

    /// The refined kernel and launch: every view's pattern over the new axes (a split axis's
    /// pieces keep its pattern, `Unit` only on the innermost piece; a view whose map became
    /// strides is classified from them), reductions reducing every piece of a reduced axis.
    fn finish(self, mut ir: KernelIr) -> (KernelIr, Launch) {
        let rank = self.sizes.len();
        let old_rank = ir.rank;
        let remaining: Vec<Vec<usize>> = self
            .maps
            .iter()
            .map(|m| m.iter().map(|s| s.sizes.len()).collect())
            .collect();
        let mut strides = self.strides;
        for (a, view) in ir
            .loads
            .iter_mut()
            .chain(ir.stores.iter_mut().map(|s| &mut s.view))
            .chain(ir.reductions.iter_mut().map(|r| &mut r.view))
            .enumerate()
        {
            view.stages = remaining[a].clone();
            let mapped = view.is_mapped();
            let old = view.axes.clone();
            view.axes = (0..rank)
                .map(|d| {
                    let (o, innermost) = self.origin[d];
                    let last = o + 1 == old_rank && innermost;
                    let axis = if old[o] == Axis::Broadcast || strides[a][d] == 0 {
                        Axis::Broadcast
                    } else if last && strides[a][d] == 1 && !mapped {
                        Axis::Unit
                    } else {
                        Axis::Strided
                    };
                    if axis == Axis::Broadcast {
                        strides[a][d] = 0;
                    }
                    axis
                })
                .collect();
        }
        for r in &mut ir.reductions {
            r.reduced = self.origin.iter().map(|&(o, _)| r.reduced[o]).collect();
        }
        ir.rank = rank;
        let launch = Launch {
            sizes: self.sizes,
            strides,
            offsets: self.offsets,
            maps: self.maps,
            ranges: Vec::new(),
            gathers: Vec::new(),
        };
        (ir, launch)
    }
}
