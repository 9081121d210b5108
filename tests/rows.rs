//! Row kernels: reductions over the innermost axis consumed inside their kernel (fusion.ron's
//! `Rows`). Each graph runs fused on the CPU (generated C) and in the kernel-IR interpreter,
//! and both must agree with the reference evaluator on the unfused graph; the kernel counts
//! and pass counts the design promises are asserted.

use crate::common;

use common::random_graph::{self, assert_same, rules};
use common::row_graphs::{
    self, last_axis, layernorm, layernorm_of_gelu, log_softmax, softcapped_softmax, softmax,
};
use fusebox::attr::AttrValue;
use fusebox::backend::Executable;
use fusebox::backend::cpu::emit::ROW_SCRATCH_BYTES;
use fusebox::dtype::DType;
use fusebox::graph::builder::GraphBuilder;
use fusebox::graph::{self, Graph};
use fusebox::lower::{self, Program};
use fusebox::optimize::{Options, optimize};
use fusebox::runner::prepare;
use fusebox::runtime::interpret;
use proptest::prelude::*;
use std::sync::OnceLock;

use common::kernel_cache::compiler;

fn lowered(graph: &Graph) -> Program {
    let out = optimize(graph, rules(), &Options::default()).expect("optimize");
    lower::lower(&out.dag, &out.partition).expect("lower")
}

/// Runs `graph` fused through the interpreter and through compiled C, on seeded inputs (with
/// NaN/±Inf/±0 planted when `specials`), against the reference evaluator.
fn agrees(graph: &Graph, seed: u64, specials: bool) -> Result<(), String> {
    agrees_under(graph, rules(), seed, specials)
}

/// [`agrees`] under a rule set of the caller's.
fn agrees_under(
    graph: &Graph,
    rules: &fusebox::rules::RuleSet,
    seed: u64,
    specials: bool,
) -> Result<(), String> {
    let inputs = random_graph::inputs(graph, seed, specials);
    let want = fusebox::eval::evaluate(graph, &rules.ops, &inputs).map_err(|e| e.to_string())?;
    let out = optimize(graph, rules, &Options::default()).map_err(|e| e.to_string())?;
    let program = lower::lower(&out.dag, &out.partition).map_err(|e| e.to_string())?;
    let buffers = random_graph::input_buffers(&program, &inputs);
    let interpreted = interpret::run_program(&program, &buffers).map_err(|e| e.to_string())?;
    for (o, b) in program.dag.outputs.iter().zip(&interpreted) {
        same_up_to_inputs(&o.name, &want[&o.name], &b.to_tensor(), &inputs)
            .map_err(|e| format!("interpreter: {e}"))?;
    }
    let mut prepared =
        prepare(graph, rules, &Options::default(), compiler()).map_err(|e| e.to_string())?;
    let got = prepared
        .executable
        .run_tensors(&inputs)
        .map_err(|e| e.to_string())?;
    for name in &graph.outputs {
        same_up_to_inputs(name, &want[name], &got[name], &inputs).map_err(|e| format!("C: {e}"))?;
    }
    Ok(())
}

/// [`assert_same`], or where that fails, every finite value within the dtype's tolerance of
/// the larger of its own magnitude and the inputs' largest. A difference of nearly equal
/// values (`r - tanh(r)` for a small `r`) leaves an output far below its operands, whose
/// last-ulp differences (a vector `tanh`'s) the output's own magnitude cannot bound: the
/// operands' can.
fn same_up_to_inputs(
    name: &str,
    want: &fusebox::tensor::Tensor,
    got: &fusebox::tensor::Tensor,
    inputs: &fusebox::eval::Tensors,
) -> Result<(), String> {
    let Err(e) = assert_same(name, want, got) else {
        return Ok(());
    };
    if want.dtype != got.dtype || want.shape() != got.shape() || !want.dtype.is_float() {
        return Err(e);
    }
    let scale = inputs
        .values()
        .flat_map(|t| t.values())
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let tol = random_graph::tolerance(want.dtype);
    let close = want.values().iter().zip(got.values()).all(|(&w, g)| {
        (w.is_nan() && g.is_nan())
            || w == g
            || (w.is_finite() && g.is_finite() && (w - g).abs() <= tol * scale.max(w.abs()))
    });
    close.then_some(()).ok_or(e)
}

/// The row kernels of the fused program: (kernel IR, passes over each row).
fn row_kernels(program: &Program) -> Vec<usize> {
    program
        .kernels
        .iter()
        .filter(|k| k.is_row_kernel())
        .map(|k| k.passes())
        .collect()
}

#[test]
fn softmax_is_one_kernel_of_three_passes_and_matches_the_reference() {
    let graph = softmax(DType::F32, &[64, 300]);
    let program = lowered(&graph);
    assert_eq!(program.groups, 1, "softmax is one kernel");
    assert_eq!(row_kernels(&program), vec![3], "max; sum of exp; normalize");
    agrees(&graph, 1, false).unwrap();
}

#[test]
fn log_softmax_matches_the_reference() {
    let graph = log_softmax(DType::F32, &[33, 257]);
    let program = lowered(&graph);
    assert_eq!(program.groups, 1);
    agrees(&graph, 2, false).unwrap();
}

#[test]
fn layernorm_with_and_without_affine_is_one_kernel() {
    for affine in [true, false] {
        let graph = layernorm(DType::F32, &[40, 129], affine);
        let program = lowered(&graph);
        assert_eq!(
            program.groups, 1,
            "layernorm (affine {affine}) is one kernel"
        );
        assert_eq!(row_kernels(&program), vec![3], "mean; variance; normalize");
        agrees(&graph, 3, false).unwrap();
    }
}

#[test]
fn rms_norm_matches_the_reference() {
    let mut b = GraphBuilder::new("rms_norm");
    let x = b.input("x", DType::F32, &[17, 96]);
    let w = b.input("w", DType::F32, &[96]);
    let sq = b.op("sq", "mul", &[&x, &x]);
    let ms = last_axis(&mut b, "ms", "mean", &sq);
    let eps = b.constant("eps", 1e-6, DType::F32);
    let ve = b.op("ve", "add", &[&ms, &eps]);
    let r = b.op("r", "rsqrt", &[&ve]);
    let n = b.op("n", "mul", &[&x, &r]);
    let y = b.op("y", "mul", &[&n, &w]);
    let graph = b.finish(&[&y]);
    let program = lowered(&graph);
    assert_eq!(program.groups, 1);
    assert_eq!(row_kernels(&program), vec![2]);
    agrees(&graph, 4, false).unwrap();
}

/// Two independent reductions of one row are accumulated in the same pass.
#[test]
fn two_reductions_of_one_row_share_a_pass() {
    let mut b = GraphBuilder::new("two");
    let x = b.input("x", DType::F32, &[20, 70]);
    let m = last_axis(&mut b, "m", "reduce_max", &x);
    let s = last_axis(&mut b, "s", "sum", &x);
    let d = b.op("d", "sub", &[&x, &m]);
    let y = b.op("y", "div", &[&d, &s]);
    let graph = b.finish(&[&y, &m]);
    let program = lowered(&graph);
    assert_eq!(program.groups, 1);
    assert_eq!(row_kernels(&program), vec![2], "both reductions in pass 0");
    agrees(&graph, 5, false).unwrap();
}

/// The consumer of a row reduction also reads another input broadcast along the rows ([N])
/// and one broadcast along the columns ([N, 1]); the reduction's result is an output too.
#[test]
fn a_row_reduction_consumer_broadcasts_other_inputs() {
    let mut b = GraphBuilder::new("bcast");
    let x = b.input("x", DType::F32, &[12, 50]);
    let col = b.input("col", DType::F32, &[50]);
    let row = b.input("row", DType::F32, &[12, 1]);
    let s = last_axis(&mut b, "s", "sum", &x);
    let t = b.op("t", "mul", &[&s, &row]);
    let u = b.op("u", "add", &[&x, &t]);
    let y = b.op("y", "mul", &[&u, &col]);
    let graph = b.finish(&[&y, &s, &t]);
    let program = lowered(&graph);
    assert_eq!(program.groups, 1);
    agrees(&graph, 6, false).unwrap();
}

/// Rows of zero and one element, a `[N, 1]` input, zero rows, and a rank-1 input whose one
/// row is the whole tensor.
#[test]
fn empty_single_and_degenerate_rows_match_the_reference() {
    for shape in [
        vec![5, 1],
        vec![1, 1],
        vec![0, 7],
        vec![7, 0],
        vec![1, 300],
        vec![300],
        vec![2, 3, 9],
    ] {
        // Over an empty row the max is -inf and the softmax empty.
        agrees(&softmax(DType::F32, &shape), 7, false)
            .unwrap_or_else(|e| panic!("softmax {shape:?}: {e}"));
        agrees(&layernorm(DType::F32, &shape, true), 7, false)
            .unwrap_or_else(|e| panic!("layernorm {shape:?}: {e}"));
    }
}

/// A row kernel over empty rows still writes each row's result (see
/// [`row_graphs::empty_reductions`]): the sum of nothing is 0, the mean NaN, the max -inf (f32
/// and f16) and the min +inf, over rows and over an outer empty axis alike.
#[test]
fn empty_rows_still_write_their_results() {
    for dtype in [DType::F32, DType::F16] {
        let graph = row_graphs::empty_reductions(dtype);
        let inputs = random_graph::inputs(&graph, 8, false);
        let want = fusebox::eval::evaluate(&graph, &rules().ops, &inputs).unwrap();
        assert!(want["top"].values().iter().all(|&v| v == f64::NEG_INFINITY));
        assert!(want["low"].values().iter().all(|&v| v == f64::INFINITY));
        assert!(want["cm"].values().iter().all(|&v| v == f64::NEG_INFINITY));
        agrees(&graph, 8, false).unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
    }
}

/// The CPU kernel keeps softmax's `exp` in a per-thread row scratch for its last pass only
/// while a row of it fits in `ROW_SCRATCH_BYTES`; longer rows compute it again in the last
/// pass. Both sides of the limit, with rows that are not a whole number of vectors, and with
/// NaN and ±Inf planted, agree with the reference evaluator.
#[test]
fn rows_on_both_sides_of_the_row_scratch_limit_match_the_reference() {
    let fits = ROW_SCRATCH_BYTES / 4;
    for (seed, shape) in [
        (11, [3, fits]),
        (12, [3, fits + 17]),
        (13, [2, 3 * fits + 5]),
    ] {
        agrees(&softmax(DType::F32, &shape), seed, seed == 12)
            .unwrap_or_else(|e| panic!("softmax {shape:?}: {e}"));
        agrees(&layernorm(DType::F32, &shape, true), seed, seed == 12)
            .unwrap_or_else(|e| panic!("layernorm {shape:?}: {e}"));
    }
}

/// Softmax's last pass runs one row late (it stores row `o` while the thread computes row
/// `o + 1`, see `emit::kernel::rows`'s `Lag`). Launches large enough to use every thread and
/// stream their stores, rows that are not a whole number of vectors, a thread's last row,
/// a single row, and NaN and ±Inf planted: every element agrees with the reference.
#[test]
fn lagging_last_passes_match_the_reference_threaded_streamed_and_ragged() {
    for (seed, shape) in [
        (21, vec![1031, 4099]),
        (22, vec![3, 131_071]),
        (23, vec![1, 4099]),
        (24, vec![7, 3, 33]),
    ] {
        agrees(&softmax(DType::F32, &shape), seed, true)
            .unwrap_or_else(|e| panic!("softmax {shape:?}: {e}"));
    }
}

/// A value that calls or divides is computed once per row, by the first pass that needs it,
/// and read back by every later pass that does (`KernelIr::row_kept`): a soft-capped softmax
/// keeps its capped logits from the maximum's pass for the sum's (and for the last, where
/// they are an output too), and `exp` from the sum's pass for the last; `layernorm(gelu(x))`
/// keeps the gelu from the mean's pass for the variance's. Each is one row kernel of three
/// passes, and agrees with the reference with rows that fit the row scratch and rows that do
/// not, rows that are not whole vectors, launches large enough to thread and to lag the last
/// pass, and NaN and ±Inf planted.
#[test]
fn costly_values_are_kept_from_the_first_pass_that_needs_them() {
    let kept = |graph: &Graph| -> Vec<(usize, Vec<usize>)> {
        let program = lowered(graph);
        assert_eq!(program.groups, 1, "{}: one kernel", graph.name);
        assert_eq!(row_kernels(&program), vec![3], "{}", graph.name);
        let mut kept: Vec<(usize, Vec<usize>)> = program.kernels[0]
            .row_kept()
            .into_iter()
            .map(|k| (k.saved_in, k.read_in))
            .collect();
        kept.sort();
        kept
    };
    let shape = [8, 300];
    assert_eq!(
        kept(&softcapped_softmax(DType::F32, &shape, false)),
        vec![(0, vec![1]), (1, vec![2])],
        "the capped logits for the sum's pass, exp for the last"
    );
    assert_eq!(
        kept(&softcapped_softmax(DType::F32, &shape, true)),
        vec![(0, vec![1, 2]), (1, vec![2])],
        "the stored capped logits for both later passes"
    );
    assert_eq!(
        kept(&layernorm_of_gelu(DType::F32, &shape)),
        vec![(0, vec![1]), (1, vec![2])],
        "the gelu for the variance's pass, the centred gelu for the last"
    );
    let fits = ROW_SCRATCH_BYTES / 8;
    for (seed, shape) in [
        (31, vec![8, 300]),
        (32, vec![1031, 1037]),
        (33, vec![3, fits + 3]),
        (34, vec![2, 3, 33]),
    ] {
        for logits in [false, true] {
            agrees(&softcapped_softmax(DType::F32, &shape, logits), seed, true)
                .unwrap_or_else(|e| panic!("softcapped softmax {shape:?}: {e}"));
        }
        agrees(&layernorm_of_gelu(DType::F32, &shape), seed, true)
            .unwrap_or_else(|e| panic!("layernorm of gelu {shape:?}: {e}"));
    }
    for dtype in [DType::F16, DType::BF16] {
        agrees(&softcapped_softmax(dtype, &[5, 70], true), 35, true).unwrap();
        agrees(&layernorm_of_gelu(dtype, &[5, 70]), 35, true).unwrap();
    }
}

/// A lagging last pass shares the thread's one scratch row with the current row when the pass
/// storing the pending row saves everything the last pass reads (softmax; the soft-capped
/// softmax, whose capped logits the last pass does not read), and keeps two rows used in turn
/// when an earlier pass saves something the last pass reads (the soft-capped softmax whose
/// capped logits are an output: the sum's pass would overwrite the pending row's). Both kinds
/// agree with the reference above and in `lagging_last_passes_match_the_reference_...`.
#[test]
fn a_pending_row_shares_the_scratch_row_only_when_nothing_overwrites_it_first() {
    let scratch_rows = |graph: &Graph| -> usize {
        let program = lowered(graph);
        let text = fusebox::backend::cpu::emit::emit_kernel(&program.kernels[0], "k");
        assert!(
            text.contains("pend = 1;"),
            "{}: the last pass lags",
            graph.name
        );
        let rows = ["rbytes * 1)", "rbytes * 2)"].map(|r| text.contains(r));
        assert!(rows[0] != rows[1], "{text}");
        if rows[0] { 1 } else { 2 }
    };
    let shape = [8, 300];
    assert_eq!(scratch_rows(&softmax(DType::F32, &shape)), 1);
    assert_eq!(
        scratch_rows(&softcapped_softmax(DType::F32, &shape, false)),
        1
    );
    assert_eq!(
        scratch_rows(&softcapped_softmax(DType::F32, &shape, true)),
        2
    );
    for (seed, shape) in [(41, vec![1031, 1037]), (42, vec![3, 4099])] {
        for logits in [false, true] {
            agrees(&softcapped_softmax(DType::F32, &shape, logits), seed, true)
                .unwrap_or_else(|e| panic!("softcapped softmax {shape:?}: {e}"));
        }
    }
}

#[test]
fn nan_and_inf_rows_match_the_reference() {
    for seed in 0..6 {
        agrees(&softmax(DType::F32, &[16, 40]), seed, true).unwrap();
        agrees(&layernorm(DType::F32, &[16, 40], true), seed, true).unwrap();
    }
}

#[test]
fn half_precision_rows_match_the_reference() {
    for dtype in [DType::F16, DType::BF16] {
        let graph = softmax(dtype, &[24, 130]);
        assert_eq!(lowered(&graph).groups, 1);
        agrees(&graph, 9, false).unwrap();
        agrees(&layernorm(dtype, &[24, 130], true), 9, true).unwrap();
    }
}

/// Integer row reductions consumed in their kernel accumulate exactly (wrapping i64).
#[test]
fn integer_row_reductions_are_exact() {
    let mut b = GraphBuilder::new("ints");
    let x = b.input("x", DType::I32, &[9, 33]);
    let s = last_axis(&mut b, "s", "sum", &x);
    let m = last_axis(&mut b, "m", "reduce_max", &x);
    let d = b.op("d", "sub", &[&x, &m]);
    let y = b.op("y", "add", &[&d, &s]);
    let graph = b.finish(&[&y]);
    assert_eq!(lowered(&graph).groups, 1);
    agrees(&graph, 10, true).unwrap();
}

/// `sum(x, axes = [1])` of a `[4, 4]` without keepdim is `[4]`, which broadcasts against
/// `[4, 4]` along the other axis: its consumer reads column j's entry at column j, so it
/// must not be fused as a row kernel (which would hand row i's sum to row i).
#[test]
fn a_row_result_that_broadcasts_across_rows_is_not_fused_as_one() {
    let mut b = GraphBuilder::new("misaligned");
    let x = b.input("x", DType::F32, &[4, 4]);
    let s = b.op_with(
        "s",
        "sum",
        &[&x],
        &[
            ("axes", AttrValue::Ints(vec![-1])),
            ("keepdim", false.into()),
        ],
    );
    let y = b.op("y", "sub", &[&x, &s]);
    let graph = b.finish(&[&y]);
    assert!(row_kernels(&lowered(&graph)).is_empty());
    agrees(&graph, 11, false).unwrap();
}

/// Reductions over outer axes keep ending their kernels: the bias gradient's column sums
/// and `sum_to_size` to `[1, N]` are never consumed inside.
#[test]
fn outer_axis_reductions_keep_ending_their_kernels() {
    let mut b = GraphBuilder::new("columns");
    let x = b.input("x", DType::F32, &[30, 20]);
    let c = b.op_with(
        "c",
        "sum_to_size",
        &[&x],
        &[("shape", AttrValue::Ints(vec![1, 20]))],
    );
    let y = b.op("y", "sub", &[&x, &c]);
    let graph = b.finish(&[&y]);
    let program = lowered(&graph);
    assert!(row_kernels(&program).is_empty());
    assert_eq!(program.groups, 2, "the column sum ends its kernel");
    agrees(&graph, 12, false).unwrap();
}

/// The kernel IR is size-free: softmax at another batch and row length lowers to equal
/// kernels.
#[test]
fn row_kernels_do_not_depend_on_sizes() {
    let a = lowered(&softmax(DType::F32, &[64, 300]));
    let b = lowered(&softmax(DType::F32, &[7, 5000]));
    assert_eq!(a.kernels, b.kernels);
}

/// Softmax over axis 1 of `transpose(x)`: a row of the transposed value is a column of x.
fn transposed_softmax(shape: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("transposed_softmax");
    let x = b.input("x", DType::F32, shape);
    let t = b.op_with(
        "t",
        "transpose",
        &[&x],
        &[("perm", AttrValue::Ints(vec![1, 0]))],
    );
    let m = last_axis(&mut b, "m", "reduce_max", &t);
    let d = b.op("d", "sub", &[&t, &m]);
    let e = b.op("e", "exp", &[&d]);
    let s = last_axis(&mut b, "s", "sum", &e);
    let y = b.op("y", "div", &[&e, &s]);
    b.finish(&[&y])
}

/// Reductions over the rows of a transposed view (the columns of `x`) walk 16 rows at a time,
/// 256 elements of each in turn, or 16 where the stride is a multiple of 4 KiB
/// (`Kernel::row_tiles`, `tile_columns`). Row counts that leave a partial last tile, rows of
/// several chunks and of less than one, steps of both lengths, one and two threads, sums,
/// means, maxima and an integer sum, with the gathered value stored beside them and NaN and
/// ±Inf planted: every element agrees with the reference, and the kernels reading by a stride
/// are tiled, choosing the step from the stride.
#[test]
fn reductions_over_strided_rows_walk_tiles_and_match_the_reference() {
    for (seed, shape, dtype) in [
        (31, [1000, 41], DType::F32),
        (32, [37, 600], DType::F32),
        (33, [5, 3], DType::F32),
        (34, [700, 50], DType::I32),
        // Rows 4 KiB and 8 KiB apart: steps of 16, the last one partial (300 = 18 · 16 + 12).
        (35, [300, 1024], DType::F32),
        (36, [70, 2048], DType::I32),
    ] {
        let mut b = GraphBuilder::new("strided_rows");
        let x = b.input("x", dtype, &shape);
        let t = b.op_with(
            "t",
            "transpose",
            &[&x],
            &[("perm", AttrValue::Ints(vec![1, 0]))],
        );
        let s = last_axis(&mut b, "s", "sum", &t);
        let m = last_axis(&mut b, "m", "reduce_max", &t);
        let graph = if dtype == DType::I32 {
            b.finish(&[&s, &m])
        } else {
            let mean = last_axis(&mut b, "mean", "mean", &t);
            let tt = b.op("tt", "mul", &[&t, &t]);
            b.finish(&[&s, &m, &mean, &tt])
        };
        agrees(&graph, seed, dtype != DType::I32)
            .unwrap_or_else(|e| panic!("{shape:?} {dtype}: {e}"));
        let program = lowered(&graph);
        let strided: Vec<&fusebox::lower::ir::KernelIr> = program
            .kernels
            .iter()
            .filter(|k| {
                !k.reductions.is_empty()
                    && k.loads
                        .iter()
                        .any(|v| v.axes[k.rank - 1] == fusebox::lower::ir::Axis::Strided)
            })
            .collect();
        assert!(
            !strided.is_empty(),
            "{shape:?}: no reduction reads x by a stride"
        );
        for ir in strided {
            let text = fusebox::backend::cpu::emit::emit_kernel(ir, "k");
            assert!(
                text.contains("for (int64_t ob = 0; ob < outer; ob += 16)"),
                "{text}"
            );
            assert!(
                text.contains("const int64_t tc = (s0_1 * 4) % 4096 == 0 ? 16 : 256;"),
                "{text}"
            );
        }
    }
}

/// Both forms the cost model chooses between for a transposed softmax match the reference:
/// under the cpu profile's read prices the transpose is gathered once (with the row max) and a
/// row kernel reads it contiguously; with strided reads priced free it is one row kernel
/// reading x through the transposed view on every pass. (x is 1.2 MB: over the cpu profile's
/// `cache_bytes`, under which a strided read is free.)
#[test]
fn a_transposed_softmax_matches_the_reference_gathered_or_viewed() {
    let graph = transposed_softmax(&[600, 512]);
    let gathered = rules();
    let mut viewed = rules().clone();
    let cpu = viewed.cost.profile("cpu").unwrap().clone();
    viewed
        .cost
        .load_str(
            &format!(
                r#"Cost(profiles: {{"cpu": Profile(bandwidth_gbps: {}, launch_us: {}, pointwise_gflops: {},
                    matmul_gflops: {{"f32": 150.0}}, reads: Reads(strided: 0.0, rows_reread: true))}})"#,
                cpu.bandwidth_gbps, cpu.launch_us, cpu.pointwise_gflops
            ),
            "cost.ron",
        )
        .unwrap();
    for (rules, kernels, row_passes) in [(gathered, 2, vec![2]), (&viewed, 1, vec![3])] {
        let out = optimize(&graph, rules, &Options::default()).unwrap();
        assert_eq!(out.partition.kernels.len(), kernels);
        let program = lower::lower(&out.dag, &out.partition).unwrap();
        assert_eq!(row_kernels(&program), row_passes);
        for seed in 0..3 {
            agrees_under(&graph, rules, seed, seed == 2).unwrap();
        }
    }
}

/// `Rows` is data: with `Reduction: End` in fusion.ron, softmax is three kernels again.
#[test]
fn fusion_ron_decides_whether_rows_fuse() {
    let mut rules = rules().clone();
    let text = fusebox::rules::fusion::DEFAULT_FUSION.replace("Reduction: Rows", "Reduction: End");
    rules.fusion = fusebox::rules::FusionRules::load_str(&text, "fusion.ron", &rules.ops).unwrap();
    let out = optimize(
        &softmax(DType::F32, &[64, 300]),
        &rules,
        &Options::default(),
    )
    .unwrap();
    assert_eq!(out.partition.kernels.len(), 3);
}

// --- Random graphs with row reductions feeding consumers ------------------------------------

/// One step of a random row graph over `[n, m]` values.
#[derive(Debug, Clone)]
enum RowStep {
    Unary(&'static str, usize),
    Binary(&'static str, usize, usize),
    /// A keepdim reduction of the last axis.
    Reduce(&'static str, usize),
}

fn row_step() -> BoxedStrategy<RowStep> {
    let v = 0usize..64;
    prop_oneof![
        2 => (0..4usize, v.clone()).prop_map(|(o, a)| RowStep::Unary(["exp", "neg", "tanh", "abs"][o], a)),
        3 => (0..4usize, v.clone(), v.clone())
            .prop_map(|(o, a, b)| RowStep::Binary(["add", "sub", "mul", "max"][o], a, b)),
        3 => (0..3usize, v).prop_map(|(o, a)| RowStep::Reduce(["sum", "mean", "reduce_max"][o], a)),
    ]
    .boxed()
}

/// Builds a graph over inputs `[n, m]`, `[n, 1]` and `[m]` of `dtype`, keeping the steps
/// that type-check; outputs are the last two values.
fn build_rows(dims: (usize, usize), dtype: DType, steps: &[RowStep]) -> Option<Graph> {
    let catalogue = &rules().ops;
    let mut b = GraphBuilder::new("rows");
    let mut values = vec![
        b.input("x", dtype, &[dims.0, dims.1]),
        b.input("r", dtype, &[dims.0, 1]),
        b.input("c", dtype, &[dims.1]),
    ];
    for (k, step) in steps.iter().enumerate() {
        let name = format!("v{k}");
        let pick = |i: usize| values[i % values.len()].clone();
        let mut trial = b.clone();
        match step {
            RowStep::Unary(op, a) => {
                trial.op(&name, op, &[&pick(*a)]);
            }
            RowStep::Binary(op, a, c) => {
                trial.op(&name, op, &[&pick(*a), &pick(*c)]);
            }
            RowStep::Reduce(op, a) => {
                last_axis(&mut trial, &name, op, &pick(*a));
            }
        }
        if graph::check(&trial.clone().finish(&[&name]), catalogue).is_ok() {
            b = trial;
            values.push(name);
        }
    }
    let n = values.len();
    if n <= 3 {
        return None;
    }
    let graph = b.finish(&[&values[n - 2], &values[n - 1]]);
    graph::check(&graph, catalogue).ok()?;
    Some(graph)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: random_graph::cases(64), ..ProptestConfig::default() })]

    /// Random graphs mixing row reductions, their consumers and broadcasts, over f32, f16
    /// and bf16, with rows of 0, 1 and many elements and NaN/Inf planted: fused (C and
    /// interpreter) equals the reference.
    #[test]
    fn random_row_graphs_match_the_reference(
        n in prop_oneof![Just(0usize), Just(1), 2usize..9],
        m in prop_oneof![Just(0usize), Just(1), 2usize..70],
        d in 0usize..3,
        steps in prop::collection::vec(row_step(), 1..10),
        seed in 0u64..1000,
        specials in any::<bool>(),
    ) {
        let dtype = [DType::F32, DType::F16, DType::BF16][d];
        if let Some(graph) = build_rows((n, m), dtype, &steps) {
            agrees(&graph, seed, specials).map_err(TestCaseError::fail)?;
        }
    }
}

/// The fused C outputs and the reference evaluator's for `graph` on the given inputs, each
/// output's values as f64, in `graph.outputs` order.
fn c_and_reference(graph: &Graph, inputs: &fusebox::eval::Tensors) -> Vec<(Vec<f64>, Vec<f64>)> {
    let rules = rules();
    let want = fusebox::eval::evaluate(graph, &rules.ops, inputs).expect("reference");
    let mut prepared = prepare(graph, rules, &Options::default(), compiler()).expect("prepare");
    let got = prepared.executable.run_tensors(inputs).expect("run");
    graph
        .outputs
        .iter()
        .map(|name| (got[name].values(), want[name].values()))
        .collect()
}

/// `(s, x - s)` with `s = sum(x)` over the last axis: a row kernel whose sum is an output.
fn row_sum(shape: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("row_sum");
    let x = b.input("x", DType::F32, shape);
    let s = last_axis(&mut b, "s", "sum", &x);
    let d = b.op("d", "sub", &[&x, &s]);
    b.finish(&[&s, &d])
}

fn f32_inputs(name: &str, shape: &[usize], values: Vec<f64>) -> fusebox::eval::Tensors {
    let tensor = fusebox::tensor::Tensor::from_values(DType::F32, shape, values).expect("tensor");
    [(name.to_string(), tensor)].into_iter().collect()
}

/// The CPU row kernels add a float row sum in f32 blocks of `SUM_BLOCK` values (16 per lane)
/// before an f64 total; `src/lower/ir.rs` states the bound `(15·2⁻²⁴ + n·2⁻⁵³)·Σ|x|` before
/// the result's rounding to f32. Long rows of positive values, of mixed signs and of values
/// spread over many binades, checked against sums computed here in f64 (plus an ulp for the
/// two roundings to f32, ours and the test's).
#[test]
fn float_row_sums_stay_within_the_stated_bound() {
    let n = 70_001;
    let rows = 4;
    let mut values = Vec::with_capacity(rows * n);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for r in 0..rows {
        for _ in 0..n {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let v = match r {
                0 => u,
                1 => 2.0 * u - 1.0,
                2 => (u * 40.0 - 20.0).exp2(),
                _ => 1.0 + u * 1e-3,
            };
            values.push(v as f32 as f64);
        }
    }
    let graph = row_sum(&[rows, n]);
    let inputs = f32_inputs("x", &[rows, n], values.clone());
    let outputs = c_and_reference(&graph, &inputs);
    let (got, want) = &outputs[0];
    for r in 0..rows {
        let row = &values[r * n..(r + 1) * n];
        let exact: f64 = row.iter().sum();
        let magnitude: f64 = row.iter().map(|v| v.abs()).sum();
        let bound = (15.0 * 2f64.powi(-24) + n as f64 * 2f64.powi(-53)) * magnitude
            + exact.abs() * 2f64.powi(-23);
        assert!(
            (got[r] - exact).abs() <= bound,
            "row {r}: {} vs exact {exact} (bound {bound})",
            got[r]
        );
        // The reference sums in f64 and rounds once: within half an ulp of the exact sum.
        assert!((want[r] - exact).abs() <= exact.abs() * 2f64.powi(-24) + 1e-30);
    }
    for (name, (got, want)) in graph.outputs.iter().zip(&outputs) {
        let a = fusebox::tensor::Tensor::from_values(DType::F32, &[got.len()], got.clone());
        let b = fusebox::tensor::Tensor::from_values(DType::F32, &[want.len()], want.clone());
        assert_same(name, &b.unwrap(), &a.unwrap()).unwrap();
    }
}

/// A block whose f32 partial sums overflow is summed again in f64: `3e38 + 3e38 - 3e38 -
/// 3e38` in one lane (elements 16 apart, in a first block otherwise zero, so that f64 loses
/// nothing either) is +Inf in f32 but 0 in f64, and the row's sum is then exactly that of its
/// small values, as the reference's; a row holding +Inf and -Inf is NaN, one holding +Inf is
/// +Inf.
#[test]
fn overflowing_f32_blocks_are_summed_again_in_f64() {
    let n = 700;
    let mut values = vec![0.0; 3 * n];
    for (j, v) in values.iter_mut().enumerate() {
        if j % n >= 256 {
            *v = (j % 7) as f64 * 0.25;
        }
    }
    for (k, big) in [3e38, 3e38, -3e38, -3e38].into_iter().enumerate() {
        values[16 * k] = big as f32 as f64;
    }
    values[n + 5] = f64::INFINITY;
    values[n + 600] = f64::NEG_INFINITY;
    values[2 * n + 40] = f64::INFINITY;
    let graph = row_sum(&[3, n]);
    let inputs = f32_inputs("x", &[3, n], values.clone());
    let outputs = c_and_reference(&graph, &inputs);
    let (got, want) = &outputs[0];
    let small: f64 = values[256..n].iter().sum();
    assert_eq!(want[0], small, "the reference's own sum");
    assert_eq!(got[0], small, "row 0: the overflowing block summed in f64");
    assert!(got[1].is_nan() && want[1].is_nan(), "row 1: Inf - Inf");
    assert_eq!((got[2], want[2]), (f64::INFINITY, f64::INFINITY), "row 2");
}

/// `x / sum(w)` over rows: the division by the row's sum is a multiplication by its
/// reciprocal where the sum's magnitude is within [2⁻¹²⁶, 2¹²⁶], within 2⁻²³ of the quotient
/// relatively (`src/lower/ir.rs`), and a division where it is not (a subnormal sum, whose
/// reciprocal overflows; a huge one, whose reciprocal is subnormal; zero; Inf; NaN). Each
/// element against the reference's correctly rounded quotient.
#[test]
fn division_by_a_row_sum_is_within_the_stated_bound_and_exact_outside_its_range() {
    let n = 100;
    let sums = [
        3.0,
        1e-3,
        1e-40,
        1e-44,
        3e38,
        1e38,
        0.0,
        f64::INFINITY,
        f64::NAN,
        -7.5,
    ];
    let rows = sums.len();
    let mut w = vec![0.0; rows * n];
    let mut x = vec![0.0; rows * n];
    for (r, &s) in sums.iter().enumerate() {
        // One nonzero weight per row: the sum is exactly that value (as an f32).
        w[r * n + 3] = s;
        for j in 0..n {
            let t = j as f64 - 50.0;
            x[r * n + j] = match r % 3 {
                0 => t * 1.37e-3,
                1 => t * 3.1e30,
                _ => t * 1e-39,
            } as f32 as f64;
        }
    }
    let mut b = GraphBuilder::new("divide");
    let xs = b.input("x", DType::F32, &[rows, n]);
    let ws = b.input("w", DType::F32, &[rows, n]);
    let s = last_axis(&mut b, "s", "sum", &ws);
    let y = b.op("y", "div", &[&xs, &s]);
    let graph = b.finish(&[&y]);
    assert_eq!(lowered(&graph).groups, 1, "one row kernel");
    let mut inputs = f32_inputs("x", &[rows, n], x);
    inputs.extend(f32_inputs("w", &[rows, n], w));
    let outputs = c_and_reference(&graph, &inputs);
    let (got, want) = &outputs[0];
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan())
            || g == w
            || (g - w).abs() <= 1.5 * 2f64.powi(-23) * w.abs() + 2f64.powi(-149);
        assert!(ok, "element {i} (row sum {}): {g} vs {w}", sums[i / n]);
    }
}

/// Softmax over rows of huge and of tiny (subnormal) values: the row sum's blocks and the
/// reciprocal both at the edges of f32's range, against the reference.
#[test]
fn softmax_rows_of_huge_and_tiny_values_match_the_reference() {
    let n = 1000;
    let mut values = Vec::new();
    for r in 0..4 {
        for j in 0..n {
            let t = (j as f64 * 0.61803).fract() * 2.0 - 1.0;
            values.push(match r {
                0 => t * 3e38,
                1 => t * 1e-40,
                2 => t * 80.0,
                _ => t * 1e4,
            } as f32 as f64);
        }
    }
    let graph = softmax(DType::F32, &[4, n]);
    let inputs = f32_inputs("x", &[4, n], values);
    for (name, (got, want)) in graph.outputs.iter().zip(c_and_reference(&graph, &inputs)) {
        let a = fusebox::tensor::Tensor::from_values(DType::F32, &[got.len()], got);
        let b = fusebox::tensor::Tensor::from_values(DType::F32, &[want.len()], want);
        assert_same(name, &b.unwrap(), &a.unwrap()).unwrap();
    }
}

// --- fusion.ron's row_arithmetic: Relaxed (the default) and Exact ----------------------------

/// The default rules with fusion.ron's `row_arithmetic: Exact`, loaded the way a user's rule
/// directory is (a directory holding only that fusion.ron, laid over the defaults); loaded once,
/// since the tests run in parallel.
fn exact_rules() -> fusebox::rules::RuleSet {
    static RULES: OnceLock<fusebox::rules::RuleSet> = OnceLock::new();
    RULES
        .get_or_init(|| {
            let text = fusebox::rules::fusion::DEFAULT_FUSION
                .replace("row_arithmetic: Relaxed", "row_arithmetic: Exact");
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("rows-exact-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("fusion.ron"), text).unwrap();
            let rules = fusebox::rules::RuleSet::load_dir(&dir).expect("rule directory");
            std::fs::remove_dir_all(&dir).unwrap();
            rules
        })
        .clone()
}

/// `(s, x / s)` with `s = sum(x)` over the last axis, compiled under `rules` and run on `x`.
fn sum_and_quotient(
    rules: &fusebox::rules::RuleSet,
    shape: &[usize],
    x: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut b = GraphBuilder::new("normalize");
    let xs = b.input("x", DType::F32, shape);
    let s = last_axis(&mut b, "s", "sum", &xs);
    let y = b.op("y", "div", &[&xs, &s]);
    let graph = b.finish(&[&s, &y]);
    let inputs = f32_inputs("x", shape, x.to_vec());
    let mut prepared = prepare(&graph, rules, &Options::default(), compiler()).expect("prepare");
    assert_eq!(prepared.partition.kernels.len(), 1, "one row kernel");
    let got = prepared.executable.run_tensors(&inputs).expect("run");
    (got["s"].values(), got["y"].values())
}

/// Under `row_arithmetic: Exact` a row kernel's sum is the f64 sum rounded once to f32 and
/// each quotient is the correctly rounded f32 division, bit for bit. The rows (f32 values in
/// [2⁻¹⁰, 16) of either sign, 3,001 per row) are chosen so that every f64 partial sum is
/// exact in any order (the values are multiples of 2⁻³³ and the sums stay below 2¹⁷), so
/// the expected bits are computed here independently: the exact sum rounded to f32, then
/// `x / s` in f32. Under the default `Relaxed` the same kernel sums in f32 blocks and
/// multiplies by a reciprocal: within the stated bounds, and not the same bits (which is
/// what the setting changes).
#[test]
fn exact_row_arithmetic_reproduces_f64_sums_and_correctly_rounded_division() {
    let (rows, n) = (6, 3001);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut x = Vec::with_capacity(rows * n);
    for r in 0..rows {
        for _ in 0..n {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let magnitude = (u * 14.0 - 10.0).exp2();
            // Rows 0-3 positive, 4-5 of mixed signs.
            let sign = if r >= 4 && (state & 1) == 1 {
                -1.0
            } else {
                1.0
            };
            x.push((sign * magnitude) as f32 as f64);
        }
    }
    let shape = [rows, n];
    let exact = exact_rules();
    assert_eq!(
        exact.fusion.row_arithmetic,
        fusebox::rules::RowArithmetic::Exact
    );
    let (s, y) = sum_and_quotient(&exact, &shape, &x);
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let want_s = row.iter().sum::<f64>() as f32;
        assert_eq!(s[r] as f32, want_s, "row {r}: the f64 sum rounded once");
        for (j, &v) in row.iter().enumerate() {
            let want = v as f32 / want_s;
            assert_eq!(
                (y[r * n + j] as f32).to_bits(),
                want.to_bits(),
                "row {r}, element {j}: the correctly rounded quotient"
            );
        }
    }
    let (rs, ry) = sum_and_quotient(rules(), &shape, &x);
    let mut differ = 0;
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let sum: f64 = row.iter().sum();
        let magnitude: f64 = row.iter().map(|v| v.abs()).sum();
        let bound = (15.0 * 2f64.powi(-24) + n as f64 * 2f64.powi(-53)) * magnitude
            + sum.abs() * 2f64.powi(-24);
        assert!((rs[r] - sum).abs() <= bound, "row {r}: {} vs {sum}", rs[r]);
        for (j, &v) in row.iter().enumerate() {
            // Against the quotient by the relaxed kernel's own (rounded) sum: 2⁻²³.
            let q = v / rs[r];
            let got = ry[r * n + j];
            assert!(
                (got - q).abs() <= 2f64.powi(-23) * q.abs(),
                "row {r}, element {j}: {got} vs {q}"
            );
            differ += usize::from(got.to_bits() != y[r * n + j].to_bits());
        }
    }
    assert!(
        differ > 0,
        "relaxed and exact arithmetic gave the same bits"
    );
}

/// Switching `row_arithmetic` changes the IR of row kernels only: their emitted C (exact:
/// no reciprocal, no f32 block sums; relaxed: both) and therefore their cache key, while a
/// kernel without row reductions emits the same C, under the same name, either way.
#[test]
fn row_arithmetic_changes_the_emitted_c_and_the_cache_key_of_row_kernels_only() {
    let program = |rules: &fusebox::rules::RuleSet, graph: &Graph| {
        let out = optimize(graph, rules, &Options::default()).expect("optimize");
        lower::lower(&out.dag, &out.partition).expect("lower")
    };
    let relaxed = rules();
    let exact = exact_rules();
    let graph = softmax(DType::F32, &[64, 300]);
    let (a, b) = (program(relaxed, &graph), program(&exact, &graph));
    use fusebox::lower::ir::RowArithmetic;
    assert_eq!(a.kernels[0].row_arithmetic, RowArithmetic::Relaxed);
    assert_eq!(b.kernels[0].row_arithmetic, RowArithmetic::Exact);
    let (ca, _) = fusebox::backend::cpu::module_source(&a);
    let (cb, _) = fusebox::backend::cpu::module_source(&b);
    // The reciprocal's flag `rk…` and the f32 block accumulators `vf…`.
    assert!(
        ca.contains("int rk") && ca.contains("_mm512_add_ps(vf"),
        "relaxed:\n{ca}"
    );
    assert!(
        !cb.contains("int rk") && !cb.contains("_mm512_add_ps(vf"),
        "exact:\n{cb}"
    );
    let key = |source: &str| compiler().key(source).expect("cache key");
    assert_ne!(key(&ca), key(&cb));
    // A pointwise kernel: the same kernel, the same text, the same key.
    let mut g = GraphBuilder::new("pointwise");
    let x = g.input("x", DType::F32, &[8, 33]);
    let t = g.op("t", "tanh", &[&x]);
    let e = g.op("e", "exp", &[&t]);
    let pointwise = g.finish(&[&e]);
    let (pa, pb) = (program(relaxed, &pointwise), program(&exact, &pointwise));
    assert_eq!(pa.kernels, pb.kernels);
    assert_eq!(
        fusebox::backend::cpu::module_source(&pa).0,
        fusebox::backend::cpu::module_source(&pb).0
    );
}

/// Exact row kernels still agree with the reference evaluator on softmax, layernorm and
/// log-softmax, special values included (the relaxed ones are checked above).
#[test]
fn exact_row_kernels_match_the_reference() {
    let rules = exact_rules();
    for (graph, seed) in [
        (softmax(DType::F32, &[16, 700]), 3),
        (layernorm(DType::F32, &[16, 257], true), 4),
        (log_softmax(DType::F32, &[9, 1000]), 5),
    ] {
        for specials in [false, true] {
            let inputs = random_graph::inputs(&graph, seed, specials);
            let want = fusebox::eval::evaluate(&graph, &rules.ops, &inputs).expect("reference");
            let mut prepared =
                prepare(&graph, &rules, &Options::default(), compiler()).expect("prepare");
            let got = prepared.executable.run_tensors(&inputs).expect("run");
            for name in &graph.outputs {
                assert_same(name, &want[name], &got[name]).unwrap();
            }
        }
    }
}

// --- The exp of relaxed row kernels --------------------------------------------------------

/// The error of `got` against `want` (an f64 `exp`, accurate to far below an f32 ulp) in
/// units of the f32 ulp at `want` (2⁻¹⁴⁹ below the normal range). Infinite where `got` is
/// NaN or infinite and `want` is not, or the other way round.
fn ulps(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if (want as f32).is_infinite() || got.is_infinite() {
        return if got as f64 == want as f32 as f64 {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let exponent = if want == 0.0 {
        -149
    } else {
        (((want.to_bits() >> 52) & 0x7ff) as i32 - 1023 - 23).max(-149)
    };
    (got as f64 - want).abs() / 2f64.powi(exponent)
}

/// Float inputs for an `exp` sweep: every 521st f32 bit pattern from 0 to 89 and from -0 to
/// -104 (about 4.3 million, the whole range where exp is finite and not 0, with subnormal
/// results), then the edges: ±0, ±Inf, NaN, the overflow threshold 88.72283… and its
/// neighbours, the last values with a nonzero (subnormal) result near -103.972…, the end of
/// the normal range -87.336…, huge inputs and subnormal ones. Padded with zeros to whole rows
/// of `n`.
fn exp_sweep(n: usize) -> Vec<f64> {
    let mut x = Vec::new();
    for (start, end) in [(0u32, 89f32.to_bits()), (0x8000_0000, (-104f32).to_bits())] {
        let mut u = start;
        while u <= end {
            x.push(f32::from_bits(u) as f64);
            u += 521;
        }
    }
    let threshold = 88.722_84_f32;
    for v in [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        threshold,
        f32::from_bits(threshold.to_bits() - 1),
        f32::from_bits(threshold.to_bits() + 1),
        -103.972_08,
        -103.972_084,
        -103.972_09,
        -87.336_54,
        -87.336_55,
        1e30,
        -1e30,
        f32::from_bits(1),
        -f32::from_bits(1),
        89.0,
        -104.0,
    ] {
        x.push(v as f64);
    }
    x.resize(x.len().div_ceil(n) * n, 0.0);
    x
}

/// The worst error in ulps of `got` against f64 `exp` of `x`, and where.
fn worst_exp_error(x: &[f64], got: &[f64]) -> (f64, f64) {
    let mut worst = (0.0, 0.0);
    for (&x, &g) in x.iter().zip(got) {
        let e = ulps(g as f32, x.exp());
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

/// The `exp` of a relaxed row kernel's vector loops (`fbv_expf_row`: degree 5) is within
/// the 2.5 ulp the IR contract states, over a sweep of 4.3 million inputs with every special
/// value; the pointwise kernels' `exp` (and an exact row kernel's, which is the same) within
/// 1.05 ulp. Each is checked against f64 `exp` computed here. The row kernel is
/// `e = exp(x); y = e / sum(e)` with `e` written out.
#[test]
fn row_kernel_exp_stays_within_its_stated_ulp_bound() {
    let n = 4096;
    let x = exp_sweep(n);
    let rows = x.len() / n;
    let shape = [rows, n];
    let mut b = GraphBuilder::new("exp_rows");
    let xs = b.input("x", DType::F32, &shape);
    let e = b.op("e", "exp", &[&xs]);
    let s = last_axis(&mut b, "s", "sum", &e);
    let y = b.op("y", "div", &[&e, &s]);
    let row_graph = b.finish(&[&e, &y]);
    let mut b = GraphBuilder::new("exp");
    let xs = b.input("x", DType::F32, &shape);
    let e = b.op("e", "exp", &[&xs]);
    let pointwise = b.finish(&[&e]);
    let inputs = f32_inputs("x", &shape, x.clone());
    let run = |graph: &Graph, rules: &fusebox::rules::RuleSet| {
        let mut prepared = prepare(graph, rules, &Options::default(), compiler()).expect("prepare");
        assert_eq!(prepared.partition.kernels.len(), 1);
        prepared.executable.run_tensors(&inputs).expect("run")["e"].values()
    };
    let relaxed = run(&row_graph, rules());
    let exact = run(&row_graph, &exact_rules());
    let plain = run(&pointwise, rules());
    let (worst, at) = worst_exp_error(&x, &relaxed);
    assert!(worst <= 2.5, "relaxed row exp: {worst} ulp at {at:e}");
    let (worst, at) = worst_exp_error(&x, &plain);
    assert!(worst <= 1.05, "pointwise exp: {worst} ulp at {at:e}");
    assert!(
        exact
            .iter()
            .zip(&plain)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "an exact row kernel's exp is the pointwise one"
    );
    if std::is_x86_feature_detected!("avx512f") {
        let differ = relaxed
            .iter()
            .zip(&plain)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert!(differ > 0, "the relaxed row kernel used the pointwise exp");
    }
}

/// A last pass that runs one row late (softmax's) streams its stores past the cache on large
/// launches; a last pass in place (layernorm's, which reads `x` again) stores its row in one
/// burst and stores normally, where streaming measured slower (book, performance chapter,
/// "Ordinary stores for a last pass in place"). Both still agree with the reference on
/// launches large enough to stream.
#[test]
fn only_lagged_last_passes_stream_their_stores() {
    use fusebox::backend::cpu::emit::{emit_kernel, kernel_name};
    let source = |graph: &Graph| {
        let program = lowered(graph);
        let ir = &program.kernels[0];
        emit_kernel(ir, &kernel_name(ir))
    };
    let softmax_c = source(&softmax(DType::F32, &[64, 4096]));
    assert!(
        softmax_c.contains("l_st = st;"),
        "softmax lags its last pass"
    );
    assert!(
        softmax_c.contains("const int st = fbs && "),
        "the lagged last pass streams"
    );
    let layernorm_c = source(&layernorm(DType::F32, &[64, 4096], true));
    assert!(
        !layernorm_c.contains("l_st"),
        "layernorm's last pass is in place"
    );
    assert!(
        layernorm_c.contains("const int st = 0;") && !layernorm_c.contains("const int st = fbs"),
        "a last pass in place stores normally"
    );
    // 2049 rows of 4099: 32.1 MiB in and out, over the streaming threshold.
    agrees(&layernorm(DType::F32, &[2049, 4099], true), 31, true).unwrap();
}
