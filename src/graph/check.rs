//! Validation and inference: every name resolves, every op exists with the right arity and
//! attributes, and every value gets a dtype and a static shape.

use super::{Graph, Node};
use crate::attr::{AttrValue, Attrs};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, suggest};
use crate::rules::builtin::{BuiltinAttr, BuiltinAttrs, MissingAttr};
use crate::rules::{Builtin, Catalogue, DtypeRule, OpDef, Semantics};
use crate::shape::{self, Shape, ShapeError};
use std::collections::HashMap;
use std::fmt;

/// A value's element type and static shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.shape)
    }
}

/// The inferred type of every input and node, by name.
pub type TypeMap = HashMap<String, TensorType>;

/// Which part of a graph an error concerns; turned into a file position by the loader, or into
/// a node name for graphs built in Rust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Graph,
    /// The `outputs` list as a whole.
    Outputs,
    Input {
        index: usize,
        field: &'static str,
    },
    Node {
        index: usize,
        field: &'static str,
    },
    Arg {
        node: usize,
        arg: usize,
    },
    Attr {
        node: usize,
        attr: String,
    },
    Output {
        index: usize,
    },
}

/// A check failure before it is located.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub part: Part,
    pub kind: ErrorKind,
}

/// Validates `graph` against `catalogue` and infers every value's type.
///
/// Errors name the node (or input, or output) they concern; [`file::load`](super::file::load)
/// adds the file position.
pub fn check(graph: &Graph, catalogue: &Catalogue) -> Result<TypeMap> {
    check_parts(graph, catalogue).map_err(|p| {
        let name = match &p.part {
            Part::Graph | Part::Outputs => graph.name.clone(),
            Part::Input { index, .. } => graph.inputs[*index].name.clone(),
            Part::Node { index, .. } | Part::Arg { node: index, .. } => {
                graph.nodes[*index].name.clone()
            }
            Part::Attr { node, .. } => graph.nodes[*node].name.clone(),
            Part::Output { index } => graph.outputs[*index].clone(),
        };
        Error::at_node(&name, p.kind)
    })
}

/// Like [`check`], but reports which part of the graph failed.
pub fn check_parts(graph: &Graph, catalogue: &Catalogue) -> Result<TypeMap, Problem> {
    let mut types = TypeMap::new();
    let mut defined_at: HashMap<&str, Part> = HashMap::new();
    let later: HashMap<&str, usize> = graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();

    for (index, input) in graph.inputs.iter().enumerate() {
        let part = Part::Input {
            index,
            field: "name",
        };
        addressable(
            &input.shape,
            Part::Input {
                index,
                field: "shape",
            },
            "shape",
        )?;
        if defined_at.contains_key(input.name.as_str()) {
            return Err(Problem {
                part,
                kind: ErrorKind::Duplicate {
                    name: input.name.clone(),
                },
            });
        }
        defined_at.insert(&input.name, part);
        types.insert(
            input.name.clone(),
            TensorType {
                dtype: input.dtype,
                shape: input.shape.clone(),
            },
        );
    }

    for (index, node) in graph.nodes.iter().enumerate() {
        if defined_at.contains_key(node.name.as_str()) {
            return Err(Problem {
                part: Part::Node {
                    index,
                    field: "name",
                },
                kind: ErrorKind::Duplicate {
                    name: node.name.clone(),
                },
            });
        }
        let mut arg_types = Vec::with_capacity(node.args.len());
        for (arg_index, arg) in node.args.iter().enumerate() {
            let part = Part::Arg {
                node: index,
                arg: arg_index,
            };
            match types.get(arg) {
                Some(t) => arg_types.push(t.clone()),
                None => {
                    let kind = if arg == &node.name {
                        ErrorKind::Cycle { name: arg.clone() }
                    } else if let Some(&later_index) = later.get(arg.as_str()) {
                        ErrorKind::UseBeforeDefinition {
                            name: arg.clone(),
                            index: later_index,
                        }
                    } else {
                        ErrorKind::UnknownName {
                            name: arg.clone(),
                            suggestion: suggest(arg, types.keys().map(String::as_str)),
                        }
                    };
                    return Err(Problem { part, kind });
                }
            }
        }
        let ty = infer_node(node, index, &arg_types, catalogue)?;
        addressable(&ty.shape, Part::Node { index, field: "op" }, "result shape")?;
        defined_at.insert(
            &node.name,
            Part::Node {
                index,
                field: "name",
            },
        );
        types.insert(node.name.clone(), ty);
    }
    // Inputs are held to the element limit too, but only once every node has checked: a
    // node's own problem with a huge input (a concat whose length overflows) is the more
    // precise report.
    for (index, input) in graph.inputs.iter().enumerate() {
        if !shape::within_limits(&input.shape) {
            return Err(Problem {
                part: Part::Input {
                    index,
                    field: "shape",
                },
                kind: ErrorKind::Shape(format!(
                    "shape {:?} has more than 2^48 = {} elements, the most a value may have",
                    input.shape,
                    shape::MAX_NUMEL
                )),
            });
        }
    }

    if graph.outputs.is_empty() {
        return Err(Problem {
            part: Part::Outputs,
            kind: ErrorKind::Input("a graph needs at least one output".into()),
        });
    }
    for (index, output) in graph.outputs.iter().enumerate() {
        if !types.contains_key(output) {
            return Err(Problem {
                part: Part::Output { index },
                kind: ErrorKind::UnknownName {
                    name: output.clone(),
                    suggestion: suggest(output, types.keys().map(String::as_str)),
                },
            });
        }
        if graph.outputs[..index].contains(output) {
            return Err(Problem {
                part: Part::Output { index },
                kind: ErrorKind::Duplicate {
                    name: output.clone(),
                },
            });
        }
    }
    Ok(types)
}

/// Refuses a shape with more than [`shape::MAX_RANK`] axes or whose element count does not
/// fit the machine's address space, and a node's result beyond [`shape::MAX_NUMEL`]
/// elements (inputs are held to that after the nodes are checked): every later stage (byte
/// counts, buffers) may then count in plain integers without overflowing.
fn addressable(shape: &[usize], part: Part, what: &str) -> Result<(), Problem> {
    let is_result = matches!(part, Part::Node { .. });
    let problem = if shape.len() > shape::MAX_RANK {
        format!(
            "{what} has {} axes, more than {}, the most a shape may have",
            shape.len(),
            shape::MAX_RANK
        )
    } else if shape::checked_numel(shape).is_none() {
        format!("{what} {shape:?} is too large to address on this machine")
    } else if is_result && !shape::within_limits(shape) {
        format!(
            "{what} {shape:?} has more than 2^48 = {} elements, the most a value may have",
            shape::MAX_NUMEL
        )
    } else {
        return Ok(());
    };
    Err(Problem {
        part,
        kind: ErrorKind::Shape(problem),
    })
}

/// The node's attributes with catalogue defaults filled in, each checked against its type.
pub fn resolve_attrs(op: &OpDef, attrs: &Attrs) -> Result<Attrs, (Option<String>, ErrorKind)> {
    crate::rules::ops::bind_attrs(op.name(), &op.spec.attrs, attrs)
}

pub(crate) fn infer_node(
    node: &Node,
    index: usize,
    args: &[TensorType],
    catalogue: &Catalogue,
) -> Result<TensorType, Problem> {
    let node_part = |field| Part::Node { index, field };
    let problem = |part: Part, kind| Problem { part, kind };
    let op = catalogue.get(&node.op).ok_or_else(|| {
        problem(
            node_part("op"),
            ErrorKind::UnknownOp {
                op: node.op.clone(),
                suggestion: suggest(&node.op, catalogue.names()),
            },
        )
    })?;
    if !op.accepts_arity(args.len()) {
        return Err(problem(
            node_part("args"),
            ErrorKind::Arity {
                op: node.op.clone(),
                expected: op.arity_text(),
                got: args.len(),
            },
        ));
    }
    let attrs = resolve_attrs(op, &node.attrs).map_err(|(attr, kind)| match attr {
        Some(attr) => problem(Part::Attr { node: index, attr }, kind),
        None => problem(node_part("attrs"), kind),
    })?;
    infer_op(op, args, &attrs).map_err(|(arg, kind)| match arg {
        Some(arg) => problem(Part::Arg { node: index, arg }, kind),
        None => problem(node_part("op"), kind),
    })
}

/// The type of applying `op` to arguments of types `args` with resolved attributes (see
/// [`resolve_attrs`]). The arity must already fit. On failure, says which argument (if any) is
/// at fault.
///
/// The e-graph analysis calls this for every e-node, so a rewrite that builds an ill-typed term
/// is found the moment it is instantiated.
pub fn infer_op(
    op: &OpDef,
    args: &[TensorType],
    attrs: &Attrs,
) -> Result<TensorType, (Option<usize>, ErrorKind)> {
    for (i, arg) in args.iter().enumerate() {
        let operand = op.operand_name(i);
        if let Some(class) = op.spec.accepts.get(operand)
            && !class.admits(arg.dtype)
        {
            return Err((
                Some(i),
                ErrorKind::DType(format!(
                    "operand `{operand}` of `{}` must be {class:?}, got {}",
                    op.name(),
                    arg.dtype
                )),
            ));
        }
    }
    // A scatter adds its updates into a copy of its data, in data's dtype: no rounding of
    // an update to another dtype happens inside it unseen.
    if op.builtin() == Some(Builtin::ScatterAdd)
        && let [data, _, updates] = args
        && updates.dtype != data.dtype
    {
        return Err((
            Some(2),
            ErrorKind::DType(format!(
                "operand `{}` of `{}` must have the dtype of `{}` ({}), got {}",
                op.operand_name(2),
                op.name(),
                op.operand_name(0),
                data.dtype,
                updates.dtype
            )),
        ));
    }
    let dtype = result_dtype(op, args, attrs);
    let shape = result_shape(op, args, attrs)
        .map_err(|msg| (None, ErrorKind::Shape(format!("`{}`: {msg}", op.name()))))?;
    Ok(TensorType { dtype, shape })
}

/// Dtypes of the args bound to the named operand (several for a variadic operand).
fn operand_dtypes<'a>(
    op: &'a OpDef,
    args: &'a [TensorType],
    name: &'a str,
) -> impl Iterator<Item = DType> + 'a {
    args.iter()
        .enumerate()
        .filter(move |(i, _)| op.operand_name(*i) == name)
        .map(|(_, t)| t.dtype)
}

/// Applies the op's dtype rule.
pub fn result_dtype(op: &OpDef, args: &[TensorType], attrs: &Attrs) -> DType {
    let promote = |names: &[String]| {
        names
            .iter()
            .flat_map(|n| operand_dtypes(op, args, n))
            .reduce(DType::promote)
            .unwrap_or(DType::F32)
    };
    match &op.spec.dtype {
        DtypeRule::Promote(names) => promote(names),
        DtypeRule::FloatPromote(names) => match promote(names) {
            d if d.is_float() => d,
            _ => DType::F32,
        },
        DtypeRule::Bool => DType::Bool,
        DtypeRule::FromAttr(name) => match attrs.get(name) {
            Some(AttrValue::DType(d)) => *d,
            _ => DType::F32,
        },
        DtypeRule::SameAs(name) => operand_dtypes(op, args, name).next().unwrap_or(DType::F32),
        DtypeRule::Accumulate(name) => match operand_dtypes(op, args, name).next() {
            // Every narrower integer (and bool) sums in i64, as NumPy sums them.
            Some(d) if d == DType::Bool || d.category() == crate::dtype::Category::Integer => {
                DType::I64
            }
            Some(d) => d,
            None => DType::F32,
        },
    }
}

/// Why a built-in op's attributes do not fit its argument shapes ([`plan_builtin`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// `cast` and `const` are computed by their formulas; they have no plan.
    #[error("`{}` is a pointwise built-in, computed by its formula", .0.name())]
    Pointwise(Builtin),
    #[error(transparent)]
    MissingAttr(#[from] MissingAttr),
    /// A `shape` attribute with a negative entry.
    #[error("`{}` {target:?} has a negative size", BuiltinAttr::Shape.name())]
    NegativeSize { target: Vec<i64> },
    #[error("cannot broadcast {from:?} to {to:?}")]
    Broadcast { from: Shape, to: Shape },
    #[error("cannot sum {from:?} to {to:?}: the target must broadcast to the input")]
    SumToSize { from: Shape, to: Shape },
    #[error(
        "reduce_max of {dtype} over an empty axis of {shape:?} has no value (a float one is -inf; an integer one would need its type's minimum, which fusebox does not give)"
    )]
    EmptyMax { shape: Shape, dtype: DType },
    #[error(
        "gather_elements: indices {indices:?} must have the rank of data {data:?} and no larger size on any axis but {axis}"
    )]
    GatherElements {
        data: Shape,
        indices: Shape,
        axis: usize,
    },
    #[error(
        "scatter_add: updates {updates:?} must have the rank of data {data:?} and no larger size on any axis but {axis}, and indices {indices:?} their shape or size 1 where they do not"
    )]
    ScatterAdd {
        data: Shape,
        indices: Shape,
        updates: Shape,
        axis: usize,
    },
    #[error("the result's size overflows")]
    TooLarge,
    #[error(transparent)]
    Shape(#[from] ShapeError),
}

/// A target shape as sizes; negative entries are an error.
fn sizes(target: &[i64]) -> Result<Shape, PlanError> {
    target
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| PlanError::NegativeSize {
                target: target.to_vec(),
            })
        })
        .collect()
}

/// Everything the reference evaluator and later stages need to apply a built-in op.
#[derive(Debug, Clone, PartialEq)]
pub enum BuiltinPlan {
    BroadcastTo(Shape),
    Reshape(Shape),
    Transpose(Vec<usize>),
    Slice(shape::SliceRange),
    Concat(usize),
    Reduce {
        builtin: Builtin,
        axes: Vec<usize>,
        keepdim: bool,
    },
    SumToSize(Shape),
    MatMul,
    /// gather: the resolved axis of `data`; the indices' axes take its place in the result.
    Gather {
        axis: usize,
    },
    /// gather_elements: the resolved axis, where each result element's index replaces its
    /// own coordinate.
    GatherElements {
        axis: usize,
    },
    /// scatter_add: the resolved axis, along which each update's index replaces its own
    /// coordinate in the result (data's shape).
    ScatterAdd {
        axis: usize,
    },
}

impl BuiltinPlan {
    /// For a reduction of an operand of rank `input_rank` evaluated over a domain of rank
    /// `rank` (at least `input_rank`, the operand right-aligned in it): per domain axis,
    /// whether the reduction sums it away. Axes in front of the operand count as reduced (the
    /// operand is the same along them). `None` for ops that are not reductions.
    pub fn reduced_axes(&self, input_rank: usize, rank: usize) -> Option<Vec<bool>> {
        match self {
            BuiltinPlan::Reduce { axes, .. } => {
                let offset = rank.checked_sub(input_rank)?;
                Some(
                    (0..rank)
                        .map(|d| d < offset || axes.contains(&(d - offset)))
                        .collect(),
                )
            }
            BuiltinPlan::SumToSize(target) => {
                let lead = rank.checked_sub(target.len())?;
                Some(
                    (0..rank)
                        .map(|d| d < lead || target[d - lead] == 1)
                        .collect(),
                )
            }
            _ => None,
        }
    }

    /// The index map a kernel reads this layout op's result through, given the map `x` of its
    /// operand (of shape `x_shape`; the result has shape `out`): strides where they express
    /// the re-indexing, and a floor-division/remainder stage for a reshape they cannot
    /// ([`shape::IndexMap::reshape`]). `None` for ops that are not a re-indexing of one
    /// operand (concat, reductions, matmul).
    pub fn index_map(
        &self,
        x: &shape::IndexMap,
        x_shape: &[usize],
        out: &[usize],
    ) -> Option<shape::IndexMap> {
        match self {
            BuiltinPlan::BroadcastTo(_) => Some(x.broadcast(x_shape, out)),
            BuiltinPlan::Reshape(_) => Some(x.reshape(x_shape, out)),
            BuiltinPlan::Transpose(perm) => Some(x.transpose(perm)),
            BuiltinPlan::Slice(range) => Some(x.slice(range)),
            _ => None,
        }
    }
}

/// Resolves a built-in op's attributes (read through the built-ins' schema,
/// [`BuiltinAttrs`]) against its argument shapes.
pub fn plan_builtin(
    builtin: Builtin,
    shapes: &[&[usize]],
    attrs: &Attrs,
) -> Result<(BuiltinPlan, Shape), PlanError> {
    let x = shapes.first().copied().unwrap_or_default();
    // Refused before reading: a cast's missing `dtype` is not what is wrong.
    if matches!(builtin, Builtin::Cast | Builtin::Const) {
        return Err(PlanError::Pointwise(builtin));
    }
    Ok(match BuiltinAttrs::read(builtin, attrs)? {
        BuiltinAttrs::Shape(target) => match builtin {
            Builtin::BroadcastTo => {
                let target = sizes(&target)?;
                if !shape::broadcasts_to(x, &target) {
                    return Err(PlanError::Broadcast {
                        from: x.to_vec(),
                        to: target,
                    });
                }
                (BuiltinPlan::BroadcastTo(target.clone()), target)
            }
            Builtin::SumToSize => {
                let target = sizes(&target)?;
                if !shape::broadcasts_to(&target, x) {
                    return Err(PlanError::SumToSize {
                        from: x.to_vec(),
                        to: target,
                    });
                }
                (BuiltinPlan::SumToSize(target.clone()), target)
            }
            _ => {
                let out = shape::reshape_target(x, &target)?;
                (BuiltinPlan::Reshape(out.clone()), out)
            }
        },
        BuiltinAttrs::Transpose { perm } => {
            let perm = shape::permutation(perm.as_deref(), x.len())?;
            let out = perm.iter().map(|&p| x[p]).collect();
            (BuiltinPlan::Transpose(perm), out)
        }
        BuiltinAttrs::Slice {
            axis,
            start,
            end,
            step,
        } => {
            let range = shape::slice_range(x, axis, start, end, step)?;
            let mut out = x.to_vec();
            out[range.axis] = range.len;
            (BuiltinPlan::Slice(range), out)
        }
        BuiltinAttrs::Concat { axis } => {
            let (axis, out) = shape::concat_shape(shapes, axis)?;
            (BuiltinPlan::Concat(axis), out)
        }
        BuiltinAttrs::Reduce { axes, keepdim } => {
            let axes = shape::normalize_axes(axes.as_deref(), x.len())?;
            let out = shape::reduced_shape(x, &axes, keepdim);
            (
                BuiltinPlan::Reduce {
                    builtin,
                    axes,
                    keepdim,
                },
                out,
            )
        }
        BuiltinAttrs::MatMul => (BuiltinPlan::MatMul, shape::matmul_shape(x, shapes[1])?),
        BuiltinAttrs::Gather { axis } => {
            let indices = shapes.get(1).copied().unwrap_or_default();
            let axis = shape::normalize_axis(axis, x.len())?;
            if builtin == Builtin::ScatterAdd {
                let updates = shapes.get(2).copied().unwrap_or_default();
                let fits = indices.len() == x.len()
                    && updates.len() == x.len()
                    && (0..x.len()).all(|d| {
                        (indices[d] == updates[d] || indices[d] == 1)
                            && (d == axis || updates[d] <= x[d])
                    });
                if !fits {
                    return Err(PlanError::ScatterAdd {
                        data: x.to_vec(),
                        indices: indices.to_vec(),
                        updates: updates.to_vec(),
                        axis,
                    });
                }
                (BuiltinPlan::ScatterAdd { axis }, x.to_vec())
            } else if builtin == Builtin::GatherElements {
                let fits = indices.len() == x.len()
                    && (0..x.len()).all(|d| d == axis || indices[d] <= x[d]);
                if !fits {
                    return Err(PlanError::GatherElements {
                        data: x.to_vec(),
                        indices: indices.to_vec(),
                        axis,
                    });
                }
                (BuiltinPlan::GatherElements { axis }, indices.to_vec())
            } else {
                let out: Shape = x[..axis]
                    .iter()
                    .chain(indices)
                    .chain(&x[axis + 1..])
                    .copied()
                    .collect();
                out.iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .ok_or(PlanError::TooLarge)?;
                (BuiltinPlan::Gather { axis }, out)
            }
        }
        BuiltinAttrs::Cast { .. } | BuiltinAttrs::Const { .. } => {
            return Err(PlanError::Pointwise(builtin));
        }
    })
}

fn result_shape(op: &OpDef, args: &[TensorType], attrs: &Attrs) -> Result<Shape, PlanError> {
    let shapes: Vec<&[usize]> = args.iter().map(|t| t.shape.as_slice()).collect();
    match &op.semantics {
        Semantics::Formula(_) => Ok(shape::broadcast_all(shapes)?),
        Semantics::Builtin(b) => {
            let (plan, out) = plan_builtin(*b, &shapes, attrs)?;
            // The maximum of nothing is -inf, the identity every backend starts from; an
            // integer maximum starts from i64's minimum, not its own type's.
            if let BuiltinPlan::Reduce {
                builtin: Builtin::ReduceMax,
                axes,
                ..
            } = &plan
                && let Some(x) = args.first()
                && !x.dtype.is_float()
                && axes.iter().any(|&a| x.shape[a] == 0)
                && shape::numel(&out) > 0
            {
                return Err(PlanError::EmptyMax {
                    shape: x.shape.clone(),
                    dtype: x.dtype,
                });
            }
            Ok(out)
        }
    }
}
