//! What every reducing strategy (rows, columns, partials) shares: each reduction's output
//! count and place in a block of accumulators, its accumulator as the lowering decides it
//! ([`Accumulator`]), spelled in C, and the rounding and store of its results.
use super::{Accumulate, CKernelWriter, Mode, Out};
use crate::backend::cpu::emit::PARALLEL_MIN;
use crate::backend::cpu::emit::expr::C;
use crate::backend::spelling::Spelling;
use crate::lower::accumulate::Accumulator;
use crate::lower::ir::ReduceKind;

impl CKernelWriter<'_> {
    /// Per reduction: output count, dense strides over kept axes, element count (for means),
    /// and its place in a block of accumulators.
    pub(super) fn reduction_preamble(&self, out: &mut Out) {
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

    /// Reduction `r`'s accumulator, as the lowering decides it for every backend.
    pub(super) fn acc(&self, r: usize) -> Accumulator {
        Accumulator::of_reduction(&self.ir.reductions[r])
    }

    /// Whether reduction `r` accumulates exact integers in `int64_t` (wrapping, through
    /// unsigned arithmetic) instead of `double`.
    pub(super) fn integer(&self, r: usize) -> bool {
        self.acc(r).is_integer()
    }

    /// The C type of reduction `r`'s accumulators.
    pub(super) fn acc_type(&self, r: usize) -> &'static str {
        C.value_type(self.acc(r).prec)
    }

    pub(super) fn identity(&self, r: usize) -> String {
        C.identity(&self.acc(r))
    }

    /// `acc` combined with `x`, for reduction `r`.
    pub(super) fn merge(&self, r: usize, acc: &str, x: &str) -> String {
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
    pub(super) fn accumulators(&self, r: usize, block: &str, offset: &str) -> String {
        if self.integer(r) {
            format!("int64_t *q{r} = (int64_t *)({block} + {offset});")
        } else {
            format!("double *q{r} = {block} + {offset};")
        }
    }

    /// The store of an accumulated result `a` of reduction `r` at index `at` of its output;
    /// in the form run per tile, `a` merged into the accumulator there.
    pub(super) fn finish(&self, out: &mut Out, r: usize, at: &str) {
        let red = &self.ir.reductions[r];
        let arg = self.ir.reduction_arg(r);
        if self.slots {
            let merged = self.merge(r, &format!("p{arg}[{at}]"), "a");
            out.line(format!("p{arg}[{at}] = {merged};"));
            return;
        }
        if red.kind == ReduceKind::Mean {
            out.line(format!("a = a / cnt{r};"));
        }
        let held = self.acc(r).result_prec();
        let value = C.store(red.view.dtype, &C.round(held, red.view.dtype, "a"));
        out.line(format!("p{arg}[{at}] = {value};"));
    }

    /// Initialises accumulators `q{r}[0..on{r}]` to each reduction's identity.
    pub(super) fn init_accumulators(&self, out: &mut Out, parallel: bool) {
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
    pub(super) fn finalize(&self, out: &mut Out, source: impl Fn(usize) -> Vec<String>) {
        self.finalize_at(out, source, |_| Vec::new());
    }

    /// [`Self::finalize`] with statements `at_source(r)` after the output's place `at` in its
    /// buffer is known, before the store.
    pub(super) fn finalize_at(
        &self,
        out: &mut Out,
        source: impl Fn(usize) -> Vec<String>,
        at_source: impl Fn(usize) -> Vec<String>,
    ) {
        for (r, red) in self.ir.reductions.iter().enumerate() {
            let arg = self.ir.reduction_arg(r);
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
            for line in at_source(r) {
                out.line(line);
            }
            self.finish(out, r, "at");
            out.close();
        }
    }

    pub(super) fn accumulate(&self, mode: Mode, r: usize) -> Accumulate {
        let inner_reduced = self.ir.reductions[r].reduced[self.inner];
        match mode {
            Mode::Pointwise => unreachable!("pointwise kernels have no reductions"),
            Mode::Rows => Accumulate::IntoRow,
            Mode::Partials if inner_reduced => Accumulate::IntoSlot,
            Mode::Columns | Mode::Partials => Accumulate::Column,
        }
    }
}
