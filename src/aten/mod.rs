//! ATen graphs in: the graphs `torch.compile` hands its backends (core ATen ops, as FX), read
//! from the JSON the Python front end writes ([`fx`]), spelled as ONNX nodes by the ATen table
//! (`rules/aten.ron`, [`spell`]) and imported as an ONNX model is. The front end first asks
//! which nodes fusebox can take ([`supported`]), gives PyTorch the rest, and sends each part
//! it kept ([`import`]).
//!
//! ```
//! use fusebox::aten;
//! use fusebox::rules::RuleSet;
//! use std::collections::BTreeMap;
//!
//! # fn main() -> fusebox::Result<()> {
//! let rules = RuleSet::defaults();
//! let graph = aten::fx::parse(r#"{
//!     "name": "part",
//!     "inputs": [{"name": "x", "dtype": "f32", "shape": [2, 3]}],
//!     "nodes": [
//!         {"name": "scaled", "target": "aten.mul.Tensor",
//!          "args": {"self": {"ref": "x"}, "other": 0.5},
//!          "outputs": [{"dtype": "f32", "shape": [2, 3]}]},
//!         {"name": "y", "target": "aten.relu.default", "args": {"self": {"ref": "scaled"}},
//!          "outputs": [{"dtype": "f32", "shape": [2, 3]}]}
//!     ],
//!     "outputs": [{"ref": "y"}]
//! }"#, "part.json")?;
//! assert!(aten::supported(&graph, &rules).values().all(Option::is_none));
//! let imported = aten::import(&graph, &BTreeMap::new(), &rules)?;
//! assert_eq!(imported.graph.outputs.len(), 1);
//! # Ok(())
//! # }
//! ```

pub mod fx;
pub mod spell;

use crate::error::{Error, ErrorKind, Result, Site};
use crate::graph::dims::Specialization;
use crate::onnx::Imported;
use crate::rules::RuleSet;
use fx::{FxGraph, FxNode, FxRef, FxTensor};
use onnx_protobuf::{GraphProto, ModelProto, OperatorSetIdProto, ValueInfoProto};
use spell::{Speller, onnx_code};
use std::collections::{BTreeMap, HashMap};

/// The ONNX opset the spelled nodes follow: 20, the first with `Gelu`.
const OPSET: i64 = 20;

/// Imports `graph`; `constants` holds the bytes of each of its constants (little-endian, in
/// its dtype's storage), by name.
pub fn import(
    graph: &FxGraph,
    constants: &BTreeMap<String, Vec<u8>>,
    rules: &RuleSet,
) -> Result<Imported> {
    import_spelled(graph, Some(constants), rules)
}

/// Spells and imports `graph` (see [`spell_graph`] for `constants`), and checks that each
/// output has the dtype and shape PyTorch traced it with: PyTorch reads the results as those,
/// so a spelling that computes anything else is refused, never handed back.
fn import_spelled(
    graph: &FxGraph,
    constants: Option<&BTreeMap<String, Vec<u8>>>,
    rules: &RuleSet,
) -> Result<Imported> {
    let model = spell_graph(graph, constants, rules)?;
    let imported = crate::onnx::import_model(
        &model,
        &graph.name,
        None,
        &rules.ops,
        &rules.onnx,
        &Specialization::default(),
    )?;
    for output in &graph.outputs {
        let traced = graph
            .nodes
            .iter()
            .find(|n| n.name == output.node)
            .and_then(|n| n.outputs.get(output.index));
        let (Some(traced), Some(got)) = (traced, imported.types.get(&output.value_name())) else {
            continue;
        };
        if traced.dtype != got.dtype.name() || traced.shape != got.shape {
            return Err(Error::new(
                Site::model(&graph.name).with_node(&output.node),
                ErrorKind::Input(format!(
                    "fusebox computes output {} as {} {:?}, PyTorch as {} {:?}",
                    output.index,
                    got.dtype.name(),
                    got.shape,
                    traced.dtype,
                    traced.shape
                )),
            ));
        }
    }
    Ok(imported)
}

/// For each node of `graph`, `None` where fusebox takes it, else why not: the node alone,
/// spelled and imported with its operands as inputs, must import. Constants count as inputs
/// here, so a node that needs one's value (none of the table's do) would be refused.
pub fn supported(graph: &FxGraph, rules: &RuleSet) -> BTreeMap<String, Option<String>> {
    let mut types: HashMap<String, (String, Vec<usize>)> = HashMap::new();
    for t in graph.inputs.iter().chain(&graph.constants) {
        types.insert(t.name.clone(), (t.dtype.clone(), t.shape.clone()));
    }
    let mut verdicts = BTreeMap::new();
    for node in &graph.nodes {
        for (index, ty) in node.outputs.iter().enumerate() {
            let value = FxRef {
                node: node.name.clone(),
                index,
            }
            .value_name();
            types.insert(value, (ty.dtype.clone(), ty.shape.clone()));
        }
        let verdict = alone(node, &types).and_then(|g| import_spelled(&g, None, rules));
        // The node is the verdict's key: the reason is the message alone.
        let reason = verdict.err().map(|e| match e.kind {
            ErrorKind::Input(message) => message,
            other => other.to_string(),
        });
        verdicts.insert(node.name.clone(), reason);
    }
    verdicts
}

/// `node` as a graph of its own: its operands are inputs, the outputs it has are outputs.
fn alone(node: &FxNode, types: &HashMap<String, (String, Vec<usize>)>) -> Result<FxGraph> {
    let mut refs = Vec::new();
    for arg in node.args.values() {
        match arg {
            serde_json::Value::Array(items) => refs.extend(items.iter().filter_map(FxRef::of)),
            one => refs.extend(FxRef::of(one)),
        }
    }
    let mut inputs: Vec<FxTensor> = Vec::new();
    let mut renamed = node.clone();
    for r in refs {
        let value = r.value_name();
        let (dtype, shape) = types.get(&value).cloned().ok_or_else(|| {
            Error::at_node(
                &node.name,
                ErrorKind::Input(format!("`{}` is not a value of the graph", r.node)),
            )
        })?;
        if !inputs.iter().any(|i| i.name == value) {
            inputs.push(FxTensor {
                name: value,
                dtype,
                shape,
            });
        }
    }
    // An input named `a:1` (another node's second output) is referred to by that whole name.
    for arg in renamed.args.values_mut() {
        rename_refs(arg);
    }
    let outputs = match &node.used {
        Some(used) => used
            .iter()
            .map(|&index| FxRef {
                node: node.name.clone(),
                index,
            })
            .collect(),
        None => (0..node.outputs.len())
            .map(|index| FxRef {
                node: node.name.clone(),
                index,
            })
            .collect(),
    };
    Ok(FxGraph {
        name: node.name.clone(),
        inputs,
        constants: Vec::new(),
        nodes: vec![renamed],
        outputs,
    })
}

/// Rewrites each reference `{"ref": a, "index": k}` as `{"ref": "a:k"}`, the value's name.
fn rename_refs(arg: &mut serde_json::Value) {
    if let Some(r) = FxRef::of(arg) {
        *arg = serde_json::json!({"ref": r.value_name()});
    } else if let serde_json::Value::Array(items) = arg {
        items.iter_mut().for_each(rename_refs);
    }
}

/// `graph` as an ONNX model. With `constants`, each constant is an initializer of its bytes;
/// without, an input (for [`supported`], which needs only types).
fn spell_graph(
    graph: &FxGraph,
    constants: Option<&BTreeMap<String, Vec<u8>>>,
    rules: &RuleSet,
) -> Result<ModelProto> {
    let file = graph.name.as_str();
    let mut speller = Speller::default();
    let mut proto = GraphProto::new();
    proto.name = graph.name.clone();
    let declared = graph
        .inputs
        .iter()
        .chain(constants.map_or(&graph.constants[..], |_| &[]));
    for t in declared {
        let dtype = fx::dtype(&t.dtype, &t.name)?;
        proto
            .input
            .push(value_info(&t.name, onnx_code(dtype), Some(&t.shape)));
        speller
            .types
            .insert(t.name.clone(), (dtype, t.shape.clone()));
    }
    if let Some(bytes) = constants {
        for t in &graph.constants {
            let dtype = fx::dtype(&t.dtype, &t.name)?;
            let data = bytes.get(&t.name).ok_or_else(|| {
                Error::at_node(
                    &t.name,
                    ErrorKind::Input("the constant's bytes were not given".into()),
                )
            })?;
            let count = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if count.and_then(|n| n.checked_mul(dtype.size_bytes())) != Some(data.len()) {
                return Err(Error::at_node(
                    &t.name,
                    ErrorKind::Input(format!(
                        "{} bytes given for a {} constant of shape {:?}",
                        data.len(),
                        dtype.name(),
                        t.shape
                    )),
                ));
            }
            let name = speller.initializer(&t.name, dtype, t.shape.clone(), data.clone());
            debug_assert_eq!(name, t.name);
        }
    }
    for node in &graph.nodes {
        speller.node(node, &rules.aten).map_err(|message| {
            Error::new(
                Site::model(file).with_node(&node.name),
                ErrorKind::Input(message),
            )
        })?;
    }
    for (k, output) in graph.outputs.iter().enumerate() {
        let value = output.value_name();
        let (dtype, shape) = speller.types.get(&value).cloned().ok_or_else(|| {
            Error::new(
                Site::model(file),
                ErrorKind::Input(format!(
                    "output {k} names `{}`, not a value of the graph",
                    output.node
                )),
            )
        })?;
        proto
            .output
            .push(value_info(&value, onnx_code(dtype), Some(&shape)));
    }
    proto.node = std::mem::take(&mut speller.nodes);
    proto.initializer = std::mem::take(&mut speller.initializers);
    let mut model = ModelProto::new();
    model.ir_version = 9;
    let mut opset = OperatorSetIdProto::new();
    opset.version = OPSET;
    model.opset_import.push(opset);
    model.graph = Some(proto).into();
    Ok(model)
}

/// A tensor's value info: its element type code and, when known, its dimensions.
fn value_info(name: &str, code: i64, dims: Option<&[usize]>) -> ValueInfoProto {
    use onnx_protobuf::tensor_shape_proto::Dimension;
    use onnx_protobuf::type_proto::Tensor as TensorType;
    use onnx_protobuf::{TensorShapeProto, TypeProto};
    let mut tensor = TensorType::new();
    tensor.elem_type = code as i32;
    if let Some(dims) = dims {
        let mut shape = TensorShapeProto::new();
        for &d in dims {
            let mut dim = Dimension::new();
            dim.set_dim_value(d as i64);
            shape.dim.push(dim);
        }
        tensor.shape = Some(shape).into();
    }
    let mut ty = TypeProto::new();
    ty.set_tensor_type(tensor);
    let mut info = ValueInfoProto::new();
    info.name = name.to_string();
    info.type_ = Some(ty).into();
    info
}
