//! Buffer reuse by liveness.
//!
//! Every intermediate value lives from the step that first writes it to the last step that
//! reads it. Walking the steps in order, a value takes a free slot big enough for it (the
//! smallest such) or a new one, and gives its slot back after its last reader. Graph inputs
//! and outputs are the caller's buffers and never take a slot. A value is never given the
//! slot of something read by the step that writes it, because slots are freed only after
//! a step completes.

use crate::dag::Value;
use crate::lower::Program;

/// Where each intermediate value lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Per dag node: its slot, for intermediates; `None` for literals, outputs, or nodes no
    /// step writes.
    pub slot_of: Vec<Option<usize>>,
    /// Bytes per slot.
    pub slot_bytes: Vec<usize>,
    /// Bytes all intermediates would take without reuse, for comparison.
    pub unshared_bytes: usize,
}

impl MemoryPlan {
    pub fn new(program: &Program) -> MemoryPlan {
        MemoryPlan::without(program, &[])
    }

    /// The plan of `program` run by a backend that never writes the nodes `unwritten` (a
    /// product whose epilogue a library call runs on the product's tiles): they take no slot.
    pub fn without(program: &Program, unwritten: &[usize]) -> MemoryPlan {
        let dag = &program.dag;
        let n = dag.nodes.len();
        let output = dag.output_mask();
        let mut first_write = vec![usize::MAX; n];
        let mut last_use = vec![0usize; n];
        for (s, step) in program.steps.iter().enumerate() {
            let (reads, writes) = step.reads_writes(&program.kernels);
            for v in writes {
                if let Value::Node(i) = v {
                    first_write[i] = first_write[i].min(s);
                    last_use[i] = last_use[i].max(s);
                }
            }
            for v in reads {
                if let Value::Node(i) = v {
                    last_use[i] = last_use[i].max(s);
                }
            }
        }
        let bytes = |i: usize| {
            crate::shape::numel(&dag.nodes[i].ty.shape) * dag.nodes[i].ty.dtype.size_bytes()
        };
        let mut slot_of = vec![None; n];
        let mut slot_bytes: Vec<usize> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut unshared_bytes = 0;
        // Values whose last use is step s, released after it.
        let mut release: Vec<Vec<usize>> = vec![Vec::new(); program.steps.len()];
        for i in 0..n {
            if first_write[i] != usize::MAX && !output[i] {
                release[last_use[i]].push(i);
            }
        }
        for (s, step) in program.steps.iter().enumerate() {
            let (_, writes) = step.reads_writes(&program.kernels);
            for v in writes {
                let Value::Node(i) = v else { continue };
                if output[i]
                    || slot_of[i].is_some()
                    || first_write[i] != s
                    || unwritten.contains(&i)
                {
                    continue;
                }
                let need = bytes(i);
                unshared_bytes = usize::saturating_add(unshared_bytes, need);
                let best = free
                    .iter()
                    .enumerate()
                    .filter(|&(_, &slot)| slot_bytes[slot] >= need)
                    .min_by_key(|&(_, &slot)| slot_bytes[slot]);
                let slot = match best {
                    Some((k, &slot)) => {
                        free.swap_remove(k);
                        slot
                    }
                    None => {
                        // Grow the largest free slot rather than adding one, if any is free.
                        match free
                            .iter()
                            .enumerate()
                            .max_by_key(|&(_, &slot)| slot_bytes[slot])
                        {
                            Some((k, &slot)) => {
                                free.swap_remove(k);
                                slot_bytes[slot] = need;
                                slot
                            }
                            None => {
                                slot_bytes.push(need);
                                slot_bytes.len() - 1
                            }
                        }
                    }
                };
                slot_of[i] = Some(slot);
            }
            for &i in &release[s] {
                if let Some(slot) = slot_of[i] {
                    free.push(slot);
                }
            }
        }
        MemoryPlan {
            slot_of,
            slot_bytes,
            unshared_bytes,
        }
    }

    /// Bytes of all slots: the intermediate memory a run needs.
    pub fn total_bytes(&self) -> usize {
        self.slot_bytes.iter().sum()
    }
}
