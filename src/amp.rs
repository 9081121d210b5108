//! Cast insertion for automatic mixed precision: the MXNet AMP pass over a fusebox graph.
//!
//! The pass follows the algorithm of MXNet's AMP RFC (apache/incubator-mxnet PR 14173): nodes
//! are visited in topological order and each is copied into the new graph, with casts placed
//! in front of its inputs as the [`Policy`] says. MXNet keeps two mirror maps,
//! `mirror_entry_target_map` and `mirror_entry_fp32_map`, from an input entry to its cast
//! entry, so that a value cast to one type is cast once however many ops want it that way
//! (the RFC's `data` feeding exp, sin and cos). Here one map keyed by (value, dtype) plays both
//! roles and also serves the widest-type casts that MXNet's `amp_multicast` performs.
//!
//! Unlike MXNet's pass, which ran before type inference and so inserted `amp_cast` nodes that
//! turn out to be no-ops at run time, this pass knows every value's dtype and inserts only
//! casts that change one. Graph inputs keep their dtypes; outputs keep theirs by default
//! ([`AmpOptions::keep_output_dtypes`]), through a final cast that takes the output's name.
//!
//! The result is an ordinary graph: the reference evaluator runs it unfused with eager
//! rounding, which is what `fusebox run --amp` does.

use crate::attr::Attrs;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::check::{infer_op, resolve_attrs};
use crate::graph::{Graph, Node, TensorType, check};
use crate::rules::{Builtin, BuiltinAttrs, Catalogue, Policy, Treatment};
use std::collections::{HashMap, HashSet};

/// Options of [`insert_casts_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmpOptions {
    /// Cast each output whose dtype AMP changed back to its original dtype, so callers see
    /// the types they asked for. On by default; off, outputs leave in whatever type the
    /// policy computed them in (cheaper when the consumer takes 16-bit values anyway).
    pub keep_output_dtypes: bool,
}

impl Default for AmpOptions {
    fn default() -> Self {
        AmpOptions {
            keep_output_dtypes: true,
        }
    }
}

/// A graph with casts inserted.
#[derive(Debug, Clone, PartialEq)]
pub struct AmpGraph {
    pub graph: Graph,
    /// Cast nodes the pass added (casts already in the input graph are not counted).
    pub casts_inserted: usize,
}

/// [`insert_casts_with`] with the default options.
pub fn insert_casts(graph: &Graph, catalogue: &Catalogue, policy: &Policy) -> Result<AmpGraph> {
    insert_casts_with(graph, catalogue, policy, &AmpOptions::default())
}

/// Inserts the casts `policy` implies into `graph`.
///
/// Per op treatment (see [`Treatment`]):
/// - low precision: f32, f16 and bf16 inputs not already in the target type are cast to it;
/// - f32: f16 and bf16 inputs are cast to f32;
/// - widest: every float input is cast to the widest float type among the inputs (f16/bf16 <
///   f32 < f64; f16 with bf16 meet at f32);
/// - follow: the node is copied; its dtype follows from its inputs by the catalogue's rules.
///
/// Non-float inputs are never cast, and f64 is never narrowed: a graph that asked for f64 got
/// it on purpose. A node named in the policy's `exclude` list runs in exactly the types it had
/// before the pass: any input whose dtype the pass changed is cast back.
///
/// Inserting into an already cast-inserted graph adds no casts: every input then already has
/// the type its consumer wants.
pub fn insert_casts_with(
    graph: &Graph,
    catalogue: &Catalogue,
    policy: &Policy,
    options: &AmpOptions,
) -> Result<AmpGraph> {
    let original = check(graph, catalogue)?;
    // An exclusion that names no node would protect nothing while the user believes it does.
    if let Some(missing) = policy
        .exclude
        .iter()
        .find(|name| !graph.nodes.iter().any(|n| &n.name == *name))
    {
        return Err(Error::new(
            Default::default(),
            ErrorKind::Rule(format!(
                "the AMP policy excludes `{missing}`, but the graph has no node of that name{}",
                crate::error::hint(missing, graph.nodes.iter().map(|n| n.name.as_str()))
            )),
        ));
    }
    let cast_op = catalogue.builtin(Builtin::Cast).ok_or_else(|| {
        Error::new(
            Default::default(),
            ErrorKind::Rule(
                "AMP inserts casts, but the op catalogue declares no op with `builtin: \"cast\"`"
                    .into(),
            ),
        )
    })?;
    let mut pass = Pass {
        cast_op: cast_op.name().to_string(),
        used: graph
            .inputs
            .iter()
            .map(|i| i.name.clone())
            .chain(graph.nodes.iter().map(|n| n.name.clone()))
            .collect(),
        mirror: HashMap::new(),
        types: HashMap::new(),
        casts: HashMap::new(),
        nodes: Vec::with_capacity(graph.nodes.len() * 2),
        casts_inserted: 0,
    };
    for input in &graph.inputs {
        pass.mirror.insert(input.name.clone(), input.name.clone());
        pass.types
            .insert(input.name.clone(), original[&input.name].clone());
    }
    let outputs: HashSet<&str> = graph.outputs.iter().map(String::as_str).collect();

    for node in &graph.nodes {
        let op = catalogue.get(&node.op).ok_or_else(|| {
            Error::at_node(
                &node.name,
                ErrorKind::UnknownOp {
                    op: node.op.clone(),
                    suggestion: None,
                },
            )
        })?;
        let attrs =
            resolve_attrs(op, &node.attrs).map_err(|(_, k)| Error::at_node(&node.name, k))?;
        let mut args = Vec::with_capacity(node.args.len());
        for arg in &node.args {
            args.push(pass.mirror[arg].clone());
        }
        let dtypes: Vec<DType> = args.iter().map(|a| pass.types[a].dtype).collect();

        let wanted = wanted_dtypes(policy, node, &attrs, &dtypes, &original);
        for ((arg, original_name), want) in args.iter_mut().zip(&node.args).zip(wanted) {
            if let Some(dtype) = want {
                *arg = pass.cast(arg, original_name, dtype);
            }
        }

        let arg_types: Vec<TensorType> = args.iter().map(|a| pass.types[a].clone()).collect();
        let ty =
            infer_op(op, &arg_types, &attrs).map_err(|(_, k)| Error::at_node(&node.name, k))?;
        let old_dtype = original[&node.name].dtype;
        let renamed = options.keep_output_dtypes
            && outputs.contains(node.name.as_str())
            && ty.dtype != old_dtype;
        let name = if renamed {
            pass.fresh(&format!("{}_{}", node.name, ty.dtype))
        } else {
            node.name.clone()
        };
        if op.builtin() == Some(Builtin::Cast)
            && let Ok(BuiltinAttrs::Cast { dtype: d }) = BuiltinAttrs::read(Builtin::Cast, &attrs)
        {
            // A cast the graph already has serves later consumers wanting the same value in
            // the same type, as the pass's own casts do.
            pass.casts
                .entry((args[0].clone(), d))
                .or_insert_with(|| name.clone());
        }
        pass.nodes.push(Node {
            name: name.clone(),
            op: node.op.clone(),
            args,
            attrs: node.attrs.clone(),
        });
        pass.types.insert(name.clone(), ty.clone());
        pass.mirror.insert(node.name.clone(), name.clone());
        if renamed {
            // The output keeps its name and dtype; consumers inside the graph keep reading the
            // value in the type the policy computed it in.
            pass.push_cast(&name, node.name.clone(), old_dtype);
        }
    }

    let result = Graph {
        name: graph.name.clone(),
        inputs: graph.inputs.clone(),
        nodes: pass.nodes,
        outputs: graph.outputs.clone(),
    };
    // The pass builds only well-typed nodes, but a failure here must be an error, not a panic.
    check(&result, catalogue)?;
    Ok(AmpGraph {
        graph: result,
        casts_inserted: pass.casts_inserted,
    })
}

/// The dtype each argument of `node` should have under `policy` (`None` leaves it as it is),
/// given the dtypes its arguments have in the new graph (`dtypes`): an excluded node reads
/// its arguments in their original dtypes (`original`, the input graph's types); any other
/// gets its op's treatment. Apart from the pass's bookkeeping, this is the whole policy.
fn wanted_dtypes(
    policy: &Policy,
    node: &Node,
    attrs: &Attrs,
    dtypes: &[DType],
    original: &HashMap<String, TensorType>,
) -> Vec<Option<DType>> {
    if policy.exclude.contains(&node.name) {
        return node.args.iter().map(|a| Some(original[a].dtype)).collect();
    }
    match policy.treatment(&node.op, attrs) {
        Treatment::LowPrecision => dtypes
            .iter()
            .map(|&d| matches!(d, DType::F16 | DType::BF16 | DType::F32).then_some(policy.target))
            .collect(),
        Treatment::Fp32 => dtypes
            .iter()
            .map(|&d| matches!(d, DType::F16 | DType::BF16).then_some(DType::F32))
            .collect(),
        Treatment::Widest => {
            let widest = dtypes
                .iter()
                .copied()
                .filter(|d| d.is_float())
                .reduce(DType::promote);
            dtypes
                .iter()
                .map(|d| widest.filter(|_| d.is_float()))
                .collect()
        }
        Treatment::Follow => vec![None; dtypes.len()],
    }
}

/// The state of one visit.
struct Pass {
    /// The name of the catalogue's cast op, which the pass inserts.
    cast_op: String,
    /// Every name taken in either graph, so a generated name never shadows an original one.
    used: HashSet<String>,
    /// Original value name → the value standing for it in the new graph (MXNet's mirror_map).
    mirror: HashMap<String, String>,
    /// Types of the new graph's values.
    types: HashMap<String, TensorType>,
    /// (new value, dtype) → its cast (MXNet's mirror_entry_target_map and
    /// mirror_entry_fp32_map in one).
    casts: HashMap<(String, DType), String>,
    nodes: Vec<Node>,
    casts_inserted: usize,
}

impl Pass {
    /// `value` in `dtype`: itself, the cast made earlier, or a new cast named after the
    /// original value (`data_f16`, `h_f32`).
    fn cast(&mut self, value: &str, original_name: &str, dtype: DType) -> String {
        if self.types[value].dtype == dtype {
            return value.to_string();
        }
        if let Some(cast) = self.casts.get(&(value.to_string(), dtype)) {
            return cast.clone();
        }
        let name = self.fresh(&format!("{original_name}_{dtype}"));
        self.push_cast(value, name.clone(), dtype);
        name
    }

    fn push_cast(&mut self, value: &str, name: String, dtype: DType) {
        let shape = self.types[value].shape.clone();
        self.nodes.push(Node {
            name: name.clone(),
            op: self.cast_op.clone(),
            args: vec![value.to_string()],
            attrs: BuiltinAttrs::Cast { dtype }.to_attrs(),
        });
        self.types.insert(name.clone(), TensorType { dtype, shape });
        self.casts.insert((value.to_string(), dtype), name);
        self.casts_inserted += 1;
    }

    /// `base`, or `base_2`, `base_3`, … when taken.
    fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut n = 2;
        while self.used.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        self.used.insert(name.clone());
        name
    }
}
