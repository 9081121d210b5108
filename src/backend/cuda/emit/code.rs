//! Indented C++ text that drops the definitions nothing reads.
//!
//! NVRTC warns about locals declared but never referenced and variables set but never used,
//! and the compile checks fail on any warning. Which locals a kernel needs depends on its view
//! patterns (a coordinate only some views move along, a stride only `Strided` axes have), so
//! instead of predicting every case the emitter writes the full set of definitions and
//! [`Code::render`] removes, last to first, each definition whose names no later kept line
//! mentions. Lines with effects (stores, atomics, control flow) are always kept.

use std::collections::HashSet;

struct Line {
    depth: usize,
    text: String,
    /// The name this line writes; `None` for a line that must stay.
    defines: Option<String>,
    /// Whether the line's identifiers count as uses (not for comments).
    reads: bool,
}

/// A function body (or any block) under construction.
#[derive(Default)]
pub struct Code {
    lines: Vec<Line>,
    depth: usize,
}

impl Code {
    pub fn new() -> Code {
        Code::default()
    }

    fn push(&mut self, text: String, defines: Option<String>, reads: bool) {
        self.lines.push(Line {
            depth: self.depth,
            text,
            defines,
            reads,
        });
    }

    /// A line with effects: always kept.
    pub fn stmt(&mut self, text: impl Into<String>) {
        self.push(text.into(), None, true);
    }

    /// A line that only writes `name` (a declaration or an update): kept when a later kept
    /// line mentions `name`.
    pub fn def(&mut self, name: impl Into<String>, text: impl Into<String>) {
        self.push(text.into(), Some(name.into()), true);
    }

    /// A comment line; its words are not uses.
    pub fn comment(&mut self, text: impl Into<String>) {
        self.push(format!("/* {} */", text.into()), None, false);
    }

    /// `header {`, one level deeper.
    pub fn open(&mut self, header: impl AsRef<str>) {
        let header = header.as_ref();
        let text = if header.is_empty() {
            "{".to_string()
        } else {
            format!("{header} {{")
        };
        self.stmt(text);
        self.depth += 1;
    }

    pub fn close(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        self.stmt("}");
    }

    /// The kept lines of `inner` (those [`Code::render`] would write), added here as lines
    /// with effects, each at this block's depth plus its own. Names `inner` defines are then
    /// pruned within `inner` alone, while the names its kept lines read still keep this
    /// block's definitions of them: a loop body that defines the same names as a sibling loop
    /// (the passes of a row kernel) keeps exactly what it reads itself.
    pub fn splice(&mut self, inner: &Code) {
        for (line, kept) in inner.lines.iter().zip(inner.kept()) {
            if kept {
                self.lines.push(Line {
                    depth: self.depth + line.depth,
                    text: line.text.clone(),
                    defines: None,
                    reads: line.reads,
                });
            }
        }
    }

    /// The text, indented by `base` levels plus each line's own, without unread definitions.
    pub fn render(&self, base: usize) -> String {
        let mut out = String::new();
        for (line, kept) in self.lines.iter().zip(self.kept()) {
            if kept {
                for _ in 0..base + line.depth {
                    out.push_str("    ");
                }
                out.push_str(&line.text);
                out.push('\n');
            }
        }
        out
    }

    /// Per line, whether it is kept: it has effects, or a later kept line reads what it
    /// defines.
    fn kept(&self) -> Vec<bool> {
        let mut used: HashSet<&str> = HashSet::new();
        let mut keep = vec![false; self.lines.len()];
        for (i, line) in self.lines.iter().enumerate().rev() {
            if line
                .defines
                .as_ref()
                .is_none_or(|n| used.contains(n.as_str()))
            {
                keep[i] = true;
                if line.reads {
                    used.extend(identifiers(&line.text));
                }
            }
        }
        keep
    }
}

/// The identifiers in a line of C (numbers, with their suffixes and exponents, skipped).
fn identifiers(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push(&text[start..i]);
        } else if c.is_ascii_digit() {
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'.')
            {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_skip_numbers() {
        assert_eq!(
            identifiers("const I i1 = rem % n1 + (1e0f) + 0x7fLL;"),
            vec!["const", "I", "i1", "rem", "n1"]
        );
    }

    #[test]
    fn unread_definitions_are_dropped_transitively() {
        let mut code = Code::new();
        code.def("a", "int a = 1;");
        code.def("b", "int b = a + 1;");
        code.def("c", "int c = 2;");
        code.def("d", "int d = c;");
        code.open("if (x)");
        code.stmt("out[0] = b;");
        code.close();
        assert_eq!(
            code.render(0),
            "int a = 1;\nint b = a + 1;\nif (x) {\n    out[0] = b;\n}\n"
        );
    }

    /// A spliced block prunes its own definitions and keeps the outer ones it reads, even
    /// where a sibling block defines the same name.
    #[test]
    fn spliced_blocks_prune_their_own_definitions() {
        let mut code = Code::new();
        code.def("r", "const int r = 1;");
        code.def("s", "const int s = 2;");
        let mut first = Code::new();
        first.def("v", "const int v = r;");
        first.stmt("acc += r;");
        let mut second = Code::new();
        second.def("v", "const int v = s;");
        second.stmt("out[0] = v;");
        code.open("for (;;)");
        code.splice(&first);
        code.close();
        code.splice(&second);
        assert_eq!(
            code.render(0),
            "const int r = 1;\nconst int s = 2;\nfor (;;) {\n    acc += r;\n}\nconst int v = s;\nout[0] = v;\n"
        );
    }

    #[test]
    fn updates_keep_the_definition_they_read() {
        let mut code = Code::new();
        code.def("rem", "int rem = e;");
        code.def("i1", "const int i1 = rem % n1;");
        code.def("rem", "rem /= n1;");
        code.def("i0", "const int i0 = rem;");
        code.stmt("use(i1);");
        assert_eq!(
            code.render(0),
            "int rem = e;\nconst int i1 = rem % n1;\nuse(i1);\n"
        );
    }
}
