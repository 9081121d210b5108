//! Computed attributes: the closed vocabulary a rule's `compute` list draws from.
//!
//! Some rewrites cannot be written as a right-hand side that only rearranges what the
//! left-hand side matched. `transpose(transpose(x, p), q)` is one transpose, but its
//! permutation is `p` composed with `q`, a value that appears nowhere in the matched term; two
//! slices are one slice whose start, end and step are arithmetic on the six matched ones and on
//! the length of the sliced axis. A rule names such a value as a fresh attribute variable in
//! its right-hand side and says how to compute it:
//!
//! ```ron
//! Rule(
//!     name: "transpose-transpose",
//!     lhs: "(transpose (transpose ?x ?p) ?q)",
//!     rhs: "(transpose ?x ?r)",
//!     compute: [ComposePerm(into: "?r", x: "?x", inner: "?p", outer: "?q")],
//! )
//! ```
//!
//! Like conditions, computations are data with fixed meanings: each reads the class data of
//! the variables it names (an attribute leaf, or a tensor's shape) and produces attribute
//! leaves, or declines when the match is not one the computation can express (a slice that
//! reaches into two operands of a concat). A declined match is skipped exactly like one whose
//! conditions fail. The meanings follow the ops' built-in roles in `ops.ron` (`transpose`,
//! `slice`, `concat`), whatever a catalogue calls them; the engine never looks at op names.
//!
//! Everything about a computation is checked at load, with the file, line and column of the
//! offending value: its inputs must be bound by the left-hand side with the kind the
//! computation reads, its outputs must be fresh names, each used by the right-hand side in an
//! attribute position of the type the computation produces, and a rule that computes cannot be
//! bidirectional (its reverse direction would have to invert the computation). `check-rules`
//! runs the same computations on its random instances, so a rule that composes in the wrong
//! order is caught with a counterexample like any other unsound rule.

use super::VarKind;
use crate::attr::AttrType;
use crate::egraph::{ClassData, FuseGraph, Leaf};
use crate::shape;
use egg::{Id, Subst, Var};
use serde::{Deserialize, Serialize};

/// One computation of a rule's `compute` list. Variables are written as strings (`"?r"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Compute {
    /// `transpose(transpose(x, inner), outer)` equals `transpose(x, into)`: element `i` of
    /// `into` is `inner[outer[i]]` (an absent permutation reverses the axes of `x`'s rank).
    ComposePerm {
        into: String,
        x: String,
        inner: String,
        outer: String,
    },
    /// `slice(slice(x, axis, s1, e1, k1), axis, s2, e2, k2)` equals
    /// `slice(x, axis, s, e, k)` with `inner: [s1, e1, k1]`, `outer: [s2, e2, k2]` and
    /// `into: [s, e, k]`. Both slices are resolved by Python's rules on their own input (the
    /// inner one on `x`'s axis, the outer one on the inner result's length); the composed
    /// slice starts where the outer one's first element sits in `x`, steps by the product of
    /// the steps, and keeps the outer one's length. The computed bounds are non-negative and
    /// within the axis, so they mean the same whatever `x`'s length.
    ComposeSlices {
        into: Vec<String>,
        x: String,
        axis: String,
        inner: Vec<String>,
        outer: Vec<String>,
    },
    /// A slice of `concat(operands..., axis)` along the same axis, with `slice: [s, e, k]`,
    /// that selects only elements of operand `pick` (0-based) equals that operand sliced by
    /// `into: [s', e']` with the same step. Declines when the selected range reaches into
    /// another operand. An empty slice is taken from the picked operand as `0:0`.
    SliceOfConcat {
        into: Vec<String>,
        operands: Vec<String>,
        pick: usize,
        axis: String,
        slice: Vec<String>,
    },
    /// The slice of operand `x` of a pointwise op over `operands` (whose result has their
    /// broadcast shape) that a slice `[s, e, k]` along `axis` of that result reads:
    /// `into: [axis', s', e', k']`, with `axis'` the same axis in `x`'s own (right-aligned)
    /// axes. Where `x` has the axis at full length the bounds are the result's, resolved; where
    /// `x` has length 1 there (it is broadcast along it) the slice keeps its one element
    /// (`0:1`), so it still broadcasts. Declines when `x` lacks the axis altogether. This is
    /// what moves a slice across a pointwise op whose operands broadcast
    /// (`slice(a + bias, 1, …)` is `slice(a, 1, …) + slice(bias, 0, …)`).
    SliceOperand {
        into: Vec<String>,
        x: String,
        operands: Vec<String>,
        axis: String,
        slice: Vec<String>,
    },
    /// `transpose(matmul(a, b), perm)` equals `matmul(transpose(b), transpose(a))` when
    /// `perm` swaps the product's last two axes and keeps its batch axes in place, and both
    /// operands are matrices or batches of them: `into: [pa, pb]` are the permutations that
    /// swap the last two axes of `a` and of `b` (batch axes broadcast as before, each sum runs
    /// over the same terms in the same order). Declines for any other permutation and for a
    /// 1-D operand. With library calls reading their operands through strides, the product of
    /// transposes costs no copy, where the transposed product is a view no epilogue can take.
    SwapProduct {
        into: Vec<String>,
        a: String,
        b: String,
        perm: String,
    },
    /// A pointwise operand `x` of `reshape(p, to)` (it broadcasts to the reshape's result)
    /// as an operand of `p` itself: `into` is a shape for `x` such that `reshape(x, into)`
    /// broadcast to `p`'s shape holds at each element of `p` the value `x` holds at the same
    /// element of the reshaped result. The reshape groups axes (runs of `p`'s axes and of the
    /// result's whose sizes multiply to the same count); over each group `x` must be either
    /// constant (size 1 on every axis of it) or the group's full sizes (varying over it in the
    /// same row-major order), and declines otherwise. Leading axes of size 1 are left out, so
    /// a per-channel scale `[C, 1, 1]` of a convolution's `[N, C, H, W]` result, reshaped from
    /// its product `[N, C, H·W]`, becomes `[C, 1]`: a per-row scale of the product.
    ReshapeOperand {
        into: String,
        x: String,
        from: String,
        to: String,
    },
    /// A vector `x` (every axis of size 1 but the last) as a column: `into` is `[n, 1]` for
    /// `x`'s last axis `n`. A scale of a product's left operand along its last axis (the axis
    /// the product sums over) is a scale of the right operand's rows: `(x·g) W = x (g W)`
    /// with `g` as a column. Declines for anything else, and for a rank-0 `x`.
    ColumnOf { into: String, x: String },
}

/// What an input of a computation must be bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    Tensor,
    Attr(AttrType),
}

impl Reads {
    pub fn admits(self, kind: VarKind) -> bool {
        match self {
            Reads::Tensor => kind == VarKind::Tensor,
            Reads::Attr(ty) => kind == VarKind::Attr(ty),
        }
    }

    pub fn describe(self) -> String {
        match self {
            Reads::Tensor => "a tensor".into(),
            Reads::Attr(ty) => format!("an attribute ({ty})"),
        }
    }
}

/// One variable argument of a computation: the field it is written in, its index inside a
/// list field (`None` for a single variable), and the variable's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg<'a> {
    pub field: &'static str,
    pub index: Option<usize>,
    pub name: &'a str,
}

impl<'a> Arg<'a> {
    fn one(field: &'static str, name: &'a str) -> Arg<'a> {
        Arg {
            field,
            index: None,
            name,
        }
    }

    fn list(field: &'static str, names: &'a [String]) -> impl Iterator<Item = Arg<'a>> {
        names.iter().enumerate().map(move |(i, n)| Arg {
            field,
            index: Some(i),
            name: n,
        })
    }
}

impl Compute {
    /// The computation's name as written in a rule file.
    pub fn name(&self) -> &'static str {
        match self {
            Compute::ComposePerm { .. } => "ComposePerm",
            Compute::ComposeSlices { .. } => "ComposeSlices",
            Compute::SliceOfConcat { .. } => "SliceOfConcat",
            Compute::SliceOperand { .. } => "SliceOperand",
            Compute::SwapProduct { .. } => "SwapProduct",
            Compute::ReshapeOperand { .. } => "ReshapeOperand",
            Compute::ColumnOf { .. } => "ColumnOf",
        }
    }

    /// List fields that must have an exact length: (field, length wanted, length written).
    pub fn list_lengths(&self) -> Vec<(&'static str, usize, usize)> {
        match self {
            Compute::ComposePerm { .. } => Vec::new(),
            Compute::ComposeSlices {
                into, inner, outer, ..
            } => vec![
                ("into", 3, into.len()),
                ("inner", 3, inner.len()),
                ("outer", 3, outer.len()),
            ],
            Compute::SliceOfConcat { into, slice, .. } => {
                vec![("into", 2, into.len()), ("slice", 3, slice.len())]
            }
            Compute::SliceOperand { into, slice, .. } => {
                vec![("into", 4, into.len()), ("slice", 3, slice.len())]
            }
            Compute::SwapProduct { into, .. } => vec![("into", 2, into.len())],
            Compute::ReshapeOperand { .. } | Compute::ColumnOf { .. } => Vec::new(),
        }
    }

    /// The variables the computation reads, with what each must be bound to.
    pub fn inputs(&self) -> Vec<(Arg<'_>, Reads)> {
        let int = Reads::Attr(AttrType::Int);
        match self {
            Compute::ComposePerm {
                x, inner, outer, ..
            } => vec![
                (Arg::one("x", x), Reads::Tensor),
                (Arg::one("inner", inner), Reads::Attr(AttrType::Ints)),
                (Arg::one("outer", outer), Reads::Attr(AttrType::Ints)),
            ],
            Compute::ComposeSlices {
                x,
                axis,
                inner,
                outer,
                ..
            } => {
                let mut args = vec![
                    (Arg::one("x", x), Reads::Tensor),
                    (Arg::one("axis", axis), int),
                ];
                args.extend(Arg::list("inner", inner).map(|a| (a, int)));
                args.extend(Arg::list("outer", outer).map(|a| (a, int)));
                args
            }
            Compute::SliceOfConcat {
                operands,
                axis,
                slice,
                ..
            } => {
                let mut args: Vec<(Arg<'_>, Reads)> = Arg::list("operands", operands)
                    .map(|a| (a, Reads::Tensor))
                    .collect();
                args.push((Arg::one("axis", axis), int));
                args.extend(Arg::list("slice", slice).map(|a| (a, int)));
                args
            }
            Compute::SliceOperand {
                x,
                operands,
                axis,
                slice,
                ..
            } => {
                let mut args = vec![(Arg::one("x", x), Reads::Tensor)];
                args.extend(Arg::list("operands", operands).map(|a| (a, Reads::Tensor)));
                args.push((Arg::one("axis", axis), int));
                args.extend(Arg::list("slice", slice).map(|a| (a, int)));
                args
            }
            Compute::SwapProduct { a, b, perm, .. } => vec![
                (Arg::one("a", a), Reads::Tensor),
                (Arg::one("b", b), Reads::Tensor),
                (Arg::one("perm", perm), Reads::Attr(AttrType::Ints)),
            ],
            Compute::ReshapeOperand { x, from, to, .. } => vec![
                (Arg::one("x", x), Reads::Tensor),
                (Arg::one("from", from), Reads::Tensor),
                (Arg::one("to", to), Reads::Attr(AttrType::Ints)),
            ],
            Compute::ColumnOf { x, .. } => vec![(Arg::one("x", x), Reads::Tensor)],
        }
    }

    /// The variables the computation binds, with the attribute type each gets.
    pub fn outputs(&self) -> Vec<(Arg<'_>, AttrType)> {
        match self {
            Compute::ComposePerm { into, .. }
            | Compute::ReshapeOperand { into, .. }
            | Compute::ColumnOf { into, .. } => vec![(Arg::one("into", into), AttrType::Ints)],
            Compute::SwapProduct { into, .. } => Arg::list("into", into)
                .map(|a| (a, AttrType::Ints))
                .collect(),
            Compute::ComposeSlices { into, .. }
            | Compute::SliceOfConcat { into, .. }
            | Compute::SliceOperand { into, .. } => Arg::list("into", into)
                .map(|a| (a, AttrType::Int))
                .collect(),
        }
    }

    /// A check that needs more than the variables' kinds (found at load): the index of
    /// `pick` among the operands. `(field, message)`.
    pub fn invalid(&self) -> Option<(&'static str, String)> {
        match self {
            Compute::SliceOfConcat { operands, pick, .. } if *pick >= operands.len() => Some((
                "pick",
                format!(
                    "`pick` is {pick}, but there are {} operands (it counts from 0)",
                    operands.len()
                ),
            )),
            _ => None,
        }
    }

    /// Runs the computation on a match: the leaves it binds, in the order of
    /// [`Compute::outputs`], or `None` when it declines (see the variants).
    pub fn eval(&self, egraph: &FuseGraph, subst: &Subst) -> Option<Vec<Leaf>> {
        let data = |name: &str| -> Option<&ClassData> {
            let var: Var = name.parse().ok()?;
            Some(&egraph[*subst.get(var)?].data)
        };
        self.eval_with(&data)
    }

    /// [`Compute::eval`] over any way of finding a variable's class data.
    pub fn eval_with<'d>(&self, data: &dyn Fn(&str) -> Option<&'d ClassData>) -> Option<Vec<Leaf>> {
        let shape_of = |name: &str| data(name)?.ty().map(|t| t.shape.clone());
        let leaf = |name: &str| match data(name)? {
            ClassData::Attr(l) => Some(l.clone()),
            _ => None,
        };
        let int = |name: &str| -> Option<i64> {
            match leaf(name)? {
                Leaf::Num(bits) => {
                    let v = f64::from_bits(bits);
                    (v.fract() == 0.0 && v.abs() <= 9.007_199_254_740_992e15).then_some(v as i64)
                }
                Leaf::Int(v) => Some(v),
                _ => None,
            }
        };
        // An optional integer (a slice's `end`): absent is `None`, anything else must be one.
        let opt_int = |name: &str| -> Option<Option<i64>> {
            match leaf(name)? {
                Leaf::Absent => Some(None),
                _ => int(name).map(Some),
            }
        };
        let ints = |name: &str| -> Option<Option<Vec<i64>>> {
            match leaf(name)? {
                Leaf::Absent => Some(None),
                Leaf::Ints(v) => Some(Some(v)),
                _ => None,
            }
        };
        match self {
            Compute::ComposePerm {
                x, inner, outer, ..
            } => {
                let rank = shape_of(x)?.len();
                let p = shape::permutation(ints(inner)?.as_deref(), rank).ok()?;
                let q = shape::permutation(ints(outer)?.as_deref(), rank).ok()?;
                let composed = q.iter().map(|&i| p[i] as i64).collect();
                Some(vec![Leaf::Ints(composed)])
            }
            Compute::ComposeSlices {
                x,
                axis,
                inner,
                outer,
                ..
            } => {
                let shape = shape_of(x)?;
                let axis = int(axis)?;
                let first = shape::slice_range(
                    &shape,
                    axis,
                    int(&inner[0])?,
                    opt_int(&inner[1])?,
                    int(&inner[2])?,
                )
                .ok()?;
                let mut middle = shape.clone();
                middle[first.axis] = first.len;
                let second = shape::slice_range(
                    &middle,
                    axis,
                    int(&outer[0])?,
                    opt_int(&outer[1])?,
                    int(&outer[2])?,
                )
                .ok()?;
                let start = first
                    .start
                    .checked_add(second.start.checked_mul(first.step)?)?;
                let step = first.step.checked_mul(second.step)?;
                let (s, e, k) = bounds(start, step, second.len)?;
                Some(vec![Leaf::int(s), Leaf::int(e), Leaf::int(k)])
            }
            Compute::SliceOfConcat {
                operands,
                pick,
                axis,
                slice,
                ..
            } => {
                let shapes: Vec<Vec<usize>> = operands
                    .iter()
                    .map(|o| shape_of(o))
                    .collect::<Option<_>>()?;
                let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
                let (axis_index, whole) = shape::concat_shape(&refs, int(axis)?).ok()?;
                let range = shape::slice_range(
                    &whole,
                    int(axis)?,
                    int(&slice[0])?,
                    opt_int(&slice[1])?,
                    int(&slice[2])?,
                )
                .ok()?;
                let offset: usize = shapes[..*pick].iter().map(|s| s[axis_index]).sum();
                let length = shapes.get(*pick)?[axis_index];
                if range.len == 0 {
                    return Some(vec![Leaf::int(0), Leaf::int(0)]);
                }
                let last = range
                    .start
                    .checked_add((range.len - 1).checked_mul(range.step)?)?;
                if range.start < offset || last >= offset.checked_add(length)? {
                    return None;
                }
                let start = range.start - offset;
                let end = last - offset + 1;
                Some(vec![
                    Leaf::int(i64::try_from(start).ok()?),
                    Leaf::int(i64::try_from(end).ok()?),
                ])
            }
            Compute::SliceOperand {
                x,
                operands,
                axis,
                slice,
                ..
            } => {
                let shapes: Vec<Vec<usize>> = operands
                    .iter()
                    .map(|o| shape_of(o))
                    .collect::<Option<_>>()?;
                let whole = shape::broadcast_all(shapes.iter().map(Vec::as_slice)).ok()?;
                let range = shape::slice_range(
                    &whole,
                    int(axis)?,
                    int(&slice[0])?,
                    opt_int(&slice[1])?,
                    int(&slice[2])?,
                )
                .ok()?;
                slice_operand(&shape_of(x)?, &whole, &range)
            }
            Compute::SwapProduct { a, b, perm, .. } => {
                swap_product(&shape_of(a)?, &shape_of(b)?, ints(perm)?.as_deref())
            }
            Compute::ReshapeOperand { x, from, to, .. } => {
                let from = shape_of(from)?;
                let to = shape::reshape_target(&from, &ints(to)??).ok()?;
                reshape_operand(&shape_of(x)?, &from, &to).map(|s| vec![shape_leaf(&s)])
            }
            Compute::ColumnOf { x, .. } => column_of(&shape_of(x)?),
        }
    }
}

/// [`Compute::SliceOperand`] for an operand of shape `own` of a pointwise result of shape
/// `whole`, sliced by `range`.
fn slice_operand(own: &[usize], whole: &[usize], range: &shape::SliceRange) -> Option<Vec<Leaf>> {
    let lead = whole.len().checked_sub(own.len())?;
    let own_axis = range.axis.checked_sub(lead)?;
    let (s, e, k) = match own[own_axis] {
        n if n == whole[range.axis] => bounds(range.start, range.step, range.len)?,
        1 => (0, 1, 1),
        _ => return None,
    };
    Some(vec![
        Leaf::int(i64::try_from(own_axis).ok()?),
        Leaf::int(s),
        Leaf::int(e),
        Leaf::int(k),
    ])
}

/// [`Compute::SwapProduct`] on operands of shapes `a` and `b` and the transpose's `perm`.
fn swap_product(a: &[usize], b: &[usize], perm: Option<&[i64]>) -> Option<Vec<Leaf>> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let rank = shape::matmul_shape(a, b).ok()?.len();
    let swap_last_two = |rank: usize| {
        let mut p: Vec<usize> = (0..rank).collect();
        p.swap(rank - 2, rank - 1);
        p
    };
    if shape::permutation(perm, rank).ok()? != swap_last_two(rank) {
        return None;
    }
    let leaf = |p: Vec<usize>| Leaf::Ints(p.into_iter().map(|i| i as i64).collect());
    Some(vec![
        leaf(swap_last_two(a.len())),
        leaf(swap_last_two(b.len())),
    ])
}

/// [`Compute::ReshapeOperand`] for an operand of shape `x` of a reshape from `from` to `to`.
fn reshape_operand(x: &[usize], from: &[usize], to: &[usize]) -> Option<Vec<usize>> {
    if !shape::broadcasts_to(x, to) || from.contains(&0) {
        return None;
    }
    // x right-aligned against the result, with size 1 on the axes it lacks.
    let mut aligned = vec![1; to.len() - x.len()];
    aligned.extend_from_slice(x);
    let mut out = Vec::with_capacity(from.len());
    let (mut i, mut j) = (0, 0);
    while i < from.len() || j < to.len() {
        // The smallest run of axes on each side with equal element counts (size-1 axes
        // join the run they follow, or form their own).
        let (i0, j0) = (i, j);
        let (mut a, mut b) = (1usize, 1usize);
        loop {
            if a <= b && i < from.len() {
                a = a.checked_mul(from[i])?;
                i += 1;
            } else if j < to.len() {
                b = b.checked_mul(to[j])?;
                j += 1;
            } else if i < from.len() {
                a = a.checked_mul(from[i])?;
                i += 1;
            } else {
                break;
            }
            if a == b && (i == from.len() || from[i] != 1) && (j == to.len() || to[j] != 1) {
                break;
            }
        }
        if a != b {
            return None;
        }
        let group = &aligned[j0..j];
        if group.iter().all(|&d| d == 1) {
            out.extend(std::iter::repeat_n(1, i - i0));
        } else if group == &to[j0..j] {
            out.extend_from_slice(&from[i0..i]);
        } else {
            return None;
        }
    }
    let lead = out.iter().take_while(|&&d| d == 1).count();
    Some(out.split_off(lead))
}

/// [`Compute::ColumnOf`] for a vector of shape `x`.
fn column_of(x: &[usize]) -> Option<Vec<Leaf>> {
    let (&n, rest) = x.split_last()?;
    rest.iter()
        .all(|&d| d == 1)
        .then(|| vec![shape_leaf(&[n, 1])])
}

/// A shape as an `Ints` attribute leaf.
fn shape_leaf(shape: &[usize]) -> Leaf {
    Leaf::Ints(shape.iter().map(|&d| d as i64).collect())
}

/// Slice attributes `(start, end, step)` that select `len` elements from `start` by `step`:
/// `end` is one past the last element, and an empty range is `0:0:1`.
fn bounds(start: usize, step: usize, len: usize) -> Option<(i64, i64, i64)> {
    if len == 0 {
        return Some((0, 0, 1));
    }
    let last = start.checked_add((len - 1).checked_mul(step)?)?;
    let step = if len == 1 { 1 } else { step };
    Some((
        i64::try_from(start).ok()?,
        i64::try_from(last.checked_add(1)?).ok()?,
        i64::try_from(step).ok()?,
    ))
}

/// Runs every computation of a rule on a match and returns `subst` extended with their
/// outputs (each leaf added to the e-graph), or `None` if one declines.
pub fn extend(computations: &[Compute], egraph: &mut FuseGraph, subst: &Subst) -> Option<Subst> {
    let mut out = subst.clone();
    for computation in computations {
        let leaves = computation.eval(egraph, &out)?;
        for ((arg, _), leaf) in computation.outputs().iter().zip(leaves) {
            let var: Var = arg.name.parse().ok()?;
            let id: Id = egraph.add(crate::egraph::ENode::Attr(leaf));
            out.insert(var, id);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egraph::TensorData;
    use crate::graph::TensorType;

    fn tensor(shape: &[usize]) -> ClassData {
        ClassData::Tensor(TensorData {
            ty: TensorType {
                dtype: crate::dtype::DType::F32,
                shape: shape.to_vec(),
            },
            constant: None,
            origin: crate::egraph::Origin::Run,
        })
    }

    fn run(c: &Compute, vars: &[(&str, ClassData)]) -> Option<Vec<Leaf>> {
        let lookup = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, d)| d);
        c.eval_with(&lookup)
    }

    fn s(v: &str) -> String {
        v.to_string()
    }

    fn int(v: i64) -> ClassData {
        ClassData::Attr(Leaf::int(v))
    }

    #[test]
    fn perms_compose_inner_then_outer() {
        let c = Compute::ComposePerm {
            into: s("?r"),
            x: s("?x"),
            inner: s("?p"),
            outer: s("?q"),
        };
        // x [2,3,4]; p = [1,2,0] gives [3,4,2]; q = [2,0,1] gives [2,3,4]: the identity.
        let out = run(
            &c,
            &[
                ("?x", tensor(&[2, 3, 4])),
                ("?p", ClassData::Attr(Leaf::Ints(vec![1, 2, 0]))),
                ("?q", ClassData::Attr(Leaf::Ints(vec![2, 0, 1]))),
            ],
        );
        assert_eq!(out, Some(vec![Leaf::Ints(vec![0, 1, 2])]));
        // Absent perms reverse; negative entries count from the end.
        let out = run(
            &c,
            &[
                ("?x", tensor(&[2, 3, 4])),
                ("?p", ClassData::Attr(Leaf::Absent)),
                ("?q", ClassData::Attr(Leaf::Ints(vec![0, -1, 1]))),
            ],
        );
        assert_eq!(out, Some(vec![Leaf::Ints(vec![2, 0, 1])]));
        // A perm of the wrong rank declines.
        let out = run(
            &c,
            &[
                ("?x", tensor(&[2, 3])),
                ("?p", ClassData::Attr(Leaf::Ints(vec![0, 1, 2]))),
                ("?q", ClassData::Attr(Leaf::Absent)),
            ],
        );
        assert_eq!(out, None);
    }

    #[test]
    fn slices_compose_with_steps_and_negative_bounds() {
        let c = Compute::ComposeSlices {
            into: vec![s("?s"), s("?e"), s("?k")],
            x: s("?x"),
            axis: s("?a"),
            inner: vec![s("?s1"), s("?e1"), s("?k1")],
            outer: vec![s("?s2"), s("?e2"), s("?k2")],
        };
        // x[1:-1:2] of length 10 picks 1,3,5,7; then [-3::2] of those picks 3,7.
        let out = run(
            &c,
            &[
                ("?x", tensor(&[10])),
                ("?a", int(0)),
                ("?s1", int(1)),
                ("?e1", int(-1)),
                ("?k1", int(2)),
                ("?s2", int(-3)),
                ("?e2", ClassData::Attr(Leaf::Absent)),
                ("?k2", int(2)),
            ],
        );
        assert_eq!(out, Some(vec![Leaf::int(3), Leaf::int(8), Leaf::int(4)]));
        // An empty outer slice composes to 0:0:1.
        let out = run(
            &c,
            &[
                ("?x", tensor(&[4, 5])),
                ("?a", int(-1)),
                ("?s1", int(0)),
                ("?e1", int(3)),
                ("?k1", int(1)),
                ("?s2", int(3)),
                ("?e2", int(1)),
                ("?k2", int(1)),
            ],
        );
        assert_eq!(out, Some(vec![Leaf::int(0), Leaf::int(0), Leaf::int(1)]));
    }

    #[test]
    fn reshape_operands_follow_the_axes_they_vary_along() {
        let c = Compute::ReshapeOperand {
            into: s("?s"),
            x: s("?x"),
            from: s("?p"),
            to: s("?t"),
        };
        let shape = |v: &[i64]| ClassData::Attr(Leaf::Ints(v.to_vec()));
        let go = |x: &[usize], p: &[usize], t: &[i64]| {
            run(
                &c,
                &[("?x", tensor(x)), ("?p", tensor(p)), ("?t", shape(t))],
            )
        };
        let ints = |v: &[i64]| Some(vec![Leaf::Ints(v.to_vec())]);
        // A per-channel scale of a convolution's [N, C, H, W] result, reshaped from the
        // product [N, C, H*W], is a per-row scale of the product.
        assert_eq!(go(&[4, 1, 1], &[2, 4, 15], &[2, 4, 3, 5]), ints(&[4, 1]));
        assert_eq!(
            go(&[1, 4, 1, 1], &[2, 4, 15], &[2, -1, 3, 5]),
            ints(&[4, 1])
        );
        // Varying over a whole merged group keeps its order: [3, 5] over [15].
        assert_eq!(go(&[3, 5], &[2, 4, 15], &[2, 4, 3, 5]), ints(&[15]));
        assert_eq!(go(&[4, 3, 5], &[2, 4, 15], &[2, 4, 3, 5]), ints(&[4, 15]));
        // Size-1 axes on either side, and a scalar.
        assert_eq!(go(&[4, 1], &[2, 1, 4, 1], &[2, 4, 1]), ints(&[4, 1]));
        assert_eq!(go(&[], &[6], &[2, 3]), ints(&[]));
        // One group of all axes: x over all of it is x reshaped, element for element.
        assert_eq!(go(&[2, 3], &[3, 2], &[2, 3]), ints(&[3, 2]));
        // Varying along part of a merged group cannot be said of the product: declines.
        assert_eq!(go(&[3, 1], &[2, 4, 15], &[2, 4, 3, 5]), None);
        assert_eq!(go(&[1, 3], &[3, 2], &[2, 3]), None);
        // x must broadcast to the result.
        assert_eq!(go(&[5, 1, 1], &[2, 4, 15], &[2, 4, 3, 5]), None);
    }

    #[test]
    fn a_vector_becomes_a_column() {
        let c = Compute::ColumnOf {
            into: s("?c"),
            x: s("?g"),
        };
        let go = |x: &[usize]| run(&c, &[("?g", tensor(x))]);
        assert_eq!(go(&[8]), Some(vec![Leaf::Ints(vec![8, 1])]));
        assert_eq!(go(&[1, 1, 8]), Some(vec![Leaf::Ints(vec![8, 1])]));
        assert_eq!(go(&[2, 8]), None);
        assert_eq!(go(&[]), None);
    }

    #[test]
    fn slice_of_concat_stays_inside_one_operand() {
        let c = |pick| Compute::SliceOfConcat {
            into: vec![s("?s2"), s("?e2")],
            operands: vec![s("?a"), s("?b")],
            pick,
            axis: s("?ax"),
            slice: vec![s("?s"), s("?e"), s("?k")],
        };
        let vars = |start: i64, end: i64, step: i64| {
            vec![
                ("?a", tensor(&[2, 3])),
                ("?b", tensor(&[2, 4])),
                ("?ax", int(1)),
                ("?s", int(start)),
                ("?e", int(end)),
                ("?k", int(step)),
            ]
        };
        // Columns 4 and 6 of the 7 are columns 1 and 3 of b.
        assert_eq!(
            run(&c(1), &vars(4, 7, 2)),
            Some(vec![Leaf::int(1), Leaf::int(4)])
        );
        assert_eq!(run(&c(0), &vars(4, 7, 2)), None);
        // Columns 0..3 are a's; 2..4 straddles.
        assert_eq!(
            run(&c(0), &vars(-7, -4, 1)),
            Some(vec![Leaf::int(0), Leaf::int(3)])
        );
        assert_eq!(run(&c(0), &vars(2, 4, 1)), None);
        assert_eq!(run(&c(1), &vars(2, 4, 1)), None);
    }
}
