//! The search space both extractors share: the tensor classes reachable from the outputs, each
//! with the e-nodes that may be chosen for it, in dense indices.
//!
//! An e-node may be chosen only if reading it back as a graph node is sure to work: a known
//! input, or a catalogue op whose operands are all tensor classes and whose attribute leaves
//! resolve. Attribute classes are never chosen (they are read through their parent), and a
//! node with an ill-typed or attribute class in an operand position is dropped here, so
//! neither extractor has to think about it again.

use crate::dag::Dag;
use crate::egraph::analysis::{node_attrs, split_children};
use crate::egraph::{ChoiceError, ENode, FuseGraph, Seeded, dag_from_choice};
use egg::{Id, Language, Symbol};
use std::collections::{HashMap, HashSet};

/// One choosable e-node of a class.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    /// The e-node with canonical children, as handed to [`dag_from_choice`].
    pub node: ENode,
    /// Its operand classes (dense indices), each once, in first-use order.
    pub children: Vec<usize>,
}

/// For each dense class, the index of its chosen candidate; `None` for a class left unchosen
/// (unreachable under the choice, or not reached yet).
pub(super) type Choice = Vec<Option<usize>>;

pub(super) struct Space<'g> {
    pub egraph: &'g FuseGraph,
    /// Dense index to canonical class id.
    pub ids: Vec<Id>,
    pub index: HashMap<Id, usize>,
    /// Choosable e-nodes per dense class (empty for a class nothing can be chosen in).
    pub candidates: Vec<Vec<Candidate>>,
    /// The dense class of each output, in output order.
    pub outputs: Vec<usize>,
    /// Returned for a class the choice leaves open, so [`dag_from_choice`] reports an error
    /// instead of this module panicking.
    poison: ENode,
}

impl<'g> Space<'g> {
    /// Walks the e-graph from the outputs through every choosable e-node.
    pub fn new(egraph: &'g FuseGraph, seeded: &Seeded) -> Space<'g> {
        let inputs: HashSet<Symbol> = seeded
            .inputs
            .iter()
            .map(|i| Symbol::from(i.name.as_str()))
            .collect();
        let mut space = Space {
            egraph,
            ids: Vec::new(),
            index: HashMap::new(),
            candidates: Vec::new(),
            outputs: Vec::new(),
            poison: ENode::Attr(crate::egraph::Leaf::Absent),
        };
        let mut queue = Vec::new();
        for (_, id) in &seeded.outputs {
            let dense = space.intern(egraph.find(*id), &mut queue);
            space.outputs.push(dense);
        }
        while let Some(dense) = queue.pop() {
            let id = space.ids[dense];
            if egraph[id].data.tensor().is_none() {
                continue;
            }
            let mut found = Vec::new();
            for node in &egraph[id].nodes {
                let node = node.clone().map_children(|c| egraph.find(c));
                let Some(operands) = choosable(egraph, &inputs, &node) else {
                    continue;
                };
                let mut children: Vec<usize> = Vec::with_capacity(operands.len());
                for operand in operands {
                    let child = space.intern(operand, &mut queue);
                    if !children.contains(&child) {
                        children.push(child);
                    }
                }
                found.push(Candidate { node, children });
            }
            space.candidates[dense] = found;
        }
        space
    }

    fn intern(&mut self, id: Id, queue: &mut Vec<usize>) -> usize {
        if let Some(&dense) = self.index.get(&id) {
            return dense;
        }
        let dense = self.ids.len();
        self.ids.push(id);
        self.index.insert(id, dense);
        self.candidates.push(Vec::new());
        queue.push(dense);
        dense
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The graph a choice denotes; fails on a cycle or an open class.
    pub fn build(&self, seeded: &Seeded, choice: &[Option<usize>]) -> Result<Dag, ChoiceError> {
        dag_from_choice(self.egraph, seeded, |id| self.chosen(choice, id))
    }

    /// Like [`Space::build`], with some classes' choices overridden (class, candidate).
    pub fn build_with(
        &self,
        seeded: &Seeded,
        choice: &[Option<usize>],
        moves: &[(usize, usize)],
    ) -> Result<Dag, ChoiceError> {
        dag_from_choice(self.egraph, seeded, |id| {
            let class = self.index.get(&self.egraph.find(id));
            match class.and_then(|c| moves.iter().find(|m| m.0 == *c)) {
                Some(&(c, k)) => &self.candidates[c][k].node,
                None => self.chosen(choice, id),
            }
        })
    }

    fn chosen<'s>(&'s self, choice: &[Option<usize>], id: Id) -> &'s ENode {
        self.index
            .get(&self.egraph.find(id))
            .and_then(|&c| choice[c].map(|k| &self.candidates[c][k].node))
            .unwrap_or(&self.poison)
    }

    /// A choice given as e-nodes per class, in dense form; e-nodes that are not candidates
    /// of their class are left out.
    pub fn choice_of(&self, map: &HashMap<Id, ENode>) -> Choice {
        let mut choice = vec![None; self.len()];
        for (id, node) in map {
            if let Some(&c) = self.index.get(&self.egraph.find(*id)) {
                choice[c] = self.candidates[c].iter().position(|k| &k.node == node);
            }
        }
        choice
    }

    /// The classes a choice reaches from the outputs, each once, parents before children.
    /// Stops at open classes and never loops on a cyclic choice.
    pub fn reached(&self, choice: &[Option<usize>]) -> Vec<usize> {
        let mut seen = vec![false; self.len()];
        let mut order = Vec::new();
        let mut stack: Vec<usize> = self.outputs.iter().rev().copied().collect();
        while let Some(c) = stack.pop() {
            if std::mem::replace(&mut seen[c], true) {
                continue;
            }
            order.push(c);
            if let Some(k) = choice[c] {
                stack.extend(self.candidates[c][k].children.iter().rev());
            }
        }
        order
    }

    /// The e-node per class of a choice, for the classes it reaches.
    pub fn to_map(&self, choice: &[Option<usize>]) -> HashMap<Id, ENode> {
        self.reached(choice)
            .into_iter()
            .filter_map(|c| choice[c].map(|k| (self.ids[c], self.candidates[c][k].node.clone())))
            .collect()
    }
}

/// The operand classes of an e-node that may be chosen, or `None` if it may not.
fn choosable(egraph: &FuseGraph, inputs: &HashSet<Symbol>, node: &ENode) -> Option<Vec<Id>> {
    match node {
        ENode::Input(name) => inputs.contains(name).then(Vec::new),
        ENode::Attr(_) => None,
        ENode::Op(name, children) => {
            let op = egraph.analysis.catalogue.get(name.as_str())?;
            let (operands, attrs) = split_children(op, children)?;
            if operands.iter().any(|&c| egraph[c].data.tensor().is_none()) {
                return None;
            }
            node_attrs(op, attrs, |id| egraph[id].data.clone()).ok()?;
            Some(operands.to_vec())
        }
    }
}
