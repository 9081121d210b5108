//! The CPU backend end to end: optimize → lower → emit C → cc → run, against the reference
//! evaluator on the unfused graph.

use crate::common;

use common::random_graph::{self, assert_same, rules};
use fusebox::backend::Executable;
use fusebox::backend::cpu::compiler::{Compiler, CompilerConfig};
use fusebox::graph::{self, Graph};
use fusebox::optimize::Options;
use fusebox::runner::prepare;
use proptest::prelude::*;

use common::kernel_cache::compiler;

fn load(path: &str) -> Graph {
    graph::file::load(std::path::Path::new(path), &rules().ops)
        .expect("example loads")
        .0
}

/// Compiles `graph` with `options`, runs it on seeded inputs (NaN/Inf planted if `specials`)
/// and compares every output with the reference evaluator on the unfused graph (after AMP
/// cast insertion, when a policy is given).
fn agrees(graph: &Graph, options: &Options, seed: u64, specials: bool) -> Result<(), String> {
    let rules = rules();
    let reference_graph = match &options.amp {
        Some(p) => {
            fusebox::amp::insert_casts(graph, &rules.ops, rules.amp.policy(p).unwrap())
                .unwrap()
                .graph
        }
        None => graph.clone(),
    };
    let inputs = random_graph::inputs(graph, seed, specials);
    // Every value, not only the outputs: the comparisons' operands are checked for ties.
    let want = fusebox::eval::evaluate_all(&reference_graph, &rules.ops, &inputs)
        .map_err(|e| e.to_string())?;
    if decided_by_last_ulps(&reference_graph, &want, &inputs) {
        return Ok(());
    }
    runs_as(graph, options, &inputs, &want)
}

/// Compiles `graph` with `options`, runs it on `inputs` and compares every output with `want`.
fn runs_as(
    graph: &Graph,
    options: &Options,
    inputs: &fusebox::eval::Tensors,
    want: &fusebox::eval::Tensors,
) -> Result<(), String> {
    let mut prepared = prepare(graph, rules(), options, compiler()).map_err(|e| e.to_string())?;
    let got = prepared
        .executable
        .run_tensors(inputs)
        .map_err(|e| e.to_string())?;
    for name in &graph.outputs {
        assert_same(name, &want[name], &got[name])?;
    }
    Ok(())
}

/// Whether a comparison in `graph` is decided, somewhere, by the last ulps of its operands:
/// two different values within a few ulps of each other (`tanh(x) > x` for a tiny `x`, where
/// the reference's correctly rounded `tanh(x)` equals `x` and a vector `tanh`'s may not). The
/// backends are held to the float tolerance, not to the last ulp, so such a comparison may flip
/// and every value computed from it with it: these graphs are not compared. `all` holds every
/// value of the reference run.
fn decided_by_last_ulps(
    graph: &Graph,
    all: &fusebox::eval::Tensors,
    inputs: &fusebox::eval::Tensors,
) -> bool {
    graph.nodes.iter().any(|node| {
        let comparison = ["gt", "ge", "lt", "le", "eq", "ne"].contains(&node.op.as_str());
        if !comparison || node.args.len() != 2 || node.args[0] == node.args[1] {
            return false;
        }
        let Some(out) = all.get(&node.name) else {
            return false;
        };
        let operand = |k: usize| {
            let t = all
                .get(&node.args[k])
                .or_else(|| inputs.get(&node.args[k]))?;
            let ulp = match t.dtype {
                fusebox::dtype::DType::F64 => f64::EPSILON,
                fusebox::dtype::DType::F32 => f32::EPSILON as f64,
                fusebox::dtype::DType::F16 => 2f64.powi(-10),
                fusebox::dtype::DType::BF16 => 2f64.powi(-7),
                _ => return None,
            };
            let values = t.floats().into_owned();
            let wide: Vec<f64> = values.broadcast(out.shape())?.iter().copied().collect();
            Some((ulp, wide))
        };
        let (Some((ua, a)), Some((ub, b))) = (operand(0), operand(1)) else {
            return false;
        };
        let ulps = 8.0 * ua.max(ub);
        a.iter().zip(&b).any(|(x, y)| {
            x.is_finite() && y.is_finite() && (x - y).abs() <= ulps * x.abs().max(y.abs())
        })
    })
}

#[test]
fn every_example_runs_fused_and_unfused() {
    let rules = rules();
    for entry in std::fs::read_dir("examples").unwrap() {
        let path = entry.unwrap().path();
        let graph = load(path.to_str().unwrap());
        // One reference evaluation serves both runs: the graph and inputs are the same.
        let inputs = random_graph::inputs(&graph, 3, false);
        let want = fusebox::eval::evaluate(&graph, &rules.ops, &inputs).unwrap();
        for fusion in [true, false] {
            let options = Options {
                fusion,
                ..Options::default()
            };
            runs_as(&graph, &options, &inputs, &want)
                .unwrap_or_else(|e| panic!("{} (fusion {fusion}): {e}", path.display()));
        }
    }
}

/// The joint forward + backward graph of every example runs fused on the CPU and equals the
/// reference evaluator on it.
#[test]
fn every_example_gradient_runs_on_the_cpu() {
    let rules = rules();
    for entry in std::fs::read_dir("examples").unwrap() {
        let path = entry.unwrap().path();
        let graph = load(path.to_str().unwrap());
        let joint = fusebox::autodiff::grad(
            &graph,
            &rules.ops,
            &rules.gradients,
            &fusebox::autodiff::Wrt::AllFloatInputs,
        )
        .unwrap();
        agrees(&joint.graph, &Options::default(), 5, false)
            .unwrap_or_else(|e| panic!("{} gradient: {e}", path.display()));
    }
}

#[test]
fn amp_examples_run_on_the_cpu() {
    for name in ["mlp_block", "amp_demo", "lstm_cell"] {
        let graph = load(&format!("examples/{name}.ron"));
        for policy in ["f16", "bf16"] {
            let options = Options {
                amp: Some(policy.into()),
                ..Options::default()
            };
            // Outputs against the unoptimized cast-inserted graph: the same roundings.
            agrees(&graph, &options, 5, false).unwrap_or_else(|e| panic!("{name} {policy}: {e}"));
        }
    }
}

/// Changing the batch size reuses the compiled kernels: nothing is compiled or even read
/// from disk the second time.
#[test]
fn another_batch_size_compiles_nothing() {
    let text = std::fs::read_to_string("examples/lstm_cell.ron").unwrap();
    let parse = |t: &str| graph::file::parse(t, "lstm.ron", &rules().ops).unwrap().0;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("batch-size-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let compiler = Compiler::new(CompilerConfig::from_env().with_cache_dir(&dir));
    let rules = rules();
    let first = prepare(&parse(&text), rules, &Options::default(), &compiler).unwrap();
    assert_eq!(first.compile.compiled, 1);
    for batch in [512, 3, 1000] {
        let g = parse(&text.replace("[1024, 4096]", &format!("[{batch}, 4096]")));
        let again = prepare(&g, rules, &Options::default(), &compiler).unwrap();
        assert_eq!(again.compile.compiled, 0, "batch {batch} recompiled");
        assert_eq!(again.compile.memory_hits, 1);
        let mut exe = again.executable;
        let inputs = fusebox::eval::random_inputs(&g, 1);
        let want = fusebox::eval::evaluate(&g, &rules.ops, &inputs).unwrap();
        let got = exe.run_tensors(&inputs).unwrap();
        for name in &g.outputs {
            assert_same(name, &want[name], &got[name]).unwrap();
        }
    }
    assert_eq!(compiler.stats().compiled, 1);
}

/// Intermediates share buffers once dead. The unfused lstm_cell (node order i, f, g, o, f_cx,
/// i_g, cy, tanh_cy, hy; cy and hy are outputs) has seven 16 MiB intermediates. While f_cx is
/// written, i, f, g and o are still held (f is released only after the step that reads it
/// last), so five are needed at once; i_g then takes f's, tanh_cy i's or g's.
#[test]
fn buffers_are_reused_by_liveness() {
    let graph = load("examples/lstm_cell.ron");
    let options = Options {
        fusion: false,
        ..Options::default()
    };
    let prepared = prepare(&graph, rules(), &options, compiler()).unwrap();
    let plan = prepared.executable.memory_plan();
    let mib = 1 << 24;
    assert_eq!(plan.unshared_bytes, 7 * mib);
    assert_eq!(plan.total_bytes(), 5 * mib, "{:?}", plan.slot_bytes);
    assert_eq!(prepared.partition.kernels.len(), 9);
}

/// A poisoned output buffer is completely overwritten: every element of every output is
/// written by some kernel.
#[test]
fn every_output_element_is_written() {
    for name in [
        "lstm_cell_backward",
        "layernorm_tail",
        "gru_residual",
        "iou",
    ] {
        let graph = load(&format!("examples/{name}.ron"));
        let mut prepared = prepare(&graph, rules(), &Options::default(), compiler()).unwrap();
        let exe = &mut prepared.executable;
        let inputs: Vec<_> = (0..graph.inputs.len())
            .map(|i| {
                fusebox::runtime::buffer::Buffer::from_tensor(&fusebox::eval::random_input(
                    &graph, i, 9,
                ))
            })
            .collect();
        let mut clean = exe.output_buffers();
        exe.run_into(&inputs, &mut clean).unwrap();
        for poison in [0xFFu8, 0x7F] {
            let mut outs = exe.output_buffers();
            outs.iter_mut().for_each(|b| b.fill_bytes(poison));
            exe.run_into(&inputs, &mut outs).unwrap();
            for (a, b) in clean.iter().zip(&outs) {
                for i in 0..a.len() {
                    assert_eq!(
                        a.get(i).to_bits(),
                        b.get(i).to_bits(),
                        "{name}[{i}] poison {poison:#x}"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: random_graph::cases(96), ..ProptestConfig::default() })]

    /// Random graphs (broadcasting, [N,1]×[1,M], transposes, slices, concats, size-1 and
    /// size-0 dims, f16/bf16 and mixed dtypes, where/bool, reductions ending kernels,
    /// multi-output kernels, NaN/Inf inputs), fused and unfused, equal the reference.
    #[test]
    fn compiled_random_graphs_agree(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3)), Just((64, 700))],
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::step(true), 2..14),
        seed in 0u64..1000,
        specials in any::<bool>(),
        fusion in prop_oneof![3 => Just(true), 1 => Just(false)],
    ) {
        let Some(graph) = random_graph::build(&rules().ops, dims, &inputs, &steps) else { return Ok(()) };
        let options = Options { fusion, strict_ieee: random_graph::strict_ieee_for(&graph, seed, specials), ..Options::default() };
        agrees(&graph, &options, seed, specials).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }

    /// Integer graphs (i32 and i64 inputs holding i32::MIN/MAX, i64::MIN/MAX and neighbours
    /// of 2^53; wrapping arithmetic, comparisons, where, casts, exact constants, integer
    /// reductions and matmul), fused and unfused, equal the reference bit for bit.
    #[test]
    fn compiled_integer_graphs_agree_exactly(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3)), Just((64, 700))],
        inputs in prop::collection::vec((0usize..2, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::int_step(true), 2..14),
        seed in 0u64..1000,
        fusion in prop_oneof![3 => Just(true), 1 => Just(false)],
    ) {
        let Some(graph) = random_graph::build_ints(&rules().ops, dims, &inputs, &steps) else { return Ok(()) };
        let options = Options { fusion, ..Options::default() };
        agrees(&graph, &options, seed, false).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}
