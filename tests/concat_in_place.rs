//! Concat written in place: the kernels producing a concat's operands store them straight
//! into their segments of its buffer, so the concat is no kernel and its operands get no
//! buffers of their own unless something else reads them. Checked against known values and
//! the reference evaluator, in the kernel-IR interpreter and compiled on the CPU: operands
//! from one multi-output kernel and from several kernels, an operand that is also a graph
//! output or read by another kernel, empty segments, f16/bf16, axis 0 and inner axes; the
//! write check refuses overlapping and missing segments.

use crate::common;
use crate::concat::{agrees, compiled, input, interpreted};

use common::random_graph::{self, rules};
use fusebox::attr::AttrValue;
use fusebox::dag::Value;
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::graph::{self, Graph, GraphBuilder};
use fusebox::lower::{self, Program, Step};
use fusebox::optimize::{Optimized, Options, optimize};
use fusebox::runtime::memory::MemoryPlan;
use proptest::prelude::*;

fn optimized(graph: &Graph) -> Optimized {
    optimize(graph, rules(), &Options::default()).expect("optimize")
}

fn lowered(out: &Optimized) -> Program {
    lower::lower(&out.dag, &out.partition).expect("lower")
}

/// The names of the concats `out` writes in place.
fn in_place(out: &Optimized) -> Vec<String> {
    out.partition
        .in_place
        .iter()
        .map(|&c| out.dag.nodes[c].name.clone())
        .collect()
}

fn node(program: &Program, name: &str) -> usize {
    program
        .dag
        .nodes
        .iter()
        .position(|n| n.name == name)
        .unwrap()
}

/// `c = concat(x + y, x * y, axis 1)`, `s = sum(c, axis 0)` and `w = (x + y) - x * y` out,
/// with hand-computed values: one kernel computes both operands and w (so it cannot be a
/// segment of a range select) and stores the operands into c's two segments (the column
/// sums then read c), no buffer holds the operands, and reference, interpreter and CPU
/// agree.
#[test]
fn one_kernel_writes_both_segments_with_known_values() {
    let mut b = GraphBuilder::new("known");
    let x = b.input("x", DType::F32, &[2, 2]);
    let y = b.input("y", DType::F32, &[2, 2]);
    let p = b.op("p", "add", &[&x, &y]);
    let q = b.op("q", "mul", &[&x, &y]);
    let c = b.op_with("c", "concat", &[&p, &q], &[("axis", AttrValue::Int(1))]);
    b.op_with("s", "sum", &[&c], &[("axes", AttrValue::Ints(vec![0]))]);
    b.op("w", "sub", &[&p, &q]);
    let graph = b.finish(&["c", "s", "w"]);
    let inputs: Tensors = [
        input("x", DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]),
        input("y", DType::F32, &[2, 2], &[10.0, 20.0, 30.0, -1.0]),
    ]
    .into();
    // x + y = [[11, 22], [33, 3]], x * y = [[10, 40], [90, -4]].
    let want_c = [11.0, 22.0, 10.0, 40.0, 33.0, 3.0, 90.0, -4.0];
    let want_s = [44.0, 25.0, 100.0, 36.0];
    let want_w = [1.0, -18.0, -57.0, 7.0];
    let out = optimized(&graph);
    // The rewrites move the column sums onto the concat's operands (`s` becomes a concat of
    // two sums), and those sums store their results into s's segments.
    assert_eq!(in_place(&out), ["c", "s"]);
    let program = lowered(&out);
    program.check_bounds().unwrap();
    let (p, q) = (node(&program, "p"), node(&program, "q"));
    let plan = MemoryPlan::new(&program);
    assert_eq!(plan.slot_of[p], None, "p has no buffer of its own");
    assert_eq!(plan.slot_of[q], None, "q has no buffer of its own");
    // The first kernel's two stores both write c.
    let c_node = Value::Node(node(&program, "c"));
    let Step::Kernel(first) = &program.steps[0] else {
        panic!("a generated kernel first")
    };
    assert_eq!(first.args.iter().filter(|&&v| v == c_node).count(), 2);
    for got in [
        interpreted(&program, &inputs).unwrap(),
        compiled(&graph, &inputs).unwrap(),
        fusebox::eval::evaluate(&graph, &rules().ops, &inputs).unwrap(),
    ] {
        assert_eq!(got["c"].values(), want_c);
        assert_eq!(got["s"].values(), want_s);
        assert_eq!(got["w"].values(), want_w);
    }
}

/// examples/lstm_cell_backward.ron (grad_gates, grad_cx and grad_bias out): one kernel,
/// storing the four gate gradients into grad_gates and their column sums into grad_bias, no
/// slot for any of them, and the reference's values from the interpreter and the CPU.
#[test]
fn lstm_cell_backward_writes_grad_gates_from_one_kernel() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/lstm_cell_backward.ron"
    );
    let graph = graph::file::load(std::path::Path::new(path), &rules().ops)
        .unwrap()
        .0;
    let out = optimized(&graph);
    assert_eq!(out.report.kernels_after, 1);
    assert_eq!(in_place(&out), ["grad_gates", "grad_bias"]);
    let program = lowered(&out);
    program.check_bounds().unwrap();
    for concat in ["grad_gates", "grad_bias"] {
        let value = Value::Node(node(&program, concat));
        let writers: Vec<usize> = program
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.reads_writes(&program.kernels).1.contains(&value))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(writers, [0], "one kernel writes {concat}");
    }
    let plan = MemoryPlan::new(&program);
    for gate in [
        "grad_ingate",
        "grad_forgetgate",
        "grad_cellgate",
        "grad_outgate",
    ] {
        assert_eq!(
            plan.slot_of[node(&program, gate)],
            None,
            "{gate} has no slot"
        );
    }
    agrees(&graph, 3, false, true).unwrap();
}

/// Operands from kernels of their own (different shapes cannot share one), operands that are
/// also graph outputs (their kernels store them twice) and one a reduction reads (in its own
/// kernel: no buffer of its own), along axis 0, an inner axis and the innermost.
#[test]
fn operands_from_several_kernels_outputs_and_other_readers() {
    for axis in [0i64, 1, 2] {
        let mut b = GraphBuilder::new("several");
        let mut shape_a = vec![2, 3, 4];
        let mut shape_b = vec![2, 3, 4];
        shape_a[axis as usize] = 1;
        shape_b[axis as usize] = 5;
        let x = b.input("x", DType::F32, &shape_a);
        let y = b.input("y", DType::F32, &shape_b);
        let z = b.input("z", DType::F32, &[2, 3, 4]);
        let e = b.op("e", "exp", &[&x]);
        let t = b.op("t", "tanh", &[&y]);
        let s = b.op("s", "sigmoid", &[&z]);
        let c = b.op_with(
            "c",
            "concat",
            &[&e, &t, &s],
            &[("axis", AttrValue::Int(axis))],
        );
        b.op_with("r", "sum", &[&c], &[("axes", AttrValue::Ints(vec![axis]))]);
        b.op_with(
            "rt",
            "sum",
            &[&t],
            &[("axes", AttrValue::Ints(vec![(axis + 1) % 3]))],
        );
        let graph = b.finish(&["c", "r", "e", "rt", "s"]);
        let out = optimized(&graph);
        assert_eq!(in_place(&out), ["c"], "axis {axis}");
        agrees(&graph, 7, true, true).unwrap_or_else(|e| panic!("axis {axis}: {e}"));
    }
}

/// f16 and bf16 concats written in place: the segments hold the operands' rounded values
/// (the operands' kernel writes `w` too, as in the known-values test).
#[test]
fn half_precision_segments() {
    for dtype in [DType::F16, DType::BF16] {
        let mut b = GraphBuilder::new("half");
        let x = b.input("x", dtype, &[3, 5]);
        let y = b.input("y", dtype, &[3, 5]);
        let p = b.op("p", "exp", &[&x]);
        let q = b.op("q", "mul", &[&x, &y]);
        let c = b.op_with("c", "concat", &[&p, &q], &[("axis", AttrValue::Int(0))]);
        b.op_with("s", "sum", &[&c], &[("axes", AttrValue::Ints(vec![1]))]);
        b.op("w", "sub", &[&p, &q]);
        let graph = b.finish(&["c", "s", "w"]);
        assert_eq!(in_place(&optimized(&graph)), ["c"], "{dtype}");
        agrees(&graph, 5, true, true).unwrap_or_else(|e| panic!("{dtype}: {e}"));
    }
}

/// Empty segments are no writes at all; the others tile the concat.
#[test]
fn empty_segments() {
    let mut b = GraphBuilder::new("empty");
    let x = b.input("x", DType::F32, &[4, 0]);
    let y = b.input("y", DType::F32, &[4, 3]);
    let e = b.op("e", "exp", &[&x]);
    let t = b.op("t", "tanh", &[&y]);
    let u = b.op("u", "neg", &[&y]);
    let c = b.op_with("c", "concat", &[&e, &t, &u], &[("axis", AttrValue::Int(1))]);
    b.op_with("s", "sum", &[&c], &[("axes", AttrValue::Ints(vec![0]))]);
    b.op("w", "add", &[&t, &u]);
    let graph = b.finish(&["c", "s", "w"]);
    let out = optimized(&graph);
    assert_eq!(in_place(&out), ["c", "s"]);
    let segments: usize = out.partition.kernels.iter().map(|k| k.segments.len()).sum();
    assert_eq!(
        segments, 4,
        "the empty operand and its empty sum store nothing"
    );
    agrees(&graph, 1, true, true).unwrap();
}

/// A concat whose operands are graph inputs, or that converts its operands' dtype, is not
/// written in place (no kernel computes the inputs; a segment holds the operand's own bits),
/// and still agrees with the reference.
#[test]
fn inputs_and_converting_concats_keep_their_copy() {
    let mut b = GraphBuilder::new("kept");
    let x = b.input("x", DType::F32, &[2, 3]);
    let y = b.input("y", DType::F16, &[2, 3]);
    let e = b.op("e", "exp", &[&x]);
    let t = b.op("t", "tanh", &[&y]);
    let c = b.op_with("c", "concat", &[&e, &t], &[("axis", AttrValue::Int(0))]);
    b.op_with("d", "concat", &[&x, &x], &[("axis", AttrValue::Int(1))]);
    b.op_with("s", "sum", &[&c], &[("axes", AttrValue::Ints(vec![0]))]);
    let graph = b.finish(&["c", "d", "s"]);
    assert!(in_place(&optimized(&graph)).is_empty());
    agrees(&graph, 2, true, true).unwrap();
}

/// The write check: a segment store moved onto its neighbour's segment (overlap) or a
/// kernel's segment stores dropped (elements never written) is refused before anything runs,
/// naming the concat.
#[test]
fn overlapping_or_missing_segments_are_refused() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/lstm_cell_backward.ron"
    );
    let graph = graph::file::load(std::path::Path::new(path), &rules().ops)
        .unwrap()
        .0;
    let program = lowered(&optimized(&graph));
    let grad_gates = Value::Node(node(&program, "grad_gates"));
    let Step::Kernel(gates) = &program.steps[0] else {
        panic!("the gate kernel first")
    };
    let stores: Vec<usize> = (0..gates.args.len())
        .filter(|&a| gates.args[a] == grad_gates)
        .collect();
    assert_eq!(stores.len(), 4);
    let mut overlapping = program.clone();
    let Step::Kernel(k) = &mut overlapping.steps[0] else {
        unreachable!()
    };
    k.launch.offsets[stores[1]] = k.launch.offsets[stores[0]];
    let err = overlapping.check_bounds().unwrap_err().to_string();
    assert!(
        err.contains("grad_gates") && err.contains("overlap"),
        "{err}"
    );
    // The last segment's store broadcast along the batch axis: it writes its first row only,
    // and the rest of that quarter of grad_gates is never written.
    let mut missing = program.clone();
    let Step::Kernel(k) = &mut missing.steps[0] else {
        unreachable!()
    };
    k.launch.strides[stores[3]][0] = 0;
    let err = missing.check_bounds().unwrap_err().to_string();
    assert!(err.contains("grad_gates") && err.contains("hold"), "{err}");
    program.check_bounds().unwrap();
}

/// A recipe for a graph around one concat aimed at writing it in place: per operand, its
/// length along the axis (0 to 3), which of three producing kernels computes it (operands of
/// one length and group share inputs, so the sibling pass puts them in one kernel; groups 0
/// and 1 also write an output of their own), whether it is a graph output too, and whether
/// another kernel reads it; and how the concat is read.
#[derive(Debug, Clone)]
struct Recipe {
    rank: usize,
    axis: usize,
    /// (length, group, output, read elsewhere)
    parts: Vec<(usize, usize, bool, bool)>,
    dtype: DType,
    /// 0: the concat is an output; 1: and its sum over the axis; 2: only a pointwise consumer
    /// of it is.
    consumer: usize,
}

fn recipes() -> impl Strategy<Value = Recipe> {
    (
        1usize..4,
        0usize..3,
        prop::collection::vec((0usize..4, 0usize..3, any::<bool>(), any::<bool>()), 1..5),
        prop::sample::select(vec![DType::F32, DType::F32, DType::F16, DType::BF16]),
        0usize..3,
    )
        .prop_map(|(rank, axis, parts, dtype, consumer)| Recipe {
            rank,
            axis: axis % rank,
            parts: parts
                .into_iter()
                .map(|(len, group, out, other)| {
                    (len, group, out && len % 2 == 1, other && len == 2)
                })
                .collect(),
            dtype,
            consumer,
        })
}

fn build(recipe: &Recipe) -> Graph {
    let mut b = GraphBuilder::new("in_place");
    let base: Vec<usize> = [3, 2, 4][..recipe.rank].to_vec();
    let mut outputs: Vec<String> = Vec::new();
    let mut operands: Vec<String> = Vec::new();
    let mut inputs: std::collections::HashMap<(usize, usize), String> = Default::default();
    let mut pinned: std::collections::HashSet<(usize, usize)> = Default::default();
    let funcs = ["exp", "tanh", "sigmoid", "neg"];
    for (i, &(len, group, out, other)) in recipe.parts.iter().enumerate() {
        let mut shape = base.clone();
        shape[recipe.axis] = len;
        let x = inputs
            .entry((len, group))
            .or_insert_with(|| b.input(&format!("x{len}_{group}"), recipe.dtype, &shape))
            .clone();
        let y = b.op(&format!("p{i}"), funcs[i % funcs.len()], &[&x]);
        let v = b.op(&format!("v{i}"), "mul", &[&y, &x]);
        // The kernels of groups 0 and 1 write a value of their own too, so they cannot be
        // segments of a range select: their operands are written in place or copied. Group
        // 2's may be.
        if group < 2 && pinned.insert((len, group)) {
            outputs.push(b.op(&format!("w{i}"), "neg", &[&v]));
        }
        if out {
            outputs.push(v.clone());
        }
        if other {
            let r = b.op_with(
                &format!("r{i}"),
                "sum",
                &[&v],
                &[("axes", AttrValue::Ints(vec![recipe.axis as i64]))],
            );
            outputs.push(r);
        }
        operands.push(v);
    }
    let refs: Vec<&str> = operands.iter().map(String::as_str).collect();
    let c = b.op_with(
        "c",
        "concat",
        &refs,
        &[("axis", AttrValue::Int(recipe.axis as i64))],
    );
    match recipe.consumer {
        0 => outputs.push(c),
        1 => {
            let s = b.op_with(
                "s",
                "sum",
                &[&c],
                &[("axes", AttrValue::Ints(vec![recipe.axis as i64]))],
            );
            outputs.push(c);
            outputs.push(s);
        }
        _ => {
            let r = b.op("relu_c", "relu", &[&c]);
            outputs.push(r);
        }
    }
    let names: Vec<&str> = outputs.iter().map(String::as_str).collect();
    b.finish(&names)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: random_graph::cases(400),
        ..ProptestConfig::default()
    })]

    /// Random graphs whose concat may be written in place, fused and run by the interpreter,
    /// equal the reference.
    #[test]
    fn random_in_place_graphs_agree_in_the_interpreter(
        recipe in recipes(),
        seed in 0u64..1000,
        specials in any::<bool>(),
    ) {
        let graph = build(&recipe);
        agrees(&graph, seed, specials, false)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: random_graph::cases(30),
        ..ProptestConfig::default()
    })]

    /// The same graphs compiled to C and run on the CPU.
    #[test]
    fn random_in_place_graphs_agree_on_the_cpu(
        recipe in recipes(),
        seed in 0u64..1000,
        specials in any::<bool>(),
    ) {
        let graph = build(&recipe);
        agrees(&graph, seed, specials, true)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}

/// The recipes reach what the tests above claim: many graphs write their concat in place
/// (the others read it by ranges or copy it), with several operands stored by one kernel,
/// operands that are outputs or read elsewhere, empty segments and half precision all among
/// them.
#[test]
fn recipes_cover_writing_in_place() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = recipes();
    let (mut total, mut written, mut shared, mut kept, mut empty, mut half) = (0, 0, 0, 0, 0, 0);
    for _ in 0..300 {
        let recipe = strategy.new_tree(&mut runner).unwrap().current();
        let out = optimized(&build(&recipe));
        total += 1;
        if out.partition.in_place.is_empty() {
            continue;
        }
        written += 1;
        shared += usize::from(out.partition.kernels.iter().any(|k| k.segments.len() > 1));
        kept += usize::from(recipe.parts.iter().any(|p| p.2 || p.3));
        empty += usize::from(recipe.parts.iter().any(|p| p.0 == 0));
        half += usize::from(recipe.dtype != DType::F32);
    }
    eprintln!(
        "{total}: {written} in place, {shared} shared, {kept} kept, {empty} empty, {half} half"
    );
    assert!(written * 4 > total, "{written} of {total}");
    assert!(shared * 5 > written && kept * 4 > written);
    assert!(empty * 5 > written && half * 5 > written);
}

/// Graphs whose concat's operands are reductions read by nothing else, each the case a
/// reduction written in place must get right: column sums kept as `[1, n]` rows along an inner
/// axis, a mean and a max of the innermost axis (no row kernel: nothing reads them inside),
/// integer sums that wrap at the type's edges, a mean over an empty axis (NaN, 0 / 0,
/// written into its segment), half precision, and three operands of which the middle one is a graph
/// input (so that concat keeps its copy). Returns (graph, concat written in place or not).
pub(crate) fn reductions_into_concats() -> Vec<(Graph, bool)> {
    let axes = |a: &[i64]| ("axes", AttrValue::Ints(a.to_vec()));
    let keep = ("keepdim", AttrValue::Bool(true));
    let axis = |a: i64| [("axis", AttrValue::Int(a))];
    let mut graphs = Vec::new();

    let mut b = GraphBuilder::new("keepdim_columns");
    let x = b.input("x", DType::F32, &[3, 4]);
    let y = b.input("y", DType::F32, &[3, 5]);
    let e = b.op("e", "exp", &[&x]);
    let t = b.op("t", "tanh", &[&y]);
    let se = b.op_with("se", "sum", &[&e], &[axes(&[0]), keep.clone()]);
    let st = b.op_with("st", "sum", &[&t], &[axes(&[0]), keep.clone()]);
    b.op_with("c", "concat", &[&se, &st], &axis(1));
    graphs.push((b.finish(&["c"]), true));

    let mut b = GraphBuilder::new("mean_and_max_of_rows");
    let x = b.input("x", DType::F32, &[4, 6]);
    let y = b.input("y", DType::F32, &[4, 6]);
    let e = b.op("e", "exp", &[&x]);
    let m = b.op("m", "mul", &[&x, &y]);
    let me = b.op_with("me", "mean", &[&e], &[axes(&[1])]);
    let mm = b.op_with("mm", "reduce_max", &[&m], &[axes(&[1])]);
    b.op_with("c", "concat", &[&me, &mm], &axis(0));
    b.op("w", "add", &[&e, &m]);
    graphs.push((b.finish(&["c", "w"]), true));

    let mut b = GraphBuilder::new("integer_sums");
    let x = b.input("x", DType::I32, &[5, 3]);
    let y = b.input("y", DType::I32, &[5, 3]);
    let n = b.op("n", "neg", &[&x]);
    let p = b.op("p", "add", &[&x, &y]);
    let sn = b.op_with("sn", "sum", &[&n], &[axes(&[0])]);
    let sp = b.op_with("sp", "sum", &[&p], &[axes(&[0])]);
    b.op_with("c", "concat", &[&sn, &sp], &axis(0));
    graphs.push((b.finish(&["c"]), true));

    // One kernel over an empty domain holds both reductions: the sum's results (0) reach
    // the concat's buffer through the first argument, the mean's (NaN, 0 / 0) through the
    // second, which must still hand back its segment although no domain point exists.
    let mut b = GraphBuilder::new("empty_reduced_axis");
    let x = b.input("x", DType::F32, &[0, 3]);
    let e = b.op("e", "exp", &[&x]);
    let se = b.op_with("se", "sum", &[&e], &[axes(&[0])]);
    let me = b.op_with("me", "mean", &[&e], &[axes(&[0])]);
    b.op_with("c", "concat", &[&se, &me], &axis(0));
    graphs.push((b.finish(&["c"]), true));

    for dtype in [DType::F16, DType::BF16] {
        let mut b = GraphBuilder::new(&format!("half_{dtype}"));
        let x = b.input("x", dtype, &[6, 2]);
        let y = b.input("y", dtype, &[6, 2]);
        let m = b.op("m", "mul", &[&x, &y]);
        let s = b.op("s", "sigmoid", &[&x]);
        let sm = b.op_with("sm", "sum", &[&m], &[axes(&[0])]);
        let ss = b.op_with("ss", "sum", &[&s], &[axes(&[0])]);
        b.op_with("c", "concat", &[&sm, &ss], &axis(0));
        graphs.push((b.finish(&["c"]), true));
    }

    let mut b = GraphBuilder::new("an_input_operand");
    let x = b.input("x", DType::F32, &[4, 3]);
    let z = b.input("z", DType::F32, &[3]);
    let e = b.op("e", "exp", &[&x]);
    let se = b.op_with("se", "sum", &[&e], &[axes(&[0])]);
    b.op_with("c", "concat", &[&se, &z], &axis(0));
    graphs.push((b.finish(&["c"]), false));
    graphs
}

/// Reductions store their results through their accumulators into their segments (no buffer
/// of their own, one kernel writing the concat), and the interpreter and the CPU agree with
/// the reference, NaN and ±Inf included; a sum that is also a graph output, or read by
/// another kernel, keeps its buffer (its accumulator writes one place).
#[test]
fn reductions_store_their_results_into_concat_segments() {
    for (graph, expected) in reductions_into_concats() {
        let out = optimized(&graph);
        let name = &graph.name;
        assert_eq!(
            in_place(&out) == ["c"],
            expected,
            "{name}: {:?}",
            in_place(&out)
        );
        if expected {
            let program = lowered(&out);
            program.check_bounds().unwrap();
            let plan = MemoryPlan::new(&program);
            for (n, node) in program.dag.nodes.iter().enumerate() {
                if node.op.kind() == fusebox::rules::OpKind::Reduction {
                    assert_eq!(plan.slot_of[n], None, "{name}: {} has no slot", node.name);
                }
            }
            let c = Value::Node(node(&program, "c"));
            let writers = program
                .steps
                .iter()
                .filter(|s| s.reads_writes(&program.kernels).1.contains(&c))
                .count();
            assert!(writers >= 1, "{name}");
        }
        for seed in 0..4 {
            agrees(&graph, seed, seed % 2 == 1, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    // Read elsewhere too: the sum keeps its own buffer, and the concat copies it.
    let mut b = GraphBuilder::new("sum_also_an_output");
    let x = b.input("x", DType::F32, &[4, 3]);
    let y = b.input("y", DType::F32, &[4, 3]);
    let e = b.op("e", "exp", &[&x]);
    let t = b.op("t", "tanh", &[&y]);
    let axes = ("axes", AttrValue::Ints(vec![0]));
    let se = b.op_with("se", "sum", &[&e], std::slice::from_ref(&axes));
    let st = b.op_with("st", "sum", &[&t], std::slice::from_ref(&axes));
    b.op_with("c", "concat", &[&se, &st], &[("axis", AttrValue::Int(0))]);
    let graph = b.finish(&["c", "se"]);
    assert!(in_place(&optimized(&graph)).is_empty());
    agrees(&graph, 1, true, true).unwrap();
}
