//! Rule patterns: s-expressions over the e-graph language, checked against the op catalogue.
//!
//! egg parses patterns too, but its errors carry no position and it accepts anything shaped
//! like an s-expression. A rule file is written by hand, so fusebox reads patterns itself:
//! every atom keeps its character offset (an error points at the character inside the RON
//! string), every op is looked up in the catalogue, every op gets exactly its operands followed
//! by one child per declared attribute, a literal in an attribute position must fit the
//! attribute's type, and every variable is either a tensor or an attribute of one type.

use super::VarKind;
use crate::attr::AttrType;
use crate::dtype::DType;
use crate::egraph::{ENode, Leaf};
use crate::rules::ops::AttrSpec;
use crate::rules::{Catalogue, OpDef};
use egg::{ENodeOrVar, Id, PatternAst, Symbol, Var};
use std::collections::BTreeMap;

/// Nesting deeper than this is refused, so that neither parsing nor checking can exhaust the
/// stack on hostile input. Real rules nest a handful of levels.
const MAX_DEPTH: usize = 64;

/// A problem inside a pattern string: the char offset it concerns and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub offset: usize,
    pub message: String,
    /// Set for an op name the catalogue does not have (so the caller can report it as
    /// [`crate::ErrorKind::UnknownOp`] with the suggestion).
    pub unknown_op: Option<(String, Option<String>)>,
}

impl PatternError {
    fn new(offset: usize, message: impl Into<String>) -> PatternError {
        PatternError {
            offset,
            message: message.into(),
            unknown_op: None,
        }
    }
}

/// An s-expression with the char offset where each part starts.
#[derive(Debug, Clone, PartialEq)]
enum Sexp {
    Atom { text: String, at: usize },
    List { items: Vec<Sexp>, at: usize },
}

impl Sexp {
    fn at(&self) -> usize {
        match self {
            Sexp::Atom { at, .. } | Sexp::List { at, .. } => *at,
        }
    }
}

/// Splits `text` into one s-expression. Atoms run to the next space or parenthesis; an atom
/// that starts with `[` runs to its `]`, so integer lists may contain spaces (`[1, 2]`).
fn parse_sexp(text: &str) -> Result<Sexp, PatternError> {
    let chars: Vec<char> = text.chars().collect();
    // Open lists: their items so far and where their `(` is.
    let mut stack: Vec<(Vec<Sexp>, usize)> = Vec::new();
    let mut done: Option<Sexp> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let item = match c {
            '(' => {
                if stack.len() >= MAX_DEPTH {
                    return Err(PatternError::new(
                        i,
                        format!("pattern nested deeper than {MAX_DEPTH} levels"),
                    ));
                }
                stack.push((Vec::new(), i));
                i += 1;
                continue;
            }
            ')' => {
                let Some((items, at)) = stack.pop() else {
                    return Err(PatternError::new(i, "unexpected `)`: nothing to close"));
                };
                if items.is_empty() {
                    return Err(PatternError::new(
                        at,
                        "empty list `()`: write an op name after `(`",
                    ));
                }
                i += 1;
                Sexp::List { items, at }
            }
            '[' => {
                let Some(len) = chars[i..].iter().position(|&c| c == ']') else {
                    return Err(PatternError::new(i, "this `[` is never closed with `]`"));
                };
                i += len + 1;
                Sexp::Atom {
                    text: chars[start..i].iter().collect(),
                    at: start,
                }
            }
            _ => {
                while i < chars.len() && !chars[i].is_whitespace() && !matches!(chars[i], '(' | ')')
                {
                    i += 1;
                }
                Sexp::Atom {
                    text: chars[start..i].iter().collect(),
                    at: start,
                }
            }
        };
        match stack.last_mut() {
            Some((items, _)) => items.push(item),
            None if done.is_some() => {
                return Err(PatternError::new(
                    start,
                    "unexpected text after the pattern: a pattern is one expression",
                ));
            }
            None => done = Some(item),
        }
    }
    if let Some((_, at)) = stack.last() {
        return Err(PatternError::new(*at, "this `(` is never closed"));
    }
    done.ok_or_else(|| PatternError::new(0, "empty pattern"))
}

/// Where a variable is used, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarUse {
    pub kind: VarKind,
    /// Char offset of its first use.
    pub offset: usize,
    /// "operand `a` of `mul`", "attribute `dtype` of `cast`", "the whole pattern".
    pub role: String,
}

/// A checked pattern.
#[derive(Debug, Clone)]
pub struct Checked {
    pub ast: PatternAst<ENode>,
    pub vars: BTreeMap<Var, VarUse>,
    /// Whether the whole pattern is one variable.
    pub bare_var: bool,
}

/// What a position of a pattern must hold.
enum Slot<'a> {
    Tensor(String),
    Attr { op: &'a OpDef, spec: &'a AttrSpec },
}

impl Slot<'_> {
    fn role(&self) -> String {
        match self {
            Slot::Tensor(role) => role.clone(),
            Slot::Attr { op, spec } => format!("attribute `{}` of `{}`", spec.name, op.name()),
        }
    }
}

/// The kind a variable of this kind is called in messages.
pub fn describe_kind(kind: VarKind) -> String {
    match kind {
        VarKind::Tensor => "a tensor".into(),
        VarKind::Attr(ty) => format!("an attribute ({ty})"),
    }
}

/// `cast takes (x, dtype)`: the children an op node must have, in order.
pub fn signature(op: &OpDef) -> String {
    let mut parts: Vec<String> = op.spec.operands.clone();
    if op.spec.variadic
        && let Some(last) = parts.last_mut()
    {
        last.push_str("...");
    }
    parts.extend(op.spec.attrs.iter().map(|a| a.name.clone()));
    format!("`{}` takes ({})", op.name(), parts.join(", "))
}

struct Builder<'a> {
    catalogue: &'a Catalogue,
    ast: PatternAst<ENode>,
    vars: BTreeMap<Var, VarUse>,
}

/// Parses and checks one pattern against `catalogue`.
pub fn check(text: &str, catalogue: &Catalogue) -> Result<Checked, PatternError> {
    let sexp = parse_sexp(text)?;
    let mut builder = Builder {
        catalogue,
        ast: PatternAst::default(),
        vars: BTreeMap::new(),
    };
    let bare_var = matches!(&sexp, Sexp::Atom { text, .. } if text.starts_with('?'));
    builder.build(&sexp, &Slot::Tensor("the whole pattern".into()), 0)?;
    Ok(Checked {
        ast: builder.ast,
        vars: builder.vars,
        bare_var,
    })
}

fn parse_var(text: &str, at: usize) -> Result<Var, PatternError> {
    let name = &text[1..];
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(PatternError::new(
            at,
            format!("`{text}` is not a variable: write `?` then letters, digits or `_` (`?x`)"),
        ));
    }
    text.parse()
        .map_err(|_| PatternError::new(at, format!("`{text}` is not a variable")))
}

impl<'a> Builder<'a> {
    fn build(&mut self, sexp: &Sexp, slot: &Slot<'a>, depth: usize) -> Result<Id, PatternError> {
        if depth > MAX_DEPTH {
            return Err(PatternError::new(sexp.at(), "pattern nested too deeply"));
        }
        match (sexp, slot) {
            (Sexp::Atom { text, at }, _) if text.starts_with('?') => {
                let var = parse_var(text, *at)?;
                let kind = match slot {
                    Slot::Tensor(_) => VarKind::Tensor,
                    Slot::Attr { spec, .. } => VarKind::Attr(spec.ty),
                };
                self.use_var(var, kind, *at, slot.role())?;
                Ok(self.ast.add(ENodeOrVar::Var(var)))
            }
            (Sexp::Atom { text, at }, Slot::Tensor(role)) => Err(PatternError::new(
                *at,
                tensor_atom_message(text, role, self.catalogue),
            )),
            (Sexp::Atom { text, at }, Slot::Attr { op, spec }) => {
                let leaf = attr_leaf(text, op, spec, *at)?;
                Ok(self.ast.add(ENodeOrVar::ENode(ENode::Attr(leaf))))
            }
            (Sexp::List { at, .. }, Slot::Attr { op, spec }) => Err(PatternError::new(
                *at,
                format!(
                    "attribute `{}` of `{}` must be {}, not an expression: attributes are values \
                     or variables",
                    spec.name,
                    op.name(),
                    spec.ty
                ),
            )),
            (Sexp::List { items, .. }, Slot::Tensor(_)) => self.build_op(items, depth),
        }
    }

    fn build_op(&mut self, items: &[Sexp], depth: usize) -> Result<Id, PatternError> {
        let (head, args) = items.split_first().expect("the parser refuses `()`");
        let (name, name_at) = match head {
            Sexp::List { at, .. } => {
                return Err(PatternError::new(
                    *at,
                    "an op name must follow `(`, not a parenthesized expression",
                ));
            }
            Sexp::Atom { text, at } => (text, *at),
        };
        if name.starts_with('?') {
            return Err(PatternError::new(
                name_at,
                format!(
                    "`{name}` cannot be applied: a variable stands for a whole term, so it \
                     cannot head `(...)`"
                ),
            ));
        }
        let catalogue = self.catalogue;
        let Some(op) = catalogue.get(name) else {
            let suggestion = crate::error::suggest(name, catalogue.names());
            return Err(PatternError {
                offset: name_at,
                message: format!(
                    "unknown op `{name}`{}",
                    crate::error::hint(name, catalogue.names())
                ),
                unknown_op: Some((name.clone(), suggestion)),
            });
        };
        let attrs = op.spec.attrs.len();
        let operands = args.len().checked_sub(attrs);
        if !operands.is_some_and(|n| op.accepts_arity(n)) {
            return Err(PatternError::new(
                name_at,
                format!(
                    "{}, got {} {}: every attribute is written out, in order, after the operands",
                    signature(op),
                    args.len(),
                    if args.len() == 1 { "child" } else { "children" }
                ),
            ));
        }
        let operands = operands.unwrap_or(0);
        let mut children = Vec::with_capacity(args.len());
        for (i, arg) in args.iter().enumerate() {
            let slot = if i < operands {
                Slot::Tensor(format!(
                    "operand `{}` of `{}`",
                    op.operand_name(i),
                    op.name()
                ))
            } else {
                Slot::Attr {
                    op,
                    spec: &op.spec.attrs[i - operands],
                }
            };
            children.push(self.build(arg, &slot, depth + 1)?);
        }
        Ok(self
            .ast
            .add(ENodeOrVar::ENode(ENode::Op(Symbol::from(name), children))))
    }

    fn use_var(
        &mut self,
        var: Var,
        kind: VarKind,
        at: usize,
        role: String,
    ) -> Result<(), PatternError> {
        match self.vars.get(&var) {
            None => {
                self.vars.insert(
                    var,
                    VarUse {
                        kind,
                        offset: at,
                        role,
                    },
                );
                Ok(())
            }
            Some(first) if first.kind == kind => Ok(()),
            Some(first) => Err(PatternError::new(
                at,
                format!(
                    "`{var}` is {} here ({role}) but {} at its first use ({}); a variable is \
                     one or the other",
                    describe_kind(kind),
                    describe_kind(first.kind),
                    first.role
                ),
            )),
        }
    }
}

fn tensor_atom_message(text: &str, role: &str, catalogue: &Catalogue) -> String {
    if let Some(name) = text.strip_prefix('$') {
        return format!(
            "rules cannot name graph inputs (`{text}`): write a pattern variable such as `?{name}`"
        );
    }
    if Leaf::parse(text).is_some() {
        return format!(
            "{role} is a tensor, but `{text}` is an attribute value: write a constant as \
             `(const {text} f32)`"
        );
    }
    if let Some(op) = catalogue.get(text) {
        return format!("`{text}` is an op: write it applied, {}", signature(op));
    }
    format!(
        "`{text}` is not a variable, an op or a value; pattern variables start with `?` (`?{text}`)"
    )
}

/// The leaf a literal (at `at`) in an attribute position stands for, if it fits the
/// attribute's type.
fn attr_leaf(text: &str, op: &OpDef, spec: &AttrSpec, at: usize) -> Result<Leaf, PatternError> {
    let what = format!("attribute `{}` of `{}`", spec.name, op.name());
    let Some(leaf) = Leaf::parse(text) else {
        let hint = if spec.ty == AttrType::DType {
            crate::error::hint(text, DType::ALL.iter().map(|d| d.name()))
        } else {
            String::new()
        };
        return Err(PatternError::new(
            at,
            format!(
                "`{text}` is not a value for {what}, which must be {}{hint}",
                spec.ty
            ),
        ));
    };
    if leaf == Leaf::Absent {
        return if spec.optional {
            Ok(leaf)
        } else {
            Err(PatternError::new(
                at,
                format!(
                    "{what} is never left out, so `none` cannot match: write a value or a variable"
                ),
            ))
        };
    }
    match leaf.to_attr(spec.ty) {
        Some(_) => Ok(leaf),
        None => Err(PatternError::new(
            at,
            format!("{what} must be {}, not `{text}`", spec.ty),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> PatternError {
        check(text, &Catalogue::defaults()).expect_err(text)
    }

    #[test]
    fn sexp_offsets_and_structure() {
        let s = parse_sexp(" (add ?a [1, 2])").unwrap();
        let Sexp::List { items, at } = s else {
            panic!("a list")
        };
        assert_eq!(at, 1);
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[2],
            Sexp::Atom {
                text: "[1, 2]".into(),
                at: 9
            }
        );
    }

    #[test]
    fn syntax_errors_point_at_the_character() {
        assert_eq!(err("(add ?a ?b").offset, 0);
        assert!(err("(add ?a ?b").message.contains("never closed"));
        assert_eq!(err("(add ?a ?b))").offset, 11);
        assert_eq!(err("(neg ?a) ?b").offset, 9);
        assert_eq!(err("(neg ())").offset, 5);
        assert_eq!(err("").offset, 0);
        assert_eq!(err("((neg ?a) ?b)").offset, 1);
        assert_eq!(err("(sum ?x [0 false)").offset, 8);
    }

    #[test]
    fn op_and_child_errors() {
        let e = err("(mull ?a ?b)");
        assert_eq!(e.offset, 1);
        assert_eq!(e.unknown_op, Some(("mull".into(), Some("mul".into()))));
        let e = err("(neg (cast ?x))");
        assert_eq!(e.offset, 6);
        assert_eq!(
            e.message,
            "`cast` takes (x, dtype), got 1 child: every attribute is written out, in order, \
             after the operands"
        );
        assert!(
            err("(concat ?a)")
                .message
                .starts_with("`concat` takes (xs..., axis)")
        );
        assert!(err("(?f ?a)").message.contains("cannot be applied"));
    }

    #[test]
    fn leaves_must_fit_their_slot() {
        let e = err("(cast ?x 1)");
        assert_eq!(e.offset, 9);
        assert_eq!(
            e.message,
            "attribute `dtype` of `cast` must be a dtype name, not `1`"
        );
        let e = err("(cast ?x float16)");
        assert!(e.message.contains("is not a value"), "{}", e.message);
        let e = err("(slice ?x 0.5 0 none 1)");
        assert_eq!(e.offset, 10);
        assert!(e.message.contains("an integer"));
        let e = err("(cast ?x none)");
        assert!(e.message.contains("never left out"));
        let e = err("(mul ?x 1)");
        assert_eq!(e.offset, 8);
        assert!(e.message.contains("(const 1 f32)"), "{}", e.message);
        assert!(err("(neg $x)").message.contains("graph inputs"));
        assert!(err("(neg x)").message.contains("start with `?`"));
        let e = err("(cast ?x (neg ?y))");
        assert_eq!(e.offset, 9);
        // `none` is fine where the attribute is optional.
        assert!(check("(sum ?x none false)", &Catalogue::defaults()).is_ok());
    }

    #[test]
    fn a_variable_is_a_tensor_or_an_attribute_of_one_type() {
        let e = err("(mul (cast ?x ?t) ?t)");
        assert_eq!(e.offset, 18);
        assert!(e.message.contains("`?t` is a tensor here"), "{}", e.message);
        let e = err("(add (const ?v ?t) (cast ?x ?v))");
        assert_eq!(e.offset, 28);
        let ok = check("(cast (neg ?x) ?t)", &Catalogue::defaults()).unwrap();
        let kinds: BTreeMap<String, VarKind> = ok
            .vars
            .iter()
            .map(|(v, u)| (v.to_string(), u.kind))
            .collect();
        assert_eq!(
            kinds,
            BTreeMap::from([
                ("?t".to_string(), VarKind::Attr(AttrType::DType)),
                ("?x".to_string(), VarKind::Tensor)
            ])
        );
        assert!(!ok.bare_var);
        assert!(check("?x", &Catalogue::defaults()).unwrap().bare_var);
        assert!(err("(neg ?)").message.contains("not a variable"));
    }

    #[test]
    fn built_patterns_print_as_egg_patterns() {
        let c = check("(sum (concat ?a ?b 1) [0] false)", &Catalogue::defaults()).unwrap();
        assert_eq!(c.ast.to_string(), "(sum (concat ?a ?b 1) [0] false)");
        let c = check("(add ?x (const -0.0 ?t))", &Catalogue::defaults()).unwrap();
        assert_eq!(c.ast.to_string(), "(add ?x (const -0.0 ?t))");
    }
}
