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
//!   chain transcendental calls are split into one loop per level (`fission`). The
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
//! Reductions, and stores smaller than the domain, are documented with the loop nests that
//! implement them (`kernel`).
//!
//! # Layout
//!
//! The prelude's helpers are C, so they are kept as C files beside this module and included
//! verbatim: `emit/prelude.c` (conversions, rounding, min/max; always), `expf.c` and
//! `tanhf.c` (only when a kernel calls f32 `exp` or `tanh`), and the AVX-512 helpers
//! `vector.c`, `vector_expf.c`, `vector_tanhf.c` (only when a kernel runs vector loops).
//! This module decides which of them a translation unit needs and writes the kernels after
//! them with the submodules: `kernel` (the loop nests), `fission` (how a body is split into
//! loops), `vector` (the explicit AVX-512 loops) and `expr` (the C spelling of scalar values,
//! where it differs from CUDA's in `backend::spelling`). The IR's invariants are
//! checked by [`KernelIr::verify`], the same check as the CUDA emitter's.
//!
//! [`DType::round`]: crate::dtype::DType::round

use crate::backend::cache::hex;
use crate::backend::spelling::{Spelling, libm_name};
use crate::formula::Func;
use crate::lower::ir::{Instr, KernelIr, Prec};
use crate::lower::split::Split;
use expr::C;
use kernel::CKernelWriter;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

mod expr;
mod fission;
mod kernel;
mod split;
mod vector;
pub use kernel::ROW_SCRATCH_BYTES;
pub use vector::STREAM_MIN_BYTES;

/// Elements of one row handled by one work item (and one vector loop). Big enough that the
/// per-item bookkeeping (index arithmetic, base offsets) is noise, small enough that a row of
/// a wide tensor still splits across threads and scratch buffers fit on the stack.
pub const CHUNK: i64 = 2048;

/// Domains with at most this many elements run on the calling thread: waking a thread team
/// costs more than such a kernel takes.
pub const PARALLEL_MIN: i64 = 32768;

/// Rows walked together by a reduction kernel that reads its rows by a stride
/// (`CKernelWriter::row_tiles`): 16, so that the tile's rows of a transposed f32 view are the 16
/// floats of one 64-byte line.
pub const TILE_ROWS: i64 = 16;

/// Elements of each row a tile walks before the next row (`CKernelWriter::row_tiles`): 256, so
/// that each step of a transposed view's tile touches 256 lines, which stay in L2 for the
/// tile's other rows, and 256 pages (well within a second-level TLB of over a thousand
/// entries); [`TILE_COLUMNS_ALIASED`] where the stride would pack those lines into a few cache
/// sets.
pub const TILE_COLUMNS: i64 = 256;

/// Elements per step of a tile whose strided reads are a multiple of 4 KiB apart
/// (`CKernelWriter::tile_columns`): 16. Lines a multiple of 4 KiB apart share one L1 set (8 ways),
/// and on 2 MiB pages (`runtime::buffer` asks for them) the low 21 bits of their physical
/// addresses are the virtual ones, so a `[4096, 4096]` f32 read by columns (16 KiB apart) puts
/// a step's lines into 4 of the 1,024 sets of a 1 MiB 16-way L2: 64 lines. A step of 256 then
/// left L2 between the tile's rows (on the two-core Xeon `transposed_softmax` took 54–68 ms on
/// huge pages against 44–47 on 4 KiB pages, whose scattered frames spread the lines over the
/// sets); with 16 it takes 39.7–42 ms. Smaller strides keep 256: `layout_mix`'s transpose
/// (2 KiB apart, lines over 32 L2 sets) ran 1.15× slower with 16, whose short loops cost more
/// than they save there (book: performance chapter).
pub const TILE_COLUMNS_ALIASED: i64 = 16;

/// How many rows ahead the column walk of a reducing kernel asks for the strip it will read
/// (`kernel::CKernelWriter::prefetch_rows_ahead`). 4 and 8 timed alike on `[6144, 1024]` column
/// sums of `tanh`; 4 leaves fewer lines in flight past the walk's end.
pub const COLUMN_PREFETCH_ROWS: i64 = 4;

/// The column walk prefetches in launches whose loads read more than this: 16 MiB, half of
/// [`vector::STREAM_MIN_BYTES`]. The LSTM backward's kernel (8 MiB read, 13.6 MiB moved at
/// batch 256) runs from the cache between calls, and prefetching made it 1.2–1.4× slower; at
/// batch 1024 (32 MiB read) the hints made it 1.6–1.9× faster, and the 24 MiB of `[6144, 1024]`
/// column sums of `tanh` 3–4× faster (book: performance chapter).
pub const COLUMN_PREFETCH_MIN_BYTES: usize = 16 << 20;

/// The name [`kernel_name`] hashes the kernel under, so that the hash depends on the body
/// only and the name can then be derived from it.
const PLACEHOLDER_NAME: &str = "fb_kernel";

/// The C source of one kernel function named `name` implementing `ir`, with the ABI
/// documented on [`crate::lower::ir::Launch`]. It relies on the helpers of the prelude that
/// [`emit_module`] writes in front of it.
pub fn emit_kernel(ir: &KernelIr, name: &str) -> String {
    emit_cut_kernel(ir, name, cut(ir).as_ref())
}

/// The two functions through which a GEMM runs `ir`, an epilogue ending in reductions, on
/// the tiles of its product, after the kernel `name` in the module: `{name}_tile`, run on
/// each tile, merging the tile's part of every result into a block of accumulators, and
/// `{name}_finish`, run once, merging the blocks and storing the results (their ABI is on
/// `CKernelWriter::for_tiles` and `CKernelWriter::emit_finish`). `None` for a kernel
/// without reductions, or one that reads a concat by ranges (the GEMM never runs those).
pub fn emit_tile_functions(ir: &KernelIr, name: &str) -> Option<String> {
    if ir.reductions.is_empty() || cut(ir).is_some() {
        return None;
    }
    let tile = CKernelWriter::for_tiles(ir).emit(&tile_function(name));
    let finish = CKernelWriter::new(ir).emit_finish(&finish_function(name));
    Some(format!("{tile}\n{finish}"))
}

/// The name of kernel `name`'s form run on each tile ([`emit_tile_functions`]).
pub fn tile_function(name: &str) -> String {
    format!("{name}_tile")
}

/// The name of kernel `name`'s function finishing its tiles' reductions
/// ([`emit_tile_functions`]).
pub fn finish_function(name: &str) -> String {
    format!("{name}_finish")
}

/// How the C loops run a kernel that reads a concat by ranges in pieces.
enum Cut {
    /// One function per piece over its segment ([`crate::lower::split::split`]).
    Segments(Split),
    /// One loop nest whose row segments choose their pieces, for reductions along the
    /// select's axis ([`crate::lower::split::split_in_nest`]).
    Nest(Split),
}

impl Cut {
    /// The pieces' kernels, whichever way they run.
    fn pieces(&self) -> &[KernelIr] {
        match self {
            Cut::Segments(split) | Cut::Nest(split) => &split.pieces,
        }
    }
}

/// The pieces `ir` runs as in C, if any.
fn cut(ir: &KernelIr) -> Option<Cut> {
    crate::lower::split::split(ir)
        .map(Cut::Segments)
        .or_else(|| crate::lower::split::split_in_nest(ir).map(Cut::Nest))
}

/// [`emit_kernel`] with `ir`'s [`cut`] already found. A cut kernel is its clamped form
/// `{name}_c`, then its pieces (`{name}_s{k}`, or the nest `{name}_n`), then the function
/// `name` choosing between them by the launch's ranges.
fn emit_cut_kernel(ir: &KernelIr, name: &str, cut: Option<&Cut>) -> String {
    if cfg!(debug_assertions)
        && let Err(error) = ir.verify()
    {
        panic!("invalid kernel IR: {error}");
    }
    let Some(cut) = cut else {
        return CKernelWriter::new(ir).emit(name);
    };
    let mut text = CKernelWriter::new(ir).emit(&format!("{name}_c"));
    text.push('\n');
    match cut {
        Cut::Segments(split) => {
            for (k, piece) in split.pieces.iter().enumerate() {
                text.push_str(&CKernelWriter::new(piece).emit(&format!("{name}_s{k}")));
                text.push('\n');
            }
            text.push_str(&split::wrapper(ir, split, name));
        }
        Cut::Nest(split) => {
            text.push_str(&CKernelWriter::in_nest(ir, split).emit(&format!("{name}_n")));
            text.push('\n');
            text.push_str(&split::nest_wrapper(ir, split, name));
        }
    }
    text
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
    // Each optional part of the prelude follows a blank line.
    let mut part = |text: &str| {
        out.push('\n');
        out.push_str(text);
    };
    if expf {
        part(EXPF);
    }
    if tanhf {
        part(TANHF);
    }
    // Every function the module holds: each kernel's, and its pieces' (`emit_kernel`), which
    // may use helpers the kernel's clamped form does not (a split row kernel's pieces are row
    // kernels of their own).
    let cuts: Vec<Option<Cut>> = kernels.iter().map(|(_, ir)| cut(ir)).collect();
    let any_function = |uses: &dyn Fn(&KernelIr) -> bool| {
        kernels
            .iter()
            .zip(&cuts)
            .any(|((_, ir), cut)| uses(ir) || cut.iter().flat_map(Cut::pieces).any(uses))
    };
    if any_function(&vector::supports) {
        part(vector::VECTOR_HELPERS);
        if any_function(&|ir| vector::supports(ir) && ir.selects_along_rows()) {
            part(vector::VECTOR_RANGES);
        }
        if any_function(&|ir| vector::supports(ir) && !ir.reductions.is_empty()) {
            part(vector::VECTOR_COLUMNS);
        }
        if expf {
            part(vector::VECTOR_EXPF);
            if any_function(&|ir| kernel::row_exps(ir).contains(&true)) {
                part(vector::VECTOR_EXPF_ROW);
            }
        }
        if tanhf {
            part(vector::VECTOR_TANHF);
        }
    }
    let mut seen = BTreeSet::new();
    for ((name, ir), cut) in kernels.iter().zip(&cuts) {
        if seen.insert(name.as_str()) {
            out.push('\n');
            out.push_str(&emit_cut_kernel(ir, name, cut.as_ref()));
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
/// vectorize; each mirrors one rule of [`DType::round`](crate::dtype::DType::round) or one
/// storage format.
const HELPERS: &str = include_str!("emit/prelude.c");

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
/// [`expr::only_added_to_constants`]): exact down to 2⁻¹²⁴, anything below that for smaller
/// results. It applies 2ⁿ as 2ⁿ⁻¹ · 2, which keeps results up to the f32 maximum rounded once.
const EXPF: &str = include_str!("emit/expf.c");

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
const TANHF: &str = include_str!("emit/tanhf.c");

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
        let ty = C.value_type(prec);
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

/// Whether glibc's libmvec has vector variants of `func`: the calls worth declaring, and the
/// transcendental calls at which [`fission`] splits a body.
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
    // Not `atan`: libmvec has it only from glibc 2.35, and a declaration of a variant the
    // library lacks fails at link time; it stays a scalar call.
}
