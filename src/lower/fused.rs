//! A fused kernel: pointwise nodes, broadcasts and reductions ending the kernel, over one
//! iteration domain, as straight-line SSA. A kernel in which a reduction's result is consumed
//! is a row kernel (see [`super::ir`]): each of its reductions is a row reduction of the
//! domain ([`crate::partition::row_reduction`]) and becomes an [`Instr::RowReduce`].
//!
//! A concat in the kernel is read in place (a *range select*): each operand is evaluated
//! over its own segment of the concat's axis, in a *context* that shifts every load by the
//! segment's start and reads only inside the segment ([`Instr::RangeLoad`]), and an
//! [`Instr::Select`] picks the operand of the segment holding each point. Values that only a
//! concat reads are evaluated in the contexts of its segments, not over the whole domain
//! (their shapes are the operands', not the domain's); a value needed in several contexts
//! is computed once in each.
//!
//! Each pointwise node is lowered the way the reference evaluator applies it
//! (`eval::pointwise`): operands rounded to the op's common dtype, the formula at the compute
//! precision of that dtype, the result rounded to the node's dtype. So a fused kernel rounds
//! exactly where the unfused graph rounds, and differs from it only by the order of f64
//! summation in reductions and by the few-ulp accuracy of vector math.

use super::ir::{
    Axis, Gathered, Instr, KernelIr, Launch, MapStage, Prec, ReduceKind, Reduction, RowArithmetic,
    Store, ValueId, View,
};
use super::view::{broadcast_view, contiguous_strides, domain_of, mapped_view, strided_view};
use super::{Lowered, lower_error};
use crate::dag::{Dag, Value};
use crate::dtype::{Category, DType};
use crate::error::Result;
use crate::eval::pointwise::{common_dtype, computes_in_integers, converts};
use crate::formula::Expr;
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::partition::SegmentWrite;
use crate::rules::{Builtin, OpKind};
use crate::shape::IndexMap;
use std::collections::{HashMap, HashSet};

/// One segment of a concat read in place: the indices `start..end` along domain axis
/// `axis`. Values evaluated in it read their operands at `index - start` along that axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    axis: usize,
    start: i64,
    end: i64,
}

/// Builds SSA, remembering each dag value's SSA id and dtype per context: context 0 is the
/// whole domain, context `c > 0` is segment `segments[c - 1]` (launch range `c - 1`).
struct Builder<'a> {
    dag: &'a Dag,
    domain: Vec<usize>,
    ir: KernelIr,
    /// The kernel's nodes: a layout node among them is a view, read through an index map.
    members: HashSet<usize>,
    /// Per load view: the value it reads, the launch strides, the offset (of the element, or
    /// of the position for an index map) and the index map's stages.
    load_args: Vec<(Value, Vec<i64>, i64, Vec<MapStage>)>,
    values: HashMap<(Value, usize), (ValueId, DType)>,
    /// The segments of the concats read in place, in the order they were made.
    segments: Vec<Segment>,
    /// Per gather of the kernel ([`Instr::GatherLoad`]), the axis its index moves along.
    gathers: Vec<Gathered>,
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

    /// The domain of context `ctx`: the kernel's, with a segment's axis cut to its length.
    fn domain_of_context(&self, ctx: usize) -> Vec<usize> {
        let mut domain = self.domain.clone();
        if let Some(seg) = ctx.checked_sub(1).map(|c| self.segments[c]) {
            domain[seg.axis] = (seg.end - seg.start) as usize;
        }
        domain
    }

    /// A load of `source` (a value of `value`'s type read through `map`) in context `ctx`:
    /// over the whole domain a plain load; in a segment a range load whose offset is moved back
    /// by the segment's start, so index `start` reads element 0. The shift is on the position
    /// before any index-map stage, which is linear in the domain index, so it holds for mapped
    /// views too.
    fn load(
        &mut self,
        value: Value,
        source: Value,
        map: &IndexMap,
        ctx: usize,
    ) -> Result<(ValueId, DType)> {
        let ty = self.dag.ty(value);
        let domain = self.domain_of_context(ctx);
        let Some((view, strides, offset, stages)) = mapped_view(ty.dtype, &ty.shape, map, &domain)
        else {
            return Err(self.shape_error(value));
        };
        self.ir.loads.push(view);
        let view = self.ir.loads.len() - 1;
        let (instr, offset) = match ctx.checked_sub(1) {
            None => (Instr::Load { view }, offset),
            Some(range) => {
                let seg = self.segments[range];
                let shift = seg.start.saturating_mul(strides[seg.axis]);
                let instr = Instr::RangeLoad {
                    view,
                    axis: seg.axis,
                    range,
                };
                (instr, offset.saturating_sub(shift))
            }
        };
        self.load_args.push((source, strides, offset, stages));
        Ok((self.push(instr), ty.dtype))
    }

    /// The SSA value of `value` in context `ctx`: computed earlier in this kernel, a literal
    /// inlined here, a node of this kernel computed now (its operands first), or a load of a
    /// kernel input.
    fn value(&mut self, value: Value, ctx: usize) -> Result<(ValueId, DType)> {
        if let Some(&v) = self.values.get(&(value, ctx)) {
            return Ok(v);
        }
        let dag = self.dag;
        let result = match value {
            Value::Node(n) if dag.nodes[n].op.is_literal() => {
                self.pointwise(n, ctx)?;
                return Ok(self.values[&(value, ctx)]);
            }
            Value::Node(v) if self.is_view(v) => {
                let (source, map) = self.view_of(v)?;
                if let Value::Node(s) = source
                    && dag.nodes[s].op.is_literal()
                {
                    // A literal is the same at every index, so any view of it is the literal.
                    let literal = self.value(source, ctx)?;
                    self.values.insert((value, ctx), literal);
                    return Ok(literal);
                }
                self.load(value, source, &map, ctx)?
            }
            Value::Node(c) if self.is_concat(c) => self.concat(c, ctx)?,
            Value::Node(g) if self.is_gather(g) => self.gather(g, ctx)?,
            Value::Node(p) if self.members.contains(&p) => {
                let node = &dag.nodes[p];
                match (node.op.kind(), node.op.builtin()) {
                    (OpKind::Pointwise, _) => {
                        self.pointwise(p, ctx)?;
                        return Ok(self.values[&(value, ctx)]);
                    }
                    // The domain does the broadcasting: each point reads the operand's value.
                    (OpKind::Layout, Some(Builtin::BroadcastTo)) => {
                        self.value(node.args[0], ctx)?
                    }
                    _ => {
                        return Err(lower_error(
                            dag,
                            p,
                            "a reduction's result is used inside its own kernel".into(),
                        ));
                    }
                }
            }
            _ => {
                let map = IndexMap::contiguous(&dag.ty(value).shape);
                self.load(value, value, &map, ctx)?
            }
        };
        self.values.insert((value, ctx), result);
        Ok(result)
    }

    /// Whether node `n` of this kernel is a concat, read in place by segments.
    fn is_concat(&self, n: usize) -> bool {
        self.members.contains(&n) && self.dag.nodes[n].op.builtin() == Some(Builtin::Concat)
    }

    /// Concat node `c` read in place in context `ctx`: each operand with elements is evaluated
    /// in the context of its segment and converted to the concat's dtype, and a
    /// [`Instr::Select`] picks among them by the index along the concat's axis. A concat that
    /// the domain broadcasts along its axis (its size there is 1), or with one operand that
    /// has elements, is that operand.
    fn concat(&mut self, c: usize, ctx: usize) -> Result<(ValueId, DType)> {
        let dag = self.dag;
        let node = &dag.nodes[c];
        let shapes: Vec<&[usize]> = node.args.iter().map(|&a| &dag.ty(a).shape[..]).collect();
        let plan = plan_builtin(Builtin::Concat, &shapes, &node.attrs)
            .map_err(|e| lower_error(dag, c, e.to_string()))?
            .0;
        let BuiltinPlan::Concat(axis) = plan else {
            return Err(lower_error(dag, c, "not a concat".into()));
        };
        let out = &node.ty;
        let domain = self.domain_of_context(ctx);
        let Some(lead) = domain.len().checked_sub(out.shape.len()) else {
            return Err(self.shape_error(Value::Node(c)));
        };
        let d = lead + axis;
        let filled: Vec<usize> = (0..node.args.len())
            .filter(|&s| shapes[s][axis] > 0)
            .collect();
        let convert = |b: &mut Self, (v, from): (ValueId, DType)| b.convert(v, from, out.dtype);
        if out.shape[axis] != domain[d] || filled.len() <= 1 {
            let s = filled.first().copied().unwrap_or(0);
            let v = self.value(node.args[s], ctx)?;
            return Ok((convert(self, v), out.dtype));
        }
        let base = match ctx.checked_sub(1).map(|r| self.segments[r]) {
            None => 0,
            Some(seg) if seg.axis == d => seg.start,
            Some(_) => {
                return Err(lower_error(
                    dag,
                    c,
                    "a concat inside another concat's operand must share its axis".into(),
                ));
            }
        };
        let mut starts = Vec::with_capacity(shapes.len());
        let mut at = 0i64;
        for shape in &shapes {
            starts.push(at);
            at += shape[axis] as i64;
        }
        let mut cases = Vec::new();
        let mut ranges = Vec::new();
        for &s in &filled {
            let start = base + starts[s];
            let end = start + shapes[s][axis] as i64;
            // A segment is its axis and bounds: a concat read again, and concats whose
            // segments coincide, find the same one. Their selects then pick by the same
            // launch ranges, so the kernel cuts into pieces (`lower::split`) as the partition
            // priced it (`Facts::segments` compares segments by value), and values in a
            // segment are built once.
            let seg = Segment {
                axis: d,
                start,
                end,
            };
            let child = match self.segments.iter().position(|&other| other == seg) {
                Some(k) => k + 1,
                None => {
                    self.segments.push(seg);
                    self.segments.len()
                }
            };
            let v = self.value(node.args[s], child)?;
            cases.push(convert(self, v));
            ranges.push(child - 1);
        }
        let id = self.push(Instr::Select {
            axis: d,
            ranges,
            cases,
            prec: Prec::of(out.dtype),
        });
        Ok((id, out.dtype))
    }

    /// `x` of dtype `from` as a value of dtype `to`, rounded as a cast rounds it (concat's
    /// operands meet at its promoted dtype).
    fn convert(&mut self, x: ValueId, from: DType, to: DType) -> ValueId {
        if from == to || (Prec::of(from) == Prec::F32 && to == DType::F32) {
            return x;
        }
        if to == DType::F64 && Prec::of(from) == Prec::F32 {
            return self.push(Instr::Widen { x });
        }
        if to == DType::F64 && Prec::of(from) == Prec::F64 {
            return x;
        }
        self.round(x, to)
    }

    /// Whether node `n` of this kernel is a view: a layout op other than a broadcast, a concat
    /// or a gather (the partitioner admits those only as views of their operand's buffer).
    fn is_view(&self, n: usize) -> bool {
        let op = &self.dag.nodes[n].op;
        self.members.contains(&n)
            && op.kind() == OpKind::Layout
            && !matches!(op.builtin(), Some(Builtin::BroadcastTo | Builtin::Concat))
            && !self.is_gather(n)
    }

    /// Whether node `n` of this kernel is a gather (gather, gather_elements), read as a load
    /// at a computed index.
    fn is_gather(&self, n: usize) -> bool {
        self.members.contains(&n)
            && matches!(
                self.dag.nodes[n].op.builtin(),
                Some(Builtin::Gather | Builtin::GatherElements)
            )
    }

    /// Gather node `g` at the current point ([`Instr::GatherLoad`]): its index loaded from the
    /// indices' buffer (or a literal), then the data element it names. The partitioner keeps
    /// both operands out of the kernel (`greedy/candidate.rs`), so both are buffers, read
    /// through the strides a gather kernel of its own reads them with, broadcast over the
    /// domain like any value of the gather's shape.
    fn gather(&mut self, g: usize, ctx: usize) -> Result<(ValueId, DType)> {
        let dag = self.dag;
        let node = &dag.nodes[g];
        let (data, indices) = (node.args[0], node.args[1]);
        let (data_ty, index_ty) = (dag.ty(data), dag.ty(indices));
        if ctx != 0 || self.produced_here(data) || self.produced_here(indices) {
            return Err(lower_error(
                dag,
                g,
                "a gather's operands are computed in its own kernel".into(),
            ));
        }
        let shapes = [&data_ty.shape[..], &index_ty.shape[..]];
        let builtin = node.op.builtin().expect("a gather has a builtin");
        let (plan, _) = plan_builtin(builtin, &shapes, &node.attrs)
            .map_err(|e| lower_error(dag, g, e.to_string()))?;
        let (axis, elements) = match plan {
            BuiltinPlan::Gather { axis } => (axis, false),
            BuiltinPlan::GatherElements { axis } => (axis, true),
            _ => return Err(lower_error(dag, g, "not a gather".into())),
        };
        let out = &node.ty.shape;
        let (data_own, index_own) = super::layout::gather_strides(
            &data_ty.shape,
            &index_ty.shape,
            out.len(),
            axis,
            elements,
        );
        let domain = self.domain.clone();
        let index = match indices {
            Value::Node(p) if dag.nodes[p].op.is_literal() => self.value(indices, ctx)?.0,
            _ => {
                let (view, strides) = strided_view(index_ty.dtype, out, &index_own, &domain)
                    .ok_or_else(|| self.shape_error(Value::Node(g)))?;
                self.ir.loads.push(view);
                self.load_args.push((indices, strides, 0, Vec::new()));
                let view = self.ir.loads.len() - 1;
                self.push(Instr::Load { view })
            }
        };
        let (view, strides) = strided_view(data_ty.dtype, out, &data_own, &domain)
            .ok_or_else(|| self.shape_error(Value::Node(g)))?;
        self.ir.loads.push(view);
        self.load_args.push((data, strides, 0, Vec::new()));
        let view = self.ir.loads.len() - 1;
        self.gathers.push(Gathered {
            stride: contiguous_strides(&data_ty.shape)[axis],
            extent: data_ty.shape[axis] as i64,
        });
        let gather = self.gathers.len() - 1;
        Ok((
            self.push(Instr::GatherLoad {
                view,
                index,
                gather,
            }),
            data_ty.dtype,
        ))
    }

    /// Whether `value` is computed by a node of this kernel (a literal is not: it is inlined).
    fn produced_here(&self, value: Value) -> bool {
        matches!(value, Value::Node(p) if self.members.contains(&p) && !self.dag.nodes[p].op.is_literal())
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
        let (plan, _) = plan_builtin(builtin, &[x_shape], &node.attrs)
            .map_err(|e| lower_error(dag, v, e.to_string()))?;
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
    fn pointwise(&mut self, n: usize, ctx: usize) -> Result<()> {
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
            let (mut v, dtype) = self.value(arg, ctx)?;
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
        self.values.insert((Value::Node(n), ctx), (result, out));
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
        let (value, _) = self.value(x, 0)?;
        let value = self.accumulated(value, node.ty.dtype);
        let id = self.push(Instr::RowReduce {
            kind,
            x: value,
            dtype: node.ty.dtype,
        });
        self.values.insert((Value::Node(n), 0), (id, node.ty.dtype));
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
    /// Its results go to a buffer of their own, contiguous, or with `into` to their segment
    /// of a concat written in place: the concat's strides, from the segment's start (the
    /// returned offset). The argument the results are written through is returned too.
    fn reduction(&mut self, n: usize, into: Option<&SegmentWrite>) -> Result<ResultView> {
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
        .map_err(|e| lower_error(dag, n, e.to_string()))?
        .0;
        let rank = self.domain.len();
        // Which domain axes are reduced, and the output's stride along each kept one.
        let kind = match &plan {
            BuiltinPlan::Reduce {
                builtin: Builtin::Mean,
                ..
            } => ReduceKind::Mean,
            BuiltinPlan::Reduce {
                builtin: Builtin::ReduceMax,
                ..
            } => ReduceKind::Max,
            _ => ReduceKind::Sum,
        };
        let reduced = plan
            .reduced_axes(x_shape.len(), rank)
            .ok_or_else(|| lower_error(dag, n, "not a reduction".into()))?;
        // Kept axes appear in the output in domain order (keepdim only adds size-1 axes).
        let kept: Vec<usize> = (0..rank).filter(|&d| !reduced[d]).collect();
        let (target, out_strides, offset) = match into {
            None => {
                let sizes: Vec<usize> = kept.iter().map(|&d| self.domain[d]).collect();
                (Value::Node(n), super::view::contiguous_strides(&sizes), 0)
            }
            Some(s) => {
                let whole = &dag.nodes[s.concat].ty.shape;
                let own = contiguous_strides(whole);
                let out = &node.ty.shape;
                if out.len() != whole.len() || s.axis >= whole.len() {
                    return Err(self.shape_error(Value::Node(n)));
                }
                // The output's axes are the kept ones, one for one, or (keepdim, sum_to_size)
                // the domain's trailing axes, right-aligned.
                let strides = if out.len() == kept.len() {
                    own.clone()
                } else {
                    let lead = rank - out.len();
                    kept.iter().map(|&d| own[d - lead]).collect()
                };
                (Value::Node(s.concat), strides, s.start as i64 * own[s.axis])
            }
        };
        let mut strides = vec![0i64; rank];
        for (k, &d) in kept.iter().enumerate() {
            strides[d] = out_strides[k];
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
        let (value, _) = self.value(x, 0)?;
        let value = self.accumulated(value, node.ty.dtype);
        self.ir.reductions.push(Reduction {
            kind,
            value,
            reduced,
            view,
        });
        Ok(ResultView {
            arg: target,
            strides,
            offset,
        })
    }
}

/// Where a reduction's results go: the argument they are written through (the reduction's
/// own value, or a concat written in place), its strides over the domain (0 on reduced axes)
/// and its offset.
struct ResultView {
    arg: Value,
    strides: Vec<i64>,
    offset: i64,
}

/// A store's argument: the value written through (the output, or the concat written in
/// place), its strides over the domain, its offset and its index-map stages (none).
type StoreArg = (Value, Vec<i64>, i64, Vec<MapStage>);

impl Builder<'_> {
    /// The stores of the kernel's pointwise results: each of `outputs` not `reduced` (row
    /// reductions' results through their `row_views`), then each of `segments` written in
    /// place into its concat's buffer; their arguments, in store order.
    fn store_results(
        &mut self,
        outputs: &[Value],
        segments: &[SegmentWrite],
        reduced: &[Value],
        row_views: &HashMap<Value, (View, Vec<i64>)>,
    ) -> Result<Vec<StoreArg>> {
        let dag = self.dag;
        let mut store_args: Vec<StoreArg> = Vec::new();
        for &out in outputs {
            if reduced.contains(&out) {
                continue;
            }
            let (value, dtype) = match (self.values.get(&(out, 0)), out) {
                (Some(&v), _) => v,
                // A view or a concat written out (read by other kernels too): a copy folded into
                // this one.
                (None, Value::Node(v)) if self.members.contains(&v) => self.value(out, 0)?,
                (None, _) => return Err(self.shape_error(out)),
            };
            let ty = dag.ty(out);
            let (view, strides) = match row_views.get(&out) {
                Some(row) => row.clone(),
                None => match broadcast_view(dtype, &ty.shape, &self.domain) {
                    Some(found) => found,
                    None => return Err(self.shape_error(out)),
                },
            };
            self.ir.stores.push(Store::new(value, view));
            store_args.push((out, strides, 0, Vec::new()));
        }
        for s in segments {
            let out = Value::Node(s.value);
            if reduced.contains(&out) {
                // Stored by its accumulator, through the concat's view (above).
                continue;
            }
            let (value, dtype) = match self.values.get(&(out, 0)) {
                Some(&v) => v,
                None if self.members.contains(&s.value) => self.value(out, 0)?,
                None => return Err(self.shape_error(out)),
            };
            let whole = &dag.nodes[s.concat].ty.shape;
            let own = contiguous_strides(whole);
            let part = &dag.ty(out).shape;
            let fits = part.len() == whole.len() && s.axis < whole.len();
            let Some((view, strides)) =
                strided_view(dtype, part, &own, &self.domain).filter(|_| fits)
            else {
                return Err(self.shape_error(out));
            };
            self.ir.stores.push(Store::new(value, view));
            let offset = s.start as i64 * own[s.axis];
            store_args.push((Value::Node(s.concat), strides, offset, Vec::new()));
        }
        Ok(store_args)
    }
}

/// Lowers the fused kernel made of `nodes` (topological order) over `domain`, writing
/// `outputs`, and storing each of `segments` into its concat's buffer (a concat written in
/// place: the store's view is the concat's strides from the segment's start on).
pub(super) fn lower_fused(
    dag: &Dag,
    nodes: &[usize],
    domain: &[usize],
    outputs: &[Value],
    segments: &[SegmentWrite],
) -> Result<Lowered> {
    let domain = domain_of(domain);
    let rank = domain.len();
    let mut b = Builder {
        dag,
        domain: domain.clone(),
        ir: KernelIr {
            rank,
            row_arithmetic: RowArithmetic::default(),
            loads: Vec::new(),
            body: Vec::new(),
            stores: Vec::new(),
            reductions: Vec::new(),
        },
        members: nodes.iter().copied().collect(),
        load_args: Vec::new(),
        values: HashMap::new(),
        segments: Vec::new(),
        gathers: Vec::new(),
    };
    // Per reduction: its value, and where its results go.
    let mut reduction_args: Vec<(Value, ResultView)> = Vec::new();
    // A row kernel: some reduction's result is read by another node of the kernel.
    let is_reduction = |n: usize| dag.nodes[n].op.kind() == OpKind::Reduction;
    let row_kernel = nodes.iter().any(|&m| {
        dag.nodes[m]
            .args
            .iter()
            .any(|&a| matches!(a, Value::Node(p) if is_reduction(p) && nodes.contains(&p)))
    });
    // The nodes evaluated over the whole domain: what the kernel writes or reduces, and what
    // those read, except through a concat (whose operands are evaluated over their segments,
    // on demand).
    let mut whole: HashSet<usize> = outputs
        .iter()
        .filter_map(|&v| match v {
            Value::Node(n) => Some(n),
            Value::Input(_) => None,
        })
        .chain(nodes.iter().copied().filter(|&n| is_reduction(n)))
        .chain(segments.iter().map(|s| s.value))
        .collect();
    for &n in nodes.iter().rev() {
        if whole.contains(&n) && !b.is_concat(n) {
            for &arg in &dag.nodes[n].args {
                if let Value::Node(p) = arg
                    && b.members.contains(&p)
                {
                    whole.insert(p);
                }
            }
        }
    }
    let mut row_views: HashMap<Value, (View, Vec<i64>)> = HashMap::new();
    for &n in nodes {
        let node = &dag.nodes[n];
        if !whole.contains(&n) {
            continue;
        }
        match (node.op.kind(), node.op.builtin()) {
            (OpKind::Pointwise, _) => b.pointwise(n, 0)?,
            (OpKind::Layout, Some(Builtin::BroadcastTo)) => {
                // The domain does the broadcasting: the value at each point is the operand's.
                let v = b.value(node.args[0], 0)?;
                b.values.insert((Value::Node(n), 0), v);
            }
            (OpKind::Reduction, _) if row_kernel => {
                let view = b.row_reduction(n)?;
                row_views.insert(Value::Node(n), view);
            }
            // A view is loaded where it is used (a view only another view reads is no load),
            // and a concat is read where it is used.
            (OpKind::Layout, _) => {}
            (OpKind::Reduction, _) => {
                let into = segments.iter().find(|s| s.value == n);
                reduction_args.push((Value::Node(n), b.reduction(n, into)?));
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
        if b.values.contains_key(&(*v, 0)) {
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
    let store_args = b.store_results(outputs, segments, &reduced, &row_views)?;
    let mut args = Vec::new();
    let mut strides = Vec::new();
    let mut offsets = Vec::new();
    let mut maps = Vec::new();
    for (value, s, offset, stages) in b.load_args.into_iter().chain(store_args).chain(
        reduction_args
            .into_iter()
            .map(|(_, r)| (r.arg, r.strides, r.offset, Vec::new())),
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
        ranges: b.segments.iter().map(|s| (s.start, s.end)).collect(),
        gathers: b.gathers,
    };
    Ok((b.ir, launch, args))
}
