//! Per-segment loops for a kernel that reads a concat by ranges: the C side of
//! [`crate::lower::split`].
//!
//! A range-select kernel evaluated as written computes every operand of the concat at every
//! point (at a coordinate clamped into the operand's range) and then selects: each element
//! pays for every operand's ops, and the clamped indices keep the loops off the explicit
//! vector path. When the select runs along a loop axis of the kernel, the same result comes
//! from running the loop over that axis as consecutive loops, one per segment, each of which
//! evaluates only its own operand: a *piece*. A piece is an ordinary kernel (its
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
//! range load outside its own segment, a store written only at index 0 of the axis) are
//! emitted in the clamped form only.
//!
//! A reduction along the select's axis (the column sums of a concat along the batch, the row
//! sums of one along the features) gathers points of several segments into one output, which
//! pieces run one after the other could only join by rounding each piece's partial result.
//! The kernel instead keeps its own loop nest and accumulators (`{name}_n`,
//! [`crate::lower::split::split_in_nest`]), and each row segment evaluates only its pieces:
//! along an outer axis the piece its row's coordinate selects (one comparison per row, every
//! output accumulated in the clamped form's order from the same values, so the same bits),
//! along the innermost axis each piece in a loop of its own over the part of the row segment
//! inside its range. Plain loads either way; the same range check guards it.
//!
//! A piece may hold reductions over the other axes: it is then an ordinary reducing kernel over
//! its segment, whose outputs along the select's axis are its own (their offsets move with the
//! segment like every other view's). A row kernel's pieces are row kernels over the rows of
//! their segments (it selects along an outer axis, `lower::ir`), with the vector loops, the
//! row scratch and the lagged stores of a row kernel of their own; its clamped form is a row
//! kernel whose loads clamp the row's coordinate, in scalar loops.

use crate::lower::ir::{Axis, KernelIr};
use crate::lower::split::Split;

/// The C function `name` of a split kernel: the range check, then each piece `{name}_s{k}` over
/// its segment, else the clamped form `{name}_c` (both emitted by the caller before it).
pub(super) fn wrapper(ir: &KernelIr, split: &Split, name: &str) -> String {
    let mut text = tiling_check(ir, split, name);
    let rank = ir.rank;
    let axis = split.axis;
    let args = ir.arg_count();
    let words = rank + 2 * (ir.range_count() + ir.gather_count());
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

/// The C function `name` of a kernel cut by rows: the range check of [`wrapper`], then the
/// loop nest choosing the pieces of each row segment, `{name}_n`, else the clamped form `{name}_c` (both
/// emitted by the caller before it).
pub(super) fn nest_wrapper(ir: &KernelIr, split: &Split, name: &str) -> String {
    let mut text = tiling_check(ir, split, name);
    text.push_str(&format!(
        "    {name}_n(sizes, strides, offsets, ptrs);\n}}\n"
    ));
    text
}

/// The head of a split kernel's C function `name`: when the launch's ranges do not tile the
/// select's axis in order from 0 to its size, it runs the clamped form `{name}_c`, which is
/// right for every launch, and returns.
fn tiling_check(ir: &KernelIr, split: &Split, name: &str) -> String {
    let rank = ir.rank;
    let axis = split.axis;
    let mut text = format!(
        "void {name}(const int64_t *sizes, const int64_t *strides, \
         const int64_t *offsets, void *const *ptrs) {{\n"
    );
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
    text
}
