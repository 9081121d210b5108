//! Concat read in place (a *range select*): a kernel evaluates each operand of a concat over
//! its own segment and picks by the index along the concat's axis, so a concat costs no copy
//! and its operands' ops join the kernel that reads it. Checked against known values and the
//! reference evaluator, in the kernel-IR interpreter and compiled on the CPU: empty segments,
//! negative axes, broadcast operands, f16/bf16, a concat read by several kernels, and random
//! graphs built around concats.

use crate::common;

use common::concat_graphs;
use common::random_graph::{self, assert_same, rules};
use fusebox::attr::AttrValue;
use fusebox::backend::Executable;
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::graph::{self, Graph, GraphBuilder};
use fusebox::lower::ir::Instr;
use fusebox::lower::{self, Program};
use fusebox::optimize::{Options, optimize};
use fusebox::partition::KernelKind;
use fusebox::runner::prepare;
use fusebox::runtime::interpret;
use fusebox::tensor::Tensor;
use proptest::prelude::*;
use std::collections::HashMap;

use common::kernel_cache::compiler;

fn lowered(graph: &Graph) -> Program {
    let out = optimize(graph, rules(), &Options::default()).expect("optimize");
    lower::lower(&out.dag, &out.partition).expect("lower")
}

/// Whether some kernel of `program` reads a concat by ranges.
fn selects(program: &Program) -> bool {
    program
        .kernels
        .iter()
        .any(|k| k.body.iter().any(|i| matches!(i, Instr::Select { .. })))
}

/// The interpreter's outputs for `program` on `inputs`, by name.
pub(crate) fn interpreted(program: &Program, inputs: &Tensors) -> Result<Tensors, String> {
    let buffers = random_graph::input_buffers(program, inputs);
    let got = interpret::run_program(program, &buffers).map_err(|e| e.to_string())?;
    Ok(program
        .dag
        .outputs
        .iter()
        .zip(got)
        .map(|(o, b)| (o.name.clone(), b.to_tensor()))
        .collect())
}

/// The compiled CPU program's outputs on `inputs`.
pub(crate) fn compiled(graph: &Graph, inputs: &Tensors) -> Result<Tensors, String> {
    let mut prepared =
        prepare(graph, rules(), &Options::default(), compiler()).map_err(|e| e.to_string())?;
    prepared
        .executable
        .run_tensors(inputs)
        .map_err(|e| e.to_string())
}

/// The interpreter and the CPU agree with the reference evaluator on `graph`.
pub(crate) fn agrees(graph: &Graph, seed: u64, specials: bool, cpu: bool) -> Result<(), String> {
    let inputs = random_graph::inputs(graph, seed, specials);
    let want = fusebox::eval::evaluate(graph, &rules().ops, &inputs).map_err(|e| e.to_string())?;
    let program = lowered(graph);
    program.check_bounds().map_err(|e| e.to_string())?;
    let got = interpreted(&program, &inputs)?;
    for name in &graph.outputs {
        assert_same(&format!("interpreted {name}"), &want[name], &got[name])?;
    }
    if cpu {
        let got = compiled(graph, &inputs)?;
        for name in &graph.outputs {
            assert_same(&format!("compiled {name}"), &want[name], &got[name])?;
        }
    }
    Ok(())
}

pub(crate) fn input(name: &str, dtype: DType, shape: &[usize], values: &[f64]) -> (String, Tensor) {
    (
        name.to_string(),
        Tensor::from_values(dtype, shape, values.to_vec()).unwrap(),
    )
}

/// `relu(concat(-x, y, axis 1) + b)` with hand-computed values: one kernel, which selects, and
/// the same numbers from the reference, the interpreter and the compiled CPU kernel.
#[test]
fn concat_read_by_ranges_gives_known_values() {
    let mut b = GraphBuilder::new("known");
    let x = b.input("x", DType::F32, &[2, 2]);
    let y = b.input("y", DType::F32, &[2, 1]);
    let bias = b.input("b", DType::F32, &[3]);
    let nx = b.op("nx", "neg", &[&x]);
    let c = b.op_with("c", "concat", &[&nx, &y], &[("axis", AttrValue::Int(1))]);
    let s = b.op("s", "add", &[&c, &bias]);
    b.op("out", "relu", &[&s]);
    let graph = b.finish(&["out"]);
    let inputs: Tensors = [
        input("x", DType::F32, &[2, 2], &[1.0, 2.0, 3.0, -40.0]),
        input("y", DType::F32, &[2, 1], &[5.0, -60.0]),
        input("b", DType::F32, &[3], &[10.0, 20.0, 30.0]),
    ]
    .into();
    // -x = [[-1, -2], [-3, 40]]; with y: [[-1, -2, 5], [-3, 40, -60]]; + b, relu:
    let want = [9.0, 18.0, 35.0, 7.0, 60.0, 0.0];
    let optimized = optimize(&graph, rules(), &Options::default()).unwrap();
    assert_eq!(optimized.partition.kernels.len(), 1);
    let program = lowered(&graph);
    assert!(selects(&program), "the concat is read by ranges");
    assert_eq!(
        interpreted(&program, &inputs).unwrap()["out"].values(),
        want
    );
    assert_eq!(compiled(&graph, &inputs).unwrap()["out"].values(), want);
    let reference = fusebox::eval::evaluate(&graph, &rules().ops, &inputs).unwrap();
    assert_eq!(reference["out"].values(), want);
}

/// examples/layout_mix.ron, the issue's transpose/reshape/slice/concat graph: at most two
/// kernels (nine op by op), no copies, and the reference's values.
#[test]
fn layout_mix_runs_in_two_kernels() {
    let graph = graph::file::load(
        std::path::Path::new("examples/layout_mix.ron"),
        &rules().ops,
    )
    .unwrap()
    .0;
    let optimized = optimize(&graph, rules(), &Options::default()).unwrap();
    let kernels = &optimized.partition.kernels;
    assert!(kernels.len() <= 2, "{} kernels", kernels.len());
    assert!(kernels.iter().all(|k| k.kind == KernelKind::Fused));
    assert!(optimized.report.kernels_after <= 2);
    agrees(&graph, 5, false, true).unwrap();
}

/// Segments of length 0 (first, middle, last, and all but one) are skipped: the kernel reads
/// only the operands with elements.
#[test]
fn empty_segments_are_skipped() {
    for lens in [[0, 2, 3], [2, 0, 3], [2, 3, 0], [0, 4, 0]] {
        let mut b = GraphBuilder::new("empty");
        let mut parts = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let x = b.input(&format!("x{i}"), DType::F32, &[3, len]);
            parts.push(b.op(&format!("e{i}"), "exp", &[&x]));
        }
        let args: Vec<&str> = parts.iter().map(String::as_str).collect();
        let c = b.op_with("c", "concat", &args, &[("axis", AttrValue::Int(-1))]);
        b.op("out", "tanh", &[&c]);
        let graph = b.finish(&["out"]);
        agrees(&graph, 1, true, true).unwrap_or_else(|e| panic!("{lens:?}: {e}"));
    }
}

/// A negative axis, a concat along the outer axis, operands broadcast (a `broadcast_to`
/// and a vector added inside an operand), and the concat itself broadcast against a larger
/// domain: all read by ranges and equal to the reference.
#[test]
fn negative_axes_and_broadcast_operands() {
    let mut b = GraphBuilder::new("bc");
    let x = b.input("x", DType::F32, &[2, 5]);
    let v = b.input("v", DType::F32, &[1, 5]);
    let col = b.input("col", DType::F32, &[1, 1]);
    let big = b.input("big", DType::F32, &[4, 3, 5]);
    let xv = b.op("xv", "add", &[&x, &v]);
    let wide = b.op_with(
        "wide",
        "broadcast_to",
        &[&col],
        &[("shape", AttrValue::Ints(vec![1, 5]))],
    );
    let c = b.op_with(
        "c",
        "concat",
        &[&xv, &wide],
        &[("axis", AttrValue::Int(-2))],
    );
    b.op("out", "mul", &[&c, &big]);
    let graph = b.finish(&["out"]);
    assert!(selects(&lowered(&graph)));
    agrees(&graph, 2, true, true).unwrap();
}

/// f16 and bf16 operands meet at the concat's promoted dtype (f32 here, f16 between f16s),
/// rounded as the reference rounds them.
#[test]
fn half_precision_operands() {
    for (a, c) in [
        (DType::F16, DType::BF16),
        (DType::F16, DType::F16),
        (DType::BF16, DType::F32),
    ] {
        let mut b = GraphBuilder::new("half");
        let x = b.input("x", a, &[4, 3]);
        let y = b.input("y", c, &[4, 2]);
        let ex = b.op("ex", "exp", &[&x]);
        let cat = b.op_with("cat", "concat", &[&ex, &y], &[("axis", AttrValue::Int(1))]);
        b.op("out", "sigmoid", &[&cat]);
        let graph = b.finish(&["out"]);
        assert!(selects(&lowered(&graph)), "{a} and {c}");
        agrees(&graph, 3, true, true).unwrap_or_else(|e| panic!("{a} and {c}: {e}"));
    }
}

/// A concat read by several kernels (a reduction over its axis and a pointwise consumer) and
/// written as an output: each kernel that reads it reads its operands by ranges, or one
/// writes it and the others read that.
#[test]
fn concat_read_by_several_kernels() {
    let mut b = GraphBuilder::new("several");
    let x = b.input("x", DType::F32, &[3, 4]);
    let y = b.input("y", DType::F32, &[2, 4]);
    let ex = b.op("ex", "exp", &[&x]);
    let c = b.op_with("c", "concat", &[&ex, &y], &[("axis", AttrValue::Int(0))]);
    b.op_with("s", "sum", &[&c], &[("axes", AttrValue::Ints(vec![0]))]);
    b.op("t", "tanh", &[&c]);
    let graph = b.finish(&["c", "s", "t"]);
    agrees(&graph, 4, true, true).unwrap();
}

/// One random concat graph fused and run (compiled to C when `compiled`, else by the
/// interpreter) against the reference; rejected when the recipe builds no graph.
fn random_concat_graph_agrees(
    recipe: &random_graph::ConcatRecipe,
    seed: u64,
    specials: bool,
    compiled: bool,
) -> Result<(), TestCaseError> {
    let graph = random_graph::build_concat(&rules().ops, recipe);
    prop_assume!(graph.is_some());
    let graph = graph.unwrap();
    agrees(&graph, seed, specials, compiled)
        .map_err(|e| TestCaseError::fail(format!("{e}\n{}", graph::file::to_ron(&graph))))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: random_graph::cases(1500),
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// Random graphs around a concat, fused and run by the interpreter, equal the reference.
    #[test]
    fn random_concat_graphs_agree_in_the_interpreter(
        recipe in random_graph::concat_recipes(),
        seed in 0u64..1000,
        specials in any::<bool>(),
    ) {
        random_concat_graph_agrees(&recipe, seed, specials, false)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: random_graph::cases(60),
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// The same graphs compiled to C and run on the CPU.
    #[test]
    fn random_concat_graphs_agree_on_the_cpu(
        recipe in random_graph::concat_recipes(),
        seed in 0u64..1000,
        specials in any::<bool>(),
    ) {
        random_concat_graph_agrees(&recipe, seed, specials, true)?;
    }
}

/// The concat generator reaches what the tests above claim: over 500 recipes, most graphs
/// read their concat by ranges; empty segments, negative axes and half-precision operands
/// all occur; kernels that reduce a concat read by ranges occur both cut into pieces (their
/// reductions keep the concat's axis) and with pieces chosen inside their loop nest (they
/// reduce it); and row kernels read concats both along an outer axis (in pieces) and along
/// their rows.
#[test]
fn concat_recipes_cover_range_selects() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[9; 32]),
    );
    let strategy = random_graph::concat_recipes();
    let (mut built, mut selecting, mut empty, mut negative, mut half) = (0, 0, 0, 0, 0);
    // Kernels that reduce and read a concat by ranges: cut into pieces, and clamped; row
    // kernels that read one (always in pieces).
    let (mut reducing_pieces, mut reducing_in_nest, mut reducing_clamped) = (0, 0, 0);
    let (mut row_pieces, mut row_along) = (0, 0);
    for _ in 0..500 {
        let recipe = strategy.new_tree(&mut runner).unwrap().current();
        let Some(graph) = random_graph::build_concat(&rules().ops, &recipe) else {
            continue;
        };
        built += 1;
        let program = lowered(&graph);
        selecting += usize::from(selects(&program));
        for ir in program
            .kernels
            .iter()
            .filter(|ir| !ir.reductions.is_empty() && ir.has_ranges())
        {
            if lower::split::split(ir).is_some() {
                reducing_pieces += 1;
            } else if lower::split::split_in_nest(ir).is_some() {
                reducing_in_nest += 1;
            } else {
                reducing_clamped += 1;
            }
        }
        for ir in program
            .kernels
            .iter()
            .filter(|ir| ir.is_row_kernel() && ir.has_ranges())
        {
            if ir.selects_along_rows() {
                row_along += 1;
            } else {
                assert!(lower::split::split(ir).is_some(), "{graph:?}");
                row_pieces += 1;
            }
        }
        empty += usize::from(recipe.parts.iter().any(|p| p.len == 0));
        negative += usize::from(recipe.axis < 0);
        half += usize::from(
            graph
                .inputs
                .iter()
                .any(|i| matches!(i.dtype, DType::F16 | DType::BF16)),
        );
    }
    eprintln!(
        "{built} built, {selecting} select, {empty} empty, {negative} negative, {half} half, \
         reducing kernels: {reducing_pieces} in pieces, {reducing_in_nest} in pieces in the nest, \
         {reducing_clamped} clamped, \
         row kernels in pieces: {row_pieces}, along their rows: {row_along}"
    );
    assert!(built > 400, "{built}");
    // A clamped reducing kernel needs two concats with different segments, which the
    // generator never builds: `two_concats_with_different_segments_keep_the_clamped_form`.
    assert!(reducing_pieces >= 20 && reducing_in_nest >= 20);
    assert!(row_pieces >= 15 && row_along >= 15);
    assert!(selecting * 2 > built, "{selecting} of {built}");
    assert!(empty * 5 > built && negative * 3 > built && half * 3 > built);
}

// ---------------------------------------------------------------------------------------------
// Per-segment loops: where the select runs along a loop axis, the C kernel runs one loop per
// segment, each evaluating only its own operand (src/backend/cpu/emit/split.rs), and falls
// back to the clamped form only for selects the pieces cannot express.

fn parse(text: &str) -> Graph {
    graph::file::parse(text, "test.ron", &rules().ops)
        .expect("graph parses")
        .0
}

/// How many kernels of `program` the C emitter splits into per-segment pieces: their C text
/// calls a piece over a cut domain.
fn split_kernels(program: &Program) -> usize {
    program
        .kernels
        .iter()
        .filter(|ir| fusebox::backend::cpu::emit::emit_kernel(ir, "k").contains("k_s0(cut"))
        .count()
}

/// `relu(concat(exp(a), b, tanh(c)) * w)` over rank-3 operands joined along axis 0, 1 and 2
/// (and -1), with segments of length 0, 1 and 2 in every position: each is one kernel split
/// into per-segment loops, equal to the reference with and without NaN/Inf inputs.
#[test]
fn per_segment_loops_along_every_axis_with_segments_of_size_0_and_1() {
    for axis in [0i64, 1, 2, -1] {
        for lens in [[1, 0, 2], [0, 1, 1], [2, 1, 0], [1, 1, 1]] {
            let ax = axis.rem_euclid(3) as usize;
            let shape = |len: usize| {
                let mut s = vec![2usize, 3, 4];
                s[ax] = len;
                s
            };
            let total: usize = lens.iter().sum();
            let mut b = GraphBuilder::new("segments");
            let a = b.input("a", DType::F32, &shape(lens[0]));
            let y = b.input("y", DType::F32, &shape(lens[1]));
            let c = b.input("c", DType::F32, &shape(lens[2]));
            let w = b.input("w", DType::F32, &shape(total));
            let ea = b.op("ea", "exp", &[&a]);
            let tc = b.op("tc", "tanh", &[&c]);
            let cat = b.op_with(
                "cat",
                "concat",
                &[&ea, &y, &tc],
                &[("axis", AttrValue::Int(axis))],
            );
            let m = b.op("m", "mul", &[&cat, &w]);
            b.op("out", "relu", &[&m]);
            let graph = b.finish(&["out"]);
            let program = lowered(&graph);
            assert_eq!(program.kernels.len(), 1, "axis {axis}, {lens:?}");
            if lens.iter().filter(|&&l| l > 0).count() > 1 {
                assert_eq!(split_kernels(&program), 1, "axis {axis}, {lens:?}");
            }
            for specials in [false, true] {
                agrees(&graph, 7, specials, true)
                    .unwrap_or_else(|e| panic!("axis {axis}, {lens:?}: {e}"));
            }
        }
    }
}

/// Operands read through views: a slice with step 2, a transpose, and a reshape of a
/// transpose (an index map), concatenated along the inner axis and along the outer one. The
/// pieces read each view from the segment's start.
#[test]
fn per_segment_operands_through_strided_views_and_index_maps() {
    for axis in [1, 0] {
        let (sliced, transposed, mapped) = if axis == 1 {
            ("[4, 9]", "[3, 4]", "[4, 6]")
        } else {
            ("[9, 4]", "[4, 2]", "[8, 3]")
        };
        let graph = parse(&format!(
            r#"Graph(name: "views",
            inputs: [Input(name: "x", dtype: "f32", shape: {sliced}),
                     Input(name: "t", dtype: "f32", shape: {transposed}),
                     Input(name: "m", dtype: "f32", shape: {mapped})],
            nodes: [Node(name: "s", op: "slice", args: ["x"],
                         attrs: {{"axis": {axis}, "start": 1, "step": 2}}),
                    Node(name: "tt", op: "transpose", args: ["t"]),
                    Node(name: "mt", op: "transpose", args: ["m"]),
                    Node(name: "r", op: "reshape", args: ["mt"],
                         attrs: {{"shape": {shape}}}),
                    Node(name: "er", op: "exp", args: ["r"]),
                    Node(name: "c", op: "concat", args: ["s", "tt", "er"], attrs: {{"axis": {axis}}}),
                    Node(name: "out", op: "tanh", args: ["c"])],
            outputs: ["out"])"#,
            shape = if axis == 1 { "[4, 6]" } else { "[6, 4]" },
        ));
        let program = lowered(&graph);
        assert!(selects(&program), "axis {axis}");
        assert!(
            program
                .kernels
                .iter()
                .any(|k| k.loads.iter().any(|v| v.is_mapped())),
            "axis {axis}: the reshape of a transpose is read through an index map"
        );
        assert_eq!(split_kernels(&program), 1, "axis {axis}");
        agrees(&graph, 8, true, true).unwrap_or_else(|e| panic!("axis {axis}: {e}"));
    }
}

/// f16 and bf16 operands in per-segment loops, rounded where the reference rounds.
#[test]
fn per_segment_half_precision() {
    for (a, c) in [(DType::F16, DType::BF16), (DType::BF16, DType::BF16)] {
        let mut b = GraphBuilder::new("half");
        let x = b.input("x", a, &[3, 40]);
        let y = b.input("y", c, &[3, 24]);
        let ex = b.op("ex", "exp", &[&x]);
        let ty = b.op("ty", "tanh", &[&y]);
        let cat = b.op_with("cat", "concat", &[&ex, &ty], &[("axis", AttrValue::Int(1))]);
        b.op("out", "neg", &[&cat]);
        let graph = b.finish(&["out"]);
        assert_eq!(split_kernels(&lowered(&graph)), 1, "{a} and {c}");
        agrees(&graph, 9, true, true).unwrap_or_else(|e| panic!("{a} and {c}: {e}"));
    }
}

/// NaN and ±Inf in one operand stay in its segment: the other segment's values are exactly
/// its own operand's, in the interpreter and compiled.
#[test]
fn nan_and_inf_stay_in_their_segment() {
    let mut b = GraphBuilder::new("specials");
    let x = b.input("x", DType::F32, &[2, 3]);
    let y = b.input("y", DType::F32, &[2, 2]);
    let ex = b.op("ex", "exp", &[&x]);
    let ny = b.op("ny", "neg", &[&y]);
    b.op_with("c", "concat", &[&ex, &ny], &[("axis", AttrValue::Int(1))]);
    let graph = b.finish(&["c"]);
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let inputs: Tensors = [
        input("x", DType::F32, &[2, 3], &[nan, inf, -inf, 0.0, nan, 1.0]),
        input("y", DType::F32, &[2, 2], &[1.0, -2.0, 3.0, 0.5]),
    ]
    .into();
    let program = lowered(&graph);
    assert_eq!(split_kernels(&program), 1);
    let e1 = (1.0f32).exp() as f64;
    let want = [nan, inf, 0.0, -1.0, 2.0, 1.0, nan, e1, -3.0, -0.5];
    for got in [
        interpreted(&program, &inputs).unwrap(),
        compiled(&graph, &inputs).unwrap(),
    ] {
        let got = got["c"].values();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "element {i}: {g} vs {w}"
            );
        }
    }
}

/// A concat that is its kernel's output and is read by another kernel too (a matmul, a
/// library step): the writing kernel runs per-segment loops, and the reader sees every
/// segment.
#[test]
fn per_segment_concat_written_out_and_read_by_another_kernel() {
    let mut b = GraphBuilder::new("written");
    let x = b.input("x", DType::F32, &[5, 6]);
    let y = b.input("y", DType::F32, &[5, 3]);
    let ex = b.op("ex", "exp", &[&x]);
    let sy = b.op("sy", "sigmoid", &[&y]);
    let w = b.input("w", DType::F32, &[9, 2]);
    let c = b.op_with("c", "concat", &[&ex, &sy], &[("axis", AttrValue::Int(1))]);
    b.op("s", "matmul", &[&c, &w]);
    let graph = b.finish(&["c", "s"]);
    let program = lowered(&graph);
    assert_eq!(split_kernels(&program), 1);
    agrees(&graph, 10, true, true).unwrap();
}

/// `concat(exp(a), b) + concat(tanh(c), d)` along axis 1 over `rows` rows: two concats of
/// one axis whose segments differ (2 + 5 against 4 + 3 columns).
fn two_concats(rows: usize) -> Graph {
    let mut b = GraphBuilder::new("two");
    let a = b.input("a", DType::F32, &[rows, 2]);
    let bb = b.input("b", DType::F32, &[rows, 5]);
    let c = b.input("c", DType::F32, &[rows, 4]);
    let d = b.input("d", DType::F32, &[rows, 3]);
    let ea = b.op("ea", "exp", &[&a]);
    let tc = b.op("tc", "tanh", &[&c]);
    let k1 = b.op_with("k1", "concat", &[&ea, &bb], &[("axis", AttrValue::Int(1))]);
    let k2 = b.op_with("k2", "concat", &[&tc, &d], &[("axis", AttrValue::Int(1))]);
    b.op("out", "add", &[&k1, &k2]);
    b.finish(&["out"])
}

/// Two concats along one axis with different segments in one kernel: no split into pieces
/// fits both, so the kernel keeps the clamped form, and is still right.
#[test]
fn two_concats_with_different_segments_keep_the_clamped_form() {
    let graph = two_concats(3);
    let program = lowered(&graph);
    if selects(&program) {
        assert_eq!(split_kernels(&program), 0);
    }
    agrees(&graph, 11, true, true).unwrap();
}

/// Two concats whose segments coincide ([`concat_graphs::concats_alike`]: their product, and
/// its row sums) share launch ranges, so their kernel runs as pieces (each evaluating only
/// `tanh` or only `exp`), as the partition prices it and the report says: the product cuts
/// into one launch per segment, the row sums choose their pieces in the loop nest. Equal to
/// the reference with and without NaN/Inf, in the interpreter and compiled. (Each concat got
/// ranges of its own before, so the kernel ran clamped while priced and reported as pieces:
/// 15x slower on `[4096, 1024]`.)
#[test]
fn two_concats_with_the_same_segments_share_their_pieces() {
    for graph in concat_graphs::concats_alike() {
        let out = optimize(&graph, rules(), &Options::default()).unwrap();
        assert_eq!(out.partition.kernels.len(), 1, "{}", graph.name);
        let concats = &out.report.kernels[0].concats;
        assert_eq!(concats.len(), 2);
        assert!(concats.iter().all(|c| c.per_segment), "{concats:?}");
        let program = lowered(&graph);
        let ir = &program.kernels[0];
        assert_eq!(ir.range_count(), 2, "{}: one range per segment", graph.name);
        if ir.reductions.is_empty() {
            assert_eq!(lower::split::split(ir).expect("pieces").pieces.len(), 2);
            assert_eq!(split_kernels(&program), 1);
        } else {
            assert!(lower::split::split_in_nest(ir).is_some(), "{}", graph.name);
            assert_eq!(in_nest_kernels(&program), 1, "{}", graph.name);
        }
        for (seed, specials) in [(12, false), (13, true)] {
            agrees(&graph, seed, specials, true)
                .unwrap_or_else(|e| panic!("{} (specials {specials}): {e}", graph.name));
        }
    }
}

/// The flop-equivalents of each kernel of `graph`'s partition under `options`, by the
/// names of its nodes.
fn kernel_flops(graph: &Graph, options: &Options) -> Vec<(Vec<String>, u64)> {
    let out = optimize(graph, rules(), options).expect("optimize");
    out.partition
        .kernels
        .iter()
        .map(|k| {
            let names = k
                .nodes
                .iter()
                .map(|&n| out.dag.nodes[n].name.clone())
                .collect();
            (names, k.cost.flops)
        })
        .collect()
}

/// `relu(concat(tanh(erf(a)), tanh(erf(b))))` with heavy operands, `[1024, 1024]` each: the
/// kernel reading the concat runs as pieces, each evaluating only its own operand, so fusing
/// the operands into it costs no arithmetic. Priced as the pieces run (every node's weight
/// over the points where its piece evaluates it, the same flop count as one kernel per op),
/// the whole graph is one kernel moving the inputs and the output only (16 MiB); priced as
/// the clamped form (both operands at every point), it stayed two kernels moving 32 MiB.
#[test]
fn heavy_operands_fuse_through_a_concat_priced_as_pieces() {
    let text = |n: usize| {
        format!(
            r#"Graph(name: "heavy_concat",
                inputs: [Input(name: "a", dtype: "f32", shape: [{n}, {n}]),
                         Input(name: "b", dtype: "f32", shape: [{n}, {n}])],
                nodes: [
                    Node(name: "ea", op: "erf", args: ["a"]),
                    Node(name: "ta", op: "tanh", args: ["ea"]),
                    Node(name: "eb", op: "erf", args: ["b"]),
                    Node(name: "tb", op: "tanh", args: ["eb"]),
                    Node(name: "c", op: "concat", args: ["ta", "tb"], attrs: {{"axis": 1}}),
                    Node(name: "y", op: "relu", args: ["c"]),
                ],
                outputs: ["y"])"#
        )
    };
    let graph = parse(&text(1024));
    let fused = kernel_flops(&graph, &Options::default());
    assert_eq!(fused.len(), 1, "one kernel: {fused:?}");
    let unfused = kernel_flops(
        &graph,
        &Options {
            fusion: false,
            ..Options::default()
        },
    );
    assert_eq!(unfused.len(), 6);
    let per_op: u64 = unfused.iter().map(|(_, f)| f).sum();
    let operands: u64 = unfused
        .iter()
        .filter(|(names, _)| ["ea", "ta", "eb", "tb"].contains(&names[0].as_str()))
        .map(|(_, f)| f)
        .sum();
    assert!(operands > 0);
    // Rounding: each kernel's count is rounded once.
    assert!(
        fused[0].1.abs_diff(per_op) <= 6,
        "pieces do each op once: {} against {per_op} one op per kernel",
        fused[0].1
    );
    let out = optimize(&graph, rules(), &Options::default()).unwrap();
    assert_eq!(out.report.bytes_after, 16 << 20);
    let concat = &out.report.kernels[0].concats[0];
    assert_eq!(
        (concat.strategy, concat.per_segment),
        ("range select", true)
    );
    let program = lower::lower(&out.dag, &out.partition).unwrap();
    assert_eq!(split_kernels(&program), 1);
    // The same graph, small enough for the reference evaluator, agrees with it.
    agrees(&parse(&text(48)), 21, true, true).unwrap();
}

/// Kernels that cannot run as pieces are priced at the clamped form's arithmetic, every
/// operand at every point: two concats whose segments differ. (A concat reduced in its kernel
/// along its own axis runs as pieces since the C loops choose them inside the loop nest:
/// [`reductions_along_a_concats_axis_choose_pieces_in_the_nest`].)
#[test]
fn kernels_that_cannot_split_are_priced_clamped() {
    let graph = two_concats(16);
    // Each op's weight per element of its own iteration shape, from one kernel per op.
    let unfused = optimize(
        &graph,
        rules(),
        &Options {
            fusion: false,
            ..Options::default()
        },
    )
    .unwrap();
    let weight = |name: &str| {
        let k = unfused
            .partition
            .kernels
            .iter()
            .find(|k| unfused.dag.nodes[k.nodes[0]].name == name)
            .unwrap();
        k.cost.flops as f64 / k.domain.iter().product::<usize>() as f64
    };
    let fused = optimize(&graph, rules(), &Options::default()).unwrap();
    let kernel = fused
        .partition
        .kernels
        .iter()
        .find(|k| {
            k.nodes.len() > 1
                && k.nodes.iter().any(|&n| {
                    fused.dag.nodes[n].op.builtin() == Some(fusebox::rules::Builtin::Concat)
                })
        })
        .unwrap_or_else(|| panic!("{}: a kernel reads a concat", graph.name));
    assert!(!kernel.per_segment, "{}", graph.name);
    let concats = fused.report.kernels.iter().flat_map(|k| &k.concats);
    assert!(concats.clone().any(|c| c.strategy == "range select"));
    assert!(concats.clone().all(|c| !c.per_segment), "{}", graph.name);
    let points = kernel.domain.iter().product::<usize>() as f64;
    let clamped: f64 = kernel
        .nodes
        .iter()
        .map(|&n| weight(&fused.dag.nodes[n].name))
        .sum::<f64>()
        * points;
    assert!(
        (kernel.cost.flops as f64 - clamped).abs() <= 1.0,
        "{}: priced {} against the clamped {clamped}",
        graph.name,
        kernel.cost.flops
    );
}

/// `graph` optimized and lowered, after checking that the kernel reading its concat holds the
/// reduction too, is reported to run as pieces, and is priced at the flops of one kernel per
/// op (each operand counted over its own segment only).
fn reducing_concat_kernel_priced_as_pieces(graph: &Graph) -> Program {
    let out = optimize(graph, rules(), &Options::default()).unwrap();
    let kernel = out
        .partition
        .kernels
        .iter()
        .find(|k| {
            k.nodes
                .iter()
                .any(|&n| out.dag.nodes[n].op.builtin() == Some(fusebox::rules::Builtin::Concat))
        })
        .unwrap_or_else(|| panic!("{}: a kernel reads the concat", graph.name));
    assert!(kernel.per_segment, "{}: runs as pieces", graph.name);
    assert!(
        kernel
            .nodes
            .iter()
            .any(|&n| out.dag.nodes[n].op.kind() == fusebox::rules::OpKind::Reduction),
        "{}: the reduction is in the concat's kernel",
        graph.name
    );
    let unfused = kernel_flops(
        graph,
        &Options {
            fusion: false,
            ..Options::default()
        },
    );
    let per_op: u64 = unfused
        .iter()
        .filter(|(names, _)| {
            kernel
                .nodes
                .iter()
                .any(|&n| out.dag.nodes[n].name == names[0])
        })
        .map(|(_, f)| f)
        .sum();
    assert!(
        kernel.cost.flops.abs_diff(per_op) <= kernel.nodes.len() as u64,
        "{}: {} flops against {per_op} one op per kernel",
        graph.name,
        kernel.cost.flops
    );
    lower::lower(&out.dag, &out.partition).unwrap()
}

/// Each graph of [`concat_graphs::reductions_of_concats`] is one kernel that reads its concat by ranges and
/// runs as pieces: the report says so, the C is cut into per-segment functions, the flops are
/// those of one kernel per op (each operand evaluated over its own segment only), and the
/// results equal the reference's in the interpreter and compiled, with and without NaN/Inf.
#[test]
fn reductions_keeping_the_select_axis_run_as_pieces() {
    for graph in concat_graphs::reductions_of_concats() {
        let program = reducing_concat_kernel_priced_as_pieces(&graph);
        assert_eq!(split_kernels(&program), 1, "{}", graph.name);
        for (seed, specials) in [(31, false), (32, true)] {
            agrees(&graph, seed, specials, true)
                .unwrap_or_else(|e| panic!("{} (specials {specials}): {e}", graph.name));
        }
    }
}

/// How many kernels of `program` the C emitter runs as one loop nest choosing a piece per
/// row: their C text calls that nest after the range check.
fn in_nest_kernels(program: &Program) -> usize {
    program
        .kernels
        .iter()
        .filter(|ir| fusebox::backend::cpu::emit::emit_kernel(ir, "k").contains("k_n(sizes"))
        .count()
}

/// Each graph of [`concat_graphs::reductions_along_a_concats_axis`] is one kernel holding the concat and its
/// reduction, run as pieces chosen inside its loop nest: the report says so, the C runs the
/// nest, the flops are those of one kernel per op (each operand over its own segment only),
/// and the results equal the reference in the interpreter and compiled, with and without
/// NaN/Inf. Along an outer axis they are also the unfused program's compiled results bit for
/// bit (any NaN for NaN): the nest accumulates each output over the rows in the order a
/// reduction of the concat written out does, from the same values (the graphs call only
/// functions fusebox implements itself, which give the same bits in any loop; libm's vector
/// and scalar `erf`, say, need not).
#[test]
fn reductions_along_a_concats_axis_choose_pieces_in_the_nest() {
    let unfused_options = Options {
        fusion: false,
        ..Options::default()
    };
    for (graph, same_bits) in concat_graphs::reductions_along_a_concats_axis() {
        let program = reducing_concat_kernel_priced_as_pieces(&graph);
        assert_eq!(split_kernels(&program), 0, "{}", graph.name);
        assert_eq!(in_nest_kernels(&program), 1, "{}", graph.name);
        for (seed, specials) in [(51, false), (52, true)] {
            agrees(&graph, seed, specials, true)
                .unwrap_or_else(|e| panic!("{} (specials {specials}): {e}", graph.name));
            if !same_bits {
                continue;
            }
            let inputs = random_graph::inputs(&graph, seed, specials);
            let fused = compiled(&graph, &inputs).unwrap();
            let mut separate = prepare(&graph, rules(), &unfused_options, compiler()).unwrap();
            let separate = separate.executable.run_tensors(&inputs).unwrap();
            for name in &graph.outputs {
                let bits = |t: &Tensor| -> Vec<Option<u64>> {
                    t.values()
                        .into_iter()
                        .map(|v| (!v.is_nan()).then(|| v.to_bits()))
                        .collect()
                };
                assert_eq!(
                    bits(&fused[name]),
                    bits(&separate[name]),
                    "{} {name} (specials {specials}): fused and unfused bits",
                    graph.name
                );
            }
        }
    }
}

/// Each graph of [`concat_graphs::row_kernels_of_concats`] is one row kernel that reads its concat by ranges
/// and runs as pieces (the report says so, and the C calls a row kernel per segment), and it
/// equals the reference in the interpreter and compiled, with and without NaN/Inf. A launch
/// whose ranges do not tile the axis (the domain cut one row short of the last segment's end)
/// runs the clamped form of the C row kernel, and agrees with the interpreter on it.
#[test]
fn row_kernels_over_an_outer_concat_run_as_pieces() {
    for graph in concat_graphs::row_kernels_of_concats() {
        let out = optimize(&graph, rules(), &Options::default()).unwrap();
        assert_eq!(out.partition.kernels.len(), 1, "{}: one kernel", graph.name);
        assert!(out.partition.kernels[0].per_segment, "{}", graph.name);
        let concat = &out.report.kernels[0].concats[0];
        assert_eq!(
            (concat.strategy, concat.per_segment),
            ("range select", true),
            "{}",
            graph.name
        );
        let mut program = lower::lower(&out.dag, &out.partition).unwrap();
        assert!(program.kernels[0].is_row_kernel(), "{}", graph.name);
        assert_eq!(split_kernels(&program), 1, "{}", graph.name);
        for (seed, specials) in [(41, false), (42, true)] {
            agrees(&graph, seed, specials, true)
                .unwrap_or_else(|e| panic!("{} (specials {specials}): {e}", graph.name));
        }
        // The clamped form: a launch whose first range ends a row early, leaving a gap row
        // (there the select's value is unspecified), runs the clamped row kernel, which
        // agrees with the interpreter on every other row.
        let axis = lower::split::split(&program.kernels[0]).unwrap().axis;
        let lower::Step::Kernel(step) = &mut program.steps[0] else {
            panic!("{}: a generated kernel", graph.name);
        };
        step.launch.ranges[0].1 -= 1;
        let gap = step.launch.ranges[0].1 as usize;
        program.check_bounds().unwrap();
        let inputs = random_graph::inputs(&graph, 43, true);
        let buffers = random_graph::input_buffers(&program, &inputs);
        let want = interpret::run_program(&program, &buffers).unwrap();
        let mut executable =
            fusebox::backend::cpu::runtime::CpuExecutable::new(program.clone(), compiler())
                .unwrap();
        let mut got = executable.output_buffers();
        executable.run_into(&buffers, &mut got).unwrap();
        for ((o, w), g) in program.dag.outputs.iter().zip(&want).zip(&got) {
            let [w, g] = [w, g].map(|b| outside_row(&b.to_tensor(), axis, gap));
            assert_same(&format!("{} {} (clamped)", graph.name, o.name), &w, &g).unwrap();
        }
    }
}

/// `t` with its elements at index `row` of `axis` set to 0.
fn outside_row(t: &Tensor, axis: usize, row: usize) -> Tensor {
    let shape = t.shape().to_vec();
    let inner: usize = shape[axis + 1..].iter().product();
    let values: Vec<f64> = t
        .values()
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            if (i / inner) % shape[axis] == row {
                0.0
            } else {
                v
            }
        })
        .collect();
    Tensor::from_values(t.dtype, &shape, values).unwrap()
}

/// Each graph of [`concat_graphs::row_kernels_of_row_concats`] is one row kernel that reads its concat by
/// ranges along its rows (`KernelIr::selects_along_rows`): it does not cut into pieces, the
/// report says every operand is evaluated at every point, and it equals the reference in
/// the interpreter and compiled, with and without NaN/Inf. The f32-only graphs take the C
/// vector loops, which load each operand's lanes under its range mask, and give a vector
/// lying inside one segment a step that reads only that segment's operand.
#[test]
fn row_kernels_read_concats_along_their_rows() {
    for graph in concat_graphs::row_kernels_of_row_concats() {
        let out = optimize(&graph, rules(), &Options::default()).unwrap();
        assert_eq!(out.partition.kernels.len(), 1, "{}: one kernel", graph.name);
        let concat = &out.report.kernels[0].concats[0];
        assert_eq!(
            (concat.strategy, concat.per_segment),
            ("range select", false),
            "{}",
            graph.name
        );
        let program = lowered(&graph);
        let ir = &program.kernels[0];
        assert!(ir.selects_along_rows(), "{}", graph.name);
        assert!(lower::split::split(ir).is_none(), "{}", graph.name);
        let c = fusebox::backend::cpu::emit::emit_module(&[("fb_k".to_string(), ir)]);
        let masked = c.contains("fbv_range_lanes(j, rs");
        assert_eq!(
            masked,
            !graph.name.contains("half"),
            "{}: vector loops read under range masks",
            graph.name
        );
        // A vector inside one segment takes that segment's step: the select is its operand.
        assert_eq!(
            c.contains("if (j >= rs") && c.contains("j + 16 <= re"),
            masked,
            "{}: per-segment vector steps",
            graph.name
        );
        for (seed, specials) in [(44, false), (45, true), (46, true)] {
            agrees(&graph, seed, specials, true)
                .unwrap_or_else(|e| panic!("{} (specials {specials}): {e}", graph.name));
        }
    }
}

/// A row kernel's nodes are priced by the passes over a row that evaluate them
/// (`Facts::row_evaluations`): in `softmax(x + bias)` the add runs in the maximum's pass and
/// again in the sum's, so the one row kernel's flops are one kernel per op's plus the add's
/// once more, while softmax's `exp`, kept from the sum's pass for the last, counts once. In
/// `layernorm(x + bias)` the add runs in all three passes and the centring in the last two,
/// while the row constants (`rsqrt(var + eps)`) count once per row.
/// A value that calls is kept from the first pass computing it for every later one, so
/// `softmax(erf(x))` and `layernorm(gelu(x))` are one kernel each, priced at one kernel per
/// op's flops, and agree with the reference.
#[test]
fn row_kernels_price_each_node_by_the_passes_that_evaluate_it() {
    let unfused = Options {
        fusion: false,
        ..Options::default()
    };
    let per_op = |graph: &Graph| -> HashMap<String, u64> {
        kernel_flops(graph, &unfused)
            .into_iter()
            .map(|(names, flops)| (names[0].clone(), flops))
            .collect()
    };

    let mut b = GraphBuilder::new("softmax_of_biased");
    let x = b.input("x", DType::F32, &[64, 256]);
    let bias = b.input("bias", DType::F32, &[256]);
    let xb = b.op("xb", "add", &[&x, &bias]);
    let y = common::row_graphs::softmax_of(&mut b, &xb);
    let graph = b.finish(&[&y]);
    let ops = per_op(&graph);
    let fused = kernel_flops(&graph, &Options::default());
    assert_eq!(fused.len(), 1, "{fused:?}");
    let once: u64 = ops.values().sum();
    assert_eq!(fused[0].1, once + ops["xb"], "{fused:?} against {ops:?}");

    let mut b = GraphBuilder::new("layernorm_of_biased");
    let x = b.input("x", DType::F32, &[64, 256]);
    let bias = b.input("bias", DType::F32, &[256]);
    let xb = b.op("xb", "add", &[&x, &bias]);
    let y = common::row_graphs::layernorm_of(&mut b, &xb, DType::F32, None);
    let graph = b.finish(&[&y]);
    let ops = per_op(&graph);
    let fused = kernel_flops(&graph, &Options::default());
    assert_eq!(fused.len(), 1, "{fused:?}");
    let once: u64 = ops.values().sum();
    // The row constants `var + eps` and its `rsqrt` count once per row, as unfused.
    assert_eq!(
        fused[0].1,
        once + 2 * ops["xb"] + ops["c"],
        "{fused:?} against {ops:?}"
    );

    let softmax_of_erf = parse(
        r#"Graph(name: "softmax_of_erf",
          inputs: [Input(name: "x", dtype: "f32", shape: [4096, 1024])],
          nodes: [
            Node(name: "ex", op: "erf", args: ["x"]),
            Node(name: "s", op: "softmax", args: ["ex"], attrs: {"axis": -1}),
          ],
          outputs: ["s"])"#,
    );
    let layernorm_of_gelu = common::row_graphs::layernorm_of_gelu(DType::F32, &[4096, 1024]);
    for (seed, graph) in [(46, softmax_of_erf), (47, layernorm_of_gelu)] {
        let ops = per_op(&graph);
        let fused = kernel_flops(&graph, &Options::default());
        assert_eq!(fused.len(), 1, "{}: {fused:?}", graph.name);
        let once: u64 = ops.values().sum();
        assert!(
            fused[0].1.abs_diff(once) <= 2,
            "{}: {fused:?} against {ops:?}",
            graph.name
        );
        let small = graph::file::to_ron(&graph).replace("4096, 1024", "6, 40");
        let small = small.replace("[1024]", "[40]");
        agrees(&parse(&small), seed, true, true).unwrap();
    }
}
