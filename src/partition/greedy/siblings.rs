//! Sibling (horizontal) fusion, run once every node has its kernel.
//!
//! The producer-consumer pass only lets a node join the kernels of its producers, so two
//! kernels with no edge between them stay apart even when they read the same input (`div(x, x)`
//! and `exp(x)`) or run over the same domain (two independent chains): each pays a launch and
//! reads the shared input again. This pass merges two fusable (`Fused`) kernels into one
//! multi-output kernel when
//!
//! - neither reaches the other in the kernel graph, directly or through other kernels (the
//!   merged kernel would otherwise sit on a cycle and nothing could run it);
//! - their iteration domains agree under the producer-consumer pass's rules: a kernel holding
//!   an `End` node keeps its domain, which the other's must broadcast to (two such kernels need
//!   equal domains); otherwise the domain is the broadcast of both;
//! - the merged kernel's inputs (shared ones counted once) plus outputs fit `max_kernel_args`,
//!   its nodes (both kernels' together) fit `max_kernel_ops`, and their formula terms
//!   `max_kernel_terms`;
//! - the modeled cost of the merged kernel is strictly lower than the two apart.
//!
//! No edge between the two means no value moves inside: the outputs are both kernels' outputs,
//! and the inputs their union. Each merge lowers the total, so the partition still never costs
//! more than the unfused baseline.
//!
//! Candidates come in two rounds, both deterministic. First, kernels reading a common value,
//! values taken from the largest down (a merge saves a read of that value), readers in run
//! order. Then kernels over the same domain in run order, which can only save launches. Each
//! candidate is tried against at most [`OPEN`] earlier kernels, and the convexity search of one
//! try visits at most [`SEARCH_LIMIT`] kernels (beyond that the pair is left apart), so the pass
//! costs O(E · OPEN · SEARCH_LIMIT) at worst and far less on real dags, plus a sort of the
//! values.

use super::{Builder, Plan};
use crate::dag::Value;
use crate::partition::{KernelKind, fits, slices_by_slot};
use crate::shape::{Shape, broadcast};
use std::cmp::Reverse;
use std::collections::HashMap;

/// How many earlier kernels of one round (readers of one value, or kernels over one domain) a
/// candidate is tried against, most recently opened last. Bounds the work per candidate when
/// thousands of kernels read one value.
const OPEN: usize = 4;

/// How many kernels the convexity search of one candidate pair may visit. Kernels far apart in
/// run order with much between them are left apart rather than searched at length.
const SEARCH_LIMIT: usize = 256;

impl Builder<'_> {
    /// Merges independent fusable kernels while that lowers the modeled cost.
    pub(super) fn fuse_siblings(&mut self) {
        let dag = self.dag;
        let slots = dag.inputs.len() + dag.nodes.len();
        // Which nodes read each value from memory (once per node), as slices of one list.
        let this = &*self;
        let (start, readers) = slices_by_slot(slots, || {
            (0..dag.nodes.len()).flat_map(|n| {
                this.operands(n)
                    .map(move |arg| (this.value_slot(arg), n as u32))
            })
        });

        // Round 1: kernels sharing an input, the largest shared values first.
        let value_of = |slot: usize| {
            if slot < dag.inputs.len() {
                Value::Input(slot)
            } else {
                Value::Node(slot - dag.inputs.len())
            }
        };
        let mut shared: Vec<usize> = (0..slots)
            .filter(|&s| start[s + 1] - start[s] >= 2)
            .collect();
        shared.sort_by_key(|&s| (Reverse(self.facts.value_bytes(value_of(s))), s));
        let mut kernels: Vec<u32> = Vec::new();
        for slot in shared {
            let value = value_of(slot);
            kernels.clear();
            for &u in &readers[start[slot] as usize..start[slot + 1] as usize] {
                let g = self.group_of[u as usize];
                let group = self.group(g);
                if group.kind == Some(KernelKind::Fused) && group.inputs.contains(&value) {
                    kernels.push(g);
                }
            }
            kernels.sort_unstable_by_key(|&g| (self.group(g).rank, g));
            kernels.dedup();
            if kernels.len() < 2 {
                continue;
            }
            let mut open = Vec::new();
            for &k in &kernels {
                self.offer(&mut open, k);
            }
        }

        // Round 2: kernels over the same domain, in run order.
        let order: Vec<u32> = self.ranks.values().copied().collect();
        let mut open_by_domain: HashMap<Shape, Vec<u32>> = HashMap::new();
        for k in order {
            if self.parent[k as usize] != k || self.group(k).kind != Some(KernelKind::Fused) {
                continue;
            }
            let domain = self.group(k).domain.clone();
            let mut open = open_by_domain.remove(&domain).unwrap_or_default();
            let k = self.offer(&mut open, k);
            // A merge keeps equal domains equal, so the merged kernel stays under this key.
            debug_assert_eq!(self.group(k).domain, domain);
            open_by_domain.insert(domain, open);
        }
    }

    /// Tries kernel `k` against the `open` kernels, oldest first, and merges it with the first
    /// one that pays; otherwise `k` joins `open` (dropping the oldest beyond [`OPEN`]). Returns
    /// the kernel `k` ends up in.
    fn offer(&mut self, open: &mut Vec<u32>, k: u32) -> u32 {
        let k = self.find(k);
        for slot in open.iter_mut() {
            let o = self.find(*slot);
            if o == k {
                return k;
            }
            if let Some(plan) = self.sibling_plan(o, k) {
                let merged = self.merge_siblings(plan);
                *slot = merged;
                return merged;
            }
        }
        if open.len() == OPEN {
            open.remove(0);
        }
        open.push(k);
        k
    }

    /// Prices merging the independent kernels `a` and `b`; `None` when that is illegal or not
    /// strictly cheaper.
    fn sibling_plan(&mut self, a: u32, b: u32) -> Option<Plan> {
        if a == b {
            return None;
        }
        let (ga, gb) = (self.group(a), self.group(b));
        if ga.kind != Some(KernelKind::Fused) || gb.kind != Some(KernelKind::Fused) {
            return None;
        }
        // A kernel led by a gather takes in its consumers only (`gathers_stay_loads`).
        if ga.gathers || gb.gathers {
            return None;
        }
        if ga.nodes.len() + gb.nodes.len() > self.max_ops
            || ga.terms.saturating_add(gb.terms) > self.max_terms
        {
            return None;
        }
        // A row kernel holds row reductions only.
        let rows = ga.rows || gb.rows;
        let other_end = ga.other_end || gb.other_end;
        let select = super::one_axis([ga.select, gb.select].into_iter()).ok()?;
        if rows && other_end {
            return None;
        }
        // Iteration domain: a kernel with an `End` node keeps its own.
        let (domain, fixed) = match (ga.fixed, gb.fixed) {
            (true, true) => (ga.domain == gb.domain).then(|| (ga.domain.clone(), true))?,
            (true, false) => fits(&gb.domain, &ga.domain).then(|| (ga.domain.clone(), true))?,
            (false, true) => fits(&ga.domain, &gb.domain).then(|| (gb.domain.clone(), true))?,
            (false, false) => {
                let d = broadcast(&ga.domain, &gb.domain).ok()?;
                (fits(&ga.domain, &d) && fits(&gb.domain, &d)).then_some((d, false))?
            }
        };
        // Arguments: shared inputs are read once; no value crosses between the two, so every
        // output stays one.
        let (small, large) = if ga.inputs.len() <= gb.inputs.len() {
            (ga, gb)
        } else {
            (gb, ga)
        };
        let (mut shared, mut shared_bytes) = (0, 0);
        for v in &small.inputs {
            if large.inputs.contains(v) {
                shared += 1;
                shared_bytes += self.facts.value_bytes(*v);
            }
        }
        let in_count = ga.inputs.len() + gb.inputs.len() - shared;
        let out_count = ga.outputs + gb.outputs;
        if in_count + out_count > self.max_args {
            return None;
        }
        let (segments, views) = (ga.segments + gb.segments, ga.views + gb.views);
        let args = in_count + views + out_count;
        if super::emitted_terms(ga.terms + gb.terms, segments, args) > self.max_terms {
            return None;
        }
        let in_bytes = ga.in_bytes + gb.in_bytes - shared_bytes;
        let out_bytes = ga.out_bytes + gb.out_bytes;
        let per_element = ga.per_element + gb.per_element;
        let terms = ga.terms + gb.terms;
        let gather = ga.gather + gb.gather;
        let passes = ga.passes.max(gb.passes);
        let reduction_threads = [ga.reduction_threads, gb.reduction_threads]
            .into_iter()
            .flatten()
            .reduce(f64::min);
        let total_us = self.fused_total_us(
            in_bytes + out_bytes,
            self.read_extra(gather, passes),
            self.kernel_flops(&[a, b], None, &domain, per_element, select, rows)?,
            reduction_threads,
            rows,
        );
        let before = ga.total_us + gb.total_us;
        // Strictly cheaper, by more than rounding: a tie leaves the kernels apart.
        if total_us >= before - 1e-12 * before {
            return None;
        }
        // Convexity, last: it is the expensive check. Neither kernel may reach the other. Only
        // the lower-ranked one can reach the higher, and only through kernels ranked between.
        let epoch = self.next_epoch();
        self.member_mark[a as usize] = epoch;
        self.member_mark[b as usize] = epoch;
        let top_rank = self.group(a).rank.max(self.group(b).rank);
        let moved = self.between(&[a, b], top_rank, epoch, false, SEARCH_LIMIT)?;
        Some(Plan {
            members: vec![a, b],
            view: None,
            domain,
            fixed,
            rows,
            other_end,
            reduction_threads,
            select,
            gather,
            passes,
            level: 0,
            in_bytes,
            in_count,
            out_count,
            out_bytes,
            per_element,
            terms,
            segments,
            views,
            total_us,
            delta: total_us - before,
            internal_uses: Vec::new(),
            internal_inputs: Vec::new(),
            top_rank,
            moved,
        })
    }

    /// Carries out a sibling plan; returns the merged kernel. It takes the place of the later
    /// of the two, and the kernels that depend on the earlier one and ran between them move
    /// after it.
    fn merge_siblings(&mut self, plan: Plan) -> u32 {
        let survivor = self.survivor(&plan.members);
        self.rerank(&plan, survivor);
        for &o in &plan.members {
            if o != survivor {
                self.absorb(survivor, o);
            }
        }
        let s = &mut self.groups[survivor as usize];
        s.adopt(&plan);
        debug_assert!(
            s.succ
                .keys()
                .all(|&k| super::find(&self.parent, k) != survivor)
        );
        survivor
    }
}
