//! Moving between a [`Dag`] and the e-graph: adding a graph's terms, and reading a graph back
//! out of one e-node chosen per class.

use super::analysis::{ClassData, FuseGraph, TypeAnalysis, node_attrs, split_children};
use super::language::{ENode, Leaf};
use crate::dag::{Dag, DagInput, DagNode, DagOutput, Value};
use crate::rules::{Builtin, Catalogue};
use egg::{Id, Symbol};
use std::collections::{HashMap, HashSet};

/// A graph's place in an e-graph: the class of every output and a name for every class that
/// held a named value of the original graph.
#[derive(Debug, Clone)]
pub struct Seeded {
    pub inputs: Vec<DagInput>,
    pub name: String,
    /// Output name and class, in the graph's order.
    pub outputs: Vec<(String, Id)>,
    /// The class of each original node, by node index (for naming and for the "original"
    /// extraction a report compares against).
    pub node_classes: Vec<Id>,
    pub node_names: Vec<String>,
    /// The e-node of each original node as it was added; canonicalize its children with
    /// `egraph.find` to look it up after saturation (it is still in its class).
    pub node_enodes: Vec<ENode>,
    /// The class of each input, by input index.
    pub input_classes: Vec<Id>,
    /// A readable name per (canonical) class: the first original name it holds. Kept here
    /// because extraction builds many candidate graphs from one e-graph.
    pub names: HashMap<Id, String>,
}

impl Seeded {
    /// Re-canonicalizes the recorded ids after the e-graph changed.
    pub fn canonicalize(&mut self, egraph: &FuseGraph) {
        for (_, id) in &mut self.outputs {
            *id = egraph.find(*id);
        }
        for id in self.node_classes.iter_mut().chain(&mut self.input_classes) {
            *id = egraph.find(*id);
        }
        self.names = self.class_names(egraph);
    }

    /// A readable name per class: the first original name it holds.
    pub fn class_names(&self, egraph: &FuseGraph) -> HashMap<Id, String> {
        let mut names = HashMap::new();
        for (id, name) in self.node_classes.iter().zip(&self.node_names) {
            names
                .entry(egraph.find(*id))
                .or_insert_with(|| name.clone());
        }
        names
    }
}

/// A fresh e-graph for `catalogue` whose analysis knows `dag`'s inputs.
pub fn new_egraph(dag: &Dag, catalogue: &Catalogue) -> FuseGraph {
    let inputs = dag
        .inputs
        .iter()
        .map(|i| (Symbol::from(i.name.as_str()), i.ty.clone()))
        .collect();
    FuseGraph::new(TypeAnalysis::new(catalogue.clone(), inputs))
}

/// The e-node ids of an attribute set, in the op's declaration order.
pub fn add_attrs(egraph: &mut FuseGraph, node: &DagNode) -> Vec<Id> {
    node.op
        .spec
        .attrs
        .iter()
        .map(|spec| {
            let leaf = node
                .attrs
                .get(&spec.name)
                .map_or(Leaf::Absent, Leaf::from_attr);
            egraph.add(ENode::Attr(leaf))
        })
        .collect()
}

/// Adds every term of `dag` to `egraph`.
pub fn seed(egraph: &mut FuseGraph, dag: &Dag) -> Seeded {
    let input_classes: Vec<Id> = dag
        .inputs
        .iter()
        .map(|i| egraph.add(ENode::Input(Symbol::from(i.name.as_str()))))
        .collect();
    let mut node_classes = Vec::with_capacity(dag.nodes.len());
    let mut node_enodes = Vec::with_capacity(dag.nodes.len());
    for node in &dag.nodes {
        let mut children: Vec<Id> = node
            .args
            .iter()
            .map(|a| match *a {
                Value::Input(i) => input_classes[i],
                Value::Node(i) => node_classes[i],
            })
            .collect();
        children.extend(add_attrs(egraph, node));
        let enode = ENode::op(node.op.name(), children);
        node_classes.push(egraph.add(enode.clone()));
        node_enodes.push(enode);
    }
    let class_of = |v: Value| match v {
        Value::Input(i) => input_classes[i],
        Value::Node(i) => node_classes[i],
    };
    Seeded {
        inputs: dag.inputs.clone(),
        name: dag.name.clone(),
        outputs: dag
            .outputs
            .iter()
            .map(|o| (o.name.clone(), class_of(o.value)))
            .collect(),
        node_names: dag.nodes.iter().map(|n| n.name.clone()).collect(),
        node_enodes,
        names: HashMap::new(),
        node_classes,
        input_classes,
    }
}

/// Why a choice of e-nodes is not a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChoiceError {
    /// Following the choices from the outputs comes back to this class.
    Cycle(Id),
    /// A class whose chosen node is not a tensor (ill-typed, or an attribute where a tensor
    /// belongs).
    NotATensor(Id),
}

/// Reads a graph out of the e-graph: from each output, the chosen e-node of each class,
/// recursively. Every reachable class becomes one node (a value used twice is computed once).
/// Fails on a cycle, so an extractor's answer is validated by building it.
pub fn dag_from_choice<'a>(
    egraph: &FuseGraph,
    seeded: &Seeded,
    choose: impl Fn(Id) -> &'a ENode,
) -> Result<Dag, ChoiceError> {
    // Names recorded by `canonicalize` are used as they are; a seeded graph that was never
    // canonicalized gets them computed here.
    let computed;
    let names = if seeded.names.is_empty() && !seeded.node_classes.is_empty() {
        computed = seeded.class_names(egraph);
        &computed
    } else {
        &seeded.names
    };
    let input_of: HashMap<Symbol, usize> = seeded
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| (Symbol::from(input.name.as_str()), i))
        .collect();
    let mut builder = Builder {
        egraph,
        choose: &choose,
        names,
        input_of: &input_of,
        values: HashMap::new(),
        nodes: Vec::new(),
        generated: 0,
        taken: seeded
            .inputs
            .iter()
            .map(|i| i.name.clone())
            .chain(seeded.node_names.iter().cloned())
            .chain(seeded.outputs.iter().map(|(name, _)| name.clone()))
            .collect(),
    };
    let mut outputs = Vec::with_capacity(seeded.outputs.len());
    for (name, id) in &seeded.outputs {
        let value = builder.value(egraph.find(*id))?;
        outputs.push(DagOutput {
            name: name.clone(),
            value,
        });
    }
    Ok(Dag {
        name: seeded.name.clone(),
        inputs: seeded.inputs.clone(),
        nodes: builder.nodes,
        outputs,
        cast: egraph.analysis.catalogue.builtin(Builtin::Cast).cloned(),
    })
}

struct Builder<'g, 'a, F: Fn(Id) -> &'a ENode> {
    egraph: &'g FuseGraph,
    choose: &'g F,
    names: &'g HashMap<Id, String>,
    input_of: &'g HashMap<Symbol, usize>,
    /// `None` while a class is being built (on the stack): meeting it again is a cycle.
    values: HashMap<Id, Option<Value>>,
    nodes: Vec<DagNode>,
    generated: usize,
    /// Every name of the seed graph and every name generated so far: a value the rewrites
    /// introduce gets a name none of them has, so reports never show two values as one.
    taken: HashSet<String>,
}

impl<'g, 'a, F: Fn(Id) -> &'a ENode> Builder<'g, 'a, F> {
    /// Iterative post-order walk, so deep chains (10,000-node graphs) do not overflow the stack.
    fn value(&mut self, root: Id) -> Result<Value, ChoiceError> {
        let mut stack: Vec<(Id, bool)> = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            let id = self.egraph.find(id);
            match self.values.get(&id) {
                Some(Some(_)) => continue,
                Some(None) if !expanded => return Err(ChoiceError::Cycle(id)),
                _ => {}
            }
            let node = (self.choose)(id);
            let tensor_children = self.tensor_children(id, node)?;
            if !expanded {
                self.values.insert(id, None);
                stack.push((id, true));
                for &child in tensor_children.iter().rev() {
                    let child = self.egraph.find(child);
                    match self.values.get(&child) {
                        Some(Some(_)) => {}
                        Some(None) => return Err(ChoiceError::Cycle(child)),
                        None => stack.push((child, false)),
                    }
                }
                continue;
            }
            let value = self.finish(id, node, &tensor_children)?;
            self.values.insert(id, Some(value));
        }
        Ok(self.values[&self.egraph.find(root)].expect("built above"))
    }

    /// The catalogue op of an op e-node in class `id`.
    fn op(
        &self,
        id: Id,
        name: Symbol,
    ) -> Result<&'g std::sync::Arc<crate::rules::OpDef>, ChoiceError> {
        self.egraph
            .analysis
            .catalogue
            .get(name.as_str())
            .ok_or(ChoiceError::NotATensor(id))
    }

    fn tensor_children(&self, id: Id, node: &ENode) -> Result<Vec<Id>, ChoiceError> {
        match node {
            ENode::Input(_) => Ok(Vec::new()),
            ENode::Attr(_) => Err(ChoiceError::NotATensor(id)),
            ENode::Op(name, children) => {
                let op = self.op(id, *name)?;
                let (operands, _) =
                    split_children(op, children).ok_or(ChoiceError::NotATensor(id))?;
                Ok(operands.to_vec())
            }
        }
    }

    fn finish(&mut self, id: Id, node: &ENode, operands: &[Id]) -> Result<Value, ChoiceError> {
        let ty = match &self.egraph[id].data {
            ClassData::Tensor(t) => t.ty.clone(),
            _ => return Err(ChoiceError::NotATensor(id)),
        };
        match node {
            ENode::Input(name) => self
                .input_of
                .get(name)
                .map(|&i| Value::Input(i))
                .ok_or(ChoiceError::NotATensor(id)),
            ENode::Attr(_) => Err(ChoiceError::NotATensor(id)),
            ENode::Op(name, children) => {
                let op = self.op(id, *name)?.clone();
                let (_, attr_ids) =
                    split_children(&op, children).ok_or(ChoiceError::NotATensor(id))?;
                let attrs = node_attrs(&op, attr_ids, |a| self.egraph[a].data.clone())
                    .map_err(|_| ChoiceError::NotATensor(id))?;
                let args = operands
                    .iter()
                    .map(|c| self.values[&self.egraph.find(*c)].expect("children first"))
                    .collect();
                let name = match self.names.get(&id) {
                    Some(n) => n.clone(),
                    None => loop {
                        self.generated += 1;
                        let fresh = format!("{}_{}", op.name(), self.generated);
                        if self.taken.insert(fresh.clone()) {
                            break fresh;
                        }
                    },
                };
                self.nodes.push(DagNode {
                    name,
                    op,
                    attrs,
                    args,
                    ty,
                });
                Ok(Value::Node(self.nodes.len() - 1))
            }
        }
    }
}
