//! Where a node needs a constant (a Reshape's shape, a reduction's axes, a TopK's `k`, a
//! Range's bounds) and the model computes it at run time from its inputs, the graph is
//! specialized to the values a run gives: the value is computed now, from the given arrays,
//! and the inputs it came from are recorded ([`super::Imported::specialized`]) so that a run
//! with other values imports the model again (`crate::model`).

use super::{Importer, Val};
use crate::graph::Graph;
use crate::tensor::Tensor;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// The most nodes a computed constant may take to evaluate: the shape arithmetic exporters
/// write takes a handful.
const CONE_NODES: usize = 256;

impl Importer<'_> {
    /// `v` where a node needs a constant: a constant; an input of the model whose value the
    /// run gives; or a value computed only from such inputs, stored values and constants,
    /// evaluated now. The inputs it used are recorded as specialized. `None` where any input
    /// it depends on has no value, or the computation is larger than [`CONE_NODES`] nodes or
    /// [`super::FOLD_LIMIT`] elements a value.
    pub(super) fn demand(&self, v: &Val) -> Option<Rc<Tensor>> {
        match v {
            Val::Const(t, _) => Some(t.clone()),
            Val::Dyn(name, _) => {
                let (value, used) = self.computed(name)?;
                let mut specialized = self.specialized.borrow_mut();
                for (input, value) in used {
                    specialized.insert(input, value);
                }
                Some(Rc::new(value))
            }
        }
    }

    /// The value of `name` from the given arrays and stored values, and the inputs it read
    /// (with the values it read), given or stored.
    fn computed(&self, name: &str) -> Option<(Tensor, BTreeMap<String, Tensor>)> {
        let mut inputs = BTreeMap::new();
        let mut nodes = BTreeSet::new();
        let mut pending = vec![name.to_string()];
        while let Some(value) = pending.pop() {
            if inputs.contains_key(&value) {
                continue;
            }
            if let Some(position) = self.graph.nodes.iter().position(|n| n.name == value) {
                if nodes.insert(position) {
                    pending.extend(self.graph.nodes[position].args.iter().cloned());
                }
                if nodes.len() > CONE_NODES {
                    return None;
                }
                continue;
            }
            let ty = self.types.get(&value)?;
            let given = match self.known.get(&value) {
                // A float is specialized only when every value is finite, so that a key
                // holding it compares equal to itself.
                Some(t) if t.values().iter().all(|v| v.is_finite()) => {
                    t.clone().into_declared(ty.dtype, "", &value).ok()?
                }
                Some(_) => return None,
                None => self.values.get(&value)?.clone(),
            };
            if given.shape() != ty.shape.as_slice() {
                return None;
            }
            inputs.insert(value, given);
        }
        let nodes: Vec<_> = nodes
            .into_iter()
            .map(|k| self.graph.nodes[k].clone())
            .collect();
        let small = |name: &str| {
            self.types
                .get(name)
                .is_some_and(|t| t.shape.iter().product::<usize>() <= super::FOLD_LIMIT)
        };
        if !nodes.iter().all(|n| small(&n.name)) {
            return None;
        }
        let cone = Graph {
            name: "cone".into(),
            inputs: inputs
                .keys()
                .filter_map(|n| self.graph.input(n).cloned())
                .collect(),
            nodes,
            outputs: vec![name.to_string()],
        };
        let values: crate::eval::Tensors =
            inputs.iter().map(|(n, t)| (n.clone(), t.clone())).collect();
        let mut out = crate::eval::evaluate(&cone, self.catalogue, &values).ok()?;
        let value = out.remove(name)?;
        // A model's initializer read here is recorded too: a run that gives it another value
        // (`run --input` over a weight) must not keep the constant computed from this one.
        // The importer's own constants cannot be given other values.
        inputs.retain(|n, _| self.known.contains_key(n) || self.initializers.contains(n));
        Some((value, inputs))
    }
}
