//! The ONNX backend node tests (shipped in the `onnx` wheel, 1.22.0 in CI) for every op type
//! fusebox imports, on the reference evaluator and the CPU backend.
//!
//! A case belongs here when every node of its model is of an op type the importer handles
//! (rules/onnx.ron or the importer's own ops). Each case is imported for each of its data sets
//! (`test_data_set_*`), specialized to that set's inputs as `fusebox run` specializes a model
//! to its arrays, fed them, and compared with the stored outputs (floats within ONNX's own
//! backend-test tolerance, rtol 1e-3 and atol 1e-7 scaled by the dtype; everything else
//! exactly). `tests/fixtures/onnx_pass_list.txt` lists the cases that must pass on both
//! backends: one that fails is an error, nothing skips silently. The book's table of the
//! cases that do not pass, with the reason for each, is regenerated here and compared
//! (`FUSEBOX_BLESS=1` rewrites both files).
//!
//! Skipped, with a message, where `python3 -c "import onnx"` fails, unless
//! `FUSEBOX_REQUIRE_ONNX` is set (as `.ci/run` sets it once it has installed the wheel).

use fusebox::backend::Executable;
use fusebox::backend::cpu::compiler::{Compiler, CompilerConfig};
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::graph::dims::Specialization;
use fusebox::onnx::{self, proto};
use fusebox::optimize::Options;
use fusebox::rules::RuleSet;
use fusebox::tensor::Tensor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The node-test directory of the installed `onnx` wheel, if there is one.
fn node_tests() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data', 'node'))",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    dir.is_dir().then_some(dir)
}

/// Every input `input_N.pb` or output `output_N.pb` of a data set, in order.
fn tensors(set: &Path, prefix: &str) -> Result<Vec<Tensor>, String> {
    let mut out = Vec::new();
    for i in 0.. {
        let path = set.join(format!("{prefix}_{i}.pb"));
        if !path.exists() {
            break;
        }
        let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
        let t = proto::parse_tensor(&bytes).map_err(|e| e.to_string())?;
        out.push(proto::to_tensor(&t, Some(set)).map_err(|e| format!("{prefix} {i}: {e}"))?);
    }
    Ok(out)
}

/// Whether `got` matches `want` within the ONNX backend tests' tolerance (widened for f16 and
/// bf16, whose own rounding is coarser than 1e-3).
fn close(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.dtype != want.dtype {
        return Err(format!("dtype {}, expected {}", got.dtype, want.dtype));
    }
    if got.shape() != want.shape() {
        return Err(format!(
            "shape {:?}, expected {:?}",
            got.shape(),
            want.shape()
        ));
    }
    let (rtol, atol) = match want.dtype {
        DType::F16 => (4e-3, 1e-3),
        DType::BF16 => (2e-2, 1e-2),
        DType::F32 | DType::F64 => (1e-3, 1e-7),
        _ => (0.0, 0.0),
    };
    for (i, (g, w)) in got.values().iter().zip(want.values().iter()).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= atol + rtol * w.abs();
        if !ok {
            return Err(format!("element {i} is {g}, expected {w}"));
        }
    }
    Ok(())
}

/// The outcome of one case: `Ok` or the reason it does not pass, over every data set.
fn run_case(dir: &Path, rules: &RuleSet, compiler: &Compiler) -> Result<(), String> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    sets.sort();
    if sets.is_empty() {
        return Err("no data set".into());
    }
    for set in &sets {
        run_set(dir, set, rules, compiler).map_err(|e| {
            if sets.len() > 1 {
                format!("{}: {e}", set.file_name().unwrap().to_string_lossy())
            } else {
                e
            }
        })?;
    }
    Ok(())
}

/// One data set of a case: the model imported specialized to its inputs (the sizes of
/// symbolic dimensions, the values of integer inputs it needs as constants), as `fusebox run`
/// imports it, then run on the reference evaluator and the CPU backend.
fn run_set(dir: &Path, set: &Path, rules: &RuleSet, compiler: &Compiler) -> Result<(), String> {
    let path = dir.join("model.onnx");
    let inputs = tensors(set, "input")?;
    let expected = tensors(set, "output")?;
    let declared = onnx::declared(&path).map_err(|e| format!("import: {}", e.kind))?;
    if declared.inputs.len() != inputs.len() {
        return Err(format!(
            "{} inputs in the data set, {} in the model",
            inputs.len(),
            declared.inputs.len()
        ));
    }
    let given: Tensors = declared
        .inputs
        .iter()
        .map(|input| input.name.clone())
        .zip(inputs)
        .collect();
    let specialization = Specialization {
        shapes: given
            .iter()
            .map(|(name, t)| (name.clone(), t.shape().to_vec()))
            .collect(),
        values: given.clone().into_iter().collect(),
        ..Specialization::default()
    };
    let imported = onnx::import_specialized(&path, &rules.ops, &rules.onnx, &specialization)
        .map_err(|e| format!("import: {}", e.kind))?;
    let mut values: Tensors = imported.values.clone().into_iter().collect();
    for input in &imported.graph.inputs {
        if let Some(t) = given.get(&input.name) {
            values.insert(input.name.clone(), t.clone());
        }
    }
    let graph = &imported.graph;
    let reference = fusebox::eval::evaluate(graph, &rules.ops, &values)
        .map_err(|e| format!("reference: {}", e.kind))?;
    let options = Options {
        profile: "cpu".into(),
        ..Options::default()
    };
    let mut prepared = fusebox::runner::prepare(graph, rules, &options, compiler)
        .map_err(|e| format!("cpu: {}", e.kind))?;
    let cpu = prepared
        .executable
        .run_tensors(&values)
        .map_err(|e| format!("cpu: {}", e.kind))?;
    for (name, want) in graph.outputs.iter().zip(&expected) {
        close(&reference[name], want).map_err(|e| format!("reference: `{name}`: {e}"))?;
        close(&cpu[name], want).map_err(|e| format!("cpu: `{name}`: {e}"))?;
    }
    Ok(())
}

#[test]
fn onnx_node_tests_pass_on_reference_and_cpu() {
    let Some(root) = node_tests() else {
        assert!(
            std::env::var_os("FUSEBOX_REQUIRE_ONNX").is_none(),
            "FUSEBOX_REQUIRE_ONNX is set but the onnx wheel cannot be imported"
        );
        eprintln!("skipped: python3 cannot import onnx (pip install onnx==1.22.0)");
        return;
    };
    let rules = RuleSet::defaults();
    let table = &rules.onnx;
    let compiler = Compiler::new(CompilerConfig::from_env());
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    cases.sort();
    let mut results: BTreeMap<String, Result<(), String>> = BTreeMap::new();
    for case in &cases {
        let bytes = std::fs::read(case.join("model.onnx")).unwrap();
        let Ok(model) = proto::parse_model(&bytes) else {
            continue;
        };
        let Some(graph) = model.graph.as_ref() else {
            continue;
        };
        let supported = !graph.node.is_empty()
            && graph.node.iter().all(|n| {
                n.domain.is_empty()
                    && (table.knows(&n.op_type) || onnx::STRUCTURAL.contains(&n.op_type.as_str()))
            });
        if !supported {
            continue;
        }
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        results.insert(name, run_case(case, &rules, &compiler));
    }
    let passed: Vec<&String> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(n, _)| n)
        .collect();
    println!(
        "ONNX node tests of supported op types: {} of {} pass ({:.1}%)",
        passed.len(),
        results.len(),
        100.0 * passed.len() as f64 / results.len().max(1) as f64
    );
    let mut table_text = String::from("| case | why it does not pass |\n|---|---|\n");
    for (name, result) in &results {
        if let Err(reason) = result {
            let reason = reason.lines().next().unwrap_or("").replace('|', "\\|");
            table_text += &format!("| `{name}` | {reason} |\n");
        }
    }
    let pass_text: String = passed.iter().map(|n| format!("{n}\n")).collect();
    let pass_file = repo().join("tests/fixtures/onnx_pass_list.txt");
    let table_file = repo().join("book/src/generated/onnx_conformance.md");
    if std::env::var_os("FUSEBOX_BLESS").is_some() {
        std::fs::write(&pass_file, &pass_text).unwrap();
        std::fs::write(&table_file, &table_text).unwrap();
        return;
    }
    let listed = std::fs::read_to_string(&pass_file).unwrap();
    let mut failures = Vec::new();
    for name in listed.lines().filter(|l| !l.trim().is_empty()) {
        match results.get(name) {
            Some(Ok(())) => {}
            Some(Err(reason)) => failures.push(format!("{name}: {reason}")),
            None => failures.push(format!("{name}: not found among the supported cases")),
        }
    }
    assert!(
        failures.is_empty(),
        "listed cases that do not pass:\n{}",
        failures.join("\n")
    );
    assert_eq!(
        pass_text, listed,
        "cases pass that the pass list does not name: add them (FUSEBOX_BLESS=1)"
    );
    let book = std::fs::read_to_string(&table_file).unwrap_or_default();
    assert_eq!(
        book, table_text,
        "book/src/generated/onnx_conformance.md is out of date (FUSEBOX_BLESS=1)"
    );
}

/// `src/onnx/versions.rs`, the ops' definition history the importer checks a model's opset
/// against, is what the installed onnx wheel's schemas say (`tests/onnx/op_versions.py`).
#[test]
fn op_versions_match_the_onnx_wheel() {
    if node_tests().is_none() {
        assert!(
            std::env::var_os("FUSEBOX_REQUIRE_ONNX").is_none(),
            "FUSEBOX_REQUIRE_ONNX is set but the onnx wheel cannot be imported"
        );
        return;
    }
    let out = Command::new("python3")
        .arg(repo().join("tests/onnx/op_versions.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read_to_string(repo().join("src/onnx/versions.rs")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        committed,
        "src/onnx/versions.rs differs from the wheel: python3 tests/onnx/op_versions.py > src/onnx/versions.rs"
    );
}
