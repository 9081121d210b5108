//! Matrix products through `matrixmultiply` (a BLIS-style GEMM with packing and threads).
//!
//! Semantics are the reference evaluator's: NumPy matmul (1-D operands promoted, batch
//! dimensions broadcast), operands rounded to the product's dtype, f32 arithmetic for f16,
//! bf16 and f32 products and f64 otherwise, the result rounded to the product's dtype. An
//! absorbed cast (fusion.ron's `library_casts`) rounds each element while the operand is
//! converted into the layout the GEMM reads, so no cast kernel and no narrow copy exist.

use super::buffer::Buffer;
use crate::dtype::DType;
use crate::lower::MatMulOperand;

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

fn pack_f64(buf: &Buffer, op: &MatMulOperand, out: DType) -> Vec<f64> {
    (0..buf.len())
        .map(|i| {
            let v = buf.get(i);
            let v = op.cast.map_or(v, |c| c.round(v));
            out.round(v)
        })
        .collect()
}

fn pack_f32<'a>(buf: &'a Buffer, op: &MatMulOperand, out: DType) -> Packed<'a, f32> {
    match buf.as_f32() {
        Some(s) if op.cast.is_none() && out == DType::F32 => Packed::Borrowed(s),
        _ => Packed::Owned(
            pack_f64(buf, op, out)
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        ),
    }
}

/// `out = a @ b`.
pub fn matmul(
    a: &Buffer,
    a_op: &MatMulOperand,
    b: &Buffer,
    b_op: &MatMulOperand,
    out: &mut Buffer,
) -> Result<(), String> {
    let (sa, sb) = (
        crate::shape::matmul_operand(&a.shape, false),
        crate::shape::matmul_operand(&b.shape, true),
    );
    let (n, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let m = sb[sb.len() - 1];
    if sb[sb.len() - 2] != k {
        return Err(format!(
            "matmul inner dims differ: {:?} @ {:?}",
            a.shape, b.shape
        ));
    }
    let batch = crate::shape::broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2])?;
    let offsets = crate::shape::matmul_batch_offsets(&sa, &sb, &batch);
    let dtype = out.dtype;
    let total = offsets.len() * n * m;
    if total != out.len() {
        return Err(format!(
            "matmul result has {total} elements, buffer {}",
            out.len()
        ));
    }
    if !dtype.compute_is_f64() {
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
        if dtype == DType::F32 {
            // SAFETY: an f32 buffer of `total` elements, 8-byte aligned.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut f32, total) };
            dst.copy_from_slice(&c);
        } else {
            for (i, v) in c.into_iter().enumerate() {
                out.set(i, f64::from(v));
            }
        }
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
