//! The CUDA emitter and launch ABI, without a GPU: hand-built kernel IR → CUDA C → NVRTC for
//! sm_80 and sm_90 with an empty log (no warnings), PTX checked for the instructions the
//! design promises (16-byte vector accesses, atomics only outside deterministic mode), and
//! the launch plan and parameter block checked byte for byte against hand-computed values.
//!
//! NVRTC comes from the `nvidia-cuda-nvrtc-cu12` / `nvidia-cuda-runtime-cu12` wheels unpacked
//! under `$FUSEBOX_CUDA_DIR` (default `/tmp/wheels/x/nvidia`). Without them the compile
//! tests print why and pass; the ABI tests always run.

use crate::common;

use common::concat_graphs;
use common::random_graph;
use common::row_graphs::{self, last_axis};
use fusebox::backend::cuda::abi::{
    self, BLOCK, BLOCKS_PER_SM, GpuLaunch, LaunchPlan, RowPath, entry_name, fold, group_shapes,
    needs_i64, param_block, param_layout, plan, vector_ok, vector_width,
};
use fusebox::backend::cuda::emit::{EmitOptions, emit_module, kernel_name};
use fusebox::dag::Value;
use fusebox::dtype::DType;
use fusebox::formula::{BinOp, Func};
use fusebox::graph::{self, Graph, GraphBuilder};
use fusebox::lower::ir::{
    Axis, Instr, KernelIr, Launch, MapStage, Prec, ReduceKind, Reduction, RowArithmetic, Store,
    ValueId, View,
};
use fusebox::lower::{self, Program, Step as LowerStep};
use fusebox::optimize::{Options, optimize};
use fusebox::runtime::buffer::Buffer;
use fusebox::runtime::interpret;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::OnceLock;

use Axis::{Broadcast as B, Strided as S, Unit as U};

// ---------------------------------------------------------------------------------------------
// NVRTC harness.

/// Where the wheels were unpacked: `lib` and `include` directories.
fn cuda_dirs() -> (PathBuf, PathBuf) {
    let root = std::env::var_os("FUSEBOX_CUDA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/wheels/x/nvidia"));
    (
        root.join("cuda_nvrtc/lib"),
        root.join("cuda_runtime/include"),
    )
}

/// The include directory when NVRTC is loadable; `None` (and a message) when it is not.
fn nvrtc() -> Option<&'static PathBuf> {
    static READY: OnceLock<Option<PathBuf>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let (lib, include) = cuda_dirs();
            let path = lib.join("libnvrtc.so.12");
            if !path.exists() || !include.join("cuda_fp16.h").exists() {
                eprintln!(
                    "skipping NVRTC checks: {} or {} missing (set FUSEBOX_CUDA_DIR)",
                    path.display(),
                    include.join("cuda_fp16.h").display()
                );
                return None;
            }
            // Loaded by full path and kept for the life of the process, so that cudarc's
            // dlopen of the plain soname finds this copy.
            match unsafe { libloading::Library::new(&path) } {
                Ok(library) => std::mem::forget(library),
                Err(e) => {
                    eprintln!("skipping NVRTC checks: cannot load {}: {e}", path.display());
                    return None;
                }
            }
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                eprintln!("skipping NVRTC checks: cudarc does not find libnvrtc");
                return None;
            }
            Some(include)
        })
        .as_ref()
}

/// Compiles `source` for `arch` (e.g. `compute_80`) with `extra` options; the PTX, or the
/// log on failure. Any output in the log (a warning) is a failure too.
fn compile(source: &str, arch: &str, extra: &[&str]) -> Result<String, String> {
    use cudarc::nvrtc::result;
    let include = nvrtc().ok_or("no NVRTC")?;
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(c"fusebox.cu")).map_err(|e| format!("{e:?}"))?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        format!("--include-path={}", include.display()),
    ];
    options.extend(extra.iter().map(|o| o.to_string()));
    let compiled = unsafe { result::compile_program(prog, &options) };
    let text = |raw: Vec<std::ffi::c_char>| -> String {
        let bytes: Vec<u8> = raw
            .into_iter()
            .take_while(|&c| c != 0)
            .map(|c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let log = unsafe { result::get_program_log(prog) }
        .map(text)
        .unwrap_or_default();
    let ptx = compiled.and_then(|()| unsafe { result::get_ptx(prog) }.map(text));
    unsafe { result::destroy_program(prog) }.map_err(|e| format!("{e:?}"))?;
    match ptx {
        Ok(ptx) if log.trim().is_empty() => Ok(ptx),
        Ok(_) => Err(format!("warnings:\n{log}")),
        Err(e) => Err(format!("{e:?}:\n{log}")),
    }
}

/// Emits `kernels` in both modes and compiles each module for sm_80 and sm_90, failing on
/// any error or warning. Returns the sm_90 PTX of (atomic, deterministic) modules, or `None`
/// when NVRTC is unavailable.
fn check(kernels: &[KernelIr]) -> Option<(String, String)> {
    nvrtc()?;
    let named: Vec<(String, &KernelIr)> = kernels.iter().map(|k| (kernel_name(k), k)).collect();
    let mut ptx: Vec<String> = Vec::new();
    let mut atomic_source = String::new();
    for deterministic in [false, true] {
        let source = emit_module(&named, &EmitOptions { deterministic });
        // Kernels without atomics (row kernels, pointwise ones) emit the same module in both
        // modes: NVRTC would only repeat itself.
        if deterministic && source == atomic_source {
            let same = ptx[0].clone();
            ptx.push(same);
            continue;
        }
        // sm_80 for speed (`common::sm80_sweep_flags`); the PTX checked below is sm_90's,
        // fully optimized.
        for (arch, flags) in [
            ("compute_80", common::sm80_sweep_flags()),
            ("compute_90", &[][..]),
        ] {
            match compile(&source, arch, flags) {
                Ok(text) => {
                    if arch == "compute_90" {
                        ptx.push(text);
                    }
                }
                Err(log) => panic!("{arch}, deterministic {deterministic}: {log}\n{source}"),
            }
        }
        atomic_source = source;
    }
    let deterministic = ptx.pop().unwrap_or_default();
    let atomic = ptx.pop().unwrap_or_default();
    Some((atomic, deterministic))
}

// ---------------------------------------------------------------------------------------------
// Kernel IR builders.

fn view(dtype: DType, axes: &[Axis]) -> View {
    View::strided(dtype, axes.to_vec())
}

/// A kernel under construction.
struct K {
    ir: KernelIr,
}

impl K {
    fn new(rank: usize) -> K {
        K {
            ir: KernelIr {
                rank,
                row_arithmetic: RowArithmetic::default(),
                loads: Vec::new(),
                body: Vec::new(),
                stores: Vec::new(),
                reductions: Vec::new(),
            },
        }
    }

    fn push(&mut self, instr: Instr) -> ValueId {
        self.ir.body.push(instr);
        self.ir.body.len() - 1
    }

    /// A new load view and its value.
    fn load(&mut self, dtype: DType, axes: &[Axis]) -> ValueId {
        self.ir.loads.push(view(dtype, axes));
        let v = self.ir.loads.len() - 1;
        self.push(Instr::Load { view: v })
    }

    fn c(&mut self, value: f64, prec: Prec) -> ValueId {
        if prec == Prec::I64 {
            return self.push(Instr::Int {
                value: value as i64,
            });
        }
        self.push(Instr::Const { value, prec })
    }

    fn bin(&mut self, op: BinOp, a: ValueId, b: ValueId) -> ValueId {
        let prec = self.ir.prec(a);
        self.push(Instr::Binary { op, a, b, prec })
    }

    fn call(&mut self, func: Func, args: &[ValueId]) -> ValueId {
        let prec = self.ir.prec(args[0]);
        self.push(Instr::Call {
            func,
            args: args.to_vec(),
            prec,
        })
    }

    fn round(&mut self, x: ValueId, dtype: DType) -> ValueId {
        self.push(Instr::Round { x, dtype })
    }

    /// Stores `x` rounded to `dtype`.
    fn store(&mut self, x: ValueId, dtype: DType, axes: &[Axis]) {
        let value = self.round(x, dtype);
        self.ir.stores.push(Store::new(value, view(dtype, axes)));
    }

    /// A reduction of `x` over the axes where `axes` is `Broadcast`.
    fn reduce(&mut self, kind: ReduceKind, x: ValueId, dtype: DType, axes: &[Axis]) {
        self.ir.reductions.push(Reduction {
            kind,
            value: x,
            reduced: axes.iter().map(|&a| a == B).collect(),
            view: view(dtype, axes),
        });
    }
}

fn f64_of(k: &mut K, x: ValueId) -> ValueId {
    match k.ir.prec(x) {
        Prec::F32 => k.push(Instr::Widen { x }),
        Prec::F64 => x,
        Prec::I64 => k.round(x, DType::F64),
    }
}

/// Every binary operator and function at `prec`, on loads `a`, `b` (already at `prec`),
/// folded into one value so that none is dead.
fn everything(k: &mut K, a: ValueId, b: ValueId, prec: Prec) -> ValueId {
    let mut acc = a;
    for op in [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Lt,
        BinOp::Le,
        BinOp::Gt,
        BinOp::Ge,
        BinOp::Eq,
        BinOp::Ne,
    ] {
        let x = k.bin(op, a, b);
        acc = k.bin(BinOp::Add, acc, x);
    }
    for func in Func::ALL {
        let args: Vec<ValueId> = match func.arity() {
            1 => vec![a],
            2 => vec![a, b],
            _ => vec![b, a, acc],
        };
        let x = k.call(func, &args);
        acc = k.bin(BinOp::Add, acc, x);
    }
    let n = k.push(Instr::Neg { x: acc, prec });
    for value in [
        0.5,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-40,
        3.4e38,
        -9223372036854775808.0,
    ] {
        let c = k.c(value, prec);
        acc = k.bin(BinOp::Add, acc, c);
    }
    k.bin(BinOp::Mul, acc, n)
}

/// The value of `x` at `dtype`'s compute precision, without rounding twice where avoidable.
fn at_prec_of(k: &mut K, x: ValueId, dtype: DType) -> ValueId {
    match (k.ir.prec(x), Prec::of(dtype)) {
        (Prec::F32, Prec::F64) => k.push(Instr::Widen { x }),
        (Prec::F64 | Prec::I64, Prec::F32) => k.round(x, DType::F32),
        (Prec::I64, Prec::F64) => k.round(x, DType::F64),
        (Prec::F32 | Prec::F64, Prec::I64) => k.round(x, DType::I64),
        _ => x,
    }
}

// ---------------------------------------------------------------------------------------------
// Compile checks.

/// Every instruction and function at both precisions; every dtype loaded, stored, and as a
/// `Round` target from f32 and from f64.
#[test]
fn every_instruction_function_and_dtype_compiles_without_warnings() {
    let mut kernels = Vec::new();
    for prec in [Prec::F32, Prec::F64, Prec::I64] {
        let mut k = K::new(2);
        let dtype = match prec {
            Prec::F32 => DType::F32,
            Prec::F64 => DType::F64,
            Prec::I64 => DType::I64,
        };
        let a = k.load(dtype, &[S, U]);
        let b = k.load(dtype, &[B, U]);
        let x = everything(&mut k, a, b, prec);
        k.store(x, dtype, &[S, U]);
        kernels.push(k.ir);
    }
    for dtype in DType::ALL {
        // Load `dtype`, round to every dtype from its compute precision and from the other.
        let mut k = K::new(1);
        let x = k.load(dtype, &[U]);
        for target in DType::ALL {
            let direct = k.round(x, target);
            let other = match k.ir.prec(x) {
                Prec::F32 => k.push(Instr::Widen { x }),
                Prec::F64 => k.round(x, DType::F32),
                Prec::I64 => k.round(x, DType::F64),
            };
            let via = k.round(other, target);
            let y = at_prec_of(&mut k, via, target);
            let y = k.bin(BinOp::Add, direct, y);
            k.store(y, target, &[U]);
        }
        kernels.push(k.ir);
    }
    check(&kernels);
}

/// Pointwise kernels of rank 1 to 4 with every view pattern, several stores of different
/// dtypes, and stores broadcast along inner and outer axes.
#[test]
fn view_patterns_and_ranks_compile() {
    let mut kernels = Vec::new();
    let patterns: [&[Axis]; 4] = [&[U], &[S, U], &[S, B, U], &[S, S, B, S]];
    for (rank, inner_loaded) in [
        (1, &[U][..]),
        (2, &[B, U]),
        (3, &[S, B, U]),
        (4, &[B, S, S, U]),
    ] {
        let mut k = K::new(rank);
        let full = vec![S; rank - 1];
        let mut unit = full.clone();
        unit.push(U);
        let mut strided = full.clone();
        strided.push(S);
        let mut bcast_inner = full.clone();
        bcast_inner.push(B);
        let a = k.load(DType::F16, &unit);
        let b = k.load(DType::BF16, &strided);
        let c = k.load(DType::F32, &bcast_inner);
        let d = k.load(DType::Bool, inner_loaded);
        let e = k.load(DType::I64, patterns[rank - 1]);
        let ab = k.bin(BinOp::Add, a, b);
        let abc = k.bin(BinOp::Mul, ab, c);
        let d32 = k.round(d, DType::F32);
        let e32 = k.round(e, DType::F32);
        let de = k.bin(BinOp::Sub, d32, e32);
        let x = k.bin(BinOp::Add, abc, de);
        k.store(x, DType::F16, &unit);
        k.store(x, DType::F32, &strided);
        k.store(x, DType::BF16, &bcast_inner);
        let mut outer_bcast = unit.clone();
        outer_bcast[0] = B;
        let wide = f64_of(&mut k, x);
        k.store(wide, DType::I32, &outer_bcast);
        k.store(wide, DType::Bool, &unit);
        kernels.push(k.ir);
    }
    // Only 8-byte types contiguous: vector width 2. Only bool: width 8 with 8-byte chunks.
    let mut k = K::new(2);
    let a = k.load(DType::F64, &[S, U]);
    k.store(a, DType::I64, &[S, U]);
    kernels.push(k.ir);
    let mut k = K::new(1);
    let a = k.load(DType::Bool, &[U]);
    k.store(a, DType::Bool, &[U]);
    kernels.push(k.ir);
    // No contiguous view: no vector path.
    let mut k = K::new(2);
    let a = k.load(DType::F32, &[S, S]);
    k.store(a, DType::F32, &[S, S]);
    kernels.push(k.ir);
    check(&kernels);
}

/// A kernel with every reduction kind over inner, outer, middle and all axes, several
/// reductions per group and several groups, with pointwise stores alongside.
fn reduction_kernels() -> Vec<KernelIr> {
    let mut kernels = Vec::new();
    // Rows: softmax-like statistics of the last axis, plus a pointwise store.
    let mut k = K::new(2);
    let x = k.load(DType::F16, &[S, U]);
    let e = k.call(Func::Exp, &[x]);
    k.store(e, DType::F16, &[S, U]);
    k.reduce(ReduceKind::Max, x, DType::F16, &[S, B]);
    k.reduce(ReduceKind::Sum, e, DType::F32, &[S, B]);
    k.reduce(ReduceKind::Mean, x, DType::BF16, &[S, B]);
    kernels.push(k.ir);
    // Columns: bias gradient (sum over the leading axes), i64 and bool outputs.
    let mut k = K::new(3);
    let x = k.load(DType::F32, &[S, S, U]);
    let w = k.push(Instr::Widen { x });
    k.reduce(ReduceKind::Sum, x, DType::F32, &[B, B, U]);
    // Integer outputs reduce integers (the lowering converts the value first).
    let wi = k.round(w, DType::I64);
    k.reduce(ReduceKind::Max, wi, DType::I64, &[B, B, U]);
    k.reduce(ReduceKind::Mean, w, DType::Bool, &[B, B, U]);
    kernels.push(k.ir);
    // Batch-norm-like: keep the middle axis; everything into f64 and i32.
    let mut k = K::new(4);
    let x = k.load(DType::F64, &[S, S, S, U]);
    k.reduce(ReduceKind::Mean, x, DType::F64, &[B, S, B, B]);
    let xi = k.round(x, DType::I64);
    k.reduce(ReduceKind::Sum, xi, DType::I32, &[B, S, B, B]);
    kernels.push(k.ir);
    // Several groups: over axis 0, over axis 1, over both, with a broadcast store.
    let mut k = K::new(2);
    let x = k.load(DType::BF16, &[S, U]);
    let y = k.load(DType::F32, &[B, U]);
    let xy = k.bin(BinOp::Mul, x, y);
    k.store(xy, DType::F32, &[B, U]);
    k.reduce(ReduceKind::Sum, xy, DType::F32, &[B, U]);
    k.reduce(ReduceKind::Max, xy, DType::F32, &[S, B]);
    k.reduce(ReduceKind::Mean, xy, DType::F16, &[B, B]);
    kernels.push(k.ir);
    // Rank 1: a full reduction.
    let mut k = K::new(1);
    let x = k.load(DType::I32, &[S]);
    k.reduce(ReduceKind::Sum, x, DType::I64, &[B]);
    kernels.push(k.ir);
    kernels
}

#[test]
fn reductions_compile_with_and_without_atomics() {
    let Some((atomic, deterministic)) = check(&reduction_kernels()) else {
        return;
    };
    assert!(atomic.contains("atom.global.add.f64"), "atomic sums");
    assert!(atomic.contains("atom.global.cas.b64"), "atomic max");
    assert!(
        atomic.contains("atom.global.add.u64"),
        "wrapping integer sums"
    );
    assert!(
        !deterministic.contains("atom."),
        "the deterministic module uses no atomics"
    );
    assert!(atomic.contains("shfl.sync.bfly.b32") && deterministic.contains("shfl.sync.bfly"));
    assert!(atomic.contains("bar.sync"), "block reductions");
}

/// The vector path really moves 16-byte chunks (and 8-byte ones for bool).
#[test]
fn vector_path_uses_wide_accesses() {
    let mut k = K::new(2);
    let a = k.load(DType::F16, &[S, U]);
    let b = k.load(DType::F32, &[S, U]);
    let a32 = k.bin(BinOp::Add, a, b);
    k.store(a32, DType::F16, &[S, U]);
    let mut bools = K::new(1);
    let x = bools.load(DType::Bool, &[U]);
    bools.store(x, DType::Bool, &[U]);
    let Some((ptx, _)) = check(&[k.ir, bools.ir]) else {
        return;
    };
    assert!(ptx.contains("ld.global.v4.u32") || ptx.contains("ld.global.v4.b32"));
    assert!(ptx.contains("st.global.v4.u32") || ptx.contains("st.global.v4.b32"));
    assert!(ptx.contains("ld.global.v2.u32") || ptx.contains("ld.global.v2.b32"));
}

/// `a * b + c` stays two roundings even where NVRTC may contract (`--fmad=true`, its
/// default): the reference rounds the product before adding. Division and square root are the
/// IEEE-rounded instructions even under `--prec-div=false --prec-sqrt=false`.
#[test]
fn arithmetic_is_never_contracted_or_approximated() {
    if nvrtc().is_none() {
        return;
    }
    let mut kernels = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        let mut k = K::new(1);
        let a = k.load(dtype, &[U]);
        let b = k.load(dtype, &[U]);
        let c = k.load(dtype, &[U]);
        let ab = k.bin(BinOp::Mul, a, b);
        let abc = k.bin(BinOp::Add, ab, c);
        let q = k.bin(BinOp::Div, abc, c);
        let r = k.call(Func::Sqrt, &[q]);
        let s = k.call(Func::Rsqrt, &[r]);
        k.store(s, dtype, &[U]);
        kernels.push(k.ir);
    }
    let named: Vec<(String, &KernelIr)> = kernels.iter().map(|k| (kernel_name(k), k)).collect();
    let source = emit_module(&named, &EmitOptions::default());
    let loose = ["--fmad=true", "--prec-div=false", "--prec-sqrt=false"];
    let ptx = compile(&source, "compute_90", &loose).unwrap_or_else(|log| panic!("{log}"));
    assert!(!ptx.contains("fma."), "no fused multiply-add");
    assert!(
        !ptx.contains(".approx"),
        "no approximate division or square root"
    );
    for op in ["mul.rn.f32", "add.rn.f32", "div.rn.f32", "sqrt.rn.f32"] {
        assert!(ptx.contains(op), "{op}");
    }
    for op in ["mul.rn.f64", "add.rn.f64", "div.rn.f64", "sqrt.rn.f64"] {
        assert!(ptx.contains(op), "{op}");
    }
}

// ---------------------------------------------------------------------------------------------
// Text properties.

#[test]
fn names_and_text_are_stable() {
    let kernels = reduction_kernels();
    let names: Vec<String> = kernels.iter().map(kernel_name).collect();
    for name in &names {
        assert_eq!(name.len(), 4 + 16);
        assert!(name.starts_with("fbc_"));
        assert!(name[4..].chars().all(|c| c.is_ascii_hexdigit()));
    }
    let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(distinct.len(), names.len());
    assert_eq!(kernel_name(&kernels[0].clone()), names[0]);
    let named: Vec<(String, &KernelIr)> = names.iter().cloned().zip(&kernels).collect();
    let options = EmitOptions::default();
    let once = emit_module(&named, &options);
    assert_eq!(once, emit_module(&named, &options));
    // A repeated entry is emitted once.
    let mut twice = named.clone();
    twice.push(named[0].clone());
    assert_eq!(emit_module(&twice, &options), once);
    // Accurate math only.
    for fast in [
        "__expf",
        "__logf",
        "__tanhf",
        "__sinf",
        "__powf",
        "__fdividef",
    ] {
        assert!(!once.contains(fast), "{fast}");
    }
}

/// Every entry point a plan names is defined in the module, in both modes.
#[test]
fn planned_entry_points_exist() {
    let kernels = reduction_kernels();
    let launch = |ir: &KernelIr| Launch {
        sizes: vec![3; ir.rank],
        strides: ir.views().map(|_| vec![1; ir.rank]).collect(),
        offsets: vec![0; ir.arg_count()],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: Vec::new(),
    };
    for deterministic in [false, true] {
        let options = EmitOptions { deterministic };
        for ir in &kernels {
            let name = kernel_name(ir);
            let text = emit_module(&[(name.clone(), ir)], &options);
            let p = plan(ir, &name, &launch(ir), 132, &options);
            let groups = abi::reduction_groups(ir).len();
            assert_eq!(
                p.launches.len(),
                groups + if deterministic { 1 } else { 2 },
                "init (atomic only), one pass per group, finish"
            );
            for l in &p.launches {
                assert!(
                    text.contains(&format!("void __launch_bounds__(FBC_BLOCK) {}(", l.entry)),
                    "{}",
                    l.entry
                );
            }
            assert_eq!(text.contains("_init_i32("), !deterministic);
        }
    }
}

/// The struct the emitter declares has the fields [`param_layout`] places, in order.
#[test]
fn emitted_struct_matches_the_layout() {
    for ir in reduction_kernels() {
        let name = kernel_name(&ir);
        let text = emit_module(&[(name.clone(), &ir)], &EmitOptions::default());
        let start = text.find(&format!("struct {name}_params {{")).unwrap();
        let body = &text[start..text[start..].find("};").unwrap() + start];
        // Each field is 8 bytes times its array extents.
        let mut offset = 0;
        let mut fields = Vec::new();
        for line in body.lines().skip(1) {
            let decl = line.trim().trim_end_matches(';');
            let field = decl.rsplit([' ', '*']).next().unwrap();
            let (field_name, extents) = field.split_once('[').unwrap_or((field, ""));
            let count: usize = extents
                .split(['[', ']'])
                .filter(|s| !s.is_empty())
                .map(|s| s.parse::<usize>().unwrap())
                .product();
            fields.push((field_name.to_string(), offset));
            offset += 8 * count.max(1);
        }
        let layout = param_layout(&ir);
        let at = |f: &str| fields.iter().find(|(n, _)| n == f).map(|&(_, o)| o);
        assert_eq!(at("p0"), Some(layout.ptrs));
        assert_eq!(at("q0"), Some(layout.scratch));
        assert_eq!(at("n"), Some(layout.sizes));
        assert_eq!(at("s"), Some(layout.strides));
        assert_eq!(at("o"), Some(layout.offsets));
        assert_eq!(at("vec"), Some(layout.vec));
        assert_eq!(at("lanes"), Some(layout.lanes));
        assert_eq!(at("split"), Some(layout.split));
        assert_eq!(offset, layout.bytes);
    }
}

// ---------------------------------------------------------------------------------------------
// ABI: layout, folding, index width, vector flag, grids.

fn pointwise(dtype: DType, rank: usize, load_axes: &[Axis], store_axes: &[Axis]) -> KernelIr {
    let mut k = K::new(rank);
    let x = k.load(dtype, load_axes);
    k.ir.stores.push(Store::new(x, view(dtype, store_axes)));
    k.ir
}

fn contiguous(ir: &KernelIr, sizes: &[i64]) -> Launch {
    let mut strides = Vec::new();
    for v in ir.views() {
        let mut s = vec![0; sizes.len()];
        let mut step = 1;
        for d in (0..sizes.len()).rev() {
            if v.axes[d] != B {
                s[d] = step;
                step *= sizes[d];
            }
        }
        strides.push(s);
    }
    Launch {
        sizes: sizes.to_vec(),
        strides,
        offsets: vec![0; ir.arg_count()],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: Vec::new(),
    }
}

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn param_block_bytes() {
    // Rank 2, a load [S, U] f32, a reduction over axis 1 into f32 [S, B].
    let mut k = K::new(2);
    let x = k.load(DType::F32, &[S, U]);
    k.reduce(ReduceKind::Sum, x, DType::F32, &[S, B]);
    let ir = k.ir;
    let launch = Launch {
        sizes: vec![5, 7],
        strides: vec![vec![9, 1], vec![1, 0]],
        offsets: vec![3, 2],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: Vec::new(),
    };
    let layout = param_layout(&ir);
    // 2 pointers, 1 scratch, 2 sizes, 2×2 strides, 2 offsets, vec, 1 lanes, 1 split.
    assert_eq!(
        [
            layout.ptrs,
            layout.scratch,
            layout.sizes,
            layout.strides,
            layout.offsets,
            layout.vec,
            layout.lanes,
            layout.split,
            layout.bytes
        ],
        [0, 16, 24, 40, 72, 88, 96, 104, 112]
    );
    let block = param_block(&ir, &launch, &[0x1000, 0x2000], &[0x3000]);
    assert_eq!(block.len(), 112);
    // Not folded (axis 0 is kept, axis 1 reduced); rows of 7 with 5 outputs: a warp each.
    assert_eq!(
        words(&block),
        vec![0x1000, 0x2000, 0x3000, 5, 7, 9, 1, 1, 0, 3, 2, 0, 32, 1]
    );
    // Negative strides and offsets are two's complement.
    let launch = Launch {
        sizes: vec![5, 7],
        strides: vec![vec![-7, 1], vec![1, 0]],
        offsets: vec![28, 0],
        maps: Vec::new(),
        ranges: Vec::new(),
        gathers: Vec::new(),
    };
    let w = words(&param_block(&ir, &launch, &[8, 16], &[24]));
    assert_eq!(w[5] as i64, -7);
    assert_eq!(w[9], 28);
}

#[test]
fn contiguous_axes_fold_into_the_inner_one() {
    let ir = pointwise(DType::F32, 3, &[S, S, U], &[S, S, U]);
    assert_eq!(fold(&ir, &contiguous(&ir, &[4, 5, 6])), vec![1, 1, 120]);
    // A transposed store stops the fold at the axis it breaks.
    let mut launch = contiguous(&ir, &[4, 5, 6]);
    launch.strides[1] = vec![6, 24, 1];
    assert_eq!(fold(&ir, &launch), vec![4, 5, 6]);
    launch.strides[1] = vec![31, 6, 1];
    assert_eq!(fold(&ir, &launch), vec![4, 1, 30]);
    // A view broadcast along an outer axis blocks it, unless that axis has size 1.
    let ir = pointwise(DType::F32, 2, &[B, U], &[S, U]);
    assert_eq!(fold(&ir, &contiguous(&ir, &[4, 6])), vec![4, 6]);
    assert_eq!(fold(&ir, &contiguous(&ir, &[1, 6])), vec![1, 6]);
    // Reductions fold reduced axes together and kept axes together, never one into the other.
    let mut k = K::new(3);
    let x = k.load(DType::F32, &[S, S, U]);
    k.reduce(ReduceKind::Sum, x, DType::F32, &[S, B, B]);
    let ir = k.ir;
    assert_eq!(fold(&ir, &contiguous(&ir, &[4, 5, 6])), vec![4, 1, 30]);
    let mut k = K::new(2);
    let x = k.load(DType::F32, &[S, U]);
    k.reduce(ReduceKind::Sum, x, DType::F32, &[S, B]);
    let ir = k.ir;
    assert_eq!(fold(&ir, &contiguous(&ir, &[4, 6])), vec![4, 6]);
    // Empty domains are left alone.
    let ir = pointwise(DType::F32, 2, &[S, U], &[S, U]);
    assert_eq!(fold(&ir, &contiguous(&ir, &[0, 6])), vec![0, 6]);
}

#[test]
fn index_width_switches_at_two_to_the_31() {
    let ir = pointwise(DType::Bool, 1, &[U], &[U]);
    let at = |size: i64, offset: i64| {
        let mut launch = contiguous(&ir, &[size]);
        launch.offsets = vec![offset, 0];
        let n = fold(&ir, &launch);
        needs_i64(&ir, &launch, &n)
    };
    let max = i64::from(i32::MAX);
    assert!(!at(max, 0), "2^31 - 1 elements: last index 2^31 - 2");
    assert!(at(max + 1, 0), "2^31 elements");
    assert!(!at(1000, max - 999), "last element at 2^31 - 1");
    assert!(at(1000, max - 998), "last element at 2^31");
    // Through strides: 2 rows of stride 2^30 reach 2^30 + 9.
    let ir2 = pointwise(DType::F32, 2, &[S, U], &[S, U]);
    let mut launch = contiguous(&ir2, &[2, 10]);
    launch.strides[0] = vec![1 << 30, 1];
    assert!(!needs_i64(&ir2, &launch, &launch.sizes));
    launch.strides[0] = vec![1 << 31, 1];
    assert!(needs_i64(&ir2, &launch, &launch.sizes));
    // Negative strides count too: from 2^31 - 10, two rows back of 2^30 - 5 reach element 0;
    // the terms `i0 * s` alone must fit as well (two steps of -2^30 - 1 do not).
    let mut launch = contiguous(&ir2, &[3, 10]);
    launch.offsets[0] = (1 << 31) - 10;
    launch.strides[0] = vec![-(1 << 30) + 5, 1];
    assert!(!needs_i64(&ir2, &launch, &launch.sizes));
    launch.strides[0] = vec![-(1 << 30) - 1, 1];
    assert!(needs_i64(&ir2, &launch, &launch.sizes));
    // And the entry point follows.
    let big = contiguous(&ir, &[max + 1]);
    let p = plan(&ir, "k", &big, 132, &EmitOptions::default());
    assert_eq!(p.launches[0].entry, "k_i64");
    let small = contiguous(&ir, &[max]);
    let p = plan(&ir, "k", &small, 132, &EmitOptions::default());
    assert_eq!(p.launches[0].entry, "k_i32");
}

#[test]
fn vector_flag_checks_alignment_and_row_length() {
    let ir = pointwise(DType::F16, 2, &[S, U], &[S, U]);
    assert_eq!(vector_width(&ir), 8);
    let launch = contiguous(&ir, &[3, 16]);
    let flag = |launch: &Launch, ptrs: &[u64]| {
        let n = fold(&ir, launch);
        let block = param_block(&ir, launch, ptrs, &[]);
        let w = words(&block)[param_layout(&ir).vec / 8];
        assert_eq!(w == 1, vector_ok(&ir, launch, &n, ptrs));
        w
    };
    assert_eq!(flag(&launch, &[0x1000, 0x2000]), 1);
    // A pointer 2 bytes off a 16-byte boundary.
    assert_eq!(flag(&launch, &[0x1002, 0x2000]), 0);
    assert_eq!(flag(&launch, &[0x1000, 0x2008]), 0);
    // An offset of 8 halves is 16 bytes: aligned; 4 halves is not.
    let mut shifted = launch.clone();
    shifted.offsets = vec![8, 0];
    assert_eq!(flag(&shifted, &[0x1000, 0x2000]), 1);
    shifted.offsets = vec![4, 0];
    assert_eq!(flag(&shifted, &[0x1000, 0x2000]), 0);
    // Rows not a multiple of 8 (and not foldable: row stride 20).
    let mut short = contiguous(&ir, &[3, 12]);
    short.strides[0] = vec![20, 1];
    assert_eq!(flag(&short, &[0x1000, 0x2000]), 0);
    // Row stride 24 halves = 48 bytes keeps every row aligned; 20 halves = 40 bytes does not.
    let mut rows = contiguous(&ir, &[3, 16]);
    rows.strides[0] = vec![24, 1];
    assert_eq!(flag(&rows, &[0x1000, 0x2000]), 1);
    rows.strides[0] = vec![20, 1];
    assert_eq!(flag(&rows, &[0x1000, 0x2000]), 0);
    // Folding makes a contiguous [6, 4] domain one row of 24, a multiple of 8.
    let mut narrow = contiguous(&ir, &[6, 4]);
    assert_eq!(flag(&narrow, &[0x1000, 0x2000]), 1);
    narrow.strides[1] = vec![5, 1];
    assert_eq!(flag(&narrow, &[0x1000, 0x2000]), 0);
    // Bool moves in 8-byte chunks at width 8; f64 alongside f32 gives width 4 (16-byte f32).
    let bools = pointwise(DType::Bool, 1, &[U], &[U]);
    assert_eq!(vector_width(&bools), 8);
    let l = contiguous(&bools, &[64]);
    assert!(vector_ok(&bools, &l, &l.sizes, &[0x1008, 0x2000]));
    assert!(!vector_ok(&bools, &l, &l.sizes, &[0x1004, 0x2000]));
    let mut k = K::new(1);
    let x = k.load(DType::F32, &[U]);
    let w = k.push(Instr::Widen { x });
    k.ir.stores.push(Store::new(w, view(DType::F64, &[U])));
    assert_eq!(vector_width(&k.ir), 4);
    let l = contiguous(&k.ir, &[64]);
    // f64 at width 4 is 32 bytes, moved as two 16-byte chunks: 16-byte alignment suffices.
    assert!(vector_ok(&k.ir, &l, &l.sizes, &[0x1010, 0x2010]));
    assert!(!vector_ok(&k.ir, &l, &l.sizes, &[0x1010, 0x2008]));
    // Kernels with reductions, or no contiguous view, have no vector path.
    assert_eq!(vector_width(&reduction_kernels()[0]), 1);
    assert_eq!(vector_width(&pointwise(DType::F32, 1, &[S], &[S])), 1);
}

fn launch_of(grid: u32) -> GpuLaunch {
    GpuLaunch {
        entry: String::new(),
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_bytes: 0,
        by_path: Vec::new(),
    }
}

#[test]
fn grid_sizes() {
    let ir = pointwise(DType::F32, 1, &[U], &[U]);
    let options = EmitOptions::default();
    let grid = |n: i64, sms: u32| {
        let p = plan(&ir, "k", &contiguous(&ir, &[n]), sms, &options);
        assert!(p.scratch_bytes.is_empty());
        let l = &p.launches[0];
        assert_eq!((l.block, l.shared_bytes), ((256, 1, 1), 0));
        assert_eq!(l.grid.1 * l.grid.2, 1);
        launch_of(l.grid.0)
    };
    // 1000 f32 at width 4: 250 threads, one block. 1001 is not a multiple of 4: 1001 threads.
    assert_eq!(grid(1000, 132), launch_of(1));
    assert_eq!(grid(1001, 132), launch_of(4));
    assert_eq!(grid(4 * 256 * 10, 132), launch_of(10));
    // Capped at 32 blocks per SM; no SM count means one SM.
    assert_eq!(grid(1 << 30, 132), launch_of(132 * BLOCKS_PER_SM));
    assert_eq!(grid(1 << 30, 0), launch_of(BLOCKS_PER_SM));
    // An empty domain launches nothing.
    let p = plan(&ir, "k", &contiguous(&ir, &[0]), 132, &options);
    assert!(p.launches.is_empty());
}

#[test]
fn reduction_plans() {
    // Rows of 4096 over 1024 outputs: a warp per row, no split needed (32768 threads < 2^18,
    // but each warp would get under 64 elements per lane if split: split = 2).
    let mut k = K::new(2);
    let x = k.load(DType::F32, &[S, U]);
    k.reduce(ReduceKind::Mean, x, DType::F32, &[S, B]);
    k.reduce(ReduceKind::Max, x, DType::F16, &[S, B]);
    let ir = k.ir;
    let launch = contiguous(&ir, &[1024, 4096]);
    let shapes = group_shapes(&ir, &launch.sizes);
    assert_eq!(shapes.len(), 1);
    let s = shapes[0];
    assert_eq!((s.outputs, s.count, s.lanes), (1024, 4096, 32));
    // wanted items = 2^18 / 32 = 8192 → ceil(8192 / 1024) = 8; pieces of ≥ 2048: 4096/2048 = 2.
    assert_eq!(s.split, 2);
    for deterministic in [false, true] {
        let options = EmitOptions { deterministic };
        let p = plan(&ir, "k", &launch, 132, &options);
        let entries: Vec<&str> = p.launches.iter().map(|l| l.entry.as_str()).collect();
        let grids: Vec<u32> = p.launches.iter().map(|l| l.grid.0).collect();
        if deterministic {
            assert_eq!(entries, ["k_g0_i32", "k_finish_i32"]);
            // 2048 items × 32 lanes / 256 = 256 blocks; finish: 1024 outputs = 4 blocks.
            assert_eq!(grids, [256, 4]);
            assert_eq!(p.scratch_bytes, vec![1024 * 2 * 8; 2]);
        } else {
            assert_eq!(entries, ["k_init_i32", "k_g0_i32", "k_finish_i32"]);
            assert_eq!(grids, [4, 256, 4]);
            assert_eq!(p.scratch_bytes, vec![1024 * 8; 2]);
        }
    }
    // A full reduction of 2^24 elements: a block per item, split to fill the device.
    let mut k = K::new(1);
    let x = k.load(DType::F32, &[U]);
    k.reduce(ReduceKind::Sum, x, DType::F32, &[B]);
    let ir = k.ir;
    let shapes = group_shapes(&ir, &[1 << 24]);
    assert_eq!(shapes[0].lanes, 256);
    // wanted = 2^18 / 256 = 1024 items; pieces of ≥ 4096: 2^24 / 4096 = 4096 → 1024.
    assert_eq!(shapes[0].split, 1024);
    // Columns: a thread per output, split along the reduced axis.
    let mut k = K::new(2);
    let x = k.load(DType::F32, &[S, U]);
    k.reduce(ReduceKind::Sum, x, DType::F32, &[B, U]);
    let ir = k.ir;
    let shapes = group_shapes(&ir, &[1 << 20, 64]);
    assert_eq!((shapes[0].lanes, shapes[0].outputs), (1, 64));
    // wanted = 2^18 threads / 64 outputs = 4096; pieces of ≥ 64 rows: 2^20 / 64 = 16384.
    assert_eq!(shapes[0].split, 4096);
    // Empty reductions still finish (sum 0, mean NaN), with no pass over elements… but the
    // pass launches since its items write the identity partials.
    let launch = contiguous(&ir, &[0, 64]);
    let p = plan(
        &ir,
        "k",
        &launch,
        132,
        &EmitOptions {
            deterministic: true,
        },
    );
    let entries: Vec<&str> = p.launches.iter().map(|l| l.entry.as_str()).collect();
    assert_eq!(entries, ["k_g0_i32", "k_finish_i32"]);
    assert_eq!(p.scratch_bytes, vec![64 * 8]);
    // No outputs: nothing to launch.
    let launch = contiguous(&ir, &[5, 0]);
    let p = plan(&ir, "k", &launch, 132, &EmitOptions::default());
    assert!(p.launches.is_empty());
    assert_eq!(p.scratch_bytes, vec![8]);
    assert_eq!(entry_name("k", "_g3", true), "k_g3_i64");
}

// ---------------------------------------------------------------------------------------------
// Emulation: the emitted text, compiled as C++ for the host against a small model of the CUDA
// features it uses, run launch by launch as the plan says, and compared element by element
// with the IR interpreter. This runs every index computation, the vector path, the pieces,
// the warp and block combination, the atomics and the finish exactly as written.

const SHIM: &str = r#"/* Host emulation of the CUDA features the emitted kernels use, so that the exact emitted text
   runs on the CPU in the tests: blocks run one after another, the threads of a block (as many
   as the launch says, up to 256) as fibers on the calling thread (shuffles and __syncthreads
   are barriers, where a fiber gives way to the next), __shared__ variables are statics.
   Fibers rather than OS threads: a barrier of 256 OS threads on a busy two-core machine
   waits for 256 time slices, and the emulated tests took minutes in the full suite. */
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <memory>
#include <ucontext.h>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
thread_local uint3 threadIdx, blockIdx, gridDim, blockDim;

static float emu_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t emu_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { return emu_u2f(x); }
inline unsigned __float_as_uint(float x) { return emu_f2u(x); }
inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long l; memcpy(&l, &x, 8); return l; }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float __double2float_rn(double v) { return (float)v; }
inline float __double2float_rz(double v) {
    float n = (float)v;
    return std::fabs((double)n) > std::fabs(v) ? std::nextafter(n, 0.0f) : n;
}

/* f16 / bf16 as bit patterns, converted with round to nearest even (NaN kept, quieted). */
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
inline float __half2float(__half h) {
    uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    float mag = e == 0x1f ? (m ? NAN : INFINITY)
              : e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(m | 0x400), (int)e - 25);
    return emu_u2f(emu_f2u(mag) | sign);
}
inline __half __float2half_rn(float x) {
    uint32_t f = emu_f2u(x), sign = (f >> 16) & 0x8000u;
    f &= 0x7fffffffu;
    uint32_t o;
    if (f > 0x7f800000u) o = 0x7e00u;
    else if (f >= 0x47800000u) o = 0x7c00u;   /* at or above 65520: Inf */
    else if (f < 0x38800000u) o = (uint32_t)std::nearbyint(std::ldexp((double)emu_u2f(f), 24));
    else o = (f - (112u << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
    return __half{(unsigned short)(o | sign)};
}
inline float __bfloat162float(__nv_bfloat16 b) { return emu_u2f((uint32_t)b.x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
    uint32_t f = emu_f2u(x);
    uint32_t r = x != x ? ((f >> 16) | 0x40u) : (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    return __nv_bfloat16{(unsigned short)r};
}

/* Atomics. */
inline double atomicAdd(double *at, double x) { return std::atomic_ref<double>(*at).fetch_add(x); }
inline unsigned long long atomicCAS(unsigned long long *at, unsigned long long expect, unsigned long long want) {
    std::atomic_ref<unsigned long long>(*at).compare_exchange_strong(expect, want);
    return expect;
}
inline unsigned long long atomicAdd(unsigned long long *at, unsigned long long x) {
    return std::atomic_ref<unsigned long long>(*at).fetch_add(x);
}
inline long long atomicMax(long long *at, long long x) {
    std::atomic_ref<long long> slot(*at);
    long long seen = slot.load();
    while (seen < x && !slot.compare_exchange_weak(seen, x)) {}
    return seen;
}

/* The running block's threads: fibers switched only at barriers. Even blocks run them in
   index order, odd blocks in reverse, so a read that misses a barrier finds its writer run
   before it in one block and after it in the next. Thread-local, so that test threads may
   run emulations side by side. */
struct EmuBarrier { unsigned expected, arrived, generation; };
struct EmuFiber { ucontext_t context; bool done; };
thread_local ucontext_t emu_scheduler;
thread_local EmuFiber *emu_fibers;
thread_local unsigned emu_running;
thread_local unsigned long long emu_progress;
thread_local EmuBarrier emu_block_barrier, emu_warp_barrier[8];
thread_local double emu_exchange[256];
thread_local long long emu_exchange_int[256];
thread_local void (*emu_body)(void *);
thread_local void *emu_body_arg;

static void emu_wait(EmuBarrier &b) {
    ++emu_progress;
    const unsigned generation = b.generation;
    if (++b.arrived == b.expected) { b.arrived = 0; ++b.generation; return; }
    while (b.generation == generation) swapcontext(&emu_fibers[emu_running].context, &emu_scheduler);
}
/* A finished thread: it no longer counts towards the barrier, which may now be complete. */
static void emu_drop(EmuBarrier &b) {
    ++emu_progress;
    if (--b.expected == b.arrived && b.arrived > 0) { b.arrived = 0; ++b.generation; }
}
inline void __syncthreads() { emu_wait(emu_block_barrier); }
inline double __shfl_xor_sync(unsigned, double v, int m) {
    const unsigned t = threadIdx.x, w = t / 32;
    emu_exchange[t] = v;
    emu_wait(emu_warp_barrier[w]);
    const double r = emu_exchange[(t & ~31u) | ((t % 32) ^ (unsigned)m)];
    emu_wait(emu_warp_barrier[w]);
    return r;
}
inline long long __shfl_xor_sync(unsigned, long long v, int m) {
    const unsigned t = threadIdx.x, w = t / 32;
    emu_exchange_int[t] = v;
    emu_wait(emu_warp_barrier[w]);
    const long long r = emu_exchange_int[(t & ~31u) | ((t % 32) ^ (unsigned)m)];
    emu_wait(emu_warp_barrier[w]);
    return r;
}

/* Dynamic shared memory of the running block (fbc_row_cache), sized by the launch. */
thread_local unsigned char *emu_dynamic_shared;

static void emu_fiber() {
    emu_body(emu_body_arg);
    const unsigned t = threadIdx.x;
    emu_drop(emu_warp_barrier[t / 32]);
    emu_drop(emu_block_barrier);
    emu_fibers[emu_running].done = true;
}

/* Fiber stacks, kept for the thread's later launches. */
constexpr size_t EMU_STACK = 256 * 1024;
thread_local std::vector<std::unique_ptr<char[]>> emu_stacks;

template <class F> static void emu_launch(unsigned grid, unsigned size, unsigned shared, F f) {
    emu_body = [](void *p) { (*static_cast<F *>(p))(); };
    emu_body_arg = &f;
    while (emu_stacks.size() < size) emu_stacks.emplace_back(new char[EMU_STACK]);
    std::vector<EmuFiber> fibers(size);
    emu_fibers = fibers.data();
    gridDim = {grid, 1, 1};
    blockDim = {size, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
        /* Fresh NaN-pattern bytes per block: a read before the block's own write shows. */
        std::vector<uint4> dynamic((shared + 15) / 16 + 1, uint4{~0u, ~0u, ~0u, ~0u});
        emu_dynamic_shared = reinterpret_cast<unsigned char *>(dynamic.data());
        blockIdx = {b, 0, 0};
        emu_block_barrier = {size, 0, 0};
        for (unsigned w = 0; w < size / 32; ++w) emu_warp_barrier[w] = {32, 0, 0};
        for (unsigned t = 0; t < size; ++t) {
            getcontext(&fibers[t].context);
            fibers[t].context.uc_stack.ss_sp = emu_stacks[t].get();
            fibers[t].context.uc_stack.ss_size = EMU_STACK;
            fibers[t].context.uc_link = &emu_scheduler;
            fibers[t].done = false;
            makecontext(&fibers[t].context, emu_fiber, 0);
        }
        for (unsigned left = size; left > 0;) {
            const unsigned long long before = emu_progress;
            for (unsigned k = 0; k < size; ++k) {
                const unsigned t = b % 2 ? size - 1 - k : k;
                if (fibers[t].done) continue;
                emu_running = t;
                threadIdx = {t, 0, 0};
                swapcontext(&emu_scheduler, &fibers[t].context);
                if (fibers[t].done) --left;
            }
            /* Every live thread waits at a barrier the others never reach: a hang on a GPU. */
            if (left > 0 && emu_progress == before) {
                fprintf(stderr, "emulation: block %u deadlocks at a barrier\n", b);
                abort();
            }
        }
    }
}
"#;

/// A compiled emulation of one kernel in one mode.
struct Emulated {
    library: libloading::Library,
    name: String,
}

/// How g++ compiles the emulated modules and their precompiled shim.
const EMULATION_FLAGS: &[&str] = &[
    "-std=c++20",
    "-O0",
    "-fPIC",
    "-pthread",
    "-ffp-contract=off",
    "-Wall",
    "-Wno-unknown-pragmas",
    "-Werror",
];

/// The first 8 bytes of `text`'s SHA-256, in hex: the emulation's file names.
fn short_digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// `stem` made unique to this process and call: files written under such names and then
/// renamed into place are never seen half-written by a concurrent build.
fn unique_name(stem: &str) -> String {
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let build = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{stem}.{}.{build}", std::process::id())
}

/// [`SHIM`] as a header in `dir` with its precompiled form beside it (g++ reads
/// `shim-*.hpp.gch` in place of the header when the flags match), built once per test
/// process: the shim's standard headers were most of each module's compile time. `None`
/// when it cannot be built; the modules then include the shim's text.
fn shim_header(dir: &std::path::Path) -> Option<PathBuf> {
    static HEADER: OnceLock<Option<PathBuf>> = OnceLock::new();
    HEADER
        .get_or_init(|| {
            let stem = format!(
                "shim-{}",
                short_digest(&format!("{SHIM}{EMULATION_FLAGS:?}"))
            );
            let header = dir.join(format!("{stem}.hpp"));
            let compiled = dir.join(format!("{stem}.hpp.gch"));
            if !compiled.exists() {
                let unique = unique_name(&stem);
                let text = dir.join(format!("{unique}.hpp"));
                std::fs::write(&text, SHIM).ok()?;
                std::fs::rename(&text, &header).ok()?;
                let tmp = dir.join(format!("{unique}.gch"));
                let out = std::process::Command::new("g++")
                    .args(EMULATION_FLAGS)
                    .args(["-x", "c++-header", "-o"])
                    .arg(&tmp)
                    .arg(&header)
                    .output()
                    .ok()?;
                if !out.status.success() {
                    return None;
                }
                std::fs::rename(&tmp, &compiled).ok()?;
            }
            Some(header)
        })
        .clone()
}

/// Compiles `ir`'s module for the host, or `None` (with a message) without a C++ compiler.
fn emulate(ir: &KernelIr, options: &EmitOptions) -> Option<Emulated> {
    let name = kernel_name(ir);
    let module = emit_module(&[(name.clone(), ir)], options);
    let body = module.replace("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n", "");
    assert_ne!(body, module, "the prelude's includes moved");
    // `extern __shared__` has no host spelling: the row cache is the emulated block's buffer.
    let dynamic = "__device__ __forceinline__ unsigned char *fbc_row_cache() {\n    extern __shared__ __align__(16) unsigned char fbc_row_cache_bytes[];\n    return fbc_row_cache_bytes;\n}\n";
    let body2 = body.replace(
        dynamic,
        "inline unsigned char *fbc_row_cache() { return emu_dynamic_shared; }\n",
    );
    assert_ne!(body2, body, "the prelude's fbc_row_cache moved");
    let body = body2;
    let dir = std::env::temp_dir().join("fusebox-cuda-emulation");
    std::fs::create_dir_all(&dir).ok()?;
    let mut source = match shim_header(&dir) {
        Some(header) => format!("#include \"{}\"\n{body}\n", header.display()),
        None => format!("{SHIM}\n{body}\n"),
    };
    let mut parts = vec![String::new()];
    if ir.is_row_kernel() {
        parts = abi::row_paths(ir).into_iter().map(abi::row_part).collect();
    } else if !ir.reductions.is_empty() {
        parts = (0..abi::reduction_groups(ir).len())
            .map(|g| format!("_g{g}"))
            .collect();
        if !options.deterministic {
            parts.insert(0, "_init".to_string());
        }
        parts.push("_finish".to_string());
    }
    for part in &parts {
        for wide in [false, true] {
            let entry = entry_name(&name, part, wide);
            source.push_str(&format!(
                "extern \"C\" int run_{entry}(const unsigned char *block, unsigned long long len, unsigned grid, unsigned threads, unsigned shared) {{\n\
                 \x20   {name}_params p;\n\
                 \x20   if (len != sizeof p) return 1;\n\
                 \x20   if (threads % 32 != 0 || threads > 256) return 2;\n\
                 \x20   if (shared > 48 * 1024) return 3;\n\
                 \x20   memcpy(&p, block, sizeof p);\n\
                 \x20   emu_launch(grid, threads, shared, [&] {{ {entry}(p); }});\n\
                 \x20   return 0;\n}}\n"
            ));
        }
    }
    let hex = short_digest(&source);
    let lib = dir.join(format!("{hex}.so"));
    if !lib.exists() {
        let unique = unique_name(&hex);
        let src = dir.join(format!("{unique}.cpp"));
        std::fs::write(&src, &source).ok()?;
        let tmp = dir.join(format!("{unique}.so"));
        let out = std::process::Command::new("g++")
            .args(EMULATION_FLAGS)
            .args(["-shared", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output();
        match out {
            Err(e) => {
                eprintln!("skipping emulation: no g++ ({e})");
                return None;
            }
            Ok(out) if !out.status.success() => panic!(
                "g++ failed on the emulated module {}:\n{}",
                src.display(),
                String::from_utf8_lossy(&out.stderr)
            ),
            Ok(_) => std::fs::rename(&tmp, &lib).ok()?,
        }
    }
    let library = unsafe { libloading::Library::new(&lib) }.ok()?;
    Some(Emulated { library, name })
}

/// 16-byte aligned host memory standing in for device memory, with the data starting
/// `shift` bytes in (to misalign it on purpose).
struct DeviceBuf {
    words: Vec<u128>,
    shift: usize,
}

impl DeviceBuf {
    fn new(bytes: usize, shift: usize, fill: u8) -> DeviceBuf {
        let mut words = vec![0u128; (bytes + shift).div_ceil(16).max(1)];
        let all = unsafe {
            std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, words.len() * 16)
        };
        all.fill(fill);
        DeviceBuf { words, shift }
    }

    fn ptr(&mut self) -> *mut u8 {
        unsafe { (self.words.as_mut_ptr() as *mut u8).add(self.shift) }
    }
}

/// How an emulated launch runs: 64-bit indexing when `wide`; a row kernel on the path
/// `force` gives (see [`force_row_path`]) instead of the host's choice.
#[derive(Debug, Clone, Copy, Default)]
struct Mode {
    wide: bool,
    force: Option<RowPath>,
}

/// Runs `launch` of `ir` through the emulation, on copies of `buffers` in `DeviceBuf`s
/// shifted by `shifts` bytes, with every entry point replaced by its 64-bit variant when
/// `wide`; the buffers are updated in place. Returns the parameter block's `vec` word.
fn run_emulated(
    emulated: &Emulated,
    ir: &KernelIr,
    launch: &Launch,
    buffers: &mut [Buffer],
    shifts: &[usize],
    mode: Mode,
    options: &EmitOptions,
) -> u64 {
    let Mode { wide, force } = mode;
    let mut device: Vec<DeviceBuf> = buffers
        .iter()
        .zip(shifts)
        .map(|(b, &shift)| {
            let mut d = DeviceBuf::new(b.byte_len(), shift, 0);
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), d.ptr(), b.byte_len()) };
            d
        })
        .collect();
    let mut p = plan(ir, &emulated.name, launch, 1, options);
    // Scratch starts as NaN bytes: every slot must be initialised or written before it is read.
    let mut scratch: Vec<DeviceBuf> = p
        .scratch_bytes
        .iter()
        .map(|&b| DeviceBuf::new(b, 0, 0xff))
        .collect();
    let ptrs: Vec<u64> = device.iter_mut().map(|d| d.ptr() as u64).collect();
    let scratch_ptrs: Vec<u64> = scratch.iter_mut().map(|d| d.ptr() as u64).collect();
    let mut block = param_block(ir, launch, &ptrs, &scratch_ptrs);
    if let Some(path) = force.filter(|_| ir.is_row_kernel()) {
        force_row_path(ir, launch, &mut block, &mut p, path);
    }
    let block_words = words(&block);
    for l in &p.launches {
        let entry = l.entry_for(&block_words, param_layout(ir).vec / 8);
        let entry = if wide {
            entry.replace("_i32", "_i64")
        } else {
            entry.to_string()
        };
        let symbol = format!("run_{entry}");
        let run: libloading::Symbol<unsafe extern "C" fn(*const u8, u64, u32, u32, u32) -> i32> =
            unsafe { emulated.library.get(symbol.as_bytes()) }.expect("entry wrapper");
        let status = unsafe {
            run(
                block.as_ptr(),
                block.len() as u64,
                l.grid.0,
                l.block.0,
                l.shared_bytes,
            )
        };
        assert_eq!(
            status, 0,
            "{entry}: parameter block size differs from the struct (1), a block of {} threads (2) \
             or over 48 KiB of shared memory (3)",
            l.block.0
        );
    }
    for (b, d) in buffers.iter_mut().zip(device.iter_mut()) {
        let len = b.byte_len();
        unsafe { std::ptr::copy_nonoverlapping(d.ptr(), b.as_mut_ptr(), len) };
    }
    words(&block)[param_layout(ir).vec / 8]
}

/// Makes a row kernel's launch take `path` instead of the host's choice where `path` is
/// valid for it (shared memory and re-reading always are; registers only where the row fits
/// them, and vectors only where the host found them aligned), with the shared memory the
/// shared path needs. Lets short rows run every path of the kernel text.
fn force_row_path(
    ir: &KernelIr,
    launch: &Launch,
    block: &mut [u8],
    p: &mut LaunchPlan,
    path: RowPath,
) {
    let at = param_layout(ir).vec;
    let natural = words(block)[at / 8];
    let valid = match path {
        RowPath::Reread | RowPath::Shared => true,
        RowPath::Registers => natural >= RowPath::Registers as u64,
        RowPath::RegistersVector => natural == RowPath::RegistersVector as u64,
    };
    if !valid {
        return;
    }
    block[at..at + 8].copy_from_slice(&(path as u64).to_le_bytes());
    let len = fold(ir, launch)[ir.rank - 1];
    let shared: i64 = abi::row_cached(ir)
        .iter()
        .map(|&v| (len * ir.loads[v].dtype.size_bytes() as i64 + 15) / 16 * 16)
        .sum();
    for l in &mut p.launches {
        l.shared_bytes = if path == RowPath::Shared {
            shared as u32
        } else {
            0
        };
    }
}

/// Elements each argument of `launch` needs (its largest index plus one; through an index
/// map, the largest element its last stage reaches).
fn buffer_lens(ir: &KernelIr, launch: &Launch) -> Vec<usize> {
    (0..ir.arg_count())
        .map(|a| {
            let mut last = launch.offsets[a];
            for (d, &n) in launch.sizes.iter().enumerate() {
                if n > 0 {
                    last += (n - 1) * launch.strides[a][d].max(0);
                }
            }
            if let Some(stage) = launch.stages(a).last() {
                last = stage.offset;
                for (&n, &s) in stage.sizes.iter().zip(&stage.strides) {
                    last += (n - 1) * s.max(0);
                }
            }
            (last + 1) as usize
        })
        .collect()
}

/// A kernel reading two index maps — x `[4, 6]` transposed and read as `[3, 8]` (one stage),
/// and the same positions through a second stage — plus a strided f16 load, a mapped load
/// broadcast along the inner axis, and one store.
fn index_map_kernel() -> (KernelIr, Launch) {
    let mut k = K::new(2);
    let a = k.load(DType::F32, &[S, S]);
    let b = k.load(DType::F16, &[S, U]);
    let c = k.load(DType::F32, &[S, S]);
    let d = k.load(DType::F32, &[S, B]);
    let ab = k.bin(BinOp::Mul, a, b);
    let abc = k.bin(BinOp::Add, ab, c);
    let y = k.bin(BinOp::Sub, abc, d);
    k.store(y, DType::F32, &[S, U]);
    k.ir.loads[0].stages = vec![2];
    k.ir.loads[2].stages = vec![2, 2];
    k.ir.loads[3].stages = vec![3];
    assert_eq!(k.ir.verify(), Ok(()));
    let transpose = MapStage {
        offset: 0,
        sizes: vec![6, 4],
        strides: vec![1, 6],
    };
    let launch = Launch {
        sizes: vec![3, 8],
        strides: vec![vec![8, 1], vec![8, 1], vec![8, 1], vec![2, 0], vec![8, 1]],
        offsets: vec![0, 0, 0, 1, 0],
        ranges: Vec::new(),
        gathers: Vec::new(),
        maps: vec![
            vec![transpose.clone()],
            vec![],
            vec![
                transpose,
                MapStage {
                    offset: 0,
                    sizes: vec![2, 12],
                    strides: vec![1, 2],
                },
            ],
            vec![MapStage {
                offset: 2,
                sizes: vec![2, 2, 2],
                strides: vec![-1, 6, 2],
            }],
        ],
    };
    (k.ir, launch)
}

/// Index maps compile without warnings for sm_80 and sm_90, their parameter block carries
/// the stages after the offsets, and the emulated kernel reads the elements the interpreter
/// reads, with 32- and 64-bit indexing.
#[test]
fn index_maps_compile_and_match_the_interpreter() {
    let (ir, launch) = index_map_kernel();
    check(std::slice::from_ref(&ir));
    let source = emit_module(&[(kernel_name(&ir), &ir)], &EmitOptions::default());
    assert!(
        source
            .contains("p2: load f32 [strided, strided] through an index map, stages of rank 2, 2")
    );
    assert!(source.contains("long long m[22];"), "{source}");
    let layout = param_layout(&ir);
    assert_eq!(layout.vec - layout.maps, 8 * ir.map_word_count());
    assert_eq!(ir.map_word_count(), 5 + 5 + 5 + 7);
    let ptrs = vec![0u64; ir.arg_count()];
    let block = words(&param_block(&ir, &launch, &ptrs, &[]));
    let maps: Vec<i64> = block[layout.maps / 8..layout.vec / 8]
        .iter()
        .map(|&w| w as i64)
        .collect();
    assert_eq!(maps, launch.map_words());
    assert_eq!(&maps[..5], &[0, 6, 4, 1, 6]);
    assert_eq!(
        vector_width(&ir),
        8,
        "the f16 load and the store are contiguous"
    );
    let options = EmitOptions::default();
    let Some(emulated) = emulate(&ir, &options) else {
        return;
    };
    let n = ir.arg_count();
    for wide in [false, true] {
        let (got, _) = agree(
            &emulated,
            &ir,
            &launch,
            &vec![0; n],
            wide,
            &options,
            5,
            true,
        );
        // Independently: y = x[t] · b + x[t'] - x[m] at (i, j), position p = 8i + j.
        let x = |a: usize, at: i64| got[a].get(at as usize);
        for p in 0..24i64 {
            let t = (p % 4) * 6 + p / 4;
            let q2 = t;
            let second = q2 / 12 + (q2 % 12) * 2;
            let i = p / 8;
            let m = 1 + 2 * i;
            let third = 2 - (m / 4) + (m / 2 % 2) * 6 + (m % 2) * 2;
            let want = (x(0, t) as f32 * x(1, p) as f32 + x(2, second) as f32) - x(3, third) as f32;
            let y = got[4].get(p as usize);
            assert!(
                y.to_bits() == f64::from(want).to_bits() || (y.is_nan() && want.is_nan()),
                "element {p}: {y} vs {want}"
            );
        }
    }
}

/// Buffers for every argument: inputs filled with small integers and halves (so every sum is
/// exact in f64 and the order of accumulation cannot show), outputs with a sentinel that
/// unwritten elements keep.
fn make_buffers(ir: &KernelIr, launch: &Launch, seed: u64, specials: bool) -> Vec<Buffer> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let views: Vec<&View> = ir.views().collect();
    buffer_lens(ir, launch)
        .into_iter()
        .enumerate()
        .map(|(a, len)| {
            let mut b = Buffer::zeroed(views[a].dtype, &[len]);
            if a < ir.loads.len() {
                for i in 0..len {
                    let r = next();
                    let v = match r % 16 {
                        0 if specials => f64::NAN,
                        1 if specials => -0.0,
                        2 => 0.5,
                        _ => f64::from(r % 17) - 8.0,
                    };
                    b.set(i, v);
                }
            } else {
                b.fill_bytes(0x5a);
            }
            b
        })
        .collect()
}

/// Whether two buffers hold the same elements: NaN equal to NaN, and -0 distinct from +0
/// unless `any_zero` (the interpreter's max reduction leaves the sign of a zero maximum to
/// the order it meets the zeros in; the GPU orders -0 below +0, so the result is +0 in any
/// order).
fn same(a: &Buffer, b: &Buffer, any_zero: bool) -> Result<(), String> {
    for i in 0..a.len() {
        let (x, y) = (a.get(i), b.get(i));
        let zeros = any_zero && x == 0.0 && y == 0.0;
        if !(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()) || zeros) {
            return Err(format!("element {i}: {x:?} vs {y:?}"));
        }
    }
    Ok(())
}

/// Runs `launch` through the emulation and the interpreter and compares every output.
/// Returns the emulated outputs and the `vec` flag.
#[allow(clippy::too_many_arguments)]
fn agree(
    emulated: &Emulated,
    ir: &KernelIr,
    launch: &Launch,
    shifts: &[usize],
    wide: bool,
    options: &EmitOptions,
    seed: u64,
    specials: bool,
) -> (Vec<Buffer>, u64) {
    let mut got = make_buffers(ir, launch, seed, specials);
    let mut want = got.clone();
    let mut refs: Vec<&mut Buffer> = want.iter_mut().collect();
    interpret::run(ir, launch, &mut refs);
    let mode = Mode { wide, force: None };
    let vec = run_emulated(emulated, ir, launch, &mut got, shifts, mode, options);
    let first_reduction = ir.loads.len() + ir.stores.len();
    for a in ir.loads.len()..ir.arg_count() {
        let max =
            a >= first_reduction && ir.reductions[a - first_reduction].kind == ReduceKind::Max;
        if let Err(e) = same(&got[a], &want[a], max) {
            panic!(
                "argument {a} of {} (sizes {:?}, wide {wide}, {options:?}, vec {vec}): {e}",
                emulated.name, launch.sizes
            );
        }
    }
    (got, vec)
}

/// A pointwise kernel of every view pattern and several store dtypes, including stores
/// broadcast along an outer and along the inner axis.
fn pointwise_mix() -> KernelIr {
    let mut k = K::new(3);
    let a = k.load(DType::F16, &[S, S, U]);
    let b = k.load(DType::F32, &[B, S, U]);
    let c = k.load(DType::BF16, &[S, B, B]);
    let d = k.load(DType::Bool, &[S, S, S]);
    let ab = k.bin(BinOp::Mul, a, b);
    let abc = k.call(Func::Max, &[ab, c]);
    let d32 = k.round(d, DType::F32);
    let half = k.c(0.5, Prec::F32);
    let sel = k.call(Func::Select, &[d32, abc, half]);
    let fl = k.call(Func::Floor, &[sel]);
    let x = k.bin(BinOp::Sub, sel, fl);
    let y = k.bin(BinOp::Add, x, abc);
    k.store(y, DType::F16, &[S, S, U]);
    k.store(abc, DType::F32, &[B, S, U]);
    let w = k.push(Instr::Widen { x: y });
    k.store(w, DType::I32, &[S, S, B]);
    k.store(w, DType::Bool, &[S, S, U]);
    k.ir
}

#[test]
fn emulated_pointwise_kernels_match_the_interpreter() {
    let ir = pointwise_mix();
    let options = EmitOptions::default();
    let Some(emulated) = emulate(&ir, &options) else {
        return;
    };
    let n = ir.arg_count();
    // Contiguous and aligned: folded to one row of 192, vector path.
    let launch = contiguous(&ir, &[3, 4, 16]);
    let (_, vec) = agree(
        &emulated,
        &ir,
        &launch,
        &vec![0; n],
        false,
        &options,
        1,
        true,
    );
    assert_eq!(vec, 1);
    let (_, vec) = agree(
        &emulated,
        &ir,
        &launch,
        &vec![0; n],
        true,
        &options,
        2,
        true,
    );
    assert_eq!(vec, 1);
    // One buffer 2 bytes off: scalar path, same results.
    let mut shifts = vec![0; n];
    shifts[0] = 2;
    let (_, vec) = agree(&emulated, &ir, &launch, &shifts, false, &options, 3, true);
    assert_eq!(vec, 0);
    // Rows of 7: scalar path over an unfolded domain; transposed outputs.
    let mut launch = contiguous(&ir, &[5, 3, 7]);
    let (_, vec) = agree(
        &emulated,
        &ir,
        &launch,
        &vec![0; n],
        false,
        &options,
        4,
        true,
    );
    assert_eq!(vec, 0);
    launch.strides[4] = vec![7, 35, 1];
    launch.offsets[4] = 3;
    agree(
        &emulated,
        &ir,
        &launch,
        &vec![0; n],
        false,
        &options,
        5,
        true,
    );
    // Outer rows padded to 24 elements: vector path without folding.
    let mut launch = contiguous(&ir, &[2, 3, 16]);
    for a in [0, 4, 7] {
        launch.strides[a] = vec![3 * 24, 24, 1];
    }
    let (_, vec) = agree(
        &emulated,
        &ir,
        &launch,
        &vec![0; n],
        false,
        &options,
        6,
        true,
    );
    assert_eq!(vec, 1);
    // Vector width 8 with bool (8-byte chunks) beside f64 (64-byte runs, four chunks).
    let mut k = K::new(2);
    let x = k.load(DType::Bool, &[S, U]);
    let y = k.load(DType::F64, &[S, U]);
    let xy = k.bin(BinOp::Add, x, y);
    k.store(xy, DType::F64, &[S, U]);
    k.store(xy, DType::Bool, &[S, U]);
    let ir = k.ir;
    let emulated = emulate(&ir, &options).expect("compiled before");
    let launch = contiguous(&ir, &[3, 40]);
    let (_, vec) = agree(
        &emulated,
        &ir,
        &launch,
        &[0, 0, 0, 0],
        false,
        &options,
        7,
        true,
    );
    assert_eq!(vec, 1);
    // f64 runs of 8 move as 16-byte chunks: 8 bytes off breaks them; bool runs are 8 bytes.
    for (shifts, seed, flag) in [
        ([0, 8, 0, 0], 8, 0),
        ([8, 0, 0, 8], 9, 1),
        ([4, 0, 0, 0], 10, 0),
    ] {
        let (_, vec) = agree(
            &emulated, &ir, &launch, &shifts, false, &options, seed, true,
        );
        assert_eq!(vec, flag, "shifts {shifts:?}");
    }
}

#[test]
fn emulated_reductions_match_the_interpreter() {
    let kernels = reduction_kernels();
    // (kernel, sizes): rows by warps; rows by blocks (3 outputs of 9000, in 3 pieces); columns
    // split 64 ways; the middle axis kept; several groups; a full reduction; empty reductions.
    let cases: [(usize, &[i64]); 9] = [
        (0, &[5, 37]),
        (0, &[3, 9000]),
        (1, &[4096, 1, 3]),
        (1, &[0, 2, 5]),
        (2, &[2, 3, 4, 5]),
        (3, &[6, 10]),
        (3, &[70, 3]),
        (4, &[10000]),
        (4, &[0]),
    ];
    for deterministic in [false, true] {
        let options = EmitOptions { deterministic };
        for &(kernel, sizes) in &cases {
            let ir = &kernels[kernel];
            let Some(emulated) = emulate(ir, &options) else {
                return;
            };
            let launch = contiguous(ir, sizes);
            let shifts = vec![0; ir.arg_count()];
            let (first, _) = agree(&emulated, ir, &launch, &shifts, false, &options, 11, true);
            agree(&emulated, ir, &launch, &shifts, true, &options, 12, false);
            if deterministic {
                let (again, _) = agree(&emulated, ir, &launch, &shifts, false, &options, 11, true);
                for (a, b) in first.iter().zip(&again) {
                    same(a, b, false).expect("deterministic runs agree bit for bit");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row kernels: real graphs (softmax, log-softmax, layernorm, integer sums) lowered as `fusebox
// run` lowers them, compiled with NVRTC, and run through the emulation above as whole programs
// against the reference evaluator.

/// Sums over rows (no max: a max of an empty row is refused), their mean, and the row's
/// values shifted by both; the per-row results are outputs too (stores with one element per
/// row, which an empty row must still write).
fn row_sums_graph(dtype: DType, shape: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("row_sums");
    let x = b.input("x", dtype, shape);
    let s = last_axis(&mut b, "s", "sum", &x);
    let d = b.op("d", "sub", &[&x, &s]);
    if dtype.is_float() {
        let m = last_axis(&mut b, "m", "mean", &x);
        let e = b.op("e", "add", &[&m, &s]);
        let y = b.op("y", "mul", &[&d, &e]);
        b.finish(&[&y, &s, &e])
    } else {
        b.finish(&[&d, &s])
    }
}

/// Integer row reductions: a wrapping sum and a max read back along the rows.
fn int_rows_graph(dtype: DType, shape: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("int_rows");
    let x = b.input("x", dtype, shape);
    let s = last_axis(&mut b, "s", "sum", &x);
    let m = last_axis(&mut b, "m", "reduce_max", &x);
    let d = b.op("d", "sub", &[&x, &m]);
    let y = b.op("y", "add", &[&d, &s]);
    b.finish(&[&y, &m])
}

/// `graph` optimized and lowered as the CUDA backend does (the same partition as the CPU's).
fn lowered(graph: &Graph) -> Program {
    let rules = random_graph::rules();
    let optimized = optimize(graph, rules, &Options::default())
        .unwrap_or_else(|e| panic!("optimize: {e}\n{}", graph::file::to_ron(graph)));
    lower::lower(&optimized.dag, &optimized.partition).expect("lower")
}

/// Runs kernel step `k` of `program` through the emulation on `values`. `None` without a C++
/// compiler.
fn emulate_step(
    program: &Program,
    k: &fusebox::lower::KernelStep,
    values: &mut HashMap<Value, Buffer>,
    emulated: &mut BTreeMap<String, Emulated>,
    mode: Mode,
) -> Option<()> {
    let options = EmitOptions::default();
    let dag = &program.dag;
    let fresh = |v: Value| {
        let ty = dag.ty(v);
        let mut b = Buffer::try_zeroed(ty.dtype, &ty.shape).expect("buffer");
        b.fill_bytes(0x5a);
        b
    };
    let ir = &program.kernels[k.kernel];
    let name = kernel_name(ir);
    if !emulated.contains_key(&name) {
        emulated.insert(name.clone(), emulate(ir, &options)?);
    }
    // A value several arguments write (a concat written in place, by stores or
    // by reductions' results) gets a copy per argument, as in the interpreter:
    // the first holds the result once the later ones hand back what they reach.
    let loads = ir.loads.len();
    let first_of = |a: usize| k.args[loads..a].iter().position(|&w| w == k.args[a]);
    let mut owned: Vec<Buffer> = Vec::with_capacity(k.args.len());
    for (a, &v) in k.args.iter().enumerate() {
        owned.push(if a < loads {
            values[&v].clone()
        } else if let Some(f) = first_of(a) {
            owned[loads + f].clone()
        } else {
            values.remove(&v).unwrap_or_else(|| fresh(v))
        });
    }
    let shifts = vec![0; owned.len()];
    run_emulated(
        &emulated[&name],
        ir,
        &k.launch,
        &mut owned,
        &shifts,
        mode,
        &options,
    );
    for a in (loads..k.args.len()).rev() {
        if let Some(f) = first_of(a) {
            let copy = owned[a].clone();
            interpret::hand_back(ir, &k.launch, a, &copy, &mut owned[loads + f]);
        }
    }
    for (a, (v, b)) in k.args.iter().zip(owned).enumerate() {
        if a >= loads && first_of(a).is_none() {
            values.insert(*v, b);
        }
    }
    Some(())
}

/// Runs `program` with every kernel step emulated (atomic mode; 64-bit indexing when
/// `wide`) and matrix products on the host: `interpret::run_program` with the kernels
/// swapped for the emitted CUDA. Fresh outputs start as a sentinel pattern, so an element
/// the kernel fails to write shows.
/// `emulated` keeps the compiled kernels by name across calls.
fn run_program_emulated(
    program: &Program,
    inputs: &[Buffer],
    emulated: &mut BTreeMap<String, Emulated>,
    wide: bool,
    force: Option<RowPath>,
) -> Option<Vec<Buffer>> {
    let dag = &program.dag;
    let mut values: HashMap<Value, Buffer> = HashMap::new();
    for (i, b) in inputs.iter().enumerate() {
        values.insert(Value::Input(i), b.clone());
    }
    let fresh = |v: Value| {
        let ty = dag.ty(v);
        let mut b = Buffer::try_zeroed(ty.dtype, &ty.shape).expect("buffer");
        b.fill_bytes(0x5a);
        b
    };
    for step in &program.steps {
        match step {
            LowerStep::Kernel(k) => {
                emulate_step(program, k, &mut values, emulated, Mode { wide, force })?
            }
            LowerStep::MatMul(m) => {
                let mut out = fresh(m.out);
                fusebox::runtime::matmul::matmul(
                    &values[&m.a.value],
                    &m.a,
                    &values[&m.b.value],
                    &m.b,
                    &mut out,
                )
                .expect("matmul");
                let (value, buffer) = interpret::placed_product(program, m, out).expect("result");
                values.insert(value, buffer);
                if let Some(e) = &m.epilogue {
                    emulate_step(
                        program,
                        &e.step,
                        &mut values,
                        emulated,
                        Mode { wide, force },
                    )?;
                }
            }
        }
    }
    Some(
        dag.outputs
            .iter()
            .map(|o| values[&o.value].clone())
            .collect(),
    )
}

/// `graph`'s program run through the emulation against the reference evaluator on seeded
/// inputs (NaN, ±Inf and ±0 planted when `specials`). `None` without a C++ compiler.
fn emulated_agrees(
    graph: &Graph,
    program: &Program,
    emulated: &mut BTreeMap<String, Emulated>,
    seed: u64,
    specials: bool,
    wide: bool,
    force: Option<RowPath>,
) -> Option<Result<(), String>> {
    let inputs = random_graph::inputs(graph, seed, specials);
    emulated_agrees_on(graph, program, emulated, &inputs, wide, force)
        .map(|result| result.map_err(|e| format!("{e} (seed {seed}, specials {specials})")))
}

/// [`emulated_agrees`] on the given inputs.
fn emulated_agrees_on(
    graph: &Graph,
    program: &Program,
    emulated: &mut BTreeMap<String, Emulated>,
    inputs: &fusebox::eval::Tensors,
    wide: bool,
    force: Option<RowPath>,
) -> Option<Result<(), String>> {
    let rules = random_graph::rules();
    let want = match fusebox::eval::evaluate(graph, &rules.ops, inputs) {
        Ok(want) => want,
        Err(e) => return Some(Err(format!("reference: {e}"))),
    };
    let buffers = random_graph::input_buffers(program, inputs);
    let got = run_program_emulated(program, &buffers, emulated, wide, force)?;
    for (o, b) in program.dag.outputs.iter().zip(&got) {
        if let Err(e) = random_graph::assert_same(&o.name, &want[&o.name], &b.to_tensor()) {
            return Some(Err(format!("{e} (path {force:?})")));
        }
    }
    Some(Ok(()))
}

/// A row-kernel test graph at a given shape.
type MakeGraph = fn(&[usize]) -> Graph;

/// The row-kernel graphs of the tests, by name.
fn row_graphs() -> Vec<(&'static str, MakeGraph)> {
    fn softmax_f32(s: &[usize]) -> Graph {
        row_graphs::softmax(DType::F32, s)
    }
    fn softmax_f16(s: &[usize]) -> Graph {
        row_graphs::softmax(DType::F16, s)
    }
    fn softmax_bf16(s: &[usize]) -> Graph {
        row_graphs::softmax(DType::BF16, s)
    }
    fn log_softmax_f32(s: &[usize]) -> Graph {
        row_graphs::log_softmax(DType::F32, s)
    }
    fn layernorm_affine(s: &[usize]) -> Graph {
        row_graphs::layernorm(DType::F32, s, true)
    }
    fn layernorm_plain(s: &[usize]) -> Graph {
        row_graphs::layernorm(DType::F32, s, false)
    }
    fn layernorm_f16(s: &[usize]) -> Graph {
        row_graphs::layernorm(DType::F16, s, true)
    }
    fn layernorm_bf16(s: &[usize]) -> Graph {
        row_graphs::layernorm(DType::BF16, s, false)
    }
    fn softcapped_f32(s: &[usize]) -> Graph {
        row_graphs::softcapped_softmax(DType::F32, s, false)
    }
    fn softcapped_logits_f32(s: &[usize]) -> Graph {
        row_graphs::softcapped_softmax(DType::F32, s, true)
    }
    fn softcapped_bf16(s: &[usize]) -> Graph {
        row_graphs::softcapped_softmax(DType::BF16, s, false)
    }
    fn layernorm_of_gelu(s: &[usize]) -> Graph {
        row_graphs::layernorm_of_gelu(DType::F32, s)
    }
    fn sums_f32(s: &[usize]) -> Graph {
        row_sums_graph(DType::F32, s)
    }
    fn sums_i32(s: &[usize]) -> Graph {
        row_sums_graph(DType::I32, s)
    }
    fn ints_i32(s: &[usize]) -> Graph {
        int_rows_graph(DType::I32, s)
    }
    fn ints_i64(s: &[usize]) -> Graph {
        int_rows_graph(DType::I64, s)
    }
    vec![
        ("softmax f32", softmax_f32),
        ("softmax f16", softmax_f16),
        ("softmax bf16", softmax_bf16),
        ("log-softmax f32", log_softmax_f32),
        ("layernorm f32 affine", layernorm_affine),
        ("layernorm f32", layernorm_plain),
        ("layernorm f16 affine", layernorm_f16),
        ("layernorm bf16", layernorm_bf16),
        ("softmax f32 soft-capped", softcapped_f32),
        (
            "softmax f32 soft-capped, with its logits",
            softcapped_logits_f32,
        ),
        ("softmax bf16 soft-capped", softcapped_bf16),
        ("layernorm f32 of gelu", layernorm_of_gelu),
        ("row sums f32", sums_f32),
        ("row sums i32", sums_i32),
        ("integer rows i32", ints_i32),
        ("integer rows i64", ints_i64),
    ]
}

/// Whether graph `name` has reductions without an identity (max), which the checker refuses
/// over empty rows.
fn has_max(name: &str) -> bool {
    name.contains("softmax") || name.starts_with("integer")
}

/// Every row graph is one row kernel on CUDA, as on the CPU, with the passes the design
/// promises (softmax and layernorm three, the integer sum-and-max two).
#[test]
fn row_graphs_lower_to_one_row_kernel() {
    for (name, make) in row_graphs() {
        let program = lowered(&make(&[4, 33]));
        assert_eq!(program.groups, 1, "{name}: one kernel");
        let ir = &program.kernels[0];
        assert!(ir.is_row_kernel(), "{name}: a row kernel");
        let passes = if name.starts_with("softmax")
            || name.starts_with("log-softmax")
            || name.starts_with("layernorm")
        {
            3
        } else {
            2
        };
        assert_eq!(ir.passes(), passes, "{name}");
    }
}

/// Every row kernel of the row graphs compiles for sm_80 and sm_90 in both reduction modes
/// without a warning, and its PTX synchronizes the block, shuffles within warps, uses no
/// atomics (each row is one block's alone), moves rows in 16-byte vectors, has its shared
/// memory cache, and keeps the register cache out of local memory.
#[test]
fn row_kernels_compile_for_sm80_and_sm90() {
    let mut kernels: Vec<KernelIr> = Vec::new();
    for (_, make) in row_graphs() {
        for shape in [&[4usize, 33][..], &[2, 3, 5], &[7]] {
            for ir in lowered(&make(shape)).kernels {
                if ir.is_row_kernel() && !kernels.contains(&ir) {
                    kernels.push(ir);
                }
            }
        }
    }
    assert!(kernels.len() >= 12, "only {} row kernels", kernels.len());
    let Some((atomic, deterministic)) = check(&kernels) else {
        return;
    };
    for ptx in [&atomic, &deterministic] {
        assert!(ptx.contains("bar.sync"), "block barrier");
        assert!(ptx.contains("shfl.sync.bfly"), "warp shuffles");
        assert!(!ptx.contains("atom."), "row kernels use no atomics");
        // The register cache is indexed by constants only once its loops are unrolled, so
        // it lives in registers: an array left in local memory would be a `.local` one.
        assert!(!ptx.contains(".local"), "the row cache stays in registers");
        assert!(
            ptx.contains("ld.global.v4") || ptx.contains("ld.global.nc.v4"),
            "16-byte loads"
        );
        assert!(ptx.contains("st.global.v4"), "16-byte stores");
        assert!(ptx.contains("ld.shared"), "the shared-memory cache");
    }
}

/// The emitted row kernels, run through the emulation at row lengths 0, 1, 31, 33 (one warp
/// and a bit), 1000 (64 threads, four 16-byte vectors each), 4097 (one past the register
/// cache of a full block: shared memory) and 24577 (past 48 KiB of f16 or f32: re-reading),
/// over more rows than the grid has blocks, at rank 3, with NaN/±Inf/±0 rows and 64-bit
/// indexing, equal the reference; every short shape also runs forced onto the shared,
/// re-reading and element-by-element register paths, so every path of every kernel text runs.
#[test]
fn emulated_row_kernels_match_the_reference() {
    for (name, make) in row_graphs() {
        let mut emulated = BTreeMap::new();
        let shapes: [&[usize]; 10] = [
            &[3, 0],
            &[3, 1],
            &[2, 31],
            &[5, 33],
            &[2, 1000],
            &[40, 3],
            &[2, 3, 33],
            &[0, 4],
            &[2, 4097],
            &[1, 24577],
        ];
        for (i, shape) in shapes.into_iter().enumerate() {
            if shape.last() == Some(&0) && has_max(name) {
                continue;
            }
            let graph = make(shape);
            let program = lowered(&graph);
            // Size-0 and size-1 dims may partition differently (the cost model sees no
            // traffic to save); the rest are one row kernel.
            if shape.iter().all(|&d| d > 1) {
                assert_eq!(program.groups, 1, "{name} {shape:?}");
                assert!(program.kernels[0].is_row_kernel(), "{name} {shape:?}");
            }
            let long = shape.last().is_some_and(|&n| n > 4096);
            let mut runs = vec![
                (i as u64, false, false, None),
                (100 + i as u64, true, true, None),
            ];
            if !long {
                for (k, path) in [RowPath::Shared, RowPath::Reread, RowPath::Registers]
                    .into_iter()
                    .enumerate()
                {
                    runs.push((200 + 10 * i as u64 + k as u64, true, false, Some(path)));
                }
            }
            for (seed, specials, wide, force) in runs {
                let Some(result) =
                    emulated_agrees(&graph, &program, &mut emulated, seed, specials, wide, force)
                else {
                    return;
                };
                result.unwrap_or_else(|e| panic!("{name} {shape:?}: {e}"));
            }
        }
    }
}

/// Every row kernel writes the NaN and infinity rows a planted special makes exactly as the
/// reference: a row holding NaN gives NaN throughout its softmax, a row holding +Inf gives
/// NaN where the reference does, and −Inf elements give 0.
#[test]
fn emulated_nan_and_inf_rows_match_the_reference() {
    let graph = row_graphs::softmax(DType::F32, &[4, 40]);
    let program = lowered(&graph);
    let mut emulated = BTreeMap::new();
    for seed in 0..4 {
        let Some(result) =
            emulated_agrees(&graph, &program, &mut emulated, seed, true, false, None)
        else {
            return;
        };
        result.unwrap_or_else(|e| panic!("softmax with specials: {e}"));
    }
}

/// An embedding's LayerNorm ([`common::gather_graphs::embedding_layernorm`]), one row kernel
/// reading each token's row at its id, from the emitted CUDA on its own path and forced onto
/// the register and shared-memory paths (which cache the position row but never the gathered
/// one), equals the reference, rows of NaN for ids out of range and all.
#[test]
fn emulated_embedding_layernorms_read_rows_at_their_ids() {
    for (dtype, width) in [(DType::F32, 37), (DType::F16, 300), (DType::BF16, 16)] {
        let graph = common::gather_graphs::embedding_layernorm(dtype, 5, width);
        let program = lowered(&graph);
        assert_eq!(program.kernels.len(), 1);
        let ir = &program.kernels[0];
        assert!(ir.is_row_kernel() && ir.has_gathers());
        assert!(
            !abi::row_cached(ir).is_empty(),
            "the position row is cached"
        );
        check(std::slice::from_ref(ir));
        for seed in 0..3 {
            let inputs = common::gather_graphs::inputs(&graph, seed);
            emulated_on_the_cached_paths(&graph, &program, &inputs);
        }
    }
}

/// The convolutional models of `tests/onnx/cnn` (TorchScript exports, imported into padding
/// `concat`s, stacks of strided views that the GEMMs read through sub-axes, which the CUDA
/// backend gathers, pools, batch norms, and the spread inputs and reversed weights of
/// transposed convolutions): their kernels
/// compile for sm_80 and sm_90 without warnings, and their emitted CUDA, run by the emulation
/// in 32- and 64-bit indexing, equals the reference evaluator.
#[test]
fn emulated_convolutional_models_match_the_reference() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/cnn");
    let rules = random_graph::rules();
    for model in [
        "cnn",
        "resnet_block",
        "odd_convs",
        "norms_pads",
        "decoder",
        "upsample",
    ] {
        let path = dir.join(format!("{model}.ts.onnx"));
        let imported = fusebox::onnx::import(&path, &rules.ops, &rules.onnx).unwrap();
        let mut inputs: fusebox::eval::Tensors = imported.values.clone().into_iter().collect();
        let x = fusebox::tensor::Tensor::read_npy(&dir.join(format!("{model}.in.x.npy"))).unwrap();
        inputs.insert("x".into(), x);
        let program = lowered(&imported.graph);
        check(&program.kernels);
        let mut emulated = BTreeMap::new();
        for wide in [false, true] {
            let Some(result) = emulated_agrees_on(
                &imported.graph,
                &program,
                &mut emulated,
                &inputs,
                wide,
                None,
            ) else {
                return;
            };
            result.unwrap_or_else(|e| panic!("{model}: {e}"));
        }
    }
}

/// The joint graph of two `Linear` layers with an activation between them
/// ([`common::linear_stack_joint`]), whose first bias gradient ends a product's epilogue: the
/// epilogue's kernel (run after the product, as the CUDA backend runs it) and every other
/// kernel, emulated in 32- and 64-bit indexing, equal the reference evaluator in f32 and f16
/// (no infinities among the inputs: see `cpu_gemm::a_linear_stacks_bias_gradient_runs_in_an_epilogue`).
#[test]
fn emulated_epilogues_ending_in_bias_gradients_match_the_reference() {
    for dtype in ["f32", "f16"] {
        let graph = common::linear_stack_joint([37, 20, 70, 9], "gelu", dtype);
        let program = lowered(&graph);
        assert_eq!(
            common::epilogue_reductions(&program).iter().sum::<usize>(),
            1,
            "{dtype}"
        );
        check(&program.kernels);
        if !emulated_in_both_widths_on(&graph, &program, 5, dtype) {
            return;
        }
    }
}

/// Reductions of nothing ([`row_graphs::empty_reductions`]) write their identities from the
/// emitted CUDA as the reference does: 0 for a sum, NaN for a mean, -inf for a max (rows and
/// columns), +inf for a min, in f32 and f16.
#[test]
fn emulated_empty_reductions_write_their_identities() {
    for dtype in [DType::F32, DType::F16] {
        let graph = row_graphs::empty_reductions(dtype);
        let program = lowered(&graph);
        if !emulated_in_both_widths_on(&graph, &program, 3, &format!("{dtype:?}")) {
            return;
        }
    }
}

/// Runs `program` through the CPU model of CUDA on `inputs`, on the host's path and forced
/// onto the element-by-element register and shared-memory paths (those that keep values),
/// in 32- and 64-bit indexing, against the reference.
fn emulated_on_the_cached_paths(graph: &Graph, program: &Program, inputs: &fusebox::eval::Tensors) {
    let mut emulated = BTreeMap::new();
    for wide in [false, true] {
        for force in [None, Some(RowPath::Registers), Some(RowPath::Shared)] {
            let Some(result) =
                emulated_agrees_on(graph, program, &mut emulated, inputs, wide, force)
            else {
                return;
            };
            result.unwrap_or_else(|e| panic!("wide {wide}: {e}"));
        }
    }
}

/// The CUDA text of a row kernel up to its element-by-element register path: the entry points
/// of the 16-byte vector path, which come first.
fn vector_path_text(ir: &KernelIr) -> String {
    let source = emit_module(&[(kernel_name(ir), ir)], &EmitOptions::default());
    let end = source
        .find("the row in registers, element by element")
        .expect("paths");
    source[..end].to_string()
}

/// Softmax's sum pass keeps `exp(x - max)` over `x`'s slots of the register cache. A second
/// reduction in that pass, `mean((x - max)²)`, reads `x` itself: when its f32 partial
/// overflows (two squares of 1.96·10³⁸ per thread here, each finite), its f64 redo must read
/// `x` from global memory again, not the slots that now hold `exp` (which would give a mean
/// of about 10³⁸ instead of 9.8·10³⁷). Every path, in 32- and 64-bit indexing.
#[test]
fn emulated_redo_after_keeping_over_the_register_cache_reads_x_again() {
    let mut b = GraphBuilder::new("softmax_and_spread");
    let x = b.input("x", DType::F32, &[3, 64]);
    let m = last_axis(&mut b, "m", "reduce_max", &x);
    let d = b.op("d", "sub", &[&x, &m]);
    let e = b.op("e", "exp", &[&d]);
    let s = last_axis(&mut b, "s", "sum", &e);
    let y = b.op("y", "div", &[&e, &s]);
    let q = b.op("q", "mul", &[&d, &d]);
    let v = last_axis(&mut b, "v", "mean", &q);
    let graph = b.finish(&[&y, &v]);
    let program = lowered(&graph);
    assert_eq!(program.kernels.len(), 1);
    let ir = &program.kernels[0];
    assert!(
        ir.is_row_kernel() && ir.row_kept().len() == 1,
        "exp is kept"
    );
    let vector = vector_path_text(ir);
    assert!(
        vector.contains("c0[g][l] = v"),
        "kept over x's slots:\n{vector}"
    );
    assert!(
        vector.contains("= p.p0["),
        "the redo reads x again:\n{vector}"
    );
    let mut inputs = fusebox::eval::Tensors::new();
    // 1e19 and -4e18 are not f32 values: rounded here, as every input is.
    let values = (0..3 * 64)
        .map(|i| if i % 2 == 0 { 1e19f32 } else { -4e18 } as f64)
        .collect();
    let t = fusebox::tensor::Tensor::from_values(DType::F32, &[3, 64], values).expect("x");
    inputs.insert("x".to_string(), t);
    emulated_on_the_cached_paths(&graph, &program, &inputs);
}

/// Kept values share a place once the earlier one is no longer read: in a soft-capped softmax
/// whose sum's pass also takes `mean((t - max) · z)`, the maximum's pass keeps the capped
/// logits `t` over `x`'s slots, and the sum's pass writes `exp(t - max)` over them after
/// reading `t` (the last pass reads only `exp`). When that mean's f32 partial overflows
/// (`z` is -3·10³⁸), its f64 redo needs `t` again, which no longer lies over `x`: it
/// evaluates `t` from `x` in global memory (reading the slots would give it `exp`'s values).
/// Every path, in 32- and 64-bit indexing.
#[test]
fn emulated_redo_evaluates_a_kept_value_whose_place_was_taken() {
    let mut b = GraphBuilder::new("softcapped_softmax_and_spread");
    let x = b.input("x", DType::F32, &[3, 64]);
    let z = b.input("z", DType::F32, &[3, 64]);
    let cap = b.constant("cap", 30.0, DType::F32);
    let xs = b.op("xs", "div", &[&x, &cap]);
    let t = b.op("t", "tanh", &[&xs]);
    let tc = b.op("tc", "mul", &[&t, &cap]);
    let m = last_axis(&mut b, "m", "reduce_max", &tc);
    let d = b.op("d", "sub", &[&tc, &m]);
    let e = b.op("e", "exp", &[&d]);
    let s = last_axis(&mut b, "s", "sum", &e);
    let y = b.op("y", "div", &[&e, &s]);
    let q = b.op("q", "mul", &[&d, &z]);
    let v = last_axis(&mut b, "v", "mean", &q);
    let graph = b.finish(&[&y, &v]);
    let program = lowered(&graph);
    assert_eq!(program.kernels.len(), 1);
    let ir = &program.kernels[0];
    let kept: Vec<(usize, Vec<usize>)> = ir
        .row_kept()
        .into_iter()
        .map(|k| (k.saved_in, k.read_in))
        .collect();
    assert_eq!(kept, vec![(0, vec![1]), (1, vec![2])], "t, then exp");
    let vector = vector_path_text(ir);
    let x_slot = (0..ir.loads.len())
        .find(|a| vector.matches(&format!("c{a}[g][l] = v")).count() == 2)
        .unwrap_or_else(|| panic!("t and exp both kept over x's slots:\n{vector}"));
    assert!(
        vector.contains(&format!("= p.p{x_slot}[")),
        "the redo reads x again:\n{vector}"
    );
    let mut inputs = fusebox::eval::Tensors::new();
    // Capped logits 13.9 to 14.6: `t - max` varies, and `(t - max) · z` stays finite.
    let xv = (0..3 * 64)
        .map(|i| 15.0 + (i * 37 % 64) as f64 / 64.0)
        .collect();
    let zv = vec![-3e38f32 as f64; 3 * 64];
    for (name, values) in [("x", xv), ("z", zv)] {
        let t = fusebox::tensor::Tensor::from_values(DType::F32, &[3, 64], values).expect(name);
        inputs.insert(name.to_string(), t);
    }
    emulated_on_the_cached_paths(&graph, &program, &inputs);
}

/// A row kernel's text has one entry point per path (`abi::row_paths`), each body holding
/// its own path's loops alone, so NVRTC gives each path the registers of its own loops (with
/// all four in one kernel, the vector path got the element path's 80); the vector path's
/// entries ask for six blocks of 256 threads per SM.
#[test]
fn row_kernels_have_one_entry_point_per_path() {
    let comments = [
        (
            RowPath::RegistersVector,
            "the row in registers, moved in 16-byte vectors",
        ),
        (
            RowPath::Registers,
            "the row in registers, element by element",
        ),
        (
            RowPath::Shared,
            "the row in shared memory after its first reading",
        ),
        (
            RowPath::Reread,
            "every pass reads the row from global memory",
        ),
    ];
    let program = lowered(&row_graphs::softmax(DType::F32, &[8, 100]));
    let ir = &program.kernels[0];
    let name = kernel_name(ir);
    let source = emit_module(&[(name.clone(), ir)], &EmitOptions::default());
    let paths = abi::row_paths(ir);
    assert_eq!(paths.len(), 4);
    for (path, _) in comments {
        let part = abi::row_part(path);
        let start = source
            .find(&format!("{name}{part}_body("))
            .unwrap_or_else(|| panic!("no body for {path:?}"));
        let end = start + source[start..].find("extern \"C\"").expect("entries");
        let body = &source[start..end];
        for (other, text) in comments {
            assert_eq!(body.contains(text), other == path, "{path:?} body:\n{body}");
        }
        let bounds = match abi::row_min_blocks(path) {
            Some(blocks) => format!("FBC_BLOCK, {blocks}"),
            None => "FBC_BLOCK".to_string(),
        };
        for wide in [false, true] {
            let entry = entry_name(&name, &part, wide);
            assert!(
                source.contains(&format!("__launch_bounds__({bounds}) {entry}(")),
                "{entry}"
            );
        }
    }
    assert_eq!(abi::row_min_blocks(RowPath::RegistersVector), Some(6));
}

/// Launch plans of row kernels: one block per row up to the grid cap (grid-stride beyond),
/// the block sized from the row length so a row fits 16 f32 registers a thread, never folded
/// (a contiguous `[N, M]` stays N rows), no scratch; the path in the `vec` word: vectors
/// where the row fits the registers and is aligned, registers element by element where it
/// fits but is not, shared memory (with its size) up to 48 KiB, re-reading beyond; no rows,
/// no launch.
#[test]
fn row_kernel_plans() {
    let program = lowered(&row_graphs::softmax(DType::F32, &[4096, 4096]));
    let ir = &program.kernels[0];
    assert!(ir.is_row_kernel());
    assert_eq!(vector_width(ir), 1, "no pointwise vector loop");
    assert_eq!(abi::row_cached(ir), vec![0], "softmax keeps its input");
    assert_eq!((abi::row_slots(ir), abi::row_vector_width(ir)), (16, 4));
    assert_eq!(
        [0, 1, 33, 512, 513, 1024, 1025, 4096, 4097, i64::MAX].map(|n| abi::row_block(ir, n)),
        [32, 32, 32, 32, 64, 64, 128, 256, 256, 256]
    );
    // The 48 KiB a block gets hold the combination's static arrays too: a row of 12288 f32
    // (48 KiB exactly) is re-read, since asking for it all failed its launch on an H200.
    assert_eq!(
        [4096, 4097, 12256, 12257, 12288, 12289].map(|n| abi::row_shared_bytes(ir, n)),
        [0, 16400, 48 * 1024 - 128, 0, 0, 0]
    );
    let options = EmitOptions::default();
    use RowPath::{Registers, RegistersVector, Reread, Shared};
    // sizes, pointers, grid, block, shared bytes, 64-bit indexing, path
    type Case = (&'static [i64], u64, u32, u32, u32, bool, RowPath);
    let cases: [Case; 9] = [
        (&[4096, 4096], 0x1000, 4096, 256, 0, false, RegistersVector),
        (&[4096, 4096], 0x1004, 4096, 256, 0, false, Registers),
        (
            &[8192, 1024],
            0x1000,
            132 * BLOCKS_PER_SM,
            64,
            0,
            false,
            RegistersVector,
        ),
        (&[7, 100], 0x1000, 7, 32, 0, false, RegistersVector),
        (&[7, 33], 0x1000, 7, 32, 0, false, Registers),
        (&[3, 0], 0x1000, 3, 32, 0, false, RegistersVector),
        (&[10, 5000], 0x1000, 10, 256, 20000, false, Shared),
        (&[10, 12289], 0x1000, 10, 256, 0, false, Reread),
        (
            &[1 << 16, 1 << 16],
            0x1000,
            132 * BLOCKS_PER_SM,
            256,
            0,
            true,
            Reread,
        ),
    ];
    for (sizes, ptr, grid, block, shared, wide, path) in cases {
        let launch = contiguous(ir, sizes);
        assert_eq!(fold(ir, &launch), sizes.to_vec(), "rows are never folded");
        let p = plan(ir, "k", &launch, 132, &options);
        assert!(p.scratch_bytes.is_empty());
        let entry = |path: RowPath| entry_name("k", &abi::row_part(path), wide);
        // The plan's entry is the path for aligned pointers; by_path names all four.
        let aligned = if path == Registers && sizes[1] % 4 == 0 {
            RegistersVector
        } else {
            path
        };
        let want = GpuLaunch {
            entry: entry(aligned),
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_bytes: shared,
            by_path: [Reread, Shared, Registers, RegistersVector]
                .map(entry)
                .to_vec(),
        };
        assert_eq!(p.launches, vec![want], "{sizes:?}");
        let ptrs = vec![ptr; ir.arg_count()];
        let block_words = words(&param_block(ir, &launch, &ptrs, &[]));
        let vec_word = param_layout(ir).vec / 8;
        assert_eq!(block_words[vec_word], path as u64, "{sizes:?} at {ptr:#x}");
        assert_eq!(p.launches[0].entry_for(&block_words, vec_word), entry(path));
    }
    assert!(
        plan(ir, "k", &contiguous(ir, &[0, 5]), 132, &options)
            .launches
            .is_empty()
    );
}

/// Which loads a row kernel caches: layernorm keeps its input (read by all three passes) but
/// not its weight and bias (read by the last pass only), and its slots follow the cached
/// bytes (f16: 64 bytes would be 32 slots, capped at 16).
#[test]
fn row_kernels_cache_the_loads_read_twice() {
    let program = lowered(&row_graphs::layernorm(DType::F32, &[8, 1024], true));
    let ir = &program.kernels[0];
    assert_eq!(ir.loads.len(), 3, "x, weight, bias");
    let cached = abi::row_cached(ir);
    assert_eq!(cached.len(), 1, "only the input");
    assert!(abi::row_pass_loads(ir, 0)[cached[0]]);
    assert_eq!(abi::row_slots(ir), 16);
    let f16 = lowered(&row_graphs::layernorm(DType::F16, &[8, 1024], true));
    assert_eq!(abi::row_slots(&f16.kernels[0]), 16);
    assert_eq!(abi::row_vector_width(&f16.kernels[0]), 8);
    let sums = lowered(&row_sums_graph(DType::F32, &[8, 1024]));
    assert_eq!(abi::row_cached(&sums.kernels[0]).len(), 1);
}

/// Random graphs with row reductions feeding pointwise consumers (mixed with the usual
/// pointwise, broadcast and layout steps) whose programs hold a row kernel run through the
/// emulation as whole programs and equal the reference.
#[test]
fn emulated_random_row_graphs_match_the_reference() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;
    let rules = random_graph::rules();
    let strategy = (
        prop_oneof![
            Just((3usize, 5usize)),
            Just((2, 40)),
            Just((1, 1)),
            Just((4, 0))
        ],
        prop::collection::vec((0usize..4, 0usize..6), 1..3),
        prop::collection::vec(
            prop_oneof![
                2 => random_graph::step(true),
                1 => random_graph::row_reductions_with_consumers(),
            ],
            2..8,
        ),
        any::<bool>(),
    );
    let mut runner = TestRunner::deterministic();
    let wanted = random_graph::cases(10) as usize;
    let (mut found, mut attempts) = (0, 0);
    while found < wanted {
        attempts += 1;
        assert!(attempts < 400 * wanted, "too few random row graphs");
        let (dims, inputs, steps, specials) = strategy.new_tree(&mut runner).unwrap().current();
        let Some(graph) = random_graph::build(&rules.ops, dims, &inputs, &steps) else {
            continue;
        };
        let Ok(optimized) = optimize(&graph, rules, &Options::default()) else {
            continue;
        };
        let program = lower::lower(&optimized.dag, &optimized.partition).expect("lower");
        if !program.kernels.iter().any(KernelIr::is_row_kernel) {
            continue;
        }
        found += 1;
        if !random_graph_emulates(&graph, &program, attempts as u64, specials, false) {
            return;
        }
    }
}

/// [`emulated_agrees`] for a random graph, with a fresh emulation cache, panicking with the
/// graph's text when it disagrees; `false` without a C++ compiler.
fn random_graph_emulates(
    graph: &Graph,
    program: &Program,
    seed: u64,
    specials: bool,
    wide: bool,
) -> bool {
    let mut emulated = BTreeMap::new();
    let Some(result) = emulated_agrees(graph, program, &mut emulated, seed, specials, wide, None)
    else {
        return false;
    };
    result.unwrap_or_else(|e| panic!("{e}\n{}", graph::file::to_ron(graph)));
    true
}

/// Random graphs around a concat (`random_graph::build_concat`) whose program holds a kernel
/// that reduces and reads a concat by ranges (cut into pieces or, rarely, clamped, or a row
/// kernel in pieces), run through the emulation as whole programs and equal the reference.
#[test]
fn emulated_random_reducing_concat_graphs_match_the_reference() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;
    let rules = random_graph::rules();
    let strategy = (random_graph::concat_recipes(), any::<bool>(), any::<bool>());
    let mut runner = TestRunner::deterministic();
    let wanted = random_graph::cases(16) as usize;
    let (mut found, mut attempts) = (0, 0);
    // Reducing range-select kernels run, cut into pieces and clamped, and row kernels that
    // read a concat (always in pieces).
    let (mut pieces, mut clamped, mut rows) = (0, 0, 0);
    while found < wanted {
        attempts += 1;
        assert!(
            attempts < 100 * wanted,
            "too few random reducing concat graphs"
        );
        let (recipe, specials, wide) = strategy.new_tree(&mut runner).unwrap().current();
        let Some(graph) = random_graph::build_concat(&rules.ops, &recipe) else {
            continue;
        };
        let program = lowered(&graph);
        let reducing: Vec<&KernelIr> = program
            .kernels
            .iter()
            .filter(|ir| (!ir.reductions.is_empty() || ir.is_row_kernel()) && ir.has_ranges())
            .collect();
        if reducing.is_empty() {
            continue;
        }
        found += 1;
        for ir in reducing {
            if ir.is_row_kernel() {
                rows += 1;
            } else if fusebox::lower::split::split_guarded(ir).is_some() {
                pieces += 1;
            } else {
                clamped += 1;
            }
        }
        if !random_graph_emulates(&graph, &program, attempts as u64, specials, wide) {
            return;
        }
    }
    eprintln!(
        "{found} graphs: reducing range-select kernels {pieces} in pieces, {clamped} clamped, \
         {rows} row kernels"
    );
    // Since reductions along the select's axis run as pieces too, a clamped reducing kernel
    // (two concats with different segments) is rare here; `two_concats_summed` runs one.
    assert!(
        pieces > 0 && rows > 0,
        "{pieces} in pieces, {clamped} clamped, {rows} row kernels"
    );
}

/// The kernel of a small graph that reads a concat by ranges: `tanh(concat(exp(x), y[.., 1:],
/// axis))` over `[4, 5]` operands, as the lowering emits it, with its launch.
fn range_select_kernel(axis: i64) -> (KernelIr, Launch) {
    use fusebox::attr::AttrValue;
    use fusebox::graph::GraphBuilder;
    let rules = fusebox::rules::RuleSet::defaults();
    let mut b = GraphBuilder::new("ranges");
    let (x_shape, y_shape) = if axis == 0 {
        ([2, 5], [4, 5])
    } else {
        ([4, 2], [4, 5])
    };
    let x = b.input("x", DType::F32, &x_shape);
    let y = b.input("y", DType::F16, &y_shape);
    let e = b.op("e", "exp", &[&x]);
    let s = b.op_with(
        "s",
        "slice",
        &[&y],
        &[("axis", AttrValue::Int(axis)), ("start", AttrValue::Int(1))],
    );
    let c = b.op_with("c", "concat", &[&e, &s], &[("axis", AttrValue::Int(axis))]);
    b.op("out", "tanh", &[&c]);
    let graph = b.finish(&["out"]);
    let optimized =
        fusebox::optimize::optimize(&graph, &rules, &fusebox::optimize::Options::default())
            .unwrap();
    let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
    program.check_bounds().unwrap();
    assert_eq!(program.steps.len(), 1);
    let fusebox::lower::Step::Kernel(step) = &program.steps[0] else {
        panic!("one generated kernel");
    };
    let ir = program.kernels[step.kernel].clone();
    assert!(ir.has_ranges());
    (ir, step.launch.clone())
}

/// A concat read by ranges, along the outer and the inner axis, runs through the CPU model of
/// CUDA exactly as the interpreter runs it (32- and 64-bit indices, and ranges that do not
/// tile the axis), each thread evaluating only its segment's piece, and compiles with NVRTC.
#[test]
fn emulated_range_selects_match_the_interpreter() {
    let options = EmitOptions::default();
    for axis in [0, 1] {
        let (ir, launch) = range_select_kernel(axis);
        assert_eq!(vector_width(&ir), 1, "range selects have no vector path");
        assert_eq!(fold(&ir, &launch), launch.sizes, "nor fold axes");
        let layout = param_layout(&ir);
        assert_eq!(layout.bytes, layout.ranges + 16 * ir.range_count());
        let source = emit_module(&[(kernel_name(&ir), &ir)], &options);
        assert!(
            source.contains(&format!("if (i{axis} < re")) && source.contains("else {"),
            "each thread evaluates only its own segment's piece:\n{source}"
        );
        if nvrtc().is_some() {
            for arch in ["compute_80", "compute_90"] {
                compile(&source, arch, &[]).unwrap_or_else(|log| panic!("{arch}: {log}"));
            }
        }
        let Some(emulated) = emulate(&ir, &options) else {
            return;
        };
        let n = ir.arg_count();
        // Ranges that leave a gap (the first segment cut short): the pieces keep their range
        // loads' bounds, so the gap reads nothing, as in the interpreter.
        let mut gapped = launch.clone();
        gapped.ranges[0].1 -= 1;
        for (launch, wide, seed) in [
            (&launch, false, 11),
            (&launch, true, 12),
            (&gapped, false, 13),
        ] {
            agree(
                &emulated,
                &ir,
                launch,
                &vec![0; n],
                wide,
                &options,
                seed,
                true,
            );
        }
    }
}

/// Index-map positions divide by a rounded reciprocal with one correction (the spelling the
/// C emitter shares): at, just below and just above multiples of a stage size, from small
/// positions (32- and 64-bit indexing) up to just below the 2^51 cap (64-bit), the emulated
/// kernel reads the element integer arithmetic gives, including where the estimate alone is
/// one short.
#[test]
fn map_positions_divide_exactly_by_reciprocals_up_to_the_cap() {
    use common::map_positions::{self, COLUMNS, SECOND};
    let ir = map_positions::kernel();
    check(std::slice::from_ref(&ir));
    let source = emit_module(&[(kernel_name(&ir), &ir)], &EmitOptions::default());
    assert!(
        source.contains("__dmul_rn((double)q"),
        "reciprocal estimates"
    );
    assert!(
        !source.contains(" / m0_"),
        "no integer division by a stage size"
    );
    let options = EmitOptions::default();
    let Some(emulated) = emulate(&ir, &options) else {
        return;
    };
    let mut corrected = 0;
    for (launch, narrow) in map_positions::launches() {
        corrected += map_positions::corrected(&launch);
        let widths: &[bool] = if narrow { &[false, true] } else { &[true] };
        for &wide in widths {
            let rows = launch.sizes[0];
            let mut x = Buffer::zeroed(DType::F32, &[SECOND as usize]);
            for i in 0..SECOND as usize {
                x.set(i, i as f64);
            }
            let y = Buffer::zeroed(DType::F32, &[(rows * COLUMNS) as usize]);
            let mut buffers = vec![x, y];
            let mode = Mode { wide, force: None };
            run_emulated(
                &emulated,
                &ir,
                &launch,
                &mut buffers,
                &[0, 0],
                mode,
                &options,
            );
            for r in 0..rows {
                for c in 0..COLUMNS {
                    let q = map_positions::position(&launch, r, c);
                    assert_eq!(
                        buffers[1].get((r * COLUMNS + c) as usize),
                        map_positions::element(q) as f64,
                        "position {q} (wide {wide})"
                    );
                }
            }
        }
    }
    assert!(corrected > 0, "no position needed the correction");
}

/// Softmax's CUDA row kernel evaluates `exp` once per element on the register and
/// shared-memory paths (the sum pass keeps `exp(x - max)` over `x`'s slots or row, and the
/// normalize pass reads it back) and again in the last pass when re-reading, sums in f32
/// partials joined in f64, and
/// multiplies by the row's reciprocal instead of dividing, with the division kept only for
/// a divisor outside the normal range.
#[test]
fn cuda_softmax_keeps_exp_on_chip_and_multiplies_by_the_reciprocal() {
    let program = lowered(&row_graphs::softmax(DType::F32, &[8, 100]));
    let ir = &program.kernels[0];
    assert_eq!(ir.row_kept().len(), 1, "exp(x - max) is kept");
    let source = emit_module(&[(kernel_name(ir), ir)], &EmitOptions::default());
    let body = &source[source.rfind("/* fbc_").expect("a kernel")..];
    let paths = [
        "the row in registers, moved in 16-byte vectors",
        "the row in registers, element by element",
        "the row in shared memory after its first reading",
        "every pass reads the row from global memory",
    ];
    let at: Vec<usize> = paths
        .iter()
        .map(|p| body.find(p).unwrap_or_else(|| panic!("no path {p}")))
        .collect();
    for (i, path) in paths.iter().enumerate() {
        let end = at.get(i + 1).copied().unwrap_or(body.len());
        let text = &body[at[i]..end];
        let exps = text.matches("expf(").count();
        // The register and shared paths keep it over `x`'s slots or row; re-reading
        // evaluates it in the sum pass, its f64 redo and the last pass.
        let want = if i == 3 { 3 } else { 1 };
        assert_eq!(exps, want, "{path}:\n{text}");
        assert!(text.contains("= __fadd_rn(f"), "{path}: f32 partial sums");
        assert!(
            text.contains("fbc_finitef(f"),
            "{path}: overflow falls back to f64"
        );
        assert!(
            text.contains(" ? __fmul_rn(v"),
            "{path}: multiplied by the reciprocal"
        );
    }
    assert!(
        body.contains("rk") && body.contains("= fbc_recip_ok(v"),
        "{body}"
    );
}

/// Under `row_arithmetic: Exact` the CUDA row kernel takes neither freedom: softmax adds its
/// sum in `double` and divides at every element (no f32 partials, no reciprocal), while it
/// still evaluates `exp` once on the shared path (keeping a value changes no bits); the
/// text differs from the relaxed one, so the two never share a compiled module.
#[test]
fn cuda_exact_row_arithmetic_sums_in_double_and_divides() {
    let program = lowered(&row_graphs::softmax(DType::F32, &[8, 100]));
    let mut ir = program.kernels[0].clone();
    assert_eq!(ir.row_arithmetic, RowArithmetic::Relaxed, "the default");
    let relaxed = emit_module(&[(kernel_name(&ir), &ir)], &EmitOptions::default());
    ir.row_arithmetic = RowArithmetic::Exact;
    assert!(ir.row_constant_divisors().iter().all(Option::is_none));
    let source = emit_module(&[(kernel_name(&ir), &ir)], &EmitOptions::default());
    assert_ne!(source, relaxed);
    check(std::slice::from_ref(&ir));
    let body = &source[source.rfind("/* fbc_").expect("a kernel")..];
    assert!(!body.contains("__fadd_rn(f"), "no f32 partials:\n{body}");
    assert!(!body.contains("fbc_recip_ok"), "no reciprocal");
    assert!(body.contains("= fbc_sum2(a4, (double)v3);"), "f64 sums");
    assert!(
        body.contains("= __fdiv_rn(v3, v4);"),
        "a division per element"
    );
    let vector = &body[..body
        .find("the row in registers, element by element")
        .expect("paths")];
    assert_eq!(
        vector.matches("expf(").count(),
        1,
        "the vector path keeps exp over x's slots under Exact too"
    );
    let shared = &body[body
        .find("the row in shared memory after its first reading")
        .expect("paths")
        ..body
            .find("every pass reads the row from global memory")
            .expect("paths")];
    assert_eq!(
        shared.matches("expf(").count(),
        1,
        "exp kept over the row in shared memory under Exact too"
    );
    let options = EmitOptions::default();
    let Some(emulated) = emulate(&ir, &options) else {
        return;
    };
    let mut programs = BTreeMap::new();
    programs.insert(kernel_name(&ir), emulated);
    let mut exact = program.clone();
    exact.kernels[0] = ir;
    let graph = row_graphs::softmax(DType::F32, &[8, 100]);
    for force in [None, Some(RowPath::Shared), Some(RowPath::Reread)] {
        let Some(result) = emulated_agrees(&graph, &exact, &mut programs, 9, true, false, force)
        else {
            return;
        };
        result.unwrap_or_else(|e| panic!("exact softmax: {e}"));
    }
}

/// Relaxed row sums on CUDA, through the emulation on every path at the row lengths around
/// the paths' boundaries (4096: the registers of a full block; 12288: 48 KiB of shared
/// memory): a row of random values is within the bound of the IR's "Precision of row
/// kernels" of the exact sum, and a row whose f32 partials overflow (each thread's elements
/// share a sign, ±3·10³⁸) gives exactly the f64 sum rounded to f32 (0 or ±Inf, never NaN).
/// Softmax at the same lengths equals the reference.
#[test]
fn emulated_relaxed_row_sums_stay_within_the_bound_on_every_path() {
    let mut emulated = BTreeMap::new();
    let mut softmaxes = BTreeMap::new();
    for n in [1000usize, 4096, 4097, 12288, 12289] {
        let graph = row_sums_graph(DType::F32, &[2, n]);
        let program = lowered(&graph);
        assert!(program.kernels[0].is_row_kernel());
        let mut inputs = random_graph::inputs(&graph, n as u64, false);
        let mut state = n as u64;
        let mut values = Vec::with_capacity(2 * n);
        for _ in 0..n {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (state >> 40) as f64 / (1u64 << 24) as f64;
            values.push(f64::from((u * 2.0 - 1.0) as f32));
        }
        let big = f64::from(3.0e38f32);
        for j in 0..n {
            values.push(if (j / 4) % 2 == 0 { big } else { -big });
        }
        inputs.insert(
            "x".into(),
            fusebox::tensor::Tensor::from_values(DType::F32, &[2, n], values.clone()).unwrap(),
        );
        let buffers = random_graph::input_buffers(&program, &inputs);
        let s = program
            .dag
            .outputs
            .iter()
            .position(|o| o.name == "s")
            .expect("output s");
        // Each path the row fits once (registers up to 4096 floats, shared memory up to
        // 48 KiB, 12288), and the host's choice where it is not re-reading.
        let mut forces = Vec::new();
        if n <= 12288 {
            forces.push(None);
        }
        if n <= 4096 {
            forces.push(Some(RowPath::Registers));
        }
        if n <= 12288 {
            forces.push(Some(RowPath::Shared));
        }
        forces.push(Some(RowPath::Reread));
        let shared = (n <= 12288).then_some(RowPath::Shared);
        for force in forces {
            let Some(got) = run_program_emulated(&program, &buffers, &mut emulated, false, force)
            else {
                return;
            };
            let got = &got[s];
            let row = &values[..n];
            let exact: f64 = row.iter().sum();
            let magnitude: f64 = row.iter().map(|v| v.abs()).sum();
            let nf = n as f64;
            let slack = (15.0 * 2f64.powi(-24) + 2.0 * nf * 2f64.powi(-53)) * magnitude;
            let bound = slack + 2f64.powi(-24) * (exact.abs() + slack);
            assert!(
                (got.get(0) - exact).abs() <= bound,
                "n {n} {force:?}: {} vs {exact} (bound {bound})",
                got.get(0)
            );
            let wide: f64 = values[n..].iter().sum();
            let want = f64::from(wide as f32);
            assert_eq!(got.get(1), want, "n {n} {force:?}: overflowing partials");
        }
        let graph = row_graphs::softmax(DType::F32, &[2, n]);
        let program = lowered(&graph);
        for (seed, force) in [(1, None), (2, shared), (3, Some(RowPath::Reread))] {
            let Some(result) =
                emulated_agrees(&graph, &program, &mut softmaxes, seed, true, false, force)
            else {
                return;
            };
            result.unwrap_or_else(|e| panic!("softmax [2, {n}]: {e}"));
        }
    }
}

/// The gate kernel of examples/lstm_cell_backward.ron at batch 3 and hidden 5: the four gate
/// gradients stored into their segments of grad_gates (strided stores at offsets 0, 5, 10,
/// 15 of rows of 20) and their four column sums into grad_bias's (offsets 0, 5, 10, 15), as
/// the lowering emits it for the CPU profile, with its launch.
fn in_place_gate_kernel() -> (KernelIr, Launch) {
    let rules = fusebox::rules::RuleSet::defaults();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/lstm_cell_backward.ron"
    );
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("[256, 1024]", "[3, 5]")
        .replace("[4096]", "[20]");
    let graph = graph::file::parse(&text, "lstm_cell_backward.ron", &rules.ops)
        .unwrap()
        .0;
    let optimized =
        fusebox::optimize::optimize(&graph, &rules, &fusebox::optimize::Options::default())
            .unwrap();
    assert_eq!(
        optimized.partition.in_place.len(),
        2,
        "grad_gates and grad_bias in place"
    );
    let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
    program.check_bounds().unwrap();
    let fusebox::lower::Step::Kernel(step) = &program.steps[0] else {
        panic!("the gate kernel first");
    };
    let segments = |name: &str| -> Vec<i64> {
        let value = program
            .dag
            .nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap();
        (0..step.args.len())
            .filter(|&a| step.args[a] == fusebox::dag::Value::Node(value))
            .map(|a| step.launch.offsets[a])
            .collect()
    };
    assert_eq!(segments("grad_gates"), [0, 5, 10, 15]);
    // The column sums' results, through their accumulators, into grad_bias.
    assert_eq!(segments("grad_bias"), [0, 5, 10, 15]);
    assert_eq!(program.steps.len(), 1, "one kernel");
    (program.kernels[step.kernel].clone(), step.launch.clone())
}

/// A kernel storing a concat's segments in place, and its reductions' results into another's
/// (the LSTM backward's gate kernel), runs through the CPU model of CUDA exactly as the
/// interpreter runs it, with 32- and 64-bit
/// indices and misaligned buffers, and compiles with NVRTC for sm_80 and sm_90.
#[test]
fn emulated_in_place_segment_stores_match_the_interpreter() {
    let options = EmitOptions::default();
    let (ir, launch) = in_place_gate_kernel();
    check(std::slice::from_ref(&ir));
    let Some(emulated) = emulate(&ir, &options) else {
        return;
    };
    let n = ir.arg_count();
    for (wide, shift, seed) in [(false, 0, 21), (true, 0, 22), (false, 4, 23)] {
        agree(
            &emulated,
            &ir,
            &launch,
            &vec![shift; n],
            wide,
            &options,
            seed,
            true,
        );
    }
}

/// Reductions storing their results into a concat's segments (`concat_in_place`'s graphs:
/// keepdim column sums along an inner axis, a mean and a max of rows, wrapping integer sums,
/// an empty reduced axis, f16 and bf16) run through the CPU model of CUDA (the `_init`, pass
/// and `_finish` launches, atomics included) as the reference computes them, in 32- and 64-bit
/// indexing, and their kernels compile with NVRTC.
#[test]
fn emulated_reductions_into_concat_segments_match_the_reference() {
    let mut emulated = BTreeMap::new();
    for (graph, _) in crate::concat_in_place::reductions_into_concats() {
        let program = lowered(&graph);
        check(&program.kernels);
        if !emulated_in_both_widths(&graph, &program, &mut emulated) {
            return;
        }
    }
}

/// Concats reduced along other axes than their own (`concat_graphs::reductions_of_concats`: column
/// sums, a row mean and max beside a pointwise result, f16 `sum_to_size`) and along their own
/// axis (`concat_graphs::reductions_along_a_concats_axis`: column sums of a batch concat, a mean and
/// a max over a middle-axis concat, f16 and wrapping i32 sums, row sums, means and maxima of
/// a feature concat, launches for several threads) run as pieces in the reduction passes, each thread accumulating the value of its
/// point's piece: through the CPU model of CUDA (32- and 64-bit indices) they equal the
/// reference, and their kernels compile with NVRTC for sm_80 and sm_90 in both reduction
/// modes.
#[test]
fn emulated_reductions_of_concat_pieces_match_the_reference() {
    let mut emulated = BTreeMap::new();
    let graphs = concat_graphs::reductions_of_concats().into_iter().chain(
        concat_graphs::reductions_along_a_concats_axis()
            .into_iter()
            .map(|(g, _)| g),
    );
    for graph in graphs {
        let program = lowered(&graph);
        let split = program
            .kernels
            .iter()
            .filter(|ir| !ir.reductions.is_empty())
            .filter_map(fusebox::lower::split::split_guarded)
            .count();
        assert_eq!(
            split, 1,
            "{}: one reducing kernel runs as pieces",
            graph.name
        );
        check(&program.kernels);
        if !emulated_in_both_widths(&graph, &program, &mut emulated) {
            return;
        }
    }
}

/// Two concats whose segments coincide (`concat_graphs::concats_alike`) share their launch
/// ranges: each kernel runs as per-point pieces, compiles with NVRTC for sm_80 and sm_90,
/// and equals the reference through the CPU model of CUDA with 32- and 64-bit indices.
#[test]
fn emulated_concats_alike_run_as_pieces() {
    let mut emulated = BTreeMap::new();
    for graph in concat_graphs::concats_alike() {
        let program = lowered(&graph);
        assert!(
            fusebox::lower::split::split_guarded(&program.kernels[0]).is_some(),
            "{}: pieces",
            graph.name
        );
        check(&program.kernels);
        if !emulated_in_both_widths(&graph, &program, &mut emulated) {
            return;
        }
    }
}

/// A reducing kernel the pieces cannot express (two concats with different segments, summed
/// over the rows) keeps the clamped form, every
/// operand at every point, and still equals the reference through the CPU model of CUDA.
#[test]
fn emulated_clamped_reductions_match_the_reference() {
    use fusebox::attr::AttrValue;
    let mut b = GraphBuilder::new("two_concats_summed");
    let a = b.input("a", DType::F32, &[40, 2]);
    let bb = b.input("b", DType::F32, &[40, 5]);
    let c = b.input("c", DType::F32, &[40, 4]);
    let d = b.input("d", DType::F32, &[40, 3]);
    let ea = b.op("ea", "exp", &[&a]);
    let tc = b.op("tc", "tanh", &[&c]);
    let k1 = b.op_with("k1", "concat", &[&ea, &bb], &[("axis", AttrValue::Int(1))]);
    let k2 = b.op_with("k2", "concat", &[&tc, &d], &[("axis", AttrValue::Int(1))]);
    let out = b.op("out", "add", &[&k1, &k2]);
    b.op_with("s", "sum", &[&out], &[("axes", AttrValue::Ints(vec![0]))]);
    let graph = b.finish(&["s"]);
    let program = lowered(&graph);
    let clamped = program
        .kernels
        .iter()
        .filter(|ir| !ir.reductions.is_empty() && ir.has_ranges())
        .filter(|ir| fusebox::lower::split::split_guarded(ir).is_none())
        .count();
    assert_eq!(clamped, 1, "one clamped reducing kernel");
    check(&program.kernels);
    let mut emulated = BTreeMap::new();
    emulated_in_both_widths(&graph, &program, &mut emulated);
}

/// Runs `program` through the CPU model of CUDA on random inputs against the reference, in
/// 32-bit indexing and then, with NaN/Inf, in 64-bit indexing. Panics on a mismatch; `false`
/// when the model is unavailable.
fn emulated_in_both_widths(
    graph: &Graph,
    program: &Program,
    emulated: &mut BTreeMap<String, Emulated>,
) -> bool {
    for (seed, wide) in [(0, false), (1, true)] {
        let Some(result) = emulated_agrees(graph, program, emulated, seed, seed == 1, wide, None)
        else {
            return false;
        };
        result.unwrap_or_else(|e| panic!("{}: {e}", graph.name));
    }
    true
}

/// Runs `program` through the CPU model of CUDA against the reference on the inputs of
/// `seed` (no NaN or infinities planted), in 32- and 64-bit indexing. Panics on a mismatch,
/// naming `what`; `false` when the model is unavailable.
fn emulated_in_both_widths_on(graph: &Graph, program: &Program, seed: u64, what: &str) -> bool {
    let mut emulated = BTreeMap::new();
    for wide in [false, true] {
        let Some(result) = emulated_agrees(graph, program, &mut emulated, seed, false, wide, None)
        else {
            return false;
        };
        result.unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    true
}

/// Runs `program` through the CPU model of CUDA on random inputs against the reference: on
/// the host's path in 32- and 64-bit indexing, then forced onto the shared-memory,
/// re-reading and register paths, odd seeds with NaN/Inf. Panics on a mismatch; `false`
/// when the model is unavailable.
fn emulated_on_every_row_path(
    graph: &Graph,
    program: &Program,
    emulated: &mut BTreeMap<String, Emulated>,
) -> bool {
    let mut runs = vec![(0, false, None), (1, true, None)];
    for (k, path) in [RowPath::Shared, RowPath::Reread, RowPath::Registers]
        .into_iter()
        .enumerate()
    {
        runs.push((2 + k as u64, false, Some(path)));
    }
    for (seed, wide, force) in runs {
        let Some(result) =
            emulated_agrees(graph, program, emulated, seed, seed % 2 == 1, wide, force)
        else {
            return false;
        };
        result.unwrap_or_else(|e| panic!("{}: {e}", graph.name));
    }
    true
}

/// The path the host picks for the one row kernel of `program` (lowered from `graph`) at
/// its own launch, with 16-byte aligned pointers.
fn host_row_path(graph: &Graph, program: &Program) -> RowPath {
    let LowerStep::Kernel(step) = &program.steps[0] else {
        panic!("{}: a generated kernel", graph.name);
    };
    let ir = &program.kernels[0];
    abi::row_path(
        ir,
        &step.launch,
        &fold(ir, &step.launch),
        &vec![0; ir.arg_count()],
    )
}

/// Row kernels over concats along an outer axis (`concat_graphs::row_kernels_of_concats`: softmax of
/// a batch concat with an empty and a one-row segment, layernorm over a middle-axis concat,
/// f16 log-softmax of rows past the on-chip caches) run as one piece per row, each block
/// branching on its row's segment: their kernels compile with NVRTC for sm_80 and sm_90 with
/// the row caches in registers, the host plans the vector path for whole-vector rows, and
/// through the CPU model of CUDA they equal the reference on the host's path, with 64-bit
/// indices, and forced onto every row path.
#[test]
fn emulated_row_kernels_of_concat_pieces_match_the_reference() {
    let mut emulated = BTreeMap::new();
    for graph in concat_graphs::row_kernels_of_concats() {
        let program = lowered(&graph);
        assert_eq!(program.kernels.len(), 1, "{}", graph.name);
        let ir = &program.kernels[0];
        assert!(ir.is_row_kernel(), "{}", graph.name);
        let split = fusebox::lower::split::split(ir).expect("row kernel pieces");
        let source = emit_module(&[(kernel_name(ir), ir)], &EmitOptions::default());
        assert!(
            source.contains(&format!("if (i{} < re", split.axis)),
            "{}: each row takes its segment's piece:\n{source}",
            graph.name
        );
        if let Some((ptx, _)) = check(&program.kernels) {
            assert!(
                !ptx.contains(".local"),
                "{}: row caches in registers",
                graph.name
            );
        }
        // The batch softmax's rows are whole vectors: the host takes the vector path.
        let natural = host_row_path(&graph, &program);
        if graph.name == "softmax_of_batch_concat" {
            assert_eq!(natural, RowPath::RegistersVector);
        }
        if !emulated_on_every_row_path(&graph, &program, &mut emulated) {
            return;
        }
    }
}

/// Row kernels over concats along their rows (`concat_graphs::row_kernels_of_row_concats`: segments
/// inside one vector, an empty and a one-column operand, an f16 operand, rank 3, rows past
/// the on-chip caches, segments of whole vectors) evaluate every operand at every element of
/// a row: their kernels compile with NVRTC for sm_80 and sm_90, an operand of the concat
/// cached on chip is loaded into the cache only inside its range, the host plans the vector
/// path exactly where every segment is made of whole vectors (elsewhere a vector would
/// straddle two), whose vector loads are guarded by the operand's range, and through the CPU
/// model of CUDA they equal the reference on the host's path, with 64-bit indices, and
/// forced onto every row path.
#[test]
fn emulated_row_kernels_along_row_concats_match_the_reference() {
    let mut emulated = BTreeMap::new();
    for graph in concat_graphs::row_kernels_of_row_concats() {
        let program = lowered(&graph);
        assert_eq!(program.kernels.len(), 1, "{}", graph.name);
        let ir = &program.kernels[0];
        assert!(ir.selects_along_rows(), "{}", graph.name);
        // The operands are cached where they are read in two passes, each cache load
        // guarded by the operand's range.
        let ranged = ir.range_views();
        let source = emit_module(&[(kernel_name(ir), ir)], &EmitOptions::default());
        for view in abi::row_cached(ir)
            .into_iter()
            .filter(|&v| ranged[v].is_some())
        {
            let r = ranged[view].expect("ranged").1;
            assert!(
                source.contains(&format!("< re{r}) ? p.p{view}[")),
                "{}: view {view}'s cache loads are guarded:\n{source}",
                graph.name
            );
        }
        let natural = host_row_path(&graph, &program);
        let whole_vectors = graph.name.contains("whole_vector_segments");
        assert_eq!(
            natural == RowPath::RegistersVector,
            whole_vectors,
            "{}: the vector path where segments are whole vectors",
            graph.name
        );
        if whole_vectors {
            assert!(
                source.contains("if (j0 >= rs") && source.contains("fbc_vload("),
                "{}: vector loads guarded by their ranges:\n{source}",
                graph.name
            );
        }
        check(&program.kernels);
        if !emulated_on_every_row_path(&graph, &program, &mut emulated) {
            return;
        }
    }
}

/// Registers and stack frame bytes of every entry point of `source`, compiled by NVRTC to an
/// sm_90 cubin with the runtime's options (`NvrtcCompiler::flags`, the virtual architecture
/// made a real one so that NVRTC assembles). They come from the cubin's `.nv.info` section:
/// records of a format byte, an attribute byte and, for sized records (format 4), a 16-bit
/// length and a payload; `EIATTR_REGCOUNT` (0x2f) and `EIATTR_FRAME_SIZE` (0x11) carry a
/// symbol index and a count. `None` without NVRTC.
fn sm90_resources(source: &str) -> Option<BTreeMap<String, (u32, u32)>> {
    use cudarc::nvrtc::{result, sys};
    use fusebox::backend::cuda::nvrtc::{CompileOptions, NvrtcCompiler};
    use object::{Object, ObjectSection, ObjectSymbol, SymbolIndex};
    let include = nvrtc()?;
    let mut options = NvrtcCompiler::new(CompileOptions::from_env())
        .flags("sm_90")
        .expect("NVRTC targets sm_90");
    for flag in &mut options {
        if flag.starts_with("--gpu-architecture=") {
            *flag = "--gpu-architecture=sm_90".into();
        }
    }
    options.push(format!("--include-path={}", include.display()));
    let src = CString::new(source).unwrap();
    let prog = result::create_program(&src, Some(c"fusebox.cu")).unwrap();
    unsafe { result::compile_program(prog, &options) }.expect("compiles for sm_90");
    let mut size = 0usize;
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .unwrap();
    let mut cubin = vec![0u8; size];
    unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }
        .result()
        .unwrap();
    unsafe { result::destroy_program(prog) }.unwrap();
    let elf = object::File::parse(&cubin[..]).expect("an ELF cubin");
    let info = elf
        .section_by_name(".nv.info")
        .expect(".nv.info")
        .data()
        .unwrap();
    let mut found: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let word = |at: usize| u32::from_le_bytes(info[at..at + 4].try_into().unwrap());
    let mut at = 0;
    while at + 4 <= info.len() {
        let (format, attribute) = (info[at], info[at + 1]);
        let len = if format == 4 {
            u16::from_le_bytes([info[at + 2], info[at + 3]]) as usize
        } else {
            0
        };
        if format == 4 && len == 8 && matches!(attribute, 0x2f | 0x11) {
            let symbol = elf
                .symbol_by_index(SymbolIndex(word(at + 4) as usize))
                .unwrap();
            let entry = found.entry(symbol.name().unwrap().to_string()).or_default();
            if attribute == 0x2f {
                entry.0 = word(at + 8);
            } else {
                entry.1 = word(at + 8);
            }
        }
        at += 4 + len;
    }
    Some(found)
}

/// The row kernels' register budgets, as the H200 figures were measured with them: each path
/// is an entry point of its own, and the vector path's `__launch_bounds__(FBC_BLOCK, 6)`
/// holds it at 40 registers (six blocks of 256 threads per SM), which is what moved softmax
/// [4096, 4096] from 0.060 to 0.040 ms. The 32-bit entries spill nothing (no stack frame);
/// the element path, with a guard and an address per slot, is the hungriest and must stay
/// below the 255 registers a thread can have. A merge of the paths back into one kernel, or a
/// lost bound, fails here without a GPU.
#[test]
fn row_kernel_entries_keep_their_register_budgets() {
    for (what, graph) in [
        ("softmax", row_graphs::softmax(DType::F32, &[4096, 4096])),
        (
            "layernorm",
            row_graphs::layernorm(DType::F32, &[8192, 1024], true),
        ),
    ] {
        let program = lowered(&graph);
        let ir = program
            .kernels
            .iter()
            .find(|k| k.is_row_kernel())
            .expect("a row kernel");
        let name = kernel_name(ir);
        let source = emit_module(&[(name.clone(), ir)], &EmitOptions::default());
        let Some(resources) = sm90_resources(&source) else {
            return;
        };
        for path in abi::row_paths(ir) {
            let part = abi::row_part(path);
            for width in ["i32", "i64"] {
                let entry = format!("{name}{part}_{width}");
                let &(registers, frame) = resources
                    .get(&entry)
                    .unwrap_or_else(|| panic!("{what}: no entry {entry} in {resources:?}"));
                assert!(registers > 0, "{what} {entry}: no register count");
                if path == RowPath::RegistersVector {
                    assert!(registers <= 40, "{what} {entry}: {registers} registers");
                }
                assert!(registers < 255, "{what} {entry}: {registers} registers");
                if width == "i32" {
                    assert_eq!(
                        frame, 0,
                        "{what} {entry}: a {frame}-byte stack frame (spills)"
                    );
                }
            }
        }
    }
}

/// Gather and scatter kernels (`gather_graphs`: every data dtype, i32 and i64 indices, rank-0
/// index tensors, size-0 axes, negative axes, indices negative, repeated and out of range;
/// gathers read by pointwise ops, row kernels and reductions) compile for sm_80 and sm_90 without warnings, and their emitted CUDA, run by the emulation
/// with 32- and 64-bit indexing, equals the reference, NaN fills and all; a scatter's sums bit
/// for bit, since each row is one thread's, in order.
#[test]
fn emulated_gathers_match_the_reference() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = common::gather_graphs::recipes();
    let graphs: Vec<Graph> = (0..40)
        .map(|_| common::gather_graphs::build(&strategy.new_tree(&mut runner).unwrap().current()))
        .collect();
    let programs: Vec<Program> = graphs.iter().map(lowered).collect();
    let mut kernels: Vec<KernelIr> = Vec::new();
    for ir in programs.iter().flat_map(|p| &p.kernels) {
        if ir.has_gathers() && !kernels.contains(ir) {
            kernels.push(ir.clone());
        }
    }
    assert!(kernels.len() >= 10, "only {} gather kernels", kernels.len());
    let scatters = kernels.iter().filter(|k| k.is_scatter_kernel()).count();
    assert!(scatters >= 4, "only {scatters} scatter kernels");
    // Gathers read inside row kernels and reduction kernels too.
    let rows = kernels.iter().filter(|k| k.is_row_kernel()).count();
    let reducing = kernels.iter().filter(|k| !k.reductions.is_empty()).count();
    assert!(
        rows >= 3 && reducing >= 3,
        "{rows} row and {reducing} reduction kernels"
    );
    check(&kernels);
    let mut emulated = BTreeMap::new();
    for (i, (graph, program)) in graphs.iter().zip(&programs).enumerate() {
        let inputs = common::gather_graphs::inputs(graph, i as u64);
        for wide in [false, true] {
            let Some(result) =
                emulated_agrees_on(graph, program, &mut emulated, &inputs, wide, None)
            else {
                return;
            };
            result.unwrap_or_else(|e| panic!("{e}\n{}", graph::file::to_ron(graph)));
        }
    }
}
