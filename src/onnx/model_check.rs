//! Checks of a whole model before any node is imported: every op type it uses is one fusebox
//! can import, and every value name is defined once.

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
