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
use super::fission::{LoopStatement, Stages};
use super::{
    CHUNK, COLUMN_PREFETCH_MIN_BYTES, COLUMN_PREFETCH_ROWS, PARALLEL_MIN, TILE_COLUMNS,
    TILE_COLUMNS_ALIASED, TILE_ROWS, vector,
};
use crate::backend::spelling::{Spelling, map_stage_positions};
use crate::lower::ir::{Axis, Instr, KernelIr, Prec, ReduceKind, View};
use crate::lower::split::Split;

mod rows;
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
pub(super) struct Kernel<'a> {
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
    /// For a kernel cut inside its loop nest ([`crate::lower::split::split_in_nest`]): the
    /// select's axis, its launch ranges and each piece's kernel. Every row segment then
    /// evaluates only the pieces its elements lie in (see [`Kernel::segment`]).
    nest_pieces: Option<NestPieces<'a>>,
}

/// The pieces a kernel's row segments choose from, by their coordinates on `axis`.
struct NestPieces<'a> {
    axis: usize,
    ranges: &'a [usize],
    kernels: Vec<Kernel<'a>>,
}

impl<'a> Kernel<'a> {
    pub(super) fn new(ir: &'a KernelIr) -> Self {
        let mut kernel = Kernel {
            ir,
            rank: ir.rank,
            inner: ir.rank - 1,
            body: Vec::new(),
            stages: Stages::plan(ir),
            // A concat read in place picks its operand by coordinate: scalar loops, except
            // in a row kernel reading it along its rows (lane masks, `vector::supports`).
            vector: vector::supports(ir),
            nest_pieces: None,
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
        let mut kernel = Kernel::new(ir);
        kernel.nest_pieces = Some(NestPieces {
            axis: split.axis,
            ranges: &split.ranges,
            kernels: split.pieces.iter().map(Kernel::new).collect(),
        });
        // The preamble defines what the pieces' vector loops read (`fbs`).
        kernel.vector = kernel
            .nest_pieces
            .iter()
            .flat_map(|p| &p.kernels)
            .any(|k| k.vector);
        kernel
    }

    fn store_arg(&self, k: usize) -> usize {
        self.ir.loads.len() + k
    }

    fn reduction_arg(&self, r: usize) -> usize {
        self.ir.loads.len() + self.ir.stores.len() + r
    }

    fn view(&self, arg: usize) -> &View {
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
        let mut out = Out {
            text: String::new(),
            depth: 0,
        };
        out.open(format!(
            "void {name}(const int64_t *sizes, const int64_t *strides, \
             const int64_t *offsets, void *const *ptrs)"
        ));
        self.preamble(&mut out);
        if self.ir.is_row_kernel() {
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
            let ty = C.storage_type(view.dtype);
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
            self.map_arguments(out, arg);
        }
    }

    /// The stages of argument `arg`'s index map, from the words after the strides (layout on
    /// [`crate::lower::ir::Launch`]): per stage `k` of rank `r`, offset `c{arg}_{k}`, sizes
    /// `m{arg}_{k}_{e}` (the outermost is never needed), strides `t{arg}_{k}_{e}`, and the
    /// reciprocals `r{arg}_{k}_{e}` of the sizes that [`Self::positions`] divides by.
    fn map_arguments(&self, out: &mut Out, arg: usize) {
        for (k, &r) in self.view(arg).stages.iter().enumerate() {
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

    /// Folds outer axes into the innermost one at run time, innermost first, while every
    /// view is contiguous across the fold (its stride on the outer axis is its inner stride
    /// times the inner size) or the outer axis has size 1. The fold keeps every view's inner
    /// pattern, so the same vector loop runs over longer rows: a `[N, 1]` or `[N, 8]` domain
    /// of contiguous tensors becomes one long row instead of N tiny ones (whose scalar loop
    /// tails would call scalar libm).
    fn fold_axes(&self, out: &mut Out) {
        // Ranges are coordinates along one axis: folding axes would change them.
        if self.rank < 2 || self.ir.is_row_kernel() || self.ir.has_ranges() {
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
        if self.strided_rows() && self.rank >= 2 {
            // Tiles, as `row_tiles` for reductions: each element is written once, so the
            // walk's order changes nothing else.
            self.tiled_or(
                out,
                "",
                |out| {
                    self.tiles(
                        out,
                        |_| {},
                        |out| self.segment(out, Mode::Pointwise),
                        |_| {},
                    )
                },
                |out| self.chunks(out),
            );
        } else {
            self.chunks(out);
        }
    }

    /// `if (…) { tiled } else { plain }`: the tiled walk while there are at least four tiles
    /// per thread to keep every thread busy (or always, when `also` holds at run time), the
    /// plain one otherwise.
    fn tiled_or(
        &self,
        out: &mut Out,
        also: &str,
        tiled: impl Fn(&mut Out),
        plain: impl Fn(&mut Out),
    ) {
        out.open(format!(
            "if ({also}outer >= {} * (int64_t)nt)",
            4 * TILE_ROWS
        ));
        tiled(out);
        out.close();
        out.open("else");
        plain(out);
        out.close();
    }

    /// Work items of at most [`CHUNK`] elements of one row, spread over the threads.
    fn chunks(&self, out: &mut Out) {
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

    /// Whether reduction `r` has an integer output, and so accumulates exact integers in
    /// `int64_t` (wrapping, through unsigned arithmetic) instead of `double`.
    fn integer(&self, r: usize) -> bool {
        Prec::of(self.ir.reductions[r].view.dtype) == Prec::I64
    }

    /// The C type of reduction `r`'s accumulators.
    fn acc_type(&self, r: usize) -> &'static str {
        if self.integer(r) { "int64_t" } else { "double" }
    }

    fn identity(&self, r: usize) -> &'static str {
        match (self.ir.reductions[r].kind, self.integer(r)) {
            (ReduceKind::Sum | ReduceKind::Mean, false) => "0.0",
            (ReduceKind::Max, false) => "-INFINITY",
            (ReduceKind::Sum | ReduceKind::Mean, true) => "0",
            (ReduceKind::Max, true) => "INT64_MIN",
        }
    }

    /// `acc` combined with `x`, for reduction `r`.
    fn merge(&self, r: usize, acc: &str, x: &str) -> String {
        match (self.ir.reductions[r].kind, self.integer(r)) {
            (ReduceKind::Sum | ReduceKind::Mean, false) => format!("{acc} + {x}"),
            (ReduceKind::Max, false) => format!("fb_maxacc({acc}, {x})"),
            (ReduceKind::Sum | ReduceKind::Mean, true) => {
                format!("(int64_t)((uint64_t){acc} + (uint64_t){x})")
            }
            (ReduceKind::Max, true) => format!("({x} > {acc} ? {x} : {acc})"),
        }
    }

    /// Reduction `r`'s accumulators `q{r}` in the block `block` (of `double`s, which have
    /// the size of `int64_t`s), at element offset `offset`.
    fn accumulators(&self, r: usize, block: &str, offset: &str) -> String {
        if self.integer(r) {
            format!("int64_t *q{r} = (int64_t *)({block} + {offset});")
        } else {
            format!("double *q{r} = {block} + {offset};")
        }
    }

    /// The store of an accumulated result `a` of reduction `r` at index `at` of its output.
    fn finish(&self, out: &mut Out, r: usize, at: &str) {
        let red = &self.ir.reductions[r];
        if red.kind == ReduceKind::Mean {
            out.line(format!("a = a / cnt{r};"));
        }
        let arg = self.reduction_arg(r);
        let held = if self.integer(r) {
            Prec::I64
        } else {
            Prec::F64
        };
        let value = C.store(red.view.dtype, &C.round(held, red.view.dtype, "a"));
        out.line(format!("p{arg}[{at}] = {value};"));
    }

    fn rows(&self, out: &mut Out) {
        if self.strided_rows() {
            // One thread tiles whatever the row count: it has no other thread to keep busy.
            self.tiled_or(
                out,
                "nt == 1 || ",
                |out| self.row_tiles(out),
                |out| self.plain_rows(out),
            );
        } else {
            self.plain_rows(out);
        }
    }

    /// One row per thread at a time, chunk after chunk.
    fn plain_rows(&self, out: &mut Out) {
        out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        out.open("for (int64_t o = 0; o < outer; o++)");
        self.decompose_outer(out, "o");
        for r in 0..self.ir.reductions.len() {
            out.line(format!(
                "{} acc{r} = {};",
                self.acc_type(r),
                self.identity(r)
            ));
        }
        out.open(format!("for (int64_t j0 = 0; j0 < inner; j0 += {CHUNK})"));
        out.line(format!(
            "const int64_t len = inner - j0 < {CHUNK} ? inner - j0 : {CHUNK};"
        ));
        self.segment(out, Mode::Rows);
        out.close();
        self.finish_row(out, |r| format!("acc{r}"));
        out.close();
    }

    /// Each reduction's result of row `o`, from its accumulator `acc(r)`.
    fn finish_row(&self, out: &mut Out, acc: impl Fn(usize) -> String) {
        for r in 0..self.ir.reductions.len() {
            let at = self.row_base(self.reduction_arg(r));
            out.open("");
            out.line(format!("{} a = {};", self.acc_type(r), acc(r)));
            self.finish(out, r, &at);
            out.close();
        }
    }

    /// Whether some load moves along the rows by a run-time stride (a transposed or strided
    /// view): reading one row then touches a new cache line and, past a few KiB of stride, a
    /// new page at every element.
    fn strided_rows(&self) -> bool {
        self.ir
            .loads
            .iter()
            .any(|v| v.axes[self.inner] == Axis::Strided)
    }

    /// [`Kernel::rows`] for kernels that read rows by a stride: each thread takes
    /// [`TILE_ROWS`] rows at a time and walks them together, a step of elements of each in
    /// turn ([`Kernel::tile_columns`]). The rows of a transposed view are neighbouring columns of its buffer, so
    /// the tile's rows share every cache line and page the first of them touches, where row
    /// after row would come back to each line and page once per row, long after it left the
    /// caches and the TLB (a `[4096, 4096]` f32 transposed is 16 KiB between elements: four
    /// pages). Each row keeps its accumulators between its chunks, which it meets in order,
    /// so every row's results are its chunks' results combined in the same order as before,
    /// in chunks of one step.
    fn row_tiles(&self, out: &mut Out) {
        let reductions = self.ir.reductions.len();
        let declare = |out: &mut Out| {
            for r in 0..reductions {
                out.line(format!("{} tile{r}[{TILE_ROWS}];", self.acc_type(r)));
                out.line(format!(
                    "for (int k = 0; k < {TILE_ROWS}; k++) tile{r}[k] = {};",
                    self.identity(r)
                ));
            }
        };
        let accumulate = |out: &mut Out| {
            for r in 0..reductions {
                out.line(format!("{} acc{r} = tile{r}[o - ob];", self.acc_type(r)));
            }
            self.segment(out, Mode::Rows);
            for r in 0..reductions {
                out.line(format!("tile{r}[o - ob] = acc{r};"));
            }
        };
        let store = |out: &mut Out| {
            out.open("for (int64_t o = ob; o < oe; o++)");
            self.decompose_outer(out, "o");
            self.finish_row(out, |r| format!("tile{r}[o - ob]"));
            out.close();
        };
        self.tiles(out, declare, accumulate, store);
    }

    /// The loops of a tiled walk over threads: tiles of [`TILE_ROWS`] rows `ob .. oe`, and in
    /// each, a step of `tc` elements (`j0`, `len`; [`Kernel::tile_columns`]) of each row `o`
    /// in turn. `start` and
    /// `end` write what a tile does before and after its walk, `step` the work at one row's
    /// elements.
    fn tiles(
        &self,
        out: &mut Out,
        start: impl Fn(&mut Out),
        step: impl Fn(&mut Out),
        end: impl Fn(&mut Out),
    ) {
        // The step, once per launch (it depends on the strides only).
        out.line(format!("const int64_t tc = {};", self.tile_columns()));
        out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        out.open(format!(
            "for (int64_t ob = 0; ob < outer; ob += {TILE_ROWS})"
        ));
        out.line(format!(
            "const int64_t oe = outer - ob < {TILE_ROWS} ? outer : ob + {TILE_ROWS};"
        ));
        start(out);
        out.open("for (int64_t j0 = 0; j0 < inner; j0 += tc)");
        out.line("const int64_t len = inner - j0 < tc ? inner - j0 : tc;");
        out.open("for (int64_t o = ob; o < oe; o++)");
        self.decompose_outer(out, "o");
        step(out);
        out.close();
        out.close();
        end(out);
        out.close();
    }

    /// The elements per row of a tile's step, chosen at run time from the strides:
    /// [`TILE_COLUMNS_ALIASED`] when a load reads its rows by a stride that is a multiple of
    /// 4 KiB (its lines then share cache sets), [`TILE_COLUMNS`] otherwise.
    fn tile_columns(&self) -> String {
        let aliased: Vec<String> = self
            .ir
            .loads
            .iter()
            .enumerate()
            .filter(|(_, v)| v.axes[self.inner] == Axis::Strided && !v.is_mapped())
            .map(|(arg, v)| {
                format!(
                    "(s{arg}_{} * {}) % 4096 == 0",
                    self.inner,
                    v.dtype.size_bytes()
                )
            })
            .collect();
        if aliased.is_empty() {
            return TILE_COLUMNS.to_string();
        }
        format!(
            "{} ? {TILE_COLUMNS_ALIASED} : {TILE_COLUMNS}",
            aliased.join(" || ")
        )
    }

    /// The body values computing `reads`, in order: their operands, transitively, stopping at
    /// row reductions (row constants by the time anything reads them).
    fn needed(&self, reads: &[usize]) -> Vec<usize> {
        let mut needed = vec![false; self.ir.body.len()];
        for &x in reads {
            needed[x] = true;
        }
        for id in (0..self.ir.body.len()).rev() {
            if needed[id] && !matches!(self.ir.body[id], Instr::RowReduce { .. }) {
                for x in self.ir.body[id].operands() {
                    needed[x] = true;
                }
            }
        }
        (0..self.ir.body.len()).filter(|&id| needed[id]).collect()
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
            out.line(self.accumulators(r, "acc", &format!("poff{r}")));
        }
        self.init_accumulators(out, true);
        // About four column ranges per thread, in whole cache lines of doubles.
        out.line("int64_t cs = (inner + 4 * (int64_t)nt - 1) / (4 * (int64_t)nt);");
        out.line("cs = (cs + 63) / 64 * 64;");
        out.line(format!(
            "cs = cs < 64 ? 64 : (cs > {CHUNK} ? {CHUNK} : cs);"
        ));
        out.line("const int64_t nch = (inner + cs - 1) / cs;");
        // What the loads read over the domain (an upper bound: a broadcast view reads less).
        let read_per_point: usize = self.ir.loads.iter().map(|v| v.dtype.size_bytes()).sum();
        out.line(format!(
            "const int pf = total * {read_per_point} > {COLUMN_PREFETCH_MIN_BYTES};"
        ));
        out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        out.open("for (int64_t c = 0; c < nch; c++)");
        out.line("const int64_t j0 = c * cs;");
        out.line("const int64_t len = inner - j0 < cs ? inner - j0 : cs;");
        out.open("for (int64_t o = 0; o < outer; o++)");
        self.decompose_outer(out, "o");
        self.segment(out, Mode::Columns);
        out.close();
        out.close();
        self.finalize(out, |r| vec![format!("{} a = q{r}[k];", self.acc_type(r))]);
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
            out.line(self.accumulators(r, "part", &format!("(int64_t)t * ptot + poff{r}")));
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
            let part = if self.integer(r) {
                "((int64_t *)part)"
            } else {
                "part"
            };
            vec![
                format!("{} a = {};", self.acc_type(r), self.identity(r)),
                format!(
                    "for (int u = 0; u < nused; u++) a = {};",
                    self.merge(r, "a", &format!("{part}[(int64_t)u * ptot + poff{r} + k]"))
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
    /// Computes the body in a vector loop, stores, and feeds the reductions per `mode`. A
    /// kernel cut inside its nest does that with the pieces the segment's elements lie in:
    /// along an outer axis the piece its row's coordinate selects (the select's own rule, the
    /// first range ending after it, else the last); along the innermost axis each piece over
    /// the part of `j0 .. j0 + len` inside its range (the ranges tile the axis), as a segment
    /// of its own whose `j0` and `len` shadow the row segment's.
    fn segment(&self, out: &mut Out, mode: Mode) {
        let Some(pieces) = &self.nest_pieces else {
            return self.plain_segment(out, mode);
        };
        if pieces.axis == self.inner {
            for (piece, &r) in pieces.kernels.iter().zip(pieces.ranges) {
                out.open("");
                out.line(format!("const int64_t lo = rs{r} > j0 ? rs{r} : j0;"));
                out.line(format!(
                    "const int64_t hi = re{r} < j0 + len ? re{r} : j0 + len;"
                ));
                out.open("if (hi > lo)");
                out.line("const int64_t j0 = lo;");
                out.line("const int64_t len = hi - lo;");
                piece.segment(out, mode);
                out.close();
                out.close();
            }
            return;
        }
        let last = pieces.kernels.len() - 1;
        let axis = pieces.axis;
        for (k, piece) in pieces.kernels.iter().enumerate() {
            match k {
                _ if last == 0 => out.open(""),
                0 => out.open(format!("if (i{axis} < re{})", pieces.ranges[0])),
                k if k == last => out.open("else"),
                k => out.open(format!("else if (i{axis} < re{})", pieces.ranges[k])),
            }
            piece.segment(out, mode);
            out.close();
        }
    }

    /// [`Kernel::segment`] for a kernel evaluated as written.
    fn plain_segment(&self, out: &mut Out, mode: Mode) {
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
        if mode == Mode::Columns {
            self.prefetch_rows_ahead(out);
        }
        // Stores: rows this segment must not write go to a scratch buffer.
        let mut in_loop = Vec::new();
        let mut after_loop = Vec::new();
        for (k, store) in ir.stores.iter().enumerate() {
            let arg = self.store_arg(k);
            let ty = C.storage_type(store.view.dtype);
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
            let value = C.store(store.view.dtype, &format!("v{}", store.value));
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
                        // The store's value is computed in its own loop (`store_stage`),
                        // so a rounding's operand is there too.
                        vector: self.vector.then(|| vector::store(ir, k, true)),
                    });
                }
            }
        }
        // Reductions, in the last loop.
        let mut clauses = Vec::new();
        let mut merges = Vec::new();
        for (r, red) in ir.reductions.iter().enumerate() {
            let integer = self.integer(r);
            let x = if integer {
                format!("v{}", red.value)
            } else {
                format!("(double)v{}", red.value)
            };
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
                (Accumulate::IntoRow | Accumulate::IntoSlot, kind) if integer => {
                    let dest = if how == Accumulate::IntoRow {
                        format!("acc{r}")
                    } else {
                        format!("q{r}[kb{r}]")
                    };
                    if kind == ReduceKind::Max {
                        out.line(format!("int64_t m{r} = INT64_MIN;"));
                        clauses.push(format!("reduction(max:m{r})"));
                        in_loop.push(accumulate(format!("m{r} = {x} > m{r} ? {x} : m{r};")));
                    } else {
                        // Unsigned, so that the simd partial sums wrap instead of overflowing.
                        out.line(format!("uint64_t s{r} = 0;"));
                        clauses.push(format!("reduction(+:s{r})"));
                        in_loop.push(accumulate(format!("s{r} += (uint64_t){x};")));
                    }
                    let m = if kind == ReduceKind::Max {
                        format!("m{r}")
                    } else {
                        format!("(int64_t)s{r}")
                    };
                    merges.push(format!("{dest} = {};", self.merge(r, &dest, &m)));
                }
                (Accumulate::Column, _) if integer => {
                    let slot = format!("q{r}[kb{r} + j]");
                    in_loop.push(accumulate(format!(
                        "{slot} = {};",
                        self.merge(r, &slot, &x)
                    )))
                }
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
                (Accumulate::Column, kind) => {
                    let text = if kind == ReduceKind::Max {
                        format!("q{r}[kb{r} + j] = fb_maxacc(q{r}[kb{r} + j], {x});")
                    } else {
                        format!("q{r}[kb{r} + j] += {x};")
                    };
                    in_loop.push(LoopStatement {
                        vector: self.vector.then(|| vector::column_accumulation(ir, r)),
                        ..accumulate(text)
                    })
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

    /// In the column walk, where a thread reads a narrow strip of every row in turn, a hint
    /// to fetch the strip [`COLUMN_PREFETCH_ROWS`] rows further on for every load that moves
    /// along the rows, in launches whose loads read more than [`COLUMN_PREFETCH_MIN_BYTES`]
    /// (`pf`, set by [`Kernel::columns`]). Each strip starts a new page, where the hardware
    /// prefetchers stop, so without the hint every strip waits for memory once the body is long
    /// enough to keep the core from reaching the next rows' loads early (a `tanh` before the
    /// sum). Smaller launches mostly find their rows in the cache, where the hints only cost
    /// instructions. A hint never faults, so a row past the end needs no test; the address is
    /// formed as an integer.
    fn prefetch_rows_ahead(&self, out: &mut Out) {
        if self.inner == 0 {
            return;
        }
        let row_axis = self.inner - 1;
        // Only the views the body reads: a piece keeps every view of its kernel in the
        // argument list, its other segments' included.
        let read = self.ir.loads_met(&vec![true; self.ir.body.len()]);
        for (arg, view) in self.ir.loads.iter().enumerate() {
            if view.is_mapped() || view.axes[self.inner] != Axis::Unit || !read[arg] {
                continue;
            }
            let Some(step) = self.stride(arg, row_axis) else {
                continue;
            };
            let size = view.dtype.size_bytes();
            out.line(format!(
                "if (pf) for (int64_t l = 0; l < len; l += {}) __builtin_prefetch((const void *)((uintptr_t)(p{arg} + b{arg} + l) + (uintptr_t)({COLUMN_PREFETCH_ROWS} * {step} * {size})));",
                64 / size
            ));
        }
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
