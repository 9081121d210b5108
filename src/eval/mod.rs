//! The reference evaluator: the oracle every optimization is checked against.
//!
//! It runs a graph op by op, unfused, and rounds each op's result to the op's dtype, as eager
//! frameworks do: f16 and bf16 are computed in f32 and rounded after every op, f32 in f32, f64
//! in f64. It favours being obviously right over being fast.

mod builtin;
pub(crate) mod pointwise;

use crate::error::{Error, ErrorKind, Result};
use crate::graph::{Graph, check, check::resolve_attrs};
use crate::rules::{Catalogue, Semantics};
use crate::tensor::Tensor;
use std::collections::HashMap;

/// The largest tensor the reference evaluator materializes, in elements (16 GiB of f64):
/// beyond it an allocation would abort the process, so evaluation stops with an error instead.
pub const MAX_ELEMENTS: usize = 1 << 31;

/// Refuses a value of `shape` beyond [`MAX_ELEMENTS`], before anything is allocated for it.
pub fn check_size(name: &str, shape: &[usize]) -> Result<()> {
    if crate::shape::numel(shape) > MAX_ELEMENTS {
        return Err(Error::at_node(
            name,
            ErrorKind::Eval(format!(
                "shape {shape:?} has more than {MAX_ELEMENTS} elements, the reference evaluator's limit"
            )),
        ));
    }
    Ok(())
}

/// Why the reference evaluator could not compute one op's value (reported at the node).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Alloc(#[from] crate::tensor::AllocError),
    #[error(transparent)]
    Shape(#[from] crate::shape::ShapeError),
    #[error(transparent)]
    Formula(#[from] crate::formula::eval::BindingError),
    /// An operand that does not broadcast to the result (the checker said it would).
    #[error("cannot broadcast {from:?} to {to:?}")]
    Broadcast {
        from: crate::shape::Shape,
        to: crate::shape::Shape,
    },
    /// The op's plan refused its operands, in graph checking's words.
    #[error(transparent)]
    Plan(#[from] crate::graph::check::PlanError),
    /// An internal invariant broke: an array of the wrong shape, a layout step that is not
    /// one; the message says which.
    #[error("{0}")]
    Internal(String),
}

/// Named tensors (graph inputs going in, graph outputs coming out).
pub type Tensors = HashMap<String, Tensor>;

/// A seeded random value for the graph input at `index` (see [`Tensor::random`]).
///
/// Each input draws from its own ChaCha stream, so an input's values depend only on the seed
/// and its position — not on which other inputs were supplied from files.
pub fn random_input(graph: &Graph, index: usize, seed: u64) -> Tensor {
    try_random_input(graph, index, seed).unwrap_or_else(|e| panic!("{e}"))
}

/// [`random_input`], or an error at the input naming the size when the system refuses the
/// values (`--random-inputs` on a declared shape too large for memory).
pub fn try_random_input(graph: &Graph, index: usize, seed: u64) -> Result<Tensor> {
    let input = &graph.inputs[index];
    let mut rng = crate::tensor::seeded_rng(seed);
    rng.set_stream(index as u64);
    Tensor::try_random(input.dtype, &input.shape, &mut rng)
        .map_err(|e| Error::at_node(&input.name, ErrorKind::Input(e.to_string())))
}

/// Seeded random values for every input of `graph`.
pub fn random_inputs(graph: &Graph, seed: u64) -> Tensors {
    (0..graph.inputs.len())
        .map(|i| (graph.inputs[i].name.clone(), random_input(graph, i, seed)))
        .collect()
}

/// Evaluates `graph` on `inputs` and returns its outputs by name.
///
/// Every input must be given with exactly the declared dtype and shape.
pub fn evaluate(graph: &Graph, catalogue: &Catalogue, inputs: &Tensors) -> Result<Tensors> {
    let mut all = evaluate_all(graph, catalogue, inputs)?;
    // Moved, not cloned: outputs of full-size graphs are large. An output named twice is one
    // entry of the map.
    Ok(graph
        .outputs
        .iter()
        .filter_map(|name| Some((name.clone(), all.remove(name)?)))
        .collect())
}

/// Like [`evaluate`] but returns every intermediate value too (for debugging and for tests
/// that compare values inside a graph).
pub fn evaluate_all(graph: &Graph, catalogue: &Catalogue, inputs: &Tensors) -> Result<Tensors> {
    evaluate_reading(graph, catalogue, inputs, false)
}

/// [`evaluate`] on the values `values` holds for the graph's inputs, among others it may hold
/// (a model's stored values, of which a graph of values made from some of them reads a few):
/// only those inputs are copied.
pub fn evaluate_among(graph: &Graph, catalogue: &Catalogue, values: &Tensors) -> Result<Tensors> {
    let mut all = evaluate_reading(graph, catalogue, values, true)?;
    Ok(graph
        .outputs
        .iter()
        .filter_map(|name| Some((name.clone(), all.remove(name)?)))
        .collect())
}

/// [`evaluate_all`], refusing names `inputs` holds besides the graph's inputs unless `others`.
fn evaluate_reading(
    graph: &Graph,
    catalogue: &Catalogue,
    inputs: &Tensors,
    others: bool,
) -> Result<Tensors> {
    let types = check(graph, catalogue)?;
    for (name, ty) in &types {
        check_size(name, &ty.shape)?;
    }
    let mut values = Tensors::new();
    for input in &graph.inputs {
        let tensor = inputs.get(&input.name).ok_or_else(|| {
            Error::at_node(
                &input.name,
                ErrorKind::Input(format!("no value given for input `{}`", input.name)),
            )
        })?;
        if tensor.dtype != input.dtype || tensor.shape() != input.shape.as_slice() {
            return Err(Error::at_node(
                &input.name,
                ErrorKind::Input(format!(
                    "input `{}` is declared {}{:?} but the value given is {}{:?}",
                    input.name,
                    input.dtype,
                    input.shape,
                    tensor.dtype,
                    tensor.shape()
                )),
            ));
        }
        let copy = tensor
            .try_clone()
            .map_err(|e| Error::at_node(&input.name, ErrorKind::Eval(e.to_string())))?;
        values.insert(input.name.clone(), copy);
    }
    for name in inputs.keys().filter(|_| !others) {
        if graph.input(name).is_none() {
            return Err(Error::at_node(
                name,
                ErrorKind::Input(format!(
                    "`{name}` is not an input of graph `{}`{}",
                    graph.name,
                    crate::error::hint(name, graph.inputs.iter().map(|i| i.name.as_str()))
                )),
            ));
        }
    }
    for node in &graph.nodes {
        let op = catalogue.get(&node.op).expect("checked above");
        let attrs = resolve_attrs(op, &node.attrs).expect("checked above");
        let args: Vec<&Tensor> = node.args.iter().map(|a| &values[a]).collect();
        let out_type = &types[&node.name];
        let result = probe_working_set(op, &args, out_type)
            .map_err(EvalError::from)
            .and_then(|()| apply_op(op, &args, &attrs, out_type))
            .map_err(|e| Error::at_node(&node.name, ErrorKind::Eval(e.to_string())))?;
        debug_assert_eq!(result.shape(), out_type.shape.as_slice());
        debug_assert_eq!(result.dtype, out_type.dtype);
        values.insert(node.name.clone(), result);
    }
    Ok(values)
}

/// Asks the system for the room one op's evaluation takes, before it starts (see
/// [`crate::tensor::probe_allocation`]): the ops build their results with `ndarray`, whose
/// allocations abort where the system refuses them, so a value too large for the memory left
/// must be found here and be an error naming its size. The count is an upper bound of what
/// [`apply_op`] holds at once, in elements of eight bytes (the evaluator holds every element
/// as an `f64` or `i64`): a formula converts or broadcasts every operand to the result's size
/// and keeps a few temporaries of it; a layout op or a concat writes the result from (a
/// converted copy of) its operands; a reduction or a matmul works on row-major copies of
/// its operands.
fn probe_working_set(
    op: &crate::rules::OpDef,
    args: &[&Tensor],
    out: &crate::graph::TensorType,
) -> std::result::Result<(), crate::tensor::AllocError> {
    use crate::rules::Builtin;
    let out_len = crate::shape::numel(&out.shape);
    let arg_len = args
        .iter()
        .fold(0usize, |sum, a| sum.saturating_add(a.len()));
    let (per_out, per_arg) = match &op.semantics {
        Semantics::Formula(_) => (args.len() + 3, 0),
        Semantics::Builtin(
            Builtin::BroadcastTo
            | Builtin::Reshape
            | Builtin::Transpose
            | Builtin::Slice
            | Builtin::Concat,
        ) => (1, 1),
        Semantics::Builtin(_) => (2, 2),
    };
    let elements = out_len
        .saturating_mul(per_out)
        .saturating_add(arg_len.saturating_mul(per_arg));
    crate::tensor::probe_allocation(elements.saturating_mul(8), &out.shape)
}

/// Applies one op to tensors, exactly as [`evaluate`] does for a node: `attrs` resolved (see
/// [`resolve_attrs`]) and `out` the type the checker inferred. Constant folding in the e-graph
/// calls this, so a folded constant is bit-for-bit what the reference evaluator computes.
pub fn apply_op(
    op: &crate::rules::OpDef,
    args: &[&Tensor],
    attrs: &crate::attr::Attrs,
    out: &crate::graph::TensorType,
) -> std::result::Result<Tensor, EvalError> {
    match &op.semantics {
        Semantics::Formula(expr) => {
            let dtypes: Vec<_> = args.iter().map(|t| t.dtype).collect();
            pointwise::apply(op, expr, args, attrs, out, &dtypes)
        }
        Semantics::Builtin(b) => builtin::apply(*b, args, attrs, out),
    }
}
