//! ONNX models with dynamic axes (symbolic dimensions `batch`, `seq`), exported from PyTorch by
//! both exporters (`tests/onnx/torch_dynamic.py`, committed with PyTorch's float64 outputs at
//! two sizes in `tests/onnx/dynamic/`): `fusebox run` matches PyTorch at each size on the
//! reference and CPU backends; one compiled model runs both sizes and compiles its kernels once;
//! `bench` at a second size finds its kernels in the disk cache; `optimize` says which sizes it
//! priced; and arrays that disagree with the declared shapes are refused at their input.

use fusebox::dtype::DType;
use fusebox::graph::dims::DimSizes;
use fusebox::model::{Backend, CompileOptions, Model};
use fusebox::rules::RuleSet;
use fusebox::tensor::Tensor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/dynamic")
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-dims-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `fusebox ARGS` with `FUSEBOX_CACHE_DIR` set to `cache` when given: success, and what it
/// printed.
fn fusebox(args: &[String], cache: Option<&Path>) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    command.args(args);
    if let Some(cache) = cache {
        command.env("FUSEBOX_CACHE_DIR", cache);
    }
    let out = command.output().expect("the fusebox binary runs");
    let mut text = String::from_utf8_lossy(&out.stdout).to_string();
    text += &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[track_caller]
fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    for (i, (g, w)) in got.values().iter().zip(want.values()).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
            "{what}: element {i} is {g}, PyTorch gives {w}"
        );
    }
}

/// The recorded arrays of `model` at size `k`, by input name.
fn arrays(model: &str, k: usize) -> BTreeMap<String, Tensor> {
    let prefix = format!("{model}.{k}.in.");
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(models()).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(input) = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".npy"))
        {
            found.insert(input.to_string(), Tensor::read_npy(&path).unwrap());
        }
    }
    assert!(!found.is_empty(), "no inputs recorded for {model}.{k}");
    found
}

fn expected(model: &str, k: usize) -> Tensor {
    Tensor::read_npy(&models().join(format!("{model}.{k}.out.0.npy"))).unwrap()
}

/// The models, each at two sizes of its dynamic axes. The TorchScript exporter's tiny LM is
/// left out: it bakes the traced sequence length into nn.MultiheadAttention's reshapes (see
/// `torchscript_bakes_traced_sizes_and_the_error_says_which_sizes_were_tried`).
const MODELS: [(&str, &[&str]); 5] = [
    ("mlp", &["ts", "dynamo"]),
    ("embedding_pool", &["ts", "dynamo"]),
    ("gru", &["ts", "dynamo"]),
    ("tiny_lm", &["dynamo"]),
    ("llama_block", &["ts", "dynamo"]),
];

#[test]
fn pytorch_models_with_dynamic_axes_match_pytorch_at_two_sizes() {
    let out = temp_dir("run");
    for (model, exporters) in MODELS {
        for exporter in exporters {
            let path = models().join(format!("{model}.{exporter}.onnx"));
            for k in 0..2 {
                for backend in ["reference", "cpu"] {
                    let dir = out.join(format!("{model}-{exporter}-{k}-{backend}"));
                    let mut args: Vec<String> = vec![
                        "run".into(),
                        path.display().to_string(),
                        "--backend".into(),
                        backend.into(),
                        "--out".into(),
                        dir.display().to_string(),
                    ];
                    for name in arrays(model, k).keys() {
                        let file = models().join(format!("{model}.{k}.in.{name}.npy"));
                        args.push("--input".into());
                        args.push(format!("{name}={}", file.display()));
                    }
                    let (ok, text) = fusebox(&args, None);
                    let what = format!("{model}.{exporter} at size {k} on {backend}");
                    assert!(ok, "{what}: {text}");
                    let got = Tensor::read_npy(&dir.join("y.npy")).unwrap();
                    assert_close(&what, &got, &expected(model, k));
                }
            }
        }
    }
}

#[test]
fn one_compiled_model_runs_two_sizes_and_compiles_its_kernels_once() {
    let rules = RuleSet::defaults();
    for model in ["mlp", "tiny_lm"] {
        let path = models().join(format!("{model}.dynamo.onnx"));
        let loaded = Model::load(&path, &rules).unwrap();
        let names = loaded.declared().names();
        assert!(names.contains(&"batch"), "{model}: {names:?}");
        let first = arrays(model, 0);
        let sized = Model::load_sized(
            &path,
            &rules,
            &loaded.specialization_for(&first).unwrap().sizes,
        )
        .unwrap();
        let mut cpu = sized
            .compile(Backend::Cpu, &CompileOptions::default())
            .unwrap();
        let once = cpu.kernel_builds();
        assert!(
            once.compiled + once.disk_hits + once.memory_hits > 0,
            "{model}: nothing built"
        );
        for k in [0, 1, 0] {
            let got = cpu.run(&arrays(model, k)).unwrap();
            assert_close(
                &format!("{model} at size {k}"),
                &got["y"],
                &expected(model, k),
            );
            assert_eq!(
                cpu.sizes(),
                &sized.specialization_for(&arrays(model, k)).unwrap().sizes
            );
        }
        let after = cpu.kernel_builds();
        assert_eq!(
            after.compiled, once.compiled,
            "{model}: the second size compiled kernels ({once:?} -> {after:?})"
        );
        assert!(
            after.memory_hits > once.memory_hits,
            "{model}: the second size's kernels were not found in memory ({once:?} -> {after:?})"
        );
        // The reference backend re-specializes the same way.
        let mut reference = loaded
            .compile(Backend::Reference, &CompileOptions::default())
            .unwrap();
        let got = reference.run(&arrays(model, 1)).unwrap();
        assert_close(
            &format!("{model} on reference"),
            &got["y"],
            &expected(model, 1),
        );
    }
}

#[test]
fn arrays_that_disagree_with_the_declaration_are_refused_at_their_input() {
    let rules = RuleSet::defaults();
    let model = Model::load(&models().join("mlp.ts.onnx"), &rules).unwrap();
    let mut cpu = model
        .compile(Backend::Reference, &CompileOptions::default())
        .unwrap();
    let x = |shape: &[usize]| {
        let n = shape.iter().product();
        BTreeMap::from([(
            "x".to_string(),
            Tensor::from_values(DType::F32, shape, vec![0.5; n]).unwrap(),
        )])
    };
    let e = cpu.run(&x(&[3, 11])).unwrap_err();
    assert_eq!(e.site.node.as_deref(), Some("x"));
    assert!(
        e.to_string()
            .contains("axis 1 is 11, the model declares [batch, 12] there"),
        "{e}"
    );
    let e = cpu.run(&x(&[36])).unwrap_err();
    assert!(e.to_string().contains("(rank 1)"), "{e}");
    // A batch of 0 is a size like any other.
    let empty = cpu.run(&x(&[0, 12])).unwrap();
    assert_eq!(empty["y"].shape(), &[0, 5]);
    // Sizes for names the model does not have are refused, with its names.
    let e = Model::load_sized(
        &models().join("mlp.ts.onnx"),
        &rules,
        &DimSizes::from([("bach".to_string(), 2)]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("did you mean `batch`"), "{e}");
}

#[test]
fn bench_at_a_second_size_finds_its_kernels_in_the_disk_cache() {
    let cache = temp_dir("cache");
    let path = models().join("tiny_lm.dynamo.onnx");
    let bench = |batch: usize| {
        let args: Vec<String> = [
            "bench",
            path.to_str().unwrap(),
            "--backend",
            "cpu",
            "--iters",
            "3",
            "--json",
            "--dim",
            &format!("batch={batch}"),
            "--dim",
            "seq=6",
        ]
        .map(String::from)
        .to_vec();
        let (ok, text) = fusebox(&args, Some(&cache));
        assert!(ok, "{text}");
        let report: serde_json::Value = serde_json::from_str(&text).unwrap();
        (
            report["kernels_compiled"].as_u64().unwrap(),
            report["kernels_cached"].as_u64().unwrap(),
            report["bytes"].as_u64().unwrap(),
        )
    };
    let (compiled, _, bytes_2) = bench(2);
    assert!(compiled > 0, "a fresh cache compiles");
    let (compiled, cached, bytes_5) = bench(5);
    assert_eq!(compiled, 0, "batch 5 compiled kernels batch 2 had compiled");
    assert!(cached > 0);
    assert!(bytes_5 > bytes_2, "the second size moves more bytes");
}

#[test]
fn optimize_says_which_sizes_it_priced() {
    let path = models().join("tiny_lm.dynamo.onnx");
    let run = |extra: &[&str]| {
        let mut args = vec!["optimize".to_string(), path.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        fusebox(&args, None)
    };
    let (ok, text) = run(&["--dim", "batch=4"]);
    assert!(ok, "{text}");
    assert!(
        text.starts_with("priced at batch=4, seq=1 (default)\n"),
        "{text}"
    );
    let (ok, text) = run(&["--json", "--dim", "seq=3"]);
    assert!(ok, "{text}");
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        report["dims"],
        serde_json::json!({"batch": {"size": 1, "default": true}, "seq": {"size": 3, "default": false}})
    );
    for (args, message) in [
        (&["--dim", "seq"][..], "must be NAME=SIZE"),
        (&["--dim", "seq=x"], "must be a whole number"),
        (&["--dim", "batc=2"], "did you mean `batch`"),
        (
            &["--dim", "seq=9"],
            "(imported with batch=1 (default), seq=9",
        ),
    ] {
        let (ok, text) = run(args);
        assert!(!ok && text.contains(message), "{args:?}: {text}");
    }
}

#[test]
fn torchscript_bakes_traced_sizes_and_the_error_says_which_sizes_were_tried() {
    let path = models().join("tiny_lm.ts.onnx");
    let rules = RuleSet::defaults();
    // The sizes it was traced at import; others fail at the reshape that kept the traced
    // sequence length, naming it and the sizes.
    let traced = DimSizes::from([("batch".to_string(), 2), ("seq".to_string(), 5)]);
    assert!(Model::load_sized(&path, &rules, &traced).is_ok());
    let other = DimSizes::from([("batch".to_string(), 3), ("seq".to_string(), 8)]);
    let e = Model::load_sized(&path, &rules, &other).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("Reshape") && text.contains("(imported with batch=3, seq=8)"),
        "{text}"
    );
}
