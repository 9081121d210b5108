//! AMP cast insertion (issue 4, part 1): policies from amp.ron, the MXNet pass with mirror
//! maps, `fusebox run --amp`, and numerics against the f32 originals.

use crate::common;
use common::amp_inputs;
use fusebox::amp::{AmpOptions, insert_casts, insert_casts_with};
use fusebox::attr::AttrValue;
use fusebox::dtype::DType;
use fusebox::eval;
use fusebox::graph::{self, Graph, GraphBuilder, TypeMap};
use fusebox::rules::{AmpRules, Catalogue, Conditional, Policy, RuleSet};
use fusebox::tensor::Tensor;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn catalogue() -> Catalogue {
    Catalogue::defaults()
}

fn example(name: &str) -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.ron"));
    graph::file::load(&path, &catalogue()).unwrap().0
}

fn default_policy(name: &str) -> Policy {
    AmpRules::defaults().policy(name).unwrap().clone()
}

fn set(ops: &[&str]) -> std::collections::BTreeSet<String> {
    ops.iter().map(|s| s.to_string()).collect()
}

/// The RFC's conversion of its demo: target_dtype_ops = [sin, cos, exp], fp32_ops =
/// [elemwise_add], widest_dtype_ops = [add_n]. fusebox has no add_n: amp_demo writes the
/// three-operand add_n as two `add`s, and a policy lists ops, not nodes, so all four adds get
/// the fp32 treatment. That changes nothing here: add_n's operands (sym, data2, data3) are all
/// f32 in the RFC's graph, so as a widest op it would cast nothing either.
fn rfc_policy() -> Policy {
    let mut p = Policy::new("rfc", DType::F16);
    p.low_precision = set(&["sin", "cos", "exp"]);
    p.fp32 = set(&["add"]);
    p
}

/// The default lists with the bounded pointwise activations moved to low precision, so that
/// graphs without a matmul (gelu_bias, lstm_cell) get casts worth checking numerically: under
/// the default policies those graphs have no low-precision op and stay f32 throughout.
fn activations_low(target: &str) -> Policy {
    let mut p = default_policy(target);
    p.name = format!("{target}-activations");
    for op in ["sigmoid", "tanh", "gelu", "sin", "cos", "exp"] {
        p.fp32.remove(op);
        p.low_precision.insert(op.to_string());
    }
    p
}

fn types(g: &Graph) -> TypeMap {
    graph::check(g, &catalogue()).unwrap()
}

fn casts(g: &Graph) -> Vec<&graph::Node> {
    g.nodes.iter().filter(|n| n.op == "cast").collect()
}

fn casts_of<'g>(g: &'g Graph, value: &str) -> Vec<&'g graph::Node> {
    casts(g).into_iter().filter(|n| n.args == [value]).collect()
}

fn cast_dtype(n: &graph::Node) -> DType {
    match n.attrs.get("dtype") {
        Some(AttrValue::DType(d)) => *d,
        other => panic!("cast `{}` has dtype attribute {other:?}", n.name),
    }
}

#[test]
fn amp_demo_shares_one_cast_of_data() {
    let g = example("amp_demo");
    let amp = insert_casts(&g, &catalogue(), &rfc_policy()).unwrap();
    let ty = types(&amp.graph);

    // One cast of `data`, to f16, read by exp, sin and cos (mirror_entry_target_map).
    let data_casts = casts_of(&amp.graph, "data");
    assert_eq!(data_casts.len(), 1);
    assert_eq!(data_casts[0].name, "data_f16");
    assert_eq!(cast_dtype(data_casts[0]), DType::F16);
    for node in ["x", "x2", "x3"] {
        assert_eq!(amp.graph.node(node).unwrap().args, ["data_f16"]);
        assert_eq!(ty[node].dtype, DType::F16);
    }

    // The RFC's pass on this graph: amp_cast(data -> f16), shared by exp, sin and cos (1);
    // elemwise_add(x, x2) gets amp_cast(x -> f32) and amp_cast(x2 -> f32) (2);
    // elemwise_add(x_x2, x3) gets amp_cast(x3 -> f32) (1) and an amp_cast of x_x2, which is
    // already f32 and so a no-op at run time; add_n gets an amp_multicast over sym, data2 and
    // data3, all f32, also a no-op. Counting the casts that change a dtype: 1 + 2 + 1 = 4.
    // `result` is f32 as before, so no cast back is needed.
    assert_eq!(amp.casts_inserted, 4);
    assert_eq!(casts(&amp.graph).len(), 4);
    assert_eq!(amp.graph.node("x_x2").unwrap().args, ["x_f32", "x2_f32"]);
    assert_eq!(amp.graph.node("sym").unwrap().args, ["x_x2", "x3_f32"]);
    assert_eq!(ty["result"].dtype, DType::F32);
    assert_eq!(amp.graph.outputs, ["result"]);
}

/// mlp_block under a default policy: x@w1 and act@w2 take `target` operands; the bias adds
/// are widest, so the matmul results meet the f32 biases in f32; gelu follows (f32).
fn check_mlp(target: DType) {
    let g = example("mlp_block");
    let amp = insert_casts(&g, &catalogue(), &default_policy(target.name())).unwrap();
    let ty = types(&amp.graph);
    for matmul in ["h", "out"] {
        let node = amp.graph.node(matmul).unwrap();
        for arg in &node.args {
            assert_eq!(ty[arg].dtype, target, "{matmul} operand {arg}");
        }
        assert_eq!(ty[matmul].dtype, target);
    }
    let t = target.name();
    assert_eq!(
        amp.graph.node("h").unwrap().args,
        [format!("x_{t}"), format!("w1_{t}")]
    );
    assert_eq!(
        amp.graph.node("out").unwrap().args,
        [format!("act_{t}"), format!("w2_{t}")]
    );
    assert_eq!(ty["act"].dtype, DType::F32);
    assert_eq!(ty["y"].dtype, DType::F32);
    // x, w1, w2 and act narrowed, h and out widened for the bias adds: 6. `x` is narrowed once
    // for the matmul and read in f32 by the residual add, which needs no cast.
    assert_eq!(amp.casts_inserted, 6);
    assert_eq!(amp.graph.node("y").unwrap().args, ["out_bias", "x"]);
    assert_eq!(amp.graph.outputs, ["y"]);
}

#[test]
fn mlp_block_matmuls_in_f16() {
    check_mlp(DType::F16);
}

#[test]
fn mlp_block_matmuls_in_bf16() {
    check_mlp(DType::BF16);
}

#[test]
fn graphs_without_low_precision_ops_are_unchanged_by_default() {
    // No op of these graphs is in a default low_precision list and their inputs are all f32,
    // so fp32 and widest ops find nothing to cast.
    for name in ["amp_demo", "gelu_bias", "lstm_cell"] {
        let g = example(name);
        for policy in ["f16", "bf16"] {
            let amp = insert_casts(&g, &catalogue(), &default_policy(policy)).unwrap();
            assert_eq!(amp.casts_inserted, 0, "{name} {policy}");
            assert_eq!(amp.graph, g, "{name} {policy}");
        }
    }
}

#[test]
fn output_computed_narrow_is_cast_back_under_its_name() {
    let g = example("lstm_cell");
    let amp = insert_casts(&g, &catalogue(), &activations_low("f16")).unwrap();
    let ty = types(&amp.graph);
    // hy = o * tanh(cy) multiplies two f16 values, so it is computed in f16 as `hy_f16` and
    // the output `hy` is its cast back to f32; cy = f*cx + i*g meets the f32 cx, so it is f32.
    assert_eq!(ty["hy_f16"].dtype, DType::F16);
    let hy = amp.graph.node("hy").unwrap();
    assert_eq!(
        (hy.op.as_str(), hy.args.as_slice()),
        ("cast", &["hy_f16".to_string()][..])
    );
    assert_eq!(ty["hy"].dtype, DType::F32);
    assert_eq!(ty["cy"].dtype, DType::F32);
    assert_eq!(amp.graph.outputs, g.outputs);
    // The four gate inputs narrowed for sigmoid/tanh (4); f_cx = f * cx widens f to meet the
    // f32 cx (1); i_g = i * g has two f16 operands (0); cy = f_cx + i_g widens i_g (1);
    // tanh(cy) narrows cy (1); hy = o * tanh_cy has two f16 operands (0); hy cast back (1): 8.
    assert_eq!(amp.casts_inserted, 8);

    // Asked not to, the pass leaves hy in f16 under its own name.
    let options = AmpOptions {
        keep_output_dtypes: false,
    };
    let free = insert_casts_with(&g, &catalogue(), &activations_low("f16"), &options).unwrap();
    assert_eq!(types(&free.graph)["hy"].dtype, DType::F16);
    assert_eq!(free.casts_inserted, 7);
}

#[test]
fn widest_meets_f16_and_bf16_at_f32_and_leaves_other_types_alone() {
    let mut b = GraphBuilder::new("mixed");
    b.input("a", DType::F16, &[4]);
    b.input("c", DType::BF16, &[4]);
    b.input("d", DType::F64, &[4, 4]);
    b.input("k", DType::I32, &[4]);
    b.op("s", "add", &["a", "c"]);
    b.op("t", "add", &["s", "k"]);
    b.op("m", "matmul", &["d", "d"]);
    let g = b.finish(&["t", "m"]);
    let amp = insert_casts(&g, &catalogue(), &default_policy("f16")).unwrap();
    let ty = types(&amp.graph);
    assert_eq!(amp.graph.node("s").unwrap().args, ["a_f32", "c_f32"]);
    // The integer operand of a widest op is not cast; the f64 matmul is not narrowed.
    assert_eq!(amp.graph.node("t").unwrap().args, ["s", "k"]);
    assert_eq!(amp.graph.node("m").unwrap().args, ["d", "d"]);
    assert_eq!(ty["m"].dtype, DType::F64);
    assert_eq!(amp.casts_inserted, 2);
}

#[test]
fn conditional_fp32_follows_the_attribute() {
    let mut b = GraphBuilder::new("clamps");
    b.input("x", DType::F32, &[8]);
    b.op_with("six", "clamp", &["x"], &[("max", AttrValue::Float(6.0))]);
    b.op_with("one", "clamp", &["x"], &[("max", AttrValue::Float(1.0))]);
    let g = b.finish(&["six", "one"]);
    let mut p = Policy::new("p", DType::BF16);
    p.low_precision = set(&["clamp"]);
    p.conditional_fp32 = vec![Conditional {
        op: "clamp".into(),
        attr: "max".into(),
        values: vec![AttrValue::Float(6.0)],
    }];
    let amp = insert_casts(&g, &catalogue(), &p).unwrap();
    // relu6-style clamp stays in f32; the other runs in bf16 and is cast back for the output.
    assert_eq!(amp.graph.node("six").unwrap().args, ["x"]);
    assert_eq!(amp.graph.node("one_bf16").unwrap().args, ["x_bf16"]);
    assert_eq!(amp.casts_inserted, 2);
}

#[test]
fn generated_names_never_collide() {
    let mut b = GraphBuilder::new("names");
    b.input("x", DType::F32, &[2, 2]);
    b.op("x_f16", "neg", &["x"]);
    b.op("m", "matmul", &["x", "x_f16"]);
    let g = b.finish(&["m"]);
    let amp = insert_casts(&g, &catalogue(), &default_policy("f16")).unwrap();
    // `x_f16` is taken by an original node, so x's cast is `x_f16_2`; the neg's cast is
    // `x_f16_f16`. m is computed in f16 as `m_f16` and cast back as `m`.
    assert_eq!(
        amp.graph.node("m_f16").unwrap().args,
        ["x_f16_2", "x_f16_f16"]
    );
    assert_eq!(amp.graph.node("m").unwrap().args, ["m_f16"]);
    assert_eq!(amp.casts_inserted, 3);
}

/// An exclusion that names no node of the graph is an error, not a silent no-op.
#[test]
fn excluding_a_node_the_graph_lacks_is_an_error() {
    let g = example("mlp_block");
    let mut p = default_policy("f16");
    p.exclude = set(&["outt"]);
    let error = insert_casts(&g, &catalogue(), &p).unwrap_err().to_string();
    assert!(error.contains("excludes `outt`"), "{error}");
    assert!(error.contains("did you mean `out`"), "{error}");
}

#[test]
fn excluded_nodes_run_in_their_original_types() {
    let g = example("mlp_block");
    let mut p = default_policy("f16");
    p.exclude = set(&["out"]);
    let amp = insert_casts(&g, &catalogue(), &p).unwrap();
    let ty = types(&amp.graph);
    assert_eq!(amp.graph.node("out").unwrap().args, ["act", "w2"]);
    assert_eq!(ty["out"].dtype, DType::F32);
    // Only the first matmul's operands and its result: x_f16, w1_f16, h_f32.
    assert_eq!(amp.casts_inserted, 3);

    // An excluded node whose input the pass narrowed reads it back in its original type:
    // with only matmul listed, add follows and would run h_bias in f16; excluded, it reads h
    // in f32 as in the original graph.
    let mut p = Policy::new("p", DType::F16);
    p.low_precision = set(&["matmul"]);
    p.exclude = set(&["h_bias"]);
    let amp = insert_casts(&g, &catalogue(), &p).unwrap();
    assert_eq!(amp.graph.node("h_bias").unwrap().args, ["h_f32", "b1"]);
    assert_eq!(types(&amp.graph)["h_bias"].dtype, DType::F32);
}

#[test]
fn inserting_twice_adds_nothing() {
    let cases = [
        ("amp_demo", rfc_policy()),
        ("mlp_block", default_policy("f16")),
        ("mlp_block", default_policy("bf16")),
        ("lstm_cell", activations_low("f16")),
        ("gelu_bias", activations_low("bf16")),
    ];
    for (name, policy) in cases {
        let once = insert_casts(&example(name), &catalogue(), &policy).unwrap();
        assert!(once.casts_inserted > 0, "{name}");
        let twice = insert_casts(&once.graph, &catalogue(), &policy).unwrap();
        assert_eq!(twice.casts_inserted, 0, "{name} {}", policy.name);
        assert_eq!(twice.graph, once.graph, "{name} {}", policy.name);
    }
}

/// The example with every dimension shrunk by one mapping (equal sizes stay equal, so
/// broadcasting and matmul shapes still agree): the numerics do not depend on size, and the
/// reference evaluator is op by op.
fn shrunk(name: &str) -> Graph {
    let map = HashMap::from([
        (1024, 64),
        (4096, 128),
        (2048, 128),
        (3072, 96),
        (256, 32),
        (512, 64),
    ]);
    let mut g = example(name);
    for input in &mut g.inputs {
        for d in &mut input.shape {
            *d = map[d];
        }
    }
    types(&g);
    g
}

/// Largest |amp - reference| and largest |amp - reference| / (atol + rtol |reference|) over
/// every output; outputs must keep their dtypes.
fn compare(g: &Graph, amp: &Graph, seed: u64, rtol: f64, atol: f64) -> (f64, f64) {
    let values = amp_inputs(g, seed);
    let reference = eval::evaluate(g, &catalogue(), &values).unwrap();
    let got = eval::evaluate(amp, &catalogue(), &values).unwrap();
    let (mut max_err, mut max_ratio) = (0.0f64, 0.0f64);
    for name in &g.outputs {
        let (r, a) = (&reference[name], &got[name]);
        assert_eq!(a.dtype, r.dtype, "{name}");
        for (x, y) in r.values().into_iter().zip(a.values()) {
            assert!(x.is_finite() && y.is_finite(), "{name}: {x} vs {y}");
            let err = (x - y).abs();
            max_err = max_err.max(err);
            max_ratio = max_ratio.max(err / (atol + rtol * x.abs()));
        }
    }
    (max_err, max_ratio)
}

/// A policy for a target dtype name.
type PolicyFor = fn(&str) -> Policy;

/// f16: MXNet's fusion-test tolerances. bf16: both scaled by 8, because bf16 keeps 8
/// significand bits against f16's 11, so its unit roundoff (2^-9) is 8 times f16's (2^-12);
/// every rounding the policy implies is 8 times coarser.
const F16_TOL: (f64, f64) = (1e-2, 1e-3);
const BF16_TOL: (f64, f64) = (8e-2, 8e-3);

#[test]
fn amp_matches_the_f32_original_within_tolerance() {
    let cases: [(&str, PolicyFor); 4] = [
        ("amp_demo", |t| {
            let mut p = rfc_policy();
            p.target = DType::from_name(t).unwrap();
            p
        }),
        ("mlp_block", default_policy),
        ("gelu_bias", activations_low),
        ("lstm_cell", activations_low),
    ];
    let mut report = Vec::new();
    for (name, policy) in cases {
        let g = shrunk(name);
        for (target, (rtol, atol)) in [("f16", F16_TOL), ("bf16", BF16_TOL)] {
            let policy = policy(target);
            let amp = insert_casts(&g, &catalogue(), &policy).unwrap();
            assert!(amp.casts_inserted > 0, "{name} {target}");
            for seed in [1, 2] {
                let (err, ratio) = compare(&g, &amp.graph, seed, rtol, atol);
                report.push(format!(
                    "{name} {target} seed {seed}: {} casts, max error {err:.3e}, max error / tolerance {ratio:.3}",
                    amp.casts_inserted
                ));
                assert!(ratio <= 1.0, "{}", report.last().unwrap());
                // The casts must matter: AMP values differ from the f32 ones somewhere.
                assert!(err > 0.0, "{}", report.last().unwrap());
            }
        }
    }
    println!("{}", report.join("\n"));
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-amp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn load_errors_are_located() {
    let load = |text: &str| {
        AmpRules::load_str(text, "amp.ron", &catalogue())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        load(
            "Amp(policies: {\n  \"f16\": Policy(\n    target: \"f16\",\n    low_precision: [\"matmull\"],\n  ),\n})"
        ),
        "amp.ron:4:21: unknown op `matmull` (did you mean `matmul`?)"
    );
    assert_eq!(
        load(
            "Amp(policies: {\n  \"f16\": Policy(\n    target: \"f16\",\n    fp32: [\"exp\", \"sum\"],\n    widest: [\"sum\"],\n  ),\n})"
        ),
        "amp.ron:5:14: op `sum`: invalid rule: listed in both `fp32` and `widest`; an op has one treatment (use `conditional_fp32` for an attribute-dependent one)"
    );
    assert_eq!(
        load("Amp(policies: {\n  \"f16\": Policy(target: \"f16\", fp32: [\"exp\", \"exp\"]),\n})"),
        "amp.ron:2:46: op `exp`: invalid rule: listed twice in `fp32`"
    );
    assert_eq!(
        load("Amp(policies: {\n  \"half\": Policy(\n    target: \"f8\",\n  ),\n})"),
        "amp.ron:3:13: invalid rule: the `target` of AMP policy `half` must be \"f16\" or \"bf16\", found \"f8\""
    );
    // Unknown fields are refused (deny_unknown_fields); the wording after the position is ron's.
    let shown = load("Amp(policies: {\"f16\": Policy(target: \"f16\", lists: [])})");
    assert!(
        shown.starts_with("amp.ron:1:45: RON syntax: Unexpected field named `lists`"),
        "{shown}"
    );

    // Through a rule directory the message names the file as given.
    let dir = scratch("bad-rules");
    write(
        &dir.join("amp.ron"),
        "Amp(policies: {\"f16\": Policy(target: \"f16\", widest: [\"ad\"])})",
    );
    let err = RuleSet::load_dir(&dir).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}:1:54: unknown op `ad` (did you mean `add`?)",
            dir.join("amp.ron").display()
        )
    );
}

#[test]
fn embedded_defaults_load_and_a_user_file_replaces_them() {
    assert_eq!(RuleSet::defaults().amp, AmpRules::defaults());

    let dir = scratch("user-rules");
    // A user op in ops.ron may be listed: amp.ron is checked against the final catalogue.
    write(
        &dir.join("ops.ron"),
        "[Op(name: \"square\", kind: Pointwise, operands: [\"x\"], dtype: FloatPromote([\"x\"]), formula: \"x * x\")]",
    );
    write(
        &dir.join("amp.ron"),
        "Amp(policies: {\"half\": Policy(target: \"f16\", low_precision: [\"matmul\", \"square\"], widest: [\"add\"])})",
    );
    let rules = RuleSet::load_dir(&dir).unwrap();
    assert_eq!(rules.amp.names().collect::<Vec<_>>(), ["half"]);
    assert!(
        rules
            .amp
            .policy("half")
            .unwrap()
            .low_precision
            .contains("square")
    );
    let err = rules.amp.policy("f16").unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid input: no AMP policy `f16`; amp.ron defines half"
    );

    // The CLI picks the user's policy by name.
    let g = shrunk("mlp_block");
    let work = scratch("user-rules-run");
    let graph_path = work.join("mlp.ron");
    graph::file::save(&g, &graph_path).unwrap();
    let out = run_cli(&[
        "run",
        graph_path.to_str().unwrap(),
        "--backend",
        "reference",
        "--random-inputs",
        "--out",
        work.join("out").to_str().unwrap(),
        "--rules",
        dir.to_str().unwrap(),
        "--amp",
        "half",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_run_amp_matches_the_library() {
    let dir = scratch("cli");
    let g = shrunk("mlp_block");
    let graph_path = dir.join("mlp.ron");
    graph::file::save(&g, &graph_path).unwrap();
    for target in ["f16", "bf16"] {
        let out_dir = dir.join(target);
        let out = run_cli(&[
            "run",
            graph_path.to_str().unwrap(),
            "--backend",
            "reference",
            "--random-inputs",
            "--seed",
            "7",
            "--out",
            out_dir.to_str().unwrap(),
            "--amp",
            target,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let written = Tensor::read_npy(&out_dir.join("y.npy")).unwrap();

        // The library path: the same seeded inputs (they depend only on the seed and the
        // input's position, which AMP does not change), the same policy, unfused evaluation.
        let amp = insert_casts(&g, &catalogue(), &default_policy(target)).unwrap();
        let values = eval::random_inputs(&g, 7);
        let expected = &eval::evaluate(&amp.graph, &catalogue(), &values).unwrap()["y"];
        assert_eq!(written.dtype, DType::F32);
        assert_eq!(written.shape(), expected.shape());
        assert_eq!(written.values(), expected.values(), "{target}");

        // And AMP changed something: the f32 original gives other values.
        let plain = &eval::evaluate(&g, &catalogue(), &values).unwrap()["y"];
        assert_ne!(written.values(), plain.values(), "{target}");
    }

    let out = run_cli(&[
        "run",
        graph_path.to_str().unwrap(),
        "--backend",
        "reference",
        "--random-inputs",
        "--out",
        dir.join("x").to_str().unwrap(),
        "--amp",
        "fp16",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no AMP policy `fp16` (did you mean `f16`?)"),
        "{stderr}"
    );
}
