//! Explicit AVX-512 loops for bodies computed in f32.
//!
//! GCC vectorizes the scalar `omp simd` loops well, but two things it cannot do from portable
//! C cost the transcendental-heavy kernels (an LSTM cell) about a quarter of their time:
//!
//! - a clamp written `x < c ? c : x` keeps NaN, which is exactly `vmaxps c, x`, yet the
//!   vectorizer emits a compare, a mask operation and a blend for it;
//! - scaling by 2ⁿ goes through integer adds and shifts on the exponent bits (and a second
//!   factor to reach the subnormal range), where AVX-512 has `vscalefps`, one instruction that
//!   rounds once over the whole range.
//!
//! So when the compiler targets AVX-512 (`__AVX512F__`, i.e. `-march=native` on such a host)
//! and a kernel's body is made only of what this module can write as intrinsics — f32, f16
//! and bf16 loads and stores through contiguous or broadcast inner axes, values computed in
//! f32 and rounded to f16 or bf16 where the graph says so, literals (f64 ones rounded once),
//! the arithmetic operators and comparisons, `select`, `min`, `max`, `abs`, `floor`, `sqrt`,
//! `rsqrt`, `exp` and `tanh` — each of the segment's loops first runs over whole vectors of 16
//! with intrinsics, and the scalar `omp simd` loop finishes the remainder. Everything else
//! (other functions, f64/integer/bool values, strided inner axes) keeps the scalar loops
//! alone; so does a compiler without AVX-512, because the vector loops are inside
//! `#if defined(FB_AVX512)`. Reductions ending the kernel take the vector loops when they all
//! keep the innermost axis, so that they accumulate by columns (each lane into its own
//! `double` accumulator, widened and added, or compared, exactly as the scalar loop does:
//! [`column_accumulation`]); a reduction along the rows keeps the scalar loop, whose
//! `omp simd` reduction would group the lanes differently from a vector one.
//!
//! Row kernels use the same statements in every pass over a row (also the range loads and
//! selects of a concat read along the rows: f32 operands loaded under lane masks, blended by
//! the select's), with row reductions of f32 values accumulated in vector registers (sums in
//! f32 blocks joined in f64, and divisions by a row constant multiplied by its reciprocal: the
//! freedoms `lower::ir` grants row kernels, so those are not bit for bit the scalar loop);
//! `kernel::rows` writes those loops.
//!
//! **Streaming stores.** A launch touching more than [`STREAM_MIN_BYTES`] writes its outputs
//! with `vmovntps` wherever a segment's destinations are 64-byte aligned (the executor's
//! buffers are; see `runtime::buffer`): the cache lines are written whole, without first being
//! read for ownership, so a kernel like the LSTM cell moves its compulsory bytes and no more.
//! The stores are fenced at the end of each segment.
//!
//! **Bit for bit the scalar results.** Every intrinsic computes the same IEEE operation in
//! the same order as the scalar C it replaces: `fbv_expf` and `fbv_tanhf` reduce the argument
//! with the same fused multiply-adds and evaluate the same polynomial, and `vscalefps` rounds
//! 2ⁿ·(1 + p) once exactly as the two power-of-two factors of `fb_expf` do. Which elements go
//! through which loop (it depends on the chunk length) therefore never shows in the output;
//! the one freedom is which NaN: x86 takes a NaN's sign from an operand that the compiler's
//! operand order decides, and the hardware f16/bf16 conversions keep a NaN's payload where the
//! scalar helpers write the canonical quiet NaN. `tests/cpu_emit.rs` compiles kernels with and
//! without AVX-512 and compares the outputs bit for bit (any NaN for NaN).

use super::expr::{C, only_added_to_constants};
use crate::backend::spelling::Spelling;
use crate::dtype::DType;
use crate::formula::{BinOp, Func};
use crate::lower::ir::{Axis, Instr, KernelIr, Prec, ReduceKind};

/// Lanes per vector.
pub const LANES: usize = 16;

/// The vector helpers, defined only when the compiler targets AVX-512; kernels test
/// `FB_AVX512` around their vector loops. Each function mirrors its scalar twin in the prelude
/// operation for operation (see the module documentation); `exp` and `tanh` follow in
/// [`VECTOR_EXPF`] and [`VECTOR_TANHF`].
pub(super) const VECTOR_HELPERS: &str = include_str!("vector.c");

/// The vector `exp`, emitted after `EXPF` (whose constants it uses) when a vector kernel may
/// call it; operation for operation `fb_expf_poly`, `fb_exp_reduce`, `fb_expf` and
/// `fb_expf_addend`.
pub(super) const VECTOR_EXPF: &str = include_str!("vector_expf.c");

/// The cheaper vector `exp` of relaxed row kernels, emitted after [`VECTOR_EXPF`] (whose range
/// reduction it shares) only in modules holding such a kernel, so every other module's text
/// is unchanged.
pub(super) const VECTOR_EXPF_ROW: &str = include_str!("vector_expf_row.c");

/// The lane masks of a concat read along a row kernel's rows, emitted after
/// [`VECTOR_HELPERS`] only in modules holding such a vector kernel, so every other module's
/// text is unchanged.
pub(super) const VECTOR_RANGES: &str = include_str!("vector_ranges.c");

/// The column accumulators of reducing kernels ([`column_accumulation`]), emitted after
/// [`VECTOR_HELPERS`] only in modules holding a vector kernel with reductions, so every other
/// module's text is unchanged.
pub(super) const VECTOR_COLUMNS: &str = include_str!("vector_columns.c");

/// The vector `tanh`, emitted after `TANHF` and [`VECTOR_EXPF`]; operation for operation
/// `fb_tanhf`.
pub(super) const VECTOR_TANHF: &str = include_str!("vector_tanhf.c");

/// Whether `ir` runs vector loops: every value held in f32 (or an f64 literal rounded once),
/// every load and store an f32, f16 or bf16 view whose innermost axis is contiguous or
/// broadcast (a broadcast store is written after the loops, in scalar code), every
/// instruction one of those listed in the module documentation, and no reductions ending the
/// kernel (row reductions of f32 values are in: their passes are vector loops too, see
/// `kernel::rows`).
pub(super) fn supports(ir: &KernelIr) -> bool {
    let inner = ir.rank - 1;
    let along_rows = ir.selects_along_rows();
    // A concat read in place elsewhere picks its operand per element by coordinate: pointwise
    // kernels cut into pieces (each piece without ranges) or run the scalar loops.
    if ir.has_ranges() && !along_rows {
        return false;
    }
    let float_view = |dtype: DType, axis: Axis| {
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16) && axis != Axis::Strided
    };
    // Reductions ending the kernel take the vector loops when every one keeps the innermost
    // axis, so that every segment accumulates its f32 values by columns into `double`s
    // ([`column_accumulation`]); a row kernel's own ones are `kernel::rows`'s.
    let row_gathers = ir.row_gathers();
    let live = live_given(ir, &row_gathers);
    let reductions = ir.reductions.is_empty()
        || (!ir.is_row_kernel()
            && ir
                .reductions
                .iter()
                .all(|r| !r.reduced[inner] && ir.prec(r.value) == Prec::F32));
    reductions
        // An index map's element is computed per lane, with divisions: a plain loop.
        && ir.loads.iter().all(|v| !v.is_mapped())
        && loads_read(ir, &live)
            .into_iter()
            .zip(&ir.loads)
            .all(|(read, v)| !read || float_view(v.dtype, v.axes[inner]))
        && ir
            .stores
            .iter()
            .all(|s| float_view(s.view.dtype, s.view.axes[inner]))
        && ir.body.iter().zip(&live).enumerate().all(|(id, (instr, &live))| {
            !live
                || match instr {
                    // A literal of any precision: an f64 one stays a scalar `double` in the vector
                    // loop, and only its rounding (below) or an f64 operation (rejected) can use it.
                    Instr::Load { .. } | Instr::Const { .. } => true,
                    // Integers have no vector spelling here; the scalar loop computes them.
                    // A row gather's index is computed once per row (`kernel::rows`), and
                    // its element read like a plain load; any other gather is a plain loop's.
                    Instr::Int { .. } => false,
                    Instr::GatherLoad { .. } => row_gathers[id],
                    Instr::Round { x, dtype } => {
                        matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
                            && (ir.prec(*x) == Prec::F32
                                || matches!(ir.body[*x], Instr::Const { .. }))
                    }
                    Instr::Neg { prec, .. } | Instr::Binary { prec, .. } => *prec == Prec::F32,
                    Instr::Call { func, prec, .. } => {
                        *prec == Prec::F32
                            && matches!(
                                func,
                                Func::Exp
                                    | Func::Tanh
                                    | Func::Select
                                    | Func::Abs
                                    | Func::Sqrt
                                    | Func::Rsqrt
                                    | Func::Min
                                    | Func::Max
                                    | Func::Floor
                            )
                    }
                    // A row reduction of f32 values: vector accumulators (in f64 for sums),
                    // then a row constant (`kernel::rows`).
                    Instr::RowReduce { x, dtype, .. } => {
                        ir.prec(*x) == Prec::F32
                            && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
                    }
                    // A concat read in place along a row kernel's rows: an f32 operand
                    // contiguous along the rows (or one column wide) loads its lanes inside
                    // its range under a mask, and the select blends the operands by lane masks.
                    Instr::RangeLoad { view, .. } => {
                        ir.loads[*view].dtype == DType::F32
                            && ir.loads[*view].axes[inner] != Axis::Strided
                    }
                    Instr::Select { prec, .. } => *prec == Prec::F32,
                    Instr::Widen { .. } => false,
                }
        })
}

/// Per load view, whether a value `live` in the vector loops ([`live`]) reads it.
fn loads_read(ir: &KernelIr, live: &[bool]) -> Vec<bool> {
    let mut read = vec![false; ir.loads.len()];
    for (instr, &live) in ir.body.iter().zip(live) {
        match instr {
            Instr::Load { view }
            | Instr::RangeLoad { view, .. }
            | Instr::GatherLoad { view, .. }
                if live =>
            {
                read[*view] = true;
            }
            _ => {}
        }
    }
    read
}

/// Which body values a store reads, directly or through other values. The loops only
/// evaluate those, so a dead instruction (an unused widening the lowering left, say) does not
/// keep a kernel out of the vector loops. A row gather's index is not among them: the row
/// computes it once, before its loops ([`KernelIr::row_gathers`]).
pub(super) fn live(ir: &KernelIr) -> Vec<bool> {
    live_given(ir, &ir.row_gathers())
}

/// [`live`], for a kernel whose row gathers ([`KernelIr::row_gathers`]) are `row_gathers`.
fn live_given(ir: &KernelIr, row_gathers: &[bool]) -> Vec<bool> {
    let mut live = vec![false; ir.body.len()];
    for store in &ir.stores {
        live[store.value] = true;
    }
    for red in &ir.reductions {
        live[red.value] = true;
    }
    // A row reduction is evaluated (its pass accumulates it) whether or not a store reads it.
    for (id, instr) in ir.body.iter().enumerate() {
        if matches!(instr, Instr::RowReduce { .. }) {
            live[id] = true;
        }
    }
    for id in (0..ir.body.len()).rev() {
        if live[id] && !row_gathers[id] {
            for x in ir.body[id].operands() {
                live[x] = true;
            }
        }
    }
    live
}

/// The statement computing `v{id}` as a vector at lanes `j .. j + 16` of the segment, for a
/// kernel [`supports`] accepts. Loads read argument `view` at base `b{view}`, as the scalar
/// loop does.
pub(super) fn statement(ir: &KernelIr, id: usize) -> String {
    let v = |x: usize| format!("v{x}");
    let inner = ir.rank - 1;
    let expr = match &ir.body[id] {
        // A row gather's base is its gathered row's (`kernel::rows`): read as a plain load.
        Instr::Load { view } | Instr::GatherLoad { view, .. } => {
            let dtype = ir.loads[*view].dtype;
            match ir.loads[*view].axes[inner] {
                Axis::Unit => {
                    let load = match dtype {
                        DType::F16 => "fbv_h2f",
                        DType::BF16 => "fbv_b2f",
                        _ => "_mm512_loadu_ps",
                    };
                    format!("{load}(&p{view}[b{view} + j])")
                }
                _ => format!(
                    "_mm512_set1_ps({})",
                    C.load(dtype, &format!("p{view}[b{view}]"))
                ),
            }
        }
        Instr::Const {
            value,
            prec: Prec::F64,
        } => return format!("const double v{id} = {};", C.literal(*value, Prec::F64)),
        Instr::Const { value, prec } => format!("_mm512_set1_ps({})", C.literal(*value, *prec)),
        Instr::Int { .. } => unreachable!("`supports` keeps integers out of vector loops"),
        // An f64 literal is rounded once by the scalar helper, as the scalar loop does.
        Instr::Round { x, dtype } if ir.prec(*x) == Prec::F64 => {
            format!("_mm512_set1_ps({})", C.round(Prec::F64, *dtype, &v(*x)))
        }
        Instr::Round { x, dtype } => match dtype {
            DType::F16 => format!("fbv_rnd_fh({})", v(*x)),
            DType::BF16 => format!("fbv_rnd_fb({})", v(*x)),
            _ => v(*x),
        },
        Instr::Neg { x, .. } => format!("fbv_neg({})", v(*x)),
        Instr::Binary { op, a, b, .. } => {
            let (a, b) = (v(*a), v(*b));
            let compare =
                |predicate: &str| format!("fbv_bool(_mm512_cmp_ps_mask({a}, {b}, {predicate}))");
            match op {
                BinOp::Add => format!("_mm512_add_ps({a}, {b})"),
                BinOp::Sub => format!("_mm512_sub_ps({a}, {b})"),
                BinOp::Mul => format!("_mm512_mul_ps({a}, {b})"),
                BinOp::Div => format!("_mm512_div_ps({a}, {b})"),
                // C's relational operators are false on NaN (ordered), `!=` is true (unordered).
                BinOp::Lt => compare("_CMP_LT_OQ"),
                BinOp::Le => compare("_CMP_LE_OQ"),
                BinOp::Gt => compare("_CMP_GT_OQ"),
                BinOp::Ge => compare("_CMP_GE_OQ"),
                BinOp::Eq => compare("_CMP_EQ_OQ"),
                BinOp::Ne => compare("_CMP_NEQ_UQ"),
            }
        }
        Instr::Call { func, args, .. } => {
            let args: Vec<String> = args.iter().map(|&a| v(a)).collect();
            match func {
                Func::Exp if only_added_to_constants(ir, id) => {
                    format!("fbv_expf_addend({})", args[0])
                }
                Func::Exp => format!("fbv_expf({})", args[0]),
                Func::Tanh => format!("fbv_tanhf({})", args[0]),
                Func::Abs => format!("_mm512_abs_ps({})", args[0]),
                Func::Sqrt => format!("_mm512_sqrt_ps({})", args[0]),
                Func::Rsqrt => format!(
                    "_mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps({}))",
                    args[0]
                ),
                Func::Select => format!("fbv_select({}, {}, {})", args[0], args[1], args[2]),
                Func::Min => format!("fbv_min({}, {})", args[0], args[1]),
                Func::Max => format!("fbv_max({}, {})", args[0], args[1]),
                // Toward -Inf, exact, keeping -0, ±Inf and NaN: what fb_floorf computes.
                Func::Floor => format!(
                    "_mm512_roundscale_ps({}, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)",
                    args[0]
                ),
                other => unreachable!("{other:?} has no vector form (`supports` rejects it)"),
            }
        }
        // Lanes outside the range read nothing (a masked load does not fault) and hold 0,
        // where the scalar loop reads the clamped element: no select picks them either way.
        Instr::RangeLoad { view, range, .. } => {
            let lanes = format!("fbv_range_lanes(j, rs{range}, re{range})");
            match ir.loads[*view].axes[inner] {
                Axis::Unit => format!("_mm512_maskz_loadu_ps({lanes}, &p{view}[b{view} + j])"),
                // A one-column operand: its element, read only when a lane lies in its range
                // (an empty operand's range holds none, and it has no element to read).
                _ => format!(
                    "(({lanes}) ? _mm512_maskz_mov_ps({lanes}, _mm512_set1_ps(p{view}[b{view}])) \
                     : _mm512_setzero_ps())"
                ),
            }
        }
        // The last case, then each earlier one where its range ends after the lane's index,
        // as the scalar comparison chain picks.
        Instr::Select { ranges, cases, .. } => {
            let last = cases.len() - 1;
            let mut text = v(cases[last]);
            for (&r, &x) in ranges.iter().zip(cases).take(last).rev() {
                text = format!(
                    "_mm512_mask_blend_ps(fbv_lanes_below(j, re{r}), {text}, {})",
                    v(x)
                );
            }
            text
        }
        Instr::Widen { .. } => unreachable!("`supports` rejects widening"),
        // A row reduction is a row constant by the time a vector reads it; `kernel::rows`
        // writes its accumulation and its broadcast.
        Instr::RowReduce { .. } => unreachable!("row reductions are spelled by kernel::rows"),
    };
    format!("const __m512 v{id} = {expr};")
}

/// The statement computing `v{id}` for a vector lying wholly inside case `k` of the selects
/// of a row kernel reading a concat along its rows (all by `ranges`), where it differs from
/// [`statement`]: a select is its case `k`, and a range load of case `k`'s range reads its
/// lanes plainly (they all lie in the range). `None` for every other value.
pub(super) fn segment_statement(
    ir: &KernelIr,
    id: usize,
    ranges: &[usize],
    k: usize,
) -> Option<String> {
    let inner = ir.rank - 1;
    let expr = match &ir.body[id] {
        Instr::Select { cases, .. } => format!("v{}", cases[k]),
        Instr::RangeLoad { view, range, .. } if *range == ranges[k] => {
            match ir.loads[*view].axes[inner] {
                Axis::Unit => format!("_mm512_loadu_ps(&p{view}[b{view} + j])"),
                _ => format!("_mm512_set1_ps(p{view}[b{view}])"),
            }
        }
        _ => return None,
    };
    Some(format!("const __m512 v{id} = {expr};"))
}

/// The statement reading carried value `v{id}` back from its chunk array `c{id}` (64-byte
/// aligned; `j` is a multiple of 16).
pub(super) fn carried_load(id: usize) -> String {
    format!("const __m512 v{id} = _mm512_load_ps(&c{id}[j]);")
}

/// The statement saving `v{id}` into its chunk array for a later loop.
pub(super) fn carried_store(id: usize) -> String {
    format!("_mm512_store_ps(&c{id}[j], v{id});")
}

/// The vector store `k` of `ir` into its contiguous destination `d{k}` (unit stride),
/// streaming when the segment's `st` says so (see [`stream_condition`]).
///
/// A stored rounding to the store's own f16 or bf16 dtype stores its f32 operand instead, when
/// `operand_here` (the operand is computed in the same loop; a value read back from a row
/// scratch is stored as read). The store converts to the dtype with the rounding the `Round`
/// would have applied, and a value already in the dtype converts to f32 and back exactly, so
/// the bits written are the same; it saves the conversion there and back that GCC does not
/// fold (two instructions per vector, about 4% of an f16 softmax, whose rows are
/// compute-bound).
pub(super) fn store(ir: &KernelIr, k: usize, operand_here: bool) -> String {
    let (value, dtype) = (ir.stores[k].value, ir.stores[k].view.dtype);
    let value = match ir.body[value] {
        Instr::Round { x, dtype: to }
            if operand_here
                && to == dtype
                && matches!(dtype, DType::F16 | DType::BF16)
                && ir.prec(x) == Prec::F32 =>
        {
            x
        }
        _ => value,
    };
    let store = match dtype {
        DType::F16 => "fbv_store_h",
        DType::BF16 => "fbv_store_b",
        _ => "fbv_store",
    };
    format!("{store}(&d{k}[j], v{value}, st);")
}

/// The vector statement adding the 16 lanes of reduction `r`'s f32 value into its `double`
/// accumulators `q{r}[kb{r} + j ..]` (one accumulator per lane: the *column* accumulation of
/// `kernel`, a reduction keeping the innermost axis), widening each lane and combining it as
/// the scalar loop does, so every accumulator ends with the same bits. For a kernel
/// [`supports`] accepts, whose reduced values are all f32.
pub(super) fn column_accumulation(ir: &KernelIr, r: usize) -> String {
    let red = &ir.reductions[r];
    let helper = match red.kind {
        ReduceKind::Sum | ReduceKind::Mean => "fbv_acc_sum",
        ReduceKind::Max => "fbv_acc_max",
    };
    format!("{helper}(&q{r}[kb{r} + j], v{});", red.value)
}

/// Launches touching more bytes than this stream their stores: 32 MiB, about the last-level
/// cache a few cores of a current server part can count on (an AMD EPYC core complex has
/// 32 MiB; a Xeon's shared L3 is larger but split among all its cores). Asking the system does
/// not work: in a virtual machine `sysconf(_SC_LEVEL3_CACHE_SIZE)` reports the whole host
/// socket (260 to 320 MiB on the Xeon machines fusebox is measured on), which would stop
/// streaming everywhere.
pub const STREAM_MIN_BYTES: usize = 32 << 20;

/// Whether a launch streams its stores: the bytes of every argument over the domain (an
/// upper bound on what it touches) exceed [`STREAM_MIN_BYTES`].
pub(super) fn launch_streams(ir: &KernelIr) -> String {
    let bytes_per_point: usize = ir.views().map(|v| v.dtype.size_bytes()).sum();
    format!("total * {bytes_per_point} > {STREAM_MIN_BYTES}")
}

/// Whether a segment streams: its launch does and every contiguous destination `d{k}` in
/// `stores` is 64-byte aligned (then so is each `d{k} + j`, `j` moving by 16 floats; a row
/// redirected to a stack scratch buffer usually is not, and is stored normally).
pub(super) fn stream_condition(stores: &[usize]) -> String {
    let pointers: Vec<String> = stores.iter().map(|k| format!("(uintptr_t)d{k}")).collect();
    format!("fbs && (({}) & 63) == 0", pointers.join(" | "))
}
