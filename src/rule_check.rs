//! Everything `check-rules` verifies about a rule set, as data: the rewrite rules' soundness on
//! random instances, the gradient templates and the derivative formulas against finite
//! differences, and the composites' gradients through their parts. The CLI only prints what
//! [`RuleSetCheck::run`] returns (as text or JSON), so every verdict is computed once, here,
//! and a program can ask for the same checks without parsing the command's output.

use crate::autodiff::verify::{DerivativeCheck, TemplateReport};
use crate::dtype::DType;
use crate::eval::Tensors;
use crate::graph::GraphBuilder;
use crate::graph::expand::expand;
use crate::rewrite::soundness::{self, CheckOptions};
use crate::rules::RuleSet;
use crate::tensor::Tensor;

/// What `check-rules` found for a rule set: one part per kind of rule it verifies.
pub struct RuleSetCheck {
    /// The rewrite rules on random instances against the reference evaluator.
    pub rewrites: soundness::Report,
    /// The gradient templates against finite differences.
    pub templates: TemplateReport,
    /// The derivative formulas of pointwise ops against central differences of their formulas.
    pub derivatives: Vec<DerivativeCheck>,
    /// The composite ops' gradients through their parts against finite differences.
    pub composites: Vec<CompositeCheck>,
    /// The gradient rule file the templates came from, which failures name.
    pub gradients_file: String,
}

impl RuleSetCheck {
    /// Runs every check on `set`: `instances` random instances per rewrite rule and direction,
    /// all drawn from `seed` (the derivative points too), so a run can be repeated exactly.
    pub fn run(set: &RuleSet, seed: u64, instances: usize) -> RuleSetCheck {
        let options = CheckOptions {
            seed,
            instances,
            ..CheckOptions::default()
        };
        RuleSetCheck {
            rewrites: soundness::check_rules(&set.rewrites, &set.ops, &options),
            templates: crate::autodiff::verify::check_templates(&set.ops, &set.gradients),
            derivatives: crate::autodiff::verify::check_derivatives(&set.ops, seed),
            composites: check_composites(set),
            gradients_file: set.gradients.file.clone(),
        }
    }

    /// One sentence per kind of failure, empty when every check passed. Every kind is named,
    /// not only the first: a wrong derivative also makes the composites built on it wrong, and
    /// a reader fixing one should see both.
    pub fn failures(&self) -> Vec<String> {
        let wrong_composites: Vec<String> = self
            .composites
            .iter()
            .filter(|c| c.is_wrong())
            .map(|c| format!("`{}`", c.name))
            .collect();
        let wrong_derivatives: Vec<String> = self
            .derivatives
            .iter()
            .filter(|c| !c.passed())
            .map(|c| format!("`{}` (operand `{}`)", c.op, c.operand))
            .collect();
        let mut failures: Vec<String> = Vec::new();
        let unsound: Vec<String> = self
            .rewrites
            .unsound_rules()
            .into_iter()
            .map(|(file, rule)| format!("`{rule}` ({file})"))
            .collect();
        if !unsound.is_empty() {
            let noun = if unsound.len() == 1 { "rule" } else { "rules" };
            failures.push(format!(
                "{} unsound rewrite {noun}: {}",
                unsound.len(),
                unsound.join(", ")
            ));
        }
        if !self.templates.passed() {
            failures.push(format!(
                "gradient templates of {} disagree with finite differences or are unchecked",
                self.gradients_file
            ));
        }
        if !wrong_derivatives.is_empty() {
            failures.push(format!(
                "the derivatives of op(s) {} disagree with finite differences of their formulas or are unchecked",
                wrong_derivatives.join(", ")
            ));
        }
        if !wrong_composites.is_empty() {
            failures.push(format!(
                "the gradients of composite op(s) {} disagree with finite differences",
                wrong_composites.join(", ")
            ));
        }
        failures
    }
}

/// The largest relative disagreement between the gradient through a composite's parts and
/// central differences, in f64, on values away from the kinks at 0.
pub const COMPOSITE_TOLERANCE: f64 = 1e-6;

/// What `check-rules` found for one composite op.
#[derive(Debug, Clone, PartialEq)]
pub struct CompositeCheck {
    /// The composite op.
    pub name: String,
    /// Its gradient's agreement with finite differences, or why it was not checked.
    pub outcome: CompositeOutcome,
}

/// A composite's gradient compared with finite differences, or why it could not be.
#[derive(Debug, Clone, PartialEq)]
pub enum CompositeOutcome {
    /// The worst relative error of its gradient against central differences.
    Gradient(f64),
    /// Not checked, and why: its body does not apply to the probe (f64 operands of shape
    /// [2, 3]), or a part has no derivative.
    Unchecked(String),
}

impl CompositeCheck {
    /// Whether its gradient was checked and disagrees beyond [`COMPOSITE_TOLERANCE`] (an
    /// unchecked composite is reported, not failed).
    pub fn is_wrong(&self) -> bool {
        matches!(self.outcome, CompositeOutcome::Gradient(e) if e > COMPOSITE_TOLERANCE)
    }
}

/// Every composite of the catalogue, applied to f64 operands of shape [2, 3] with its default
/// attributes, expanded, and differentiated through its parts; the gradient is compared
/// element by element with central differences. The values are ±[0.5, 1.5], so both sides of
/// every kink at 0 are visited but no kink itself. A wrong gradient means a part's derivative
/// or template is wrong; the parts are what fusion and `grad` use.
pub fn check_composites(set: &RuleSet) -> Vec<CompositeCheck> {
    use crate::autodiff::verify::{Probe, agreement_at};
    let mut checks = Vec::new();
    for (k, composite) in set.ops.composites().enumerate() {
        let mut builder = GraphBuilder::new(&format!("check_{}", composite.name()));
        let args: Vec<String> = (0..composite.spec.operands.len())
            .map(|i| builder.input(&format!("x{i}"), DType::F64, &[2, 3]))
            .collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let y = builder.op_with("y", composite.name(), &refs, &[]);
        let graph = builder.finish(&[&y]);
        let outcome = expand(&graph, &set.ops)
            .and_then(|expanded| {
                let mut inputs = Tensors::new();
                for (i, name) in args.iter().enumerate() {
                    let values = (0..6)
                        .map(|j| {
                            let magnitude = 0.5 + ((i * 7 + j * 5 + k) % 11) as f64 / 10.0;
                            if (i + j) % 2 == 0 {
                                magnitude
                            } else {
                                -magnitude
                            }
                        })
                        .collect();
                    let tensor = Tensor::from_values(DType::F64, &[2, 3], values)
                        .expect("six values for [2, 3]");
                    inputs.insert(name.clone(), tensor);
                }
                agreement_at(
                    &expanded,
                    &set.ops,
                    &set.gradients,
                    Probe::Elementwise,
                    k as u64,
                    &inputs,
                )
            })
            .map(|(_, agreement)| {
                if agreement.singular > 0 {
                    CompositeOutcome::Gradient(f64::INFINITY)
                } else {
                    CompositeOutcome::Gradient(agreement.worst)
                }
            })
            .unwrap_or_else(|e| CompositeOutcome::Unchecked(e.kind.to_string()));
        checks.push(CompositeCheck {
            name: composite.name().to_string(),
            outcome,
        });
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_rules_pass_and_a_wrong_composite_is_named() {
        let set = RuleSet::defaults();
        let mut check = RuleSetCheck::run(&set, 1, 4);
        assert!(check.failures().is_empty(), "{:?}", check.failures());
        assert!(!check.composites.is_empty() && !check.derivatives.is_empty());
        let first = &mut check.composites[0];
        first.outcome = CompositeOutcome::Gradient(1.0);
        let name = first.name.clone();
        assert!(check.composites[0].is_wrong());
        assert_eq!(
            check.failures(),
            [format!(
                "the gradients of composite op(s) `{name}` disagree with finite differences"
            )]
        );
    }
}
