//! Helpers shared by the test files.
#![allow(dead_code)]

use fusebox::eval::{self, Tensors};
use fusebox::graph::Graph;
use fusebox::tensor::Tensor;

/// Random inputs in the ranges mixed precision is meant for. f16 keeps about 3 decimal digits,
/// so one rounding of a value of a few units uses up MXNet's atol of 1e-3: pointwise inputs stay
/// within [-1, 1] (amp_demo's `data`, which feeds exp in f16, within [-0.5, 0.5]), biases within
/// 0.1, and matmul weights are scaled by sqrt(3 / fan_in) (Xavier), fan_in being the weight's
/// first dimension, so sums over the inner dimension stay of order 1. Nothing comes near f16's
/// overflow at 65504.
pub fn amp_inputs(g: &Graph, seed: u64) -> Tensors {
    let fan_in = |name: &str| {
        g.input(name)
            .and_then(|i| i.shape.first().copied())
            .unwrap_or(1) as f64
    };
    let bound = |name: &str| match (g.name.as_str(), name) {
        ("amp_demo", "data") => 0.5,
        ("mlp_block", "w1" | "w2") => (3.0 / fan_in(name)).sqrt(),
        ("mlp_block", "b1" | "b2") => 0.1,
        ("mlp_block", "x") => 0.5,
        _ => 1.0,
    };
    eval::random_inputs(g, seed)
        .into_iter()
        .map(|(name, t)| {
            // random_inputs draws from [-3, 3].
            let s = bound(&name) / 3.0;
            let values = t.values().into_iter().map(|v| v * s).collect();
            let scaled = Tensor::from_values(t.dtype, t.shape(), values).expect("same shape");
            (name, scaled)
        })
        .collect()
}

pub mod concat_graphs;
pub mod epilogue_graphs;
pub mod gather_graphs;
pub mod kernel_cache;
pub mod map_positions;
pub mod onnx_models;
pub mod random_graph;
pub mod row_graphs;

/// A fresh, empty scratch directory `fusebox-PREFIX-PID-NAME` under the system temp dir.
pub fn scratch(prefix: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The stdout of a command that must have succeeded (its stderr is the failure message).
#[track_caller]
pub fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// NVRTC options for the sm_80 half of the tests' compile sweeps: `--Ofast-compile=max`
/// where NVRTC has it (12.8 on; CI installs 12.9), which compiles softmax's row-kernel module
/// in 0.08 s instead of 0.72 s. The front end and code generation still see every kernel for
/// sm_80 (its headers' `__CUDA_ARCH__` branches, the bf16 intrinsics it has); the sm_90 half,
/// what the runtime compiles, keeps the full optimizer, its warnings and the PTX checks.
/// (`-G` would be as fast, but warns that a large function's debug information may be
/// inaccurate.) Nothing on an older NVRTC.
pub fn sm80_sweep_flags() -> &'static [&'static str] {
    let fast = fusebox::backend::cuda::libs::nvrtc_available().is_ok_and(|s| s.version >= (12, 8));
    if fast { &["--Ofast-compile=max"] } else { &[] }
}

/// Whether `python3` can import NumPy: the tests that talk to Python skip, with a message,
/// where it cannot (`.ci/run` installs it first).
pub fn numpy_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success())
}

/// A fresh directory under the system's temporary directory, named by `tag` and this process.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The joint forward + backward graph `fusebox grad` writes for two PyTorch `Linear` layers
/// with `activation` between them, `activation(x @ w1ᵀ + b1) @ w2ᵀ + b2`, on `rows` rows of
/// `features` values, `hidden` between the layers and `out` out, in `dtype`: each bias
/// gradient is the column sums of a value computed from a product.
pub fn linear_stack_joint(
    [rows, features, hidden, out]: [usize; 4],
    activation: &str,
    dtype: &str,
) -> Graph {
    let text = format!(
        "Graph(name: \"linear_stack\", inputs: [\
         Input(name: \"x\", dtype: \"{dtype}\", shape: [{rows}, {features}]), \
         Input(name: \"w1\", dtype: \"{dtype}\", shape: [{hidden}, {features}]), \
         Input(name: \"b1\", dtype: \"{dtype}\", shape: [{hidden}]), \
         Input(name: \"w2\", dtype: \"{dtype}\", shape: [{out}, {hidden}]), \
         Input(name: \"b2\", dtype: \"{dtype}\", shape: [{out}])], nodes: [\
         Node(name: \"w1t\", op: \"transpose\", args: [\"w1\"]), \
         Node(name: \"h\", op: \"matmul\", args: [\"x\", \"w1t\"]), \
         Node(name: \"hb\", op: \"add\", args: [\"h\", \"b1\"]), \
         Node(name: \"a\", op: \"{activation}\", args: [\"hb\"]), \
         Node(name: \"w2t\", op: \"transpose\", args: [\"w2\"]), \
         Node(name: \"o\", op: \"matmul\", args: [\"a\", \"w2t\"]), \
         Node(name: \"y\", op: \"add\", args: [\"o\", \"b2\"])], outputs: [\"y\"])"
    );
    let rules = random_graph::rules();
    let graph = fusebox::graph::file::parse(&text, "linear_stack.ron", &rules.ops)
        .unwrap()
        .0;
    fusebox::autodiff::grad(
        &graph,
        &rules.ops,
        &rules.gradients,
        &fusebox::autodiff::Wrt::AllFloatInputs,
    )
    .unwrap()
    .graph
}

/// The reductions each library call of `program` runs in its epilogue, call by call.
pub fn epilogue_reductions(program: &fusebox::lower::Program) -> Vec<usize> {
    program
        .steps
        .iter()
        .filter_map(|s| match s {
            fusebox::lower::Step::MatMul(m) => Some(
                m.epilogue
                    .as_ref()
                    .map_or(0, |e| program.kernels[e.step.kernel].reductions.len()),
            ),
            fusebox::lower::Step::Kernel(_) => None,
        })
        .collect()
}
