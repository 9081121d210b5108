//! Text bound for a terminal: names from graph and rule files are untrusted, so what the
//! command prints is escaped before it reaches stdout or stderr, and write errors there are
//! reported instead of ignored or turned into panics.

use std::io::Write;

/// `text` with every character a terminal would interpret rather than show replaced by
/// `\uXXXX` (four lowercase hex digits, the JSON spelling, so the escape also keeps `--json`
/// output valid JSON with the same meaning).
///
/// Escaped: the C0 controls except `\n` and `\t` (ESC starts the sequences that clear the
/// screen or retitle the window), DEL, the C1 controls, and the invisible marks that reorder or
/// hide text (bidirectional overrides and isolates, zero-width characters, line and paragraph
/// separators, the byte-order mark). Everything else passes unchanged, so ordinary output is
/// byte for byte what the commands produce.
pub fn escape(text: &str) -> String {
    if !text.chars().any(needs_escape) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    match c {
        '\n' | '\t' => false,
        // C0, DEL and C1.
        c if c.is_control() => true,
        // Zero-width space, joiners and direction marks.
        '\u{200b}'..='\u{200f}' => true,
        // Line and paragraph separators, bidirectional embeddings and overrides.
        '\u{2028}'..='\u{202e}' => true,
        // Word joiner, invisible operators, bidirectional isolates.
        '\u{2060}'..='\u{2069}' => true,
        '\u{feff}' => true,
        _ => false,
    }
}

/// What writing to stdout came to.
pub enum Printed {
    Done,
    /// The reader went away (`fusebox … | head`): nothing more can be delivered, and that is
    /// the reader's choice, not a failure of the command.
    Closed,
}

/// Writes `text`, escaped, to stdout and flushes it, so that a full disk or a closed file
/// descriptor is an error the caller reports (`print!` would panic, and an unflushed buffer
/// would fail silently at exit).
pub fn print(text: &str) -> std::io::Result<Printed> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(escape(text).as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(Printed::Done),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Printed::Closed),
        Err(e) => Err(e),
    }
}

/// Writes `text`, escaped, to stderr. A failure there has nowhere left to be reported, so it
/// is ignored rather than turned into a panic as `eprintln!` would.
pub fn print_error(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr
        .write_all(escape(text).as_bytes())
        .and_then(|()| stderr.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_invisible_marks_but_keeps_newlines_tabs_and_text() {
        assert_eq!(escape("a\tb\nc"), "a\tb\nc");
        assert_eq!(escape("\u{1b}[2J"), "\\u001b[2J");
        assert_eq!(escape("x\ry\u{7f}\u{9b}"), "x\\u000dy\\u007f\\u009b");
        assert_eq!(escape("ab\u{202e}cd"), "ab\\u202ecd");
        assert_eq!(escape("onnx::Tanh_21 → é"), "onnx::Tanh_21 → é");
    }

    #[test]
    fn escaped_json_stays_the_same_json() {
        let value = serde_json::json!({ "name": "a\u{7f}\u{85}\u{202e}b\u{1b}" });
        let text = escape(&serde_json::to_string(&value).unwrap());
        assert!(!text.chars().any(needs_escape));
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
    }
}
