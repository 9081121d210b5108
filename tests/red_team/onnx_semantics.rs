//! ONNX semantics under attack (issue 40): constant folding bounded by size, integer ops exact
//! or refused, output names kept and double definitions refused, and op-table Maps the
//! importer would ignore refused where they are written.
//!
//! The models are built here with `onnx_protobuf`, so these tests need no Python; the integer
//! expectations are ONNX's (NumPy's) integer arithmetic written out in Rust: wrapping `+ - *`,
//! truncating division, exact wrapping powers.

use super::*;
use fusebox::dtype::DType;
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    ValueInfoProto,
};

// ------------------------------------------------------------------ model building

fn onnx_code(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 1,
        DType::I32 => 6,
        DType::I64 => 7,
        DType::F64 => 11,
        other => panic!("no code for {other}"),
    }
}

fn info(name: &str, dtype: DType, dims: Option<&[i64]>) -> ValueInfoProto {
    crate::common::onnx_models::value_info(name, onnx_code(dtype), dims)
}

/// An integer or float tensor (`values` as i64 for integer dtypes, else as f32 bits' value).
fn tensor(name: &str, dtype: DType, dims: &[i64], values: &[i64]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.data_type = onnx_code(dtype);
    t.dims = dims.to_vec();
    match dtype {
        DType::I64 => t.int64_data = values.to_vec(),
        DType::I32 => t.int32_data = values.iter().map(|&v| v as i32).collect(),
        DType::F32 => t.float_data = values.iter().map(|&v| v as f32).collect(),
        other => panic!("no data for {other}"),
    }
    t
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    let mut n = NodeProto::new();
    n.op_type = op.into();
    n.name = format!("{op}:{}", outputs.first().copied().unwrap_or(""));
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = outputs.iter().map(|s| s.to_string()).collect();
    n.attribute = attrs;
    n
}

fn int_attr(name: &str, value: i64) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INT.into();
    a.i = value;
    a
}

fn tensor_attr(name: &str, t: TensorProto) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::TENSOR.into();
    a.t = Some(t).into();
    a
}

/// A `Constant` node writing `out`.
fn constant(out: &str, dtype: DType, dims: &[i64], values: &[i64]) -> NodeProto {
    node(
        "Constant",
        &[],
        &[out],
        vec![tensor_attr("value", tensor(out, dtype, dims, values))],
    )
}

fn model(
    inputs: Vec<ValueInfoProto>,
    initializers: Vec<TensorProto>,
    nodes: Vec<NodeProto>,
    outputs: Vec<ValueInfoProto>,
) -> ModelProto {
    let mut graph = GraphProto::new();
    graph.name = "m".into();
    graph.input = inputs;
    graph.initializer = initializers;
    graph.node = nodes;
    graph.output = outputs;
    let mut model = ModelProto::new();
    model.ir_version = 8;
    let mut opset = OperatorSetIdProto::new();
    opset.version = 17;
    model.opset_import.push(opset);
    model.graph = Some(graph).into();
    model
}

fn save(dir: &Path, file: &str, m: &ModelProto) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, m.write_to_bytes().unwrap()).unwrap();
    path
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

// ------------------------------------------------------------------ (1) folding bounded by size

/// `ConstantOfShape(dims)` filled with `fill` (a one-element tensor of `dtype`).
fn constant_of_shape(out: &str, dims: &[i64], dtype: DType, fill: i64) -> Vec<NodeProto> {
    let shape = format!("{out}.shape");
    vec![
        constant(&shape, DType::I64, &[dims.len() as i64], dims),
        node(
            "ConstantOfShape",
            &[&shape],
            &[out],
            vec![tensor_attr("value", tensor("v", dtype, &[1], &[fill]))],
        ),
    ]
}

/// The issue's 1 KB model, `ConstantOfShape [16384, 16384] -> Exp -> ReduceSum`, and chains
/// of generated ops over constants too big to fold (Expand, Add, Mul, Neg, Cast, Transpose,
/// Reshape, Sum): every one imports under a 1 GiB memory limit, because import leaves values
/// over the folding limit to run time instead of allocating them; and where it runs, the
/// example's value is exp(0) * 16384 * 16384 (the CPU backend fuses the broadcast constant
/// into its kernel), or the run is refused with an error naming the size.
#[test]
fn constant_folding_never_allocates_past_its_limit() {
    let dir = scratch("onnx-fold-bound");
    let big = |dims: &[i64]| {
        let mut nodes = constant_of_shape("z", dims, DType::F32, 0);
        nodes.push(node("Exp", &["z"], &["e"], vec![]));
        nodes.push(node(
            "ReduceSum",
            &["e"],
            &["y"],
            vec![int_attr("keepdims", 0)],
        ));
        model(vec![], vec![], nodes, vec![info("y", DType::F32, None)])
    };
    let path = save(&dir, "big.onnx", &big(&[16384, 16384]));
    let out = with_memory_limit(
        &["check", path.to_str().unwrap()],
        &dir,
        1024,
        "big constant",
    );
    assert!(
        held(&out, "check big.onnx"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout(&out).contains("broadcast_to"), "{}", stdout(&out));
    for backend in ["cpu", "reference"] {
        let dest = dir.join(format!("out-{backend}"));
        let out = with_memory_limit(
            &[
                "run",
                "big.onnx",
                "--backend",
                backend,
                "--out",
                dest.to_str().unwrap(),
            ],
            &dir,
            1024,
            backend,
        );
        if held(&out, &format!("run big.onnx on {backend}")) {
            let y = Tensor::read_npy(&dest.join("y.npy")).unwrap();
            assert_eq!(y.values(), vec![16384.0 * 16384.0], "{backend}");
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("bytes") || err.contains("elements"), "{err}");
        }
    }
    // A size past the limit that every backend runs: the sum is exact.
    let path = save(&dir, "mid.onnx", &big(&[2048, 1024]));
    for backend in ["cpu", "reference"] {
        let dest = dir.join(format!("mid-{backend}"));
        let out = fusebox(
            &[
                "run",
                path.to_str().unwrap(),
                "--backend",
                backend,
                "--out",
                dest.to_str().unwrap(),
            ],
            &dir,
        );
        assert!(
            held(&out, "mid"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let y = Tensor::read_npy(&dest.join("y.npy")).unwrap();
        assert_eq!(y.values(), vec![2048.0 * 1024.0], "{backend}");
    }
    // Generated chains over big constants: import (check) stays within the memory limit.
    let mut rng = Seeded(401);
    for case in 0..12 {
        let dtype = *rng.pick(&[DType::F32, DType::I64, DType::I32]);
        let rows = *rng.pick(&[4096i64, 8192, 16384]);
        let mut nodes = constant_of_shape("c0", &[rows, 1, 4096], dtype, 3);
        let mut last = "c0".to_string();
        let mut shape = vec![rows, 1, 4096];
        for step in 0..4 {
            let next = format!("c{}", step + 1);
            let n = match rng.next() % 7 {
                0 => {
                    let target = format!("{next}.shape");
                    shape[1] = 4;
                    nodes.push(constant(&target, DType::I64, &[3], &shape));
                    node("Expand", &[&last, &target], &[&next], vec![])
                }
                1 => node("Add", &[&last, &last], &[&next], vec![]),
                2 => node("Mul", &[&last, &last], &[&next], vec![]),
                3 => node("Neg", &[&last], &[&next], vec![]),
                4 => node("Sum", &[&last, &last, &last], &[&next], vec![]),
                5 => {
                    let target = format!("{next}.shape");
                    nodes.push(constant(&target, DType::I64, &[2], &[-1, 4096]));
                    shape = vec![shape.iter().product::<i64>() / 4096, 1, 4096];
                    let flat = format!("{next}.flat");
                    nodes.push(node("Reshape", &[&last, &target], &[&flat], vec![]));
                    let back = format!("{next}.back");
                    nodes.push(constant(&back, DType::I64, &[3], &shape));
                    node("Reshape", &[&flat, &back], &[&next], vec![])
                }
                _ => node("Abs", &[&last], &[&next], vec![]),
            };
            nodes.push(n);
            last = next;
        }
        nodes.push(node(
            "ReduceMax",
            &[&last],
            &["y"],
            vec![int_attr("keepdims", 0)],
        ));
        let m = model(vec![], vec![], nodes, vec![info("y", dtype, None)]);
        let file = format!("chain{case}.onnx");
        save(&dir, &file, &m);
        let out = with_memory_limit(&["check", &file], &dir, 1024, &file);
        assert!(
            held(&out, &format!("chain {case} ({dtype})")),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The limit itself: a ConstantOfShape of exactly `FOLD_LIMIT` elements folds into a stored
/// constant; one element more becomes a `const` broadcast at run time, with the same values.
#[test]
fn constants_fold_up_to_the_folding_limit_and_no_further() {
    let rules = fusebox::rules::RuleSet::defaults();
    let limit = fusebox::onnx::FOLD_LIMIT as i64;
    for (rows, folded) in [(limit / 2, true), (limit / 2 + 1, false)] {
        let mut nodes = constant_of_shape("z", &[rows, 2], DType::I64, -7);
        nodes.push(node("Neg", &["z"], &["y"], vec![]));
        let m = model(vec![], vec![], nodes, vec![info("y", DType::I64, None)]);
        let imported = fusebox::onnx::import_model(
            &m,
            "m.onnx",
            None,
            &rules.ops,
            &rules.onnx,
            &Default::default(),
        )
        .unwrap();
        let ops: Vec<&str> = imported.graph.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(
            !ops.contains(&"broadcast_to"),
            folded,
            "{rows} rows: {ops:?}"
        );
        let dir = scratch(&format!("onnx-fold-limit-{rows}"));
        let path = save(&dir, "m.onnx", &m);
        let out = fusebox(
            &[
                "run",
                path.to_str().unwrap(),
                "--backend",
                "reference",
                "--out",
                "o",
            ],
            &dir,
        );
        assert!(
            held(&out, "run"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let y = Tensor::read_npy(&dir.join("o/y.npy")).unwrap();
        assert_eq!(y.shape(), [rows as usize, 2]);
        assert!(y.int_values().iter().all(|&v| v == 7));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ------------------------------------------------------------------ (2) integer semantics

/// Edge values per dtype: 0, ±1, small values whose quotients truncate, the extremes.
fn edges(dtype: DType) -> Vec<i64> {
    let mut v = vec![0, 1, -1, 7, -7, 3, -3, 2];
    match dtype {
        DType::I32 => v.extend([i32::MAX as i64, i32::MIN as i64, 65536]),
        // i64 values stay within what an ONNX tensor round-trips exactly (±2^53 and the
        // extremes, which saturate back to themselves).
        _ => v.extend([i64::MAX, i64::MIN, 1 << 40, -(1 << 53)]),
    }
    v
}

fn wrap(dtype: DType, v: i64) -> i64 {
    fusebox::tensor::wrap_int(dtype, v)
}

/// ONNX's (NumPy's) value of a binary integer op; `None` where the spec leaves it undefined
/// (fusebox's own definition is then checked separately).
fn expected_binary(op: &str, dtype: DType, x: i64, y: i64) -> Option<i64> {
    Some(match op {
        "Add" => wrap(dtype, x.wrapping_add(y)),
        "Sub" => wrap(dtype, x.wrapping_sub(y)),
        "Mul" => wrap(dtype, x.wrapping_mul(y)),
        "Max" => x.max(y),
        "Min" => x.min(y),
        "Div" => {
            if y == 0 {
                return None;
            }
            let q = x.checked_div(y)?;
            if wrap(dtype, q) != q {
                return None;
            }
            q
        }
        // Python's `%`, the divisor's sign; `x mod 0` is 0 (NumPy's), `MIN mod -1` is 0.
        "Mod" => match (y, x.checked_rem(y).unwrap_or(0)) {
            (0, _) => 0,
            (y, r) if r != 0 && (r < 0) != (y < 0) => r + y,
            (_, r) => r,
        },
        "Pow" => {
            let mut r: i64 = 1;
            for _ in 0..u32::try_from(y).ok()? {
                r = r.wrapping_mul(x);
            }
            wrap(dtype, r)
        }
        other => panic!("{other}"),
    })
}

/// fusebox's definition where ONNX leaves integer division undefined: the real quotient
/// saturated to the dtype (x / 0 by x's sign, 0 / 0 = 0).
fn defined_division(dtype: DType, x: i64, y: i64) -> i64 {
    let (min, max) = match dtype {
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    };
    match (x, y) {
        (0, 0) => 0,
        (x, 0) => {
            if x > 0 {
                max
            } else {
                min
            }
        }
        (x, y) => x.checked_div(y).unwrap_or(max).clamp(min, max),
    }
}

const BINARY: [&str; 7] = ["Add", "Sub", "Mul", "Max", "Min", "Div", "Mod"];
const UNARY: [&str; 5] = ["Neg", "Abs", "ReduceSum", "ReduceMax", "ReduceMin"];
/// Exponents for Pow: non-negative, including ones that overflow every dtype.
const EXPONENTS: [i64; 8] = [0, 1, 2, 3, 31, 33, 63, 64];

fn expected_unary(op: &str, dtype: DType, a: &[i64]) -> Vec<i64> {
    match op {
        "Neg" => a.iter().map(|&x| wrap(dtype, x.wrapping_neg())).collect(),
        "Abs" => a.iter().map(|&x| wrap(dtype, x.wrapping_abs())).collect(),
        "ReduceSum" => vec![wrap(dtype, a.iter().fold(0i64, |s, &x| s.wrapping_add(x)))],
        "ReduceMax" => vec![*a.iter().max().unwrap()],
        "ReduceMin" => vec![*a.iter().min().unwrap()],
        other => panic!("{other}"),
    }
}

/// Builds one model computing every exact op on `a` and `b` (and Pow on `a` and `e`): with
/// `folded`, a, b and e are Constant nodes (so import folds everything); else graph inputs.
/// Division by i64 at run time has no exact catalogue form, so it is left out there (its
/// refusal is checked on its own).
fn integer_model(
    dtype: DType,
    a: &[i64],
    b: &[i64],
    e: &[i64],
    folded: bool,
) -> (ModelProto, Vec<String>) {
    let n = a.len() as i64;
    let mut inputs = Vec::new();
    let mut nodes = Vec::new();
    for (name, values) in [("a", a), ("b", b), ("e", e)] {
        if name == "e" && !folded {
            continue;
        }
        if folded {
            nodes.push(constant(name, dtype, &[n], values));
        } else {
            inputs.push(info(name, dtype, Some(&[n])));
        }
    }
    let mut outputs = Vec::new();
    let mut names = Vec::new();
    let run_time_pow_and_i64_div = !folded;
    for op in BINARY {
        if run_time_pow_and_i64_div && matches!(op, "Div" | "Mod") && dtype == DType::I64 {
            continue;
        }
        let y = format!("y_{op}");
        nodes.push(node(op, &["a", "b"], &[&y], vec![]));
        outputs.push(info(&y, dtype, None));
        names.push(y);
    }
    if folded {
        nodes.push(node("Pow", &["a", "e"], &["y_Pow"], vec![]));
        outputs.push(info("y_Pow", dtype, None));
        names.push("y_Pow".into());
    }
    for op in UNARY {
        let y = format!("y_{op}");
        let attrs = if op.starts_with("Reduce") {
            vec![int_attr("keepdims", 0)]
        } else {
            vec![]
        };
        nodes.push(node(op, &["a"], &[&y], attrs));
        outputs.push(info(&y, dtype, None));
        names.push(y);
    }
    (model(inputs, vec![], nodes, outputs), names)
}

/// Every integer op the importer maps, on i32 and i64, over every pair of edge values (0, ±1,
/// truncating quotients, the extremes), folded at import and computed at run time on the
/// reference and CPU backends: each result has the input's dtype and ONNX's exact value
/// (wrapping sums and products, truncating division, exact powers); where ONNX leaves Div
/// undefined (x / 0, MIN / -1) the result is fusebox's documented saturation. The integer
/// forms fusebox cannot compute exactly at run time (i64 Div and Mod, Pow) are refused, naming the
/// node and op, as is a negative integer exponent even on constants.
#[test]
fn onnx_integer_ops_are_exact_or_refused() {
    let dir = scratch("onnx-integers");
    for dtype in [DType::I32, DType::I64] {
        let values = edges(dtype);
        let a: Vec<i64> = values
            .iter()
            .flat_map(|&x| values.iter().map(move |_| x))
            .collect();
        let b: Vec<i64> = values.iter().flat_map(|_| values.iter().copied()).collect();
        let e: Vec<i64> = (0..a.len())
            .map(|i| EXPONENTS[i % EXPONENTS.len()])
            .collect();
        let tag = dtype.name();
        let write = |name: &str, v: &[i64]| {
            let path = dir.join(format!("{name}_{tag}.npy"));
            Tensor::from_ints(dtype, &[v.len()], v.to_vec())
                .unwrap()
                .write_npy(&path)
                .unwrap();
            format!("{name}={}", path.display())
        };
        let feeds = [write("a", &a), write("b", &b)];
        for (folded, backends) in [
            (true, &["reference"][..]),
            (false, &["reference", "cpu"][..]),
        ] {
            let (m, names) = integer_model(dtype, &a, &b, &e, folded);
            let file = format!("int_{tag}_{folded}.onnx");
            save(&dir, &file, &m);
            for backend in backends {
                let dest = format!("out_{tag}_{folded}_{backend}");
                let mut args = vec!["run", &file, "--backend", backend, "--out", &dest];
                if !folded {
                    args.extend(["--input", &feeds[0], "--input", &feeds[1]]);
                }
                let out = fusebox(&args, &dir);
                let case = format!("{tag}, folded {folded}, {backend}");
                assert!(
                    held(&out, &case),
                    "{case}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                for name in &names {
                    let y = Tensor::read_npy(&dir.join(&dest).join(format!("{name}.npy"))).unwrap();
                    assert_eq!(y.dtype, dtype, "{case}: {name}");
                    let got = y.int_values();
                    let op = &name[2..];
                    let want: Vec<i64> = if op == "Pow" {
                        a.iter()
                            .zip(&e)
                            .map(|(&x, &k)| expected_binary(op, dtype, x, k).unwrap())
                            .collect()
                    } else if BINARY.contains(&op) {
                        a.iter()
                            .zip(&b)
                            .map(|(&x, &y)| {
                                expected_binary(op, dtype, x, y)
                                    .unwrap_or_else(|| defined_division(dtype, x, y))
                            })
                            .collect()
                    } else {
                        expected_unary(op, dtype, &a)
                    };
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g,
                            w,
                            "{case}: {op}({}, {}) is {g}, ONNX gives {w}",
                            a[i.min(a.len() - 1)],
                            b[i.min(b.len() - 1)]
                        );
                    }
                    assert_eq!(got.len(), want.len(), "{case}: {op}");
                }
            }
        }
        // The run-time forms without an exact catalogue expression are refused at import,
        // naming the node and the op.
        let mut refusals = vec![("Pow", "b")];
        if dtype == DType::I64 {
            refusals.extend([("Div", "b"), ("Mod", "b")]);
        }
        for (op, second) in refusals {
            let n = a.len() as i64;
            let m = model(
                vec![
                    info("a", dtype, Some(&[n])),
                    info(second, dtype, Some(&[n])),
                ],
                vec![],
                vec![node(op, &["a", second], &["y"], vec![])],
                vec![info("y", dtype, None)],
            );
            let file = format!("refused_{op}_{tag}.onnx");
            save(&dir, &file, &m);
            let err = refused(&fusebox(&["check", &file], &dir), &file);
            // A protobuf model has no lines: the file is named bare, the node with its op type.
            assert!(
                err.contains(&format!("{file}: node `{op}:y` ({op}): ")),
                "{err}"
            );
        }
        // A negative exponent has no integer value, even on constants.
        let m = model(
            vec![],
            vec![],
            vec![
                constant("a", dtype, &[1], &[2]),
                constant("k", dtype, &[1], &[-1]),
                node("Pow", &["a", "k"], &["y"], vec![]),
            ],
            vec![info("y", dtype, None)],
        );
        let file = format!("negative_power_{tag}.onnx");
        save(&dir, &file, &m);
        let err = refused(&fusebox(&["check", &file], &dir), &file);
        assert!(err.contains("negative power"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// TorchScript's `chunk()` computes slice bounds by integer Div on shapes: 14 / 3 must be 4,
/// so `(14 / 3) * 2` bounds a slice of 8 rows (as a float quotient it was 9.33 and 9 rows).
#[test]
fn slice_bounds_from_integer_division_are_exact() {
    let rules = fusebox::rules::RuleSet::defaults();
    let m = model(
        vec![info("x", DType::F32, Some(&[14, 4]))],
        vec![],
        vec![
            node("Shape", &["x"], &["s"], vec![]),
            constant("zero", DType::I64, &[], &[0]),
            node("Gather", &["s", "zero"], &["rows"], vec![]),
            constant("three", DType::I64, &[], &[3]),
            node("Div", &["rows", "three"], &["chunk"], vec![]),
            constant("two", DType::I64, &[], &[2]),
            node("Mul", &["chunk", "two"], &["end"], vec![]),
            constant("axes", DType::I64, &[1], &[0]),
            node("Unsqueeze", &["end", "axes"], &["ends"], vec![]),
            constant("starts", DType::I64, &[1], &[0]),
            node("Slice", &["x", "starts", "ends"], &["y"], vec![]),
        ],
        vec![info("y", DType::F32, None)],
    );
    let imported = fusebox::onnx::import_model(
        &m,
        "chunk.onnx",
        None,
        &rules.ops,
        &rules.onnx,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(imported.types["y"].shape, [8, 4]);
}

// ------------------------------------------------------------------ (3) output names

/// Outputs that are an initializer, a Constant's value, a folded constant or an Identity of an
/// input are written under their ONNX names by `run --out` (no `w_1.npy`), and `import` names
/// them so in graph.ron.
#[test]
fn onnx_outputs_keep_their_names() {
    let dir = scratch("onnx-output-names");
    let m = model(
        vec![info("x", DType::F32, Some(&[2]))],
        vec![tensor("w", DType::F32, &[2], &[1, 2])],
        vec![
            node("Add", &["x", "w"], &["y"], vec![]),
            constant("c", DType::F32, &[2], &[5, 6]),
            node("Neg", &["c"], &["folded"], vec![]),
            node("Identity", &["x"], &["same"], vec![]),
        ],
        vec![
            info("y", DType::F32, None),
            info("w", DType::F32, None),
            info("c", DType::F32, None),
            info("folded", DType::F32, None),
            info("same", DType::F32, None),
        ],
    );
    let path = save(&dir, "names.onnx", &m);
    let out = fusebox(
        &[
            "run",
            path.to_str().unwrap(),
            "--backend",
            "cpu",
            "--random-inputs",
            "--out",
            "o",
        ],
        &dir,
    );
    assert!(
        held(&out, "run"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut written: Vec<String> = std::fs::read_dir(dir.join("o"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    written.sort();
    assert_eq!(
        written,
        ["c.npy", "folded.npy", "same.npy", "w.npy", "y.npy"]
    );
    assert_eq!(
        Tensor::read_npy(&dir.join("o/w.npy")).unwrap().values(),
        [1.0, 2.0]
    );
    assert_eq!(
        Tensor::read_npy(&dir.join("o/folded.npy"))
            .unwrap()
            .values(),
        [-5.0, -6.0]
    );
    let out = fusebox(
        &["import", path.to_str().unwrap(), "--out", "imported"],
        &dir,
    );
    assert!(
        held(&out, "import"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graph = std::fs::read_to_string(dir.join("imported/graph.ron")).unwrap();
    assert!(
        graph.contains(r#"outputs: ["y", "w", "c", "folded", "same"]"#),
        "{graph}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A value name defined twice, in every combination of definitions (two nodes, a node and an
/// initializer, a node and a graph input, two initializers, two inputs), at generated
/// positions: refused, naming the model file and both definitions. (An input that is also an
/// initializer is not a double definition: the initializer is its default.)
#[test]
fn a_value_defined_twice_in_a_model_is_refused() {
    let dir = scratch("onnx-double-definition");
    let mut rng = Seeded(403);
    let kinds = ["node", "initializer", "input"];
    for case in 0..15 {
        let first = *rng.pick(&kinds);
        let second = *rng.pick(&["node", "node", first]);
        let name = *rng.pick(&["y", "w", "h", "/layer/Add_output_0"]);
        let mut inputs = vec![info("x", DType::F32, Some(&[2]))];
        let mut inits = vec![];
        let mut nodes = vec![node("Relu", &["x"], &["r"], vec![])];
        let mut described = Vec::new();
        for (k, kind) in [first, second].into_iter().enumerate() {
            match kind {
                "node" => {
                    let op = ["Neg", "Abs"][k];
                    nodes.push(node(op, &["r"], &[name], vec![]));
                    described.push(format!("{op} node `{op}:{name}`"));
                }
                "initializer" => {
                    inits.push(tensor(name, DType::F32, &[2], &[1, 2]));
                    described.push(format!("initializer `{name}`"));
                }
                _ => {
                    inputs.push(info(name, DType::F32, Some(&[2])));
                    described.push(format!("graph input `{name}`"));
                }
            }
        }
        if [first, second] == ["initializer", "input"]
            || [first, second] == ["input", "initializer"]
        {
            continue;
        }
        nodes.push(node("Add", &["r", name], &["out"], vec![]));
        let m = model(inputs, inits, nodes, vec![info("out", DType::F32, None)]);
        let file = format!("twice{case}.onnx");
        save(&dir, &file, &m);
        for command in ["check", "run"] {
            let mut args = vec![command, file.as_str()];
            if command == "run" {
                args.extend(["--backend", "reference", "--random-inputs", "--out", "o"]);
            }
            let err = refused(
                &fusebox(&args, &dir),
                &format!("{file}: {first} then {second}"),
            );
            assert!(
                err.contains(&file) && err.contains("defined twice"),
                "{err}"
            );
            for d in &described {
                assert!(
                    err.contains(d.as_str()),
                    "{first} then {second}: {d} in {err}"
                );
            }
            assert!(!dir.join("o").exists());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------ (4) the op table

/// A rule directory's onnx.ron with a Map for an op type the importer handles in code (every
/// one of them, at generated places in the table) is refused when it loads, at that Map's
/// `onnx` field, saying the importer handles the op itself; likewise a dtype condition that
/// names no dtype.
#[test]
fn a_map_the_importer_would_ignore_is_refused_where_it_is_written() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read_to_string(repo.join("rules/onnx.ron")).unwrap();
    let dir = scratch("onnx-structural-map");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    for file in [
        "ops.ron",
        "fusion.ron",
        "amp.ron",
        "cost.ron",
        "gradients.ron",
    ] {
        std::fs::copy(repo.join("rules").join(file), rules.join(file)).unwrap();
    }
    let anchors: Vec<&str> = shipped
        .lines()
        .filter(|l| l.trim_start().starts_with("Map(onnx:"))
        .collect();
    let mut rng = Seeded(404);
    for op in fusebox::onnx::STRUCTURAL {
        let anchor = *rng.pick(&anchors);
        let map = format!(r#"    Map(onnx: "{op}", nodes: [Node(op: "neg", args: ["$0"])]),"#);
        let text = shipped.replacen(anchor, &format!("{map}\n{anchor}"), 1);
        let line = text.lines().position(|l| l == map).unwrap() + 1;
        std::fs::write(rules.join("onnx.ron"), &text).unwrap();
        let err = refused(
            &fusebox(&["check-rules", "--rules", rules.to_str().unwrap()], &dir),
            op,
        );
        assert!(
            err.contains(&format!("onnx.ron:{line}:"))
                && err.contains("handled by the importer itself"),
            "{op} at line {line}: {err}"
        );
    }
    let text = shipped.replacen(
        r#"Map(onnx: "Add", "#,
        r#"Map(onnx: "Add", when: {"$0.dtype": "int"}, "#,
        1,
    );
    std::fs::write(rules.join("onnx.ron"), &text).unwrap();
    let err = refused(
        &fusebox(&["check-rules", "--rules", rules.to_str().unwrap()], &dir),
        "dtype condition",
    );
    assert!(
        err.contains("onnx.ron:") && err.contains("must name a dtype"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `int64` tensors in a model (initializers, in `int64_data` and in `raw_data`, and
/// `Constant` values) are read as the integers they are: values beyond 2^53, `i64::MIN` and
/// `i64::MAX` come out of `import` and `run` bit for bit (they once went through f64 and
/// came out rounded).
#[test]
fn onnx_int64_tensors_are_read_exactly() {
    let dir = scratch("onnx-int64-exact");
    let values = [(1i64 << 53) + 1, i64::MIN, i64::MAX, -(1i64 << 62) - 3];
    let mut raw = tensor("r", DType::I64, &[4], &[]);
    raw.int64_data.clear();
    raw.raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let m = model(
        vec![info("x", DType::I64, Some(&[4]))],
        vec![tensor("w", DType::I64, &[4], &values), raw],
        vec![
            constant("c", DType::I64, &[4], &values),
            node("Add", &["x", "w"], &["yw"], vec![]),
            node("Add", &["x", "r"], &["yr"], vec![]),
            node("Add", &["x", "c"], &["yc"], vec![]),
        ],
        vec![
            info("yw", DType::I64, None),
            info("yr", DType::I64, None),
            info("yc", DType::I64, None),
        ],
    );
    let path = save(&dir, "ints.onnx", &m);
    Tensor::from_ints(DType::I64, &[4], vec![0; 4])
        .unwrap()
        .write_npy(&dir.join("zeros.npy"))
        .unwrap();
    for backend in ["reference", "cpu"] {
        let out = fusebox(
            &[
                "run",
                path.to_str().unwrap(),
                "--backend",
                backend,
                "--input",
                "x=zeros.npy",
                "--out",
                backend,
            ],
            &dir,
        );
        assert!(
            held(&out, backend),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for y in ["yw", "yr", "yc"] {
            let got = Tensor::read_npy(&dir.join(backend).join(format!("{y}.npy"))).unwrap();
            assert_eq!(got.int_values(), values, "{backend}: {y}");
        }
    }
    let out = fusebox(
        &["import", path.to_str().unwrap(), "--out", "imported"],
        &dir,
    );
    assert!(
        held(&out, "import"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for weight in ["w", "r"] {
        let got = Tensor::read_npy(&dir.join(format!("imported/{weight}.npy"))).unwrap();
        assert_eq!(got.int_values(), values, "imported {weight}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model whose op table maps an ONNX op to a large composite is bounded as a whole: each
/// use may fit (2^16 ops), but the uses together may not take the imported graph past the
/// expanded-graph limit (2^18 nodes). Four `Relu`s import; a fifth is refused at its node,
/// quickly, naming the composite chain.
#[test]
fn composite_uses_in_a_model_are_bounded_as_a_whole() {
    let dir = scratch("onnx-composite-uses");
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(
        dir.join("rules/ops.ron"),
        super::amplification::chained_composites(&[2; 16]),
    )
    .unwrap();
    std::fs::write(
        dir.join("rules/onnx.ron"),
        "[Map(onnx: \"Relu\", nodes: [Node(op: \"c16\", args: [\"$0\"])])]\n",
    )
    .unwrap();
    for (uses, fits) in [(4, true), (5, false)] {
        let mut nodes = Vec::new();
        for k in 0..uses {
            let input = if k == 0 {
                "x".to_string()
            } else {
                format!("r{}", k - 1)
            };
            let output = format!("r{k}");
            nodes.push(node("Relu", &[&input], &[&output], vec![]));
        }
        let last = format!("r{}", uses - 1);
        let m = model(
            vec![info("x", DType::F32, Some(&[8]))],
            vec![],
            nodes,
            vec![info(&last, DType::F32, None)],
        );
        let path = save(&dir, &format!("uses{uses}.onnx"), &m);
        let started = std::time::Instant::now();
        let out = fusebox(&["check", path.to_str().unwrap(), "--rules", "rules"], &dir);
        assert!(
            started.elapsed().as_secs() < 60,
            "{uses} uses took {:?}",
            started.elapsed()
        );
        if fits {
            assert!(
                held(&out, "fits"),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            let stderr = refused(&out, "too many uses");
            assert!(stderr.contains("uses5.onnx"), "{stderr}");
            assert!(stderr.contains("(c16 → c15 → "), "{stderr}");
            assert!(stderr.contains("more than 262144 nodes"), "{stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The op types this importer writes in code for run-time indices, recurrence and positions
/// (Gather, GatherElements, LSTM, GRU, RNN, ArgMax, ArgMin, OneHot, Tile, Trilu), each given
/// what a hostile model can: axes out of range, misshapen operands, negative or enormous
/// sizes, a sequence too long to unroll, an empty axis to take a position in. Each is refused
/// by `fusebox check` with an error that names the node and its op (exit 1, no panic), and
/// the well-formed form of each op imports.
#[test]
fn ops_written_in_code_refuse_hostile_models_at_their_node() {
    let dir = scratch("onnx-hostile-new-ops");
    let f = DType::F32;
    let i = DType::I64;
    let int = |name: &str, v: i64| int_attr(name, v);
    // (case, inputs, initializers, node, output dims), one node named `n` writing `y`.
    type Case = (
        &'static str,
        Vec<ValueInfoProto>,
        Vec<TensorProto>,
        NodeProto,
    );
    let x = |dims: &[i64]| info("x", f, Some(dims));
    let ids = |dims: &[i64], values: &[i64]| tensor("ids", i, dims, values);
    let weight = |name: &str, dims: &[i64]| {
        let n: i64 = dims.iter().product();
        tensor(name, f, dims, &vec![0; n as usize])
    };
    let named = |mut n: NodeProto| {
        n.name = "n".into();
        n
    };
    let cases: Vec<(Case, bool)> = vec![
        (
            (
                "gather",
                vec![x(&[4, 3])],
                vec![ids(&[2], &[0, -3])],
                node("Gather", &["x", "ids"], &["y"], vec![int("axis", 1)]),
            ),
            true,
        ),
        // Out of range is defined (the fill), for constant indices as for run-time ones.
        (
            (
                "gather out of range",
                vec![x(&[4, 3])],
                vec![ids(&[2], &[0, 3])],
                node("Gather", &["x", "ids"], &["y"], vec![int("axis", 1)]),
            ),
            true,
        ),
        (
            (
                "gather empty axis",
                vec![x(&[4, 0])],
                vec![ids(&[1], &[0])],
                node("Gather", &["x", "ids"], &["y"], vec![int("axis", 1)]),
            ),
            true,
        ),
        (
            (
                "gather axis",
                vec![x(&[4, 3])],
                vec![ids(&[2], &[0, 3])],
                node("Gather", &["x", "ids"], &["y"], vec![int("axis", 5)]),
            ),
            false,
        ),
        (
            (
                "gather float ids",
                vec![x(&[4, 3]), info("ids", f, Some(&[2]))],
                vec![],
                node("Gather", &["x", "ids"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "gather_elements rank",
                vec![x(&[4, 3])],
                vec![ids(&[2], &[0, 1])],
                node("GatherElements", &["x", "ids"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "gather_elements wider",
                vec![x(&[4, 3])],
                vec![ids(&[2, 5], &[0; 10])],
                node("GatherElements", &["x", "ids"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "lstm",
                vec![x(&[3, 1, 2])],
                vec![weight("w", &[1, 8, 2]), weight("r", &[1, 8, 2])],
                node(
                    "LSTM",
                    &["x", "w", "r"],
                    &["y"],
                    vec![int("hidden_size", 2)],
                ),
            ),
            true,
        ),
        (
            (
                "lstm hidden",
                vec![x(&[3, 1, 2])],
                vec![weight("w", &[1, 8, 2]), weight("r", &[1, 8, 2])],
                node(
                    "LSTM",
                    &["x", "w", "r"],
                    &["y"],
                    vec![int("hidden_size", -4)],
                ),
            ),
            false,
        ),
        (
            (
                "lstm too long",
                vec![x(&[1 << 20, 1, 2])],
                vec![weight("w", &[1, 8, 2]), weight("r", &[1, 8, 2])],
                node(
                    "LSTM",
                    &["x", "w", "r"],
                    &["y"],
                    vec![int("hidden_size", 2)],
                ),
            ),
            false,
        ),
        (
            (
                "gru rank",
                vec![x(&[3, 2])],
                vec![weight("w", &[1, 6, 2]), weight("r", &[1, 6, 2])],
                node("GRU", &["x", "w", "r"], &["y"], vec![int("hidden_size", 2)]),
            ),
            false,
        ),
        (
            (
                "rnn bias",
                vec![x(&[3, 1, 2])],
                vec![
                    weight("w", &[1, 2, 2]),
                    weight("r", &[1, 2, 2]),
                    weight("b", &[1, 3]),
                ],
                node(
                    "RNN",
                    &["x", "w", "r", "b"],
                    &["y"],
                    vec![int("hidden_size", 2)],
                ),
            ),
            false,
        ),
        (
            (
                "argmax",
                vec![x(&[4, 3])],
                vec![],
                node("ArgMax", &["x"], &["y"], vec![int("axis", -1)]),
            ),
            true,
        ),
        (
            (
                "argmax axis",
                vec![x(&[4, 3])],
                vec![],
                node("ArgMax", &["x"], &["y"], vec![int("axis", 2)]),
            ),
            false,
        ),
        (
            (
                "argmin empty",
                vec![x(&[4, 0])],
                vec![],
                node("ArgMin", &["x"], &["y"], vec![int("axis", 1)]),
            ),
            false,
        ),
        (
            (
                "onehot",
                vec![info("x", i, Some(&[3]))],
                vec![tensor("depth", i, &[], &[5]), weight("v", &[2])],
                node("OneHot", &["x", "depth", "v"], &["y"], vec![]),
            ),
            true,
        ),
        (
            (
                "onehot negative depth",
                vec![info("x", i, Some(&[3]))],
                vec![tensor("depth", i, &[], &[-5]), weight("v", &[2])],
                node("OneHot", &["x", "depth", "v"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "onehot huge depth",
                vec![info("x", i, Some(&[3]))],
                vec![tensor("depth", i, &[], &[1 << 40]), weight("v", &[2])],
                node("OneHot", &["x", "depth", "v"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "onehot values",
                vec![info("x", i, Some(&[3]))],
                vec![tensor("depth", i, &[], &[5]), weight("v", &[3])],
                node("OneHot", &["x", "depth", "v"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "tile",
                vec![x(&[4, 3])],
                vec![tensor("reps", i, &[2], &[2, 1])],
                node("Tile", &["x", "reps"], &["y"], vec![]),
            ),
            true,
        ),
        (
            (
                "tile negative",
                vec![x(&[4, 3])],
                vec![tensor("reps", i, &[2], &[-2, 1])],
                node("Tile", &["x", "reps"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "tile overflow",
                vec![x(&[4, 3])],
                vec![tensor("reps", i, &[2], &[1 << 40, 1 << 40])],
                node("Tile", &["x", "reps"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "tile run-time",
                vec![x(&[4, 3]), info("reps", i, Some(&[2]))],
                vec![],
                node("Tile", &["x", "reps"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "trilu",
                vec![x(&[4, 3])],
                vec![tensor("k", i, &[], &[1])],
                node("Trilu", &["x", "k"], &["y"], vec![]),
            ),
            true,
        ),
        (
            (
                "trilu rank",
                vec![x(&[4])],
                vec![],
                node("Trilu", &["x"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "trilu k",
                vec![x(&[4, 3])],
                vec![tensor("k", i, &[2], &[1, 2])],
                node("Trilu", &["x", "k"], &["y"], vec![]),
            ),
            false,
        ),
        // The pairwise ops and the backward slice: sizes and axes out of range are refused at
        // the node; the edges that are defined import.
        (
            (
                "topk k above the axis",
                vec![x(&[4, 3])],
                vec![ids(&[1], &[4])],
                node("TopK", &["x", "ids"], &["y", "yi"], vec![int("axis", 1)]),
            ),
            false,
        ),
        (
            (
                "topk negative k",
                vec![x(&[4, 3])],
                vec![ids(&[1], &[-1])],
                node("TopK", &["x", "ids"], &["y", "yi"], vec![]),
            ),
            false,
        ),
        (
            (
                "topk of all",
                vec![x(&[4, 3])],
                vec![ids(&[1], &[3])],
                node("TopK", &["x", "ids"], &["y", "yi"], vec![]),
            ),
            true,
        ),
        (
            (
                "cumsum axis",
                vec![x(&[4, 3])],
                vec![ids(&[], &[2])],
                node("CumSum", &["x", "ids"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "cumsum two axes",
                vec![x(&[4, 3])],
                vec![ids(&[2], &[0, 1])],
                node("CumSum", &["x", "ids"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "scatter smaller elsewhere",
                vec![x(&[4, 3])],
                vec![ids(&[2, 2], &[0, 1, 2, 3]), weight("u", &[2, 2])],
                node("ScatterElements", &["x", "ids", "u"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "scatter updates of another shape",
                vec![x(&[4, 3])],
                vec![ids(&[2, 3], &[0, 1, 2, 3, 0, 1]), weight("u", &[3, 3])],
                node("ScatterElements", &["x", "ids", "u"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "scatter out of range",
                vec![x(&[4, 3])],
                vec![ids(&[1, 3], &[7, -9, 0]), weight("u", &[1, 3])],
                node("ScatterElements", &["x", "ids", "u"], &["y"], vec![]),
            ),
            true,
        ),
        (
            (
                "scatternd tuple longer than the rank",
                vec![x(&[4, 3])],
                vec![ids(&[1, 3], &[0, 0, 0]), weight("u", &[1])],
                node("ScatterND", &["x", "ids", "u"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "scatternd updates of another shape",
                vec![x(&[4, 3])],
                vec![ids(&[2, 1], &[0, 1]), weight("u", &[2, 2])],
                node("ScatterND", &["x", "ids", "u"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "scatternd out of range",
                vec![x(&[4, 3])],
                vec![ids(&[2, 2], &[9, 0, 0, -7]), weight("u", &[2])],
                node("ScatterND", &["x", "ids", "u"], &["y"], vec![]),
            ),
            true,
        ),
        (
            (
                "gathernd negative batch_dims",
                vec![x(&[4, 3])],
                vec![ids(&[2, 1], &[0, 1])],
                node(
                    "GatherND",
                    &["x", "ids"],
                    &["y"],
                    vec![int("batch_dims", -1)],
                ),
            ),
            false,
        ),
        (
            (
                "gathernd batch_dims past the rank",
                vec![x(&[4, 3])],
                vec![ids(&[2, 1], &[0, 1])],
                node(
                    "GatherND",
                    &["x", "ids"],
                    &["y"],
                    vec![int("batch_dims", i64::MAX)],
                ),
            ),
            false,
        ),
        (
            (
                "gathernd tuple longer than the rank",
                vec![x(&[4, 3])],
                vec![ids(&[1, 3], &[0, 0, 0])],
                node("GatherND", &["x", "ids"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "gathernd empty tuples",
                vec![x(&[4, 3])],
                vec![ids(&[2, 0], &[])],
                node("GatherND", &["x", "ids"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "gathernd out of range",
                vec![x(&[4, 3])],
                vec![ids(&[2, 2], &[9, 0, i64::MIN, -7])],
                node("GatherND", &["x", "ids"], &["y"], vec![]),
            ),
            true,
        ),
        (
            (
                "range huge",
                vec![],
                vec![
                    tensor("a", i, &[], &[0]),
                    tensor("b", i, &[], &[i64::MAX]),
                    tensor("c", i, &[], &[1]),
                ],
                node("Range", &["a", "b", "c"], &["y"], vec![]),
            ),
            false,
        ),
        (
            (
                "slice backward of an empty axis",
                vec![x(&[0, 3])],
                vec![
                    ids(&[1], &[-1]),
                    tensor("e", i, &[1], &[i64::MIN]),
                    tensor("a", i, &[1], &[0]),
                    tensor("s", i, &[1], &[i64::MIN]),
                ],
                node("Slice", &["x", "ids", "e", "a", "s"], &["y"], vec![]),
            ),
            true,
        ),
        (
            (
                "slice step zero",
                vec![x(&[4, 3])],
                vec![
                    ids(&[1], &[0]),
                    tensor("e", i, &[1], &[3]),
                    tensor("a", i, &[1], &[0]),
                    tensor("s", i, &[1], &[0]),
                ],
                node("Slice", &["x", "ids", "e", "a", "s"], &["y"], vec![]),
            ),
            false,
        ),
    ];
    for ((case, inputs, initializers, n), imports) in cases {
        let op = n.op_type.clone();
        let m = model(
            inputs,
            initializers,
            vec![named(n)],
            vec![info("y", f, None)],
        );
        let file = format!("{}.onnx", case.replace(' ', "_"));
        save(&dir, &file, &m);
        let out = fusebox(&["check", &file], &dir);
        if imports {
            assert!(
                held(&out, case),
                "{case}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            let err = refused(&out, case);
            assert!(err.contains(&format!("node `n` ({op})")), "{case}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------ Range

/// `y = x + Range(start, limit, delta)` of constant scalars, imported and evaluated with `x`
/// zero: the folded sequence, or the import error.
fn range_of(
    dtype: DType,
    start: i64,
    limit: i64,
    delta: i64,
    len: i64,
) -> Result<Vec<f64>, String> {
    let rules = fusebox::rules::RuleSet::defaults();
    let m = model(
        vec![info("x", dtype, Some(&[len]))],
        vec![],
        vec![
            constant("start", dtype, &[], &[start]),
            constant("limit", dtype, &[], &[limit]),
            constant("delta", dtype, &[], &[delta]),
            node("Range", &["start", "limit", "delta"], &["r"], vec![]),
            node("Add", &["x", "r"], &["y"], vec![]),
        ],
        vec![info("y", dtype, None)],
    );
    let imported = fusebox::onnx::import_model(
        &m,
        "range.onnx",
        None,
        &rules.ops,
        &rules.onnx,
        &Default::default(),
    )
    .map_err(|e| e.to_string())?;
    let mut values: fusebox::eval::Tensors = imported.values.clone().into_iter().collect();
    let zeros = vec![0.0; len as usize];
    values.insert(
        "x".into(),
        Tensor::from_values(dtype, &[len as usize], zeros).unwrap(),
    );
    let out = fusebox::eval::evaluate(&imported.graph, &rules.ops, &values).unwrap();
    let y = &out.iter().find(|(name, _)| *name == "y").unwrap().1;
    Ok(y.values().to_vec())
}

/// Range folds exactly, in either direction and at the integer edges (the length computed
/// without overflow), and refuses what has no static length: a zero step, a run-time bound, or
/// more elements than folding allows.
#[test]
fn range_folds_exactly_and_refuses_what_has_no_static_length() {
    assert_eq!(
        range_of(DType::I64, 0, 5, 1, 5).unwrap(),
        [0.0, 1.0, 2.0, 3.0, 4.0]
    );
    assert_eq!(range_of(DType::I64, 10, 4, -3, 2).unwrap(), [10.0, 7.0]);
    assert_eq!(range_of(DType::I32, -3, 4, 3, 3).unwrap(), [-3.0, 0.0, 3.0]);
    // The length of i64::MIN .. i64::MAX by a step of 2^62 is 4, without overflow.
    let step = 1i64 << 62;
    let edge = range_of(DType::I64, i64::MIN, i64::MAX, step, 4).unwrap();
    assert_eq!(edge, [i64::MIN as f64, -(step as f64), 0.0, step as f64]);
    assert_eq!(range_of(DType::F32, 1, 4, 1, 3).unwrap(), [1.0, 2.0, 3.0]);
    // An empty range where the step points away from the limit.
    let rules = fusebox::rules::RuleSet::defaults();
    let m = model(
        vec![],
        vec![],
        vec![
            constant("start", DType::I64, &[], &[5]),
            constant("limit", DType::I64, &[], &[0]),
            constant("delta", DType::I64, &[], &[1]),
            node("Range", &["start", "limit", "delta"], &["y"], vec![]),
        ],
        vec![info("y", DType::I64, None)],
    );
    let imported = fusebox::onnx::import_model(
        &m,
        "empty.onnx",
        None,
        &rules.ops,
        &rules.onnx,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(imported.types["y"].shape, [0]);
    for (case, want) in [
        (range_of(DType::I64, 0, 5, 0, 5), "`delta` must not be 0"),
        (
            range_of(DType::I64, 0, 1 << 40, 1, 4),
            "longer than fusebox folds",
        ),
    ] {
        let e = case.unwrap_err();
        assert!(e.contains(want) && e.contains("Range"), "{e}");
    }
    // A run-time limit: the length is a value, so there is no static shape.
    let m = model(
        vec![info("n", DType::I64, Some(&[]))],
        vec![],
        vec![
            constant("start", DType::I64, &[], &[0]),
            constant("delta", DType::I64, &[], &[1]),
            node("Range", &["start", "n", "delta"], &["y"], vec![]),
        ],
        vec![info("y", DType::I64, None)],
    );
    let e = fusebox::onnx::import_model(
        &m,
        "dynamic.onnx",
        None,
        &rules.ops,
        &rules.onnx,
        &Default::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("`limit` must be a constant"), "{e}");
}

/// A model of another opset than 13 to 26 imports when every op it uses means there what it
/// means at 13 (or 26), and is refused naming each op whose definition differs, with both
/// versions: `And` of opset 7 is `And` of 13; `Add` of opset 7 is not (13 redefined it).
#[test]
fn an_older_opset_imports_where_its_ops_mean_the_same() {
    let rules = fusebox::rules::RuleSet::defaults();
    let at = |opset: i64, op: &str| {
        let dtype = if op == "And" { 9 } else { 1 };
        let mut m = model(
            vec![
                crate::common::onnx_models::value_info("a", dtype, Some(&[2])),
                crate::common::onnx_models::value_info("b", dtype, Some(&[2])),
            ],
            vec![],
            vec![node(op, &["a", "b"], &["y"], vec![])],
            vec![crate::common::onnx_models::value_info("y", dtype, None)],
        );
        m.opset_import[0].version = opset;
        fusebox::onnx::import_model(
            &m,
            "old.onnx",
            None,
            &rules.ops,
            &rules.onnx,
            &Default::default(),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert_eq!(at(7, "And"), Ok(()));
    assert_eq!(at(17, "Add"), Ok(()));
    let e = at(7, "Add").unwrap_err();
    assert!(
        e.contains("opset 7 defines an op otherwise")
            && e.contains("Add (version 7 here, 13 at opset 13)"),
        "{e}"
    );
    let e = at(5, "And").unwrap_err();
    assert!(e.contains("And (version 1 here, 7 at opset 13)"), "{e}");
    let e = at(0, "And").unwrap_err();
    assert!(e.contains("And (not defined at opset 0)"), "{e}");
}

/// A run-time condition in a rule directory's op table must be a flag: anything else is
/// refused where it is written, as a dtype condition naming no dtype is.
#[test]
fn a_run_time_condition_must_be_a_flag() {
    let rules = fusebox::rules::RuleSet::defaults();
    for (value, ok) in [
        ("true", true),
        ("false", true),
        ("\"yes\"", false),
        ("1", false),
    ] {
        let text = format!(
            "[Map(onnx: \"Clip\", when: {{\"$1.run_time\": {value}}}, nodes: [Node(op: \"neg\", args: [\"$0\"])])]"
        );
        let loaded = fusebox::rules::onnx::MapTable::load_str(&text, "onnx.ron", &rules.ops);
        match (loaded, ok) {
            (Ok(_), true) => {}
            (Err(e), false) => assert!(e.to_string().contains("must be true or false"), "{e}"),
            (other, _) => panic!("{value}: {other:?}"),
        }
    }
}

/// A shape computed from an input (`Reshape(x, Concat(Unsqueeze(n), [-1]))`) is specialized to
/// the value a run gives `n`: one compiled model runs two values of it, each at its own shape,
/// and without a value the import is refused at the Reshape, saying so.
#[test]
fn a_shape_computed_from_an_input_specializes_the_model_to_its_value() {
    use fusebox::model::{Backend, CompileOptions, Model};
    let dir = scratch("computed-shape");
    let m = model(
        vec![
            info("x", DType::F32, Some(&[6])),
            info("n", DType::I64, Some(&[])),
        ],
        vec![],
        vec![
            constant("zero", DType::I64, &[1], &[0]),
            node("Unsqueeze", &["n", "zero"], &["n1"], vec![]),
            constant("rest", DType::I64, &[1], &[-1]),
            node(
                "Concat",
                &["n1", "rest"],
                &["shape"],
                vec![int_attr("axis", 0)],
            ),
            node("Reshape", &["x", "shape"], &["y"], vec![]),
        ],
        vec![info("y", DType::F32, None)],
    );
    let path = save(&dir, "reshape.onnx", &m);
    let rules = fusebox::rules::RuleSet::defaults();
    let e = Model::load(&path, &rules).unwrap_err().to_string();
    assert!(
        e.contains("Reshape") && e.contains("specialized to its value"),
        "{e}"
    );
    let x = Tensor::from_values(DType::F32, &[6], (0..6).map(f64::from).collect()).unwrap();
    let n = |v: i64| Tensor::from_ints(DType::I64, &[], vec![v]).unwrap();
    let given = |v: i64| {
        std::collections::BTreeMap::from([("x".to_string(), x.clone()), ("n".to_string(), n(v))])
    };
    let first = fusebox::graph::dims::Specialization {
        values: [("n".to_string(), n(2))].into(),
        ..Default::default()
    };
    let loaded = Model::load_specialized(&path, &rules, &first).unwrap();
    assert_eq!(loaded.specialized().keys().collect::<Vec<_>>(), ["n"]);
    for backend in [Backend::Reference, Backend::Cpu] {
        let mut compiled = loaded.compile(backend, &CompileOptions::default()).unwrap();
        for (v, shape) in [(2, [2usize, 3]), (3, [3, 2]), (2, [2, 3])] {
            let y = &compiled.run(&given(v)).unwrap()["y"];
            assert_eq!(y.shape(), shape, "n = {v} on {backend:?}");
            assert_eq!(y.values(), x.values(), "n = {v} on {backend:?}");
        }
    }
}
