//! Untrusted graph and rule files against the `fusebox` command: output names cannot put files
//! outside `--out`, outputs are written all or none, stdout errors are reported, names cannot
//! drive the terminal, and huge names do not panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common;
use common::ok;

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "fusebox-cli-hardening-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fusebox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("fusebox runs")
}

/// Exit status 1 and an `error:` on stderr, no panic.
#[track_caller]
fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// A graph of input `x` [4] whose nodes, all outputs, are named `names` (each `neg x`).
fn graph_with_outputs(dir: &Path, names: &[&str]) -> String {
    let nodes: String = names
        .iter()
        .map(|n| format!("Node(name: {n:?}, op: \"neg\", args: [\"x\"]),\n"))
        .collect();
    let outputs: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    let text = format!(
        "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [4])],\n\
         nodes: [{nodes}], outputs: [{}])\n",
        outputs.join(", ")
    );
    let path = dir.join("g.ron");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Every path under `dir`, recursively.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(tree(&path));
        }
        found.push(path);
    }
    found.sort();
    found
}

#[test]
fn output_names_cannot_escape_the_out_directory() {
    let root = scratch("escape");
    let work = root.join("a/b");
    std::fs::create_dir_all(&work).unwrap();
    let abs = root.join("abs");
    let abs_name = format!("{}/x", abs.display());
    let graph = graph_with_outputs(&work, &["../../escaped", &abs_name, "..", "onnx::Tanh_21"]);
    let out_dir = work.join("out");
    let stdout = ok(&fusebox(&[
        "run",
        &graph,
        "--backend",
        "reference",
        "--random-inputs",
        "--out",
        &out_dir.display().to_string(),
    ]));
    assert!(!root.join("escaped.npy").exists());
    assert!(!root.join("a/escaped.npy").exists());
    assert!(!abs.exists());
    assert!(!work.join("..npy").exists());
    let written: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(written.len(), 4, "{written:?}");
    for file in ["..%2F..%2Fescaped.npy", "%2E%2E.npy", "onnx::Tanh_21.npy"] {
        assert!(written.iter().any(|w| w == file), "{file} in {written:?}");
        assert!(stdout.contains(file), "{stdout}");
    }
    let encoded_abs = format!("{}.npy", abs_name.replace('/', "%2F"));
    assert!(written.contains(&encoded_abs), "{written:?}");
}

#[test]
fn an_output_listed_twice_is_written_once() {
    // Distinct names map to distinct files (a clash, only possible on a hash collision, is an
    // error: see the unit tests of `cli::output`); one name listed twice is one file.
    let dir = scratch("twice");
    let graph = graph_with_outputs(&dir, &["y"]);
    let text = graph_text(&graph).replace("outputs: [\"y\"]", "outputs: [\"y\", \"y\"]");
    let path = dir.join("g2.ron");
    std::fs::write(&path, text).unwrap();
    let out_dir = dir.join("out");
    let out = fusebox(&[
        "run",
        &path.display().to_string(),
        "--backend",
        "reference",
        "--random-inputs",
        "--out",
        &out_dir.display().to_string(),
    ]);
    if out.status.success() {
        assert!(out_dir.join("y.npy").is_file());
    } else {
        // A graph may refuse an output listed twice; it must say so cleanly.
        failure(&out);
    }
}

fn graph_text(path_or_text: &str) -> String {
    std::fs::read_to_string(path_or_text).unwrap_or_else(|_| path_or_text.to_string())
}

#[test]
fn outputs_are_written_all_or_none() {
    let dir = scratch("atomic");
    let graph = graph_with_outputs(&dir, &["a", "b"]);
    let out_dir = dir.join("out");
    std::fs::create_dir_all(out_dir.join("b.npy")).unwrap();
    std::fs::write(out_dir.join("a.npy"), "old contents").unwrap();
    let stderr = failure(&fusebox(&[
        "run",
        &graph,
        "--backend",
        "reference",
        "--random-inputs",
        "--out",
        &out_dir.display().to_string(),
    ]));
    assert!(stderr.contains("b.npy"), "{stderr}");
    assert!(stderr.contains("no output was written"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out_dir.join("a.npy")).unwrap(),
        "old contents"
    );
    assert_eq!(
        tree(&out_dir),
        [out_dir.join("a.npy"), out_dir.join("b.npy")],
        "no staging directory is left"
    );
    // With the obstacle gone the same run writes both.
    std::fs::remove_dir(out_dir.join("b.npy")).unwrap();
    ok(&fusebox(&[
        "run",
        &graph,
        "--backend",
        "reference",
        "--random-inputs",
        "--out",
        &out_dir.display().to_string(),
    ]));
    assert!(
        std::fs::read(out_dir.join("a.npy"))
            .unwrap()
            .starts_with(b"\x93NUMPY")
    );
    assert_eq!(tree(&out_dir).len(), 2);
}

#[test]
fn optimize_emit_replaces_its_file_whole_or_not_at_all() {
    let dir = scratch("emit");
    let target = dir.join("graph.ron");
    // A directory where the file should go: the rename fails, nothing is left beside it.
    std::fs::create_dir(&target).unwrap();
    let stderr = failure(&fusebox(&[
        "optimize",
        "examples/gelu_bias.ron",
        "--emit",
        "ron",
        "--out",
        &target.display().to_string(),
    ]));
    assert!(
        stderr.contains("cannot write") && stderr.contains("graph.ron"),
        "{stderr}"
    );
    assert_eq!(tree(&dir), vec![target.clone()]);
    std::fs::remove_dir(&target).unwrap();
    std::fs::write(&target, "old").unwrap();
    ok(&fusebox(&[
        "optimize",
        "examples/gelu_bias.ron",
        "--emit",
        "ron",
        "--out",
        &target.display().to_string(),
    ]));
    assert!(std::fs::read_to_string(&target).unwrap().contains("Graph("));
    assert_eq!(tree(&dir), [target]);
}

#[test]
fn stdout_write_errors_fail_the_command() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // no /dev/full on this system
    };
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(["check", "examples/lstm_cell.ron"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(full)
        .output()
        .unwrap();
    let stderr = failure(&out);
    assert!(stderr.contains("standard output"), "{stderr}");
}

#[test]
fn a_closed_stdout_pipe_ends_without_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(["ops"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{:?}",
        out.status
    );
}

#[test]
fn control_characters_in_names_never_reach_the_terminal() {
    let dir = scratch("escape-codes");
    let graph = graph_with_outputs(&dir, &["\u{1b}[2J", "y\u{9b}"]);
    let out = fusebox(&["check", &graph]);
    let stdout = ok(&out);
    assert!(!out.stdout.contains(&0x1b), "{stdout}");
    assert!(!stdout.contains('\u{9b}'), "{stdout}");
    assert!(stdout.contains("\\u001b[2J"), "{stdout}");
    // An error naming the node: an unknown arg.
    let bad = graph_text(&graph).replace("args: [\"x\"]", "args: [\"\u{1b}]0;owned\u{7}\"]");
    let bad_path = dir.join("bad.ron");
    std::fs::write(&bad_path, bad).unwrap();
    let out = fusebox(&["check", &bad_path.display().to_string()]);
    failure(&out);
    assert!(!out.stderr.contains(&0x1b));
    assert!(!out.stderr.contains(&0x07));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\\u001b]0;owned\\u0007"));
}

#[test]
fn very_long_names_do_not_panic_check() {
    let dir = scratch("long-check");
    let name = "n".repeat(70_000);
    let graph = graph_with_outputs(&dir, &[&name]);
    let stdout = ok(&fusebox(&["check", &graph]));
    assert!(stdout.contains(&name));
    let out_dir = dir.join("out");
    ok(&fusebox(&[
        "run",
        &graph,
        "--backend",
        "reference",
        "--random-inputs",
        "--out",
        &out_dir.display().to_string(),
    ]));
    let written: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
    assert_eq!(written.len(), 1);
}

#[test]
fn very_long_op_names_do_not_panic_ops() {
    let dir = scratch("long-ops");
    let name = "o".repeat(70_000);
    std::fs::write(
        dir.join("ops.ron"),
        format!(
            "[Op(name: {name:?}, kind: Pointwise, operands: [\"x\"], dtype: Promote([\"x\"]), \
             formula: \"x * 2\", derivatives: {{\"x\": \"2 * g\"}})]"
        ),
    )
    .unwrap();
    let stdout = ok(&fusebox(&["ops", "--rules", &dir.display().to_string()]));
    assert!(stdout.contains(&name));
}

#[test]
fn an_input_given_twice_is_an_error_naming_it() {
    let stderr = failure(&fusebox(&[
        "run",
        "examples/gelu_bias.ron",
        "--backend",
        "reference",
        "--input",
        "x=a.npy",
        "--input",
        "x=b.npy",
        "--out",
        "/nonexistent-out",
    ]));
    assert!(
        stderr.contains("`x`") && stderr.contains("more than once"),
        "{stderr}"
    );
}

#[test]
fn bench_rejects_zero_iterations() {
    let stderr = failure(&fusebox(&[
        "bench",
        "examples/gelu_bias.ron",
        "--backend",
        "cpu",
        "--iters",
        "0",
    ]));
    assert!(stderr.contains("--iters"), "{stderr}");
}

#[test]
fn a_missing_rule_directory_is_reported_as_missing() {
    let stderr = failure(&fusebox(&["ops", "--rules", "/nonexistent-fusebox-rules"]));
    assert!(stderr.contains("no such directory"), "{stderr}");
    assert!(!stderr.contains("not a directory"), "{stderr}");
}

/// The commands `fusebox --help` lists (all but `help` itself), read from its `Commands:`
/// section so a new command is covered without editing this test.
fn subcommands() -> Vec<String> {
    let out = fusebox(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut commands = Vec::new();
    let mut in_commands = false;
    for line in text.lines() {
        if line == "Commands:" {
            in_commands = true;
        } else if in_commands && line.starts_with("  ") {
            let name = line.split_whitespace().next().unwrap().to_string();
            if name != "help" {
                commands.push(name);
            }
        } else if in_commands {
            break;
        }
    }
    commands
}

/// The argument and option lines of a short help (`-h`: one line each) that say nothing but
/// their name, a default or the possible values.
fn undescribed(help: &str) -> Vec<String> {
    let mut blank = Vec::new();
    let mut in_args = false;
    for line in help.lines() {
        if line == "Arguments:" || line == "Options:" {
            in_args = true;
            continue;
        }
        if !line.starts_with("  ") {
            in_args = false;
            continue;
        }
        if !in_args {
            continue;
        }
        let entry = line.trim_start();
        let (spec, description) = entry.split_once("  ").unwrap_or((entry, ""));
        // What clap adds by itself: `[default: 0]`, `[possible values: …]`.
        let mut said = description.trim().to_string();
        while let Some(start) = said.rfind(" [").or(said.starts_with('[').then_some(0)) {
            if !said.ends_with(']') {
                break;
            }
            said.truncate(start);
            said = said.trim().to_string();
        }
        if said.is_empty() {
            blank.push(spec.to_string());
        }
    }
    blank
}

/// Every argument and option of every command says what it is for in `--help`.
#[test]
fn every_argument_of_every_command_has_a_description() {
    let commands = subcommands();
    assert!(
        commands.len() >= 9 && commands.iter().any(|c| c == "check-rules"),
        "{commands:?}"
    );
    let mut missing = Vec::new();
    for command in &commands {
        let out = fusebox(&[command, "-h"]);
        assert!(out.status.success(), "{command} -h");
        let help = String::from_utf8(out.stdout).unwrap();
        for spec in undescribed(&help) {
            missing.push(format!("fusebox {command}: {spec}"));
        }
    }
    assert!(
        missing.is_empty(),
        "arguments without a description:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_help_line_without_a_description_is_found() {
    let help = "Usage: x\n\nArguments:\n  <GRAPH>  \n\nOptions:\n      --seed <SEED>  [default: 0]\n      \
                --backend <B>  [possible values: a, b]\n      --json         Print JSON\n  -h, --help     Print help\n";
    assert_eq!(
        undescribed(help),
        ["<GRAPH>", "--seed <SEED>", "--backend <B>"]
    );
}

/// A graph `y = w * x` over [4] whose input `w` stores its value in `w.npy`, which is not a
/// valid .npy file: a command that reads it fails.
fn graph_with_broken_stored_value(dir: &Path) -> String {
    std::fs::write(dir.join("w.npy"), b"not a npy file").unwrap();
    let path = dir.join("g.ron");
    std::fs::write(
        &path,
        "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [4]),\n\
         Input(name: \"w\", dtype: \"f32\", shape: [4], value: \"w.npy\")],\n\
         nodes: [Node(name: \"y\", op: \"mul\", args: [\"w\", \"x\"])], outputs: [\"y\"])\n",
    )
    .unwrap();
    path.display().to_string()
}

/// `bench --input NAME=FILE` reads the file it names (checked like `run`'s: declared input,
/// shape, given once) and never a value the graph stores, even for the input `--input` names.
#[test]
fn bench_takes_input_files_and_never_reads_stored_values() {
    let dir = scratch("bench-input");
    let graph = graph_with_broken_stored_value(&dir);
    let tensor = |values: Vec<f64>| {
        let shape = [values.len()];
        fusebox::tensor::Tensor::from_values(fusebox::dtype::DType::F32, &shape, values).unwrap()
    };
    let w = dir.join("w_given.npy");
    tensor(vec![1.0, 2.0, 3.0, 4.0]).write_npy(&w).unwrap();
    let short = dir.join("short.npy");
    tensor(vec![1.0, 2.0]).write_npy(&short).unwrap();
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", &graph, "--backend", "cpu", "--iters", "1"];
        args.extend_from_slice(extra);
        fusebox(&args)
    };
    let w_spec = format!("w={}", w.display());
    let stdout = ok(&bench(&["--input", &w_spec]));
    assert!(stdout.contains("median"), "{stdout}");
    ok(&bench(&[])); // the broken w.npy is not read: w gets random values
    let stderr = failure(&bench(&["--input", &format!("w={}", short.display())]));
    assert!(
        stderr.contains("short.npy") && stderr.contains("[4]"),
        "{stderr}"
    );
    let stderr = failure(&bench(&["--input", &format!("v={}", w.display())]));
    assert!(stderr.contains("no input of that name"), "{stderr}");
    let stderr = failure(&bench(&["--input", &w_spec, "--input", &w_spec]));
    assert!(stderr.contains("more than once"), "{stderr}");
}

/// The values `bench` times: the given ones as given, the others the seeded random values
/// the reference evaluator draws.
#[test]
fn bench_inputs_are_the_given_values_and_seeded_random_values() {
    use fusebox::backend::Executable;
    use fusebox::backend::cpu::compiler::{Compiler, CompilerConfig};
    let dir = scratch("bench-values");
    let graph = graph_with_broken_stored_value(&dir);
    let rules = fusebox::rules::RuleSet::defaults();
    let (graph, _) = fusebox::graph::file::load(Path::new(&graph), &rules.ops).unwrap();
    let compiler = Compiler::new(CompilerConfig::from_env());
    let options = fusebox::optimize::Options::default();
    let prepared = fusebox::runner::prepare(&graph, &rules, &options, &compiler).unwrap();
    let w = fusebox::tensor::Tensor::from_values(
        fusebox::dtype::DType::F32,
        &[4],
        vec![1.0, 2.0, 3.0, 4.0],
    )
    .unwrap();
    let given: fusebox::eval::Tensors = [("w".to_string(), w.clone())].into_iter().collect();
    let buffers = prepared.inputs(&graph, &given, 5).unwrap();
    // In the order the program takes its inputs.
    let order: Vec<String> = prepared
        .executable
        .program()
        .dag
        .inputs
        .iter()
        .map(|i| i.name.clone())
        .collect();
    let at = |name: &str| order.iter().position(|n| n == name).unwrap();
    assert_eq!(buffers[at("w")].to_tensor(), w);
    let x = fusebox::eval::try_random_input(&graph, 0, 5).unwrap();
    assert_eq!(buffers[at("x")].to_tensor(), x);
}
