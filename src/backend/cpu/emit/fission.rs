//! Loop fission: the body of a segment split into consecutive vector loops at each level of
//! transcendental depth ([`Stages`]), and the statements placed in those loops
//! ([`LoopStatement`]).
//!
//! It is a plan only: which loop computes each value and which values cross loops. The
//! kernel emitter writes the loops from it (`CKernelWriter::loops`), so the split changes the
//! schedule of the work, never the operations or their order per element, and the results
//! are the same bits with one loop or several.

use super::CHUNK;
use super::has_libmvec_variant;
use crate::lower::ir::{Instr, KernelIr, Prec};

/// A statement of the vector loop after the body: a store or an accumulation.
pub(super) struct LoopStatement {
    /// The loop it goes in (1-based, see [`Stages`]).
    pub(super) stage: usize,
    /// The body value it reads.
    pub(super) reads: usize,
    pub(super) text: String,
    /// The same statement over 16 lanes, for kernels with vector loops.
    pub(super) vector: Option<String>,
}

/// How a segment's body is split into consecutive vector loops (loop fission).
///
/// A fused kernel's body can chain transcendental calls: an LSTM cell computes `cy` from three
/// gate activations and then `tanh(cy)`. Each inline `exp`/`tanh` is a long chain of dependent
/// FMAs, and one loop iteration then holds more instructions than the core's reorder window
/// can overlap with the next, so the loop runs at the latency of the chain rather than at the
/// throughput of the vector units. Splitting the body at each level of transcendental depth
/// gives loops with short chains and independent iterations. Values crossing loops go
/// through stack arrays of one chunk, which stay in L1/L2 cache, so the memory traffic of the
/// kernel is unchanged. On the LSTM cell this takes the in-cache time per element down by
/// about a sixth, measured side by side with the single loop (book: performance chapter).
///
/// Stage of a value: 1 + the number of transcendental calls on the longest path to it, minus
/// one for the call itself — i.e. a call and everything computed from it before the next call
/// share a stage. Loads and literals have stage 0: they are re-evaluated in every loop that
/// reads them rather than carried.
#[derive(Debug, Clone)]
pub(super) struct Stages {
    /// Number of loops, at least 1.
    pub(super) count: usize,
    /// Stage of each body value (0 for loads and literals).
    pub(super) stage: Vec<usize>,
    /// Values computed in one loop and read by a later one, in body order.
    pub(super) carried: Vec<usize>,
}

/// At most this many bytes of carried arrays per segment: more falls back to one loop, so a
/// huge kernel cannot exhaust an OpenMP thread's stack.
const MAX_CARRIED_BYTES: usize = 128 * 1024;

impl Stages {
    /// The split of `ir`'s body; one loop when there is nothing to split or when the carried
    /// arrays would exceed [`MAX_CARRIED_BYTES`].
    pub(super) fn plan(ir: &KernelIr) -> Stages {
        let n = ir.body.len();
        let mut depth = vec![0usize; n];
        for (id, instr) in ir.body.iter().enumerate() {
            let inputs = instr.operands().iter().map(|&x| depth[x]).max();
            let call = matches!(instr, Instr::Call { func, .. } if has_libmvec_variant(*func));
            depth[id] = inputs.unwrap_or(0) + usize::from(call);
        }
        let cheap = |id: usize| matches!(ir.body[id], Instr::Load { .. } | Instr::Const { .. });
        let stage: Vec<usize> = (0..n)
            .map(|id| if cheap(id) { 0 } else { depth[id].max(1) })
            .collect();
        let count = stage.iter().copied().max().unwrap_or(1).max(1);
        let single = Stages {
            count: 1,
            stage: stage.iter().map(|&s| s.min(1)).collect(),
            carried: Vec::new(),
        };
        if count == 1 {
            return single;
        }
        // A value is carried when a later loop reads it: an instruction of a later stage, a
        // store placed later (never: stores go with their value) or a reduction (last loop).
        let mut read_later = vec![false; n];
        for (id, instr) in ir.body.iter().enumerate() {
            for x in instr.operands() {
                if stage[x] != 0 && stage[x] < stage[id] {
                    read_later[x] = true;
                }
            }
        }
        for red in &ir.reductions {
            if stage[red.value] != 0 && stage[red.value] < count {
                read_later[red.value] = true;
            }
        }
        let carried: Vec<usize> = (0..n).filter(|&id| read_later[id]).collect();
        let bytes: usize = carried
            .iter()
            .map(|&id| match ir.prec(id) {
                Prec::F32 => 4,
                Prec::F64 | Prec::I64 => 8,
            })
            .sum::<usize>()
            * CHUNK as usize;
        if bytes > MAX_CARRIED_BYTES {
            return single;
        }
        Stages {
            count,
            stage,
            carried,
        }
    }

    /// The loop a store of `value` goes in: its value's (loads and literals: the first).
    pub(super) fn store_stage(&self, value: usize) -> usize {
        self.stage[value].max(1)
    }
}
