//! Extraction: one graph out of the saturated e-graph, chosen by the true cost of the whole
//! graph.
//!
//! fusebox partitions during extraction (the book's "Rewrite rules and the cost model" chapter):
//! the cost that matters is what the fused kernels of a candidate graph cost, and that is not a sum of
//! per-node costs — whether a rewrite pays depends on what ends up in the same kernel. So the
//! caller supplies `cost`, a function of a whole [`Dag`] (optimize passes the partition's
//! modeled time), and both extractors judge complete candidates by it:
//!
//! - [`exact`] enumerates every acyclic choice of e-nodes over the classes the outputs reach
//!   and keeps the cheapest. It is exact under `cost`, and used when the number of choices is
//!   at most [`ExtractOptions::exact_limit`].
//! - [`greedy`] is a DAG-aware bottom-up pass over a per-node `estimate` (a value used twice is
//!   paid once, as in extraction-gym's faster-greedy-dag), followed by local improvement under
//!   the true `cost` with a bounded budget.
//!
//! Both are cycle-free by construction and every result is also built with
//! [`dag_from_choice`](crate::egraph::dag_from_choice), which rejects cycles. Both consider
//! the seed graph's own e-nodes ([`original_choice`]) and keep it unless something is strictly
//! cheaper, so extraction never costs more than the seed graph as the e-graph holds it. That
//! is the input graph with equal values merged: a merge removes duplicate work but can make a
//! value shared, which a fusion partition may have to write to memory, so a caller that must
//! never do worse than its input also costs the input dag itself (optimize does).

mod exact;
mod greedy;
mod space;

pub use exact::exact;
pub use greedy::greedy;

use crate::dag::Dag;
use crate::egraph::{ENode, FuseGraph, Seeded};
use egg::{Id, Language};
use std::collections::HashMap;
use std::fmt;

/// Limits of the two extractors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractOptions {
    /// The most complete choices [`exact`] enumerates (each is costed once); above it,
    /// [`extract`] uses [`greedy`].
    pub exact_limit: usize,
    /// The most class visits [`exact`] spends: counting the choices gives up after this many
    /// steps, so a large e-graph is recognised as too large quickly, and choices × classes
    /// (the work of building every candidate) must not exceed it either.
    pub exact_work: usize,
    /// The most candidate graphs local improvement builds (each one costed unless cyclic).
    pub local_search_budget: usize,
    /// The most graph nodes local improvement builds in total; bounds its time on large
    /// graphs, where each candidate costs time proportional to its size.
    pub local_search_work: usize,
    /// The most refinement sweeps of the greedy bottom-up pass.
    pub greedy_sweeps: usize,
}

impl Default for ExtractOptions {
    /// Sized so small e-graphs (a dozen classes with alternatives) are solved exactly and a
    /// 10,000-node e-graph extracts in well under a second. Building and costing a candidate
    /// is linear in its size (about 20 ms for 10,000 nodes with the partition cost), so local
    /// improvement builds at most 150,000 nodes in all: every one of its 400 candidates of a
    /// small graph, about 15 of a 10,000-node one.
    fn default() -> ExtractOptions {
        ExtractOptions {
            exact_limit: 20_000,
            exact_work: 2_000_000,
            local_search_budget: 400,
            local_search_work: 150_000,
            greedy_sweeps: 8,
        }
    }
}

/// Which extractor produced a result. Serialized as its lowercase name, as `Display` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Exact,
    Greedy,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Exact => "exact",
            Method::Greedy => "greedy",
        })
    }
}

/// An extracted graph.
#[derive(Debug, Clone)]
pub struct Extraction {
    pub dag: Dag,
    /// `cost(&dag)`.
    pub cost: f64,
    /// The cost of the seed graph's own choice ([`original_choice`]); `cost <= original_cost`.
    pub original_cost: f64,
    pub method: Method,
    /// How many times `cost` was called.
    pub evaluations: usize,
    /// The e-node chosen in each class the graph uses (children canonical).
    pub choice: HashMap<Id, ENode>,
}

/// Extracts exactly when the choices number at most `options.exact_limit`, greedily otherwise.
pub fn extract(
    egraph: &FuseGraph,
    seeded: &Seeded,
    cost: &dyn Fn(&Dag) -> f64,
    estimate: &dyn Fn(&FuseGraph, Id, &ENode) -> f64,
    options: &ExtractOptions,
) -> Extraction {
    exact(egraph, seeded, cost, options)
        .unwrap_or_else(|| greedy(egraph, seeded, cost, estimate, options))
}

/// The seed graph's own e-nodes, one per class, children canonicalized.
///
/// Saturation may have merged classes of the seed graph (`neg(neg(x))` with `x`), so a class
/// can hold several original e-nodes. The one of the earliest value wins, inputs first, then
/// nodes in the seed order: a node's operands are earlier values, so every chosen e-node only
/// points at classes won by strictly earlier values and the choice is acyclic. (Taking the
/// later one can loop: `x`'s class choosing `neg(neg(x))`.)
pub fn original_choice(egraph: &FuseGraph, seeded: &Seeded) -> HashMap<Id, ENode> {
    let mut choice = HashMap::new();
    for (input, &id) in seeded.inputs.iter().zip(&seeded.input_classes) {
        choice
            .entry(egraph.find(id))
            .or_insert_with(|| ENode::Input(egg::Symbol::from(input.name.as_str())));
    }
    for (node, &id) in seeded.node_enodes.iter().zip(&seeded.node_classes) {
        choice
            .entry(egraph.find(id))
            .or_insert_with(|| node.clone().map_children(|c| egraph.find(c)));
    }
    choice
}

/// Whether `a` is cheaper than `b` by more than rounding noise: extraction only moves away
/// from a candidate (in the end, from the original graph) for a real gain.
/// A NaN cost counts as infinite, so it never wins.
fn strictly_cheaper(a: f64, b: f64) -> bool {
    let sane = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
    let (a, b) = (sane(a), sane(b));
    if b.is_infinite() {
        return a < b;
    }
    a < b - 1e-12 * b.abs()
}

#[cfg(test)]
mod tests;
