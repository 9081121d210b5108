//! Gathers and scatters with run-time indices (`gather`, `gather_elements`, `scatter_add`):
//! the reference evaluator's values, worked by hand, and the compiled gather and scatter
//! kernels (the kernel-IR interpreter and the CPU backend) against it on random geometry,
//! dtypes and indices in range, negative, repeated and out of range.

use crate::common;

use common::gather_graphs::{self, GatherRecipe, Reader};
use common::random_graph::{assert_same, rules};
use fusebox::backend::Executable;
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::graph::{self, Graph};
use fusebox::lower;
use fusebox::optimize::{Options, optimize};
use fusebox::runner::prepare;
use fusebox::runtime::interpret;
use fusebox::tensor::Tensor;
use proptest::prelude::*;

use common::kernel_cache::compiler;

fn parse(text: &str) -> Graph {
    graph::file::parse(text, "gather.ron", &rules().ops)
        .unwrap()
        .0
}

fn tensor(dtype: DType, shape: &[usize], values: &[f64]) -> Tensor {
    Tensor::from_values(dtype, shape, values.to_vec()).unwrap()
}

fn evaluate(graph: &Graph, inputs: &[(&str, Tensor)]) -> Tensors {
    let inputs: Tensors = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    fusebox::eval::evaluate(graph, &rules().ops, &inputs).unwrap()
}

/// An embedding table of 3 rows read at ids 2, 0, -1 (the last row), 3 and -4 (out of range:
/// NaN rows), and along axis 1 at a scalar index; gather_elements picks one per row.
#[test]
fn gathers_read_by_index_with_negative_and_out_of_range_indices() {
    let graph = parse(
        r#"Graph(
        name: "gathers",
        inputs: [
            Input(name: "table", dtype: "f32", shape: [3, 2]),
            Input(name: "ids", dtype: "i64", shape: [5]),
            Input(name: "col", dtype: "i32", shape: []),
            Input(name: "pick", dtype: "i64", shape: [3, 1]),
        ],
        nodes: [
            Node(name: "rows", op: "gather", args: ["table", "ids"]),
            Node(name: "column", op: "gather", args: ["table", "col"], attrs: {"axis": -1}),
            Node(name: "picked", op: "gather_elements", args: ["table", "pick"], attrs: {"axis": 1}),
        ],
        outputs: ["rows", "column", "picked"],
    )"#,
    );
    let table = tensor(DType::F32, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let out = evaluate(
        &graph,
        &[
            ("table", table),
            (
                "ids",
                tensor(DType::I64, &[5], &[2.0, 0.0, -1.0, 3.0, -4.0]),
            ),
            ("col", tensor(DType::I32, &[], &[-1.0])),
            ("pick", tensor(DType::I64, &[3, 1], &[1.0, -2.0, 2.0])),
        ],
    );
    let nan = f64::NAN;
    let rows = [5.0, 6.0, 1.0, 2.0, 5.0, 6.0, nan, nan, nan, nan];
    let same = |got: &Tensor, want: &[f64]| {
        got.values().len() == want.len()
            && got
                .values()
                .iter()
                .zip(want)
                .all(|(g, w)| g == w || (g.is_nan() && w.is_nan()))
    };
    assert_eq!(out["rows"].shape(), &[5, 2]);
    assert!(same(&out["rows"], &rows), "{:?}", out["rows"].values());
    assert_eq!(out["column"].shape(), &[3]);
    assert!(same(&out["column"], &[2.0, 4.0, 6.0]));
    assert_eq!(out["picked"].shape(), &[3, 1]);
    assert!(same(&out["picked"], &[2.0, 3.0, nan]));
}

/// Out of range, an integer gather reads 0 and a bool one false; i64 data keeps every bit.
#[test]
fn integer_and_bool_gathers_fill_with_zero() {
    let text = |dtype: &str| {
        format!(
            r#"Graph(name: "g", inputs: [Input(name: "data", dtype: "{dtype}", shape: [2]),
                Input(name: "ids", dtype: "i32", shape: [3])],
            nodes: [Node(name: "y", op: "gather", args: ["data", "ids"])], outputs: ["y"])"#
        )
    };
    let ids = tensor(DType::I32, &[3], &[1.0, 2.0, -2.0]);
    let big = Tensor::from_ints(DType::I64, &[2], vec![7, i64::MAX]).unwrap();
    let out = evaluate(&parse(&text("i64")), &[("data", big), ("ids", ids.clone())]);
    assert_eq!(out["y"].ints().as_slice().unwrap(), &[i64::MAX, 0, 7]);
    let flags = tensor(DType::Bool, &[2], &[0.0, 1.0]);
    let out = evaluate(&parse(&text("bool")), &[("data", flags), ("ids", ids)]);
    assert_eq!(out["y"].values(), vec![1.0, 0.0, 0.0]);
}

/// scatter_add by hand: updates added in order where their indices put them (negative ones
/// from the end, repeated ones adding up, out-of-range ones dropped); f16 rounds after every
/// addition, so the order shows (2048 + 1 + 1 is 2048 in f16, one addition at a time), and
/// i32 wraps.
#[test]
fn scatter_add_adds_in_order_and_drops_indices_out_of_range() {
    let text = |dtype: &str, axis: i64| {
        format!(
            r#"Graph(name: "s", inputs: [Input(name: "data", dtype: "{dtype}", shape: [3, 2]),
                Input(name: "ids", dtype: "i64", shape: [4, 2]),
                Input(name: "upd", dtype: "{dtype}", shape: [4, 2])],
            nodes: [Node(name: "y", op: "scatter_add", args: ["data", "ids", "upd"],
                attrs: {{"axis": {axis}}})], outputs: ["y"])"#
        )
    };
    let ids = tensor(
        DType::I64,
        &[4, 2],
        &[0.0, 2.0, -1.0, 2.0, 5.0, -3.0, 0.0, -4.0],
    );
    let data = tensor(DType::F32, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let upd = tensor(
        DType::F32,
        &[4, 2],
        &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0],
    );
    let out = evaluate(
        &parse(&text("f32", 0)),
        &[("data", data), ("ids", ids.clone()), ("upd", upd)],
    );
    // Column 0: ids 0, -1 (row 2), 5 (dropped), 0. Column 1: ids 2, 2, -3 (row 0), -4 (dropped).
    assert_eq!(out["y"].values(), vec![81.0, 62.0, 3.0, 4.0, 35.0, 66.0]);
    let half = tensor(DType::F16, &[3, 2], &[2048.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let ones = tensor(DType::F16, &[4, 2], &[1.0; 8]);
    let out = evaluate(
        &parse(&text("f16", 0)),
        &[("data", half), ("ids", ids.clone()), ("upd", ones)],
    );
    assert_eq!(out["y"].values(), vec![2048.0, 1.0, 0.0, 0.0, 1.0, 2.0]);
    let big = Tensor::from_ints(DType::I32, &[3, 2], vec![i32::MAX as i64, 0, 0, 0, 0, 0]).unwrap();
    let one = Tensor::from_ints(DType::I32, &[4, 2], vec![1; 8]).unwrap();
    let out = evaluate(
        &parse(&text("i32", 0)),
        &[("data", big), ("ids", ids), ("upd", one)],
    );
    assert_eq!(
        out["y"].ints().as_slice().unwrap(),
        &[i32::MIN as i64 + 1, 1, 0, 0, 1, 2]
    );
}

/// A scatter's updates must have its data's dtype and rank and fit it off the axis, and its
/// indices the updates' shape (or size 1 on an axis): refused at the node.
#[test]
fn misshapen_or_mistyped_scatters_are_refused_at_the_node() {
    let text = |upd: &str, shape: &str| {
        format!(
            r#"Graph(name: "s", inputs: [Input(name: "data", dtype: "f32", shape: [3, 2]),
                Input(name: "ids", dtype: "i64", shape: [4, 2]),
                Input(name: "upd", dtype: "{upd}", shape: {shape})],
            nodes: [Node(name: "y", op: "scatter_add", args: ["data", "ids", "upd"])],
            outputs: ["y"])"#
        )
    };
    for (upd, shape, says) in [
        ("f16", "[4, 2]", "must have the dtype of `data`"),
        ("f32", "[4, 3]", "no larger size on any axis but 0"),
        ("f32", "[4, 1]", "indices [4, 2] their shape or size 1"),
        ("f32", "[4]", "must have the rank of data"),
    ] {
        let err = graph::file::parse(&text(upd, shape), "s.ron", &rules().ops).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(says), "{message}");
        assert!(message.contains("s.ron:"), "{message}");
    }
}

/// Float indices are refused where the graph is checked, at the node.
#[test]
fn float_indices_are_refused() {
    let text = r#"Graph(name: "g", inputs: [Input(name: "data", dtype: "f32", shape: [2]),
            Input(name: "ids", dtype: "f32", shape: [3])],
        nodes: [Node(name: "y", op: "gather", args: ["data", "ids"])], outputs: ["y"])"#;
    let err = graph::file::parse(text, "g.ron", &rules().ops).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("indices") && message.contains("Integer"),
        "{message}"
    );
}

/// `graph` optimized, lowered and run by the kernel-IR interpreter and by the CPU backend,
/// against the reference evaluator, on [`gather_graphs::inputs`].
fn compiled_agree(graph: &Graph, seed: u64) -> Result<(), String> {
    let inputs = gather_graphs::inputs(graph, seed);
    let want = fusebox::eval::evaluate(graph, &rules().ops, &inputs).map_err(|e| e.to_string())?;
    let out = optimize(graph, rules(), &Options::default()).map_err(|e| e.to_string())?;
    let program = lower::lower(&out.dag, &out.partition).map_err(|e| e.to_string())?;
    program.check_bounds().map_err(|e| e.to_string())?;
    let buffers = common::random_graph::input_buffers(&program, &inputs);
    let got = interpret::run_program(&program, &buffers).map_err(|e| e.to_string())?;
    for (o, b) in program.dag.outputs.iter().zip(&got) {
        assert_same(
            &format!("interpreted {}", o.name),
            &want[&o.name],
            &b.to_tensor(),
        )?;
    }
    let mut prepared =
        prepare(graph, rules(), &Options::default(), compiler()).map_err(|e| e.to_string())?;
    let got = prepared
        .executable
        .run_tensors(&inputs)
        .map_err(|e| e.to_string())?;
    for name in &graph.outputs {
        assert_same(&format!("cpu {name}"), &want[name], &got[name])?;
    }
    Ok(())
}

/// A token embedding plus a position embedding, squared and summed along the rows: the gather
/// leads one kernel that its pointwise consumers and the row sum join (`Role::leads`), loading
/// each token's row where the sum reads it; the result equals the reference on the
/// interpreter and the CPU, bad ids (NaN rows) and all.
#[test]
fn a_gather_leads_the_kernel_its_consumers_join() {
    let graph = parse(
        r#"Graph(
        name: "tok_pos",
        inputs: [
            Input(name: "data", dtype: "f32", shape: [10, 6]),
            Input(name: "pos", dtype: "f32", shape: [4, 6]),
            Input(name: "ids", dtype: "i64", shape: [3, 4]),
        ],
        nodes: [
            Node(name: "t", op: "gather", args: ["data", "ids"], attrs: {"axis": 0}),
            Node(name: "x", op: "add", args: ["t", "pos"]),
            Node(name: "y", op: "mul", args: ["x", "x"]),
            Node(name: "s", op: "sum", args: ["y"], attrs: {"axes": [-1]}),
        ],
        outputs: ["y", "s"],
    )"#,
    );
    let out = optimize(&graph, rules(), &Options::default()).unwrap();
    let kernels = &out.partition.kernels;
    let of = |name: &str| {
        let n = out.dag.nodes.iter().position(|n| n.name == name).unwrap();
        kernels.iter().position(|k| k.nodes.contains(&n)).unwrap()
    };
    assert_eq!(of("t"), of("x"));
    assert_eq!(of("x"), of("y"));
    assert_eq!(of("y"), of("s"));
    for seed in 0..4 {
        compiled_agree(&graph, seed).unwrap();
    }
}

/// A row kernel that gathers each token's row and also stores values broadcast along the
/// batch axis (written from the rows at batch index 0): the C row loop names the gather's
/// range check and the stores' guards apart. They shared `ok{n}` names, so a gather of
/// instruction 1 beside a guarded store 1 (a GPT-style LM from token ids, with its position
/// terms as outputs) did not compile.
#[test]
fn a_gathered_row_beside_stores_broadcast_along_the_batch_compiles_and_agrees() {
    let graph = parse(
        r#"Graph(
        name: "embed_rows",
        inputs: [
            Input(name: "ids", dtype: "i64", shape: [2, 4]),
            Input(name: "data", dtype: "f32", shape: [10, 8]),
            Input(name: "pos", dtype: "f32", shape: [4, 8]),
        ],
        nodes: [
            Node(name: "e", op: "gather", args: ["data", "ids"], attrs: {"axis": 0}),
            Node(name: "e2", op: "mul", args: ["e", "e"]),
            Node(name: "p2", op: "mul", args: ["pos", "pos"]),
            Node(name: "h", op: "add", args: ["e", "p2"]),
            Node(name: "m", op: "mean", args: ["h"], attrs: {"axes": [-1], "keepdim": true}),
            Node(name: "y", op: "sub", args: ["h", "m"]),
        ],
        outputs: ["e2", "p2", "y"],
    )"#,
    );
    let out = optimize(&graph, rules(), &Options::default()).unwrap();
    assert_eq!(out.partition.kernels.len(), 1, "one row kernel");
    for seed in 0..3 {
        compiled_agree(&graph, seed).unwrap();
    }
}

/// An embedding's LayerNorm ([`gather_graphs::embedding_layernorm`]) is one row kernel that
/// reads each token's row at its id: the CPU computes the id once per row and, when it is in
/// range, reads the row with its vector loops (rows of 16 and more); a row whose id is out of
/// range (NaN throughout) takes the scalar loops. Rows of 1 to 300 elements, f32, f16 and
/// bf16 tables, equal to the reference on the interpreter and the CPU.
#[test]
fn an_embedding_layernorm_reads_each_row_at_its_id() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for width in [1, 16, 37, 300] {
            let graph = gather_graphs::embedding_layernorm(dtype, 5, width);
            let out = optimize(&graph, rules(), &Options::default()).unwrap();
            let program = lower::lower(&out.dag, &out.partition).unwrap();
            assert_eq!(program.kernels.len(), 1, "{dtype:?} {width}");
            let ir = &program.kernels[0];
            assert!(ir.is_row_kernel() && ir.has_gathers());
            assert!(ir.row_gathers().iter().any(|&g| g));
            let source = fusebox::backend::cpu::emit::emit_kernel(ir, "k");
            assert!(source.contains("const int64_t jv = gok"), "{source}");
            for seed in 0..4 {
                compiled_agree(&graph, seed)
                    .unwrap_or_else(|e| panic!("{dtype:?} width {width} seed {seed}: {e}"));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::random_graph::cases(48),
        ..ProptestConfig::default()
    })]

    /// Random gathers (see `gather_graphs`) on the interpreter and the CPU backend equal the
    /// reference, NaN fills and all.
    #[test]
    fn random_gathers_compiled_agree_with_the_reference(
        recipe in gather_graphs::recipes(),
        seed in 0u64..1000,
    ) {
        let graph = gather_graphs::build(&recipe);
        compiled_agree(&graph, seed).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{recipe:?}\n{}", graph::file::to_ron(&graph))))?;
    }
}

/// The geometry the generator covers: both ops, every data dtype, rank-0 index tensors,
/// size-0 axes and negative axes, in fair numbers over 500 recipes.
#[test]
fn random_gathers_cover_their_forms() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = gather_graphs::recipes();
    let recipes: Vec<GatherRecipe> = (0..500)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    let count = |f: &dyn Fn(&GatherRecipe) -> bool| recipes.iter().filter(|r| f(r)).count();
    assert!(count(&|r| r.elements && !r.scatter) > 50);
    assert!(count(&|r| r.scatter) > 50);
    for reader in [Reader::None, Reader::Square, Reader::Rows, Reader::Sum] {
        assert!(
            count(&|r| r.reader == reader && !r.scatter) > 60,
            "{reader:?}"
        );
    }
    assert!(count(&|r| r.spread) > 25);
    assert!(count(&|r| r.scatter && r.dtype == DType::F16) > 5);
    assert!(count(&|r| r.scatter && r.dtype == DType::I32) > 5);
    assert!(count(&|r| !r.elements && r.indices.is_empty()) > 20);
    assert!(count(&|r| r.data.contains(&0)) > 50);
    assert!(count(&|r| r.axis < 0) > 100);
    for dtype in [DType::F16, DType::BF16, DType::I64, DType::Bool] {
        assert!(count(&|r| r.dtype == dtype) > 30, "{dtype}");
    }
}
