//! Convexity and the kernel order: kernels carry ranks, a topological order of the kernel
//! graph kept through merges (see the module doc in `greedy.rs`).
//!
//! The search for the kernels between a merge's members and their successors decides whether
//! the merge is convex, and the same kernels are the ones its re-ranking moves after the merged
//! kernel; both passes (producer-consumer and siblings) use the two together.

use super::{Builder, Plan, find};

impl Builder<'_> {
    /// The kernels reachable from the members through edges leaving them and ranked at most
    /// `top_rank`; `None` if one of them reaches back into a member or into an outside
    /// producer of the node (the merge would not be convex). Members and outside producers
    /// are marked with `epoch`. An edge from one member straight to another becomes internal
    /// when `direct_ok`, and is refused otherwise (siblings must be independent). `None` too
    /// when more than `limit` kernels are found: the caller gives up rather than search far.
    pub(super) fn between(
        &mut self,
        members: &[u32],
        top_rank: u64,
        epoch: u32,
        direct_ok: bool,
        limit: usize,
    ) -> Option<Vec<u32>> {
        let mut stack: Vec<u32> = Vec::new();
        let mut found: Vec<u32> = Vec::new();
        for &m in members {
            for &k in self.groups[m as usize].succ.keys() {
                let c = find(&self.parent, k);
                if self.member_mark[c as usize] == epoch {
                    if direct_ok {
                        continue;
                    }
                    return None;
                }
                if self.outside_mark[c as usize] == epoch {
                    return None;
                }
                if self.groups[c as usize].rank <= top_rank && self.visit_mark[c as usize] != epoch
                {
                    self.visit_mark[c as usize] = epoch;
                    stack.push(c);
                    found.push(c);
                }
            }
        }
        while let Some(x) = stack.pop() {
            for &k in self.groups[x as usize].succ.keys() {
                let c = find(&self.parent, k);
                if self.member_mark[c as usize] == epoch || self.outside_mark[c as usize] == epoch {
                    return None;
                }
                if self.groups[c as usize].rank <= top_rank && self.visit_mark[c as usize] != epoch
                {
                    self.visit_mark[c as usize] = epoch;
                    stack.push(c);
                    found.push(c);
                }
            }
            if found.len() > limit {
                return None;
            }
        }
        Some(found)
    }

    /// Keeps ranks topological through a merge: the merged kernel goes right after the
    /// highest-ranked member or outside producer, and the kernels found between the members
    /// and their successors (`plan.moved`) right after it, in their order.
    pub(super) fn rerank(&mut self, plan: &Plan, survivor: u32) {
        let top = plan.top_rank;
        let holder = self.ranks[&top];
        let holder_is_member = plan.members.contains(&holder);
        for &m in &plan.members {
            let rank = self.group(m).rank;
            self.ranks.remove(&rank);
        }
        let mut moved = plan.moved.clone();
        moved.sort_by_key(|&g| self.group(g).rank);
        let mut sequence = Vec::with_capacity(moved.len() + 1);
        if holder_is_member {
            self.groups[survivor as usize].rank = top;
            self.ranks.insert(top, survivor);
        } else {
            sequence.push(survivor);
        }
        if sequence.is_empty() && moved.is_empty() {
            return;
        }
        for &g in &moved {
            let rank = self.group(g).rank;
            self.ranks.remove(&rank);
        }
        sequence.extend(moved);
        let high = self
            .ranks
            .range(top + 1..)
            .next()
            .map_or(self.next_rank, |(&r, _)| r);
        let slots = sequence.len() as u64;
        if high - top > slots {
            let step = (high - top) / (slots + 1);
            for (i, &g) in sequence.iter().enumerate() {
                let r = top + step * (i as u64 + 1);
                self.groups[g as usize].rank = r;
                self.ranks.insert(r, g);
            }
        } else {
            // Out of room: renumber every kernel in order.
            let mut order: Vec<u32> = Vec::with_capacity(self.ranks.len() + sequence.len());
            for (&r, &g) in &self.ranks {
                order.push(g);
                if r == top {
                    order.extend(&sequence);
                }
            }
            self.ranks.clear();
            for (i, &g) in order.iter().enumerate() {
                let r = (i as u64 + 1) * self.gap;
                self.groups[g as usize].rank = r;
                self.ranks.insert(r, g);
            }
            self.next_rank = (order.len() as u64 + 1) * self.gap;
        }
    }
}
