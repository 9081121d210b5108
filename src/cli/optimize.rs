//! `fusebox optimize`: a graph optimized for a cost profile; the report as a summary, an
//! explanation or JSON, and optionally the result written as a graph, a drawing or source.

use super::{Emit, OptimizeArgs, load_rules, model, write_file};
use crate::backend::Target;
use crate::backend::cpu::compiler::Compiler;
use crate::error::{Error, Result};
use crate::graph;
use crate::optimize::{Optimized, Options};

/// `optimize`: the profile defaults to the backend `--emit` writes for (CUDA for `cuda`,
/// otherwise the CPU's), so the kernels are partitioned for the machine they are written for.
pub(super) fn optimize(args: OptimizeArgs) -> Result<String> {
    let rules = load_rules(args.rules.as_deref())?;
    let loaded = model::load_sized(&args.graph, &rules, model::Stored::All, &args.dims)?;
    let graph = loaded.graph;
    let profile = args.profile.unwrap_or_else(|| {
        let target = if args.emit == Some(Emit::Cuda) {
            <crate::backend::cuda::runtime::CudaOptions as Target>::PROFILE
        } else {
            <Compiler as Target>::PROFILE
        };
        target.to_string()
    });
    let options = Options {
        profile,
        progress: true,
        strict_ieee: args.strict_ieee,
        amp: args.amp,
        // As `run` and `bench` compile it: the stored values are the same on every run.
        fixed: loaded.storing.clone(),
        ..Default::default()
    };
    let optimized = crate::optimize::optimize(&graph, &rules, &options)?;
    if let (Some(emit), Some(path)) = (args.emit, &args.out) {
        write_file(path, &emitted(&optimized, emit)?)?;
    }
    let declared = &loaded.declared;
    Ok(if args.json {
        let mut report = serde_json::to_value(&optimized.report)
            .map_err(|e| Error::serialize("the optimization report", e))?;
        if declared.is_symbolic()
            && let serde_json::Value::Object(fields) = &mut report
        {
            fields.insert("dims".into(), dims_json(declared));
        }
        let mut text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::serialize("the optimization report", e))?;
        text.push('\n');
        text
    } else {
        // A model with symbolic dimensions was priced at some size of each: say which.
        let mut text = if declared.is_symbolic() {
            format!("priced{}\n", model::at_sizes(declared))
        } else {
            String::new()
        };
        if args.explain {
            text += &crate::explain::explain(&optimized);
        } else {
            text += &crate::explain::summary(&optimized.report);
        }
        text
    })
}

/// `{"batch": {"size": 32, "default": false}, …}`: the size each symbolic dimension was
/// priced at, and whether it is the default (no `--dim` gave one).
fn dims_json(declared: &crate::graph::dims::Declared) -> serde_json::Value {
    declared
        .sizes
        .iter()
        .map(|(name, &size)| {
            let default = declared.defaulted.contains(name);
            (
                name.clone(),
                serde_json::json!({"size": size, "default": default}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The text `--emit` writes: the optimized graph, its kernels drawn, or their C or CUDA
/// source.
fn emitted(optimized: &Optimized, emit: Emit) -> Result<String> {
    Ok(match emit {
        Emit::Ron => graph::file::to_ron(&optimized.graph),
        Emit::Dot => crate::explain::to_dot(optimized),
        Emit::C => {
            let program = crate::lower::lower(&optimized.dag, &optimized.partition)?;
            crate::backend::cpu::module_source(&program).0
        }
        Emit::Cuda => {
            let program = crate::lower::lower(&optimized.dag, &optimized.partition)?;
            cuda_source(&program)
        }
    })
}

/// The CUDA translation unit of `program`'s kernels, each once (default emit options: what
/// the runtime compiles).
fn cuda_source(program: &crate::lower::Program) -> String {
    use crate::backend::cuda::emit::{EmitOptions, emit_program};
    emit_program(&program.kernels, &EmitOptions::default()).0
}
