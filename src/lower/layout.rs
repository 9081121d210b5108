//! Layout ops as strided copies: the same kernel IR with one load and one store.
//!
//! A transpose, slice or broadcast reads its operand through a view with permuted, scaled or
//! zero strides and writes its result contiguously; a reshape is a contiguous copy; a concat
//! is one copy per piece, each writing a window of the result (and converting to the result
//! dtype, as concat's operands meet at it).

use super::ir::{Gathered, Instr, KernelIr, Launch, Prec, RowArithmetic, Scatter, Store};
use super::view::{classify, contiguous_strides, domain_of};
use super::{Lowered, lower_error};
use crate::dag::{Dag, Value};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::check::{BuiltinPlan, plan_builtin};
use crate::shape::IndexMap;

/// One copy over `domain`: read `src` (dtype `from`) at `src_strides` + `src_offset`, write
/// `dst` (dtype `to`) at `dst_strides` + `dst_offset`.
struct Copy {
    domain: Vec<usize>,
    src: Value,
    from: DType,
    src_strides: Vec<i64>,
    src_offset: i64,
    dst: Value,
    to: DType,
    dst_strides: Vec<i64>,
    dst_offset: i64,
}

impl Copy {
    fn lower(mut self) -> Lowered {
        if self.domain.is_empty() {
            self.domain = domain_of(&self.domain);
            self.src_strides = vec![0];
            self.dst_strides = vec![0];
        }
        let load = classify(self.from, &self.domain, &mut self.src_strides);
        let store = classify(self.to, &self.domain, &mut self.dst_strides);
        let mut body = vec![Instr::Load { view: 0 }];
        if self.from != self.to {
            // Widening f32 to a double-held dtype is exact; a rounding follows unless the
            // result is f64 itself.
            if Prec::of(self.from) == Prec::F32 && Prec::of(self.to) == Prec::F64 {
                body.push(Instr::Widen { x: 0 });
            }
            // An integer becomes an f64 by a rounding too.
            if self.to != DType::F64 || Prec::of(self.from) == Prec::I64 {
                let x = body.len() - 1;
                body.push(Instr::Round { x, dtype: self.to });
            }
        }
        let value = body.len() - 1;
        let ir = KernelIr {
            rank: self.domain.len(),
            row_arithmetic: RowArithmetic::default(),
            loads: vec![load],
            body,
            stores: vec![Store::new(value, store)],
            reductions: Vec::new(),
        };
        let launch = Launch {
            sizes: self.domain.iter().map(|&d| d as i64).collect(),
            strides: vec![self.src_strides, self.dst_strides],
            offsets: vec![self.src_offset, self.dst_offset],
            maps: Vec::new(),
            ranges: Vec::new(),
            gathers: Vec::new(),
        };
        (ir, launch, vec![self.src, self.dst])
    }
}

/// The copies that compute layout node `n`.
pub(super) fn lower_copy(dag: &Dag, n: usize) -> Result<Vec<Lowered>> {
    let node = &dag.nodes[n];
    let out = &node.ty;
    let shapes: Vec<&[usize]> = node.args.iter().map(|&a| &dag.ty(a).shape[..]).collect();
    let builtin = node
        .op
        .builtin()
        .ok_or_else(|| lower_error(dag, n, "layout op without a builtin".into()))?;
    let (plan, _) = plan_builtin(builtin, &shapes, &node.attrs)
        .map_err(|e| lower_error(dag, n, e.to_string()))?;
    let dst = Value::Node(n);
    let out_strides = contiguous_strides(&out.shape);
    let x = node.args[0];
    let x_ty = dag.ty(x);
    let copy = |src_strides: Vec<i64>, src_offset: i64| Copy {
        domain: out.shape.clone(),
        src: x,
        from: x_ty.dtype,
        src_strides,
        src_offset,
        dst,
        to: out.dtype,
        dst_strides: out_strides.clone(),
        dst_offset: 0,
    };
    let copies = match plan {
        // A re-indexing of one operand: read it through the view a fused kernel would use.
        BuiltinPlan::BroadcastTo(_)
        | BuiltinPlan::Reshape(_)
        | BuiltinPlan::Transpose(_)
        | BuiltinPlan::Slice(_) => {
            let map = plan.index_map(&IndexMap::contiguous(&x_ty.shape), &x_ty.shape, &out.shape);
            // The operand's buffer is contiguous, and every reshape of one is strided.
            let view = map
                .as_ref()
                .and_then(IndexMap::as_strided)
                .ok_or_else(|| lower_error(dag, n, "no view reads this layout op".into()))?;
            vec![copy(view.strides.clone(), view.offset)]
        }
        BuiltinPlan::Concat(axis) => {
            let mut at = 0usize;
            let mut pieces = Vec::new();
            for &arg in &node.args {
                let ty = dag.ty(arg);
                pieces.push(Copy {
                    domain: ty.shape.clone(),
                    src: arg,
                    from: ty.dtype,
                    src_strides: contiguous_strides(&ty.shape),
                    src_offset: 0,
                    dst,
                    to: out.dtype,
                    dst_strides: out_strides.clone(),
                    dst_offset: at as i64 * out_strides[axis],
                });
                at += ty.shape[axis];
            }
            pieces
        }
        BuiltinPlan::Gather { axis } => return Ok(vec![lower_gather(dag, n, axis, false)]),
        BuiltinPlan::GatherElements { axis } => return Ok(vec![lower_gather(dag, n, axis, true)]),
        BuiltinPlan::ScatterAdd { axis } => {
            // The data first, whole; then the updates added into that copy.
            let whole = copy(contiguous_strides(&x_ty.shape), 0);
            return Ok(vec![whole.lower(), lower_scatter(dag, n, axis)]);
        }
        _ => {
            return Err(lower_error(
                dag,
                n,
                format!("`{}` is not a layout op", node.op.name()),
            ));
        }
    };
    Ok(copies.into_iter().map(Copy::lower).collect())
}

/// Per axis of a gather's result (of rank `rank`; `elements`: gather_elements), the strides
/// through which its data and its indices move over their contiguous buffers: data stands still
/// along the axes the index comes from (its own coordinate along `axis` is the index's), and
/// the indices move only along those axes.
pub(super) fn gather_strides(
    data: &[usize],
    indices: &[usize],
    rank: usize,
    axis: usize,
    elements: bool,
) -> (Vec<i64>, Vec<i64>) {
    let data_strides = contiguous_strides(data);
    let index_strides = contiguous_strides(indices);
    if elements {
        let mut kept = data_strides;
        kept[axis] = 0;
        return (kept, index_strides);
    }
    // The result's axes: data's before `axis`, the indices', data's after `axis`.
    let q = indices.len();
    let kept = |d: usize| match d {
        d if d < axis => data_strides[d],
        d if d < axis + q => 0,
        d => data_strides[d - q + 1],
    };
    let index = |d: usize| match d {
        d if d >= axis && d < axis + q => index_strides[d - axis],
        _ => 0,
    };
    (
        (0..rank).map(kept).collect(),
        (0..rank).map(index).collect(),
    )
}

/// Gather node `n` (`elements`: gather_elements) along data's `axis` as a kernel over its
/// result: each point loads its index, then the data element at that index
/// ([`Instr::GatherLoad`]). The data's view moves with the result's coordinates on the axes
/// data keeps and stands still on the ones the index comes from; the index moves the rest.
fn lower_gather(dag: &Dag, n: usize, axis: usize, elements: bool) -> Lowered {
    let node = &dag.nodes[n];
    let (data, indices) = (node.args[0], node.args[1]);
    let (data_ty, indices_ty) = (dag.ty(data), dag.ty(indices));
    let out = &node.ty.shape;
    let data_strides = contiguous_strides(&data_ty.shape);
    let (mut data_view, mut index_view) =
        gather_strides(&data_ty.shape, &indices_ty.shape, out.len(), axis, elements);
    let mut domain = out.clone();
    if domain.is_empty() {
        domain = domain_of(&domain);
        data_view = vec![0];
        index_view = vec![0];
    }
    let mut out_strides = contiguous_strides(&domain);
    let index_load = classify(indices_ty.dtype, &domain, &mut index_view);
    let data_load = classify(data_ty.dtype, &domain, &mut data_view);
    let store = classify(node.ty.dtype, &domain, &mut out_strides);
    let ir = KernelIr {
        rank: domain.len(),
        row_arithmetic: RowArithmetic::default(),
        loads: vec![index_load, data_load],
        body: vec![
            Instr::Load { view: 0 },
            Instr::GatherLoad {
                view: 1,
                index: 0,
                gather: 0,
            },
        ],
        stores: vec![Store::new(1, store)],
        reductions: Vec::new(),
    };
    let launch = Launch {
        sizes: domain.iter().map(|&d| d as i64).collect(),
        strides: vec![index_view, data_view, out_strides],
        offsets: vec![0, 0, 0],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: vec![Gathered {
            stride: data_strides[axis],
            extent: data_ty.shape[axis] as i64,
        }],
    };
    (ir, launch, vec![indices, data, Value::Node(n)])
}

/// The scatter kernel of scatter_add node `n` along data's `axis` ([`Scatter`]): over the
/// updates' shape with `axis` moved innermost, each point loads its index and its update and
/// adds the update into the result (already holding a copy of the data) at that index. With
/// the scattered axis innermost, the points that can add into one element share a row, which
/// one thread walks in order.
fn lower_scatter(dag: &Dag, n: usize, axis: usize) -> Lowered {
    let node = &dag.nodes[n];
    let (indices, updates) = (node.args[1], node.args[2]);
    let (indices_ty, updates_ty) = (dag.ty(indices), dag.ty(updates));
    let out = &node.ty.shape;
    let order: Vec<usize> = (0..out.len())
        .filter(|&d| d != axis)
        .chain([axis])
        .collect();
    let in_order = |strides: Vec<i64>| -> Vec<i64> { order.iter().map(|&d| strides[d]).collect() };
    let domain: Vec<usize> = order.iter().map(|&d| updates_ty.shape[d]).collect();
    let out_strides = contiguous_strides(out);
    // Indices broadcast along an axis of the updates (size 1 there) stand still along it.
    let index_strides: Vec<i64> = contiguous_strides(&indices_ty.shape)
        .into_iter()
        .zip(indices_ty.shape.iter().zip(&updates_ty.shape))
        .map(|(s, (&i, &u))| if i == u { s } else { 0 })
        .collect();
    let mut index_view = in_order(index_strides);
    let mut update_view = in_order(contiguous_strides(&updates_ty.shape));
    let mut out_view = in_order(out_strides.clone());
    // The index moves the result along `axis`; the point's own coordinate there does not.
    *out_view.last_mut().expect("scatter_add has rank 1 or more") = 0;
    let index_load = classify(indices_ty.dtype, &domain, &mut index_view);
    let update_load = classify(updates_ty.dtype, &domain, &mut update_view);
    let store = classify(node.ty.dtype, &domain, &mut out_view);
    let ir = KernelIr {
        rank: domain.len(),
        row_arithmetic: RowArithmetic::default(),
        loads: vec![index_load, update_load],
        body: vec![Instr::Load { view: 0 }, Instr::Load { view: 1 }],
        stores: vec![Store {
            value: 1,
            view: store,
            scatter: Some(Scatter {
                index: 0,
                gather: 0,
            }),
        }],
        reductions: Vec::new(),
    };
    let launch = Launch {
        sizes: domain.iter().map(|&d| d as i64).collect(),
        strides: vec![index_view, update_view, out_view],
        offsets: vec![0, 0, 0],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: vec![Gathered {
            stride: out_strides[axis],
            extent: out[axis] as i64,
        }],
    };
    (ir, launch, vec![indices, updates, Value::Node(n)])
}
