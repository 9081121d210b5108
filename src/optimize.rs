//! `optimize()`: the whole pipeline from a checked graph to fused kernels and a report.
//!
//! graph → [`Dag`] → e-graph seeded with it → saturation under the rewrite rules →
//! extraction, where each candidate is costed by partitioning it into kernels per
//! `fusion.ron` and pricing them per `cost.ron` → the chosen graph, its kernels, a report.
//! The kernels returned are exactly the ones the cost in the report was computed for.
//!
//! With an AMP policy ([`Options::amp`]) the pipeline starts from the graph with the policy's
//! casts inserted ([`crate::amp::insert_casts`]): the casts are part of the program, so
//! saturation and extraction may move or merge them only by exact rules (no rounding the
//! policy asked for disappears), and the partitioner fuses them into neighbouring kernels or,
//! per `library_casts`, into the library call that reads them.

use crate::dag::{Dag, Value};
use crate::egraph::{self, ENode, FuseGraph};
use crate::error::Result;
use crate::extract::{self, ExtractOptions, Method};
use crate::graph::Graph;
use crate::hoist::{self, Hoist, HoistedValue};
use crate::partition::{self, Kernel, KernelKind, Partition};
use crate::rules::{Builtin, OpKind, Profile, RuleSet};
use crate::saturate::{self, Limits, PhaseReport, Saturation, Stop};
use crate::shape::{self, Shape};
use egg::Id;
use serde::Serialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// How to optimize.
#[derive(Debug, Clone)]
pub struct Options {
    /// A profile of `cost.ron` (`cpu`, `h200`, or one a rule directory adds).
    pub profile: String,
    pub limits: Limits,
    pub extract: ExtractOptions,
    /// Show a progress spinner on a terminal when saturation runs long.
    pub progress: bool,
    /// Apply the rewrite rules; without them the input graph is only partitioned, which is what
    /// the report's `cost_unrewritten` measures.
    pub rewrite: bool,
    /// Leave out the rules marked `finite_only` (exact in real arithmetic but not under IEEE
    /// infinities and NaN), so every rewrite preserves Inf and NaN exactly.
    pub strict_ieee: bool,
    /// An AMP policy of `amp.ron` (`f16`, `bf16`, or one a rule directory adds): insert its
    /// casts first and optimize the result. `None` optimizes the graph as written.
    pub amp: Option<String>,
    /// Rewrite and fuse. Off, the graph (with its AMP casts) runs one op per kernel: the
    /// unfused baseline, through the same lowering and code generators.
    pub fusion: bool,
    /// The inputs whose values are the same on every run (a model's stored weights): what
    /// they alone determine is computed once, not per run ([`crate::hoist`]), and extraction
    /// prices each candidate without it. Empty (the default), every input may change per run.
    pub fixed: BTreeSet<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            profile: "cpu".into(),
            limits: Limits::default(),
            extract: ExtractOptions::default(),
            progress: false,
            rewrite: true,
            strict_ieee: false,
            amp: None,
            fusion: true,
            fixed: BTreeSet::new(),
        }
    }
}

/// The result of [`optimize`].
#[derive(Debug, Clone)]
pub struct Optimized {
    /// The optimized graph, ready to save or evaluate. Output names are the input's. It
    /// includes what [`Optimized::hoist`] computes, so it runs on the inputs alone.
    pub graph: Graph,
    /// The graph that runs every time, in index form: [`Optimized::graph`] without the hoisted
    /// values, which it reads as inputs. Kernel node indices refer to it.
    pub dag: Dag,
    /// What computes the hoisted values from the fixed inputs ([`Options::fixed`]), once;
    /// `None` when nothing is hoisted.
    pub hoist: Option<Hoist>,
    /// The graph optimization started from: the input, or with AMP the input with the
    /// policy's casts inserted (what `fusebox run --amp` evaluates).
    pub input: Graph,
    /// The fused kernels the lowering emits, and their modeled cost.
    pub partition: Partition,
    pub report: Report,
}

/// What optimization did, for people (`--explain`) and for tools (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub graph: String,
    pub profile: String,
    /// The AMP policy applied, if any. The "before" figures below are those of the graph with
    /// its casts inserted, run one op per kernel.
    pub amp: Option<String>,
    /// Casts the AMP policy inserted (0 without AMP).
    pub casts_inserted: usize,
    /// One kernel per op that is not opaque (and not a `const` literal): the unfused baseline.
    /// Kernels and library calls are counted apart, as [`partition::KernelCount`] defines
    /// them, here and in every other report.
    pub kernels_before: usize,
    /// Fused and copy kernels after optimization (library calls counted apart).
    pub kernels_after: usize,
    /// Opaque ops (matmul) run as library calls, before and after.
    pub library_calls_before: usize,
    pub library_calls_after: usize,
    pub casts_before: usize,
    pub casts_after: usize,
    /// Kernels after optimization that do nothing but cast: every node in them is a cast.
    /// Casts fused into a computing kernel or absorbed by a library call are not counted.
    pub cast_kernels_after: usize,
    /// Bytes moved at kernel boundaries.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Modeled time in microseconds: the input run one op per kernel …
    pub cost_before: f64,
    /// … the input graph fused as written, without rewrites …
    pub cost_unrewritten: f64,
    /// … and the optimized graph fused.
    pub cost_after: f64,
    pub egraph: EGraphReport,
    /// Unions made per rule (both directions of a bidirectional rule under its name).
    pub rules: BTreeMap<String, usize>,
    pub extraction: ExtractionReport,
    pub kernels: Vec<KernelReport>,
    /// The values computed once from the fixed inputs ([`Options::fixed`]), which the
    /// kernels read as inputs. Left out of the JSON when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hoisted: Vec<HoistedValue>,
    pub time_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EGraphReport {
    pub nodes: usize,
    pub classes: usize,
    pub iterations: usize,
    pub stop_reason: Stop,
    pub limited: bool,
    pub time_ms: f64,
    pub phases: Vec<PhaseReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExtractionReport {
    /// `exact` (every combination of choices tried) or `greedy`; `null` when nothing was
    /// extracted (fusion off).
    pub method: Option<Method>,
    /// Candidate graphs partitioned and costed.
    pub evaluations: usize,
    /// The extracted graph cost more than the input fused as written, so the input was kept.
    pub kept_input: bool,
    pub time_ms: f64,
}

/// One kernel as the report shows it.
#[derive(Debug, Clone, Serialize)]
pub struct KernelReport {
    pub kind: KernelKind,
    pub domain: Shape,
    /// `name = op` for each node, in order.
    pub ops: Vec<String>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub bytes: u64,
    pub flops: u64,
    pub cost_us: f64,
    /// How each concat of the kernel runs: the cost model's choice between reading it by
    /// ranges and copying it. Left out of the JSON when the kernel has none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub concats: Vec<ConcatReport>,
    /// Values stored straight into their segments of concats written in place, as
    /// `value -> concat[start..end on axis a]`. Left out of the JSON when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub writes_in_place: Vec<String>,
    /// Of a library kernel's `ops`, the epilogue it runs on each tile of the product (the
    /// rest are the call and the casts and views it reads its operands through). Left out of
    /// the JSON when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub epilogue: Vec<String>,
}

/// One concat and how it runs.
#[derive(Debug, Clone, Serialize)]
pub struct ConcatReport {
    pub node: String,
    /// `range select`: the kernel reads each operand over its segment and picks by index, so
    /// the concatenated value never exists in memory. `copy`: a copy per operand writes it.
    /// `in place`: the kernels producing its operands store them into its segments, and no
    /// kernel of its own exists (reported with each kernel that stores segments). `stacked
    /// view`: a library call reads it as one strided view of its operands' buffer (a
    /// convolution's windows), and nothing is copied.
    pub strategy: &'static str,
    /// Operands with elements (segments the kernel selects among, or, in place, stores).
    pub segments: usize,
    /// What copying it moves: its operands read and its value written. A range select saves
    /// that traffic and the readers' read of the copy, and pays by evaluating every segment's
    /// ops at every point of its kernel.
    pub copy_bytes: u64,
    /// A range select whose kernel runs as pieces, each point evaluating only the operand its
    /// segment selects (a loop per segment, a piece per row of one loop nest, or a piece per
    /// CUDA thread's point; false where it evaluates every operand at every point, and for
    /// the other strategies).
    pub per_segment: bool,
}

/// Optimizes `graph` under `rules`.
///
/// ```
/// use fusebox::dtype::DType;
/// use fusebox::graph::GraphBuilder;
/// use fusebox::optimize::{optimize, Options};
/// use fusebox::rules::RuleSet;
///
/// let mut b = GraphBuilder::new("tail");
/// let x = b.input("x", DType::F32, &[64, 256]);
/// let s = b.op("s", "sigmoid", &[&x]);
/// let t = b.op("t", "tanh", &[&s]);
/// let graph = b.finish(&[&t]);
/// let out = optimize(&graph, &RuleSet::defaults(), &Options::default()).unwrap();
/// assert_eq!(out.report.kernels_before, 2);
/// assert_eq!(out.report.kernels_after, 1);
/// assert!(out.report.cost_after < out.report.cost_before);
/// ```
pub fn optimize(graph: &Graph, rules: &RuleSet, options: &Options) -> Result<Optimized> {
    let start = Instant::now();
    let profile = rules.cost.profile(&options.profile)?;
    let (graph, casts_inserted) = with_amp(graph, rules, options.amp.as_deref())?;
    let graph = graph.as_ref();
    let input = Dag::from_graph(graph, &rules.ops)?.without_dead_nodes();
    let before = partition::unfused(&input, profile);
    let unrewritten = Chosen::of(input.clone(), options, rules, profile);
    let cost_unrewritten = unrewritten.partition.cost.total_us;
    let (chosen, saturation, extraction) = if options.fusion {
        fuse(&input, unrewritten, rules, profile, options)?
    } else {
        let extraction = ExtractionReport {
            method: None,
            evaluations: 0,
            kept_input: true,
            time_ms: 0.0,
        };
        let baseline = Chosen {
            whole: input.clone(),
            run: input.clone(),
            hoist: None,
            partition: before.clone(),
        };
        (baseline, Saturation::not_run(), extraction)
    };
    let optimized = chosen.whole.to_graph();
    let Chosen {
        run: dag,
        partition: after,
        ..
    } = chosen;
    let hoist = chosen.hoist.as_ref().map(Hoist::new);
    let (count_before, count_after) = (before.count(), after.count());
    let cast_kernels_after = after
        .kernels
        .iter()
        .filter(|k| {
            k.nodes
                .iter()
                .all(|&n| dag.nodes[n].op.builtin() == Some(Builtin::Cast))
        })
        .count();
    let report = Report {
        graph: graph.name.clone(),
        profile: options.profile.clone(),
        amp: options.amp.clone(),
        casts_inserted,
        kernels_before: count_before.kernels,
        kernels_after: count_after.kernels,
        library_calls_before: count_before.library_calls,
        library_calls_after: count_after.library_calls,
        casts_before: input.count_builtin(Builtin::Cast),
        casts_after: dag.count_builtin(Builtin::Cast),
        cast_kernels_after,
        bytes_before: before.cost.bytes,
        bytes_after: after.cost.bytes,
        cost_before: before.cost.total_us,
        cost_unrewritten,
        cost_after: after.cost.total_us,
        egraph: EGraphReport {
            nodes: saturation.nodes,
            classes: saturation.classes,
            iterations: saturation.iterations,
            stop_reason: saturation.stop_reason,
            limited: saturation.limited,
            time_ms: saturation.time_ms,
            phases: saturation.phases,
        },
        rules: saturation.firings,
        extraction,
        kernels: after
            .kernels
            .iter()
            .map(|k| kernel_report(&dag, k))
            .collect(),
        hoisted: hoist.as_ref().map(Hoist::describe).unwrap_or_default(),
        time_ms: start.elapsed().as_secs_f64() * 1e3,
    };
    Ok(Optimized {
        graph: optimized,
        dag,
        hoist,
        input: graph.clone(),
        partition: after,
        report,
    })
}

/// The graph the pipeline starts from: `graph` with the casts of the AMP policy named `amp`
/// (a policy of `amp.ron`) inserted, and how many casts that added. This is the one place a
/// policy is applied: [`optimize`] starts from it, and the reference backend evaluates it, so
/// both see the same program.
pub fn with_amp<'g>(
    graph: &'g Graph,
    rules: &RuleSet,
    amp: Option<&str>,
) -> Result<(Cow<'g, Graph>, usize)> {
    Ok(match amp {
        Some(name) => {
            let applied = crate::amp::insert_casts(graph, &rules.ops, rules.amp.policy(name)?)?;
            (Cow::Owned(applied.graph), applied.casts_inserted)
        }
        None => (Cow::Borrowed(graph), 0),
    })
}

/// Saturation and extraction: the cheapest form of `input` the rewrites reach, its partition,
/// and what the two phases did. `unrewritten` is `input` fused as written.
fn fuse(
    input: &Dag,
    unrewritten: Chosen,
    rules: &RuleSet,
    profile: &Profile,
    options: &Options,
) -> Result<(Chosen, Saturation, ExtractionReport)> {
    let mut egraph = egraph::new_egraph(input, &rules.ops);
    egraph.analysis.fixed = options.fixed.iter().map(egg::Symbol::from).collect();
    let mut seeded = egraph::seed(&mut egraph, input);
    egraph.rebuild();
    let active: Vec<&crate::rewrite::Rule> = rules
        .rewrites
        .iter()
        .filter(|r| options.rewrite && !(options.strict_ieee && r.finite_only))
        .collect();
    let (egraph, saturation) =
        saturate::saturate(egraph, &active, &options.limits, options.progress)?;
    seeded.canonicalize(&egraph);

    let extract_start = Instant::now();
    let cost = |dag: &Dag| runs(dag, options, rules, profile).2.cost.total_us;
    // What the fixed inputs determine is computed once: free to the bottom-up estimate, so
    // that extraction can reach a form that moves work onto the weights several rewrites deep
    // (the true cost of each candidate, after the hoist, then decides).
    let estimate = |egraph: &FuseGraph, id: Id, node: &ENode| match egraph[id].data.tensor() {
        Some(t) if t.origin == egraph::Origin::Fixed => 0.0,
        _ => estimate(egraph, id, node),
    };
    let extraction = extract::extract(&egraph, &seeded, &cost, &estimate, &options.extract);
    let extract_ms = extract_start.elapsed().as_secs_f64() * 1e3;

    // Classes merged by a simplification can make the input's own form unreachable (once
    // `max(x, x)` is proven equal to `x`, choosing it would be a cycle), and the partitioner
    // only fuses along producer-consumer edges, so a simpler graph can fuse worse. The input
    // fused as written is always a valid answer: keep it when extraction did not beat it.
    let extracted = Chosen::of(extraction.dag, options, rules, profile);
    // Strictly cheaper by more than rounding: two forms of equal cost sum their kernels in
    // different orders, and a tie decided by the last bit would choose differently at different
    // sizes of a symbolic dimension (and so compile other kernels for each).
    let kept_input =
        unrewritten.partition.cost.total_us < extracted.partition.cost.total_us * (1.0 - COST_TIE);
    let chosen = if kept_input { unrewritten } else { extracted };
    Ok((
        chosen,
        saturation,
        ExtractionReport {
            method: Some(extraction.method),
            evaluations: extraction.evaluations,
            kept_input,
            time_ms: extract_ms,
        },
    ))
}

/// What of `dag` runs every time, as the partitioner sees it, and its partition: all of it,
/// less what the fixed inputs alone determine (returned as the hoist that computes it). Where
/// extraction merged equal computed constants (two convolutions' padding slabs), the form with
/// each made anew where it is read ([`Dag::with_constants_unshared`]) is priced too, and the
/// cheaper kept.
fn runs<'d>(
    dag: &'d Dag,
    options: &Options,
    rules: &RuleSet,
    profile: &Profile,
) -> (Cow<'d, Dag>, Option<Dag>, Partition) {
    let (run, hoist) = match hoist::split(dag, &options.fixed) {
        Some(split) => (Cow::Owned(split.run), Some(split.hoist)),
        None => (Cow::Borrowed(dag), None),
    };
    let shared = partition::partition(&run, &rules.fusion, profile);
    if let Some(unshared) = run.with_constants_unshared() {
        let apart = partition::partition(&unshared, &rules.fusion, profile);
        if apart.cost.total_us < shared.cost.total_us {
            return (Cow::Owned(unshared), hoist, apart);
        }
    }
    (run, hoist, shared)
}

/// A candidate graph as the pipeline keeps it: the whole graph (what `--emit ron` saves), what
/// of it runs every time ([`runs`]) with the hoist it leaves out, and the partition of that.
struct Chosen {
    whole: Dag,
    run: Dag,
    hoist: Option<Dag>,
    partition: Partition,
}

impl Chosen {
    fn of(whole: Dag, options: &Options, rules: &RuleSet, profile: &Profile) -> Chosen {
        let (run, hoist, partition) = runs(&whole, options, rules, profile);
        let run = run.into_owned();
        Chosen {
            whole,
            partition,
            run,
            hoist,
        }
    }
}

/// The relative difference below which two modeled costs are equal.
const COST_TIE: f64 = 1e-9;

fn kernel_report(dag: &Dag, kernel: &Kernel) -> KernelReport {
    let names = |values: &[Value]| {
        values
            .iter()
            .map(|&v| dag.value_name(v).to_string())
            .collect()
    };
    let op = |i: usize| format!("{} = {}", dag.nodes[i].name, dag.nodes[i].op.name());
    let epilogue = match kernel.kind {
        KernelKind::Library => crate::partition::LibraryParts::of(dag, &kernel.nodes).epilogue,
        _ => Vec::new(),
    };
    KernelReport {
        kind: kernel.kind,
        domain: kernel.domain.clone(),
        ops: kernel
            .nodes
            .iter()
            .filter(|n| !epilogue.contains(n))
            .map(|&i| op(i))
            .collect(),
        epilogue: epilogue.iter().map(|&i| op(i)).collect(),
        inputs: names(&kernel.inputs),
        outputs: names(&kernel.outputs),
        bytes: kernel.cost.bytes,
        flops: kernel.cost.flops,
        cost_us: kernel.cost.total_us,
        concats: kernel
            .nodes
            .iter()
            .filter(|&&n| dag.nodes[n].op.builtin() == Some(Builtin::Concat))
            .map(|&n| concat_report(dag, kernel, n))
            .chain(in_place_reports(dag, kernel))
            .collect(),
        writes_in_place: kernel
            .segments
            .iter()
            .map(|s| {
                let len = dag.nodes[s.value]
                    .ty
                    .shape
                    .get(s.axis)
                    .copied()
                    .unwrap_or(0);
                format!(
                    "{} -> {}[{}..{} on axis {}]",
                    dag.nodes[s.value].name,
                    dag.nodes[s.concat].name,
                    s.start,
                    s.start + len,
                    s.axis
                )
            })
            .collect(),
    }
}

/// One report per concat that `kernel` writes in place, with how many of its segments.
fn in_place_reports<'a>(
    dag: &'a Dag,
    kernel: &'a Kernel,
) -> impl Iterator<Item = ConcatReport> + 'a {
    let mut concats: Vec<usize> = kernel.segments.iter().map(|s| s.concat).collect();
    concats.dedup();
    concats.into_iter().map(move |c| ConcatReport {
        strategy: "in place",
        segments: kernel.segments.iter().filter(|s| s.concat == c).count(),
        per_segment: false,
        ..concat_report(dag, kernel, c)
    })
}

fn concat_report(dag: &Dag, kernel: &Kernel, n: usize) -> ConcatReport {
    let strategy = match kernel.kind {
        KernelKind::Alone => "copy",
        KernelKind::Library => "stacked view",
        _ => "range select",
    };
    let node = &dag.nodes[n];
    let bytes = |v: Value| {
        let ty = dag.ty(v);
        (shape::numel(&ty.shape) as u64).saturating_mul(ty.dtype.size_bytes() as u64)
    };
    let read: u64 = node.args.iter().map(|&a| bytes(a)).sum();
    ConcatReport {
        node: node.name.clone(),
        strategy,
        segments: node
            .args
            .iter()
            .filter(|&&a| shape::numel(&dag.ty(a).shape) > 0)
            .count(),
        copy_bytes: read.saturating_add(bytes(Value::Node(n))),
        per_segment: kernel.per_segment,
    }
}

/// The greedy extractor's standalone guess at one e-node's cost, in arbitrary units that only
/// need to rank alternatives: work proportional to the elements produced, heavier for ops that
/// cannot fuse (they cost a launch and a round trip through memory). Local search then judges
/// candidates by the true partition cost.
fn estimate(egraph: &FuseGraph, id: Id, node: &ENode) -> f64 {
    let Some(ty) = egraph[id].data.ty() else {
        return 0.0;
    };
    let elements = shape::numel(&ty.shape) as f64;
    let Some(op) = node
        .op_name()
        .and_then(|n| egraph.analysis.catalogue.get(n))
    else {
        return 0.0;
    };
    if op.is_literal() {
        return 0.0;
    }
    let weight = match op.kind() {
        OpKind::Pointwise => 1.0,
        OpKind::Layout if op.builtin() == Some(Builtin::BroadcastTo) => 0.5,
        OpKind::Layout | OpKind::Reduction => 4.0,
        OpKind::Opaque => 16.0,
    };
    let bytes = ty.dtype.size_bytes() as f64;
    // The 1 per node: among forms doing equal work, fewer nodes rank first.
    weight * elements * bytes / 4.0 + 1.0
}
