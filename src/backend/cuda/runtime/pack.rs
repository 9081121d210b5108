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
    let view = |dtype| View {
        dtype,
        axes: vec![Axis::Unit],
    };
    KernelIr {
        rank: 1,
        loads: vec![view(from)],
        stores: vec![Store {
            value: body.len() - 1,
            view: view(current),
        }],
        body,
        reductions: Vec::new(),
    }
}

/// The launch of a conversion kernel over `len` contiguous elements.
pub fn convert_launch(len: usize) -> Launch {
    Launch {
        sizes: vec![len as i64],
        strides: vec![vec![1], vec![1]],
        offsets: vec![0, 0],
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
}
