//! The passes a row kernel makes over each row ([`crate::lower::ir`]'s execution model),
//! planned once for every backend: which row reductions each pass accumulates, which stores
//! it writes, what it evaluates at each element for its own sake, and which divisions may
//! multiply by a row reciprocal once it ends. The C and CUDA row emitters both walk this
//! plan, so they cannot split a row's work into different passes.

use crate::lower::ir::{Axis, Instr, KernelIr, ValueId};

/// One pass over a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPass {
    /// Its index, from 0.
    pub index: usize,
    /// Whether it is the last pass, which stores.
    pub last: bool,
    /// The row reductions it accumulates: those of level `index + 1`, in value order.
    pub reducing: Vec<ValueId>,
    /// The stores it writes element by element (those moving along the row; the last pass's
    /// only), in store order.
    pub looped: Vec<usize>,
    /// What it evaluates at each element for its own sake: the operands of `reducing`, then
    /// the values of `looped` ([`KernelIr::row_pass_roots`]).
    pub reads: Vec<ValueId>,
    /// The divisions by a row constant ([`KernelIr::row_constant_divisors`]) whose divisor
    /// is known once this pass's reductions are: `(division, divisor)`, in value order. The
    /// divisor's reciprocal is formed once per row, after the pass.
    pub reciprocals: Vec<(ValueId, ValueId)>,
}

/// Every pass of a row kernel, and the stores written once per row after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPlan {
    pub passes: Vec<RowPass>,
    /// The stores broadcast along the row (one element per row), written after the passes
    /// at inner index 0 from the row's results, in store order.
    pub per_row: Vec<usize>,
}

impl KernelIr {
    /// Whether store `k` of a row kernel has one element per row: it is broadcast along the
    /// innermost axis.
    pub fn stores_per_row(&self, k: usize) -> bool {
        self.stores[k].view.axes[self.rank.saturating_sub(1)] == Axis::Broadcast
    }

    /// The plan of a row kernel's passes (one pass for any other kernel).
    pub fn row_plan(&self) -> RowPlan {
        let passes = self.passes();
        let levels = self.levels();
        let divisors = self.row_constant_divisors();
        let plan = (0..passes)
            .map(|index| {
                let last = index + 1 == passes;
                RowPass {
                    index,
                    last,
                    reducing: (0..self.body.len())
                        .filter(|&id| {
                            levels[id] == index + 1
                                && matches!(self.body[id], Instr::RowReduce { .. })
                        })
                        .collect(),
                    looped: (0..self.stores.len())
                        .filter(|&k| last && !self.stores_per_row(k))
                        .collect(),
                    reads: self.row_pass_roots(index),
                    reciprocals: divisors
                        .iter()
                        .enumerate()
                        .filter_map(|(id, divisor)| divisor.map(|b| (id, b)))
                        .filter(|&(_, b)| levels[b] == index + 1)
                        .collect(),
                }
            })
            .collect();
        RowPlan {
            passes: plan,
            per_row: (0..self.stores.len())
                .filter(|&k| self.stores_per_row(k))
                .collect(),
        }
    }
}
