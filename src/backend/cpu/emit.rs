//! C emission: a [`KernelIr`] in, the text of one C function out.
//!
//! The emitted C is compiled with `-O3 -march=native -fopenmp -fno-math-errno
//! -ffp-contract=off` and no `-ffast-math`, so the C operators keep IEEE semantics (NaN, ±Inf,
//! signed zeros) and every rounding the IR asks for happens exactly as [`DType::round`] does it.
//! Speed comes from two things the text is shaped for:
//!
//! - **Vector loops.** The innermost domain axis runs in a `#pragma omp simd` loop whose body
//!   is branch-free straight-line code (selects are ternaries over values already computed).
//!   f32 `exp` and `tanh`, the LSTM's hot functions, are inline code (`EXPF`, `TANHF`);
//!   the prelude declares the other libm functions with `#pragma omp declare simd`, so GCC
//!   calls glibc's libmvec variants (`_ZGVeN16v_logf`, …) instead of scalar libm. Bodies that
//!   chain transcendental calls are split into one loop per level (`Stages`). The
//!   half-precision conversions are written with integer bit operations rather than
//!   `_Float16`, which GCC 12 cannot vectorize without AVX512-FP16.
//! - **Threads.** Work is split into items of at most [`CHUNK`] elements of one row (a row is
//!   one point of the outer axes, i.e. every axis but the innermost) and spread over OpenMP
//!   threads once the domain is large enough to pay for them ([`PARALLEL_MIN`]).
//! - **Long rows.** The kernel is compiled for a stride pattern, not for sizes, so a
//!   `[N, 1]` domain may arrive at run time. Before looping, the kernel folds outer axes into
//!   the innermost one wherever every view is contiguous across them (or the axis has size
//!   1), so such a domain runs as one long vector loop rather than N one-element ones.
//!
//! # Reductions
//!
//! Reductions accumulate in `double`. Which loop nest runs is decided at run time, because it
//! depends on sizes and the thread count, but each choice is deterministic for a given thread
//! count:
//!
//! - *rows*: every reduction reduces exactly the innermost axis. Each row is owned by one
//!   thread, which reduces it chunk by chunk and stores the results; no shared state.
//! - *columns*: every reduction keeps the innermost axis. Threads own disjoint column ranges
//!   and walk all rows in order, accumulating into one shared `double` buffer per output;
//!   no per-thread copies.
//! - *partials*: the general case (and the fallback when the two above would leave threads
//!   idle). Work items are split statically among threads; each thread accumulates into its
//!   own buffer of outputs, and the buffers are combined in thread order at the end.
//!
//! After accumulation a mean divides by the number of reduced elements (0/0 = NaN for an
//! empty reduction), and each result is rounded once to its dtype and stored.
//!
//! # Stores smaller than the domain
//!
//! A store whose view is `Broadcast` on some axis is written only where the domain index on
//! that axis is 0, so each element is written exactly once. On an outer axis the whole row is
//! redirected to a stack scratch buffer (keeping the vector loop free of branches); on the
//! innermost axis the vector loop does not store it at all, and the element at index 0 is
//! recomputed and stored in scalar code after the loop.

use crate::backend::cache::hex;
use crate::dtype::DType;
use crate::formula::{BinOp, Func};
use crate::lower::ir::{Axis, Instr, KernelIr, Prec, ReduceKind};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

mod vector;
pub use vector::STREAM_MIN_BYTES;

/// Elements of one row handled by one work item (and one vector loop). Big enough that the
/// per-item bookkeeping (index arithmetic, base offsets) is noise, small enough that a row of
/// a wide tensor still splits across threads and scratch buffers fit on the stack.
pub const CHUNK: i64 = 2048;

/// Domains with at most this many elements run on the calling thread: waking a thread team
/// costs more than such a kernel takes.
pub const PARALLEL_MIN: i64 = 32768;

/// The name [`kernel_name`] hashes the kernel under, so that the hash depends on the body
/// only and the name can then be derived from it.
const PLACEHOLDER_NAME: &str = "fb_kernel";

/// The C source of one kernel function named `name` implementing `ir`, with the ABI
/// documented on [`crate::lower::ir::Launch`]. It relies on the helpers of the prelude that
/// [`emit_module`] writes in front of it.
pub fn emit_kernel(ir: &KernelIr, name: &str) -> String {
    check_invariants(ir);
    Kernel::new(ir).emit(name)
}

/// A whole translation unit: the prelude (includes, conversion helpers, `omp declare simd`
/// declarations of the libm functions the kernels use) once, then every kernel.
///
/// The text depends only on the input, byte for byte, because it is the compile cache's key.
/// Entries with a name already emitted are skipped: names come from [`kernel_name`], so an
/// equal name means an equal kernel, and C would reject the second definition.
pub fn emit_module(kernels: &[(String, &KernelIr)]) -> String {
    let mut used: Vec<(Func, Prec)> = kernels.iter().flat_map(|(_, ir)| libm_calls(ir)).collect();
    used.sort_by_key(|&(func, prec)| declaration_order(func, prec));
    used.dedup();
    let calls_f32 = |func: Func| {
        kernels.iter().any(|(_, ir)| {
            ir.body
                .iter()
                .any(|i| matches!(i, Instr::Call { func: f, prec: Prec::F32, .. } if *f == func))
        })
    };
    let tanhf = calls_f32(Func::Tanh);
    let expf = tanhf || calls_f32(Func::Exp);
    let mut out = prelude(&used);
    if expf {
        out.push_str(EXPF);
    }
    if tanhf {
        out.push_str(TANHF);
    }
    if kernels.iter().any(|(_, ir)| vector::supports(ir)) {
        out.push_str(vector::VECTOR_HELPERS);
        if expf {
            out.push_str(vector::VECTOR_EXPF);
        }
        if tanhf {
            out.push_str(vector::VECTOR_TANHF);
        }
    }
    let mut seen = BTreeSet::new();
    for (name, ir) in kernels {
        if seen.insert(name.as_str()) {
            out.push('\n');
            out.push_str(&emit_kernel(ir, name));
        } else {
            debug_assert!(
                kernels
                    .iter()
                    .filter(|(n, _)| n == name)
                    .all(|(_, k)| *k == *ir),
                "two different kernels named `{name}`"
            );
        }
    }
    out
}

/// A stable name for the kernel: `fb_` and 16 hex digits of the SHA-256 of its emitted body.
/// Equal IRs get equal names; the hash is of the text, so a change to the emitter renames
/// every kernel and stale cache entries are never confused with new ones.
pub fn kernel_name(ir: &KernelIr) -> String {
    let digest = Sha256::digest(emit_kernel(ir, PLACEHOLDER_NAME).as_bytes());
    format!("fb_{}", hex(&digest[..8]))
}

// ---------------------------------------------------------------------------------------------
// The prelude.

/// Conversion and rounding helpers shared by every kernel. All are branch-free so they
/// vectorize; each mirrors one rule of [`DType::round`] or one storage format.
const HELPERS: &str = r#"#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint32_t fb_f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float fb_u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static inline uint64_t fb_d2u(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static inline double fb_u2d(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }

/* f16 bits -> float, exact. Normal numbers rebias the exponent; subnormals are built as
   2^-14 * (1 + m/1024) - 2^-14, which never touches a float subnormal (so DAZ cannot matter);
   Inf and NaN keep their payload. */
static inline float fb_h2f(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t e = em & 0x0f800000u;
    uint32_t normal = em + (112u << 23);
    uint32_t sub = fb_f2u(fb_u2f(em + (113u << 23)) - 0x1p-14f);
    uint32_t r = e == 0x0f800000u ? (em | 0x7f800000u) : (e == 0 ? sub : normal);
    return fb_u2f(r | ((uint32_t)(h & 0x8000u) << 16));
}

/* float -> f16 bits, round to nearest even; overflow gives Inf, NaN stays NaN. Results that
   are f16 subnormals are rounded by the FPU: adding 0.5 aligns the f16 quantum 2^-24 with the
   last bit of the float. Normal results round on the bits directly. */
static inline uint16_t fb_f2h(float x) {
    uint32_t f = fb_f2u(x);
    uint32_t sign = (f >> 16) & 0x8000u;
    f &= 0x7fffffffu;
    uint32_t big = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
    uint32_t sub = fb_f2u(fb_u2f(f) + 0.5f) - (126u << 23);
    uint32_t normal = (f - (112u << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
    uint32_t o = f >= 0x47800000u ? big : (f < 0x38800000u ? sub : normal);
    return (uint16_t)(o | sign);
}

/* bf16 bits -> float, exact. */
static inline float fb_b2f(uint16_t b) { return fb_u2f((uint32_t)b << 16); }

/* float -> bf16 bits, round to nearest even; NaN stays NaN (quieted). */
static inline uint16_t fb_f2b(float x) {
    uint32_t f = fb_f2u(x);
    uint32_t r = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    return (uint16_t)(x != x ? ((f >> 16) | 0x40u) : r);
}

/* double -> float rounded to odd: toward zero, with the last bit set if anything was lost.
   Rounding that to f16 or bf16 to nearest even gives the correctly rounded result of the
   double, as if rounded once. */
static inline float fb_rto(double v) {
    float n = (float)v;
    double nd = (double)n;
    uint32_t inexact = (uint32_t)((nd != v) & (v == v));
    uint32_t away = (uint32_t)(fabs(nd) > fabs(v));
    return fb_u2f((fb_f2u(n) - (inexact & away)) | inexact);
}

static inline float fb_rnd_fh(float x) { return fb_h2f(fb_f2h(x)); }
static inline float fb_rnd_fb(float x) { return fb_b2f(fb_f2b(x)); }
static inline float fb_rnd_dh(double x) { return fb_h2f(fb_f2h(fb_rto(x))); }
static inline float fb_rnd_db(double x) { return fb_b2f(fb_f2b(fb_rto(x))); }

/* trunc and floor. GCC only vectorizes the libm ones under -fno-trapping-math, so they are
   spelled out: below 2^52 (2^23 for float), adding and subtracting 2^52 rounds |x| to an
   integer; stepping down where that rounded up truncates. Larger magnitudes, Inf and NaN are
   already integral (or NaN) and pass through; copysign keeps the sign of zero. */
static inline double fb_trunc(double x) {
    double a = fabs(x);
    double r = (a + 0x1p52) - 0x1p52;
    r = r > a ? r - 1.0 : r;
    return copysign(a < 0x1p52 ? r : a, x);
}
static inline float fb_truncf(float x) {
    float a = fabsf(x);
    float r = (a + 0x1p23f) - 0x1p23f;
    r = r > a ? r - 1.0f : r;
    return copysignf(a < 0x1p23f ? r : a, x);
}
static inline double fb_floor(double x) { double t = fb_trunc(x); return t > x ? t - 1.0 : t; }
static inline float fb_floorf(float x) { float t = fb_truncf(x); return t > x ? t - 1.0f : t; }

/* Integer rounding: toward zero, saturating, NaN -> 0. Adding +0.0 turns -0 into +0, as the
   integer has no sign of zero. */
static inline double fb_rnd_i32(double v) {
    double t = fb_trunc(v) + 0.0;
    t = t < -2147483648.0 ? -2147483648.0 : t;
    t = t > 2147483647.0 ? 2147483647.0 : t;
    return v != v ? 0.0 : t;
}
static inline double fb_rnd_i64(double v) {
    double t = fb_trunc(v) + 0.0;
    t = t < -0x1p63 ? -0x1p63 : t;
    t = t > 0x1p63 ? 0x1p63 : t;
    return v != v ? 0.0 : t;
}
/* A rounded i64 value held as double may be 2^63 (i64::MAX rounded up): saturate it. */
static inline int64_t fb_d2i64(double v) { return v >= 0x1p63 ? INT64_MAX : (int64_t)v; }

/* min/max: NaN wins, and -0 orders below +0 (equal values differ only in the sign of zero,
   which the bitwise or/and of their bits resolves). */
static inline float fb_minf(float a, float b) {
    return (a != a || b != b) ? a + b : (a < b ? a : (b < a ? b : fb_u2f(fb_f2u(a) | fb_f2u(b))));
}
static inline float fb_maxf(float a, float b) {
    return (a != a || b != b) ? a + b : (a > b ? a : (b > a ? b : fb_u2f(fb_f2u(a) & fb_f2u(b))));
}
static inline double fb_mind(double a, double b) {
    return (a != a || b != b) ? a + b : (a < b ? a : (b < a ? b : fb_u2d(fb_d2u(a) | fb_d2u(b))));
}
static inline double fb_maxd(double a, double b) {
    return (a != a || b != b) ? a + b : (a > b ? a : (b > a ? b : fb_u2d(fb_d2u(a) & fb_d2u(b))));
}

/* Max accumulation: once a NaN is in, it stays. */
static inline double fb_maxacc(double acc, double x) { return (x > acc || x != x) ? x : acc; }
"#;

/// f32 `exp`, inline. glibc's vector `expf` is accurate and fast, but a call clobbers every
/// vector register, so a loop making five of them (an LSTM cell) spills around each; inline,
/// the same work costs about half. Scheme: x = n·ln2 + r with n = round(x·log2 e) (the
/// 1.5·2²³ shift rounds it), r reduced with a two-part ln2 so it is exact to about 2⁻³⁶;
/// e^r = 1 + r + r²·q(r) with q of degree 4, fitted for minimax relative error of e^r - 1 on
/// |r| ≤ 0.347 (1.3e-8, and 5.5e-9 for e^r; `tools/fit_expf.py`); then scaled by 2ⁿ built
/// from exponent bits. The input is clamped to [-104, 89] (beyond it the result is 0 or Inf
/// anyway; NaN passes the clamps) and 2ⁿ is applied as two powers of two so that results near
/// overflow and in the subnormal range are rounded once, like libm's. Worst error 1.04 ulp
/// over every third float in [-110, 90] (tests/cpu_emit.rs checks a dense sample, and NaN,
/// ±Inf, the overflow threshold and the subnormal range exactly). Everything is `fmaf`,
/// integer and select code, so `omp simd` vectorizes it; `fmaf` is one instruction on FMA
/// hardware and correctly rounded everywhere.
///
/// `fb_expf_addend` is a cheaper variant for an exp only ever added to a literal (see
/// [`only_added_to_constants`]): exact down to 2⁻¹²⁴, anything below that for smaller
/// results. It applies 2ⁿ as 2ⁿ⁻¹ · 2, which keeps results up to the f32 maximum rounded once.
const EXPF: &str = r#"
/* The constants of exp, shared with the AVX-512 helpers (which must compute the same bits):
   the polynomial q, log2(e), the 1.5 2^23 rounding shift, ln2 in two parts (negated high
   part), and the input clamps (the addend variant's lower one). */
#define FB_EXP_Q4 0x1.6bebf2p-10f
#define FB_EXP_Q3 0x1.1227f6p-7f
#define FB_EXP_Q2 0x1.555674p-5f
#define FB_EXP_Q1 0x1.5554bp-3f
#define FB_EXP_Q0 0x1.fffffep-2f
#define FB_LOG2E 0x1.715476p+0f
#define FB_EXP_SHIFT 0x1.8p23f
#define FB_LN2_NEG_HI -0x1.62e43p-1f
#define FB_LN2_LO 0x1.05c61p-29f
#define FB_EXP_LO -104.0f
#define FB_EXP_ADDEND_LO -87.0f
#define FB_EXP_HI 89.0f
static inline float fb_expf_poly(float r) {
    float q = fmaf(r, FB_EXP_Q4, FB_EXP_Q3);
    q = fmaf(q, r, FB_EXP_Q2);
    q = fmaf(q, r, FB_EXP_Q1);
    q = fmaf(q, r, FB_EXP_Q0);
    return fmaf(q, r * r, r);
}
/* x = n ln2 + r: returns r; *z gets x log2(e) + 1.5 2^23, whose low bits hold n. */
static inline float fb_exp_reduce(float x, float *z) {
    float zz = fmaf(x, FB_LOG2E, FB_EXP_SHIFT);
    float n = zz - FB_EXP_SHIFT;
    *z = zz;
    return fmaf(n, FB_LN2_LO, fmaf(n, FB_LN2_NEG_HI, x));
}
/* 2^(n + bias - 127) for the n held in z; a normal float while n + bias is in [1, 254]. */
static inline float fb_exp_scale(float z, uint32_t bias) {
    return fb_u2f((fb_f2u(z) + (bias - 0x4b400000u)) << 23);
}
static inline float fb_expf_addend(float x) {
    float lo = x < FB_EXP_ADDEND_LO ? FB_EXP_ADDEND_LO : x;
    float z, r = fb_exp_reduce(lo > FB_EXP_HI ? FB_EXP_HI : lo, &z);
    float s = fb_exp_scale(z, 126u);
    return fmaf(s, fb_expf_poly(r), s) * 2.0f;
}
static inline float fb_expf(float x) {
    float lo = x < FB_EXP_LO ? FB_EXP_LO : x;
    float z, r = fb_exp_reduce(lo > FB_EXP_HI ? FB_EXP_HI : lo, &z);
    int32_t n = (int32_t)(fb_f2u(z) - 0x4b400000u);
    int32_t n1 = n < -100 ? -100 : (n > 127 ? 127 : n);
    float s1 = fb_u2f((uint32_t)(n1 + 127) << 23);
    float s2 = fb_u2f((uint32_t)(n - n1 + 127) << 23);
    return fmaf(s1, fb_expf_poly(r), s1) * s2;
}
"#;

/// f32 tanh as expm1(2|x|) / (expm1(2|x|) + 2), with the sign of x. expm1 comes from
/// [`EXPF`]'s pieces without cancellation: e^t - 1 = (2ⁿ - 1) + 2ⁿ·p, where p = e^r - 1 is
/// what the polynomial computes (fitted for the relative error of e^r - 1, so p stays accurate
/// as r → 0) and 2ⁿ - 1 is exact for the small n near zero. One formula for every |x|, with
/// no select between a polynomial and an exp branch, so a lane costs one exp and one
/// division: on the LSTM cell this is about a sixth of the kernel against the two-branch
/// version (1.06 ulp). Worst error 2.57 ulp over every positive float (at 0.062, where the
/// rounding of the denominator dominates); |x| is capped at 9.5, past which tanh is 1 in f32,
/// by a select that lets NaN through (it then propagates to the result); NaN, ±Inf and ±0
/// exact (tests/cpu_emit.rs).
const TANHF: &str = r#"
/* Past this |x|, tanh is 1 in f32 (shared with the AVX-512 helper). */
#define FB_TANH_CAP 9.5f
static inline float fb_tanhf(float x) {
    float a = fabsf(x);
    float z, r = fb_exp_reduce(2.0f * (a > FB_TANH_CAP ? FB_TANH_CAP : a), &z);
    float s = fb_exp_scale(z, 127u);
    float em = fmaf(s, fb_expf_poly(r), s - 1.0f);
    return copysignf(em / (em + 2.0f), x);
}
"#;

/// The prelude: helpers, then vector declarations of the libm functions in `used`.
fn prelude(used: &[(Func, Prec)]) -> String {
    let mut out = String::from(HELPERS);
    if !used.is_empty() {
        out.push_str(
            "\n/* Vector variants come from glibc's libmvec; without these declarations (and\n   \
             without -ffast-math) GCC would call the scalar functions once per element. */\n",
        );
    }
    for &(func, prec) in used {
        let ty = c_type(prec);
        let params = vec![ty; func.arity()].join(", ");
        out.push_str("#pragma omp declare simd notinbranch\n");
        out.push_str(&format!("{ty} {}({params});\n", libm_name(func, prec)));
    }
    out
}

/// The libm functions (with their precision) a kernel calls; only those with libmvec
/// variants, since declaring `sqrtf` as `simd` would send GCC looking for a vector `sqrtf`
/// that does not exist instead of using the instruction.
fn libm_calls(ir: &KernelIr) -> Vec<(Func, Prec)> {
    ir.body
        .iter()
        .filter_map(|instr| match instr {
            // f32 exp and tanh are inline (see `EXPF` and `TANHF`).
            Instr::Call {
                func: Func::Tanh | Func::Exp,
                prec: Prec::F32,
                ..
            } => None,
            Instr::Call { func, prec, .. } if has_libmvec_variant(*func) => Some((*func, *prec)),
            _ => None,
        })
        .collect()
}

/// A fixed order for the declarations (`Func` has no `Ord`): the catalogue's, f32 first.
fn declaration_order(func: Func, prec: Prec) -> (usize, bool) {
    let index = Func::ALL
        .iter()
        .position(|&f| f == func)
        .unwrap_or(usize::MAX);
    (index, prec == Prec::F64)
}

fn has_libmvec_variant(func: Func) -> bool {
    matches!(
        func,
        Func::Exp
            | Func::Log
            | Func::Log1p
            | Func::Expm1
            | Func::Tanh
            | Func::Erf
            | Func::Sin
            | Func::Cos
            | Func::Pow
    )
}

fn libm_name(func: Func, prec: Prec) -> String {
    let base = match func {
        Func::Exp => "exp",
        Func::Log => "log",
        Func::Log1p => "log1p",
        Func::Expm1 => "expm1",
        Func::Sqrt => "sqrt",
        Func::Tanh => "tanh",
        Func::Erf => "erf",
        Func::Abs => "fabs",
        Func::Sin => "sin",
        Func::Cos => "cos",
        Func::Pow => "pow",
        Func::Rsqrt | Func::Floor | Func::Min | Func::Max | Func::Select => {
            unreachable!("{func:?} is not a libm function")
        }
    };
    match prec {
        Prec::F32 => format!("{base}f"),
        Prec::F64 => base.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// C text for types, values and instructions.

fn c_type(prec: Prec) -> &'static str {
    match prec {
        Prec::F32 => "float",
        Prec::F64 => "double",
    }
}

/// The C type elements of `dtype` are stored as.
fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "uint8_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::F16 | DType::BF16 => "uint16_t",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// A stored element `raw` as a value at `Prec::of(dtype)`.
fn load_conversion(dtype: DType, raw: &str) -> String {
    match dtype {
        DType::F16 => format!("fb_h2f({raw})"),
        DType::BF16 => format!("fb_b2f({raw})"),
        DType::F32 | DType::F64 => raw.to_string(),
        DType::I32 | DType::I64 => format!("(double){raw}"),
        DType::Bool => format!("(double)({raw} != 0)"),
    }
}

/// A value at `Prec::of(dtype)`, already rounded to `dtype`, in `dtype`'s storage format.
fn store_conversion(dtype: DType, value: &str) -> String {
    match dtype {
        DType::F16 => format!("fb_f2h({value})"),
        DType::BF16 => format!("fb_f2b({value})"),
        DType::F32 | DType::F64 => value.to_string(),
        DType::I32 => format!("(int32_t){value}"),
        DType::I64 => format!("fb_d2i64({value})"),
        DType::Bool => format!("(uint8_t)({value} != 0.0)"),
    }
}

/// `x` (held at `from`) rounded to `dtype` as [`DType::round`] does, held at `Prec::of(dtype)`.
fn round_expr(from: Prec, dtype: DType, x: &str) -> String {
    match (from, dtype) {
        (Prec::F32, DType::F32) | (Prec::F64, DType::F64) => x.to_string(),
        (Prec::F32, DType::F16) => format!("fb_rnd_fh({x})"),
        (Prec::F32, DType::BF16) => format!("fb_rnd_fb({x})"),
        (Prec::F32, _) => round_expr(Prec::F64, dtype, &format!("(double){x}")),
        (Prec::F64, DType::F32) => format!("(float){x}"),
        (Prec::F64, DType::F16) => format!("fb_rnd_dh({x})"),
        (Prec::F64, DType::BF16) => format!("fb_rnd_db({x})"),
        (Prec::F64, DType::I32) => format!("fb_rnd_i32({x})"),
        (Prec::F64, DType::I64) => format!("fb_rnd_i64({x})"),
        (Prec::F64, DType::Bool) => format!("(({x} != 0.0) ? 1.0 : 0.0)"),
    }
}

/// A C literal equal to `value` at `prec`, bit for bit (NaN as some NaN). Rust's shortest
/// round-trip formatting of the value in its own type parses back to the same value.
fn literal(value: f64, prec: Prec) -> String {
    let (suffix, cast) = match prec {
        Prec::F32 => ("f", ""),
        Prec::F64 => ("", "(double)"),
    };
    if value.is_nan() {
        return format!("({cast}NAN)");
    }
    if value.is_infinite() {
        let sign = if value < 0.0 { "-" } else { "" };
        return format!("({sign}{cast}INFINITY)");
    }
    let text = match prec {
        Prec::F32 => format!("{:e}", value as f32),
        Prec::F64 => format!("{value:e}"),
    };
    format!("({text}{suffix})")
}

fn binary_expr(op: BinOp, a: &str, b: &str, prec: Prec) -> String {
    let arith = |sym: &str| format!("({a} {sym} {b})");
    let compare = |sym: &str| {
        let (one, zero) = match prec {
            Prec::F32 => ("1.0f", "0.0f"),
            Prec::F64 => ("1.0", "0.0"),
        };
        format!("(({a} {sym} {b}) ? {one} : {zero})")
    };
    match op {
        BinOp::Add => arith("+"),
        BinOp::Sub => arith("-"),
        BinOp::Mul => arith("*"),
        BinOp::Div => arith("/"),
        BinOp::Lt => compare("<"),
        BinOp::Le => compare("<="),
        BinOp::Gt => compare(">"),
        BinOp::Ge => compare(">="),
        BinOp::Eq => compare("=="),
        BinOp::Ne => compare("!="),
    }
}

fn call_expr(func: Func, args: &[String], prec: Prec) -> String {
    let f32 = prec == Prec::F32;
    match func {
        Func::Rsqrt => {
            let (one, sqrt) = if f32 {
                ("1.0f", "sqrtf")
            } else {
                ("1.0", "sqrt")
            };
            format!("({one} / {sqrt}({}))", args[0])
        }
        Func::Min => format!(
            "{}({}, {})",
            if f32 { "fb_minf" } else { "fb_mind" },
            args[0],
            args[1]
        ),
        Func::Max => format!(
            "{}({}, {})",
            if f32 { "fb_maxf" } else { "fb_maxd" },
            args[0],
            args[1]
        ),
        Func::Floor => format!(
            "{}({})",
            if f32 { "fb_floorf" } else { "fb_floor" },
            args[0]
        ),
        Func::Tanh if f32 => format!("fb_tanhf({})", args[0]),
        Func::Exp if f32 => format!("fb_expf({})", args[0]),
        Func::Select => {
            let zero = if f32 { "0.0f" } else { "0.0" };
            format!("(({} != {zero}) ? {} : {})", args[0], args[1], args[2])
        }
        _ => format!("{}({})", libm_name(func, prec), args.join(", ")),
    }
}

/// Whether every use of value `id` adds it to a literal of magnitude at least 2⁻¹⁰⁰ (as in
/// `1 + exp(-x)`, a sigmoid's denominator), and nothing stores or reduces it. Such a sum cannot
/// tell an exp below 2⁻¹²⁴ from zero: it is under half an ulp of the literal, so the sum
/// rounds to the literal either way. [`EXPF`]'s `fb_expf_addend` relies on this to drop the
/// subnormal range.
fn only_added_to_constants(ir: &KernelIr, id: usize) -> bool {
    let big_literal = |x: usize| matches!(ir.body[x], Instr::Const { value, .. } if value.abs() >= 2f64.powi(-100));
    let mut used = false;
    for instr in &ir.body[id + 1..] {
        if instr.operands().contains(&id) {
            used = true;
            let adds = matches!(
                *instr,
                Instr::Binary { op: BinOp::Add, a, b, .. }
                    if (a == id && b != id && big_literal(b)) || (b == id && a != id && big_literal(a))
            );
            if !adds {
                return false;
            }
        }
    }
    used && ir.stores.iter().all(|s| s.value != id) && ir.reductions.iter().all(|r| r.value != id)
}

// ---------------------------------------------------------------------------------------------
// Kernels.

/// Indented C text.
struct Out {
    text: String,
    depth: usize,
}

impl Out {
    fn line(&mut self, line: impl AsRef<str>) {
        for _ in 0..self.depth {
            self.text.push_str("    ");
        }
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }

    /// `header {`, one level deeper.
    fn open(&mut self, header: impl AsRef<str>) {
        let header = header.as_ref();
        if header.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{header} {{"));
        }
        self.depth += 1;
    }

    fn close(&mut self) {
        self.depth -= 1;
        self.line("}");
    }
}

/// How a segment (one row's worth of one work item) hands each reduction its values; see the
/// module documentation for the strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pointwise,
    Rows,
    Columns,
    Partials,
}

/// Where a reduction's values go inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accumulate {
    /// Into a `simd` reduction variable, merged after the loop into the row's `acc{r}`.
    IntoRow,
    /// Into a `simd` reduction variable, merged after the loop into `q{r}[kb{r}]`.
    IntoSlot,
    /// Element `j` into `q{r}[kb{r} + j]`.
    Column,
}

/// One kernel being emitted. Naming scheme of the C locals (all inside the kernel function):
/// `n{d}` domain sizes; per argument `a` (in [`KernelIr::views`] order) `p{a}` pointer,
/// `o{a}` offset, `s{a}_{d}` run-time strides, `b{a}` a segment's base index; `i{d}` outer
/// coordinates; `v{id}` SSA values; per reduction `r`: `on{r}` output count, `ds{r}_{d}`
/// dense strides over kept axes, `poff{r}` position in the accumulator block, `q{r}` its
/// accumulators, `kb{r}` a segment's accumulator base.
struct Kernel<'a> {
    ir: &'a KernelIr,
    rank: usize,
    /// The innermost axis, `rank - 1`.
    inner: usize,
    /// C statements computing every `v{id}` at the current `j`.
    body: Vec<String>,
    /// How the body is split into consecutive vector loops.
    stages: Stages,
    /// Whether each loop starts with explicit AVX-512 vectors ([`vector`]).
    vector: bool,
}

impl<'a> Kernel<'a> {
    fn new(ir: &'a KernelIr) -> Self {
        let mut kernel = Kernel {
            ir,
            rank: ir.rank,
            inner: ir.rank - 1,
            body: Vec::new(),
            stages: Stages::plan(ir),
            vector: vector::supports(ir),
        };
        kernel.body = kernel.body_lines();
        kernel
    }

    fn store_arg(&self, k: usize) -> usize {
        self.ir.loads.len() + k
    }

    fn reduction_arg(&self, r: usize) -> usize {
        self.ir.loads.len() + self.ir.stores.len() + r
    }

    fn view(&self, arg: usize) -> &crate::lower::ir::View {
        self.ir.views().nth(arg).expect("argument index in range")
    }

    /// The multiplier of coordinate `d` in argument `arg`'s index, if it moves on `d`.
    fn stride(&self, arg: usize, d: usize) -> Option<String> {
        match self.view(arg).axes[d] {
            Axis::Broadcast => None,
            Axis::Unit => Some("1".to_string()),
            Axis::Strided => Some(format!("s{arg}_{d}")),
        }
    }

    /// `coord * stride`, simplified for a unit stride.
    fn term(&self, arg: usize, d: usize, coord: &str) -> Option<String> {
        self.stride(arg, d).map(|s| {
            if s == "1" {
                coord.to_string()
            } else {
                format!("{coord} * {s}")
            }
        })
    }

    /// `o{arg}` plus argument `arg`'s terms for the outer coordinates `i{d}`: its index at the
    /// start of the current row.
    fn row_base(&self, arg: usize) -> String {
        let mut base = format!("o{arg}");
        for d in 0..self.inner {
            if let Some(t) = self.term(arg, d, &format!("i{d}")) {
                base.push_str(&format!(" + {t}"));
            }
        }
        base
    }

    /// The element of argument `arg` at inner index `j` of the current segment.
    fn element(&self, arg: usize) -> String {
        match self.term(arg, self.inner, "j") {
            Some(t) => format!("p{arg}[b{arg} + {t}]"),
            None => format!("p{arg}[b{arg}]"),
        }
    }

    fn value_type(&self, id: usize) -> &'static str {
        c_type(self.ir.prec(id))
    }

    fn body_lines(&self) -> Vec<String> {
        let ir = self.ir;
        let v = |id: usize| format!("v{id}");
        ir.body
            .iter()
            .enumerate()
            .map(|(id, instr)| {
                let expr = match instr {
                    Instr::Load { view } => {
                        load_conversion(ir.loads[*view].dtype, &self.element(*view))
                    }
                    Instr::Const { value, prec } => literal(*value, *prec),
                    Instr::Widen { x } => format!("(double){}", v(*x)),
                    Instr::Round { x, dtype } => round_expr(ir.prec(*x), *dtype, &v(*x)),
                    Instr::Neg { x, .. } => format!("(-{})", v(*x)),
                    Instr::Binary { op, a, b, prec } => binary_expr(*op, &v(*a), &v(*b), *prec),
                    Instr::Call {
                        func: Func::Exp,
                        args,
                        prec: Prec::F32,
                    } if only_added_to_constants(ir, id) => {
                        format!("fb_expf_addend({})", v(args[0]))
                    }
                    Instr::Call { func, args, prec } => {
                        let args: Vec<String> = args.iter().map(|&a| v(a)).collect();
                        call_expr(*func, &args, *prec)
                    }
                };
                format!("const {} v{id} = {expr};", self.value_type(id))
            })
            .collect()
    }

    fn emit(&self, name: &str) -> String {
        let mut out = Out {
            text: String::new(),
            depth: 0,
        };
        out.open(format!(
            "void {name}(const int64_t *sizes, const int64_t *strides, \
             const int64_t *offsets, void *const *ptrs)"
        ));
        self.preamble(&mut out);
        if self.ir.reductions.is_empty() {
            self.pointwise(&mut out);
        } else {
            self.reduction_preamble(&mut out);
            let inner_only = |reduced: &[bool]| {
                reduced
                    .iter()
                    .enumerate()
                    .all(|(d, &r)| r == (d == self.inner))
            };
            let rows = self.ir.reductions.iter().all(|r| inner_only(&r.reduced));
            let columns = self.ir.reductions.iter().all(|r| !r.reduced[self.inner]);
            if rows {
                // One row per thread needs enough rows to keep every thread busy.
                out.open("if (nt == 1 || outer >= 4 * (int64_t)nt)");
                self.rows(&mut out);
                out.close();
                out.open("else");
                self.partials(&mut out);
                out.close();
            } else if columns {
                // Column ranges per thread need enough columns; per-thread partials must not
                // outgrow the data.
                out.open(
                    "if (nt == 1 || inner >= 256 * (int64_t)nt || ptot * (int64_t)nt > total)",
                );
                self.columns(&mut out);
                out.close();
                out.open("else");
                self.partials(&mut out);
                out.close();
            } else {
                self.partials(&mut out);
            }
        }
        out.close();
        out.text
    }

    /// Sizes, per argument its pointer, offset and run-time strides, the axis folding, and
    /// the thread count.
    fn preamble(&self, out: &mut Out) {
        for d in 0..self.rank {
            out.line(format!("int64_t n{d} = sizes[{d}];"));
        }
        self.arguments(out);
        self.fold_axes(out);
        out.line(format!("const int64_t inner = n{};", self.inner));
        let outer: Vec<String> = (0..self.inner).map(|d| format!("n{d}")).collect();
        let outer = if outer.is_empty() {
            "1".to_string()
        } else {
            outer.join(" * ")
        };
        out.line(format!("const int64_t outer = {outer};"));
        out.line("const int64_t total = outer * inner;");
        out.line(format!(
            "const int nt = total > {PARALLEL_MIN} ? omp_get_max_threads() : 1;"
        ));
        if self.vector {
            out.line("#if defined(FB_AVX512)");
            out.line(format!(
                "const int fbs = {};",
                vector::launch_streams(self.ir)
            ));
            out.line("#endif");
        }
    }

    fn arguments(&self, out: &mut Out) {
        let loads = self.ir.loads.len();
        for (arg, view) in self.ir.views().enumerate() {
            let ty = storage_type(view.dtype);
            let constness = if arg < loads { "const " } else { "" };
            out.line(format!(
                "{constness}{ty} *p{arg} = ({constness}{ty} *)ptrs[{arg}];"
            ));
            out.line(format!("const int64_t o{arg} = offsets[{arg}];"));
            for (d, axis) in view.axes.iter().enumerate() {
                if *axis == Axis::Strided {
                    out.line(format!(
                        "const int64_t s{arg}_{d} = strides[{}];",
                        arg * self.rank + d
                    ));
                }
            }
        }
    }

    /// Folds outer axes into the innermost one at run time, innermost first, while every
    /// view is contiguous across the fold (its stride on the outer axis is its inner stride
    /// times the inner size) or the outer axis has size 1. The fold keeps every view's inner
    /// pattern, so the same vector loop runs over longer rows: a `[N, 1]` or `[N, 8]` domain
    /// of contiguous tensors becomes one long row instead of N tiny ones (whose scalar loop
    /// tails would call scalar libm).
    fn fold_axes(&self, out: &mut Out) {
        if self.rank < 2 {
            return;
        }
        let nonempty: Vec<String> = (0..self.rank).map(|d| format!("n{d} > 0")).collect();
        out.open(format!("if ({})", nonempty.join(" && ")));
        for d in (0..self.inner).rev() {
            out.open(format!("if (n{d} == 1 || {})", self.fold_condition(d)));
            out.line(format!("n{} *= n{d};", self.inner));
            out.line(format!("n{d} = 1;"));
        }
        for _ in 0..self.inner {
            out.close();
        }
        out.close();
    }

    /// The C condition under which outer axis `d` folds into the (already folded) inner axis.
    fn fold_condition(&self, d: usize) -> String {
        let inner = self.inner;
        let n = format!("n{inner}");
        let first_reduction = self.reduction_arg(0);
        let mut conditions = Vec::new();
        for (arg, view) in self.ir.views().enumerate() {
            if arg >= first_reduction {
                let red = &self.ir.reductions[arg - first_reduction];
                if red.reduced[d] != red.reduced[inner] {
                    // Folding would mix reduced and kept coordinates.
                    return "0".to_string();
                }
                if red.reduced[d] {
                    continue;
                }
            }
            let inner_step = match view.axes[inner] {
                Axis::Unit => n.clone(),
                Axis::Broadcast => "0".to_string(),
                Axis::Strided => format!("s{arg}_{inner} * {n}"),
            };
            let outer_stride = self.stride(arg, d).unwrap_or_else(|| "0".to_string());
            match (outer_stride.as_str(), inner_step.as_str()) {
                ("0", "0") => {}
                ("0", _) | ("1", "0") => return "0".to_string(),
                _ => conditions.push(format!("{outer_stride} == {inner_step}")),
            }
        }
        if conditions.is_empty() {
            "1".to_string()
        } else {
            format!("({})", conditions.join(" && "))
        }
    }

    /// Per reduction: output count, dense strides over kept axes, element count (for means),
    /// and its place in a block of accumulators.
    fn reduction_preamble(&self, out: &mut Out) {
        for (r, red) in self.ir.reductions.iter().enumerate() {
            let kept: Vec<usize> = (0..self.rank).filter(|&d| !red.reduced[d]).collect();
            let mut next: Option<usize> = None;
            for &d in kept.iter().rev() {
                let value = match next {
                    None => "1".to_string(),
                    Some(e) => format!("ds{r}_{e} * n{e}"),
                };
                out.line(format!("const int64_t ds{r}_{d} = {value};"));
                next = Some(d);
            }
            match kept.first() {
                Some(&first) => {
                    out.line(format!("const int64_t on{r} = ds{r}_{first} * n{first};"))
                }
                None => out.line(format!("const int64_t on{r} = 1;")),
            }
            if red.kind == ReduceKind::Mean {
                let reduced: Vec<String> = (0..self.rank)
                    .filter(|&d| red.reduced[d])
                    .map(|d| format!("n{d}"))
                    .collect();
                let count = if reduced.is_empty() {
                    "1".to_string()
                } else {
                    reduced.join(" * ")
                };
                out.line(format!("const double cnt{r} = (double)({count});"));
            }
            let offset = if r == 0 {
                "0".to_string()
            } else {
                format!("poff{} + on{}", r - 1, r - 1)
            };
            out.line(format!("const int64_t poff{r} = {offset};"));
        }
        let last = self.ir.reductions.len() - 1;
        out.line(format!("const int64_t ptot = poff{last} + on{last};"));
    }

    /// Outer coordinates `i{d}` of outer index `o` (row-major over axes `0..inner`).
    fn decompose_outer(&self, out: &mut Out, o: &str) {
        match self.inner {
            0 => {}
            1 => out.line(format!("const int64_t i0 = {o};")),
            _ => {
                out.line(format!("int64_t rem = {o};"));
                for d in (1..self.inner).rev() {
                    out.line(format!("const int64_t i{d} = rem % n{d};"));
                    out.line(format!("rem /= n{d};"));
                }
                out.line("const int64_t i0 = rem;");
            }
        }
    }

    /// Sets `o`, `j0` and `len` from work item `w` of `items = outer * nch`.
    fn work_item(&self, out: &mut Out) {
        // Rows of at most one chunk are common; skip the division for them.
        out.line("const int64_t o = nch == 1 ? w : w / nch;");
        out.line(format!("const int64_t j0 = (w - o * nch) * {CHUNK};"));
        out.line(format!(
            "const int64_t len = inner - j0 < {CHUNK} ? inner - j0 : {CHUNK};"
        ));
        self.decompose_outer(out, "o");
    }

    fn pointwise(&self, out: &mut Out) {
        out.line(format!(
            "const int64_t nch = (inner + {}) / {CHUNK};",
            CHUNK - 1
        ));
        out.line("const int64_t items = outer * nch;");
        out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        out.open("for (int64_t w = 0; w < items; w++)");
        self.work_item(out);
        self.segment(out, Mode::Pointwise);
        out.close();
    }

    fn identity(&self, r: usize) -> &'static str {
        match self.ir.reductions[r].kind {
            ReduceKind::Sum | ReduceKind::Mean => "0.0",
            ReduceKind::Max => "-INFINITY",
        }
    }

    /// `acc` combined with `x`, for reduction `r`.
    fn merge(&self, r: usize, acc: &str, x: &str) -> String {
        match self.ir.reductions[r].kind {
            ReduceKind::Sum | ReduceKind::Mean => format!("{acc} + {x}"),
            ReduceKind::Max => format!("fb_maxacc({acc}, {x})"),
        }
    }

    /// The store of an accumulated result `a` of reduction `r` at index `at` of its output.
    fn finish(&self, out: &mut Out, r: usize, at: &str) {
        let red = &self.ir.reductions[r];
        if red.kind == ReduceKind::Mean {
            out.line(format!("a = a / cnt{r};"));
        }
        let arg = self.reduction_arg(r);
        let value = store_conversion(red.view.dtype, &round_expr(Prec::F64, red.view.dtype, "a"));
        out.line(format!("p{arg}[{at}] = {value};"));
    }

    fn rows(&self, out: &mut Out) {
        out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        out.open("for (int64_t o = 0; o < outer; o++)");
        self.decompose_outer(out, "o");
        for r in 0..self.ir.reductions.len() {
            out.line(format!("double acc{r} = {};", self.identity(r)));
        }
        out.open(format!("for (int64_t j0 = 0; j0 < inner; j0 += {CHUNK})"));
        out.line(format!(
            "const int64_t len = inner - j0 < {CHUNK} ? inner - j0 : {CHUNK};"
        ));
        self.segment(out, Mode::Rows);
        out.close();
        for r in 0..self.ir.reductions.len() {
            let at = self.row_base(self.reduction_arg(r));
            out.open("");
            out.line(format!("double a = acc{r};"));
            self.finish(out, r, &at);
            out.close();
        }
        out.close();
    }

    /// Initialises accumulators `q{r}[0..on{r}]` to each reduction's identity.
    fn init_accumulators(&self, out: &mut Out, parallel: bool) {
        for r in 0..self.ir.reductions.len() {
            if parallel {
                out.line(format!(
                    "#pragma omp parallel for schedule(static) if(nt > 1 && on{r} > {PARALLEL_MIN})"
                ));
            }
            out.line(format!(
                "for (int64_t k = 0; k < on{r}; k++) q{r}[k] = {};",
                self.identity(r)
            ));
        }
    }

    /// Rounds and stores every output element of every reduction; `source(r)` is the C
    /// statement setting `double a` for output `k` of reduction `r`.
    fn finalize(&self, out: &mut Out, source: impl Fn(usize) -> Vec<String>) {
        for (r, red) in self.ir.reductions.iter().enumerate() {
            let arg = self.reduction_arg(r);
            out.line(format!(
                "#pragma omp parallel for schedule(static) if(nt > 1 && on{r} > 4096)"
            ));
            out.open(format!("for (int64_t k = 0; k < on{r}; k++)"));
            for line in source(r) {
                out.line(line);
            }
            let kept: Vec<usize> = (0..self.rank).filter(|&d| !red.reduced[d]).collect();
            out.line(format!("int64_t at = o{arg};"));
            if let Some((&first, rest)) = kept.split_first() {
                out.line("int64_t rem = k;");
                for &d in rest.iter().rev() {
                    if let Some(t) = self.term(arg, d, &format!("(rem % n{d})")) {
                        out.line(format!("at += {t};"));
                    }
                    out.line(format!("rem /= n{d};"));
                }
                if let Some(t) = self.term(arg, first, "rem") {
                    out.line(format!("at += {t};"));
                }
            }
            self.finish(out, r, "at");
            out.close();
        }
    }

    fn columns(&self, out: &mut Out) {
        out.line("double *acc = (double *)malloc(sizeof(double) * (size_t)(ptot > 0 ? ptot : 1));");
        out.line("if (!acc) abort();");
        for r in 0..self.ir.reductions.len() {
            out.line(format!("double *q{r} = acc + poff{r};"));
        }
        self.init_accumulators(out, true);
        // About four column ranges per thread, in whole cache lines of doubles.
        out.line("int64_t cs = (inner + 4 * (int64_t)nt - 1) / (4 * (int64_t)nt);");
        out.line("cs = (cs + 63) / 64 * 64;");
        out.line(format!(
            "cs = cs < 64 ? 64 : (cs > {CHUNK} ? {CHUNK} : cs);"
        ));
        out.line("const int64_t nch = (inner + cs - 1) / cs;");
        out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        out.open("for (int64_t c = 0; c < nch; c++)");
        out.line("const int64_t j0 = c * cs;");
        out.line("const int64_t len = inner - j0 < cs ? inner - j0 : cs;");
        out.open("for (int64_t o = 0; o < outer; o++)");
        self.decompose_outer(out, "o");
        self.segment(out, Mode::Columns);
        out.close();
        out.close();
        self.finalize(out, |r| vec![format!("double a = q{r}[k];")]);
        out.line("free(acc);");
    }

    fn partials(&self, out: &mut Out) {
        out.line("int np = nt;");
        out.line(
            "double *part = (double *)malloc(sizeof(double) * (size_t)(ptot * np > 0 ? ptot * np : 1));",
        );
        out.open("if (!part)");
        // Not enough memory for one copy per thread: one thread, one copy.
        out.line("np = 1;");
        out.line("part = (double *)malloc(sizeof(double) * (size_t)(ptot > 0 ? ptot : 1));");
        out.line("if (!part) abort();");
        out.close();
        out.line("int nused = 1;");
        out.line(format!(
            "const int64_t nch = (inner + {}) / {CHUNK};",
            CHUNK - 1
        ));
        out.line("const int64_t items = outer * nch;");
        out.line("#pragma omp parallel num_threads(np) if(np > 1)");
        out.open("");
        out.line("const int t = omp_get_thread_num();");
        out.line("const int nth = omp_get_num_threads();");
        // The team may be smaller than asked for; only its buffers are initialised and read.
        out.line("if (t == 0) nused = nth;");
        for r in 0..self.ir.reductions.len() {
            out.line(format!(
                "double *q{r} = part + (int64_t)t * ptot + poff{r};"
            ));
        }
        self.init_accumulators(out, false);
        out.line("const int64_t w0 = items * t / nth;");
        out.line("const int64_t w1 = items * (t + 1) / nth;");
        out.open("for (int64_t w = w0; w < w1; w++)");
        self.work_item(out);
        self.segment(out, Mode::Partials);
        out.close();
        out.close();
        self.finalize(out, |r| {
            vec![
                format!("double a = {};", self.identity(r)),
                format!(
                    "for (int u = 0; u < nused; u++) a = {};",
                    self.merge(r, "a", &format!("part[(int64_t)u * ptot + poff{r} + k]"))
                ),
            ]
        });
        out.line("free(part);");
    }

    fn accumulate(&self, mode: Mode, r: usize) -> Accumulate {
        let inner_reduced = self.ir.reductions[r].reduced[self.inner];
        match mode {
            Mode::Pointwise => unreachable!("pointwise kernels have no reductions"),
            Mode::Rows => Accumulate::IntoRow,
            Mode::Partials if inner_reduced => Accumulate::IntoSlot,
            Mode::Columns | Mode::Partials => Accumulate::Column,
        }
    }

    /// One segment: inner indices `j0 .. j0 + len` of the row at outer coordinates `i{d}`.
    /// Computes the body in a vector loop, stores, and feeds the reductions per `mode`.
    fn segment(&self, out: &mut Out, mode: Mode) {
        let ir = self.ir;
        out.open("");
        // Base indices of loads and stores at (i, j0).
        for arg in 0..ir.loads.len() + ir.stores.len() {
            let mut base = self.row_base(arg);
            if let Some(t) = self.term(arg, self.inner, "j0") {
                base.push_str(&format!(" + {t}"));
            }
            out.line(format!("const int64_t b{arg} = {base};"));
        }
        // Stores: rows this segment must not write go to a scratch buffer.
        let mut in_loop = Vec::new();
        let mut after_loop = Vec::new();
        for (k, store) in ir.stores.iter().enumerate() {
            let arg = self.store_arg(k);
            let ty = storage_type(store.view.dtype);
            let skipped: Vec<String> = (0..self.inner)
                .filter(|&d| store.view.axes[d] == Axis::Broadcast)
                .map(|d| format!("i{d} == 0"))
                .collect();
            let ok = if skipped.is_empty() {
                None
            } else {
                out.line(format!("const int ok{k} = {};", skipped.join(" && ")));
                Some(format!("ok{k}"))
            };
            let value = store_conversion(store.view.dtype, &format!("v{}", store.value));
            match store.view.axes[self.inner] {
                Axis::Broadcast => {
                    let write = format!("p{arg}[b{arg}] = {value};");
                    after_loop.push(match &ok {
                        Some(ok) => format!("if ({ok}) {write}"),
                        None => write,
                    });
                }
                inner_axis => {
                    let stride = if inner_axis == Axis::Strided {
                        Some(format!("s{arg}_{}", self.inner))
                    } else {
                        None
                    };
                    match &ok {
                        Some(ok) => {
                            out.line(format!("{ty} scratch{k}[{CHUNK}];"));
                            out.line(format!("{ty} *d{k} = {ok} ? p{arg} + b{arg} : scratch{k};"));
                            if let Some(s) = &stride {
                                out.line(format!("const int64_t t{k} = {ok} ? {s} : 1;"));
                            }
                        }
                        None => {
                            out.line(format!("{ty} *d{k} = p{arg} + b{arg};"));
                            if let Some(s) = &stride {
                                out.line(format!("const int64_t t{k} = {s};"));
                            }
                        }
                    }
                    let index = if stride.is_some() {
                        format!("j * t{k}")
                    } else {
                        "j".to_string()
                    };
                    in_loop.push(LoopStatement {
                        stage: self.stages.store_stage(store.value),
                        reads: store.value,
                        text: format!("d{k}[{index}] = {value};"),
                        vector: self
                            .vector
                            .then(|| vector::store(k, store.value, store.view.dtype)),
                    });
                }
            }
        }
        // Reductions, in the last loop.
        let mut clauses = Vec::new();
        let mut merges = Vec::new();
        for (r, red) in ir.reductions.iter().enumerate() {
            let x = format!("(double)v{}", red.value);
            let accumulate = |text: String| LoopStatement {
                stage: self.stages.count,
                reads: red.value,
                text,
                vector: None,
            };
            let how = self.accumulate(mode, r);
            if mode != Mode::Rows {
                let mut base = "0".to_string();
                for d in 0..self.inner {
                    if !red.reduced[d] {
                        base.push_str(&format!(" + i{d} * ds{r}_{d}"));
                    }
                }
                if !red.reduced[self.inner] {
                    base.push_str(" + j0");
                }
                out.line(format!("const int64_t kb{r} = {base};"));
            }
            match (how, red.kind) {
                (Accumulate::IntoRow | Accumulate::IntoSlot, kind) => {
                    let dest = if how == Accumulate::IntoRow {
                        format!("acc{r}")
                    } else {
                        format!("q{r}[kb{r}]")
                    };
                    if kind == ReduceKind::Max {
                        out.line(format!("double m{r} = -INFINITY;"));
                        out.line(format!("int nan{r} = 0;"));
                        clauses.push(format!("reduction(max:m{r}) reduction(|:nan{r})"));
                        in_loop.push(accumulate(format!("m{r} = {x} > m{r} ? {x} : m{r};")));
                        in_loop.push(accumulate(format!("nan{r} |= {x} != {x};")));
                        merges.push(format!(
                            "{dest} = fb_maxacc({dest}, nan{r} ? (double)NAN : m{r});"
                        ));
                    } else {
                        out.line(format!("double s{r} = 0.0;"));
                        clauses.push(format!("reduction(+:s{r})"));
                        in_loop.push(accumulate(format!("s{r} += {x};")));
                        merges.push(format!("{dest} += s{r};"));
                    }
                }
                (Accumulate::Column, ReduceKind::Max) => in_loop.push(accumulate(format!(
                    "q{r}[kb{r} + j] = fb_maxacc(q{r}[kb{r} + j], {x});"
                ))),
                (Accumulate::Column, _) => {
                    in_loop.push(accumulate(format!("q{r}[kb{r} + j] += {x};")))
                }
            }
        }
        let mut pragma = String::from("#pragma omp simd");
        for clause in &clauses {
            pragma.push(' ');
            pragma.push_str(clause);
        }
        self.loops(out, &pragma, &in_loop);
        for line in &merges {
            out.line(line);
        }
        if !after_loop.is_empty() {
            // Stores broadcast along the inner axis: element 0 of the row only.
            out.open("if (len > 0 && j0 == 0)");
            out.line("const int64_t j = 0;");
            for line in self.body.iter().chain(&after_loop) {
                out.line(line);
            }
            out.close();
        }
        out.close();
    }

    /// The vector loop(s) over `j` of one segment: the body, then `in_loop`'s statements
    /// (stores and accumulations). `pragma` goes on
    /// the last loop, which holds any reduction. With one stage this is the single fused loop;
    /// with more, each loop computes one stage of the body and hands the values later stages
    /// read through stack arrays of one chunk (see [`Stages`]).
    fn loops(&self, out: &mut Out, pragma: &str, in_loop: &[LoopStatement]) {
        let stages = &self.stages;
        for &id in &stages.carried {
            out.line(format!(
                "{} c{id}[{CHUNK}] __attribute__((aligned(64)));",
                self.value_type(id)
            ));
        }
        // Destinations the vector loops store to (contiguous ones; see `segment`).
        let streamed: Vec<usize> = if self.vector {
            (0..self.ir.stores.len())
                .filter(|&k| self.ir.stores[k].view.axes[self.inner] == Axis::Unit)
                .collect()
        } else {
            Vec::new()
        };
        let live = if self.vector {
            vector::live(self.ir)
        } else {
            Vec::new()
        };
        if self.vector {
            // Whole vectors first (when the compiler targets AVX-512), the rest in scalar.
            out.line("#if defined(FB_AVX512)");
            out.line(format!("const int64_t jv = len - len % {};", vector::LANES));
            if !streamed.is_empty() {
                let condition = vector::stream_condition(&streamed);
                out.line(format!("const int st = {condition};"));
            }
            out.line("#else");
            out.line("const int64_t jv = 0;");
            out.line("#endif");
        }
        for stage in 1..=stages.count {
            let statements: Vec<&LoopStatement> =
                in_loop.iter().filter(|st| st.stage == stage).collect();
            // What this loop evaluates: its own stage, plus the loads and literals those read;
            // values of earlier stages are read back from their arrays.
            let mut needed: Vec<bool> = (0..self.body.len())
                .map(|id| stages.stage[id] == stage)
                .collect();
            for statement in &statements {
                needed[statement.reads] = true;
            }
            for id in (0..self.body.len()).rev() {
                if needed[id] && (stages.stage[id] == stage || stages.stage[id] == 0) {
                    for x in self.ir.body[id].operands() {
                        needed[x] = true;
                    }
                }
            }
            let computed = |id: usize| stages.stage[id] == stage || stages.stage[id] == 0;
            let saved: Vec<usize> = stages
                .carried
                .iter()
                .copied()
                .filter(|&id| stages.stage[id] == stage)
                .collect();
            if self.vector {
                out.line("#if defined(FB_AVX512)");
                out.open(format!(
                    "for (int64_t j = 0; j < jv; j += {})",
                    vector::LANES
                ));
                // Dead values (which may have no vector form) are left out.
                for id in (0..self.body.len()).filter(|&id| needed[id] && live[id]) {
                    out.line(if computed(id) {
                        vector::statement(self.ir, id)
                    } else {
                        vector::carried_load(id)
                    });
                }
                for &id in saved.iter().filter(|&&id| live[id]) {
                    out.line(vector::carried_store(id));
                }
                for statement in &statements {
                    let text = statement.vector.as_ref();
                    out.line(text.expect("vector kernels have vector statements"));
                }
                out.close();
                out.line("#endif");
            }
            out.line(if stage == stages.count {
                pragma
            } else {
                "#pragma omp simd"
            });
            let start = if self.vector { "jv" } else { "0" };
            out.open(format!("for (int64_t j = {start}; j < len; j++)"));
            for id in (0..self.body.len()).filter(|&id| needed[id]) {
                if computed(id) {
                    out.line(&self.body[id]);
                } else {
                    out.line(format!("const {} v{id} = c{id}[j];", self.value_type(id)));
                }
            }
            for &id in &saved {
                out.line(format!("c{id}[j] = v{id};"));
            }
            for statement in statements {
                out.line(&statement.text);
            }
            out.close();
        }
        if !streamed.is_empty() {
            // Streaming stores are weakly ordered: fence them before the thread moves on (and
            // before the team's closing barrier publishes the results).
            out.line("#if defined(FB_AVX512)");
            out.line("if (st) _mm_sfence();");
            out.line("#endif");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loop fission at transcendental calls.

/// A statement of the vector loop after the body: a store or an accumulation.
struct LoopStatement {
    /// The loop it goes in (1-based, see [`Stages`]).
    stage: usize,
    /// The body value it reads.
    reads: usize,
    text: String,
    /// The same statement over 16 lanes, for kernels with vector loops.
    vector: Option<String>,
}

/// How a segment's body is split into consecutive vector loops (loop fission).
///
/// A fused kernel's body can chain transcendental calls: an LSTM cell computes `cy` from three
/// gate activations and then `tanh(cy)`. Each inline `exp`/`tanh` is a long chain of dependent
/// FMAs, and one loop iteration then holds more instructions than the core's reorder window
/// can overlap with the next, so the loop runs at the latency of the chain rather than at the
/// throughput of the vector units. Splitting the body at each level of transcendental depth
/// gives loops with short chains and independent iterations. Values crossing loops go
/// through stack arrays of one chunk, which stay in L1/L2 cache, so the memory traffic of the
/// kernel is unchanged. On the LSTM cell this takes the in-cache time per element down by
/// about a sixth, measured side by side with the single loop (book: performance chapter).
///
/// Stage of a value: 1 + the number of transcendental calls on the longest path to it, minus
/// one for the call itself — i.e. a call and everything computed from it before the next call
/// share a stage. Loads and literals have stage 0: they are re-evaluated in every loop that
/// reads them rather than carried.
#[derive(Debug, Clone)]
struct Stages {
    /// Number of loops, at least 1.
    count: usize,
    /// Stage of each body value (0 for loads and literals).
    stage: Vec<usize>,
    /// Values computed in one loop and read by a later one, in body order.
    carried: Vec<usize>,
}

/// At most this many bytes of carried arrays per segment: more falls back to one loop, so a
/// huge kernel cannot exhaust an OpenMP thread's stack.
const MAX_CARRIED_BYTES: usize = 128 * 1024;

impl Stages {
    fn plan(ir: &KernelIr) -> Stages {
        let n = ir.body.len();
        let mut depth = vec![0usize; n];
        for (id, instr) in ir.body.iter().enumerate() {
            let inputs = instr.operands().iter().map(|&x| depth[x]).max();
            let call = matches!(instr, Instr::Call { func, .. } if has_libmvec_variant(*func));
            depth[id] = inputs.unwrap_or(0) + usize::from(call);
        }
        let cheap = |id: usize| matches!(ir.body[id], Instr::Load { .. } | Instr::Const { .. });
        let stage: Vec<usize> = (0..n)
            .map(|id| if cheap(id) { 0 } else { depth[id].max(1) })
            .collect();
        let count = stage.iter().copied().max().unwrap_or(1).max(1);
        let single = Stages {
            count: 1,
            stage: stage.iter().map(|&s| s.min(1)).collect(),
            carried: Vec::new(),
        };
        if count == 1 {
            return single;
        }
        // A value is carried when a later loop reads it: an instruction of a later stage, a
        // store placed later (never: stores go with their value) or a reduction (last loop).
        let mut read_later = vec![false; n];
        for (id, instr) in ir.body.iter().enumerate() {
            for x in instr.operands() {
                if stage[x] != 0 && stage[x] < stage[id] {
                    read_later[x] = true;
                }
            }
        }
        for red in &ir.reductions {
            if stage[red.value] != 0 && stage[red.value] < count {
                read_later[red.value] = true;
            }
        }
        let carried: Vec<usize> = (0..n).filter(|&id| read_later[id]).collect();
        let bytes: usize = carried
            .iter()
            .map(|&id| match ir.prec(id) {
                Prec::F32 => 4,
                Prec::F64 => 8,
            })
            .sum::<usize>()
            * CHUNK as usize;
        if bytes > MAX_CARRIED_BYTES {
            return single;
        }
        Stages {
            count,
            stage,
            carried,
        }
    }

    /// The loop a store of `value` goes in: its value's (loads and literals: the first).
    fn store_stage(&self, value: usize) -> usize {
        self.stage[value].max(1)
    }
}

// ---------------------------------------------------------------------------------------------
// Invariants of the IR the lowering guarantees; checked in debug builds only.

fn check_invariants(ir: &KernelIr) {
    debug_assert!(ir.rank >= 1, "a kernel domain has at least one axis");
    for view in ir.views() {
        debug_assert_eq!(
            view.axes.len(),
            ir.rank,
            "view rank differs from the domain's"
        );
        for (d, axis) in view.axes.iter().enumerate() {
            debug_assert!(
                *axis != Axis::Unit || d + 1 == ir.rank,
                "`Unit` is only used on the innermost axis"
            );
        }
    }
    for (id, instr) in ir.body.iter().enumerate() {
        match instr {
            Instr::Load { view } => {
                debug_assert!(*view < ir.loads.len(), "load of a missing view");
            }
            Instr::Const { value, prec } => {
                debug_assert!(
                    *prec == Prec::F64 || value.is_nan() || (*value as f32) as f64 == *value,
                    "f32 constant {value} is not representable"
                );
            }
            Instr::Call { func, args, .. } => {
                debug_assert_eq!(args.len(), func.arity(), "{func:?} arity");
            }
            _ => {}
        }
        let operands = instr.operands();
        if operands.iter().any(|&x| x >= id) {
            debug_assert!(false, "v{id} uses a value defined after it");
            continue;
        }
        match instr {
            Instr::Widen { x } => {
                debug_assert_eq!(ir.prec(*x), Prec::F32, "v{id} widens a double");
            }
            Instr::Neg { prec, .. } | Instr::Binary { prec, .. } | Instr::Call { prec, .. } => {
                for &x in &operands {
                    debug_assert_eq!(ir.prec(x), *prec, "operand v{x} of v{id}: precision");
                }
            }
            _ => {}
        }
    }
    for store in &ir.stores {
        debug_assert!(store.value < ir.body.len(), "store of a missing value");
        if store.value < ir.body.len() {
            debug_assert_eq!(
                ir.prec(store.value),
                Prec::of(store.view.dtype),
                "stored value's precision differs from its dtype's"
            );
        }
    }
    for red in &ir.reductions {
        debug_assert!(red.value < ir.body.len(), "reduction of a missing value");
        debug_assert_eq!(red.reduced.len(), ir.rank, "reduced mask rank");
        for d in 0..ir.rank {
            debug_assert_eq!(
                red.view.axes.get(d) == Some(&Axis::Broadcast),
                red.reduced[d],
                "a reduction's output is broadcast exactly on its reduced axes"
            );
        }
    }
}
