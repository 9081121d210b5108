//! Greedy extraction against the exact optimum on random small e-graphs.
//!
//! Each instance is a random graph (pointwise ops, casts, broadcast_to, sum_to_size, constants;
//! f16, f32 and f64 values), seeded into an e-graph and saturated with a handful of rewrites
//! written here with egg's own macro, so this test does not depend on the rule files. The true
//! cost is a small fusion-like model defined below: kernels end at reductions, outputs and
//! values used twice; a kernel pays a launch, the bytes it reads and writes, and its
//! arithmetic. That cost is not a sum over nodes, which is the situation extraction is for.
//!
//! On every instance: exact ≤ greedy ≤ original under that cost, every result is a valid
//! acyclic graph, and every result computes what the original graph computes on random inputs.
//! The gap of greedy to exact is printed and bounded.

use egg::{Id, Rewrite, Runner, Subst, rewrite};
use fusebox::attr::AttrValue;
use fusebox::dag::{Dag, Value};
use fusebox::dtype::DType;
use fusebox::egraph::{ENode, FuseGraph, Leaf, Seeded, TypeAnalysis, new_egraph, seed};
use fusebox::extract::{self, ExtractOptions, Extraction, Method};
use fusebox::graph::{Graph, GraphBuilder, check};
use fusebox::partition;
use fusebox::rules::{Catalogue, OpKind, RuleSet};
use fusebox::shape::numel;
use fusebox::tensor::{Tensor, seeded_rng};
use rand::RngExt;
use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::time::Instant;

type Rng = rand_chacha::ChaCha8Rng;

// ------------------------------------------------------------------------------ random graphs

/// A random graph over a base shape `[rows, cols]`: inputs of that shape or of shapes that
/// broadcast to it, then `ops` random nodes (some of them small motifs a rewrite improves
/// under a fusion cost), then one or two outputs.
fn random_graph(rng: &mut Rng, index: usize, ops: RangeInclusive<usize>) -> Graph {
    let rows = rng.random_range(2..=4usize);
    let cols = rng.random_range(2..=5usize);
    let full = vec![rows, cols];
    let reduced = [vec![cols], vec![1, cols], vec![rows, 1]];
    let dtypes = [DType::F32, DType::F32, DType::F64, DType::F16];
    let mut b = GraphBuilder::new(&format!("random_{index}"));
    // (name, shape) of every value so far.
    let mut values: Vec<(String, Vec<usize>)> = Vec::new();
    for i in 0..rng.random_range(2..=3usize) {
        let shape = if i == 0 || rng.random_bool(0.5) {
            full.clone()
        } else {
            reduced[rng.random_range(0..reduced.len())].clone()
        };
        let dtype = dtypes[rng.random_range(0..dtypes.len())];
        let name = b.input(&format!("in{i}"), dtype, &shape);
        values.push((name, shape));
    }
    // An f64 weight of a reduced shape, for the Σ g·w = w·Σ g motif below.
    let weight = rng.random_bool(0.5).then(|| {
        let shape = reduced[rng.random_range(0..2usize)].clone();
        (b.input("w", DType::F64, &shape), shape)
    });
    let ops = rng.random_range(ops);
    for i in 0..ops {
        let name = format!("v{i}");
        let pick = |rng: &mut Rng, values: &[(String, Vec<usize>)]| {
            values[rng.random_range(0..values.len())].clone()
        };
        let (x, xs) = pick(rng, &values);
        let shape = match rng.random_range(0..13u32) {
            0..=2 => {
                let op = ["add", "sub", "mul", "max"][rng.random_range(0..4usize)];
                let (y, ys) = pick(rng, &values);
                b.op(&name, op, &[&x, &y]);
                broadcast(&xs, &ys)
            }
            3 => {
                // A divisor that is at least 1, so no value turns infinite.
                let (y, ys) = pick(rng, &values);
                let a = b.op(&format!("{name}_abs"), "abs", &[&y]);
                let one = b.constant(&format!("{name}_one"), 1.0, DType::F32);
                let d = b.op(&format!("{name}_den"), "add", &[&a, &one]);
                b.op(&name, "div", &[&x, &d]);
                values.push((d, ys.clone()));
                broadcast(&xs, &ys)
            }
            4..=5 => {
                let op = ["neg", "neg", "relu", "abs", "tanh"][rng.random_range(0..5usize)];
                b.op(&name, op, &[&x]);
                xs
            }
            6 => {
                let dtype = [DType::F16, DType::F32, DType::F64][rng.random_range(0..3usize)];
                b.op_with(&name, "cast", &[&x], &[("dtype", dtype.into())]);
                xs
            }
            7 if xs != full => {
                let to: Vec<i64> = full.iter().map(|&d| d as i64).collect();
                b.op_with(&name, "broadcast_to", &[&x], &[("shape", to.into())]);
                full.clone()
            }
            8 if xs == full => {
                let to = reduced[rng.random_range(0..reduced.len())].clone();
                let attr: Vec<i64> = to.iter().map(|&d| d as i64).collect();
                b.op_with(&name, "sum_to_size", &[&x], &[("shape", attr.into())]);
                to
            }
            // Motifs a rewrite can improve under a fusion cost.
            10 if xs == full => {
                // neg after a reduction: moved before it, it fuses into the reduction.
                let to = reduced[rng.random_range(0..reduced.len())].clone();
                let attr: Vec<i64> = to.iter().map(|&d| d as i64).collect();
                let r = b.op_with(
                    &format!("{name}_sum"),
                    "sum_to_size",
                    &[&x],
                    &[("shape", attr.into())],
                );
                b.op(&name, "neg", &[&r]);
                values.push((r, to.clone()));
                to
            }
            11 if xs == full && weight.is_some() => {
                // Σ g then ·w: as Σ (g·w) it is one kernel (the LSTM backward argument).
                let (w, ws) = weight.clone().expect("checked");
                let g = b.op_with(
                    &format!("{name}_g"),
                    "cast",
                    &[&x],
                    &[("dtype", DType::F64.into())],
                );
                let attr: Vec<i64> = ws.iter().map(|&d| d as i64).collect();
                let r = b.op_with(
                    &format!("{name}_sum"),
                    "sum_to_size",
                    &[&g],
                    &[("shape", attr.into())],
                );
                b.op(&name, "mul", &[&r, &w]);
                values.push((r, ws.clone()));
                ws
            }
            12 => {
                // x - (-y): two negations that cancel.
                let (y, ys) = pick(rng, &values);
                let n = b.op(&format!("{name}_neg"), "neg", &[&y]);
                b.op(&name, "sub", &[&x, &n]);
                broadcast(&xs, &ys)
            }
            _ => {
                let c = [2.0, -1.0, 0.5][rng.random_range(0..3usize)];
                let k = b.constant(&format!("{name}_c"), c, DType::F32);
                b.op(&name, "mul", &[&x, &k]);
                xs
            }
        };
        values.push((name, shape));
    }
    let last = values.last().expect("nodes were added").0.clone();
    let node_values: Vec<&String> = values
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !n.starts_with("in") && **n != last)
        .collect();
    let mut outputs = vec![last.clone()];
    if !node_values.is_empty() && rng.random_bool(0.4) {
        outputs.push(node_values[rng.random_range(0..node_values.len())].clone());
    }
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    b.finish(&outputs)
}

/// NumPy broadcasting of two shapes whose dimensions are each 1 or the full size.
fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n).map(|i| dim(a, i).max(dim(b, i))).collect()
}

// ------------------------------------------------------------------------------ rewrites

fn class_ty(egraph: &FuseGraph, id: Id) -> Option<(DType, Vec<usize>)> {
    egraph[id].data.ty().map(|t| (t.dtype, t.shape.clone()))
}

/// `?b` is an f64 tensor of exactly the shape `?s`, and `?g` is f64 too: then
/// Σ g·b = b·Σ g over the summed axes holds up to f64 rounding.
fn linear_in_b(egraph: &mut FuseGraph, _: Id, subst: &Subst) -> bool {
    let var = |v: &str| subst[v.parse().expect("variable")];
    let (Some((gd, _)), Some((bd, bs))) =
        (class_ty(egraph, var("?g")), class_ty(egraph, var("?b")))
    else {
        return false;
    };
    let shape = egraph[var("?s")].data.leaf().cloned();
    let as_ints: Vec<i64> = bs.iter().map(|&d| d as i64).collect();
    gd == DType::F64 && bd == DType::F64 && shape == Some(Leaf::Ints(as_ints))
}

fn rewrites() -> Vec<Rewrite<ENode, TypeAnalysis>> {
    let mut rules: Vec<Rewrite<ENode, TypeAnalysis>> = vec![
        rewrite!("neg-neg"; "(neg (neg ?x))" => "?x"),
        rewrite!("mul-comm"; "(mul ?a ?b)" => "(mul ?b ?a)"),
        rewrite!("add-comm"; "(add ?a ?b)" => "(add ?b ?a)"),
        rewrite!("stt-mul"; "(sum_to_size (mul ?g ?b) ?s)" => "(mul (sum_to_size ?g ?s) ?b)"
            if linear_in_b),
        rewrite!("mul-stt"; "(mul (sum_to_size ?g ?s) ?b)" => "(sum_to_size (mul ?g ?b) ?s)"
            if linear_in_b),
    ];
    rules.extend(rewrite!("sub-add"; "(sub ?a ?b)" <=> "(add ?a (neg ?b))"));
    rules.extend(rewrite!("cast-neg"; "(cast (neg ?x) ?d)" <=> "(neg (cast ?x ?d))"));
    rules.extend(
        rewrite!("bcast-neg"; "(neg (broadcast_to ?x ?s))" <=> "(broadcast_to (neg ?x) ?s)"),
    );
    rules.extend(rewrite!("stt-neg"; "(neg (sum_to_size ?x ?s))" <=> "(sum_to_size (neg ?x) ?s)"));
    rules.extend(rewrite!("mul-neg"; "(mul ?a (neg ?b))" <=> "(neg (mul ?a ?b))"));
    rules.extend(rewrite!("div-neg"; "(div (neg ?a) ?b)" <=> "(neg (div ?a ?b))"));
    rules
}

// ------------------------------------------------------------------------------ cost model

const LAUNCH: f64 = 4.0;
const BYTES_PER_UNIT: f64 = 16.0;
const ELEMENTS_PER_UNIT: f64 = 32.0;

fn bytes(dag: &Dag, v: Value) -> f64 {
    let ty = dag.ty(v);
    (numel(&ty.shape) * ty.dtype.size_bytes()) as f64
}

/// A toy fusion partition: a value is materialized when it is an output, a reduction's result
/// or used more than once; every other node fuses into its one consumer. Each materialized
/// value is a kernel: a launch, plus the bytes of its distinct inputs and its output, plus one
/// unit of arithmetic per element of every node fused into it. Constants are free (inlined).
fn toy_cost(dag: &Dag) -> f64 {
    let users = dag.users();
    let outputs = dag.output_mask();
    let is_const = |i: usize| dag.nodes[i].op.name() == "const";
    let materialized: Vec<bool> = (0..dag.nodes.len())
        .map(|i| {
            !is_const(i)
                && (outputs[i]
                    || dag.nodes[i].op.kind() == OpKind::Reduction
                    || users[i].iter().collect::<HashSet<_>>().len() > 1)
        })
        .collect();
    let mut total = 0.0;
    for root in (0..dag.nodes.len()).filter(|&i| materialized[i]) {
        let mut reads: HashSet<Value> = HashSet::new();
        let mut elements = 0usize;
        let mut stack = vec![root];
        while let Some(i) = stack.pop() {
            elements += numel(&dag.nodes[i].ty.shape);
            for &arg in &dag.nodes[i].args {
                match arg {
                    Value::Node(p) if is_const(p) => {}
                    Value::Node(p) if !materialized[p] => stack.push(p),
                    other => {
                        reads.insert(other);
                    }
                }
            }
        }
        let io: f64 =
            reads.iter().map(|&v| bytes(dag, v)).sum::<f64>() + bytes(dag, Value::Node(root));
        total += LAUNCH + io / BYTES_PER_UNIT + elements as f64 / ELEMENTS_PER_UNIT;
    }
    total
}

/// The greedy pass's per-node guess: elements produced, heavier for a reduction, nothing for
/// a constant or an input.
fn estimate(egraph: &FuseGraph, id: Id, node: &ENode) -> f64 {
    let (Some(ty), Some(op)) = (
        egraph[id].data.ty(),
        node.op_name()
            .and_then(|n| egraph.analysis.catalogue.get(n)),
    ) else {
        return 0.0;
    };
    if op.name() == "const" {
        return 0.0;
    }
    let weight = match op.kind() {
        OpKind::Reduction => 4.0,
        OpKind::Layout => 0.5,
        _ => 1.0,
    };
    weight * numel(&ty.shape) as f64
}

// ------------------------------------------------------------------------------ checks

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        DType::F32 => 1e-6,
        _ => 1e-12,
    }
}

/// Whether two output tensors agree: same dtype and shape, equal NaN-ness, values within a
/// dtype-sized relative tolerance. The rewrites are exact except Σ g·b = b·Σ g, which only
/// fires on f64 and so moves values by f64 rounding at most.
fn agree(a: &Tensor, b: &Tensor) -> Result<(), String> {
    if a.dtype != b.dtype || a.shape() != b.shape() {
        return Err(format!(
            "{:?}{:?} vs {:?}{:?}",
            a.dtype,
            a.shape(),
            b.dtype,
            b.shape()
        ));
    }
    let tol = tolerance(a.dtype);
    for (x, y) in a.values().into_iter().zip(b.values()) {
        let same = (x.is_nan() && y.is_nan())
            || x == y
            || (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs()) * 64.0);
        if !same {
            return Err(format!("{x} vs {y}"));
        }
    }
    Ok(())
}

/// The result is a valid graph (nodes in dependency order, so acyclic; types check) that
/// computes what `graph` computes.
fn check_result(
    label: &str,
    graph: &Graph,
    result: &Extraction,
    catalogue: &Catalogue,
    inputs: &HashMap<String, Tensor>,
    expected: &HashMap<String, Tensor>,
) {
    for (i, node) in result.dag.nodes.iter().enumerate() {
        for arg in &node.args {
            if let Value::Node(p) = arg {
                assert!(*p < i, "{label}: node {i} uses later node {p}");
            }
        }
    }
    let out = result.dag.to_graph();
    check(&out, catalogue).unwrap_or_else(|e| panic!("{label}: extracted graph: {e}"));
    let got = fusebox::eval::evaluate(&out, catalogue, inputs)
        .unwrap_or_else(|e| panic!("{label}: evaluating the extracted graph: {e}"));
    for name in &graph.outputs {
        agree(&expected[name], &got[name]).unwrap_or_else(|why| {
            panic!(
                "{label}: output `{name}` differs ({why})\noriginal: {}\nextracted: {}",
                fusebox::graph::file::to_ron(graph),
                fusebox::graph::file::to_ron(&out)
            )
        });
    }
}

struct Instance {
    graph: Graph,
    egraph: FuseGraph,
    seeded: Seeded,
}

fn instance(
    rng: &mut Rng,
    index: usize,
    ops: RangeInclusive<usize>,
    catalogue: &Catalogue,
) -> Instance {
    saturated(random_graph(rng, index, ops), catalogue, 400)
}

/// Seeds `graph` and runs the test rewrites with small limits.
fn saturated(graph: Graph, catalogue: &Catalogue, node_limit: usize) -> Instance {
    let dag = Dag::from_graph(&graph, catalogue).unwrap_or_else(|e| {
        panic!(
            "random graph does not check: {e}\n{}",
            fusebox::graph::file::to_ron(&graph)
        )
    });
    let mut egraph = new_egraph(&dag, catalogue);
    let mut seeded = seed(&mut egraph, &dag);
    egraph.rebuild();
    let runner: Runner<ENode, TypeAnalysis> = Runner::new(egraph.analysis.clone())
        .with_egraph(egraph)
        .with_iter_limit(4)
        .with_node_limit(node_limit)
        .run(&rewrites());
    let egraph = runner.egraph;
    assert!(
        egraph.analysis.conflicts.is_empty(),
        "a test rewrite is unsound: {:?}",
        egraph.analysis.conflicts
    );
    seeded.canonicalize(&egraph);
    Instance {
        graph,
        egraph,
        seeded,
    }
}

// ------------------------------------------------------------------------------ the test

/// Greedy against exact under the toy cost above.
#[test]
fn greedy_is_close_to_exact_under_a_toy_fusion_cost() {
    let gaps = gap_study("toy fusion cost", &toy_cost, 0xE27AC7);
    // Measured: greedy matches exact on all 300 (one instance in a few hundred is off with
    // other seeds, by up to 27%); the bottom-up pass alone is off by about 5% on average.
    assert!(gaps.mean < 0.02, "mean gap {}", gaps.mean);
    assert!(gaps.max < 0.5, "max gap {}", gaps.max);
    assert!(gaps.worse <= 6, "greedy worse than exact on {}", gaps.worse);
    assert!(
        gaps.bottom_up_mean < 0.2,
        "bottom-up mean gap {}",
        gaps.bottom_up_mean
    );
}

/// Greedy against exact under fusebox's own partition cost (default fusion rules, h200 and cpu
/// profiles): the cost optimize extracts with.
#[test]
fn greedy_is_close_to_exact_under_the_partition_cost() {
    let rules = RuleSet::defaults();
    for (profile, seed) in [("h200", 0x4200), ("cpu", 0xC0)] {
        let profile = rules.cost.profile(profile).expect("a default profile");
        let cost = |dag: &Dag| {
            partition::partition(dag, &rules.fusion, profile)
                .cost
                .total_us
        };
        let gaps = gap_study(&format!("partition cost, {}", profile.name), &cost, seed);
        // Measured: h200 worse on 2 of 300 by a few parts per million; cpu on none. Before the
        // partitioner fused siblings, cpu was worse on 3 of 300 (mean 0.8%, max 99.9%): two
        // unrelated outputs could share a kernel only through a common producer, so exact
        // added a shared `neg(x)` and compensating negations (four coordinated switches) to
        // halve the launches. Sibling fusion now merges such kernels directly.
        assert!(gaps.mean < 0.03, "{}: mean gap {}", profile.name, gaps.mean);
        assert!(gaps.max < 0.5, "{}: max gap {}", profile.name, gaps.max);
        assert!(gaps.worse <= 6, "{}: worse on {}", profile.name, gaps.worse);
        assert!(
            gaps.bottom_up_mean < 0.3,
            "{}: bottom-up mean gap {}",
            profile.name,
            gaps.bottom_up_mean
        );
    }
}

/// Runs exact, greedy and greedy's bottom-up pass alone on 300 random small e-graphs under
/// `cost`; checks every result and prints and bounds the gap.
fn gap_study(what: &str, cost: &dyn Fn(&Dag) -> f64, seed: u64) -> Gaps {
    let catalogue = Catalogue::defaults();
    let mut rng = seeded_rng(seed);
    let options = ExtractOptions::default();
    let bottom_up_only = ExtractOptions {
        local_search_budget: 0,
        ..ExtractOptions::default()
    };
    let wanted = 300;
    let (mut solved, mut too_large, mut with_choice) = (0, 0, 0);
    let (mut gaps, mut bottom_up_gaps) = (Vec::new(), Vec::new());
    let (mut greedy_worse, mut bottom_up_worse, mut improved) = (0, 0, 0);
    let (mut exact_time, mut greedy_time) = (0.0, 0.0);
    let mut index = 0;
    while solved < wanted {
        index += 1;
        assert!(index < 10 * wanted, "too few instances fit the exact limit");
        let Instance {
            graph,
            egraph,
            seeded,
        } = instance(&mut rng, index, 4..=12, &catalogue);

        let start = Instant::now();
        let Some(best) = extract::exact(&egraph, &seeded, cost, &options) else {
            too_large += 1;
            // Too many choices for exact: greedy must still be valid and no worse.
            let result = extract::extract(&egraph, &seeded, cost, &estimate, &options);
            assert_eq!(result.method, Method::Greedy);
            assert!(result.cost <= result.original_cost);
            continue;
        };
        exact_time += start.elapsed().as_secs_f64();
        let start = Instant::now();
        let result = extract::greedy(&egraph, &seeded, cost, &estimate, &options);
        greedy_time += start.elapsed().as_secs_f64();
        let bottom_up = extract::greedy(&egraph, &seeded, cost, &estimate, &bottom_up_only);
        solved += 1;

        let label = format!("instance {index}");
        // Independently: the original graph's cost, computed from the input graph itself.
        assert_eq!(best.original_cost, result.original_cost, "{label}");
        assert!(
            best.cost <= result.cost,
            "{label}: exact {} > greedy {}",
            best.cost,
            result.cost
        );
        assert!(
            result.cost <= result.original_cost,
            "{label}: greedy above the original"
        );
        assert!(bottom_up.cost <= bottom_up.original_cost, "{label}");
        assert!(best.cost <= bottom_up.cost, "{label}");
        for r in [&best, &result, &bottom_up] {
            assert_eq!(r.cost, cost(&r.dag), "{label}: reported cost is the dag's");
        }
        if best.evaluations > 2 {
            with_choice += 1;
        }
        if best.cost < best.original_cost {
            improved += 1;
        }

        let gap_of = |c: f64| {
            if c == best.cost {
                0.0
            } else {
                (c - best.cost) / best.cost
            }
        };
        let gap = gap_of(result.cost);
        if gap > 0.0 {
            eprintln!(
                "{label}: greedy {} vs exact {} (original {})",
                result.cost, best.cost, result.original_cost
            );
            if std::env::var("EXTRACT_GAP_DEBUG").is_ok() {
                eprintln!(
                    "{}\nEXACT\n{}\nGREEDY\n{}",
                    fusebox::graph::file::to_ron(&graph),
                    fusebox::graph::file::to_ron(&best.dag.to_graph()),
                    fusebox::graph::file::to_ron(&result.dag.to_graph())
                );
            }
        }
        let bottom_up_gap = gap_of(bottom_up.cost);
        greedy_worse += usize::from(result.cost > best.cost);
        bottom_up_worse += usize::from(bottom_up.cost > best.cost);
        gaps.push(gap);
        bottom_up_gaps.push(bottom_up_gap);

        let inputs: HashMap<String, Tensor> = graph
            .inputs
            .iter()
            .map(|i| (i.name.clone(), Tensor::random(i.dtype, &i.shape, &mut rng)))
            .collect();
        let expected = fusebox::eval::evaluate(&graph, &catalogue, &inputs)
            .unwrap_or_else(|e| panic!("{label}: evaluating the original: {e}"));
        check_result(
            &format!("{label} exact"),
            &graph,
            &best,
            &catalogue,
            &inputs,
            &expected,
        );
        check_result(
            &format!("{label} greedy"),
            &graph,
            &result,
            &catalogue,
            &inputs,
            &expected,
        );
        check_result(
            &format!("{label} bottom-up"),
            &graph,
            &bottom_up,
            &catalogue,
            &inputs,
            &expected,
        );
    }
    let stats = |g: &[f64]| {
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let max = g.iter().copied().fold(0.0, f64::max);
        (mean, max)
    };
    let (mean, max) = stats(&gaps);
    let (bu_mean, bu_max) = stats(&bottom_up_gaps);
    eprintln!(
        "{what}: extraction gap over {solved} random e-graphs ({with_choice} with a choice to make, \
         {improved} where the optimum beats the original; {too_large} more too large for exact):\n\
         greedy + local search: mean {:.4}%, max {:.4}%, worse than exact on {greedy_worse}\n\
         bottom-up pass alone:  mean {:.4}%, max {:.4}%, worse than exact on {bottom_up_worse}\n\
         time: exact {:.1} ms, greedy {:.1} ms in total",
        mean * 100.0,
        max * 100.0,
        bu_mean * 100.0,
        bu_max * 100.0,
        exact_time * 1e3,
        greedy_time * 1e3,
    );
    assert!(
        with_choice >= wanted / 2,
        "the rewrites gave too few choices"
    );
    assert!(
        improved >= 10,
        "the instances rarely had anything to improve"
    );
    Gaps {
        mean,
        max,
        worse: greedy_worse,
        bottom_up_mean: bu_mean,
    }
}

/// What [`gap_study`] measured: relative gaps of greedy to exact, and of the bottom-up pass
/// alone.
struct Gaps {
    mean: f64,
    max: f64,
    /// Instances where greedy costs strictly more than exact.
    worse: usize,
    bottom_up_mean: f64,
}

/// Larger graphs (every sink an output) have too many choices for exact: greedy must still
/// return a valid graph that computes the same values, and never cost more than the original.
#[test]
fn greedy_is_valid_where_exact_is_out_of_reach() {
    let catalogue = Catalogue::defaults();
    let mut rng = seeded_rng(0xB16);
    let options = ExtractOptions::default();
    let (mut greedy, mut improved) = (0, 0);
    let mut time = 0.0;
    for index in 0..40 {
        let mut graph = random_graph(&mut rng, index, 25..=40);
        let used: HashSet<&String> = graph.nodes.iter().flat_map(|n| &n.args).collect();
        graph.outputs = graph
            .nodes
            .iter()
            .map(|n| n.name.clone())
            .filter(|n| !used.contains(n))
            .collect();
        let Instance {
            graph,
            egraph,
            seeded,
        } = saturated(graph, &catalogue, 3000);
        let start = Instant::now();
        let result = extract::extract(&egraph, &seeded, &toy_cost, &estimate, &options);
        time += start.elapsed().as_secs_f64();
        greedy += usize::from(result.method == Method::Greedy);
        assert!(result.cost <= result.original_cost, "instance {index}");
        improved += usize::from(result.cost < result.original_cost);
        let inputs: HashMap<String, Tensor> = graph
            .inputs
            .iter()
            .map(|i| (i.name.clone(), Tensor::random(i.dtype, &i.shape, &mut rng)))
            .collect();
        let expected = fusebox::eval::evaluate(&graph, &catalogue, &inputs).expect("evaluates");
        let label = format!("large instance {index} ({})", result.method);
        check_result(&label, &graph, &result, &catalogue, &inputs, &expected);
    }
    eprintln!(
        "40 larger e-graphs: {greedy} extracted greedily, {improved} improved on the original, \
         {:.1} ms in total",
        time * 1e3
    );
    assert!(
        greedy >= 10,
        "only {greedy} instances were too large for exact"
    );
}

/// The original choice is the input graph where saturation merged nothing: same nodes, same
/// cost as the input dag itself.
#[test]
fn the_original_choice_is_the_input_graph() {
    let catalogue = Catalogue::defaults();
    let mut rng = seeded_rng(7);
    for index in 0..20 {
        let graph = random_graph(&mut rng, index, 3..=8);
        let dag = Dag::from_graph(&graph, &catalogue).expect("checks");
        let mut egraph = new_egraph(&dag, &catalogue);
        let seeded = seed(&mut egraph, &dag);
        egraph.rebuild();
        let choice = extract::original_choice(&egraph, &seeded);
        let back =
            fusebox::egraph::dag_from_choice(&egraph, &seeded, |id| &choice[&egraph.find(id)])
                .expect("the seed graph is acyclic");
        // Hash-consing merges only identical terms (such as two equal constants).
        assert!(back.nodes.len() <= dag.nodes.len());
        let result = extract::extract(
            &egraph,
            &seeded,
            &toy_cost,
            &estimate,
            &ExtractOptions::default(),
        );
        assert!(result.cost <= toy_cost(&back));
        assert_eq!(result.original_cost, toy_cost(&back));
    }
}

#[test]
fn attribute_leaves_are_never_chosen() {
    let catalogue = Catalogue::defaults();
    let mut b = GraphBuilder::new("cast");
    let x = b.input("x", DType::F32, &[3]);
    let n = b.op("n", "neg", &[&x]);
    let c = b.op_with(
        "c",
        "cast",
        &[&n],
        &[("dtype", AttrValue::DType(DType::F16))],
    );
    let graph = b.finish(&[&c]);
    let dag = Dag::from_graph(&graph, &catalogue).expect("checks");
    let mut egraph = new_egraph(&dag, &catalogue);
    let mut seeded = seed(&mut egraph, &dag);
    egraph.rebuild();
    let runner: Runner<ENode, TypeAnalysis> = Runner::new(egraph.analysis.clone())
        .with_egraph(egraph)
        .run(&rewrites());
    let egraph = runner.egraph;
    seeded.canonicalize(&egraph);
    let out = egraph.find(seeded.outputs[0].1);
    let forms: HashSet<String> = egraph[out].nodes.iter().map(|n| n.to_string()).collect();
    assert!(forms.contains("neg") && forms.contains("cast"), "{forms:?}");
    for result in [
        extract::exact(&egraph, &seeded, &toy_cost, &ExtractOptions::default()).expect("small"),
        extract::greedy(
            &egraph,
            &seeded,
            &toy_cost,
            &estimate,
            &ExtractOptions::default(),
        ),
    ] {
        for node in result.choice.values() {
            assert!(!matches!(node, ENode::Attr(_)), "{node}");
        }
        assert_eq!(result.dag.nodes.len(), 2);
    }
}
