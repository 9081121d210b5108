//! A convolution's image as the GEMM reads it: padded, and at a stride split into phases.
//!
//! At stride `s`, the output positions of one output row read every `s`-th element of an image
//! row for each kernel offset; the GEMM packed those gathers for every column block (a quarter
//! of a strided ResNet block's time). Splitting each strided axis of the padded image into its
//! `s` phases (the elements whose coordinate leaves remainder `r`, one after another) makes
//! them neighbours: for a fixed kernel offset, neighbouring output positions read neighbouring
//! elements of one phase. The split buffer is never built: for each column block and K slice
//! the GEMM copies the runs of it that block reads into a slab (`fb_gemm_image` in `gemm.c`),
//! making the padding's zeros as it copies. At stride 1 nothing is split and the slabs hold
//! runs of the padded image.
//!
//! For padded shape `P`, first split axis `t` and phase counts `f` (1 on the axes from `t` on
//! that no output position moves along), the split buffer has shape
//! `P[..t] ++ f[t..] ++ ceil(P[a] / f[a]) for a in t..`, and the element at padded coordinates
//! `y` lies at `(y[..t], y[t..] % f, y[t..] / f)`: an *outer index* (the axes before the
//! quotients) and a *quotient offset*. Where an output position sub-axis moves `f[a]` along
//! axis `a`, a B element's outer index depends on its row (channel and kernel offset) alone
//! and its quotient offset on its row plus its column: the rows get a table of both, the
//! columns stay sub-axes with strides.

use crate::runtime::matmul::{StridedProduct, sub_axes_offset};
use crate::shape::{Coordinates, Padding};

/// How a padded image is split: its padding, the first split axis and each axis's phases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phases {
    pub padding: Padding,
    /// The first split axis (`t` above).
    pub first: usize,
    /// Per axis of the padded shape, its phase count (1 before `first`).
    pub factors: Vec<usize>,
}

impl Phases {
    /// The split buffer's shape.
    pub fn shape(&self) -> Vec<usize> {
        let padded = self.padding.padded();
        let t = self.first;
        padded[..t]
            .iter()
            .copied()
            .chain(self.factors[t..].iter().copied())
            .chain((t..padded.len()).map(|a| padded[a].div_ceil(self.factors[a])))
            .collect()
    }

    /// The split buffer's outer indices (its axes before the quotients) and the quotient
    /// offsets within one outer index.
    pub fn extents(&self) -> (usize, usize) {
        let shape = self.shape();
        let split = self.padding.source.len() - self.first;
        let at = shape.len() - split;
        (shape[..at].iter().product(), shape[at..].iter().product())
    }

    /// The outer index and quotient offset of the element at padded coordinates `y` (each
    /// inside the padded shape), `strides` being the split buffer's (contiguous over
    /// [`Phases::shape`]) and `quotients` the quotient offsets per outer index.
    fn place(&self, strides: &[i64], quotients: i64, y: &[i64]) -> (i64, i64) {
        let (t, rank) = (self.first, y.len());
        let split = rank - t;
        let (mut outer, mut offset) = (0i64, 0i64);
        for a in 0..rank {
            let f = self.factors[a] as i64;
            // Before the split axes a coordinate is a place; from them on, a phase and a
            // quotient.
            let (whole, quotient) = if a < t {
                (y[a], 0)
            } else {
                (y[a] % f, y[a] / f)
            };
            outer += whole * (strides[a] / quotients);
            if a >= t {
                offset += quotient * strides[a + split];
            }
        }
        (outer, offset)
    }
}

/// A convolution's right-hand operand read from its image as its phase split would hold it
/// (`fb_gemm_image` in `gemm.c`): the split, the product moved onto the split (each batch
/// matrix's offset now its outer index shift, B's columns as sub-axes of quotient offsets,
/// its rows left as one placeholder axis), and per row of B its outer index and quotient
/// offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRead {
    pub phases: Phases,
    pub product: StridedProduct,
    pub outer: Vec<i64>,
    pub offset: Vec<i64>,
}

/// `product`, whose right-hand operand reads `padding`'s padded image (offsets and strides
/// over the padded shape), as an [`ImageRead`]. `None` where the view is not a convolution's
/// windows that the split reads at rising quotient offsets: each column sub-axis moving along
/// one axis of its own (its step there the axis's phase count), outer ones by more than all
/// inner ones reach, at most twice as many quotient offsets spanned as there are columns,
/// and each batch matrix starting at the same place on the split axes.
pub fn image_read(product: &StridedProduct, padding: &Padding) -> Option<ImageRead> {
    let [rows, cols] = product.b_split.clone()?;
    let sub: Vec<(usize, i64)> = rows.iter().chain(&cols).copied().collect();
    let first = padding.coordinates(product.offsets.first()?.1, &sub)?;
    let (row_steps, col_steps) = first.steps.split_at(rows.len());
    let rank = padding.source.len();
    // Each column sub-axis's axis (`rank` for a sub-axis of size 1, which moves nowhere).
    let mut factors = vec![1usize; rank];
    let mut along = Vec::with_capacity(cols.len());
    for (step, &(n, _)) in col_steps.iter().zip(&cols) {
        match Coordinates::single_axis(step) {
            Some((a, f)) if factors[a] == 1 && !along.contains(&a) => {
                factors[a] = f;
                along.push(a);
            }
            _ if n == 1 => along.push(rank),
            _ => return None,
        }
    }
    let t = *along.iter().filter(|&&a| a < rank).min()?;
    let phases = Phases {
        padding: padding.clone(),
        first: t,
        factors,
    };
    let strides = crate::shape::Strided::contiguous(&phases.shape()).strides;
    let (outers, inner) = phases.extents();
    let split = rank - t;
    // Columns: one quotient step of their axis per step, rising.
    let columns: Vec<(usize, i64)> = cols
        .iter()
        .zip(&along)
        .map(|(&(n, _), &a)| (n, if a < rank { strides[a + split] } else { 0 }))
        .collect();
    let mut reach = 0i64;
    for &(n, stride) in columns.iter().rev() {
        if n > 1 && stride <= reach {
            return None;
        }
        reach += (n as i64 - 1) * stride;
    }
    if reach + 1 > 2 * product.cols.max(1) as i64 {
        return None;
    }
    // B's rows: the place of the coordinates each reaches from the first matrix's start.
    let k = product.inner;
    // Per axis, the row sub-axes' coordinate steps along it: row k's coordinate there is the
    // first matrix's start plus k's offset through them.
    let along: Vec<Vec<(usize, i64)>> = (0..rank)
        .map(|a| {
            rows.iter()
                .zip(row_steps)
                .map(|(&(n, _), step)| (n, step[a]))
                .collect()
        })
        .collect();
    let (outer, offset): (Vec<i64>, Vec<i64>) = (0..k)
        .map(|i| {
            let y: Vec<i64> = (0..rank)
                .map(|a| first.start[a] + sub_axes_offset(&along[a], i))
                .collect();
            phases.place(&strides, inner as i64, &y)
        })
        .unzip();
    // Batch matrices: moved along the axes before the split ones only.
    let mut offsets = Vec::with_capacity(product.offsets.len());
    for &(a, b) in &product.offsets {
        let c = padding.coordinates(b, &sub)?;
        if (t..rank).any(|d| c.start[d] != first.start[d]) {
            return None;
        }
        let shift: i64 = (0..t)
            .map(|d| (c.start[d] - first.start[d]) * (strides[d] / inner as i64))
            .sum();
        offsets.push((a, shift));
    }
    let shifts = offsets.iter().map(|o| o.1);
    let (low, high) = (shifts.clone().min()?, shifts.max()?);
    if outer.iter().min()? + low < 0
        || outer.iter().max()? + high >= outers as i64
        || *offset.iter().min()? < 0
        || offset.iter().max()? + reach >= inner as i64
    {
        return None;
    }
    let product = StridedProduct {
        b_strides: [1, columns.last()?.1],
        b_split: Some([vec![(k, 1)], columns]),
        offsets,
        ..product.clone()
    };
    Some(ImageRead {
        phases,
        product,
        outer,
        offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x3 convolution over a [1, 2, 5, 6] image padded by 1, as im2col's B over the padded
    /// [1, 2, 7, 8] image: rows (channel, kh, kw), columns (oh, ow) at `stride`.
    fn convolution(stride: i64, outputs: usize) -> (StridedProduct, Padding) {
        let padding = Padding {
            source: vec![1, 2, 5, 6],
            before: vec![0, 0, 1, 1],
            after: vec![0, 0, 1, 1],
        };
        let product = StridedProduct {
            batch: vec![1],
            rows: 4,
            inner: 18,
            cols: outputs * outputs,
            a_strides: [18, 1],
            b_strides: [1, stride],
            offsets: vec![(0, 0)],
            a_split: None,
            b_split: Some([
                vec![(2, 56), (3, 8), (3, 1)],
                vec![(outputs, 8 * stride), (outputs, stride)],
            ]),
        };
        (product, padding)
    }

    /// At stride 2 the image splits into 2 x 2 phases of [4, 4]: element (k, c) of B is padded
    /// element (channel, 2 oh + kh, 2 ow + kw), which lies in phase (y % 2, x % 2) of its
    /// channel at quotient (y / 2, x / 2).
    #[test]
    fn a_stride_2_convolution_reads_each_element_from_its_phase() {
        let (product, padding) = convolution(2, 3);
        let read = image_read(&product, &padding).unwrap();
        assert_eq!(read.phases.shape(), [1, 2, 2, 2, 4, 4]);
        assert_eq!(read.phases.extents(), (8, 16));
        let [_, cols] = read.product.b_split.clone().unwrap();
        assert_eq!(cols, [(3, 4), (3, 1)]);
        for k in 0..18 {
            let (ch, kh, kw) = (k / 9, k / 3 % 3, k % 3);
            for c in 0..9 {
                let (y, x) = (2 * (c / 3) + kh, 2 * (c % 3) + kw);
                let outer = ch * 4 + y % 2 * 2 + x % 2;
                let offset = y / 2 * 4 + x / 2;
                assert_eq!(read.outer[k], outer as i64, "k {k}");
                let column = (c / 3) as i64 * 4 + (c % 3) as i64;
                assert_eq!(read.offset[k] + column, offset as i64, "k {k} c {c}");
            }
        }
    }

    /// At stride 1 nothing splits: one phase per channel, quotients the padded coordinates.
    #[test]
    fn a_stride_1_convolution_reads_its_padded_image() {
        let (product, padding) = convolution(1, 5);
        let read = image_read(&product, &padding).unwrap();
        assert_eq!(read.phases.extents(), (2, 56));
        assert_eq!(read.outer[9], 1);
        assert_eq!(read.offset[4], 9);
    }

    /// Columns whose offsets would not rise (an outer sub-axis stepping less than the inner
    /// one reaches) are refused.
    #[test]
    fn columns_that_overlap_are_refused() {
        let (mut product, padding) = convolution(1, 5);
        product.b_split.as_mut().unwrap()[1] = vec![(2, 1), (4, 1)];
        product.cols = 8;
        assert!(image_read(&product, &padding).is_none());
    }
}
