//! Source positions for values inside RON documents.
//!
//! `ron` deserializes straight into our structs and keeps no spans, so a
//! semantic error found afterwards ("unknown op in node 3") could otherwise
//! only name a path, not a place in the file. This module scans the text once
//! with a small hand-written lexer and records where every value (and every
//! struct field name / map key) starts, addressed by the same path a caller
//! uses to walk the deserialized data: `[Step::field("nodes"), Step::Index(3),
//! Step::field("op")]`.
//!
//! The scanner is deliberately forgiving. It is normally consulted only for
//! documents `ron` has already accepted, so it never reports errors itself;
//! on malformed input it makes a best effort, and it is written so that it can
//! neither panic nor loop forever (every loop iteration consumes input or
//! exits) nor overflow the stack (nesting deeper than `MAX_DEPTH` is skipped
//! iteratively instead of recursively).

use std::fmt;

/// Nesting depth beyond which values are skipped rather than indexed.
///
/// The scanner is recursive; this bound keeps its stack use small no matter
/// what the input is. Real documents are nowhere near this deep.
const MAX_DEPTH: usize = 200;

/// 1-based line and column (column counts chars, not bytes).
///
/// Chars rather than bytes because that is what an editor shows for
/// non-ASCII text; a tab counts as one column, `\r` as an ordinary char.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// One step of a path into a RON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A struct field by name (`r#type` is addressed as `type`).
    Field(String),
    /// The i-th element of a list or tuple, or the i-th entry's value of a
    /// map or struct.
    Index(usize),
    /// A map entry by key: a string key by its unescaped content, any other
    /// key by its source text (e.g. `3` or `(1, 2)`).
    Key(String),
}

impl Step {
    /// Shorthand so paths read like `&[Step::field("nodes"), Step::Index(3)]`.
    pub fn field(s: &str) -> Step {
        Step::Field(s.to_owned())
    }

    /// Shorthand for [`Step::Key`].
    pub fn key(s: &str) -> Step {
        Step::Key(s.to_owned())
    }
}

/// Positions of all values of one RON document, addressed by path.
#[derive(Debug, Clone)]
pub struct SpanIndex {
    /// The document itself, kept so that [`SpanIndex::string_char_position`]
    /// can re-walk a string literal's escapes on demand instead of storing a
    /// position for every char of every string up front.
    text: String,
    /// `None` for a document without any value (empty, or only comments).
    root: Option<Node>,
}

impl SpanIndex {
    /// Scan a whole document. Never panics.
    pub fn scan(text: &str) -> SpanIndex {
        let mut sc = Scanner::new(text);
        sc.skip_attributes();
        let root = sc.parse_value(0);
        SpanIndex {
            text: text.to_owned(),
            root,
        }
    }

    /// Start of the value at `path` (the root value is `&[]`).
    ///
    /// For a struct field this is where the field's value starts (after
    /// `field:`). `Index(i)` selects the i-th element of a list, the i-th
    /// content value of a tuple / tuple struct / enum variant (`Some(x)`:
    /// `Index(0)` is `x`), or the i-th value of a map or struct. `Key(k)`
    /// selects a map value by key, `Field(f)` a struct field's value; each is
    /// also accepted on the other kind, since an untyped RON map with string
    /// keys and a struct are easy to confuse from the caller's side.
    pub fn position(&self, path: &[Step]) -> Option<Position> {
        self.node(path).map(|n| n.start)
    }

    /// The first key written twice in one `{ … }` map of the document, with the position of
    /// its second appearance. serde fills a map entry by entry, so a repeated key would
    /// silently keep only its last value (struct fields are refused by serde itself).
    pub fn duplicate_map_key(&self) -> Option<(String, Position)> {
        let mut pending: Vec<&Node> = self.root.iter().collect();
        while let Some(node) = pending.pop() {
            match &node.kind {
                Kind::Map(entries) | Kind::Struct(entries) => {
                    if matches!(node.kind, Kind::Map(_)) {
                        let mut seen = std::collections::HashSet::new();
                        if let Some(entry) = entries.iter().find(|e| !seen.insert(&e.key)) {
                            return Some((entry.key.clone(), entry.key_pos));
                        }
                    }
                    pending.extend(entries.iter().filter_map(|e| e.value.as_ref()));
                }
                Kind::Seq(items) | Kind::Tuple(items) => pending.extend(items),
                _ => {}
            }
        }
        None
    }

    /// Like [`SpanIndex::position`], but falls back to the deepest prefix of
    /// `path` that exists, and to the root value (or 1:1 for an empty
    /// document). Always returns something, so error reporting never has to
    /// handle "no position".
    pub fn nearest(&self, path: &[Step]) -> Position {
        let Some(mut node) = self.root.as_ref() else {
            return Position { line: 1, column: 1 };
        };
        for step in path {
            match node.child(step) {
                Some(next) => node = next,
                None => break,
            }
        }
        node.start
    }

    /// Position of the key itself for a path ending in a `Key`/`Field` step
    /// (to point at a misspelled map key or field name). A trailing `Index`
    /// on a map or struct gives the i-th entry's key. `None` if absent.
    pub fn key_position(&self, path: &[Step]) -> Option<Position> {
        let (last, parent) = path.split_last()?;
        let entries = match &self.node(parent)?.kind {
            Kind::Struct(e) | Kind::Map(e) => e,
            _ => return None,
        };
        let entry = match last {
            Step::Index(i) => entries.get(*i),
            Step::Field(k) | Step::Key(k) => find_entry(entries, k),
        }?;
        Some(entry.key_pos)
    }

    /// If the value at `path` is a string literal, the position of the char
    /// with index `char_offset` within its unescaped content.
    ///
    /// This lets an error inside a string (a formula such as
    /// `"1 / (1 + exp(-x))"`) point at the exact char. An escape sequence
    /// maps to the position of its backslash; a line continuation (`\` at
    /// the end of a line) contributes no chars; raw strings map one to one;
    /// a newline inside the literal advances the line. Offsets at or past the
    /// end clamp to the closing quote. `None` if the value is not a string.
    pub fn string_char_position(&self, path: &[Step], char_offset: usize) -> Option<Position> {
        let Kind::Str(lit) = &self.node(path)?.kind else {
            return None;
        };
        let mut sc = Scanner {
            text: &self.text,
            cur: lit.content,
        };
        let mut index = 0;
        while let Some((at, _)) = sc.next_string_char(lit.raw_hashes) {
            if index == char_offset {
                return Some(at.pos());
            }
            index += 1;
        }
        Some(sc.cur.pos())
    }

    /// Number of elements of the list / tuple / map / struct at `path` (for
    /// sanity checks such as "the file lists 3 nodes"); `None` for scalars
    /// and missing paths.
    pub fn len(&self, path: &[Step]) -> Option<usize> {
        match &self.node(path)?.kind {
            Kind::Struct(e) | Kind::Map(e) => Some(e.len()),
            Kind::Seq(v) | Kind::Tuple(v) => Some(v.len()),
            Kind::Str(_) | Kind::Atom => None,
        }
    }

    /// The bare name (`True`, `nan`) the value at `path` is written as, if it is one: RON
    /// reads a bare name as `()`, so only the text can say what was written.
    pub fn bare_name(&self, path: &[Step]) -> Option<&str> {
        let start = self.position(path)?;
        let line = self.text.lines().nth(start.line.checked_sub(1)?)?;
        let (offset, _) = line.char_indices().nth(start.column.checked_sub(1)?)?;
        let rest = &line[offset..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..end];
        name.starts_with(|c: char| c.is_alphabetic() || c == '_')
            .then_some(name)
    }

    fn node(&self, path: &[Step]) -> Option<&Node> {
        let mut node = self.root.as_ref()?;
        for step in path {
            node = node.child(step)?;
        }
        Some(node)
    }
}

/// A scanned value: where it starts and what it contains.
#[derive(Debug, Clone)]
struct Node {
    start: Position,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// `Name(field: value, ...)` or `(field: value, ...)`.
    Struct(Vec<Entry>),
    /// `{ key: value, ... }`.
    Map(Vec<Entry>),
    /// `[a, b, ...]`.
    Seq(Vec<Node>),
    /// `Name(a, b)`, `(a, b)`, `Some(x)`, `()`.
    Tuple(Vec<Node>),
    /// A string or byte string literal.
    Str(StrLit),
    /// Anything else: numbers, chars, identifiers, unit variants, and values
    /// nested too deeply to index.
    Atom,
}

/// A struct field or map entry.
#[derive(Debug, Clone)]
struct Entry {
    key: String,
    key_pos: Position,
    /// `None` when malformed input has a key without a value.
    value: Option<Node>,
}

/// Where a string literal's content starts and how to read it.
#[derive(Debug, Clone, Copy)]
struct StrLit {
    content: Cursor,
    /// `Some(n)` for a raw string closed by `"` and n `#`s; `None` for an
    /// ordinary string with escapes.
    raw_hashes: Option<usize>,
}

impl Node {
    fn child(&self, step: &Step) -> Option<&Node> {
        match (&self.kind, step) {
            (Kind::Seq(v) | Kind::Tuple(v), Step::Index(i)) => v.get(*i),
            (Kind::Struct(e) | Kind::Map(e), Step::Index(i)) => e.get(*i)?.value.as_ref(),
            (Kind::Struct(e) | Kind::Map(e), Step::Field(k) | Step::Key(k)) => {
                find_entry(e, k)?.value.as_ref()
            }
            _ => None,
        }
    }
}

/// The entry named `key`; the last one wins on duplicates, as it does when
/// serde fills a map.
fn find_entry<'a>(entries: &'a [Entry], key: &str) -> Option<&'a Entry> {
    entries.iter().rev().find(|e| e.key == key)
}

/// A place in the text: byte offset for slicing, line/column for reporting.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    byte: usize,
    line: usize,
    col: usize,
}

impl Cursor {
    fn pos(self) -> Position {
        Position {
            line: self.line,
            column: self.col,
        }
    }
}

/// RON's whitespace set (the same chars `ron` itself skips).
fn is_ws(c: char) -> bool {
    matches!(
        c,
        ' ' | '\t'
            | '\n'
            | '\r'
            | '\x0B'
            | '\x0C'
            | '\u{85}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Chars that can make up an identifier or a number literal (`-1.5e3`,
/// `0x1F`, `1_000u8`, `inf`). Lumping them together is enough to find where
/// such a token ends, which is all the index needs.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '.' | '+' | '-')
}

/// Approximates XID_Start, which is what `ron` accepts for identifiers.
fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

struct Scanner<'a> {
    text: &'a str,
    cur: Cursor,
}

impl<'a> Scanner<'a> {
    fn new(text: &'a str) -> Self {
        Scanner {
            text,
            cur: Cursor {
                byte: 0,
                line: 1,
                col: 1,
            },
        }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.cur.byte..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.cur.byte += c.len_utf8();
        if c == '\n' {
            self.cur.line += 1;
            self.cur.col = 1;
        } else {
            self.cur.col += 1;
        }
        Some(c)
    }

    fn bump_n(&mut self, n: usize) {
        for _ in 0..n {
            self.bump();
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// Skips whitespace, `// line` comments and nested `/* block */`
    /// comments, so that brackets and quotes inside comments are never seen.
    fn skip_ws(&mut self) {
        loop {
            let rest = self.rest();
            if rest.starts_with("//") {
                while let Some(c) = self.peek() {
                    if c == '\n' {
                        break;
                    }
                    self.bump();
                }
            } else if rest.starts_with("/*") {
                self.bump_n(2);
                let mut level = 1usize;
                while level > 0 {
                    let rest = self.rest();
                    if rest.is_empty() {
                        break;
                    } else if rest.starts_with("/*") {
                        self.bump_n(2);
                        level += 1;
                    } else if rest.starts_with("*/") {
                        self.bump_n(2);
                        level -= 1;
                    } else {
                        self.bump();
                    }
                }
            } else if self.peek().is_some_and(is_ws) {
                self.bump();
            } else {
                return;
            }
        }
    }

    /// Skips leading `#![enable(...)]` attributes, which are not values.
    fn skip_attributes(&mut self) {
        loop {
            self.skip_ws();
            if !self.rest().starts_with("#!") {
                return;
            }
            self.bump_n(2);
            self.skip_ws();
            self.skip_value();
        }
    }

    /// If a string literal starts here: how many prefix chars precede its
    /// opening quote (`b`, `r`, `#`s) and, for raw strings, the number of
    /// hashes that close it.
    fn string_prefix(&self) -> Option<(usize, Option<usize>)> {
        let b = self.rest().as_bytes();
        let mut i = usize::from(b.first() == Some(&b'b'));
        if b.get(i) == Some(&b'r') {
            i += 1;
            let hashes = b[i..].iter().take_while(|&&x| x == b'#').count();
            i += hashes;
            return (b.get(i) == Some(&b'"')).then_some((i, Some(hashes)));
        }
        (b.get(i) == Some(&b'"')).then_some((i, None))
    }

    /// Whether a char literal (`'a'`, `b'a'`) starts here.
    fn at_char_literal(&self) -> bool {
        let rest = self.rest();
        rest.starts_with('\'') || rest.starts_with("b'")
    }

    /// Scans a string literal starting at its prefix; returns its content
    /// location and, if `collect`, its unescaped content (needed for map
    /// keys only).
    fn scan_string(&mut self, collect: bool) -> (StrLit, String) {
        let (prefix, raw_hashes) = self.string_prefix().unwrap_or((0, None));
        self.bump_n(prefix + 1);
        let lit = StrLit {
            content: self.cur,
            raw_hashes,
        };
        let mut content = String::new();
        while let Some((_, c)) = self.next_string_char(raw_hashes) {
            if collect {
                content.push(c);
            }
        }
        if self.eat('"') {
            self.bump_n(raw_hashes.unwrap_or(0));
        }
        (lit, content)
    }

    /// Reads one unescaped char of a string's content; returns where it
    /// starts and what it is, or `None` at the closing delimiter (left
    /// unconsumed) or the end of the text.
    ///
    /// Both the scanner and [`SpanIndex::string_char_position`] go through
    /// this, so char offsets always agree with what was scanned. Escapes
    /// follow `ron`: `\x` bytes combine into one UTF-8 char, `\u{..}` takes
    /// up to 6 hex digits, and `\` + newline is a continuation that also
    /// swallows the following whitespace. Invalid escapes (which `ron` would
    /// reject anyway) count as one char.
    fn next_string_char(&mut self, raw_hashes: Option<usize>) -> Option<(Cursor, char)> {
        if let Some(n) = raw_hashes {
            let at = self.cur;
            let b = self.rest().as_bytes();
            if b.first() == Some(&b'"') && b.len() > n && b[1..=n].iter().all(|&x| x == b'#') {
                return None;
            }
            return self.bump().map(|c| (at, c));
        }
        loop {
            let at = self.cur;
            match self.peek()? {
                '"' => return None,
                '\\' => {
                    self.bump();
                    let rest = self.rest();
                    if rest.starts_with('\n') || rest.starts_with("\r\n") {
                        while self
                            .peek()
                            .is_some_and(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
                        {
                            self.bump();
                        }
                        continue;
                    }
                    let c = match self.bump() {
                        None => '\\',
                        Some('n') => '\n',
                        Some('r') => '\r',
                        Some('t') => '\t',
                        Some('0') => '\0',
                        Some('x') => self.byte_escape(),
                        Some('u') => self.unicode_escape(),
                        Some(other) => other,
                    };
                    return Some((at, c));
                }
                c => {
                    self.bump();
                    return Some((at, c));
                }
            }
        }
    }

    /// Up to `max` hex digits as a number (consumes only hex digits).
    fn hex_digits(&mut self, max: usize) -> u32 {
        let mut value = 0u32;
        for _ in 0..max {
            match self.peek().and_then(|c| c.to_digit(16)) {
                Some(d) => {
                    value = (value << 4) | d;
                    self.bump();
                }
                None => break,
            }
        }
        value
    }

    /// After `\x`: one byte, plus further `\xHH` escapes while they are
    /// needed to complete a multi-byte UTF-8 char (as `ron` decodes them).
    fn byte_escape(&mut self) -> char {
        let mut bytes = [0u8; 4];
        // Two hex digits never exceed 0xFF.
        bytes[0] = self.hex_digits(2) as u8;
        if bytes[0] < 0x80 {
            return char::from(bytes[0]);
        }
        for i in 1..4 {
            let b = self.rest().as_bytes();
            let is_escape = b.len() >= 4
                && b.starts_with(b"\\x")
                && b[2].is_ascii_hexdigit()
                && b[3].is_ascii_hexdigit();
            if !is_escape {
                break;
            }
            self.bump_n(2);
            bytes[i] = self.hex_digits(2) as u8;
            if let Ok(s) = std::str::from_utf8(&bytes[..=i]) {
                return s.chars().next().unwrap_or(char::REPLACEMENT_CHARACTER);
            }
        }
        char::REPLACEMENT_CHARACTER
    }

    /// After `\u`: `{` 1-6 hex digits `}`.
    fn unicode_escape(&mut self) -> char {
        if !self.eat('{') {
            return char::REPLACEMENT_CHARACTER;
        }
        let value = self.hex_digits(6);
        self.eat('}');
        char::from_u32(value).unwrap_or(char::REPLACEMENT_CHARACTER)
    }

    /// Scans a char literal (`'a'`, `'\''`, `b'x'`). Stops at the closing
    /// quote, or at a newline so that a stray `'` in garbage cannot swallow
    /// the rest of the document.
    fn scan_char_literal(&mut self) {
        self.eat('b');
        self.bump();
        while let Some(c) = self.peek() {
            match c {
                '\'' => {
                    self.bump();
                    return;
                }
                '\n' => return,
                '\\' => {
                    self.bump();
                    if self.peek() != Some('\n') {
                        self.bump();
                    }
                }
                _ => {
                    self.bump();
                }
            }
        }
    }

    /// Scans an identifier or number (including raw identifiers `r#name`)
    /// and returns its text. The caller has checked that a word char is next,
    /// so at least one char is consumed.
    fn scan_word(&mut self) -> &'a str {
        let start = self.cur.byte;
        let rest = self.rest();
        if rest.starts_with("r#") && rest[2..].chars().next().is_some_and(is_word_char) {
            self.bump_n(2);
        }
        while self.peek().is_some_and(is_word_char) {
            self.bump();
        }
        &self.text[start..self.cur.byte]
    }

    /// Whether `(` follows after whitespace/comments, without consuming
    /// anything: `Name (..)` is one value.
    fn paren_follows(&self) -> bool {
        let mut look = Scanner {
            text: self.text,
            cur: self.cur,
        };
        look.skip_ws();
        look.peek() == Some('(')
    }

    /// Scans one value and returns its node. Returns `None`, consuming
    /// nothing, at the end of the text or at a delimiter (`,` `:` and
    /// closing brackets belong to the enclosing container); returns `None`
    /// after consuming one char of anything unrecognizable.
    fn parse_value(&mut self, depth: usize) -> Option<Node> {
        self.skip_ws();
        let start = self.cur.pos();
        let c = self.peek()?;
        if matches!(c, ',' | ':' | ')' | ']' | '}') {
            return None;
        }
        if depth >= MAX_DEPTH {
            self.skip_value();
            return Some(Node {
                start,
                kind: Kind::Atom,
            });
        }
        let kind = if self.string_prefix().is_some() {
            Kind::Str(self.scan_string(false).0)
        } else if self.at_char_literal() {
            self.scan_char_literal();
            Kind::Atom
        } else if c == '[' {
            self.bump();
            Kind::Seq(self.parse_elements(']', depth))
        } else if c == '{' {
            self.bump();
            Kind::Map(self.parse_map(depth))
        } else if c == '(' {
            self.parse_parens(depth)
        } else if is_word_char(c) {
            let word = self.scan_word();
            let is_ident =
                word.starts_with("r#") || word.chars().next().is_some_and(is_ident_start);
            if is_ident && self.paren_follows() {
                self.skip_ws();
                self.parse_parens(depth)
            } else {
                Kind::Atom
            }
        } else {
            self.bump();
            return None;
        };
        Some(Node { start, kind })
    }

    /// Scans `( ... )` (cursor at `(`), deciding between a struct and a
    /// tuple the way `ron` does: a struct if the first thing inside is an
    /// identifier followed by a single `:`.
    fn parse_parens(&mut self, depth: usize) -> Kind {
        self.bump();
        let mut look = Scanner {
            text: self.text,
            cur: self.cur,
        };
        look.skip_ws();
        let is_struct = look.peek().is_some_and(is_ident_start) && {
            look.scan_word();
            look.skip_ws();
            look.rest().starts_with(':') && !look.rest().starts_with("::")
        };
        if is_struct {
            Kind::Struct(self.parse_fields(depth))
        } else {
            Kind::Tuple(self.parse_elements(')', depth))
        }
    }

    /// Handles the separators and closers shared by all containers. Returns
    /// `Some(true)` when the container is finished, `Some(false)` when a
    /// separator was consumed, `None` when an element should be scanned.
    ///
    /// A closer of the wrong kind ends the container without being consumed,
    /// so that mismatched brackets in garbage unwind instead of looping.
    fn container_step(&mut self, close: char) -> Option<bool> {
        self.skip_ws();
        match self.peek() {
            None => Some(true),
            Some(c) if c == close => {
                self.bump();
                Some(true)
            }
            Some(')' | ']' | '}') => Some(true),
            Some(',') => {
                self.bump();
                Some(false)
            }
            Some(_) => None,
        }
    }

    /// Elements of a list or tuple up to `close` (the opener is consumed).
    fn parse_elements(&mut self, close: char, depth: usize) -> Vec<Node> {
        let mut items = Vec::new();
        loop {
            match self.container_step(close) {
                Some(true) => return items,
                Some(false) => continue,
                None => {}
            }
            let before = self.cur.byte;
            if let Some(node) = self.parse_value(depth + 1) {
                items.push(node);
            }
            if self.cur.byte == before {
                self.bump();
            }
        }
    }

    /// Fields of a struct up to `)` (the opener is consumed).
    fn parse_fields(&mut self, depth: usize) -> Vec<Entry> {
        let mut fields = Vec::new();
        loop {
            match self.container_step(')') {
                Some(true) => return fields,
                Some(false) => continue,
                None => {}
            }
            let before = self.cur.byte;
            if self.peek().is_some_and(is_ident_start) {
                let key_pos = self.cur.pos();
                let word = self.scan_word();
                let key = word.strip_prefix("r#").unwrap_or(word).to_owned();
                self.skip_ws();
                let value = if self.eat(':') {
                    self.parse_value(depth + 1)
                } else {
                    None
                };
                fields.push(Entry {
                    key,
                    key_pos,
                    value,
                });
            } else {
                // Not a field name: skip whatever value is there.
                self.parse_value(depth + 1);
            }
            if self.cur.byte == before {
                self.bump();
            }
        }
    }

    /// Entries of a map up to `}` (the opener is consumed).
    fn parse_map(&mut self, depth: usize) -> Vec<Entry> {
        let mut entries = Vec::new();
        loop {
            match self.container_step('}') {
                Some(true) => return entries,
                Some(false) => continue,
                None => {}
            }
            let before = self.cur;
            let key = if self.string_prefix().is_some() {
                self.scan_string(true).1
            } else {
                self.parse_value(depth + 1);
                self.text[before.byte..self.cur.byte].to_owned()
            };
            self.skip_ws();
            let value = if self.eat(':') {
                self.parse_value(depth + 1)
            } else {
                None
            };
            if self.cur.byte == before.byte {
                self.bump();
                continue;
            }
            entries.push(Entry {
                key,
                key_pos: before.pos(),
                value,
            });
        }
    }

    /// Skips one value without recursion or indexing (used past
    /// [`MAX_DEPTH`] and for attributes): brackets are only counted, while
    /// strings, chars and comments are still lexed so that brackets inside
    /// them do not count.
    fn skip_value(&mut self) {
        let mut depth = 0usize;
        loop {
            self.skip_ws();
            let Some(c) = self.peek() else { return };
            match c {
                '(' | '[' | '{' => {
                    self.bump();
                    depth += 1;
                    continue;
                }
                ')' | ']' | '}' => {
                    if depth == 0 {
                        return;
                    }
                    self.bump();
                    depth -= 1;
                }
                ',' | ':' if depth == 0 => return,
                _ if self.string_prefix().is_some() => {
                    self.scan_string(false);
                }
                _ if self.at_char_literal() => self.scan_char_literal(),
                c if is_word_char(c) => {
                    self.scan_word();
                    // A name directly before `(` belongs to the same value.
                    if depth > 0 || self.paren_follows() {
                        continue;
                    }
                }
                _ => {
                    self.bump();
                }
            }
            if depth == 0 {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pos(line: usize, column: usize) -> Position {
        Position { line, column }
    }

    fn f(s: &str) -> Step {
        Step::field(s)
    }

    fn k(s: &str) -> Step {
        Step::key(s)
    }

    const GRAPH: &str = r#"// a graph
Graph(
    name: "example",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [64, 512]),
    ],
    nodes: [
        Node(name: "i", op: "sigmoid", args: ["x"]),
        Node(name: "one", op: "const", attrs: {"value": 1.0, "dtype": "f32"}),
    ],
    outputs: ["i"],
)
"#;

    #[test]
    fn realistic_document_is_valid_ron() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Graph {
            name: String,
            inputs: Vec<Input>,
            nodes: Vec<NodeDef>,
            outputs: Vec<String>,
        }
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Input {
            name: String,
            dtype: String,
            shape: Vec<usize>,
        }
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        #[serde(rename = "Node")]
        struct NodeDef {
            name: String,
            op: String,
            #[serde(default)]
            args: Vec<String>,
            #[serde(default)]
            attrs: std::collections::BTreeMap<String, ron::Value>,
        }
        let g: Graph = ron::from_str(GRAPH).unwrap();
        assert_eq!(g.nodes.len(), 2);
    }

    #[test]
    fn realistic_document_positions() {
        let idx = SpanIndex::scan(GRAPH);
        assert_eq!(idx.position(&[]), Some(pos(2, 1)));
        assert_eq!(idx.position(&[f("name")]), Some(pos(3, 11)));
        assert_eq!(idx.position(&[f("inputs")]), Some(pos(4, 13)));
        assert_eq!(
            idx.position(&[f("inputs"), Step::Index(0)]),
            Some(pos(5, 9))
        );
        assert_eq!(
            idx.position(&[f("inputs"), Step::Index(0), f("shape"), Step::Index(1)]),
            Some(pos(5, 52))
        );
        assert_eq!(
            idx.position(&[f("nodes"), Step::Index(0), f("op")]),
            Some(pos(8, 29))
        );
        assert_eq!(
            idx.position(&[f("nodes"), Step::Index(1), f("op")]),
            Some(pos(9, 31))
        );
        assert_eq!(
            idx.position(&[f("nodes"), Step::Index(0), f("args"), Step::Index(0)]),
            Some(pos(8, 47))
        );
        let attrs = [f("nodes"), Step::Index(1), f("attrs")];
        assert_eq!(idx.position(&attrs), Some(pos(9, 47)));
        assert_eq!(idx.key_position(&attrs), Some(pos(9, 40)));
        assert_eq!(
            idx.position(&[f("nodes"), Step::Index(1), f("attrs"), k("dtype")]),
            Some(pos(9, 71))
        );
        assert_eq!(
            idx.key_position(&[f("nodes"), Step::Index(1), f("attrs"), k("dtype")]),
            Some(pos(9, 62))
        );
        assert_eq!(
            idx.position(&[f("nodes"), Step::Index(1), f("attrs"), Step::Index(0)]),
            Some(pos(9, 57))
        );
        assert_eq!(
            idx.position(&[f("outputs"), Step::Index(0)]),
            Some(pos(11, 15))
        );
        // "sigmoid": offset 3 is the 'm'.
        assert_eq!(
            idx.string_char_position(&[f("nodes"), Step::Index(0), f("op")], 3),
            Some(pos(8, 33))
        );
        // Past the end clamps to the closing quote.
        assert_eq!(
            idx.string_char_position(&[f("nodes"), Step::Index(0), f("op")], 100),
            Some(pos(8, 37))
        );
        assert_eq!(idx.string_char_position(&[f("nodes")], 0), None);
        assert_eq!(idx.len(&[f("nodes")]), Some(2));
        assert_eq!(idx.len(&[]), Some(4));
        assert_eq!(idx.len(&[f("nodes"), Step::Index(1), f("attrs")]), Some(2));
        assert_eq!(idx.len(&[f("inputs"), Step::Index(0), f("shape")]), Some(2));
        assert_eq!(idx.len(&[f("name")]), None);
        // Missing paths.
        assert_eq!(idx.position(&[f("nodes"), Step::Index(2)]), None);
        assert_eq!(idx.position(&[f("nope")]), None);
        assert_eq!(idx.key_position(&[f("nope")]), None);
        assert_eq!(idx.key_position(&[]), None);
        assert_eq!(
            idx.nearest(&[f("nodes"), Step::Index(1), f("attrs"), k("missing")]),
            pos(9, 47)
        );
        assert_eq!(
            idx.nearest(&[f("nodes"), Step::Index(7), f("op")]),
            pos(7, 12)
        );
        assert_eq!(idx.nearest(&[f("zzz")]), pos(2, 1));
        assert_eq!(
            idx.key_position(&[f("nodes"), Step::Index(1), f("op")]),
            Some(pos(9, 27))
        );
        assert_eq!(idx.key_position(&[f("outputs")]), Some(pos(11, 5)));
    }

    #[test]
    fn options_and_tuple_variants() {
        let text = "(a: Some(5), b: Some( (x: 1) ), c: None, d: Promote([\"a\", \"b\"]), e: (1, 2), f: Bool(false))";
        let idx = SpanIndex::scan(text);
        assert_eq!(idx.position(&[f("a")]), Some(pos(1, 5)));
        assert_eq!(idx.position(&[f("a"), Step::Index(0)]), Some(pos(1, 10)));
        assert_eq!(idx.position(&[f("b"), Step::Index(0)]), Some(pos(1, 23)));
        assert_eq!(
            idx.position(&[f("b"), Step::Index(0), f("x")]),
            Some(pos(1, 27))
        );
        assert_eq!(idx.position(&[f("c")]), Some(pos(1, 36)));
        assert_eq!(idx.position(&[f("c"), Step::Index(0)]), None);
        assert_eq!(
            idx.position(&[f("d"), Step::Index(0), Step::Index(1)]),
            Some(pos(1, 59))
        );
        assert_eq!(idx.position(&[f("e"), Step::Index(1)]), Some(pos(1, 73)));
        assert_eq!(idx.position(&[f("f"), Step::Index(0)]), Some(pos(1, 85)));
        assert_eq!(idx.len(&[f("e")]), Some(2));
        assert_eq!(idx.len(&[f("c")]), None);
        // `Name (..)` with whitespace is still one value.
        let idx = SpanIndex::scan("[Some (1), None]");
        assert_eq!(
            idx.position(&[Step::Index(0), Step::Index(0)]),
            Some(pos(1, 8))
        );
        assert_eq!(idx.position(&[Step::Index(1)]), Some(pos(1, 12)));
    }

    #[test]
    fn comments_and_tricky_strings() {
        let text = "(\n  // ) ] \" {\n  a: /* ( /* \" */ ] */ \"x ) // y\",\n  b: 'a', c: '\\'', d: ')',\n  e: 7,\n)";
        let idx = SpanIndex::scan(text);
        assert_eq!(idx.position(&[f("a")]), Some(pos(3, 24)));
        assert_eq!(idx.string_char_position(&[f("a")], 2), Some(pos(3, 27)));
        assert_eq!(idx.string_char_position(&[f("a")], 4), Some(pos(3, 29)));
        assert_eq!(idx.position(&[f("b")]), Some(pos(4, 6)));
        assert_eq!(idx.position(&[f("c")]), Some(pos(4, 14)));
        assert_eq!(idx.position(&[f("d")]), Some(pos(4, 23)));
        assert_eq!(idx.position(&[f("e")]), Some(pos(5, 6)));
        assert_eq!(idx.len(&[]), Some(5));
    }

    #[test]
    fn raw_and_byte_strings() {
        let text = r####"(a: r#"he said "hi") ] "#, b: r"x", c: br##"q"#"##, d: b"\x41", r#type: 5, e: r#ident)"####;
        let idx = SpanIndex::scan(text);
        assert_eq!(idx.position(&[f("a")]), Some(pos(1, 5)));
        assert_eq!(idx.string_char_position(&[f("a")], 0), Some(pos(1, 8)));
        assert_eq!(idx.string_char_position(&[f("a")], 8), Some(pos(1, 16)));
        assert_eq!(idx.string_char_position(&[f("a")], 99), Some(pos(1, 24)));
        assert_eq!(idx.position(&[f("b")]), Some(pos(1, 31)));
        assert_eq!(idx.position(&[f("c")]), Some(pos(1, 40)));
        assert_eq!(idx.string_char_position(&[f("c")], 1), Some(pos(1, 46)));
        assert_eq!(idx.position(&[f("d")]), Some(pos(1, 56)));
        assert_eq!(idx.string_char_position(&[f("d")], 1), Some(pos(1, 62)));
        assert_eq!(idx.position(&[f("type")]), Some(pos(1, 73)));
        assert_eq!(idx.key_position(&[f("type")]), Some(pos(1, 65)));
        assert_eq!(idx.position(&[f("e")]), Some(pos(1, 79)));
    }

    #[test]
    fn escapes_and_multiline_strings() {
        // Content: a " b \ c 😀 d A é e <newline> f
        let text = "(s: \"a\\\"b\\\\c\\u{1F600}d\\x41\\xC3\\xA9e\nf\", t: \"x\\\n     y\", u: 1)";
        let idx = SpanIndex::scan(text);
        let s = [f("s")];
        let expect = [
            (0, pos(1, 6)),
            (1, pos(1, 7)),
            (2, pos(1, 9)),
            (3, pos(1, 10)),
            (4, pos(1, 12)),
            (5, pos(1, 13)),
            (6, pos(1, 22)),
            (7, pos(1, 23)),
            (8, pos(1, 27)),
            (9, pos(1, 35)),
            (10, pos(1, 36)),
            (11, pos(2, 1)),
            (12, pos(2, 2)),
            (13, pos(2, 2)),
        ];
        for (offset, p) in expect {
            assert_eq!(
                idx.string_char_position(&s, offset),
                Some(p),
                "offset {offset}"
            );
        }
        // A line continuation contributes no chars.
        assert_eq!(idx.string_char_position(&[f("t")], 1), Some(pos(3, 6)));
        assert_eq!(idx.position(&[f("u")]), Some(pos(3, 13)));
        // ron agrees on the content.
        #[derive(serde::Deserialize)]
        struct S {
            s: String,
            t: String,
        }
        let v: S = ron::from_str(text).unwrap();
        assert_eq!(v.s, "a\"b\\c😀dAée\nf");
        assert_eq!(v.t, "xy");
    }

    #[test]
    fn unicode_columns_count_chars() {
        let text = "{\"日本語\": \"ü\", \"k\": 5, 3: \"three\", (1, 2): \"pair\"}";
        let idx = SpanIndex::scan(text);
        assert_eq!(idx.position(&[k("日本語")]), Some(pos(1, 9)));
        assert_eq!(idx.position(&[k("k")]), Some(pos(1, 19)));
        assert_eq!(idx.key_position(&[k("k")]), Some(pos(1, 14)));
        assert_eq!(idx.position(&[k("3")]), Some(pos(1, 25)));
        assert_eq!(idx.position(&[k("(1, 2)")]), Some(pos(1, 42)));
        assert_eq!(idx.position(&[Step::Index(3)]), Some(pos(1, 42)));
        assert_eq!(idx.key_position(&[Step::Index(3)]), Some(pos(1, 34)));
        let idx = SpanIndex::scan("(ключ: \"ü\", next: 1)");
        assert_eq!(idx.position(&[f("next")]), Some(pos(1, 19)));
        assert_eq!(idx.key_position(&[f("ключ")]), Some(pos(1, 2)));
    }

    #[test]
    fn attributes_and_empty_documents() {
        let idx = SpanIndex::scan("#![enable(implicit_some)]\n#![enable(unwrap_newtypes)]\n(a: 1)");
        assert_eq!(idx.position(&[]), Some(pos(3, 1)));
        assert_eq!(idx.position(&[f("a")]), Some(pos(3, 5)));
        for empty in ["", "   \n", "// only a comment", "/* unclosed"] {
            let idx = SpanIndex::scan(empty);
            assert_eq!(idx.position(&[]), None);
            assert_eq!(idx.nearest(&[f("x")]), pos(1, 1));
            assert_eq!(idx.len(&[]), None);
        }
    }

    #[test]
    fn display_and_constructors() {
        assert_eq!(pos(12, 7).to_string(), "12:7");
        assert_eq!(Step::field("a"), Step::Field("a".into()));
        assert_eq!(Step::key("b"), Step::Key("b".into()));
    }

    #[test]
    fn deep_nesting_does_not_overflow() {
        for open in ["[", "(", "{", "Some(", "(a:"] {
            let text = open.repeat(100_000);
            let idx = SpanIndex::scan(&text);
            let _ = idx.nearest(&vec![Step::Index(0); 1000]);
        }
        // Positions below the cap are exact; the value at the cap is
        // still located, just not indexed inside.
        let text = format!("{}1{}", "[".repeat(500), "]".repeat(500));
        let idx = SpanIndex::scan(&text);
        let path = vec![Step::Index(0); MAX_DEPTH];
        assert_eq!(idx.position(&path), Some(pos(1, MAX_DEPTH + 1)));
        assert_eq!(idx.position(&vec![Step::Index(0); MAX_DEPTH + 1]), None);
        // Scanning continues after a too-deep value.
        let text = format!("[{}, 7]", "[".repeat(300) + &"]".repeat(300));
        let idx = SpanIndex::scan(&text);
        assert_eq!(idx.position(&[Step::Index(1)]), Some(pos(1, 604)));
    }

    // ---- property tests -------------------------------------------------

    /// A generated RON value.
    #[derive(Debug, Clone)]
    enum G {
        Struct(Option<String>, Vec<(String, G)>),
        Tuple(Option<String>, Vec<G>),
        List(Vec<G>),
        Map(Vec<(MapKey, G)>),
        Str(String),
        Atom(String),
    }

    #[derive(Debug, Clone)]
    enum MapKey {
        Str(String),
        Int(i64),
    }

    /// What the emitter recorded for one value.
    struct Expected {
        path: Vec<Step>,
        start: Position,
        key_pos: Option<Position>,
        len: Option<usize>,
        /// Position of every content char, then of the closing quote.
        chars: Option<Vec<Position>>,
    }

    /// Writes RON text while tracking line/column, with pseudo-random
    /// whitespace and comments between all tokens.
    struct Emitter {
        out: String,
        line: usize,
        col: usize,
        rng: u64,
        expected: Vec<Expected>,
    }

    impl Emitter {
        fn rand(&mut self, n: u64) -> u64 {
            // xorshift64*: deterministic per proptest case.
            self.rng ^= self.rng >> 12;
            self.rng ^= self.rng << 25;
            self.rng ^= self.rng >> 27;
            (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % n
        }

        fn here(&self) -> Position {
            pos(self.line, self.col)
        }

        fn push(&mut self, s: &str) {
            for c in s.chars() {
                self.out.push(c);
                if c == '\n' {
                    self.line += 1;
                    self.col = 1;
                } else {
                    self.col += 1;
                }
            }
        }

        fn ws(&mut self) {
            const WS: &[&str] = &[
                "",
                "",
                "",
                " ",
                " ",
                "\n",
                "\t",
                "\r\n  ",
                " // ) ] } \" ' ( [ {\n",
                "/* ( [ \" /* nested ) */ } */",
                "/**/",
                "\n\n    ",
                "\u{200E}",
            ];
            let i = self.rand(WS.len() as u64) as usize;
            self.push(WS[i]);
        }

        fn string(&mut self, content: &str) -> Vec<Position> {
            let mut positions = Vec::new();
            let max_hashes = content.split(|c| c != '#').map(str::len).max().unwrap_or(0);
            match self.rand(3) {
                0 if !content.contains('"') => {
                    self.push("r\"");
                    for c in content.chars() {
                        positions.push(self.here());
                        self.push(&c.to_string());
                    }
                    positions.push(self.here());
                    self.push("\"");
                }
                1 => {
                    let hashes = "#".repeat(max_hashes + 1);
                    self.push(&format!("r{hashes}\""));
                    for c in content.chars() {
                        positions.push(self.here());
                        self.push(&c.to_string());
                    }
                    positions.push(self.here());
                    self.push(&format!("\"{hashes}"));
                }
                _ => {
                    self.push("\"");
                    for c in content.chars() {
                        // A continuation swallows following whitespace, so
                        // only put one before a non-whitespace char.
                        if !c.is_whitespace() && self.rand(8) == 0 {
                            self.push("\\\n  \t");
                        }
                        positions.push(self.here());
                        let text = match (c, self.rand(4)) {
                            ('"', _) => "\\\"".to_owned(),
                            ('\\', _) => "\\\\".to_owned(),
                            ('\n', 0) => "\\n".to_owned(),
                            (c, 1) => format!("\\u{{{:x}}}", c as u32),
                            (c, 2) if c.is_ascii() => format!("\\x{:02X}", c as u32),
                            (c, 2) => {
                                let mut buf = [0u8; 4];
                                c.encode_utf8(&mut buf)
                                    .bytes()
                                    .map(|b| format!("\\x{b:02x}"))
                                    .collect()
                            }
                            (c, _) => c.to_string(),
                        };
                        self.push(&text);
                    }
                    positions.push(self.here());
                    self.push("\"");
                }
            }
            positions
        }

        fn value(&mut self, g: &G, path: Vec<Step>, key_pos: Option<Position>) {
            let start = self.here();
            let mut chars = None;
            let mut len = None;
            match g {
                G::Atom(s) => self.push(s),
                G::Str(s) => chars = Some(self.string(s)),
                G::List(items) => {
                    len = Some(items.len());
                    self.push("[");
                    self.elements(items, &path, "]");
                }
                G::Tuple(name, items) => {
                    len = Some(items.len());
                    if let Some(name) = name {
                        self.push(name);
                        self.ws();
                    }
                    self.push("(");
                    self.elements(items, &path, ")");
                }
                G::Struct(name, fields) => {
                    len = Some(fields.len());
                    if let Some(name) = name {
                        self.push(name);
                        self.ws();
                    }
                    self.push("(");
                    for (i, (field, value)) in fields.iter().enumerate() {
                        self.ws();
                        let key_pos = self.here();
                        self.push(field);
                        self.ws();
                        self.push(":");
                        self.ws();
                        let mut p = path.clone();
                        p.push(Step::field(field.strip_prefix("r#").unwrap_or(field)));
                        self.value(value, p, Some(key_pos));
                        self.ws();
                        if i + 1 < fields.len() || self.rand(2) == 0 {
                            self.push(",");
                        }
                    }
                    self.ws();
                    self.push(")");
                }
                G::Map(entries) => {
                    len = Some(entries.len());
                    self.push("{");
                    for (i, (key, value)) in entries.iter().enumerate() {
                        self.ws();
                        let key_pos = self.here();
                        let step = match key {
                            MapKey::Str(s) => {
                                self.string(s);
                                Step::key(s)
                            }
                            MapKey::Int(n) => {
                                self.push(&n.to_string());
                                Step::Key(n.to_string())
                            }
                        };
                        self.ws();
                        self.push(":");
                        self.ws();
                        let mut p = path.clone();
                        p.push(step);
                        self.value(value, p, Some(key_pos));
                        self.ws();
                        if i + 1 < entries.len() || self.rand(2) == 0 {
                            self.push(",");
                        }
                    }
                    self.ws();
                    self.push("}");
                }
            }
            self.expected.push(Expected {
                path,
                start,
                key_pos,
                len,
                chars,
            });
        }

        fn elements(&mut self, items: &[G], path: &[Step], close: &str) {
            for (i, item) in items.iter().enumerate() {
                self.ws();
                let mut p = path.to_vec();
                p.push(Step::Index(i));
                self.value(item, p, None);
                self.ws();
                // A 1-tuple needs no comma in RON, but a comma is allowed.
                if i + 1 < items.len() || self.rand(2) == 0 {
                    self.push(",");
                }
            }
            self.ws();
            self.push(close);
        }
    }

    fn emit(g: &G, seed: u64) -> (String, Vec<Expected>) {
        let mut e = Emitter {
            out: String::new(),
            line: 1,
            col: 1,
            rng: seed | 1,
            expected: Vec::new(),
        };
        if e.rand(4) == 0 {
            e.push("#![enable(implicit_some)]\n");
        }
        e.ws();
        e.value(g, Vec::new(), None);
        e.ws();
        (e.out, e.expected)
    }

    fn string_content() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec![
                'a', 'b', 'x', ' ', '"', '\\', ')', ']', '}', '/', '#', '\n', 'ü', '😀', '\'', ',',
                ':',
            ]),
            0..8,
        )
        .prop_map(|v| v.into_iter().collect())
    }

    fn gen_value() -> impl Strategy<Value = G> {
        let leaf = prop_oneof![
            string_content().prop_map(G::Str),
            prop::sample::select(vec![
                "0", "-1.5e3", "0x1F", "1_000", "+3", "inf", "-inf", "NaN", "2.5", "true", "false",
                "None", "Unit", "'a'", "'\\''", "')'", "'\"'",
            ])
            .prop_map(|s| G::Atom(s.to_owned())),
        ];
        // `Some` is special in ron (an option with exactly one value).
        let name = prop::option::of(prop::sample::select(vec!["Node", "Bool", "Ünï"]))
            .prop_map(|n| n.map(str::to_owned));
        let tuple_name = prop::option::of(prop::sample::select(vec!["Some", "Node", "Ünï"]))
            .prop_map(|n| n.map(str::to_owned));
        let field = prop::sample::select(vec!["a", "b", "name", "op", "r#type", "x_1", "ünï"])
            .prop_map(str::to_owned);
        let key = prop_oneof![
            string_content().prop_map(MapKey::Str),
            (-50i64..50).prop_map(MapKey::Int),
        ];
        leaf.prop_recursive(6, 256, 8, move |inner| {
            prop_oneof![
                (
                    name.clone(),
                    prop::collection::vec((field.clone(), inner.clone()), 1..5)
                )
                    .prop_map(|(n, mut fields)| {
                        let mut seen = std::collections::HashSet::new();
                        fields.retain(|(f, _)| seen.insert(f.clone()));
                        G::Struct(n, fields)
                    }),
                (
                    tuple_name.clone(),
                    prop::collection::vec(inner.clone(), 0..4)
                )
                    .prop_map(|(n, items)| {
                        let n = n.filter(|n| n != "Some" || items.len() == 1);
                        G::Tuple(n, items)
                    }),
                prop::collection::vec(inner.clone(), 0..5).prop_map(G::List),
                prop::collection::vec((key.clone(), inner.clone()), 0..5).prop_map(
                    |mut entries| {
                        let mut seen = std::collections::HashSet::new();
                        entries.retain(|(k, _)| {
                            seen.insert(match k {
                                MapKey::Str(s) => format!("s{s}"),
                                MapKey::Int(n) => format!("i{n}"),
                            })
                        });
                        G::Map(entries)
                    }
                ),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn generated_documents_index_exactly((g, seed) in (gen_value(), any::<u64>())) {
            let (text, expected) = emit(&g, seed);
            // The generator must produce RON that ron accepts, or the test
            // would prove nothing about real documents.
            let parsed: Result<ron::Value, _> = ron::from_str(&text);
            prop_assert!(parsed.is_ok(), "ron rejected {text:?}: {parsed:?}");
            let idx = SpanIndex::scan(&text);
            for e in &expected {
                prop_assert_eq!(idx.position(&e.path), Some(e.start), "path {:?} in {:?}", e.path, text);
                prop_assert_eq!(idx.nearest(&e.path), e.start);
                prop_assert_eq!(idx.len(&e.path), e.len, "len {:?}", e.path);
                if let Some(kp) = e.key_pos {
                    prop_assert_eq!(idx.key_position(&e.path), Some(kp), "key {:?} in {:?}", e.path, text);
                }
                match &e.chars {
                    Some(chars) => {
                        for (i, p) in chars.iter().enumerate() {
                            prop_assert_eq!(idx.string_char_position(&e.path, i), Some(*p), "char {} of {:?} in {:?}", i, e.path, text);
                        }
                        prop_assert_eq!(idx.string_char_position(&e.path, chars.len() + 5), chars.last().copied());
                    }
                    None => prop_assert_eq!(idx.string_char_position(&e.path, 0), None),
                }
            }
        }
    }

    fn random_path() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                (0usize..4).prop_map(Step::Index),
                prop::sample::select(vec!["a", "b", "name", "type", "3", "x"])
                    .prop_map(Step::field),
                prop::sample::select(vec!["a", "b", "3", "", "x ) // y"]).prop_map(Step::key),
            ],
            0..6,
        )
    }

    fn exercise(text: &str, path: &[Step], offset: usize) {
        let idx = SpanIndex::scan(text);
        let _ = idx.nearest(path);
        let _ = idx.position(path);
        let _ = idx.key_position(path);
        let _ = idx.len(path);
        let _ = idx.string_char_position(path, offset);
        for i in 0..path.len() {
            let _ = idx.string_char_position(&path[..i], offset);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn garbage_never_panics(
            chars in prop::collection::vec(
                prop_oneof![
                    3 => prop::sample::select(vec![
                        '(', ')', '[', ']', '{', '}', ',', ':', '"', '\'', '\\', '/', '*', '#',
                        '!', 'r', 'b', 'x', 'u', '{', '0', '-', '.', ' ', '\n', '\r', 'é', '😀',
                    ]),
                    1 => any::<char>(),
                ],
                0..120,
            ),
            path in random_path(),
            offset in 0usize..12,
        ) {
            let text: String = chars.into_iter().collect();
            exercise(&text, &path, offset);
        }

        #[test]
        fn mutated_documents_never_panic(
            (g, seed) in (gen_value(), any::<u64>()),
            cut in any::<prop::sample::Index>(),
            edits in prop::collection::vec(
                (any::<prop::sample::Index>(), prop::option::of(prop::sample::select(vec![
                    '(', ')', '[', ']', '{', '}', ',', ':', '"', '\'', '\\', '/', '*', '#', 'r',
                ]))),
                0..4,
            ),
            path in random_path(),
            offset in 0usize..12,
        ) {
            let (text, _) = emit(&g, seed);
            let mut chars: Vec<char> = text.chars().collect();
            for (at, replacement) in edits {
                if chars.is_empty() {
                    break;
                }
                let i = at.index(chars.len());
                match replacement {
                    Some(c) => chars.insert(i, c),
                    None => {
                        chars.remove(i);
                    }
                }
            }
            let truncated = cut.index(chars.len() + 1);
            let full: String = chars.iter().collect();
            let cut_text: String = chars[..truncated].iter().collect();
            exercise(&full, &path, offset);
            exercise(&cut_text, &path, offset);
        }
    }
}
