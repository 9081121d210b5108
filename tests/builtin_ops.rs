//! `cast` and `const` are built-ins declared in `ops.ron`, like the layout ops: the engine finds
//! them by role through the catalogue, never by name, so a rule set that calls them something
//! else behaves exactly like the defaults; one literal test (`OpDef::is_literal`) serves the
//! partitioner, the lowering and the report alike; mis-declared built-ins are located errors.

use fusebox::amp::insert_casts;
use fusebox::dag::Dag;
use fusebox::dtype::DType;
use fusebox::egraph::{self, ENode, FuseGraph, Leaf};
use fusebox::error::Error;
use fusebox::eval;
use fusebox::explain;
use fusebox::graph::{self, Graph};
use fusebox::optimize::{Options, optimize};
use fusebox::partition::{self, KernelKind};
use fusebox::rules::ops::DEFAULT_OPS;
use fusebox::rules::{AmpRules, Builtin, Catalogue, CostModel, FusionRules, RuleSet};
use fusebox::span::Position;
use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh, empty directory for one test.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-builtins-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A rule directory whose `ops.ron` is `ops`, laid over the defaults.
fn rules_with(tag: &str, ops: &str) -> RuleSet {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("ops.ron"), ops).unwrap();
    RuleSet::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"))
}

/// The error loading `text` over the defaults gives: it must point at the first `at` in the
/// text and say `says`, and the catalogue must be left as it was.
#[track_caller]
fn rejected(text: &str, at: &str, says: &str) -> Error {
    let mut catalogue = Catalogue::defaults();
    let before = catalogue.len();
    let e = catalogue
        .load_str(text, "ops.ron")
        .expect_err("expected the ops file to be rejected");
    assert_eq!(catalogue.len(), before, "a rejected file adds nothing");
    assert_eq!(
        catalogue.builtin(Builtin::Cast).map(|op| op.name()),
        Some("cast")
    );
    let index = text
        .find(at)
        .unwrap_or_else(|| panic!("{at:?} is in the text"));
    let line = text[..index].matches('\n').count() + 1;
    let column = text[..index]
        .chars()
        .rev()
        .take_while(|&c| c != '\n')
        .count()
        + 1;
    assert_eq!(e.site.file.as_deref(), Some("ops.ron"), "{e}");
    assert_eq!(e.site.position, Some(Position { line, column }), "{e}");
    assert!(e.to_string().contains(says), "{e}");
    e
}

// ---------------------------------------------------------------- the default catalogue

#[test]
fn the_defaults_declare_cast_and_const_as_builtins() {
    let ops = Catalogue::defaults();
    let cast = ops.builtin(Builtin::Cast).expect("a cast op");
    let literal = ops.builtin(Builtin::Const).expect("a const op");
    assert_eq!(cast.name(), "cast");
    assert_eq!(literal.name(), "const");
    // Pointwise built-ins keep their formulas: the evaluator and the emitters read them.
    assert_eq!(cast.formula().map(|f| f.to_string()).as_deref(), Some("x"));
    assert_eq!(
        literal.formula().map(|f| f.to_string()).as_deref(),
        Some("value")
    );
    assert_eq!(
        ops.builtin(Builtin::BroadcastTo).map(|op| op.name()),
        Some("broadcast_to")
    );
    // Every built-in has exactly one default op, named like it.
    for b in Builtin::ALL {
        let op = ops.builtin(b).unwrap_or_else(|| panic!("{b:?}"));
        assert_eq!(op.builtin(), Some(b));
        assert_eq!(op.kind(), b.kind());
        assert_eq!(op.name(), b.name());
    }
    let literals: Vec<&str> = ops
        .ops()
        .filter(|op| op.is_literal())
        .map(|op| op.name())
        .collect();
    assert_eq!(literals, ["const"]);
    assert_eq!(ops.get("add").unwrap().builtin(), None);
}

// ---------------------------------------------------------------- renaming

/// The default ops, rewrites and graphs with `cast` called `convert` and `const` called
/// `scalar`.
fn renamed(text: &str) -> String {
    text.replace("name: \"cast\"", "name: \"convert\"")
        .replace("name: \"const\"", "name: \"scalar\"")
        .replace("op: \"cast\"", "op: \"convert\"")
        .replace("op: \"const\"", "op: \"scalar\"")
        .replace("(cast ", "(convert ")
        .replace("(const ", "(scalar ")
}

/// A rule set built from scratch in which no op is called `cast` or `const`: the defaults
/// with both renamed everywhere (ops, rewrites).
fn renamed_rules() -> RuleSet {
    let mut ops = Catalogue::default();
    ops.load_str(&renamed(DEFAULT_OPS), "renamed/ops.ron")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(ops.get("cast").is_none() && ops.get("const").is_none());
    let mut rewrites = Vec::new();
    for entry in std::fs::read_dir(repo().join("rules/rewrites")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let text = renamed(&std::fs::read_to_string(&path).unwrap());
        rewrites.push((name.clone(), text, format!("renamed/rewrites/{name}")));
    }
    rewrites.sort();
    let text = |file: &str| std::fs::read_to_string(repo().join("rules").join(file)).unwrap();
    let onnx =
        fusebox::rules::MapTable::load_str(&renamed(&text("onnx.ron")), "renamed/onnx.ron", &ops)
            .unwrap_or_else(|e| panic!("{e}"));
    RuleSet {
        amp: AmpRules::load_str(&text("amp.ron"), "rules/amp.ron", &ops)
            .unwrap_or_else(|e| panic!("{e}")),
        fusion: FusionRules::load_str(&text("fusion.ron"), "rules/fusion.ron", &ops)
            .unwrap_or_else(|e| panic!("{e}")),
        cost: CostModel::defaults(),
        gradients: fusebox::rules::GradientRules::load_str(
            &renamed(&text("gradients.ron")),
            "renamed/gradients.ron",
            &ops,
        )
        .unwrap_or_else(|e| panic!("{e}")),
        aten: fusebox::rules::aten::AtenTable::defaults(&onnx),
        onnx,
        rewrites: fusebox::rewrite::load_rule_set(&ops, &rewrites)
            .unwrap_or_else(|e| panic!("{e}")),
        ops,
        warnings: Vec::new(),
    }
}

/// A report as JSON with the renamed ops named back and the timings left out.
fn comparable(report: &fusebox::optimize::Report) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("time_ms");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            serde_json::Value::String(s) => {
                // Values a rewrite introduces are named after their op (`convert_4`).
                *s = s
                    .replace("= convert", "= cast")
                    .replace("= scalar", "= const")
                    .replace("convert_", "cast_")
                    .replace("scalar_", "const_");
            }
            _ => {}
        }
    }
    let mut v = serde_json::to_value(report).unwrap();
    strip(&mut v);
    v
}

/// Every example, as written and under both AMP policies, optimizes to the same report with
/// `cast` and `const` renamed: nothing in the engine looks for those names.
#[test]
fn renamed_cast_and_const_optimize_every_example_identically() {
    let defaults = RuleSet::defaults();
    let renamed_set = renamed_rules();
    assert_eq!(
        renamed_set.ops.builtin(Builtin::Cast).map(|op| op.name()),
        Some("convert")
    );
    assert_eq!(
        renamed_set.ops.builtin(Builtin::Const).map(|op| op.name()),
        Some("scalar")
    );
    let mut examples: Vec<PathBuf> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 9);
    let mut casts = 0;
    for path in &examples {
        let text = std::fs::read_to_string(path).unwrap();
        let shown = path.display().to_string();
        let original = graph::file::parse(&text, &shown, &defaults.ops)
            .unwrap_or_else(|e| panic!("{e}"))
            .0;
        let graph = graph::file::parse(&renamed(&text), &shown, &renamed_set.ops)
            .unwrap_or_else(|e| panic!("{e}"))
            .0;
        for amp in [None, Some("f16"), Some("bf16")] {
            let options = Options {
                amp: amp.map(String::from),
                ..Options::default()
            };
            let want = optimize(&original, &defaults, &options).unwrap_or_else(|e| panic!("{e}"));
            let got = optimize(&graph, &renamed_set, &options).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                comparable(&got.report),
                comparable(&want.report),
                "{shown} with AMP {amp:?}"
            );
            assert!(
                got.graph
                    .nodes
                    .iter()
                    .all(|n| n.op != "cast" && n.op != "const")
            );
            casts += got.report.casts_after;
        }
    }
    // AMP inserted (renamed) casts, and the matmul lowering absorbed some: mlp_block's
    // library calls read `convert`ed operands.
    assert!(casts > 0);
    let mlp = renamed(&std::fs::read_to_string(repo().join("examples/mlp_block.ron")).unwrap());
    let mlp = graph::file::parse(&mlp, "mlp_block.ron", &renamed_set.ops)
        .unwrap()
        .0;
    let options = Options {
        amp: Some("f16".into()),
        ..Options::default()
    };
    let out = optimize(&mlp, &renamed_set, &options).unwrap();
    assert!(
        out.report
            .kernels
            .iter()
            .any(|k| k.kind == KernelKind::Library
                && k.ops.iter().any(|op| op.ends_with("= convert")))
    );
}

const TO_DTYPE: &str = r#"[
    Op(name: "to_dtype", kind: Pointwise, builtin: "cast", operands: ["v"],
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)],
       formula: "v", derivatives: {"v": "g"}),
]
"#;

/// A user's file laid over the defaults can hand the cast role to a new op: AMP then inserts
/// that op, and the cast it replaces in that role is still a cast wherever it appears.
#[test]
fn a_later_cast_op_takes_over_the_role() {
    let rules = rules_with("takeover", TO_DTYPE);
    assert_eq!(
        rules.ops.builtin(Builtin::Cast).map(|op| op.name()),
        Some("to_dtype")
    );
    assert_eq!(
        rules.ops.get("cast").unwrap().builtin(),
        Some(Builtin::Cast)
    );
    let path = repo().join("examples/mlp_block.ron");
    let graph = graph::file::load(&path, &rules.ops).unwrap().0;
    let amp = insert_casts(&graph, &rules.ops, rules.amp.policy("f16").unwrap()).unwrap();
    let inserted = amp
        .graph
        .nodes
        .iter()
        .filter(|n| n.op == "to_dtype")
        .count();
    assert_eq!(inserted, amp.casts_inserted);
    assert!(inserted > 0);
    assert!(amp.graph.nodes.iter().all(|n| n.op != "cast"));
    // A policy cannot list a cast, whatever its name.
    let dir = temp_dir("takeover-amp");
    std::fs::write(dir.join("ops.ron"), TO_DTYPE).unwrap();
    std::fs::write(
        dir.join("amp.ron"),
        r#"Amp(policies: {"f16": Policy(target: "f16", low_precision: ["matmul", "to_dtype"])})"#,
    )
    .unwrap();
    let e = RuleSet::load_dir(&dir).expect_err("a cast cannot be listed");
    assert!(e.to_string().contains("`to_dtype` cannot be listed"), "{e}");
}

// ---------------------------------------------------------------- one literal test

/// A user's nullary op is a literal exactly like `const`: the report's "one kernel per op"
/// count and the unfused partition it is priced from agree, and the drawing shows it as a
/// value, not a kernel.
#[test]
fn a_users_nullary_op_is_a_literal_everywhere() {
    let rules = rules_with(
        "nullary",
        r#"[
    Op(name: "pi", kind: Pointwise, operands: [], dtype: FromAttr("dtype"),
       attrs: [Attr(name: "dtype", ty: DType, default: DType("f32"))],
       formula: "3.141592653589793"),
]
"#,
    );
    let pi = rules.ops.get("pi").unwrap();
    assert!(pi.is_literal());
    assert_eq!(
        pi.builtin(),
        None,
        "a literal, but not the catalogue's const op"
    );
    let text = r#"Graph(name: "circle",
    inputs: [Input(name: "r", dtype: "f32", shape: [4, 8])],
    nodes: [
        Node(name: "p", op: "pi"),
        Node(name: "two", op: "const", attrs: {"value": 2.0}),
        Node(name: "d", op: "mul", args: ["r", "two"]),
        Node(name: "c", op: "mul", args: ["d", "p"]),
    ],
    outputs: ["c"])"#;
    let graph: Graph = graph::file::parse(text, "circle.ron", &rules.ops)
        .unwrap_or_else(|e| panic!("{e}"))
        .0;
    let out = optimize(&graph, &rules, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    let input = Dag::from_graph(&graph, &rules.ops).unwrap();
    let profile = rules.cost.profile("cpu").unwrap();
    let unfused = partition::unfused(&input, profile);
    assert_eq!(
        out.report.kernels_before + out.report.library_calls_before,
        unfused.kernels.len(),
        "the report counts the kernels it prices"
    );
    assert_eq!(
        out.report.kernels_before, 2,
        "the two muls; `pi` and `two` are literals"
    );
    assert!((out.report.cost_before - unfused.cost.total_us).abs() < 1e-9);
    for node in &input.nodes {
        assert_eq!(partition::is_literal(node), node.op.is_literal());
    }
    let dot = explain::to_dot(&out);
    assert!(dot.contains("label=\"pi f32\""), "{dot}");
    // The optimized graph still computes 2πr.
    let inputs = eval::random_inputs(&graph, 7);
    let want = eval::evaluate(&graph, &rules.ops, &inputs).unwrap();
    let got = eval::evaluate(&out.graph, &rules.ops, &inputs).unwrap();
    assert_eq!(want["c"], got["c"]);
}

const FOLDABLE: &str = r#"Graph(name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "a", op: "const", attrs: {"value": 2.0}),
        Node(name: "b", op: "const", attrs: {"value": 3.0}),
        Node(name: "c", op: "mul", args: ["a", "b"]),
        Node(name: "y", op: "add", args: ["x", "c"]),
    ],
    outputs: ["y"])"#;

/// The e-graph of FOLDABLE under `rules`, and the op names of the class of `c` (2 * 3).
fn folded(rules: &RuleSet) -> (FuseGraph, Vec<ENode>) {
    let graph = graph::file::parse(FOLDABLE, "g.ron", &rules.ops)
        .unwrap_or_else(|e| panic!("{e}"))
        .0;
    let dag = Dag::from_graph(&graph, &rules.ops).unwrap();
    let mut egraph = egraph::new_egraph(&dag, &rules.ops);
    let seeded = egraph::seed(&mut egraph, &dag);
    egraph.rebuild();
    let c = egraph.find(seeded.node_classes[2]);
    let nodes = egraph[c].nodes.clone();
    assert!(
        egraph.analysis.conflicts.is_empty(),
        "{:?}",
        egraph.analysis.conflicts
    );
    (egraph, nodes)
}

/// Constant folding adds a node of the catalogue's const op, whatever its name and in
/// whatever order it declares its attributes; without a const op (a user's file took the
/// name for an ordinary literal) nothing is folded, as before.
#[test]
fn constant_folding_uses_the_const_builtin() {
    let (_, nodes) = folded(&RuleSet::defaults());
    let names: Vec<&str> = nodes.iter().filter_map(|n| n.op_name()).collect();
    assert_eq!(names, ["const", "mul"]);

    let rules = rules_with(
        "folding",
        r#"[
    Op(name: "scalar", kind: Pointwise, builtin: "const", operands: [], dtype: FromAttr("dtype"),
       attrs: [Attr(name: "dtype", ty: DType, default: DType("f32")), Attr(name: "value", ty: Float)],
       formula: "value"),
]
"#,
    );
    assert_eq!(
        rules.ops.builtin(Builtin::Const).map(|op| op.name()),
        Some("scalar")
    );
    let (egraph, nodes) = folded(&rules);
    let scalar = nodes
        .iter()
        .find(|n| n.op_name() == Some("scalar"))
        .unwrap_or_else(|| panic!("{nodes:?}"));
    assert!(nodes.iter().all(|n| n.op_name() != Some("const")));
    let ENode::Op(_, children) = scalar else {
        unreachable!()
    };
    let leaves: Vec<Leaf> = children
        .iter()
        .map(|&id| egraph[id].data.leaf().unwrap().clone())
        .collect();
    assert_eq!(leaves, [Leaf::DType(DType::F32), Leaf::num(6.0)]);

    let rules = rules_with(
        "no-const",
        r#"[
    Op(name: "const", kind: Pointwise, operands: [], dtype: FromAttr("dtype"),
       attrs: [Attr(name: "value", ty: Float), Attr(name: "dtype", ty: DType, default: DType("f32"))],
       formula: "value"),
]
"#,
    );
    assert!(rules.ops.builtin(Builtin::Const).is_none());
    assert!(rules.ops.get("const").unwrap().is_literal());
    let (_, nodes) = folded(&rules);
    let names: Vec<&str> = nodes.iter().filter_map(|n| n.op_name()).collect();
    assert_eq!(names, ["mul"]);
    let graph = graph::file::parse(FOLDABLE, "g.ron", &rules.ops).unwrap().0;
    optimize(&graph, &rules, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
}

// ---------------------------------------------------------------- located errors

#[test]
fn replacing_the_only_cast_op_is_refused() {
    let e = rejected(
        r#"[
    Op(name: "cast", kind: Pointwise, operands: ["x"], dtype: SameAs("x"), formula: "x"),
]
"#,
        "Op(name: \"cast\"",
        "leaves the catalogue without a cast",
    );
    assert_eq!(e.site.op.as_deref(), Some("cast"));
    // Declaring another cast op in the same file is fine.
    let mut ops = Catalogue::defaults();
    ops.load_str(
        r#"[
    Op(name: "cast", kind: Pointwise, operands: ["x"], dtype: SameAs("x"), formula: "x"),
    Op(name: "convert", kind: Pointwise, builtin: "cast", operands: ["x"],
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)], formula: "x"),
]
"#,
        "ops.ron",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ops.builtin(Builtin::Cast).map(|op| op.name()),
        Some("convert")
    );
    assert_eq!(ops.get("cast").unwrap().builtin(), None);
}

#[test]
fn mis_declared_pointwise_builtins_are_located() {
    // The formula is the built-in's.
    let e = rejected(
        r#"[
    Op(name: "convert", kind: Pointwise, builtin: "cast", operands: ["x"],
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)], formula: "2 * x"),
]
"#,
        "\"2 * x\"",
        "the formula of builtin `cast` is its operand",
    );
    assert_eq!(e.site.op.as_deref(), Some("convert"));
    rejected(
        r#"[
    Op(name: "k", kind: Pointwise, builtin: "const", operands: [], dtype: FromAttr("dtype"),
       attrs: [Attr(name: "value", ty: Float), Attr(name: "dtype", ty: DType)], formula: "value + 1"),
]
"#,
        "\"value + 1\"",
        "is its `value` attribute",
    );
    // Arity, attributes and their types, as for the layout built-ins.
    rejected(
        r#"[
    Op(name: "convert", kind: Pointwise, builtin: "cast", operands: ["x", "z"],
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)], formula: "x"),
]
"#,
        "\"cast\"",
        "builtin `cast` takes exactly 1 operand(s)",
    );
    rejected(
        r#"[
    Op(name: "k", kind: Pointwise, builtin: "const", operands: [], dtype: FromAttr("dtype"),
       attrs: [Attr(name: "dtype", ty: DType)], formula: "1"),
]
"#,
        "\"const\"",
        "reads attribute `value` of type Float",
    );
    rejected(
        r#"[
    Op(name: "k", kind: Pointwise, builtin: "const", operands: [], dtype: FromAttr("dtype"),
       attrs: [Attr(name: "value", ty: Float), Attr(name: "dtype", ty: DType),
               Attr(name: "scale", ty: Float, default: Float(1.0))], formula: "value"),
]
"#,
        "[Attr(name: \"value\"",
        "cannot fill `scale`",
    );
    // The result dtype is the `dtype` attribute; a cast converts every dtype.
    rejected(
        r#"[
    Op(name: "convert", kind: Pointwise, builtin: "cast", operands: ["x"],
       dtype: SameAs("x"), attrs: [Attr(name: "dtype", ty: DType)], formula: "x"),
]
"#,
        "SameAs",
        "write `dtype: FromAttr(\"dtype\")`",
    );
    rejected(
        r#"[
    Op(name: "convert", kind: Pointwise, builtin: "cast", operands: ["x"], accepts: {"x": Float},
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)], formula: "x"),
]
"#,
        "{\"x\": Float}",
        "converts every dtype",
    );
    // The kind must match, and a pointwise built-in still declares its formula.
    rejected(
        r#"[
    Op(name: "convert", kind: Layout, builtin: "cast", operands: ["x"],
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)]),
]
"#,
        "Layout",
        "builtin `cast` is a Pointwise op, not Layout",
    );
    rejected(
        r#"[
    Op(name: "convert", kind: Pointwise, builtin: "cast", operands: ["x"],
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)]),
]
"#,
        "Pointwise",
        "needs a `formula`",
    );
    // The hint knows the new names.
    rejected(
        r#"[
    Op(name: "convert", kind: Pointwise, builtin: "cats", operands: ["x"],
       dtype: FromAttr("dtype"), attrs: [Attr(name: "dtype", ty: DType)], formula: "x"),
]
"#,
        "\"cats\"",
        "did you mean `cast`?",
    );
}
