//! The GPU suite's scripts (`benches/gpu/*.py`) run where no GPU is: each takes `--backend cpu`,
//! so that what they parse, choose and print is checked on every CI run and does not rot
//! between the sessions that have a GPU. Skipped, with a message, where `python3 -c "import
//! numpy"` fails (`.ci/run` installs NumPy first).

use crate::common::{numpy_available, temp_dir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fusebox() -> &'static str {
    env!("CARGO_BIN_EXE_fusebox")
}

fn script(name: &str, args: &[&str]) -> Output {
    Command::new("python3")
        .arg(root().join("benches/gpu").join(name))
        .args(args)
        .current_dir(root())
        .output()
        .expect("python3 runs")
}

fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "script failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A soft-capped softmax over [6, 33] f32: small enough for the reference evaluator, and a row
/// kernel that keeps values from one pass for the next.
fn small_graph(dir: &Path) -> PathBuf {
    let path = dir.join("capped.ron");
    std::fs::write(
        &path,
        r#"Graph(name: "capped",
  inputs: [Input(name: "x", dtype: "f32", shape: [6, 33])],
  nodes: [
    Node(name: "cap", op: "const", attrs: {"value": 30.0, "dtype": "f32"}),
    Node(name: "xs", op: "div", args: ["x", "cap"]),
    Node(name: "t", op: "tanh", args: ["xs"]),
    Node(name: "tc", op: "mul", args: ["t", "cap"]),
    Node(name: "s", op: "softmax", args: ["tc"], attrs: {"axis": -1}),
  ],
  outputs: ["s"])
"#,
    )
    .unwrap();
    path
}

/// `check_gpu.py` through the CPU backend, checking the given examples only.
fn check_on_cpu(examples: &str) -> Output {
    let fixed = [
        "--fusebox",
        fusebox(),
        "--backend",
        "cpu",
        "--rows",
        "0",
        "--random",
        "0",
    ];
    script(
        "check_gpu.py",
        &[&fixed[..], &["--examples", examples]].concat(),
    )
}

#[test]
fn check_gpu_takes_graph_files_and_example_names() {
    if !numpy_available() {
        eprintln!("skipped: NumPy is not installed (bash .ci/run installs it)");
        return;
    }
    let dir = temp_dir("gpu-check");
    let graph = small_graph(&dir);
    let selection = format!("iou,{}", graph.display());
    let out = check_on_cpu(&selection);
    let text = stdout_of(&out);
    // Five variants each on the CPU (the deterministic ones are CUDA's), all agreeing with the
    // reference evaluator.
    assert!(text.contains("ok   capped (fused)"), "{text}");
    assert!(text.contains("ok   capped (amp bf16)"), "{text}");
    assert!(text.contains("ok   iou (unfused)"), "{text}");
    assert!(text.contains("10 passed, 0 failed"), "{text}");

    let out = check_on_cpu("no_such_example");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no example `no_such_example`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn alternate_runs_each_variant_in_every_round() {
    let dir = temp_dir("gpu-alternate");
    let graph = small_graph(&dir);
    // `@DIR` must reach `--rules`: a broken cost.ron there fails that variant, and only it.
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("cost.ron"), "not ron").unwrap();
    let json = dir.join("alternate.json");
    let out = script(
        "alternate.py",
        &[
            "--backend",
            "cpu",
            "--variant",
            &format!("plain={}", fusebox()),
            "--variant",
            &format!("broken={}@{}", fusebox(), rules.display()),
            // `+FLAG` reaches that variant's `bench` only: unfused, it runs more kernels.
            "--variant",
            &format!("unfused={}+--no-fusion", fusebox()),
            "--graphs",
            graph.to_str().unwrap(),
            "--rounds",
            "2",
            "--iters",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let text = stdout_of(&out);
    let plain = text
        .lines()
        .find(|l| l.starts_with("capped") && l.contains(" plain "))
        .unwrap_or_else(|| panic!("no row for the plain variant:\n{text}"));
    // One kernel, 1.5 KiB in and out, and one median per round.
    let fields: Vec<&str> = plain.split_whitespace().collect();
    assert_eq!(fields[2], "1", "{plain}");
    assert_eq!(fields[5..].len(), 2, "{plain}");
    let unfused = text
        .lines()
        .find(|l| l.starts_with("capped") && l.contains(" unfused "))
        .unwrap_or_else(|| panic!("no row for the unfused variant:\n{text}"));
    let kernels: usize = unfused.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(kernels > 1, "{unfused}");
    assert!(
        text.lines()
            .any(|l| l.contains(" broken ") && l.contains("failed")),
        "{text}"
    );
    let saved = std::fs::read_to_string(&json).unwrap();
    assert_eq!(saved.matches("\"median_ms\"").count(), 4, "{saved}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn reduction_sweep_counts_threads_and_bytes_as_the_cuda_pass_runs() {
    let dir = temp_dir("gpu-sweep");
    let json = dir.join("sweep.json");
    let out = script(
        "reduction_sweep.py",
        &[
            "--fusebox",
            fusebox(),
            "--backend",
            "cpu",
            "--rows",
            "64,4096",
            "--cols",
            "256",
            "--bodies",
            "plain,inputs4",
            "--iters",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    stdout_of(&out);
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let found: Vec<(u64, &str, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["rows"].as_u64().unwrap(),
                r["body"].as_str().unwrap(),
                r["threads"].as_u64().unwrap(),
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    // 256 columns: one thread per 64 rows of each column (64 rows: 256 threads; 4096 rows:
    // 256 x 64 = 16384). Bytes: every input read once, the 256 sums written once.
    assert_eq!(
        found,
        vec![
            (64, "plain", 256, 64 * 256 * 4 + 256 * 4),
            (64, "inputs4", 256, 4 * 64 * 256 * 4 + 256 * 4),
            (4096, "plain", 16384, 4096 * 256 * 4 + 256 * 4),
            (4096, "inputs4", 16384, 4 * 4096 * 256 * 4 + 256 * 4),
        ]
    );
    // The modeled price grows with the bytes at a fixed thread count.
    let model = |i: usize| rows[i]["model_ms"].as_f64().unwrap();
    assert!(model(3) > model(2) && model(2) > 0.0, "{rows:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `conv_gpu.py` on the CPU, one small model: it exports the module, checks fusebox's output
/// against PyTorch's in float64 and prints one row per dtype with the error and the ratios.
/// Skipped where PyTorch is not installed (CI installs no PyTorch).
#[test]
fn conv_gpu_times_and_checks_a_model_on_the_cpu() {
    let torch = Command::new("python3")
        .args(["-c", "import torch, onnx"])
        .output();
    if !torch.is_ok_and(|o| o.status.success()) {
        eprintln!("conv_gpu_times_and_checks_a_model_on_the_cpu: skipped, no PyTorch/onnx");
        return;
    }
    let dir = temp_dir("gpu-conv");
    let json = dir.join("conv.json");
    let out = script(
        "conv_gpu.py",
        &[
            "--backend",
            "cpu",
            "--no-compile",
            "--fusebox",
            fusebox(),
            "--models",
            "downsample",
            "--batch",
            "1",
            "--rounds",
            "1",
            "--iters",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let text = stdout_of(&out);
    for dtype in ["f32", "bf16"] {
        let row = text
            .lines()
            .find(|l| l.starts_with("downsample") && l.split_whitespace().nth(1) == Some(dtype))
            .unwrap_or_else(|| panic!("no {dtype} row:\n{text}"));
        let err: f64 = row.split_whitespace().nth(9).unwrap().parse().unwrap();
        let bound = if dtype == "f32" { 1e-5 } else { 2e-2 };
        assert!(err < bound, "{row}");
    }
    let saved = std::fs::read_to_string(&json).unwrap();
    assert_eq!(saved.matches("\"median_ms\"").count(), 2, "{saved}");
    std::fs::remove_dir_all(&dir).ok();
}
