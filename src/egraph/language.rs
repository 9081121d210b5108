//! The e-graph language: ops from the run-time catalogue, graph inputs, and attribute leaves.
//!
//! egg wants a fixed enum of node kinds, but fusebox's ops are data. So an op e-node is just
//! its catalogue name and its children. Attributes are children too: each is a leaf e-node
//! holding a value, placed after the operands in the order `ops.ron` declares them. That lets a
//! rewrite pattern bind an attribute (`(cast ?x ?t)`) or spell one out (`(cast ?x f16)`)
//! with egg's ordinary pattern machinery.
//!
//! Leaves print as s-expression atoms: numbers (`1`, `0.5`, `-inf`, `nan`), `true`/`false`,
//! dtype names (`f16`), integer lists without spaces (`[256,1024]`), and `none` for an optional
//! attribute left out. Graph inputs print as `$name`.

use crate::attr::AttrType;
use crate::attr::AttrValue;
use crate::dtype::DType;
use egg::{FromOp, Id, Language, Symbol};
use std::fmt;

/// An attribute value as an e-graph leaf. Float and integer attributes are both `Num`: which
/// one a leaf is follows from the op that holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Leaf {
    /// The bits of an f64; every NaN is stored as one canonical NaN, `-0.0` stays itself.
    Num(u64),
    /// An integer beyond ±2^53, which an f64 cannot hold exactly. ONNX writes "slice to the
    /// end" as `end = i64::MAX`; stored as a `Num` it would come back as a different integer
    /// (or none at all), so such integers keep their exact value here. Every integer has one
    /// form: `Num` up to ±2^53, `Int` beyond (see [`Leaf::int`]), so equal values stay equal
    /// leaves.
    Int(i64),
    Bool(bool),
    Ints(Vec<i64>),
    DType(DType),
    /// An optional attribute that was left out (`sum` without `axes`).
    Absent,
}

/// The largest magnitude up to which every integer is an exact f64 (2^53).
const MAX_EXACT_INT: u64 = 1 << 53;

impl Leaf {
    pub fn num(value: f64) -> Leaf {
        Leaf::Num(if value.is_nan() {
            f64::NAN.to_bits()
        } else {
            value.to_bits()
        })
    }

    /// An integer leaf in its one canonical form: `Num` when the f64 holds it exactly.
    pub fn int(value: i64) -> Leaf {
        if value.unsigned_abs() <= MAX_EXACT_INT {
            Leaf::num(value as f64)
        } else {
            Leaf::Int(value)
        }
    }

    /// The value as a number; an [`Leaf::Int`] rounds to the nearest f64.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Leaf::Num(bits) => Some(f64::from_bits(*bits)),
            Leaf::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    pub fn from_attr(value: &AttrValue) -> Leaf {
        match value {
            AttrValue::Float(v) => Leaf::num(*v),
            AttrValue::Int(v) => Leaf::int(*v),
            AttrValue::Bool(b) => Leaf::Bool(*b),
            AttrValue::Ints(v) => Leaf::Ints(v.clone()),
            AttrValue::DType(d) => Leaf::DType(*d),
        }
    }

    /// The attribute this leaf stands for, given the type the op declares; `None` for a
    /// mismatch (a pattern that put a dtype where a number belongs) and for `Absent`.
    pub fn to_attr(&self, ty: AttrType) -> Option<AttrValue> {
        Some(match (self, ty) {
            (Leaf::Num(_), AttrType::Float) => AttrValue::Float(self.as_f64()?),
            (Leaf::Num(_), AttrType::Int) => {
                let v = self.as_f64()?;
                // Beyond 2^53 a `Num` no longer names one integer (such integers are `Int`).
                if v.fract() != 0.0 || v.abs() > MAX_EXACT_INT as f64 {
                    return None;
                }
                AttrValue::Int(v as i64)
            }
            (Leaf::Int(v), AttrType::Int) => AttrValue::Int(*v),
            (Leaf::Int(v), AttrType::Float) => AttrValue::Int(*v),
            (Leaf::Bool(b), AttrType::Bool) => AttrValue::Bool(*b),
            (Leaf::Ints(v), AttrType::Ints) => AttrValue::Ints(v.clone()),
            (Leaf::DType(d), AttrType::DType) => AttrValue::DType(*d),
            _ => return None,
        })
    }

    /// Parses an atom; `None` if it is not a leaf literal.
    pub fn parse(text: &str) -> Option<Leaf> {
        match text {
            "true" => return Some(Leaf::Bool(true)),
            "false" => return Some(Leaf::Bool(false)),
            "none" => return Some(Leaf::Absent),
            "nan" => return Some(Leaf::num(f64::NAN)),
            "inf" => return Some(Leaf::num(f64::INFINITY)),
            "-inf" => return Some(Leaf::num(f64::NEG_INFINITY)),
            _ => {}
        }
        if let Some(d) = DType::from_name(text) {
            return Some(Leaf::DType(d));
        }
        if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            if inner.trim().is_empty() {
                return Some(Leaf::Ints(Vec::new()));
            }
            let ints: Result<Vec<i64>, _> = inner.split(',').map(|p| p.trim().parse()).collect();
            return ints.ok().map(Leaf::Ints);
        }
        let starts_numeric = text
            .trim_start_matches(['-', '+'])
            .starts_with(|c: char| c.is_ascii_digit() || c == '.');
        if starts_numeric {
            // Integers beyond 2^53 keep their exact value; other numbers are f64s.
            if let Ok(v) = text.parse::<i64>()
                && v.unsigned_abs() > MAX_EXACT_INT
            {
                return Some(Leaf::Int(v));
            }
            return text.parse::<f64>().ok().map(Leaf::num);
        }
        None
    }
}

impl fmt::Display for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Leaf::Num(_) => {
                let v = self.as_f64().unwrap_or(f64::NAN);
                if v.is_nan() {
                    f.write_str("nan")
                } else if v.is_infinite() {
                    f.write_str(if v > 0.0 { "inf" } else { "-inf" })
                } else if v == 0.0 && v.is_sign_negative() {
                    f.write_str("-0.0")
                } else if v.fract() == 0.0 && v.abs() < 1e15 {
                    write!(f, "{}", v as i64)
                } else {
                    write!(f, "{v:?}")
                }
            }
            Leaf::Int(v) => write!(f, "{v}"),
            Leaf::Bool(b) => write!(f, "{b}"),
            Leaf::Ints(v) => {
                let parts: Vec<String> = v.iter().map(i64::to_string).collect();
                write!(f, "[{}]", parts.join(","))
            }
            Leaf::DType(d) => f.write_str(d.name()),
            Leaf::Absent => f.write_str("none"),
        }
    }
}

/// One e-node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ENode {
    /// A graph input, by name.
    Input(Symbol),
    /// An attribute value.
    Attr(Leaf),
    /// A catalogue op applied to its operands, then its attributes in declaration order.
    Op(Symbol, Vec<Id>),
}

/// What must be equal for two e-nodes to match, children aside.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Discriminant {
    Input(Symbol),
    Attr(Leaf),
    Op(Symbol, usize),
}

impl ENode {
    pub fn op(name: &str, children: Vec<Id>) -> ENode {
        ENode::Op(Symbol::from(name), children)
    }

    /// The op name of an op node.
    pub fn op_name(&self) -> Option<&str> {
        match self {
            ENode::Op(op, _) => Some(op.as_str()),
            _ => None,
        }
    }
}

impl Language for ENode {
    type Discriminant = Discriminant;

    fn discriminant(&self) -> Discriminant {
        match self {
            ENode::Input(s) => Discriminant::Input(*s),
            ENode::Attr(l) => Discriminant::Attr(l.clone()),
            ENode::Op(op, args) => Discriminant::Op(*op, args.len()),
        }
    }

    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (ENode::Input(a), ENode::Input(b)) => a == b,
            (ENode::Attr(a), ENode::Attr(b)) => a == b,
            (ENode::Op(a, x), ENode::Op(b, y)) => a == b && x.len() == y.len(),
            _ => false,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            ENode::Op(_, args) => args,
            _ => &[],
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            ENode::Op(_, args) => args,
            _ => &mut [],
        }
    }
}

impl fmt::Display for ENode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ENode::Input(s) => write!(f, "${s}"),
            ENode::Attr(l) => write!(f, "{l}"),
            ENode::Op(op, _) => f.write_str(op.as_str()),
        }
    }
}

/// Why an s-expression atom is not an e-node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadAtom(pub String);

impl fmt::Display for BadAtom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromOp for ENode {
    type Error = BadAtom;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, Self::Error> {
        if children.is_empty() {
            if let Some(name) = op.strip_prefix('$') {
                if name.is_empty() {
                    return Err(BadAtom("`$` needs an input name after it".into()));
                }
                return Ok(ENode::Input(Symbol::from(name)));
            }
            return Leaf::parse(op).map(ENode::Attr).ok_or_else(|| {
                BadAtom(format!(
                    "`{op}` is not a value: write a number, true/false, a dtype, an integer list \
                     like [1,2], none, or a pattern variable like ?{op}"
                ))
            });
        }
        let valid = op
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && op.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(BadAtom(format!("`{op}` is not an op name")));
        }
        Ok(ENode::Op(Symbol::from(op), children))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_print_and_parse_back() {
        for text in [
            "1",
            "-2",
            "0.5",
            "-0.0",
            "nan",
            "inf",
            "-inf",
            "true",
            "false",
            "f16",
            "bf16",
            "[256,1024]",
            "[]",
            "none",
            "1e-30",
        ] {
            let leaf = Leaf::parse(text).unwrap_or_else(|| panic!("{text} parses"));
            let again = Leaf::parse(&leaf.to_string()).expect("printed leaf parses");
            assert_eq!(leaf, again, "{text}");
        }
        assert_eq!(Leaf::parse("2"), Leaf::parse("2.0"));
        assert_ne!(Leaf::parse("0.0"), Leaf::parse("-0.0"));
        assert_eq!(Leaf::parse("relu"), None);
    }

    #[test]
    fn integer_attributes_come_back_only_when_integral() {
        assert_eq!(
            Leaf::num(3.0).to_attr(AttrType::Int),
            Some(AttrValue::Int(3))
        );
        assert_eq!(Leaf::num(3.5).to_attr(AttrType::Int), None);
        assert_eq!(Leaf::DType(DType::F16).to_attr(AttrType::Float), None);
    }

    #[test]
    fn extreme_integer_attributes_keep_their_exact_value() {
        let exact = 1i64 << 53;
        for v in [
            i64::MAX,
            i64::MIN,
            i64::MAX - 1,
            -exact - 1,
            exact + 1,
            exact,
            -exact,
            0,
        ] {
            let leaf = Leaf::from_attr(&AttrValue::Int(v));
            assert_eq!(leaf.to_attr(AttrType::Int), Some(AttrValue::Int(v)), "{v}");
            assert_eq!(Leaf::parse(&leaf.to_string()), Some(leaf.clone()), "{v}");
            assert_eq!(Leaf::parse(&v.to_string()), Some(leaf), "{v}");
        }
        // One form per integer: small integers stay `Num`, equal to the float spelling.
        assert_eq!(Leaf::int(7), Leaf::num(7.0));
        assert_eq!(Leaf::num(2f64.powi(60)).to_attr(AttrType::Int), None);
    }
}
