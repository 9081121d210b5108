//! Conversion kernels: the kernel IR of "read one dtype, round through a chain of dtypes,
//! write the last", used around cuBLAS calls.
//!
//! cuBLAS reads its operands in one of a few storage types and cannot apply fusebox's rounding
//! rules on the way, so where the CPU executor rounds while packing an operand (an absorbed
//! cast, or an operand of another dtype than the product), the GPU runs one of these kernels
//! first, into a temporary buffer: on the GPU the conversion is a separate pass over memory.
//! They are ordinary [`KernelIr`]s, emitted and compiled with the program's own kernels, so
//! their rounding is exactly [`Instr::Round`]'s, the reference evaluator's.

use crate::dtype::DType;
use crate::lower::ir::{Axis, Instr, KernelIr, Launch, Prec, Store, View};

/// A rank-1 kernel reading `from` and storing the value rounded to each dtype of `chain` in
/// turn, in the last one's storage (`from` itself for an empty chain: a copy).
pub fn convert_ir(from: DType, chain: &[DType]) -> KernelIr {
    let view = |dtype| View::strided(dtype, vec![Axis::Unit]);
    let (body, to) = convert_body(from, chain);
    KernelIr {
        rank: 1,
        row_arithmetic: crate::lower::ir::RowArithmetic::default(),
        loads: vec![view(from)],
        stores: vec![Store::new(body.len() - 1, view(to))],
        body,
        reductions: Vec::new(),
    }
}

/// The body that loads one `from` element and rounds it through `chain`, and the dtype it
/// ends in.
fn convert_body(from: DType, chain: &[DType]) -> (Vec<Instr>, DType) {
    let mut body = vec![Instr::Load { view: 0 }];
    let mut current = from;
    for &to in chain {
        if to == current {
            continue;
        }
        let x = body.len() - 1;
        // f32-held to double-held is exact; every rounding is then one Round, held at the
        // target's precision (f64 values are already f64: no Round needed).
        if Prec::of(current) == Prec::F32 && Prec::of(to) == Prec::F64 {
            body.push(Instr::Widen { x });
        }
        // An integer becomes an f64 by a rounding too.
        if to != DType::F64 || Prec::of(current) == Prec::I64 {
            let x = body.len() - 1;
            body.push(Instr::Round { x, dtype: to });
        }
        current = to;
    }
    (body, current)
}

/// A kernel and its launch (arguments: the buffer read, the contiguous result) that gathers
/// a matmul operand read through a view (`lower::OperandView`: a transposed weight, a slice,
/// a broadcast batch) into a contiguous buffer for cuBLAS, rounding each element of `from`
/// through `chain` on the way as [`convert_ir`] does. One pass over memory, like the copy
/// kernel the view would otherwise have been, and none where cuBLAS reads the view directly.
pub fn gather(
    from: DType,
    chain: &[DType],
    view: &crate::lower::OperandView,
) -> (KernelIr, Launch) {
    // Over the view's sub-axes where it has them: their row-major order is the operand's.
    let shape = view.strided_shape();
    let into = crate::lower::view::contiguous_strides(shape);
    let from_view = (view.strided.strides.clone(), view.strided.offset);
    strided_copy(from, chain, shape, from_view, (into, 0))
}

/// A kernel and its launch (arguments: the source, the padded buffer) that copies a value into
/// the inside of its zero padding (`shape::Padding`), whose zeros the caller writes first:
/// cuBLAS cannot make them while it reads, as the CPU GEMM does, so a padded operand (a
/// convolution's image) is built before it is gathered.
pub fn place(dtype: DType, padding: &crate::shape::Padding) -> (KernelIr, Launch) {
    use crate::lower::view::contiguous_strides;
    let padded_strides = contiguous_strides(&padding.padded());
    let inside: i64 = (0..padding.source.len())
        .map(|d| padding.before[d] as i64 * padded_strides[d])
        .sum();
    let source = (contiguous_strides(&padding.source), 0);
    strided_copy(
        dtype,
        &[],
        &padding.source,
        source,
        (padded_strides, inside),
    )
}

/// A kernel and its launch (arguments: the buffer read, the buffer written) that copies
/// every element of `shape`, read through `(strides, offset)` = `load` and written through
/// `store`, rounding it through `chain` as [`convert_ir`] does.
fn strided_copy(
    from: DType,
    chain: &[DType],
    shape: &[usize],
    (mut load_strides, load_offset): (Vec<i64>, i64),
    (store_strides, store_offset): (Vec<i64>, i64),
) -> (KernelIr, Launch) {
    use crate::lower::view::{classify, moving_axis};
    let rank = shape.len();
    let load = classify(from, shape, &mut load_strides);
    let (body, to) = convert_body(from, chain);
    let store = View::strided(
        to,
        (0..rank)
            .map(|d| moving_axis(d, rank, store_strides[d]))
            .collect(),
    );
    let ir = KernelIr {
        rank,
        row_arithmetic: crate::lower::ir::RowArithmetic::default(),
        loads: vec![load],
        stores: vec![Store::new(body.len() - 1, store)],
        body,
        reductions: Vec::new(),
    };
    let launch = Launch {
        sizes: shape.iter().map(|&d| d as i64).collect(),
        strides: vec![load_strides, store_strides],
        offsets: vec![load_offset, store_offset],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: Vec::new(),
    };
    (ir, launch)
}

/// One operand of an integer product: its dtype, absorbed cast and shape (as the graph has it).
#[derive(Debug, Clone, Copy)]
pub struct IntOperand<'a> {
    pub dtype: DType,
    pub cast: Option<DType>,
    pub shape: &'a [usize],
}

/// An integer matrix product as one kernel, with its launch (arguments `a`, `b`, the result).
///
/// cuBLAS has no GEMM that wraps as NumPy's integer matmul does, and f64 arithmetic loses
/// integers past 2^53, so an integer product is a reduction: over the domain
/// `batch ++ [n, m, k]`, each operand element (through its absorbed cast, then wrapped to
/// `out`) multiplied at `Prec::I64` and summed over `k`, wrapping, into the `[batch, n, m]`
/// result. Batch dims broadcast as NumPy's do. `None` when the shapes do not make a product.
pub fn integer_matmul(
    a: IntOperand<'_>,
    b: IntOperand<'_>,
    out: DType,
) -> Option<(KernelIr, Launch)> {
    use crate::lower::ir::{ReduceKind, Reduction};
    use crate::lower::view::{classify, contiguous_strides, moving_axis};
    let sa = crate::shape::matmul_operand(a.shape, false);
    let sb = crate::shape::matmul_operand(b.shape, true);
    let (n, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let m = sb[sb.len() - 1];
    if sb[sb.len() - 2] != k {
        return None;
    }
    let batch = crate::shape::broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2]).ok()?;
    let rank = batch.len() + 3;
    let mut domain = batch.clone();
    domain.extend([n, m, k]);
    // An operand's strides over the domain: its batch dims aligned right (size 1 broadcast),
    // then its row and column strides placed on the axes it moves along.
    let operand_strides = |s: &[usize], row_axis: usize, col_axis: usize| {
        let own = contiguous_strides(s);
        let lead = batch.len() - (s.len() - 2);
        let mut strides = vec![0i64; rank];
        for d in 0..s.len() - 2 {
            if s[d] != 1 {
                strides[lead + d] = own[d];
            }
        }
        strides[row_axis] = own[s.len() - 2];
        strides[col_axis] = own[s.len() - 1];
        strides
    };
    let (n_axis, m_axis, k_axis) = (batch.len(), batch.len() + 1, batch.len() + 2);
    let mut a_strides = operand_strides(&sa, n_axis, k_axis);
    let mut b_strides = operand_strides(&sb, k_axis, m_axis);
    let mut kept = batch.clone();
    kept.extend([n, m]);
    let mut out_strides = contiguous_strides(&kept);
    out_strides.push(0);
    let a_view = classify(a.dtype, &domain, &mut a_strides);
    let b_view = classify(b.dtype, &domain, &mut b_strides);
    let out_view = View::strided(
        out,
        (0..rank)
            .map(|d| {
                if d == k_axis {
                    Axis::Broadcast
                } else {
                    moving_axis(d, rank, out_strides[d])
                }
            })
            .collect(),
    );
    let mut body = Vec::new();
    let mut operand = |view: usize, op: IntOperand<'_>| {
        body.push(Instr::Load { view });
        for dtype in op.cast.into_iter().chain([out]) {
            let x = body.len() - 1;
            body.push(Instr::Round { x, dtype });
        }
        body.len() - 1
    };
    let (x, y) = (operand(0, a), operand(1, b));
    body.push(Instr::Binary {
        op: crate::formula::BinOp::Mul,
        a: x,
        b: y,
        prec: Prec::I64,
    });
    let value = body.len() - 1;
    let ir = KernelIr {
        rank,
        row_arithmetic: crate::lower::ir::RowArithmetic::default(),
        loads: vec![a_view, b_view],
        body,
        stores: Vec::new(),
        reductions: vec![Reduction {
            kind: ReduceKind::Sum,
            value,
            reduced: (0..rank).map(|d| d == k_axis).collect(),
            view: out_view,
        }],
    };
    let launch = Launch {
        sizes: domain.iter().map(|&d| d as i64).collect(),
        strides: vec![a_strides, b_strides, out_strides],
        offsets: vec![0, 0, 0],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: Vec::new(),
    };
    Some((ir, launch))
}

/// The launch of a conversion kernel over `len` contiguous elements.
pub fn convert_launch(len: usize) -> Launch {
    Launch {
        sizes: vec![len as i64],
        strides: vec![vec![1], vec![1]],
        offsets: vec![0, 0],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::buffer::Buffer;
    use crate::runtime::interpret;

    /// Values that every rounding treats differently: ties, subnormals, overflow, NaN, −0,
    /// values past the integer range.
    const VALUES: [f64; 14] = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        1.0009765625, // 1 + 2^-10: an f16 tie
        1.00390625,   // 1 + 2^-8: a bf16 tie
        65519.0,      // rounds to f16's max
        65520.0,      // overflows f16
        1e-7,         // an f16 subnormal
        3.4e38,
        1e39, // overflows f32
        f64::NAN,
        f64::INFINITY,
        -3e9, // saturates i32
    ];

    fn run(from: DType, chain: &[DType]) -> Vec<f64> {
        let ir = convert_ir(from, chain);
        let mut src = Buffer::zeroed(from, &[VALUES.len()]);
        for (i, &v) in VALUES.iter().enumerate() {
            src.set(i, v);
        }
        let out = *chain.last().unwrap_or(&from);
        let mut dst = Buffer::zeroed(out, &[VALUES.len()]);
        interpret::run(
            &ir,
            &convert_launch(VALUES.len()),
            &mut [&mut src, &mut dst],
        );
        (0..VALUES.len()).map(|i| dst.get(i)).collect()
    }

    /// Each chain rounds exactly as rounding the stored value step by step with
    /// `DType::round` (the reference evaluator's rule).
    #[test]
    fn conversions_round_like_the_reference() {
        use DType::*;
        let chains: &[(DType, &[DType])] = &[
            (F32, &[F16, F16]),
            (F32, &[BF16]),
            (F16, &[F32]),
            (BF16, &[F32, F16]),
            (F64, &[F16]),
            (F64, &[BF16, F32]),
            (F32, &[F64]),
            (I32, &[F64]),
            (F32, &[I32, F64]),
            (F64, &[I32]),
            (F64, &[Bool]),
            (F16, &[F16]),
            (F32, &[]),
        ];
        for &(from, chain) in chains {
            let got = run(from, chain);
            for (i, &v) in VALUES.iter().enumerate() {
                let want = chain.iter().fold(from.round(v), |x, d| d.round(x));
                assert!(
                    got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
                    "{from} via {chain:?}: {v} gave {} not {want}",
                    got[i]
                );
            }
        }
    }

    /// The gather kernel of an operand read through a view (a transposed, sliced slab of a
    /// [2, 3, 4] buffer, broadcast along a new batch axis) holds, contiguously, the elements
    /// `Buffer::gather_from` picks (the CPU's reading of the same view), each rounded through
    /// the chain as the reference rounds it.
    #[test]
    fn gathered_operands_hold_the_view_rounded() {
        use crate::lower::OperandView;
        use crate::shape::Strided;
        let mut src = Buffer::zeroed(DType::F32, &[2, 3, 4]);
        for i in 0..24 {
            src.set(
                i,
                VALUES[i % VALUES.len()] * if i % 3 == 0 { -1.0 } else { 1.0 },
            );
        }
        // Shape [2, 4, 2]: a new batch axis (stride 0), then the transpose of rows 1..3 of
        // slab 1.
        let view = OperandView::strided(
            vec![2, 4, 2],
            Strided {
                offset: 12 + 4,
                strides: vec![0, 1, 4],
            },
        );
        for chain in [&[][..], &[DType::F16][..], &[DType::BF16, DType::F32][..]] {
            let (ir, launch) = gather(DType::F32, chain, &view);
            assert_eq!(ir.verify(), Ok(()));
            let to = *chain.last().unwrap_or(&DType::F32);
            let mut dst = Buffer::zeroed(to, &view.shape);
            interpret::run(&ir, &launch, &mut [&mut src, &mut dst]);
            let mut want = Buffer::zeroed(DType::F32, &view.shape);
            assert!(want.gather_from(src.elements(), &view.strided));
            for i in 0..16 {
                let w = chain.iter().fold(want.get(i), |x, d| d.round(x));
                let g = dst.get(i);
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "[{i}] {g} vs {w}"
                );
            }
        }
    }

    /// The kernel that places a value inside its zero padding, run over a zeroed buffer,
    /// gives the padded buffer the CPU builds (padding on the outer and the inner axes,
    /// uneven, none on the middle one).
    #[test]
    fn placed_values_land_inside_their_padding() {
        let padding = crate::shape::Padding {
            source: vec![2, 3, 4],
            before: vec![1, 0, 2],
            after: vec![0, 0, 1],
        };
        for dtype in [DType::F32, DType::BF16] {
            let mut src = Buffer::zeroed(dtype, &padding.source);
            for i in 0..src.len() {
                src.set(i, i as f64 + 1.0);
            }
            let want = Buffer::padded_from(src.elements(), &padding)
                .unwrap()
                .unwrap();
            let mut got = Buffer::zeroed(dtype, &padding.padded());
            let (ir, launch) = place(dtype, &padding);
            interpret::run(&ir, &launch, &mut [&mut src, &mut got]);
            let values = |b: &Buffer| (0..b.len()).map(|i| b.get(i)).collect::<Vec<_>>();
            assert_eq!(values(&got), values(&want), "{dtype}");
            assert_eq!(values(&got).iter().filter(|&&v| v != 0.0).count(), 24);
        }
    }

    #[test]
    fn ir_invariants_hold() {
        let ir = convert_ir(DType::F32, &[DType::F16, DType::F64]);
        assert_eq!(
            ir.body,
            vec![
                Instr::Load { view: 0 },
                Instr::Round {
                    x: 0,
                    dtype: DType::F16
                },
                Instr::Widen { x: 1 },
            ]
        );
        assert_eq!(ir.prec(ir.stores[0].value), Prec::F64);
        assert_eq!(ir.stores[0].view.dtype, DType::F64);
        assert_eq!(ir.arg_count(), 2);
    }

    /// The integer product kernel, run by the interpreter, wraps exactly as NumPy's integer
    /// matmul (checked against `wrapping_*` on i32), with a broadcast batch dim.
    #[test]
    fn integer_matmul_kernel_wraps_like_numpy() {
        let a: Vec<i64> = vec![i64::from(i32::MAX), 2, -3, i64::from(i32::MIN), 7, 65537];
        let b: Vec<i64> = vec![2, i64::from(i32::MAX), 65537, -1, 5, 3];
        // a: [2, 1, 3] (two batches of one row), b: [3, 2].
        let (ir, launch) = integer_matmul(
            IntOperand {
                dtype: DType::I32,
                cast: None,
                shape: &[2, 1, 3],
            },
            IntOperand {
                dtype: DType::I32,
                cast: None,
                shape: &[3, 2],
            },
            DType::I32,
        )
        .unwrap();
        assert_eq!(ir.verify(), Ok(()));
        let mut x = Buffer::zeroed(DType::I32, &[2, 1, 3]);
        let mut y = Buffer::zeroed(DType::I32, &[3, 2]);
        for (i, &v) in a.iter().enumerate() {
            x.set_int(i, v);
        }
        for (i, &v) in b.iter().enumerate() {
            y.set_int(i, v);
        }
        let mut out = Buffer::zeroed(DType::I32, &[2, 1, 2]);
        interpret::run(&ir, &launch, &mut [&mut x, &mut y, &mut out]);
        let mut expected = Vec::new();
        for batch in 0..2 {
            for col in 0..2 {
                let dot = (0..3).fold(0i32, |acc, j| {
                    acc.wrapping_add((a[batch * 3 + j] as i32).wrapping_mul(b[j * 2 + col] as i32))
                });
                expected.push(i64::from(dot));
            }
        }
        let got: Vec<i64> = (0..4).map(|i| out.get_int(i)).collect();
        assert_eq!(got, expected);
    }
}
