//! CUDA C expressions for types, storage conversions, rounding, literals and instructions.
//! Each mirrors one function of the CPU emitter (same semantics, GPU spelling); the helpers
//! they call are defined in `prelude.cu`.

use crate::dtype::DType;
use crate::formula::{BinOp, Func};
use crate::lower::ir::Prec;

/// The C type a value of precision `prec` is held in.
pub fn c_type(prec: Prec) -> &'static str {
    match prec {
        Prec::F32 => "float",
        Prec::F64 => "double",
    }
}

/// The C type elements of `dtype` are stored as in device memory.
pub fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "unsigned char",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// A stored element `raw` as a value at `Prec::of(dtype)` (exact in every case).
pub fn load_conversion(dtype: DType, raw: &str) -> String {
    match dtype {
        DType::F16 => format!("fbc_h2f({raw})"),
        DType::BF16 => format!("fbc_b2f({raw})"),
        DType::F32 | DType::F64 => raw.to_string(),
        DType::I32 | DType::I64 => format!("(double){raw}"),
        DType::Bool => format!("({raw} != 0 ? 1.0 : 0.0)"),
    }
}

/// A value at `Prec::of(dtype)`, already rounded to `dtype`, in `dtype`'s storage format.
pub fn store_conversion(dtype: DType, value: &str) -> String {
    match dtype {
        DType::F16 => format!("fbc_f2h({value})"),
        DType::BF16 => format!("fbc_f2b({value})"),
        DType::F32 | DType::F64 => value.to_string(),
        DType::I32 => format!("(int){value}"),
        DType::I64 => format!("fbc_d2i64({value})"),
        DType::Bool => format!("(unsigned char)({value} != 0.0 ? 1 : 0)"),
    }
}

/// `x` (held at `from`) rounded to `dtype` as [`DType::round`] does, held at
/// `Prec::of(dtype)`.
pub fn round_expr(from: Prec, dtype: DType, x: &str) -> String {
    match (from, dtype) {
        (Prec::F32, DType::F32) | (Prec::F64, DType::F64) => x.to_string(),
        (Prec::F32, DType::F16) => format!("fbc_rnd_fh({x})"),
        (Prec::F32, DType::BF16) => format!("fbc_rnd_fb({x})"),
        (Prec::F32, _) => round_expr(Prec::F64, dtype, &format!("(double){x}")),
        (Prec::F64, DType::F32) => format!("fbc_rnd_df({x})"),
        (Prec::F64, DType::F16) => format!("fbc_rnd_dh({x})"),
        (Prec::F64, DType::BF16) => format!("fbc_rnd_db({x})"),
        (Prec::F64, DType::I32) => format!("fbc_rnd_i32({x})"),
        (Prec::F64, DType::I64) => format!("fbc_rnd_i64({x})"),
        (Prec::F64, DType::Bool) => format!("fbc_rnd_bool({x})"),
    }
}

/// A C literal equal to `value` at `prec`, bit for bit (NaN as the default quiet NaN). Rust's
/// shortest round-trip formatting in the value's own type parses back to the same value;
/// NaN and infinities are spelled through their bits (NVRTC has no `<math.h>` macros).
pub fn literal(value: f64, prec: Prec) -> String {
    let special = |bits: &str| match prec {
        Prec::F32 => format!("__int_as_float({bits})"),
        Prec::F64 => format!("__longlong_as_double({bits}LL)"),
    };
    let (nan, inf) = match prec {
        Prec::F32 => ("0x7fc00000", "0x7f800000"),
        Prec::F64 => ("0x7ff8000000000000", "0x7ff0000000000000"),
    };
    if value.is_nan() {
        return special(nan);
    }
    if value.is_infinite() {
        let sign = if value < 0.0 { "-" } else { "" };
        return format!("({sign}{})", special(inf));
    }
    match prec {
        Prec::F32 => format!("({:e}f)", value as f32),
        Prec::F64 => format!("({value:e})"),
    }
}

/// The identity of a reduction's accumulation, as an f64 literal.
pub fn identity(max: bool) -> String {
    if max {
        literal(f64::NEG_INFINITY, Prec::F64)
    } else {
        literal(0.0, Prec::F64)
    }
}

/// `a op b` at `prec`. Arithmetic goes through the round-to-nearest intrinsics so that no
/// compiler option can contract `a * b + c` into a fused multiply-add (the reference rounds
/// the product); comparisons give 1 or 0 at `prec`.
pub fn binary_expr(op: BinOp, a: &str, b: &str, prec: Prec) -> String {
    let f32 = prec == Prec::F32;
    let arith = |name: &str| {
        let letter = if f32 { "f" } else { "d" };
        format!("__{letter}{name}_rn({a}, {b})")
    };
    let compare = |sym: &str| {
        let (one, zero) = if f32 {
            ("1.0f", "0.0f")
        } else {
            ("1.0", "0.0")
        };
        format!("(({a} {sym} {b}) ? {one} : {zero})")
    };
    match op {
        BinOp::Add => arith("add"),
        BinOp::Sub => arith("sub"),
        BinOp::Mul => arith("mul"),
        BinOp::Div => arith("div"),
        BinOp::Lt => compare("<"),
        BinOp::Le => compare("<="),
        BinOp::Gt => compare(">"),
        BinOp::Ge => compare(">="),
        BinOp::Eq => compare("=="),
        BinOp::Ne => compare("!="),
    }
}

/// A formula primitive at `prec`. The math library calls are CUDA's accurate functions
/// (`expf`, never `__expf`); square root and the division in `rsqrt` use the IEEE-rounded
/// intrinsics whatever `--prec-sqrt`/`--prec-div` say.
pub fn call_expr(func: Func, args: &[String], prec: Prec) -> String {
    let f32 = prec == Prec::F32;
    let pick = |float: &str, double: &str| if f32 { float } else { double }.to_string();
    let name = match func {
        Func::Exp => pick("expf", "exp"),
        Func::Log => pick("logf", "log"),
        Func::Log1p => pick("log1pf", "log1p"),
        Func::Expm1 => pick("expm1f", "expm1"),
        Func::Sqrt => pick("__fsqrt_rn", "__dsqrt_rn"),
        Func::Tanh => pick("tanhf", "tanh"),
        Func::Erf => pick("erff", "erf"),
        Func::Abs => pick("fabsf", "fabs"),
        Func::Floor => pick("floorf", "floor"),
        Func::Sin => pick("sinf", "sin"),
        Func::Cos => pick("cosf", "cos"),
        Func::Pow => pick("powf", "pow"),
        Func::Min => pick("fbc_minf", "fbc_mind"),
        Func::Max => pick("fbc_maxf", "fbc_maxd"),
        Func::Rsqrt => {
            return if f32 {
                format!("__fdiv_rn(1.0f, __fsqrt_rn({}))", args[0])
            } else {
                format!("__ddiv_rn(1.0, __dsqrt_rn({}))", args[0])
            };
        }
        Func::Select => {
            let zero = if f32 { "0.0f" } else { "0.0" };
            return format!("(({} != {zero}) ? {} : {})", args[0], args[1], args[2]);
        }
    };
    format!("{name}({})", args.join(", "))
}
