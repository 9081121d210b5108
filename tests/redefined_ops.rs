//! A rule directory may redefine a default op; the default rewrite rules that name it were
//! proven for the old meaning. Loading re-verifies them under the new one and leaves out the
//! ones that do not hold, so optimizing never changes what a graph computes.

use fusebox::eval::{self, Tensors};
use fusebox::graph;
use fusebox::optimize::{Options, optimize};
use fusebox::rules::RuleSet;
use std::fs;
use std::path::PathBuf;

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-redefined-{}-{tag}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A rule pack's `ops.ron` that redefines `add` as `a - b`.
const REDEFINED_ADD: &str = r#"[
    Op(name: "add", kind: Pointwise, operands: ["a", "b"], dtype: Promote(["a", "b"]),
       formula: "a - b", derivatives: {"a": "g", "b": "-g"}),
]"#;

const GRAPH: &str = r#"Graph(
    name: "difference",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [4, 8]),
        Input(name: "y", dtype: "f32", shape: [4, 8]),
    ],
    nodes: [
        Node(name: "d", op: "sub", args: ["x", "y"]),
        Node(name: "e", op: "add", args: ["d", "y"]),
    ],
    outputs: ["d", "e"],
)"#;

fn agree(rules: &RuleSet) {
    let (graph, _) = graph::file::parse(GRAPH, "difference.ron", &rules.ops).unwrap();
    let optimized = optimize(&graph, rules, &Options::default()).unwrap();
    let inputs: Tensors = (0..graph.inputs.len())
        .map(|i| {
            (
                graph.inputs[i].name.clone(),
                eval::random_input(&graph, i, 3),
            )
        })
        .collect();
    let want = eval::evaluate(&graph, &rules.ops, &inputs).unwrap();
    let got = eval::evaluate(&optimized.graph, &rules.ops, &inputs).unwrap();
    for (name, tensor) in &want {
        assert_eq!(
            tensor.values(),
            got[name].values(),
            "output `{name}` changed by optimizing"
        );
    }
}

#[test]
fn default_rules_naming_a_redefined_op_are_reverified_and_unsound_ones_left_out() {
    let dir = scratch("add");
    fs::write(dir.join("ops.ron"), REDEFINED_ADD).unwrap();
    let rules = RuleSet::load_dir(&dir).unwrap();
    let defaults = RuleSet::defaults();
    assert!(rules.rewrites.len() < defaults.rewrites.len());
    assert!(
        !rules.rewrites.iter().any(|r| r.name == "sub-add-neg"),
        "sub => add(a, neg b) kept under add = a - b"
    );
    let warning = rules
        .warnings
        .iter()
        .find(|w| w.contains("`sub-add-neg`"))
        .expect("a warning names the rule left out");
    assert!(warning.contains("redefines (add)"), "{warning}");
    // Rules that do not name `add` are all kept.
    let untouched = defaults
        .rewrites
        .iter()
        .filter(|r| !r.ops().any(|op| op == "add"))
        .count();
    assert!(rules.rewrites.len() >= untouched);
    agree(&rules);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unchanged_redeclaration_keeps_every_rule() {
    let dir = scratch("same");
    fs::write(
        dir.join("ops.ron"),
        r#"[
    Op(name: "add", kind: Pointwise, operands: ["a", "b"], dtype: Promote(["a", "b"]),
       formula: "a + b", derivatives: {"a": "g", "b": "g"}),
]"#,
    )
    .unwrap();
    let rules = RuleSet::load_dir(&dir).unwrap();
    assert_eq!(rules.rewrites.len(), RuleSet::defaults().rewrites.len());
    assert!(rules.warnings.is_empty(), "{:?}", rules.warnings);
    agree(&rules);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cli_says_which_default_rules_it_left_out() {
    let dir = scratch("cli");
    fs::write(dir.join("ops.ron"), REDEFINED_ADD).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(["ops", "--rules"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning: default rewrite rule `sub-add-neg`"),
        "{stderr}"
    );
    fs::remove_dir_all(&dir).unwrap();
}
