//! A strided convolution's image split into phases, so that the GEMM reads it in place.
//!
//! At stride `s`, the output positions of one output row read every `s`-th element of an image
//! row for each kernel offset. The GEMM packed those gathers for every column block (a quarter
//! of a strided ResNet block's time). Splitting each strided axis of the padded image into its
//! `s` phases (the elements whose coordinate leaves remainder `r`, one after another) makes
//! them neighbours: for a fixed kernel offset, neighbouring output positions read neighbouring
//! elements of one phase, and the GEMM reads B in place, as it reads a stride-1 convolution's
//! padded image. The price is one copy of the image per product into a buffer kept from one
//! product to the next (`KeptPadding`), what building the padded image costs a stride-1
//! convolution.
//!
//! For padded shape `P`, first split axis `t` and phase counts `f` (1 on the axes from `t` on
//! that no output position moves along), the split buffer has shape
//! `P[..t] ++ f[t..] ++ ceil(P[a] / f[a]) for a in t..`, and the element at padded coordinates
//! `y` lies at `(y[..t], y[t..] % f, y[t..] / f)`. Where an output position sub-axis moves `f[a]`
//! along axis `a`, a B element's remainder depends on its row (channel and kernel offset)
//! alone and its quotient on its row plus its column: the rows get a table of offsets, the
//! columns stay sub-axes with strides.

use crate::runtime::matmul::StridedProduct;
use crate::shape::Padding;

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

    /// The offset in the split buffer (of `strides`, contiguous over [`Phases::shape`]) of
    /// the element at padded coordinates `y` (each inside the padded shape).
    fn offset(&self, strides: &[i64], y: &[i64]) -> i64 {
        let (t, rank) = (self.first, y.len());
        let split = rank - t;
        (0..rank)
            .map(|a| match a < t {
                true => y[a] * strides[a],
                false => {
                    let f = self.factors[a] as i64;
                    (y[a] % f) * strides[a] + (y[a] / f) * strides[a + split]
                }
            })
            .sum()
    }

    /// `fusebox_phase_rows`'s sizes: rank, first split axis, then per axis the source's size,
    /// the zeros before and after it, and the phase count.
    pub fn geometry(&self) -> Vec<i64> {
        let p = &self.padding;
        [p.source.len(), self.first]
            .into_iter()
            .chain(p.source.iter().copied())
            .chain(p.before.iter().copied())
            .chain(p.after.iter().copied())
            .chain(self.factors.iter().copied())
            .map(|n| n as i64)
            .collect()
    }
}

/// `product`, whose right-hand operand reads `padding`'s padded image (offsets and strides
/// over the padded shape) with its columns at a stride, moved onto the image's phase split:
/// the split, the product over the split buffer (B's columns as sub-axes, its row sub-axes
/// left as one placeholder axis), and B's row offsets. `None` where the view is not a
/// convolution's windows over the padded shape that a split makes neighbours of: each
/// column sub-axis moving along one axis of its own, the innermost one by more than 1, each
/// batch matrix starting at the same place on the split axes, and every element read inside
/// the split buffer.
pub fn split(
    product: &StridedProduct,
    padding: &Padding,
) -> Option<(Phases, StridedProduct, Vec<i64>)> {
    let [rows, cols] = product.b_split.clone()?;
    let sub: Vec<(usize, i64)> = rows.iter().chain(&cols).copied().collect();
    let first = padding.coordinates(product.offsets.first()?.1, &sub)?;
    let (row_steps, col_steps) = first.steps.split_at(rows.len());
    let rank = padding.source.len();
    // Each column sub-axis's axis and step.
    let mut factors = vec![1usize; rank];
    let mut moved = Vec::with_capacity(cols.len());
    for (step, &(n, _)) in col_steps.iter().zip(&cols) {
        let along: Vec<usize> = (0..rank).filter(|&a| step[a] != 0).collect();
        match along[..] {
            [a] if step[a] > 0 && factors[a] == 1 => {
                factors[a] = step[a] as usize;
                moved.push(a);
            }
            [] if n == 1 => moved.push(rank),
            _ => return None,
        }
    }
    match moved.last() {
        Some(&a) if a < rank && factors[a] >= 2 => {}
        _ => return None,
    }
    let t = *moved.iter().filter(|&&a| a < rank).min()?;
    let phases = Phases {
        padding: padding.clone(),
        first: t,
        factors,
    };
    let shape = phases.shape();
    let strides = crate::shape::Strided::contiguous(&shape).strides;
    let len = i64::try_from(crate::shape::numel(&shape)).ok()?;
    // B's rows: the coordinates each reaches from the first matrix's start.
    let k = product.inner;
    let mut table = Vec::with_capacity(k);
    let mut at = vec![0usize; rows.len()];
    let mut y = first.start.clone();
    for _ in 0..k {
        table.push(phases.offset(&strides, &y));
        for d in (0..rows.len()).rev() {
            at[d] += 1;
            for (c, s) in y.iter_mut().zip(&row_steps[d]) {
                *c += s;
            }
            if at[d] < rows[d].0 {
                break;
            }
            for (c, s) in y.iter_mut().zip(&row_steps[d]) {
                *c -= s * rows[d].0 as i64;
            }
            at[d] = 0;
        }
    }
    // Columns: one quotient step of their axis per step.
    let split = rank - t;
    let columns: Vec<(usize, i64)> = cols
        .iter()
        .zip(&moved)
        .map(|(&(n, _), &a)| (n, if a < rank { strides[a + split] } else { 0 }))
        .collect();
    let reach: i64 = columns.iter().map(|&(n, s)| (n as i64 - 1) * s).sum();
    // Batch matrices: moved along the axes before the split ones only.
    let mut offsets = Vec::with_capacity(product.offsets.len());
    for &(a, b) in &product.offsets {
        let c = padding.coordinates(b, &sub)?;
        if (t..rank).any(|d| c.start[d] != first.start[d]) {
            return None;
        }
        let shift: i64 = (0..t)
            .map(|d| (c.start[d] - first.start[d]) * strides[d])
            .sum();
        offsets.push((a, shift));
    }
    let low = table.iter().min()? + offsets.iter().map(|o| o.1).min()?;
    let high = table.iter().max()? + offsets.iter().map(|o| o.1).max()? + reach;
    if low < 0 || high >= len {
        return None;
    }
    let moved = StridedProduct {
        b_strides: [1, columns.last()?.1],
        b_split: Some([vec![(k, 1)], columns]),
        offsets,
        ..product.clone()
    };
    Some((phases, moved, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x3 convolution at stride 2 with padding 1 over a [1, 2, 5, 6] image: its B over the
    /// padded [1, 2, 7, 8] image, split into 2 x 2 phases of [4, 4] each.
    #[test]
    fn a_stride_2_convolution_reads_each_element_from_its_phase() {
        let padding = Padding {
            source: vec![1, 2, 5, 6],
            before: vec![0, 0, 1, 1],
            after: vec![0, 0, 1, 1],
        };
        // Rows (channel, kh, kw), columns (oh, ow): 3 x 3 outputs.
        let product = StridedProduct {
            batch: vec![1],
            rows: 4,
            inner: 18,
            cols: 9,
            a_strides: [18, 1],
            b_strides: [1, 2],
            offsets: vec![(0, 0)],
            a_split: None,
            b_split: Some([vec![(2, 56), (3, 8), (3, 1)], vec![(3, 16), (3, 2)]]),
        };
        let (phases, moved, rows) = split(&product, &padding).unwrap();
        assert_eq!(phases.shape(), [1, 2, 2, 2, 4, 4]);
        let [_, cols] = moved.b_split.clone().unwrap();
        assert_eq!(cols, [(3, 4), (3, 1)]);
        // Element (k, c) of B is padded element (channel, 2 oh + kh, 2 ow + kw), which lies
        // in phase (y % 2, x % 2) at (y / 2, x / 2).
        for k in 0..18 {
            let (ch, kh, kw) = (k / 9, k / 3 % 3, k % 3);
            for c in 0..9 {
                let (y, x) = (2 * (c / 3) + kh, 2 * (c % 3) + kw);
                let want = ch * 64 + (y % 2 * 2 + x % 2) * 16 + y / 2 * 4 + x / 2;
                let got = rows[k] + (c / 3) as i64 * 4 + (c % 3) as i64;
                assert_eq!(got, want as i64, "k {k} c {c}");
            }
        }
    }

    /// Columns at unit stride (a stride-1 convolution) are not split.
    #[test]
    fn unit_strides_are_not_split() {
        let padding = Padding {
            source: vec![1, 1, 4, 4],
            before: vec![0, 0, 1, 1],
            after: vec![0, 0, 1, 1],
        };
        let product = StridedProduct {
            batch: vec![1],
            rows: 1,
            inner: 9,
            cols: 16,
            a_strides: [9, 1],
            b_strides: [1, 1],
            offsets: vec![(0, 0)],
            a_split: None,
            b_split: Some([vec![(3, 6), (3, 1)], vec![(4, 6), (4, 1)]]),
        };
        assert!(split(&product, &padding).is_none());
    }
}
