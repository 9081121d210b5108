//! Automatic mixed precision policies, loaded from `rules/amp.ron`: which ops run in a 16-bit
//! float type, which stay in f32, and which promote their inputs to the widest input type.
//!
//! The lists follow MXNet's AMP lists (FP16_FUNCS, FP32_FUNCS, WIDEST_TYPE_CASTS,
//! CONDITIONAL_FP32_FUNCS) and PyTorch autocast's (lower_precision_fp, fp32, promote); the
//! embedded file says why each op is where it is. A policy is only data: the cast-insertion
//! pass that applies one is [`crate::amp`].

use super::ron_file::{self, RonDocument};
use super::{Builtin, Catalogue};
use crate::attr::{AttrValue, Attrs};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::span::Step;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// The embedded default policies.
pub const DEFAULT_AMP: &str = include_str!("../../rules/amp.ron");

/// How a policy treats one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Treatment {
    /// Runs in the policy's target type: f32 and other 16-bit float inputs are cast to it.
    LowPrecision,
    /// Runs in f32: f16 and bf16 inputs are cast up.
    Fp32,
    /// Every float input is cast to the widest float type among the op's inputs.
    Widest,
    /// Runs in whatever type its inputs arrive in.
    Follow,
}

/// An op that runs in f32 when attribute `attr` has one of `values` (MXNet's
/// CONDITIONAL_FP32_FUNCS, e.g. Activation with act_type=softrelu).
#[derive(Debug, Clone, PartialEq)]
pub struct Conditional {
    pub op: String,
    pub attr: String,
    /// Typed by the op's declaration of `attr`, so comparison with a node's resolved
    /// attribute is exact.
    pub values: Vec<AttrValue>,
}

/// One casting policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The key the policy has in `amp.ron` (`"f16"`, `"bf16"`, …).
    pub name: String,
    /// f16 or bf16.
    pub target: DType,
    pub low_precision: BTreeSet<String>,
    pub fp32: BTreeSet<String>,
    pub widest: BTreeSet<String>,
    pub conditional_fp32: Vec<Conditional>,
    /// Graph node names that run in exactly the types they had before AMP.
    pub exclude: BTreeSet<String>,
}

impl Policy {
    /// A policy with empty lists (every op follows), to be filled from Rust. Unlike
    /// [`AmpRules::load_str`] nothing is checked: the caller owns the op names.
    pub fn new(name: &str, target: DType) -> Policy {
        Policy {
            name: name.to_string(),
            target,
            low_precision: BTreeSet::new(),
            fp32: BTreeSet::new(),
            widest: BTreeSet::new(),
            conditional_fp32: Vec::new(),
            exclude: BTreeSet::new(),
        }
    }

    /// The treatment of `op` applied with `attrs` (resolved, defaults filled in): a matching
    /// conditional entry makes it f32, otherwise its list decides.
    pub fn treatment(&self, op: &str, attrs: &Attrs) -> Treatment {
        let conditional = self.conditional_fp32.iter().any(|c| {
            c.op == op
                && attrs
                    .get(&c.attr)
                    .is_some_and(|value| c.values.contains(value))
        });
        if conditional {
            Treatment::Fp32
        } else {
            self.list_treatment(op)
        }
    }

    /// The treatment the three lists give `op`, ignoring conditional entries.
    pub fn list_treatment(&self, op: &str) -> Treatment {
        if self.low_precision.contains(op) {
            Treatment::LowPrecision
        } else if self.fp32.contains(op) {
            Treatment::Fp32
        } else if self.widest.contains(op) {
            Treatment::Widest
        } else {
            Treatment::Follow
        }
    }
}

/// The policies of an `amp.ron`, by name.
#[derive(Debug, Clone, PartialEq)]
pub struct AmpRules {
    policies: BTreeMap<String, Policy>,
}

/// `amp.ron` as written.
#[derive(Debug, Deserialize)]
#[serde(rename = "Amp", deny_unknown_fields)]
struct AmpSpec {
    policies: BTreeMap<String, PolicySpec>,
}

/// One policy as written. The target is a string rather than a [`DType`] so that every wrong
/// target, `"f32"` or `"f8"`, gets the same located message.
#[derive(Debug, Deserialize)]
#[serde(rename = "Policy", deny_unknown_fields)]
struct PolicySpec {
    target: String,
    #[serde(default)]
    low_precision: Vec<String>,
    #[serde(default)]
    fp32: Vec<String>,
    #[serde(default)]
    widest: Vec<String>,
    #[serde(default)]
    conditional_fp32: Vec<ConditionalSpec>,
    #[serde(default)]
    exclude: Vec<String>,
}

/// Values are written bare, as in graph files, and typed by the op's attribute declaration.
#[derive(Debug, Deserialize)]
#[serde(rename = "Conditional", deny_unknown_fields)]
struct ConditionalSpec {
    op: String,
    attr: String,
    values: Vec<ron::Value>,
}

/// The three op lists, in the order their entries are checked.
const LISTS: [&str; 3] = ["low_precision", "fp32", "widest"];

impl Default for AmpRules {
    fn default() -> Self {
        AmpRules::defaults()
    }
}

impl AmpRules {
    /// The embedded `rules/amp.ron`, checked against the default catalogue.
    pub fn defaults() -> AmpRules {
        AmpRules::load_str(DEFAULT_AMP, "rules/amp.ron", &Catalogue::defaults())
            .expect("the embedded rules/amp.ron is checked by tests")
    }

    /// Parses an `amp.ron` document; it replaces the policies as a whole. Every op named must
    /// exist in `catalogue`, an op may be in at most one of the three lists, and every target
    /// must be f16 or bf16. Errors point at the offending value.
    pub fn load_str(text: &str, file: &str, catalogue: &Catalogue) -> Result<AmpRules> {
        let doc: RonDocument<AmpSpec> = ron_file::parse(text, file)?;
        let mut policies = BTreeMap::new();
        for (name, spec) in &doc.value.policies {
            let policy = check_policy(name, spec, &doc, catalogue)?;
            policies.insert(name.clone(), policy);
        }
        Ok(AmpRules { policies })
    }

    /// The policy called `name`; an unknown name is an error with a suggestion.
    pub fn policy(&self, name: &str) -> Result<&Policy> {
        self.policies.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.names().collect();
            Error::new(
                Site::default(),
                ErrorKind::Input(format!(
                    "no AMP policy `{name}`{}; amp.ron defines {}",
                    crate::error::hint(name, known.iter().copied()),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )),
            )
        })
    }

    /// Policy names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.policies.keys().map(String::as_str)
    }

    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.policies.values()
    }
}

/// One policy of the file being checked: where its errors point, and the ops it may name.
struct PolicySite<'a> {
    name: &'a str,
    doc: &'a RonDocument<AmpSpec>,
    catalogue: &'a Catalogue,
}

impl PolicySite<'_> {
    /// The site of `rest` inside the policy.
    fn at(&self, rest: &[Step]) -> Site {
        let base = [Step::field("policies"), Step::key(self.name)];
        let path: Vec<Step> = base.iter().cloned().chain(rest.iter().cloned()).collect();
        self.doc.site(&path)
    }

    /// A rule error about `op` at `site`.
    fn rule(&self, site: Site, op: &str, message: String) -> Error {
        let mut site = site;
        site.op = Some(op.to_string());
        Error::new(site, ErrorKind::Rule(message))
    }

    /// An error for `op`, which the catalogue lacks, at `site`.
    fn unknown_op(&self, site: Site, op: &str) -> Error {
        Error::new(
            site,
            ErrorKind::UnknownOp {
                op: op.to_string(),
                suggestion: crate::error::suggest(op, self.catalogue.names()),
            },
        )
    }
}

fn check_policy(
    name: &str,
    spec: &PolicySpec,
    doc: &RonDocument<AmpSpec>,
    catalogue: &Catalogue,
) -> Result<Policy> {
    let site = PolicySite {
        name,
        doc,
        catalogue,
    };
    let target = match DType::from_name(&spec.target) {
        Some(d @ (DType::F16 | DType::BF16)) => d,
        _ => {
            return Err(Error::new(
                site.at(&[Step::field("target")]),
                ErrorKind::Rule(format!(
                    "the `target` of AMP policy `{name}` must be \"f16\" or \"bf16\", found \"{}\"",
                    spec.target
                )),
            ));
        }
    };
    let mut policy = Policy::new(name, target);
    check_lists(&site, spec, &mut policy)?;
    check_conditionals(&site, spec, &mut policy)?;
    // Node names cannot be checked here: one policy serves many graphs.
    policy.exclude = spec.exclude.iter().cloned().collect();
    Ok(policy)
}

/// The three op lists (`low_precision`, `fp32`, `widest`) into `policy`: every op known, no
/// cast, and each op in at most one list, once.
fn check_lists(site: &PolicySite, spec: &PolicySpec, policy: &mut Policy) -> Result<()> {
    // Which list each op was first seen in, so a second listing names both.
    let mut listed: BTreeMap<&str, &str> = BTreeMap::new();
    for list in LISTS {
        let entries = match list {
            "low_precision" => &spec.low_precision,
            "fp32" => &spec.fp32,
            _ => &spec.widest,
        };
        for (index, op) in entries.iter().enumerate() {
            let at = site.at(&[Step::field(list), Step::Index(index)]);
            let Some(def) = site.catalogue.get(op) else {
                return Err(site.unknown_op(at, op));
            };
            if def.builtin() == Some(Builtin::Cast) {
                return Err(site.rule(
                    at,
                    op,
                    format!(
                        "casts are what AMP inserts and always produce their `dtype`: `{op}` cannot be listed"
                    ),
                ));
            }
            if let Some(first) = listed.insert(op, list) {
                let message = if first == list {
                    format!("listed twice in `{list}`")
                } else {
                    format!(
                        "listed in both `{first}` and `{list}`; an op has one treatment (use `conditional_fp32` for an attribute-dependent one)"
                    )
                };
                return Err(site.rule(at, op, message));
            }
            let set = match list {
                "low_precision" => &mut policy.low_precision,
                "fp32" => &mut policy.fp32,
                _ => &mut policy.widest,
            };
            set.insert(op.clone());
        }
    }
    Ok(())
}

/// The `conditional_fp32` entries into `policy`: each names a known op not already in
/// `fp32`, an attribute it declares (once per op), and values of that attribute's type.
fn check_conditionals(site: &PolicySite, spec: &PolicySpec, policy: &mut Policy) -> Result<()> {
    let mut conditions = BTreeSet::new();
    for (index, c) in spec.conditional_fp32.iter().enumerate() {
        let entry = [Step::field("conditional_fp32"), Step::Index(index)];
        let field = |f: &str| {
            let mut path = entry.to_vec();
            path.push(Step::field(f));
            site.at(&path)
        };
        let Some(op) = site.catalogue.get(&c.op) else {
            return Err(site.unknown_op(field("op"), &c.op));
        };
        if policy.fp32.contains(&c.op) {
            return Err(site.rule(
                field("op"),
                &c.op,
                "already listed in `fp32`, so it runs in f32 whatever its attributes".into(),
            ));
        }
        let Some(declared) = op.attr(&c.attr) else {
            return Err(Error::new(
                field("attr"),
                ErrorKind::UnknownAttr {
                    op: c.op.clone(),
                    attr: c.attr.clone(),
                    suggestion: crate::error::suggest(
                        &c.attr,
                        op.spec.attrs.iter().map(|a| a.name.as_str()),
                    ),
                },
            ));
        };
        if !conditions.insert((c.op.clone(), c.attr.clone())) {
            return Err(site.rule(
                field("op"),
                &c.op,
                format!(
                    "a second `conditional_fp32` entry for attribute `{}`: list every value in one entry",
                    c.attr
                ),
            ));
        }
        if c.values.is_empty() {
            return Err(site.rule(
                field("values"),
                &c.op,
                "`values` is empty, so the condition could never hold".into(),
            ));
        }
        let mut values = Vec::with_capacity(c.values.len());
        for (i, value) in c.values.iter().enumerate() {
            let mut path = entry.to_vec();
            path.extend([Step::field("values"), Step::Index(i)]);
            let typed = AttrValue::from_bare(value, declared.ty).map_err(|m| {
                Error::new(
                    site.at(&path),
                    ErrorKind::AttrType {
                        attr: c.attr.clone(),
                        expected: m.expected,
                        found: m.found,
                    },
                )
            })?;
            values.push(typed);
        }
        policy.conditional_fp32.push(Conditional {
            op: c.op.clone(),
            attr: c.attr.clone(),
            values,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<AmpRules> {
        AmpRules::load_str(text, "a.ron", &Catalogue::defaults())
    }

    #[test]
    fn embedded_policies() {
        let rules = AmpRules::defaults();
        assert_eq!(rules.names().collect::<Vec<_>>(), ["bf16", "f16"]);
        for (name, target) in [("f16", DType::F16), ("bf16", DType::BF16)] {
            let p = rules.policy(name).unwrap();
            assert_eq!(p.target, target);
            let none = Attrs::new();
            assert_eq!(p.treatment("matmul", &none), Treatment::LowPrecision);
            assert_eq!(p.treatment("exp", &none), Treatment::Fp32);
            assert_eq!(p.treatment("sum_to_size", &none), Treatment::Fp32);
            assert_eq!(p.treatment("add", &none), Treatment::Widest);
            assert_eq!(p.treatment("concat", &none), Treatment::Widest);
            assert_eq!(p.treatment("sqrt", &none), Treatment::Follow);
            assert_eq!(p.treatment("tanh", &none), Treatment::Follow);
        }
        // Both defaults share their lists.
        let (f16, bf16) = (rules.policy("f16").unwrap(), rules.policy("bf16").unwrap());
        assert_eq!(f16.low_precision, bf16.low_precision);
        assert_eq!(f16.fp32, bf16.fp32);
        assert_eq!(f16.widest, bf16.widest);
    }

    #[test]
    fn conditional_entries_are_typed_and_matched() {
        let rules = load(
            "Amp(policies: {\"p\": Policy(target: \"bf16\", low_precision: [\"matmul\"],\n  conditional_fp32: [Conditional(op: \"clamp\", attr: \"max\", values: [6, 1.5])])})",
        )
        .unwrap();
        let p = rules.policy("p").unwrap();
        let attrs = |max: f64| Attrs::from([("max".to_string(), AttrValue::Float(max))]);
        assert_eq!(p.treatment("clamp", &attrs(6.0)), Treatment::Fp32);
        assert_eq!(p.treatment("clamp", &attrs(1.5)), Treatment::Fp32);
        assert_eq!(p.treatment("clamp", &attrs(2.0)), Treatment::Follow);
    }

    #[test]
    fn located_errors() {
        let cases = [
            (
                "Amp(policies: {\"f16\": Policy(target: \"f16\",\n  fp32: [\"exp\", \"logg\"])})",
                "a.ron:2:17: unknown op `logg` (did you mean `log`?)",
            ),
            (
                "Amp(policies: {\"f16\": Policy(target: \"f32\")})",
                "a.ron:1:38: invalid rule: the `target` of AMP policy `f16` must be \"f16\" or \"bf16\", found \"f32\"",
            ),
            (
                "Amp(policies: {\"f16\": Policy(target: \"f16\",\n  fp32: [\"exp\"],\n  widest: [\"add\", \"exp\"])})",
                "a.ron:3:19: op `exp`: invalid rule: listed in both `fp32` and `widest`; an op has one treatment (use `conditional_fp32` for an attribute-dependent one)",
            ),
            (
                "Amp(policies: {\"f16\": Policy(target: \"f16\", conditional_fp32: [\n  Conditional(op: \"clamp\", attr: \"maximum\", values: [1])])})",
                "a.ron:2:34: op `clamp` has no attribute `maximum` (did you mean `max`?)",
            ),
            (
                "Amp(policies: {\"f16\": Policy(target: \"f16\", conditional_fp32: [\n  Conditional(op: \"clamp\", attr: \"max\", values: [true])])})",
                "a.ron:2:50: attribute `max` must be a number, found `true`",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(load(text).unwrap_err().to_string(), expected);
        }
        let err = load("Amp(policies: {}, lists: [])").unwrap_err();
        assert!(err.to_string().contains("RON syntax"), "{err}");
    }

    #[test]
    fn unknown_policy_suggests() {
        let err = AmpRules::defaults().policy("fp16").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid input: no AMP policy `fp16` (did you mean `f16`?); amp.ron defines bf16, f16"
        );
    }
}
