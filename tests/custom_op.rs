//! A pointwise op absent from the defaults is added by a RON rule file alone, and works through
//! the library and the CLI; broken rule files and unknown ops give located, helpful errors.

use fusebox::ErrorKind;
use fusebox::attr::AttrValue;
use fusebox::dtype::DType::{self, F32, F64};
use fusebox::eval::{Tensors, evaluate};
use fusebox::formula::{self, Bindings, Expr};
use fusebox::graph::{GraphBuilder, file};
use fusebox::rules::{Catalogue, RuleSet};
use fusebox::span::Position;
use fusebox::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/extra_ops.ron");

/// Inputs used throughout: exact in f32, both signs, zero, and the tails.
const XS: [f64; 12] = [
    -6.0, -3.0, -1.5, -1.0, -0.25, -0.0, 0.0, 0.125, 0.5, 1.0, 2.5, 8.0,
];

/// A fresh, empty directory for one test.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-custom-op-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A rule directory holding the fixture as its `ops.ron`.
fn rule_dir(tag: &str) -> PathBuf {
    let dir = temp_dir(tag);
    std::fs::copy(FIXTURE, dir.join("ops.ron")).unwrap();
    dir
}

fn fusebox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .output()
        .expect("the fusebox binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The 1-based line and column (in chars) of char index `char_index` of `text`.
fn position_of(text: &str, char_index: usize) -> Position {
    let before: Vec<char> = text.chars().take(char_index).collect();
    let line = before.iter().filter(|&&c| c == '\n').count() + 1;
    let column = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
    Position { line, column }
}

/// The char index where `needle` starts in `text` (which must hold it once).
fn char_index(text: &str, needle: &str) -> usize {
    assert_eq!(
        text.matches(needle).count(),
        1,
        "`{needle}` must occur once"
    );
    text[..text.find(needle).unwrap()].chars().count()
}

// Independent definitions, in f64.
fn leaky_relu(x: f64, alpha: f64) -> f64 {
    if x > 0.0 { x } else { alpha * x }
}

fn mish(x: f64) -> f64 {
    x * x.exp().ln_1p().tanh()
}

#[test]
fn fixture_ops_load_from_a_rule_directory() {
    let defaults = Catalogue::defaults();
    assert!(defaults.get("leaky_relu").is_none() && defaults.get("mish").is_none());
    let dir = rule_dir("load");
    let rules = RuleSet::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rules.ops.len(), defaults.len() + 2);
    let leaky = rules.ops.get("leaky_relu").expect("leaky_relu is loaded");
    let alpha = leaky.attr("alpha").expect("alpha is declared");
    assert_eq!(alpha.default, Some(AttrValue::Float(0.01)));
    assert!(leaky.derivatives.contains_key("x"));
    let mish_op = rules.ops.get("mish").expect("mish is loaded");
    assert!(mish_op.formula().is_some() && mish_op.derivatives.contains_key("x"));
    // The defaults are all still there.
    for name in defaults.names() {
        assert!(rules.ops.get(name).is_some(), "{name} lost");
    }
    // RuleSet::load with a directory is the same as load_dir.
    let again = RuleSet::load(Some(&dir)).unwrap();
    assert_eq!(again.ops.len(), rules.ops.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn custom_ops_evaluate_in_the_library() {
    let dir = rule_dir("eval");
    let rules = RuleSet::load_dir(&dir).unwrap();
    for dtype in [F32, F64] {
        let mut b = GraphBuilder::new("custom");
        let x = b.input("x", dtype, &[XS.len()]);
        let l = b.op("l", "leaky_relu", &[&x]);
        let l2 = b.op_with(
            "l2",
            "leaky_relu",
            &[&x],
            &[("alpha", AttrValue::Float(0.25))],
        );
        let m = b.op("m", "mish", &[&x]);
        let graph = b.finish(&[&l, &l2, &m]);
        let input = Tensor::from_values(dtype, &[XS.len()], XS.to_vec()).unwrap();
        let inputs = Tensors::from([("x".to_string(), input)]);
        let out = evaluate(&graph, &rules.ops, &inputs).unwrap_or_else(|e| panic!("{e}"));
        check_leaky(&out["l"], dtype, 0.01);
        check_leaky(&out["l2"], dtype, 0.25);
        check_mish(&out["m"], dtype);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// leaky_relu at compute precision: alpha * x is one multiplication, correctly rounded in f32
/// (from the f32 alpha) or in f64.
fn check_leaky(t: &Tensor, dtype: DType, alpha: f64) {
    assert_eq!(t.dtype, dtype);
    assert_eq!(t.len(), XS.len());
    for (got, &x) in t.values().iter().zip(&XS) {
        let expected = match dtype {
            F32 => leaky_relu(x, alpha as f32 as f64) as f32 as f64,
            _ => leaky_relu(x, alpha),
        };
        assert_eq!(
            got.to_bits(),
            expected.to_bits(),
            "leaky_relu({x}, {alpha}) in {dtype}: {got} vs {expected}"
        );
    }
}

fn check_mish(t: &Tensor, dtype: DType) {
    assert_eq!(t.dtype, dtype);
    let rtol = if dtype == F32 { 2e-6 } else { 1e-13 };
    for (got, &x) in t.values().iter().zip(&XS) {
        let truth = mish(x);
        assert!(
            (got - truth).abs() <= rtol * truth.abs(),
            "mish({x}) in {dtype}: {got} vs {truth}"
        );
    }
}

#[test]
fn custom_op_derivatives_match_finite_differences() {
    let dir = rule_dir("grad");
    let rules = RuleSet::load_dir(&dir).unwrap();
    let eval = |e: &Expr, vars: &[(&str, f64)]| {
        let values: Vec<[f64; 1]> = vars.iter().map(|(_, v)| [*v]).collect();
        let mut b = Bindings::new(1);
        for ((name, _), v) in vars.iter().zip(&values) {
            b = b.bind(name, v);
        }
        formula::evaluate::<f64>(e, &b, 1).unwrap()[0]
    };
    for name in ["leaky_relu", "mish"] {
        let op = rules.ops.get(name).unwrap();
        let f = op.formula().unwrap();
        let d = &op.derivatives["x"];
        for alpha in [0.01, 0.3] {
            for i in 0..=600 {
                let x = -6.0 + i as f64 * 0.02 + 0.001;
                if name == "leaky_relu" && x.abs() < 1e-3 {
                    continue;
                }
                let at = |x: f64| eval(f, &[("x", x), ("alpha", alpha)]);
                let h = 1e-6 * x.abs().max(1.0);
                let g = if i % 2 == 0 { 0.7 } else { -1.3 };
                let fd = g * (at(x + h) - at(x - h)) / (2.0 * h);
                let vars = [("x", x), ("alpha", alpha), ("y", at(x)), ("g", g)];
                let analytic = eval(d, &vars);
                assert!(
                    (fd - analytic).abs() <= 1e-5 * analytic.abs().max(1.0),
                    "d{name}/dx at {x}: {analytic} vs finite difference {fd}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

const GRAPH: &str = r#"Graph(
    name: "custom",
    inputs: [Input(name: "x", dtype: "f32", shape: [3, 4])],
    nodes: [
        Node(name: "l", op: "leaky_relu", args: ["x"]),
        Node(name: "l2", op: "leaky_relu", args: ["x"], attrs: {"alpha": 0.25}),
        Node(name: "m", op: "mish", args: ["x"]),
        Node(name: "s", op: "sum", args: ["m"], attrs: {"axes": [1]}),
    ],
    outputs: ["l", "l2", "m", "s"],
)
"#;

#[test]
fn cli_check_and_run_with_custom_rules() {
    let dir = temp_dir("cli");
    let rules = rule_dir("cli-rules");
    let graph = dir.join("graph.ron");
    std::fs::write(&graph, GRAPH).unwrap();
    let x = Tensor::from_values(F32, &[3, 4], XS.to_vec()).unwrap();
    let x_path = dir.join("x.npy");
    x.write_npy(&x_path).unwrap();
    let (graph_arg, rules_arg) = (graph.to_str().unwrap(), rules.to_str().unwrap());

    // check: types of every value.
    let out = fusebox(&["check", graph_arg, "--rules", rules_arg]);
    assert!(out.status.success(), "check failed: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for row in [
        ["l", "leaky_relu", "f32", "[3, 4]"],
        ["m", "mish", "f32", "[3, 4]"],
        ["s", "sum", "f32", "[3]"],
    ] {
        assert!(
            stdout.lines().any(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                words.len() >= 4 && words[..3] == row[..3] && line.trim_end().ends_with(row[3])
            }),
            "no row {row:?} in:\n{stdout}"
        );
    }
    // Without the rule directory `mish` is unknown (`leaky_relu` is a default composite op
    // now, so the first unknown op is the next one).
    let out = fusebox(&["check", graph_arg]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("unknown op `mish`"), "{stderr}");

    // run: outputs as .npy files.
    let out_dir = dir.join("out");
    let out = fusebox(&[
        "run",
        graph_arg,
        "--rules",
        rules_arg,
        "--backend",
        "reference",
        "--input",
        &format!("x={}", x_path.display()),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "run failed: {}", text(&out.stderr));
    let read = |name: &str| Tensor::read_npy(&out_dir.join(format!("{name}.npy"))).unwrap();
    check_leaky(&read("l"), F32, 0.01);
    let l2 = read("l2");
    check_leaky(&l2, F32, 0.25);
    assert_eq!(l2.shape(), &[3, 4]);
    check_mish(&read("m"), F32);
    let s = read("s");
    assert_eq!((s.dtype, s.shape()), (F32, &[3][..]));
    for (row, got) in s.values().iter().enumerate() {
        let truth: f64 = XS[4 * row..4 * row + 4].iter().map(|&x| mish(x)).sum();
        assert!(
            (got - truth).abs() <= 1e-5 * truth.abs().max(1.0),
            "row {row}: {got} vs {truth}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&rules).unwrap();
}

/// An ops.ron whose second op has a broken formula on a known line.
const BAD_OPS: &str = r#"[
    Op(name: "double", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       formula: "2 * x", derivatives: {"x": "2 * g"}),
    Op(name: "bad", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       formula: "x +* 2"),
]
"#;

#[test]
fn bad_formula_is_rejected_with_file_line_and_column() {
    // The formula parser puts the error at the `*` (char 3), where an operand was expected.
    let e = formula::parse("x +* 2").unwrap_err();
    assert_eq!(e.offset, 3, "{e:?}");
    // So the error points at that char inside the string literal: the char after the opening
    // quote, plus 3.
    let expected = position_of(BAD_OPS, char_index(BAD_OPS, "\"x +* 2\"") + 1 + 3);
    assert_eq!(
        expected,
        Position {
            line: 5,
            column: 21
        }
    );

    let dir = temp_dir("bad-formula");
    std::fs::write(dir.join("ops.ron"), BAD_OPS).unwrap();
    let err = RuleSet::load_dir(&dir).expect_err("the bad formula was accepted");
    assert!(matches!(err.kind, ErrorKind::Formula { .. }), "{err:?}");
    let file = err.site.file.clone().unwrap_or_default();
    assert!(file.ends_with("ops.ron"), "{err}");
    assert_eq!(err.site.position, Some(expected), "{err}");
    assert_eq!(err.site.op.as_deref(), Some("bad"), "{err}");
    let shown = err.to_string();
    assert!(
        shown.contains(&format!("ops.ron:{}:{}:", expected.line, expected.column)),
        "{shown}"
    );
    assert!(shown.contains("x +* 2"), "{shown}");

    // Nothing of a bad file is loaded, not even its good ops.
    let mut catalogue = Catalogue::defaults();
    assert!(catalogue.load_str(BAD_OPS, "ops.ron").is_err());
    assert!(catalogue.get("double").is_none());

    // The CLI reports the same place.
    let graph_dir = temp_dir("bad-formula-graph");
    let graph = graph_dir.join("graph.ron");
    std::fs::write(&graph, GRAPH).unwrap();
    let out = fusebox(&[
        "check",
        graph.to_str().unwrap(),
        "--rules",
        dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("ops.ron:{}:{}:", expected.line, expected.column)),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&graph_dir).unwrap();
}

#[test]
fn unknown_name_in_a_formula_points_at_the_name() {
    let text = r#"[
    Op(name: "scaled", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       attrs: [Attr(name: "scale", ty: Float, default: Float(2.0))],
       formula: "x * scael"),
]
"#;
    let mut catalogue = Catalogue::defaults();
    let err = catalogue
        .load_str(text, "ops.ron")
        .expect_err("unknown name accepted");
    let expected = position_of(text, char_index(text, "scael\""));
    assert_eq!(err.site.position, Some(expected), "{err}");
    let shown = err.to_string();
    assert!(shown.contains("did you mean `scale`"), "{shown}");
}

const TYPO_GRAPH: &str = r#"Graph(
    name: "typo",
    inputs: [Input(name: "x", dtype: "f32", shape: [2])],
    nodes: [
        Node(name: "s", op: "sigmod", args: ["x"]),
    ],
    outputs: ["s"],
)
"#;

#[test]
fn unknown_op_suggests_the_closest_name() {
    let err = file::parse(TYPO_GRAPH, "typo.ron", &Catalogue::defaults()).unwrap_err();
    assert_eq!(
        err.kind,
        ErrorKind::UnknownOp {
            op: "sigmod".into(),
            suggestion: Some("sigmoid".into())
        }
    );
    assert_eq!(err.site.file.as_deref(), Some("typo.ron"));
    assert_eq!(err.site.node.as_deref(), Some("s"));
    // The position is the op's value.
    let expected = position_of(TYPO_GRAPH, char_index(TYPO_GRAPH, "\"sigmod\""));
    assert_eq!(err.site.position, Some(expected), "{err}");
    assert!(err.to_string().contains("did you mean `sigmoid`"), "{err}");

    // Ops from a rule directory take part in suggestions too.
    let dir = rule_dir("typo");
    let rules = RuleSet::load_dir(&dir).unwrap();
    let typo = TYPO_GRAPH.replace("sigmod", "leaky_rel");
    let err = file::parse(&typo, "typo.ron", &rules.ops).unwrap_err();
    assert!(
        matches!(&err.kind, ErrorKind::UnknownOp { suggestion: Some(s), .. } if s == "leaky_relu"),
        "{err}"
    );

    // And through the CLI.
    let graph = dir.join("typo.ron");
    std::fs::write(&graph, TYPO_GRAPH).unwrap();
    let out = fusebox(&["check", graph.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("unknown op `sigmod` (did you mean `sigmoid`?)"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("typo.ron:{}:{}:", expected.line, expected.column)),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fixture_path_is_a_valid_ops_file_on_its_own() {
    // The fixture parses as a plain ops document too (no rule directory needed).
    let mut catalogue = Catalogue::defaults();
    let text = std::fs::read_to_string(Path::new(FIXTURE)).unwrap();
    catalogue
        .load_str(&text, FIXTURE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(catalogue.get("mish").is_some());
}
