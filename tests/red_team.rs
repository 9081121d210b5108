//! The red-team suite: generated attacks on the `fusebox` command, by class, rather than the
//! handful of cases the hardening issue listed. Each class is driven by a seeded generator, so a
//! failure reproduces, and every case asserts the command's contract: exit status 0, or 1 with
//! one `error: …` message, never a panic, an abort or a signal; and where a compiled backend
//! succeeds, its result equals the reference evaluator's.
//!
//! - (a) output names as paths and escapes, run through `run --out`;
//! - (b) extreme integers in every integer attribute of every catalogue op;
//! - (c) values too large to allocate, on the reference and CPU backends and the CUDA paths;
//! - (d) formula size: the per-formula limit and the kernel body budget;
//! - (e) outputs on a full file system (a file-size limit), written all or none;
//! - (f) standard output that cannot be written, for every subcommand that prints;
//! - the messages the issue found misleading.

use fusebox::attr::AttrType;
use fusebox::rules::Catalogue;
use fusebox::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common;
use common::ok;

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch("red-team", name)
}

/// The command, run in `cwd` with a kernel cache of the test's own.
fn command(args: &[&str], cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    cmd.args(args)
        .current_dir(cwd)
        .env("FUSEBOX_CACHE_DIR", cwd.join("cache"));
    cmd
}

fn fusebox(args: &[&str], cwd: &Path) -> Output {
    command(args, cwd)
        .output()
        .expect("the fusebox binary runs")
}

/// The contract every case holds: exit 0, or exit 1 with an `error: ` message; no signal and
/// no panic or abort text. Returns whether the command succeeded.
#[track_caller]
fn held(out: &Output, case: &str) -> bool {
    let stderr = String::from_utf8_lossy(&out.stderr);
    for bad in [
        "panicked",
        "RUST_BACKTRACE",
        "memory allocation of",
        "a bug",
    ] {
        assert!(!stderr.contains(bad), "{case}: {stderr}");
    }
    match out.status.code() {
        Some(0) => true,
        Some(1) => {
            assert!(stderr.contains("error: "), "{case}: {stderr}");
            false
        }
        _ => panic!("{case}: ended by {:?}: {stderr}", out.status),
    }
}

/// Exit 1 with an error message; returns stderr.
#[track_caller]
fn refused(out: &Output, case: &str) -> String {
    assert!(!held(out, case), "{case}: succeeded but must fail");
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Runs `cmd` with its output captured, killed and failed as hung once it runs past
/// `deadline`: a regression that never ends (a read of a FIFO, an expansion without bound)
/// fails the test instead of hanging the suite.
#[track_caller]
fn bounded(mut cmd: Command, deadline: std::time::Duration, case: &str) -> Output {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command runs");
    // Drained on threads, so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{case}: {cmd:?} hung: still running after {deadline:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// `fusebox args` in `cwd` through `sh -c`, after the shell commands `limits` (a `ulimit`),
/// so that a resource limit applies to the child alone.
fn limited(limits: &str, args: &[&str], cwd: &Path) -> Command {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "{limits}; exec '{}' {}",
        env!("CARGO_BIN_EXE_fusebox"),
        quoted.join(" ")
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script])
        .current_dir(cwd)
        .env("FUSEBOX_CACHE_DIR", cwd.join("cache"));
    cmd
}

/// `fusebox args` in `cwd` under an address-space limit of `mib` MiB (`ulimit -v`), so an
/// allocation the system refuses fails as it does on a machine out of memory; hung past a
/// minute.
#[track_caller]
fn with_memory_limit(args: &[&str], cwd: &Path, mib: u64, case: &str) -> Output {
    let cmd = limited(&format!("ulimit -v {}", mib * 1024), args, cwd);
    bounded(cmd, std::time::Duration::from_secs(60), case)
}

/// A small deterministic generator (SplitMix64): the cases are the same on every run.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

/// Every path under `dir`, recursively, sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.is_symlink() {
            found.extend(tree(&path));
        }
        found.push(path);
    }
    found.sort();
    found
}

/// Asserts two `.npy` results agree within f32 rounding of fused arithmetic.
#[track_caller]
fn assert_close(want: &Path, got: &Path, case: &str) {
    let want = Tensor::read_npy(want).unwrap();
    let got = Tensor::read_npy(got).unwrap();
    assert_eq!(want.shape(), got.shape(), "{case}");
    for (w, g) in want.values().iter().zip(got.values()) {
        let same = (w.is_nan() && g.is_nan()) || *w == g || (w - g).abs() <= 1e-4 * (1.0 + w.abs());
        assert!(same, "{case}: reference {w}, cpu {g}");
    }
}

// ------------------------------------------------------------------ (a) names as paths

/// Pieces that names are assembled from: path syntax, escapes, control characters (no NUL:
/// RON strings cannot hold one unescaped and names with NUL are refused as strings), names
/// Windows reserves, Unicode that looks like something else, and percent signs that look
/// like an encoding.
const NAME_PIECES: &[&str] = &[
    "..",
    ".",
    "/",
    "/abs",
    "a/b",
    "\\",
    "C:\\x",
    "\u{1}",
    "\u{1b}[2J",
    "\u{7f}",
    "\u{85}",
    "\t",
    "CON",
    "nul",
    "COM1",
    "LPT9.txt",
    "aux",
    "é",
    "名前",
    "\u{202e}gpj.exe",
    "e\u{301}",
    "%2F",
    "%",
    " ",
    "~",
    "y",
];

/// A generated output name: one to four pieces, sometimes repeated into a very long name.
fn generated_name(rng: &mut Seeded) -> String {
    let pieces = 1 + rng.next() % 4;
    let mut name: String = (0..pieces).map(|_| *rng.pick(NAME_PIECES)).collect();
    if rng.next().is_multiple_of(6) {
        name = name.repeat(300 / name.len().max(1) + 1);
    }
    name
}

/// A graph of input `x` [3] whose nodes, all outputs, are named `names` (each `neg x`).
fn graph_with_outputs(names: &[String]) -> String {
    let nodes: String = names
        .iter()
        .map(|n| format!("Node(name: {n:?}, op: \"neg\", args: [\"x\"]),\n"))
        .collect();
    let outputs: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    format!(
        "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [3])],\n\
         nodes: [{nodes}], outputs: [{}])\n",
        outputs.join(", ")
    )
}

/// Generated output names, written with `run --out`: every file lands directly inside the
/// output directory, one per distinct name, nothing appears anywhere else, and the mapping
/// from name to file does not depend on the run or on the order of the outputs.
#[test]
fn generated_output_names_stay_inside_the_out_directory_with_a_stable_mapping() {
    let dir = scratch("names");
    let mut rng = Seeded(0x005e_ed0a);
    for round in 0..6 {
        let mut names: Vec<String> = Vec::new();
        while names.len() < 8 {
            let name = generated_name(&mut rng);
            // `x` is the input; a name is defined once.
            if name != "x" && !names.contains(&name) {
                names.push(name);
            }
        }
        let case = format!("round {round}: {names:?}");
        let work = dir.join(format!("r{round}"));
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("g.ron"), graph_with_outputs(&names)).unwrap();
        let run = |out: &str| {
            fusebox(
                &[
                    "run",
                    "g.ron",
                    "--backend",
                    "reference",
                    "--random-inputs",
                    "--out",
                    out,
                ],
                &work,
            )
        };
        assert!(held(&run("out"), &case), "{case}");
        let files: Vec<PathBuf> = tree(&work.join("out"));
        assert_eq!(files.len(), names.len(), "{case}: {files:?}");
        for file in &files {
            assert_eq!(file.parent(), Some(work.join("out").as_path()), "{case}");
            assert!(file.is_file(), "{case}: {file:?}");
        }
        // Nothing beside the graph, the outputs and the cache was created.
        let allowed = ["g.ron", "out", "cache"];
        for entry in std::fs::read_dir(&work).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().to_string();
            assert!(
                allowed.contains(&name.as_str()),
                "{case}: {name} was created"
            );
        }
        assert!(!dir.join("escaped.npy").exists() && !Path::new("/abs.npy").exists());
        // The same names in reverse order map to the same files.
        names.reverse();
        std::fs::write(work.join("g.ron"), graph_with_outputs(&names)).unwrap();
        assert!(held(&run("again"), &case), "{case}");
        let again: Vec<_> = tree(&work.join("again"))
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        let first: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(again, first, "{case}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------- (b) extreme integers in attributes

/// The integers at the edges: zero, minus one, the i32 edges, the edges of exact f64 integers,
/// the i64 edges and u64's maximum.
const EXTREME_INTEGERS: &[&str] = &[
    "0",
    "-1",
    "2147483648",
    "-2147483648",
    "9007199254740991",
    "9007199254740993",
    "-9007199254740993",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
];

/// A value of type `ty` that an attribute can usually take, for the attributes a case does
/// not vary.
fn ordinary(ty: AttrType) -> &'static str {
    match ty {
        AttrType::Float => "1.0",
        AttrType::Int => "0",
        AttrType::Bool => "false",
        AttrType::Ints => "[1, 0]",
        AttrType::DType => "\"f32\"",
    }
}

/// Every integer attribute of every op of the default catalogue, read from the catalogue,
/// set to each extreme integer (alone, and as a list entry): `check`, `optimize`, and `run` on
/// the reference and CPU backends end with status 0 or 1, and where both runs succeed they
/// agree.
#[test]
fn extreme_integers_in_every_integer_attribute_never_crash_and_never_miscompute() {
    let dir = scratch("integers");
    let catalogue = Catalogue::defaults();
    let mut cases = 0;
    let mut compared = 0;
    for op in catalogue.ops() {
        let spec = &op.spec;
        let int_attrs: Vec<_> = spec
            .attrs
            .iter()
            .filter(|a| matches!(a.ty, AttrType::Int | AttrType::Ints))
            .collect();
        for attr in int_attrs {
            for value in EXTREME_INTEGERS {
                let shown = match attr.ty {
                    AttrType::Ints => format!("[{value}, 1]"),
                    _ => value.to_string(),
                };
                let mut attrs = vec![format!("{:?}: {shown}", attr.name)];
                for other in &spec.attrs {
                    if other.name != attr.name && other.default.is_none() && !other.optional {
                        attrs.push(format!("{:?}: {}", other.name, ordinary(other.ty)));
                    }
                }
                let operands = spec.operands.len() + usize::from(spec.variadic);
                let args = vec!["\"x\""; operands];
                let graph = format!(
                    "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [2, 3])],\n\
                     nodes: [Node(name: \"y\", op: {:?}, args: [{}], attrs: {{{}}}),\n\
                     Node(name: \"z\", op: \"exp\", args: [\"y\"])],\n\
                     outputs: [\"z\"])\n",
                    spec.name,
                    args.join(", "),
                    attrs.join(", ")
                );
                let case = format!("{} {} = {value}", spec.name, attr.name);
                std::fs::write(dir.join("g.ron"), &graph).unwrap();
                cases += 1;
                if !held(&fusebox(&["check", "g.ron"], &dir), &case) {
                    continue;
                }
                held(&fusebox(&["optimize", "g.ron"], &dir), &case);
                let run = |backend: &str| {
                    let out = format!("out-{backend}");
                    let _ = std::fs::remove_dir_all(dir.join(&out));
                    let result = fusebox(
                        &[
                            "run",
                            "g.ron",
                            "--backend",
                            backend,
                            "--random-inputs",
                            "--out",
                            &out,
                        ],
                        &dir,
                    );
                    held(&result, &case).then(|| dir.join(out).join("z.npy"))
                };
                if let (Some(want), Some(got)) = (run("reference"), run("cpu")) {
                    assert_close(&want, &got, &case);
                    compared += 1;
                }
            }
        }
    }
    assert!(
        cases >= 50,
        "only {cases} cases: the catalogue lost its integer attributes?"
    );
    assert!(compared >= 5, "only {compared} cases ran on both backends");
    std::fs::remove_dir_all(&dir).unwrap();
}

// --------------------------------------------------------- (c) allocation beyond the limits

/// Values far too large for memory, made by `broadcast_to` from a one-element input, and
/// inputs declared that large: every backend refuses them with an error (the reference and
/// CPU backends, and the CUDA paths, which must refuse before any device is needed), never
/// an abort.
#[test]
fn values_beyond_the_allocation_limits_are_refused_on_every_backend() {
    let dir = scratch("alloc");
    let mut rng = Seeded(0xa110c);
    let shapes: Vec<String> = (0..6)
        .map(|_| {
            let exponent = 49 + rng.next() % 15;
            match rng.next() % 3 {
                0 => format!("[{}]", 1u64 << exponent),
                1 => format!(
                    "[{}, {}]",
                    1u64 << (exponent / 2),
                    1u64 << (exponent - exponent / 2)
                ),
                _ => format!("[4294967296, 4294967296, {}]", 1 + rng.next() % 7),
            }
        })
        .collect();
    for shape in &shapes {
        let graphs = [
            format!(
                "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [1])],\n\
                 nodes: [Node(name: \"b\", op: \"broadcast_to\", args: [\"x\"], attrs: {{\"shape\": {shape}}}),\n\
                 Node(name: \"s\", op: \"sum\", args: [\"b\"])], outputs: [\"s\"])\n"
            ),
            format!(
                "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: {shape})],\n\
                 nodes: [Node(name: \"s\", op: \"sum\", args: [\"x\"])], outputs: [\"s\"])\n"
            ),
        ];
        for graph in &graphs {
            std::fs::write(dir.join("g.ron"), graph).unwrap();
            let case = format!("shape {shape}");
            for args in [
                &["check", "g.ron"][..],
                &[
                    "run",
                    "g.ron",
                    "--backend",
                    "reference",
                    "--random-inputs",
                    "--out",
                    "o",
                ],
                &[
                    "run",
                    "g.ron",
                    "--backend",
                    "cpu",
                    "--random-inputs",
                    "--out",
                    "o",
                ],
                &[
                    "run",
                    "g.ron",
                    "--backend",
                    "cuda",
                    "--random-inputs",
                    "--out",
                    "o",
                ],
                &["optimize", "g.ron", "--emit", "cuda", "--out", "k.cu"],
                &["optimize", "g.ron", "--emit", "c", "--out", "k.c"],
            ] {
                let stderr = refused(&fusebox(args, &dir), &format!("{case}: {args:?}"));
                assert!(
                    stderr.contains("elements") || stderr.contains("too large"),
                    "{case}: {args:?}: {stderr}"
                );
            }
            assert!(!dir.join("o").exists() && !dir.join("k.cu").exists());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------- (d) formula size

/// A sum of `terms` products `c * x`, balanced so it nests only log2(terms) deep; the
/// coefficients add up to about 1, so a chain of such ops stays finite.
fn balanced_sum(terms: usize) -> String {
    fn build(range: std::ops::Range<usize>, total: usize) -> String {
        if range.len() == 1 {
            let c = (1.0 + (range.start % 7) as f64 * 0.1) / (1.3 * total as f64);
            return format!("{c:.9}*x");
        }
        let mid = range.start + range.len() / 2;
        format!(
            "({} + {})",
            build(range.start..mid, total),
            build(mid..range.end, total)
        )
    }
    build(0..terms, terms)
}

/// A rule directory whose `big` op is `formula`, and a graph chaining `chain` of them.
fn big_op_case(dir: &Path, formula: &str, chain: usize) {
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(
        dir.join("rules/ops.ron"),
        format!(
            "[\n  Op(name: \"big\", kind: Pointwise, operands: [\"x\"], dtype: Promote([\"x\"]),\n     formula: \"{formula}\"),\n]\n"
        ),
    )
    .unwrap();
    let nodes: Vec<String> = (0..chain)
        .map(|k| {
            let arg = if k == 0 {
                "x".to_string()
            } else {
                format!("n{}", k - 1)
            };
            format!("Node(name: \"n{k}\", op: \"big\", args: [\"{arg}\"])")
        })
        .collect();
    std::fs::write(
        dir.join("g.ron"),
        format!(
            "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [64])],\n\
             nodes: [{}], outputs: [\"n{}\"])\n",
            nodes.join(",\n"),
            chain - 1
        ),
    )
    .unwrap();
}

/// The case: an op whose formula is a sum of 2,048 terms, chained 32 times, once
/// made one kernel of 11 MB of C that compiled for minutes. The kernel body budget
/// (`max_kernel_terms`) keeps each op in a kernel of its own, the 32 identical kernels are
/// one function in the generated C, and the result still equals the reference.
#[test]
fn a_chain_of_huge_formulas_is_cut_into_kernels_within_the_body_budget() {
    let dir = scratch("huge-chain");
    big_op_case(&dir, &balanced_sum(2048), 32);
    let report = ok(&fusebox(
        &["optimize", "g.ron", "--rules", "rules", "--json"],
        &dir,
    ));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["kernels_after"], 32, "{report}");
    ok(&fusebox(
        &[
            "optimize", "g.ron", "--rules", "rules", "--emit", "c", "--out", "k.c",
        ],
        &dir,
    ));
    let c_bytes = std::fs::metadata(dir.join("k.c")).unwrap().len();
    assert!(c_bytes < 2_000_000, "{c_bytes} bytes of C");
    let run = |backend: &str| {
        ok(&fusebox(
            &[
                "run",
                "g.ron",
                "--rules",
                "rules",
                "--backend",
                backend,
                "--random-inputs",
                "--out",
                backend,
            ],
            &dir,
        ));
        dir.join(backend).join("n31.npy")
    };
    assert_close(&run("reference"), &run("cpu"), "2048 terms x 32");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A smaller chain that fits two ops to a kernel: 512-term formulas (2,047 terms each) under
/// the default budget of 4,096 terms pair up, so 6 ops make 3 kernels, not 1 and not 6.
#[test]
fn the_body_budget_counts_formula_terms_not_ops() {
    let dir = scratch("budget-pairs");
    big_op_case(&dir, &balanced_sum(512), 6);
    let report = ok(&fusebox(
        &["optimize", "g.ron", "--rules", "rules", "--json"],
        &dir,
    ));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["kernels_after"], 3, "{report}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Formulas of generated sizes around the per-formula limit of 16,384 terms: those within it
/// load, those beyond it are refused at their position in ops.ron with a message naming the
/// limit (and the formula is quoted shortened, not repeated whole).
#[test]
fn formulas_over_the_term_limit_are_refused_at_their_position() {
    let dir = scratch("formula-limit");
    // `x + x + … ` of n operands has 2n - 1 terms; a flat sum nests too deeply, so use
    // balanced sums of `c*x` (4 terms per product, less one).
    for (products, fits) in [
        (1, true),
        (1000, true),
        (4096, true),
        (4097, false),
        (9000, false),
    ] {
        big_op_case(&dir, &balanced_sum(products), 1);
        let out = fusebox(&["ops", "--rules", "rules"], &dir);
        let case = format!("{products} products");
        if fits {
            assert!(held(&out, &case), "{case}");
        } else {
            let stderr = refused(&out, &case);
            assert!(
                stderr.starts_with("error: rules/ops.ron:3:"),
                "{case}: {stderr}"
            );
            assert!(
                stderr.contains("formula has more than 16384 terms"),
                "{case}: {stderr}"
            );
            assert!(stderr.len() < 1000, "{case}: the formula is quoted whole");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// --------------------------------------------------- (e) outputs on a full file system

/// Runs `fusebox args` under a file-size limit of `kib` KiB with SIGXFSZ ignored, so a write
/// past the limit fails with EFBIG as on a full disk instead of killing the process.
fn with_file_size_limit(args: &[&str], cwd: &Path, kib: u64) -> Output {
    // `ulimit -f` counts 512-byte blocks in POSIX sh (1024 in bash); ask for both readings'
    // smaller one by giving blocks of 512 bytes.
    limited(&format!("trap '' XFSZ; ulimit -f {}", kib * 2), args, cwd)
        .output()
        .unwrap()
}

/// Outputs of generated sizes, one of them too large for the file-size limit, in generated
/// positions: the run fails with exit 1 and the output directory holds exactly the old files,
/// byte for byte; without the limit the same run replaces all of them.
#[test]
fn outputs_on_a_full_file_system_are_all_old_or_all_new() {
    let probe = Command::new("sh")
        .args(["-c", "ulimit -f 64 && echo ok"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return; // no POSIX shell with ulimit here
    }
    let dir = scratch("full-disk");
    let mut rng = Seeded(0xf011);
    for round in 0..4 {
        let count = 2 + (rng.next() % 3) as usize;
        let big = (rng.next() % count as u64) as usize;
        let nodes: Vec<String> = (0..count)
            .map(|i| {
                let n = if i == big { 200_000 } else { 1 + rng.next() % 64 };
                format!(
                    "Node(name: \"o{i}\", op: \"broadcast_to\", args: [\"x\"], attrs: {{\"shape\": [{n}]}})"
                )
            })
            .collect();
        let outputs: Vec<String> = (0..count).map(|i| format!("\"o{i}\"")).collect();
        std::fs::write(
            dir.join("g.ron"),
            format!(
                "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [1])],\n\
                 nodes: [{}], outputs: [{}])\n",
                nodes.join(",\n"),
                outputs.join(", ")
            ),
        )
        .unwrap();
        let case = format!("round {round}: {count} outputs, the large one at {big}");
        let args = |seed: &'static str| {
            [
                "run",
                "g.ron",
                "--backend",
                "reference",
                "--random-inputs",
                "--seed",
                seed,
                "--out",
                "out",
            ]
        };
        let _ = std::fs::remove_dir_all(dir.join("out"));
        ok(&fusebox(&args("1"), &dir));
        let old: Vec<(PathBuf, Vec<u8>)> = tree(&dir.join("out"))
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        assert_eq!(old.len(), count, "{case}");
        let stderr = refused(&with_file_size_limit(&args("2"), &dir, 256), &case);
        assert!(stderr.contains("cannot write"), "{case}: {stderr}");
        assert!(stderr.contains("no output was written"), "{case}: {stderr}");
        let after: Vec<(PathBuf, Vec<u8>)> = tree(&dir.join("out"))
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        assert!(after == old, "{case}: the old outputs changed");
        ok(&fusebox(&args("2"), &dir));
        for (path, bytes) in &old {
            assert_ne!(
                &std::fs::read(path).unwrap(),
                bytes,
                "{case}: {path:?} not replaced"
            );
        }
        assert_eq!(tree(&dir.join("out")).len(), count, "{case}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------- (f) standard output failures

/// Every subcommand that prints, with its standard output on `/dev/full`: exit 1 and an error
/// that says standard output could not be written.
#[test]
fn every_printing_subcommand_fails_when_standard_output_cannot_be_written() {
    if std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .is_err()
    {
        return; // no /dev/full on this system
    }
    let dir = scratch("dev-full");
    let root = env!("CARGO_MANIFEST_DIR");
    let graph = format!("{root}/examples/gelu_bias.ron");
    let out_dir = dir.join("out").display().to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["check", &graph],
        vec!["optimize", &graph],
        vec!["optimize", &graph, "--json"],
        vec!["optimize", &graph, "--explain"],
        vec![
            "run",
            &graph,
            "--backend",
            "reference",
            "--random-inputs",
            "--out",
            &out_dir,
        ],
        vec!["bench", &graph, "--backend", "cpu", "--iters", "1"],
        vec![
            "bench",
            &graph,
            "--backend",
            "cpu",
            "--iters",
            "1",
            "--json",
        ],
        vec!["ops"],
        vec!["info"],
    ];
    for args in commands {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = command(&args, &dir)
            .stdout(Stdio::from(full))
            .output()
            .unwrap();
        let stderr = refused(&out, &format!("{args:?}"));
        assert!(
            stderr.contains("cannot write standard output: "),
            "{args:?}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------------ misleading messages

/// A write failure is a write error: it names the file and the reason, carries no invented
/// `:1:1` position, and is not labelled "invalid input".
#[test]
fn write_failures_say_cannot_write_the_path() {
    let dir = scratch("write-error");
    std::fs::write(dir.join("blocker"), "a file where a directory should be").unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let graph = format!("{root}/examples/gelu_bias.ron");
    let stderr = refused(
        &fusebox(
            &[
                "run",
                &graph,
                "--backend",
                "reference",
                "--random-inputs",
                "--out",
                "blocker/out",
            ],
            &dir,
        ),
        "run --out under a file",
    );
    assert!(
        stderr.starts_with("error: cannot write blocker/out: "),
        "{stderr}"
    );
    assert!(
        !stderr.contains(":1:1") && !stderr.contains("invalid input"),
        "{stderr}"
    );
    let stderr = refused(
        &fusebox(
            &[
                "optimize",
                &graph,
                "--emit",
                "ron",
                "--out",
                "blocker/g.ron",
            ],
            &dir,
        ),
        "--emit under a file",
    );
    assert!(
        stderr.starts_with("error: cannot write blocker/g.ron: "),
        "{stderr}"
    );
    assert!(!stderr.contains("invalid input"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A negative dimension is a shape error at its position that says what dimensions must be,
/// not RON's "Integer is out of bounds".
#[test]
fn a_negative_dimension_says_dimensions_are_non_negative_integers() {
    let dir = scratch("negative-dim");
    std::fs::write(
        dir.join("g.ron"),
        "Graph(name: \"g\",\n  inputs: [Input(name: \"x\", dtype: \"f32\", shape: [2, -1])],\n  nodes: [], outputs: [\"x\"])\n",
    )
    .unwrap();
    let stderr = refused(&fusebox(&["check", "g.ron"], &dir), "[2, -1]");
    assert_eq!(
        stderr,
        "error: g.ron:2:54: node `x`: shape mismatch: dimension 1 is -1; dimensions must be non-negative integers\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An attribute written `nan` (as rewrite patterns spell it) is explained: graph files are
/// RON, whose NaN is `NaN`; and `NaN` itself is accepted.
#[test]
fn an_attribute_written_nan_is_explained() {
    let dir = scratch("nan-attr");
    let graph = |value: &str| {
        format!(
            "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [2])],\n\
             nodes: [Node(name: \"y\", op: \"clamp\", args: [\"x\"], attrs: {{\"min\": {value}}})], outputs: [\"y\"])\n"
        )
    };
    std::fs::write(dir.join("g.ron"), graph("nan")).unwrap();
    let stderr = refused(&fusebox(&["check", "g.ron"], &dir), "nan");
    assert!(
        stderr.contains("attribute `min` must be a number, found the bare name `nan`")
            && stderr.contains("`NaN`, `inf` and `-inf`"),
        "{stderr}"
    );
    for accepted in ["NaN", "inf", "-inf"] {
        std::fs::write(dir.join("g.ron"), graph(accepted)).unwrap();
        ok(&fusebox(&["check", "g.ron"], &dir));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An attribute default of the wrong type is shown as the value it is (`[1, -1]`), not as
/// Rust's debug text (`Ints([1, -1])`).
#[test]
fn a_wrong_attribute_default_is_shown_without_debug_text() {
    let dir = scratch("default-text");
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(
        dir.join("rules/ops.ron"),
        "[Op(name: \"q\", kind: Pointwise, operands: [\"x\"], dtype: Promote([\"x\"]),\n  attrs: [Attr(name: \"a\", ty: Float, default: Ints([1, -1]))], formula: \"x * a\")]\n",
    )
    .unwrap();
    let stderr = refused(&fusebox(&["ops", "--rules", "rules"], &dir), "default");
    assert!(
        stderr.contains(
            "default of attribute `a` must be a number, found a list of integers `[1, -1]`"
        ),
        "{stderr}"
    );
    for debug in ["Ints(", "Some(", "Err("] {
        assert!(!stderr.contains(debug), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `FUSEBOX_CC` that "succeeds" without making a loadable library: the error says which
/// file did not load, the loader's reason, and which compiler built it.
#[test]
fn a_broken_compiler_names_the_library_the_reason_and_the_compiler() {
    let dir = scratch("broken-cc");
    let cc = dir.join("badcc");
    std::fs::write(
        &cc,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo badcc 1.0; exit 0; fi\n\
         out=\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && out=\"$2\"; shift; done\n\
         echo 'not a library' > \"$out\"\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cc, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let graph = format!("{root}/examples/gelu_bias.ron");
    let out = command(
        &[
            "run",
            &graph,
            "--backend",
            "cpu",
            "--random-inputs",
            "--out",
            "out",
        ],
        &dir,
    )
    .env("FUSEBOX_CC", &cc)
    .output()
    .unwrap();
    let stderr = refused(&out, "broken FUSEBOX_CC");
    assert!(stderr.contains(".so cannot be loaded"), "{stderr}");
    assert!(
        stderr.contains("the dynamic loader refused it: "),
        "{stderr}"
    );
    assert!(!stderr.contains("dlopen failed"), "{stderr}");
    assert!(
        stderr.contains(&format!("built by C compiler `{}`", cc.display())),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------------ hardening 3, by class
// One file per class of the third red-team round (issue 40), each with its generators.

#[path = "red_team/amplification.rs"]
mod amplification;
#[path = "red_team/onnx_semantics.rs"]
mod onnx_semantics;
#[path = "red_team/outputs.rs"]
mod outputs;
#[path = "red_team/reads.rs"]
mod reads;
