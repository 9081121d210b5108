//! The CUDA backend end to end: optimize → lower → CUDA C → NVRTC → run on the GPU, against
//! the reference evaluator on the unfused graph.
//!
//! Most tests need an NVIDIA GPU and are `#[ignore]`d; run them on a GPU machine with
//!
//! ```text
//! cargo test --release --test cuda_gpu -- --ignored --test-threads 1
//! ```
//!
//! or, where there is no Rust toolchain, build the test binary elsewhere with
//! `cargo test --release --test cuda_gpu --no-run`, carry it over with a `fusebox` binary
//! and run it from a checkout's root with `FUSEBOX_BIN=path/to/fusebox` and `--ignored` (see
//! benches/gpu/run.sh): paths are then taken from the working directory, not from the
//! machine it was built on. The tests that run everywhere check what needs no
//! GPU: that the cuda backend fails with a clear message on a machine without CUDA, and
//! that every device plan (the program's kernels plus the conversion kernels around matrix
//! products) compiles with NVRTC and names only entry points the PTX has.

mod common;

use common::concat_graphs;
use common::random_graph::{self, assert_close, assert_same, rules, tolerance};
use common::row_graphs;
use fusebox::backend::cuda::abi;
use fusebox::backend::cuda::emit::EmitOptions;
use fusebox::backend::cuda::libs;
use fusebox::backend::cuda::nvrtc::{CompileOptions, NvrtcCompiler};
use fusebox::backend::cuda::runtime::CudaExecutable;
use fusebox::backend::cuda::runtime::plan::{DevicePlan, Libraries, Op};
use fusebox::backend::cuda::runtime::{CudaOptions, DeviceBuffer};
use fusebox::backend::{Executable, Target};
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::graph::{self, Graph};
use fusebox::optimize::Options;
use fusebox::runner::Prepared;
use fusebox::runtime::buffer::Buffer;

type CudaPrepared = Prepared<CudaExecutable>;
const CUDA_PROFILE: &str = <CudaOptions as Target>::PROFILE;
use proptest::prelude::*;
use std::path::PathBuf;
use std::process::Command;

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

/// The checkout's root: where this test was built, or (for a test binary carried to another
/// machine) the working directory.
fn repo_root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if built.join("examples").is_dir() {
        built
    } else {
        std::env::current_dir().expect("a working directory")
    }
}

/// The fusebox binary: `FUSEBOX_BIN`, else the one cargo built with this test.
fn fusebox_bin() -> PathBuf {
    std::env::var_os("FUSEBOX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fusebox")))
}

fn load(name: &str) -> Graph {
    let path = repo_root().join(format!("examples/{name}.ron"));
    graph::file::load(&path, &rules().ops)
        .expect("example loads")
        .0
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-cuda-gpu-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn options(fusion: bool, amp: Option<&str>) -> Options {
    Options {
        fusion,
        amp: amp.map(String::from),
        profile: CUDA_PROFILE.into(),
        ..Options::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Without a GPU.

/// `fusebox run` and `fusebox bench` with `--backend cuda` on a machine without the CUDA
/// driver: exit status 1, one error line naming the driver library and what the backend
/// needs, no panic. (On a machine with the driver this test has nothing to check.)
#[test]
fn without_a_driver_run_and_bench_fail_cleanly() {
    if libs::driver_available() {
        eprintln!("skipped: the CUDA driver is present here");
        return;
    }
    let out = scratch_dir("no-driver");
    let runs: [Vec<&str>; 3] = [
        vec![
            "run",
            "examples/lstm_cell.ron",
            "--backend",
            "cuda",
            "--random-inputs",
            "--out",
            out.to_str().unwrap(),
        ],
        vec!["bench", "examples/mlp_block.ron", "--backend", "cuda"],
        vec![
            "bench",
            "examples/gelu_bias.ron",
            "--backend",
            "cuda",
            "--cuda-graph",
            "--no-fusion",
        ],
    ];
    for args in runs {
        let output = Command::new(fusebox_bin())
            .args(&args)
            .current_dir(repo_root())
            .output()
            .expect("fusebox runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(
                "error: backend: the cuda backend cannot run here: the CUDA driver library \
                 libcuda.so.1 was not found: the cuda backend needs an NVIDIA GPU and its driver"
            ),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains("NVRTC"),
            "NVRTC's state is reported: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(output.stdout.is_empty());
        assert!(
            std::fs::read_dir(&out).unwrap().next().is_none(),
            "nothing was written"
        );
    }
}

/// The library API fails the same way, before optimizing anything.
#[test]
fn without_a_driver_prepare_is_an_error() {
    if libs::driver_available() {
        eprintln!("skipped: the CUDA driver is present here");
        return;
    }
    let graph = load("lstm_cell");
    let start = std::time::Instant::now();
    let error = match fusebox::runner::prepare(
        &graph,
        rules(),
        &options(true, None),
        &CudaOptions::default(),
    ) {
        Ok(_) => panic!("a GPU program was prepared without a driver"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("libcuda.so.1 was not found"), "{error}");
    assert!(
        start.elapsed().as_secs_f64() < 1.0,
        "the device is opened before the optimizer runs"
    );
}

/// Whether NVRTC can be used: when it cannot, says so and (unless CI requires it with
/// FUSEBOX_REQUIRE_NVRTC=1, as `.ci/run` does) lets the calling test return early.
fn nvrtc_ready(test: &str) -> bool {
    match libs::nvrtc_available() {
        Ok(_) => true,
        Err(e) if std::env::var_os("FUSEBOX_REQUIRE_NVRTC").is_some_and(|v| v == "1") => {
            panic!("FUSEBOX_REQUIRE_NVRTC=1 but NVRTC cannot be used: {e}")
        }
        Err(e) => {
            eprintln!("{test}: skipped, NVRTC cannot be used: {e}");
            false
        }
    }
}

/// cuBLAS's `GemmEx` with f32 (or f64) compute reads and writes these (input, output) pairs.
fn cublas_supports(input: DType, output: DType) -> bool {
    use DType::*;
    matches!(
        (input, output),
        (F16, F16) | (F16, F32) | (BF16, BF16) | (BF16, F32) | (F32, F32) | (F64, F64)
    )
}

/// Every example, fused and unfused, plain and under both AMP policies, in both reduction
/// modes: the device plan's module compiles with NVRTC for sm_90, every entry point a launch
/// names is in the PTX, every parameter block is laid out, and every GEMM reads and writes
/// types cuBLAS supports. Deterministic plans also move epilogues into cuBLASLt where they
/// can (`--lt-epilogues`), which must leave every other kernel's entry points in the module.
/// This is all of the runtime's glue that can be checked without a GPU.
#[test]
fn every_device_plan_compiles_and_names_real_entry_points() {
    if !nvrtc_ready("every_device_plan_compiles_and_names_real_entry_points") {
        return;
    }
    let compiler = NvrtcCompiler::new(CompileOptions {
        warnings_as_errors: true,
        ..CompileOptions::from_env().with_cache_dir(scratch_dir("plans"))
    });
    let rules = rules();
    let mut conversions = 0;
    let mut lt_epilogues = 0;
    for name in EXAMPLES {
        let graph = load(name);
        for amp in [None, Some("f16"), Some("bf16")] {
            for fusion in [true, false] {
                let opts = options(fusion, amp);
                let (program, _, _) = fusebox::runner::lower_graph(&graph, rules, &opts)
                    .unwrap_or_else(|e| panic!("{name} {amp:?} fusion {fusion}: {e}"));
                for deterministic in [false, true] {
                    let what = format!("{name} {amp:?} fusion {fusion} det {deterministic}");
                    let plan = DevicePlan::new(
                        &program,
                        &EmitOptions { deterministic },
                        132,
                        Libraries {
                            cudnn: true,
                            lt_epilogues: deterministic,
                        },
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let ptx = compiler
                        .compile(&plan.source, "sm_90")
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    for entry in plan.entry_points() {
                        assert!(
                            ptx.ptx.contains(&format!(".entry {entry}(")),
                            "{what}: entry point {entry} is not in the PTX"
                        );
                    }
                    for op in &plan.ops {
                        match op {
                            Op::Kernel(call) => {
                                let ir = &plan.kernels[call.kernel];
                                assert!(
                                    !call.plan.launches.is_empty()
                                        || call.launch.sizes.contains(&0),
                                    "{what}: a kernel with work has no launch"
                                );
                                let ptrs: Vec<u64> = (0..ir.arg_count() as u64)
                                    .map(|a| 0x1000 * (a + 1))
                                    .collect();
                                let scratch: Vec<u64> = (0..call.plan.scratch_bytes.len() as u64)
                                    .map(|r| 0x9000 + 0x100 * r)
                                    .collect();
                                let block = abi::param_block(ir, &call.launch, &ptrs, &scratch);
                                assert!(block.len() >= 8 * ptrs.len(), "{what}: parameter block");
                                if call.kernel >= program.kernels.len() {
                                    conversions += 1;
                                }
                            }
                            Op::Gemm {
                                types,
                                shape,
                                epilogue,
                                ..
                            } => {
                                assert!(
                                    cublas_supports(types.input, types.output),
                                    "{what}: {types:?}"
                                );
                                if let Some(e) = epilogue {
                                    assert!(deterministic, "{what}: cuBLASLt while off");
                                    assert_eq!(shape.calls.len(), 1, "{what}");
                                    assert!(
                                        matches!(
                                            e.out_dtype,
                                            DType::F32 | DType::F16 | DType::BF16
                                        ),
                                        "{what}: {e:?}"
                                    );
                                    lt_epilogues += 1;
                                }
                                assert!(!shape.calls.is_empty(), "{what}: GEMM without calls");
                            }
                            Op::Conv { dtype, .. } => {
                                assert!(
                                    matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
                                    "{what}: a cuDNN convolution of {dtype}"
                                );
                            }
                            Op::Zero { .. } | Op::Copy { .. } => {}
                        }
                    }
                }
            }
        }
    }
    assert!(
        conversions > 0,
        "AMP matmuls with absorbed casts exercise the conversion kernels"
    );
    assert!(lt_epilogues > 0, "the examples' Linears reach cuBLASLt");
}

// ---------------------------------------------------------------------------------------------
// On a GPU (`--ignored`).

fn prepare(graph: &Graph, opts: &Options, cuda: &CudaOptions) -> CudaPrepared {
    fusebox::runner::prepare(graph, rules(), opts, cuda)
        .unwrap_or_else(|e| panic!("{}: {e}", graph.name))
}

/// Host buffers of `inputs` in the program's input order.
fn input_buffers(prepared: &CudaPrepared, inputs: &Tensors) -> Vec<Buffer> {
    random_graph::input_buffers(prepared.executable.program(), inputs)
}

/// One run with every output byte poisoned with `poison` first, read back.
fn poisoned_run(
    prepared: &mut CudaPrepared,
    inputs: &[DeviceBuffer],
    poison: u8,
) -> Result<Vec<Buffer>, String> {
    let exe = &mut prepared.executable;
    let mut outputs = exe.output_buffers().map_err(|e| e.to_string())?;
    for b in &mut outputs {
        b.fill_bytes(poison).map_err(|e| e.to_string())?;
    }
    exe.run_device(inputs, &mut outputs)
        .map_err(|e| e.to_string())?;
    outputs
        .iter()
        .map(|b| b.download().map_err(|e| e.to_string()))
        .collect()
}

/// Runs `graph` on the GPU on seeded inputs (NaN/Inf planted if `specials`) twice, with the
/// outputs poisoned with 0xFF and then 0x7F, and compares both with the reference evaluator
/// on the unfused (AMP cast-inserted) graph. An element no kernel writes keeps its poison:
/// NaN the first time, a huge finite number (f32, bf16) or NaN (f16) the second, so it fails
/// one comparison or the other whatever the reference holds there.
fn agrees(
    graph: &Graph,
    opts: &Options,
    cuda: &CudaOptions,
    seed: u64,
    specials: bool,
) -> Result<(), String> {
    let rules = rules();
    let policy = opts.amp.as_deref().map(|p| rules.amp.policy(p).unwrap());
    let reference_graph = match policy {
        Some(policy) => {
            fusebox::amp::insert_casts(graph, &rules.ops, policy)
                .unwrap()
                .graph
        }
        None => graph.clone(),
    };
    // An output of an AMP graph holds roundings to the policy's dtype whatever its own dtype
    // (mlp_block's f32 `y` comes out of an f16 matmul): cuBLAS sums in another order than the
    // reference, so a value next to an f16 rounding boundary lands one f16 step away (2.0 at
    // 2578, seen on an H200). Such outputs are held to the narrower dtype's tolerance.
    let amp_tolerance = policy.map_or(0.0, |p| tolerance(p.target));
    let inputs = random_graph::inputs(graph, seed, specials);
    let want = fusebox::eval::evaluate(&reference_graph, &rules.ops, &inputs)
        .map_err(|e| e.to_string())?;
    let mut prepared =
        fusebox::runner::prepare(graph, rules, opts, cuda).map_err(|e| e.to_string())?;
    let host = input_buffers(&prepared, &inputs);
    let device_inputs = prepared
        .executable
        .upload_inputs(&host)
        .map_err(|e| e.to_string())?;
    for poison in [0xFF, 0x7F] {
        let got = poisoned_run(&mut prepared, &device_inputs, poison)?;
        for (output, buffer) in graph.outputs.iter().zip(&got) {
            let want = &want[output];
            let rtol = tolerance(want.dtype).max(amp_tolerance);
            assert_close(output, want, &buffer.to_tensor(), rtol)
                .map_err(|e| format!("poison {poison:#x}: {e}"))?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_example_runs_fused_and_unfused_on_the_gpu() {
    for name in EXAMPLES {
        let graph = load(name);
        for fusion in [true, false] {
            for deterministic in [false, true] {
                let cuda = CudaOptions {
                    deterministic,
                    ..CudaOptions::default()
                };
                agrees(&graph, &options(fusion, None), &cuda, 3, false).unwrap_or_else(|e| {
                    panic!("{name} (fusion {fusion}, deterministic {deterministic}): {e}")
                });
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn amp_examples_run_on_the_gpu() {
    for name in ["mlp_block", "amp_demo", "lstm_cell"] {
        let graph = load(name);
        for policy in ["f16", "bf16"] {
            for fusion in [true, false] {
                agrees(
                    &graph,
                    &options(fusion, Some(policy)),
                    &CudaOptions::default(),
                    5,
                    false,
                )
                .unwrap_or_else(|e| panic!("{name} {policy} fusion {fusion}: {e}"));
            }
        }
    }
}

/// Row kernels that keep costly values from one pass for later ones (the capped logits and
/// `exp` of a soft-capped softmax sharing one place, the gelu and its centred value of
/// `layernorm(gelu(x))`), at row lengths on each side of every CUDA row path's limit
/// (element-wise registers, vectors, the full block, shared memory, re-reading), with NaN/Inf
/// rows too, equal the reference on the device, poisoned outputs and all.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn row_kernels_that_keep_values_agree_on_the_gpu() {
    type MakeGraph = fn(&[usize]) -> Graph;
    let graphs: [(&str, MakeGraph); 6] = [
        ("softcapped f32", |s| {
            row_graphs::softcapped_softmax(DType::F32, s, false)
        }),
        ("softcapped f32 with logits", |s| {
            row_graphs::softcapped_softmax(DType::F32, s, true)
        }),
        ("softcapped bf16", |s| {
            row_graphs::softcapped_softmax(DType::BF16, s, false)
        }),
        ("layernorm of gelu f32", |s| {
            row_graphs::layernorm_of_gelu(DType::F32, s)
        }),
        ("layernorm of gelu f16", |s| {
            row_graphs::layernorm_of_gelu(DType::F16, s)
        }),
        ("softmax f16", |s| row_graphs::softmax(DType::F16, s)),
    ];
    for (name, make) in graphs {
        for length in [
            1, 31, 33, 1000, 1023, 4096, 4097, 12256, 12288, 24512, 24576,
        ] {
            let graph = make(&[3, length]);
            for specials in [false, true] {
                let opts = Options {
                    strict_ieee: specials,
                    ..options(true, None)
                };
                agrees(&graph, &opts, &CudaOptions::default(), 11, specials).unwrap_or_else(|e| {
                    panic!("{name} [3, {length}] (NaN/Inf inputs {specials}): {e}")
                });
            }
        }
    }
}

/// Kernels that read a concat by ranges, in each way CUDA runs them (`common::concat_graphs`):
/// pieces keeping reductions of other axes, pieces chosen per point for reductions along the
/// concat's own axis (column sums of a batch concat with empty and one-row segments, a rank-3
/// middle-axis mean and max, f16 totals, wrapping i32 sums, row sums and maxima of feature
/// concats), row kernels branching on their row's piece, and row kernels over concats along
/// their rows (caches loaded under each operand's range, rows past the register and shared
/// memory caches), with NaN/Inf inputs too and in both reduction modes, equal the reference
/// on the device, poisoned outputs and all.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn concat_kernels_agree_on_the_gpu() {
    let graphs = concat_graphs::reductions_of_concats()
        .into_iter()
        .chain(
            concat_graphs::reductions_along_a_concats_axis()
                .into_iter()
                .map(|(g, _)| g),
        )
        .chain(concat_graphs::row_kernels_of_concats())
        .chain(concat_graphs::row_kernels_of_row_concats())
        .chain(concat_graphs::concats_alike());
    for graph in graphs {
        for specials in [false, true] {
            for deterministic in [false, true] {
                let opts = Options {
                    strict_ieee: specials,
                    ..options(true, None)
                };
                let cuda = CudaOptions {
                    deterministic,
                    ..CudaOptions::default()
                };
                agrees(&graph, &opts, &cuda, 13, specials).unwrap_or_else(|e| {
                    panic!(
                        "{} (NaN/Inf inputs {specials}, deterministic {deterministic}): {e}",
                        graph.name
                    )
                });
            }
        }
    }
}

/// Deterministic reductions give the same bits on every run, and in a second executable.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn deterministic_reductions_are_bitwise_reproducible() {
    let cuda = CudaOptions {
        deterministic: true,
        ..CudaOptions::default()
    };
    for name in ["layernorm_tail", "lstm_cell_backward", "iou", "adam_step"] {
        let graph = load(name);
        let inputs = random_graph::inputs(&graph, 11, false);
        let mut first: Option<Vec<Buffer>> = None;
        for _ in 0..2 {
            let mut prepared = prepare(&graph, &options(true, None), &cuda);
            let host = input_buffers(&prepared, &inputs);
            let device_inputs = prepared.executable.upload_inputs(&host).unwrap();
            for (run, poison) in [0xFFu8, 0x00, 0x7F, 0xFF, 0x55].into_iter().enumerate() {
                let got = poisoned_run(&mut prepared, &device_inputs, poison).unwrap();
                match &first {
                    None => first = Some(got),
                    Some(want) => {
                        for (k, (a, b)) in want.iter().zip(&got).enumerate() {
                            for i in 0..a.len() {
                                assert_eq!(
                                    a.get(i).to_bits(),
                                    b.get(i).to_bits(),
                                    "{name} output {k}[{i}], run {run}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Replaying a captured CUDA graph gives what plain runs give, also after new input values
/// are written into the buffers the graph was captured with.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_graph_replay_equals_plain_runs() {
    for name in ["lstm_cell", "mlp_block", "layernorm_tail", "gru_residual"] {
        let graph = load(name);
        let plain_options = CudaOptions {
            deterministic: true,
            ..CudaOptions::default()
        };
        let graph_options = CudaOptions {
            cuda_graph: true,
            ..plain_options.clone()
        };
        let mut plain = prepare(&graph, &options(true, None), &plain_options);
        let mut replayed = prepare(&graph, &options(true, None), &graph_options);
        let first = input_buffers(&plain, &random_graph::inputs(&graph, 1, false));
        let mut device_inputs = replayed.executable.upload_inputs(&first).unwrap();
        let mut outputs = replayed.executable.output_buffers().unwrap();
        for seed in [1u64, 2, 3] {
            let host = input_buffers(&plain, &random_graph::inputs(&graph, seed, false));
            for (d, h) in device_inputs.iter_mut().zip(&host) {
                d.write(h).unwrap();
            }
            for b in &mut outputs {
                b.fill_bytes(0xFF).unwrap();
            }
            replayed
                .executable
                .run_device(&device_inputs, &mut outputs)
                .unwrap();
            let mut want: Vec<Buffer> = outputs
                .iter()
                .map(|b| Buffer::zeroed(b.dtype, &b.shape))
                .collect();
            plain.executable.run_into(&host, &mut want).unwrap();
            for (k, (d, w)) in outputs.iter().zip(&want).enumerate() {
                let got = d.download().unwrap();
                for i in 0..w.len() {
                    assert_eq!(
                        got.get(i).to_bits(),
                        w.get(i).to_bits(),
                        "{name} seed {seed} output {k}[{i}]"
                    );
                }
            }
        }
        assert!(
            replayed.executable.launches_per_run() > 0,
            "{name}: something runs"
        );
    }
}

/// cuBLASLt's epilogues (`--lt-epilogues`, `src/backend/cuda/runtime/lt.rs`): random
/// `Linear`s with a bias, residual, scale and ReLU in f32, f16 and bf16, some of cuBLASLt's
/// form and some near it, against the reference on poisoned outputs, with and without NaN and
/// infinite inputs, plain and replayed from a CUDA graph; every epilogue of cuBLASLt's form
/// ran in its GEMM. The check to run before `CudaOptions::lt_epilogues` becomes the default.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn lt_epilogues_match_the_reference() {
    let mut moved = 0;
    for seed in 0..64u64 {
        let case = common::epilogue_graphs::case(seed);
        for cuda_graph in [false, true] {
            let cuda = CudaOptions {
                lt_epilogues: true,
                cuda_graph,
                ..CudaOptions::default()
            };
            let prepared = prepare(&case.graph, &options(true, None), &cuda);
            let facts = prepared.executable.bench_facts(1 << 16, 1).unwrap();
            let count = facts.lt_epilogues.unwrap_or(0);
            assert!(
                !case.expressible || count == 1,
                "{} (seed {seed}): {count} epilogues in cuBLASLt",
                case.what
            );
            moved += count;
            for specials in [false, true] {
                agrees(&case.graph, &options(true, None), &cuda, seed, specials).unwrap_or_else(
                    |e| {
                        panic!(
                            "{} (seed {seed}, graph {cuda_graph}, NaN/Inf {specials}): {e}",
                            case.what
                        )
                    },
                );
            }
        }
    }
    assert!(moved > 32, "{moved} epilogues ran in cuBLASLt");
}

/// Another batch size compiles and loads nothing (kernels carry no sizes), and memory taken
/// for an executable goes back to the pool when it is dropped.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn another_batch_size_reuses_the_loaded_module_and_pooled_memory() {
    let text = std::fs::read_to_string(repo_root().join("examples/lstm_cell.ron")).unwrap();
    let parse = |t: &str| graph::file::parse(t, "lstm.ron", &rules().ops).unwrap().0;
    let cuda = CudaOptions::default();
    let first = prepare(&parse(&text), &options(true, None), &cuda);
    let device = first.executable.device().clone();
    drop(first);
    let (live_before, _) = device.pool_bytes();
    for batch in [512, 3, 1000] {
        let g = parse(&text.replace("[1024, 4096]", &format!("[{batch}, 4096]")));
        let mut again = prepare(&g, &options(true, None), &cuda);
        let stats = again.executable.compile_stats();
        assert!(stats.loaded_already, "batch {batch}: module loaded again");
        assert_eq!(stats.nvrtc.compiled, 0, "batch {batch}: NVRTC ran");
        let inputs = fusebox::eval::random_inputs(&g, 1);
        let want = fusebox::eval::evaluate(&g, &rules().ops, &inputs).unwrap();
        let got = again.executable.run_tensors(&inputs).unwrap();
        for name in &g.outputs {
            assert_same(name, &want[name], &got[name]).unwrap();
        }
    }
    let (live_after, idle) = device.pool_bytes();
    assert_eq!(
        live_after, live_before,
        "every buffer went back to the pool"
    );
    assert!(idle > 0);
}

/// `fusebox run --backend cuda` writes what `--backend reference` writes, and `bench
/// --backend cuda --json` reports the device and a copy bandwidth.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_cli_runs_and_benches_on_the_gpu() {
    let fusebox = |args: &[&str]| {
        let output = Command::new(fusebox_bin())
            .args(args)
            .current_dir(repo_root())
            .output()
            .expect("fusebox runs");
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    let dirs = [scratch_dir("cli-reference"), scratch_dir("cli-cuda")];
    for (backend, dir) in ["reference", "cuda"].iter().zip(&dirs) {
        fusebox(&[
            "run",
            "examples/gru_residual.ron",
            "--backend",
            backend,
            "--random-inputs",
            "--seed",
            "4",
            "--out",
            dir.to_str().unwrap(),
        ]);
    }
    let graph = load("gru_residual");
    for name in &graph.outputs {
        let read = |d: &PathBuf| {
            fusebox::tensor::Tensor::read_npy(&d.join(format!("{name}.npy"))).unwrap()
        };
        assert_same(name, &read(&dirs[0]), &read(&dirs[1])).unwrap();
    }
    let json = fusebox(&[
        "bench",
        "examples/lstm_cell.ron",
        "--backend",
        "cuda",
        "--cuda-graph",
        "--iters",
        "5",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["backend"], "cuda");
    assert_eq!(report["cuda_graph"], true);
    assert!(report["device"].as_str().is_some_and(|d| !d.is_empty()));
    assert!(report["median_ms"].as_f64().unwrap() > 0.0);
    assert!(report["copy_gbps"].as_f64().unwrap() > 0.0);
    assert!(report.get("threads").is_none());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random graphs (broadcasting, [N,1]×[1,M], transposes, slices, concats, size-1 and
    /// size-0 dims, f16/bf16 and mixed dtypes, where/bool, reductions ending kernels,
    /// multi-output kernels, matmul, NaN/Inf inputs), fused and unfused, with and without
    /// deterministic reductions and CUDA graphs, equal the reference, and every output
    /// element is written.
    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn gpu_random_graphs_agree(
        dims in prop_oneof![Just((3usize, 4usize)), Just((1, 5)), Just((2, 1)), Just((0, 3)), Just((64, 700)), Just((257, 1030))],
        inputs in prop::collection::vec((0usize..4, 0usize..6), 1..4),
        steps in prop::collection::vec(random_graph::step(true), 2..14),
        seed in 0u64..1000,
        specials in any::<bool>(),
        fusion in prop_oneof![3 => Just(true), 1 => Just(false)],
        deterministic in any::<bool>(),
        cuda_graph in prop_oneof![3 => Just(false), 1 => Just(true)],
    ) {
        let Some(graph) = random_graph::build(&rules().ops, dims, &inputs, &steps) else { return Ok(()) };
        let opts = Options { strict_ieee: random_graph::strict_ieee_for(&graph, seed, specials), ..options(fusion, None) };
        let cuda = CudaOptions { deterministic, cuda_graph, ..CudaOptions::default() };
        agrees(&graph, &opts, &cuda, seed, specials).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// Random graphs around a concat (the CPU suites' generator: segments of size 0 and 1,
    /// negative axes, f16 operands, reductions keeping or reducing the concat's axis, row
    /// kernels over concats along an outer axis or along their rows) equal the reference on
    /// the device, in both reduction modes.
    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn gpu_random_concat_graphs_agree(
        recipe in random_graph::concat_recipes(),
        seed in 0u64..1000,
        specials in any::<bool>(),
        deterministic in any::<bool>(),
    ) {
        let graph = random_graph::build_concat(&rules().ops, &recipe);
        prop_assume!(graph.is_some());
        let graph = graph.unwrap();
        let opts = Options { strict_ieee: random_graph::strict_ieee_for(&graph, seed, specials), ..options(true, None) };
        let cuda = CudaOptions { deterministic, ..CudaOptions::default() };
        agrees(&graph, &opts, &cuda, seed, specials).map_err(|e| TestCaseError::fail(format!(
            "{e}\n{}", graph::file::to_ron(&graph))))?;
    }
}
