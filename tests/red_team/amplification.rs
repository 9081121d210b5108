//! Issue 40, amplification: a small input must not make fusebox do unbounded work or ask for
//! unbounded memory.
//!
//! - composites of generated fan-out and depth: those within the limits expand and compute
//!   exactly what they mean; those beyond are refused at once, at the body node in `ops.rs`,
//!   naming the chain of composites; too many uses in one graph are refused at the use;
//! - concats of generated width (up to 500 operands): the generated C grows at most linearly
//!   in the operands, and the CPU backend's results equal the reference evaluator's;
//! - evaluation under a memory limit (`ulimit -v`) of generated graphs too large for it,
//!   including casts: exit 1 with an error naming the size, never an abort.
//! - generated `--dim` sizes for a model's symbolic batch: within the element limit imported,
//!   past it (or no number, or a name the model lacks) refused at once;
//! - generated `Resize` scales: an axis of at most 2^20 positions (each a constant written at
//!   import) imports; one past it is refused at once, naming the node.
//!
//! Every child runs under a deadline, so a regression (an expansion that never ends) fails the
//! test instead of hanging it.

use super::*;
use fusebox::dtype::DType;
use std::time::Duration;

/// How long one command may take before the test calls it hung. The refusals here answer in
/// milliseconds; the margin is for the runs that compile C on a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// `fusebox args` in `cwd` under [`DEADLINE`].
#[track_caller]
fn timed(args: &[&str], cwd: &Path, case: &str) -> Output {
    bounded(command(args, cwd), DEADLINE, case)
}

// ------------------------------------------------------------------------------- composites

/// An `ops.ron` of composites `c0` … `c{depth}`: `c0` is `neg x`, and each `c{k}` applies
/// `c{k-1}` `fan[k-1]` times in a row. One use of `c{depth}` is Π fan `neg`s.
pub(super) fn chained_composites(fan: &[usize]) -> String {
    let mut text = String::from(
        "[\n  Composite(name: \"c0\", operands: [\"x\"], nodes: [Node(name: \"a0\", op: \"neg\", args: [\"x\"])]),\n",
    );
    for (k, &f) in fan.iter().enumerate() {
        let nodes: Vec<String> = (0..f)
            .map(|i| {
                let arg = if i == 0 {
                    "x".to_string()
                } else {
                    format!("a{}", i - 1)
                };
                format!("Node(name: \"a{i}\", op: \"c{k}\", args: [\"{arg}\"])")
            })
            .collect();
        text += &format!(
            "  Composite(name: \"c{}\", operands: [\"x\"], nodes: [{}]),\n",
            k + 1,
            nodes.join(", ")
        );
    }
    text + "]\n"
}

/// A graph of input `x` [8] applying composite `op` `uses` times in a row.
fn graph_using(op: &str, uses: usize) -> String {
    let nodes: Vec<String> = (0..uses)
        .map(|i| {
            let arg = if i == 0 {
                "x".to_string()
            } else {
                format!("y{}", i - 1)
            };
            format!("Node(name: \"y{i}\", op: \"{op}\", args: [\"{arg}\"])")
        })
        .collect();
    format!(
        "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [8])],\n\
         nodes: [{}], outputs: [\"y{}\"])\n",
        nodes.join(",\n"),
        uses - 1
    )
}

/// Composites of generated fan-out (1 to 4 calls of the level below) and depth: within the
/// limits (65,536 ops, 64 levels) a use expands and computes exactly (-1)^ops · x, on the
/// reference backend; beyond them, `check` answers within the deadline with an error at a
/// body node of `rules/ops.ron` naming the chain from the composite down (`c17 → c16 → …`).
/// Before the limit, 2 calls per level over 41 levels made `check` run for ever.
#[test]
fn composites_expanding_past_the_limits_are_refused_at_load_naming_the_chain() {
    let dir = scratch("amp-composites");
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    let mut rng = Seeded(0xc0_4905);
    let x =
        Tensor::from_values(DType::F32, &[8], (0..8).map(|i| i as f64 - 3.5).collect()).unwrap();
    x.write_npy(&dir.join("x.npy")).unwrap();
    let (mut fitting, mut refused_cases) = (0, 0);
    for round in 0..16 {
        // Half the rounds small enough to run, half far beyond the limit.
        let big = round % 2 == 1;
        let depth = if big {
            17 + (rng.next() % 30) as usize
        } else {
            1 + (rng.next() % 6) as usize
        };
        let fan: Vec<usize> = (0..depth)
            .map(|_| {
                if big {
                    2 + (rng.next() % 3) as usize
                } else {
                    1 + (rng.next() % 3) as usize
                }
            })
            .collect();
        let ops = fan.iter().fold(1u128, |p, &f| p * f as u128);
        let case = format!("round {round}: fan {fan:?} ({ops} ops)");
        std::fs::write(dir.join("rules/ops.ron"), chained_composites(&fan)).unwrap();
        std::fs::write(dir.join("g.ron"), graph_using(&format!("c{depth}"), 1)).unwrap();
        let out = timed(&["check", "g.ron", "--rules", "rules"], &dir, &case);
        if ops <= 65_536 {
            assert!(held(&out, &case), "{case}");
            fitting += 1;
            if ops > 4096 {
                continue; // checked; running it is the CPU suite's business
            }
            let _ = std::fs::remove_dir_all(dir.join("o"));
            let run = timed(
                &[
                    "run",
                    "g.ron",
                    "--rules",
                    "rules",
                    "--backend",
                    "reference",
                    "--input",
                    "x=x.npy",
                    "--out",
                    "o",
                ],
                &dir,
                &case,
            );
            assert!(held(&run, &case), "{case}");
            let y = Tensor::read_npy(&dir.join("o/y0.npy")).unwrap();
            let sign = if ops % 2 == 0 { 1.0 } else { -1.0 };
            let want: Vec<f64> = x.values().iter().map(|v| sign * v).collect();
            assert_eq!(y.values(), want, "{case}");
        } else {
            let stderr = refused(&out, &case);
            assert!(
                stderr.starts_with("error: rules/ops.ron:"),
                "{case}: {stderr}"
            );
            assert!(
                stderr.contains("more than the limit of 65536"),
                "{case}: {stderr}"
            );
            // The chain starts at the first composite past the limit and goes down.
            let over = (1..=depth)
                .find(|&k| fan[..k].iter().fold(1u128, |p, &f| p * f as u128) > 65_536)
                .unwrap();
            assert!(
                stderr.contains(&format!("composite `c{over}` expands to")),
                "{case}: {stderr}"
            );
            assert!(
                stderr.contains(&format!("(c{over} → c{} → ", over - 1)),
                "{case}: {stderr}"
            );
            assert!(stderr.len() < 1000, "{case}: {stderr}");
            refused_cases += 1;
        }
    }
    assert!(
        fitting >= 6 && refused_cases >= 6,
        "{fitting} fit, {refused_cases} refused"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A chain of single calls deeper than 64 levels is refused at load (expansion recurses once
/// per level; a chain of thousands would overflow the stack), and one 64 deep runs.
#[test]
fn composites_nested_past_the_depth_limit_are_refused_at_load() {
    let dir = scratch("amp-depth");
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    for (depth, fits) in [(63, true), (64, false), (3000, false)] {
        let case = format!("depth {depth}");
        std::fs::write(
            dir.join("rules/ops.ron"),
            chained_composites(&vec![1; depth]),
        )
        .unwrap();
        std::fs::write(dir.join("g.ron"), graph_using(&format!("c{depth}"), 1)).unwrap();
        let out = timed(&["check", "g.ron", "--rules", "rules"], &dir, &case);
        if fits {
            assert!(held(&out, &case), "{case}");
        } else {
            let stderr = refused(&out, &case);
            assert!(
                stderr.starts_with("error: rules/ops.ron:"),
                "{case}: {stderr}"
            );
            assert!(stderr.contains("composites deep"), "{case}: {stderr}");
            assert!(
                stderr.contains("more than the limit of 64"),
                "{case}: {stderr}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Uses of a composite that fits, too many for one graph: refused at the use that crosses the
/// graph's limit (2^18 expanded nodes), with the graph file's position and the composite named.
#[test]
fn too_many_uses_of_a_large_composite_are_refused_at_the_use() {
    let dir = scratch("amp-uses");
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    // c16 is 2^16 = 65,536 ops, the most one use may expand to: 4 uses fill the graph.
    std::fs::write(dir.join("rules/ops.ron"), chained_composites(&[2; 16])).unwrap();
    std::fs::write(dir.join("g.ron"), graph_using("c16", 4)).unwrap();
    assert!(held(
        &timed(&["check", "g.ron", "--rules", "rules"], &dir, "4 uses"),
        "4 uses"
    ));
    std::fs::write(dir.join("g.ron"), graph_using("c16", 5)).unwrap();
    let stderr = refused(
        &timed(&["check", "g.ron", "--rules", "rules"], &dir, "5 uses"),
        "5 uses",
    );
    assert!(stderr.starts_with("error: g.ron:6:"), "{stderr}");
    assert!(stderr.contains("`y4`"), "{stderr}");
    assert!(stderr.contains("(c16 → c15 → "), "{stderr}");
    assert!(
        stderr.contains("makes the graph more than 262144 nodes"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------- concats

/// A graph concatenating `widths.len()` slices of input `x` [Σ widths, 8] (or [8, Σ widths]
/// along axis 1), the `k`-th `widths[k]` wide, each slice negated when `neg[k]`.
fn sliced_concat(widths: &[usize], axis: usize, neg: &[bool]) -> String {
    let total: usize = widths.iter().sum();
    let shape = if axis == 0 { [total, 8] } else { [8, total] };
    let mut nodes = Vec::new();
    let mut parts = Vec::new();
    let mut start = 0;
    for (k, &w) in widths.iter().enumerate() {
        nodes.push(format!(
            "Node(name: \"s{k}\", op: \"slice\", args: [\"x\"], attrs: {{\"axis\": {axis}, \"start\": {start}, \"end\": {}}})",
            start + w
        ));
        start += w;
        if neg[k] {
            nodes.push(format!(
                "Node(name: \"n{k}\", op: \"neg\", args: [\"s{k}\"])"
            ));
            parts.push(format!("\"n{k}\""));
        } else {
            parts.push(format!("\"s{k}\""));
        }
    }
    // Reversed, so the result is not the input.
    parts.reverse();
    nodes.push(format!(
        "Node(name: \"c\", op: \"concat\", args: [{}], attrs: {{\"axis\": {axis}}})",
        parts.join(", ")
    ));
    format!(
        "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: {shape:?})],\n\
         nodes: [{}], outputs: [\"c\"])\n",
        nodes.join(",\n")
    )
}

/// Concats of generated width (8 to 500 operands, slices of generated widths, some negated,
/// along either axis): the C emitted for each is at most 120 KB plus 1 KB per operand. A
/// kernel selecting among segments is written once per segment with every argument and
/// range, so before the body budget counted that, one fused concat of 100 one-row slices was
/// 1.9 MB of C (19 KB per operand) and 17 s of `cc`. The smaller ones also run on the CPU
/// backend and equal the reference evaluator bit for bit (slices, negations and copies are
/// exact).
#[test]
fn wide_concats_emit_c_that_grows_linearly_in_their_operands() {
    let dir = scratch("amp-concat");
    let mut rng = Seeded(0xca7_0500);
    let mut ran = 0;
    for round in 0..10 {
        let n = match round {
            0 => 500,
            1 => 100,
            _ => 8 + (rng.next() % 300) as usize,
        };
        let axis = (rng.next() % 2) as usize;
        let widths: Vec<usize> = (0..n)
            .map(|_| {
                if rng.next().is_multiple_of(3) {
                    1 + (rng.next() % 4) as usize
                } else {
                    1
                }
            })
            .collect();
        let neg: Vec<bool> = (0..n).map(|_| rng.next().is_multiple_of(4)).collect();
        let case = format!("round {round}: {n} operands along axis {axis}");
        std::fs::write(dir.join("g.ron"), sliced_concat(&widths, axis, &neg)).unwrap();
        let out = timed(
            &["optimize", "g.ron", "--emit", "c", "--out", "k.c"],
            &dir,
            &case,
        );
        assert!(held(&out, &case), "{case}");
        let bytes = std::fs::metadata(dir.join("k.c")).unwrap().len() as usize;
        eprintln!("{case}: {bytes} bytes of C");
        assert!(
            bytes <= 250_000 + 4_000 * n,
            "{case}: {bytes} bytes of C ({} per operand)",
            bytes / n
        );
        if n <= 120 && ran < 2 {
            ran += 1;
            let run = |backend: &str| {
                let _ = std::fs::remove_dir_all(dir.join(backend));
                let out = timed(
                    &[
                        "run",
                        "g.ron",
                        "--backend",
                        backend,
                        "--random-inputs",
                        "--out",
                        backend,
                    ],
                    &dir,
                    &case,
                );
                assert!(held(&out, &case), "{case}");
                dir.join(backend).join("c.npy")
            };
            let (want, got) = (run("reference"), run("cpu"));
            assert_eq!(
                std::fs::read(want).unwrap(),
                std::fs::read(got).unwrap(),
                "{case}"
            );
        }
    }
    assert_eq!(ran, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------------------- memory limits

/// Generated graphs whose reference evaluation needs more memory than a 1 GiB address-space
/// limit allows — a value broadcast to 2^25 elements (256 MiB as the evaluator holds it),
/// then cast (f32 → f64, to an integer), negated, exponentiated, transposed or concatenated,
/// and summed; an input of 2^28 elements with `--random-inputs` — end with exit 1 and an
/// error naming the bytes it could not allocate, never an abort (`Tensor::cast` aborted on a
/// 2 GiB allocation). The same graphs at a small size succeed under the same limit.
#[test]
fn evaluation_beyond_a_memory_limit_is_an_error_naming_the_size() {
    let probe = Command::new("sh")
        .args(["-c", "ulimit -v 1048576 && echo ok"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return; // no POSIX shell with ulimit here
    }
    let dir = scratch("amp-memory");
    let mut rng = Seeded(0x2_61b);
    let tails = [
        "Node(name: \"t\", op: \"cast\", args: [\"b\"], attrs: {\"dtype\": \"f64\"})",
        "Node(name: \"t\", op: \"cast\", args: [\"b\"], attrs: {\"dtype\": \"i32\"})",
        "Node(name: \"t\", op: \"neg\", args: [\"b\"])",
        "Node(name: \"t\", op: \"exp\", args: [\"b\"])",
        "Node(name: \"t\", op: \"concat\", args: [\"b\", \"b\"], attrs: {\"axis\": 0})",
        "Node(name: \"t\", op: \"transpose\", args: [\"b\"], attrs: {\"perm\": [1, 0]})",
    ];
    for round in 0..8 {
        let tail = rng.pick(&tails);
        let rows = 1u64 << (rng.next() % 3);
        for (elements, fits) in [(1u64 << 25, false), (1 << 10, true)] {
            let shape = format!("[{rows}, {}]", elements / rows);
            let graph = format!(
                "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [1])],\n\
                 nodes: [Node(name: \"b\", op: \"broadcast_to\", args: [\"x\"], attrs: {{\"shape\": {shape}}}),\n\
                 {tail},\n\
                 Node(name: \"s\", op: \"sum\", args: [\"t\"])], outputs: [\"s\"])\n"
            );
            std::fs::write(dir.join("g.ron"), graph).unwrap();
            let case = format!("round {round}: {shape} then {tail}");
            let _ = std::fs::remove_dir_all(dir.join("o"));
            let args = [
                "run",
                "g.ron",
                "--backend",
                "reference",
                "--random-inputs",
                "--out",
                "o",
            ];
            let out = with_memory_limit(&args, &dir, 1024, &case);
            if fits {
                assert!(held(&out, &case), "{case}");
            } else {
                let stderr = refused(&out, &case);
                assert!(stderr.contains("cannot allocate"), "{case}: {stderr}");
                assert!(stderr.contains(" bytes "), "{case}: {stderr}");
                assert!(!dir.join("o").exists(), "{case}");
            }
        }
    }
    // An input too large for the limit, drawn at random.
    let big = "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [268435456])],\n\
               nodes: [Node(name: \"s\", op: \"sum\", args: [\"x\"])], outputs: [\"s\"])\n";
    std::fs::write(dir.join("big.ron"), big).unwrap();
    let stderr = refused(
        &with_memory_limit(
            &[
                "run",
                "big.ron",
                "--backend",
                "reference",
                "--random-inputs",
                "--out",
                "o",
            ],
            &dir,
            1024,
            "random input",
        ),
        "random input",
    );
    assert!(
        stderr.contains("cannot allocate 2147483648 bytes"),
        "{stderr}"
    );
    assert!(stderr.contains("`x`"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Generated `--dim` sizes on a model with a symbolic batch (`[batch, 12]`): sizes at the
/// edges (0, 1, past the 2^28-element limit, past `usize`), names the model lacks and sizes that
/// are no number. `check` (which allocates no value) imports the sizes within the limit and
/// refuses the rest with one located error; `run` on random values succeeds at the small ones.
/// None may panic or hang.
#[test]
fn generated_dim_sizes_are_imported_or_refused() {
    let dir = scratch("dims");
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/dynamic/mlp.ts.onnx");
    let path = model.to_str().unwrap();
    let limit = (1u64 << 28) / 12;
    let mut rng = Seeded(0xd1_a5);
    let mut sizes: Vec<String> = ["0", "1", "7", "-1", "x", "1e3", "18446744073709551616"]
        .map(String::from)
        .to_vec();
    for _ in 0..6 {
        sizes.push((rng.next() % (2 * limit)).to_string());
    }
    sizes.push(limit.to_string());
    sizes.push((limit + 1).to_string());
    for size in &sizes {
        for name in ["batch", "bach"] {
            let spec = format!("{name}={size}");
            let case = format!("--dim {spec}");
            let fits = name == "batch" && size.parse::<u64>().is_ok_and(|n| n <= limit);
            let out = timed(&["check", path, "--dim", &spec], &dir, &case);
            if fits {
                assert!(held(&out, &case), "{case}");
            } else {
                let stderr = refused(&out, &case);
                assert!(
                    stderr.contains("mlp.ts.onnx") || stderr.contains("--dim"),
                    "{case}: {stderr}"
                );
            }
            if fits && size.parse::<u64>().is_ok_and(|n| n <= 64) {
                let args = [
                    "run",
                    path,
                    "--backend",
                    "cpu",
                    "--random-inputs",
                    "--dim",
                    &spec,
                    "--out",
                    "o",
                ];
                assert!(held(&timed(&args, &dir, &case), &case), "{case}: run");
            }
        }
    }
}

// ----------------------------------------------------------------------------- resizes

/// A `Resize` whose `scales` (a few bytes) ask for an axis of `scale` times 2 positions: each
/// position of a resized axis is a constant index and weight per tap written at import.
fn resize_model(dir: &Path, scale: f32, mode: &str) -> PathBuf {
    use onnx_protobuf::{AttributeProto, GraphProto, NodeProto, TensorProto};
    use protobuf::Message;
    let mut scales = TensorProto::new();
    scales.name = "scales".into();
    scales.data_type = 1;
    scales.dims = vec![4];
    scales.raw_data = [1.0f32, 1.0, scale, 1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut node = NodeProto::new();
    node.op_type = "Resize".into();
    node.name = "up".into();
    node.input = vec!["x".into(), String::new(), "scales".into()];
    node.output = vec!["y".into()];
    let mut a = AttributeProto::new();
    a.name = "mode".into();
    a.type_ = onnx_protobuf::attribute_proto::AttributeType::STRING.into();
    a.s = mode.as_bytes().to_vec();
    node.attribute.push(a);
    let mut graph = GraphProto::new();
    graph.name = "resize".into();
    graph
        .input
        .push(common::onnx_models::value_info("x", 1, Some(&[1, 1, 2, 2])));
    graph
        .output
        .push(common::onnx_models::value_info("y", 1, None));
    graph.initializer.push(scales);
    graph.node.push(node);
    let path = dir.join(format!("resize-{scale}-{mode}.onnx"));
    let model = common::onnx_models::model_of(graph, 19);
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    path
}

/// Resizes of a 2 x 2 image by generated scales, in each mode: an axis of up to 2^20
/// positions (the importer's bound on the constants it computes) imports; one past it, up
/// to scales of 2^40, is refused at once, naming the node, never an allocation of gigabytes of
/// tap indices or a hang.
#[test]
fn resizes_by_generated_scales_are_bounded_at_import() {
    let dir = scratch("resizes");
    let mut rng = Seeded(0x5ca1e);
    let mut scales: Vec<f32> = vec![(1u32 << 19) as f32, (1u32 << 19) as f32 + 1.0, 1e12];
    for _ in 0..4 {
        scales.push((1u64 << (20 + rng.next() % 21)) as f32);
    }
    for scale in scales {
        for mode in ["nearest", "linear", "cubic"] {
            let path = resize_model(&dir, scale, mode);
            let case = format!("Resize by {scale} ({mode})");
            let out = timed(&["check", path.to_str().unwrap()], &dir, &case);
            if 2.0 * f64::from(scale) <= (1u64 << 20) as f64 {
                assert!(held(&out, &case), "{case}");
            } else {
                let stderr = refused(&out, &case);
                assert!(
                    stderr.contains("up") && stderr.contains("size"),
                    "{case}: {stderr}"
                );
            }
        }
    }
}
