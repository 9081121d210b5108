//! The `fusebox` command line: its clap definitions and the dispatch to one file per command
//! (`cli/<command>.rs`), each of which turns its arguments into the text the command prints.
//! What a command computes lives in the library; these files read arguments, call it, and
//! print.

use crate::error::{Error, ErrorKind, Result, Site};
use crate::rules::RuleSet;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};

mod bench;
mod check;
mod check_rules;
mod grad;
mod info;
mod model;
mod ops;
mod optimize;
mod output;
mod run;
pub mod terminal;

pub use check::describe;

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
    Check(CheckArgs),
    /// Evaluate a graph and write each output to `DIR/<output>.npy`.
    Run(RunArgs),
    /// Compile a graph and time it on random inputs (or --input values): median time per run
    /// (compilation and file I/O excluded), bytes moved and GB/s. Values the graph stores are
    /// never read.
    Bench(BenchArgs),
    /// Optimize a graph: saturate with the rewrite rules, extract the cheapest form under the
    /// fusion-aware cost model, and report the fused kernels.
    Optimize(OptimizeArgs),
    /// Differentiate a graph: write the joint forward + backward graph (the graph's inputs and
    /// one cotangent `grad_<output>` per floating-point output in; its outputs and one
    /// gradient `grad_<input>` per differentiated input out), or with --split a forward and a
    /// backward graph with the values between them chosen by cost.
    Grad(GradArgs),
    /// Import an ONNX model: write DIR/graph.ron and one .npy per weight (all or none).
    Import(ImportArgs),
    /// List the ops of the catalogue.
    Ops(OpsArgs),
    /// Print the version, the embedded rules and whether CUDA libraries can be loaded.
    Info,
    /// Test every rewrite rule on random instances against the reference evaluator; exit 1
    /// if any rule is unsound, printing a counterexample for each.
    CheckRules(CheckRulesArgs),
}

// The argument structs carry no doc comment of their own: the command's description is its
// variant's, above.

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The graph: a graph file (.ron), or an ONNX model (.onnx).
    pub graph: PathBuf,
    /// A size for a symbolic dimension of an ONNX model (`batch`, `seq`): NAME=SIZE
    /// (repeatable). The names not given are 1.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// A rule directory laid over the embedded defaults.
    #[arg(long)]
    pub rules: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The graph: a graph file (.ron), or an ONNX model (.onnx); the values its inputs store
    /// (a model's weights) are used unless --input gives others.
    pub graph: PathBuf,
    /// A size for a symbolic dimension of an ONNX model (`batch`, `seq`): NAME=SIZE
    /// (repeatable). The --input arrays give the sizes they show; the others are 1.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// Where the graph runs.
    #[arg(long, value_enum)]
    pub backend: Backend,
    /// An input value: NAME=FILE.npy (repeatable).
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Fill every input not given by --input with seeded random values.
    #[arg(long)]
    pub random_inputs: bool,
    /// The seed of the --random-inputs values.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The directory the outputs are written to, one DIR/OUTPUT.npy per output (all or none).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A rule directory laid over the embedded defaults.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Insert casts per this AMP policy of amp.ron (f16, bf16) first; outputs keep their
    /// dtypes. The reference backend evaluates the cast-inserted graph unfused.
    #[arg(long, value_name = "POLICY")]
    pub amp: Option<String>,
    /// Compiled backends: one kernel per op, no rewrites (the unfused baseline).
    #[arg(long)]
    pub no_fusion: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

/// The GPU flags `run` and `bench` share; they apply to `--backend cuda` only.
#[derive(Args, Debug)]
pub struct GpuArgs {
    /// CUDA backend: the GPU to run on.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// CUDA backend: reductions without float atomics (bitwise reproducible).
    #[arg(long)]
    pub deterministic: bool,
    /// CUDA backend: run convolutions as im2col GEMMs through cuBLAS, not through cuDNN.
    #[arg(long)]
    pub gemm_convolutions: bool,
    /// CUDA backend: run the bias, residual, scale and ReLU or tanh GELU after a GEMM in the
    /// GEMM, through cuBLASLt's epilogues (not yet checked on a GPU; off by default).
    #[arg(long)]
    pub lt_epilogues: bool,
}

impl GpuArgs {
    /// The CUDA backend's options these flags give (with a CUDA graph when `cuda_graph`).
    pub fn options(&self, cuda_graph: bool) -> crate::backend::cuda::runtime::CudaOptions {
        crate::backend::cuda::runtime::CudaOptions {
            device: self.device,
            deterministic: self.deterministic,
            cuda_graph,
            gemm_convolutions: self.gemm_convolutions,
            lt_epilogues: self.lt_epilogues,
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The graph: a graph file (.ron), or an ONNX model (.onnx). Values stored for its inputs
    /// (a model's weights) are never read: inputs not given by --input get random values.
    pub graph: PathBuf,
    /// A size for a symbolic dimension of an ONNX model (`batch`, `seq`): NAME=SIZE
    /// (repeatable). The --input arrays give the sizes they show; the others are 1.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// The compiled backend to time: cpu or cuda.
    #[arg(long, value_enum)]
    pub backend: Backend,
    /// An input value: NAME=FILE.npy (repeatable). Inputs not given get seeded random values;
    /// bench never reads a value the graph stores.
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// One kernel per op, no rewrites (the unfused baseline).
    #[arg(long)]
    pub no_fusion: bool,
    /// Insert casts per this AMP policy of amp.ron (f16, bf16) first; outputs keep their
    /// dtypes.
    #[arg(long, value_name = "POLICY")]
    pub amp: Option<String>,
    /// Timed runs, after one warm-up run.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// The seed of the random values of the inputs --input does not give.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// A rule directory laid over the embedded defaults.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// CUDA backend: capture a run into a CUDA graph and time its replays.
    #[arg(long)]
    pub cuda_graph: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

#[derive(Args, Debug)]
pub struct OptimizeArgs {
    /// The graph: a graph file (.ron), or an ONNX model (.onnx).
    pub graph: PathBuf,
    /// A size for a symbolic dimension of an ONNX model (`batch`, `seq`): NAME=SIZE
    /// (repeatable). The names not given are 1. --explain and --json say which sizes were priced.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// A rule directory laid over the embedded defaults.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// A hardware profile of cost.ron. Default: the CUDA backend's profile with
    /// `--emit cuda` (the kernels are partitioned for the machine they are written for),
    /// otherwise `cpu`.
    #[arg(long)]
    pub profile: Option<String>,
    /// Print the report for a person: costs compared, rules fired, kernels and their ops.
    #[arg(long, conflicts_with = "json")]
    pub explain: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Leave out rewrite rules marked finite_only, so Inf, NaN and signed zeros propagate
    /// exactly as in the input graph.
    #[arg(long)]
    pub strict_ieee: bool,
    /// Insert casts per this AMP policy of amp.ron (f16, bf16) first, then optimize the
    /// cast-inserted graph; outputs keep their dtypes.
    #[arg(long, value_name = "POLICY")]
    pub amp: Option<String>,
    /// Write the optimized graph (ron), a drawing of its kernels (dot), their C source (c)
    /// or their CUDA source (cuda) to --out.
    #[arg(long, value_enum, requires = "out")]
    pub emit: Option<Emit>,
    /// The file --emit writes (replaced whole, or left as it was on failure).
    #[arg(long, value_name = "FILE", requires = "emit")]
    pub out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct GradArgs {
    /// The graph to differentiate: a graph file (.ron), or an ONNX model (.onnx).
    pub graph: PathBuf,
    /// A size for a symbolic dimension of an ONNX model (`batch`, `seq`): NAME=SIZE
    /// (repeatable). The names not given are 1.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// A rule directory laid over the embedded defaults.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Inputs to differentiate with respect to, comma-separated (default: every
    /// floating-point input).
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub wrt: Vec<String>,
    /// Where to write the joint graph.
    #[arg(long, value_name = "FILE", required_unless_present = "split")]
    pub out: Option<PathBuf>,
    /// Write forward.ron (outputs plus the values the backward needs) and backward.ron
    /// (those values and the cotangents in, gradients out) to DIR instead.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub split: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The ONNX model (.onnx) to import.
    pub model: PathBuf,
    /// A size for a symbolic dimension of an ONNX model (`batch`, `seq`): NAME=SIZE
    /// (repeatable). The names not given are 1. graph.ron has these sizes.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// The directory graph.ron and the weights' .npy files are written to.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A rule directory laid over the embedded defaults (its ONNX op table maps the model).
    #[arg(long)]
    pub rules: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct OpsArgs {
    /// A rule directory laid over the embedded defaults.
    #[arg(long)]
    pub rules: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CheckRulesArgs {
    /// A rule directory laid over the embedded defaults (its rewrites/*.ron are checked
    /// along with the default rules they do not replace).
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// The seed every random instance and derivative point is drawn from.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Instances per rule and direction.
    #[arg(long, default_value_t = crate::rewrite::soundness::CheckOptions::default().instances)]
    pub instances: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
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
    /// Generated CUDA kernels compiled with NVRTC (cuBLAS for matmul, cuDNN for
    /// convolutions), run on an NVIDIA GPU; needs the CUDA driver.
    Cuda,
}

/// Runs a parsed command and returns what it prints on success.
pub fn run(cli: Cli) -> Result<String> {
    match cli.command {
        Command::Check(args) => check::check(&args),
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::bench(args),
        Command::Optimize(args) => optimize::optimize(args),
        Command::Grad(args) => grad::grad(args),
        Command::Import(args) => {
            let rules = load_rules(args.rules.as_deref())?;
            model::import(&args.model, &args.dims, &args.out, &rules)
        }
        Command::Ops(args) => ops::ops(&args),
        Command::Info => Ok(info::info()),
        Command::CheckRules(args) => check_rules::check_rules(&args),
    }
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
