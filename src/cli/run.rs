//! `fusebox run`: a graph evaluated on one backend, its inputs gathered from `--input` files,
//! stored values and seeded random values, its outputs written to `--out`, all or none.

use super::model::{GivenArray, check_arrays, read_arrays};
use super::{Backend, RunArgs, load_rules, model, output};
use crate::error::{Error, ErrorKind, Result};
use crate::eval::{self, Tensors};
use crate::graph::Graph;
use crate::model::{CompileOptions, Model};
use crate::optimize::Options;
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `run`: checks the flags, loads the graph with the stored values `--input` does not
/// replace, refuses outputs that would replace a file the run reads, and runs it through the
/// library's whole-model path ([`crate::model`]): compiled for the backend, run once on the
/// gathered inputs, its outputs written all or none.
pub(super) fn run(args: RunArgs) -> Result<String> {
    let cuda = args.gpu.options(false);
    if args.backend != Backend::Cuda && cuda != Default::default() {
        return Err(Error::input(
            "--device and --deterministic apply to --backend cuda",
        ));
    }
    let rules = load_rules(args.rules.as_deref())?;
    // A stored value that `--input` replaces is not read at all.
    let replaced = replaced_inputs(&args.inputs);
    // The arrays are read first: their shapes size an ONNX model's symbolic dimensions.
    let arrays = read_arrays(&args.inputs)?;
    let loaded = model::load_for_arrays(
        &args.graph,
        &rules,
        model::Stored::Except(&replaced),
        &args.dims,
        &arrays,
    )?;
    // What this run read must survive its outputs: `--out` may be the graph's own
    // directory, where an output `w` would otherwise replace the stored `w.npy`.
    let mut read: Vec<PathBuf> = vec![args.graph.clone()];
    read.extend(loaded.files.values().cloned());
    read.extend(
        args.inputs
            .iter()
            .filter_map(|spec| spec.split_once('=').map(|(_, file)| PathBuf::from(file))),
    );
    let model = Model::from_loaded(loaded, &rules);
    let graph = model.graph();
    let given = gather_inputs(graph, arrays, model.stored(), args.random_inputs, args.seed)?;
    let out = &args.out;
    refuse_replacing_what_was_read(graph, out, &read)?;
    if args.backend == Backend::Reference && args.no_fusion {
        return Err(Error::input(
            "--no-fusion applies to compiled backends; the reference backend never fuses",
        ));
    }
    let backend = match args.backend {
        Backend::Reference => crate::model::Backend::Reference,
        Backend::Cpu => crate::model::Backend::Cpu,
        Backend::Cuda => crate::model::Backend::Cuda,
    };
    let options = CompileOptions {
        amp: args.amp,
        no_fusion: args.no_fusion,
        cuda,
    };
    let mut compiled = model.compile(backend, &options)?;
    let outputs: Tensors = compiled.run(&given)?.into_iter().collect();
    let mut text = match compiled.kernels() {
        Some(count) => format!("{} on {}: {count}\n", graph.name, compiled.describe()),
        None => String::new(),
    };
    text += &write_outputs(graph, &outputs, out)?;
    Ok(text)
}

/// The inputs `--input NAME=FILE` specs name: their stored values are not read.
fn replaced_inputs(specs: &[String]) -> std::collections::BTreeSet<String> {
    specs
        .iter()
        .filter_map(|spec| spec.split_once('=').map(|(name, _)| name.to_string()))
        .collect()
}

/// The pipeline options `run` and `bench` share (the cost profile is the backend's).
pub(super) fn run_options(amp: Option<String>, no_fusion: bool) -> Options {
    Options {
        amp,
        fusion: !no_fusion,
        ..Options::default()
    }
}

/// The values `run` gives the model: `--input NAME=FILE` values, and random ones for the
/// inputs with neither a given nor a stored value when asked. Inputs with stored values (a
/// model's weights) keep them unless `--input` gives another.
fn gather_inputs(
    graph: &Graph,
    arrays: Vec<GivenArray>,
    stored: &Tensors,
    random: bool,
    seed: u64,
) -> Result<BTreeMap<String, Tensor>> {
    let mut values: BTreeMap<String, Tensor> = check_arrays(graph, arrays)?.into_iter().collect();
    let mut missing = Vec::new();
    for (index, input) in graph.inputs.iter().enumerate() {
        if values.contains_key(&input.name) || stored.contains_key(&input.name) {
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
    let files =
        output::check_distinct(&names, "outputs").map_err(|e| Error::input(e.to_string()))?;
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
