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

mod convolution;
mod error;
mod fold;
mod integers;
pub use error::ImportError;
pub use fold::FOLD_LIMIT;
mod model_check;
mod normalization;
mod pairwise;
mod products;
pub mod proto;
mod recurrent;
mod resize;
mod selection;
mod specialize;
mod structural;
mod table;
mod versions;
use model_check::{definitions, opset_meanings, unsupported};

use crate::attr::{AttrType, AttrValue, Attrs};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::graph::check::{infer_op, resolve_attrs};
use crate::graph::dims::{Declared, DeclaredInput, Dim, DimSizes, Specialization};
use crate::graph::{Graph, Input, Node, TensorType, TypeMap};
use crate::rules::builtin::BuiltinAttrs;
use crate::rules::onnx::{MapTable, Mapping};
use crate::rules::{Builtin, Catalogue};
use crate::tensor::Tensor;
use onnx_protobuf::{GraphProto, NodeProto, ValueInfoProto};
use proto::{Attr, ProtoError};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

pub use crate::rules::onnx::STRUCTURAL;

/// What a refusal of a run-time value where a constant is needed adds for a model input.
const GIVE_VALUE: &str =
    " (an integer input of the model is specialized to its value when the run gives one)";

/// An imported model: the graph, its types, and the stored value of each parameter input.
#[derive(Debug, Clone)]
pub struct Imported {
    pub graph: Graph,
    pub types: TypeMap,
    pub values: BTreeMap<String, Tensor>,
    /// The inputs' declared dimensions (named where the model leaves them open) and the size
    /// each name was imported at.
    pub declared: Declared,
    /// The integer inputs whose given values the graph was specialized to, by name: a node
    /// needed them as constants. The graph still declares them, and a run must give them these
    /// values.
    pub specialized: BTreeMap<String, Tensor>,
}

/// Whether `path` names an ONNX model (by its extension), so commands taking a graph know
/// which reader to use.
pub fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Imports a model file with an op table (a rule set's `onnx`), each symbolic dimension at
/// [`dims::DEFAULT_SIZE`]. External data is looked up beside it.
pub fn import(path: &Path, catalogue: &Catalogue, table: &MapTable) -> Result<Imported> {
    import_sized(path, catalogue, table, &DimSizes::new())
}

/// [`import`] with a size for named dimensions (`sizes`; the others at
/// [`dims::DEFAULT_SIZE`]): the graph is specialized to them.
pub fn import_sized(
    path: &Path,
    catalogue: &Catalogue,
    table: &MapTable,
    sizes: &DimSizes,
) -> Result<Imported> {
    import_specialized(path, catalogue, table, &Specialization::sized(sizes))
}

/// [`import`] specialized: each symbolic dimension at its size in `given.sizes` (the others at
/// [`dims::DEFAULT_SIZE`]), and an integer input that a node needs as a constant at its value
/// in `given.values`, if it has one there. [`Imported::specialized`] says which values were
/// used.
pub fn import_specialized(
    path: &Path,
    catalogue: &Catalogue,
    table: &MapTable,
    given: &Specialization,
) -> Result<Imported> {
    let file = path.display().to_string();
    let fail = |message: String| Error::new(Site::model(&file), ErrorKind::Input(message));
    let model = proto::read_model(path).map_err(|e| fail(e.to_string()))?;
    let dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    import_model(&model, &file, dir, catalogue, table, given)
}

/// The declared dimensions of the inputs of the model at `path`, read without importing it:
/// what sizes the arrays of a run give its symbolic dimensions ([`Declared::sizes_from`]).
pub fn declared(path: &Path) -> Result<Declared> {
    let file = path.display().to_string();
    let fail = |message: String| Error::new(Site::model(&file), ErrorKind::Input(message));
    let model = proto::read_model(path).map_err(|e| fail(e.to_string()))?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| fail("the model has no graph".into()))?;
    declared_inputs(graph).map_err(|e| fail(e.to_string()))
}

/// Imports a parsed model; `file` names it in errors and `dir` holds its external data.
pub fn import_model(
    model: &onnx_protobuf::ModelProto,
    file: &str,
    dir: Option<&Path>,
    catalogue: &Catalogue,
    table: &MapTable,
    given: &Specialization,
) -> Result<Imported> {
    let fail = |message: String| Error::new(Site::model(file), ErrorKind::Input(message));
    // The table follows the op semantics of opset 13 on (axes as inputs, Softmax over one
    // axis); the opsets after, up to 26 (onnx 1.22), changed none of the imported ops'
    // meaning, only the element types they admit, which are checked per tensor. A model of
    // another opset imports where its ops mean the same (`opset_meanings`).
    let opset = model
        .opset_import
        .iter()
        .filter(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .max();
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| fail("the model has no graph".into()))?;
    unsupported(graph, table).map_err(|e| fail(e.to_string()))?;
    if let Some(opset) = opset {
        let opset = u32::try_from(opset)
            .map_err(|_| fail(format!("opset {opset} is not a version of ONNX")))?;
        opset_meanings(graph, opset).map_err(|e| fail(e.to_string()))?;
    }
    let mut declared = declared_inputs(graph).map_err(|e| fail(e.to_string()))?;
    let in_file = |mut e: Error| {
        e.site.file = Some(file.to_string());
        e
    };
    let sizes = if declared.is_symbolic() {
        let shape_given = |name: &str| given.shapes.get(name).map(Vec::as_slice);
        declared
            .sizes_from(shape_given, &given.sizes)
            .map_err(in_file)?
    } else {
        given.sizes.clone()
    };
    declared.bind(&sizes).map_err(in_file)?;
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
        sizes: &declared.sizes,
        known: &given.values,
        specialized: RefCell::new(BTreeMap::new()),
    };
    importer.run(graph).map_err(|e| at_sizes(e, &declared))?;
    let Importer {
        graph,
        mut values,
        specialized,
        ..
    } = importer;
    let specialized = specialized.into_inner();
    let graph = prune(graph, &mut values);
    // The graph's own check names the node at fault; the message also names the model, as
    // every other import error does (found by the loader fuzzer: a model whose outputs were
    // all dropped said only "a graph needs at least one output").
    let types = crate::graph::check(&graph, catalogue).map_err(|mut e| {
        if e.site.file.is_none() {
            e.site.file = Some(file.to_string());
        }
        at_sizes(e, &declared)
    })?;
    Ok(Imported {
        graph,
        types,
        values,
        declared,
        specialized,
    })
}

/// An import error of a model with symbolic dimensions also says the sizes they were given:
/// a model may accept only some sizes (a sequence no longer than its position table).
fn at_sizes(mut e: Error, declared: &Declared) -> Error {
    if declared.is_symbolic()
        && let ErrorKind::Input(message) = &mut e.kind
    {
        let hint = if declared.defaulted.is_empty() {
            ""
        } else {
            "; set sizes with --dim NAME=SIZE"
        };
        *message = format!("{message} (imported with {}{hint})", declared.describe());
    }
    e
}

/// Every input that is not an initializer, with its declared dimensions: numbers, names
/// (`dim_param`), or for an axis the model leaves unnamed, the name `INPUT[AXIS]`.
fn declared_inputs(graph: &GraphProto) -> Imports<Declared> {
    let initializers: HashSet<&str> = graph.initializer.iter().map(|i| i.name.as_str()).collect();
    let mut inputs = Vec::new();
    for info in &graph.input {
        if initializers.contains(info.name.as_str()) {
            continue;
        }
        let Some(shape) = info
            .type_
            .as_ref()
            .filter(|t| t.has_tensor_type())
            .and_then(|t| t.tensor_type().shape.as_ref())
        else {
            continue; // value_type refuses it, at its input
        };
        let dims = shape
            .dim
            .iter()
            .enumerate()
            .map(|(axis, d)| {
                if d.has_dim_value() {
                    usize::try_from(d.dim_value())
                        .map(Dim::Fixed)
                        .map_err(|_| ProtoError::NegativeDimension(d.dim_value()).into())
                } else if !d.dim_param().is_empty() {
                    Ok(Dim::Named(d.dim_param().to_string()))
                } else {
                    Ok(Dim::Named(format!("{}[{axis}]", info.name)))
                }
            })
            .collect::<Imports<Vec<Dim>>>()
            .map_err(|e: ImportError| e.within(format!("input `{}`", info.name)))?;
        inputs.push(DeclaredInput {
            name: info.name.clone(),
            dims,
        });
    }
    Ok(Declared {
        inputs,
        ..Declared::default()
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
    /// A constant of `dtype` and `shape` holding `values` (rounded to `dtype`): what the
    /// importer's own expansions (recurrent ops, positions) add beside a model's values.
    fn floats(dtype: DType, shape: &[usize], values: Vec<f64>) -> Imports<Val> {
        let t = Tensor::from_values(dtype, shape, values).ok_or(ImportError::Internal(
            "a constant's values do not fill its shape",
        ))?;
        Ok(Val::Const(Rc::new(t), None))
    }

    /// [`Val::floats`] of integers, every bit kept.
    fn ints(dtype: DType, shape: &[usize], values: Vec<i64>) -> Imports<Val> {
        let t = Tensor::from_ints(dtype, shape, values).ok_or(ImportError::Internal(
            "a constant's values do not fill its shape",
        ))?;
        Ok(Val::Const(Rc::new(t), None))
    }

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

/// One imported value, or why the node cannot be imported.
type Imports<T = Val> = std::result::Result<T, ImportError>;

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
    /// The size each symbolic dimension is imported at.
    sizes: &'a DimSizes,
    /// Values of inputs the run gives, for nodes that need a constant ([`Importer::demand`]).
    known: &'a BTreeMap<String, Tensor>,
    /// The known values used, by input name.
    specialized: RefCell<BTreeMap<String, Tensor>>,
}

impl<'a> Importer<'a> {
    fn run(&mut self, graph: &GraphProto) -> Result<()> {
        let file = self.file.clone();
        let fail = |message: String| Error::new(Site::model(&file), ErrorKind::Input(message));
        definitions(graph).map_err(|e| fail(e.to_string()))?;
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
            let ty = value_type(input, self.sizes).map_err(|e| {
                Error::new(
                    Site::model(&self.file).with_node(&input.name),
                    ErrorKind::Input(e.to_string()),
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
                    ErrorKind::Input(e.to_string()),
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
                    let cast = BuiltinAttrs::Cast {
                        dtype: other.dtype(),
                    };
                    let op = self
                        .catalogue
                        .builtin(Builtin::Cast)
                        .cloned()
                        .ok_or_else(|| fail("the catalogue has no cast op".into()))?;
                    let (arg, _) = self.materialize(&other);
                    let ty = self.types[&arg].clone();
                    let name = self.fresh(&output.name, true);
                    self.push(name.clone(), &op, vec![arg], cast.to_attrs(), &[ty])
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
                if origin.is_none()
                    && let Some(name) = self.splat(t)
                {
                    self.types.insert(name.clone(), ty.clone());
                    return (name, ty);
                }
                let literal = self.catalogue.builtin(Builtin::Const).cloned();
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
                    let value = BuiltinAttrs::Const {
                        value: t.values()[0],
                        dtype: t.dtype,
                    };
                    self.graph.nodes.push(Node {
                        name: name.clone(),
                        op: op.name().to_string(),
                        args: vec![],
                        attrs: value.to_attrs(),
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

    /// A computed float constant whose elements are all one value (a padding slab, a
    /// `ConstantOfShape`) as that value broadcast: a `const` node and a `broadcast_to` of it,
    /// which kernels compute in place, instead of a stored input read from memory (and a
    /// library call can see that it is zeros). `None` for any other constant.
    fn splat(&mut self, t: &Tensor) -> Option<String> {
        if !t.dtype.is_float() || crate::shape::numel(t.shape()) < 2 {
            return None;
        }
        let floats = t.floats();
        let mut values = floats.iter();
        let first = *values.next()?;
        if !values.all(|v| v.to_bits() == first.to_bits()) {
            return None;
        }
        let broadcast = self.catalogue.builtin(Builtin::BroadcastTo)?.clone();
        let scalar = Val::floats(t.dtype, &[], vec![first]).ok()?;
        let (value, value_ty) = self.materialize(&scalar);
        let name = self.fresh("splat", false);
        let attrs = BuiltinAttrs::shape(t.shape()).to_attrs();
        self.push(name.clone(), &broadcast, vec![value], attrs, &[value_ty])
            .ok()?;
        Some(name)
    }

    /// Appends a checked node and records its type.
    fn push(
        &mut self,
        name: String,
        op: &crate::rules::ops::OpDef,
        args: Vec<String>,
        attrs: Attrs,
        arg_types: &[TensorType],
    ) -> Imports<TensorType> {
        let resolved = resolve_attrs(op, &attrs).map_err(|(_, kind)| kind)?;
        let ty = infer_op(op, arg_types, &resolved).map_err(|(_, kind)| kind)?;
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
    fn emit(&mut self, op: &str, args: &[Val], attrs: Attrs, name: &str, own: bool) -> Imports {
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
            .map_err(|fault| fault.kind().into());
        }
        let def = self
            .catalogue
            .get(op)
            .cloned()
            .ok_or_else(|| ImportError::RuleSet(format!("the catalogue has no op `{op}`")))?;
        if !def.accepts_arity(args.len()) {
            return Err(ImportError::Op(ErrorKind::Arity {
                op: op.to_string(),
                expected: def.arity_text(),
                got: args.len(),
            }));
        }
        // Constants fold, except a model's weights: a non-scalar floating-point initializer
        // stays a parameter input (so `--input` can replace it and `grad` can differentiate
        // by it) even where only constants feed the op, as a transposed Gemm weight does.
        // Integer and bool initializers are the graph's structure (the parts of a shape, axes,
        // positions: the dynamo exporter stores them so), and fold.
        let weight = |a: &Val| matches!(a, Val::Const(t, Some(name)) if !t.shape().is_empty() && t.dtype.is_float() && self.initializers.contains(name));
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

    /// Applies the catalogue's op for built-in `builtin` (whatever the rule set calls it) with
    /// the attributes `attrs`, as [`Importer::emit`] does.
    fn emit_builtin(
        &mut self,
        builtin: Builtin,
        args: &[Val],
        attrs: BuiltinAttrs,
        name: &str,
        own: bool,
    ) -> Imports {
        let op = self
            .catalogue
            .builtin(builtin)
            .map(|op| op.name().to_string())
            .ok_or_else(|| {
                ImportError::RuleSet(format!("the catalogue has no {} op", builtin.name()))
            })?;
        self.emit(&op, args, attrs.to_attrs(), name, own)
    }

    fn input(&self, node: &NodeProto, i: usize) -> Imports<Option<Val>> {
        match node.input.get(i) {
            None => Ok(None),
            Some(name) if name.is_empty() => Ok(None),
            Some(name) => {
                self.env
                    .get(name)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| match self.dropped.get(name) {
                        Some(why) => ImportError::Unsupported(format!("input {why}")),
                        None => ImportError::Malformed(format!(
                            "input `{name}` is not a value computed before it"
                        )),
                    })
            }
        }
    }

    fn required(&self, node: &NodeProto, i: usize) -> Imports {
        self.input(node, i)?
            .ok_or_else(|| ImportError::Malformed(format!("input {i} is required")))
    }

    /// Imports one node; its output values in order.
    fn node(&mut self, node: &NodeProto) -> Imports<Vec<Val>> {
        let mut attrs: HashMap<String, Attr> = HashMap::new();
        for a in &node.attribute {
            attrs.insert(a.name.clone(), proto::attribute(a, self.dir)?);
        }
        let out = node
            .output
            .first()
            .cloned()
            .unwrap_or_else(|| node_label(node));
        self.apply(node, &attrs, &out)
    }

    /// Imports one node whose attributes are read: by its structural handler or the table.
    fn apply(
        &mut self,
        node: &NodeProto,
        attrs: &HashMap<String, Attr>,
        out: &str,
    ) -> Imports<Vec<Val>> {
        match structural::handler(&node.op_type) {
            Some(handle) => handle(self, node, attrs, out),
            None => self.table_node(node, attrs, out),
        }
    }
}

/// A graph input's dtype, and its shape with each symbolic dimension at its size in `sizes`.
fn value_type(info: &ValueInfoProto, sizes: &DimSizes) -> Imports<TensorType> {
    let within = |e: ProtoError| ImportError::from(e).within(format!("input `{}`", info.name));
    let ty = info
        .type_
        .as_ref()
        .filter(|t| t.has_tensor_type())
        .ok_or_else(|| ImportError::Unsupported(format!("input `{}` is not a tensor", info.name)))?
        .tensor_type();
    let dtype = proto::dtype_of(ty.elem_type).map_err(within)?;
    let shape_proto = ty.shape.as_ref().ok_or_else(|| {
        ImportError::Unsupported(format!(
            "input `{}` declares no shape; fusebox needs static shapes",
            info.name
        ))
    })?;
    let mut dims = Vec::new();
    for (axis, d) in shape_proto.dim.iter().enumerate() {
        if d.has_dim_value() {
            dims.push(d.dim_value());
            continue;
        }
        let name = if d.dim_param().is_empty() {
            format!("{}[{axis}]", info.name)
        } else {
            d.dim_param().to_string()
        };
        let size = sizes
            .get(&name)
            .ok_or(ImportError::Internal("a symbolic dimension was not bound"))?;
        dims.push(i64::try_from(*size).map_err(|_| {
            ImportError::Unsupported(format!("dimension `{name}` = {size} is too large"))
        })?);
    }
    let (shape, _) = proto::element_count(&dims).map_err(within)?;
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
        Importer::emit(self, op, &args, attrs, name, last)
            .map_err(|e| ErrorKind::Input(e.to_string()))
    }
}
