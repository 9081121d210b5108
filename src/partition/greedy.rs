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
//! Library casts and views (`library_casts`, `library_views` in fusion.ron): a `cast`, or a
//! layout op that is a view, on the way from a buffer to a library call's operand (each used
//! only by the next, none a graph output; see `absorbable_operands`) may instead be left for
//! that call to absorb: it converts while packing its operands and reads them through
//! strides. Such a node is then not placed when visited; the library call's kernel takes it
//! in when the call is placed. Absorbing a cast is chosen when it is cheaper than the cast
//! joining its producer's kernel (where it would be stored narrow); it is always cheaper than
//! the cast, or a view's copy, running alone.
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
//!
//! The pieces: this file keeps the kernel statistics, the per-node facts computed once, the
//! search for the best candidate and the final kernel order; `candidate.rs` prices one
//! candidate phase by phase, `kernels.rs` registers and merges kernels, `ranks.rs` holds the
//! convexity search and the re-ranking, `siblings.rs` the sibling pass.

use super::{Facts, KernelKind, Partition, price};
use crate::dag::{Dag, Value};
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::rules::{Builtin, FusionRules, Profile, Role, RowArithmetic};
use crate::shape::{IndexMap, Shape, numel};
use std::collections::{BTreeMap, HashMap, HashSet};

mod candidate;
mod kernels;
mod ranks;
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
    /// Holds a gather that leads it ([`Role::leads`]): only pointwise ops and reductions may
    /// join it, and nothing computing the gather's operands.
    gathers: bool,
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

impl Group {
    /// Takes the merged kernel's shape and prices from the plan that merged it (the members
    /// and edges are the merge's own business). The segment and view counts are not among
    /// them: a sibling merge keeps the survivor's, and a greedy merge sets them itself.
    fn adopt(&mut self, plan: &Plan) {
        self.in_bytes = plan.in_bytes;
        self.outputs = plan.out_count;
        self.out_bytes = plan.out_bytes;
        self.per_element = plan.per_element;
        self.terms = plan.terms;
        self.domain = plan.domain.clone();
        self.fixed = plan.fixed;
        self.rows = plan.rows;
        self.other_end = plan.other_end;
        self.reduction_threads = plan.reduction_threads;
        self.select = plan.select;
        self.gather = plan.gather;
        self.passes = plan.passes;
        self.total_us = plan.total_us;
        debug_assert_eq!(self.inputs.len(), plan.in_count);
    }
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
    /// Per node: whether a library call may absorb it, a cast or a view
    /// (`absorbable_operands`).
    absorbable: Vec<Absorb>,
    /// Per node: a cast or view left for a library call to absorb, not yet placed.
    absorbed: Vec<bool>,
    role: Vec<Role>,
    /// Per node: a gather that leads its kernel ([`Role::leads`]).
    leads: Vec<bool>,
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
    let view_plan: Vec<Option<BuiltinPlan>> = (0..n).map(|v| view_plan(dag, &role, v)).collect();
    let absorbable = absorbable_operands(&facts, &role, &view_plan, fusion);
    let select = (0..n).map(|c| select_axis(dag, &role, c)).collect();
    let leads = (0..n).map(|i| role[i].leads(&dag.nodes[i].op)).collect();
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
        leads,
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

/// Whether a node may run inside the library call that uses it ([`absorbable_operands`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Absorb {
    No,
    /// Where the cost model finds it cheaper than joining its producer's kernel.
    IfPays,
    /// Always: part of a stack of views that would otherwise be copied whole (an im2col
    /// matrix), absorbed all together or not at all.
    Always,
}

/// Per node: whether it may run inside the library call that uses it, read by the call as it
/// packs its operand. That is a chain of nodes back from a call's operand, each used only by
/// the next (the last by the call) and none a graph output: at most one cast
/// (`library_casts`; a node belongs to one kernel, so a cast shared by two calls stays a
/// kernel of its own) and layout ops that are views (`library_views`); the chain may end in a
/// `concat` whose operands are such views of one buffer that stack into one view
/// ([`super::operand_tree`]). The composed index map over the source buffer must be strides,
/// or strides over sub-axes grouped under the operand's axes (`IndexMap::split_strided`).
/// Where it is neither, the chain stops below the view that breaks it: the call reads that
/// view's value from its own kernel.
fn absorbable_operands(
    facts: &Facts,
    role: &[Role],
    view_plan: &[Option<BuiltinPlan>],
    fusion: &FusionRules,
) -> Vec<Absorb> {
    let dag = facts.dag;
    let mut absorbable = vec![Absorb::No; dag.nodes.len()];
    let only_used_by = |c: usize, next: u32| {
        let users = facts.users(c);
        !facts.graph_output[c] && !users.is_empty() && users.iter().all(|&u| u == next)
    };
    let is_view = |c: usize| fusion.library_views && view_plan[c].is_some();
    for (call, node) in dag.nodes.iter().enumerate() {
        if role[call] != Role::Never {
            continue;
        }
        for &arg in &node.args {
            // The chain from the call's operand back towards its source, and the stack of
            // views below a concat that ends it.
            let mut chain: Vec<usize> = Vec::new();
            let mut stack: Vec<usize> = Vec::new();
            let mut casts = 0;
            let mut next = call as u32;
            let mut at = arg;
            while let Value::Node(c) = at {
                let cast = fusion.library_casts
                    && casts == 0
                    && dag.nodes[c].op.builtin() == Some(Builtin::Cast)
                    && dag.nodes[c].args.len() == 1;
                if !only_used_by(c, next) {
                    break;
                }
                if cast || is_view(c) {
                    casts += usize::from(cast);
                    chain.push(c);
                    next = c as u32;
                    at = dag.nodes[c].args[0];
                    continue;
                }
                if fusion.library_views && dag.nodes[c].op.builtin() == Some(Builtin::Concat) {
                    chain.push(c);
                    stack = vec![c];
                    stack.extend(stacked_views(facts, c, &is_view));
                    let below = paddings_below(facts, &stack);
                    stack.extend(below);
                }
                break;
            }
            while !chain.is_empty() && !readable_operand(dag, arg, &chain, &stack) {
                chain.pop();
                stack.clear();
            }
            let how = if stack.is_empty() {
                Absorb::IfPays
            } else {
                Absorb::Always
            };
            for c in chain.into_iter().chain(stack) {
                absorbable[c] = how;
            }
        }
    }
    absorbable
}

/// The views below concat `c` that may stack with it into one view of a buffer: the views and
/// concats down each operand whose every reader is `c` or another of them, none a graph
/// output. A view several of them read (extraction merges equal slices, so the rows of a
/// convolution's windows share the slice of each row offset) joins once. Whether they do stack
/// is [`readable_operand`]'s to check, once for the whole operand (a stack that does not is
/// dropped with its concat).
fn stacked_views(facts: &Facts, c: usize, is_view: &dyn Fn(usize) -> bool) -> Vec<usize> {
    let dag = facts.dag;
    let mut members: Vec<usize> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut tops = vec![c];
    while let Some(top) = tops.pop() {
        for &piece in &dag.nodes[top].args {
            let mut at = piece;
            while let Value::Node(p) = at
                && seen.insert(p)
            {
                if is_view(p) {
                    members.push(p);
                    at = dag.nodes[p].args[0];
                    continue;
                }
                if dag.nodes[p].op.builtin() == Some(Builtin::Concat) {
                    members.push(p);
                    tops.push(p);
                }
                break;
            }
        }
    }
    // Keep the ones read only from inside; dropping one can leave what only it read with a
    // reader outside, so repeat until nothing changes.
    loop {
        let inside: HashSet<usize> = members.iter().copied().chain([c]).collect();
        let before = members.len();
        members.retain(|&m| {
            let users = facts.users(m);
            !facts.graph_output[m]
                && !users.is_empty()
                && users.iter().all(|&u| inside.contains(&(u as usize)))
        });
        if members.len() == before {
            return members;
        }
    }
}

/// The zero paddings below a stack of views (a convolution's padded image: a concat of the
/// image between zero slabs per padded axis, [`super::zero_padding`]) whose every reader is
/// in the stack, and their slabs where nothing else reads them: the call then reads the image
/// and makes the zeros itself, and no kernel writes the padded copy. Whether the result reads
/// as one view is [`readable_operand`]'s to check.
fn paddings_below(facts: &Facts, stack: &[usize]) -> Vec<usize> {
    let dag = facts.dag;
    let mut inside: Vec<usize> = stack.to_vec();
    let owned = |c: usize, inside: &[usize]| {
        let users = facts.users(c);
        !facts.graph_output[c]
            && !users.is_empty()
            && users.iter().all(|&u| inside.contains(&(u as usize)))
    };
    let padding = |c: usize| super::zero_padding(dag, c).is_some();
    // Members whose slabs have been looked at.
    let mut seen = 0;
    loop {
        while seen < inside.len() {
            let c = inside[seen];
            seen += 1;
            if !padding(c) {
                continue;
            }
            // Its slabs: views down to a literal, each joining where the padding alone reads it.
            let mut slabs: Vec<usize> = dag.nodes[c]
                .args
                .iter()
                .filter_map(|&a| match a {
                    Value::Node(q) if super::operand_view::zero_slab(dag, a) => Some(q),
                    _ => None,
                })
                .collect();
            while let Some(q) = slabs.pop() {
                if inside.contains(&q) || facts.literal[q] || !owned(q, &inside) {
                    continue;
                }
                inside.push(q);
                if let Some(&Value::Node(r)) = dag.nodes[q].args.first() {
                    slabs.push(r);
                }
            }
        }
        let found = inside.iter().find_map(|&m| {
            dag.nodes[m].args.iter().find_map(|&a| match a {
                Value::Node(p) if !inside.contains(&p) && padding(p) && owned(p, &inside) => {
                    Some(p)
                }
                _ => None,
            })
        });
        match found {
            Some(p) => inside.push(p),
            None => break,
        }
    }
    inside.split_off(stack.len())
}

/// Whether a library call can read its operand `arg` through the nodes of `chain` (from the
/// operand back towards its source) and `stack` (below the chain's concat): at most one cast,
/// and an index map that is strides, or, over a stack of views, strides over sub-axes for an
/// operand of rank 2 or more (a 1-D operand is promoted, which sub-axes do not follow).
///
/// Sub-axes only over a stack: there they save a copy many times the buffer's size, while a
/// reshape of a transpose (attention's head merge) is better left to the call that produces
/// it, which writes its product through the transpose (`result_view`) so the GEMM here packs
/// contiguous rows.
fn readable_operand(dag: &Dag, arg: Value, chain: &[usize], stack: &[usize]) -> bool {
    let member = |p: usize| chain.contains(&p) || stack.contains(&p);
    let Some(tree) = super::operand_tree(dag, arg, &member) else {
        return false;
    };
    let shape = &dag.ty(arg).shape;
    tree.casts.len() <= 1
        && tree
            .map
            .split_strided(shape)
            .is_some_and(|(_, split)| split.is_none() || (!stack.is_empty() && shape.len() >= 2))
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
        // A gather leading its kernel joins none of its producers.
        if matches!(self.role[n], Role::Join | Role::End | Role::Rows) && !self.leads[n] {
            // Part of a stack read whole: no kernel to price (its operands may be absorbed
            // slabs, which have none).
            if self.absorbable[n] == Absorb::Always {
                self.absorbed[n] = true;
                return;
            }
            let producers = self.producer_groups(n);
            let plan = self.best_plan(n, &producers);
            let absorb = self.absorbable[n] == Absorb::IfPays
                && plan.as_ref().is_none_or(|p| self.absorb_pays(n, p));
            if absorb {
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

    /// Whether cast or view `n` costs less absorbed by its library call than joining its
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
            // An absorbed producer has no kernel yet: it runs in the library call that its
            // chain of users (this node among them) leads to.
            if let Value::Node(p) = arg
                && !self.facts.literal[p]
                && !self.absorbed[p]
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
