//! Partitioning a dag into kernels, and the modeled cost of those kernels.
//!
//! A kernel reads its inputs from memory once, keeps every value it computes in registers, and
//! writes the values someone outside it needs. Its cost is a launch, plus the bytes it reads and
//! writes over the profile's bandwidth, plus its arithmetic over the profile's throughput
//! (combined per the profile's `overlap`; see [`Profile::combine`]). Values inside a kernel cost
//! no memory traffic, which is what fusion buys; recomputing a small value for every element of
//! a larger kernel is what fusion can cost.
//!
//! [`partition`] builds the kernels the lowering emits: legal per [`FusionRules`], convex, and
//! chosen by the cost model. [`unfused`] is the baseline of one kernel per op. Both report
//! exactly the kernels they price, so the modeled cost in a report is the cost of the kernels
//! that run.
//!
//! A nullary pointwise node (`const`) is a scalar literal: it is inlined into every kernel that
//! uses it, is never a kernel, never a kernel argument and moves no bytes.

mod epilogue;
mod greedy;
mod in_place;
mod operand_view;
mod pieces;
mod result_view;

use crate::dag::{Dag, DagNode, Value};
use crate::rules::{Builtin, FusionRules, OpKind, Profile, Role, RowArithmetic};
use crate::shape::{IndexMap, Shape, numel};
use std::collections::HashSet;
use std::ops::{Add, AddAssign};

/// A modeled cost. Times are in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    /// Kernel launches × launch overhead.
    pub launch_us: f64,
    /// Bytes at kernel boundaries over bandwidth.
    pub memory_us: f64,
    /// Arithmetic over throughput.
    pub compute_us: f64,
    /// Per kernel: launch + memory + compute − overlap · min(memory, compute); summed over
    /// kernels. With overlap it is less than the sum of the three parts.
    pub total_us: f64,
    /// Bytes read plus bytes written at kernel boundaries.
    pub bytes: u64,
    /// Flop-equivalents (see `cost.ron`'s weights), recomputation included.
    pub flops: u64,
}

impl Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            launch_us: self.launch_us + o.launch_us,
            memory_us: self.memory_us + o.memory_us,
            compute_us: self.compute_us + o.compute_us,
            total_us: self.total_us + o.total_us,
            // Saturating: a report never wraps to a small count (graph checking bounds each
            // value to `shape::MAX_NUMEL` elements, so real sums stay far from the limit).
            bytes: self.bytes.saturating_add(o.bytes),
            flops: self.flops.saturating_add(o.flops),
        }
    }
}

impl AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        *self = *self + o;
    }
}

impl std::iter::Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(iter: I) -> Cost {
        iter.fold(Cost::default(), Add::add)
    }
}

/// What runs a kernel. Serialized as reports name it: `fused`, `copy`, `library`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelKind {
    /// A generated loop over one iteration domain: pointwise ops, broadcasts, reductions at
    /// its end. A single op run unfused is a one-node `Fused` kernel.
    Fused,
    /// A layout op run as a copy of its own (`Alone` in fusion.ron).
    #[serde(rename = "copy")]
    Alone,
    /// An opaque library call (matmul).
    Library,
}

impl std::fmt::Display for KernelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KernelKind::Fused => "fused",
            KernelKind::Alone => "copy",
            KernelKind::Library => "library",
        })
    }
}

/// One kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// Dag node indices, in topological (index) order.
    pub nodes: Vec<usize>,
    /// Values read from memory, in order of first use; literals are not inputs.
    pub inputs: Vec<Value>,
    /// Node values written to memory: graph outputs and values used outside the kernel, in
    /// node order.
    pub outputs: Vec<Value>,
    /// The iteration domain: the shape every node is evaluated over. A node of a smaller
    /// (broadcastable) shape is recomputed at every point of the domain.
    pub domain: Shape,
    pub kind: KernelKind,
    pub cost: Cost,
    /// The bytes its reads move beyond the values' own (lines of strided or gathered views
    /// touched but not used), priced as time in `cost`; kept so that a kernel rebuilt with
    /// other outputs (a concat written in place) is priced with the same reads.
    pub read_extra: f64,
    /// Values of this kernel stored straight into their segments of concats written in place
    /// (in node order): each is written there as well as, or instead of, to a buffer of its
    /// own (it is in `outputs` only if a graph output or a reader other than such a concat
    /// needs that buffer).
    pub segments: Vec<SegmentWrite>,
    /// Reads its concats by range select as per-segment pieces, each evaluating only its own
    /// operand, and is priced so (`Facts::fused_arithmetic` in the partitioner); false for the clamped form (every
    /// operand at every point) and for kernels without a concat.
    pub per_segment: bool,
}

/// A value stored into its segment of a concat written in place: the concat's buffer along
/// `axis`, from index `start` on, holds it. The concat itself is then no kernel: the kernels
/// producing its operands write it together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentWrite {
    /// The operand's node (a member of the writing kernel).
    pub value: usize,
    /// The concat's node.
    pub concat: usize,
    pub axis: usize,
    pub start: usize,
}

/// Kernels in an order that runs them (each after the kernels producing its inputs), and their
/// total cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    pub kernels: Vec<Kernel>,
    pub cost: Cost,
    /// The arithmetic the row kernels among `kernels` may use (fusion.ron's
    /// `row_arithmetic`), carried to the lowering with the kernels it applies to, so that the
    /// kernels that run are the ones the rules asked for.
    pub row_arithmetic: RowArithmetic,
    /// Concats written in place ([`SegmentWrite`]), in node order: no kernel holds them.
    pub in_place: Vec<usize>,
}

/// The nodes of a library kernel by their part: the call (the kernel's one `Opaque` node),
/// the casts and views it absorbed on its operands (`library_casts`, `library_views`: each
/// reached from the call's operands back through nodes of the kernel), its epilogue
/// (`library_epilogues`: pointwise ops run on each finished tile of the product, reading it
/// as an ordinary value), or the layout op through which it writes its product
/// (`library_views`: a transpose reading the product, whose value the call writes in its
/// place).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryParts {
    pub call: Option<usize>,
    pub operands: Vec<usize>,
    pub epilogue: Vec<usize>,
    pub result: Option<usize>,
}

impl LibraryParts {
    /// `nodes` (a library kernel's, in node order) by their part.
    pub fn of(dag: &Dag, nodes: &[usize]) -> LibraryParts {
        let call = nodes
            .iter()
            .copied()
            .find(|&n| dag.nodes[n].op.kind() == OpKind::Opaque);
        let mut operands = Vec::new();
        let mut stack: Vec<usize> = call.into_iter().collect();
        while let Some(m) = stack.pop() {
            for &arg in &dag.nodes[m].args {
                if let Value::Node(p) = arg
                    && nodes.contains(&p)
                    && Some(p) != call
                    && !operands.contains(&p)
                {
                    operands.push(p);
                    stack.push(p);
                }
            }
        }
        operands.sort_unstable();
        // A transpose reading the product is the view it is written through (`result_view`);
        // a reshape reading it belongs to an epilogue over its split last axis.
        let result = nodes.iter().copied().find(|&n| {
            dag.nodes[n].op.builtin() == Some(Builtin::Transpose)
                && call.is_some_and(|c| dag.nodes[n].args.contains(&Value::Node(c)))
        });
        let epilogue = nodes
            .iter()
            .copied()
            .filter(|&n| Some(n) != call && !operands.contains(&n) && Some(n) != result)
            .collect();
        LibraryParts {
            call,
            operands,
            epilogue,
            result,
        }
    }
}

/// `partition` with library kernels merged into the kernels that read their products, one
/// call at a time in kernel order: `merged(partition, k)` gives, for library kernel `k`, the
/// index of the kernel it merges into and the merged kernel (which takes that kernel's place,
/// later than `k`), or `None` to keep both. The passes after the greedy partition that a
/// library call takes in (`epilogue`, `result_view`) differ only in `merged`.
/// The call (its node) of library kernel `kernel`, where a pass may merge the kernel that
/// reads its product into it: a call with neither an epilogue nor a result view yet, whose
/// product is no graph output and whose operands are matrices (rank 2 or more). What the
/// epilogue and result-view passes both start from.
fn mergeable_call(dag: &Dag, facts: &Facts, kernel: &Kernel) -> Option<usize> {
    if kernel.kind != KernelKind::Library {
        return None;
    }
    let parts = LibraryParts::of(dag, &kernel.nodes);
    let call = parts.call?;
    let matrices = dag.nodes[call]
        .args
        .iter()
        .all(|&a| dag.ty(a).shape.len() >= 2);
    let bare = parts.epilogue.is_empty() && parts.result.is_none();
    (bare && matrices && !facts.graph_output[call]).then_some(call)
}

fn merge_into_readers(
    mut partition: Partition,
    merged: impl Fn(&Partition, usize) -> Option<(usize, Kernel)>,
) -> Partition {
    let mut k = 0;
    while k < partition.kernels.len() {
        match merged(&partition, k) {
            Some((reader, kernel)) => {
                partition.kernels[reader] = kernel;
                partition.kernels.remove(k);
            }
            None => k += 1,
        }
    }
    partition.cost = partition.kernels.iter().map(|k| k.cost).sum();
    partition
}

pub use operand_view::{OperandTree, operand_tree, zero_padding, zero_slab};

/// How many launches a partition makes, counted the one way every report uses: generated
/// kernels (fused loops and copies) apart from library calls (matmul through cuBLAS or
/// `matrixmultiply`), which run code fusebox did not write and which fusion never removes.
/// Keeping one definition is what lets `optimize`, `--explain`, `run` and `bench` agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct KernelCount {
    /// Fused and copy kernels.
    pub kernels: usize,
    /// Library calls (opaque ops).
    pub library_calls: usize,
}

impl std::fmt::Display for KernelCount {
    /// `3 kernels`, or `3 kernels, 2 library calls` where there are library calls.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        write!(f, "{} kernel{}", self.kernels, plural(self.kernels))?;
        if self.library_calls > 0 {
            write!(
                f,
                ", {} library call{}",
                self.library_calls,
                plural(self.library_calls)
            )?;
        }
        Ok(())
    }
}

impl Partition {
    /// Its kernels and library calls, counted apart ([`KernelCount`]).
    pub fn count(&self) -> KernelCount {
        let library_calls = self
            .kernels
            .iter()
            .filter(|k| k.kind == KernelKind::Library)
            .count();
        KernelCount {
            kernels: self.kernels.len() - library_calls,
            library_calls,
        }
    }

    /// For each of the dag's `node_count` nodes, the index of its kernel (`None` for literals).
    pub fn kernel_of(&self, node_count: usize) -> Vec<Option<usize>> {
        let mut of = vec![None; node_count];
        for (k, kernel) in self.kernels.iter().enumerate() {
            for &n in &kernel.nodes {
                of[n] = Some(k);
            }
        }
        of
    }
}

/// The fused partition: legal per `fusion`, convex (a path that leaves a kernel never comes
/// back into it, so kernels run in the order given), and cost-driven: a node joins the
/// kernels of its producers only if that lowers the modeled total under `profile`. Greedy in
/// topological order; then, unless `fusion.siblings` is off, independent kernels that share
/// inputs or a domain are merged into multi-output kernels where that is cheaper still.
/// Typical dags of 10,000 nodes take milliseconds.
///
/// Then concats whose operands all come from fused kernels are written in place where that
/// is cheaper (see `partition/in_place.rs`): those kernels store each operand into its
/// segment of the concat's buffer, and the copy or range select of the concat goes away.
/// Last, under `library_epilogues`, a pointwise kernel that alone reads a library call's
/// product joins the call as its epilogue where that is cheaper (`partition/epilogue.rs`).
pub fn partition(dag: &Dag, fusion: &FusionRules, profile: &Profile) -> Partition {
    let role: Vec<Role> = dag.nodes.iter().map(|node| fusion.role(&node.op)).collect();
    let greedy = greedy::partition(dag, fusion, profile);
    // What the passes after the greedy one read of the dag, computed once for them all.
    let facts = Facts::new(dag, profile);
    let in_place =
        in_place::write_in_place(dag, &facts, &role, fusion.max_kernel_args, profile, greedy);
    let epilogues = epilogue::absorb_epilogues(dag, &facts, fusion, profile, in_place);
    Partition {
        row_arithmetic: fusion.row_arithmetic,
        ..result_view::absorb_result_views(dag, &facts, fusion, profile, epilogues)
    }
}

/// The baseline: one kernel per op, every value written to memory and read back. Literals are
/// not kernels; a pointwise or reduction op is a one-node fused kernel, a layout op a copy, an
/// opaque op a library call.
pub fn unfused(dag: &Dag, profile: &Profile) -> Partition {
    let facts = Facts::new(dag, profile);
    let kernels: Vec<Kernel> = (0..dag.nodes.len())
        .filter(|&n| !facts.literal[n])
        .map(|n| {
            let kind = match dag.nodes[n].op.kind() {
                OpKind::Pointwise | OpKind::Reduction => KernelKind::Fused,
                OpKind::Layout => KernelKind::Alone,
                OpKind::Opaque => KernelKind::Library,
            };
            let extra = facts.copy_read_extra(profile, n);
            facts.kernel(
                profile,
                vec![n],
                kind,
                facts.iter_shape(n).clone(),
                extra,
                |m| m == n,
            )
        })
        .collect();
    let cost = kernels.iter().map(|k| k.cost).sum();
    // One op per kernel has no row kernels for the setting to apply to.
    Partition {
        kernels,
        cost,
        row_arithmetic: RowArithmetic::default(),
        in_place: Vec::new(),
    }
}

/// Whether a node is a literal ([`OpDef::is_literal`]: a pointwise op without operands, such
/// as `const`). Its value is a function of attributes alone, so every kernel that uses it
/// computes it in place.
///
/// [`OpDef::is_literal`]: crate::rules::OpDef::is_literal
pub fn is_literal(node: &DagNode) -> bool {
    node.op.is_literal()
}

/// What the partitioner and the pricing need to know about each node, computed once.
pub(crate) struct Facts<'a> {
    pub dag: &'a Dag,
    pub literal: Vec<bool>,
    /// The value whose shape a node iterates over: a reduction's input, every other op's
    /// output.
    iter_value: Vec<Value>,
    /// Flop-equivalents per element of the iteration shape (0 for library calls).
    pub flops_per_element: Vec<f64>,
    /// Flop-equivalents of a library call (matmul: 2·M·N·K), 0 otherwise.
    pub library_flops: Vec<f64>,
    /// Whether a pointwise node's formula calls a function or divides
    /// ([`Expr::calls_or_divides`](crate::formula::Expr::calls_or_divides)): a value a row
    /// kernel keeps from an earlier pass instead of computing it again in its last.
    pub calls_or_divides: Vec<bool>,
    /// What a node adds to its kernel's loop body, in formula terms
    /// ([`OpDef::body_terms`](crate::rules::OpDef::body_terms)): the
    /// measure `max_kernel_terms` bounds.
    pub terms: Vec<usize>,
    pub node_bytes: Vec<u64>,
    pub input_bytes: Vec<u64>,
    pub graph_output: Vec<bool>,
    /// Node `n`'s users (once per use) are `user_list[user_start[n]..user_start[n + 1]]`.
    user_start: Vec<u32>,
    user_list: Vec<u32>,
}

/// The items of `pairs` (slot, item) grouped by slot, as slices of one list: slot `s` holds
/// `list[start[s]..start[s + 1]]`, in the order `pairs` yields them. `pairs` is walked twice.
pub(crate) fn slices_by_slot<I: Iterator<Item = (usize, u32)>>(
    slots: usize,
    pairs: impl Fn() -> I,
) -> (Vec<u32>, Vec<u32>) {
    let mut start = vec![0u32; slots + 1];
    for (slot, _) in pairs() {
        start[slot + 1] += 1;
    }
    for i in 0..slots {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut list = vec![0u32; start[slots] as usize];
    for (slot, item) in pairs() {
        list[fill[slot] as usize] = item;
        fill[slot] += 1;
    }
    (start, list)
}

/// A value's bytes, saturating rather than wrapping for a shape past the graph limits.
fn bytes_of(ty: &crate::graph::TensorType) -> u64 {
    (numel(&ty.shape) as u64).saturating_mul(ty.dtype.size_bytes() as u64)
}

impl<'a> Facts<'a> {
    pub fn new(dag: &'a Dag, profile: &Profile) -> Facts<'a> {
        let literal: Vec<bool> = dag.nodes.iter().map(|n| n.op.is_literal()).collect();
        let iter_value = dag
            .nodes
            .iter()
            .enumerate()
            .map(|(n, node)| match (node.op.kind(), node.args.first()) {
                (OpKind::Reduction, Some(&arg)) => arg,
                _ => Value::Node(n),
            })
            .collect();
        let (user_start, user_list) = slices_by_slot(dag.nodes.len(), || {
            dag.nodes.iter().enumerate().flat_map(|(n, node)| {
                node.args.iter().filter_map(move |&arg| match arg {
                    Value::Node(p) => Some((p, n as u32)),
                    Value::Input(_) => None,
                })
            })
        });
        let flops_per_element = dag
            .nodes
            .iter()
            .map(|node| profile.elementwise_flops(&node.op))
            .collect();
        let library_flops = dag
            .nodes
            .iter()
            .map(|node| match (node.op.builtin(), node.args.first()) {
                (Some(Builtin::MatMul), Some(&a)) => {
                    Profile::matmul_flops(&dag.ty(a).shape, &node.ty.shape)
                }
                _ => 0.0,
            })
            .collect();
        Facts {
            dag,
            literal,
            iter_value,
            flops_per_element,
            library_flops,
            calls_or_divides: dag
                .nodes
                .iter()
                .map(|node| {
                    node.op.kind() == OpKind::Pointwise
                        && node.op.formula().is_some_and(|f| f.calls_or_divides())
                })
                .collect(),
            terms: dag.nodes.iter().map(|node| node.op.body_terms()).collect(),
            node_bytes: dag.nodes.iter().map(|n| bytes_of(&n.ty)).collect(),
            input_bytes: dag.inputs.iter().map(|i| bytes_of(&i.ty)).collect(),
            graph_output: dag.output_mask(),
            user_start,
            user_list,
        }
    }

    /// The shape a node iterates over: a reduction's input shape, every other op's output.
    pub fn iter_shape(&self, n: usize) -> &'a Shape {
        &self.dag.ty(self.iter_value[n]).shape
    }

    /// The nodes using node `n`, once per use.
    pub fn users(&self, n: usize) -> &[u32] {
        &self.user_list[self.user_start[n] as usize..self.user_start[n + 1] as usize]
    }

    pub fn value_bytes(&self, value: Value) -> u64 {
        match value {
            Value::Input(i) => self.input_bytes[i],
            Value::Node(n) => self.node_bytes[n],
        }
    }

    /// A node's value must be written: a graph output, or used by a node outside its kernel.
    fn written(&self, n: usize, inside: &impl Fn(usize) -> bool) -> bool {
        self.graph_output[n] || self.users(n).iter().any(|&u| !inside(u as usize))
    }

    /// Extra bytes, beyond its value's, that layout node `n` moves when it reads its operand's
    /// contiguous buffer through its own index map once ([`Reads::extra_per_byte`]): what a
    /// copy kernel of a transpose pays to gather. 0 for every other node.
    ///
    /// [`Reads::extra_per_byte`]: crate::rules::Reads::extra_per_byte
    ///
    /// A gather reads at most one data element per result element, however large its data
    /// (an embedding table): its extra is negative, the data bytes it does not read.
    pub fn copy_read_extra(&self, profile: &Profile, n: usize) -> f64 {
        let node = &self.dag.nodes[n];
        if let (Some(Builtin::Gather | Builtin::GatherElements), [data, _]) =
            (node.op.builtin(), &node.args[..])
        {
            let stored = self.value_bytes(*data);
            let read = numel(&node.ty.shape) as u64 * node.ty.dtype.size_bytes() as u64;
            return -(stored.saturating_sub(read) as f64);
        }
        let (OpKind::Layout, Some(builtin), [x]) =
            (node.op.kind(), node.op.builtin(), &node.args[..])
        else {
            return 0.0;
        };
        let x_shape = &self.dag.ty(*x).shape;
        let Ok((plan, _)) = crate::graph::check::plan_builtin(builtin, &[x_shape], &node.attrs)
        else {
            return 0.0;
        };
        plan.index_map(&IndexMap::contiguous(x_shape), x_shape, &node.ty.shape)
            .map_or(0.0, |map| self.read_extra(profile, n, &map))
    }

    /// Extra bytes, beyond node `n`'s value, that one pass reading that value through `map`
    /// moves under `profile`'s read prices.
    pub fn read_extra(&self, profile: &Profile, n: usize, map: &IndexMap) -> f64 {
        let ty = &self.dag.nodes[n].ty;
        profile
            .reads
            .extra_per_byte(map, &ty.shape, ty.dtype.size_bytes())
            * self.node_bytes[n] as f64
    }

    /// How many launches node `n` takes as a kernel of its own: a concat is copied one
    /// operand per launch (see `lower::layout`), which matters where launches are dear (on a
    /// GPU four 8 KiB copies cost four launches, not one); any other node is one launch.
    pub fn alone_launches(&self, n: usize) -> usize {
        let node = &self.dag.nodes[n];
        if node.op.builtin() == Some(Builtin::Concat) {
            node.args.len().max(1)
        } else {
            1
        }
    }

    /// For reduction node `n`: the threads of its pass in a kernel holding it (and no row
    /// reduction read inside), by the profile's [`Reductions`] (the outputs it reduces, split
    /// between threads), which with the kernel's bytes say how much slower than the
    /// bandwidth it moves them ([`Cost::with_reduction_passes`]). `None` for other nodes.
    ///
    /// [`Reductions`]: crate::rules::Reductions
    pub fn reduction_threads(&self, profile: &Profile, n: usize) -> Option<f64> {
        let node = &self.dag.nodes[n];
        if node.op.kind() != OpKind::Reduction {
            return None;
        }
        let outputs = numel(&node.ty.shape);
        let input = node
            .args
            .first()
            .map_or(0, |&x| numel(&self.dag.ty(x).shape));
        let count = input.checked_div(outputs).unwrap_or(0);
        Some(profile.reductions.pass_threads(outputs, count))
    }

    /// Whether the kernel of `nodes` is a row kernel: one of them reads a reduction that
    /// `inside` says is in the kernel (only row reductions may be read where they are made).
    pub fn row_kernel(&self, nodes: &[usize], inside: impl Fn(usize) -> bool) -> bool {
        nodes.iter().any(|&m| {
            self.dag.nodes[m].args.iter().any(|&a| {
                matches!(a, Value::Node(q) if inside(q)
                    && self.dag.nodes[q].op.kind() == OpKind::Reduction)
            })
        })
    }

    /// Builds and prices a kernel from scratch. `inside` tells which nodes belong to it;
    /// `read_extra` is the bytes its reads move beyond the values' own (strided or gathered
    /// views, see [`Reads`](crate::rules::Reads)), priced at the profile's bandwidth but not
    /// counted in the kernel's `bytes`.
    pub fn kernel(
        &self,
        profile: &Profile,
        nodes: Vec<usize>,
        kind: KernelKind,
        domain: Shape,
        read_extra: f64,
        inside: impl Fn(usize) -> bool,
    ) -> Kernel {
        self.kernel_with(
            profile,
            nodes,
            kind,
            domain,
            read_extra,
            inside,
            Vec::new(),
            |_| false,
        )
    }

    /// [`Facts::kernel`] for a kernel that also stores `segments` into concats written in
    /// place: those stores are priced as writes, and a use by a concat `in_place` tells is no
    /// reason to write a value to a buffer of its own (the concat reads nothing: its operands'
    /// kernels write it).
    #[allow(clippy::too_many_arguments)]
    pub fn kernel_with(
        &self,
        profile: &Profile,
        nodes: Vec<usize>,
        kind: KernelKind,
        domain: Shape,
        read_extra: f64,
        inside: impl Fn(usize) -> bool,
        segments: Vec<SegmentWrite>,
        in_place: impl Fn(usize) -> bool,
    ) -> Kernel {
        let dag = self.dag;
        let mut inputs: Vec<Value> = Vec::new();
        // Small kernels dedupe by scanning; large ones through a set.
        let mut seen: HashSet<Value> = HashSet::new();
        for &n in &nodes {
            for &arg in &dag.nodes[n].args {
                let external = match arg {
                    Value::Input(_) => true,
                    Value::Node(p) => !self.literal[p] && !inside(p),
                };
                let new = if inputs.len() < 32 {
                    !inputs.contains(&arg)
                } else {
                    if seen.is_empty() {
                        seen.extend(inputs.iter().copied());
                    }
                    seen.insert(arg)
                };
                if external && new {
                    inputs.push(arg);
                }
            }
        }
        let outputs: Vec<Value> = nodes
            .iter()
            .filter(|&&n| self.written(n, &|u| inside(u) || in_place(u)))
            .map(|&n| Value::Node(n))
            .collect();
        let bytes: u64 = inputs
            .iter()
            .chain(&outputs)
            .copied()
            .chain(segments.iter().map(|s| Value::Node(s.value)))
            .map(|v| self.value_bytes(v))
            .sum();
        let mut per_segment = false;
        let cost = match kind {
            KernelKind::Library => {
                let flops: f64 = nodes.iter().map(|&n| self.library_flops[n]).sum();
                let parts = LibraryParts::of(dag, &nodes);
                // The call's own node sets the rate: casts it absorbed come before it.
                let call = parts.call.unwrap_or(nodes[0]);
                let dtype = dag.nodes[call].ty.dtype;
                let mut cost = price(
                    profile,
                    bytes,
                    read_extra,
                    flops,
                    profile.matmul_rate(dtype),
                );
                // An epilogue runs its pointwise arithmetic on each finished tile.
                if !parts.epilogue.is_empty() {
                    let in_epilogue = |m: usize| parts.epilogue.contains(&m);
                    let epilogue = self.fused_arithmetic(&parts.epilogue, &domain, in_epilogue);
                    cost.compute_us +=
                        Profile::compute_us(epilogue.flops, profile.pointwise_gflops);
                    cost.flops += epilogue.flops.round() as u64;
                    cost.total_us = profile.combine(cost.memory_us, cost.compute_us);
                }
                cost
            }
            KernelKind::Fused | KernelKind::Alone => {
                let arithmetic = self.fused_arithmetic(&nodes, &domain, &inside);
                per_segment = kind == KernelKind::Fused && arithmetic.per_segment;
                price(
                    profile,
                    bytes,
                    read_extra,
                    arithmetic.flops,
                    profile.pointwise_gflops,
                )
            }
        };
        let cost = match (kind, nodes.as_slice()) {
            (KernelKind::Alone, &[n]) => cost.with_launches(self.alone_launches(n), profile),
            // A row kernel (a reduction read inside) runs as one launch.
            (KernelKind::Fused, _) if !self.row_kernel(&nodes, &inside) => {
                let threads = nodes
                    .iter()
                    .filter_map(|&n| self.reduction_threads(profile, n))
                    .reduce(f64::min);
                cost.with_reduction_passes(threads, profile)
            }
            _ => cost,
        };
        Kernel {
            nodes,
            inputs,
            outputs,
            domain,
            kind,
            cost,
            read_extra,
            segments,
            per_segment,
        }
    }
}

impl Cost {
    /// This cost for a fused kernel that is no row kernel, as the profile's
    /// [`Reductions`](crate::rules::Reductions) run its reductions: with `threads` (its
    /// thinnest reduction's pass, see [`Facts::reduction_threads`]; `None` without
    /// reductions), the extra launches of its passes and its bytes moved as many times slower
    /// as so many threads moving them make it.
    pub(crate) fn with_reduction_passes(self, threads: Option<f64>, profile: &Profile) -> Cost {
        let Some(threads) = threads else {
            return self;
        };
        let factor = profile.reductions.memory_factor(threads, self.bytes as f64);
        let memory_us = self.memory_us * factor;
        let extra = profile.reductions.extra_launches * profile.launch_us;
        Cost {
            launch_us: self.launch_us + extra,
            memory_us,
            total_us: profile.combine(memory_us, self.compute_us) + extra,
            ..self
        }
    }

    /// This cost for a kernel that takes `launches` launches instead of one.
    pub(crate) fn with_launches(self, launches: usize, profile: &Profile) -> Cost {
        let extra = launches.saturating_sub(1) as f64 * profile.launch_us;
        Cost {
            launch_us: self.launch_us + extra,
            total_us: self.total_us + extra,
            ..self
        }
    }
}

/// The cost of one kernel that moves `bytes` and does `flops` at `gflops`, its reads moving
/// `read_extra` bytes more (lines touched but not used: strided or gathered views). The extra
/// is time, not traffic a report counts: `bytes` stays the values' bytes.
pub(crate) fn price(
    profile: &Profile,
    bytes: u64,
    read_extra: f64,
    flops: f64,
    gflops: f64,
) -> Cost {
    let memory_us = profile.memory_us(bytes as f64 + read_extra);
    let compute_us = Profile::compute_us(flops, gflops);
    Cost {
        launch_us: profile.launch_us,
        memory_us,
        compute_us,
        total_us: profile.combine(memory_us, compute_us),
        bytes,
        flops: flops.round() as u64,
    }
}

/// Whether something iterating over `part` can run inside a kernel over `domain`: its shape
/// broadcasts to the domain, and the domain has a point at which to compute it. A kernel
/// over an empty domain visits no point, so a non-empty value (a `[1, 3]` beside a `[0, 3]`)
/// would never be computed there.
pub(crate) fn fits(part: &[usize], domain: &[usize]) -> bool {
    crate::shape::broadcasts_to(part, domain) && (numel(domain) > 0 || numel(part) == 0)
}

/// Whether node `n` is a *row reduction*: a reduction of the innermost axis of its input
/// (other reduced axes, if any, have size 1) whose result, right-aligned against that input,
/// has one element per row: the input's shape with the innermost axis made 1. Such a result
/// may be consumed inside its kernel where fusion.ron gives it the role `Rows`: every point of
/// the kernel's domain (the input's shape) reads the result of its own row.
///
/// The alignment matters as much as the axes: `sum(x, axes = [1])` of a `[4, 4]` without
/// `keepdim` is `[4]`, which broadcasts against `[4, 4]` along the *other* axis, so a
/// consumer would read column sums where a row kernel holds row sums. It stays `End`.
pub fn row_reduction(dag: &Dag, n: usize) -> bool {
    let node = &dag.nodes[n];
    let Some(&x) = node.args.first() else {
        return false;
    };
    let x_shape = &dag.ty(x).shape;
    let Some(last) = x_shape.len().checked_sub(1) else {
        return false;
    };
    let Some(reduced) = reduced_axes(dag, n, x_shape.len()) else {
        return false;
    };
    let axes_ok = reduced[last] && (0..last).all(|d| !reduced[d] || x_shape[d] == 1);
    let out = &node.ty.shape;
    if !axes_ok || out.len() > x_shape.len() {
        return false;
    }
    let pad = x_shape.len() - out.len();
    (0..=last).all(|d| {
        let o = if d < pad { 1 } else { out[d - pad] };
        if d == last { o == 1 } else { o == x_shape[d] }
    })
}

/// For reduction node `n` evaluated over a domain of rank `rank`: per domain axis, whether
/// it reduces that axis ([`BuiltinPlan::reduced_axes`](crate::graph::check::BuiltinPlan));
/// `None` for other nodes, or where the plan cannot be read.
pub(crate) fn reduced_axes(dag: &Dag, n: usize, rank: usize) -> Option<Vec<bool>> {
    let node = &dag.nodes[n];
    let (OpKind::Reduction, Some(&x)) = (node.op.kind(), node.args.first()) else {
        return None;
    };
    let x_shape = &dag.ty(x).shape;
    let (plan, _) = crate::graph::check::plan_builtin(
        node.op.builtin().unwrap_or(Builtin::Sum),
        &[x_shape],
        &node.attrs,
    )
    .ok()?;
    plan.reduced_axes(x_shape.len(), rank)
}

/// The kernel kind a node of this role starts.
pub(crate) fn kind_of(role: Role) -> KernelKind {
    match role {
        Role::Join | Role::End | Role::Rows => KernelKind::Fused,
        Role::Alone => KernelKind::Alone,
        Role::Never => KernelKind::Library,
    }
}
