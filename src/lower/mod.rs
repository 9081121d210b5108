//! Lowering: from a partitioned dag to kernel IR and the steps that run it.
//!
//! The partition ([`crate::partition`]) decides which nodes share a kernel; lowering turns each
//! of its kernels into code without second-guessing it, so the kernels that run are exactly
//! the kernels the cost model priced. A fused kernel becomes one [`KernelIr`] launch; a layout
//! op becomes a strided copy (a concat, one copy per piece); a library call becomes a
//! [`MatMulStep`] that converts absorbed casts while packing its operands.
//!
//! A [`Program`] is specific to the graph's sizes (its [`Launch`]es), but the [`KernelIr`]s in
//! it are not: lowering the same graph at another batch size gives equal kernels, so a backend
//! that caches compiled kernels by their IR compiles nothing new.

pub mod accumulate;
pub mod fold;
mod fused;
pub mod ir;
mod layout;
pub mod merge_axes;
mod refine;
pub mod row_plan;
pub mod split;
pub mod verify;
pub mod view;

use crate::dag::{Dag, Value};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::partition::{KernelKind, Partition};
use crate::rules::{Builtin, OpKind};
pub use ir::{KernelIr, Launch};

/// A lowered graph: distinct kernels and the steps that run the graph with them.
#[derive(Debug, Clone)]
pub struct Program {
    /// The graph the steps compute: value types, names and outputs.
    pub dag: Dag,
    /// Distinct kernels; steps refer to them by index. Equal kernels are stored once.
    pub kernels: Vec<KernelIr>,
    /// In an order that runs the graph: every value is written before it is read.
    pub steps: Vec<Step>,
    /// How many kernels the partition had (a concat is one kernel but one step per piece).
    pub groups: usize,
}

impl Program {
    /// `inputs` (dtype and shape of each, in `dag.inputs` order) are what the graph takes.
    pub fn check_inputs<'a>(
        &self,
        inputs: impl ExactSizeIterator<Item = (DType, &'a [usize])>,
    ) -> Result<()> {
        let dag = &self.dag;
        let expected = dag.inputs.iter().map(|i| (i.name.as_str(), &i.ty));
        check_types("inputs", inputs, expected)
    }

    /// `outputs` (dtype and shape of each array a run writes, in `dag.outputs` order) are what
    /// the graph computes.
    pub fn check_outputs<'a>(
        &self,
        outputs: impl ExactSizeIterator<Item = (DType, &'a [usize])>,
    ) -> Result<()> {
        let dag = &self.dag;
        let expected = dag
            .outputs
            .iter()
            .map(|o| (o.name.as_str(), dag.ty(o.value)));
        check_types("outputs", outputs, expected)
    }

    /// Every view of every launch stays inside its buffer. Backends check this before running
    /// anything, so a wrong launch is an error rather than a stray write from generated code.
    /// Values written piece by piece are written whole and once ([`Program::check_writes`]).
    /// It also refuses a value larger than the reference evaluator materializes
    /// ([`crate::eval::MAX_ELEMENTS`]) before any buffer is allocated for it: an allocation
    /// that large would abort the process or be killed on first touch, not fail cleanly.
    pub fn check_bounds(&self) -> Result<()> {
        let dag = &self.dag;
        let values = (0..dag.inputs.len())
            .map(Value::Input)
            .chain((0..dag.nodes.len()).map(Value::Node));
        for v in values {
            let ty = dag.ty(v);
            if crate::shape::numel(&ty.shape) > crate::eval::MAX_ELEMENTS {
                return Err(Error::new(
                    Site::node(dag.value_name(v)),
                    ErrorKind::Lower(format!(
                        "shape {:?} has more than {} elements, the most a backend allocates \
                         (the reference evaluator's limit)",
                        ty.shape,
                        crate::eval::MAX_ELEMENTS
                    )),
                ));
            }
        }
        for step in &self.steps {
            match step {
                Step::MatMul(m) => {
                    for operand in [&m.a, &m.b] {
                        operand.check_bounds(dag)?;
                    }
                    if let Some(e) = &m.epilogue {
                        self.check_launch(&e.step)?;
                    }
                    if let Some(r) = &m.result {
                        let product = &dag.ty(m.out).shape;
                        let len = crate::shape::numel(&dag.ty(r.value).shape);
                        if !r.write.within(product, len) || crate::shape::numel(product) != len {
                            return Err(Error::new(
                                Site::node(dag.value_name(r.value)),
                                ErrorKind::Lower(
                                    "a product written outside its view's buffer".into(),
                                ),
                            ));
                        }
                    }
                }
                Step::Kernel(k) => self.check_launch(k)?,
            }
        }
        self.check_writes()
    }

    /// Whether every element kernel step `k` reaches lies inside its buffers (see
    /// [`Program::check_bounds`]).
    fn check_launch(&self, k: &KernelStep) -> Result<()> {
        let dag = &self.dag;
        // The kernel reads its index maps' words at entry, whatever the domain.
        let Some(ir) = self.kernels.get(k.kernel) else {
            return Err(Error::new(
                Site::default(),
                ErrorKind::Lower(format!("a launch of kernel {}, which is missing", k.kernel)),
            ));
        };
        for (a, view) in ir.views().enumerate() {
            let ranks: Vec<usize> = k.launch.stages(a).iter().map(|s| s.sizes.len()).collect();
            let wellformed = k
                .launch
                .stages(a)
                .iter()
                .all(|s| s.strides.len() == s.sizes.len());
            if ranks != view.stages || !wellformed {
                return Err(Error::new(
                    Site::default(),
                    ErrorKind::Lower(format!(
                        "argument {a} of a launch has index-map stages of ranks {ranks:?}, \
                         its kernel {:?}",
                        view.stages
                    )),
                ));
            }
        }
        let sizes = &k.launch.sizes;
        let ranges = &k.launch.ranges;
        if ranges.len() < ir.range_count() {
            return Err(Error::new(
                Site::default(),
                ErrorKind::Lower(format!(
                    "a launch gives {} ranges to a kernel reading {}",
                    ranges.len(),
                    ir.range_count()
                )),
            ));
        }
        if k.launch.gathers.len() < ir.gather_count()
            || k.launch
                .gathers
                .iter()
                .any(|g| g.extent < 0 || g.stride < 0)
        {
            return Err(Error::new(
                Site::default(),
                ErrorKind::Lower(format!(
                    "a launch gives gathers {:?} to a kernel reading {}",
                    k.launch.gathers,
                    ir.gather_count()
                )),
            ));
        }
        if sizes.contains(&0) {
            return Ok(());
        }
        // A gather's view reaches, past its own elements, every index of the axis it moves
        // along (the index is checked against the extent before the load); along an empty
        // axis it reads nothing.
        let mut gathered = vec![0i64; k.args.len()];
        let (mut empty, mut plain) = (vec![false; k.args.len()], vec![false; k.args.len()]);
        for instr in &ir.body {
            match instr {
                ir::Instr::GatherLoad { view, gather, .. } => {
                    let g = k.launch.gathers[*gather];
                    let reach = (g.extent.max(1) - 1).saturating_mul(g.stride);
                    gathered[*view] = gathered[*view].max(reach);
                    empty[*view] |= g.extent == 0;
                }
                ir::Instr::Load { view } | ir::Instr::RangeLoad { view, .. } => plain[*view] = true,
                _ => {}
            }
        }
        // A scatter store reaches, like a gather, every index of its axis.
        for (s, store) in ir.stores.iter().enumerate() {
            let Some(scatter) = store.scatter else {
                continue;
            };
            let g = k.launch.gathers[scatter.gather];
            let arg = ir.store_arg(s);
            gathered[arg] = gathered[arg].max((g.extent.max(1) - 1).saturating_mul(g.stride));
            empty[arg] |= g.extent == 0;
        }
        let unread: Vec<bool> = empty.iter().zip(&plain).map(|(&e, &p)| e && !p).collect();
        // A view read only inside one range is reached only there.
        let within = ir.range_views();
        for (a, &v) in k.args.iter().enumerate() {
            if unread[a] {
                continue;
            }
            let mut span: Vec<(i64, i64)> = sizes.iter().map(|&n| (0, n)).collect();
            if let Some(&Some((axis, r))) = within.get(a) {
                let (start, end) = ranges[r];
                // Non-empty: the C loops clamp coordinates into the range.
                if start < 0 || end > sizes[axis] || start >= end {
                    return Err(Error::new(
                        Site::node(dag.value_name(v)),
                        ErrorKind::Lower(format!(
                            "range {start}..{end} lies outside axis {axis} of size {}",
                            sizes[axis]
                        )),
                    ));
                }
                span[axis] = (start, end);
            }
            // The lowest and highest element reached: a negative stride reaches down.
            let (mut first, mut last) = (k.launch.offsets[a], k.launch.offsets[a]);
            for (&(low, high), &s) in span.iter().zip(&k.launch.strides[a]) {
                let (from, to) = (low.saturating_mul(s), (high - 1).saturating_mul(s));
                first = first.saturating_add(from.min(to));
                last = last.saturating_add(from.max(to));
            }
            last = last.saturating_add(gathered[a]);
            // Through an index map, the range above is of positions: each stage must hold
            // all of them, and then reaches what its whole shape reaches (a superset of
            // what those positions unflatten to, so the proof errs on the safe side).
            for stage in k.launch.stages(a) {
                let count = stage
                    .sizes
                    .iter()
                    .try_fold(1i64, |c, &n| if n > 0 { c.checked_mul(n) } else { None });
                if first < 0 || count.is_none_or(|c| last >= c || c > MAX_MAP_POSITIONS) {
                    return Err(Error::new(
                        Site::node(dag.value_name(v)),
                        ErrorKind::Lower(format!(
                            "an index map reaches position {last} of a reshape of {:?}",
                            stage.sizes
                        )),
                    ));
                }
                (first, last) = reach(stage.offset, &stage.sizes, &stage.strides);
            }
            let len = crate::shape::numel(&dag.ty(v).shape) as i64;
            if first < 0 || last >= len {
                return Err(Error::new(
                    Site::node(dag.value_name(v)),
                    ErrorKind::Lower(format!(
                        "a launch reaches element {last} of a buffer of {len}"
                    )),
                ));
            }
        }
        Ok(())
    }
}

/// The most positions a stage of an index map may hold. Positions below 2^51 are exact in
/// a double with room to spare, which lets the C emitter divide by a stage's sizes with a
/// rounded reciprocal and one correction; every stage a graph makes holds one of its values,
/// far fewer elements than this ([`crate::eval::MAX_ELEMENTS`]).
pub const MAX_MAP_POSITIONS: i64 = 1 << 51;

/// The largest element index a launch that passes [`Program::check_bounds`] reaches in any
/// buffer: the bounds check refuses values of more than [`crate::eval::MAX_ELEMENTS`], so an
/// emitter may index through 32-bit integers (the C emitter's gathers through index maps do).
pub const MAX_ELEMENT_INDEX: i64 = i32::MAX as i64;
const _: () = assert!(crate::eval::MAX_ELEMENTS as i64 - 1 <= MAX_ELEMENT_INDEX);

/// The lowest and highest of `offset + Σ i_d · strides[d]` over `0 ≤ i_d < sizes[d]` (sizes
/// all positive), saturating: a saturated bound is out of every buffer's range.
fn reach(offset: i64, sizes: &[i64], strides: &[i64]) -> (i64, i64) {
    let (mut first, mut last) = (offset, offset);
    for (&n, &s) in sizes.iter().zip(strides) {
        let reach = (n - 1).saturating_mul(s);
        if reach < 0 {
            first = first.saturating_add(reach);
        } else {
            last = last.saturating_add(reach);
        }
    }
    (first, last)
}

/// One unit of work.
// A program holds one step per kernel, so the product step's size (its operands' views, its
// epilogue's launch) costs nothing worth an indirection on every access.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Step {
    Kernel(KernelStep),
    MatMul(MatMulStep),
}

impl Step {
    /// The partition kernel this step belongs to.
    pub fn group(&self) -> usize {
        match self {
            Step::Kernel(k) => k.group,
            Step::MatMul(m) => m.group,
        }
    }

    /// Values read, and values written.
    pub fn reads_writes(&self, kernels: &[KernelIr]) -> (Vec<Value>, Vec<Value>) {
        match self {
            Step::Kernel(k) => {
                let loads = kernels[k.kernel].loads.len();
                (k.args[..loads].to_vec(), k.args[loads..].to_vec())
            }
            Step::MatMul(m) => {
                let (mut reads, mut writes) = (vec![m.a.value, m.b.value], vec![m.written()]);
                if let Some(e) = &m.epilogue {
                    let loads = kernels[e.step.kernel].loads.len();
                    let args = &e.step.args;
                    reads.extend(args[..loads].iter().filter(|&&v| v != m.out));
                    writes.extend(&args[loads..]);
                }
                (reads, writes)
            }
        }
    }
}

/// A launch of a generated kernel.
#[derive(Debug, Clone)]
pub struct KernelStep {
    /// Index into [`Program::kernels`].
    pub kernel: usize,
    pub launch: Launch,
    /// The buffer of each argument, in [`KernelIr::views`] order.
    pub args: Vec<Value>,
    pub group: usize,
}

/// A matrix product through the BLAS-like library (NumPy semantics: 1-D operands promoted,
/// batch dimensions broadcast), and the epilogue it runs on the product, if any.
#[derive(Debug, Clone)]
pub struct MatMulStep {
    pub a: MatMulOperand,
    pub b: MatMulOperand,
    pub out: Value,
    pub group: usize,
    pub epilogue: Option<Epilogue>,
    /// Where the product is written instead of a buffer of its own: a transpose of it that
    /// the call absorbed (see `partition/result_view.rs`).
    pub result: Option<ResultView>,
}

/// A product written as the value of a transpose of it: `write` places product element `q`
/// (row-major over the product's shape) at an element of `value`'s buffer; `read` is the same
/// map the other way, `value`'s element `q` as an element of the product (contiguous).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultView {
    pub value: Value,
    pub write: crate::shape::Strided,
    pub read: crate::shape::Strided,
}

impl MatMulStep {
    /// The value the step writes the product into: its own, or a transpose of it.
    pub fn written(&self) -> Value {
        self.result.as_ref().map_or(self.out, |r| r.value)
    }
}

/// The kernel a matrix product runs on its product (fusion.ron's `library_epilogues`): an
/// ordinary kernel over the product's shape, pointwise or ending in reductions, that reads the
/// product as argument `product` (a load of [`MatMulStep::out`]). Run after the product over
/// the whole domain, it computes what the unfused graph computes; a backend may instead run
/// it on each finished tile of the product, with the launch cut to the tile, and never store
/// the product (`store_product` says whether anything else reads it). Run per tile, a
/// reduction's results are partial: the backend adds up the tiles' parts before storing them
/// (the CPU's `fb_gemm_reduction`).
#[derive(Debug, Clone)]
pub struct Epilogue {
    pub step: KernelStep,
    /// The argument through which the kernel reads the product.
    pub product: usize,
    /// Whether the product must be stored too (a graph output or read by another step).
    pub store_product: bool,
}

/// A matmul operand as read from memory, with what the call absorbed (fusion.ron's
/// `library_casts` and `library_views`): a cast rounds each element to `cast` while packing,
/// then to the product's dtype, exactly as the unfused cast-then-matmul rounds it; layout ops
/// (a transpose, a slice, a broadcast batch) make `view` the strides through which the GEMM
/// reads `value`'s buffer, so no copy of the operand is made.
#[derive(Debug, Clone, PartialEq)]
pub struct MatMulOperand {
    pub value: Value,
    pub cast: Option<DType>,
    pub view: Option<OperandView>,
}

/// The operand a call reads through absorbed layout ops: its shape as the product sees it,
/// and where each element lies in the buffer of [`MatMulOperand::value`]: `strided` over
/// `shape`, or where `split` is given, over its sub-axes (`split.fine`), each axis of `shape`
/// a row-major group of them (an im2col matrix read from the image's windows). Where
/// `padding` is given, the strides address that zero padding of the buffer (a convolution's
/// padded image, never written): an element outside the buffer is zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperandView {
    pub shape: Vec<usize>,
    pub strided: crate::shape::Strided,
    pub split: Option<crate::shape::SplitAxes>,
    pub padding: Option<crate::shape::Padding>,
}

impl OperandView {
    /// A view of `shape` through `strided`, with no sub-axes.
    pub fn strided(shape: Vec<usize>, strided: crate::shape::Strided) -> OperandView {
        OperandView {
            shape,
            strided,
            split: None,
            padding: None,
        }
    }

    /// The shape `strided` is a view of: the sub-axes where the view has them. Its row-major
    /// order is the operand's, so gathering it contiguously gives the operand.
    pub fn strided_shape(&self) -> &[usize] {
        self.split.as_ref().map_or(&self.shape, |s| &s.fine)
    }
}

impl MatMulOperand {
    /// The operand `value`, read as stored.
    pub fn stored(value: Value) -> MatMulOperand {
        MatMulOperand {
            value,
            cast: None,
            view: None,
        }
    }

    /// Whether every element the operand's view addresses lies in its buffer: a backend
    /// reads through the view without checking each element.
    fn check_bounds(&self, dag: &Dag) -> Result<()> {
        let Some(view) = &self.view else {
            return Ok(());
        };
        let stored = crate::shape::numel(&dag.ty(self.value).shape);
        let addressed = match &view.padding {
            // The padding is of the stored value, and the view addresses the padded shape.
            Some(padding) if padding.source == dag.ty(self.value).shape => padding.padded_len(),
            Some(_) => None,
            None => Some(stored),
        };
        let inside = addressed.is_some_and(|n| view.strided.within(view.strided_shape(), n));
        match inside {
            true => Ok(()),
            false => Err(Error::new(
                Site::node(dag.value_name(self.value)),
                ErrorKind::Lower(format!(
                    "a matmul reads {:?} through strides {:?} from offset {}, outside the buffer",
                    view.strided_shape(),
                    view.strided.strides,
                    view.strided.offset
                )),
            )),
        }
    }

    /// The operand's shape as the product sees it and its strides over the buffer it is read
    /// from, whose shape is `stored` (strides over the sub-axes of [`MatMulOperand::split`]
    /// where the view has them).
    pub fn layout(&self, stored: &[usize]) -> (Vec<usize>, crate::shape::Strided) {
        match &self.view {
            Some(view) => (view.shape.clone(), view.strided.clone()),
            None => (stored.to_vec(), crate::shape::Strided::contiguous(stored)),
        }
    }

    /// The sub-axes the operand's view reads each axis through, if it has them.
    pub fn split(&self) -> Option<&crate::shape::SplitAxes> {
        self.view.as_ref().and_then(|v| v.split.as_ref())
    }
}

fn lower_error(dag: &Dag, node: usize, message: String) -> Error {
    Error::new(Site::node(&dag.nodes[node].name), ErrorKind::Lower(message))
}

/// Lowers every kernel of `partition` (a partition of `dag`, as [`crate::partition::partition`]
/// or [`crate::partition::unfused`] returns it).
///
/// Errors only when the partition breaks an invariant the partitioner guarantees (a node whose
/// shape does not broadcast to its kernel's domain, a reduction consumed inside its own
/// kernel, a layout op other than `broadcast_to` fused with others).
pub fn lower(dag: &Dag, partition: &Partition) -> Result<Program> {
    let mut program = Program {
        dag: dag.clone(),
        kernels: Vec::new(),
        steps: Vec::new(),
        groups: partition.kernels.len(),
    };
    let push = |program: &mut Program, group: usize, (mut ir, launch, args): Lowered| {
        // The rules' row arithmetic applies to row kernels; the rest keep the default, so
        // they stay equal (and share compiled code) whatever the rules say.
        if ir.is_row_kernel() {
            ir.row_arithmetic = partition.row_arithmetic;
        }
        // Index maps become strides wherever the domain can be split to follow them.
        let (ir, launch) = refine::refine(ir, launch);
        let kernel = intern(ir, &mut program.kernels);
        program.steps.push(Step::Kernel(KernelStep {
            kernel,
            launch,
            args,
            group,
        }));
    };
    // A literal is inlined into the fused kernels that use it and is no kernel of its own,
    // but copies and library calls read their operands from memory, and a graph output must
    // be written: such literals are materialized first (they depend on nothing).
    let mut needs_buffer = dag.output_mask();
    for kernel in &partition.kernels {
        if kernel.kind != KernelKind::Fused {
            let member = |p: usize| kernel.nodes.contains(&p);
            let call = kernel
                .nodes
                .iter()
                .any(|&n| dag.nodes[n].op.kind() == OpKind::Opaque);
            for &n in &kernel.nodes {
                // The zero slabs of a padding a library call makes itself are read by no one
                // (a copy kernel writing a slab reads its literal).
                if call && crate::partition::zero_slab(dag, Value::Node(n)) {
                    continue;
                }
                for &arg in &dag.nodes[n].args {
                    if let Value::Node(p) = arg {
                        needs_buffer[p] = true;
                    }
                }
                // What the call reads: each operand's source, which may be a literal even
                // through a zero slab (a product by a broadcast zero).
                if dag.nodes[n].op.kind() == OpKind::Opaque {
                    for &arg in &dag.nodes[n].args {
                        if let Some(tree) = crate::partition::operand_tree(dag, arg, &member)
                            && let Value::Node(s) = tree.source
                        {
                            needs_buffer[s] = true;
                        }
                    }
                }
            }
        }
    }
    for (n, &needed) in needs_buffer.iter().enumerate() {
        if needed && dag.nodes[n].op.is_literal() {
            let shape = dag.nodes[n].ty.shape.clone();
            let lowered = fused::lower_fused(dag, &[n], &shape, &[Value::Node(n)], &[])?;
            let group = program.groups;
            push(&mut program, group, lowered);
        }
    }
    for (group, kernel) in partition.kernels.iter().enumerate() {
        let opaque = kernel
            .nodes
            .iter()
            .copied()
            .find(|&n| dag.nodes[n].op.kind() == OpKind::Opaque);
        if let Some(call) = opaque {
            let parts = crate::partition::LibraryParts::of(dag, &kernel.nodes);
            let mut step = matmul_step(dag, &parts.operands, call, group)?;
            if let Some(view) = parts.result {
                step.result = Some(result_view(dag, call, view)?);
            }
            let mut after = None;
            if !parts.epilogue.is_empty() {
                match epilogue(dag, kernel, &parts.epilogue, group, &mut program)? {
                    LoweredEpilogue::Tiled(lowered) => step.epilogue = Some(lowered),
                    LoweredEpilogue::After(lowered) => after = Some(lowered),
                }
            }
            program.steps.push(Step::MatMul(step));
            if let Some(lowered) = after {
                push(&mut program, group, lowered);
            }
        } else if kernel.kind == KernelKind::Alone {
            let n = kernel.nodes[0];
            if kernel.nodes.len() != 1 {
                return Err(lower_error(
                    dag,
                    n,
                    format!(
                        "copy kernel `{}` holds {} other node(s); a copy is one layout op",
                        dag.nodes[n].op.name(),
                        kernel.nodes.len() - 1
                    ),
                ));
            }
            for piece in layout::lower_copy(dag, n)? {
                push(&mut program, group, piece);
            }
        } else {
            let lowered = fused::lower_fused(
                dag,
                &kernel.nodes,
                &kernel.domain,
                &kernel.outputs,
                &kernel.segments,
            )?;
            push(&mut program, group, lowered);
        }
    }
    Ok(program)
}

/// A kernel, its launch and its buffer per argument.
type Lowered = (KernelIr, Launch, Vec<Value>);

/// The index of `ir` in `kernels`, added if no equal kernel is there: equal kernels share one
/// compiled function.
fn intern(ir: KernelIr, kernels: &mut Vec<KernelIr>) -> usize {
    match kernels.iter().position(|k| *k == ir) {
        Some(i) => i,
        None => {
            kernels.push(ir);
            kernels.len() - 1
        }
    }
}

/// The transpose `view` of product `call` as the place the call writes the product.
fn result_view(dag: &Dag, call: usize, view: usize) -> Result<ResultView> {
    let node = &dag.nodes[view];
    let product = &dag.nodes[call].ty.shape;
    let plan = crate::graph::check::plan_builtin(Builtin::Transpose, &[product], &node.attrs)
        .map_err(|e| lower_error(dag, view, e.to_string()))?
        .0;
    let crate::graph::check::BuiltinPlan::Transpose(perm) = plan else {
        return Err(lower_error(
            dag,
            view,
            "a library call writes through a transpose only".into(),
        ));
    };
    // Axis d of the transpose is axis perm[d] of the product, so product axis perm[d] steps
    // by the transpose's stride along d.
    let read = crate::shape::Strided::contiguous(product).transpose(&perm);
    let own = crate::shape::Strided::contiguous(&node.ty.shape);
    let mut write = vec![0i64; perm.len()];
    for (d, &p) in perm.iter().enumerate() {
        write[p] = own.strides[d];
    }
    Ok(ResultView {
        value: Value::Node(view),
        write: crate::shape::Strided {
            offset: 0,
            strides: write,
        },
        read,
    })
}

/// A library call's epilogue as lowered: run by the call on each tile of its product, or,
/// where its values do not merge into the product's tiles, after the call as a kernel of
/// its own (the call then stores its product).
enum LoweredEpilogue {
    Tiled(Epilogue),
    After(Lowered),
}

/// The epilogue of the library kernel `kernel`: its nodes `nodes` lowered as a fused kernel
/// over the product's shape, reading the product from memory; where it iterates over the
/// product's last axis split into several and its values do not merge back into one axis,
/// that kernel over its own domain, to run after the call. Its launch is not refined (a
/// backend that runs it per tile cuts the launch along the product's last two axes, which
/// refining could merge or split).
fn epilogue(
    dag: &Dag,
    kernel: &crate::partition::Kernel,
    nodes: &[usize],
    group: usize,
    program: &mut Program,
) -> Result<LoweredEpilogue> {
    let call = kernel
        .nodes
        .iter()
        .copied()
        .find(|&n| dag.nodes[n].op.kind() == OpKind::Opaque)
        .ok_or_else(|| lower_error(dag, nodes[0], "an epilogue without its call".into()))?;
    let product = Value::Node(call);
    let outputs: Vec<Value> = kernel
        .outputs
        .iter()
        .copied()
        .filter(|&v| v != product)
        .collect();
    let (mut ir, mut launch, args) = fused::lower_fused(dag, nodes, &kernel.domain, &outputs, &[])?;
    // Over the product's shape with its last axis split (a convolution's product read as an
    // image): the split axes merged back, so the GEMM can cut the launch into its tiles.
    let rank = dag.nodes[call].ty.shape.len();
    if kernel.domain.len() != rank
        && !merge_axes::merge_trailing_axes(&mut ir, &mut launch, rank - 1)
    {
        return Ok(LoweredEpilogue::After((ir, launch, args)));
    }
    let loads = ir.loads.len();
    let Some(read) = args[..loads].iter().position(|&v| v == product) else {
        return Err(lower_error(
            dag,
            call,
            "the epilogue does not read the product".into(),
        ));
    };
    // A second load of the product (the lowering shares one load per view, so this is a
    // safeguard) reads it from its buffer, which the product must then fill.
    let store_product = kernel.outputs.contains(&product)
        || args[..loads].iter().filter(|&&v| v == product).count() > 1;
    let index = intern(ir, &mut program.kernels);
    Ok(LoweredEpilogue::Tiled(Epilogue {
        step: KernelStep {
            kernel: index,
            launch,
            args,
            group,
        },
        product: read,
        store_product,
    }))
}

fn matmul_step(dag: &Dag, nodes: &[usize], call: usize, group: usize) -> Result<MatMulStep> {
    let node = &dag.nodes[call];
    if node.op.builtin() != Some(Builtin::MatMul) || node.args.len() != 2 {
        return Err(lower_error(
            dag,
            call,
            format!(
                "opaque op `{}` has no library implementation (only matmul does)",
                node.op.name()
            ),
        ));
    }
    let operand = |arg: Value| absorbed_operand(dag, nodes, arg);
    Ok(MatMulStep {
        a: operand(node.args[0])?,
        b: operand(node.args[1])?,
        out: Value::Node(call),
        group,
        epilogue: None,
        result: None,
    })
}

/// Operand `arg` of a library call whose kernel holds `nodes`: the value the call reads, back
/// through the casts and layout ops it absorbed (at most one cast; the views' index maps
/// composed from that value's buffer outward, a concat of views stacked into one, which the
/// partition checked are strides, or strides over sub-axes).
fn absorbed_operand(dag: &Dag, nodes: &[usize], arg: Value) -> Result<MatMulOperand> {
    let refused = |message: &str| {
        let at = match arg {
            Value::Node(p) => p,
            Value::Input(_) => nodes.last().copied().unwrap_or_default(),
        };
        lower_error(dag, at, message.into())
    };
    let member = |p: usize| nodes.contains(&p);
    let tree = crate::partition::operand_tree(dag, arg, &member).ok_or_else(|| {
        refused("a library call absorbs one cast and strided layout ops, nothing else")
    })?;
    if tree.casts.len() > 1 {
        return Err(refused(
            "a library call absorbs one cast and strided layout ops, nothing else",
        ));
    }
    let source = tree.source;
    let source_shape = &dag.ty(source).shape;
    let cast = tree.casts.first().copied();
    let shape = &dag.ty(arg).shape;
    let view = match tree.map.split_strided(shape) {
        Some((strided, None))
            if shape == source_shape
                && strided == crate::shape::Strided::contiguous(shape)
                && tree.padding.is_none() =>
        {
            None
        }
        Some((strided, split)) => Some(OperandView {
            shape: shape.clone(),
            strided,
            split,
            padding: tree.padding,
        }),
        None => {
            return Err(refused(
                "a library call reads its operand through strides, not a reshape index map",
            ));
        }
    };
    Ok(MatMulOperand {
        value: source,
        cast,
        view,
    })
}

/// `given` (dtype and shape of each) against the graph's `expected` values, by position; the
/// error names the value that differs.
fn check_types<'a, 'e>(
    what: &str,
    given: impl ExactSizeIterator<Item = (DType, &'a [usize])>,
    expected: impl ExactSizeIterator<Item = (&'e str, &'e crate::graph::TensorType)>,
) -> Result<()> {
    if given.len() != expected.len() {
        return Err(Error::input(format!(
            "{} {what} given, the graph has {}",
            given.len(),
            expected.len()
        )));
    }
    for ((dtype, shape), (name, ty)) in given.zip(expected) {
        if dtype != ty.dtype || shape != ty.shape.as_slice() {
            return Err(Error::new(
                Site::node(name),
                ErrorKind::Input(format!(
                    "expected {} {:?}, got {dtype} {shape:?}",
                    ty.dtype, ty.shape
                )),
            ));
        }
    }
    Ok(())
}
