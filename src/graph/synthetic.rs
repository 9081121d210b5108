//! Synthetic graphs for benchmarks and stress tests: large, deterministic, and shaped like the
//! pointwise tails real models produce (activations, gates, residual adds, scaling by constants).

use super::{Graph, GraphBuilder};
use crate::dtype::DType;
use crate::tensor::seeded_rng;
use rand::RngExt;

/// A pointwise graph of `nodes` nodes over eight `[rows, cols]` f32 inputs. Each node applies a
/// unary or binary op to values among the most recent 32, so the graph is deep and wide like an
/// unrolled elementwise network, with a sprinkling of negations, subtractions and divisions by
/// constants for the rewrite rules to work on. Every value no node uses is an output, so no node
/// is dead.
pub fn pointwise(nodes: usize, rows: usize, cols: usize, seed: u64) -> Graph {
    const UNARY: [&str; 6] = ["neg", "tanh", "sigmoid", "relu", "exp", "abs"];
    const BINARY: [&str; 5] = ["add", "mul", "sub", "max", "div"];
    let mut rng = seeded_rng(seed);
    let mut b = GraphBuilder::new(&format!("pointwise_{nodes}"));
    let mut values: Vec<String> = (0..8)
        .map(|i| b.input(&format!("x{i}"), DType::F32, &[rows, cols]))
        .collect();
    let two = b.constant("two", 2.0, DType::F32);
    let mut made = 1;
    while made < nodes.max(2) {
        let recent = values.len().saturating_sub(32);
        let pick = |rng: &mut rand_chacha::ChaCha8Rng, values: &[String]| {
            values[rng.random_range(recent..values.len())].clone()
        };
        let name = format!("v{made}");
        let a = pick(&mut rng, &values);
        match rng.random_range(0..10) {
            0..4 => {
                let op = UNARY[rng.random_range(0..UNARY.len())];
                b.op(&name, op, &[&a]);
            }
            4 => {
                b.op(&name, "div", &[&a, &two]);
            }
            _ => {
                let op = BINARY[rng.random_range(0..BINARY.len() - 1)];
                let c = pick(&mut rng, &values);
                b.op(&name, op, &[&a, &c]);
            }
        }
        values.push(name);
        made += 1;
    }
    let graph = b.finish(&[]);
    let used: std::collections::HashSet<&str> = graph
        .nodes
        .iter()
        .flat_map(|n| n.args.iter().map(String::as_str))
        .collect();
    let outputs = graph
        .nodes
        .iter()
        .filter(|n| !used.contains(n.name.as_str()))
        .map(|n| n.name.clone())
        .collect();
    Graph { outputs, ..graph }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Catalogue;

    #[test]
    fn synthetic_graphs_are_valid_and_sized() {
        let g = pointwise(500, 4, 8, 1);
        assert_eq!(g.nodes.len(), 500);
        assert!(!g.outputs.is_empty());
        let used: Vec<&String> = g.nodes.iter().flat_map(|n| &n.args).collect();
        for node in &g.nodes {
            assert!(used.contains(&&node.name) || g.outputs.contains(&node.name));
        }
        crate::graph::check(&g, &Catalogue::defaults()).unwrap();
        assert_eq!(pointwise(500, 4, 8, 1), g, "deterministic");
    }
}
