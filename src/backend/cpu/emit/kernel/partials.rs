//! The partials strategy: the general case of reductions (and the fallback when rows or
//! columns would leave threads idle). Work items are split statically among threads; each
//! thread accumulates into its own buffer of outputs, and the buffers are combined in thread
//! order at the end.
use super::{CKernelWriter, Mode, Out};
use crate::backend::cpu::emit::CHUNK;

impl CKernelWriter<'_> {
    pub(super) fn partials(&self, out: &mut Out) {
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
}
