//! Every CUDA kernel fusebox generates compiles with NVRTC, for sm_80 and sm_90, without an
//! error or a warning; and the NVRTC compiler's caches behave like the CPU compiler's. The
//! sm_80 half of the sweeps compiles for speed ([`common::sm80_sweep_flags`]); the sm_90 half
//! with the options the runtime uses.
//!
//! No GPU is needed: NVRTC is a library. `.ci/run` installs it (and the fp16/bf16 headers)
//! from PyPI and sets `FUSEBOX_REQUIRE_NVRTC=1`, so in CI these tests fail where NVRTC cannot
//! be loaded; elsewhere they are skipped with a message.
//!
//! The kernels: every example, fused (under the CPU and the H200 cost profiles) and unfused,
//! plain and under the f16 and bf16 AMP policies, each as the whole module the runtime would
//! compile; and the kernels of ≥ 500 random graphs (tests/common/random_graph.rs), fused and
//! unfused. Random-graph kernels are deduplicated by name (the hash of their body) and
//! compiled many to a translation unit, which keeps the NVRTC time to seconds.

use crate::common;

use common::random_graph::{self, rules};
use fusebox::ErrorKind;
use fusebox::backend::cuda::emit::{EmitOptions, emit_module, kernel_name};
use fusebox::backend::cuda::libs;
use fusebox::backend::cuda::nvrtc::{CompileOptions, CompileStats, NvrtcCompiler, PtxModule};
use fusebox::dag::Dag;
use fusebox::graph::{self, Graph};
use fusebox::lower::{self, KernelIr, Program};
use fusebox::optimize::{Options, optimize};
use fusebox::partition;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];
const REQUIRE_VAR: &str = "FUSEBOX_REQUIRE_NVRTC";
/// Random graphs whose kernels are compiled.
const RANDOM_GRAPHS: usize = 500;
/// Kernels per translation unit for the random graphs: NVRTC's fixed cost per unit (parsing
/// the fp16/bf16 headers) is paid once per this many kernels.
const KERNELS_PER_UNIT: usize = 32;

/// Whether NVRTC can be used; when it cannot, says so and (unless CI requires it) lets the
/// calling test return early.
fn nvrtc_ready(test: &str) -> bool {
    match libs::nvrtc_available() {
        Ok(_) => true,
        Err(e) if std::env::var_os(REQUIRE_VAR).is_some_and(|v| v == "1") => {
            panic!("{REQUIRE_VAR}=1 but NVRTC cannot be used: {e}")
        }
        Err(e) => {
            eprintln!("{test}: skipped, NVRTC cannot be used: {e}");
            false
        }
    }
}

/// A fresh, empty directory for one test.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cuda-compile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One strict compiler for the kernel sweeps, caching in a directory of its own.
fn compiler() -> &'static NvrtcCompiler {
    static COMPILER: OnceLock<NvrtcCompiler> = OnceLock::new();
    COMPILER.get_or_init(|| strict(&temp_dir("sweep")))
}

/// The strict compiler with [`common::sm80_sweep_flags`], for the sweeps' sm_80 half.
fn fast_compiler() -> &'static NvrtcCompiler {
    static COMPILER: OnceLock<NvrtcCompiler> = OnceLock::new();
    COMPILER.get_or_init(|| for_speed(&temp_dir("sweep-fast")))
}

fn for_speed(dir: &Path) -> NvrtcCompiler {
    NvrtcCompiler::new(CompileOptions {
        warnings_as_errors: true,
        extra: common::sm80_sweep_flags()
            .iter()
            .map(|f| f.to_string())
            .collect(),
        ..CompileOptions::from_env().with_cache_dir(dir)
    })
}

fn strict(dir: &Path) -> NvrtcCompiler {
    NvrtcCompiler::new(CompileOptions {
        warnings_as_errors: true,
        ..CompileOptions::from_env().with_cache_dir(dir)
    })
}

/// How a graph becomes a program: optimized under a cost profile, or one kernel per op.
#[derive(Debug, Clone, Copy)]
enum Fusion {
    Fused(&'static str),
    Unfused,
}

/// Lowers `graph` the way `fusebox run` would, without compiling anything.
fn program(graph: &Graph, fusion: Fusion, amp: Option<&str>) -> fusebox::Result<Program> {
    let rules = rules();
    let (dag, partition) = match fusion {
        Fusion::Fused(profile) => {
            let optimized = optimize(
                graph,
                rules,
                &Options {
                    profile: profile.into(),
                    amp: amp.map(String::from),
                    ..Options::default()
                },
            )?;
            (optimized.dag, optimized.partition)
        }
        Fusion::Unfused => {
            let graph = match amp {
                Some(p) => {
                    fusebox::amp::insert_casts(graph, &rules.ops, rules.amp.policy(p)?)?.graph
                }
                None => graph.clone(),
            };
            let dag = Dag::from_graph(&graph, &rules.ops)?;
            let partition = partition::unfused(&dag, rules.cost.profile("h200")?);
            (dag, partition)
        }
    };
    lower::lower(&dag, &partition)
}

/// The distinct kernels of `program`, by name.
fn named(program: &Program) -> Vec<(String, &KernelIr)> {
    named_in(std::slice::from_ref(program))
}

/// The distinct kernels of all of `programs`, by name, in order of first appearance.
fn named_in(programs: &[Program]) -> Vec<(String, &KernelIr)> {
    let mut seen = std::collections::HashSet::new();
    programs
        .iter()
        .flat_map(|program| program.kernels.iter())
        .map(|ir| (kernel_name(ir), ir))
        .filter(|(name, _)| seen.insert(name.clone()))
        .collect()
}

const EMIT_OPTIONS: [EmitOptions; 2] = [
    EmitOptions {
        deterministic: false,
    },
    EmitOptions {
        deterministic: true,
    },
];

/// Compiles `source` for every architecture, failing with NVRTC's message and `context`:
/// for sm_90 with `compiler`, for sm_80 for speed ([`fast_compiler`]).
fn compile_everywhere(
    compiler: &NvrtcCompiler,
    source: &str,
    context: &str,
) -> Vec<Arc<PtxModule>> {
    ARCHS
        .iter()
        .map(|&arch| {
            let compiler = if arch == "sm_80" {
                fast_compiler()
            } else {
                compiler
            };
            compiler
                .compile(source, arch)
                .unwrap_or_else(|e| panic!("{context} for {arch}: {e}"))
        })
        .collect()
}

/// The PTX declares every kernel's entry points: a module without them would compile to
/// nothing useful.
fn assert_entries(ptx: &PtxModule, names: &[&str], context: &str) {
    assert!(ptx.ptx.contains(".target"), "{context}: no .target");
    for name in names {
        assert!(
            ptx.ptx.contains(&format!(".entry {name}")),
            "{context}: no entry point {name}* in the PTX for {}",
            ptx.arch
        );
    }
}

fn example_paths() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir("examples")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .collect();
    paths.sort();
    paths
}

/// Every kernel of every example, under every AMP policy and fusion setting, compiles. The
/// distinct kernels of one example's nine programs go into one module per emit option set, so
/// NVRTC's fixed cost per unit (parsing the fp16/bf16 headers) is paid once per example rather
/// than once per program; each kernel is still compiled exactly as emitted for its program.
#[test]
fn every_example_module_compiles() {
    if !nvrtc_ready("every_example_module_compiles") {
        return;
    }
    let start = Instant::now();
    let rules = rules();
    let (mut programs, mut modules) = (0, 0);
    for path in example_paths() {
        let graph = graph::file::load(&path, &rules.ops).unwrap().0;
        let mut lowered = Vec::new();
        for amp in [None, Some("f16"), Some("bf16")] {
            for fusion in [Fusion::Fused("cpu"), Fusion::Fused("h200"), Fusion::Unfused] {
                let context = format!("{} {fusion:?} amp {amp:?}", path.display());
                let program = program(&graph, fusion, amp)
                    .unwrap_or_else(|e| panic!("{context}: does not lower: {e}"));
                lowered.push(program);
                programs += 1;
            }
        }
        let kernels = named_in(&lowered);
        if kernels.is_empty() {
            continue;
        }
        let names: Vec<&str> = kernels.iter().map(|(n, _)| n.as_str()).collect();
        for options in EMIT_OPTIONS {
            let context = format!("{} ({options:?})", path.display());
            let source = emit_module(&kernels, &options);
            for ptx in compile_everywhere(compiler(), &source, &context) {
                assert_entries(&ptx, &names, &context);
            }
            modules += 1;
        }
    }
    assert!(programs >= 9 * 3 * 3, "only {programs} programs");
    assert!(modules >= 9 * 2, "only {modules} modules");
    eprintln!(
        "every_example_module_compiles: {programs} programs in {modules} modules × {} archs in {:.1} s ({:?})",
        ARCHS.len(),
        start.elapsed().as_secs_f64(),
        compiler().stats()
    );
}

/// The joint forward + backward graph of every example (`fusebox grad`) compiles too, fused
/// under the H200 profile and unfused: gradient ops and templates emit like any other op.
#[test]
fn every_example_gradient_module_compiles() {
    if !nvrtc_ready("every_example_gradient_module_compiles") {
        return;
    }
    let rules = rules();
    let mut modules = 0;
    for path in example_paths() {
        let graph = graph::file::load(&path, &rules.ops).unwrap().0;
        let joint = fusebox::autodiff::grad(
            &graph,
            &rules.ops,
            &rules.gradients,
            &fusebox::autodiff::Wrt::AllFloatInputs,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // Both programs' distinct kernels in one module, as in `every_example_module_compiles`.
        let lowered: Vec<Program> = [Fusion::Fused("h200"), Fusion::Unfused]
            .into_iter()
            .map(|fusion| {
                program(&joint.graph, fusion, None).unwrap_or_else(|e| {
                    panic!(
                        "{} gradient {fusion:?}: does not lower: {e}",
                        path.display()
                    )
                })
            })
            .collect();
        let kernels = named_in(&lowered);
        let context = format!("{} gradient", path.display());
        let source = emit_module(&kernels, &EmitOptions::default());
        let names: Vec<&str> = kernels.iter().map(|(n, _)| n.as_str()).collect();
        for ptx in compile_everywhere(compiler(), &source, &context) {
            assert_entries(&ptx, &names, &context);
        }
        modules += 1;
    }
    assert!(modules >= 9, "only {modules} modules");
}

/// A random graph's recipe: dims, input specs and steps for [`random_graph::build`].
type Case = ((usize, usize), Vec<(usize, usize)>, Vec<random_graph::Step>);

/// A distinct kernel, and a graph it came from (for a failure message).
struct Found {
    ir: KernelIr,
    graph: String,
}

/// A kernel's name and where it was found.
type Named<'a> = (&'a String, &'a Found);

/// The random graphs' strategy, as in the CPU backend's property test.
fn random_case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just((3usize, 4usize)),
            Just((1, 5)),
            Just((2, 1)),
            Just((0, 3)),
            Just((64, 700))
        ],
        prop::collection::vec((0usize..4, 0usize..6), 1..4),
        prop::collection::vec(
            prop_oneof![
                8 => random_graph::step(true),
                1 => random_graph::row_reductions_with_consumers(),
            ],
            2..14,
        ),
    )
}

#[test]
fn kernels_of_random_graphs_compile() {
    if !nvrtc_ready("kernels_of_random_graphs_compile") {
        return;
    }
    let start = Instant::now();
    let rules = rules();
    let strategy = random_case();
    let mut runner = TestRunner::deterministic();
    // Each distinct kernel, with a graph it came from (for the failure message).
    let mut kernels: BTreeMap<String, Found> = BTreeMap::new();
    let mut graphs = 0;
    let mut attempts = 0;
    while graphs < RANDOM_GRAPHS {
        attempts += 1;
        assert!(attempts < 20 * RANDOM_GRAPHS, "too few random graphs build");
        let (dims, inputs, steps) = strategy.new_tree(&mut runner).unwrap().current();
        let Some(graph) = random_graph::build(&rules.ops, dims, &inputs, &steps) else {
            continue;
        };
        graphs += 1;
        let fusion = if graphs % 4 == 3 {
            Fusion::Unfused
        } else {
            Fusion::Fused("h200")
        };
        let program = program(&graph, fusion, None).unwrap_or_else(|e| {
            panic!(
                "{fusion:?}: does not lower: {e}\n{}",
                graph::file::to_ron(&graph)
            )
        });
        for (name, ir) in named(&program) {
            kernels.entry(name).or_insert_with(|| Found {
                ir: ir.clone(),
                graph: graph::file::to_ron(&graph),
            });
        }
    }
    let lowered = start.elapsed();

    // Units of up to KERNELS_PER_UNIT kernels per emit option; the deterministic option only
    // changes kernels with reductions, so the others are not compiled twice.
    let mut units: Vec<(EmitOptions, Vec<Named>)> = Vec::new();
    for options in EMIT_OPTIONS {
        let selected: Vec<_> = kernels
            .iter()
            .filter(|(_, found)| !options.deterministic || !found.ir.reductions.is_empty())
            .collect();
        for chunk in selected.chunks(KERNELS_PER_UNIT) {
            units.push((options, chunk.to_vec()));
        }
    }
    let jobs: Vec<(usize, &str)> = (0..units.len())
        .flat_map(|u| ARCHS.map(|arch| (u, arch)))
        .collect();
    // Compilers of its own, so that their counters are this test's; sm_80 for speed, as in
    // `compile_everywhere`.
    let optimized = strict(&temp_dir("random"));
    let fast = for_speed(&temp_dir("random-fast"));
    let for_arch = |arch: &str| if arch == "sm_80" { &fast } else { &optimized };
    let results = in_parallel(&jobs, |&(u, arch)| {
        let compiler = for_arch(arch);
        let (options, chunk) = &units[u];
        let unit: Vec<(String, &KernelIr)> = chunk
            .iter()
            .map(|(n, found)| ((*n).clone(), &found.ir))
            .collect();
        let source = emit_module(&unit, options);
        compiler.compile(&source, arch).map(|ptx| {
            let names: Vec<&str> = unit.iter().map(|(n, _)| n.as_str()).collect();
            assert_entries(&ptx, &names, "random graphs");
        })
    });
    for (&(u, arch), result) in jobs.iter().zip(results) {
        if let Err(e) = result {
            let (options, chunk) = &units[u];
            panic!("{}", culprit(for_arch(arch), chunk, options, arch, &e));
        }
    }
    let stats = (optimized.stats(), fast.stats());
    let row_kernels = kernels.values().filter(|f| f.ir.is_row_kernel()).count();
    eprintln!(
        "kernels_of_random_graphs_compile: {graphs} graphs, {} distinct kernels ({row_kernels} row kernels) in {} units × {} archs; lowering {:.1} s, total {:.1} s ({stats:?})",
        kernels.len(),
        units.len(),
        ARCHS.len(),
        lowered.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        kernels.len() > 100,
        "only {} distinct kernels",
        kernels.len()
    );
    assert!(
        row_kernels >= 10,
        "only {row_kernels} row kernels among the random graphs' kernels"
    );
}

/// `f` of every item, on as many threads as the machine has cores (NVRTC is thread-safe).
fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(items.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return done;
                        };
                        done.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a compile thread panicked"))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Compiles the kernels of a failing unit one by one and names the first that fails, with
/// the graph it came from.
fn culprit(
    compiler: &NvrtcCompiler,
    chunk: &[Named],
    options: &EmitOptions,
    arch: &str,
    unit_error: &fusebox::Error,
) -> String {
    for (name, found) in chunk {
        let source = emit_module(&[((*name).clone(), &found.ir)], options);
        if let Err(e) = compiler.compile(&source, arch) {
            return format!(
                "kernel {name} ({options:?}, {arch}): {e}\nfrom the graph:\n{}",
                found.graph
            );
        }
    }
    format!(
        "a unit of {} kernels ({options:?}, {arch}) fails, though each compiles alone: {unit_error}",
        chunk.len()
    )
}

// ---- the compiler itself ----

/// A kernel with no warnings: `y = 2 * x` in f16 storage, f32 compute.
const SCALE: &str = r#"#include <cuda_fp16.h>
extern "C" __global__ void scale(const __half *x, __half *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(2.0f * __half2float(x[i]));
}
"#;

fn source(tag: &str) -> String {
    format!("// {tag}\n{SCALE}")
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn ptx_is_cached_in_memory_and_on_disk() {
    if !nvrtc_ready("ptx_is_cached_in_memory_and_on_disk") {
        return;
    }
    let dir = temp_dir("caches");
    let compiler = strict(&dir);
    let src = source("caches");
    let first = compiler.compile(&src, "sm_90").unwrap();
    let again = compiler.compile(&src, "sm_90").unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(
        compiler.stats(),
        CompileStats {
            compiled: 1,
            memory_hits: 1,
            ..CompileStats::default()
        }
    );
    assert!(first.ptx.contains(".target sm_90"), "{}", first.ptx);
    assert!(first.ptx.contains(".entry scale("), "{}", first.ptx);
    // No fast math: correctly rounded division and no FMA contraction survive as options.
    let flags = compiler.flags("sm_90").unwrap();
    assert!(
        flags.contains(&"--gpu-architecture=compute_90".to_string()),
        "{flags:?}"
    );
    assert!(flags.contains(&"--fmad=false".to_string()), "{flags:?}");
    assert!(!flags.iter().any(|f| f.contains("fast_math")), "{flags:?}");
    let key = first.key.clone();
    assert_eq!(key, compiler.key(&src, "sm_90").unwrap());
    assert_eq!(first.path, dir.join(format!("{key}.ptx")));
    assert_eq!(
        listing(&dir),
        [
            format!("{key}.cu"),
            format!("{key}.ptx"),
            format!("{key}.sha256")
        ]
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(format!("{key}.cu"))).unwrap(),
        src
    );

    // Another architecture is another entry, and its PTX targets it.
    let sm80 = compiler.compile(&src, "sm_80").unwrap();
    assert_ne!(sm80.key, key);
    assert!(sm80.ptx.contains(".target sm_80"));
    // Other spellings of an architecture are the same entry.
    let spelled = compiler.compile(&src, "compute_80").unwrap();
    assert!(Arc::ptr_eq(&spelled, &sm80));
    assert_eq!(spelled.arch, "sm_80");

    // A new compiler reads both from disk.
    let fresh = strict(&dir);
    let from_disk = fresh.compile(&src, "sm_90").unwrap();
    assert_eq!(from_disk.ptx, first.ptx);
    fresh.compile(&src, "sm_80").unwrap();
    assert_eq!(
        fresh.stats(),
        CompileStats {
            disk_hits: 2,
            ..CompileStats::default()
        }
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_ptx_is_rebuilt() {
    if !nvrtc_ready("damaged_ptx_is_rebuilt") {
        return;
    }
    let dir = temp_dir("damaged");
    let src = source("damaged");
    let good = strict(&dir).compile(&src, "sm_80").unwrap();
    let ptx = dir.join(format!("{}.ptx", good.key));
    let digest = dir.join(format!("{}.sha256", good.key));
    type Damage = fn(&Path, &Path);
    let damages: [(&str, Damage); 3] = [
        ("truncated", |ptx, _| {
            let text = std::fs::read(ptx).unwrap();
            std::fs::write(ptx, &text[..text.len() / 2]).unwrap();
        }),
        ("no digest", |_, digest| {
            std::fs::remove_file(digest).unwrap()
        }),
        // Consistent digest, but not PTX: the loader's check catches it.
        ("not ptx", |ptx, digest| {
            std::fs::write(ptx, b"hello").unwrap();
            let hex: String = sha2_hex(b"hello");
            std::fs::write(digest, hex).unwrap();
        }),
    ];
    for (what, damage) in damages {
        damage(&ptx, &digest);
        let compiler = strict(&dir);
        let rebuilt = compiler.compile(&src, "sm_80").unwrap();
        assert_eq!(rebuilt.ptx, good.ptx, "{what}");
        assert_eq!(
            compiler.stats(),
            CompileStats {
                compiled: 1,
                rebuilt_corrupt: 1,
                ..CompileStats::default()
            },
            "{what}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn sha2_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn errors_carry_the_log_and_the_kept_source() {
    if !nvrtc_ready("errors_carry_the_log_and_the_kept_source") {
        return;
    }
    let dir = temp_dir("errors");
    let compiler = strict(&dir);
    let broken = "extern \"C\" __global__ void k(float *y) { y[0] = undeclared_thing_42; }\n";
    let err = compiler.compile(broken, "sm_90").unwrap_err();
    let ErrorKind::Backend(message) = &err.kind else {
        panic!("expected a backend error, got {err}");
    };
    assert!(message.contains("undeclared_thing_42"), "{message}");
    let kept = dir.join(format!("{}.cu", compiler.key(broken, "sm_90").unwrap()));
    assert!(message.contains(&kept.display().to_string()), "{message}");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), broken);
    assert_eq!(compiler.stats(), CompileStats::default());

    // A warning is an error for a strict compiler, and the log is kept for a lenient one.
    let warns = "extern \"C\" __global__ void k(float *y) { int unused_local_7; y[0] = 1.0f; }\n";
    let err = compiler.compile(warns, "sm_80").unwrap_err().to_string();
    assert!(
        err.contains("unused_local_7") && err.contains("warning"),
        "{err}"
    );
    let lenient = NvrtcCompiler::new(CompileOptions::from_env().with_cache_dir(&dir));
    let module = lenient.compile(warns, "sm_80").unwrap();
    assert!(module.log.contains("unused_local_7"), "{}", module.log);
    // The disk entry remembers the warning: a strict compiler still refuses it.
    let err = strict(&dir)
        .compile(warns, "sm_80")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unused_local_7"), "{err}");

    // Architectures NVRTC cannot target are named.
    for arch in ["sm_10", "sm_9000", "banana"] {
        let err = compiler.compile(SCALE, arch).unwrap_err().to_string();
        assert!(err.contains(arch), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- the command line ----

fn fusebox(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    command.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("fusebox runs")
}

/// `fusebox optimize GRAPH --profile h200 --emit cuda --out OUT`, which must succeed.
fn emit_cuda(graph: &str, out: &Path) -> std::process::Output {
    let output = fusebox(
        &[
            "optimize",
            graph,
            "--profile",
            "h200",
            "--emit",
            "cuda",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `optimize --emit cuda` writes one self-contained .cu with every kernel of the optimized
/// graph, and that file compiles.
#[test]
fn emit_cuda_writes_a_module_that_compiles() {
    let dir = temp_dir("emit");
    let out = dir.join("lstm_cell.cu");
    emit_cuda("examples/lstm_cell.ron", &out);
    let text = std::fs::read_to_string(&out).unwrap();
    let graph = graph::file::load(Path::new("examples/lstm_cell.ron"), &rules().ops)
        .unwrap()
        .0;
    let program = program(&graph, Fusion::Fused("h200"), None).unwrap();
    let kernels = named(&program);
    assert_eq!(text, emit_module(&kernels, &EmitOptions::default()));
    assert!(text.contains("#include <cuda_fp16.h>"));
    if nvrtc_ready("emit_cuda_writes_a_module_that_compiles") {
        let names: Vec<&str> = kernels.iter().map(|(n, _)| n.as_str()).collect();
        for ptx in compile_everywhere(compiler(), &text, "lstm_cell.cu") {
            assert_entries(&ptx, &names, "lstm_cell.cu");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `optimize --emit cuda` writes softmax and layernorm as one row kernel each, as the CPU
/// partition has them: the CUDA backend runs row kernels, so nothing demotes their reductions.
#[test]
fn emit_cuda_writes_softmax_and_layernorm_as_one_row_kernel() {
    let dir = temp_dir("emit-rows");
    for example in ["softmax", "layernorm"] {
        let out = dir.join(format!("{example}.cu"));
        let graph = format!("examples/{example}.ron");
        let output = emit_cuda(&graph, &out);
        let report = String::from_utf8_lossy(&output.stdout);
        assert!(report.contains("-> 1 "), "{example}: {report}");
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(
            text.matches("_params {").count(),
            1,
            "{example}: one kernel"
        );
        assert!(
            text.contains("row kernel: 3 passes over each row, one block per row"),
            "{example}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fusebox info` says where NVRTC was found, or why it was not, without crashing either way.
#[test]
fn info_names_what_is_missing() {
    let missing = fusebox(&["info"], &[("FUSEBOX_CUDA_DIR", "/nonexistent/cuda")]);
    assert!(
        missing.status.success(),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    let text = String::from_utf8_lossy(&missing.stdout);
    assert!(
        text.contains("NVRTC: not available: FUSEBOX_CUDA_DIR=/nonexistent/cuda holds no NVRTC"),
        "{text}"
    );
    assert!(text.contains("nvidia-cuda-nvrtc-cu12"), "{text}");
    assert!(text.contains("CUDA driver library: "), "{text}");
    assert!(text.contains("cuBLAS: "), "{text}");

    if let Ok(setup) = libs::nvrtc_available() {
        let text = String::from_utf8_lossy(&fusebox(&["info"], &[]).stdout).into_owned();
        let line = format!("NVRTC: {}.{} from ", setup.version.0, setup.version.1);
        assert!(text.contains(&line), "{text}");
        assert!(
            text.contains(&format!("CUDA headers: {}", setup.include_dir.display())),
            "{text}"
        );
    }
}
