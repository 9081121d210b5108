//! ATen graphs in (`fusebox::aten`): the JSON the `torch.compile` front end sends, spelled by
//! `rules/aten.ron` and imported, checked against values computed here; and which nodes
//! fusebox takes, with the reason for those it does not.

use fusebox::aten;
use fusebox::dtype::DType;
use fusebox::rules::RuleSet;
use fusebox::tensor::Tensor;
use std::collections::BTreeMap;

/// Imports `json` (constants from `constants`) and evaluates it on `inputs`.
fn run(
    json: &str,
    constants: &[(&str, Vec<u8>)],
    inputs: &[(&str, Tensor)],
) -> BTreeMap<String, Tensor> {
    let rules = RuleSet::defaults();
    let graph = aten::fx::parse(json, "test.json").unwrap_or_else(|e| panic!("{e}"));
    let constants = constants
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let imported = aten::import(&graph, &constants, &rules).unwrap_or_else(|e| panic!("{e}"));
    let mut values: fusebox::eval::Tensors = imported.values.into_iter().collect();
    values.extend(inputs.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let out = fusebox::eval::evaluate(&imported.graph, &rules.ops, &values)
        .unwrap_or_else(|e| panic!("{e}"));
    out.into_iter().collect()
}

fn t(dtype: DType, shape: &[usize], values: &[f64]) -> Tensor {
    Tensor::from_values(dtype, shape, values.to_vec()).unwrap()
}

#[test]
fn arithmetic_promotes_operands_and_scales_by_alpha() {
    // sub(x, 3) * alpha 2 on int64, then that (int64) divided by a float tensor: true division.
    let json = r#"{"name": "g",
        "inputs": [{"name": "i", "dtype": "i64", "shape": [3]}, {"name": "f", "dtype": "f32", "shape": [3]}],
        "nodes": [
          {"name": "s", "target": "aten.sub.Tensor", "args": {"self": {"ref": "i"}, "other": 3, "alpha": 2},
           "outputs": [{"dtype": "i64", "shape": [3]}]},
          {"name": "d", "target": "aten.div.Tensor", "args": {"self": {"ref": "s"}, "other": {"ref": "f"}},
           "outputs": [{"dtype": "f32", "shape": [3]}]},
          {"name": "c", "target": "aten.lt.Scalar", "args": {"self": {"ref": "f"}, "other": 0},
           "outputs": [{"dtype": "bool", "shape": [3]}], "common": "f32"},
          {"name": "m", "target": "aten.masked_fill.Scalar",
           "args": {"self": {"ref": "d"}, "mask": {"ref": "c"}, "value": {"float": "-inf"}},
           "outputs": [{"dtype": "f32", "shape": [3]}]}
        ],
        "outputs": [{"ref": "d"}, {"ref": "m"}]}"#;
    // Nodes arrive in the graph's order: `m` reading `c`, written after it, is refused at `m`.
    let mut misordered: serde_json::Value = serde_json::from_str(json).unwrap();
    misordered["nodes"].as_array_mut().unwrap().swap(2, 3);
    let graph = aten::fx::parse(&misordered.to_string(), "g.json").unwrap();
    let e = aten::import(&graph, &BTreeMap::new(), &RuleSet::defaults())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`c` is not a value of the graph") && e.contains("m"),
        "{e}"
    );
    let out = run(
        json,
        &[],
        &[
            (
                "i",
                Tensor::from_ints(DType::I64, &[3], vec![10, 0, 7]).unwrap(),
            ),
            ("f", t(DType::F32, &[3], &[4.0, -2.0, 3.0])),
        ],
    );
    // (10 - 6) / 4, (0 - 6) / -2, (7 - 6) / 3
    assert_eq!(out["d"].values(), vec![1.0, 3.0, (1.0f32 / 3.0) as f64]);
    assert_eq!(
        out["m"].values(),
        vec![1.0, f64::NEG_INFINITY, (1.0f32 / 3.0) as f64]
    );
}

#[test]
fn multi_output_ops_give_each_output_read() {
    // split_with_sizes into [1, 2] along axis 1, and layer norm's mean and rstd.
    let json = r#"{"name": "g",
        "inputs": [{"name": "x", "dtype": "f32", "shape": [2, 3]}, {"name": "w", "dtype": "f32", "shape": [3]}],
        "nodes": [
          {"name": "sp", "target": "aten.split_with_sizes.default", "args": {"self": {"ref": "x"}, "split_sizes": [1, 2], "dim": 1},
           "outputs": [{"dtype": "f32", "shape": [2, 1]}, {"dtype": "f32", "shape": [2, 2]}], "used": [1]},
          {"name": "ln", "target": "aten.native_layer_norm.default",
           "args": {"input": {"ref": "x"}, "normalized_shape": [3], "weight": {"ref": "w"}, "bias": null, "eps": 0.0},
           "outputs": [{"dtype": "f32", "shape": [2, 3]}, {"dtype": "f32", "shape": [2, 1]}, {"dtype": "f32", "shape": [2, 1]}]}
        ],
        "outputs": [{"ref": "sp", "index": 1}, {"ref": "ln", "index": 0}, {"ref": "ln", "index": 1}, {"ref": "ln", "index": 2}]}"#;
    let out = run(
        json,
        &[],
        &[
            (
                "x",
                t(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 4.0, 10.0]),
            ),
            ("w", t(DType::F32, &[3], &[1.0, 1.0, 2.0])),
        ],
    );
    assert_eq!(out["sp:1"].values(), vec![2.0, 3.0, 4.0, 10.0]);
    assert_eq!(out["ln:1"].values(), vec![2.0, 6.0]);
    // Row 0: variance 2/3; row 1: variance 8.
    let r0 = 1.0 / (2.0f64 / 3.0).sqrt();
    let r1 = 1.0 / 8.0f64.sqrt();
    let rstd = out["ln:2"].values();
    assert!(
        (rstd[0] - r0).abs() < 1e-6 && (rstd[1] - r1).abs() < 1e-6,
        "{rstd:?}"
    );
    let y = out["ln"].values();
    let want = [-r0, 0.0, 2.0 * r0, -2.0 * r1, -2.0 * r1, 2.0 * 4.0 * r1];
    for (g, w) in y.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{y:?}");
    }
}

#[test]
fn constants_views_and_products_import_with_their_values() {
    // y = (x @ w^T + b).view(2, 1, 2) with w and the bias as constants of the graph.
    let json = r#"{"name": "g",
        "inputs": [{"name": "x", "dtype": "f32", "shape": [2, 3]}],
        "constants": [{"name": "w", "dtype": "f32", "shape": [2, 3]}, {"name": "b", "dtype": "f32", "shape": [2]}],
        "nodes": [
          {"name": "wt", "target": "aten.permute.default", "args": {"self": {"ref": "w"}, "dims": [-1, 0]},
           "outputs": [{"dtype": "f32", "shape": [3, 2]}]},
          {"name": "mm", "target": "aten.addmm.default",
           "args": {"self": {"ref": "b"}, "mat1": {"ref": "x"}, "mat2": {"ref": "wt"}, "beta": 1, "alpha": 1},
           "outputs": [{"dtype": "f32", "shape": [2, 2]}]},
          {"name": "v", "target": "aten.view.default", "args": {"self": {"ref": "mm"}, "size": [2, -1, 2]},
           "outputs": [{"dtype": "f32", "shape": [2, 1, 2]}]}
        ],
        "outputs": [{"ref": "v"}]}"#;
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let out = run(
        json,
        &[
            ("w", bytes(&[1.0, 0.0, 2.0, 0.0, 1.0, -1.0])),
            ("b", bytes(&[0.5, -0.5])),
        ],
        &[("x", t(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))],
    );
    assert_eq!(out["v"].shape(), &[2, 1, 2]);
    assert_eq!(out["v"].values(), vec![7.5, -1.5, 16.5, -1.5]);
    // A constant whose bytes do not match its type is refused at the constant.
    let rules = RuleSet::defaults();
    let graph = aten::fx::parse(json, "g.json").unwrap();
    let short = BTreeMap::from([
        ("w".to_string(), vec![0u8; 4]),
        ("b".to_string(), bytes(&[0.0, 0.0])),
    ]);
    let e = aten::import(&graph, &short, &rules)
        .unwrap_err()
        .to_string();
    assert!(e.contains("w") && e.contains("4 bytes given"), "{e}");
}

#[test]
fn support_names_each_refused_node_and_why() {
    let json = r#"{"name": "g",
        "inputs": [{"name": "x", "dtype": "f32", "shape": [4, 8]}],
        "nodes": [
          {"name": "r", "target": "aten.relu.default", "args": {"self": {"ref": "x"}}, "outputs": [{"dtype": "f32", "shape": [4, 8]}]},
          {"name": "s", "target": "aten.sort.default", "args": {"self": {"ref": "r"}, "dim": -1, "descending": false},
           "outputs": [{"dtype": "f32", "shape": [4, 8]}, {"dtype": "i64", "shape": [4, 8]}]},
          {"name": "h", "target": "aten._softmax.default", "args": {"self": {"ref": "r"}, "dim": 1, "half_to_float": true},
           "outputs": [{"dtype": "f32", "shape": [4, 8]}]},
          {"name": "sm", "target": "aten._softmax.default", "args": {"self": {"ref": "r"}, "dim": 1, "half_to_float": false},
           "outputs": [{"dtype": "f32", "shape": [4, 8]}]},
          {"name": "ln", "target": "aten.native_layer_norm.default",
           "args": {"input": {"ref": "x"}, "normalized_shape": [8], "weight": null, "bias": null, "eps": 1e-5},
           "outputs": [{"dtype": "f32", "shape": [4, 8]}, {"dtype": "f32", "shape": [4, 1]}, {"dtype": "f32", "shape": [4, 1]}]},
          {"name": "wrong", "target": "aten.relu.default", "args": {"self": {"ref": "x"}}, "outputs": [{"dtype": "f64", "shape": [4, 8]}]},
          {"name": "bn", "target": "aten._native_batch_norm_legit_no_training.default",
           "args": {"input": {"ref": "x"}, "weight": null, "bias": null, "running_mean": {"ref": "x"}, "running_var": {"ref": "x"}, "momentum": 0.1, "eps": 1e-5},
           "outputs": [{"dtype": "f32", "shape": [4, 8]}, {"dtype": "f32", "shape": [0]}, {"dtype": "f32", "shape": [0]}], "used": [0, 2]}
        ],
        "outputs": [{"ref": "sm"}]}"#;
    let graph = aten::fx::parse(json, "g.json").unwrap();
    let verdicts = aten::supported(&graph, &RuleSet::defaults());
    assert_eq!(verdicts["r"], None);
    assert_eq!(verdicts["sm"], None);
    let why = |n: &str| {
        verdicts[n]
            .clone()
            .unwrap_or_else(|| panic!("{n} is refused"))
    };
    assert!(
        why("s").contains("`aten.sort.default` has no entry in the ATen table"),
        "{}",
        why("s")
    );
    assert!(
        why("h").contains("no entry of `aten._softmax.default` applies")
            && why("h").contains("half_to_float=true"),
        "{}",
        why("h")
    );
    // Without a weight, layer norm takes ones as its scale.
    assert_eq!(verdicts["ln"], None);
    // A node whose traced output type differs from what fusebox would compute is refused.
    assert!(
        why("wrong").contains("fusebox computes output 0 as f32 [4, 8], PyTorch as f64 [4, 8]"),
        "{}",
        why("wrong")
    );
    assert!(why("bn").contains("reads output 2"), "{}", why("bn"));
}

#[test]
fn malformed_json_is_located() {
    let e = aten::fx::parse("{\"name\": \"g\",\n \"inputs\": 3}", "part.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("part.json") && e.contains("line 2"), "{e}");
}
