//! The C emitter, end to end: hand-built kernel IR → C → compiled library → called with
//! hand-computed launch arguments, and every result checked against an independent Rust
//! computation.
//!
//! Exact where the semantics are exact (arithmetic, conversions, NaN/Inf, signed zeros);
//! within a few ulps where libmvec's vector math is involved. Large domains (hundreds of
//! thousands of elements) make the parallel paths run on a multi-core machine.

use fusebox::backend::cpu::compiler::{
    Compiler, CompilerConfig, KernelFn, Module, PRECOMPILED_HEADER,
};
use fusebox::backend::cpu::emit::{
    ROW_SCRATCH_BYTES, STREAM_MIN_BYTES, emit_kernel, emit_module, kernel_name,
};
use fusebox::dtype::DType;
use fusebox::formula::{BinOp, Func};
use fusebox::lower::ir::{
    Axis, Instr, KernelIr, Prec, ReduceKind, Reduction, RowArithmetic, Store, ValueId, View,
};
use half::{bf16, f16};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use Axis::{Broadcast as B, Strided as S, Unit as U};

#[allow(dead_code)]
use crate::common::map_positions;

// ---------------------------------------------------------------------------------------------
// Harness.

fn compiler() -> &'static Compiler {
    static COMPILER: OnceLock<Compiler> = OnceLock::new();
    COMPILER.get_or_init(|| {
        let dir = std::env::temp_dir().join("fusebox-test-cpu-emit-cache");
        Compiler::new(CompilerConfig::from_env().with_cache_dir(dir))
    })
}

struct Compiled {
    module: Arc<Module>,
    f: KernelFn,
    ir: KernelIr,
}

fn compile(ir: &KernelIr) -> Compiled {
    let name = kernel_name(ir);
    let source = emit_module(&[(name.clone(), ir)]);
    let module = compiler()
        .compile(&source)
        .unwrap_or_else(|e| panic!("{e}\n--- source ---\n{source}"));
    let f = module.kernel(&name).expect("kernel symbol");
    Compiled {
        module,
        f,
        ir: ir.clone(),
    }
}

/// A buffer in a dtype's storage format.
#[derive(Debug, Clone)]
enum Buf {
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// f16 or bf16 bits.
    Half(Vec<u16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<u8>),
}

impl Buf {
    fn len(&self) -> usize {
        match self {
            Buf::F32(v) => v.len(),
            Buf::F64(v) => v.len(),
            Buf::Half(v) => v.len(),
            Buf::I32(v) => v.len(),
            Buf::I64(v) => v.len(),
            Buf::Bool(v) => v.len(),
        }
    }

    fn ptr(&mut self) -> *mut c_void {
        match self {
            Buf::F32(v) => v.as_mut_ptr().cast(),
            Buf::F64(v) => v.as_mut_ptr().cast(),
            Buf::Half(v) => v.as_mut_ptr().cast(),
            Buf::I32(v) => v.as_mut_ptr().cast(),
            Buf::I64(v) => v.as_mut_ptr().cast(),
            Buf::Bool(v) => v.as_mut_ptr().cast(),
        }
    }

    fn f32(&self) -> &[f32] {
        match self {
            Buf::F32(v) => v,
            other => panic!("not f32: {other:?}"),
        }
    }

    fn f64(&self) -> &[f64] {
        match self {
            Buf::F64(v) => v,
            other => panic!("not f64: {other:?}"),
        }
    }

    fn half(&self) -> &[u16] {
        match self {
            Buf::Half(v) => v,
            other => panic!("not f16/bf16: {other:?}"),
        }
    }

    fn i32(&self) -> &[i32] {
        match self {
            Buf::I32(v) => v,
            other => panic!("not i32: {other:?}"),
        }
    }

    fn i64(&self) -> &[i64] {
        match self {
            Buf::I64(v) => v,
            other => panic!("not i64: {other:?}"),
        }
    }

    fn bool(&self) -> &[u8] {
        match self {
            Buf::Bool(v) => v,
            other => panic!("not bool: {other:?}"),
        }
    }
}

/// One kernel argument: its buffer and where the view lies in it.
struct Arg {
    buf: Buf,
    strides: Vec<i64>,
    offset: i64,
}

fn arg(buf: Buf, strides: &[i64], offset: i64) -> Arg {
    Arg {
        buf,
        strides: strides.to_vec(),
        offset,
    }
}

/// Calls the kernel over domain `sizes`, after checking (so a wrong test cannot corrupt
/// memory) that every view stays inside its buffer.
fn run(k: &Compiled, sizes: &[i64], args: &mut [Arg]) {
    assert_eq!(args.len(), k.ir.arg_count(), "argument count");
    assert_eq!(sizes.len(), k.ir.rank);
    if sizes.iter().all(|&n| n > 0) {
        for (a, arg) in args.iter().enumerate() {
            assert_eq!(arg.strides.len(), k.ir.rank);
            let mut lo = arg.offset;
            let mut hi = arg.offset;
            for (&n, &s) in sizes.iter().zip(&arg.strides) {
                lo += ((n - 1) * s).min(0);
                hi += ((n - 1) * s).max(0);
            }
            assert!(
                lo >= 0 && hi < arg.buf.len() as i64,
                "argument {a} reaches [{lo}, {hi}] of a buffer of {}",
                arg.buf.len()
            );
        }
    }
    let strides: Vec<i64> = args.iter().flat_map(|a| a.strides.clone()).collect();
    let offsets: Vec<i64> = args.iter().map(|a| a.offset).collect();
    let ptrs: Vec<*mut c_void> = args.iter_mut().map(|a| a.buf.ptr()).collect();
    // SAFETY: the argument layout follows the ABI of `Launch` for `k.ir` (checked above:
    // counts, ranks, and every reachable index in bounds), and the module is alive.
    unsafe {
        (k.f)(
            sizes.as_ptr(),
            strides.as_ptr(),
            offsets.as_ptr(),
            ptrs.as_ptr(),
        )
    };
}

/// Straight-line SSA under construction.
#[derive(Default)]
struct Body(Vec<Instr>);

impl Body {
    fn push(&mut self, instr: Instr) -> ValueId {
        self.0.push(instr);
        self.0.len() - 1
    }
    fn load(&mut self, view: usize) -> ValueId {
        self.push(Instr::Load { view })
    }
    fn c(&mut self, value: f64, prec: Prec) -> ValueId {
        self.push(Instr::Const { value, prec })
    }
    fn bin(&mut self, op: BinOp, a: ValueId, b: ValueId, prec: Prec) -> ValueId {
        self.push(Instr::Binary { op, a, b, prec })
    }
    fn call(&mut self, func: Func, args: &[ValueId], prec: Prec) -> ValueId {
        self.push(Instr::Call {
            func,
            args: args.to_vec(),
            prec,
        })
    }
    fn round(&mut self, x: ValueId, dtype: DType) -> ValueId {
        self.push(Instr::Round { x, dtype })
    }
    fn neg(&mut self, x: ValueId, prec: Prec) -> ValueId {
        self.push(Instr::Neg { x, prec })
    }
}

fn view(dtype: DType, axes: &[Axis]) -> View {
    View::strided(dtype, axes.to_vec())
}

fn store(value: ValueId, dtype: DType, axes: &[Axis]) -> Store {
    Store::new(value, view(dtype, axes))
}

fn reduction(kind: ReduceKind, value: ValueId, reduced: &[bool], dtype: DType) -> Reduction {
    let axes: Vec<Axis> = reduced
        .iter()
        .enumerate()
        .map(|(d, &r)| match (r, d + 1 == reduced.len()) {
            (true, _) => B,
            (false, true) => U,
            (false, false) => S,
        })
        .collect();
    Reduction {
        kind,
        value,
        reduced: reduced.to_vec(),
        view: view(dtype, &axes),
    }
}

/// Deterministic pseudo-random numbers (splitmix64), independent of any crate's API.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    fn f32s(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }
}

/// The distance between `x` and the next float away from zero.
fn ulp32(x: f32) -> f64 {
    let a = x.abs();
    if a.is_infinite() {
        return 0.0;
    }
    (f32::from_bits(a.to_bits() + 1) as f64) - a as f64
}

fn ulp64(x: f64) -> f64 {
    let a = x.abs();
    if a.is_infinite() {
        return 0.0;
    }
    f64::from_bits(a.to_bits() + 1) - a
}

/// NaN matches NaN, everything else matches bit for bit (so −0 ≠ +0).
fn same32(got: f32, want: f32) -> bool {
    (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits()
}

fn same64(got: f64, want: f64) -> bool {
    (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits()
}

fn assert_same32(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(same32(g, w), "{what}[{i}]: got {g:e}, want {w:e}");
    }
}

// ---------------------------------------------------------------------------------------------
// The LSTM cell tail: the kernel the CPU backend exists for.

/// `cy = sigmoid(f) * cx + sigmoid(i) * tanh(g)`, `hy = sigmoid(o) * tanh(cy)` over an
/// `[N, M]` domain, all f32, row-major (`Strided` rows, `Unit` columns).
fn lstm_tail_ir() -> KernelIr {
    let f = Prec::F32;
    let mut b = Body::default();
    let gates: Vec<ValueId> = (0..4).map(|v| b.load(v)).collect();
    let cx = b.load(4);
    let one = b.c(1.0, f);
    let sigmoid = |b: &mut Body, x: ValueId| {
        let nx = b.neg(x, f);
        let e = b.call(Func::Exp, &[nx], f);
        let d = b.bin(BinOp::Add, one, e, f);
        b.bin(BinOp::Div, one, d, f)
    };
    let ig = sigmoid(&mut b, gates[0]);
    let fg = sigmoid(&mut b, gates[1]);
    let og = sigmoid(&mut b, gates[3]);
    let cg = b.call(Func::Tanh, &[gates[2]], f);
    let fc = b.bin(BinOp::Mul, fg, cx, f);
    let ic = b.bin(BinOp::Mul, ig, cg, f);
    let cy = b.bin(BinOp::Add, fc, ic, f);
    let tc = b.call(Func::Tanh, &[cy], f);
    let hy = b.bin(BinOp::Mul, og, tc, f);
    KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &[S, U]); 5],
        body: b.0,
        stores: vec![
            store(cy, DType::F32, &[S, U]),
            store(hy, DType::F32, &[S, U]),
        ],
        reductions: vec![],
    }
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The LSTM tail in f64 from the same f32 inputs: `(cy, hy)`.
fn lstm_reference(i: f32, f: f32, g: f32, o: f32, cx: f32) -> (f64, f64) {
    let cy = sigmoid64(f as f64) * cx as f64 + sigmoid64(i as f64) * (g as f64).tanh();
    (cy, sigmoid64(o as f64) * cy.tanh())
}

/// Runs the LSTM tail on `[n, m]` inputs; returns `(cy, hy)`.
fn run_lstm(k: &Compiled, n: usize, m: usize, inputs: &[Vec<f32>; 5]) -> (Vec<f32>, Vec<f32>) {
    let rm = [m as i64, 1];
    let mut args: Vec<Arg> = inputs
        .iter()
        .map(|v| arg(Buf::F32(v.clone()), &rm, 0))
        .collect();
    args.push(arg(Buf::F32(vec![0.0; n * m]), &rm, 0));
    args.push(arg(Buf::F32(vec![0.0; n * m]), &rm, 0));
    run(k, &[n as i64, m as i64], &mut args);
    (args[5].buf.f32().to_vec(), args[6].buf.f32().to_vec())
}

#[test]
fn lstm_tail_matches_an_f64_reference_with_nan_and_inf_inputs() {
    let (n, m) = (300, 5000);
    let mut rng = Rng(1);
    let mut inputs: [Vec<f32>; 5] = std::array::from_fn(|_| rng.f32s(n * m, -4.0, 4.0));
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    // (element, input gate, forget gate, cell gate, output gate, cx): IEEE corner cases.
    let special: [(usize, [f32; 5]); 6] = [
        (0, [inf, -inf, inf, 0.5, 2.0]),    // i = 1, f = 0, g = 1: cy = 1
        (1, [-inf, inf, 0.3, inf, inf]),    // f = 1, cx = inf: cy = inf, hy = 1
        (7, [0.1, 0.2, 0.3, nan, 0.4]),     // o NaN: cy finite, hy NaN
        (m + 3, [nan, 0.2, 0.3, 0.4, 0.5]), // i NaN: both NaN
        (2 * m - 1, [inf, inf, -inf, inf, -inf]), // cy = -inf, hy = -1
        (n * m - 1, [0.0, -0.0, 0.0, 0.0, -0.0]),
    ];
    for (at, values) in special {
        for (input, v) in inputs.iter_mut().zip(values) {
            input[at] = v;
        }
    }
    let k = compile(&lstm_tail_ir());
    let (cy, hy) = run_lstm(&k, n, m, &inputs);
    for e in 0..n * m {
        let x: [f32; 5] = std::array::from_fn(|v| inputs[v][e]);
        let (want_cy, want_hy) = lstm_reference(x[0], x[1], x[2], x[3], x[4]);
        for (got, want, what) in [(cy[e], want_cy, "cy"), (hy[e], want_hy, "hy")] {
            if want.is_nan() || want.is_infinite() {
                assert!(
                    same64(got as f64, want),
                    "{what}[{e}] = {got}, want {want} for {x:?}"
                );
            } else {
                // A handful of f32 roundings, each within a few ulps.
                let tol = 1e-6 * (1.0 + want.abs());
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "{what}[{e}] = {got}, want {want} for {x:?}"
                );
            }
        }
    }
    assert_eq!(cy[0], 1.0);
    let want = sigmoid64(0.5) * 1f64.tanh();
    assert!(
        (hy[0] as f64 - want).abs() <= 2.0 * ulp32(want as f32),
        "{}",
        hy[0]
    );
    assert_eq!((cy[1], hy[1]), (f32::INFINITY, 1.0));
    assert!(cy[7].is_finite() && hy[7].is_nan());
    assert!(cy[m + 3].is_nan() && hy[m + 3].is_nan());
    assert_eq!((cy[2 * m - 1], hy[2 * m - 1]), (f32::NEG_INFINITY, -1.0));
    // sigmoid(-0) * -0 + sigmoid(0) * tanh(0) = -0 + +0 = +0.
    assert_eq!(cy[n * m - 1].to_bits(), 0.0f32.to_bits());
}

#[test]
fn narrow_rows_fold_into_long_ones_and_padded_rows_do_not() {
    // The LSTM tail over [n, 1] and [n, 8] (contiguous: the rows fold into one), and over
    // [n, 8] rows padded to a pitch of 9 (no fold: one short row per work item).
    let k = compile(&lstm_tail_ir());
    for (n, m, pitch) in [(100_000, 1, 1), (20_000, 8, 8), (20_000, 8, 9), (3, 1, 5)] {
        let mut rng = Rng(21);
        let inputs: [Vec<f32>; 5] = std::array::from_fn(|_| rng.f32s(n * pitch, -4.0, 4.0));
        let rm = [pitch as i64, 1];
        let mut args: Vec<Arg> = inputs
            .iter()
            .map(|v| arg(Buf::F32(v.clone()), &rm, 0))
            .collect();
        args.push(arg(Buf::F32(vec![f32::NAN; n * pitch]), &rm, 0));
        args.push(arg(Buf::F32(vec![f32::NAN; n * pitch]), &rm, 0));
        run(&k, &[n as i64, m as i64], &mut args);
        let outputs = args[5].buf.f32().iter().zip(args[6].buf.f32());
        for (e, (&cy, &hy)) in outputs.enumerate() {
            if e % pitch >= m {
                assert!(cy.is_nan() && hy.is_nan(), "padding [{e}] written");
                continue;
            }
            let x: [f32; 5] = std::array::from_fn(|v| inputs[v][e]);
            let (want_cy, want_hy) = lstm_reference(x[0], x[1], x[2], x[3], x[4]);
            assert!(
                (cy as f64 - want_cy).abs() <= 1e-6 * (1.0 + want_cy.abs()),
                "cy [{e}]"
            );
            assert!(
                (hy as f64 - want_hy).abs() <= 1e-6 * (1.0 + want_hy.abs()),
                "hy [{e}]"
            );
        }
    }
}

/// The dynamic symbols a compiled kernel library imports, or `None` without `nm`.
fn undefined_symbols(k: &Compiled) -> Option<String> {
    match std::process::Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(k.module.path())
        .output()
    {
        Ok(out) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => {
            eprintln!("skipped: `nm` is not available to inspect the kernel library");
            None
        }
    }
}

/// f32 exp and tanh are inline (no libm call of any width); the other transcendental
/// functions reach glibc's libmvec vector variants rather than scalar libm.
#[test]
fn vector_math_reaches_libmvec_and_f32_exp_and_tanh_are_inline() {
    let Some(lstm) = undefined_symbols(&compile(&lstm_tail_ir())) else {
        return;
    };
    assert!(
        !lstm
            .lines()
            .any(|l| l.contains("expf") || l.contains("tanhf")),
        "the LSTM kernel calls libm for exp or tanh:\n{lstm}"
    );
    let k = compile(&unary_kernel(DType::F32, |b, x| {
        let log = b.call(Func::Log, &[x], Prec::F32);
        let wide = b.push(Instr::Widen { x });
        let exp = b.call(Func::Exp, &[wide], Prec::F64);
        vec![(log, DType::F32), (exp, DType::F64)]
    }));
    let Some(output) = undefined_symbols(&k) else {
        return;
    };
    let vector = |f: &str| {
        output
            .lines()
            .any(|l| l.contains("_ZGV") && l.contains(&format!("v_{f}@")))
    };
    assert!(vector("logf"), "no vector logf called:\n{output}");
    assert!(vector("exp"), "no vector exp called:\n{output}");
}

/// f32 exp within 1.1 ulp of exp in f64 on every 61st float between -110 and 90 (36 million
/// values; the emitter's worst case over every third float there is 1.04 ulp), including results
/// that are subnormal or near the f32 maximum; exact at the edges: 0 below -103.98, +Inf from
/// 88.72284 up, NaN for NaN.
#[test]
fn f32_exp_is_within_one_ulp_across_its_range() {
    let k = compile(&unary_kernel(DType::F32, |b, x| {
        vec![(b.call(Func::Exp, &[x], Prec::F32), DType::F32)]
    }));
    let mut inputs: Vec<f32> = (0..=u32::MAX / 61)
        .map(|i| f32::from_bits(i * 61))
        .filter(|x| (-110.0..=90.0).contains(x))
        .collect();
    // Exact results; the largest finite result (at 88.72283) is checked by the loop below.
    let edges = [
        (f32::NAN, f32::NAN),
        (f32::INFINITY, f32::INFINITY),
        (f32::NEG_INFINITY, 0.0),
        (0.0, 1.0),
        (-0.0, 1.0),
        (88.72284, f32::INFINITY),
        (-104.0, 0.0),
        (-1e30, 0.0),
        (1e30, f32::INFINITY),
    ];
    inputs.push(88.72283);
    inputs.extend(edges.iter().map(|e| e.0));
    let n = inputs.len();
    let mut args = vec![
        arg(Buf::F32(inputs.clone()), &[1], 0),
        arg(Buf::F32(vec![0.0; n]), &[1], 0),
    ];
    run(&k, &[n as i64], &mut args);
    let got = args[1].buf.f32();
    let mut worst = 0.0f64;
    for (&x, &y) in inputs.iter().zip(got) {
        if x.is_nan() {
            assert!(y.is_nan(), "exp(NaN) = {y}");
            continue;
        }
        let want = (x as f64).exp();
        if want > f32::MAX as f64 * (1.0 + 2f64.powi(-25)) {
            assert_eq!(y, f32::INFINITY, "exp({x:e}) overflows");
            continue;
        }
        let err = (y as f64 - want).abs() / ulp32(want as f32);
        worst = worst.max(err);
        assert!(
            err <= 1.05,
            "exp({x:e}) = {y:e}, want {want:e} ({err:.3} ulp)"
        );
    }
    for (e, (x, want)) in edges.iter().enumerate() {
        let y = got[n - edges.len() + e];
        assert!(same32(y, *want), "exp({x:e}) = {y:e}, want {want:e}");
    }
    eprintln!("f32 exp: worst error {worst:.3} ulp over {n} values");
}

/// An exp only added to a literal (a sigmoid's `1 + exp(-x)`) uses the variant without the
/// subnormal range; the sums and the sigmoid are unchanged by it: `1 + exp(x)` within 1.6 ulp
/// and `1 / (1 + exp(-x))` (three roundings after the exp) within 4 ulp of f64 (with the f32 overflow of exp(-x) below
/// -88.72) on every 61st float, NaN and ±Inf exact.
/// An exp that is also stored keeps the full-range one.
#[test]
fn an_exp_only_added_to_a_literal_drops_the_subnormal_range_soundly() {
    let f = Prec::F32;
    let ir = unary_kernel(DType::F32, |b, x| {
        let one = b.c(1.0, f);
        let e = b.call(Func::Exp, &[x], f);
        let sum = b.bin(BinOp::Add, one, e, f);
        let nx = b.neg(x, f);
        let en = b.call(Func::Exp, &[nx], f);
        let d = b.bin(BinOp::Add, en, one, f);
        let sigmoid = b.bin(BinOp::Div, one, d, f);
        vec![(sum, DType::F32), (sigmoid, DType::F32)]
    });
    let text = emit_kernel(&ir, "k");
    assert_eq!(text.matches("fb_expf_addend(").count(), 2, "{text}");
    let stored = unary_kernel(DType::F32, |b, x| {
        let one = b.c(1.0, f);
        let e = b.call(Func::Exp, &[x], f);
        let sum = b.bin(BinOp::Add, one, e, f);
        vec![(sum, DType::F32), (e, DType::F32)]
    });
    let text = emit_kernel(&stored, "k");
    assert!(
        text.contains("fb_expf(") && !text.contains("fb_expf_addend("),
        "{text}"
    );

    let k = compile(&ir);
    let mut inputs: Vec<f32> = (0..=u32::MAX / 61)
        .map(|i| f32::from_bits(i * 61))
        .collect();
    inputs.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        -87.0,
        -86.99,
        -104.0,
    ]);
    let n = inputs.len();
    let mut args = vec![
        arg(Buf::F32(inputs.clone()), &[1], 0),
        arg(Buf::F32(vec![0.0; n]), &[1], 0),
        arg(Buf::F32(vec![0.0; n]), &[1], 0),
    ];
    run(&k, &[n as i64], &mut args);
    let mut worst = 0.0f64;
    for (e, &x) in inputs.iter().enumerate() {
        let (sum, sigmoid) = (args[1].buf.f32()[e], args[2].buf.f32()[e]);
        if x.is_nan() {
            assert!(
                sum.is_nan() && sigmoid.is_nan(),
                "NaN in, {sum} and {sigmoid} out"
            );
            continue;
        }
        let want_sum = 1.0 + (x as f64).exp();
        if want_sum > f32::MAX as f64 {
            assert_eq!(sum, f32::INFINITY, "1 + exp({x:e})");
        } else {
            let err = (sum as f64 - want_sum).abs() / ulp32(want_sum as f32);
            assert!(
                err <= 1.6,
                "1 + exp({x:e}) = {sum:e}, want {want_sum:e} ({err:.2} ulp)"
            );
        }
        // The formula in f32: exp(-x) overflows to +Inf below -88.72, and the sigmoid is 0.
        let want = 1.0 / (1.0 + ((-x as f64).exp() as f32) as f64);
        let err = (sigmoid as f64 - want).abs() / ulp32(want as f32);
        worst = worst.max(err);
        assert!(
            err <= 4.0,
            "sigmoid({x:e}) = {sigmoid:e}, want {want:e} ({err:.2} ulp)"
        );
    }
    eprintln!("sigmoid through the addend exp: worst {worst:.2} ulp");
}

/// A body that chains transcendental calls runs as consecutive vector loops, one per level
/// of calls, handing values on through stack arrays. Stores, row, column and full reductions
/// (which read a carried value and a reloaded input in the last loop; the three reduction
/// strategies) come out exactly as
/// the values the loops stored imply, with NaN and ±Inf inputs, over threaded sizes whose
/// rows are not a multiple of the chunk.
#[test]
fn chained_transcendentals_run_as_consecutive_loops_with_the_same_results() {
    let f = Prec::F32;
    let lstm = emit_kernel(&lstm_tail_ir(), "k");
    assert_eq!(lstm.matches("#pragma omp simd").count(), 2, "{lstm}");
    assert!(lstm.contains("__attribute__((aligned(64)))"), "{lstm}");
    let (n, m) = (37, 3001);
    let mut rng = Rng(11);
    let mut x = rng.f32s(n * m, -6.0, 6.0);
    for (e, special) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 200.0, -200.0]
        .into_iter()
        .enumerate()
    {
        x[e * 977 + 5] = special;
    }
    for reduced in [vec![false, true], vec![true, false], vec![true, true]] {
        // e = exp(x / 2); t = tanh(e - 2); stores e and t; sum of t * x and max of e.
        let mut b = Body::default();
        let xv = b.load(0);
        let half = b.c(0.5, f);
        let two = b.c(2.0, f);
        let xh = b.bin(BinOp::Mul, xv, half, f);
        let e = b.call(Func::Exp, &[xh], f);
        let em = b.bin(BinOp::Sub, e, two, f);
        let t = b.call(Func::Tanh, &[em], f);
        let tx = b.bin(BinOp::Mul, t, xv, f);
        let ir = KernelIr {
            rank: 2,
            row_arithmetic: RowArithmetic::default(),
            loads: vec![view(DType::F32, &[S, U])],
            body: b.0,
            stores: vec![store(e, DType::F32, &[S, U]), store(t, DType::F32, &[S, U])],
            reductions: vec![
                reduction(ReduceKind::Sum, tx, &reduced, DType::F64),
                reduction(ReduceKind::Max, e, &reduced, DType::F32),
            ],
        };
        let text = emit_kernel(&ir, "k");
        assert!(
            text.contains(&format!("c{e}[j] = v{e};")),
            "e is not carried:\n{text}"
        );
        let k = compile(&ir);
        let (kept, out_strides): (usize, [i64; 2]) = match (reduced[0], reduced[1]) {
            (false, true) => (n, [1, 0]),
            (true, false) => (m, [0, 1]),
            _ => (1, [0, 0]),
        };
        let mut args = vec![
            arg(Buf::F32(x.clone()), &[m as i64, 1], 0),
            arg(Buf::F32(vec![0.0; n * m]), &[m as i64, 1], 0),
            arg(Buf::F32(vec![0.0; n * m]), &[m as i64, 1], 0),
            arg(Buf::F64(vec![9.0; kept]), &out_strides, 0),
            arg(Buf::F32(vec![9.0; kept]), &out_strides, 0),
        ];
        run(&k, &[n as i64, m as i64], &mut args);
        let (es, ts) = (args[1].buf.f32(), args[2].buf.f32());
        for i in 0..n * m {
            let want_e = (x[i] as f64 * 0.5).exp();
            let want_t = ((es[i] - 2.0) as f64).tanh();
            assert!(
                same32(es[i], want_e as f32)
                    || (es[i] as f64 - want_e).abs() <= 1.1 * ulp32(want_e as f32),
                "e[{i}] = {}, want {want_e:e}",
                es[i]
            );
            assert!(
                same32(ts[i], want_t as f32)
                    || (ts[i] as f64 - want_t).abs() <= 3.0 * ulp32(want_t as f32),
                "t[{i}] = {}, want {want_t:e}",
                ts[i]
            );
        }
        for o in 0..kept {
            let members: Vec<usize> = match (reduced[0], reduced[1]) {
                (false, true) => (o * m..(o + 1) * m).collect(),
                (true, false) => (0..n).map(|r| r * m + o).collect(),
                _ => (0..n * m).collect(),
            };
            let sum = fold(
                members.iter().map(|&i| (ts[i] * x[i]) as f64),
                ReduceKind::Sum,
            );
            let max = fold(members.iter().map(|&i| es[i] as f64), ReduceKind::Max);
            let what = format!("{reduced:?} [{o}]");
            check_reduced(
                args[3].buf.f64()[o],
                sum,
                DType::F64,
                ReduceKind::Sum,
                &what,
            );
            check_reduced(
                args[4].buf.f32()[o] as f64,
                max,
                DType::F32,
                ReduceKind::Max,
                &what,
            );
        }
    }
}

/// f32 tanh (expm1 through the inline exp's pieces, then one division) within 2.6 ulp of tanh
/// in f64 on every 61st float (70 million values covering every exponent; the worst case over
/// every positive float is 2.57 ulp), with NaN, ±Inf and ±0 exact.
#[test]
fn f32_tanh_is_within_a_few_ulp_on_a_dense_sample_of_all_floats() {
    let k = compile(&unary_kernel(DType::F32, |b, x| {
        vec![(b.call(Func::Tanh, &[x], Prec::F32), DType::F32)]
    }));
    let mut inputs: Vec<f32> = (0..=u32::MAX / 61)
        .map(|i| f32::from_bits(i * 61))
        .collect();
    inputs.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.75,
        -0.75,
        9.5,
        1e-40,
    ]);
    let n = inputs.len();
    let mut args = vec![
        arg(Buf::F32(inputs.clone()), &[1], 0),
        arg(Buf::F32(vec![0.0; n]), &[1], 0),
    ];
    run(&k, &[n as i64], &mut args);
    let mut worst = 0.0f64;
    for (&x, &y) in inputs.iter().zip(args[1].buf.f32()) {
        let want = (x as f64).tanh();
        if x.is_nan() {
            assert!(y.is_nan(), "tanh(NaN) = {y}");
            continue;
        }
        assert_eq!(
            y.is_sign_negative(),
            x.is_sign_negative(),
            "sign of tanh({x:e}) = {y:e}"
        );
        let err = (y as f64 - want).abs() / ulp32(want as f32);
        worst = worst.max(err);
        assert!(
            err <= 2.6,
            "tanh({x:e}) = {y:e}, want {want:e} ({err:.2} ulp)"
        );
    }
    eprintln!("f32 tanh: worst error {worst:.2} ulp over {n} values");
}

/// Not a test: the LSTM tail at 1024×4096 f32, the README's benchmark size. Run with
/// `cargo test --release --test cpu_emit -- --ignored --nocapture lstm_tail_timing`.
#[test]
#[ignore]
fn lstm_tail_timing() {
    let (n, m) = (1024, 4096);
    let mut rng = Rng(2);
    let inputs: [Vec<f32>; 5] = std::array::from_fn(|_| rng.f32s(n * m, -4.0, 4.0));
    let k = compile(&lstm_tail_ir());
    let rm = [m as i64, 1];
    let mut args: Vec<Arg> = inputs
        .iter()
        .map(|v| arg(Buf::F32(v.clone()), &rm, 0))
        .collect();
    args.push(arg(Buf::F32(vec![0.0; n * m]), &rm, 0));
    args.push(arg(Buf::F32(vec![0.0; n * m]), &rm, 0));
    let sizes = [n as i64, m as i64];
    run(&k, &sizes, &mut args);
    let mut times = Vec::new();
    for _ in 0..30 {
        let start = std::time::Instant::now();
        run(&k, &sizes, &mut args);
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let bytes = 7.0 * (n * m * 4) as f64;
    println!(
        "lstm tail {n}x{m} f32: median {:.2} ms, min {:.2} ms ({:.1} GB/s at the median)",
        times[times.len() / 2],
        times[0],
        bytes / times[times.len() / 2] / 1e6
    );
    let e = 12345;
    let (want_cy, _) = lstm_reference(
        inputs[0][e],
        inputs[1][e],
        inputs[2][e],
        inputs[3][e],
        inputs[4][e],
    );
    assert!((args[5].buf.f32()[e] as f64 - want_cy).abs() <= 1e-6 * (1.0 + want_cy.abs()));
}

// ---------------------------------------------------------------------------------------------
// Layouts: broadcasting, transposes, offsets, stores smaller than the domain.

#[test]
fn column_broadcast_plus_row_broadcast() {
    let (n, m) = (257, 3001);
    let f = Prec::F32;
    let mut b = Body::default();
    let col = b.load(0);
    let row = b.load(1);
    let sum = b.bin(BinOp::Add, col, row, f);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &[S, B]), view(DType::F32, &[B, U])],
        body: b.0,
        stores: vec![store(sum, DType::F32, &[S, U])],
        reductions: vec![],
    };
    let mut rng = Rng(3);
    let a = rng.f32s(n, -10.0, 10.0);
    let r = rng.f32s(m, -10.0, 10.0);
    let k = compile(&ir);
    let mut args = vec![
        arg(Buf::F32(a.clone()), &[1, 0], 0),
        arg(Buf::F32(r.clone()), &[0, 1], 0),
        arg(Buf::F32(vec![0.0; n * m]), &[m as i64, 1], 0),
    ];
    run(&k, &[n as i64, m as i64], &mut args);
    let want: Vec<f32> = (0..n * m).map(|e| a[e / m] + r[e % m]).collect();
    assert_same32(args[2].buf.f32(), &want, "a[:,None] + r[None,:]");
}

#[test]
fn transposed_load_and_strided_stores_with_offsets() {
    // Domain [rows, cols]; input is stored [cols, rows] (a transpose: both axes strided, the
    // inner one by `rows`); one output is row-major with padded rows at an offset, the other
    // transposed again.
    let (rows, cols) = (300, 700);
    let f = Prec::F32;
    let mut b = Body::default();
    let x = b.load(0);
    let two = b.c(2.0, f);
    let one = b.c(1.0, f);
    let x2 = b.bin(BinOp::Mul, x, two, f);
    let y = b.bin(BinOp::Sub, x2, one, f);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &[S, S])],
        body: b.0,
        stores: vec![
            store(y, DType::F32, &[S, U]),
            store(x2, DType::F32, &[S, S]),
        ],
        reductions: vec![],
    };
    let mut rng = Rng(4);
    let t = rng.f32s(rows * cols, -100.0, 100.0); // t[c * rows + r]
    let pitch = cols + 3;
    let offset = 5;
    let sentinel = -12345.0f32;
    let k = compile(&ir);
    let mut args = vec![
        arg(Buf::F32(t.clone()), &[1, rows as i64], 0),
        arg(
            Buf::F32(vec![sentinel; offset + rows * pitch]),
            &[pitch as i64, 1],
            offset as i64,
        ),
        arg(Buf::F32(vec![sentinel; rows * cols]), &[1, rows as i64], 0),
    ];
    run(&k, &[rows as i64, cols as i64], &mut args);
    let out = args[1].buf.f32();
    for (e, &got) in out.iter().enumerate() {
        let in_view = e >= offset && (e - offset) % pitch < cols;
        let want = if in_view {
            let (r, c) = ((e - offset) / pitch, (e - offset) % pitch);
            t[c * rows + r] * 2.0 - 1.0
        } else {
            sentinel
        };
        assert!(
            same32(got, want),
            "padded output [{e}]: got {got}, want {want}"
        );
    }
    let back: Vec<f32> = t.iter().map(|&v| v * 2.0).collect();
    assert_same32(args[2].buf.f32(), &back, "transposed output");
}

#[test]
fn stores_broadcast_along_an_axis_are_written_once_from_index_zero() {
    // Domain [n, m]: a full store, a row store [1, m] (outer axis broadcast), a column store
    // [n, 1] (inner axis broadcast), and a row store with a strided inner axis.
    let (n, m) = (200, 3000);
    let f = Prec::F32;
    let mut b = Body::default();
    let a = b.load(0);
    let r = b.load(1);
    let c = b.load(2);
    let ar = b.bin(BinOp::Add, a, r, f);
    let full = b.bin(BinOp::Add, ar, c, f);
    let two = b.c(2.0, f);
    let three = b.c(3.0, f);
    let row = b.bin(BinOp::Mul, r, two, f);
    let col = b.bin(BinOp::Mul, c, three, f);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![
            view(DType::F32, &[S, U]),
            view(DType::F32, &[B, U]),
            view(DType::F32, &[S, B]),
        ],
        body: b.0,
        stores: vec![
            store(full, DType::F32, &[S, U]),
            store(row, DType::F32, &[B, U]),
            store(col, DType::F32, &[S, B]),
            store(row, DType::F32, &[B, S]),
        ],
        reductions: vec![],
    };
    let mut rng = Rng(5);
    let av = rng.f32s(n * m, -1.0, 1.0);
    let rv = rng.f32s(m, -1.0, 1.0);
    let cv = rng.f32s(n, -1.0, 1.0);
    let sentinel = 777.0f32;
    let k = compile(&ir);
    let mut args = vec![
        arg(Buf::F32(av.clone()), &[m as i64, 1], 0),
        arg(Buf::F32(rv.clone()), &[0, 1], 0),
        arg(Buf::F32(cv.clone()), &[1, 0], 0),
        arg(Buf::F32(vec![sentinel; n * m]), &[m as i64, 1], 0),
        arg(Buf::F32(vec![sentinel; m + 1]), &[0, 1], 1),
        arg(Buf::F32(vec![sentinel; n + 1]), &[1, 0], 0),
        arg(Buf::F32(vec![sentinel; 2 * m]), &[0, 2], 0),
    ];
    run(&k, &[n as i64, m as i64], &mut args);
    let want_full: Vec<f32> = (0..n * m).map(|e| av[e] + rv[e % m] + cv[e / m]).collect();
    assert_same32(args[3].buf.f32(), &want_full, "full store");
    let mut want_row = vec![sentinel];
    want_row.extend(rv.iter().map(|v| v * 2.0));
    assert_same32(args[4].buf.f32(), &want_row, "row store");
    let mut want_col: Vec<f32> = cv.iter().map(|v| v * 3.0).collect();
    want_col.push(sentinel);
    assert_same32(args[5].buf.f32(), &want_col, "column store");
    let want_strided: Vec<f32> = (0..2 * m)
        .map(|e| {
            if e % 2 == 0 {
                rv[e / 2] * 2.0
            } else {
                sentinel
            }
        })
        .collect();
    assert_same32(args[6].buf.f32(), &want_strided, "strided row store");
}

#[test]
fn empty_domains_write_nothing() {
    let mut b = Body::default();
    let x = b.load(0);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &[S, U])],
        body: b.0,
        stores: vec![store(x, DType::F32, &[S, U])],
        reductions: vec![],
    };
    let k = compile(&ir);
    for sizes in [[0i64, 7], [7, 0], [0, 0]] {
        let mut args = vec![
            arg(Buf::F32(vec![1.0; 8]), &[7, 1], 0),
            arg(Buf::F32(vec![-1.0; 8]), &[7, 1], 0),
        ];
        run(&k, &sizes, &mut args);
        assert_eq!(args[1].buf.f32(), &[-1.0; 8], "{sizes:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Conversions and rounding.

/// A rank-1 kernel: load one `src` view, apply `f` to build the stores.
fn unary_kernel(
    src: DType,
    f: impl FnOnce(&mut Body, ValueId) -> Vec<(ValueId, DType)>,
) -> KernelIr {
    let mut b = Body::default();
    let x = b.load(0);
    let outs = f(&mut b, x);
    KernelIr {
        rank: 1,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(src, &[U])],
        body: b.0,
        stores: outs.into_iter().map(|(v, d)| store(v, d, &[U])).collect(),
        reductions: vec![],
    }
}

fn half_out(n: usize) -> Arg {
    arg(Buf::Half(vec![0x5555; n]), &[1], 0)
}

#[test]
fn f16_loads_and_stores_round_exactly_over_every_bit_pattern() {
    // Every f16 value: widened exactly, stored back unchanged, and `x * 3` rounded once more
    // to f16 (overflowing to inf above 65504 / 3).
    let k = compile(&unary_kernel(DType::F16, |b, x| {
        let same = b.round(x, DType::F16);
        let three = b.c(3.0, Prec::F32);
        let p = b.bin(BinOp::Mul, x, three, Prec::F32);
        let p16 = b.round(p, DType::F16);
        vec![(x, DType::F32), (same, DType::F16), (p16, DType::F16)]
    }));
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let n = all.len();
    let mut args = vec![
        arg(Buf::Half(all.clone()), &[1], 0),
        arg(Buf::F32(vec![0.0; n]), &[1], 0),
        half_out(n),
        half_out(n),
    ];
    run(&k, &[n as i64], &mut args);
    for (i, &bits) in all.iter().enumerate() {
        let h = f16::from_bits(bits);
        let wide = args[1].buf.f32()[i];
        assert!(same32(wide, h.to_f32()), "widen {bits:#06x}: {wide}");
        let same = args[2].buf.half()[i];
        if h.is_nan() {
            assert!(
                f16::from_bits(same).is_nan(),
                "NaN {bits:#06x} -> {same:#06x}"
            );
        } else {
            assert_eq!(same, bits, "round trip of {bits:#06x}");
        }
        let want = f16::from_f32(h.to_f32() * 3.0);
        let got = f16::from_bits(args[3].buf.half()[i]);
        assert!(
            (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits(),
            "3 * {h} = {got}, want {want}"
        );
    }
    let got = |x: f32| f16::from_bits(args[3].buf.half()[f16::from_f32(x).to_bits() as usize]);
    assert_eq!(got(30000.0), f16::INFINITY, "overflow to inf");
    assert_eq!(got(-30000.0), f16::NEG_INFINITY);
}

/// f32 test values: a sweep through the bit patterns plus the edges of f16 and bf16.
fn f32_patterns() -> Vec<f32> {
    let mut v: Vec<f32> = (0..(1u64 << 32))
        .step_by(1021)
        .map(|b| f32::from_bits(b as u32))
        .collect();
    let p = |e: i32| 2f32.powi(e);
    v.extend([
        65504.0,
        65519.99,
        65520.0,
        65536.0,
        1.0 + p(-11),                // f16 tie: to even (1.0)
        1.0 + 3.0 * p(-11),          // f16 tie: to even (1 + 2^-9)
        p(-24),                      // smallest f16 subnormal
        p(-25),                      // tie between 0 and it: to 0
        3.0 * p(-26),                // above the tie: up
        p(-14) - p(-25),             // just below the smallest normal
        f32::from_bits(0x3f80_8000), // bf16 tie: to even (down)
        f32::from_bits(0x3f81_8000), // bf16 tie: to even (up)
        f32::from_bits(0x3f80_8001),
        f32::from_bits(0x7f7f_ffff), // f32 max: bf16 inf
        f32::from_bits(0x7f7f_7fff),
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ]);
    let negated: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(negated);
    v
}

#[test]
fn f32_rounds_to_f16_and_bf16_to_nearest_even() {
    let k = compile(&unary_kernel(DType::F32, |b, x| {
        let h = b.round(x, DType::F16);
        let bf = b.round(x, DType::BF16);
        vec![(h, DType::F16), (bf, DType::BF16)]
    }));
    let values = f32_patterns();
    let n = values.len();
    let mut args = vec![
        arg(Buf::F32(values.clone()), &[1], 0),
        half_out(n),
        half_out(n),
    ];
    run(&k, &[n as i64], &mut args);
    for (i, &x) in values.iter().enumerate() {
        let (h, bf) = (args[1].buf.half()[i], args[2].buf.half()[i]);
        let (wh, wb) = (f16::from_f32(x), bf16::from_f32(x));
        if x.is_nan() {
            assert!(
                f16::from_bits(h).is_nan() && bf16::from_bits(bf).is_nan(),
                "{x}"
            );
        } else {
            assert_eq!(h, wh.to_bits(), "f16 of {x:e} ({:#010x})", x.to_bits());
            assert_eq!(bf, wb.to_bits(), "bf16 of {x:e} ({:#010x})", x.to_bits());
        }
    }
    let find = |bits: u32| values.iter().position(|x| x.to_bits() == bits).unwrap();
    assert_eq!(args[2].buf.half()[find(0x3f80_8000)], 0x3f80);
    assert_eq!(args[2].buf.half()[find(0x3f81_8000)], 0x3f82);
    assert_eq!(args[2].buf.half()[find(0x7f7f_ffff)], 0x7f80);
    assert_eq!(args[1].buf.half()[find(65520f32.to_bits())], 0x7c00);
    assert_eq!(args[1].buf.half()[find(2f32.powi(-25).to_bits())], 0);
}

/// f64 values for rounding tests: random magnitudes over the whole range, and the cases
/// where rounding twice would differ from rounding once.
fn f64_values() -> Vec<f64> {
    let mut rng = Rng(6);
    let p = |e: i32| 2f64.powi(e);
    let mut v: Vec<f64> = (0..200_000)
        .map(|_| {
            let mantissa = rng.uniform(1.0, 2.0);
            let exponent = rng.uniform(-160.0, 160.0) as i32;
            let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            sign * mantissa * p(exponent)
        })
        .collect();
    // Near f16 and bf16 midpoints, where only the bits beyond f32's precision decide.
    for _ in 0..20_000 {
        let base = rng.uniform(1.0, 2.0);
        let h = (base * 1024.0).floor() / 1024.0 + p(-11);
        let bf = (base * 128.0).floor() / 128.0 + p(-8);
        let tiny = p(-(rng.uniform(25.0, 52.0) as i32));
        v.extend([h + tiny, h - tiny, h, bf + tiny, bf - tiny, bf]);
    }
    v.extend([
        1.0 + p(-11) + p(-40),
        -(1.0 + p(-11) + p(-24)),
        1.0 + p(-8) + p(-23),
        1.0 + p(-8) + p(-50),
        65519.99,
        65520.0,
        1e300,
        -1e300,
        1e-300,
        -1e-300,
        5e-324,
        f64::MAX,
        3.4028235677973366e38, // just above f32::MAX: rounds to f32::MAX, not inf
        3.4028235677973367e38,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
    ]);
    v
}

#[test]
fn f64_rounds_once_to_f32_f16_and_bf16() {
    let k = compile(&unary_kernel(DType::F64, |b, x| {
        let h = b.round(x, DType::F16);
        let bf = b.round(x, DType::BF16);
        let s = b.round(x, DType::F32);
        vec![(h, DType::F16), (bf, DType::BF16), (s, DType::F32)]
    }));
    let values = f64_values();
    let n = values.len();
    let mut args = vec![
        arg(Buf::F64(values.clone()), &[1], 0),
        half_out(n),
        half_out(n),
        arg(Buf::F32(vec![0.0; n]), &[1], 0),
    ];
    run(&k, &[n as i64], &mut args);
    for (i, &v) in values.iter().enumerate() {
        let h = f16::from_bits(args[1].buf.half()[i]).to_f64();
        let bf = bf16::from_bits(args[2].buf.half()[i]).to_f64();
        let s = args[3].buf.f32()[i] as f64;
        assert!(same64(h, DType::F16.round(v)), "f16 of {v:e}: {h:e}");
        assert!(same64(bf, DType::BF16.round(v)), "bf16 of {v:e}: {bf:e}");
        assert!(same64(s, DType::F32.round(v)), "f32 of {v:e}: {s:e}");
    }
}

#[test]
fn integers_truncate_and_saturate_and_bool_is_nonzero() {
    let values = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e12,
        -1e12,
        -2.7,
        2.7,
        -0.5,
        0.5,
        -0.0,
        0.0,
        2147483647.5,
        2147483648.0,
        -2147483648.9,
        -2147483649.0,
        9.3e18,
        -9.3e18,
        9223372036854775807.0,
        1e300,
        123456789.75,
        4503599627370495.5,
        -4503599627370495.5,
        8388607.5,
        -8388607.5,
        -0.3,
        -1.0,
        1.0,
    ];
    // From doubles, and from floats (the f32-held path widens first).
    let k64 = compile(&unary_kernel(DType::F64, |b, x| {
        let i = b.round(x, DType::I32);
        let l = b.round(x, DType::I64);
        let t = b.round(x, DType::Bool);
        vec![(i, DType::I32), (l, DType::I64), (t, DType::Bool)]
    }));
    let k32 = compile(&unary_kernel(DType::F32, |b, x| {
        let i = b.round(x, DType::I32);
        let l = b.round(x, DType::I64);
        let t = b.round(x, DType::Bool);
        vec![(i, DType::I32), (l, DType::I64), (t, DType::Bool)]
    }));
    for (k, input) in [
        (&k64, Buf::F64(values.clone())),
        (&k32, Buf::F32(values.iter().map(|&v| v as f32).collect())),
    ] {
        let exact: Vec<f64> = match &input {
            Buf::F64(v) => v.clone(),
            Buf::F32(v) => v.iter().map(|&x| x as f64).collect(),
            _ => unreachable!(),
        };
        let n = exact.len();
        let mut args = vec![
            arg(input, &[1], 0),
            arg(Buf::I32(vec![7; n]), &[1], 0),
            arg(Buf::I64(vec![7; n]), &[1], 0),
            arg(Buf::Bool(vec![7; n]), &[1], 0),
        ];
        run(k, &[n as i64], &mut args);
        for (i, &v) in exact.iter().enumerate() {
            assert_eq!(
                args[1].buf.i32()[i],
                DType::I32.round(v) as i32,
                "i32 of {v:e}"
            );
            assert_eq!(
                args[2].buf.i64()[i],
                DType::I64.round(v) as i64,
                "i64 of {v:e}"
            );
            assert_eq!(
                args[3].buf.bool()[i],
                DType::Bool.round(v) as u8,
                "bool of {v:e}"
            );
        }
    }
    // Spot checks of the rules themselves.
    let k = compile(&unary_kernel(DType::F64, |b, x| {
        let i = b.round(x, DType::I32);
        let f = b.round(i, DType::F64);
        vec![(f, DType::F64)]
    }));
    let mut args = vec![
        arg(Buf::F64(vec![-0.5, f64::NAN, 1e12, -2.7]), &[1], 0),
        arg(Buf::F64(vec![9.0; 4]), &[1], 0),
    ];
    run(&k, &[4], &mut args);
    let got = args[1].buf.f64();
    assert_eq!(got[0].to_bits(), 0.0f64.to_bits(), "-0.5 truncates to +0");
    assert_eq!(&got[1..], &[0.0, 2147483647.0, -2.0]);
}

#[test]
fn integer_and_bool_loads_are_exact() {
    let mut b = Body::default();
    let i = b.load(0);
    let l = b.load(1);
    let t = b.load(2);
    // Integers load at `Prec::I64`, exactly, and add with wrap-around.
    let il = b.bin(BinOp::Add, i, l, Prec::I64);
    let ir = KernelIr {
        rank: 1,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![
            view(DType::I32, &[U]),
            view(DType::I64, &[U]),
            view(DType::Bool, &[U]),
        ],
        body: b.0,
        stores: vec![
            store(il, DType::I64, &[U]),
            store(l, DType::I64, &[U]),
            store(t, DType::F64, &[U]),
        ],
        reductions: vec![],
    };
    let ints = vec![i32::MIN, -1, 0, 1, i32::MAX];
    let longs = vec![i64::MIN, -(1 << 53) - 1, 0, (1 << 53) + 1, i64::MAX];
    let bools = vec![0u8, 1, 0, 1, 1];
    let k = compile(&ir);
    let mut args = vec![
        arg(Buf::I32(ints.clone()), &[1], 0),
        arg(Buf::I64(longs.clone()), &[1], 0),
        arg(Buf::Bool(bools.clone()), &[1], 0),
        arg(Buf::I64(vec![0; 5]), &[1], 0),
        arg(Buf::I64(vec![0; 5]), &[1], 0),
        arg(Buf::F64(vec![0.0; 5]), &[1], 0),
    ];
    run(&k, &[5], &mut args);
    for e in 0..5 {
        assert_eq!(
            args[3].buf.i64()[e],
            i64::from(ints[e]).wrapping_add(longs[e])
        );
        assert_eq!(args[4].buf.i64()[e], longs[e]);
        assert_eq!(args[5].buf.f64()[e], bools[e] as f64);
    }
}

#[test]
fn i64_stores_saturate_at_the_top() {
    // A rounded i64 held as a double can be 2^63, one past i64::MAX.
    let k = compile(&unary_kernel(DType::F64, |b, x| {
        let l = b.round(x, DType::I64);
        vec![(l, DType::I64)]
    }));
    let mut args = vec![
        arg(
            Buf::F64(vec![1e300, -1e300, 2f64.powi(63), -(2f64.powi(63))]),
            &[1],
            0,
        ),
        arg(Buf::I64(vec![0; 4]), &[1], 0),
    ];
    run(&k, &[4], &mut args);
    assert_eq!(args[1].buf.i64(), &[i64::MAX, i64::MIN, i64::MAX, i64::MIN]);
}

#[test]
fn constants_round_trip_bit_for_bit() {
    let f32s = [
        -0.0f32,
        0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.1,
        f32::from_bits(1),
        f32::MAX,
        f32::MIN_POSITIVE,
        1.0 / 3.0,
        -16777215.0,
    ];
    let f64s = [
        -0.0f64,
        0.1,
        1e300,
        5e-324,
        f64::MAX,
        f64::NAN,
        f64::NEG_INFINITY,
        1.0 / 3.0,
        -2.2250738585072014e-308,
    ];
    let mut b = Body::default();
    let mut stores = Vec::new();
    for &v in &f32s {
        let c = b.c(v as f64, Prec::F32);
        stores.push(store(c, DType::F32, &[U]));
    }
    for &v in &f64s {
        let c = b.c(v, Prec::F64);
        stores.push(store(c, DType::F64, &[U]));
    }
    let ir = KernelIr {
        rank: 1,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![],
        body: b.0,
        stores,
        reductions: vec![],
    };
    let k = compile(&ir);
    let mut args: Vec<Arg> = f32s
        .iter()
        .map(|_| arg(Buf::F32(vec![9.0]), &[1], 0))
        .chain(f64s.iter().map(|_| arg(Buf::F64(vec![9.0]), &[1], 0)))
        .collect();
    run(&k, &[1], &mut args);
    for (i, &v) in f32s.iter().enumerate() {
        assert!(same32(args[i].buf.f32()[0], v), "f32 constant {v:e}");
    }
    for (i, &v) in f64s.iter().enumerate() {
        let got = args[f32s.len() + i].buf.f64()[0];
        assert!(same64(got, v), "f64 constant {v:e}: {got:e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Primitives.

/// PyTorch's minimum/maximum, written independently of the reference interpreter.
fn torch_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        if a.is_sign_negative() { a } else { b }
    } else {
        a.min(b)
    }
}

fn torch_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        if a.is_sign_positive() { a } else { b }
    } else {
        a.max(b)
    }
}

/// Builds one stored value (and its dtype) from two loaded values.
type BinaryStore = dyn Fn(&mut Body, ValueId, ValueId) -> (ValueId, DType);

/// A rank-1 kernel of two loads at `dtype` and one store per `(op, output dtype)`.
fn binary_kernel(dtype: DType, ops: &[&BinaryStore]) -> KernelIr {
    let mut b = Body::default();
    let x = b.load(0);
    let y = b.load(1);
    let stores = ops
        .iter()
        .map(|op| {
            let (v, d) = op(&mut b, x, y);
            store(v, d, &[U])
        })
        .collect();
    KernelIr {
        rank: 1,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(dtype, &[U]), view(dtype, &[U])],
        body: b.0,
        stores,
        reductions: vec![],
    }
}

fn pairs() -> (Vec<f64>, Vec<f64>) {
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        2.5,
    ];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &x in &specials {
        for &y in &specials {
            a.push(x);
            b.push(y);
        }
    }
    // Enough ordinary pairs that the vector loop, not only its tail, sees the specials.
    let mut rng = Rng(7);
    for _ in 0..1000 {
        a.push(rng.uniform(-3.0, 3.0).round());
        b.push(rng.uniform(-3.0, 3.0).round());
    }
    let (a2, b2) = (a.clone(), b.clone());
    a.extend(b2);
    b.extend(a2);
    (a, b)
}

#[test]
fn min_max_select_and_comparisons_follow_the_reference_semantics() {
    let (xs, ys) = pairs();
    let n = xs.len();
    for dtype in [DType::F32, DType::F64] {
        let p = Prec::of(dtype);
        let call = |func: Func| {
            move |b: &mut Body, x: ValueId, y: ValueId| (b.call(func, &[x, y], p), dtype)
        };
        let cmp =
            |op: BinOp| move |b: &mut Body, x: ValueId, y: ValueId| (b.bin(op, x, y, p), dtype);
        let select = move |b: &mut Body, x: ValueId, y: ValueId| {
            let c = b.bin(BinOp::Sub, x, y, p);
            (b.call(Func::Select, &[c, x, y], p), dtype)
        };
        let min = call(Func::Min);
        let max = call(Func::Max);
        let ops: Vec<BinOp> = vec![
            BinOp::Lt,
            BinOp::Le,
            BinOp::Gt,
            BinOp::Ge,
            BinOp::Eq,
            BinOp::Ne,
        ];
        let cmps: Vec<_> = ops.iter().map(|&op| cmp(op)).collect();
        let mut all: Vec<&BinaryStore> = vec![&min, &max, &select];
        for c in &cmps {
            all.push(c);
        }
        let k = compile(&binary_kernel(dtype, &all));
        let input = |v: &[f64]| match dtype {
            DType::F32 => Buf::F32(v.iter().map(|&x| x as f32).collect()),
            _ => Buf::F64(v.to_vec()),
        };
        let out = || match dtype {
            DType::F32 => Buf::F32(vec![9.0; n]),
            _ => Buf::F64(vec![9.0; n]),
        };
        let mut args = vec![arg(input(&xs), &[1], 0), arg(input(&ys), &[1], 0)];
        for _ in 0..all.len() {
            args.push(arg(out(), &[1], 0));
        }
        run(&k, &[n as i64], &mut args);
        let got = |s: usize, e: usize| match &args[2 + s].buf {
            Buf::F32(v) => v[e] as f64,
            Buf::F64(v) => v[e],
            _ => unreachable!(),
        };
        let truth = |b: bool| if b { 1.0 } else { 0.0 };
        for e in 0..n {
            let (x, y) = (xs[e], ys[e]);
            let d = x - y;
            let want = [
                torch_min(x, y),
                torch_max(x, y),
                if d != 0.0 { x } else { y },
                truth(x < y),
                truth(x <= y),
                truth(x > y),
                truth(x >= y),
                truth(x == y),
                truth(x != y),
            ];
            for (s, &w) in want.iter().enumerate() {
                assert!(
                    same64(got(s, e), w),
                    "{dtype} op {s} of ({x}, {y}): got {}, want {w}",
                    got(s, e)
                );
            }
        }
    }
}

#[test]
fn where_with_a_bool_condition_picks_without_leaking_nan() {
    // where(c, a, b) over [n, m] with c broadcast along columns: the bool loads as 0/1 held
    // as double, is rounded to f32 for the select, and a NaN in the branch not taken must not
    // leak.
    let (n, m) = (100, 1000);
    let f = Prec::F32;
    let mut b = Body::default();
    let c = b.load(0);
    let x = b.load(1);
    let y = b.load(2);
    let c32 = b.round(c, DType::F32);
    let w = b.call(Func::Select, &[c32, x, y], f);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![
            view(DType::Bool, &[S, B]),
            view(DType::F32, &[S, U]),
            view(DType::F32, &[S, U]),
        ],
        body: b.0,
        stores: vec![store(w, DType::F32, &[S, U])],
        reductions: vec![],
    };
    let mut rng = Rng(8);
    let cond: Vec<u8> = (0..n).map(|i| (i % 3 == 0) as u8).collect();
    let mut xs = rng.f32s(n * m, -1.0, 1.0);
    let mut ys = rng.f32s(n * m, -1.0, 1.0);
    for e in (0..n * m).step_by(7) {
        if cond[e / m] == 1 {
            ys[e] = f32::NAN;
        } else {
            xs[e] = f32::NAN;
        }
    }
    let k = compile(&ir);
    let mut args = vec![
        arg(Buf::Bool(cond.clone()), &[1, 0], 0),
        arg(Buf::F32(xs.clone()), &[m as i64, 1], 0),
        arg(Buf::F32(ys.clone()), &[m as i64, 1], 0),
        arg(Buf::F32(vec![0.0; n * m]), &[m as i64, 1], 0),
    ];
    run(&k, &[n as i64, m as i64], &mut args);
    let want: Vec<f32> = (0..n * m)
        .map(|e| if cond[e / m] != 0 { xs[e] } else { ys[e] })
        .collect();
    assert!(want.iter().all(|v| !v.is_nan()));
    assert_same32(args[3].buf.f32(), &want, "where");
}

/// Inputs for one function: a sweep over its interesting range plus IEEE specials.
fn function_inputs(func: Func) -> Vec<f64> {
    let (lo, hi) = match func {
        Func::Exp | Func::Expm1 => (-90.0, 90.0),
        Func::Log | Func::Sqrt | Func::Rsqrt => (0.0, 1e6),
        Func::Log1p => (-1.0, 1e6),
        Func::Tanh => (-12.0, 12.0),
        Func::Erf => (-5.0, 5.0),
        Func::Sin | Func::Cos => (-100.0, 100.0),
        _ => (-1e4, 1e4),
    };
    let mut rng = Rng(9);
    let mut v: Vec<f64> = (0..4000).map(|_| rng.uniform(lo, hi)).collect();
    v.extend(
        (0..1000).map(|_| rng.uniform(-1.0, 1.0) * 10f64.powi(-(rng.uniform(1.0, 30.0) as i32))),
    );
    v.extend([
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -1.5,
        2.5,
        1e-40,
        -2.0,
    ]);
    if func == Func::Floor {
        // Where the spelled-out floor changes method, in both precisions.
        for e in [23, 24, 52, 53] {
            let p = 2f64.powi(e);
            v.extend([
                p - 0.5,
                p - 1.0,
                p + 1.0,
                p + 2.0,
                -(p - 0.5),
                -(p + 2.0),
                -(p - 1.5),
            ]);
        }
        v.extend([-0.3, 0.999_999_9, -0.999_999_9, 1e20, -1e20, 3.0, -3.0]);
    }
    v
}

/// The reference value of a unary function in f64.
fn unary_reference(func: Func, x: f64) -> f64 {
    match func {
        Func::Exp => x.exp(),
        Func::Log => x.ln(),
        Func::Log1p => x.ln_1p(),
        Func::Expm1 => x.exp_m1(),
        Func::Sqrt => x.sqrt(),
        Func::Tanh => x.tanh(),
        Func::Erf => libm::erf(x),
        Func::Abs => x.abs(),
        Func::Floor => x.floor(),
        Func::Sin => x.sin(),
        Func::Cos => x.cos(),
        _ => unreachable!("{func:?} is not unary"),
    }
}

#[test]
fn math_functions_match_f64_references_within_a_few_ulps() {
    let unary = [
        Func::Exp,
        Func::Log,
        Func::Log1p,
        Func::Expm1,
        Func::Sqrt,
        Func::Rsqrt,
        Func::Tanh,
        Func::Erf,
        Func::Abs,
        Func::Floor,
        Func::Sin,
        Func::Cos,
    ];
    for dtype in [DType::F32, DType::F64] {
        let p = Prec::of(dtype);
        for func in unary {
            let k = compile(&unary_kernel(dtype, |b, x| {
                vec![(b.call(func, &[x], p), dtype)]
            }));
            let inputs = function_inputs(func);
            let n = inputs.len();
            let (input, output) = match dtype {
                DType::F32 => (
                    Buf::F32(inputs.iter().map(|&x| x as f32).collect()),
                    Buf::F32(vec![0.0; n]),
                ),
                _ => (Buf::F64(inputs.clone()), Buf::F64(vec![0.0; n])),
            };
            let mut args = vec![arg(input, &[1], 0), arg(output, &[1], 0)];
            run(&k, &[n as i64], &mut args);
            for e in 0..n {
                let check = |got: f64, x: f64, want: f64, ulp: f64| {
                    // Exact for what IEEE makes exact; libmvec's vector functions are within
                    // 4 ulps. Near zeros of sin and cos, where the result's own ulp is tiny,
                    // an absolute error of an ulp of 1 is allowed instead.
                    let exact = matches!(func, Func::Sqrt | Func::Abs | Func::Floor | Func::Rsqrt);
                    let tol = if exact { 0.0 } else { 4.0 * ulp };
                    let ok = same64(got, want) || (want.is_finite() && (got - want).abs() <= tol);
                    assert!(ok, "{dtype} {func:?}({x:e}) = {got:e}, want {want:e}");
                };
                match &args[1].buf {
                    Buf::F32(out) => {
                        let x = inputs[e] as f32 as f64;
                        let want = if func == Func::Rsqrt {
                            (1.0 / (x as f32).sqrt()) as f64
                        } else {
                            unary_reference(func, x) as f32 as f64
                        };
                        let ulp = if matches!(func, Func::Sin | Func::Cos) {
                            ulp32(want as f32).max(ulp32(1.0) / 2.0)
                        } else {
                            ulp32(want as f32)
                        };
                        check(out[e] as f64, x, want, ulp);
                    }
                    Buf::F64(out) => {
                        let x = inputs[e];
                        let want = if func == Func::Rsqrt {
                            1.0 / x.sqrt()
                        } else {
                            unary_reference(func, x)
                        };
                        let ulp = if matches!(func, Func::Sin | Func::Cos) {
                            ulp64(want).max(ulp64(1.0) / 2.0)
                        } else {
                            ulp64(want)
                        };
                        check(out[e], x, want, ulp);
                    }
                    _ => unreachable!(),
                }
            }
        }
        // pow(x, y), with the IEEE special cases.
        let k = compile(&binary_kernel(
            dtype,
            &[&move |b: &mut Body, x, y| (b.call(Func::Pow, &[x, y], p), dtype)],
        ));
        let mut rng = Rng(10);
        let mut xs: Vec<f64> = (0..3000).map(|_| rng.uniform(0.0, 50.0)).collect();
        let mut ys: Vec<f64> = (0..3000).map(|_| rng.uniform(-8.0, 8.0)).collect();
        for (x, y) in [
            (0.0, -1.0),
            (-0.0, -1.0),
            (-8.0, 1.0 / 3.0),
            (f64::NAN, 0.0),
            (1.0, f64::NAN),
            (-2.0, 3.0),
            (f64::INFINITY, -2.0),
            (2.0, f64::INFINITY),
            (-1.0, f64::INFINITY),
        ] {
            xs.push(x);
            ys.push(y);
        }
        let n = xs.len();
        let (a, b, out) = match dtype {
            DType::F32 => (
                Buf::F32(xs.iter().map(|&x| x as f32).collect()),
                Buf::F32(ys.iter().map(|&x| x as f32).collect()),
                Buf::F32(vec![0.0; n]),
            ),
            _ => (
                Buf::F64(xs.clone()),
                Buf::F64(ys.clone()),
                Buf::F64(vec![0.0; n]),
            ),
        };
        let mut args = vec![arg(a, &[1], 0), arg(b, &[1], 0), arg(out, &[1], 0)];
        run(&k, &[n as i64], &mut args);
        for e in 0..n {
            let (got, want, ulp) = match &args[2].buf {
                Buf::F32(out) => {
                    let w = (xs[e] as f32 as f64).powf(ys[e] as f32 as f64) as f32;
                    (out[e] as f64, w as f64, ulp32(w))
                }
                Buf::F64(out) => {
                    let w = xs[e].powf(ys[e]);
                    (out[e], w, ulp64(w))
                }
                _ => unreachable!(),
            };
            assert!(
                same64(got, want) || (want.is_finite() && (got - want).abs() <= 4.0 * ulp),
                "{dtype} pow({}, {}) = {got:e}, want {want:e}",
                xs[e],
                ys[e]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions.

/// Sum in f64 in index order; with `max`, NaN-propagating maximum from −∞.
fn fold(values: impl Iterator<Item = f64>, kind: ReduceKind) -> f64 {
    let mut count = 0usize;
    let mut acc = match kind {
        ReduceKind::Max => f64::NEG_INFINITY,
        _ => 0.0,
    };
    for v in values {
        count += 1;
        acc = match kind {
            ReduceKind::Max if acc.is_nan() || v.is_nan() => f64::NAN,
            ReduceKind::Max => acc.max(v),
            _ => acc + v,
        };
    }
    if kind == ReduceKind::Mean {
        acc / count as f64
    } else {
        acc
    }
}

/// Checks a reduction output against the exact f64 `want`, rounded to `dtype`: equal, or
/// (sums only, whose order differs) within one ulp of the output type.
fn check_reduced(got: f64, want: f64, dtype: DType, kind: ReduceKind, what: &str) {
    let rounded = dtype.round(want);
    if same64(got, rounded) {
        return;
    }
    let ulp = match dtype {
        DType::F32 => ulp32(rounded as f32),
        DType::F16 => f16::from_f64(rounded.abs()).to_f64() * 2f64.powi(-10),
        _ => ulp64(rounded) * 4.0,
    };
    assert!(
        kind != ReduceKind::Max && rounded.is_finite() && (got - rounded).abs() <= ulp,
        "{what}: got {got:e}, want {rounded:e} (exact {want:e})"
    );
}

/// A kernel reducing one f32 load over `[n0, .., nk]` with each `(kind, reduced, dtype)`.
fn reduce_kernel(rank: usize, reductions: &[(ReduceKind, Vec<bool>, DType)]) -> KernelIr {
    let mut b = Body::default();
    let x = b.load(0);
    let mut axes = vec![S; rank];
    axes[rank - 1] = U;
    KernelIr {
        rank,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &axes)],
        body: b.0,
        stores: vec![],
        reductions: reductions
            .iter()
            .map(|(kind, reduced, dtype)| reduction(*kind, x, reduced, *dtype))
            .collect(),
    }
}

fn out_buf(dtype: DType, n: usize) -> Buf {
    match dtype {
        DType::F32 => Buf::F32(vec![9.0; n]),
        DType::F64 => Buf::F64(vec![9.0; n]),
        DType::F16 | DType::BF16 => Buf::Half(vec![0x5555; n]),
        other => panic!("no test outputs of {other}"),
    }
}

fn read(buf: &Buf, dtype: DType, e: usize) -> f64 {
    match dtype {
        DType::F32 => buf.f32()[e] as f64,
        DType::F64 => buf.f64()[e],
        DType::F16 => f16::from_bits(buf.half()[e]).to_f64(),
        DType::BF16 => bf16::from_bits(buf.half()[e]).to_f64(),
        other => panic!("no test outputs of {other}"),
    }
}

/// Reduces a row-major f32 tensor of `shape` with each reduction and checks every output
/// (stored row-major over the kept axes) against [`fold`].
fn check_reductions(shape: &[usize], reductions: &[(ReduceKind, Vec<bool>, DType)], x: &[f32]) {
    let rank = shape.len();
    let k = compile(&reduce_kernel(rank, reductions));
    let row_major = |dims: &[usize]| -> Vec<i64> {
        let mut s = vec![1i64; dims.len()];
        for d in (0..dims.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * dims[d + 1] as i64;
        }
        s
    };
    let mut args = vec![arg(Buf::F32(x.to_vec()), &row_major(shape), 0)];
    for (_, reduced, dtype) in reductions {
        let kept: Vec<usize> = (0..rank)
            .map(|d| if reduced[d] { 1 } else { shape[d] })
            .collect();
        let mut strides = row_major(&kept);
        for d in 0..rank {
            if reduced[d] {
                strides[d] = 0;
            }
        }
        let numel: usize = kept.iter().product();
        args.push(arg(out_buf(*dtype, numel.max(1)), &strides, 0));
    }
    let sizes: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
    run(&k, &sizes, &mut args);
    let total: usize = shape.iter().product();
    for (r, (kind, reduced, dtype)) in reductions.iter().enumerate() {
        let kept: Vec<usize> = (0..rank)
            .map(|d| if reduced[d] { 1 } else { shape[d] })
            .collect();
        let numel: usize = kept.iter().product();
        for o in 0..numel {
            // Output coordinates, then every input element with those kept coordinates.
            let mut oc = vec![0; rank];
            let mut rem = o;
            for d in (0..rank).rev() {
                oc[d] = rem % kept[d];
                rem /= kept[d];
            }
            let members = (0..total).filter(|&e| {
                let mut rem = e;
                (0..rank).rev().all(|d| {
                    let c = rem % shape[d];
                    rem /= shape[d];
                    reduced[d] || c == oc[d]
                })
            });
            let want = fold(members.map(|e| x[e] as f64), *kind);
            let got = read(&args[1 + r].buf, *dtype, o);
            check_reduced(
                got,
                want,
                *dtype,
                *kind,
                &format!("{kind:?} {shape:?} {reduced:?} [{o}]"),
            );
        }
    }
}

/// Row-major reference reductions are quadratic in the naive form above; this is the fast
/// version for large 2-D cases: per row and per column sums/maxes in one pass.
fn check_2d(n: usize, m: usize, x: &[f32], reductions: &[(ReduceKind, Vec<bool>, DType)]) {
    let k = compile(&reduce_kernel(2, reductions));
    let mut args = vec![arg(Buf::F32(x.to_vec()), &[m as i64, 1], 0)];
    for (_, reduced, dtype) in reductions {
        let (len, strides) = match (reduced[0], reduced[1]) {
            (false, true) => (n, [1, 0]),
            (true, false) => (m, [0, 1]),
            (true, true) => (1, [0, 0]),
            (false, false) => (n * m, [m as i64, 1]),
        };
        args.push(arg(out_buf(*dtype, len), &strides, 0));
    }
    run(&k, &[n as i64, m as i64], &mut args);
    for (r, (kind, reduced, dtype)) in reductions.iter().enumerate() {
        let want: Vec<f64> = match (reduced[0], reduced[1]) {
            (false, true) => (0..n)
                .map(|i| fold((0..m).map(|j| x[i * m + j] as f64), *kind))
                .collect(),
            (true, false) => (0..m)
                .map(|j| fold((0..n).map(|i| x[i * m + j] as f64), *kind))
                .collect(),
            (true, true) => vec![fold(x.iter().map(|&v| v as f64), *kind)],
            (false, false) => x.iter().map(|&v| v as f64).collect(),
        };
        // Guard against a vacuous check (every output NaN or infinite).
        let finite = want.iter().filter(|w| w.is_finite()).count();
        assert!(
            finite * 2 > want.len(),
            "{kind:?} {reduced:?}: mostly non-finite"
        );
        for (o, &w) in want.iter().enumerate() {
            let got = read(&args[1 + r].buf, *dtype, o);
            check_reduced(
                got,
                w,
                *dtype,
                *kind,
                &format!("{kind:?} {reduced:?} [{o}] of [{n}, {m}]"),
            );
        }
    }
}

/// Puts a NaN at (7, 11) and +inf at (9, 5) of an `[_, m]` matrix, and fills row 8 (or,
/// with `column`, column 8) with -inf, so that one output of a max sees nothing but -inf
/// (the identity) while the other outputs stay finite.
fn with_specials(mut x: Vec<f32>, m: usize, column: bool) -> Vec<f32> {
    let n = x.len() / m;
    x[7 * m + 11] = f32::NAN;
    x[9 * m + 5] = f32::INFINITY;
    if column {
        (0..n).for_each(|i| x[i * m + 8] = f32::NEG_INFINITY);
    } else {
        (0..m).for_each(|j| x[8 * m + j] = f32::NEG_INFINITY);
    }
    x
}

#[test]
fn row_reductions_sum_mean_and_max_with_nan() {
    let (n, m) = (300, 5000);
    let x = with_specials(Rng(11).f32s(n * m, -1.0, 1.0), m, false);
    let row = vec![false, true];
    check_2d(
        n,
        m,
        &x,
        &[
            (ReduceKind::Sum, row.clone(), DType::F32),
            (ReduceKind::Mean, row.clone(), DType::F64),
            (ReduceKind::Max, row.clone(), DType::F32),
            (ReduceKind::Max, row, DType::F16),
        ],
    );
}

#[test]
fn column_reductions_sum_mean_and_max_with_nan() {
    let (n, m) = (300, 5000);
    let x = with_specials(Rng(12).f32s(n * m, -1.0, 1.0), m, true);
    let col = vec![true, false];
    check_2d(
        n,
        m,
        &x,
        &[
            (ReduceKind::Sum, col.clone(), DType::F32),
            (ReduceKind::Mean, col.clone(), DType::F16),
            (ReduceKind::Max, col, DType::F32),
        ],
    );
}

#[test]
fn reductions_of_narrow_columns_and_few_rows_use_all_threads() {
    // Few rows (not one per thread) and few columns (not one range per thread): the
    // per-thread partial buffers.
    let few_rows = Rng(13).f32s(4 * 100_000, -1.0, 1.0);
    check_2d(
        4,
        100_000,
        &few_rows,
        &[
            (ReduceKind::Sum, vec![false, true], DType::F32),
            (ReduceKind::Max, vec![false, true], DType::F32),
        ],
    );
    let narrow = with_specials(Rng(14).f32s(100_000 * 16, -1.0, 1.0), 16, true);
    check_2d(
        100_000,
        16,
        &narrow,
        &[
            (ReduceKind::Sum, vec![true, false], DType::F64),
            (ReduceKind::Max, vec![true, false], DType::F32),
            (ReduceKind::Mean, vec![true, false], DType::F32),
        ],
    );
}

#[test]
fn full_reductions_of_a_large_vector() {
    let n = 1_000_003;
    let mut x = Rng(15).f32s(n, -1.0, 1.0);
    let k = compile(&reduce_kernel(
        1,
        &[
            (ReduceKind::Sum, vec![true], DType::F64),
            (ReduceKind::Max, vec![true], DType::F32),
            (ReduceKind::Mean, vec![true], DType::F32),
        ],
    ));
    for nan_at in [None, Some(n - 1), Some(0)] {
        if let Some(at) = nan_at {
            x[at] = f32::NAN;
        }
        let mut args = vec![
            arg(Buf::F32(x.clone()), &[1], 0),
            arg(Buf::F64(vec![9.0]), &[0], 0),
            arg(Buf::F32(vec![9.0]), &[0], 0),
            arg(Buf::F32(vec![9.0]), &[0], 0),
        ];
        run(&k, &[n as i64], &mut args);
        let xs = || x.iter().map(|&v| v as f64);
        let what = format!("NaN at {nan_at:?}");
        check_reduced(
            args[1].buf.f64()[0],
            fold(xs(), ReduceKind::Sum),
            DType::F64,
            ReduceKind::Sum,
            &what,
        );
        check_reduced(
            args[2].buf.f32()[0] as f64,
            fold(xs(), ReduceKind::Max),
            DType::F32,
            ReduceKind::Max,
            &what,
        );
        check_reduced(
            args[3].buf.f32()[0] as f64,
            fold(xs(), ReduceKind::Mean),
            DType::F32,
            ReduceKind::Mean,
            &what,
        );
    }
}

#[test]
fn middle_and_mixed_axis_reductions_in_one_kernel() {
    // [40, 50, 60]: a mean over the middle axis, a max over the outer and inner axes, and a
    // sum over everything, all from one loop nest.
    let shape = [40, 50, 60];
    let x = Rng(16).f32s(shape.iter().product(), -2.0, 2.0);
    check_reductions(
        &shape,
        &[
            (ReduceKind::Mean, vec![false, true, false], DType::F32),
            (ReduceKind::Max, vec![true, false, true], DType::F64),
            (ReduceKind::Sum, vec![true, true, true], DType::F64),
        ],
        &x,
    );
    // A small one too (single-threaded), where the middle-axis mean runs the column path.
    let shape = [5, 6, 7];
    let x = Rng(17).f32s(shape.iter().product(), -2.0, 2.0);
    check_reductions(
        &shape,
        &[(ReduceKind::Mean, vec![false, true, false], DType::F32)],
        &x,
    );
}

#[test]
fn contiguous_axes_fold_into_the_inner_one_for_reductions() {
    // Reduced axes next to the reduced inner axis, and kept axes next to the kept inner axis,
    // fold at run time; a reduced axis next to a kept one must not.
    let shape = [6, 50, 40];
    let x = Rng(19).f32s(shape.iter().product(), -2.0, 2.0);
    check_reductions(
        &shape,
        &[
            (ReduceKind::Sum, vec![false, true, true], DType::F64),
            (ReduceKind::Max, vec![false, true, true], DType::F32),
        ],
        &x,
    );
    let shape = [20, 30, 40];
    let x = Rng(20).f32s(shape.iter().product(), -2.0, 2.0);
    check_reductions(
        &shape,
        &[(ReduceKind::Mean, vec![true, false, false], DType::F32)],
        &x,
    );
    check_reductions(
        &shape,
        &[
            (ReduceKind::Sum, vec![true, false, true], DType::F32),
            (ReduceKind::Max, vec![false, true, false], DType::F32),
        ],
        &x,
    );
}

#[test]
fn empty_reductions_give_identity_or_nan() {
    // Reducing an empty axis: sum 0, mean NaN (0/0), max -inf; reducing an axis of a
    // domain whose kept axis is empty writes nothing.
    for (shape, reduced) in [
        (vec![4usize, 0], vec![false, true]),
        (vec![0, 5], vec![true, false]),
        (vec![3, 0, 2], vec![false, true, false]),
    ] {
        let kinds = [
            (ReduceKind::Sum, reduced.clone(), DType::F32),
            (ReduceKind::Mean, reduced.clone(), DType::F32),
            (ReduceKind::Max, reduced.clone(), DType::F32),
            (ReduceKind::Max, reduced.clone(), DType::F16),
        ];
        check_reductions(&shape, &kinds, &[]);
        // And explicitly.
        let k = compile(&reduce_kernel(shape.len(), &kinds));
        let numel: usize = (0..shape.len())
            .filter(|&d| !reduced[d])
            .map(|d| shape[d])
            .product();
        let dense = |d: usize| -> i64 {
            ((d + 1)..shape.len())
                .filter(|&e| !reduced[e])
                .map(|e| shape[e] as i64)
                .product()
        };
        let strides: Vec<i64> = (0..shape.len())
            .map(|d| if reduced[d] { 0 } else { dense(d) })
            .collect();
        let mut args = vec![arg(Buf::F32(vec![]), &vec![0; shape.len()], 0)];
        for (_, _, dtype) in &kinds {
            args.push(arg(out_buf(*dtype, numel), &strides, 0));
        }
        let sizes: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
        run(&k, &sizes, &mut args);
        assert!(
            args[1].buf.f32().iter().all(|&v| v.to_bits() == 0),
            "{shape:?}"
        );
        assert!(args[2].buf.f32().iter().all(|v| v.is_nan()), "{shape:?}");
        assert!(args[3].buf.f32().iter().all(|&v| v == f32::NEG_INFINITY));
        assert!(args[4].buf.half().iter().all(|&v| v == 0xfc00), "f16 -inf");
    }
}

#[test]
fn reductions_alongside_stores_and_rounded_values() {
    // A softmax-like kernel body: y = exp(x - 1) stored as bf16, its row sums as f32 and
    // its row max of x as f16, over a large domain.
    let (n, m) = (64, 20_000);
    let f = Prec::F32;
    let mut b = Body::default();
    let x = b.load(0);
    let one = b.c(1.0, f);
    let d = b.bin(BinOp::Sub, x, one, f);
    let e = b.call(Func::Exp, &[d], f);
    let e16 = b.round(e, DType::BF16);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &[S, U])],
        body: b.0,
        stores: vec![store(e16, DType::BF16, &[S, U])],
        reductions: vec![
            reduction(ReduceKind::Sum, e16, &[false, true], DType::F32),
            reduction(ReduceKind::Max, x, &[false, true], DType::F16),
        ],
    };
    let xs = Rng(18).f32s(n * m, -3.0, 3.0);
    let k = compile(&ir);
    let mut args = vec![
        arg(Buf::F32(xs.clone()), &[m as i64, 1], 0),
        arg(Buf::Half(vec![0; n * m]), &[m as i64, 1], 0),
        arg(Buf::F32(vec![0.0; n]), &[1, 0], 0),
        arg(Buf::Half(vec![0; n]), &[1, 0], 0),
    ];
    run(&k, &[n as i64, m as i64], &mut args);
    let stored: Vec<f64> = args[1]
        .buf
        .half()
        .iter()
        .map(|&h| bf16::from_bits(h).to_f64())
        .collect();
    for (e, &got) in stored.iter().enumerate() {
        let want = ((xs[e] as f64) - 1.0).exp();
        // exp within 4 ulps of f32, then one bf16 rounding.
        assert!(
            (got - want).abs() <= want * (2f64.powi(-8) + 1e-6),
            "exp [{e}]: {got} vs {want}"
        );
    }
    for i in 0..n {
        // The sum is of exactly the stored bf16 values.
        let want_sum = fold(stored[i * m..(i + 1) * m].iter().copied(), ReduceKind::Sum);
        check_reduced(
            args[2].buf.f32()[i] as f64,
            want_sum,
            DType::F32,
            ReduceKind::Sum,
            "row sum",
        );
        let want_max = fold(
            xs[i * m..(i + 1) * m].iter().map(|&v| v as f64),
            ReduceKind::Max,
        );
        check_reduced(
            read(&args[3].buf, DType::F16, i),
            want_max,
            DType::F16,
            ReduceKind::Max,
            "row max",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The text itself.

#[test]
fn emission_is_deterministic_and_names_follow_the_body() {
    let lstm = lstm_tail_ir();
    assert_eq!(emit_kernel(&lstm, "k"), emit_kernel(&lstm.clone(), "k"));
    let name = kernel_name(&lstm);
    assert_eq!(name, kernel_name(&lstm.clone()));
    assert_eq!(name.len(), 3 + 16);
    assert!(name.starts_with("fb_"));
    assert!(
        name[3..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    let mut other = lstm.clone();
    other.stores.pop();
    assert_ne!(
        kernel_name(&other),
        name,
        "a different kernel gets a different name"
    );
    let mut transposed = lstm.clone();
    transposed.loads[4].axes = vec![S, S];
    assert_ne!(
        kernel_name(&transposed),
        name,
        "the stride pattern is part of the identity"
    );

    // A module of two kernels (and a repeated entry) compiles, and both run.
    let k2 = unary_kernel(DType::F32, |b, x| {
        let two = b.c(2.0, Prec::F32);
        vec![(b.bin(BinOp::Mul, x, two, Prec::F32), DType::F32)]
    });
    let n2 = kernel_name(&k2);
    let module_text = emit_module(&[
        (name.clone(), &lstm),
        (n2.clone(), &k2),
        (name.clone(), &lstm),
    ]);
    assert_eq!(module_text.matches(&format!("void {name}(")).count(), 1);
    assert_eq!(
        module_text,
        emit_module(&[
            (name.clone(), &lstm),
            (n2.clone(), &k2),
            (name.clone(), &lstm)
        ])
    );
    assert!(module_text.contains("static inline float fb_expf_addend(float x)"));
    assert!(
        !module_text.contains("declare simd"),
        "f32 exp and tanh need no libm declarations"
    );
    assert!(
        !module_text.contains("double exp(double)"),
        "only the functions used are declared"
    );
    let module = compiler().compile(&module_text).expect("module compiles");
    let double = Compiled {
        f: module.kernel(&n2).unwrap(),
        module: module.clone(),
        ir: k2.clone(),
    };
    let mut args = vec![
        arg(Buf::F32(vec![1.5, -0.0]), &[1], 0),
        arg(Buf::F32(vec![0.0; 2]), &[1], 0),
    ];
    run(&double, &[2], &mut args);
    assert_same32(args[1].buf.f32(), &[3.0, -0.0], "2x");
    let lstm_k = Compiled {
        f: module.kernel(&name).unwrap(),
        module,
        ir: lstm,
    };
    let inputs: [Vec<f32>; 5] = std::array::from_fn(|v| vec![v as f32 * 0.25 - 0.5; 6]);
    let (cy, _) = run_lstm(&lstm_k, 2, 3, &inputs);
    let (want, _) = lstm_reference(-0.5, -0.25, 0.0, 0.25, 0.5);
    assert!((cy[5] as f64 - want).abs() <= 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Explicit AVX-512 loops.

/// Whether this host's CPU has AVX-512F (so `-march=native` takes the vector loops).
fn host_has_avx512f() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "avx512f"))
        })
        .unwrap_or(false)
}

/// `values` as an f32 argument whose view starts 64-byte aligned (as the executor's buffers
/// do), at an offset into a slightly larger buffer.
fn aligned_arg(values: Vec<f32>, strides: &[i64]) -> Arg {
    let mut buf = vec![0.0f32; values.len() + 16];
    let offset = (buf.as_ptr() as usize).wrapping_neg() % 64 / 4;
    buf[offset..offset + values.len()].copy_from_slice(&values);
    arg(Buf::F32(buf), strides, offset as i64)
}

/// Every instruction the vector loops can write, in one kernel over `[N, M]`: two contiguous
/// f32 loads and one broadcast along the inner axis (an `[N, 1]` column), literals (one in f64
/// rounded to f32), negation,
/// the four operators, the six comparisons, `select`, `min` and `max` both ways round, `abs`,
/// `floor`, `sqrt`, `rsqrt`, a stored `exp`,
/// an `exp` only added to a literal (the sigmoid variant), and `tanh` of `tanh`, so the body
/// runs as three loops handing values on through stack arrays.
fn vector_coverage_ir() -> (KernelIr, usize) {
    let f = Prec::F32;
    let mut b = Body::default();
    let x = b.load(0);
    let y = b.load(1);
    let col = b.load(2);
    let one = b.c(1.0, f);
    let half = b.c(0.5, f);
    let mut outs = Vec::new();
    let nx = b.neg(x, f);
    outs.push(nx);
    for op in [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div] {
        let v = b.bin(op, x, y, f);
        outs.push(v);
    }
    let xc = b.bin(BinOp::Mul, x, col, f);
    outs.push(xc);
    // An f64 literal rounded to f32 (as the lowering writes scalar constants of f32 ops).
    let wide = b.c(0.1, Prec::F64);
    let tenth = b.round(wide, DType::F32);
    let xt = b.bin(BinOp::Mul, x, tenth, f);
    outs.push(xt);
    for op in [
        BinOp::Lt,
        BinOp::Le,
        BinOp::Gt,
        BinOp::Ge,
        BinOp::Eq,
        BinOp::Ne,
    ] {
        let v = b.bin(op, x, y, f);
        outs.push(v);
    }
    let sel = b.call(Func::Select, &[x, y, col], f);
    outs.push(sel);
    for func in [Func::Min, Func::Max] {
        for (a, b2) in [(x, y), (y, x), (x, x)] {
            let v = b.call(func, &[a, b2], f);
            outs.push(v);
        }
    }
    for func in [
        Func::Abs,
        Func::Floor,
        Func::Sqrt,
        Func::Rsqrt,
        Func::Exp,
        Func::Tanh,
    ] {
        let v = b.call(func, &[x], f);
        outs.push(v);
    }
    // sigmoid(y): its exp is only added to a literal.
    let ny = b.neg(y, f);
    let e = b.call(Func::Exp, &[ny], f);
    let d = b.bin(BinOp::Add, one, e, f);
    let sig = b.bin(BinOp::Div, one, d, f);
    outs.push(sig);
    // tanh(tanh(x * 0.5) + sigmoid(y)) * col: a second and a third loop.
    let xh = b.bin(BinOp::Mul, x, half, f);
    let t1 = b.call(Func::Tanh, &[xh], f);
    let s1 = b.bin(BinOp::Add, t1, sig, f);
    let t2 = b.call(Func::Tanh, &[s1], f);
    let e2 = b.call(Func::Exp, &[t2], f);
    let last = b.bin(BinOp::Mul, e2, col, f);
    outs.push(last);
    let stores: Vec<Store> = outs
        .iter()
        .map(|&v| store(v, DType::F32, &[S, U]))
        .collect();
    let count = stores.len();
    (
        KernelIr {
            rank: 2,
            row_arithmetic: RowArithmetic::default(),
            loads: vec![
                view(DType::F32, &[S, U]),
                view(DType::F32, &[S, U]),
                view(DType::F32, &[S, B]),
            ],
            body: b.0,
            stores,
            reductions: Vec::new(),
        },
        count,
    )
}

/// `ir` compiled twice: as for this host (vector loops where it has AVX-512) and with
/// `-mno-avx512f` (scalar loops only).
fn vector_and_scalar_builds(ir: &KernelIr) -> (Compiled, Compiled) {
    if !host_has_avx512f() {
        eprintln!("note: this CPU has no AVX-512F, so both builds run the scalar loops");
    }
    let name = kernel_name(ir);
    let source = emit_module(&[(name.clone(), ir)]);
    let dir = std::env::temp_dir().join("fusebox-test-cpu-emit-cache");
    let mut scalar_config = CompilerConfig::from_env().with_cache_dir(dir);
    scalar_config.flags.push("-mno-avx512f".to_string());
    let module = Compiler::new(scalar_config)
        .compile(&source)
        .unwrap_or_else(|e| panic!("{e}"));
    let scalar = Compiled {
        f: module.kernel(&name).expect("kernel symbol"),
        module,
        ir: ir.clone(),
    };
    (compile(ir), scalar)
}

/// The vector loops compute exactly what the scalar loops compute: the same kernel built for
/// this host and built with `-mno-avx512f` (scalar loops only) gives the same bits for every
/// output (any NaN for NaN: x86 takes a NaN's sign from whichever operand the compiler put
/// first), over ordinary values, ±0, subnormals, ±Inf, NaN, values beyond exp's overflow and
/// underflow thresholds and random bit patterns, in rows whose length leaves a scalar
/// remainder after the whole vectors and spans two chunks.
#[test]
fn avx512_vector_loops_match_the_scalar_loops_bit_for_bit() {
    let (ir, outputs) = vector_coverage_ir();
    let name = kernel_name(&ir);
    let source = emit_module(&[(name.clone(), &ir)]);
    assert!(
        source.contains("fbv_tanhf(")
            && source.contains("fbv_expf_addend(")
            && source.contains("#if defined(FB_AVX512)"),
        "the kernel has no vector loops:\n{source}"
    );
    let (vector, scalar) = vector_and_scalar_builds(&ir);

    // 320 rows of 2125: every row leaves a scalar remainder, and the launch touches about
    // 73 MB, so the vector loops stream their stores wherever a row starts 64-byte aligned
    // (every 16th row) and store normally elsewhere.
    let (n, m) = (320usize, 2048 + 77);
    assert!(n * m * 4 * ir.arg_count() > STREAM_MIN_BYTES);
    let mut rng = Rng(0x5eed_0fa5);
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        -1e-40,
        1e-45,
        88.72284,
        88.72285,
        -87.5,
        -103.97,
        -104.5,
        9.5,
        -9.6,
        1e30,
        -1e30,
        f32::MAX,
        1.0,
    ];
    // Each element picks its kind at random, so x and y meet in every combination (a special
    // beside a special gives the ±0 pairs that min and max must order).
    let mut draw = || match rng.next_u64() % 5 {
        0 => specials[(rng.next_u64() % specials.len() as u64) as usize],
        1 => f32::from_bits(rng.next_u64() as u32),
        2 => rng.uniform(-120.0, 120.0) as f32,
        3 => rng.uniform(-12.0, 12.0) as f32,
        _ => rng.uniform(-1e-3, 1e-3) as f32,
    };
    let xs: Vec<f32> = (0..n * m).map(|_| draw()).collect();
    let ys: Vec<f32> = (0..n * m).map(|_| draw()).collect();
    let cols: Vec<f32> = (0..n).map(|_| draw()).collect();
    let outputs_of = |k: &Compiled| {
        let mut args = vec![
            aligned_arg(xs.clone(), &[m as i64, 1]),
            aligned_arg(ys.clone(), &[m as i64, 1]),
            arg(Buf::F32(cols.clone()), &[1, 0], 0),
        ];
        for _ in 0..outputs {
            // Poisoned, so an element either loop skipped shows.
            args.push(aligned_arg(
                vec![f32::from_bits(0x7fa5_a5a5); n * m],
                &[m as i64, 1],
            ));
        }
        run(k, &[n as i64, m as i64], &mut args);
        args.split_off(3)
            .into_iter()
            .map(|a| {
                let o = a.offset as usize;
                a.buf.f32()[o..o + n * m].to_vec()
            })
            .collect::<Vec<_>>()
    };
    let want = outputs_of(&scalar);
    let got = outputs_of(&vector);
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        for (i, (&gv, &wv)) in g.iter().zip(w).enumerate() {
            assert!(
                gv.to_bits() != 0x7fa5_a5a5 && same32(gv, wv),
                "output {o} element {i} (x = {:e}, y = {:e}): vector {gv:e}, scalar {wv:e}",
                xs[i],
                ys[i]
            );
        }
    }
}

/// Column reductions through the vector loops accumulate exactly what the scalar loops do:
/// sums of `tanh(x)`, maxima of `exp(x)` and means of `x` over the rows, beside a stored
/// `tanh(x)`, built for this host and with `-mno-avx512f`, give the same bits in every output
/// (any NaN for NaN), over ordinary values, ±0, subnormals, ±Inf, NaN and random bit patterns,
/// in rows whose length leaves a scalar remainder: once with wide rows (threads own column
/// ranges and walk every row, with the prefetch ahead) and once with narrow ones (per-thread
/// partial columns, combined in thread order).
#[test]
fn avx512_column_reductions_match_the_scalar_loops_bit_for_bit() {
    let f = Prec::F32;
    let mut b = Body::default();
    let x = b.load(0);
    let t = b.call(Func::Tanh, &[x], f);
    let e = b.call(Func::Exp, &[x], f);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &[S, U])],
        body: b.0,
        stores: vec![store(t, DType::F32, &[S, U])],
        reductions: vec![
            reduction(ReduceKind::Sum, t, &[true, false], DType::F32),
            reduction(ReduceKind::Max, e, &[true, false], DType::F32),
            reduction(ReduceKind::Mean, x, &[true, false], DType::F64),
        ],
    };
    let source = emit_module(&[(kernel_name(&ir), &ir)]);
    assert!(
        source.contains("fbv_acc_sum(") && source.contains("fbv_acc_max("),
        "the kernel has no vector column accumulation:\n{source}"
    );
    let (vector, scalar) = vector_and_scalar_builds(&ir);
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -1e-40,
        88.8,
        -104.5,
        1.0,
    ];
    // Wide rows take the shared column ranges, narrow ones the per-thread partials.
    for (n, m, seed) in [(300usize, 1024 + 13, 71u64), (2000, 77, 72)] {
        let mut rng = Rng(seed);
        // Specials and random bits in the first 20 rows only, so that most columns' sums and
        // maxima stay finite.
        let xs: Vec<f32> = (0..n * m)
            .map(|i| match (i / m < 20, rng.next_u64() % 8) {
                (true, 0) => specials[(rng.next_u64() % specials.len() as u64) as usize],
                (true, 1) => f32::from_bits(rng.next_u64() as u32),
                _ => rng.uniform(-20.0, 20.0) as f32,
            })
            .collect();
        let outputs_of = |k: &Compiled| {
            let mut args = vec![
                aligned_arg(xs.clone(), &[m as i64, 1]),
                aligned_arg(vec![f32::from_bits(0x7fa5_a5a5); n * m], &[m as i64, 1]),
                arg(Buf::F32(vec![9.0; m]), &[0, 1], 0),
                arg(Buf::F32(vec![9.0; m]), &[0, 1], 0),
                arg(Buf::F64(vec![9.0; m]), &[0, 1], 0),
            ];
            run(k, &[n as i64, m as i64], &mut args);
            let stored = {
                let o = args[1].offset as usize;
                args[1].buf.f32()[o..o + n * m].to_vec()
            };
            (
                stored,
                args[2].buf.f32().to_vec(),
                args[3].buf.f32().to_vec(),
                args[4].buf.f64().to_vec(),
            )
        };
        let (got, want) = (outputs_of(&vector), outputs_of(&scalar));
        for (what, g, w) in [
            ("stored tanh", &got.0, &want.0),
            ("column sums", &got.1, &want.1),
            ("column maxima", &got.2, &want.2),
        ] {
            for (i, (&gv, &wv)) in g.iter().zip(w).enumerate() {
                assert!(
                    same32(gv, wv),
                    "[{n}, {m}] {what} [{i}]: vector {gv:e}, scalar {wv:e}"
                );
            }
        }
        for (i, (&gv, &wv)) in got.3.iter().zip(&want.3).enumerate() {
            assert!(
                same64(gv, wv),
                "[{n}, {m}] column means [{i}]: vector {gv:e}, scalar {wv:e}"
            );
        }
        // Not vacuous: most columns are finite.
        assert!(
            got.1.iter().filter(|v| v.is_finite()).count() * 2 > m,
            "[{n}, {m}]"
        );
    }
}

/// Kernels the vector loops cannot express keep the scalar loops alone: other functions (the
/// libmvec ones such as `log`), f64 values, strided inner axes, reductions.
#[test]
fn kernels_outside_the_vector_subset_emit_no_vector_loops() {
    let f = Prec::F32;
    let log = unary_kernel(DType::F32, |b, x| {
        vec![(b.call(Func::Log, &[x], f), DType::F32)]
    });
    let double = unary_kernel(DType::F64, |b, x| {
        vec![(b.call(Func::Exp, &[x], Prec::F64), DType::F64)]
    });
    let strided = {
        let mut b = Body::default();
        let x = b.load(0);
        KernelIr {
            rank: 2,
            row_arithmetic: RowArithmetic::default(),
            loads: vec![view(DType::F32, &[S, S])],
            body: b.0,
            stores: vec![store(x, DType::F32, &[S, U])],
            reductions: Vec::new(),
        }
    };
    let reduced = reduce_kernel(2, &[(ReduceKind::Sum, vec![false, true], DType::F32)]);
    for (what, ir) in [
        ("log", log),
        ("f64", double),
        ("strided", strided),
        ("sum", reduced),
    ] {
        let text = emit_module(&[(kernel_name(&ir), &ir)]);
        assert!(!text.contains("_mm512"), "{what} has vector loops:\n{text}");
    }
    // Column sums and maxima of f32 values (every reduction keeps the innermost axis) take
    // the vector loops, accumulating lanes into `double` columns; a row sum beside them keeps
    // the kernel out.
    let columns = reduce_kernel(
        2,
        &[
            (ReduceKind::Sum, vec![true, false], DType::F32),
            (ReduceKind::Max, vec![true, false], DType::F32),
        ],
    );
    let text = emit_module(&[(kernel_name(&columns), &columns)]);
    assert!(
        text.contains("fbv_acc_sum(&q0[kb0 + j], ") && text.contains("fbv_acc_max(&q1[kb1 + j], "),
        "{text}"
    );
    let mixed = reduce_kernel(
        2,
        &[
            (ReduceKind::Sum, vec![true, false], DType::F32),
            (ReduceKind::Sum, vec![false, true], DType::F32),
        ],
    );
    let text = emit_module(&[(kernel_name(&mixed), &mixed)]);
    assert!(
        !text.contains("_mm512"),
        "row and column sums have vector loops:\n{text}"
    );
    // The LSTM tail's two loops both start with whole vectors.
    let lstm = lstm_tail_ir();
    let text = emit_module(&[(kernel_name(&lstm), &lstm)]);
    assert_eq!(
        text.matches("for (int64_t j = 0; j < jv; j += 16)").count(),
        2
    );
}

/// The compiler force-includes its precompiled header into every kernel build, which is only
/// sound (and only saves time) while that header holds exactly the system headers generated
/// modules include: one more there would be read into kernels that never asked for it, one
/// missing would be parsed afresh by every build.
#[test]
fn the_precompiled_header_holds_exactly_the_headers_modules_include() {
    let includes = |text: &str| -> std::collections::BTreeSet<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| l.starts_with("#include"))
            .map(String::from)
            .collect()
    };
    let lstm = lstm_tail_ir();
    let reduced = reduce_kernel(2, &[(ReduceKind::Sum, vec![false, true], DType::F64)]);
    let vector = emit_module(&[(kernel_name(&lstm), &lstm)]);
    let scalar = emit_module(&[(kernel_name(&reduced), &reduced)]);
    assert!(vector.contains("_mm512") && !scalar.contains("_mm512"));
    let mut emitted = includes(&vector);
    emitted.extend(includes(&scalar));
    assert_eq!(emitted, includes(PRECOMPILED_HEADER));
    // The vector-only header is guarded alike in both places.
    let guarded = |text: &str| text.contains("#if defined(__AVX512F__)\n#include <immintrin.h>");
    assert!(guarded(&vector) && guarded(PRECOMPILED_HEADER));
}

/// f16 and bf16 through the vector loops: loads of every f16 and bf16 bit pattern (NaNs,
/// infinities, subnormals included), an f16 column broadcast along rows, f32 arithmetic
/// rounded to f16 and bf16 where the graph rounds (once before further arithmetic, once
/// before a store), an f64 literal rounded once to f16, a dead widening, and stores of all
/// three formats over
/// two loops (a `tanh` of a `tanh`). Every output equals the scalar build's bit for bit, NaN
/// for NaN.
#[test]
fn avx512_half_precision_loops_match_the_scalar_loops_bit_for_bit() {
    let f = Prec::F32;
    let mut b = Body::default();
    let x = b.load(0); // f16
    let y = b.load(1); // bf16
    let col = b.load(2); // f16, [N, 1]
    let z = b.load(3); // f32
    // A dead widening, as the lowering leaves beside an f16 load: it has no vector form, and
    // being unused it must neither keep the kernel out of the vector loops nor reach them.
    b.push(Instr::Widen { x });
    let mut stores = Vec::new();
    let mut out = |b: &mut Body, v: ValueId, dtype: DType| {
        let r = if dtype == DType::F32 {
            v
        } else {
            b.round(v, dtype)
        };
        stores.push(store(r, dtype, &[S, U]));
    };
    let s = b.bin(BinOp::Add, x, y, f);
    out(&mut b, s, DType::F16);
    out(&mut b, s, DType::BF16);
    out(&mut b, s, DType::F32);
    let wide = b.c(0.1, Prec::F64);
    let tenth = b.round(wide, DType::F16);
    let xt = b.bin(BinOp::Mul, x, tenth, f);
    out(&mut b, xt, DType::F16);
    let xc = b.bin(BinOp::Mul, x, col, f);
    out(&mut b, xc, DType::BF16);
    let xz = b.bin(BinOp::Mul, x, z, f);
    let h = b.round(xz, DType::F16);
    let t1 = b.call(Func::Tanh, &[h], f);
    let tb = b.round(t1, DType::BF16);
    out(&mut b, tb, DType::F32);
    let e = b.call(Func::Exp, &[y], f);
    out(&mut b, e, DType::F16);
    let t2 = b.call(Func::Tanh, &[tb], f);
    let last = b.bin(BinOp::Add, t2, col, f);
    out(&mut b, last, DType::F16);
    out(&mut b, last, DType::BF16);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![
            view(DType::F16, &[S, U]),
            view(DType::BF16, &[S, U]),
            view(DType::F16, &[S, B]),
            view(DType::F32, &[S, U]),
        ],
        body: b.0,
        stores,
        reductions: Vec::new(),
    };
    let source = emit_module(&[(kernel_name(&ir), &ir)]);
    assert!(
        source.contains("fbv_h2f(&p0")
            && source.contains("fbv_store_b(")
            && source.contains("fbv_rnd_fh("),
        "the kernel has no half-precision vector loops:\n{source}"
    );
    let (vector, scalar) = vector_and_scalar_builds(&ir);

    // 40 rows of 2125 (a scalar remainder in every row); every 16-bit pattern appears.
    let (n, m) = (40usize, 2048 + 77);
    let mut rng = Rng(0xbf16);
    // The first 65,536 elements run through every pattern (y in another order than x, an odd
    // multiplier being a permutation of u16), the rest are random.
    let bits = |rng: &mut Rng, step: u16| -> Vec<u16> {
        (0..n * m)
            .map(|i| {
                if i < 65536 {
                    (i as u16).wrapping_mul(step)
                } else {
                    rng.next_u64() as u16
                }
            })
            .collect()
    };
    let (xs, ys) = (bits(&mut rng, 1), bits(&mut rng, 40503));
    let cols: Vec<u16> = (0..n)
        .map(|i| [0x3c00u16, 0x8000, 0x7c00, 0x7e00, 0x0001][i % 5])
        .collect();
    let zs = rng.f32s(n * m, -3.0, 3.0);
    let dtypes: Vec<DType> = ir.stores.iter().map(|s| s.view.dtype).collect();
    // Signalling NaNs of each format: arithmetic only ever produces quiet ones, so an output
    // still holding one was never written.
    let poison = |dtype: DType| {
        if dtype == DType::F16 {
            0x7d55u16
        } else {
            0x7f95
        }
    };
    let outputs_of = |k: &Compiled| {
        let mut args = vec![
            arg(Buf::Half(xs.clone()), &[m as i64, 1], 0),
            arg(Buf::Half(ys.clone()), &[m as i64, 1], 0),
            arg(Buf::Half(cols.clone()), &[1, 0], 0),
            arg(Buf::F32(zs.clone()), &[m as i64, 1], 0),
        ];
        for &dtype in &dtypes {
            let buf = match dtype {
                DType::F32 => Buf::F32(vec![f32::from_bits(0x7fa5_a5a5); n * m]),
                _ => Buf::Half(vec![poison(dtype); n * m]),
            };
            args.push(arg(buf, &[m as i64, 1], 0));
        }
        run(k, &[n as i64, m as i64], &mut args);
        args.split_off(4)
    };
    let (got, want) = (outputs_of(&vector), outputs_of(&scalar));
    let nan16 = |dtype: DType, v: u16| match dtype {
        DType::F16 => v & 0x7c00 == 0x7c00 && v & 0x03ff != 0,
        _ => v & 0x7f80 == 0x7f80 && v & 0x007f != 0,
    };
    for (o, ((g, w), &dtype)) in got.iter().zip(&want).zip(&dtypes).enumerate() {
        for i in 0..n * m {
            let ok = match dtype {
                DType::F32 => {
                    let (gv, wv) = (g.buf.f32()[i], w.buf.f32()[i]);
                    gv.to_bits() != 0x7fa5_a5a5 && same32(gv, wv)
                }
                _ => {
                    let (gv, wv) = (g.buf.half()[i], w.buf.half()[i]);
                    gv != poison(dtype) && (gv == wv || (nan16(dtype, gv) && nan16(dtype, wv)))
                }
            };
            assert!(
                ok,
                "output {o} ({dtype}) element {i} (x = {:#06x}, y = {:#06x}): vector and scalar differ",
                xs[i], ys[i]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row kernels.

/// Softmax over the rows of `[N, M]` f32 as the lowering writes it (max; `exp(x - max)`,
/// summed; `exp / sum`), also storing each row's sum (`[N, 1]`, one element per row).
/// Returns the kernel and the ids of its `exp` and its sum.
fn softmax_row_ir() -> (KernelIr, ValueId, ValueId) {
    let f = Prec::F32;
    let mut b = Body::default();
    let x = b.load(0);
    let m = b.push(Instr::RowReduce {
        kind: ReduceKind::Max,
        x,
        dtype: DType::F32,
    });
    let d = b.bin(BinOp::Sub, x, m, f);
    let e = b.call(Func::Exp, &[d], f);
    let s = b.push(Instr::RowReduce {
        kind: ReduceKind::Sum,
        x: e,
        dtype: DType::F32,
    });
    let y = b.bin(BinOp::Div, e, s, f);
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![view(DType::F32, &[S, U])],
        body: b.0,
        stores: vec![store(y, DType::F32, &[S, U]), store(s, DType::F32, &[S, B])],
        reductions: Vec::new(),
    };
    (ir, e, s)
}

/// The last pass of softmax reads `exp(x - max)` back from the row scratch the second pass
/// wrote, rather than evaluating `exp` a second time per element; the recomputing loops are
/// kept for rows too long for the scratch. With the scratch, the last pass runs one row late:
/// it hands the row over (`pend`), and the next row's second pass stores it one vector per
/// step, then its remainder; a thread's last row is stored after its rows. The two rows share
/// one scratch row: each step reads the pending row's vector before it saves the current
/// row's there, and the pending remainder is stored before the current row's scalar loop
/// saves its own. The passes run AVX-512 loops first; the max pass keeps four accumulators.
#[test]
fn the_last_softmax_pass_reads_exp_back_instead_of_recomputing_it() {
    let (ir, e, _) = softmax_row_ir();
    let text = emit_kernel(&ir, "k");
    let carried = format!("if (c{e})");
    // Pass 2 (saving or not), then pass 3 (handing over or recomputing).
    assert_eq!(text.matches(&carried).count(), 2, "{text}");
    let last = &text[text.rfind(&carried).unwrap()..];
    let handing = block(last);
    let recomputing = &last[last.find("else").unwrap()..];
    assert!(
        handing.contains("pend = 1;") && !handing.contains("expf") && !handing.contains("[j]"),
        "the last pass does not hand its row over:\n{handing}"
    );
    // The pending row is stored in the next row's second pass (by vector, then the
    // remainder) and after the thread's rows: each time from the scratch row it shares with
    // the current row, as the same quotient, without exp.
    let pending: Vec<&str> = text
        .match_indices("if (pend)")
        .map(|(i, _)| block(&text[i..]))
        .collect();
    assert_eq!(pending.len(), 3, "{text}");
    for store in &pending {
        assert!(
            store.contains(&format!("const float *c{e} = pc{e};"))
                && store.contains(&format!("c{e}[j]"))
                && !store.contains("expf"),
            "{store}"
        );
    }
    assert!(pending[0].contains("fbv_store(&d0[j]"), "{}", pending[0]);
    // One scratch row per thread, no swapping.
    assert!(
        text.contains("aligned_alloc(64, (size_t)rbytes * 1)"),
        "{text}"
    );
    assert!(text.contains(&format!("float *pc{e} = c{e};")), "{text}");
    assert!(
        !text.contains(&format!("c{e} = pc{e}; pc{e} = t;")),
        "{text}"
    );
    // In the second pass's step, the pending vector is read before the current one is saved;
    // its remainder is stored before the scalar loop that saves the current row's.
    let save = format!("_mm512_store_ps(&c{e}[j]");
    let step = &text[text.find("if (pend)").unwrap()..];
    assert!(step.find(&format!("_mm512_load_ps(&c{e}[j])")).unwrap() < step.find(&save).unwrap());
    let tail = text.match_indices("if (pend)").nth(1).unwrap().0;
    let scalar_save = text.find(&format!("c{e}[j] = v{e};")).unwrap();
    assert!(tail < scalar_save, "{text}");
    assert!(text.contains("#pragma omp for schedule(static) nowait"));
    // The vector loops of a relaxed row kernel use the cheaper exp, the scalar ones fb_expf.
    assert!(recomputing.contains("fbv_expf_row(") && recomputing.contains("fb_expf("));
    assert!(!text.contains("fbv_expf("), "{text}");
    assert!(text.contains(&format!("_mm512_store_ps(&c{e}[j]")));
    // The max pass: four chains over 64 elements, then single vectors.
    assert!(text.contains("for (; j + 64 <= jv; j += 64)"), "{text}");
    assert!(text.contains("vm1_3 = _mm512_max_ps(v0, vm1_3);"), "{text}");
    // Vector loops: divide recomputing, and the thread's last pending row. The sum's pass
    // walks the row in f32 blocks (saving or not), each with its loop again in f64 for a
    // block that overflows.
    assert_eq!(
        text.matches("for (int64_t j = 0; j < jv; j += 16)").count(),
        2
    );
    assert_eq!(
        text.matches("for (int64_t j = jb; j < je; j += 16)")
            .count(),
        4
    );
}

/// The balanced `{ ... }` block that starts at the first `{` of `text`.
fn block(text: &str) -> &str {
    let start = text.find('{').expect("a block");
    let mut depth = 0;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[start..start + i + 1];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced block in {text}")
}

/// Under `row_arithmetic: Exact` softmax's row kernel takes none of the relaxed forms: its
/// vector loops call the pointwise kernels' `fbv_expf`, add every vector into the f64
/// accumulators (no f32 blocks) and divide by the row's sum (no reciprocal).
#[test]
fn an_exact_softmax_row_kernel_uses_f64_sums_division_and_the_pointwise_exp() {
    let (mut ir, e, s) = softmax_row_ir();
    ir.row_arithmetic = RowArithmetic::Exact;
    let text = emit_kernel(&ir, "k");
    let y = s + 1;
    assert!(text.contains(&format!("fbv_expf(v{})", e - 1)), "{text}");
    assert!(!text.contains("fbv_expf_row(") && !text.contains("_mm512_add_ps(vf"));
    assert!(!text.contains(&format!("rc{y}")) && !text.contains("jb"));
    assert!(text.contains(&format!("const __m512 v{y} = _mm512_div_ps(v{e}, v{s});")));
    assert!(
        text.contains(&format!("const float v{y} = (v{e} / v{s});")),
        "{text}"
    );
}

/// Softmax's last pass multiplies by the reciprocal of the row's sum, computed once per row,
/// wherever that reciprocal is a normal float, and divides otherwise, in its vector and its
/// scalar loops.
#[test]
fn softmax_multiplies_by_the_reciprocal_of_its_row_sum() {
    let (ir, e, s) = softmax_row_ir();
    let text = emit_kernel(&ir, "k");
    let y = s + 1;
    assert_eq!(
        text.matches(&format!("rc{y} = 1.0f / v{s};")).count(),
        1,
        "{text}"
    );
    assert!(text.contains(&format!(
        "const __m512 v{y} = rk{y} ? _mm512_mul_ps(v{e}, _mm512_set1_ps(rc{y})) : _mm512_div_ps(v{e}, v{s});"
    )));
    assert!(text.contains(&format!(
        "const float v{y} = rk{y} ? (v{e} * rc{y}) : (v{e} / v{s});"
    )));
}

/// Softmax through the row kernel's AVX-512 loops and through its scalar loops alone (the
/// same source built with `-mno-avx512f`) gives the same results within the bound
/// `src/lower/ir.rs` states: the maximum is the same operations bit for bit; the vector `exp`
/// (`fbv_expf_row`, within 2.5 ulp) and the scalar one (`fb_expf`, within 1.05) differ by at
/// most 3.55·2⁻²³ relatively; the vector sum adds blocks of 16 terms per lane in f32 (within
/// 15·2⁻²⁴ of the positive sum before rounding) where the scalar loop adds in f64, so the
/// rounded sums differ by at most 11.05·2⁻²³ relatively plus two roundings, 24 ulps; each then
/// multiplies by the reciprocal of its sum (within 2⁻²³ of the quotient), so the outputs differ
/// by at most (18 + 2·3.55)·2⁻²³ relatively, 51 ulps, plus 2⁻¹⁴⁹ twice below the normal
/// range. Rows of 2125 elements (a scalar remainder after the whole vectors) carry the
/// `exp` in the row scratch; rows just past `ROW_SCRATCH_BYTES` recompute it. Inputs mix
/// ordinary values with ±Inf (rows whose max is +Inf divide NaN by NaN), NaN (whole rows
/// NaN), and rows of equal values.
#[test]
fn avx512_row_passes_match_the_scalar_loops() {
    let (ir, _, _) = softmax_row_ir();
    let (vector, scalar) = vector_and_scalar_builds(&ir);
    let mut rng = Rng(0x0005_0f7a);
    for (n, m) in [(48usize, 2048 + 77), (3, ROW_SCRATCH_BYTES / 4 + 5)] {
        let mut xs = rng.f32s(n * m, -30.0, 30.0);
        // Row 1: a NaN; row 2: +Inf; row 3: -Inf among ordinary values; row 4: constant.
        xs[m + 7] = f32::NAN;
        xs[2 * m + 3] = f32::INFINITY;
        if n > 4 {
            xs[3 * m + 1] = f32::NEG_INFINITY;
            xs[4 * m..5 * m].fill(-0.5);
        }
        let outputs_of = |k: &Compiled| {
            let mut args = vec![
                aligned_arg(xs.clone(), &[m as i64, 1]),
                aligned_arg(vec![f32::from_bits(0x7fa5_a5a5); n * m], &[m as i64, 1]),
                arg(Buf::F32(vec![f32::from_bits(0x7fa5_a5a5); n]), &[1, 0], 0),
            ];
            run(k, &[n as i64, m as i64], &mut args);
            let y = &args[1];
            let o = y.offset as usize;
            (
                y.buf.f32()[o..o + n * m].to_vec(),
                args[2].buf.f32().to_vec(),
            )
        };
        let (want_y, want_s) = outputs_of(&scalar);
        let (got_y, got_s) = outputs_of(&vector);
        let close = |g: f32, w: f32, ulps: f64| {
            same32(g, w)
                || (g.is_finite() && w.is_finite() && ((g - w) as f64).abs() <= ulps * ulp32(w))
        };
        for (r, (&g, &w)) in got_s.iter().zip(&want_s).enumerate() {
            assert!(
                close(g, w, 24.0),
                "[{n}, {m}] row {r} sum: vector {g:e}, scalar {w:e}"
            );
        }
        for (i, (&g, &w)) in got_y.iter().zip(&want_y).enumerate() {
            assert!(
                g.to_bits() != 0x7fa5_a5a5 && close(g, w, 53.0),
                "[{n}, {m}] element {i} (x = {:e}): vector {g:e}, scalar {w:e}",
                xs[i]
            );
        }
        // The planted specials: a NaN row is NaN throughout, and so is a row holding +Inf
        // (Inf - Inf); the constant row is uniform.
        assert!(got_y[m..3 * m].iter().all(|v| v.is_nan()));
        if n > 4 {
            let row = &got_y[4 * m..5 * m];
            assert!(row.iter().all(|&v| v == 1.0 / m as f32), "{}", row[0]);
        }
    }
}

/// Index-map positions divide by a rounded reciprocal with one correction (the spelling the
/// CUDA emitter shares): at, just below and just above multiples of a stage size, from small
/// positions up to just below the 2^51 cap, the C kernel reads the element integer
/// arithmetic gives, including where the estimate alone is one short.
#[test]
fn map_positions_divide_exactly_by_reciprocals_up_to_the_cap() {
    use map_positions::{COLUMNS, SECOND};
    let ir = map_positions::kernel();
    let k = compile(&ir);
    let mut corrected = 0;
    for (launch, _) in map_positions::launches() {
        corrected += map_positions::corrected(&launch);
        let rows = launch.sizes[0];
        let mut x: Vec<f32> = (0..SECOND).map(|i| i as f32).collect();
        let mut y = vec![f32::NAN; (rows * COLUMNS) as usize];
        let mut strides: Vec<i64> = launch.strides.iter().flatten().copied().collect();
        strides.extend(launch.map_words());
        let ptrs: Vec<*mut c_void> = vec![x.as_mut_ptr().cast(), y.as_mut_ptr().cast()];
        // Every element read is below SECOND (the map's last stage takes positions modulo it)
        // and the store covers y exactly.
        // SAFETY: the arguments follow the ABI of `Launch` for `ir`, and the module is alive.
        unsafe {
            (k.f)(
                launch.sizes.as_ptr(),
                strides.as_ptr(),
                launch.offsets.as_ptr(),
                ptrs.as_ptr(),
            )
        };
        for r in 0..rows {
            for c in 0..COLUMNS {
                let q = map_positions::position(&launch, r, c);
                assert_eq!(
                    y[(r * COLUMNS + c) as usize],
                    map_positions::element(q) as f32,
                    "position {q}"
                );
            }
        }
    }
    assert!(corrected > 0, "no position needed the correction");
}

/// The scalar min and max (`fb_minf`/`fb_maxf`, `fb_mind`/`fb_maxd`, written as bit masks
/// without branches) keep torch.maximum/minimum's semantics on the CPU backend: NaN wins, +0
/// is above -0, infinities order; in f32 and f64, element by element and bit for bit.
#[test]
fn scalar_max_and_min_keep_nan_and_signed_zero_semantics() {
    use fusebox::model::{Backend, CompileOptions, Model};
    use fusebox::tensor::Tensor;
    let a = [
        -0.0,
        0.0,
        1.0,
        f64::NAN,
        1.0,
        f64::NEG_INFINITY,
        3.0,
        -0.0,
        f64::INFINITY,
    ];
    let b = [0.0, -0.0, f64::NAN, 1.0, 2.0, 5.0, -1.0, -0.0, f64::NAN];
    let max = [0.0, 0.0, f64::NAN, f64::NAN, 2.0, 5.0, 3.0, -0.0, f64::NAN];
    let min = [
        -0.0,
        -0.0,
        f64::NAN,
        f64::NAN,
        1.0,
        f64::NEG_INFINITY,
        -1.0,
        -0.0,
        f64::NAN,
    ];
    let rules = fusebox::rules::RuleSet::defaults();
    for dtype in ["f32", "f64"] {
        let text = format!(
            r#"Graph(name: "g",
            inputs: [Input(name: "a", dtype: "{dtype}", shape: [9]), Input(name: "b", dtype: "{dtype}", shape: [9])],
            nodes: [Node(name: "hi", op: "max", args: ["a", "b"]), Node(name: "lo", op: "min", args: ["a", "b"])],
            outputs: ["hi", "lo"])"#
        );
        let (graph, _) = fusebox::graph::file::parse(&text, "g.ron", &rules.ops).unwrap();
        let model = Model::from_graph(graph, &rules).unwrap();
        let mut cpu = model
            .compile(Backend::Cpu, &CompileOptions::default())
            .unwrap();
        let dt = DType::from_name(dtype).unwrap();
        let inputs = std::collections::BTreeMap::from([
            (
                "a".to_string(),
                Tensor::from_values(dt, &[9], a.to_vec()).unwrap(),
            ),
            (
                "b".to_string(),
                Tensor::from_values(dt, &[9], b.to_vec()).unwrap(),
            ),
        ]);
        let out = cpu.run(&inputs).unwrap();
        for (name, want) in [("hi", &max), ("lo", &min)] {
            let got = out[name].values();
            for (k, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
                assert!(
                    same,
                    "{dtype} {name}[{k}] of {} and {}: {g} (want {w})",
                    a[k], b[k]
                );
            }
        }
    }
}
