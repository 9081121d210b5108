//! Element types, their promotion lattice and the rounding each storage type implies.
//!
//! The reference evaluator keeps float and bool tensors as `f64` values and applies
//! [`DType::round`] after each op: every f32, f16, bf16 and bool value is exactly representable
//! in f64, so rounding to the storage type is the only place precision is lost — exactly as in
//! an eager framework that stores each op's result in its dtype. Integer tensors are exact
//! `i64`s (see `tensor`); [`DType::round`] is how a float becomes an integer.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element types a graph may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DType {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

/// Which broad family a dtype belongs to; promotion never moves down a category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Bool,
    Integer,
    Float,
}

impl DType {
    /// Every dtype, narrowest first within each category.
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// The spelling used in graph and rule files (`"f32"`, `"bf16"`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses the file spelling; `None` for anything else.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I8
            | DType::U8
            | DType::I16
            | DType::U16
            | DType::I32
            | DType::U32
            | DType::I64 => Category::Integer,
            _ => Category::Float,
        }
    }

    /// The values an integer dtype holds, `(min, max)`: all exact in an `i64`, which is how
    /// fusebox holds every integer value (`None` for the other dtypes).
    pub fn int_range(self) -> Option<(i64, i64)> {
        match self {
            DType::I8 => Some((i8::MIN.into(), i8::MAX.into())),
            DType::U8 => Some((0, u8::MAX.into())),
            DType::I16 => Some((i16::MIN.into(), i16::MAX.into())),
            DType::U16 => Some((0, u16::MAX.into())),
            DType::I32 => Some((i32::MIN.into(), i32::MAX.into())),
            DType::U32 => Some((0, u32::MAX.into())),
            DType::I64 => Some((i64::MIN, i64::MAX)),
            _ => None,
        }
    }

    /// Whether this is an unsigned integer dtype.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32)
    }

    /// Bits of an integer dtype's values (0 for the others).
    fn int_bits(self) -> u32 {
        match self {
            DType::I8 | DType::U8 => 8,
            DType::I16 | DType::U16 => 16,
            DType::I32 | DType::U32 => 32,
            DType::I64 => 64,
            _ => 0,
        }
    }

    /// The signed integer dtype of `bits` bits (i64 past 32).
    fn signed_of(bits: u32) -> DType {
        match bits {
            0..=8 => DType::I8,
            9..=16 => DType::I16,
            17..=32 => DType::I32,
            _ => DType::I64,
        }
    }

    /// Two integer dtypes meet at the narrowest one holding both's values, as in NumPy and
    /// PyTorch (u8 with i8 at i16, u32 with i32 at i64); u32 with i64 is i64.
    fn promote_ints(self, other: DType) -> DType {
        let (a, b) = (self.int_bits(), other.int_bits());
        match (self.is_unsigned(), other.is_unsigned()) {
            (false, false) | (true, true) => {
                if a >= b {
                    self
                } else {
                    other
                }
            }
            (true, false) if b > a => other,
            (false, true) if a > b => self,
            (true, false) => DType::signed_of(2 * a),
            (false, true) => DType::signed_of(2 * b),
        }
    }

    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    /// Bytes per element in memory (bool is one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Bits of significand precision, used to order floats (f16 and bf16 are incomparable).
    fn float_rank(self) -> u8 {
        match self {
            DType::F16 | DType::BF16 => 1,
            DType::F32 => 2,
            DType::F64 => 3,
            _ => 0,
        }
    }

    /// The type two operands meet at.
    ///
    /// Within a category the wider type wins (i32 < i64; f16, bf16 < f32 < f64, and f16 with
    /// bf16 meet at f32 because neither holds the other's values; a signed and an unsigned
    /// integer meet at a signed type holding both, u8 with i8 at i16). Across categories the higher
    /// category's type wins unchanged (i64 + f16 → f16), as in PyTorch and JAX: NumPy's
    /// value-safe rule would turn every index-meets-half-tensor into f64, which no ML graph wants.
    pub fn promote(self, other: DType) -> DType {
        use Category::*;
        match (self.category(), other.category()) {
            (a, b) if a > b => self,
            (a, b) if a < b => other,
            (Bool, Bool) => DType::Bool,
            (Integer, Integer) => self.promote_ints(other),
            _ => {
                if self == other {
                    self
                } else if self.float_rank() == other.float_rank() {
                    DType::F32
                } else if self.float_rank() > other.float_rank() {
                    self
                } else {
                    other
                }
            }
        }
    }

    /// Whether float arithmetic on this storage type is carried out in f64 by eager frameworks
    /// and by fused kernels: half types widen to f32, f64 stays f64, bools are computed in f64.
    /// Integers answer `true` too, for the float computations they take part in (a `mean`, a
    /// cast to f64); their own arithmetic is exact integer arithmetic, never f64.
    pub fn compute_is_f64(self) -> bool {
        !matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Rounds an exact value to the nearest value this dtype can store.
    ///
    /// Floats round to nearest even (NaN and ±Inf preserved, overflow to ±Inf); integer types
    /// truncate toward zero and saturate, with NaN becoming 0 (C's cast is undefined there, we
    /// pick Rust's rule); bool is `v != 0`, so NaN is true as in PyTorch.
    #[inline]
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F64 => v,
            DType::F32 => v as f32 as f64,
            // `half`'s f64 conversions are not correctly rounded (with F16C they go through
            // `as f32`, rounding twice; otherwise they drop the low 32 mantissa bits, losing the
            // sticky bit). Rounding to odd in f32 first keeps every bit that decides the second
            // rounding, so f32 -> f16/bf16 (correct in `half`) then rounds exactly once.
            DType::F16 => half::f16::from_f32(round_to_odd_f32(v)).to_f64(),
            DType::BF16 => half::bf16::from_f32(round_to_odd_f32(v)).to_f64(),
            DType::I8 => (v as i8) as f64,
            DType::U8 => (v as u8) as f64,
            DType::I16 => (v as i16) as f64,
            DType::U16 => (v as u16) as f64,
            DType::I32 => (v as i32) as f64,
            DType::U32 => (v as u32) as f64,
            DType::I64 => (v as i64) as f64,
            DType::Bool => {
                if v != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }
}

/// `v` rounded to f32 toward zero, with the last significand bit set if that lost anything
/// ("round to odd"). With 24 bits against f16's 11 and bf16's 8, a later round-to-nearest-even
/// to either gives the correctly rounded result of `v`.
fn round_to_odd_f32(v: f64) -> f32 {
    let nearest = v as f32;
    if v.is_nan() || f64::from(nearest) == v {
        return nearest;
    }
    // Step back toward zero if rounding went away from it (possibly to infinity).
    let toward_zero = if f64::from(nearest).abs() > v.abs() {
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        nearest
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dtype name that is none of fusebox's (serde reports it where a file names it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown dtype `{0}` (expected one of {names})",
    names = DType::ALL.map(|d| d.name()).join(", ")
)]
pub struct UnknownDType(pub String);

impl TryFrom<String> for DType {
    type Error = UnknownDType;
    fn try_from(s: String) -> Result<Self, UnknownDType> {
        DType::from_name(&s).ok_or(UnknownDType(s))
    }
}

impl From<DType> for String {
    fn from(d: DType) -> String {
        d.name().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::DType::*;
    use super::*;

    #[test]
    fn promotion_lattice() {
        assert_eq!(F16.promote(F32), F32);
        assert_eq!(F16.promote(BF16), F32);
        assert_eq!(BF16.promote(BF16), BF16);
        assert_eq!(I32.promote(I64), I64);
        assert_eq!(I64.promote(F16), F16);
        assert_eq!(Bool.promote(I32), I32);
        assert_eq!(U8.promote(I8), I16);
        assert_eq!(U8.promote(I16), I16);
        assert_eq!(U16.promote(I8), I32);
        assert_eq!(U32.promote(I32), I64);
        assert_eq!(U32.promote(I64), I64);
        assert_eq!(U8.promote(U32), U32);
        assert_eq!(I8.promote(I32), I32);
        assert_eq!(U16.promote(F16), F16);
        assert_eq!(F64.promote(F16), F64);
        for a in DType::ALL {
            for b in DType::ALL {
                assert_eq!(a.promote(b), b.promote(a), "{a} {b}");
            }
        }
    }

    #[test]
    fn rounding_known_values() {
        // 1 + 2^-11 is halfway between two f16 values: ties to even gives 1.0.
        assert_eq!(F16.round(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(F16.round(65520.0), f64::INFINITY);
        assert_eq!(F16.round(65504.0), 65504.0);
        // bf16 keeps 8 significand bits: 1 + 2^-8 ties to even, 1 + 3*2^-9 rounds up.
        assert_eq!(BF16.round(1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(BF16.round(1.0 + 3.0 * 2f64.powi(-9)), 1.0 + 2f64.powi(-7));
        assert_eq!(F32.round(0.1), 0.1f32 as f64);
        assert!(F16.round(f64::NAN).is_nan());
        assert_eq!(F16.round(-0.0).to_bits(), (-0.0f64).to_bits());
        // Rounding from f64 happens once: just above a midpoint rounds up, even where the
        // bits that put it above lie beyond f32's precision.
        assert_eq!(
            F16.round(1.0 + 2f64.powi(-11) + 2f64.powi(-40)),
            1.0 + 2f64.powi(-10)
        );
        assert_eq!(
            F16.round(-(1.0 + 2f64.powi(-11) + 2f64.powi(-24))),
            -(1.0 + 2f64.powi(-10))
        );
        assert_eq!(
            BF16.round(1.0 + 2f64.powi(-8) + 2f64.powi(-23)),
            1.0 + 2f64.powi(-7)
        );
        assert_eq!(
            BF16.round(1.0 + 2f64.powi(-8) + 2f64.powi(-50)),
            1.0 + 2f64.powi(-7)
        );
        assert_eq!(F16.round(65519.99), 65504.0);
        assert_eq!(F16.round(1e300), f64::INFINITY);
        assert_eq!(BF16.round(-1e300), f64::NEG_INFINITY);
        assert_eq!(F16.round(1e-300).to_bits(), 0.0f64.to_bits());
        assert_eq!(F16.round(-1e-300).to_bits(), (-0.0f64).to_bits());
        assert_eq!(BF16.round(f64::INFINITY), f64::INFINITY);
        assert_eq!(I32.round(-2.7), -2.0);
        assert_eq!(I32.round(1e12), i32::MAX as f64);
        assert_eq!(I32.round(f64::NAN), 0.0);
        assert_eq!(Bool.round(f64::NAN), 1.0);
        assert_eq!(Bool.round(-0.0), 0.0);
    }
}
