//! Fusion legality, loaded from `rules/fusion.ron`: what may share a kernel.
//!
//! Legality only says what *may* fuse; whether a legal fusion happens is decided by the cost
//! model in the partitioner ([`crate::partition`]). Every op gets a [`Role`] from its kind,
//! unless `ops` names it. The roles are TVM's FuseOps pattern kinds reduced to what the
//! partitioner needs; in the terms of MXNet's subgraph selector they are `select`,
//! `select_input` and `select_output`, and the budgets with convexity and the one iteration
//! domain are its `filter` (see [`Role`] and [`FusionRules`]).
//!
//! Roles are checked when the file is loaded against what the kernel lowering can generate: a
//! role that would put an op into a kernel the lowering cannot emit is an error at its
//! position, not a failure at run time.

use super::ron_file::{self, RonDocument};
use super::{Builtin, Catalogue, OpDef, OpKind};
use crate::error::{Error, ErrorKind, Result, Site};
use crate::span::Step;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// The embedded default rules.
pub const DEFAULT_FUSION: &str = include_str!("../../rules/fusion.ron");

/// How an op may take part in a kernel.
///
/// As an MXNet subgraph selector: `select` (may start a group) holds for `Join` and `End`;
/// `select_input` grows a group from a `Join` or `End` member into a `Join` producer;
/// `select_output` grows it from a `Join` member into a `Join` or `End` user. So a `Join` node
/// starts groups and grows them both ways, an `End` node joins its producers and ends its group
/// (nothing grows out of it), an `Alone` node is a group of one, and a `Never` node is never
/// selected at all: it is a library call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Anywhere in a kernel; its value may be consumed inside the kernel. Its iteration domain
    /// is its output shape.
    Join,
    /// May join its producers' kernel, but nothing in the same kernel consumes its result, and
    /// the kernel's iteration domain is fixed to the node's input shape. Reductions: their
    /// result is complete only once the whole domain has been visited.
    End,
    /// A reduction that is `End`, except when it reduces the innermost axis of its input and
    /// nothing else (a *row* reduction: softmax's max and sum, layernorm's mean and variance).
    /// Then ops iterating over the same rows may consume its result inside its kernel: the
    /// kernel's domain is the reduction's input shape, and it makes one pass over each row per
    /// level of reductions, the earlier passes computing the reductions the later ones read.
    /// Every reduction in such a kernel must be a row reduction over the same domain.
    /// Reductions over outer axes (column sums, `sum_to_size` to `[1, N]`) stay `End`.
    Rows,
    /// A kernel of its own (a copy) that nothing joins. Every op but an opaque one may be
    /// `Alone`.
    Alone,
    /// An opaque library call (matmul).
    Never,
}

/// Why an op cannot take a role: the kernels fusebox generates could not hold it so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    #[error(
        "an opaque op is a library call with no loop body to fuse: its role must be `Never`, not `{0:?}`"
    )]
    OpaqueNotNever(Role),
    #[error(
        "`Never` marks a library call and only opaque ops are library calls; a {0:?} op that must not fuse is `Alone`"
    )]
    NeverNotOpaque(OpKind),
    #[error(
        "a reduction's result is complete only after its whole domain is visited, so nothing in its kernel can consume it: its role is `End`, `Rows` or `Alone`, not `Join`"
    )]
    ReductionJoins,
    #[error(
        "`Rows` lets a reduction's result be consumed along the rows it reduced; a {0:?} op reduces nothing, so it cannot be `Rows`"
    )]
    RowsWithoutReduction(OpKind),
    #[error(
        "a layout op reduces nothing, so it cannot end a kernel: broadcast_to, reshape, transpose and slice may be `Join` (a kernel reads them through views), concat `Join` (a kernel reads it by ranges), or any of them `Alone` (a copy of their own)"
    )]
    LayoutEnds,
    /// A layout op no kernel reads through a view or by ranges (`what` names it).
    #[error(
        "a kernel reads broadcast_to, reshape, transpose and slice through views and concat by ranges, and no other layout op, so {what} cannot share a kernel: give it `Alone`, not `{role:?}`"
    )]
    LayoutNotShared { what: String, role: Role },
}

impl Role {
    /// Whether an op of `kind` can take this role, and why not. [`Role::check_op`] also asks
    /// whether the lowering can generate the op inside a kernel.
    pub fn check(self, kind: OpKind) -> std::result::Result<(), RoleError> {
        match (kind, self) {
            (OpKind::Opaque, Role::Never) => Ok(()),
            (OpKind::Opaque, _) => Err(RoleError::OpaqueNotNever(self)),
            (_, Role::Never) => Err(RoleError::NeverNotOpaque(kind)),
            (OpKind::Reduction, Role::Join) => Err(RoleError::ReductionJoins),
            (OpKind::Pointwise | OpKind::Layout, Role::Rows) => {
                Err(RoleError::RowsWithoutReduction(kind))
            }
            (OpKind::Layout, Role::End) => Err(RoleError::LayoutEnds),
            _ => Ok(()),
        }
    }

    /// Whether `op` can take this role: [`Role::check`] for its kind, and whether the kernel
    /// lowering can generate it inside a kernel. A broadcast is computed in place (a consumer
    /// reads the smaller operand at the broadcast index). Reshape, transpose and slice re-index
    /// one operand, so a kernel reads them as a view of that operand's buffer: `Join` makes
    /// them such views (their operand comes from memory, never from their own kernel). A
    /// gather as `Join` leads its kernel ([`Role::leads`]); a scatter is `Alone`. Concat
    /// has several operands in disjoint ranges and no single view: `Join` makes it a *range
    /// select* (each point of its kernel evaluates the operand whose segment holds it, see
    /// [`Role::is_select`]), `Alone` a copy per operand.
    pub fn check_op(self, op: &OpDef) -> std::result::Result<(), RoleError> {
        self.check(op.kind())?;
        match (op.kind(), op.builtin(), self) {
            (
                OpKind::Layout,
                Some(Builtin::BroadcastTo | Builtin::Reshape | Builtin::Transpose | Builtin::Slice),
                _,
            ) => Ok(()),
            (OpKind::Layout, Some(Builtin::Concat), Role::Join | Role::Alone) => Ok(()),
            // A gather as `Join` leads its kernel ([`Role::leads`]).
            (
                OpKind::Layout,
                Some(Builtin::Gather | Builtin::GatherElements),
                Role::Join | Role::Alone,
            ) => Ok(()),
            (OpKind::Layout, builtin, Role::Join | Role::End) => {
                let what = match builtin {
                    Some(b) if b.name() != op.name() => format!("`{}` (a {})", op.name(), b.name()),
                    _ => format!("`{}`", op.name()),
                };
                Err(RoleError::LayoutNotShared { what, role: self })
            }
            _ => Ok(()),
        }
    }

    /// Whether a node of `op` in this role joins kernels as a view of its operand's buffer
    /// (reshape, transpose, slice as `Join`): its operand is read from memory through strides
    /// that re-index it, so that operand is never computed in the same kernel.
    pub fn is_view(self, op: &OpDef) -> bool {
        self == Role::Join
            && op.kind() == OpKind::Layout
            && matches!(
                op.builtin(),
                Some(Builtin::Reshape | Builtin::Transpose | Builtin::Slice)
            )
    }

    /// Whether a node of `op` in this role *leads* its kernel (gather and gather_elements as
    /// `Join`): it joins none of its producers' kernels, since its data and indices are read
    /// from memory (the data at run-time positions, which no kernel computing it could hand
    /// over), but the pointwise ops and reductions that consume it may join its kernel, which
    /// reads the gathered value as a load at a computed index instead of writing it.
    pub fn leads(self, op: &OpDef) -> bool {
        self == Role::Join
            && op.kind() == OpKind::Layout
            && matches!(
                op.builtin(),
                Some(Builtin::Gather | Builtin::GatherElements)
            )
    }

    /// Whether a node of `op` in this role joins kernels as a *range select* (concat as
    /// `Join`): its kernel evaluates each operand over that operand's segment of the concat's
    /// axis and picks, at each point, the one whose segment holds it. Its operands may come
    /// from memory or be computed in the same kernel (then over their segment only, and only
    /// for the concat: they write nothing).
    pub fn is_select(self, op: &OpDef) -> bool {
        self == Role::Join && op.kind() == OpKind::Layout && op.builtin() == Some(Builtin::Concat)
    }

    /// The role that suits every op of `kind`: used when a role from the file no longer suits
    /// an op (it was redefined after the rules were checked).
    fn safe(kind: OpKind) -> Role {
        match kind {
            OpKind::Opaque => Role::Never,
            _ => Role::Alone,
        }
    }
}

/// The arithmetic a row kernel's reductions and divisions may use (`row_arithmetic` in
/// `fusion.ron`): the accuracy a user trades for speed is a rule, not a property of one
/// backend. The kernel IR carries it on every row kernel (`KernelIr::row_arithmetic`), and
/// its module documentation, "Precision of row kernels", states what each form promises.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RowArithmetic {
    /// The freedoms that keep a row's arithmetic under its memory traffic: float sums in f32
    /// blocks joined in f64, a division by a row constant as a multiplication by its
    /// reciprocal rounded once per row, and an `exp` within 2.5 ulp instead of 1.05, each
    /// within the bound the IR states. The default: the error stays far inside f32's tolerance and the
    /// kernels stay at the memory floor.
    #[default]
    Relaxed,
    /// What the reference evaluator computes: float sums accumulated in f64 and rounded once,
    /// every division correctly rounded, the pointwise kernels' `exp`. For users who compare
    /// row kernels' results bit for bit with another f64-accumulating implementation.
    Exact,
}

const KINDS: [OpKind; 4] = [
    OpKind::Pointwise,
    OpKind::Layout,
    OpKind::Reduction,
    OpKind::Opaque,
];

fn kind_index(kind: OpKind) -> usize {
    match kind {
        OpKind::Pointwise => 0,
        OpKind::Layout => 1,
        OpKind::Reduction => 2,
        OpKind::Opaque => 3,
    }
}

/// The fusion rules: a role per op kind, per-op overrides, the kernel budgets, and whether
/// independent kernels may share a launch.
///
/// In MXNet's subgraph-selector terms the roles ([`Role`]) are `select`, `select_input` and
/// `select_output`, and the `filter` a grown group must pass is: at most `max_kernel_args`
/// inputs + outputs, at most `max_kernel_ops` ops, convex (no path leaves the group and comes
/// back, or no order could run the kernels), and one iteration domain every member broadcasts
/// to (a kernel is one loop nest). The cost model then decides which legal groups to form.
#[derive(Debug, Clone, PartialEq)]
pub struct FusionRules {
    kinds: [Role; 4],
    ops: BTreeMap<String, Role>,
    /// At most this many kernel inputs + outputs (literals are not arguments).
    pub max_kernel_args: usize,
    /// At most this many ops in a fused kernel (literals are not counted), at least 1. All of
    /// a kernel's ops become one generated loop body; huge bodies cost compile time out of
    /// proportion (C compilers' register allocation and scheduling grow faster than linearly
    /// in a function's size) and spill registers, so long chains are cut into several kernels.
    pub max_kernel_ops: usize,
    /// At most this many formula terms in a fused kernel's loop body, summed over its ops
    /// ([`OpDef::body_terms`]), at least 1. The op budget cannot see how big each op is: one op
    /// whose formula has thousands of terms, chained a few times, would make a function that a C
    /// compiler takes minutes over. A single op always runs, in a kernel of its own, however
    /// large its formula (the formula parser bounds that).
    pub max_kernel_terms: usize,
    /// Sibling (horizontal) fusion: two fusable kernels with no path between them may become
    /// one multi-output kernel, which reads their shared inputs once and launches once. Off,
    /// a node only ever joins the kernels of its producers.
    pub siblings: bool,
    /// Library calls convert their operands while packing them: a `cast` whose every user is
    /// a library call (`Never`), and which is not a graph output, runs inside that call's
    /// kernel instead of as a kernel of its own. The call reads the cast's operand at the
    /// operand's dtype; the cast costs no launch and no bytes. A GEMM copies operand panels
    /// into a packed layout anyway, so converting on the way is free on CPUs; a backend that
    /// runs these partitions must convert while packing too.
    pub library_casts: bool,
    /// Library calls read their operands through strides: a layout op that is a view (a
    /// transpose, a slice, a broadcast, a reshape strides can express) whose every user is a
    /// library call, and which is not a graph output, runs inside that call's kernel instead
    /// of as a copy. The call reads the view's source buffer through the view's strides (a
    /// transposed weight as a transposed operand), so no copy of the operand is made; a
    /// backend that runs these partitions must read strided operands.
    pub library_views: bool,
    /// Library calls run an epilogue: the fused kernel of pointwise ops that alone reads a
    /// call's product (a bias, an activation, a residual add, a cast of the result) runs on
    /// each finished tile of the product inside the call, so the product is never written
    /// and read back. A backend that runs these partitions must run the epilogue on the
    /// product, fused or after it.
    pub library_epilogues: bool,
    /// The arithmetic row kernels may use: relaxed (f32 block sums, one reciprocal per row, a
    /// cheaper `exp`) or exact (f64 sums, correctly rounded division, the pointwise `exp`).
    /// See [`RowArithmetic`].
    pub row_arithmetic: RowArithmetic,
}

/// `fusion.ron` as written.
#[derive(Debug, Deserialize)]
#[serde(rename = "Fusion", deny_unknown_fields)]
struct FusionSpec {
    kinds: HashMap<OpKind, Role>,
    #[serde(default)]
    ops: BTreeMap<String, Role>,
    max_kernel_args: usize,
    /// 128 unless the file says otherwise, so files written before the setting existed load.
    #[serde(default = "default_max_kernel_ops")]
    max_kernel_ops: usize,
    /// 4096 unless the file says otherwise, so files written before the setting existed load.
    #[serde(default = "default_max_kernel_terms")]
    max_kernel_terms: usize,
    /// On unless the file says otherwise: files written before the setting existed keep
    /// loading, and get the cheaper partitions.
    #[serde(default = "yes")]
    siblings: bool,
    /// Off unless the file says so: it promises something of the backend (that its library
    /// calls convert operands while packing them), which a file written before the setting
    /// existed never promised.
    #[serde(default)]
    library_casts: bool,
    /// Off unless the file says so, like `library_casts`: it promises that the backend's
    /// library calls read strided operands.
    #[serde(default)]
    library_views: bool,
    /// Off unless the file says so, like `library_casts`: it promises that the backend's
    /// library calls run epilogues.
    #[serde(default)]
    library_epilogues: bool,
    /// `Relaxed` unless the file says otherwise, so files written before the setting existed
    /// keep the row kernels they had.
    #[serde(default)]
    row_arithmetic: RowArithmetic,
}

fn yes() -> bool {
    true
}

/// `max_kernel_ops` when a file leaves it out: the embedded file's value.
const DEFAULT_MAX_KERNEL_OPS: usize = 128;

fn default_max_kernel_ops() -> usize {
    DEFAULT_MAX_KERNEL_OPS
}

/// `max_kernel_terms` when a file leaves it out: the embedded file's value.
const DEFAULT_MAX_KERNEL_TERMS: usize = 4096;

fn default_max_kernel_terms() -> usize {
    DEFAULT_MAX_KERNEL_TERMS
}

impl Default for FusionRules {
    fn default() -> Self {
        FusionRules::defaults()
    }
}

impl FusionRules {
    /// The embedded `rules/fusion.ron`, checked against the default catalogue.
    pub fn defaults() -> FusionRules {
        FusionRules::load_str(DEFAULT_FUSION, "rules/fusion.ron", &Catalogue::defaults())
            .expect("the embedded rules/fusion.ron is checked by tests")
    }

    /// Parses a `fusion.ron` document. It replaces the rules as a whole: every kind must have a
    /// role, every op named in `ops` must exist in `catalogue`, every op of `catalogue` must
    /// admit the role it gets ([`Role::check_op`]), and the budgets must be positive. Errors
    /// point at the offending value.
    pub fn load_str(text: &str, file: &str, catalogue: &Catalogue) -> Result<FusionRules> {
        let doc: RonDocument<FusionSpec> = ron_file::parse(text, file)?;
        let spec = &doc.value;
        let mut kinds = [Role::Never; 4];
        for kind in KINDS {
            let path = [Step::field("kinds"), Step::key(&format!("{kind:?}"))];
            let Some(&role) = spec.kinds.get(&kind) else {
                return Err(Error::new(
                    doc.site(&[Step::field("kinds")]),
                    ErrorKind::Rule(format!(
                        "`kinds` must give a role to every op kind; {kind:?} has none"
                    )),
                ));
            };
            role.check(kind)
                .map_err(|m| Error::new(doc.site(&path), ErrorKind::Rule(m.to_string())))?;
            // The ops that get this role from their kind must admit it too.
            for name in catalogue.names() {
                let Some(op) = catalogue.get(name) else {
                    continue;
                };
                // A gather, which only `Alone` suits, takes `Alone` whatever its kind's role
                // ([`FusionRules::role`]): rule files written before gathers stay valid.
                let gathers = op.builtin().is_some_and(Builtin::reads_at_run_time);
                if op.kind() != kind || spec.ops.contains_key(name) || gathers {
                    continue;
                }
                role.check_op(op).map_err(|m| {
                    Error::new(
                        doc.site(&path),
                        ErrorKind::Rule(format!(
                            "`{kind:?}: {role:?}` gives `{name}` that role, as `ops` does not name it; {m}"
                        )),
                    )
                })?;
            }
            kinds[kind_index(kind)] = role;
        }
        for (name, &role) in &spec.ops {
            let path = [Step::field("ops"), Step::key(name)];
            let Some(op) = catalogue.get(name) else {
                let position = doc
                    .spans
                    .key_position(&path)
                    .unwrap_or_else(|| doc.spans.nearest(&path));
                return Err(Error::new(
                    Site::file(file, position),
                    ErrorKind::UnknownOp {
                        op: name.clone(),
                        suggestion: crate::error::suggest(name, catalogue.names()),
                    },
                ));
            };
            role.check_op(op).map_err(|m| {
                let mut site = doc.site(&path);
                site.op = Some(name.clone());
                Error::new(site, ErrorKind::Rule(m.to_string()))
            })?;
        }
        if spec.max_kernel_args < 2 {
            return Err(Error::new(
                doc.site(&[Step::field("max_kernel_args")]),
                ErrorKind::Rule(format!(
                    "`max_kernel_args` must be at least 2 (one input and one output), found {}",
                    spec.max_kernel_args
                )),
            ));
        }
        if spec.max_kernel_ops < 1 {
            return Err(Error::new(
                doc.site(&[Step::field("max_kernel_ops")]),
                ErrorKind::Rule(format!(
                    "`max_kernel_ops` must be at least 1 (1 turns fusion off), found {}",
                    spec.max_kernel_ops
                )),
            ));
        }
        if spec.max_kernel_terms < 1 {
            return Err(Error::new(
                doc.site(&[Step::field("max_kernel_terms")]),
                ErrorKind::Rule(format!(
                    "`max_kernel_terms` must be at least 1 (an op of one term, such as a reduction, must fit), found {}",
                    spec.max_kernel_terms
                )),
            ));
        }
        Ok(FusionRules {
            kinds,
            ops: spec.ops.clone(),
            max_kernel_args: spec.max_kernel_args,
            max_kernel_ops: spec.max_kernel_ops,
            max_kernel_terms: spec.max_kernel_terms,
            siblings: spec.siblings,
            library_casts: spec.library_casts,
            library_views: spec.library_views,
            library_epilogues: spec.library_epilogues,
            row_arithmetic: spec.row_arithmetic,
        })
    }

    /// The role of `op`: its entry in `ops`, else its kind's. A role that does not suit the op
    /// (it was defined or redefined after the rules were checked) falls back to the kind's
    /// role, and where that does not suit it either, to `Alone` (`Never` for an opaque op), so
    /// the partitioner never sees a role the lowering cannot generate.
    pub fn role(&self, op: &OpDef) -> Role {
        let by_kind = self.kind_role(op.kind());
        let chosen = match self.ops.get(op.name()) {
            Some(&role) if role.check_op(op).is_ok() => role,
            _ => by_kind,
        };
        if chosen.check_op(op).is_ok() {
            chosen
        } else {
            Role::safe(op.kind())
        }
    }

    /// The role an op of `kind` gets unless `ops` names it (a gather, which only `Alone`
    /// suits, gets `Alone` whatever its kind's role: [`FusionRules::role`]).
    pub fn kind_role(&self, kind: OpKind) -> Role {
        self.kinds[kind_index(kind)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_rules() {
        let rules = FusionRules::defaults();
        let ops = Catalogue::defaults();
        let role = |name: &str| rules.role(ops.get(name).unwrap());
        assert_eq!(role("sigmoid"), Role::Join);
        assert_eq!(role("broadcast_to"), Role::Join);
        assert_eq!(role("transpose"), Role::Join);
        assert!(Role::Join.is_view(ops.get("transpose").unwrap()));
        assert_eq!(role("concat"), Role::Join);
        assert!(Role::Join.is_select(ops.get("concat").unwrap()));
        assert!(!Role::Alone.is_select(ops.get("concat").unwrap()));
        assert!(!Role::Join.is_select(ops.get("slice").unwrap()));
        assert_eq!(role("sum_to_size"), Role::Rows);
        assert_eq!(role("mean"), Role::Rows);
        assert_eq!(role("matmul"), Role::Never);
        // Only reductions can be `Rows`.
        assert!(Role::Rows.check(OpKind::Pointwise).is_err());
        assert!(Role::Rows.check(OpKind::Layout).is_err());
        assert!(Role::Rows.check(OpKind::Reduction).is_ok());
        assert_eq!(rules.max_kernel_args, 64);
        assert_eq!(rules.max_kernel_ops, 128);
        assert_eq!(rules.max_kernel_terms, 4096);
        assert!(rules.siblings);
        assert!(rules.library_casts);
        assert_eq!(rules.row_arithmetic, RowArithmetic::Relaxed);
    }

    /// `row_arithmetic` is optional (`Relaxed` by default), can ask for `Exact`, and a value
    /// that is not one of the two is an error at its position naming both.
    #[test]
    fn row_arithmetic_setting() {
        let kinds = "kinds: {Pointwise: Join, Layout: Alone, Reduction: Rows, Opaque: Never}";
        let rules = load(&format!("Fusion({kinds}, max_kernel_args: 8)")).unwrap();
        assert_eq!(rules.row_arithmetic, RowArithmetic::Relaxed);
        let rules = load(&format!(
            "Fusion({kinds}, max_kernel_args: 8, row_arithmetic: Exact)"
        ))
        .unwrap();
        assert_eq!(rules.row_arithmetic, RowArithmetic::Exact);
        for bad in ["Fast", "\"Exact\"", "true"] {
            let err = load(&format!(
                "Fusion({kinds},\n  max_kernel_args: 8,\n  row_arithmetic: {bad})"
            ))
            .unwrap_err();
            let shown = err.to_string();
            assert!(shown.starts_with("f.ron:3:"), "{bad}: {shown}");
        }
        let err = load(&format!(
            "Fusion({kinds},\n  max_kernel_args: 8,\n  row_arithmetic: Fast)"
        ))
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("Relaxed") && shown.contains("Exact"),
            "{shown}"
        );
    }

    /// `library_casts` is optional (off by default: it is a promise about the backend), can
    /// be turned on, and a value of the wrong type is an error at its position.
    #[test]
    fn library_casts_setting() {
        let kinds = "kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}";
        let rules = load(&format!("Fusion({kinds}, max_kernel_args: 8)")).unwrap();
        assert!(!rules.library_casts);
        let rules = load(&format!(
            "Fusion({kinds}, max_kernel_args: 8, library_casts: true)"
        ))
        .unwrap();
        assert!(rules.library_casts);
        let err = load(&format!(
            "Fusion({kinds},\n  max_kernel_args: 8,\n  library_casts: 1)"
        ))
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("f.ron:3:") && shown.contains("boolean"),
            "{shown}"
        );
    }

    /// `siblings` is optional (on by default), can be turned off, and a value of the wrong
    /// type is an error at its position.
    #[test]
    fn siblings_setting() {
        let kinds = "kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}";
        let rules = load(&format!("Fusion({kinds}, max_kernel_args: 8)")).unwrap();
        assert!(rules.siblings);
        let rules = load(&format!(
            "Fusion({kinds}, max_kernel_args: 8, siblings: false)"
        ))
        .unwrap();
        assert!(!rules.siblings);
        let err = load(&format!(
            "Fusion({kinds},\n  max_kernel_args: 8,\n  siblings: \"no\")"
        ))
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("f.ron:3:") && shown.contains("boolean"),
            "{shown}"
        );
    }

    fn load(text: &str) -> Result<FusionRules> {
        FusionRules::load_str(text, "f.ron", &Catalogue::defaults())
    }

    #[test]
    fn unknown_op_is_located_with_a_suggestion() {
        let err = load(
            "Fusion(\n  kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never},\n  ops: {\"broadcst_to\": Join},\n  max_kernel_args: 8,\n)",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.ron:3:9: unknown op `broadcst_to` (did you mean `broadcast_to`?)"
        );
    }

    #[test]
    fn roles_must_suit_kinds() {
        let err = load(
            "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: Join, Opaque: Never}, max_kernel_args: 8)",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("f.ron:1:59: invalid rule: a reduction's result"),
            "{err}"
        );
        let err = load(
            "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}, ops: {\"matmul\": Join}, max_kernel_args: 8)",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("f.ron:1:96: op `matmul`: invalid rule: an opaque op"),
            "{err}"
        );
        let err = load(
            "Fusion(kinds: {Pointwise: Join, Layout: Alone, Opaque: Never}, max_kernel_args: 8)",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.ron:1:15: invalid rule: `kinds` must give a role to every op kind; Reduction has none"
        );
        let err = load(
            "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}, max_kernel_args: 1)",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("f.ron:1:97: invalid rule: `max_kernel_args`"),
            "{err}"
        );
        let err = load("Fusion(kinds: {}, max_kernel_args: 8, budget: 3)").unwrap_err();
        assert!(err.to_string().contains("RON syntax"), "{err}");
    }
}
