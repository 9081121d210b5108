//! What every e-class knows about its value: dtype and shape, or the attribute it holds, and
//! whether every element is one known constant.
//!
//! Types are the soundness net of saturation. Every member of a class denotes the same tensor,
//! so they must agree on dtype and shape; the rewrite applier compares the two sides before it
//! unions them (see [`crate::rewrite`]), and a disagreement that still reaches [`merge`]
//! (through congruence, or two constants proven equal that are not) is recorded in
//! [`TypeAnalysis::conflicts`] and turned into an error by the runner instead of silently
//! producing a wrong graph.
//!
//! [`merge`]: egg::Analysis::merge

use super::language::{ENode, Leaf};
use crate::attr::Attrs;
use crate::graph::TensorType;
use crate::graph::check::infer_op;
use crate::rules::{Builtin, Catalogue, OpDef, Semantics};
use crate::tensor::{Data, Tensor};
use egg::{Analysis, DidMerge, EGraph, Id, Symbol};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The e-graph fusebox saturates.
pub type FuseGraph = EGraph<ENode, TypeAnalysis>;

/// A tensor class's facts.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorData {
    pub ty: TensorType,
    /// `Some(v)`: every element equals `v` (already rounded to the dtype).
    pub constant: Option<Constant>,
    /// What the value is computed from: whether it is the same on every run.
    pub origin: Origin,
}

/// What a value is computed from, as far as it decides where the work runs: constants alone
/// (kernels make it in place), the fixed inputs of [`TypeAnalysis::fixed`] and constants (the
/// model's stored weights: computed once, see [`crate::hoist`]), or something given per run.
/// Ordered from most to least fixed; a class takes the most fixed of its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    Constant,
    Fixed,
    Run,
}

impl Origin {
    /// The origin of an op's result from its operands' (an op without operands is a
    /// constant).
    pub fn of(operands: impl IntoIterator<Item = Origin>) -> Origin {
        operands.into_iter().max().unwrap_or(Origin::Constant)
    }
}

/// A class's uniform value, held as its tensor holds it: an integer class's value is an exact
/// `i64`, so folding `-(2^53 + 1)` gives that integer and not its f64 neighbour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Constant {
    Float(f64),
    Int(i64),
}

impl Constant {
    /// The first element of `t` (a scalar, in practice); `None` when it has none.
    pub fn first_of(t: &Tensor) -> Option<Constant> {
        match &t.data {
            Data::Float(a) => a.iter().next().map(|&v| Constant::Float(v)),
            Data::Int(a) => a.iter().next().map(|&v| Constant::Int(v)),
        }
    }

    /// The value as f64 (an integer beyond 2^53 rounds to nearest): for conditions that
    /// compare a constant with a number.
    pub fn as_f64(self) -> f64 {
        match self {
            Constant::Float(v) => v,
            Constant::Int(v) => v as f64,
        }
    }

    /// The same value, bit for bit (any NaN equals any NaN).
    pub fn same(self, other: Constant) -> bool {
        match (self, other) {
            (Constant::Float(x), Constant::Float(y)) => {
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
            }
            (Constant::Int(x), Constant::Int(y)) => x == y,
            _ => false,
        }
    }

    /// A scalar tensor of `dtype` holding this value.
    pub fn scalar(self, dtype: crate::dtype::DType) -> Tensor {
        match self {
            Constant::Float(v) => Tensor::scalar(dtype, v),
            Constant::Int(v) => {
                Tensor::from_int_array(dtype, ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), v))
            }
        }
    }

    /// The attribute leaf that spells this value in a `const` node.
    pub fn leaf(self) -> Leaf {
        match self {
            Constant::Float(v) => Leaf::num(v),
            Constant::Int(v) => Leaf::int(v),
        }
    }
}

impl std::fmt::Display for Constant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Constant::Float(v) => write!(f, "{v:?}"),
            Constant::Int(v) => write!(f, "{v}"),
        }
    }
}

/// Per-class analysis data.
#[derive(Debug, Clone, PartialEq)]
pub enum ClassData {
    Tensor(TensorData),
    Attr(Leaf),
    /// An ill-typed term, with the reason. Only a rewrite's right-hand side can build one, and
    /// the applier refuses to union it with anything.
    Invalid(IllTyped),
}

/// Why a term is ill-typed: what the analysis (or the rewrite applier, checking a rule's
/// right-hand side before adding it) found wrong with an e-node or its children.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IllTyped {
    #[error("`{0}` is not an input of the graph")]
    NotAnInput(String),
    #[error("unknown op `{0}`")]
    UnknownOp(String),
    /// The children do not split into the op's operands and attributes.
    #[error("`{op}` takes {arity} operand(s) and {attrs} attribute(s), got {children} children")]
    Children {
        op: String,
        arity: String,
        attrs: usize,
        children: usize,
    },
    /// An attribute position holds `found` (a description) rather than a leaf.
    #[error("attribute `{attr}` of `{op}` is {found}")]
    AttrNotALeaf {
        attr: String,
        op: String,
        found: String,
    },
    #[error("`{op}` needs attribute `{attr}`")]
    MissingAttr { op: String, attr: String },
    #[error("attribute `{attr}` of `{op}` must be {ty}, not {leaf}")]
    AttrType {
        attr: String,
        op: String,
        ty: crate::attr::AttrType,
        leaf: Leaf,
    },
    /// An operand position holds `found` (a description) rather than a tensor.
    #[error("an operand of `{op}` is {found}")]
    Operand { op: String, found: String },
    /// Type inference refused the operands.
    #[error("{0}")]
    Infer(crate::error::ErrorKind),
    /// A rule variable the substitution does not bind.
    #[error("`{0}` is not bound")]
    Unbound(String),
    #[error("empty pattern")]
    EmptyPattern,
}

impl ClassData {
    pub fn tensor(&self) -> Option<&TensorData> {
        match self {
            ClassData::Tensor(t) => Some(t),
            _ => None,
        }
    }

    pub fn ty(&self) -> Option<&TensorType> {
        self.tensor().map(|t| &t.ty)
    }

    pub fn leaf(&self) -> Option<&Leaf> {
        match self {
            ClassData::Attr(l) => Some(l),
            _ => None,
        }
    }

    /// A short description for messages: `f32[2, 3]`, `attribute [4096]`, `invalid (…)`.
    pub fn describe(&self) -> String {
        match self {
            ClassData::Tensor(t) => t.ty.to_string(),
            ClassData::Attr(l) => format!("attribute {l}"),
            ClassData::Invalid(why) => format!("an ill-typed term ({why})"),
        }
    }
}

/// Type inference and constant tracking over the catalogue.
#[derive(Debug, Clone)]
pub struct TypeAnalysis {
    pub catalogue: Catalogue,
    pub inputs: HashMap<Symbol, TensorType>,
    /// The inputs whose values are the same on every run (a model's stored weights; see
    /// [`Origin`]). Set before any class is added.
    pub fixed: HashSet<Symbol>,
    /// Classes merged although their data disagree; each entry says what met what.
    pub conflicts: Vec<String>,
    /// Per rewrite rule, how many instances of its right-hand side the checked applier refused
    /// as ill-typed (a shape that does not broadcast, an operand dtype the op rejects, …).
    pub ill_typed: BTreeMap<String, usize>,
}

impl TypeAnalysis {
    /// The origin of input `name`'s value.
    pub fn input_origin(&self, name: Symbol) -> Origin {
        if self.fixed.contains(&name) {
            Origin::Fixed
        } else {
            Origin::Run
        }
    }

    pub fn new(catalogue: Catalogue, inputs: HashMap<Symbol, TensorType>) -> TypeAnalysis {
        TypeAnalysis {
            catalogue,
            inputs,
            fixed: HashSet::new(),
            conflicts: Vec::new(),
            ill_typed: BTreeMap::new(),
        }
    }
}

/// The operand and attribute split of an op e-node's children.
pub fn split_children<'a>(op: &OpDef, children: &'a [Id]) -> Option<(&'a [Id], &'a [Id])> {
    let attrs = op.spec.attrs.len();
    let operands = children.len().checked_sub(attrs)?;
    op.accepts_arity(operands)
        .then(|| children.split_at(operands))
}

/// The resolved attributes of an op e-node, read from its attribute leaves.
pub fn node_attrs(
    op: &OpDef,
    attr_ids: &[Id],
    data: impl Fn(Id) -> ClassData,
) -> Result<Attrs, IllTyped> {
    let leaves = op
        .spec
        .attrs
        .iter()
        .zip(attr_ids)
        .map(|(spec, &id)| match data(id) {
            ClassData::Attr(leaf) => Ok(leaf),
            other => Err(IllTyped::AttrNotALeaf {
                attr: spec.name.clone(),
                op: op.name().to_string(),
                found: other.describe(),
            }),
        });
    attrs_from_leaves(op, leaves)
}

/// The attributes of `op` from one leaf per declared attribute, in order (or the error that
/// stopped reading one): an absent leaf is allowed only where the attribute is optional, and
/// each present one must convert to the attribute's type. Shared by the e-graph analysis and
/// whatever else spells an op's attributes as leaves (a rewrite rule's instantiated side).
pub fn attrs_from_leaves<E: From<IllTyped>>(
    op: &OpDef,
    leaves: impl Iterator<Item = Result<Leaf, E>>,
) -> Result<Attrs, E> {
    let mut attrs = Attrs::new();
    for (spec, leaf) in op.spec.attrs.iter().zip(leaves) {
        let leaf = leaf?;
        if leaf == Leaf::Absent {
            if spec.optional {
                continue;
            }
            return Err(IllTyped::MissingAttr {
                op: op.name().to_string(),
                attr: spec.name.clone(),
            }
            .into());
        }
        let value = leaf.to_attr(spec.ty).ok_or_else(|| IllTyped::AttrType {
            attr: spec.name.clone(),
            op: op.name().to_string(),
            ty: spec.ty,
            leaf: leaf.clone(),
        })?;
        attrs.insert(spec.name.clone(), value);
    }
    Ok(attrs)
}

fn make_op(egraph: &FuseGraph, name: Symbol, children: &[Id]) -> Result<TensorData, IllTyped> {
    op_data(&egraph.analysis.catalogue, name.as_str(), children, |id| {
        egraph[id].data.clone()
    })
}

/// The type and constant of op `name` applied to `children` (operands, then attribute leaves),
/// whose class data `data` gives: exactly what the analysis computes for such an e-node. The
/// rewrite applier calls it on a rule's right-hand side before adding anything, so an
/// ill-typed instance is refused without touching the e-graph (see [`crate::rewrite`]).
pub fn op_data(
    catalogue: &Catalogue,
    name: &str,
    children: &[Id],
    data: impl Fn(Id) -> ClassData,
) -> Result<TensorData, IllTyped> {
    let op = catalogue
        .get(name)
        .ok_or_else(|| IllTyped::UnknownOp(name.to_string()))?;
    let (operand_ids, attr_ids) =
        split_children(op, children).ok_or_else(|| IllTyped::Children {
            op: name.to_string(),
            arity: op.arity_text(),
            attrs: op.spec.attrs.len(),
            children: children.len(),
        })?;
    let attrs = node_attrs(op, attr_ids, &data)?;
    let mut operands = Vec::with_capacity(operand_ids.len());
    for &id in operand_ids {
        match data(id) {
            ClassData::Tensor(t) => operands.push(t),
            other => {
                return Err(IllTyped::Operand {
                    op: name.to_string(),
                    found: other.describe(),
                });
            }
        }
    }
    let types: Vec<TensorType> = operands.iter().map(|t| t.ty.clone()).collect();
    let ty = infer_op(op, &types, &attrs).map_err(|(_, kind)| IllTyped::Infer(kind))?;
    let refs: Vec<&TensorData> = operands.iter().collect();
    let constant = uniform_value(op, &refs, &attrs, &ty);
    let origin = Origin::of(operands.iter().map(|t| t.origin));
    Ok(TensorData {
        ty,
        constant,
        origin,
    })
}

/// The value every element of the result shares, when the operands make that certain.
fn uniform_value(
    op: &OpDef,
    operands: &[&TensorData],
    attrs: &Attrs,
    ty: &TensorType,
) -> Option<Constant> {
    let values: Option<Vec<Constant>> = operands.iter().map(|t| t.constant).collect();
    let values = values?;
    match op.semantics {
        Semantics::Formula(_) => {
            let scalars: Vec<Tensor> = operands
                .iter()
                .zip(&values)
                .map(|(t, &v)| v.scalar(t.ty.dtype))
                .collect();
            let refs: Vec<&Tensor> = scalars.iter().collect();
            let out = TensorType {
                dtype: ty.dtype,
                shape: Vec::new(),
            };
            let result = crate::eval::apply_op(op, &refs, attrs, &out).ok()?;
            Constant::first_of(&result)
        }
        Semantics::Builtin(
            Builtin::BroadcastTo | Builtin::Reshape | Builtin::Transpose | Builtin::Slice,
        ) => values.first().copied(),
        Semantics::Builtin(Builtin::Concat) => {
            // Operands meet at the result dtype first: an i32 and an i64 operand, or an
            // integer and a float one, hold their constants differently.
            let converted: Vec<Constant> = operands
                .iter()
                .zip(&values)
                // A one-element cast: its allocation cannot fail in practice, and if it did the
                // constant is simply not known.
                .map(|(t, v)| Constant::first_of(&v.scalar(t.ty.dtype).cast(ty.dtype).ok()?))
                .collect::<Option<_>>()?;
            let first = converted[0];
            converted.iter().all(|v| v.same(first)).then_some(first)
        }
        Semantics::Builtin(_) => None,
    }
}

impl Analysis<ENode> for TypeAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut FuseGraph, enode: &ENode, _id: Id) -> ClassData {
        match enode {
            ENode::Input(name) => match egraph.analysis.inputs.get(name) {
                Some(ty) => ClassData::Tensor(TensorData {
                    ty: ty.clone(),
                    constant: None,
                    origin: egraph.analysis.input_origin(*name),
                }),
                None => ClassData::Invalid(IllTyped::NotAnInput(name.to_string())),
            },
            ENode::Attr(leaf) => ClassData::Attr(leaf.clone()),
            ENode::Op(name, children) => match make_op(egraph, *name, children) {
                Ok(t) => ClassData::Tensor(t),
                Err(why) => ClassData::Invalid(why),
            },
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        match (&mut *a, b) {
            (ClassData::Tensor(x), ClassData::Tensor(y)) => {
                if x.ty != y.ty {
                    self.conflicts.push(format!(
                        "a {} value was proven equal to a {} value",
                        x.ty, y.ty
                    ));
                    return DidMerge(false, true);
                }
                // Equal values: the class is as fixed as its most fixed member.
                let origin = x.origin.min(y.origin);
                let origin_changed = (origin != x.origin, origin != y.origin);
                x.origin = origin;
                let merged = match (x.constant, y.constant) {
                    (None, Some(v)) => {
                        x.constant = Some(v);
                        DidMerge(true, false)
                    }
                    (Some(_), None) => DidMerge(false, true),
                    (Some(u), Some(v)) if !u.same(v) => {
                        self.conflicts.push(format!(
                            "the constant {u} was proven equal to the constant {v} ({})",
                            x.ty
                        ));
                        DidMerge(false, true)
                    }
                    _ => DidMerge(false, false),
                };
                merged | DidMerge(origin_changed.0, origin_changed.1)
            }
            (ClassData::Attr(x), ClassData::Attr(y)) if *x == y => DidMerge(false, false),
            (x, y) => {
                if x != &y {
                    self.conflicts.push(format!(
                        "{} was proven equal to {}",
                        x.describe(),
                        y.describe()
                    ));
                }
                DidMerge(false, true)
            }
        }
    }

    /// A scalar class with a known value gets a node of the catalogue's `const` built-in, so
    /// later rules and extraction see the folded constant. Without a const op nothing is folded.
    fn modify(egraph: &mut FuseGraph, id: Id) {
        let Some(TensorData {
            ty,
            constant: Some(value),
            ..
        }) = egraph[id].data.tensor().cloned()
        else {
            return;
        };
        if !ty.shape.is_empty() {
            return;
        }
        let catalogue = &egraph.analysis.catalogue;
        let Some(literal) = catalogue.builtin(Builtin::Const).cloned() else {
            return;
        };
        let has_const = egraph[id].nodes.iter().any(|n| {
            n.op_name()
                .and_then(|name| catalogue.get(name))
                .is_some_and(|op| op.builtin() == Some(Builtin::Const))
        });
        if has_const {
            return;
        }
        // The attributes in declaration order: the loader made them exactly `value` and `dtype`.
        let attrs: Vec<Leaf> = literal
            .spec
            .attrs
            .iter()
            .map(|a| match a.ty {
                crate::attr::AttrType::DType => Leaf::DType(ty.dtype),
                _ => value.leaf(),
            })
            .collect();
        let children = attrs
            .into_iter()
            .map(|leaf| egraph.add(ENode::Attr(leaf)))
            .collect();
        let c = egraph.add(ENode::op(literal.name(), children));
        egraph.union(id, c);
    }
}
