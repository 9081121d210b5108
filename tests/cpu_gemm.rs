//! The CPU backend's GEMM (src/backend/cpu/gemm.c) against the reference evaluator: random
//! products of every shape class the GEMM's blocking distinguishes (empty and unit dims, K = 0,
//! edges of the register tile and of the cache blocks), transposed operands, broadcast batches,
//! 1-D operands, absorbed casts, f32, f16 and bf16, with NaN and ±Inf planted.

use crate::common;

use common::kernel_cache::compiler;
use common::random_graph::{assert_same, rules};
use fusebox::backend::Executable;
use fusebox::graph;
use fusebox::optimize::Options;
use fusebox::runner::prepare;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

/// One operand of a product: stored with these batch dims, optionally as a vector (1-D) or
/// transposed (stored `[.., cols, rows]` and transposed in the graph), optionally stored in
/// another dtype and cast to the product's.
#[derive(Debug, Clone)]
struct Operand {
    batch: Vec<usize>,
    vector: bool,
    transposed: bool,
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

/// The graph text: inputs, each operand's cast and transpose, the matmul.
fn graph_text(p: &Product) -> String {
    let (mut inputs, mut nodes, mut args) = (Vec::new(), Vec::new(), Vec::new());
    for (name, op, dims) in [("a", &p.a, [p.m, p.k]), ("b", &p.b, [p.k, p.n])] {
        let mut shape = op.batch.clone();
        if op.vector {
            shape = vec![p.k];
        } else if op.transposed {
            shape.extend([dims[1], dims[0]]);
        } else {
            shape.extend(dims);
        }
        let stored = op.stored.unwrap_or(p.dtype);
        inputs.push(format!(
            "Input(name: \"{name}\", dtype: \"{stored}\", shape: {shape:?})"
        ));
        let mut value = name.to_string();
        if op.stored.is_some() {
            nodes.push(format!(
                "Node(name: \"{name}_c\", op: \"cast\", args: [\"{value}\"], attrs: {{\"dtype\": \"{}\"}})",
                p.dtype
            ));
            value = format!("{name}_c");
        }
        if op.transposed && !op.vector {
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            perm.swap(shape.len() - 2, shape.len() - 1);
            nodes.push(format!(
                "Node(name: \"{name}_t\", op: \"transpose\", args: [\"{value}\"], attrs: {{\"perm\": {perm:?}}})"
            ));
            value = format!("{name}_t");
        }
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
    for t in tensors.values_mut() {
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
    assert_same("c", &want["c"], &got["c"]).map_err(|e| format!("{e}\n{text}"))
}

fn plain(batch: &[usize]) -> Operand {
    Operand {
        batch: batch.to_vec(),
        vector: false,
        transposed: false,
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
                transposed: t,
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
                transposed: true,
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
    (operand_batch(batch), 0..8u8).prop_map(|(batch, kind)| Operand {
        vector: kind == 0,
        transposed: kind >= 5,
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

    /// Random products (empty and unit dims, K = 0, vectors, transposes, broadcast batches)
    /// agree with the reference evaluator.
    #[test]
    fn random_products_agree(p in product(), seed in 0u64..1000) {
        prop_assert!(agrees(&p, seed).is_ok(), "{:?}: {}", p, agrees(&p, seed).unwrap_err());
    }
}
