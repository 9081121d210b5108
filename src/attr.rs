//! Typed op attributes (`axes`, `keepdim`, `dtype`, `value`, …).
//!
//! Graph files write attribute values bare (`{"axes": [1], "keepdim": true}`); the op catalogue
//! declares each attribute's type, so a value is checked and typed once, when the graph is
//! resolved against the catalogue.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The type an op declares for one of its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttrType {
    Float,
    Int,
    Bool,
    Ints,
    DType,
}

impl AttrType {
    /// Whether `value` is a value of this type. A number (`Float`) also admits an exact
    /// integer: a `const` value such as 9007199254740993 is kept as the integer it is, since
    /// the nearest f64 would be a different integer.
    pub fn admits(self, value: &AttrValue) -> bool {
        self == value.ty() || (self == AttrType::Float && value.ty() == AttrType::Int)
    }
}

impl fmt::Display for AttrType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttrType::Float => "a number",
            AttrType::Int => "an integer",
            AttrType::Bool => "true or false",
            AttrType::Ints => "a list of integers",
            AttrType::DType => "a dtype name",
        })
    }
}

/// A typed attribute value. In rule files defaults are written tagged (`Bool(false)`,
/// `Ints([0])`, `DType("f32")`); in graph files values are written bare.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttrValue {
    Float(f64),
    Int(i64),
    Bool(bool),
    Ints(Vec<i64>),
    DType(DType),
}

/// Attributes of one node, by name; ordered so saved files are stable.
pub type Attrs = BTreeMap<String, AttrValue>;

impl AttrValue {
    pub fn ty(&self) -> AttrType {
        match self {
            AttrValue::Float(_) => AttrType::Float,
            AttrValue::Int(_) => AttrType::Int,
            AttrValue::Bool(_) => AttrType::Bool,
            AttrValue::Ints(_) => AttrType::Ints,
            AttrValue::DType(_) => AttrType::DType,
        }
    }

    /// The value as a number, for formulas that read attributes (`clamp`'s bounds, `const`'s
    /// value); `None` for lists and dtypes.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            AttrValue::Float(v) => Some(*v),
            AttrValue::Int(v) => Some(*v as f64),
            AttrValue::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
            _ => None,
        }
    }

    /// The value as an exact integer, for formulas evaluated on integer dtypes: an integer as
    /// it is, a float converted as a cast to `i64` converts (toward zero, saturating, NaN →
    /// 0), a bool as 0 or 1; `None` for lists and dtypes.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            AttrValue::Float(v) => Some(*v as i64),
            AttrValue::Int(v) => Some(*v),
            AttrValue::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// Converts a bare value from a graph file to the declared type. Integers are accepted
    /// where a number is expected (`"value": 1`); one that f64 cannot hold exactly (beyond
    /// 2^53) stays an [`AttrValue::Int`] so that no bit of it is lost. Nothing else is coerced.
    pub fn from_bare(value: &ron::Value, ty: AttrType) -> Result<AttrValue, AttrMismatch> {
        Self::from_bare_written(value, ty, None)
    }

    /// [`AttrValue::from_bare`] for a value written in a file, where `written` is the bare
    /// name the value was written as, if it was one (RON reads `True` or `nan` as `()`, so the
    /// text is what can tell the reader what it wrote). A mismatch then names it, and says how
    /// RON spells what was likely meant.
    pub fn from_bare_written(
        value: &ron::Value,
        ty: AttrType,
        written: Option<&str>,
    ) -> Result<AttrValue, AttrMismatch> {
        use ron::Value as V;
        if let (V::Unit, Some(name)) = (value, written) {
            let hint = match ty {
                AttrType::Bool => {
                    " (graph files are RON, which writes booleans as `true` and `false`)"
                }
                AttrType::Float | AttrType::Int => {
                    " (graph files are RON, which writes the non-finite numbers `NaN`, `inf` and `-inf`; a lowercase `nan` is a name to it)"
                }
                AttrType::DType => " (a dtype is written as a string: \"f32\")",
                AttrType::Ints => "",
            };
            return Err(AttrMismatch {
                expected: ty.to_string(),
                found: format!("the bare name `{name}`{hint}"),
            });
        }
        let mismatch = || AttrMismatch {
            expected: ty.to_string(),
            found: describe(value),
        };
        match (ty, value) {
            (AttrType::Float, V::Number(n)) => Ok(match integer(n) {
                Some(i) if i.unsigned_abs() > 1 << 53 => AttrValue::Int(i),
                _ => AttrValue::Float(n.into_f64()),
            }),
            (AttrType::Int, V::Number(n)) => integer(n).map(AttrValue::Int).ok_or_else(mismatch),
            (AttrType::Bool, V::Bool(b)) => Ok(AttrValue::Bool(*b)),
            (AttrType::Ints, V::Seq(items)) => items
                .iter()
                .map(|item| match item {
                    V::Number(n) => integer(n),
                    _ => None,
                })
                .collect::<Option<Vec<i64>>>()
                .map(AttrValue::Ints)
                .ok_or_else(mismatch),
            (AttrType::DType, V::String(s)) => DType::from_name(s)
                .map(AttrValue::DType)
                .ok_or_else(|| AttrMismatch {
                    expected: format!(
                        "a dtype name (one of {})",
                        DType::ALL.map(|d| d.name()).join(", ")
                    ),
                    found: format!("\"{s}\""),
                }),
            // RON reads a bare name as `()`: lowercase `nan`, as rewrite patterns spell it, is
            // the likely one where a number is due, so say how a graph file spells it.
            (AttrType::Float | AttrType::Int, V::Unit) => Err(AttrMismatch {
                expected: ty.to_string(),
                found: "a bare name or `()` (graph files are RON, which writes the non-finite numbers `NaN`, `inf` and `-inf`; a lowercase `nan` is a name to it)".into(),
            }),
            _ => Err(mismatch()),
        }
    }

    /// The bare form written back to graph files; `from_bare(to_bare(v), v.ty()) == v`.
    pub fn to_bare(&self) -> ron::Value {
        use ron::Value as V;
        match self {
            AttrValue::Float(v) => V::Number(ron::value::Number::F64((*v).into())),
            AttrValue::Int(v) => V::Number(ron::value::Number::I64(*v)),
            AttrValue::Bool(b) => V::Bool(*b),
            AttrValue::Ints(v) => V::Seq(
                v.iter()
                    .map(|i| V::Number(ron::value::Number::I64(*i)))
                    .collect(),
            ),
            AttrValue::DType(d) => V::String(d.name().to_string()),
        }
    }
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Float(v) => write!(f, "{v:?}"),
            AttrValue::Int(v) => write!(f, "{v}"),
            AttrValue::Bool(v) => write!(f, "{v}"),
            AttrValue::Ints(v) => write!(f, "{v:?}"),
            AttrValue::DType(d) => write!(f, "{d}"),
        }
    }
}

/// A bare value that does not have the declared attribute type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttrMismatch {
    pub expected: String,
    pub found: String,
}

impl fmt::Display for AttrMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, found {}", self.expected, self.found)
    }
}

/// An exact integer from a RON number; floats with a fraction are not integers.
fn integer(n: &ron::value::Number) -> Option<i64> {
    use ron::value::Number as N;
    match *n {
        N::I8(v) => Some(v.into()),
        N::I16(v) => Some(v.into()),
        N::I32(v) => Some(v.into()),
        N::I64(v) => Some(v),
        N::U8(v) => Some(v.into()),
        N::U16(v) => Some(v.into()),
        N::U32(v) => Some(v.into()),
        N::U64(v) => i64::try_from(v).ok(),
        _ => None,
    }
}

fn describe(value: &ron::Value) -> String {
    use ron::Value as V;
    match value {
        V::Bool(b) => format!("`{b}`"),
        V::Char(c) => format!("the char {c:?}"),
        V::Map(_) => "a map".into(),
        V::Number(n) => match integer(n) {
            Some(i) => format!("the integer {i}"),
            None => format!("the number {:?}", n.into_f64()),
        },
        V::Option(_) => "an option".into(),
        V::String(s) => format!("the string {s:?}"),
        V::Bytes(_) => "bytes".into(),
        V::Seq(_) => "a list".into(),
        V::Unit => "`()`".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_values_type_check_and_round_trip() {
        let cases = [
            ("1.5", AttrType::Float, AttrValue::Float(1.5)),
            ("2", AttrType::Float, AttrValue::Float(2.0)),
            (
                "9007199254740993",
                AttrType::Float,
                AttrValue::Int(9007199254740993),
            ),
            (
                "-9223372036854775808",
                AttrType::Float,
                AttrValue::Int(i64::MIN),
            ),
            ("-3", AttrType::Int, AttrValue::Int(-3)),
            ("true", AttrType::Bool, AttrValue::Bool(true)),
            ("[1, -1]", AttrType::Ints, AttrValue::Ints(vec![1, -1])),
            ("\"bf16\"", AttrType::DType, AttrValue::DType(DType::BF16)),
        ];
        for (text, ty, expected) in cases {
            let value: ron::Value = ron::from_str(text).unwrap();
            let typed = AttrValue::from_bare(&value, ty).unwrap();
            assert_eq!(typed, expected);
            assert_eq!(
                AttrValue::from_bare(&typed.to_bare(), ty).unwrap(),
                expected
            );
        }
    }

    #[test]
    fn mismatches_say_what_was_expected_and_found() {
        let value: ron::Value = ron::from_str("1.5").unwrap();
        assert_eq!(
            AttrValue::from_bare(&value, AttrType::Int)
                .unwrap_err()
                .to_string(),
            "an integer, found the number 1.5"
        );
        let value: ron::Value = ron::from_str("\"f8\"").unwrap();
        assert!(
            AttrValue::from_bare(&value, AttrType::DType)
                .unwrap_err()
                .to_string()
                .contains("found \"f8\"")
        );
    }
}
