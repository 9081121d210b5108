//! The rows strategy: every reduction reduces exactly the innermost axis, so each row is
//! owned by one thread, which reduces it chunk by chunk and stores the results; no shared
//! state. Rows read by a stride are walked in tiles of [`TILE_ROWS`] rows.
use super::{CKernelWriter, Mode, Out};
use crate::backend::cpu::emit::{CHUNK, TILE_ROWS};

impl CKernelWriter<'_> {
    pub(super) fn rows(&self, out: &mut Out) {
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
    pub(super) fn plain_rows(&self, out: &mut Out) {
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
    pub(super) fn finish_row(&self, out: &mut Out, acc: impl Fn(usize) -> String) {
        for r in 0..self.ir.reductions.len() {
            let at = self.row_base(self.ir.reduction_arg(r));
            out.open("");
            out.line(format!("{} a = {};", self.acc_type(r), acc(r)));
            self.finish(out, r, &at);
            out.close();
        }
    }

    /// [`CKernelWriter::rows`] for kernels that read rows by a stride: each thread takes
    /// [`TILE_ROWS`] rows at a time and walks them together, a step of elements of each in
    /// turn ([`CKernelWriter::tile_columns`]). The rows of a transposed view are neighbouring columns of its buffer, so
    /// the tile's rows share every cache line and page the first of them touches, where row
    /// after row would come back to each line and page once per row, long after it left the
    /// caches and the TLB (a `[4096, 4096]` f32 transposed is 16 KiB between elements: four
    /// pages). Each row keeps its accumulators between its chunks, which it meets in order,
    /// so every row's results are its chunks' results combined in the same order as before,
    /// in chunks of one step.
    pub(super) fn row_tiles(&self, out: &mut Out) {
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
}
