//! `fusebox bench`: a graph compiled for a backend and timed; the report as text or JSON.

use super::model::{check_arrays, read_arrays};
use super::run::run_options;
use super::{Backend, BenchArgs, load_rules, model};
use crate::backend::Target;
use crate::backend::cpu::compiler::{Compiler, CompilerConfig};
use crate::error::{Error, Result};
use crate::eval::Tensors;
use crate::explain::count;
use crate::graph::Graph;
use crate::optimize::Options;
use crate::rules::RuleSet;
use crate::runner::BenchReport;
use std::fmt::Write as _;

/// `bench`: checks the flags against the backend, loads the graph without its stored values,
/// reads the `--input` values, times it and reports.
pub(super) fn bench(args: BenchArgs) -> Result<String> {
    if args.iters == 0 {
        return Err(Error::input(
            "--iters 0: bench needs at least one timed run",
        ));
    }
    if args.backend == Backend::Reference {
        return Err(Error::input(
            "bench needs a compiled backend: --backend cpu or --backend cuda",
        ));
    }
    let cuda = args.gpu.options(args.cuda_graph);
    if args.backend != Backend::Cuda && cuda != Default::default() {
        return Err(Error::input(
            "--cuda-graph, --device and --deterministic apply to --backend cuda",
        ));
    }
    let rules = load_rules(args.rules.as_deref())?;
    // bench times the --input values and seeded random values for the rest, whatever an
    // input stores: no stored value is read (nor can a broken one stop it).
    let arrays = read_arrays(&args.inputs)?;
    let loaded = model::load_for_arrays(
        &args.graph,
        &rules,
        model::Stored::None,
        &args.dims,
        &arrays,
    )?;
    let graph = loaded.graph;
    let given = check_arrays(&graph, arrays)?;
    // The inputs that store values are the weights: the same in every timed run, as they are
    // in every run of a compiled model.
    let options = Options {
        fixed: loaded.storing,
        ..run_options(args.amp, args.no_fusion)
    };
    let timing = Timing {
        iters: args.iters,
        given: &given,
        seed: args.seed,
    };
    let report = if args.backend == Backend::Cuda {
        bench_compiled(&graph, &rules, options, &cuda, &timing)?
    } else {
        let compiler = Compiler::new(CompilerConfig::from_env());
        bench_compiled(&graph, &rules, options, &compiler, &timing)?
    };
    if args.json {
        let mut text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::serialize("the bench report", e))?;
        text.push('\n');
        Ok(text)
    } else {
        Ok(render(&report))
    }
}

/// The report for a person: kernels, bytes, times and, on a device, its launches and the
/// copy speed to compare with.
fn render(report: &BenchReport) -> String {
    let mut text = format!(
        "{}: {} ({}), {} moved per run\nmedian {:.3} ms over {} runs (min {:.3} ms): {:.1} GB/s\n",
        report.graph,
        report.count,
        if report.fusion { "fused" } else { "unfused" },
        crate::explain::bytes(report.bytes),
        report.median_ms,
        report.iters,
        report.min_ms,
        report.gbps
    );
    let _ = writeln!(
        text,
        "optimized in {:.0} ms; kernels {} in {:.0} ms",
        report.optimize_ms,
        match (report.kernels_compiled, report.kernels_cached) {
            (0, 0) => "built".to_string(),
            (0, _) => "found in the cache".to_string(),
            (_, 0) => "compiled".to_string(),
            (compiled, cached) =>
                format!("compiled ({compiled}) and found in the cache ({cached})"),
        },
        report.compile_ms
    );
    let facts = &report.facts;
    if let (Some(device), Some(launches), Some(copy)) =
        (&facts.device, facts.launches, facts.copy_gbps)
    {
        let _ = writeln!(
            text,
            "on {device}: {} per run{}{}{}; a device copy of the same bytes: {copy:.1} GB/s",
            count(launches, "device operation"),
            match facts.cudnn_convolutions {
                Some(n) if n > 0 => format!(" ({} through cuDNN)", count(n, "convolution")),
                _ => String::new(),
            },
            match facts.lt_epilogues {
                Some(n) if n > 0 =>
                    format!(" ({} with its epilogue in cuBLASLt)", count(n, "GEMM")),
                _ => String::new(),
            },
            if facts.cuda_graph == Some(true) {
                ", replayed from a CUDA graph"
            } else {
                ""
            },
        );
    }
    text
}

/// What `bench` times: how many runs, on which values.
struct Timing<'a> {
    iters: usize,
    /// The `--input` values; the other inputs get random values from `seed`.
    given: &'a Tensors,
    seed: u64,
}

/// `bench` on a compiled backend, optimized for its cost profile.
fn bench_compiled<T: Target>(
    graph: &Graph,
    rules: &RuleSet,
    options: Options,
    target: &T,
    timing: &Timing,
) -> Result<BenchReport> {
    let options = Options {
        profile: T::PROFILE.into(),
        ..options
    };
    let mut prepared = crate::runner::prepare(graph, rules, &options, target)?;
    crate::runner::bench(
        &mut prepared,
        graph,
        &options,
        timing.iters,
        timing.given,
        timing.seed,
    )
}
