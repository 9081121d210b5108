//! Row kernels on CUDA: one block per row, the passes of [`KernelIr::levels`] as loops of the
//! block's threads over the row, and a block-wide combination after each.
//!
//! The block takes rows `blockIdx.x`, `blockIdx.x + gridDim.x`, … (the host caps the grid,
//! [`abi::plan`](crate::backend::cuda::abi::plan)), and its `blockDim.x` threads (a power of
//! two from 32 to `FBC_BLOCK`, chosen from the row length at launch by
//! [`abi::row_block`](crate::backend::cuda::abi::row_block)) stride over the row's elements,
//! so neighbouring threads read neighbouring elements. Pass `p` evaluates, at each element a
//! thread visits, the values of level at most `p` and accumulates the row reductions of level
//! `p + 1` per thread — floats in `double`, integers in wrapping `long long`, max with NaN
//! winning (`fbc_max2`), exactly the accumulators of the reductions that end kernels. Then
//! `fbc_group` combines the threads' partials (warp shuffles, then the warps in order through
//! shared memory) and hands the row's result to every thread, which divides a mean by the
//! row length (0/0 = NaN for an empty row), rounds it once to its dtype as `r{id}` and reads
//! it as a constant in the later passes. The last pass writes the stores; a store with one
//! element per row is written after it by thread 0, from the row's results at inner index 0,
//! so an empty row still gets its sum of 0 or mean of NaN, as on the CPU and in the
//! interpreter.
//!
//! Loads are read again in every pass, from L1/L2 after the first: a row of a few thousand
//! elements stays in cache between passes, and holding it in registers or shared memory would
//! tie the kernel to a maximum row length, which the size-free kernel cannot know.
//!
//! Every thread of the block reaches every combination (the row loop's bounds are the same
//! for the whole block, and the element loops end before it), as the barriers and full-warp
//! shuffles require. The order of accumulation differs from the CPU's, so float sums may
//! differ in their last bits, as between any two summation orders; maxima, integer sums and
//! every pointwise value are exact.

use super::code::Code;
use super::expr::{Cuda, identity};
use super::{Kernel, Lane};
use crate::backend::spelling::Spelling;
use crate::lower::ir::{Axis, Instr, KernelIr, Prec, ReduceKind};

impl Kernel<'_> {
    /// Row reduction `id`'s kind and whether it accumulates integers, or `None` for any
    /// other instruction.
    fn row_reduce(&self, id: usize) -> Option<(ReduceKind, bool)> {
        match self.ir.body[id] {
            Instr::RowReduce { kind, x, .. } => Some((kind, self.ir.prec(x) == Prec::I64)),
            _ => None,
        }
    }

    /// The body of a row kernel (see the module documentation). Names beyond the emitter's:
    /// `row` the row index, `rb{a}` argument `a`'s element index at the row's start, `a{id}`
    /// the accumulator and `r{id}` the result of row reduction `id`, `ok{k}` whether store
    /// `k` (broadcast along some outer axis) writes this row.
    pub(super) fn row_body(&self) -> Code {
        let ir: &KernelIr = self.ir;
        let inner = self.inner;
        let outer: Vec<usize> = (0..inner).collect();
        let levels = ir.levels();
        let passes = ir.passes();
        let per_row = |k: usize| ir.stores[k].view.axes[inner] == Axis::Broadcast;
        let mut code = Code::new();
        self.preamble(&mut code);
        code.def("rows", format!("const U rows = {};", self.product(&outer)));
        code.def("threads", "const int threads = (int)blockDim.x;");
        code.def("smem", "__shared__ double smem[FBC_BLOCK / 32];");
        code.def("smemi", "__shared__ long long smemi[FBC_BLOCK / 32];");
        code.comment("one block per row; its threads stride over the row's elements");
        code.open("for (U row = (U)blockIdx.x; row < rows; row += (U)gridDim.x)");
        self.decompose(&mut code, "(I)row", &outer, "rem");
        for arg in 0..ir.loads.len() + ir.stores.len() {
            code.def(
                format!("rb{arg}"),
                format!("const I rb{arg} = {};", self.index(arg, &outer)),
            );
        }
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
        for pass in 0..passes {
            let last = pass + 1 == passes;
            let reducing: Vec<usize> = (0..ir.body.len())
                .filter(|&id| levels[id] == pass + 1 && self.row_reduce(id).is_some())
                .collect();
            let looped: Vec<usize> = if last {
                (0..ir.stores.len()).filter(|&k| !per_row(k)).collect()
            } else {
                Vec::new()
            };
            for &id in &reducing {
                let Some((kind, int)) = self.row_reduce(id) else {
                    continue;
                };
                let ty = if int { "long long" } else { "double" };
                let start = identity(kind == ReduceKind::Max, int);
                code.def(format!("a{id}"), format!("{ty} a{id} = {start};"));
            }
            if !reducing.is_empty() || !looped.is_empty() {
                let mut body = Code::new();
                body.def(format!("i{inner}"), format!("const I i{inner} = (I)j;"));
                self.element_bases(&mut body, true);
                for (id, &level) in levels.iter().enumerate() {
                    if level <= pass {
                        let definition =
                            Cuda.definition(ir, id, |view| self.element(view, Lane::Scalar));
                        body.def(format!("v{id}"), definition);
                    }
                }
                for &id in &reducing {
                    let Some((kind, _)) = self.row_reduce(id) else {
                        continue;
                    };
                    let Instr::RowReduce { x, .. } = ir.body[id] else {
                        continue;
                    };
                    let value = match ir.prec(x) {
                        Prec::F32 => format!("(double)v{x}"),
                        Prec::F64 | Prec::I64 => format!("v{x}"),
                    };
                    let combine = if kind == ReduceKind::Max {
                        "fbc_max2"
                    } else {
                        "fbc_sum2"
                    };
                    body.stmt(format!("a{id} = {combine}(a{id}, {value});"));
                }
                for &k in &looped {
                    self.row_store(&mut body, k);
                }
                code.open(format!(
                    "for (U j = (U)threadIdx.x; j < (U)n{inner}; j += (U)threads)"
                ));
                code.splice(&body);
                code.close();
            }
            for &id in &reducing {
                let Some((kind, int)) = self.row_reduce(id) else {
                    continue;
                };
                let Instr::RowReduce { dtype, .. } = ir.body[id] else {
                    continue;
                };
                let max = kind == ReduceKind::Max;
                let smem = if int { "smemi" } else { "smem" };
                // Every thread gets the row's result; the barriers inside make this a line
                // with effects, kept even if nothing read the result.
                code.stmt(format!("a{id} = fbc_group<{max}>(a{id}, threads, {smem});"));
                if kind == ReduceKind::Mean && !int {
                    code.def(
                        format!("a{id}"),
                        format!("a{id} = __ddiv_rn(a{id}, (double)n{inner});"),
                    );
                }
                let held = if int { Prec::I64 } else { Prec::F64 };
                code.def(
                    format!("r{id}"),
                    format!(
                        "const {} r{id} = {};",
                        Cuda.value_type(Prec::of(dtype)),
                        Cuda.round(held, dtype, &format!("a{id}"))
                    ),
                );
            }
        }
        // One element per row: from the row's results, at inner index 0, by one thread.
        let rows: Vec<usize> = (0..ir.stores.len()).filter(|&k| per_row(k)).collect();
        if !rows.is_empty() {
            let mut body = Code::new();
            self.element_bases(&mut body, false);
            for id in 0..ir.body.len() {
                let definition = Cuda.definition(ir, id, |view| self.element(view, Lane::Scalar));
                body.def(format!("v{id}"), definition);
            }
            for &k in &rows {
                self.row_store(&mut body, k);
            }
            code.open("if (threadIdx.x == 0)");
            code.splice(&body);
            code.close();
        }
        code.close();
        code
    }

    /// `b{a}` for every load and store: the row's start, plus the inner coordinate's term
    /// when `moving` (in the element loops; at inner index 0 otherwise).
    fn element_bases(&self, code: &mut Code, moving: bool) {
        let inner = self.inner;
        for arg in 0..self.ir.loads.len() + self.ir.stores.len() {
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
        let arg = self.store_arg(k);
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
