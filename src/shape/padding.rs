//! A zero-padded buffer that exists only as a way of reading another: a convolution's padded
//! image, whose zeros a GEMM can produce while it packs the windows instead of a kernel
//! writing them to memory first.
//!
//! Views of it address the *padded* shape, row-major; where an element lies outside the
//! source it is zero. A reader that cannot skip the zeros builds the padded buffer
//! ([`Padding::for_each_row`] places the source in it); one that can (the CPU GEMM's packers) reads the source
//! through [`Padding::coordinates`], which turns the view's steps into steps along each
//! padded axis, so that a run of the view's elements can be cut into its zeros and its loads
//! with a few comparisons.

/// `source` (row-major, contiguous) surrounded by `before[d]` zeros before and `after[d]`
/// after along each axis `d`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Padding {
    pub source: Vec<usize>,
    pub before: Vec<usize>,
    pub after: Vec<usize>,
}

/// A view of a padded buffer in coordinates: for each of the view's sub-axes, how far one
/// step moves along each padded axis, and where the view starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinates {
    /// The coordinate of the view's first element on each padded axis.
    pub start: Vec<i64>,
    /// Per sub-axis of the view, its step along each padded axis.
    pub steps: Vec<Vec<i64>>,
}

impl Coordinates {
    /// The one padded axis a sub-axis with these steps (one of [`Coordinates::steps`]) moves
    /// along, and its step there; `None` where it moves along several, none, or backwards.
    pub fn single_axis(steps: &[i64]) -> Option<(usize, usize)> {
        let mut moved = (0..steps.len()).filter(|&a| steps[a] != 0);
        match (moved.next(), moved.next()) {
            (Some(a), None) if steps[a] > 0 => Some((a, steps[a] as usize)),
            _ => None,
        }
    }
}

impl Padding {
    /// `source` unpadded, as a padding of zeros on every side: for readers that take one.
    pub fn none(source: &[usize]) -> Padding {
        Padding {
            source: source.to_vec(),
            before: vec![0; source.len()],
            after: vec![0; source.len()],
        }
    }

    /// The padding through which a view with `padding` (of `source`, or none) reads
    /// `source`'s buffer; `None` where `padding` pads another shape.
    pub fn of_view<'a>(
        padding: Option<&'a Padding>,
        source: &[usize],
    ) -> Option<std::borrow::Cow<'a, Padding>> {
        match padding {
            Some(p) => (p.source == source).then_some(std::borrow::Cow::Borrowed(p)),
            None => Some(std::borrow::Cow::Owned(Padding::none(source))),
        }
    }

    /// The shape views of it address.
    pub fn padded(&self) -> Vec<usize> {
        (0..self.source.len())
            .map(|d| self.source[d] + self.before[d] + self.after[d])
            .collect()
    }

    /// Elements of the padded shape; `None` past `usize`.
    pub fn padded_len(&self) -> Option<usize> {
        (0..self.source.len()).try_fold(1usize, |n, d| {
            n.checked_mul(
                self.source[d]
                    .checked_add(self.before[d])?
                    .checked_add(self.after[d])?,
            )
        })
    }

    /// The padding of `inner` (a padding of the same source, or the source itself as a
    /// padding of zeros) padded again by `before` and `after` along `axis`: one padding.
    pub fn around(
        inner: Option<&Padding>,
        source: &[usize],
        axis: usize,
        before: usize,
        after: usize,
    ) -> Padding {
        let mut padding = inner.cloned().unwrap_or_else(|| Padding::none(source));
        padding.before[axis] += before;
        padding.after[axis] += after;
        padding
    }

    /// The view with first element `offset` and sub-axes `sub_axes` ((size, stride) pairs, over
    /// the padded shape's row-major offsets) in coordinates, where each stride is a whole
    /// step along the padded axes and the view stays inside the padded shape on every axis:
    /// then a row-major offset and its coordinates say the same, and the coordinates tell the
    /// zeros from the source's elements. `None` otherwise (the reader then materializes).
    pub fn coordinates(&self, offset: i64, sub_axes: &[(usize, i64)]) -> Option<Coordinates> {
        let padded = self.padded();
        if padded.contains(&0) || i64::try_from(self.padded_len()?).is_err() {
            return None;
        }
        // Its strides are exact: the whole padded shape fits.
        let place = super::Strided::contiguous(&padded).strides;
        // Each step split greedily from the outermost axis: exact when the result stays in
        // bounds, which is checked below for every element the view reaches.
        let split = |mut t: i64| -> Vec<i64> {
            place
                .iter()
                .map(|&p| {
                    let c = t / p;
                    t -= c * p;
                    c
                })
                .collect()
        };
        let start = split(offset);
        let steps: Vec<Vec<i64>> = sub_axes.iter().map(|&(_, s)| split(s)).collect();
        for d in 0..padded.len() {
            let (mut low, mut high) = (start[d], start[d]);
            for (&(n, _), step) in sub_axes.iter().zip(&steps) {
                let reach = step[d].checked_mul(n.checked_sub(1)? as i64)?;
                low = low.checked_add(reach.min(0))?;
                high = high.checked_add(reach.max(0))?;
            }
            if low < 0 || high >= padded[d] as i64 {
                return None;
            }
        }
        Some(Coordinates { start, steps })
    }

    /// Calls `copy(from, to, len)` for each row of the source (its innermost axis): `len`
    /// elements at element `from` of the source go to element `to` of the padded buffer.
    pub fn for_each_row(&self, mut copy: impl FnMut(usize, usize, usize)) {
        let rank = self.source.len();
        let count = crate::shape::numel(&self.source);
        if count == 0 {
            return;
        }
        if rank == 0 {
            copy(0, 0, 1);
            return;
        }
        let place = super::Strided::contiguous(&self.padded()).strides;
        let row = self.source[rank - 1];
        for r in 0..count / row {
            let (mut rest, mut at) = (r, self.before[rank - 1]);
            for d in (0..rank - 1).rev() {
                at += (rest % self.source[d] + self.before[d]) * place[d] as usize;
                rest /= self.source[d];
            }
            copy(r * row, at, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_axis_moves_along_one_axis_or_none() {
        assert_eq!(Coordinates::single_axis(&[0, 2, 0]), Some((1, 2)));
        assert_eq!(Coordinates::single_axis(&[0, 0, 0]), None);
        assert_eq!(Coordinates::single_axis(&[1, 0, 1]), None);
        assert_eq!(Coordinates::single_axis(&[0, -1, 0]), None);
    }

    #[test]
    fn a_view_reads_its_own_padding_or_none() {
        let p = Padding::around(None, &[2, 3], 1, 1, 2);
        assert_eq!(*Padding::of_view(Some(&p), &[2, 3]).unwrap(), p);
        assert_eq!(Padding::of_view(Some(&p), &[3, 3]), None);
        let none = Padding::of_view(None, &[2, 3]).unwrap();
        assert_eq!(
            (none.padded(), none.before.clone()),
            (vec![2, 3], vec![0, 0])
        );
    }

    fn padding() -> Padding {
        // A [2, 3, 4] source padded by 1 and 2 on the middle axis, 1 and 0 on the last.
        Padding {
            source: vec![2, 3, 4],
            before: vec![0, 1, 1],
            after: vec![0, 2, 0],
        }
    }

    #[test]
    fn materializing_puts_the_source_inside_zeros() {
        let p = padding();
        assert_eq!(p.padded(), vec![2, 6, 5]);
        let source: Vec<u8> = (1..=24).collect();
        let mut out = vec![0u8; p.padded_len().unwrap()];
        p.for_each_row(|from, to, len| {
            out[to..to + len].copy_from_slice(&source[from..from + len])
        });
        assert_eq!(out.len(), 60);
        for (q, &v) in out.iter().enumerate() {
            let (a, b, c) = (q / 30, q / 5 % 6, q % 5);
            let inside = (1..4).contains(&b) && c >= 1;
            let expected = if inside {
                (a * 12 + (b - 1) * 4 + (c - 1) + 1) as u8
            } else {
                0
            };
            assert_eq!(v, expected, "at {q}");
        }
    }

    #[test]
    fn coordinates_follow_the_padded_axes() {
        let p = padding();
        // Rows of windows: one step down the middle axis (5), one across (1), a whole
        // matrix (30).
        let c = p.coordinates(6, &[(2, 30), (3, 5), (4, 1)]).unwrap();
        assert_eq!(c.start, vec![0, 1, 1]);
        assert_eq!(c.steps, vec![vec![1, 0, 0], vec![0, 1, 0], vec![0, 0, 1]]);
        // A view that would leave the padded shape along the last axis (carrying into the
        // middle one) is not in coordinates.
        assert!(p.coordinates(2, &[(4, 1)]).is_none());
        // An empty padded shape has no coordinates (nothing to read).
        let empty = Padding {
            source: vec![0, 3],
            before: vec![0, 1],
            after: vec![0, 0],
        };
        assert!(empty.coordinates(0, &[(4, 1)]).is_none());
        // Backwards steps stay exact while in bounds.
        let c = p.coordinates(29, &[(5, -1)]).unwrap();
        assert_eq!((c.start, c.steps), (vec![0, 5, 4], vec![vec![0, 0, -1]]));
    }

    #[test]
    fn paddings_nest_into_one() {
        let inner = Padding::around(None, &[2, 3], 0, 1, 1);
        let outer = Padding::around(Some(&inner), &[2, 3], 1, 2, 0);
        assert_eq!(outer.before, vec![1, 2]);
        assert_eq!(outer.after, vec![1, 0]);
        assert_eq!(outer.padded(), vec![4, 5]);
    }
}
