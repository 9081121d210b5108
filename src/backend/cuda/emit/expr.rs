//! The CUDA spelling of scalar values: where the CUDA emitter's text differs from the CPU's
//! (the rest, and the semantics, are shared in [`crate::backend::spelling`]). The helpers it
//! calls are defined in `prelude.cu`.

use crate::backend::spelling::{Arith, Spelling, libm_name};
use crate::dtype::DType;
use crate::formula::Func;
use crate::lower::accumulate::{Accumulator, Identity};
use crate::lower::ir::{KernelIr, Prec, ValueId};

/// The CUDA spelling.
pub(super) struct Cuda;

impl Spelling for Cuda {
    const PREFIX: &'static str = "fbc_";

    fn storage_type(&self, dtype: DType) -> &'static str {
        match dtype {
            DType::Bool | DType::U8 => "unsigned char",
            DType::I8 => "signed char",
            DType::I16 => "short",
            DType::U16 => "unsigned short",
            DType::I32 => "int",
            DType::U32 => "unsigned int",
            DType::I64 => "long long",
            DType::F16 => "__half",
            DType::BF16 => "__nv_bfloat16",
            DType::F32 => "float",
            DType::F64 => "double",
        }
    }

    fn bool_load(&self, raw: &str) -> String {
        format!("({raw} != 0 ? 1.0 : 0.0)")
    }

    fn bool_store(&self, value: &str) -> String {
        format!("(unsigned char)({value} != 0.0 ? 1 : 0)")
    }

    fn f64_to_f32(&self, x: &str) -> String {
        format!("fbc_rnd_df({x})")
    }

    fn f64_to_bool(&self, x: &str) -> String {
        format!("fbc_rnd_bool({x})")
    }

    /// The default quiet NaN, through its bits: NVRTC has no `<math.h>` macros.
    fn identity(&self, acc: &Accumulator) -> String {
        match acc.identity() {
            // A maximum held in `float` starts from an f32 literal; every other float
            // accumulator is a `double`.
            Identity::Float(value) if acc.prec == Prec::F32 => self.literal(value, Prec::F32),
            Identity::Float(value) => self.literal(value, Prec::F64),
            Identity::Int(value) => self.int_literal(value),
        }
    }

    fn nan(&self, prec: Prec) -> String {
        match prec {
            Prec::F32 => "__int_as_float(0x7fc00000)".to_string(),
            Prec::F64 | Prec::I64 => "__longlong_as_double(0x7ff8000000000000LL)".to_string(),
        }
    }

    fn infinity(&self, prec: Prec) -> String {
        match prec {
            Prec::F32 => "__int_as_float(0x7f800000)".to_string(),
            Prec::F64 | Prec::I64 => "__longlong_as_double(0x7ff0000000000000LL)".to_string(),
        }
    }

    /// Through the round-to-nearest intrinsics, so that no compiler option can contract
    /// `a * b + c` into a fused multiply-add (the reference rounds the product), and a
    /// division (`rsqrt`'s included) is IEEE-rounded whatever `--prec-div` says.
    fn arithmetic(&self, op: Arith, a: &str, b: &str, prec: Prec) -> String {
        let letter = match prec {
            Prec::F32 => "f",
            // Integers never reach here (`Spelling::int_arithmetic` spells them); f64 if they did.
            Prec::F64 | Prec::I64 => "d",
        };
        let name = match op {
            Arith::Add => "add",
            Arith::Sub => "sub",
            Arith::Mul => "mul",
            Arith::Div => "div",
        };
        format!("__{letter}{name}_rn({a}, {b})")
    }

    /// CUDA's accurate math functions (`expf`, never `__expf`); square root through the
    /// IEEE-rounded intrinsic whatever `--prec-sqrt` says.
    /// Every loop of a CUDA kernel decomposes its index into the coordinates `i{d}`.
    fn coordinate(&self, _ir: &KernelIr, axis: usize) -> String {
        format!("i{axis}")
    }

    fn function(&self, _ir: &KernelIr, _id: ValueId, func: Func, prec: Prec) -> String {
        match (func, prec) {
            (Func::Sqrt, Prec::F32) => "__fsqrt_rn".into(),
            (Func::Sqrt, Prec::F64) => "__dsqrt_rn".into(),
            _ => libm_name(func, prec),
        }
    }
}
