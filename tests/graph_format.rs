//! The graph file format is a user contract: the issue's exact example loads with the types
//! worked out by hand, and load → save → load round-trips exactly.

use fusebox::attr::AttrValue;
use fusebox::dtype::DType;
use fusebox::graph::{GraphBuilder, check, file};
use fusebox::rules::Catalogue;

const CONTRACT: &str = r#"
Graph(
    name: "example",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [64, 512]),
        Input(name: "s", dtype: "f32", shape: []),
    ],
    nodes: [
        Node(name: "i", op: "sigmoid", args: ["x"]),
        Node(name: "one", op: "const", attrs: {"value": 1.0, "dtype": "f32"}),
        Node(name: "t", op: "sub", args: ["one", "i"]),
        Node(name: "m", op: "mean", args: ["t"], attrs: {"axes": [1], "keepdim": true}),
        Node(name: "h", op: "cast", args: ["t"], attrs: {"dtype": "f16"}),
    ],
    outputs: ["t", "m", "h"],
)
"#;

#[test]
fn the_contract_example_loads_with_the_expected_types() {
    let catalogue = Catalogue::defaults();
    let (graph, types) = file::parse(CONTRACT, "contract.ron", &catalogue).unwrap();
    assert_eq!(graph.name, "example");
    assert_eq!(graph.outputs, vec!["t", "m", "h"]);
    let expect = |name: &str, dtype: DType, shape: &[usize]| {
        assert_eq!(types[name].dtype, dtype, "{name}");
        assert_eq!(types[name].shape, shape, "{name}");
    };
    expect("x", DType::F32, &[64, 512]);
    expect("s", DType::F32, &[]);
    expect("i", DType::F32, &[64, 512]);
    expect("one", DType::F32, &[]);
    expect("t", DType::F32, &[64, 512]);
    expect("m", DType::F32, &[64, 1]);
    expect("h", DType::F16, &[64, 512]);
    assert_eq!(
        graph.node("m").unwrap().attrs["axes"],
        AttrValue::Ints(vec![1])
    );
}

#[test]
fn load_save_load_round_trips_exactly() {
    let catalogue = Catalogue::defaults();
    let (graph, _) = file::parse(CONTRACT, "contract.ron", &catalogue).unwrap();
    let saved = file::to_ron(&graph);
    let (again, _) = file::parse(&saved, "saved.ron", &catalogue).unwrap();
    assert_eq!(graph, again);
    assert_eq!(saved, file::to_ron(&again), "saving is a fixpoint");
}

#[test]
fn special_values_and_odd_names_survive_the_round_trip() {
    let catalogue = Catalogue::defaults();
    let mut b = GraphBuilder::new("odd \"quoted\" name\nwith newline");
    let x = b.input("x \\ y", DType::BF16, &[0, 3]);
    let nan = b.constant("nan", f64::NAN, DType::F32);
    let inf = b.constant("ninf", f64::NEG_INFINITY, DType::F64);
    let tiny = b.constant("tiny", 5e-324, DType::F64);
    let third = b.constant("third", 1.0 / 3.0, DType::F64);
    let a = b.op("a", "add", &[&x, &nan]);
    let c = b.op_with(
        "c",
        "clamp",
        &[&a],
        &[
            ("min", AttrValue::Float(-1e300)),
            ("max", AttrValue::Float(f64::INFINITY)),
        ],
    );
    let s = b.op_with(
        "s",
        "slice",
        &[&c],
        &[("start", AttrValue::Int(-2)), ("axis", AttrValue::Int(1))],
    );
    let graph = b.finish(&[&s, &inf, &tiny, &third]);
    check(&graph, &catalogue).unwrap();
    let saved = file::to_ron(&graph);
    let (again, _) = file::parse(&saved, "saved.ron", &catalogue).unwrap();
    // NaN != NaN, so compare the saved text and everything else structurally.
    assert_eq!(saved, file::to_ron(&again));
    assert_eq!(again.name, graph.name);
    assert_eq!(again.inputs, graph.inputs);
    match &again.node("nan").unwrap().attrs["value"] {
        AttrValue::Float(v) => assert!(v.is_nan()),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        again.node("ninf").unwrap().attrs["value"],
        AttrValue::Float(f64::NEG_INFINITY)
    );
    assert_eq!(
        again.node("tiny").unwrap().attrs["value"],
        AttrValue::Float(5e-324)
    );
    assert_eq!(
        again.node("third").unwrap().attrs["value"],
        AttrValue::Float(1.0 / 3.0)
    );
    assert_eq!(again.nodes[5..], graph.nodes[5..]);
}

#[test]
fn builder_and_file_give_the_same_graph() {
    let catalogue = Catalogue::defaults();
    let (from_file, _) = file::parse(CONTRACT, "contract.ron", &catalogue).unwrap();
    let mut b = GraphBuilder::new("example");
    let x = b.input("x", DType::F32, &[64, 512]);
    b.input("s", DType::F32, &[]);
    let i = b.op("i", "sigmoid", &[&x]);
    let one = b.constant("one", 1.0, DType::F32);
    let t = b.op("t", "sub", &[&one, &i]);
    let m = b.op_with(
        "m",
        "mean",
        &[&t],
        &[("axes", vec![1i64].into()), ("keepdim", true.into())],
    );
    let h = b.op_with("h", "cast", &[&t], &[("dtype", DType::F16.into())]);
    assert_eq!(b.finish(&[&t, &m, &h]), from_file);
}

#[test]
fn comments_trailing_commas_and_omitted_fields_are_accepted() {
    let text = r#"
    // leading comment
    Graph(
        name: "c", /* block */
        inputs: [Input(name: "x", dtype: "i32", shape: [3],),],
        nodes: [Node(name: "n", op: "neg", args: ["x"])],
        outputs: ["n"],
    )"#;
    let (graph, types) = file::parse(text, "c.ron", &Catalogue::defaults()).unwrap();
    assert!(graph.nodes[0].attrs.is_empty());
    assert_eq!(types["n"].dtype, DType::I32);
}
