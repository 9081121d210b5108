//! `fusebox optimize` from the command line: the JSON report's keys, the emitted graph and
//! drawing, and errors for bad options.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fusebox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("fusebox runs")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-optimize-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn json_report_has_every_key_the_issue_names() {
    let out = fusebox(&["optimize", "examples/lstm_cell_backward.ron", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for key in [
        "kernels_before",
        "kernels_after",
        "casts_before",
        "casts_after",
        "bytes_before",
        "bytes_after",
        "cost_before",
        "cost_after",
        "egraph",
        "rules",
    ] {
        assert!(report.get(key).is_some(), "missing {key}");
    }
    for key in ["nodes", "classes", "iterations", "stop_reason", "time_ms"] {
        assert!(report["egraph"].get(key).is_some(), "missing egraph.{key}");
    }
    // 25 ops, none opaque, one const literal excluded: one kernel per op before.
    assert_eq!(report["kernels_before"], 25);
    assert!(report["kernels_after"].as_u64().unwrap() < 25);
    assert!(report["cost_after"].as_f64().unwrap() < report["cost_before"].as_f64().unwrap());
    assert!(report["rules"]["sum-concat-4"].as_u64().unwrap() >= 1);
    assert_eq!(report["egraph"]["stop_reason"], "saturated");
}

#[test]
fn emitted_graph_loads_and_computes_the_same_outputs() {
    let path = scratch("lstm_backward_opt.ron");
    let out = fusebox(&[
        "optimize",
        "examples/lstm_cell_backward.ron",
        "--emit",
        "ron",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let catalogue = fusebox::rules::Catalogue::defaults();
    let (before, _) = fusebox::graph::file::load(
        std::path::Path::new("examples/lstm_cell_backward.ron"),
        &catalogue,
    )
    .unwrap();
    let (after, _) = fusebox::graph::file::load(&path, &catalogue).unwrap();
    assert_eq!(after.outputs, before.outputs, "outputs keep their names");
    let inputs = fusebox::eval::random_inputs(&before, 5);
    let a = fusebox::eval::evaluate(&before, &catalogue, &inputs).unwrap();
    let b = fusebox::eval::evaluate(&after, &catalogue, &inputs).unwrap();
    for name in &before.outputs {
        let (x, y) = (a[name].values(), b[name].values());
        let scale = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (u, v) in x.iter().zip(&y) {
            assert!(
                (u - v).abs() <= 1e-5 * (u.abs() + scale),
                "{name}: {u} vs {v}"
            );
        }
    }
}

#[test]
fn emitted_dot_draws_one_cluster_per_kernel() {
    let path = scratch("lstm_backward.dot");
    let out = fusebox(&[
        "optimize",
        "examples/lstm_cell_backward.ron",
        "--emit",
        "dot",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dot = std::fs::read_to_string(&path).unwrap();
    assert!(dot.starts_with("digraph \"lstm_cell_backward\" {"));
    let json = fusebox(&["optimize", "examples/lstm_cell_backward.ron", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let kernels = report["kernels"].as_array().unwrap().len();
    assert_eq!(dot.matches("subgraph \"cluster_").count(), kernels);
    assert!(
        dot.contains("\"in:grad_hy\" -> "),
        "inputs are drawn with their edges"
    );
    assert!(dot.trim_end().ends_with('}'));
}

#[test]
fn bad_options_are_clear_errors() {
    let out = fusebox(&["optimize", "examples/lstm_cell.ron", "--profile", "h100"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("h100"), "{err}");
    assert!(
        err.contains("h200"),
        "suggests the profile that exists: {err}"
    );

    let out = fusebox(&["optimize", "examples/lstm_cell.ron", "--emit", "dot"]);
    assert!(!out.status.success(), "--emit needs --out");

    let out = fusebox(&["optimize", "examples/no_such_graph.ron"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_graph.ron"));
}

/// `--emit cuda` partitions for the CUDA backend's profile unless `--profile` says otherwise:
/// CUDA source written for a CPU partition would be kernels no GPU run uses.
#[test]
fn emit_cuda_defaults_to_the_cuda_profile() {
    let out = scratch("profile.cu");
    let path = out.to_str().unwrap();
    let profile_of = |args: &[&str]| -> String {
        let mut all = vec!["optimize", "examples/lstm_cell.ron", "--json"];
        all.extend_from_slice(args);
        let output = fusebox(&all);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("one JSON object");
        report["profile"].as_str().expect("a profile").to_string()
    };
    assert_eq!(profile_of(&[]), "cpu");
    assert_eq!(profile_of(&["--emit", "c", "--out", path]), "cpu");
    assert_eq!(profile_of(&["--emit", "cuda", "--out", path]), "h200");
    assert_eq!(
        profile_of(&["--emit", "cuda", "--out", path, "--profile", "cpu"]),
        "cpu"
    );
    std::fs::remove_file(&out).ok();
}

/// One definition of a kernel count everywhere (issue 41): generated kernels and library
/// calls (matmul) counted apart, so that `optimize` (text and `--json`), `--explain`, `run`
/// and `bench` (text and `--json`) report the same figures for one graph. They once said
/// "8 -> 6", "11 … 9" and "9" for one MLP. `mlp_block` has two matmuls and pointwise ops
/// that fuse, so both counts are nonzero and fusion changes one of them.
#[test]
fn every_report_counts_kernels_and_library_calls_the_same_way() {
    let text = |args: &[&str]| -> String {
        let out = fusebox(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let graph = "examples/mlp_block.ron";
    let json: serde_json::Value =
        serde_json::from_str(&text(&["optimize", graph, "--json"])).expect("one JSON object");
    let field = |key: &str| {
        json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key}: {json}"))
    };
    let (before, after) = (field("kernels_before"), field("kernels_after"));
    let calls = field("library_calls_after");
    assert_eq!(field("library_calls_before"), calls);
    assert_eq!(calls, 2, "the two matmuls");
    assert!(after < before, "{before} -> {after}: nothing fused");

    let summary = text(&["optimize", graph]);
    let line = format!("kernels: {before} -> {after} (+{calls} library calls)   ");
    assert!(summary.contains(&line), "{line:?} in {summary}");

    let explain = text(&["optimize", graph, "--explain"]);
    for (row, kernels) in [
        ("one kernel per op:", before),
        ("optimized and fused:", after),
    ] {
        let found = explain
            .lines()
            .find(|l| l.trim_start().starts_with(row))
            .unwrap_or_else(|| panic!("no {row:?} in {explain}"));
        // After the row label, which may itself say "kernel".
        let words: Vec<&str> = found.trim_start()[row.len()..].split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| *w == "kernels" || *w == "kernel")
            .unwrap();
        assert_eq!(words[at - 1], kernels.to_string(), "{found}");
        assert!(
            found.ends_with(&format!("+ {calls} library calls")),
            "{found}"
        );
    }

    let count = format!("{after} kernels, {calls} library calls");
    let out = scratch("counts");
    let run = text(&[
        "run",
        graph,
        "--backend",
        "cpu",
        "--random-inputs",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.starts_with(&format!("mlp_block on cpu: {count}\n")),
        "{run}"
    );
    std::fs::remove_dir_all(&out).ok();

    let bench = ["bench", graph, "--backend", "cpu", "--iters", "1"];
    let bench_text = text(&bench);
    assert!(
        bench_text.starts_with(&format!("mlp_block: {count} (fused)")),
        "{bench_text}"
    );
    let bench_json: serde_json::Value =
        serde_json::from_str(&text(&[&bench[..], &["--json"]].concat())).unwrap();
    assert_eq!(bench_json["kernels"], after, "{bench_json}");
    assert_eq!(bench_json["library_calls"], calls, "{bench_json}");
}
