//! Where commands get their graph: a RON graph file or an ONNX model, each with the stored
//! values of its parameter inputs; and `fusebox import`, which writes a model as a graph file
//! and its weights.

use super::output;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::eval::Tensors;
use crate::graph::file::StoredValues;
use crate::graph::{self, Graph, TypeMap};
use crate::rules::RuleSet;
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A graph, its types, and the stored value of each parameter input that has one.
pub struct Loaded {
    pub graph: Graph,
    pub types: TypeMap,
    pub stored: Tensors,
    /// For a RON graph file, the resolved path of each stored value's `.npy` (an ONNX model's
    /// weights have none: they live inside the model).
    pub files: BTreeMap<String, PathBuf>,
}

/// Reads `path`: an ONNX model when it ends in `.onnx`, else a RON graph file whose inputs may
/// name `.npy` files (read relative to the graph file, and refused if they leave its
/// directory).
pub fn load(path: &Path, rules: &RuleSet) -> Result<Loaded> {
    if crate::onnx::is_onnx(path) {
        let imported = crate::onnx::import(path, &rules.ops, &rules.onnx)?;
        return Ok(Loaded {
            graph: imported.graph,
            types: imported.types,
            stored: imported.values.into_iter().collect(),
            files: BTreeMap::new(),
        });
    }
    let (graph, types, files) = graph::file::load_with_values(path, &rules.ops)?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut stored = Tensors::new();
    let mut resolved = BTreeMap::new();
    for (name, file) in &files {
        let at = |message: String| {
            Error::new(
                Site::whole_file(&path.display().to_string()).with_node(name),
                ErrorKind::Input(message),
            )
        };
        let full = dir.join(file);
        let real = full
            .canonicalize()
            .map_err(|e| at(format!("stored value `{file}`: {e}")))?;
        let base = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let real_dir = base
            .canonicalize()
            .map_err(|e| at(format!("{}: {e}", base.display())))?;
        if !real.starts_with(&real_dir) {
            return Err(at(format!(
                "stored value `{file}` leaves the graph file's directory"
            )));
        }
        let tensor = Tensor::read_npy(&real).map_err(at)?;
        let declared = graph.input(name).map(|i| (i.dtype, i.shape.clone()));
        let Some((dtype, shape)) = declared else {
            continue;
        };
        if tensor.shape() != shape.as_slice() {
            return Err(at(format!(
                "stored value `{file}` holds shape {:?}, the graph declares {shape:?}",
                tensor.shape()
            )));
        }
        stored.insert(name.clone(), tensor.cast(dtype));
        resolved.insert(name.clone(), real);
    }
    Ok(Loaded {
        graph,
        types,
        stored,
        files: resolved,
    })
}

/// A writer of one output file.
pub type Writer<'a> = Box<dyn Fn(&Path) -> std::result::Result<(), String> + 'a>;

/// How a graph derived from a loaded one (`grad`'s joint graph, the halves of its split) keeps
/// the stored values of the inputs it shares with it, so that it runs without `--input` from
/// wherever it is written: each value file is named relative to `out_dir`, the directory the
/// derived graph goes to. A value file already inside `out_dir` is referred to where it is;
/// any other value (outside it, or an ONNX model's weight) is written into `out_dir` as
/// `<input>.npy` by the safe name mapping of `run --out`, with the graph, all or none.
pub fn carry_values<'a>(
    loaded: &'a Loaded,
    inputs: &[String],
    out_dir: &Path,
) -> Result<(StoredValues, Vec<(String, Writer<'a>)>)> {
    let real_dir = out_dir
        .canonicalize()
        .map_err(|e| Error::write(out_dir.display(), e))?;
    let mut values = StoredValues::new();
    let mut copied = Vec::new();
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
                values.insert(name.clone(), relative);
            }
            None => copied.push(name.clone()),
        }
    }
    let files = output::check_distinct(&copied).map_err(Error::input)?;
    let mut writes: Vec<(String, Writer<'a>)> = Vec::new();
    for (name, file) in copied.iter().zip(files) {
        values.insert(name.clone(), file.clone());
        let tensor = &loaded.stored[name];
        writes.push((file, Box::new(move |path: &Path| tensor.write_npy(path))));
    }
    Ok((values, writes))
}

/// `fusebox import`: the model as `DIR/graph.ron` and one `.npy` per parameter input, named by
/// the same safe mapping as `run --out` uses, written all or none.
pub fn import(model: &Path, dir: &Path, rules: &RuleSet) -> Result<String> {
    let imported = crate::onnx::import(model, &rules.ops, &rules.onnx)?;
    let names: Vec<String> = imported.values.keys().cloned().collect();
    let files = output::check_distinct(&names).map_err(Error::input)?;
    let stored: StoredValues = names.iter().cloned().zip(files.iter().cloned()).collect();
    let text = graph::file::to_ron_with_values(&imported.graph, &stored);
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::input(format!("cannot create {}: {e}", dir.display())))?;
    let mut writes: Vec<(String, Writer)> = vec![(
        "graph.ron".to_string(),
        Box::new(|path: &Path| std::fs::write(path, &text).map_err(|e| e.to_string())),
    )];
    for (name, file) in names.iter().zip(&files) {
        let tensor = &imported.values[name];
        writes.push((
            file.clone(),
            Box::new(move |path: &Path| tensor.write_npy(path)),
        ));
    }
    output::write_all_or_none(dir, &writes).map_err(|e| {
        Error::input(format!(
            "cannot write {}: {}; nothing was written",
            e.path.display(),
            e.message
        ))
    })?;
    Ok(format!(
        "{}: {} input(s), {} parameter(s) with stored values, {} node(s) -> {}\n",
        imported.graph.name,
        imported.graph.inputs.len() - names.len(),
        names.len(),
        imported.graph.nodes.len(),
        dir.join("graph.ron").display()
    ))
}
