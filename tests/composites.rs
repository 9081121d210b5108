//! Composite ops (ops declared in ops.ron as graphs over catalogue ops): their values against
//! direct computations written here, gradients through them against central differences,
//! the CPU backend against the reference, and located errors for bad declarations and uses.

use crate::common;

use fusebox::autodiff::verify::{Probe, agreement_at};
use fusebox::eval::{Tensors, evaluate};
use fusebox::graph::file;
use fusebox::rules::{Catalogue, RuleSet};
use fusebox::tensor::Tensor;
use std::path::Path;
use std::process::Command;

fn fusebox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .output()
        .unwrap()
}

/// Seeded values in [-2, 2], different for each seed.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

/// A graph of one node `y = OP(args…)` over f64 inputs of the given shapes, read through the
/// graph-file parser (so the composite is expanded exactly as for a user's file).
fn one_node(op: &str, shapes: &[&[usize]], attrs: &str) -> String {
    let inputs: Vec<String> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| format!("Input(name: \"x{i}\", dtype: \"f64\", shape: {s:?})"))
        .collect();
    let args: Vec<String> = (0..shapes.len()).map(|i| format!("\"x{i}\"")).collect();
    format!(
        "Graph(name: \"{op}\", inputs: [{}], nodes: [Node(name: \"y\", op: \"{op}\", args: [{}]{attrs})], outputs: [\"y\"])",
        inputs.join(", "),
        args.join(", ")
    )
}

/// Evaluates `y = OP(…)` on seeded inputs; returns the inputs' values and y's.
fn run_one(op: &str, shapes: &[&[usize]], attrs: &str) -> (Vec<Vec<f64>>, Tensor) {
    let catalogue = Catalogue::defaults();
    let text = one_node(op, shapes, attrs);
    let (graph, _) = file::parse(&text, "test.ron", &catalogue).unwrap();
    let mut inputs = Tensors::new();
    let mut raw = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let n = shape.iter().product();
        let v = values(n, 7 + i as u64);
        inputs.insert(
            format!("x{i}"),
            Tensor::from_values(fusebox::dtype::DType::F64, shape, v.clone()).unwrap(),
        );
        raw.push(v);
    }
    let out = evaluate(&graph, &catalogue, &inputs).unwrap();
    (raw, out["y"].clone())
}

#[track_caller]
fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: {g} vs {w}"
        );
    }
}

/// Rows of a [rows, cols] matrix, each mapped by `f`.
fn per_row(x: &[f64], cols: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    x.chunks(cols).flat_map(f).collect()
}

#[test]
fn softmax_and_log_softmax_equal_a_direct_computation_along_either_axis() {
    let (x, y) = run_one("softmax", &[&[3, 4]], "");
    let softmax = |row: &[f64]| {
        let s: f64 = row.iter().map(|v| v.exp()).sum();
        row.iter().map(|v| v.exp() / s).collect::<Vec<_>>()
    };
    assert_close(&y.values(), &per_row(&x[0], 4, softmax), 1e-12);

    let (x, y) = run_one("log_softmax", &[&[3, 4]], "");
    let log_softmax = |row: &[f64]| {
        let s: f64 = row.iter().map(|v| v.exp()).sum();
        row.iter().map(|v| v - s.ln()).collect::<Vec<_>>()
    };
    assert_close(&y.values(), &per_row(&x[0], 4, log_softmax), 1e-12);

    // Along axis 0: column j of the [3, 4] input.
    let (x, y) = run_one("softmax", &[&[3, 4]], ", attrs: {\"axis\": 0}");
    for j in 0..4 {
        let col: Vec<f64> = (0..3).map(|i| x[0][i * 4 + j]).collect();
        let s: f64 = col.iter().map(|v| v.exp()).sum();
        for (i, v) in col.iter().enumerate() {
            let got = y.values()[i * 4 + j];
            assert!((got - v.exp() / s).abs() < 1e-12);
        }
    }
    // Large inputs do not overflow: the maximum is subtracted first.
    let catalogue = Catalogue::defaults();
    let (graph, _) =
        file::parse(&one_node("softmax", &[&[1, 2]], ""), "t.ron", &catalogue).unwrap();
    let big =
        Tensor::from_values(fusebox::dtype::DType::F64, &[1, 2], vec![1000.0, 999.0]).unwrap();
    let out = evaluate(
        &graph,
        &catalogue,
        &Tensors::from([("x0".to_string(), big)]),
    )
    .unwrap();
    let want = 1.0 / (1.0 + (-1f64).exp());
    assert_close(&out["y"].values(), &[want, 1.0 - want], 1e-12);
}

#[test]
fn layer_norm_and_rms_norm_equal_a_direct_computation() {
    let (x, y) = run_one(
        "layer_norm",
        &[&[2, 5], &[5], &[5]],
        ", attrs: {\"epsilon\": 0.001}",
    );
    let (w, b) = (&x[1], &x[2]);
    let want = per_row(&x[0], 5, |row| {
        let mean = row.iter().sum::<f64>() / 5.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 5.0;
        row.iter()
            .enumerate()
            .map(|(j, v)| (v - mean) / (var + 0.001).sqrt() * w[j] + b[j])
            .collect()
    });
    assert_close(&y.values(), &want, 1e-12);

    let (x, y) = run_one("rms_norm", &[&[2, 5], &[5]], "");
    let w = &x[1];
    let want = per_row(&x[0], 5, |row| {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 5.0;
        row.iter()
            .enumerate()
            .map(|(j, v)| v / (ms + 1e-5).sqrt() * w[j])
            .collect()
    });
    assert_close(&y.values(), &want, 1e-12);

    // Over two axes: every element of each [2, 3] slab of a [2, 2, 3] input.
    let (x, y) = run_one(
        "layer_norm",
        &[&[2, 2, 3], &[2, 3], &[2, 3]],
        ", attrs: {\"axes\": [1, 2]}",
    );
    let want = per_row(&x[0], 6, |slab| {
        let mean = slab.iter().sum::<f64>() / 6.0;
        let var = slab.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 6.0;
        slab.iter()
            .enumerate()
            .map(|(j, v)| (v - mean) / (var + 1e-5).sqrt() * x[1][j] + x[2][j])
            .collect()
    });
    assert_close(&y.values(), &want, 1e-12);
}

#[test]
fn composite_reductions_equal_a_direct_computation() {
    let (x, y) = run_one("reduce_min", &[&[3, 4]], ", attrs: {\"axes\": [1]}");
    let want = per_row(&x[0], 4, |r| {
        vec![r.iter().copied().fold(f64::INFINITY, f64::min)]
    });
    assert_close(&y.values(), &want, 0.0);
    let (x, y) = run_one(
        "sum_square",
        &[&[3, 4]],
        ", attrs: {\"axes\": [1], \"keepdim\": true}",
    );
    assert_eq!(y.shape(), &[3, 1]);
    let want = per_row(&x[0], 4, |r| vec![r.iter().map(|v| v * v).sum()]);
    assert_close(&y.values(), &want, 1e-12);
    // No axes: every axis.
    let (x, y) = run_one("l2_norm", &[&[3, 4]], "");
    assert_eq!(y.shape(), &[] as &[usize]);
    let want = x[0].iter().map(|v| v * v).sum::<f64>().sqrt();
    assert_close(&y.values(), &[want], 1e-12);
}

#[test]
fn composite_activations_equal_their_formulas() {
    type Formula = fn(f64) -> f64;
    let cases: [(&str, &str, Formula); 8] = [
        ("leaky_relu", "", |v| if v > 0.0 { v } else { 0.01 * v }),
        ("leaky_relu", ", attrs: {\"alpha\": 0.3}", |v| {
            if v > 0.0 { v } else { 0.3 * v }
        }),
        ("elu", "", |v| if v > 0.0 { v } else { v.exp() - 1.0 }),
        ("selu", "", |v| {
            let (a, g) = (1.6732632423543772, 1.0507009873554805);
            g * if v > 0.0 { v } else { a * v.exp() - a }
        }),
        ("hard_sigmoid", "", |v| (0.2 * v + 0.5).clamp(0.0, 1.0)),
        ("hard_swish", "", |v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
        ("softsign", "", |v| v / (1.0 + v.abs())),
        ("reciprocal", "", |v| 1.0 / v),
    ];
    for (op, attrs, f) in cases {
        let (x, y) = run_one(op, &[&[4, 6]], attrs);
        let want: Vec<f64> = x[0].iter().map(|&v| f(v)).collect();
        assert_close(&y.values(), &want, 1e-12);
    }
}

#[test]
fn constants_inside_a_composite_follow_the_operand_dtype() {
    // layer_norm's epsilon and leaky_relu's alpha are constants of `$x.dtype`: in f16 the
    // result stays f16 rather than being promoted to the constants' default f32.
    let catalogue = Catalogue::defaults();
    let text = r#"Graph(name: "h", inputs: [Input(name: "x", dtype: "f16", shape: [2, 4]),
        Input(name: "w", dtype: "f16", shape: [4]), Input(name: "b", dtype: "f16", shape: [4])],
        nodes: [Node(name: "n", op: "layer_norm", args: ["x", "w", "b"]),
                Node(name: "y", op: "leaky_relu", args: ["n"])],
        outputs: ["y"])"#;
    let (graph, types) = file::parse(text, "h.ron", &catalogue).unwrap();
    assert_eq!(types["y"].dtype, fusebox::dtype::DType::F16);
    assert_eq!(types["n"].dtype, fusebox::dtype::DType::F16);
    assert!(graph.nodes.iter().all(|n| catalogue.get(&n.op).is_some()));
}

#[test]
fn gradients_through_composites_agree_with_central_differences() {
    let rules = RuleSet::defaults();
    let cases: [(&str, &[&[usize]], &str); 6] = [
        ("softmax", &[&[3, 4]], ""),
        ("log_softmax", &[&[3, 4]], ", attrs: {\"axis\": 0}"),
        ("layer_norm", &[&[2, 5], &[5], &[5]], ""),
        ("rms_norm", &[&[2, 5], &[5]], ""),
        ("selu", &[&[3, 3]], ""),
        ("l2_norm", &[&[3, 4]], ", attrs: {\"axes\": [1]}"),
    ];
    for (k, (op, shapes, attrs)) in cases.into_iter().enumerate() {
        let (graph, _) = file::parse(&one_node(op, shapes, attrs), "g.ron", &rules.ops).unwrap();
        let mut inputs = Tensors::new();
        for (i, shape) in shapes.iter().enumerate() {
            let n = shape.iter().product();
            inputs.insert(
                format!("x{i}"),
                Tensor::from_values(fusebox::dtype::DType::F64, shape, values(n, 40 + i as u64))
                    .unwrap(),
            );
        }
        let (joint, agreement) = agreement_at(
            &graph,
            &rules.ops,
            &rules.gradients,
            Probe::Elementwise,
            k as u64,
            &inputs,
        )
        .unwrap();
        assert!(
            agreement.worst < 1e-6,
            "{op}: worst relative error {} at {}",
            agreement.worst,
            agreement.at
        );
        assert_eq!(agreement.singular, 0, "{op}");
        assert_eq!(joint.gradients.len(), shapes.len(), "{op}");
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn a_graph_of_composites_runs_on_the_cpu_as_on_the_reference() {
    let dir = common::scratch("composites", "cpu");
    for (name, shape) in [("x", vec![8, 16]), ("w", vec![16]), ("b", vec![16])] {
        let n = shape.iter().product();
        Tensor::from_values(
            fusebox::dtype::DType::F32,
            &shape,
            values(n, name.len() as u64),
        )
        .unwrap()
        .write_npy(&dir.join(format!("{name}.npy")))
        .unwrap();
    }
    let graph = write(
        &dir,
        "block.ron",
        r#"Graph(name: "block", inputs: [
            Input(name: "x", dtype: "f32", shape: [8, 16], value: "x.npy"),
            Input(name: "w", dtype: "f32", shape: [16], value: "w.npy"),
            Input(name: "b", dtype: "f32", shape: [16], value: "b.npy")],
          nodes: [
            Node(name: "n", op: "layer_norm", args: ["x", "w", "b"]),
            Node(name: "a", op: "hard_swish", args: ["n"]),
            Node(name: "r", op: "rms_norm", args: ["a", "w"]),
            Node(name: "p", op: "softmax", args: ["r"]),
            Node(name: "m", op: "reduce_min", args: ["p"], attrs: {"axes": [0]}),
          ],
          outputs: ["p", "m"])"#,
    );
    let mut results = Vec::new();
    for backend in ["reference", "cpu"] {
        let out = dir.join(backend);
        common::ok(&fusebox(&[
            "run",
            &graph,
            "--backend",
            backend,
            "--out",
            &out.display().to_string(),
        ]));
        let p = Tensor::read_npy(&out.join("p.npy")).unwrap();
        let m = Tensor::read_npy(&out.join("m.npy")).unwrap();
        results.push((p, m));
    }
    assert_eq!(results[0].0.shape(), &[8, 16]);
    assert_eq!(results[0].1.shape(), &[16]);
    assert_close(&results[1].0.values(), &results[0].0.values(), 1e-5);
    assert_close(&results[1].1.values(), &results[0].1.values(), 1e-5);
    // Each softmax row sums to one.
    for row in results[0].0.values().chunks(16) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-5);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fusion_sees_the_parts_of_a_composite() {
    // softmax is five ops; optimized, they fuse into fewer kernels than ops.
    let dir = common::scratch("composites", "fusion");
    let graph = write(
        &dir,
        "s.ron",
        r#"Graph(name: "s", inputs: [Input(name: "x", dtype: "f32", shape: [64, 128])],
            nodes: [Node(name: "y", op: "softmax", args: ["x"])], outputs: ["y"])"#,
    );
    let out = common::ok(&fusebox(&["optimize", &graph, "--json"]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    // One kernel per op before fusion: the five parts (reduce_max, sub, exp, sum, div).
    assert_eq!(report["kernels_before"], 5, "{out}");
    let after = report["kernels_after"].as_u64().unwrap();
    assert!((1..5).contains(&after), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Loads `ops` over the default catalogue and returns the error text.
fn declaration_error(ops: &str) -> String {
    let mut catalogue = Catalogue::defaults();
    catalogue
        .load_str(ops, "ops.ron")
        .expect_err("the declaration must be refused")
        .to_string()
}

#[test]
fn bad_composite_declarations_get_located_errors() {
    let unknown = declaration_error(
        r#"[Composite(name: "bad", operands: ["x"], nodes: [
    Node(name: "y", op: "sofmax", args: ["x"]),
])]"#,
    );
    assert!(
        unknown.starts_with("ops.ron:2:25:")
            && unknown.contains("unknown op `sofmax` (did you mean `softmax`?)"),
        "{unknown}"
    );
    let arity = declaration_error(
        r#"[Composite(name: "bad", operands: ["x"], nodes: [
    Node(name: "y", op: "add", args: ["x"]),
])]"#,
    );
    assert!(
        arity.starts_with("ops.ron:2:38:") && arity.contains("op `add` takes 2 argument(s), got 1"),
        "{arity}"
    );
    let cycle = declaration_error(
        r#"[
    Composite(name: "a", operands: ["x"], nodes: [Node(name: "y", op: "b", args: ["x"])]),
    Composite(name: "b", operands: ["x"], nodes: [Node(name: "y", op: "a", args: ["x"])]),
]"#,
    );
    assert!(
        cycle.starts_with("ops.ron:2:71:") && cycle.contains("uses itself (a → b → a)"),
        "{cycle}"
    );
    let own = declaration_error(
        r#"[Composite(name: "a", operands: ["x"], nodes: [Node(name: "y", op: "a", args: ["x"])])]"#,
    );
    assert!(own.contains("uses itself (a → a)"), "{own}");
    let unbound = declaration_error(
        r#"[Composite(name: "bad", operands: ["x"], nodes: [
    Node(name: "y", op: "broadcast_to", args: ["x"]),
])]"#,
    );
    assert!(
        unbound.starts_with("ops.ron:2:5:")
            && unbound.contains("op `broadcast_to` needs attribute `shape`, which is not bound"),
        "{unbound}"
    );
    let maybe = declaration_error(
        r#"[Composite(name: "bad", operands: ["x"], attrs: [Attr(name: "s", ty: Ints, optional: true)], nodes: [
    Node(name: "y", op: "reshape", args: ["x"], attrs: {"shape": "$s"}),
])]"#,
    );
    assert!(
        maybe.contains("needs attribute `shape`, which is not bound"),
        "{maybe}"
    );
    let reference = declaration_error(
        r#"[Composite(name: "bad", operands: ["x"], attrs: [Attr(name: "axis", ty: Int)], nodes: [
    Node(name: "y", op: "sum", args: ["x"], attrs: {"axes": "$axes"}),
])]"#,
    );
    assert!(
        reference.starts_with("ops.ron:2:61:")
            && reference.contains("`$axes` names no attribute of `bad` (did you mean `axis`?)"),
        "{reference}"
    );
    let wrong_type = declaration_error(
        r#"[Composite(name: "bad", operands: ["x"], attrs: [Attr(name: "a", ty: Float)], nodes: [
    Node(name: "y", op: "sum", args: ["x"], attrs: {"keepdim": "$a"}),
])]"#,
    );
    assert!(
        wrong_type.contains("`$a` is a number, but the attribute is true or false"),
        "{wrong_type}"
    );
    let dead = declaration_error(
        r#"[Composite(name: "bad", operands: ["x"], nodes: [
    Node(name: "lost", op: "neg", args: ["x"]),
    Node(name: "y", op: "exp", args: ["x"]),
])]"#,
    );
    assert!(
        dead.starts_with("ops.ron:2:16:") && dead.contains("node `lost` is never used"),
        "{dead}"
    );
    let clash = declaration_error(
        r#"[Composite(name: "exp", operands: ["x"], nodes: [Node(name: "y", op: "neg", args: ["x"])])]"#,
    );
    assert!(
        clash.contains("`exp` is an op of the catalogue already"),
        "{clash}"
    );
}

#[test]
fn bad_uses_of_a_composite_in_a_graph_file_are_located() {
    let catalogue = Catalogue::defaults();
    let error = |nodes: &str| {
        let text = format!(
            "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [2, 3])],\n nodes: [\n{nodes}\n ], outputs: [\"y\"])"
        );
        file::parse(&text, "g.ron", &catalogue)
            .expect_err("must be refused")
            .to_string()
    };
    let arity = error(r#"  Node(name: "y", op: "softmax", args: ["x", "x"]),"#);
    assert!(
        arity.starts_with("g.ron:3:40: node `y`:")
            && arity.contains("op `softmax` takes 1 argument(s), got 2"),
        "{arity}"
    );
    let attr = error(r#"  Node(name: "y", op: "softmax", args: ["x"], attrs: {"axes": [0]}),"#);
    assert!(
        attr.starts_with("g.ron:3:55:")
            && attr.contains("op `softmax` has no attribute `axes` (did you mean `axis`?)"),
        "{attr}"
    );
    let axis = error(r#"  Node(name: "y", op: "softmax", args: ["x"], attrs: {"axis": 5}),"#);
    assert!(
        axis.starts_with("g.ron:3:23: node `y`:")
            && axis.contains("in the body of composite `softmax`, node `m` (`reduce_max`)"),
        "{axis}"
    );
    let unknown = error(r#"  Node(name: "y", op: "softmax", args: ["z"]),"#);
    assert!(
        unknown.starts_with("g.ron:3:41:")
            && unknown.contains("`z` is not a graph input or an earlier node"),
        "{unknown}"
    );
}

#[test]
fn a_rule_directory_declares_its_own_composite() {
    let dir = common::scratch("composites", "ruledir");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    // SwiGLU's gate: silu(a) * b, over the default catalogue's silu.
    write(
        &rules,
        "ops.ron",
        r#"[Composite(name: "swiglu", operands: ["a", "b"], nodes: [
    Node(name: "s", op: "silu", args: ["a"]),
    Node(name: "y", op: "mul", args: ["s", "b"]),
])]"#,
    );
    let graph = write(
        &dir,
        "g.ron",
        r#"Graph(name: "g", inputs: [Input(name: "a", dtype: "f32", shape: [4]), Input(name: "b", dtype: "f32", shape: [4])],
            nodes: [Node(name: "y", op: "swiglu", args: ["a", "b"])], outputs: ["y"])"#,
    );
    let rules_arg = rules.display().to_string();
    let out = common::ok(&fusebox(&["check", &graph, "--rules", &rules_arg]));
    assert!(out.contains("y.s ") && out.contains("silu"), "{out}");
    // Without the directory the op is unknown: exit 1 with the position.
    let out = fusebox(&["check", &graph]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown op `swiglu`"));
    // A broken declaration in the directory: exit 1, located in its ops.ron.
    write(
        &rules,
        "ops.ron",
        r#"[Composite(name: "swiglu", operands: ["a", "b"], nodes: [
    Node(name: "y", op: "swiglu", args: ["a", "b"]),
])]"#,
    );
    let out = fusebox(&["check", &graph, "--rules", &rules_arg]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ops.ron:2:") && stderr.contains("uses itself (swiglu → swiglu)"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_rules_differentiates_every_composite_and_catches_a_wrong_part() {
    // The defaults: every composite agrees with central differences.
    let out = common::ok(&fusebox(&["check-rules"]));
    assert!(
        out.contains(
            "14 composite ops expanded and differentiated through their parts in f64: 14 agree"
        ),
        "{out}"
    );
    // A rule directory whose op has a wrong derivative (d(2x) written as g, not 2g): the
    // composite built on it is reported and the command exits 1.
    let dir = common::scratch("composites", "check-rules");
    write(
        &dir,
        "ops.ron",
        r#"[
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: FloatPromote(["x"]),
       formula: "2 * x", derivatives: {"x": "g"}),
    Composite(name: "twice_tanh", operands: ["x"], nodes: [
        Node(name: "t", op: "twice", args: ["x"]),
        Node(name: "y", op: "tanh", args: ["t"]),
    ]),
]"#,
    );
    let out = fusebox(&["check-rules", "--rules", &dir.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("WRONG GRADIENT: composite `twice_tanh`"),
        "{stdout}"
    );
    assert!(stderr.contains("twice_tanh"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
