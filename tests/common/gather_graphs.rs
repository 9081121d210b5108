//! Gather graphs for the gather tests of several suites: a `gather`, `gather_elements` or
//! `scatter_add` of random geometry (data of rank 1 to 3 with size-0 and size-1 axes, index
//! tensors of rank 0 to 2, every axis, negative axes), data of every dtype (every numeric one
//! for a scatter), i32 or i64 indices, read by a pointwise op, a row reduction and its
//! consumer, a sum over the leading axis, or nothing, and inputs whose indices are in range,
//! negative and out of range (a scatter's repeat, so that updates meet).

use fusebox::attr::AttrValue;
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::graph::{Graph, GraphBuilder};
use fusebox::tensor::Tensor;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

/// One gather graph's recipe.
#[derive(Debug, Clone)]
pub struct GatherRecipe {
    pub data: Vec<usize>,
    pub indices: Vec<usize>,
    /// Counted from the end when negative.
    pub axis: i64,
    pub elements: bool,
    /// With `elements`: a scatter_add of updates shaped like the indices into the data
    /// instead of a gather_elements.
    pub scatter: bool,
    /// With `scatter`: the indices have size 1 on every axis but the scattered one, one index
    /// serving its whole row of updates (an embedding gradient's form).
    pub spread: bool,
    pub dtype: DType,
    pub index_dtype: DType,
    /// What reads the gathered value.
    pub reader: Reader,
}

/// What reads a gather graph's gathered (or scattered) value `g`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// Nothing: `g` is the output.
    None,
    /// A pointwise op squares it (casts a bool one to f32); `g` is an output too.
    Square,
    /// Its mean along the last axis, subtracted from it (a row kernel when they fuse; the
    /// total for a rank-0 value), over `g` cast to f32; only the difference is an output.
    Rows,
    /// Its sum over the leading axis (every axis for a rank-0 value), over `g` cast to f32;
    /// only the sum is an output.
    Sum,
}

const READERS: [Reader; 4] = [Reader::None, Reader::Square, Reader::Rows, Reader::Sum];

const DATA_DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::Bool,
];

pub fn recipes() -> BoxedStrategy<GatherRecipe> {
    let size = prop_oneof![Just(0usize), Just(1), 2usize..6];
    (
        prop::collection::vec(size.clone(), 1..4),
        prop::collection::vec(size, 0..3),
        any::<u8>(),
        any::<bool>(),
        0..DATA_DTYPES.len(),
        any::<bool>(),
        0..READERS.len(),
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(data, indices, axis, elements, dtype, wide, reader, (scatter, spread))| {
                let rank = data.len() as i64;
                let axis = i64::from(axis) % (2 * rank) - rank;
                let resolved = axis.rem_euclid(rank) as usize;
                // gather_elements: data's rank, no larger than data off the axis.
                let indices = if elements {
                    data.iter()
                        .enumerate()
                        .map(|(d, &n)| match indices.get(d) {
                            Some(&m) if d == resolved => m,
                            Some(&m) => m.min(n),
                            None => n,
                        })
                        .collect()
                } else {
                    indices
                };
                let scatter = elements && scatter;
                // A scatter adds: no bool data.
                let dtype = match DATA_DTYPES[dtype] {
                    DType::Bool if scatter => DType::F32,
                    dtype => dtype,
                };
                GatherRecipe {
                    data,
                    indices,
                    axis,
                    elements,
                    scatter,
                    spread: scatter && spread,
                    dtype,
                    index_dtype: if wide { DType::I64 } else { DType::I32 },
                    reader: READERS[reader],
                }
            },
        )
        .boxed()
}

/// The graph of `recipe`: inputs `data` and `ids`, output `y` (and `g`, the gather itself,
/// when a consumer reads it).
pub fn build(recipe: &GatherRecipe) -> Graph {
    let mut b = GraphBuilder::new("gather");
    let data = b.input("data", recipe.dtype, &recipe.data);
    let mut index_shape = recipe.indices.clone();
    if recipe.spread {
        let rank = index_shape.len() as i64;
        let axis = recipe.axis.rem_euclid(rank) as usize;
        for (d, size) in index_shape.iter_mut().enumerate() {
            if d != axis {
                *size = (*size).min(1);
            }
        }
    }
    let ids = b.input("ids", recipe.index_dtype, &index_shape);
    let axis = [("axis", AttrValue::Int(recipe.axis))];
    let g = if recipe.scatter {
        let updates = b.input("updates", recipe.dtype, &recipe.indices);
        b.op_with("g", "scatter_add", &[&data, &ids, &updates], &axis)
    } else if recipe.elements {
        b.op_with("g", "gather_elements", &[&data, &ids], &axis)
    } else {
        b.op_with("g", "gather", &[&data, &ids], &axis)
    };
    let float = |b: &mut GraphBuilder| {
        let f32 = [("dtype", AttrValue::DType(DType::F32))];
        match recipe.dtype {
            DType::F32 => g.clone(),
            _ => b.op_with("x", "cast", &[&g], &f32),
        }
    };
    let rank = match recipe.elements {
        true => recipe.data.len(),
        false => recipe.data.len() - 1 + index_shape.len(),
    };
    match recipe.reader {
        Reader::None => b.finish(&[&g]),
        Reader::Square => {
            let y = if recipe.dtype == DType::Bool {
                b.op_with(
                    "y",
                    "cast",
                    &[&g],
                    &[("dtype", AttrValue::DType(DType::F32))],
                )
            } else {
                b.op("y", "mul", &[&g, &g])
            };
            b.finish(&[&g, &y])
        }
        Reader::Rows => {
            let x = float(&mut b);
            let keep = ("keepdim", AttrValue::Bool(true));
            let m = match rank {
                0 => b.op_with("m", "mean", &[&x], &[keep]),
                _ => b.op_with(
                    "m",
                    "mean",
                    &[&x],
                    &[("axes", AttrValue::Ints(vec![-1])), keep],
                ),
            };
            let y = b.op("y", "sub", &[&x, &m]);
            b.finish(&[&y])
        }
        Reader::Sum => {
            let x = float(&mut b);
            let y = match rank {
                0 => b.op("y", "sum", &[&x]),
                _ => b.op_with("y", "sum", &[&x], &[("axes", AttrValue::Ints(vec![0]))]),
            };
            b.finish(&[&y])
        }
    }
}

/// Seeded inputs for a gather graph: random data, and indices drawn from `-n - 2 .. n + 2`
/// for the gathered axis's size `n` (about a fifth out of range, a third negative).
pub fn inputs(graph: &Graph, seed: u64) -> Tensors {
    let mut tensors = fusebox::eval::random_inputs(graph, seed);
    let data = &tensors["data"];
    let node = &graph.nodes[0];
    let rank = data.shape().len() as i64;
    let axis = match node.attrs.get("axis") {
        Some(AttrValue::Int(a)) => a.rem_euclid(rank) as usize,
        _ => 0,
    };
    let n = data.shape()[axis] as i64;
    let ids = &tensors["ids"];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x9a7);
    let values = (0..ids.values().len())
        .map(|_| rng.random_range(-n - 2..n + 2) as f64)
        .collect();
    let ids = Tensor::from_values(ids.dtype, ids.shape(), values).expect("ids");
    tensors.insert("ids".into(), ids);
    tensors
}

/// An embedding's LayerNorm: `data` [7, `width`] of `dtype` gathered at `ids` [2, `tokens`]
/// (axis 0), a position row `pos` [`tokens`, `width`] added, then a LayerNorm over the rows
/// (mean, variance, `rsqrt`, a scale and a shift), written op by op. The gather comes first,
/// as [`inputs`] expects. Fused, it is one row kernel reading each token's row at its id.
pub fn embedding_layernorm(dtype: DType, tokens: usize, width: usize) -> Graph {
    let mut b = GraphBuilder::new("embedding_layernorm");
    let data = b.input("data", dtype, &[7, width]);
    let ids = b.input("ids", DType::I64, &[2, tokens]);
    let pos = b.input("pos", dtype, &[tokens, width]);
    let w = b.input("w", dtype, &[width]);
    let shift = b.input("shift", dtype, &[width]);
    let g = b.op_with(
        "g",
        "gather",
        &[&data, &ids],
        &[("axis", AttrValue::Int(0))],
    );
    let x = b.op("x", "add", &[&g, &pos]);
    let rows = [
        ("axes", AttrValue::Ints(vec![-1])),
        ("keepdim", AttrValue::Bool(true)),
    ];
    let m = b.op_with("m", "mean", &[&x], &rows);
    let d = b.op("d", "sub", &[&x, &m]);
    let sq = b.op("sq", "mul", &[&d, &d]);
    let v = b.op_with("v", "mean", &[&sq], &rows);
    let eps = b.constant("eps", 1e-5, dtype);
    let ve = b.op("ve", "add", &[&v, &eps]);
    let r = b.op("r", "rsqrt", &[&ve]);
    let n = b.op("n", "mul", &[&d, &r]);
    let scaled = b.op("scaled", "mul", &[&n, &w]);
    let y = b.op("y", "add", &[&scaled, &shift]);
    b.finish(&[&y])
}
