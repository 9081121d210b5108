//! The emission corpus: the C and CUDA source fusebox emits for every example, every graph of
//! the book and 500 random graphs, written to a directory so that two revisions of the emitters
//! can be compared byte for byte (`benches/emit_corpus.sh`). A refactor of the lowering or the
//! emitters that is meant to change nothing shows it by an empty `diff -r` of the two corpora.
//!
//! Ignored by default (it writes files and proves nothing on its own); run with
//! `FUSEBOX_EMIT_CORPUS=DIR cargo test --release --test backends emit_corpus -- --ignored`.

use crate::common::random_graph;
use fusebox::graph::Graph;
use fusebox::optimize::Options;
use fusebox::rules::RuleSet;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// How many random graphs the corpus holds (float and integer graphs alternate).
const RANDOM_GRAPHS: usize = 500;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.ron` file under `dir` (sorted, so the corpus is the same on every machine).
fn ron_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            ron_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "ron") {
            found.push(path);
        }
    }
}

/// The C module and the CUDA translation unit of `graph` under `options` (its profile
/// replaced by each backend's), or the error that stopped either.
fn emitted(graph: &Graph, rules: &RuleSet, options: &Options) -> String {
    let mut text = String::new();
    for (profile, cuda) in [("cpu", false), ("h200", true)] {
        let options = Options {
            profile: profile.into(),
            ..options.clone()
        };
        let source = fusebox::optimize::optimize(graph, rules, &options)
            .map_err(|e| e.to_string())
            .and_then(|optimized| {
                fusebox::lower::lower(&optimized.dag, &optimized.partition)
                    .map_err(|e| e.to_string())
            })
            .map(|program| {
                if cuda {
                    use fusebox::backend::cuda::emit::{EmitOptions, emit_program};
                    emit_program(&program.kernels, &EmitOptions::default()).0
                } else {
                    fusebox::backend::cpu::module_source(&program).0
                }
            });
        let source = source.unwrap_or_else(|e| format!("error: {e}\n"));
        writeln!(text, "==== {profile}\n{source}").unwrap();
    }
    text
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// The examples (as written and under each AMP policy), the book's graphs that load with the
/// default rules, and the random graphs.
#[test]
#[ignore = "writes the corpus to $FUSEBOX_EMIT_CORPUS; see benches/emit_corpus.sh"]
fn emit_corpus() {
    let dir = PathBuf::from(
        std::env::var("FUSEBOX_EMIT_CORPUS").expect("FUSEBOX_EMIT_CORPUS names the directory"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let rules = RuleSet::defaults();
    let mut files = Vec::new();
    ron_files(&repo().join("examples"), &mut files);
    ron_files(&repo().join("book/examples"), &mut files);
    let mut graphs = 0;
    for path in &files {
        let Ok((graph, _)) = fusebox::graph::file::load(path, &rules.ops) else {
            continue; // a rule file, or a graph the book shows being refused
        };
        let stem = path
            .strip_prefix(repo())
            .unwrap()
            .to_string_lossy()
            .replace('/', "_");
        write(
            &dir,
            &format!("{stem}.txt"),
            &emitted(&graph, &rules, &Options::default()),
        );
        for amp in ["f16", "bf16"] {
            let options = Options {
                amp: Some(amp.into()),
                ..Options::default()
            };
            write(
                &dir,
                &format!("{stem}.{amp}.txt"),
                &emitted(&graph, &rules, &options),
            );
        }
        graphs += 1;
    }

    let config = Config::default();
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let dims = prop_oneof![
        Just((3usize, 4usize)),
        Just((1, 5)),
        Just((2, 1)),
        Just((0, 3)),
        Just((64, 700))
    ];
    let floats = (
        dims.clone(),
        prop::collection::vec((0usize..4, 0usize..6), 1..4),
        prop::collection::vec(random_graph::step(true), 2..14),
    );
    let ints = (
        dims,
        prop::collection::vec((0usize..2, 0usize..6), 1..4),
        prop::collection::vec(random_graph::int_step(true), 2..14),
    );
    let mut random = 0;
    let mut attempts = 0;
    while random < RANDOM_GRAPHS {
        attempts += 1;
        assert!(
            attempts < 20 * RANDOM_GRAPHS,
            "too few random graphs type-check"
        );
        let graph = if attempts % 2 == 0 {
            let (dims, inputs, steps) = floats.new_tree(&mut runner).unwrap().current();
            random_graph::build(&rules.ops, dims, &inputs, &steps)
        } else {
            let (dims, inputs, steps) = ints.new_tree(&mut runner).unwrap().current();
            random_graph::build_ints(&rules.ops, dims, &inputs, &steps)
        };
        let Some(graph) = graph else { continue };
        let mut text = fusebox::graph::file::to_ron(&graph);
        text.push_str(&emitted(&graph, &rules, &Options::default()));
        let strict = Options {
            strict_ieee: true,
            ..Options::default()
        };
        text.push_str(&emitted(&graph, &rules, &strict));
        write(&dir, &format!("random_{random:03}.txt"), &text);
        random += 1;
    }
    println!("emit corpus: {graphs} graph files (x3 policies), {random} random graphs");
}
