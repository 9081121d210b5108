//! Reference interpreter for formulas.
//!
//! This is the ground truth that generated kernels are checked against, so
//! its semantics follow eager PyTorch exactly (NaN-propagating `min`/`max`,
//! IEEE results for `log(0)` and friends) and it computes in the precision
//! of the dtype, rounding every intermediate result the way a kernel would.
//!
//! It evaluates whole arrays per tree node instead of walking the tree per
//! element: the per-node dispatch is paid once, and the inner loops are
//! simple enough for the compiler to vectorise, which keeps multi-million
//! element checks fast.

use std::collections::HashMap;
use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Neg, Sub};

use super::{BinOp, Expr, Func};

/// Arithmetic the interpreter needs; implemented for f32 and f64 so a formula can be evaluated at the compute precision of its dtype (f16/bf16/f32 compute in f32; f64 in f64).
pub trait Scalar:
    Copy
    + PartialOrd
    + Debug
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn exp_m1(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn abs(self) -> Self;
    fn floor(self) -> Self;
    fn sin(self) -> Self;
    fn atan(self) -> Self;
    fn cos(self) -> Self;
    fn powf(self, exponent: Self) -> Self;
    /// `1 / sqrt(x)`, rounded twice at float precisions.
    fn rsqrt(self) -> Self {
        Self::from_f64(1.0) / self.sqrt()
    }
    fn is_nan(self) -> bool;
    fn is_sign_negative(self) -> bool;
}

macro_rules! impl_scalar {
    ($t:ident, $erf:path) => {
        impl Scalar for $t {
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            // Paths like `f32::exp` resolve to the inherent methods, so these
            // forward to std rather than recursing.
            fn exp(self) -> Self {
                $t::exp(self)
            }
            fn ln(self) -> Self {
                $t::ln(self)
            }
            fn ln_1p(self) -> Self {
                $t::ln_1p(self)
            }
            fn exp_m1(self) -> Self {
                $t::exp_m1(self)
            }
            fn sqrt(self) -> Self {
                $t::sqrt(self)
            }
            fn tanh(self) -> Self {
                $t::tanh(self)
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            fn abs(self) -> Self {
                $t::abs(self)
            }
            fn floor(self) -> Self {
                $t::floor(self)
            }
            fn sin(self) -> Self {
                $t::sin(self)
            }
            fn atan(self) -> Self {
                $t::atan(self)
            }
            fn cos(self) -> Self {
                $t::cos(self)
            }
            fn powf(self, exponent: Self) -> Self {
                $t::powf(self, exponent)
            }
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
            fn is_sign_negative(self) -> bool {
                $t::is_sign_negative(self)
            }
        }
    };
}

impl_scalar!(f32, libm::erff);
impl_scalar!(f64, libm::erf);

/// An integer at the compute precision of the integer dtypes: 64-bit two's complement with
/// wrap-around, as NumPy computes `int64` (and `int32`, whose values this holds exactly: the
/// low 32 bits of a wrapped 64-bit sum, difference or product are those of the 32-bit one, so
/// rounding the result to `i32` afterwards gives NumPy's `int32` answer).
///
/// `+`, `-`, `*`, unary `-`, `abs` (`abs(i64::MIN)` is `i64::MIN`), `min`, `max`, `select`
/// and comparisons are exact integer operations. Every other primitive (`/`, `exp`, `pow`,
/// `floor`, …) has no integer meaning in the language: it converts its operands to f64, computes
/// there and converts back as a cast does (toward zero, saturating, NaN → 0). The catalogue's
/// ops never reach those on integers (their dtype rule makes them float), only custom ops do.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Hash)]
pub struct WrappingInt(pub i64);

impl WrappingInt {
    fn via_f64(self, f: impl Fn(f64) -> f64) -> Self {
        WrappingInt(f(self.0 as f64) as i64)
    }
}

impl Add for WrappingInt {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        WrappingInt(self.0.wrapping_add(o.0))
    }
}

impl Sub for WrappingInt {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        WrappingInt(self.0.wrapping_sub(o.0))
    }
}

impl Mul for WrappingInt {
    type Output = Self;
    fn mul(self, o: Self) -> Self {
        WrappingInt(self.0.wrapping_mul(o.0))
    }
}

impl Div for WrappingInt {
    type Output = Self;
    fn div(self, o: Self) -> Self {
        WrappingInt((self.0 as f64 / o.0 as f64) as i64)
    }
}

impl Neg for WrappingInt {
    type Output = Self;
    fn neg(self) -> Self {
        WrappingInt(self.0.wrapping_neg())
    }
}

impl Scalar for WrappingInt {
    fn from_f64(v: f64) -> Self {
        WrappingInt(v as i64)
    }
    fn to_f64(self) -> f64 {
        self.0 as f64
    }
    fn exp(self) -> Self {
        self.via_f64(f64::exp)
    }
    fn ln(self) -> Self {
        self.via_f64(f64::ln)
    }
    fn ln_1p(self) -> Self {
        self.via_f64(f64::ln_1p)
    }
    fn exp_m1(self) -> Self {
        self.via_f64(f64::exp_m1)
    }
    fn sqrt(self) -> Self {
        self.via_f64(f64::sqrt)
    }
    fn tanh(self) -> Self {
        self.via_f64(f64::tanh)
    }
    fn erf(self) -> Self {
        self.via_f64(libm::erf)
    }
    fn abs(self) -> Self {
        WrappingInt(self.0.wrapping_abs())
    }
    fn floor(self) -> Self {
        self.via_f64(f64::floor)
    }
    fn sin(self) -> Self {
        self.via_f64(f64::sin)
    }
    fn atan(self) -> Self {
        self.via_f64(f64::atan)
    }
    fn cos(self) -> Self {
        self.via_f64(f64::cos)
    }
    fn powf(self, exponent: Self) -> Self {
        WrappingInt((self.0 as f64).powf(exponent.0 as f64) as i64)
    }
    fn rsqrt(self) -> Self {
        self.via_f64(|x| 1.0 / x.sqrt())
    }
    fn is_nan(self) -> bool {
        false
    }
    fn is_sign_negative(self) -> bool {
        self.0 < 0
    }
}

/// Values bound to variables: each is a slice either of length `len` or of length 1 (a scalar broadcast to all elements).
///
/// Borrowing the slices means large inputs are never copied just to be read.
#[derive(Debug, Clone)]
pub struct Bindings<'a, S> {
    len: usize,
    values: HashMap<String, &'a [S]>,
}

impl<'a, S> Bindings<'a, S> {
    /// Bindings for evaluating over `len` elements; [`evaluate`] must be
    /// called with the same `len`, which it checks.
    pub fn new(len: usize) -> Self {
        Bindings {
            len,
            values: HashMap::new(),
        }
    }

    /// Binds `name` to `values` (length `len`, or 1 to broadcast). A later
    /// binding of the same name replaces the earlier one.
    pub fn bind(mut self, name: &str, values: &'a [S]) -> Self {
        self.values.insert(name.to_owned(), values);
        self
    }

    /// The element count these bindings were made for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether these bindings describe zero elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Why a formula cannot be evaluated over its bindings: the caller bound too little or bound
/// values of the wrong length (rule files are checked, so this is the caller's mistake).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error("bindings were made for {made} elements but evaluation asked for {asked}")]
    Length { made: usize, asked: usize },
    #[error("unbound variable `{0}`")]
    Unbound(String),
    #[error("variable `{name}` has {values} values, expected {len} or 1")]
    Values {
        name: String,
        values: usize,
        len: usize,
    },
    /// A call with the wrong number of arguments (only a hand-built tree has one).
    #[error("function `{function}` takes {arity} arguments, got {got}")]
    Arity {
        function: &'static str,
        arity: usize,
        got: usize,
    },
}

/// Evaluate `expr` elementwise over `len` elements; a [`BindingError`] names an unbound
/// variable, or one bound to a slice of the wrong length.
pub fn evaluate<S: Scalar>(
    expr: &Expr,
    bindings: &Bindings<S>,
    len: usize,
) -> Result<Vec<S>, BindingError> {
    if bindings.len != len {
        return Err(BindingError::Length {
            made: bindings.len,
            asked: len,
        });
    }
    Ok(match eval_node(expr, bindings, len)? {
        Value::Scalar(s) => vec![s; len],
        Value::Slice(v) => v.to_vec(),
        Value::Owned(v) => v,
    })
}

/// One node's result. Scalars stay scalar until combined with an array so
/// constant subexpressions cost one operation, not `len`; bound arrays are
/// borrowed until some operation has to produce new values.
enum Value<'a, S> {
    Scalar(S),
    Slice(&'a [S]),
    Owned(Vec<S>),
}

/// A read-only look at a [`Value`], so combining code needs only two cases.
#[derive(Clone, Copy)]
enum View<'v, S> {
    Scalar(S),
    Array(&'v [S]),
}

impl<S: Scalar> View<'_, S> {
    fn at(self, i: usize) -> S {
        match self {
            View::Scalar(s) => s,
            View::Array(a) => a[i],
        }
    }
}

impl<S: Scalar> Value<'_, S> {
    fn view(&self) -> View<'_, S> {
        match self {
            Value::Scalar(s) => View::Scalar(*s),
            Value::Slice(a) => View::Array(a),
            Value::Owned(a) => View::Array(a),
        }
    }
}

fn map1<'a, S: Scalar>(v: Value<'a, S>, f: impl Fn(S) -> S) -> Value<'a, S> {
    match v {
        Value::Scalar(s) => Value::Scalar(f(s)),
        Value::Slice(a) => Value::Owned(a.iter().map(|&x| f(x)).collect()),
        Value::Owned(mut a) => {
            // Reuse the buffer: nothing else refers to it.
            a.iter_mut().for_each(|x| *x = f(*x));
            Value::Owned(a)
        }
    }
}

fn map2<'a, S: Scalar>(a: Value<'a, S>, b: Value<'a, S>, f: impl Fn(S, S) -> S) -> Value<'a, S> {
    match (a.view(), b.view()) {
        (View::Scalar(x), View::Scalar(y)) => Value::Scalar(f(x, y)),
        (View::Array(xs), View::Scalar(y)) => Value::Owned(xs.iter().map(|&x| f(x, y)).collect()),
        (View::Scalar(x), View::Array(ys)) => Value::Owned(ys.iter().map(|&y| f(x, y)).collect()),
        (View::Array(xs), View::Array(ys)) => {
            Value::Owned(xs.iter().zip(ys).map(|(&x, &y)| f(x, y)).collect())
        }
    }
}

fn map3<'a, S: Scalar>(
    a: Value<'a, S>,
    b: Value<'a, S>,
    c: Value<'a, S>,
    len: usize,
    f: impl Fn(S, S, S) -> S,
) -> Value<'a, S> {
    let (x, y, z) = (a.view(), b.view(), c.view());
    if let (View::Scalar(x), View::Scalar(y), View::Scalar(z)) = (x, y, z) {
        return Value::Scalar(f(x, y, z));
    }
    Value::Owned((0..len).map(|i| f(x.at(i), y.at(i), z.at(i))).collect())
}

fn truth<S: Scalar>(b: bool) -> S {
    S::from_f64(if b { 1.0 } else { 0.0 })
}

/// PyTorch's `minimum`: NaN wins, and -0 is below +0.
fn nan_min<S: Scalar>(a: S, b: S) -> S {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// PyTorch's `maximum`: NaN wins, and +0 is above -0.
fn nan_max<S: Scalar>(a: S, b: S) -> S {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a > b || (a == b && !a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn eval_node<'a, S: Scalar>(
    expr: &Expr,
    bindings: &Bindings<'a, S>,
    len: usize,
) -> Result<Value<'a, S>, BindingError> {
    Ok(match expr {
        Expr::Num(v) => Value::Scalar(S::from_f64(*v)),
        Expr::Var(name) => {
            let values = *bindings
                .values
                .get(name)
                .ok_or_else(|| BindingError::Unbound(name.clone()))?;
            match values.len() {
                1 => Value::Scalar(values[0]),
                n if n == len => Value::Slice(values),
                n => {
                    return Err(BindingError::Values {
                        name: name.clone(),
                        values: n,
                        len,
                    });
                }
            }
        }
        Expr::Neg(e) => map1(eval_node(e, bindings, len)?, |x| -x),
        Expr::Binary(op, l, r) => {
            let a = eval_node(l, bindings, len)?;
            let b = eval_node(r, bindings, len)?;
            match op {
                BinOp::Add => map2(a, b, |x, y| x + y),
                BinOp::Sub => map2(a, b, |x, y| x - y),
                BinOp::Mul => map2(a, b, |x, y| x * y),
                BinOp::Div => map2(a, b, |x, y| x / y),
                BinOp::Lt => map2(a, b, |x, y| truth(x < y)),
                BinOp::Le => map2(a, b, |x, y| truth(x <= y)),
                BinOp::Gt => map2(a, b, |x, y| truth(x > y)),
                BinOp::Ge => map2(a, b, |x, y| truth(x >= y)),
                BinOp::Eq => map2(a, b, |x, y| truth(x == y)),
                BinOp::Ne => map2(a, b, |x, y| truth(x != y)),
            }
        }
        Expr::Call(func, args) => {
            let mut values = Vec::with_capacity(args.len());
            for a in args {
                values.push(eval_node(a, bindings, len)?);
            }
            if values.len() != func.arity() {
                // Only reachable for hand-built trees; parsed ones are checked.
                return Err(BindingError::Arity {
                    function: func.name(),
                    arity: func.arity(),
                    got: values.len(),
                });
            }
            let mut it = values.into_iter();
            let mut arg = || it.next().expect("arity checked above");
            match func {
                Func::Exp => map1(arg(), S::exp),
                Func::Log => map1(arg(), S::ln),
                Func::Log1p => map1(arg(), S::ln_1p),
                Func::Expm1 => map1(arg(), S::exp_m1),
                Func::Sqrt => map1(arg(), S::sqrt),
                Func::Rsqrt => map1(arg(), S::rsqrt),
                Func::Tanh => map1(arg(), S::tanh),
                Func::Erf => map1(arg(), S::erf),
                Func::Abs => map1(arg(), S::abs),
                Func::Floor => map1(arg(), S::floor),
                Func::Sin => map1(arg(), S::sin),
                Func::Atan => map1(arg(), S::atan),
                Func::Cos => map1(arg(), S::cos),
                Func::Min => map2(arg(), arg(), nan_min),
                Func::Max => map2(arg(), arg(), nan_max),
                Func::Pow => map2(arg(), arg(), S::powf),
                Func::Select => {
                    let zero = S::from_f64(0.0);
                    map3(
                        arg(),
                        arg(),
                        arg(),
                        len,
                        |c, a, b| if c != zero { a } else { b },
                    )
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formula::parse;

    fn eval64(formula: &str, vars: &[(&str, &[f64])], len: usize) -> Vec<f64> {
        let mut b = Bindings::new(len);
        for (name, values) in vars {
            b = b.bind(name, values);
        }
        evaluate(&parse(formula).unwrap(), &b, len).unwrap()
    }

    fn one(formula: &str, x: f64) -> f64 {
        eval64(formula, &[("x", &[x])], 1)[0]
    }

    #[test]
    fn sigmoid_at_zero_is_half() {
        assert_eq!(one("1 / (1 + exp(-x))", 0.0), 0.5);
        let f32_result: Vec<f32> = evaluate(
            &parse("1 / (1 + exp(-x))").unwrap(),
            &Bindings::new(1).bind("x", &[0.0f32]),
            1,
        )
        .unwrap();
        assert_eq!(f32_result, vec![0.5f32]);
    }

    #[test]
    fn known_function_values() {
        assert_eq!(one("erf(x)", 1.0), 0.8427007929497149);
        assert_eq!(one("erf(x)", 0.0), 0.0);
        assert_eq!(one("log(x)", 0.0), f64::NEG_INFINITY);
        assert!(one("sqrt(x)", -1.0).is_nan());
        assert_eq!(one("rsqrt(x)", 4.0), 0.5);
        assert_eq!(one("pow(x, 3)", 2.0), 8.0);
        assert_eq!(one("floor(x)", -1.5), -2.0);
        assert_eq!(one("abs(x)", -3.0), 3.0);
        assert_eq!(one("exp(x)", 0.0), 1.0);
        assert_eq!(one("expm1(x)", 0.0), 0.0);
        assert_eq!(one("log1p(x)", 0.0), 0.0);
        assert_eq!(one("tanh(x)", 0.0), 0.0);
        assert_eq!(one("sin(x) + cos(x)", 0.0), 1.0);
        // softplus(0) = log(2)
        assert_eq!(
            one("max(x, 0) + log1p(exp(-abs(x)))", 0.0),
            std::f64::consts::LN_2
        );
    }

    #[test]
    fn precedence_values() {
        assert_eq!(one("1 - 2 - 3", 0.0), -4.0);
        assert_eq!(one("2 * 3 + 4 * 5", 0.0), 26.0);
        assert_eq!(one("-2 * 3", 0.0), -6.0);
        assert_eq!(one("2 * -3", 0.0), -6.0);
        assert_eq!(one("8 / 4 / 2", 0.0), 1.0);
        assert_eq!(one("1 + 2 < 4", 0.0), 1.0);
    }

    #[test]
    fn min_max_propagate_nan_and_order_zeros() {
        let nan = f64::NAN;
        assert!(eval64("min(a, b)", &[("a", &[nan]), ("b", &[1.0])], 1)[0].is_nan());
        assert!(eval64("min(a, b)", &[("a", &[1.0]), ("b", &[nan])], 1)[0].is_nan());
        assert!(eval64("max(a, b)", &[("a", &[nan]), ("b", &[1.0])], 1)[0].is_nan());
        assert!(eval64("max(a, b)", &[("a", &[1.0]), ("b", &[nan])], 1)[0].is_nan());
        let zeros = [("a", &[-0.0][..]), ("b", &[0.0][..])];
        assert!(eval64("max(a, b)", &zeros, 1)[0].is_sign_positive());
        assert!(eval64("max(b, a)", &zeros, 1)[0].is_sign_positive());
        assert!(eval64("min(a, b)", &zeros, 1)[0].is_sign_negative());
        assert!(eval64("min(b, a)", &zeros, 1)[0].is_sign_negative());
        assert_eq!(
            eval64("min(a, b)", &[("a", &[1.0, 5.0]), ("b", &[3.0])], 2),
            vec![1.0, 3.0]
        );
        assert_eq!(
            eval64("max(a, b)", &[("a", &[1.0, 5.0]), ("b", &[3.0])], 2),
            vec![3.0, 5.0]
        );
        // f32 path too.
        let r: Vec<f32> = evaluate(
            &parse("max(a, b)").unwrap(),
            &Bindings::new(1).bind("a", &[f32::NAN]).bind("b", &[2.0f32]),
            1,
        )
        .unwrap();
        assert!(r[0].is_nan());
    }

    #[test]
    fn comparisons_with_nan() {
        let v = [("a", &[f64::NAN][..]), ("b", &[1.0][..])];
        for op in ["<", "<=", ">", ">=", "=="] {
            assert_eq!(eval64(&format!("a {op} b"), &v, 1), vec![0.0], "{op}");
        }
        assert_eq!(eval64("a != b", &v, 1), vec![1.0]);
        assert_eq!(eval64("b == b", &v, 1), vec![1.0]);
    }

    #[test]
    fn select_semantics() {
        let c = [1.0, 0.0, f64::NAN, -0.0, -2.0];
        let got = eval64("select(c, 10, 20)", &[("c", &c)], 5);
        assert_eq!(got, vec![10.0, 20.0, 10.0, 20.0, 10.0]);
        let x = [-1.0, 0.0, 2.0];
        assert_eq!(
            eval64("select(x > 0, x, 0.5 * x)", &[("x", &x)], 3),
            vec![-0.5, 0.0, 2.0]
        );
    }

    #[test]
    fn scalar_broadcast() {
        let got = eval64("x * s + 1", &[("x", &[1.0, 2.0, 3.0]), ("s", &[10.0])], 3);
        assert_eq!(got, vec![11.0, 21.0, 31.0]);
        // A formula of constants still yields `len` values.
        assert_eq!(eval64("2 + 3", &[], 3), vec![5.0; 3]);
        assert_eq!(eval64("s", &[("s", &[4.0])], 3), vec![4.0; 3]);
        assert_eq!(eval64("x", &[("x", &[1.0, 2.0])], 2), vec![1.0, 2.0]);
        assert!(eval64("x", &[("x", &[])], 0).is_empty());
    }

    #[test]
    fn f32_rounds_every_step() {
        // 1e8 + 1 is not representable in f32, so subtracting 1e8 gives 0
        // in f32 but 1 in f64.
        let e = parse("(x + 1) - x").unwrap();
        let r32: Vec<f32> = evaluate(&e, &Bindings::new(1).bind("x", &[1e8f32]), 1).unwrap();
        let r64: Vec<f64> = evaluate(&e, &Bindings::new(1).bind("x", &[1e8f64]), 1).unwrap();
        assert_eq!(r32, vec![0.0]);
        assert_eq!(r64, vec![1.0]);
        let erf32: Vec<f32> = evaluate(
            &parse("erf(x)").unwrap(),
            &Bindings::new(1).bind("x", &[1.0f32]),
            1,
        )
        .unwrap();
        assert_eq!(erf32[0], 0.8427007929497149f64 as f32);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = parse("x + y").unwrap();
        let err = evaluate(&e, &Bindings::new(2).bind("x", &[1.0f64, 2.0]), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unbound variable `y`"), "{err}");
        let err = evaluate(
            &e,
            &Bindings::new(2)
                .bind("x", &[1.0f64, 2.0])
                .bind("y", &[1.0, 2.0, 3.0]),
            2,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`y` has 3 values"), "{err}");
        assert!(evaluate::<f64>(&e, &Bindings::new(2), 3).is_err());
        let bad = Expr::Call(Func::Pow, vec![Expr::Num(1.0)]);
        assert!(evaluate::<f64>(&bad, &Bindings::new(1), 1).is_err());
    }

    fn int(formula: &str, vars: &[(&str, &[i64])], len: usize) -> Vec<i64> {
        let wrapped: Vec<(&str, Vec<WrappingInt>)> = vars
            .iter()
            .map(|(n, v)| (*n, v.iter().map(|&x| WrappingInt(x)).collect()))
            .collect();
        let mut b = Bindings::new(len);
        for (name, values) in &wrapped {
            b = b.bind(name, values);
        }
        let out = evaluate(&parse(formula).unwrap(), &b, len).unwrap();
        out.into_iter().map(|w| w.0).collect()
    }

    #[test]
    fn integer_arithmetic_wraps_and_compares_exactly() {
        let a = (1i64 << 52) + 1;
        assert_eq!(int("x * 3", &[("x", &[a])], 1), vec![a * 3]);
        assert_eq!(
            int("x * x", &[("x", &[i64::MAX])], 1),
            vec![i64::MAX.wrapping_mul(i64::MAX)]
        );
        assert_eq!(int("abs(x)", &[("x", &[i64::MIN])], 1), vec![i64::MIN]);
        assert_eq!(int("-x", &[("x", &[i64::MIN])], 1), vec![i64::MIN]);
        // Neighbours that f64 cannot tell apart still compare as integers.
        let (lo, hi) = ((1i64 << 53) + 1, (1i64 << 53) + 2);
        assert_eq!(int("a < b", &[("a", &[lo]), ("b", &[hi])], 1), vec![1]);
        assert_eq!(int("max(a, b)", &[("a", &[lo]), ("b", &[hi])], 1), vec![hi]);
        assert_eq!(int("min(a, b)", &[("a", &[lo]), ("b", &[hi])], 1), vec![lo]);
        assert_eq!(
            int(
                "select(c, a, b)",
                &[("c", &[0]), ("a", &[lo]), ("b", &[hi])],
                1
            ),
            vec![hi]
        );
        // Primitives without an integer meaning go through f64 and back as a cast.
        assert_eq!(int("x / 2", &[("x", &[-7])], 1), vec![-3]);
        assert_eq!(int("x / 0", &[("x", &[0])], 1), vec![0]);
    }

    #[test]
    fn large_arrays() {
        let n = 1 << 22;
        let x: Vec<f32> = (0..n).map(|i| i as f32 / n as f32 - 0.5).collect();
        let e = parse("max(x, 0) + log1p(exp(-abs(x)))").unwrap();
        let out = evaluate(&e, &Bindings::new(n).bind("x", &x), n).unwrap();
        assert_eq!(out.len(), n);
        let i = n / 2; // x == 0
        assert_eq!(out[i], std::f32::consts::LN_2);
    }
}
