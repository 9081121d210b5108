//! The loop nest of a row kernel ([`crate::lower::ir`]'s execution model): rows over threads,
//! one loop per pass over each row.
//!
//! Each thread owns whole rows (`#pragma omp for schedule(static)`, so a thread's rows are
//! consecutive). For each row, pass `p` evaluates the values it needs, accumulates the row
//! reductions of level `p + 1` and, after the loop, rounds each result once to its dtype as
//! `r{id}`, a row constant for the later passes. The last pass stores; a store with one element
//! per row is written after it, at inner index 0, from the row's results (so an empty row still
//! gets its sum of 0). The axes are never folded: folding would merge rows.
//!
//! A softmax row is read from memory once, by its first pass; every later pass finds it in
//! cache. What the kernel costs beyond the memory floor is therefore the arithmetic of its
//! passes, and three things here keep that small:
//!
//! - **Each value once.** A value a later pass needs that an earlier pass already computed,
//!   and that costs more to recompute than to reload (its expression holds a function call or
//!   a division — softmax's `exp`, the `erf` of a gelu under a layernorm), is *carried*
//!   ([`KernelIr::row_kept`]): the first pass that computes it also writes it to a per-thread
//!   row scratch buffer `c{id}`, and every later pass that needs it reads it back instead of
//!   evaluating it again. The value is the same bits either way, so results do not change. The
//!   scratch is allocated once per thread and launch, only while a row of carried values fits
//!   in [`ROW_SCRATCH_BYTES`] (beyond that it would not stay in cache, and re-reading it would
//!   cost what it saves); with longer rows, or if the allocation fails, the passes recompute.
//! - **Explicit vectors.** When the kernel is in the subset [`vector`] can write (f32 values,
//!   f32/f16/bf16 contiguous or broadcast views, f32 row reductions), each pass first runs over
//!   whole vectors of 16 with AVX-512 intrinsics — the same operations as the scalar `omp simd`
//!   loop, which then finishes the row's remainder (and is all that runs without AVX-512). A
//!   maximum compares `v > m` lane-wise exactly as the scalar loop does, with NaN recorded in a
//!   mask.
//! - **Sums in f32 blocks.** A float sum adds each lane's values in f32 over a block of
//!   [`SUM_BLOCK`] elements, then converts the block's 16 lanes to `double` and adds them to two
//!   vectors of 8 `double`s, so the per-element cost is one f32 addition instead of two
//!   conversions and two f64 additions. A block whose f32 lanes are not all finite is added
//!   again in f64, so a sum is ±Inf or NaN exactly when the f64 sum is. This is one of the two
//!   freedoms the IR grants row kernels ([`crate::lower::ir`], "Precision of row kernels"),
//!   with the bound stated there; the scalar loop still adds in f64.
//! - **One division per row.** An f32 division by a row constant derived from row reductions
//!   (softmax's `e / s`) is a multiplication by the reciprocal, computed once per row where it
//!   is a normal float ([`KernelIr::row_constant_divisors`]), the other freedom: a multiplication instead
//!   of a division per element, in the vector and the scalar loops alike.
//!
//! Both freedoms are taken only under `RowArithmetic::Relaxed` (fusion.ron's
//! `row_arithmetic`, carried by the kernel IR). Under `Exact` the vector loops widen every
//! vector of a sum into the f64 accumulators and every division divides, so a row's sums
//! are the f64 sums (up to the order of f64 additions) rounded once, and each quotient is
//! correctly rounded, as in the reference evaluator.
//! - **Memory in the background.** While a thread works on a row in cache (its second pass),
//!   it prefetches the next row of every input that moves from row to row into L2, one cache
//!   line per vector, so the next first pass finds its data arriving instead of stalling on it
//!   (while a row of those inputs fits in [`ROW_SCRATCH_BYTES`], so that it stays in cache
//!   beside the current one). A lagged last pass (below) writes large launches with streaming
//!   stores ([`vector`]'s `fbv_store`): the output lines are written whole, without first
//!   being read. A last pass in place stores normally (see `CKernelWriter::destinations`).
//! - **Concats along the rows.** A row kernel reading a concat along its rows
//!   ([`KernelIr::selects_along_rows`]) evaluates every operand at each element and selects,
//!   in the scalar loops through clamped loads; in the vector loops a vector lying inside one
//!   segment takes a step with that segment's operand alone ([`CKernelWriter::segment_steps`]).
//! - **Stores under the arithmetic.** Where the last pass only stores what the scratch row and
//!   the row constants give it (softmax), it runs one row late, inside the next row's second
//!   pass ([`Lag`]), so that the output's memory traffic overlaps the `exp`s instead of
//!   following them. A pass that only takes maxima keeps [`MAX_CHAINS`] accumulators.

use super::{CKernelWriter, Out};
use crate::backend::cpu::emit::expr::C;
use crate::backend::cpu::emit::expr::only_added_to_constants;
use crate::backend::cpu::emit::vector;
use crate::backend::spelling::{Spelling, gather_in_range, gather_offset_of};
use crate::formula::Func;
use crate::lower::accumulate::{Accumulator, F32_PARTIAL_TERMS, RECIPROCAL_EXPONENTS};
use crate::lower::ir::{Axis, Instr, KernelIr, Prec, ReduceKind, RowArithmetic, RowKept};
use crate::lower::row_plan::RowPass;

mod avx512;
mod lag;

/// The most bytes of carried values one row may need for the kernel to carry them (see the
/// module documentation): 512 KiB, a quarter of this machine's 2 MiB L2 per core, so that the
/// scratch row, the input row and the next row being prefetched stay in L2 together. Softmax
/// carries one f32 per element, so rows of up to 131,072 floats carry.
pub const ROW_SCRATCH_BYTES: usize = 512 << 10;

/// Accumulators per maximum in a pass that only takes maxima: a vector maximum waits about
/// four cycles for the previous one, so one chain would hold the loop to a vector per four
/// cycles where the loads allow two per cycle.
pub const MAX_CHAINS: usize = 4;

/// Elements of a row per block of a float sum's f32 partial sums (see the module
/// documentation): 16 vectors, so each lane adds 16 values in f32 before the block's lanes
/// join the row's f64 total. The f32 part of the error bound grows with this (15 roundings of
/// at most 2⁻²⁴ each), the cost of the f64 conversions shrinks with it.
pub const SUM_BLOCK: usize = F32_PARTIAL_TERMS * vector::LANES;

/// The loop over one row in one pass, once the row scratch question is settled.
struct Loop<'p> {
    pass: &'p RowPass,
    /// Values evaluated at each element, in order.
    needed: Vec<usize>,
    /// Values read back from the row scratch instead of evaluated.
    stop: Vec<bool>,
    /// Values this loop writes to the row scratch.
    saves: Vec<usize>,
}

/// A last pass that runs one row late. A row's last pass only streams its stores out (it
/// reads carried values and row constants, nothing from memory), and the pass before it only
/// computes (its inputs are in cache), so run one after the other the store traffic and the
/// arithmetic never overlap. With a lag, the last pass of row `o` hands its row constants and
/// scratch row over to the thread's next row, whose pass before the last stores one vector of
/// the pending row per vector step of its own; the thread's last pending row is stored after
/// its rows. Each thread then needs two scratch rows, used in turn, or one where the pass
/// before the last saves every carried value the last pass reads ([`Lag::shared`]). The
/// outputs are the same bits, written later; a kernel's stores never alias its loads (the
/// memory plan, `runtime::memory`, never gives a value the slot of something the step writing
/// it reads), so no row reads what a pending row has yet to write.
struct Lag {
    /// The last pass.
    pass: RowPass,
    /// The carried values and their saving passes.
    carried: Vec<RowKept>,
    /// The C type and name of each row-dependent name the last pass reads: its row
    /// constants `r{id}`, reciprocals `rc{id}`/`rk{id}`, store bases `b{arg}` and guards
    /// `ok{k}`. The pending row keeps them as `l_{name}`.
    names: Vec<(&'static str, String)>,
    /// Whether the pending row and the current one share one scratch row: every carried
    /// value the last pass reads is saved by the pass that stores the pending row, whose step
    /// at `j` reads the pending row's vector at `j` before it saves the current row's there
    /// (and whose scalar tail follows the pending row's). Softmax's `exp(x - max)` is such a
    /// value. One saved by an earlier pass would overwrite the pending row before it is
    /// stored, so such a kernel keeps two rows (values the last pass does not read are never
    /// the pending row's). Sharing takes 16 KiB of a `[.., 4096]` f32 softmax's 48 KiB off
    /// the L1 cache (32 KiB on the Xeon measured), whose misses to L2 compete with the next
    /// row's prefetches for the same fill buffers: 1.14–1.15× of a streaming copy against
    /// 1.19–1.20× with two rows, alternated in one process (book: performance chapter).
    shared: bool,
}

impl CKernelWriter<'_> {
    /// A row kernel: rows over threads, one loop per pass over each row (see the module
    /// documentation).
    pub(super) fn row_kernel(&self, out: &mut Out) {
        let carried = self.ir.row_kept();
        let carrying = !carried.is_empty();
        let lag = self.lag(&carried);
        // A lagging kernel's threads keep two scratch rows, unless they share one.
        let two_rows = lag.as_ref().is_some_and(|lag| !lag.shared);
        let rows = if two_rows { 2 } else { 1 };
        if carrying {
            // Bytes of carried values per element, and whether a row of them fits.
            let bytes: Vec<String> = carried
                .iter()
                .map(|k| format!("sizeof({})", self.value_type(k.value)))
                .collect();
            // (A row past the limit is not padded, so no product below can overflow.)
            out.line(format!(
                "const int64_t rpad = inner <= {ROW_SCRATCH_BYTES} ? (inner + 15) / 16 * 16 : 0;"
            ));
            out.line(format!(
                "const int64_t rbytes = rpad * (int64_t)({});",
                bytes.join(" + ")
            ));
            out.line(format!(
                "const int keep = rpad > 0 && rbytes <= {ROW_SCRATCH_BYTES};"
            ));
            out.line("#pragma omp parallel if(nt > 1)");
            out.open("");
            out.line(format!(
                "char *scratch = keep ? (char *)aligned_alloc(64, (size_t)rbytes * {rows}) : NULL;"
            ));
            let mut offset = String::from("0");
            for id in carried.iter().map(|k| k.value) {
                let ty = self.value_type(id);
                out.line(format!(
                    "{ty} *c{id} = scratch ? ({ty} *)(scratch + {offset}) : NULL;"
                ));
                if two_rows {
                    out.line(format!(
                        "{ty} *pc{id} = scratch ? ({ty} *)(scratch + rbytes + {offset}) : NULL;"
                    ));
                } else if lag.is_some() {
                    out.line(format!("{ty} *pc{id} = c{id};"));
                }
                offset = format!("{offset} + rpad * (int64_t)sizeof({ty})");
            }
            match &lag {
                Some(lag) => {
                    out.line("int pend = 0;");
                    out.line("int l_st = 0;");
                    out.line("(void)l_st;");
                    for (ty, name) in &lag.names {
                        out.line(format!("{ty} l_{name} = 0;"));
                    }
                    // Each thread stores its own last pending row after its rows.
                    out.line("#pragma omp for schedule(static) nowait");
                }
                None => out.line("#pragma omp for schedule(static)"),
            }
        } else {
            out.line("#pragma omp parallel for schedule(static) if(nt > 1)");
        }
        out.open("for (int64_t o = 0; o < outer; o++)");
        self.row(out, &carried, lag.as_ref());
        out.close();
        if carrying {
            if let Some(lag) = &lag {
                self.flush_last(out, lag);
            }
            out.line("free(scratch);");
            out.close();
        }
    }

    /// One row: its bases, its passes, and the stores with one element per row.
    fn row(&self, out: &mut Out, carried: &[RowKept], lag: Option<&Lag>) {
        let ir = self.ir;
        let passes = ir.passes();
        self.decompose_outer(out, "o");
        out.line("const int64_t len = inner;");
        if ir.selects_along_rows() {
            // A range load or select along the rows names its element `j0 + j`, as in the
            // pointwise loops' chunks: a row is one chunk starting at 0.
            out.line("const int64_t j0 = 0;");
        }
        let gathered = self.gathered_views();
        for arg in ir.pointwise_args().filter(|a| !gathered.contains(a)) {
            out.line(format!("const int64_t b{arg} = {};", self.row_base(arg)));
        }
        let in_range = self.row_gather_bases(out);
        // A store broadcast along an outer axis is written from the rows at index 0 there.
        for k in 0..ir.stores.len() {
            if let Some(ok) = self.outer_guard(k) {
                out.line(format!("const int ok{k} = {ok};"));
            }
        }
        if self.vector {
            out.line("#if defined(FB_AVX512)");
            // A row whose gathered index is out of range fills its loads: scalar loops.
            let whole = format!("len - len % {}", vector::LANES);
            out.line(match in_range {
                Some(ok) => format!("const int64_t jv = {ok} ? {whole} : 0;"),
                None => format!("const int64_t jv = {whole};"),
            });
            self.next_row(out);
            out.line("#else");
            out.line("const int64_t jv = 0;");
            out.line("#endif");
        }
        for pass in 0..passes {
            self.pass(out, pass, carried, lag);
        }
        // One element per row: from the row's results, at inner index 0.
        let rows = ir.row_plan().per_row;
        if !rows.is_empty() {
            out.open("");
            out.line("const int64_t j = 0;");
            out.line("(void)j;");
            let reads: Vec<usize> = rows.iter().map(|&k| ir.stores[k].value).collect();
            for id in self.ir.row_needed(&reads) {
                out.line(&self.body[id]);
            }
            for &k in &rows {
                out.line(self.store_line(k));
            }
            out.close();
        }
    }

    /// The load views of this kernel's row gathers ([`KernelIr::row_gathers`]).
    fn gathered_views(&self) -> Vec<usize> {
        (0..self.ir.body.len())
            .filter_map(|id| match self.ir.body[id] {
                Instr::GatherLoad { view, .. } if self.row_gathers[id] => Some(view),
                _ => None,
            })
            .collect()
    }

    /// For each row gather ([`KernelIr::row_gathers`]), once per row: its index `gx{id}`
    /// (the index's values evaluated in a block of their own, since the loops define them
    /// again), whether it is in range `gok{id}`, and its view's base `b{view}` moved to the
    /// gathered row, or left where it is when out of range (its loads then read nothing).
    /// Returns the condition that every gather of the row is in range, if there are any.
    fn row_gather_bases(&self, out: &mut Out) -> Option<String> {
        let ir = self.ir;
        let mut oks = Vec::new();
        for id in (0..ir.body.len()).filter(|&id| self.row_gathers[id]) {
            let Instr::GatherLoad {
                view,
                index,
                gather: g,
            } = ir.body[id]
            else {
                continue;
            };
            out.line(format!("int64_t gx{id};"));
            out.open("");
            for x in ir.row_needed(&[index]) {
                out.line(&self.body[x]);
            }
            out.line(format!("gx{id} = v{index};"));
            out.close();
            let gx = format!("gx{id}");
            out.line(format!("const int gok{id} = {};", gather_in_range(&gx, g)));
            out.line(format!(
                "const int64_t b{view} = {} + (gok{id} ? {} : 0);",
                self.row_base(view),
                gather_offset_of(&gx, g)
            ));
            oks.push(format!("gok{id}"));
        }
        (!oks.is_empty()).then(|| oks.join(" && "))
    }

    /// The condition under which this row writes store `k`, when the store is broadcast along
    /// an outer axis (only the rows at index 0 on such axes write it).
    fn outer_guard(&self, k: usize) -> Option<String> {
        let skipped: Vec<String> = (0..self.inner)
            .filter(|&d| self.ir.stores[k].view.axes[d] == Axis::Broadcast)
            .map(|d| format!("i{d} == 0"))
            .collect();
        (!skipped.is_empty()).then(|| skipped.join(" && "))
    }

    /// The scalar statement writing store `k` at the current `j`.
    fn store_line(&self, k: usize) -> String {
        let store = &self.ir.stores[k];
        let arg = self.ir.store_arg(k);
        let value = C.store(store.view.dtype, &format!("v{}", store.value));
        let write = format!("{} = {value};", self.element(arg));
        match self.outer_guard(k) {
            Some(_) => format!("if (ok{k}) {write}"),
            None => write,
        }
    }

    /// Loads whose rows move from one row to the next (not broadcast along every outer axis,
    /// or gathered at an index read straight from memory: [`Self::next_gathers`]) and are
    /// contiguous along the row: the ones worth prefetching.
    fn moving_loads(&self) -> Vec<usize> {
        let gathered: Vec<usize> = self.next_gathers().iter().map(|g| g.1).collect();
        (0..self.ir.loads.len())
            .filter(|&a| {
                let axes = &self.ir.loads[a].axes;
                axes[self.inner] == Axis::Unit
                    && (axes[..self.inner].iter().any(|&x| x != Axis::Broadcast)
                        || gathered.contains(&a))
            })
            .collect()
    }

    /// The row gathers ([`KernelIr::row_gathers`]) whose index is a load, so that the next
    /// row's index, and with it the next gathered row, is one read away: (value, view, the
    /// index's view, gather).
    fn next_gathers(&self) -> Vec<(usize, usize, usize, usize)> {
        let ir = self.ir;
        (0..ir.body.len())
            .filter(|&id| self.row_gathers[id])
            .filter_map(|id| match ir.body[id] {
                Instr::GatherLoad {
                    view,
                    index,
                    gather,
                } => match ir.body[index] {
                    Instr::Load { view: from } => Some((id, view, from, gather)),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// `nb{a}`: how far the next row of moving load `a` is from this one, or 0 on the last
    /// row and when rows are too long to sit in cache (the prefetches then touch this row,
    /// which is harmless).
    fn next_row(&self, out: &mut Out) {
        let moving = self.moving_loads();
        if moving.is_empty() || self.ir.passes() < 2 {
            return;
        }
        let bytes: usize = moving
            .iter()
            .map(|&a| self.ir.loads[a].dtype.size_bytes())
            .sum();
        out.line(format!(
            "const int pf = o + 1 < outer && len * {bytes} <= {ROW_SCRATCH_BYTES};"
        ));
        // Outer coordinates `q{d}` of row o + 1.
        match self.inner {
            1 => out.line("const int64_t q0 = o + 1;"),
            _ => {
                out.line("int64_t qrem = o + 1;");
                for d in (1..self.inner).rev() {
                    out.line(format!("const int64_t q{d} = qrem % n{d};"));
                    out.line(format!("qrem /= n{d};"));
                }
                out.line("const int64_t q0 = qrem;");
            }
        }
        let gathers = self.next_gathers();
        for a in moving {
            let next = self.base_at(a, "q");
            match gathers.iter().find(|g| g.1 == a) {
                // The next row's index, read early; out of range, this row is prefetched.
                Some(&(id, _, from, g)) => {
                    let index = C.load(
                        self.ir.loads[from].dtype,
                        &format!("p{from}[{}]", self.base_at(from, "q")),
                    );
                    out.line(format!("const int64_t gxn{id} = pf ? {index} : 0;"));
                    let gxn = format!("gxn{id}");
                    out.line(format!(
                        "const int64_t nb{a} = pf && {} ? {next} + {} - b{a} : 0;",
                        gather_in_range(&gxn, g),
                        gather_offset_of(&gxn, g)
                    ));
                }
                None => out.line(format!("const int64_t nb{a} = pf ? {next} - b{a} : 0;")),
            }
        }
    }

    /// Pass `index` of the row plan ([`KernelIr::row_plan`]).
    fn plan(&self, index: usize) -> RowPass {
        self.ir.row_plan().passes.swap_remove(index)
    }

    /// Pass `index` over the row: declares the accumulators of the reductions it feeds, runs
    /// its loops (vector then scalar; twice over, with and without the scratch row, when it
    /// saves or reads carried values) and rounds the results to `r{id}`. With a `lag`, the
    /// pass before the last also stores the pending row, and the last pass hands its row over
    /// (see [`Lag`]).
    fn pass(&self, out: &mut Out, index: usize, carried: &[RowKept], lag: Option<&Lag>) {
        let ir = self.ir;
        let pass = self.plan(index);
        let last = pass.last;
        for &id in &pass.reducing {
            let Some(acc) = Accumulator::of_row_reduce(ir, id) else {
                continue;
            };
            let (ty, start) = (C.value_type(acc.prec), C.identity(&acc));
            match (acc.is_max(), acc.is_integer()) {
                (true, true) => out.line(format!("{ty} m{id} = {start};")),
                // Unsigned, so that the simd partial sums wrap instead of overflowing.
                (false, true) => out.line(format!("uint64_t s{id} = {start};")),
                (true, false) => {
                    // A float maximum is held at its operand's precision (`float` for f32,
                    // at twice the lanes of `double`), with NaN recorded on the side.
                    out.line(format!("{ty} m{id} = {start};"));
                    out.line(format!("int nan{id} = 0;"));
                }
                (false, false) => out.line(format!("{ty} s{id} = {start};")),
            }
        }
        // With a lag, this pass stores the pending row as it goes.
        let flush = lag.filter(|_| index + 2 == ir.passes());
        if !pass.reads.is_empty() {
            let scratch = carried
                .iter()
                .any(|k| k.saved_in == index || k.read_in.contains(&index));
            if scratch {
                let first = carried[0].value;
                out.open(format!("if (c{first})"));
                match lag.filter(|_| last) {
                    Some(lag) => self.hand_over(out, lag),
                    None => self.pass_loops(out, &pass, carried, true, flush),
                }
                out.close();
                // Without the scratch row nothing is pending.
                out.open("else");
                self.pass_loops(out, &pass, carried, false, None);
                out.close();
            } else {
                self.pass_loops(out, &pass, carried, false, flush);
            }
        }
        for &id in &pass.reducing {
            let (Some(acc), Instr::RowReduce { dtype, .. }) =
                (Accumulator::of_row_reduce(ir, id), &ir.body[id])
            else {
                continue;
            };
            let (held, dtype) = (acc.result_prec(), *dtype);
            let a = match (acc.kind, acc.is_integer()) {
                (ReduceKind::Max, true) => format!("m{id}"),
                (_, true) => format!("(int64_t)s{id}"),
                (ReduceKind::Max, false) => format!("(nan{id} ? (double)NAN : (double)m{id})"),
                (ReduceKind::Mean, false) => format!("(s{id} / (double)len)"),
                (ReduceKind::Sum, false) => format!("s{id}"),
            };
            out.line(format!(
                "const {} r{id} = {};",
                C.value_type(Prec::of(dtype)),
                C.round(held, dtype, &a)
            ));
        }
        self.row_reciprocals(out, &pass.reciprocals);
    }

    /// For each division by a row constant whose divisor a pass has just made known
    /// (`reciprocals`, [`RowPass::reciprocals`]): the divisor's reciprocal `rc{id}`, computed
    /// once per row, and `rk{id}`, whether multiplying by it stays within the stated bound
    /// (the divisor's magnitude is in [2⁻¹²⁶, 2¹²⁶], so that the reciprocal is a normal
    /// float; a zero, subnormal, huge, infinite or NaN divisor divides instead).
    fn row_reciprocals(&self, out: &mut Out, reciprocals: &[(usize, usize)]) {
        for &(id, b) in reciprocals {
            out.line(format!("float rc{id} = 1.0f;"));
            out.line(format!("int rk{id} = 0;"));
            out.open("");
            for x in self.ir.row_needed(&[b]) {
                out.line(&self.body[x]);
            }
            let (lo, hi) = RECIPROCAL_EXPONENTS;
            out.line(format!(
                "rk{id} = fabsf(v{b}) >= 0x1p{lo}f && fabsf(v{b}) <= 0x1p{hi}f;"
            ));
            out.line(format!("rc{id} = 1.0f / v{b};"));
            out.close();
        }
    }

    /// Rewrites the scalar statement of each division by a row constant (see
    /// [`KernelIr::row_constant_divisors`]) into a multiplication by the row's `rc{id}` where `rk{id}`
    /// allows it, and a division where it does not.
    pub(in crate::backend::cpu::emit) fn multiply_by_reciprocals(&mut self) {
        for (id, divisor) in self.ir.row_constant_divisors().into_iter().enumerate() {
            if let (Some(b), Instr::Binary { a, .. }) = (divisor, &self.ir.body[id]) {
                self.body[id] =
                    format!("const float v{id} = rk{id} ? (v{a} * rc{id}) : (v{a} / v{b});");
            }
        }
    }

    /// The loops of one pass: the vector loop over whole vectors (when the kernel has one),
    /// then the scalar `omp simd` loop over the rest. With `scratch`, the pass saves the
    /// carried values it is the saving pass of, and the last pass reads carried values back.
    fn pass_loops(
        &self,
        out: &mut Out,
        pass: &RowPass,
        carried: &[RowKept],
        scratch: bool,
        flush: Option<&Lag>,
    ) {
        let lp = self.pass_loop(pass, carried, scratch);
        if self.vector {
            self.vector_loop(out, &lp, flush);
        }
        if let Some(lag) = flush {
            // The pending row's elements past the last whole vector (all of them without
            // AVX-512), then its fence; before this row's own, which may save into the
            // scratch row the pending one is read from (see `Lag::shared`).
            out.open("if (pend)");
            self.flush_tail(out, lag);
            out.line("pend = 0;");
            out.close();
        }
        self.scalar_loop(out, &lp, if self.vector { "jv" } else { "0" });
    }

    /// The loop of `pass` once the row scratch question is settled: with `scratch`, the pass
    /// saves the carried values it is the saving pass of, and the last pass reads carried
    /// values back.
    fn pass_loop<'p>(&self, pass: &'p RowPass, carried: &[RowKept], scratch: bool) -> Loop<'p> {
        let ir = self.ir;
        let saves: Vec<usize> = carried
            .iter()
            .filter(|k| scratch && k.saved_in == pass.index)
            .map(|k| k.value)
            .collect();
        // Carried values this pass reads back: their computation is cut off.
        let mut stop = vec![false; ir.body.len()];
        for k in carried {
            if scratch && k.read_in.contains(&pass.index) {
                stop[k.value] = true;
            }
        }
        let mut reads = pass.reads.clone();
        reads.extend(&saves);
        let needed = self.ir.row_needed_stopping(&reads, &stop);
        Loop {
            pass,
            needed,
            stop,
            saves,
        }
    }

    /// The scalar `omp simd` loop of one pass from element `start` to the row's end.
    fn scalar_loop(&self, out: &mut Out, lp: &Loop, start: &str) {
        let ir = self.ir;
        let pass = lp.pass;
        let (needed, stop, saves) = (&lp.needed, &lp.stop, &lp.saves);
        let mut pragma = String::from("#pragma omp simd");
        let mut statements = Vec::new();
        for &id in &pass.reducing {
            let Instr::RowReduce { kind, x, .. } = ir.body[id] else {
                continue;
            };
            match (kind, ir.prec(x) == Prec::I64) {
                (ReduceKind::Max, true) => {
                    pragma.push_str(&format!(" reduction(max:m{id})"));
                    statements.push(format!("m{id} = v{x} > m{id} ? v{x} : m{id};"));
                }
                (_, true) => {
                    pragma.push_str(&format!(" reduction(+:s{id})"));
                    statements.push(format!("s{id} += (uint64_t)v{x};"));
                }
                (ReduceKind::Max, false) => {
                    pragma.push_str(&format!(" reduction(max:m{id}) reduction(|:nan{id})"));
                    statements.push(format!("m{id} = v{x} > m{id} ? v{x} : m{id};"));
                    statements.push(format!("nan{id} |= v{x} != v{x};"));
                }
                (_, false) => {
                    pragma.push_str(&format!(" reduction(+:s{id})"));
                    statements.push(format!("s{id} += (double)v{x};"));
                }
            }
        }
        out.line(pragma);
        out.open(format!("for (int64_t j = {start}; j < len; j++)"));
        for &id in needed {
            if stop[id] {
                out.line(format!("const {} v{id} = c{id}[j];", self.value_type(id)));
            } else {
                out.line(&self.body[id]);
            }
        }
        for &id in saves {
            out.line(format!("c{id}[j] = v{id};"));
        }
        for statement in &statements {
            out.line(statement);
        }
        for &k in &pass.looped {
            out.line(self.store_line(k));
        }
        out.close();
    }
}

/// Per value, whether the vector loops of this row kernel spell it with `fbv_expf_row`, the
/// cheaper `exp` (`vector_expf_row.c`): an f32 `exp` in a row kernel whose arithmetic is
/// `Relaxed` and which runs vector loops, except one only added to literals (that keeps
/// `fbv_expf_addend`, which drops the subnormal range the sum cannot see). The `exp` is
/// most of a softmax row's arithmetic; the IR contract lets a relaxed row kernel's `exp` be
/// within 2.5 ulp instead of the pointwise kernels' 1.05. The scalar loop finishing a row
/// keeps `fb_expf`.
pub(in crate::backend::cpu::emit) fn row_exps(ir: &KernelIr) -> Vec<bool> {
    let relaxed =
        ir.row_arithmetic == RowArithmetic::Relaxed && ir.is_row_kernel() && vector::supports(ir);
    (0..ir.body.len())
        .map(|id| {
            relaxed
                && matches!(
                    ir.body[id],
                    Instr::Call {
                        func: Func::Exp,
                        prec: Prec::F32,
                        ..
                    }
                )
                && !only_added_to_constants(ir, id)
        })
        .collect()
}
