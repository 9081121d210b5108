//! ONNX import: small real models (built by tests/onnx/models.py with the onnx helper) run on
//! the reference and CPU backends against `onnx.reference.ReferenceEvaluator`; `fusebox
//! import` and the stored values of graph inputs; and hostile model files, which get errors
//! and never panics.
//!
//! The model tests are skipped, with a message, where `python3 -c "import onnx"` fails,
//! unless `FUSEBOX_REQUIRE_ONNX` is set (as `.ci/run` sets it). The hostile-file tests build
//! their models in Rust and always run.

use fusebox::onnx;
use fusebox::rules::RuleSet;
use fusebox::tensor::Tensor;
use onnx_protobuf::{
    GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, ValueInfoProto,
};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fusebox(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .output()
        .expect("the fusebox binary runs");
    let mut text = String::from_utf8_lossy(&out.stdout).to_string();
    text += &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-onnx-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds the Python models into a fresh directory, or `None` (after checking that this is
/// allowed) where the onnx wheel is missing.
fn models(tag: &str) -> Option<PathBuf> {
    crate::common::onnx_models::built_by("models.py", &temp_dir(tag))
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype, want.dtype, "{what}: dtype");
    // An f16 result may differ from the evaluator's by the last of its 10 mantissa bits
    // (2^-10 relative) where the two round intermediate values differently.
    let (abs, rel) = match got.dtype {
        fusebox::dtype::DType::F16 => (1e-3, 2e-3),
        _ => (1e-5, 1e-4),
    };
    for (i, (g, w)) in got.values().iter().zip(want.values().iter()).enumerate() {
        assert!(
            (g - w).abs() <= abs + rel * w.abs(),
            "{what}: element {i} is {g}, models.py expects {w}"
        );
    }
}

/// Runs `model` (with the inputs models.py recorded) on `backend` and compares every output
/// with the reference evaluator's.
fn check_model(dir: &Path, model: &str, outputs: &[&str], graph: &Path, backend: &str) {
    let out = dir.join(format!("out-{model}-{backend}"));
    let mut args: Vec<String> = vec![
        "run".into(),
        graph.display().to_string(),
        "--backend".into(),
        backend.into(),
        "--out".into(),
        out.display().to_string(),
    ];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(input) = file
            .strip_prefix(&format!("{model}.in."))
            .and_then(|r| r.strip_suffix(".npy"))
        {
            args.push("--input".into());
            args.push(format!("{input}={}", path.display()));
        }
    }
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, text) = fusebox(&words);
    assert!(ok, "{model} on {backend}: {text}");
    for (k, name) in outputs.iter().enumerate() {
        let got = Tensor::read_npy(&out.join(format!("{name}.npy"))).unwrap();
        let want = Tensor::read_npy(&dir.join(format!("{model}.out.{k}.npy"))).unwrap();
        assert_close(&format!("{model} `{name}` on {backend}"), &got, &want);
    }
}

const MODELS: [(&str, &[&str]); 5] = [
    ("mlp", &["y"]),
    ("lstm", &["h_next", "c_next"]),
    ("attention", &["y"]),
    ("layernorm", &["y", "m"]),
    ("layernorm_f16", &["y"]),
];

#[test]
fn real_models_match_the_onnx_reference_evaluator_on_reference_and_cpu() {
    let Some(dir) = models("real") else { return };
    for (model, outputs) in MODELS {
        let path = dir.join(format!("{model}.onnx"));
        for backend in ["reference", "cpu"] {
            check_model(&dir, model, outputs, &path, backend);
        }
    }
}

/// Models exported from PyTorch by both exporters (tests/onnx/torch_models.py, committed with
/// PyTorch's float64 outputs): an embedding lookup of run-time ids (negative ones counting
/// from the end) mean-pooled into a Linear (ONNX `Gather`), cross-entropy written as
/// `log_softmax` and `torch.gather` (`GatherElements`), and `F.cross_entropy` with class
/// weights and an ignored class over a batch of sequences (`SoftmaxCrossEntropyLoss`), a
/// two-layer bidirectional `nn.LSTM` and an `nn.GRU` (`LSTM`, `GRU`), a GPT-style language
/// model (embeddings, `nn.MultiheadAttention` blocks, the vocabulary head), and a top-2
/// mixture-of-experts layer (`TopK`, `ScatterElements`, `CumSum`), on the reference and CPU
/// backends.
#[test]
fn pytorch_models_with_run_time_indices_match_pytorch() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/torch");
    for exporter in ["ts", "dynamo"] {
        let dir = temp_dir(&format!("torch-{exporter}"));
        for entry in std::fs::read_dir(&source).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
        for model in [
            "embedding_pool",
            "target_log_prob",
            "cross_entropy",
            "lstm",
            "gru",
            "tiny_lm",
            "moe",
        ] {
            let graph = dir.join(format!("{model}.{exporter}.onnx"));
            for backend in ["reference", "cpu"] {
                check_model(&dir, model, &["y"], &graph, backend);
            }
        }
    }
}

/// `fusebox grad` of the PyTorch models (`torch_models.py`'s `DIFFERENTIATED`), by both
/// exporters: the joint graph, run on the reference and CPU backends with the recorded
/// cotangent and inputs, gives the gradients that `torch.autograd` computed in float64, with
/// respect to float inputs (a two-layer bidirectional `nn.LSTM`'s input and initial states,
/// an `nn.GRU`'s, the logits of two cross-entropy heads, a top-2 mixture of experts' input)
/// and to weights: an embedding table (a scatter_add of the pooled gradient), a GPT-style
/// model's token table, an attention projection and a bias, a router's and an expert's weights.
#[test]
fn gradients_of_pytorch_models_match_torch_autograd() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/torch");
    let dir = temp_dir("torch-grad");
    for (model, wrt) in [
        ("gru", "x"),
        ("lstm", "x,h0,c0"),
        ("embedding_pool", "emb.weight,fc.weight,fc.bias"),
        ("target_log_prob", "logits"),
        ("cross_entropy", "logits"),
        ("moe", "x,router.weight,experts.1.weight"),
        (
            "tiny_lm",
            "tok.weight,blocks.0.attn.out_proj.weight,blocks.0.fc1.bias",
        ),
    ] {
        for exporter in ["ts", "dynamo"] {
            gradients_match(&source, &dir, model, exporter, wrt);
        }
    }
}

/// `fusebox grad` of `source/<model>.<exporter>.onnx` with respect to `wrt` (comma-separated),
/// run on the reference and CPU backends on the recorded inputs and cotangent
/// (`<model>.in.*.npy`, `<model>.cot.y.npy`), gives the recorded gradients
/// (`<model>.grad.<value>.npy`).
fn gradients_match(source: &Path, dir: &Path, model: &str, exporter: &str, wrt: &str) {
    let inputs: Vec<String> = std::fs::read_dir(source)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|f| {
            let name = f
                .strip_prefix(&format!("{model}.in."))?
                .strip_suffix(".npy")?;
            Some(format!("{name}={}", source.join(&f).display()))
        })
        .collect();
    assert!(!inputs.is_empty(), "{model}: no recorded inputs");
    let joint = dir.join(format!("{model}.{exporter}.ron"));
    let onnx = source.join(format!("{model}.{exporter}.onnx"));
    let (ok, text) = fusebox(&[
        "grad",
        onnx.to_str().unwrap(),
        "--wrt",
        wrt,
        "--out",
        joint.to_str().unwrap(),
    ]);
    assert!(ok, "{model}.{exporter}: {text}");
    for backend in ["reference", "cpu"] {
        let out = dir.join(format!("out-{model}-{exporter}-{backend}"));
        let mut args: Vec<String> = vec![
            "run".into(),
            joint.display().to_string(),
            "--backend".into(),
            backend.into(),
            "--out".into(),
            out.display().to_string(),
            "--input".into(),
            format!(
                "grad_y={}",
                source.join(format!("{model}.cot.y.npy")).display()
            ),
        ];
        for input in &inputs {
            args.push("--input".into());
            args.push(input.clone());
        }
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, text) = fusebox(&words);
        assert!(ok, "{model}.{exporter} on {backend}: {text}");
        for value in wrt.split(',') {
            let got = Tensor::read_npy(&out.join(format!("grad_{value}.npy"))).unwrap();
            let want = source.join(format!("{model}.grad.{value}.npy"));
            let want = Tensor::read_npy(&want).unwrap();
            let what = format!("{model}.{exporter} grad_{value} on {backend}");
            assert_close(&what, &got, &want);
        }
    }
}

/// Convolutional models exported from PyTorch by both exporters (`tests/onnx/torch_cnn.py`,
/// eval mode, committed with PyTorch's float64 outputs and gradients): a small classifier
/// (conv-BN-ReLU, max pool, a strided conv without bias, BN-ReLU, global average pool,
/// Linear), a ResNet basic block (two conv-BN pairs and the residual add), and a grouped,
/// dilated conv with asymmetric strides and padding, a depthwise conv, an average pool with
/// `ceil_mode` that leaves the padding out of its counts, and a 1-D conv; and convs with
/// reflect and replicate padding (`Pad`), `InstanceNorm2d`, `GroupNorm` and a constant
/// `F.pad`; and a decoder of transposed convolutions (a 2x upsampling with batch norm, a
/// grouped, dilated one with `output_padding` and asymmetric strides, a 1-D one); and resizes
/// (`F.interpolate`: nearest, bilinear with and without `align_corners`, to sizes and by a
/// fractional scale, bicubic). Each matches
/// PyTorch on the reference and CPU backends, and `fusebox grad` matches `torch.autograd`
/// with respect to the input and to weights: the conv weights, batch norm's scale and shift,
/// the Linear's weight. (The dynamo exporter folds an eval-mode batch norm into the conv
/// before it, so that export's conv weights are not PyTorch's parameters: only the input's
/// and the unfolded weights' gradients are compared there.)
#[test]
fn convolutional_models_match_pytorch_forward_and_backward() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/cnn");
    let dir = temp_dir("torch-cnn");
    // `check_model` writes its outputs beside the inputs: into a copy.
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    for (model, ts_wrt, dynamo_wrt) in [
        ("cnn", "x,conv1.weight,bn2.weight,fc.weight", "x,fc.weight"),
        ("resnet_block", "x,conv1.weight,bn1.bias,conv2.weight", "x"),
        (
            "odd_convs",
            "x,grouped.weight,depthwise.bias,line.weight",
            "x,grouped.weight,depthwise.bias,line.weight",
        ),
        (
            "norms_pads",
            "x,reflect.weight,instance.weight,group.bias",
            "x,reflect.weight,instance.weight",
        ),
        (
            "decoder",
            "x,up.weight,grouped.weight,grouped.bias,line.weight",
            "x,grouped.weight,grouped.bias,line.weight",
        ),
        (
            "upsample",
            "x,conv.weight,conv.bias",
            "x,conv.weight,conv.bias",
        ),
    ] {
        for (exporter, wrt) in [("ts", ts_wrt), ("dynamo", dynamo_wrt)] {
            let graph = dir.join(format!("{model}.{exporter}.onnx"));
            for backend in ["reference", "cpu"] {
                check_model(&dir, model, &["y"], &graph, backend);
            }
            gradients_match(&dir, &dir, model, exporter, wrt);
        }
    }
}

#[test]
fn external_data_weights_are_read_from_beside_the_model() {
    let Some(dir) = models("external") else {
        return;
    };
    let path = dir.join("mlp_external.onnx");
    check_model(&dir, "mlp_external", &["y"], &path, "reference");
}

#[test]
fn imported_graph_binds_its_stored_weights_and_input_overrides_them() {
    let Some(dir) = models("import") else { return };
    let out = dir.join("imported");
    let model = dir.join("lstm.onnx");
    let (ok, text) = fusebox(&[
        "import",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let graph_text = std::fs::read_to_string(out.join("graph.ron")).unwrap();
    assert!(
        graph_text.contains(r#"Input(name: "w", dtype: "f32", shape: [6, 32], value: "w.npy")"#),
        "{graph_text}"
    );
    // The graph file, run from anywhere, finds its weights beside it.
    let graph = out.join("graph.ron");
    check_model(&dir, "lstm", &["h_next", "c_next"], &graph, "cpu");
    // --input replaces a stored value: zero recurrent weights change h_next.
    let zeros = Tensor::from_values(fusebox::dtype::DType::F32, &[8, 32], vec![0.0; 256]).unwrap();
    let zeros_path = dir.join("zeros.npy");
    zeros.write_npy(&zeros_path).unwrap();
    let run_out = dir.join("override");
    let args = [
        "run".to_string(),
        graph.display().to_string(),
        "--backend".into(),
        "reference".into(),
        "--out".into(),
        run_out.display().to_string(),
        "--input".into(),
        format!("x={}", dir.join("lstm.in.x.npy").display()),
        "--input".into(),
        format!("h={}", dir.join("lstm.in.h.npy").display()),
        "--input".into(),
        format!("c={}", dir.join("lstm.in.c.npy").display()),
        "--input".into(),
        format!("u={}", zeros_path.display()),
    ];
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, text) = fusebox(&words);
    assert!(ok, "{text}");
    let got = Tensor::read_npy(&run_out.join("h_next.npy")).unwrap();
    let stored = Tensor::read_npy(&dir.join("lstm.out.0.npy")).unwrap();
    assert_ne!(
        got.values(),
        stored.values(),
        "the --input value was not used"
    );
}

#[test]
fn graph_value_paths_that_leave_the_graph_directory_are_refused() {
    let dir = temp_dir("escape");
    let graph = dir.join("g.ron");
    std::fs::write(
        &graph,
        r#"Graph(name: "g", inputs: [Input(name: "w", dtype: "f32", shape: [2], value: "../w.npy")], nodes: [Node(name: "y", op: "neg", args: ["w"])], outputs: ["y"])"#,
    )
    .unwrap();
    let (ok, text) = fusebox(&["check", graph.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        text.contains("g.ron:1:") && text.contains("must be a relative path inside"),
        "{text}"
    );
}

// ------------------------------------------------------------------ hostile files, built in Rust

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    crate::common::onnx_models::value_info(name, 1, Some(dims))
}

fn node(op: &str, name: &str, inputs: &[&str], output: &str) -> NodeProto {
    let mut n = NodeProto::new();
    n.op_type = op.into();
    n.name = name.into();
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = vec![output.into()];
    n
}

/// y = x + w, with w an initializer of 4 floats.
fn model_with(w: TensorProto, nodes: Vec<NodeProto>) -> ModelProto {
    let mut graph = GraphProto::new();
    graph.name = "m".into();
    graph.input.push(value_info("x", &[4]));
    graph.output.push(value_info("y", &[4]));
    graph.initializer.push(w);
    graph.node = nodes;
    let mut model = ModelProto::new();
    model.ir_version = 8;
    let mut opset = OperatorSetIdProto::new();
    opset.version = 17;
    model.opset_import.push(opset);
    model.graph = Some(graph).into();
    model
}

fn weights(raw: Vec<u8>, dims: &[i64]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = "w".into();
    t.data_type = 1;
    t.dims = dims.to_vec();
    t.raw_data = raw;
    t
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn import_bytes(dir: &Path, bytes: &[u8]) -> Result<onnx::Imported, String> {
    let path = dir.join("model.onnx");
    std::fs::write(&path, bytes).unwrap();
    {
        let rules = RuleSet::defaults();
        onnx::import(&path, &rules.ops, &rules.onnx)
    }
    .map_err(|e| e.to_string())
}

#[test]
fn a_model_built_in_rust_imports_with_its_initializer_as_a_stored_parameter() {
    let dir = temp_dir("plain");
    let model = model_with(
        weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
        vec![node("Add", "add", &["x", "w"], "y")],
    );
    let imported = import_bytes(&dir, &model.write_to_bytes().unwrap()).unwrap();
    assert_eq!(imported.values["w"].values(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(imported.graph.outputs, vec!["y".to_string()]);
}

#[test]
fn truncated_and_corrupted_models_are_errors_not_panics() {
    let dir = temp_dir("truncated");
    let model = model_with(
        weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
        vec![node("Add", "add", &["x", "w"], "y")],
    );
    let bytes = model.write_to_bytes().unwrap();
    let path = dir.join("model.onnx");
    let rules = RuleSet::defaults();
    let mut errors = 0;
    for len in 0..bytes.len() {
        std::fs::write(&path, &bytes[..len]).unwrap();
        if onnx::import(&path, &rules.ops, &rules.onnx).is_err() {
            errors += 1;
        }
    }
    assert!(errors > bytes.len() / 2, "most truncations must be refused");
    // Seeded single-byte corruptions: whatever they do, they must not panic.
    let mut state: u64 = 0x9e3779b97f4a7c15;
    for _ in 0..2000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut bad = bytes.clone();
        let at = (state % bad.len() as u64) as usize;
        bad[at] = (state >> 32) as u8;
        std::fs::write(&path, &bad).unwrap();
        let _ = onnx::import(&path, &rules.ops, &rules.onnx);
    }
}

#[test]
fn huge_declared_tensor_sizes_are_refused_before_allocating() {
    let dir = temp_dir("huge");
    let model = model_with(
        weights(floats(&[1.0]), &[1 << 40, 1 << 40]),
        vec![node("Add", "add", &["x", "w"], "y")],
    );
    let err = import_bytes(&dir, &model.write_to_bytes().unwrap()).unwrap_err();
    assert!(
        err.contains("initializer `w`") && err.contains("elements"),
        "{err}"
    );
    let model = model_with(
        weights(floats(&[1.0]), &[4]),
        vec![node("Add", "add", &["x", "w"], "y")],
    );
    let err = import_bytes(&dir, &model.write_to_bytes().unwrap()).unwrap_err();
    assert!(err.contains("need 16 bytes of data, found 4"), "{err}");
}

fn external(location: &str, offset: &str, length: &str) -> TensorProto {
    let mut t = weights(vec![], &[4]);
    t.data_location = onnx_protobuf::tensor_proto::DataLocation::EXTERNAL.into();
    for (k, v) in [
        ("location", location),
        ("offset", offset),
        ("length", length),
    ] {
        let mut e = StringStringEntryProto::new();
        e.key = k.into();
        e.value = v.into();
        t.external_data.push(e);
    }
    t
}

#[test]
fn external_data_paths_that_escape_the_model_directory_are_refused() {
    let root = temp_dir("external-escape");
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(root.join("secret.bin"), floats(&[9.0; 4])).unwrap();
    std::fs::write(dir.join("w.bin"), floats(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let add = || vec![node("Add", "add", &["x", "w"], "y")];
    let ok = model_with(external("w.bin", "0", "16"), add());
    let imported = import_bytes(&dir, &ok.write_to_bytes().unwrap()).unwrap();
    assert_eq!(imported.values["w"].values(), vec![1.0, 2.0, 3.0, 4.0]);
    let secret = root.join("secret.bin").display().to_string();
    for location in ["../secret.bin", secret.as_str()] {
        let bad = model_with(external(location, "0", "16"), add());
        let err = import_bytes(&dir, &bad.write_to_bytes().unwrap()).unwrap_err();
        assert!(
            err.contains("relative path inside the model's directory"),
            "{err}"
        );
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(root.join("secret.bin"), dir.join("link.bin")).unwrap();
        let bad = model_with(external("link.bin", "0", "16"), add());
        let err = import_bytes(&dir, &bad.write_to_bytes().unwrap()).unwrap_err();
        assert!(err.contains("leaves the model's directory"), "{err}");
    }
    let past_end = model_with(external("w.bin", "8", "16"), add());
    let err = import_bytes(&dir, &past_end.write_to_bytes().unwrap()).unwrap_err();
    assert!(err.contains("do not fit"), "{err}");
}

#[test]
fn an_unsupported_model_gets_one_error_naming_every_unsupported_op_and_node() {
    let dir = temp_dir("unsupported");
    let model = model_with(
        weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
        vec![
            node("RoiAlign", "roi_a", &["x", "w"], "a"),
            node("LpPool", "pool", &["a"], "b"),
            node("RoiAlign", "roi_b", &["b", "w"], "y"),
        ],
    );
    let err = import_bytes(&dir, &model.write_to_bytes().unwrap()).unwrap_err();
    assert!(
        err.contains("2 op type(s)")
            && err.contains("RoiAlign: roi_a, roi_b")
            && err.contains("LpPool: pool"),
        "{err}"
    );
}

#[test]
fn onnx_names_stay_the_graph_names_and_map_to_safe_output_files() {
    let dir = temp_dir("names");
    let mut model = model_with(
        weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
        vec![
            node("Add", "add", &["x", "w"], "onnx::Tanh_21"),
            node("Tanh", "tanh", &["onnx::Tanh_21"], "23/out"),
        ],
    );
    model.graph.as_mut().unwrap().output[0].name = "23/out".into();
    let path = dir.join("names.onnx");
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    let x = Tensor::from_values(fusebox::dtype::DType::F32, &[4], vec![0.0; 4]).unwrap();
    x.write_npy(&dir.join("x.npy")).unwrap();
    let out = dir.join("out");
    let x_arg = format!("x={}", dir.join("x.npy").display());
    let (ok, text) = fusebox(&[
        "run",
        path.to_str().unwrap(),
        "--backend",
        "reference",
        "--input",
        &x_arg,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let y = Tensor::read_npy(&out.join("23%2Fout.npy")).unwrap();
    let want: Vec<f64> = [1.0f64, 2.0, 3.0, 4.0]
        .iter()
        .map(|v| f64::from((*v as f32).tanh()))
        .collect();
    for (g, w) in y.values().iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{g} vs {w}");
    }
}

#[test]
fn op_tables_name_only_catalogue_ops_and_their_attributes() {
    // The embedded table loads (RuleSet::defaults checks it against the catalogue).
    let rules = RuleSet::defaults();
    assert!(rules.onnx.knows("Relu") && rules.onnx.knows("Gemm"));
    assert_eq!(rules.onnx.file, "rules/onnx.ron");
    // Each mistake is refused at load, where the table says it, not when a model first
    // uses that Map.
    let cases = [
        (
            r#"[Map(onnx: "X", nodes: [Node(op: "neg", args: ["nowhere"])])]"#,
            "bad.ron:1:",
            "`nowhere` is neither an input",
        ),
        (
            "[\n  Map(onnx: \"X\", nodes: [Node(op: \"tahn\", args: [\"$0\"])]),\n]",
            "bad.ron:2:",
            "op `tahn` is not in the catalogue (did you mean `tanh`?)",
        ),
        (
            r#"[Map(onnx: "X", nodes: [Node(op: "sum", args: ["$0"], attrs: {"axis": [0]})])]"#,
            "bad.ron:1:",
            "op `sum` has no attribute `axis`",
        ),
        (
            r#"[Map(onnx: "X", chain: "plus")]"#,
            "bad.ron:1:",
            "op `plus` is not in the catalogue",
        ),
    ];
    for (text, at, message) in cases {
        let err = fusebox::rules::MapTable::load_str(text, "bad.ron", &rules.ops)
            .unwrap_err()
            .to_string();
        assert!(err.contains(at) && err.contains(message), "{text}: {err}");
    }
}

/// A rule directory's `onnx.ron` replaces the embedded table: a model is imported by the
/// directory's Maps, and errors name the directory's file. The repository's own `rules/`
/// (which holds onnx.ron) loads as a rule directory.
#[test]
fn a_rule_directory_brings_its_own_op_table() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = RuleSet::load_dir(&repo.join("rules")).unwrap();
    assert_eq!(shipped.onnx.maps.len(), RuleSet::defaults().onnx.maps.len());
    let dir = temp_dir("own-table");
    // Relu read as the catalogue's `neg`: a table that changes what an ONNX op means must
    // change the imported graph.
    let table = dir.join("onnx.ron");
    std::fs::write(
        &table,
        r#"[
            Map(onnx: "Relu", nodes: [Node(op: "neg", args: ["$0"])]),
            Map(onnx: "Add", nodes: [Node(op: "add", args: ["$0", "$1"])]),
        ]"#,
    )
    .unwrap();
    let rules = RuleSet::load_dir(&dir).unwrap();
    assert_eq!(rules.onnx.file, table.display().to_string());
    let import = |first: &str| {
        let model = model_with(
            weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
            vec![
                node(first, "first", &["x"], "a"),
                node("Add", "add", &["a", "w"], "y"),
            ],
        );
        let path = dir.join("model.onnx");
        std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
        onnx::import(&path, &rules.ops, &rules.onnx)
    };
    let imported = import("Relu").unwrap();
    let ops: Vec<&str> = imported.graph.nodes.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(ops, ["neg", "add"]);
    // An op the directory's table lacks is unsupported, though the embedded table has it.
    let err = import("Tanh").unwrap_err().to_string();
    assert!(
        err.contains("cannot import") && err.contains("Tanh: first"),
        "{err}"
    );
}

fn int_attr(name: &str, value: i64) -> onnx_protobuf::AttributeProto {
    let mut a = onnx_protobuf::AttributeProto::new();
    a.name = name.into();
    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
    a.i = value;
    a
}

#[test]
fn extreme_attribute_values_are_errors_not_overflows() {
    let dir = temp_dir("extreme");
    let rules = RuleSet::defaults();
    let cases: Vec<(&str, Vec<onnx_protobuf::AttributeProto>, &[&str])> = vec![
        ("Flatten", vec![int_attr("axis", i64::MIN)], &["x"]),
        (
            "Split",
            vec![int_attr("axis", 0), int_attr("num_outputs", i64::MAX)],
            &["x"],
        ),
        ("Softmax", vec![int_attr("axis", i64::MIN)], &["x"]),
        ("Gather", vec![int_attr("axis", i64::MAX)], &["x", "w"]),
        (
            "Shape",
            vec![int_attr("start", i64::MIN), int_attr("end", i64::MAX)],
            &["x"],
        ),
    ];
    for (op, attrs, inputs) in cases {
        let mut n = node(op, "n", inputs, "y");
        n.attribute = attrs;
        let model = model_with(weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]), vec![n]);
        let path = dir.join(format!("{op}.onnx"));
        std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
        // Shape with clamped bounds is valid (a constant output); the others are refused.
        match onnx::import(&path, &rules.ops, &rules.onnx) {
            Ok(_) => assert_eq!(op, "Shape", "{op} with extreme attributes imported"),
            Err(e) => assert!(e.to_string().contains("node `n`"), "{op}: {e}"),
        }
    }
}

fn string_attr(name: &str, value: &str) -> onnx_protobuf::AttributeProto {
    let mut a = onnx_protobuf::AttributeProto::new();
    a.name = name.into();
    a.type_ = onnx_protobuf::attribute_proto::AttributeType::STRING.into();
    a.s = value.as_bytes().to_vec();
    a
}

fn ints_attr(name: &str, values: &[i64]) -> onnx_protobuf::AttributeProto {
    let mut a = onnx_protobuf::AttributeProto::new();
    a.name = name.into();
    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INTS.into();
    a.ints = values.to_vec();
    a
}

/// Window ops with hostile attributes (a window of more offsets than fusebox expands, sizes,
/// strides, dilations and pads at the ends of i64, zero and negative ones, a kernel_shape
/// that disagrees with the weight; transposed convolutions whose pads leave nothing or
/// disagree with `output_shape`; resizes by huge, negative or zero scales and sizes, or with
/// modes ONNX does not define, an antialiased filter wider than fusebox expands, repeated
/// axes, and a crop without its region of
/// interest) are located errors, quickly,
/// never an overflow, a panic or a graph that takes minutes to build.
#[test]
fn hostile_window_attributes_are_located_errors() {
    let dir = temp_dir("windows");
    let rules = RuleSet::defaults();
    let pool = |op: &str, attrs: Vec<onnx_protobuf::AttributeProto>| {
        let mut n = node(op, "n", &["x"], "y");
        n.attribute = attrs;
        n
    };
    let conv = |attrs: Vec<onnx_protobuf::AttributeProto>| {
        let mut n = node("Conv", "n", &["x", "w"], "y");
        n.attribute = attrs;
        n
    };
    let transposed = |attrs: Vec<onnx_protobuf::AttributeProto>| {
        let mut n = node("ConvTranspose", "n", &["x", "w"], "y");
        n.attribute = attrs;
        n
    };
    // Resize by the named constant: scales, or for `zerosize`, sizes.
    let resize = |by: &str, attrs: Vec<onnx_protobuf::AttributeProto>| {
        let inputs: Vec<&str> = match by {
            "zerosize" => vec!["x", "", "", by],
            _ => vec!["x", "", by],
        };
        let mut n = node("Resize", "n", &inputs, "y");
        n.attribute = attrs;
        n
    };
    let k = |v: &[i64]| ints_attr("kernel_shape", v);
    let cases = vec![
        pool("MaxPool", vec![k(&[2000])]),
        pool("MaxPool", vec![k(&[i64::MAX])]),
        pool("AveragePool", vec![k(&[0])]),
        pool("AveragePool", vec![k(&[-3])]),
        pool("MaxPool", vec![k(&[3]), ints_attr("strides", &[0])]),
        pool("MaxPool", vec![k(&[3]), ints_attr("strides", &[i64::MAX])]),
        pool(
            "MaxPool",
            vec![k(&[3]), ints_attr("dilations", &[i64::MAX])],
        ),
        pool(
            "AveragePool",
            vec![k(&[3]), ints_attr("pads", &[i64::MAX, 1])],
        ),
        pool("AveragePool", vec![k(&[3]), ints_attr("pads", &[-1, 0])]),
        pool(
            "AveragePool",
            vec![k(&[3]), ints_attr("pads", &[(1 << 24) + 1, 0])],
        ),
        pool("MaxPool", vec![k(&[60])]),
        conv(vec![int_attr("group", 0)]),
        conv(vec![int_attr("group", i64::MIN)]),
        conv(vec![k(&[5])]),
        conv(vec![ints_attr("dilations", &[i64::MAX])]),
        transposed(vec![int_attr("group", 0)]),
        transposed(vec![ints_attr("strides", &[i64::MAX])]),
        transposed(vec![ints_attr("output_padding", &[i64::MAX])]),
        transposed(vec![ints_attr("output_padding", &[-1])]),
        // Pads that leave no output, and an output_shape the pads do not give.
        transposed(vec![ints_attr("pads", &[60, 60])]),
        transposed(vec![
            ints_attr("pads", &[1, 1]),
            ints_attr("output_shape", &[7]),
        ]),
        transposed(vec![ints_attr("output_shape", &[i64::MAX])]),
        transposed(vec![k(&[4])]),
        resize("bigscale", vec![]),
        resize("negscale", vec![]),
        resize("zerosize", vec![]),
        resize("scales", vec![string_attr("mode", "area")]),
        resize("scales", vec![string_attr("nearest_mode", "nearest")]),
        resize(
            "scales",
            vec![string_attr("coordinate_transformation_mode", "corners")],
        ),
        // An antialiased cubic shrinking 50 positions to 1: 200 taps a position.
        resize(
            "tinyscale",
            vec![int_attr("antialias", 1), string_attr("mode", "cubic")],
        ),
        resize("scales", vec![ints_attr("axes", &[2, 2])]),
        // A crop without its region of interest.
        resize(
            "scales",
            vec![string_attr(
                "coordinate_transformation_mode",
                "tf_crop_and_resize",
            )],
        ),
    ];
    for (i, n) in cases.into_iter().enumerate() {
        let mut graph = GraphProto::new();
        graph.name = "m".into();
        graph.input.push(value_info("x", &[1, 2, 50]));
        graph.output.push(value_info("y", &[1]));
        let mut w = weights(floats(&[0.5; 12]), &[2, 2, 3]);
        w.name = "w".into();
        graph.initializer.push(w);
        for (name, values) in [
            ("scales", [1.0, 1.0, 2.0]),
            ("bigscale", [1.0, 1.0, 1e9]),
            ("negscale", [1.0, 1.0, -2.0]),
            ("zerosize", [1.0, 2.0, 0.0]),
            ("tinyscale", [1.0, 1.0, 0.02]),
        ] {
            let mut t = weights(floats(&values), &[3]);
            t.name = name.into();
            graph.initializer.push(t);
        }
        graph.node = vec![n];
        let model = crate::common::onnx_models::model_of(graph, 17);
        let path = dir.join(format!("case{i}.onnx"));
        std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
        let started = std::time::Instant::now();
        let err = match onnx::import(&path, &rules.ops, &rules.onnx) {
            Ok(_) => panic!("case {i} imported"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("node `n`"), "case {i}: {err}");
        assert!(
            started.elapsed().as_secs() < 5,
            "case {i} took {:?}",
            started.elapsed()
        );
    }
}

// ------------------------------------------------------------------ grad keeps stored values

/// Writes `values` as an f32 `.npy` of shape [4] and returns its path as text.
fn npy(dir: &Path, name: &str, values: &[f64]) -> String {
    let path = dir.join(name);
    Tensor::from_values(fusebox::dtype::DType::F32, &[4], values.to_vec())
        .unwrap()
        .write_npy(&path)
        .unwrap();
    path.display().to_string()
}

#[test]
fn grad_of_an_imported_model_keeps_its_weights_and_runs_without_them() {
    // y = x * w with w = [1, 2, 3, 4] stored in the model: dy/dw = g * x.
    let dir = temp_dir("grad-values");
    let model = model_with(
        weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
        vec![node("Mul", "mul", &["x", "w"], "y")],
    );
    let path = dir.join("model.onnx");
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    let out_dir = dir.join("elsewhere");
    let joint = out_dir.join("joint.ron");
    let (ok, text) = fusebox(&[
        "grad",
        &path.display().to_string(),
        "--out",
        &joint.display().to_string(),
    ]);
    assert!(ok, "{text}");
    let written = std::fs::read_to_string(&joint).unwrap();
    assert!(written.contains(r#"value: "w.npy""#), "{written}");
    assert_eq!(
        Tensor::read_npy(&out_dir.join("w.npy")).unwrap().values(),
        vec![1.0, 2.0, 3.0, 4.0]
    );
    // Only the model input and the cotangent are given: the weight comes from its file.
    let x = npy(&dir, "x.npy", &[0.5, -1.0, 2.0, 3.0]);
    let g = npy(&dir, "g.npy", &[1.0, 2.0, -1.0, 0.25]);
    let results = dir.join("results");
    let (ok, text) = fusebox(&[
        "run",
        &joint.display().to_string(),
        "--input",
        &format!("x={x}"),
        "--input",
        &format!("grad_y={g}"),
        "--backend",
        "cpu",
        "--out",
        &results.display().to_string(),
    ]);
    assert!(ok, "{text}");
    let read = |name: &str| Tensor::read_npy(&results.join(name)).unwrap().values();
    assert_eq!(read("y.npy"), vec![0.5, -2.0, 6.0, 12.0]);
    assert_eq!(read("grad_w.npy"), vec![0.5, -2.0, -2.0, 0.75]);
    assert_eq!(read("grad_x.npy"), vec![1.0, 4.0, -3.0, 1.0]);

    // The split halves carry the weight too.
    let split = dir.join("split");
    let (ok, text) = fusebox(&[
        "grad",
        &path.display().to_string(),
        "--split",
        &split.display().to_string(),
    ]);
    assert!(ok, "{text}");
    let forward = std::fs::read_to_string(split.join("forward.ron")).unwrap();
    assert!(forward.contains(r#"value: "w.npy""#), "{forward}");
    assert!(split.join("w.npy").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn grad_refers_to_value_files_inside_the_output_directory_and_writes_all_or_nothing() {
    let dir = temp_dir("grad-inside");
    std::fs::create_dir_all(dir.join("weights")).unwrap();
    npy(&dir.join("weights"), "w.npy", &[1.0, 2.0, 3.0, 4.0]);
    let graph = dir.join("g.ron");
    std::fs::write(
        &graph,
        r#"Graph(name: "g", inputs: [Input(name: "x", dtype: "f32", shape: [4]),
            Input(name: "w", dtype: "f32", shape: [4], value: "weights/w.npy")],
          nodes: [Node(name: "y", op: "mul", args: ["x", "w"])], outputs: ["y"])"#,
    )
    .unwrap();
    // Written beside the graph: the existing file is named, nothing is copied.
    let joint = dir.join("joint.ron");
    let (ok, text) = fusebox(&[
        "grad",
        &graph.display().to_string(),
        "--out",
        &joint.display().to_string(),
    ]);
    assert!(ok, "{text}");
    let written = std::fs::read_to_string(&joint).unwrap();
    assert!(written.contains(r#"value: "weights/w.npy""#), "{written}");
    assert!(!dir.join("w.npy").exists());
    let (ok, text) = fusebox(&["check", &joint.display().to_string()]);
    assert!(ok, "{text}");

    // Elsewhere, with a directory where the copy would go: the copy takes a free name
    // beside it, and the directory stays.
    let blocked = dir.join("blocked");
    std::fs::create_dir_all(blocked.join("w.npy")).unwrap();
    let target = blocked.join("joint.ron");
    let (ok, text) = fusebox(&[
        "grad",
        &graph.display().to_string(),
        "--out",
        &target.display().to_string(),
    ]);
    assert!(ok, "{text}");
    assert!(blocked.join("w.npy").is_dir());
    let written = std::fs::read_to_string(&target).unwrap();
    assert!(written.contains(r#"value: "w~2.npy""#), "{written}");

    // With a directory where the graph must go: exit 1 and no file at all.
    let blocked = dir.join("blocked2");
    std::fs::create_dir_all(blocked.join("joint.ron")).unwrap();
    let target = blocked.join("joint.ron");
    let (ok, text) = fusebox(&[
        "grad",
        &graph.display().to_string(),
        "--out",
        &target.display().to_string(),
    ]);
    assert!(!ok);
    assert!(text.contains("none of the files was written"), "{text}");
    assert_eq!(std::fs::read_dir(&blocked).unwrap().count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Output `y` of `model` (imported into `dir`, its stored weights bound) on the reference
/// evaluator, for x = [0.5, -1, 2, 3].
fn y_of_x_0_5_m1_2_3(dir: &Path, model: &ModelProto) -> Vec<f64> {
    let imported = import_bytes(dir, &model.write_to_bytes().unwrap()).unwrap();
    let rules = RuleSet::defaults();
    let x =
        Tensor::from_values(fusebox::dtype::DType::F32, &[4], vec![0.5, -1.0, 2.0, 3.0]).unwrap();
    let mut inputs: fusebox::eval::Tensors = imported.values.clone().into_iter().collect();
    inputs.insert("x".into(), x);
    let out = fusebox::eval::evaluate(&imported.graph, &rules.ops, &inputs).unwrap();
    out["y"].values()
}

#[test]
fn reduce_sum_with_noop_with_empty_axes_and_no_axes_is_the_identity() {
    // ReduceSum(x) with noop_with_empty_axes = 1 and no axes input returns x (ONNX opset 13
    // on); with the default 0 it would sum every axis.
    let dir = temp_dir("noop-axes");
    let mut reduce = node("ReduceSum", "reduce", &["x"], "s");
    reduce.attribute.push(int_attr("noop_with_empty_axes", 1));
    let model = model_with(
        weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
        vec![reduce, node("Add", "add", &["s", "w"], "y")],
    );
    let y = y_of_x_0_5_m1_2_3(&dir, &model);
    assert_eq!(y, vec![1.5, 1.0, 5.0, 7.0]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reduce_sum_with_an_empty_axes_input_sums_every_axis() {
    // ReduceSum(x, axes = []) with the default noop_with_empty_axes = 0 reduces every axis
    // (ONNX opset 13 on): an empty list is not "reduce nothing".
    let dir = temp_dir("empty-axes");
    let mut empty = onnx_protobuf::TensorProto::new();
    empty.data_type = 7; // INT64
    empty.dims = vec![0];
    let mut value = onnx_protobuf::AttributeProto::new();
    value.name = "value".into();
    value.type_ = onnx_protobuf::attribute_proto::AttributeType::TENSOR.into();
    value.t = Some(empty).into();
    let mut constant = node("Constant", "axes", &[], "axes");
    constant.attribute.push(value);
    let model = model_with(
        weights(floats(&[1.0, 2.0, 3.0, 4.0]), &[4]),
        vec![
            constant,
            node("ReduceSum", "reduce", &["x", "axes"], "s"),
            node("Add", "add", &["s", "w"], "y"),
        ],
    );
    let y = y_of_x_0_5_m1_2_3(&dir, &model);
    // sum(x) = 4.5, kept as [1] and added to w.
    assert_eq!(y, vec![5.5, 6.5, 7.5, 8.5]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An LSTM over a sequence too long to unroll is refused at its node before any step is
/// written (the bound of composite expansion), and one with a weight of the wrong shape names
/// the input.
#[test]
fn recurrent_ops_too_long_to_unroll_or_misshapen_are_located_errors() {
    let dir = temp_dir("recurrent-limits");
    let lstm = |seq: i64, w_rows: i64| {
        let mut model = model_with(
            weights(floats(&vec![0.5; (w_rows * 2) as usize]), &[1, w_rows, 2]),
            vec![{
                let mut n = node("LSTM", "long_lstm", &["x", "w", "r"], "y");
                let mut hidden = onnx_protobuf::AttributeProto::new();
                hidden.name = "hidden_size".into();
                hidden.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
                hidden.i = 2;
                n.attribute.push(hidden);
                n
            }],
        );
        let graph = model.graph.as_mut().unwrap();
        graph.input[0] = value_info("x", &[seq, 1, 2]);
        graph.output[0] = value_info("y", &[seq, 1, 1, 2]);
        let mut r = weights(floats(&[0.25; 16]), &[1, 8, 2]);
        r.name = "r".into();
        graph.initializer.push(r);
        model.write_to_bytes().unwrap()
    };
    let err = import_bytes(&dir, &lstm(100_000, 8)).unwrap_err();
    assert!(
        err.contains("long_lstm") && err.contains("unrolling 100000 steps"),
        "{err}"
    );
    let err = import_bytes(&dir, &lstm(3, 6)).unwrap_err();
    assert!(
        err.contains("long_lstm") && err.contains("W has shape [1, 6, 2]"),
        "{err}"
    );
    assert!(import_bytes(&dir, &lstm(3, 8)).is_ok());
}

/// Integer Mod at run time (i32, both signs of both operands, the extremes, a zero divisor)
/// takes the divisor's sign, and with `fmod` the dividend's, as Python's `%` and C's `fmod`
/// do; `x mod 0` is 0 (NumPy's). Folded on constants, i64 gives the same.
#[test]
fn integer_mod_follows_the_divisor_or_with_fmod_the_dividend() {
    let dir = temp_dir("int-mod");
    let xs: [i64; 8] = [7, -7, 7, -7, 0, i32::MIN as i64, i32::MAX as i64, 5];
    let ys: [i64; 8] = [3, 3, -3, -3, 4, -1, 2, 0];
    let python = |x: i64, y: i64| {
        if y == 0 {
            0
        } else {
            x.rem_euclid(y) + if y < 0 && x.rem_euclid(y) != 0 { y } else { 0 }
        }
    };
    let c = |x: i64, y: i64| {
        if y == 0 {
            0
        } else {
            x.checked_rem(y).unwrap_or(0)
        }
    };
    for fmod in [0, 1] {
        let mut m = node("Mod", "m", &["x", "w"], "y");
        let mut attr = onnx_protobuf::AttributeProto::new();
        attr.name = "fmod".into();
        attr.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
        attr.i = fmod;
        m.attribute.push(attr);
        let mut w = TensorProto::new();
        w.name = "w".into();
        w.data_type = 6;
        w.dims = vec![8];
        w.int32_data = ys.iter().map(|&y| y as i32).collect();
        let mut model = model_with(w, vec![m]);
        let graph = model.graph.as_mut().unwrap();
        graph.input[0] = crate::common::onnx_models::value_info("x", 6, Some(&[8]));
        graph.output[0] = crate::common::onnx_models::value_info("y", 6, Some(&[8]));
        let imported = import_bytes(&dir, &model.write_to_bytes().unwrap()).unwrap();
        let x = Tensor::from_ints(fusebox::dtype::DType::I32, &[8], xs.to_vec()).unwrap();
        let mut inputs: fusebox::eval::Tensors = imported.values.clone().into_iter().collect();
        inputs.insert("x".into(), x);
        let rules = RuleSet::defaults();
        let out = fusebox::eval::evaluate(&imported.graph, &rules.ops, &inputs).unwrap();
        let got = out["y"].ints().iter().copied().collect::<Vec<i64>>();
        let want: Vec<i64> = xs
            .iter()
            .zip(&ys)
            .map(|(&x, &y)| if fmod == 1 { c(x, y) } else { python(x, y) })
            .collect();
        assert_eq!(got, want, "fmod {fmod}");
    }
}

/// OneHot at opset 17 (the wheel's node tests are opset 11, which fusebox does not read):
/// indices in range, negative (from the end) and out of range (all off), along the last axis
/// and along axis 0, with float values.
#[test]
fn one_hot_marks_each_index() {
    let dir = temp_dir("one-hot");
    for axis in [-1i64, 0] {
        let mut hot = node("OneHot", "hot", &["x", "depth", "w"], "y");
        let mut attr = onnx_protobuf::AttributeProto::new();
        attr.name = "axis".into();
        attr.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
        attr.i = axis;
        hot.attribute.push(attr);
        let mut values = weights(floats(&[-1.0, 3.0]), &[2]);
        values.name = "w".into();
        let mut model = model_with(values, vec![hot]);
        let graph = model.graph.as_mut().unwrap();
        let mut depth = TensorProto::new();
        depth.name = "depth".into();
        depth.data_type = 7;
        depth.int64_data = vec![3];
        graph.initializer.push(depth);
        graph.input[0] = crate::common::onnx_models::value_info("x", 7, Some(&[4]));
        graph.output[0] = value_info("y", if axis == 0 { &[3, 4] } else { &[4, 3] });
        let imported = import_bytes(&dir, &model.write_to_bytes().unwrap()).unwrap();
        let x = Tensor::from_ints(fusebox::dtype::DType::I64, &[4], vec![0, 2, -1, 5]).unwrap();
        let mut inputs: fusebox::eval::Tensors = imported.values.clone().into_iter().collect();
        inputs.insert("x".into(), x);
        let rules = RuleSet::defaults();
        let out = fusebox::eval::evaluate(&imported.graph, &rules.ops, &inputs).unwrap();
        // Rows: index 0, 2, -1 (= 2), 5 (out of range: all off).
        let rows = [
            [3.0, -1.0, -1.0],
            [-1.0, -1.0, 3.0],
            [-1.0, -1.0, 3.0],
            [-1.0, -1.0, -1.0],
        ];
        let want: Vec<f64> = if axis == 0 {
            (0..3)
                .flat_map(|c| rows.iter().map(move |r| r[c]))
                .collect()
        } else {
            rows.iter().flatten().copied().collect()
        };
        assert_eq!(out["y"].values(), want, "axis {axis}");
    }
}

/// Tile with constant repeats (the wheel's node tests pass them as a run-time input, which a
/// static shape cannot take): [2, 3] repeated [2, 1] and [1, 3] and [2, 2], against NumPy's
/// `tile` worked by hand.
#[test]
fn tile_repeats_each_axis() {
    let dir = temp_dir("tile");
    let x: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    for (reps, shape) in [([2i64, 1], [4i64, 3]), ([1, 3], [2, 9]), ([2, 2], [4, 6])] {
        let mut w = TensorProto::new();
        w.name = "w".into();
        w.data_type = 7;
        w.dims = vec![2];
        w.int64_data = reps.to_vec();
        let mut model = model_with(w, vec![node("Tile", "t", &["x", "w"], "y")]);
        let graph = model.graph.as_mut().unwrap();
        graph.input[0] = value_info("x", &[2, 3]);
        graph.output[0] = value_info("y", &shape);
        let imported = import_bytes(&dir, &model.write_to_bytes().unwrap()).unwrap();
        let input = Tensor::from_values(
            fusebox::dtype::DType::F32,
            &[2, 3],
            x.iter().map(|&v| f64::from(v)).collect(),
        )
        .unwrap();
        let mut inputs: fusebox::eval::Tensors = imported.values.clone().into_iter().collect();
        inputs.insert("x".into(), input);
        let rules = RuleSet::defaults();
        let out = fusebox::eval::evaluate(&imported.graph, &rules.ops, &inputs).unwrap();
        let (rows, cols) = (shape[0] as usize, shape[1] as usize);
        let want: Vec<f64> = (0..rows * cols)
            .map(|q| f64::from(x[(q / cols) % 2 * 3 + (q % cols) % 3]))
            .collect();
        assert_eq!(out["y"].shape(), &[rows, cols]);
        assert_eq!(out["y"].values(), want, "repeats {reps:?}");
    }
}
