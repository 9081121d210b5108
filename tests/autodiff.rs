//! Automatic differentiation: the default gradient templates against finite differences,
//! planted wrong templates caught, and gradients of whole graphs against central differences
//! of the reference evaluator in f64.

use fusebox::autodiff::verify::{Probe, agreement, check_templates, in_f64};
use fusebox::autodiff::{Wrt, grad};
use fusebox::dtype::DType;
use fusebox::graph::GraphBuilder;
use fusebox::rules::{GradientRules, RuleSet};

#[test]
fn every_default_gradient_template_agrees_with_finite_differences() {
    let rules = RuleSet::defaults();
    let report = check_templates(&rules.ops, &rules.gradients);
    for check in &report.instances {
        println!("{}: {:?}", check.instance, check.outcome);
    }
    assert!(report.unused.is_empty(), "unused templates: {:?}", report.unused);
    assert!(report.passed());
    assert!(report.instances.len() >= 25);
}
