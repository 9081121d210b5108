//! A fused kernel: pointwise nodes, broadcasts and reductions ending the kernel, over one
//! iteration domain, as straight-line SSA. A kernel in which a reduction's result is consumed
//! is a row kernel (see [`super::ir`]): each of its reductions is a row reduction of the
//! domain ([`crate::partition::row_reduction`]) and becomes an [`Instr::RowReduce`].
//!
//! Each pointwise node is lowered the way the reference evaluator applies it
//! (`eval::pointwise`): operands rounded to the op's common dtype, the formula at the compute
//! precision of that dtype, the result rounded to the node's dtype. So a fused kernel rounds
//! exactly where the unfused graph rounds, and differs from it only by the order of f64
//! summation in reductions and by the few-ulp accuracy of vector math.

use super::ir::{
    Axis, Instr, KernelIr, Launch, MapStage, Prec, ReduceKind, Reduction, Store, ValueId, View,
};
use super::view::{broadcast_view, domain_of, mapped_view};
use super::{Lowered, lower_error};
use crate::dag::{Dag, Value};
use crate::dtype::{Category, DType};
use crate::error::Result;
use crate::eval::pointwise::{common_dtype, computes_in_integers, converts};
use crate::formula::Expr;
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::rules::{Builtin, OpKind};
use crate::shape::IndexMap;
use std::collections::{HashMap, HashSet};

/// Builds SSA, remembering each dag value's SSA id and dtype.
struct Builder<'a> {
    dag: &'a Dag,
    domain: Vec<usize>,
    ir: KernelIr,
    /// The kernel's nodes: a layout node among them is a view, read through an index map.
    members: HashSet<usize>,
    /// Per load view: the value it reads, the launch strides, the offset (of the element, or
    /// of the position for an index map) and the index map's stages.
    load_args: Vec<(Value, Vec<i64>, i64, Vec<MapStage>)>,
    values: HashMap<Value, (ValueId, DType)>,
}

impl Builder<'_> {
    fn push(&mut self, instr: Instr) -> ValueId {
        self.ir.body.push(instr);
        self.ir.body.len() - 1
    }

    /// `x` (held at its dtype's precision) at precision `to`.
    fn at_prec(&mut self, x: ValueId, to: Prec) -> ValueId {
        match (self.ir.prec(x), to) {
            (Prec::F32, Prec::F64) => self.push(Instr::Widen { x }),
            (Prec::F64 | Prec::I64, Prec::F32) => self.round(x, DType::F32),
            (Prec::I64, Prec::F64) => self.round(x, DType::F64),
            // A bool or float operand of an integer computation, converted as a cast.
            (Prec::F32 | Prec::F64, Prec::I64) => self.round(x, DType::I64),
            _ => x,
        }
    }

    /// `x` rounded to `dtype`. Widening is exact, so rounding a widened f32 to f32 or to a
    /// narrower float rounds the f32 itself (one conversion instead of two).
    fn round(&mut self, x: ValueId, dtype: DType) -> ValueId {
        if self.ir.prec(x) == Prec::I64 && dtype == DType::I64 {
            // Every integer held at I64 is already an i64.
            return x;
        }
        if let Instr::Widen { x: inner } = self.ir.body[x] {
            match dtype {
                DType::F32 => return inner,
                DType::F16 | DType::BF16 => return self.push(Instr::Round { x: inner, dtype }),
                _ => {}
            }
        }
        self.push(Instr::Round { x, dtype })
    }

    /// An exact integer literal.
    fn int_constant(&mut self, value: i64) -> ValueId {
        if let Some(i) = self
            .ir
            .body
            .iter()
            .position(|instr| *instr == Instr::Int { value })
        {
            return i;
        }
        self.push(Instr::Int { value })
    }

    fn constant(&mut self, value: f64, prec: Prec) -> ValueId {
        let value = match prec {
            Prec::F32 => value as f32 as f64,
            Prec::F64 => value,
            // A formula's literal on integers converts as a cast to i64 (as `WrappingInt`).
            Prec::I64 => return self.int_constant(value as i64),
        };
        if let Some(i) = self.ir.body.iter().position(|instr| {
            matches!(instr, Instr::Const { value: v, prec: p }
                if *p == prec && v.to_bits() == value.to_bits())
        }) {
            return i;
        }
        self.push(Instr::Const { value, prec })
    }

    /// The SSA value of `value`: computed earlier in this kernel, a literal inlined here, or
    /// a load of a kernel input.
    fn value(&mut self, value: Value) -> Result<(ValueId, DType)> {
        if let Some(&v) = self.values.get(&value) {
            return Ok(v);
        }
        let dag = self.dag;
        let result = match value {
            Value::Node(n) if dag.nodes[n].op.is_literal() => {
                self.pointwise(n)?;
                return Ok(self.values[&value]);
            }
            Value::Node(v) if self.is_view(v) => {
                let (source, map) = self.view_of(v)?;
                if let Value::Node(s) = source
                    && dag.nodes[s].op.is_literal()
                {
                    // A literal is the same at every index, so any view of it is the literal.
                    let literal = self.value(source)?;
                    self.values.insert(value, literal);
                    return Ok(literal);
                }
                let ty = dag.ty(value);
                let Some((view, strides, offset, stages)) =
                    mapped_view(ty.dtype, &ty.shape, &map, &self.domain)
                else {
                    return Err(self.shape_error(value));
                };
                self.ir.loads.push(view);
                self.load_args.push((source, strides, offset, stages));
                let id = self.push(Instr::Load {
                    view: self.ir.loads.len() - 1,
                });
                (id, ty.dtype)
            }
            _ => {
                let ty = dag.ty(value);
                let Some((view, strides)) = broadcast_view(ty.dtype, &ty.shape, &self.domain)
                else {
                    return Err(self.shape_error(value));
                };
                self.ir.loads.push(view);
                self.load_args.push((value, strides, 0, Vec::new()));
                let id = self.push(Instr::Load {
                    view: self.ir.loads.len() - 1,
                });
                (id, ty.dtype)
            }
        };
        self.values.insert(value, result);
        Ok(result)
    }

    /// Whether node `n` of this kernel is a view: a layout op other than a broadcast (the
    /// partitioner admits those only as views of their operand's buffer).
    fn is_view(&self, n: usize) -> bool {
        let op = &self.dag.nodes[n].op;
        self.members.contains(&n)
            && op.kind() == OpKind::Layout
            && op.builtin() != Some(Builtin::BroadcastTo)
    }

    /// The buffer view node `v` reads and the index map over it: its operand's contiguous
    /// buffer, or, when its operand is a view in this kernel too, that view composed with its
    /// own (as the partitioner composed them, [`BuiltinPlan::index_map`]).
    fn view_of(&self, v: usize) -> Result<(Value, IndexMap)> {
        let dag = self.dag;
        let node = &dag.nodes[v];
        let x = node.args[0];
        let x_shape = &dag.ty(x).shape;
        let (source, base) = match x {
            Value::Node(p) if self.is_view(p) => self.view_of(p)?,
            Value::Node(p) if self.members.contains(&p) => {
                return Err(lower_error(
                    dag,
                    v,
                    "a view's operand is computed in the view's own kernel".into(),
                ));
            }
            _ => (x, IndexMap::contiguous(x_shape)),
        };
        let builtin = node
            .op
            .builtin()
            .ok_or_else(|| lower_error(dag, v, "layout op without a builtin".into()))?;
        let (plan, _) =
            plan_builtin(builtin, &[x_shape], &node.attrs).map_err(|e| lower_error(dag, v, e))?;
        let view = plan
            .index_map(&base, x_shape, &node.ty.shape)
            .ok_or_else(|| {
                lower_error(
                    dag,
                    v,
                    format!(
                        "`{}` cannot be read as a view of `{}` here",
                        node.op.name(),
                        dag.value_name(source)
                    ),
                )
            })?;
        Ok((source, view))
    }

    fn shape_error(&self, value: Value) -> crate::Error {
        let name = self.dag.value_name(value).to_string();
        crate::Error::new(
            crate::error::Site::node(&name),
            crate::ErrorKind::Lower(format!(
                "shape {:?} does not broadcast to the kernel's domain {:?}",
                self.dag.ty(value).shape,
                self.domain
            )),
        )
    }

    /// Lowers pointwise node `n` as `eval::pointwise::apply` evaluates it.
    fn pointwise(&mut self, n: usize) -> Result<()> {
        let dag = self.dag;
        let node = &dag.nodes[n];
        let Some(expr) = node.op.formula() else {
            return Err(lower_error(dag, n, "pointwise op without a formula".into()));
        };
        let out = node.ty.dtype;
        let arg_dtypes: Vec<DType> = node.args.iter().map(|&a| dag.ty(a).dtype).collect();
        let common = common_dtype(&node.op, &arg_dtypes, out);
        let in_f64 = common.is_none_or(|d| d.compute_is_f64()) || out == DType::F64;
        let prec = if computes_in_integers(common, &arg_dtypes, out) {
            Prec::I64
        } else if in_f64 {
            Prec::F64
        } else {
            Prec::F32
        };
        let mut env: HashMap<&str, ValueId> = HashMap::new();
        for (i, &arg) in node.args.iter().enumerate() {
            let (mut v, dtype) = self.value(arg)?;
            if let Some(c) = common
                && converts(&node.op, i)
                && c != dtype
            {
                v = self.round(v, c);
            }
            v = self.at_prec(v, prec);
            env.insert(node.op.operand_name(i), v);
        }
        for (name, attr) in node.attrs.iter() {
            // Integer computations read attributes exactly (a `const` beyond 2^53).
            let c = match prec {
                Prec::I64 => attr.as_i64().map(|x| self.int_constant(x)),
                _ => attr.as_f64().map(|x| self.constant(x, prec)),
            };
            if let Some(c) = c {
                env.entry(name.as_str()).or_insert(c);
            }
        }
        let mut result = self.formula(expr, &env, prec, n)?;
        let needs_round = !matches!(
            (prec, out),
            (Prec::F32, DType::F32) | (Prec::F64, DType::F64) | (Prec::I64, DType::I64)
        );
        if needs_round {
            result = self.round(result, out);
        }
        self.values.insert(Value::Node(n), (result, out));
        Ok(())
    }

    fn formula(
        &mut self,
        expr: &Expr,
        env: &HashMap<&str, ValueId>,
        prec: Prec,
        n: usize,
    ) -> Result<ValueId> {
        Ok(match expr {
            Expr::Num(v) => self.constant(*v, prec),
            Expr::Var(name) => *env.get(name.as_str()).ok_or_else(|| {
                lower_error(self.dag, n, format!("formula variable `{name}` is unbound"))
            })?,
            Expr::Neg(e) => {
                let x = self.formula(e, env, prec, n)?;
                self.push(Instr::Neg { x, prec })
            }
            Expr::Binary(op, l, r) => {
                let a = self.formula(l, env, prec, n)?;
                let b = self.formula(r, env, prec, n)?;
                self.push(Instr::Binary {
                    op: *op,
                    a,
                    b,
                    prec,
                })
            }
            Expr::Call(func, args) => {
                let args = args
                    .iter()
                    .map(|a| self.formula(a, env, prec, n))
                    .collect::<Result<Vec<_>>>()?;
                self.push(Instr::Call {
                    func: *func,
                    args,
                    prec,
                })
            }
        })
    }

    /// Row reduction node `n` of a row kernel: an [`Instr::RowReduce`] of its operand, which
    /// later nodes read like any value. Returns the view and strides of its result as a
    /// store: one element per row, contiguous over the outer axes.
    fn row_reduction(&mut self, n: usize) -> Result<(View, Vec<i64>)> {
        let dag = self.dag;
        let node = &dag.nodes[n];
        let x = node.args[0];
        if !crate::partition::row_reduction(dag, n) || dag.ty(x).shape != self.domain {
            return Err(lower_error(
                dag,
                n,
                "a reduction consumed inside its kernel must reduce the innermost axis of the \
                 kernel's domain, one result per row"
                    .into(),
            ));
        }
        let kind = match node.op.builtin() {
            Some(Builtin::Mean) => ReduceKind::Mean,
            Some(Builtin::ReduceMax) => ReduceKind::Max,
            _ => ReduceKind::Sum,
        };
        let (value, _) = self.value(x)?;
        let value = self.accumulated(value, node.ty.dtype);
        let id = self.push(Instr::RowReduce {
            kind,
            x: value,
            dtype: node.ty.dtype,
        });
        self.values.insert(Value::Node(n), (id, node.ty.dtype));
        let rank = self.domain.len();
        let mut sizes = self.domain.clone();
        sizes[rank - 1] = 1;
        let mut strides = super::view::contiguous_strides(&sizes);
        strides[rank - 1] = 0;
        let view = super::view::classify(node.ty.dtype, &sizes, &mut strides);
        Ok((view, strides))
    }

    /// `value` at the precision a reduction to `dtype` accumulates it in: integer results
    /// accumulate exact integers (a bool summed into i64 becomes 0 or 1); float results
    /// accumulate floats (an integer averaged by `mean` becomes its f64).
    fn accumulated(&mut self, value: ValueId, dtype: DType) -> ValueId {
        match (dtype.category(), self.ir.prec(value)) {
            (Category::Integer, _) => self.at_prec(value, Prec::I64),
            (_, Prec::I64) => self.at_prec(value, Prec::F64),
            _ => value,
        }
    }

    /// Reduction node `n` ending the kernel: the output view has stride 0 on reduced axes.
    fn reduction(&mut self, n: usize) -> Result<Vec<i64>> {
        let dag = self.dag;
        let node = &dag.nodes[n];
        let x = node.args[0];
        let x_shape = dag.ty(x).shape.clone();
        if domain_of(&x_shape) != self.domain {
            return Err(self.shape_error(x));
        }
        let plan = plan_builtin(
            node.op.builtin().unwrap_or(Builtin::Sum),
            &[&x_shape],
            &node.attrs,
        )
        .map_err(|e| lower_error(dag, n, e))?
        .0;
        let rank = self.domain.len();
        // Which domain axes are reduced, and the output's stride along each kept one.
        let (kind, reduced): (ReduceKind, Vec<bool>) = match &plan {
            BuiltinPlan::Reduce { builtin, axes, .. } => {
                let kind = match builtin {
                    Builtin::Mean => ReduceKind::Mean,
                    Builtin::ReduceMax => ReduceKind::Max,
                    _ => ReduceKind::Sum,
                };
                let offset = rank - x_shape.len();
                (
                    kind,
                    (0..rank)
                        .map(|d| d < offset || axes.contains(&(d - offset)))
                        .collect(),
                )
            }
            BuiltinPlan::SumToSize(target) => {
                let lead = rank - target.len();
                (
                    ReduceKind::Sum,
                    (0..rank)
                        .map(|d| d < lead || target[d - lead] == 1)
                        .collect(),
                )
            }
            _ => return Err(lower_error(dag, n, "not a reduction".into())),
        };
        // Kept axes appear in the output in domain order (keepdim only adds size-1 axes).
        let kept: Vec<usize> = (0..rank)
            .filter(|&d| !reduced[d])
            .map(|d| self.domain[d])
            .collect();
        let kept_strides = super::view::contiguous_strides(&kept);
        let mut strides = vec![0i64; rank];
        let mut k = 0;
        for d in 0..rank {
            if !reduced[d] {
                strides[d] = kept_strides[k];
                k += 1;
            }
        }
        // Broadcast exactly on the reduced axes: a kept axis of size 1 keeps its stride, so
        // the pattern says which axes are reduced and nothing else.
        let axes = (0..rank)
            .map(|d| {
                if reduced[d] {
                    Axis::Broadcast
                } else {
                    super::view::moving_axis(d, rank, strides[d])
                }
            })
            .collect();
        let view = View::strided(node.ty.dtype, axes);
        let (value, _) = self.value(x)?;
        let value = self.accumulated(value, node.ty.dtype);
        self.ir.reductions.push(Reduction {
            kind,
            value,
            reduced,
            view,
        });
        Ok(strides)
    }
}

/// Lowers the fused kernel made of `nodes` (topological order) over `domain`, writing
/// `outputs`.
pub(super) fn lower_fused(
    dag: &Dag,
    nodes: &[usize],
    domain: &[usize],
    outputs: &[Value],
) -> Result<Lowered> {
    let domain = domain_of(domain);
    let rank = domain.len();
    let mut b = Builder {
        dag,
        domain: domain.clone(),
        ir: KernelIr {
            rank,
            loads: Vec::new(),
            body: Vec::new(),
            stores: Vec::new(),
            reductions: Vec::new(),
        },
        members: nodes.iter().copied().collect(),
        load_args: Vec::new(),
        values: HashMap::new(),
    };
    let mut reduction_args: Vec<(Value, Vec<i64>)> = Vec::new();
    // A row kernel: some reduction's result is read by another node of the kernel.
    let is_reduction = |n: usize| dag.nodes[n].op.kind() == OpKind::Reduction;
    let row_kernel = nodes.iter().any(|&m| {
        dag.nodes[m]
            .args
            .iter()
            .any(|&a| matches!(a, Value::Node(p) if is_reduction(p) && nodes.contains(&p)))
    });
    let mut row_views: HashMap<Value, (View, Vec<i64>)> = HashMap::new();
    for &n in nodes {
        let node = &dag.nodes[n];
        match (node.op.kind(), node.op.builtin()) {
            (OpKind::Pointwise, _) => b.pointwise(n)?,
            (OpKind::Layout, Some(Builtin::BroadcastTo)) => {
                // The domain does the broadcasting: the value at each point is the operand's.
                let v = b.value(node.args[0])?;
                b.values.insert(Value::Node(n), v);
            }
            (OpKind::Reduction, _) if row_kernel => {
                let view = b.row_reduction(n)?;
                row_views.insert(Value::Node(n), view);
            }
            // A view is loaded where it is used (a view only another view reads is no load).
            (OpKind::Layout, _) => {}
            (OpKind::Reduction, _) => {
                let strides = b.reduction(n)?;
                reduction_args.push((Value::Node(n), strides));
            }
            _ => {
                return Err(lower_error(
                    dag,
                    n,
                    format!("`{}` cannot be part of a fused kernel", node.op.name()),
                ));
            }
        }
    }
    let reduced: Vec<Value> = reduction_args.iter().map(|(v, _)| *v).collect();
    for (v, _) in &reduction_args {
        if b.values.contains_key(v) {
            return Err(lower_error(
                dag,
                match v {
                    Value::Node(n) => *n,
                    Value::Input(_) => 0,
                },
                "a reduction's result is used inside its own kernel".into(),
            ));
        }
    }
    let mut store_args: Vec<(Value, Vec<i64>, i64, Vec<MapStage>)> = Vec::new();
    for &out in outputs {
        if reduced.contains(&out) {
            continue;
        }
        let (value, dtype) = match (b.values.get(&out), out) {
            (Some(&v), _) => v,
            // A view written out (read by other kernels too): a copy folded into this one.
            (None, Value::Node(v)) if b.is_view(v) => b.value(out)?,
            (None, _) => return Err(b.shape_error(out)),
        };
        let ty = dag.ty(out);
        let (view, strides) = match row_views.get(&out) {
            Some(row) => row.clone(),
            None => match broadcast_view(dtype, &ty.shape, &domain) {
                Some(found) => found,
                None => return Err(b.shape_error(out)),
            },
        };
        b.ir.stores.push(Store { value, view });
        store_args.push((out, strides, 0, Vec::new()));
    }
    let mut args = Vec::new();
    let mut strides = Vec::new();
    let mut offsets = Vec::new();
    let mut maps = Vec::new();
    for (value, s, offset, stages) in b.load_args.into_iter().chain(store_args).chain(
        reduction_args
            .into_iter()
            .map(|(v, s)| (v, s, 0, Vec::new())),
    ) {
        args.push(value);
        strides.push(s);
        offsets.push(offset);
        maps.push(stages);
    }
    let launch = Launch {
        sizes: domain.iter().map(|&d| d as i64).collect(),
        offsets,
        strides,
        maps,
    };
    Ok((b.ir, launch, args))
}
