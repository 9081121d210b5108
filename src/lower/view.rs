//! Views: how a buffer of some shape is addressed over a kernel's iteration domain.
//!
//! A buffer is stored contiguously (row-major) in its own shape. Seen over a domain it is
//! right-aligned against the domain's axes, as NumPy broadcasting aligns shapes: an axis the
//! buffer lacks, or where it has size 1, is [`Axis::Broadcast`] (stride 0). The pattern is
//! decided by which dims are 1, never by sizes, so a kernel compiled for a batch of 1024 is
//! the kernel for a batch of 512.

use super::ir::{Axis, MapStage, View};
use crate::dtype::DType;
use crate::shape::{IndexMap, Strided};

/// Row-major strides of `shape`, in elements ([`Strided::contiguous`]).
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    Strided::contiguous(shape).strides
}

/// How a view that is not broadcast along axis `d` of `rank` moves: unit stride on the
/// innermost axis when its stride is 1, strided otherwise.
pub fn moving_axis(d: usize, rank: usize, stride: i64) -> Axis {
    if d + 1 == rank && stride == 1 {
        Axis::Unit
    } else {
        Axis::Strided
    }
}

/// The pattern of a view with `strides` over a domain of `sizes`: stride 0 or a size-1 axis
/// is a broadcast, the innermost axis with stride 1 is unit-stride, anything else strided.
/// Strides on broadcast axes are forced to 0 so run-time arguments match the pattern.
pub fn classify(dtype: DType, sizes: &[usize], strides: &mut [i64]) -> View {
    let rank = sizes.len();
    let axes = (0..rank)
        .map(|d| {
            if sizes[d] == 1 || strides[d] == 0 {
                strides[d] = 0;
                Axis::Broadcast
            } else {
                moving_axis(d, rank, strides[d])
            }
        })
        .collect();
    View::strided(dtype, axes)
}

/// A contiguous buffer of `shape`, broadcast over `domain` (right-aligned). `None` when the
/// shape does not broadcast to the domain.
pub fn broadcast_view(dtype: DType, shape: &[usize], domain: &[usize]) -> Option<(View, Vec<i64>)> {
    strided_view(dtype, shape, &contiguous_strides(shape), domain)
}

/// A value of `shape` stored with `own` strides (a contiguous buffer, or a view into another
/// value's buffer that a slice, transpose or reshape makes), broadcast over `domain`
/// (right-aligned). `None` when the shape does not broadcast to the domain.
pub fn strided_view(
    dtype: DType,
    shape: &[usize],
    own: &[i64],
    domain: &[usize],
) -> Option<(View, Vec<i64>)> {
    if shape.len() > domain.len() {
        return None;
    }
    let lead = domain.len() - shape.len();
    let mut strides = vec![0i64; domain.len()];
    for (d, &n) in shape.iter().enumerate() {
        let target = domain[lead + d];
        if n == target {
            strides[lead + d] = own[d];
        } else if n != 1 {
            return None;
        }
    }
    let sizes: Vec<usize> = (0..domain.len())
        .map(|d| if d < lead { 1 } else { shape[d - lead] })
        .collect();
    let view = classify(dtype, &sizes, &mut strides);
    Some((view, strides))
}

/// A value of `shape` read through index map `map` (a view through reshapes no strides
/// express), broadcast over `domain`: the view, its launch strides and offset (of the
/// position, for a mapped view) and its launch stages. A map without stages is exactly
/// [`strided_view`]. A mapped view's `Unit` axis becomes `Strided`: consecutive positions are
/// not consecutive elements, so no emitter may read it as a contiguous vector. `None` when the
/// shape does not broadcast to the domain.
pub fn mapped_view(
    dtype: DType,
    shape: &[usize],
    map: &IndexMap,
    domain: &[usize],
) -> Option<(View, Vec<i64>, i64, Vec<MapStage>)> {
    let (mut view, strides) = strided_view(dtype, shape, &map.outer.strides, domain)?;
    let stages: Vec<MapStage> = map
        .stages
        .iter()
        .map(|stage| MapStage {
            offset: stage.strided.offset,
            sizes: stage.shape.iter().map(|&n| n as i64).collect(),
            strides: stage.strided.strides.clone(),
        })
        .collect();
    if !stages.is_empty() {
        view.stages = stages.iter().map(|s| s.sizes.len()).collect();
        for axis in &mut view.axes {
            if *axis == Axis::Unit {
                *axis = Axis::Strided;
            }
        }
    }
    Some((view, strides, map.outer.offset, stages))
}

/// A rank-0 domain becomes `[1]`: every kernel has at least one axis.
pub fn domain_of(shape: &[usize]) -> Vec<usize> {
    if shape.is_empty() {
        vec![1]
    } else {
        shape.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType::F32;

    #[test]
    fn row_and_column_broadcasts() {
        let (v, s) = broadcast_view(F32, &[4, 1], &[4, 8]).unwrap();
        assert_eq!(v.axes, vec![Axis::Strided, Axis::Broadcast]);
        assert_eq!(s, vec![1, 0]);
        let (v, s) = broadcast_view(F32, &[8], &[4, 8]).unwrap();
        assert_eq!(v.axes, vec![Axis::Broadcast, Axis::Unit]);
        assert_eq!(s, vec![0, 1]);
        let (v, s) = broadcast_view(F32, &[4, 8], &[4, 8]).unwrap();
        assert_eq!(v.axes, vec![Axis::Strided, Axis::Unit]);
        assert_eq!(s, vec![8, 1]);
        assert!(broadcast_view(F32, &[3], &[4, 8]).is_none());
    }

    #[test]
    fn pattern_does_not_depend_on_batch() {
        let a = broadcast_view(F32, &[1024, 4096], &[1024, 4096]).unwrap().0;
        let b = broadcast_view(F32, &[512, 4096], &[512, 4096]).unwrap().0;
        assert_eq!(a, b);
    }
}
