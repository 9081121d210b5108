//! Lexer and recursive-descent parser for formulas.
//!
//! Rule files are hand-written, so errors carry a character position and
//! say what was expected and what was found. Input is untrusted in the
//! sense that a typo must never crash the optimizer: every path returns a
//! [`FormulaError`] rather than panicking, and nesting is capped so that a
//! pathological formula cannot overflow the stack (here or in the recursive
//! walks that later consume the tree).

use super::{BinOp, Expr, FormulaError, Func, MAX_FORMULA_TERMS};

/// Deepest parenthesis/unary nesting accepted. Real formulas use a handful
/// of levels; the cap exists only to turn stack overflow into an error.
const MAX_NESTING: usize = 256;
/// Deepest tree accepted. Long `a + b + c + ...` chains are built by a loop
/// rather than recursion, so they need their own bound: the tree they make
/// is walked recursively by the printer, the interpreter and `Drop`.
const MAX_TREE_DEPTH: usize = 256;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Ident(String),
    LParen,
    RParen,
    Comma,
    Plus,
    Minus,
    Star,
    Slash,
    Cmp(BinOp),
    End,
    /// A lexing error, kept as a token so it is reported only when the
    /// parser reaches it: errors then come out in reading order.
    Bad(FormulaError),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// Char offset of the token's first character.
    offset: usize,
    /// Source text, for "found ..." in messages.
    text: String,
}

impl Token {
    fn describe(&self) -> String {
        match &self.tok {
            Tok::End => "end of formula".to_owned(),
            Tok::Num(_) => format!("number `{}`", self.text),
            Tok::Ident(_) => format!("name `{}`", self.text),
            _ => format!("`{}`", self.text),
        }
    }
}

/// Splits the text into tokens. Stops at the first bad character, ending
/// the list with a `Bad` token; otherwise ends it with `End`.
fn lex(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let slice = |a: usize, b: usize| chars[a..b].iter().collect::<String>();
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let next = chars.get(i + 1).copied();
        let tok = if c.is_ascii_digit() || (c == '.' && next.is_some_and(|n| n.is_ascii_digit())) {
            match lex_number(&chars, &mut i) {
                Ok(v) => Tok::Num(v),
                Err(e) => Tok::Bad(e),
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            Tok::Ident(slice(start, i))
        } else {
            i += 1;
            let two = |second: char, op: BinOp, i: &mut usize| -> Option<Tok> {
                (next == Some(second)).then(|| {
                    *i += 1;
                    Tok::Cmp(op)
                })
            };
            match c {
                '(' => Tok::LParen,
                ')' => Tok::RParen,
                ',' => Tok::Comma,
                '+' => Tok::Plus,
                '-' => Tok::Minus,
                '*' => Tok::Star,
                '/' => Tok::Slash,
                '<' => two('=', BinOp::Le, &mut i).unwrap_or(Tok::Cmp(BinOp::Lt)),
                '>' => two('=', BinOp::Ge, &mut i).unwrap_or(Tok::Cmp(BinOp::Gt)),
                '=' => two('=', BinOp::Eq, &mut i).unwrap_or_else(|| {
                    Tok::Bad(FormulaError::new(
                        "unexpected character `=` (use `==` to compare)",
                        start,
                    ))
                }),
                '!' => two('=', BinOp::Ne, &mut i).unwrap_or_else(|| {
                    Tok::Bad(FormulaError::new(
                        "unexpected character `!` (only `!=` is supported)",
                        start,
                    ))
                }),
                _ => Tok::Bad(FormulaError::new(
                    format!("unexpected character `{}`", c.escape_debug()),
                    start,
                )),
            }
        };
        let stop = matches!(tok, Tok::Bad(_));
        tokens.push(Token {
            tok,
            offset: start,
            text: slice(start, i),
        });
        if stop {
            return tokens;
        }
    }
    tokens.push(Token {
        tok: Tok::End,
        offset: chars.len(),
        text: String::new(),
    });
    tokens
}

/// Reads `digits [. digits] [(e|E) [+|-] digits]` starting at `*i`, which
/// must be a digit or a `.` followed by a digit.
fn lex_number(chars: &[char], i: &mut usize) -> Result<f64, FormulaError> {
    let start = *i;
    let digits = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_ascii_digit() {
            *i += 1;
        }
    };
    digits(i);
    if chars.get(*i) == Some(&'.') {
        *i += 1;
        digits(i);
    }
    if matches!(chars.get(*i), Some('e' | 'E')) {
        *i += 1;
        if matches!(chars.get(*i), Some('+' | '-')) {
            *i += 1;
        }
        if !chars.get(*i).is_some_and(|c| c.is_ascii_digit()) {
            let text: String = chars[start..*i].iter().collect();
            return Err(FormulaError::new(
                format!("malformed number `{text}`: expected digits in the exponent"),
                start,
            ));
        }
        digits(i);
    }
    let text: String = chars[start..*i].iter().collect();
    match text.parse::<f64>() {
        // Infinity has no literal spelling when printed back, and is almost
        // certainly a mistake in a rule file.
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(FormulaError::new(
            format!("number `{text}` is out of range"),
            start,
        )),
    }
}

/// Parses a formula such as `"max(x, 0) + log1p(exp(-abs(x)))"`.
pub fn parse(text: &str) -> Result<Expr, FormulaError> {
    let tokens = lex(text);
    if tokens[0].tok == Tok::End {
        return Err(FormulaError::new("empty formula", 0));
    }
    let mut p = Parser {
        tokens,
        pos: 0,
        nesting: 0,
    };
    let (expr, _) = p.comparison()?;
    if p.peek().tok == Tok::End {
        // Checked once the text parses, so that errors come in reading order (a formula nested
        // too deeply says so at its 257th level). The tree is bounded by the text already in
        // memory, and only its depth matters for the recursive walks.
        too_many_terms(&p.tokens)?;
    }
    match p.peek().tok {
        Tok::End => Ok(expr),
        Tok::RParen => Err(FormulaError::new("unmatched `)`", p.peek().offset)),
        _ => Err(p.unexpected("an operator or end of formula")),
    }
}

/// An error at the first term past [`MAX_FORMULA_TERMS`], if there is one. Every tree node
/// comes from a token that is not a parenthesis or a comma (a unary `+` makes none), so
/// counting those tokens bounds the tree's size.
fn too_many_terms(tokens: &[Token]) -> Result<(), FormulaError> {
    let first_over = tokens
        .iter()
        .filter(|t| !matches!(t.tok, Tok::LParen | Tok::RParen | Tok::Comma | Tok::End))
        .nth(MAX_FORMULA_TERMS);
    match first_over {
        Some(token) => Err(FormulaError::new(
            format!(
                "formula has more than {MAX_FORMULA_TERMS} terms (numbers, names, operators and calls); split the op into several ops"
            ),
            token.offset,
        )),
        None => Ok(()),
    }
}

/// A subtree together with its depth, so depth checks stay O(1).
type Node = (Expr, usize);

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    nesting: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.pos]
    }

    fn advance(&mut self) {
        // The last token (End or Bad) is never consumed.
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
    }

    /// The error for finding the current token where `expected` was
    /// needed; a lexing error at that point takes precedence, since it is
    /// the real cause.
    fn unexpected(&self, expected: &str) -> FormulaError {
        let tok = self.peek();
        match &tok.tok {
            Tok::Bad(e) => e.clone(),
            _ => FormulaError::new(
                format!("expected {expected} but found {}", tok.describe()),
                tok.offset,
            ),
        }
    }

    fn node(expr: Expr, depth: usize, offset: usize) -> Result<Node, FormulaError> {
        if depth > MAX_TREE_DEPTH {
            return Err(FormulaError::new(
                format!("formula nests too deeply (more than {MAX_TREE_DEPTH} levels)"),
                offset,
            ));
        }
        Ok((expr, depth))
    }

    fn binary(op: BinOp, l: Node, r: Node, offset: usize) -> Result<Node, FormulaError> {
        let depth = l.1.max(r.1) + 1;
        Self::node(
            Expr::Binary(op, Box::new(l.0), Box::new(r.0)),
            depth,
            offset,
        )
    }

    /// `additive [cmp additive]`; comparisons do not chain because
    /// `a < b < c` would silently mean `(a < b) < c`, never what is meant.
    fn comparison(&mut self) -> Result<Node, FormulaError> {
        let left = self.additive()?;
        let Tok::Cmp(op) = self.peek().tok else {
            return Ok(left);
        };
        let offset = self.peek().offset;
        self.advance();
        let right = self.additive()?;
        if let Tok::Cmp(second) = self.peek().tok {
            return Err(FormulaError::new(
                format!(
                    "chained comparison `{}` after `{}`: add parentheses or use `select`",
                    second.symbol(),
                    op.symbol()
                ),
                self.peek().offset,
            ));
        }
        Self::binary(op, left, right, offset)
    }

    fn additive(&mut self) -> Result<Node, FormulaError> {
        let mut left = self.multiplicative()?;
        loop {
            let op = match self.peek().tok {
                Tok::Plus => BinOp::Add,
                Tok::Minus => BinOp::Sub,
                _ => return Ok(left),
            };
            let offset = self.peek().offset;
            self.advance();
            let right = self.multiplicative()?;
            left = Self::binary(op, left, right, offset)?;
        }
    }

    fn multiplicative(&mut self) -> Result<Node, FormulaError> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek().tok {
                Tok::Star => BinOp::Mul,
                Tok::Slash => BinOp::Div,
                _ => return Ok(left),
            };
            let offset = self.peek().offset;
            self.advance();
            let right = self.unary()?;
            left = Self::binary(op, left, right, offset)?;
        }
    }

    /// Every level of recursion (parentheses, call arguments, stacked signs)
    /// passes through here, so this is where nesting is counted.
    fn unary(&mut self) -> Result<Node, FormulaError> {
        let offset = self.peek().offset;
        self.nesting += 1;
        if self.nesting > MAX_NESTING {
            return Err(FormulaError::new(
                format!("formula nests too deeply (more than {MAX_NESTING} levels)"),
                offset,
            ));
        }
        let result = match self.peek().tok {
            Tok::Minus => {
                self.advance();
                let (e, d) = self.unary()?;
                Self::node(Expr::Neg(Box::new(e)), d + 1, offset)?
            }
            // Unary plus is accepted for symmetry but leaves no trace.
            Tok::Plus => {
                self.advance();
                self.unary()?
            }
            _ => self.primary()?,
        };
        self.nesting -= 1;
        Ok(result)
    }

    fn primary(&mut self) -> Result<Node, FormulaError> {
        let tok = self.peek().clone();
        match tok.tok {
            Tok::Num(v) => {
                self.advance();
                Ok((Expr::Num(v), 1))
            }
            Tok::Ident(name) => {
                self.advance();
                if self.peek().tok == Tok::LParen {
                    self.call(&name, tok.offset)
                } else {
                    Ok((Expr::Var(name), 1))
                }
            }
            Tok::LParen => {
                self.advance();
                let inner = self.comparison()?;
                self.expect_rparen("`)`")?;
                Ok(inner)
            }
            _ => Err(self.unexpected("a number, name, function call or `(`")),
        }
    }

    fn expect_rparen(&mut self, expected: &str) -> Result<(), FormulaError> {
        if self.peek().tok == Tok::RParen {
            self.advance();
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// Parses the argument list of `name(`, the `(` being the current token.
    fn call(&mut self, name: &str, offset: usize) -> Result<Node, FormulaError> {
        let Some(func) = Func::from_name(name) else {
            return Err(FormulaError::new(unknown_function_message(name), offset));
        };
        self.advance(); // `(`
        let mut args = Vec::new();
        let mut depth = 0;
        if self.peek().tok == Tok::RParen {
            self.advance();
        } else {
            loop {
                let (arg, d) = self.comparison()?;
                args.push(arg);
                depth = depth.max(d);
                if self.peek().tok == Tok::Comma {
                    self.advance();
                    continue;
                }
                // Only suggest `,` while more arguments are still due.
                let expected = if args.len() < func.arity() {
                    "`,` or `)`"
                } else {
                    "`)`"
                };
                self.expect_rparen(expected)?;
                break;
            }
        }
        if args.len() != func.arity() {
            let plural = if func.arity() == 1 { "" } else { "s" };
            return Err(FormulaError::new(
                format!(
                    "function `{}` takes {} argument{plural}, got {}",
                    func.name(),
                    func.arity(),
                    args.len()
                ),
                offset,
            ));
        }
        Self::node(Expr::Call(func, args), depth + 1, offset)
    }
}

/// "unknown function" with a spelling suggestion when one is close, and
/// the full list otherwise, so the author never has to look it up.
fn unknown_function_message(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let best = Func::ALL
        .iter()
        .map(|f| (strsim::levenshtein(&lower, f.name()), f.name()))
        .min_by_key(|&(d, _)| d);
    let allowed = |n: &str| if n.chars().count() >= 5 { 2 } else { 1 };
    match best {
        Some((d, suggestion)) if d <= allowed(name) => {
            format!("unknown function `{name}` (did you mean `{suggestion}`?)")
        }
        _ => {
            let all: Vec<&str> = Func::ALL.iter().map(|f| f.name()).collect();
            format!("unknown function `{name}` (available: {})", all.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn num(v: f64) -> Box<Expr> {
        Box::new(Expr::Num(v))
    }
    fn var(n: &str) -> Box<Expr> {
        Box::new(Expr::Var(n.to_owned()))
    }
    fn err(text: &str) -> FormulaError {
        parse(text).expect_err(text)
    }

    #[test]
    fn numbers() {
        for (text, v) in [
            ("1", 1.0),
            ("0.5", 0.5),
            ("1e-3", 1e-3),
            ("2.5E+10", 2.5e10),
            (".5", 0.5),
            ("5.", 5.0),
            ("  7  ", 7.0),
        ] {
            assert_eq!(parse(text), Ok(Expr::Num(v)), "{text}");
        }
    }

    #[test]
    fn precedence_and_associativity() {
        use BinOp::*;
        assert_eq!(
            parse("1 - 2 - 3").unwrap(),
            Expr::Binary(
                Sub,
                Box::new(Expr::Binary(Sub, num(1.0), num(2.0))),
                num(3.0)
            )
        );
        assert_eq!(
            parse("-x*y").unwrap(),
            Expr::Binary(Mul, Box::new(Expr::Neg(var("x"))), var("y"))
        );
        assert_eq!(
            parse("2 * -x").unwrap(),
            Expr::Binary(Mul, num(2.0), Box::new(Expr::Neg(var("x"))))
        );
        assert_eq!(parse("+x").unwrap(), Expr::Var("x".into()));
        assert_eq!(
            parse("a + b < c").unwrap(),
            Expr::Binary(
                Lt,
                Box::new(Expr::Binary(Add, var("a"), var("b"))),
                var("c")
            )
        );
        assert_eq!(parse("x<=1").unwrap(), Expr::Binary(Le, var("x"), num(1.0)));
        assert!(parse("(a < b) < c").is_ok());
    }

    #[test]
    fn min_and_max_may_be_variables() {
        let e = parse("min(max(x, min), max)").unwrap();
        assert_eq!(
            e,
            Expr::Call(
                Func::Min,
                vec![
                    Expr::Call(
                        Func::Max,
                        vec![Expr::Var("x".into()), Expr::Var("min".into())]
                    ),
                    Expr::Var("max".into()),
                ]
            )
        );
    }

    #[test]
    fn rule_file_formulas_parse() {
        for f in [
            "1 / (1 + exp(-x))",
            "max(x, 0) + log1p(exp(-abs(x)))",
            "g * (1 - y*y)",
            "select(x > 0, g, 0)",
            "0.5 * x * (1 + erf(x * 0.7071067811865476))",
            "rsqrt(v + 1e-5) * pow(x, 2) - floor(sin(x) + cos(x)) / expm1(sqrt(log(x)))",
        ] {
            parse(f).unwrap();
        }
    }

    #[test]
    fn error_positions_and_messages() {
        let e = err("1 + $");
        assert_eq!((e.offset, e.column), (4, 5));
        assert_eq!(e.message, "unexpected character `$`");
        assert_eq!(e.to_string(), "unexpected character `$` at character 5");

        let e = err("exp(x");
        assert_eq!(e.offset, 5);
        assert_eq!(e.message, "expected `)` but found end of formula");

        let e = err("foo(x)");
        assert_eq!(e.offset, 0);
        assert!(
            e.message.starts_with("unknown function `foo`"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("did you mean"));

        let e = err("2 * expp(x)");
        assert_eq!(e.offset, 4);
        assert_eq!(e.message, "unknown function `expp` (did you mean `exp`?)");

        let e = err("pow(x)");
        assert_eq!(e.offset, 0);
        assert_eq!(e.message, "function `pow` takes 2 arguments, got 1");
        assert_eq!(
            err("exp(x, y)").message,
            "function `exp` takes 1 argument, got 2"
        );
        assert_eq!(
            err("select()").message,
            "function `select` takes 3 arguments, got 0"
        );

        assert_eq!(err("").message, "empty formula");
        assert_eq!(err(" \t\n").message, "empty formula");

        let e = err("a < b < c");
        assert_eq!(e.offset, 6);
        assert!(e.message.starts_with("chained comparison"));

        let e = err("x y");
        assert_eq!(e.offset, 2);
        assert_eq!(
            e.message,
            "expected an operator or end of formula but found name `y`"
        );
        assert_eq!(err("x)").message, "unmatched `)`");
        assert_eq!(
            err("1 +").message,
            "expected a number, name, function call or `(` but found end of formula"
        );
        assert_eq!(
            err("pow(x y)").message,
            "expected `,` or `)` but found name `y`"
        );
        assert_eq!(
            err("x = 1").message,
            "unexpected character `=` (use `==` to compare)"
        );
        assert_eq!(err("x ^ 2").offset, 2);
        assert_eq!(err("1e+").offset, 0);
        assert!(err("1e999").message.contains("out of range"));
    }

    #[test]
    fn offsets_count_chars_not_bytes() {
        // Ideographic spaces are whitespace of three bytes each.
        let e = err("\u{3000}\u{3000}x $");
        assert_eq!(e.offset, 4);
        let e = err("x + é");
        assert_eq!(e.offset, 4);
        assert_eq!(e.message, "unexpected character `é`");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let n = 100_000;
        let parens = format!("{}x{}", "(".repeat(n), ")".repeat(n));
        assert!(err(&parens).message.contains("nests too deeply"));
        assert!(
            err(&format!("{}x", "-".repeat(n)))
                .message
                .contains("nests too deeply")
        );
        assert!(
            err(&format!("{}x", "x + ".repeat(n)))
                .message
                .contains("nests too deeply")
        );
        assert!(err(&"exp(".repeat(n)).message.contains("nests too deeply"));
        // Moderate nesting is fine.
        let ok = format!("{}x{}", "(".repeat(200), ")".repeat(200));
        assert_eq!(parse(&ok), Ok(Expr::Var("x".into())));
        parse(&format!("{}x", "x + ".repeat(200))).unwrap();
    }

    /// Checks the invariants that hold for every input, valid or not.
    fn check_any_input(text: &str) -> Result<(), TestCaseError> {
        match parse(text) {
            Ok(e) => {
                let printed = e.to_string();
                prop_assert_eq!(parse(&printed), Ok(e), "printed: {}", printed);
            }
            Err(e) => {
                prop_assert!(e.offset <= text.chars().count(), "{:?} for {:?}", e, text);
                prop_assert_eq!(e.column, e.offset + 1);
                prop_assert!(!e.message.is_empty());
            }
        }
        Ok(())
    }

    const ALPHABET: &str = "0123456789.eE+-*/<>=!(),,  \t\nxyzgabcdnmpqlostrw_\
                            ()()expminaxpowselectrsqrtlog1p$^%&|éß€😀\u{3000}";

    const VALID: &[&str] = &[
        "1 / (1 + exp(-x))",
        "max(x, 0) + log1p(exp(-abs(x)))",
        "g * (1 - y*y)",
        "min(max(x, min), max)",
        "select(x >= 0, g, 0.01 * g)",
        "pow(x, 2.5E+10) - rsqrt(.5 + 1e-3) != floor(sin(x) * cos(y))",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn random_strings_never_panic(
            chars in proptest::collection::vec(
                proptest::sample::select(ALPHABET.chars().collect::<Vec<_>>()),
                0..48,
            )
        ) {
            let text: String = chars.into_iter().collect();
            check_any_input(&text)?;
        }

        #[test]
        fn mutated_formulas_never_panic(
            base in proptest::sample::select(VALID.to_vec()),
            edits in proptest::collection::vec(
                (any::<usize>(), 0u8..3, proptest::sample::select(ALPHABET.chars().collect::<Vec<_>>())),
                1..6,
            )
        ) {
            let mut chars: Vec<char> = base.chars().collect();
            for (pos, kind, c) in edits {
                let at = pos % (chars.len() + 1);
                match kind {
                    0 => chars.insert(at, c),
                    1 if at < chars.len() => { chars.remove(at); }
                    _ if at < chars.len() => chars[at] = c,
                    _ => chars.push(c),
                }
            }
            let text: String = chars.into_iter().collect();
            check_any_input(&text)?;
        }
    }
}
