//! The Rust API for whole models (`fusebox::model`): an ONNX model with stored weights and a
//! graph file with a stored value run through it, on the CPU backend and the reference
//! evaluator; what a missing input and a replaced stored value do; and the book's example,
//! which must be the module's documentation test.

use fusebox::dtype::DType;
use fusebox::model::{Backend, CompileOptions, Model};
use fusebox::rules::RuleSet;
use fusebox::tensor::Tensor;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn inputs(pairs: Vec<(&str, Tensor)>) -> BTreeMap<String, Tensor> {
    pairs
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
}

/// Values spread over [-1, 1), different for every element, so a wrong index shows.
fn ramp(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let values = (0..n)
        .map(|i| ((i * 37 % 101) as f64) / 50.5 - 1.0)
        .collect();
    Tensor::from_values(DType::F32, shape, values).unwrap()
}

#[track_caller]
fn assert_close(what: &str, got: &BTreeMap<String, Tensor>, want: &BTreeMap<String, Tensor>) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: output names"
    );
    for (name, g) in got {
        let w = &want[name];
        assert_eq!(g.shape(), w.shape(), "{what}: `{name}` shape");
        for (i, (a, b)) in g.values().iter().zip(w.values()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                "{what}: `{name}` element {i} is {a}, the reference gives {b}"
            );
        }
    }
}

#[test]
fn an_onnx_model_runs_on_its_stored_weights_alike_on_cpu_and_reference() {
    let rules = RuleSet::defaults();
    let model = Model::load(&repo().join("book/examples/onnx/mlp.onnx"), &rules).unwrap();
    let needed: Vec<&str> = model
        .inputs()
        .iter()
        .filter(|i| !model.stored().contains_key(&i.name))
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(needed, ["input0"], "the weights are stored");
    let given = inputs(vec![("input0", ramp(&[8, 32]))]);
    let options = CompileOptions::default();
    let mut cpu = model.compile(Backend::Cpu, &options).unwrap();
    let mut reference = model.compile(Backend::Reference, &options).unwrap();
    let report = cpu
        .report()
        .expect("a compiled backend reports its optimization");
    assert!(report.kernels_after <= report.kernels_before);
    assert!(reference.report().is_none());
    let got = cpu.run(&given).unwrap();
    let want = reference.run(&given).unwrap();
    assert_eq!(want.values().next().unwrap().shape(), [8, 10]);
    assert_close("mlp.onnx", &got, &want);
}

/// A graph file `y = x * w + x` whose `w` is stored in `w.npy` beside it.
fn stored_graph(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-model-api-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let w = Tensor::from_values(DType::F32, &[3], vec![2.0, -1.0, 0.5]).unwrap();
    w.write_npy(&dir.join("w.npy")).unwrap();
    let graph = r#"Graph(
    name: "scaled",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [2, 3]),
        Input(name: "w", dtype: "f32", shape: [3], value: "w.npy"),
    ],
    nodes: [
        Node(name: "xw", op: "mul", args: ["x", "w"]),
        Node(name: "y", op: "add", args: ["xw", "x"]),
    ],
    outputs: ["y"],
)"#;
    std::fs::write(dir.join("graph.ron"), graph).unwrap();
    dir.join("graph.ron")
}

fn x() -> Tensor {
    Tensor::from_values(DType::F32, &[2, 3], vec![1.0, 2.0, 3.0, -1.0, -2.0, -3.0]).unwrap()
}

#[test]
fn a_graph_file_runs_on_its_stored_value_and_a_given_value_replaces_it() {
    let rules = RuleSet::defaults();
    let model = Model::load(&stored_graph("stored"), &rules).unwrap();
    assert_eq!(model.stored()["w"].values(), [2.0, -1.0, 0.5]);
    for backend in [Backend::Cpu, Backend::Reference] {
        let mut compiled = model.compile(backend, &CompileOptions::default()).unwrap();
        let y = &compiled.run(&inputs(vec![("x", x())])).unwrap()["y"];
        assert_eq!(y.values(), [3.0, 0.0, 4.5, -3.0, 0.0, -4.5], "{backend:?}");
        let w = Tensor::from_values(DType::F32, &[3], vec![1.0, 1.0, 1.0]).unwrap();
        let y = &compiled.run(&inputs(vec![("x", x()), ("w", w)])).unwrap()["y"];
        assert_eq!(
            y.values(),
            [2.0, 4.0, 6.0, -2.0, -4.0, -6.0],
            "{backend:?}: the given `w` replaces the stored one"
        );
        // The stored `w` is lent to a run, not consumed: after a run that replaced it, and
        // after one that failed, the next run without `w` uses it again.
        let wrong = Tensor::from_values(DType::F32, &[2], vec![1.0, 1.0]).unwrap();
        assert!(
            compiled
                .run(&inputs(vec![("x", x()), ("w", wrong)]))
                .is_err()
        );
        let y = &compiled.run(&inputs(vec![("x", x())])).unwrap()["y"];
        assert_eq!(
            y.values(),
            [3.0, 0.0, 4.5, -3.0, 0.0, -4.5],
            "{backend:?}: the stored `w` is back"
        );
    }
}

#[test]
fn a_missing_input_is_an_error_that_names_it() {
    let rules = RuleSet::defaults();
    let model = Model::load(&stored_graph("missing"), &rules).unwrap();
    for backend in [Backend::Cpu, Backend::Reference] {
        let mut compiled = model.compile(backend, &CompileOptions::default()).unwrap();
        let err = compiled.run(&BTreeMap::new()).unwrap_err().to_string();
        assert!(err.contains("no value for input(s) x"), "{err}");
        let err = compiled
            .run(&inputs(vec![("x", x()), ("z", x())]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("the model has no input `z`"), "{err}");
        let err = compiled
            .run(&inputs(vec![("x", ramp(&[3, 2]))]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("shape [3, 2]"), "{err}");
    }
}

/// Runs on arrays the caller owns: the CPU backend reads and writes them in place, with the
/// stored `w` filled in; a wrong name, a missing input and a wrong output shape are errors
/// naming them; device arrays are refused by a model not compiled for CUDA.
#[test]
fn caller_owned_arrays_run_in_place_and_device_arrays_need_a_cuda_model() {
    use fusebox::model::{DeviceArray, HostArray};
    let rules = RuleSet::defaults();
    let model = Model::load(&stored_graph("host"), &rules).unwrap();
    let mut compiled = model
        .compile(Backend::Cpu, &CompileOptions::default())
        .unwrap();
    assert_eq!(compiled.device_memory(), None);
    let mut x_data = [1.0f32, 2.0, 3.0, -1.0, -2.0, -3.0];
    let mut y_data = [f32::NAN; 6];
    let array = |data: &mut [f32], shape: &[usize]| HostArray {
        dtype: DType::F32,
        shape: shape.to_vec(),
        data: data.as_mut_ptr().cast(),
    };
    let given: BTreeMap<String, HostArray> =
        [("x".to_string(), array(&mut x_data, &[2, 3]))].into();
    let out = [array(&mut y_data, &[2, 3])];
    // SAFETY: the arrays live on this stack frame for the calls, of the dtype and shapes given.
    unsafe { compiled.run_host(&given, &out) }.unwrap();
    assert_eq!(y_data, [3.0, 0.0, 4.5, -3.0, 0.0, -4.5]);
    let renamed: BTreeMap<String, HostArray> =
        [("z".to_string(), array(&mut x_data, &[2, 3]))].into();
    let err = unsafe { compiled.run_host(&renamed, &out) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("the model has no input `z`"), "{err}");
    let err = unsafe { compiled.run_host(&BTreeMap::new(), &out) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("no value for input(s) x"), "{err}");
    let short = [array(&mut y_data[..3], &[3])];
    let err = unsafe { compiled.run_host(&given, &short) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("[3]"), "{err}");

    let device = |address| DeviceArray {
        dtype: DType::F32,
        shape: vec![2, 3],
        address,
    };
    let given: BTreeMap<String, DeviceArray> = [("x".to_string(), device(0x1000))].into();
    // SAFETY: refused before any address or stream is used.
    let err =
        unsafe { compiled.run_device_arrays(&given, &[device(0x2000)], std::ptr::null_mut()) }
            .unwrap_err()
            .to_string();
    assert!(err.contains("compile it for cuda"), "{err}");
}

#[test]
fn the_reference_backend_refuses_no_fusion_and_cuda_options_need_cuda() {
    let rules = RuleSet::defaults();
    let model = Model::load(&stored_graph("options"), &rules).unwrap();
    let no_fusion = CompileOptions {
        no_fusion: true,
        ..CompileOptions::default()
    };
    let err = model.compile(Backend::Reference, &no_fusion).err().unwrap();
    assert!(err.to_string().contains("never fuses"), "{err}");
    let mut cuda = CompileOptions::default();
    cuda.cuda.deterministic = true;
    let err = model.compile(Backend::Cpu, &cuda).err().unwrap();
    assert!(err.to_string().contains("Backend::Cuda"), "{err}");
}

/// The code of the fenced block that the line starting with `start` opens in `text`, each
/// line with `strip` removed from its front.
fn block(text: &str, start: &str, strip: &str) -> String {
    let mut lines = text
        .lines()
        .skip_while(|line| !line.starts_with(start))
        .skip(1);
    let mut code = Vec::new();
    for line in lines.by_ref() {
        // `//!` alone is a blank line of the doc comment.
        let line = line
            .strip_prefix(strip)
            .or_else(|| line.strip_prefix(strip.trim_end()))
            .unwrap_or(line);
        if line == "```" {
            break;
        }
        code.push(line);
    }
    code.join("\n")
}

#[test]
fn the_book_shows_the_module_documentation_test() {
    let source = std::fs::read_to_string(repo().join("src/model.rs")).unwrap();
    let book = std::fs::read_to_string(repo().join("book/src/rust-api.md")).unwrap();
    let doctest = block(&source, "//! ```", "//! ");
    assert!(doctest.contains("Model::load"), "the doctest was not found");
    assert_eq!(
        block(&book, "```rust", ""),
        doctest,
        "book/src/rust-api.md must show src/model.rs's example as it is"
    );
}
