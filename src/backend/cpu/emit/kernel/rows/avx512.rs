//! The AVX-512 loops of a row kernel's passes: each pass first runs over the row's whole
//! vectors of 16 with intrinsics (the same operations as the scalar `omp simd` loop, which
//! finishes the row), float sums in f32 blocks of [`SUM_BLOCK`] elements, maxima in
//! [`MAX_CHAINS`] chains where a pass only takes maxima.
use super::{CKernelWriter, Lag, Loop, MAX_CHAINS, Out, SUM_BLOCK, row_exps};
use crate::backend::cpu::emit::expr::C;
use crate::backend::cpu::emit::vector;
use crate::backend::spelling::Spelling;
use crate::lower::accumulate::Accumulator;
use crate::lower::ir::{Instr, ReduceKind};

impl CKernelWriter<'_> {
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
    pub(super) fn vector_loop(&self, out: &mut Out, lp: &Loop, flush: Option<&Lag>) {
        let ir = self.ir;
        let (reducing, looped) = (&lp.pass.reducing, &lp.pass.looped);
        let all_sums: Vec<usize> = reducing
            .iter()
            .copied()
            .filter(|&id| matches!(ir.body[id], Instr::RowReduce { kind, .. } if kind != ReduceKind::Max))
            .collect();
        // Exact arithmetic adds every vector into the f64 accumulators as it comes, with no
        // f32 blocks.
        let (sums, f64_sums): (Vec<usize>, Vec<usize>) = all_sums.iter().partition(|&&id| {
            Accumulator::of_row_reduce(ir, id).is_some_and(|acc| acc.f32_partials)
        });
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
    pub(super) fn vector_steps(
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
    pub(super) fn destinations(&self, out: &mut Out, looped: &[usize], lagged: bool) {
        for &k in looped {
            let arg = self.ir.store_arg(k);
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
    pub(super) fn prefetch(&self, out: &mut Out, lp: &Loop, flush: Option<&Lag>) {
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
    /// operand's segment takes a step of its own for that segment ([`CKernelWriter::segment_steps`]).
    pub(super) fn vector_step(&self, out: &mut Out, lp: &Loop, f64_sums: &[usize], c: usize) {
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
    pub(super) fn segment_steps(&self, lp: &Loop) -> Vec<String> {
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

    /// [`CKernelWriter::vector_step`] for the vectors of `segment` (see [`CKernelWriter::segment_steps`]),
    /// or any vector (`None`).
    pub(super) fn vector_step_in(
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
    pub(super) fn vector_values(&self, out: &mut Out, lp: &Loop, segment: Option<usize>) {
        let in_segment = segment.and_then(|k| Some((k, self.ir.row_select_ranges()?)));
        let ir = self.ir;
        let live = vector::live(ir);
        let reciprocals = self.ir.row_constant_divisors();
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
