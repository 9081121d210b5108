//! Concats written in place: the kernels producing a concat's operands store each operand
//! straight into its segment of the concat's buffer (the legacy PyTorch fuser's
//! `FusedConcat`, one allocation written through a view per segment), and the concat is no
//! kernel at all.
//!
//! The greedy partition has already placed every concat: as a copy (nothing joined it) or as
//! a range select in the kernel that reads it. This pass then weighs, concat by concat in
//! node order, a third form against the one chosen. It applies to a concat that may fuse
//! (`Join`, [`Role::is_select`]; `Alone` keeps it a copy) whose operands, each but those
//! without elements, are node values of `Fused` kernels other than the concat's own:
//!
//! - computed over their kernel's whole domain (a value that kernel evaluates only inside a
//!   range select has no store to redirect),
//! - of the concat's dtype (the segment holds the operand's bits; a converting concat keeps
//!   its copy),
//! - and not a reduction's result (a reduction writes through its accumulator, not a store).
//!
//! Operands from graph inputs, library calls or copies keep the concat as it is: a library
//! call writes a whole buffer of its own. In the new form each producing kernel gains a
//! store per segment it holds, and keeps the operand's own store only where a graph output
//! or some other reader needs that buffer; the concat leaves its kernel, whose remaining
//! nodes read the concat's buffer, and a kernel left empty (a copy) is gone. The form is
//! taken when its modeled total is lower and every kernel keeps within `max_kernel_args`
//! (a segment store is one more argument). Writing in place moves the concat's bytes once
//! instead of an operand write plus a read and a write of the copy, so it wins wherever the
//! concat is a copy or is written out by its range select; a range select whose concat never
//! reaches memory reads exactly the operands' bytes, so there the two tie and the range
//! select stays (and a consumer fused with the operands' kernels beats both).
//!
//! Deciding one concat at a time keeps every step cheap: a decision changes only the
//! kernels producing the concat's operands and the concat's own kernel.

use super::{Facts, Kernel, KernelKind, Partition, SegmentWrite, fits};
use crate::dag::{Dag, Value};
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::rules::{Builtin, OpKind, Profile, Role};
use crate::shape::numel;

/// `partition` with every concat written in place where that is cheaper.
pub(super) fn write_in_place(
    dag: &Dag,
    facts: &Facts,
    role: &[Role],
    max_args: usize,
    profile: &Profile,
    mut partition: Partition,
) -> Partition {
    let n = dag.nodes.len();
    let mut kernel_of = partition.kernel_of(n);
    let mut in_place = vec![false; n];
    for c in 0..n {
        let Some((kc, writes)) = candidate(dag, facts, role, &partition, &kernel_of, c) else {
            continue;
        };
        // The form with `c` written in place, for the kernels it changes.
        in_place[c] = true;
        kernel_of[c] = None;
        let mut changed: Vec<usize> = writes.iter().map(|&(k, _)| k).collect();
        changed.push(kc);
        changed.sort_unstable();
        changed.dedup();
        let rebuilt: Vec<Option<Kernel>> = changed
            .iter()
            .map(|&k| {
                let old = &partition.kernels[k];
                let nodes: Vec<usize> = old.nodes.iter().copied().filter(|&m| m != c).collect();
                if nodes.is_empty() {
                    return None;
                }
                let mut segments = old.segments.clone();
                segments.extend(writes.iter().filter(|&&(w, _)| w == k).map(|&(_, s)| s));
                segments.sort_by_key(|s| (s.concat, s.start, s.value));
                Some(facts.kernel_with(
                    profile,
                    nodes,
                    old.kind,
                    old.domain.clone(),
                    old.read_extra,
                    |m| kernel_of[m] == Some(k),
                    segments,
                    |u| in_place[u],
                ))
            })
            .collect();
        let before: f64 = changed
            .iter()
            .map(|&k| partition.kernels[k].cost.total_us)
            .sum();
        let after: f64 = rebuilt.iter().flatten().map(|k| k.cost.total_us).sum();
        // Each segment is one more argument (`max_kernel_args` bounds them all).
        let too_many = rebuilt.iter().flatten().any(|k| {
            k.nodes.len() > 1 && k.inputs.len() + k.outputs.len() + k.segments.len() > max_args
        });
        if after >= before || too_many {
            in_place[c] = false;
            kernel_of[c] = Some(kc);
            continue;
        }
        for (&k, kernel) in changed.iter().zip(rebuilt) {
            match kernel {
                Some(kernel) => partition.kernels[k] = kernel,
                // Emptied: marked for removal below.
                None => partition.kernels[k].nodes.clear(),
            }
        }
        partition.kernels.retain(|k| !k.nodes.is_empty());
        kernel_of = partition.kernel_of(n);
    }
    partition.in_place = (0..n).filter(|&c| in_place[c]).collect();
    partition.cost = partition.kernels.iter().map(|k| k.cost).sum();
    partition
}

/// Whether concat `c` may be written in place: its kernel, and per operand with elements the
/// kernel that would store it and where.
fn candidate(
    dag: &Dag,
    facts: &Facts,
    role: &[Role],
    partition: &Partition,
    kernel_of: &[Option<usize>],
    c: usize,
) -> Option<(usize, Vec<(usize, SegmentWrite)>)> {
    let node = &dag.nodes[c];
    if !role[c].is_select(&node.op) || numel(&node.ty.shape) == 0 {
        return None;
    }
    let shapes: Vec<&[usize]> = node.args.iter().map(|&a| &dag.ty(a).shape[..]).collect();
    let Ok((BuiltinPlan::Concat(axis), _)) = plan_builtin(Builtin::Concat, &shapes, &node.attrs)
    else {
        return None;
    };
    let kc = kernel_of[c]?;
    let mut writes = Vec::new();
    let mut start = 0;
    for &arg in &node.args {
        let ty = dag.ty(arg);
        let len = ty.shape.get(axis).copied()?;
        if numel(&ty.shape) > 0 {
            let Value::Node(p) = arg else {
                return None;
            };
            let k = kernel_of[p]?;
            let producer = &partition.kernels[k];
            // A reduction is computed over its input's shape, and stores through its
            // accumulator; any other value through a store over the kernel's domain.
            let stored = if dag.nodes[p].op.kind() == OpKind::Reduction {
                let input = dag.nodes[p].args.first().map(|&x| &dag.ty(x).shape[..]);
                reduction_may_store(facts, producer, p, c)
                    && input.is_some_and(|x| fits(x, &producer.domain))
            } else {
                fits(&ty.shape, &producer.domain)
            };
            let whole = producer.kind == KernelKind::Fused
                && k != kc
                && stored
                && ty.dtype == node.ty.dtype
                && !dag.nodes[p].op.is_literal();
            if !whole {
                return None;
            }
            writes.push((
                k,
                SegmentWrite {
                    value: p,
                    concat: c,
                    axis,
                    start,
                },
            ));
        }
        start += len;
    }
    Some((kc, writes))
}

/// Whether reduction `p` of `producer` may write its results into concat `c`'s segment: its
/// accumulator writes one place, so the concat must be its only reader (once) and it no
/// graph output; and the kernel must be no row kernel, whose reductions' results stay in
/// registers for the row and are stored by the row's stores.
fn reduction_may_store(facts: &Facts, producer: &Kernel, p: usize, c: usize) -> bool {
    let only_the_concat = facts.users(p) == [c as u32] && !facts.graph_output[p];
    // A kernel's nodes are in index order.
    only_the_concat
        && !facts.row_kernel(&producer.nodes, |q| {
            producer.nodes.binary_search(&q).is_ok()
        })
}
