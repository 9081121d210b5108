//! The loop nests of one kernel: the C function for a [`KernelIr`], from its argument
//! unpacking to the vector loops over each segment of a row.
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
//! # Row kernels
//!
//! A row kernel ([`crate::lower::ir`]) gives each thread whole rows and makes one loop per
//! pass over each row; its loop nest, and what keeps it near the memory floor, is in [`rows`].
//!
//! # Stores smaller than the domain
//!
//! A store whose view is `Broadcast` on some axis is written only where the domain index on
//! that axis is 0, so each element is written exactly once. On an outer axis the whole row is
//! redirected to a stack scratch buffer (keeping the vector loop free of branches); on the
//! innermost axis the vector loop does not store it at all, and the element at index 0 is
//! recomputed and stored in scalar code after the loop.

use super::expr::C;
use super::fission::Stages;
use super::{CHUNK, PARALLEL_MIN, vector};
use crate::backend::spelling::{Spelling, gather_offset, map_stage_positions};
use crate::lower::fold;
use crate::lower::ir::{Arg, Axis, Instr, KernelIr};
use crate::lower::split::Split;

mod accumulators;
mod columns;
mod partials;
mod pointwise;
mod reduce_rows;
mod rows;
mod segments;
pub use rows::ROW_SCRATCH_BYTES;
pub(super) use rows::row_exps;

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

    /// The opened body of C function `name` with the kernel ABI
    /// ([`crate::lower::ir::Launch`]).
    fn function(name: &str) -> Out {
        let mut out = Out {
            text: String::new(),
            depth: 0,
        };
        out.open(format!(
            "void {name}(const int64_t *sizes, const int64_t *strides, \
             const int64_t *offsets, void *const *ptrs)"
        ));
        out
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
pub(super) struct CKernelWriter<'a> {
    ir: &'a KernelIr,
    rank: usize,
    /// The innermost axis, `rank - 1`.
    inner: usize,
    /// C statements computing every `v{id}` at the current `j`.
    body: Vec<String>,
    /// Per value, whether it is a row gather ([`KernelIr::row_gathers`]), whose row's base
    /// the row kernel computes once.
    row_gathers: Vec<bool>,
    /// How the body is split into consecutive vector loops.
    stages: Stages,
    /// Whether each loop starts with explicit AVX-512 vectors ([`vector`]).
    vector: bool,
    /// For a kernel cut inside its loop nest ([`crate::lower::split::split_in_nest`]): the
    /// select's axis, its launch ranges and each piece's kernel. Every row segment then
    /// evaluates only the pieces its elements lie in (see [`CKernelWriter::segment`]).
    nest_pieces: Option<NestPieces<'a>>,
    /// Whether this is the form a GEMM runs on each tile of its product ([`Self::for_tiles`]):
    /// one thread, and each reduction's results merged, unrounded, into accumulators at the
    /// result's place instead of stored.
    slots: bool,
}

/// The pieces a kernel's row segments choose from, by their coordinates on `axis`.
struct NestPieces<'a> {
    axis: usize,
    ranges: &'a [usize],
    kernels: Vec<CKernelWriter<'a>>,
}

impl<'a> CKernelWriter<'a> {
    pub(super) fn new(ir: &'a KernelIr) -> Self {
        let mut kernel = CKernelWriter {
            ir,
            rank: ir.rank,
            inner: ir.rank - 1,
            body: Vec::new(),
            row_gathers: ir.row_gathers(),
            stages: Stages::plan(ir),
            // A concat read in place picks its operand by coordinate: scalar loops, except
            // in a row kernel reading it along its rows (lane masks, `vector::supports`).
            vector: vector::supports(ir),
            nest_pieces: None,
            slots: false,
        };
        kernel.body = kernel.body_lines();
        if ir.is_row_kernel() {
            kernel.multiply_by_reciprocals();
        }
        kernel
    }

    /// The kernel of `ir` whose row segments each evaluate only their pieces of `split`
    /// (made by [`crate::lower::split::split_in_nest`] from `ir`). Its loads are plain loads
    /// at the launch's offsets, right only when the launch's ranges tile the axis: the
    /// caller checks that first (`split::nest_wrapper`). The loop nest, accumulators and
    /// stores are `ir`'s. Along an outer axis every output is accumulated in the order the
    /// clamped form accumulates it, from the same values; along the innermost one a row
    /// segment's loop is cut where the segments meet, which may group a row sum's lanes
    /// differently.
    pub(super) fn in_nest(ir: &'a KernelIr, split: &'a Split) -> Self {
        let mut kernel = CKernelWriter::new(ir);
        kernel.nest_pieces = Some(NestPieces {
            axis: split.axis,
            ranges: &split.ranges,
            kernels: split.pieces.iter().map(CKernelWriter::new).collect(),
        });
        // The preamble defines what the pieces' vector loops read (`fbs`).
        kernel.vector = kernel
            .nest_pieces
            .iter()
            .flat_map(|p| &p.kernels)
            .any(|k| k.vector);
        kernel
    }

    /// The form of `ir` (an epilogue ending in reductions, see [`crate::lower::Epilogue`])
    /// that a GEMM runs on each finished tile of its product. It runs on the GEMM's thread
    /// that made the tile, so it starts no threads. Each reduction's pointer is a block of
    /// accumulators (`double`, or `int64_t` for integers) laid out as the result's buffer,
    /// one block per tile sharing the result's elements (the caller chooses which); the tile's
    /// part of each result is merged into the accumulator at the result's place, neither
    /// divided (a mean) nor rounded: [`Self::emit_finish`] does both once every tile is in.
    pub(super) fn for_tiles(ir: &'a KernelIr) -> Self {
        let mut kernel = CKernelWriter::new(ir);
        kernel.slots = true;
        kernel
    }

    /// The multiplier of coordinate `d` in argument `arg`'s index, if it moves on `d`.
    fn stride(&self, arg: usize, d: usize) -> Option<String> {
        match self.ir.view(arg).axes[d] {
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
        self.base_at(arg, "i")
    }

    /// `o{arg}` plus argument `arg`'s terms for the outer coordinates `{coord}{d}`: its index
    /// at the start of the row they name.
    fn base_at(&self, arg: usize, coord: &str) -> String {
        let mut base = format!("o{arg}");
        for d in 0..self.inner {
            if let Some(t) = self.term(arg, d, &format!("{coord}{d}")) {
                base.push_str(&format!(" + {t}"));
            }
        }
        base
    }

    /// The element of argument `arg` at inner index `j` of the current segment.
    fn element(&self, arg: usize) -> String {
        format!("p{arg}[{}]", self.index(arg))
    }

    /// The index of argument `arg` at inner index `j` of the current segment (the position,
    /// for an index map).
    fn index(&self, arg: usize) -> String {
        match self.term(arg, self.inner, "j") {
            Some(t) => format!("b{arg} + {t}"),
            None => format!("b{arg}"),
        }
    }

    fn value_type(&self, id: usize) -> &'static str {
        C.value_type(self.ir.prec(id))
    }

    /// The statement defining each `v{id}` at the current `j`. A load through an index map
    /// is preceded, on the same line, by the positions it goes through: `q{id}_0` is the
    /// strided position, and `q{id}_{k+1}` the position (finally the element) stage `k` maps
    /// `q{id}_k` to.
    fn body_lines(&self) -> Vec<String> {
        (0..self.ir.body.len())
            .map(|id| match self.ir.body[id] {
                // Its row's base already moved to the gathered row (`row_gather_bases`).
                Instr::GatherLoad { view, .. } if self.row_gathers[id] => {
                    C.row_gather_definition(self.ir, id, &self.element(view))
                }
                Instr::Load { view } if self.ir.loads[view].is_mapped() => {
                    let stages = self.ir.loads[view].stages.len();
                    // The element is below 2^31 (`Program::check_bounds` keeps every buffer
                    // within `eval::MAX_ELEMENTS`, see `lower::MAX_ELEMENT_INDEX`), and GCC gathers
                    // 4-byte values only through 32-bit indices: as an `int32_t` index the loop
                    // vectorizes.
                    let element = format!("p{view}[(int32_t)q{id}_{stages}]");
                    let definition = C.definition(self.ir, id, |_| element.clone());
                    format!("{} {definition}", self.positions(view, id))
                }
                Instr::RangeLoad { view, axis, range } => self.range_load(id, view, axis, range),
                Instr::GatherLoad {
                    view,
                    index,
                    gather,
                } => C.definition(self.ir, id, |_| {
                    format!(
                        "p{view}[{} + {}]",
                        self.index(view),
                        gather_offset(index, gather)
                    )
                }),
                _ => C.definition(self.ir, id, |view| self.element(view)),
            })
            .collect()
    }

    /// The statements computing the positions of load `id` through the index map of load view
    /// `arg` (see [`Self::body_lines`]), on one line: the shared spelling
    /// ([`map_stage_positions`], exact division by rounded reciprocals), whose multiply, conversions
    /// and correction vectorize (AVX-512 converts doubles to 64-bit integers), so the loop reading
    /// the map is a vector loop with a gather.
    fn positions(&self, arg: usize, id: usize) -> String {
        self.positions_from(arg, id, &self.index(arg))
    }

    /// [`Self::positions`] from a given first position `first` (a range load's clamped index).
    fn positions_from(&self, arg: usize, id: usize, first: &str) -> String {
        let mut text = format!("const int64_t q{id}_0 = {first};");
        for (_, line) in map_stage_positions(&C, self.ir, arg, id, "int64_t") {
            text.push(' ');
            text.push_str(&line);
        }
        text
    }

    /// A range load as the C loops spell it: the element at the point's coordinate on `axis`
    /// clamped into the range, read unconditionally. Inside the range that is the element the
    /// IR means; outside it is some element of the same segment, always in bounds
    /// (`check_bounds` checks each range-loaded view over its range), which no select picks.
    /// A load without a branch keeps the loop vectorizable (the clamped index is a gather or,
    /// on an outer axis, a row constant), so the segments' math runs through vector libm
    /// instead of scalar calls.
    fn range_load(&self, id: usize, view: usize, axis: usize, range: usize) -> String {
        let dtype = self.ir.loads[view].dtype;
        let (coord, shift) = if axis == self.inner {
            ("(j0 + j)".to_string(), "j0".to_string())
        } else {
            (format!("i{axis}"), format!("i{axis}"))
        };
        let clamped = format!("fb_clamp_index({coord}, rs{range}, re{range})");
        let mut index = format!("b{view}");
        if let Some(t) = self.term(view, axis, &format!("({clamped} - {shift})")) {
            index.push_str(&format!(" + {t}"));
        }
        if axis != self.inner
            && let Some(t) = self.term(view, self.inner, "j")
        {
            index.push_str(&format!(" + {t}"));
        }
        if !self.ir.loads[view].is_mapped() {
            return format!(
                "const {} v{id} = {};",
                self.value_type(id),
                C.load(dtype, &format!("p{view}[{index}]"))
            );
        }
        // Through an index map the clamped index is a position: the stages map it on.
        let text = self.positions_from(view, id, &index);
        let stages = self.ir.loads[view].stages.len();
        format!(
            "{text} const {} v{id} = {};",
            self.value_type(id),
            C.load(dtype, &format!("p{view}[(int32_t)q{id}_{stages}]"))
        )
    }

    /// The C function `name`.
    pub(super) fn emit(&self, name: &str) -> String {
        let mut out = Out::function(name);
        self.preamble(&mut out);
        if self.ir.is_scatter_kernel() {
            self.scatter(&mut out);
        } else if self.ir.is_row_kernel() {
            self.row_kernel(&mut out);
        } else if self.ir.reductions.is_empty() {
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
        // The ranges of concats read in place follow the sizes.
        for r in 0..self.ir.range_count() {
            let at = self.rank + 2 * r;
            out.line(format!("const int64_t rs{r} = sizes[{at}];"));
            out.line(format!("const int64_t re{r} = sizes[{}];", at + 1));
        }
        // The gathers' strides and extents follow the ranges.
        for g in 0..self.ir.gather_count() {
            let at = self.rank + 2 * (self.ir.range_count() + g);
            out.line(format!("const int64_t gs{g} = sizes[{at}];"));
            out.line(format!("const int64_t gn{g} = sizes[{}];", at + 1));
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
        if self.slots {
            out.line("const int nt = 1;");
        } else {
            out.line(format!(
                "const int nt = total > {PARALLEL_MIN} ? omp_get_max_threads() : 1;"
            ));
        }
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
        for arg in 0..self.ir.arg_count() {
            self.argument(out, arg);
            self.map_arguments(out, arg);
        }
    }

    /// Argument `arg`'s pointer, offset and run-time strides. A reduction's pointer in the
    /// form run per tile points at accumulators ([`Self::for_tiles`]).
    fn argument(&self, out: &mut Out, arg: usize) {
        let view = self.ir.view(arg);
        let ty = match self.ir.arg(arg) {
            Arg::Reduction(r) if self.slots => self.acc_type(r),
            _ => C.storage_type(view.dtype),
        };
        let constness = if matches!(self.ir.arg(arg), Arg::Load(_)) {
            "const "
        } else {
            ""
        };
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

    /// The function `name` that finishes the reductions of [`Self::for_tiles`]'s form once a
    /// GEMM has run it on every tile: over the whole domain (`sizes`, and the results'
    /// strides and offsets as the kernel's launch has them), each result is its accumulators
    /// merged in block order, divided for a mean, rounded once and stored. Reduction `r`'s
    /// blocks are `ptrs[args + r]` (`args` the kernel's argument count): `sizes[rank + 2r]`
    /// blocks of `sizes[rank + 2r + 1]` accumulators each.
    pub(super) fn emit_finish(&self, name: &str) -> String {
        let mut out = Out::function(name);
        for d in 0..self.rank {
            out.line(format!("const int64_t n{d} = sizes[{d}];"));
        }
        for r in 0..self.ir.reductions.len() {
            self.argument(&mut out, self.ir.reduction_arg(r));
        }
        out.line("const int nt = omp_get_max_threads();");
        self.reduction_preamble(&mut out);
        let args = self.ir.arg_count();
        for r in 0..self.ir.reductions.len() {
            let ty = self.acc_type(r);
            let at = self.rank + 2 * r;
            out.line(format!("const int64_t nb{r} = sizes[{at}];"));
            out.line(format!("const int64_t bl{r} = sizes[{}];", at + 1));
            out.line(format!(
                "const {ty} *h{r} = (const {ty} *)ptrs[{}];",
                args + r
            ));
        }
        let identity = |r: usize| vec![format!("{} a = {};", self.acc_type(r), self.identity(r))];
        self.finalize_at(&mut out, identity, |r| {
            vec![format!(
                "for (int64_t u = 0; u < nb{r}; u++) a = {};",
                self.merge(r, "a", &format!("h{r}[u * bl{r} + at]"))
            )]
        });
        out.close();
        out.text
    }

    /// The stages of argument `arg`'s index map, from the words after the strides (layout on
    /// [`crate::lower::ir::Launch`]): per stage `k` of rank `r`, offset `c{arg}_{k}`, sizes
    /// `m{arg}_{k}_{e}` (the outermost is never needed), strides `t{arg}_{k}_{e}`, and the
    /// reciprocals `r{arg}_{k}_{e}` of the sizes that [`Self::positions`] divides by.
    fn map_arguments(&self, out: &mut Out, arg: usize) {
        for (k, &r) in self.ir.view(arg).stages.iter().enumerate() {
            let w = self.ir.map_word(arg, k);
            out.line(format!("const int64_t c{arg}_{k} = strides[{w}];"));
            for e in 1..r {
                out.line(format!(
                    "const int64_t m{arg}_{k}_{e} = strides[{}];",
                    w + 1 + e
                ));
            }
            for e in 0..r {
                out.line(format!(
                    "const int64_t t{arg}_{k}_{e} = strides[{}];",
                    w + 1 + r + e
                ));
            }
            for e in 1..r {
                out.line(format!(
                    "const double r{arg}_{k}_{e} = 1.0 / (double)m{arg}_{k}_{e};"
                ));
            }
        }
    }

    /// Folds outer axes into the innermost one at run time by the rule of
    /// [`crate::lower::fold`], innermost first: the same vector loop then runs over longer
    /// rows, so a `[N, 1]` or `[N, 8]` domain of contiguous tensors becomes one long row
    /// instead of N tiny ones (whose scalar loop tails would call scalar libm).
    fn fold_axes(&self, out: &mut Out) {
        if !fold::may_fold(self.ir) {
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

    /// The C condition under which outer axis `d` folds into the (already folded) inner axis:
    /// [`fold::fold_conditions`] spelled over the launch's strides and sizes.
    fn fold_condition(&self, d: usize) -> String {
        let Some(conditions) = fold::fold_conditions(self.ir, d) else {
            return "0".to_string();
        };
        if conditions.is_empty() {
            return "1".to_string();
        }
        let (inner, n) = (self.inner, format!("n{}", self.inner));
        let spelled: Vec<String> = conditions
            .iter()
            .map(|c| {
                let arg = c.arg;
                let outer = match c.outer {
                    Axis::Unit => "1".to_string(),
                    _ => format!("s{arg}_{d}"),
                };
                let step = match c.inner {
                    Axis::Unit => n.clone(),
                    Axis::Broadcast => "0".to_string(),
                    Axis::Strided => format!("s{arg}_{inner} * {n}"),
                };
                format!("{outer} == {step}")
            })
            .collect();
        format!("({})", spelled.join(" && "))
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

    /// A scatter kernel's loops ([`crate::lower::ir::Scatter`]): each thread owns a block of
    /// whole rows, since the points of one row may add into one element, and walks the rows'
    /// points in order, one index `j` at a time across its block: the updates of neighbouring
    /// rows (an embedding gradient's row of `D` values) are neighbours in memory, where walking
    /// each row to its end would stride through them.
    fn scatter(&self, out: &mut Out) {
        out.line("const int64_t per = (outer + nt - 1) / nt;");
        out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        out.open("for (int64_t t = 0; t < nt; t++)");
        out.line("const int64_t lo = t * per;");
        out.line("const int64_t hi = outer - lo < per ? outer : lo + per;");
        out.open("for (int64_t j = 0; j < inner; j++)");
        out.open("for (int64_t o = lo; o < hi; o++)");
        self.decompose_outer(out, "o");
        for arg in 0..self.ir.arg_count() {
            out.line(format!("const int64_t b{arg} = {};", self.row_base(arg)));
        }
        for line in &self.body {
            out.line(line);
        }
        for k in 0..self.ir.stores.len() {
            let arg = self.ir.store_arg(k);
            let pointer = format!("p{arg}");
            if let Some(line) = C.scatter_add(self.ir, k, &pointer, &self.index(arg)) {
                out.line(line);
            }
        }
        out.close();
        out.close();
        out.close();
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
}
