//! Every class of user error is reported as a typed error at the exact place it was made.
//!
//! Positions below are counted by hand from the texts (1-based lines and columns, columns in
//! chars). For a node-level problem the position is where the offending value starts: the op
//! string for an unknown op or a shape error, the arg string for a bad argument, the key for an
//! unknown attribute, the value for a mistyped one, the char inside a formula for a formula error.

use fusebox::dtype::DType;
use fusebox::error::{Error, ErrorKind};
use fusebox::eval::{Tensors, evaluate};
use fusebox::graph::file::{load, parse};
use fusebox::rules::{Catalogue, RuleSet};
use fusebox::span::Position;
use fusebox::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn graph_err(text: &str) -> Error {
    match parse(text, "g.ron", &Catalogue::defaults()) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e,
    }
}

fn ops_err(text: &str) -> Error {
    let mut catalogue = Catalogue::defaults();
    let before = catalogue.len();
    let e = catalogue
        .load_str(text, "ops.ron")
        .expect_err("expected the ops file to be rejected");
    assert_eq!(catalogue.len(), before, "a rejected file adds nothing");
    e
}

#[track_caller]
fn assert_at(e: &Error, file: &str, line: usize, column: usize) {
    assert_eq!(e.site.file.as_deref(), Some(file), "{e}");
    assert_eq!(e.site.position, Some(Position { line, column }), "{e}");
}

#[track_caller]
fn assert_node(e: &Error, node: &str) {
    assert_eq!(e.site.node.as_deref(), Some(node), "{e}");
}

/// A scratch directory for files the CLI reads.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-errors-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fusebox(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the fusebox binary runs")
}

/// Exit status 1, nothing on stdout, one `error: ...` line on stderr and no panic text.
#[track_caller]
fn assert_clean_failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "unwrap"] {
        assert!(!stderr.contains(bad), "{stderr}");
    }
    stderr
}

// ------------------------------------------------------------------------------- RON syntax

#[test]
fn missing_comma_is_a_syntax_error_at_the_next_field() {
    let e = graph_err(
        r#"Graph(
    name: "g"
    inputs: [],
    nodes: [],
    outputs: [],
)
"#,
    );
    assert!(matches!(e.kind, ErrorKind::Syntax(_)), "{e}");
    // ron notices the missing comma where the next field begins.
    assert_at(&e, "g.ron", 3, 5);
    assert_eq!(e.site.node, None);
}

#[test]
fn unterminated_string_is_a_syntax_error() {
    let e = graph_err(
        r#"Graph(
    name: "g,
    outputs: [],
)
"#,
    );
    assert!(matches!(e.kind, ErrorKind::Syntax(_)), "{e}");
    assert_at(&e, "g.ron", 2, 11);
}

#[test]
fn unknown_field_is_a_syntax_error_naming_the_field() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "t", op: "neg", arg: ["x"]),
    ],
    outputs: ["t"],
)
"#,
    );
    let ErrorKind::Syntax(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("`arg`"), "{message}");
    assert!(message.contains("args"), "{message}");
    assert_at(&e, "g.ron", 5, 36);
}

// ------------------------------------------------------------------------------- node errors

#[test]
fn unknown_op_suggests_the_nearest_name() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "t", op: "sigmod", args: ["x"]),
    ],
    outputs: ["t"],
)
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::UnknownOp {
            op: "sigmod".into(),
            suggestion: Some("sigmoid".into())
        }
    );
    assert_at(&e, "g.ron", 5, 29);
    assert_node(&e, "t");
    assert_eq!(
        e.to_string(),
        "g.ron:5:29: node `t`: unknown op `sigmod` (did you mean `sigmoid`?)"
    );
}

#[test]
fn wrong_arity_points_at_the_args() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "t", op: "add", args: ["x"]),
    ],
    outputs: ["t"],
)
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::Arity {
            op: "add".into(),
            expected: "2".into(),
            got: 1
        }
    );
    assert_at(&e, "g.ron", 5, 42);
    assert_node(&e, "t");
}

#[test]
fn concat_without_args_needs_at_least_one() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [],
    nodes: [
        Node(name: "t", op: "concat", args: []),
    ],
    outputs: ["t"],
)
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::Arity {
            op: "concat".into(),
            expected: "at least 1".into(),
            got: 0
        }
    );
    assert_at(&e, "g.ron", 5, 45);
}

#[test]
fn missing_required_attribute_points_at_the_node_or_its_attrs() {
    let text = r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "t", op: "cast", args: ["x"]),
        Node(name: "u", op: "cast", args: ["x"], attrs: {}),
    ],
    outputs: ["t"],
)
"#;
    let e = graph_err(text);
    let missing = ErrorKind::MissingAttr {
        op: "cast".into(),
        attr: "dtype".into(),
    };
    assert_eq!(e.kind, missing);
    // No `attrs` written: the node itself.
    assert_at(&e, "g.ron", 5, 9);
    assert_node(&e, "t");

    let e = graph_err(&text.replace(
        "        Node(name: \"t\", op: \"cast\", args: [\"x\"]),\n",
        "",
    ));
    assert_eq!(e.kind, missing);
    // Now on line 5: the empty attrs map.
    assert_at(&e, "g.ron", 5, 57);
    assert_node(&e, "u");
}

#[test]
fn unknown_attribute_points_at_the_key_and_suggests() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4, 3])],
    nodes: [
        Node(name: "m", op: "sum", args: ["x"], attrs: {"keepdims": true}),
    ],
    outputs: ["m"],
)
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::UnknownAttr {
            op: "sum".into(),
            attr: "keepdims".into(),
            suggestion: Some("keepdim".into())
        }
    );
    assert_at(&e, "g.ron", 5, 57);
    assert_node(&e, "m");
}

#[test]
fn mistyped_attributes_point_at_the_value() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4, 3])],
    nodes: [
        Node(name: "m", op: "sum", args: ["x"], attrs: {"axes": 1.5}),
    ],
    outputs: ["m"],
)
"#,
    );
    let ErrorKind::AttrType {
        attr,
        expected,
        found,
    } = &e.kind
    else {
        panic!("{e}")
    };
    assert_eq!(attr, "axes");
    assert_eq!(expected, "a list of integers");
    assert!(found.contains("1.5"), "{found}");
    assert_at(&e, "g.ron", 5, 65);
    assert_node(&e, "m");

    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4, 3])],
    nodes: [
        Node(name: "t", op: "cast", args: ["x"], attrs: {"dtype": "f8"}),
    ],
    outputs: ["t"],
)
"#,
    );
    let ErrorKind::AttrType { attr, found, .. } = &e.kind else {
        panic!("{e}")
    };
    assert_eq!(attr, "dtype");
    assert!(found.contains("\"f8\""), "{found}");
    assert_at(&e, "g.ron", 5, 67);
    assert_node(&e, "t");
}

#[test]
fn integer_attribute_rejects_a_fraction_and_a_string() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4, 3])],
    nodes: [
        Node(name: "s", op: "slice", args: ["x"], attrs: {"axis": "1"}),
    ],
    outputs: ["s"],
)
"#,
    );
    assert!(
        matches!(&e.kind, ErrorKind::AttrType { attr, .. } if attr == "axis"),
        "{e}"
    );
    // `        Node(name: "s", op: "slice", args: ["x"], attrs: {"axis": ` is 66 chars.
    assert_at(&e, "g.ron", 5, 67);
}

#[test]
fn unknown_input_dtype_points_at_the_dtype() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f31", shape: [4])],
    nodes: [],
    outputs: ["x"],
)
"#,
    );
    let ErrorKind::DType(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("`f31`"), "{message}");
    assert!(message.contains("did you mean `f32`?"), "{message}");
    assert_at(&e, "g.ron", 3, 38);
    assert_node(&e, "x");
}

#[test]
fn unknown_arg_points_at_the_arg_and_suggests() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [4]),
        Input(name: "bias", dtype: "f32", shape: [4]),
    ],
    nodes: [
        Node(name: "t", op: "add", args: ["x", "bais"]),
    ],
    outputs: ["t"],
)
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::UnknownName {
            name: "bais".into(),
            suggestion: Some("bias".into())
        }
    );
    assert_at(&e, "g.ron", 8, 48);
    assert_node(&e, "t");
}

#[test]
fn using_a_later_node_is_use_before_definition() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "a", op: "neg", args: ["b"]),
        Node(name: "b", op: "neg", args: ["x"]),
    ],
    outputs: ["a"],
)
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::UseBeforeDefinition {
            name: "b".into(),
            index: 1
        }
    );
    assert_at(&e, "g.ron", 5, 43);
    assert_node(&e, "a");
}

#[test]
fn self_reference_is_a_cycle() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "a", op: "add", args: ["x", "a"]),
    ],
    outputs: ["a"],
)
"#,
    );
    assert_eq!(e.kind, ErrorKind::Cycle { name: "a".into() });
    assert_at(&e, "g.ron", 5, 48);
    assert_node(&e, "a");
}

#[test]
fn duplicate_node_name_points_at_the_second_name() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "a", op: "neg", args: ["x"]),
        Node(name: "a", op: "exp", args: ["x"]),
    ],
    outputs: ["a"],
)
"#,
    );
    assert_eq!(e.kind, ErrorKind::Duplicate { name: "a".into() });
    assert_at(&e, "g.ron", 6, 20);
    assert_node(&e, "a");
}

#[test]
fn node_named_like_an_input_is_a_duplicate() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "x", op: "neg", args: ["x"]),
    ],
    outputs: ["x"],
)
"#,
    );
    assert_eq!(e.kind, ErrorKind::Duplicate { name: "x".into() });
    assert_at(&e, "g.ron", 5, 20);
}

#[test]
fn duplicate_input_name_points_at_the_second_input() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [4]),
        Input(name: "x", dtype: "f16", shape: [4]),
    ],
    nodes: [],
    outputs: ["x"],
)
"#,
    );
    assert_eq!(e.kind, ErrorKind::Duplicate { name: "x".into() });
    assert_at(&e, "g.ron", 5, 21);
    assert_node(&e, "x");
}

/// A graph with inputs `x: f32[2, 3]` and `y` of the given shape, and one node `t` (line 6,
/// op string at column 29).
fn one_node(y_shape: &str, node: &str) -> String {
    format!(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [2, 3]),
             Input(name: "y", dtype: "f32", shape: {y_shape})],
    nodes: [
        Node(name: "t", {node}),
    ],
    outputs: ["t"],
)
"#
    )
}

#[track_caller]
fn assert_shape_error(text: &str, needle: &str) {
    let e = graph_err(text);
    let ErrorKind::Shape(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains(needle), "{message}");
    assert_at(&e, "g.ron", 6, 29);
    assert_node(&e, "t");
}

#[test]
fn broadcast_failure_is_a_shape_error_at_the_op() {
    assert_shape_error(
        &one_node("[3, 2]", r#"op: "add", args: ["x", "y"]"#),
        "do not broadcast",
    );
}

#[test]
fn matmul_inner_dimensions_must_agree() {
    assert_shape_error(
        &one_node("[4, 5]", r#"op: "matmul", args: ["x", "y"]"#),
        "inner dimensions 3 and 4 differ",
    );
}

#[test]
fn reshape_must_keep_the_element_count() {
    assert_shape_error(
        &one_node(
            "[1]",
            r#"op: "reshape", args: ["x"], attrs: {"shape": [4, 2]}"#,
        ),
        "cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)",
    );
}

#[test]
fn sum_to_size_needs_a_target_that_broadcasts_back() {
    assert_shape_error(
        &one_node(
            "[1]",
            r#"op: "sum_to_size", args: ["x"], attrs: {"shape": [2]}"#,
        ),
        "cannot sum [2, 3] to [2]",
    );
}

#[test]
fn slice_axis_must_exist() {
    assert_shape_error(
        &one_node("[1]", r#"op: "slice", args: ["x"], attrs: {"axis": 2}"#),
        "axis 2 is out of range for rank 2",
    );
}

#[test]
fn where_needs_a_bool_condition() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "w", op: "where", args: ["x", "x", "x"]),
    ],
    outputs: ["w"],
)
"#,
    );
    let ErrorKind::DType(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("Bool"), "{message}");
    assert_at(&e, "g.ron", 5, 45);
    assert_node(&e, "w");
}

#[test]
fn unknown_output_points_at_the_output() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "t", op: "neg", args: ["x"]),
    ],
    outputs: ["t", "tt"],
)
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::UnknownName {
            name: "tt".into(),
            suggestion: Some("t".into())
        }
    );
    assert_at(&e, "g.ron", 7, 20);
    assert_eq!(e.site.node, None);
}

#[test]
fn a_graph_needs_an_output() {
    let e = graph_err(
        r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [],
    outputs: [],
)
"#,
    );
    assert!(
        matches!(&e.kind, ErrorKind::Input(m) if m.contains("at least one output")),
        "{e}"
    );
    // At the empty `outputs` list.
    assert_at(&e, "g.ron", 5, 14);
}

// ------------------------------------------------------------------------------- ops files

#[test]
fn bad_formula_syntax_points_inside_the_string() {
    // The formula on a line of its own after the op's other fields.
    let e = ops_err(
        r#"[
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       formula: "x + * 2"),
]
"#,
    );
    let ErrorKind::Formula { formula, .. } = &e.kind else {
        panic!("{e}")
    };
    assert_eq!(formula, "x + * 2");
    assert_at(&e, "ops.ron", 3, 22);
    assert_eq!(e.site.op.as_deref(), Some("twice"));

    // The formula after other content on the same line.
    let e = ops_err(
        r#"[
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]), formula: "2 * (x"),
]
"#,
    );
    assert!(matches!(e.kind, ErrorKind::Formula { .. }), "{e}");
    // `"2 * (x"` opens at column 89; the missing `)` is reported at the end of the text,
    // offset 6, the closing quote at column 96.
    assert_at(&e, "ops.ron", 2, 96);
    assert_eq!(e.site.op.as_deref(), Some("twice"));
}

#[test]
fn unknown_variable_in_a_formula_points_at_the_name() {
    let e = ops_err(
        r#"[
    Op(name: "scaled", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       formula: "x * scale"),
]
"#,
    );
    let ErrorKind::Formula { message, .. } = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("unknown name `scale`"), "{message}");
    assert_at(&e, "ops.ron", 3, 22);
    assert_eq!(e.site.op.as_deref(), Some("scaled"));
}

#[test]
fn unknown_function_in_a_derivative_points_inside_it() {
    let e = ops_err(
        r#"[
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       formula: "2 * x", derivatives: {"x": "sqr(g)"}),
]
"#,
    );
    assert!(matches!(e.kind, ErrorKind::Formula { .. }), "{e}");
    // `{"x": "sqr(g)"}` starts at column 39; the string's first char is at column 46.
    assert_at(&e, "ops.ron", 3, 46);
}

#[test]
fn unknown_builtin_suggests_the_nearest() {
    let e = ops_err(
        r#"[
    Op(name: "total", kind: Reduction, builtin: "summ", operands: ["x"], dtype: Accumulate("x")),
]
"#,
    );
    let ErrorKind::Rule(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("unknown builtin `summ`"), "{message}");
    assert!(message.contains("did you mean `sum`?"), "{message}");
    assert_at(&e, "ops.ron", 2, 49);
    assert_eq!(e.site.op.as_deref(), Some("total"));
}

#[test]
fn derivative_for_a_non_operand_is_rejected() {
    let e = ops_err(
        r#"[
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       formula: "2 * x", derivatives: {"z": "2 * g"}),
]
"#,
    );
    let ErrorKind::Rule(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("`z`"), "{message}");
    assert_at(&e, "ops.ron", 3, 39);
    assert_eq!(e.site.op.as_deref(), Some("twice"));
}

#[test]
fn duplicate_op_in_one_file_points_at_the_second() {
    let e = ops_err(
        r#"[
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]), formula: "2 * x"),
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]), formula: "x + x"),
]
"#,
    );
    assert_eq!(
        e.kind,
        ErrorKind::Duplicate {
            name: "twice".into()
        }
    );
    assert_at(&e, "ops.ron", 3, 14);
}

#[test]
fn pointwise_op_needs_a_formula() {
    let e = ops_err(
        r#"[
    Op(name: "twice", kind: Pointwise, operands: ["x"], dtype: Promote(["x"])),
]
"#,
    );
    let ErrorKind::Rule(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("needs a `formula`"), "{message}");
    assert_at(&e, "ops.ron", 2, 29);
    assert_eq!(e.site.op.as_deref(), Some("twice"));
}

#[test]
fn attribute_default_must_have_the_declared_type() {
    let e = ops_err(
        r#"[
    Op(name: "scale", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]),
       attrs: [Attr(name: "k", ty: Float, default: Int(2))],
       formula: "x * k"),
]
"#,
    );
    let ErrorKind::Rule(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("default of attribute `k`"), "{message}");
    assert_at(&e, "ops.ron", 3, 15);
    assert_eq!(e.site.op.as_deref(), Some("scale"));
}

#[test]
fn ops_file_syntax_errors_are_located() {
    let e = ops_err(
        r#"[
    Op(name: "twice", kind: Pointwize, operands: ["x"], dtype: Promote(["x"]), formula: "2 * x"),
]
"#,
    );
    let ErrorKind::Syntax(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("Pointwize"), "{message}");
    assert_eq!(e.site.file.as_deref(), Some("ops.ron"));
    assert_eq!(e.site.position.map(|p| p.line), Some(2));
}

// ------------------------------------------------------------------------------- files and dirs

#[test]
fn unknown_rule_file_suggests_ops_ron() {
    let dir = scratch("rules-name");
    std::fs::write(dir.join("op.ron"), "[]\n").unwrap();
    let e = RuleSet::load_dir(&dir).unwrap_err();
    let ErrorKind::Rule(message) = &e.kind else {
        panic!("{e}")
    };
    assert!(message.contains("unknown rule file `op.ron`"), "{message}");
    assert!(message.contains("did you mean `ops.ron`?"), "{message}");
    let shown = dir.join("op.ron").display().to_string();
    assert_at(&e, &shown, 1, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_in_a_rule_directory_name_the_file() {
    let dir = scratch("rules-formula");
    std::fs::write(
        dir.join("ops.ron"),
        "[\n    Op(name: \"twice\", kind: Pointwise, operands: [\"x\"], dtype: Promote([\"x\"]),\n       formula: \"x + * 2\"),\n]\n",
    )
    .unwrap();
    let e = RuleSet::load_dir(&dir).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Formula { .. }), "{e}");
    assert_at(&e, &dir.join("ops.ron").display().to_string(), 3, 22);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A map key written twice (two `axes` for one node) would silently keep the last value; it
/// is an error at the second key, in graph files and rule files alike.
#[test]
fn duplicate_map_keys_are_errors_at_the_second_key() {
    let e = graph_err(
        "Graph(\n    name: \"g\",\n    inputs: [Input(name: \"x\", dtype: \"f32\", shape: [4, 8])],\n    nodes: [Node(name: \"y\", op: \"sum\", args: [\"x\"], attrs: {\"axes\": [1], \"axes\": [0]})],\n    outputs: [\"y\"],\n)\n",
    );
    assert!(e.to_string().contains("key `axes` appears twice"), "{e}");
    assert_eq!(
        e.site.position,
        Some(Position {
            line: 4,
            column: 74
        }),
        "{e}"
    );
    let dir = scratch("rules-duplicate-key");
    std::fs::write(
        dir.join("ops.ron"),
        "[\n    Op(name: \"twice\", kind: Pointwise, operands: [\"x\"], dtype: Promote([\"x\"]),\n       formula: \"x * 2\", derivatives: {\"x\": \"2 * g\", \"x\": \"g\"}),\n]\n",
    )
    .unwrap();
    let e = RuleSet::load_dir(&dir).unwrap_err();
    assert!(e.to_string().contains("key `x` appears twice"), "{e}");
    assert_at(&e, &dir.join("ops.ron").display().to_string(), 3, 54);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rules put where fusebox does not read them are reported, not skipped: a `rewrites` that is
/// a file, and entries of `rewrites/` that are not `.ron` files.
#[test]
fn misplaced_rewrite_rules_are_errors_not_silently_skipped() {
    let dir = scratch("rules-rewrites-file");
    std::fs::write(dir.join("rewrites"), "[]").unwrap();
    let e = RuleSet::load_dir(&dir).unwrap_err();
    assert!(
        e.to_string().contains("`rewrites` must be a directory"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    for (entry, is_dir) in [
        ("mine.txt", false),
        ("mine.ron.bak", false),
        ("nested.ron", true),
    ] {
        let dir = scratch("rules-rewrites-entry");
        std::fs::create_dir_all(dir.join("rewrites")).unwrap();
        let path = dir.join("rewrites").join(entry);
        if is_dir {
            std::fs::create_dir(&path).unwrap();
        } else {
            std::fs::write(&path, "[]").unwrap();
        }
        let e = RuleSet::load_dir(&dir).unwrap_err();
        assert!(
            e.to_string().contains("only rule files named *.ron"),
            "{entry}: {e}"
        );
        assert!(e.to_string().contains(entry), "{entry}: {e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn missing_graph_file_is_an_io_error_naming_the_path() {
    let path = std::env::temp_dir().join(format!(
        "fusebox-errors-{}-does-not-exist/g.ron",
        std::process::id()
    ));
    let e = load(&path, &Catalogue::defaults()).unwrap_err();
    let ErrorKind::Io { path: named, .. } = &e.kind else {
        panic!("{e}")
    };
    assert_eq!(named, &path.display().to_string());
    assert_eq!(e.site.file.as_deref(), Some(named.as_str()));
    assert!(e.to_string().contains(named.as_str()), "{e}");
}

// ------------------------------------------------------------------------------- CLI

const BAD_GRAPH: &str = r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "t", op: "sigmod", args: ["x"]),
    ],
    outputs: ["t"],
)
"#;

const GOOD_GRAPH: &str = r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "t", op: "neg", args: ["x"]),
    ],
    outputs: ["t"],
)
"#;

#[test]
fn cli_check_reports_file_line_and_column() {
    let dir = scratch("cli-check");
    std::fs::write(dir.join("bad.ron"), BAD_GRAPH).unwrap();
    let out = fusebox(&["check", "bad.ron"], &dir);
    let stderr = assert_clean_failure(&out);
    assert_eq!(
        stderr,
        "error: bad.ron:5:29: node `t`: unknown op `sigmod` (did you mean `sigmoid`?)\n"
    );

    std::fs::write(
        dir.join("syntax.ron"),
        "Graph(\n    name: \"g\"\n    outputs: [],\n)\n",
    )
    .unwrap();
    let stderr = assert_clean_failure(&fusebox(&["check", "syntax.ron"], &dir));
    assert!(
        stderr.starts_with("error: syntax.ron:3:5: RON syntax: "),
        "{stderr}"
    );

    let stderr = assert_clean_failure(&fusebox(&["check", "missing.ron"], &dir));
    assert!(stderr.starts_with("error: missing.ron"), "{stderr}");
    assert!(stderr.contains("cannot read `missing.ron`"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cli_check_reports_a_bad_rules_dir() {
    let dir = scratch("cli-rules");
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(dir.join("rules/op.ron"), "[]\n").unwrap();
    std::fs::write(dir.join("g.ron"), GOOD_GRAPH).unwrap();
    let stderr = assert_clean_failure(&fusebox(&["check", "g.ron", "--rules", "rules"], &dir));
    assert!(stderr.contains("op.ron:1:1: "), "{stderr}");
    assert!(stderr.contains("did you mean `ops.ron`?"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cli_run_rejects_bad_inputs_cleanly() {
    let dir = scratch("cli-run");
    std::fs::write(dir.join("g.ron"), GOOD_GRAPH).unwrap();
    Tensor::from_values(DType::F32, &[3], vec![1.0, 2.0, 3.0])
        .unwrap()
        .write_npy(&dir.join("three.npy"))
        .unwrap();
    std::fs::write(dir.join("junk.npy"), b"not an npy file").unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "g.ron", "--backend", "reference", "--out", "out"];
        args.extend_from_slice(extra);
        fusebox(&args, &dir)
    };

    let stderr = assert_clean_failure(&run(&["--input", "x=three.npy"]));
    assert!(stderr.contains("node `x`"), "{stderr}");
    assert!(
        stderr.contains("three.npy holds shape [3], the graph declares [4]"),
        "{stderr}"
    );

    let stderr = assert_clean_failure(&run(&["--input", "z=three.npy"]));
    assert!(stderr.contains("--input `z`"), "{stderr}");
    assert!(stderr.contains("no input of that name"), "{stderr}");

    let stderr = assert_clean_failure(&run(&[]));
    assert!(stderr.contains("no value for input(s) x"), "{stderr}");
    assert!(stderr.contains("--random-inputs"), "{stderr}");

    let stderr = assert_clean_failure(&run(&["--input", "x"]));
    assert!(stderr.contains("must be NAME=FILE.npy"), "{stderr}");

    let stderr = assert_clean_failure(&run(&["--input", "x=junk.npy"]));
    assert!(stderr.contains("junk.npy"), "{stderr}");

    // A header whose shape has no representable size (npyz's unchecked product of the dims
    // panicked in debug builds).
    for shape in ["(4611686018427387904, 4)", "(0, 18446744073709551615)"] {
        std::fs::write(dir.join("huge.npy"), npy_header(shape)).unwrap();
        let stderr = assert_clean_failure(&run(&["--input", "x=huge.npy"]));
        assert!(stderr.contains("huge.npy: shape"), "{stderr}");
        assert!(stderr.contains("too large"), "{stderr}");
    }

    let stderr = assert_clean_failure(&run(&["--input", "x=absent.npy"]));
    assert!(stderr.contains("absent.npy"), "{stderr}");
    assert!(
        !dir.join("out").exists(),
        "nothing is written when inputs are bad"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A version-1 `.npy` header for float32 data of the given Python shape tuple, and no data.
fn npy_header(shape: &str) -> Vec<u8> {
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    bytes.extend_from_slice(dict.as_bytes());
    bytes
}

// ------------------------------------------------------------------------------- evaluation

#[test]
fn evaluating_with_a_wrong_input_is_an_input_error_naming_it() {
    let catalogue = Catalogue::defaults();
    let (graph, _) = parse(GOOD_GRAPH, "g.ron", &catalogue).unwrap();
    let cases = [
        Tensor::from_values(DType::F64, &[4], vec![0.0; 4]).unwrap(),
        Tensor::from_values(DType::F32, &[2, 2], vec![0.0; 4]).unwrap(),
        Tensor::scalar(DType::F32, 1.0),
    ];
    for value in cases {
        let inputs: Tensors = [("x".to_string(), value)].into();
        let e = evaluate(&graph, &catalogue, &inputs).unwrap_err();
        let ErrorKind::Input(message) = &e.kind else {
            panic!("{e}")
        };
        assert!(message.contains("input `x`"), "{message}");
        assert_node(&e, "x");
    }

    let e = evaluate(&graph, &catalogue, &Tensors::new()).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::Input(m) if m.contains("`x`")),
        "{e}"
    );

    let mut inputs: Tensors = [(
        "x".to_string(),
        Tensor::from_values(DType::F32, &[4], vec![0.0; 4]).unwrap(),
    )]
    .into();
    inputs.insert("xx".into(), Tensor::scalar(DType::F32, 1.0));
    let e = evaluate(&graph, &catalogue, &inputs).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::Input(m) if m.contains("`xx`")),
        "{e}"
    );
    assert_node(&e, "xx");
}
