//! Gather graphs for the gather tests of several suites: a `gather`, `gather_elements` or
//! `scatter_add` of random geometry (data of rank 1 to 3 with size-0 and size-1 axes, index
//! tensors of rank 0 to 2, every axis, negative axes), data of every dtype (every numeric one
//! for a scatter), i32 or i64 indices, read by a pointwise op or not, and inputs whose indices
//! are in range, negative and out of range (a scatter's repeat, so that updates meet).

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
    /// Squares the gathered value (negates a bool one) in a pointwise op after it.
    pub consumer: bool,
}

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
        any::<bool>(),
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(data, indices, axis, elements, dtype, wide, consumer, (scatter, spread))| {
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
                    consumer,
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
    if !recipe.consumer {
        return b.finish(&[&g]);
    }
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
