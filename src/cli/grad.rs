//! `fusebox grad`: a graph differentiated; the joint graph, or its forward and backward halves,
//! written with the stored values they read carried beside them, never in place of a file.

use super::{GradArgs, load_rules, model, output, write_file};
use crate::autodiff::JointGraph;
use crate::error::{Error, Result};
use crate::graph;
use crate::rules::RuleSet;
use std::fmt::Write as _;
use std::path::Path;

/// `grad`: loads the graph with its stored values and writes where `--out` or `--split` says.
pub(super) fn grad(args: GradArgs) -> Result<String> {
    let rules = load_rules(args.rules.as_deref())?;
    let loaded = model::load_sized(&args.graph, &rules, model::Stored::All, &args.dims)?;
    let written = Written {
        out: args.out.as_deref(),
        split: args.split.as_deref(),
        source: &args.graph,
    };
    differentiate(&loaded, &rules, args.wrt, &written)
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
    // A link at that spot is replaced by the write, not written through.
    if std::fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink()) {
        return Ok(());
    }
    let what = if output::same_file(written.source, target) {
        "the graph being differentiated".to_string()
    } else if let Some((input, _)) = loaded
        .files
        .iter()
        .find(|(_, file)| output::same_file(file, target))
    {
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
    use crate::autodiff::{Wrt, grad};
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
        (_, Some(dir)) => write_split(&joint, dir, loaded, rules, written, &mut text)?,
        (Some(path), None) => write_joint(&joint, path, loaded, written, &mut text)?,
        (None, None) => unreachable!("clap requires --out or --split"),
    }
    Ok(text)
}

/// `grad --split DIR`: the forward and backward graphs, with the stored values they read
/// carried beside them, and what crosses between the two added to `text`.
fn write_split(
    joint: &JointGraph,
    dir: &Path,
    loaded: &model::Loaded,
    rules: &RuleSet,
    written: &Written,
    text: &mut String,
) -> Result<()> {
    let graph = &loaded.graph;
    let halves = crate::autodiff::split::split(graph, joint, &rules.ops)?;
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
            let write: model::Writer = Box::new(move |path: &Path| Ok(std::fs::write(path, text)?));
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
    Ok(())
}

/// `grad --out FILE`: the joint graph, with the stored values it reads carried beside it.
fn write_joint(
    joint: &JointGraph,
    path: &Path,
    loaded: &model::Loaded,
    written: &Written,
    text: &mut String,
) -> Result<()> {
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
            Box::new(|p: &Path| Ok(std::fs::write(p, &ron)?)),
        )];
        let copied = write_with_copies(dir, writes, copies)?;
        let _ = writeln!(text, "stored values written beside it: {copied}");
    }
    let _ = writeln!(text, "wrote {}", path.display());
    Ok(())
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
