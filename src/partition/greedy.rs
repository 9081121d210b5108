//! The greedy partitioner.
//!
//! Nodes are visited in topological order. A node whose role lets it fuse (`Join`, `End`)
//! considers the kernels of its producers: each one alone, then greedily larger unions of them,
//! then all of them. A candidate must be legal — no `End` result consumed inside its kernel,
//! compatible iteration domains, the argument and op budgets, convexity — and is taken only if the
//! modeled total drops below running the node as a kernel of its own. The partial partition is
//! priced as it stands: a value still awaiting users outside its kernel is written to memory.
//! Since a node alone costs exactly what it adds to the unfused baseline, and the node only
//! joins when that is cheaper, the partition never costs more than the baseline.
//!
//! Kernel statistics (inputs, outputs, bytes, arithmetic per element, domain, cost) are kept
//! per kernel and updated as kernels grow, so evaluating a candidate costs time in the size of
//! the node's neighbourhood (plus the smaller kernels' inputs when kernels merge), not in the
//! size of the kernels.
//!
//! Convexity: kernels carry a rank, a topological order of the kernel graph that is maintained
//! through merges. A merge is convex when no kernel reachable from its members (by edges
//! leaving them) reaches back into the members or into a producer of the node; that search
//! only visits kernels ranked no higher than the highest-ranked member or producer, since
//! nothing ranked above them can reach them. The kernels it visits are then moved after the merged
//! kernel, which keeps the ranks topological; the final kernel order is the rank order.
//!
//! Library casts (`library_casts` in fusion.ron): a `cast` whose uses are all by one library
//! call, and which is not a graph output, may instead be left for that call to absorb (it
//! converts while packing its operands). The cast is then not placed when visited; the library
//! call's kernel takes it in when the call is placed. Absorbing is chosen when it is cheaper
//! than the cast joining its producer's kernel (where it would be stored narrow); it is always
//! cheaper than the cast running alone.
//!
//! Concat as a range select ([`Role::is_select`]): a concat joins the kernels producing its
//! operands when each of them is a *segment kernel* — its domain fits the operand it produces
//! and, once merged, it writes nothing (the concat is the only reader of its values) — and the
//! merged kernel's domain is the concat's shape. Its ops are then evaluated per segment by
//! the lowering. Every concat in a kernel selects along one axis (counted from the innermost,
//! which broadcasting keeps). A row kernel may hold concats that select along an outer axis:
//! each row then lies in one segment and the kernel runs as one row kernel per segment. It may
//! also hold concats that select along its rows: each pass then evaluates every operand at
//! every element and picks, priced so ([`Facts::fused_arithmetic`] finds no pieces where a
//! reduction runs along the select's axis). A concat kernel nothing joined is reported and
//! lowered as a copy.
//!
//! Once every node is placed, the sibling pass (`greedy/siblings.rs`) merges pairs of independent
//! kernels when that is cheaper still, with the same domain, budget and convexity checks.
//!
//! The op budget (`max_kernel_ops`) counts a kernel's nodes; literals are never nodes of a
//! kernel, so they never count. The body budget (`max_kernel_terms`) counts the terms of their
//! formulas, so a few ops with huge formulas fill a kernel as surely as many small ones. A chain
//! longer than either budget is cut greedily: each node joins its producer's kernel until that
//! kernel is full, and the next node starts a new one.

use super::{Facts, KernelKind, Partition, fits, kind_of, price};
use crate::dag::{Dag, Value};
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::rules::{Builtin, FusionRules, Profile, Role, RowArithmetic};
use crate::shape::{IndexMap, Shape, broadcast, numel};
use std::collections::{BTreeMap, HashMap, HashSet};

mod siblings;

/// Rank spacing: room to insert kernels between two ranks without renumbering.
const GAP: u64 = 1 << 24;

/// A kernel under construction.
#[derive(Debug, Default)]
struct Group {
    nodes: Vec<usize>,
    kind: Option<KernelKind>,
    /// Values read from memory (literals excluded).
    inputs: HashSet<Value>,
    in_bytes: u64,
    /// How many of its nodes' values are written.
    outputs: usize,
    out_bytes: u64,
    /// Σ flop-equivalents per domain element of its nodes.
    per_element: f64,
    /// Σ formula terms of its nodes: the size of its loop body (`max_kernel_terms`).
    terms: usize,
    /// Σ operands of its concats read by ranges: the segments its code is written per
    /// ([`emitted_terms`]).
    segments: usize,
    /// How many of its nodes are views: each is a load of its own in the generated code.
    views: usize,
    domain: Shape,
    /// Holds an `End` or `Rows` node: the domain is that node's input shape and cannot change.
    fixed: bool,
    /// Values its view members read through their views ([`Role::is_view`]): they come from
    /// memory, so the kernel producing them can never merge into this one.
    view_sources: Vec<Value>,
    /// Consumes a `Rows` reduction inside: a row kernel, whose reductions must all be row
    /// reductions over its domain.
    rows: bool,
    /// Holds a reduction that is not a `Rows` row reduction, which a row kernel cannot hold.
    other_end: bool,
    /// With reductions: the fewest [`Facts::reduction_threads`] among them, which prices the
    /// kernel when it is no row kernel.
    reduction_threads: Option<f64>,
    /// Holds a concat read by ranges: the axis they select along, counted from the innermost
    /// (1 = innermost).
    select: Option<usize>,
    /// Bytes its view loads move beyond their values' per pass over the data (strided or
    /// gathered reads, [`crate::rules::Reads`]).
    gather: f64,
    /// Passes its loop makes over each row: 1, plus 1 per row reduction consumed inside on
    /// the longest chain (softmax: the max, the sum, the normalization).
    passes: u32,
    rank: u64,
    total_us: f64,
    /// Uses of its values by nodes of other kernels: consumer kernel (possibly merged away
    /// since; resolve with `find`) → producer node, once per use.
    succ: HashMap<u32, Vec<usize>>,
}

/// A legal candidate: the node joining `members` (canonical kernel ids).
struct Plan {
    members: Vec<u32>,
    /// When the node is a view: what it reads and how ([`Builder::resolve_view`]).
    view: Option<(Value, IndexMap)>,
    domain: Shape,
    fixed: bool,
    rows: bool,
    other_end: bool,
    reduction_threads: Option<f64>,
    select: Option<usize>,
    gather: f64,
    passes: u32,
    /// The row pass computing the node ([`Builder::level`]).
    level: u32,
    in_bytes: u64,
    in_count: usize,
    out_count: usize,
    out_bytes: u64,
    per_element: f64,
    terms: usize,
    segments: usize,
    views: usize,
    total_us: f64,
    /// Change of the modeled total.
    delta: f64,
    /// Producer nodes whose uses move inside the merged kernel, once per use.
    internal_uses: Vec<usize>,
    /// Values that stop being inputs because they are produced inside the merged kernel.
    internal_inputs: Vec<Value>,
    /// The highest rank among members and outside producers.
    top_rank: u64,
    /// Kernels between the members and their outside successors that must move after the
    /// merged kernel.
    moved: Vec<u32>,
}

/// The kernel that absorbed `g` (union-find without path compression: the absorbing kernel
/// is always the largest, so chains stay logarithmic).
fn find(parent: &[u32], mut g: u32) -> u32 {
    while parent[g as usize] != g {
        g = parent[g as usize];
    }
    g
}

struct Builder<'a> {
    dag: &'a Dag,
    facts: Facts<'a>,
    profile: &'a Profile,
    max_args: usize,
    /// At most this many nodes per fused kernel (`max_kernel_ops`).
    max_ops: usize,
    /// At most this many formula terms per fused kernel (`max_kernel_terms`).
    max_terms: usize,
    /// Whether the sibling pass runs (`siblings` in fusion.ron).
    siblings: bool,
    /// Per node: a cast that its one library-call user may absorb (`library_casts`).
    absorbable: Vec<bool>,
    /// Per node: a cast left for its library-call user to absorb, not yet placed.
    absorbed: Vec<bool>,
    role: Vec<Role>,
    /// Per node: a layout op joining kernels as a view ([`Role::is_view`]), with its resolved
    /// plan (what it re-indexes and how).
    view_plan: Vec<Option<BuiltinPlan>>,
    /// Per placed view node: the value its kernel reads through it (its operand, or the source
    /// of the view it extends in the same kernel) and the index map over that value's buffer.
    view_of: Vec<Option<(Value, IndexMap)>>,
    /// Per node: a `Rows` node that is a row reduction ([`super::row_reduction`]), whose
    /// result may be consumed inside its kernel.
    row: Vec<bool>,
    /// Per node: a concat read by ranges ([`Role::is_select`]), with the axis it selects
    /// along counted from the innermost (1 = innermost).
    select: Vec<Option<usize>>,
    /// Per placed node: the pass of its row kernel that computes it, from 0: one more than
    /// the latest pass of a row reduction it consumes inside its kernel.
    level: Vec<u32>,
    /// Each assigned node's kernel, always canonical.
    group_of: Vec<u32>,
    /// Kernels merged away point to the kernel that absorbed them.
    parent: Vec<u32>,
    groups: Vec<Group>,
    /// Per node: uses by nodes outside its kernel, counting nodes not yet placed.
    ext: Vec<usize>,
    /// Rank → kernel, for live kernels.
    ranks: BTreeMap<u64, u32>,
    gap: u64,
    next_rank: u64,
    member_mark: Vec<u32>,
    outside_mark: Vec<u32>,
    visit_mark: Vec<u32>,
    /// Per value (inputs, then nodes): the epoch of the plan that last counted it.
    value_mark: Vec<u32>,
    epoch: u32,
}

pub(super) fn partition(dag: &Dag, fusion: &FusionRules, profile: &Profile) -> Partition {
    partition_with_gap(dag, fusion, profile, GAP)
}

/// `partition` with a given rank spacing; tests use a tiny one to exercise renumbering.
fn partition_with_gap(dag: &Dag, fusion: &FusionRules, profile: &Profile, gap: u64) -> Partition {
    let facts = Facts::new(dag, profile);
    let n = dag.nodes.len();
    let role: Vec<Role> = dag.nodes.iter().map(|node| fusion.role(&node.op)).collect();
    let row = (0..n)
        .map(|i| role[i] == Role::Rows && super::row_reduction(dag, i))
        .collect();
    let absorbable = (0..n)
        .map(|c| fusion.library_casts && absorbable_cast(&facts, &role, c))
        .collect();
    let view_plan = (0..n).map(|v| view_plan(dag, &role, v)).collect();
    let select = (0..n).map(|c| select_axis(dag, &role, c)).collect();
    let mut b = Builder {
        dag,
        profile,
        max_args: fusion.max_kernel_args,
        max_ops: fusion.max_kernel_ops,
        max_terms: fusion.max_kernel_terms,
        siblings: fusion.siblings,
        absorbable,
        absorbed: vec![false; n],
        role,
        view_plan,
        view_of: vec![None; n],
        row,
        select,
        level: vec![0; n],
        group_of: vec![u32::MAX; n],
        parent: Vec::new(),
        groups: Vec::new(),
        ext: (0..n).map(|i| facts.users(i).len()).collect(),
        ranks: BTreeMap::new(),
        gap,
        next_rank: gap,
        member_mark: Vec::new(),
        outside_mark: Vec::new(),
        visit_mark: Vec::new(),
        value_mark: vec![0; dag.inputs.len() + n],
        epoch: 0,
        facts,
    };
    for node in 0..n {
        if !b.facts.literal[node] {
            b.place(node);
        }
    }
    if b.siblings {
        b.fuse_siblings();
    }
    b.finish()
}

/// Whether cast `c` may run inside the library call using it: a cast that is not a graph
/// output, whose uses all belong to one node, a library call. A cast shared by two library
/// calls stays a kernel of its own: the conversion is shared, and a node belongs to one kernel.
fn absorbable_cast(facts: &Facts, role: &[Role], c: usize) -> bool {
    let node = &facts.dag.nodes[c];
    let users = facts.users(c);
    node.op.builtin() == Some(Builtin::Cast)
        && node.args.len() == 1
        && !facts.graph_output[c]
        && !users.is_empty()
        && users.iter().all(|&u| u == users[0])
        && role[users[0] as usize] == Role::Never
}

/// The resolved plan of node `v` when it joins kernels as a view, `None` for every other node.
fn view_plan(dag: &Dag, role: &[Role], v: usize) -> Option<BuiltinPlan> {
    let node = &dag.nodes[v];
    if !role[v].is_view(&node.op) {
        return None;
    }
    let x = dag.ty(*node.args.first()?);
    plan_builtin(node.op.builtin()?, &[&x.shape], &node.attrs)
        .ok()
        .map(|(plan, _)| plan)
}

/// What the body budget (`max_kernel_terms`) holds a kernel to: its formula terms, and for a
/// kernel that selects by ranges what its generated code repeats per segment. Such a kernel is
/// written once per segment, each copy declaring every argument (`args`: loads, views and
/// stores) and every segment's range, so its code grows as `segments × (args + segments)`: a
/// concat of 500 one-row slices would be one kernel of hundreds of thousands of lines of C
/// (minutes of the compiler) where a few kernels of a few segments each are linear in the
/// graph. Counted in terms, one per line the emitter writes; a kernel of a few segments is
/// far within the budget.
pub(super) fn emitted_terms(terms: usize, segments: usize, args: usize) -> usize {
    if segments == 0 {
        return terms;
    }
    let per_copy = args.saturating_add(segments.saturating_mul(2));
    terms.saturating_add(segments.saturating_add(1).saturating_mul(per_copy))
}

/// For a concat read by ranges ([`Role::is_select`]), its axis counted from the innermost
/// (1 = innermost): right-aligned broadcasting keeps that count as domains grow.
fn select_axis(dag: &Dag, role: &[Role], c: usize) -> Option<usize> {
    let node = &dag.nodes[c];
    if !role[c].is_select(&node.op) {
        return None;
    }
    let shapes: Vec<&[usize]> = node.args.iter().map(|&a| &dag.ty(a).shape[..]).collect();
    match plan_builtin(Builtin::Concat, &shapes, &node.attrs) {
        Ok((BuiltinPlan::Concat(axis), _)) => node.ty.shape.len().checked_sub(axis),
        _ => None,
    }
}

/// The one axis selected along by kernels and a node, counted from the innermost: `Err` when
/// two differ.
fn one_axis(axes: impl Iterator<Item = Option<usize>>) -> Result<Option<usize>, ()> {
    let mut found = None;
    for axis in axes.flatten() {
        match found {
            Some(f) if f != axis => return Err(()),
            _ => found = Some(axis),
        }
    }
    Ok(found)
}

impl Builder<'_> {
    fn find(&self, g: u32) -> u32 {
        find(&self.parent, g)
    }

    fn value_slot(&self, v: Value) -> usize {
        match v {
            Value::Input(i) => i,
            Value::Node(n) => self.dag.inputs.len() + n,
        }
    }

    fn group(&self, g: u32) -> &Group {
        &self.groups[g as usize]
    }

    /// The arithmetic of the kernel merging `members` (canonical ids) and `node` over
    /// `domain`: `per_element` at every point, unless it reads a concat by ranges, which may
    /// run as per-segment pieces, or is a row kernel, whose passes may evaluate a node more
    /// than once ([`Facts::fused_arithmetic`]). `None` for a row kernel (`rows`) whose
    /// concats select along an outer axis but would not cut it into pieces: the row emitters
    /// run such a kernel only as one row kernel per segment. (Concats along the rows never
    /// cut a row kernel; its passes evaluate every operand, as priced.)
    fn kernel_flops(
        &self,
        members: &[u32],
        node: Option<usize>,
        domain: &Shape,
        per_element: f64,
        select: Option<usize>,
        rows: bool,
    ) -> Option<f64> {
        if select.is_none() && !rows {
            return Some(per_element * numel(domain) as f64);
        }
        let nodes: Vec<usize> = members
            .iter()
            .flat_map(|&m| self.group(m).nodes.iter().copied())
            .chain(node)
            .collect();
        let inside = |u: usize| {
            Some(u) == node || (self.group_of[u] != u32::MAX && members.contains(&self.group_of[u]))
        };
        let arithmetic = self.facts.fused_arithmetic(&nodes, domain, inside);
        let outer_select = select.is_some_and(|axis| axis > 1);
        let unsplit_rows = rows && outer_select && !arithmetic.per_segment;
        (!unsplit_rows).then_some(arithmetic.flops)
    }

    fn next_epoch(&mut self) -> u32 {
        if self.epoch == u32::MAX {
            self.member_mark.fill(0);
            self.outside_mark.fill(0);
            self.visit_mark.fill(0);
            self.value_mark.fill(0);
            self.epoch = 0;
        }
        self.epoch += 1;
        self.epoch
    }

    fn place(&mut self, n: usize) {
        if matches!(self.role[n], Role::Join | Role::End | Role::Rows) {
            let producers = self.producer_groups(n);
            let plan = self.best_plan(n, &producers);
            if self.absorbable[n] && plan.as_ref().is_none_or(|p| self.absorb_pays(n, p)) {
                self.absorbed[n] = true;
                return;
            }
            if let Some(plan) = plan {
                self.merge(n, plan);
                return;
            }
        }
        self.start(n);
    }

    /// Whether library cast `n` costs less absorbed by its library call than joining its
    /// producer's kernel per `plan`. Absorbed, the call reads the cast's operand instead of
    /// the cast's value; joined, the producer's kernel changes by `plan.delta` and the call
    /// reads the cast's value. Memory time only: the call's arithmetic is the same either way.
    fn absorb_pays(&self, n: usize, plan: &Plan) -> bool {
        let operand = self.dag.nodes[n].args[0];
        let absorbed = self
            .profile
            .memory_us(self.facts.value_bytes(operand) as f64);
        let joined = plan.delta + self.profile.memory_us(self.facts.node_bytes[n] as f64);
        absorbed <= joined
    }

    /// The fusable kernels producing `n`'s operands, in operand order.
    fn producer_groups(&self, n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for &arg in &self.dag.nodes[n].args {
            if let Value::Node(p) = arg
                && !self.facts.literal[p]
            {
                let g = self.group_of[p];
                if self.group(g).kind == Some(KernelKind::Fused) && !out.contains(&g) {
                    out.push(g);
                }
            }
        }
        out
    }

    /// The cheapest legal way for `n` to join its producers' kernels, if cheaper than a
    /// kernel of its own.
    fn best_plan(&mut self, n: usize, producers: &[u32]) -> Option<Plan> {
        let alone = self.singleton_cost(n).2;
        let mut best: Option<Plan> = None;
        let bar = |best: &Option<Plan>| best.as_ref().map_or(alone, |p| p.delta);
        for &g in producers {
            if let Some(plan) = self.plan(n, &[g])
                && plan.delta < bar(&best)
            {
                best = Some(plan);
            }
        }
        // Grow the best single join one producer kernel at a time while that pays.
        if let Some(mut current) = best.take() {
            loop {
                let mut next: Option<Plan> = None;
                for &g in producers {
                    if current.members.contains(&g) {
                        continue;
                    }
                    let mut members = current.members.clone();
                    members.push(g);
                    let limit = next.as_ref().map_or(current.delta, |p| p.delta);
                    if let Some(plan) = self.plan(n, &members)
                        && plan.delta < limit
                    {
                        next = Some(plan);
                    }
                }
                match next {
                    Some(plan) => current = plan,
                    None => break,
                }
            }
            best = Some(current);
        }
        // All producers at once: legal even when no single join is (a producer kernel that
        // feeds another producer kernel can only be merged together with it).
        if producers.len() >= 2
            && best
                .as_ref()
                .is_none_or(|p| p.members.len() < producers.len())
            && let Some(plan) = self.plan(n, producers)
            && plan.delta < bar(&best)
        {
            best = Some(plan);
        }
        best
    }

    /// Prices `n` joining `members`, or `None` when that is illegal.
    fn plan(&mut self, n: usize, members: &[u32]) -> Option<Plan> {
        let epoch = self.next_epoch();
        for &m in members {
            self.member_mark[m as usize] = epoch;
        }
        let member = |b: &Self, g: u32| b.member_mark[g as usize] == epoch;
        let dag = self.dag;
        let node = &dag.nodes[n];

        // The op budget: the members' nodes and `n`.
        let ops: usize = members.iter().map(|&m| self.group(m).nodes.len()).sum();
        if ops + 1 > self.max_ops {
            return None;
        }
        // The body budget: the members' terms and `n`'s.
        let terms = members
            .iter()
            .map(|&m| self.group(m).terms)
            .sum::<usize>()
            .saturating_add(self.facts.terms[n]);
        if terms > self.max_terms {
            return None;
        }

        // A view reads memory: its operand must not be computed here unless it is a view too.
        let view = match self.view_plan[n] {
            Some(_) => {
                let inside = match node.args[0] {
                    Value::Node(p) => !self.facts.literal[p] && member(self, self.group_of[p]),
                    Value::Input(_) => false,
                };
                Some(self.resolve_view(n, inside)?)
            }
            None => None,
        };
        // Nor may a merge take in the producer of a value some member reads through a view.
        for &m in members {
            for &source in &self.group(m).view_sources {
                if let Value::Node(s) = source
                    && !self.facts.literal[s]
                    && member(self, self.group_of[s])
                {
                    return None;
                }
            }
        }

        // All concats of a kernel select along one axis.
        let select = one_axis(
            members
                .iter()
                .map(|&m| self.group(m).select)
                .chain([self.select[n]]),
        )
        .ok()?;
        // A concat read by ranges takes in only segment kernels: each fits the operands it
        // produces, and writes nothing once the concat reads them inside.
        if self.select[n].is_some() {
            for &m in members {
                let g = self.group(m);
                if g.fixed || g.rows {
                    return None;
                }
                let mut freed = 0;
                let mut seen: Vec<usize> = Vec::new();
                for &arg in &node.args {
                    let Value::Node(p) = arg else { continue };
                    if self.facts.literal[p] || self.group_of[p] != m {
                        continue;
                    }
                    if !fits(&g.domain, &dag.ty(arg).shape) {
                        return None;
                    }
                    if !seen.contains(&p) {
                        seen.push(p);
                        let uses = node.args.iter().filter(|&&a| a == arg).count();
                        if !self.facts.graph_output[p] && self.ext[p] == uses {
                            freed += 1;
                        }
                    }
                }
                if freed != g.outputs {
                    return None;
                }
            }
        }

        // Operands: uses moving inside, and producer kernels staying outside.
        let mut internal_uses = Vec::new();
        let mut outside = Vec::new();
        let mut consumes_rows = false;
        for &arg in &node.args {
            if let Value::Node(p) = arg
                && !self.facts.literal[p]
            {
                let g = self.group_of[p];
                if member(self, g) {
                    if !self.consumable(p) {
                        return None;
                    }
                    consumes_rows |= self.role[p] == Role::Rows;
                    internal_uses.push(p);
                } else if !outside.contains(&g) {
                    outside.push(g);
                }
            }
        }
        // Edges between members become internal; none may consume an `End` result.
        let mut internal_inputs: Vec<Value> = Vec::new();
        if members.len() > 1 {
            for &a in members {
                for (&k, producers) in &self.group(a).succ {
                    let c = self.find(k);
                    if c == a || !member(self, c) {
                        continue;
                    }
                    for &p in producers {
                        if !self.consumable(p) {
                            return None;
                        }
                        consumes_rows |= self.role[p] == Role::Rows;
                        internal_uses.push(p);
                        if !internal_inputs.contains(&Value::Node(p)) {
                            internal_inputs.push(Value::Node(p));
                        }
                    }
                }
            }
        }

        // Iteration domain.
        let shape = self.facts.iter_shape(n);
        let rows = consumes_rows || members.iter().any(|&m| self.group(m).rows);
        let other_end = self.other_end(n) || members.iter().any(|&m| self.group(m).other_end);
        if rows && other_end {
            return None;
        }
        let mut fixed: Option<&Shape> =
            matches!(self.role[n], Role::End | Role::Rows).then_some(shape);
        // A view extending a kernel of views that then writes nothing (every value of it is
        // read only by `n`) takes that kernel over: its views become loads of `n`'s, so its
        // old domain (the shape of a view `n` reshapes) no longer says anything.
        let dissolved = view.is_some() && self.views_dissolve(members, &internal_uses);
        let shaping: &[u32] = if dissolved { &[] } else { members };
        // Reads beyond bytes: the members' view loads (gone when `n` dissolves them into its
        // own load) and `n`'s, if it is a view; each row pass reads them again where the
        // profile says rows are re-read.
        let mut gather: f64 = shaping.iter().map(|&m| self.group(m).gather).sum();
        if let Some((_, map)) = &view {
            gather += self.facts.read_extra(self.profile, n, map);
        }
        let level = node
            .args
            .iter()
            .filter_map(|&arg| match arg {
                Value::Node(p) if !self.facts.literal[p] && member(self, self.group_of[p]) => {
                    Some(self.level_after(p))
                }
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let passes = members
            .iter()
            .map(|&m| self.group(m).passes)
            .chain(internal_uses.iter().map(|&p| self.level_after(p) + 1))
            .chain([level + 1])
            .max()
            .unwrap_or(1);
        for &m in shaping {
            let g = self.group(m);
            if g.fixed {
                match fixed {
                    None => fixed = Some(&g.domain),
                    Some(f) if *f != g.domain => return None,
                    Some(_) => {}
                }
            }
        }
        let is_fixed = fixed.is_some();
        // A concat's segment kernels iterate over their segments: the concat's shape is the
        // domain.
        let segments = self.select[n].is_some();
        let domain = match fixed {
            Some(f) => f.clone(),
            None if segments => shape.clone(),
            None => {
                let mut d = shape.clone();
                for &m in shaping {
                    d = broadcast(&d, &self.group(m).domain).ok()?;
                }
                d
            }
        };
        if !fits(self.facts.iter_shape(n), &domain)
            || (!segments
                && shaping
                    .iter()
                    .any(|&m| !fits(&self.group(m).domain, &domain)))
        {
            return None;
        }

        // Inputs: the union of the members' and the node's, less values made inside.
        let largest = *members
            .iter()
            .max_by_key(|&&m| self.group(m).inputs.len())
            .expect("a plan has members");
        let inputs_of_largest = self.group(largest).inputs.len();
        let mut in_bytes = self.group(largest).in_bytes;
        let mut extra = 0;
        // Values outside the largest member's inputs, each counted once (marked by epoch).
        let mut value_mark = std::mem::take(&mut self.value_mark);
        let mut add = |v: Value| {
            if !self.group(largest).inputs.contains(&v) {
                let slot = self.value_slot(v);
                if value_mark[slot] != epoch {
                    value_mark[slot] = epoch;
                    extra += 1;
                    in_bytes += self.facts.value_bytes(v);
                }
            }
        };
        for &m in members {
            if m != largest {
                self.group(m).inputs.iter().for_each(|&v| add(v));
            }
        }
        for &arg in &node.args {
            let external = match arg {
                Value::Input(_) => true,
                Value::Node(p) => !self.facts.literal[p] && !member(self, self.group_of[p]),
            };
            if external {
                add(arg);
            }
        }
        self.value_mark = value_mark;
        for &v in &internal_inputs {
            in_bytes -= self.facts.value_bytes(v);
        }
        let in_count = inputs_of_largest + extra - internal_inputs.len();

        // Outputs: the members' and the node's, less values no longer used outside.
        let mut out_count: usize = members.iter().map(|&m| self.group(m).outputs).sum();
        let mut out_bytes: u64 = members.iter().map(|&m| self.group(m).out_bytes).sum();
        internal_uses.sort_unstable();
        for run in internal_uses.chunk_by(|a, b| a == b) {
            let p = run[0];
            if !self.facts.graph_output[p] && self.ext[p] == run.len() {
                out_count -= 1;
                out_bytes -= self.facts.node_bytes[p];
            }
        }
        if self.facts.graph_output[n] || !self.facts.users(n).is_empty() {
            out_count += 1;
            out_bytes += self.facts.node_bytes[n];
        }
        if in_count + out_count > self.max_args {
            return None;
        }
        // The body budget again, now counting what the emitter writes per segment.
        let segment_count = members
            .iter()
            .map(|&m| self.group(m).segments)
            .sum::<usize>()
            .saturating_add(self.segments_of(n));
        let views = members.iter().map(|&m| self.group(m).views).sum::<usize>()
            + usize::from(self.view_plan[n].is_some());
        let args = in_count + views + out_count;
        if emitted_terms(terms, segment_count, args) > self.max_terms {
            return None;
        }

        // Convexity.
        for &g in &outside {
            self.outside_mark[g as usize] = epoch;
        }
        let top_rank = members
            .iter()
            .chain(&outside)
            .map(|&g| self.group(g).rank)
            .max()
            .expect("a plan has members");
        let moved = self.between(members, top_rank, epoch, true, usize::MAX)?;

        let per_element: f64 = members
            .iter()
            .map(|&m| self.group(m).per_element)
            .sum::<f64>()
            + self.facts.flops_per_element[n];
        let flops = self.kernel_flops(members, Some(n), &domain, per_element, select, rows)?;
        let reduction_threads = members
            .iter()
            .filter_map(|&m| self.group(m).reduction_threads)
            .chain(self.facts.reduction_threads(self.profile, n))
            .reduce(f64::min);
        let total_us = self.fused_total_us(
            in_bytes + out_bytes,
            self.read_extra(gather, passes),
            flops,
            reduction_threads,
            rows,
        );
        let before: f64 = members.iter().map(|&m| self.group(m).total_us).sum();
        Some(Plan {
            members: members.to_vec(),
            view,
            domain,
            fixed: is_fixed,
            rows,
            other_end,
            reduction_threads,
            select,
            gather,
            passes,
            level,
            in_bytes,
            in_count,
            out_count,
            out_bytes,
            per_element,
            terms,
            segments: segment_count,
            views,
            total_us,
            delta: total_us - before,
            internal_uses,
            internal_inputs,
            top_rank,
            moved,
        })
    }

    /// The kernels reachable from the members through edges leaving them and ranked at most
    /// `top_rank`; `None` if one of them reaches back into a member or into an outside
    /// producer of the node (the merge would not be convex). Members and outside producers
    /// are marked with `epoch`. An edge from one member straight to another becomes internal
    /// when `direct_ok`, and is refused otherwise (siblings must be independent). `None` too
    /// when more than `limit` kernels are found: the caller gives up rather than search far.
    fn between(
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

    /// What view node `n` reads, and through which index map, when it joins a kernel:
    /// `operand_inside` says whether its operand is computed in that kernel, which is legal only
    /// for a view (the two compose into one view of the first one's source). `None` when the
    /// operand is computed there and is not a view. A reshape that no strides express (merging
    /// the axes of a transposed or sliced view) composes too, as a floor-division/remainder
    /// stage of the map ([`IndexMap::reshape`]): reading through it costs a few integer
    /// divisions per element, far less than a copy kernel's write and read back.
    fn resolve_view(&self, n: usize, operand_inside: bool) -> Option<(Value, IndexMap)> {
        let node = &self.dag.nodes[n];
        let plan = self.view_plan[n].as_ref()?;
        let x = node.args[0];
        let x_shape = &self.dag.ty(x).shape;
        let (source, base) = match x {
            Value::Node(p) if operand_inside => self.view_of[p].clone()?,
            _ => (x, IndexMap::contiguous(x_shape)),
        };
        Some((source, plan.index_map(&base, x_shape, &node.ty.shape)?))
    }

    /// Whether `members` hold only view nodes and none of their values is written once the
    /// uses in `internal_uses` (once per use) move inside: they would then be no loop of
    /// their own, only the index maps of the view joining them.
    fn views_dissolve(&self, members: &[u32], internal_uses: &[usize]) -> bool {
        members.iter().all(|&m| {
            self.group(m).nodes.iter().all(|&v| {
                self.view_plan[v].is_some()
                    && !self.facts.graph_output[v]
                    && self.ext[v] == internal_uses.iter().filter(|&&p| p == v).count()
            })
        })
    }

    /// The row pass from which a node of `p`'s kernel may read `p`'s value: `p`'s own pass,
    /// or the next one when `p` is a row reduction (its result is complete only after the pass
    /// that reduces the row).
    fn level_after(&self, p: usize) -> u32 {
        self.level[p] + u32::from(self.role[p] == Role::Rows)
    }

    /// The modeled time of a fused kernel moving `bytes` (its reads `read_extra` more) with
    /// `flops` of arithmetic: a row kernel (`rows`) in one launch, any other with the
    /// reduction passes of its thinnest reduction (`reduction_threads`, `None` without any).
    fn fused_total_us(
        &self,
        bytes: u64,
        read_extra: f64,
        flops: f64,
        reduction_threads: Option<f64>,
        rows: bool,
    ) -> f64 {
        price(
            self.profile,
            bytes,
            read_extra,
            flops,
            self.profile.pointwise_gflops,
        )
        .with_reduction_passes(reduction_threads.filter(|_| !rows), self.profile)
        .total_us
    }

    /// The bytes a kernel's reads move beyond its values' bytes: `gather` per pass over the
    /// data, every pass of a row kernel where the profile says rows are read again, else once.
    fn read_extra(&self, gather: f64, passes: u32) -> f64 {
        if self.profile.reads.rows_reread {
            gather * f64::from(passes)
        } else {
            gather
        }
    }

    /// Whether node `p`'s result may be read by another node of its kernel: anything but an
    /// `End` node or a `Rows` node that is not a row reduction. (The row kernel's domain is
    /// then the reduction's input shape: `Rows` fixes it like `End`.)
    fn consumable(&self, p: usize) -> bool {
        match self.role[p] {
            Role::End => false,
            Role::Rows => self.row[p],
            _ => true,
        }
    }

    /// Whether `n` is a reduction a row kernel cannot hold: an `End` node, or a `Rows` node
    /// over other axes than the innermost.
    fn other_end(&self, n: usize) -> bool {
        match self.role[n] {
            Role::End => true,
            Role::Rows => !self.row[n],
            _ => false,
        }
    }

    /// The segments concat `n` selects among when it is read by ranges (its operands), else 0.
    fn segments_of(&self, n: usize) -> usize {
        if self.select[n].is_some() {
            self.dag.nodes[n].args.len()
        } else {
            0
        }
    }

    /// `n` as a kernel of its own (not yet registered).
    fn singleton(&self, n: usize) -> Group {
        let role = self.role[n];
        let inputs: HashSet<Value> = self.operands(n).collect();
        let (in_bytes, out_bytes, total_us) = self.singleton_cost(n);
        let gather = self.facts.copy_read_extra(self.profile, n);
        Group {
            nodes: vec![n],
            kind: Some(kind_of(role)),
            inputs,
            in_bytes,
            outputs: usize::from(self.written_alone(n)),
            out_bytes,
            per_element: self.facts.flops_per_element[n],
            terms: self.facts.terms[n],
            segments: self.segments_of(n),
            views: usize::from(self.view_plan[n].is_some()),
            domain: self.facts.iter_shape(n).clone(),
            fixed: matches!(role, Role::End | Role::Rows),
            view_sources: Vec::new(),
            rows: false,
            other_end: self.other_end(n),
            reduction_threads: self.facts.reduction_threads(self.profile, n),
            select: self.select[n],
            gather,
            passes: 1,
            rank: 0,
            total_us,
            succ: HashMap::new(),
        }
    }

    /// `n`'s distinct operands that are read from memory (literals are not).
    fn operands(&self, n: usize) -> impl Iterator<Item = Value> + '_ {
        let args = &self.dag.nodes[n].args;
        args.iter().enumerate().filter_map(move |(i, &arg)| {
            let external = match arg {
                Value::Input(_) => true,
                Value::Node(p) => !self.facts.literal[p],
            };
            (external && !args[..i].contains(&arg)).then_some(arg)
        })
    }

    /// Whether `n`'s value is written when nothing shares its kernel.
    fn written_alone(&self, n: usize) -> bool {
        self.facts.graph_output[n] || !self.facts.users(n).is_empty()
    }

    /// Input bytes, output bytes and time of `n` as a kernel of its own (a layout op gathering
    /// its operand through its own map, see [`Facts::copy_read_extra`]).
    fn singleton_cost(&self, n: usize) -> (u64, u64, f64) {
        let node = &self.dag.nodes[n];
        let in_bytes: u64 = self.operands(n).map(|v| self.facts.value_bytes(v)).sum();
        let out_bytes = if self.written_alone(n) {
            self.facts.node_bytes[n]
        } else {
            0
        };
        let per_element = self.facts.flops_per_element[n];
        let domain = self.facts.iter_shape(n);
        let total_us = match kind_of(self.role[n]) {
            KernelKind::Library => price(
                self.profile,
                in_bytes + out_bytes,
                0.0,
                self.facts.library_flops[n],
                self.profile.matmul_rate(node.ty.dtype),
            ),
            // Alone, a concat is a copy kernel of one launch per operand, and a reduction
            // runs its reduction passes.
            kind => {
                let cost = price(
                    self.profile,
                    in_bytes + out_bytes,
                    self.facts.copy_read_extra(self.profile, n),
                    per_element * numel(domain) as f64,
                    self.profile.pointwise_gflops,
                )
                .with_launches(self.facts.alone_launches(n), self.profile);
                let threads = self.facts.reduction_threads(self.profile, n);
                cost.with_reduction_passes(
                    threads.filter(|_| kind == KernelKind::Fused),
                    self.profile,
                )
            }
        }
        .total_us;
        (in_bytes, out_bytes, total_us)
    }

    /// Registers `n` as a kernel of its own, ranked after every existing kernel; a library
    /// call takes in the casts left for it to absorb.
    fn start(&mut self, n: usize) {
        let mut casts: Vec<usize> = self.dag.nodes[n]
            .args
            .iter()
            .filter_map(|&arg| match arg {
                Value::Node(c) if self.absorbed[c] => Some(c),
                _ => None,
            })
            .collect();
        casts.sort_unstable();
        casts.dedup();
        let mut group = if casts.is_empty() {
            self.singleton(n)
        } else {
            self.library_with_casts(n, &casts)
        };
        if self.view_plan[n].is_some() {
            // Alone, a view reads its operand's (contiguous) buffer.
            self.view_of[n] = self.resolve_view(n, false);
            if let Some((source, _)) = &self.view_of[n] {
                group.view_sources.push(*source);
            }
        }
        let id = self.groups.len() as u32;
        group.rank = self.next_rank;
        self.ranks.insert(self.next_rank, id);
        self.next_rank += self.gap;
        for &m in casts.iter().chain([&n]) {
            for &arg in &self.dag.nodes[m].args {
                if let Value::Node(p) = arg
                    && !self.facts.literal[p]
                    && !self.absorbed[p]
                {
                    let g = self.group_of[p] as usize;
                    self.groups[g].succ.entry(id).or_default().push(p);
                }
            }
        }
        for &c in &casts {
            self.absorbed[c] = false;
            self.group_of[c] = id;
            self.ext[c] = 0;
        }
        self.groups.push(group);
        self.parent.push(id);
        self.member_mark.push(0);
        self.outside_mark.push(0);
        self.visit_mark.push(0);
        self.group_of[n] = id;
    }

    /// Library call `n` as a kernel of its own with the absorbed casts `casts` in it (not yet
    /// registered): it reads the casts' operands instead of their values.
    fn library_with_casts(&self, n: usize, casts: &[usize]) -> Group {
        let inputs: HashSet<Value> = casts
            .iter()
            .flat_map(|&c| self.operands(c))
            .chain(
                self.operands(n)
                    .filter(|v| !matches!(v, Value::Node(c) if casts.contains(c))),
            )
            .collect();
        let in_bytes: u64 = inputs.iter().map(|&v| self.facts.value_bytes(v)).sum();
        let (_, out_bytes, _) = self.singleton_cost(n);
        let total_us = price(
            self.profile,
            in_bytes + out_bytes,
            0.0,
            self.facts.library_flops[n],
            self.profile.matmul_rate(self.dag.nodes[n].ty.dtype),
        )
        .total_us;
        let mut nodes = casts.to_vec();
        nodes.push(n);
        Group {
            nodes,
            kind: Some(KernelKind::Library),
            inputs,
            in_bytes,
            outputs: usize::from(self.written_alone(n)),
            out_bytes,
            per_element: self.facts.flops_per_element[n],
            terms: casts.iter().chain([&n]).map(|&m| self.facts.terms[m]).sum(),
            segments: 0,
            views: 0,
            domain: self.facts.iter_shape(n).clone(),
            fixed: false,
            view_sources: Vec::new(),
            rows: false,
            other_end: false,
            reduction_threads: None,
            select: None,
            gather: 0.0,
            passes: 1,
            rank: 0,
            total_us,
            succ: HashMap::new(),
        }
    }

    /// Carries out a plan: the members become one kernel with `n` in it.
    fn merge(&mut self, n: usize, plan: Plan) {
        let survivor = self.survivor(&plan.members);
        self.rerank(&plan, survivor);
        for &o in &plan.members {
            if o != survivor {
                self.absorb(survivor, o);
            }
        }
        let internal: Vec<u32> = self
            .group(survivor)
            .succ
            .keys()
            .copied()
            .filter(|&k| self.find(k) == survivor)
            .collect();
        for &p in &plan.internal_uses {
            self.ext[p] -= 1;
        }
        self.group_of[n] = survivor;
        self.level[n] = plan.level;
        if let Some((source, map)) = plan.view {
            let sources = &mut self.groups[survivor as usize].view_sources;
            if !sources.contains(&source) {
                sources.push(source);
            }
            self.view_of[n] = Some((source, map));
        }
        let mut new_edges = Vec::new();
        {
            let s = &mut self.groups[survivor as usize];
            for k in internal {
                s.succ.remove(&k);
            }
            for v in &plan.internal_inputs {
                s.inputs.remove(v);
            }
            s.nodes.push(n);
            for &arg in &self.dag.nodes[n].args {
                let external = match arg {
                    Value::Input(_) => true,
                    Value::Node(p) => {
                        !self.facts.literal[p] && self.group_of[p] != survivor && {
                            new_edges.push((self.group_of[p], p));
                            true
                        }
                    }
                };
                if external {
                    s.inputs.insert(arg);
                }
            }
            s.in_bytes = plan.in_bytes;
            s.outputs = plan.out_count;
            s.out_bytes = plan.out_bytes;
            s.per_element = plan.per_element;
            s.terms = plan.terms;
            s.segments = plan.segments;
            s.views = plan.views;
            s.domain = plan.domain;
            s.fixed = plan.fixed;
            s.rows = plan.rows;
            s.other_end = plan.other_end;
            s.reduction_threads = plan.reduction_threads;
            s.select = plan.select;
            s.gather = plan.gather;
            s.passes = plan.passes;
            s.total_us = plan.total_us;
            debug_assert_eq!(s.inputs.len(), plan.in_count);
        }
        for (g, p) in new_edges {
            self.groups[g as usize]
                .succ
                .entry(survivor)
                .or_default()
                .push(p);
        }
    }

    /// The member of a merge that survives it: the one with the most nodes (so union-find
    /// chains stay logarithmic), the lowest id on a tie.
    fn survivor(&self, members: &[u32]) -> u32 {
        *members
            .iter()
            .max_by_key(|&&m| (self.group(m).nodes.len(), std::cmp::Reverse(m)))
            .expect("a plan has members")
    }

    /// Moves kernel `o`'s nodes, inputs and outgoing edges into `survivor`; `o` is merged away.
    /// The survivor's statistics are the caller's to set.
    fn absorb(&mut self, survivor: u32, o: u32) {
        let absorbed = std::mem::take(&mut self.groups[o as usize]);
        for &node in &absorbed.nodes {
            self.group_of[node] = survivor;
        }
        self.parent[o as usize] = survivor;
        let s = &mut self.groups[survivor as usize];
        s.nodes.extend(absorbed.nodes);
        s.inputs.extend(absorbed.inputs);
        for source in absorbed.view_sources {
            if !s.view_sources.contains(&source) {
                s.view_sources.push(source);
            }
        }
        for (k, producers) in absorbed.succ {
            s.succ.entry(k).or_default().extend(producers);
        }
    }

    /// Keeps ranks topological through a merge: the merged kernel goes right after the
    /// highest-ranked member or outside producer, and the kernels found between the members
    /// and their successors (`plan.moved`) right after it, in their order.
    fn rerank(&mut self, plan: &Plan, survivor: u32) {
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

    /// The kernels in rank order, each built and priced from scratch.
    fn finish(self) -> Partition {
        let mut kernels = Vec::with_capacity(self.ranks.len());
        for &g in self.ranks.values() {
            let group = self.group(g);
            let mut nodes = group.nodes.clone();
            nodes.sort_unstable();
            // A concat that nothing joined is a copy (one per operand), not a range select.
            let kind = match group.kind.expect("live kernels have a kind") {
                KernelKind::Fused if nodes.len() == 1 && self.select[nodes[0]].is_some() => {
                    KernelKind::Alone
                }
                kind => kind,
            };
            let kernel = self.facts.kernel(
                self.profile,
                nodes,
                kind,
                group.domain.clone(),
                self.read_extra(group.gather, group.passes),
                |m| self.group_of[m] == g,
            );
            debug_assert!(
                (kernel.cost.total_us - group.total_us).abs() <= 1e-6 * group.total_us.max(1.0),
                "incremental cost {} vs {}",
                group.total_us,
                kernel.cost.total_us
            );
            kernels.push(kernel);
        }
        let cost = kernels.iter().map(|k| k.cost).sum();
        // `partition` sets the rules' own.
        Partition {
            kernels,
            cost,
            row_arithmetic: RowArithmetic::default(),
            in_place: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::graph::GraphBuilder;
    use crate::rules::{Catalogue, CostModel};

    /// Renumbering ranks when a gap runs out keeps their order: with a spacing of 2 (room for
    /// one insertion) every partition equals the one built with the normal spacing.
    #[test]
    fn renumbering_ranks_changes_nothing() {
        let ops = Catalogue::defaults();
        let fusion = FusionRules::defaults();
        let model = CostModel::defaults();
        let profile = model.profile("h200").unwrap();
        let mut state = 0x853c49e6748fea9bu64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..200 {
            let mut b = GraphBuilder::new("r");
            let mut vs: Vec<String> = (0..3)
                .map(|i| b.input(&format!("x{i}"), DType::F32, &[8, 8]))
                .collect();
            for i in 0..30 {
                let name = format!("n{i}");
                let a = vs[vs.len() - 1 - next(vs.len().min(6))].clone();
                let c = vs[vs.len() - 1 - next(vs.len().min(6))].clone();
                vs.push(match next(4) {
                    0 => b.op(&name, "transpose", &[&a]),
                    1 => b.op(&name, "exp", &[&a]),
                    _ => b.op(&name, "add", &[&a, &c]),
                });
            }
            let graph = b.finish(&[vs.last().unwrap()]);
            let dag = Dag::from_graph(&graph, &ops).unwrap();
            let normal = partition_with_gap(&dag, &fusion, profile, GAP);
            let tight = partition_with_gap(&dag, &fusion, profile, 2);
            assert_eq!(normal, tight);
        }
    }
}
