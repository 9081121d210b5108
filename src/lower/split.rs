//! The per-segment pieces of a kernel that reads a concat by ranges.
//!
//! A range-select kernel evaluated as written computes every operand of the concat at every
//! point and then selects: each element pays for every operand's ops. When every select runs
//! along one axis by the same ranges, the same result comes from evaluating, over each segment
//! of that axis, only the operand that segment selects: a *piece*. A piece is an ordinary
//! kernel without selects (its range loads become plain loads, its selects become the operand
//! they pick, the other operands' instructions are dropped as dead), with the same views in
//! the same argument order, so it runs under the kernel's own launch words.
//!
//! Both emitters use it: the C backend runs one loop nest per piece over its segment (its
//! offsets moved to the segment's start, see `backend::cpu::emit::split`); the CUDA backend
//! lets each thread pick its piece by one comparison chain on the segment ends and evaluate
//! only that piece, at the thread's own coordinates and the launch's offsets (a range load's
//! offset already points its segment's first index at the operand's element 0). Kernels the
//! pieces cannot express (two selects over different ranges, a range load outside its own
//! segment, a store written only at index 0 of the axis) keep the select.
//!
//! A reduction along the select's axis gathers points of several pieces into one output, so
//! pieces run as launches of their own cannot hold it ([`split`]). Pieces chosen inside one
//! loop nest can ([`split_in_nest`], outside row kernels): the C loops fix every outer
//! coordinate before a row segment's elements, so along an outer axis each row segment takes
//! its piece, and along the innermost axis each row segment runs one loop per piece over the
//! part of it inside that piece's segment; CUDA chooses per point ([`split_guarded`]). Either
//! way each point still hands its value to the same accumulator, and only the operand its
//! segment selects is computed.
//!
//! A reduction over other axes than the select's does not stop the cut: each of its outputs
//! sums (or takes the maximum of) points of one segment only, so a piece holds the reduction
//! too, with its reduced value renumbered, and computes whole outputs over its segment. The C
//! pieces each run the reduction over their own segment; a CUDA thread accumulates the value
//! of the piece its point lies in.
//!
//! A row kernel splits when its selects run along an outer axis: every row then lies in one
//! segment, and each piece is a row kernel over the rows of its segment (its row reductions
//! renumbered like the rest). A select along the rows themselves would put one row's
//! elements in several pieces; such a kernel does not split, and the IR does not allow it
//! ([`KernelIr::verify`]).

use super::ir::{Axis, Instr, KernelIr, ValueId};

/// The pieces of a range-select kernel: the select's axis, its launch ranges (one per piece,
/// in order along the axis) and the pointwise kernel evaluated over each.
#[derive(Debug, Clone)]
pub struct Split {
    pub axis: usize,
    pub ranges: Vec<usize>,
    pub pieces: Vec<KernelIr>,
}

/// Where the pieces of a cut run, which decides what they may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Each piece as a launch of its own over its segment: no output may gather points of
    /// two segments.
    Launches,
    /// Chosen inside one loop nest (the C loops): per row segment along an outer axis, per
    /// part of a row segment along the innermost one. Plain loads; not in row kernels, whose
    /// passes over a row take a concat along the rows their own way.
    Nest,
    /// Chosen at every point, range loads kept (CUDA).
    Points,
}

/// The per-segment pieces of `ir`, when every select of it picks along one axis by the same
/// ranges and each piece needs no other segment's values (see the module documentation).
///
/// Each piece reads its range loads as plain loads: it is meant to run only over its own
/// segment, which the caller must make sure of.
pub fn split(ir: &KernelIr) -> Option<Split> {
    cut(ir, Cut::Launches)
}

/// The pieces of a kernel that is not a row kernel, for loops that choose them inside the
/// kernel's own loop nest: along an outer axis, the piece of each row segment (the innermost
/// axis's elements at fixed outer coordinates); along the innermost axis, one loop per piece
/// over the part of each row segment inside its segment. Unlike [`split`], reductions may
/// reduce the select's axis, since the nest's accumulators see every point whichever piece
/// computed it. Plain loads, as [`split`]'s: the caller must run piece `k` only inside
/// segment `k`.
pub fn split_in_nest(ir: &KernelIr) -> Option<Split> {
    cut(ir, Cut::Nest)
}

/// [`split`] with each piece's range loads kept: a piece then reads memory only inside its own
/// segment, so evaluating piece `k` wherever the select would pick case `k` is exactly the
/// kernel as written, whatever the launch's ranges (CUDA, which checks none). The choice is
/// made per point, so reductions along the select's axis are allowed outside row kernels.
pub fn split_guarded(ir: &KernelIr) -> Option<Split> {
    cut(ir, Cut::Points)
}

fn cut(ir: &KernelIr, how: Cut) -> Option<Split> {
    if !ir.has_ranges() {
        return None;
    }
    let (axis, ranges) = ir.one_select()?;
    // A row reduction gathers a row's elements in one pass: the axis must not be a row
    // kernel's rows, whoever chooses the pieces.
    if ir.is_row_kernel() && axis + 1 == ir.rank {
        return None;
    }
    // An output reduced along the axis gathers points of several pieces: pieces must then be
    // chosen inside one loop nest (not a row kernel's passes) or per point.
    let refused = match how {
        Cut::Launches => ir.reductions.iter().any(|r| r.reduced[axis]),
        Cut::Nest => ir.is_row_kernel(),
        Cut::Points => false,
    };
    if refused {
        return None;
    }
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
        .map(|s| piece(ir, axis, ranges, s, how == Cut::Points))
        .collect::<Option<Vec<_>>>()?;
    Some(Split {
        axis,
        ranges: ranges.to_vec(),
        pieces,
    })
}

/// The kernel evaluated over segment `s`: the values the stores and reductions need when
/// every select picks its case `s`, with range loads of range `ranges[s]` read as plain loads
/// (kept as range loads when `guarded`). `None` when such a value needs a range load of
/// another range.
fn piece(
    ir: &KernelIr,
    axis: usize,
    ranges: &[usize],
    s: usize,
    guarded: bool,
) -> Option<KernelIr> {
    let n = ir.body.len();
    let mut live = vec![false; n];
    for value in ir.stores.iter().map(|s| s.value) {
        live[value] = true;
    }
    for value in ir.reductions.iter().map(|r| r.value) {
        live[value] = true;
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
            Instr::RangeLoad { view, .. } if !guarded => Instr::Load { view: *view },
            instr => renumbered(instr, &new_id),
        };
        new_id[id] = body.len();
        body.push(instr);
    }
    let mut stores = ir.stores.clone();
    for store in &mut stores {
        store.value = new_id[store.value];
    }
    let mut reductions = ir.reductions.clone();
    for reduction in &mut reductions {
        reduction.value = new_id[reduction.value];
    }
    Some(KernelIr {
        rank: ir.rank,
        row_arithmetic: ir.row_arithmetic,
        loads: ir.loads.clone(),
        body,
        stores,
        reductions,
    })
}

/// `instr` with every operand `x` replaced by `new_id[x]`.
fn renumbered(instr: &Instr, new_id: &[ValueId]) -> Instr {
    let mut instr = instr.clone();
    match &mut instr {
        Instr::Widen { x }
        | Instr::Round { x, .. }
        | Instr::Neg { x, .. }
        | Instr::RowReduce { x, .. }
        | Instr::GatherLoad { index: x, .. } => *x = new_id[*x],
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
