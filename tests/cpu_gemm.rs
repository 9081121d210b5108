//! The CPU backend's GEMM (src/backend/cpu/gemm.c) against the reference evaluator: random
//! products of every shape class the GEMM's blocking distinguishes (empty and unit dims, K = 0,
//! edges of the register tile and of the cache blocks), operands read through views (transposed,
//! sliced, broadcast along their batch, with their batch and row axes swapped), broadcast
//! batches, 1-D operands, absorbed casts, f32, f16 and bf16, with NaN and ±Inf planted. Each
//! product also runs lowered in the kernel-IR interpreter (the portable GEMM path).

use crate::common;

use common::kernel_cache::compiler;
use common::random_graph::{assert_same, rules};
use fusebox::backend::Executable;
use fusebox::graph;
use fusebox::optimize::Options;
use fusebox::runner::prepare;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

/// How an operand reaches the product from its stored input: every form but `Plain` is a
/// layout op the library call absorbs as strides (`library_views`), except where a reshape
/// needs an index map (`Merged`), which stays a copy kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Plain,
    /// Stored `[.., cols, rows]` and transposed.
    Transposed,
    /// Stored with twice the rows plus one and sliced to the odd ones (a row step of 2).
    RowStep,
    /// Stored with three more columns and sliced from column 2 (a row stride past the row).
    ColumnWindow,
    /// Stored without batch dims and broadcast to them (a batch stride of 0).
    Broadcast,
    /// Stored `[.., rows, b, cols]` with the last batch dim `b` inside, and transposed to
    /// `[.., b, rows, cols]` (attention's heads).
    BatchInside,
    /// Stored `[.., rows, cols]` transposed to `[.., cols, rows]` and back through a reshape
    /// that merges nothing: strides throughout.
    ReshapedTranspose,
    /// Stored transposed and reshaped across the transposed axes (an index map, no strides):
    /// not absorbed.
    Merged,
}

/// One operand of a product: its batch dims, optionally a vector (1-D), its layout, and
/// optionally stored in another dtype and cast to the product's.
#[derive(Debug, Clone)]
struct Operand {
    batch: Vec<usize>,
    vector: bool,
    layout: Layout,
    stored: Option<&'static str>,
}

#[derive(Debug, Clone)]
struct Product {
    a: Operand,
    b: Operand,
    m: usize,
    k: usize,
    n: usize,
    dtype: &'static str,
}

fn node(name: &str, op: &str, arg: &str, attrs: &str) -> String {
    format!("Node(name: \"{name}\", op: \"{op}\", args: [\"{arg}\"], attrs: {{{attrs}}})")
}

/// The stored shape of an operand of logical shape `batch ++ [rows, cols]` and the nodes that
/// take it to that shape from the value `value`, which they rename.
fn layout_nodes(
    name: &str,
    op: &Operand,
    [rows, cols]: [usize; 2],
    nodes: &mut Vec<String>,
    value: &mut String,
) -> Vec<usize> {
    let batch = &op.batch;
    let r = batch.len() + 2;
    let with = |dims: &[usize]| batch.iter().chain(dims).copied().collect::<Vec<_>>();
    let step = |nodes: &mut Vec<String>, value: &mut String, op_name: &str, attrs: String| {
        let out = format!("{name}_{}", nodes.len());
        nodes.push(node(&out, op_name, value, &attrs));
        *value = out;
    };
    let swap = |a: usize, b: usize| {
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(a, b);
        format!("\"perm\": {perm:?}")
    };
    let slice = |axis: usize, start: usize, end: usize, step: usize| {
        format!("\"axis\": {axis}, \"start\": {start}, \"end\": {end}, \"step\": {step}")
    };
    match op.layout {
        Layout::Plain => with(&[rows, cols]),
        Layout::Transposed => {
            step(nodes, value, "transpose", swap(r - 2, r - 1));
            with(&[cols, rows])
        }
        Layout::RowStep => {
            step(nodes, value, "slice", slice(r - 2, 1, 2 * rows + 1, 2));
            with(&[2 * rows + 1, cols])
        }
        Layout::ColumnWindow => {
            step(nodes, value, "slice", slice(r - 1, 2, cols + 2, 1));
            with(&[rows, cols + 3])
        }
        Layout::Broadcast => {
            step(
                nodes,
                value,
                "broadcast_to",
                format!("\"shape\": {:?}", with(&[rows, cols])),
            );
            vec![rows, cols]
        }
        Layout::BatchInside if !batch.is_empty() => {
            step(nodes, value, "transpose", swap(r - 3, r - 2));
            let mut stored = batch.clone();
            let b = stored.pop().unwrap();
            stored.extend([rows, b, cols]);
            stored
        }
        Layout::BatchInside => with(&[rows, cols]),
        Layout::ReshapedTranspose => {
            step(nodes, value, "transpose", swap(r - 2, r - 1));
            step(
                nodes,
                value,
                "reshape",
                format!("\"shape\": {:?}", with(&[1, cols, rows])),
            );
            step(
                nodes,
                value,
                "reshape",
                format!("\"shape\": {:?}", with(&[cols, rows])),
            );
            step(nodes, value, "transpose", swap(r - 2, r - 1));
            with(&[rows, cols])
        }
        Layout::Merged => {
            // [.., cols, rows] transposed to [.., rows, cols], flattened, and split again.
            step(nodes, value, "transpose", swap(r - 2, r - 1));
            step(
                nodes,
                value,
                "reshape",
                format!("\"shape\": {:?}", &with(&[rows * cols])),
            );
            step(
                nodes,
                value,
                "reshape",
                format!("\"shape\": {:?}", with(&[rows, cols])),
            );
            with(&[cols, rows])
        }
    }
}

/// The graph text: inputs, each operand's cast and layout ops, the matmul.
fn graph_text(p: &Product) -> String {
    let (mut inputs, mut nodes, mut args) = (Vec::new(), Vec::new(), Vec::new());
    for (name, op, dims) in [("a", &p.a, [p.m, p.k]), ("b", &p.b, [p.k, p.n])] {
        let mut value = name.to_string();
        let stored = op.stored.unwrap_or(p.dtype);
        if op.stored.is_some() {
            let cast = format!("{name}_c");
            nodes.push(node(
                &cast,
                "cast",
                &value,
                &format!("\"dtype\": \"{}\"", p.dtype),
            ));
            value = cast;
        }
        let shape = if op.vector {
            vec![p.k]
        } else {
            layout_nodes(name, op, dims, &mut nodes, &mut value)
        };
        inputs.push(format!(
            "Input(name: \"{name}\", dtype: \"{stored}\", shape: {shape:?})"
        ));
        args.push(value);
    }
    nodes.push(format!(
        "Node(name: \"c\", op: \"matmul\", args: [\"{}\", \"{}\"])",
        args[0], args[1]
    ));
    format!(
        "Graph(name: \"gemm\", inputs: [{}], nodes: [{}], outputs: [\"c\"])",
        inputs.join(", "),
        nodes.join(", ")
    )
}

/// Seeded inputs with a few NaN and ±Inf planted (sparsely, so that most of the result stays
/// finite and the comparison says something about the arithmetic).
fn inputs(g: &graph::Graph, seed: u64) -> fusebox::eval::Tensors {
    let mut tensors = fusebox::eval::random_inputs(g, seed);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x9e44);
    // In the graph's input order, so that a seed gives the same inputs in every process.
    for input in &g.inputs {
        let Some(t) = tensors.get_mut(&input.name) else {
            continue;
        };
        let dtype = t.dtype;
        if let fusebox::tensor::Data::Float(a) = &mut t.data {
            let len = a.len();
            for _ in 0..(len / 97).min(3) {
                let i = rng.random_range(0..len);
                let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
                *a.iter_mut().nth(i).unwrap() = dtype.round(special[rng.random_range(0..3)]);
            }
        }
    }
    tensors
}

/// The product computed by the CPU backend agrees with the reference evaluator.
fn agrees(p: &Product, seed: u64) -> Result<(), String> {
    let text = graph_text(p);
    let g = graph::file::parse(&text, "gemm.ron", &rules().ops)
        .map_err(|e| format!("{e}\n{text}"))?
        .0;
    let inputs = inputs(&g, seed);
    let want = fusebox::eval::evaluate(&g, &rules().ops, &inputs).map_err(|e| e.to_string())?;
    let mut prepared =
        prepare(&g, rules(), &Options::default(), compiler()).map_err(|e| e.to_string())?;
    let got = prepared
        .executable
        .run_tensors(&inputs)
        .map_err(|e| e.to_string())?;
    assert_same("c", &want["c"], &got["c"]).map_err(|e| format!("cpu: {e}\n{text}"))?;
    let optimized =
        fusebox::optimize::optimize(&g, rules(), &Options::default()).map_err(|e| e.to_string())?;
    let program =
        fusebox::lower::lower(&optimized.dag, &optimized.partition).map_err(|e| e.to_string())?;
    program.check_bounds().map_err(|e| e.to_string())?;
    let buffers = common::random_graph::input_buffers(&program, &inputs);
    let interpreted =
        fusebox::runtime::interpret::run_program(&program, &buffers).map_err(|e| e.to_string())?;
    assert_same("c", &want["c"], &interpreted[0].to_tensor())
        .map_err(|e| format!("interpreter: {e}\n{text}"))
}

fn plain(batch: &[usize]) -> Operand {
    Operand {
        batch: batch.to_vec(),
        vector: false,
        layout: Layout::Plain,
        stored: None,
    }
}

/// Sizes across the GEMM's block edges (MR = 8, NR = 48, KC = 256, MC = 128, NC = 384), with
/// NaN and Inf, transposed and not, in each product dtype.
#[test]
fn products_across_block_edges_agree() {
    for dtype in ["f32", "f16", "bf16"] {
        for (m, k, n, transposed) in [
            (131, 517, 389, false),
            (64, 300, 1024, true),
            (9, 257, 49, false),
            (129, 40, 770, true),
        ] {
            let op = |t| Operand {
                layout: if t { Layout::Transposed } else { Layout::Plain },
                ..plain(&[])
            };
            let p = Product {
                a: op(transposed),
                b: op(!transposed),
                m,
                k,
                n,
                dtype,
            };
            agrees(&p, (m * k + n) as u64).unwrap();
        }
    }
}

/// Absorbed casts: an f32 operand cast to f16 or bf16 (rounded while packed), a bf16 operand
/// widened to an f32 product, and an f16 operand cast to a bf16 product (two roundings).
#[test]
fn absorbed_casts_agree() {
    for (stored, dtype) in [
        ("f32", "f16"),
        ("f32", "bf16"),
        ("bf16", "f32"),
        ("f16", "f32"),
        ("f16", "bf16"),
        ("bf16", "f16"),
        ("f64", "f32"),
    ] {
        let p = Product {
            a: Operand {
                stored: Some(stored),
                ..plain(&[2])
            },
            b: Operand {
                stored: Some(stored),
                layout: Layout::Transposed,
                ..plain(&[])
            },
            m: 33,
            k: 70,
            n: 50,
            dtype,
        };
        agrees(&p, 7).unwrap();
    }
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(1), 2..20usize, 40..60usize]
}

/// An operand's batch dims for a product whose batch dims are `batch`: a suffix of them, each
/// kept or broadcast from 1.
fn operand_batch(batch: Vec<usize>) -> impl Strategy<Value = Vec<usize>> {
    let rank = batch.len();
    (0..=rank, proptest::collection::vec(any::<bool>(), rank)).prop_map(move |(drop, ones)| {
        batch[drop..]
            .iter()
            .zip(&ones[drop..])
            .map(|(&d, &one)| if one { 1 } else { d })
            .collect()
    })
}

fn operand(batch: Vec<usize>) -> impl Strategy<Value = Operand> {
    use Layout::*;
    let layouts = [
        Plain,
        Plain,
        Transposed,
        Transposed,
        RowStep,
        ColumnWindow,
        Broadcast,
        BatchInside,
        ReshapedTranspose,
        Merged,
    ];
    (operand_batch(batch), 0..11usize).prop_map(move |(batch, kind)| Operand {
        vector: kind == 10,
        layout: layouts[kind.min(9)],
        stored: None,
        batch,
    })
}

fn product() -> impl Strategy<Value = Product> {
    let batch = proptest::collection::vec(1..4usize, 0..3);
    let dtype = prop_oneof![Just("f32"), Just("f16"), Just("bf16")];
    (batch, dim(), dim(), dim(), dtype).prop_flat_map(|(batch, m, k, n, dtype)| {
        (operand(batch.clone()), operand(batch)).prop_map(move |(a, b)| Product {
            a,
            b,
            m,
            k,
            n,
            dtype,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::random_graph::cases(48),
        ..ProptestConfig::default()
    })]

    /// Random products (empty and unit dims, K = 0, vectors, operands read through views,
    /// broadcast batches) agree with the reference evaluator.
    #[test]
    fn random_products_agree(p in product(), seed in 0u64..1000) {
        prop_assert!(agrees(&p, seed).is_ok(), "{:?}: {}", p, agrees(&p, seed).unwrap_err());
    }
}

/// What follows a product in a graph: the epilogue the call runs on each tile of it
/// (`library_epilogues`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tail {
    /// `gelu(c + bias)`, the bias a row of the product's columns.
    BiasGelu,
    /// `relu(c * scale) + residual`, the residual of the product's shape, cast to f32.
    ScaledResidual,
    /// `sigmoid(c) * c`, a graph output also needing the product itself (stored too).
    SiluAndProduct,
    /// A bias gradient after an activation's derivative, as `fusebox grad` writes it:
    /// `d = c * tanh(pre)` (`pre` of the product's shape) and its column sums
    /// `sum_to_size(d, [cols])` (over the batch and the rows), both outputs.
    BiasGrad,
    /// Reductions alone, each of other axes: `sum(relu(c))` over the columns,
    /// `reduce_max(c)` over the rows, `mean(c * c)` over everything, and the NaNs of each
    /// column counted (`sum` of a bool: an integer accumulator, i64).
    Stats,
}

impl Tail {
    const ALL: [Tail; 5] = [
        Tail::BiasGelu,
        Tail::ScaledResidual,
        Tail::SiluAndProduct,
        Tail::BiasGrad,
        Tail::Stats,
    ];
}

/// `graph_text(p)` with `tail` after the product, its output `y`.
fn tail_text(p: &Product, tail: Tail) -> String {
    let text = graph_text(p);
    let shape = fusebox::shape::matmul_shape(
        &match p.a.vector {
            true => vec![p.k],
            false => p.a.batch.iter().copied().chain([p.m, p.k]).collect(),
        },
        &match p.b.vector {
            true => vec![p.k],
            false => p.b.batch.iter().copied().chain([p.k, p.n]).collect(),
        },
    )
    .unwrap();
    let cols = *shape.last().unwrap_or(&1);
    let (inputs, nodes, outputs) = match tail {
        Tail::BiasGelu => (
            format!(
                "Input(name: \"bias\", dtype: \"{}\", shape: [{cols}])",
                p.dtype
            ),
            "Node(name: \"cb\", op: \"add\", args: [\"c\", \"bias\"]), \
             Node(name: \"y\", op: \"gelu\", args: [\"cb\"])"
                .to_string(),
            "[\"y\"]",
        ),
        Tail::ScaledResidual => (
            format!(
                "Input(name: \"res\", dtype: \"{}\", shape: {shape:?})",
                p.dtype
            ),
            "Node(name: \"half\", op: \"const\", attrs: {\"value\": 0.5, \"dtype\": \"DTYPE\"}), \
             Node(name: \"cs\", op: \"mul\", args: [\"c\", \"half\"]), \
             Node(name: \"cr\", op: \"relu\", args: [\"cs\"]), \
             Node(name: \"r\", op: \"add\", args: [\"cr\", \"res\"]), \
             Node(name: \"y\", op: \"cast\", args: [\"r\"], attrs: {\"dtype\": \"f32\"})"
                .replace("DTYPE", p.dtype),
            "[\"y\"]",
        ),
        Tail::SiluAndProduct => (
            String::new(),
            "Node(name: \"sg\", op: \"sigmoid\", args: [\"c\"]), \
             Node(name: \"y\", op: \"mul\", args: [\"sg\", \"c\"])"
                .to_string(),
            "[\"y\", \"c\"]",
        ),
        Tail::BiasGrad => {
            let to: &[usize] = if shape.is_empty() { &[] } else { &[cols] };
            (
                format!(
                    "Input(name: \"pre\", dtype: \"{}\", shape: {shape:?})",
                    p.dtype
                ),
                format!(
                    "Node(name: \"tp\", op: \"tanh\", args: [\"pre\"]), \
                     Node(name: \"d\", op: \"mul\", args: [\"c\", \"tp\"]), \
                     Node(name: \"db\", op: \"sum_to_size\", args: [\"d\"], \
                     attrs: {{\"shape\": {to:?}}})"
                ),
                "[\"d\", \"db\"]",
            )
        }
        Tail::Stats => {
            // Vectors' products have fewer axes: the last one, or all.
            let axis = |a: i64| match shape.len() {
                0 => String::new(),
                1 => ", attrs: {\"axes\": [-1]}".to_string(),
                _ => format!(", attrs: {{\"axes\": [{a}]}}"),
            };
            (
                String::new(),
                format!(
                    "Node(name: \"r\", op: \"relu\", args: [\"c\"]), \
                     Node(name: \"rs\", op: \"sum\", args: [\"r\"]{}), \
                     Node(name: \"cm\", op: \"reduce_max\", args: [\"c\"]{}), \
                     Node(name: \"sq\", op: \"mul\", args: [\"c\", \"c\"]), \
                     Node(name: \"ms\", op: \"mean\", args: [\"sq\"]), \
                     Node(name: \"nan\", op: \"ne\", args: [\"c\", \"c\"]), \
                     Node(name: \"nans\", op: \"sum\", args: [\"nan\"]{})",
                    axis(-1),
                    axis(-2),
                    axis(-2)
                ),
                "[\"rs\", \"cm\", \"ms\", \"nans\"]",
            )
        }
    };
    let text = text.replace("outputs: [\"c\"]", &format!("outputs: {outputs}"));
    let text = match inputs.is_empty() {
        true => text,
        false => text.replacen("inputs: [", &format!("inputs: [{inputs}, "), 1),
    };
    let at = text.rfind("], outputs").unwrap();
    format!("{}, {nodes}{}", &text[..at], &text[at..])
}

/// The CPU backend and the interpreter agree with the reference on `p` followed by `tail`.
fn tail_agrees(p: &Product, tail: Tail, seed: u64) -> Result<(), String> {
    let text = tail_text(p, tail);
    let g = graph::file::parse(&text, "gemm.ron", &rules().ops)
        .map_err(|e| format!("{e}\n{text}"))?
        .0;
    graph_agrees(&g, &inputs(&g, seed)).map_err(|e| format!("{e}\n{text}"))
}

/// The CPU backend and the interpreter agree with the reference on `g` and `inputs`.
fn graph_agrees(g: &graph::Graph, inputs: &fusebox::eval::Tensors) -> Result<(), String> {
    let (g, inputs) = (g.clone(), inputs.clone());
    let want = fusebox::eval::evaluate(&g, &rules().ops, &inputs).map_err(|e| e.to_string())?;
    let mut prepared =
        prepare(&g, rules(), &Options::default(), compiler()).map_err(|e| e.to_string())?;
    let got = prepared
        .executable
        .run_tensors(&inputs)
        .map_err(|e| e.to_string())?;
    let optimized =
        fusebox::optimize::optimize(&g, rules(), &Options::default()).map_err(|e| e.to_string())?;
    let program =
        fusebox::lower::lower(&optimized.dag, &optimized.partition).map_err(|e| e.to_string())?;
    program.check_bounds().map_err(|e| e.to_string())?;
    let buffers = common::random_graph::input_buffers(&program, &inputs);
    let interpreted =
        fusebox::runtime::interpret::run_program(&program, &buffers).map_err(|e| e.to_string())?;
    for (k, output) in g.outputs.iter().enumerate() {
        assert_same(output, &want[output], &got[output])
            .map_err(|e| format!("cpu {output}: {e}"))?;
        assert_same(output, &want[output], &interpreted[k].to_tensor())
            .map_err(|e| format!("interpreter {output}: {e}"))?;
    }
    Ok(())
}

/// The joint graph `fusebox grad` writes for two `Linear` layers with an activation between
/// them, across the GEMM's block edges (the first `[300, 389]` product is 3 row blocks by 2
/// column blocks) and within one tile, in f32, f16 and bf16: the first layer's bias gradient,
/// the column sums of the activation's derivative times the incoming gradient, ends a product's
/// epilogue, and the CPU backend and the interpreter agree with the reference evaluator. The
/// inputs hold no infinities: an infinite `x` times an activation's derivative that is 0 in
/// one summation order of the product and tiny in another (a saturated `tanh`) is NaN on one
/// side and infinite on the other, both right.
#[test]
fn a_linear_stacks_bias_gradient_runs_in_an_epilogue() {
    for dtype in ["f32", "f16", "bf16"] {
        for (dims, activation) in [([300, 70, 389, 49], "gelu"), ([9, 33, 130, 17], "tanh")] {
            let g = common::linear_stack_joint(dims, activation, dtype);
            let optimized = fusebox::optimize::optimize(&g, rules(), &Options::default()).unwrap();
            let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
            assert_eq!(
                common::epilogue_reductions(&program).iter().sum::<usize>(),
                1,
                "{dtype} {activation}: grad_b1 in an epilogue"
            );
            let inputs = fusebox::eval::random_inputs(&g, dims[0] as u64);
            graph_agrees(&g, &inputs).unwrap_or_else(|e| panic!("{dtype} {dims:?}: {e}"));
        }
    }
}

/// Whether the optimized program of `p` + `tail` runs the tail as an epilogue.
fn has_epilogue(p: &Product, tail: Tail) -> bool {
    let text = tail_text(p, tail);
    let g = graph::file::parse(&text, "gemm.ron", &rules().ops)
        .unwrap()
        .0;
    let optimized = fusebox::optimize::optimize(&g, rules(), &Options::default()).unwrap();
    let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
    program
        .steps
        .iter()
        .any(|s| matches!(s, fusebox::lower::Step::MatMul(m) if m.epilogue.is_some()))
}

/// Epilogues across the GEMM's block edges (tiles of MC = 128 rows by up to NC = 384
/// columns, so several tiles per batch matrix), batched (a batch sharing its weight is
/// multiplied as one tall matrix, whose tiles cross from one batch matrix into the next),
/// with transposed weights, in each
/// product dtype: bias + GELU, a scaled ReLU + residual cast to f32, SiLU whose product is
/// a graph output as well (stored besides), a bias gradient (column sums over several row
/// blocks and batch matrices) and reductions of the columns, the rows and everything.
#[test]
fn epilogues_across_block_edges_agree() {
    for dtype in ["f32", "f16", "bf16"] {
        for (m, k, n, batch) in [
            (131, 70, 389, vec![]),
            (9, 257, 49, vec![2]),
            (300, 33, 777, vec![]),
            // Folded into one tall matrix of 150 rows: the first row block holds all of the
            // first two batch matrices and part of the third.
            (50, 70, 389, vec![3]),
        ] {
            let p = Product {
                a: plain(&batch),
                b: Operand {
                    layout: Layout::Transposed,
                    ..plain(&[])
                },
                m,
                k,
                n,
                dtype,
            };
            for tail in Tail::ALL {
                assert!(
                    has_epilogue(&p, tail) || tail == Tail::SiluAndProduct,
                    "{tail:?}"
                );
                tail_agrees(&p, tail, (m + n) as u64).unwrap();
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::random_graph::cases(32),
        ..ProptestConfig::default()
    })]

    /// Random products with an epilogue (empty and unit dims, vectors, which run no
    /// epilogue, views, broadcast batches) agree with the reference evaluator.
    #[test]
    fn random_epilogues_agree(p in product(), tail in 0..Tail::ALL.len(), seed in 0u64..1000) {
        let tail = Tail::ALL[tail];
        prop_assert!(tail_agrees(&p, tail, seed).is_ok(), "{:?} {:?}: {}", p, tail,
            tail_agrees(&p, tail, seed).unwrap_err());
    }
}

/// A product read transposed by a pointwise tail (the book's
/// `book/examples/gemm/transposed_product.ron`): `transpose-matmul` makes the call write the
/// transposed product as `wᵀ @ xᵀ`, both operands read through strides and the tail run as its
/// epilogue, and the CPU backend and the interpreter agree with the reference evaluator.
#[test]
fn a_transposed_product_becomes_a_product_of_views_with_an_epilogue() {
    let path = std::path::Path::new("book/examples/gemm/transposed_product.ron");
    let g = graph::file::load(path, &rules().ops).unwrap().0;
    let optimized = fusebox::optimize::optimize(&g, rules(), &Options::default()).unwrap();
    assert!(optimized.report.rules.contains_key("transpose-matmul"));
    let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
    let [fusebox::lower::Step::MatMul(m)] = program.steps.as_slice() else {
        panic!("one library call: {:?}", program.steps);
    };
    assert!(m.epilogue.is_some() && m.a.view.is_some() && m.b.view.is_some());
    for seed in 0..3 {
        cpu_and_interpreter_agree(&g, &program, seed, "o2");
    }
}

/// A row scale before a product (`book/examples/gemm/row_scale.ron`, the normalizing half of
/// an RMS norm, and the same divided instead of multiplied, as a layer norm divides):
/// `matmul-row-scale-out` (or `-divide-out`) moves the scale past the product, the reduction
/// that computes it is split off the product's reader, and the scale rides in the call's
/// epilogue, so the scaled operand is never written. In f32 and f16, the CPU backend and the
/// interpreter agree with the reference evaluator; under `--strict-ieee` the rules (exact in
/// real arithmetic only) stay out.
#[test]
fn a_row_scale_moves_past_the_product_into_its_epilogue() {
    let text = std::fs::read_to_string("book/examples/gemm/row_scale.ron")
        .unwrap()
        .replace("[2048, 1024]", "[96, 80]")
        .replace("[1024, 1024]", "[80, 72]");
    let divided = text
        .replace(
            r#"op: "rsqrt", args: ["me"]"#,
            r#"op: "sqrt", args: ["me"]"#,
        )
        .replace(
            r#"op: "mul", args: ["x", "r"]"#,
            r#"op: "div", args: ["x", "r"]"#,
        );
    for (text, rule) in [
        (&text, "matmul-row-scale-out"),
        (&divided, "matmul-row-divide-out"),
    ] {
        for dtype in ["f32", "f16"] {
            let g = parsed_at(text, "row_scale.ron", dtype);
            let optimized = fusebox::optimize::optimize(&g, rules(), &Options::default()).unwrap();
            assert!(optimized.report.rules.contains_key(rule), "{rule} {dtype}");
            let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
            let [
                fusebox::lower::Step::Kernel(_),
                fusebox::lower::Step::MatMul(m),
            ] = program.steps.as_slice()
            else {
                panic!(
                    "the scale's reduction, then the product: {:?}",
                    program.steps
                );
            };
            assert!(
                m.epilogue.is_some(),
                "{rule} {dtype}: the scale in the epilogue"
            );
            for seed in 0..3 {
                cpu_and_interpreter_agree(&g, &program, seed, "y");
            }
            let strict = Options {
                strict_ieee: true,
                ..Options::default()
            };
            let kept = fusebox::optimize::optimize(&g, rules(), &strict).unwrap();
            assert!(
                !kept.report.rules.contains_key(rule),
                "{rule} under strict IEEE"
            );
        }
    }
}

/// A product whose operand is a zero padding of a value (a `concat` of it between zero slabs,
/// on one axis or two, uneven, as the ONNX importer writes a convolution's padding), as the
/// right-hand operand, every other column of it (read at a stride: the packers make its
/// zeros), and, transposed, as the left-hand one: the padding runs inside the call (no
/// kernel writes the padded copy) and the CPU backend and the interpreter agree with the
/// reference, in f32 and f16, at sizes across the GEMM's column strips.
#[test]
fn a_padded_operand_is_read_without_a_padding_kernel() {
    let slab = |name: &str, shape: &str| {
        format!(
            r#"Node(name: "{name}z", op: "const", attrs: {{"value": 0.0, "dtype": "f32"}}),
               Node(name: "{name}", op: "broadcast_to", args: ["{name}z"], attrs: {{"shape": {shape}}}),"#
        )
    };
    for (k, n) in [(5usize, 7usize), (30, 100)] {
        // x [k, n] padded to [k + 3, n + 2]: 2 rows before, 1 after; 2 columns after.
        let (kp, np) = (k + 3, n + 2);
        let pads = [
            slab("top", &format!("[2, {n}]")),
            slab("bottom", &format!("[1, {n}]")),
            slab("right", &format!("[{kp}, 2]")),
        ]
        .concat();
        for product in [r#"["w", "xp"]"#, r#"["xt", "v"]"#, r#"["u", "xs"]"#] {
            let text = format!(
                r#"Graph(name: "t",
                inputs: [Input(name: "w", dtype: "f32", shape: [9, {kp}]),
                         Input(name: "v", dtype: "f32", shape: [{kp}, 6]),
                         Input(name: "u", dtype: "f32", shape: [4, {kp}]),
                         Input(name: "x", dtype: "f32", shape: [{k}, {n}])],
                nodes: [{pads}
                    Node(name: "rows", op: "concat", args: ["top", "x", "bottom"], attrs: {{"axis": 0}}),
                    Node(name: "xp", op: "concat", args: ["rows", "right"], attrs: {{"axis": 1}}),
                    Node(name: "xt", op: "transpose", args: ["xp"], attrs: {{"perm": [1, 0]}}),
                    Node(name: "xs", op: "slice", args: ["xp"], attrs: {{"axis": 1, "start": 1, "end": {np}, "step": 2}}),
                    Node(name: "y", op: "matmul", args: {product})],
                outputs: ["y"])"#
            );
            for dtype in ["f32", "f16"] {
                let g = parsed_at(&text, "padded.ron", dtype);
                let optimized =
                    fusebox::optimize::optimize(&g, rules(), &Options::default()).unwrap();
                let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
                let [fusebox::lower::Step::MatMul(m)] = program.steps.as_slice() else {
                    panic!(
                        "{product} {dtype}: one product, no padding kernel: {:?}",
                        program.steps
                    );
                };
                let padded = |op: &fusebox::lower::MatMulOperand| {
                    op.view.as_ref().is_some_and(|v| v.padding.is_some())
                };
                assert!(padded(&m.a) || padded(&m.b), "{product} {dtype}");
                for seed in 0..2 {
                    cpu_and_interpreter_agree(&g, &program, seed, "y");
                }
            }
        }
    }
}

/// The graph `text` (file `name`) with every f32 value made `dtype`.
fn parsed_at(text: &str, name: &str, dtype: &str) -> graph::Graph {
    let text = text.replace("\"f32\"", &format!("\"{dtype}\""));
    graph::file::parse(&text, name, &rules().ops).unwrap().0
}

/// `g`'s output `name` on the CPU backend and `program` (its lowering) in the interpreter
/// equal the reference evaluator's on seeded inputs.
fn cpu_and_interpreter_agree(
    g: &graph::Graph,
    program: &fusebox::lower::Program,
    seed: u64,
    name: &str,
) {
    let inputs = inputs(g, seed);
    let want = fusebox::eval::evaluate(g, &rules().ops, &inputs).unwrap();
    let mut prepared = prepare(g, rules(), &Options::default(), compiler()).unwrap();
    let got = prepared.executable.run_tensors(&inputs).unwrap();
    assert_same(name, &want[name], &got[name]).unwrap();
    let buffers = common::random_graph::input_buffers(program, &inputs);
    let interpreted = fusebox::runtime::interpret::run_program(program, &buffers).unwrap();
    assert_same(name, &want[name], &interpreted[0].to_tensor()).unwrap();
}

/// Attention's head merge (`book/examples/gemm/head_merge.ron`): the first product writes its
/// result through the transpose that reads it (no copy kernel), and the reshape of that
/// transpose is the second product's operand view. In f32 and f16, the CPU backend and the
/// interpreter agree with the reference evaluator.
#[test]
fn a_product_written_through_its_transpose_agrees() {
    let text = std::fs::read_to_string("book/examples/gemm/head_merge.ron").unwrap();
    for dtype in ["f32", "f16"] {
        let g = parsed_at(&text, "head_merge.ron", dtype);
        let optimized = fusebox::optimize::optimize(&g, rules(), &Options::default()).unwrap();
        let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
        let products: Vec<&fusebox::lower::MatMulStep> = program
            .steps
            .iter()
            .filter_map(|s| match s {
                fusebox::lower::Step::MatMul(m) => Some(m),
                _ => None,
            })
            .collect();
        assert_eq!(products.len(), program.steps.len(), "no generated kernel");
        assert!(products[0].result.is_some() && products[1].a.view.is_some());
        for seed in 0..2 {
            cpu_and_interpreter_agree(&g, &program, seed, "y");
        }
    }
}

/// Products that share one right-hand matrix (as an unrolled RNN's steps share their
/// recurrent weights) read it packed once per run: five products by one stored weight, read
/// through slices (and a transpose) as the products' view of it, in f32, f16 and bf16 (the
/// bf16 pairs path), at sizes across the column blocks, agree with the reference on one
/// executable run three times with new weights each time (the packed copy of the last run
/// must not be read).
#[test]
fn products_sharing_a_weight_pack_it_once_per_run() {
    for (dtype, transposed, k, n) in [
        ("f32", false, 40, 50),
        ("f32", true, 300, 500),
        ("f16", true, 64, 96),
        ("bf16", false, 256, 800),
        ("bf16", true, 33, 47),
    ] {
        let (stored, read) = if transposed {
            (format!("[{n}, {k}]"), "wt")
        } else {
            (format!("[{k}, {n}]"), "w")
        };
        let (rows, cols) = (k - 1, n - 2);
        let mut nodes = vec![if transposed {
            node("wt", "transpose", "w", "") + ","
        } else {
            String::new()
        }];
        nodes.push(format!(
            r#"Node(name: "part", op: "slice", args: ["{read}"], attrs: {{"axis": 1, "start": 2}}),"#
        ));
        nodes.push(
            r#"Node(name: "shared", op: "slice", args: ["part"], attrs: {"axis": 0, "start": 1}),"#
                .to_string(),
        );
        let mut inputs_text = format!(r#"Input(name: "w", dtype: "{dtype}", shape: {stored})"#);
        let mut outputs = Vec::new();
        for i in 0..5 {
            inputs_text.push_str(&format!(
                r#", Input(name: "x{i}", dtype: "{dtype}", shape: [{}, {rows}])"#,
                3 + i
            ));
            nodes.push(format!(
                r#"Node(name: "p{i}", op: "matmul", args: ["x{i}", "shared"]),"#
            ));
            outputs.push(format!("\"p{i}\""));
        }
        let text = format!(
            r#"Graph(name: "shared", inputs: [{inputs_text}], nodes: [{}], outputs: [{}])"#,
            nodes.concat(),
            outputs.join(", ")
        );
        let g = graph::file::parse(&text, "shared.ron", &rules().ops)
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
            .0;
        let mut prepared = prepare(&g, rules(), &Options::default(), compiler()).unwrap();
        assert_eq!(prepared.report.library_calls_after, 5, "{text}");
        // The same input buffers each run, their contents replaced: a packed copy kept from
        // the run before would still have the weight's address.
        let program = prepared.executable.program().clone();
        let mut buffers = common::random_graph::input_buffers(&program, &inputs(&g, 0));
        let mut outputs = prepared.executable.output_buffers();
        for seed in [1, 2, 3] {
            let inputs = inputs(&g, seed);
            for (buffer, fresh) in buffers
                .iter_mut()
                .zip(common::random_graph::input_buffers(&program, &inputs))
            {
                buffer.copy_from(&fresh);
            }
            let want = fusebox::eval::evaluate(&g, &rules().ops, &inputs).unwrap();
            prepared
                .executable
                .run_into(&buffers, &mut outputs)
                .unwrap();
            for (o, got) in program.dag.outputs.iter().zip(&outputs) {
                assert_same(&o.name, &want[&o.name], &got.to_tensor()).unwrap_or_else(|e| {
                    panic!("{dtype} transposed {transposed} [{rows}, {cols}] seed {seed}: {e}")
                });
            }
        }
    }
}

/// A convolution's tail over its product read as an image: `[N, M, P]` reshaped to
/// `[N, M, H, W]`, a per-channel scale and shift, a residual add and ReLU, the product tiles
/// crossing image rows (P = 15 x 31 across several column blocks). With a contiguous residual
/// the tail runs as the GEMM's epilogue, its split axes merged back into P; with a residual
/// that varies along image rows but is broadcast along columns (no single stride along P) the
/// partition still merges the tail, but the lowering cannot merge its axes, so the call
/// stores its product and the tail runs after it as a kernel of its own. Both agree with the
/// reference on the CPU and the interpreter, in f32, f16 and bf16.
#[test]
fn an_epilogue_over_the_product_read_as_an_image_agrees() {
    for dtype in ["f32", "f16", "bf16"] {
        for per_row in [false, true] {
            let residual = match per_row {
                false => {
                    "Node(name: \"res\", op: \"reshape\", args: [\"r\"], attrs: {\"shape\": [2, 40, 15, 31]})"
                }
                true => {
                    "Node(name: \"res\", op: \"reshape\", args: [\"rows\"], attrs: {\"shape\": [2, 40, 15, 1]})"
                }
            };
            let text = format!(
                "Graph(name: \"conv_tail\", inputs: [
                    Input(name: \"w\", dtype: \"{dtype}\", shape: [40, 27]),
                    Input(name: \"cols\", dtype: \"{dtype}\", shape: [2, 27, 465]),
                    Input(name: \"scale\", dtype: \"{dtype}\", shape: [1, 40, 1, 1]),
                    Input(name: \"shift\", dtype: \"{dtype}\", shape: [40]),
                    Input(name: \"r\", dtype: \"{dtype}\", shape: [2, 40, 465]),
                    Input(name: \"rows\", dtype: \"{dtype}\", shape: [2, 600]),
                ], nodes: [
                    Node(name: \"c\", op: \"matmul\", args: [\"w\", \"cols\"]),
                    Node(name: \"img\", op: \"reshape\", args: [\"c\"], attrs: {{\"shape\": [2, 40, 15, 31]}}),
                    Node(name: \"b\", op: \"reshape\", args: [\"shift\"], attrs: {{\"shape\": [1, 40, 1, 1]}}),
                    Node(name: \"s\", op: \"mul\", args: [\"img\", \"scale\"]),
                    Node(name: \"t\", op: \"add\", args: [\"s\", \"b\"]),
                    {residual},
                    Node(name: \"u\", op: \"add\", args: [\"t\", \"res\"]),
                    Node(name: \"y\", op: \"relu\", args: [\"u\"]),
                ], outputs: [\"y\"])"
            );
            let g = graph::file::parse(&text, "conv_tail.ron", &rules().ops)
                .unwrap()
                .0;
            let optimized = fusebox::optimize::optimize(&g, rules(), &Options::default()).unwrap();
            let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
            program.check_bounds().unwrap();
            let merged = optimized.partition.kernels.len() == 1;
            let epilogue = program
                .steps
                .iter()
                .any(|s| matches!(s, fusebox::lower::Step::MatMul(m) if m.epilogue.is_some()));
            assert!(merged, "{dtype}: the tail is not in the call's kernel");
            assert_eq!(epilogue, !per_row, "{dtype}, per row {per_row}");
            assert_eq!(program.steps.len(), 1 + usize::from(per_row));
            for seed in 0..2 {
                cpu_and_interpreter_agree(&g, &program, seed, "y");
            }
        }
    }
}
