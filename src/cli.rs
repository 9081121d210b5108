//! The `fusebox` command line.

use crate::backend::cpu::compiler::{Compiler, CompilerConfig};
use crate::backend::{Executable, Target};
use crate::error::{Error, ErrorKind, Result, Site};
use crate::eval::{self, Tensors};
use crate::explain::count;
use crate::graph::{self, Graph, TypeMap};
use crate::optimize::Options;
use crate::rules::RuleSet;
use crate::tensor::Tensor;
use clap::{Parser, Subcommand, ValueEnum};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

mod model;
mod output;
pub mod terminal;

#[derive(Parser, Debug)]
#[command(
    name = "fusebox",
    version,
    about = "Optimizes tensor computation graphs by equality saturation"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate a graph and print each value's inferred dtype and shape.
    Check {
        graph: PathBuf,
        /// A rule directory laid over the embedded defaults.
        #[arg(long)]
        rules: Option<PathBuf>,
    },
    /// Evaluate a graph and write each output to `DIR/<output>.npy`.
    Run {
        graph: PathBuf,
        #[arg(long, value_enum)]
        backend: Backend,
        /// An input value: NAME=FILE.npy (repeatable).
        #[arg(long = "input", value_name = "NAME=FILE")]
        inputs: Vec<String>,
        /// Fill every input not given by --input with seeded random values.
        #[arg(long)]
        random_inputs: bool,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        #[arg(long)]
        rules: Option<PathBuf>,
        /// Insert casts per this AMP policy of amp.ron (f16, bf16) first; outputs keep their
        /// dtypes. The reference backend evaluates the cast-inserted graph unfused.
        #[arg(long, value_name = "POLICY")]
        amp: Option<String>,
        /// Compiled backends: one kernel per op, no rewrites (the unfused baseline).
        #[arg(long)]
        no_fusion: bool,
        /// CUDA backend: the GPU to run on.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// CUDA backend: reductions without float atomics (bitwise reproducible).
        #[arg(long)]
        deterministic: bool,
    },
    /// Compile a graph and time it on random inputs: median time per run (compilation and
    /// file I/O excluded), bytes moved and GB/s.
    Bench {
        graph: PathBuf,
        #[arg(long, value_enum)]
        backend: Backend,
        /// One kernel per op, no rewrites (the unfused baseline).
        #[arg(long)]
        no_fusion: bool,
        #[arg(long, value_name = "POLICY")]
        amp: Option<String>,
        /// Timed runs, after one warm-up run.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print the result as one JSON object.
        #[arg(long)]
        json: bool,
        #[arg(long)]
        rules: Option<PathBuf>,
        /// CUDA backend: capture a run into a CUDA graph and time its replays.
        #[arg(long)]
        cuda_graph: bool,
        /// CUDA backend: the GPU to run on.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// CUDA backend: reductions without float atomics (bitwise reproducible).
        #[arg(long)]
        deterministic: bool,
    },
    /// Optimize a graph: saturate with the rewrite rules, extract the cheapest form under the
    /// fusion-aware cost model, and report the fused kernels.
    Optimize {
        graph: PathBuf,
        #[arg(long)]
        rules: Option<PathBuf>,
        /// A hardware profile of cost.ron. Default: the CUDA backend's profile with
        /// `--emit cuda` (the kernels are partitioned for the machine they are written for),
        /// otherwise `cpu`.
        #[arg(long)]
        profile: Option<String>,
        /// Print the report for a person: costs compared, rules fired, kernels and their ops.
        #[arg(long, conflicts_with = "json")]
        explain: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Leave out rewrite rules marked finite_only, so Inf and NaN propagate exactly as in
        /// the input graph.
        #[arg(long)]
        strict_ieee: bool,
        /// Insert casts per this AMP policy of amp.ron (f16, bf16) first, then optimize the
        /// cast-inserted graph; outputs keep their dtypes.
        #[arg(long, value_name = "POLICY")]
        amp: Option<String>,
        /// Write the optimized graph (ron), a drawing of its kernels (dot), their C source (c)
        /// or their CUDA source (cuda) to --out.
        #[arg(long, value_enum, requires = "out")]
        emit: Option<Emit>,
        #[arg(long, value_name = "FILE", requires = "emit")]
        out: Option<PathBuf>,
    },
    /// Differentiate a graph: write the joint forward + backward graph (the graph's inputs and
    /// one cotangent `grad_<output>` per floating-point output in; its outputs and one
    /// gradient `grad_<input>` per differentiated input out), or with --split a forward and a
    /// backward graph with the values between them chosen by cost.
    Grad {
        graph: PathBuf,
        #[arg(long)]
        rules: Option<PathBuf>,
        /// Inputs to differentiate with respect to, comma-separated (default: every
        /// floating-point input).
        #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
        wrt: Vec<String>,
        /// Where to write the joint graph.
        #[arg(long, value_name = "FILE", required_unless_present = "split")]
        out: Option<PathBuf>,
        /// Write forward.ron (outputs plus the values the backward needs) and backward.ron
        /// (those values and the cotangents in, gradients out) to DIR instead.
        #[arg(long, value_name = "DIR", conflicts_with = "out")]
        split: Option<PathBuf>,
    },
    /// Import an ONNX model: write DIR/graph.ron and one .npy per weight (all or none).
    Import {
        model: PathBuf,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        #[arg(long)]
        rules: Option<PathBuf>,
    },
    /// List the ops of the catalogue.
    Ops {
        #[arg(long)]
        rules: Option<PathBuf>,
    },
    /// Print the version, the embedded rules and whether CUDA libraries can be loaded.
    Info,
    /// Test every rewrite rule on random instances against the reference evaluator; exit 1
    /// if any rule is unsound, printing a counterexample for each.
    CheckRules {
        /// A rule directory laid over the embedded defaults (its rewrites/*.ron are checked
        /// along with the default rules they do not replace).
        #[arg(long)]
        rules: Option<PathBuf>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Instances per rule and direction.
        #[arg(long, default_value_t = crate::rewrite::soundness::CheckOptions::default().instances)]
        instances: usize,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// The optimized graph in the graph file format.
    Ron,
    /// Graphviz, one cluster per fused kernel.
    Dot,
    /// The C source of the CPU kernels, one translation unit.
    C,
    /// The CUDA source of the GPU kernels: one self-contained .cu file (headers, prelude,
    /// every kernel's entry points) that NVRTC or nvcc compiles as it is.
    Cuda,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The unfused op-by-op evaluator with eager rounding (the oracle).
    Reference,
    /// Generated C kernels, compiled with the system C compiler and cached on disk.
    Cpu,
    /// Generated CUDA kernels compiled with NVRTC (and cuBLAS for matmul), run on an NVIDIA
    /// GPU; needs the CUDA driver.
    Cuda,
}

/// Runs a parsed command and returns what it prints on success.
pub fn run(cli: Cli) -> Result<String> {
    match cli.command {
        Command::Check { graph, rules } => {
            let rules = load_rules(rules.as_deref())?;
            let loaded = model::load(&graph, &rules)?;
            Ok(describe(&loaded.graph, &loaded.types))
        }
        Command::Run {
            graph,
            backend,
            inputs,
            random_inputs,
            seed,
            out,
            rules,
            amp,
            no_fusion,
            device,
            deterministic,
        } => {
            let cuda = crate::backend::cuda::runtime::CudaOptions {
                device,
                deterministic,
                cuda_graph: false,
            };
            if backend != Backend::Cuda && cuda != Default::default() {
                return Err(Error::input(
                    "--device and --deterministic apply to --backend cuda",
                ));
            }
            let rules = load_rules(rules.as_deref())?;
            // A stored value that `--input` replaces is not read at all.
            let replaced: std::collections::BTreeSet<String> = inputs
                .iter()
                .filter_map(|spec| spec.split_once('=').map(|(name, _)| name.to_string()))
                .collect();
            let which = model::Stored::Except(&replaced);
            let graph_file = graph;
            let model::Loaded {
                graph,
                stored,
                files,
                ..
            } = model::load_values(&graph_file, &rules, which)?;
            let values = gather_inputs(&graph, &inputs, stored, random_inputs, seed)?;
            // What this run read must survive its outputs: `--out` may be the graph's own
            // directory, where an output `w` would otherwise replace the stored `w.npy`.
            let mut read: Vec<PathBuf> = vec![graph_file.clone()];
            read.extend(files.into_values());
            read.extend(
                inputs
                    .iter()
                    .filter_map(|spec| spec.split_once('=').map(|(_, file)| PathBuf::from(file))),
            );
            refuse_replacing_what_was_read(&graph, &out, &read)?;
            let options = run_options(amp, no_fusion);
            match backend {
                Backend::Reference => {
                    if no_fusion {
                        return Err(Error::input(
                            "--no-fusion applies to compiled backends; the reference backend never fuses",
                        ));
                    }
                    let (graph, _) =
                        crate::optimize::with_amp(&graph, &rules, options.amp.as_deref())?;
                    let outputs = eval::evaluate(&graph, &rules.ops, &values)?;
                    write_outputs(&graph, &outputs, &out)
                }
                Backend::Cpu => {
                    let compiler = Compiler::new(CompilerConfig::from_env());
                    run_compiled(&graph, &rules, &values, options, &compiler, &out)
                }
                Backend::Cuda => run_compiled(&graph, &rules, &values, options, &cuda, &out),
            }
        }
        Command::Bench {
            graph,
            backend,
            no_fusion,
            amp,
            iters,
            seed,
            json,
            rules,
            cuda_graph,
            device,
            deterministic,
        } => {
            if iters == 0 {
                return Err(Error::input(
                    "--iters 0: bench needs at least one timed run",
                ));
            }
            if backend == Backend::Reference {
                return Err(Error::input(
                    "bench needs a compiled backend: --backend cpu or --backend cuda",
                ));
            }
            let cuda = crate::backend::cuda::runtime::CudaOptions {
                device,
                cuda_graph,
                deterministic,
            };
            if backend != Backend::Cuda && cuda != Default::default() {
                return Err(Error::input(
                    "--cuda-graph, --device and --deterministic apply to --backend cuda",
                ));
            }
            let rules = load_rules(rules.as_deref())?;
            // bench times seeded random values, whatever an input stores: no stored value is
            // read (nor can a broken one stop it).
            let graph = model::load_values(&graph, &rules, model::Stored::None)?.graph;
            let options = run_options(amp, no_fusion);
            let report = if backend == Backend::Cuda {
                bench_compiled(&graph, &rules, options, &cuda, iters, seed)?
            } else {
                let compiler = Compiler::new(CompilerConfig::from_env());
                bench_compiled(&graph, &rules, options, &compiler, iters, seed)?
            };
            Ok(if json {
                let mut text = serde_json::to_string_pretty(&report)
                    .map_err(|e| Error::serialize("the bench report", e))?;
                text.push('\n');
                text
            } else {
                let mut text = format!(
                    "{}: {} ({}), {} moved per run\nmedian {:.3} ms over {} runs (min {:.3} ms): {:.1} GB/s\n",
                    report.graph,
                    count(report.kernels, "kernel"),
                    if report.fusion { "fused" } else { "unfused" },
                    crate::explain::bytes(report.bytes),
                    report.median_ms,
                    report.iters,
                    report.min_ms,
                    report.gbps
                );
                let facts = &report.facts;
                if let (Some(device), Some(launches), Some(copy)) =
                    (&facts.device, facts.launches, facts.copy_gbps)
                {
                    let _ = writeln!(
                        text,
                        "on {device}: {} per run{}; a device copy of the same bytes: {copy:.1} GB/s",
                        count(launches, "device operation"),
                        if facts.cuda_graph == Some(true) {
                            ", replayed from a CUDA graph"
                        } else {
                            ""
                        },
                    );
                }
                text
            })
        }
        Command::Optimize {
            graph,
            rules,
            profile,
            explain,
            json,
            emit,
            out,
            strict_ieee,
            amp,
        } => {
            let rules = load_rules(rules.as_deref())?;
            let graph = model::load(&graph, &rules)?.graph;
            let profile = profile.unwrap_or_else(|| {
                let target = if emit == Some(Emit::Cuda) {
                    <crate::backend::cuda::runtime::CudaOptions as Target>::PROFILE
                } else {
                    <Compiler as Target>::PROFILE
                };
                target.to_string()
            });
            let options = crate::optimize::Options {
                profile,
                progress: true,
                strict_ieee,
                amp,
                ..Default::default()
            };
            let optimized = crate::optimize::optimize(&graph, &rules, &options)?;
            if let (Some(emit), Some(path)) = (emit, &out) {
                let text = match emit {
                    Emit::Ron => graph::file::to_ron(&optimized.graph),
                    Emit::Dot => crate::explain::to_dot(&optimized),
                    Emit::C => {
                        let program = crate::lower::lower(&optimized.dag, &optimized.partition)?;
                        crate::backend::cpu::module_source(&program).0
                    }
                    Emit::Cuda => {
                        let program = crate::lower::lower(&optimized.dag, &optimized.partition)?;
                        cuda_source(&program)
                    }
                };
                write_file(path, &text)?;
            }
            Ok(if json {
                let mut text = serde_json::to_string_pretty(&optimized.report)
                    .map_err(|e| Error::serialize("the optimization report", e))?;
                text.push('\n');
                text
            } else if explain {
                // With AMP the casts the policy inserted are not the rewrites' doing.
                let names = optimized
                    .input
                    .nodes
                    .iter()
                    .map(|n| n.name.clone())
                    .collect();
                crate::explain::explain(&optimized, &names)
            } else {
                crate::explain::summary(&optimized.report)
            })
        }
        Command::Grad {
            graph,
            rules,
            wrt,
            out,
            split,
        } => {
            let rules = load_rules(rules.as_deref())?;
            let loaded = model::load(&graph, &rules)?;
            let written = Written {
                out: out.as_deref(),
                split: split.as_deref(),
                source: &graph,
            };
            differentiate(&loaded, &rules, wrt, &written)
        }
        Command::Import { model, out, rules } => {
            let rules = load_rules(rules.as_deref())?;
            model::import(&model, &out, &rules)
        }
        Command::Ops { rules } => {
            let rules = load_rules(rules.as_deref())?;
            Ok(list_ops(&rules))
        }
        Command::Info => Ok(info()),
        Command::CheckRules {
            rules,
            seed,
            instances,
            json,
        } => check_rules(rules.as_deref(), seed, instances, json),
    }
}

/// Where `grad` writes (`--out` or `--split`), and the graph file it read.
struct Written<'a> {
    out: Option<&'a Path>,
    split: Option<&'a Path>,
    source: &'a Path,
}

/// Refuses to write graph file `target` in place of a file `grad` read: the graph being
/// differentiated or one of its stored values (the joint graph may still refer to it). A link
/// at `target` is replaced, not written through, so only the file itself counts.
fn refuse_overwriting_sources(
    target: &Path,
    written: &Written,
    loaded: &model::Loaded,
) -> Result<()> {
    let is_link = std::fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink());
    let Some(real) = target.canonicalize().ok().filter(|_| !is_link) else {
        return Ok(());
    };
    let what = if written.source.canonicalize().is_ok_and(|s| s == real) {
        "the graph being differentiated".to_string()
    } else if let Some((input, _)) = loaded.files.iter().find(|(_, file)| **file == real) {
        format!("the stored value of input `{input}`")
    } else {
        return Ok(());
    };
    Err(Error::input(format!(
        "{} is {what}; writing there would replace it: choose another {}",
        target.display(),
        if written.out.is_some() {
            "--out file"
        } else {
            "--split directory"
        }
    )))
}

/// `grad`: the joint graph to `--out`, or the forward and backward graphs to the `--split`
/// directory, and a summary of the names made and, when split, of what crosses between the
/// two. Stored values the written graphs need are copied beside them (see
/// [`model::carry_values`]), never in place of a file.
fn differentiate(
    loaded: &model::Loaded,
    rules: &RuleSet,
    wrt: Vec<String>,
    written: &Written,
) -> Result<String> {
    use crate::autodiff::{Wrt, grad, split::split};
    let (out, split_dir) = (written.out, written.split);
    let graph = &loaded.graph;
    let wrt = if wrt.is_empty() {
        Wrt::AllFloatInputs
    } else {
        Wrt::Inputs(wrt)
    };
    let joint = grad(graph, &rules.ops, &rules.gradients, &wrt)?;
    let pairs = |list: &[(String, String)]| {
        list.iter()
            .map(|(a, b)| format!("{a} -> {b}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "{}: {} backward nodes\ncotangents: {}\ngradients: {}\n",
        joint.graph.name,
        joint.graph.nodes.len() - graph.nodes.len(),
        if joint.cotangents.is_empty() {
            "none (no floating-point output)".to_string()
        } else {
            pairs(&joint.cotangents)
        },
        if joint.gradients.is_empty() {
            "none (no floating-point input)".to_string()
        } else {
            pairs(&joint.gradients)
        },
    );
    for (wanted, given) in &joint.renamed {
        let _ = writeln!(
            text,
            "note: `{wanted}` is already a name in the graph; using `{given}`"
        );
    }
    match (out, split_dir) {
        (_, Some(dir)) => {
            let halves = split(graph, &joint, &rules.ops)?;
            std::fs::create_dir_all(dir).map_err(|e| Error::write(dir.display(), e))?;
            // Both halves read the parameters they share with the model by name; their
            // stored values are carried once, for whichever half reads them.
            let names: Vec<String> = halves
                .forward
                .inputs
                .iter()
                .chain(&halves.backward.inputs)
                .map(|i| i.name.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            for file in ["forward.ron", "backward.ron"] {
                refuse_overwriting_sources(&dir.join(file), written, loaded)?;
            }
            let (values, copies) =
                model::carry_values(loaded, &names, dir, &["forward.ron", "backward.ron"])?;
            let texts = [
                (
                    "forward.ron",
                    graph::file::to_ron_with_values(&halves.forward, &values),
                ),
                (
                    "backward.ron",
                    graph::file::to_ron_with_values(&halves.backward, &values),
                ),
            ];
            let writes: Vec<(String, model::Writer)> = texts
                .iter()
                .map(|(name, text)| {
                    let write: model::Writer = Box::new(move |path: &Path| {
                        std::fs::write(path, text).map_err(|e| e.to_string())
                    });
                    (name.to_string(), write)
                })
                .collect();
            let copied = write_with_copies(dir, writes, copies)?;
            if copied > 0 {
                let _ = writeln!(text, "stored values written beside them: {copied}");
            }
            let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
            let _ = writeln!(
                text,
                "saved: {} ({:.2} MiB; saving every value the backward reads: {:.2} MiB)",
                if halves.saved.is_empty() {
                    "nothing".to_string()
                } else {
                    halves.saved.join(", ")
                },
                mib(halves.saved_bytes),
                mib(halves.save_all_bytes)
            );
            let _ = writeln!(
                text,
                "recomputed in the backward: {}",
                if halves.recomputed.is_empty() {
                    "nothing".to_string()
                } else {
                    halves.recomputed.join(", ")
                }
            );
            let _ = writeln!(
                text,
                "wrote forward.ron and backward.ron to {}",
                dir.display()
            );
        }
        (Some(path), None) => {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let file = path
                .file_name()
                .and_then(|f| f.to_str())
                .ok_or_else(|| Error::input(format!("--out {} names no file", path.display())))?;
            std::fs::create_dir_all(dir).map_err(|e| Error::write(dir.display(), e))?;
            let names: Vec<String> = joint.graph.inputs.iter().map(|i| i.name.clone()).collect();
            refuse_overwriting_sources(path, written, loaded)?;
            let (values, copies) = model::carry_values(loaded, &names, dir, &[file])?;
            if copies.is_empty() {
                write_file(
                    path,
                    &graph::file::to_ron_with_values(&joint.graph, &values),
                )?;
            } else {
                let ron = graph::file::to_ron_with_values(&joint.graph, &values);
                let writes: Vec<(String, model::Writer)> = vec![(
                    file.to_string(),
                    Box::new(|p: &Path| std::fs::write(p, &ron).map_err(|e| e.to_string())),
                )];
                let copied = write_with_copies(dir, writes, copies)?;
                let _ = writeln!(text, "stored values written beside it: {copied}");
            }
            let _ = writeln!(text, "wrote {}", path.display());
        }
        (None, None) => unreachable!("clap requires --out or --split"),
    }
    Ok(text)
}

/// The pipeline options `run` and `bench` share (the cost profile is the backend's).
fn run_options(amp: Option<String>, no_fusion: bool) -> Options {
    Options {
        amp,
        fusion: !no_fusion,
        ..Options::default()
    }
}

/// `run` on a compiled backend: prepare for `target` (optimized for its cost profile), run
/// once, write the outputs.
fn run_compiled<T: Target>(
    graph: &Graph,
    rules: &RuleSet,
    values: &Tensors,
    options: Options,
    target: &T,
    out: &Path,
) -> Result<String> {
    let options = Options {
        profile: T::PROFILE.into(),
        ..options
    };
    let mut prepared = crate::runner::prepare(graph, rules, &options, target)?;
    let outputs = prepared.executable.run_tensors(values)?;
    let mut text = format!(
        "{} on {}: {}\n",
        graph.name,
        prepared.executable.describe(),
        count(prepared.partition.kernels.len(), "kernel")
    );
    text += &write_outputs(graph, &outputs, out)?;
    Ok(text)
}

/// `bench` on a compiled backend, optimized for its cost profile.
fn bench_compiled<T: Target>(
    graph: &Graph,
    rules: &RuleSet,
    options: Options,
    target: &T,
    iters: usize,
    seed: u64,
) -> Result<crate::runner::BenchReport> {
    let options = Options {
        profile: T::PROFILE.into(),
        ..options
    };
    let mut prepared = crate::runner::prepare(graph, rules, &options, target)?;
    crate::runner::bench(&mut prepared, graph, &options, iters, seed)
}

/// One line per value: name, op, dtype, shape.
pub fn describe(graph: &Graph, types: &TypeMap) -> String {
    let mut rows: Vec<[String; 4]> = Vec::new();
    for input in &graph.inputs {
        let t = &types[&input.name];
        rows.push([
            input.name.clone(),
            "input".into(),
            t.dtype.to_string(),
            format!("{:?}", t.shape),
        ]);
    }
    for node in &graph.nodes {
        let t = &types[&node.name];
        rows.push([
            node.name.clone(),
            node.op.clone(),
            t.dtype.to_string(),
            format!("{:?}", t.shape),
        ]);
    }
    let mut out = format!(
        "graph `{}`: {}, {}, {}\n",
        graph.name,
        count(graph.inputs.len(), "input"),
        count(graph.nodes.len(), "node"),
        count(graph.outputs.len(), "output")
    );
    out += &table(&rows);
    let _ = writeln!(out, "outputs: {}", graph.outputs.join(", "));
    out
}

/// The widest a padded column gets: a longer cell (a 70,000-character node name) overflows its
/// row instead of widening every row, and `format!`'s width, which panics past 65,535, is
/// never used.
const MAX_COLUMN: usize = 48;

fn table(rows: &[[String; 4]]) -> String {
    let mut widths = [0; 4];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count().min(MAX_COLUMN));
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::from(" ");
        for (cell, width) in row.iter().zip(widths).take(3) {
            line.push(' ');
            line += cell;
            let pad = width.saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad + 1));
        }
        line.push(' ');
        line += &row[3];
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// Reads `--input NAME=FILE` values and fills the rest randomly when asked.
/// Inputs with stored values (a model's weights) take them unless `--input` gives another.
fn gather_inputs(
    graph: &Graph,
    specs: &[String],
    stored: Tensors,
    random: bool,
    seed: u64,
) -> Result<Tensors> {
    let mut values = Tensors::new();
    // Checked before any file is read: a second value for one input is a mistake to name, not
    // a silent override.
    let mut given = std::collections::HashSet::new();
    for spec in specs {
        if let Some((name, _)) = spec.split_once('=')
            && !given.insert(name)
        {
            return Err(Error::input(format!(
                "--input `{name}` is given more than once"
            )));
        }
    }
    for spec in specs {
        let (name, file) = spec
            .split_once('=')
            .ok_or_else(|| Error::input(format!("--input `{spec}` must be NAME=FILE.npy")))?;
        let declared = graph.input(name).ok_or_else(|| {
            Error::input(format!(
                "--input `{name}`: graph `{}` has no input of that name{}",
                graph.name,
                crate::error::hint(name, graph.inputs.iter().map(|i| i.name.as_str()))
            ))
        })?;
        let tensor = Tensor::read_npy(Path::new(file))
            .map_err(|e| Error::at_node(name, ErrorKind::Input(e)))?;
        if tensor.shape() != declared.shape.as_slice() {
            return Err(Error::at_node(
                name,
                ErrorKind::Input(format!(
                    "{file} holds shape {:?}, the graph declares {:?}",
                    tensor.shape(),
                    declared.shape
                )),
            ));
        }
        // A file in a wider or narrower type of the same kind is converted to the declared
        // dtype, so bf16 inputs can come from float32 files (NumPy has no bf16); a file of
        // another kind (floats for an integer input) is refused.
        let tensor = tensor
            .into_declared(declared.dtype, &format!("`{file}`"), name)
            .map_err(|e| Error::at_node(name, ErrorKind::Input(e)))?;
        values.insert(name.to_string(), tensor);
    }
    for (name, value) in stored {
        values.entry(name).or_insert(value);
    }
    let mut missing = Vec::new();
    for (index, input) in graph.inputs.iter().enumerate() {
        if values.contains_key(&input.name) {
            continue;
        }
        if !random {
            missing.push(input.name.as_str());
            continue;
        }
        eval::check_size(&input.name, &input.shape)?;
        values.insert(
            input.name.clone(),
            eval::try_random_input(graph, index, seed)?,
        );
    }
    if !missing.is_empty() {
        return Err(Error::input(format!(
            "no value for input(s) {}: pass --input NAME=FILE.npy or --random-inputs",
            missing.join(", ")
        )));
    }
    Ok(values)
}

/// Refuses, before anything runs, a `run --out DIR` whose outputs would replace a file the
/// run read (`read`: the graph or model, stored values, `--input` files), such as an output
/// `w` written beside the graph's stored `w.npy`, however either path is spelled.
fn refuse_replacing_what_was_read(graph: &Graph, dir: &Path, read: &[PathBuf]) -> Result<()> {
    let mut names: Vec<String> = Vec::new();
    for name in &graph.outputs {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    let Ok(files) = output::check_distinct(&names, "outputs") else {
        return Ok(()); // write_outputs reports the clash itself
    };
    for (name, file) in names.iter().zip(&files) {
        let target = dir.join(file);
        if let Some(source) = read.iter().find(|read| output::same_file(read, &target)) {
            return Err(Error::at_node(
                name,
                ErrorKind::Input(format!(
                    "output file {} is {}, which this run reads; write the outputs to another directory (nothing was written)",
                    target.display(),
                    source.display()
                )),
            ));
        }
    }
    Ok(())
}

/// Writes every output of `graph` to `dir`, all or none (see [`output::write_all_or_none`]),
/// each under the file name [`output::file_name`] gives its name, so no output name, however
/// written, puts a file outside `dir`.
fn write_outputs(graph: &Graph, outputs: &Tensors, dir: &Path) -> Result<String> {
    // An output listed twice is one file, written once.
    let mut names: Vec<String> = Vec::new();
    for name in &graph.outputs {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    let files = output::check_distinct(&names, "outputs").map_err(Error::input)?;
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::write(
            dir.display(),
            format!("cannot create the output directory: {e}"),
        )
    })?;
    let writes: Vec<(String, _)> = names
        .iter()
        .zip(&files)
        .map(|(name, file)| {
            let tensor = &outputs[name];
            (file.clone(), move |path: &Path| tensor.write_npy(path))
        })
        .collect();
    output::write_all_or_none(dir, &writes).map_err(|e| {
        let name = names
            .iter()
            .zip(&files)
            .find(|(_, file)| e.path.file_name().is_some_and(|f| f == file.as_str()))
            .map_or("", |(name, _)| name.as_str());
        let mut error = Error::write(
            e.path.display(),
            format!("{}; no output was written", e.message),
        );
        if !name.is_empty() {
            error.site.node = Some(name.to_string());
        }
        error
    })?;
    let mut report = String::new();
    for (name, file) in names.iter().zip(&files) {
        let tensor = &outputs[name];
        let _ = writeln!(
            report,
            "{name}: {}{:?} -> {}{}",
            tensor.dtype,
            tensor.shape(),
            dir.join(file).display(),
            summary(tensor)
        );
    }
    Ok(report)
}

/// Min, max and mean of the finite values, and counts of the others. Integers print their
/// exact minimum and maximum (an f64 would show 2^53 + 1 as 2^53).
fn summary(t: &Tensor) -> String {
    if let crate::tensor::Data::Int(ints) = &t.data {
        let (Some(min), Some(max)) = (ints.iter().min(), ints.iter().max()) else {
            return String::new();
        };
        let mean = ints.iter().map(|&v| v as f64).sum::<f64>() / ints.len() as f64;
        return format!("  min {min} max {max} mean {mean:.6}");
    }
    let values = t.floats();
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let nan = values.iter().filter(|v| v.is_nan()).count();
    let inf = values.iter().filter(|v| v.is_infinite()).count();
    let mut s = String::new();
    if !finite.is_empty() {
        let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let _ = write!(s, "  min {min:.6} max {max:.6} mean {mean:.6}");
    }
    if nan > 0 {
        let _ = write!(s, "  {nan} NaN");
    }
    if inf > 0 {
        let _ = write!(s, "  {inf} inf");
    }
    s
}

fn list_ops(rules: &RuleSet) -> String {
    let rows: Vec<[String; 4]> = rules
        .ops
        .ops()
        .map(|op| {
            let what = match op.formula() {
                Some(f) => f.to_string(),
                None => format!("builtin {}", op.builtin().map(|b| b.name()).unwrap_or("?")),
            };
            [
                op.name().to_string(),
                format!("{:?}", op.kind()).to_lowercase(),
                format!("({})", op.spec.operands.join(", ")),
                what,
            ]
        })
        .collect();
    let composites = rules.ops.composites().map(|c| {
        let parts: Vec<&str> = c.body.iter().map(|n| n.op.as_str()).collect();
        [
            c.name().to_string(),
            "composite".to_string(),
            format!("({})", c.spec.operands.join(", ")),
            parts.join(" → "),
        ]
    });
    let rows: Vec<[String; 4]> = rows.into_iter().chain(composites).collect();
    table(&rows)
}

/// The version, the rules, and where the CUDA libraries were found (or what is missing and
/// how to get it); the probes load libraries but never touch a GPU.
fn info() -> String {
    let rules = RuleSet::defaults();
    format!(
        "fusebox {}\nembedded rules: {} ops\n{}",
        env!("CARGO_PKG_VERSION"),
        rules.ops.len(),
        crate::backend::cuda::libs::describe()
    )
}

/// The CUDA translation unit of `program`'s kernels, each once (default emit options: what
/// the runtime compiles).
fn cuda_source(program: &crate::lower::Program) -> String {
    use crate::backend::cuda::emit::{EmitOptions, emit_program};
    emit_program(&program.kernels, &EmitOptions::default()).0
}

/// `fusebox check-rules`: the report goes to stdout whatever the outcome, so a person (or a
/// JSON reader) sees every counterexample; an unsound rule also makes the command fail, with
/// the rules and their files named on stderr, so CI stops on it.
fn check_rules(dir: Option<&Path>, seed: u64, instances: usize, json: bool) -> Result<String> {
    use crate::rewrite::soundness::{self, CheckOptions};
    let set = load_rules(dir)?;
    let options = CheckOptions {
        seed,
        instances,
        ..CheckOptions::default()
    };
    let report = soundness::check_rules(&set.rewrites, &set.ops, &options);
    let templates = crate::autodiff::verify::check_templates(&set.ops, &set.gradients);
    let derivatives = crate::autodiff::verify::check_derivatives(&set.ops, seed);
    let composites = check_composites(&set);
    let text = if json {
        let mut value = report.to_json();
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "gradient_templates".into(),
                templates_json(&templates, &set.gradients.file),
            );
            object.insert("derivatives".into(), derivatives_json(&derivatives));
            object.insert("composites".into(), composites_json(&composites));
            object.insert(
                "onnx_table".into(),
                serde_json::json!({
                    "file": set.onnx.file,
                    "maps": set.onnx.maps.len(),
                    "op_types": set.onnx.op_types().len(),
                }),
            );
        }
        let mut t = serde_json::to_string_pretty(&value).expect("JSON values print");
        t.push('\n');
        t
    } else {
        report.render()
            + &render_templates(&templates, &set.gradients.file)
            + &render_derivatives(&derivatives)
            + &render_composites(&composites)
            + &render_onnx_table(&set.onnx)
    };
    let wrong_composites: Vec<String> = composites
        .iter()
        .filter(|c| matches!(c.outcome, CompositeOutcome::Gradient(e) if e > COMPOSITE_TOLERANCE))
        .map(|c| format!("`{}`", c.name))
        .collect();
    let wrong_derivatives: Vec<String> = derivatives
        .iter()
        .filter(|c| !c.passed())
        .map(|c| format!("`{}` (operand `{}`)", c.op, c.operand))
        .collect();
    // Every kind of failure is named, not only the first: a wrong derivative also makes the
    // composites built on it wrong, and a reader fixing one should see both.
    let mut failures: Vec<String> = Vec::new();
    let unsound: Vec<String> = report
        .unsound_rules()
        .into_iter()
        .map(|(file, rule)| format!("`{rule}` ({file})"))
        .collect();
    if !unsound.is_empty() {
        let noun = if unsound.len() == 1 { "rule" } else { "rules" };
        failures.push(format!(
            "{} unsound rewrite {noun}: {}",
            unsound.len(),
            unsound.join(", ")
        ));
    }
    if !templates.passed() {
        failures.push(format!(
            "gradient templates of {} disagree with finite differences or are unchecked",
            set.gradients.file
        ));
    }
    if !wrong_derivatives.is_empty() {
        failures.push(format!(
            "the derivatives of op(s) {} disagree with finite differences of their formulas or are unchecked",
            wrong_derivatives.join(", ")
        ));
    }
    if !wrong_composites.is_empty() {
        failures.push(format!(
            "the gradients of composite op(s) {} disagree with finite differences",
            wrong_composites.join(", ")
        ));
    }
    if failures.is_empty() {
        return Ok(text);
    }
    // The report goes out before the error; a reader that went away is no reason to hide
    // the failures from stderr.
    if let Err(e) = terminal::print(&text) {
        return Err(stdout_error(&e));
    }
    Err(Error::new(
        Site::default(),
        ErrorKind::Rule(failures.join("; ")),
    ))
}

/// The largest relative disagreement between the gradient through a composite's parts and
/// central differences, in f64, on values away from the kinks at 0.
const COMPOSITE_TOLERANCE: f64 = 1e-6;

/// What `check-rules` found for one composite op.
struct CompositeCheck {
    name: String,
    outcome: CompositeOutcome,
}

enum CompositeOutcome {
    /// The worst relative error of its gradient against central differences.
    Gradient(f64),
    /// Not checked, and why: its body does not apply to the probe (f64 operands of shape
    /// [2, 3]), or a part has no derivative.
    Unchecked(String),
}

/// Every composite of the catalogue, applied to f64 operands of shape [2, 3] with its default
/// attributes, expanded, and differentiated through its parts; the gradient is compared
/// element by element with central differences. The values are ±[0.5, 1.5], so both sides of
/// every kink at 0 are visited but no kink itself. A wrong gradient means a part's derivative
/// or template is wrong; the parts are what fusion and `grad` use.
fn check_composites(set: &RuleSet) -> Vec<CompositeCheck> {
    use crate::autodiff::verify::{Probe, agreement_at};
    let mut checks = Vec::new();
    for (k, composite) in set.ops.composites().enumerate() {
        let mut builder = crate::graph::GraphBuilder::new(&format!("check_{}", composite.name()));
        let args: Vec<String> = (0..composite.spec.operands.len())
            .map(|i| builder.input(&format!("x{i}"), crate::dtype::DType::F64, &[2, 3]))
            .collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let y = builder.op_with("y", composite.name(), &refs, &[]);
        let graph = builder.finish(&[&y]);
        let outcome = crate::graph::expand::expand(&graph, &set.ops)
            .and_then(|expanded| {
                let mut inputs = Tensors::new();
                for (i, name) in args.iter().enumerate() {
                    let values = (0..6)
                        .map(|j| {
                            let magnitude = 0.5 + ((i * 7 + j * 5 + k) % 11) as f64 / 10.0;
                            if (i + j) % 2 == 0 {
                                magnitude
                            } else {
                                -magnitude
                            }
                        })
                        .collect();
                    let tensor = Tensor::from_values(crate::dtype::DType::F64, &[2, 3], values)
                        .expect("six values for [2, 3]");
                    inputs.insert(name.clone(), tensor);
                }
                agreement_at(
                    &expanded,
                    &set.ops,
                    &set.gradients,
                    Probe::Elementwise,
                    k as u64,
                    &inputs,
                )
            })
            .map(|(_, agreement)| {
                if agreement.singular > 0 {
                    CompositeOutcome::Gradient(f64::INFINITY)
                } else {
                    CompositeOutcome::Gradient(agreement.worst)
                }
            })
            .unwrap_or_else(|e| CompositeOutcome::Unchecked(e.kind.to_string()));
        checks.push(CompositeCheck {
            name: composite.name().to_string(),
            outcome,
        });
    }
    checks
}

/// The ONNX op table was checked as it loaded (every template op and attribute is in the
/// catalogue, every arg names an input or an earlier node); the report says which table.
fn render_onnx_table(table: &crate::rules::MapTable) -> String {
    format!(
        "check-rules: {}: {} Maps for {} ONNX op types, every template op and attribute in the catalogue\n",
        table.file,
        table.maps.len(),
        table.op_types().len()
    )
}

fn render_composites(checks: &[CompositeCheck]) -> String {
    let mut out = String::new();
    let mut worst: f64 = 0.0;
    let (mut agree, mut wrong, mut unchecked) = (0, 0, 0);
    for check in checks {
        match &check.outcome {
            CompositeOutcome::Gradient(e) if *e <= COMPOSITE_TOLERANCE => {
                agree += 1;
                worst = worst.max(*e);
            }
            CompositeOutcome::Gradient(e) => {
                wrong += 1;
                let _ = writeln!(
                    out,
                    "WRONG GRADIENT: composite `{}`: relative error {e:.3e} against finite differences (tolerance {COMPOSITE_TOLERANCE:.0e})",
                    check.name
                );
            }
            CompositeOutcome::Unchecked(why) => {
                unchecked += 1;
                let _ = writeln!(out, "UNCHECKED: composite `{}`: {why}", check.name);
            }
        }
    }
    let _ = writeln!(
        out,
        "check-rules: {} composite ops expanded and differentiated through their parts in f64: {agree} agree with finite differences (worst relative error {worst:.1e}), {wrong} wrong, {unchecked} unchecked",
        checks.len()
    );
    out
}

/// The derivative part of `check-rules`: a line per wrong or unchecked derivative, with the
/// point that shows it, then a summary.
fn render_derivatives(checks: &[crate::autodiff::verify::DerivativeCheck]) -> String {
    use crate::autodiff::verify::{DERIVATIVE_TOLERANCE, DerivativeOutcome};
    let mut out = String::new();
    let (mut agree, mut points, mut worst) = (0, 0, 0.0f64);
    for check in checks {
        match &check.outcome {
            DerivativeOutcome::Agrees {
                points: n,
                worst: w,
            } => {
                agree += 1;
                points += n;
                worst = worst.max(*w);
            }
            DerivativeOutcome::Wrong {
                at,
                g,
                analytic,
                numeric,
            } => {
                let values: Vec<String> = at.iter().map(|(n, v)| format!("{n} = {v}")).collect();
                let _ = writeln!(
                    out,
                    "WRONG DERIVATIVE: op `{}`, operand `{}`: `{}` gives {analytic} but central differences give {numeric}, at {}, g = {g} (tolerance {DERIVATIVE_TOLERANCE:.0e})",
                    check.op,
                    check.operand,
                    check.formula,
                    values.join(", ")
                );
            }
            DerivativeOutcome::Unchecked(why) => {
                let _ = writeln!(
                    out,
                    "UNCHECKED DERIVATIVE: op `{}`, operand `{}`: {why}",
                    check.op, check.operand
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "check-rules: {} derivative formulas of pointwise ops against central differences of their formulas in f64: {agree} agree at {points} points (worst relative error {worst:.1e}), {} wrong or unchecked",
        checks.len(),
        checks.len() - agree
    );
    out
}

fn derivatives_json(checks: &[crate::autodiff::verify::DerivativeCheck]) -> serde_json::Value {
    use crate::autodiff::verify::{DERIVATIVE_TOLERANCE, DerivativeOutcome};
    let list: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| {
            let mut v = serde_json::json!({"op": c.op, "operand": c.operand, "formula": c.formula, "agrees": c.passed()});
            match &c.outcome {
                DerivativeOutcome::Agrees { points, worst } => {
                    v["points"] = (*points).into();
                    v["relative_error"] = (*worst).into();
                }
                DerivativeOutcome::Wrong { at, g, analytic, numeric } => {
                    let at: serde_json::Map<String, serde_json::Value> =
                        at.iter().map(|(n, x)| (n.clone(), (*x).into())).collect();
                    v["counterexample"] = serde_json::json!({"at": at, "g": g, "analytic": analytic, "numeric": numeric});
                }
                DerivativeOutcome::Unchecked(why) => v["unchecked"] = why.clone().into(),
            }
            v
        })
        .collect();
    serde_json::json!({"tolerance": DERIVATIVE_TOLERANCE, "checks": list})
}

fn composites_json(checks: &[CompositeCheck]) -> serde_json::Value {
    let list: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| match &c.outcome {
            CompositeOutcome::Gradient(e) => serde_json::json!({"composite": c.name, "relative_error": e, "agrees": *e <= COMPOSITE_TOLERANCE}),
            CompositeOutcome::Unchecked(why) => serde_json::json!({"composite": c.name, "unchecked": why}),
        })
        .collect();
    serde_json::json!({"tolerance": COMPOSITE_TOLERANCE, "checks": list})
}

/// The gradient-template part of `check-rules`: a line per failing instance or unchecked
/// template, then a summary.
fn render_templates(report: &crate::autodiff::verify::TemplateReport, file: &str) -> String {
    let mut out = String::new();
    let mut worst: f64 = 0.0;
    let mut failing = 0;
    for check in &report.instances {
        match &check.outcome {
            Ok(e) if *e <= report.tolerance => worst = worst.max(*e),
            Ok(e) => {
                failing += 1;
                let _ = writeln!(
                    out,
                    "WRONG GRADIENT: {}: relative error {e:.3e} against finite differences (tolerance {:.0e})",
                    check.instance, report.tolerance
                );
            }
            Err(why) => {
                failing += 1;
                let _ = writeln!(out, "WRONG GRADIENT: {}: {why}", check.instance);
            }
        }
    }
    for (op, operand, index) in &report.unused {
        let _ = writeln!(
            out,
            "UNCHECKED: gradient template {} (`{op}`, operand `{operand}`): no check instance uses it",
            index + 1
        );
    }
    let _ = writeln!(
        out,
        "check-rules: {} gradient checks of {file} in f64: {} agree with finite differences (worst relative error {worst:.1e}), {failing} wrong, {} templates unchecked",
        report.instances.len(),
        report.instances.len() - failing,
        report.unused.len()
    );
    out
}

fn templates_json(
    report: &crate::autodiff::verify::TemplateReport,
    file: &str,
) -> serde_json::Value {
    let instances: Vec<serde_json::Value> = report
        .instances
        .iter()
        .map(|c| match &c.outcome {
            Ok(e) => serde_json::json!({"instance": c.instance, "relative_error": e, "agrees": *e <= report.tolerance}),
            Err(why) => serde_json::json!({"instance": c.instance, "error": why, "agrees": false}),
        })
        .collect();
    let unused: Vec<serde_json::Value> = report
        .unused
        .iter()
        .map(|(op, operand, index)| serde_json::json!({"template": index + 1, "op": op, "operand": operand}))
        .collect();
    serde_json::json!({
        "file": file,
        "tolerance": report.tolerance,
        "instances": instances,
        "unchecked": unused,
        "passed": report.passed(),
    })
}

/// Writes a whole text file, creating its directory as `run --out` does, and naming the path
/// on failure. The file is written beside its final name and renamed over it, so a failure
/// leaves the old file as it was (see [`output::write_atomically`]).
fn write_file(path: &Path, text: &str) -> Result<()> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    parent
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| output::write_atomically(path, text))
        .map_err(|e| Error::write(path.display(), e))
}

/// [`RuleSet::load`], after telling a rule directory that does not exist (a typo in
/// `--rules`) from a path that is something other than a directory. What loading left out
/// (default rewrites that do not hold for an op the directory redefines) is said on stderr,
/// so the command's output stays what it was.
fn load_rules(dir: Option<&Path>) -> Result<RuleSet> {
    if let Some(dir) = dir {
        let missing =
            std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        if missing {
            return Err(Error::new(
                Site::whole_file(&dir.display().to_string()),
                ErrorKind::Io {
                    path: dir.display().to_string(),
                    message: "no such directory".into(),
                },
            ));
        }
    }
    let rules = RuleSet::load(dir)?;
    for warning in &rules.warnings {
        terminal::print_error(&format!("warning: {warning}\n"));
    }
    Ok(rules)
}

/// The error for output that could not be written to stdout (a full disk, `> /dev/full`).
pub fn stdout_error(e: &std::io::Error) -> Error {
    Error::write("standard output", e)
}

/// Writes `files` and the stored-value `copies` beside them into `dir`, all or none; a copy
/// replaces no file (its name was chosen free, and one that appeared meanwhile fails the
/// write). Returns how many values were copied.
fn write_with_copies<'a>(
    dir: &Path,
    mut files: Vec<(String, model::Writer<'a>)>,
    copies: Vec<(String, model::Writer<'a>)>,
) -> Result<usize> {
    let copied = copies.len();
    let new: std::collections::HashSet<String> = copies.iter().map(|(f, _)| f.clone()).collect();
    files.extend(copies);
    output::write_all_or_none_with(dir, &files, &|f: &str| new.contains(f)).map_err(|e| {
        Error::write(
            e.path.display(),
            format!("{}; none of the files was written", e.message),
        )
    })?;
    Ok(copied)
}
