//! Constant folding at import, bounded by size: a node whose inputs are all constants is
//! evaluated by the reference evaluator while the model is read, as long as its result stays
//! within [`FOLD_LIMIT`] elements; a bigger value is left to run time.

use super::*;

/// The most elements a constant folded at import may have (2^20: 8 MiB as the evaluator
/// holds it). Folding allocates every folded value while the model is read, so a few bytes of
/// `ConstantOfShape` or `Expand` could otherwise ask for gigabytes; a bigger value is computed
/// at run time instead, like any other node.
pub const FOLD_LIMIT: usize = 1 << 20;

/// Whether a value of `shape` is small enough to fold (see [`FOLD_LIMIT`]).
pub(super) fn fits_folding(shape: &[usize]) -> bool {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .is_some_and(|n| n <= FOLD_LIMIT)
}

impl Importer<'_> {
    /// Whether `def` over constant `args` yields at most [`FOLD_LIMIT`] elements, so folding
    /// it at import allocates no more than that; a bigger result is left to run time, where
    /// the backends compute it (a fused kernel never materializes a broadcast constant).
    pub(super) fn foldable(
        &self,
        def: &crate::rules::ops::OpDef,
        args: &[Val],
        attrs: &Attrs,
    ) -> Imports<bool> {
        let types: Vec<TensorType> = args
            .iter()
            .map(|a| TensorType {
                dtype: a.dtype(),
                shape: a.shape().to_vec(),
            })
            .collect();
        let resolved = resolve_attrs(def, attrs).map_err(|(_, kind)| kind)?;
        let ty = infer_op(def, &types, &resolved).map_err(|(_, kind)| kind)?;
        Ok(fits_folding(&ty.shape))
    }

    /// Evaluates one op on constants with the reference evaluator.
    pub(super) fn fold(&mut self, op: &str, args: &[Val], attrs: Attrs) -> Imports {
        let mut inputs = Vec::new();
        let mut tensors = crate::eval::Tensors::new();
        for (i, arg) in args.iter().enumerate() {
            let t = arg
                .constant()
                .ok_or(ImportError::Internal("folding needs constants"))?;
            let name = format!("a{i}");
            inputs.push(Input {
                name: name.clone(),
                dtype: t.dtype,
                shape: t.shape().to_vec(),
            });
            tensors.insert(name, t.clone());
        }
        let graph = Graph {
            name: "fold".into(),
            inputs: inputs.clone(),
            nodes: vec![Node {
                name: "y".into(),
                op: op.into(),
                args: inputs.iter().map(|i| i.name.clone()).collect(),
                attrs,
            }],
            outputs: vec!["y".into()],
        };
        let mut out = crate::eval::evaluate(&graph, self.catalogue, &tensors)
            .map_err(|e| ImportError::Op(e.kind).within(format!("folding a constant `{op}`")))?;
        let t = out
            .remove("y")
            .ok_or(ImportError::Internal("folding produced nothing"))?;
        Ok(Val::Const(Rc::new(t), None))
    }
}
