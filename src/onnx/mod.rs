//! ONNX import: a model file becomes a fusebox [`Graph`] plus the stored values of its
//! parameter inputs.
//!
//! Initializers (and constants that feed computed values) become parameter inputs carrying
//! their values, so `grad` can differentiate with respect to them and `run` binds them without
//! `--input`. Constant subgraphs (`Shape` → `Gather` → `Concat` → `Reshape` chains, `Constant`,
//! `ConstantOfShape`, arithmetic on constants) are folded at import: every node whose inputs
//! are all constant is evaluated by the reference evaluator right away, so fusebox's static
//! shapes come out of a dynamic-looking exporter graph. ONNX ops become catalogue ops through
//! the op table of the rule set ([`MapTable`], `rules/onnx.ron` or a rule directory's own);
//! only the ops whose meaning depends on shapes known at import are handled here in code.

mod fold;
mod integers;
pub use fold::FOLD_LIMIT;
mod model_check;
pub mod proto;
mod table;
use model_check::{definitions, unsupported};

use crate::attr::{AttrType, AttrValue, Attrs};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::graph::check::{infer_op, resolve_attrs};
use crate::graph::{Graph, Input, Node, TensorType, TypeMap};
use crate::rules::Catalogue;
use crate::rules::onnx::{MapTable, Mapping};
use crate::tensor::Tensor;
use onnx_protobuf::{GraphProto, NodeProto, ValueInfoProto};
use proto::Attr;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

pub use crate::rules::onnx::STRUCTURAL;

/// An imported model: the graph, its types, and the stored value of each parameter input.
#[derive(Debug, Clone)]
pub struct Imported {
    pub graph: Graph,
    pub types: TypeMap,
    pub values: BTreeMap<String, Tensor>,
}

/// Whether `path` names an ONNX model (by its extension), so commands taking a graph know
/// which reader to use.
pub fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Imports a model file with an op table (a rule set's `onnx`). External data is looked up
/// beside it.
pub fn import(path: &Path, catalogue: &Catalogue, table: &MapTable) -> Result<Imported> {
    let file = path.display().to_string();
    let fail = |message: String| Error::new(Site::model(&file), ErrorKind::Input(message));
    let model = proto::read_model(path).map_err(fail)?;
    let dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    import_model(&model, &file, dir, catalogue, table)
}

/// Imports a parsed model; `file` names it in errors and `dir` holds its external data.
pub fn import_model(
    model: &onnx_protobuf::ModelProto,
    file: &str,
    dir: Option<&Path>,
    catalogue: &Catalogue,
    table: &MapTable,
) -> Result<Imported> {
    let fail = |message: String| Error::new(Site::model(file), ErrorKind::Input(message));
    // The table follows the op semantics of opset 13 on (axes as inputs, Softmax over one
    // axis); the opsets after 21, up to 26 (onnx 1.22), changed none of the imported ops'
    // meaning, only the element types they admit, which are checked per tensor.
    for opset in &model.opset_import {
        if (opset.domain.is_empty() || opset.domain == "ai.onnx")
            && !(13..=26).contains(&opset.version)
        {
            return Err(fail(format!(
                "opset {} is outside the opsets fusebox imports (13 to 26)",
                opset.version
            )));
        }
    }
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| fail("the model has no graph".into()))?;
    unsupported(graph, table).map_err(fail)?;
    let mut importer = Importer {
        catalogue,
        table,
        file: file.to_string(),
        dir,
        graph: Graph {
            name: if graph.name.is_empty() {
                "model".into()
            } else {
                graph.name.clone()
            },
            inputs: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
        },
        types: TypeMap::new(),
        values: BTreeMap::new(),
        env: HashMap::new(),
        taken: HashSet::new(),
        next_suffix: HashMap::new(),
        reserved: HashSet::new(),
        materialized: HashMap::new(),
        dropped: HashMap::new(),
        initializers: graph.initializer.iter().map(|i| i.name.clone()).collect(),
    };
    importer.run(graph)?;
    let Importer {
        graph, mut values, ..
    } = importer;
    let graph = prune(graph, &mut values);
    // The graph's own check names the node at fault; the message also names the model, as
    // every other import error does (found by the loader fuzzer: a model whose outputs were
    // all dropped said only "a graph needs at least one output").
    let types = crate::graph::check(&graph, catalogue).map_err(|mut e| {
        if e.site.file.is_none() {
            e.site.file = Some(file.to_string());
        }
        e
    })?;
    Ok(Imported {
        graph,
        types,
        values,
    })
}

/// A node's name, or its first output when it has none.
fn node_label(node: &NodeProto) -> String {
    if !node.name.is_empty() {
        node.name.clone()
    } else {
        node.output.first().cloned().unwrap_or_default()
    }
}

/// A value during import: a constant (with the ONNX name it came from, if any), or a graph
/// value computed at run time.
#[derive(Debug, Clone)]
enum Val {
    Const(Rc<Tensor>, Option<String>),
    Dyn(String, TensorType),
}

impl Val {
    fn shape(&self) -> &[usize] {
        match self {
            Val::Const(t, _) => t.shape(),
            Val::Dyn(_, ty) => &ty.shape,
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Val::Const(t, _) => t.dtype,
            Val::Dyn(_, ty) => ty.dtype,
        }
    }

    fn constant(&self) -> Option<&Tensor> {
        match self {
            Val::Const(t, _) => Some(t),
            Val::Dyn(..) => None,
        }
    }
}

type Msg = std::result::Result<Val, String>;

/// A node imported through the op table: its output values, and whether the Map's last node
/// is a cast (so the result's dtype is the one the node asked for, not its input's).
struct Mapped {
    outputs: Vec<Val>,
    casts: bool,
}

struct Importer<'a> {
    catalogue: &'a Catalogue,
    table: &'a MapTable,
    file: String,
    dir: Option<&'a Path>,
    graph: Graph,
    types: TypeMap,
    values: BTreeMap<String, Tensor>,
    /// ONNX value name → its value.
    env: HashMap<String, Val>,
    /// Names given to graph inputs and nodes so far.
    taken: HashSet<String>,
    /// Per base name, the suffix [`Importer::fresh`] tries first.
    next_suffix: HashMap<String, usize>,
    /// Every ONNX value name: kept for the value it names, never given to an intermediate.
    reserved: HashSet<String>,
    /// Constant (by ONNX name) → the parameter input or `const` node that holds it.
    materialized: HashMap<String, String>,
    /// Outputs of nodes that fusebox does not produce, and why.
    dropped: HashMap<String, String>,
    /// The names of the model's initializers.
    initializers: HashSet<String>,
}

impl<'a> Importer<'a> {
    fn run(&mut self, graph: &GraphProto) -> Result<()> {
        let file = self.file.clone();
        let fail = |message: String| Error::new(Site::model(&file), ErrorKind::Input(message));
        definitions(graph).map_err(fail)?;
        for init in &graph.initializer {
            self.reserved.insert(init.name.clone());
        }
        for input in &graph.input {
            self.reserved.insert(input.name.clone());
        }
        for node in &graph.node {
            self.reserved.extend(node.output.iter().cloned());
        }
        for init in &graph.initializer {
            let tensor = proto::to_tensor(init, self.dir)
                .map_err(|e| fail(format!("initializer `{}`: {e}", init.name)))?;
            self.env.insert(
                init.name.clone(),
                Val::Const(Rc::new(tensor), Some(init.name.clone())),
            );
        }
        for input in &graph.input {
            // Before IR version 4 initializers were listed as inputs too; the stored value wins
            // (and `--input` still overrides it).
            if self.env.contains_key(&input.name) {
                continue;
            }
            let ty = value_type(input).map_err(|e| {
                Error::new(
                    Site::model(&self.file).with_node(&input.name),
                    ErrorKind::Input(e),
                )
            })?;
            self.taken.insert(input.name.clone());
            self.graph.inputs.push(Input {
                name: input.name.clone(),
                dtype: ty.dtype,
                shape: ty.shape.clone(),
            });
            self.types.insert(input.name.clone(), ty.clone());
            self.env
                .insert(input.name.clone(), Val::Dyn(input.name.clone(), ty));
        }
        for node in &graph.node {
            let outputs = self.node(node).map_err(|e| {
                Error::new(
                    Site::model(&self.file).with_node_op(&node_label(node), &node.op_type),
                    ErrorKind::Input(e),
                )
            })?;
            let made = outputs.len();
            for (name, value) in node.output.iter().zip(outputs) {
                if !name.is_empty() {
                    self.env.insert(name.clone(), value);
                }
            }
            for (k, name) in node.output.iter().enumerate().skip(made) {
                if !name.is_empty() {
                    let why = format!(
                        "`{name}` is output {k} of {} node `{}`; fusebox imports only its first output",
                        node.op_type,
                        node_label(node)
                    );
                    self.dropped.insert(name.clone(), why);
                }
            }
        }
        for output in &graph.output {
            let value = self.env.get(&output.name).cloned().ok_or_else(|| {
                fail(match self.dropped.get(&output.name) {
                    Some(why) => format!("graph output {why}"),
                    None => format!("graph output `{}` is computed by no node", output.name),
                })
            })?;
            let name = match value {
                Val::Dyn(name, _) if name == output.name => name,
                // A constant that carries the output's own name (an initializer, a Constant
                // node, ConstantOfShape) is held under that name: the parameter input or
                // `const` node is the output itself.
                Val::Const(_, Some(ref origin)) if *origin == output.name => {
                    self.materialize(&value).0
                }
                other => {
                    // The output is another value (Identity) or a constant: a same-dtype cast
                    // gives it its ONNX name.
                    let dtype = other.dtype();
                    let mut attrs = Attrs::new();
                    attrs.insert("dtype".into(), AttrValue::DType(dtype));
                    let cast = self
                        .catalogue
                        .builtin(crate::rules::ops::Builtin::Cast)
                        .map(|op| op.name().to_string())
                        .ok_or_else(|| fail("the catalogue has no cast op".into()))?;
                    let (arg, _) = self.materialize(&other);
                    let op = self
                        .catalogue
                        .get(&cast)
                        .cloned()
                        .ok_or_else(|| fail("the catalogue has no cast op".into()))?;
                    let ty = self.types[&arg].clone();
                    let name = self.fresh(&output.name, true);
                    self.push(name.clone(), &op, vec![arg], attrs, &[ty])
                        .map_err(|e| fail(format!("output `{}`: {e}", output.name)))?;
                    name
                }
            };
            // `run --out` and `import` write each output under its graph name, so it must be
            // the model's: no `_1` suffix for a name something else already took.
            if name != output.name {
                return Err(fail(format!(
                    "graph output `{}` cannot keep its name (`{name}` would be written instead)",
                    output.name
                )));
            }
            self.graph.outputs.push(name);
        }
        Ok(())
    }

    /// A name not yet used: `base` itself when it is free (and, for intermediates, not an
    /// ONNX value's name), else `base_1`, `base_2`, …. The search for a base resumes where
    /// the last one ended (every lower suffix was unavailable then, and names are only ever
    /// taken): the parts of a composite share their use's name, and counting from 1 each time
    /// made importing a composite of n ops take n^2 probes.
    fn fresh(&mut self, base: &str, own: bool) -> String {
        let free = |s: &Self, n: &str| !s.taken.contains(n) && (own || !s.reserved.contains(n));
        let mut name = base.to_string();
        if !free(self, &name) {
            let mut i = self.next_suffix.get(base).copied().unwrap_or(1);
            loop {
                name = format!("{base}_{i}");
                i += 1;
                if free(self, &name) {
                    break;
                }
            }
            self.next_suffix.insert(base.to_string(), i);
        }
        self.taken.insert(name.clone());
        name
    }

    /// The graph value holding `v`: a computed value as it is; a scalar constant as a `const`
    /// node; any other constant as a parameter input with its stored value.
    fn materialize(&mut self, v: &Val) -> (String, TensorType) {
        match v {
            Val::Dyn(name, ty) => (name.clone(), ty.clone()),
            Val::Const(t, origin) => {
                let ty = TensorType {
                    dtype: t.dtype,
                    shape: t.shape().to_vec(),
                };
                if let Some(name) = origin.as_ref().and_then(|o| self.materialized.get(o)) {
                    return (name.clone(), ty);
                }
                let literal = self
                    .catalogue
                    .builtin(crate::rules::ops::Builtin::Const)
                    .cloned();
                let base = origin.clone().unwrap_or_else(|| "const".into());
                // A `const` node holds its value as an f64 attribute: an integer beyond 2^53
                // stays a stored value instead, which keeps every bit.
                let scalar = t.shape().is_empty()
                    && (t.dtype.category() != crate::dtype::Category::Integer
                        || t.int_values()
                            .first()
                            .is_some_and(|&v| v as f64 as i64 == v));
                let name = if let (true, Some(op)) = (scalar, literal) {
                    let name = self.fresh(&base, origin.is_some());
                    let mut attrs = Attrs::new();
                    attrs.insert("value".into(), AttrValue::Float(t.values()[0]));
                    attrs.insert("dtype".into(), AttrValue::DType(t.dtype));
                    self.graph.nodes.push(Node {
                        name: name.clone(),
                        op: op.name().to_string(),
                        args: vec![],
                        attrs,
                    });
                    name
                } else {
                    let name = self.fresh(&base, origin.is_some());
                    self.graph.inputs.push(Input {
                        name: name.clone(),
                        dtype: t.dtype,
                        shape: t.shape().to_vec(),
                    });
                    self.values.insert(name.clone(), (**t).clone());
                    name
                };
                if let Some(origin) = origin {
                    self.materialized.insert(origin.clone(), name.clone());
                }
                self.types.insert(name.clone(), ty.clone());
                (name, ty)
            }
        }
    }

    /// Appends a checked node and records its type.
    fn push(
        &mut self,
        name: String,
        op: &crate::rules::ops::OpDef,
        args: Vec<String>,
        attrs: Attrs,
        arg_types: &[TensorType],
    ) -> std::result::Result<TensorType, String> {
        let resolved = resolve_attrs(op, &attrs).map_err(|(_, kind)| kind.to_string())?;
        let ty = infer_op(op, arg_types, &resolved).map_err(|(_, kind)| kind.to_string())?;
        self.graph.nodes.push(Node {
            name: name.clone(),
            op: op.name().to_string(),
            args,
            attrs,
        });
        self.types.insert(name, ty.clone());
        Ok(ty)
    }

    /// Applies catalogue op `op`; folded into a constant when every argument is one. A
    /// composite op is expanded here, node by node, so its parts fold too.
    fn emit(&mut self, op: &str, args: &[Val], attrs: Attrs, name: &str, own: bool) -> Msg {
        if let Some(composite) = self.catalogue.composite(op).cloned() {
            let catalogue = self.catalogue;
            return crate::graph::expand::instantiate(
                catalogue,
                &composite,
                args.to_vec(),
                &attrs,
                name,
                own,
                self,
            )
            .map_err(|fault| fault.kind().to_string());
        }
        let def = self
            .catalogue
            .get(op)
            .cloned()
            .ok_or_else(|| format!("the catalogue has no op `{op}`"))?;
        if !def.accepts_arity(args.len()) {
            return Err(format!(
                "op `{op}` takes {} argument(s), got {}",
                def.arity_text(),
                args.len()
            ));
        }
        // Constants fold, except a model's weights: a non-scalar initializer stays a
        // parameter input (so `--input` can replace it and `grad` can differentiate by it)
        // even where only constants feed the op, as a transposed Gemm weight does.
        let weight = |a: &Val| matches!(a, Val::Const(t, Some(name)) if !t.shape().is_empty() && self.initializers.contains(name));
        if args.iter().all(|a| a.constant().is_some())
            && !args.iter().any(weight)
            && self.foldable(&def, args, &attrs)?
        {
            return self.fold(op, args, attrs);
        }
        let mut names = Vec::new();
        let mut types = Vec::new();
        for arg in args {
            let (n, t) = self.materialize(arg);
            names.push(n);
            types.push(t);
        }
        let name = self.fresh(name, own);
        let ty = self.push(name.clone(), &def, names, attrs, &types)?;
        Ok(Val::Dyn(name, ty))
    }

    fn input(&self, node: &NodeProto, i: usize) -> std::result::Result<Option<Val>, String> {
        match node.input.get(i) {
            None => Ok(None),
            Some(name) if name.is_empty() => Ok(None),
            Some(name) => {
                self.env
                    .get(name)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| match self.dropped.get(name) {
                        Some(why) => format!("input {why}"),
                        None => format!("input `{name}` is not a value computed before it"),
                    })
            }
        }
    }

    fn required(&self, node: &NodeProto, i: usize) -> Msg {
        self.input(node, i)?
            .ok_or_else(|| format!("input {i} is required"))
    }

    /// Imports one node; its output values in order.
    fn node(&mut self, node: &NodeProto) -> std::result::Result<Vec<Val>, String> {
        let mut attrs: HashMap<String, Attr> = HashMap::new();
        for a in &node.attribute {
            attrs.insert(a.name.clone(), proto::attribute(a, self.dir)?);
        }
        let out = node
            .output
            .first()
            .cloned()
            .unwrap_or_else(|| node_label(node));
        match node.op_type.as_str() {
            op if !STRUCTURAL.contains(&op) => self.table_node(node, &attrs, &out),
            "Constant" => Ok(vec![self.constant(&attrs, &out)?]),
            "ConstantOfShape" => Ok(vec![self.constant_of_shape(node, &attrs, &out)?]),
            "Shape" => {
                let x = self.required(node, 0)?;
                let rank = x.shape().len() as i64;
                let clip = |v: i64| {
                    (if v < 0 { v.saturating_add(rank) } else { v }).clamp(0, rank) as usize
                };
                let start = clip(int_attr(&attrs, "start").unwrap_or(0));
                let end = clip(int_attr(&attrs, "end").unwrap_or(rank));
                let dims: Vec<f64> = x.shape()[start..end.max(start)]
                    .iter()
                    .map(|&d| d as f64)
                    .collect();
                let n = dims.len();
                let t = Tensor::from_values(DType::I64, &[n], dims).ok_or("bad shape")?;
                Ok(vec![Val::Const(Rc::new(t), None)])
            }
            "Gather" => {
                let data = self.required(node, 0)?;
                let indices = self.required(node, 1)?;
                let idx = indices
                    .constant()
                    .ok_or("the indices must be a constant (fusebox shapes are static), not a run-time value")?
                    .clone();
                let rank = data.shape().len();
                let axis =
                    crate::shape::normalize_axis(int_attr(&attrs, "axis").unwrap_or(0), rank)?;
                let dim = data.shape()[axis] as i64;
                let mut parts = Vec::new();
                for v in idx.values() {
                    let i = v as i64;
                    let i = if i < 0 { i.saturating_add(dim) } else { i };
                    if i < 0 || i >= dim {
                        return Err(format!(
                            "index {v} is out of range for a dimension of {dim}"
                        ));
                    }
                    parts.push(self.slice(&data, axis, i, i + 1, 1, &out)?);
                }
                let joined = if parts.len() == 1 {
                    parts.remove(0)
                } else {
                    let mut a = Attrs::new();
                    a.insert("axis".into(), AttrValue::Int(axis as i64));
                    self.emit("concat", &parts, a, &format!("{out}.gather"), false)?
                };
                let mut shape: Vec<usize> = data.shape()[..axis].to_vec();
                shape.extend_from_slice(idx.shape());
                shape.extend_from_slice(&data.shape()[axis + 1..]);
                Ok(vec![self.reshape(&joined, &shape, &out)?])
            }
            "Reshape" => {
                let x = self.required(node, 0)?;
                let target = self.ints(node, 1, "shape")?;
                let allowzero = int_attr(&attrs, "allowzero").unwrap_or(0) != 0;
                let mut dims = Vec::new();
                for (i, &d) in target.iter().enumerate() {
                    dims.push(if d == 0 && !allowzero {
                        *x.shape()
                            .get(i)
                            .ok_or("a 0 in the shape has no input dimension to copy")?
                            as i64
                    } else {
                        d
                    });
                }
                let shape = crate::shape::reshape_target(x.shape(), &dims)?;
                Ok(vec![self.reshape(&x, &shape, &out)?])
            }
            "Flatten" => {
                let x = self.required(node, 0)?;
                let rank = x.shape().len();
                let axis = int_attr(&attrs, "axis").unwrap_or(1);
                let axis = if axis < 0 {
                    axis.saturating_add(rank as i64)
                } else {
                    axis
                };
                if axis < 0 || axis > rank as i64 {
                    return Err(format!("axis {axis} is out of range for rank {rank}"));
                }
                let (a, b) = x.shape().split_at(axis as usize);
                let shape = vec![a.iter().product(), b.iter().product()];
                Ok(vec![self.reshape(&x, &shape, &out)?])
            }
            "Squeeze" | "Unsqueeze" => self.squeeze(node, &attrs, &out),
            "Expand" => {
                let x = self.required(node, 0)?;
                let target = self.ints(node, 1, "shape")?;
                let target: Vec<usize> = target
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is negative")))
                    .collect::<std::result::Result<_, _>>()?;
                let shape = crate::shape::broadcast(x.shape(), &target)?;
                proto::element_count(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
                if shape.as_slice() == x.shape() {
                    return Ok(vec![x]);
                }
                let mut a = Attrs::new();
                a.insert(
                    "shape".into(),
                    AttrValue::Ints(shape.iter().map(|&d| d as i64).collect()),
                );
                Ok(vec![self.emit("broadcast_to", &[x], a, &out, true)?])
            }
            "Slice" => self.slice_node(node, &out),
            "Split" => self.split_node(node, &attrs, &out),
            other => Err(format!(
                "`{other}` is listed among the op types handled in code but has no handler"
            )),
        }
    }

    /// A Squeeze or Unsqueeze node: a reshape.
    fn squeeze(
        &mut self,
        node: &NodeProto,
        attrs: &HashMap<String, Attr>,
        out: &str,
    ) -> std::result::Result<Vec<Val>, String> {
        let x = self.required(node, 0)?;
        let axes = match self.input(node, 1)? {
            Some(_) => Some(self.ints(node, 1, "axes")?),
            None => ints_attr(attrs, "axes"),
        };
        let rank = x.shape().len();
        let shape: Vec<usize> = if node.op_type == "Squeeze" {
            let axes = match axes {
                Some(axes) => crate::shape::normalize_axes(Some(&axes), rank)?,
                None => (0..rank).filter(|&i| x.shape()[i] == 1).collect(),
            };
            if let Some(&a) = axes.iter().find(|&&a| x.shape()[a] != 1) {
                return Err(format!("axis {a} has size {}, not 1", x.shape()[a]));
            }
            (0..rank)
                .filter(|i| !axes.contains(i))
                .map(|i| x.shape()[i])
                .collect()
        } else {
            let axes = axes.ok_or("Unsqueeze needs axes")?;
            let new_rank = rank + axes.len();
            let axes: BTreeSet<usize> = crate::shape::normalize_axes(Some(&axes), new_rank)?
                .into_iter()
                .collect();
            let mut dims = x.shape().iter();
            (0..new_rank)
                .map(|i| {
                    if axes.contains(&i) {
                        1
                    } else {
                        dims.next().copied().unwrap_or(1)
                    }
                })
                .collect()
        };
        Ok(vec![self.reshape(&x, &shape, out)?])
    }

    /// A Slice node: a `slice` per sliced axis (positive steps only).
    fn slice_node(&mut self, node: &NodeProto, out: &str) -> std::result::Result<Vec<Val>, String> {
        let x = self.required(node, 0)?;
        let starts = self.ints(node, 1, "starts")?;
        let ends = self.ints(node, 2, "ends")?;
        let rank = x.shape().len();
        let axes = match self.input(node, 3)? {
            Some(_) => self.ints(node, 3, "axes")?,
            None => (0..starts.len() as i64).collect(),
        };
        let steps = match self.input(node, 4)? {
            Some(_) => self.ints(node, 4, "steps")?,
            None => vec![1; starts.len()],
        };
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err("starts, ends, axes and steps must have one entry per sliced axis".into());
        }
        let mut v = x;
        for i in 0..starts.len() {
            let axis = crate::shape::normalize_axis(axes[i], rank)?;
            if steps[i] <= 0 {
                return Err(format!(
                    "step {} on axis {axis}: fusebox slices with positive steps only",
                    steps[i]
                ));
            }
            let dim = v.shape()[axis] as i64;
            let clip = |p: i64| (if p < 0 { p.saturating_add(dim) } else { p }).clamp(0, dim);
            let (s, e) = (clip(starts[i]), clip(ends[i]));
            if s == 0 && e == dim && steps[i] == 1 {
                continue;
            }
            v = self.slice(&v, axis, s, e.max(s), steps[i], out)?;
        }
        Ok(vec![v])
    }

    /// A Split node: one `slice` per output.
    fn split_node(
        &mut self,
        node: &NodeProto,
        attrs: &HashMap<String, Attr>,
        out: &str,
    ) -> std::result::Result<Vec<Val>, String> {
        let x = self.required(node, 0)?;
        let rank = x.shape().len();
        let axis = crate::shape::normalize_axis(int_attr(attrs, "axis").unwrap_or(0), rank)?;
        let dim = x.shape()[axis] as i64;
        let n = node.output.len() as i64;
        let sizes = match self.input(node, 1)? {
            Some(_) => self.ints(node, 1, "split")?,
            None => match ints_attr(attrs, "split") {
                Some(s) => s,
                None => {
                    let parts = int_attr(attrs, "num_outputs").unwrap_or(n);
                    if parts != n || parts < 1 {
                        return Err(format!(
                            "num_outputs is {parts}, but the node has {n} output(s)"
                        ));
                    }
                    let chunk = (dim + parts - 1) / parts;
                    (0..parts)
                        .map(|p| chunk.min(dim - p * chunk).max(0))
                        .collect()
                }
            },
        };
        if sizes.len() as i64 != n {
            return Err(format!("{} split sizes for {n} output(s)", sizes.len()));
        }
        let total = sizes.iter().try_fold(0i64, |acc, &s| acc.checked_add(s));
        if sizes.iter().any(|&s| s < 0) || total != Some(dim) {
            return Err(format!(
                "split sizes {sizes:?} do not add up to the dimension {dim}"
            ));
        }
        let mut start = 0;
        let mut outs = Vec::new();
        for (k, &s) in sizes.iter().enumerate() {
            let name = node
                .output
                .get(k)
                .cloned()
                .unwrap_or_else(|| format!("{out}.{k}"));
            outs.push(self.slice(&x, axis, start, start + s, 1, &name)?);
            start += s;
        }
        Ok(outs)
    }

    /// A Constant node's value.
    fn constant(&mut self, attrs: &HashMap<String, Attr>, out: &str) -> Msg {
        let t = match attrs.iter().next() {
            Some((name, value)) if attrs.len() == 1 => match (name.as_str(), value) {
                ("value", Attr::Tensor(t)) => t.clone(),
                ("value_float", Attr::Float(v)) => Tensor::scalar(DType::F32, *v),
                ("value_int", Attr::Int(v)) => Tensor::scalar(DType::I64, *v as f64),
                ("value_floats", Attr::Floats(v)) => {
                    Tensor::from_values(DType::F32, &[v.len()], v.clone()).ok_or("bad floats")?
                }
                ("value_ints", Attr::Ints(v)) => Tensor::from_values(
                    DType::I64,
                    &[v.len()],
                    v.iter().map(|&i| i as f64).collect(),
                )
                .ok_or("bad ints")?,
                (name, _) => {
                    return Err(format!("attribute `{name}` is not a value fusebox reads"));
                }
            },
            _ => return Err("a Constant needs exactly one value attribute".into()),
        };
        Ok(Val::Const(Rc::new(t), Some(out.to_string())))
    }

    /// Input `i`, which must be a constant, as integers (`what` names it in errors).
    fn ints(
        &self,
        node: &NodeProto,
        i: usize,
        what: &str,
    ) -> std::result::Result<Vec<i64>, String> {
        let v = self.required(node, i)?;
        let t = v.constant().ok_or_else(|| {
            format!("`{what}` must be a constant (fusebox shapes are static), not a run-time value")
        })?;
        Ok(t.values().iter().map(|&f| f as i64).collect())
    }

    fn reshape(&mut self, x: &Val, shape: &[usize], name: &str) -> Msg {
        if x.shape() == shape {
            return Ok(x.clone());
        }
        let mut a = Attrs::new();
        a.insert(
            "shape".into(),
            AttrValue::Ints(shape.iter().map(|&d| d as i64).collect()),
        );
        self.emit("reshape", std::slice::from_ref(x), a, name, true)
    }

    fn slice(&mut self, x: &Val, axis: usize, start: i64, end: i64, step: i64, name: &str) -> Msg {
        let mut a = Attrs::new();
        a.insert("axis".into(), AttrValue::Int(axis as i64));
        a.insert("start".into(), AttrValue::Int(start));
        a.insert("end".into(), AttrValue::Int(end));
        a.insert("step".into(), AttrValue::Int(step));
        let base = format!("{name}.slice");
        self.emit("slice", std::slice::from_ref(x), a, &base, false)
    }
}

fn int_attr(attrs: &HashMap<String, Attr>, name: &str) -> Option<i64> {
    match attrs.get(name) {
        Some(Attr::Int(i)) => Some(*i),
        _ => None,
    }
}

fn ints_attr(attrs: &HashMap<String, Attr>, name: &str) -> Option<Vec<i64>> {
    match attrs.get(name) {
        Some(Attr::Ints(v)) => Some(v.clone()),
        _ => None,
    }
}

/// A graph input's dtype and static shape.
fn value_type(info: &ValueInfoProto) -> std::result::Result<TensorType, String> {
    let ty = info
        .type_
        .as_ref()
        .filter(|t| t.has_tensor_type())
        .ok_or_else(|| format!("input `{}` is not a tensor", info.name))?
        .tensor_type();
    let dtype = proto::dtype_of(ty.elem_type).map_err(|e| format!("input `{}`: {e}", info.name))?;
    let shape_proto = ty.shape.as_ref().ok_or_else(|| {
        format!(
            "input `{}` declares no shape; fusebox needs static shapes",
            info.name
        )
    })?;
    let mut dims = Vec::new();
    for d in &shape_proto.dim {
        if !d.has_dim_value() {
            return Err(format!(
                "input `{}` has a symbolic dimension `{}`; fusebox needs static shapes (export with fixed sizes)",
                info.name,
                d.dim_param()
            ));
        }
        dims.push(d.dim_value());
    }
    let (shape, _) =
        proto::element_count(&dims).map_err(|e| format!("input `{}`: {e}", info.name))?;
    Ok(TensorType { dtype, shape })
}

/// Drops nodes no output depends on, and parameter inputs nothing reads.
fn prune(mut graph: Graph, values: &mut BTreeMap<String, Tensor>) -> Graph {
    let mut live: HashSet<String> = graph.outputs.iter().cloned().collect();
    for node in graph.nodes.iter().rev() {
        if live.contains(&node.name) {
            live.extend(node.args.iter().cloned());
        }
    }
    graph.nodes.retain(|n| live.contains(&n.name));
    graph
        .inputs
        .retain(|i| live.contains(&i.name) || !values.contains_key(&i.name));
    values.retain(|name, _| live.contains(name));
    graph
}

/// Composite ops expand through the importer, so each part is folded or checked as it comes.
impl crate::graph::expand::Sink for Importer<'_> {
    type Value = Val;

    fn emitted(&self) -> usize {
        self.graph.nodes.len()
    }

    fn dtype(&mut self, value: &Val) -> std::result::Result<DType, ErrorKind> {
        Ok(value.dtype())
    }

    fn emit(
        &mut self,
        op: &str,
        args: Vec<Val>,
        attrs: Attrs,
        name: &str,
        last: bool,
    ) -> std::result::Result<Val, ErrorKind> {
        Importer::emit(self, op, &args, attrs, name, last).map_err(ErrorKind::Input)
    }
}
