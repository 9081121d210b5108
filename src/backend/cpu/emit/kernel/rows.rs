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
//!   is a normal float ([`Kernel::reciprocals`]), the other freedom: a multiplication instead
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
//!   being read. A last pass in place stores normally (see `Kernel::destinations`).
//! - **Concats along the rows.** A row kernel reading a concat along its rows
//!   ([`KernelIr::selects_along_rows`]) evaluates every operand at each element and selects,
//!   in the scalar loops through clamped loads; in the vector loops a vector lying inside one
//!   segment takes a step with that segment's operand alone ([`Kernel::segment_steps`]).
//! - **Stores under the arithmetic.** Where the last pass only stores what the scratch row and
//!   the row constants give it (softmax), it runs one row late, inside the next row's second
//!   pass ([`Lag`]), so that the output's memory traffic overlaps the `exp`s instead of
//!   following them. A pass that only takes maxima keeps [`MAX_CHAINS`] accumulators.

use super::{Kernel, Out};
use crate::backend::cpu::emit::expr::C;
use crate::backend::cpu::emit::expr::only_added_to_constants;
use crate::backend::cpu::emit::vector;
use crate::backend::spelling::Spelling;
use crate::formula::Func;
use crate::lower::ir::{Axis, Instr, KernelIr, Prec, ReduceKind, RowArithmetic, RowKept};

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
pub const SUM_BLOCK: usize = 256;

/// What one pass over a row does.
struct Pass {
    /// Its index, from 0.
    index: usize,
    /// Whether it is the last pass, which stores.
    last: bool,
    /// The `RowReduce`s it accumulates.
    reducing: Vec<usize>,
    /// The stores it writes (those with one element per inner index).
    looped: Vec<usize>,
    /// The values it must evaluate at each element: the reduced ones and the stored ones.
    reads: Vec<usize>,
}

/// The loop over one row in one pass, once the row scratch question is settled.
struct Loop<'p> {
    pass: &'p Pass,
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
    pass: Pass,
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

impl Kernel<'_> {
    /// The [`Lag`] of this kernel, if its last pass can run one row late: the kernel runs
    /// vector loops, carries values in a row scratch, has at least two passes, and its last
    /// pass stores every element, reduces nothing and needs no load (only carried values, row
    /// constants and literals).
    fn lag(&self, carried: &[RowKept]) -> Option<Lag> {
        let ir = self.ir;
        let passes = ir.passes();
        if !self.vector || carried.is_empty() || passes < 2 {
            return None;
        }
        let pass = self.plan(passes - 1);
        if !pass.reducing.is_empty() || pass.looped.is_empty() {
            return None;
        }
        // The pending row is stored by the steps of the pass before the last, which must
        // have a loop to run them in.
        if self.plan(passes - 2).reads.is_empty() {
            return None;
        }
        let lp = self.pass_loop(&pass, carried, true);
        // (A select along the rows names its element from the row's start, which a pending
        // row stored after the thread's rows does not have: such a last pass does not lag.)
        let loads = lp.needed.iter().any(|&id| {
            !lp.stop[id]
                && matches!(
                    ir.body[id],
                    Instr::Load { .. } | Instr::RangeLoad { .. } | Instr::Select { .. }
                )
        });
        if loads {
            return None;
        }
        let reciprocals = self.reciprocals();
        let mut names = Vec::new();
        for &id in &lp.needed {
            if let Instr::RowReduce { dtype, .. } = ir.body[id] {
                names.push((C.value_type(Prec::of(dtype)), format!("r{id}")));
            }
            if reciprocals[id].is_some() {
                names.push(("float", format!("rc{id}")));
                names.push(("int", format!("rk{id}")));
            }
        }
        for &k in &pass.looped {
            names.push(("int64_t", format!("b{}", self.store_arg(k))));
            if self.outer_guard(k).is_some() {
                names.push(("int", format!("ok{k}")));
            }
        }
        drop(lp);
        Some(Lag {
            pass,
            carried: carried.to_vec(),
            names,
            shared: carried
                .iter()
                .filter(|k| k.read_in.contains(&(passes - 1)))
                .all(|k| k.saved_in + 2 == passes),
        })
    }

    /// The pending row's names in a new scope: its row constants, bases and guards, and its
    /// scratch row `pc{id}` as `c{id}`.
    fn rebind(&self, out: &mut Out, lag: &Lag) {
        for (ty, name) in &lag.names {
            out.line(format!("const {ty} {name} = l_{name};"));
        }
        for id in lag.carried.iter().map(|k| k.value) {
            out.line(format!("const {} *c{id} = pc{id};", self.value_type(id)));
        }
    }

    /// The last pass's place in a lagging row with a scratch row: the row becomes the pending
    /// one, and the thread's next row takes the other scratch row.
    fn hand_over(&self, out: &mut Out, lag: &Lag) {
        for (_, name) in &lag.names {
            out.line(format!("l_{name} = {name};"));
        }
        out.line("#if defined(FB_AVX512)");
        out.open("");
        self.destinations(out, &lag.pass.looped, true);
        out.line("l_st = st;");
        out.close();
        out.line("#endif");
        out.line("pend = 1;");
        if lag.shared {
            return;
        }
        for id in lag.carried.iter().map(|k| k.value) {
            let ty = self.value_type(id);
            out.line(format!(
                "{{ {ty} *t = c{id}; c{id} = pc{id}; pc{id} = t; }}"
            ));
        }
    }

    /// Inside a vector loop at `j`: the pending row's vector at `j`, if there is one.
    fn flush_step(&self, out: &mut Out, flush: Option<&Lag>) {
        let Some(lag) = flush else { return };
        out.open("if (pend)");
        self.flush_vector(out, lag);
        out.close();
    }

    /// The last pass's vector step at `j` for the pending row.
    fn flush_vector(&self, out: &mut Out, lag: &Lag) {
        self.rebind(out, lag);
        for &k in &lag.pass.looped {
            let arg = self.store_arg(k);
            out.line(format!(
                "{} *d{k} = p{arg} + b{arg};",
                C.storage_type(self.ir.stores[k].view.dtype)
            ));
        }
        out.line("const int st = l_st;");
        let lp = self.pass_loop(&lag.pass, &lag.carried, true);
        self.vector_step(out, &lp, &[], 0);
    }

    /// The pending row's elements from `jv` to its end (all of them without AVX-512), then
    /// the fence of its streaming stores.
    fn flush_tail(&self, out: &mut Out, lag: &Lag) {
        out.open("");
        self.rebind(out, lag);
        let lp = self.pass_loop(&lag.pass, &lag.carried, true);
        self.scalar_loop(out, &lp, "jv");
        out.close();
        out.line("#if defined(FB_AVX512)");
        out.line("if (l_st) _mm_sfence();");
        out.line("#endif");
    }

    /// After a thread's rows: its last pending row, whole.
    fn flush_last(&self, out: &mut Out, lag: &Lag) {
        out.open("if (pend)");
        out.line("const int64_t len = inner;");
        out.line("#if defined(FB_AVX512)");
        out.line(format!("const int64_t jv = len - len % {};", vector::LANES));
        out.open(format!(
            "for (int64_t j = 0; j < jv; j += {})",
            vector::LANES
        ));
        self.flush_vector(out, lag);
        out.close();
        out.line("#else");
        out.line("const int64_t jv = 0;");
        out.line("#endif");
        self.flush_tail(out, lag);
        out.close();
    }

    /// A row kernel: rows over threads, one loop per pass over each row (see the module
    /// documentation).
    pub(super) fn row_kernel(&self, out: &mut Out) {
        let carried = self.carried();
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
        for arg in 0..ir.loads.len() + ir.stores.len() {
            out.line(format!("const int64_t b{arg} = {};", self.row_base(arg)));
        }
        // A store broadcast along an outer axis is written from the rows at index 0 there.
        for k in 0..ir.stores.len() {
            if let Some(ok) = self.outer_guard(k) {
                out.line(format!("const int ok{k} = {ok};"));
            }
        }
        if self.vector {
            out.line("#if defined(FB_AVX512)");
            out.line(format!("const int64_t jv = len - len % {};", vector::LANES));
            self.next_row(out);
            out.line("#else");
            out.line("const int64_t jv = 0;");
            out.line("#endif");
        }
        for pass in 0..passes {
            self.pass(out, pass, carried, lag);
        }
        // One element per row: from the row's results, at inner index 0.
        let rows: Vec<usize> = (0..ir.stores.len()).filter(|&k| self.per_row(k)).collect();
        if !rows.is_empty() {
            out.open("");
            out.line("const int64_t j = 0;");
            out.line("(void)j;");
            let reads: Vec<usize> = rows.iter().map(|&k| ir.stores[k].value).collect();
            for id in self.needed(&reads) {
                out.line(&self.body[id]);
            }
            for &k in &rows {
                out.line(self.store_line(k));
            }
            out.close();
        }
    }

    /// Whether store `k` has one element per row (it is broadcast along the inner axis).
    fn per_row(&self, k: usize) -> bool {
        self.ir.stores[k].view.axes[self.inner] == Axis::Broadcast
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
        let arg = self.store_arg(k);
        let value = C.store(store.view.dtype, &format!("v{}", store.value));
        let write = format!("{} = {value};", self.element(arg));
        match self.outer_guard(k) {
            Some(_) => format!("if (ok{k}) {write}"),
            None => write,
        }
    }

    /// Loads whose rows move from one row to the next (not broadcast along every outer axis)
    /// and are contiguous along the row: the ones worth prefetching.
    fn moving_loads(&self) -> Vec<usize> {
        (0..self.ir.loads.len())
            .filter(|&a| {
                let axes = &self.ir.loads[a].axes;
                axes[self.inner] == Axis::Unit
                    && axes[..self.inner].iter().any(|&x| x != Axis::Broadcast)
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
        for a in moving {
            let mut next = format!("o{a}");
            for d in 0..self.inner {
                if let Some(t) = self.term(a, d, &format!("q{d}")) {
                    next.push_str(&format!(" + {t}"));
                }
            }
            out.line(format!("const int64_t nb{a} = pf ? {next} - b{a} : 0;"));
        }
    }

    /// What pass `index` over a row reduces, stores and must evaluate.
    fn plan(&self, index: usize) -> Pass {
        let ir = self.ir;
        let levels = ir.levels();
        let last = index + 1 == ir.passes();
        let reducing: Vec<usize> = (0..ir.body.len())
            .filter(|&id| levels[id] == index + 1 && matches!(ir.body[id], Instr::RowReduce { .. }))
            .collect();
        let looped: Vec<usize> = if last {
            (0..ir.stores.len()).filter(|&k| !self.per_row(k)).collect()
        } else {
            Vec::new()
        };
        let mut reads: Vec<usize> = reducing
            .iter()
            .filter_map(|&id| match ir.body[id] {
                Instr::RowReduce { x, .. } => Some(x),
                _ => None,
            })
            .collect();
        reads.extend(looped.iter().map(|&k| ir.stores[k].value));
        Pass {
            index,
            last,
            reducing,
            looped,
            reads,
        }
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
            let Instr::RowReduce { kind, x, .. } = ir.body[id] else {
                continue;
            };
            match (kind, ir.prec(x) == Prec::I64) {
                (ReduceKind::Max, true) => out.line(format!("int64_t m{id} = INT64_MIN;")),
                // Unsigned, so that the simd partial sums wrap instead of overflowing.
                (_, true) => out.line(format!("uint64_t s{id} = 0;")),
                (ReduceKind::Max, false) => {
                    // The maximum of floats is one of them: f32 values compare exactly in
                    // `float`, at twice the lanes of `double`.
                    out.line(format!("{} m{id} = -INFINITY;", C.value_type(ir.prec(x))));
                    out.line(format!("int nan{id} = 0;"));
                }
                (_, false) => out.line(format!("double s{id} = 0.0;")),
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
            let Instr::RowReduce { kind, x, dtype } = ir.body[id] else {
                continue;
            };
            let integer = ir.prec(x) == Prec::I64;
            let (held, a) = match (kind, integer) {
                (ReduceKind::Max, true) => (Prec::I64, format!("m{id}")),
                (_, true) => (Prec::I64, format!("(int64_t)s{id}")),
                (ReduceKind::Max, false) => (
                    Prec::F64,
                    format!("(nan{id} ? (double)NAN : (double)m{id})"),
                ),
                (ReduceKind::Mean, false) => (Prec::F64, format!("(s{id} / (double)len)")),
                (ReduceKind::Sum, false) => (Prec::F64, format!("s{id}")),
            };
            out.line(format!(
                "const {} r{id} = {};",
                C.value_type(Prec::of(dtype)),
                C.round(held, dtype, &a)
            ));
        }
        self.row_reciprocals(out, index + 1);
    }

    /// For each division by a row constant whose divisor becomes known once the reductions of
    /// `level` are (see [`Kernel::reciprocals`]): the divisor's reciprocal `rc{id}`, computed
    /// once per row, and `rk{id}`, whether multiplying by it stays within the stated bound
    /// (the divisor's magnitude is in [2⁻¹²⁶, 2¹²⁶], so that the reciprocal is a normal
    /// float; a zero, subnormal, huge, infinite or NaN divisor divides instead).
    fn row_reciprocals(&self, out: &mut Out, level: usize) {
        let levels = self.ir.levels();
        for (id, divisor) in self.reciprocals().into_iter().enumerate() {
            let Some(b) = divisor else { continue };
            if levels[b] != level {
                continue;
            }
            out.line(format!("float rc{id} = 1.0f;"));
            out.line(format!("int rk{id} = 0;"));
            out.open("");
            for x in self.needed(&[b]) {
                out.line(&self.body[x]);
            }
            out.line(format!(
                "rk{id} = fabsf(v{b}) >= 0x1p-126f && fabsf(v{b}) <= 0x1p126f;"
            ));
            out.line(format!("rc{id} = 1.0f / v{b};"));
            out.close();
        }
    }

    /// Per value, the divisor `b` when the value is an f32 division by a row constant that
    /// the kernel multiplies by the row's reciprocal instead ([`KernelIr::row_constant_divisors`],
    /// shared with the CUDA row kernels; none under `RowArithmetic::Exact`): a division costs
    /// about five times a multiplication here.
    ///
    /// [`KernelIr::row_constant_divisors`]: crate::lower::ir::KernelIr::row_constant_divisors
    pub(super) fn reciprocals(&self) -> Vec<Option<usize>> {
        self.ir.row_constant_divisors()
    }

    /// Rewrites the scalar statement of each division by a row constant (see
    /// [`Kernel::reciprocals`]) into a multiplication by the row's `rc{id}` where `rk{id}`
    /// allows it, and a division where it does not.
    pub(in crate::backend::cpu::emit) fn multiply_by_reciprocals(&mut self) {
        for (id, divisor) in self.reciprocals().into_iter().enumerate() {
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
        pass: &Pass,
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
    fn pass_loop<'p>(&self, pass: &'p Pass, carried: &[RowKept], scratch: bool) -> Loop<'p> {
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
        let needed = self.needed_stopping(&reads, &stop);
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

    /// The AVX-512 loop of one pass over the row's whole vectors, inside
    /// `#if defined(FB_AVX512)`: the same values as the scalar loop, lane for lane; reductions
    /// in vector accumulators merged into the scalar ones after the loop, which the scalar
    /// loop then continues. A pass with float sums walks the row in blocks of [`SUM_BLOCK`]
    /// elements: each sum adds its vectors in an f32 accumulator `vf{id}`, whose lanes join
    /// the f64 accumulators `vs{id}`/`vt{id}` at the block's end; a block whose f32 sums are
    /// not all finite (an overflow, or an Inf or NaN among the values) is summed again in f64,
    /// so that a row whose f64 sum is finite never reads an overflowed block. A pass that only
    /// takes maxima keeps [`MAX_CHAINS`] accumulators per maximum. With `flush`, each vector
    /// step first stores the same vector of the pending row (see [`Lag`]).
    fn vector_loop(&self, out: &mut Out, lp: &Loop, flush: Option<&Lag>) {
        let ir = self.ir;
        let (reducing, looped) = (&lp.pass.reducing, &lp.pass.looped);
        let all_sums: Vec<usize> = reducing
            .iter()
            .copied()
            .filter(|&id| matches!(ir.body[id], Instr::RowReduce { kind, .. } if kind != ReduceKind::Max))
            .collect();
        // Exact arithmetic adds every vector into the f64 accumulators as it comes, with no
        // f32 blocks.
        let (sums, f64_sums) = match ir.row_arithmetic {
            RowArithmetic::Relaxed => (all_sums.clone(), Vec::new()),
            RowArithmetic::Exact => (Vec::new(), all_sums.clone()),
        };
        // Only maxima, nothing stored or saved: the loop is the maxima's dependency chains.
        let chains =
            if all_sums.is_empty() && looped.is_empty() && lp.saves.is_empty() && flush.is_none() {
                MAX_CHAINS
            } else {
                1
            };
        out.line("#if defined(FB_AVX512)");
        out.open("");
        for &id in reducing {
            let Instr::RowReduce { kind, .. } = ir.body[id] else {
                continue;
            };
            if kind == ReduceKind::Max {
                for c in 0..chains {
                    out.line(format!(
                        "__m512 {} = _mm512_set1_ps(-INFINITY);",
                        chain(id, c)
                    ));
                }
                out.line(format!("__mmask16 vn{id} = 0;"));
            } else {
                out.line(format!("__m512d vs{id} = _mm512_setzero_pd();"));
                out.line(format!("__m512d vt{id} = _mm512_setzero_pd();"));
            }
        }
        // A pass storing in place (not lagged) writes its row all at once after the row's
        // arithmetic: see `destinations`.
        self.destinations(out, looped, false);
        if chains > 1 {
            let step = chains * vector::LANES;
            out.line("int64_t j = 0;");
            out.open(format!("for (; j + {step} <= jv; j += {step})"));
            out.line("const int64_t j0 = j;");
            for c in 0..chains {
                out.open("");
                out.line(format!("const int64_t j = j0 + {};", c * vector::LANES));
                self.prefetch(out, lp, flush);
                self.vector_step(out, lp, &f64_sums, c);
                out.close();
            }
            out.close();
            out.open(format!("for (; j < jv; j += {})", vector::LANES));
            self.prefetch(out, lp, flush);
            self.vector_step(out, lp, &f64_sums, 0);
            out.close();
            for &id in reducing {
                let joined = (1..chains).fold(chain(id, 0), |acc, c| {
                    format!("_mm512_max_ps({}, {acc})", chain(id, c))
                });
                out.line(format!("{} = {joined};", chain(id, 0)));
            }
        } else if !sums.is_empty() {
            out.open(format!("for (int64_t jb = 0; jb < jv; jb += {SUM_BLOCK})"));
            out.line(format!(
                "const int64_t je = jv - jb > {SUM_BLOCK} ? jb + {SUM_BLOCK} : jv;"
            ));
            for &id in &sums {
                out.line(format!("__m512 vf{id} = _mm512_setzero_ps();"));
            }
            self.vector_steps(out, lp, flush, &f64_sums, "jb; j < je");
            // x - x is 0 exactly for finite x, NaN for ±Inf and NaN.
            let finite: Vec<String> = sums
                .iter()
                .map(|id| {
                    format!(
                        "_mm512_cmp_ps_mask(_mm512_sub_ps(vf{id}, vf{id}), \
                         _mm512_setzero_ps(), _CMP_EQ_OQ)"
                    )
                })
                .collect();
            out.open(format!("if (({}) == 0xFFFF)", finite.join(" & ")));
            for &id in &sums {
                widen_into(out, id, &format!("vf{id}"));
            }
            out.close();
            out.open("else");
            out.open(format!(
                "for (int64_t j = jb; j < je; j += {})",
                vector::LANES
            ));
            self.vector_values(out, lp, None);
            for &id in &sums {
                let Instr::RowReduce { x, .. } = ir.body[id] else {
                    continue;
                };
                widen_into(out, id, &format!("v{x}"));
            }
            out.close();
            out.close();
            out.close();
        } else {
            self.vector_steps(out, lp, flush, &f64_sums, "0; j < jv");
        }
        for &id in reducing {
            let Instr::RowReduce { kind, .. } = ir.body[id] else {
                continue;
            };
            if kind == ReduceKind::Max {
                out.line(format!("m{id} = _mm512_reduce_max_ps(vm{id});"));
                out.line(format!("nan{id} = vn{id} != 0;"));
            } else {
                out.line(format!(
                    "s{id} = _mm512_reduce_add_pd(_mm512_add_pd(vs{id}, vt{id}));"
                ));
            }
        }
        if !looped.is_empty() {
            // Streaming stores are weakly ordered: fence them before the row is done (and
            // before the team's closing barrier publishes the results).
            out.line("if (st) _mm_sfence();");
        }
        out.close();
        out.line("#endif");
    }

    /// The loop of vector steps `for (int64_t j = {range}; j += 16)` (range: start and
    /// condition), each prefetching, storing the pending row's vector (with `flush`) and
    /// taking its own step.
    fn vector_steps(
        &self,
        out: &mut Out,
        lp: &Loop,
        flush: Option<&Lag>,
        f64_sums: &[usize],
        range: &str,
    ) {
        out.open(format!("for (int64_t j = {range}; j += {})", vector::LANES));
        self.prefetch(out, lp, flush);
        self.flush_step(out, flush);
        self.vector_step(out, lp, f64_sums, 0);
        out.close();
    }

    /// `d{k}`, the row's first element of each looped store `k`, and `st`, whether the row's
    /// stores stream. Only a lagged last pass (`lagged`) streams: its stores are spread over
    /// the next row's arithmetic. A last pass in place stores its whole row in one burst, and
    /// there streaming stores stall the thread while the write-combining buffers drain instead
    /// of leaving the lines to be written back in the background; on the two-core Xeon
    /// layernorm took 12–22% less time with ordinary stores at every shape tried (`[8192, 1024]`,
    /// `[2048, 4096]`, `[65536, 256]`, `[32768, 1024]`, `benches/row_kernel_harness.c`),
    /// although they read each output line first.
    fn destinations(&self, out: &mut Out, looped: &[usize], lagged: bool) {
        for &k in looped {
            let arg = self.store_arg(k);
            out.line(format!(
                "{} *d{k} = p{arg} + b{arg};",
                C.storage_type(self.ir.stores[k].view.dtype)
            ));
        }
        if !looped.is_empty() {
            let stream = if lagged {
                vector::stream_condition(looped)
            } else {
                "0".to_string()
            };
            out.line(format!("const int st = {stream};"));
        }
    }

    /// The prefetch of the next row's vector at `j` of every moving load, in the pass that
    /// does most of the row's arithmetic: the second (index 1), or the one storing a lagging
    /// row. Into L2 rather than L1: L1 holds this row and the scratch rows (see [`Lag`]).
    fn prefetch(&self, out: &mut Out, lp: &Loop, flush: Option<&Lag>) {
        if lp.pass.index != 1 && flush.is_none() {
            return;
        }
        for a in self.moving_loads() {
            out.line(format!(
                "_mm_prefetch((const char *)&p{a}[b{a} + nb{a} + j], _MM_HINT_T1);"
            ));
        }
    }

    /// One vector step of a pass at lanes `j .. j + 16`: its values, the carried values it
    /// saves, its reductions (maxima into chain `c`) and its stores.
    ///
    /// In a row kernel reading a concat along its rows, a vector lying wholly inside one
    /// operand's segment takes a step of its own for that segment ([`Kernel::segment_steps`]).
    fn vector_step(&self, out: &mut Out, lp: &Loop, f64_sums: &[usize], c: usize) {
        let segments = self.segment_steps(lp);
        if segments.is_empty() {
            return self.vector_step_in(out, lp, f64_sums, c, None);
        }
        for (k, condition) in segments.iter().enumerate() {
            let keyword = if k == 0 { "if" } else { "else if" };
            out.open(format!("{keyword} ({condition})"));
            self.vector_step_in(out, lp, f64_sums, c, Some(k));
            out.close();
        }
        out.open("else");
        self.vector_step_in(out, lp, f64_sums, c, None);
        out.close();
    }

    /// For a loop reading a concat along the rows, where every select picks by the same
    /// ranges: per case `k`, the condition under which the vector at `j` lies wholly where
    /// the selects pick case `k` (past the end of every earlier case's range) and inside case
    /// `k`'s own range. Such a vector's step reads the case's operand with plain loads and
    /// evaluates nothing of the other operands (the compiler drops their dead statements),
    /// as a per-segment loop would; only the few vectors straddling two segments take the
    /// masked step. On the two-core Xeon this made the softmax of two concatenated
    /// `[.., 512]` operands 1.34× faster with its rows in cache (0.764 against 1.024 ns per
    /// element, one thread; plain softmax there: 0.745) and 1.14× from memory. Empty for
    /// other loops.
    fn segment_steps(&self, lp: &Loop) -> Vec<String> {
        let ir = self.ir;
        let Some(ranges) = ir.row_select_ranges() else {
            return Vec::new();
        };
        let selects = lp
            .needed
            .iter()
            .any(|&id| !lp.stop[id] && matches!(ir.body[id], Instr::Select { .. }));
        if !selects {
            return Vec::new();
        }
        (0..ranges.len())
            .map(|k| {
                let r = ranges[k];
                let mut parts = vec![
                    format!("j >= rs{r}"),
                    format!("j + {} <= re{r}", vector::LANES),
                ];
                parts.extend(ranges[..k].iter().map(|e| format!("j >= re{e}")));
                parts.join(" && ")
            })
            .collect()
    }

    /// [`Kernel::vector_step`] for the vectors of `segment` (see [`Kernel::segment_steps`]),
    /// or any vector (`None`).
    fn vector_step_in(
        &self,
        out: &mut Out,
        lp: &Loop,
        f64_sums: &[usize],
        c: usize,
        segment: Option<usize>,
    ) {
        let ir = self.ir;
        self.vector_values(out, lp, segment);
        for &id in &lp.saves {
            out.line(vector::carried_store(id));
        }
        for &id in &lp.pass.reducing {
            let Instr::RowReduce { kind, x, .. } = ir.body[id] else {
                continue;
            };
            if kind == ReduceKind::Max {
                // `v > m ? v : m` per lane, as the scalar loop: a NaN lane keeps m and is
                // recorded in the mask.
                let m = chain(id, c);
                out.line(format!("{m} = _mm512_max_ps(v{x}, {m});"));
                out.line(format!(
                    "vn{id} |= _mm512_cmp_ps_mask(v{x}, v{x}, _CMP_UNORD_Q);"
                ));
            } else if f64_sums.contains(&id) {
                widen_into(out, id, &format!("v{x}"));
            } else {
                out.line(format!("vf{id} = _mm512_add_ps(vf{id}, v{x});"));
            }
        }
        for &k in &lp.pass.looped {
            // A value read back from the row scratch is stored as read: a rounding's operand
            // is computed only where the rounding is.
            let store = vector::store(ir, k, !lp.stop[ir.stores[k].value]);
            out.line(match self.outer_guard(k) {
                Some(_) => format!("if (ok{k}) {store}"),
                None => store,
            });
        }
    }

    /// The vector statements of one loop's values at lanes `j .. j + 16`: carried values read
    /// back, row reductions broadcast, divisions by a row constant multiplied by its
    /// reciprocal where the row allows it, the rest as [`vector::statement`] writes them.
    fn vector_values(&self, out: &mut Out, lp: &Loop, segment: Option<usize>) {
        let in_segment = segment.and_then(|k| Some((k, self.ir.row_select_ranges()?)));
        let ir = self.ir;
        let live = vector::live(ir);
        let reciprocals = self.reciprocals();
        let exps = row_exps(ir);
        for &id in lp.needed.iter().filter(|&&id| live[id]) {
            let within =
                in_segment.and_then(|(k, ranges)| vector::segment_statement(ir, id, ranges, k));
            out.line(if lp.stop[id] {
                vector::carried_load(id)
            } else if let Some(statement) = within {
                statement
            } else if matches!(ir.body[id], Instr::RowReduce { .. }) {
                format!("const __m512 v{id} = _mm512_set1_ps(r{id});")
            } else if let (true, Instr::Call { args, .. }) = (exps[id], &ir.body[id]) {
                format!("const __m512 v{id} = fbv_expf_row(v{});", args[0])
            } else if let (Some(b), Instr::Binary { a, .. }) = (reciprocals[id], &ir.body[id]) {
                format!(
                    "const __m512 v{id} = rk{id} ? _mm512_mul_ps(v{a}, _mm512_set1_ps(rc{id})) \
                     : _mm512_div_ps(v{a}, v{b});"
                )
            } else {
                vector::statement(ir, id)
            });
        }
    }

    /// The values later passes read back from the row scratch, with the pass that saves each
    /// and the passes that read it: the values [`KernelIr::row_kept`] keeps (softmax's
    /// `exp(x - max)`; nothing for layernorm), the same ones the CUDA row kernels keep on chip
    /// where they find room.
    ///
    /// [`KernelIr::row_kept`]: crate::lower::ir::KernelIr::row_kept
    pub(super) fn carried(&self) -> Vec<RowKept> {
        self.ir.row_kept()
    }

    /// Like [`Kernel::needed`], also stopping at the values marked in `stop` (read back from
    /// the row scratch rather than computed).
    fn needed_stopping(&self, reads: &[usize], stop: &[bool]) -> Vec<usize> {
        let ir = self.ir;
        let mut needed = vec![false; ir.body.len()];
        for &x in reads {
            needed[x] = true;
        }
        for id in (0..ir.body.len()).rev() {
            if needed[id] && !stop[id] && !matches!(ir.body[id], Instr::RowReduce { .. }) {
                for x in ir.body[id].operands() {
                    needed[x] = true;
                }
            }
        }
        (0..ir.body.len()).filter(|&id| needed[id]).collect()
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

/// The name of chain `c` of maximum `id`'s vector accumulators.
fn chain(id: usize, c: usize) -> String {
    match c {
        0 => format!("vm{id}"),
        _ => format!("vm{id}_{c}"),
    }
}

/// The statements adding the 16 f32 lanes of `lanes` to sum `id`'s f64 accumulators `vs{id}`
/// (lanes 0–7) and `vt{id}` (lanes 8–15); the conversions are exact.
fn widen_into(out: &mut Out, id: usize, lanes: &str) {
    out.line(format!(
        "vs{id} = _mm512_add_pd(vs{id}, _mm512_cvtps_pd(_mm512_castps512_ps256({lanes})));"
    ));
    out.line(format!(
        "vt{id} = _mm512_add_pd(vt{id}, _mm512_cvtps_pd(_mm256_castpd_ps(\
         _mm512_extractf64x4_pd(_mm512_castps_pd({lanes}), 1))));"
    ));
}
