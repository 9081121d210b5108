//! The device-independent half of building an executable: a program's steps as a flat list
//! of device operations, the module source holding every kernel they launch, and the buffers
//! they need.
//!
//! Nothing here touches a GPU, so the whole plan — conversion kernels, launch plans,
//! parameter blocks, the source NVRTC compiles — is checked on machines without one (see
//! `tests/cuda_gpu.rs`). [`super::CudaExecutable`] adds the device: it loads the module,
//! resolves entry points, takes buffers from the pool and queues the operations.

use super::conv::{self, ConvGeometry};
use super::gemm::{self, GemmShape, GemmTypes, OperandSpec};
use super::lt::{self, LtEpilogue};
use super::pack;
use crate::backend::cuda::abi::{self, LaunchPlan};
use crate::backend::cuda::emit::{self, EmitOptions};
use crate::dag::Value;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::lower::{KernelIr, Launch, MatMulOperand, MatMulStep, Program, Step};
use crate::runtime::matmul::OperandLayout;
use std::collections::BTreeSet;

/// A buffer an operation reads or writes, resolved to an address at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// A graph value: an input, an output, or an intermediate's slot.
    Value(Value),
    /// Output `k` of the run (for aliases of one value under two output names).
    Output(usize),
    /// A matmul temporary: 0 and 1 for converted operands, 2 for a result before rounding,
    /// 3 for a product written through a transpose, 4 and 5 for padded operands.
    Temp(usize),
}

/// One launch of a generated kernel: every entry point of its plan, in order.
#[derive(Debug, Clone)]
pub struct KernelCall {
    /// Index into [`DevicePlan::kernels`].
    pub kernel: usize,
    pub launch: Launch,
    pub args: Vec<Buf>,
    /// Entry points with their grids (only launches with work), and the scratch sizes.
    pub plan: LaunchPlan,
}

/// One device operation of a run.
#[derive(Debug, Clone)]
pub enum Op {
    Kernel(KernelCall),
    Gemm {
        types: GemmTypes,
        shape: GemmShape,
        a: Buf,
        b: Buf,
        c: Buf,
        /// The product's epilogue, run by cuBLASLt on each tile ([`lt`]): `c` is then the
        /// epilogue's output, and the product itself is never written.
        epilogue: Option<LtEpilogue<Buf>>,
    },
    /// A convolution through cuDNN ([`conv`]): `y = conv(x, w)`, all three of `dtype` and
    /// contiguous, of the geometry's shapes.
    Conv {
        geometry: ConvGeometry,
        dtype: DType,
        x: Buf,
        w: Buf,
        y: Buf,
    },
    Zero {
        dst: Buf,
        bytes: usize,
    },
    Copy {
        dst: Buf,
        src: Buf,
        bytes: usize,
    },
}

/// Which libraries beside cuBLAS a plan may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Libraries {
    /// Products that are convolutions run through cuDNN ([`conv`]).
    pub cudnn: bool,
    /// Products whose epilogue cuBLASLt can run run through it ([`lt`]), in one call.
    pub lt_epilogues: bool,
}

/// Everything about running a program on a GPU that does not need the GPU.
#[derive(Debug, Clone)]
pub struct DevicePlan {
    /// The program's kernels, then the conversion kernels of matrix products.
    pub kernels: Vec<KernelIr>,
    /// Each kernel's name in the module ([`emit::kernel_name`]).
    pub names: Vec<String>,
    /// The CUDA C of every distinct kernel, one translation unit.
    pub source: String,
    pub ops: Vec<Op>,
    /// Bytes of each matmul temporary ([`Buf::Temp`]).
    pub temp_bytes: Vec<usize>,
    /// Bytes of each reduction scratch buffer: the largest any launch needs at that index
    /// (launches run one after another, so they share).
    pub scratch_bytes: Vec<usize>,
    /// Per dag node: the output it is written to directly (the first output naming it).
    pub output_of: Vec<Option<usize>>,
    /// The nodes no operation writes: products whose epilogue cuBLASLt runs on their tiles
    /// (for [`crate::runtime::memory::MemoryPlan::without`]).
    pub unwritten: Vec<usize>,
}

impl DevicePlan {
    /// Plans `program` for a device with `sm_count` SMs, calling the `libraries` beside
    /// cuBLAS that it may.
    pub fn new(
        program: &Program,
        options: &EmitOptions,
        sm_count: u32,
        libraries: Libraries,
    ) -> Result<DevicePlan> {
        program.check_bounds()?;
        let mut builder = Builder {
            kernels: program.kernels.clone(),
            ops: Vec::new(),
            temp_bytes: vec![0; 6],
            libraries,
            unwritten: Vec::new(),
        };
        for step in &program.steps {
            match step {
                Step::Kernel(k) => builder.kernel(
                    k.kernel,
                    k.launch.clone(),
                    k.args.iter().map(|&v| Buf::Value(v)).collect(),
                ),
                Step::MatMul(m) => {
                    builder.matmul(program, m)?;
                    // The epilogue runs in the GEMM where cuBLASLt can run it, otherwise
                    // after the GEMM, over the product's whole shape.
                    if let Some(e) = &m.epilogue
                        && !builder.epilogue_in_gemm(m, e)
                    {
                        let args = e.step.args.iter().map(|&v| Buf::Value(v)).collect();
                        builder.kernel(e.step.kernel, e.step.launch.clone(), args);
                    }
                }
            }
        }
        let output_of = program.dag.first_output_of();
        builder.alias_copies(program, &output_of);
        let Builder {
            kernels,
            mut ops,
            temp_bytes,
            libraries: _,
            unwritten,
        } = builder;
        let (source, names) = emit::emit_program(&kernels, options);
        let mut scratch_bytes: Vec<usize> = Vec::new();
        for op in &mut ops {
            let Op::Kernel(call) = op else { continue };
            let plan = abi::plan(
                &kernels[call.kernel],
                &names[call.kernel],
                &call.launch,
                sm_count,
                options,
            );
            for (i, &bytes) in plan.scratch_bytes.iter().enumerate() {
                match scratch_bytes.get_mut(i) {
                    Some(b) => *b = (*b).max(bytes),
                    None => scratch_bytes.push(bytes),
                }
            }
            call.plan = plan;
        }
        Ok(DevicePlan {
            kernels,
            names,
            source,
            ops,
            temp_bytes,
            scratch_bytes,
            output_of,
            unwritten,
        })
    }

    /// Every entry point some launch may take (a row kernel's, one per path).
    pub fn entry_points(&self) -> BTreeSet<&str> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Kernel(call) => Some(call.plan.launches.iter().flat_map(|l| {
                    l.entries()
                        .iter()
                        .filter(|e| !e.is_empty())
                        .map(String::as_str)
                })),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Device operations per run: kernel launches, cuBLAS calls, fills and copies.
    pub fn launches(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Kernel(call) => call.plan.launches.len(),
                Op::Gemm { shape, .. } => shape.calls.len(),
                Op::Conv { .. } | Op::Zero { .. } | Op::Copy { .. } => 1,
            })
            .sum()
    }

    /// Whether a run calls cuBLAS.
    pub fn uses_blas(&self) -> bool {
        self.ops.iter().any(|op| matches!(op, Op::Gemm { .. }))
    }

    /// The GEMMs that run their epilogue through cuBLASLt.
    pub fn lt_epilogues(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| {
                matches!(
                    op,
                    Op::Gemm {
                        epilogue: Some(_),
                        ..
                    }
                )
            })
            .count()
    }

    /// The convolutions a run passes to cuDNN.
    pub fn convolutions(&self) -> impl Iterator<Item = (&ConvGeometry, DType)> {
        self.ops.iter().filter_map(|op| match op {
            Op::Conv {
                geometry, dtype, ..
            } => Some((geometry, *dtype)),
            _ => None,
        })
    }
}

/// Turns steps into operations.
struct Builder {
    kernels: Vec<KernelIr>,
    ops: Vec<Op>,
    /// Bytes of each matmul temporary: the largest any product needs (they run one after
    /// another on one stream, so every product can use the same three).
    temp_bytes: Vec<usize>,
    libraries: Libraries,
    /// Products an epilogue in cuBLASLt keeps from being written.
    unwritten: Vec<usize>,
}

impl Builder {
    fn kernel(&mut self, kernel: usize, launch: Launch, args: Vec<Buf>) {
        self.ops.push(Op::Kernel(KernelCall {
            kernel,
            launch,
            args,
            plan: LaunchPlan {
                launches: Vec::new(),
                scratch_bytes: Vec::new(),
            },
        }));
    }

    fn intern(&mut self, ir: KernelIr) -> usize {
        match self.kernels.iter().position(|k| *k == ir) {
            Some(i) => i,
            None => {
                self.kernels.push(ir);
                self.kernels.len() - 1
            }
        }
    }

    /// A conversion of `len` elements of dtype `from` at `src` through `chain` into `dst`.
    fn convert(&mut self, from: DType, chain: &[DType], len: usize, src: Buf, dst: Buf) {
        if len == 0 {
            return;
        }
        let kernel = self.intern(pack::convert_ir(from, chain));
        self.kernel(kernel, pack::convert_launch(len), vec![src, dst]);
    }

    fn temp(&mut self, index: usize, bytes: usize) -> Buf {
        self.temp_bytes[index] = self.temp_bytes[index].max(bytes);
        Buf::Temp(index)
    }

    /// The operations of one matrix product, and where the step writes the product through a
    /// transpose of it (`lower::ResultView`), the gather that places it there: the product
    /// goes to a temporary first (cuBLAS writes contiguous matrices; reading the transposed
    /// layout as C's leading dimension is not planned yet).
    fn matmul(&mut self, program: &Program, m: &MatMulStep) -> Result<()> {
        let Some(result) = &m.result else {
            return self.product(program, m, Buf::Value(m.out));
        };
        let ty = program.dag.ty(m.out);
        let len = crate::shape::numel(&ty.shape);
        let product = self.temp(3, len * ty.dtype.size_bytes());
        self.product(program, m, product)?;
        if len > 0 {
            let view = crate::lower::OperandView::strided(
                program.dag.ty(result.value).shape.clone(),
                result.read.clone(),
            );
            let (ir, launch) = pack::gather(ty.dtype, &[], &view);
            let kernel = self.intern(ir);
            self.kernel(kernel, launch, vec![product, Buf::Value(result.value)]);
        }
        Ok(())
    }

    /// Moves epilogue `e` of product `m` into the GEMM just planned for it, when cuBLASLt may
    /// run it ([`lt::recognize`]): the GEMM then writes the epilogue's output and no kernel
    /// runs. Only for a product nothing else reads, written by one call straight into its
    /// own buffer.
    fn epilogue_in_gemm(&mut self, m: &MatMulStep, e: &crate::lower::Epilogue) -> bool {
        if !self.libraries.lt_epilogues || e.store_product || m.result.is_some() {
            return false;
        }
        let Some(Op::Gemm {
            types,
            shape,
            c,
            epilogue,
            ..
        }) = self.ops.last_mut()
        else {
            return false;
        };
        if *c != Buf::Value(m.out) || epilogue.is_some() || !lt::fits(types, shape) {
            return false;
        }
        let ir = &self.kernels[e.step.kernel];
        let sizes = &e.step.launch.sizes;
        let elements = sizes
            .iter()
            .try_fold(1usize, |n, &s| n.checked_mul(usize::try_from(s).ok()?));
        if elements != Some(shape.batches * shape.n * shape.m) {
            return false;
        }
        let Some((recognized, out)) = lt::recognize(ir, &e.step.launch, e.product, shape.m) else {
            return false;
        };
        let bias_dtype = recognized.bias.map(|(_, dtype)| dtype);
        if !lt::supports(types.input, recognized.out_dtype, bias_dtype) {
            return false;
        }
        let arg = |i: usize| Buf::Value(e.step.args[i]);
        *epilogue = Some(recognized.map(arg));
        *c = arg(out);
        if let Value::Node(i) = m.out {
            self.unwritten.push(i);
        }
        true
    }

    /// The operations of one matrix product into `dest`: operand conversions, the GEMM (or a
    /// zero fill when the inner dimension is empty), and the final rounding for integer
    /// products.
    fn product(&mut self, program: &Program, m: &MatMulStep, dest: Buf) -> Result<()> {
        let dag = &program.dag;
        let (ta, tb, tc) = (dag.ty(m.a.value), dag.ty(m.b.value), dag.ty(m.out));
        let node_error = |message: String| {
            Error::new(Site::node(dag.value_name(m.out)), ErrorKind::Lower(message))
        };
        // The operands' shapes as the product sees them (through absorbed views).
        let (a_shape, b_shape) = (m.a.layout(&ta.shape).0, m.b.layout(&tb.shape).0);
        let shape = gemm::plan_shape(&a_shape, &b_shape).map_err(|e| node_error(e.to_string()))?;
        let len = crate::shape::numel(&tc.shape);
        if len != shape.batches * shape.n * shape.m {
            return Err(node_error(format!(
                "matmul result has {} elements, its value {len}",
                shape.batches * shape.n * shape.m
            )));
        }
        if tc.dtype.category() == crate::dtype::Category::Integer {
            // Integer products are a wrapping reduction kernel, never cuBLAS (see
            // `pack::integer_matmul`); an empty inner dimension sums nothing: zeros.
            if len == 0 {
                return Ok(());
            }
            if shape.k == 0 {
                self.ops.push(Op::Zero {
                    dst: dest,
                    bytes: len * tc.dtype.size_bytes(),
                });
                return Ok(());
            }
            let (ir, launch) = pack::integer_matmul(
                pack::IntOperand {
                    dtype: ta.dtype,
                    cast: m.a.cast,
                    shape: &a_shape,
                },
                pack::IntOperand {
                    dtype: tb.dtype,
                    cast: m.b.cast,
                    shape: &b_shape,
                },
                tc.dtype,
            )
            .ok_or_else(|| node_error("matmul operands do not make a product".into()))?;
            // The product kernel reads contiguous operands: a view is gathered first.
            let a = self.operand(dag, 0, &m.a, None, ta.dtype);
            let b = self.operand(dag, 1, &m.b, None, tb.dtype);
            let kernel = self.intern(ir);
            self.kernel(kernel, launch, vec![a, b, dest]);
            return Ok(());
        }
        let spec = |op: &MatMulOperand, dtype| OperandSpec {
            dtype,
            cast: op.cast,
        };
        let types = gemm::choose_types(spec(&m.a, ta.dtype), spec(&m.b, tb.dtype), tc.dtype);
        if self.libraries.cudnn
            && len > 0
            && shape.k > 0
            && self.convolution(program, m, &types, dest)
        {
            return Ok(());
        }
        // cuBLAS reads an operand it needs no conversion of as it lies, through its view,
        // where the view's matrices have a unit stride; otherwise both are made contiguous.
        let (a_view, b_view) = (m.a.layout(&ta.shape).1, m.b.layout(&tb.shape).1);
        // An operand read through sub-axes (an im2col matrix) is gathered: cuBLAS reads two
        // strides per matrix.
        let padded = |op: &MatMulOperand| op.view.as_ref().is_some_and(|v| v.padding.is_some());
        let (a_lies, b_lies) = (
            types.a_chain.is_none() && m.a.split().is_none() && !padded(&m.a),
            types.b_chain.is_none() && m.b.split().is_none() && !padded(&m.b),
        );
        let contiguous = (
            crate::shape::Strided::contiguous(&a_shape),
            crate::shape::Strided::contiguous(&b_shape),
        );
        // Gathered operands are contiguous, and those that lie as they are have no sub-axes.
        let layout = |shape, strided, len| OperandLayout {
            split: None,
            shape,
            strided,
            len,
        };
        let direct = gemm::plan_strided(
            match a_lies {
                true => layout(&a_shape, &a_view, crate::shape::numel(&ta.shape)),
                false => layout(&a_shape, &contiguous.0, crate::shape::numel(&a_shape)),
            },
            match b_lies {
                true => layout(&b_shape, &b_view, crate::shape::numel(&tb.shape)),
                false => layout(&b_shape, &contiguous.1, crate::shape::numel(&b_shape)),
            },
        )
        .map_err(|e| node_error(e.to_string()))?;
        let (shape, a, b) = match direct {
            Some(direct) => {
                let a = match a_lies {
                    true => Buf::Value(m.a.value),
                    false => self.operand(dag, 0, &m.a, types.a_chain.as_deref(), types.input),
                };
                let b = match b_lies {
                    true => Buf::Value(m.b.value),
                    false => self.operand(dag, 1, &m.b, types.b_chain.as_deref(), types.input),
                };
                (direct, a, b)
            }
            None => (
                shape,
                self.operand(dag, 0, &m.a, types.a_chain.as_deref(), types.input),
                self.operand(dag, 1, &m.b, types.b_chain.as_deref(), types.input),
            ),
        };
        let c = match types.out_chain {
            Some(_) => self.temp(2, len * types.output.size_bytes()),
            None => dest,
        };
        if len > 0 {
            if shape.k == 0 {
                self.ops.push(Op::Zero {
                    dst: c,
                    bytes: len * types.output.size_bytes(),
                });
            } else {
                self.ops.push(Op::Gemm {
                    types: types.clone(),
                    shape,
                    a,
                    b,
                    c,
                    epilogue: None,
                });
            }
        }
        if let Some(chain) = &types.out_chain {
            self.convert(types.output, chain, len, c, dest);
        }
        Ok(())
    }

    /// Plans `m` as one cuDNN convolution into `dest` where it is one ([`conv::recognize`])
    /// of a dtype cuDNN convolves with the image, weight and output alike (after the
    /// operands' conversions, which convert the stored image, never its windows); `false`,
    /// planning nothing, otherwise.
    fn convolution(
        &mut self,
        program: &Program,
        m: &MatMulStep,
        types: &GemmTypes,
        dest: Buf,
    ) -> bool {
        let dag = &program.dag;
        let Some(view) = &m.b.view else {
            return false;
        };
        if types.out_chain.is_some()
            || types.input != types.output
            || !conv::convolves(types.output)
        {
            return false;
        }
        let (ta, tb) = (dag.ty(m.a.value), dag.ty(m.b.value));
        // cuDNN's images are [N, C, spatial…] with one to three spatial axes.
        if !(3..=5).contains(&tb.shape.len()) {
            return false;
        }
        let (a_shape, a_view) = m.a.layout(&ta.shape);
        let (b_shape, b_view) = m.b.layout(&tb.shape);
        let Some(padding) = crate::shape::Padding::of_view(view.padding.as_ref(), &tb.shape) else {
            return false;
        };
        let Some(b_len) = padding.padded_len() else {
            return false;
        };
        // The weight as cuDNN reads it: contiguous, as stored or gathered below.
        let contiguous = crate::shape::Strided::contiguous(&a_shape);
        let layout = |shape, strided, split, len| OperandLayout {
            shape,
            strided,
            split,
            len,
        };
        let a_len = crate::shape::numel(&a_shape);
        let b_layout = layout(&b_shape, &b_view, m.b.split(), b_len);
        let a_layout = layout(&a_shape, &contiguous, None, a_len);
        // A right operand cuBLAS reads as it lies (a 1x1 convolution's image) stays a GEMM.
        let as_it_lies = view.split.is_none()
            && view.padding.is_none()
            && types.b_chain.is_none()
            && matches!(gemm::plan_strided(a_layout, b_layout), Ok(Some(_)));
        if as_it_lies {
            return false;
        }
        let product = crate::runtime::matmul::strided_product(a_layout, b_layout, None);
        let Some(geometry) = product.ok().and_then(|p| conv::recognize(&p, &padding)) else {
            return false;
        };
        let stored_contiguous = m.a.view.as_ref().is_none_or(|v| {
            v.split.is_none()
                && v.padding.is_none()
                && a_view == contiguous
                && crate::shape::numel(&ta.shape) == a_len
        });
        let w = match (stored_contiguous, &types.a_chain) {
            (true, None) => Buf::Value(m.a.value),
            _ => self.operand(dag, 0, &m.a, types.a_chain.as_deref(), types.input),
        };
        let image = MatMulOperand {
            value: m.b.value,
            cast: m.b.cast,
            view: None,
        };
        let x = self.operand(dag, 1, &image, types.b_chain.as_deref(), types.input);
        self.ops.push(Op::Conv {
            geometry,
            dtype: types.input,
            x,
            w,
            y: dest,
        });
        true
    }

    /// The buffer the product reads operand `op` from (`index` 0 for the left, 1 for the
    /// right): its value as stored, or a temporary holding it rounded through `chain` into
    /// `input` (the GEMM's input dtype) and, where the call absorbed a view, gathered into a
    /// contiguous operand, in one pass.
    fn operand(
        &mut self,
        dag: &crate::dag::Dag,
        index: usize,
        op: &MatMulOperand,
        chain: Option<&[DType]>,
        input: DType,
    ) -> Buf {
        let ty = dag.ty(op.value);
        match (&op.view, chain) {
            (None, None) => Buf::Value(op.value),
            (None, Some(chain)) => {
                let n = crate::shape::numel(&ty.shape);
                let dst = self.temp(index, n * input.size_bytes());
                self.convert(ty.dtype, chain, n, Buf::Value(op.value), dst);
                dst
            }
            (Some(view), chain) => {
                let n = crate::shape::numel(&view.shape);
                let to = chain.and_then(|c| c.last().copied()).unwrap_or(ty.dtype);
                let dst = self.temp(index, n * to.size_bytes());
                if n > 0 {
                    let source = match &view.padding {
                        Some(padding) => self.padded(index, ty.dtype, padding, op.value),
                        None => Buf::Value(op.value),
                    };
                    let (ir, launch) = pack::gather(ty.dtype, chain.unwrap_or(&[]), view);
                    let kernel = self.intern(ir);
                    self.kernel(kernel, launch, vec![source, dst]);
                }
                dst
            }
        }
    }

    /// The zero padding of `value` in temporary `4 + index`: zeroed, then the value copied
    /// inside (cuBLAS cannot make the zeros while it reads, as the CPU GEMM does).
    fn padded(
        &mut self,
        index: usize,
        dtype: DType,
        padding: &crate::shape::Padding,
        value: Value,
    ) -> Buf {
        let bytes = padding.padded_len().unwrap_or(0) * dtype.size_bytes();
        let buf = self.temp(4 + index, bytes);
        self.ops.push(Op::Zero { dst: buf, bytes });
        if crate::shape::numel(&padding.source) > 0 {
            let (ir, launch) = pack::place(dtype, padding);
            let kernel = self.intern(ir);
            self.kernel(kernel, launch, vec![Buf::Value(value), buf]);
        }
        buf
    }

    /// Outputs that are graph inputs, or that repeat a value another output already holds,
    /// are copied at the end of the run.
    fn alias_copies(&mut self, program: &Program, output_of: &[Option<usize>]) {
        let dag = &program.dag;
        for (k, output) in dag.outputs.iter().enumerate() {
            let src = match output.value {
                Value::Input(i) => Buf::Value(Value::Input(i)),
                Value::Node(n) => match output_of[n] {
                    Some(first) if first != k => Buf::Output(first),
                    _ => continue,
                },
            };
            let ty = dag.ty(output.value);
            self.ops.push(Op::Copy {
                dst: Buf::Output(k),
                src,
                bytes: crate::shape::numel(&ty.shape) * ty.dtype.size_bytes(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleSet;

    /// The unfused program of a graph file's text.
    fn program(text: &str) -> Program {
        let rules = RuleSet::defaults();
        let (graph, _) = crate::graph::file::parse(text, "t.ron", &rules.ops).unwrap();
        let dag = crate::dag::Dag::from_graph(&graph, &rules.ops).unwrap();
        let partition = crate::partition::unfused(&dag, rules.cost.profile("h200").unwrap());
        crate::lower::lower(&dag, &partition).unwrap()
    }

    fn plan(text: &str) -> DevicePlan {
        DevicePlan::new(&program(text), &EmitOptions::default(), 132, CUDNN).unwrap()
    }

    /// An integer product is one wrapping reduction kernel reading the operands where they
    /// are and writing the result: no f64 temporaries, no cuBLAS (whose f64 GEMM would lose
    /// integers past 2^53 and saturate instead of wrapping).
    #[test]
    fn integer_matmul_is_a_wrapping_kernel_not_a_gemm() {
        let p = plan(
            r#"Graph(name: "t", inputs: [Input(name: "a", dtype: "i32", shape: [3, 4]),
                   Input(name: "b", dtype: "i32", shape: [4, 5])],
                 nodes: [Node(name: "c", op: "matmul", args: ["a", "b"])], outputs: ["c"])"#,
        );
        assert_eq!(p.ops.len(), 1, "{:#?}", p.ops);
        let Op::Kernel(call) = &p.ops[0] else {
            panic!("not a kernel: {:?}", p.ops[0]);
        };
        assert_eq!(
            call.args,
            vec![
                Buf::Value(Value::Input(0)),
                Buf::Value(Value::Input(1)),
                Buf::Value(Value::Node(0))
            ]
        );
        let ir = &p.kernels[call.kernel];
        assert_eq!(ir.reductions.len(), 1);
        assert_eq!(ir.reductions[0].view.dtype, DType::I32);
        assert_eq!(call.launch.sizes, vec![3, 5, 4]);
        assert!(!p.uses_blas());
        assert!(p.temp_bytes.iter().all(|&b| b == 0));
    }

    /// An f32 product of operands stored as f32 needs nothing around the GEMM; an empty inner
    /// dimension is a zero fill instead of a cuBLAS call.
    #[test]
    fn plain_and_empty_products() {
        let p = plan(
            r#"Graph(name: "t", inputs: [Input(name: "a", dtype: "f32", shape: [2, 3, 4]),
                   Input(name: "b", dtype: "f32", shape: [4, 5])],
                 nodes: [Node(name: "c", op: "matmul", args: ["a", "b"])], outputs: ["c"])"#,
        );
        assert!(matches!(&p.ops[..], [Op::Gemm { .. }]), "{:#?}", p.ops);
        assert_eq!(p.launches(), 1, "the batch folds into one GEMM");
        let p = plan(
            r#"Graph(name: "t", inputs: [Input(name: "a", dtype: "f32", shape: [2, 0]),
                   Input(name: "b", dtype: "f32", shape: [0, 5])],
                 nodes: [Node(name: "c", op: "matmul", args: ["a", "b"])], outputs: ["c"])"#,
        );
        match &p.ops[..] {
            [Op::Zero { dst, bytes }] => {
                assert_eq!(*dst, Buf::Value(Value::Node(0)));
                assert_eq!(*bytes, 10 * 4);
            }
            other => panic!("{other:?}"),
        }
        assert!(!p.uses_blas());
    }

    /// The fused program of a graph file's text, under the h200 profile.
    /// cuDNN for convolutions, cuBLASLt's epilogues off: the default options.
    const CUDNN: Libraries = Libraries {
        cudnn: true,
        lt_epilogues: false,
    };

    fn fused_plan(text: &str) -> DevicePlan {
        fused_plan_with(text, CUDNN)
    }

    fn fused_plan_with(text: &str, libraries: Libraries) -> DevicePlan {
        DevicePlan::new(
            &program_fused(text),
            &EmitOptions::default(),
            132,
            libraries,
        )
        .unwrap()
    }

    fn program_fused(text: &str) -> Program {
        let rules = RuleSet::defaults();
        let (graph, _) = crate::graph::file::parse(text, "t.ron", &rules.ops).unwrap();
        let dag = crate::dag::Dag::from_graph(&graph, &rules.ops).unwrap();
        let profile = rules.cost.profile("h200").unwrap();
        let partition = crate::partition::partition(&dag, &rules.fusion, profile);
        crate::lower::lower(&dag, &partition).unwrap()
    }

    /// A product by a zero padding of a value (the concat of it between zero slabs that a
    /// convolution's padding is): cuBLAS cannot make the zeros, so the padded buffer is
    /// zeroed, the value placed inside, and the operand read from there; no kernel of the
    /// program writes the slabs.
    #[test]
    fn a_padded_operand_is_built_before_the_gemm() {
        let p = fused_plan(
            r#"Graph(name: "t",
                inputs: [Input(name: "w", dtype: "f32", shape: [9, 8]),
                         Input(name: "x", dtype: "f32", shape: [5, 7])],
                nodes: [Node(name: "z", op: "const", attrs: {"value": 0.0, "dtype": "f32"}),
                    Node(name: "top", op: "broadcast_to", args: ["z"], attrs: {"shape": [3, 7]}),
                    Node(name: "xp", op: "concat", args: ["top", "x"], attrs: {"axis": 0}),
                    Node(name: "y", op: "matmul", args: ["w", "xp"])],
                outputs: ["y"])"#,
        );
        match &p.ops[..] {
            [
                Op::Zero { dst, bytes },
                Op::Kernel(place),
                Op::Kernel(gather),
                Op::Gemm { b, .. },
            ] => {
                assert_eq!((*dst, *bytes), (Buf::Temp(5), 8 * 7 * 4));
                assert_eq!(place.args, [Buf::Value(Value::Input(1)), Buf::Temp(5)]);
                assert_eq!(place.launch.offsets, [0, 3 * 7]);
                assert_eq!(gather.args, [Buf::Temp(5), Buf::Temp(1)]);
                assert_eq!(*b, Buf::Temp(1));
            }
            other => panic!("{other:#?}"),
        }
    }

    /// How cuBLAS reads an operand: `transposed`, with leading dimension `ld`.
    fn read(transposed: bool, ld: usize) -> gemm::MatrixRead {
        gemm::MatrixRead { transposed, ld }
    }

    /// A `Linear` (`x @ transpose(w)`) is one GEMM reading w where it lies, transposed
    /// (`CUBLAS_OP_T`); a view with no unit stride (every other column) is gathered by one
    /// kernel first; an operand that needs rounding is gathered and rounded in one kernel.
    #[test]
    fn views_are_read_in_place_where_cublas_can() {
        let linear = |w_node: &str, dtype: &str| {
            format!(
                r#"Graph(name: "t", inputs: [Input(name: "x", dtype: "{dtype}", shape: [8, 16]),
                   Input(name: "w", dtype: "f32", shape: [32, 16])],
                 nodes: [{w_node},
                         Node(name: "y", op: "matmul", args: ["x", "wt"])], outputs: ["y"])"#
            )
        };
        let transpose =
            r#"Node(name: "wt", op: "transpose", args: ["w"], attrs: {"perm": [1, 0]})"#;
        let p = fused_plan(&linear(transpose, "f32"));
        match &p.ops[..] {
            [Op::Gemm { shape, b, .. }] => {
                assert_eq!(*b, Buf::Value(Value::Input(1)));
                assert_eq!(shape.b, read(true, 16));
                assert_eq!(shape.a, read(false, 16));
            }
            other => panic!("{other:#?}"),
        }
        // w [16, 32], every other column: [16, 16] with strides [32, 2].
        let stepped = r#"Node(name: "wt", op: "slice", args: ["w"], attrs: {"axis": 1, "start": 0, "end": 32, "step": 2})"#;
        let p = fused_plan(&linear(stepped, "f32").replace("[32, 16]", "[16, 32]"));
        match &p.ops[..] {
            [Op::Kernel(_), Op::Gemm { shape, b, .. }] => {
                assert_eq!(*b, Buf::Temp(1));
                assert_eq!(shape.b, read(false, 16));
            }
            other => panic!("{other:#?}"),
        }
        // Every other row is a row stride: read in place.
        let rows = r#"Node(name: "wt", op: "slice", args: ["w"], attrs: {"axis": 0, "start": 1, "end": 32, "step": 2})"#;
        let p = fused_plan(&linear(rows, "f32").replace("[32, 16]", "[32, 32]"));
        match &p.ops[..] {
            [Op::Gemm { shape, .. }] => {
                assert_eq!(shape.b, read(false, 64));
                assert_eq!(shape.calls[0].b_offset, 32);
            }
            other => panic!("{other:#?}"),
        }
        let cast = r#"Node(name: "wc", op: "cast", args: ["w"], attrs: {"dtype": "f16"}),
            Node(name: "wt", op: "transpose", args: ["wc"], attrs: {"perm": [1, 0]})"#;
        let p = fused_plan(&linear(cast, "f16"));
        match &p.ops[..] {
            [Op::Kernel(_), Op::Gemm { b, .. }] => assert_eq!(*b, Buf::Temp(1)),
            other => panic!("{other:#?}"),
        }
    }

    /// A `Linear` with its bias and ReLU: without cuBLASLt's epilogues (the default), the
    /// GEMM writes the product and the epilogue runs after it as one kernel over the
    /// product's shape, reading it; the kernel is the program's epilogue kernel.
    #[test]
    fn an_epilogue_runs_after_its_gemm() {
        let p = fused_plan(
            r#"Graph(name: "t", inputs: [Input(name: "x", dtype: "f32", shape: [8, 16]),
                   Input(name: "w", dtype: "f32", shape: [32, 16]),
                   Input(name: "b", dtype: "f32", shape: [32])],
                 nodes: [Node(name: "wt", op: "transpose", args: ["w"], attrs: {"perm": [1, 0]}),
                         Node(name: "y", op: "matmul", args: ["x", "wt"]),
                         Node(name: "yb", op: "add", args: ["y", "b"]),
                         Node(name: "r", op: "relu", args: ["yb"])], outputs: ["r"])"#,
        );
        match &p.ops[..] {
            [Op::Gemm { c, .. }, Op::Kernel(call)] => {
                assert_eq!(*c, Buf::Value(Value::Node(1)));
                assert!(call.args.contains(&Buf::Value(Value::Node(1))));
                assert!(call.args.contains(&Buf::Value(Value::Node(3))));
                assert_eq!(call.launch.sizes, [8, 32]);
            }
            other => panic!("{other:#?}"),
        }
    }

    /// The same `Linear` with cuBLASLt's epilogues: one GEMM that adds the bias, applies the
    /// ReLU and writes the ReLU's value; no kernel runs and the product is never written.
    /// GELU's tanh form is cuBLASLt's GELU. A residual added after the ReLU, or the exact
    /// (erf) GELU, is not cuBLASLt's form: the kernel stays.
    #[test]
    fn an_epilogue_runs_in_the_gemm_through_cublaslt() {
        let linear = |tail: &str, extra: &str| {
            format!(
                r#"Graph(name: "t", inputs: [Input(name: "x", dtype: "f32", shape: [8, 16]),
                   Input(name: "w", dtype: "f32", shape: [32, 16]),
                   Input(name: "b", dtype: "f32", shape: [32]),
                   Input(name: "r", dtype: "f32", shape: [8, 32])],
                 nodes: [Node(name: "wt", op: "transpose", args: ["w"], attrs: {{"perm": [1, 0]}}),
                         Node(name: "y", op: "matmul", args: ["x", "wt"]),
                         Node(name: "yb", op: "add", args: ["y", "b"]),
                         {tail}], outputs: ["out"{extra}])"#
            )
        };
        let lt = Libraries {
            cudnn: true,
            lt_epilogues: true,
        };
        let p = fused_plan_with(
            &linear(r#"Node(name: "out", op: "relu", args: ["yb"])"#, ""),
            lt,
        );
        match &p.ops[..] {
            [Op::Gemm { c, epilogue, .. }] => {
                assert_eq!(*c, Buf::Value(Value::Node(3)));
                assert_eq!(
                    *epilogue,
                    Some(LtEpilogue {
                        alpha: 1.0,
                        bias: Some((Buf::Value(Value::Input(2)), DType::F32)),
                        residual: None,
                        activation: lt::Activation::Relu,
                        out_dtype: DType::F32,
                    })
                );
            }
            other => panic!("{other:#?}"),
        }
        assert_eq!(p.lt_epilogues(), 1);
        // The product is never written, so it takes no memory.
        assert_eq!(p.unwritten, [1]);
        let memory = crate::runtime::memory::MemoryPlan::without(
            &program_fused(&linear(
                r#"Node(name: "out", op: "relu", args: ["yb"])"#,
                "",
            )),
            &p.unwritten,
        );
        assert_eq!(memory.slot_of[1], None);
        let program = program_fused(&linear(
            r#"Node(name: "out", op: "relu", args: ["yb"])"#,
            "",
        ));
        assert!(crate::runtime::memory::MemoryPlan::new(&program).slot_of[1].is_some());
        // The residual inside the ReLU is cuBLASLt's `C`.
        let p = fused_plan_with(
            &linear(
                r#"Node(name: "s", op: "add", args: ["r", "yb"]),
                   Node(name: "out", op: "relu", args: ["s"])"#,
                "",
            ),
            lt,
        );
        match &p.ops[..] {
            [
                Op::Gemm {
                    epilogue: Some(e), ..
                },
            ] => {
                assert_eq!(e.residual, Some(Buf::Value(Value::Input(3))));
                assert_eq!(e.activation, lt::Activation::Relu);
            }
            other => panic!("{other:#?}"),
        }
        // GELU's tanh form is cuBLASLt's GELU.
        let p = fused_plan_with(
            &linear(r#"Node(name: "out", op: "gelu_tanh", args: ["yb"])"#, ""),
            lt,
        );
        match &p.ops[..] {
            [
                Op::Gemm {
                    epilogue: Some(e), ..
                },
            ] => {
                assert_eq!(e.activation, lt::Activation::GeluTanh);
                assert!(e.bias.is_some());
            }
            other => panic!("{other:#?}"),
        }
        // After the ReLU, with the pre-activation kept, or the exact GELU: a kernel after the
        // GEMM.
        for graph in [
            linear(r#"Node(name: "out", op: "gelu", args: ["yb"])"#, ""),
            linear(
                r#"Node(name: "a", op: "relu", args: ["yb"]),
                   Node(name: "out", op: "add", args: ["a", "r"])"#,
                "",
            ),
            linear(
                r#"Node(name: "out", op: "relu", args: ["yb"])"#,
                r#", "yb""#,
            ),
        ] {
            let p = fused_plan_with(&graph, lt);
            assert_eq!(p.lt_epilogues(), 0);
            assert!(
                matches!(&p.ops[..], [Op::Gemm { epilogue: None, .. }, Op::Kernel(_)]),
                "{:#?}",
                p.ops
            );
        }
    }

    /// A product written through the transpose that reads it goes to a temporary, and one
    /// gather kernel places it in the transpose's buffer.
    #[test]
    fn a_result_view_is_gathered_from_the_product() {
        let p = fused_plan(
            r#"Graph(name: "t", inputs: [Input(name: "p", dtype: "f32", shape: [2, 3, 4, 4]),
                   Input(name: "v", dtype: "f32", shape: [2, 3, 4, 5])],
                 nodes: [Node(name: "a", op: "matmul", args: ["p", "v"]),
                         Node(name: "t", op: "transpose", args: ["a"], attrs: {"perm": [0, 2, 1, 3]})],
                 outputs: ["t"])"#,
        );
        match &p.ops[..] {
            [Op::Gemm { c, .. }, Op::Kernel(call)] => {
                assert_eq!(*c, Buf::Temp(3));
                assert_eq!(call.args, [Buf::Temp(3), Buf::Value(Value::Node(1))]);
                assert_eq!(call.launch.sizes, [2, 4, 3, 5]);
            }
            other => panic!("{other:#?}"),
        }
        assert_eq!(p.temp_bytes[3], 2 * 3 * 4 * 5 * 4);
    }

    /// An output naming an input, and a value named by two outputs (as after the optimizer
    /// merged two equal nodes), are copied at the end.
    #[test]
    fn aliased_outputs_are_copied() {
        let mut program = program(
            r#"Graph(name: "t", inputs: [Input(name: "x", dtype: "f32", shape: [8])],
                 nodes: [Node(name: "y", op: "exp", args: ["x"])], outputs: ["y", "x"])"#,
        );
        let mut again = program.dag.outputs[0].clone();
        again.name = "y_again".into();
        program.dag.outputs.push(again);
        let p = DevicePlan::new(&program, &EmitOptions::default(), 132, CUDNN).unwrap();
        let copies: Vec<(Buf, Buf, usize)> = p
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Copy { dst, src, bytes } => Some((*dst, *src, *bytes)),
                _ => None,
            })
            .collect();
        assert_eq!(
            copies,
            vec![
                (Buf::Output(1), Buf::Value(Value::Input(0)), 32),
                (Buf::Output(2), Buf::Output(0), 32),
            ]
        );
        assert_eq!(p.output_of, vec![Some(0)]);
        assert!(matches!(p.ops[0], Op::Kernel(_)));
    }
}
