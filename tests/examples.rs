//! The example graphs in `examples/`: each loads, checks, evaluates to finite values of the
//! declared shapes, runs through the CLI, round-trips through the file format, and (for most)
//! computes what its formulas say, checked against values computed here independently in f64.
//! The hand-written LSTM backward is also checked against finite differences of the forward.

use fusebox::attr::AttrValue;
use fusebox::dtype::DType;
use fusebox::eval::{Tensors, evaluate, evaluate_all, random_inputs};
use fusebox::graph::file::{load, parse, to_ron};
use fusebox::graph::{Graph, TypeMap, check};
use fusebox::rules::Catalogue;
use fusebox::tensor::{Tensor, seeded_rng};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every example the project ships; the directory must hold at least these.
const EXAMPLES: [&str; 9] = [
    "adam_step",
    "amp_demo",
    "gelu_bias",
    "gru_residual",
    "iou",
    "layernorm_tail",
    "lstm_cell",
    "lstm_cell_backward",
    "mlp_block",
];

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// All `.ron` files in `examples/`, sorted.
fn example_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .collect();
    files.sort();
    files
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap().to_string_lossy().into_owned()
}

fn load_path(path: &Path, catalogue: &Catalogue) -> (Graph, TypeMap) {
    load(path, catalogue).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load_example(name: &str, catalogue: &Catalogue) -> Graph {
    load_path(&examples_dir().join(format!("{name}.ron")), catalogue).0
}

/// Random inputs within each example's domain: Adam's second moment `v` is non-negative.
fn domain_inputs(graph: &Graph, seed: u64) -> Tensors {
    let mut inputs = random_inputs(graph, seed);
    if graph.name == "adam_step" {
        let v = inputs.get_mut("v").unwrap();
        v.floats_mut().unwrap().mapv_inplace(f64::abs);
    }
    inputs
}

/// Gives every input of `graph` the same `shape` (and `dtype`, when given).
fn resize(graph: &mut Graph, shape: &[usize], dtype: Option<DType>) {
    for input in &mut graph.inputs {
        input.shape = shape.to_vec();
        if let Some(d) = dtype {
            input.dtype = d;
        }
    }
}

fn set_ints(graph: &mut Graph, node: &str, attr: &str, value: Vec<i64>) {
    let node = graph.nodes.iter_mut().find(|n| n.name == node).unwrap();
    node.attrs.insert(attr.to_string(), AttrValue::Ints(value));
}

fn run_graph(graph: &Graph, catalogue: &Catalogue, inputs: &Tensors) -> Tensors {
    check(graph, catalogue).unwrap_or_else(|e| panic!("{}: {e}", graph.name));
    evaluate(graph, catalogue, inputs).unwrap_or_else(|e| panic!("{}: {e}", graph.name))
}

fn vals(tensors: &Tensors, name: &str) -> Vec<f64> {
    tensors[name].values()
}

/// Asserts `got` (an f32 tensor) matches `expected` (computed in f64) elementwise within
/// `atol + rtol * |expected|`, with rtol = 1e-5 and atol = 1e-6.
fn assert_close(what: &str, got: &Tensor, shape: &[usize], expected: &[f64]) {
    assert_eq!(got.shape(), shape, "{what}: shape");
    assert_eq!(got.values().len(), expected.len(), "{what}: element count");
    let (rtol, atol) = (1e-5, 1e-6);
    for (k, (&g, &e)) in got.values().iter().zip(expected).enumerate() {
        assert!(
            e.is_finite(),
            "{what}[{k}]: expected value {e} is not finite"
        );
        assert!(
            (g - e).abs() <= atol + rtol * e.abs(),
            "{what}[{k}]: got {g}, expected {e} (difference {:e})",
            (g - e).abs()
        );
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// An f32 constant as the graph holds it: the written value rounded to f32.
fn f32_const(v: f64) -> f64 {
    f64::from(v as f32)
}

// ------------------------------------------------------------------------------------------
// Loading, checking and evaluating every example

#[test]
fn every_shipped_example_is_present() {
    let names: Vec<String> = example_files().iter().map(|p| stem(p)).collect();
    for name in EXAMPLES {
        assert!(
            names.iter().any(|n| n == name),
            "examples/{name}.ron is missing"
        );
    }
}

#[test]
fn every_example_starts_with_a_comment_block() {
    for path in example_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let comments = text.lines().take_while(|l| l.starts_with("//")).count();
        assert!(
            comments >= 3,
            "{} should open with a `//` block saying what it is and where it comes from",
            path.display()
        );
        assert!(
            text.contains("Source:"),
            "{}: the comment block names its source",
            path.display()
        );
    }
}

#[test]
fn every_example_checks_and_evaluates_to_finite_outputs() {
    let catalogue = Catalogue::defaults();
    for path in example_files() {
        let (graph, types) = load_path(&path, &catalogue);
        assert_eq!(graph.name, stem(&path), "graph name matches the file name");
        let rechecked = check(&graph, &catalogue).unwrap();
        assert_eq!(rechecked, types, "{}: load and check agree", graph.name);
        let inputs = domain_inputs(&graph, 7);
        let outputs =
            evaluate(&graph, &catalogue, &inputs).unwrap_or_else(|e| panic!("{}: {e}", graph.name));
        assert_eq!(outputs.len(), graph.outputs.len());
        for name in &graph.outputs {
            let t = &outputs[name];
            assert_eq!(
                t.shape(),
                types[name].shape.as_slice(),
                "{}: {name}",
                graph.name
            );
            assert_eq!(t.dtype, types[name].dtype, "{}: {name}", graph.name);
            let bad = t.floats().iter().filter(|v| !v.is_finite()).count();
            assert_eq!(bad, 0, "{}: {name} has {bad} non-finite values", graph.name);
        }
    }
}

#[test]
fn example_output_types_are_as_documented() {
    let catalogue = Catalogue::defaults();
    let expect: [(&str, &str, &[usize]); 17] = [
        ("lstm_cell", "hy", &[1024, 4096]),
        ("lstm_cell", "cy", &[1024, 4096]),
        ("lstm_cell_backward", "grad_gates", &[256, 4096]),
        ("lstm_cell_backward", "grad_cx", &[256, 1024]),
        ("lstm_cell_backward", "grad_bias", &[4096]),
        ("gru_residual", "h_next", &[512, 1024]),
        ("gru_residual", "y", &[512, 1024]),
        ("gelu_bias", "y", &[2048, 3072]),
        ("layernorm_tail", "y", &[2048, 768]),
        ("layernorm_tail", "mean", &[2048, 1]),
        ("layernorm_tail", "rstd", &[2048, 1]),
        ("iou", "iou", &[2000, 64]),
        ("amp_demo", "result", &[1024, 1024]),
        ("mlp_block", "y", &[256, 512]),
        ("adam_step", "param_new", &[1024, 1024]),
        ("adam_step", "m_new", &[1024, 1024]),
        ("adam_step", "v_new", &[1024, 1024]),
    ];
    for (example, output, shape) in expect {
        let (graph, types) = load_path(&examples_dir().join(format!("{example}.ron")), &catalogue);
        assert!(
            graph.outputs.iter().any(|o| o == output),
            "{example}: output {output}"
        );
        assert_eq!(types[output].shape, shape, "{example}: {output}");
        assert_eq!(types[output].dtype, DType::F32, "{example}: {output}");
    }
}

/// The fused LSTM cell reads five [1024, 4096] f32 tensors and writes two: 112 MiB.
#[test]
fn lstm_cell_moves_112_mib() {
    let catalogue = Catalogue::defaults();
    let (graph, types) = load_path(&examples_dir().join("lstm_cell.ron"), &catalogue);
    let bytes = |name: &str| {
        let t = &types[name];
        t.shape.iter().product::<usize>() * t.dtype.size_bytes()
    };
    let read: usize = graph.inputs.iter().map(|i| bytes(&i.name)).sum();
    let written: usize = graph.outputs.iter().map(|o| bytes(o)).sum();
    assert_eq!(read, 5 * 1024 * 4096 * 4);
    assert_eq!(written, 2 * 1024 * 4096 * 4);
    assert_eq!(read + written, 117_440_512);
    assert_eq!(read + written, 112 << 20);
}

/// The MXNet AMP RFC demo: `data` feeds exp, sin and cos, whose sum meets data2 and data3.
#[test]
fn amp_demo_has_the_rfc_structure() {
    let catalogue = Catalogue::defaults();
    let graph = load_example("amp_demo", &catalogue);
    let inputs: Vec<&str> = graph.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(inputs, ["data", "data2", "data3"]);
    let mut consumers_of_data: Vec<&str> = graph
        .nodes
        .iter()
        .filter(|n| n.args.iter().any(|a| a == "data"))
        .map(|n| n.op.as_str())
        .collect();
    consumers_of_data.sort();
    assert_eq!(consumers_of_data, ["cos", "exp", "sin"]);
    let adds = graph.nodes.iter().filter(|n| n.op == "add").count();
    assert_eq!(
        adds, 4,
        "x + x2 + x3 is two adds, add_n of three is two more"
    );
}

/// IoU uses the [N, 1] against [1, M] broadcasting pattern.
#[test]
fn iou_broadcasts_columns_against_rows() {
    let catalogue = Catalogue::defaults();
    let graph = load_example("iou", &catalogue);
    for input in &graph.inputs {
        let expected: &[usize] = if input.name.starts_with('a') {
            &[2000, 1]
        } else {
            &[1, 64]
        };
        assert_eq!(input.shape, expected, "{}", input.name);
    }
}

// ------------------------------------------------------------------------------------------
// The command line

fn fusebox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
}

#[test]
fn cli_checks_and_runs_every_example() {
    let catalogue = Catalogue::defaults();
    let tmp = std::env::temp_dir().join(format!("fusebox-examples-cli-{}", std::process::id()));
    let mut compared = 0;
    for path in example_files() {
        let (graph, types) = load_path(&path, &catalogue);
        let checked = fusebox().arg("check").arg(&path).output().unwrap();
        assert!(
            checked.status.success(),
            "fusebox check {}: {}",
            path.display(),
            String::from_utf8_lossy(&checked.stderr)
        );
        let listing = String::from_utf8_lossy(&checked.stdout);
        assert!(
            listing.contains(&format!("graph `{}`", graph.name)),
            "{listing}"
        );

        let out = tmp.join(&graph.name);
        let ran = fusebox()
            .arg("run")
            .arg(&path)
            .args([
                "--backend",
                "reference",
                "--random-inputs",
                "--seed",
                "1",
                "--out",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            ran.status.success(),
            "fusebox run {}: {}",
            path.display(),
            String::from_utf8_lossy(&ran.stderr)
        );
        // The CLI draws --random-inputs in declaration order from the seed, as
        // `random_inputs` does, so the files must hold exactly what the library computes from
        // those inputs (checked for all but the two largest examples, to keep the test fast).
        let elements: usize = graph
            .inputs
            .iter()
            .map(|i| i.shape.iter().product::<usize>())
            .sum();
        let in_process = (elements <= 5_000_000)
            .then(|| evaluate(&graph, &catalogue, &random_inputs(&graph, 1)).unwrap());
        for name in &graph.outputs {
            let file = out.join(format!("{name}.npy"));
            assert!(file.exists(), "{} was not written", file.display());
            let t = Tensor::read_npy(&file).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                t.shape(),
                types[name].shape.as_slice(),
                "{}: {name}",
                graph.name
            );
            assert_eq!(t.dtype, DType::F32, "{}: {name}", graph.name);
            if let Some(values) = &in_process {
                compared += 1;
                let same = t
                    .floats()
                    .iter()
                    .zip(values[name].floats().iter())
                    .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
                assert!(
                    same,
                    "{}: {name} from the CLI differs from the library",
                    graph.name
                );
            }
        }
    }
    assert!(
        compared >= 10,
        "CLI outputs compared with the library: {compared}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

// ------------------------------------------------------------------------------------------
// The file format

#[test]
fn every_example_round_trips_through_to_ron() {
    let catalogue = Catalogue::defaults();
    for path in example_files() {
        let (graph, types) = load_path(&path, &catalogue);
        let text = to_ron(&graph);
        let (again, again_types) = parse(&text, "round-trip", &catalogue)
            .unwrap_or_else(|e| panic!("{}: re-reading to_ron output: {e}\n{text}", graph.name));
        assert_eq!(again, graph, "{}: the graph survives to_ron", graph.name);
        assert_eq!(again_types, types, "{}", graph.name);
        assert_eq!(to_ron(&again), text, "{}: to_ron is a fixpoint", graph.name);
    }
}

// ------------------------------------------------------------------------------------------
// Values computed independently, in f64, from the same inputs

#[test]
fn lstm_cell_computes_the_lstm_formulas() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("lstm_cell", &catalogue);
    let shape = [37, 53];
    resize(&mut graph, &shape, None);
    let inputs = random_inputs(&graph, 11);
    let out = run_graph(&graph, &catalogue, &inputs);
    let [ig, fg, cg, og, cx] =
        ["ingate", "forgetgate", "cellgate", "outgate", "cx"].map(|n| vals(&inputs, n));
    let mut hy = Vec::new();
    let mut cy = Vec::new();
    for k in 0..ig.len() {
        let c = sigmoid(fg[k]) * cx[k] + sigmoid(ig[k]) * cg[k].tanh();
        cy.push(c);
        hy.push(sigmoid(og[k]) * c.tanh());
    }
    assert_close("lstm_cell cy", &out["cy"], &shape, &cy);
    assert_close("lstm_cell hy", &out["hy"], &shape, &hy);
}

/// The backward in f64, from PyTorch's formulas for the fused LSTM cell backward.
struct LstmGrads {
    ingate: Vec<f64>,
    forgetgate: Vec<f64>,
    cellgate: Vec<f64>,
    outgate: Vec<f64>,
    cx: Vec<f64>,
    bias: Vec<f64>,
}

fn lstm_backward_f64(inputs: &Tensors, batch: usize, hidden: usize) -> LstmGrads {
    let [i, f, g, o, cx, cy, ghy, gcy_in] =
        ["i", "f", "g", "o", "cx", "cy", "grad_hy", "grad_cy"].map(|n| vals(inputs, n));
    let n = batch * hidden;
    let mut grads = LstmGrads {
        ingate: vec![0.0; n],
        forgetgate: vec![0.0; n],
        cellgate: vec![0.0; n],
        outgate: vec![0.0; n],
        cx: vec![0.0; n],
        bias: vec![0.0; 4 * hidden],
    };
    for k in 0..n {
        let t = cy[k].tanh();
        let gcy = ghy[k] * o[k] * (1.0 - t * t) + gcy_in[k];
        grads.ingate[k] = gcy * g[k] * i[k] * (1.0 - i[k]);
        grads.forgetgate[k] = gcy * cx[k] * f[k] * (1.0 - f[k]);
        grads.cellgate[k] = gcy * i[k] * (1.0 - g[k] * g[k]);
        grads.outgate[k] = ghy[k] * t * o[k] * (1.0 - o[k]);
        grads.cx[k] = gcy * f[k];
        let j = k % hidden;
        grads.bias[j] += grads.ingate[k];
        grads.bias[hidden + j] += grads.forgetgate[k];
        grads.bias[2 * hidden + j] += grads.cellgate[k];
        grads.bias[3 * hidden + j] += grads.outgate[k];
    }
    grads
}

/// Saved activations as the forward produces them: sigmoid or tanh of random pre-activations.
fn lstm_saved_inputs(graph: &Graph, seed: u64) -> Tensors {
    let mut inputs = random_inputs(graph, seed);
    for (name, act) in [
        ("i", sigmoid as fn(f64) -> f64),
        ("f", sigmoid),
        ("g", f64::tanh),
        ("o", sigmoid),
    ] {
        let t = &inputs[name];
        let activated = Tensor::from_array(t.dtype, t.floats().mapv(act));
        inputs.insert(name.to_string(), activated);
    }
    inputs
}

/// The four gate gradients as outputs of their own beside grad_gates (the example returns
/// them only concatenated, as PyTorch does), to compare each with its formula.
fn with_gate_outputs(graph: &mut fusebox::graph::Graph) {
    for name in [
        "grad_ingate",
        "grad_forgetgate",
        "grad_cellgate",
        "grad_outgate",
    ] {
        graph.outputs.push(name.to_string());
    }
}

#[test]
fn lstm_cell_backward_computes_the_derivative_formulas() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("lstm_cell_backward", &catalogue);
    let (batch, hidden) = (9, 16);
    resize(&mut graph, &[batch, hidden], None);
    set_ints(&mut graph, "grad_bias", "shape", vec![4 * hidden as i64]);
    with_gate_outputs(&mut graph);
    let inputs = lstm_saved_inputs(&graph, 12);
    let out = run_graph(&graph, &catalogue, &inputs);
    let want = lstm_backward_f64(&inputs, batch, hidden);
    let shape = [batch, hidden];
    // grad_gates is the four gate gradients side by side, gate k in columns k·H..(k+1)·H.
    let gates = out["grad_gates"].values();
    for (k, name) in [
        "grad_ingate",
        "grad_forgetgate",
        "grad_cellgate",
        "grad_outgate",
    ]
    .into_iter()
    .enumerate()
    {
        let own = out[name].values();
        for r in 0..batch {
            let row = &gates[r * 4 * hidden + k * hidden..r * 4 * hidden + (k + 1) * hidden];
            assert_eq!(row, &own[r * hidden..(r + 1) * hidden], "{name} row {r}");
        }
    }
    assert_close("grad_ingate", &out["grad_ingate"], &shape, &want.ingate);
    assert_close(
        "grad_forgetgate",
        &out["grad_forgetgate"],
        &shape,
        &want.forgetgate,
    );
    assert_close(
        "grad_cellgate",
        &out["grad_cellgate"],
        &shape,
        &want.cellgate,
    );
    assert_close("grad_outgate", &out["grad_outgate"], &shape, &want.outgate);
    assert_close("grad_cx", &out["grad_cx"], &shape, &want.cx);
    assert_close("grad_bias", &out["grad_bias"], &[4 * hidden], &want.bias);
}

/// The hand-written backward is the derivative of the forward graph: with the loss
/// L = sum(grad_hy * hy + grad_cy * cy), central differences of the forward (in f64) match the
/// backward's gradients for every pre-activation element, cx, and each bias column.
#[test]
fn lstm_cell_backward_matches_finite_differences_of_the_forward() {
    let catalogue = Catalogue::defaults();
    let (batch, hidden) = (3, 4);
    let n = batch * hidden;
    let mut forward = load_example("lstm_cell", &catalogue);
    resize(&mut forward, &[batch, hidden], Some(DType::F64));
    let mut backward = load_example("lstm_cell_backward", &catalogue);
    with_gate_outputs(&mut backward);
    resize(&mut backward, &[batch, hidden], Some(DType::F64));
    set_ints(&mut backward, "grad_bias", "shape", vec![4 * hidden as i64]);
    check(&forward, &catalogue).unwrap();
    check(&backward, &catalogue).unwrap();

    let mut rng = seeded_rng(13);
    let mut draw = || Tensor::random(DType::F64, &[batch, hidden], &mut rng);
    let fwd_inputs: Tensors = ["ingate", "forgetgate", "cellgate", "outgate", "cx"]
        .into_iter()
        .map(|name| (name.to_string(), draw()))
        .collect();
    let (grad_hy, grad_cy) = (draw(), draw());

    // The forward's intermediates are the backward's saved inputs.
    let saved = evaluate_all(&forward, &catalogue, &fwd_inputs).unwrap();
    let mut bwd_inputs = Tensors::new();
    for name in ["i", "f", "g", "o", "cx", "cy"] {
        bwd_inputs.insert(name.to_string(), saved[name].clone());
    }
    bwd_inputs.insert("grad_hy".into(), grad_hy.clone());
    bwd_inputs.insert("grad_cy".into(), grad_cy.clone());
    let grads = run_graph(&backward, &catalogue, &bwd_inputs);

    let loss = |inputs: &Tensors| -> f64 {
        let out = evaluate(&forward, &catalogue, inputs).unwrap();
        let (hy, cy) = (out["hy"].values(), out["cy"].values());
        let (ghy, gcy) = (grad_hy.values(), grad_cy.values());
        (0..n).map(|k| ghy[k] * hy[k] + gcy[k] * cy[k]).sum()
    };
    // d L / d eps, where eps is added to `input` at the elements `at`.
    let h = 1e-6;
    let numeric = |input: &str, at: &[usize]| -> f64 {
        let shifted = |delta: f64| {
            let mut inputs = fwd_inputs.clone();
            let t = inputs.get_mut(input).unwrap();
            let flat = t.floats_mut().unwrap().as_slice_mut().unwrap();
            for &k in at {
                flat[k] += delta;
            }
            loss(&inputs)
        };
        (shifted(h) - shifted(-h)) / (2.0 * h)
    };
    let close = |what: String, analytic: f64, numeric: f64| {
        assert!(
            (analytic - numeric).abs() <= 1e-6 + 1e-6 * numeric.abs(),
            "{what}: backward gives {analytic}, finite differences {numeric}"
        );
    };

    let gates = [
        ("ingate", "grad_ingate"),
        ("forgetgate", "grad_forgetgate"),
        ("cellgate", "grad_cellgate"),
        ("outgate", "grad_outgate"),
        ("cx", "grad_cx"),
    ];
    let mut nonzero = 0;
    for (input, grad) in gates {
        let analytic = grads[grad].values();
        for (k, &a) in analytic.iter().enumerate() {
            close(format!("{grad}[{k}]"), a, numeric(input, &[k]));
            nonzero += usize::from(a.abs() > 1e-3);
        }
    }
    assert!(
        nonzero > 4 * n,
        "the check should not pass on vanishing gradients"
    );

    // A bias element shifts one column of its gate's pre-activation in every row.
    let bias = grads["grad_bias"].values();
    for (gate, (input, _)) in gates[..4].iter().enumerate() {
        for j in 0..hidden {
            let column: Vec<usize> = (0..batch).map(|b| b * hidden + j).collect();
            close(
                format!("grad_bias[{}] ({input} column {j})", gate * hidden + j),
                bias[gate * hidden + j],
                numeric(input, &column),
            );
        }
    }
}

#[test]
fn gru_residual_computes_the_gru_formulas() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("gru_residual", &catalogue);
    let shape = [21, 34];
    resize(&mut graph, &shape, None);
    let inputs = random_inputs(&graph, 14);
    let out = run_graph(&graph, &catalogue, &inputs);
    let [xr, xz, xn, hr, hz, hn, h, x] =
        ["xr", "xz", "xn", "hr", "hz", "hn", "h", "x"].map(|n| vals(&inputs, n));
    let mut h_next = Vec::new();
    let mut y = Vec::new();
    for k in 0..xr.len() {
        let r = sigmoid(xr[k] + hr[k]);
        let z = sigmoid(xz[k] + hz[k]);
        let nn = (xn[k] + r * hn[k]).tanh();
        let hk = (1.0 - z) * nn + z * h[k];
        h_next.push(hk);
        y.push(hk + x[k]);
    }
    assert_close("gru h_next", &out["h_next"], &shape, &h_next);
    assert_close("gru y", &out["y"], &shape, &y);
}

#[test]
fn gelu_bias_computes_exact_gelu() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("gelu_bias", &catalogue);
    let (rows, cols) = (33, 70);
    graph.inputs[0].shape = vec![rows, cols];
    graph.inputs[1].shape = vec![cols];
    let inputs = random_inputs(&graph, 15);
    let out = run_graph(&graph, &catalogue, &inputs);
    let (x, bias) = (vals(&inputs, "x"), vals(&inputs, "bias"));
    let y: Vec<f64> = (0..rows * cols)
        .map(|k| {
            let u = x[k] + bias[k % cols];
            0.5 * u * (1.0 + libm::erf(u / std::f64::consts::SQRT_2))
        })
        .collect();
    assert_close("gelu_bias y", &out["y"], &[rows, cols], &y);
}

#[test]
fn layernorm_tail_normalizes_each_row() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("layernorm_tail", &catalogue);
    let (rows, cols) = (16, 768);
    graph.inputs[0].shape = vec![rows, cols];
    let inputs = random_inputs(&graph, 16);
    let out = run_graph(&graph, &catalogue, &inputs);
    let (x, gamma, beta) = (
        vals(&inputs, "x"),
        vals(&inputs, "gamma"),
        vals(&inputs, "beta"),
    );
    let eps = f32_const(1e-5);
    let (mut y, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        means.push(mean);
        rstds.push(rstd);
        for c in 0..cols {
            y.push((row[c] - mean) * rstd * gamma[c] + beta[c]);
        }
    }
    // The row statistics are well inside f32 precision: uniform [-3, 3] rows have variance
    // near 3, so rstd is near 0.58.
    for &r in &rstds {
        assert!((0.5..0.7).contains(&r), "rstd {r}");
    }
    assert_close("layernorm mean", &out["mean"], &[rows, 1], &means);
    assert_close("layernorm rstd", &out["rstd"], &[rows, 1], &rstds);
    assert_close("layernorm y", &out["y"], &[rows, cols], &y);
}

#[test]
fn iou_of_known_boxes() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("iou", &catalogue);
    let (n, m) = (40, 25);
    for input in &mut graph.inputs {
        input.shape = if input.name.starts_with('a') {
            vec![n, 1]
        } else {
            vec![1, m]
        };
    }
    // Well-formed boxes from the random values: corner in [-3, 3], sides in [0.1, 2.1]. The
    // last box of each set is a point, so that pair has union 0 and IoU 0 (the `where` guard).
    let raw = random_inputs(&graph, 17);
    let mut inputs = Tensors::new();
    for (set, count) in [('a', n), ('b', m)] {
        let shape = if set == 'a' { vec![n, 1] } else { vec![1, m] };
        let x1 = vals(&raw, &format!("{set}x1"));
        let y1 = vals(&raw, &format!("{set}y1"));
        let side = |v: f64, k: usize| {
            if k + 1 == count {
                0.0
            } else {
                0.1 + (v + 3.0) / 3.0
            }
        };
        let x2: Vec<f64> = vals(&raw, &format!("{set}x2"))
            .iter()
            .enumerate()
            .map(|(k, &v)| x1[k] + side(v, k))
            .collect();
        let y2: Vec<f64> = vals(&raw, &format!("{set}y2"))
            .iter()
            .enumerate()
            .map(|(k, &v)| y1[k] + side(v, k))
            .collect();
        for (coord, values) in [("x1", x1), ("y1", y1), ("x2", x2), ("y2", y2)] {
            let t = Tensor::from_values(DType::F32, &shape, values).unwrap();
            inputs.insert(format!("{set}{coord}"), t);
        }
    }
    let out = run_graph(&graph, &catalogue, &inputs);
    let c = |name: &str| vals(&inputs, name);
    let (ax1, ay1, ax2, ay2) = (c("ax1"), c("ay1"), c("ax2"), c("ay2"));
    let (bx1, by1, bx2, by2) = (c("bx1"), c("by1"), c("bx2"), c("by2"));
    let mut iou = Vec::new();
    let mut overlapping = 0;
    for a in 0..n {
        for b in 0..m {
            let w = (ax2[a].min(bx2[b]) - ax1[a].max(bx1[b])).max(0.0);
            let h = (ay2[a].min(by2[b]) - ay1[a].max(by1[b])).max(0.0);
            let inter = w * h;
            let union = (ax2[a] - ax1[a]) * (ay2[a] - ay1[a])
                + (bx2[b] - bx1[b]) * (by2[b] - by1[b])
                - inter;
            let value = if union > 0.0 { inter / union } else { 0.0 };
            assert!((0.0..=1.0).contains(&value));
            overlapping += usize::from(value > 0.0);
            iou.push(value);
        }
    }
    assert!(
        overlapping > 20,
        "enough pairs overlap to test the ratio ({overlapping})"
    );
    assert_eq!(
        out["iou"].values()[n * m - 1],
        0.0,
        "two point boxes: union 0 gives IoU 0"
    );
    assert_close("iou", &out["iou"], &[n, m], &iou);
}

#[test]
fn amp_demo_sums_exp_sin_cos_and_the_other_inputs() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("amp_demo", &catalogue);
    let shape = [17, 19];
    resize(&mut graph, &shape, None);
    let inputs = random_inputs(&graph, 18);
    let out = run_graph(&graph, &catalogue, &inputs);
    let (d, d2, d3) = (
        vals(&inputs, "data"),
        vals(&inputs, "data2"),
        vals(&inputs, "data3"),
    );
    let want: Vec<f64> = (0..d.len())
        .map(|k| d[k].exp() + d[k].sin() + d[k].cos() + d2[k] + d3[k])
        .collect();
    assert_close("amp_demo result", &out["result"], &shape, &want);
}

#[test]
fn mlp_block_computes_the_feed_forward_block() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("mlp_block", &catalogue);
    let (b, d, hdim) = (4, 8, 16);
    let shapes: [&[usize]; 5] = [&[b, d], &[d, hdim], &[hdim], &[hdim, d], &[d]];
    for (input, shape) in graph.inputs.iter_mut().zip(shapes) {
        input.shape = shape.to_vec();
    }
    // Small weights keep the activations in GELU's interesting range.
    let mut inputs = random_inputs(&graph, 19);
    for name in ["w1", "w2"] {
        let t = &inputs[name];
        let scaled = Tensor::from_array(DType::F32, t.floats().mapv(|v| v / 8.0));
        inputs.insert(name.to_string(), scaled);
    }
    let out = run_graph(&graph, &catalogue, &inputs);
    let [x, w1, b1, w2, b2] = ["x", "w1", "b1", "w2", "b2"].map(|n| vals(&inputs, n));
    let mut y = Vec::new();
    for r in 0..b {
        let act: Vec<f64> = (0..hdim)
            .map(|j| {
                let u = (0..d).map(|k| x[r * d + k] * w1[k * hdim + j]).sum::<f64>() + b1[j];
                0.5 * u * (1.0 + libm::erf(u / std::f64::consts::SQRT_2))
            })
            .collect();
        for c in 0..d {
            let o = (0..hdim).map(|j| act[j] * w2[j * d + c]).sum::<f64>();
            y.push(o + b2[c] + x[r * d + c]);
        }
    }
    assert_close("mlp_block y", &out["y"], &[b, d], &y);
}

#[test]
fn adam_step_applies_the_adam_update() {
    let catalogue = Catalogue::defaults();
    let mut graph = load_example("adam_step", &catalogue);
    let shape = [40, 50];
    resize(&mut graph, &shape, None);
    let inputs = domain_inputs(&graph, 20);
    let out = run_graph(&graph, &catalogue, &inputs);
    let [param, grad, m, v] = ["param", "grad", "m", "v"].map(|n| vals(&inputs, n));
    // The hyperparameters as f32 constants hold them; step t = 10.
    let (lr, beta1, beta2, eps) = (
        f32_const(1e-3),
        f32_const(0.9),
        f32_const(0.999),
        f32_const(1e-8),
    );
    let (one_minus_beta1, one_minus_beta2) = (f32_const(0.1), f32_const(0.001));
    let bias_correction1 = f32_const(1.0 - 0.9f64.powi(10));
    let bias_correction2 = f32_const(1.0 - 0.999f64.powi(10));
    let (mut param_new, mut m_new, mut v_new) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..param.len() {
        let mk = beta1 * m[k] + one_minus_beta1 * grad[k];
        let vk = beta2 * v[k] + one_minus_beta2 * grad[k] * grad[k];
        let m_hat = mk / bias_correction1;
        let v_hat = vk / bias_correction2;
        param_new.push(param[k] - lr * m_hat / (v_hat.sqrt() + eps));
        m_new.push(mk);
        v_new.push(vk);
    }
    assert_close("adam m_new", &out["m_new"], &shape, &m_new);
    assert_close("adam v_new", &out["v_new"], &shape, &v_new);
    assert_close("adam param_new", &out["param_new"], &shape, &param_new);
}

/// The README names every example with a line of its own (`- `name.ron`: …`), so a new
/// example cannot ship unlisted and a removed one cannot stay listed.
#[test]
fn the_readme_lists_every_example_and_no_other() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md is readable");
    let listed: Vec<String> = readme
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("- `"))
        .filter_map(|rest| rest.split_once(".ron`:").map(|(name, _)| name.to_string()))
        .collect();
    let shipped: Vec<String> = example_files().iter().map(|p| stem(p)).collect();
    assert_eq!(listed, shipped, "README's example list against examples/");
}
