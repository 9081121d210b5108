//! Integer ops are exact two's-complement arithmetic that wraps as NumPy's does, on every
//! backend: the reference evaluator, the kernel-IR interpreter (fused and one kernel per op)
//! and compiled C (fused and unfused). Every expected value is computed here independently,
//! with Rust's `wrapping_*` operations on the integer types NumPy would use (and, where NumPy
//! is installed, checked against NumPy itself).

use crate::common;

use common::random_graph::{self, rules};
use fusebox::backend::Executable;
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::graph::{Graph, GraphBuilder};
use fusebox::optimize::{Options, optimize};
use fusebox::runtime::interpret;
use fusebox::tensor::Tensor;

use common::kernel_cache::compiler;

fn ints(dtype: DType, values: &[i64]) -> Tensor {
    Tensor::from_ints(dtype, &[values.len()], values.to_vec()).unwrap()
}

/// Output `name` of `graph` on `inputs` from every backend, each labelled.
fn everywhere(graph: &Graph, inputs: &Tensors, name: &str) -> Vec<(String, Tensor)> {
    let rules = rules();
    let mut results = Vec::new();
    let reference = fusebox::eval::evaluate(graph, &rules.ops, inputs).unwrap();
    results.push(("reference".to_string(), reference[name].clone()));
    for fusion in [true, false] {
        let options = Options {
            fusion,
            ..Options::default()
        };
        let out = optimize(graph, rules, &options).unwrap();
        let program = fusebox::lower::lower(&out.dag, &out.partition).unwrap();
        let buffers = random_graph::input_buffers(&program, inputs);
        let got = interpret::run_program(&program, &buffers).unwrap();
        let at = program
            .dag
            .outputs
            .iter()
            .position(|o| o.name == name)
            .unwrap();
        results.push((
            format!("interpreter (fusion {fusion})"),
            got[at].to_tensor(),
        ));
        let mut prepared = fusebox::runner::prepare(graph, rules, &options, compiler()).unwrap();
        let got = prepared.executable.run_tensors(inputs).unwrap();
        results.push((format!("C (fusion {fusion})"), got[name].clone()));
    }
    results
}

/// Every backend gives exactly `expected` (dtype and every bit of every element).
fn assert_everywhere(graph: &Graph, inputs: &Tensors, name: &str, expected: &Tensor) {
    for (backend, got) in everywhere(graph, inputs, name) {
        assert_eq!(got.dtype, expected.dtype, "{backend}: dtype of {name}");
        assert_eq!(
            got.int_values(),
            expected.int_values(),
            "{backend}: values of {name}"
        );
    }
}

fn inputs(pairs: &[(&str, Tensor)]) -> Tensors {
    pairs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect()
}

#[test]
fn i64_mul_is_exact_above_2_pow_53() {
    let a = [
        4503599627370497i64,
        -4503599627370497,
        (1 << 53) + 1,
        i64::MAX,
    ];
    let mut b = GraphBuilder::new("mul3");
    let x = b.input("a", DType::I64, &[a.len()]);
    let three = b.constant_int("three", 3, DType::I64);
    b.op("y", "mul", &[&x, &three]);
    let graph = b.finish(&["y"]);
    let expected: Vec<i64> = a.iter().map(|v| v.wrapping_mul(3)).collect();
    assert_eq!(expected[0], 13510798882111491);
    assert_everywhere(
        &graph,
        &inputs(&[("a", ints(DType::I64, &a))]),
        "y",
        &ints(DType::I64, &expected),
    );
}

#[test]
fn i64_const_keeps_every_bit() {
    // From a graph file, where the value is read as a number: 2^53 + 1 has no f64.
    let text = r#"(
        name: "c",
        inputs: [(name: "x", dtype: "i64", shape: [2])],
        nodes: [
            (name: "c", op: "const", attrs: {"value": 9007199254740993, "dtype": "i64"}),
            (name: "m", op: "const", attrs: {"value": -9223372036854775808, "dtype": "i64"}),
            (name: "y", op: "add", args: ["x", "c"]),
            (name: "z", op: "add", args: ["y", "m"]),
        ],
        outputs: ["y", "z"],
    )"#;
    let graph = fusebox::graph::file::parse(text, "c.ron", &rules().ops)
        .unwrap()
        .0;
    let x = [0i64, 1];
    let feed = inputs(&[("x", ints(DType::I64, &x))]);
    let c = 9007199254740993i64;
    let y: Vec<i64> = x.iter().map(|v| v.wrapping_add(c)).collect();
    assert_eq!(y, vec![9007199254740993, 9007199254740994]);
    assert_everywhere(&graph, &feed, "y", &ints(DType::I64, &y));
    let z: Vec<i64> = y.iter().map(|v| v.wrapping_add(i64::MIN)).collect();
    assert_everywhere(&graph, &feed, "z", &ints(DType::I64, &z));
    // Written back, the value is the same integer.
    let saved = fusebox::graph::file::to_ron(&graph);
    assert!(saved.contains("9007199254740993"), "{saved}");
}

#[test]
fn i32_overflow_wraps_like_numpy() {
    let a = [i32::MAX, i32::MIN, 65537, -46341, 7];
    let b = [1, -1, 65537, 46341, i32::MIN];
    let mut g = GraphBuilder::new("wrap32");
    let x = g.input("a", DType::I32, &[a.len()]);
    let y = g.input("b", DType::I32, &[b.len()]);
    g.op("sum", "add", &[&x, &y]);
    g.op("diff", "sub", &[&x, &y]);
    g.op("prod", "mul", &[&x, &y]);
    g.op("neg", "neg", &[&x]);
    g.op("abs", "abs", &[&y]);
    let graph = g.finish(&["sum", "diff", "prod", "neg", "abs"]);
    let feed = inputs(&[
        ("a", ints(DType::I32, &a.map(i64::from))),
        ("b", ints(DType::I32, &b.map(i64::from))),
    ]);
    let pairs = || a.iter().zip(&b);
    let expect = |values: Vec<i32>| {
        ints(
            DType::I32,
            &values.into_iter().map(i64::from).collect::<Vec<_>>(),
        )
    };
    let sum = expect(pairs().map(|(p, q)| p.wrapping_add(*q)).collect());
    let diff = expect(pairs().map(|(p, q)| p.wrapping_sub(*q)).collect());
    let prod = expect(pairs().map(|(p, q)| p.wrapping_mul(*q)).collect());
    let neg = expect(a.iter().map(|p| p.wrapping_neg()).collect());
    // abs(i32::MIN) is i32::MIN, as in NumPy.
    let abs = expect(b.iter().map(|q| q.wrapping_abs()).collect());
    for (name, expected) in [
        ("sum", &sum),
        ("diff", &diff),
        ("prod", &prod),
        ("neg", &neg),
        ("abs", &abs),
    ] {
        assert_everywhere(&graph, &feed, name, expected);
    }
    assert_eq!(sum.int_values()[0], i64::from(i32::MIN));
    assert_eq!(abs.int_values()[4], i64::from(i32::MIN));
    numpy_agrees(
        "a = np.array([2147483647, -2147483648, 65537, -46341, 7], dtype=np.int32); \
         b = np.array([1, -1, 65537, 46341, -2147483648], dtype=np.int32); \
         print(' '.join(str(v) for v in np.concatenate([a + b, a - b, a * b, -a, np.abs(b)])))",
        [sum, diff, prod, neg, abs]
            .iter()
            .flat_map(|t| t.int_values())
            .collect(),
    );
}

#[test]
fn i64_to_i32_cast_wraps() {
    let a = [(1i64 << 32) + 5, i64::MAX, -(1i64 << 31) - 1, i64::MIN, -5];
    let mut g = GraphBuilder::new("narrow");
    let x = g.input("a", DType::I64, &[a.len()]);
    g.op_with("n", "cast", &[&x], &[("dtype", DType::I32.into())]);
    g.op_with("f", "cast", &[&x], &[("dtype", DType::F64.into())]);
    let back = g.op_with("back", "cast", &["f"], &[("dtype", DType::I64.into())]);
    let graph = g.finish(&["n", &back]);
    let feed = inputs(&[("a", ints(DType::I64, &a))]);
    // NumPy's astype(int32) keeps the low 32 bits.
    let narrowed: Vec<i64> = a.iter().map(|&v| i64::from(v as i32)).collect();
    assert_eq!(narrowed[..3], [5, -1, i64::from(i32::MAX)]);
    assert_everywhere(&graph, &feed, "n", &ints(DType::I32, &narrowed));
    // Through f64 and back: rounded to nearest, then truncated and saturated (2^63 → MAX).
    let round_trip: Vec<i64> = a.iter().map(|&v| (v as f64) as i64).collect();
    assert_everywhere(&graph, &feed, "back", &ints(DType::I64, &round_trip));
    numpy_agrees(
        "a = np.array([4294967301, 9223372036854775807, -2147483649, -9223372036854775808, -5], \
         dtype=np.int64); print(' '.join(str(v) for v in a.astype(np.int32)))",
        narrowed,
    );
}

/// The narrow integers (i8, u8, i16, u16, u32): an i64 cast to each keeps its low bits (and
/// their sign) as NumPy's `astype` does, arithmetic wraps in the dtype, mixed signedness
/// promotes to the signed type holding both, and a float cast truncates and saturates (NaN is
/// 0), on every backend.
#[test]
fn narrow_integers_wrap_promote_and_saturate() {
    let a = [300i64, -1, 65537, -129, i64::MAX, 4294967296 + 7];
    let f = [f64::NAN, -1.5, 255.9, 1e10, -1e10, 70000.25];
    for dtype in [DType::I8, DType::U8, DType::I16, DType::U16, DType::U32] {
        let (lo, hi) = dtype.int_range().unwrap();
        let mut g = GraphBuilder::new("narrow");
        let x = g.input("a", DType::I64, &[a.len()]);
        let y = g.input("f", DType::F64, &[f.len()]);
        let n = g.op_with("n", "cast", &[&x], &[("dtype", dtype.into())]);
        g.op("twice", "add", &[&n, &n]);
        g.op("square", "mul", &[&n, &n]);
        g.op_with("s", "cast", &[&y], &[("dtype", dtype.into())]);
        let graph = g.finish(&["n", "twice", "square", "s"]);
        let feed = inputs(&[
            ("a", ints(DType::I64, &a)),
            (
                "f",
                Tensor::from_values(DType::F64, &[f.len()], f.to_vec()).unwrap(),
            ),
        ]);
        // Two's-complement wrap into [lo, hi]: NumPy's astype.
        let span = (hi - lo) as i128 + 1;
        let wrap = |v: i128| (((v - lo as i128) % span + span) % span + lo as i128) as i64;
        let narrowed: Vec<i64> = a.iter().map(|&v| wrap(v as i128)).collect();
        assert_everywhere(&graph, &feed, "n", &ints(dtype, &narrowed));
        let twice: Vec<i64> = narrowed.iter().map(|&v| wrap(2 * v as i128)).collect();
        assert_everywhere(&graph, &feed, "twice", &ints(dtype, &twice));
        let square: Vec<i64> = narrowed
            .iter()
            .map(|&v| wrap(v as i128 * v as i128))
            .collect();
        assert_everywhere(&graph, &feed, "square", &ints(dtype, &square));
        let saturated: Vec<i64> = f
            .iter()
            .map(|&v| {
                if v.is_nan() {
                    0
                } else {
                    (v.trunc() as i64).clamp(lo, hi)
                }
            })
            .collect();
        assert_everywhere(&graph, &feed, "s", &ints(dtype, &saturated));
    }
    // u8 with i8 meets at i16; u32 with i32 at i64: no value wraps.
    for (a_ty, b_ty, meet) in [
        (DType::U8, DType::I8, DType::I16),
        (DType::U32, DType::I32, DType::I64),
    ] {
        let mut g = GraphBuilder::new("mixed");
        let x = g.input("a", a_ty, &[2]);
        let y = g.input("b", b_ty, &[2]);
        g.op("s", "add", &[&x, &y]);
        let graph = g.finish(&["s"]);
        let (_, a_max) = a_ty.int_range().unwrap();
        let (b_min, _) = b_ty.int_range().unwrap();
        let feed = inputs(&[
            ("a", ints(a_ty, &[a_max, 0])),
            ("b", ints(b_ty, &[-1, b_min])),
        ]);
        assert_everywhere(&graph, &feed, "s", &ints(meet, &[a_max - 1, b_min]));
    }
}

#[test]
fn integer_sum_wraps_in_the_result_dtype() {
    let big = [i64::MAX, 1, (1 << 53) + 1, -(1 << 53)];
    let small = [i32::MAX, i32::MAX, i32::MIN, 3];
    let mut g = GraphBuilder::new("sums");
    let x = g.input("big", DType::I64, &[2, 2]);
    let y = g.input("small", DType::I32, &[2, 2]);
    g.op_with("s64", "sum", &[&x], &[("axes", vec![1].into())]);
    g.op_with("all64", "sum", &[&x], &[]);
    g.op_with("max64", "reduce_max", &[&x], &[("axes", vec![0].into())]);
    g.op_with("s32", "sum", &[&y], &[("axes", vec![0].into())]);
    let graph = g.finish(&["s64", "all64", "max64", "s32"]);
    let feed = inputs(&[
        (
            "big",
            Tensor::from_ints(DType::I64, &[2, 2], big.to_vec()).unwrap(),
        ),
        (
            "small",
            Tensor::from_ints(DType::I32, &[2, 2], small.map(i64::from).to_vec()).unwrap(),
        ),
    ]);
    let rows = vec![big[0].wrapping_add(big[1]), big[2].wrapping_add(big[3])];
    assert_eq!(rows[0], i64::MIN);
    assert_everywhere(&graph, &feed, "s64", &ints(DType::I64, &rows));
    let all = big.iter().fold(0i64, |a, &v| a.wrapping_add(v));
    let all = Tensor::from_ints(DType::I64, &[], vec![all]).unwrap();
    assert_everywhere(&graph, &feed, "all64", &all);
    // Neighbours f64 cannot tell apart are still ordered: max(2^63-1, 2^53+1), max(1, -2^53).
    assert_everywhere(&graph, &feed, "max64", &ints(DType::I64, &[i64::MAX, 1]));
    // i32 sums accumulate into i64 (as NumPy's `sum` of int32 does on 64-bit Linux).
    let cols: Vec<i64> = (0..2)
        .map(|c| i64::from(small[c]) + i64::from(small[2 + c]))
        .collect();
    assert_everywhere(&graph, &feed, "s32", &ints(DType::I64, &cols));
}

#[test]
fn integer_matmul_wraps_in_the_result_dtype() {
    let a = [i32::MAX, 2, -3, i32::MIN];
    let b = [2, i32::MAX, 5, -1];
    let mut g = GraphBuilder::new("mm");
    let x = g.input("a", DType::I32, &[2, 2]);
    let y = g.input("b", DType::I32, &[2, 2]);
    g.op("p", "matmul", &[&x, &y]);
    let graph = g.finish(&["p"]);
    let feed = inputs(&[
        (
            "a",
            Tensor::from_ints(DType::I32, &[2, 2], a.map(i64::from).to_vec()).unwrap(),
        ),
        (
            "b",
            Tensor::from_ints(DType::I32, &[2, 2], b.map(i64::from).to_vec()).unwrap(),
        ),
    ]);
    let mut expected = Vec::new();
    for r in 0..2 {
        for c in 0..2 {
            let dot = (0..2).fold(0i32, |acc, k| {
                acc.wrapping_add(a[r * 2 + k].wrapping_mul(b[k * 2 + c]))
            });
            expected.push(i64::from(dot));
        }
    }
    let expected = Tensor::from_ints(DType::I32, &[2, 2], expected).unwrap();
    assert_everywhere(&graph, &feed, "p", &expected);
}

#[test]
fn integer_comparisons_and_maxima_are_exact_beyond_2_pow_53() {
    let a = [(1i64 << 53) + 1, i64::MAX, -(1 << 53) - 1];
    let b = [1i64 << 53, i64::MAX - 1, -(1 << 53)];
    let mut g = GraphBuilder::new("cmp");
    let x = g.input("a", DType::I64, &[3]);
    let y = g.input("b", DType::I64, &[3]);
    let gt = g.op("gt", "gt", &[&x, &y]);
    g.op("m", "max", &[&x, &y]);
    g.op("w", "where", &[&gt, &y, &x]);
    g.op_with("c", "clamp", &[&x], &[("max", 9007199254740992.0.into())]);
    let graph = g.finish(&["gt", "m", "w", "c"]);
    let feed = inputs(&[("a", ints(DType::I64, &a)), ("b", ints(DType::I64, &b))]);
    let truth: Vec<i64> = a.iter().zip(&b).map(|(p, q)| i64::from(p > q)).collect();
    assert_eq!(truth, vec![1, 1, 0]);
    assert_everywhere(&graph, &feed, "gt", &ints(DType::Bool, &truth));
    let maxima: Vec<i64> = a.iter().zip(&b).map(|(p, q)| *p.max(q)).collect();
    assert_everywhere(&graph, &feed, "m", &ints(DType::I64, &maxima));
    let chosen: Vec<i64> = a
        .iter()
        .zip(&b)
        .map(|(p, q)| if p > q { *q } else { *p })
        .collect();
    assert_everywhere(&graph, &feed, "w", &ints(DType::I64, &chosen));
    let clamped: Vec<i64> = a.iter().map(|p| *p.min(&(1 << 53))).collect();
    assert_everywhere(&graph, &feed, "c", &ints(DType::I64, &clamped));
}

/// Where NumPy is installed, `script` (with `np` imported) prints the same integers.
fn numpy_agrees(script: &str, expected: Vec<i64>) {
    let numpy = std::process::Command::new("python3")
        .args(["-c", &format!("import numpy as np; {script}")])
        .output();
    let Ok(out) = numpy else {
        eprintln!("skipped the NumPy comparison: no python3");
        return;
    };
    if !out.status.success() {
        eprintln!(
            "skipped the NumPy comparison: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let printed: Vec<i64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(printed, expected, "NumPy disagrees");
}
