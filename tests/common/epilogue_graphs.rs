//! Random `Linear`-like graphs whose product is followed by an epilogue of the kinds
//! cuBLASLt runs (bias, residual, scale, ReLU or GELU's tanh form) and of kinds near them that
//! it cannot (a bias along the rows, a subtraction, an activation before the residual, the
//! exact GELU, the pre-activation kept as an output), for `src/backend/cuda/runtime/lt.rs`.

use fusebox::graph::{self, Graph};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// One generated case.
pub struct EpilogueCase {
    pub graph: Graph,
    /// Whether the epilogue is one of the forms `lt::recognize` promises to take.
    pub expressible: bool,
    pub what: String,
}

/// The case of `seed`.
pub fn case(seed: u64) -> EpilogueCase {
    let mut rng = StdRng::seed_from_u64(seed);
    let dtype = ["f32", "f32", "f16", "bf16"][rng.random_range(0..4)];
    let (rows, k, m) = (
        rng.random_range(1..24usize),
        rng.random_range(1..40usize),
        rng.random_range(1..40usize),
    );
    // A leading batch axis the GEMM folds into its rows.
    let batch = rng.random_bool(0.3).then(|| rng.random_range(1..4usize));
    let lead = |last: usize| match batch {
        Some(b) => format!("[{b}, {rows}, {last}]"),
        None => format!("[{rows}, {last}]"),
    };
    let mut inputs = vec![
        format!(r#"Input(name: "x", dtype: "{dtype}", shape: {})"#, lead(k)),
        format!(r#"Input(name: "w", dtype: "{dtype}", shape: [{m}, {k}])"#),
    ];
    let mut nodes = vec![
        r#"Node(name: "wt", op: "transpose", args: ["w"], attrs: {"perm": [1, 0]})"#.to_string(),
        r#"Node(name: "y", op: "matmul", args: ["x", "wt"])"#.to_string(),
    ];
    let mut expressible = true;
    let mut what = vec![format!("{dtype} {batch:?}x{rows}x{k} by {m}")];
    let mut last = "y".to_string();
    let node = |nodes: &mut Vec<String>, op: &str, a: &str, b: Option<&str>, name: &str| {
        let args = match b {
            Some(b) => format!(r#"["{a}", "{b}"]"#),
            None => format!(r#"["{a}"]"#),
        };
        nodes.push(format!(r#"Node(name: "{name}", op: "{op}", args: {args})"#));
        name.to_string()
    };
    if rng.random_bool(0.25) {
        let scale = [0.5, -2.0, 0.125, 3.0][rng.random_range(0..4)];
        nodes.push(format!(
            r#"Node(name: "s", op: "const", attrs: {{"value": {scale:?}, "dtype": "{dtype}"}})"#
        ));
        last = node(&mut nodes, "mul", &last, Some("s"), "ys");
        what.push(format!("scale {scale}"));
    }
    // The bias: along the columns (a Linear's), or along the rows (not cuBLASLt's).
    let bias = rng.random_range(0..4);
    if bias > 0 {
        let shape = match bias {
            3 => {
                expressible = false;
                what.push("bias along rows".into());
                format!("[{rows}, 1]")
            }
            _ => {
                what.push("bias".into());
                format!("[{m}]")
            }
        };
        inputs.push(format!(
            r#"Input(name: "b", dtype: "{dtype}", shape: {shape})"#
        ));
        let op = if rng.random_bool(0.15) {
            expressible = false;
            what.push("subtracted".into());
            "sub"
        } else {
            "add"
        };
        last = if rng.random_bool(0.5) || op == "sub" {
            node(&mut nodes, op, &last, Some("b"), "yb")
        } else {
            node(&mut nodes, op, "b", Some(&last), "yb")
        };
    }
    let residual = rng.random_bool(0.4);
    let relu = rng.random_range(0..3); // 0 none, 1 at the end, 2 before the residual
    // The activation: cuBLASLt's two, or the exact (erf) GELU, which it does not have.
    let (act, act_expressible) = [
        ("relu", true),
        ("relu", true),
        ("gelu_tanh", true),
        ("gelu", false),
    ][rng.random_range(0..4)];
    if residual {
        inputs.push(format!(
            r#"Input(name: "r", dtype: "{dtype}", shape: {})"#,
            lead(m)
        ));
        if relu == 2 {
            last = node(&mut nodes, act, &last, None, "yr");
            expressible = false;
            what.push(act.into());
        }
        last = node(&mut nodes, "add", &last, Some("r"), "yres");
        what.push("residual".into());
    }
    if relu == 1 || (relu == 2 && !residual) {
        last = node(&mut nodes, act, &last, None, "out");
        expressible &= act_expressible;
        what.push(act.into());
    }
    let mut outputs = vec![last.clone()];
    if last != "y" && rng.random_bool(0.15) {
        // The product itself, or the value before the last op, is an output too.
        let made: Vec<&str> = ["y", "ys", "yb", "yr", "yres"]
            .into_iter()
            .filter(|n| nodes.iter().any(|d| d.contains(&format!("name: \"{n}\""))))
            .collect();
        let kept = made[rng.random_range(0..made.len())].to_string();
        if kept != last {
            expressible = false;
            what.push(format!("{kept} kept"));
            outputs.push(kept);
        }
    }
    if last == "y" {
        // No epilogue at all: nothing for cuBLASLt to run.
        expressible = false;
    }
    let text = format!(
        r#"Graph(name: "lt_{seed}", inputs: [{}], nodes: [{}], outputs: [{}])"#,
        inputs.join(", "),
        nodes.join(", "),
        outputs
            .iter()
            .map(|o| format!("\"{o}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rules = super::random_graph::rules();
    let (graph, _) =
        graph::file::parse(&text, "lt.ron", &rules.ops).unwrap_or_else(|e| panic!("{text}: {e}"));
    EpilogueCase {
        graph,
        expressible,
        what: what.join(", "),
    }
}
