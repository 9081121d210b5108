//! The module layering the book's architecture chapter states is the layering the code has.
//!
//! The chapter's table lists every module in data-flow order with the modules it may use. This
//! test reads that table, reads every source file under `src/` (without its unit tests and
//! comments), and fails when a module refers to a module its row does not name, when a row
//! names a module listed below it, or when a source file belongs to no row. The table is the
//! rule; this test keeps the code, and the table, honest.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One row of the table: a module path (`rules::set`) and the modules it may use.
struct Row {
    module: String,
    may_use: BTreeSet<String>,
}

/// The names between backticks in a table cell.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// The rows of the chapter's module table, in order.
fn table() -> Vec<Row> {
    let chapter = fs::read_to_string(repo().join("book/src/architecture.md")).unwrap();
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in chapter.lines() {
        if line.starts_with("| module | concept | may use |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        assert_eq!(cells.len(), 3, "a table row has three cells: {line}");
        let module = ticked(cells[0]);
        assert_eq!(module.len(), 1, "the first cell names one module: {line}");
        rows.push(Row {
            module: module[0].clone(),
            may_use: ticked(cells[2]).into_iter().collect(),
        });
    }
    assert!(rows.len() > 10, "the module table was not found");
    rows
}

/// Every `.rs` file under `dir`, except test-only files.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The module path of a source file: `src/backend/cpu/emit.rs` → `backend::cpu::emit`.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(repo().join("src")).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The row a module path belongs to: the longest row that is a prefix of it.
fn row_of<'a>(module: &str, rows: &'a [Row]) -> Option<&'a Row> {
    rows.iter()
        .filter(|r| module == r.module || module.starts_with(&format!("{}::", r.module)))
        .max_by_key(|r| r.module.len())
}

/// The code of a file: its unit-test module cut off, comments removed line by line.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths `crate::…` references in `code` name, as far as they are lowercase
/// segments (`crate::backend::cuda::runtime::Device` → `backend::cuda::runtime`).
fn references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let mut segments = Vec::new();
        for segment in rest.split("::") {
            let name: String = segment
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let is_module = !name.is_empty()
                && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && name.len() == segment.len();
            if !is_module {
                if !name.is_empty() && name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                    // The last segment may be a module or a function: keep it as a candidate.
                    segments.push(name);
                }
                break;
            }
            segments.push(name);
        }
        if segments.is_empty() {
            // `crate::Error`, `crate::Result`: the root re-exports of `error`.
            found.insert("error".to_string());
        } else {
            found.insert(segments.join("::"));
        }
    }
    found
}

#[test]
fn every_module_uses_only_what_its_row_of_the_architecture_table_names() {
    let rows = table();
    let position: BTreeMap<&str, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.module.as_str(), i))
        .collect();
    let mut problems = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        for used in &row.may_use {
            match position.get(used.as_str()) {
                Some(&j) if j < i => {}
                Some(_) => problems.push(format!(
                    "`{}` may use `{used}`, which the table lists below it",
                    row.module
                )),
                None => problems.push(format!(
                    "`{}` may use `{used}`, which has no row",
                    row.module
                )),
            }
        }
    }
    let mut files = Vec::new();
    sources(&repo().join("src"), &mut files);
    files.sort();
    for file in &files {
        let module = module_of(file);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(row) = row_of(&module, &rows) else {
            problems.push(format!("{} belongs to no row of the table", file.display()));
            continue;
        };
        let text = fs::read_to_string(file).unwrap();
        for reference in references(&code(&text)) {
            let Some(target) = row_of(&reference, &rows) else {
                problems.push(format!(
                    "{}: `crate::{reference}` names no module of the table",
                    file.display()
                ));
                continue;
            };
            if target.module != row.module && !row.may_use.contains(&target.module) {
                problems.push(format!(
                    "{} (`{}`) uses `crate::{reference}`, but its row does not name `{}`",
                    file.display(),
                    row.module,
                    target.module
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_reference_scanner_finds_module_paths() {
    let sample = "use crate::backend::cuda::runtime::{Device, Event};\n\
                let e = crate::Error::backend(x);\n\
                crate::shape::numel(&s);";
    let found = references(sample);
    assert!(found.contains("backend::cuda::runtime"), "{found:?}");
    assert!(found.contains("error"), "{found:?}");
    assert!(found.contains("shape::numel"), "{found:?}");
    let rows = table();
    assert_eq!(
        row_of("backend::cuda::runtime", &rows).unwrap().module,
        "backend::cuda"
    );
    assert_eq!(row_of("rules::set", &rows).unwrap().module, "rules::set");
    assert_eq!(row_of("rules::ops", &rows).unwrap().module, "rules");
    assert_eq!(
        code("a // crate::x\n#[cfg(test)]\nmod tests { crate::y }"),
        "a "
    );
}

/// A source file's lines before its unit tests: what a reader has to hold to follow it.
const FILE_LINES: usize = 1000;
/// A function's lines, signature to closing brace.
const FUNCTION_LINES: usize = 150;

/// The functions of `text` (before its unit tests) longer than `limit` lines, as
/// `(name, first line, lines)`. A function starts at a line whose code begins with `fn`
/// (after visibility and qualifiers) and ends at the first later line that is its closing
/// brace at the same indentation, which `cargo fmt` guarantees; a declaration without a body
/// (`fn f();` in a trait) has none.
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let code = code(text);
    let lines: Vec<&str> = code.lines().map(str::trim_end).collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let mut rest = line.trim_start();
        for qualifier in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(qualifier).unwrap_or(rest);
        }
        let Some(signature) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = signature
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let signature_end = lines[i..]
            .iter()
            .find(|l| l.ends_with('{') || l.ends_with(';') || l.ends_with('}'));
        if signature_end.is_none_or(|l| l.ends_with(';')) {
            continue; // declared, not defined
        }
        // A one-line function (`fn f() {}`) closes where it opens.
        let closing = format!("{indent}}}");
        let end = if line.ends_with('}') {
            0
        } else {
            match lines[i..].iter().position(|l| *l == closing) {
                Some(end) => end,
                None => continue,
            }
        };
        if end + 1 > limit {
            found.push((name, i + 1, end + 1));
        }
    }
    found
}

#[test]
fn no_source_file_or_function_is_too_long_to_read() {
    let mut files = Vec::new();
    sources(&repo().join("src"), &mut files);
    files.sort();
    let mut problems = Vec::new();
    for path in &files {
        let text = fs::read_to_string(path).unwrap();
        let rel = path.strip_prefix(repo()).unwrap().display().to_string();
        let lines = code(&text).lines().count();
        if lines > FILE_LINES {
            problems.push(format!(
                "{rel}: {lines} lines before its tests (at most {FILE_LINES}): split it by concept"
            ));
        }
        for (name, line, length) in long_functions(&text, FUNCTION_LINES) {
            problems.push(format!(
                "{rel}:{line}: fn {name} is {length} lines (at most {FUNCTION_LINES})"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_length_scanner_measures_functions() {
    let body = "    x += 1;\n".repeat(3);
    let text = format!(
        "pub fn short() {{\n}}\n\nimpl A {{\n    pub(super) fn long(\n        a: u8,\n    ) {{\n{body}    }}\n\n    fn declared();\n}}\n"
    );
    assert_eq!(
        long_functions(&text, 1),
        vec![("short".to_string(), 1, 2), ("long".to_string(), 5, 7)]
    );
    assert!(long_functions(&text, 7).is_empty());
}
