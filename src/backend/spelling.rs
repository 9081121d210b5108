//! The scalar spelling of kernel IR in C, shared by the C and the CUDA emitters.
//!
//! Both backends compute the same [`KernelIr`] with the same semantics, element by element,
//! and most of what they write for one element is the same text: a widening is `(double)x`, a
//! comparison `((a < b) ? 1.0f : 0.0f)`, an f16 load `<prefix>h2f(raw)`, a finite literal its
//! shortest round-trip digits. Where they differ it is for a reason: CUDA spells arithmetic
//! with the `__fadd_rn`-style intrinsics so that no compiler option can fuse a multiply-add,
//! has no `<math.h>` macros for NaN and infinity, stores in `__half`/`long long` rather than
//! `uint16_t`/`int64_t`; the CPU calls its inline `fb_expf`/`fb_tanhf` and branch-free
//! `fb_floor`. Each helper lives in the backend's own prelude (`fb_` in C, `fbc_` in CUDA).
//!
//! [`Spelling`] holds the common text once, in its provided methods, and asks each backend
//! only for the differences. The provided methods match exhaustively on [`Instr`], [`DType`],
//! [`BinOp`] and [`Func`], so a new instruction, dtype, operator or function does not compile
//! until it is spelled for both backends, in one place that shows whether they agree.

use crate::dtype::DType;
use crate::formula::{BinOp, Func};
use crate::lower::accumulate::Accumulator;
use crate::lower::ir::{Instr, KernelIr, Prec, ValueId};

/// The four arithmetic operators, which the backends spell differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// How a C-like backend writes scalar values, conversions and instructions. Implemented by
/// zero-sized markers (`cpu::emit::expr::C`, `cuda::emit::expr::Cuda`); the required methods
/// are exactly where the two backends differ.
pub(crate) trait Spelling {
    /// The prefix of the helper functions the backend's prelude defines.
    const PREFIX: &'static str;

    /// The C type elements of `dtype` are stored as in memory.
    fn storage_type(&self, dtype: DType) -> &'static str;

    /// A stored bool element `raw` as a `double` 0 or 1.
    fn bool_load(&self, raw: &str) -> String;

    /// A `double` 0 or 1 in bool storage.
    fn bool_store(&self, value: &str) -> String;

    /// A `double` rounded to nearest even to `float`.
    fn f64_to_f32(&self, x: &str) -> String;

    /// A `double` rounded to bool as [`DType::round`] does: 1 unless it is 0.
    fn f64_to_bool(&self, x: &str) -> String;

    /// A NaN at `prec`, as a complete expression.
    fn nan(&self, prec: Prec) -> String;

    /// +∞ at `prec` (the caller parenthesizes it, with a sign when negative).
    fn infinity(&self, prec: Prec) -> String;

    /// `a op b`, rounded once to `prec`.
    fn arithmetic(&self, op: Arith, a: &str, b: &str, prec: Prec) -> String;

    /// The name of the function that computes `func` at `prec` as instruction `id` of `ir`
    /// does: one of the functions without a shared spelling (those [`Spelling::call`] hands
    /// over). The CPU picks a cheaper `exp` for some instructions, hence `ir` and `id`.
    fn function(&self, ir: &KernelIr, id: ValueId, func: Func, prec: Prec) -> String;

    /// The index of the current point on domain axis `axis`, as the backend's loops name it
    /// (read by range loads and selects; the range bounds are the locals `rs{r}`, `re{r}`).
    fn coordinate(&self, ir: &KernelIr, axis: usize) -> String;

    /// The value accumulator `acc` starts from ([`Accumulator::identity`]), at its precision.
    fn identity(&self, acc: &Accumulator) -> String;

    /// The C type a value of precision `prec` is held in.
    fn value_type(&self, prec: Prec) -> &'static str {
        match prec {
            Prec::F32 => "float",
            Prec::F64 => "double",
            Prec::I64 => self.storage_type(DType::I64),
        }
    }

    /// An integer literal of the `Prec::I64` type. `i64::MIN` has no literal in C (its
    /// magnitude does not fit), so it is spelled as a difference.
    fn int_literal(&self, value: i64) -> String {
        let ty = self.value_type(Prec::I64);
        if value == i64::MIN {
            format!("(({ty})(-9223372036854775807LL - 1))")
        } else {
            format!("(({ty}){value}LL)")
        }
    }

    /// A `Prec::I64` value `a op b` for an arithmetic `op`, wrapping. Signed overflow is
    /// undefined behaviour in C and CUDA, so `+`, `-` and `*` run on `unsigned long long`,
    /// where overflow is defined modulo 2^64, and convert back (modulo 2^64 too with GCC and
    /// NVCC, which define the out-of-range conversion that way). Division has no integer
    /// meaning: through f64. Comparisons are [`Self::binary`]'s, as at every precision.
    fn int_arithmetic(&self, op: BinOp, a: &str, b: &str) -> String {
        let ty = self.value_type(Prec::I64);
        let wrap =
            |sym: &str| format!("(({ty})((unsigned long long){a} {sym} (unsigned long long){b}))");
        match op {
            BinOp::Add => wrap("+"),
            BinOp::Sub => wrap("-"),
            BinOp::Mul => wrap("*"),
            BinOp::Div => {
                let quotient = self.arithmetic(
                    Arith::Div,
                    &format!("(double){a}"),
                    &format!("(double){b}"),
                    Prec::F64,
                );
                self.round(Prec::F64, DType::I64, &quotient)
            }
            _ => unreachable!("comparisons are spelled by `binary`"),
        }
    }

    /// A `Prec::I64` value `-x`, wrapping (`-i64::MIN` is `i64::MIN`).
    fn int_neg(&self, x: &str) -> String {
        let ty = self.value_type(Prec::I64);
        format!("(({ty})(0ULL - (unsigned long long){x}))")
    }

    /// A primitive on `Prec::I64` values: `abs` wraps, `min`/`max`/`select` are exact, and
    /// the rest go through f64 and back as a cast to i64 does (see [`Prec::I64`]).
    fn int_call(&self, ir: &KernelIr, id: ValueId, func: Func, args: &[String]) -> String {
        match func {
            Func::Abs => format!("(({0} < 0) ? {1} : {0})", args[0], self.int_neg(&args[0])),
            Func::Min => format!("(({0} < {1}) ? {0} : {1})", args[0], args[1]),
            Func::Max => format!("(({0} > {1}) ? {0} : {1})", args[0], args[1]),
            Func::Select => format!("(({} != 0) ? {} : {})", args[0], args[1], args[2]),
            _ => {
                let doubles: Vec<String> = args.iter().map(|a| format!("(double){a}")).collect();
                let result = self.call(ir, id, func, &doubles, Prec::F64);
                self.round(Prec::F64, DType::I64, &result)
            }
        }
    }

    /// A stored element `raw` as a value at `Prec::of(dtype)` (exact in every case).
    fn load(&self, dtype: DType, raw: &str) -> String {
        let prefix = Self::PREFIX;
        match dtype {
            DType::F16 => format!("{prefix}h2f({raw})"),
            DType::BF16 => format!("{prefix}b2f({raw})"),
            DType::F32 | DType::F64 => raw.to_string(),
            DType::Bool => self.bool_load(raw),
            // Every integer dtype, held in 64 bits.
            _ => format!("({}){raw}", self.value_type(Prec::I64)),
        }
    }

    /// A value at `Prec::of(dtype)`, already rounded to `dtype`, in `dtype`'s storage format.
    fn store(&self, dtype: DType, value: &str) -> String {
        let prefix = Self::PREFIX;
        match dtype {
            DType::F16 => format!("{prefix}f2h({value})"),
            DType::BF16 => format!("{prefix}f2b({value})"),
            DType::F32 | DType::F64 => value.to_string(),
            // The value is already within the dtype's range: the conversion is exact.
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 | DType::U32 => {
                format!("({}){value}", self.storage_type(dtype))
            }
            DType::I64 => value.to_string(),
            DType::Bool => self.bool_store(value),
        }
    }

    /// `x` (held at `from`) rounded to `dtype` as [`DType::round`] does, held at
    /// `Prec::of(dtype)`.
    fn round(&self, from: Prec, dtype: DType, x: &str) -> String {
        let prefix = Self::PREFIX;
        let int = self.value_type(Prec::I64);
        match (from, dtype) {
            (Prec::F32, DType::F32) | (Prec::F64, DType::F64) | (Prec::I64, DType::I64) => {
                x.to_string()
            }
            // Wrap to the low 32 bits (the narrowing conversion is modulo 2^32 with GCC and
            // NVCC), then sign-extend back.
            (Prec::I64, DType::I32) => {
                format!("(({int})(int)(unsigned int)(unsigned long long){x})")
            }
            // The narrower integers the same way: the low bits, then their sign (if any).
            (Prec::I64, DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::U32) => {
                let low = match dtype {
                    DType::I8 => "(signed char)(unsigned char)",
                    DType::U8 => "(unsigned char)",
                    DType::I16 => "(short)(unsigned short)",
                    DType::U16 => "(unsigned short)",
                    _ => "(unsigned int)",
                };
                format!("(({int}){low}(unsigned long long){x})")
            }
            (Prec::I64, DType::Bool) => format!("(({x} != 0) ? 1.0 : 0.0)"),
            // To nearest f64 first: for every narrower float the second rounding agrees with
            // rounding the integer once (f64 has more than twice their precision plus two).
            (Prec::I64, DType::F64) => format!("(double){x}"),
            (Prec::I64, _) => self.round(Prec::F64, dtype, &format!("(double){x}")),
            (Prec::F32, DType::F16) => format!("{prefix}rnd_fh({x})"),
            (Prec::F32, DType::BF16) => format!("{prefix}rnd_fb({x})"),
            (Prec::F32, _) => self.round(Prec::F64, dtype, &format!("(double){x}")),
            (Prec::F64, DType::F32) => self.f64_to_f32(x),
            (Prec::F64, DType::F16) => format!("{prefix}rnd_dh({x})"),
            (Prec::F64, DType::BF16) => format!("{prefix}rnd_db({x})"),
            // Both helpers truncate and saturate in double (NaN -> 0); the i32 result is then
            // exact in any integer type, the i64 one may be 2^63, which `d2i64` saturates.
            (Prec::F64, DType::I32) => format!("(({int}){prefix}rnd_i32({x}))"),
            (Prec::F64, DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::U32) => {
                let (lo, hi) = dtype.int_range().expect("an integer dtype");
                format!("(({int}){prefix}rnd_int({x}, {lo}.0, {hi}.0))")
            }
            (Prec::F64, DType::I64) => format!("{prefix}d2i64({prefix}rnd_i64({x}))"),
            (Prec::F64, DType::Bool) => self.f64_to_bool(x),
        }
    }

    /// A literal equal to `value` at `prec`, bit for bit (NaN as some NaN). Rust's shortest
    /// round-trip formatting of the value in its own type parses back to the same value.
    fn literal(&self, value: f64, prec: Prec) -> String {
        if prec == Prec::I64 {
            // As a formula literal on integers converts (`WrappingInt::from_f64`).
            return self.int_literal(value as i64);
        }
        if value.is_nan() {
            return self.nan(prec);
        }
        if value.is_infinite() {
            let sign = if value < 0.0 { "-" } else { "" };
            return format!("({sign}{})", self.infinity(prec));
        }
        match prec {
            Prec::F32 => format!("({:e}f)", value as f32),
            Prec::F64 | Prec::I64 => format!("({value:e})"),
        }
    }

    /// `a op b` at `prec`; comparisons give 1 or 0 at `prec`.
    fn binary(&self, op: BinOp, a: &str, b: &str, prec: Prec) -> String {
        let compare = |sym: &str| {
            let (one, zero) = match prec {
                Prec::F32 => ("1.0f".to_string(), "0.0f".to_string()),
                Prec::F64 => ("1.0".to_string(), "0.0".to_string()),
                Prec::I64 => {
                    let ty = self.value_type(Prec::I64);
                    (format!("({ty})1"), format!("({ty})0"))
                }
            };
            format!("(({a} {sym} {b}) ? {one} : {zero})")
        };
        match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div if prec == Prec::I64 => {
                self.int_arithmetic(op, a, b)
            }
            BinOp::Add => self.arithmetic(Arith::Add, a, b, prec),
            BinOp::Sub => self.arithmetic(Arith::Sub, a, b, prec),
            BinOp::Mul => self.arithmetic(Arith::Mul, a, b, prec),
            BinOp::Div => self.arithmetic(Arith::Div, a, b, prec),
            BinOp::Lt => compare("<"),
            BinOp::Le => compare("<="),
            BinOp::Gt => compare(">"),
            BinOp::Ge => compare(">="),
            BinOp::Eq => compare("=="),
            BinOp::Ne => compare("!="),
        }
    }

    /// Instruction `id` of `ir`, a call of `func` on `args` at `prec`, with the reference
    /// interpreter's semantics: `rsqrt(x)` is `1 / sqrt(x)` (two roundings), `select(c, a, b)`
    /// is `c != 0 ? a : b`, and `min`/`max` (NaN wins, −0 below +0) are prelude helpers.
    fn call(&self, ir: &KernelIr, id: ValueId, func: Func, args: &[String], prec: Prec) -> String {
        if prec == Prec::I64 {
            return self.int_call(ir, id, func, args);
        }
        let f32 = prec == Prec::F32;
        let prefix = Self::PREFIX;
        let suffix = if f32 { "f" } else { "d" };
        match func {
            Func::Rsqrt => {
                let one = if f32 { "1.0f" } else { "1.0" };
                let sqrt = self.function(ir, id, Func::Sqrt, prec);
                self.arithmetic(Arith::Div, one, &format!("{sqrt}({})", args[0]), prec)
            }
            Func::Select => {
                let zero = if f32 { "0.0f" } else { "0.0" };
                format!("(({} != {zero}) ? {} : {})", args[0], args[1], args[2])
            }
            Func::Min => format!("{prefix}min{suffix}({}, {})", args[0], args[1]),
            Func::Max => format!("{prefix}max{suffix}({}, {})", args[0], args[1]),
            Func::Exp
            | Func::Log
            | Func::Log1p
            | Func::Expm1
            | Func::Sqrt
            | Func::Tanh
            | Func::Erf
            | Func::Abs
            | Func::Floor
            | Func::Sin
            | Func::Cos
            | Func::Atan
            | Func::Pow => format!("{}({})", self.function(ir, id, func, prec), args.join(", ")),
        }
    }

    /// The expression computing SSA value `id` of `ir` from the values `v{x}` before it;
    /// `element(view)` is the stored element that a load of `view` reads at the current point.
    fn value(&self, ir: &KernelIr, id: ValueId, element: impl Fn(usize) -> String) -> String {
        let v = |x: ValueId| format!("v{x}");
        match &ir.body[id] {
            Instr::Load { view } => self.load(ir.loads[*view].dtype, &element(*view)),
            // The emitter's `element` for a gather's view already adds the index's offset
            // ([`gather_offset`]); out of range, nothing is read.
            Instr::GatherLoad {
                view,
                index,
                gather,
            } => self.gathered(
                ir,
                id,
                &gather_in_range(&format!("v{index}"), *gather),
                &element(*view),
            ),
            // A conditional expression evaluates only the branch taken: outside its range
            // the load reads no memory.
            Instr::RangeLoad { view, axis, range } => {
                let c = self.coordinate(ir, *axis);
                let zero = match ir.prec(id) {
                    Prec::I64 => self.int_literal(0),
                    prec => self.literal(0.0, prec),
                };
                format!(
                    "(({c} >= rs{range} && {c} < re{range}) ? {} : {zero})",
                    self.load(ir.loads[*view].dtype, &element(*view))
                )
            }
            Instr::Select {
                axis,
                ranges,
                cases,
                ..
            } => {
                let c = self.coordinate(ir, *axis);
                let mut text = v(cases[cases.len() - 1]);
                for (&r, &x) in ranges.iter().zip(cases).rev().skip(1) {
                    text = format!("({c} < re{r} ? {} : {text})", v(x));
                }
                text
            }
            Instr::Const { value, prec } => self.literal(*value, *prec),
            Instr::Int { value } => self.int_literal(*value),
            Instr::Widen { x } => format!("(double){}", v(*x)),
            // The row's result, which the row loops define before the passes that read it.
            Instr::RowReduce { .. } => format!("r{id}"),
            Instr::Round { x, dtype } => self.round(ir.prec(*x), *dtype, &v(*x)),
            Instr::Neg { x, prec: Prec::I64 } => self.int_neg(&v(*x)),
            Instr::Neg { x, .. } => format!("(-{})", v(*x)),
            Instr::Binary { op, a, b, prec } => self.binary(*op, &v(*a), &v(*b), *prec),
            Instr::Call { func, args, prec } => {
                let args: Vec<String> = args.iter().map(|&a| v(a)).collect();
                self.call(ir, id, *func, &args, *prec)
            }
        }
    }

    /// The statement of store `k` of `ir` if it scatters ([`crate::lower::ir::Scatter`]),
    /// where the emitter spells the store's buffer `pointer` and its element at the current
    /// point `index`: where the store's index is in range, the element that index moves to
    /// ([`gather_offset`]) becomes its sum with the stored value, rounded to the dtype. `None`
    /// for a plain store.
    fn scatter_add(&self, ir: &KernelIr, k: usize, pointer: &str, index: &str) -> Option<String> {
        let store = &ir.stores[k];
        let scatter = store.scatter?;
        let (i, g) = (scatter.index, scatter.gather);
        let element = format!("{pointer}[{index} + {}]", gather_offset(i, g));
        let dtype = store.view.dtype;
        let prec = Prec::of(dtype);
        let old = self.load(dtype, &element);
        let sum = self.binary(BinOp::Add, &old, &format!("v{}", store.value), prec);
        let rounded = self.round(prec, dtype, &sum);
        Some(format!(
            "if ({}) {element} = {};",
            gather_in_range(&format!("v{i}"), g),
            self.store(dtype, &rounded)
        ))
    }

    /// Gather `id`'s value: the stored `element` where `in_range` holds, else the fill (NaN
    /// for a float view, 0 for the others).
    fn gathered(&self, ir: &KernelIr, id: ValueId, in_range: &str, element: &str) -> String {
        let Instr::GatherLoad { view, .. } = ir.body[id] else {
            unreachable!("v{id} is a gather");
        };
        let dtype = ir.loads[view].dtype;
        let prec = ir.prec(id);
        let fill = match prec {
            Prec::I64 => self.int_literal(0),
            _ if dtype.is_float() => self.literal(f64::NAN, prec),
            _ => self.literal(0.0, prec),
        };
        format!("(({in_range}) ? {} : {fill})", self.load(dtype, element))
    }

    /// The statement defining row gather `id` ([`KernelIr::row_gathers`]) at `element`, its
    /// view's element at the row's gathered base: the row's index was checked once, into
    /// `gok{id}` (apart from the stores' guards, `ok{k}`).
    fn row_gather_definition(&self, ir: &KernelIr, id: ValueId, element: &str) -> String {
        let ty = self.value_type(ir.prec(id));
        let value = self.gathered(ir, id, &format!("gok{id}"), element);
        format!("const {ty} v{id} = {value};")
    }

    /// The statement defining `v{id}` (see [`Spelling::value`]).
    fn definition(&self, ir: &KernelIr, id: ValueId, element: impl Fn(usize) -> String) -> String {
        let ty = self.value_type(ir.prec(id));
        format!("const {ty} v{id} = {};", self.value(ir, id, element))
    }
}

/// The C math library's name for `func` at `prec` (`expf`, `exp`, …). Both backends call
/// these for the functions they do not spell themselves; the CPU prelude also declares them.
pub(crate) fn libm_name(func: Func, prec: Prec) -> String {
    let base = match func {
        Func::Exp => "exp",
        Func::Log => "log",
        Func::Log1p => "log1p",
        Func::Expm1 => "expm1",
        Func::Sqrt => "sqrt",
        Func::Tanh => "tanh",
        Func::Erf => "erf",
        Func::Abs => "fabs",
        Func::Floor => "floor",
        Func::Sin => "sin",
        Func::Cos => "cos",
        Func::Atan => "atan",
        Func::Pow => "pow",
        Func::Rsqrt | Func::Min | Func::Max | Func::Select => {
            unreachable!("{func:?} is not a libm function")
        }
    };
    match prec {
        Prec::F32 => format!("{base}f"),
        // Integers call the f64 function (see `Spelling::int_call`).
        Prec::F64 | Prec::I64 => base.to_string(),
    }
}

/// The statements computing the positions of load `id` through the index map of load view
/// `arg`, after the first one (`q{id}_0`, the point's index into the first stage, which each
/// backend defines itself), as `(name, statement)` pairs in order, integers of C type `int`.
/// Both backends write exactly these; C puts them on one line, CUDA defines each on its own
/// so that the ones nothing reads drop out.
///
/// Stage `k` of rank `r` unflattens its position `q{id}_k` row-major from the innermost axis
/// out (the outermost coordinate is what remains, needing no remainder), and its output
/// position `q{id}_{k+1}` is the stage's offset `c{arg}_{k}` plus each coordinate times its
/// stride `t{arg}_{k}_{e}`. Each quotient by a size `m{arg}_{k}_{e}` is taken with the size's
/// reciprocal `r{arg}_{k}_{e} = 1.0 / (double)m` (rounded once, defined by the backend with
/// the other map arguments) and one correction, not with an integer division: a 64-bit
/// division is a long instruction sequence on CPUs (which cannot vectorize it) and is emulated
/// in software on GPUs, where a double multiply and two conversions are a few instructions.
///
/// Why it is exact. `Program::check_bounds` proves every position satisfies `|q| < 2^51`
/// ([`crate::lower::MAX_MAP_POSITIONS`]; a range load computes positions outside its range
/// too, where `q` may be negative, and nothing reads what they give). `(double)q` is then
/// exact, `r` is within `2^-53` of `1/m` relatively and the product rounds once more, so the
/// estimate is within `(2^-52 + 2^-106)·|q|/m < 1/2` of `q/m`. Truncating it gives the floor
/// `a` of `q/m` or a neighbour (`a - 1` when `q/m` is an integer approached from below,
/// `a + 1` within `1/2` below it), so the remainder estimate `q - ae·m` lies in `[-m, 2m)`,
/// and one step (`- (xe < 0)`, `+ (xe >= m)`) lands on `a` and the exact remainder in
/// `[0, m)` (for negative `q`, the floor quotient and the non-negative remainder: the same
/// arithmetic). No product overflows: `|ae·m| <= |q| + m`, below `2^52` with 64-bit integers;
/// with 32-bit ones (`|q| < 2^31`, the narrow CUDA variant) the estimate's error is below
/// `2^-21/m`, so `ae` is `a` or `a - 1` and `ae·m <= q`.
pub(crate) fn map_stage_positions<S: Spelling>(
    spelling: &S,
    ir: &KernelIr,
    arg: usize,
    id: usize,
    int: &str,
) -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for (k, &r) in ir.loads[arg].stages.iter().enumerate() {
        let mut rest = format!("q{id}_{k}");
        let mut sum = format!("c{arg}_{k}");
        for e in (1..r).rev() {
            let (m, a, x) = (
                format!("m{arg}_{k}_{e}"),
                format!("a{id}_{k}_{e}"),
                format!("x{id}_{k}_{e}"),
            );
            let product = spelling.arithmetic(
                Arith::Mul,
                &format!("(double){rest}"),
                &format!("r{arg}_{k}_{e}"),
                Prec::F64,
            );
            lines.push((
                format!("{a}e"),
                format!("const {int} {a}e = ({int}){product};"),
            ));
            lines.push((
                format!("{x}e"),
                format!("const {int} {x}e = {rest} - {a}e * {m};"),
            ));
            lines.push((
                a.clone(),
                format!("const {int} {a} = {a}e - ({x}e < 0) + ({x}e >= {m});"),
            ));
            lines.push((x.clone(), format!("const {int} {x} = {rest} - {a} * {m};")));
            sum.push_str(&format!(" + {x} * t{arg}_{k}_{e}"));
            rest = a;
        }
        sum.push_str(&format!(" + {rest} * t{arg}_{k}_0"));
        lines.push((
            format!("q{id}_{}", k + 1),
            format!("const {int} q{id}_{} = {sum};", k + 1),
        ));
    }
    lines
}

/// The offset a gather's index adds to its view's element ([`Instr::GatherLoad`]): the index,
/// taken from the end when negative, times the stride of the axis it moves along. Spelled for
/// both emitters' `element`, inside the bounds check the shared spelling puts around the load.
pub(crate) fn gather_offset(index: ValueId, gather: usize) -> String {
    gather_offset_of(&format!("v{index}"), gather)
}

/// [`gather_offset`] of the index the emitter spells `index` (a row's index read once).
pub(crate) fn gather_offset_of(index: &str, gather: usize) -> String {
    format!("({index} < 0 ? {index} + gn{gather} : {index}) * gs{gather}")
}

/// Whether the index spelled `index` lies in the range of gather `gather`'s axis: from minus
/// its size (counting from the end) to below its size.
pub(crate) fn gather_in_range(index: &str, gather: usize) -> String {
    format!("{index} >= -gn{gather} && {index} < gn{gather}")
}
