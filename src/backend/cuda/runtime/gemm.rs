//! Matrix products through cuBLAS, with the reference evaluator's semantics.
//!
//! The semantics are the CPU executor's (`src/exec/matmul.rs`; NumPy matmul: 1-D operands promoted, batch
//! dimensions broadcast; operands rounded through their absorbed cast and then to the
//! product's dtype; f32 arithmetic for f16, bf16 and f32 products and f64 otherwise; the result
//! rounded to the product's dtype). Planning ([`choose_types`], [`plan_shape`]) is pure Rust
//! and tested on the host; [`Blas`] issues the calls.
//!
//! # Types
//!
//! f16, bf16 and f32 products run `cublasGemmEx` with `CUBLAS_COMPUTE_32F` (f32 accumulation,
//! no TF32, and reduced-precision split-K reductions disallowed, so a long f16 sum is never
//! rounded to f16 halfway), writing C in the product's dtype: cuBLAS rounds the f32 result to
//! nearest even, as [`crate::dtype::DType::round`] does. When both operands reach the product
//! without any rounding (f16 operands of an f32 product, an f16 operand cast up to f32), the
//! GEMM reads them as they are stored (f16 × f16 → f32 is a native cuBLAS combination) and no
//! conversion pass runs. Otherwise an operand that needs rounding is converted first by a
//! [`pack`](super::pack) kernel into a temporary. f64 products use `CUBLAS_COMPUTE_64F`;
//! bool products run in f64 into a temporary that a last conversion kernel rounds to the
//! product's dtype. Integer products never come here: they wrap, which no cuBLAS GEMM does, so
//! the plan runs them as a reduction kernel (`pack::integer_matmul`).
//!
//! # Layout
//!
//! cuBLAS is column-major and fusebox row-major. A row-major `C[n×m] = A[n×k]·B[k×m]` is the
//! column-major `Cᵀ[m×n] = Bᵀ[m×k]·Aᵀ[k×n]`, and a row-major matrix read column-major is its
//! transpose, so each call passes B first, A second, with leading dimensions m, k and m and
//! no transposition. An operand the call reads through a view (`lower::OperandView`: a
//! PyTorch `Linear`'s transposed weight, attention's `Kᵀ`, a row slice) is passed as it lies:
//! a matrix whose columns are adjacent (row-major, any row stride) needs no transposition and
//! its row stride is the leading dimension; one whose rows are adjacent is read transposed
//! (`CUBLAS_OP_T`) with its column stride as the leading dimension. A view that is neither
//! (a step along both axes, a broadcast inside the matrix) is gathered into a contiguous
//! temporary first. Batches are grouped into strided-batched calls wherever the batch offsets
//! step evenly (see [`plan_strided`]).

use super::cublas_error;
use super::device::{CuStream, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::matmul::{self, MatMulError, OperandLayout};
use cudarc::cublas::result as cublas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasMath_t, cublasOperation_t,
    cudaDataType,
};
use std::ffi::c_void;

/// An operand as the matmul step reads it: the stored dtype and the absorbed cast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperandSpec {
    pub dtype: DType,
    pub cast: Option<DType>,
}

/// The storage types of one GEMM and the conversions around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmTypes {
    /// What A and B are read as.
    pub input: DType,
    /// What C is written as.
    pub output: DType,
    /// Per operand, the rounding chain (for [`super::pack::convert_ir`]) that converts it into
    /// `input` first; `None` when the GEMM reads it as stored.
    pub a_chain: Option<Vec<DType>>,
    pub b_chain: Option<Vec<DType>>,
    /// The chain from `output` to the product's dtype, when C is a temporary.
    pub out_chain: Option<Vec<DType>>,
}

/// Whether every value of `from` is exactly a value of `to`.
fn widens(from: DType, to: DType) -> bool {
    use DType::*;
    from == to || matches!((from, to), (F16 | BF16, F32 | F64) | (F32, F64))
}

fn is_gemm_float(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
}

/// The roundings an operand goes through on its way into a product of dtype `out` whose GEMM
/// reads `input`: its absorbed cast, the product's dtype, then the GEMM's storage type.
fn chain(op: OperandSpec, out: DType, input: DType) -> Vec<DType> {
    let mut chain: Vec<DType> = op.cast.into_iter().collect();
    chain.push(out);
    if input != out {
        chain.push(input);
    }
    chain
}

/// The chain, or `None` when it changes no value and the operand is already stored as
/// `input`.
fn conversion(op: OperandSpec, out: DType, input: DType) -> Option<Vec<DType>> {
    let chain = chain(op, out, input);
    let identity = op.dtype == input && chain.iter().all(|&t| widens(op.dtype, t));
    (!identity).then_some(chain)
}

/// Picks the GEMM's storage types for operands `a`, `b` and a product of dtype `out`.
pub fn choose_types(a: OperandSpec, b: OperandSpec, out: DType) -> GemmTypes {
    // The dtype an operand reaches the product in without any rounding, if it is one cuBLAS
    // reads.
    let exact = |op: OperandSpec| {
        let through_cast = op.cast.is_none_or(|c| widens(op.dtype, c));
        (is_gemm_float(op.dtype) && through_cast && widens(op.dtype, out)).then_some(op.dtype)
    };
    match out {
        DType::F16 | DType::BF16 | DType::F32 => match (exact(a), exact(b)) {
            (Some(ta), Some(tb)) if ta == tb => GemmTypes {
                input: ta,
                output: out,
                a_chain: None,
                b_chain: None,
                out_chain: None,
            },
            _ => GemmTypes {
                input: out,
                output: out,
                a_chain: conversion(a, out, out),
                b_chain: conversion(b, out, out),
                out_chain: None,
            },
        },
        DType::F64 => GemmTypes {
            input: DType::F64,
            output: DType::F64,
            a_chain: conversion(a, out, DType::F64),
            b_chain: conversion(b, out, DType::F64),
            out_chain: None,
        },
        // Integers and bool: f64 arithmetic, then the result rounded to `out` (saturating,
        // as the reference stores it).
        _ => GemmTypes {
            input: DType::F64,
            output: DType::F64,
            a_chain: conversion(a, out, DType::F64),
            b_chain: conversion(b, out, DType::F64),
            out_chain: Some(vec![out]),
        },
    }
}

/// One cuBLAS call: `count` products of `rows × k` by `k × m` matrices (offsets and strides
/// in elements; C's stride is `rows × m`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchCall {
    pub rows: usize,
    pub count: usize,
    pub a_offset: usize,
    pub b_offset: usize,
    pub c_offset: usize,
    pub a_stride: usize,
    pub b_stride: usize,
}

/// How cuBLAS reads one operand's matrices (in fusebox's row-major terms): row-major with
/// rows `ld` elements apart, or (`transposed`) with adjacent rows and columns `ld` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixRead {
    pub transposed: bool,
    pub ld: usize,
}

impl MatrixRead {
    /// How cuBLAS can read a `rows × cols` matrix whose rows step by `strides[0]` and
    /// columns by `strides[1]`; `None` when it cannot (no unit stride, or a leading dimension
    /// that would overlap). A stride along an axis of size 1 never matters.
    fn of(rows: usize, cols: usize, [rs, cs]: [i64; 2]) -> Option<MatrixRead> {
        let row_major =
            (cs == 1 || cols <= 1).then(|| if rows <= 1 { cols.max(1) as i64 } else { rs });
        if let Some(ld) = row_major
            && ld >= cols.max(1) as i64
        {
            return Some(MatrixRead {
                transposed: false,
                ld: ld as usize,
            });
        }
        let column_major =
            (rs == 1 || rows <= 1).then(|| if cols <= 1 { rows.max(1) as i64 } else { cs });
        match column_major {
            Some(ld) if ld >= rows.max(1) as i64 => Some(MatrixRead {
                transposed: true,
                ld: ld as usize,
            }),
            _ => None,
        }
    }

    /// A contiguous row-major matrix of `cols` columns.
    fn contiguous(cols: usize) -> MatrixRead {
        MatrixRead {
            transposed: false,
            ld: cols.max(1),
        }
    }

    fn operation(self) -> cublasOperation_t {
        match self.transposed {
            true => cublasOperation_t::CUBLAS_OP_T,
            false => cublasOperation_t::CUBLAS_OP_N,
        }
    }
}

/// The calls that compute one matmul.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmShape {
    pub n: usize,
    pub k: usize,
    pub m: usize,
    /// How A's and B's matrices are read.
    pub a: MatrixRead,
    pub b: MatrixRead,
    /// Matrices in the result (the broadcast batch's size).
    pub batches: usize,
    pub calls: Vec<BatchCall>,
}

/// The common step of an arithmetic progression, if `values` is one with a step ≥ 0.
fn progression(values: impl Iterator<Item = usize> + Clone) -> Option<usize> {
    let mut it = values.clone();
    let first = it.next()?;
    let step = match it.next() {
        Some(second) => second.checked_sub(first)?,
        None => return Some(0),
    };
    values
        .enumerate()
        .all(|(i, v)| v == first + i * step)
        .then_some(step)
}

/// Plans `a @ b` for contiguous operands of these shapes (see [`plan_strided`]).
pub fn plan_shape(a: &[usize], b: &[usize]) -> std::result::Result<GemmShape, MatMulError> {
    let (sa, sb) = (
        crate::shape::Strided::contiguous(a),
        crate::shape::Strided::contiguous(b),
    );
    let layout = |shape, strided| OperandLayout {
        split: None,
        shape,
        strided,
        len: crate::shape::numel(shape),
    };
    plan_strided(layout(a, &sa), layout(b, &sb))?.ok_or(MatMulError::NoGrouping)
}

/// Plans `a @ b` for operands read through these layouts: the largest groups of batch
/// matrices that one strided-batched call can cover (trailing batch dimensions whose a and b
/// offsets both step evenly), one call per group. When b is shared by every batch and a's
/// batches follow one another row after row, the batch folds into the rows of a single GEMM,
/// the fastest form. `None` when cuBLAS cannot read an operand's matrices as they lie
/// ([`MatrixRead::of`]): the caller gathers it into a contiguous one.
pub fn plan_strided(
    a: OperandLayout<'_>,
    b: OperandLayout<'_>,
) -> std::result::Result<Option<GemmShape>, MatMulError> {
    let product = matmul::strided_product(a, b, None)?;
    let (n, k, m) = (product.rows, product.inner, product.cols);
    let batches = product.offsets.len();
    let batch = &product.batch;
    let reads = (
        MatrixRead::of(n, k, product.a_strides),
        MatrixRead::of(k, m, product.b_strides),
    );
    let mut shape = GemmShape {
        n,
        k,
        m,
        a: MatrixRead::contiguous(k),
        b: MatrixRead::contiguous(m),
        batches,
        calls: Vec::new(),
    };
    if batches == 0 || n == 0 || m == 0 {
        return Ok(Some(shape));
    }
    let (Some(read_a), Some(read_b)) = reads else {
        return Ok(None);
    };
    (shape.a, shape.b) = (read_a, read_b);
    // Offsets are element indices inside the buffers (`strided_product` checked the bounds).
    let offsets: Vec<(usize, usize)> = product
        .offsets
        .iter()
        .map(|&(oa, ob)| (oa as usize, ob as usize))
        .collect();
    // Largest group first: all batch dims, then fewer trailing ones, down to single matrices.
    for d in 0..=batch.len() {
        let inner: usize = batch[d..].iter().product();
        let groups = batches / inner;
        let steps: Option<Vec<(usize, usize)>> = (0..groups)
            .map(|g| {
                let block = &offsets[g * inner..(g + 1) * inner];
                Some((
                    progression(block.iter().map(|o| o.0))?,
                    progression(block.iter().map(|o| o.1))?,
                ))
            })
            .collect();
        let Some(steps) = steps else { continue };
        // The same steps in every group (always true for a broadcast layout, checked anyway).
        if steps.windows(2).any(|w| w[0] != w[1]) {
            continue;
        }
        let (a_stride, b_stride) = steps[0];
        if groups == 1
            && inner > 1
            && b_stride == 0
            && !read_a.transposed
            && a_stride == n * read_a.ld
        {
            shape.calls.push(BatchCall {
                rows: inner * n,
                count: 1,
                a_offset: offsets[0].0,
                b_offset: offsets[0].1,
                c_offset: 0,
                a_stride: 0,
                b_stride: 0,
            });
            return Ok(Some(shape));
        }
        for g in 0..groups {
            shape.calls.push(BatchCall {
                rows: n,
                count: inner,
                a_offset: offsets[g * inner].0,
                b_offset: offsets[g * inner].1,
                c_offset: g * inner * n * m,
                a_stride,
                b_stride,
            });
        }
        return Ok(Some(shape));
    }
    Err(MatMulError::NoGrouping)
}

/// The cuBLAS storage type of `dtype`.
fn data_type(dtype: DType) -> Result<cudaDataType> {
    Ok(match dtype {
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::F64 => cudaDataType::CUDA_R_64F,
        other => return Err(Error::backend(format!("cuBLAS cannot read {other}"))),
    })
}

/// cuBLAS's sizes are C ints.
fn int(value: usize, what: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| {
        Error::backend(format!(
            "matmul {what} {value} exceeds cuBLAS's 32-bit sizes"
        ))
    })
}

/// Workspace for cuBLAS (and for cuBLASLt's handle, [`super::lt`]), set explicitly so that
/// calls captured into a CUDA graph never allocate (32 MiB is what NVIDIA recommends for
/// Hopper).
pub(super) const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle of one device, with its workspace.
pub struct Blas {
    handle: cublasHandle_t,
    workspace: u64,
}

// SAFETY: a cuBLAS handle may be used from any thread as long as calls on it are serialized;
// the device keeps its `Blas` behind a mutex.
unsafe impl Send for Blas {}

impl Blas {
    /// Creates the handle (the context must be current).
    pub(super) fn new(device: &Device) -> Result<Blas> {
        // The workspace is returned only if the handle cannot be made: the handle lives as
        // long as the device.
        let (workspace, bucket) = device.alloc(WORKSPACE_BYTES)?;
        let handle = cublas::create_handle().map_err(|e| {
            device.release(workspace, bucket);
            cublas_error("creating a handle", e)
        })?;
        let blas = Blas { handle, workspace };
        // SAFETY: a live handle. The mode: default math (no TF32) with reduced-precision
        // reductions disallowed.
        unsafe {
            cudarc::cublas::sys::cublasSetMathMode(
                handle,
                cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
        }
        .result()
        .map_err(|e| cublas_error("setting the math mode", e))?;
        Ok(blas)
    }

    /// Points the handle at `stream`, with the workspace. `cublasSetStream` resets the
    /// workspace to cuBLAS's own per-stream pool, which would allocate on first use (and fail
    /// inside a graph capture), so the workspace is set again after it.
    fn set_stream(&mut self, stream: CuStream) -> Result<()> {
        // SAFETY: a live handle and stream.
        unsafe { cublas::set_stream(self.handle, stream as _) }
            .map_err(|e| cublas_error("setting the stream", e))?;
        // SAFETY: a live handle and a device block of WORKSPACE_BYTES bytes never freed.
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                self.handle,
                self.workspace as *mut c_void,
                WORKSPACE_BYTES,
            )
        }
        .result()
        .map_err(|e| cublas_error("setting the workspace", e))
    }

    /// Queues `C = A·B` on `stream` for every call of `shape`, with `a`, `b`, `c` the device
    /// addresses of the operands (stored as `types.input`) and the result (`types.output`).
    /// Returns the number of cuBLAS calls made.
    pub(super) fn gemm(
        &mut self,
        stream: CuStream,
        types: &GemmTypes,
        shape: &GemmShape,
        (a, b, c): (u64, u64, u64),
    ) -> Result<usize> {
        let (in_type, out_type) = (data_type(types.input)?, data_type(types.output)?);
        let (in_size, out_size) = (
            types.input.size_bytes() as u64,
            types.output.size_bytes() as u64,
        );
        self.set_stream(stream)?;
        let f64_compute = types.input == DType::F64;
        let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta, compute) = if f64_compute {
            (
                &one64 as *const f64 as *const c_void,
                &zero64 as *const f64 as *const c_void,
                cublasComputeType_t::CUBLAS_COMPUTE_64F,
            )
        } else {
            (
                &one32 as *const f32 as *const c_void,
                &zero32 as *const f32 as *const c_void,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
            )
        };
        let m = int(shape.m, "column count")?;
        let k = int(shape.k, "inner dimension")?;
        let (ldb, lda, ldc) = (
            int(shape.b.ld, "B's leading dimension")?,
            int(shape.a.ld, "A's leading dimension")?,
            m.max(1),
        );
        let (op_b, op_a) = (shape.b.operation(), shape.a.operation());
        let algo = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        for call in &shape.calls {
            let rows = int(call.rows, "row count")?;
            let pa = (a + call.a_offset as u64 * in_size) as *const c_void;
            let pb = (b + call.b_offset as u64 * in_size) as *const c_void;
            let pc = (c + call.c_offset as u64 * out_size) as *mut c_void;
            // SAFETY: the plan keeps every matrix inside its buffer (offsets and strides come
            // from the operands' shapes, which the buffers have); alpha and beta are host
            // scalars of the compute type, read before the call returns.
            let status = unsafe {
                if call.count == 1 {
                    cublas::gemm_ex(
                        self.handle,
                        op_b,
                        op_a,
                        m,
                        rows,
                        k,
                        alpha,
                        pb,
                        in_type,
                        ldb,
                        pa,
                        in_type,
                        lda,
                        beta,
                        pc,
                        out_type,
                        ldc,
                        compute,
                        algo,
                    )
                } else {
                    cublas::gemm_strided_batched_ex(
                        self.handle,
                        op_b,
                        op_a,
                        m,
                        rows,
                        k,
                        alpha,
                        pb,
                        in_type,
                        ldb,
                        call.b_stride as i64,
                        pa,
                        in_type,
                        lda,
                        call.a_stride as i64,
                        beta,
                        pc,
                        out_type,
                        ldc,
                        (call.rows * shape.m) as i64,
                        int(call.count, "batch count")?,
                        compute,
                        algo,
                    )
                }
            };
            status.map_err(|e| {
                cublas_error(
                    &format!(
                        "GEMM of {} {}x{} by {}x{} into {}",
                        types.input, call.rows, shape.k, shape.k, shape.m, types.output
                    ),
                    e,
                )
            })?;
        }
        Ok(shape.calls.len())
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once. A failure here cannot be reported.
        let _ = unsafe { cublas::destroy_handle(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::MatMulOperand;
    use crate::runtime::buffer::Buffer;

    fn spec(dtype: DType, cast: Option<DType>) -> OperandSpec {
        OperandSpec { dtype, cast }
    }

    #[test]
    fn operands_reaching_the_product_exactly_are_read_as_stored() {
        use DType::*;
        // f16 @ f16 -> f16: native.
        let t = choose_types(spec(F16, None), spec(F16, None), F16);
        assert_eq!(
            (t.input, t.output, &t.a_chain, &t.b_chain),
            (F16, F16, &None, &None)
        );
        // f16 cast up to f32 on both sides: f16 × f16 → f32, no conversion pass.
        let t = choose_types(spec(F16, Some(F32)), spec(F16, Some(F32)), F32);
        assert_eq!(
            (t.input, t.output, &t.a_chain, &t.b_chain),
            (F16, F32, &None, &None)
        );
        // Mixed f16/bf16 into f32: both converted to f32 (cuBLAS needs one input type); the
        // conversion of an exact widening is still the full chain, which changes no value.
        let t = choose_types(spec(F16, None), spec(BF16, None), F32);
        assert_eq!(t.input, F32);
        assert_eq!(t.a_chain, Some(vec![F32]));
        assert_eq!(t.b_chain, Some(vec![F32]));
        // f32 @ f32 -> f32 with one operand cast to f16 (an AMP absorbed cast): that one is
        // rounded to f16 and back to f32 first.
        let t = choose_types(spec(F32, Some(F16)), spec(F32, None), F32);
        assert_eq!(
            (t.input, t.a_chain.clone(), t.b_chain.clone()),
            (F32, Some(vec![F16, F32]), None)
        );
        // f32 operands cast down to f16 for an f16 product.
        let t = choose_types(spec(F32, Some(F16)), spec(F32, Some(F16)), F16);
        assert_eq!((t.input, t.output), (F16, F16));
        assert_eq!(t.a_chain, Some(vec![F16, F16]));
    }

    #[test]
    fn integer_products_run_in_f64_and_round_at_the_end() {
        use DType::*;
        let t = choose_types(spec(I32, None), spec(I32, None), I32);
        assert_eq!((t.input, t.output), (F64, F64));
        assert_eq!(t.a_chain, Some(vec![I32, F64]));
        assert_eq!(t.out_chain, Some(vec![I32]));
        let t = choose_types(spec(F64, None), spec(F32, None), F64);
        assert_eq!(
            (t.a_chain, t.b_chain, t.out_chain),
            (None, Some(vec![F64]), None)
        );
    }

    /// Runs the planned calls on the host exactly as cuBLAS reads its arguments
    /// (column-major, B first), in f64.
    fn simulate(shape: &GemmShape, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![f64::NAN; shape.batches * shape.n * shape.m];
        let (m, k) = (shape.m, shape.k);
        let (ldb, lda, ldc) = (shape.b.ld, shape.a.ld, m.max(1));
        // Column-major element (row, column) of a stored matrix, or of its transpose.
        let at = |read: MatrixRead, ld: usize, row: usize, col: usize| match read.transposed {
            false => row + col * ld,
            true => col + row * ld,
        };
        for call in &shape.calls {
            for batch in 0..call.count {
                let (oa, ob) = (
                    call.a_offset + batch * call.a_stride,
                    call.b_offset + batch * call.b_stride,
                );
                let oc = call.c_offset + batch * call.rows * m;
                // Column-major: first operand (B) is m×k, second (A) k×rows, C m×rows.
                for j in 0..call.rows {
                    for i in 0..m {
                        let mut sum = 0.0;
                        for l in 0..k {
                            sum += b[ob + at(shape.b, ldb, i, l)] * a[oa + at(shape.a, lda, l, j)];
                        }
                        c[oc + i + j * ldc] = sum;
                    }
                }
            }
        }
        c
    }

    /// The planned calls compute what the CPU executor's matmul computes, for 1-D operands,
    /// broadcast batches of every kind, and empty dimensions.
    #[test]
    fn planned_calls_compute_numpy_matmul() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[3, 4], &[4, 5]),
            (&[4], &[4, 5]),
            (&[3, 4], &[4]),
            (&[4], &[4]),
            (&[2, 3, 4], &[4, 5]),          // folds into one GEMM
            (&[3, 4], &[2, 4, 5]),          // a shared: stride 0
            (&[2, 3, 4], &[2, 4, 5]),       // one strided-batched call
            (&[2, 1, 3, 4], &[1, 3, 4, 5]), // outer product of batches: per-row groups
            (&[3, 1, 2, 4], &[1, 2, 4, 2]), // mixed broadcast
            (&[1, 2, 4], &[3, 1, 4, 2]),
            (&[2, 3, 0], &[0, 5]), // k = 0: no call, zero result
            (&[0, 3, 4], &[4, 2]),
            (&[2, 0, 4], &[4, 2]),
        ];
        for &(sa, sb) in cases {
            let shape = plan_shape(sa, sb).unwrap();
            let fill = |s: &[usize], seed: f64| {
                let mut buf = Buffer::zeroed(DType::F64, s);
                for i in 0..buf.len() {
                    buf.set(i, ((i as f64 + seed) * 0.37).sin().round() + i as f64 * 0.5);
                }
                buf
            };
            let (a, b) = (fill(sa, 1.0), fill(sb, 2.0));
            let out_shape = crate::shape::matmul_shape(sa, sb).unwrap();
            let mut want = Buffer::zeroed(DType::F64, &out_shape);
            let op = MatMulOperand::stored(crate::dag::Value::Input(0));
            crate::runtime::matmul::matmul(&a, &op, &b, &op, &mut want).unwrap();
            let values = |buf: &Buffer| (0..buf.len()).map(|i| buf.get(i)).collect::<Vec<_>>();
            // With k = 0 the executor zero-fills C instead of calling cuBLAS; the simulated
            // empty sums give the same zeros.
            let got = simulate(&shape, &values(&a), &values(&b));
            assert_eq!(got, values(&want), "{sa:?} @ {sb:?}: {:?}", shape.calls);
        }
    }

    /// Operands read through views (transposed, row-strided, attention's heads inside the
    /// rows, a shared transposed weight under a batch): the planned calls, simulated as cuBLAS
    /// reads them, compute what the CPU executor computes on the gathered views. A view with
    /// no unit stride is not planned (the caller gathers it).
    #[test]
    fn planned_calls_read_views_as_they_lie() {
        use crate::lower::OperandView;
        use crate::shape::Strided;
        let view = |shape: &[usize], offset: i64, strides: &[i64]| {
            OperandView::strided(
                shape.to_vec(),
                Strided {
                    offset,
                    strides: strides.to_vec(),
                },
            )
        };
        // (a's buffer, a's view, b's buffer, b's view)
        let cases = [
            // x [3, 4] @ transpose(w [5, 4]): a Linear.
            (
                vec![3, 4],
                view(&[3, 4], 0, &[4, 1]),
                vec![5, 4],
                view(&[4, 5], 0, &[1, 4]),
            ),
            // transpose(x [4, 3]) @ w [4, 5], rows of x sliced from a wider buffer.
            (
                vec![4, 7],
                view(&[3, 4], 2, &[1, 7]),
                vec![4, 5],
                view(&[4, 5], 0, &[5, 1]),
            ),
            // Every other row of a [7, 4] buffer @ a shared transposed weight, batch of 2.
            (
                vec![2, 7, 4],
                view(&[2, 3, 4], 4, &[28, 8, 1]),
                vec![5, 4],
                view(&[2, 4, 5], 0, &[0, 1, 4]),
            ),
            // Heads inside the rows: q [s=3, h=2, d=4] read as [h, s, d]; kᵀ likewise.
            (
                vec![3, 2, 4],
                view(&[2, 3, 4], 0, &[4, 8, 1]),
                vec![5, 2, 4],
                view(&[2, 4, 5], 0, &[4, 1, 8]),
            ),
            // A 1-D operand with a stride, and a vector result.
            (
                vec![8],
                view(&[4], 1, &[2]),
                vec![5, 4],
                view(&[4, 5], 0, &[1, 4]),
            ),
        ];
        let fill = |s: &[usize], seed: f64| {
            let mut buf = Buffer::zeroed(DType::F64, s);
            for i in 0..buf.len() {
                buf.set(i, ((i as f64 + seed) * 0.37).sin().round() + i as f64 * 0.5);
            }
            buf
        };
        for (sa, va, sb, vb) in cases {
            let (a, b) = (fill(&sa, 1.0), fill(&sb, 2.0));
            fn layout(v: &OperandView, len: usize) -> OperandLayout<'_> {
                OperandLayout {
                    shape: &v.shape,
                    strided: &v.strided,
                    split: None,
                    len,
                }
            }
            let shape = plan_strided(layout(&va, a.len()), layout(&vb, b.len()))
                .unwrap()
                .unwrap_or_else(|| panic!("{va:?} @ {vb:?} not planned"));
            let out_shape = crate::shape::matmul_shape(&va.shape, &vb.shape).unwrap();
            let mut want = Buffer::zeroed(DType::F64, &out_shape);
            let op = |v: &OperandView| MatMulOperand {
                view: Some(v.clone()),
                ..MatMulOperand::stored(crate::dag::Value::Input(0))
            };
            crate::runtime::matmul::matmul(&a, &op(&va), &b, &op(&vb), &mut want).unwrap();
            let values = |buf: &Buffer| (0..buf.len()).map(|i| buf.get(i)).collect::<Vec<_>>();
            let got = simulate(&shape, &values(&a), &values(&b));
            assert_eq!(got, values(&want), "{va:?} @ {vb:?}: {shape:?}");
        }
        // Every other column: no unit stride, so cuBLAS cannot read it.
        let stepped = view(&[3, 4], 0, &[8, 2]);
        let b = view(&[4, 5], 0, &[5, 1]);
        let planned = plan_strided(
            OperandLayout {
                shape: &stepped.shape,
                strided: &stepped.strided,
                split: None,
                len: 24,
            },
            OperandLayout {
                shape: &b.shape,
                strided: &b.strided,
                split: None,
                len: 20,
            },
        );
        assert_eq!(planned, Ok(None));
    }

    #[test]
    fn batches_group_into_as_few_calls_as_the_layout_allows() {
        let calls = |a: &[usize], b: &[usize]| plan_shape(a, b).unwrap().calls;
        let folded = calls(&[2, 3, 4], &[4, 5]);
        assert_eq!(folded.len(), 1);
        assert_eq!((folded[0].rows, folded[0].count), (6, 1));
        let batched = calls(&[2, 3, 4], &[2, 4, 5]);
        assert_eq!(batched.len(), 1);
        assert_eq!(
            (batched[0].count, batched[0].a_stride, batched[0].b_stride),
            (2, 12, 20)
        );
        let shared_a = calls(&[3, 4], &[6, 4, 5]);
        assert_eq!(
            (shared_a.len(), shared_a[0].a_stride, shared_a[0].b_stride),
            (1, 0, 20)
        );
        // [2,1] × [1,3] batches: each row of the 2×3 grid is one call over b's batches.
        let outer = calls(&[2, 1, 3, 4], &[1, 3, 4, 5]);
        assert_eq!(outer.len(), 2);
        assert_eq!(
            (outer[0].count, outer[0].a_stride, outer[0].b_stride),
            (3, 0, 20)
        );
        assert_eq!((outer[1].a_offset, outer[1].c_offset), (12, 3 * 15));
        assert!(calls(&[0, 3, 4], &[4, 2]).is_empty());
        assert!(plan_shape(&[3, 4], &[5, 2]).is_err());
    }
}
