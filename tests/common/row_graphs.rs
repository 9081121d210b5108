//! The row-reduction graphs several test files build: softmax, log-softmax and layernorm over
//! the last axis, written op by op as a framework's graph would hold them.

use fusebox::attr::AttrValue;
use fusebox::dtype::DType;
use fusebox::graph::{Graph, GraphBuilder};

/// `op(x, axes = [-1], keepdim)`.
pub fn last_axis(b: &mut GraphBuilder, name: &str, op: &str, x: &str) -> String {
    b.op_with(
        name,
        op,
        &[x],
        &[
            ("axes", AttrValue::Ints(vec![-1])),
            ("keepdim", true.into()),
        ],
    )
}

/// `e / sum(e)` with `e = exp(x - max(x))`, over the last axis.
pub fn softmax(dtype: DType, shape: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("softmax");
    let x = b.input("x", dtype, shape);
    let y = softmax_of(&mut b, &x);
    b.finish(&[&y])
}

/// [`softmax`]'s ops over `x` (named `m`, `d`, `e`, `s`, `y`); returns `y`.
pub fn softmax_of(b: &mut GraphBuilder, x: &str) -> String {
    let m = last_axis(b, "m", "reduce_max", x);
    let d = b.op("d", "sub", &[x, &m]);
    let e = b.op("e", "exp", &[&d]);
    let s = last_axis(b, "s", "sum", &e);
    b.op("y", "div", &[&e, &s])
}

/// `d - log(sum(exp(d)))` with `d = x - max(x)`, over the last axis.
pub fn log_softmax(dtype: DType, shape: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("log_softmax");
    let x = b.input("x", dtype, shape);
    let y = log_softmax_of(&mut b, &x);
    b.finish(&[&y])
}

/// [`log_softmax`]'s ops over `x` (named `m`, `d`, `e`, `s`, `l`, `y`); returns `y`.
pub fn log_softmax_of(b: &mut GraphBuilder, x: &str) -> String {
    let m = last_axis(b, "m", "reduce_max", x);
    let d = b.op("d", "sub", &[x, &m]);
    let e = b.op("e", "exp", &[&d]);
    let s = last_axis(b, "s", "sum", &e);
    let l = b.op("l", "log", &[&s]);
    b.op("y", "sub", &[&d, &l])
}

/// `(x - mean) * rsqrt(var + 1e-5)` over the last axis, then `* w + b` when `affine`.
pub fn layernorm(dtype: DType, shape: &[usize], affine: bool) -> Graph {
    let mut b = GraphBuilder::new("layernorm");
    let x = b.input("x", dtype, shape);
    let last = *shape.last().expect("rank ≥ 1");
    let (w, bias) = if affine {
        (
            Some(b.input("w", dtype, &[last])),
            Some(b.input("b", dtype, &[last])),
        )
    } else {
        (None, None)
    };
    let y = layernorm_of(&mut b, &x, dtype, w.as_deref().zip(bias.as_deref()));
    b.finish(&[&y])
}

/// [`layernorm`]'s ops over `x` of `dtype` (named `mean`, `c`, `sq`, `var`, `eps`, `ve`, `r`,
/// `n`, and `s`, `y` with an affine `(weight, bias)`); returns the result.
pub fn layernorm_of(
    b: &mut GraphBuilder,
    x: &str,
    dtype: DType,
    affine: Option<(&str, &str)>,
) -> String {
    let mean = last_axis(b, "mean", "mean", x);
    let c = b.op("c", "sub", &[x, &mean]);
    let sq = b.op("sq", "mul", &[&c, &c]);
    let var = last_axis(b, "var", "mean", &sq);
    let eps = b.constant("eps", 1e-5, dtype);
    let ve = b.op("ve", "add", &[&var, &eps]);
    let r = b.op("r", "rsqrt", &[&ve]);
    let mut y = b.op("n", "mul", &[&c, &r]);
    if let Some((w, bias)) = affine {
        let s = b.op("s", "mul", &[&y, w]);
        y = b.op("y", "add", &[&s, bias]);
    }
    y
}

/// A softmax of logits capped by `cap · tanh(x / cap)` (Gemma's logit soft-capping, cap 30),
/// over the last axis; with `logits`, the capped logits are an output too. Its row kernel's
/// first pass computes the capped logits for the maximum and keeps them for the sum's pass
/// (and for the last, when stored), which keeps `exp` for the last.
pub fn softcapped_softmax(dtype: DType, shape: &[usize], logits: bool) -> Graph {
    let mut b = GraphBuilder::new("softcapped_softmax");
    let x = b.input("x", dtype, shape);
    let cap = b.constant("cap", 30.0, dtype);
    let xs = b.op("xs", "div", &[&x, &cap]);
    let t = b.op("t", "tanh", &[&xs]);
    let tc = b.op("tc", "mul", &[&t, &cap]);
    let y = softmax_of(&mut b, &tc);
    if logits {
        b.finish(&[&y, &tc])
    } else {
        b.finish(&[&y])
    }
}

/// `layernorm(gelu(x))` with an affine over the last axis: the first pass computes the gelu
/// (an `erf` per element) for the mean and keeps it for the variance's pass.
pub fn layernorm_of_gelu(dtype: DType, shape: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("layernorm_of_gelu");
    let x = b.input("x", dtype, shape);
    let last = *shape.last().expect("rank ≥ 1");
    let w = b.input("w", dtype, &[last]);
    let bias = b.input("b", dtype, &[last]);
    let g = b.op("g", "gelu", &[&x]);
    let y = layernorm_of(&mut b, &g, dtype, Some((&w, &bias)));
    b.finish(&[&y])
}

/// Reductions of nothing: over `[3, 0]` rows a sum, a mean, a max and a min (-max(-x)) (kept, and read
/// by pointwise ops), and a column max over `[0, 4]`.
pub fn empty_reductions(dtype: DType) -> Graph {
    let mut b = GraphBuilder::new("empty");
    let x = b.input("x", dtype, &[3, 0]);
    let s = last_axis(&mut b, "s", "sum", &x);
    let m = last_axis(&mut b, "m", "mean", &x);
    let top = last_axis(&mut b, "top", "reduce_max", &x);
    // reduce_min, as the composite writes it.
    let negated = b.op("n", "neg", &[&x]);
    let low = last_axis(&mut b, "nm", "reduce_max", &negated);
    let low = b.op("low", "neg", &[&low]);
    let d = b.op("d", "sub", &[&x, &s]);
    let e = b.op("e", "add", &[&m, &s]);
    let f = b.op("f", "sub", &[&x, &top]);
    let columns = b.input("c", dtype, &[0, 4]);
    let axis0 = [("axes", AttrValue::Ints(vec![0]))];
    let column_max = b.op_with("cm", "reduce_max", &[&columns], &axis0);
    b.finish(&[&d, &s, &e, &top, &low, &f, &column_max])
}
