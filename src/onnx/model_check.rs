//! Checks of a whole model before any node is imported: every op type it uses is one fusebox
//! can import, at the meaning its opset gives it, and every value name is defined once.

use super::*;

/// One error for every op the model uses that neither the table nor the importer handles,
/// each with the nodes that use it.
pub(super) fn unsupported(graph: &GraphProto, table: &MapTable) -> Imports<()> {
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in &graph.node {
        let domain_ok = node.domain.is_empty() || node.domain == "ai.onnx";
        let op = if domain_ok {
            node.op_type.clone()
        } else {
            format!("{}.{}", node.domain, node.op_type)
        };
        if !domain_ok
            || !(table.knows(&node.op_type) || STRUCTURAL.contains(&node.op_type.as_str()))
        {
            missing.entry(op).or_default().push(node_label(node));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(ImportError::UnsupportedOps(missing))
}

/// Refuses a model that defines a value name twice: two nodes writing one output, a node
/// output shadowing an initializer or a graph input, two initializers or two inputs of one
/// name. ONNX names each value once (SSA); importing such a model would silently keep one
/// definition and give the other's readers a value they did not ask for. A graph input that
/// is also an initializer is not a second definition: the initializer is its default value
/// (and before IR version 4 every initializer was listed as an input).
pub(super) fn definitions(graph: &GraphProto) -> Imports<()> {
    let initializers: HashSet<&str> = graph.initializer.iter().map(|i| i.name.as_str()).collect();
    let mut all: Vec<(&str, String)> = Vec::new();
    for init in &graph.initializer {
        all.push((&init.name, format!("initializer `{}`", init.name)));
    }
    for input in graph.input.iter() {
        if !initializers.contains(input.name.as_str()) {
            all.push((&input.name, format!("graph input `{}`", input.name)));
        }
    }
    for node in &graph.node {
        for (k, name) in node.output.iter().enumerate() {
            let what = format!("output {k} of {} node `{}`", node.op_type, node_label(node));
            all.push((name, what));
        }
    }
    let mut defined: HashMap<&str, String> = HashMap::new();
    for (name, what) in all {
        if name.is_empty() {
            continue;
        }
        if let Some(first) = defined.get(name) {
            return Err(ImportError::Malformed(format!(
                "`{name}` is defined twice, as {first} and as {what}; ONNX names each value once"
            )));
        }
        defined.insert(name, what);
    }
    Ok(())
}

/// The opsets whose meaning of every op the op table writes: 13 (where reductions' axes and
/// Softmax's axis took their present meaning) to 26.
pub(super) const TABLE_OPSETS: std::ops::RangeInclusive<u32> = 13..=26;

/// Definitions after [`TABLE_OPSETS`] whose meaning the importer writes too: `Range` 27 adds
/// f16 and bf16, computed at its `stash_type` (the other types mean what they meant at 11).
const LATER_DEFINITIONS: &[(&str, u32)] = &[("Range", 27)];

/// The version of `op` in effect at `opset`: the last (re)definition at or before it.
fn in_effect(op: &str, opset: u32) -> Option<u32> {
    let (_, versions) = super::versions::SINCE
        .iter()
        .find(|(name, _)| *name == op)?;
    versions.iter().copied().filter(|&v| v <= opset).max()
}

/// Refuses a model whose opset gives an op it uses another definition than the opsets the
/// table is written for ([`TABLE_OPSETS`]): a model of an older opset imports when none of its
/// ops was redefined between its opset and 13 (an `And` of opset 7, a `OneHot` of 11), a newer
/// one when none was redefined after 26. Every op the model names must exist at its opset.
pub(super) fn opset_meanings(graph: &GraphProto, opset: u32) -> Imports<()> {
    if TABLE_OPSETS.contains(&opset) {
        return Ok(());
    }
    let anchor = opset.clamp(*TABLE_OPSETS.start(), *TABLE_OPSETS.end());
    let mut changed: BTreeMap<&str, (Option<u32>, Option<u32>)> = BTreeMap::new();
    for node in &graph.node {
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            continue;
        }
        let op = node.op_type.as_str();
        let (here, there) = (in_effect(op, opset), in_effect(op, anchor));
        let written = here.is_some_and(|v| LATER_DEFINITIONS.contains(&(op, v)));
        if !written && (here.is_none() || here != there) {
            changed.insert(op, (here, there));
        }
    }
    if changed.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = changed
        .iter()
        .map(|(op, (here, there))| match (here, there) {
            (None, _) => format!("{op} (not defined at opset {opset})"),
            (Some(here), Some(there)) => {
                format!("{op} (version {here} here, {there} at opset {anchor})")
            }
            (Some(here), None) => format!("{op} (version {here} here)"),
        })
        .collect();
    Err(ImportError::Unsupported(format!(
        "opset {opset} defines {} otherwise than the opsets fusebox imports ({} to {}): {}",
        if changed.len() == 1 { "an op" } else { "ops" },
        TABLE_OPSETS.start(),
        TABLE_OPSETS.end(),
        list.join(", ")
    )))
}
