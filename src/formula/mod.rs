//! The formula language that rule files use to define pointwise ops.
//!
//! Pointwise ops are data, not code: a rule file says `"1 / (1 + exp(-x))"`
//! and every backend (the reference interpreter here, the C/CUDA emitters
//! later) works from the same parsed [`Expr`]. The set of functions is
//! deliberately closed ([`Func`]) so a rule file can never smuggle raw code
//! into a generated kernel; anything outside the grammar is a parse error.

use std::collections::BTreeSet;
use std::fmt;

pub mod eval;
mod parse;

pub use eval::{Bindings, Scalar, WrappingInt, evaluate};
pub use parse::parse;

/// The most terms (numbers, names, operators and function calls, as written) one formula may
/// have. A formula is inlined into every kernel that uses its op, and a kernel body's size is
/// what a C or CUDA compiler's time grows with; a 2,048-term formula already takes seconds to
/// compile, so a formula far beyond that is refused where it is written rather than left to
/// stall a compile. How many terms a *fused kernel* may hold is `max_kernel_terms` in
/// fusion.ron, which users tune; this bound is on one formula and is fixed.
pub const MAX_FORMULA_TERMS: usize = 16_384;

/// A parsed formula. Kept minimal (no separate unary plus, no parentheses
/// node) so that structurally equal formulas compare equal after parsing.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Num(f64),
    Var(String),
    Neg(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
}

/// Binary operators. Comparisons live here too (they yield 1 or 0) so that
/// masks such as `(x > 0) * g` need no separate boolean type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// The complete set of callable primitives. Every backend must implement
/// each of these, which is why the list is closed rather than extensible
/// from rule files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Func {
    Exp,
    Log,
    Log1p,
    Expm1,
    Sqrt,
    Rsqrt,
    Tanh,
    Erf,
    Abs,
    Floor,
    Sin,
    Cos,
    Atan,
    Min,
    Max,
    Pow,
    Select,
}

impl Func {
    /// Every function, so callers (suggestions, backends' coverage tests)
    /// can enumerate the language without repeating the list.
    pub const ALL: [Func; 17] = [
        Func::Exp,
        Func::Log,
        Func::Log1p,
        Func::Expm1,
        Func::Sqrt,
        Func::Rsqrt,
        Func::Tanh,
        Func::Erf,
        Func::Abs,
        Func::Floor,
        Func::Sin,
        Func::Cos,
        Func::Atan,
        Func::Min,
        Func::Max,
        Func::Pow,
        Func::Select,
    ];

    /// Whether evaluating it costs a call's worth of work: every function but `select`,
    /// `min`, `max`, `abs` and `floor`, which are a few instructions. What a row kernel keeps
    /// from an earlier pass rather than computes again is decided by this
    /// (`KernelIr::row_kept`), and priced by it (`Expr::calls_or_divides`).
    pub fn costs_a_call(self) -> bool {
        !matches!(
            self,
            Func::Select | Func::Min | Func::Max | Func::Abs | Func::Floor
        )
    }

    /// The spelling used in formulas.
    pub fn name(self) -> &'static str {
        match self {
            Func::Exp => "exp",
            Func::Log => "log",
            Func::Log1p => "log1p",
            Func::Expm1 => "expm1",
            Func::Sqrt => "sqrt",
            Func::Rsqrt => "rsqrt",
            Func::Tanh => "tanh",
            Func::Erf => "erf",
            Func::Abs => "abs",
            Func::Floor => "floor",
            Func::Sin => "sin",
            Func::Cos => "cos",
            Func::Atan => "atan",
            Func::Min => "min",
            Func::Max => "max",
            Func::Pow => "pow",
            Func::Select => "select",
        }
    }

    /// Exact number of arguments; the parser rejects any other count so
    /// backends never have to handle a malformed call.
    pub fn arity(self) -> usize {
        match self {
            Func::Min | Func::Max | Func::Pow => 2,
            Func::Select => 3,
            _ => 1,
        }
    }

    /// Inverse of [`Func::name`]; case-sensitive, like the rest of the language.
    pub fn from_name(name: &str) -> Option<Func> {
        Func::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl BinOp {
    /// The spelling used in formulas.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
        }
    }

    /// Binding strength, shared by the parser's grammar and the printer's
    /// parenthesisation so the two cannot disagree.
    fn precedence(self) -> u8 {
        match self {
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne => PREC_CMP,
            BinOp::Add | BinOp::Sub => PREC_ADD,
            BinOp::Mul | BinOp::Div => PREC_MUL,
        }
    }
}

const PREC_CMP: u8 = 1;
const PREC_ADD: u8 = 2;
const PREC_MUL: u8 = 3;
const PREC_UNARY: u8 = 4;
const PREC_ATOM: u8 = 5;

/// A parse failure, located so a rule author can find it in a long formula.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} at character {column}")]
pub struct FormulaError {
    pub message: String,
    /// 0-based char offset into the formula text
    pub offset: usize,
    /// 1-based column (= offset + 1)
    pub column: usize,
}

impl FormulaError {
    pub(crate) fn new(message: impl Into<String>, offset: usize) -> Self {
        FormulaError {
            message: message.into(),
            offset,
            column: offset + 1,
        }
    }
}

impl Expr {
    /// How many nodes the tree has: numbers, names, operators and calls, each once. The
    /// kernel lowering inlines a formula node by node, so this is the size of the code one use
    /// of the op generates; the parser refuses formulas larger than [`MAX_FORMULA_TERMS`].
    pub fn size(&self) -> usize {
        match self {
            Expr::Num(_) | Expr::Var(_) => 1,
            Expr::Neg(e) => 1 + e.size(),
            Expr::Binary(_, l, r) => 1 + l.size() + r.size(),
            Expr::Call(_, args) => 1 + args.iter().map(Expr::size).sum::<usize>(),
        }
    }

    /// Whether evaluating the tree calls a function that [`Func::costs_a_call`] or divides:
    /// the work a row kernel keeps from an earlier pass rather than repeat
    /// (`KernelIr::row_kept`, which asks the same of the instructions a value is computed by).
    pub fn calls_or_divides(&self) -> bool {
        match self {
            Expr::Num(_) | Expr::Var(_) => false,
            Expr::Neg(e) => e.calls_or_divides(),
            Expr::Binary(op, l, r) => {
                *op == BinOp::Div || l.calls_or_divides() || r.calls_or_divides()
            }
            Expr::Call(f, args) => f.costs_a_call() || args.iter().any(Expr::calls_or_divides),
        }
    }

    /// Variables used, sorted, deduplicated.
    pub fn variables(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        self.collect_variables(&mut seen);
        seen.into_iter().map(str::to_owned).collect()
    }

    fn collect_variables<'a>(&'a self, seen: &mut BTreeSet<&'a str>) {
        match self {
            Expr::Num(_) => {}
            Expr::Var(name) => {
                seen.insert(name);
            }
            Expr::Neg(e) => e.collect_variables(seen),
            Expr::Binary(_, l, r) => {
                l.collect_variables(seen);
                r.collect_variables(seen);
            }
            Expr::Call(_, args) => args.iter().for_each(|a| a.collect_variables(seen)),
        }
    }

    /// How tightly this node binds when printed, to decide where the
    /// printer needs parentheses.
    fn precedence(&self) -> u8 {
        match self {
            Expr::Binary(op, _, _) => op.precedence(),
            Expr::Neg(_) => PREC_UNARY,
            // Negative and non-finite numbers print in their own parentheses.
            Expr::Num(_) | Expr::Var(_) | Expr::Call(_, _) => PREC_ATOM,
        }
    }
}

/// Writes `e`, parenthesised when `needs_parens`.
fn write_operand(f: &mut fmt::Formatter<'_>, e: &Expr, needs_parens: bool) -> fmt::Result {
    if needs_parens {
        write!(f, "({e})")
    } else {
        write!(f, "{e}")
    }
}

/// Prints a formula that parses back to the same tree, with only the
/// parentheses the grammar requires, so generated rules and error messages
/// stay readable.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Num(v) => {
                // The grammar has no negative or non-finite literals, so
                // write those as small expressions that evaluate to the same
                // value. `{:?}` is the shortest text that round-trips exactly.
                if v.is_nan() {
                    f.write_str("(0.0 / 0.0)")
                } else if v.is_infinite() {
                    let sign = if *v < 0.0 { "-" } else { "" };
                    write!(f, "({sign}1.0 / 0.0)")
                } else if v.is_sign_negative() {
                    write!(f, "(-{:?})", -v)
                } else {
                    write!(f, "{v:?}")
                }
            }
            Expr::Var(name) => f.write_str(name),
            Expr::Neg(e) => {
                f.write_str("-")?;
                write_operand(f, e, e.precedence() < PREC_UNARY)
            }
            Expr::Binary(op, l, r) => {
                let prec = op.precedence();
                // Left-associative operators: equal precedence on the left
                // needs no parentheses, except for comparisons, which do not
                // chain at all.
                let left_parens =
                    l.precedence() < prec || (prec == PREC_CMP && l.precedence() == PREC_CMP);
                write_operand(f, l, left_parens)?;
                write!(f, " {} ", op.symbol())?;
                write_operand(f, r, r.precedence() <= prec)
            }
            Expr::Call(func, args) => {
                write!(f, "{}(", func.name())?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str(")")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn func_table_is_consistent() {
        for f in Func::ALL {
            assert_eq!(Func::from_name(f.name()), Some(f));
        }
        assert_eq!(Func::from_name("Exp"), None);
        assert_eq!(Func::Select.arity(), 3);
        assert_eq!(Func::Pow.arity(), 2);
        assert_eq!(Func::Erf.arity(), 1);
    }

    #[test]
    fn variables_sorted_and_deduplicated() {
        let e = parse("y * x + min(x, max(b, y)) - a").unwrap();
        assert_eq!(e.variables(), vec!["a", "b", "x", "y"]);
        assert!(parse("1 + 2").unwrap().variables().is_empty());
    }

    #[test]
    fn display_uses_minimal_parentheses() {
        let cases = [
            ("1 - (2 - 3)", "1.0 - (2.0 - 3.0)"),
            ("(1 - 2) - 3", "1.0 - 2.0 - 3.0"),
            ("(a * b) + c", "a * b + c"),
            ("a * (b + c)", "a * (b + c)"),
            ("-(x * y)", "-(x * y)"),
            ("(-x) * y", "-x * y"),
            ("2 * -x", "2.0 * -x"),
            ("(a < b) < c", "(a < b) < c"),
            ("a < (b < c)", "a < (b < c)"),
            ("a + b < c * d", "a + b < c * d"),
            ("select(x > 0, x, 0.01 * x)", "select(x > 0.0, x, 0.01 * x)"),
            ("1e-3 + .5", "0.001 + 0.5"),
        ];
        for (src, want) in cases {
            assert_eq!(parse(src).unwrap().to_string(), want, "{src}");
        }
    }

    #[test]
    fn display_of_unparseable_numbers_reparses_to_same_value() {
        for v in [-2.5, -0.0, f64::INFINITY, f64::NEG_INFINITY] {
            let text = Expr::Num(v).to_string();
            let back: Vec<f64> =
                evaluate::<f64>(&parse(&text).unwrap(), &Bindings::new(1), 1).unwrap();
            assert_eq!(back[0].to_bits(), v.to_bits(), "{text}");
        }
        let nan = Expr::Num(f64::NAN).to_string();
        let back: Vec<f64> = evaluate::<f64>(&parse(&nan).unwrap(), &Bindings::new(1), 1).unwrap();
        assert!(back[0].is_nan());
    }

    fn arb_expr() -> impl Strategy<Value = Expr> {
        let num = prop_oneof![
            (0u32..1000).prop_map(|n| Expr::Num(f64::from(n))),
            (0.0f64..1e6).prop_map(Expr::Num),
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(|v| Expr::Num(v.abs())),
        ];
        let name = prop_oneof![
            "[a-z_][a-z0-9_]{0,4}",
            Just("min".to_owned()),
            Just("max".to_owned()),
            Just("exp".to_owned()),
        ];
        let leaf = prop_oneof![num, name.prop_map(Expr::Var)];
        leaf.prop_recursive(5, 64, 3, |inner| {
            let ops = proptest::sample::select(vec![
                BinOp::Add,
                BinOp::Sub,
                BinOp::Mul,
                BinOp::Div,
                BinOp::Lt,
                BinOp::Le,
                BinOp::Gt,
                BinOp::Ge,
                BinOp::Eq,
                BinOp::Ne,
            ]);
            prop_oneof![
                inner.clone().prop_map(|e| Expr::Neg(Box::new(e))),
                (ops, inner.clone(), inner.clone()).prop_map(|(op, l, r)| Expr::Binary(
                    op,
                    Box::new(l),
                    Box::new(r)
                )),
                (
                    proptest::sample::select(Func::ALL.to_vec()),
                    proptest::collection::vec(inner, 3)
                )
                    .prop_map(|(f, mut args)| {
                        args.truncate(f.arity());
                        Expr::Call(f, args)
                    }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn display_round_trips(e in arb_expr()) {
            let text = e.to_string();
            let back = parse(&text);
            prop_assert_eq!(back.as_ref(), Ok(&e), "text: {}", text);
        }
    }
}
