//! `optimize()` end to end: semantics preserved on random graphs, the modeled cost never above
//! the unfused input, and the cases where the cost model — not a fixed rule order — decides.

use fusebox::dag::Dag;
use fusebox::eval::{self, Tensors};
use fusebox::graph::{self, Graph};
use fusebox::optimize::{Optimized, Options, optimize};
use fusebox::partition;
use fusebox::rules::RuleSet;
use fusebox::saturate::Stop;
use proptest::prelude::*;

use crate::common;
use common::random_graph::{self, assert_same};

fn rules() -> &'static RuleSet {
    random_graph::rules()
}

fn parse(text: &str) -> Graph {
    graph::file::parse(text, "test.ron", &rules().ops)
        .expect("test graph is valid")
        .0
}

fn load(path: &str) -> Graph {
    graph::file::load(std::path::Path::new(path), &rules().ops)
        .expect("example loads")
        .0
}

fn run(graph: &Graph, rules: &RuleSet) -> Optimized {
    optimize(graph, rules, &Options::default()).expect("optimize succeeds")
}

fn outputs_agree(before: &Graph, after: &Graph, seed: u64) -> Result<(), String> {
    outputs_agree_on(before, after, &random_graph::inputs(before, seed, false))
}

fn outputs_agree_on(before: &Graph, after: &Graph, inputs: &Tensors) -> Result<(), String> {
    let catalogue = &rules().ops;
    let a = eval::evaluate(before, catalogue, inputs).map_err(|e| e.to_string())?;
    let b = eval::evaluate(after, catalogue, inputs).map_err(|e| e.to_string())?;
    for name in &before.outputs {
        assert_same(name, &a[name], &b[name])?;
    }
    Ok(())
}

// ---------------------------------------------------------------- random graphs

/// The optimizer's random graphs: pointwise ops, where, casts, constants, broadcasts,
/// reductions, and the layout ops `rules/rewrites/layout.ron` rewrites (stepped slices, chunks,
/// transposes, reshapes, concats).
fn step() -> BoxedStrategy<random_graph::Step> {
    random_graph::step(true)
}

fn build(
    dims: (usize, usize),
    input_specs: &[(usize, usize)],
    steps: &[random_graph::Step],
) -> Option<Graph> {
    random_graph::build(&rules().ops, dims, input_specs, steps)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: random_graph::cases(256), ..ProptestConfig::default() })]

    /// On random graphs (broadcasting, [N,1] shapes, size-1 and size-0 dims, f16/bf16, casts,
    /// where, reductions, layout chains), optimize never fails, never reports a modeled cost above the
    /// unfused input, and the optimized graph computes the same outputs.
    ///
    /// Odd seeds optimize with every rule, on finite inputs, and compare wherever the input
    /// graph's every value is finite (the `finite_only` rules' premise). Even seeds optimize
    /// with `strict_ieee` and plant NaN, ±Inf and ±0 in the inputs: without the `finite_only`
    /// rules every output must agree, NaN for NaN and Inf for Inf.
    #[test]
    fn optimize_preserves_semantics_and_never_costs_more(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3))],
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(step(), 2..14),
        seed in 0u64..1000,
    ) {
        let Some(graph) = build(dims, &inputs, &steps) else { return Ok(()) };
        let strict_ieee = seed % 2 == 0;
        let options = Options { strict_ieee, ..Options::default() };
        let out = optimize(&graph, rules(), &options)
            .map_err(|e| TestCaseError::fail(format!("optimize failed: {e}\n{}", graph::file::to_ron(&graph))))?;
        let r = &out.report;
        prop_assert!(r.cost_after <= r.cost_before + 1e-9, "cost {} > unfused {}", r.cost_after, r.cost_before);
        prop_assert!(r.cost_after <= r.cost_unrewritten + 1e-9, "cost {} > input fused {}", r.cost_after, r.cost_unrewritten);
        graph::check(&out.graph, &rules().ops).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let values = random_graph::inputs(&graph, seed, strict_ieee);
        if strict_ieee || random_graph::every_value_finite(&graph, &values) {
            outputs_agree_on(&graph, &out.graph, &values).map_err(|e| TestCaseError::fail(format!(
                "{e}\nstrict_ieee: {strict_ieee}\nbefore:\n{}\nafter:\n{}", graph::file::to_ron(&graph), graph::file::to_ron(&out.graph))))?;
        }
    }

    /// Integer graphs at the extremes: every rewrite that fires on them (constant folding
    /// included) keeps every output bit for bit under wrap-around.
    #[test]
    fn optimize_preserves_integer_semantics_exactly(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3))],
        inputs in prop::collection::vec((0usize..2, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::int_step(true), 2..14),
        seed in 0u64..1000,
    ) {
        let Some(graph) = random_graph::build_ints(&rules().ops, dims, &inputs, &steps) else { return Ok(()) };
        let out = optimize(&graph, rules(), &Options::default())
            .map_err(|e| TestCaseError::fail(format!("optimize failed: {e}\n{}", graph::file::to_ron(&graph))))?;
        outputs_agree(&graph, &out.graph, seed).map_err(|e| TestCaseError::fail(format!(
            "{e}\nbefore:\n{}\nafter:\n{}", graph::file::to_ron(&graph), graph::file::to_ron(&out.graph))))?;
    }
}

// ---------------------------------------------------------------- the cost model decides

/// The partition of the optimized graph is what the report prices.
#[test]
fn report_prices_exactly_the_returned_kernels() {
    let graph = load("examples/lstm_cell_backward.ron");
    let rules = rules();
    let out = run(&graph, rules);
    let profile = rules.cost.profile("cpu").unwrap();
    let again = partition::partition(&out.dag, &rules.fusion, profile);
    assert_eq!(again.kernels.len(), out.partition.kernels.len());
    assert_eq!(again.cost.total_us, out.report.cost_after);
    let summed: f64 = out.partition.kernels.iter().map(|k| k.cost.total_us).sum();
    assert!((summed - out.report.cost_after).abs() < 1e-6 * summed.max(1.0));
}

/// `lstm_cell` is pointwise end to end: one kernel.
#[test]
fn lstm_cell_becomes_one_kernel() {
    let graph = load("examples/lstm_cell.ron");
    for profile in ["cpu", "h200"] {
        let options = Options {
            profile: profile.into(),
            ..Options::default()
        };
        let out = optimize(&graph, rules(), &options).unwrap();
        assert_eq!(out.report.kernels_after, 1, "{profile}");
        assert_eq!(out.partition.kernels[0].outputs.len(), 2, "hy and cy");
        assert_eq!(out.report.kernels_before, 9, "nine ops in lstm_cell.ron");
    }
}

/// (b) sum_to_size hoisting: with the sum_to_size rules, the bias gradient's reduction moves to
/// the end of the one fused kernel; without them it needs a kernel of its own that reads the
/// four gate gradients back (through the concat, by ranges): as many kernels, more bytes.
#[test]
fn lstm_backward_moves_fewer_bytes_with_sum_to_size_rules() {
    let graph = load("examples/lstm_cell_backward.ron");
    let all = rules();
    let mut without = all.clone();
    without
        .rewrites
        .retain(|r| !r.file.ends_with("sum_to_size.ron"));
    assert!(without.rewrites.len() < all.rewrites.len());
    let with_rules = run(&graph, all);
    let without_rules = run(&graph, &without);
    assert!(
        with_rules.report.kernels_after <= without_rules.report.kernels_after,
        "{} vs {}",
        with_rules.report.kernels_after,
        without_rules.report.kernels_after
    );
    assert!(with_rules.report.bytes_after < without_rules.report.bytes_after);
    assert!(with_rules.report.cost_after < without_rules.report.cost_after);
    outputs_agree(&graph, &with_rules.graph, 7).unwrap();
}

/// Values the rewrites introduce get names no value of the input graph has: in the LSTM
/// backward the sum_to_size rules add four `sum` nodes, which used to be named `sum_1` …
/// `sum_4` even when the graph already had values of those names.
#[test]
fn introduced_values_never_take_an_existing_name() {
    let text = std::fs::read_to_string("examples/lstm_cell_backward.ron")
        .unwrap()
        .replace("\"tanh_cy\"", "\"sum_1\"")
        .replace("\"one\"", "\"sum_2\"");
    let graph = parse(&text);
    let out = run(&graph, rules());
    let mut seen = std::collections::HashSet::new();
    for node in &out.dag.nodes {
        assert!(
            seen.insert(node.name.clone()),
            "two values named `{}`",
            node.name
        );
    }
    let existing: std::collections::HashSet<&str> =
        graph.nodes.iter().map(|n| n.name.as_str()).collect();
    let introduced: Vec<&str> = out
        .dag
        .nodes
        .iter()
        .filter(|n| n.op.name() == "sum" && !existing.contains(n.name.as_str()))
        .map(|n| n.name.as_str())
        .collect();
    assert!(
        !introduced.is_empty(),
        "the sum_to_size rules no longer fire"
    );
    let renamed = ["sum_1", "sum_2"];
    for name in renamed {
        let node = out.dag.nodes.iter().find(|n| n.name == name);
        assert!(
            node.is_none_or(|n| n.op.name() != "sum"),
            "`{name}` names a new sum"
        );
    }
    outputs_agree(&graph, &out.graph, 7).unwrap();
}

/// (a) A legal fusion the cost model rejects: an expensive producer on an [N, 1] column feeds
/// a consumer broadcast to [N, M]. Fusing would recompute it for every one of the N·M elements;
/// materializing its N values costs one more launch and next to no bytes. A cheap producer in
/// the same place is fused.
#[test]
fn expensive_broadcast_producer_is_materialized_cheap_one_fused() {
    let expensive = parse(
        r#"Graph(name: "recompute", inputs: [Input(name: "x", dtype: "f32", shape: [1024, 1]),
                                           Input(name: "y", dtype: "f32", shape: [1024, 4096])],
          nodes: [Node(name: "a", op: "exp", args: ["x"]), Node(name: "b", op: "tanh", args: ["a"]),
                  Node(name: "c", op: "gelu", args: ["b"]), Node(name: "d", op: "log1p", args: ["c"]),
                  Node(name: "e", op: "sigmoid", args: ["d"]), Node(name: "f", op: "gelu_tanh", args: ["e"]),
                  Node(name: "out", op: "mul", args: ["y", "f"])],
          outputs: ["out"])"#,
    );
    let out = run(&expensive, rules());
    assert_eq!(out.report.kernels_after, 2, "{:#?}", out.report.kernels);
    let consumer = out
        .partition
        .kernels
        .iter()
        .find(|k| k.nodes.iter().any(|&i| out.dag.nodes[i].name == "out"))
        .unwrap();
    assert_eq!(
        consumer.nodes.len(),
        1,
        "only the mul runs over [1024, 4096]"
    );

    let cheap = parse(
        r#"Graph(name: "recompute", inputs: [Input(name: "x", dtype: "f32", shape: [1024, 1]),
                                           Input(name: "y", dtype: "f32", shape: [1024, 4096])],
          nodes: [Node(name: "a", op: "neg", args: ["x"]), Node(name: "out", op: "mul", args: ["y", "a"])],
          outputs: ["out"])"#,
    );
    assert_eq!(run(&cheap, rules()).report.kernels_after, 1);
}

/// (c) A rewrite that pays only through fusion: `mul(sum_to_size(t), b)` with `b` of the reduced
/// shape does the multiply on the small tensor, so op by op it is the cheaper form. Rewritten as
/// `sum_to_size(mul(t, b))` the multiply joins the kernel that computes `t` and the reduction
/// ends it: one kernel instead of two. The extractor picks the rewritten form, and the unfused
/// cost model would not.
#[test]
fn mul_moves_into_reduction_only_because_of_fusion() {
    let graph = parse(
        r#"Graph(name: "bias_grad", inputs: [Input(name: "g", dtype: "f32", shape: [16, 65536]),
                                            Input(name: "b", dtype: "f32", shape: [65536])],
          nodes: [Node(name: "t", op: "tanh", args: ["g"]),
                  Node(name: "s", op: "sum_to_size", args: ["t"], attrs: {"shape": [65536]}),
                  Node(name: "out", op: "mul", args: ["s", "b"])],
          outputs: ["out"])"#,
    );
    let rules = rules();
    let out = run(&graph, rules);
    assert_eq!(out.report.kernels_after, 1, "{:#?}", out.report.kernels);
    let last = out.dag.nodes.last().unwrap();
    assert_eq!(
        last.op.kind(),
        fusebox::rules::OpKind::Reduction,
        "the reduction ends the kernel"
    );
    let fusebox::dag::Value::Node(product) = last.args[0] else {
        panic!("the reduction reads a node")
    };
    assert_eq!(
        out.dag.nodes[product].op.name(),
        "mul",
        "the mul moved into the reduction"
    );
    outputs_agree(&graph, &out.graph, 3).unwrap();

    let profile = rules.cost.profile("cpu").unwrap();
    let input = Dag::from_graph(&graph, &rules.ops).unwrap();
    let unfused_before = partition::unfused(&input, profile).cost.total_us;
    let unfused_after = partition::unfused(&out.dag, profile).cost.total_us;
    assert!(
        unfused_after > unfused_before,
        "op by op the rewritten form costs more ({unfused_after} vs {unfused_before})"
    );
    assert!(out.report.cost_after < out.report.cost_unrewritten);
}

/// A rule that changes a value's type is refused loudly, naming the rule.
#[test]
fn an_unsound_rule_is_an_error_not_a_wrong_graph() {
    let mut rules = rules().clone();
    let planted = fusebox::rewrite::load_rules(
        r#"[Rule(name: "planted-cast", lhs: "(neg ?x)", rhs: "(cast (neg ?x) f16)")]"#,
        "planted.ron",
        &rules.ops,
    )
    .unwrap();
    rules.rewrites.extend(planted);
    let graph = parse(
        r#"Graph(name: "g", inputs: [Input(name: "x", dtype: "f32", shape: [4])],
          nodes: [Node(name: "y", op: "neg", args: ["x"])], outputs: ["y"])"#,
    );
    let err = optimize(&graph, &rules, &Options::default()).unwrap_err();
    assert!(err.to_string().contains("planted-cast"), "{err}");
}

/// Every example optimizes, stays correct, and gets no more expensive.
#[test]
fn every_example_optimizes_correctly() {
    for entry in std::fs::read_dir("examples").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "ron") {
            continue;
        }
        let graph = load(path.to_str().unwrap());
        let out = run(&graph, rules());
        let r = &out.report;
        assert!(r.cost_after <= r.cost_unrewritten, "{}", path.display());
        assert!(r.cost_unrewritten <= r.cost_before, "{}", path.display());
        if graph
            .inputs
            .iter()
            .map(|i| fusebox::shape::numel(&i.shape))
            .sum::<usize>()
            < 3_000_000
        {
            outputs_agree(&graph, &out.graph, 11)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

/// Hitting a limit is reported, and the best graph found so far is used: never an error.
#[test]
fn limits_stop_saturation_without_failing() {
    let graph = fusebox::graph::synthetic::pointwise(400, 8, 8, 3);
    let rules = rules();
    let tight = Options {
        limits: fusebox::saturate::Limits {
            nodes: 450,
            ..Default::default()
        },
        ..Options::default()
    };
    let out = optimize(&graph, rules, &tight).unwrap();
    assert_eq!(out.report.egraph.stop_reason, Stop::NodeLimit);
    assert!(out.report.egraph.limited);
    assert!(out.report.cost_after <= out.report.cost_unrewritten);
    outputs_agree(&graph, &out.graph, 1).unwrap();

    let no_time = Options {
        limits: fusebox::saturate::Limits {
            time: std::time::Duration::ZERO,
            ..Default::default()
        },
        ..Options::default()
    };
    let out = optimize(&graph, rules, &no_time).unwrap();
    assert_eq!(out.report.egraph.stop_reason, Stop::TimeLimit);
    assert_eq!(out.report.egraph.iterations, 0);
    outputs_agree(&graph, &out.graph, 2).unwrap();

    let generous = optimize(&graph, rules, &Options::default()).unwrap();
    assert_eq!(
        generous.report.egraph.stop_reason,
        Stop::Saturated,
        "{:?}",
        generous.report.egraph
    );
    assert!(
        generous.report.egraph.nodes > 450,
        "the tight limit did bind"
    );
    assert!(!generous.report.egraph.limited);
}

/// `strict_ieee` leaves out the finite_only rules: with an infinite factor the linearity law
/// `sum(t) * b = sum(t * b)` breaks (0 · inf is NaN), and strict optimization keeps the input's
/// form, so Inf and NaN come out exactly as the input graph computes them.
#[test]
fn strict_ieee_keeps_infinities_exact() {
    let graph = parse(
        r#"Graph(name: "bias_grad", inputs: [Input(name: "g", dtype: "f32", shape: [16, 65536]),
                                            Input(name: "b", dtype: "f32", shape: [65536])],
          nodes: [Node(name: "t", op: "tanh", args: ["g"]),
                  Node(name: "s", op: "sum_to_size", args: ["t"], attrs: {"shape": [65536]}),
                  Node(name: "out", op: "mul", args: ["s", "b"])],
          outputs: ["out"])"#,
    );
    let strict = Options {
        strict_ieee: true,
        ..Options::default()
    };
    let out = optimize(&graph, rules(), &strict).unwrap();
    assert!(!out.report.rules.contains_key("sum-to-size-mul-right"));
    assert_eq!(
        out.report.kernels_after, 2,
        "the mul stays after the reduction"
    );

    // g = 0 in column 0 (tanh 0 = 0, so the column sums to 0) and b = inf there: the input
    // computes 0 · inf = NaN; a strict result must too.
    let mut inputs = eval::random_inputs(&graph, 4);
    let mut g = inputs["g"].clone();
    for row in 0..16 {
        g.floats_mut().unwrap()[[row, 0]] = 0.0;
    }
    let mut b = inputs["b"].clone();
    b.floats_mut().unwrap()[[0]] = f64::INFINITY;
    inputs.insert("g".into(), g);
    inputs.insert("b".into(), b);
    let catalogue = &rules().ops;
    let before = eval::evaluate(&graph, catalogue, &inputs).unwrap();
    let after = eval::evaluate(&out.graph, catalogue, &inputs).unwrap();
    assert!(before["out"].values()[0].is_nan());
    assert!(after["out"].values()[0].is_nan());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: random_graph::cases(128), ..ProptestConfig::default() })]

    /// With an AMP policy, optimization of the cast-inserted graph preserves its semantics too
    /// (library casts, casts fused into kernels) wherever its values are finite, and the cost
    /// bounds still hold.
    #[test]
    fn optimize_with_amp_preserves_the_cast_inserted_semantics(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1))],
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(step(), 2..12),
        policy in prop_oneof![Just("f16"), Just("bf16")],
        seed in 0u64..1000,
    ) {
        let Some(graph) = build(dims, &inputs, &steps) else { return Ok(()) };
        let options = Options { amp: Some(policy.to_string()), ..Options::default() };
        let out = optimize(&graph, rules(), &options)
            .map_err(|e| TestCaseError::fail(format!("optimize failed: {e}\n{}", graph::file::to_ron(&graph))))?;
        let r = &out.report;
        prop_assert!(r.cost_after <= r.cost_unrewritten + 1e-9);
        prop_assert!(r.cost_unrewritten <= r.cost_before + 1e-9);
        prop_assert_eq!(&out.graph.outputs, &graph.outputs);
        // Every rule is on, so the outputs are compared where the `finite_only` rules' premise
        // holds: every value of the cast-inserted graph finite (a sum divided by -0 is not).
        let values = random_graph::inputs(&out.input, seed, false);
        if random_graph::every_value_finite(&out.input, &values) {
            outputs_agree_on(&out.input, &out.graph, &values).map_err(|e| TestCaseError::fail(format!(
                "{e}\ncast-inserted:\n{}\noptimized:\n{}", graph::file::to_ron(&out.input), graph::file::to_ron(&out.graph))))?;
        }
    }
}
