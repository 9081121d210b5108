//! The kernel IR: what one generated kernel computes, with every size left out.
//!
//! A [`KernelIr`] is specialised on dtypes, rank and the broadcast/stride *pattern* of each
//! view, never on concrete sizes: sizes, strides and offsets arrive at run time as a
//! [`Launch`]. Two graphs that differ only in batch size lower to equal `KernelIr`s, emit equal
//! source, and hit the same compiled kernel. The CPU (C) and CUDA emitters both read this IR.
//!
//! # Execution model
//!
//! A kernel iterates over a *domain* of `rank ≥ 1` axes. Every buffer it touches is a [`View`]
//! over that domain: element `(i_0, …, i_{r-1})` of view `v` lives at
//! `ptr_v[offset_v + Σ_d i_d · stride_v[d]]` (in elements of the view's dtype). Loads read
//! views, stores write them, and reductions accumulate into them (a reduced axis has stride 0
//! in the output view).
//!
//! The body is straight-line SSA over per-element scalars: [`Instr`]s, each producing one
//! value at a compute precision ([`Prec`]): f16, bf16 and f32 values are held as C `float`,
//! f64 and bool as `double`, i32 and i64 as `int64_t` (as the reference evaluator holds them),
//! so every integer or bool value is exact and every float value is exactly the graph's value.
//! Integer arithmetic wraps in 64 bits (emitters spell it through unsigned arithmetic, since
//! signed overflow is undefined in C); an i32 result is wrapped to 32 bits by its `Round`.
//! Rounding happens only where an [`Instr::Round`] says so, which is where the unfused graph
//! rounds: operands converted to an op's common dtype, and each result to its dtype.
//!
//! # Row kernels
//!
//! A kernel whose body holds [`Instr::RowReduce`]s is a *row kernel*: its domain splits into
//! the outer axes (one point of them is a *row*) and the innermost axis (the row's elements).
//! A `RowReduce` is the reduction of a value over the row it is evaluated in, broadcast along
//! that row, so later instructions may read it. Each row is visited in passes
//! ([`KernelIr::levels`]): pass `p` evaluates the values of level at most `p` at every element
//! of the row and accumulates the `RowReduce`s of level `p + 1`; the last pass writes the
//! stores. Softmax makes three passes (max; sum of exponentials; normalize), layernorm three
//! (mean; variance; normalize), and independent reductions of one row share a pass. A row
//! kernel has no [`Reduction`]s: every reduction in it is a `RowReduce`, and a result a row
//! kernel writes is a [`Store`] (broadcast along the innermost axis when it has one element per
//! row). Nothing here depends on sizes either: a row is whatever the innermost size is.
//!
//! A row kernel may read a concat by ranges ([`Instr::RangeLoad`], [`Instr::Select`]) along
//! an outer axis by one set of segments, so that every row lies in one segment and the kernel
//! cuts into one row kernel per segment ([`crate::lower::split`]), which is how the emitters
//! run it; or along its rows only ([`KernelIr::selects_along_rows`]), where each pass
//! evaluates every operand at every element of the row and the select picks.
//! [`KernelIr::verify`] refuses the rest (selects along both, or along an outer axis by
//! several sets of segments).
//!
//! ## Precision of row kernels
//!
//! A row kernel's [`KernelIr::row_arithmetic`] (fusion.ron's `row_arithmetic`) says which
//! arithmetic it may use. Under `RowArithmetic::Exact` an emitter takes none of the freedoms
//! below: a float sum is accumulated in f64 (in any order) and rounded once, every division
//! is correctly rounded, as in the reference evaluator, and `exp` is the pointwise kernels'.
//! Under `RowArithmetic::Relaxed` (the default), three freedoms let an emitter keep a row's
//! arithmetic near its memory traffic; everything else is exactly as in pointwise kernels.
//! For a row of `n` values `x_i` held at `Prec::F32`:
//!
//! - A float `Sum` or `Mean` may add up to 16 values per partial sum in f32 before the
//!   partials join an f64 total, so before its one rounding to `dtype` the result is within
//!   `(15·2⁻²⁴ + n·2⁻⁵³)·Σ|x_i|` of the exact sum (f64 alone: `n·2⁻⁵³·Σ|x_i|`). A block whose
//!   f32 partials overflow is added again in f64, so the result is ±Inf or NaN exactly when
//!   the f64 sum is. For softmax's positive terms that is a relative error of at most
//!   9·10⁻⁷.
//! - An f32 division `a / b` whose divisor is a row constant computed from `RowReduce`s may be
//!   `a · (1/b)` with `1/b` rounded once per row, where `|b|` is within `[2⁻¹²⁶, 2¹²⁶]` (any
//!   other divisor divides): within `2⁻²³` of the exact quotient relatively (`2⁻¹⁴⁹` absolutely
//!   below the normal range), where the division is within `2⁻²⁴`.
//! - An f32 `exp` may be within 2.5 ulp of `e^x` (ulps of the f32 result; 2⁻¹⁴⁹ below the
//!   normal range), where the pointwise kernels' is within 1.05 ulp, with the same results at
//!   the edges: NaN for NaN, +Inf from the overflow threshold 88.7228… up, +0 below
//!   -103.972…, subnormal results between. (Measured over 4.3 million inputs across that
//!   whole range and its edges, against f64 `exp`: 2.2 and 1.05 ulp; `tests/rows.rs`.)
//!
//! Softmax's outputs are then within about `18·2⁻²⁴ ≈ 1.1·10⁻⁶` of the values computed with
//! the f64 sum and the division (relatively), and within `31·2⁻²⁴ ≈ 1.9·10⁻⁶` of them with
//! the pointwise `exp` too, far inside the f32 tolerance (`2·10⁻⁵`) of the equivalence tests.
//! Both emitters use the sum and division freedoms under `Relaxed` and none under `Exact`
//! ([`KernelIr::row_arithmetic`]), choosing the same divisions
//! ([`KernelIr::row_constant_divisors`]): the C row loops add each vector lane's 16 values of a
//! block in f32 (`backend::cpu::emit::kernel::rows`), and each CUDA thread adds at most 16 of
//! its elements in an f32 partial, joins the partials in its f64 total, and the block combines
//! the threads' totals in f64 (`backend::cuda::emit::rows`): in both, every f32 partial holds at
//! most 16 values and everything after it is f64, so the bound above holds as stated for any
//! block size and order of combination. The cheaper `exp` is the C emitter's alone (in its
//! vector loops, under `Relaxed`); the CUDA row kernels keep the pointwise `exp`. The kernel-IR
//! interpreter uses no freedom under either setting (it is the slow, exact twin).

use crate::dtype::DType;
use crate::formula::{BinOp, Func};
/// The arithmetic a row kernel may use, from `fusion.ron`'s `row_arithmetic`: defined with
/// the rules that choose it, and named here so that backends read it from the IR alone.
pub use crate::rules::RowArithmetic;

/// The precision an SSA value is computed and held in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prec {
    /// C `float`: values of dtype f16, bf16, f32.
    F32,
    /// C `double`: values of dtype f64 and bool.
    F64,
    /// C `int64_t`, wrapping on overflow: values of every integer dtype (i8 to i64, u8 to
    /// u32), all exact in 64 bits. `+`, `-`, `*`, `-x`,
    /// comparisons, `abs`, `min`, `max` and `select` are exact integer operations; every other
    /// primitive converts its operands to f64, computes there and converts back as a cast to
    /// i64 does (`WrappingInt` in the formula interpreter).
    I64,
}

impl Prec {
    /// The precision a value of `dtype` is held in.
    pub fn of(dtype: DType) -> Prec {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => Prec::F32,
            DType::F64 | DType::Bool => Prec::F64,
            // Every integer dtype.
            _ => Prec::I64,
        }
    }
}

/// How a view moves along one domain axis. The pattern is part of the kernel's identity; the
/// stride itself is a run-time argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Stride 0: the view has size 1 on this axis (or lacks it) and is broadcast along it.
    Broadcast,
    /// Stride 1. Only ever used for the innermost axis, so vector loops see contiguous memory.
    Unit,
    /// Any stride, given at run time.
    Strided,
}

/// A buffer seen over the kernel's domain: its dtype and, per domain axis, how it moves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct View {
    pub dtype: DType,
    /// One entry per domain axis; `axes.len() == rank`.
    pub axes: Vec<Axis>,
    /// An index map's reshape boundaries, by rank (see [`View::is_mapped`]); empty for a
    /// strided view, which is every store and reduction output and most loads.
    pub stages: Vec<usize>,
}

impl View {
    /// A strided view: element at `offset + Σ i_d · stride_d`.
    pub fn strided(dtype: DType, axes: Vec<Axis>) -> View {
        View {
            dtype,
            axes,
            stages: Vec::new(),
        }
    }

    /// Whether this is an *index map*: a load through reshapes that no strides express. Its
    /// strides and offset then give a *position* `q = offset + Σ i_d · stride_d` rather than an
    /// element, and each stage `k` (of rank `stages[k]`, in order) maps a position to the
    /// next: `q` is unflattened row-major into the stage's shape (floor division and
    /// remainder by its sizes) and that multi-index goes through the stage's strides and
    /// offset ([`MapStage`]). The last stage gives the element. Only the ranks are part of
    /// the kernel's identity; shapes, strides and offsets are launch arguments. A mapped view
    /// has no `Unit` axis: consecutive positions are not consecutive elements, so its
    /// innermost loop is a plain loop, never a vector load.
    pub fn is_mapped(&self) -> bool {
        !self.stages.is_empty()
    }
}

/// An SSA value: the index of the instruction that produced it in [`KernelIr::body`].
pub type ValueId = usize;

/// One instruction. Operands of `Neg`, `Binary` and `Call` all have the instruction's own
/// precision (the lowering inserts [`Instr::Widen`]/[`Instr::Round`] to make it so).
#[derive(Debug, Clone, PartialEq)]
pub enum Instr {
    /// The element of load view `view` (an index into [`KernelIr::loads`]) at the current
    /// domain point, converted to `Prec::of(view dtype)`.
    Load { view: usize },
    /// A literal at precision `prec`, F32 or F64 (already representable: the lowering rounds
    /// it).
    Const { value: f64, prec: Prec },
    /// An integer literal, held at `Prec::I64`: exact, whatever its magnitude.
    Int { value: i64 },
    /// f32 → f64, exact.
    Widen { x: ValueId },
    /// Rounds `x` to the nearest value of `dtype`, with the reference evaluator's rules
    /// ([`DType::round`]): floats to nearest even (NaN kept, overflow to ±Inf; from f64 to
    /// f16/bf16 exactly once, not via a second rounding), integers toward zero with
    /// saturation and NaN → 0, bool as `x != 0`. From an integer (`Prec::I64`) `x`: to an
    /// integer type by wrapping (i32 keeps the low 32 bits), to a float by rounding to nearest
    /// (through f64, which rounds only once in effect), to bool as `x != 0`. The result is held
    /// at `Prec::of(dtype)`.
    Round { x: ValueId, dtype: DType },
    /// `-x` at precision `prec`.
    Neg { x: ValueId, prec: Prec },
    /// `a op b` at precision `prec`. Comparisons give 1 or 0 at that precision.
    Binary {
        op: BinOp,
        a: ValueId,
        b: ValueId,
        prec: Prec,
    },
    /// The reduction of `x` over the innermost axis (the current row), rounded once to
    /// `dtype` and held at `Prec::of(dtype)`: the same value at every element of the row.
    /// Accumulates as [`Reduction`] does (floats in f64, integers in wrapping i64; `x` is held
    /// at `Prec::I64` exactly when `dtype` is an integer), except that float sums of f32 values
    /// may use f32 partial sums within the bound of the module documentation's "Precision of
    /// row kernels". Only in row kernels (see the module documentation).
    RowReduce {
        kind: ReduceKind,
        x: ValueId,
        dtype: DType,
    },
    /// A concatenation read in place (a *range select*): the element of load view `view` at
    /// the current domain point, read only where the point's index on domain axis `axis` lies
    /// in the launch's range `range` ([`Launch::ranges`], never empty). Elsewhere the value is
    /// unspecified and no select picks it: the interpreter and CUDA give 0 without touching
    /// memory (CUDA row kernels read the row at the coordinate clamped into the range), the C
    /// loops read the element at the coordinate clamped into the range (in bounds, and
    /// branch-free, so the loop vectorizes). The lowering folds the segment's start into the view's offset, so
    /// the element read is the operand's own at `index - start`. Range loads are what let a
    /// kernel evaluate each operand of a concat only where the concat takes it, without a
    /// branch around the straight-line body; [`Instr::Select`] then picks the operand.
    RangeLoad {
        view: usize,
        axis: usize,
        range: usize,
    },
    /// The element of load view `view` at the current domain point moved along one axis of
    /// its buffer by the integer `index` (a gather: ONNX `Gather`, `GatherElements`), at
    /// `Prec::of(view dtype)`. With `(stride, extent)` = [`Launch::gathers`]`[gather]`, an
    /// index `k` with `-extent <= k < extent` reads the element `(k < 0 ? k + extent : k) ·
    /// stride` past the view's own at this point (the view has stride 0 along the axes the
    /// index comes from); any other index reads nothing and gives the fill value: NaN for a
    /// float view, 0 for an integer or bool one. `index` is held at `Prec::I64`.
    GatherLoad {
        view: usize,
        index: ValueId,
        gather: usize,
    },
    /// The value of a concat at the current point: `cases[s]` for the first `s` whose range
    /// `ranges[s]` ([`Launch::ranges`]) ends after the point's index on domain axis `axis`,
    /// and the last case where none does. The cases are the operands in order, each
    /// evaluated over its segment; all have the instruction's precision `prec`. The number
    /// of cases is part of the kernel's identity; where the segments start and end is not.
    Select {
        axis: usize,
        ranges: Vec<usize>,
        cases: Vec<ValueId>,
        prec: Prec,
    },
    /// A formula primitive at precision `prec`, with the reference interpreter's semantics
    /// (`min`/`max` propagate NaN and order −0 below +0; `select(c, a, b)` is `c != 0 ? a :
    /// b`; `rsqrt(x)` is `1 / sqrt(x)`).
    Call {
        func: Func,
        args: Vec<ValueId>,
        prec: Prec,
    },
}

impl Instr {
    /// The values this instruction reads, in operand order.
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            Instr::Load { .. }
            | Instr::RangeLoad { .. }
            | Instr::Const { .. }
            | Instr::Int { .. } => Vec::new(),
            Instr::Widen { x }
            | Instr::Round { x, .. }
            | Instr::Neg { x, .. }
            | Instr::RowReduce { x, .. }
            | Instr::GatherLoad { index: x, .. } => vec![*x],
            Instr::Binary { a, b, .. } => vec![*a, *b],
            Instr::Call { args, .. } => args.clone(),
            Instr::Select { cases, .. } => cases.clone(),
        }
    }
}

/// A pointwise result written to memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Store {
    /// The value stored; its precision is `Prec::of(view.dtype)` and it is already rounded to
    /// `view.dtype`, so storing only narrows the representation.
    pub value: ValueId,
    /// The destination. A `Broadcast` axis here means the stored value is smaller than the
    /// domain along that axis: it is written only where the domain index on that axis is 0,
    /// so each element is written once.
    pub view: View,
    /// For a *scatter store*, where the value is added instead of written (see [`Scatter`]).
    pub scatter: Option<Scatter>,
}

impl Store {
    /// A store writing `value` through `view` at each point.
    pub fn new(value: ValueId, view: View) -> Store {
        Store {
            value,
            view,
            scatter: None,
        }
    }
}

/// How a scatter store places its value: `value` is *added* to the element of its view at the
/// current point moved along one axis of the buffer by the integer `index` (held at
/// `Prec::I64`), with `(stride, extent)` = [`Launch::gathers`]`[gather]` and negative indices
/// counting from the end, as for [`Instr::GatherLoad`]; an index out of range adds nothing.
/// The sum is computed at the value's precision and rounded to the view's dtype, one update
/// at a time (`scatter_add`'s semantics in the reference evaluator).
///
/// A *scatter kernel* (one holding a scatter store) has that store alone, no reductions and no
/// row or range reads, and its view is `Broadcast` on the innermost domain axis: every point
/// of a row adds into elements that no other row reaches (the lowering moves the scattered
/// axis innermost). Emitters give each row to one thread and visit it in ascending order, so
/// no two threads add into one element and every element receives its updates in the order
/// the reference evaluator adds them: the results are the same bits on every backend, with no
/// atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scatter {
    pub index: ValueId,
    pub gather: usize,
}

/// What a reduction computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Σ, accumulated in f64 (as the reference evaluator does); for an integer output, in
    /// wrapping i64 over values held at `Prec::I64`. Identity 0.
    Sum,
    /// Σ / (number of reduced elements); 0/0 = NaN for an empty reduction.
    Mean,
    /// Maximum; NaN propagates (any NaN makes the result NaN). Identity −∞, or `i64::MIN`
    /// for an integer output (compared as integers, over values held at `Prec::I64`).
    Max,
}

/// A reduction ending the kernel: `value` is accumulated over the domain axes marked in
/// `reduced`, and each result rounded once to `view.dtype` and stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Reduction {
    pub kind: ReduceKind,
    /// The value reduced, one per domain point.
    pub value: ValueId,
    /// Per domain axis: whether it is reduced. The output view has `Broadcast` (stride 0)
    /// exactly on the reduced axes.
    pub reduced: Vec<bool>,
    pub view: View,
}

/// A value of a row kernel that one pass computes and keeps, and later passes read back
/// instead of evaluating again ([`KernelIr::row_kept`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowKept {
    pub value: ValueId,
    /// The pass that keeps it: the first that computes it.
    pub saved_in: usize,
    /// The later passes that read it back, ascending.
    pub read_in: Vec<usize>,
}

/// What one buffer argument of a kernel is: load view `v`, store `k` or the output of
/// reduction `r` ([`KernelIr::arg`]). Arguments are numbered loads first, then stores, then
/// reduction outputs ([`KernelIr::views`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    Load(usize),
    Store(usize),
    Reduction(usize),
}

/// One kernel, independent of sizes. Equal `KernelIr`s emit equal source.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelIr {
    /// Number of domain axes, at least 1.
    pub rank: usize,
    /// Views read, in argument order.
    pub loads: Vec<View>,
    /// Straight-line SSA, in dependency order.
    pub body: Vec<Instr>,
    /// Pointwise results written.
    pub stores: Vec<Store>,
    /// Reductions ending the kernel.
    pub reductions: Vec<Reduction>,
    /// The arithmetic a row kernel's sums and divisions by row constants use ("Precision of
    /// row kernels" in the module documentation): `Relaxed` grants an emitter the three
    /// freedoms stated there (f32 block sums, one reciprocal per row, a looser `exp`),
    /// `Exact` none of them. It is part of the kernel's identity, so a
    /// rule directory that switches it compiles (and caches) other kernels. The lowering sets
    /// it on row kernels only; every other kernel carries the default, which no emitter reads
    /// there, so kernels without row reductions stay equal whatever the rules say.
    pub row_arithmetic: RowArithmetic,
}

impl KernelIr {
    /// Number of buffer arguments: loads, then stores, then reduction outputs, in that order.
    pub fn arg_count(&self) -> usize {
        self.loads.len() + self.stores.len() + self.reductions.len()
    }

    /// Every view in argument order.
    pub fn views(&self) -> impl Iterator<Item = &View> {
        self.loads
            .iter()
            .chain(self.stores.iter().map(|s| &s.view))
            .chain(self.reductions.iter().map(|r| &r.view))
    }

    /// The argument index of store `k`: the stores follow the loads. Every emitter and the
    /// launch code number arguments through this and [`KernelIr::reduction_arg`] alone, so
    /// that a kernel's text and the arrays of its launch cannot disagree.
    pub fn store_arg(&self, k: usize) -> usize {
        self.loads.len() + k
    }

    /// The argument index of reduction `r`'s output: the reductions follow the stores.
    pub fn reduction_arg(&self, r: usize) -> usize {
        self.loads.len() + self.stores.len() + r
    }

    /// The arguments with an element at every domain point, loads then stores (the
    /// reduction outputs, one element per kept point, follow them).
    pub fn pointwise_args(&self) -> std::ops::Range<usize> {
        0..self.loads.len() + self.stores.len()
    }

    /// What argument `arg` ([`KernelIr::views`] order) is, with its index among its kind.
    pub fn arg(&self, arg: usize) -> Arg {
        let (loads, stores) = (self.loads.len(), self.stores.len());
        if arg < loads {
            Arg::Load(arg)
        } else if arg < loads + stores {
            Arg::Store(arg - loads)
        } else {
            Arg::Reduction(arg - loads - stores)
        }
    }

    /// The view of argument `arg` ([`KernelIr::views`] order).
    pub fn view(&self, arg: usize) -> &View {
        match self.arg(arg) {
            Arg::Load(v) => &self.loads[v],
            Arg::Store(k) => &self.stores[k].view,
            Arg::Reduction(r) => &self.reductions[r].view,
        }
    }

    /// The precision of SSA value `id`.
    pub fn prec(&self, id: ValueId) -> Prec {
        match &self.body[id] {
            Instr::Load { view }
            | Instr::RangeLoad { view, .. }
            | Instr::GatherLoad { view, .. } => Prec::of(self.loads[*view].dtype),
            Instr::Const { prec, .. }
            | Instr::Select { prec, .. }
            | Instr::Neg { prec, .. }
            | Instr::Binary { prec, .. }
            | Instr::Call { prec, .. } => *prec,
            Instr::Widen { .. } => Prec::F64,
            Instr::Int { .. } => Prec::I64,
            Instr::Round { dtype, .. } | Instr::RowReduce { dtype, .. } => Prec::of(*dtype),
        }
    }

    /// Whether this is a row kernel: its body holds [`Instr::RowReduce`]s.
    pub fn is_row_kernel(&self) -> bool {
        self.body
            .iter()
            .any(|i| matches!(i, Instr::RowReduce { .. }))
    }

    /// Per SSA value, the pass over a row from which it can be computed: 0 for values that
    /// need no reduction of the row, and for a `RowReduce` one more than its operand's (it is
    /// accumulated in the pass of its operand and read from the next); any other value takes
    /// the highest level of its operands. All 0 outside row kernels.
    pub fn levels(&self) -> Vec<usize> {
        let mut level = vec![0usize; self.body.len()];
        for (id, instr) in self.body.iter().enumerate() {
            let top = instr
                .operands()
                .iter()
                .map(|&x| level.get(x).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            level[id] = match instr {
                Instr::RowReduce { .. } => top + 1,
                _ => top,
            };
        }
        level
    }

    /// Per SSA value, whether it is a *row gather*: an [`Instr::GatherLoad`] of a row kernel
    /// whose index is the same at every point of a row (an embedding's token id, loaded
    /// through a view broadcast along the row), so that the whole row reads one row of the
    /// data, at a base an emitter can compute once per row and then read like a plain load.
    /// The index must come from such loads and literals alone, through no row reduction (a
    /// row constant known only after a pass) and no read by ranges or by another gather.
    pub fn row_gathers(&self) -> Vec<bool> {
        let mut gathers = vec![false; self.body.len()];
        if !self.is_row_kernel() {
            return gathers;
        }
        let inner = self.rank.saturating_sub(1);
        let mut invariant = vec![false; self.body.len()];
        for (id, instr) in self.body.iter().enumerate() {
            invariant[id] = match instr {
                Instr::Load { view } => {
                    let v = &self.loads[*view];
                    v.axes.get(inner) == Some(&Axis::Broadcast) && !v.is_mapped()
                }
                Instr::Const { .. } | Instr::Int { .. } => true,
                Instr::Widen { .. }
                | Instr::Round { .. }
                | Instr::Neg { .. }
                | Instr::Binary { .. }
                | Instr::Call { .. } => instr.operands().iter().all(|&x| invariant[x]),
                Instr::RowReduce { .. }
                | Instr::RangeLoad { .. }
                | Instr::GatherLoad { .. }
                | Instr::Select { .. } => false,
            };
            if let Instr::GatherLoad { view, index, .. } = instr {
                gathers[id] = invariant[*index] && !self.loads[*view].is_mapped();
            }
        }
        gathers
    }

    /// Whether the body reads a concat by ranges ([`Instr::RangeLoad`], [`Instr::Select`]):
    /// such a kernel depends on the index along a domain axis, so emitters neither fold axes
    /// together nor run their vector paths over it.
    pub fn has_ranges(&self) -> bool {
        self.body
            .iter()
            .any(|i| matches!(i, Instr::RangeLoad { .. } | Instr::Select { .. }))
    }

    /// Whether this row kernel reads a concat by ranges along its rows: every range load and
    /// select picks along the innermost axis, so one row's elements lie in several segments.
    /// The row emitters then evaluate every operand at every element of the row, as the
    /// pointwise kernels do before they cut into pieces, and the select picks; such a kernel
    /// does not cut into one row kernel per segment ([`crate::lower::split`]).
    pub fn selects_along_rows(&self) -> bool {
        self.is_row_kernel()
            && self.has_ranges()
            && self.body.iter().all(|i| match i {
                Instr::RangeLoad { axis, .. } | Instr::Select { axis, .. } => axis + 1 == self.rank,
                _ => true,
            })
    }

    /// The axis and ranges every select of the body picks by, when there is at least one
    /// select and they all agree (one concat's segments, or several concats with the same
    /// ones): what per-segment code can branch on.
    pub fn one_select(&self) -> Option<(usize, &[usize])> {
        let mut found: Option<(usize, &[usize])> = None;
        for instr in &self.body {
            if let Instr::Select { axis, ranges, .. } = instr {
                match found {
                    None => found = Some((*axis, ranges)),
                    Some(seen) if seen == (*axis, &ranges[..]) => {}
                    Some(_) => return None,
                }
            }
        }
        found
    }

    /// For a row kernel reading a concat along its rows ([`KernelIr::selects_along_rows`])
    /// whose selects all pick by the same ranges: those ranges, one per case.
    pub fn row_select_ranges(&self) -> Option<&[usize]> {
        self.one_select()
            .filter(|_| self.selects_along_rows())
            .map(|(_, ranges)| ranges)
    }

    /// The number of launch ranges the body refers to: one more than the highest index.
    pub fn range_count(&self) -> usize {
        self.body
            .iter()
            .flat_map(|i| match i {
                Instr::RangeLoad { range, .. } => vec![*range],
                Instr::Select { ranges, .. } => ranges.clone(),
                _ => Vec::new(),
            })
            .max()
            .map_or(0, |r| r + 1)
    }

    /// Per argument ([`KernelIr::views`] order), the domain axis and launch range within
    /// which it is read, when every read of it is a [`Instr::RangeLoad`] of one range:
    /// such a view is reached only there (its offset is moved back by the range's start).
    pub fn range_views(&self) -> Vec<Option<(usize, usize)>> {
        let mut within: Vec<Option<Option<(usize, usize)>>> = vec![None; self.arg_count()];
        for instr in &self.body {
            let (view, range) = match instr {
                Instr::Load { view } | Instr::GatherLoad { view, .. } => (*view, None),
                Instr::RangeLoad { view, axis, range } => (*view, Some((*axis, *range))),
                _ => continue,
            };
            within[view] = match within[view] {
                None => Some(range),
                Some(seen) if seen == range => Some(seen),
                Some(_) => Some(None),
            };
        }
        within.into_iter().map(Option::flatten).collect()
    }

    /// The number of launch gathers the body and the scatter stores refer to: one more than
    /// the highest index.
    pub fn gather_count(&self) -> usize {
        let scatters = self
            .stores
            .iter()
            .filter_map(|s| s.scatter.map(|c| c.gather + 1));
        self.body
            .iter()
            .filter_map(|i| match i {
                Instr::GatherLoad { gather, .. } => Some(gather + 1),
                _ => None,
            })
            .chain(scatters)
            .max()
            .unwrap_or(0)
    }

    /// Whether this is a scatter kernel: a store adds at run-time indices ([`Scatter`]).
    pub fn is_scatter_kernel(&self) -> bool {
        self.stores.iter().any(|s| s.scatter.is_some())
    }

    /// Whether the body reads or a store writes through a run-time index
    /// ([`Instr::GatherLoad`], [`Scatter`]): emitters run such a kernel as plain loops, never
    /// their vector paths.
    pub fn has_gathers(&self) -> bool {
        self.gather_count() > 0
    }

    /// How many passes a row kernel makes over each row: one per level of `RowReduce`s, plus
    /// the last one, which stores. 1 for any other kernel.
    pub fn passes(&self) -> usize {
        self.levels().into_iter().max().unwrap_or(0) + 1
    }
}

/// The run-time arguments of one kernel launch: everything size-dependent.
///
/// The C ABI of a generated kernel is
/// `void k(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs)`:
/// `sizes[rank]` followed by the ranges (`sizes[rank + 2r]` the start and `sizes[rank + 2r +
/// 1]` the end of range `r`) and the gathers (`sizes[rank + 2·ranges + 2g]` the stride and
/// the next word the extent of gather `g`), then `strides[arg * rank + axis]` and `offsets[arg]` (in
/// elements) and `ptrs[arg]` for every argument in [`KernelIr::views`] order.
///
/// Index maps ([`View::is_mapped`]) take their stages from the same `strides` array, after the
/// `args × rank` strides: for every mapped load in argument order, for each of its stages in
/// order, the stage's offset, its `r` sizes and its `r` strides ([`Launch::map_words`]). A
/// kernel without index maps reads exactly what it read before they existed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The domain, `rank` entries.
    pub sizes: Vec<i64>,
    /// Per argument, `rank` strides in elements; 0 on `Broadcast` axes, 1 on `Unit` ones.
    pub strides: Vec<Vec<i64>>,
    /// Per argument, the element offset of domain point 0.
    pub offsets: Vec<i64>,
    /// Per argument, the stages of its index map, as many as its view's `stages` (none for a
    /// strided view; arguments past the end of this list have none).
    pub maps: Vec<Vec<MapStage>>,
    /// Index ranges `[start, end)` along one domain axis, read by [`Instr::RangeLoad`] and
    /// [`Instr::Select`]: the segments of concats read in place. Empty for other kernels.
    pub ranges: Vec<(i64, i64)>,
    /// Per [`Instr::GatherLoad`] `gather`, the stride (in elements of its view's buffer) of
    /// the axis its index moves along and that axis's size. Empty for other kernels.
    pub gathers: Vec<Gathered>,
}

/// The run-time half of a gather ([`Instr::GatherLoad`]): the buffer axis the index moves
/// along, as its stride and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gathered {
    pub stride: i64,
    pub extent: i64,
}

/// One reshape boundary of a mapped load at launch: position `q` (below `Π sizes`) goes to
/// `offset + Σ_e idx_e · strides[e]`, where `idx` is `q` unflattened row-major into `sizes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapStage {
    pub offset: i64,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
}

impl MapStage {
    /// The position (or element, for a last stage) that position `q` maps to. Wrapping, like
    /// the generated code; [`crate::lower::Program::check_bounds`] proves the result is in range.
    pub fn apply(&self, q: i64) -> i64 {
        let mut rest = q;
        let mut at = self.offset;
        for (&n, &s) in self.sizes.iter().zip(&self.strides).rev() {
            let n = n.max(1);
            at = at.wrapping_add((rest % n).wrapping_mul(s));
            rest /= n;
        }
        at
    }

    /// Words of this stage in the kernel's `strides` array.
    pub fn words(rank: usize) -> usize {
        1 + 2 * rank
    }
}

impl Launch {
    /// `sizes` followed by every range's start and end, then every gather's stride and
    /// extent: the first array of the C ABI.
    pub fn sizes_and_ranges(&self) -> Vec<i64> {
        let mut all = self.sizes.clone();
        for &(start, end) in &self.ranges {
            all.push(start);
            all.push(end);
        }
        for g in &self.gathers {
            all.push(g.stride);
            all.push(g.extent);
        }
        all
    }

    /// The stages of argument `arg` (empty for a strided view).
    pub fn stages(&self, arg: usize) -> &[MapStage] {
        self.maps.get(arg).map_or(&[], |m| m.as_slice())
    }

    /// The index-map words that follow the per-argument strides in the kernel's `strides`
    /// array (see [`Launch`]).
    pub fn map_words(&self) -> Vec<i64> {
        let mut words = Vec::new();
        for stage in self.maps.iter().flatten() {
            words.push(stage.offset);
            words.extend(&stage.sizes);
            words.extend(&stage.strides);
        }
        words
    }

    /// The element argument `arg` reads at position `q` of its view: `q` itself for a
    /// strided view, else `q` through every stage of its index map.
    pub fn through_map(&self, arg: usize, q: i64) -> i64 {
        self.stages(arg).iter().fold(q, |q, stage| stage.apply(q))
    }
}

impl KernelIr {
    /// Where the words of stage `stage` of argument `arg`'s index map start in the kernel's
    /// `strides` array: after the `args × rank` strides and every earlier stage's words.
    pub fn map_word(&self, arg: usize, stage: usize) -> usize {
        let mut at = self.arg_count() * self.rank;
        for (a, view) in self.views().enumerate() {
            for (k, &r) in view.stages.iter().enumerate() {
                if (a, k) == (arg, stage) {
                    return at;
                }
                at += MapStage::words(r);
            }
        }
        at
    }

    /// Words of all index-map stages in the `strides` array (0 without index maps).
    pub fn map_word_count(&self) -> usize {
        self.views()
            .flat_map(|v| &v.stages)
            .map(|&r| MapStage::words(r))
            .sum()
    }
}

/// Row-kernel analyses both emitters share: what a pass may keep for a later one, and which
/// divisions may multiply by a row's reciprocal (the second freedom of "Precision of row
/// kernels" in the module documentation). Pure functions of the body, so the C and CUDA
/// kernels of one IR make the same choices.
impl KernelIr {
    /// Per value, the divisor `b` when the value is an f32 division `a / b` of a value that
    /// varies along the row by a row constant (`b` is computed from row reductions and
    /// literals only, and reads at least one reduction: softmax's sum). An emitter may
    /// multiply `a` by `1 / b`, rounded once per row, where `|b|` is in `[2⁻¹²⁶, 2¹²⁶]`: a
    /// division costs several multiplications on either target, and the product is within
    /// 2⁻²³ of the quotient relatively (two roundings of at most 2⁻²⁴ each), or 2⁻¹⁴⁹
    /// absolutely in the subnormal range.
    /// None under [`RowArithmetic::Exact`], which keeps every division.
    pub fn row_constant_divisors(&self) -> Vec<Option<usize>> {
        if self.row_arithmetic == RowArithmetic::Exact {
            return vec![None; self.body.len()];
        }
        let mut constant = vec![false; self.body.len()];
        let mut reduced = vec![false; self.body.len()];
        for (id, instr) in self.body.iter().enumerate() {
            let operands = instr.operands();
            (constant[id], reduced[id]) = match instr {
                Instr::RowReduce { .. } => (true, true),
                Instr::Load { .. } | Instr::RangeLoad { .. } => (false, false),
                Instr::Const { .. } | Instr::Int { .. } => (true, false),
                _ => (
                    operands.iter().all(|&x| constant[x]),
                    operands.iter().any(|&x| reduced[x]),
                ),
            };
        }
        self.body
            .iter()
            .map(|instr| match *instr {
                Instr::Binary {
                    op: BinOp::Div,
                    a,
                    b,
                    prec: Prec::F32,
                } if constant[b] && reduced[b] && !constant[a] => Some(b),
                _ => None,
            })
            .collect()
    }

    /// The values a row kernel's passes would compute again that an earlier pass already
    /// computes, worth keeping from that pass, in value order. Passes are walked in order,
    /// each from what it reduces (and the last from what it stores) towards the loads; a
    /// walk stops at a value that an earlier pass computes and whose expression holds a call
    /// or a division: that value is kept by the first pass computing it and read back by
    /// every later pass that meets it. Below it the walk stops, so only the values nearest
    /// what a pass needs are kept (softmax keeps `exp(x - max)`, not `x - max` too; under a
    /// softmax of `tanh(x)`, the maximum's pass keeps `tanh(x)` for the sum's pass, which
    /// keeps `exp(t - max)` for the last). Layernorm's `x - mean` is a subtraction, cheaper
    /// to redo than to keep, so layernorm keeps nothing; `layernorm(gelu(x))` keeps the gelu
    /// from the mean's pass for the variance's and the last. Keeping never changes a value:
    /// the bits are the same either way.
    pub fn row_kept(&self) -> Vec<RowKept> {
        let passes = self.passes();
        if passes < 2 || !self.is_row_kernel() {
            return Vec::new();
        }
        let costly = self.row_costly();
        let reduces = |id: usize| matches!(self.body[id], Instr::RowReduce { .. });
        // The first pass computing each value, and what is kept so far.
        let mut computed_in: Vec<Option<usize>> = vec![None; self.body.len()];
        let mut kept: Vec<RowKept> = Vec::new();
        for pass in 0..passes {
            // A pass reads back what an earlier pass computes, if it calls or divides.
            let stop: Vec<bool> = (0..self.body.len())
                .map(|id| costly[id] && !reduces(id) && computed_in[id].is_some_and(|p| p < pass))
                .collect();
            let met = self.row_pass_meets(pass, &stop);
            for id in (0..self.body.len()).filter(|&id| met[id] && !reduces(id)) {
                match (stop[id], computed_in[id]) {
                    (true, Some(saved_in)) => match kept.iter_mut().find(|k| k.value == id) {
                        Some(k) => k.read_in.push(pass),
                        None => kept.push(RowKept {
                            value: id,
                            saved_in,
                            read_in: vec![pass],
                        }),
                    },
                    _ => {
                        computed_in[id].get_or_insert(pass);
                    }
                }
            }
        }
        kept.sort_unstable_by_key(|k| k.value);
        kept
    }

    /// What pass `pass` of a row kernel evaluates at each element for its own sake: the
    /// operands of the row reductions it accumulates and, in the last pass, the values
    /// stored once per element.
    pub fn row_pass_roots(&self, pass: usize) -> Vec<usize> {
        let inner = self.rank.saturating_sub(1);
        let levels = self.levels();
        let mut roots: Vec<usize> = (0..self.body.len())
            .filter(|&id| levels[id] == pass + 1)
            .filter_map(|id| match self.body[id] {
                Instr::RowReduce { x, .. } => Some(x),
                _ => None,
            })
            .collect();
        if pass + 1 == self.passes() {
            roots.extend(
                self.stores
                    .iter()
                    .filter(|s| s.view.axes.get(inner) != Some(&Axis::Broadcast))
                    .map(|s| s.value),
            );
        }
        roots
    }

    /// Per value, whether pass `pass` of a row kernel meets it per element, walking from its
    /// [roots](Self::row_pass_roots) towards the loads: the values it evaluates, and those
    /// marked in `stop` that it reads back instead (kept by an earlier pass), below which it
    /// does not walk. Row reductions are read as constants of the row.
    pub fn row_pass_meets(&self, pass: usize, stop: &[bool]) -> Vec<bool> {
        let mut met = vec![false; self.body.len()];
        let mut stack = self.row_pass_roots(pass);
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut met[id], true)
                || stop.get(id) == Some(&true)
                || matches!(self.body[id], Instr::RowReduce { .. })
            {
                continue;
            }
            stack.extend(self.body[id].operands());
        }
        met
    }

    /// Per load view, whether the values `met` ([`Self::row_pass_meets`]) load it; a row
    /// kernel's range load is a plain load in the piece that runs its rows.
    pub fn loads_met(&self, met: &[bool]) -> Vec<bool> {
        let mut reads = vec![false; self.loads.len()];
        for (instr, _) in self.body.iter().zip(met).filter(|(_, m)| **m) {
            if let Instr::Load { view } | Instr::RangeLoad { view, .. } = instr
                && let Some(r) = reads.get_mut(*view)
            {
                *r = true;
            }
        }
        reads
    }

    /// The values evaluating `reads` at an element needs (row reductions are constants of
    /// the row, read without their operands), in body order.
    pub fn row_needed(&self, reads: &[usize]) -> Vec<usize> {
        self.row_needed_stopping(reads, &[])
    }

    /// [`KernelIr::row_needed`], also stopping at the values marked in `stop` (values a row
    /// kernel's pass reads back from where an earlier pass kept them, [`KernelIr::row_kept`],
    /// rather than computing them): they are needed, their operands not for their sake.
    pub fn row_needed_stopping(&self, reads: &[usize], stop: &[bool]) -> Vec<usize> {
        let mut needed = vec![false; self.body.len()];
        for &x in reads {
            needed[x] = true;
        }
        for id in (0..self.body.len()).rev() {
            let stops = stop.get(id) == Some(&true);
            if needed[id] && !stops && !matches!(self.body[id], Instr::RowReduce { .. }) {
                for x in self.body[id].operands() {
                    needed[x] = true;
                }
            }
        }
        (0..self.body.len()).filter(|&id| needed[id]).collect()
    }

    /// Per value, whether its expression within the row (stopping at loads, literals and row
    /// reductions) holds a function call or a division: work that costs more than reading
    /// the value back from where a pass kept it.
    fn row_costly(&self) -> Vec<bool> {
        let mut costly = vec![false; self.body.len()];
        for (id, instr) in self.body.iter().enumerate() {
            let has = instr.operands().iter().any(|&x| costly[x]);
            costly[id] = match instr {
                Instr::RowReduce { .. } | Instr::Load { .. } | Instr::Const { .. } => false,
                // Selections, clamps and the like are a few instructions, not a call's worth.
                Instr::Call { func, .. } => func.costs_a_call() || has,
                Instr::Binary { op: BinOp::Div, .. } => true,
                _ => has,
            };
        }
        costly
    }
}
