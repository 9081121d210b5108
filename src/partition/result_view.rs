//! Result views: a library call that writes its product through the transpose reading it.
//!
//! A transpose is a view for the kernels that read it, but a transpose of a library call's
//! product that is then reshaped across the axes it moved (attention's head merge,
//! `a.transpose(1, 2).reshape(b, t, d)`) can be read through no strides: it stays a copy kernel
//! of its own. The call, though, writes its result matrices through a row stride, a column
//! stride and an offset per matrix, so it can write the transposed value directly. Under
//! `library_views`, a call whose product (of operands of rank 2 or more, no graph output, no
//! epilogue) is read only by one transpose that runs as a kernel of its own takes that
//! transpose in: the merged kernel writes the transpose's value and the product is never
//! stored. It is taken when cheaper, which it is: the product's write and read and a launch go.

use super::{Facts, KernelKind, Partition};
use crate::dag::{Dag, Value};
use crate::rules::{Builtin, FusionRules, Profile};

/// `partition` with each transpose that alone reads a library call's product written by the
/// call, where that is legal (see the module documentation) and cheaper.
pub(super) fn absorb_result_views(
    dag: &Dag,
    facts: &Facts,
    fusion: &FusionRules,
    profile: &Profile,
    partition: Partition,
) -> Partition {
    if !fusion.library_views {
        return partition;
    }
    super::merge_into_readers(partition, |p, k| merged(dag, facts, profile, p, k))
}

/// Library kernel `k` merged with the transpose kernel that alone reads its product, with that
/// kernel's index, where legal and cheaper.
fn merged(
    dag: &Dag,
    facts: &Facts,
    profile: &Profile,
    partition: &Partition,
    k: usize,
) -> Option<(usize, super::Kernel)> {
    let call_kernel = &partition.kernels[k];
    let call = super::mergeable_call(dag, facts, call_kernel)?;
    let users = facts.users(call);
    let (&first, rest) = users.split_first()?;
    if rest.iter().any(|&u| u != first) {
        return None;
    }
    let view = first as usize;
    if dag.nodes[view].op.builtin() != Some(Builtin::Transpose) {
        return None;
    }
    let reader = partition
        .kernels
        .iter()
        .position(|kernel| kernel.nodes == [view])?;
    if reader < k || partition.kernels[reader].inputs != [Value::Node(call)] {
        return None;
    }
    let mut nodes = call_kernel.nodes.clone();
    nodes.push(view);
    nodes.sort_unstable();
    let kernel = facts.kernel(
        profile,
        nodes,
        KernelKind::Library,
        call_kernel.domain.clone(),
        call_kernel.read_extra,
        |m| m == view || call_kernel.nodes.contains(&m),
    );
    let before = call_kernel.cost.total_us + partition.kernels[reader].cost.total_us;
    (kernel.cost.total_us < before).then_some((reader, kernel))
}
