//! Loading rule files: RON in, validated [`Rule`]s out, every problem located.

use super::compute::Compute;
use super::condition::Condition;
use super::pattern::{self, Checked, PatternError, describe_kind};
use super::{REVERSE_SUFFIX, Rule, VarKind};
use crate::attr::AttrType;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::rules::Catalogue;
use crate::rules::ron_file::{self, RonDocument};
use crate::shape;
use crate::span::Step;
use egg::{Pattern, Var};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// One rule exactly as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "Rule", deny_unknown_fields)]
struct RuleSpec {
    name: String,
    lhs: String,
    rhs: String,
    #[serde(default)]
    when: Vec<Condition>,
    #[serde(default)]
    compute: Vec<Compute>,
    #[serde(default)]
    bidirectional: bool,
    #[serde(default = "first_phase")]
    phase: u32,
    #[serde(default)]
    finite_only: bool,
    #[serde(default)]
    doc: String,
}

fn first_phase() -> u32 {
    1
}

/// Parses and validates one rule file (a RON list of `Rule(...)`), against `catalogue`.
/// Errors name `file` with the line and column of the offending value, or of the offending
/// character inside a pattern string. Rule names must be unique within the file; across
/// files see [`super::check_unique`].
pub fn load_rules(text: &str, file: &str, catalogue: &Catalogue) -> Result<Vec<Rule>> {
    let doc: RonDocument<Vec<RuleSpec>> = ron_file::parse(text, file)?;
    let mut rules = Vec::with_capacity(doc.value.len());
    for (index, spec) in doc.value.iter().enumerate() {
        rules.push(validate(&doc, index, spec, catalogue)?);
    }
    super::check_unique(&rules)?;
    Ok(rules)
}

fn rule_error(site: Site, message: String) -> Error {
    Error::new(site, ErrorKind::Rule(message))
}

fn validate(
    doc: &RonDocument<Vec<RuleSpec>>,
    index: usize,
    spec: &RuleSpec,
    catalogue: &Catalogue,
) -> Result<Rule> {
    let at = |field: &str| doc.site(&[Step::Index(index), Step::field(field)]);
    let name = spec.name.trim();
    if name.is_empty() || name != spec.name {
        return Err(rule_error(
            at("name"),
            "a rule needs a name without leading or trailing spaces".into(),
        ));
    }
    if name.ends_with(REVERSE_SUFFIX) {
        return Err(rule_error(
            at("name"),
            format!(
                "rule names may not end in `{REVERSE_SUFFIX}`: that names the reverse direction \
                 of a bidirectional rule"
            ),
        ));
    }
    if spec.phase == 0 {
        return Err(rule_error(
            at("phase"),
            "phase must be 1 or more (phase 1 runs first; phase k runs every rule of phase ≤ k)"
                .into(),
        ));
    }
    let pattern_at = |field: &str, e: PatternError| -> Error {
        let site = doc.site_in_string(&[Step::Index(index), Step::field(field)], e.offset);
        match e.unknown_op {
            Some((op, suggestion)) => Error::new(site, ErrorKind::UnknownOp { op, suggestion }),
            None => rule_error(site, e.message),
        }
    };
    let lhs = pattern::check(&spec.lhs, catalogue).map_err(|e| pattern_at("lhs", e))?;
    let rhs = pattern::check(&spec.rhs, catalogue).map_err(|e| pattern_at("rhs", e))?;
    if lhs.bare_var {
        return Err(pattern_at(
            "lhs",
            PatternError {
                offset: 0,
                message: "the left-hand side must be an op pattern: a bare variable would match \
                          every class"
                    .into(),
                unknown_op: None,
            },
        ));
    }
    let vars: BTreeMap<Var, VarKind> = lhs.vars.iter().map(|(v, u)| (*v, u.kind)).collect();
    if spec.bidirectional && !spec.compute.is_empty() {
        return Err(rule_error(
            at("compute"),
            "a rule that computes attributes cannot be bidirectional: its reverse direction \
             would have to recover the matched attributes from the computed ones"
                .into(),
        ));
    }
    let computed = check_computations(doc, index, &spec.compute, &vars)?;
    check_rhs_vars(&lhs, &rhs, &computed).map_err(|e| pattern_at("rhs", e))?;
    if spec.bidirectional {
        check_reversible(&lhs, &rhs).map_err(|e| pattern_at("rhs", e))?;
    }
    for (var, (site, _)) in &computed {
        if !rhs.vars.contains_key(var) {
            return Err(rule_error(
                site.clone(),
                format!(
                    "`{var}` is computed but the right-hand side never uses it: compute only \
                     what the rewrite builds"
                ),
            ));
        }
    }
    for (j, condition) in spec.when.iter().enumerate() {
        let path = vec![Step::Index(index), Step::field("when"), Step::Index(j)];
        check_condition(doc, &path, condition, &vars)?;
    }
    Ok(Rule {
        name: spec.name.clone(),
        lhs: Pattern::new(lhs.ast),
        rhs: Pattern::new(rhs.ast),
        when: spec.when.clone(),
        compute: spec.compute.clone(),
        computed: computed.iter().map(|(v, (_, ty))| (*v, *ty)).collect(),
        bidirectional: spec.bidirectional,
        phase: spec.phase,
        finite_only: spec.finite_only,
        doc: spec.doc.clone(),
        vars,
        file: doc.file.clone(),
        position: doc
            .spans
            .nearest(&[Step::Index(index), Step::field("name")]),
    })
}

/// Checks a rule's computations against the left-hand side's variables and returns the
/// variables they bind, each with where it is written and the attribute type it gets. An
/// input may be a left-hand variable or an earlier computation's output.
fn check_computations(
    doc: &RonDocument<Vec<RuleSpec>>,
    index: usize,
    computations: &[Compute],
    vars: &BTreeMap<Var, VarKind>,
) -> Result<BTreeMap<Var, (Site, AttrType)>> {
    let mut computed: BTreeMap<Var, (Site, AttrType)> = BTreeMap::new();
    for (j, computation) in computations.iter().enumerate() {
        let base = vec![Step::Index(index), Step::field("compute"), Step::Index(j)];
        let field_site = |field: &str, item: Option<usize>| {
            let mut path = base.clone();
            path.push(Step::field(field));
            if let Some(i) = item {
                path.push(Step::Index(i));
            }
            doc.site(&path)
        };
        let what = computation.name();
        for (field, wanted, got) in computation.list_lengths() {
            if wanted != got {
                return Err(rule_error(
                    field_site(field, None),
                    format!("`{field}` of `{what}` lists {wanted} variables, not {got}"),
                ));
            }
        }
        if let Some((field, message)) = computation.invalid() {
            return Err(rule_error(field_site(field, None), message));
        }
        let parse = |name: &str, site: Site| -> Result<Var> {
            name.parse::<Var>().map_err(|_| {
                rule_error(
                    site,
                    format!(
                        "`{what}` takes pattern variables, written with `?` (`\"?x\"`), not \
                         `{name}`"
                    ),
                )
            })
        };
        for (arg, reads) in computation.inputs() {
            let site = field_site(arg.field, arg.index);
            let var = parse(arg.name, site.clone())?;
            let kind = match (vars.get(&var), computed.get(&var)) {
                (Some(kind), _) => *kind,
                (None, Some((_, ty))) => VarKind::Attr(*ty),
                (None, None) => {
                    let names: Vec<String> = vars.keys().map(|v| v.to_string()).collect();
                    return Err(rule_error(
                        site,
                        format!(
                            "`{}` in `{what}` is not bound by the left-hand side{}",
                            arg.name,
                            crate::error::hint(arg.name, names.iter().map(String::as_str))
                        ),
                    ));
                }
            };
            if !reads.admits(kind) {
                return Err(rule_error(
                    site,
                    format!(
                        "`{what}` reads {} as `{}`, but `{}` is {}",
                        reads.describe(),
                        arg.field,
                        arg.name,
                        describe_kind(kind)
                    ),
                ));
            }
        }
        for (arg, ty) in computation.outputs() {
            let site = field_site(arg.field, arg.index);
            let var = parse(arg.name, site.clone())?;
            if vars.contains_key(&var) || computed.contains_key(&var) {
                return Err(rule_error(
                    site,
                    format!(
                        "`{}` is already bound: `{what}` must bind a fresh variable",
                        arg.name
                    ),
                ));
            }
            computed.insert(var, (site, ty));
        }
    }
    Ok(computed)
}

/// Every right-hand variable is bound by the left-hand side, as the same kind, or computed,
/// as an attribute of the type its computation produces.
fn check_rhs_vars(
    lhs: &Checked,
    rhs: &Checked,
    computed: &BTreeMap<Var, (Site, AttrType)>,
) -> std::result::Result<(), PatternError> {
    for (var, used) in &rhs.vars {
        if let Some((_, ty)) = computed.get(var) {
            if used.kind != VarKind::Attr(*ty) {
                return Err(PatternError {
                    offset: used.offset,
                    message: format!(
                        "`{var}` is computed as {} but fills {} here, which must be {}",
                        describe_kind(VarKind::Attr(*ty)),
                        used.role,
                        match used.kind {
                            VarKind::Tensor => "a tensor".to_string(),
                            VarKind::Attr(t) => t.to_string(),
                        }
                    ),
                    unknown_op: None,
                });
            }
            continue;
        }
        let Some(bound) = lhs.vars.get(var) else {
            return Err(PatternError {
                offset: used.offset,
                message: format!(
                    "`{var}` is not bound by the left-hand side, so the rewrite could not build \
                     it{}",
                    crate::error::hint(
                        &var.to_string(),
                        lhs.vars
                            .keys()
                            .map(|v| v.to_string())
                            .collect::<Vec<_>>()
                            .iter()
                            .map(String::as_str)
                    )
                ),
                unknown_op: None,
            });
        };
        if bound.kind != used.kind {
            return Err(PatternError {
                offset: used.offset,
                message: format!(
                    "`{var}` is {} here ({}) but {} in the left-hand side ({})",
                    describe_kind(used.kind),
                    used.role,
                    describe_kind(bound.kind),
                    bound.role
                ),
                unknown_op: None,
            });
        }
    }
    Ok(())
}

/// A bidirectional rule's reverse direction searches for the right-hand side and builds the
/// left-hand side: it must be an op pattern and bind every variable.
fn check_reversible(lhs: &Checked, rhs: &Checked) -> std::result::Result<(), PatternError> {
    if rhs.bare_var {
        return Err(PatternError {
            offset: 0,
            message: "a bidirectional rule needs an op pattern on the right-hand side too: its \
                      reverse direction would match every class"
                .into(),
            unknown_op: None,
        });
    }
    let mut missing: Vec<String> = lhs
        .vars
        .keys()
        .filter(|v| !rhs.vars.contains_key(v))
        .map(|v| format!("`{v}`"))
        .collect();
    missing.sort();
    if !missing.is_empty() {
        return Err(PatternError {
            offset: 0,
            message: format!(
                "a bidirectional rule's right-hand side must bind every variable of the \
                 left-hand side, but it does not bind {}: the reverse direction could not build \
                 the left-hand side",
                missing.join(", ")
            ),
            unknown_op: None,
        });
    }
    Ok(())
}

fn check_condition(
    doc: &RonDocument<Vec<RuleSpec>>,
    path: &[Step],
    condition: &Condition,
    vars: &BTreeMap<Var, VarKind>,
) -> Result<()> {
    if let Condition::Not(inner) = condition {
        let mut inner_path = path.to_vec();
        inner_path.push(Step::Index(0));
        return check_condition(doc, &inner_path, inner, vars);
    }
    if let Condition::Any(inner) = condition {
        for (k, c) in inner.iter().enumerate() {
            let mut inner_path = path.to_vec();
            inner_path.extend([Step::Index(0), Step::Index(k)]);
            check_condition(doc, &inner_path, c, vars)?;
        }
        return Ok(());
    }
    // `check-rules` builds a shape of this rank for the variable; past the graph limit no
    // graph could match and a huge rank would allocate without bound.
    if let Condition::Rank(_, n) = condition
        && *n > shape::MAX_RANK
    {
        let mut rank_path = path.to_vec();
        rank_path.push(Step::Index(1));
        return Err(rule_error(
            doc.site(&rank_path),
            format!(
                "`Rank` {n} is more than {}, the most axes a shape may have",
                shape::MAX_RANK
            ),
        ));
    }
    for (position, name, accepts) in condition.var_args() {
        let mut arg_path = path.to_vec();
        arg_path.push(Step::Index(position));
        let site = || doc.site(&arg_path);
        let Ok(var) = name.parse::<Var>() else {
            return Err(rule_error(
                site(),
                format!(
                    "`{}` takes pattern variables, written with `?` (`\"?x\"`), not `{name}`",
                    condition.name()
                ),
            ));
        };
        let Some(kind) = vars.get(&var) else {
            let names: Vec<String> = vars.keys().map(|v| v.to_string()).collect();
            return Err(rule_error(
                site(),
                format!(
                    "`{name}` in `{}` is not bound by the left-hand side{}",
                    condition.name(),
                    crate::error::hint(name, names.iter().map(String::as_str))
                ),
            ));
        };
        if !accepts.admits(*kind) {
            return Err(rule_error(
                site(),
                format!(
                    "`{}` needs {} here, but `{name}` is {}",
                    condition.name(),
                    accepts.describe(),
                    describe_kind(*kind)
                ),
            ));
        }
    }
    Ok(())
}

/// Rule names are unique across every file of a rule set (and no name collides with the
/// reverse direction of a bidirectional rule): reports and `check-rules` name rules by them.
pub fn check_unique(rules: &[Rule]) -> Result<()> {
    let mut seen: HashMap<String, &Rule> = HashMap::new();
    for rule in rules {
        let mut names = vec![rule.name.clone()];
        if rule.bidirectional {
            names.push(rule.reverse_name());
        }
        for name in names {
            if let Some(first) = seen.get(&name) {
                return Err(rule_error(
                    rule.site(),
                    format!(
                        "duplicate rule name `{}` (first defined at {})",
                        rule.name,
                        first.site()
                    ),
                ));
            }
            seen.insert(name, rule);
        }
    }
    Ok(())
}
