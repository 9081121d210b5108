//! Epilogues in the GEMM through cuBLASLt: a product whose epilogue kernel (fusion.ron's
//! `library_epilogues`) is a bias, a residual, a scale and a ReLU or tanh-form GELU runs as one
//! `cublasLtMatmul` that applies them to each finished tile, instead of a GEMM that writes the
//! product and a kernel that reads it back.
//!
//! # Recognition
//!
//! The program has no "linear" or "relu" op: the epilogue is an ordinary pointwise kernel over
//! the product's shape. [`recognize`] reads its instructions and accepts exactly the forms
//! cuBLASLt computes, `D = activation(alpha·P + C + bias)`:
//!
//! - the product `P` loaded once, where the GEMM writes it (contiguous rows);
//! - optionally multiplied once by a constant (`alpha`), before anything is added to it;
//! - a sum, in any order, of the product with at most one *bias* (a vector along the product's
//!   columns, the same for every row: a `Linear`'s bias) and at most one *residual* (a matrix
//!   of the product's shape, contiguous, in the output's dtype: cuBLASLt's `C` with `beta = 1`);
//! - optionally an activation of the whole sum — ReLU (`max(sum, +0)`) or GELU's tanh form
//!   written as `ops.ron`'s `gelu_tanh` writes it (sums and products in either order; the
//!   exact, erf GELU is not cuBLASLt's) —, then the one store, in the output's
//!   dtype (rounded once, to nearest even, as the kernel's `Round` does). Roundings to f16 or
//!   bf16 between these steps (a 16-bit graph rounds after each op) are skipped.
//!
//! A residual added after the ReLU, a second store (the pre-activation kept for a backward
//! pass), a subtraction, f64 arithmetic, a reduction, an index map or a gather: the epilogue
//! stays a kernel.
//!
//! # Arithmetic
//!
//! cuBLASLt applies the epilogue to the f32 accumulator. The epilogue kernel instead reads the
//! product as stored, so where the product is f16 or bf16 (AMP), the fused form skips one
//! rounding of `P` to that dtype before the bias is added: its result is the unfused one's or
//! closer to the exact one: each skipped rounding moves it by at most half a unit in the last
//! place of that dtype (what PyTorch's `addmm` with cuBLASLt's bias epilogue computes for a
//! bf16 `Linear`). The additions run in
//! f32 in an order cuBLASLt chooses, as the GEMM's own sums do.
//!
//! The algorithm is cuBLASLt's heuristic choice, made at build time twice: for pointers aligned
//! to 16 bytes and for any pointers, since the heuristic otherwise assumes 256-byte alignment
//! and a run's buffers are known only then; each run takes the one its pointers allow.
//!
//! cuBLASLt's epilogues are used only when [`CudaOptions::lt_epilogues`] asks for them
//! (`--lt-epilogues`): they have not been run on a GPU yet (`tests/cuda_gpu.rs`'s
//! `lt_epilogues_match_the_reference` is the check to run first).
//!
//! [`CudaOptions::lt_epilogues`]: super::CudaOptions::lt_epilogues

use super::device::{CuStream, Device};
use super::gemm::{GemmShape, GemmTypes, WORKSPACE_BYTES};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::formula::{BinOp, Func};
use crate::lower::ir::{Instr, KernelIr, Launch, Prec, ValueId};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use std::ffi::c_void;

/// The activation cuBLASLt applies last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None,
    /// `max(x, 0)`.
    Relu,
    /// GELU's tanh form, `0.5·x·(1 + tanh(0.7978845608·(x + 0.044715·x³)))`: cuBLASLt's
    /// GELU, and PyTorch's `gelu(approximate="tanh")`.
    GeluTanh,
}

/// One term of the epilogue's sum.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Term {
    Product { alpha: f32 },
    Bias(usize),
    Residual(usize),
}

/// How an argument of the epilogue step is read: the product, a bias vector or a matrix
/// laid out like the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operand {
    Product,
    Bias,
    Matrix,
}

/// The epilogue of a product of `rows × cols` elements (its matrices one after another),
/// over the kernel's argument indices, with the argument it stores into, if cuBLASLt can run
/// it; `ir` and `launch` are the epilogue's kernel and launch, and `product` the argument
/// through which it reads the product.
pub fn recognize(
    ir: &KernelIr,
    launch: &Launch,
    product: usize,
    cols: usize,
) -> Option<(LtEpilogue<usize>, usize)> {
    let plain = ir.reductions.is_empty()
        && launch.ranges.is_empty()
        && launch.gathers.is_empty()
        && launch.maps.iter().all(Vec::is_empty)
        && ir.loads.iter().all(|v| v.stages.is_empty());
    let [store] = &ir.stores[..] else {
        return None;
    };
    if !plain || store.scatter.is_some() || !store.view.stages.is_empty() {
        return None;
    }
    let sizes: Vec<usize> = launch
        .sizes
        .iter()
        .map(|&s| usize::try_from(s).ok())
        .collect::<Option<_>>()?;
    if sizes.last().copied().unwrap_or(1) != cols {
        return None;
    }
    let contiguous = crate::shape::Strided::contiguous(&sizes).strides;
    let arg_reads = |arg: usize| -> Option<Operand> {
        let strides = launch.strides.get(arg)?;
        if launch.offsets.get(arg).copied() != Some(0) {
            return None;
        }
        // A stride along an axis of size 1 never moves.
        let same = |expected: &dyn Fn(usize) -> i64| {
            strides.len() == sizes.len()
                && (0..sizes.len()).all(|d| sizes[d] == 1 || strides[d] == expected(d))
        };
        let last = sizes.len().checked_sub(1)?;
        if same(&|d| contiguous[d]) {
            Some(if arg == product {
                Operand::Product
            } else {
                Operand::Matrix
            })
        } else if arg != product && same(&|d| i64::from(d == last)) {
            Some(Operand::Bias)
        } else {
            None
        }
    };
    let out = ir.loads.len();
    if arg_reads(out)? != Operand::Matrix || arg_reads(product)? != Operand::Product {
        return None;
    }
    let out_dtype = store.view.dtype;
    let loads = |view: usize| -> Option<Term> {
        match arg_reads(view)? {
            Operand::Product => Some(Term::Product { alpha: 1.0 }),
            Operand::Bias => matches!(ir.loads[view].dtype, DType::F32 | DType::F16 | DType::BF16)
                .then_some(Term::Bias(view)),
            Operand::Matrix => (ir.loads[view].dtype == out_dtype).then_some(Term::Residual(view)),
        }
    };
    let body = &ir.body;
    let mut top = store.value;
    if let Some(Instr::Round { x, dtype }) = body.get(top)
        && *dtype == out_dtype
    {
        top = *x;
    }
    let (activation, sum) = activation_of(body, top);
    let mut terms = Vec::new();
    sum_terms(body, sum, &loads, &mut terms)?;
    let mut recognized = LtEpilogue {
        alpha: 1.0,
        bias: None,
        residual: None,
        activation,
        out_dtype,
    };
    let single_row = sizes.iter().rev().skip(1).all(|&s| s == 1);
    let mut products = 0;
    for term in terms {
        match term {
            Term::Product { alpha } => {
                products += 1;
                recognized.alpha = alpha;
            }
            Term::Bias(arg) if recognized.bias.is_none() => {
                recognized.bias = Some((arg, ir.loads[arg].dtype))
            }
            Term::Residual(arg) if recognized.residual.is_none() => recognized.residual = Some(arg),
            // One row: a bias and a matrix read alike, so either may be either.
            Term::Residual(arg) if single_row && recognized.bias.is_none() => {
                recognized.bias = Some((arg, ir.loads[arg].dtype))
            }
            Term::Bias(arg)
                if single_row
                    && recognized.residual.is_none()
                    && ir.loads[arg].dtype == out_dtype =>
            {
                recognized.residual = Some(arg)
            }
            _ => return None,
        }
    }
    (products == 1).then_some((recognized, out))
}

/// The activation `top` applies to the value it returns with it: ReLU as `max(x, +0)`, GELU's
/// tanh form exactly as its formula is written (products and sums in either order), or
/// none. Anything else is no activation, and the caller finds no sum in it.
fn activation_of(body: &[Instr], top: ValueId) -> (Activation, ValueId) {
    if let Some(Instr::Call {
        func: Func::Max,
        args,
        prec: Prec::F32,
    }) = body.get(top)
        && let [a, b] = args[..]
    {
        if is_positive_zero(body, b) {
            return (Activation::Relu, a);
        }
        if is_positive_zero(body, a) {
            return (Activation::Relu, b);
        }
    }
    let mut x = None;
    if gelu_tanh().matches(body, top, &mut x)
        && let Some(x) = x
    {
        return (Activation::GeluTanh, x);
    }
    (Activation::None, top)
}

/// An expression of one value `X` in f32, for matching instructions.
enum Pattern {
    X,
    /// A literal as the f32 instructions hold it (rounded to f32).
    Const(f64),
    /// An f32 sum or product: its operands in either order (both are exact in IEEE).
    Commutative(BinOp, Box<Pattern>, Box<Pattern>),
    Call(Func, Box<Pattern>),
}

/// `0.5·x·(1 + tanh(0.7978845608028654·(x + 0.044715·x·x·x)))`, as `ops.ron`'s `gelu_tanh`
/// writes it (left to right: `((0.5·x)·(…))`, `((0.044715·x)·x)·x`).
fn gelu_tanh() -> Pattern {
    use Pattern::*;
    let mul = |a, b| Commutative(BinOp::Mul, Box::new(a), Box::new(b));
    let add = |a, b| Commutative(BinOp::Add, Box::new(a), Box::new(b));
    let cube = mul(mul(mul(Const(0.044715), X), X), X);
    let inner = mul(Const(0.7978845608028654), add(X, cube));
    mul(
        mul(Const(0.5), X),
        add(Const(1.0), Call(Func::Tanh, Box::new(inner))),
    )
}

impl Pattern {
    /// Whether `id` computes this expression, with `x` the one value `X` stands for (bound
    /// by the first `X` matched, and then the same everywhere).
    fn matches(&self, body: &[Instr], id: ValueId, x: &mut Option<ValueId>) -> bool {
        match self {
            Pattern::X => match x {
                Some(bound) => *bound == id,
                None => {
                    *x = Some(id);
                    true
                }
            },
            Pattern::Const(value) => constant(body, id) == Some(f64::from(*value as f32)),
            Pattern::Call(func, arg) => matches!(
                body.get(id),
                Some(Instr::Call { func: f, args, prec: Prec::F32 })
                    if f == func && args.len() == 1 && arg.matches(body, args[0], x)
            ),
            Pattern::Commutative(op, p, q) => {
                let Some(Instr::Binary {
                    op: o,
                    a,
                    b,
                    prec: Prec::F32,
                }) = body.get(id)
                else {
                    return false;
                };
                if o != op {
                    return false;
                }
                for (first, second) in [(*a, *b), (*b, *a)] {
                    let mut tried = *x;
                    if p.matches(body, first, &mut tried) && q.matches(body, second, &mut tried) {
                        *x = tried;
                        return true;
                    }
                }
                false
            }
        }
    }
}

fn is_positive_zero(body: &[Instr], id: ValueId) -> bool {
    constant(body, id).is_some_and(|v| v == 0.0 && v.is_sign_positive())
}

/// The value of `id` when it is a constant (a literal, or a literal rounded to a dtype).
fn constant(body: &[Instr], id: ValueId) -> Option<f64> {
    match body.get(id)? {
        Instr::Const { value, .. } => Some(*value),
        Instr::Round { x, dtype } => Some(dtype.round(constant(body, *x)?)),
        _ => None,
    }
}

/// Appends the terms whose f32 sum `id` is; `None` when it is anything else.
fn sum_terms(
    body: &[Instr],
    id: ValueId,
    loads: &dyn Fn(usize) -> Option<Term>,
    terms: &mut Vec<Term>,
) -> Option<()> {
    match body.get(id)? {
        Instr::Load { view } => terms.push(loads(*view)?),
        // A rounding to a 16-bit float between the steps: skipped, as cuBLASLt keeps f32.
        Instr::Round {
            x,
            dtype: DType::F16 | DType::BF16,
        } => sum_terms(body, *x, loads, terms)?,
        Instr::Binary {
            op: BinOp::Add,
            a,
            b,
            prec: Prec::F32,
        } => {
            sum_terms(body, *a, loads, terms)?;
            sum_terms(body, *b, loads, terms)?;
        }
        // The product scaled by a constant, once: `alpha·P`.
        Instr::Binary {
            op: BinOp::Mul,
            a,
            b,
            prec: Prec::F32,
        } => {
            let (scale, product) = match (body.get(*a)?, body.get(*b)?) {
                (_, Instr::Load { view }) => (constant(body, *a)?, *view),
                (Instr::Load { view }, _) => (constant(body, *b)?, *view),
                _ => return None,
            };
            // The scale as cuBLASLt's f32 alpha, exactly.
            if f64::from(scale as f32) != scale {
                return None;
            }
            match loads(product)? {
                Term::Product { .. } => terms.push(Term::Product {
                    alpha: scale as f32,
                }),
                _ => return None,
            }
        }
        _ => return None,
    }
    Some(())
}

/// What an epilogue computes, `out = activation(alpha·product + residual + bias)`, with its
/// operands as `B`: the epilogue kernel's argument indices ([`recognize`]), or the buffers the
/// GEMM operation reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LtEpilogue<B> {
    pub alpha: f32,
    pub bias: Option<(B, DType)>,
    pub residual: Option<B>,
    pub activation: Activation,
    /// D's dtype (the GEMM's output buffer is the operation's `c`).
    pub out_dtype: DType,
}

impl<B> LtEpilogue<B> {
    /// The same epilogue with each operand mapped by `f`.
    pub fn map<C>(self, f: impl Fn(B) -> C) -> LtEpilogue<C> {
        LtEpilogue {
            alpha: self.alpha,
            bias: self.bias.map(|(b, dtype)| (f(b), dtype)),
            residual: self.residual.map(&f),
            activation: self.activation,
            out_dtype: self.out_dtype,
        }
    }
}

/// Whether cuBLASLt runs a GEMM of these types and shape with an epilogue: f16, bf16 or f32
/// operands, one call (a strided batch of equal matrices, or one matrix), and a product that
/// is not rounded again afterwards.
pub fn fits(types: &GemmTypes, shape: &GemmShape) -> bool {
    let float = |t: DType| matches!(t, DType::F16 | DType::BF16 | DType::F32);
    float(types.input)
        && float(types.output)
        && types.out_chain.is_none()
        && shape.calls.len() == 1
        && shape.k > 0
        && shape.n > 0
        && shape.m > 0
}

/// Whether cuBLASLt multiplies operands of `input` into an output of `out` with a bias of
/// `bias`, accumulating in f32: the output in the operands' dtype or in f32, the bias in the
/// output's dtype or in f32 (the combinations its documentation lists; a program asking for
/// another would lose all its epilogues to the re-plan when the heuristic finds none).
pub fn supports(input: DType, out: DType, bias: Option<DType>) -> bool {
    (out == input || out == DType::F32) && bias.is_none_or(|b| b == out || b == DType::F32)
}

fn data_type(dtype: DType) -> Result<sys::cudaDataType> {
    Ok(match dtype {
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        other => return Err(Error::backend(format!("cuBLASLt reads no {other}"))),
    })
}

/// A cuBLASLt handle of one device, with its workspace.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: u64,
}

// SAFETY: a cuBLASLt handle may be used from any thread as long as calls on it are
// serialized; the device keeps its `Lt` behind a mutex.
unsafe impl Send for Lt {}

/// One GEMM with its epilogue, described to cuBLASLt once (at executable build: creating
/// descriptors and choosing the algorithm allocate, which a graph capture forbids).
pub struct LtCall {
    desc: sys::cublasLtMatmulDesc_t,
    /// cuBLASLt's A (fusebox's B), B (fusebox's A), C and D.
    layouts: [sys::cublasLtMatrixLayout_t; 4],
    /// The algorithm for pointers aligned to [`ALIGNED`] bytes, and the one for any pointers
    /// (cuBLASLt's heuristic assumes 256-byte alignment unless told otherwise, and the
    /// buffers of a run are known only then: a caller's tensor may start anywhere).
    aligned: Algorithm,
    any: Algorithm,
    alpha: f32,
    beta: f32,
    /// Byte offsets of fusebox's A and B matrices in their buffers.
    a_offset: u64,
    b_offset: u64,
}

/// One algorithm cuBLASLt's heuristic chose, with the workspace it uses and the alignment of
/// every pointer it was chosen for.
#[derive(Clone, Copy)]
struct Algorithm {
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: usize,
    alignment: u64,
}

/// The alignment the fast algorithm asks of every pointer: 16 bytes, one vector access.
const ALIGNED: u64 = 16;

/// The largest power of two, at most 256, that divides every address.
fn alignment_of(addresses: impl IntoIterator<Item = u64>) -> u64 {
    addresses
        .into_iter()
        .fold(256, |align, a| align.min(1 << a.trailing_zeros().min(8)))
}

// SAFETY: descriptors are plain host objects, used only through `&mut CudaExecutable`.
unsafe impl Send for LtCall {}

impl Drop for LtCall {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created once by `Lt::prepare` and is destroyed once.
        // Failures here cannot be reported.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for layout in self.layouts {
                let _ = lt::destroy_matrix_layout(layout);
            }
        }
    }
}

/// The device addresses of one call: fusebox's A and B, the bias and residual (when the
/// epilogue has them) and the output.
#[derive(Debug, Clone, Copy)]
pub struct LtPointers {
    pub a: u64,
    pub b: u64,
    pub bias: Option<u64>,
    pub residual: Option<u64>,
    pub out: u64,
}

fn lt_error(what: &str, error: lt::CublasError) -> Error {
    Error::backend(format!("cuBLASLt: {what}: {error:?}"))
}

/// Sets attribute `attr` of `desc` to `value`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's type.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<()> {
    // SAFETY: per the caller; `value` is read before the call returns.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| lt_error(&format!("setting {attr:?}"), e))
}

/// A column-major layout of `rows × cols` with leading dimension `ld`, in a batch of `count`
/// matrices `stride` elements apart.
fn layout(
    dtype: DType,
    rows: usize,
    cols: usize,
    ld: usize,
    count: usize,
    stride: usize,
) -> Result<sys::cublasLtMatrixLayout_t> {
    let count = i32::try_from(count)
        .map_err(|_| Error::backend(format!("{count} matrices exceed cuBLASLt's batch")))?;
    let layout = lt::create_matrix_layout(data_type(dtype)?, rows as u64, cols as u64, ld as i64)
        .map_err(|e| lt_error("creating a matrix layout", e))?;
    if count > 1 {
        use sys::cublasLtMatrixLayoutAttribute_t as Attr;
        let stride = stride as i64;
        // SAFETY: a live layout; BATCH_COUNT is an int32, the batch offset an int64.
        let batch = unsafe {
            set_layout(layout, Attr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count).and_then(|()| {
                set_layout(
                    layout,
                    Attr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &stride,
                )
            })
        };
        if let Err(e) = batch {
            // SAFETY: created above, not yet returned.
            let _ = unsafe { lt::destroy_matrix_layout(layout) };
            return Err(lt_error("setting a batch", e));
        }
    }
    Ok(layout)
}

/// Sets attribute `attr` of `layout` to `value`.
///
/// # Safety
/// `layout` is live and `T` is the attribute's type.
unsafe fn set_layout<T>(
    layout: sys::cublasLtMatrixLayout_t,
    attr: sys::cublasLtMatrixLayoutAttribute_t,
    value: &T,
) -> std::result::Result<(), lt::CublasError> {
    // SAFETY: per the caller; `value` is read before the call returns.
    unsafe {
        lt::set_matrix_layout_attribute(
            layout,
            attr,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
}

impl Lt {
    /// Creates the handle (the context must be current) and its workspace.
    pub(super) fn new(device: &Device) -> Result<Lt> {
        let (workspace, bucket) = device.alloc(WORKSPACE_BYTES)?;
        let handle = lt::create_handle().map_err(|e| {
            device.release(workspace, bucket);
            lt_error("creating a handle", e)
        })?;
        Ok(Lt { handle, workspace })
    }

    /// Describes the GEMM of `types` and `shape` (one call, [`fits`]) with `epilogue`, and
    /// picks cuBLASLt's heuristic algorithm for it; an error when cuBLASLt has none.
    pub(super) fn prepare<B>(
        &mut self,
        types: &GemmTypes,
        shape: &GemmShape,
        epilogue: &LtEpilogue<B>,
    ) -> Result<LtCall> {
        if !fits(types, shape) {
            return Err(Error::backend("cuBLASLt cannot run this GEMM's epilogue"));
        }
        let call = &shape.calls[0];
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| lt_error("creating a matmul descriptor", e))?;
        // From here on, `prepared` owns the descriptors (dropped on an error).
        let mut prepared = LtCall {
            desc,
            layouts: [std::ptr::null_mut(); 4],
            aligned: Algorithm {
                // SAFETY: a plain C struct of integers, all-zero until the heuristic fills it.
                algo: unsafe { std::mem::zeroed() },
                workspace: 0,
                alignment: ALIGNED,
            },
            any: Algorithm {
                // SAFETY: as above.
                algo: unsafe { std::mem::zeroed() },
                workspace: 0,
                alignment: 1,
            },
            alpha: epilogue.alpha,
            beta: if epilogue.residual.is_some() {
                1.0
            } else {
                0.0
            },
            a_offset: (call.a_offset * types.input.size_bytes()) as u64,
            b_offset: (call.b_offset * types.input.size_bytes()) as u64,
        };
        let op = |transposed: bool| match transposed {
            true => cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T,
            false => cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        };
        use sys::cublasLtEpilogue_t as Kind;
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        let kind = match (epilogue.bias.is_some(), epilogue.activation) {
            (false, Activation::None) => Kind::CUBLASLT_EPILOGUE_DEFAULT,
            (false, Activation::Relu) => Kind::CUBLASLT_EPILOGUE_RELU,
            (false, Activation::GeluTanh) => Kind::CUBLASLT_EPILOGUE_GELU,
            (true, Activation::None) => Kind::CUBLASLT_EPILOGUE_BIAS,
            (true, Activation::Relu) => Kind::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, Activation::GeluTanh) => Kind::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        // SAFETY: a live descriptor; each value has its attribute's type.
        unsafe {
            set_desc(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSA,
                &op(shape.b.transposed),
            )?;
            set_desc(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSB,
                &op(shape.a.transposed),
            )?;
            set_desc(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &kind)?;
            if let Some((_, dtype)) = epilogue.bias {
                set_desc(
                    desc,
                    Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                    &data_type(dtype)?,
                )?;
            }
        }
        // Column-major, as for cuBLAS: fusebox's row-major `C[rows×m] = A·B` is cuBLASLt's
        // `Dᵀ[m×rows] = Bᵀ·Aᵀ`, so cuBLASLt's A is fusebox's B (stored `m×k`, or `k×m` read
        // transposed) and its B is fusebox's A.
        let (m, k, rows) = (shape.m, shape.k, call.rows);
        let stored = |transposed: bool, r: usize, c: usize| match transposed {
            false => (r, c),
            true => (c, r),
        };
        let (ar, ac) = stored(shape.b.transposed, m, k);
        let (br, bc) = stored(shape.a.transposed, k, rows);
        prepared.layouts[0] = layout(types.input, ar, ac, shape.b.ld, call.count, call.b_stride)?;
        prepared.layouts[1] = layout(types.input, br, bc, shape.a.ld, call.count, call.a_stride)?;
        for i in 2..4 {
            prepared.layouts[i] = layout(epilogue.out_dtype, m, rows, m, call.count, rows * m)?;
        }
        let element = types
            .input
            .size_bytes()
            .min(epilogue.out_dtype.size_bytes()) as u64;
        for alignment in [ALIGNED, element] {
            let what = format!(
                "a {} GEMM {rows}x{k} by {k}x{m} with epilogue {kind:?} into {} ({alignment}-byte pointers)",
                types.input, epilogue.out_dtype
            );
            let (algo, workspace) = self
                .heuristic(
                    &prepared,
                    epilogue.bias.as_ref().map(|(_, t)| *t),
                    alignment,
                )
                .map_err(|e| lt_error(&format!("no algorithm for {what}"), e))?;
            let choice = Algorithm {
                algo,
                workspace,
                alignment,
            };
            match alignment {
                ALIGNED => prepared.aligned = choice,
                _ => prepared.any = choice,
            }
        }
        Ok(prepared)
    }

    /// cuBLASLt's heuristic choice for `call` with every pointer aligned to `alignment` bytes
    /// (the bias pointer too, when there is one: the heuristic reads its value, never what it
    /// points to, so an address of that alignment stands in until the run sets the real one).
    fn heuristic(
        &mut self,
        call: &LtCall,
        bias: Option<DType>,
        alignment: u64,
    ) -> std::result::Result<(sys::cublasLtMatmulAlgo_t, usize), lt::CublasError> {
        use sys::cublasLtMatmulPreferenceAttributes_t as Pref;
        let pref = lt::create_matmul_pref()?;
        let workspace = WORKSPACE_BYTES as u64;
        // No split-K reduction in the output's dtype: a long f16 sum is never rounded to f16
        // halfway (cuBLAS's `DISALLOW_REDUCED_PRECISION_REDUCTION`).
        let schemes = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_INPLACE as u32
            | sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
        let align32 = alignment as u32;
        // SAFETY: a live preference and descriptor; each value has its attribute's type
        // (uint64 workspace, uint32 scheme mask and alignments, a `void*` bias pointer).
        let chosen = unsafe {
            let set = |attr, value: *const c_void, size| {
                lt::set_matmul_pref_attribute(pref, attr, value, size)
            };
            set(
                Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &workspace as *const u64 as *const c_void,
                8,
            )
            .and_then(|()| {
                set(
                    Pref::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                    &schemes as *const u32 as *const c_void,
                    4,
                )
            })
            .and_then(|()| {
                [
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                ]
                .into_iter()
                .try_for_each(|attr| set(attr, &align32 as *const u32 as *const c_void, 4))
            })
            .and_then(|()| match bias {
                // A bias is always aligned to its own element.
                Some(dtype) => lt::set_matmul_desc_attribute(
                    call.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &(alignment.max(dtype.size_bytes() as u64) as *const c_void)
                        as *const *const c_void as *const c_void,
                    std::mem::size_of::<*const c_void>(),
                ),
                None => Ok(()),
            })
            .and_then(|()| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    call.desc,
                    call.layouts[0],
                    call.layouts[1],
                    call.layouts[2],
                    call.layouts[3],
                    pref,
                )
            })
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        chosen.map(|h| (h.algo, h.workspaceSize))
    }

    /// Queues the call on `stream`.
    pub(super) fn matmul(&mut self, stream: CuStream, call: &LtCall, at: LtPointers) -> Result<()> {
        if let Some(bias) = at.bias {
            // SAFETY: a live descriptor; the bias pointer is a device address (a `void*`).
            unsafe {
                set_desc(
                    call.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &(bias as *const c_void),
                )?
            };
        }
        let c = at.residual.unwrap_or(at.out);
        let (a, b) = (at.a + call.a_offset, at.b + call.b_offset);
        let alignment = alignment_of([a, b, c, at.out].into_iter().chain(at.bias));
        let chosen = match alignment >= call.aligned.alignment {
            true => &call.aligned,
            false => &call.any,
        };
        // SAFETY: the plan keeps every matrix inside its buffer; alpha and beta are host f32s
        // (the scale type) read before the call returns; the workspace is the handle's.
        unsafe {
            lt::matmul(
                self.handle,
                call.desc,
                &call.alpha as *const f32 as *const c_void,
                &call.beta as *const f32 as *const c_void,
                b as *const c_void,
                call.layouts[0],
                a as *const c_void,
                call.layouts[1],
                c as *const c_void,
                call.layouts[2],
                at.out as *mut c_void,
                call.layouts[3],
                &chosen.algo,
                self.workspace as *mut c_void,
                chosen.workspace,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_error("matmul", e))
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once. A failure here cannot be reported.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The alignment a run's pointers share picks the algorithm: 256-byte pool blocks and a
    /// row slice 4 floats in are 16-byte aligned; a tensor one f16 into a buffer is not.
    #[test]
    fn pointers_share_their_smallest_power_of_two() {
        assert_eq!(alignment_of([0x7f00_0000_0000, 0x7f00_0000_0100]), 256);
        assert_eq!(alignment_of([0x7f00_0000_0000, 0x7f00_0000_0010]), 16);
        assert_eq!(alignment_of([0x7f00_0000_0002, 0x7f00_0000_0100]), 2);
        assert_eq!(alignment_of([]), 256);
    }
}
