//! Where commands get their graph: a RON graph file or an ONNX model, each with the stored
//! values of its parameter inputs, read by the library's [`crate::model`] (so the commands and
//! library users load alike); how derived graphs carry those values; and `fusebox import`,
//! which writes a model as a graph file and its weights.

use super::output;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::eval::Tensors;
use crate::graph;
use crate::graph::Graph;
use crate::graph::dims::{Declared, Specialization, parse_specs};
use crate::graph::file::StoredValues;
use crate::rules::RuleSet;
use crate::tensor::Tensor;
use std::path::Path;

// Loading lives in the library's `model` module, which the CLI shares with library users.
pub use crate::model::{Loaded, Stored};

/// [`load_values`] at the sizes `--dim NAME=SIZE` specs give an ONNX model's symbolic
/// dimensions.
pub fn load_sized(path: &Path, rules: &RuleSet, which: Stored, dims: &[String]) -> Result<Loaded> {
    crate::model::load_values_sized(path, rules, which, &parse_specs(dims)?)
}

/// What a command that is given arrays loads: an ONNX model specialized to them (the sizes
/// they show for its symbolic dimensions, the `--dim` specs sizing the rest, and the values of
/// the integer inputs it needs as constants).
pub fn load_for_arrays(
    path: &Path,
    rules: &RuleSet,
    which: Stored,
    dims: &[String],
    arrays: &[GivenArray],
) -> Result<Loaded> {
    let mut given = Specialization::sized(&parse_specs(dims)?);
    if crate::onnx::is_onnx(path) {
        // The import reads the sizes of the named dimensions off the arrays' shapes.
        given.shapes = arrays
            .iter()
            .map(|a| (a.name.clone(), a.tensor.shape().to_vec()))
            .collect();
        // Any small array may be what a node needs as a constant (a shape, axes, a count);
        // the import takes only those it needs.
        given.values = arrays
            .iter()
            .filter(|a| a.tensor.len() <= SPECIALIZABLE)
            .map(|a| (a.name.clone(), a.tensor.clone()))
            .collect();
    }
    crate::model::load_values_specialized(path, rules, which, &given)
}

/// The most elements of an array a model may be specialized to (a shape or axes has a few).
const SPECIALIZABLE: usize = 4096;

/// ` at batch=3, seq=1 (default)` for a model with symbolic dimensions, else nothing.
pub fn at_sizes(declared: &Declared) -> String {
    if declared.is_symbolic() {
        format!(" at {}", declared.describe())
    } else {
        String::new()
    }
}

/// An array `--input NAME=FILE` gives, read but not yet checked against the graph (its
/// shape may size the graph first).
pub struct GivenArray {
    name: String,
    file: String,
    tensor: Tensor,
}

/// The arrays `--input NAME=FILE` specs give, each name once, in the order given.
pub fn read_arrays(specs: &[String]) -> Result<Vec<GivenArray>> {
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
    specs
        .iter()
        .map(|spec| {
            let (name, file) = spec
                .split_once('=')
                .ok_or_else(|| Error::input(format!("--input `{spec}` must be NAME=FILE.npy")))?;
            let tensor = Tensor::read_npy(Path::new(file))
                .map_err(|e| Error::at_node(name, ErrorKind::Input(e.to_string())))?;
            Ok(GivenArray {
                name: name.to_string(),
                file: file.to_string(),
                tensor,
            })
        })
        .collect()
}

/// The given arrays, each checked against the input it names (declared, the declared shape)
/// and converted to its declared dtype.
pub fn check_arrays(graph: &Graph, arrays: Vec<GivenArray>) -> Result<Tensors> {
    let mut values = Tensors::new();
    for GivenArray { name, file, tensor } in arrays {
        let declared = graph.input(&name).ok_or_else(|| {
            Error::input(format!(
                "--input `{name}`: graph `{}` has no input of that name{}",
                graph.name,
                crate::error::hint(&name, graph.inputs.iter().map(|i| i.name.as_str()))
            ))
        })?;
        if tensor.shape() != declared.shape.as_slice() {
            return Err(Error::at_node(
                &name,
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
            .into_declared(declared.dtype, &format!("`{file}`"), &name)
            .map_err(|e| Error::at_node(&name, ErrorKind::Input(e.to_string())))?;
        values.insert(name, tensor);
    }
    Ok(values)
}

/// A writer of one output file.
pub type Writer<'a> = Box<dyn Fn(&Path) -> std::result::Result<(), WriteFailure> + 'a>;

/// Why a [`Writer`] failed: its message follows the file's name in the error.
#[derive(Debug, thiserror::Error)]
pub enum WriteFailure {
    /// A stored value (`.npy`).
    #[error(transparent)]
    Npy(#[from] crate::tensor::NpyError),
    /// A text file (a graph).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How a graph derived from a loaded one (`grad`'s joint graph, the halves of its split) keeps
/// the stored values of the inputs it shares with it, so that it runs without `--input` from
/// wherever it is written: each value file is named relative to `out_dir`, the directory the
/// derived graph goes to. A value file already inside `out_dir` is referred to where it is;
/// any other value (outside it, or an ONNX model's weight) is copied into `out_dir`, with the
/// graph, all or none.
///
/// A copy never replaces a file: its name is `<input>.npy` by the safe name mapping of `run
/// --out` when that is free, else the same stem with `~2`, `~3`, …: free meaning that no entry
/// of `out_dir`, no value file referred to in place, none of `graphs` (the graph files written
/// beside the copies) and no other copy has it, compared without letter case so that the
/// choice holds on file systems that fold case. The returned writers are to be placed with
/// [`output::write_all_or_none_with`], refusing to replace anything (a file that appeared
/// meanwhile included).
pub fn carry_values<'a>(
    loaded: &'a Loaded,
    inputs: &[String],
    out_dir: &Path,
    graphs: &[&str],
) -> Result<(StoredValues, Vec<(String, Writer<'a>)>)> {
    let real_dir = out_dir
        .canonicalize()
        .map_err(|e| Error::write(out_dir.display(), e))?;
    let mut values = StoredValues::new();
    let mut copied = Vec::new();
    let mut taken: std::collections::HashSet<String> =
        graphs.iter().map(|g| g.to_lowercase()).collect();
    for name in inputs {
        if !loaded.stored.contains_key(name) {
            continue;
        }
        let inside = loaded
            .files
            .get(name)
            .and_then(|real| real.strip_prefix(&real_dir).ok())
            .and_then(|relative| {
                // A graph file names its value files with `/`, whatever the platform.
                let parts: Option<Vec<&str>> = relative
                    .components()
                    .map(|c| c.as_os_str().to_str())
                    .collect();
                parts.map(|p| p.join("/"))
            });
        match inside {
            Some(relative) => {
                taken.insert(relative.to_lowercase());
                values.insert(name.clone(), relative);
            }
            None => copied.push(name.clone()),
        }
    }
    let existing = output::existing_names(out_dir);
    let mut writes: Vec<(String, Writer<'a>)> = Vec::new();
    for name in &copied {
        let tensor = &loaded.stored[name];
        let same = |file: &str| holds(&out_dir.join(file), tensor);
        let (file, reused) = output::free_or_same_name(name, &existing, &mut taken, &same);
        values.insert(name.clone(), file.clone());
        if !reused {
            writes.push((
                file,
                Box::new(move |path: &Path| Ok(tensor.write_npy(path)?)),
            ));
        }
    }
    Ok((values, writes))
}

/// Whether `path` is a plain file (not a link, so nothing outside is read) that already holds
/// exactly `tensor`: dtype, shape and every value bit for bit. Such a file, an earlier copy of
/// the same value, is referred to again rather than copied once more. A file much larger than
/// the value is not read.
fn holds(path: &Path, tensor: &Tensor) -> bool {
    use crate::tensor::Data;
    let bytes = (crate::shape::numel(tensor.shape()) as u64).saturating_mul(8);
    let plain = std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.file_type().is_file() && m.len() <= bytes.saturating_add(4096));
    plain
        && Tensor::read_npy(path).is_ok_and(|found| {
            found.dtype == tensor.dtype
                && found.shape() == tensor.shape()
                && match (&found.data, &tensor.data) {
                    (Data::Int(a), Data::Int(b)) => a == b,
                    // Bit for bit: -0.0 is not 0.0 here, and a NaN is the same NaN.
                    (Data::Float(a), Data::Float(b)) => a
                        .iter()
                        .zip(b.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    _ => false,
                }
        })
}

/// `fusebox import`: the model as `DIR/graph.ron` and one `.npy` per parameter input, named by
/// the same safe mapping as `run --out` uses, written all or none.
///
/// Importing again into the same directory replaces `graph.ron` and the weight files the old
/// `graph.ron` names (they belong to it), so a re-import leaves what a first import leaves. Any
/// other file is kept: a weight whose name is taken by one (the user's data, the model's own
/// external data) gets a free name instead (see [`output::free_name`]).
pub fn import(model: &Path, dims: &[String], dir: &Path, rules: &RuleSet) -> Result<String> {
    let sizes = parse_specs(dims)?;
    let imported = crate::onnx::import_sized(model, &rules.ops, &rules.onnx, &sizes)?;
    let names: Vec<String> = imported.values.keys().cloned().collect();
    output::check_distinct(&names, "weights").map_err(|message| {
        Error::new(
            Site::model(&model.display().to_string()),
            ErrorKind::Input(message.to_string()),
        )
    })?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::input(format!("cannot create {}: {e}", dir.display())))?;
    let replaceable = previous_weights(&dir.join(GRAPH_FILE), rules);
    let mut existing = output::existing_names(dir);
    existing.retain(|name| !replaceable.contains(name));
    let mut taken = std::collections::HashSet::from([GRAPH_FILE.to_string()]);
    let files: Vec<String> = names
        .iter()
        .map(|name| output::free_name(name, &existing, &mut taken))
        .collect();
    let stored: StoredValues = names.iter().cloned().zip(files.iter().cloned()).collect();
    let text = graph::file::to_ron_with_values(&imported.graph, &stored);
    let mut writes: Vec<(String, Writer)> = vec![(
        GRAPH_FILE.to_string(),
        Box::new(|path: &Path| Ok(std::fs::write(path, &text)?)),
    )];
    for (name, file) in names.iter().zip(&files) {
        let tensor = &imported.values[name];
        writes.push((
            file.clone(),
            Box::new(move |path: &Path| Ok(tensor.write_npy(path)?)),
        ));
    }
    let must_be_new =
        |file: &str| file != GRAPH_FILE && !replaceable.contains(&file.to_lowercase());
    output::write_all_or_none_with(dir, &writes, &must_be_new).map_err(|e| {
        Error::input(format!(
            "cannot write {}: {}; nothing was written",
            e.path.display(),
            e.message
        ))
    })?;
    Ok(format!(
        "{}: {} input(s), {} parameter(s) with stored values, {} node(s){} -> {}\n",
        imported.graph.name,
        imported.graph.inputs.len() - names.len(),
        names.len(),
        imported.graph.nodes.len(),
        at_sizes(&imported.declared),
        dir.join(GRAPH_FILE).display()
    ))
}

/// The graph file `import` writes into its directory.
const GRAPH_FILE: &str = "graph.ron";

/// The weight files (plain names in the same directory, in lower case) that the graph file
/// an earlier import wrote at `graph` names; none if there is none or it does not read.
fn previous_weights(graph: &Path, rules: &RuleSet) -> std::collections::HashSet<String> {
    if !std::fs::symlink_metadata(graph).is_ok_and(|m| m.is_file()) {
        return Default::default();
    }
    match graph::file::load_with_values(graph, &rules.ops) {
        Ok((_, _, files)) => files
            .values()
            .filter(|stored| !stored.file.contains(['/', '\\']))
            .map(|stored| stored.file.to_lowercase())
            .collect(),
        Err(_) => Default::default(),
    }
}
