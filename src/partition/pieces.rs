//! The arithmetic of a fused kernel that reads concats by ranges, as the backends run it.
//!
//! Evaluated as written, a range select computes every operand of its concat at every point
//! of the kernel and keeps one: each element pays for every operand's ops (the *clamped*
//! form). Where the kernel's selects all pick along one axis by the same segments (and it is
//! not a row kernel reducing along that axis), both backends run it as *pieces* instead
//! (`lower::split`): over each segment only the operand that segment selects is evaluated.
//! Pricing such a kernel at the clamped form's arithmetic makes fusing heavy operands through
//! a concat look twice as dear as it is with two segments (ten times with ten), so the
//! partition would keep them in a kernel of their own and pay their write and read instead.
//!
//! [`Facts::fused_arithmetic`] counts what the pieces do: a node is evaluated over the
//! segments whose piece needs it, the concat's operand `k` only over segment `k`, anything
//! read after the concat (or stored, or independent of it) over the whole domain. Kernels the
//! pieces cannot express keep the clamped count, on the same conditions `lower::split` checks
//! on the kernel's IR, stated here on its nodes:
//!
//! - every concat inside selects along one domain axis with the same segment sizes;
//! - it is not a row kernel reducing that axis when it is the innermost one (a row kernel
//!   over a concat along its rows evaluates every operand in its passes; a row kernel's
//!   row reductions reduce the innermost axis, so its pieces are row kernels over the
//!   segments of an outer axis). Any other reduction along the axis does not stop the
//!   pieces: the C loops choose them inside the loop nest (a piece per row along an outer
//!   axis, a loop per piece over each row segment along the innermost) and CUDA per point,
//!   and both accumulate whatever piece computed the value (`lower::split::split_in_nest`);
//! - no value stored by the kernel is smaller than the domain along that axis (it is written
//!   at index 0 only, which no piece past the first sees). A reduction's result is exempt:
//!   it is written through its accumulators, which keep the axis.
//!
//! A row kernel evaluates a value in every pass over a row that needs it, except a value that
//! calls or divides, which the first pass computing it keeps for the later ones
//! ([`Facts::row_evaluations`]): layernorm's `x - mean` is computed by the variance's pass and
//! again by the last, `erf(x)` under a softmax once. Each node is priced for the passes that
//! evaluate it, so the partition keeps a producer out of a row kernel where evaluating it
//! again costs more than its write and read. A value constant along the row (not a reduction,
//! of size 1 along the innermost axis: layernorm's `rsqrt(var + eps)`) counts once per row,
//! as the compilers hoist it out of the row's loops.

use super::Facts;
use crate::dag::Value;
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::rules::{Builtin, OpKind};
use crate::shape::numel;
use std::collections::{HashMap, HashSet};

/// Where a kernel's selects cut its domain: the axis and the segments' sizes along it.
#[derive(Debug, PartialEq)]
struct Segments {
    axis: usize,
    sizes: Vec<usize>,
}

/// A fused kernel's arithmetic, as [`Facts::fused_arithmetic`] counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arithmetic {
    /// Flop-equivalents over the kernel's domain.
    pub flops: f64,
    /// The kernel reads concats by range select and runs as per-segment pieces.
    pub per_segment: bool,
}

impl Facts<'_> {
    /// The arithmetic of the fused kernel of `nodes` over `domain` (`inside` tells which nodes
    /// belong to it): each node's per-element weight times the points it is evaluated at,
    /// which is every point of the domain unless the kernel runs as per-segment pieces (see
    /// the module documentation), and whether it does.
    pub fn fused_arithmetic(
        &self,
        nodes: &[usize],
        domain: &[usize],
        inside: impl Fn(usize) -> bool,
    ) -> Arithmetic {
        let points = numel(domain) as f64;
        let evaluations = self.row_evaluations(nodes, &inside);
        let row = domain.last().copied().unwrap_or(1);
        // In a row kernel, a value constant along the row (layernorm's `rsqrt(var + eps)`)
        // is computed once per row: the compilers hoist it out of the row's loops.
        let per_row = |n: usize| {
            !evaluations.is_empty()
                && row > 1
                && self.dag.nodes[n].op.kind() != OpKind::Reduction
                && self
                    .dag
                    .ty(Value::Node(n))
                    .shape
                    .last()
                    .copied()
                    .unwrap_or(1)
                    == 1
        };
        let weight = |n: usize| {
            let share = if per_row(n) { 1.0 / row as f64 } else { 1.0 };
            self.flops_per_element[n] * f64::from(evaluations.get(&n).copied().unwrap_or(1)) * share
        };
        let Some(segments) = self.segments(nodes, domain, &inside) else {
            let per_element: f64 = nodes.iter().map(|&n| weight(n)).sum();
            return Arithmetic {
                flops: per_element * points,
                per_segment: false,
            };
        };
        let total: usize = segments.sizes.iter().sum();
        // Per node, the segments whose piece evaluates it, found from its users: nodes are
        // numbered in topological order, so walking them from the last sees users first.
        let mut order: Vec<usize> = nodes.to_vec();
        order.sort_unstable_by(|a, b| b.cmp(a));
        let all = vec![true; segments.sizes.len()];
        let mut needed: HashMap<usize, Vec<bool>> = HashMap::with_capacity(order.len());
        let mut flops = 0.0;
        for &n in &order {
            let mut set = if self.written(n, &inside) {
                all.clone()
            } else {
                vec![false; segments.sizes.len()]
            };
            for &u in self.users(n) {
                let u = u as usize;
                if !inside(u) {
                    continue;
                }
                if self.is_concat(u) {
                    let args = &self.dag.nodes[u].args;
                    for (k, _) in args
                        .iter()
                        .enumerate()
                        .filter(|(_, a)| **a == Value::Node(n))
                    {
                        set[k] = true;
                    }
                } else if let Some(user_set) = needed.get(&u) {
                    set.iter_mut().zip(user_set).for_each(|(s, &u)| *s |= u);
                } else {
                    // A user inside the kernel not among `nodes`: evaluated everywhere.
                    set.fill(true);
                }
            }
            let evaluated: usize = segments
                .sizes
                .iter()
                .zip(&set)
                .filter(|(_, on)| **on)
                .map(|(size, _)| size)
                .sum();
            // Segments that are all empty (an empty domain) evaluate nothing.
            if total > 0 {
                flops += weight(n) * points * evaluated as f64 / total as f64;
            }
            needed.insert(n, set);
        }
        Arithmetic {
            flops,
            per_segment: true,
        }
    }

    /// For a row kernel (a reduction read inside, [`Facts::row_kernel`]), how many passes
    /// over a row evaluate each of its nodes; empty for any other kernel (one evaluation
    /// each). It follows the row kernels of `lower::ir` (`KernelIr::row_kept`):
    ///
    /// - a node's *level* is the highest of its operands' inside the kernel, one more past a
    ///   reduction; a reduction accumulates in the pass of its level, and is read from the
    ///   next; the last pass, one past the highest, stores;
    /// - each pass, in order, evaluates what its reductions accumulate (and the last what the
    ///   kernel writes), walking towards the kernel's inputs; the walk stops at reductions
    ///   (row constants) and at a node that calls or divides and that an earlier pass
    ///   computes: the first pass computing it keeps it for the later ones.
    ///
    /// So softmax's `exp` counts once, and so does `erf(x)` under a softmax or a layernorm
    /// (the first pass keeps it for the others), while `x - mean`, cheaper to redo than to
    /// keep, counts once per pass that reads it. A reduction counts once.
    pub(super) fn row_evaluations(
        &self,
        nodes: &[usize],
        inside: &impl Fn(usize) -> bool,
    ) -> HashMap<usize, u32> {
        if !self.row_kernel(nodes, inside) {
            return HashMap::new();
        }
        let reduction = |n: usize| self.dag.nodes[n].op.kind() == OpKind::Reduction;
        let inside_args = |n: usize| {
            self.dag.nodes[n].args.iter().filter_map(move |&a| match a {
                Value::Node(p) if inside(p) => Some(p),
                _ => None,
            })
        };
        // Node ids are in topological order.
        let mut order = nodes.to_vec();
        order.sort_unstable();
        let mut level: HashMap<usize, u32> = HashMap::with_capacity(order.len());
        let mut costly: HashMap<usize, bool> = HashMap::with_capacity(order.len());
        for &n in &order {
            let l = inside_args(n)
                .filter_map(|p| level.get(&p).map(|&lp| lp + u32::from(reduction(p))))
                .max()
                .unwrap_or(0);
            level.insert(n, l);
            let c = !reduction(n)
                && (self.calls_or_divides[n]
                    || inside_args(n).any(|p| costly.get(&p).copied().unwrap_or(false)));
            costly.insert(n, c);
        }
        let last = order
            .iter()
            .map(|&n| level[&n] + u32::from(reduction(n)))
            .max()
            .unwrap_or(0);
        let mut times: HashMap<usize, u32> = order.iter().map(|&n| (n, 0)).collect();
        let mut computed_in: HashMap<usize, u32> = HashMap::with_capacity(order.len());
        for pass in 0..=last {
            let mut stack: Vec<usize> = order
                .iter()
                .filter(|&&r| reduction(r) && level[&r] == pass)
                .flat_map(|&r| inside_args(r))
                .collect();
            if pass == last {
                stack.extend(
                    order
                        .iter()
                        .filter(|&&n| self.written(n, inside) && !reduction(n)),
                );
            }
            let mut seen: HashSet<usize> = HashSet::new();
            while let Some(n) = stack.pop() {
                if reduction(n) || !seen.insert(n) {
                    continue;
                }
                match computed_in.get(&n) {
                    Some(&first) if first < pass && costly[&n] => {}
                    _ => {
                        computed_in.entry(n).or_insert(pass);
                        *times.entry(n).or_insert(0) += 1;
                        stack.extend(inside_args(n));
                    }
                }
            }
        }
        times.into_iter().map(|(n, t)| (n, t.max(1))).collect()
    }

    fn is_concat(&self, n: usize) -> bool {
        self.dag.nodes[n].op.builtin() == Some(Builtin::Concat)
    }

    /// The one set of segments the kernel's concats select by, or `None` when the kernel has no
    /// concat or cannot run as pieces.
    fn segments(
        &self,
        nodes: &[usize],
        domain: &[usize],
        inside: &impl Fn(usize) -> bool,
    ) -> Option<Segments> {
        if nodes.len() < 2 {
            return None;
        }
        let mut found: Option<Segments> = None;
        for &c in nodes.iter().filter(|&&c| self.is_concat(c)) {
            let these = self.concat_segments(c, domain)?;
            match &found {
                None => found = Some(these),
                Some(seen) if *seen == these => {}
                Some(_) => return None,
            }
        }
        let segments = found?;
        let reduction = |n: usize| self.dag.nodes[n].op.kind() == OpKind::Reduction;
        // A reduction along the axis is run by pieces chosen inside the loop nest (C) or per
        // point (CUDA), except in a row kernel over a concat along its rows, whose passes
        // evaluate every operand (`lower::ir::KernelIr::selects_along_rows`).
        if segments.axis + 1 == domain.len()
            && self.row_kernel(nodes, inside)
            && nodes
                .iter()
                .any(|&n| reduction(n) && self.reduces_axis(n, domain.len(), segments.axis))
        {
            return None;
        }
        let narrow = |n: usize| {
            let shape = &self.dag.nodes[n].ty.shape;
            let from_end = domain.len() - segments.axis;
            shape.len() < from_end || shape[shape.len() - from_end] != domain[segments.axis]
        };
        if nodes
            .iter()
            .any(|&n| self.written(n, inside) && narrow(n) && !self.is_concat(n) && !reduction(n))
        {
            return None;
        }
        Some(segments)
    }

    /// Whether reduction node `n`, evaluated over a domain of rank `rank`, reduces domain
    /// axis `axis` (or its plan cannot be read, which prices it the safe way, clamped).
    fn reduces_axis(&self, n: usize, rank: usize, axis: usize) -> bool {
        super::reduced_axes(self.dag, n, rank).is_none_or(|reduced| reduced[axis])
    }

    /// Concat `c`'s segments along the domain axis it fills, right-aligned; `None` where its
    /// value does not span the domain along that axis.
    fn concat_segments(&self, c: usize, domain: &[usize]) -> Option<Segments> {
        let node = &self.dag.nodes[c];
        let shapes: Vec<&[usize]> = node
            .args
            .iter()
            .map(|&a| &self.dag.ty(a).shape[..])
            .collect();
        let Ok((BuiltinPlan::Concat(axis), _)) =
            plan_builtin(Builtin::Concat, &shapes, &node.attrs)
        else {
            return None;
        };
        let rank = node.ty.shape.len();
        let axis_in_domain = domain.len().checked_sub(rank - axis)?;
        if domain[axis_in_domain] != node.ty.shape[axis] {
            return None;
        }
        Some(Segments {
            axis: axis_in_domain,
            sizes: shapes.iter().map(|s| s[axis]).collect(),
        })
    }
}
