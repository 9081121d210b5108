//! Epilogues: the pointwise kernel that reads a library call's product, run by the call on
//! each finished tile of the product while the tile is in cache (Inductor's GEMM template
//! with its epilogue nodes, cuBLASLt's epilogues), so that the product is never written to
//! memory and read back.
//!
//! The greedy partition has placed every library call as a kernel of its own (with the casts
//! and views it absorbed) and fused what reads the product into kernels of their own. This
//! pass then weighs, call by call, merging the one kernel that reads the product into the
//! call. It applies under `library_epilogues` to a call whose product
//!
//! - is a matrix product of operands of rank 2 or more (the product's last two axes are the
//!   matrix, so a tile of the GEMM is a block of the domain's last two axes),
//! - is no graph output and is read by exactly one kernel, which is `Fused`, holds only
//!   pointwise ops and the reshapes and broadcasts that read values at its domain (the
//!   product's reshape among them), iterates over the product's shape or over that shape
//!   with its last axis split into several (a convolution's product `[N, M, P]` read as
//!   `[N, M, H, W]` by the batch norm, activation and residual add after it), and writes no
//!   concat segment. The lowering merges the split axes back into the product's last axis
//!   where every value the kernel reads and writes is laid out along them as one axis
//!   (`lower::merge_axes`); where one is not, the call stores its product and the kernel runs
//!   after it.
//!
//! The epilogue may end in reductions that nothing in it reads (a bias gradient: the column
//! sums of what the epilogue computes from the product, in a graph `fusebox grad` wrote),
//! each over a value of the product's shape (its domain is the product's, not split) and
//! reducing the rows or the columns, or both (and batch axes): a tile then holds a part of
//! each sum, which the backend keeps per tile and adds up once every tile is done: at most
//! one partial sum per element of the product, and for a bias gradient one row of them per
//! block of rows. A reduction read inside the kernel (a row kernel's softmax) needs whole
//! rows, which a tile does not have.
//!
//! A reader that also computes values from other inputs alone (a row scale's reduction over
//! the call's left operand, after `matmul-row-scale-out` moved the scale past the product) is
//! first split in two: the nodes that do not depend on the product become a kernel of their
//! own, in the reader's place, and the rest, when pointwise, is the epilogue (reading what
//! that kernel wrote). The split is priced like the plain merge, both kernels against the
//! call and the reader apart.
//!
//! The merged kernel is the reader's kernel with the call's nodes added, in the reader's place
//! (everything the reader reads is computed by then, and nothing between the two read the
//! product). Its price is the call's arithmetic at the matrix rate, the epilogue's at the
//! pointwise rate, and the bytes of both kernels' inputs and outputs, without the product's
//! write and read. It is taken when that is cheaper than the two kernels apart, which it is
//! unless the epilogue's inputs are large beside the product.

use super::{Facts, Kernel, KernelKind, Partition};
use crate::dag::{Dag, Value};
use crate::rules::{Builtin, FusionRules, OpKind, Profile};

/// `partition` with each library call's reading kernel merged into it where that is legal
/// (see the module documentation) and cheaper.
pub(super) fn absorb_epilogues(
    dag: &Dag,
    facts: &Facts,
    fusion: &FusionRules,
    profile: &Profile,
    partition: Partition,
) -> Partition {
    if !fusion.library_epilogues {
        return partition;
    }
    let mut partition = partition;
    let mut k = 0;
    while k < partition.kernels.len() {
        match merged(dag, facts, profile, &partition, k) {
            Some(Merge {
                reader,
                kernel,
                split_off,
            }) => {
                partition.kernels[reader] = kernel;
                if let Some(before) = split_off {
                    partition.kernels.insert(reader, before);
                }
                partition.kernels.remove(k);
            }
            None => k += 1,
        }
    }
    partition.cost = partition.kernels.iter().map(|k| k.cost).sum();
    partition
}

/// A library call merged with its epilogue: the merged kernel, which replaces the reader at
/// index `reader`, and the part of the reader split off to run before it, if any.
struct Merge {
    reader: usize,
    kernel: Kernel,
    split_off: Option<Kernel>,
}

/// Kernel `k` merged into the one kernel reading its product, with that kernel's index, where
/// `k` is a library call that may take an epilogue and the merge is cheaper.
fn merged(
    dag: &Dag,
    facts: &Facts,
    profile: &Profile,
    partition: &Partition,
    k: usize,
) -> Option<Merge> {
    let call_kernel = &partition.kernels[k];
    let call = super::mergeable_call(dag, facts, call_kernel)?;
    let node = &dag.nodes[call];
    let product = Value::Node(call);
    let mut readers = (0..partition.kernels.len())
        .filter(|&r| r != k && partition.kernels[r].inputs.contains(&product));
    let (reader, None) = (readers.next()?, readers.next()) else {
        return None;
    };
    let reading = &partition.kernels[reader];
    let pointwise = |n: usize| dag.nodes[n].op.kind() == OpKind::Pointwise;
    let reshaping = |n: usize| {
        matches!(
            dag.nodes[n].op.builtin(),
            Some(Builtin::Reshape | Builtin::BroadcastTo)
        )
    };
    if reading.kind != KernelKind::Fused
        || !reading.segments.is_empty()
        || !splits_last_axis(&reading.domain, &node.ty.shape)
        || reader < k
    {
        return None;
    }
    // The reader's nodes that depend on the product (the epilogue) and the others.
    let mut on_product: Vec<usize> = Vec::new();
    for &n in &reading.nodes {
        let reads = |v: &Value| match *v {
            Value::Node(m) => m == call || on_product.contains(&m),
            Value::Input(_) => false,
        };
        if dag.nodes[n].args.iter().any(reads) {
            on_product.push(n);
        }
    }
    let others: Vec<usize> = reading
        .nodes
        .iter()
        .copied()
        .filter(|n| !on_product.contains(n))
        .collect();
    // A reduction ending the epilogue accumulates each tile's part of its sums; one of the
    // tile's axes must be among those it reduces, so that the partial sums kept per tile
    // stay smaller than the product.
    let product_shape = &node.ty.shape;
    let rank = product_shape.len();
    let tiled_reduction = |n: usize| {
        let x = dag.nodes[n].args.first().map(|&x| dag.ty(x));
        let reduced = super::reduced_axes(dag, n, rank);
        x.is_some_and(|x| x.shape == *product_shape)
            && reduced.is_some_and(|r| r[rank - 1] || r[rank - 2])
    };
    let legal = on_product
        .iter()
        .all(|&n| pointwise(n) || reshaping(n) || tiled_reduction(n))
        && on_product.iter().any(|&n| pointwise(n));
    if !legal {
        return None;
    }
    let split_off = (!others.is_empty() && others.iter().any(|&n| !reshaping(n) && !pointwise(n)))
        .then(|| {
            facts.kernel(
                profile,
                others.clone(),
                KernelKind::Fused,
                reading.domain.clone(),
                reading.read_extra,
                |m| others.contains(&m),
            )
        });
    let epilogue: &[usize] = match split_off {
        Some(_) => &on_product,
        None => &reading.nodes,
    };
    // Its reductions end it: one read inside (a row kernel's) needs whole rows, which a tile
    // does not hold.
    if facts.row_kernel(epilogue, |m| epilogue.contains(&m)) {
        return None;
    }
    let mut nodes: Vec<usize> = call_kernel.nodes.iter().chain(epilogue).copied().collect();
    nodes.sort_unstable();
    let kernel = facts.kernel(
        profile,
        nodes,
        KernelKind::Library,
        reading.domain.clone(),
        call_kernel.read_extra + reading.read_extra,
        |m| call_kernel.nodes.contains(&m) || epilogue.contains(&m),
    );
    let before = call_kernel.cost.total_us + reading.cost.total_us;
    let after = kernel.cost.total_us + split_off.as_ref().map_or(0.0, |s| s.cost.total_us);
    (after < before).then_some(Merge {
        reader,
        kernel,
        split_off,
    })
}

/// Whether `domain` is `shape` (a product's, of rank 2 or more) or `shape` with its last axis
/// split into several, in row-major order.
fn splits_last_axis(domain: &[usize], shape: &[usize]) -> bool {
    let Some((&last, lead)) = shape.split_last() else {
        return false;
    };
    domain.len() >= shape.len()
        && domain[..lead.len()] == *lead
        && domain[lead.len()..]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            == Some(last)
}
