//! The lowering, checked without any C compiler: lowered programs run by the kernel-IR
//! interpreter agree with the reference evaluator on the unfused graph, kernels carry no sizes,
//! and the lowering emits exactly the partition's kernels.

mod common;

use common::random_graph::{self, assert_same, rules};
use fusebox::dag::Dag;
use fusebox::graph::{self, Graph};
use fusebox::lower::{self, Program};
use fusebox::optimize::{Options, optimize};
use fusebox::partition;
use fusebox::runtime::buffer::Buffer;
use fusebox::runtime::interpret;
use proptest::prelude::*;

fn load(path: &str) -> Graph {
    graph::file::load(std::path::Path::new(path), &rules().ops)
        .expect("example loads")
        .0
}

fn lowered(graph: &Graph, options: &Options) -> Program {
    let out = optimize(graph, &rules(), options).expect("optimize");
    lower::lower(&out.dag, &out.partition).expect("lower")
}

/// Runs `program` in the interpreter on `graph`'s inputs and compares with the reference.
fn agrees(graph: &Graph, program: &Program, seed: u64, specials: bool) -> Result<(), String> {
    let inputs = random_graph::inputs(graph, seed, specials);
    let want = fusebox::eval::evaluate(graph, &rules().ops, &inputs).map_err(|e| e.to_string())?;
    let buffers: Vec<Buffer> = program
        .dag
        .inputs
        .iter()
        .map(|i| Buffer::from_tensor(&inputs[&i.name]))
        .collect();
    let got = interpret::run_program(program, &buffers)?;
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
    let out = optimize(&graph, &rules(), &Options::default()).unwrap();
    let program = lower::lower(&out.dag, &out.partition).unwrap();
    assert_eq!(program.groups, out.partition.kernels.len());
    let groups: std::collections::BTreeSet<usize> =
        program.steps.iter().map(|s| s.group()).collect();
    assert_eq!(groups.len(), out.partition.kernels.len());
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
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

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
        let catalogue = rules().ops;
        let Some(graph) = random_graph::build(&catalogue, dims, &inputs, &steps) else { return Ok(()) };
        let program = if fused {
            let options = Options { strict_ieee: specials, ..Options::default() };
            lowered(&graph, &options)
        } else {
            let dag = Dag::from_graph(&graph, &catalogue).unwrap();
            let model = fusebox::rules::CostModel::defaults();
            let unfused = partition::unfused(&dag, model.profile("cpu").unwrap());
            lower::lower(&dag, &unfused).unwrap()
        };
        agrees(&graph, &program, seed, specials).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
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
        let catalogue = rules().ops;
        let Some(graph) = random_graph::build_ints(&catalogue, dims, &inputs, &steps) else { return Ok(()) };
        let program = if fused {
            lowered(&graph, &Options::default())
        } else {
            let dag = Dag::from_graph(&graph, &catalogue).unwrap();
            let model = fusebox::rules::CostModel::defaults();
            let unfused = partition::unfused(&dag, model.profile("cpu").unwrap());
            lower::lower(&dag, &unfused).unwrap()
        };
        agrees(&graph, &program, seed, false).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}
