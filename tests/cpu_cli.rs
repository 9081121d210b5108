//! `fusebox run --backend cpu`, `fusebox bench` and `optimize --emit c` from the command line.

use fusebox::tensor::Tensor;
use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common;
use common::ok;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-cpu-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn fusebox_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    command
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("FUSEBOX_CACHE_DIR", scratch("cache"));
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("fusebox runs")
}

fn fusebox(args: &[&str]) -> Output {
    fusebox_with(args, &[])
}

/// The CPU backend, fused and unfused, writes what the reference backend writes (within f32
/// rounding of vector math).
#[test]
fn run_cpu_matches_the_reference_backend() {
    let graph = "examples/gru_residual.ron";
    let dirs: Vec<PathBuf> = ["reference", "fused", "unfused"]
        .iter()
        .map(|d| scratch(&format!("run-{d}")))
        .collect();
    let args = |backend: &str, dir: &PathBuf| -> Vec<String> {
        [
            "run",
            graph,
            "--backend",
            backend,
            "--random-inputs",
            "--seed",
            "4",
            "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([dir.display().to_string()])
        .collect()
    };
    let run = |a: Vec<String>| ok(&fusebox(&a.iter().map(String::as_str).collect::<Vec<_>>()));
    run(args("reference", &dirs[0]));
    let fused = run(args("cpu", &dirs[1]));
    assert!(fused.starts_with("gru_residual on cpu: "), "{fused}");
    let mut unfused = args("cpu", &dirs[2]);
    unfused.push("--no-fusion".into());
    run(unfused);
    for entry in std::fs::read_dir(&dirs[0]).unwrap() {
        let name = entry.unwrap().file_name();
        let want = Tensor::read_npy(&dirs[0].join(&name)).unwrap().values();
        for dir in &dirs[1..] {
            let got = Tensor::read_npy(&dir.join(&name)).unwrap().values();
            assert_eq!(want.len(), got.len());
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    (w - g).abs() <= 2e-5 * (w.abs() + scale),
                    "{name:?}: {w} vs {g}"
                );
            }
        }
    }
}

#[test]
fn bench_json_has_the_keys_the_issue_names() {
    let out = ok(&fusebox(&[
        "bench",
        "examples/lstm_cell.ron",
        "--backend",
        "cpu",
        "--iters",
        "3",
        "--json",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(report["kernels"], 1);
    assert_eq!(report["bytes"], 117_440_512u64);
    assert_eq!(report["iters"], 3);
    let median = report["median_ms"].as_f64().unwrap();
    let gbps = report["gbps"].as_f64().unwrap();
    assert!(median > 0.0);
    assert!((gbps - 117_440_512.0 / (median * 1e6)).abs() < 1e-6 * gbps);
    let unfused = ok(&fusebox(&[
        "bench",
        "examples/lstm_cell.ron",
        "--backend",
        "cpu",
        "--no-fusion",
        "--iters",
        "1",
        "--json",
    ]));
    let unfused: serde_json::Value = serde_json::from_str(&unfused).unwrap();
    assert_eq!(unfused["kernels"], 9);
    // Nine ops, each reading its operands and writing its result: 22 tensors of 16 MiB.
    assert_eq!(unfused["bytes"], 22u64 << 24);
}

#[test]
fn emit_c_writes_a_translation_unit_with_the_kernel() {
    let path = scratch("lstm.c");
    ok(&fusebox(&[
        "optimize",
        "examples/lstm_cell.ron",
        "--emit",
        "c",
        "--out",
        path.to_str().unwrap(),
    ]));
    let c = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        c.matches("const int64_t *sizes, const int64_t *strides")
            .count(),
        1
    );
    // Inline f32 exp (the sigmoids' addend variant) and tanh; two loops (tanh(cy) needs cy).
    assert!(c.contains("fb_expf_addend(") && c.contains("fb_tanhf("));
    assert_eq!(c.matches("#pragma omp simd").count(), 2);
}

#[test]
fn clear_errors_for_bad_backend_use() {
    let out = fusebox(&["bench", "examples/lstm_cell.ron", "--backend", "reference"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend cpu"));
    let out = fusebox(&[
        "run",
        "examples/iou.ron",
        "--backend",
        "reference",
        "--no-fusion",
        "--random-inputs",
        "--out",
        scratch("x").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-fusion"));
    // A missing C compiler is an error naming it, not a crash.
    let out = fusebox_with(
        &[
            "run",
            "examples/iou.ron",
            "--backend",
            "cpu",
            "--random-inputs",
            "--out",
            scratch("y").to_str().unwrap(),
        ],
        &[
            ("FUSEBOX_CC", "/nonexistent/cc"),
            (
                "FUSEBOX_CACHE_DIR",
                scratch("empty-cache").to_str().unwrap(),
            ),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/cc"), "{stderr}");
}
