//! The lowering, checked without any C compiler: lowered programs run by the kernel-IR
//! interpreter agree with the reference evaluator on the unfused graph, kernels carry no sizes,
//! and the lowering emits exactly the partition's kernels.

use crate::common;

use common::random_graph::{self, assert_same, rules};
use fusebox::dag::Dag;
use fusebox::graph::{self, Graph};
use fusebox::lower::{self, Program};
use fusebox::optimize::{Options, optimize};
use fusebox::partition;
use fusebox::runtime::interpret;
use proptest::prelude::*;

fn load(path: &str) -> Graph {
    graph::file::load(std::path::Path::new(path), &rules().ops)
        .expect("example loads")
        .0
}

fn lowered(graph: &Graph, options: &Options) -> Program {
    let out = optimize(graph, rules(), options).expect("optimize");
    lower::lower(&out.dag, &out.partition)
        .unwrap_or_else(|e| panic!("lower: {e}\n{}", graph::file::to_ron(graph)))
}

/// Runs `program` in the interpreter on `graph`'s inputs and compares with the reference.
fn agrees(graph: &Graph, program: &Program, seed: u64, specials: bool) -> Result<(), String> {
    agrees_hoisted(graph, program, None, seed, specials)
}

/// [`agrees`] for a program that reads the values `hoist` computes from the graph's inputs.
fn agrees_hoisted(
    graph: &Graph,
    program: &Program,
    hoist: Option<&fusebox::hoist::Hoist>,
    seed: u64,
    specials: bool,
) -> Result<(), String> {
    let mut inputs = random_graph::inputs(graph, seed, specials);
    let want = fusebox::eval::evaluate(graph, &rules().ops, &inputs).map_err(|e| e.to_string())?;
    if let Some(hoist) = hoist {
        let hoisted = hoist
            .values(&rules().ops, &inputs)
            .map_err(|e| e.to_string())?;
        inputs.extend(hoisted);
    }
    let buffers = random_graph::input_buffers(program, &inputs);
    let got = interpret::run_program(program, &buffers).map_err(|e| e.to_string())?;
    for (o, b) in program.dag.outputs.iter().zip(&got) {
        assert_same(&o.name, &want[&o.name], &b.to_tensor())?;
    }
    Ok(())
}

#[test]
fn examples_lowered_agree_with_the_reference() {
    for entry in std::fs::read_dir("examples").unwrap() {
        let path = entry.unwrap().path();
        let graph = load(path.to_str().unwrap());
        // Shrink to keep the interpreter quick: every example's shapes are fixed, so lower
        // the optimized graph as is but only for the small ones.
        let elements: usize = graph
            .inputs
            .iter()
            .map(|i| fusebox::shape::numel(&i.shape))
            .sum();
        if elements > 1 << 22 {
            continue;
        }
        let program = lowered(&graph, &Options::default());
        agrees(&graph, &program, 7, false).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn one_program_step_per_partition_kernel_and_concat_piece() {
    let graph = load("examples/lstm_cell_backward.ron");
    let out = optimize(&graph, rules(), &Options::default()).unwrap();
    let program = lower::lower(&out.dag, &out.partition).unwrap();
    assert_eq!(program.groups, out.partition.kernels.len());
    let groups: std::collections::BTreeSet<usize> =
        program.steps.iter().map(|s| s.group()).collect();
    assert_eq!(groups.len(), out.partition.kernels.len());
}

/// A concat read by ranges evaluates its operands at other points of the domain than its
/// own: one that reads a row reduction (here of the whole rank-1 row) must not share the
/// reduction's kernel, where only the current row's result exists (found by proptest).
#[test]
fn a_concat_of_a_row_reduction_is_not_read_in_its_kernel() {
    let text = r#"Graph(
        name: "concat_of_sum",
        inputs: [Input(name: "x", dtype: "f32", shape: [3])],
        nodes: [
            Node(name: "s", op: "sum", args: ["x"], attrs: {"axes": [0], "keepdim": true}),
            Node(name: "c", op: "concat", args: ["s", "s", "s"], attrs: {"axis": -1}),
            Node(name: "y", op: "add", args: ["s", "c"]),
        ],
        outputs: ["y"],
    )"#;
    let graph = graph::file::parse(text, "concat_of_sum.ron", &rules().ops)
        .unwrap()
        .0;
    let program = lowered(&graph, &Options::default());
    agrees(&graph, &program, 3, false).unwrap();
}

/// Nodes no output reads are dropped before anything is fused: kept as written, the dead
/// matmul below became a library call whose epilogue (`dead_neg`) had nothing to store, and
/// lowering failed (found by proptest).
#[test]
fn dead_nodes_are_not_fused_or_run() {
    let text = r#"Graph(
        name: "dead_gemm",
        inputs: [Input(name: "x", dtype: "i32", shape: [4, 3])],
        nodes: [
            Node(name: "v", op: "slice", args: ["x"], attrs: {"axis": 0, "start": -3, "step": 1}),
            Node(name: "dead_product", op: "matmul", args: ["v", "v"]),
            Node(name: "dead_neg", op: "neg", args: ["dead_product"]),
            Node(name: "y", op: "concat", args: ["v", "x"], attrs: {"axis": 0}),
        ],
        outputs: ["y"],
    )"#;
    let graph = graph::file::parse(text, "dead_gemm.ron", &rules().ops)
        .unwrap()
        .0;
    let out = optimize(&graph, rules(), &Options::default()).unwrap();
    assert_eq!(out.report.library_calls_before, 0);
    assert_eq!(out.report.library_calls_after, 0);
    assert!(out.dag.nodes.iter().all(|n| !n.name.starts_with("dead")));
    let program = lowered(&graph, &Options::default());
    agrees(&graph, &program, 5, false).unwrap();
}

/// Same graph, another batch size: equal kernels, only the launches differ.
#[test]
fn kernels_do_not_depend_on_the_batch_size() {
    let text = std::fs::read_to_string("examples/lstm_cell.ron").unwrap();
    let small = text.replace("[1024, 4096]", "[512, 4096]");
    let parse = |t: &str| graph::file::parse(t, "lstm.ron", &rules().ops).unwrap().0;
    let (a, b) = (
        lowered(&parse(&text), &Options::default()),
        lowered(&parse(&small), &Options::default()),
    );
    assert_eq!(a.kernels, b.kernels);
    let sizes = |p: &Program| match &p.steps[0] {
        lower::Step::Kernel(k) => k.launch.sizes.clone(),
        _ => unreachable!(),
    };
    assert_eq!(sizes(&a), vec![1024, 4096]);
    assert_eq!(sizes(&b), vec![512, 4096]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: random_graph::cases(128), ..ProptestConfig::default() })]

    /// Random graphs, optimized (or not), lowered and interpreted, equal the reference.
    #[test]
    fn lowered_random_graphs_agree(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3)), Just((64, 700))],
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::step(true), 2..14),
        seed in 0u64..1000,
        specials in any::<bool>(),
        fused in any::<bool>(),
    ) {
        let catalogue = &rules().ops;
        let Some(graph) = random_graph::build(catalogue, dims, &inputs, &steps) else { return Ok(()) };
        let program = if fused {
            let options = Options { strict_ieee: random_graph::strict_ieee_for(&graph, seed, specials), ..Options::default() };
            lowered(&graph, &options)
        } else {
            let dag = Dag::from_graph(&graph, catalogue).unwrap();
            let model = fusebox::rules::CostModel::defaults();
            let unfused = partition::unfused(&dag, model.profile("cpu").unwrap());
            lower::lower(&dag, &unfused).unwrap()
        };
        agrees(&graph, &program, seed, specials).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }

    /// Random graphs with some inputs fixed (a model's stored weights): what those alone
    /// determine is hoisted out, computed by the reference evaluator and read by the program
    /// as inputs, and the program still equals the reference on the whole graph.
    #[test]
    fn hoisted_random_graphs_agree(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3)), Just((16, 70))],
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::step(true), 2..14),
        fixed_inputs in 0u32..16,
        seed in 0u64..1000,
        specials in any::<bool>(),
    ) {
        let catalogue = &rules().ops;
        let Some(graph) = random_graph::build(catalogue, dims, &inputs, &steps) else { return Ok(()) };
        let fixed = graph
            .inputs
            .iter()
            .enumerate()
            .filter(|(i, _)| fixed_inputs >> i & 1 == 1)
            .map(|(_, input)| input.name.clone())
            .collect();
        let options = Options {
            strict_ieee: random_graph::strict_ieee_for(&graph, seed, specials),
            fixed,
            ..Options::default()
        };
        let out = optimize(&graph, rules(), &options).expect("optimize");
        let program = lower::lower(&out.dag, &out.partition)
            .unwrap_or_else(|e| panic!("lower: {e}\n{}", graph::file::to_ron(&graph)));
        agrees_hoisted(&graph, &program, out.hoist.as_ref(), seed, specials).map_err(|e| {
            TestCaseError::fail(format!("{e}\n{}", graph::file::to_ron(&graph)))
        })?;
    }

    /// Integer graphs at the extremes (see `random_graph::int_step`), optimized (or not),
    /// lowered and interpreted, equal the reference bit for bit.
    #[test]
    fn lowered_integer_graphs_agree_exactly(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3)), Just((64, 700))],
        inputs in prop::collection::vec((0usize..2, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::int_step(true), 2..14),
        seed in 0u64..1000,
        fused in any::<bool>(),
    ) {
        let catalogue = &rules().ops;
        let Some(graph) = random_graph::build_ints(catalogue, dims, &inputs, &steps) else { return Ok(()) };
        let program = if fused {
            lowered(&graph, &Options::default())
        } else {
            let dag = Dag::from_graph(&graph, catalogue).unwrap();
            let model = fusebox::rules::CostModel::defaults();
            let unfused = partition::unfused(&dag, model.profile("cpu").unwrap());
            lower::lower(&dag, &unfused).unwrap()
        };
        agrees(&graph, &program, seed, false).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}

/// Small shapes keep each case to a few milliseconds, so thousands of graphs fit in CI: the
/// bugs random graphs find (a view's offset, a broadcast inside a chunk, a size-0 axis) show
/// at 3×4 as well as at 64×700, which the tests above also run.
fn small_dims() -> BoxedStrategy<(usize, usize)> {
    prop_oneof![
        Just((3usize, 4usize)),
        Just((1, 5)),
        Just((2, 1)),
        Just((0, 3)),
        Just((4, 6)),
        Just((6, 2)),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: random_graph::cases(FUSED_FLOAT_CASES),
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// The bulk of the suite's fused-versus-reference graphs: layout-heavy float graphs
    /// (stepped slices with negative bounds, chunks, transposes, contiguous and transposed
    /// reshapes, two- and three-way concats, broadcasting, [N,1], size-0 and size-1 dims,
    /// f16/bf16, NaN/Inf inputs), always optimized and fused, run by the interpreter. Recipes
    /// that build no graph are rejected, so every case counted is a graph compared.
    #[test]
    fn fused_layout_graphs_agree_with_the_reference(
        dims in small_dims(),
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::step(true), 2..10),
        seed in 0u64..1000,
        specials in any::<bool>(),
    ) {
        let catalogue = &rules().ops;
        let graph = random_graph::build(catalogue, dims, &inputs, &steps);
        prop_assume!(graph.is_some());
        let graph = graph.unwrap();
        let options = Options { strict_ieee: random_graph::strict_ieee_for(&graph, seed, specials), ..Options::default() };
        let program = lowered(&graph, &options);
        agrees(&graph, &program, seed, specials).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: random_graph::cases(FUSED_INT_CASES),
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// The same for integer graphs at the extremes, bit for bit.
    #[test]
    fn fused_layout_integer_graphs_agree_exactly(
        dims in small_dims(),
        inputs in prop::collection::vec((0usize..2, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::int_step(true), 2..10),
        seed in 0u64..1000,
    ) {
        let catalogue = &rules().ops;
        let graph = random_graph::build_ints(catalogue, dims, &inputs, &steps);
        prop_assume!(graph.is_some());
        let graph = graph.unwrap();
        let program = lowered(&graph, &Options::default());
        agrees(&graph, &program, seed, false).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}

/// Cases of the two small-shape tests above (before [`random_graph::cases`] scales them).
const FUSED_FLOAT_CASES: u32 = 6000;
const FUSED_INT_CASES: u32 = 4000;

/// The generators produce what the tests above claim to cover: over 2,000 recipes drawn as
/// the float test draws them, the built graphs include stepped slices with negative bounds,
/// chunks, transposed reshapes, reshapes of sliced views, three-way concats, f16/bf16 inputs
/// and size-0 and size-1 dims in fair numbers.
#[test]
fn random_graphs_cover_the_layout_forms() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let catalogue = &rules().ops;
    let strategy = (
        small_dims(),
        prop::collection::vec((0usize..4, 0usize..6), 1..4),
        prop::collection::vec(random_graph::step(true), 2..10),
    );
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[7; 32]),
    );
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    let mut built = 0;
    for _ in 0..2000 {
        let (dims, inputs, steps) = strategy.new_tree(&mut runner).unwrap().current();
        let Some(graph) = random_graph::build(catalogue, dims, &inputs, &steps) else {
            continue;
        };
        built += 1;
        let types = graph::check(&graph, catalogue).unwrap();
        let attr = |n: &fusebox::graph::Node, k: &str| match n.attrs.get(k) {
            Some(fusebox::attr::AttrValue::Int(v)) => Some(*v),
            _ => None,
        };
        let mut seen = std::collections::BTreeSet::new();
        for n in &graph.nodes {
            let ty = &types[&n.name];
            if n.op == "slice" && attr(n, "step").is_some_and(|s| s > 1) {
                seen.insert("slice with step > 1");
            }
            if n.op == "slice"
                && (attr(n, "start").is_some_and(|s| s < 0)
                    || attr(n, "end").is_some_and(|e| e < 0))
            {
                seen.insert("slice with a negative bound");
            }
            if n.op == "slice" && n.name.ends_with("_1") {
                seen.insert("chunk");
            }
            if n.op == "reshape"
                && graph
                    .nodes
                    .iter()
                    .any(|m| m.op == "transpose" && n.args[0] == m.name)
            {
                seen.insert("reshape of a transpose");
            }
            if n.op == "reshape" && n.args[0].ends_with("_v") {
                seen.insert("reshape of a sliced or doubly transposed view");
            }
            if n.op == "concat" && n.args.len() == 3 {
                seen.insert("three-way concat");
            }
            if ty.shape.contains(&0) {
                seen.insert("size-0 dim");
            }
            if ty.shape.len() == 2 && ty.shape[1] == 1 && ty.shape[0] > 1 {
                seen.insert("[N,1]");
            }
        }
        for i in &graph.inputs {
            if matches!(
                i.dtype,
                fusebox::dtype::DType::F16 | fusebox::dtype::DType::BF16
            ) {
                seen.insert("f16/bf16 input");
            }
        }
        for s in seen {
            *counts.entry(s).or_default() += 1;
        }
    }
    // Shown with `--nocapture`: how the recipes fell.
    eprintln!("{built} of 2000 recipes built a graph; graphs with each form: {counts:?}");
    assert!(built > 1500, "{built} of 2000 recipes built a graph");
    for form in [
        "slice with step > 1",
        "slice with a negative bound",
        "chunk",
        "reshape of a transpose",
        "reshape of a sliced or doubly transposed view",
        "three-way concat",
        "size-0 dim",
        "[N,1]",
        "f16/bf16 input",
    ] {
        let n = counts.get(form).copied().unwrap_or(0);
        assert!(
            n >= 40,
            "only {n} of {built} graphs have a {form}: {counts:?}"
        );
    }
}

/// A concat read by ranges whose operands come from a row kernel (a row reduction and the
/// pointwise ops on its result) is not put in that row kernel: its segments would read a
/// reduction result the segment evaluation does not compute. Found by the random graphs.
#[test]
fn a_concat_of_a_row_reductions_consumers_lowers_and_agrees() {
    let text = r#"Graph(name: "random",
        inputs: [Input(name: "x0", dtype: "f32", shape: [1, 2])],
        nodes: [
            Node(name: "v0", op: "sum_to_size", args: ["x0"], attrs: {"shape": [1]}),
            Node(name: "v1", op: "gelu", args: ["v0"]),
            Node(name: "v2", op: "concat", args: ["v1", "v1"], attrs: {"axis": -1}),
            Node(name: "v6_c", op: "gt", args: ["v2", "x0"]),
            Node(name: "v6", op: "where", args: ["v6_c", "x0", "v0"]),
            Node(name: "v7", op: "neg", args: ["x0"]),
        ],
        outputs: ["v6", "v7"])"#;
    let rules = fusebox::rules::RuleSet::defaults();
    let (graph, _) = fusebox::graph::file::parse(text, "g.ron", &rules.ops).unwrap();
    let model = fusebox::model::Model::from_graph(graph, &rules).unwrap();
    let x =
        fusebox::tensor::Tensor::from_values(fusebox::dtype::DType::F32, &[1, 2], vec![0.25, -1.5])
            .unwrap();
    let inputs = std::collections::BTreeMap::from([("x0".to_string(), x)]);
    let options = fusebox::model::CompileOptions::default();
    let got = model
        .compile(fusebox::model::Backend::Cpu, &options)
        .unwrap()
        .run(&inputs)
        .unwrap();
    let want = model
        .compile(fusebox::model::Backend::Reference, &options)
        .unwrap()
        .run(&inputs)
        .unwrap();
    for name in ["v6", "v7"] {
        assert_eq!(got[name].values(), want[name].values(), "{name}");
    }
}
