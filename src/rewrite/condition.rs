//! The closed vocabulary of rule conditions, checked at load and evaluated from class data.
//!
//! A condition never looks at tensor values, only at what the e-graph analysis knows about a
//! class: its dtype and shape, or the attribute leaf it holds, and whether every element is one
//! known constant. That keeps matching cheap and makes a condition mean the same thing for
//! every graph: a rule is sound for all tensors its conditions admit, which is what
//! `check-rules` tests.

use super::VarKind;
use crate::attr::AttrType;
use crate::dtype::DType;
use crate::egraph::{ClassData, FuseGraph, Leaf};
use egg::{Id, Subst, Var};
use serde::{Deserialize, Serialize};

/// One condition of a rule's `when` list. Variables are written as strings (`"?x"`); each
/// must be bound by the left-hand side, with a kind the condition accepts (checked at load).
///
/// Where a condition takes "a tensor or a dtype attribute", a tensor variable stands for its
/// dtype and a variable bound to a `dtype` attribute (`(cast ?x ?t)`) for the dtype it names;
/// likewise "a tensor or a shape attribute" means a tensor's shape or an integer-list attribute
/// (`(broadcast_to ?x ?s)`) read as a shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Condition {
    /// The two have the same dtype (tensors or dtype attributes, mixed freely). Rules that
    /// move an op past another need this wherever promotion would convert one operand
    /// before the op runs.
    SameDtype(String, String),
    /// The two have the same shape (tensors or shape attributes).
    SameShape(String, String),
    /// The first's shape broadcasts to exactly the second's (NumPy rules, as `broadcast_to`
    /// requires): a tensor of that shape is constant along every axis a `sum_to_size` to the
    /// second reduces.
    BroadcastsTo(String, String),
    /// The matched class (the left-hand side's root) has exactly this tensor variable's dtype
    /// and shape. Identities such as `x * 1 → x` hold only when the product neither promotes
    /// nor broadcasts `x`.
    KeepsType(String),
    /// The tensor (or shape attribute) has this many axes.
    Rank(String, usize),
    /// The dtype (of a tensor, or named by a dtype attribute) is one of these.
    DtypeIn(String, Vec<DType>),
    /// The dtype is a floating-point type (f16, bf16, f32, f64). Integer arithmetic saturates
    /// in fusebox (`-i32::MIN` is `i32::MAX`), so sign tricks are exact only for floats.
    IsFloat(String),
    /// The first dtype represents every value of the second exactly and differs from it
    /// (f32 ⊇ f16, bf16; f64 ⊇ f32, f16, bf16, i32; i64 ⊇ i32; every dtype ⊇ bool): casting
    /// to it and back loses nothing.
    Wider(String, String),
    /// The tensor class has a known value that every element shares.
    IsConst(String),
    /// The value is this number, compared with `==` (so `-0.0` equals `0.0` and NaN equals
    /// nothing): a tensor class's uniform constant, or a number attribute. Spell a constant
    /// in the pattern instead (`(const -0.0 ?t)`) when the sign of zero matters.
    ConstEq(String, f64),
    /// The value is ±2^k and ±2^−k is exact too, so dividing by it equals multiplying by its
    /// reciprocal, bit for bit. For a tensor class: its uniform constant, with the reciprocal
    /// exact in the class's dtype. For a number attribute (which has no dtype of its own):
    /// both must be exact in every float dtype, i.e. −15 ≤ k ≤ 15 (f16's range).
    ConstPowerOfTwo(String),
    /// The first (a shape attribute or tensor) is the second tensor's shape without its first
    /// axis: `sum_to_size` to it is a sum over axis 0.
    DropsLeadingAxis(String, String),
    /// The first's shape broadcasts to the second's with size 1 on the second's last axis (or
    /// the first has no axes): a tensor of it is constant along each row of the second, as a
    /// per-row scale of a matrix product's left operand is (the product sums along that axis).
    ConstantAlongLastAxis(String, String),
    /// The tensor's value is computed from the model's fixed inputs (its stored weights) and
    /// constants alone, through at least one fixed input ([`crate::egraph::Origin::Fixed`]),
    /// so work moved onto it runs once, when the model is compiled, rather than on every run.
    /// Says nothing about the value: a rule that moves arithmetic from the activations onto a
    /// weight uses it to apply only where that pays at every size (with the weights given per
    /// run, the same move would cost a kernel over the weight per run, cheaper or dearer than
    /// the kernel it saves depending on the batch).
    Fixed(String),
    /// The permutation attribute (first) leaves every axis of the tensor (second) in place,
    /// so transposing by it copies each element to its own index. An absent permutation
    /// reverses the axes, which is the identity only up to rank 1.
    IdentityPerm(String, String),
    /// The inner condition does not hold.
    Not(Box<Condition>),
    /// At least one of the inner conditions holds (none: false).
    Any(Vec<Condition>),
}

/// The kinds of variable a condition argument accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    /// A tensor, or a `dtype` attribute.
    Dtype,
    /// A tensor, or an integer-list attribute read as a shape.
    Shape,
    /// A tensor only.
    Tensor,
    /// A tensor (its uniform constant) or a number attribute.
    Number,
    /// An integer-list attribute read as a permutation (not a tensor: a permutation is never
    /// a tensor's shape).
    Perm,
}

impl Accepts {
    pub fn admits(self, kind: VarKind) -> bool {
        if self == Accepts::Perm {
            return kind == VarKind::Attr(AttrType::Ints);
        }
        matches!(
            (self, kind),
            (_, VarKind::Tensor)
                | (Accepts::Dtype, VarKind::Attr(AttrType::DType))
                | (Accepts::Shape, VarKind::Attr(AttrType::Ints))
                | (
                    Accepts::Number,
                    VarKind::Attr(AttrType::Float | AttrType::Int)
                )
        )
    }

    pub fn describe(self) -> &'static str {
        match self {
            Accepts::Dtype => "a tensor or a dtype attribute",
            Accepts::Shape => "a tensor or a shape (integer list) attribute",
            Accepts::Tensor => "a tensor",
            Accepts::Number => "a tensor or a number attribute",
            Accepts::Perm => "an integer-list attribute (a permutation)",
        }
    }
}

impl Condition {
    /// The condition's name as written in a rule file.
    pub fn name(&self) -> &'static str {
        match self {
            Condition::SameDtype(..) => "SameDtype",
            Condition::SameShape(..) => "SameShape",
            Condition::BroadcastsTo(..) => "BroadcastsTo",
            Condition::KeepsType(..) => "KeepsType",
            Condition::Rank(..) => "Rank",
            Condition::DtypeIn(..) => "DtypeIn",
            Condition::IsFloat(..) => "IsFloat",
            Condition::Wider(..) => "Wider",
            Condition::IsConst(..) => "IsConst",
            Condition::ConstEq(..) => "ConstEq",
            Condition::ConstPowerOfTwo(..) => "ConstPowerOfTwo",
            Condition::DropsLeadingAxis(..) => "DropsLeadingAxis",
            Condition::ConstantAlongLastAxis(..) => "ConstantAlongLastAxis",
            Condition::IdentityPerm(..) => "IdentityPerm",
            Condition::Fixed(..) => "Fixed",
            Condition::Not(..) => "Not",
            Condition::Any(..) => "Any",
        }
    }

    /// The variable arguments with their positions among the condition's arguments and what
    /// each accepts. `Not` and `Any` have none of their own (their inner conditions are checked
    /// separately).
    pub fn var_args(&self) -> Vec<(usize, &str, Accepts)> {
        use Accepts::*;
        match self {
            Condition::SameDtype(a, b) | Condition::Wider(a, b) => {
                vec![(0, a, Dtype), (1, b, Dtype)]
            }
            Condition::SameShape(a, b)
            | Condition::BroadcastsTo(a, b)
            | Condition::DropsLeadingAxis(a, b)
            | Condition::ConstantAlongLastAxis(a, b) => vec![(0, a, Shape), (1, b, Shape)],
            Condition::KeepsType(a) | Condition::IsConst(a) | Condition::Fixed(a) => {
                vec![(0, a, Tensor)]
            }
            Condition::Rank(a, _) => vec![(0, a, Shape)],
            Condition::DtypeIn(a, _) | Condition::IsFloat(a) => vec![(0, a, Dtype)],
            Condition::ConstEq(a, _) | Condition::ConstPowerOfTwo(a) => vec![(0, a, Number)],
            Condition::IdentityPerm(p, x) => vec![(0, p, Perm), (1, x, Tensor)],
            Condition::Not(_) | Condition::Any(_) => Vec::new(),
        }
    }

    /// Whether the condition holds for a match of the rule in class `root` under `subst`.
    /// A variable that is not bound, or bound to a class of the wrong kind, makes it false.
    pub fn holds(&self, egraph: &FuseGraph, root: Id, subst: &Subst) -> bool {
        let data = |name: &str| -> Option<&ClassData> {
            let var: Var = name.parse().ok()?;
            Some(&egraph[*subst.get(var)?].data)
        };
        match self {
            Condition::SameDtype(a, b) => both(dtype_of(data(a)), dtype_of(data(b)), |x, y| x == y),
            Condition::SameShape(a, b) => both(shape_of(data(a)), shape_of(data(b)), |x, y| x == y),
            Condition::BroadcastsTo(a, b) => both(shape_of(data(a)), shape_of(data(b)), |x, y| {
                crate::shape::broadcasts_to(&x, &y)
            }),
            Condition::KeepsType(a) => match (egraph[root].data.ty(), data(a).and_then(|d| d.ty()))
            {
                (Some(r), Some(x)) => r == x,
                _ => false,
            },
            Condition::Rank(a, n) => shape_of(data(a)).is_some_and(|s| s.len() == *n),
            Condition::DtypeIn(a, list) => dtype_of(data(a)).is_some_and(|d| list.contains(&d)),
            Condition::IsFloat(a) => dtype_of(data(a)).is_some_and(DType::is_float),
            Condition::Wider(a, b) => both(dtype_of(data(a)), dtype_of(data(b)), |w, n| {
                w != n && represents(w, n)
            }),
            Condition::IsConst(a) => data(a)
                .and_then(ClassData::tensor)
                .is_some_and(|t| t.constant.is_some()),
            Condition::Fixed(a) => data(a)
                .and_then(ClassData::tensor)
                .is_some_and(|t| t.origin == crate::egraph::Origin::Fixed),
            Condition::ConstEq(a, v) => number_of(data(a)).is_some_and(|(x, _)| x == *v),
            Condition::ConstPowerOfTwo(a) => number_of(data(a))
                .is_some_and(|(x, dtype)| power_of_two_with_exact_reciprocal(x, dtype)),
            Condition::DropsLeadingAxis(s, x) => {
                both(shape_of(data(s)), shape_of(data(x)), |s, x| {
                    !x.is_empty() && s[..] == x[1..]
                })
            }
            Condition::ConstantAlongLastAxis(a, b) => {
                both(shape_of(data(a)), shape_of(data(b)), |a, b| {
                    constant_along_last_axis(&a, &b)
                })
            }
            Condition::IdentityPerm(p, x) => {
                let perm = match data(p) {
                    Some(ClassData::Attr(Leaf::Ints(v))) => Some(v.as_slice()),
                    Some(ClassData::Attr(Leaf::Absent)) => None,
                    _ => return false,
                };
                shape_of(data(x)).is_some_and(|s| {
                    crate::shape::permutation(perm, s.len())
                        .is_ok_and(|p| p.iter().enumerate().all(|(i, &a)| i == a))
                })
            }
            Condition::Not(inner) => !inner.holds(egraph, root, subst),
            Condition::Any(inner) => inner.iter().any(|c| c.holds(egraph, root, subst)),
        }
    }
}

/// Whether a tensor of shape `a` broadcast to `b` is constant along `b`'s last axis: its own
/// last axis (which broadcasting aligns with `b`'s) has size 1, or it has no axes.
pub(crate) fn constant_along_last_axis(a: &[usize], b: &[usize]) -> bool {
    crate::shape::broadcasts_to(a, b) && (a.is_empty() || b.is_empty() || a.last() == Some(&1))
}

fn both<T>(a: Option<T>, b: Option<T>, f: impl FnOnce(T, T) -> bool) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => f(a, b),
        _ => false,
    }
}

fn dtype_of(data: Option<&ClassData>) -> Option<DType> {
    match data? {
        ClassData::Tensor(t) => Some(t.ty.dtype),
        ClassData::Attr(Leaf::DType(d)) => Some(*d),
        _ => None,
    }
}

fn shape_of(data: Option<&ClassData>) -> Option<Vec<usize>> {
    match data? {
        ClassData::Tensor(t) => Some(t.ty.shape.clone()),
        ClassData::Attr(Leaf::Ints(v)) => v.iter().map(|&d| usize::try_from(d).ok()).collect(),
        _ => None,
    }
}

/// A tensor class's uniform constant with its dtype, or a number attribute's value.
fn number_of(data: Option<&ClassData>) -> Option<(f64, Option<DType>)> {
    match data? {
        ClassData::Tensor(t) => t.constant.map(|c| (c.as_f64(), Some(t.ty.dtype))),
        ClassData::Attr(leaf) => leaf.as_f64().map(|v| (v, None)),
        ClassData::Invalid(_) => None,
    }
}

/// Whether `wide` holds every value of `narrow` exactly (including NaN and ±Inf for floats).
pub fn represents(wide: DType, narrow: DType) -> bool {
    use DType::*;
    if wide == narrow || narrow == Bool {
        return true;
    }
    // Integers: a float holds those within 2^(significand bits), an integer those within
    // its range.
    if let Some((lo, hi)) = narrow.int_range() {
        let exact = match wide {
            F64 => 1i64 << 53,
            F32 => 1 << 24,
            F16 => 1 << 11,
            BF16 => 1 << 8,
            _ => {
                return wide
                    .int_range()
                    .is_some_and(|(wlo, whi)| wlo <= lo && hi <= whi);
            }
        };
        return -exact <= lo && hi <= exact;
    }
    match wide {
        F64 => matches!(narrow, F32 | F16 | BF16),
        F32 => matches!(narrow, F16 | BF16),
        _ => false,
    }
}

/// `2^e` as an f64, if it is one (normal or subnormal).
fn pow2(e: i32) -> Option<f64> {
    if (-1022..=1023).contains(&e) {
        Some(f64::from_bits(((e + 1023) as u64) << 52))
    } else if (-1074..-1022).contains(&e) {
        Some(f64::from_bits(1u64 << (e + 1074)))
    } else {
        None
    }
}

/// `k` if `|v| = 2^k`.
fn exponent_of_power_of_two(v: f64) -> Option<i32> {
    if !v.is_finite() || v == 0.0 {
        return None;
    }
    let bits = v.abs().to_bits();
    let exponent = (bits >> 52) as i32;
    let mantissa = bits & ((1u64 << 52) - 1);
    if exponent == 0 {
        mantissa
            .is_power_of_two()
            .then(|| mantissa.trailing_zeros() as i32 - 1074)
    } else {
        (mantissa == 0).then_some(exponent - 1023)
    }
}

/// See [`Condition::ConstPowerOfTwo`]: `dtype` is the tensor's dtype, `None` for an attribute
/// (then the value and its reciprocal must be exact in every float dtype; f16 has the
/// narrowest range, so it decides).
fn power_of_two_with_exact_reciprocal(v: f64, dtype: Option<DType>) -> bool {
    let Some(k) = exponent_of_power_of_two(v) else {
        return false;
    };
    let Some(reciprocal) = pow2(-k) else {
        return false;
    };
    let exact = |d: DType| d.round(v) == v && d.round(reciprocal) == reciprocal;
    match dtype {
        Some(d) => exact(d),
        None => exact(DType::F16),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egraph::{ENode, TypeAnalysis};
    use crate::graph::TensorType;
    use crate::rules::Catalogue;
    use egg::{RecExpr, Symbol};
    use std::collections::HashMap;

    /// An e-graph with a few inputs and classes bound to variables by hand.
    fn classes() -> (FuseGraph, Subst, Id) {
        let ty = |dtype, shape: &[usize]| TensorType {
            dtype,
            shape: shape.to_vec(),
        };
        let inputs = HashMap::from([
            (Symbol::from("x"), ty(DType::F32, &[2, 3])),
            (Symbol::from("h"), ty(DType::F16, &[2, 3])),
            (Symbol::from("v"), ty(DType::F32, &[3])),
            (Symbol::from("i"), ty(DType::I32, &[2, 3])),
        ]);
        let mut egraph = FuseGraph::new(TypeAnalysis::new(Catalogue::defaults(), inputs));
        let mut subst = Subst::default();
        let mut bind = |egraph: &mut FuseGraph, var: &str, term: &str| {
            let e: RecExpr<ENode> = term.parse().unwrap();
            let id = egraph.add_expr(&e);
            subst.insert(var.parse().unwrap(), id);
            id
        };
        for (var, term) in [
            ("?x", "$x"),
            ("?h", "$h"),
            ("?v", "$v"),
            ("?i", "$i"),
            ("?f16", "f16"),
            ("?f32", "f32"),
            ("?s", "[2,3]"),
            ("?s3", "[3]"),
            ("?neg", "[-1,3]"),
            ("?num", "0.25"),
            ("?three", "3"),
            ("?quarter", "(const 0.25 f16)"),
            ("?tiny", "(const 0.0000152587890625 f16)"),
            ("?one", "(broadcast_to (const 1 f32) [2,3])"),
            ("?nan", "(const nan f32)"),
            ("?negzero", "(const -0.0 f32)"),
            ("?id", "[0,1]"),
            ("?idneg", "[-2,-1]"),
            ("?swap", "[1,0]"),
            ("?noperm", "none"),
        ] {
            bind(&mut egraph, var, term);
        }
        let root = bind(&mut egraph, "?root", "(mul $x (const 1 f32))");
        egraph.rebuild();
        (egraph, subst, root)
    }

    fn holds(c: Condition) -> bool {
        let (egraph, subst, root) = classes();
        c.holds(&egraph, root, &subst)
    }

    fn s(v: &str) -> String {
        v.to_string()
    }

    #[test]
    fn dtype_conditions_read_tensors_and_dtype_attributes() {
        use Condition::*;
        assert!(holds(SameDtype(s("?x"), s("?f32"))));
        assert!(holds(SameDtype(s("?f16"), s("?h"))));
        assert!(!holds(SameDtype(s("?x"), s("?h"))));
        assert!(holds(DtypeIn(s("?h"), vec![DType::BF16, DType::F16])));
        assert!(!holds(DtypeIn(s("?i"), vec![DType::F16])));
        assert!(holds(IsFloat(s("?f16"))));
        assert!(!holds(IsFloat(s("?i"))));
        assert!(holds(Wider(s("?x"), s("?h"))));
        assert!(holds(Wider(s("?f32"), s("?f16"))));
        assert!(!holds(Wider(s("?x"), s("?f32"))), "not wider than itself");
        assert!(!holds(Wider(s("?h"), s("?x"))));
        assert!(
            !holds(Wider(s("?x"), s("?i"))),
            "f32 does not hold every i32"
        );
        // A shape attribute has no dtype.
        assert!(!holds(IsFloat(s("?s"))));
        assert!(holds(Not(Box::new(IsFloat(s("?s"))))));
    }

    #[test]
    fn shape_conditions_read_tensors_and_shape_attributes() {
        use Condition::*;
        assert!(holds(SameShape(s("?x"), s("?s"))));
        assert!(holds(SameShape(s("?x"), s("?h"))));
        assert!(!holds(SameShape(s("?x"), s("?v"))));
        assert!(holds(BroadcastsTo(s("?v"), s("?x"))));
        assert!(holds(BroadcastsTo(s("?s3"), s("?s"))));
        assert!(!holds(BroadcastsTo(s("?x"), s("?v"))));
        // A negative entry is not a shape.
        assert!(!holds(SameShape(s("?neg"), s("?neg"))));
        assert!(holds(Rank(s("?x"), 2)));
        assert!(holds(Rank(s("?s3"), 1)));
        assert!(!holds(Rank(s("?v"), 2)));
        assert!(holds(DropsLeadingAxis(s("?s3"), s("?x"))));
        assert!(holds(DropsLeadingAxis(s("?v"), s("?x"))));
        assert!(!holds(DropsLeadingAxis(s("?s"), s("?x"))));
        assert!(!holds(DropsLeadingAxis(s("?s3"), s("?v"))));
        assert!(constant_along_last_axis(&[4, 1], &[4, 6]));
        assert!(constant_along_last_axis(&[2, 1, 1], &[2, 4, 6]));
        assert!(constant_along_last_axis(&[], &[4, 6]));
        assert!(
            !constant_along_last_axis(&[6], &[4, 6]),
            "a per-column value"
        );
        assert!(!constant_along_last_axis(&[4, 6], &[4, 6]));
        assert!(
            !constant_along_last_axis(&[3, 1], &[4, 6]),
            "does not broadcast"
        );
        // Permutations: [0, 1] keeps x's axes, [-2, -1] too, [1, 0] and a wrong rank do not;
        // an absent perm reverses, the identity only up to rank 1.
        assert!(holds(IdentityPerm(s("?id"), s("?x"))));
        assert!(holds(IdentityPerm(s("?idneg"), s("?x"))));
        assert!(!holds(IdentityPerm(s("?swap"), s("?x"))));
        assert!(!holds(IdentityPerm(s("?id"), s("?v"))));
        assert!(holds(IdentityPerm(s("?noperm"), s("?v"))));
        assert!(!holds(IdentityPerm(s("?noperm"), s("?x"))));
    }

    #[test]
    fn keeps_type_compares_the_matched_root() {
        use Condition::*;
        // The root is x * 1 with x f32[2, 3]: the type of x.
        assert!(holds(KeepsType(s("?x"))));
        assert!(!holds(KeepsType(s("?h"))));
        assert!(!holds(KeepsType(s("?v"))));
        assert!(holds(KeepsType(s("?one"))));
    }

    #[test]
    fn constant_conditions() {
        use Condition::*;
        assert!(holds(IsConst(s("?quarter"))));
        assert!(holds(IsConst(s("?one"))), "a broadcast constant is uniform");
        assert!(!holds(IsConst(s("?x"))));
        assert!(holds(ConstEq(s("?one"), 1.0)));
        assert!(holds(ConstEq(s("?quarter"), 0.25)));
        assert!(holds(ConstEq(s("?num"), 0.25)), "a number attribute");
        assert!(!holds(ConstEq(s("?nan"), f64::NAN)), "NaN equals nothing");
        assert!(holds(ConstEq(s("?negzero"), 0.0)), "-0.0 == 0.0");
        assert!(holds(ConstPowerOfTwo(s("?quarter"))));
        assert!(holds(ConstPowerOfTwo(s("?num"))));
        assert!(holds(ConstPowerOfTwo(s("?one"))));
        assert!(!holds(ConstPowerOfTwo(s("?three"))));
        // 2^-16 is an f16 value, but its reciprocal 2^16 is not.
        assert!(!holds(ConstPowerOfTwo(s("?tiny"))));
        assert!(!holds(ConstPowerOfTwo(s("?x"))));
        // Unbound variables make a condition false.
        assert!(!holds(IsConst(s("?nobody"))));
        assert!(holds(Not(Box::new(IsConst(s("?nobody"))))));
    }

    #[test]
    fn powers_of_two_and_their_reciprocals() {
        assert_eq!(exponent_of_power_of_two(8.0), Some(3));
        assert_eq!(exponent_of_power_of_two(-0.25), Some(-2));
        assert_eq!(exponent_of_power_of_two(3.0), None);
        assert_eq!(exponent_of_power_of_two(0.0), None);
        assert_eq!(exponent_of_power_of_two(f64::INFINITY), None);
        assert_eq!(
            exponent_of_power_of_two(f64::MIN_POSITIVE / 4.0),
            Some(-1024)
        );
        assert_eq!(pow2(-1074), Some(5e-324));
        assert_eq!(pow2(10), Some(1024.0));
        assert_eq!(pow2(1024), None);
        // f16: 2^15 and 2^-15 (subnormal) are both exact; 2^16 overflows to inf.
        assert!(power_of_two_with_exact_reciprocal(
            32768.0,
            Some(DType::F16)
        ));
        assert!(power_of_two_with_exact_reciprocal(
            1.0 / 32768.0,
            Some(DType::F16)
        ));
        assert!(!power_of_two_with_exact_reciprocal(
            1.0 / 65536.0,
            Some(DType::F16)
        ));
        assert!(power_of_two_with_exact_reciprocal(
            1.0 / 65536.0,
            Some(DType::F32)
        ));
        // Integers hold no reciprocal but 1's.
        assert!(!power_of_two_with_exact_reciprocal(4.0, Some(DType::I32)));
        assert!(power_of_two_with_exact_reciprocal(-1.0, Some(DType::I32)));
        // Attributes: f16's range decides.
        assert!(power_of_two_with_exact_reciprocal(-0.5, None));
        assert!(!power_of_two_with_exact_reciprocal(65536.0, None));
        // 2^1023's reciprocal 2^-1023 is subnormal but exact in f64; 2^-1074's is not an f64.
        assert!(power_of_two_with_exact_reciprocal(
            2f64.powi(1023),
            Some(DType::F64)
        ));
        assert!(!power_of_two_with_exact_reciprocal(
            2f64.powi(-1074),
            Some(DType::F64)
        ));
    }

    #[test]
    fn wider_is_exact_representation() {
        use DType::*;
        assert!(represents(F32, F16));
        assert!(represents(F32, BF16));
        assert!(!represents(F16, BF16));
        assert!(!represents(BF16, F16));
        assert!(!represents(F32, I32));
        assert!(represents(F64, I32));
        assert!(!represents(F64, I64));
        assert!(represents(F16, Bool));
        assert!(!represents(F16, F32));
        assert!(!represents(Bool, I32));
        assert!(represents(F16, U8));
        assert!(represents(BF16, I8));
        assert!(!represents(BF16, I16));
        assert!(represents(F32, U16));
        assert!(!represents(F32, U32));
        assert!(represents(F64, U32));
        assert!(represents(I16, U8));
        assert!(!represents(I16, U16));
        assert!(!represents(U32, I8));
        assert!(represents(I64, U32));
    }
}
