//! Gradients against finite differences: the check behind `fusebox check-rules` for the
//! templates of `gradients.ron`, and the oracle the autodiff tests use on whole graphs.
//!
//! A graph is differentiated, then evaluated in f64 by the reference evaluator with a random
//! cotangent `u` for each output; the gradient of `L(x) = sum(u * f(x))` is compared with the
//! central difference `(L(x + h v) - L(x - h v)) / 2h`, either along every input element
//! (`v` a unit vector: every gradient element is checked) or along random directions (for
//! graphs too large to perturb element by element).

use super::{JointGraph, Wrt, grad};
use crate::attr::AttrValue;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::eval::{Tensors, evaluate};
use crate::graph::{Graph, GraphBuilder};
use crate::rules::{Catalogue, GradientRules};
use crate::tensor::Tensor;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeSet;

/// How the inputs are perturbed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Probe {
    /// One input element at a time: every gradient element is compared.
    Elementwise,
    /// This many random directions over all inputs at once.
    Directions(usize),
}

/// The worst disagreement found, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    /// max |analytic - numeric| / (1 + |numeric|).
    pub worst: f64,
    /// The input (and element, for [`Probe::Elementwise`]) where it occurred.
    pub at: String,
    /// Probes where the analytic gradient is not finite although the function is: points
    /// where a derivative is infinite (`sqrt` at 0) and the chain rule multiplies it by zero,
    /// which gives NaN here as in every reverse-mode framework. They are counted, not
    /// compared.
    pub singular: usize,
}

/// The relative step of the central difference: small enough for curvature to be negligible
/// in f64, large enough that rounding is.
const STEP: f64 = 1e-6;

/// `graph` with every floating-point dtype (inputs, `dtype` attributes) made f64, so that
/// finite differences are meaningful.
pub fn in_f64(graph: &Graph) -> Graph {
    let mut wide = graph.clone();
    for input in &mut wide.inputs {
        if input.dtype.is_float() {
            input.dtype = DType::F64;
        }
    }
    for node in &mut wide.nodes {
        for value in node.attrs.values_mut() {
            if let AttrValue::DType(d) = value
                && d.is_float()
            {
                *d = DType::F64;
            }
        }
    }
    wide
}

/// Differentiates `graph` (which should be f64: see [`in_f64`]) with respect to every float
/// input and compares the gradients with central differences of the reference evaluator on
/// seeded random inputs in [-1, 1] (away from zero's kinks only by chance).
pub fn agreement(
    graph: &Graph,
    catalogue: &Catalogue,
    templates: &GradientRules,
    probe: Probe,
    seed: u64,
) -> Result<(JointGraph, Agreement)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let inputs: Tensors = graph
        .inputs
        .iter()
        .map(|i| (i.name.clone(), random(&mut rng, i.dtype, &i.shape)))
        .collect();
    agreement_at(graph, catalogue, templates, probe, seed, &inputs)
}

/// Uniform in [-1, 1] for floats, small integers otherwise (bools are rounded to 0 or 1).
fn random(rng: &mut rand::rngs::StdRng, dtype: DType, shape: &[usize]) -> Tensor {
    let values = (0..crate::shape::numel(shape))
        .map(|_| match dtype.is_float() {
            true => rng.random_range(-1.0..=1.0),
            false => f64::from(rng.random_range(-3i32..=3)),
        })
        .collect();
    Tensor::from_values(dtype, shape, values).expect("value count matches the shape")
}

/// [`agreement`] at given input values (for graphs whose inputs have a domain, such as a
/// variance that must be positive); cotangents and directions are still seeded random.
pub fn agreement_at(
    graph: &Graph,
    catalogue: &Catalogue,
    templates: &GradientRules,
    probe: Probe,
    seed: u64,
    inputs: &Tensors,
) -> Result<(JointGraph, Agreement)> {
    let joint = grad(graph, catalogue, templates, &Wrt::AllFloatInputs)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xc07a);
    let mut random = |dtype: DType, shape: &[usize]| random(&mut rng, dtype, shape);
    let inputs = inputs.clone();
    let mut joint_inputs = inputs.clone();
    let outputs = evaluate(graph, catalogue, &inputs)?;
    let mut weights = Tensors::new();
    for (output, cotangent) in &joint.cotangents {
        let value = &outputs[output];
        let u = random(value.dtype, value.shape());
        joint_inputs.insert(cotangent.clone(), u.clone());
        weights.insert(output.clone(), u);
    }
    let results = evaluate(&joint.graph, catalogue, &joint_inputs)?;
    let loss = |inputs: &Tensors| -> Result<f64> {
        let values = evaluate(graph, catalogue, inputs)?;
        Ok(weights
            .iter()
            .map(|(output, u)| {
                u.values()
                    .iter()
                    .zip(values[output].values())
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            })
            .sum())
    };
    let perturbed = |direction: &[(String, Vec<f64>)], sign: f64| -> Tensors {
        let mut moved = inputs.clone();
        for (name, v) in direction {
            let t = &inputs[name];
            let values = t
                .values()
                .iter()
                .zip(v)
                .map(|(x, d)| x + sign * STEP * d)
                .collect();
            moved.insert(
                name.clone(),
                Tensor::from_values(t.dtype, t.shape(), values).expect("same shape"),
            );
        }
        moved
    };
    let numeric = |direction: &[(String, Vec<f64>)]| -> Result<f64> {
        Ok((loss(&perturbed(direction, 1.0))? - loss(&perturbed(direction, -1.0))?) / (2.0 * STEP))
    };
    let gradient = |input: &str| -> Vec<f64> {
        let (_, name) = joint
            .gradients
            .iter()
            .find(|(i, _)| i == input)
            .expect("every float input is differentiated");
        results[name].values()
    };
    let mut worst = Agreement {
        worst: 0.0,
        at: String::new(),
        singular: 0,
    };
    let mut record = |analytic: f64, numeric: f64, at: String| {
        if !analytic.is_finite() && numeric.is_finite() {
            worst.singular += 1;
            return;
        }
        let error = (analytic - numeric).abs() / (1.0 + numeric.abs());
        if error.is_nan() || error > worst.worst {
            worst.worst = error;
            worst.at = at;
        }
    };
    match probe {
        Probe::Elementwise => {
            for (input, _) in &joint.gradients {
                let analytic = gradient(input);
                let n = analytic.len();
                for (j, a) in analytic.iter().enumerate() {
                    let mut unit = vec![0.0; n];
                    unit[j] = 1.0;
                    let fd = numeric(&[(input.clone(), unit)])?;
                    record(*a, fd, format!("`{input}` element {j}"));
                }
            }
        }
        Probe::Directions(count) => {
            let mut direction_rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
            for k in 0..count {
                let mut direction = Vec::new();
                let mut analytic = 0.0;
                for (input, _) in &joint.gradients {
                    let g = gradient(input);
                    let v: Vec<f64> = (0..g.len())
                        .map(|_| direction_rng.random_range(-1.0..=1.0))
                        .collect();
                    analytic += g.iter().zip(&v).map(|(a, b)| a * b).sum::<f64>();
                    direction.push((input.clone(), v));
                }
                let fd = numeric(&direction)?;
                record(analytic, fd, format!("direction {k}"));
            }
        }
    }
    Ok((joint, worst))
}

/// The outcome of one `checks` instance of a `gradients.ron`.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceCheck {
    /// How the instance reads in the report: `sum [[3, 4]] {axes: [1]}`.
    pub instance: String,
    /// The worst relative disagreement, or why the instance could not be differentiated.
    pub outcome: std::result::Result<f64, Error>,
}

/// Every instance checked, and the templates no instance used.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateReport {
    pub instances: Vec<InstanceCheck>,
    /// `(op, operand, rule index)` of templates that no instance exercised.
    pub unused: Vec<(String, String, usize)>,
    pub tolerance: f64,
}

impl TemplateReport {
    pub fn passed(&self) -> bool {
        self.unused.is_empty()
            && self
                .instances
                .iter()
                .all(|c| matches!(c.outcome, Ok(e) if e <= self.tolerance))
    }
}

/// The largest relative disagreement a template may show on its checks. Templates build
/// linear maps (or piecewise linear ones away from ties), so in f64 the central difference
/// agrees to about 1e-10; a wrong template is off by order 1.
pub const TEMPLATE_TOLERANCE: f64 = 1e-6;

/// Differentiates every `checks` instance of `templates` numerically (f64 operands, random
/// values, every gradient element) and lists the templates no instance reached.
pub fn check_templates(catalogue: &Catalogue, templates: &GradientRules) -> TemplateReport {
    let mut instances = Vec::new();
    let mut used = BTreeSet::new();
    for (k, check) in templates.checks().iter().enumerate() {
        let mut b = GraphBuilder::new(&format!("check_{}", check.op));
        let args: Vec<String> = check
            .shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let dtype = check.dtypes.get(i).copied().unwrap_or(DType::F64);
                b.input(&format!("x{i}"), dtype, shape)
            })
            .collect();
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let attrs: Vec<(&str, AttrValue)> = check
            .attrs
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let y = b.op_with("y", &check.op, &arg_refs, &attrs);
        let graph = b.finish(&[&y]);
        let outcome = agreement(&graph, catalogue, templates, Probe::Elementwise, k as u64).map(
            |(joint, agreement)| {
                used.extend(joint.templates_used.iter().copied());
                // Templates are linear maps: a non-finite gradient is a wrong template.
                if agreement.singular > 0 {
                    f64::INFINITY
                } else {
                    agreement.worst
                }
            },
        );
        instances.push(InstanceCheck {
            instance: format!(
                "{} {:?}{}",
                check.op,
                check.shapes,
                if check.attrs.is_empty() {
                    String::new()
                } else {
                    let attrs: Vec<String> = check
                        .attrs
                        .iter()
                        .map(|(k, v)| format!("{k}: {v}"))
                        .collect();
                    format!(" {{{}}}", attrs.join(", "))
                }
            ),
            outcome,
        });
    }
    let unused = templates
        .rules()
        .iter()
        .enumerate()
        .filter(|(i, _)| !used.contains(i))
        .map(|(i, r)| (r.op.clone(), r.operand.clone(), i))
        .collect();
    TemplateReport {
        instances,
        unused,
        tolerance: TEMPLATE_TOLERANCE,
    }
}

/// Points at which `check-rules` compares each derivative formula with central differences.
pub const DERIVATIVE_POINTS: usize = 400;

/// The largest relative disagreement a derivative formula may show: central differences in
/// f64 agree with a right formula to about 1e-8; a wrong one is off by order 1.
pub const DERIVATIVE_TOLERANCE: f64 = 1e-5;

/// What `check-rules` found for the derivative of one op for one operand.
#[derive(Debug, Clone, PartialEq)]
pub struct DerivativeCheck {
    pub op: String,
    pub operand: String,
    /// The formula as parsed, for the report.
    pub formula: String,
    pub outcome: DerivativeOutcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DerivativeOutcome {
    /// Agreed at `points` points (the others were outside the op's domain or at a kink).
    Agrees { points: usize, worst: f64 },
    /// Disagreed at this point: the operand and attribute values, the incoming gradient `g`,
    /// the formula's value and the central difference.
    Wrong {
        at: Vec<(String, f64)>,
        g: f64,
        analytic: f64,
        numeric: f64,
    },
    /// Too few sampled points where the op is defined and smooth to say anything.
    Unchecked(String),
}

impl DerivativeCheck {
    pub fn passed(&self) -> bool {
        matches!(self.outcome, DerivativeOutcome::Agrees { .. })
    }
}

/// Every derivative formula of every pointwise op of `catalogue` (the defaults and whatever a
/// rule directory added or replaced), compared with central differences of the op's own
/// formula, both evaluated in f64 by the formula interpreter, at [`DERIVATIVE_POINTS`] seeded
/// points per attribute set.
///
/// Nothing here knows an op: operands are drawn over [-3, 3], half of them positive (so that
/// ops defined only there, `log`, `sqrt`, are reached), bool operands as 0 or 1. A point is
/// skipped where the formula is not finite at it or its two neighbours, or where the one-sided
/// differences disagree (a kink, a tie, a pole nearby), which a derivative need not match.
/// Attributes take their defaults, and again with every infinite float default made finite
/// (clamp's bounds), so that the formula's other branches are reached.
pub fn check_derivatives(catalogue: &Catalogue, seed: u64) -> Vec<DerivativeCheck> {
    let mut checks = Vec::new();
    for (k, op) in catalogue.ops().enumerate() {
        let Some(formula) = op.formula() else {
            continue;
        };
        if op.derivatives.is_empty() {
            continue;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (k as u64).wrapping_mul(0x9e37));
        let sets = attribute_sets(op);
        for (operand, derivative) in &op.derivatives {
            let mut points = 0;
            let mut worst: f64 = 0.0;
            let mut wrong = None;
            for attrs in &sets {
                let samples = sample_operands(op, &mut rng);
                match compare(formula, derivative, operand, attrs, &samples) {
                    Ok((n, w)) => {
                        points += n;
                        worst = worst.max(w);
                    }
                    Err(counterexample) => {
                        wrong = Some(counterexample);
                        break;
                    }
                }
            }
            let outcome = match wrong {
                Some(outcome) => outcome,
                None if points < DERIVATIVE_POINTS / 8 => DerivativeOutcome::Unchecked(format!(
                    "the formula is finite and smooth at only {points} of {} sampled points",
                    DERIVATIVE_POINTS * sets.len()
                )),
                None => DerivativeOutcome::Agrees { points, worst },
            };
            checks.push(DerivativeCheck {
                op: op.name().to_string(),
                operand: operand.clone(),
                formula: derivative.to_string(),
                outcome,
            });
        }
    }
    checks
}

/// The attribute values to check `op` under, by name (numeric attributes only: formulas read
/// no others): the defaults (0.75 for a numeric attribute without one), then, if any float
/// default is infinite or NaN, the same with those made finite.
fn attribute_sets(op: &crate::rules::OpDef) -> Vec<Vec<(String, f64)>> {
    let mut defaults = Vec::new();
    let mut finite = Vec::new();
    let mut changed = false;
    for attr in &op.spec.attrs {
        let value = match &attr.default {
            Some(v) => v.as_f64(),
            None => matches!(
                attr.ty,
                crate::attr::AttrType::Float | crate::attr::AttrType::Int
            )
            .then_some(0.75),
        };
        let Some(value) = value else {
            continue;
        };
        let made_finite = match value {
            v if v == f64::NEG_INFINITY => -1.0,
            v if v == f64::INFINITY => 1.5,
            v if v.is_nan() => 0.5,
            v => v,
        };
        changed |= made_finite.to_bits() != value.to_bits();
        defaults.push((attr.name.clone(), value));
        finite.push((attr.name.clone(), made_finite));
    }
    if changed {
        vec![defaults, finite]
    } else {
        vec![defaults]
    }
}

/// [`DERIVATIVE_POINTS`] values for each operand of `op`, by operand.
fn sample_operands(
    op: &crate::rules::OpDef,
    rng: &mut rand::rngs::StdRng,
) -> Vec<(String, Vec<f64>)> {
    use crate::rules::DtypeClass;
    op.spec
        .operands
        .iter()
        .map(|operand| {
            let boolean = op.spec.accepts.get(operand) == Some(&DtypeClass::Bool);
            let values = (0..DERIVATIVE_POINTS)
                .map(|i| match (boolean, i % 2) {
                    (true, _) => f64::from(rng.random_range(0..=1u8)),
                    (false, 0) => rng.random_range(0.05..=3.0),
                    (false, _) => rng.random_range(-3.0..=3.0),
                })
                .collect();
            (operand.clone(), values)
        })
        .collect()
}

/// Compares `derivative` (the gradient contribution for `operand`, over the operands,
/// attributes, `y` and `g`) with `g` times the central difference of `formula` at every
/// sampled point: the number of points compared and the worst relative error, or the first
/// point where they disagree.
fn compare(
    formula: &crate::formula::Expr,
    derivative: &crate::formula::Expr,
    operand: &str,
    attrs: &[(String, f64)],
    samples: &[(String, Vec<f64>)],
) -> std::result::Result<(usize, f64), DerivativeOutcome> {
    use crate::formula::{Bindings, evaluate};
    let n = DERIVATIVE_POINTS;
    let attr_values: Vec<[f64; 1]> = attrs.iter().map(|(_, v)| [*v]).collect();
    let at = |values: &[(String, Vec<f64>)]| -> Option<Vec<f64>> {
        let mut bindings = Bindings::new(n);
        for ((name, _), value) in attrs.iter().zip(&attr_values) {
            bindings = bindings.bind(name, value);
        }
        for (name, v) in values {
            bindings = bindings.bind(name, v);
        }
        evaluate::<f64>(formula, &bindings, n).ok()
    };
    let x = &samples
        .iter()
        .find(|(name, _)| name == operand)
        .expect("derivatives are by operand")
        .1;
    let steps: Vec<f64> = x.iter().map(|v| STEP * v.abs().max(1.0)).collect();
    let moved = |sign: f64| -> Vec<(String, Vec<f64>)> {
        let mut values = samples.to_vec();
        for (name, v) in &mut values {
            if name == operand {
                for (value, h) in v.iter_mut().zip(&steps) {
                    *value += sign * h;
                }
            }
        }
        values
    };
    let (Some(y), Some(plus), Some(minus)) = (at(samples), at(&moved(1.0)), at(&moved(-1.0)))
    else {
        return Ok((0, 0.0));
    };
    let g: Vec<f64> = (0..n)
        .map(|i| if i % 2 == 0 { 0.7 } else { -1.3 })
        .collect();
    let mut bindings = Bindings::new(n);
    for ((name, _), value) in attrs.iter().zip(&attr_values) {
        bindings = bindings.bind(name, value);
    }
    for (name, v) in samples {
        bindings = bindings.bind(name, v);
    }
    bindings = bindings.bind("y", &y).bind("g", &g);
    let Ok(analytic) = evaluate::<f64>(derivative, &bindings, n) else {
        return Ok((0, 0.0));
    };
    let mut compared = 0;
    let mut worst: f64 = 0.0;
    for i in 0..n {
        let (h, f0, fp, fm) = (steps[i], y[i], plus[i], minus[i]);
        if !(f0.is_finite() && fp.is_finite() && fm.is_finite()) {
            continue;
        }
        let (right, left) = ((fp - f0) / h, (f0 - fm) / h);
        // A kink or a pole within the step: the one-sided slopes disagree far beyond what
        // curvature over 1e-6 explains.
        if (right - left).abs() > 1e-3 * (1.0 + right.abs() + left.abs()) {
            continue;
        }
        let numeric = g[i] * (fp - fm) / (2.0 * h);
        let error = (analytic[i] - numeric).abs() / analytic[i].abs().max(numeric.abs()).max(1.0);
        // Written so that a NaN analytic value fails.
        if error.is_nan() || error > DERIVATIVE_TOLERANCE {
            let mut point: Vec<(String, f64)> = samples
                .iter()
                .map(|(name, v)| (name.clone(), v[i]))
                .collect();
            point.extend(attrs.iter().cloned());
            return Err(DerivativeOutcome::Wrong {
                at: point,
                g: g[i],
                analytic: analytic[i],
                numeric,
            });
        }
        compared += 1;
        worst = worst.max(error);
    }
    Ok((compared, worst))
}
