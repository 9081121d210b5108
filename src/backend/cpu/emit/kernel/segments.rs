//! One segment of a row (inner indices `j0 .. j0 + len` at the current outer coordinates),
//! whatever the strategy: the body in vector loops, the stores, and each reduction's values
//! handed over as the strategy's [`Mode`] says.
use super::{Accumulate, CKernelWriter, Mode, Out};
use crate::backend::cpu::emit::expr::C;
use crate::backend::cpu::emit::fission::LoopStatement;
use crate::backend::cpu::emit::{CHUNK, vector};
use crate::backend::spelling::Spelling;
use crate::lower::ir::{Axis, ReduceKind};

impl CKernelWriter<'_> {
    /// One segment: inner indices `j0 .. j0 + len` of the row at outer coordinates `i{d}`.
    /// Computes the body in a vector loop, stores, and feeds the reductions per `mode`. A
    /// kernel cut inside its nest does that with the pieces the segment's elements lie in:
    /// along an outer axis the piece its row's coordinate selects (the select's own rule, the
    /// first range ending after it, else the last); along the innermost axis each piece over
    /// the part of `j0 .. j0 + len` inside its range (the ranges tile the axis), as a segment
    /// of its own whose `j0` and `len` shadow the row segment's.
    pub(super) fn segment(&self, out: &mut Out, mode: Mode) {
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

    /// [`CKernelWriter::segment`] for a kernel evaluated as written.
    pub(super) fn plain_segment(&self, out: &mut Out, mode: Mode) {
        let ir = self.ir;
        out.open("");
        // Base indices of loads and stores at (i, j0).
        for arg in ir.pointwise_args() {
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
        let (mut in_loop, after_loop) = self.segment_stores(out);
        // Reductions, in the last loop.
        let (clauses, merges) = self.segment_reductions(out, mode, &mut in_loop);
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

    /// The stores of a segment: the statements the loops run at each element (contiguous or
    /// strided destinations, through a scratch row where an outer index skips the row), and
    /// those run once after them (stores broadcast along the inner axis), declaring what
    /// they need in `out`.
    fn segment_stores(&self, out: &mut Out) -> (Vec<LoopStatement>, Vec<String>) {
        let ir = self.ir;
        let mut in_loop = Vec::new();
        let mut after_loop = Vec::new();
        for (k, store) in ir.stores.iter().enumerate() {
            let arg = self.ir.store_arg(k);
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
        (in_loop, after_loop)
    }

    /// The reductions of a segment, accumulated as `mode` says: their statements joined to
    /// `in_loop` (in the last loop), and the `omp simd` clauses of that loop and the merges
    /// after it, declaring their partial accumulators in `out`.
    fn segment_reductions(
        &self,
        out: &mut Out,
        mode: Mode,
        in_loop: &mut Vec<LoopStatement>,
    ) -> (Vec<String>, Vec<String>) {
        let ir = self.ir;
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
        (clauses, merges)
    }

    /// The vector loop(s) over `j` of one segment: the body, then `in_loop`'s statements
    /// (stores and accumulations). `pragma` goes on
    /// the last loop, which holds any reduction. With one stage this is the single fused loop;
    /// with more, each loop computes one stage of the body and hands the values later stages
    /// read through stack arrays of one chunk (see [`Stages`]).
    pub(super) fn loops(&self, out: &mut Out, pragma: &str, in_loop: &[LoopStatement]) {
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
