//! The invariants of [`KernelIr`] that the lowering guarantees and the emitters rely on.
//!
//! The emitters index views by argument, read each operand's precision to pick a C type and
//! assume every value is defined before its use; an IR breaking that would give text that
//! either fails deep inside emission or compiles and computes something else. The lowering
//! establishes these by construction, so the check is not part of normal runs: both emitters
//! call [`KernelIr::verify`] in debug builds only (every test run) and panic on a violation.
//! It lives on the IR rather than in one backend so that both check the same contract.

use super::ir::{Arg, Axis, Instr, KernelIr, Prec, ValueId};
use crate::formula::Func;
use std::fmt;

/// The first invariant a [`KernelIr`] breaks, as [`KernelIr::verify`] finds it.
#[derive(Debug, Clone, PartialEq)]
pub enum IrError {
    /// The domain has no axis.
    NoAxes,
    /// Argument `arg`'s view has `axes` entries for a domain of `rank`.
    ViewRank {
        arg: usize,
        axes: usize,
        rank: usize,
    },
    /// Argument `arg` uses [`Axis::Unit`] on axis `axis`, which is not the innermost.
    UnitNotInnermost { arg: usize, axis: usize },
    /// Argument `arg` has an index map but is not a load, or a stage of rank 0, or a `Unit`
    /// axis (consecutive positions of an index map are not consecutive elements).
    MappedView { arg: usize },
    /// Value `value` loads view `view`, which does not exist.
    MissingLoad { value: ValueId, view: usize },
    /// Value `value` is an f32 literal that f32 cannot hold.
    UnrepresentableConst { value: ValueId, literal: f64 },
    /// Value `value` calls `func` with `args` arguments.
    Arity {
        value: ValueId,
        func: Func,
        args: usize,
    },
    /// Value `value` reads `operand`, which is not defined before it.
    UseBeforeDefinition { value: ValueId, operand: ValueId },
    /// Value `value` widens a value already held in f64.
    WidensDouble { value: ValueId },
    /// Operand `operand` of value `value` has another precision than the instruction.
    OperandPrecision { value: ValueId, operand: ValueId },
    /// Store `store` writes value `value`, which does not exist.
    MissingStoredValue { store: usize, value: ValueId },
    /// Store `store`'s value is not held at its dtype's precision.
    StorePrecision { store: usize },
    /// Reduction `reduction` reduces value `value`, which does not exist.
    MissingReducedValue { reduction: usize, value: ValueId },
    /// Reduction `reduction`'s mask has `len` entries for a domain of `rank`.
    ReducedMaskRank {
        reduction: usize,
        len: usize,
        rank: usize,
    },
    /// Reduction `reduction`'s output view is broadcast on axis `axis` where the axis is kept,
    /// or not broadcast where it is reduced.
    ReductionOutput { reduction: usize, axis: usize },
    /// Reduction `reduction` has an integer output but reduces a value not held as an integer
    /// (`Prec::I64`), or the other way round: integers accumulate exactly, floats in f64.
    ReducedPrecision { reduction: usize },
    /// Value `value` is a row reduction of a value whose precision does not match its dtype
    /// (integers accumulate exactly, at `Prec::I64`; floats and bools from a float
    /// precision).
    RowReducePrecision { value: ValueId },
    /// A row kernel (one with [`Instr::RowReduce`]s) also has reductions ending it; its
    /// reductions are all row reductions.
    RowKernelReduction,
    /// Value `value` (a range load or a select) names domain axis `axis` of a rank-`rank`
    /// domain.
    RangeAxis {
        value: ValueId,
        axis: usize,
        rank: usize,
    },
    /// Value `value` is a select without cases, or with another number of ranges than cases.
    SelectCases { value: ValueId },
    /// A row kernel reads a concat by ranges that neither cut it into per-segment row kernels
    /// ([`crate::lower::split`]) nor all select along its rows
    /// ([`KernelIr::selects_along_rows`]): the row emitters run only those two.
    RowKernelRange,
    /// Value `value` is a gather whose index is not an integer (`Prec::I64`), whose view is
    /// an index map, or which lies in a kernel reading a concat by ranges: the emitters
    /// compute a gather's element from its view's plain strided index.
    Gather { value: ValueId },
    /// Store `store` is a scatter ([`crate::lower::ir::Scatter`]) whose index is missing or
    /// not an integer, whose view is an index map or moves along the innermost axis, or which
    /// shares its kernel with another store, a reduction, a row reduction or a range read.
    Scatter { store: usize },
}

impl fmt::Display for IrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IrError::NoAxes => write!(f, "a kernel domain has at least one axis"),
            IrError::ViewRank { arg, axes, rank } => write!(
                f,
                "view rank differs from the domain's (argument {arg}: {axes} axes, rank {rank})"
            ),
            IrError::UnitNotInnermost { arg, axis } => write!(
                f,
                "`Unit` is only used on the innermost axis (argument {arg}, axis {axis})"
            ),
            IrError::MappedView { arg } => write!(
                f,
                "only loads have index maps, each stage of rank at least 1 and no `Unit` axis \
                 (argument {arg})"
            ),
            IrError::MissingLoad { value, view } => {
                write!(f, "load of a missing view (v{value} loads view {view})")
            }
            IrError::UnrepresentableConst { value, literal } => {
                write!(f, "f32 constant {literal} is not representable (v{value})")
            }
            IrError::Arity { value, func, args } => {
                write!(f, "{func:?} arity: v{value} passes {args} arguments")
            }
            IrError::UseBeforeDefinition { value, operand } => {
                write!(f, "v{value} uses a value defined after it (v{operand})")
            }
            IrError::WidensDouble { value } => write!(f, "v{value} widens a double"),
            IrError::OperandPrecision { value, operand } => {
                write!(f, "operand v{operand} of v{value}: precision")
            }
            IrError::MissingStoredValue { store, value } => {
                write!(f, "store of a missing value (store {store} of v{value})")
            }
            IrError::StorePrecision { store } => write!(
                f,
                "stored value's precision differs from its dtype's (store {store})"
            ),
            IrError::ReducedPrecision { reduction } => write!(
                f,
                "reduced value's precision does not match its output (reduction {reduction}): \
                 integer outputs reduce integers, float and bool outputs floats"
            ),
            IrError::MissingReducedValue { reduction, value } => write!(
                f,
                "reduction of a missing value (reduction {reduction} of v{value})"
            ),
            IrError::ReducedMaskRank {
                reduction,
                len,
                rank,
            } => write!(
                f,
                "reduced mask rank (reduction {reduction}: {len} entries, rank {rank})"
            ),
            IrError::RowReducePrecision { value } => write!(
                f,
                "row reduction v{value} reduces a value whose precision does not match its dtype"
            ),
            IrError::RangeAxis { value, axis, rank } => write!(
                f,
                "v{value} selects by domain axis {axis} of a domain of rank {rank}"
            ),
            IrError::SelectCases { value } => write!(
                f,
                "select v{value} needs at least one case and one range per case"
            ),
            IrError::Gather { value } => write!(
                f,
                "v{value} gathers through a non-integer index or an index map, or in a kernel \
                 reading a concat by ranges"
            ),
            IrError::Scatter { store } => write!(
                f,
                "store {store} scatters through a missing or non-integer index, an index map or a \
                 view moving along the rows, or beside another store, a reduction or a range read"
            ),
            IrError::RowKernelRange => write!(
                f,
                "a row kernel reads a concat by ranges along its rows only, or along an outer axis \
                 by one set of segments"
            ),
            IrError::RowKernelReduction => write!(
                f,
                "a row kernel's reductions are all row reductions, none ends the kernel"
            ),
            IrError::ReductionOutput { reduction, axis } => write!(
                f,
                "a reduction's output is broadcast exactly on its reduced axes \
                 (reduction {reduction}, axis {axis})"
            ),
        }
    }
}

impl std::error::Error for IrError {}

impl KernelIr {
    /// Checks the invariants the lowering guarantees: a domain of at least one axis, views of
    /// the domain's rank with `Unit` only innermost, index maps only on loads (stages of rank
    /// at least 1, no `Unit` axis), loads of existing views, call arities, SSA
    /// order, operands at their instruction's precision, stores of existing values at their
    /// dtype's precision, reduction masks of the domain's rank with outputs broadcast exactly
    /// on the reduced axes (none in a row kernel, whose row reductions reduce values of their
    /// dtype's kind of precision), and, last, f32 literals that f32 represents. Returns the first
    /// violation, in that order.
    pub fn verify(&self) -> Result<(), IrError> {
        if self.rank < 1 {
            return Err(IrError::NoAxes);
        }
        for (arg, view) in self.views().enumerate() {
            if view.axes.len() != self.rank {
                return Err(IrError::ViewRank {
                    arg,
                    axes: view.axes.len(),
                    rank: self.rank,
                });
            }
            if let Some(axis) = (0..self.rank - 1).find(|&d| view.axes[d] == Axis::Unit) {
                return Err(IrError::UnitNotInnermost { arg, axis });
            }
            if view.is_mapped()
                && (arg >= self.loads.len()
                    || view.stages.contains(&0)
                    || view.axes.contains(&Axis::Unit))
            {
                return Err(IrError::MappedView { arg });
            }
        }
        for (value, instr) in self.body.iter().enumerate() {
            match instr {
                Instr::Load { view }
                | Instr::RangeLoad { view, .. }
                | Instr::GatherLoad { view, .. }
                    if *view >= self.loads.len() =>
                {
                    return Err(IrError::MissingLoad { value, view: *view });
                }
                Instr::GatherLoad { view, index, .. }
                    if self.loads[*view].is_mapped()
                        || (*index < value && self.prec(*index) != Prec::I64)
                        || self.has_ranges() =>
                {
                    return Err(IrError::Gather { value });
                }
                Instr::RangeLoad { axis, .. } | Instr::Select { axis, .. }
                    if *axis >= self.rank =>
                {
                    return Err(IrError::RangeAxis {
                        value,
                        axis: *axis,
                        rank: self.rank,
                    });
                }
                Instr::Select { ranges, cases, .. }
                    if cases.is_empty() || ranges.len() != cases.len() =>
                {
                    return Err(IrError::SelectCases { value });
                }
                Instr::Call { func, args, .. } if args.len() != func.arity() => {
                    return Err(IrError::Arity {
                        value,
                        func: *func,
                        args: args.len(),
                    });
                }
                _ => {}
            }
            let operands = instr.operands();
            if let Some(&operand) = operands.iter().find(|&&x| x >= value) {
                return Err(IrError::UseBeforeDefinition { value, operand });
            }
            match instr {
                Instr::Widen { x } if self.prec(*x) != Prec::F32 => {
                    return Err(IrError::WidensDouble { value });
                }
                Instr::RowReduce { x, dtype, .. }
                    if (self.prec(*x) == Prec::I64) != (Prec::of(*dtype) == Prec::I64) =>
                {
                    return Err(IrError::RowReducePrecision { value });
                }
                Instr::Neg { prec, .. }
                | Instr::Binary { prec, .. }
                | Instr::Call { prec, .. }
                | Instr::Select { prec, .. } => {
                    if let Some(&operand) = operands.iter().find(|&&x| self.prec(x) != *prec) {
                        return Err(IrError::OperandPrecision { value, operand });
                    }
                }
                _ => {}
            }
        }
        self.verify_stores()?;
        if self.is_row_kernel() && !self.reductions.is_empty() {
            return Err(IrError::RowKernelReduction);
        }
        if self.is_row_kernel()
            && self.has_ranges()
            && !self.selects_along_rows()
            && super::split::split(self).is_none()
        {
            return Err(IrError::RowKernelRange);
        }
        for (reduction, red) in self.reductions.iter().enumerate() {
            if red.value >= self.body.len() {
                return Err(IrError::MissingReducedValue {
                    reduction,
                    value: red.value,
                });
            }
            if red.reduced.len() != self.rank {
                return Err(IrError::ReducedMaskRank {
                    reduction,
                    len: red.reduced.len(),
                    rank: self.rank,
                });
            }
            let integer_value = self.prec(red.value) == Prec::I64;
            if integer_value != (Prec::of(red.view.dtype) == Prec::I64) {
                return Err(IrError::ReducedPrecision { reduction });
            }
            let broadcast = |d: usize| red.view.axes[d] == Axis::Broadcast;
            if let Some(axis) = (0..self.rank).find(|&d| broadcast(d) != red.reduced[d]) {
                return Err(IrError::ReductionOutput { reduction, axis });
            }
        }
        // Last, because it is about values rather than structure: an emitter may accept an
        // unrounded literal (both spell one by rounding it to nearest) but nothing else.
        for (value, instr) in self.body.iter().enumerate() {
            if let Instr::Const {
                value: literal,
                prec: Prec::F32,
            } = *instr
                && !literal.is_nan()
                && (literal as f32) as f64 != literal
            {
                return Err(IrError::UnrepresentableConst { value, literal });
            }
        }
        Ok(())
    }
}

impl KernelIr {
    /// The stores' part of [`KernelIr::verify`]: existing values at their dtype's precision,
    /// and a scatter store alone in its kernel, through an integer index, moving off the rows.
    fn verify_stores(&self) -> Result<(), IrError> {
        for (store, s) in self.stores.iter().enumerate() {
            if s.value >= self.body.len() {
                return Err(IrError::MissingStoredValue {
                    store,
                    value: s.value,
                });
            }
            if self.prec(s.value) != Prec::of(s.view.dtype) {
                return Err(IrError::StorePrecision { store });
            }
            if let Some(scatter) = s.scatter {
                let alone = self.stores.len() == 1
                    && self.reductions.is_empty()
                    && !self.is_row_kernel()
                    && !self.has_ranges();
                let index_ok =
                    scatter.index < self.body.len() && self.prec(scatter.index) == Prec::I64;
                if !alone
                    || !index_ok
                    || s.view.is_mapped()
                    || s.view.axes[self.rank - 1] != Axis::Broadcast
                {
                    return Err(IrError::Scatter { store });
                }
            }
        }
        Ok(())
    }
}

/// The part of a value's buffer one write reaches: per axis of the value, the first index
/// and how many.
type Block = Vec<(usize, usize)>;

impl super::Program {
    /// Values written by several writes (several stores of one step or of several steps: a
    /// concat copied piece by piece, or written in place by its operands' kernels) are written
    /// exactly once each: every write reaches a block of the value's buffer, the blocks are
    /// disjoint, and together they hold every element. A buffer with an element no write
    /// reaches would be read as stale memory from a reused slot, and one written twice could
    /// race on a GPU; neither shows up in a bounds check. Values written once are whole by
    /// construction and are not checked here. Called by [`super::Program::check_bounds`].
    pub fn check_writes(&self) -> crate::error::Result<()> {
        use crate::dag::Value;
        use crate::error::{Error, ErrorKind, Site};
        let dag = &self.dag;
        let mut writes: Vec<Vec<Option<Block>>> = vec![Vec::new(); dag.nodes.len()];
        // An epilogue's stores are a kernel's, after its product's.
        let launches = self.steps.iter().flat_map(|step| match step {
            super::Step::MatMul(m) => {
                vec![(Some(m.written()), m.epilogue.as_ref().map(|e| &e.step))]
            }
            super::Step::Kernel(k) => vec![(None, Some(k))],
        });
        for (product, kernel) in launches {
            if let Some(Value::Node(n)) = product {
                let shape = &dag.nodes[n].ty.shape;
                writes[n].push(Some(shape.iter().map(|&s| (0, s)).collect()));
            }
            match kernel {
                None => {}
                Some(k) => {
                    let Some(ir) = self.kernels.get(k.kernel) else {
                        continue;
                    };
                    if k.launch.sizes.contains(&0) {
                        continue;
                    }
                    for a in ir.loads.len()..ir.arg_count().min(k.args.len()) {
                        let Value::Node(n) = k.args[a] else { continue };
                        // A scatter adds into a value that earlier writes hold whole.
                        if let Arg::Store(s) = ir.arg(a)
                            && ir.stores[s].scatter.is_some()
                        {
                            let whole = crate::shape::numel(&dag.nodes[n].ty.shape);
                            if writes[n].is_empty() && whole > 0 {
                                return Err(Error::new(
                                    Site::node(&dag.nodes[n].name),
                                    ErrorKind::Lower(
                                        "a scatter adds into a value nothing wrote before".into(),
                                    ),
                                ));
                            }
                            continue;
                        }
                        let (Some(strides), Some(&offset)) =
                            (k.launch.strides.get(a), k.launch.offsets.get(a))
                        else {
                            continue;
                        };
                        let shape = &dag.nodes[n].ty.shape;
                        writes[n].push(block(shape, &k.launch.sizes, strides, offset));
                    }
                }
            }
        }
        for (n, blocks) in writes.iter().enumerate() {
            if blocks.len() < 2 {
                continue;
            }
            let shape = &dag.nodes[n].ty.shape;
            let error = |what: String| {
                Err(Error::new(
                    Site::node(&dag.nodes[n].name),
                    ErrorKind::Lower(format!("the writes of {shape:?} {what}")),
                ))
            };
            let Some(blocks) = blocks.iter().cloned().collect::<Option<Vec<Block>>>() else {
                return error("include one that is no block of the buffer".into());
            };
            let blocks: Vec<Block> = blocks
                .into_iter()
                .filter(|b| b.iter().all(|&(_, len)| len > 0))
                .collect();
            for (i, a) in blocks.iter().enumerate() {
                for b in &blocks[i + 1..] {
                    let overlap = a
                        .iter()
                        .zip(b)
                        .all(|(&(a0, al), &(b0, bl))| a0 < b0 + bl && b0 < a0 + al);
                    if overlap {
                        return error(format!("overlap: {a:?} and {b:?} (first, count per axis)"));
                    }
                }
            }
            let held: usize = blocks
                .iter()
                .map(|b| b.iter().map(|&(_, len)| len).product::<usize>())
                .sum();
            if held != crate::shape::numel(shape) {
                return error(format!("hold {held} of its elements"));
            }
        }
        Ok(())
    }
}

/// The block of a contiguous buffer of `shape` that a view over a domain of `sizes` (none
/// 0) with `strides` from `offset` reaches, or `None` when it reaches no block: each domain
/// axis that moves must step along one axis of the value by a whole number of its elements,
/// the steps along each value axis must fill a range without gaps (a loop axis split by the
/// lowering's refinement gives two steps along one value axis), and the range must stay inside
/// that axis. A broadcast axis of a store writes its index 0 only, so it reaches one element.
fn block(shape: &[usize], sizes: &[i64], strides: &[i64], offset: i64) -> Option<Block> {
    let own = super::view::contiguous_strides(shape);
    let numel = crate::shape::numel(shape) as i64;
    if offset < 0 || offset >= numel.max(1) {
        return None;
    }
    // Per value axis: (step in its elements, count) of each domain axis moving along it.
    let mut steps: Vec<Vec<(i64, i64)>> = vec![Vec::new(); shape.len()];
    for (&n, &s) in sizes.iter().zip(strides) {
        if n <= 1 || s == 0 {
            continue;
        }
        let j = (0..shape.len())
            .find(|&j| shape[j] > 1 && own[j] <= s && s < own[j] * shape[j] as i64)?;
        if s % own[j] != 0 {
            return None;
        }
        steps[j].push((s / own[j], n));
    }
    let mut block = Vec::with_capacity(shape.len());
    for (j, mut axis) in steps.into_iter().enumerate() {
        let first = offset / own[j] % (shape[j].max(1) as i64);
        axis.sort_unstable();
        let mut len = 1i64;
        for (step, n) in axis {
            if step != len {
                return None;
            }
            len = len.checked_mul(n)?;
        }
        if first + len > shape[j] as i64 {
            return None;
        }
        block.push((first as usize, len as usize));
    }
    let start: i64 = block
        .iter()
        .zip(&own)
        .map(|(&(f, _), &s)| f as i64 * s)
        .sum();
    (start == offset).then_some(block)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::lower::ir::{ReduceKind, Reduction, RowArithmetic, Store, View};

    /// `y = x + 1` over `[n, m]`, and the sum of `x` over axis 1.
    fn valid() -> KernelIr {
        let view = |axes: Vec<Axis>| View::strided(DType::F32, axes);
        KernelIr {
            rank: 2,
            row_arithmetic: RowArithmetic::default(),
            loads: vec![view(vec![Axis::Strided, Axis::Unit])],
            body: vec![
                Instr::Load { view: 0 },
                Instr::Const {
                    value: 1.0,
                    prec: Prec::F32,
                },
                Instr::Binary {
                    op: crate::formula::BinOp::Add,
                    a: 0,
                    b: 1,
                    prec: Prec::F32,
                },
            ],
            stores: vec![Store::new(2, view(vec![Axis::Strided, Axis::Unit]))],
            reductions: vec![Reduction {
                kind: ReduceKind::Sum,
                value: 0,
                reduced: vec![false, true],
                view: view(vec![Axis::Strided, Axis::Broadcast]),
            }],
        }
    }

    #[test]
    fn a_lowered_shape_passes() {
        assert_eq!(valid().verify(), Ok(()));
    }

    #[test]
    fn each_broken_invariant_is_named() {
        let mut ir = valid();
        ir.loads[0].axes[0] = Axis::Unit;
        assert_eq!(
            ir.verify(),
            Err(IrError::UnitNotInnermost { arg: 0, axis: 0 })
        );

        let mut ir = valid();
        ir.body[2] = Instr::Binary {
            op: crate::formula::BinOp::Add,
            a: 0,
            b: 2,
            prec: Prec::F32,
        };
        assert_eq!(
            ir.verify(),
            Err(IrError::UseBeforeDefinition {
                value: 2,
                operand: 2
            })
        );

        let mut ir = valid();
        ir.body[1] = Instr::Const {
            value: 0.1,
            prec: Prec::F32,
        };
        assert!(matches!(
            ir.verify(),
            Err(IrError::UnrepresentableConst { value: 1, .. })
        ));
        // Structure is checked before literals.
        ir.stores[0].value = 7;
        assert_eq!(
            ir.verify(),
            Err(IrError::MissingStoredValue { store: 0, value: 7 })
        );

        // Index maps: loads only, never `Unit`, no empty stage.
        let mut ir = valid();
        ir.loads[0].stages = vec![2];
        assert_eq!(ir.verify(), Err(IrError::MappedView { arg: 0 }));
        ir.loads[0].axes[1] = Axis::Strided;
        assert_eq!(ir.verify(), Ok(()));
        ir.loads[0].stages = vec![2, 0];
        assert_eq!(ir.verify(), Err(IrError::MappedView { arg: 0 }));
        let mut ir = valid();
        ir.stores[0].view.axes[1] = Axis::Strided;
        ir.stores[0].view.stages = vec![2];
        assert_eq!(ir.verify(), Err(IrError::MappedView { arg: 1 }));

        let mut ir = valid();
        ir.body.push(Instr::Widen { x: 2 });
        ir.body.push(Instr::Widen { x: 3 });
        assert_eq!(ir.verify(), Err(IrError::WidensDouble { value: 4 }));

        let mut ir = valid();
        ir.stores[0].view.dtype = DType::F64;
        assert_eq!(ir.verify(), Err(IrError::StorePrecision { store: 0 }));

        let mut ir = valid();
        ir.reductions[0].reduced = vec![true, true];
        assert_eq!(
            ir.verify(),
            Err(IrError::ReductionOutput {
                reduction: 0,
                axis: 0
            })
        );
        assert_eq!(
            ir.verify().unwrap_err().to_string(),
            "a reduction's output is broadcast exactly on its reduced axes (reduction 0, axis 0)"
        );
    }

    /// `x - max(concat(x0, x1)[row])` over `[n, m]`: a row kernel whose range loads read
    /// along `loads` and whose select picks along `select`, its row maximum read by the store.
    fn row_kernel_of_concat(loads: usize, select: usize) -> KernelIr {
        let view = |axes: Vec<Axis>| View::strided(DType::F32, axes);
        KernelIr {
            rank: 2,
            row_arithmetic: RowArithmetic::default(),
            loads: vec![
                view(vec![Axis::Strided, Axis::Unit]),
                view(vec![Axis::Strided, Axis::Unit]),
            ],
            body: vec![
                Instr::RangeLoad {
                    view: 0,
                    axis: loads,
                    range: 0,
                },
                Instr::RangeLoad {
                    view: 1,
                    axis: loads,
                    range: 1,
                },
                Instr::Select {
                    axis: select,
                    ranges: vec![0, 1],
                    cases: vec![0, 1],
                    prec: Prec::F32,
                },
                Instr::RowReduce {
                    kind: ReduceKind::Max,
                    x: 2,
                    dtype: DType::F32,
                },
                Instr::Binary {
                    op: crate::formula::BinOp::Sub,
                    a: 2,
                    b: 3,
                    prec: Prec::F32,
                },
            ],
            stores: vec![Store::new(4, view(vec![Axis::Strided, Axis::Unit]))],
            reductions: Vec::new(),
        }
    }

    /// A row kernel may read a concat along an outer axis (it runs as one row kernel per
    /// segment) or along its rows (each pass evaluates every operand), not along both.
    #[test]
    fn row_kernels_select_along_one_kind_of_axis() {
        assert_eq!(row_kernel_of_concat(0, 0).verify(), Ok(()));
        assert_eq!(row_kernel_of_concat(1, 1).verify(), Ok(()));
        assert!(row_kernel_of_concat(1, 1).selects_along_rows());
        assert!(!row_kernel_of_concat(0, 0).selects_along_rows());
        for (loads, select) in [(0, 1), (1, 0)] {
            assert_eq!(
                row_kernel_of_concat(loads, select).verify(),
                Err(IrError::RowKernelRange)
            );
        }
    }
}
