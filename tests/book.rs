//! The book's worked examples are produced by the CLI; this test re-runs every one and fails
//! when the book and the CLI disagree.
//!
//! A block fenced as ```console whose lines start with `$ fusebox ...` is a command; the lines
//! after it, up to the next `$` line, are its expected output (stdout, then stderr). Run with
//! `FUSEBOX_BLESS=1` to rewrite the blocks from the current CLI instead of comparing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs one `fusebox ...` command line from the repository root; returns what it printed.
fn run(command_line: &str) -> String {
    let words: Vec<&str> = command_line.split_whitespace().collect();
    assert_eq!(
        words[0], "fusebox",
        "book commands must start with `fusebox`"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(&words[1..])
        .current_dir(repo())
        .output()
        .expect("the fusebox binary runs");
    let mut text = String::from_utf8_lossy(&output.stdout).to_string();
    text += &String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        text += &format!("[exit status {}]\n", output.status.code().unwrap_or(-1));
    }
    text
}

/// Checks (or with bless, rewrites) every console block of one chapter; returns mismatches.
fn check_chapter(path: &Path, bless: bool) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    let mut failures = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        out += line;
        out.push('\n');
        if line.trim() != "```console" {
            continue;
        }
        // Inside a console block: commands and their outputs until the closing fence.
        let mut block: Vec<&str> = Vec::new();
        for inner in lines.by_ref() {
            if inner.trim() == "```" {
                break;
            }
            block.push(inner);
        }
        let mut i = 0;
        while i < block.len() {
            let command = block[i].strip_prefix("$ ").unwrap_or_else(|| {
                panic!(
                    "{}: console block line `{}` is not a `$ ` command",
                    path.display(),
                    block[i]
                )
            });
            let mut expected = String::new();
            i += 1;
            while i < block.len() && !block[i].starts_with("$ ") {
                expected += block[i];
                expected.push('\n');
                i += 1;
            }
            let actual = run(command);
            if actual != expected {
                failures.push(format!(
                    "{}: `{command}`\n--- book ---\n{expected}--- cli ---\n{actual}",
                    path.display()
                ));
            }
            out += &format!("$ {command}\n{actual}");
        }
        out += "```\n";
    }
    if bless && out != text {
        std::fs::write(path, out).unwrap();
        return Vec::new();
    }
    failures
}

#[test]
fn book_examples_match_the_cli() {
    let bless = std::env::var_os("FUSEBOX_BLESS").is_some();
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(repo().join("book/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    let mut commands = 0;
    let mut failures = Vec::new();
    for chapter in &chapters {
        commands += std::fs::read_to_string(chapter)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("$ fusebox"))
            .count();
        failures.extend(check_chapter(chapter, bless));
    }
    assert!(
        commands >= 5,
        "the book should show the CLI at work ({commands} commands found)"
    );
    assert!(
        failures.is_empty(),
        "the book disagrees with the CLI (rerun with FUSEBOX_BLESS=1 to update):\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_chapter_is_in_the_summary() {
    let summary = std::fs::read_to_string(repo().join("book/src/SUMMARY.md")).unwrap();
    for entry in std::fs::read_dir(repo().join("book/src")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            assert!(
                summary.contains(&format!("({name})")),
                "{name} is missing from SUMMARY.md"
            );
        }
    }
}

/// mdBook `{{#include path}}` directives must point at files that exist, so an included rule or
/// graph file cannot silently disappear from the book.
#[test]
fn includes_resolve() {
    for entry in std::fs::read_dir(repo().join("book/src")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for piece in text.split("{{#include ").skip(1) {
            let target = piece
                .split("}}")
                .next()
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .trim();
            let resolved = repo().join("book/src").join(target);
            assert!(
                resolved.exists(),
                "{}: include `{target}` does not exist",
                path.display()
            );
        }
    }
}

/// The authoring chapter's ELU, evaluated on chosen inputs and compared with ELU computed here.
#[test]
fn authoring_chapter_elu_matches_an_independent_computation() {
    use fusebox::rules::RuleSet;
    use fusebox::tensor::Tensor;
    let rules = RuleSet::load_dir(&repo().join("book/examples/elu/rules")).unwrap();
    let (graph, _) =
        fusebox::graph::file::load(&repo().join("book/examples/elu/graph.ron"), &rules.ops)
            .unwrap();
    let x: Vec<f64> = (0..8 * 16).map(|i| (i as f64 - 64.0) / 16.0).collect();
    let b: Vec<f64> = (0..16).map(|j| (j as f64 - 8.0) / 32.0).collect();
    let mut inputs = fusebox::eval::Tensors::new();
    inputs.insert(
        "x".into(),
        Tensor::from_values(fusebox::dtype::DType::F32, &[8, 16], x.clone()).unwrap(),
    );
    inputs.insert(
        "b".into(),
        Tensor::from_values(fusebox::dtype::DType::F32, &[16], b.clone()).unwrap(),
    );
    let out = fusebox::eval::evaluate(&graph, &rules.ops, &inputs).unwrap();
    let y = out["y"].values();
    for i in 0..8 {
        for j in 0..16 {
            let z = x[i * 16 + j] + b[j];
            let expected = if z > 0.0 { z } else { 0.5 * z.exp_m1() };
            let got = y[i * 16 + j];
            assert!(
                (got - expected).abs() <= 1e-6 * expected.abs().max(1e-3),
                "elu({z}) = {got}, expected {expected}"
            );
        }
    }
}

/// The authoring chapter's composite `scaled_softmax`, evaluated on chosen inputs and compared
/// with softmax(x * 0.125) computed here.
#[test]
fn authoring_chapter_composite_matches_an_independent_computation() {
    use fusebox::rules::RuleSet;
    use fusebox::tensor::Tensor;
    let rules = RuleSet::load_dir(&repo().join("book/examples/composite/rules")).unwrap();
    let (graph, _) = fusebox::graph::file::load(
        &repo().join("book/examples/composite/graph.ron"),
        &rules.ops,
    )
    .unwrap();
    let s: Vec<f64> = (0..4 * 8).map(|i| ((i * 7) % 19) as f64 - 9.0).collect();
    let mut inputs = fusebox::eval::Tensors::new();
    inputs.insert(
        "s".into(),
        Tensor::from_values(fusebox::dtype::DType::F32, &[4, 8], s.clone()).unwrap(),
    );
    let out = fusebox::eval::evaluate(&graph, &rules.ops, &inputs).unwrap();
    let p = out["p"].values();
    for row in 0..4 {
        let scaled: Vec<f64> = s[row * 8..row * 8 + 8].iter().map(|v| v * 0.125).collect();
        let total: f64 = scaled.iter().map(|v| v.exp()).sum();
        for j in 0..8 {
            let expected = scaled[j].exp() / total;
            let got = p[row * 8 + j];
            assert!(
                (got - expected).abs() <= 1e-6,
                "row {row}, column {j}: {got} vs {expected}"
            );
        }
    }
}

/// Compares `text` with the book's generated listing `name` (under book/src/generated/), or
/// rewrites the listing under `FUSEBOX_BLESS`.
fn check_listing(name: &str, text: &str) {
    let path = repo().join("book/src/generated").join(name);
    if std::env::var_os("FUSEBOX_BLESS").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let book = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        book == text,
        "book/src/generated/{name} is stale (rerun with FUSEBOX_BLESS=1 to update)"
    );
}

/// A graph of the book (a path from the repository root) optimized under the default rules
/// and options, and lowered.
fn lowered_book_graph(path: &str) -> fusebox::lower::Program {
    let rules = fusebox::rules::RuleSet::defaults();
    let graph = fusebox::graph::file::load(&repo().join(path), &rules.ops)
        .unwrap()
        .0;
    let optimized =
        fusebox::optimize::optimize(&graph, &rules, &fusebox::optimize::Options::default())
            .unwrap();
    fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap()
}

/// An example optimized under the default rules and `profile`, and lowered.
fn lowered_example(example: &str, profile: &str) -> fusebox::lower::Program {
    let rules = fusebox::rules::RuleSet::defaults();
    let path = repo().join("examples").join(format!("{example}.ron"));
    let graph = fusebox::graph::file::load(&path, &rules.ops).unwrap().0;
    let options = fusebox::optimize::Options {
        profile: profile.into(),
        ..Default::default()
    };
    let optimized = fusebox::optimize::optimize(&graph, &rules, &options).unwrap();
    fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap()
}

/// The C module of an example, or only its last kernel function (from its signature on: the
/// prelude is the one the lowering chapter shows).
fn emitted_c(example: &str, last_kernel_only: bool) -> String {
    let module = fusebox::backend::cpu::module_source(&lowered_example(example, "cpu")).0;
    if !last_kernel_only {
        return module;
    }
    let start = module
        .rfind("\nvoid fb_")
        .expect("the module defines a kernel");
    module[start + 1..].to_string()
}

/// The joint graph in the training chapter is what `grad` makes of lstm_cell today.
#[test]
fn the_books_gradient_listing_is_grads() {
    let rules = fusebox::rules::RuleSet::defaults();
    let graph = fusebox::graph::file::load(&repo().join("examples/lstm_cell.ron"), &rules.ops)
        .unwrap()
        .0;
    let joint = fusebox::autodiff::grad(
        &graph,
        &rules.ops,
        &rules.gradients,
        &fusebox::autodiff::Wrt::AllFloatInputs,
    )
    .unwrap();
    check_listing(
        "lstm_cell_grad.ron",
        &fusebox::graph::file::to_ron(&joint.graph),
    );
}

/// The C listing in the lowering chapter is what the emitter produces for lstm_cell today.
#[test]
fn the_books_c_listing_is_the_emitters() {
    check_listing("lstm_cell.c", &emitted_c("lstm_cell", false));
}

/// The kernel listing in the layout chapter is what the emitter produces for lstm_cell_full
/// today: its one fused kernel.
#[test]
fn the_books_lstm_cell_full_kernel_is_the_emitters() {
    // One generated kernel (besides the epilogue of a library call).
    let program = lowered_example("lstm_cell_full", "cpu");
    let kernels = program
        .steps
        .iter()
        .filter(|s| matches!(s, fusebox::lower::Step::Kernel(_)));
    assert_eq!(kernels.count(), 1);
    check_listing(
        "lstm_cell_full_kernel.c",
        &emitted_c("lstm_cell_full", true),
    );
}

/// The CUDA listing in the CUDA chapter is what the emitter produces for lstm_cell today.
#[test]
fn the_books_cuda_listing_is_the_emitters() {
    use fusebox::backend::cuda::emit::{EmitOptions, emit_program};
    let program = lowered_example("lstm_cell", "h200");
    check_listing(
        "lstm_cell.cu",
        &emit_program(&program.kernels, &EmitOptions::default()).0,
    );
}

/// The flattened-transpose kernel in the layout chapter is what the C emitter produces for
/// book/examples/layout/flat_transpose.ron today: one kernel, whose 1-D domain is refined to
/// two axes so that `x` is read through strides, with no index map left.
#[test]
fn the_books_index_map_listing_is_the_emitters() {
    let program = lowered_book_graph("book/examples/layout/flat_transpose.ron");
    assert_eq!(program.kernels.len(), 1);
    assert_eq!(program.kernels[0].rank, 2);
    assert!(program.kernels[0].loads.iter().all(|v| !v.is_mapped()));
    let module = fusebox::backend::cpu::module_source(&program).0;
    let start = module
        .rfind("\nvoid fb_")
        .expect("the module defines a kernel");
    check_listing("flat_transpose_kernel.c", &module[start + 1..]);
}

/// The CUDA softmax row kernel in the "Row kernels on CUDA" section is what the CUDA emitter
/// produces for examples/softmax.ron under the GPU profile today: one kernel, whose text
/// (from its header comment on; the prelude is the CUDA chapter's) is the listing.
#[test]
fn the_books_cuda_softmax_listing_is_the_emitters() {
    use fusebox::backend::cuda::emit::{EmitOptions, emit_program};
    let program = lowered_example("softmax", "h200");
    assert_eq!(program.kernels.len(), 1, "softmax is one kernel on CUDA");
    assert!(program.kernels[0].is_row_kernel());
    let module = emit_program(&program.kernels, &EmitOptions::default()).0;
    let start = module
        .rfind("\n/* fbc_")
        .expect("the module defines a kernel");
    check_listing("softmax.cu", &module[start + 1..]);
}

/// The softmax row kernel in the "Reductions inside kernels" section is what the C emitter
/// produces for examples/softmax.ron today.
#[test]
fn the_books_softmax_listing_is_the_emitters() {
    assert_eq!(
        lowered_example("softmax", "cpu").kernels.len(),
        1,
        "softmax is one kernel"
    );
    check_listing("softmax.c", &emitted_c("softmax", true));
}

/// The per-segment function in the Concat section is what the C emitter produces for
/// examples/layout_mix.ron today: its second kernel reads the concat by ranges, and the C
/// function of that kernel (the last of the module) runs one piece per segment.
#[test]
fn the_books_per_segment_listing_is_the_emitters() {
    let program = lowered_example("layout_mix", "cpu");
    assert_eq!(program.kernels.len(), 2, "layout_mix is two kernels");
    let text = emitted_c("layout_mix", true);
    assert!(text.contains("_s2(cut, strides, moved, ptrs)"), "{text}");
    check_listing("layout_mix_segments.c", &text);
}

/// The vector step in the chapter's "Row kernels reading a concat along their rows" is what
/// the C emitter produces for book/examples/layout/softmax_of_features.ron today: the first
/// pass's one-vector loop, with a step per segment and the masked step.
#[test]
fn the_books_row_concat_step_is_the_emitters() {
    let example = "../book/examples/layout/softmax_of_features";
    let program = lowered_example(example, "cpu");
    assert_eq!(
        program.kernels.len(),
        1,
        "softmax_of_features is one kernel"
    );
    assert!(program.kernels[0].selects_along_rows());
    let text = emitted_c(example, true);
    let open = "for (; j < jv; j += 16) {";
    let start = text.find(open).expect("the maximum's one-vector loop");
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = start - line_start;
    let close = format!("\n{}}}\n", " ".repeat(indent));
    let end = start + text[start..].find(&close).expect("the loop closes") + close.len();
    let step: String = text[line_start..end]
        .lines()
        .map(|line| line.get(indent..).unwrap_or(line.trim_start()))
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(step.contains("else if (j >= rs1"), "{step}");
    check_listing("softmax_of_features_step.c", &step);
}

/// The column walk in the "Reductions along the concat's axis" section is what the C emitter
/// produces for book/examples/layout/column_sums_of_batch_concat.ron today: one kernel whose
/// function runs the loop nest choosing a piece per row (`_r`) once the launch's ranges tile
/// the axis. The listing is that nest's column walk, then the function the program calls.
#[test]
fn the_books_per_row_pieces_listing_is_the_emitters() {
    let program = lowered_book_graph("book/examples/layout/column_sums_of_batch_concat.ron");
    assert_eq!(program.kernels.len(), 1);
    let module = fusebox::backend::cpu::module_source(&program).0;
    let nest = module
        .find("_n(const int64_t *sizes")
        .expect("the per-row nest");
    // The walk: the first loop over the rows in the nest, through its closing brace.
    let lines: Vec<&str> = module[nest..].lines().collect();
    let first = lines
        .iter()
        .position(|l| l.trim() == "for (int64_t o = 0; o < outer; o++) {")
        .expect("the column walk");
    let indent = &lines[first][..lines[first].len() - lines[first].trim_start().len()];
    let last = first
        + lines[first..]
            .iter()
            .position(|l| *l == format!("{indent}}}"))
            .expect("the walk's end");
    let walk: Vec<String> = lines[first..=last]
        .iter()
        .map(|l| l.strip_prefix(indent).unwrap_or(l).to_string())
        .collect();
    let wrapper = &module[module.rfind("\nvoid fb_").expect("the kernel's function") + 1..];
    check_listing(
        "column_sums_of_batch_concat_walk.c",
        &format!("{}\n\n{wrapper}", walk.join("\n")),
    );
}

/// `book/examples/gemm/no_epilogues/fusion.ron`, which the GEMM chapter calls the default
/// `fusion.ron` with `library_epilogues` off, is that: its comment header, then the shipped
/// file with that one line changed.
#[test]
fn the_books_rules_without_epilogues_are_the_shipped_rules_but_one_line() {
    let shipped = std::fs::read_to_string(repo().join("rules/fusion.ron")).unwrap();
    let book =
        std::fs::read_to_string(repo().join("book/examples/gemm/no_epilogues/fusion.ron")).unwrap();
    let off = shipped.replace(
        "    library_epilogues: true,",
        "    library_epilogues: false,",
    );
    assert_ne!(off, shipped);
    let header = book
        .strip_suffix(off.as_str())
        .expect("the shipped rules, one line off");
    assert!(header.lines().all(|l| l.starts_with("//")), "{header}");
}
