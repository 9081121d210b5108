//! Composite ops: ops declared in `ops.ron` as a small graph over other catalogue ops.
//!
//! A softmax is a reduction, a subtraction, an exponential, another reduction and a division.
//! Declaring it as one pointwise formula is impossible (it reduces), and declaring it as a new
//! built-in would put its meaning in Rust. A composite keeps it in data: its body names
//! catalogue ops (or other composites), and every node using it is replaced by that body before
//! saturation ([`crate::graph::expand`]), so rewrites, fusion and automatic differentiation see
//! the parts and need nothing of their own.
//!
//! ```ron
//! Composite(name: "softmax", operands: ["x"],
//!     attrs: [Attr(name: "axis", ty: Int, default: Int(-1))],
//!     nodes: [
//!         Node(name: "m", op: "reduce_max", args: ["x"], attrs: {"axes": "$axis", "keepdim": true}),
//!         Node(name: "e", op: "exp", args: ["d"]), …
//!     ])
//! ```
//!
//! In a body, an arg names an operand or an earlier node; the last node is the result. An
//! attribute value is written bare, or as `"$attr"` (the composite's attribute; an `Int` fills
//! an `Ints` attribute as a one-element list) or `"$operand.dtype"` (the dtype of the value
//! bound to that operand, so constants follow the precision of what they meet). Everything is
//! checked when the file loads, with its position: the ops exist and take that many args, the
//! attributes exist with those types, every attribute an inner op requires is bound, every node
//! is used, and no composite reaches itself.

use super::ops::{AttrSpec, Catalogue};
use super::ron_file::RonDocument;
use crate::attr::{AttrType, AttrValue, Attrs};
use crate::error::{Error, ErrorKind, Result, suggest};
use crate::span::Step;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// One composite exactly as written in `ops.ron`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename = "Composite", deny_unknown_fields)]
pub struct CompositeSpec {
    pub name: String,
    pub operands: Vec<String>,
    #[serde(default)]
    pub attrs: Vec<AttrSpec>,
    pub nodes: Vec<BodyNodeSpec>,
    #[serde(default)]
    pub doc: String,
}

/// One node of a composite's body as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename = "Node", deny_unknown_fields)]
pub struct BodyNodeSpec {
    pub name: String,
    pub op: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub attrs: BTreeMap<String, ron::Value>,
}

/// Where a body node's argument comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyArg {
    /// The value bound to the composite's operand at this index.
    Operand(usize),
    /// An earlier body node, by index.
    Node(usize),
}

/// A body node's attribute value, resolved when the composite is used.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyAttr {
    /// Written bare in the body.
    Value(AttrValue),
    /// The composite's attribute `name`; `to_list` turns an `Int` into a one-element `Ints`.
    /// Left out when the use binds nothing to an optional attribute without default.
    Attr { name: String, to_list: bool },
    /// The dtype of the value bound to the operand at this index.
    DTypeOf(usize),
}

/// One validated body node.
#[derive(Debug, Clone, PartialEq)]
pub struct BodyNode {
    pub name: String,
    pub op: String,
    pub args: Vec<BodyArg>,
    pub attrs: Vec<(String, BodyAttr)>,
}

/// A validated composite.
#[derive(Debug, Clone, PartialEq)]
pub struct Composite {
    pub spec: CompositeSpec,
    pub body: Vec<BodyNode>,
}

impl Composite {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn attr(&self, name: &str) -> Option<&AttrSpec> {
        self.spec.attrs.iter().find(|a| a.name == name)
    }

    /// The attributes of one use, checked against the declaration, with defaults filled in.
    /// An error names the attribute at fault, if one is.
    pub fn bind_attrs(&self, given: &Attrs) -> Result<Attrs, (Option<String>, ErrorKind)> {
        super::ops::bind_attrs(self.name(), &self.spec.attrs, given)
    }
}

/// What a body node's op declares: its arity and attributes, whether it is an op or a
/// composite.
struct Signature<'a> {
    fixed: usize,
    variadic: bool,
    attrs: &'a [AttrSpec],
}

impl Catalogue {
    fn signature<'a>(
        &'a self,
        name: &str,
        pending: &'a BTreeMap<String, &'a CompositeSpec>,
    ) -> Option<Signature<'a>> {
        if let Some(spec) = pending.get(name) {
            return Some(Signature {
                fixed: spec.operands.len(),
                variadic: false,
                attrs: &spec.attrs,
            });
        }
        if let Some(op) = self.get(name) {
            return Some(Signature {
                fixed: op.spec.operands.len(),
                variadic: op.spec.variadic,
                attrs: &op.spec.attrs,
            });
        }
        self.composite(name).map(|c| Signature {
            fixed: c.spec.operands.len(),
            variadic: false,
            attrs: &c.spec.attrs,
        })
    }
}

/// Where in the rule file one composite is declared: its errors point into it and name it.
struct CompositeSite<'a, T> {
    spec: &'a CompositeSpec,
    doc: &'a RonDocument<T>,
    index: usize,
}

impl<T> CompositeSite<'_, T> {
    /// The site of `steps` inside the composite.
    fn at(&self, steps: &[Step]) -> crate::error::Site {
        let mut path = vec![Step::Index(self.index)];
        path.extend_from_slice(steps);
        let mut site = self.doc.site(&path);
        site.op = Some(self.spec.name.clone());
        site
    }

    /// A rule error at `steps` inside the composite.
    fn fail<V>(&self, steps: &[Step], msg: String) -> Result<V> {
        Err(Error::new(self.at(steps), ErrorKind::Rule(msg)))
    }
}

/// Validates the composite at `index` of the document against `catalogue` (the ops as they
/// will be once the file loads) and the file's other composites (`pending`, by name).
pub(super) fn validate<T>(
    spec: &CompositeSpec,
    catalogue: &Catalogue,
    pending: &BTreeMap<String, &CompositeSpec>,
    doc: &RonDocument<T>,
    index: usize,
) -> Result<Composite> {
    let site = CompositeSite { spec, doc, index };
    check_declarations(&site)?;
    let mut body: Vec<BodyNode> = Vec::with_capacity(spec.nodes.len());
    let mut used = vec![false; spec.nodes.len()];
    for n in 0..spec.nodes.len() {
        let node = body_node(&site, n, catalogue, pending, &body, &mut used)?;
        body.push(node);
    }
    if let Some(n) = used[..used.len() - 1].iter().position(|u| !u) {
        return site.fail(
            &[Step::field("nodes"), Step::Index(n), Step::field("name")],
            format!(
                "node `{}` is never used; only the last node is the composite's result",
                spec.nodes[n].name
            ),
        );
    }
    Ok(Composite {
        spec: spec.clone(),
        body,
    })
}

/// Checks the composite's own declarations: its name, operands and attributes (identifiers,
/// each declared once, defaults of the declared type) and that it has a body.
fn check_declarations<T>(site: &CompositeSite<T>) -> Result<()> {
    let spec = site.spec;
    if !super::ops::is_identifier(&spec.name) {
        return site.fail(
            &[Step::field("name")],
            format!("composite name `{}` must be an identifier", spec.name),
        );
    }
    let mut declared: BTreeSet<&str> = BTreeSet::new();
    for operand in &spec.operands {
        if !super::ops::is_identifier(operand) || !declared.insert(operand) {
            return site.fail(
                &[Step::field("operands")],
                format!("operand `{operand}` must be an identifier declared once"),
            );
        }
    }
    for attr in &spec.attrs {
        if !super::ops::is_identifier(&attr.name) || !declared.insert(&attr.name) {
            return site.fail(
                &[Step::field("attrs")],
                format!(
                    "attribute `{}` must be an identifier used once among operands and attributes",
                    attr.name
                ),
            );
        }
        if let Some(default) = &attr.default
            && default.ty() != attr.ty
        {
            return site.fail(
                &[Step::field("attrs")],
                format!(
                    "default of attribute `{}` must be {}, found {} `{default}`",
                    attr.name,
                    attr.ty,
                    default.ty()
                ),
            );
        }
    }
    if spec.nodes.is_empty() {
        return site.fail(
            &[Step::field("nodes")],
            "a composite needs at least one node; its last node is its result".into(),
        );
    }
    Ok(())
}

/// The path of `field` of body node `n`.
fn node_field(n: usize, field: &str) -> Vec<Step> {
    vec![Step::field("nodes"), Step::Index(n), Step::field(field)]
}

/// Body node `n` checked against the op it applies and the nodes before it (`body`): its
/// name, its op and arity, its arguments (marking the nodes it reads in `used`) and its
/// attributes.
fn body_node<T>(
    site: &CompositeSite<T>,
    n: usize,
    catalogue: &Catalogue,
    pending: &BTreeMap<String, &CompositeSpec>,
    body: &[BodyNode],
    used: &mut [bool],
) -> Result<BodyNode> {
    let spec = site.spec;
    let node = &spec.nodes[n];
    if !super::ops::is_identifier(&node.name)
        || spec.operands.contains(&node.name)
        || body.iter().any(|b| b.name == node.name)
    {
        return site.fail(
            &node_field(n, "name"),
            format!(
                "node name `{}` must be an identifier, distinct from the operands and the other nodes",
                node.name
            ),
        );
    }
    let Some(signature) = catalogue.signature(&node.op, pending) else {
        let names = catalogue
            .names()
            .chain(catalogue.composite_names())
            .chain(pending.keys().map(String::as_str));
        return Err(Error::new(
            site.at(&node_field(n, "op")),
            ErrorKind::UnknownOp {
                op: node.op.clone(),
                suggestion: suggest(&node.op, names),
            },
        ));
    };
    let arity_fits = if signature.variadic {
        node.args.len() >= signature.fixed
    } else {
        node.args.len() == signature.fixed
    };
    if !arity_fits {
        return Err(Error::new(
            site.at(&node_field(n, "args")),
            ErrorKind::Arity {
                op: node.op.clone(),
                expected: if signature.variadic {
                    format!("at least {}", signature.fixed)
                } else {
                    signature.fixed.to_string()
                },
                got: node.args.len(),
            },
        ));
    }
    let args = node_args(site, n, body, used)?;
    let attrs = node_attrs(site, n, &signature)?;
    Ok(BodyNode {
        name: node.name.clone(),
        op: node.op.clone(),
        args,
        attrs,
    })
}

/// The arguments of body node `n`: operands of the composite or earlier nodes (marked in
/// `used`).
fn node_args<T>(
    site: &CompositeSite<T>,
    n: usize,
    body: &[BodyNode],
    used: &mut [bool],
) -> Result<Vec<BodyArg>> {
    let spec = site.spec;
    let node = &spec.nodes[n];
    let mut args = Vec::with_capacity(node.args.len());
    for (a, arg) in node.args.iter().enumerate() {
        if let Some(i) = spec.operands.iter().position(|o| o == arg) {
            args.push(BodyArg::Operand(i));
        } else if let Some(i) = body.iter().position(|b| &b.name == arg) {
            used[i] = true;
            args.push(BodyArg::Node(i));
        } else {
            let mut steps = node_field(n, "args");
            steps.push(Step::Index(a));
            let known = spec
                .operands
                .iter()
                .map(String::as_str)
                .chain(body.iter().map(|b| b.name.as_str()));
            return site.fail(
                &steps,
                format!(
                    "`{arg}` is neither an operand of `{}` nor an earlier node{}",
                    spec.name,
                    crate::error::hint(arg, known)
                ),
            );
        }
    }
    Ok(args)
}

/// The attributes of body node `n`, each checked against the attribute of its op it fills;
/// every attribute the op needs must be bound on every use.
fn node_attrs<T>(
    site: &CompositeSite<T>,
    n: usize,
    signature: &Signature,
) -> Result<Vec<(String, BodyAttr)>> {
    let spec = site.spec;
    let node = &spec.nodes[n];
    let mut attrs = Vec::with_capacity(node.attrs.len());
    for (key, value) in &node.attrs {
        let mut steps = node_field(n, "attrs");
        steps.push(Step::key(key));
        let Some(target) = signature.attrs.iter().find(|a| &a.name == key) else {
            return Err(Error::new(
                site.at(&steps),
                ErrorKind::UnknownAttr {
                    op: node.op.clone(),
                    attr: key.clone(),
                    suggestion: suggest(key, signature.attrs.iter().map(|a| a.name.as_str())),
                },
            ));
        };
        let resolved = body_attr(spec, target, value).map_err(|msg| {
            Error::new(
                site.at(&steps),
                ErrorKind::Rule(format!("node `{}`, attribute `{key}`: {msg}", node.name)),
            )
        })?;
        attrs.push((key.clone(), resolved));
    }
    // An attribute the inner op needs must be bound on every use: a literal, or a
    // composite attribute that always has a value.
    for target in signature.attrs {
        if target.default.is_some() || target.optional {
            continue;
        }
        let always = match attrs.iter().find(|(k, _)| k == &target.name) {
            None => false,
            Some((_, BodyAttr::Attr { name, .. })) => spec
                .attrs
                .iter()
                .any(|a| &a.name == name && (a.default.is_some() || !a.optional)),
            Some(_) => true,
        };
        if !always {
            return site.fail(
                &node_field(n, "attrs"),
                format!(
                    "node `{}`: op `{}` needs attribute `{}`, which is not bound (write a value, or a `$attr` of the composite that is required or has a default)",
                    node.name, node.op, target.name
                ),
            );
        }
    }
    Ok(attrs)
}

/// One attribute value of a body node, checked against the attribute it fills.
/// Why a body node's attribute value does not fill the attribute of its op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum BodyAttrError {
    #[error("must be {expected}, found {found}")]
    Mistyped { expected: String, found: String },
    #[error("`${operand}.dtype` names no operand of `{composite}`")]
    NoOperand { operand: String, composite: String },
    #[error("`{text}` is a dtype, but the attribute is {ty}")]
    DtypeInto { text: String, ty: AttrType },
    #[error("`{text}` names no attribute of `{composite}`{hint}")]
    NoAttr {
        text: String,
        composite: String,
        hint: String,
    },
    #[error("`{text}` is {from}, but the attribute is {to}")]
    Mismatch {
        text: String,
        from: AttrType,
        to: AttrType,
    },
}

fn body_attr(
    spec: &CompositeSpec,
    target: &AttrSpec,
    value: &ron::Value,
) -> std::result::Result<BodyAttr, BodyAttrError> {
    let ron::Value::String(text) = value else {
        return AttrValue::from_bare(value, target.ty)
            .map(BodyAttr::Value)
            .map_err(|m| BodyAttrError::Mistyped {
                expected: m.expected,
                found: m.found,
            });
    };
    let Some(reference) = text.strip_prefix('$') else {
        return AttrValue::from_bare(value, target.ty)
            .map(BodyAttr::Value)
            .map_err(|m| BodyAttrError::Mistyped {
                expected: m.expected,
                found: m.found,
            });
    };
    if let Some(operand) = reference.strip_suffix(".dtype") {
        let Some(i) = spec.operands.iter().position(|o| o == operand) else {
            return Err(BodyAttrError::NoOperand {
                operand: operand.to_string(),
                composite: spec.name.clone(),
            });
        };
        if target.ty != AttrType::DType {
            return Err(BodyAttrError::DtypeInto {
                text: text.clone(),
                ty: target.ty,
            });
        }
        return Ok(BodyAttr::DTypeOf(i));
    }
    let Some(source) = spec.attrs.iter().find(|a| a.name == reference) else {
        let names = spec.attrs.iter().map(|a| a.name.as_str());
        return Err(BodyAttrError::NoAttr {
            text: text.clone(),
            composite: spec.name.clone(),
            hint: crate::error::hint(reference, names),
        });
    };
    let to_list = match (source.ty, target.ty) {
        (a, b) if a == b => false,
        (AttrType::Int, AttrType::Ints) => true,
        (from, to) => {
            return Err(BodyAttrError::Mismatch {
                text: text.clone(),
                from,
                to,
            });
        }
    };
    Ok(BodyAttr::Attr {
        name: reference.to_string(),
        to_list,
    })
}

/// Refuses a composite that reaches itself through the bodies of others: expanding it would
/// never end. The error is at the body node that closes the cycle.
pub(super) fn check_cycles<T>(
    catalogue: &Catalogue,
    file_composites: &[(usize, String)],
    doc: &RonDocument<T>,
) -> Result<()> {
    if !has_cycle(catalogue, file_composites) {
        return Ok(());
    }
    for (index, name) in file_composites {
        // Depth-first from each composite of this file, along the body ops that are
        // composites; reaching the start again is a cycle. Each composite is visited once
        // per start, and its path is kept as a link to the one it was reached from.
        let Some(start) = catalogue.composite(name) else {
            continue;
        };
        let mut from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut stack: Vec<&str> = vec![name.as_str()];
        let mut seen = BTreeSet::new();
        while let Some(current) = stack.pop() {
            let Some(c) = catalogue.composite(current) else {
                continue;
            };
            for node in &c.body {
                if node.op == *name {
                    let trail = trail_to(&from, current);
                    let n = start
                        .body
                        .iter()
                        .position(|b| b.op == trail.get(1).cloned().unwrap_or_default())
                        .or_else(|| start.body.iter().position(|b| b.op == *name))
                        .unwrap_or(0);
                    let mut site = doc.site(&[
                        Step::Index(*index),
                        Step::field("nodes"),
                        Step::Index(n),
                        Step::field("op"),
                    ]);
                    site.op = Some(name.clone());
                    let mut path = trail;
                    path.push(name.clone());
                    return Err(Error::new(
                        site,
                        ErrorKind::Rule(format!(
                            "composite `{name}` uses itself ({}): its expansion would never end",
                            path.join(" → ")
                        )),
                    ));
                }
                if catalogue.composite(&node.op).is_some() && seen.insert(node.op.as_str()) {
                    from.insert(node.op.as_str(), current);
                    stack.push(node.op.as_str());
                }
            }
        }
    }
    Ok(())
}

/// The path from the start of a search to `at`, following `from` (each composite to the one
/// it was reached from).
fn trail_to<'a>(from: &BTreeMap<&'a str, &'a str>, mut at: &'a str) -> Vec<String> {
    let mut trail = vec![at.to_string()];
    while let Some(&before) = from.get(at) {
        trail.push(before.to_string());
        at = before;
    }
    trail.reverse();
    trail
}

/// Whether any composite reachable from this file's composites reaches itself: one
/// depth-first search over them all (time linear in the bodies), so a file of thousands of
/// composites without a cycle — the usual case — is checked at once; only a file with a cycle
/// searches again, per composite, for the message.
fn has_cycle(catalogue: &Catalogue, file_composites: &[(usize, String)]) -> bool {
    // 1: on the current path; 2: done.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    for (_, root) in file_composites {
        if state.contains_key(root.as_str()) {
            continue;
        }
        // (composite, index of the next body node to follow)
        let mut path: Vec<(&str, usize)> = vec![(root.as_str(), 0)];
        state.insert(root.as_str(), 1);
        while let Some((current, next)) = path.pop() {
            let body = catalogue
                .composite(current)
                .map_or(&[][..], |c| &c.body[..]);
            let Some(node) = body.get(next) else {
                state.insert(current, 2);
                continue;
            };
            path.push((current, next + 1));
            if catalogue.composite(&node.op).is_none() {
                continue;
            }
            match state.get(node.op.as_str()) {
                Some(1) => return true,
                Some(_) => {}
                None => {
                    state.insert(node.op.as_str(), 1);
                    path.push((node.op.as_str(), 0));
                }
            }
        }
    }
    false
}

/// The most catalogue ops one use of a composite may expand to. Real composites are a handful
/// of ops (softmax is five, a transformer layer written as composites a few hundred); a body
/// that calls another twice per level doubles with every level, and 41 levels would be 2^41
/// nodes, so the size is counted (multiplied through the calls) when the file loads.
pub const MAX_EXPANDED_OPS: usize = 1 << 16;

/// The deepest composites may nest (a composite using a composite using …). Expansion
/// recurses once per level; the limit keeps a long chain of composites from exhausting the
/// stack, far above any real nesting.
pub const MAX_COMPOSITE_DEPTH: usize = 64;

/// What one use of a composite expands to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expansion {
    /// Catalogue ops, counted with saturating arithmetic (`usize::MAX` means "beyond count").
    pub ops: usize,
    /// Composite levels, 1 for a body of catalogue ops only.
    pub depth: usize,
}

impl Expansion {
    /// Whether this is within [`MAX_EXPANDED_OPS`] and [`MAX_COMPOSITE_DEPTH`].
    pub fn fits(self) -> bool {
        self.ops <= MAX_EXPANDED_OPS && self.depth <= MAX_COMPOSITE_DEPTH
    }

    /// The count for a message: exact, or "more than 2^64" once it saturated.
    fn shown(self) -> String {
        if self.ops == usize::MAX {
            format!("more than {}", usize::MAX)
        } else {
            self.ops.to_string()
        }
    }
}

impl Catalogue {
    /// What one use of composite `name` expands to (one op for a catalogue op), computed
    /// without expanding: each body's sizes summed, through inner composites, memoized in
    /// `memo` (so a body calling another twice per level costs one visit per composite, not
    /// 2^levels). Iterative, so a long chain of composites cannot exhaust the stack; a cycle
    /// (which loading refuses) counts as beyond count.
    pub fn expansion(&self, name: &str, memo: &mut BTreeMap<String, Expansion>) -> Expansion {
        const ONE: Expansion = Expansion { ops: 1, depth: 0 };
        if self.composite(name).is_none() {
            return ONE;
        }
        let mut stack: Vec<(&str, bool)> = vec![(name, false)];
        let mut open: BTreeSet<&str> = BTreeSet::new();
        while let Some((current, children_done)) = stack.pop() {
            if memo.contains_key(current) {
                continue;
            }
            let Some(c) = self.composite(current) else {
                continue;
            };
            if children_done {
                let mut total = Expansion { ops: 0, depth: 1 };
                for node in &c.body {
                    let inner = match self.composite(&node.op) {
                        Some(_) => memo.get(node.op.as_str()).copied().unwrap_or(Expansion {
                            ops: usize::MAX,
                            depth: usize::MAX,
                        }),
                        None => ONE,
                    };
                    total.ops = total.ops.saturating_add(inner.ops);
                    total.depth = total.depth.max(inner.depth.saturating_add(1));
                }
                open.remove(current);
                memo.insert(current.to_string(), total);
                continue;
            }
            if !open.insert(current) {
                continue; // reached again while open: a cycle, left beyond count
            }
            stack.push((current, true));
            for node in &c.body {
                if self.composite(&node.op).is_some() && !memo.contains_key(node.op.as_str()) {
                    stack.push((&node.op, false));
                }
            }
        }
        memo.get(name).copied().unwrap_or(Expansion {
            ops: usize::MAX,
            depth: usize::MAX,
        })
    }

    /// The chain of composites from `name` down its largest (or, if it fits in size, its
    /// deepest) inner composite, for messages: `outer → inner → …`, shortened in the middle
    /// when long. Also returns the index of `name`'s body node the chain goes through.
    pub fn expansion_chain(
        &self,
        name: &str,
        memo: &mut BTreeMap<String, Expansion>,
    ) -> (String, usize) {
        let by_size = self.expansion(name, memo).ops > MAX_EXPANDED_OPS;
        let mut chain = vec![name.to_string()];
        let mut first = 0;
        let mut current = name.to_string();
        while let Some(c) = self.composite(&current).cloned() {
            let weight = |op: &str, memo: &mut BTreeMap<String, Expansion>| {
                let e = self.expansion(op, memo);
                if by_size { e.ops } else { e.depth }
            };
            let mut best: Option<(usize, usize)> = None;
            for (i, node) in c.body.iter().enumerate() {
                if self.composite(&node.op).is_none() {
                    continue;
                }
                let w = weight(&node.op, memo);
                if best.is_none_or(|(_, b)| w > b) {
                    best = Some((i, w));
                }
            }
            let Some((i, _)) = best else { break };
            if chain.len() == 1 {
                first = i;
            }
            current = c.body[i].op.clone();
            chain.push(current.clone());
            if chain.len() > MAX_COMPOSITE_DEPTH + 1 {
                break;
            }
        }
        if chain.len() > 8 {
            let total = chain.len();
            let tail = chain.split_off(total - 3);
            chain.truncate(4);
            chain.push(format!("… ({} more)", total - 7));
            chain.extend(tail);
        }
        (chain.join(" → "), first)
    }
}

/// Refuses a composite of this file whose expansion is beyond [`MAX_EXPANDED_OPS`] ops or
/// [`MAX_COMPOSITE_DEPTH`] levels, at the body node that leads to the bulk of it, naming the
/// chain of composites. Checked when the file loads (after [`check_cycles`]), so `fusebox
/// check` answers at once instead of expanding for ever.
pub(super) fn check_sizes<T>(
    catalogue: &Catalogue,
    file_composites: &[(usize, String)],
    doc: &RonDocument<T>,
) -> Result<()> {
    let mut memo = BTreeMap::new();
    for (index, name) in file_composites {
        let expansion = catalogue.expansion(name, &mut memo);
        if expansion.fits() {
            continue;
        }
        let (chain, node) = catalogue.expansion_chain(name, &mut memo);
        let mut site = doc.site(&[
            Step::Index(*index),
            Step::field("nodes"),
            Step::Index(node),
            Step::field("op"),
        ]);
        site.op = Some(name.clone());
        let msg = if expansion.ops > MAX_EXPANDED_OPS {
            format!(
                "composite `{name}` expands to {} ops ({chain}), more than the limit of {MAX_EXPANDED_OPS}",
                expansion.shown()
            )
        } else {
            format!(
                "composite `{name}` nests {} composites deep ({chain}), more than the limit of {MAX_COMPOSITE_DEPTH}",
                expansion.depth
            )
        };
        return Err(Error::new(site, ErrorKind::Rule(msg)));
    }
    Ok(())
}
