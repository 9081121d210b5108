//! Graphs whose kernels read concats by ranges, shared by the CPU suites, the CUDA emulation
//! and the GPU tests: each is built to reach one way a kernel runs a concat's pieces (per
//! segment, in the loop nest, per row, along the rows) or the clamped form.

use super::row_graphs;
use fusebox::attr::AttrValue;
use fusebox::dtype::DType;
use fusebox::graph::{Graph, GraphBuilder};

/// Concats reduced in their kernel along other axes than the concat's, which run as pieces
/// (each piece reduces the outputs of its own segment): column sums of a concat along the
/// inner axis; a keepdim mean and a max of the rows of a concat along the outer axis (with an
/// empty and a one-row segment), beside a pointwise result of the same kernel; and f16 rank-3
/// `sum_to_size` over the leading axis of a concat along the last.
pub fn reductions_of_concats() -> Vec<Graph> {
    let mut graphs = Vec::new();
    let mut b = GraphBuilder::new("column_sums");
    let a = b.input("a", DType::F32, &[64, 8]);
    let c = b.input("c", DType::F32, &[64, 24]);
    let ta = b.op("ta", "tanh", &[&a]);
    let ec = b.op("ec", "erf", &[&c]);
    let cat = b.op_with("cat", "concat", &[&ta, &ec], &[("axis", AttrValue::Int(1))]);
    b.op_with("s", "sum", &[&cat], &[("axes", AttrValue::Ints(vec![0]))]);
    graphs.push(b.finish(&["s"]));

    let mut b = GraphBuilder::new("row_mean_and_max");
    let a = b.input("a", DType::F32, &[5, 33]);
    let e = b.input("e", DType::F32, &[0, 33]);
    let one = b.input("one", DType::F32, &[1, 33]);
    let c = b.input("c", DType::F32, &[7, 33]);
    let ea = b.op("ea", "exp", &[&a]);
    let te = b.op("te", "tanh", &[&e]);
    let tc = b.op("tc", "tanh", &[&c]);
    let cat = b.op_with(
        "cat",
        "concat",
        &[&ea, &te, &one, &tc],
        &[("axis", AttrValue::Int(0))],
    );
    row_graphs::last_axis(&mut b, "m", "mean", &cat);
    b.op_with(
        "x",
        "reduce_max",
        &[&cat],
        &[("axes", AttrValue::Ints(vec![-1]))],
    );
    b.op("r", "relu", &[&cat]);
    graphs.push(b.finish(&["m", "x", "r"]));

    let mut b = GraphBuilder::new("half_sum_to_size");
    let a = b.input("a", DType::F16, &[3, 4, 5]);
    let c = b.input("c", DType::F16, &[3, 4, 2]);
    let sa = b.op("sa", "sigmoid", &[&a]);
    let nc = b.op("nc", "neg", &[&c]);
    let cat = b.op_with(
        "cat",
        "concat",
        &[&sa, &nc],
        &[("axis", AttrValue::Int(-1))],
    );
    b.op_with(
        "s",
        "sum_to_size",
        &[&cat],
        &[("shape", AttrValue::Ints(vec![4, 7]))],
    );
    graphs.push(b.finish(&["s"]));
    graphs
}

/// `tanh(a)`, `exp(e)` (empty), `one` (one long) and `sigmoid(c)`, of the lengths `along` on
/// `axis` (0 or 1) and `across` on the other, joined along `axis`, then summed and averaged
/// (keepdim) along it, beside `relu` of the concat.
pub fn four_segments_summed(name: &str, axis: usize, along: [usize; 4], across: usize) -> Graph {
    let shape = |len: usize| {
        if axis == 0 {
            [len, across]
        } else {
            [across, len]
        }
    };
    let mut b = GraphBuilder::new(name);
    let a = b.input("a", DType::F32, &shape(along[0]));
    let e = b.input("e", DType::F32, &shape(along[1]));
    let one = b.input("one", DType::F32, &shape(along[2]));
    let c = b.input("c", DType::F32, &shape(along[3]));
    let ta = b.op("ta", "tanh", &[&a]);
    let ee = b.op("ee", "exp", &[&e]);
    let sc = b.op("sc", "sigmoid", &[&c]);
    let axis = axis as i64;
    let cat = b.op_with(
        "cat",
        "concat",
        &[&ta, &ee, &one, &sc],
        &[("axis", AttrValue::Int(axis))],
    );
    b.op_with(
        "s",
        "sum",
        &[&cat],
        &[("axes", AttrValue::Ints(vec![axis]))],
    );
    b.op_with(
        "m",
        "mean",
        &[&cat],
        &[
            ("axes", AttrValue::Ints(vec![axis])),
            ("keepdim", AttrValue::Bool(true)),
        ],
    );
    b.op("r", "relu", &[&cat]);
    b.finish(&["s", "m", "r"])
}

/// Concats reduced in their kernel along the concat's own axis, which run as pieces chosen
/// inside the kernel's loop nest (`lower::split::split_in_nest`). Along an outer axis, a piece
/// per row: column sums and keepdim column means of a batch concat with an empty and a
/// one-row segment, beside a pointwise result of the same kernel; a keepdim mean over the
/// first two axes and a max over the middle one of a rank-3 concat along the middle axis; an
/// f16 sum over every axis; a wrapping i32 sum; and two launches large enough for two
/// threads, one per accumulation strategy (per-thread partials for rows of 130, shared column
/// ranges for rows of 600).
/// Along the innermost axis, a loop per piece over each row segment: row sums and keepdim
/// row means of a feature concat with an empty and a one-column segment, beside a pointwise
/// result; an f16 sum over every axis; row maxima over two threads. Each comes with whether
/// its results must be the unfused program's bit for bit (outer axes: the same order of
/// accumulation).
pub fn reductions_along_a_concats_axis() -> Vec<(Graph, bool)> {
    let mut graphs = vec![four_segments_summed(
        "batch_column_sums",
        0,
        [5, 0, 1, 7],
        33,
    )];

    let mut b = GraphBuilder::new("middle_mean_and_max");
    let a = b.input("a", DType::F32, &[2, 3, 40]);
    let c = b.input("c", DType::F32, &[2, 5, 40]);
    let sa = b.op("sa", "sigmoid", &[&a]);
    let nc = b.op("nc", "neg", &[&c]);
    let cat = b.op_with("cat", "concat", &[&sa, &nc], &[("axis", AttrValue::Int(1))]);
    b.op_with(
        "m",
        "mean",
        &[&cat],
        &[
            ("axes", AttrValue::Ints(vec![0, 1])),
            ("keepdim", AttrValue::Bool(true)),
        ],
    );
    b.op_with(
        "x",
        "reduce_max",
        &[&cat],
        &[("axes", AttrValue::Ints(vec![1]))],
    );
    graphs.push(b.finish(&["m", "x"]));

    let mut b = GraphBuilder::new("half_total");
    let a = b.input("a", DType::F16, &[4, 9]);
    let c = b.input("c", DType::F16, &[3, 9]);
    let ea = b.op("ea", "exp", &[&a]);
    let cat = b.op_with("cat", "concat", &[&ea, &c], &[("axis", AttrValue::Int(0))]);
    b.op_with(
        "s",
        "sum",
        &[&cat],
        &[("axes", AttrValue::Ints(vec![0, 1]))],
    );
    graphs.push(b.finish(&["s"]));

    let mut b = GraphBuilder::new("wrapping_integer_column_sums");
    let a = b.input("a", DType::I32, &[3, 20]);
    let c = b.input("c", DType::I32, &[2, 20]);
    let aa = b.op("aa", "add", &[&a, &a]);
    let cat = b.op_with("cat", "concat", &[&aa, &c], &[("axis", AttrValue::Int(0))]);
    b.op_with("s", "sum", &[&cat], &[("axes", AttrValue::Ints(vec![0]))]);
    graphs.push(b.finish(&["s"]));

    for (name, width, rows) in [
        ("threaded_partials", 130, [300, 200]),
        ("threaded_columns", 600, [40, 30]),
    ] {
        let mut b = GraphBuilder::new(name);
        let a = b.input("a", DType::F32, &[rows[0], width]);
        let c = b.input("c", DType::F32, &[rows[1], width]);
        let ta = b.op("ta", "tanh", &[&a]);
        let ec = b.op("ec", "exp", &[&c]);
        let cat = b.op_with("cat", "concat", &[&ta, &ec], &[("axis", AttrValue::Int(0))]);
        b.op_with("s", "sum", &[&cat], &[("axes", AttrValue::Ints(vec![0]))]);
        graphs.push(b.finish(&["s"]));
    }
    let mut graphs: Vec<(Graph, bool)> = graphs.into_iter().map(|g| (g, true)).collect();

    graphs.push((
        four_segments_summed("feature_row_sums", 1, [33, 0, 1, 40], 5),
        false,
    ));

    let mut b = GraphBuilder::new("half_feature_total");
    let a = b.input("a", DType::F16, &[3, 9]);
    let c = b.input("c", DType::F16, &[3, 20]);
    let ea = b.op("ea", "exp", &[&a]);
    let cat = b.op_with("cat", "concat", &[&ea, &c], &[("axis", AttrValue::Int(-1))]);
    b.op_with(
        "s",
        "sum",
        &[&cat],
        &[("axes", AttrValue::Ints(vec![0, 1]))],
    );
    graphs.push((b.finish(&["s"]), false));

    let mut b = GraphBuilder::new("threaded_feature_row_maxima");
    let a = b.input("a", DType::F32, &[300, 100]);
    let c = b.input("c", DType::F32, &[300, 70]);
    let ta = b.op("ta", "tanh", &[&a]);
    let ec = b.op("ec", "exp", &[&c]);
    let cat = b.op_with("cat", "concat", &[&ta, &ec], &[("axis", AttrValue::Int(1))]);
    b.op_with(
        "x",
        "reduce_max",
        &[&cat],
        &[("axes", AttrValue::Ints(vec![1]))],
    );
    graphs.push((b.finish(&["x"]), false));
    graphs
}

/// Row kernels over concats along an outer axis, which run as one row kernel per segment:
/// the softmax of the rows of a batch concat (segments of 3, 0, 1 and 2 rows of 64, an f16
/// operand promoted to f32, rows whole vectors for the CUDA vector path), with its row maxima
/// as a second output; layernorm with affine over a concat along the middle axis of rank-3
/// operands; and the f16 log-softmax of rows longer than 4096 (past the CUDA register and
/// shared-memory caches).
pub fn row_kernels_of_concats() -> Vec<Graph> {
    let mut graphs = Vec::new();
    let mut b = GraphBuilder::new("softmax_of_batch_concat");
    let a = b.input("a", DType::F32, &[3, 64]);
    let empty = b.input("empty", DType::F32, &[0, 64]);
    let half = b.input("half", DType::F16, &[1, 64]);
    let c = b.input("c", DType::F32, &[2, 64]);
    let ta = b.op("ta", "tanh", &[&a]);
    let sc = b.op("sc", "sigmoid", &[&c]);
    let cat = b.op_with(
        "cat",
        "concat",
        &[&ta, &empty, &half, &sc],
        &[("axis", AttrValue::Int(0))],
    );
    let y = row_graphs::softmax_of(&mut b, &cat);
    graphs.push(b.finish(&[&y, "m"]));

    let mut b = GraphBuilder::new("layernorm_of_middle_concat");
    let a = b.input("a", DType::F32, &[2, 3, 33]);
    let z = b.input("z", DType::F32, &[2, 1, 33]);
    let w = b.input("w", DType::F32, &[33]);
    let bias = b.input("bias", DType::F32, &[33]);
    let ea = b.op("ea", "exp", &[&a]);
    let cat = b.op_with("cat", "concat", &[&ea, &z], &[("axis", AttrValue::Int(1))]);
    let y = row_graphs::layernorm_of(&mut b, &cat, DType::F32, Some((&w, &bias)));
    graphs.push(b.finish(&[&y]));

    let mut b = GraphBuilder::new("long_f16_log_softmax_of_concat");
    let a = b.input("a", DType::F16, &[2, 4100]);
    let c = b.input("c", DType::F16, &[1, 4100]);
    let na = b.op("na", "neg", &[&a]);
    let cat = b.op_with("cat", "concat", &[&na, &c], &[("axis", AttrValue::Int(-2))]);
    let y = row_graphs::log_softmax_of(&mut b, &cat);
    graphs.push(b.finish(&[&y]));
    graphs
}

/// Row graphs over concats along the rows themselves, where one row's elements lie in
/// several segments: a softmax of `[tanh(a), c]` (segments of 5 and 7, inside one vector)
/// with its row maxima as a second output; layernorm with affine over four operands, one of
/// them empty and one a single column, rows of 61 (segment ends off the 16-lane vectors); an
/// f16 operand beside an f32 one under a log-softmax (the C vector loops read only f32
/// operands under a mask); a rank-3 softmax of a biased operand; and rows of 4200 (past the
/// CUDA register and shared-memory caches) whose segments meet at 4000. Two graphs have
/// segments of whole 4-lane vectors (64 and 32 columns), which CUDA's vector path takes: the
/// softmax of `[tanh(a), c]` (its operands cached, each vector loaded only inside its
/// segment), and a softmax gated by `[u, w]`, whose operands the last pass alone reads
/// (loaded per vector, not cached).
pub fn row_kernels_of_row_concats() -> Vec<Graph> {
    let mut graphs = Vec::new();
    let mut b = GraphBuilder::new("softmax_of_row_concat");
    let a = b.input("a", DType::F32, &[4, 5]);
    let c = b.input("c", DType::F32, &[4, 7]);
    let ta = b.op("ta", "tanh", &[&a]);
    let cat = b.op_with("cat", "concat", &[&ta, &c], &[("axis", AttrValue::Int(1))]);
    let y = row_graphs::softmax_of(&mut b, &cat);
    graphs.push(b.finish(&[&y, "m"]));

    let mut b = GraphBuilder::new("layernorm_of_four_row_segments");
    let a = b.input("a", DType::F32, &[3, 20]);
    let empty = b.input("empty", DType::F32, &[3, 0]);
    let one = b.input("one", DType::F32, &[3, 1]);
    let k = b.input("k", DType::F32, &[3, 40]);
    let w = b.input("w", DType::F32, &[61]);
    let bias = b.input("bias", DType::F32, &[61]);
    let sk = b.op("sk", "sigmoid", &[&k]);
    let cat = b.op_with(
        "cat",
        "concat",
        &[&a, &empty, &one, &sk],
        &[("axis", AttrValue::Int(-1))],
    );
    let y = row_graphs::layernorm_of(&mut b, &cat, DType::F32, Some((&w, &bias)));
    graphs.push(b.finish(&[&y]));

    let mut b = GraphBuilder::new("log_softmax_of_half_and_float");
    let h = b.input("h", DType::F16, &[2, 17]);
    let c = b.input("c", DType::F32, &[2, 30]);
    let hf = b.op_with(
        "hf",
        "cast",
        &[&h],
        &[("dtype", AttrValue::DType(DType::F32))],
    );
    let cat = b.op_with("cat", "concat", &[&hf, &c], &[("axis", AttrValue::Int(1))]);
    let y = row_graphs::log_softmax_of(&mut b, &cat);
    graphs.push(b.finish(&[&y]));

    let mut b = GraphBuilder::new("softmax_of_biased_rank3_row_concat");
    let a = b.input("a", DType::F32, &[2, 3, 9]);
    let c = b.input("c", DType::F32, &[2, 3, 24]);
    let bias = b.input("bias", DType::F32, &[24]);
    let cb = b.op("cb", "add", &[&c, &bias]);
    let cat = b.op_with("cat", "concat", &[&a, &cb], &[("axis", AttrValue::Int(2))]);
    let y = row_graphs::softmax_of(&mut b, &cat);
    graphs.push(b.finish(&[&y]));

    let mut b = GraphBuilder::new("long_softmax_of_row_concat");
    let a = b.input("a", DType::F32, &[2, 4000]);
    let c = b.input("c", DType::F32, &[2, 200]);
    let nc = b.op("nc", "neg", &[&c]);
    let cat = b.op_with("cat", "concat", &[&a, &nc], &[("axis", AttrValue::Int(1))]);
    let y = row_graphs::softmax_of(&mut b, &cat);
    graphs.push(b.finish(&[&y]));

    let mut b = GraphBuilder::new("softmax_of_whole_vector_segments");
    let a = b.input("a", DType::F32, &[3, 64]);
    let c = b.input("c", DType::F32, &[3, 32]);
    let ta = b.op("ta", "tanh", &[&a]);
    let cat = b.op_with("cat", "concat", &[&ta, &c], &[("axis", AttrValue::Int(1))]);
    let y = row_graphs::softmax_of(&mut b, &cat);
    graphs.push(b.finish(&[&y]));

    let mut b = GraphBuilder::new("softmax_gated_by_whole_vector_segments");
    let x = b.input("x", DType::F32, &[3, 96]);
    let u = b.input("u", DType::F32, &[3, 64]);
    let w = b.input("w", DType::F32, &[3, 32]);
    let gate = b.op_with("gate", "concat", &[&u, &w], &[("axis", AttrValue::Int(1))]);
    let s = row_graphs::softmax_of(&mut b, &x);
    b.op("gated", "mul", &[&s, &gate]);
    graphs.push(b.finish(&["gated"]));
    graphs
}

/// Two concats along one axis whose segments coincide (64 and 32 columns each), which share
/// their launch ranges and so their pieces: `concat(tanh(a), b) * concat(c, exp(d))`, and the
/// row sums of that product (a reduction along the concats' axis, pieces chosen in the loop
/// nest or per point).
pub fn concats_alike() -> Vec<Graph> {
    let mut graphs = Vec::new();
    for summed in [false, true] {
        let name = if summed {
            "row_sums_of_two_concats_alike"
        } else {
            "two_concats_alike"
        };
        let mut b = GraphBuilder::new(name);
        let a = b.input("a", DType::F32, &[40, 64]);
        let bb = b.input("b", DType::F32, &[40, 32]);
        let c = b.input("c", DType::F32, &[40, 64]);
        let d = b.input("d", DType::F32, &[40, 32]);
        let ta = b.op("ta", "tanh", &[&a]);
        let ed = b.op("ed", "exp", &[&d]);
        let x = b.op_with("x", "concat", &[&ta, &bb], &[("axis", AttrValue::Int(1))]);
        let y = b.op_with("y", "concat", &[&c, &ed], &[("axis", AttrValue::Int(1))]);
        let z = b.op("z", "mul", &[&x, &y]);
        if summed {
            b.op_with("s", "sum", &[&z], &[("axes", AttrValue::Ints(vec![1]))]);
            graphs.push(b.finish(&["s"]));
        } else {
            graphs.push(b.finish(&[&z]));
        }
    }
    graphs
}
