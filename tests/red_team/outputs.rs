//! Class 3, 4, 5 and 6 of the third red-team round (issue 40), as far as outputs go: files the
//! commands write never replace a file they were not asked to replace (`grad --out`, `--split`,
//! `import --out`, `run --out`), what a killed write leaves behind is swept, `check-rules`
//! checks every op's derivative, and two messages say what they mean.

use super::*;
use fusebox::dtype::DType;
use std::collections::BTreeMap;

/// The contents of every plain file under `dir`, by path.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    tree(dir)
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Asserts every file of `before` still holds what it held, except those in `replaced`.
#[track_caller]
fn unchanged_except(before: &BTreeMap<PathBuf, Vec<u8>>, replaced: &[PathBuf], case: &str) {
    for (path, bytes) in before {
        if replaced.contains(path) {
            continue;
        }
        let now = std::fs::read(path)
            .unwrap_or_else(|e| panic!("{case}: {} is gone: {e}", path.display()));
        assert!(&now == bytes, "{case}: {} was modified", path.display());
    }
}

fn write_floats(path: &Path, values: &[f64]) {
    Tensor::from_values(DType::F32, &[values.len()], values.to_vec())
        .unwrap()
        .write_npy(path)
        .unwrap();
}

/// The stored-value files a graph file names, by input, resolved beside it.
fn stored_files(graph: &Path) -> BTreeMap<String, PathBuf> {
    let catalogue = Catalogue::defaults();
    let (_, _, files) = fusebox::graph::file::load_with_values(graph, &catalogue)
        .unwrap_or_else(|e| panic!("{}: {e}", graph.display()));
    let dir = graph.parent().unwrap();
    files
        .into_iter()
        .map(|(name, stored)| (name, dir.join(stored.file)))
        .collect()
}

/// Asserts that the inputs of `graph` with stored values refer to files holding exactly
/// `values[input]`, that inputs with different values never share a file, and that no file
/// the command wrote (one not in `before`) differs only in case from another file referred
/// to (they would be one file on macOS).
#[track_caller]
fn references_hold(
    graph: &Path,
    values: &BTreeMap<String, Vec<f64>>,
    before: &BTreeMap<PathBuf, Vec<u8>>,
    case: &str,
) {
    let mut by_file: BTreeMap<PathBuf, &Vec<f64>> = BTreeMap::new();
    for (input, file) in stored_files(graph) {
        let want = &values[&input];
        let got = Tensor::read_npy(&file)
            .unwrap_or_else(|e| panic!("{case}: {}: `{input}`: {e}", graph.display()))
            .values();
        assert_eq!(
            &got,
            want,
            "{case}: {}: `{input}` reads {}",
            graph.display(),
            file.display()
        );
        if let Some(other) = by_file.insert(file.canonicalize().unwrap(), want) {
            assert_eq!(other, want, "{case}: two values share {}", file.display());
        }
    }
    let before: Vec<PathBuf> = before
        .keys()
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    for written in by_file.keys().filter(|f| !before.contains(f)) {
        let folded = written.to_string_lossy().to_lowercase();
        for other in by_file.keys().filter(|f| *f != written) {
            assert_ne!(
                other.to_string_lossy().to_lowercase(),
                folded,
                "{case}: {} differs only in case from {}",
                written.display(),
                other.display()
            );
        }
    }
}

/// Parameter names built to collide: the same name in other case, names whose files are the
/// graph files `grad` writes, percent signs that look like an encoding, a slash.
const PARAM_NAMES: &[&str] = &[
    "w",
    "W",
    "v",
    "joint",
    "forward",
    "forward.ron",
    "%2F",
    "/",
    "w~2",
    "b",
];
/// Where a stored value lives, relative to the work directory: inside the output directory
/// `sub` or outside it, under names other inputs' copies would want.
const VALUE_FILES: &[&str] = &[
    "w.npy",
    "sub/w.npy",
    "sub/W.npy",
    "sub/v.npy",
    "vals/w.npy",
    "sub/w~2.npy",
    "sub/%2F.npy",
    "sub/joint.ron",
    "b.npy",
];
/// Files that may already be in the output directory, holding the user's data.
const PRESENT: &[&str] = &[
    "w.npy",
    "W.npy",
    "v.npy",
    "joint.npy",
    "%252F.npy",
    "forward.ron.npy",
];

/// A generated case: a graph `g.ron` in `work` with input `x` and 2-4 parameters, each with a
/// stored value in one of [`VALUE_FILES`], and some of [`PRESENT`] in `work/sub`. Returns the
/// value of each parameter (shared files share their value).
fn plant_graph(work: &Path, rng: &mut Seeded) -> BTreeMap<String, Vec<f64>> {
    std::fs::create_dir_all(work.join("sub")).unwrap();
    std::fs::create_dir_all(work.join("vals")).unwrap();
    let count = 2 + (rng.next() % 3) as usize;
    let mut params: Vec<(&str, &str)> = Vec::new();
    while params.len() < count {
        let name = *rng.pick(PARAM_NAMES);
        if params.iter().all(|(n, _)| *n != name) {
            params.push((name, *rng.pick(VALUE_FILES)));
        }
    }
    let mut values = BTreeMap::new();
    let mut by_file: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (i, (name, file)) in params.iter().enumerate() {
        let value = by_file
            .entry(file)
            .or_insert_with(|| (0..3).map(|j| (i * 3 + j) as f64 + 0.5).collect())
            .clone();
        write_floats(&work.join(file), &value);
        values.insert(name.to_string(), value);
    }
    for present in PRESENT {
        if rng.next().is_multiple_of(2) && !work.join("sub").join(present).exists() {
            std::fs::write(
                work.join("sub").join(present),
                format!("user data {present}"),
            )
            .unwrap();
        }
    }
    let inputs: String = params
        .iter()
        .map(|(n, f)| format!(", Input(name: {n:?}, dtype: \"f32\", shape: [3], value: {f:?})"))
        .collect();
    let mut nodes = String::new();
    let mut last = "x".to_string();
    for (i, (name, _)) in params.iter().enumerate() {
        let op = if i % 2 == 0 { "mul" } else { "add" };
        let _ = std::fmt::Write::write_fmt(
            &mut nodes,
            format_args!("Node(name: \"t{i}\", op: \"{op}\", args: [{last:?}, {name:?}]),\n"),
        );
        last = format!("t{i}");
    }
    nodes.push_str(&format!("Node(name: \"y\", op: \"neg\", args: [{last:?}])"));
    std::fs::write(
        work.join("g.ron"),
        format!(
            "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [3]){inputs}],\n nodes: [{nodes}], outputs: [\"y\"])\n"
        ),
    )
    .unwrap();
    write_floats(&work.join("x.npy"), &[0.25, -1.5, 2.0]);
    values
}

/// Runs `graph` on the reference backend with `x` (and the cotangent `grad_y`, for a joint
/// graph) from `x.npy`, and returns its `y`.
fn run_y(graph: &str, work: &Path, out: &str, case: &str) -> Vec<f64> {
    let mut args = vec![
        "run",
        graph,
        "--backend",
        "reference",
        "--input",
        "x=x.npy",
        "--out",
        out,
    ];
    if graph.ends_with("joint.ron") {
        args.extend(["--input", "grad_y=x.npy"]);
    }
    ok(&fusebox(&args, work));
    let _ = case;
    Tensor::read_npy(&work.join(out).join("y.npy"))
        .unwrap()
        .values()
}

/// `grad --out sub/joint.ron` and `grad --split sub` on generated graphs whose stored values
/// live inside and outside `sub` under colliding names, with the user's files already there:
/// no file is replaced but the graph files named, every reference holds its own value, and
/// the written graphs compute what the source does. Only `--out` naming one of the source's
/// stored values is refused, and then nothing is written.
#[test]
fn copied_stored_values_never_replace_a_file_for_grad_out_and_split() {
    let dir = scratch("grad-copies");
    let mut rng = Seeded(0x00c0_91e5);
    for round in 0..8 {
        for split in [false, true] {
            let work = dir.join(format!("r{round}-{split}"));
            let values = plant_graph(&work, &mut rng);
            let case = format!(
                "round {round}, split {split}: {}",
                std::fs::read_to_string(work.join("g.ron")).unwrap()
            );
            let before = snapshot(&work);
            let targets: Vec<PathBuf> = if split {
                vec![work.join("sub/forward.ron"), work.join("sub/backward.ron")]
            } else {
                vec![work.join("sub/joint.ron")]
            };
            let args: &[&str] = if split {
                &["grad", "g.ron", "--split", "sub"]
            } else {
                &["grad", "g.ron", "--out", "sub/joint.ron"]
            };
            let out = fusebox(args, &work);
            let source_target = stored_files(&work.join("g.ron"))
                .values()
                .any(|f| targets.contains(f));
            if source_target {
                let stderr = refused(&out, &case);
                assert!(
                    stderr.contains("is the stored value of input"),
                    "{case}: {stderr}"
                );
                unchanged_except(&before, &[], &case);
                assert_eq!(
                    snapshot(&work).len(),
                    before.len(),
                    "{case}: a file was written"
                );
                continue;
            }
            assert!(
                held(&out, &case),
                "{case}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            unchanged_except(&before, &targets, &case);
            let want = run_y("g.ron", &work, "o_src", &case);
            for target in &targets {
                references_hold(target, &values, &before, &case);
            }
            let written = if split {
                "sub/forward.ron"
            } else {
                "sub/joint.ron"
            };
            assert_eq!(run_y(written, &work, "o_written", &case), want, "{case}");
            // Again: the copies already there are referred to, not copied once more.
            let files = snapshot(&work).len();
            ok(&fusebox(args, &work));
            assert_eq!(
                snapshot(&work).len(),
                files,
                "{case}: a second grad piled up copies"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The reported case: a stored value from outside `sub` is copied to `sub/w~2.npy`, not over
/// `sub/w.npy`, another input's stored value (and so the source graph's own weight).
#[test]
fn grad_out_keeps_another_inputs_stored_file_of_the_same_name() {
    let work = scratch("grad-same-name");
    std::fs::create_dir_all(work.join("sub")).unwrap();
    write_floats(&work.join("w.npy"), &[1.0, 2.0, 3.0]);
    write_floats(&work.join("sub/w.npy"), &[7.0, 8.0, 9.0]);
    std::fs::write(
        work.join("g.ron"),
        "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [3]), \
         Input(name: \"w\", dtype: \"f32\", shape: [3], value: \"w.npy\"), \
         Input(name: \"v\", dtype: \"f32\", shape: [3], value: \"sub/w.npy\")],\n \
         nodes: [Node(name: \"a\", op: \"mul\", args: [\"x\", \"w\"]), Node(name: \"y\", op: \"mul\", args: [\"a\", \"v\"])], outputs: [\"y\"])\n",
    )
    .unwrap();
    let before = snapshot(&work);
    let text = ok(&fusebox(
        &["grad", "g.ron", "--out", "sub/joint.ron"],
        &work,
    ));
    assert!(
        text.contains("stored values written beside it: 1"),
        "{text}"
    );
    unchanged_except(&before, &[], "grad --out");
    let joint = std::fs::read_to_string(work.join("sub/joint.ron")).unwrap();
    assert!(
        joint.contains("value: \"w~2.npy\"") && joint.contains("value: \"w.npy\""),
        "{joint}"
    );
    let values = BTreeMap::from([
        ("w".to_string(), vec![1.0, 2.0, 3.0]),
        ("v".to_string(), vec![7.0, 8.0, 9.0]),
    ]);
    references_hold(&work.join("sub/joint.ron"), &values, &before, "grad --out");
    ok(&fusebox(&["grad", "g.ron", "--split", "sub"], &work));
    unchanged_except(&before, &[], "grad --split");
    references_hold(
        &work.join("sub/forward.ron"),
        &values,
        &before,
        "grad --split",
    );
    references_hold(
        &work.join("sub/backward.ron"),
        &values,
        &before,
        "grad --split",
    );
    // The graph itself is no place for its joint graph.
    let stderr = refused(
        &fusebox(&["grad", "g.ron", "--out", "g.ron"], &work),
        "--out g.ron",
    );
    assert!(
        stderr.contains("g.ron is the graph being differentiated"),
        "{stderr}"
    );
    unchanged_except(&before, &[], "--out g.ron");
    std::fs::remove_dir_all(&work).unwrap();
}

/// Output names built to collide when written with `run --out`: the same file under
/// different names is impossible (the mapping is one to one), names differing only in case
/// are refused before anything is written, and files already in the directory that are not
/// outputs are kept whatever their names.
#[test]
fn run_out_collisions_are_refused_or_written_beside_existing_files() {
    let dir = scratch("run-collisions");
    let pool = ["y", "Y", "graph.ron", "%2F", "/", "a.npy", "A.NPY", "z"];
    let mut rng = Seeded(0x0a11_0c47);
    for round in 0..6 {
        let mut names: Vec<String> = Vec::new();
        for _ in 0..3 {
            let name = rng.pick(&pool).to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let work = dir.join(format!("r{round}"));
        std::fs::create_dir_all(work.join("out")).unwrap();
        std::fs::write(work.join("g.ron"), graph_with_outputs(&names)).unwrap();
        for present in ["graph.ron", "notes.npy", "Y.npy.bak"] {
            std::fs::write(work.join("out").join(present), "user data").unwrap();
        }
        let case = format!("round {round}: {names:?}");
        let before = snapshot(&work);
        let out = fusebox(
            &[
                "run",
                "g.ron",
                "--backend",
                "reference",
                "--random-inputs",
                "--out",
                "out",
            ],
            &work,
        );
        let folded: std::collections::BTreeSet<String> = names
            .iter()
            .map(|n| fusebox_file_name(n).to_lowercase())
            .collect();
        if folded.len() < names.len() {
            let stderr = refused(&out, &case);
            assert!(stderr.contains("outputs `"), "{case}: {stderr}");
            assert_eq!(snapshot(&work), before, "{case}: something was written");
            continue;
        }
        assert!(held(&out, &case), "{case}");
        unchanged_except(&before, &[], &case);
        assert_eq!(tree(&work.join("out")).len(), 3 + names.len(), "{case}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `run --out` into the directory of what the run reads: an output whose file would be the
/// graph's stored value, or an `--input` file, is refused before anything is written, and
/// the value keeps its bytes; reached through another spelling of the path too.
#[test]
fn run_out_never_replaces_a_file_the_run_reads() {
    let work = scratch("run-reads");
    std::fs::create_dir_all(work.join("sub")).unwrap();
    let graph = "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [3]),\n\
                 Input(name: \"p\", dtype: \"f32\", shape: [3], value: \"y.npy\")],\n\
                 nodes: [Node(name: \"y\", op: \"mul\", args: [\"x\", \"p\"]),\n\
                 Node(name: \"x2\", op: \"neg\", args: [\"x\"])], outputs: [\"y\", \"x2\"])\n";
    std::fs::write(work.join("g.ron"), graph).unwrap();
    write_floats(&work.join("y.npy"), &[1.0, 2.0, 3.0]);
    write_floats(&work.join("sub/x2.npy"), &[4.0, 5.0, 6.0]);
    for (case, args) in [
        (
            "stored value, same directory",
            vec!["--random-inputs", "--out", "."],
        ),
        (
            "stored value, another spelling",
            vec!["--random-inputs", "--out", "sub/.."],
        ),
        (
            "an --input file",
            vec!["--input", "x=sub/x2.npy", "--out", "sub"],
        ),
    ] {
        let before = snapshot(&work);
        for backend in ["reference", "cpu"] {
            let mut all = vec!["run", "g.ron", "--backend", backend];
            all.extend(&args);
            let stderr = refused(&fusebox(&all, &work), case);
            assert!(stderr.contains("which this run reads"), "{case}: {stderr}");
            assert_eq!(
                snapshot(&work),
                before,
                "{case} on {backend}: something was written"
            );
        }
    }
    // Elsewhere the same run writes both outputs.
    let out = fusebox(
        &[
            "run",
            "g.ron",
            "--backend",
            "reference",
            "--random-inputs",
            "--out",
            "out",
        ],
        &work,
    );
    assert!(held(&out, "another directory"));
    assert!(work.join("out/y.npy").is_file() && work.join("out/x2.npy").is_file());
    std::fs::remove_dir_all(&work).unwrap();
}

/// The file `run --out` and `import` give the names used here (see `file_name` in
/// src/cli/output.rs): `/` and `%` are percent-encoded, `.npy` appended.
fn fusebox_file_name(name: &str) -> String {
    format!("{}.npy", name.replace('%', "%25").replace('/', "%2F"))
}

// ------------------------------------------------------------------ import --out

mod onnx_model {
    use onnx_protobuf::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto};
    use onnx_protobuf::{TypeProto, ValueInfoProto};
    use protobuf::Message;

    fn value_info(name: &str) -> ValueInfoProto {
        let mut ty = TypeProto::new();
        let tensor = ty.mut_tensor_type();
        tensor.elem_type = 1;
        let shape = tensor.shape.mut_or_insert_default();
        let mut dim = onnx_protobuf::tensor_shape_proto::Dimension::new();
        dim.set_dim_value(3);
        shape.dim.push(dim);
        let mut info = ValueInfoProto::new();
        info.name = name.into();
        info.type_ = Some(ty).into();
        info
    }

    /// `y = x + w0 + w1 + …`, with each `w` an initializer of three floats.
    pub fn adds(weights: &[(String, [f32; 3])]) -> Vec<u8> {
        let mut graph = GraphProto::new();
        graph.name = "m".into();
        graph.input.push(value_info("x"));
        graph.output.push(value_info("y"));
        let mut last = "x".to_string();
        for (i, (name, values)) in weights.iter().enumerate() {
            let mut t = TensorProto::new();
            t.name = name.clone();
            t.data_type = 1;
            t.dims = vec![3];
            t.raw_data = values.iter().flat_map(|f| f.to_le_bytes()).collect();
            graph.initializer.push(t);
            let mut n = NodeProto::new();
            n.op_type = "Add".into();
            n.name = format!("add{i}");
            n.input = vec![last.clone(), name.clone()];
            let output = if i + 1 == weights.len() {
                "y".to_string()
            } else {
                format!("s{i}")
            };
            n.output = vec![output.clone()];
            graph.node.push(n);
            last = output;
        }
        let mut model = ModelProto::new();
        model.ir_version = 8;
        let mut opset = OperatorSetIdProto::new();
        opset.version = 17;
        model.opset_import.push(opset);
        model.graph = Some(graph).into();
        model.write_to_bytes().unwrap()
    }
}

/// `import --out DIR` on generated models whose weight names collide (case variants, a
/// weight named `graph.ron`, names equal to files already in DIR): names differing only in
/// case are refused naming the model and calling them weights; otherwise the user's files in
/// DIR are kept (a weight whose file name is taken goes beside it), the written graph's
/// references hold the model's values, and importing again changes no other file and adds
/// none.
#[test]
fn import_out_keeps_unrelated_files_and_reimports_in_place() {
    let dir = scratch("import-collisions");
    let pool = ["w", "W", "graph.ron", "graph", "b", "%2F", "/"];
    let mut rng = Seeded(0x001a_9047);
    for round in 0..6 {
        let work = dir.join(format!("r{round}"));
        std::fs::create_dir_all(work.join("out")).unwrap();
        let mut weights: Vec<(String, [f32; 3])> = Vec::new();
        for i in 0..3 {
            let name = rng.pick(&pool).to_string();
            if weights.iter().all(|(n, _)| *n != name) {
                let v = i as f32;
                weights.push((name, [v, v + 0.5, -v]));
            }
        }
        std::fs::write(work.join("model.onnx"), onnx_model::adds(&weights)).unwrap();
        for present in ["w.npy", "graph.npy", "b.npy"] {
            if rng.next().is_multiple_of(2) {
                std::fs::write(work.join("out").join(present), "user data").unwrap();
            }
        }
        let names: Vec<&str> = weights.iter().map(|(n, _)| n.as_str()).collect();
        let case = format!("round {round}: {names:?}");
        let before = snapshot(&work);
        let out = fusebox(&["import", "model.onnx", "--out", "out"], &work);
        let folded: std::collections::BTreeSet<String> = names
            .iter()
            .map(|n| fusebox_file_name(n).to_lowercase())
            .collect();
        if folded.len() < names.len() {
            let stderr = refused(&out, &case);
            assert!(
                stderr.contains("model.onnx") && stderr.contains("weights `"),
                "{case}: {stderr}"
            );
            assert_eq!(snapshot(&work), before, "{case}: something was written");
            continue;
        }
        assert!(held(&out, &case), "{case}");
        unchanged_except(&before, &[], &case);
        let values: BTreeMap<String, Vec<f64>> = weights
            .iter()
            .map(|(n, v)| (n.clone(), v.iter().map(|f| f64::from(*f)).collect()))
            .collect();
        references_hold(&work.join("out/graph.ron"), &values, &before, &case);
        let after = snapshot(&work);
        ok(&fusebox(&["import", "model.onnx", "--out", "out"], &work));
        assert_eq!(
            snapshot(&work),
            after,
            "{case}: importing again changed files"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Weights that differ only in case are refused with the word the reader knows (weights,
/// not outputs) and the model they come from.
#[test]
fn an_import_case_clash_names_the_weights_and_the_model() {
    let work = scratch("import-case");
    let weights = [
        ("Gate".to_string(), [1.0; 3]),
        ("gate".to_string(), [2.0; 3]),
    ];
    std::fs::write(work.join("m.onnx"), onnx_model::adds(&weights)).unwrap();
    let stderr = refused(
        &fusebox(&["import", "m.onnx", "--out", "out"], &work),
        "case",
    );
    assert!(
        stderr.contains("m.onnx")
            && stderr
                .contains("weights `Gate` and `gate` would be written to Gate.npy and gate.npy"),
        "{stderr}"
    );
    assert!(!work.join("out/graph.ron").exists());
    std::fs::remove_dir_all(&work).unwrap();
}

// ------------------------------------------------------------------ residue

/// The id of a process that ran and was reaped: no process has it now (until the system
/// reuses it, which takes tens of thousands of processes).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// Staging that killed writes left (a directory of a dead process, a temporary file of
/// another) is swept by the next write into that directory, by `run --out`, `grad --out` and
/// `import --out` alike; a live process's staging, a link with a staging name (and what it
/// points to) and names that only look like staging are left alone.
#[test]
fn staging_left_by_dead_processes_is_swept_by_every_writing_command() {
    let dir = scratch("sweep");
    write_floats(&dir.join("w.npy"), &[1.0, 2.0, 3.0]);
    std::fs::write(
        dir.join("g.ron"),
        "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [3]), \
         Input(name: \"w\", dtype: \"f32\", shape: [3], value: \"w.npy\")],\n \
         nodes: [Node(name: \"y\", op: \"mul\", args: [\"x\", \"w\"])], outputs: [\"y\"])\n",
    )
    .unwrap();
    let weights = [("w".to_string(), [1.0, 2.0, 3.0])];
    std::fs::write(dir.join("m.onnx"), onnx_model::adds(&weights)).unwrap();
    let live = std::process::id();
    let commands: [&[&str]; 3] = [
        &[
            "run",
            "g.ron",
            "--backend",
            "reference",
            "--random-inputs",
            "--out",
            "out",
        ],
        &["grad", "g.ron", "--out", "out/joint.ron"],
        &["import", "m.onnx", "--out", "out"],
    ];
    for (i, args) in commands.iter().enumerate() {
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let (dead, other_dead) = (dead_pid(), dead_pid());
        let dead_dir = out.join(format!(".fusebox-staging-{dead}-0"));
        std::fs::create_dir(&dead_dir).unwrap();
        std::fs::write(dead_dir.join("y.npy"), vec![0u8; 4096]).unwrap();
        let dead_file = out.join(format!(".joint.ron.fusebox-tmp-{other_dead}-3"));
        std::fs::write(&dead_file, "half a graph").unwrap();
        let live_dir = out.join(format!(".fusebox-staging-{live}-0"));
        std::fs::create_dir_all(&live_dir).unwrap();
        let kept_target = dir.join(format!("keep{i}"));
        std::fs::create_dir_all(&kept_target).unwrap();
        std::fs::write(kept_target.join("precious"), "data").unwrap();
        let link = out.join(format!(".fusebox-staging-{}-1", dead_pid()));
        std::os::unix::fs::symlink(&kept_target, &link).unwrap();
        let lookalikes = [
            format!(".fusebox-staging-0{dead}-0"),
            format!(".fusebox-staging-{dead}-x"),
            format!("fusebox-staging-{dead}-0"),
        ];
        for name in &lookalikes {
            std::fs::create_dir(out.join(name)).unwrap();
        }
        ok(&fusebox(args, &dir));
        let case = format!("{args:?}");
        assert!(
            !dead_dir.exists(),
            "{case}: a dead process's staging stayed"
        );
        assert!(
            !dead_file.exists(),
            "{case}: a dead process's temporary file stayed"
        );
        assert!(
            live_dir.exists(),
            "{case}: a live process's staging was removed"
        );
        assert!(
            link.is_symlink(),
            "{case}: a link with a staging name was touched"
        );
        assert!(
            kept_target.join("precious").exists(),
            "{case}: the sweep followed a link"
        );
        for name in &lookalikes {
            assert!(
                out.join(name).exists(),
                "{case}: {name} is not fusebox's and was removed"
            );
        }
        std::fs::remove_dir_all(&out).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------------ derivatives

/// The `Op(…)` entry of op `name` in the text of an `ops.ron`.
fn op_entry<'a>(ops: &'a str, name: &str) -> &'a str {
    let start = ops
        .find(&format!("Op(name: \"{name}\""))
        .unwrap_or_else(|| panic!("no op {name}"));
    let mut depth = 0;
    for (i, c) in ops[start..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &ops[start..=start + i];
                }
            }
            _ => {}
        }
    }
    panic!("op {name} does not end")
}

/// Derivatives of default ops made wrong as a rule directory would redefine them (scaled by
/// 1.3, or with the operands swapped): `check-rules` refuses each, naming the op and the
/// operand, with a counterexample, and exit 1. The unchanged op passes.
#[test]
fn a_wrong_derivative_of_any_op_fails_check_rules() {
    let dir = scratch("wrong-derivative");
    let defaults =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/ops.ron"))
            .unwrap();
    // Ops whose derivatives are nowhere zero on most of their domain (a scaled zero is still
    // right), each with the operand whose formula is perturbed.
    let ops = [
        ("sigmoid", "x"),
        ("tanh", "x"),
        ("exp", "x"),
        ("log", "x"),
        ("mul", "a"),
        ("div", "b"),
        ("sin", "x"),
        ("pow", "a"),
        ("silu", "x"),
        ("gelu", "x"),
    ];
    let mut rng = Seeded(0x00de_417a);
    for round in 0..4 {
        let (op, operand) = *rng.pick(&ops);
        let entry = op_entry(&defaults, op);
        let key = format!("\"{operand}\": \"");
        let at = entry
            .find(&key)
            .unwrap_or_else(|| panic!("{op}: no d/d{operand}"))
            + key.len();
        let end = at + entry[at..].find('"').unwrap();
        let formula = &entry[at..end];
        // The operands `a` and `b` swapped where they stand alone (not inside `abs`).
        let chars: Vec<char> = formula.chars().collect();
        let alone = |i: usize| {
            let word = |j: Option<&char>| j.is_some_and(|c| c.is_alphanumeric() || *c == '_');
            !word(i.checked_sub(1).and_then(|j| chars.get(j))) && !word(chars.get(i + 1))
        };
        let swapped: String = chars
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                'a' if alone(i) => 'b',
                'b' if alone(i) => 'a',
                c => *c,
            })
            .collect();
        let wrong = if rng.next().is_multiple_of(2) || swapped == formula {
            format!("({formula}) * 1.3")
        } else {
            swapped
        };
        let case = format!("round {round}: d{op}/d{operand} = `{wrong}` instead of `{formula}`");
        let rules = dir.join(format!("r{round}"));
        std::fs::create_dir_all(&rules).unwrap();
        let text = format!("[\n{}{wrong}{},\n]\n", &entry[..at], &entry[end..]);
        std::fs::write(rules.join("ops.ron"), text).unwrap();
        let out = fusebox(&["check-rules", "--rules", rules.to_str().unwrap()], &dir);
        let stderr = refused(&out, &case);
        assert!(
            stderr.contains(&format!("`{op}` (operand `{operand}`)")),
            "{case}: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("WRONG DERIVATIVE: op `{op}`, operand `{operand}`"))
                && stdout.contains("central differences give"),
            "{case}: {stdout}"
        );
        // The op as it was passes.
        std::fs::write(rules.join("ops.ron"), format!("[\n{entry},\n]\n")).unwrap();
        ok(&fusebox(
            &["check-rules", "--rules", rules.to_str().unwrap()],
            &dir,
        ));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------------ messages

/// `"keepdim": True` is a bare name to RON, which reads it as `()`: the message names what
/// was written and how RON spells a boolean, rather than "found `()`".
#[test]
fn a_bare_name_attribute_is_named_as_written() {
    let dir = scratch("bare-name");
    for (attr, op, written, hint) in [
        (
            "keepdim",
            "sum",
            "True",
            "writes booleans as `true` and `false`",
        ),
        ("min", "clamp", "NAN", "`NaN`, `inf` and `-inf`"),
        ("keepdim", "sum", "yes_please", "`true` and `false`"),
    ] {
        std::fs::write(
            dir.join("g.ron"),
            format!(
                "Graph(name: \"g\", inputs: [Input(name: \"x\", dtype: \"f32\", shape: [2])],\n\
                 nodes: [Node(name: \"y\", op: \"{op}\", args: [\"x\"], attrs: {{\"{attr}\": {written}}})], outputs: [\"y\"])\n"
            ),
        )
        .unwrap();
        let stderr = refused(&fusebox(&["check", "g.ron"], &dir), written);
        assert!(
            stderr.contains(&format!("found the bare name `{written}`")) && stderr.contains(hint),
            "{stderr}"
        );
        assert!(stderr.contains("g.ron:2:"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
