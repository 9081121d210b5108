//! The greedy DAG extractor: a bottom-up pass over per-node estimates, then local improvement
//! under the true cost.
//!
//! The bottom-up pass is DAG-aware in the sense of extraction-gym's faster-greedy-dag: the cost
//! of choosing an e-node is its own estimate plus the estimates of the distinct classes beneath
//! it, so a tensor used twice is paid once (a tree cost would pay it per use and push towards
//! recomputation). It runs in two steps:
//!
//! 1. Resolution, a worklist from the leaves up: a class is resolved by the cheapest of its
//!    e-nodes whose operand classes are all resolved. Nothing points at a class before it is
//!    resolved, so no choice made here closes a cycle.
//! 2. Refinement sweeps, children before parents, to a fixpoint (bounded by
//!    [`ExtractOptions::greedy_sweeps`]): each class with alternatives moves to the e-node whose
//!    DAG cost is strictly lowest under the current choices below, unless that e-node would
//!    reach the class itself (a cycle).
//!
//! The DAG cost of a switch is computed as a difference: walking down from the old and the new
//! e-node's operands together in topological order, a class reached from both sides is shared
//! and cancels, and the walk stops as soon as only shared classes are left. Alternatives usually
//! differ near the class, so a switch costs time proportional to what it changes rather than to
//! the size of the graph below it; that keeps a 10,000-node e-graph fast.
//!
//! Estimates are only a proxy: whether a rewrite pays depends on fusion, and a DAG-aware
//! estimate favours sharing a value that a fused kernel would rather recompute. So local
//! improvement then tries switches on the chosen graph: single switches, most promising (by
//! estimate) first; when none helps, two or three switches together (a switch plus switches of
//! the classes it brings in, or two promising switches). Each candidate is built with
//! [`dag_from_choice`](crate::egraph::dag_from_choice) (which rejects cycles) and costed with
//! the caller's true cost; strict improvements are kept, within
//! [`ExtractOptions::local_search_budget`] and [`ExtractOptions::local_search_work`]. It starts
//! from the cheaper of the greedy choice and the seed graph's own choice, so the result never
//! costs more than the original.

use super::space::{Choice, Space};
use super::{ExtractOptions, Extraction, Method, original_choice, strictly_cheaper};
use crate::dag::Dag;
use crate::egraph::{ENode, FuseGraph, Seeded};
use egg::Id;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};

/// Greedy DAG extraction followed by local improvement under `cost` (see the module docs).
pub fn greedy(
    egraph: &FuseGraph,
    seeded: &Seeded,
    cost: &dyn Fn(&Dag) -> f64,
    estimate: &dyn Fn(&FuseGraph, Id, &ENode) -> f64,
    options: &ExtractOptions,
) -> Extraction {
    let space = Space::new(egraph, seeded);
    let estimates: Vec<Vec<f64>> = space
        .candidates
        .iter()
        .zip(&space.ids)
        .map(|(candidates, &id)| {
            candidates
                .iter()
                .map(|k| {
                    let e = estimate(egraph, id, &k.node);
                    if e.is_nan() { f64::INFINITY } else { e }
                })
                .collect()
        })
        .collect();
    let mut pass = BottomUp::new(&space, &estimates);
    pass.resolve();
    pass.refine(options.greedy_sweeps);

    let mut evaluations = 0;
    let mut evaluate = |dag: &Dag| {
        evaluations += 1;
        cost(dag)
    };
    let original = space.choice_of(&original_choice(egraph, seeded));
    let original_dag = space.build(seeded, &original).ok();
    let original_cost = original_dag.as_ref().map_or(f64::INFINITY, &mut evaluate);
    let greedy_dag = space.build(seeded, &pass.choice).ok();
    let greedy_cost = greedy_dag.as_ref().map_or(f64::INFINITY, &mut evaluate);

    // Start from the cheaper one; on a tie, from the original graph. Classes the original
    // choice leaves open keep their greedy choice, so every resolved class stays chosen and a
    // switch may lead anywhere the greedy pass could.
    let greedy_wins = greedy_dag.is_some() && strictly_cheaper(greedy_cost, original_cost);
    let (best_dag, best_cost) = match (original_dag, greedy_dag) {
        (_, Some(g)) if greedy_wins => (g, greedy_cost),
        (Some(o), _) => {
            pass.overlay(&original);
            (o, original_cost)
        }
        (None, Some(g)) => (g, greedy_cost),
        (None, None) => panic!("neither the seed graph nor the greedy choice builds: a bug"),
    };
    pass.recompute_reached();

    let mut local = LocalSearch {
        space: &space,
        seeded,
        budget: options.local_search_budget,
        work: options.local_search_work,
        best_dag,
        best_cost,
    };
    while local.has_budget()
        && (local.single_pass(&mut pass, &mut evaluate)
            || local.multi_pass(&mut pass, &mut evaluate))
    {}
    let LocalSearch {
        best_dag,
        best_cost,
        ..
    } = local;

    Extraction {
        choice: space.to_map(&pass.choice),
        dag: best_dag,
        cost: best_cost,
        original_cost,
        method: Method::Greedy,
        evaluations,
    }
}

/// Local improvement under the true cost: moves are one to three class switches, each judged
/// by building the candidate graph (which rejects cycles) and costing it.
struct LocalSearch<'s, 'g> {
    space: &'s Space<'g>,
    seeded: &'s Seeded,
    /// Candidate graphs still allowed.
    budget: usize,
    /// Graph nodes still allowed to be built.
    work: usize,
    best_dag: Dag,
    best_cost: f64,
}

impl LocalSearch<'_, '_> {
    fn has_budget(&self) -> bool {
        self.budget > 0 && self.work > 0
    }

    /// Builds and costs `choice` with `moves` applied; keeps the result and applies the moves
    /// to `pass` if it is strictly cheaper than the best so far.
    fn attempt(
        &mut self,
        pass: &mut BottomUp<'_, '_>,
        moves: &[(usize, usize)],
        evaluate: &mut dyn FnMut(&Dag) -> f64,
    ) -> bool {
        self.budget -= 1;
        let Ok(dag) = self.space.build_with(self.seeded, &pass.choice, moves) else {
            return false;
        };
        self.work = self.work.saturating_sub(dag.nodes.len().max(1));
        let cost = evaluate(&dag);
        if !strictly_cheaper(cost, self.best_cost) {
            return false;
        }
        pass.apply(moves);
        self.best_dag = dag;
        self.best_cost = cost;
        true
    }

    /// Tries every single switch once, most promising first; whether any was kept.
    fn single_pass(
        &mut self,
        pass: &mut BottomUp<'_, '_>,
        evaluate: &mut dyn FnMut(&Dag) -> f64,
    ) -> bool {
        let mut improved = false;
        for (class, candidate) in pass.switches() {
            if !self.has_budget() {
                break;
            }
            // An earlier switch in this pass may have made it moot.
            if pass.reached_now(class) && pass.choice[class] != Some(candidate) {
                improved |= self.attempt(pass, &[(class, candidate)], evaluate);
            }
        }
        improved
    }

    /// Tries several switches at once; stops at the first improvement. A rewrite often pays
    /// only together with others: the operands it brings in are better computed differently
    /// too (recomputing a cheap value inside a kernel instead of reading a shared one), or a
    /// shared value stops being materialized only when all of its users move off it. No
    /// single switch reaches those. In order of cost: a switch followed by a switch of a class
    /// it newly brings in; pairs of the [`PAIRED`] most promising single switches; chains of
    /// three switches, each in a class the previous one brought in.
    fn multi_pass(
        &mut self,
        pass: &mut BottomUp<'_, '_>,
        evaluate: &mut dyn FnMut(&Dag) -> f64,
    ) -> bool {
        let singles: Vec<(usize, usize)> = pass
            .switches()
            .into_iter()
            .filter(|&(class, _)| pass.reached_now(class))
            .collect();
        if self.chains(pass, &singles, 2, evaluate) {
            return true;
        }
        let best = &singles[..singles.len().min(PAIRED)];
        for (j, &second) in best.iter().enumerate() {
            for &first in &best[..j] {
                if first.0 == second.0 {
                    continue;
                }
                if !self.has_budget() {
                    return false;
                }
                if self.attempt(pass, &[first, second], evaluate) {
                    return true;
                }
            }
        }
        self.chains(pass, &singles, 3, evaluate)
    }

    /// Tries every chain of exactly `length` switches starting with one of `firsts`.
    fn chains(
        &mut self,
        pass: &mut BottomUp<'_, '_>,
        firsts: &[(usize, usize)],
        length: usize,
        evaluate: &mut dyn FnMut(&Dag) -> f64,
    ) -> bool {
        for &first in firsts {
            if !self.has_budget() {
                return false;
            }
            let mut covered = HashSet::new();
            if self.extend(pass, &mut vec![first], &mut covered, length, evaluate) {
                return true;
            }
        }
        false
    }

    /// Extends `moves` with a switch of a class its last move newly brings in, until it has
    /// `length` moves; then attempts it. `covered` holds the classes earlier moves brought in
    /// (besides those the current graph reaches), which are not new to a later move.
    fn extend(
        &mut self,
        pass: &mut BottomUp<'_, '_>,
        moves: &mut Vec<(usize, usize)>,
        covered: &mut HashSet<usize>,
        length: usize,
        evaluate: &mut dyn FnMut(&Dag) -> f64,
    ) -> bool {
        // Classes below the last move not reached before it: a walk that stops at known ones,
        // so it costs what the move adds, not the size of the graph.
        let chosen = |d: usize| {
            moves
                .iter()
                .find(|m| m.0 == d)
                .map_or(pass.choice[d], |m| Some(m.1))
        };
        let &(last, candidate) = moves.last().expect("a chain starts with a move");
        // (class, its choice under the moves so far)
        let mut new: Vec<(usize, Option<usize>)> = Vec::new();
        let mut stack: Vec<usize> = self.space.candidates[last][candidate].children.clone();
        while let Some(d) = stack.pop() {
            if pass.reached_now(d) || moves.iter().any(|m| m.0 == d) || !covered.insert(d) {
                continue;
            }
            let k = chosen(d);
            new.push((d, k));
            if let Some(k) = k {
                stack.extend(&self.space.candidates[d][k].children);
            }
        }
        for (d, current) in new {
            let alternatives: Vec<usize> = pass.ready(d).filter(|&k| Some(k) != current).collect();
            for k in alternatives {
                if !self.has_budget() {
                    return false;
                }
                moves.push((d, k));
                let found = if moves.len() >= length {
                    self.attempt(pass, moves, evaluate)
                } else {
                    self.extend(pass, moves, &mut covered.clone(), length, evaluate)
                };
                moves.pop();
                if found {
                    return true;
                }
            }
        }
        false
    }
}

/// How many of the most promising single switches local improvement also tries in pairs.
const PAIRED: usize = 32;

/// The state of the bottom-up pass: a choice that is acyclic at all times, and a topological
/// position per resolved class (parents before children) for the difference walks.
struct BottomUp<'s, 'g> {
    space: &'s Space<'g>,
    estimates: &'s [Vec<f64>],
    choice: Choice,
    /// Unresolved operand classes per class and candidate.
    waiting: Vec<Vec<usize>>,
    resolved: Vec<bool>,
    /// Topological position under `choice`, kept valid by every change of `choice`.
    pos: Vec<usize>,
    /// Scratch for walks: a per-class epoch and tag, so a walk never clears a whole array.
    epoch: u32,
    seen: Vec<u32>,
    tag: Vec<u8>,
    /// Classes reached from the outputs under `choice` (for local improvement).
    reached: Vec<bool>,
}

const OLD: u8 = 1;
const NEW: u8 = 2;
const BOTH: u8 = OLD | NEW;

impl<'s, 'g> BottomUp<'s, 'g> {
    fn new(space: &'s Space<'g>, estimates: &'s [Vec<f64>]) -> BottomUp<'s, 'g> {
        let n = space.len();
        BottomUp {
            space,
            estimates,
            choice: vec![None; n],
            waiting: space
                .candidates
                .iter()
                .map(|ks| ks.iter().map(|k| k.children.len()).collect())
                .collect(),
            resolved: vec![false; n],
            pos: vec![usize::MAX; n],
            epoch: 0,
            seen: vec![0; n],
            tag: vec![0; n],
            reached: vec![false; n],
        }
    }

    /// Step 1: resolves every class that can be, leaves first.
    fn resolve(&mut self) {
        let n = self.space.len();
        let mut parents: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
        for (c, candidates) in self.space.candidates.iter().enumerate() {
            for (k, candidate) in candidates.iter().enumerate() {
                for &child in &candidate.children {
                    parents[child].push((c, k));
                }
            }
        }
        let mut queue = VecDeque::new();
        for c in 0..n {
            if self.waiting[c].contains(&0) {
                self.settle(c, &mut queue);
            }
        }
        while let Some(d) = queue.pop_front() {
            for &(p, k) in &parents[d] {
                self.waiting[p][k] -= 1;
                if self.waiting[p][k] == 0 && !self.resolved[p] {
                    self.settle(p, &mut queue);
                }
            }
        }
        self.recompute_order();
    }

    /// Resolves `c` with its cheapest ready candidate.
    fn settle(&mut self, c: usize, queue: &mut VecDeque<usize>) {
        let best = (0..self.space.candidates[c].len())
            .filter(|&k| self.waiting[c][k] == 0)
            .min_by(|&a, &b| self.estimates[c][a].total_cmp(&self.estimates[c][b]));
        self.choice[c] = best;
        self.resolved[c] = true;
        queue.push_back(c);
    }

    /// Candidates of `c` whose operands are all resolved (the others cannot be chosen).
    fn ready(&self, c: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.space.candidates[c].len()).filter(move |&k| self.waiting[c][k] == 0)
    }

    /// Step 2: sweeps children before parents until no class moves.
    fn refine(&mut self, sweeps: usize) {
        for _ in 0..sweeps {
            let mut order: Vec<usize> = (0..self.space.len())
                .filter(|&c| self.resolved[c] && self.ready(c).nth(1).is_some())
                .collect();
            order.sort_by_key(|&c| Reverse(self.pos[c]));
            let mut changed = false;
            for c in order {
                let current = self.choice[c].expect("resolved");
                let mut best = (0.0, current);
                let ready: Vec<usize> = self.ready(c).filter(|&k| k != current).collect();
                for k in ready {
                    if let Some(delta) = self.delta(c, k)
                        && delta < best.0
                    {
                        best = (delta, k);
                    }
                }
                if best.1 != current {
                    self.switch(c, best.1);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Replaces the choice of `c` (known acyclic), keeping the topological order valid.
    fn switch(&mut self, c: usize, k: usize) {
        self.choice[c] = Some(k);
        let breaks_order = self.space.candidates[c][k]
            .children
            .iter()
            .any(|&x| self.pos[x] <= self.pos[c]);
        if breaks_order {
            self.recompute_order();
        }
    }

    /// Applies moves whose graph was built successfully (so it is acyclic where it reaches).
    /// A move whose class the new graph no longer reaches was not checked by that build, so it
    /// is undone: the whole choice stays acyclic.
    fn apply(&mut self, moves: &[(usize, usize)]) {
        let previous: Vec<(usize, Option<usize>)> =
            moves.iter().map(|&(c, _)| (c, self.choice[c])).collect();
        for &(c, k) in moves {
            self.choice[c] = Some(k);
        }
        self.recompute_reached();
        for (c, k) in previous {
            if !self.reached[c] {
                self.choice[c] = k;
            }
        }
        self.recompute_order();
    }

    /// Keeps `original`'s e-node wherever it has one.
    fn overlay(&mut self, original: &[Option<usize>]) {
        for (c, k) in original.iter().enumerate() {
            if k.is_some() && self.resolved[c] {
                self.choice[c] = *k;
            }
        }
        self.recompute_order();
    }

    /// Positions every resolved class, parents before children (reverse post-order of an
    /// iterative depth-first walk over the chosen e-nodes).
    fn recompute_order(&mut self) {
        let n = self.space.len();
        let mut post = Vec::with_capacity(n);
        let mut state = vec![0u8; n]; // 0 new, 1 open, 2 done
        for root in 0..n {
            if !self.resolved[root] || state[root] != 0 {
                continue;
            }
            let mut stack = vec![(root, 0usize)];
            state[root] = 1;
            while let Some(&mut (c, ref mut next)) = stack.last_mut() {
                let children = self.chosen_children(c);
                if let Some(&child) = children.get(*next) {
                    *next += 1;
                    if state[child] == 0 {
                        state[child] = 1;
                        stack.push((child, 0));
                    }
                } else {
                    state[c] = 2;
                    post.push(c);
                    stack.pop();
                }
            }
        }
        for (i, &c) in post.iter().rev().enumerate() {
            self.pos[c] = i;
        }
    }

    fn recompute_reached(&mut self) {
        self.reached.iter_mut().for_each(|r| *r = false);
        for c in self.space.reached(&self.choice) {
            self.reached[c] = true;
        }
    }

    fn reached_now(&self, c: usize) -> bool {
        self.reached[c]
    }

    fn chosen_children(&self, c: usize) -> &'s [usize] {
        match self.choice[c] {
            Some(k) => &self.space.candidates[c][k].children,
            None => &[],
        }
    }

    fn own(&self, c: usize) -> f64 {
        self.choice[c].map_or(0.0, |k| self.estimates[c][k])
    }

    fn next_epoch(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.seen.iter_mut().for_each(|s| *s = 0);
            self.epoch = 1;
        }
        self.epoch
    }

    /// Whether choosing candidate `k` for class `c` would close a cycle: some operand reaches
    /// `c` through the current choices. Only classes before `c` in the topological order can
    /// reach it, so the walk stays above `c`.
    fn closes_cycle(&mut self, c: usize, k: usize) -> bool {
        let limit = self.pos[c];
        let epoch = self.next_epoch();
        let mut stack: Vec<usize> = Vec::new();
        for &x in &self.space.candidates[c][k].children {
            if x == c {
                return true;
            }
            if self.pos[x] < limit && self.seen[x] != epoch {
                self.seen[x] = epoch;
                stack.push(x);
            }
        }
        while let Some(x) = stack.pop() {
            for &y in self.chosen_children(x) {
                if y == c {
                    return true;
                }
                if self.pos[y] < limit && self.seen[y] != epoch {
                    self.seen[y] = epoch;
                    stack.push(y);
                }
            }
        }
        false
    }

    /// The change in DAG cost if class `c` switched from its current e-node to candidate `k`,
    /// or `None` if that would close a cycle.
    fn delta(&mut self, c: usize, k: usize) -> Option<f64> {
        if self.closes_cycle(c, k) {
            return None;
        }
        let current = self.choice[c].expect("resolved");
        let epoch = self.next_epoch();
        let mut heap: BinaryHeap<Reverse<(usize, usize)>> = BinaryHeap::new();
        // Classes queued with a single side's tag; the walk ends when none is left.
        let mut single = 0usize;
        let (mut old_sum, mut new_sum) = (0.0, 0.0);
        let space = self.space;
        let sides = [
            (OLD, &space.candidates[c][current].children),
            (NEW, &space.candidates[c][k].children),
        ];
        for (side, children) in sides {
            for &x in children {
                self.mark(x, side, epoch, &mut heap, &mut single);
            }
        }
        while single > 0 {
            let Some(Reverse((_, x))) = heap.pop() else {
                break;
            };
            let tag = self.tag[x];
            if tag != BOTH {
                single -= 1;
                if tag == OLD {
                    old_sum += self.own(x);
                } else {
                    new_sum += self.own(x);
                }
            }
            for &y in self.chosen_children(x) {
                self.mark(y, tag, epoch, &mut heap, &mut single);
            }
        }
        let old = self.estimates[c][current] + old_sum;
        let new = self.estimates[c][k] + new_sum;
        if strictly_cheaper(new, old) || strictly_cheaper(old, new) {
            Some(new - old)
        } else {
            Some(0.0)
        }
    }

    /// Adds side tag `side` to class `x` in a difference walk, queueing it on first sight.
    fn mark(
        &mut self,
        x: usize,
        side: u8,
        epoch: u32,
        heap: &mut BinaryHeap<Reverse<(usize, usize)>>,
        single: &mut usize,
    ) {
        if self.seen[x] != epoch {
            self.seen[x] = epoch;
            self.tag[x] = side;
            heap.push(Reverse((self.pos[x], x)));
            if side != BOTH {
                *single += 1;
            }
        } else if self.tag[x] != BOTH && self.tag[x] | side == BOTH {
            // Queued as one side's, now reached from both: it and all below it are shared.
            self.tag[x] = BOTH;
            *single -= 1;
        }
    }

    /// Single-class switches on the classes the current choice reaches, most promising first
    /// by estimated change in DAG cost.
    fn switches(&mut self) -> Vec<(usize, usize)> {
        let mut found: Vec<(bool, f64, usize, usize)> = Vec::new();
        let mut classes = self.space.reached(&self.choice);
        classes.sort_unstable();
        for c in classes {
            let Some(current) = self.choice[c] else {
                continue;
            };
            let ready: Vec<usize> = self.ready(c).filter(|&k| k != current).collect();
            for k in ready {
                if let Some(delta) = self.delta(c, k) {
                    let reorder = self.only_reorders(c, current, k);
                    found.push((reorder, delta, c, k));
                }
            }
        }
        found.sort_by(|a, b| {
            (a.0.cmp(&b.0))
                .then(a.1.total_cmp(&b.1))
                .then((a.2, a.3).cmp(&(b.2, b.3)))
        });
        found.into_iter().map(|(_, _, c, k)| (c, k)).collect()
    }

    /// Whether candidate `b` of class `c` is candidate `a` with its children reordered
    /// (`mul(x, y)` for `mul(y, x)`). Such a switch changes no kernel, so it is tried last:
    /// on a large graph the budget runs out first.
    fn only_reorders(&self, c: usize, a: usize, b: usize) -> bool {
        let (ENode::Op(op_a, kids_a), ENode::Op(op_b, kids_b)) = (
            &self.space.candidates[c][a].node,
            &self.space.candidates[c][b].node,
        ) else {
            return false;
        };
        let sorted = |kids: &[Id]| {
            let mut kids = kids.to_vec();
            kids.sort_unstable();
            kids
        };
        op_a == op_b && sorted(kids_a) == sorted(kids_b)
    }
}
