//! The columns strategy: every reduction keeps the innermost axis. Threads own disjoint
//! column ranges and walk all rows in order, accumulating into one shared `double` buffer
//! per output; no per-thread copies.
use super::{CKernelWriter, Mode, Out};
use crate::backend::cpu::emit::{CHUNK, COLUMN_PREFETCH_MIN_BYTES, COLUMN_PREFETCH_ROWS};
use crate::lower::ir::Axis;

impl CKernelWriter<'_> {
    pub(super) fn columns(&self, out: &mut Out) {
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

    /// In the column walk, where a thread reads a narrow strip of every row in turn, a hint
    /// to fetch the strip [`COLUMN_PREFETCH_ROWS`] rows further on for every load that moves
    /// along the rows, in launches whose loads read more than [`COLUMN_PREFETCH_MIN_BYTES`]
    /// (`pf`, set by [`CKernelWriter::columns`]). Each strip starts a new page, where the hardware
    /// prefetchers stop, so without the hint every strip waits for memory once the body is long
    /// enough to keep the core from reaching the next rows' loads early (a `tanh` before the
    /// sum). Smaller launches mostly find their rows in the cache, where the hints only cost
    /// instructions. A hint never faults, so a row past the end needs no test; the address is
    /// formed as an integer.
    pub(super) fn prefetch_rows_ahead(&self, out: &mut Out) {
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
}
