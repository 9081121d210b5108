//! CUDA C emission: [`KernelIr`]s in, one self-contained `.cu` translation unit out.
//!
//! The text is compiled by NVRTC (see [`super::nvrtc`]) and launched with the ABI of
//! [`super::abi`]: every entry point takes one by-value struct holding the device pointers,
//! sizes, strides and offsets, and exists with 32- and 64-bit index arithmetic. The semantics
//! are the CPU emitter's ([`crate::backend::cpu::emit`]) to the bit wherever the IR is exact:
//! f16/bf16 values live as `__half`/`__nv_bfloat16` in memory and as `float` in registers,
//! rounding happens where [`Instr::Round`] says with the reference's rules (`prelude.cu`
//! spells each one), arithmetic goes through the `__fadd_rn`-style intrinsics so no compiler
//! option can fuse a multiply-add, and the math functions are CUDA's accurate ones (`expf`,
//! not `__expf`). The text of each value is the CPU's wherever the two agree: both spell
//! scalars through `backend::spelling`, and `expr` holds CUDA's differences.
//!
//! [`Instr::Round`]: crate::lower::ir::Instr::Round
//!
//! # Pointwise kernels
//!
//! One grid-stride loop over the flattened domain (after the host has [folded](abi::fold)
//! contiguous axes into the innermost one). Each thread decomposes its flat index into
//! coordinates, forms each view's element index `offset + Σ coordinate · stride`, evaluates
//! the body and stores. A second, vectorized loop runs instead when the parameter block's
//! `vec` flag says every view contiguous along the innermost axis is aligned
//! ([`abi::vector_ok`]): each thread then handles [`abi::vector_width`] neighbouring elements
//! of one row, moving those views with 16-byte loads and stores (`uint4`: 8 halves, 4 floats,
//! two 16-byte chunks of 8 f32s…) and the others element by element.
//!
//! # Row kernels
//!
//! A kernel whose body holds row reductions ([`crate::lower::ir`]'s row kernels: softmax,
//! layernorm) runs one block per row, its threads striding over the row in one loop per
//! pass, with a block-wide combination after each pass that hands every thread the row's
//! results; `rows` documents the code, [`abi::row_block`] the block size.
//!
//! # Reductions
//!
//! Reductions with the same reduced axes form a group ([`abi::reduction_groups`]); each group
//! is one pass (`_g{g}`) that walks, for every output element `k` (a point of the kept axes),
//! that output's reduced elements. The walk is cut into items (output, piece), each taken by
//! `lanes` threads: a warp or a block when the innermost axis is reduced (neighbouring
//! threads read neighbouring elements), a single thread when it is kept (neighbouring threads
//! take neighbouring outputs, which are neighbours in memory). Each thread accumulates its
//! share in `double`; the group's threads are combined by warp shuffles and, for a block,
//! through shared memory, in a fixed order. Then:
//!
//! - by default the item's result is added into the output's f64 scratch slot with
//!   `atomicAdd` (sum, mean) or a compare-and-swap max, after an `_init` pass has set every
//!   slot to the identity;
//! - with [`EmitOptions::deterministic`], each item writes its own slot `k * split + piece`
//!   and no atomics are used, so results are bitwise reproducible run to run (the cut
//!   depends on sizes only, [`abi::group_shapes`]).
//!
//! A `_finish` pass combines (deterministic) or reads (atomic) each output's slot(s), divides
//! a mean by its element count, rounds once to the output dtype and stores. Max accumulates
//! as `max` of the formula language does (NaN wins, −0 below +0), which makes it
//! order-independent: even with atomics its result never depends on timing. The first
//! group's pass visits every domain point exactly once, so it also writes the pointwise
//! stores (element by element: the passes have no vectorized loop). Stores broadcast along
//! an axis are written only where the domain index on that axis is 0, so each element is
//! written once, as on the CPU.

mod code;
mod expr;
mod rows;

use super::abi;
use crate::backend::cache::hex;
use crate::backend::spelling::{Spelling, gather_offset, map_stage_positions};
use crate::lower::accumulate::Accumulator;
use crate::lower::ir::{Arg, Axis, Instr, KernelIr, Prec, ReduceKind, View};
use crate::lower::split::Split;
use crate::lower::verify::IrError;
use code::Code;
use expr::Cuda;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

/// The prelude every module starts with: includes, conversions, rounding, min/max, vector
/// access, and the reductions' combination helpers.
const PRELUDE: &str = include_str!("emit/prelude.cu");

/// The name [`kernel_name`] hashes the kernel under, so the hash depends on the body only.
const PLACEHOLDER_NAME: &str = "fbc_kernel";

/// Options that change the emitted code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EmitOptions {
    /// Deterministic reductions: no float atomics; each piece of each output writes its own
    /// partial, and `_finish` combines them in order.
    pub deterministic: bool,
}

/// The module for a program's kernels: its source, and each kernel's name in it (in the
/// order given; equal kernels share one name and one definition).
pub fn emit_program(kernels: &[KernelIr], options: &EmitOptions) -> (String, Vec<String>) {
    let names: Vec<String> = kernels.iter().map(kernel_name).collect();
    let pairs: Vec<(String, &KernelIr)> = names.iter().cloned().zip(kernels).collect();
    (emit_module(&pairs, options), names)
}

/// A self-contained `.cu` translation unit: the prelude, then every kernel's parameter struct,
/// device functions and `extern "C"` entry points ([`abi`] documents them).
///
/// The text depends only on the input, byte for byte, because it is the compile cache's key.
/// Entries with a name already emitted are skipped: names come from [`kernel_name`], so an
/// equal name means an equal kernel.
pub fn emit_module(kernels: &[(String, &KernelIr)], options: &EmitOptions) -> String {
    let mut out = String::from(PRELUDE);
    let mut seen = BTreeSet::new();
    for (name, ir) in kernels {
        if seen.insert(name.as_str()) {
            out.push('\n');
            out.push_str(&emit_kernel(ir, name, options));
        }
    }
    out
}

/// A stable name for the kernel: `fbc_` and 16 hex digits of the SHA-256 of its emitted text
/// in both modes. Equal IRs get equal names, and a change to the emitter renames every kernel,
/// so stale cache entries are never confused with new ones.
pub fn kernel_name(ir: &KernelIr) -> String {
    let mut hasher = Sha256::new();
    for deterministic in [false, true] {
        let options = EmitOptions { deterministic };
        hasher.update(emit_kernel(ir, PLACEHOLDER_NAME, &options).as_bytes());
    }
    format!("fbc_{}", hex(&hasher.finalize()[..8]))
}

/// One kernel's struct, device functions and entry points.
fn emit_kernel(ir: &KernelIr, name: &str, options: &EmitOptions) -> String {
    // The IR's invariants, as the CPU emitter checks them, except that an f32 literal f32
    // cannot represent is accepted: the spelling rounds it to nearest (as the CPU's does), and
    // the compile tests write such literals (1e-40 and 3.4e38 at f32 in `tests/cuda_emit.rs`).
    // `verify` checks literals last, so all else has been checked when it reports one.
    if cfg!(debug_assertions) {
        match ir.verify() {
            Ok(()) | Err(IrError::UnrepresentableConst { .. }) => {}
            Err(error) => panic!("invalid kernel IR: {error}"),
        }
    }
    CudaKernelWriter::new(ir, name, options.deterministic).emit()
}

/// Where an element of a view is read or written in the current loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// One element per thread, at `b{a}`.
    Scalar,
    /// Lane `l` of a vector of neighbouring elements starting at `b{a}`.
    Vector,
}

/// One kernel being emitted. Names of the C++ locals: `n{d}` domain sizes; per argument `a`
/// ([`KernelIr::views`] order) `o{a}` offset, `s{a}_{d}` strides of `Strided` axes, `b{a}` the
/// element index at the current point, `x{a}` a vector of loaded elements; `i{d}`
/// coordinates; `v{id}` SSA values; `y{k}` a vector of elements to store (store `k`);
/// `a{r}` an accumulator (reduction `r`). The parameter block is `p`, with fields `p{a}`
/// (argument pointers), `q{r}` (scratch), `n`, `s`, `o`, `vec`, `lanes`, `split`.
struct CudaKernelWriter<'a> {
    ir: &'a KernelIr,
    name: &'a str,
    deterministic: bool,
    rank: usize,
    inner: usize,
    groups: Vec<Vec<usize>>,
    width: usize,
    /// The per-segment pieces a range-select kernel runs as ([`crate::lower::split`]), found
    /// once for the main body and every reduction pass. A row kernel's pieces read plain
    /// loads from row bases clamped into their ranges (`rows.rs`); the others keep their
    /// range loads' guards.
    split: Option<Split>,
}

impl<'a> CudaKernelWriter<'a> {
    fn new(ir: &'a KernelIr, name: &'a str, deterministic: bool) -> CudaKernelWriter<'a> {
        CudaKernelWriter {
            ir,
            name,
            deterministic,
            rank: ir.rank,
            inner: ir.rank.saturating_sub(1),
            groups: abi::reduction_groups(ir),
            width: abi::vector_width(ir),
            split: if ir.is_row_kernel() {
                crate::lower::split::split(ir)
            } else {
                crate::lower::split::split_guarded(ir)
            },
        }
    }

    fn emit(&self) -> String {
        let mut out = String::new();
        out.push_str(&self.header_comment());
        out.push_str(&self.params_struct());
        if self.ir.is_row_kernel() {
            // The most common path first, for a reader of the `.cu` file.
            for path in abi::row_paths(self.ir).into_iter().rev() {
                let part = abi::row_part(path);
                let bounds = match abi::row_min_blocks(path) {
                    Some(blocks) => format!("FBC_BLOCK, {blocks}"),
                    None => "FBC_BLOCK".to_string(),
                };
                self.entries(&mut out, &part, &self.row_body(path), &bounds);
            }
        } else if self.ir.is_scatter_kernel() {
            self.function(&mut out, "", &self.scatter_body());
        } else if self.ir.reductions.is_empty() {
            self.function(&mut out, "", &self.main_body());
        } else {
            if !self.deterministic {
                self.function(&mut out, "_init", &self.init_body());
            }
            for g in 0..self.groups.len() {
                self.function(&mut out, &format!("_g{g}"), &self.group_body(g));
            }
            self.function(&mut out, "_finish", &self.finish_body());
        }
        out
    }

    /// What the kernel computes, for a reader of the `.cu` file.
    fn header_comment(&self) -> String {
        let ir = self.ir;
        let pattern = |view: &View| {
            let axes: Vec<&str> = view
                .axes
                .iter()
                .map(|a| match a {
                    Axis::Broadcast => "broadcast",
                    Axis::Unit => "unit",
                    Axis::Strided => "strided",
                })
                .collect();
            let mut text = format!("{} [{}]", view.dtype, axes.join(", "));
            if view.is_mapped() {
                let ranks: Vec<String> = view.stages.iter().map(|r| r.to_string()).collect();
                text.push_str(&format!(
                    " through an index map, stages of rank {}",
                    ranks.join(", ")
                ));
            }
            text
        };
        let mut out = format!("/* {}: rank {}", self.name, self.rank);
        if self.deterministic && !ir.reductions.is_empty() {
            out.push_str(", deterministic reductions");
        }
        if ir.is_row_kernel() {
            out.push_str(&format!(
                ", row kernel: {} passes over each row, one block per row",
                ir.passes()
            ));
        }
        out.push('\n');
        for (arg, view) in ir.views().enumerate() {
            let role = match ir.arg(arg) {
                Arg::Load(_) => "load".to_string(),
                Arg::Store(_) => "store".to_string(),
                Arg::Reduction(r) => {
                    let red = &ir.reductions[r];
                    let axes: Vec<String> = (0..self.rank)
                        .filter(|&d| red.reduced[d])
                        .map(|d| d.to_string())
                        .collect();
                    format!("{:?} over axes {{{}}} to", red.kind, axes.join(", ")).to_lowercase()
                }
            };
            out.push_str(&format!("   p{arg}: {role} {}\n", pattern(view)));
        }
        out.push_str("*/\n");
        out
    }

    /// The parameter struct, field for field as [`abi::param_layout`] lays out the bytes.
    fn params_struct(&self) -> String {
        let ir = self.ir;
        let args = ir.arg_count();
        let mut out = format!("struct {}_params {{\n", self.name);
        for (arg, view) in ir.views().enumerate() {
            let constness = if matches!(ir.arg(arg), Arg::Load(_)) {
                "const "
            } else {
                ""
            };
            out.push_str(&format!(
                "    {constness}{} *p{arg};\n",
                Cuda.storage_type(view.dtype)
            ));
        }
        for r in 0..ir.reductions.len() {
            out.push_str(&format!("    {} *q{r};\n", self.acc_type(r)));
        }
        out.push_str(&format!("    long long n[{}];\n", self.rank));
        if args > 0 {
            out.push_str(&format!("    long long s[{args}][{}];\n", self.rank));
            out.push_str(&format!("    long long o[{args}];\n"));
        }
        let map_words = ir.map_word_count();
        if map_words > 0 {
            out.push_str(&format!("    long long m[{map_words}];\n"));
        }
        out.push_str("    long long vec;\n");
        if !self.groups.is_empty() {
            out.push_str(&format!("    long long lanes[{}];\n", self.groups.len()));
            out.push_str(&format!("    long long split[{}];\n", self.groups.len()));
        }
        let words = ir.range_count() + ir.gather_count();
        if words > 0 {
            out.push_str(&format!("    long long r[{}];\n", 2 * words));
        }
        out.push_str("};\n");
        out
    }

    /// A device template over the index type `I` (and its unsigned counterpart `U`) with
    /// `body`, and its two `extern "C"` entry points.
    fn function(&self, out: &mut String, part: &str, body: &Code) {
        self.entries(out, part, body, "FBC_BLOCK");
    }

    /// [`CudaKernelWriter::function`] with the entry points' `__launch_bounds__` arguments `bounds`.
    fn entries(&self, out: &mut String, part: &str, body: &Code, bounds: &str) {
        let name = self.name;
        let params = format!("{name}_params");
        out.push_str("\ntemplate <typename I, typename U>\n");
        out.push_str(&format!(
            "__device__ __forceinline__ void {name}{part}_body(const {params} &p) {{\n"
        ));
        out.push_str(&body.render(1));
        out.push_str("}\n");
        for (wide, i, u) in [
            (false, "int", "unsigned int"),
            (true, "long long", "unsigned long long"),
        ] {
            out.push_str(&format!(
                "extern \"C\" __global__ void __launch_bounds__({bounds}) {}(const {params} p) {{ {name}{part}_body<{i}, {u}>(p); }}\n",
                abi::entry_name(name, part, wide)
            ));
        }
    }

    /// Definitions of sizes, offsets and strides (the unread ones are dropped at render).
    fn preamble(&self, code: &mut Code) {
        for d in 0..self.rank {
            code.def(format!("n{d}"), format!("const I n{d} = (I)p.n[{d}];"));
        }
        for r in 0..self.ir.range_count() {
            code.def(
                format!("rs{r}"),
                format!("const I rs{r} = (I)p.r[{}];", 2 * r),
            );
            code.def(
                format!("re{r}"),
                format!("const I re{r} = (I)p.r[{}];", 2 * r + 1),
            );
        }
        // The gathers' strides and extents follow the ranges.
        let ranges = self.ir.range_count();
        for g in 0..self.ir.gather_count() {
            let at = 2 * (ranges + g);
            code.def(format!("gs{g}"), format!("const I gs{g} = (I)p.r[{at}];"));
            code.def(
                format!("gn{g}"),
                format!("const I gn{g} = (I)p.r[{}];", at + 1),
            );
        }
        for (arg, view) in self.ir.views().enumerate() {
            code.def(
                format!("o{arg}"),
                format!("const I o{arg} = (I)p.o[{arg}];"),
            );
            for (d, axis) in view.axes.iter().enumerate() {
                if *axis == Axis::Strided {
                    code.def(
                        format!("s{arg}_{d}"),
                        format!("const I s{arg}_{d} = (I)p.s[{arg}][{d}];"),
                    );
                }
            }
            self.map_arguments(code, arg);
        }
    }

    /// The stages of argument `arg`'s index map from `p.m` (layout in [`abi`]): per stage `k`
    /// of rank `r`, offset `c{arg}_{k}`, sizes `m{arg}_{k}_{e}`, strides `t{arg}_{k}_{e}` and the
    /// reciprocals `r{arg}_{k}_{e}` of the sizes that [`map_stage_positions`] divides by,
    /// rounded once per thread.
    fn map_arguments(&self, code: &mut Code, arg: usize) {
        let first = self.ir.arg_count() * self.rank;
        for (k, &r) in self.ir.view(arg).stages.iter().enumerate() {
            let w = self.ir.map_word(arg, k) - first;
            code.def(
                format!("c{arg}_{k}"),
                format!("const I c{arg}_{k} = (I)p.m[{w}];"),
            );
            for e in 1..r {
                code.def(
                    format!("m{arg}_{k}_{e}"),
                    format!("const I m{arg}_{k}_{e} = (I)p.m[{}];", w + 1 + e),
                );
            }
            for e in 0..r {
                code.def(
                    format!("t{arg}_{k}_{e}"),
                    format!("const I t{arg}_{k}_{e} = (I)p.m[{}];", w + 1 + r + e),
                );
            }
            for e in 1..r {
                code.def(
                    format!("r{arg}_{k}_{e}"),
                    format!(
                        "const double r{arg}_{k}_{e} = __ddiv_rn(1.0, (double)m{arg}_{k}_{e});"
                    ),
                );
            }
        }
    }

    /// `first` and `step` of a grid-stride loop with one thread per work unit.
    fn thread_loop(&self, code: &mut Code) {
        code.def(
            "first",
            "const U first = (U)blockIdx.x * (U)FBC_BLOCK + (U)threadIdx.x;",
        );
        code.def("step", "const U step = (U)gridDim.x * (U)FBC_BLOCK;");
    }

    /// The product of the sizes of `axes` as `U` (1 for none).
    fn product(&self, axes: &[usize]) -> String {
        if axes.is_empty() {
            "(U)1".to_string()
        } else {
            axes.iter()
                .map(|d| format!("(U)n{d}"))
                .collect::<Vec<_>>()
                .join(" * ")
        }
    }

    /// Coordinates `i{d}` of the axes `axes` (row-major: the last varies fastest) from the
    /// flat index `flat` (an `I` expression), using `rem` as the remainder variable.
    fn decompose(&self, code: &mut Code, flat: &str, axes: &[usize], rem: &str) {
        let Some((&first, rest)) = axes.split_first() else {
            return;
        };
        if rest.is_empty() {
            code.def(format!("i{first}"), format!("const I i{first} = {flat};"));
            return;
        }
        code.def(rem, format!("I {rem} = {flat};"));
        for &d in rest.iter().rev() {
            code.def(format!("i{d}"), format!("const I i{d} = {rem} % n{d};"));
            code.def(rem, format!("{rem} /= n{d};"));
        }
        code.def(format!("i{first}"), format!("const I i{first} = {rem};"));
    }

    /// `coord * stride` of argument `arg` on axis `d`, or `None` if it does not move there.
    fn term(&self, arg: usize, d: usize, coord: &str) -> Option<String> {
        match self.ir.view(arg).axes[d] {
            Axis::Broadcast => None,
            Axis::Unit => Some(coord.to_string()),
            Axis::Strided => Some(format!("{coord} * s{arg}_{d}")),
        }
    }

    /// `b{a}`: the element index of argument `a` at the current point (the first lane's, in
    /// the vector loop), for every load and store.
    fn bases(&self, code: &mut Code) {
        for arg in self.ir.pointwise_args() {
            let index = self.index(arg, &(0..self.rank).collect::<Vec<_>>());
            code.def(format!("b{arg}"), format!("const I b{arg} = {index};"));
        }
    }

    /// `o{a} + Σ i{d} · stride` over `axes`.
    fn index(&self, arg: usize, axes: &[usize]) -> String {
        self.index_at(arg, axes, |d| format!("i{d}"))
    }

    /// `o{a} + Σ coord(d) · stride` over `axes`: [`CudaKernelWriter::index`] at other coordinates.
    fn index_at(&self, arg: usize, axes: &[usize], coord: impl Fn(usize) -> String) -> String {
        let mut index = format!("o{arg}");
        for &d in axes {
            if let Some(t) = self.term(arg, d, &coord(d)) {
                index.push_str(&format!(" + {t}"));
            }
        }
        index
    }

    /// The stored element of argument `arg` read or written at the current point.
    fn element(&self, arg: usize, lane: Lane) -> String {
        match (lane, self.ir.view(arg).axes[self.inner]) {
            (Lane::Vector, Axis::Unit) => format!("x{arg}[l]"),
            _ => format!("p.p{arg}[{}]", self.lane_index(arg, lane)),
        }
    }

    /// The index of argument `arg` at the current point (the position, for an index map),
    /// when it is not a vector register's lane.
    fn lane_index(&self, arg: usize, lane: Lane) -> String {
        let inner = self.inner;
        match (lane, self.ir.view(arg).axes[inner]) {
            (Lane::Vector, Axis::Strided) => format!("b{arg} + (I)l * s{arg}_{inner}"),
            _ => format!("b{arg}"),
        }
    }

    /// Every SSA value at the current point (unread ones are dropped at render). A load
    /// through an index map first defines its positions: `q{id}_0` the strided one, and
    /// `q{id}_{k+1}` the position (finally the element) stage `k` maps `q{id}_k` to, its
    /// coordinates unflattened by [`map_stage_positions`].
    fn values(&self, code: &mut Code, lane: Lane) {
        for id in 0..self.ir.body.len() {
            let definition = match self.ir.body[id] {
                Instr::Load { view } | Instr::RangeLoad { view, .. }
                    if self.ir.loads[view].is_mapped() =>
                {
                    // A range load reads its element only inside its range; the positions
                    // are plain arithmetic, harmless outside it.
                    self.positions(code, view, id, lane);
                    let last = self.ir.loads[view].stages.len();
                    Cuda.definition(self.ir, id, |_| format!("p.p{view}[q{id}_{last}]"))
                }
                Instr::GatherLoad {
                    view,
                    index,
                    gather,
                } => Cuda.definition(self.ir, id, |_| {
                    let at = self.lane_index(view, lane);
                    format!("p.p{view}[{at} + {}]", gather_offset(index, gather))
                }),
                _ => Cuda.definition(self.ir, id, |view| self.element(view, lane)),
            };
            code.def(format!("v{id}"), definition);
        }
    }

    /// The position definitions of load `id` through the index map of load view `arg`.
    fn positions(&self, code: &mut Code, arg: usize, id: usize, lane: Lane) {
        code.def(
            format!("q{id}_0"),
            format!("const I q{id}_0 = {};", self.lane_index(arg, lane)),
        );
        for (name, line) in map_stage_positions(&Cuda, self.ir, arg, id, "I") {
            code.def(name, line);
        }
    }

    /// The condition under which store `k` writes at the current point: the domain index is
    /// 0 on every axis the store is broadcast along. `None` when it always writes.
    fn store_condition(&self, k: usize, lane: Lane) -> Option<String> {
        let view = &self.ir.stores[k].view;
        let parts: Vec<String> = (0..self.rank)
            .filter(|&d| view.axes[d] == Axis::Broadcast)
            .map(|d| {
                if lane == Lane::Vector && d == self.inner {
                    format!("i{d} + (I)l == 0")
                } else {
                    format!("i{d} == 0")
                }
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join(" && "))
    }

    /// The stores at the current point. In the vector loop, stores contiguous along the
    /// innermost axis go to `y{k}[l]`, written out after the loop by [`Self::vector_stores`].
    fn stores(&self, code: &mut Code, lane: Lane) {
        for (k, store) in self.ir.stores.iter().enumerate() {
            let arg = self.ir.store_arg(k);
            let value = Cuda.store(store.view.dtype, &format!("v{}", store.value));
            if lane == Lane::Vector && store.view.axes[self.inner] == Axis::Unit {
                code.def(format!("y{k}"), format!("y{k}[l] = {value};"));
                continue;
            }
            let write = format!("{} = {value};", self.element(arg, lane));
            match self.store_condition(k, lane) {
                Some(cond) => code.stmt(format!("if ({cond}) {write}")),
                None => code.stmt(write),
            }
        }
    }

    /// After the lanes: the 16-byte stores of the stores contiguous along the innermost axis.
    fn vector_stores(&self, code: &mut Code) {
        for (k, store) in self.ir.stores.iter().enumerate() {
            if store.view.axes[self.inner] != Axis::Unit {
                continue;
            }
            let arg = self.ir.store_arg(k);
            let write = format!("fbc_vstore(p.p{arg} + b{arg}, y{k});");
            match self.store_condition(k, Lane::Vector) {
                Some(cond) => code.stmt(format!("if ({cond}) {write}")),
                None => code.stmt(write),
            }
        }
    }

    /// The body of a kernel without reductions: the vector loop (when `p.vec`) and the
    /// scalar loop, both grid-stride over the flattened domain.
    fn main_body(&self) -> Code {
        let mut code = Code::new();
        self.preamble(&mut code);
        self.thread_loop(&mut code);
        let all: Vec<usize> = (0..self.rank).collect();
        code.def("total", format!("const U total = {};", self.product(&all)));
        if self.width > 1 {
            let w = self.width;
            code.open("if (p.vec)");
            code.comment(format!(
                "{w} neighbouring elements of one row per thread; the host checked alignment"
            ));
            code.open(format!("for (U t = first; t < total / (U){w}; t += step)"));
            self.decompose(&mut code, &format!("(I)(t * (U){w})"), &all, "rem");
            self.bases(&mut code);
            for (arg, view) in self.ir.loads.iter().enumerate() {
                if view.axes[self.inner] == Axis::Unit {
                    let ty = Cuda.storage_type(view.dtype);
                    code.def(format!("x{arg}"), format!("{ty} x{arg}[{w}];"));
                    code.def(
                        format!("x{arg}"),
                        format!("fbc_vload(x{arg}, p.p{arg} + b{arg});"),
                    );
                }
            }
            for (k, store) in self.ir.stores.iter().enumerate() {
                if store.view.axes[self.inner] == Axis::Unit {
                    let ty = Cuda.storage_type(store.view.dtype);
                    code.def(format!("y{k}"), format!("{ty} y{k}[{w}];"));
                }
            }
            code.stmt("#pragma unroll");
            code.open(format!("for (int l = 0; l < {w}; ++l)"));
            self.values(&mut code, Lane::Vector);
            self.stores(&mut code, Lane::Vector);
            code.close();
            self.vector_stores(&mut code);
            code.close();
            code.close();
            code.open("else");
        }
        code.open("for (U t = first; t < total; t += step)");
        self.decompose(&mut code, "(I)t", &all, "rem");
        self.bases(&mut code);
        match &self.split {
            Some(split) => self.pieces(&mut code, split),
            None => {
                self.values(&mut code, Lane::Scalar);
                self.stores(&mut code, Lane::Scalar);
            }
        }
        code.close();
        if self.width > 1 {
            code.close();
        }
        code
    }

    /// The body of a scatter kernel ([`crate::lower::ir::Scatter`]): one row per thread,
    /// grid-stride over the rows, each walked in order along the innermost axis, so that no
    /// two threads add into one element and each element's sums happen in the reference's
    /// order: no atomics, and the same bits as the CPU.
    fn scatter_body(&self) -> Code {
        let mut code = Code::new();
        self.preamble(&mut code);
        self.thread_loop(&mut code);
        let inner = self.inner;
        let outer: Vec<usize> = (0..inner).collect();
        code.def("rows", format!("const U rows = {};", self.product(&outer)));
        code.open("for (U t = first; t < rows; t += step)");
        self.decompose(&mut code, "(I)t", &outer, "rem");
        code.open(format!(
            "for (I i{inner} = 0; i{inner} < n{inner}; ++i{inner})"
        ));
        self.bases(&mut code);
        self.values(&mut code, Lane::Scalar);
        for k in 0..self.ir.stores.len() {
            let arg = self.ir.store_arg(k);
            let pointer = format!("p.p{arg}");
            if let Some(statement) = Cuda.scatter_add(self.ir, k, &pointer, &format!("b{arg}")) {
                code.stmt(statement);
            }
        }
        code.close();
        code.close();
        code
    }

    /// A range-select kernel cut into pieces ([`crate::lower::split`]): the thread's element
    /// picks its segment by one comparison chain on the segment ends (the select's own rule:
    /// the first range ending after the coordinate, else the last) and evaluates and stores
    /// only that piece. Coordinates and offsets stay the launch's: a range load's offset
    /// already points its segment's first index at the operand's element 0, and the pieces
    /// keep their range loads' bounds, so a launch whose ranges do not tile the axis reads
    /// what the select would.
    fn pieces(&self, code: &mut Code, split: &Split) {
        self.branch_per_piece(code, split, |inner, branch| {
            inner.values(branch, Lane::Scalar);
            inner.stores(branch, Lane::Scalar);
        });
    }

    /// The comparison chain of [`CudaKernelWriter::pieces`], with `body` writing each piece's branch
    /// (given the piece as a kernel of its own).
    fn branch_per_piece(
        &self,
        code: &mut Code,
        split: &Split,
        mut body: impl FnMut(&CudaKernelWriter, &mut Code),
    ) {
        let c = format!("i{}", split.axis);
        let last = split.pieces.len() - 1;
        for (k, piece) in split.pieces.iter().enumerate() {
            let header = match k {
                0 if last == 0 => "".to_string(),
                0 => format!("if ({c} < re{})", split.ranges[0]),
                k if k == last => "else".to_string(),
                k => format!("else if ({c} < re{})", split.ranges[k]),
            };
            let inner = CudaKernelWriter::new(piece, self.name, self.deterministic);
            let mut branch = Code::new();
            body(&inner, &mut branch);
            code.open(header);
            code.splice(&branch);
            code.close();
        }
    }

    /// The reducing form of [`CudaKernelWriter::pieces`]: the point's piece computes the values group
    /// `g` reduces (and, in group 0's pass, stores the piece's pointwise results) and hands
    /// them out of its branch in variables `w{r}`, whose names it returns in the group's order.
    /// An output reduced along the select's axis gathers points of several pieces
    /// (`lower::split::split_guarded` allows it): each point hands over the value its own
    /// piece computes, which is the value the select would pick, so the choice per point is
    /// right either way.
    fn reduced_pieces(&self, code: &mut Code, split: &Split, g: usize) -> Vec<String> {
        let group = &self.groups[g];
        for &r in group {
            let ty = Cuda.value_type(self.ir.prec(self.ir.reductions[r].value));
            code.def(format!("w{r}"), format!("{ty} w{r};"));
        }
        self.branch_per_piece(code, split, |inner, branch| {
            inner.values(branch, Lane::Scalar);
            if g == 0 {
                inner.stores(branch, Lane::Scalar);
            }
            // Statements, not definitions: the branch is pruned on its own, where nothing
            // reads `w{r}`.
            for &r in group {
                let value = inner.ir.reductions[r].value;
                branch.stmt(format!("w{r} = v{value};"));
            }
        });
        group.iter().map(|&r| format!("w{r}")).collect()
    }

    /// Axes kept and reduced by group `g`.
    fn group_axes(&self, g: usize) -> (Vec<usize>, Vec<usize>) {
        let reduced = &self.ir.reductions[self.groups[g][0]].reduced;
        let kept = (0..self.rank).filter(|&d| !reduced[d]).collect();
        let gone = (0..self.rank).filter(|&d| reduced[d]).collect();
        (kept, gone)
    }

    /// Whether group `g` reduces the innermost axis (threads of an item share an output).
    fn rows(&self, g: usize) -> bool {
        self.ir.reductions[self.groups[g][0]].reduced[self.inner]
    }

    /// Reduction `r`'s accumulator, as the lowering decides it for every backend.
    fn acc(&self, r: usize) -> Accumulator {
        Accumulator::of_reduction(&self.ir.reductions[r])
    }

    fn is_max(&self, r: usize) -> bool {
        self.acc(r).is_max()
    }

    /// Whether reduction `r` accumulates exact integers in `long long` (wrapping) instead
    /// of `double`.
    fn is_int(&self, r: usize) -> bool {
        self.acc(r).is_integer()
    }

    /// The C type of reduction `r`'s accumulators.
    fn acc_type(&self, r: usize) -> &'static str {
        Cuda.value_type(self.acc(r).prec)
    }

    /// The pass of reduction group `g`: items (output `k`, piece `sp`), each walked by
    /// `lanes` threads, combined, and added into the scratch (see the module docs).
    fn group_body(&self, g: usize) -> Code {
        let mut code = Code::new();
        let (kept, gone) = self.group_axes(g);
        let rows = self.rows(g);
        self.preamble(&mut code);
        if rows {
            code.def("lanes", format!("const int lanes = (int)p.lanes[{g}];"));
        } else {
            code.def("lanes", "const int lanes = 1;");
        }
        code.def(
            "step",
            "const U step = (U)gridDim.x * (U)(FBC_BLOCK / lanes);",
        );
        code.def(
            "outputs",
            format!("const U outputs = {};", self.product(&kept)),
        );
        code.def("count", format!("const U count = {};", self.product(&gone)));
        code.def("split", format!("const U split = (U)p.split[{g}];"));
        code.def("piece", "const U piece = (count + split - 1) / split;");
        code.def("items", "const U items = outputs * split;");
        code.def("lane", "const U lane = (U)threadIdx.x % (U)lanes;");
        if rows {
            code.def("smem", "__shared__ double smem[FBC_BLOCK / 32];");
            if self.groups[g].iter().any(|&r| self.is_int(r)) {
                code.def("smemi", "__shared__ long long smemi[FBC_BLOCK / 32];");
            }
        }
        code.open(
            "for (U it = (U)blockIdx.x * (U)(FBC_BLOCK / lanes) + (U)threadIdx.x / (U)lanes; \
             it < items; it += step)",
        );
        if rows {
            code.comment("the lanes of an item share its output: consecutive items, one output");
            code.def("k", "const U k = it / split;");
            code.def("sp", "const U sp = it % split;");
        } else {
            code.comment("neighbouring threads take neighbouring outputs");
            code.def("k", "const U k = it % outputs;");
            code.def("sp", "const U sp = it / outputs;");
        }
        self.decompose(&mut code, "(I)k", &kept, "remk");
        code.def("r0", "const U r0 = fbc_piece_start(sp, piece, count);");
        code.def("r1", "const U r1 = fbc_piece_end(r0, piece, count);");
        for &r in &self.groups[g] {
            code.def(
                format!("a{r}"),
                format!(
                    "{} a{r} = {};",
                    self.acc_type(r),
                    Cuda.identity(&self.acc(r))
                ),
            );
        }
        code.open("for (U e = r0 + lane; e < r1; e += (U)lanes)");
        self.decompose(&mut code, "(I)e", &gone, "rem");
        self.bases(&mut code);
        // The value each reduction of the group takes at this point, by name.
        let reduced: Vec<String> = match &self.split {
            Some(split) => self.reduced_pieces(&mut code, split, g),
            None => {
                self.values(&mut code, Lane::Scalar);
                if g == 0 {
                    self.stores(&mut code, Lane::Scalar);
                }
                self.groups[g]
                    .iter()
                    .map(|&r| format!("v{}", self.ir.reductions[r].value))
                    .collect()
            }
        };
        for (&r, value) in self.groups[g].iter().zip(&reduced) {
            let red = &self.ir.reductions[r];
            let x = match self.ir.prec(red.value) {
                Prec::F32 => format!("(double){value}"),
                Prec::F64 | Prec::I64 => value.clone(),
            };
            let combine = if self.is_max(r) {
                "fbc_max2"
            } else {
                "fbc_sum2"
            };
            code.def(format!("a{r}"), format!("a{r} = {combine}(a{r}, {x});"));
        }
        code.close();
        for &r in &self.groups[g] {
            if rows {
                let max = self.is_max(r);
                let smem = if self.is_int(r) { "smemi" } else { "smem" };
                code.def(
                    format!("a{r}"),
                    format!("a{r} = fbc_group<{max}>(a{r}, lanes, {smem});"),
                );
            }
            let write = match (self.deterministic, self.is_max(r), self.is_int(r)) {
                (true, _, _) => format!("p.q{r}[k * split + sp] = a{r};"),
                (false, false, false) => format!("atomicAdd(p.q{r} + k, a{r});"),
                (false, true, false) => format!("fbc_atomic_max(p.q{r} + k, a{r});"),
                // Integer atomics are exact, and unsigned addition wraps as the sum must.
                (false, false, true) => format!(
                    "atomicAdd((unsigned long long *)(p.q{r} + k), (unsigned long long)a{r});"
                ),
                (false, true, true) => format!("atomicMax(p.q{r} + k, a{r});"),
            };
            code.stmt(format!("if (lane == 0) {write}"));
        }
        code.close();
        code
    }

    /// `_init`: every reduction's scratch slots set to its identity (atomic mode only).
    fn init_body(&self) -> Code {
        let mut code = Code::new();
        self.preamble(&mut code);
        self.thread_loop(&mut code);
        for (g, group) in self.groups.iter().enumerate() {
            let (kept, _) = self.group_axes(g);
            code.def(
                format!("outputs{g}"),
                format!("const U outputs{g} = {};", self.product(&kept)),
            );
            for &r in group {
                code.stmt(format!(
                    "for (U k = first; k < outputs{g}; k += step) p.q{r}[k] = {};",
                    Cuda.identity(&self.acc(r))
                ));
            }
        }
        code
    }

    /// `_finish`: per output of every reduction, its accumulated value (the slot, or the
    /// pieces' partials combined in order), divided by the count for a mean, rounded to the
    /// output dtype and stored at the output's element.
    fn finish_body(&self) -> Code {
        let mut code = Code::new();
        self.preamble(&mut code);
        self.thread_loop(&mut code);
        for (g, group) in self.groups.iter().enumerate() {
            let (kept, gone) = self.group_axes(g);
            code.def(
                format!("outputs{g}"),
                format!("const U outputs{g} = {};", self.product(&kept)),
            );
            code.def(
                format!("count{g}"),
                format!("const U count{g} = {};", self.product(&gone)),
            );
            code.def(
                format!("split{g}"),
                format!("const U split{g} = (U)p.split[{g}];"),
            );
            for &r in group {
                let red = &self.ir.reductions[r];
                let arg = self.ir.reduction_arg(r);
                code.open(format!("for (U k = first; k < outputs{g}; k += step)"));
                self.decompose(&mut code, "(I)k", &kept, "rem");
                if self.deterministic {
                    let combine = if self.is_max(r) {
                        "fbc_max2"
                    } else {
                        "fbc_sum2"
                    };
                    code.def(
                        "a",
                        format!("{} a = {};", self.acc_type(r), Cuda.identity(&self.acc(r))),
                    );
                    code.def(
                        "a",
                        format!(
                            "for (U sp = 0; sp < split{g}; ++sp) a = {combine}(a, p.q{r}[k * split{g} + sp]);"
                        ),
                    );
                } else {
                    code.def("a", format!("{} a = p.q{r}[k];", self.acc_type(r)));
                }
                if red.kind == ReduceKind::Mean {
                    code.def("a", format!("a = __ddiv_rn(a, (double)count{g});"));
                }
                let held = self.acc(r).result_prec();
                let value = Cuda.store(red.view.dtype, &Cuda.round(held, red.view.dtype, "a"));
                code.stmt(format!("p.p{arg}[{}] = {value};", self.index(arg, &kept)));
                code.close();
            }
        }
        code
    }
}

#[cfg(test)]
mod tests {
    /// The prelude spells the reciprocal bound as float literals (CUDA C has no constant from
    /// the IR); they must be the bound the IR decides, [`crate::lower::accumulate::RECIPROCAL_EXPONENTS`],
    /// so that the C and CUDA row kernels replace the same divisors by reciprocals.
    #[test]
    fn the_preludes_reciprocal_bound_is_the_irs() {
        let body = super::PRELUDE
            .split("bool fbc_recip_ok(float b) {")
            .nth(1)
            .expect("the prelude defines fbc_recip_ok");
        let test = body
            .lines()
            .find(|l| l.contains("return m >= "))
            .expect("fbc_recip_ok compares the magnitude");
        let literals: Vec<f32> = test
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter_map(|word| word.strip_suffix('f')?.parse().ok())
            .collect();
        let (lo, hi) = crate::lower::accumulate::RECIPROCAL_EXPONENTS;
        assert_eq!(literals, vec![2f32.powi(lo), 2f32.powi(hi)], "{test}");
    }
}
