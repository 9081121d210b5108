//! The partitioner and the cost model: hand-computed costs on tiny dags, the LSTM examples,
//! cases where the cost model (not legality) decides, convexity, the argument and op budgets,
//! and the invariants every partition must keep on the examples and on random dags.

use fusebox::dag::{Dag, Value};
use fusebox::dtype::DType;
use fusebox::graph::{GraphBuilder, file};
use fusebox::partition::{self, Kernel, KernelKind, Partition};
use fusebox::rules::{Catalogue, CostModel, FusionRules, Profile, Role, RuleSet};
use fusebox::shape::broadcasts_to;

fn dag(text: &str) -> Dag {
    let ops = Catalogue::defaults();
    let (graph, _) = file::parse(text, "test.ron", &ops).unwrap();
    Dag::from_graph(&graph, &ops).unwrap()
}

fn example(name: &str) -> Dag {
    let ops = Catalogue::defaults();
    let path = format!("{}/examples/{name}.ron", env!("CARGO_MANIFEST_DIR"));
    let (graph, _) = file::load(std::path::Path::new(&path), &ops).unwrap();
    Dag::from_graph(&graph, &ops).unwrap()
}

/// Round numbers so costs can be worked out by hand: 1000 bytes/us, 1000 flops/us, 10 us per
/// launch, memory and compute added (overlap 0).
fn toy() -> Profile {
    let mut model = CostModel::defaults();
    model
        .load_str(
            r#"Cost(profiles: {"toy": Profile(
                bandwidth_gbps: 1.0, launch_us: 10.0, pointwise_gflops: 1.0, overlap: 0.0,
                matmul_gflops: {"f32": 2.0},
                weights: {"add": 1.0, "sub": 1.0, "mul": 1.0, "neg": 1.0, "exp": 8.0,
                          "div": 4.0, "tanh": 6.0, "reduce": 1.0},
            )})"#,
            "toy.ron",
        )
        .unwrap();
    model.profile("toy").unwrap().clone()
}

fn profile(name: &str) -> Profile {
    CostModel::defaults().profile(name).unwrap().clone()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

macro_rules! assert_close {
    ($a:expr, $b:expr) => {
        assert!(close($a, $b), "{} != {}", $a, $b)
    };
}

/// The index of the node named `name`.
fn node(dag: &Dag, name: &str) -> usize {
    dag.nodes.iter().position(|n| n.name == name).unwrap()
}

fn names(dag: &Dag, kernel: &Kernel) -> Vec<String> {
    kernel
        .nodes
        .iter()
        .map(|&n| dag.nodes[n].name.clone())
        .collect()
}

fn kernel_with<'a>(dag: &Dag, p: &'a Partition, node: &str) -> &'a Kernel {
    p.kernels
        .iter()
        .find(|k| k.nodes.iter().any(|&n| dag.nodes[n].name == node))
        .unwrap_or_else(|| panic!("no kernel holds `{node}`"))
}

/// Everything a partition must satisfy, checked from scratch.
fn check_invariants(dag: &Dag, p: &Partition, fusion: &FusionRules) {
    let users = dag.users();
    let outputs = dag.output_mask();
    let of = p.kernel_of(dag.nodes.len());
    let in_place = |n: usize| p.in_place.contains(&n);
    for (n, node) in dag.nodes.iter().enumerate() {
        assert_eq!(
            of[n].is_none(),
            partition::is_literal(node) || in_place(n),
            "node {} is in a kernel iff it is not a literal or a concat written in place",
            node.name
        );
    }
    // A concat written in place: every operand with elements is stored into its segment by
    // exactly one kernel, which computes it.
    for &c in &p.in_place {
        let writes: Vec<(usize, &partition::SegmentWrite)> = p
            .kernels
            .iter()
            .enumerate()
            .flat_map(|(k, kernel)| kernel.segments.iter().map(move |s| (k, s)))
            .filter(|(_, s)| s.concat == c)
            .collect();
        let with_elements: Vec<Value> = dag.nodes[c]
            .args
            .iter()
            .copied()
            .filter(|&a| dag.ty(a).shape.iter().product::<usize>() > 0)
            .collect();
        assert_eq!(writes.len(), with_elements.len());
        for ((k, s), a) in writes.iter().zip(&with_elements) {
            assert_eq!(Value::Node(s.value), *a);
            assert_eq!(of[s.value], Some(*k));
        }
    }
    let mut placed = 0;
    for (k, kernel) in p.kernels.iter().enumerate() {
        placed += kernel.nodes.len();
        assert!(kernel.nodes.windows(2).all(|w| w[0] < w[1]), "sorted nodes");
        let inside = |n: usize| of[n] == Some(k);
        // Inputs: exactly the external, non-literal operands, each from an earlier kernel
        // (kernels are listed in an order that runs them, so the kernel graph is acyclic and
        // every kernel convex).
        let mut expected_inputs = Vec::new();
        for &n in &kernel.nodes {
            for &arg in &dag.nodes[n].args {
                let external = match arg {
                    Value::Input(_) => true,
                    Value::Node(q) => (of[q].is_some() || in_place(q)) && !inside(q),
                };
                if external && !expected_inputs.contains(&arg) {
                    expected_inputs.push(arg);
                }
                if let Value::Node(q) = arg
                    && let Some(kq) = of[q]
                {
                    assert!(kq <= k, "kernel {k} reads a value of the later kernel {kq}");
                    if kq == k {
                        assert_ne!(
                            fusion.role(&dag.nodes[q].op),
                            Role::End,
                            "an End result is consumed inside its kernel"
                        );
                        if fusion.role(&dag.nodes[q].op) == Role::Rows {
                            assert!(
                                partition::row_reduction(dag, q),
                                "a Rows result consumed inside its kernel is a row reduction"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(kernel.inputs, expected_inputs);
        let expected_outputs: Vec<Value> = kernel
            .nodes
            .iter()
            .filter(|&&n| outputs[n] || users[n].iter().any(|&u| !inside(u) && !in_place(u)))
            .map(|&n| Value::Node(n))
            .collect();
        assert_eq!(kernel.outputs, expected_outputs);
        // A view reads memory: its operand is never computed in its kernel, except by a view
        // it extends.
        for &n in &kernel.nodes {
            let node = &dag.nodes[n];
            if kernel.kind == KernelKind::Fused
                && fusion.role(&node.op).is_view(&node.op)
                && let Value::Node(q) = node.args[0]
                && inside(q)
            {
                let producer = &dag.nodes[q].op;
                assert!(
                    fusion.role(producer).is_view(producer),
                    "view {} reads {} computed in its own kernel",
                    node.name,
                    dag.nodes[q].name
                );
            }
        }
        // A library call's absorbed operand ops have their operands' shapes, not its domain.
        let iterated = kernel
            .nodes
            .iter()
            .filter(|_| kernel.kind != KernelKind::Library);
        for &n in iterated {
            let node = &dag.nodes[n];
            let shape = match (node.op.kind(), node.args.first()) {
                (fusebox::rules::OpKind::Reduction, Some(&a)) => dag.ty(a).shape.clone(),
                _ => node.ty.shape.clone(),
            };
            // An operand of a concat read by ranges (and what computes it) iterates over its
            // segment: the domain with the concat's axis cut to the segment's length.
            let has_concat = kernel
                .nodes
                .iter()
                .any(|&m| dag.nodes[m].op.builtin() == Some(fusebox::rules::Builtin::Concat));
            let in_segment = |shape: &[usize]| {
                let domain = &kernel.domain;
                let lead = domain.len().saturating_sub(shape.len());
                has_concat
                    && (lead..domain.len()).any(|d| {
                        let mut cut = domain.clone();
                        cut[d] = shape[d - lead];
                        broadcasts_to(shape, &cut)
                    })
            };
            assert!(
                broadcasts_to(&shape, &kernel.domain) || in_segment(&shape),
                "{} of shape {shape:?} in domain {:?}",
                node.name,
                kernel.domain
            );
        }
        match kernel.kind {
            KernelKind::Fused => {
                if kernel.nodes.len() > 1 {
                    assert!(
                        kernel.inputs.len() + kernel.outputs.len() + kernel.segments.len()
                            <= fusion.max_kernel_args
                    );
                }
                // Literals are never a kernel's nodes, so this counts exactly the ops the
                // budget counts.
                assert!(
                    kernel.nodes.len() <= fusion.max_kernel_ops,
                    "{} ops in a kernel, budget {}",
                    kernel.nodes.len(),
                    fusion.max_kernel_ops
                );
                if kernel.nodes.len() > 1 {
                    let terms: usize = kernel
                        .nodes
                        .iter()
                        .map(|&n| dag.nodes[n].op.body_terms())
                        .sum();
                    assert!(
                        terms <= fusion.max_kernel_terms,
                        "{terms} formula terms in a kernel, budget {}",
                        fusion.max_kernel_terms
                    );
                    for &n in &kernel.nodes {
                        assert!(
                            matches!(
                                fusion.role(&dag.nodes[n].op),
                                Role::Join | Role::End | Role::Rows
                            ),
                            "only Join, End and Rows nodes share a generated kernel"
                        );
                    }
                }
            }
            KernelKind::Alone => assert_eq!(kernel.nodes.len(), 1),
            KernelKind::Library => {
                // One library call and what it absorbed: casts and views, each used only by
                // the kernel's next node towards the call, none written.
                let calls: Vec<usize> = kernel
                    .nodes
                    .iter()
                    .copied()
                    .filter(|&n| fusion.role(&dag.nodes[n].op) == Role::Never)
                    .collect();
                assert_eq!(calls.len(), 1, "one library call per library kernel");
                let parts = partition::LibraryParts::of(dag, &kernel.nodes);
                // The epilogue: pointwise ops over the product's shape, reading the product.
                for &n in &parts.epilogue {
                    assert_eq!(dag.nodes[n].op.kind(), fusebox::rules::OpKind::Pointwise);
                }
                if !parts.epilogue.is_empty() {
                    assert_eq!(kernel.domain, dag.nodes[calls[0]].ty.shape);
                }
                for &n in &parts.operands {
                    let users: Vec<usize> = (0..dag.nodes.len())
                        .filter(|&u| dag.nodes[u].args.contains(&Value::Node(n)))
                        .collect();
                    assert!(users.len() == 1 && kernel.nodes.contains(&users[0]));
                    assert!(!kernel.outputs.contains(&Value::Node(n)));
                }
            }
        }
        // A segment store writes its operand's bytes (of the concat's dtype, which is the
        // operand's).
        let bytes: u64 = kernel
            .inputs
            .iter()
            .chain(&kernel.outputs)
            .copied()
            .chain(kernel.segments.iter().map(|s| Value::Node(s.value)))
            .map(|v| {
                let ty = dag.ty(v);
                ty.shape.iter().product::<usize>() as u64 * ty.dtype.size_bytes() as u64
            })
            .sum();
        assert_eq!(kernel.cost.bytes, bytes);
    }
    assert_eq!(placed, of.iter().flatten().count());
    check_convex(dag, p);
    let total: f64 = p.kernels.iter().map(|k| k.cost.total_us).sum();
    assert_close!(p.cost.total_us, total);
    assert_eq!(
        p.cost.bytes,
        p.kernels.iter().map(|k| k.cost.bytes).sum::<u64>()
    );
}

/// Convexity checked on the dag itself, independently of the kernel order: no path that
/// leaves a kernel through a node outside it comes back into the kernel.
fn check_convex(dag: &Dag, p: &Partition) {
    let users = dag.users();
    let of = p.kernel_of(dag.nodes.len());
    let mut seen = vec![usize::MAX; dag.nodes.len()];
    for (k, kernel) in p.kernels.iter().enumerate() {
        // Every node outside the kernel that a path from inside it reaches.
        let mut stack: Vec<usize> = Vec::new();
        for &n in &kernel.nodes {
            for &u in &users[n] {
                if of[u] != Some(k) && seen[u] != k {
                    seen[u] = k;
                    stack.push(u);
                }
            }
        }
        while let Some(n) = stack.pop() {
            assert_ne!(
                of[n],
                Some(k),
                "a path leaves kernel {k} and comes back through `{}`",
                dag.nodes[n].name
            );
            for &u in &users[n] {
                if seen[u] != k {
                    seen[u] = k;
                    stack.push(u);
                }
            }
        }
    }
}

// ---------------------------------------------------------------- hand-computed costs

const CHAIN: &str = r#"Graph(name: "chain",
    inputs: [Input(name: "x", dtype: "f32", shape: [1000])],
    nodes: [Node(name: "a", op: "neg", args: ["x"]), Node(name: "b", op: "exp", args: ["a"])],
    outputs: ["b"])"#;

#[test]
fn unfused_chain_costs_by_hand() {
    let dag = dag(CHAIN);
    let p = partition::unfused(&dag, &toy());
    assert_eq!(p.kernels.len(), 2);
    // neg: 4000 B read + 4000 B written = 8 us, 1000 flops = 1 us, launch 10 us.
    let a = &p.kernels[0].cost;
    assert_eq!((a.bytes, a.flops), (8000, 1000));
    assert_close!(a.memory_us, 8.0);
    assert_close!(a.compute_us, 1.0);
    assert_close!(a.total_us, 19.0);
    // exp: the same bytes, 8 flops per element.
    assert_close!(p.kernels[1].cost.total_us, 26.0);
    assert_close!(p.cost.total_us, 45.0);
    assert_close!(p.cost.launch_us, 20.0);
    assert_eq!((p.cost.bytes, p.cost.flops), (16000, 9000));
}

#[test]
fn fused_chain_costs_by_hand() {
    let dag = dag(CHAIN);
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    let k = &p.kernels[0];
    assert_eq!(names(&dag, k), ["a", "b"]);
    assert_eq!(k.inputs, [Value::Input(0)]);
    assert_eq!(k.outputs, [Value::Node(1)]);
    assert_eq!(k.domain, [1000]);
    assert_eq!(k.kind, KernelKind::Fused);
    // x read, b written: 8000 B = 8 us; 9000 flops = 9 us; one launch.
    assert_eq!((k.cost.bytes, k.cost.flops), (8000, 9000));
    assert_close!(p.cost.total_us, 27.0);
}

#[test]
fn an_intermediate_graph_output_is_written() {
    let dag = dag(&CHAIN.replace(r#"outputs: ["b"]"#, r#"outputs: ["b", "a"]"#));
    let p = partition::partition(&dag, &FusionRules::defaults(), &toy());
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].outputs, [Value::Node(0), Value::Node(1)]);
    // 12000 B = 12 us + 9 us + 10 us.
    assert_close!(p.cost.total_us, 31.0);
}

#[test]
fn overlap_takes_the_larger_of_memory_and_compute() {
    let mut model = CostModel::defaults();
    model
        .load_str(
            r#"Cost(profiles: {"roof": Profile(bandwidth_gbps: 1.0, launch_us: 10.0,
                pointwise_gflops: 1.0, overlap: 1.0, matmul_gflops: {"f32": 1.0},
                weights: {"neg": 1.0, "exp": 8.0})})"#,
            "roof.ron",
        )
        .unwrap();
    let dag = dag(CHAIN);
    let p = partition::partition(
        &dag,
        &FusionRules::defaults(),
        model.profile("roof").unwrap(),
    );
    // max(8 us memory, 9 us compute) + 10 us.
    assert_close!(p.cost.total_us, 19.0);
    assert_close!(p.cost.memory_us, 8.0);
    assert_close!(p.cost.compute_us, 9.0);
}

#[test]
fn const_is_inlined_never_a_kernel() {
    let dag = dag(r#"Graph(name: "c",
        inputs: [Input(name: "x", dtype: "f32", shape: [1000])],
        nodes: [Node(name: "one", op: "const", attrs: {"value": 1.0}),
                Node(name: "y", op: "add", args: ["x", "one"])],
        outputs: ["y"])"#);
    let fusion = FusionRules::defaults();
    for p in [
        partition::unfused(&dag, &toy()),
        partition::partition(&dag, &fusion, &toy()),
    ] {
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), 1);
        assert_eq!(names(&dag, &p.kernels[0]), ["y"]);
        assert_eq!(p.kernels[0].inputs, [Value::Input(0)]);
        // 8000 B, 1000 flops, one launch: 8 + 1 + 10.
        assert_close!(p.cost.total_us, 19.0);
    }
}

#[test]
fn a_reduction_ends_its_kernel() {
    let dag = dag(r#"Graph(name: "r",
        inputs: [Input(name: "x", dtype: "f32", shape: [100, 10])],
        nodes: [Node(name: "e", op: "exp", args: ["x"]),
                Node(name: "s", op: "sum", args: ["e"], attrs: {"axes": [1]}),
                Node(name: "t", op: "neg", args: ["s"])],
        outputs: ["t"])"#);
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 2);
    let k = &p.kernels[0];
    assert_eq!(names(&dag, k), ["e", "s"]);
    assert_eq!(k.domain, [100, 10]);
    // x read (4000 B) + s written (400 B) = 4.4 us; (8 + 1) flops x 1000 = 9 us; 10 us.
    assert_close!(k.cost.total_us, 23.4);
    // neg over the 100 sums: 800 B, 100 flops, its own launch.
    assert_eq!(names(&dag, &p.kernels[1]), ["t"]);
    assert_close!(p.kernels[1].cost.total_us, 10.9);
    // Unfused: exp 8 + 8 + 10, sum 4.4 + 1 + 10, neg 10.9.
    assert_close!(
        partition::unfused(&dag, &toy()).cost.total_us,
        26.0 + 15.4 + 10.9
    );
}

#[test]
fn matmul_is_a_library_call_at_matmul_throughput() {
    let dag = dag(r#"Graph(name: "m",
        inputs: [Input(name: "a", dtype: "f32", shape: [10, 20]),
                 Input(name: "b", dtype: "f32", shape: [20, 30]),
                 Input(name: "c", dtype: "f32", shape: [30])],
        nodes: [Node(name: "ab", op: "matmul", args: ["a", "b"]),
                Node(name: "y", op: "add", args: ["ab", "c"])],
        outputs: ["y"])"#);
    let fusion = FusionRules::load_str(
        "Fusion(kinds: {Pointwise: Join, Layout: Join, Reduction: Rows, Opaque: Never}, \
         max_kernel_args: 64)",
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 2);
    let mm = &p.kernels[0];
    assert_eq!(mm.kind, KernelKind::Library);
    // 2 * 10 * 30 * 20 = 12000 flops at 2 GFLOP/s = 6 us; (800 + 2400 + 1200) B = 4.4 us.
    assert_eq!(mm.cost.flops, 12000);
    assert_close!(mm.cost.total_us, 10.0 + 4.4 + 6.0);
    assert_eq!(p.kernels[1].kind, KernelKind::Fused);
    // The add apart: (1200 + 120 + 1200) B = 2.52 us, 300 flops at 1 GFLOP/s = 0.3 us.
    assert_close!(p.kernels[1].cost.total_us, 10.0 + 2.52 + 0.3);
    // With epilogues (the default rules), the add runs on the product's tiles: one launch,
    // the product neither written nor read, (800 + 2400 + 120 + 1200) B = 4.52 us, the add's
    // 300 flops at the pointwise rate beside the product's at the matrix rate.
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].kind, KernelKind::Library);
    assert_eq!(p.kernels[0].cost.flops, 12300);
    assert_close!(p.kernels[0].cost.total_us, 10.0 + 4.52 + 6.0 + 0.3);
}

/// PyTorch's `Linear` as both exporters write it: `x @ transpose(W)`, W stored `[out, in]`.
/// The call reads W through transposed strides (`library_views`), under AMP through its cast
/// too: no kernel copies or converts the weight. Without `library_views`, the transpose is a
/// copy kernel of its own.
#[test]
fn a_linear_reads_its_weight_transposed_without_a_copy() {
    let text = |dtype: &str| {
        format!(
            r#"Graph(name: "linear",
            inputs: [Input(name: "x", dtype: "{dtype}", shape: [64, 256]),
                     Input(name: "w", dtype: "f32", shape: [512, 256])],
            nodes: [Node(name: "wc", op: "cast", args: ["w"], attrs: {{"dtype": "{dtype}"}}),
                    Node(name: "wt", op: "transpose", args: ["wc"], attrs: {{"perm": [1, 0]}}),
                    Node(name: "y", op: "matmul", args: ["x", "wt"])],
            outputs: ["y"])"#
        )
    };
    let fusion = FusionRules::defaults();
    for dtype in ["f32", "f16"] {
        let dag = dag(&text(dtype));
        let p = partition::partition(&dag, &fusion, &profile("cpu"));
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), 1, "{dtype}");
        assert_eq!(p.kernels[0].kind, KernelKind::Library);
        assert_eq!(names(&dag, &p.kernels[0]), ["wc", "wt", "y"]);
        assert_eq!(p.kernels[0].inputs.len(), 2);
    }
    let no_views = FusionRules::load_str(
        "Fusion(kinds: {Pointwise: Join, Layout: Join, Reduction: Rows, Opaque: Never}, \
         max_kernel_args: 64, library_casts: true)",
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap();
    let dag = dag(&text("f32"));
    let p = partition::partition(&dag, &no_views, &profile("cpu"));
    check_invariants(&dag, &p, &no_views);
    assert_eq!(names(&dag, kernel_with(&dag, &p, "wt")), ["wt"]);
    assert_eq!(names(&dag, kernel_with(&dag, &p, "y")), ["y"]);
}

/// A `Linear` with its bias and GELU, then a residual add: the bias add and the GELU read
/// only the product, so they run as the call's epilogue (one library kernel, the product never
/// written); the same without `library_epilogues` is two kernels. A product that a second
/// kernel also reads, or a product of a vector, takes no epilogue.
#[test]
fn a_linear_runs_its_bias_and_activation_as_the_gemm_epilogue() {
    let text = r#"Graph(name: "linear",
        inputs: [Input(name: "x", dtype: "f32", shape: [64, 256]),
                 Input(name: "w", dtype: "f32", shape: [512, 256]),
                 Input(name: "b", dtype: "f32", shape: [512]),
                 Input(name: "r", dtype: "f32", shape: [64, 512])],
        nodes: [Node(name: "wt", op: "transpose", args: ["w"], attrs: {"perm": [1, 0]}),
                Node(name: "y", op: "matmul", args: ["x", "wt"]),
                Node(name: "yb", op: "add", args: ["y", "b"]),
                Node(name: "g", op: "gelu", args: ["yb"]),
                Node(name: "o", op: "add", args: ["g", "r"])],
        outputs: ["o"])"#;
    let fusion = FusionRules::defaults();
    let d = dag(text);
    let p = partition::partition(&d, &fusion, &profile("cpu"));
    check_invariants(&d, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].kind, KernelKind::Library);
    assert_eq!(names(&d, &p.kernels[0]), ["wt", "y", "yb", "g", "o"]);
    assert_eq!(p.kernels[0].outputs, [Value::Node(node(&d, "o"))]);
    let parts = partition::LibraryParts::of(&d, &p.kernels[0].nodes);
    assert_eq!(parts.epilogue.len(), 3);
    // The merge is priced as one kernel: cheaper than the two apart by the product's write
    // and read (64 × 512 f32 twice) and a launch.
    let no_epilogues = FusionRules::load_str(
        "Fusion(kinds: {Pointwise: Join, Layout: Join, Reduction: Rows, Opaque: Never}, \
         max_kernel_args: 64, library_casts: true, library_views: true)",
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap();
    let apart = partition::partition(&d, &no_epilogues, &profile("cpu"));
    check_invariants(&d, &apart, &no_epilogues);
    assert_eq!(apart.kernels.len(), 2);
    assert!(p.cost.total_us < apart.cost.total_us);
    assert_eq!(apart.cost.bytes - p.cost.bytes, 2 * 64 * 512 * 4);
    // The product read by two kernels (here also a graph output): no epilogue.
    let shared = dag(&text.replace(r#"outputs: ["o"]"#, r#"outputs: ["o", "y"]"#));
    let p = partition::partition(&shared, &fusion, &profile("cpu"));
    check_invariants(&shared, &p, &fusion);
    assert_eq!(names(&shared, kernel_with(&shared, &p, "y")), ["wt", "y"]);
    // A vector times a matrix: no tile of rows and columns to run an epilogue on.
    let vector = dag(&text
        .replace("[64, 256]", "[256]")
        .replace("[64, 512]", "[512]"));
    let p = partition::partition(&vector, &fusion, &profile("cpu"));
    check_invariants(&vector, &p, &fusion);
    assert_eq!(names(&vector, kernel_with(&vector, &p, "y")), ["wt", "y"]);
}

// ---------------------------------------------------------------- the LSTM examples

#[test]
fn lstm_cell_is_one_kernel() {
    let dag = example("lstm_cell");
    let fusion = FusionRules::defaults();
    for name in ["cpu", "h200"] {
        let p = partition::partition(&dag, &fusion, &profile(name));
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), 1, "{name}");
        let k = &p.kernels[0];
        assert_eq!(k.nodes.len(), 9);
        assert_eq!(k.inputs.len(), 5);
        assert_eq!(k.outputs.len(), 2);
        // 5 inputs read + 2 outputs written, 16 MiB each (the example's own comment).
        assert_eq!(p.cost.bytes, 117_440_512);
        // One op per kernel moves 352 MiB.
        assert_eq!(
            partition::unfused(&dag, &profile(name)).cost.bytes,
            352 << 20
        );
    }
    // cpu: 3 sigmoids (neg 1 + exp 20 + add 1 + div 7 = 29), 2 tanh (27), 3 mul and 1 add:
    // 145 flops per element x 4,194,304 elements at 125 GFLOP/s = 4865.4 us, more than the
    // 117,440,512 B / 31 GB/s = 3788.4 us of memory; roofline, plus a 2 us launch.
    let p = partition::partition(&dag, &fusion, &profile("cpu"));
    assert_eq!(p.cost.flops, 145 * 4_194_304);
    assert_close!(p.cost.total_us, 2.0 + 145.0 * 4_194_304.0 / 125e3);
    // h200: sigmoid 1 + 10 + 1 + 10 = 22, tanh 16: 102 flops per element, 6.4 us at
    // 67 TFLOP/s, under the 27.3 us of memory at 4.3 TB/s; plus a 1 us launch.
    let p = partition::partition(&dag, &fusion, &profile("h200"));
    assert_eq!(p.cost.flops, 102 * 4_194_304);
    assert_close!(p.cost.total_us, 1.0 + 117_440_512.0 / 4.3e6);
}

/// The seed's FusedConcat: lstm_cell_backward as given (grad_gates, grad_cx and grad_bias
/// out) is the gate kernel storing the four gate gradients into their segments of grad_gates,
/// and the column sums reading grad_gates; no buffer is written for the gate gradients
/// themselves and no copy of them is made: 17 MiB, where a range select in the column sums'
/// kernel moved 21.
#[test]
fn lstm_cell_backward_writes_grad_gates_in_place() {
    let dag = example("lstm_cell_backward");
    let fusion = FusionRules::defaults();
    let grad_gates = node(&dag, "grad_gates");
    for name in ["cpu", "h200"] {
        let p = partition::partition(&dag, &fusion, &profile(name));
        check_invariants(&dag, &p, &fusion);
        let kinds: Vec<KernelKind> = p.kernels.iter().map(|k| k.kind).collect();
        assert_eq!(kinds, [KernelKind::Fused, KernelKind::Fused], "{name}");
        assert_eq!(p.in_place, [grad_gates], "{name}");
        let gates = &p.kernels[0];
        assert_eq!(
            gates.nodes.len(),
            23,
            "every node but const, concat and sum_to_size"
        );
        assert_eq!(gates.inputs.len(), 8);
        assert_eq!(gates.outputs, [Value::Node(node(&dag, "grad_cx"))]);
        let segments: Vec<(String, usize, usize)> = gates
            .segments
            .iter()
            .map(|s| (dag.nodes[s.value].name.clone(), s.axis, s.start))
            .collect();
        assert_eq!(
            segments,
            [
                ("grad_ingate".to_string(), 1, 0),
                ("grad_forgetgate".to_string(), 1, 1024),
                ("grad_cellgate".to_string(), 1, 2048),
                ("grad_outgate".to_string(), 1, 3072),
            ]
        );
        assert_eq!(names(&dag, &p.kernels[1]), ["grad_bias"]);
        assert_eq!(p.kernels[1].inputs, [Value::Node(grad_gates)]);
        let mib = 1u64 << 20;
        assert_eq!(gates.cost.bytes, 13 * mib);
        assert_eq!(p.cost.bytes, 17 * mib + 16 * 1024);
    }
}

/// lstm_cell_backward after sum_to_size hoisting. On the CPU the four column sums end the
/// pointwise kernel (one multi-output kernel over [256, 1024]), which writes grad_gates and
/// grad_bias in place: the sums' accumulators store into grad_bias's segments, so no copy is
/// left. On the H200 profile the sums over [256, 1024] reduce a quarter of the columns of the
/// sum over grad_gates, with a quarter of the threads ([`Reductions`]), and three launches
/// each: the form is priced above the one without hoisting, as it measured (0.036 ms against
/// 0.014-0.020 ms; see the book).
///
/// [`Reductions`]: fusebox::rules::Reductions
#[test]
fn hoisted_column_sums_end_the_pointwise_kernel() {
    let text = std::fs::read_to_string(format!(
        "{}/examples/lstm_cell_backward.ron",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let hoisted = text
        .replace(
            r#"Node(name: "grad_bias", op: "sum_to_size", args: ["grad_gates"], attrs: {"shape": [4096]}),"#,
            r#"Node(name: "bi", op: "sum_to_size", args: ["grad_ingate"], attrs: {"shape": [1024]}),
        Node(name: "bf", op: "sum_to_size", args: ["grad_forgetgate"], attrs: {"shape": [1024]}),
        Node(name: "bc", op: "sum_to_size", args: ["grad_cellgate"], attrs: {"shape": [1024]}),
        Node(name: "bo", op: "sum_to_size", args: ["grad_outgate"], attrs: {"shape": [1024]}),
        Node(name: "grad_bias", op: "concat", args: ["bi", "bf", "bc", "bo"], attrs: {"axis": 0}),"#,
        );
    assert_ne!(hoisted, text);
    let dag = dag(&hoisted);
    let fusion = FusionRules::defaults();
    for name in ["cpu", "h200"] {
        let p = partition::partition(&dag, &fusion, &profile(name));
        check_invariants(&dag, &p, &fusion);
        let before = partition::partition(&example("lstm_cell_backward"), &fusion, &profile(name));
        if name == "h200" {
            assert!(p.cost.total_us > before.cost.total_us, "{name}");
            continue;
        }
        assert_eq!(p.kernels.len(), 1, "{name}");
        let main = &p.kernels[0];
        assert_eq!(main.nodes.len(), 27);
        assert_eq!(main.domain, [256, 1024]);
        assert_eq!(main.outputs, [Value::Node(node(&dag, "grad_cx"))]);
        let into = |concat: &str| -> Vec<(usize, usize)> {
            let c = node(&dag, concat);
            main.segments
                .iter()
                .filter(|s| s.concat == c)
                .map(|s| (s.value, s.start))
                .collect()
        };
        assert_eq!(into("grad_gates").len(), 4, "the gate gradients");
        let sums = into("grad_bias");
        assert_eq!(
            sums,
            ["bi", "bf", "bc", "bo"]
                .iter()
                .zip([0, 1024, 2048, 3072])
                .map(|(n, start)| (node(&dag, n), start))
                .collect::<Vec<_>>(),
            "the column sums, into grad_bias"
        );
        assert_eq!(
            p.in_place,
            [node(&dag, "grad_gates"), node(&dag, "grad_bias")]
        );
        // The compulsory traffic: 8 MiB of inputs, grad_cx, grad_gates, 16 KiB of grad_bias.
        assert_eq!(p.cost.bytes, 13 * (1u64 << 20) + 16 * 1024);
        assert!(p.cost.total_us < before.cost.total_us, "{name}");
    }
}

/// A concat copied on its own runs one launch per operand (`lower::layout` copies each into
/// its segment, an empty one too), and is priced so, unfused and fused alike: on a GPU the
/// launches of a few small pieces outweigh their bytes.
#[test]
fn a_concat_copy_pays_one_launch_per_operand() {
    let dag = dag(r#"Graph(name: "cat",
        inputs: [Input(name: "a", dtype: "f32", shape: [4]),
                 Input(name: "b", dtype: "f32", shape: [4]),
                 Input(name: "c", dtype: "f32", shape: [0])],
        nodes: [Node(name: "y", op: "concat", args: ["a", "b", "c"], attrs: {"axis": 0})],
        outputs: ["y"])"#);
    let fusion = FusionRules::defaults();
    for profile in [toy(), profile("h200"), profile("cpu")] {
        let unfused = partition::unfused(&dag, &profile);
        let fused = partition::partition(&dag, &fusion, &profile);
        check_invariants(&dag, &fused, &fusion);
        for p in [&unfused, &fused] {
            assert_eq!(p.kernels.len(), 1);
            assert_eq!(p.kernels[0].kind, KernelKind::Alone);
            assert_close!(p.cost.launch_us, 3.0 * profile.launch_us);
        }
        assert_close!(fused.cost.total_us, unfused.cost.total_us);
    }
}

// ---------------------------------------------------------------- the cost model decides

/// `p` of shape [1, 100] feeds `c = p + x` over [100, 100]. Fusing them is legal, but inside
/// c's kernel p is recomputed for each of the 10,000 elements.
fn broadcast_producer(op: &str) -> Dag {
    dag(&format!(
        r#"Graph(name: "bcast",
        inputs: [Input(name: "s", dtype: "f32", shape: [1, 100]),
                 Input(name: "x", dtype: "f32", shape: [100, 100])],
        nodes: [Node(name: "p", op: "{op}", args: ["s"]),
                Node(name: "c", op: "add", args: ["p", "x"])],
        outputs: ["c"])"#
    ))
}

#[test]
fn expensive_broadcast_producer_is_materialized() {
    let dag = broadcast_producer("exp");
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    // Apart: exp reads and writes 400 B (0.8 us), 800 flops (0.8 us), launch: 11.6 us; the add
    // reads 400 + 40000 B and writes 40000 B (80.4 us), 10000 flops (10 us), launch: 100.4 us.
    // Together 112 us. Fused: 80.4 us of memory, (8 + 1) x 10000 flops = 90 us, one launch:
    // 180.4 us. The fusion is legal and rejected.
    assert_eq!(p.kernels.len(), 2);
    assert_close!(p.cost.total_us, 112.0);
    assert_eq!(p.kernels[1].inputs, [Value::Node(0), Value::Input(1)]);
}

#[test]
fn cheap_broadcast_producer_is_fused() {
    let dag = broadcast_producer("neg");
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    // Apart: 0.8 + 0.1 + 10 = 10.9 us and 100.4 us, 111.3 us. Fused: 80.4 us of memory,
    // (1 + 1) x 10000 flops = 20 us, one launch: 110.4 us.
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].domain, [100, 100]);
    assert_eq!(
        p.kernels[0].cost.flops, 20000,
        "neg recomputed per domain element"
    );
    assert_close!(p.cost.total_us, 110.4);
}

/// The same decision on the h200 profile: a chain of `sin` (20 flop-equivalents each) over a
/// [1, 4096] row feeds an add over [4096, 4096] f32, whose kernel moves 128 MiB: 31.2 us at
/// 4.3 TB/s. Recomputing k sins per element costs (20k + 1) x 16.8M flops at 67 TFLOP/s:
/// 20.3 us for k = 4 (hidden under the memory time, so fusing saves a launch) and 40.3 us for
/// k = 8 (more than the 32.2 us the add costs on its own, so the row is materialized).
#[test]
fn on_h200_recomputation_decides_between_four_and_eight_sins() {
    let h200 = profile("h200");
    let fusion = FusionRules::defaults();
    for (sins, kernels) in [(4, 1), (8, 2)] {
        let mut b = GraphBuilder::new("sins");
        let mut v = b.input("s", DType::F32, &[1, 4096]);
        let x = b.input("x", DType::F32, &[4096, 4096]);
        for i in 0..sins {
            v = b.op(&format!("q{i}"), "sin", &[&v]);
        }
        let c = b.op("c", "add", &[&v, &x]);
        let graph = b.finish(&[&c]);
        let dag = Dag::from_graph(&graph, &Catalogue::defaults()).unwrap();
        let p = partition::partition(&dag, &fusion, &h200);
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), kernels, "{sins} sins");
        let add = kernel_with(&dag, &p, "c");
        let add_alone = 1.0 + (4 * 4096 + 2 * 4096 * 4096 * 4) as f64 / 4.3e6;
        if kernels == 2 {
            assert_eq!(add.nodes.len(), 1);
            assert_close!(add.cost.total_us, add_alone);
        } else {
            assert_eq!(add.cost.flops, 81 * 4096 * 4096);
            assert_close!(add.cost.total_us, add_alone);
        }
    }
}

// ---------------------------------------------------------------- legality

/// Rules under which layout ops are copies of their own (`Layout: Alone`): the convexity tests
/// below need an op that nothing joins between two fusable ones.
fn layout_alone() -> FusionRules {
    FusionRules::load_str(
        "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}, max_kernel_args: 64)",
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap()
}

/// `c = a + transpose(a)` under the default rules: the transpose is a view of a's buffer, so
/// it cannot join a's kernel, but c joins it: two kernels, and c reads a both directly and
/// transposed.
#[test]
fn a_view_never_joins_the_kernel_computing_its_operand() {
    let dag = dag(r#"Graph(name: "diamond",
        inputs: [Input(name: "x", dtype: "f32", shape: [64, 64])],
        nodes: [Node(name: "a", op: "exp", args: ["x"]),
                Node(name: "t", op: "transpose", args: ["a"]),
                Node(name: "u", op: "transpose", args: ["t"]),
                Node(name: "c", op: "add", args: ["a", "t"]),
                Node(name: "d", op: "mul", args: ["c", "u"])],
        outputs: ["d"])"#);
    let fusion = FusionRules::defaults();
    for p in [
        partition::partition(&dag, &fusion, &toy()),
        partition::partition(&dag, &fusion, &profile("h200")),
    ] {
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), 2);
        assert_eq!(names(&dag, &p.kernels[0]), ["a"]);
        // u extends the view t in the same kernel: one view of a, transposed twice.
        assert_eq!(names(&dag, &p.kernels[1]), ["t", "u", "c", "d"]);
        assert_eq!(p.kernels[1].inputs, [Value::Node(0)]);
    }
}

/// `c = a + transpose(a)` with layout ops as copies: a's kernel feeds the transpose copy,
/// which feeds c. Putting c into a's kernel would leave the kernel and come back; c stays apart.
#[test]
fn a_diamond_through_an_alone_op_does_not_fuse_around_it() {
    let dag = dag(r#"Graph(name: "diamond",
        inputs: [Input(name: "x", dtype: "f32", shape: [64, 64])],
        nodes: [Node(name: "a", op: "exp", args: ["x"]),
                Node(name: "t", op: "transpose", args: ["a"]),
                Node(name: "c", op: "add", args: ["a", "t"])],
        outputs: ["c"])"#);
    let fusion = layout_alone();
    for p in [
        partition::partition(&dag, &fusion, &toy()),
        partition::partition(&dag, &fusion, &profile("h200")),
    ] {
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), 3);
        assert_eq!(names(&dag, &p.kernels[0]), ["a"]);
        assert_eq!(names(&dag, &p.kernels[1]), ["t"]);
        assert_eq!(names(&dag, &p.kernels[2]), ["c"]);
    }
}

/// `c = a + neg(transpose(a))`: c cannot join a's kernel (the path a → t → b → c leaves it),
/// nor both kernels; it can join b's.
#[test]
fn convexity_picks_the_legal_producer() {
    let dag = dag(r#"Graph(name: "diamond2",
        inputs: [Input(name: "x", dtype: "f32", shape: [64, 64])],
        nodes: [Node(name: "a", op: "exp", args: ["x"]),
                Node(name: "t", op: "transpose", args: ["a"]),
                Node(name: "b", op: "neg", args: ["t"]),
                Node(name: "c", op: "add", args: ["a", "b"])],
        outputs: ["c"])"#);
    let fusion = layout_alone();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 3);
    assert_eq!(names(&dag, kernel_with(&dag, &p, "c")), ["b", "c"]);
}

/// A diamond of pointwise ops fuses whole, and a value used twice inside is read once.
#[test]
fn a_pointwise_diamond_fuses() {
    let dag = dag(r#"Graph(name: "d",
        inputs: [Input(name: "x", dtype: "f32", shape: [1000])],
        nodes: [Node(name: "a", op: "exp", args: ["x"]),
                Node(name: "b", op: "neg", args: ["a"]),
                Node(name: "c", op: "mul", args: ["a", "b"]),
                Node(name: "d", op: "add", args: ["c", "x"])],
        outputs: ["d"])"#);
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    // x read once, d written: 8 us; (8 + 1 + 1 + 1) x 1000 flops = 11 us; 10 us.
    assert_close!(p.cost.total_us, 29.0);
}

#[test]
fn the_argument_budget_is_respected() {
    let fusion = FusionRules::load_str(
        "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}, max_kernel_args: 4)",
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap();
    // a1 = x0 + x1, a2 = a1 + x2, ..., a9 = a8 + x9.
    let mut b = GraphBuilder::new("sum10");
    let xs: Vec<String> = (0..10)
        .map(|i| b.input(&format!("x{i}"), DType::F32, &[100]))
        .collect();
    let mut acc = xs[0].clone();
    for (i, x) in xs.iter().enumerate().skip(1) {
        acc = b.op(&format!("a{i}"), "add", &[&acc, x]);
    }
    let dag = Dag::from_graph(&b.finish(&[&acc]), &Catalogue::defaults()).unwrap();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    // {a1, a2} reads x0, x1, x2 and writes a2: 4 arguments. a3 would make 5, so it starts a
    // kernel reading a2 and x3, which a4 joins; and so on.
    let groups: Vec<Vec<String>> = p.kernels.iter().map(|k| names(&dag, k)).collect();
    assert_eq!(
        groups,
        [
            vec!["a1", "a2"],
            vec!["a3", "a4"],
            vec!["a5", "a6"],
            vec!["a7", "a8"],
            vec!["a9"]
        ]
    );
    for k in &p.kernels {
        assert!(k.inputs.len() + k.outputs.len() <= 4);
    }
    // The default budget of 64 takes all nine.
    let p = partition::partition(&dag, &FusionRules::defaults(), &toy());
    assert_eq!(p.kernels.len(), 1);
}

/// A chain `a1 = neg(x)`, `a2 = neg(a1)`, ..., `aN` over [1000] under a budget of k ops, with
/// a literal in the middle of the chain (`a_m = a_{m-1} + one`) that the budget does not count.
fn neg_chain(length: usize) -> Dag {
    let mut b = GraphBuilder::new("chain");
    let mut v = b.input("x", DType::F32, &[1000]);
    let one = b.constant("one", 1.0, DType::F32);
    for i in 1..=length {
        v = if i == length / 2 {
            b.op(&format!("a{i}"), "add", &[&v, &one])
        } else {
            b.op(&format!("a{i}"), "neg", &[&v])
        };
    }
    Dag::from_graph(&b.finish(&[&v]), &Catalogue::defaults()).unwrap()
}

/// Fusion rules with the default roles and the given budgets.
fn with_budgets(max_kernel_args: usize, max_kernel_ops: usize) -> FusionRules {
    FusionRules::load_str(
        &format!(
            "Fusion(kinds: {{Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}}, \
             max_kernel_args: {max_kernel_args}, max_kernel_ops: {max_kernel_ops})"
        ),
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap()
}

/// The body budget counts formula terms, not ops: `neg` (`-x`) has 2 terms, so under
/// `max_kernel_terms: 6` a chain of 12 negs is cut into 4 kernels of 3, though the op budget
/// would allow all 12 in one; with room for 24 terms they are one kernel.
#[test]
fn the_body_budget_cuts_a_chain_by_formula_terms() {
    let mut b = GraphBuilder::new("negs");
    let mut v = b.input("x", DType::F32, &[1000]);
    for i in 0..12 {
        v = b.op(&format!("n{i}"), "neg", &[&v]);
    }
    let dag = Dag::from_graph(&b.finish(&[&v]), &Catalogue::defaults()).unwrap();
    assert_eq!(dag.nodes[0].op.body_terms(), 2);
    for (budget, kernels) in [(6, 4), (7, 4), (8, 3), (24, 1)] {
        let fusion = FusionRules::load_str(
            &format!(
                "Fusion(kinds: {{Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}}, \
                 max_kernel_args: 64, max_kernel_terms: {budget})"
            ),
            "f.ron",
            &Catalogue::defaults(),
        )
        .unwrap();
        let p = partition::partition(&dag, &fusion, &toy());
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), kernels, "budget {budget}");
    }
}

/// A chain of N single-flop ops under a budget of k ops is cut into ceil(N / k) kernels of
/// consecutive ops, each full but the last: every join is cheaper than a new kernel, until the
/// kernel is full.
#[test]
fn the_op_budget_cuts_a_chain_into_full_kernels() {
    for (length, k) in [
        (10, 3),
        (9, 3),
        (7, 1),
        (7, 7),
        (7, 100),
        (20, 6),
        (300, 128),
    ] {
        let dag = neg_chain(length);
        let literals = dag
            .nodes
            .iter()
            .filter(|n| partition::is_literal(n))
            .count();
        assert_eq!((dag.nodes.len(), literals), (length + 1, 1));
        let fusion = with_budgets(64, k);
        let p = partition::partition(&dag, &fusion, &toy());
        check_invariants(&dag, &p, &fusion);
        let kernels = length.div_ceil(k);
        assert_eq!(p.kernels.len(), kernels, "{length} ops, budget {k}");
        let groups: Vec<Vec<String>> = p.kernels.iter().map(|kernel| names(&dag, kernel)).collect();
        let expected: Vec<Vec<String>> = (1..=length)
            .map(|i| format!("a{i}"))
            .collect::<Vec<_>>()
            .chunks(k)
            .map(<[String]>::to_vec)
            .collect();
        assert_eq!(groups, expected, "{length} ops, budget {k}");
        // Each kernel reads 4000 B and writes 4000 B (8 us), does one flop per element per
        // op (1000 flops = 1 us per op), and launches (10 us).
        for (kernel, ops) in p.kernels.iter().zip(&expected) {
            assert!(kernel.nodes.len() <= k);
            assert_eq!(kernel.inputs.len() + kernel.outputs.len(), 2);
            assert_close!(kernel.cost.total_us, 18.0 + ops.len() as f64);
        }
        assert_close!(p.cost.total_us, 18.0 * kernels as f64 + length as f64);
    }
    // The default budget of 128 leaves a 300-op chain in three kernels on the real profiles.
    let dag = neg_chain(300);
    let fusion = FusionRules::defaults();
    for name in ["cpu", "h200"] {
        let p = partition::partition(&dag, &fusion, &profile(name));
        check_invariants(&dag, &p, &fusion);
        let sizes: Vec<usize> = p.kernels.iter().map(|k| k.nodes.len()).collect();
        assert_eq!(sizes, [128, 128, 44], "{name}");
    }
}

/// `c = a2 + b2` over two chains of two ops: with a budget of 4, c can join one producer kernel
/// but not both (5 ops); it joins the first operand's, which then runs after the other.
#[test]
fn the_op_budget_limits_joining_several_producers() {
    let dag = dag(r#"Graph(name: "two",
        inputs: [Input(name: "x", dtype: "f32", shape: [1000]),
                 Input(name: "y", dtype: "f32", shape: [1000])],
        nodes: [Node(name: "a1", op: "neg", args: ["x"]), Node(name: "a2", op: "neg", args: ["a1"]),
                Node(name: "b1", op: "neg", args: ["y"]), Node(name: "b2", op: "neg", args: ["b1"]),
                Node(name: "c", op: "add", args: ["a2", "b2"])],
        outputs: ["c"])"#);
    let fusion = with_budgets(64, 4);
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    let groups: Vec<Vec<String>> = p.kernels.iter().map(|k| names(&dag, k)).collect();
    assert_eq!(groups, [vec!["b1", "b2"], vec!["a1", "a2", "c"]]);
    // {b1, b2}: y read, b2 written (8 us), 2000 flops, a launch: 20 us. {a1, a2, c}: x and b2
    // read, c written (12 us), 3000 flops, a launch: 25 us.
    assert_close!(p.kernels[0].cost.total_us, 20.0);
    assert_close!(p.kernels[1].cost.total_us, 25.0);
    // A budget of 5 takes all five: x and y read, c written, 5000 flops, one launch.
    let fusion = with_budgets(64, 5);
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    assert_close!(p.cost.total_us, 12.0 + 5.0 + 10.0);
}

/// `max_kernel_ops: 1` turns fusion off: the partition is the unfused baseline.
#[test]
fn an_op_budget_of_one_is_the_unfused_baseline() {
    let fusion = with_budgets(64, 1);
    for name in ["lstm_cell", "lstm_cell_backward"] {
        let dag = example(name);
        let p = partition::partition(&dag, &fusion, &toy());
        check_invariants(&dag, &p, &fusion);
        let before = partition::unfused(&dag, &toy());
        assert_eq!(p.kernels.len(), before.kernels.len(), "{name}");
        assert!(p.kernels.iter().all(|k| k.nodes.len() == 1));
        assert_close!(p.cost.total_us, before.cost.total_us);
    }
}

#[test]
fn user_roles_change_the_kernels() {
    let dag = dag(CHAIN);
    let ops = Catalogue::defaults();
    let fusion = FusionRules::load_str(
        r#"Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never},
                  ops: {"exp": Alone}, max_kernel_args: 64)"#,
        "f.ron",
        &ops,
    )
    .unwrap();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 2);
    assert_eq!(p.kernels[1].kind, KernelKind::Alone);
    assert_close!(p.cost.total_us, 45.0);
}

// ---------------------------------------------------------------- sibling fusion

/// The default rules with sibling fusion off: producer-consumer fusion only.
fn without_siblings() -> FusionRules {
    let mut fusion = FusionRules::defaults();
    fusion.siblings = false;
    fusion
}

/// Fusion rules with the default roles and the given budget.
fn with_budget(max_kernel_args: usize) -> FusionRules {
    FusionRules::load_str(
        &format!(
            "Fusion(kinds: {{Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}}, max_kernel_args: {max_kernel_args})"
        ),
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap()
}

/// `a = x / x` and `b = exp(x)`: no edge between them, one input in common.
const SIBLINGS: &str = r#"Graph(name: "siblings",
    inputs: [Input(name: "x", dtype: "f32", shape: [1000])],
    nodes: [Node(name: "a", op: "div", args: ["x", "x"]), Node(name: "b", op: "exp", args: ["x"])],
    outputs: ["a", "b"])"#;

#[test]
fn siblings_over_one_input_fuse_and_read_it_once() {
    let dag = dag(SIBLINGS);
    let fusion = FusionRules::defaults();
    assert!(fusion.siblings, "on by default");
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    let k = &p.kernels[0];
    assert_eq!(names(&dag, k), ["a", "b"]);
    assert_eq!(k.kind, KernelKind::Fused);
    assert_eq!(k.inputs, [Value::Input(0)], "x read once");
    assert_eq!(k.outputs, [Value::Node(0), Value::Node(1)]);
    // x read, a and b written: 12000 B = 12 us; (4 + 8) x 1000 flops = 12 us; one launch.
    assert_eq!((k.cost.bytes, k.cost.flops), (12000, 12000));
    assert_close!(p.cost.total_us, 34.0);
    // Apart (and unfused): a 8 + 4 + 10 = 22 us, b 8 + 8 + 10 = 26 us.
    assert_close!(partition::unfused(&dag, &toy()).cost.total_us, 48.0);
}

#[test]
fn turning_siblings_off_restores_producer_consumer_fusion_only() {
    let fusion = without_siblings();
    let dag = dag(SIBLINGS);
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 2);
    assert_close!(p.cost.total_us, 22.0 + 26.0);
    // The same rules from the shipped fusion.ron with its `siblings` line switched off.
    let shipped = include_str!("../rules/fusion.ron");
    let off = shipped.replace("siblings: true,", "siblings: false,");
    assert_ne!(off, shipped);
    let from_file = FusionRules::load_str(&off, "fusion.ron", &Catalogue::defaults()).unwrap();
    assert_eq!(from_file, fusion);
    // Two independent chains stay two kernels.
    let dag = independent_chains();
    let p = partition::partition(&dag, &fusion, &toy());
    assert_eq!(p.kernels.len(), 2);
    assert_close!(p.cost.total_us, 27.0 + 27.0);
}

/// `b = neg(exp(x))` and `d = neg(exp(y))`: nothing in common but the shape.
fn independent_chains() -> Dag {
    dag(r#"Graph(name: "chains",
        inputs: [Input(name: "x", dtype: "f32", shape: [1000]),
                 Input(name: "y", dtype: "f32", shape: [1000])],
        nodes: [Node(name: "a", op: "exp", args: ["x"]), Node(name: "b", op: "neg", args: ["a"]),
                Node(name: "c", op: "exp", args: ["y"]), Node(name: "d", op: "neg", args: ["c"])],
        outputs: ["b", "d"])"#)
}

#[test]
fn independent_chains_over_one_domain_share_a_launch() {
    let dag = independent_chains();
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    let k = &p.kernels[0];
    assert_eq!(names(&dag, k), ["a", "b", "c", "d"]);
    assert_eq!(k.inputs, [Value::Input(0), Value::Input(1)]);
    assert_eq!(k.outputs, [Value::Node(1), Value::Node(3)]);
    // Apart, each chain: 8000 B = 8 us, 9000 flops = 9 us, 10 us: 27 us. Together the same
    // bytes and flops (16 + 18 us) and one launch: 44 us.
    assert_close!(p.cost.total_us, 44.0);
}

/// `a = exp(x)`, `t = transpose(a)`, `b = x + t`: a and b share x, but merging them would put
/// the transpose copy both after and before the merged kernel.
#[test]
fn siblings_joined_through_an_alone_op_stay_apart() {
    let dag = dag(r#"Graph(name: "cycle",
        inputs: [Input(name: "x", dtype: "f32", shape: [64, 64])],
        nodes: [Node(name: "a", op: "exp", args: ["x"]),
                Node(name: "t", op: "transpose", args: ["a"]),
                Node(name: "b", op: "add", args: ["x", "t"])],
        outputs: ["b"])"#);
    let fusion = layout_alone();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    let groups: Vec<Vec<String>> = p.kernels.iter().map(|k| names(&dag, k)).collect();
    assert_eq!(groups, [vec!["a"], vec!["t"], vec!["b"]]);
    // x is 16384 B. a: 32768 B = 32.768 us + 4096 x 8 flops = 32.768 us + 10 us. t: 32768 B,
    // no arithmetic, 10 us. b: x and t read, b written: 49.152 us + 4.096 us + 10 us.
    assert_close!(
        p.cost.total_us,
        (32.768 + 32.768 + 10.0) + (32.768 + 10.0) + (49.152 + 4.096 + 10.0)
    );
    assert_close!(
        p.cost.total_us,
        partition::unfused(&dag, &toy()).cost.total_us
    );
    // The same through two copies, on the h200 profile: still three fused kernels' worth of
    // separation (a, the copies, b).
    let dag = self::dag(
        r#"Graph(name: "cycle2",
        inputs: [Input(name: "x", dtype: "f32", shape: [64, 64])],
        nodes: [Node(name: "a", op: "exp", args: ["x"]),
                Node(name: "t", op: "transpose", args: ["a"]),
                Node(name: "u", op: "transpose", args: ["t"]),
                Node(name: "b", op: "add", args: ["x", "u"])],
        outputs: ["b"])"#,
    );
    let p = partition::partition(&dag, &fusion, &profile("h200"));
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 4);
}

/// A kernel ending in a reduction keeps its domain. Its sibling over the same domain joins it;
/// a sibling over a larger domain (which the reduction's kernel would have to grow to) does
/// not, although all three read x.
#[test]
fn a_reduction_kernel_takes_siblings_only_over_its_own_domain() {
    let dag = dag(r#"Graph(name: "rs",
        inputs: [Input(name: "x", dtype: "f32", shape: [100, 10]),
                 Input(name: "z", dtype: "f32", shape: [5, 100, 10])],
        nodes: [Node(name: "e", op: "exp", args: ["x"]),
                Node(name: "s", op: "sum", args: ["e"], attrs: {"axes": [1]}),
                Node(name: "n", op: "neg", args: ["x"]),
                Node(name: "b", op: "add", args: ["x", "z"])],
        outputs: ["s", "n", "b"])"#);
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 2);
    let reduction = kernel_with(&dag, &p, "s");
    assert_eq!(names(&dag, reduction), ["e", "s", "n"]);
    assert_eq!(reduction.domain, [100, 10]);
    assert_eq!(reduction.inputs, [Value::Input(0)]);
    // {e, s} alone: 4000 + 400 B, 9000 flops, 23.4 us; n alone 8 + 1 + 10 = 19 us. Together:
    // x read once, s and n written: 8400 B = 8.4 us, 10000 flops = 10 us, 10 us.
    assert_close!(reduction.cost.total_us, 28.4);
    let wide = kernel_with(&dag, &p, "b");
    assert_eq!(names(&dag, wide), ["b"]);
    assert_eq!(wide.domain, [5, 100, 10]);
    // x 4000 B + z 20000 B read, b 20000 B written: 44 us; 5000 flops; 10 us.
    assert_close!(wide.cost.total_us, 59.0);
    assert_close!(p.cost.total_us, 28.4 + 59.0);
}

/// A sibling over a broadcast row is recomputed for every row of the merged kernel's domain:
/// the cost model merges a cheap one and leaves an expensive one apart (as for producers).
#[test]
fn the_cost_model_decides_broadcast_siblings() {
    let siblings = |op: &str| {
        dag(&format!(
            r#"Graph(name: "bs",
            inputs: [Input(name: "s", dtype: "f32", shape: [1, 100]),
                     Input(name: "x", dtype: "f32", shape: [100, 100])],
            nodes: [Node(name: "a", op: "add", args: ["x", "s"]),
                    Node(name: "b", op: "{op}", args: ["s"])],
            outputs: ["a", "b"])"#
        ))
    };
    let fusion = FusionRules::defaults();
    // a alone: 40400 B read + 40000 B written = 80.4 us, 10000 flops = 10 us, 10 us: 100.4 us.
    // exp(s) alone: 800 B, 800 flops, 10 us: 11.6 us; 112 us apart. Merged over [100, 100]:
    // 80.8 us of memory and (1 + 8) x 10000 flops = 90 us: 180.8 us. Left apart.
    let dag = siblings("exp");
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 2);
    assert_close!(p.cost.total_us, 112.0);
    // neg(s) alone: 0.8 + 0.1 + 10 = 10.9 us; 111.3 us apart. Merged: 80.8 + 20 + 10 = 110.8 us.
    let dag = siblings("neg");
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].domain, [100, 100]);
    assert_eq!(p.kernels[0].cost.flops, 20000, "neg recomputed per element");
    assert_close!(p.cost.total_us, 110.8);
}

/// Six independent readers of x, each a graph output.
const SIX_SIBLINGS: &str = r#"Graph(name: "six",
    inputs: [Input(name: "x", dtype: "f32", shape: [1000])],
    nodes: [Node(name: "n1", op: "neg", args: ["x"]), Node(name: "n2", op: "exp", args: ["x"]),
            Node(name: "n3", op: "tanh", args: ["x"]), Node(name: "n4", op: "mul", args: ["x", "x"]),
            Node(name: "n5", op: "add", args: ["x", "x"]), Node(name: "n6", op: "div", args: ["x", "x"])],
    outputs: ["n1", "n2", "n3", "n4", "n5", "n6"])"#;

/// Six siblings of x under a budget of 4 arguments: x plus three outputs fill a kernel.
#[test]
fn sibling_fusion_respects_the_argument_budget() {
    let dag = dag(SIX_SIBLINGS);
    let fusion = with_budget(4);
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    let groups: Vec<Vec<String>> = p.kernels.iter().map(|k| names(&dag, k)).collect();
    assert_eq!(groups, [vec!["n1", "n2", "n3"], vec!["n4", "n5", "n6"]]);
    for k in &p.kernels {
        assert_eq!(k.inputs.len() + k.outputs.len(), 4);
    }
    // Each kernel reads x and writes three values: 16000 B = 16 us, plus a launch; arithmetic
    // (1 + 8 + 6) x 1000 and (1 + 1 + 4) x 1000 flops.
    assert_close!(p.kernels[0].cost.total_us, 16.0 + 15.0 + 10.0);
    assert_close!(p.kernels[1].cost.total_us, 16.0 + 6.0 + 10.0);
    // The default budget takes all six: 28000 B, 21000 flops, one launch.
    let p = partition::partition(&dag, &FusionRules::defaults(), &toy());
    assert_eq!(p.kernels.len(), 1);
    assert_close!(p.cost.total_us, 28.0 + 21.0 + 10.0);
}

/// The six siblings of x under op budgets of 2, 3 and 4 (and the default argument budget):
/// each kernel takes siblings in order until it is full.
#[test]
fn sibling_fusion_respects_the_op_budget() {
    let dag = dag(SIX_SIBLINGS);
    // Flop-equivalents per element: neg 1, exp 8, tanh 6, mul 1, add 1, div 4.
    let flops = [1.0, 8.0, 6.0, 1.0, 1.0, 4.0];
    for k in [2, 3, 4] {
        let fusion = with_budgets(64, k);
        let p = partition::partition(&dag, &fusion, &toy());
        check_invariants(&dag, &p, &fusion);
        let groups: Vec<Vec<String>> = p.kernels.iter().map(|kernel| names(&dag, kernel)).collect();
        let all: Vec<String> = (1..=6).map(|i| format!("n{i}")).collect();
        let expected: Vec<Vec<String>> = all.chunks(k).map(<[String]>::to_vec).collect();
        assert_eq!(groups, expected, "budget {k}");
        // A kernel of m siblings reads x once and writes m values: 4000 (1 + m) B; its
        // arithmetic is the sum of its ops' over 1000 elements; one launch.
        let mut total = 0.0;
        for (kernel, chunk) in p.kernels.iter().zip(flops.chunks(k)) {
            let m = chunk.len() as f64;
            let expected = 4.0 * (1.0 + m) + chunk.iter().sum::<f64>() + 10.0;
            assert_close!(kernel.cost.total_us, expected);
            total += expected;
        }
        assert_close!(p.cost.total_us, total);
    }
    // With both budgets, the tighter one decides: 4 arguments fit three siblings, 2 ops two.
    let fusion = with_budgets(4, 2);
    let p = partition::partition(&dag, &fusion, &toy());
    check_invariants(&dag, &p, &fusion);
    assert!(p.kernels.iter().all(|k| k.nodes.len() == 2));
    let fusion = with_budgets(4, 5);
    let p = partition::partition(&dag, &fusion, &toy());
    assert!(p.kernels.iter().all(|k| k.nodes.len() == 3));
}

// ---------------------------------------------------------------- every example, and scale

#[test]
fn partition_never_costs_more_than_unfused_on_the_examples() {
    let fusion = FusionRules::defaults();
    let dir = format!("{}/examples", env!("CARGO_MANIFEST_DIR"));
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let dag = example(&name);
        for prof in ["cpu", "h200"] {
            let profile = profile(prof);
            let fused = partition::partition(&dag, &fusion, &profile);
            let before = partition::unfused(&dag, &profile);
            check_invariants(&dag, &fused, &fusion);
            check_invariants(&dag, &before, &fusion);
            assert!(
                fused.cost.total_us <= before.cost.total_us + 1e-9,
                "{name} on {prof}: {} > {}",
                fused.cost.total_us,
                before.cost.total_us
            );
            assert!(fused.kernels.len() <= before.kernels.len());
            let literals = dag
                .nodes
                .iter()
                .filter(|n| partition::is_literal(n))
                .count();
            assert_eq!(before.kernels.len(), dag.nodes.len() - literals);
        }
        seen += 1;
    }
    assert!(seen >= 9);
}

/// A deterministic pseudo-random dag of 10,000 nodes mixing pointwise ops, broadcasts of a
/// row, transposes (Alone) and row sums (End), checked for every invariant.
#[test]
fn ten_thousand_node_dag() {
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut b = GraphBuilder::new("big");
    let mut square: Vec<String> = (0..8)
        .map(|i| b.input(&format!("x{i}"), DType::F32, &[32, 32]))
        .collect();
    let mut rows: Vec<String> = vec![b.input("r", DType::F32, &[32])];
    for i in 0..10_000 {
        let name = format!("n{i}");
        let pick = |v: &Vec<String>, k: usize| v[v.len() - 1 - k % v.len().min(40)].clone();
        let a = pick(&square, next(64));
        match next(20) {
            0 => square.push(b.op(&name, "transpose", &[&a])),
            1 => rows.push(b.op_with(&name, "sum", &[&a], &[("axes", vec![0i64].into())])),
            2 => {
                let r = pick(&rows, next(8));
                square.push(b.op(&name, "mul", &[&a, &r]));
            }
            3 => square.push(b.op(&name, "exp", &[&a])),
            4..=10 => {
                let c = pick(&square, next(64));
                square.push(b.op(&name, "add", &[&a, &c]));
            }
            _ => square.push(b.op(&name, "tanh", &[&a])),
        }
    }
    let last: Vec<&str> = square.iter().rev().take(5).map(String::as_str).collect();
    let graph = b.finish(&last);
    let dag = Dag::from_graph(&graph, &Catalogue::defaults()).unwrap();
    assert_eq!(dag.nodes.len(), 10_000);
    let fusion = FusionRules::defaults();
    for prof in ["cpu", "h200"] {
        let profile = profile(prof);
        let start = std::time::Instant::now();
        let p = partition::partition(&dag, &fusion, &profile);
        let elapsed = start.elapsed();
        let before = partition::unfused(&dag, &profile);
        let mut off = fusion.clone();
        off.siblings = false;
        let producer_consumer = partition::partition(&dag, &off, &profile);
        eprintln!(
            "{prof}: 10,000 nodes -> {} kernels in {elapsed:?} ({} without siblings); \
             {:.1} us -> {:.1} us ({:.1} us without siblings)",
            p.kernels.len(),
            producer_consumer.kernels.len(),
            before.cost.total_us,
            p.cost.total_us,
            producer_consumer.cost.total_us
        );
        check_invariants(&dag, &p, &fusion);
        assert!(p.cost.total_us <= before.cost.total_us);
        assert!(p.cost.total_us <= producer_consumer.cost.total_us);
        assert!(p.kernels.len() < before.kernels.len() / 2);
    }
}

/// Hundreds of small random dags with every role in play (transposes run alone, row sums end
/// kernels, rows broadcast into squares, literals), several outputs, three profiles, and
/// tight argument and op budgets: every invariant holds (budgets, one domain, convexity,
/// disjoint kernels covering every non-literal node, no End result consumed in its kernel),
/// fusing never costs more than not fusing, and sibling fusion never costs more than
/// producer-consumer fusion alone.
#[test]
fn random_small_dags_keep_every_invariant() {
    let tight = FusionRules::load_str(
        "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}, max_kernel_args: 5)",
        "f.ron",
        &Catalogue::defaults(),
    )
    .unwrap();
    // Budgets of a few ops cut kernels everywhere, in both passes.
    let rules = [
        FusionRules::defaults(),
        tight,
        with_budgets(64, 3),
        with_budgets(6, 2),
    ];
    let profiles = [toy(), profile("cpu"), profile("h200")];
    let mut state = 0x2545f4914f6cdd1du64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for case in 0..300 {
        let mut b = GraphBuilder::new("random");
        let side = [1, 4, 16][next(3)];
        let mut square: Vec<String> = (0..1 + next(3))
            .map(|i| b.input(&format!("x{i}"), DType::F32, &[side, side]))
            .collect();
        let mut rows: Vec<String> = vec![b.input("r", DType::F32, &[side])];
        let one = b.constant("one", 1.0, DType::F32);
        for i in 0..2 + next(25) {
            let name = format!("n{i}");
            let a = square[next(square.len())].clone();
            match next(12) {
                0 => square.push(b.op(&name, "transpose", &[&a])),
                1 => rows.push(b.op_with(&name, "sum", &[&a], &[("axes", vec![0i64].into())])),
                2 => {
                    let r = rows[next(rows.len())].clone();
                    square.push(b.op(&name, "mul", &[&a, &r]));
                }
                3 => {
                    let r = rows[next(rows.len())].clone();
                    rows.push(b.op(&name, "exp", &[&r]));
                }
                4 => square.push(b.op(&name, "sub", &[&one, &a])),
                5 => square.push(b.op(&name, "sigmoid", &[&a])),
                _ => {
                    let c = square[next(square.len())].clone();
                    square.push(b.op(&name, "add", &[&a, &c]));
                }
            }
        }
        let mut outs: Vec<&str> = vec![square.last().unwrap()];
        for v in square.iter().chain(&rows) {
            if next(4) == 0 && !outs.contains(&v.as_str()) && v.starts_with('n') {
                outs.push(v);
            }
        }
        let dag = Dag::from_graph(&b.finish(&outs), &Catalogue::defaults()).unwrap();
        for fusion in &rules {
            for profile in &profiles {
                let fused = partition::partition(&dag, fusion, profile);
                let before = partition::unfused(&dag, profile);
                check_invariants(&dag, &fused, fusion);
                assert!(
                    fused.cost.total_us <= before.cost.total_us * (1.0 + 1e-12),
                    "case {case} on {}: {} > {}",
                    profile.name,
                    fused.cost.total_us,
                    before.cost.total_us
                );
                // Sibling fusion only merges after producer-consumer fusion, and only when
                // that is cheaper; and the result does not depend on hash order.
                let mut off = fusion.clone();
                off.siblings = false;
                let producer_consumer = partition::partition(&dag, &off, profile);
                check_invariants(&dag, &producer_consumer, &off);
                assert!(
                    fused.cost.total_us <= producer_consumer.cost.total_us * (1.0 + 1e-12),
                    "case {case} on {}: siblings made it worse",
                    profile.name
                );
                assert!(fused.kernels.len() <= producer_consumer.kernels.len());
                assert_eq!(fused, partition::partition(&dag, fusion, profile));
            }
        }
    }
}

/// Loading mutated copies of the embedded cost.ron and fusion.ron returns an error or rules,
/// never panics.
#[test]
fn loaders_never_panic_on_mutated_text() {
    let ops = Catalogue::defaults();
    let sources = [
        include_str!("../rules/cost.ron"),
        include_str!("../rules/fusion.ron"),
    ];
    let pieces = [
        "", "0", "-1", "1e400", "NaN", "inf", "\"", "(", ")", "{", "}", ",", ":", "Join", "End",
        "Never", "f32", "\"exp\"", "Profile(", "x",
    ];
    let mut state = 0x6a09e667f3bcc909u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for round in 0..3000 {
        let source = sources[round % 2];
        let chars: Vec<char> = source.chars().collect();
        let mut text: Vec<char> = chars.clone();
        for _ in 0..1 + next(3) {
            let at = next(text.len());
            let len = next(8).min(text.len() - at);
            let piece: Vec<char> = pieces[next(pieces.len())].chars().collect();
            text.splice(at..at + len, piece);
        }
        let text: String = text.into_iter().collect();
        if round % 2 == 0 {
            let mut model = CostModel::defaults();
            let _ = model.load_str(&text, "cost.ron");
        } else {
            let _ = FusionRules::load_str(&text, "fusion.ron", &ops);
        }
    }
}

#[test]
fn rule_directory_loads_fusion_and_cost() {
    let dir = std::env::temp_dir().join(format!("fusebox-partition-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("fusion.ron"),
        "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: Alone, Opaque: Never},\n  ops: {\"mine\": Alone}, max_kernel_args: 16)",
    )
    .unwrap();
    std::fs::write(
        dir.join("ops.ron"),
        r#"[Op(name: "mine", kind: Pointwise, operands: ["x"], dtype: Promote(["x"]), formula: "x * x")]"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("cost.ron"),
        r#"Cost(profiles: {"slow": Profile(bandwidth_gbps: 1.0, launch_us: 5.0, pointwise_gflops: 1.0, matmul_gflops: {"f32": 1.0})})"#,
    )
    .unwrap();
    let rules = RuleSet::load_dir(&dir).unwrap();
    assert_eq!(rules.fusion.max_kernel_args, 16);
    assert_eq!(
        rules.fusion.role(rules.ops.get("mine").unwrap()),
        Role::Alone
    );
    assert_eq!(
        rules.fusion.role(rules.ops.get("sum").unwrap()),
        Role::Alone
    );
    assert_eq!(rules.cost.profile("slow").unwrap().launch_us, 5.0);
    assert!(rules.cost.profile("h200").is_ok());
    // A user op gets its cost from its formula: x * x is one multiply.
    assert_eq!(
        rules
            .cost
            .profile("slow")
            .unwrap()
            .elementwise_flops(rules.ops.get("mine").unwrap()),
        1.0
    );
    // fusion.ron naming an op nobody defines is a located error.
    std::fs::write(
        dir.join("fusion.ron"),
        "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never},\n  ops: {\"mien\": Alone}, max_kernel_args: 16)",
    )
    .unwrap();
    let err = RuleSet::load_dir(&dir).unwrap_err();
    let shown = dir.join("fusion.ron").display().to_string();
    assert_eq!(
        err.to_string(),
        format!("{shown}:2:9: unknown op `mien` (did you mean `mine`?)")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// --- Reads priced by access pattern: view or copy ----------------------------------------

/// The cpu profile with its read prices replaced by `reads` (a `cost.ron` of the user's).
fn cpu_with_reads(reads: &str) -> Profile {
    let mut model = CostModel::defaults();
    let cpu = profile("cpu");
    model
        .load_str(
            &format!(
                r#"Cost(profiles: {{"cpu": Profile(bandwidth_gbps: {}, launch_us: {}, pointwise_gflops: {},
                    overlap: {}, matmul_gflops: {{"f32": 150.0}}, reads: {reads})}})"#,
                cpu.bandwidth_gbps, cpu.launch_us, cpu.pointwise_gflops, cpu.overlap
            ),
            "cost.ron",
        )
        .unwrap();
    model.profile("cpu").unwrap().clone()
}

/// Softmax over axis 1 of `transpose(x)`, x `[n, n]` f32.
fn transposed_softmax(n: usize) -> Dag {
    dag(&format!(
        r#"Graph(name: "transposed_softmax",
        inputs: [Input(name: "x", dtype: "f32", shape: [{n}, {n}])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"], attrs: {{"perm": [1, 0]}}),
                Node(name: "m", op: "reduce_max", args: ["t"], attrs: {{"axes": [-1], "keepdim": true}}),
                Node(name: "d", op: "sub", args: ["t", "m"]),
                Node(name: "e", op: "exp", args: ["d"]),
                Node(name: "s", op: "sum", args: ["e"], attrs: {{"axes": [-1], "keepdim": true}}),
                Node(name: "y", op: "div", args: ["e", "s"])],
        outputs: ["y"])"#
    ))
}

/// On the cpu profile a row kernel walks each row again on every pass, and a row of
/// `transpose(x)` is a column of x: read as a view, softmax's passes would each gather it. The
/// transpose is instead gathered once, by the kernel that also takes the row max on the way,
/// and the row kernel reads the transposed value contiguously.
#[test]
fn a_transposed_softmax_gathers_its_rows_once_on_the_cpu() {
    let dag = transposed_softmax(4096);
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &profile("cpu"));
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 2);
    assert_eq!(names(&dag, &p.kernels[0]), ["t", "m"]);
    assert_eq!(p.kernels[0].inputs, [Value::Input(0)]);
    assert_eq!(p.kernels[0].outputs, [Value::Node(0), Value::Node(1)]);
    assert_eq!(names(&dag, &p.kernels[1]), ["d", "e", "s", "y"]);
    assert_eq!(p.kernels[1].inputs, [Value::Node(0), Value::Node(1)]);
    // The gathering kernel pays one strided pass over x: 36 extra bytes per byte of x on top
    // of reading x and writing t and m.
    let x_bytes = 4096.0 * 4096.0 * 4.0;
    let bytes = 2.0 * x_bytes + 4096.0 * 4.0;
    let cpu = profile("cpu");
    assert_close!(
        p.kernels[0].cost.memory_us,
        (bytes + 36.0 * x_bytes) / (cpu.bandwidth_gbps * 1e3)
    );
    // Cheaper than the one-kernel form that the same data with no read prices picks.
    let flat = cpu_with_reads("Reads(strided: 0.0, gathered: 0.0)");
    let one = partition::partition(&dag, &fusion, &flat);
    assert_eq!(one.kernels.len(), 1);
    let one_repriced = {
        // The one-kernel form under the cpu prices: three passes, each gathering x.
        let passes = 3.0;
        one.kernels[0].cost.total_us + passes * 36.0 * x_bytes / (cpu.bandwidth_gbps * 1e3)
    };
    assert!(p.cost.total_us < one_repriced);
}

/// With a strided read priced like a contiguous one (`strided: 0` in the rule directory's
/// cost.ron), nothing is gained by gathering first: the transposed softmax is one row kernel
/// reading x through the view, as before reads had prices.
#[test]
fn a_free_strided_read_keeps_the_softmax_view() {
    let dag = transposed_softmax(4096);
    let fusion = FusionRules::defaults();
    let p = partition::partition(
        &dag,
        &fusion,
        &cpu_with_reads("Reads(strided: 0.0, gathered: 0.0, rows_reread: true)"),
    );
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].inputs, [Value::Input(0)]);
}

/// On the h200 profile a row kernel keeps its row on chip after the first read, so the view is
/// gathered once either way and the softmax stays one kernel.
#[test]
fn a_transposed_softmax_stays_one_kernel_where_rows_stay_on_chip() {
    let dag = transposed_softmax(4096);
    let fusion = FusionRules::defaults();
    let p = partition::partition(&dag, &fusion, &profile("h200"));
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].inputs, [Value::Input(0)]);
}

/// A transpose read by a single pointwise kernel stays a view even at the cpu's strided price:
/// a copy would gather the same bytes once, then write and read them back.
#[test]
fn a_transpose_read_by_one_add_stays_a_view() {
    let dag = dag(r#"Graph(name: "tadd",
        inputs: [Input(name: "x", dtype: "f32", shape: [4096, 4096]),
                 Input(name: "b", dtype: "f32", shape: [4096, 4096])],
        nodes: [Node(name: "t", op: "transpose", args: ["x"]),
                Node(name: "z", op: "add", args: ["t", "b"])],
        outputs: ["z"])"#);
    let fusion = FusionRules::defaults();
    let cpu = profile("cpu");
    let p = partition::partition(&dag, &fusion, &cpu);
    check_invariants(&dag, &p, &fusion);
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(names(&dag, &p.kernels[0]), ["t", "z"]);
    assert_eq!(p.kernels[0].inputs, [Value::Input(0), Value::Input(1)]);
    // The strided read is priced even so: 3 values' bytes plus 36 per byte of x.
    let x_bytes = 4096.0 * 4096.0 * 4.0;
    assert_close!(
        p.kernels[0].cost.memory_us,
        (3.0 * x_bytes + 36.0 * x_bytes) / (cpu.bandwidth_gbps * 1e3)
    );
}

/// Read prices by hand on the toy profile: a transposing copy of a `[64, 64]` f32 moves its
/// 32 KiB plus `strided` per byte read; a stride of 2 elements skips 4 of each 64-byte line's
/// 60 bytes after the first element, so it pays 4/60 of that; a slice along the outer axis
/// and a broadcast inner axis pay nothing.
#[test]
fn strided_reads_are_priced_by_the_line_share_they_skip() {
    let mut model = CostModel::defaults();
    model
        .load_str(
            r#"Cost(profiles: {"toy": Profile(
                bandwidth_gbps: 1.0, launch_us: 10.0, pointwise_gflops: 1.0,
                matmul_gflops: {"f32": 2.0}, reads: Reads(line_bytes: 64.0, strided: 15.0),
            )})"#,
            "toy.ron",
        )
        .unwrap();
    let toy = model.profile("toy").unwrap().clone();
    let cases = [
        // (layout node, its attrs, extra bytes per byte of the result)
        ("transpose", "", 15.0),
        (
            "slice",
            r#", attrs: {"axis": 1, "step": 2}"#,
            15.0 * 4.0 / 60.0,
        ),
        ("slice", r#", attrs: {"axis": 0, "step": 2}"#, 0.0),
    ];
    for (op, attrs, extra) in cases {
        let dag = dag(&format!(
            r#"Graph(name: "copy",
            inputs: [Input(name: "x", dtype: "f32", shape: [64, 64])],
            nodes: [Node(name: "y", op: "{op}", args: ["x"]{attrs})],
            outputs: ["y"])"#
        ));
        let p = partition::unfused(&dag, &toy);
        let out_bytes = (dag.nodes[0].ty.shape.iter().product::<usize>() * 4) as f64;
        let bytes = 64.0 * 64.0 * 4.0 + out_bytes;
        assert_close!(
            p.kernels[0].cost.memory_us,
            (bytes + extra * out_bytes) / 1e3
        );
        assert_close!(
            p.kernels[0].cost.total_us,
            10.0 + (bytes + extra * out_bytes) / 1e3
        );
        assert_eq!(
            p.kernels[0].cost.bytes, bytes as u64,
            "{op}: bytes stay the values'"
        );
    }
}

/// Column sums of the sum of `inputs` f32 `[rows, cols]` inputs, as `benches/gpu/reduction_sweep.py`
/// builds them.
fn summed_column_sums(inputs: usize, rows: usize, cols: usize) -> Dag {
    let ops = Catalogue::defaults();
    let mut b = GraphBuilder::new("column_sums");
    let mut source = b.input("x0", DType::F32, &[rows, cols]);
    for k in 1..inputs {
        let x = b.input(&format!("x{k}"), DType::F32, &[rows, cols]);
        source = b.op(&format!("a{k}"), "add", &[&source, &x]);
    }
    b.op_with(
        "s",
        "sum",
        &[&source],
        &[("axes", fusebox::attr::AttrValue::Ints(vec![0]))],
    );
    Dag::from_graph(&b.finish(&["s"]), &ops).unwrap()
}

/// The h200 profile prices a reduction pass short of threads by its threads and by the bytes
/// each moves, as an H200 ran the column-sum sweep (book: "Reductions short of threads"): the
/// sums of 16 inputs `[4096, 1024]` (65536 threads moving 4 KiB each) ran 1.40x faster as a
/// pointwise kernel and a sum of its own, and so split; the sums of 4 inputs `[1024, 1024]`
/// (16384 threads moving 1 KiB each) ran at copy speed in one kernel, 7% faster than split,
/// and so stay one kernel (the law without the bytes term split them).
#[test]
fn h200_reduction_passes_are_priced_by_threads_and_bytes_per_thread() {
    let fusion = FusionRules::defaults();
    let h200 = profile("h200");
    for (inputs, rows, kernels) in [(16, 4096, 2), (4, 1024, 1)] {
        let dag = summed_column_sums(inputs, rows, 1024);
        let p = partition::partition(&dag, &fusion, &h200);
        check_invariants(&dag, &p, &fusion);
        assert_eq!(p.kernels.len(), kernels, "{inputs} inputs [{rows}, 1024]");
    }
    // Without the bytes term (every pass pays the whole slowdown) the second splits too.
    let mut threads_only = h200.clone();
    threads_only.reductions.full_bytes_per_thread = 0.0;
    let dag = summed_column_sums(4, 1024, 1024);
    assert_eq!(
        partition::partition(&dag, &fusion, &threads_only)
            .kernels
            .len(),
        2
    );
}
