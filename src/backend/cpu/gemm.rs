//! The CPU backend's matrix products: a GEMM fusebox owns as C source (`gemm.c`), compiled
//! once through the kernel [`Compiler`] and its caches, and called for every library matmul of
//! an f32, f16 or bf16 product.
//!
//! Why C that fusebox emits rather than a library: the GEMM runs on the OpenMP threads the
//! generated kernels already use (one thread pool, never two competing for the cores, as the
//! `matrixmultiply` crate's own threads did), it packs its operands straight from their
//! storage format through row and column strides (f16 and bf16 are widened, and absorbed casts
//! rounded, while packing: no converted copy of an operand exists), and each finished output
//! tile can run a generated epilogue kernel (bias, activation, residual add) while it is in
//! cache ([`EpilogueCall`]), so the product is never written and read back. `benches/gemm.py`
//! measures it beside torch and NumPy (see benches/RESULTS.md).
//!
//! Semantics are [`crate::runtime::matmul`]'s: operands rounded to the product's dtype (after
//! an absorbed cast's rounding), f32 arithmetic, the result rounded once to the product's
//! dtype. The sum runs in a different order (and with fused multiply-adds), as any GEMM's.
//! Where both operands are bf16 values and the CPU has AVX512-BF16, the products run on
//! `vdpbf16ps` (pairs along K at twice the f32 rate). It adds each pair's two products (exact
//! in f32) to the accumulator in turn, and the pairs are packed so that it does so in the f32
//! microkernel's order: the two paths agree bit for bit, except that `vdpbf16ps` reads bf16
//! subnormals as zero and flushes subnormal sums (a difference far inside the bf16 tolerance).
//! Products the GEMM does not cover (integer and f64 products, operands stored as f64 or
//! integers, casts through f64 or integers) go to [`matmul::matmul_elements`].

use super::compiler::{Compiler, KernelFn, Module};
use super::phases::{self, ImageRead};
use crate::dtype::DType;
use crate::error::Result;
use crate::lower::{MatMulOperand, ResultView};
use crate::runtime::buffer::{AllocError, Buffer, Elements, ElementsMut};
use crate::runtime::matmul::{self, MatMulError, OperandLayout, ProductShape, StridedProduct};
use crate::shape::Padding;
use std::ffi::c_void;
use std::sync::Arc;

/// The conversion helpers every kernel uses (f16/bf16 to and from f32, rounding).
const HELPERS: &str = include_str!("emit/prelude.c");
/// The GEMM itself; its header comment documents the argument ABI.
const GEMM: &str = include_str!("gemm.c");
/// The GEMM's entry point in the compiled module.
const ENTRY: &str = "fusebox_gemm";

/// The padded copy's entry point in `gemm.c`.
const PAD_ROWS: &str = "fusebox_pad_rows";

/// The complete C translation unit of the GEMM.
pub fn source() -> String {
    format!("{HELPERS}\n#if defined(__AVX512F__)\n#include <immintrin.h>\n#endif\n\n{GEMM}")
}

/// The loaded GEMM.
pub struct Gemm {
    function: KernelFn,
    /// `fusebox_pad_rows`: a padded operand's rows copied into its zeros by the threads.
    pad_rows: KernelFn,
    /// The library stays loaded as long as `function` may be called.
    _module: Arc<Module>,
}

impl std::fmt::Debug for Gemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gemm").finish_non_exhaustive()
    }
}

/// [`matmul::matmul_elements`] into a product of its own, then placed in `out` (the buffer
/// of the transpose `result` is) element by element.
fn placed_elements(
    a: Elements<'_>,
    a_op: &MatMulOperand,
    b: Elements<'_>,
    b_op: &MatMulOperand,
    mut out: ElementsMut<'_>,
    result: &ResultView,
) -> std::result::Result<(), MatMulError> {
    let (a_shape, b_shape) = (a_op.layout(a.shape).0, b_op.layout(b.shape).0);
    let product_shape = ProductShape::of(&a_shape, &b_shape)?;
    let mut shape = product_shape.batch;
    shape.extend([product_shape.rows, product_shape.cols]);
    let mut product = crate::runtime::buffer::Buffer::try_zeroed(out.dtype, &shape)
        .map_err(|_| MatMulError::PackingAlloc)?;
    matmul::matmul_elements(a, a_op, b, b_op, product.elements_mut())?;
    let integer = out.dtype.category() == crate::dtype::Category::Integer;
    for q in 0..out.len() {
        let at = result.read.element(out.shape, q);
        let from = usize::try_from(at)
            .ok()
            .filter(|&e| e < product.len())
            .ok_or(MatMulError::ViewOutOfBounds { operand: "result" })?;
        match integer {
            true => out.set_int(q, product.get_int(from)),
            false => out.set(q, product.get(from)),
        }
    }
    Ok(())
}

/// The product on [`matmul::matmul_elements`] (operand views gathered first), placed through
/// `result` where given: for what the GEMM does not read. Returns `false`: the caller runs
/// any epilogue.
fn portable(
    a: Elements<'_>,
    a_op: &MatMulOperand,
    b: Elements<'_>,
    b_op: &MatMulOperand,
    out: ElementsMut<'_>,
    result: Option<&ResultView>,
) -> std::result::Result<bool, MatMulError> {
    match result {
        None => matmul::matmul_elements(a, a_op, b, b_op, out).map(|_| false),
        Some(result) => placed_elements(a, a_op, b, b_op, out, result).map(|_| false),
    }
}

/// The row and column strides of the result matrices of a product of shape `shape` (batch
/// dims, rows, columns) written through `result`, and each matrix's first element.
fn result_matrices(result: &ResultView, shape: &[usize]) -> ([i64; 2], Vec<i64>) {
    let write = &result.write;
    let rank = shape.len();
    let matrix = shape[rank - 2] * shape[rank - 1];
    let batches: usize = shape[..rank - 2].iter().product();
    let offsets = (0..batches)
        .map(|i| write.element(shape, i * matrix))
        .collect();
    ([write.strides[rank - 2], write.strides[rank - 1]], offsets)
}

/// `product` as one product of all its left-hand rows, where its batch shares one right-hand
/// matrix and its left-hand matrices follow one another at a constant step that continues
/// their row stride (any step, for one-row matrices). The result's matrices are contiguous,
/// so its rows follow one another too.
fn fold_batches(product: &StridedProduct) -> Option<StridedProduct> {
    if product.a_split.is_some() {
        return None;
    }
    let (&(a0, b0), rest) = product.offsets.split_first()?;
    let step = rest.first()?.0 - a0;
    let shared = product.offsets.iter().all(|&(_, b)| b == b0);
    let even = (0i64..)
        .zip(&product.offsets)
        .all(|(i, &(a, _))| a == a0 + i * step);
    let row_stride = match product.rows {
        1 => step,
        rows if step == rows as i64 * product.a_strides[0] => product.a_strides[0],
        _ => return None,
    };
    (shared && even).then(|| StridedProduct {
        batch: Vec::new(),
        rows: product.rows * product.offsets.len(),
        a_strides: [row_stride, product.a_strides[1]],
        offsets: vec![(a0, b0)],
        ..product.clone()
    })
}

/// The GEMM's code for a storage or rounding dtype.
fn code(dtype: DType) -> Option<i64> {
    match dtype {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        _ => None,
    }
}

/// How an operand stored as `source` is read: its dtype code and the roundings (codes, 0 for
/// none) that make it the value the product multiplies, the absorbed `cast` first, then the
/// product's dtype. A rounding is left out where the value is already exact in that dtype.
/// `None` where the GEMM cannot read the operand.
fn operand_plan(source: DType, cast: Option<DType>, product: DType) -> Option<[i64; 3]> {
    let mut plan = [code(source)?, 0, 0];
    let mut exact_in = source;
    let mut next = 1;
    for step in cast.into_iter().chain([product]) {
        code(step)?;
        if step != DType::F32 && step != exact_in {
            plan[next] = code(step)?;
            next += 1;
            exact_in = step;
        }
    }
    Some(plan)
}

/// Where the GEMM reads an operand's first element: `None` unless it is stored as f32, f16
/// or bf16.
fn operand_ptr(x: &Elements<'_>) -> Option<*const c_void> {
    match (x.as_f32(), x.as_u16()) {
        (Some(s), _) => Some(s.as_ptr() as *const c_void),
        (_, Some(s)) => Some(s.as_ptr() as *const c_void),
        _ => None,
    }
}

/// A generated kernel the GEMM runs on each finished tile of the product (`fb_gemm_epilogue`
/// in `gemm.c`, field for field): the kernel, the rank of its domain (the product's shape),
/// its argument count, the argument that reads the product, whether the product is stored
/// too, and its launch over the whole domain (sizes, flat strides, offsets, pointers). An
/// epilogue ending in reductions gives the kernel's form run per tile, the function that
/// finishes its reductions and a [`TileReduction`] per reduction
/// (`backend::cpu::emit::emit_tile_functions`); any other gives no `finish` and none.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EpilogueCall {
    pub kernel: KernelFn,
    pub rank: i64,
    pub args: i64,
    pub product: i64,
    pub store_product: i64,
    pub sizes: *const i64,
    pub strides: *const i64,
    pub offsets: *const i64,
    pub ptrs: *const *mut c_void,
    pub finish: Option<KernelFn>,
    pub reductions: i64,
    pub reduction: *const TileReduction,
    /// The rows of each batch matrix where the GEMM multiplies a batch's matrices as one tall
    /// matrix (`fold_batches`; its tiles then cut across them), else 0. The GEMM sets it.
    pub fold_rows: i64,
}

/// A reduction ending an epilogue, as the GEMM keeps its per-tile parts (`fb_gemm_reduction`
/// in `gemm.c`, field for field): the kernel argument that is its result, the elements of the
/// result's buffer (each block of accumulators has as many), the bits of its accumulators'
/// starting value (an `f64`, or an `i64` for integers) and, as bit `d`, whether it reduces
/// domain axis `d`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileReduction {
    pub arg: i64,
    pub span: i64,
    pub identity: i64,
    pub reduced: i64,
}

/// Where a product goes besides its buffer: the transpose of it it is written as, and the
/// epilogue run on each of its tiles (either or neither; the partition never gives a call
/// both). `packed_b` is where the right-hand matrix is kept packed for the run's later
/// products by the same matrix ([`PackedB`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement<'a> {
    pub result: Option<&'a ResultView>,
    pub epilogue: Option<&'a EpilogueCall>,
    pub packed_b: Option<&'a PackedB>,
    /// Where the padded buffer its right-hand operand is read from is kept for the next
    /// product of the same padding ([`KeptPadding`]).
    pub padding: Option<&'a KeptPadding>,
}

/// The padded buffer of a convolution's image, where the GEMM reads one (an AMP convolution,
/// whose image the packers round; an f32 one reads slabs of its image instead, see
/// [`super::phases`]), kept from one product to the next (the next convolution of a ResNet
/// stage, the same one in the next run). Each product copies its
/// image into the buffer's interior and nothing ever writes the border, so the zeros made
/// when it was allocated stay: a fresh buffer per product cost a ResNet block's two
/// convolutions an allocation of a few MiB each, whose pages the system then faulted in and
/// zeroed (3% of the block's time). One buffer, the last one used, is kept, and reused only
/// for the very geometry and dtype it was made for; products run one at a time, so it is
/// never used by two (a buffer per step instead was slower: two images where one stays in
/// cache, measured in benches/RESULTS.md, 2026-11-30, session 4).
#[derive(Debug, Default)]
pub struct KeptPadding {
    kept: std::cell::RefCell<Option<(Padding, DType, Buffer)>>,
}

impl KeptPadding {
    /// The kept buffer, where it was made for `padding` and `dtype`: the caller owns it until
    /// it gives it back ([`KeptPadding::keep`]).
    fn take(&self, padding: &Padding, dtype: DType) -> Option<Buffer> {
        let mut kept = self.kept.borrow_mut();
        match kept.take() {
            Some((p, d, buffer)) if p == *padding && d == dtype => Some(buffer),
            other => {
                *kept = other;
                None
            }
        }
    }

    /// Keeps `buffer`, the padded buffer of `padding` in `dtype` with zeros on its border.
    fn keep(&self, padding: &Padding, dtype: DType, buffer: Buffer) {
        *self.kept.borrow_mut() = Some((padding.clone(), dtype, buffer));
    }
}

/// The GEMM's column strip width (`FB_GEMM_NR` in `gemm.c`): a packed B of K rows and N
/// columns takes `K · round_up(N, GEMM_NR)` floats.
const GEMM_NR: usize = 48;

/// `fb_gemm_packed_b` in `gemm.c`, field for field.
#[repr(C)]
#[derive(Debug)]
struct PackedBHeader {
    data: *mut f32,
    floats: i64,
    valid: i64,
    key: [i64; 10],
}

/// A right-hand matrix packed once per run and read from here by every product of the run
/// that multiplies by it: an RNN's recurrent weights are one matrix for every time step, and
/// packing them (a pass over the whole matrix, strided where it is read transposed) cost as
/// much as a step's small product. The GEMM fills it on its first call and checks on each
/// later one that it holds this very matrix (address, strides, dtype, roundings, sizes,
/// blocking); the executable clears it before each run, since an input's contents may change
/// between runs.
#[derive(Debug)]
pub struct PackedB {
    header: Box<std::cell::UnsafeCell<PackedBHeader>>,
    layout: std::alloc::Layout,
}

impl PackedB {
    /// The bytes a packed `k × n` right-hand matrix takes (`None` past `usize`).
    pub fn bytes(k: usize, n: usize) -> Option<usize> {
        k.checked_mul(n.div_ceil(GEMM_NR).checked_mul(GEMM_NR)?)?
            .max(1)
            .checked_mul(4)
    }

    /// Room for a `k × n` right-hand matrix, or `None` where the system refuses it.
    pub fn new(k: usize, n: usize) -> Option<PackedB> {
        let bytes = PackedB::bytes(k, n)?;
        let floats = bytes / 4;
        let layout = std::alloc::Layout::from_size_align(bytes, 64).ok()?;
        // SAFETY: the layout has a non-zero size.
        let data = unsafe { std::alloc::alloc(layout) } as *mut f32;
        if data.is_null() {
            return None;
        }
        let header = PackedBHeader {
            data,
            floats: floats as i64,
            valid: 0,
            key: [0; 10],
        };
        Some(PackedB {
            header: Box::new(std::cell::UnsafeCell::new(header)),
            layout,
        })
    }

    /// Forgets what the buffer holds: the next product packs its matrix again.
    pub fn clear(&mut self) {
        self.header.get_mut().valid = 0;
    }

    fn as_ptr(&self) -> *mut c_void {
        self.header.get() as *mut c_void
    }
}

impl Drop for PackedB {
    fn drop(&mut self) {
        // SAFETY: `data` was allocated with `layout` in `new` and is freed once, here.
        unsafe { std::alloc::dealloc(self.header.get_mut().data as *mut u8, self.layout) }
    }
}

/// One call of the GEMM, in its ABI (see `gemm.c`): sizes, strides and per-matrix offsets,
/// all in elements, and the operand axes read through sub-axes.
#[derive(Debug, Clone)]
struct Call {
    sizes: [i64; 11],
    strides: [i64; 6],
    offsets: Vec<i64>,
    split: Option<SplitAxesHeader>,
    zeros: Option<PadHeader>,
    /// B's rows in its image, where B is read from the image ([`super::phases`]).
    image: Option<ImageRows>,
}

/// The most sub-axes the GEMM reads one operand axis through (`FB_GEMM_SUB` in `gemm.c`).
const GEMM_SUB_AXES: usize = 8;

/// `fb_gemm_axis` in `gemm.c`, field for field: `n` (size, stride) pairs, outermost first;
/// `n = 0` for an axis read through its one stride.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SubAxesHeader {
    n: i64,
    size: [i64; GEMM_SUB_AXES],
    stride: [i64; GEMM_SUB_AXES],
}

/// `fb_gemm_split` in `gemm.c`: A's rows and columns, then B's.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SplitAxesHeader {
    axes: [SubAxesHeader; 4],
}

/// The most padded axes the GEMM reads a padding through (`FB_GEMM_PAD` in `gemm.c`).
const GEMM_PAD_AXES: usize = 4;

/// `fb_gemm_pad` in `gemm.c`, field for field: per padded axis of the right-hand operand's
/// padding, the range of coordinates inside the source (from the view's first element) and
/// the coordinate steps of its row and column sub-axes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct PadHeader {
    n: i64,
    lo: [i64; GEMM_PAD_AXES],
    hi: [i64; GEMM_PAD_AXES],
    rows: [SubAxesHeader; GEMM_PAD_AXES],
    cols: [SubAxesHeader; GEMM_PAD_AXES],
}

/// `product`, whose right-hand operand reads `padding` (its offsets and strides over the
/// padded shape), moved onto the stored source: offsets and strides in the source's elements,
/// with sub-axes on both matrix axes, and the padded axes' coordinates by which the GEMM
/// tells zeros from elements. `None` where the view's steps are not whole steps along the
/// padded axes ([`Padding::coordinates`]), a batch matrix starts elsewhere on a padded axis,
/// or there are more padded axes or sub-axes than the GEMM reads: the padding is then built.
fn unpad_right(product: &StridedProduct, padding: &Padding) -> Option<(StridedProduct, PadHeader)> {
    let [rows, cols] = match &product.b_split {
        Some(split) => split.clone(),
        None => [
            vec![(product.inner, product.b_strides[0])],
            vec![(product.cols, product.b_strides[1])],
        ],
    };
    let padded: Vec<usize> = (0..padding.source.len())
        .filter(|&d| padding.before[d] + padding.after[d] > 0)
        .collect();
    if padded.len() > GEMM_PAD_AXES || rows.len() > GEMM_SUB_AXES || cols.len() > GEMM_SUB_AXES {
        return None;
    }
    let sub: Vec<(usize, i64)> = rows.iter().chain(&cols).copied().collect();
    let strides = crate::shape::Strided::contiguous(&padding.source).strides;
    // The source offset of coordinates `c`, less `before` where `from` says so.
    let offset = |c: &[i64], shifted: bool| -> Option<i64> {
        (0..c.len()).try_fold(0i64, |at, d| {
            let shift = if shifted { padding.before[d] as i64 } else { 0 };
            at.checked_add(c[d].checked_sub(shift)?.checked_mul(strides[d])?)
        })
    };
    let first = padding.coordinates(product.offsets.first()?.1, &sub)?;
    let mut offsets = Vec::with_capacity(product.offsets.len());
    for &(a, b) in &product.offsets {
        let c = padding.coordinates(b, &sub)?;
        if padded.iter().any(|&d| c.start[d] != first.start[d]) {
            return None;
        }
        offsets.push((a, offset(&c.start, true)?));
    }
    let (row_steps, col_steps) = first.steps.split_at(rows.len());
    let moved = |axes: &[(usize, i64)], steps: &[Vec<i64>]| -> Option<Vec<(usize, i64)>> {
        axes.iter()
            .zip(steps)
            .map(|(&(n, _), step)| Some((n, offset(step, false)?)))
            .collect()
    };
    let split = [moved(&rows, row_steps)?, moved(&cols, col_steps)?];
    let coordinate_axis = |axes: &[(usize, i64)], steps: &[Vec<i64>], d: usize| {
        let mut header = SubAxesHeader {
            n: axes.len() as i64,
            ..SubAxesHeader::default()
        };
        for (k, (&(n, _), step)) in axes.iter().zip(steps).enumerate() {
            header.size[k] = n as i64;
            header.stride[k] = step[d];
        }
        header
    };
    let mut header = PadHeader {
        n: padded.len() as i64,
        ..PadHeader::default()
    };
    for (p, &d) in padded.iter().enumerate() {
        header.lo[p] = padding.before[d] as i64 - first.start[d];
        header.hi[p] = (padding.before[d] + padding.source[d]) as i64 - first.start[d];
        header.rows[p] = coordinate_axis(&rows, row_steps, d);
        header.cols[p] = coordinate_axis(&cols, col_steps, d);
    }
    let innermost = |axes: &[(usize, i64)]| axes.last().map_or(0, |&(_, s)| s);
    let moved = StridedProduct {
        b_strides: [innermost(&split[0]), innermost(&split[1])],
        b_split: Some(split),
        offsets,
        ..product.clone()
    };
    Some((moved, header))
}

/// Where each result matrix of `product` goes: its row and column strides and per-matrix
/// offsets, contiguous, or through the result's view.
fn result_layout(
    result: Option<&ResultView>,
    product: &StridedProduct,
) -> std::result::Result<([i64; 2], Vec<i64>), MatMulError> {
    Ok(match result {
        None => (
            [product.cols as i64, 1],
            (0..product.offsets.len())
                .map(|i| (i * product.rows * product.cols) as i64)
                .collect::<Vec<_>>(),
        ),
        Some(r) => {
            let mut shape = product.batch.clone();
            shape.extend([product.rows, product.cols]);
            if r.write.strides.len() != shape.len() {
                return Err(MatMulError::ViewOutOfBounds { operand: "result" });
            }
            result_matrices(r, &shape)
        }
    })
}

/// A convolution's product reading its image in slabs ([`super::phases`]): where `b` is f32
/// read as it is (`plan`: no rounding), the product reads it through sub-axes over a padding
/// or with its columns at a stride, and `padding` (or no padding) is of `b` itself. (A
/// stride-1 convolution without padding reads its image in place, no slab needed.)
fn image_of(
    product: &StridedProduct,
    padding: Option<&Padding>,
    b: &Elements<'_>,
    plan: [i64; 3],
) -> Option<ImageRead> {
    let strided = product.b_strides[1] > 1;
    if b.dtype != DType::F32 || plan[1] != 0 || plan[2] != 0 || !(strided || padding.is_some()) {
        return None;
    }
    if b.shape.is_empty() || b.shape.len() > GEMM_IMAGE_AXES {
        return None;
    }
    phases::image_read(product, &*Padding::of_view(padding, b.shape)?)
}

/// The most axes an image read in slabs has (`FB_GEMM_IMAGE` in `gemm.c`).
const GEMM_IMAGE_AXES: usize = 8;

/// `fb_gemm_image` in `gemm.c`, field for field; its pointers point into the [`ImageRows`]
/// it is made from.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ImageHeader {
    rank: i64,
    first: i64,
    inner: i64,
    outers: i64,
    source: [i64; GEMM_IMAGE_AXES],
    before: [i64; GEMM_IMAGE_AXES],
    after: [i64; GEMM_IMAGE_AXES],
    factors: [i64; GEMM_IMAGE_AXES],
    outer: *const i64,
    offset: *const i64,
}

/// A call's image read ([`ImageRead`]) as the GEMM takes it: the header (its pointers set
/// when the call is made) and the rows' outer indices and quotient offsets it points to.
#[derive(Debug, Clone)]
struct ImageRows {
    header: ImageHeader,
    outer: Vec<i64>,
    offset: Vec<i64>,
}

impl ImageRows {
    fn of(phases: &phases::Phases, outer: Vec<i64>, offset: Vec<i64>) -> ImageRows {
        let (outers, inner) = phases.extents();
        let axes = |field: &[usize]| {
            let mut axes = [0i64; GEMM_IMAGE_AXES];
            for (slot, &n) in axes.iter_mut().zip(field) {
                *slot = n as i64;
            }
            axes
        };
        let header = ImageHeader {
            rank: phases.padding.source.len() as i64,
            first: phases.first as i64,
            inner: inner as i64,
            outers: outers as i64,
            source: axes(&phases.padding.source),
            before: axes(&phases.padding.before),
            after: axes(&phases.padding.after),
            factors: axes(&phases.factors),
            outer: std::ptr::null(),
            offset: std::ptr::null(),
        };
        ImageRows {
            header,
            outer,
            offset,
        }
    }

    /// The header, pointing into `self`.
    fn header(&self) -> ImageHeader {
        ImageHeader {
            outer: self.outer.as_ptr(),
            offset: self.offset.as_ptr(),
            ..self.header
        }
    }
}

/// [`unpad_right`] where the packers should make the zeros of the right-hand operand's
/// padding of a `stored` value: measured (benches/RESULTS.md, 2026-11-30), they pay where they
/// read the image at a stride (a strided convolution's positions), and building the padded
/// image in one pass pays where they read runs of neighbours (stride 1: 3-9% faster).
fn packed_zeros(
    product: &StridedProduct,
    padding: &Padding,
    stored: &[usize],
) -> Option<(StridedProduct, PadHeader)> {
    (padding.source == stored && product.b_strides[1] != 1)
        .then(|| unpad_right(product, padding))
        .flatten()
}

impl SplitAxesHeader {
    /// The header of a product's split operand axes; `None` where an axis has more sub-axes
    /// than the GEMM reads.
    fn of(product: &StridedProduct) -> Option<Option<SplitAxesHeader>> {
        if product.a_split.is_none() && product.b_split.is_none() {
            return Some(None);
        }
        let mut header = SplitAxesHeader::default();
        let operands = [&product.a_split, &product.b_split];
        for (i, split) in operands.into_iter().enumerate() {
            for (j, sub) in split.iter().flatten().enumerate() {
                if sub.len() > GEMM_SUB_AXES {
                    return None;
                }
                let axis = &mut header.axes[2 * i + j];
                axis.n = sub.len() as i64;
                for (k, &(size, stride)) in sub.iter().enumerate() {
                    axis.size[k] = size as i64;
                    axis.stride[k] = stride;
                }
            }
        }
        Some(Some(header))
    }
}

impl Gemm {
    /// Compiles the GEMM (or finds it in `compiler`'s caches) and loads it.
    pub fn new(compiler: &Compiler) -> Result<Gemm> {
        let module = compiler.compile(&source())?;
        Ok(Gemm {
            function: module.kernel(ENTRY)?,
            pad_rows: module.kernel(PAD_ROWS)?,
            _module: module,
        })
    }

    /// [`matmul::unpadded`] with the rows copied by the GEMM's threads (`fusebox_pad_rows`):
    /// the padded image of a stride-1 convolution is a few MiB per call, and copied on the
    /// calling thread alone it left the other threads waiting. The buffer is `kept`'s where it
    /// holds one of this geometry (its border is then zero already).
    fn unpadded(
        &self,
        x: Elements<'_>,
        op: &MatMulOperand,
        operand: &'static str,
        kept: Option<&KeptPadding>,
    ) -> std::result::Result<Option<(Buffer, MatMulOperand)>, MatMulError> {
        matmul::unpadded_by(x, op, operand, |x, padding| {
            let reused = kept.and_then(|k| k.take(padding, x.dtype));
            self.padded(x, padding, reused)
        })
    }

    /// [`Buffer::padded_from`], the rows copied by `fusebox_pad_rows` into `reused` (a buffer
    /// of this padding with zeros on its border) or a new buffer of zeros; for other dtypes
    /// than the GEMM reads, and for a scalar, `Buffer::padded_from` itself.
    fn padded(
        &self,
        x: Elements<'_>,
        padding: &Padding,
        reused: Option<Buffer>,
    ) -> Option<std::result::Result<Buffer, AllocError>> {
        if x.shape != padding.source.as_slice() {
            return None;
        }
        let Some(source) = operand_ptr(&x).filter(|_| !x.shape.is_empty()) else {
            return Buffer::padded_from(x, padding);
        };
        let mut buffer =
            match reused.map_or_else(|| Buffer::try_zeroed(x.dtype, &padding.padded()), Ok) {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
        let geometry: Vec<i64> = [x.shape.len(), x.dtype.size_bytes()]
            .into_iter()
            .chain(padding.source.iter().copied())
            .chain(padding.before.iter().copied())
            .chain(padding.after.iter().copied())
            .map(|n| n as i64)
            .collect();
        let ptrs = [source as *mut c_void, buffer.as_mut_ptr() as *mut c_void];
        // SAFETY: the source holds `x.shape`'s elements, which `padding.source` equals, and the
        // buffer the padded shape's; each row lands inside it (the padding's own geometry).
        unsafe {
            (self.pad_rows)(
                geometry.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                ptrs.as_ptr(),
            );
        }
        Some(Ok(buffer))
    }

    /// `out = a @ b` with NumPy's matmul rules, as [`matmul::matmul_elements`] computes it.
    pub fn matmul(
        &self,
        a: Elements<'_>,
        a_op: &MatMulOperand,
        b: Elements<'_>,
        b_op: &MatMulOperand,
        out: ElementsMut<'_>,
    ) -> std::result::Result<(), MatMulError> {
        // SAFETY: no epilogue.
        unsafe { self.matmul_with(a, a_op, b, b_op, out, Placement::default()) }.map(|_| ())
    }

    /// [`Gemm::matmul`] running the placement's `epilogue` on each finished tile of the
    /// product, and writing the product through its `result` (a transpose of it, `out` being
    /// that transpose's buffer) where given. Returns whether the GEMM ran the epilogue: products the GEMM does not
    /// cover go to [`matmul::matmul_elements`], which stores the product and leaves the
    /// epilogue to the caller.
    ///
    /// # Safety
    /// `epilogue`'s launch must address only elements inside its buffers for every tile of
    /// its domain (`Program::check_bounds` checks the whole domain, which holds every tile),
    /// none of them `a`, `b` or `out`, and its product argument must read the product's dtype.
    pub unsafe fn matmul_with(
        &self,
        a: Elements<'_>,
        a_op: &MatMulOperand,
        b: Elements<'_>,
        b_op: &MatMulOperand,
        mut out: ElementsMut<'_>,
        placement: Placement<'_>,
    ) -> std::result::Result<bool, MatMulError> {
        // A left operand over a padding reads the padded buffer, built here.
        if let Some((x, op)) = self.unpadded(a, a_op, "left", None)? {
            // SAFETY: the caller's promises, for the same product.
            return unsafe { self.matmul_with(x.elements(), &op, b, b_op, out, placement) };
        }
        let Placement {
            result,
            epilogue,
            packed_b,
            padding: _,
        } = placement;
        let product = out.dtype;
        let plans = (
            operand_plan(a.dtype, a_op.cast, product),
            operand_plan(b.dtype, b_op.cast, product),
            code(product),
            operand_ptr(&a),
            operand_ptr(&b),
        );
        let (Some(pa), Some(pb), Some(out_code), Some(a_ptr), Some(b_ptr)) = plans else {
            return portable(a, a_op, b, b_op, out, result);
        };
        let (a_shape, a_view) = a_op.layout(a.shape);
        let (b_shape, b_view) = b_op.layout(b.shape);
        let layout = |shape, strided, split, len| OperandLayout {
            shape,
            strided,
            split,
            len,
        };
        // Over a padding the views address the padded shape until `unpad_right` moves them.
        let b_padding = b_op.view.as_ref().and_then(|v| v.padding.as_ref());
        let b_len = b_padding.map_or(Some(b.len()), Padding::padded_len);
        let b_len = b_len.ok_or(MatMulError::ViewOutOfBounds { operand: "right" })?;
        let product = matmul::strided_product(
            layout(&a_shape, &a_view, a_op.split(), a.len()),
            layout(&b_shape, &b_view, b_op.split(), b_len),
            Some(out.len()),
        )?;
        // A convolution over a padding or at a stride reads its image in slabs the GEMM
        // copies ([`phases`]); a right operand over a padding otherwise reads the padded
        // buffer, built here, where the packers do not make its zeros (`packed_zeros`).
        let (product, zeros, image) = match image_of(&product, b_padding, &b, pb) {
            Some(read) => {
                let rows = ImageRows::of(&read.phases, read.outer, read.offset);
                (read.product, None, Some(rows))
            }
            None => match b_padding {
                None => (product, None, None),
                Some(padding) => match packed_zeros(&product, padding, b.shape) {
                    Some((product, header)) => (product, Some(header), None),
                    None => {
                        let built = self.unpadded(b, b_op, "right", placement.padding)?;
                        let (x, op) =
                            built.ok_or(MatMulError::ViewOutOfBounds { operand: "right" })?;
                        // SAFETY: the caller's promises, for the same product.
                        let ran =
                            unsafe { self.matmul_with(a, a_op, x.elements(), &op, out, placement) };
                        if let Some(kept) = placement.padding {
                            kept.keep(padding, b.dtype, x);
                        }
                        return ran;
                    }
                },
            },
        };
        // A batch sharing one right-hand matrix whose left-hand matrices follow one another
        // row after row is one product of all their rows (a `Linear` over a batch, or over a
        // sequence read transposed): one call of a tall matrix instead of many short ones,
        // each of which would stream the whole right-hand matrix. Its epilogue runs on each
        // tile's rows of each batch matrix (a tile may end one and start the next).
        let folded = fold_batches(&product).filter(|_| result.is_none());
        let fold_rows = folded.as_ref().map_or(0, |_| product.rows as i64);
        let epilogue = epilogue.map(|e| EpilogueCall { fold_rows, ..*e });
        let product = folded.unwrap_or(product);
        let (c_strides, c_offsets) = result_layout(result, &product)?;
        let Some(split) = SplitAxesHeader::of(&product) else {
            // More sub-axes than the GEMM reads: the operands are gathered first.
            return portable(a, a_op, b, b_op, out, result);
        };
        let StridedProduct {
            rows,
            inner,
            cols,
            a_strides,
            b_strides,
            offsets,
            ..
        } = product;
        let call = Call {
            sizes: [
                offsets.len() as i64,
                rows as i64,
                inner as i64,
                cols as i64,
                pa[0],
                pb[0],
                out_code,
                pa[1],
                pa[2],
                pb[1],
                pb[2],
            ],
            strides: [
                a_strides[0],
                a_strides[1],
                b_strides[0],
                b_strides[1],
                c_strides[0],
                c_strides[1],
            ],
            offsets: offsets
                .iter()
                .zip(c_offsets)
                .flat_map(|(&(oa, ob), oc)| [oa, ob, oc])
                .collect(),
            split,
            zeros,
            image,
        };
        // SAFETY: `strided_product` checked that every element the operands' views address
        // lies inside its buffer (for a padded right operand, inside the padded shape, and
        // `unpad_right` that the elements it reads are the source's; read from its image,
        // `image_read` that every outer index and quotient offset lies inside the split, and
        // the GEMM reads only the image's elements among them), and that the result matrices
        // fill `out`; the operands are read-only here and `out` is borrowed uniquely.
        let epilogue_ptr = epilogue
            .as_ref()
            .map_or(std::ptr::null(), |e| e as *const EpilogueCall);
        let packed_ptr = packed_b.map_or(std::ptr::null_mut(), PackedB::as_ptr);
        unsafe {
            self.call(
                &call,
                [a_ptr, b_ptr],
                out.as_mut_ptr() as *mut c_void,
                epilogue_ptr,
                packed_ptr,
            )
        }
        .map(|_| epilogue.is_some())
    }

    /// Runs one call.
    ///
    /// # Safety
    /// Every element the call addresses (through its sizes, strides and offsets) must lie
    /// inside the buffer it addresses, of the dtype its code names; `c` must not overlap `a`
    /// or `b`, and nothing else may access `c` during the call. `packed_b` is null or a
    /// [`PackedB`] nothing else uses during the call.
    unsafe fn call(
        &self,
        call: &Call,
        [a, b]: [*const c_void; 2],
        c: *mut c_void,
        epilogue: *const EpilogueCall,
        packed_b: *mut c_void,
    ) -> std::result::Result<(), MatMulError> {
        let mut status = 0i64;
        let split = call
            .split
            .as_ref()
            .map_or(std::ptr::null(), |s| s as *const SplitAxesHeader);
        let zeros = call
            .zeros
            .as_ref()
            .map_or(std::ptr::null(), |z| z as *const PadHeader);
        let image = call.image.as_ref().map(ImageRows::header);
        let image_ptr = image
            .as_ref()
            .map_or(std::ptr::null(), |h| h as *const ImageHeader);
        let ptrs = [
            a as *mut c_void,
            b as *mut c_void,
            c,
            &mut status as *mut i64 as *mut c_void,
            epilogue as *mut c_void,
            packed_b,
            split as *mut c_void,
            zeros as *mut c_void,
            image_ptr as *mut c_void,
        ];
        // SAFETY: the caller's promise; `gemm.c` reads the arrays as its ABI documents.
        unsafe {
            (self.function)(
                call.sizes.as_ptr(),
                call.strides.as_ptr(),
                call.offsets.as_ptr(),
                ptrs.as_ptr(),
            );
        }
        match status {
            0 => Ok(()),
            _ => Err(MatMulError::PackingAlloc),
        }
    }
}

#[cfg(test)]
mod tests;
