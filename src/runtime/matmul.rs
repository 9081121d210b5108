//! Matrix products through `matrixmultiply` (a BLIS-style GEMM with packing and threads): the
//! portable product of the kernel-IR interpreter, and of the CPU backend for the products its
//! emitted GEMM (`backend::cpu::gemm`) does not cover (integer and f64 ones).
//!
//! Semantics are the reference evaluator's: NumPy matmul (1-D operands promoted, batch
//! dimensions broadcast), operands rounded to the product's dtype, f32 arithmetic for f16,
//! bf16 and f32 products, f64 for f64 products and wrapping i64 for integer ones, the result rounded to the product's dtype. An
//! absorbed cast (fusion.ron's `library_casts`) rounds each element while the operand is
//! converted into the layout the GEMM reads, so no cast kernel and no narrow copy exist.

use super::buffer::{Buffer, Elements, ElementsMut};
use crate::dtype::{Category, DType};
use crate::lower::MatMulOperand;
use crate::tensor::{float_to_int, wrap_int};

/// Why a matrix product cannot run on the buffers it was given: the program and its buffers
/// disagree (an internal invariant broke), or the operand shapes do not multiply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatMulError {
    #[error("matmul operands must have at least one dimension")]
    Scalar,
    #[error("matmul inner dims differ: {a:?} @ {b:?}")]
    InnerDims { a: Vec<usize>, b: Vec<usize> },
    #[error(transparent)]
    Batch(#[from] crate::shape::ShapeError),
    /// The result's element count (`total`) is not the output buffer's (`len`).
    #[error("matmul result has {total} elements, buffer {len}")]
    ResultSize { total: usize, len: usize },
    /// The emitted CPU GEMM (`backend::cpu::gemm`) could not allocate its packing buffers.
    #[error("the GEMM could not allocate its packing buffers")]
    PackingAlloc,
    /// An operand's view addresses elements outside its buffer (an internal invariant: the
    /// lowering composes views from the graph's checked shapes).
    #[error("the {operand} operand's view reads outside its buffer")]
    ViewOutOfBounds { operand: &'static str },
    /// cuBLAS planning found no group of batch matrices to cover (an internal invariant:
    /// single matrices always group).
    #[error("no batch grouping found (single matrices always group)")]
    NoGrouping,
}

/// An operand as the GEMM reads it: contiguous, at compute precision.
enum Packed<'a, T> {
    Borrowed(&'a [T]),
    Owned(Vec<T>),
}

impl<T> Packed<'_, T> {
    fn slice(&self) -> &[T] {
        match self {
            Packed::Borrowed(s) => s,
            Packed::Owned(v) => v,
        }
    }
}

fn pack_f64(buf: Elements<'_>, op: &MatMulOperand, out: DType) -> Vec<f64> {
    (0..buf.len())
        .map(|i| {
            let v = buf.get(i);
            let v = op.cast.map_or(v, |c| c.round(v));
            out.round(v)
        })
        .collect()
}

/// An operand of an integer product as exact integers in the product's dtype: an integer
/// element (through an absorbed integer cast, if any) wraps, anything else converts as a cast.
fn pack_int(buf: Elements<'_>, op: &MatMulOperand, out: DType) -> Vec<i64> {
    let exact = buf.dtype.category() == Category::Integer
        && op.cast.is_none_or(|c| c.category() == Category::Integer);
    (0..buf.len())
        .map(|i| {
            if exact {
                let v = buf.get_int(i);
                wrap_int(out, op.cast.map_or(v, |c| wrap_int(c, v)))
            } else {
                let v = buf.get(i);
                float_to_int(out, op.cast.map_or(v, |c| c.round(v)))
            }
        })
        .collect()
}

/// `v` (an f32 value) rounded to `dtype` when that is a float of at most 32 bits; rounding
/// an exact f32 once is what [`DType::round`] does for such values.
fn round_f32(dtype: DType, v: f32) -> Option<f32> {
    match dtype {
        DType::F32 => Some(v),
        DType::F16 => Some(half::f16::from_f32(v).to_f32()),
        DType::BF16 => Some(half::bf16::from_f32(v).to_f32()),
        _ => None,
    }
}

/// The f32 fast path: an f32/f16/bf16 operand rounded through f32-sized floats only, one
/// pass without going through f64 (AMP's f16 and bf16 operands take this path).
fn pack_narrow(buf: Elements<'_>, op: &MatMulOperand, out: DType) -> Option<Vec<f32>> {
    let steps = [op.cast.unwrap_or(DType::F32), out];
    if steps.iter().any(|&d| round_f32(d, 0.0).is_none()) {
        return None;
    }
    let round = |v: f32| {
        steps
            .iter()
            .fold(v, |v, &d| round_f32(d, v).expect("checked above"))
    };
    match (buf.as_f32(), buf.as_u16()) {
        (Some(s), _) => Some(s.iter().map(|&v| round(v)).collect()),
        (_, Some(bits)) if buf.dtype == DType::F16 => Some(
            bits.iter()
                .map(|&b| round(half::f16::from_bits(b).to_f32()))
                .collect(),
        ),
        (_, Some(bits)) => Some(
            bits.iter()
                .map(|&b| round(half::bf16::from_bits(b).to_f32()))
                .collect(),
        ),
        _ => None,
    }
}

fn pack_f32<'a>(buf: Elements<'a>, op: &MatMulOperand, out: DType) -> Packed<'a, f32> {
    match buf.as_f32() {
        Some(s) if op.cast.is_none() && out == DType::F32 => Packed::Borrowed(s),
        _ => Packed::Owned(pack_narrow(buf, op, out).unwrap_or_else(|| {
            pack_f64(buf, op, out)
                .into_iter()
                .map(|v| v as f32)
                .collect()
        })),
    }
}

/// The matrices of a (batched, broadcast) product: each result matrix is `rows x cols`, the
/// sum over `inner`; `offsets[i]` are the element offsets of result matrix `i`'s operand
/// matrices in the contiguous operands (result matrix `i` starts at `i * rows * cols`), over
/// the broadcast batch dimensions `batch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductShape {
    pub rows: usize,
    pub inner: usize,
    pub cols: usize,
    pub batch: Vec<usize>,
    pub offsets: Vec<(usize, usize)>,
}

impl ProductShape {
    /// The matrices of `a @ b` under NumPy's matmul rules (1-D operands promoted, batch
    /// dimensions broadcast): what every GEMM fusebox calls (the CPU's, cuBLAS's) runs.
    pub fn of(a: &[usize], b: &[usize]) -> Result<ProductShape, MatMulError> {
        if a.is_empty() || b.is_empty() {
            return Err(MatMulError::Scalar);
        }
        let (sa, sb) = (
            crate::shape::matmul_operand(a, false),
            crate::shape::matmul_operand(b, true),
        );
        let (rows, inner) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let cols = sb[sb.len() - 1];
        if sb[sb.len() - 2] != inner {
            return Err(MatMulError::InnerDims {
                a: a.to_vec(),
                b: b.to_vec(),
            });
        }
        let batch = crate::shape::broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2])?;
        let offsets = crate::shape::matmul_batch_offsets(&sa, &sb, &batch);
        Ok(ProductShape {
            rows,
            inner,
            cols,
            batch,
            offsets,
        })
    }
}

/// [`ProductShape::of`], checked against a result of `out_len` elements.
pub fn product_shape(
    a: &[usize],
    b: &[usize],
    out_len: usize,
) -> Result<ProductShape, MatMulError> {
    let shape = ProductShape::of(a, b)?;
    let total = shape.offsets.len() * shape.rows * shape.cols;
    if total != out_len {
        return Err(MatMulError::ResultSize {
            total,
            len: out_len,
        });
    }
    Ok(shape)
}

/// One operand of a product as a GEMM addresses it: its shape as the product sees it, where
/// each element lies in its buffer, and how many elements that buffer holds.
#[derive(Debug, Clone, Copy)]
pub struct OperandLayout<'a> {
    pub shape: &'a [usize],
    /// Over `shape`, or over `split`'s sub-axes where given.
    pub strided: &'a crate::shape::Strided,
    pub split: Option<&'a crate::shape::SplitAxes>,
    pub len: usize,
}

impl OperandLayout<'_> {
    /// The shape `strided` is a view of.
    fn strided_shape(&self) -> &[usize] {
        self.split.map_or(self.shape, |s| &s.fine)
    }

    /// Per axis of the operand as `matmul_operand` promotes it, its sub-axes as (size,
    /// stride) pairs, outermost first: one per axis, unless the view splits them.
    fn axes(&self, is_rhs: bool) -> Vec<Vec<(usize, i64)>> {
        if let Some(split) = self.split {
            return (0..self.shape.len())
                .map(|d| split.axis(self.strided, d))
                .collect();
        }
        let promoted = crate::shape::matmul_operand(self.shape, is_rhs);
        let strides = match (self.strided.strides.as_slice(), is_rhs) {
            (&[s], true) => vec![s, 0],
            (&[s], false) => vec![0, s],
            (all, _) => all.to_vec(),
        };
        promoted.into_iter().zip(strides).map(|a| vec![a]).collect()
    }
}

/// The element offset of index `i` along an axis made of `sub_axes` (row-major).
pub fn sub_axes_offset(sub_axes: &[(usize, i64)], i: usize) -> i64 {
    let mut rest = i;
    let mut at = 0i64;
    for &(n, s) in sub_axes.iter().rev() {
        let n = n.max(1);
        at = at.wrapping_add(((rest % n) as i64).wrapping_mul(s));
        rest /= n;
    }
    at
}

/// The matrices of a product of strided operands: each result matrix is `rows x cols`, the
/// sum over `inner`; result matrix `i` (contiguous, at `i * rows * cols`) multiplies the
/// operand matrices starting at elements `offsets[i]`, whose rows and columns step by
/// `a_strides` and `b_strides`. A batch dim of size 1 is broadcast (step 0); a 1-D operand
/// is promoted as NumPy promotes it, with step 0 along the axis it gains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StridedProduct {
    /// The broadcast batch dims, whose matrices `offsets` lists row-major.
    pub batch: Vec<usize>,
    pub rows: usize,
    pub inner: usize,
    pub cols: usize,
    pub a_strides: [i64; 2],
    pub b_strides: [i64; 2],
    pub offsets: Vec<(i64, i64)>,
    /// Where an operand's view splits its row and column axes into sub-axes (an im2col
    /// matrix), those sub-axes as (size, stride) pairs, outermost first; its strides above
    /// are then the innermost sub-axes'.
    pub a_split: Option<[Vec<(usize, i64)>; 2]>,
    pub b_split: Option<[Vec<(usize, i64)>; 2]>,
}

/// [`ProductShape::of`] for operands read through strides, checked against their buffers and,
/// where given, a result of `out_len` elements: every element a matrix addresses lies in its
/// buffer.
pub fn strided_product(
    a: OperandLayout<'_>,
    b: OperandLayout<'_>,
    out_len: Option<usize>,
) -> Result<StridedProduct, MatMulError> {
    let shape = match out_len {
        Some(len) => product_shape(a.shape, b.shape, len)?,
        None => ProductShape::of(a.shape, b.shape)?,
    };
    for (operand, name) in [(&a, "left"), (&b, "right")] {
        if !operand.strided.within(operand.strided_shape(), operand.len) {
            return Err(MatMulError::ViewOutOfBounds { operand: name });
        }
    }
    let (ta, tb) = (a.axes(false), b.axes(true));
    let batch = &shape.batch;
    // The element offset of batch matrix `idx` (row-major over `batch`) in one operand.
    let offset = |idx: usize, t: &[Vec<(usize, i64)>], base: i64| -> i64 {
        let lead = batch.len() - (t.len() - 2);
        let mut rest = idx;
        let mut at = base;
        for d in (0..batch.len()).rev() {
            let i = rest % batch[d].max(1);
            rest /= batch[d].max(1);
            if d >= lead {
                let sub = &t[d - lead];
                if sub.iter().map(|&(n, _)| n).product::<usize>() != 1 {
                    at = at.wrapping_add(sub_axes_offset(sub, i));
                }
            }
        }
        at
    };
    let offsets = (0..shape.offsets.len())
        .map(|i| {
            (
                offset(i, &ta, a.strided.offset),
                offset(i, &tb, b.strided.offset),
            )
        })
        .collect();
    // The matrix axes: their one stride, or their sub-axes (the innermost one's stride).
    let matrix = |t: &[Vec<(usize, i64)>], split: bool| {
        let axes = [t[t.len() - 2].clone(), t[t.len() - 1].clone()];
        let inner = |sub: &[(usize, i64)]| sub.last().map_or(0, |&(_, s)| s);
        ([inner(&axes[0]), inner(&axes[1])], split.then_some(axes))
    };
    let (a_strides, a_split) = matrix(&ta, a.split.is_some());
    let (b_strides, b_split) = matrix(&tb, b.split.is_some());
    Ok(StridedProduct {
        batch: shape.batch,
        rows: shape.rows,
        inner: shape.inner,
        cols: shape.cols,
        a_strides,
        b_strides,
        offsets,
        a_split,
        b_split,
    })
}

/// `out = a @ b` on buffers.
pub fn matmul(
    a: &Buffer,
    a_op: &MatMulOperand,
    b: &Buffer,
    b_op: &MatMulOperand,
    out: &mut Buffer,
) -> Result<(), MatMulError> {
    matmul_elements(a.elements(), a_op, b.elements(), b_op, out.elements_mut())
}

/// An operand read through a zero padding ([`crate::lower::OperandView::padding`]) as one
/// read through the same view from the padded buffer, built here: for readers that cannot
/// make the zeros as they read. `None` for an operand with no padding.
pub fn unpadded(
    x: Elements<'_>,
    op: &MatMulOperand,
    operand: &'static str,
) -> Result<Option<(Buffer, MatMulOperand)>, MatMulError> {
    unpadded_by(x, op, operand, Buffer::padded_from)
}

/// [`unpadded`] with the padded buffer built by `build` (as [`Buffer::padded_from`] builds
/// it: `None` where `x` is not the padding's source): a backend's own, faster copy.
pub fn unpadded_by(
    x: Elements<'_>,
    op: &MatMulOperand,
    operand: &'static str,
    build: impl FnOnce(
        Elements<'_>,
        &crate::shape::Padding,
    ) -> Option<Result<Buffer, crate::runtime::buffer::AllocError>>,
) -> Result<Option<(Buffer, MatMulOperand)>, MatMulError> {
    let Some(padding) = op.view.as_ref().and_then(|v| v.padding.as_ref()) else {
        return Ok(None);
    };
    let buffer = build(x, padding)
        .ok_or(MatMulError::ViewOutOfBounds { operand })?
        .map_err(|_| MatMulError::PackingAlloc)?;
    let mut op = op.clone();
    if let Some(view) = op.view.as_mut() {
        view.padding = None;
    }
    Ok(Some((buffer, op)))
}

/// `out = a @ b` on borrowed elements: the executor passes the buffers kernels wrote, with
/// no copies.
pub fn matmul_elements(
    a: Elements<'_>,
    a_op: &MatMulOperand,
    b: Elements<'_>,
    b_op: &MatMulOperand,
    mut out: ElementsMut<'_>,
) -> Result<(), MatMulError> {
    let (pa, pb) = (unpadded(a, a_op, "left")?, unpadded(b, b_op, "right")?);
    if pa.is_some() || pb.is_some() {
        let (a, a_op) = pa.as_ref().map_or((a, a_op), |(x, op)| (x.elements(), op));
        let (b, b_op) = pb.as_ref().map_or((b, b_op), |(x, op)| (x.elements(), op));
        return matmul_elements(a, a_op, b, b_op, out);
    }
    // This path multiplies contiguous operands: a view is gathered into one first.
    let gathered = |x: Elements<'_>, op: &MatMulOperand, name| {
        let Some(view) = &op.view else {
            return Ok(None);
        };
        // Gathered over the view's sub-axes where it has them, whose row-major order is
        // the operand's.
        let mut buffer = Buffer::try_zeroed(x.dtype, view.strided_shape())
            .map_err(|_| MatMulError::PackingAlloc)?;
        if !buffer.gather_from(x, &view.strided) {
            return Err(MatMulError::ViewOutOfBounds { operand: name });
        }
        buffer.shape = view.shape.clone();
        Ok(Some(buffer))
    };
    let (ga, gb) = (gathered(a, a_op, "left")?, gathered(b, b_op, "right")?);
    let a = ga.as_ref().map_or(a, Buffer::elements);
    let b = gb.as_ref().map_or(b, Buffer::elements);
    let ProductShape {
        rows: n,
        inner: k,
        cols: m,
        offsets,
        ..
    } = product_shape(a.shape, b.shape, out.len())?;
    let dtype = out.dtype;
    let total = offsets.len() * n * m;
    if dtype.category() == Category::Integer {
        // Integer products wrap, as NumPy's integer matmul does: a plain loop of wrapping
        // multiply-adds in i64 (no integer GEMM is worth its weight here), then each result
        // wrapped to the product's dtype by the store.
        let (pa, pb) = (pack_int(a, a_op, dtype), pack_int(b, b_op, dtype));
        for (bi, &(oa, ob)) in offsets.iter().enumerate() {
            for r in 0..n {
                for c in 0..m {
                    let dot = (0..k).fold(0i64, |acc, j| {
                        acc.wrapping_add(pa[oa + r * k + j].wrapping_mul(pb[ob + j * m + c]))
                    });
                    out.set_int(bi * n * m + r * m + c, dot);
                }
            }
        }
    } else if !dtype.compute_is_f64() {
        let (pa, pb) = (pack_f32(a, a_op, dtype), pack_f32(b, b_op, dtype));
        let mut c = vec![0f32; total];
        for (bi, &(oa, ob)) in offsets.iter().enumerate() {
            // SAFETY: each matrix lies inside its slice: offsets come from the broadcast
            // batch layout of shapes whose element counts the slices have.
            unsafe {
                matrixmultiply::sgemm(
                    n,
                    k,
                    m,
                    1.0,
                    pa.slice().as_ptr().add(oa),
                    k as isize,
                    1,
                    pb.slice().as_ptr().add(ob),
                    m as isize,
                    1,
                    0.0,
                    c.as_mut_ptr().add(bi * n * m),
                    m as isize,
                    1,
                );
            }
        }
        // f32, f16 or bf16 here: rounding the f32 result once is the reference's rounding.
        let stored = out.store_f32(&c);
        debug_assert!(stored, "{dtype} result of an f32 product");
    } else {
        let (pa, pb) = (pack_f64(a, a_op, dtype), pack_f64(b, b_op, dtype));
        let mut c = vec![0f64; total];
        for (bi, &(oa, ob)) in offsets.iter().enumerate() {
            // SAFETY: as above.
            unsafe {
                matrixmultiply::dgemm(
                    n,
                    k,
                    m,
                    1.0,
                    pa.as_ptr().add(oa),
                    k as isize,
                    1,
                    pb.as_ptr().add(ob),
                    m as isize,
                    1,
                    0.0,
                    c.as_mut_ptr().add(bi * n * m),
                    m as isize,
                    1,
                );
            }
        }
        for (i, v) in c.into_iter().enumerate() {
            out.set(i, v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::Value;

    /// The f32 fast path rounds exactly as the f64 path (the reference's `DType::round`) for
    /// every f16 and bf16 bit pattern and a spread of f32 values, through every cast and
    /// product dtype it takes.
    #[test]
    fn the_narrow_packing_path_rounds_as_the_reference() {
        let mut f16s = Buffer::zeroed(DType::F16, &[65536]);
        let mut bf16s = Buffer::zeroed(DType::BF16, &[65536]);
        for i in 0..65536usize {
            f16s.set(i, half::f16::from_bits(i as u16).to_f64());
            bf16s.set(i, half::bf16::from_bits(i as u16).to_f64());
        }
        let mut f32s = Buffer::zeroed(DType::F32, &[4096]);
        for i in 0..4096 {
            let x = f32::from_bits(0x3380_0000u32.wrapping_add(i as u32 * 0x0003_1f7b));
            f32s.set(i, f64::from(if i % 2 == 0 { x } else { -x }));
        }
        let floats = [DType::F32, DType::F16, DType::BF16];
        for buf in [&f16s, &bf16s, &f32s] {
            for cast in [None, Some(DType::F16), Some(DType::BF16), Some(DType::F32)] {
                for out in floats {
                    let op = MatMulOperand {
                        cast,
                        ..MatMulOperand::stored(Value::Input(0))
                    };
                    let fast = pack_narrow(buf.elements(), &op, out).expect("a narrow case");
                    let slow = pack_f64(buf.elements(), &op, out);
                    for (i, (&f, &s)) in fast.iter().zip(&slow).enumerate() {
                        let same = (f.is_nan() && s.is_nan()) || f64::from(f) == s;
                        assert!(
                            same,
                            "{} [{i}] cast {cast:?} out {out}: {f} vs {s}",
                            buf.dtype
                        );
                    }
                }
            }
        }
    }
}
