//! Checking one op as declared in `ops.ron`: its names, its dtype rule, its formula and
//! derivatives, and for a built-in the signature the engine relies on. A rule file is data a
//! user writes, so every mistake is an error pointing at the field at fault.

use super::{DtypeClass, DtypeRule, OpDef, OpKind, OpSpec, Semantics};
use crate::attr::AttrType;
use crate::error::{Error, ErrorKind, Result};
use crate::formula::{self, Expr};
use crate::rules::builtin::{Builtin, BuiltinAttr};
use crate::rules::ron_file::RonDocument;
use crate::span::Step;
use std::collections::BTreeMap;

/// Names a formula may not use for operands or attributes, because derivatives bind them.
const RESERVED: [&str; 2] = ["y", "g"];

/// Where in the rule file one op is declared: its errors point at one of its fields.
struct OpSite<'a, T> {
    doc: &'a RonDocument<T>,
    path: &'a [Step],
}

impl<T> OpSite<'_, T> {
    /// The path of `field` of the op.
    fn field(&self, field: &str) -> Vec<Step> {
        let mut p = self.path.to_vec();
        p.push(Step::field(field));
        p
    }

    /// A rule error at `field` of the op.
    fn rule_error(&self, field: &str, msg: String) -> Error {
        Error::new(self.doc.site(&self.field(field)), ErrorKind::Rule(msg))
    }
}

pub(super) fn validate<T>(spec: &OpSpec, doc: &RonDocument<T>, path: &[Step]) -> Result<OpDef> {
    let site = OpSite { doc, path };
    let names = check_names(spec, &site)?;
    validate_dtype_rule(spec).map_err(|e| site.rule_error("dtype", e.to_string()))?;
    let (semantics, builtin) = semantics(spec, &names, &site)?;
    let derivatives = derivatives(spec, &names, &site)?;
    Ok(OpDef {
        spec: spec.clone(),
        semantics,
        derivatives,
        builtin,
        gradient_of: None,
    })
}

/// Checks the op's name, operand and attribute names (identifiers, not reserved, distinct),
/// attribute defaults, `variadic` and `accepts`; returns the names a formula may use.
fn check_names<'s, T>(spec: &'s OpSpec, site: &OpSite<T>) -> Result<Vec<&'s str>> {
    if !is_identifier(&spec.name) {
        return Err(site.rule_error(
            "name",
            format!("op name `{}` must be an identifier", spec.name),
        ));
    }
    let mut names: Vec<&str> = Vec::new();
    for operand in &spec.operands {
        if !is_identifier(operand) || RESERVED.contains(&operand.as_str()) {
            return Err(site.rule_error(
                "operands",
                format!("operand name `{operand}` must be an identifier other than y and g"),
            ));
        }
        names.push(operand);
    }
    for attr in &spec.attrs {
        if !is_identifier(&attr.name) || RESERVED.contains(&attr.name.as_str()) {
            return Err(site.rule_error(
                "attrs",
                format!(
                    "attribute name `{}` must be an identifier other than y and g",
                    attr.name
                ),
            ));
        }
        names.push(&attr.name);
        if let Some(default) = &attr.default
            && default.ty() != attr.ty
        {
            return Err(site.rule_error(
                "attrs",
                format!(
                    "default of attribute `{}` must be {}, found {} `{default}`",
                    attr.name,
                    attr.ty,
                    default.ty()
                ),
            ));
        }
    }
    if let Some(dup) = first_duplicate(&names) {
        return Err(site.rule_error(
            "operands",
            format!("`{dup}` is declared twice among operands and attributes"),
        ));
    }
    if spec.variadic && spec.kind == OpKind::Pointwise {
        return Err(site.rule_error(
            "variadic",
            "a pointwise op has a fixed operand list; only built-in ops such as concat are variadic"
                .into(),
        ));
    }
    for operand in spec.accepts.keys() {
        if !spec.operands.contains(operand) {
            return Err(site.rule_error(
                "accepts",
                format!("`accepts` names `{operand}`, which is not an operand"),
            ));
        }
    }
    Ok(names)
}

/// The built-in called `name`, checked against the op's kind and signature.
fn resolve_builtin<T>(spec: &OpSpec, name: &str, site: &OpSite<T>) -> Result<Builtin> {
    let builtin = Builtin::from_name(name).ok_or_else(|| {
        site.rule_error(
            "builtin",
            format!(
                "unknown builtin `{name}`{}; the built-in semantics are {}",
                crate::error::hint(name, Builtin::ALL.map(|b| b.name())),
                Builtin::ALL.map(|b| b.name()).join(", ")
            ),
        )
    })?;
    if builtin.kind() != spec.kind {
        return Err(site.rule_error(
            "kind",
            format!(
                "builtin `{name}` is a {:?} op, not {:?}",
                builtin.kind(),
                spec.kind
            ),
        ));
    }
    check_builtin_signature(spec, builtin)
        .map_err(|e| site.rule_error("builtin", e.to_string()))?;
    Ok(builtin)
}

/// What the op computes: a pointwise op's parsed formula (and the role of a pointwise
/// built-in), or any other op's built-in semantics.
fn semantics<T>(
    spec: &OpSpec,
    names: &[&str],
    site: &OpSite<T>,
) -> Result<(Semantics, Option<Builtin>)> {
    Ok(match (spec.kind, &spec.formula, &spec.builtin) {
        (OpKind::Pointwise, Some(text), name) => {
            let formula_path = site.field("formula");
            let expr = parse_formula(text, site.doc, &formula_path)?;
            check_variables(&expr, names, text, site.doc, &formula_path)?;
            // `cast` and `const` are pointwise built-ins: a formula, and a role the engine
            // finds them by.
            let builtin = name
                .as_deref()
                .map(|name| resolve_builtin(spec, name, site))
                .transpose()?;
            if let Some(b) = builtin {
                check_pointwise_builtin(spec, b, &expr)
                    .map_err(|(field, msg)| site.rule_error(field, msg))?;
            }
            (Semantics::Formula(expr), builtin)
        }
        (OpKind::Pointwise, None, _) => {
            return Err(site.rule_error(
                "kind",
                "a pointwise op needs a `formula` (only cast and const also name a `builtin`)"
                    .into(),
            ));
        }
        (_, Some(_), _) => {
            return Err(site.rule_error(
                "formula",
                format!(
                    "only pointwise ops are defined by formulas; a {:?} op names a `builtin`",
                    spec.kind
                ),
            ));
        }
        (_, None, Some(name)) => {
            let builtin = resolve_builtin(spec, name, site)?;
            (Semantics::Builtin(builtin), Some(builtin))
        }
        (_, None, None) => {
            return Err(site.rule_error(
                "kind",
                "a non-pointwise op needs a `builtin`; new semantics can only be added as pointwise formulas".into(),
            ));
        }
    })
}

/// The op's derivative formulas, parsed, by operand: each for an operand, over the names
/// the formula may use plus `y` and `g`.
fn derivatives<T>(
    spec: &OpSpec,
    names: &[&str],
    site: &OpSite<T>,
) -> Result<BTreeMap<String, Expr>> {
    let mut derivatives = BTreeMap::new();
    for (operand, text) in &spec.derivatives {
        let mut d_path = site.field("derivatives");
        if !spec.operands.contains(operand) {
            return Err(Error::new(
                site.doc.site(&d_path),
                ErrorKind::Rule(format!(
                    "derivative for `{operand}`, which is not an operand"
                )),
            ));
        }
        d_path.push(Step::key(operand));
        let expr = parse_formula(text, site.doc, &d_path)?;
        let mut allowed = names.to_vec();
        allowed.extend(RESERVED);
        check_variables(&expr, &allowed, text, site.doc, &d_path)?;
        derivatives.insert(operand.clone(), expr);
    }
    Ok(derivatives)
}

fn parse_formula<T>(text: &str, doc: &RonDocument<T>, path: &[Step]) -> Result<Expr> {
    formula::parse(text).map_err(|e| {
        Error::new(
            doc.site_in_string(path, e.offset),
            ErrorKind::Formula {
                formula: quoted_formula(text),
                message: e.message,
            },
        )
    })
}

/// A formula as an error message quotes it: whole when short, else its start and its length.
/// The error's line and column point into the formula, so a 40 KB formula need not be
/// repeated in full to be found.
fn quoted_formula(text: &str) -> String {
    const SHOWN: usize = 60;
    if text.chars().count() <= 2 * SHOWN {
        return text.to_string();
    }
    let head: String = text.chars().take(SHOWN).collect();
    format!("{head}… ({} characters)", text.chars().count())
}

fn check_variables<T>(
    expr: &Expr,
    allowed: &[&str],
    text: &str,
    doc: &RonDocument<T>,
    path: &[Step],
) -> Result<()> {
    for var in expr.variables() {
        if !allowed.contains(&var.as_str()) {
            let offset = find_identifier(text, &var).unwrap_or(0);
            let hint = crate::error::hint(&var, allowed.iter().copied());
            return Err(Error::new(
                doc.site_in_string(path, offset),
                ErrorKind::Formula {
                    formula: quoted_formula(text),
                    message: format!(
                        "unknown name `{var}`{hint}; a formula may use {}",
                        allowed.join(", ")
                    ),
                },
            ));
        }
    }
    Ok(())
}

/// A dtype rule or built-in signature that does not fit the op's declarations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum SignatureError {
    #[error("dtype rule names `{0}`, which is not an operand")]
    NotAnOperand(String),
    #[error("a promotion rule needs at least one operand")]
    EmptyPromotion,
    #[error("dtype rule reads attribute `{0}`, which must be declared with ty: DType")]
    NoDtypeAttr(String),
    #[error("builtin `{builtin}` takes exactly {arity} operand(s)")]
    Arity { builtin: &'static str, arity: usize },
    #[error("builtin `{0}` takes one variadic operand")]
    Variadic(&'static str),
    #[error("builtin `{builtin}` reads attribute `{attr}` of type {ty:?}; declare it")]
    Attr {
        builtin: &'static str,
        attr: &'static str,
        ty: AttrType,
    },
}

fn validate_dtype_rule(spec: &OpSpec) -> std::result::Result<(), SignatureError> {
    let operand = |name: &String| {
        if spec.operands.contains(name) {
            Ok(())
        } else {
            Err(SignatureError::NotAnOperand(name.clone()))
        }
    };
    match &spec.dtype {
        DtypeRule::Promote(names) | DtypeRule::FloatPromote(names) => {
            if names.is_empty() {
                return Err(SignatureError::EmptyPromotion);
            }
            names.iter().try_for_each(operand)
        }
        DtypeRule::SameAs(name) | DtypeRule::Accumulate(name) => operand(name),
        DtypeRule::FromAttr(name) => match spec.attrs.iter().find(|a| &a.name == name) {
            Some(a) if a.ty == AttrType::DType => Ok(()),
            _ => Err(SignatureError::NoDtypeAttr(name.clone())),
        },
        DtypeRule::Bool => Ok(()),
    }
}

fn check_builtin_signature(
    spec: &OpSpec,
    builtin: Builtin,
) -> std::result::Result<(), SignatureError> {
    match builtin.arity() {
        Some(n) if spec.variadic || spec.operands.len() != n => {
            return Err(SignatureError::Arity {
                builtin: builtin.name(),
                arity: n,
            });
        }
        None if !spec.variadic || spec.operands.len() != 1 => {
            return Err(SignatureError::Variadic(builtin.name()));
        }
        _ => {}
    }
    for attr in builtin.attrs() {
        match spec.attrs.iter().find(|a| a.name == attr.name()) {
            Some(a) if a.ty == attr.ty() => {}
            _ => {
                return Err(SignatureError::Attr {
                    builtin: builtin.name(),
                    attr: attr.name(),
                    ty: attr.ty(),
                });
            }
        }
    }
    Ok(())
}

/// What the engine relies on when it creates a pointwise built-in's nodes itself: the value
/// is exactly the built-in's (the operand for a cast, the `value` attribute for a literal), the
/// result dtype is the `dtype` attribute, the attributes are exactly the built-in's, and a cast
/// takes every dtype (it also copies integer and bool outputs).
/// An error names the field it is about.
fn check_pointwise_builtin(
    spec: &OpSpec,
    builtin: Builtin,
    formula: &Expr,
) -> Result<(), (&'static str, String)> {
    let (value, what) = match builtin {
        Builtin::Cast => (spec.operands[0].as_str(), "its operand"),
        _ => (BuiltinAttr::Value.name(), "its `value` attribute"),
    };
    if *formula != Expr::Var(value.to_string()) {
        return Err((
            "formula",
            format!(
                "the formula of builtin `{}` is {what}: write `formula: \"{value}\"`",
                builtin.name()
            ),
        ));
    }
    if spec.dtype != DtypeRule::FromAttr(BuiltinAttr::Dtype.name().into()) {
        return Err((
            "dtype",
            format!(
                "builtin `{}` produces its `dtype` attribute: write `dtype: FromAttr(\"dtype\")`",
                builtin.name()
            ),
        ));
    }
    let attrs = builtin.attrs();
    if let Some(extra) = spec
        .attrs
        .iter()
        .find(|a| attrs.iter().all(|n| n.name() != a.name))
    {
        let names: Vec<String> = attrs.iter().map(|n| format!("`{}`", n.name())).collect();
        return Err((
            "attrs",
            format!(
                "builtin `{}` takes only the attributes {}; the engine creates its nodes and cannot fill `{}`",
                builtin.name(),
                names.join(" and "),
                extra.name
            ),
        ));
    }
    if builtin == Builtin::Cast
        && let Some(class) = spec.accepts.values().find(|c| **c != DtypeClass::Any)
    {
        return Err((
            "accepts",
            format!(
                "builtin `cast` converts every dtype (output copies cast integers and bools too): drop `accepts: {{.. {class:?}}}`"
            ),
        ));
    }
    Ok(())
}

pub(in crate::rules) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn first_duplicate<'a>(names: &[&'a str]) -> Option<&'a str> {
    let mut seen = std::collections::BTreeSet::new();
    names.iter().copied().find(|n| !seen.insert(*n))
}

/// Char offset of the first whole-word occurrence of `name` in `text`.
fn find_identifier(text: &str, name: &str) -> Option<usize> {
    let chars: Vec<char> = text.chars().collect();
    let target: Vec<char> = name.chars().collect();
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    (0..chars.len()).find(|&i| {
        chars[i..].starts_with(&target)
            && (i == 0 || !is_word(chars[i - 1]))
            && chars.get(i + target.len()).is_none_or(|c| !is_word(*c))
    })
}
