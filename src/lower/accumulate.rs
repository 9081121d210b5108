//! How each reduction of a kernel accumulates: the precision its running value is held in,
//! the identity it starts from, and whether a row sum takes the f32 partials the IR grants
//! relaxed row kernels ("Precision of row kernels" in [`crate::lower::ir`]). Decided here,
//! once, from the kernel IR alone: the C and CUDA emitters only spell these decisions, so
//! the two backends cannot accumulate one reduction differently.

use crate::lower::ir::{Instr, KernelIr, Prec, ReduceKind, Reduction, RowArithmetic, ValueId};

/// Values of an f32 row sum one f32 partial may hold before it joins the f64 total, under
/// `RowArithmetic::Relaxed`: the 16 of the IR's stated error bound. The C vector loops add
/// each lane's 16 values of a block in f32, and each CUDA thread at most 16 of its elements.
pub const F32_PARTIAL_TERMS: usize = 16;

/// Binary exponents bounding the divisors a row kernel may multiply by the reciprocal of
/// ([`KernelIr::row_constant_divisors`]): `|b|` in `[2^MIN, 2^MAX]`, where `1 / b` is a normal
/// float rounded once; any other divisor divides.
pub const RECIPROCAL_EXPONENTS: (i32, i32) = (-126, 126);

/// The accumulator of one reduction: a [`Reduction`] ending a kernel, or an
/// [`Instr::RowReduce`] of a row kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accumulator {
    pub kind: ReduceKind,
    /// The precision the running value is held in: `I64` (wrapping) for an integer result,
    /// `F64` for a float one, as the reference evaluator holds them; except a row maximum of
    /// f32 values, held in `F32`: a maximum is one of its operands, exact at either
    /// precision with the same NaN and signed-zero rules, and `float` saves a conversion per
    /// element.
    pub prec: Prec,
    /// Whether partial sums of up to [`F32_PARTIAL_TERMS`] f32 values may come before the f64
    /// total: a sum or mean of f32 values in a row kernel under `RowArithmetic::Relaxed`.
    pub f32_partials: bool,
}

impl Accumulator {
    /// The accumulator of reduction `red` of a kernel.
    pub fn of_reduction(red: &Reduction) -> Accumulator {
        let integer = Prec::of(red.view.dtype) == Prec::I64;
        Accumulator {
            kind: red.kind,
            prec: if integer { Prec::I64 } else { Prec::F64 },
            f32_partials: false,
        }
    }

    /// The accumulator of row reduction `id` of `ir`, or `None` when `id` is another
    /// instruction.
    pub fn of_row_reduce(ir: &KernelIr, id: ValueId) -> Option<Accumulator> {
        let Instr::RowReduce { kind, x, .. } = ir.body[id] else {
            return None;
        };
        let operand = ir.prec(x);
        let prec = match (kind, operand) {
            (_, Prec::I64) => Prec::I64,
            (ReduceKind::Max, operand) => operand,
            (ReduceKind::Sum | ReduceKind::Mean, _) => Prec::F64,
        };
        let f32_partials = kind != ReduceKind::Max
            && operand == Prec::F32
            && ir.row_arithmetic == RowArithmetic::Relaxed;
        Some(Accumulator {
            kind,
            prec,
            f32_partials,
        })
    }

    pub fn is_max(&self) -> bool {
        self.kind == ReduceKind::Max
    }

    /// Whether it accumulates exact integers (wrapping in 64 bits).
    pub fn is_integer(&self) -> bool {
        self.prec == Prec::I64
    }

    /// The value it starts from: 0, or for a maximum −∞ (`i64::MIN` for integers).
    pub fn identity(&self) -> Identity {
        match (self.is_max(), self.is_integer()) {
            (false, false) => Identity::Float(0.0),
            (true, false) => Identity::Float(f64::NEG_INFINITY),
            (false, true) => Identity::Int(0),
            (true, true) => Identity::Int(i64::MIN),
        }
    }

    /// The precision its result is held in when it is rounded, once, to the output dtype:
    /// `I64` for integers, else `F64` (a float maximum is widened exactly).
    pub fn result_prec(&self) -> Prec {
        if self.is_integer() {
            Prec::I64
        } else {
            Prec::F64
        }
    }
}

/// The starting value of an accumulator, at its precision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Identity {
    Float(f64),
    Int(i64),
}

impl KernelIr {
    /// The accumulator of every reduction ending the kernel, in order.
    pub fn accumulators(&self) -> Vec<Accumulator> {
        self.reductions
            .iter()
            .map(Accumulator::of_reduction)
            .collect()
    }
}
