//! Gradient templates, loaded from `rules/gradients.ron`: how the gradient of a built-in op
//! (a reduction, a layout op, a matrix product) is built from other catalogue ops.
//!
//! Pointwise ops need no template: their derivative formulas in `ops.ron` become gradient ops
//! ([`OpDef::gradient_op`](super::OpDef::gradient_op)). Everything else is a small graph
//! written here, over the forward op's operands, its result `y` and the incoming gradient `g`,
//! whose attributes are computed from shapes and from *facts* of the forward node (the axes
//! a reduction reduced, a transpose's permutation, a slice's start and step). The engine that
//! applies the templates is [`crate::autodiff`]; it knows no op by name, so a rule author can
//! read, change and extend every structural gradient here, and `fusebox check-rules` checks
//! each one against finite differences on the `checks` instances the file lists.
//!
//! ```
//! use fusebox::rules::{Catalogue, GradientRules};
//!
//! let rules = GradientRules::defaults(&Catalogue::defaults());
//! assert!(rules.for_op("transpose").any(|r| r.operand == "x"));
//! assert_eq!(rules.accumulate(), "add");
//! ```

use super::ron_file::{self, RonDocument};
use super::{Catalogue, OpKind};
use crate::attr::{AttrType, AttrValue, Attrs};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::span::Step;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// The embedded default templates.
pub const DEFAULT_GRADIENTS: &str = include_str!("../../rules/gradients.ron");

/// An attribute value of a template node, computed when the template is applied.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub enum AttrExpr {
    Int(i64),
    Ints(Vec<i64>),
    Float(f64),
    Bool(bool),
    DType(DType),
    /// The shape of a template value (an operand, `y`, `g` or an earlier template node).
    Shape(String),
    /// The rank of a template value.
    Rank(String),
    /// The dtype of a template value.
    DTypeOf(String),
    /// One dimension of a template value's shape.
    Dim(String, Box<AttrExpr>),
    /// A fact of the forward node: what its built-in op resolved its attributes to (see
    /// [`crate::autodiff`] for the list).
    Fact(String),
    Add(Box<AttrExpr>, Box<AttrExpr>),
    Sub(Box<AttrExpr>, Box<AttrExpr>),
    Mul(Box<AttrExpr>, Box<AttrExpr>),
    /// The product of a list of integers (1 for the empty list).
    Prod(Box<AttrExpr>),
    /// The dimensions of a shape at the listed axes.
    Pick(Box<AttrExpr>, Box<AttrExpr>),
    /// The permutation that undoes a permutation.
    InversePerm(Box<AttrExpr>),
    /// A shape with the listed axes set to 1: a reduction's result as `keepdim` leaves it.
    KeepDims(Box<AttrExpr>, Box<AttrExpr>),
    /// A shape with dimension `axis` replaced: `SetDim(shape, axis, size)`.
    SetDim(Box<AttrExpr>, Box<AttrExpr>, Box<AttrExpr>),
    /// A shape with a dimension inserted before `axis`: `InsertDim(shape, axis, size)`.
    InsertDim(Box<AttrExpr>, Box<AttrExpr>, Box<AttrExpr>),
    /// A shape with every dimension but `axis` set to 1: `OnlyDim(shape, axis)` (what
    /// broadcasts one axis's values across the others).
    OnlyDim(Box<AttrExpr>, Box<AttrExpr>),
    /// The permutation of a rank that swaps the last two axes (a matrix transpose).
    SwapLastTwo(Box<AttrExpr>),
    /// An integer as a number (a count that becomes a constant's value).
    ToFloat(Box<AttrExpr>),
}

/// A condition on a template's use, over [`AttrExpr`] values.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub enum Condition {
    Eq(AttrExpr, AttrExpr),
    Ne(AttrExpr, AttrExpr),
    Lt(AttrExpr, AttrExpr),
    Le(AttrExpr, AttrExpr),
    Gt(AttrExpr, AttrExpr),
    Ge(AttrExpr, AttrExpr),
    All(Vec<Condition>),
}

/// What an [`AttrExpr`] reads when it is evaluated: the types of the template's values and the
/// forward node's facts.
pub trait TemplateEnv {
    fn shape(&self, value: &str) -> Option<&[usize]>;
    fn dtype(&self, value: &str) -> Option<DType>;
    fn fact(&self, name: &str) -> Option<AttrValue>;
}

/// One node of a template, as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename = "Node", deny_unknown_fields)]
pub struct TemplateNode {
    pub name: String,
    pub op: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub attrs: BTreeMap<String, AttrExpr>,
}

/// The gradient of one operand of one op: `nodes` computed in order, the last one the result.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename = "Gradient", deny_unknown_fields)]
pub struct GradientRule {
    pub op: String,
    /// The operand differentiated; for a variadic operand the template is applied once per
    /// argument, with the operand's name meaning that argument and the fact `index` its place.
    pub operand: String,
    /// The template applies only where this holds; the first applicable rule for an operand
    /// is used.
    #[serde(default)]
    pub when: Option<Condition>,
    pub nodes: Vec<TemplateNode>,
    #[serde(default)]
    pub doc: String,
}

/// An instance `check-rules` differentiates numerically to check the templates of `op`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename = "Check", deny_unknown_fields)]
pub struct GradientCheck {
    pub op: String,
    /// Operand shapes.
    pub shapes: Vec<Vec<usize>>,
    /// Operand dtypes, f64 where absent: an integer operand (a gather's indices) takes
    /// small random integers, negative ones too.
    #[serde(default)]
    pub dtypes: Vec<DType>,
    /// Attributes, typed as in `ops.ron` defaults (`Ints([1])`, `Int(2)`, `Bool(true)`).
    #[serde(default)]
    pub attrs: Attrs,
}

#[derive(Debug, Deserialize)]
#[serde(rename = "Gradients", deny_unknown_fields)]
struct GradientsSpec {
    accumulate: String,
    rules: Vec<GradientRule>,
    #[serde(default)]
    checks: Vec<GradientCheck>,
}

/// The templates of a `gradients.ron`, validated against a catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct GradientRules {
    accumulate: String,
    rules: Vec<GradientRule>,
    checks: Vec<GradientCheck>,
    /// The file each rule came from, for messages.
    pub file: String,
}

/// The names a template may read besides its own nodes.
const TEMPLATE_INPUTS: [&str; 2] = ["y", "g"];

impl GradientRules {
    /// The embedded `rules/gradients.ron`, checked against `catalogue`.
    pub fn defaults(catalogue: &Catalogue) -> GradientRules {
        GradientRules::load_str(DEFAULT_GRADIENTS, "rules/gradients.ron", catalogue)
            .expect("the embedded rules/gradients.ron is checked by tests")
    }

    /// Parses a `gradients.ron` document; it replaces the default templates as a whole. Every
    /// op must exist and have the operand named; every template node must name a catalogue
    /// op and read only operands, `y`, `g` and earlier nodes; the accumulation op must be a
    /// pointwise op of two operands. Errors point at the offending value.
    pub fn load_str(text: &str, file: &str, catalogue: &Catalogue) -> Result<GradientRules> {
        let doc: RonDocument<GradientsSpec> = ron_file::parse(text, file)?;
        let spec = &doc.value;
        let rule_error =
            |path: &[Step], msg: String| Error::new(doc.site(path), ErrorKind::Rule(msg));
        match catalogue.get(&spec.accumulate) {
            Some(op) if op.kind() == OpKind::Pointwise && op.accepts_arity(2) => {}
            _ => {
                return Err(rule_error(
                    &[Step::field("accumulate")],
                    format!(
                        "`accumulate` must name a pointwise op of two operands that adds gradients, found `{}`",
                        spec.accumulate
                    ),
                ));
            }
        }
        for (index, rule) in spec.rules.iter().enumerate() {
            let at = |field: &str| [Step::field("rules"), Step::Index(index), Step::field(field)];
            let Some(op) = catalogue.get(&rule.op) else {
                return Err(rule_error(
                    &at("op"),
                    format!(
                        "unknown op `{}`{}",
                        rule.op,
                        crate::error::hint(&rule.op, catalogue.names())
                    ),
                ));
            };
            if !op.spec.operands.contains(&rule.operand) {
                return Err(rule_error(
                    &at("operand"),
                    format!(
                        "`{}` has no operand `{}`; its operands are {}",
                        rule.op,
                        rule.operand,
                        op.spec.operands.join(", ")
                    ),
                ));
            }
            if rule.nodes.is_empty() {
                return Err(rule_error(
                    &at("nodes"),
                    "a gradient template needs at least one node; the last is the gradient".into(),
                ));
            }
            let mut known: BTreeSet<&str> = op.spec.operands.iter().map(String::as_str).collect();
            known.extend(TEMPLATE_INPUTS);
            for (n, node) in rule.nodes.iter().enumerate() {
                let node_at = |field: &str| {
                    [
                        Step::field("rules"),
                        Step::Index(index),
                        Step::field("nodes"),
                        Step::Index(n),
                        Step::field(field),
                    ]
                };
                let Some(node_op) = catalogue.get(&node.op) else {
                    return Err(rule_error(
                        &node_at("op"),
                        format!(
                            "unknown op `{}`{}",
                            node.op,
                            crate::error::hint(&node.op, catalogue.names())
                        ),
                    ));
                };
                if !node_op.accepts_arity(node.args.len()) {
                    return Err(rule_error(
                        &node_at("args"),
                        format!(
                            "`{}` takes {} argument(s), got {}",
                            node.op,
                            node_op.arity_text(),
                            node.args.len()
                        ),
                    ));
                }
                for arg in &node.args {
                    if !known.contains(arg.as_str()) {
                        return Err(rule_error(
                            &node_at("args"),
                            format!(
                                "`{arg}` is not an operand of `{}`, `y`, `g` or an earlier node of this template",
                                rule.op
                            ),
                        ));
                    }
                }
                for name in node.attrs.keys() {
                    if node_op.attr(name).is_none() {
                        return Err(rule_error(
                            &node_at("attrs"),
                            format!("`{}` has no attribute `{name}`", node.op),
                        ));
                    }
                }
                if known.contains(node.name.as_str()) {
                    return Err(rule_error(
                        &node_at("name"),
                        format!(
                            "`{}` is already an operand, `y`, `g` or an earlier node",
                            node.name
                        ),
                    ));
                }
                known.insert(&node.name);
            }
        }
        for (index, check) in spec.checks.iter().enumerate() {
            let at = |field: &str| {
                [
                    Step::field("checks"),
                    Step::Index(index),
                    Step::field(field),
                ]
            };
            let Some(op) = catalogue.get(&check.op) else {
                return Err(rule_error(&at("op"), format!("unknown op `{}`", check.op)));
            };
            if !op.accepts_arity(check.shapes.len()) {
                return Err(rule_error(
                    &at("shapes"),
                    format!(
                        "`{}` takes {} operand(s), the check gives {} shape(s)",
                        check.op,
                        op.arity_text(),
                        check.shapes.len()
                    ),
                ));
            }
        }
        Ok(GradientRules {
            accumulate: spec.accumulate.clone(),
            rules: spec.rules.clone(),
            checks: spec.checks.clone(),
            file: file.to_string(),
        })
    }

    /// The op that adds two gradient contributions to one value.
    pub fn accumulate(&self) -> &str {
        &self.accumulate
    }

    /// The templates for `op`, in file order.
    pub fn for_op<'a>(&'a self, op: &'a str) -> impl Iterator<Item = &'a GradientRule> + 'a {
        self.rules.iter().filter(move |r| r.op == op)
    }

    pub fn rules(&self) -> &[GradientRule] {
        &self.rules
    }

    pub fn checks(&self) -> &[GradientCheck] {
        &self.checks
    }
}

/// Why a template's condition or attribute expression has no value for one forward node:
/// what is missing or mistyped, in words a rule author can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("no value `{0}` in this template")]
    NoValue(String),
    #[error("the forward node has no fact `{0}`")]
    NoFact(String),
    #[error("cannot compare {0} with {1}")]
    Incomparable(AttrType, AttrType),
    #[error("expected an integer, found {0}")]
    NotInt(AttrType),
    #[error("expected a list of integers, found {0}")]
    NotInts(AttrType),
    #[error("integer overflow")]
    Overflow,
    #[error("axis {axis} is out of range for rank {rank}")]
    Axis { axis: i64, rank: i64 },
    #[error("{0:?} is not a permutation")]
    NotPermutation(Vec<i64>),
    #[error("cannot swap the last two axes of rank {0}")]
    SwapRank(i64),
}

impl Condition {
    /// Whether the condition holds; an error names a value or fact the environment lacks.
    pub fn holds(&self, env: &dyn TemplateEnv) -> std::result::Result<bool, TemplateError> {
        let compare = |a: &AttrExpr, b: &AttrExpr| -> std::result::Result<_, TemplateError> {
            let (a, b) = (a.eval(env)?, b.eval(env)?);
            match (&a, &b) {
                (AttrValue::Int(x), AttrValue::Int(y)) => Ok(Some(x.cmp(y))),
                _ if a == b => Ok(Some(std::cmp::Ordering::Equal)),
                (AttrValue::Ints(_), AttrValue::Ints(_))
                | (AttrValue::Bool(_), AttrValue::Bool(_))
                | (AttrValue::DType(_), AttrValue::DType(_)) => Ok(None),
                _ => Err(TemplateError::Incomparable(a.ty(), b.ty())),
            }
        };
        use std::cmp::Ordering::*;
        Ok(match self {
            Condition::Eq(a, b) => compare(a, b)? == Some(Equal),
            Condition::Ne(a, b) => compare(a, b)? != Some(Equal),
            Condition::Lt(a, b) => compare(a, b)? == Some(Less),
            Condition::Le(a, b) => matches!(compare(a, b)?, Some(Less | Equal)),
            Condition::Gt(a, b) => compare(a, b)? == Some(Greater),
            Condition::Ge(a, b) => matches!(compare(a, b)?, Some(Greater | Equal)),
            Condition::All(all) => {
                for c in all {
                    if !c.holds(env)? {
                        return Ok(false);
                    }
                }
                true
            }
        })
    }
}

impl AttrExpr {
    /// The value in `env`. Errors say what is missing or mistyped, in words a rule author can
    /// act on.
    pub fn eval(&self, env: &dyn TemplateEnv) -> std::result::Result<AttrValue, TemplateError> {
        let shape = |v: &str| {
            env.shape(v)
                .map(|s| s.iter().map(|&d| d as i64).collect::<Vec<i64>>())
                .ok_or_else(|| TemplateError::NoValue(v.to_string()))
        };
        let int = |e: &AttrExpr| match e.eval(env)? {
            AttrValue::Int(i) => Ok(i),
            other => Err(TemplateError::NotInt(other.ty())),
        };
        let ints = |e: &AttrExpr| match e.eval(env)? {
            AttrValue::Ints(v) => Ok(v),
            other => Err(TemplateError::NotInts(other.ty())),
        };
        let arith = |a: &AttrExpr, b: &AttrExpr, f: fn(i64, i64) -> Option<i64>| {
            f(int(a)?, int(b)?)
                .map(AttrValue::Int)
                .ok_or(TemplateError::Overflow)
        };
        // An axis into a list of `len`: negative counts from the end, as everywhere in fusebox.
        let axis = |e: &AttrExpr, len: usize| -> std::result::Result<usize, TemplateError> {
            let a = int(e)?;
            let len = len as i64;
            let a = if a < 0 { a + len } else { a };
            if (0..len).contains(&a) {
                Ok(a as usize)
            } else {
                Err(TemplateError::Axis { axis: a, rank: len })
            }
        };
        Ok(match self {
            AttrExpr::Int(i) => AttrValue::Int(*i),
            AttrExpr::Ints(v) => AttrValue::Ints(v.clone()),
            AttrExpr::Float(f) => AttrValue::Float(*f),
            AttrExpr::Bool(b) => AttrValue::Bool(*b),
            AttrExpr::DType(d) => AttrValue::DType(*d),
            AttrExpr::Shape(v) => AttrValue::Ints(shape(v)?),
            AttrExpr::Rank(v) => AttrValue::Int(shape(v)?.len() as i64),
            AttrExpr::DTypeOf(v) => AttrValue::DType(
                env.dtype(v)
                    .ok_or_else(|| TemplateError::NoValue(v.to_string()))?,
            ),
            AttrExpr::Dim(v, a) => {
                let s = shape(v)?;
                AttrValue::Int(s[axis(a, s.len())?])
            }
            AttrExpr::Fact(name) => env
                .fact(name)
                .ok_or_else(|| TemplateError::NoFact(name.clone()))?,
            AttrExpr::Add(a, b) => arith(a, b, i64::checked_add)?,
            AttrExpr::Sub(a, b) => arith(a, b, i64::checked_sub)?,
            AttrExpr::Mul(a, b) => arith(a, b, i64::checked_mul)?,
            AttrExpr::Prod(v) => AttrValue::Int(
                ints(v)?
                    .iter()
                    .try_fold(1i64, |p, &d| p.checked_mul(d))
                    .ok_or(TemplateError::Overflow)?,
            ),
            AttrExpr::Pick(s, axes) => {
                let s = ints(s)?;
                let picked = ints(axes)?
                    .iter()
                    .map(|&a| axis(&AttrExpr::Int(a), s.len()).map(|a| s[a]))
                    .collect::<std::result::Result<_, _>>()?;
                AttrValue::Ints(picked)
            }
            AttrExpr::InversePerm(p) => {
                let p = ints(p)?;
                let mut inverse = vec![-1i64; p.len()];
                for (i, &to) in p.iter().enumerate() {
                    let slot = usize::try_from(to)
                        .ok()
                        .and_then(|t| inverse.get_mut(t))
                        .ok_or_else(|| TemplateError::NotPermutation(p.clone()))?;
                    *slot = i as i64;
                }
                if inverse.contains(&-1) {
                    return Err(TemplateError::NotPermutation(p));
                }
                AttrValue::Ints(inverse)
            }
            AttrExpr::KeepDims(s, axes) => {
                let mut s = ints(s)?;
                for a in ints(axes)? {
                    let a = axis(&AttrExpr::Int(a), s.len())?;
                    s[a] = 1;
                }
                AttrValue::Ints(s)
            }
            AttrExpr::SetDim(s, a, size) => {
                let mut s = ints(s)?;
                let a = axis(a, s.len())?;
                s[a] = int(size)?;
                AttrValue::Ints(s)
            }
            AttrExpr::OnlyDim(s, a) => {
                let mut s = ints(s)?;
                let a = axis(a, s.len())?;
                for (d, size) in s.iter_mut().enumerate() {
                    if d != a {
                        *size = 1;
                    }
                }
                AttrValue::Ints(s)
            }
            AttrExpr::InsertDim(s, a, size) => {
                let mut s = ints(s)?;
                let a = axis(a, s.len() + 1)?;
                s.insert(a, int(size)?);
                AttrValue::Ints(s)
            }
            AttrExpr::SwapLastTwo(rank) => {
                let rank = int(rank)?;
                if !(2..=crate::shape::MAX_RANK as i64).contains(&rank) {
                    return Err(TemplateError::SwapRank(rank));
                }
                let mut perm: Vec<i64> = (0..rank).collect();
                perm.swap(rank as usize - 1, rank as usize - 2);
                AttrValue::Ints(perm)
            }
            AttrExpr::ToFloat(e) => AttrValue::Float(int(e)? as f64),
        })
    }
}
