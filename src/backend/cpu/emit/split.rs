//! Per-segment loops for a kernel that reads a concat by ranges.
//!
//! A range-select kernel evaluated as written computes every operand of the concat at every
//! point (at a coordinate clamped into the operand's range) and then selects: each element
//! pays for every operand's ops, and the clamped indices keep the loops off the explicit
//! vector path. When the select runs along a loop axis of the kernel, the same result comes
//! from running the loop over that axis as consecutive loops, one per segment, each of which
//! evaluates only its own operand: a *piece*. A piece is an ordinary pointwise kernel (its
//! range loads become plain loads, its select becomes the operand it picks), so it is emitted
//! by the ordinary loop nests, vector paths included, and each element costs what it would in
//! a kernel of its own.
//!
//! The C function of such a kernel keeps the kernel ABI. It checks at run time that the
//! launch's ranges split the axis into consecutive segments from 0 to its size, and then calls
//! each piece over its segment: the same strides, the sizes with the axis cut to the segment,
//! and every offset moved to the segment's start. (A range load's offset was moved back by its
//! segment's start when it was lowered, so moving it forward again reads the operand's own
//! element 0 at the segment's first index.) Any other launch runs the clamped form, which is
//! emitted as well. Kernels the pieces cannot express (two selects over different ranges, a
//! range load outside its own segment, a reduction, a store written only at index 0 of the
//! axis) are emitted in the clamped form only.

use crate::lower::ir::{Axis, Instr, KernelIr, ValueId};

/// The pieces of a range-select kernel: the select's axis, its launch ranges (one per piece,
/// in order along the axis) and the pointwise kernel evaluated over each.
#[derive(Debug, Clone)]
pub(super) struct Split {
    pub axis: usize,
    pub ranges: Vec<usize>,
    pub pieces: Vec<KernelIr>,
}

/// The per-segment pieces of `ir`, when every select of it picks along one axis by the same
/// ranges and each piece needs no other segment's values (see the module documentation).
pub(super) fn split(ir: &KernelIr) -> Option<Split> {
    if !ir.has_ranges() || !ir.reductions.is_empty() || ir.is_row_kernel() {
        return None;
    }
    let mut select: Option<(usize, &Vec<usize>)> = None;
    for instr in &ir.body {
        if let Instr::Select { axis, ranges, .. } = instr {
            match select {
                None => select = Some((*axis, ranges)),
                Some(seen) if seen == (*axis, ranges) => {}
                Some(_) => return None,
            }
        }
    }
    let (axis, ranges) = select?;
    // A store smaller than the domain on the axis is written at index 0 only, which a piece
    // past the first would not see.
    if ir
        .stores
        .iter()
        .any(|s| s.view.axes.get(axis) == Some(&Axis::Broadcast))
    {
        return None;
    }
    let pieces = (0..ranges.len())
        .map(|s| piece(ir, axis, ranges, s))
        .collect::<Option<Vec<_>>>()?;
    Some(Split {
        axis,
        ranges: ranges.clone(),
        pieces,
    })
}

/// The kernel evaluated over segment `s`: the values the stores need when every select
/// picks its case `s`, with range loads of range `ranges[s]` read as plain loads. `None` when
/// such a value needs a range load of another range.
fn piece(ir: &KernelIr, axis: usize, ranges: &[usize], s: usize) -> Option<KernelIr> {
    let n = ir.body.len();
    let mut live = vec![false; n];
    for store in &ir.stores {
        live[store.value] = true;
    }
    for id in (0..n).rev() {
        if !live[id] {
            continue;
        }
        match &ir.body[id] {
            Instr::Select { cases, .. } => live[cases[s]] = true,
            Instr::RangeLoad { axis: a, range, .. } if *a != axis || *range != ranges[s] => {
                return None;
            }
            instr => {
                for x in instr.operands() {
                    live[x] = true;
                }
            }
        }
    }
    let mut new_id: Vec<ValueId> = vec![0; n];
    let mut body = Vec::new();
    for id in 0..n {
        if !live[id] {
            continue;
        }
        let instr = match &ir.body[id] {
            Instr::Select { cases, .. } => {
                new_id[id] = new_id[cases[s]];
                continue;
            }
            Instr::RangeLoad { view, .. } => Instr::Load { view: *view },
            instr => renumbered(instr, &new_id),
        };
        new_id[id] = body.len();
        body.push(instr);
    }
    let mut stores = ir.stores.clone();
    for store in &mut stores {
        store.value = new_id[store.value];
    }
    Some(KernelIr {
        rank: ir.rank,
        loads: ir.loads.clone(),
        body,
        stores,
        reductions: Vec::new(),
    })
}

/// `instr` with every operand `x` replaced by `new_id[x]`.
fn renumbered(instr: &Instr, new_id: &[ValueId]) -> Instr {
    let mut instr = instr.clone();
    match &mut instr {
        Instr::Widen { x }
        | Instr::Round { x, .. }
        | Instr::Neg { x, .. }
        | Instr::RowReduce { x, .. } => *x = new_id[*x],
        Instr::Binary { a, b, .. } => {
            *a = new_id[*a];
            *b = new_id[*b];
        }
        Instr::Call { args, .. } => {
            for a in args {
                *a = new_id[*a];
            }
        }
        Instr::Select { cases, .. } => {
            for c in cases {
                *c = new_id[*c];
            }
        }
        Instr::Load { .. } | Instr::RangeLoad { .. } | Instr::Const { .. } | Instr::Int { .. } => {}
    }
    instr
}

/// The C function `name` of a split kernel: the range check, then each piece `{name}_s{k}` over
/// its segment, else the clamped form `{name}_c` (both emitted by the caller before it).
pub(super) fn wrapper(ir: &KernelIr, split: &Split, name: &str) -> String {
    let rank = ir.rank;
    let axis = split.axis;
    let args = ir.arg_count();
    let mut text = format!(
        "void {name}(const int64_t *sizes, const int64_t *strides, \
         const int64_t *offsets, void *const *ptrs) {{\n"
    );
    let words = rank + 2 * ir.range_count();
    // The segments must tile the axis in order; the lowering makes them so, and any other
    // launch takes the clamped form, which is right for every launch.
    let mut tiles = vec![format!("sizes[{}] == 0", rank + 2 * split.ranges[0])];
    for pair in split.ranges.windows(2) {
        tiles.push(format!(
            "sizes[{}] == sizes[{}]",
            rank + 2 * pair[0] + 1,
            rank + 2 * pair[1]
        ));
    }
    let last = split.ranges[split.ranges.len() - 1];
    tiles.push(format!("sizes[{}] == sizes[{axis}]", rank + 2 * last + 1));
    text.push_str(&format!("    if (!({})) {{\n", tiles.join(" && ")));
    text.push_str(&format!(
        "        {name}_c(sizes, strides, offsets, ptrs);\n        return;\n    }}\n"
    ));
    text.push_str(&format!("    int64_t cut[{words}];\n"));
    text.push_str(&format!(
        "    for (int k = 0; k < {words}; k++) cut[k] = sizes[k];\n"
    ));
    text.push_str(&format!("    int64_t moved[{}];\n", args.max(1)));
    for (k, &r) in split.ranges.iter().enumerate() {
        let start = format!("sizes[{}]", rank + 2 * r);
        let end = format!("sizes[{}]", rank + 2 * r + 1);
        text.push_str(&format!("    if ({end} > {start}) {{\n"));
        text.push_str(&format!("        cut[{axis}] = {end} - {start};\n"));
        for (a, view) in ir.views().enumerate() {
            let step = match view.axes[axis] {
                Axis::Broadcast => "0".to_string(),
                Axis::Unit => start.clone(),
                Axis::Strided => format!("{start} * strides[{}]", a * rank + axis),
            };
            text.push_str(&format!("        moved[{a}] = offsets[{a}] + {step};\n"));
        }
        text.push_str(&format!(
            "        {name}_s{k}(cut, strides, moved, ptrs);\n    }}\n"
        ));
    }
    text.push_str("}\n");
    text
}
