//! Values the stored weights alone determine, computed once (`fusebox::hoist`): a batch norm
//! folded into a convolution's weights, an RMS norm's learned weight folded into the next
//! product's, each run on the CPU backend and compared with the reference (and PyTorch's
//! output for the exported block); a run that replaces a folded weight computes the folded
//! values again; and a graph whose weights are not stored keeps the scales in the epilogue.

use fusebox::model::{Backend, CompileOptions, Model};
use fusebox::optimize::{Options, optimize};
use fusebox::rules::RuleSet;
use fusebox::tensor::Tensor;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[track_caller]
fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.values(), want.values());
    let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= rtol * scale,
            "{what}: element {i} is {a}, the reference gives {b}"
        );
    }
}

fn one(name: &str, value: Tensor) -> BTreeMap<String, Tensor> {
    BTreeMap::from([(name.to_string(), value)])
}

/// The reference evaluator's result for `model`'s graph on its stored values with `given`
/// laid over them.
fn reference(model: &Model, given: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    let mut values = model.stored().clone();
    values.extend(given.clone());
    fusebox::eval::evaluate(model.graph(), &model.rules().ops, &values)
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn batch_norm_folds_into_the_convolution_weights_and_matches_pytorch() {
    let rules = RuleSet::defaults();
    let dir = repo().join("tests/onnx/cnn");
    // The dynamo exporter folds eval-mode batch norms into the convolutions itself; the
    // TorchScript one keeps them as BatchNormalization nodes, which the rules fold.
    for (exporter, folds) in [("ts", true), ("dynamo", false)] {
        let model =
            Model::load(&dir.join(format!("resnet_block.{exporter}.onnx")), &rules).unwrap();
        let mut compiled = model
            .compile(Backend::Cpu, &CompileOptions::default())
            .unwrap();
        let count = compiled.kernels().unwrap();
        assert_eq!((count.kernels, count.library_calls), (0, 2), "{exporter}");
        let x = Tensor::read_npy(&dir.join("resnet_block.in.x.npy")).unwrap();
        let torch = Tensor::read_npy(&dir.join("resnet_block.out.0.npy")).unwrap();
        let out = compiled.run(&one("x", x)).unwrap();
        let y = out.values().next().unwrap();
        assert_close(&format!("{exporter}: the block"), y, &torch, 1e-5);
        if !folds {
            continue;
        }
        let report = compiled.report().unwrap();
        // Both convolutions read folded weights: the batch norms' scales are in them, and
        // no kernel runs besides the two products (their shifts, the residual and the ReLUs
        // are their epilogues).
        let folded: Vec<&str> = report.hoisted.iter().map(|h| h.name.as_str()).collect();
        for conv in ["conv1.weight.folded", "conv2.weight.folded"] {
            assert!(folded.contains(&conv), "{exporter}: hoisted {folded:?}");
        }
        let weight = report
            .hoisted
            .iter()
            .find(|h| h.name == "conv1.weight.folded")
            .unwrap();
        assert!(
            weight.reads.iter().any(|r| r.contains("running_var")),
            "{exporter}: {weight:?}"
        );
        for rule in [
            "normalize-affine",
            "reshape-mul-broadcast",
            "matmul-row-scale-in",
        ] {
            assert!(
                report.rules.contains_key(rule),
                "{exporter}: {rule} did not fire"
            );
        }
    }
}

/// The block's two convolutions read their images through zero padding: in f32 from slabs
/// the GEMM fills per block, under AMP (bf16) from a padded image the CPU backend keeps from
/// one product to the next and from run to run, copying only its interior each time. Runs on
/// other inputs, and then on the first again, still give the reference's and PyTorch's values
/// (f32), and the very bits a freshly compiled block gives (both): a border written by
/// anything would show, the second input being large and positive.
#[test]
fn a_block_run_again_on_other_inputs_reads_zeros_around_its_images() {
    let rules = RuleSet::defaults();
    let dir = repo().join("tests/onnx/cnn");
    let model = Model::load(&dir.join("resnet_block.ts.onnx"), &rules).unwrap();
    let x = Tensor::read_npy(&dir.join("resnet_block.in.x.npy")).unwrap();
    let torch = Tensor::read_npy(&dir.join("resnet_block.out.0.npy")).unwrap();
    let shifted: Vec<f64> = x.values().iter().map(|v| 3.0 * v.abs() + 100.0).collect();
    let other = Tensor::from_values(fusebox::dtype::DType::F32, x.shape(), shifted).unwrap();
    let want = reference(&model, &one("x", other.clone()));
    for amp in [None, Some("bf16")] {
        let options = CompileOptions {
            amp: amp.map(str::to_string),
            ..CompileOptions::default()
        };
        let mut compiled = model.compile(Backend::Cpu, &options).unwrap();
        let mut fresh = model.compile(Backend::Cpu, &options).unwrap();
        let mut outputs = Vec::new();
        for input in [x.clone(), other.clone(), x.clone()] {
            let out = compiled.run(&one("x", input)).unwrap();
            outputs.push(out.values().next().unwrap().clone());
        }
        let first_other = fresh.run(&one("x", other.clone())).unwrap();
        let bits = |t: &Tensor| t.values().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&outputs[1]),
            bits(first_other.values().next().unwrap()),
            "{amp:?}"
        );
        assert_eq!(bits(&outputs[2]), bits(&outputs[0]), "{amp:?}");
        if amp.is_none() {
            assert_close("run 0", &outputs[0], &torch, 1e-5);
            assert_close("run 1", &outputs[1], want.values().next().unwrap(), 1e-5);
        }
    }
}

#[test]
fn a_norms_weight_folds_into_the_next_products_weight() {
    let rules = RuleSet::defaults();
    let model = Model::load(&repo().join("book/examples/hoist/rms_linear.ron"), &rules).unwrap();
    let mut compiled = model
        .compile(Backend::Cpu, &CompileOptions::default())
        .unwrap();
    let report = compiled.report().unwrap();
    assert_eq!(report.hoisted.len(), 1, "{:?}", report.hoisted);
    assert_eq!(report.hoisted[0].name, "g.folded");
    assert_eq!(report.hoisted[0].reads, ["g", "w"]);
    assert!(report.rules.contains_key("matmul-column-scale-in"));
    // One kernel (the rows' scales) and the product, which reads x as it is.
    let count = compiled.kernels().unwrap();
    assert_eq!((count.kernels, count.library_calls), (1, 1));
    let x = fusebox::eval::random_input(model.graph(), 0, 3);
    let given = one("x", x);
    let want = reference(&model, &given);
    let got = compiled.run(&given).unwrap();
    assert_close("rms_linear", &got["y"], &want["y"], 1e-5);
}

/// A run that gives its own value for a weight the folded values are made of computes them
/// again from it, for that run only; the next run without it is back on the stored value.
#[test]
fn a_run_that_replaces_a_folded_weight_computes_it_again() {
    let rules = RuleSet::defaults();
    let model = Model::load(&repo().join("book/examples/hoist/rms_linear.ron"), &rules).unwrap();
    let mut compiled = model
        .compile(Backend::Cpu, &CompileOptions::default())
        .unwrap();
    let x = fusebox::eval::random_input(model.graph(), 0, 4);
    let g = Tensor::from_values(
        fusebox::dtype::DType::F32,
        &[256],
        (0..256).map(|i| 2.0 - (i % 7) as f64 / 3.0).collect(),
    )
    .unwrap();
    let stored_run = one("x", x.clone());
    let mut replaced = stored_run.clone();
    replaced.insert("g".into(), g);
    for (what, given) in [
        ("stored g", &stored_run),
        ("given g", &replaced),
        ("stored g again", &stored_run),
    ] {
        let want = reference(&model, given);
        let got = compiled.run(given).unwrap();
        assert_close(what, &got["y"], &want["y"], 1e-5);
    }
    // The two references differ, so the comparison above tells them apart.
    let (a, b) = (reference(&model, &stored_run), reference(&model, &replaced));
    assert!(a["y"].values() != b["y"].values());
}

/// Without stored values nothing is fixed: a scale on a weight would cost a kernel over the
/// weight on every run (cheaper or dearer than the kernel it saves depending on the batch), so
/// the rules that move it there do not apply and nothing is hoisted.
#[test]
fn weights_given_on_every_run_are_not_folded() {
    let rules = RuleSet::defaults();
    let model = Model::load(&repo().join("book/examples/hoist/rms_linear.ron"), &rules).unwrap();
    let plain = optimize(model.graph(), &rules, &Options::default()).unwrap();
    assert!(plain.hoist.is_none());
    assert!(plain.report.hoisted.is_empty());
    let fixed: BTreeSet<String> = model.stored().keys().cloned().collect();
    let folded = optimize(
        model.graph(),
        &rules,
        &Options {
            fixed,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(folded.hoist.is_some());
    assert!(folded.report.cost_after < plain.report.cost_after);
    // The saved graph still computes everything from the inputs alone.
    assert_eq!(folded.graph.inputs.len(), model.graph().inputs.len());
}
