//! Automatic differentiation: the default gradient templates against finite differences,
//! planted wrong templates caught, and gradients of single ops, of every example and of random
//! graphs against central differences of the reference evaluator in f64; the LSTM cell's
//! generated backward against the hand-written one; fusion, AMP and the forward/backward split.

use crate::common;

use common::random_graph;
use fusebox::attr::AttrValue;
use fusebox::autodiff::split::split;
use fusebox::autodiff::verify::{
    Probe, TEMPLATE_TOLERANCE, agreement, agreement_at, check_templates, in_f64,
};
use fusebox::autodiff::{Wrt, grad};
use fusebox::dtype::DType;
use fusebox::eval::{Tensors, evaluate, evaluate_all};
use fusebox::graph::{self, Graph, GraphBuilder};
use fusebox::optimize::{Options, optimize};
use fusebox::rules::{GradientRules, RuleSet};
use fusebox::tensor::Tensor;
use proptest::prelude::*;
use std::path::Path;

fn rules() -> &'static RuleSet {
    random_graph::rules()
}

fn example(name: &str) -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    graph::file::load(&path, &rules().ops).unwrap().0
}

#[test]
fn every_default_gradient_template_agrees_with_finite_differences() {
    let rules = rules();
    let report = check_templates(&rules.ops, &rules.gradients);
    for check in &report.instances {
        assert!(
            matches!(check.outcome, Ok(e) if e <= TEMPLATE_TOLERANCE),
            "{}: {:?}",
            check.instance,
            check.outcome
        );
    }
    assert!(
        report.unused.is_empty(),
        "unused templates: {:?}",
        report.unused
    );
    assert!(report.passed());
    assert_eq!(report.instances.len(), rules.gradients.checks().len());
    assert!(report.instances.len() >= 25);
}

/// The default file with one template changed by a textual substitution.
fn planted(from: &str, to: &str) -> GradientRules {
    let text = fusebox::rules::gradients::DEFAULT_GRADIENTS;
    assert!(text.contains(from), "`{from}` is in the default templates");
    let wrong = text.replacen(from, to, 1);
    GradientRules::load_str(&wrong, "planted.ron", &rules().ops).unwrap()
}

#[test]
fn planted_wrong_templates_are_caught() {
    let cases = [
        // A transpose's gradient transposed forward again instead of back.
        (
            "\"perm\": InversePerm(Fact(\"perm\"))",
            "\"perm\": Fact(\"perm\")",
            "transpose",
        ),
        // A mean that forgets to divide by the count.
        (
            "args: [\"g_spread\", \"count\"]",
            "args: [\"g_spread\", \"g_spread\"]",
            "mean",
        ),
        // A matmul gradient with the operands in the wrong order (a^T g read as g a^T).
        ("args: [\"a_t\", \"g\"]", "args: [\"g\", \"a_t\"]", "matmul"),
        // Concat segments read from the wrong offset.
        ("\"start\": Fact(\"offset\")", "\"start\": Int(0)", "concat"),
        // Tied maxima each given the whole gradient.
        (
            "args: [\"g_kept\", \"ties\"]",
            "args: [\"g_kept\", \"g_kept\"]",
            "reduce_max",
        ),
        // A strided slice's gradient placed without its gaps.
        ("Sub(Fact(\"step\"), Int(1))", "Int(0)", "slice"),
    ];
    let catalogue = &rules().ops;
    for (from, to, op) in cases {
        let report = check_templates(catalogue, &planted(from, to));
        assert!(!report.passed(), "the planted {op} template passed");
        let failing: Vec<&str> = report
            .instances
            .iter()
            .filter(|c| !matches!(c.outcome, Ok(e) if e <= report.tolerance))
            .map(|c| c.instance.as_str())
            .collect();
        assert!(
            failing.iter().all(|i| i.starts_with(op)) && !failing.is_empty(),
            "{op}: failing instances {failing:?}"
        );
    }
}

#[test]
fn a_template_no_check_reaches_is_reported() {
    let text = fusebox::rules::gradients::DEFAULT_GRADIENTS;
    let without = text.replace("Check(op: \"transpose\"", "Check(op: \"reshape\"");
    let templates = GradientRules::load_str(&without, "t.ron", &rules().ops);
    // The transpose checks became reshape checks with a `perm` reshape does not take: the
    // file still loads (checks are data), but the instances fail and the template is unused.
    let report = check_templates(&rules().ops, &templates.unwrap());
    assert!(report.unused.iter().any(|(op, _, _)| op == "transpose"));
    assert!(!report.passed());
}

/// Every pointwise op of the catalogue with derivatives, with broadcasting operands ([3, 1]
/// against [1, 4]), against finite differences element by element. Operands that must be
/// positive (log, sqrt, pow's base, a divisor) go through `exp` first.
#[test]
fn every_derivative_formula_differentiates_through_its_gradient_op() {
    let rules = rules();
    let positive = |op: &str, operand: &str| {
        matches!(
            (op, operand),
            ("log" | "sqrt" | "rsqrt" | "log1p", _) | ("pow", "a") | ("div", "b")
        )
    };
    let mut checked = 0;
    for op in rules.ops.ops() {
        if op.derivatives.is_empty() || op.spec.kind != fusebox::rules::OpKind::Pointwise {
            continue;
        }
        let mut b = GraphBuilder::new(op.name());
        let shapes: [&[usize]; 3] = [&[3, 1], &[1, 4], &[3, 4]];
        let mut args = Vec::new();
        for (i, operand) in op.spec.operands.iter().enumerate() {
            let accepts_bool =
                op.spec.accepts.get(operand) == Some(&fusebox::rules::DtypeClass::Bool);
            let dtype = if accepts_bool {
                DType::Bool
            } else {
                DType::F64
            };
            let x = b.input(&format!("x{i}"), dtype, shapes[i % 3]);
            args.push(if positive(op.name(), operand) {
                b.op(&format!("pos{i}"), "exp", &[&x])
            } else {
                x
            });
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let attrs: Vec<(&str, fusebox::attr::AttrValue)> = match op.name() {
            "cast" => vec![("dtype", DType::F64.into())],
            "clamp" => vec![("min", (-0.5).into()), ("max", 0.5.into())],
            _ => vec![],
        };
        let y = b.op_with("y", op.name(), &refs, &attrs);
        let graph = b.finish(&[&y]);
        let (_, agreement) = agreement(&graph, &rules.ops, &rules.gradients, Probe::Elementwise, 7)
            .unwrap_or_else(|e| panic!("{}: {e}", op.name()));
        assert!(
            agreement.worst < 1e-6 && agreement.singular == 0,
            "{}: worst disagreement {} at {}",
            op.name(),
            agreement.worst,
            agreement.at
        );
        checked += 1;
    }
    assert!(checked >= 25, "only {checked} ops checked");
}

/// Asserts that every gradient element of `graph`, made f64, agrees with the central
/// difference; returns the joint graph.
fn agrees_elementwise_in_f64(
    graph: &Graph,
    rules: &RuleSet,
    seed: u64,
) -> fusebox::autodiff::JointGraph {
    let (joint, agreement) = agreement(
        &in_f64(graph),
        &rules.ops,
        &rules.gradients,
        Probe::Elementwise,
        seed,
    )
    .unwrap();
    assert!(
        agreement.worst < 1e-6 && agreement.singular == 0,
        "{}: {agreement:?}",
        graph.name
    );
    joint
}

/// A user-declared op (the book's ELU, RON only) is differentiable with no Rust.
#[test]
fn a_user_declared_op_is_differentiable() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("book/examples/elu");
    let rules = RuleSet::load_dir(&dir.join("rules")).unwrap();
    let graph = graph::file::load(&dir.join("graph.ron"), &rules.ops)
        .unwrap()
        .0;
    let joint = agrees_elementwise_in_f64(&graph, &rules, 3);
    assert!(joint.graph.nodes.iter().any(|n| n.op == "elu.grad.x"));
}

/// `graph` with every size divided by `factor`: each integer in an input shape or an integer
/// attribute that is a multiple of `factor` (at least twice it) becomes that integer over
/// `factor`, everything else stays. Sizes the examples relate linearly (a chunk's slice bounds
/// and its operand's width, a `sum_to_size` target and the summed axis) stay related, and axes
/// (small integers) are untouched. The derivative templates do not depend on sizes, and the
/// reference evaluator in f64 checks a 4096-wide example as well at 64 wide, in a
/// four-thousandth of the time.
fn shrunk(graph: &Graph, factor: i64) -> Graph {
    let small = |d: i64| {
        if d >= 2 * factor && d % factor == 0 {
            d / factor
        } else {
            d
        }
    };
    let mut graph = graph.clone();
    for input in &mut graph.inputs {
        for d in &mut input.shape {
            *d = small(*d as i64) as usize;
        }
    }
    for node in &mut graph.nodes {
        for value in node.attrs.values_mut() {
            match value {
                AttrValue::Int(i) => *i = small(*i),
                AttrValue::Ints(is) => is.iter_mut().for_each(|i| *i = small(*i)),
                _ => {}
            }
        }
    }
    graph
}

#[test]
fn shrinking_keeps_an_example_s_sizes_related() {
    let graph = shrunk(&example("lstm_cell_full.ron"), 64);
    let shape = |name: &str| graph.input(name).unwrap().shape.clone();
    assert_eq!(shape("x"), vec![4, 8]);
    assert_eq!(shape("W_ih"), vec![8, 64]);
    let bounds: Vec<_> = graph
        .nodes
        .iter()
        .filter(|n| n.op == "slice")
        .map(|n| (n.attrs["start"].clone(), n.attrs["end"].clone()))
        .collect();
    assert_eq!(
        bounds,
        [(0, 16), (16, 32), (32, 48), (48, 64)]
            .map(|(a, b)| (AttrValue::Int(a), AttrValue::Int(b)))
    );
    // Still a well-formed graph of the same ops.
    fusebox::dag::Dag::from_graph(&graph, &rules().ops).unwrap();
}

/// Every example's gradients, along random directions, in f64, at a 64th of its sizes (see
/// [`shrunk`]).
#[test]
fn every_example_differentiates_correctly() {
    let rules = rules();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".ron"))
        .collect();
    names.sort();
    assert!(names.len() >= 9);
    for name in names {
        let graph = in_f64(&shrunk(&example(&name), 64));
        let inputs = positive_values(&graph, 11);
        let (joint, agreement) = agreement_at(
            &graph,
            &rules.ops,
            &rules.gradients,
            Probe::Directions(2),
            11,
            &inputs,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !joint.gradients.is_empty(),
            "{name}: nothing differentiated"
        );
        // One direction sums millions of products, so the central difference carries
        // rounding of about 1e-6 relative; a wrong gradient is off by order 1.
        assert!(
            agreement.worst < 1e-4 && agreement.singular == 0,
            "{name}: {agreement:?}"
        );
    }
}

/// lstm_cell at the backward example's size.
fn small_lstm() -> Graph {
    let mut graph = example("lstm_cell.ron");
    for input in &mut graph.inputs {
        input.shape = vec![256, 1024];
    }
    graph
}

fn random_values(graph: &Graph, seed: u64) -> Tensors {
    fusebox::eval::random_inputs(graph, seed)
}

/// The values of `all` that are inputs of `graph`.
fn inputs_of(graph: &Graph, all: &Tensors) -> Tensors {
    graph
        .inputs
        .iter()
        .map(|i| (i.name.clone(), all[&i.name].clone()))
        .collect()
}

/// Seeded values in [0.1, 1.1] for every float input (integers and bools as drawn): inside
/// the domain of every example (variances, square roots, logs).
fn positive_values(graph: &Graph, seed: u64) -> Tensors {
    random_values(graph, seed)
        .into_iter()
        .map(|(name, t)| {
            if !t.dtype.is_float() {
                return (name, t);
            }
            let values = t.values().iter().map(|v| 0.1 + v.abs() / 3.0).collect();
            (
                name,
                Tensor::from_values(t.dtype, t.shape(), values).unwrap(),
            )
        })
        .collect()
}

#[test]
fn lstm_cell_gradients_equal_the_hand_written_backward() {
    let rules = rules();
    let forward = small_lstm();
    let joint = grad(&forward, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
    let mut inputs = random_values(&forward, 5);
    let cotangents = random_values(&example("lstm_cell_backward.ron"), 6);
    inputs.insert("grad_hy".into(), cotangents["grad_hy"].clone());
    inputs.insert("grad_cy".into(), cotangents["grad_cy"].clone());
    let generated = evaluate(&joint.graph, &rules.ops, &inputs).unwrap();

    // The hand-written backward takes the gate activations and cy the forward computed.
    let values = evaluate_all(&forward, &rules.ops, &inputs_of(&forward, &inputs)).unwrap();
    let hand = example("lstm_cell_backward.ron");
    let mut hand_inputs = Tensors::new();
    for name in ["i", "f", "g", "o", "cx", "cy", "grad_hy", "grad_cy"] {
        let value = values.get(name).or(inputs.get(name)).unwrap();
        hand_inputs.insert(name.into(), value.clone());
    }
    let expected = evaluate(&hand, &rules.ops, &hand_inputs).unwrap();
    // The hand-written backward returns the gate gradients as grad_gates, [B, 4H], gate k
    // in columns k·H..(k+1)·H (PyTorch's layout); grad_cx on its own.
    let gates = &expected["grad_gates"];
    let (batch, width) = (gates.shape()[0], gates.shape()[1]);
    let segment = |k: usize| -> Vec<f64> {
        let all = gates.values();
        let hidden = width / 4;
        (0..batch)
            .flat_map(|r| all[r * width + k * hidden..r * width + (k + 1) * hidden].to_vec())
            .collect()
    };
    for (k, name) in [
        "grad_ingate",
        "grad_forgetgate",
        "grad_cellgate",
        "grad_outgate",
        "grad_cx",
    ]
    .into_iter()
    .enumerate()
    {
        let a = generated[name].values();
        let b = if k < 4 {
            segment(k)
        } else {
            expected[name].values()
        };
        assert_eq!(a.len(), b.len(), "{name}");
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0.0, f64::max);
        // Both in f32, with the formulas grouped differently: a few ulp.
        assert!(worst < 1e-6, "{name}: {worst}");
    }
}

#[test]
fn lstm_cell_joint_graph_fuses_into_at_most_three_kernels() {
    let rules = rules();
    let joint = grad(
        &example("lstm_cell.ron"),
        &rules.ops,
        &rules.gradients,
        &Wrt::AllFloatInputs,
    )
    .unwrap();
    let optimized = optimize(&joint.graph, rules, &Options::default()).unwrap();
    let kernels = optimized.report.kernels.len();
    assert!(kernels <= 3, "{kernels} kernels");
    assert_eq!(joint.graph.outputs.len(), 2 + 5);
}

/// A broadcast bias: its gradient is summed over the batch (sum_to_size), which ends the
/// kernel that computes the pointwise gradient, as the PyTorch fuser hoists it.
#[test]
fn broadcast_operands_get_gradients_summed_to_their_shape() {
    let rules = rules();
    let mut b = GraphBuilder::new("bias_tanh");
    let x = b.input("x", DType::F32, &[64, 32]);
    let bias = b.input("bias", DType::F32, &[32]);
    let z = b.op("z", "add", &[&x, &bias]);
    let y = b.op("y", "tanh", &[&z]);
    let graph = b.finish(&[&y]);
    let joint = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
    let types = graph::check(&joint.graph, &rules.ops).unwrap();
    assert_eq!(types["grad_bias"].shape, vec![32]);
    assert!(joint.graph.nodes.iter().any(|n| n.op == "sum_to_size"));
    agrees_elementwise_in_f64(&graph, rules, 1);
    let optimized = optimize(&joint.graph, rules, &Options::default()).unwrap();
    assert!(
        optimized.report.kernels.len() <= 2,
        "{}",
        optimized.report.kernels.len()
    );
}

#[test]
fn names_that_would_collide_get_unique_ones_and_are_reported() {
    let rules = rules();
    let mut b = GraphBuilder::new("collide");
    let x = b.input("x", DType::F32, &[4]);
    let grad_x = b.input("grad_x", DType::F32, &[4]);
    let y = b.op("y", "mul", &[&x, &grad_x]);
    let grad_y = b.op("grad_y", "exp", &[&y]);
    let graph = b.finish(&[&grad_y]);
    let joint = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
    assert_eq!(joint.cotangents, [("grad_y".into(), "grad_grad_y".into())]);
    assert_eq!(
        joint.gradients,
        [
            ("x".into(), "grad_x_2".into()),
            ("grad_x".into(), "grad_grad_x".into())
        ]
    );
    assert_eq!(joint.renamed, [("grad_x".into(), "grad_x_2".into())]);
    graph::check(&joint.graph, &rules.ops).unwrap();
}

#[test]
fn inputs_the_outputs_ignore_get_zero_gradients_and_outputs_that_are_inputs_pass_theirs() {
    let rules = rules();
    let mut b = GraphBuilder::new("unused");
    let x = b.input("x", DType::F32, &[2, 3]);
    let unused = b.input("unused", DType::F16, &[5]);
    let n = b.input("n", DType::I32, &[2, 3]);
    let y = b.op("y", "neg", &[&x]);
    let graph = b.finish(&[&y, &x, &n]);
    let _ = unused;
    let joint = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
    // The integer output gets no cotangent, the integer input no gradient.
    assert_eq!(joint.cotangents.len(), 2);
    assert_eq!(joint.gradients.len(), 2);
    let mut inputs = random_values(&graph, 2);
    let gy = Tensor::from_values(DType::F32, &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let gx = Tensor::from_values(DType::F32, &[2, 3], vec![0.5; 6]).unwrap();
    inputs.insert("grad_y".into(), gy);
    inputs.insert("grad_x".into(), gx);
    let out = evaluate(&joint.graph, &rules.ops, &inputs).unwrap();
    // d/dx of (-x, x): -gy + gx.
    assert_eq!(
        out["grad_x_2"].values(),
        vec![-0.5, -1.5, -2.5, -3.5, -4.5, -5.5]
    );
    assert_eq!(out["grad_unused"].values(), vec![0.0; 5]);
    assert_eq!(out["grad_unused"].dtype, DType::F16);
}

#[test]
fn wrt_must_name_floating_point_inputs() {
    let rules = rules();
    let graph = example("lstm_cell.ron");
    let err = grad(
        &graph,
        &rules.ops,
        &rules.gradients,
        &Wrt::Inputs(vec!["ingat".into()]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`ingat`") && err.contains("ingate"), "{err}");
    let joint = grad(
        &graph,
        &rules.ops,
        &rules.gradients,
        &Wrt::Inputs(vec!["cx".into()]),
    )
    .unwrap();
    assert_eq!(joint.gradients, [("cx".into(), "grad_cx".into())]);
}

/// AMP composes both ways: the gradient of an AMP graph is the gradient through its casts
/// (in f16, close to the f32 gradient), and AMP applied to a gradient graph runs it in f16.
#[test]
fn amp_composes_with_gradients() {
    let rules = rules();
    let graph = example("mlp_block.ron");
    let f32_joint = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
    let policy = rules.amp.policy("f16").unwrap();
    let amp_graph = fusebox::amp::insert_casts(&graph, &rules.ops, policy).unwrap();
    assert!(amp_graph.casts_inserted > 0);
    let amp_joint = grad(
        &amp_graph.graph,
        &rules.ops,
        &rules.gradients,
        &Wrt::AllFloatInputs,
    )
    .unwrap();
    let joint_then_amp = fusebox::amp::insert_casts(&f32_joint.graph, &rules.ops, policy).unwrap();
    assert!(joint_then_amp.casts_inserted > 0);
    let mut inputs = positive_values(&graph, 9);
    let forward_values = evaluate(&graph, &rules.ops, &inputs).unwrap();
    for (output, cotangent) in &f32_joint.cotangents {
        let t = &forward_values[output];
        let u = Tensor::from_values(
            t.dtype,
            t.shape(),
            (0..t.values().len())
                .map(|i| ((i % 7) as f64 - 3.0) / 4.0)
                .collect(),
        )
        .unwrap();
        inputs.insert(cotangent.clone(), u);
    }
    let reference = evaluate(&f32_joint.graph, &rules.ops, &inputs).unwrap();
    for candidate in [&amp_joint.graph, &joint_then_amp.graph] {
        let values = evaluate(candidate, &rules.ops, &inputs).unwrap();
        for (_, name) in &f32_joint.gradients {
            let (a, b) = (values[name].values(), reference[name].values());
            assert_eq!(values[name].dtype, DType::F32);
            let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(worst / scale < 2e-2, "{name}: {worst} (scale {scale})");
        }
    }
}

/// The split halves, run one after the other, compute exactly what the joint graph does; the
/// LSTM cell's backward recomputes its pointwise values from the saved inputs and saves less
/// than every value it reads.
#[test]
fn forward_and_backward_halves_compute_the_joint_graph() {
    let rules = rules();
    for graph in [
        small_lstm(),
        example("mlp_block.ron"),
        example("layernorm_tail.ron"),
    ] {
        let joint = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
        let halves = split(&graph, &joint, &rules.ops).unwrap();
        let mut inputs = positive_values(&joint.graph, 4);
        let expected = evaluate(&joint.graph, &rules.ops, &inputs).unwrap();
        let forward = evaluate(
            &halves.forward,
            &rules.ops,
            &inputs_of(&halves.forward, &inputs),
        )
        .unwrap();
        for v in &halves.saved {
            inputs.insert(v.clone(), forward.get(v).or(inputs.get(v)).unwrap().clone());
        }
        let backward = evaluate(
            &halves.backward,
            &rules.ops,
            &inputs_of(&halves.backward, &inputs),
        )
        .unwrap();
        for (_, name) in &joint.gradients {
            assert_eq!(backward[name], expected[name], "{}: {name}", graph.name);
        }
        for output in &graph.outputs {
            assert_eq!(forward[output], expected[output]);
        }
        assert!(
            halves.saved_bytes <= halves.save_all_bytes,
            "{}",
            graph.name
        );
    }
    let graph = small_lstm();
    let joint = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
    let halves = split(&graph, &joint, &rules.ops).unwrap();
    assert_eq!(
        halves.saved,
        ["ingate", "forgetgate", "cellgate", "outgate", "cx"]
    );
    assert!(halves.saved_bytes < halves.save_all_bytes);
}

/// A matrix product is never recomputed: its result is saved when the backward needs it.
#[test]
fn matmul_results_are_saved_not_recomputed() {
    let rules = rules();
    let mut b = GraphBuilder::new("mm_tanh");
    let x = b.input("x", DType::F32, &[16, 8]);
    let w = b.input("w", DType::F32, &[8, 4]);
    let h = b.op("h", "matmul", &[&x, &w]);
    let y = b.op("y", "tanh", &[&h]);
    let s = b.op("s", "mul", &[&y, &h]);
    let graph = b.finish(&[&s]);
    let joint = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
    let halves = split(&graph, &joint, &rules.ops).unwrap();
    assert!(
        halves.saved.contains(&"h".to_string()),
        "{:?}",
        halves.saved
    );
    assert!(!halves.recomputed.contains(&"h".to_string()));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: random_graph::cases(64), ..ProptestConfig::default() })]

    /// Random graphs (broadcasting, [N,1], size-1 and size-0 dims, reductions, layout ops,
    /// matmul, where, casts) made f64: every gradient element equals the central difference.
    /// Graphs with a non-finite value anywhere (a log of a negative) are skipped: their
    /// gradients are NaN by the same rules as PyTorch's.
    #[test]
    fn random_graph_gradients_equal_finite_differences(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3))],
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::step(true), 2..10),
        seed in 0u64..1000,
    ) {
        let rules = rules();
        let Some(graph) = random_graph::build(&rules.ops, dims, &inputs, &steps) else { return Ok(()) };
        let graph = in_f64(&graph);
        let inputs = random_values(&graph, seed);
        let values = evaluate_all(&graph, &rules.ops, &inputs);
        prop_assume!(values.is_ok_and(|v| v.values().all(|t| t.values().iter().all(|x| x.is_finite() && x.abs() < 1e6))));
        match agreement_at(&graph, &rules.ops, &rules.gradients, Probe::Elementwise, seed, &inputs) {
            // A singular point (sqrt at 0 times a zero derivative) is NaN here as in PyTorch.
            Ok((_, a)) if a.singular > 0 => prop_assume!(false),
            Ok((_, a)) => prop_assert!(a.worst < 1e-4, "{a:?}\n{}", graph::file::to_ron(&graph)),
            Err(e) => prop_assert!(false, "{e}\n{}", graph::file::to_ron(&graph)),
        }
    }
}

fn fusebox(args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code().is_some_and(|c| c == 0 || c == 1),
        "{text}"
    );
    (output.status.success(), text)
}

#[test]
fn grad_command_writes_a_graph_the_other_commands_take() {
    let dir = common::scratch("autodiff", "grad_cli");
    let out = dir.join("joint.ron");
    let (ok, text) = fusebox(&[
        "grad",
        "examples/mlp_block.ron",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("gradients: "), "{text}");
    let (ok, text) = fusebox(&["check", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let run_dir = dir.join("values");
    let (ok, text) = fusebox(&[
        "run",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
        "--random-inputs",
        "--out",
        run_dir.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let split_dir = dir.join("split");
    let (ok, text) = fusebox(&[
        "grad",
        "examples/mlp_block.ron",
        "--split",
        split_dir.to_str().unwrap(),
    ]);
    assert!(ok && text.contains("saved: "), "{text}");
    for half in ["forward.ron", "backward.ron"] {
        let (ok, text) = fusebox(&["check", split_dir.join(half).to_str().unwrap()]);
        assert!(ok, "{half}: {text}");
    }
}

#[test]
fn grad_command_errors_are_clear() {
    let dir = common::scratch("autodiff", "grad_cli_errors");
    let out = dir.join("joint.ron");
    let out = out.to_str().unwrap();
    let (ok, text) = fusebox(&[
        "grad",
        "examples/lstm_cell.ron",
        "--wrt",
        "cx,nope",
        "--out",
        out,
    ]);
    assert!(!ok);
    assert!(
        text.contains("`nope`") && text.contains("not an input"),
        "{text}"
    );
    // An op with no derivative for an operand the outputs depend on.
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("ops.ron"),
        r#"[Op(name: "cube", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]), formula: "x * x * x")]"#,
    )
    .unwrap();
    let graph = dir.join("cube.ron");
    std::fs::write(
        &graph,
        r#"Graph(name: "c", inputs: [Input(name: "x", dtype: "f32", shape: [3])],
           nodes: [Node(name: "y", op: "cube", args: ["x"])], outputs: ["y"])"#,
    )
    .unwrap();
    let (ok, text) = fusebox(&[
        "grad",
        graph.to_str().unwrap(),
        "--rules",
        rules.to_str().unwrap(),
        "--out",
        out,
    ]);
    assert!(!ok);
    assert!(
        text.contains("`y`") && text.contains("declares no derivative for operand `x`"),
        "{text}"
    );
    assert!(!Path::new(out).exists(), "nothing written on failure");
}

/// Gradients computed in f16 and bf16 (every op rounding to its dtype, as eager frameworks do)
/// stay within those dtypes' precision of the f64 gradient on the same input values.
#[test]
fn half_precision_gradients_are_within_their_dtypes_precision() {
    let rules = rules();
    for (dtype, tolerance) in [(DType::F16, 1e-2), (DType::BF16, 6e-2), (DType::F32, 1e-5)] {
        for name in ["lstm_cell.ron", "gelu_bias.ron", "layernorm_tail.ron"] {
            let mut graph = example(name);
            for input in &mut graph.inputs {
                if input.dtype.is_float() {
                    input.dtype = dtype;
                }
                // Small shapes: the point is the arithmetic, not the size.
                input.shape = input.shape.iter().map(|&d| d.min(48)).collect();
            }
            let Ok(_) = graph::check(&graph, &rules.ops) else {
                panic!("{name} at reduced size does not check");
            };
            let native = grad(&graph, &rules.ops, &rules.gradients, &Wrt::AllFloatInputs).unwrap();
            let wide_graph = in_f64(&graph);
            let wide = grad(
                &wide_graph,
                &rules.ops,
                &rules.gradients,
                &Wrt::AllFloatInputs,
            )
            .unwrap();
            let mut inputs = positive_values(&native.graph, 21);
            let native_out = evaluate(&native.graph, &rules.ops, &inputs).unwrap();
            for (name, t) in inputs.iter_mut() {
                if t.dtype.is_float() {
                    *t = Tensor::from_values(DType::F64, t.shape(), t.values()).unwrap();
                }
                let _ = name;
            }
            let wide_out = evaluate(&wide.graph, &rules.ops, &inputs).unwrap();
            for (_, gradient) in &native.gradients {
                let (a, b) = (native_out[gradient].values(), wide_out[gradient].values());
                assert_eq!(native_out[gradient].dtype, dtype);
                let scale = b.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                let worst = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst / scale < tolerance,
                    "{name} {dtype}: {gradient} off by {worst} (scale {scale})"
                );
            }
        }
    }
}
