//! What a gradient template reads: the types of its values and the forward node's facts.

use crate::attr::{AttrValue, Attrs};
use crate::dtype::DType;
use crate::graph::check::{BuiltinPlan, TypeMap};
use crate::rules::builtin::BuiltinAttr;
use crate::rules::gradients::TemplateEnv;
use std::collections::HashMap;

/// Template value names bound to graph values, with the graph's types.
pub(super) struct Env<'a> {
    bound: &'a HashMap<String, String>,
    types: &'a TypeMap,
    facts: &'a Attrs,
}

impl<'a> Env<'a> {
    pub(super) fn new(
        bound: &'a HashMap<String, String>,
        types: &'a TypeMap,
        facts: &'a Attrs,
    ) -> Env<'a> {
        Env {
            bound,
            types,
            facts,
        }
    }
}

impl TemplateEnv for Env<'_> {
    fn shape(&self, value: &str) -> Option<&[usize]> {
        let name = self.bound.get(value)?;
        self.types.get(name).map(|t| t.shape.as_slice())
    }

    fn dtype(&self, value: &str) -> Option<DType> {
        let name = self.bound.get(value)?;
        self.types.get(name).map(|t| t.dtype)
    }

    fn fact(&self, name: &str) -> Option<AttrValue> {
        self.facts.get(name).cloned()
    }
}

/// The facts of a built-in op's resolved plan, as templates name them (the list is in
/// `rules/gradients.ron`'s header): the resolved attributes under their schema names
/// ([`BuiltinAttr`]), and the facts no attribute holds (`index`, a slice's `len`, a concat
/// operand's `offset`). `index` is the argument being differentiated; `shapes`
/// are the argument shapes.
pub(super) fn facts(plan: Option<&BuiltinPlan>, shapes: &[&[usize]], index: usize) -> Attrs {
    let ints = |v: &[usize]| AttrValue::Ints(v.iter().map(|&d| d as i64).collect());
    let int = |v: usize| AttrValue::Int(v as i64);
    let mut facts = Attrs::new();
    let mut put = |name: &str, value: AttrValue| {
        facts.insert(name.to_string(), value);
    };
    put("index", int(index));
    let name = BuiltinAttr::name;
    match plan {
        Some(BuiltinPlan::BroadcastTo(s) | BuiltinPlan::Reshape(s) | BuiltinPlan::SumToSize(s)) => {
            put(name(BuiltinAttr::Shape), ints(s))
        }
        Some(BuiltinPlan::Transpose(perm)) => put(name(BuiltinAttr::Perm), ints(perm)),
        Some(BuiltinPlan::Slice(range)) => {
            put(name(BuiltinAttr::Axis), int(range.axis));
            put(name(BuiltinAttr::Start), int(range.start));
            put(name(BuiltinAttr::Step), int(range.step));
            put("len", int(range.len));
        }
        Some(BuiltinPlan::Concat(axis)) => {
            put(name(BuiltinAttr::Axis), int(*axis));
            let offset: usize = shapes[..index].iter().map(|s| s[*axis]).sum();
            put("offset", int(offset));
        }
        Some(BuiltinPlan::Reduce { axes, keepdim, .. }) => {
            put(name(BuiltinAttr::Axes), ints(axes));
            put(name(BuiltinAttr::Keepdim), AttrValue::Bool(*keepdim));
        }
        Some(
            BuiltinPlan::Gather { axis }
            | BuiltinPlan::GatherElements { axis }
            | BuiltinPlan::ScatterAdd { axis },
        ) => {
            put(name(BuiltinAttr::Axis), int(*axis));
        }
        Some(BuiltinPlan::MatMul) | None => {}
    }
    facts
}
