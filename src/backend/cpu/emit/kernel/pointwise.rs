//! The pointwise strategy: a kernel without reductions, its domain cut into work items of at
//! most [`CHUNK`] elements of one row spread over the threads, or walked in tiles of
//! [`TILE_ROWS`] rows when a load reads its rows by a stride (the tiles serve the row
//! reductions' walk too, [`super::reduce_rows`]).
use super::{CKernelWriter, Mode, Out};
use crate::backend::cpu::emit::{CHUNK, TILE_COLUMNS, TILE_COLUMNS_ALIASED, TILE_ROWS};
use crate::lower::ir::Axis;

impl CKernelWriter<'_> {
    pub(super) fn pointwise(&self, out: &mut Out) {
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
    pub(super) fn tiled_or(
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
    pub(super) fn chunks(&self, out: &mut Out) {
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

    /// The loops of a tiled walk over threads: tiles of [`TILE_ROWS`] rows `ob .. oe`, and in
    /// each, a step of `tc` elements (`j0`, `len`; [`CKernelWriter::tile_columns`]) of each row `o`
    /// in turn. `start` and
    /// `end` write what a tile does before and after its walk, `step` the work at one row's
    /// elements.
    pub(super) fn tiles(
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
    pub(super) fn tile_columns(&self) -> String {
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

    /// Whether some load moves along the rows by a run-time stride (a transposed or strided
    /// view): reading one row then touches a new cache line and, past a few KiB of stride, a
    /// new page at every element.
    pub(super) fn strided_rows(&self) -> bool {
        self.ir
            .loads
            .iter()
            .any(|v| v.axes[self.inner] == Axis::Strided)
    }
}
