//! The built-in semantics: the closed set of layout, reduction and library ops the engine
//! implements, and the pointwise ops it creates itself (`cast`, `const`).
//!
//! A rule file names one with `builtin: "..."`; the attributes each reads are its schema,
//! written once here, which the op checks, the graph checker, the gradient templates and the
//! ONNX importer all read.

use super::OpKind;
use crate::attr::{AttrType, AttrValue, Attrs};
use crate::dtype::DType;

/// The built-in semantics an op can name with `builtin: "..."`: the engine's layout,
/// reduction and library ops, and the two pointwise ops the engine itself creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Builtin {
    /// Pointwise: rounds its operand to the `dtype` attribute (AMP inserts these).
    Cast,
    /// Pointwise, no operands: the scalar `value` in `dtype` (constant folding adds these).
    Const,
    BroadcastTo,
    Reshape,
    Transpose,
    Slice,
    Concat,
    Sum,
    Mean,
    ReduceMax,
    SumToSize,
    MatMul,
    /// Layout with a run-time index: `data` read along `axis` at the positions an integer
    /// `indices` tensor holds (ONNX `Gather`, an embedding lookup).
    Gather,
    /// Layout with a run-time index of `data`'s own rank: `out[p] = data[p with axis
    /// replaced by indices[p]]` (ONNX `GatherElements`, `torch.gather`).
    GatherElements,
    /// Layout writing at run-time indices, the adjoint of `gather_elements`: `data` with each
    /// element of `updates` added, in order, at its own point with the coordinate along `axis`
    /// replaced by its index (ONNX `ScatterElements` with `reduction="add"`,
    /// `Tensor.scatter_add`). The gradient of an embedding lookup.
    ScatterAdd,
}

impl Builtin {
    pub const ALL: [Builtin; 15] = [
        Builtin::Cast,
        Builtin::Const,
        Builtin::BroadcastTo,
        Builtin::Reshape,
        Builtin::Transpose,
        Builtin::Slice,
        Builtin::Concat,
        Builtin::Sum,
        Builtin::Mean,
        Builtin::ReduceMax,
        Builtin::SumToSize,
        Builtin::MatMul,
        Builtin::Gather,
        Builtin::GatherElements,
        Builtin::ScatterAdd,
    ];

    /// The name a rule file gives with `builtin: "..."` (also the default catalogue's name for
    /// the op).
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Cast => "cast",
            Builtin::Const => "const",
            Builtin::BroadcastTo => "broadcast_to",
            Builtin::Reshape => "reshape",
            Builtin::Transpose => "transpose",
            Builtin::Slice => "slice",
            Builtin::Concat => "concat",
            Builtin::Sum => "sum",
            Builtin::Mean => "mean",
            Builtin::ReduceMax => "reduce_max",
            Builtin::SumToSize => "sum_to_size",
            Builtin::MatMul => "matmul",
            Builtin::Gather => "gather",
            Builtin::GatherElements => "gather_elements",
            Builtin::ScatterAdd => "scatter_add",
        }
    }

    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The kind an op with these semantics must declare.
    pub fn kind(self) -> OpKind {
        match self {
            Builtin::Cast | Builtin::Const => OpKind::Pointwise,
            Builtin::Sum | Builtin::Mean | Builtin::ReduceMax | Builtin::SumToSize => {
                OpKind::Reduction
            }
            Builtin::MatMul => OpKind::Opaque,
            _ => OpKind::Layout,
        }
    }

    /// Whether it reads or writes its operand at run-time indices (gather, gather_elements,
    /// scatter_add): no strides express that, so no kernel reads it as a view, and it runs as
    /// a kernel of its own.
    pub fn reads_at_run_time(self) -> bool {
        matches!(
            self,
            Builtin::Gather | Builtin::GatherElements | Builtin::ScatterAdd
        )
    }

    /// Operand count: `None` for one or more, as for concat.
    pub fn arity(self) -> Option<usize> {
        match self {
            Builtin::Const => Some(0),
            Builtin::Concat => None,
            Builtin::MatMul | Builtin::Gather | Builtin::GatherElements => Some(2),
            Builtin::ScatterAdd => Some(3),
            _ => Some(1),
        }
    }

    /// The attributes the engine reads from this built-in's nodes and writes onto the nodes it
    /// creates: an op declaring the built-in must declare each, with its type.
    pub fn attrs(self) -> &'static [BuiltinAttr] {
        use BuiltinAttr::*;
        match self {
            Builtin::Cast => &[Dtype],
            Builtin::Const => &[Value, Dtype],
            Builtin::BroadcastTo | Builtin::Reshape | Builtin::SumToSize => &[Shape],
            Builtin::Transpose => &[Perm],
            Builtin::Slice => &[Axis, Start, End, Step],
            Builtin::Concat | Builtin::Gather | Builtin::GatherElements | Builtin::ScatterAdd => {
                &[Axis]
            }
            Builtin::Sum | Builtin::Mean | Builtin::ReduceMax => &[Axes, Keepdim],
            Builtin::MatMul => &[],
        }
    }
}

/// One attribute of the built-ins' schema: its name, the only place it is spelled, and its
/// type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinAttr {
    Dtype,
    Value,
    Shape,
    Perm,
    Axis,
    Start,
    End,
    Step,
    Axes,
    Keepdim,
}

impl BuiltinAttr {
    pub fn name(self) -> &'static str {
        match self {
            BuiltinAttr::Dtype => "dtype",
            BuiltinAttr::Value => "value",
            BuiltinAttr::Shape => "shape",
            BuiltinAttr::Perm => "perm",
            BuiltinAttr::Axis => "axis",
            BuiltinAttr::Start => "start",
            BuiltinAttr::End => "end",
            BuiltinAttr::Step => "step",
            BuiltinAttr::Axes => "axes",
            BuiltinAttr::Keepdim => "keepdim",
        }
    }

    pub fn ty(self) -> AttrType {
        match self {
            BuiltinAttr::Dtype => AttrType::DType,
            BuiltinAttr::Value => AttrType::Float,
            BuiltinAttr::Shape | BuiltinAttr::Perm | BuiltinAttr::Axes => AttrType::Ints,
            BuiltinAttr::Axis | BuiltinAttr::Start | BuiltinAttr::End | BuiltinAttr::Step => {
                AttrType::Int
            }
            BuiltinAttr::Keepdim => AttrType::Bool,
        }
    }
}

/// A built-in node without an attribute it cannot do without (no rule-file default filled it
/// in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("missing `{}`", .0.name())]
pub struct MissingAttr(pub BuiltinAttr);

/// A built-in node's attributes, typed: what the graph checker reads from a node (its
/// attributes already bound, rule-file defaults filled in) and what the ONNX importer and the
/// gradient builder write onto the nodes they create. An attribute a node lacks reads as the
/// engine's default: `axis` and `start` 0, `step` 1, `keepdim` false; no `end` is the end of the
/// axis, no `axes` every axis, no `perm` the axes reversed.
#[derive(Debug, Clone, PartialEq)]
pub enum BuiltinAttrs {
    Cast {
        dtype: DType,
    },
    Const {
        value: f64,
        dtype: DType,
    },
    /// broadcast_to, reshape and sum_to_size: the target shape (a reshape's may hold a -1).
    Shape(Vec<i64>),
    Transpose {
        perm: Option<Vec<i64>>,
    },
    Slice {
        axis: i64,
        start: i64,
        end: Option<i64>,
        step: i64,
    },
    Concat {
        axis: i64,
    },
    /// gather, gather_elements and scatter_add: the axis of `data` the indices select along.
    Gather {
        axis: i64,
    },
    Reduce {
        axes: Option<Vec<i64>>,
        keepdim: bool,
    },
    MatMul,
}

impl BuiltinAttrs {
    /// The attributes of a node with built-in semantics `builtin`.
    pub fn read(builtin: Builtin, attrs: &Attrs) -> Result<BuiltinAttrs, MissingAttr> {
        let get = |a: BuiltinAttr| attrs.get(a.name());
        let int = |a: BuiltinAttr| match get(a) {
            Some(AttrValue::Int(v)) => Some(*v),
            _ => None,
        };
        let ints = |a: BuiltinAttr| match get(a) {
            Some(AttrValue::Ints(v)) => Some(v.clone()),
            _ => None,
        };
        let dtype = || match get(BuiltinAttr::Dtype) {
            Some(AttrValue::DType(d)) => Ok(*d),
            _ => Err(MissingAttr(BuiltinAttr::Dtype)),
        };
        Ok(match builtin {
            Builtin::Cast => BuiltinAttrs::Cast { dtype: dtype()? },
            Builtin::Const => BuiltinAttrs::Const {
                value: match get(BuiltinAttr::Value) {
                    Some(AttrValue::Float(v)) => *v,
                    Some(AttrValue::Int(v)) => *v as f64,
                    _ => return Err(MissingAttr(BuiltinAttr::Value)),
                },
                dtype: dtype()?,
            },
            Builtin::BroadcastTo | Builtin::Reshape | Builtin::SumToSize => BuiltinAttrs::Shape(
                ints(BuiltinAttr::Shape).ok_or(MissingAttr(BuiltinAttr::Shape))?,
            ),
            Builtin::Transpose => BuiltinAttrs::Transpose {
                perm: ints(BuiltinAttr::Perm),
            },
            Builtin::Slice => BuiltinAttrs::Slice {
                axis: int(BuiltinAttr::Axis).unwrap_or(0),
                start: int(BuiltinAttr::Start).unwrap_or(0),
                end: int(BuiltinAttr::End),
                step: int(BuiltinAttr::Step).unwrap_or(1),
            },
            Builtin::Concat => BuiltinAttrs::Concat {
                axis: int(BuiltinAttr::Axis).unwrap_or(0),
            },
            Builtin::Sum | Builtin::Mean | Builtin::ReduceMax => BuiltinAttrs::Reduce {
                axes: ints(BuiltinAttr::Axes),
                keepdim: matches!(get(BuiltinAttr::Keepdim), Some(AttrValue::Bool(true))),
            },
            Builtin::MatMul => BuiltinAttrs::MatMul,
            Builtin::Gather | Builtin::GatherElements | Builtin::ScatterAdd => {
                BuiltinAttrs::Gather {
                    axis: int(BuiltinAttr::Axis).unwrap_or(0),
                }
            }
        })
    }

    /// A target shape (broadcast_to, reshape, sum_to_size) from sizes.
    pub fn shape(dims: &[usize]) -> BuiltinAttrs {
        BuiltinAttrs::Shape(dims.iter().map(|&d| d as i64).collect())
    }

    /// The attributes as a node carries them.
    pub fn to_attrs(&self) -> Attrs {
        let mut out = Attrs::new();
        let mut put = |a: BuiltinAttr, v: AttrValue| {
            out.insert(a.name().to_string(), v);
        };
        match self {
            BuiltinAttrs::Cast { dtype } => put(BuiltinAttr::Dtype, AttrValue::DType(*dtype)),
            BuiltinAttrs::Const { value, dtype } => {
                put(BuiltinAttr::Value, AttrValue::Float(*value));
                put(BuiltinAttr::Dtype, AttrValue::DType(*dtype));
            }
            BuiltinAttrs::Shape(dims) => put(BuiltinAttr::Shape, AttrValue::Ints(dims.clone())),
            BuiltinAttrs::Transpose { perm } => {
                if let Some(perm) = perm {
                    put(BuiltinAttr::Perm, AttrValue::Ints(perm.clone()));
                }
            }
            BuiltinAttrs::Slice {
                axis,
                start,
                end,
                step,
            } => {
                put(BuiltinAttr::Axis, AttrValue::Int(*axis));
                put(BuiltinAttr::Start, AttrValue::Int(*start));
                if let Some(end) = end {
                    put(BuiltinAttr::End, AttrValue::Int(*end));
                }
                put(BuiltinAttr::Step, AttrValue::Int(*step));
            }
            BuiltinAttrs::Concat { axis } | BuiltinAttrs::Gather { axis } => {
                put(BuiltinAttr::Axis, AttrValue::Int(*axis))
            }
            BuiltinAttrs::Reduce { axes, keepdim } => {
                if let Some(axes) = axes {
                    put(BuiltinAttr::Axes, AttrValue::Ints(axes.clone()));
                }
                put(BuiltinAttr::Keepdim, AttrValue::Bool(*keepdim));
            }
            BuiltinAttrs::MatMul => {}
        }
        out
    }
}
