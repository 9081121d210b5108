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
    pub outcome: std::result::Result<f64, String>,
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
            .map(|(i, shape)| b.input(&format!("x{i}"), DType::F64, shape))
            .collect();
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let attrs: Vec<(&str, AttrValue)> = check
            .attrs
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let y = b.op_with("y", &check.op, &arg_refs, &attrs);
        let graph = b.finish(&[&y]);
        let outcome = agreement(&graph, catalogue, templates, Probe::Elementwise, k as u64)
            .map(|(joint, agreement)| {
                used.extend(joint.templates_used.iter().copied());
                // Templates are linear maps: a non-finite gradient is a wrong template.
                if agreement.singular > 0 {
                    f64::INFINITY
                } else {
                    agreement.worst
                }
            })
            .map_err(|e: Error| e.to_string());
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
