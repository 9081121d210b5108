//! The loaders take hand-written text, so no text may crash them: every malformed document is
//! an `Err` that says where the problem is.
//!
//! Four targets: the graph loader (`graph::file::parse`), the ops loader
//! (`Catalogue::load_str`) and the formula parser (`formula::parse`), each fed at least 10,000
//! cases in total across its strategies, and the ONNX importer (`onnx::import`), fed mutated
//! and truncated protobuf bytes of small valid models, huge declared sizes and hostile
//! external-data paths. Inputs are random strings over a RON-ish alphabet, valid
//! documents with random character, token and line mutations, semantic mutations (numbers
//! replaced by huge, negative or fractional ones, names swapped, op and dtype names replaced)
//! and randomly generated graphs. A panic anywhere fails the test. Graphs that load are also
//! evaluated by the reference evaluator (when small) and must survive `to_ron` unchanged.

use fusebox::dtype::DType;
use fusebox::error::Error;
use fusebox::eval::{evaluate, random_inputs};
use fusebox::formula;
use fusebox::graph::file::{parse, to_ron};
use fusebox::graph::{Graph, Input, Node};
use fusebox::rules::{Catalogue, MapTable, RuleSet};
use fusebox::shape::checked_numel;
use fusebox::tensor::Tensor;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use std::sync::LazyLock;

static CATALOGUE: LazyLock<Catalogue> = LazyLock::new(Catalogue::defaults);
static ONNX_TABLE: LazyLock<MapTable> = LazyLock::new(|| MapTable::defaults(&CATALOGUE));

const OPS: &str = include_str!("../rules/ops.ron");

/// Valid graphs covering every built-in and most pointwise ops, all dtypes, scalars and empty
/// tensors.
const GRAPHS: [&str; 5] = [
    r#"Graph(
    name: "mlp",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [4, 8]),
        Input(name: "w", dtype: "f32", shape: [8, 3]),
        Input(name: "b", dtype: "f32", shape: [3]),
    ],
    nodes: [
        Node(name: "h", op: "matmul", args: ["x", "w"]),
        Node(name: "hb", op: "add", args: ["h", "b"]),
        Node(name: "g", op: "gelu", args: ["hb"]),
        Node(name: "m", op: "mean", args: ["g"], attrs: {"axes": [-1], "keepdim": true}),
        Node(name: "c", op: "sub", args: ["g", "m"]),
        Node(name: "sq", op: "mul", args: ["c", "c"]),
        Node(name: "v", op: "sum", args: ["sq"], attrs: {"axes": [1]}),
        Node(name: "eps", op: "const", attrs: {"value": 1e-5, "dtype": "f32"}),
        Node(name: "r", op: "rsqrt", args: ["eps"]),
        Node(name: "gt", op: "gelu_tanh", args: ["r"]),
    ],
    outputs: ["c", "v", "gt"],
)
"#,
    r#"Graph(
    name: "layout",
    inputs: [
        Input(name: "a", dtype: "f16", shape: [2, 3, 4]),
        Input(name: "i", dtype: "i32", shape: [4]),
        Input(name: "mask", dtype: "bool", shape: [2, 3, 4]),
    ],
    nodes: [
        Node(name: "t", op: "transpose", args: ["a"], attrs: {"perm": [2, 0, 1]}),
        Node(name: "r", op: "reshape", args: ["t"], attrs: {"shape": [4, -1]}),
        Node(name: "s", op: "slice", args: ["r"], attrs: {"axis": 1, "start": 1, "end": -1, "step": 2}),
        Node(name: "ci", op: "cast", args: ["i"], attrs: {"dtype": "bf16"}),
        Node(name: "bc", op: "broadcast_to", args: ["ci"], attrs: {"shape": [2, 3, 4]}),
        Node(name: "w", op: "where", args: ["mask", "a", "bc"]),
        Node(name: "cat", op: "concat", args: ["a", "w", "a"], attrs: {"axis": 0}),
        Node(name: "st", op: "sum_to_size", args: ["cat"], attrs: {"shape": [1, 4]}),
        Node(name: "mx", op: "reduce_max", args: ["cat"], attrs: {"axes": [0, 1]}),
        Node(name: "gt", op: "gt", args: ["mx", "st"]),
    ],
    outputs: ["s", "st", "gt"],
)
"#,
    r#"Graph(
    name: "zoo",
    inputs: [
        Input(name: "x", dtype: "bf16", shape: [5]),
        Input(name: "y", dtype: "f64", shape: []),
        Input(name: "n", dtype: "i64", shape: [5]),
    ],
    nodes: [
        Node(name: "c", op: "clamp", args: ["x"], attrs: {"min": -1.5, "max": 2}),
        Node(name: "p", op: "pow", args: ["c", "y"]),
        Node(name: "d", op: "div", args: ["n", "n"]),
        Node(name: "e", op: "exp", args: ["d"]),
        Node(name: "l", op: "log1p", args: ["e"]),
        Node(name: "s", op: "softplus", args: ["l"]),
        Node(name: "q", op: "eq", args: ["n", "p"]),
        Node(name: "z", op: "mean", args: ["n"]),
        Node(name: "k", op: "sum", args: ["q"]),
        Node(name: "t", op: "tanh", args: ["s"]),
        Node(name: "u", op: "silu", args: ["t"]),
        Node(name: "v", op: "abs", args: ["u"]),
        Node(name: "mn", op: "min", args: ["v", "z"]),
        Node(name: "nz", op: "ne", args: ["mn", "k"]),
        Node(name: "lg", op: "log", args: ["n"]),
        Node(name: "sq", op: "sqrt", args: ["lg"]),
        Node(name: "rl", op: "relu", args: ["sq"]),
        Node(name: "sn", op: "sin", args: ["rl"]),
        Node(name: "cs", op: "cos", args: ["sn"]),
        Node(name: "ng", op: "neg", args: ["cs"]),
        Node(name: "mx", op: "max", args: ["ng", "x"]),
        Node(name: "le", op: "le", args: ["mx", "y"]),
        Node(name: "lt", op: "lt", args: ["mx", "y"]),
        Node(name: "ge", op: "ge", args: ["le", "lt"]),
    ],
    outputs: ["mn", "nz", "k", "ge"],
)
"#,
    r#"Graph(
    name: "edge",
    inputs: [
        Input(name: "e", dtype: "f32", shape: [0, 3]),
        Input(name: "s", dtype: "f32", shape: []),
    ],
    nodes: [
        Node(name: "a", op: "add", args: ["e", "s"]),
        Node(name: "m", op: "mean", args: ["a"], attrs: {"axes": [0]}),
        Node(name: "r", op: "reshape", args: ["a"], attrs: {"shape": [3, 0]}),
        Node(name: "mm", op: "matmul", args: ["r", "e"]),
        Node(name: "sg", op: "sigmoid", args: ["s"]),
    ],
    outputs: ["m", "mm", "sg"],
)
"#,
    r#"Graph(
    name: "composites",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [3, 4]),
        Input(name: "w", dtype: "f32", shape: [4]),
        Input(name: "b", dtype: "f32", shape: [4]),
    ],
    nodes: [
        Node(name: "n", op: "layer_norm", args: ["x", "w", "b"], attrs: {"axes": [-1], "epsilon": 1e-3}),
        Node(name: "s", op: "softmax", args: ["n"], attrs: {"axis": 0}),
        Node(name: "l", op: "leaky_relu", args: ["s"], attrs: {"alpha": 0.2}),
        Node(name: "r", op: "rms_norm", args: ["l", "w"]),
        Node(name: "m", op: "reduce_min", args: ["r"], attrs: {"axes": [1], "keepdim": true}),
    ],
    outputs: ["m", "s"],
)
"#,
];

/// Small ops documents exercising every field of the schema.
const OPS_DOCS: [&str; 4] = [
    r#"[
    Op(name: "scale", kind: Pointwise, operands: ["x"], dtype: FloatPromote(["x"]),
       attrs: [Attr(name: "k", ty: Float, default: Float(2.0))],
       formula: "x * k", derivatives: {"x": "g * k"}, doc: "x times k"),
    Op(name: "pick", kind: Pointwise, operands: ["c", "a", "b"], dtype: Promote(["a", "b"]),
       accepts: {"c": Bool}, formula: "select(c, a, b)",
       derivatives: {"a": "select(c, g, 0)", "b": "select(c, 0, g)"}),
]
"#,
    r#"[
    Op(name: "total", kind: Reduction, builtin: "sum", operands: ["x"], dtype: Accumulate("x"),
       attrs: [Attr(name: "axes", ty: Ints, optional: true),
               Attr(name: "keepdim", ty: Bool, default: Bool(true))]),
    Op(name: "join", kind: Layout, builtin: "concat", operands: ["xs"], variadic: true,
       dtype: Promote(["xs"]), attrs: [Attr(name: "axis", ty: Int, default: Int(-1))]),
    Op(name: "to", kind: Pointwise, operands: ["x"], dtype: FromAttr("dtype"),
       attrs: [Attr(name: "dtype", ty: DType, default: DType("bf16"))], formula: "x"),
]
"#,
    r#"[
    Op(name: "mm", kind: Opaque, builtin: "matmul", operands: ["a", "b"], dtype: Promote(["a", "b"]),
       accepts: {"a": Float, "b": Numeric}),
    Op(name: "pick_row", kind: Layout, builtin: "slice", operands: ["x"], dtype: SameAs("x"),
       attrs: [Attr(name: "axis", ty: Int, default: Int(0)), Attr(name: "start", ty: Int, default: Int(0)),
               Attr(name: "end", ty: Int, optional: true), Attr(name: "step", ty: Int, default: Int(3))]),
    Op(name: "pos", kind: Pointwise, operands: ["x"], dtype: Bool, formula: "x > 0"),
]
"#,
    r#"[
    Composite(name: "norm2", operands: ["x", "w"],
       attrs: [Attr(name: "axis", ty: Int, default: Int(-1)), Attr(name: "eps", ty: Float, default: Float(1e-6))],
       nodes: [
           Node(name: "s", op: "softmax", args: ["x"], attrs: {"axis": "$axis"}),
           Node(name: "e", op: "const", attrs: {"value": "$eps", "dtype": "$x.dtype"}),
           Node(name: "t", op: "add", args: ["s", "e"]),
           Node(name: "y", op: "mul", args: ["t", "w"]),
       ], doc: "a composite over a composite"),
]
"#,
];

/// No file is written for failures (the regression cases are kept as `#[test]`s below).
/// `FUSEBOX_FUZZ_SCALE=N` multiplies every case count, for a longer hunt.
fn config(cases: u32) -> ProptestConfig {
    let scale = std::env::var("FUSEBOX_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    ProptestConfig {
        cases: cases.saturating_mul(scale),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------------------------- properties

/// Every error names the file and a real 1-based position inside (or just past) the text.
fn check_located(e: &Error, text: &str, file: &str) -> Result<(), TestCaseError> {
    let shown = e.to_string();
    prop_assert_eq!(
        e.site.file.as_deref(),
        Some(file),
        "{} for {:?}",
        shown,
        text
    );
    let Some(p) = e.site.position else {
        return Err(TestCaseError::fail(format!(
            "no position: {shown} for {text:?}"
        )));
    };
    prop_assert!(p.line >= 1 && p.column >= 1, "{} for {:?}", shown, text);
    prop_assert!(
        p.line <= text.lines().count() + 1,
        "line past the end: {} for {:?}",
        shown,
        text
    );
    if let Some(line) = text.split('\n').nth(p.line - 1) {
        prop_assert!(
            p.column <= line.chars().count() + 1,
            "column past the end of the line: {} for {:?}",
            shown,
            text
        );
    }
    let prefix = format!("{file}:{}:{}: ", p.line, p.column);
    prop_assert!(shown.starts_with(&prefix), "{} for {:?}", shown, text);
    Ok(())
}

fn has_nan(graph: &Graph) -> bool {
    graph.nodes.iter().any(|n| {
        n.attrs
            .values()
            .any(|v| matches!(v, fusebox::attr::AttrValue::Float(f) if f.is_nan()))
    })
}

/// Parses a graph text; on success evaluates it (when small) and round-trips it.
fn graph_property(text: &str) -> Result<(), TestCaseError> {
    match parse(text, "fuzz.ron", &CATALOGUE) {
        Err(e) => check_located(&e, text, "fuzz.ron"),
        Ok((graph, types)) => {
            // A checked graph types every input and node.
            prop_assert_eq!(types.len(), graph.inputs.len() + graph.nodes.len());
            let total = types
                .values()
                .map(|t| checked_numel(&t.shape).unwrap_or(usize::MAX))
                .fold(0usize, usize::saturating_add);
            if total <= 100_000 {
                let inputs = random_inputs(&graph, text.len() as u64);
                if let Ok(outputs) = evaluate(&graph, &CATALOGUE, &inputs) {
                    for name in &graph.outputs {
                        let t = &outputs[name];
                        prop_assert_eq!(t.shape(), types[name].shape.as_slice());
                        prop_assert_eq!(t.dtype, types[name].dtype);
                    }
                }
            }
            let saved = to_ron(&graph);
            let (again, types_again) = parse(&saved, "saved.ron", &CATALOGUE).map_err(|e| {
                TestCaseError::fail(format!("saved graph does not load: {e}\n{saved}"))
            })?;
            prop_assert_eq!(&to_ron(&again), &saved);
            prop_assert_eq!(types_again, types);
            if !has_nan(&graph) {
                prop_assert_eq!(again, graph);
            }
            Ok(())
        }
    }
}

/// Loads an ops text over the defaults; on success applies every op it changed to small inputs.
fn ops_property(text: &str) -> Result<(), TestCaseError> {
    let mut catalogue = CATALOGUE.clone();
    match catalogue.load_str(text, "fuzz_ops.ron") {
        Err(e) => {
            check_located(&e, text, "fuzz_ops.ron")?;
            prop_assert_eq!(
                catalogue.len(),
                CATALOGUE.len(),
                "a rejected file adds nothing"
            );
            Ok(())
        }
        Ok(()) => {
            // A composite the file added or changed is expanded and run on small inputs.
            for composite in catalogue.composites() {
                if CATALOGUE.composite(composite.name()) == Some(composite) {
                    continue;
                }
                let count = composite.spec.operands.len();
                let inputs: Vec<Input> = (0..count)
                    .map(|i| Input {
                        name: format!("in{i}"),
                        dtype: DType::F32,
                        shape: vec![2, 3],
                    })
                    .collect();
                let graph = Graph {
                    name: "probe".into(),
                    nodes: vec![Node {
                        name: "out".into(),
                        op: composite.name().to_string(),
                        args: inputs.iter().map(|i| i.name.clone()).collect(),
                        attrs: Default::default(),
                    }],
                    inputs,
                    outputs: vec!["out".into()],
                };
                if let Ok(expanded) = fusebox::graph::expand::expand(&graph, &catalogue) {
                    let values = random_inputs(&expanded, 1);
                    let _ = evaluate(&expanded, &catalogue, &values);
                }
            }
            for op in catalogue.ops() {
                if CATALOGUE.get(op.name()) == Some(op) {
                    continue;
                }
                let count = op.spec.operands.len().max(1);
                for shape in [vec![2, 3], vec![]] {
                    let inputs: Vec<Input> = (0..count)
                        .map(|i| Input {
                            name: format!("in{i}"),
                            dtype: DType::ALL[i % DType::ALL.len()],
                            shape: shape.clone(),
                        })
                        .collect();
                    let graph = Graph {
                        name: "probe".into(),
                        nodes: vec![Node {
                            name: "out".into(),
                            op: op.name().to_string(),
                            args: inputs.iter().map(|i| i.name.clone()).collect(),
                            attrs: Default::default(),
                        }],
                        inputs,
                        outputs: vec!["out".into()],
                    };
                    let values = random_inputs(&graph, 1);
                    let _ = evaluate(&graph, &catalogue, &values);
                }
            }
            Ok(())
        }
    }
}

fn formula_property(text: &str) -> Result<(), TestCaseError> {
    match formula::parse(text) {
        Err(e) => {
            prop_assert!(e.offset <= text.chars().count(), "{:?} for {:?}", e, text);
            prop_assert_eq!(e.column, e.offset + 1);
            let _ = e.to_string();
        }
        Ok(expr) => {
            let shown = expr.to_string();
            let again = formula::parse(&shown)
                .map_err(|e| TestCaseError::fail(format!("{shown:?} does not reparse: {e}")))?;
            prop_assert_eq!(again, expr, "{:?} printed as {:?}", text, shown);
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------- generators

/// Pieces of RON and graph syntax, glued together at random.
const RON_PIECES: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "\"",
    "'",
    "\\",
    "/",
    "*",
    "#",
    "!",
    " ",
    "\n",
    "\t",
    "\r",
    "0",
    "1",
    "-",
    ".",
    "e",
    "x",
    "r",
    "b",
    "u",
    "_",
    "é",
    "😀",
    "\u{0}",
    "Graph",
    "Input",
    "Node",
    "Op",
    "Attr",
    "name",
    "op",
    "args",
    "attrs",
    "inputs",
    "nodes",
    "outputs",
    "dtype",
    "shape",
    "kind",
    "operands",
    "formula",
    "builtin",
    "derivatives",
    "accepts",
    "variadic",
    "default",
    "optional",
    "ty",
    "Pointwise",
    "Layout",
    "Reduction",
    "Opaque",
    "Promote",
    "FloatPromote",
    "SameAs",
    "FromAttr",
    "Accumulate",
    "Bool",
    "Float",
    "Int",
    "Ints",
    "DType",
    "\"x\"",
    "\"f32\"",
    "\"sigmoid\"",
    "\"sum\"",
    "\"axes\"",
    "\"a + b\"",
    "Some(",
    "None",
    "true",
    "false",
    "1.5",
    "-1",
    "4294967296",
    "1e400",
    "NaN",
    "inf",
    "//",
    "/*",
    "*/",
    "r#\"",
    "\"#",
    "#![enable(implicit_some)]",
    "b\"",
    "'c'",
    "()",
    "[]",
    "{}",
    "\"\"",
];

fn ron_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            8 => prop::sample::select(RON_PIECES).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
        ],
        0..80,
    )
    .prop_map(|v| v.concat())
}

/// Replacement text for numbers.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "-1",
    "-2",
    "-3",
    "7",
    "65536",
    "2147483648",
    "4294967296",
    "4294967297",
    "9223372036854775807",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "1e400",
    "-0.0",
    "0.5",
    "1.5",
    "-2.5",
    "NaN",
    "inf",
    "-inf",
    "0x7fffffffffffffff",
    "0b101",
    "1_000_000",
    "1e-300",
    "+4",
];

/// Replacement text for string literals (besides other strings of the document).
const STRINGS: &[&str] = &[
    "\"\"",
    "\"x\"",
    "\"f8\"",
    "\"f32\"",
    "\"bool\"",
    "\"i64\"",
    "\"bf16\"",
    "\"sigmod\"",
    "\"a\\\"b\"",
    "\"\\u{0}\"",
    "\"é😀\"",
    "\"a\\nb\"",
    "r#\"raw\"#",
    "\"axes\"",
    "\"keepdim\"",
    "\"shape\"",
    "\"perm\"",
    "\"axis\"",
    "\"value\"",
    "\"x * k +\"",
    "\"select(x)\"",
    "\"y\"",
    "\"g\"",
];

/// Tokens inserted or substituted by token mutations.
const TOKENS: &[&str] = &[
    ",",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ":",
    "\"x\"",
    "\"f32\"",
    "Node",
    "Input",
    "Graph",
    "Op",
    "name",
    "op",
    "args",
    "attrs",
    "shape",
    "outputs",
    "inputs",
    "nodes",
    "Some(",
    "None",
    "true",
    "1.5",
    "-1",
    "0",
    "4294967296",
    "//",
    "/*",
    "r#\"a\"#",
    "'c'",
    "\n",
    "[]",
    "{}",
    "\"sigmoid\"",
    "\"keepdim\"",
    "\"axes\"",
    "Pointwise",
    "Reduction",
    "Float",
    "Ints",
    "Int(1)",
    "Float(1.0)",
    "Bool(true)",
    "DType(\"f16\")",
    "Promote([\"x\"])",
    "Bool",
    "\"x + 1\"",
    "\"(\"",
    "variadic: true",
    "optional: true",
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum TokKind {
    Str,
    Num,
    Word,
    Space,
    Punct,
}

/// A rough RON tokenizer: byte ranges of string literals, numbers, words, whitespace and
/// single punctuation chars. Good enough to aim mutations at whole tokens.
fn tokens(text: &str) -> Vec<(usize, usize, TokKind)> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |i: usize| chars.get(i).map_or(text.len(), |c| c.0);
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (start, c) = chars[i];
        let kind;
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i].1 != '"' {
                i += if chars[i].1 == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            kind = TokKind::Str;
        } else if c.is_ascii_digit()
            || (c == '-' && chars.get(i + 1).is_some_and(|n| n.1.is_ascii_digit()))
        {
            i += 1;
            while i < chars.len()
                && (chars[i].1.is_ascii_alphanumeric() || matches!(chars[i].1, '.' | '_'))
            {
                i += 1;
            }
            kind = TokKind::Num;
        } else if c.is_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].1.is_alphanumeric() || chars[i].1 == '_') {
                i += 1;
            }
            kind = TokKind::Word;
        } else if c.is_whitespace() {
            while i < chars.len() && chars[i].1.is_whitespace() {
                i += 1;
            }
            kind = TokKind::Space;
        } else {
            i += 1;
            kind = TokKind::Punct;
        }
        out.push((start, end_of(i), kind));
    }
    out
}

#[derive(Debug, Clone)]
enum Mutation {
    DeleteChar(Index),
    InsertChar(Index, char),
    ReplaceChar(Index, char),
    DeleteToken(Index),
    InsertToken(Index, &'static str),
    ReplaceToken(Index, &'static str),
    DuplicateLine(Index),
    SwapLines(Index, Index),
    DeleteLine(Index),
    Truncate(Index),
    ReplaceNumber(Index, &'static str),
    /// Replace a string literal with another string literal of the same document.
    SwapString(Index, Index),
    /// Replace a string literal with an op name of the default catalogue.
    OpName(Index, Index),
    /// Replace a string literal with a fixed one (dtypes, attribute names, odd escapes).
    ReplaceString(Index, &'static str),
}

fn char_mutation() -> impl Strategy<Value = Mutation> {
    let c = prop_oneof![
        4 => prop::sample::select(vec![
            '(', ')', '[', ']', '{', '}', ',', ':', '"', '\'', '\\', '/', '*', '#', '-', '.', '0',
            '9', 'e', 'x', ' ', '\n', 'é',
        ]),
        1 => any::<char>(),
    ];
    prop_oneof![
        (any::<Index>()).prop_map(Mutation::DeleteChar),
        (any::<Index>(), c.clone()).prop_map(|(i, c)| Mutation::InsertChar(i, c)),
        (any::<Index>(), c).prop_map(|(i, c)| Mutation::ReplaceChar(i, c)),
    ]
}

fn structured_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<Index>().prop_map(Mutation::DeleteToken),
        1 => (any::<Index>(), prop::sample::select(TOKENS)).prop_map(|(i, t)| Mutation::InsertToken(i, t)),
        1 => (any::<Index>(), prop::sample::select(TOKENS)).prop_map(|(i, t)| Mutation::ReplaceToken(i, t)),
        1 => any::<Index>().prop_map(Mutation::DuplicateLine),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        1 => any::<Index>().prop_map(Mutation::DeleteLine),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        3 => (any::<Index>(), prop::sample::select(NUMBERS)).prop_map(|(i, n)| Mutation::ReplaceNumber(i, n)),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::SwapString(a, b)),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::OpName(a, b)),
        2 => (any::<Index>(), prop::sample::select(STRINGS)).prop_map(|(i, s)| Mutation::ReplaceString(i, s)),
    ]
}

fn replace_range(text: &str, start: usize, end: usize, with: &str) -> String {
    format!("{}{with}{}", &text[..start], &text[end..])
}

/// Byte offset of the `index`-th char boundary (including the end).
fn boundary(text: &str, at: &Index) -> usize {
    let count = text.chars().count();
    let k = at.index(count + 1);
    text.char_indices().nth(k).map_or(text.len(), |(b, _)| b)
}

fn nth_token(text: &str, at: &Index, kind: Option<TokKind>) -> Option<(usize, usize)> {
    let toks: Vec<(usize, usize)> = tokens(text)
        .into_iter()
        .filter(|t| kind.is_none_or(|k| t.2 == k))
        .map(|t| (t.0, t.1))
        .collect();
    (!toks.is_empty()).then(|| toks[at.index(toks.len())])
}

fn apply(text: &str, m: &Mutation) -> String {
    match m {
        Mutation::DeleteChar(at) => {
            let start = boundary(text, at);
            let end = text[start..]
                .chars()
                .next()
                .map_or(start, |c| start + c.len_utf8());
            replace_range(text, start, end, "")
        }
        Mutation::InsertChar(at, c) => {
            let start = boundary(text, at);
            replace_range(text, start, start, &c.to_string())
        }
        Mutation::ReplaceChar(at, c) => {
            let start = boundary(text, at);
            let end = text[start..]
                .chars()
                .next()
                .map_or(start, |ch| start + ch.len_utf8());
            replace_range(text, start, end, &c.to_string())
        }
        Mutation::DeleteToken(at) => match nth_token(text, at, None) {
            Some((s, e)) => replace_range(text, s, e, ""),
            None => text.to_owned(),
        },
        Mutation::InsertToken(at, t) => match nth_token(text, at, None) {
            Some((s, _)) => replace_range(text, s, s, t),
            None => t.to_string(),
        },
        Mutation::ReplaceToken(at, t) => match nth_token(text, at, None) {
            Some((s, e)) => replace_range(text, s, e, t),
            None => t.to_string(),
        },
        Mutation::DuplicateLine(at) => {
            let mut l = whole_lines(text);
            if l.is_empty() {
                return text.to_owned();
            }
            let i = at.index(l.len());
            l.insert(i, l[i].clone());
            l.concat()
        }
        Mutation::SwapLines(a, b) => {
            let mut l = whole_lines(text);
            if l.is_empty() {
                return text.to_owned();
            }
            let (i, j) = (a.index(l.len()), b.index(l.len()));
            l.swap(i, j);
            l.concat()
        }
        Mutation::DeleteLine(at) => {
            let mut l: Vec<&str> = text.split_inclusive('\n').collect();
            if l.is_empty() {
                return text.to_owned();
            }
            l.remove(at.index(l.len()));
            l.concat()
        }
        Mutation::Truncate(at) => text[..boundary(text, at)].to_owned(),
        Mutation::ReplaceNumber(at, n) => match nth_token(text, at, Some(TokKind::Num)) {
            Some((s, e)) => replace_range(text, s, e, n),
            None => text.to_owned(),
        },
        Mutation::SwapString(at, other) => {
            match (
                nth_token(text, at, Some(TokKind::Str)),
                nth_token(text, other, Some(TokKind::Str)),
            ) {
                (Some((s, e)), Some((os, oe))) => replace_range(text, s, e, &text[os..oe]),
                _ => text.to_owned(),
            }
        }
        Mutation::OpName(at, op) => match nth_token(text, at, Some(TokKind::Str)) {
            Some((s, e)) => {
                let names: Vec<&str> = CATALOGUE.names().collect();
                let name = names[op.index(names.len())];
                replace_range(text, s, e, &format!("\"{name}\""))
            }
            None => text.to_owned(),
        },
        Mutation::ReplaceString(at, with) => match nth_token(text, at, Some(TokKind::Str)) {
            Some((s, e)) => replace_range(text, s, e, with),
            None => text.to_owned(),
        },
    }
}

/// The lines of `text`, each with its newline (one is added to a last line without).
fn whole_lines(text: &str) -> Vec<String> {
    text.split_inclusive('\n')
        .map(|l| {
            if l.ends_with('\n') {
                l.to_owned()
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    mutations.iter().fold(text.to_owned(), |t, m| apply(&t, m))
}

fn graph_doc() -> impl Strategy<Value = &'static str> {
    prop::sample::select(GRAPHS.to_vec())
}

/// A deterministic generator driven by one proptest seed (splitmix64).
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A random graph over the default catalogue: mostly well-typed (random ops applied to earlier
/// values, attributes of the declared types), sometimes not.
fn random_graph(seed: u64) -> String {
    use fusebox::attr::AttrType;
    let mut d = Dice(seed);
    let dims = [0usize, 1, 1, 2, 2, 3, 4];
    let mut names: Vec<String> = Vec::new();
    let mut out = String::from("Graph(\n    name: \"random\",\n    inputs: [\n");
    for i in 0..1 + d.below(3) {
        let rank = d.below(4);
        let shape: Vec<usize> = (0..rank).map(|_| *d.pick(&dims)).collect();
        let dtype = if d.chance(3) {
            DType::F32
        } else {
            *d.pick(&DType::ALL)
        };
        let name = format!("in{i}");
        out += &format!(
            "        Input(name: \"{name}\", dtype: \"{}\", shape: {shape:?}),\n",
            dtype.name()
        );
        names.push(name);
    }
    out += "    ],\n    nodes: [\n";
    let ops: Vec<_> = CATALOGUE.ops().collect();
    let small_ints = [-3i64, -2, -1, 0, 0, 1, 1, 2, 3];
    let any_int = |d: &mut Dice| {
        if d.chance(40) {
            *d.pick(&[i64::MIN, i64::MAX, 1 << 32, -(1 << 32)])
        } else {
            *d.pick(&small_ints)
        }
    };
    for i in 0..1 + d.below(8) {
        let op = *d.pick(&ops);
        let arity = if op.spec.variadic {
            1 + d.below(3)
        } else if d.chance(20) {
            d.below(4)
        } else {
            op.spec.operands.len()
        };
        let args: Vec<String> = (0..arity)
            .map(|_| {
                if d.chance(30) {
                    "\"nowhere\"".to_string()
                } else {
                    format!("\"{}\"", d.pick(&names))
                }
            })
            .collect();
        let mut attrs = Vec::new();
        for spec in &op.spec.attrs {
            let required = spec.default.is_none() && !spec.optional;
            if !required && d.chance(2) {
                continue;
            }
            let ty = if d.chance(25) {
                *d.pick(&[
                    AttrType::Float,
                    AttrType::Int,
                    AttrType::Ints,
                    AttrType::Bool,
                ])
            } else {
                spec.ty
            };
            let value = match ty {
                AttrType::Float => d
                    .pick(&[
                        "0.0", "1.5", "-2", "1e-3", "inf", "-inf", "NaN", "3", "1e308", "-7e-310",
                    ])
                    .to_string(),
                AttrType::Int => any_int(&mut d).to_string(),
                AttrType::Bool => d.pick(&["true", "false"]).to_string(),
                AttrType::Ints => {
                    let n = d.below(4);
                    let v: Vec<i64> = (0..n).map(|_| any_int(&mut d)).collect();
                    format!("{v:?}")
                }
                AttrType::DType => format!("\"{}\"", d.pick(&DType::ALL).name()),
            };
            attrs.push(format!("\"{}\": {value}", spec.name));
        }
        let name = format!("n{i}");
        out += &format!(
            "        Node(name: \"{name}\", op: \"{}\", args: [{}], attrs: {{{}}}),\n",
            op.name(),
            args.join(", "),
            attrs.join(", ")
        );
        names.push(name);
    }
    let outputs: Vec<String> = (0..1 + d.below(2))
        .map(|k| format!("\"{}\"", names[names.len() - 1 - k.min(names.len() - 1)]))
        .collect();
    let mut outputs = outputs;
    outputs.dedup();
    out += &format!("    ],\n    outputs: [{}],\n)\n", outputs.join(", "));
    out
}

/// Every formula and derivative of the default catalogue.
static FORMULAS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut out = Vec::new();
    for op in CATALOGUE.ops() {
        out.extend(op.spec.formula.clone());
        out.extend(op.spec.derivatives.values().cloned());
    }
    out
});

fn formula_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            8 => prop::sample::select(vec![
                "x", "y", "g", "a", "b", "_1", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt",
                "tanh", "erf", "abs", "floor", "sin", "cos", "min", "max", "pow", "select",
                "sqr", "(", ")", ",", "+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "=",
                "!", " ", "0", "1", "2.5", ".5", "1e", "1e+", "1e-3", "1e400", "9".repeat(400).leak(),
                "0.000", "é", "\t", "\n",
            ]).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
        ],
        0..40,
    )
    .prop_map(|v| v.concat())
}

fn nested_formula() -> impl Strategy<Value = String> {
    (
        0usize..400,
        prop::sample::select(vec!["(", "-", "exp(", "-(", "pow(x, ", "select(x, 1, "]),
        0usize..400,
        prop::sample::select(vec![" + x", " * 2", " < y"]),
    )
        .prop_map(|(depth, open, chain, link)| {
            let close = if open.contains('(') { ")" } else { "" };
            format!(
                "{}x{}{}",
                open.repeat(depth),
                link.repeat(chain),
                close.repeat(depth)
            )
        })
}

/// Deeply nested or unbalanced brackets inside an otherwise plausible document.
fn deep_nesting(prefix: &'static str) -> impl Strategy<Value = String> {
    (
        0usize..3000,
        prop::sample::select(vec![
            "[", "(", "{", "Some(", "Node(", "{\"a\": ", "[\"x\", ",
        ]),
        0usize..3000,
        prop::sample::select(vec!["]", ")", "}", ""]),
    )
        .prop_map(move |(open_n, open, close_n, close)| {
            format!("{prefix}{}1{}", open.repeat(open_n), close.repeat(close_n))
        })
}

// ------------------------------------------------------------------------------- graph loader

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn graph_loader_random_text(text in ron_soup()) {
        graph_property(&text)?;
    }

    #[test]
    fn graph_loader_char_mutations(
        doc in graph_doc(),
        mutations in prop::collection::vec(char_mutation(), 1..5),
    ) {
        graph_property(&mutate(doc, &mutations))?;
    }

    #[test]
    fn graph_loader_structured_mutations(
        doc in graph_doc(),
        mutations in prop::collection::vec(structured_mutation(), 1..4),
    ) {
        graph_property(&mutate(doc, &mutations))?;
    }

    #[test]
    fn graph_loader_deep_nesting(text in deep_nesting("Graph(name: \"g\", outputs: [\"x\"], nodes: ")) {
        graph_property(&text)?;
    }

    #[test]
    fn graph_loader_random_graphs(
        seed in any::<u64>(),
        mutations in prop::collection::vec(structured_mutation(), 0..2),
    ) {
        let text = random_graph(seed);
        graph_property(&text)?;
        graph_property(&mutate(&text, &mutations))?;
    }
}

// ------------------------------------------------------------------------------- ops loader

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn ops_loader_random_text(text in ron_soup()) {
        ops_property(&text)?;
    }

    #[test]
    fn ops_loader_char_mutations(mutations in prop::collection::vec(char_mutation(), 1..4)) {
        ops_property(&mutate(OPS, &mutations))?;
    }

    #[test]
    fn ops_loader_structured_mutations(
        mutations in prop::collection::vec(structured_mutation(), 1..3),
    ) {
        ops_property(&mutate(OPS, &mutations))?;
    }

    #[test]
    fn ops_loader_deep_nesting(text in deep_nesting("[Op(name: \"o\", kind: Pointwise, attrs: ")) {
        ops_property(&text)?;
    }

    #[test]
    fn ops_loader_small_documents(
        doc in prop::sample::select(OPS_DOCS.to_vec()),
        chars in prop::collection::vec(char_mutation(), 0..2),
        structured in prop::collection::vec(structured_mutation(), 0..3),
    ) {
        ops_property(&mutate(&mutate(doc, &chars), &structured))?;
    }
}

// ------------------------------------------------------------------------------- formulas

proptest! {
    #![proptest_config(config(8000))]

    #[test]
    fn formula_parser_random_text(text in formula_soup()) {
        formula_property(&text)?;
    }

    #[test]
    fn formula_parser_mutated_formulas(
        pick in any::<Index>(),
        mutations in prop::collection::vec(
            prop_oneof![char_mutation(), structured_mutation()],
            1..4,
        ),
    ) {
        let formula = &FORMULAS[pick.index(FORMULAS.len())];
        formula_property(&mutate(formula, &mutations))?;
    }
}

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn formula_parser_deep_and_long(text in nested_formula()) {
        formula_property(&text)?;
    }
}

// ------------------------------------------------------------------------------- sanity

#[test]
fn embedded_documents_are_valid() {
    for text in GRAPHS {
        let (graph, _) = parse(text, "g.ron", &CATALOGUE).unwrap_or_else(|e| panic!("{e}"));
        assert!(!graph.nodes.is_empty());
    }
    for text in OPS_DOCS {
        let mut catalogue = CATALOGUE.clone();
        catalogue
            .load_str(text, "ops.ron")
            .unwrap_or_else(|e| panic!("{e}"));
        let added = catalogue.len() + catalogue.composites().count();
        assert!(added > CATALOGUE.len() + CATALOGUE.composites().count());
    }
    assert!(FORMULAS.len() > 43);
}

#[test]
fn tokenizer_finds_numbers_and_strings() {
    let text = "A(x: \"a\", y: [1, 2])\nB\n";
    assert_eq!(
        tokens(text)
            .iter()
            .filter(|t| t.2 == TokKind::Num)
            .map(|t| &text[t.0..t.1])
            .collect::<Vec<_>>(),
        ["1", "2"]
    );
    assert_eq!(
        tokens(text)
            .iter()
            .filter(|t| t.2 == TokKind::Str)
            .map(|t| &text[t.0..t.1])
            .collect::<Vec<_>>(),
        ["\"a\""]
    );
}

// ------------------------------------------------------------------------------- regressions
// Panics the properties above found, kept as plain tests.

#[test]
fn slice_with_a_huge_step_takes_one_element() {
    // `(end - start + step - 1) / step` overflowed for step = i64::MAX.
    let text = r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [4])],
    nodes: [
        Node(name: "s", op: "slice", args: ["x"], attrs: {"start": 1, "step": 9223372036854775807}),
    ],
    outputs: ["s"],
)
"#;
    let (graph, types) = parse(text, "g.ron", &CATALOGUE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(types["s"].shape, vec![1]);
    let x = Tensor::from_values(DType::F32, &[4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let out = evaluate(&graph, &CATALOGUE, &[("x".to_string(), x)].into()).unwrap();
    assert_eq!(out["s"].values(), vec![2.0]);
}

#[test]
fn slice_default_step_from_an_ops_file_may_be_huge() {
    let mut catalogue = CATALOGUE.clone();
    catalogue
        .load_str(
            r#"[
    Op(name: "first", kind: Layout, builtin: "slice", operands: ["x"], dtype: SameAs("x"),
       attrs: [Attr(name: "axis", ty: Int, default: Int(0)), Attr(name: "start", ty: Int, default: Int(0)),
               Attr(name: "end", ty: Int, optional: true),
               Attr(name: "step", ty: Int, default: Int(9223372036854775807))]),
]
"#,
            "ops.ron",
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let text = r#"Graph(name: "g", inputs: [Input(name: "x", dtype: "i32", shape: [3, 2])],
    nodes: [Node(name: "f", op: "first", args: ["x"])], outputs: ["f"])"#;
    let (_, types) = parse(text, "g.ron", &catalogue).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(types["f"].shape, vec![1, 2]);
}

#[test]
fn slice_range_of_an_unindexable_dim_is_an_error() {
    // `shape[axis] as i64` turned 2^64-1 into -1, and `clamp(0, -1)` panicked.
    assert!(fusebox::shape::slice_range(&[usize::MAX], 0, 0, None, 1).is_err());
}

#[test]
fn empty_input_with_an_unrepresentable_dim_is_a_shape_error() {
    // [0, 2^64-1] holds no elements, so the checker accepted it, but no array of that shape can
    // exist and `Tensor::random` (as used by `fusebox run --random-inputs`) panicked.
    let text = r#"Graph(
    name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [0, 18446744073709551615])],
    nodes: [],
    outputs: ["x"],
)
"#;
    let e = parse(text, "g.ron", &CATALOGUE).unwrap_err();
    assert!(matches!(e.kind, fusebox::ErrorKind::Shape(_)), "{e}");
    assert_eq!(
        e.site.position,
        Some(fusebox::span::Position {
            line: 3,
            column: 52
        })
    );
    assert_eq!(e.site.node.as_deref(), Some("x"));
    assert_eq!(checked_numel(&[0, usize::MAX]), None);
    assert_eq!(checked_numel(&[0, 5]), Some(0));
    assert_eq!(checked_numel(&[2, 3]), Some(6));
}

#[test]
fn concat_whose_length_overflows_is_a_shape_error() {
    // Summing the concatenated dims overflowed.
    let text = r#"Graph(
    name: "g",
    inputs: [Input(name: "a", dtype: "f32", shape: [9223372036854775807])],
    nodes: [
        Node(name: "c", op: "concat", args: ["a", "a", "a"]),
    ],
    outputs: ["c"],
)
"#;
    let e = parse(text, "g.ron", &CATALOGUE).unwrap_err();
    assert!(
        matches!(&e.kind, fusebox::ErrorKind::Shape(m) if m.contains("too long")),
        "{e}"
    );
    assert_eq!(
        e.site.position,
        Some(fusebox::span::Position {
            line: 5,
            column: 29
        })
    );
}

// ------------------------------------------------------------------------------- ONNX importer

mod onnx_models {
    //! Small valid models, built here as protobuf messages: the seeds the mutations start from.

    use onnx_protobuf::{
        AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
        StringStringEntryProto, TensorProto, ValueInfoProto,
    };

    pub fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
        crate::common::onnx_models::value_info(name, 1, Some(dims))
    }

    fn node(op: &str, inputs: &[&str], output: &str, attrs: Vec<AttributeProto>) -> NodeProto {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = format!("{op}_node");
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = vec![output.into()];
        n.attribute = attrs;
        n
    }

    fn int_attr(name: &str, value: i64) -> AttributeProto {
        let mut a = AttributeProto::new();
        a.name = name.into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
        a.i = value;
        a
    }

    fn string_attr(name: &str, value: &str) -> AttributeProto {
        let mut a = AttributeProto::new();
        a.name = name.into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::STRING.into();
        a.s = value.as_bytes().to_vec();
        a
    }

    fn float_attr(name: &str, value: f32) -> AttributeProto {
        let mut a = AttributeProto::new();
        a.name = name.into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::FLOAT.into();
        a.f = value;
        a
    }

    pub fn weights(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = 1;
        t.dims = dims.to_vec();
        t.raw_data = values.iter().flat_map(|f| f.to_le_bytes()).collect();
        t
    }

    pub fn external(location: &str, offset: &str, length: &str) -> TensorProto {
        let mut t = weights("w", &[4], &[]);
        t.data_location = onnx_protobuf::tensor_proto::DataLocation::EXTERNAL.into();
        for (k, v) in [
            ("location", location),
            ("offset", offset),
            ("length", length),
        ] {
            let mut e = StringStringEntryProto::new();
            e.key = k.into();
            e.value = v.into();
            t.external_data.push(e);
        }
        t
    }

    pub fn model(
        inputs: Vec<ValueInfoProto>,
        output: ValueInfoProto,
        initializers: Vec<TensorProto>,
        nodes: Vec<NodeProto>,
    ) -> ModelProto {
        let mut graph = GraphProto::new();
        graph.name = "m".into();
        graph.input = inputs;
        graph.output.push(output);
        graph.initializer = initializers;
        graph.node = nodes;
        let mut model = ModelProto::new();
        model.ir_version = 8;
        let mut opset = OperatorSetIdProto::new();
        opset.version = 17;
        model.opset_import.push(opset);
        model.graph = Some(graph).into();
        model
    }

    /// y = x + w, with w external (`w.bin` beside the model) when `external_w` is set.
    pub fn add(w: TensorProto) -> ModelProto {
        model(
            vec![value_info("x", &[4])],
            value_info("y", &[4]),
            vec![w],
            vec![node("Add", &["x", "w"], "y", vec![])],
        )
    }

    /// Gemm (transposed B, alpha), then LayerNormalization, Softmax, LeakyRelu and a
    /// ReduceMin: the composite ops and their attributes.
    pub fn block() -> ModelProto {
        let ones = [1.0f32; 8];
        model(
            vec![value_info("x", &[2, 4])],
            value_info("y", &[2]),
            vec![
                weights("b", &[4, 4], &[0.5; 16]),
                weights("scale", &[4], &ones[..4]),
                weights("bias", &[4], &[0.1; 4]),
            ],
            vec![
                node(
                    "Gemm",
                    &["x", "b"],
                    "g",
                    vec![int_attr("transB", 1), float_attr("alpha", 0.5)],
                ),
                node(
                    "LayerNormalization",
                    &["g", "scale", "bias"],
                    "n",
                    vec![int_attr("axis", -1), float_attr("epsilon", 1e-3)],
                ),
                node("Softmax", &["n"], "s", vec![int_attr("axis", 1)]),
                node("LeakyRelu", &["s"], "l", vec![float_attr("alpha", 0.2)]),
                node(
                    "ReduceMin",
                    &["l"],
                    "y",
                    vec![int_attr("axes", 1), int_attr("keepdims", 0)],
                ),
            ],
        )
    }

    fn ints_attr(name: &str, values: &[i64]) -> AttributeProto {
        let mut a = AttributeProto::new();
        a.name = name.into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::INTS.into();
        a.ints = values.to_vec();
        a
    }

    /// Pad, Conv (padded, strided, grouped), BatchNormalization, MaxPool (ceil mode) and
    /// InstanceNormalization: the window ops and the normalizations, whose attributes size
    /// what the importer writes out.
    pub fn convnet() -> ModelProto {
        let pads = {
            let mut t = TensorProto::new();
            t.name = "pads".into();
            t.data_type = 7;
            t.dims = vec![8];
            t.raw_data = [0i64, 0, 1, 0, 0, 0, 0, 1]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            t
        };
        model(
            vec![value_info("x", &[1, 2, 6, 6])],
            value_info("y", &[1, 4, 3, 3]),
            vec![
                pads,
                weights("w", &[4, 1, 3, 3], &[0.25; 36]),
                weights("c", &[4], &[0.5, 1.0, 1.5, 2.0]),
            ],
            vec![
                node("Pad", &["x", "pads"], "p", vec![]),
                node(
                    "Conv",
                    &["p", "w", "c"],
                    "v",
                    vec![
                        int_attr("group", 2),
                        ints_attr("pads", &[1, 1, 1, 1]),
                        ints_attr("strides", &[1, 1]),
                    ],
                ),
                node(
                    "BatchNormalization",
                    &["v", "c", "c", "c", "c"],
                    "b",
                    vec![float_attr("epsilon", 1e-3)],
                ),
                node(
                    "MaxPool",
                    &["b"],
                    "m",
                    vec![
                        ints_attr("kernel_shape", &[2, 2]),
                        ints_attr("strides", &[2, 2]),
                        int_attr("ceil_mode", 1),
                    ],
                ),
                node("InstanceNormalization", &["m", "c", "c"], "y", vec![]),
            ],
        )
    }

    /// ConvTranspose (strided, padded, grouped, with output_padding) and Resize (linear, by
    /// scales; nearest, by sizes): a decoder, whose attributes and constant inputs size the
    /// spread input, the padding and the gathers the importer writes out.
    pub fn decoder() -> ModelProto {
        let constant = |name: &str, data_type: i32, raw: Vec<u8>| {
            let mut t = TensorProto::new();
            t.name = name.into();
            t.data_type = data_type;
            t.dims = vec![4];
            t.raw_data = raw;
            t
        };
        let scales = [1.0f32, 1.0, 1.5, 2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let sizes = [1i64, 2, 9, 7]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut linear = node("Resize", &["u", "", "scales"], "r", vec![]);
        linear.attribute.push(string_attr("mode", "linear"));
        let mut nearest = node("Resize", &["r", "", "", "sizes"], "y", vec![]);
        nearest
            .attribute
            .push(string_attr("coordinate_transformation_mode", "asymmetric"));
        model(
            vec![value_info("x", &[1, 4, 3, 3])],
            value_info("y", &[1, 2, 9, 7]),
            vec![
                weights("w", &[4, 1, 3, 3], &[0.25; 36]),
                constant("scales", 1, scales),
                constant("sizes", 7, sizes),
            ],
            vec![
                node(
                    "ConvTranspose",
                    &["x", "w"],
                    "u",
                    vec![
                        int_attr("group", 2),
                        ints_attr("strides", &[2, 2]),
                        ints_attr("pads", &[1, 0, 1, 1]),
                        ints_attr("output_padding", &[1, 0]),
                    ],
                ),
                linear,
                nearest,
            ],
        )
    }

    pub fn bytes(model: &ModelProto) -> Vec<u8> {
        model.write_to_bytes().expect("a built model serializes")
    }
}

/// The seeds: a plain model, an external-data one, one with the composite ops, one with the
/// window ops and normalizations, and a decoder of transposed convolutions and resizes.
static ONNX_SEEDS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    use onnx_models::*;
    vec![
        bytes(&add(weights("w", &[4], &[1.0, 2.0, 3.0, 4.0]))),
        bytes(&add(external("w.bin", "0", "16"))),
        bytes(&block()),
        bytes(&convnet()),
        bytes(&decoder()),
    ]
});

/// A directory per test thread holding `w.bin` (16 bytes of weights) and, beside it,
/// `secret.bin`, which no model may read.
fn onnx_dir() -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!(
        "fusebox-fuzz-onnx-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let dir = root.join("model");
    if !dir.join("w.bin").exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        std::fs::write(dir.join("w.bin"), &w).unwrap();
        std::fs::write(root.join("secret.bin"), &w).unwrap();
    }
    dir
}

/// Imports `bytes` as `model.onnx`: an error must name the model file and carry a message; a
/// model that imports must type-check, and no external value may come from outside the
/// model's directory (`secret.bin` holds the same bytes as `w.bin`, so only a path check can
/// tell; a model importing `w` from an escaping path would pass unnoticed here, which the
/// hostile-path strategy below rules out by construction).
fn onnx_property(bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = onnx_dir();
    let path = dir.join("model.onnx");
    std::fs::write(&path, bytes).unwrap();
    match fusebox::onnx::import(&path, &CATALOGUE, &ONNX_TABLE) {
        Err(e) => {
            let shown = e.to_string();
            let file = path.display().to_string();
            prop_assert_eq!(e.site.file.as_deref(), Some(file.as_str()), "{}", shown);
            prop_assert!(shown.len() > file.len() + 2, "{}", shown);
            prop_assert!(!shown.contains("panicked"), "{}", shown);
            Ok(())
        }
        Ok(imported) => {
            let types = fusebox::graph::check(&imported.graph, &CATALOGUE).map_err(|e| {
                TestCaseError::fail(format!("an imported graph fails its check: {e}"))
            })?;
            prop_assert_eq!(
                types.len(),
                imported.graph.inputs.len() + imported.graph.nodes.len()
            );
            Ok(())
        }
    }
}

/// A byte-level change to a protobuf message.
#[derive(Debug, Clone)]
enum ByteMutation {
    Flip(Index, u8),
    Truncate(Index),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    /// A varint of the largest sizes at a random place: a length or dimension that lies.
    HugeVarint(Index, u64),
}

fn byte_mutation() -> impl Strategy<Value = ByteMutation> {
    prop_oneof![
        4 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| ByteMutation::Flip(i, b)),
        1 => any::<Index>().prop_map(ByteMutation::Truncate),
        2 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| ByteMutation::Insert(i, b)),
        1 => (any::<Index>(), 1usize..16).prop_map(|(i, n)| ByteMutation::Delete(i, n)),
        2 => (
            any::<Index>(),
            prop::sample::select(vec![u64::MAX, i64::MAX as u64, 1 << 40, 1 << 31, 0x7fff_ffff])
        )
            .prop_map(|(i, v)| ByteMutation::HugeVarint(i, v)),
    ]
}

fn mutate_bytes(mut bytes: Vec<u8>, mutations: &[ByteMutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        match m {
            ByteMutation::Flip(i, b) => {
                let at = i.index(bytes.len());
                bytes[at] ^= b | 1;
            }
            ByteMutation::Truncate(i) => bytes.truncate(i.index(bytes.len())),
            ByteMutation::Insert(i, new) => {
                let at = i.index(bytes.len() + 1);
                bytes.splice(at..at, new.iter().copied());
            }
            ByteMutation::Delete(i, n) => {
                let at = i.index(bytes.len());
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
            ByteMutation::HugeVarint(i, v) => {
                let at = i.index(bytes.len());
                let mut varint = Vec::new();
                let mut v = *v;
                while v >= 0x80 {
                    varint.push((v as u8) | 0x80);
                    v >>= 7;
                }
                varint.push(v as u8);
                let end = (at + varint.len()).min(bytes.len());
                bytes.splice(at..end, varint);
            }
        }
    }
    bytes
}

/// An external-data location assembled from escaping pieces.
fn hostile_location() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "..",
            "../",
            "/",
            "//",
            "./",
            "secret.bin",
            "w.bin",
            "model",
            "/etc/passwd",
            "\\..\\",
            "%2e%2e/",
            "\u{0}",
            "C:\\",
            "~",
            "w.bin/..",
            "../model/w.bin",
            "/proc/self/mem",
            "a/../../secret.bin",
        ]),
        1..5,
    )
    .prop_map(|parts| parts.concat())
}

fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..64).prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "-1",
            "-16",
            "18446744073709551615",
            "18446744073709551616",
            "9223372036854775807",
            "1e3",
            "",
            " 16",
            "0x10",
            "16 ",
        ])
        .prop_map(String::from),
    ]
}

proptest! {
    #![proptest_config(config(700))]

    #[test]
    fn onnx_importer_mutated_bytes(
        seed in 0..ONNX_SEEDS.len(),
        mutations in prop::collection::vec(byte_mutation(), 1..4),
    ) {
        onnx_property(&mutate_bytes(ONNX_SEEDS[seed].clone(), &mutations))?;
    }

    #[test]
    fn onnx_importer_truncated_bytes(seed in 0..ONNX_SEEDS.len(), cut in any::<Index>()) {
        let bytes = &ONNX_SEEDS[seed];
        onnx_property(&bytes[..cut.index(bytes.len())])?;
    }

    #[test]
    fn onnx_importer_hostile_external_paths(
        location in hostile_location(),
        offset in number_text(),
        length in number_text(),
    ) {
        use onnx_models::*;
        let escapes = location.contains("..") || location.starts_with('/')
            || location.contains(':') || location.starts_with('~') || location.contains('\u{0}');
        let bytes = bytes(&add(external(&location, &offset, &length)));
        let dir = onnx_dir();
        let path = dir.join("model.onnx");
        std::fs::write(&path, &bytes).unwrap();
        let result = fusebox::onnx::import(&path, &CATALOGUE, &ONNX_TABLE);
        if escapes {
            // A path that leaves the model's directory (or names a device) is never read.
            prop_assert!(result.is_err(), "{:?} was read", location);
        }
        onnx_property(&bytes)?;
    }

    #[test]
    fn onnx_importer_huge_declared_dimensions(
        dims in prop::collection::vec(
            prop::sample::select(vec![0i64, 1, 4, -1, i64::MAX, i64::MIN, 1 << 40, 1 << 62]),
            1..4,
        ),
    ) {
        use onnx_models::*;
        let model = model(
            vec![value_info("x", &dims)],
            value_info("y", &dims),
            vec![weights("w", &dims, &[1.0, 2.0])],
            vec![],
        );
        let mut model = model;
        if let Some(graph) = model.graph.as_mut() {
            let mut n = onnx_protobuf::NodeProto::new();
            n.op_type = "Add".into();
            n.input = vec!["x".into(), "w".into()];
            n.output = vec!["y".into()];
            graph.node.push(n);
        }
        onnx_property(&bytes(&model))?;
    }
}

/// Found by the byte fuzzer in CI: a pad of `i64::MIN` has no absolute value in `i64`.
#[test]
fn onnx_pads_of_the_most_negative_integer_are_refused() {
    let mut model = onnx_models::convnet();
    let graph = model.graph.as_mut().unwrap();
    let pads = graph
        .initializer
        .iter_mut()
        .find(|t| t.name == "pads")
        .unwrap();
    pads.raw_data = [0i64, 0, i64::MIN, 0, 0, 0, 0, 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bytes = onnx_models::bytes(&model);
    onnx_property(&bytes).unwrap();
    let path = onnx_dir().join("model.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let e = fusebox::onnx::import(&path, &CATALOGUE, &ONNX_TABLE).unwrap_err();
    assert!(e.to_string().contains("pads"), "{e}");
}

#[test]
fn onnx_seeds_import() {
    for (k, bytes) in ONNX_SEEDS.iter().enumerate() {
        let dir = onnx_dir();
        let path = dir.join("model.onnx");
        std::fs::write(&path, bytes).unwrap();
        let imported = fusebox::onnx::import(&path, &CATALOGUE, &ONNX_TABLE)
            .unwrap_or_else(|e| panic!("seed {k} must import: {e}"));
        assert!(!imported.graph.nodes.is_empty(), "seed {k}");
    }
}

// --------------------------------------------------------------- ATen graphs (torch backend)

/// A part as the torch backend sends it: a layer norm, a product with a constant, a masked
/// softmax and a split, with numbers, lists, `-inf` and dtypes among the arguments.
const ATEN_PART: &str = r#"{"name": "fused_0",
 "inputs": [{"name": "x", "dtype": "f32", "shape": [2, 4, 8]}, {"name": "w", "dtype": "f32", "shape": [8]}],
 "constants": [{"name": "m", "dtype": "bool", "shape": [4, 4]}],
 "nodes": [
  {"name": "ln", "target": "aten.native_layer_norm.default",
   "args": {"input": {"ref": "x"}, "normalized_shape": [8], "weight": {"ref": "w"}, "bias": null, "eps": 1e-05},
   "outputs": [{"dtype": "f32", "shape": [2, 4, 8]}, {"dtype": "f32", "shape": [2, 4, 1]}, {"dtype": "f32", "shape": [2, 4, 1]}], "used": [0]},
  {"name": "t", "target": "aten.permute.default", "args": {"self": {"ref": "ln"}, "dims": [0, 2, 1]},
   "outputs": [{"dtype": "f32", "shape": [2, 8, 4]}]},
  {"name": "s", "target": "aten.bmm.default", "args": {"self": {"ref": "ln"}, "mat2": {"ref": "t"}},
   "outputs": [{"dtype": "f32", "shape": [2, 4, 4]}]},
  {"name": "f", "target": "aten.masked_fill.Scalar", "args": {"self": {"ref": "s"}, "mask": {"ref": "m"}, "value": {"float": "-inf"}},
   "outputs": [{"dtype": "f32", "shape": [2, 4, 4]}]},
  {"name": "p", "target": "aten._softmax.default", "args": {"self": {"ref": "f"}, "dim": -1, "half_to_float": false},
   "outputs": [{"dtype": "f32", "shape": [2, 4, 4]}]},
  {"name": "c", "target": "aten._to_copy.default", "args": {"self": {"ref": "p"}, "dtype": {"dtype": "bf16"}},
   "outputs": [{"dtype": "bf16", "shape": [2, 4, 4]}]},
  {"name": "sp", "target": "aten.split_with_sizes.default", "args": {"self": {"ref": "c"}, "split_sizes": [1, 3], "dim": 2},
   "outputs": [{"dtype": "bf16", "shape": [2, 4, 1]}, {"dtype": "bf16", "shape": [2, 4, 3]}]}
 ],
 "outputs": [{"ref": "sp", "index": 1}, {"ref": "p"}]}"#;

/// A mutated part is imported or refused with an error, never a panic; whatever imports has
/// the outputs' traced types (the importer checks them) and passes the graph checker.
fn aten_property(text: &str) -> Result<(), TestCaseError> {
    let rules = RuleSet::defaults();
    let Ok(graph) = fusebox::aten::fx::parse(text, "part.json") else {
        return Ok(());
    };
    let verdicts = fusebox::aten::supported(&graph, &rules);
    // One verdict per node name (a mutation may name two nodes alike).
    let names: std::collections::BTreeSet<&str> =
        graph.nodes.iter().map(|n| n.name.as_str()).collect();
    prop_assert!(
        verdicts
            .keys()
            .map(String::as_str)
            .eq(names.iter().copied())
    );
    let constants = std::collections::BTreeMap::from([("m".to_string(), vec![1u8; 16])]);
    if let Ok(imported) = fusebox::aten::import(&graph, &constants, &rules) {
        let checked = fusebox::graph::check(&imported.graph, &rules.ops);
        prop_assert!(checked.is_ok(), "{:?}", checked.err());
    }
    Ok(())
}

/// Found by the structured fuzzer in CI: a part that reads output `usize::MAX` of a node.
#[test]
fn aten_parts_reading_the_largest_output_index_are_refused() {
    let text = ATEN_PART.replace("\"used\": [0]", "\"used\": [18446744073709551615]");
    assert_ne!(text, ATEN_PART);
    aten_property(&text).unwrap();
    let graph = fusebox::aten::fx::parse(&text, "part.json").unwrap();
    let constants = std::collections::BTreeMap::from([("m".to_string(), vec![1u8; 16])]);
    let e = fusebox::aten::import(&graph, &constants, &RuleSet::defaults()).unwrap_err();
    assert!(e.to_string().contains("reads output"), "{e}");
}

#[test]
fn aten_parts_the_original_imports() {
    let graph = fusebox::aten::fx::parse(ATEN_PART, "part.json").unwrap();
    let constants = std::collections::BTreeMap::from([("m".to_string(), vec![1u8; 16])]);
    if let Err(e) = fusebox::aten::import(&graph, &constants, &RuleSet::defaults()) {
        panic!("{e}");
    }
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn aten_parts_char_mutations(mutations in prop::collection::vec(char_mutation(), 1..4)) {
        aten_property(&mutate(ATEN_PART, &mutations))?;
    }

    #[test]
    fn aten_parts_structured_mutations(mutations in prop::collection::vec(structured_mutation(), 1..4)) {
        aten_property(&mutate(ATEN_PART, &mutations))?;
    }
}
