//! Inputs at the edges of fusebox's limits: each is either run exactly as the reference
//! evaluator runs it, or refused with a clear error and exit status 1 — never a panic, an
//! abort or a silently wrong result.
//!
//! - slice bounds as ONNX writes them (`end = i64::MAX`, `start = i64::MIN`), beyond 2^53
//!   (where an f64 no longer holds every integer) and huge steps;
//! - a `Rank` condition too large to build a shape for;
//! - values too large to allocate, and `.npy` files whose header promises more than they hold;
//! - shapes whose byte counts would overflow.

use fusebox::partition::Cost;
use fusebox::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;
use common::ok;

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch("limits", name)
}

fn fusebox(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(args)
        .current_dir(cwd)
        .env("FUSEBOX_CACHE_DIR", cwd.join("cache"))
        .output()
        .expect("the fusebox binary runs")
}

/// Exit status 1, one `error: ...` line on stderr and no panic or abort text.
#[track_caller]
fn clean_failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    for bad in ["panicked", "backtrace", "memory allocation", "a bug"] {
        assert!(!stderr.contains(bad), "{stderr}");
    }
    stderr
}

const EXTREME_SLICES: &str = r#"Graph(
    name: "extreme_slices",
    inputs: [Input(name: "x", dtype: "f32", shape: [4, 10])],
    nodes: [
        Node(name: "to_end", op: "slice", args: ["x"],
             attrs: {"axis": 1, "start": 1, "end": 9223372036854775807}),
        Node(name: "every_third", op: "slice", args: ["x"],
             attrs: {"axis": -1, "start": -9223372036854775808, "end": 9223372036854775807, "step": 3}),
        Node(name: "below_2_53", op: "slice", args: ["x"],
             attrs: {"axis": 1, "start": -9007199254740993, "end": 7}),
        Node(name: "huge_step", op: "slice", args: ["x"],
             attrs: {"axis": 1, "start": 2, "step": 9223372036854775807}),
        Node(name: "past_2_53", op: "slice", args: ["x"],
             attrs: {"axis": 0, "start": 1, "end": 9007199254740993, "step": 9007199254740993}),
        Node(name: "from_the_end", op: "slice", args: ["x"],
             attrs: {"axis": 1, "start": -3, "end": 9007199254740993}),
        Node(name: "e", op: "exp", args: ["every_third"]),
        Node(name: "m", op: "mul", args: ["huge_step", "e"]),
    ],
    outputs: ["to_end", "below_2_53", "past_2_53", "from_the_end", "m"],
)
"#;

/// Slice bounds clamp like Python's at every bound, on every path: the reference evaluator
/// (the shapes below are Python's), `optimize` (the e-graph holds the bounds exactly) and
/// the CPU backend, whose results equal the reference's.
#[test]
fn extreme_slice_bounds_clamp_like_python_on_every_backend() {
    let dir = scratch("slices");
    std::fs::write(dir.join("g.ron"), EXTREME_SLICES).unwrap();
    let out = ok(&fusebox(&["optimize", "g.ron", "--json"], &dir));
    assert!(out.contains("kernels"), "{out}");
    let run = |backend: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            "g.ron",
            "--backend",
            backend,
            "--random-inputs",
            "--seed",
            "3",
            "--out",
        ];
        let out = format!("out-{backend}-{}", extra.len());
        args.push(&out);
        args.extend_from_slice(extra);
        ok(&fusebox(&args, &dir));
        dir.join(out)
    };
    let reference = run("reference", &[]);
    let shapes = [
        ("to_end", vec![4, 9]),
        ("below_2_53", vec![4, 7]),
        ("past_2_53", vec![1, 10]),
        ("from_the_end", vec![4, 3]),
        ("m", vec![4, 4]),
    ];
    for (name, shape) in &shapes {
        let t = Tensor::read_npy(&reference.join(format!("{name}.npy"))).unwrap();
        assert_eq!(t.shape(), shape.as_slice(), "{name}");
    }
    for got in [run("cpu", &[]), run("cpu", &["--no-fusion"])] {
        for (name, _) in &shapes {
            let file = format!("{name}.npy");
            let want = Tensor::read_npy(&reference.join(&file)).unwrap();
            let got = Tensor::read_npy(&got.join(&file)).unwrap();
            assert_eq!(want.shape(), got.shape(), "{name}");
            for (w, g) in want.values().iter().zip(got.values()) {
                assert!(
                    (w - g).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{name}: {w} vs {g}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The slice op's steps are positive; a negative or zero step, however large, is a clean
/// shape error on every command, not a panic.
#[test]
fn negative_and_zero_slice_steps_are_refused_cleanly() {
    let dir = scratch("steps");
    for step in ["-1", "-9223372036854775808", "0"] {
        let text = EXTREME_SLICES.replace(r#""step": 3"#, &format!(r#""step": {step}"#));
        std::fs::write(dir.join("g.ron"), text).unwrap();
        for args in [
            &["optimize", "g.ron"][..],
            &[
                "run",
                "g.ron",
                "--backend",
                "cpu",
                "--random-inputs",
                "--out",
                "o",
            ][..],
        ] {
            let stderr = clean_failure(&fusebox(args, &dir));
            assert!(stderr.contains("step must be positive"), "{stderr}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `Rank` with a rank no shape may have is a located rule error at the number, before
/// `check-rules` would try to build a shape that large (a capacity overflow for 2^64 − 1,
/// a 32 GiB allocation for 2^32).
#[test]
fn rank_condition_beyond_the_rank_limit_is_a_located_rule_error() {
    let dir = scratch("rank");
    std::fs::create_dir_all(dir.join("rules/rewrites")).unwrap();
    for rank in ["18446744073709551615", "4294967296", "65"] {
        let text = format!(
            "[\n    Rule(name: \"r\", lhs: \"(neg (neg ?x))\", rhs: \"?x\",\n         when: [Rank(\"?x\", {rank})]),\n]\n"
        );
        std::fs::write(dir.join("rules/rewrites/big.ron"), text).unwrap();
        let stderr = clean_failure(&fusebox(&["check-rules", "--rules", "rules"], &dir));
        assert!(stderr.contains("big.ron:3:28"), "{stderr}");
        assert!(stderr.contains("more than 64"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A graph whose intermediate needs 64 GiB: the CPU backend refuses it with the reference
/// evaluator's element limit before allocating, instead of aborting in the allocator.
#[test]
fn values_too_large_to_allocate_are_an_error_on_the_cpu_backend() {
    let dir = scratch("alloc");
    let text = r#"Graph(
    name: "huge_intermediate",
    inputs: [Input(name: "x", dtype: "f32", shape: [1])],
    nodes: [
        Node(name: "b", op: "broadcast_to", args: ["x"], attrs: {"shape": [17179869184]}),
        Node(name: "r", op: "reshape", args: ["b"], attrs: {"shape": [131072, 131072]}),
        Node(name: "s", op: "sum", args: ["r"]),
    ],
    outputs: ["s"],
)
"#;
    std::fs::write(dir.join("g.ron"), text).unwrap();
    for backend in ["reference", "cpu"] {
        let stderr = clean_failure(&fusebox(
            &[
                "run",
                "g.ron",
                "--backend",
                backend,
                "--random-inputs",
                "--out",
                "o",
            ],
            &dir,
        ));
        assert!(stderr.contains("more than 2147483648 elements"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A 13-byte `.npy` whose header length field claims 4 GiB, and one whose header promises
/// far more data than the file holds, are refused before anything is allocated for them.
#[test]
fn npy_files_that_promise_more_than_they_hold_are_refused_before_allocating() {
    let dir = scratch("npy");
    let mut tiny = b"\x93NUMPY\x02\x00".to_vec();
    tiny.extend_from_slice(&u32::MAX.to_le_bytes());
    tiny.push(b'{');
    assert_eq!(tiny.len(), 13);
    std::fs::write(dir.join("tiny.npy"), &tiny).unwrap();
    let e = Tensor::read_npy(&dir.join("tiny.npy"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("header length"), "{e}");
    assert!(e.contains("4294967295"), "{e}");

    // A valid header for 2^40 f32 values, and no data.
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }";
    let mut header = dict.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    file.extend_from_slice(&(header.len() as u16).to_le_bytes());
    file.extend_from_slice(header.as_bytes());
    std::fs::write(dir.join("short.npy"), &file).unwrap();
    let e = Tensor::read_npy(&dir.join("short.npy"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs 4398046511104 bytes of data but the file holds 0"),
        "{e}"
    );

    // A header with more axes than a shape may have.
    let dims = vec!["1"; 65].join(", ");
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({dims}), }}\n");
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    file.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    file.extend_from_slice(dict.as_bytes());
    file.extend_from_slice(&[0; 4]);
    std::fs::write(dir.join("deep.npy"), &file).unwrap();
    let e = Tensor::read_npy(&dir.join("deep.npy"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("65 axes"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A shape beyond 2^48 elements (whose byte counts, summed over a graph, would wrap a u64 to
/// a small number in the report) is refused where shapes are checked, at the op.
#[test]
fn shapes_beyond_the_element_limit_are_refused_where_shapes_are_checked() {
    let dir = scratch("numel");
    let text = r#"Graph(
    name: "wide",
    inputs: [Input(name: "x", dtype: "f64", shape: [1])],
    nodes: [
        Node(name: "b", op: "broadcast_to", args: ["x"], attrs: {"shape": [2305843009213693951]}),
        Node(name: "s", op: "sum", args: ["b"]),
    ],
    outputs: ["s"],
)
"#;
    std::fs::write(dir.join("g.ron"), text).unwrap();
    let stderr = clean_failure(&fusebox(&["optimize", "g.ron"], &dir));
    assert!(stderr.contains("g.ron:5:29"), "{stderr}");
    assert!(stderr.contains("more than 2^48"), "{stderr}");
    // At the limit itself the graph is checked and optimized, and its bytes are counted
    // exactly (2^48 f64 elements read, one written).
    let at_limit = text.replace("2305843009213693951", "281474976710656");
    std::fs::write(dir.join("g.ron"), at_limit).unwrap();
    let out = ok(&fusebox(&["optimize", "g.ron", "--json"], &dir));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    // Unfused, the broadcast is written out: 2^48 f64 values.
    let before = report["bytes_before"].as_u64().expect("a byte count");
    assert!(before >= 8 << 48, "{out}");
    let after = report["bytes_after"].as_u64().expect("a byte count");
    assert!(after > 0 && after <= before, "{out}");
    // Summing costs saturates rather than wraps.
    let big = Cost {
        bytes: u64::MAX - 1,
        flops: u64::MAX,
        ..Cost::default()
    };
    assert_eq!((big + big).bytes, u64::MAX);
    assert_eq!((big + big).flops, u64::MAX);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An input beyond 2^48 elements is refused at its shape too, even when every node reduces
/// it to something small (the partitioner's byte sums overflowed on such an input).
#[test]
fn inputs_beyond_the_element_limit_are_refused_at_their_shape() {
    let dir = scratch("numel-input");
    let text = r#"Graph(
    name: "big_sum",
    inputs: [Input(name: "x", dtype: "f64", shape: [1152921504606846976]),
             Input(name: "z", dtype: "f64", shape: [1152921504606846976])],
    nodes: [
        Node(name: "s", op: "sum", args: ["x"]),
        Node(name: "t", op: "sum", args: ["z"]),
        Node(name: "u", op: "add", args: ["s", "t"]),
    ],
    outputs: ["u"],
)
"#;
    std::fs::write(dir.join("g.ron"), text).unwrap();
    let stderr = clean_failure(&fusebox(&["optimize", "g.ron"], &dir));
    assert!(stderr.contains("g.ron:3:52"), "{stderr}");
    assert!(stderr.contains("more than 2^48"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A shape with more axes than the limit is refused where it is declared.
#[test]
fn shapes_beyond_the_rank_limit_are_refused() {
    let dir = scratch("rank-shape");
    let dims = vec!["1"; 65].join(", ");
    let text = format!(
        "Graph(\n    name: \"deep\",\n    inputs: [Input(name: \"x\", dtype: \"f32\", shape: [{dims}])],\n    nodes: [Node(name: \"y\", op: \"neg\", args: [\"x\"])],\n    outputs: [\"y\"],\n)\n"
    );
    std::fs::write(dir.join("g.ron"), text).unwrap();
    let stderr = clean_failure(&fusebox(&["optimize", "g.ron"], &dir));
    assert!(stderr.contains("65 axes, more than 64"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `.npy` reader's size limit is written below the evaluator in the layering; it must
/// still admit exactly the largest value the evaluator holds, 8 bytes an element, plus the
/// largest header.
#[test]
fn the_npy_file_limit_holds_the_largest_value_the_evaluator_holds() {
    assert_eq!(
        fusebox::file_limits::MAX_NPY_FILE,
        fusebox::eval::MAX_ELEMENTS as u64 * 8 + 128 * 1024
    );
}
