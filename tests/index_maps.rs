//! Reshapes that no strides express, read inside the kernel that consumes them: as strides
//! over a refined loop domain where the domain's axes can be split to follow the reshape, and
//! as index maps (floor division and remainder) where they cannot. Each graph below fuses into
//! one kernel, and the compiled C, the kernel-IR interpreter and the reference evaluator agree
//! with values computed here by hand from the inputs' indices.

use crate::common;

use common::random_graph::{self, Step as RStep, assert_same, rules};
use fusebox::backend::Executable;
use fusebox::backend::cpu::compiler::{Compiler, CompilerConfig};
use fusebox::dtype::DType;
use fusebox::graph::{self, Graph};
use fusebox::lower::{self, Program, Step};
use fusebox::optimize::{Options, optimize};
use fusebox::runner::prepare;
use fusebox::runtime::buffer::Buffer;
use fusebox::runtime::interpret;
use fusebox::tensor::Tensor;
use proptest::prelude::*;
use std::collections::HashMap;

use common::kernel_cache::compiler;

fn parse(text: &str) -> Graph {
    graph::file::parse(text, "test.ron", &rules().ops)
        .expect("graph parses")
        .0
}

/// `x[i] = i` (as `dtype`) over `shape`: every element names its own index, so a misread
/// element shows as a wrong value.
fn iota(dtype: DType, shape: &[usize]) -> Tensor {
    let n = fusebox::shape::numel(shape);
    if !dtype.is_float() {
        Tensor::from_ints(dtype, shape, (0..n as i64).collect()).unwrap()
    } else {
        Tensor::from_values(dtype, shape, (0..n).map(|i| i as f64).collect()).unwrap()
    }
}

/// How many stages each mapped load of `program` has, over all its kernels.
fn mapped_loads(program: &Program) -> Vec<usize> {
    program
        .kernels
        .iter()
        .flat_map(|k| k.loads.iter().filter(|v| v.is_mapped()))
        .map(|v| v.stages.len())
        .collect()
}

/// Optimizes and lowers `graph`, checks it is `kernels` kernel launches with mapped loads of
/// `stages` stages (what is left of the index maps once the domain is refined), and runs it three ways on `inputs`: compiled C, the interpreter and the
/// reference evaluator. Each output must equal `want` (computed by the caller from indices)
/// exactly for the interpreter and the reference, and within the dtype's tolerance for C.
fn check(
    graph: &Graph,
    inputs: &[(&str, Tensor)],
    kernels: usize,
    stages: &[usize],
    want: &[(&str, Vec<f64>)],
) {
    let rules = rules();
    let options = Options::default();
    let out = optimize(graph, rules, &options).expect("optimize");
    let program = lower::lower(&out.dag, &out.partition).expect("lower");
    program.check_bounds().expect("bounds proved");
    let launches = program
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Kernel(_)))
        .count();
    assert_eq!(
        launches,
        kernels,
        "kernel launches of {}: {:?}",
        graph.name,
        out.partition
            .kernels
            .iter()
            .map(|k| k
                .nodes
                .iter()
                .map(|&n| out.dag.nodes[n].name.clone())
                .collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        mapped_loads(&program),
        stages,
        "mapped loads of {}",
        graph.name
    );

    let tensors: HashMap<String, Tensor> = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    let reference = fusebox::eval::evaluate(graph, &rules.ops, &tensors).expect("reference");
    let buffers: Vec<Buffer> = program
        .dag
        .inputs
        .iter()
        .map(|i| Buffer::from_tensor(&tensors[&i.name]))
        .collect();
    let interpreted = interpret::run_program(&program, &buffers).expect("interpreter");
    let mut prepared = prepare(graph, rules, &options, compiler()).expect("compile");
    let compiled = prepared.executable.run_tensors(&tensors).expect("run");
    for (name, values) in want {
        let reference = &reference[*name];
        assert_eq!(&reference.values(), values, "reference value of {name}");
        let at = program
            .dag
            .outputs
            .iter()
            .position(|o| o.name == *name)
            .unwrap();
        let got = interpreted[at].to_tensor();
        assert_eq!(&got.values(), values, "interpreted value of {name}");
        assert_same(name, reference, &compiled[*name]).unwrap();
        assert_eq!(compiled[*name].shape(), reference.shape());
    }
}

/// `neg(reshape(transpose(x), [-1]))` for x `[3, 5]`: element k of the flat transpose is
/// `x[k % 3][k / 3]`, which no strides over the 1-D domain can say; the domain splits into
/// `[5, 3]`, over which it is strides `[1, 5]`, so the one kernel has no index map left.
#[test]
fn a_flattened_transpose_splits_the_domain_into_strides() {
    let graph = parse(
        r#"Graph(name: "flat_t",
        inputs: [Input(name: "x", dtype: "f32", shape: [3, 5])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [-1]}),
                Node(name: "y", op: "neg", args: ["r"])],
        outputs: ["y"])"#,
    );
    let want: Vec<f64> = (0..15).map(|k| -(((k % 3) * 5 + k / 3) as f64)).collect();
    check(
        &graph,
        &[("x", iota(DType::F32, &[3, 5]))],
        1,
        &[],
        &[("y", want)],
    );
    let out = optimize(&graph, rules(), &Options::default()).unwrap();
    let program = lower::lower(&out.dag, &out.partition).unwrap();
    assert_eq!(program.kernels[0].rank, 2, "the 1-D domain is split in two");
    let Step::Kernel(k) = &program.steps[0] else {
        panic!("a kernel step")
    };
    assert_eq!(k.launch.sizes, [5, 3]);
    assert_eq!(k.launch.strides[0], [1, 5], "x read down its columns");
}

/// x `[4, 6]` transposed and read back as `[4, 6]`: the stage `[6, 4]` and the domain `[4, 6]`
/// have no common refinement (4 does not divide 6), so the load keeps its index map.
#[test]
fn a_transpose_read_in_a_shape_no_split_follows_keeps_its_map() {
    let graph = parse(
        r#"Graph(name: "kept",
        inputs: [Input(name: "x", dtype: "f32", shape: [4, 6])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [4, 6]}),
                Node(name: "y", op: "neg", args: ["r"])],
        outputs: ["y"])"#,
    );
    // Flat k of r is flat k of t, t[k / 4][k % 4] = x[k % 4][k / 4].
    let want: Vec<f64> = (0..24).map(|k| -(((k % 4) * 6 + k / 4) as f64)).collect();
    check(
        &graph,
        &[("x", iota(DType::F32, &[4, 6]))],
        1,
        &[1],
        &[("y", want)],
    );
}

/// Columns 2, 4, 6 of x `[4, 7]` (a slice with step 2 and a negative start) merged with the
/// rows and split again as `[2, 6]`, plus a broadcast row: element `(a, c)` is flat position
/// `p = 6a + c` of the slice, `x[p / 3][2 + 2 (p % 3)]`. (Over `[4, 6]` the same columns
/// 1, 3, 5 would be evenly spaced across rows, a strided view.) The domain's inner axis splits
/// as `[2, 3]`, after which the slice is strides again.
#[test]
fn a_reshaped_stepped_slice_with_a_negative_start() {
    let graph = parse(
        r#"Graph(name: "slice_r",
        inputs: [Input(name: "x", dtype: "f32", shape: [4, 7]),
                 Input(name: "b", dtype: "f32", shape: [6])],
        nodes: [Node(name: "s", op: "slice", args: ["x"],
                     attrs: {"axis": -1, "start": -5, "step": 2}),
                Node(name: "r", op: "reshape", args: ["s"], attrs: {"shape": [2, 6]}),
                Node(name: "y", op: "add", args: ["r", "b"])],
        outputs: ["y"])"#,
    );
    let b: Vec<f64> = (0..6).map(|i| 100.0 * i as f64).collect();
    let want: Vec<f64> = (0..12)
        .map(|p| ((p / 3) * 7 + 2 + 2 * (p % 3)) as f64 + b[p % 6])
        .collect();
    check(
        &graph,
        &[
            ("x", iota(DType::F32, &[4, 7])),
            (
                "b",
                Tensor::from_values(DType::F32, &[6], b.clone()).unwrap(),
            ),
        ],
        1,
        &[],
        &[("y", want)],
    );
}

/// A flattened transpose broadcast by the kernel's domain, as a column against `z [12, 2]`
/// and as a row against `w [2, 12]`: the load is broadcast along the inner axis in one graph
/// and along the outer axis in the other, and the axis it moves along splits as `[4, 3]`.
#[test]
fn a_mapped_load_broadcast_along_either_axis() {
    let flat = |k: usize| ((k % 3) * 4 + k / 3) as f64;
    let z: Vec<f64> = (0..24).map(|i| (i % 2 + 1) as f64).collect();
    for (target, other, want) in [
        (
            "[12, 1]",
            "[12, 2]",
            (0..24).map(|i| flat(i / 2) * z[i]).collect::<Vec<f64>>(),
        ),
        (
            "[1, 12]",
            "[2, 12]",
            (0..24).map(|i| flat(i % 12) * z[i]).collect(),
        ),
    ] {
        let graph = parse(&format!(
            r#"Graph(name: "bcast",
            inputs: [Input(name: "x", dtype: "f32", shape: [3, 4]),
                     Input(name: "z", dtype: "f32", shape: {other})],
            nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                    Node(name: "r", op: "reshape", args: ["t"], attrs: {{"shape": {target}}}),
                    Node(name: "y", op: "mul", args: ["r", "z"])],
            outputs: ["y"])"#
        ));
        let shape: Vec<usize> = if other == "[12, 2]" {
            vec![12, 2]
        } else {
            vec![2, 12]
        };
        check(
            &graph,
            &[
                ("x", iota(DType::F32, &[3, 4])),
                (
                    "z",
                    Tensor::from_values(DType::F32, &shape, z.clone()).unwrap(),
                ),
            ],
            1,
            &[],
            &[("y", want)],
        );
    }
}

/// Two reshape boundaries: x `[4, 6]` transposed, split as `[3, 8]`, transposed again and
/// read as `target`. Each boundary is a stage; element k is computed here by following the
/// same steps on indices. Flattened, the domain splits to follow both stages (`[24]` becomes
/// `[2, 4, 3]`) and no map is left; read as `[3, 8]`, the first stage (`[8, 3]`) has no
/// common refinement with the domain and both stages stay.
#[test]
fn two_reshape_boundaries_make_two_stages() {
    for (target, stages) in [("[-1]", vec![]), ("[3, 8]", vec![2])] {
        let graph = parse(&format!(
            r#"Graph(name: "two",
            inputs: [Input(name: "x", dtype: "i64", shape: [4, 6])],
            nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                    Node(name: "a", op: "reshape", args: ["t"], attrs: {{"shape": [3, 8]}}),
                    Node(name: "u", op: "transpose", args: ["a"]),
                    Node(name: "f", op: "reshape", args: ["u"], attrs: {{"shape": {target}}}),
                    Node(name: "y", op: "mul", args: ["f", "f"])],
            outputs: ["y"])"#
        ));
        // f's flat k: u is [8, 3], u[i][j] = a[j][i]; a's flat position 8j + i is t's,
        // t[p / 4][p % 4] = x[p % 4][p / 4].
        let want: Vec<f64> = (0..24usize)
            .map(|k| {
                let (i, j) = (k / 3, k % 3);
                let p = 8 * j + i;
                let x = ((p % 4) * 6 + p / 4) as f64;
                x * x
            })
            .collect();
        check(
            &graph,
            &[("x", iota(DType::I64, &[4, 6]))],
            1,
            &stages,
            &[("y", want)],
        );
    }
}

/// f16 values through a map: x `[5, 7]` f16 transposed and read back as `[5, 7]`, times 0.5
/// (exact in f16 for these integers).
#[test]
fn an_f16_transpose_read_in_another_shape() {
    let graph = parse(
        r#"Graph(name: "half",
        inputs: [Input(name: "x", dtype: "f16", shape: [5, 7])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [5, 7]}),
                Node(name: "h", op: "const", attrs: {"value": 0.5, "dtype": "f16"}),
                Node(name: "y", op: "mul", args: ["r", "h"])],
        outputs: ["y"])"#,
    );
    let want: Vec<f64> = (0..35)
        .map(|k| ((k % 5) * 7 + k / 5) as f64 * 0.5)
        .collect();
    check(
        &graph,
        &[("x", iota(DType::F16, &[5, 7]))],
        1,
        &[1],
        &[("y", want)],
    );
}

/// Size-1 axes carry no layout and size-0 ones no elements: x `[3, 1, 4]` reversed and
/// flattened splits the domain (the 1 plays no part); x `[4, 1, 6]` reversed and read as
/// `[4, 6]` needs one stage of rank 2 (the 1 dropped); an empty x `[0, 4]` gives an empty
/// result with nothing read.
#[test]
fn size_one_and_size_zero_dims() {
    let graph = parse(
        r#"Graph(name: "ones",
        inputs: [Input(name: "x", dtype: "f32", shape: [3, 1, 4])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [-1]}),
                Node(name: "y", op: "abs", args: ["r"])],
        outputs: ["y"])"#,
    );
    // t is [4, 1, 3], t[i][0][j] = x[j][0][i]; flat k = 3i + j.
    let want: Vec<f64> = (0..12).map(|k| ((k % 3) * 4 + k / 3) as f64).collect();
    check(
        &graph,
        &[("x", iota(DType::F32, &[3, 1, 4]))],
        1,
        &[],
        &[("y", want)],
    );
    let graph = parse(
        r#"Graph(name: "ones",
        inputs: [Input(name: "x", dtype: "f32", shape: [4, 1, 6])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [4, 6]}),
                Node(name: "y", op: "abs", args: ["r"])],
        outputs: ["y"])"#,
    );
    // t is [6, 1, 4], t[i][0][j] = x[j][0][i]; flat k = 4i + j.
    let want: Vec<f64> = (0..24).map(|k| ((k % 4) * 6 + k / 4) as f64).collect();
    check(
        &graph,
        &[("x", iota(DType::F32, &[4, 1, 6]))],
        1,
        &[1],
        &[("y", want)],
    );
    let program = {
        let out = optimize(&graph, rules(), &Options::default()).unwrap();
        lower::lower(&out.dag, &out.partition).unwrap()
    };
    let stage_ranks: Vec<usize> = program
        .kernels
        .iter()
        .flat_map(|k| k.loads.iter().flat_map(|v| v.stages.clone()))
        .collect();
    assert_eq!(stage_ranks, [2], "the size-1 axis is no part of the stage");

    let empty = parse(
        r#"Graph(name: "empty",
        inputs: [Input(name: "x", dtype: "f32", shape: [0, 4])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [2, 0]}),
                Node(name: "y", op: "neg", args: ["r"])],
        outputs: ["y"])"#,
    );
    let out = optimize(&empty, rules(), &Options::default()).unwrap();
    let program = lower::lower(&out.dag, &out.partition).unwrap();
    program.check_bounds().unwrap();
    let mut prepared = prepare(&empty, rules(), &Options::default(), compiler()).unwrap();
    let x = iota(DType::F32, &[0, 4]);
    let got = prepared
        .executable
        .run_tensors(&HashMap::from([("x".to_string(), x)]))
        .unwrap();
    assert_eq!(got["y"].shape(), [2, 0]);
}

/// The launch of a mapped load is checked like any other: a stage larger than the buffer
/// behind it, or stages the kernel does not expect, are errors before anything runs.
#[test]
fn check_bounds_proves_index_maps_in_range() {
    let graph = parse(
        r#"Graph(name: "kept",
        inputs: [Input(name: "x", dtype: "f32", shape: [4, 6])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [4, 6]}),
                Node(name: "y", op: "neg", args: ["r"])],
        outputs: ["y"])"#,
    );
    let out = optimize(&graph, rules(), &Options::default()).unwrap();
    let program = lower::lower(&out.dag, &out.partition).unwrap();
    program.check_bounds().unwrap();
    let tamper = |f: &dyn Fn(&mut lower::ir::Launch)| {
        let mut p = program.clone();
        for step in &mut p.steps {
            if let Step::Kernel(k) = step {
                f(&mut k.launch);
            }
        }
        p.check_bounds()
    };
    // The stage reads one column too far.
    let err = tamper(&|l| l.maps[0][0].strides[0] = 2).unwrap_err();
    assert!(err.to_string().contains("reaches element"), "{err}");
    // The stage holds fewer positions than the domain reaches.
    let err = tamper(&|l| l.maps[0][0].sizes[0] = 4).unwrap_err();
    assert!(
        err.to_string().contains("index map reaches position"),
        "{err}"
    );
    // A size of 0 or less holds no position at all.
    assert!(tamper(&|l| l.maps[0][0].sizes[1] = -3).is_err());
    // A launch without the stages its kernel reads.
    let err = tamper(&|l| l.maps[0].clear()).unwrap_err();
    assert!(err.to_string().contains("index-map stages"), "{err}");
}

/// `neg(reshape(transpose(x), target))` for x `[n, m]`.
fn transposed_reshape(n: usize, m: usize, target: &str) -> Graph {
    parse(&format!(
        r#"Graph(name: "flat_t",
        inputs: [Input(name: "x", dtype: "f32", shape: [{n}, {m}])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "r", op: "reshape", args: ["t"], attrs: {{"shape": {target}}}),
                Node(name: "y", op: "neg", args: ["r"])],
        outputs: ["y"])"#
    ))
}

/// Kernels stay size-free: the same graph at another size lowers to equal kernel IR (the
/// refined domain's sizes and the stages' shapes are launch arguments), so it compiles nothing
/// new, whether the domain splits (flattened) or the map stays (read as `[n, m]` where `m`
/// is no multiple of `n`).
#[test]
fn index_map_kernels_do_not_depend_on_sizes() {
    let at = |n: usize, m: usize, target: &str| {
        let graph = transposed_reshape(n, m, target);
        let out = optimize(&graph, rules(), &Options::default()).unwrap();
        lower::lower(&out.dag, &out.partition).unwrap().kernels
    };
    assert_eq!(at(3, 5, "[-1]"), at(64, 7, "[-1]"));
    assert_eq!(at(4, 6, "[4, 6]"), at(6, 10, "[6, 10]"));
    assert!(at(4, 6, "[4, 6]")[0].loads[0].is_mapped());
    assert!(!at(3, 5, "[-1]")[0].loads[0].is_mapped());
}

/// A refined kernel is compiled once: a flattened transpose at a second batch size splits its
/// domain the same way (the split's sizes are launch words), so preparing it compiles nothing
/// and it still computes the right values.
#[test]
fn a_refined_kernel_at_a_new_batch_size_compiles_nothing() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("refined-size-free-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let compiler = Compiler::new(CompilerConfig::from_env().with_cache_dir(dir));
    let rules = rules();
    let options = Options::default();
    prepare(
        &transposed_reshape(8, 6, "[-1]"),
        rules,
        &options,
        &compiler,
    )
    .expect("compile");
    let before = compiler.stats();
    let graph = transposed_reshape(24, 6, "[-1]");
    let mut prepared = prepare(&graph, rules, &options, &compiler).expect("compile");
    assert_eq!(
        compiler.stats().since(&before).compiled,
        0,
        "nothing compiled"
    );
    let x = iota(DType::F32, &[24, 6]);
    let got = prepared
        .executable
        .run_tensors(&HashMap::from([("x".to_string(), x)]))
        .unwrap();
    let want: Vec<f64> = (0..144)
        .map(|k| -(((k % 24) * 6 + k / 24) as f64))
        .collect();
    assert_eq!(got["y"].values(), want);
}

/// A recipe for [`random_graph::build`]: dims, input specs and steps.
type Recipe = ((usize, usize), Vec<(usize, usize)>, Vec<RStep>);

/// Reshapes of transposed, sliced and doubly transposed views among pointwise ops, at shapes
/// where some domains split to follow them and some do not (`4 × 6` read as `6 × 4`).
fn reshape_recipe() -> impl Strategy<Value = Recipe> {
    let dims = prop_oneof![
        Just((3usize, 4usize)),
        Just((4, 6)),
        Just((6, 4)),
        Just((5, 7)),
        Just((4, 8)),
        Just((2, 1)),
        Just((1, 5)),
        Just((0, 3)),
    ];
    let step = prop_oneof![
        2 => random_graph::step(false),
        1 => random_graph::transposed_reshapes(),
        1 => random_graph::strided_reshapes(),
    ];
    (
        dims,
        prop::collection::vec((0usize..4, 0usize..6), 1..3),
        prop::collection::vec(step, 2..8),
    )
}

/// Whether `program` has a kernel whose loop domain was refined (more axes than its
/// partition kernel's domain) and one whose load kept an index map.
fn refined_and_kept(program: &Program, out: &fusebox::optimize::Optimized) -> (bool, bool) {
    let refined = program.steps.iter().any(|s| match s {
        Step::Kernel(k) => out
            .partition
            .kernels
            .get(k.group)
            .is_some_and(|p| k.launch.sizes.len() > p.domain.len().max(1)),
        _ => false,
    });
    (refined, !mapped_loads(program).is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: random_graph::cases(400),
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// Random graphs of reshaped views, refined or not, agree with the reference evaluator
    /// when the interpreter runs their lowered program, and every launch is proved in bounds.
    #[test]
    fn refined_and_mapped_reshapes_agree_with_the_reference(
        (dims, inputs, steps) in reshape_recipe(),
        seed in 0u64..1000,
    ) {
        let catalogue = &rules().ops;
        let graph = random_graph::build(catalogue, dims, &inputs, &steps);
        prop_assume!(graph.is_some());
        let graph = graph.unwrap();
        let out = optimize(&graph, rules(), &Options::default()).expect("optimize");
        let program = lower::lower(&out.dag, &out.partition).expect("lower");
        program.check_bounds().expect("bounds proved");
        let tensors = random_graph::inputs(&graph, seed, false);
        let want = fusebox::eval::evaluate(&graph, catalogue, &tensors).expect("reference");
        let buffers = random_graph::input_buffers(&program, &tensors);
        let got = interpret::run_program(&program, &buffers).expect("interpreter");
        for (o, b) in program.dag.outputs.iter().zip(&got) {
            assert_same(&o.name, &want[&o.name], &b.to_tensor())
                .map_err(|e| TestCaseError::fail(format!("{e}\n{}", graph::file::to_ron(&graph))))?;
        }
    }
}

/// The recipe above draws both kinds of kernel in fair numbers: domains refined to follow a
/// reshape, and loads that keep an index map (27 and 8 of 300 with this seed).
#[test]
fn reshape_recipes_draw_refined_and_kept_maps() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let catalogue = &rules().ops;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[3; 32]),
    );
    let strategy = reshape_recipe();
    let (mut refined, mut kept) = (0, 0);
    for _ in 0..300 {
        let (dims, inputs, steps) = strategy.new_tree(&mut runner).unwrap().current();
        let Some(graph) = random_graph::build(catalogue, dims, &inputs, &steps) else {
            continue;
        };
        let out = optimize(&graph, rules(), &Options::default()).expect("optimize");
        let program = lower::lower(&out.dag, &out.partition).expect("lower");
        let (r, k) = refined_and_kept(&program, &out);
        refined += r as usize;
        kept += k as usize;
    }
    assert!(
        refined >= 15 && kept >= 5,
        "refined {refined}, kept {kept} of 300"
    );
}
