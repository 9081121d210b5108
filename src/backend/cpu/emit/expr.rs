//! The C spelling of scalar values: where the CPU emitter's text differs from CUDA's (the
//! rest is shared in [`crate::backend::spelling`]). The helpers it calls are defined in
//! `prelude.c`, `expf.c` and `tanhf.c`.
//!
//! The C compiles with `-fno-math-errno -ffp-contract=off` and no `-ffast-math`, so the C
//! operators keep IEEE semantics and can be written plainly; NaN and ±∞ come from
//! `<math.h>`'s macros.

use crate::backend::spelling::{Arith, Spelling, libm_name};
use crate::dtype::DType;
use crate::formula::{BinOp, Func};
use crate::lower::accumulate::{Accumulator, Identity};
use crate::lower::ir::{Instr, KernelIr, Prec, ValueId};

/// The C spelling.
pub(super) struct C;

impl Spelling for C {
    const PREFIX: &'static str = "fb_";

    fn storage_type(&self, dtype: DType) -> &'static str {
        match dtype {
            DType::Bool | DType::U8 => "uint8_t",
            DType::I8 => "int8_t",
            DType::I16 => "int16_t",
            DType::U16 => "uint16_t",
            DType::I32 => "int32_t",
            DType::U32 => "uint32_t",
            DType::I64 => "int64_t",
            DType::F16 | DType::BF16 => "uint16_t",
            DType::F32 => "float",
            DType::F64 => "double",
        }
    }

    fn bool_load(&self, raw: &str) -> String {
        format!("(double)({raw} != 0)")
    }

    fn bool_store(&self, value: &str) -> String {
        format!("(uint8_t)({value} != 0.0)")
    }

    fn f64_to_f32(&self, x: &str) -> String {
        format!("(float){x}")
    }

    fn f64_to_bool(&self, x: &str) -> String {
        format!("(({x} != 0.0) ? 1.0 : 0.0)")
    }

    fn identity(&self, acc: &Accumulator) -> String {
        match acc.identity() {
            Identity::Float(0.0) => "0.0".to_string(),
            Identity::Float(f64::NEG_INFINITY) => "-INFINITY".to_string(),
            Identity::Float(value) => self.literal(value, acc.prec),
            Identity::Int(0) => "0".to_string(),
            Identity::Int(i64::MIN) => "INT64_MIN".to_string(),
            Identity::Int(value) => self.int_literal(value),
        }
    }

    fn nan(&self, prec: Prec) -> String {
        format!("({}NAN)", double_cast(prec))
    }

    fn infinity(&self, prec: Prec) -> String {
        format!("{}INFINITY", double_cast(prec))
    }

    fn arithmetic(&self, op: Arith, a: &str, b: &str, _prec: Prec) -> String {
        let sym = match op {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
        };
        format!("({a} {sym} {b})")
    }

    /// f32 `exp` and `tanh` are inline code (`EXPF`, `TANHF`), with a cheaper `exp` where only
    /// a literal is added to it; `floor` is branch-free so it vectorizes. The rest is libm.
    /// Outer axes are the row's coordinates `i{d}`; along the innermost axis a loop walks
    /// `j` from the segment's start `j0`. (Row kernels, which have no `j0`, read ranges only
    /// along outer axes.)
    fn coordinate(&self, ir: &KernelIr, axis: usize) -> String {
        if axis + 1 == ir.rank {
            "(j0 + j)".to_string()
        } else {
            format!("i{axis}")
        }
    }

    fn function(&self, ir: &KernelIr, id: ValueId, func: Func, prec: Prec) -> String {
        match (func, prec) {
            (Func::Exp, Prec::F32) if only_added_to_constants(ir, id) => "fb_expf_addend".into(),
            (Func::Exp, Prec::F32) => "fb_expf".into(),
            (Func::Tanh, Prec::F32) => "fb_tanhf".into(),
            (Func::Floor, Prec::F32) => "fb_floorf".into(),
            (Func::Floor, Prec::F64) => "fb_floor".into(),
            _ => libm_name(func, prec),
        }
    }
}

/// The cast that makes `<math.h>`'s `float` macros `NAN` and `INFINITY` a `double` at `prec`.
fn double_cast(prec: Prec) -> &'static str {
    match prec {
        Prec::F32 => "",
        Prec::F64 | Prec::I64 => "(double)",
    }
}

/// Whether every use of value `id` adds it to a literal of magnitude at least 2⁻¹⁰⁰ (as in
/// `1 + exp(-x)`, a sigmoid's denominator), and nothing stores or reduces it. Such a sum cannot
/// tell an exp below 2⁻¹²⁴ from zero: it is under half an ulp of the literal, so the sum
/// rounds to the literal either way. [`super::EXPF`]'s `fb_expf_addend` relies on this to drop
/// the subnormal range.
pub(super) fn only_added_to_constants(ir: &KernelIr, id: usize) -> bool {
    let big_literal = |x: usize| matches!(ir.body[x], Instr::Const { value, .. } if value.abs() >= 2f64.powi(-100));
    let mut used = false;
    for instr in &ir.body[id + 1..] {
        if instr.operands().contains(&id) {
            used = true;
            let adds = matches!(
                *instr,
                Instr::Binary { op: BinOp::Add, a, b, .. }
                    if (a == id && b != id && big_literal(b)) || (b == id && a != id && big_literal(a))
            );
            if !adds {
                return false;
            }
        }
    }
    used && ir.stores.iter().all(|s| s.value != id) && ir.reductions.iter().all(|r| r.value != id)
}
