//! The CPU runtime: a program's kernels compiled into one loaded module, and the loop that
//! runs it.
//!
//! Compiling a program emits one C module holding each distinct kernel once, compiles it (or
//! finds it in the cache: kernels carry no sizes, so another batch size compiles nothing),
//! plans intermediate buffers by liveness ([`MemoryPlan`]), and checks every launch's views
//! lie inside their buffers, so a wrong launch is an error here rather than a wild write in C.
//! Running is then a loop over steps: kernel calls and matrix products ([`Gemm`]), on the
//! caller's thread (the kernels and the GEMM spread their work over OpenMP threads themselves).

use super::compiler::{CompileStats, Compiler, KernelFn, Module};
use super::emit;
use super::gemm::{EpilogueCall, Gemm, KeptPadding, PackedB, Placement, TileReduction};
use crate::backend::{BenchFacts, Executable, Target};
use crate::dag::Value;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::lower::{Epilogue, KernelStep, MatMulStep, Program, Step};
use crate::runtime::buffer::{Buffer, Elements, ElementsMut};
use crate::runtime::memory::MemoryPlan;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

/// A program ready to run: kernels loaded, memory planned.
pub struct CpuExecutable {
    program: Program,
    /// Per `program.kernels` entry, its loaded function.
    functions: Vec<KernelFn>,
    /// Per step, the strides flattened in the ABI's order (`strides[arg * rank + axis]`).
    flat_strides: Vec<Vec<i64>>,
    /// Per step, the sizes followed by the ranges of concats read in place
    /// ([`crate::lower::Launch::sizes_and_ranges`]).
    flat_sizes: Vec<Vec<i64>>,
    /// Per step, whether it is a product whose epilogue the GEMM runs on each tile
    /// ([`runs_per_tile`]).
    per_tile: Vec<bool>,
    /// Per `program.kernels` entry run per tile with reductions ([`tiled_reductions`]): its
    /// form run on each tile and the function finishing its reductions.
    tile_functions: Vec<Option<(KernelFn, KernelFn)>>,
    /// Per step, the reductions its epilogue ends in, where the GEMM runs it per tile.
    tile_reductions: Vec<Vec<TileReduction>>,
    plan: MemoryPlan,
    /// Per node, the first output naming it ([`crate::dag::Dag::first_output_of`]).
    output_of: Vec<Option<usize>>,
    slots: Vec<Buffer>,
    /// The module stays loaded as long as its functions may be called.
    _module: Arc<Module>,
    /// The GEMM, where the program has matrix products.
    gemm: Option<Gemm>,
    /// Per step, the packed right-hand matrix it shares with other products ([`shared_b`]).
    packed_of: Vec<Option<usize>>,
    packed: Vec<PackedB>,
    /// The padded image the products keep across steps and runs ([`KeptPadding`]).
    kept_padding: KeptPadding,
    source: String,
    /// What the compiler did while this executable was built.
    stats: CompileStats,
}

/// The most bytes a right-hand matrix kept packed across products may take.
const SHARED_B_BYTES: usize = 64 << 20;

/// Per step, the index of the packed matrix its product shares, and those matrices: a
/// right-hand operand read the same way (buffer, view, cast) by two products or more, within
/// [`SHARED_B_BYTES`]. Every value is written once in a run, before the steps that read it,
/// and its buffer is not reused while a step still reads it, so all those products read one
/// matrix. An unrolled RNN multiplies by its recurrent weights (or the one transposed copy of
/// them) once per step.
fn shared_b(program: &Program) -> (Vec<Option<usize>>, Vec<PackedB>) {
    // Per distinct right-hand operand: how it is read, and how many products read it; per
    // step, which of them its product reads.
    let mut keys: Vec<(&crate::lower::MatMulOperand, usize)> = Vec::new();
    let key_of: Vec<Option<usize>> = program
        .steps
        .iter()
        .map(|step| {
            let Step::MatMul(m) = step else { return None };
            let i = match keys.iter().position(|&(k, _)| *k == m.b) {
                Some(i) => i,
                None => {
                    keys.push((&m.b, 0));
                    keys.len() - 1
                }
            };
            keys[i].1 += 1;
            Some(i)
        })
        .collect();
    let mut packed = Vec::new();
    let slot_of_key: Vec<Option<usize>> = keys
        .iter()
        .map(|&(key, uses)| {
            let (shape, _) = key.layout(&program.dag.ty(key.value).shape);
            let [.., k, n] = shape[..] else { return None };
            let fits = PackedB::bytes(k, n).is_some_and(|b| b <= SHARED_B_BYTES);
            let buffer = (uses >= 2 && fits).then(|| PackedB::new(k, n)).flatten()?;
            packed.push(buffer);
            Some(packed.len() - 1)
        })
        .collect();
    let packed_of = key_of
        .iter()
        .map(|k| k.and_then(|i| slot_of_key[i]))
        .collect();
    (packed_of, packed)
}

/// The C source of `program`'s kernels, and each kernel's name in it (equal kernels share one
/// name, and the emitter writes each name once). A kernel that a GEMM runs per tile with
/// reductions is followed by its two functions for that ([`emit::emit_tile_functions`]).
pub fn module_source(program: &Program) -> (String, Vec<String>) {
    let names: Vec<String> = program.kernels.iter().map(emit::kernel_name).collect();
    let pairs: Vec<(String, &crate::lower::KernelIr)> =
        names.iter().cloned().zip(&program.kernels).collect();
    let mut source = emit::emit_module(&pairs);
    for (k, tiled) in tiled_reductions(program).into_iter().enumerate() {
        if let Some(text) = tiled
            .then(|| emit::emit_tile_functions(&program.kernels[k], &names[k]))
            .flatten()
        {
            source.push('\n');
            source.push_str(&text);
        }
    }
    (source, names)
}

/// Per `program.kernels` entry, whether it ends in reductions and is the epilogue of a product
/// whose GEMM runs it per tile.
fn tiled_reductions(program: &Program) -> Vec<bool> {
    let mut tiled = vec![false; program.kernels.len()];
    for step in &program.steps {
        if let Step::MatMul(m) = step
            && let Some(e) = &m.epilogue
            && runs_per_tile(program, m, e)
            && !program.kernels[e.step.kernel].reductions.is_empty()
        {
            tiled[e.step.kernel] = true;
        }
    }
    tiled
}

/// Whether the GEMM may run epilogue `e` of product `m` on each tile: its launch is plain
/// strides (no index-map stages, no ranges) over the product's shape, and both operands are
/// matrices or batches of them, so the shape's last two axes are the tile's rows and columns.
/// Its reductions, if any, end the kernel (no row kernel reads one back, which would need
/// whole rows) and each reduces the rows or the columns, so that a tile's part of a result
/// is a partial sum over the tile and the per-tile blocks of them stay smaller than the
/// product (`fb_gemm_reduction` in `gemm.c`).
fn runs_per_tile(program: &Program, m: &MatMulStep, e: &Epilogue) -> bool {
    let dag = &program.dag;
    let launch = &e.step.launch;
    let shape = &dag.ty(m.out).shape;
    let matrices = [&m.a, &m.b]
        .iter()
        .all(|op| op.layout(&dag.ty(op.value).shape).0.len() >= 2);
    let ir = &program.kernels[e.step.kernel];
    let rank = shape.len();
    let reductions_tile = !ir.is_row_kernel()
        && ir
            .reductions
            .iter()
            .all(|r| r.reduced.len() == rank && (r.reduced[rank - 1] || r.reduced[rank - 2]));
    matrices
        && reductions_tile
        && launch.maps.iter().all(|stages| stages.is_empty())
        && launch.ranges.is_empty()
        && launch.sizes.len() == rank
        && launch
            .sizes
            .iter()
            .zip(shape)
            .all(|(&n, &d)| n as usize == d)
}

/// The reductions epilogue `e` ends in, as the GEMM keeps their per-tile parts.
fn tile_reductions(program: &Program, e: &Epilogue) -> Vec<TileReduction> {
    let ir = &program.kernels[e.step.kernel];
    ir.reductions
        .iter()
        .enumerate()
        .map(|(r, red)| {
            let arg = ir.reduction_arg(r);
            let span = program
                .dag
                .ty(e.step.args[arg])
                .shape
                .iter()
                .product::<usize>();
            let identity = match crate::lower::accumulate::Accumulator::of_reduction(red).identity()
            {
                crate::lower::accumulate::Identity::Float(x) => x.to_bits() as i64,
                crate::lower::accumulate::Identity::Int(i) => i,
            };
            let reduced = red
                .reduced
                .iter()
                .enumerate()
                .filter(|&(_, &r)| r)
                .fold(0i64, |bits, (d, _)| bits | 1 << d);
            TileReduction {
                arg: arg as i64,
                span: span as i64,
                identity,
                reduced,
            }
        })
        .collect()
}

impl CpuExecutable {
    /// Compiles (or finds in `compiler`'s cache) and loads `program`'s kernels.
    pub fn new(program: Program, compiler: &Compiler) -> Result<CpuExecutable> {
        program.check_bounds()?;
        let before = compiler.stats();
        let (source, names) = module_source(&program);
        let module = compiler.compile(&source)?;
        let functions = names
            .iter()
            .map(|name| module.kernel(name))
            .collect::<Result<Vec<_>>>()?;
        let has_products = program.steps.iter().any(|s| matches!(s, Step::MatMul(_)));
        let gemm = has_products.then(|| Gemm::new(compiler)).transpose()?;
        let flat_strides = program
            .steps
            .iter()
            .map(|step| match step {
                // Index-map stages follow the strides (see `Launch`).
                Step::Kernel(k) => [k.launch.strides.concat(), k.launch.map_words()].concat(),
                Step::MatMul(m) => m.epilogue.as_ref().map_or_else(Vec::new, |e| {
                    [e.step.launch.strides.concat(), e.step.launch.map_words()].concat()
                }),
            })
            .collect();
        let flat_sizes = program
            .steps
            .iter()
            .map(|step| match step {
                Step::Kernel(k) => k.launch.sizes_and_ranges(),
                Step::MatMul(m) => m
                    .epilogue
                    .as_ref()
                    .map_or_else(Vec::new, |e| e.step.launch.sizes_and_ranges()),
            })
            .collect();
        let per_tile: Vec<bool> = program
            .steps
            .iter()
            .map(|step| match step {
                Step::MatMul(m) => m
                    .epilogue
                    .as_ref()
                    .is_some_and(|e| runs_per_tile(&program, m, e)),
                Step::Kernel(_) => false,
            })
            .collect();
        let tile_functions = tiled_reductions(&program)
            .into_iter()
            .zip(&names)
            .map(|(tiled, name)| {
                tiled
                    .then(|| {
                        Ok((
                            module.kernel(&emit::tile_function(name))?,
                            module.kernel(&emit::finish_function(name))?,
                        ))
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        let tile_reductions = program
            .steps
            .iter()
            .zip(&per_tile)
            .map(|(step, &tiled)| match step {
                Step::MatMul(m) if tiled => m
                    .epilogue
                    .as_ref()
                    .map_or_else(Vec::new, |e| tile_reductions(&program, e)),
                _ => Vec::new(),
            })
            .collect();
        let (packed_of, packed) = shared_b(&program);
        let plan = MemoryPlan::new(&program);
        let slots = plan
            .slot_bytes
            .iter()
            .map(|&bytes| {
                Buffer::try_zeroed(crate::dtype::DType::Bool, &[bytes])
                    .map_err(|e| Error::new(Site::default(), ErrorKind::Lower(e.to_string())))
            })
            .collect::<Result<_>>()?;
        Ok(CpuExecutable {
            output_of: program.dag.first_output_of(),
            program,
            functions,
            flat_strides,
            flat_sizes,
            per_tile,
            tile_functions,
            tile_reductions,
            plan,
            slots,
            _module: module,
            gemm,
            packed_of,
            packed,
            kept_padding: KeptPadding::default(),
            source,
            stats: compiler.stats().since(&before),
        })
    }

    /// Fresh output buffers of the right dtypes and shapes, in `dag.outputs` order.
    /// Panics if they cannot be allocated: [`Executable::run_tensors`] and
    /// [`Executable::time_runs`] report that as an error instead.
    pub fn output_buffers(&self) -> Vec<Buffer> {
        self.output_buffers_host().unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Target for Compiler {
    type Executable = CpuExecutable;
    const PROFILE: &'static str = "cpu";

    fn build(&self, program: Program) -> Result<CpuExecutable> {
        CpuExecutable::new(program, self)
    }
}

impl Executable for CpuExecutable {
    const BACKEND: &'static str = "cpu";
    type CompileStats = CompileStats;

    fn program(&self) -> &Program {
        &self.program
    }

    fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The C source that was compiled.
    fn source(&self) -> &str {
        &self.source
    }

    fn compile_stats(&self) -> CompileStats {
        self.stats
    }

    fn describe(&self) -> String {
        "cpu".into()
    }

    /// Runs the program on the caller's thread: `inputs` in `dag.inputs` order, results into
    /// `outputs` (from [`CpuExecutable::output_buffers`]).
    fn run_into(&mut self, inputs: &[Buffer], outputs: &mut [Buffer]) -> Result<()> {
        self.program
            .check_inputs(inputs.iter().map(|b| (b.dtype, b.shape.as_slice())))?;
        self.program
            .check_outputs(outputs.iter().map(|b| (b.dtype, b.shape.as_slice())))?;
        let in_ptrs: Vec<*const u8> = inputs.iter().map(Buffer::as_ptr).collect();
        let out_ptrs: Vec<*mut u8> = outputs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        // SAFETY: each buffer holds exactly its checked type's bytes, aligned to 64, and the
        // output buffers are borrowed mutably, so nothing else reads or writes them.
        unsafe { self.run_at(&in_ptrs, &out_ptrs) }
    }

    /// Wall-clock time per run after one warm-up run.
    fn time_runs(&mut self, inputs: &[Buffer], iters: usize) -> Result<Vec<f64>> {
        let mut outputs = self.output_buffers_host()?;
        self.run_into(inputs, &mut outputs)?;
        let mut times = Vec::with_capacity(iters.max(1));
        for _ in 0..iters.max(1) {
            let start = Instant::now();
            self.run_into(inputs, &mut outputs)?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        Ok(times)
    }

    fn bench_facts(&self, _bytes: u64, _iters: usize) -> Result<BenchFacts> {
        Ok(BenchFacts {
            threads: Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
            ..BenchFacts::default()
        })
    }
}

impl CpuExecutable {
    /// Runs the program on memory the caller owns: `inputs` in `dag.inputs` order, `outputs`
    /// in `dag.outputs` order, of the types [`crate::lower::Program::check_inputs`] and
    /// [`crate::lower::Program::check_outputs`] accept. This is how a run reads arrays it did not
    /// allocate (NumPy's, PyTorch's) without copying them: the kernels need only each
    /// element's natural alignment (streaming stores check 64-byte alignment themselves).
    ///
    /// # Safety
    ///
    /// Each pointer must be valid for its value's whole type (reads for inputs, writes for
    /// outputs), aligned to its dtype, and stay so during the call; no output may overlap
    /// another output or an input, and nothing else may touch the outputs meanwhile.
    pub unsafe fn run_at(&mut self, inputs: &[*const u8], outputs: &[*mut u8]) -> Result<()> {
        // Inputs may hold other values than in the last run: pack shared matrices again.
        for packed in &mut self.packed {
            packed.clear();
        }
        let dag = &self.program.dag;
        // The first output naming a node receives it; later aliases are copied at the end.
        let output_of = &self.output_of;
        let out_ptrs = outputs;
        let slot_ptrs: Vec<*mut u8> = self.slots.iter_mut().map(|b| b.as_mut_ptr()).collect();
        let pointer = |v: Value| -> *mut u8 {
            match v {
                Value::Input(i) => inputs[i] as *mut u8,
                Value::Node(n) => match (output_of[n], self.plan.slot_of[n]) {
                    (Some(k), _) => out_ptrs[k],
                    (None, Some(s)) => slot_ptrs[s],
                    (None, None) => std::ptr::null_mut(),
                },
            }
        };
        // A kernel step over its whole domain.
        let launch = |s: usize, k: &KernelStep| {
            let ptrs: Vec<*mut c_void> =
                k.args.iter().map(|&v| pointer(v) as *mut c_void).collect();
            // SAFETY: `check_bounds` proved every view of this launch lies inside its
            // buffer; the buffers outlive the call; the kernel follows the ABI documented
            // on `lower::ir::Launch`.
            unsafe {
                (self.functions[k.kernel])(
                    self.flat_sizes[s].as_ptr(),
                    self.flat_strides[s].as_ptr(),
                    k.launch.offsets.as_ptr(),
                    ptrs.as_ptr(),
                );
            }
        };
        for (s, step) in self.program.steps.iter().enumerate() {
            match step {
                Step::Kernel(k) => launch(s, k),
                Step::MatMul(m) => {
                    // The product is written as its own value or as the transpose of it
                    // the step writes instead (`lower::ResultView`).
                    let written = m.written();
                    let (ta, tb, to) = (dag.ty(m.a.value), dag.ty(m.b.value), dag.ty(written));
                    // SAFETY: each pointer is its value's buffer of exactly its type's size,
                    // 8-byte aligned; a step never writes a buffer it reads (the output is a
                    // node written here, its operands earlier values), and nothing else touches
                    // them during the call.
                    let (a, b, out) = unsafe {
                        (
                            Elements::from_raw(ta.dtype, &ta.shape, pointer(m.a.value)),
                            Elements::from_raw(tb.dtype, &tb.shape, pointer(m.b.value)),
                            ElementsMut::from_raw(to.dtype, &to.shape, pointer(written)),
                        )
                    };
                    let gemm = self.gemm.as_ref().ok_or_else(|| {
                        Error::backend("internal: a program with products has no GEMM loaded")
                    })?;
                    let epilogue = m.epilogue.as_ref();
                    let ptrs: Vec<*mut c_void> = epilogue.map_or_else(Vec::new, |e| {
                        e.step
                            .args
                            .iter()
                            .map(|&v| pointer(v) as *mut c_void)
                            .collect()
                    });
                    let per_tile = epilogue.filter(|_| self.per_tile[s]).map(|e| {
                        // An epilogue ending in reductions runs its form for tiles.
                        let tiled = self.tile_functions[e.step.kernel];
                        let reductions = &self.tile_reductions[s];
                        EpilogueCall {
                            kernel: tiled.map_or(self.functions[e.step.kernel], |(t, _)| t),
                            rank: e.step.launch.sizes.len() as i64,
                            args: e.step.args.len() as i64,
                            product: e.product as i64,
                            store_product: i64::from(e.store_product),
                            sizes: e.step.launch.sizes.as_ptr(),
                            strides: self.flat_strides[s].as_ptr(),
                            offsets: e.step.launch.offsets.as_ptr(),
                            ptrs: ptrs.as_ptr(),
                            finish: tiled.map(|(_, f)| f),
                            reductions: reductions.len() as i64,
                            reduction: reductions.as_ptr(),
                            fold_rows: 0,
                        }
                    });
                    // SAFETY: `check_bounds` proved the epilogue's launch over the product's
                    // whole shape lies inside its buffers, so each tile's does; its outputs
                    // are values no operand of the product is; its product argument reads
                    // the product's dtype (the lowering loads the product's value).
                    let ran = unsafe {
                        gemm.matmul_with(
                            a,
                            &m.a,
                            b,
                            &m.b,
                            out,
                            Placement {
                                result: m.result.as_ref(),
                                epilogue: per_tile.as_ref(),
                                packed_b: self.packed_of[s].map(|i| &self.packed[i]),
                                padding: Some(&self.kept_padding),
                            },
                        )
                    }
                    .map_err(|e| Error::backend(e.to_string()))?;
                    if let Some(e) = epilogue
                        && !ran
                    {
                        launch(s, &e.step);
                    }
                }
            }
        }
        // Outputs that are inputs, or that repeat another output's value.
        for (k, output) in dag.outputs.iter().enumerate() {
            let source = match output.value {
                Value::Input(i) => Some(inputs[i]),
                Value::Node(n) if output_of[n] != Some(k) => {
                    Some(outputs[output_of[n].expect("first alias")] as *const u8)
                }
                _ => None,
            };
            if let Some(src) = source {
                let ty = dag.ty(output.value);
                let bytes = ty.shape.iter().product::<usize>() * ty.dtype.size_bytes();
                // SAFETY: both hold this value's type (the caller's contract), and an output
                // overlaps no other array.
                unsafe { std::ptr::copy_nonoverlapping(src, outputs[k], bytes) };
            }
        }
        Ok(())
    }
}
