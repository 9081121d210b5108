//! Static shapes: NumPy broadcasting and the shape rules of the built-in ops.
//!
//! Shape inference and the reference evaluator both use these functions, so a graph that
//! type-checks is evaluated with exactly the shapes that were checked.

mod padding;
pub use padding::{Coordinates, Padding};

/// Why a shape rule refuses its operands. Each message names the shapes, axes or sizes
/// concerned; graph checking reports it at the node, the evaluator and the ONNX importer at
/// theirs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error(
        "shapes {a:?} and {b:?} do not broadcast (dimension {dim} of the result: {da} vs {db})"
    )]
    Broadcast {
        a: Shape,
        b: Shape,
        dim: usize,
        da: usize,
        db: usize,
    },
    #[error("axis {axis} is out of range for rank {rank}")]
    AxisOutOfRange { axis: i64, rank: usize },
    /// `axes` as given (`None`: every axis).
    #[error("axes {axes:?} name the same axis twice")]
    RepeatedAxis { axes: Option<Vec<i64>> },
    #[error("reshape target {0:?} has more than one -1")]
    ReshapeUnknowns(Vec<i64>),
    #[error("reshape target {0:?} has a negative size")]
    ReshapeNegative(Vec<i64>),
    #[error("reshape target {0:?} overflows")]
    ReshapeOverflow(Vec<i64>),
    #[error("cannot infer the -1 in {target:?} for {total} elements")]
    ReshapeInfer { target: Vec<i64>, total: usize },
    #[error("cannot reshape {from:?} ({total} elements) to {target:?} ({known} elements)")]
    ReshapeCount {
        from: Shape,
        total: usize,
        target: Vec<i64>,
        known: usize,
    },
    #[error("perm {perm:?} has {} entries for rank {rank}", .perm.len())]
    PermLength { perm: Vec<i64>, rank: usize },
    #[error("perm {perm:?} is not a permutation of 0..{rank}")]
    NotPermutation { perm: Vec<usize>, rank: usize },
    #[error("slice step must be positive, got {0}")]
    SliceStep(i64),
    #[error("slice axis {axis} of {shape:?} is too long to index")]
    SliceTooLong { axis: usize, shape: Shape },
    #[error("concat needs at least one input")]
    ConcatEmpty,
    #[error("concat along axis {axis}: shape {shape:?} does not match {first:?} outside that axis")]
    ConcatMismatch {
        axis: usize,
        shape: Shape,
        first: Shape,
    },
    #[error("concat along axis {axis}: the result is too long")]
    ConcatTooLong { axis: usize },
    #[error("matmul operands must have at least one dimension")]
    MatMulScalar,
    #[error("matmul of {a:?} and {b:?}: inner dimensions {k} and {k2} differ")]
    MatMulInner {
        a: Shape,
        b: Shape,
        k: usize,
        k2: usize,
    },
    #[error("matmul batch dimensions: {0}")]
    MatMulBatch(Box<ShapeError>),
}

/// A static shape; `[]` is a scalar, a 0 anywhere means an empty tensor.
pub type Shape = Vec<usize>;

/// Number of elements (1 for a scalar, 0 when any dimension is 0).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The most axes a shape may have. Graph files, `.npy` files and rule conditions (`Rank`)
/// are all held to it, so nothing sized by a rank can ask for an absurd allocation.
pub const MAX_RANK: usize = 64;

/// The most elements a value (graph input or op result) may have, counting only its non-zero
/// dims (2^48, 256 Ti elements). Far beyond any tensor that can be materialized, yet small
/// enough that byte counts (8 bytes an element) of thousands of such tensors fit in a `u64`.
/// Graph checking refuses a larger value (see [`within_limits`]).
pub const MAX_NUMEL: usize = 1 << 48;

/// Number of elements, or `None` if the shape is too large to represent: the product of its
/// non-zero dims must fit in `isize`, ndarray's limit even for an empty array (`[0, 2^64-1]`
/// holds no elements, but no array of that shape can be built).
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    let nonzero = nonzero_numel(shape).filter(|&n| n <= isize::MAX as usize)?;
    Some(if shape.contains(&0) { 0 } else { nonzero })
}

/// Whether a value may have `shape`: at most [`MAX_RANK`] axes and [`MAX_NUMEL`] elements
/// counting only the non-zero dims.
pub fn within_limits(shape: &[usize]) -> bool {
    shape.len() <= MAX_RANK && nonzero_numel(shape).is_some_and(|n| n <= MAX_NUMEL)
}

/// The product of the non-zero dims, `None` on overflow.
fn nonzero_numel(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// NumPy broadcasting of two shapes: right-aligned, each pair of dims equal or one of them 1.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Shape, ShapeError> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, slot) in out.iter_mut().enumerate() {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *slot = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(ShapeError::Broadcast {
                    a: a.to_vec(),
                    b: b.to_vec(),
                    dim: i,
                    da,
                    db,
                });
            }
        };
    }
    Ok(out)
}

/// Broadcasts any number of shapes together (the empty list gives a scalar).
pub fn broadcast_all<'a>(
    shapes: impl IntoIterator<Item = &'a [usize]>,
) -> Result<Shape, ShapeError> {
    shapes
        .into_iter()
        .try_fold(Vec::new(), |acc, s| broadcast(&acc, s))
}

/// Whether `from` broadcasts to exactly `to` (the rule of broadcast_to and sum_to_size).
pub fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len()
        && from
            .iter()
            .rev()
            .zip(to.iter().rev())
            .all(|(&f, &t)| f == t || f == 1)
}

/// The dim `k` places from the right, 1 when the shape is shorter.
fn dim_from_right(shape: &[usize], k: usize) -> usize {
    if k < shape.len() {
        shape[shape.len() - 1 - k]
    } else {
        1
    }
}

/// Resolves a possibly negative axis against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize, ShapeError> {
    let r = rank as i64;
    if axis >= -r && axis < r {
        Ok(if axis < 0 { axis + r } else { axis } as usize)
    } else {
        Err(ShapeError::AxisOutOfRange { axis, rank })
    }
}

/// Resolves reduction axes: `None` means every axis; duplicates are an error.
pub fn normalize_axes(axes: Option<&[i64]>, rank: usize) -> Result<Vec<usize>, ShapeError> {
    let mut out: Vec<usize> = match axes {
        None => (0..rank).collect(),
        Some(axes) => axes
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
    };
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(ShapeError::RepeatedAxis {
            axes: axes.map(<[i64]>::to_vec),
        });
    }
    Ok(out)
}

/// The shape left after reducing `axes` (already normalized).
pub fn reduced_shape(shape: &[usize], axes: &[usize], keepdim: bool) -> Shape {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Resolves a reshape target, inferring at most one `-1`.
pub fn reshape_target(from: &[usize], target: &[i64]) -> Result<Shape, ShapeError> {
    let total = numel(from);
    let mut unknown = None;
    let mut known: usize = 1;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if unknown.is_none() => unknown = Some(i),
            -1 => return Err(ShapeError::ReshapeUnknowns(target.to_vec())),
            d if d < 0 => return Err(ShapeError::ReshapeNegative(target.to_vec())),
            d => {
                known = known
                    .checked_mul(d as usize)
                    .ok_or_else(|| ShapeError::ReshapeOverflow(target.to_vec()))?
            }
        }
    }
    let mut out: Shape = target.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = unknown {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(ShapeError::ReshapeInfer {
                target: target.to_vec(),
                total,
            });
        }
        out[i] = total / known;
    } else if known != total {
        return Err(ShapeError::ReshapeCount {
            from: from.to_vec(),
            total,
            target: target.to_vec(),
            known,
        });
    }
    Ok(out)
}

/// Validates a permutation (`None`: reverse the axes) and returns it.
pub fn permutation(perm: Option<&[i64]>, rank: usize) -> Result<Vec<usize>, ShapeError> {
    let perm: Vec<usize> = match perm {
        None => (0..rank).rev().collect(),
        Some(p) => {
            if p.len() != rank {
                return Err(ShapeError::PermLength {
                    perm: p.to_vec(),
                    rank,
                });
            }
            p.iter()
                .map(|&a| normalize_axis(a, rank))
                .collect::<Result<_, _>>()?
        }
    };
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return Err(ShapeError::NotPermutation { perm, rank });
    }
    Ok(perm)
}

/// A resolved slice along one axis: the first index, the stride, and how many elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRange {
    pub axis: usize,
    pub start: usize,
    pub step: usize,
    pub len: usize,
}

/// Python's `x[start:end:step]` rules: negative indices count from the end, out-of-range
/// bounds clamp, an empty range is allowed; `step` must be positive.
pub fn slice_range(
    shape: &[usize],
    axis: i64,
    start: i64,
    end: Option<i64>,
    step: i64,
) -> Result<SliceRange, ShapeError> {
    let axis = normalize_axis(axis, shape.len())?;
    if step <= 0 {
        return Err(ShapeError::SliceStep(step));
    }
    let dim = i64::try_from(shape[axis]).map_err(|_| ShapeError::SliceTooLong {
        axis,
        shape: shape.to_vec(),
    })?;
    let clamp = |i: i64| {
        let i = if i < 0 { i + dim } else { i };
        i.clamp(0, dim)
    };
    let start = clamp(start);
    let end = clamp(end.unwrap_or(dim));
    let len = if end > start {
        // Not `(end - start + step - 1) / step`, which overflows for a huge step.
        (end - start - 1) / step + 1
    } else {
        0
    };
    // With at most one element the step is never taken: make it 1, so that no consumer
    // multiplies a huge step by a stride (`step = i64::MAX` picks just the first element).
    let step = if len <= 1 { 1 } else { step };
    Ok(SliceRange {
        axis,
        start: start as usize,
        step: step as usize,
        len: len as usize,
    })
}

/// The shape of concatenating `shapes` along `axis`.
pub fn concat_shape(shapes: &[&[usize]], axis: i64) -> Result<(usize, Shape), ShapeError> {
    let first = shapes.first().ok_or(ShapeError::ConcatEmpty)?;
    let rank = first.len();
    let axis = normalize_axis(axis, rank)?;
    let mut out = first.to_vec();
    out[axis] = 0;
    for s in shapes {
        let same_elsewhere = s.len() == rank
            && s.iter()
                .zip(first.iter())
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !same_elsewhere {
            return Err(ShapeError::ConcatMismatch {
                axis,
                shape: s.to_vec(),
                first: first.to_vec(),
            });
        }
        out[axis] = out[axis]
            .checked_add(s[axis])
            .ok_or(ShapeError::ConcatTooLong { axis })?;
    }
    Ok((axis, out))
}

/// NumPy matmul shapes: `[..., n, k] @ [..., k, m] -> [..., n, m]` with broadcast batch dims;
/// a 1-D left operand is `[1, k]` and a 1-D right operand `[k, 1]`, the added axis removed.
/// A matmul operand's shape as `[batch…, rows, cols]`: a 1-D left operand is a row, a 1-D
/// right operand a column (NumPy's promotion).
pub fn matmul_operand(shape: &[usize], is_rhs: bool) -> Vec<usize> {
    match shape.len() {
        1 if is_rhs => vec![shape[0], 1],
        1 => vec![1, shape[0]],
        _ => shape.to_vec(),
    }
}

/// For each matrix of a matmul result (row-major over the broadcast `batch` dims), the element
/// offsets of its left and right operand matrices in contiguous `a` and `b` (both as
/// [`matmul_operand`] gives them): a batch dim of size 1 is broadcast (offset step 0).
pub fn matmul_batch_offsets(a: &[usize], b: &[usize], batch: &[usize]) -> Vec<(usize, usize)> {
    let strides = |s: &[usize]| {
        let lead = batch.len() - (s.len() - 2);
        let mut st = vec![0usize; batch.len()];
        let mut step = s[s.len() - 2] * s[s.len() - 1];
        for d in (0..s.len() - 2).rev() {
            if s[d] != 1 {
                st[lead + d] = step;
            }
            step *= s[d];
        }
        st
    };
    let (sa, sb) = (strides(a), strides(b));
    (0..numel(batch))
        .map(|mut idx| {
            let (mut oa, mut ob) = (0, 0);
            for d in (0..batch.len()).rev() {
                let i = idx % batch[d];
                idx /= batch[d];
                oa += i * sa[d];
                ob += i * sb[d];
            }
            (oa, ob)
        })
        .collect()
}

pub fn matmul_shape(a: &[usize], b: &[usize]) -> Result<Shape, ShapeError> {
    if a.is_empty() || b.is_empty() {
        return Err(ShapeError::MatMulScalar);
    }
    let a2: Shape = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Shape = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (n, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, m) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(ShapeError::MatMulInner {
            a: a.to_vec(),
            b: b.to_vec(),
            k,
            k2,
        });
    }
    let mut out = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])
        .map_err(|e| ShapeError::MatMulBatch(Box::new(e)))?;
    if a.len() > 1 {
        out.push(n);
    }
    if b.len() > 1 {
        out.push(m);
    }
    Ok(out)
}

/// A tensor addressed in someone else's buffer: element `idx` of a value of some shape lives
/// at `offset + Σ idx[d] · strides[d]` (in elements). Layout ops that only re-index (slice,
/// transpose, reshape, broadcast) map one such view to another, so a kernel can read their
/// result straight from their operand's buffer instead of copying it first. The sizes are not
/// part of the view: callers hold the shape beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strided {
    pub offset: i64,
    pub strides: Vec<i64>,
}

impl Strided {
    /// A contiguous (row-major) buffer of `shape`.
    pub fn contiguous(shape: &[usize]) -> Strided {
        let mut strides = vec![0i64; shape.len()];
        let mut step = 1i64;
        for (d, &n) in shape.iter().enumerate().rev() {
            strides[d] = step;
            step = step.saturating_mul(n.max(1) as i64);
        }
        Strided { offset: 0, strides }
    }

    /// The element of the buffer that index `q` (row-major over `shape`) of this view of
    /// `shape` lies at, wrapping as [`Stage::apply`] does (callers check [`Strided::span`]).
    pub fn element(&self, shape: &[usize], q: usize) -> i64 {
        let mut rest = q;
        let mut at = self.offset;
        for (&n, &s) in shape.iter().zip(&self.strides).rev() {
            let n = n.max(1);
            at = at.wrapping_add(((rest % n) as i64).wrapping_mul(s));
            rest /= n;
        }
        at
    }

    /// Whether every element this view of `shape` addresses lies in a buffer of `len`
    /// elements (a view of no elements addresses none).
    pub fn within(&self, shape: &[usize], len: usize) -> bool {
        self.strides.len() == shape.len()
            && match self.span(shape) {
                Some((low, high)) => low >= 0 && (high as u64) < len as u64,
                None => shape.contains(&0),
            }
    }

    /// The lowest and the highest element of the buffer this view of `shape` addresses;
    /// `None` when it addresses none (an axis of size 0) or an address overflows.
    pub fn span(&self, shape: &[usize]) -> Option<(i64, i64)> {
        if shape.contains(&0) || shape.len() != self.strides.len() {
            return None;
        }
        let (mut low, mut high) = (self.offset, self.offset);
        for (&n, &s) in shape.iter().zip(&self.strides) {
            let reach = (n as i64 - 1).checked_mul(s)?;
            if reach < 0 {
                low = low.checked_add(reach)?;
            } else {
                high = high.checked_add(reach)?;
            }
        }
        Some((low, high))
    }

    /// Axis `d` of the result is axis `perm[d]` of this view.
    pub fn transpose(&self, perm: &[usize]) -> Strided {
        Strided {
            offset: self.offset,
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
        }
    }

    /// Every `range.step`-th element from `range.start` along `range.axis`.
    pub fn slice(&self, range: &SliceRange) -> Strided {
        let mut strides = self.strides.clone();
        let along = strides[range.axis];
        strides[range.axis] = along.saturating_mul(range.step as i64);
        Strided {
            offset: self
                .offset
                .saturating_add((range.start as i64).saturating_mul(along)),
            strides,
        }
    }

    /// This view of shape `from` broadcast to `to` (right-aligned, NumPy rules): new leading
    /// axes and size-1 axes that grow get stride 0.
    pub fn broadcast(&self, from: &[usize], to: &[usize]) -> Strided {
        let lead = to.len() - from.len();
        let strides = (0..to.len())
            .map(|d| {
                if d < lead || from[d - lead] != to[d] {
                    0
                } else {
                    self.strides[d - lead]
                }
            })
            .collect();
        Strided {
            offset: self.offset,
            strides,
        }
    }

    /// This view of shape `from` read as shape `to` (same element count, row-major order),
    /// or `None` when no strides can say that: a run of axes that the reshape merges must be
    /// laid out contiguously relative to each other (`stride[d] = stride[d + 1] · size[d + 1]`),
    /// as for a transposed matrix read as a vector it is not. Splitting an axis always works.
    pub fn reshape(&self, from: &[usize], to: &[usize]) -> Option<Strided> {
        if numel(from) == 0 {
            return Some(Strided {
                offset: self.offset,
                strides: Strided::contiguous(to).strides,
            });
        }
        // Size-1 axes carry no layout; the reshape is decided by the others.
        let old: Vec<(usize, i64)> = from
            .iter()
            .zip(&self.strides)
            .filter(|(n, _)| **n != 1)
            .map(|(&n, &s)| (n, s))
            .collect();
        let mut strides = vec![0i64; to.len()];
        let (mut oi, mut ni) = (0usize, 0usize);
        while ni < to.len() {
            if to[ni] == 1 {
                ni += 1;
                continue;
            }
            // The shortest runs old[oi..=oj] and to[ni..=nj] with equal products.
            let (mut oj, mut nj) = (oi, ni);
            let mut old_product = old.get(oi)?.0;
            let mut new_product = to[ni];
            while old_product != new_product {
                if old_product < new_product {
                    oj += 1;
                    let (size, stride) = *old.get(oj)?;
                    if old[oj - 1].1 != stride.saturating_mul(size as i64) {
                        return None;
                    }
                    old_product = old_product.checked_mul(size)?;
                } else {
                    nj += 1;
                    new_product = new_product.checked_mul(*to.get(nj)?)?;
                }
            }
            let mut stride = old[oj].1;
            for k in (ni..=nj).rev() {
                strides[k] = stride;
                stride = stride.saturating_mul(to[k] as i64);
            }
            oi = oj + 1;
            ni = nj + 1;
        }
        Some(Strided {
            offset: self.offset,
            strides,
        })
    }
}

/// How a view's axes split into strided sub-axes ([`IndexMap::split_strided`]): axis `d` of
/// the value is the row-major group of the `counts[d]` sub-axes of sizes `fine[..]` that
/// follow those of the axes before it; the view's strides are the sub-axes'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitAxes {
    pub fine: Vec<usize>,
    pub counts: Vec<usize>,
}

impl SplitAxes {
    /// The sub-axes of axis `d`, as (size, stride) pairs of `strided` (a view over `fine`),
    /// outermost first.
    pub fn axis(&self, strided: &Strided, d: usize) -> Vec<(usize, i64)> {
        let at: usize = self.counts[..d].iter().sum();
        (at..at + self.counts[d])
            .map(|i| (self.fine[i], strided.strides[i]))
            .collect()
    }
}

/// One reshape boundary of an [`IndexMap`]: a position (an element count from the start of a
/// row-major `shape`) is unflattened into a multi-index of `shape` with floor division and
/// remainder, which `strided` then maps to a position of the next stage (or to an element of
/// the buffer, for the last stage).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub shape: Shape,
    pub strided: Strided,
}

impl Stage {
    /// The stage of a strided view of `shape` that a reshape read in row-major order, with the
    /// axes that carry no layout taken out: size-1 axes are dropped and each run of axes laid
    /// out contiguously relative to each other (`stride[d] = stride[d + 1] · size[d + 1]`) is
    /// one axis. The stage unflattens every position exactly as the full shape would, with
    /// fewer divisions; a stage of rank 0 or 1 is affine and needs none.
    fn merged(shape: &[usize], strided: &Strided) -> Stage {
        let mut axes: Vec<(usize, i64)> = Vec::new();
        for (&n, &s) in shape.iter().zip(&strided.strides) {
            if n == 1 {
                continue;
            }
            match axes.last_mut() {
                Some((m, t)) if *t == s.saturating_mul(n as i64) => {
                    *m = m.saturating_mul(n);
                    *t = s;
                }
                _ => axes.push((n, s)),
            }
        }
        Stage {
            shape: axes.iter().map(|&(n, _)| n).collect(),
            strided: Strided {
                offset: strided.offset,
                strides: axes.iter().map(|&(_, s)| s).collect(),
            },
        }
    }

    /// The position this stage maps position `q` to (`q` below the stage's element count).
    pub fn apply(&self, q: i64) -> i64 {
        let mut rest = q;
        let mut at = self.strided.offset;
        for (&n, &s) in self.shape.iter().zip(&self.strided.strides).rev() {
            let n = (n as i64).max(1);
            at = at.wrapping_add((rest % n).wrapping_mul(s));
            rest /= n;
        }
        at
    }
}

/// A tensor addressed in someone else's buffer through reshapes that strides cannot express
/// (XLA's indexing maps, where a reshape is floor division and remainder): element `idx` of a
/// value is at position `outer.offset + Σ idx[d] · outer.strides[d]`, and each of `stages`
/// in turn maps that position to the next, the last one to an element of the buffer. With no
/// stages it is a [`Strided`] view. Like `Strided`, it holds no shape of its own; the stages
/// hold theirs, because unflattening needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexMap {
    pub outer: Strided,
    /// In the order they are applied, from the value's side to the buffer's.
    pub stages: Vec<Stage>,
}

impl IndexMap {
    /// A contiguous (row-major) buffer of `shape`.
    pub fn contiguous(shape: &[usize]) -> IndexMap {
        IndexMap::strided(Strided::contiguous(shape))
    }

    /// A view with no reshape boundary.
    pub fn strided(outer: Strided) -> IndexMap {
        IndexMap {
            outer,
            stages: Vec::new(),
        }
    }

    /// The strided view this is, when it has no reshape boundary.
    pub fn as_strided(&self) -> Option<&Strided> {
        self.stages.is_empty().then_some(&self.outer)
    }

    /// Axis `d` of the result is axis `perm[d]` of this view.
    pub fn transpose(&self, perm: &[usize]) -> IndexMap {
        self.with_outer(self.outer.transpose(perm))
    }

    /// Every `range.step`-th element from `range.start` along `range.axis`.
    pub fn slice(&self, range: &SliceRange) -> IndexMap {
        self.with_outer(self.outer.slice(range))
    }

    /// This view of shape `from` broadcast to `to`.
    pub fn broadcast(&self, from: &[usize], to: &[usize]) -> IndexMap {
        self.with_outer(self.outer.broadcast(from, to))
    }

    /// This view of shape `from` read as shape `to` in row-major order. Strides express it
    /// when they can ([`Strided::reshape`]); otherwise the current strides become a stage that
    /// the row-major position in `to` is unflattened into, which always works.
    pub fn reshape(&self, from: &[usize], to: &[usize]) -> IndexMap {
        if let Some(outer) = self.outer.reshape(from, to) {
            return self.with_outer(outer);
        }
        let stage = Stage::merged(from, &self.outer);
        let contiguous = Strided::contiguous(to);
        let mut stages = self.stages.clone();
        match stage.shape.len() {
            // Affine after all (all of `from`'s axes are contiguous with each other, which
            // `Strided::reshape` only misses when its size products overflow): fold the
            // stage into the row-major strides of `to`.
            0 | 1 => {
                let along = stage.strided.strides.first().copied().unwrap_or(0);
                return IndexMap {
                    outer: Strided {
                        offset: stage.strided.offset,
                        strides: contiguous
                            .strides
                            .iter()
                            .map(|&s| s.saturating_mul(along))
                            .collect(),
                    },
                    stages,
                };
            }
            _ => stages.insert(0, stage),
        }
        IndexMap {
            outer: contiguous,
            stages,
        }
    }

    /// This map as strides over sub-axes grouped under the value's axes, where it is one:
    /// a strided view (no stages; every axis its own group), or a row-major reshape of one
    /// whose merged axes line up with the value's axes, each value axis a run of whole
    /// sub-axes or a split of one (the im2col matrix of a convolution: `[N, C·K, P]` read
    /// from `[N, C, k…, p…]` strided windows of an image, which no two strides per axis can
    /// address). A library GEMM packs such an operand straight from its buffer. `None` for
    /// maps that are neither, and for empty values.
    pub fn split_strided(&self, shape: &[usize]) -> Option<(Strided, Option<SplitAxes>)> {
        if self.stages.is_empty() {
            return Some((self.outer.clone(), None));
        }
        let contiguous = Strided::contiguous(shape);
        let outer_is_row_major = self.outer.offset == 0
            && shape
                .iter()
                .zip(self.outer.strides.iter().zip(&contiguous.strides))
                .all(|(&n, (s, c))| n == 1 || s == c);
        if self.stages.len() != 1 || !outer_is_row_major || shape.contains(&0) {
            return None;
        }
        let stage = &self.stages[0];
        let mut pending: std::collections::VecDeque<(usize, i64)> = stage
            .shape
            .iter()
            .copied()
            .zip(stage.strided.strides.iter().copied())
            .collect();
        let (mut fine, mut strides, mut counts) = (Vec::new(), Vec::new(), Vec::new());
        for &n in shape {
            let (mut need, mut count) = (n, 0);
            if n == 1 {
                fine.push(1);
                strides.push(0);
                count += 1;
            }
            while need > 1 {
                let (m, s) = pending.pop_front()?;
                let taken = if m <= need && need % m == 0 {
                    (m, s)
                } else if m % need == 0 {
                    pending.push_front((m / need, s));
                    (need, s.checked_mul((m / need) as i64)?)
                } else {
                    return None;
                };
                fine.push(taken.0);
                strides.push(taken.1);
                count += 1;
                need /= taken.0;
            }
            counts.push(count);
        }
        if !pending.is_empty() {
            return None;
        }
        let strided = Strided {
            offset: stage.strided.offset,
            strides,
        };
        Some((strided, Some(SplitAxes { fine, counts })))
    }

    fn with_outer(&self, outer: Strided) -> IndexMap {
        IndexMap {
            outer,
            stages: self.stages.clone(),
        }
    }

    /// The buffer element of the value's element `idx` (every `idx[d]` within the value's
    /// shape).
    pub fn element(&self, idx: &[usize]) -> i64 {
        let q = idx
            .iter()
            .zip(&self.outer.strides)
            .fold(self.outer.offset, |a, (&i, &s)| {
                a.wrapping_add((i as i64).wrapping_mul(s))
            });
        self.stages.iter().fold(q, |q, stage| stage.apply(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[4, 1], &[1, 3]).unwrap(), vec![4, 3]);
        assert_eq!(broadcast(&[], &[2, 3]).unwrap(), vec![2, 3]);
        assert_eq!(broadcast(&[5, 1, 3], &[4, 1]).unwrap(), vec![5, 4, 3]);
        assert_eq!(broadcast(&[0, 1], &[1, 3]).unwrap(), vec![0, 3]);
        assert!(broadcast(&[2, 3], &[3, 2]).is_err());
        assert!(broadcast(&[0], &[2]).is_err());
        assert!(broadcasts_to(&[1, 3], &[4, 3]));
        assert!(!broadcasts_to(&[4, 3], &[1, 3]));
    }

    #[test]
    fn slices_follow_python() {
        let r = slice_range(&[10], 0, -3, None, 1).unwrap();
        assert_eq!((r.start, r.len), (7, 3));
        let r = slice_range(&[10], 0, 1, Some(8), 3).unwrap();
        assert_eq!((r.start, r.step, r.len), (1, 3, 3)); // 1, 4, 7
        assert_eq!(slice_range(&[10], 0, 8, Some(2), 1).unwrap().len, 0);
        assert_eq!(slice_range(&[10], 0, -100, Some(100), 1).unwrap().len, 10);
        assert!(slice_range(&[10], 0, 0, None, 0).is_err());
    }

    #[test]
    fn extreme_slice_bounds_clamp_like_python() {
        let r = slice_range(&[10], 0, 0, Some(i64::MAX), 1).unwrap();
        assert_eq!((r.start, r.step, r.len), (0, 1, 10));
        let r = slice_range(&[10], 0, i64::MIN, Some(i64::MAX), 3).unwrap();
        assert_eq!((r.start, r.step, r.len), (0, 3, 4));
        let r = slice_range(&[10], 0, -(1 << 53) - 1, Some(i64::MIN), 1).unwrap();
        assert_eq!(r.len, 0);
        let r = slice_range(&[10], -1, 2, Some(i64::MAX), i64::MAX).unwrap();
        assert_eq!((r.start, r.step, r.len), (2, 1, 1));
        let r = slice_range(&[10], 0, i64::MAX, None, 1).unwrap();
        assert_eq!((r.start, r.len), (10, 0));
        assert!(slice_range(&[10], 0, 0, None, -1).is_err());
        assert!(slice_range(&[10], 0, 0, None, i64::MIN).is_err());
    }

    #[test]
    fn matmul_shapes_follow_numpy() {
        assert_eq!(matmul_shape(&[2, 3], &[3, 4]).unwrap(), vec![2, 4]);
        assert_eq!(matmul_shape(&[5, 2, 3], &[3, 4]).unwrap(), vec![5, 2, 4]);
        assert_eq!(matmul_shape(&[3], &[3, 4]).unwrap(), vec![4]);
        assert_eq!(matmul_shape(&[2, 3], &[3]).unwrap(), vec![2]);
        assert_eq!(matmul_shape(&[3], &[3]).unwrap(), Vec::<usize>::new());
        assert!(matmul_shape(&[2, 3], &[4, 5]).is_err());
    }

    #[test]
    fn reshape_infers_minus_one() {
        assert_eq!(reshape_target(&[4, 6], &[-1, 8]).unwrap(), vec![3, 8]);
        assert!(reshape_target(&[4, 6], &[5, -1]).is_err());
        assert!(reshape_target(&[4, 6], &[-1, -1]).is_err());
        assert_eq!(reshape_target(&[0, 6], &[3, 0]).unwrap(), vec![3, 0]);
    }

    #[test]
    fn strided_views_follow_layout_ops() {
        let x = Strided::contiguous(&[4, 6]);
        assert_eq!(x.strides, vec![6, 1]);
        // Transposed, the rows of the result are the columns of x.
        let t = x.transpose(&[1, 0]);
        assert_eq!(t.strides, vec![1, 6]);
        // A transposed matrix is not a vector in memory order; its split is still a view.
        assert_eq!(t.reshape(&[6, 4], &[24]), None);
        assert_eq!(
            t.reshape(&[6, 4], &[3, 2, 4]).unwrap().strides,
            vec![2, 1, 6]
        );
        // Columns 2, 5 of x: offset 2, column stride 3. Read in order they are every third
        // element from 2, so even merging the rows is a view.
        let range = SliceRange {
            axis: 1,
            start: 2,
            step: 3,
            len: 2,
        };
        let s = x.slice(&range);
        assert_eq!((s.offset, s.strides.clone()), (2, vec![6, 3]));
        assert_eq!(s.reshape(&[4, 2], &[8]).unwrap().strides, vec![3]);
        // Columns 1, 2: merging a row with the next skips four elements, no stride says
        // that; splitting rows is a view.
        let s = x.slice(&SliceRange {
            axis: 1,
            start: 1,
            step: 1,
            len: 2,
        });
        assert_eq!(s.reshape(&[4, 2], &[8]), None);
        assert_eq!(
            s.reshape(&[4, 2], &[2, 2, 2]).unwrap().strides,
            vec![12, 6, 1]
        );
        // Contiguous reshapes, with size-1 axes anywhere.
        assert_eq!(
            x.reshape(&[4, 6], &[1, 24, 1]).unwrap().strides,
            vec![0, 1, 0]
        );
        assert_eq!(x.reshape(&[4, 6], &[6, 4]).unwrap().strides, vec![4, 1]);
        assert_eq!(x.broadcast(&[4, 6], &[3, 4, 6]).strides, vec![0, 6, 1]);
        assert_eq!(
            Strided::contiguous(&[4, 1])
                .broadcast(&[4, 1], &[4, 5])
                .strides,
            vec![1, 0]
        );
    }

    /// Every element of an index map, against the row-major element of the same position
    /// computed independently: `reshape(transpose(x))` reads `x[j][i]` at flat `i · rows + j`.
    #[test]
    fn index_maps_unflatten_reshapes_of_transposes_and_slices() {
        let x = IndexMap::contiguous(&[4, 6]);
        let t = x.transpose(&[1, 0]);
        let flat = t.reshape(&[6, 4], &[24]);
        assert_eq!(flat.stages.len(), 1);
        assert_eq!(flat.stages[0].shape, vec![6, 4]);
        for k in 0..24usize {
            let (i, j) = (k / 4, k % 4);
            assert_eq!(flat.element(&[k]), (j * 6 + i) as i64, "flat {k}");
        }
        // Reshaped again, and sliced with a step: still one stage, and the same elements.
        let back = flat.reshape(&[24], &[3, 8]).slice(&SliceRange {
            axis: 1,
            start: 1,
            step: 2,
            len: 4,
        });
        for r in 0..3usize {
            for c in 0..4usize {
                let k = r * 8 + 1 + 2 * c;
                assert_eq!(back.element(&[r, c]), ((k % 4) * 6 + k / 4) as i64);
            }
        }
        assert_eq!(back.stages.len(), 1);
        // Columns 1..3 of x, then a reshape: positions skip the other columns.
        let cols = x.slice(&SliceRange {
            axis: 1,
            start: 1,
            step: 1,
            len: 2,
        });
        let merged = cols.reshape(&[4, 2], &[8]);
        let want: Vec<i64> = (0..4).flat_map(|r| [r * 6 + 1, r * 6 + 2]).collect();
        let got: Vec<i64> = (0..8).map(|k| merged.element(&[k])).collect();
        assert_eq!(got, want);
        // Size-1 axes carry no layout: [6, 1, 4] merges into [6, 4] (rank 2, two divisions).
        let t3 = IndexMap::contiguous(&[4, 1, 6]).transpose(&[2, 1, 0]);
        assert_eq!(t3.reshape(&[6, 1, 4], &[24]).stages[0].shape, vec![6, 4]);
        // A strided reshape stays strided.
        assert!(x.reshape(&[4, 6], &[2, 12]).as_strided().is_some());
    }
}
