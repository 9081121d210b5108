//! Issue 40, the reads: every file fusebox reads must be a regular file of bounded size, a value
//! that is replaced must not be read at all, and a value file must hold the kind of value its
//! input declares.
//!
//! - every file kind (graph file, each top-level rule file, a `rewrites/*.ron` file, a stored
//!   value, an `--input` file, an ONNX model, ONNX external data) planted as a FIFO, a link to
//!   `/dev/zero`, a directory and a (sparse) file past its kind's limit, with every command that
//!   reads it: each is refused at once, naming the file. Every child runs under a deadline, so
//!   a read that never ends fails the test instead of hanging it;
//! - `run --input` and `bench` with broken stored values they do not use;
//! - every declared dtype against every `.npy` dtype, through `--input` and as a stored value;
//! - errors about a stored value located at its `value` field.

use super::*;
use fusebox::dtype::DType;
use fusebox::file_limits::FileKind;
use std::time::Duration;

/// How long one command may take before the test calls it hung. Every case here ends in
/// milliseconds; the margin is for a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(30);

/// `fusebox(args)` in `cwd`, killed and failed as hung past [`DEADLINE`].
#[track_caller]
fn bounded(args: &[&str], cwd: &Path, case: &str) -> Output {
    super::bounded(command(args, cwd), DEADLINE, case)
}

/// What is planted where a file should be.
#[derive(Debug, Clone, Copy)]
enum Plant {
    Fifo,
    DevZero,
    Directory,
    /// A sparse regular file this many bytes past its kind's limit.
    OverLimit(u64),
}

/// Every kind of plant; the over-limit excess is drawn from `rng`.
fn plants(rng: &mut Seeded) -> [Plant; 4] {
    [
        Plant::Fifo,
        Plant::DevZero,
        Plant::Directory,
        Plant::OverLimit(1 + rng.next() % (1 << 20)),
    ]
}

/// Removes whatever is at `path` (a file, a FIFO, a link, a directory), never writing to it.
fn clear(path: &Path) {
    if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path).unwrap();
    } else if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path).unwrap();
    }
}

/// Puts `plant` at `path` (replacing what is there) for a file of `kind`.
fn plant(path: &Path, how: Plant, kind: FileKind) {
    clear(path);
    match how {
        Plant::Fifo => {
            let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: `name` is a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
        }
        Plant::DevZero => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        Plant::Directory => std::fs::create_dir(path).unwrap(),
        Plant::OverLimit(excess) => {
            // Sparse: no disk and no time, however large.
            let file = std::fs::File::create(path).unwrap();
            file.set_len(kind.limit() + excess).unwrap();
        }
    }
}

/// What a refusal of `how` may say. A link to `/dev/zero` where only files inside a directory
/// may be read (stored values, external data) is refused for leaving it.
fn says(how: Plant) -> &'static [&'static str] {
    match how {
        Plant::Fifo => &["is a FIFO, not a regular file"],
        Plant::DevZero => &["is a character device, not a regular file", "leaves the"],
        Plant::Directory => &[
            "is a directory, not a regular file",
            "only rule files named *.ron",
        ],
        Plant::OverLimit(_) => &["bytes", "more than the"],
    }
}

/// Runs each of `commands` (argument lists) in `dir` and asserts it is refused, naming `file`
/// and saying what is wrong with it.
#[track_caller]
fn all_refused(commands: &[Vec<&str>], dir: &Path, file: &str, how: Plant, case: &str) {
    for args in commands {
        let case = format!("{case}, {how:?}, `fusebox {}`", args.join(" "));
        let stderr = refused(&bounded(args, dir, &case), &case);
        assert!(
            stderr.contains(file),
            "{case}: does not name {file}: {stderr}"
        );
        let reasons = says(how);
        let matched = match how {
            Plant::OverLimit(_) => reasons.iter().all(|r| stderr.contains(r)),
            _ => reasons.iter().any(|r| stderr.contains(r)),
        };
        assert!(matched, "{case}: does not say {reasons:?}: {stderr}");
    }
}

/// A graph of `x` and a parameter `w` stored in `w.npy`: `y = x * w`.
const GRAPH: &str = r#"Graph(
    name: "g",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [4]),
        Input(name: "w", dtype: "f32", shape: [4], value: "w.npy"),
    ],
    nodes: [Node(name: "y", op: "mul", args: ["x", "w"])],
    outputs: ["y"],
)
"#;

const W: [f64; 4] = [1.0, -2.0, 0.5, 4.0];

/// Where [`GRAPH`] writes `w`'s `value` (the string): `g.ron:LINE:COLUMN: node `w``.
fn value_site() -> String {
    let line = GRAPH.lines().position(|l| l.contains("value:")).unwrap();
    let column = GRAPH.lines().nth(line).unwrap().find("\"w.npy\"").unwrap();
    format!("g.ron:{}:{}: node `w`: ", line + 1, column + 1)
}

/// A directory holding [`GRAPH`], its `w.npy` and `x.npy` (for `--input`), replacing whatever
/// was planted there.
fn graph_dir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("g.ron"), GRAPH).unwrap();
    clear(&dir.join("w.npy"));
    let w = Tensor::from_values(DType::F32, &[4], W.to_vec()).unwrap();
    w.write_npy(&dir.join("w.npy")).unwrap();
    let x = Tensor::from_values(DType::F32, &[4], vec![3.0, 1.0, -1.0, 0.25]).unwrap();
    x.write_npy(&dir.join("x.npy")).unwrap();
}

/// Every command that reads a graph (and its rules, and its stored values), on `graph`, with
/// `extra` arguments (`--rules DIR`).
fn graph_commands<'a>(graph: &'a str, extra: &[&'a str]) -> Vec<Vec<&'a str>> {
    let mut commands = vec![
        vec!["check", graph],
        vec!["optimize", graph],
        vec![
            "run",
            graph,
            "--backend",
            "reference",
            "--random-inputs",
            "--out",
            "out",
        ],
        vec!["grad", graph, "--out", "joint/j.ron"],
        vec!["bench", graph, "--backend", "cpu", "--iters", "1"],
    ];
    for c in &mut commands {
        c.extend_from_slice(extra);
    }
    commands
}

/// A graph file that is a FIFO, a device, a directory or too large is refused by every
/// command that reads graphs, naming it; none blocks on the FIFO.
#[test]
fn graph_files_that_are_not_bounded_regular_files_are_refused_without_reading() {
    let dir = scratch("reads-graph");
    graph_dir(&dir);
    let case = "the fixture";
    assert!(
        held(&bounded(&["check", "g.ron"], &dir, case), case),
        "{case}"
    );
    let mut rng = Seeded(0x0072_ead5_0001);
    for how in plants(&mut rng) {
        plant(&dir.join("p.ron"), how, FileKind::Graph);
        all_refused(
            &graph_commands("p.ron", &[]),
            &dir,
            "p.ron",
            how,
            "graph file",
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each top-level rule file and a `rewrites/*.ron` file, planted as each non-file or as an
/// oversized file in a rule directory, is refused by every command that loads rules (`check`,
/// `optimize`, `run`, `grad`, `bench`, `check-rules`, `ops`): a FIFO named `ops.ron` blocked
/// all of them, and a link to `/dev/zero` read until memory ran out.
#[test]
fn rule_files_that_are_not_bounded_regular_files_are_refused_by_every_command() {
    let dir = scratch("reads-rules");
    graph_dir(&dir);
    let mut rng = Seeded(0x0072_ead5_0002);
    let files = [
        "ops.ron",
        "fusion.ron",
        "amp.ron",
        "cost.ron",
        "gradients.ron",
        "onnx.ron",
        "aten.ron",
        "rewrites/mine.ron",
    ];
    let mut commands = graph_commands("g.ron", &["--rules", "r"]);
    commands.push(vec!["check-rules", "--rules", "r", "--instances", "1"]);
    commands.push(vec!["ops", "--rules", "r"]);
    for file in files {
        let rules = dir.join("r");
        let _ = std::fs::remove_dir_all(&rules);
        std::fs::create_dir_all(rules.join("rewrites")).unwrap();
        for how in plants(&mut rng) {
            plant(&rules.join(file), how, FileKind::Rules);
            all_refused(&commands, &dir, file, how, &format!("rule file {file}"));
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stored value (`value: "w.npy"`) planted as each non-file or oversized is refused by every
/// command that reads stored values, at its `value` field; and an `--input` file likewise.
#[test]
fn value_files_that_are_not_bounded_regular_files_are_refused_without_reading() {
    let dir = scratch("reads-values");
    graph_dir(&dir);
    let mut rng = Seeded(0x0072_ead5_0003);
    let reading = [
        vec!["check", "g.ron"],
        vec!["optimize", "g.ron"],
        vec![
            "run",
            "g.ron",
            "--backend",
            "reference",
            "--random-inputs",
            "--out",
            "out",
        ],
        vec!["grad", "g.ron", "--out", "joint/j.ron"],
    ];
    let input = [
        vec![
            "run",
            "g.ron",
            "--backend",
            "reference",
            "--input",
            "x=v.npy",
            "--out",
            "out",
        ],
        vec![
            "bench",
            "g.ron",
            "--backend",
            "cpu",
            "--input",
            "x=v.npy",
            "--iters",
            "1",
        ],
    ];
    for how in plants(&mut rng) {
        plant(&dir.join("w.npy"), how, FileKind::Npy);
        for args in &reading {
            let case = format!("stored value, {how:?}, `fusebox {}`", args.join(" "));
            let stderr = refused(&bounded(args, &dir, &case), &case);
            assert!(
                stderr.contains(&value_site()),
                "{case}: not at the value: {stderr}"
            );
        }
        all_refused(&reading, &dir, "w.npy", how, "stored value");
        plant(&dir.join("v.npy"), how, FileKind::Npy);
        graph_dir(&dir);
        all_refused(&input, &dir, "v.npy", how, "--input file");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A value that `--input` replaces is not read, and `bench`, which times random values, reads
/// none: broken stored files (every plant, garbage, the wrong shape or kind of value) stop
/// neither, and `run` computes with the value it was given.
#[test]
fn replaced_stored_values_and_benchs_stored_values_are_never_read() {
    let dir = scratch("reads-replaced");
    graph_dir(&dir);
    let mut rng = Seeded(0x0072_ead5_0004);
    let good = [2.0, 2.0, -1.0, 0.5];
    Tensor::from_values(DType::F32, &[4], good.to_vec())
        .unwrap()
        .write_npy(&dir.join("good.npy"))
        .unwrap();
    type Breaker = Box<dyn Fn(&Path)>;
    let mut breakers: Vec<(String, Breaker)> = plants(&mut rng)
        .into_iter()
        .map(|how| {
            let b: Breaker = Box::new(move |p: &Path| plant(p, how, FileKind::Npy));
            (format!("{how:?}"), b)
        })
        .collect();
    breakers.push((
        "garbage".into(),
        Box::new(|p| std::fs::write(p, b"\x93NUMPYxx").unwrap()),
    ));
    breakers.push((
        "wrong shape".into(),
        Box::new(|p| {
            Tensor::from_values(DType::F32, &[5], vec![0.0; 5])
                .unwrap()
                .write_npy(p)
                .unwrap()
        }),
    ));
    breakers.push((
        "integers".into(),
        Box::new(|p| {
            Tensor::from_ints(DType::I64, &[4], vec![1; 4])
                .unwrap()
                .write_npy(p)
                .unwrap()
        }),
    ));
    breakers.push((
        "missing".into(),
        Box::new(|p| {
            let _ = std::fs::remove_file(p);
        }),
    ));
    let run = [
        "run",
        "g.ron",
        "--backend",
        "reference",
        "--input",
        "x=x.npy",
        "--input",
        "w=good.npy",
        "--out",
        "out",
    ];
    let bench = ["bench", "g.ron", "--backend", "cpu", "--iters", "1"];
    for (what, break_it) in &breakers {
        clear(&dir.join("w.npy"));
        break_it(&dir.join("w.npy"));
        let case = format!("stored w.npy {what}, run --input w=good.npy");
        assert!(held(&bounded(&run, &dir, &case), &case), "{case}: refused");
        let y = Tensor::read_npy(&dir.join("out/y.npy")).unwrap();
        assert_eq!(y.values(), vec![6.0, 2.0, 1.0, 0.125], "{case}");
        let case = format!("stored w.npy {what}, bench");
        assert!(
            held(&bounded(&bench, &dir, &case), &case),
            "{case}: refused"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// y = x + w over [4] floats, `w` an initializer stored in `w.bin` beside the model.
fn onnx_model(dir: &Path) {
    use onnx_protobuf::{
        GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
        TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
    };
    let info = |name: &str| {
        let mut shape = TensorShapeProto::new();
        let mut dim = tensor_shape_proto::Dimension::new();
        dim.value = Some(tensor_shape_proto::dimension::Value::DimValue(4));
        shape.dim.push(dim);
        let mut tensor = type_proto::Tensor::new();
        tensor.elem_type = 1;
        tensor.shape = Some(shape).into();
        let mut ty = TypeProto::new();
        ty.value = Some(type_proto::Value::TensorType(tensor));
        let mut info = ValueInfoProto::new();
        info.name = name.into();
        info.type_ = Some(ty).into();
        info
    };
    let mut w = TensorProto::new();
    w.name = "w".into();
    w.data_type = 1;
    w.dims = vec![4];
    w.data_location = onnx_protobuf::tensor_proto::DataLocation::EXTERNAL.into();
    for (key, value) in [("location", "w.bin"), ("offset", "0"), ("length", "16")] {
        let mut e = StringStringEntryProto::new();
        e.key = key.into();
        e.value = value.into();
        w.external_data.push(e);
    }
    let mut add = NodeProto::new();
    add.op_type = "Add".into();
    add.name = "add".into();
    add.input = vec!["x".into(), "w".into()];
    add.output = vec!["y".into()];
    let mut graph = GraphProto::new();
    graph.name = "m".into();
    graph.input.push(info("x"));
    graph.output.push(info("y"));
    graph.initializer.push(w);
    graph.node = vec![add];
    let mut model = ModelProto::new();
    model.ir_version = 8;
    let mut opset = OperatorSetIdProto::new();
    opset.version = 17;
    model.opset_import.push(opset);
    model.graph = Some(graph).into();
    std::fs::write(dir.join("m.onnx"), model.write_to_bytes().unwrap()).unwrap();
    let bytes: Vec<u8> = W.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
    std::fs::write(dir.join("w.bin"), bytes).unwrap();
}

/// An ONNX model, and its external data, planted as each non-file or oversized: every command
/// that reads models (`import` too) refuses it, naming it; a FIFO as external data blocked
/// them all.
#[test]
fn onnx_models_and_external_data_that_are_not_bounded_regular_files_are_refused() {
    let dir = scratch("reads-onnx");
    std::fs::create_dir_all(&dir).unwrap();
    onnx_model(&dir);
    let mut rng = Seeded(0x0072_ead5_0005);
    let mut commands = graph_commands("m.onnx", &[]);
    commands.push(vec!["import", "m.onnx", "--out", "imported"]);
    let case = "the fixture";
    assert!(
        held(&bounded(&["check", "m.onnx"], &dir, case), case),
        "{case}"
    );
    for how in plants(&mut rng) {
        plant(&dir.join("w.bin"), how, FileKind::OnnxExternal);
        all_refused(&commands, &dir, "w.bin", how, "external data");
    }
    for how in plants(&mut rng) {
        plant(&dir.join("p.onnx"), how, FileKind::OnnxModel);
        let commands: Vec<Vec<&str>> = commands
            .iter()
            .map(|c| {
                c.iter()
                    .map(|a| if *a == "m.onnx" { "p.onnx" } else { a })
                    .collect()
            })
            .collect();
        all_refused(&commands, &dir, "p.onnx", how, "ONNX model");
    }
    assert!(
        !dir.join("imported").exists(),
        "a refused import wrote its directory"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `.npy` dtypes, as `Tensor::read_npy` reads them.
const NPY_DTYPES: [DType; 11] = [
    DType::Bool,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::F16,
    DType::F32,
    DType::F64,
];

/// Four values of `dtype`'s kind: bools, integers of the dtype (one of them an extreme of its
/// range, or of i32's for i64, the rest small), and halves within ±32 (exact in f16 and bf16).
fn exact_values(dtype: DType, rng: &mut Seeded) -> Vec<f64> {
    (0..4)
        .map(|i| match dtype.int_range() {
            None if dtype == DType::Bool => (rng.next() % 2) as f64,
            None => (rng.next() % 129) as f64 / 2.0 - 32.0,
            Some(_) if dtype == DType::I64 && i == 0 => *rng.pick(&[i32::MAX, i32::MIN]) as f64,
            Some((lo, hi)) if i == 0 => *rng.pick(&[lo, hi]) as f64,
            Some((lo, _)) => (rng.next() % 101) as f64 + if lo < 0 { -50.0 } else { 0.0 },
        })
        .collect()
}

/// Whether every one of `values` lies in integer dtype `dtype`'s range (always, for the
/// other dtypes).
fn within(dtype: DType, values: &[f64]) -> bool {
    dtype
        .int_range()
        .is_none_or(|(lo, hi)| values.iter().all(|&v| v >= lo as f64 && v <= hi as f64))
}

/// A tensor of `dtype` holding `values`.
fn tensor(dtype: DType, values: &[f64]) -> Tensor {
    if dtype.category() == fusebox::dtype::Category::Integer {
        let ints = values.iter().map(|&v| v as i64).collect();
        return Tensor::from_ints(dtype, &[values.len()], ints).unwrap();
    }
    Tensor::from_values(dtype, &[values.len()], values.to_vec()).unwrap()
}

/// Every declared dtype against every `.npy` dtype, as an `--input` file and as a stored value:
/// a file of the declared kind (bool, integer, float) converts with its values exact, or, an
/// integer outside the declared integer's range, is refused; a file of another kind is refused
/// naming the file, the input and both dtypes. A float file for an
/// integer input was truncated without a word (NaN to 0, 1e20 to `i64::MAX`).
#[test]
fn value_files_of_another_kind_than_declared_are_refused_and_the_rest_convert_exactly() {
    let dir = scratch("reads-dtypes");
    let mut rng = Seeded(0x0072_ead5_0006);
    for declared in DType::ALL {
        for file in NPY_DTYPES {
            let values = exact_values(file, &mut rng);
            tensor(file, &values).write_npy(&dir.join("v.npy")).unwrap();
            let input = format!(
                "Graph(name: \"g\", inputs: [Input(name: \"a\", dtype: \"{declared}\", shape: [4])], nodes: [], outputs: [\"a\"])\n"
            );
            let stored = input.replace("shape: [4])", "shape: [4], value: \"v.npy\")");
            std::fs::write(dir.join("input.ron"), input).unwrap();
            std::fs::write(dir.join("stored.ron"), stored).unwrap();
            let ways = [
                vec![
                    "run",
                    "input.ron",
                    "--backend",
                    "reference",
                    "--input",
                    "a=v.npy",
                    "--out",
                    "out",
                ],
                vec![
                    "run",
                    "stored.ron",
                    "--backend",
                    "reference",
                    "--out",
                    "out",
                ],
            ];
            for args in ways {
                let case = format!(
                    "{file} file for a {declared} input, `fusebox {}`",
                    args.join(" ")
                );
                let _ = std::fs::remove_dir_all(dir.join("out"));
                let out = bounded(&args, &dir, &case);
                if file.category() == declared.category() && !within(declared, &values) {
                    // An integer the declared dtype cannot hold is refused, not wrapped.
                    let stderr = refused(&out, &case);
                    let part = format!("outside the range of {declared}");
                    assert!(stderr.contains(&part), "{case}: no {part}: {stderr}");
                } else if file.category() == declared.category() {
                    assert!(
                        held(&out, &case),
                        "{case}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let got = Tensor::read_npy(&dir.join("out/a.npy")).unwrap();
                    assert_eq!(got.values(), values, "{case}");
                } else {
                    let stderr = refused(&out, &case);
                    for part in [
                        "`v.npy`",
                        "input `a`",
                        &format!("holds {file} values"),
                        &format!("declared {declared}"),
                    ] {
                        assert!(stderr.contains(part), "{case}: no {part}: {stderr}");
                    }
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Within a kind, a value the declared dtype cannot hold is refused, not wrapped (an i64 past
/// i32's range) or made infinite (a finite f64 past f16's or f32's range).
#[test]
fn value_files_out_of_the_declared_range_are_refused_not_wrapped() {
    let dir = scratch("reads-range");
    let cases: [(DType, DType, f64, &str); 4] = [
        (DType::I64, DType::I32, 2147483648.0, "2147483648"),
        (DType::I64, DType::I32, -2147483649.0, "-2147483649"),
        (DType::F64, DType::F16, 65536.0 * 2.0, "1.31072e5"),
        (DType::F64, DType::F32, 1e39, "1e39"),
    ];
    for (file, declared, value, shown) in cases {
        tensor(file, &[0.0, value])
            .write_npy(&dir.join("v.npy"))
            .unwrap();
        std::fs::write(
            dir.join("g.ron"),
            format!("Graph(name: \"g\", inputs: [Input(name: \"a\", dtype: \"{declared}\", shape: [2], value: \"v.npy\")], nodes: [], outputs: [\"a\"])\n"),
        )
        .unwrap();
        let case = format!("{file} {value} for a {declared} input");
        let stderr = refused(&bounded(&["check", "g.ron"], &dir, &case), &case);
        let want = format!("holds {shown} (element 1), outside the range of {declared}");
        assert!(stderr.contains(&want), "{case}: {stderr}");
        assert!(stderr.contains("g.ron:1:"), "{case}: not located: {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every error about a stored value is reported at its `value` field (it said `graph.ron:1:1`):
/// a missing file, one that is not `.npy`, the wrong shape, another kind of value, a FIFO.
#[test]
fn stored_value_errors_point_at_the_value_field() {
    let dir = scratch("reads-located");
    graph_dir(&dir);
    let at = value_site();
    type Breaker = fn(&Path);
    let breakers: [(&str, Breaker, &str); 5] = [
        (
            "missing",
            |p| std::fs::remove_file(p).unwrap(),
            "No such file",
        ),
        (
            "garbage",
            |p| std::fs::write(p, "not npy").unwrap(),
            "not a readable .npy",
        ),
        (
            "wrong shape",
            |p| tensor(DType::F32, &[1.0, 2.0]).write_npy(p).unwrap(),
            "holds shape [2]",
        ),
        (
            "ints",
            |p| tensor(DType::I32, &[1.0; 4]).write_npy(p).unwrap(),
            "holds i32 values",
        ),
        (
            "fifo",
            |p| plant(p, Plant::Fifo, FileKind::Npy),
            "is a FIFO",
        ),
    ];
    for (what, break_it, says) in breakers {
        graph_dir(&dir);
        break_it(&dir.join("w.npy"));
        let stderr = refused(&bounded(&["check", "g.ron"], &dir, what), what);
        assert!(
            stderr.contains(&at) && stderr.contains(says),
            "{what}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
