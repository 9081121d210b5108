//! Rewrite rules as data: `rules/rewrites/*.ron`, loaded, validated, and applied by egg with a
//! type-checking applier.
//!
//! A rule file is one RON list:
//!
//! ```ron
//! [
//!     Rule(
//!         name: "mul-one",
//!         lhs: "(mul ?x (const 1 ?t))",
//!         rhs: "?x",
//!         when: [KeepsType("?x")],
//!         bidirectional: false,   // optional, default false
//!         phase: 1,               // optional, default 1
//!         doc: "x * 1 = x exactly, NaN, ±Inf and -0.0 included; only when the product \
//!               neither promotes nor broadcasts x.",
//!     ),
//! ]
//! ```
//!
//! Patterns are egg s-expressions over [`ENode`]: an op's children are its operands followed
//! by one child per declared attribute, in `ops.ron` order (`(cast ?x f16)`,
//! `(sum ?x [0] false)`, `(const 1 f32)`). Variables start with `?`; one that stands in an
//! attribute position binds the attribute. Everything is checked at load against the op
//! catalogue, and every error carries the file, line and column (inside a pattern, of the
//! offending character). Conditions come from the closed vocabulary of [`Condition`], and
//! attributes the right-hand side needs but the match does not hold (a composed permutation)
//! from the closed vocabulary of [`Compute`], listed under an optional `compute:` field.
//!
//! Rules are applied through [`Rule::rewrites`], whose applier type-checks each right-hand
//! side before adding it (see [`apply`]): a rule that would prove a value of one type equal to
//! one of another type is reported as unsound instead of corrupting the e-graph.
//!
//! ```
//! use fusebox::rewrite::load_rules;
//! use fusebox::rules::Catalogue;
//!
//! let text = r#"[Rule(name: "neg-neg", lhs: "(neg (neg ?x))", rhs: "?x", when: [IsFloat("?x")])]"#;
//! let rules = load_rules(text, "mine.ron", &Catalogue::defaults()).unwrap();
//! assert_eq!(rules[0].rewrites().len(), 1);
//!
//! let bad = r#"[Rule(name: "oops", lhs: "(neg (cast ?x))", rhs: "?x")]"#;
//! let e = load_rules(bad, "mine.ron", &Catalogue::defaults()).unwrap_err();
//! assert_eq!(
//!     e.to_string(),
//!     "mine.ron:1:33: invalid rule: `cast` takes (x, dtype), got 1 child: every attribute is \
//!      written out, in order, after the operands"
//! );
//! ```

pub mod apply;
pub mod compute;
pub mod condition;
pub mod pattern;
pub mod rule;
pub mod soundness;

pub use compute::Compute;
pub use condition::Condition;
pub use rule::{check_unique, load_rules};

use crate::attr::AttrType;
use crate::egraph::{ENode, FuseGraph, TypeAnalysis};
use crate::error::{Result, Site};
use crate::rules::Catalogue;
use crate::span::Position;
use egg::{Id, Pattern, Rewrite, Subst, Var};
use std::collections::BTreeMap;

/// What a pattern variable stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarKind {
    /// A tensor-valued class (an operand position).
    Tensor,
    /// An attribute leaf of this type (an attribute position).
    Attr(AttrType),
}

/// The name egg gives the reverse direction of a bidirectional rule is the rule's name with
/// this suffix.
pub const REVERSE_SUFFIX: &str = " (reverse)";

/// One validated rewrite rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    pub lhs: Pattern<ENode>,
    pub rhs: Pattern<ENode>,
    pub when: Vec<Condition>,
    /// Attributes the right-hand side needs that the match does not hold, computed from it
    /// (see [`compute`]); never bidirectional.
    pub compute: Vec<Compute>,
    /// The variables `compute` binds, with the attribute type of each.
    pub computed: BTreeMap<Var, AttrType>,
    pub bidirectional: bool,
    /// The runner's phase k applies every rule of phase ≤ k.
    pub phase: u32,
    /// The rule is exact in real arithmetic for finite values but not under IEEE infinities
    /// and NaN: the linearity rules of sum_to_size factor a value `b` out of a sum, and
    /// `sum(x) * inf` is `inf` where `sum(x * inf)` is NaN once some `x` is 0. Such rules are
    /// what a fuser needs (PyTorch's LSTM fuser hoists sum_to_size the same way); marking them
    /// keeps the claim honest: `check-rules` tests them on finite values and says so.
    pub finite_only: bool,
    pub doc: String,
    /// Every variable of the left-hand side and what it stands for (the right-hand side's
    /// variables are a subset, of the same kinds: checked at load).
    pub vars: BTreeMap<Var, VarKind>,
    /// The file the rule came from, for messages.
    pub file: String,
    /// Where its name is in that file.
    pub position: Position,
}

impl Rule {
    /// Where the rule is defined.
    pub fn site(&self) -> Site {
        Site::file(&self.file, self.position)
    }

    /// The ops the rule's patterns name, on either side.
    pub fn ops(&self) -> impl Iterator<Item = &str> {
        self.lhs
            .ast
            .as_ref()
            .iter()
            .chain(self.rhs.ast.as_ref())
            .filter_map(|node| match node {
                egg::ENodeOrVar::ENode(n) => n.op_name(),
                egg::ENodeOrVar::Var(_) => None,
            })
    }

    /// The name of the reverse direction of a bidirectional rule.
    pub fn reverse_name(&self) -> String {
        format!("{}{REVERSE_SUFFIX}", self.name)
    }

    /// Whether every condition holds for this match (root = matched e-class).
    pub fn conditions_hold(&self, egraph: &FuseGraph, root: Id, subst: &Subst) -> bool {
        self.when.iter().all(|c| c.holds(egraph, root, subst))
    }

    /// `subst` extended with the computed attributes of this match (each leaf added to the
    /// e-graph), or `None` when a computation declines it.
    pub fn compute_attrs(&self, egraph: &mut FuseGraph, subst: &Subst) -> Option<Subst> {
        compute::extend(&self.compute, egraph, subst)
    }

    /// egg rewrites with the checked applier: one, or two if bidirectional (the reverse named
    /// `"NAME (reverse)"`, searching for the right-hand side and building the left-hand side,
    /// under the same conditions evaluated on its own match).
    pub fn rewrites(&self) -> Vec<Rewrite<ENode, TypeAnalysis>> {
        let mut out = vec![self.rewrite(&self.name, &self.lhs, &self.rhs)];
        if self.bidirectional {
            out.push(self.rewrite(&self.reverse_name(), &self.rhs, &self.lhs));
        }
        out
    }

    fn rewrite(
        &self,
        name: &str,
        search: &Pattern<ENode>,
        build: &Pattern<ENode>,
    ) -> Rewrite<ENode, TypeAnalysis> {
        let applier = apply::CheckedApplier {
            rule: self.name.clone(),
            direction: name.to_string(),
            when: self.when.clone(),
            compute: self.compute.clone(),
            build: build.ast.clone(),
        };
        // The applier declares no variables (it checks bindings itself), so egg has nothing to
        // refuse here.
        Rewrite::new(name, search.clone(), applier).expect("a checked applier binds nothing")
    }
}

/// The default rule files, by file name, as embedded in the binary. A user's rule directory
/// replaces a file of the same name (`rewrites/casts.ron`) and adds any others.
pub const DEFAULT_RULE_FILES: [(&str, &str); 7] = [
    (
        "algebra.ron",
        include_str!("../../rules/rewrites/algebra.ron"),
    ),
    ("casts.ron", include_str!("../../rules/rewrites/casts.ron")),
    (
        "sum_to_size.ron",
        include_str!("../../rules/rewrites/sum_to_size.ron"),
    ),
    (
        "broadcast.ron",
        include_str!("../../rules/rewrites/broadcast.ron"),
    ),
    (
        "layout.ron",
        include_str!("../../rules/rewrites/layout.ron"),
    ),
    (
        "matmul.ron",
        include_str!("../../rules/rewrites/matmul.ron"),
    ),
    (
        "normalization.ron",
        include_str!("../../rules/rewrites/normalization.ron"),
    ),
];

/// The embedded default rules, validated against `catalogue`.
///
/// # Panics
///
/// If they do not fit `catalogue`, which cannot happen for [`Catalogue::defaults`] (a test
/// loads them). With a catalogue a user changed, use [`load_rule_set`], which reports the
/// problem instead.
pub fn default_rules(catalogue: &Catalogue) -> Vec<Rule> {
    load_rule_set(catalogue, &[]).expect("the embedded rules/rewrites/*.ron fit the catalogue")
}

/// The default rule files with `user` files laid over them, loaded against `catalogue` and
/// checked for duplicate names across all files. Each user file is `(file name, text, path to
/// show in messages)`; one named like a default file (`casts.ron`) replaces it. Defaults come
/// first in their fixed order, then the user's other files in the order given.
pub fn load_rule_set(
    catalogue: &Catalogue,
    user: &[(String, String, String)],
) -> Result<Vec<Rule>> {
    let mut files: Vec<(String, String, String)> = DEFAULT_RULE_FILES
        .iter()
        .map(|(name, text)| {
            (
                name.to_string(),
                text.to_string(),
                format!("rules/rewrites/{name}"),
            )
        })
        .collect();
    for (name, text, path) in user {
        match files.iter_mut().find(|(n, _, _)| n == name) {
            Some(slot) => *slot = (name.clone(), text.clone(), path.clone()),
            None => files.push((name.clone(), text.clone(), path.clone())),
        }
    }
    let mut rules = Vec::new();
    for (_, text, path) in &files {
        rules.extend(load_rules(text, path, catalogue)?);
    }
    check_unique(&rules)?;
    Ok(rules)
}
