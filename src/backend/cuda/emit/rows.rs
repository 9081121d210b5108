//! Row kernels on CUDA: one block per row, the passes of [`KernelIr::levels`] as loops of the
//! block's threads over the row, a block-wide combination after each, and the row read from
//! global memory once whenever it fits on chip.
//!
//! The block takes rows `blockIdx.x`, `blockIdx.x + gridDim.x`, … (the host caps the grid,
//! [`abi::plan`](crate::backend::cuda::abi::plan)), and its `blockDim.x` threads (a power of
//! two from 32 to `FBC_BLOCK`, chosen from the row length at launch by
//! [`abi::row_block`](crate::backend::cuda::abi::row_block)) share the row's elements. Pass
//! `p` evaluates, at each element a thread holds, the values of level at most `p` and
//! accumulates the row reductions of level `p + 1` per thread — sums of f32 values in f32
//! partials of at most 16 elements joined in `double` (below), other float sums in `double`,
//! integers in wrapping `long long`, max with NaN winning (`fbc_max2`; an f32 max in `float`
//! with `fbc_maxf`, the same exact maximum without a conversion per element). Then
//! `fbc_group` combines the threads' partials (warp shuffles, then the warps in order
//! through shared memory) and hands the row's result to
//! every thread, which divides a mean by the row length (0/0 = NaN for an empty row), rounds
//! it once to its dtype as `r{id}` and reads it as a constant in the later passes. The last
//! pass writes the stores; a store with one element per row is written after it by thread
//! 0, from the row's results at inner index 0, so an empty row still gets its sum of 0 or
//! mean of NaN, as on the CPU and in the interpreter.
//!
//! # Where the row lives between passes
//!
//! Softmax and layernorm read their input in every pass (three), so a kernel that re-reads
//! it moves the row from L2 three times and stays far from the copy floor. The loads read in
//! two passes or more ([`abi::row_cached`]) are therefore kept on chip, in one of three
//! places. The kernel text has one entry point per place (`_p{path}`, [`abi::row_paths`]),
//! each compiled with only the registers its own loops need; the host picks one per launch
//! from the row length and the pointers' alignment ([`abi::row_path`]) and also writes it
//! into the parameter block's `vec` word, so the text and its compile cache key stay free
//! of sizes.
//!
//! - Registers (`path` 2 and 3), when the row fits [`abi::row_slots`] elements per thread of
//!   the block (a compile-time constant: 16 f32 elements, so 4096 on 256 threads, 1024 on 64).
//!   Before the first pass each thread loads its slots of every cached load into arrays
//!   `c{a}[G][W]` (`G · W` slots, `W` the row vector width); the passes are fully unrolled
//!   loops over the slots, so the arrays stay in registers, with a guard for the slots past
//!   the row's end. Path 3, when the host found every view contiguous along the row aligned
//!   to 16 bytes at each row's start and the row a multiple of `W` long ([`abi::vector_ok`];
//!   for a concat read along the rows, every segment whole vectors too),
//!   gives each thread runs of `W` neighbouring elements and moves them with 16-byte loads
//!   and stores (also for loads read in one pass only, such as layernorm's weight and bias);
//!   path 2 gives slot `s` of thread `t` element `s · threads + t`, element by element, so
//!   neighbouring threads still read neighbouring elements.
//! - Shared memory (`path` 1), when the row is too long for the registers but the cached
//!   loads' rows fit the launch's dynamic shared memory
//!   ([`abi::row_shared_bytes`]: at most 48 KiB, each load's row 16-byte aligned after the
//!   last, at `fbc_row_cache()`). The first pass that reads a cached load copies each element
//!   it reads there; the later passes read it back. Each thread only ever touches the elements
//!   it copied itself (the same `threadIdx.x + k · threads` in every pass), so the cache
//!   needs no barrier of its own.
//! - Re-reading (`path` 0), for anything longer: every pass reads the loads from global
//!   memory again, from L1/L2 at best, as the size-free kernel must when no bound on the row
//!   holds.
//!
//! Every thread of the block reaches every combination (the row loop's bounds are the same
//! for the whole block, and the element loops end before it), as the barriers and
//! full-warp shuffles require.
//!
//! # Rows of a concat
//!
//! A row kernel that reads a concat by ranges selects along an outer axis (`lower::ir`), so
//! each row lies in one segment. The block takes its row's piece ([`crate::lower::split`]) by
//! the comparison chain of the pointwise pieces on the row's coordinate, and runs that
//! piece's passes: only the segment's operand is evaluated, and its loads are plain loads,
//! cached like any other. The branch is the same for the whole block, so the barriers stay
//! uniform. Each view read within a range takes its row base at the row's coordinate
//! clamped into the range ([`CudaKernelWriter::row_bases`]), so no read leaves its operand's rows even
//! where a launch leaves rows outside every range. The host plans the launch for the whole
//! kernel, whose cached loads include every piece's: each piece's row cache fits its shared
//! memory, and its views are the kernel's, aligned as the host checked.
//!
//! A row kernel reading a concat along its rows (`KernelIr::selects_along_rows`) cannot cut
//! into pieces: each element evaluates every operand under its range (`i >= rs && i < re`,
//! 0 outside, where the select never picks it) and selects. Its caches hold each operand
//! likewise. The vector path loads a vector of an operand only when the vector lies in the
//! operand's range, which one comparison at its first element decides because the host
//! takes that path only when every segment starts and ends on a multiple of `W`.
//!
//! # Arithmetic per element
//!
//! Once the row is on chip, a pass costs its arithmetic, so each element gets as little as
//! the IR allows:
//!
//! - **Each value once, where that is free.** A value a later pass needs that an earlier
//!   pass computes and that costs a call or a division ([`KernelIr::row_kept`]: softmax's
//!   `exp(x - max)`, the gelu under a layernorm) is kept by the first pass computing it over
//!   a cached f32 load that no later pass reads (softmax's `x`, which the normalize pass no
//!   longer needs), each thread over its own elements: over the load's slots of the register
//!   cache, or its row in shared memory. The later passes read it back. Keeping softmax's
//!   `exp` over `x` costs no register: a first version kept it in an array of its own beside
//!   the register cache, and on an H200 softmax over `[4096, 4096]` took 0.073 ms that way
//!   against 0.058 ms evaluating it twice. Over `x`, once each path had its own entry point,
//!   it took 0.039–0.040 ms against 0.044 ms evaluating it twice. A place holds one kept
//!   value after another: once the passes after a keeping pass no longer read what lies
//!   there, that pass writes its own value over it, element by element after reading the
//!   old one (a soft-capped softmax keeps `30·tanh(x/30)` over `x` for the sum's pass, which
//!   writes `exp(t - max)` over it for the last). A redo in f64 (below) reads such a load
//!   from global memory again, and evaluates again a kept value whose place its main loop
//!   has given to another. An f16/bf16 row has no f32 slot to lie over, and re-reading has
//!   no place at all: there the passes that need it evaluate it again (the same bits).
//! - **Sums in f32 partials.** A sum or mean of f32 values adds at most [`SUM_CHUNK`] (16) of
//!   the thread's elements in an f32 partial `f{id}`, then joins it to the thread's `double`
//!   total: an f32 addition per element instead of a conversion and an f64 addition (fp64
//!   runs at a fraction of the f32 rate). The register paths hold at most 16 elements a
//!   thread, one partial; the other paths walk the row in chunks of 16 of the thread's
//!   elements. A partial that is not finite is dropped and its chunk added again in f64, so a
//!   sum is ±Inf or NaN exactly when the f64 sum is. The block then combines the threads'
//!   totals in f64 as before. This is the first freedom of the IR's "Precision of row
//!   kernels", whose bound it meets as stated (each f32 partial holds at most 16 values).
//! - **One division per row.** An f32 division by a row constant (softmax's `e / s`,
//!   [`KernelIr::row_constant_divisors`]) multiplies by `rc{id}`, the divisor's reciprocal
//!   rounded once per row after the reductions it reads, where `rk{id}` says the divisor is in
//!   `[2⁻¹²⁶, 2¹²⁶]` (`fbc_recip_ok`); any other divisor divides. The second freedom.
//!
//! The last two are the IR's freedoms, taken only when the kernel's `row_arithmetic` is
//! `Relaxed` (fusion.ron's default); under `Exact` every float sum adds in `double` and every
//! division divides, while keeping values (the same bits) stays. The order of accumulation
//! differs from the CPU's (and between paths), so float sums may differ in their last bits,
//! within the stated bound; maxima, integer sums and every pointwise value are exact.

use super::code::Code;
use super::expr::Cuda;
use super::{CudaKernelWriter, Lane, abi};
use crate::backend::spelling::{Spelling, gather_offset};
use crate::lower::accumulate::{Accumulator, F32_PARTIAL_TERMS};
use crate::lower::ir::{Axis, Instr, KernelIr, Prec, ReduceKind};
use abi::RowPath;

/// What the path's entry point of the kernel does, for a reader of the `.cu` file.
fn comment(path: RowPath) -> &'static str {
    match path {
        RowPath::RegistersVector => "the row in registers, moved in 16-byte vectors",
        RowPath::Registers => "the row in registers, element by element",
        RowPath::Shared => "the row in shared memory after its first reading",
        RowPath::Reread => "every pass reads the row from global memory",
    }
}

/// Elements of a row one thread adds into one f32 partial sum before the partial joins the
/// thread's f64 total: the "up to 16 values per partial sum in f32" of the IR's precision
/// contract ([`crate::lower::ir`], "Precision of row kernels"), which bounds the error.
const SUM_CHUNK: usize = F32_PARTIAL_TERMS;
// The register paths hold at most this many elements per thread: one partial each.
const _: () = assert!(abi::ROW_MAX_SLOTS <= SUM_CHUNK);

/// What one pass's element body accumulates: everything (`Main`), or, when the f32 partial
/// of relaxed sum `id` overflowed, only that sum again in f64 (`Redo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acc {
    Main,
    Redo(usize),
}

/// Where a value kept from an earlier pass ([`KernelIr::row_kept`]) lives on a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Over cached load `a`'s row in shared memory, which no later pass reads.
    Shared(usize),
    /// Over cached load `a`'s slots in the register cache, which no later pass reads: the
    /// thread's own elements, in the registers that held them, so keeping costs none.
    Registers(usize),
}

/// One pass's element loop to emit.
struct PassLoop<'a> {
    pass: usize,
    path: RowPath,
    /// Row reductions accumulated in this pass.
    reducing: &'a [usize],
    /// Element stores written in this pass (the last).
    looped: &'a [usize],
    /// Loads of [`abi::row_cached`].
    cached: &'a [usize],
    /// Kept values on this path: value, the pass that keeps it, where.
    kept: &'a [(usize, usize, Place)],
    /// Per load, the first pass that reads it (the one filling the shared cache).
    first_reader: &'a [Option<usize>],
}

impl CudaKernelWriter<'_> {
    /// Row reduction `id`'s accumulator, or `None` for any other instruction.
    fn row_acc(&self, id: usize) -> Option<Accumulator> {
        Accumulator::of_row_reduce(self.ir, id)
    }

    /// Whether row reduction `id` is a maximum held in `float` (`m{id}`, with `fbc_maxf`),
    /// widened once for the block's combination ([`Accumulator::prec`]): a conversion to
    /// `double` per element is a slow instruction on GPUs.
    fn float_max(&self, id: usize) -> bool {
        self.row_acc(id)
            .is_some_and(|acc| acc.is_max() && acc.prec == Prec::F32)
    }

    /// Whether row reduction `id` is a sum or mean of f32 values that each thread adds in f32
    /// partials of at most [`SUM_CHUNK`] elements (`f{id}`) joined in its f64 total `a{id}`
    /// ([`Accumulator::f32_partials`]; under `RowArithmetic::Exact` every element is added in
    /// `double`). An f32 addition per element instead of a conversion and an f64 addition,
    /// which run at a fraction of the f32 rate on GPUs.
    fn relaxed_sum(&self, id: usize) -> bool {
        self.row_acc(id).is_some_and(|acc| acc.f32_partials)
    }

    /// The body of a row kernel's entry point for `path` (see the module documentation).
    /// Names beyond the emitter's:
    /// `row` the row index, `rb{a}` argument `a`'s element index at the row's start, `a{id}`
    /// the accumulator, `f{id}` the f32 partial and `r{id}` the result of row reduction `id`,
    /// `rc{id}`/`rk{id}` the reciprocal of division `id`'s divisor and whether to multiply by
    /// it, `ok{k}` whether store `k` (broadcast along some outer axis) writes this row, `c{a}`
    /// the register cache and `sh{a}` the shared-memory cache of load `a` (kept values are
    /// written over them), `x{a}`/`y{k}` a vector of load `a`/store `k`, `j0` the first
    /// element of a vector or of a chunk.
    pub(super) fn row_body(&self, path: RowPath) -> Code {
        let ir: &KernelIr = self.ir;
        let inner = self.inner;
        let outer: Vec<usize> = (0..inner).collect();
        let mut code = Code::new();
        self.preamble(&mut code);
        code.def("rows", format!("const U rows = {};", self.product(&outer)));
        code.def("threads", "const int threads = (int)blockDim.x;");
        code.def("tid", "const I tid = (I)threadIdx.x;");
        code.def("smem", "__shared__ double smem[FBC_BLOCK / 32];");
        code.def("smemi", "__shared__ long long smemi[FBC_BLOCK / 32];");
        code.comment("one block per row; its threads share the row's elements");
        code.open("for (U row = (U)blockIdx.x; row < rows; row += (U)gridDim.x)");
        self.decompose(&mut code, "(I)row", &outer, "rem");
        self.row_bases(&mut code, &outer);
        // A store broadcast along an outer axis is written from the rows at index 0 there.
        for (k, store) in ir.stores.iter().enumerate() {
            let at_zero: Vec<String> = outer
                .iter()
                .filter(|&&d| store.view.axes[d] == Axis::Broadcast)
                .map(|d| format!("i{d} == 0"))
                .collect();
            if !at_zero.is_empty() {
                code.def(
                    format!("ok{k}"),
                    format!("const bool ok{k} = {};", at_zero.join(" && ")),
                );
            }
        }
        code.comment(comment(path));
        match &self.split {
            // The row's piece: the block's threads share the row, so all take one branch.
            Some(split) => self.branch_per_piece(&mut code, split, |piece, branch| {
                piece.row_passes(branch, path)
            }),
            None => self.row_passes(&mut code, path),
        }
        code.close();
        code
    }

    /// `rb{a}` for every load and store: its element index at the row's start. A row kernel
    /// that reads a concat by ranges selects along an outer axis (`lower::split`), so each
    /// row lies in one segment and runs that segment's piece, whose loads are plain loads.
    /// The row base of a view read within a range clamps the row's coordinate into the
    /// range: inside it that is the row itself, and outside it (a row of another segment,
    /// whose piece does not read the view, or a launch whose ranges leave rows uncovered,
    /// where the select's value there is unspecified) it is a row of the range, so every
    /// read, cached ones included, stays in bounds.
    fn row_bases(&self, code: &mut Code, outer: &[usize]) {
        let ranged = self.ir.range_views();
        for arg in self.ir.pointwise_args() {
            let index = self.index_at(arg, outer, |d| match ranged.get(arg).copied().flatten() {
                Some((axis, r)) if axis == d => {
                    format!("(i{d} < rs{r} ? rs{r} : i{d} < re{r} ? i{d} : re{r} - 1)")
                }
                _ => format!("i{d}"),
            });
            code.def(format!("rb{arg}"), format!("const I rb{arg} = {index};"));
        }
    }

    /// Per value, whether pass `pass` meets it per element when the values of `kept` that an
    /// earlier pass keeps are read back instead of evaluated ([`KernelIr::row_pass_meets`]).
    fn row_meets_keeping(&self, pass: usize, kept: &[(usize, usize, Place)]) -> Vec<bool> {
        let mut stop = vec![false; self.ir.body.len()];
        for &(id, save, _) in kept {
            stop[id] |= save < pass;
        }
        self.ir.row_pass_meets(pass, &stop)
    }

    /// The values [`KernelIr::row_kept`] keeps, and where, on `path`: over the row of a
    /// cached f32 load that the passes after the keeping one no longer read (softmax's
    /// `exp(x - max)` over `x`), in shared memory or in the register cache, where one is
    /// free. A place is free again once the passes after a new keeping pass no longer read
    /// what an earlier pass kept there: under a softmax of `tanh(x)`, `tanh(x)` lies over `x`
    /// from the maximum's pass, and the sum's pass writes `exp(t - max)` over it, element by
    /// element after reading it. Re-reading has no place: it evaluates the value again.
    fn row_places(&self, path: RowPath, cached: &[usize]) -> Vec<(usize, usize, Place)> {
        let ir = self.ir;
        let over: fn(usize) -> Place = match path {
            RowPath::Reread => return Vec::new(),
            RowPath::Shared => Place::Shared,
            RowPath::Registers | RowPath::RegistersVector => Place::Registers,
        };
        // The register cache is filled before the first pass; the shared one by the first
        // pass that reads each load.
        let first = self.row_first_readers();
        let filled_by =
            |a: usize, save: usize| path != RowPath::Shared || first[a].is_some_and(|f| f <= save);
        let mut kept = ir.row_kept();
        kept.sort_unstable_by_key(|k| (k.saved_in, k.value));
        let mut placed: Vec<(usize, usize, Place)> = Vec::new();
        for k in kept {
            let (id, save) = (k.value, k.saved_in);
            if ir.prec(id) != Prec::F32 {
                continue;
            }
            // Adding a kept value only removes reads from later passes, so the rows chosen
            // earlier stay unread after their keeping pass.
            let free = cached.iter().copied().find(|&a| {
                let tenants = placed.iter().filter(|&&(_, _, place)| place == over(a));
                if ir.loads[a].dtype != crate::dtype::DType::F32
                    || !filled_by(a, save)
                    || tenants.clone().any(|&(_, since, _)| since >= save)
                {
                    return false;
                }
                let mut with = placed.clone();
                with.push((id, save, over(a)));
                // No pass after this one reads the load, nor what lay over it before.
                (save + 1..ir.passes()).all(|p| {
                    let met = self.row_meets_keeping(p, &with);
                    !ir.loads_met(&met)[a] && tenants.clone().all(|&(tenant, _, _)| !met[tenant])
                })
            });
            if let Some(a) = free {
                placed.push((id, save, over(a)));
            }
        }
        placed
    }

    /// Per load, the first pass that reads it per element.
    fn row_first_readers(&self) -> Vec<Option<usize>> {
        let ir = self.ir;
        let reads: Vec<Vec<bool>> = (0..ir.passes())
            .map(|pass| abi::row_pass_loads(ir, pass))
            .collect();
        (0..ir.loads.len())
            .map(|a| (0..reads.len()).find(|&pass| reads[pass][a]))
            .collect()
    }

    /// The passes over one row on `path`, their combinations, and the per-row stores.
    fn row_passes(&self, code: &mut Code, path: RowPath) {
        let ir: &KernelIr = self.ir;
        let inner = self.inner;
        let plan = ir.row_plan();
        let cached = abi::row_cached(ir);
        let kept = self.row_places(path, &cached);
        let first_reader = self.row_first_readers();
        match path {
            RowPath::Registers | RowPath::RegistersVector => self.row_fill(code, path, &cached),
            RowPath::Shared => self.row_shared(code, &cached),
            RowPath::Reread => {}
        }
        for step in &plan.passes {
            let (pass, reducing, looped) = (step.index, &step.reducing, &step.looped);
            for &id in reducing {
                let Some(acc) = self.row_acc(id) else {
                    continue;
                };
                let (ty, start) = (Cuda.value_type(acc.prec), Cuda.identity(&acc));
                let name = if self.float_max(id) { "m" } else { "a" };
                code.def(format!("{name}{id}"), format!("{ty} {name}{id} = {start};"));
            }
            if !reducing.is_empty() || !looped.is_empty() {
                let pass_loop = PassLoop {
                    pass,
                    path,
                    reducing,
                    looped,
                    cached: &cached,
                    kept: &kept,
                    first_reader: &first_reader,
                };
                self.row_pass_loop(code, &pass_loop);
            }
            for &id in reducing {
                let Some(acc) = self.row_acc(id) else {
                    continue;
                };
                let (kind, int) = (acc.kind, acc.is_integer());
                let Instr::RowReduce { dtype, .. } = ir.body[id] else {
                    continue;
                };
                let max = kind == ReduceKind::Max;
                let smem = if int { "smemi" } else { "smem" };
                // Every thread gets the row's result; the barriers inside make this a line
                // with effects, kept even if nothing read the result.
                if self.float_max(id) {
                    code.stmt(format!(
                        "double a{id} = fbc_group<true>((double)m{id}, threads, smem);"
                    ));
                    // A maximum no later value reads (a duplicate the rewrites left) would
                    // be an unused variable: a warning, which the compile tests refuse.
                    code.stmt(format!("(void)a{id};"));
                } else {
                    code.stmt(format!("a{id} = fbc_group<{max}>(a{id}, threads, {smem});"));
                }
                if kind == ReduceKind::Mean && !int {
                    code.def(
                        format!("a{id}"),
                        format!("a{id} = __ddiv_rn(a{id}, (double)n{inner});"),
                    );
                }
                let held = acc.result_prec();
                code.def(
                    format!("r{id}"),
                    format!(
                        "const {} r{id} = {};",
                        Cuda.value_type(Prec::of(dtype)),
                        Cuda.round(held, dtype, &format!("a{id}"))
                    ),
                );
            }
            // Divisors now known: their reciprocals, once per row.
            for &(id, b) in &step.reciprocals {
                self.row_reciprocal(code, id, b);
            }
        }
        // One element per row: from the row's results, at inner index 0, by one thread.
        let rows = plan.per_row;
        if !rows.is_empty() {
            let mut body = Code::new();
            self.element_bases(&mut body, false);
            self.row_values(
                &mut body,
                usize::MAX,
                &|view| self.element(view, Lane::Scalar),
                &|_| None,
            );
            for &k in &rows {
                self.row_store(&mut body, k);
            }
            code.open("if (threadIdx.x == 0)");
            code.splice(&body);
            code.close();
        }
    }

    /// `rc{id}`, the reciprocal of division `id`'s divisor `v{b}` (a row constant, see
    /// [`KernelIr::row_constant_divisors`]) rounded once per row, and `rk{id}`, whether
    /// multiplying by it keeps the IR's bound (the divisor's magnitude is in `[2⁻¹²⁶, 2¹²⁶]`;
    /// a zero, subnormal, huge, infinite or NaN divisor divides instead). The divisor's
    /// values are evaluated in a block of their own, from the row's results and literals.
    fn row_reciprocal(&self, code: &mut Code, id: usize, b: usize) {
        let ir = self.ir;
        code.def(format!("rc{id}"), format!("float rc{id} = 1.0f;"));
        code.def(format!("rk{id}"), format!("bool rk{id} = false;"));
        // Lines of this block, not a spliced one: the assignments stay exactly when a later
        // pass reads `rc{id}`/`rk{id}`, and keep the divisor's values they read.
        code.open("");
        for x in ir.row_needed(&[b]) {
            // Only row reductions, literals and arithmetic on them: no element is read.
            code.def(
                format!("v{x}"),
                Cuda.definition(ir, x, |view| self.element(view, Lane::Scalar)),
            );
        }
        code.def(format!("rk{id}"), format!("rk{id} = fbc_recip_ok(v{b});"));
        code.def(
            format!("rc{id}"),
            format!("rc{id} = __fdiv_rn(1.0f, v{b});"),
        );
        code.close();
    }

    /// The register cache of the cached loads, `c{a}[G][W]`, filled with this thread's
    /// slots of the row (those past its end left unset and never read).
    fn row_fill(&self, code: &mut Code, path: RowPath, cached: &[usize]) {
        let inner = self.inner;
        let (groups, width) = self.row_cache_shape();
        for &a in cached {
            let ty = Cuda.storage_type(self.ir.loads[a].dtype);
            code.def(format!("c{a}"), format!("{ty} c{a}[{groups}][{width}];"));
        }
        code.stmt("#pragma unroll");
        if path == RowPath::RegistersVector {
            code.open(format!("for (int g = 0; g < {groups}; ++g)"));
            code.def(
                "j0",
                format!("const I j0 = ((I)g * (I)threads + tid) * (I){width};"),
            );
            code.open(format!("if (j0 < n{inner})"));
            for &a in cached {
                let fill = if self.ir.loads[a].axes[inner] == Axis::Unit {
                    format!("fbc_vload(c{a}[g], p.p{a} + rb{a} + j0);")
                } else {
                    let term = self.term(a, inner, "(j0 + (I)l)").unwrap_or_default();
                    format!(
                        "for (int l = 0; l < {width}; ++l) c{a}[g][l] = p.p{a}[rb{a} + {term}];"
                    )
                };
                code.stmt(self.vector_guarded(a, &format!("c{a}[g]"), fill));
            }
        } else {
            let slots = groups * width;
            code.open(format!("for (int s = 0; s < {slots}; ++s)"));
            code.def(
                format!("i{inner}"),
                format!("const I i{inner} = (I)s * (I)threads + tid;"),
            );
            code.open(format!("if (i{inner} < n{inner})"));
            for &a in cached {
                let term = self
                    .term(a, inner, &format!("i{inner}"))
                    .unwrap_or_default();
                let element = self.guarded(a, &format!("p.p{a}[rb{a} + {term}]"));
                code.stmt(format!("c{a}[s / {width}][s % {width}] = {element};"));
            }
        }
        code.close();
        code.close();
    }

    /// `fill`, the statement loading the vector `target` of load view `a` at `j0`, run only
    /// when the vector lies inside `a`'s range if `a` is an operand of a concat read along the
    /// rows; `target` holds the storage type's 0s outside it. The vector path runs only where
    /// every range starts and ends on a multiple of the vector width
    /// ([`abi::row_path`](crate::backend::cuda::abi::row_path)), so a vector lies wholly inside
    /// or outside each range and its first element decides.
    fn vector_guarded(&self, a: usize, target: &str, fill: String) -> String {
        match self.ir.range_views().get(a).copied().flatten() {
            Some((axis, r)) if axis == self.inner => {
                let ty = Cuda.storage_type(self.ir.loads[a].dtype);
                let (_, width) = self.row_cache_shape();
                format!(
                    "if (j0 >= rs{r} && j0 < re{r}) {{ {fill} }} else {{ for (int l = 0; l < {width}; ++l) {target}[l] = ({ty})0; }}"
                )
            }
            _ => fill,
        }
    }

    /// `element`, the stored element of load view `a` at the current `i{inner}`, read only
    /// inside its range when `a` is an operand of a concat read along the rows (the select
    /// never picks it elsewhere, and there it may lie outside the operand), else the storage
    /// type's 0.
    fn guarded(&self, a: usize, element: &str) -> String {
        let inner = self.inner;
        match self.ir.range_views().get(a).copied().flatten() {
            Some((axis, r)) if axis == inner => {
                let ty = Cuda.storage_type(self.ir.loads[a].dtype);
                format!("((i{inner} >= rs{r} && i{inner} < re{r}) ? {element} : ({ty})0)")
            }
            _ => element.to_string(),
        }
    }

    /// `sh{a}`: where cached load `a`'s row lives in the dynamic shared memory, each load's
    /// row rounded up to 16 bytes after the previous one's, as
    /// [`abi::row_shared_bytes`] sizes it.
    fn row_shared(&self, code: &mut Code, cached: &[usize]) {
        let inner = self.inner;
        code.def("cache", "unsigned char *const cache = fbc_row_cache();");
        let mut offset = String::new();
        for &a in cached {
            let dtype = self.ir.loads[a].dtype;
            let ty = Cuda.storage_type(dtype);
            let at = if offset.is_empty() {
                "cache".to_string()
            } else {
                format!("cache + {offset}")
            };
            code.def(
                format!("sh{a}"),
                format!("{ty} *const sh{a} = reinterpret_cast<{ty} *>({at});"),
            );
            let bytes = format!(
                "((U)n{inner} * (U){} + (U)15) / (U)16 * (U)16",
                dtype.size_bytes()
            );
            offset = if offset.is_empty() {
                bytes
            } else {
                format!("{offset} + {bytes}")
            };
        }
    }

    /// Slots of the register cache as `(G, W)`: `G` vectors of the row vector width `W`.
    fn row_cache_shape(&self) -> (usize, usize) {
        let width = abi::row_vector_width(self.ir).max(1);
        (abi::row_slots(self.ir).max(width) / width, width)
    }

    /// One pass's loop over the thread's elements: values, accumulation, and in the last pass
    /// the stores. A pass with relaxed sums ([`CudaKernelWriter::relaxed_sum`]) adds each chunk of at
    /// most [`SUM_CHUNK`] of the thread's elements into f32 partials (on the register paths
    /// the thread's slots are one chunk; the other paths walk the row in chunks), then joins
    /// each partial to its f64 total; a partial that is not finite is thrown away and its
    /// chunk added again in f64, so a sum is ±Inf or NaN exactly when the f64 sum is.
    fn row_pass_loop(&self, code: &mut Code, pl: &PassLoop) {
        let inner = self.inner;
        let sums: Vec<usize> = pl
            .reducing
            .iter()
            .copied()
            .filter(|&id| self.relaxed_sum(id))
            .collect();
        if sums.is_empty() {
            self.row_element_loop(code, pl, Acc::Main, false);
            return;
        }
        let chunked = matches!(pl.path, RowPath::Reread | RowPath::Shared);
        if chunked {
            code.open(format!(
                "for (U j0 = (U)threadIdx.x; j0 < (U)n{inner}; j0 += (U)threads * (U){SUM_CHUNK})"
            ));
        }
        for &id in &sums {
            code.def(format!("f{id}"), format!("float f{id} = 0.0f;"));
        }
        self.row_element_loop(code, pl, Acc::Main, chunked);
        for &id in &sums {
            code.open(format!("if (fbc_finitef(f{id}))"));
            code.stmt(format!("a{id} = fbc_sum2(a{id}, (double)f{id});"));
            code.close();
            code.open("else");
            code.comment("the f32 partial overflowed or met a NaN: the same elements in f64");
            self.row_element_loop(code, pl, Acc::Redo(id), chunked);
            code.close();
        }
        if chunked {
            code.close();
        }
    }

    /// The loop over the thread's elements of one pass on its path (of one chunk when
    /// `chunked`), each element's body written by [`CudaKernelWriter::row_element`].
    fn row_element_loop(&self, code: &mut Code, pl: &PassLoop, acc: Acc, chunked: bool) {
        let ir = self.ir;
        let inner = self.inner;
        let (groups, width) = self.row_cache_shape();
        let body = self.row_element(pl, acc);
        match pl.path {
            RowPath::Reread | RowPath::Shared => {
                if chunked {
                    code.open(format!("for (int s = 0; s < {SUM_CHUNK}; ++s)"));
                    code.def("j", "const U j = j0 + (U)s * (U)threads;");
                    code.stmt(format!("if (j >= (U)n{inner}) break;"));
                } else {
                    code.open(format!(
                        "for (U j = (U)threadIdx.x; j < (U)n{inner}; j += (U)threads)"
                    ));
                }
                code.splice(&body);
                code.close();
            }
            RowPath::Registers => {
                code.stmt("#pragma unroll");
                code.open(format!("for (int s = 0; s < {}; ++s)", groups * width));
                code.def(
                    format!("i{inner}"),
                    format!("const I i{inner} = (I)s * (I)threads + tid;"),
                );
                code.open(format!("if (i{inner} < n{inner})"));
                code.splice(&body);
                code.close();
                code.close();
            }
            RowPath::RegistersVector => {
                let unit = |view: &crate::lower::ir::View| view.axes[inner] == Axis::Unit;
                let mut group = Code::new();
                group.def(
                    "j0",
                    format!("const I j0 = ((I)g * (I)threads + tid) * (I){width};"),
                );
                group.open(format!("if (j0 < n{inner})"));
                for (a, view) in ir.loads.iter().enumerate() {
                    if unit(view) && !pl.cached.contains(&a) {
                        let ty = Cuda.storage_type(view.dtype);
                        group.def(format!("x{a}"), format!("{ty} x{a}[{width}];"));
                        group.def(
                            format!("x{a}"),
                            self.vector_guarded(
                                a,
                                &format!("x{a}"),
                                format!("fbc_vload(x{a}, p.p{a} + rb{a} + j0);"),
                            ),
                        );
                    }
                }
                let vector_stores = self.row_vector_stores(pl);
                for &k in &vector_stores {
                    let ty = Cuda.storage_type(ir.stores[k].view.dtype);
                    group.def(format!("y{k}"), format!("{ty} y{k}[{width}];"));
                }
                group.stmt("#pragma unroll");
                group.open(format!("for (int l = 0; l < {width}; ++l)"));
                group.splice(&body);
                group.close();
                for &k in &vector_stores {
                    let arg = self.ir.store_arg(k);
                    let write = format!("fbc_vstore(p.p{arg} + rb{arg} + j0, y{k});");
                    if (0..inner).any(|d| ir.stores[k].view.axes[d] == Axis::Broadcast) {
                        group.stmt(format!("if (ok{k}) {write}"));
                    } else {
                        group.stmt(write);
                    }
                }
                group.close();
                code.stmt("#pragma unroll");
                code.open(format!("for (int g = 0; g < {groups}; ++g)"));
                code.splice(&group);
                code.close();
            }
        }
    }

    /// The stores of this pass that the vector path writes as whole vectors (those
    /// contiguous along the row), after each group's lane loop.
    fn row_vector_stores(&self, pl: &PassLoop) -> Vec<usize> {
        pl.looped
            .iter()
            .copied()
            .filter(|&k| self.ir.stores[k].view.axes[self.inner] == Axis::Unit)
            .collect()
    }

    /// One element's work in one pass, the same on every path but for where the element's
    /// index, its loads and its kept values come from: the values of the pass, the shared
    /// cache filled on first reading and the kept values written in their keeping pass, the
    /// accumulation (`acc`), and the stores. A `Redo` body only adds its sum again in f64: it
    /// fills nothing and keeps nothing (the main body did), and on the shared path reads
    /// its loads from global memory, as a kept value may by now lie over a cached row.
    fn row_element(&self, pl: &PassLoop, acc: Acc) -> Code {
        let ir = self.ir;
        let inner = self.inner;
        let (_, width) = self.row_cache_shape();
        let redo = acc != Acc::Main;
        let mut body = Code::new();
        let slot = match pl.path {
            RowPath::RegistersVector => {
                body.def(
                    format!("i{inner}"),
                    format!("const I i{inner} = j0 + (I)l;"),
                );
                "[g][l]".to_string()
            }
            RowPath::Registers => format!("[s / {width}][s % {width}]"),
            RowPath::Reread | RowPath::Shared => {
                body.def(format!("i{inner}"), format!("const I i{inner} = (I)j;"));
                String::new()
            }
        };
        self.element_bases(&mut body, true);
        let mut filled = Vec::new();
        if pl.path == RowPath::Shared && !redo {
            for &a in pl.cached {
                if pl.first_reader[a] == Some(pl.pass) {
                    let ty = Cuda.storage_type(ir.loads[a].dtype);
                    let element = self.guarded(a, &format!("p.p{a}[b{a}]"));
                    body.def(format!("e{a}"), format!("const {ty} e{a} = {element};"));
                    body.stmt(format!("sh{a}[i{inner}] = e{a};"));
                    filled.push(a);
                }
            }
        }
        let overwritten: Vec<usize> = pl
            .kept
            .iter()
            .filter_map(|&(_, save, place)| match place {
                Place::Registers(a) if save == pl.pass => Some(a),
                _ => None,
            })
            .collect();
        let load = |view: usize| {
            let cached = pl.cached.contains(&view);
            match pl.path {
                RowPath::Shared if filled.contains(&view) => format!("e{view}"),
                RowPath::Shared
                    if !redo && cached && pl.first_reader[view].is_some_and(|f| f < pl.pass) =>
                {
                    format!("sh{view}[i{inner}]")
                }
                // A redo runs after its main loop has written the pass's kept values over
                // their loads' slots: such a load comes from global memory again.
                RowPath::Registers | RowPath::RegistersVector
                    if redo && overwritten.contains(&view) =>
                {
                    self.element(view, Lane::Scalar)
                }
                RowPath::Registers | RowPath::RegistersVector if cached => format!("c{view}{slot}"),
                RowPath::RegistersVector if ir.loads[view].axes[inner] == Axis::Unit => {
                    format!("x{view}[l]")
                }
                _ => self.element(view, Lane::Scalar),
            }
        };
        let place = |id: usize| -> Option<String> {
            pl.kept
                .iter()
                .find(|k| k.0 == id)
                .map(|&(_, _, place)| match place {
                    Place::Shared(a) => format!("sh{a}[i{inner}]"),
                    Place::Registers(a) => format!("c{a}{slot}"),
                })
        };
        // Read back in the passes after the keeping one, and in the keeping pass's own f64
        // redo (its main loop has written the whole chunk by then). A redo evaluates again
        // what lay where its main loop has kept another value.
        let replaced = |id: usize, at: Place| {
            redo && pl
                .kept
                .iter()
                .any(|&(other, save, p)| other != id && save == pl.pass && p == at)
        };
        let kept = |id: usize| -> Option<String> {
            pl.kept
                .iter()
                .find(|&&(k, save, at)| {
                    k == id && (save < pl.pass || (redo && save == pl.pass)) && !replaced(k, at)
                })
                .and_then(|_| place(id))
        };
        self.row_values(&mut body, pl.pass, &load, &kept);
        if !redo {
            for &(id, save, _) in pl.kept {
                if save == pl.pass
                    && let Some(at) = place(id)
                {
                    body.stmt(format!("{at} = v{id};"));
                }
            }
        }
        self.row_accumulate(&mut body, pl.reducing, acc);
        if !redo {
            let vector_stores = if pl.path == RowPath::RegistersVector {
                self.row_vector_stores(pl)
            } else {
                Vec::new()
            };
            for &k in pl.looped {
                if vector_stores.contains(&k) {
                    let store = &ir.stores[k];
                    let value = Cuda.store(store.view.dtype, &format!("v{}", store.value));
                    // Read by the vector store after the lane loop, outside this body,
                    // whose definitions are pruned on their own: a line that stays.
                    body.stmt(format!("y{k}[l] = {value};"));
                } else {
                    self.row_store(&mut body, k);
                }
            }
        }
        body
    }

    /// `v{id}` for every value of level at most `pass` at the current element, loads read
    /// through `load` (or through their index map's positions), values an earlier pass kept
    /// read where `kept` says, and divisions by a row constant multiplied by the row's
    /// reciprocal where `rk{id}` allows it.
    fn row_values(
        &self,
        code: &mut Code,
        pass: usize,
        load: &dyn Fn(usize) -> String,
        kept: &dyn Fn(usize) -> Option<String>,
    ) {
        let ir = self.ir;
        let divisors = ir.row_constant_divisors();
        for (id, &level) in ir.levels().iter().enumerate() {
            if level > pass {
                continue;
            }
            let ty = Cuda.value_type(ir.prec(id));
            let definition = match (&ir.body[id], divisors[id]) {
                _ if kept(id).is_some() => {
                    format!("const {ty} v{id} = {};", kept(id).unwrap_or_default())
                }
                (&Instr::Binary { a, .. }, Some(b)) => format!(
                    "const {ty} v{id} = rk{id} ? __fmul_rn(v{a}, rc{id}) : __fdiv_rn(v{a}, v{b});"
                ),
                (&Instr::Load { view }, _) if ir.loads[view].is_mapped() => {
                    self.positions(code, view, id, Lane::Scalar);
                    let last = ir.loads[view].stages.len();
                    Cuda.definition(ir, id, |_| format!("p.p{view}[q{id}_{last}]"))
                }
                // Never cached (`abi::row_cached`): read where the index puts it.
                (
                    &Instr::GatherLoad {
                        view,
                        index,
                        gather,
                    },
                    _,
                ) => Cuda.definition(ir, id, |_| {
                    format!("p.p{view}[b{view} + {}]", gather_offset(index, gather))
                }),
                _ => Cuda.definition(ir, id, load),
            };
            code.def(format!("v{id}"), definition);
        }
    }

    /// The accumulation of the row reductions `reducing` at the current element: relaxed
    /// sums into their f32 partials, the rest into their accumulators; or, for `Redo(id)`,
    /// sum `id` alone in f64.
    fn row_accumulate(&self, code: &mut Code, reducing: &[usize], acc: Acc) {
        let ir = self.ir;
        for &id in reducing {
            let Some(Accumulator { kind, .. }) = self.row_acc(id) else {
                continue;
            };
            let Instr::RowReduce { x, .. } = ir.body[id] else {
                continue;
            };
            match acc {
                Acc::Redo(only) if only != id => continue,
                Acc::Redo(_) => {
                    code.stmt(format!("a{id} = fbc_sum2(a{id}, (double)v{x});"));
                    continue;
                }
                Acc::Main if self.relaxed_sum(id) => {
                    code.stmt(format!("f{id} = __fadd_rn(f{id}, v{x});"));
                    continue;
                }
                Acc::Main => {}
            }
            if self.float_max(id) {
                code.stmt(format!("m{id} = fbc_maxf(m{id}, v{x});"));
                continue;
            }
            let value = match ir.prec(x) {
                Prec::F32 => format!("(double)v{x}"),
                Prec::F64 | Prec::I64 => format!("v{x}"),
            };
            let combine = if kind == ReduceKind::Max {
                "fbc_max2"
            } else {
                "fbc_sum2"
            };
            code.stmt(format!("a{id} = {combine}(a{id}, {value});"));
        }
    }

    /// `b{a}` for every load and store: the row's start, plus the inner coordinate's term
    /// when `moving` (in the element loops; at inner index 0 otherwise).
    fn element_bases(&self, code: &mut Code, moving: bool) {
        let inner = self.inner;
        for arg in self.ir.pointwise_args() {
            let term = if moving {
                self.term(arg, inner, &format!("i{inner}"))
            } else {
                None
            };
            let index = match term {
                Some(t) => format!("rb{arg} + {t}"),
                None => format!("rb{arg}"),
            };
            code.def(format!("b{arg}"), format!("const I b{arg} = {index};"));
        }
    }

    /// Store `k` at the current element, guarded by `ok{k}` when it is broadcast along an
    /// outer axis.
    fn row_store(&self, code: &mut Code, k: usize) {
        let store = &self.ir.stores[k];
        let arg = self.ir.store_arg(k);
        let value = Cuda.store(store.view.dtype, &format!("v{}", store.value));
        let write = format!("{} = {value};", self.element(arg, Lane::Scalar));
        let outer_broadcast = (0..self.inner).any(|d| store.view.axes[d] == Axis::Broadcast);
        if outer_broadcast {
            code.stmt(format!("if (ok{k}) {write}"));
        } else {
            code.stmt(write);
        }
    }
}
