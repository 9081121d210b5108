//! Nodes imported through the op table (`rules/onnx.ron`): the Map whose `when` conditions
//! hold for a node, and its template nodes instantiated with the node's inputs and
//! attributes. The ops the importer handles in code are in the parent module.

use super::*;
use crate::rules::onnx::Template;

impl<'a> Importer<'a> {
    /// A node imported through the op table: its first output, then the template nodes the
    /// Map's `outputs` names for the ONNX node's further outputs.
    pub(super) fn mapped(
        &mut self,
        node: &NodeProto,
        attrs: &HashMap<String, Attr>,
        out: &str,
    ) -> Imports<Mapped> {
        let mut inputs: Vec<Option<Val>> = (0..node.input.len())
            .map(|i| self.input(node, i))
            .collect::<Imports<_>>()?;
        let map = self.select(node, attrs, &inputs)?;
        let count = inputs.iter().flatten().count();
        if let Some(chain) = &map.chain {
            let mut acc: Option<Val> = None;
            for v in inputs.iter().flatten() {
                acc = Some(match acc {
                    None => v.clone(),
                    Some(a) => self.emit(
                        chain,
                        &[a, v.clone()],
                        Attrs::new(),
                        &format!("{out}.{chain}"),
                        false,
                    )?,
                });
            }
            let acc =
                acc.ok_or_else(|| ImportError::Malformed("at least one input is required".into()))?;
            inputs = vec![Some(acc)];
        }
        let mut local: HashMap<String, Option<Val>> = HashMap::new();
        let mut last: Option<Val> = inputs.first().cloned().flatten();
        for (n, t) in map.nodes.iter().enumerate() {
            let holds = |(k, v): (&String, &ron::Value)| condition(attrs, map, &inputs, k, v);
            // `unless` leaves the node out only when every one of its conditions holds.
            let excluded = !t.unless.is_empty() && t.unless.iter().all(holds);
            let keep = t.when.iter().all(holds)
                && !excluded
                && t.needs.iter().all(|r| {
                    r.strip_prefix('$')
                        .and_then(|i| i.parse::<usize>().ok())
                        .is_some_and(|i| inputs.get(i).is_some_and(|v| v.is_some()))
                });
            let mut args = Vec::new();
            // A node left out stands for its first argument; the others are not needed.
            let wanted = if keep {
                t.args.len()
            } else {
                t.args.len().min(1)
            };
            for written in &t.args[..wanted] {
                // `"$2|zero"`: the first alternative that has a value here (an input given,
                // a node with a value: one left out for want of an input has none).
                let arg = written
                    .split('|')
                    .find(
                        |alt| match alt.strip_prefix('$').and_then(|i| i.parse::<usize>().ok()) {
                            Some(i) => inputs.get(i).is_some_and(|v| v.is_some()),
                            None => local.get(*alt).is_none_or(|v| v.is_some()),
                        },
                    )
                    .unwrap_or(written);
                if arg == "$*" {
                    args.extend(inputs.iter().flatten().cloned());
                } else if let Some(i) = arg.strip_prefix('$').and_then(|i| i.parse::<usize>().ok())
                {
                    match inputs.get(i).cloned().flatten() {
                        Some(v) => args.push(v),
                        None if !keep => {}
                        None => {
                            return Err(ImportError::Malformed(format!("input {i} is required")));
                        }
                    }
                } else {
                    match local.get(arg) {
                        Some(Some(v)) => args.push(v.clone()),
                        _ => {
                            return Err(ImportError::RuleSet(format!(
                                "{}: `{arg}` has no value here",
                                self.table.file
                            )));
                        }
                    }
                }
            }
            let value = if keep {
                let a = self.template_attrs(t, attrs, map, &inputs, count)?;
                let is_last = n + 1 == map.nodes.len();
                let name = if is_last {
                    out.to_string()
                } else {
                    format!("{out}.{}", t.name.clone().unwrap_or_else(|| t.op.clone()))
                };
                Some(self.emit(&t.op, &args, a, &name, is_last)?)
            } else {
                args.first().cloned()
            };
            if let Some(name) = &t.name {
                local.insert(name.clone(), value.clone());
            }
            last = value;
        }
        let last =
            last.ok_or_else(|| ImportError::RuleSet("the mapping produced no value".into()))?;
        let mut outputs = vec![last];
        for (k, name) in map.outputs.iter().enumerate() {
            // Only outputs the model names are wanted; an unnamed one may have been skipped.
            if node.output.get(k + 1).is_none_or(|o| o.is_empty()) {
                break;
            }
            match local.get(name) {
                Some(Some(v)) => outputs.push(v.clone()),
                _ => {
                    return Err(ImportError::RuleSet(format!(
                        "{}: output `{name}` has no value here",
                        self.table.file
                    )));
                }
            }
        }
        // A Map that ends in a cast gives its result the dtype it names (Cast, CastLike).
        let cast = self.catalogue.builtin(crate::rules::Builtin::Cast);
        let casts = map
            .nodes
            .last()
            .is_some_and(|t| cast.is_some_and(|c| c.name() == t.op));
        Ok(Mapped { outputs, casts })
    }

    /// The catalogue attributes of template node `t`: its written values, and its `$…`
    /// references resolved against the ONNX node's attributes and inputs.
    fn template_attrs(
        &self,
        t: &Template,
        attrs: &HashMap<String, Attr>,
        map: &Mapping,
        inputs: &[Option<Val>],
        count: usize,
    ) -> Imports<Attrs> {
        let declared = self.catalogue.declared_attrs(&t.op).ok_or_else(|| {
            ImportError::RuleSet(format!(
                "{} names op `{}`, which the catalogue lacks",
                self.table.file, t.op
            ))
        })?;
        let mut a = Attrs::new();
        for (k, v) in &t.attrs {
            let spec = declared.iter().find(|d| &d.name == k).ok_or_else(|| {
                ImportError::RuleSet(format!(
                    "{}: op `{}` has no attribute `{k}`",
                    self.table.file, t.op
                ))
            })?;
            let value = match v {
                ron::Value::String(s) if s.starts_with('$') => {
                    self.reference(s, spec.ty, attrs, map, inputs, count)?
                }
                other => Some(AttrValue::from_bare(other, spec.ty).map_err(|m| {
                    ImportError::RuleSet(format!(
                        "{}: attribute `{k}` must be {}, found {}",
                        self.table.file, m.expected, m.found
                    ))
                })?),
            };
            if let Some(value) = value {
                a.insert(k.clone(), value);
            }
        }
        Ok(a)
    }

    /// The first Map for the node's op type whose conditions its attributes and input dtypes
    /// meet.
    pub(super) fn select(
        &self,
        node: &NodeProto,
        attrs: &HashMap<String, Attr>,
        inputs: &[Option<Val>],
    ) -> Imports<&'a Mapping> {
        let table: &'a MapTable = self.table;
        table
            .maps
            .iter()
            .filter(|m| m.onnx == node.op_type)
            .find(|m| {
                m.when
                    .iter()
                    .all(|(k, v)| condition(attrs, m, inputs, k, v))
            })
            .ok_or_else(|| {
                let given: Vec<String> = node
                    .attribute
                    .iter()
                    .map(|a| format!("{}={:?}", a.name, attrs.get(&a.name)))
                    .collect();
                let dtypes: Vec<String> = inputs
                    .iter()
                    .map(|v| v.as_ref().map_or("-".into(), |v| v.dtype().to_string()))
                    .collect();
                ImportError::Unsupported(format!(
                    "no mapping of {} applies to these attributes ({}) and input dtypes ({})",
                    table.file,
                    given.join(", "),
                    dtypes.join(", ")
                ))
            })
    }

    /// Resolves a `$…` attribute reference of the op table (see rules/onnx.ron's header).
    pub(super) fn reference(
        &self,
        text: &str,
        ty: AttrType,
        attrs: &HashMap<String, Attr>,
        map: &Mapping,
        inputs: &[Option<Val>],
        count: usize,
    ) -> Imports<Option<AttrValue>> {
        for alternative in text.split('|') {
            let r = alternative.trim().trim_start_matches('$');
            let found: Option<Attr> = if r == "count" {
                Some(Attr::Int(count as i64))
            } else if let Some((index, what)) = r.split_once('.')
                && let Ok(index) = index.parse::<usize>()
            {
                match (inputs.get(index).cloned().flatten(), what) {
                    (None, _) => None,
                    (Some(v), "dtype") => {
                        return Ok(Some(AttrValue::DType(v.dtype())));
                    }
                    (Some(v), "shape") => Some(Attr::Ints(shape_ints(v.shape()))),
                    // The shape with a size-1 axis put in at `axis` (ONNX `Unsqueeze`).
                    (Some(v), unsqueeze) if unsqueeze.starts_with("unsqueeze(") => {
                        let axis = unsqueeze
                            .strip_prefix("unsqueeze(")
                            .and_then(|a| a.strip_suffix(')'))
                            .and_then(|a| a.parse::<usize>().ok())
                            .filter(|&a| a <= v.shape().len())
                            .ok_or_else(|| {
                                ImportError::RuleSet(format!(
                                    "{}: `.{unsqueeze}` needs an axis from 0 to input {index}'s rank",
                                    self.table.file
                                ))
                            })?;
                        let mut dims = shape_ints(v.shape());
                        dims.insert(axis, 1);
                        Some(Attr::Ints(dims))
                    }
                    (Some(v), "value" | "ints" | "axes") => {
                        let t = self.demand(&v).ok_or_else(|| {
                            ImportError::Unsupported(format!(
                                "input {index} must be a constant (fusebox shapes and attributes are static), not a run-time value{}",
                                super::GIVE_VALUE
                            ))
                        })?;
                        let vals = t.values();
                        if what == "value" {
                            if vals.len() != 1 {
                                return Err(ImportError::Malformed(format!(
                                    "input {index} must hold one value"
                                )));
                            }
                            Some(Attr::Float(vals[0]))
                        } else if what == "axes" && vals.is_empty() {
                            // An empty axes input means every axis to ONNX's reductions
                            // (noop_with_empty_axes = 0): the same as no axes at all, so the
                            // next alternative (or the op's default, all axes) decides.
                            None
                        } else {
                            Some(Attr::Ints(vals.iter().map(|&f| f as i64).collect()))
                        }
                    }
                    (Some(_), other) => {
                        return Err(ImportError::RuleSet(format!(
                            "{}: unknown reference `.{other}`",
                            self.table.file
                        )));
                    }
                }
            } else if let Some(name) = r.strip_suffix("..") {
                let rank = inputs
                    .first()
                    .cloned()
                    .flatten()
                    .map(|v| v.shape().len())
                    .ok_or_else(|| ImportError::Malformed("input 0 is required".into()))?;
                match attr_or_default(attrs, map, name) {
                    Some(Attr::Int(a)) => {
                        let a = crate::shape::normalize_axis(a, rank)?;
                        Some(Attr::Ints((a as i64..rank as i64).collect()))
                    }
                    _ => None,
                }
            } else {
                attr_or_default(attrs, map, r)
            };
            if let Some(found) = found {
                return coerce(found, ty).map(Some);
            }
        }
        Ok(None)
    }
}

/// An ONNX attribute value as the catalogue attribute type asks for it.
pub(super) fn coerce(v: Attr, ty: AttrType) -> Imports<AttrValue> {
    Ok(match (ty, v) {
        (AttrType::Float, Attr::Float(f)) => AttrValue::Float(f),
        (AttrType::Float, Attr::Int(i)) => AttrValue::Float(i as f64),
        (AttrType::Int, Attr::Int(i)) => AttrValue::Int(i),
        (AttrType::Bool, Attr::Int(i)) => AttrValue::Bool(i != 0),
        (AttrType::Ints, Attr::Ints(v)) => AttrValue::Ints(v),
        (AttrType::Ints, Attr::Int(i)) => AttrValue::Ints(vec![i]),
        (AttrType::DType, Attr::Int(code)) => AttrValue::DType(proto::dtype_of(code as i32)?),
        (ty, v) => {
            return Err(ImportError::Malformed(format!(
                "cannot use {v:?} where {ty} is expected"
            )));
        }
    })
}

/// The node's attribute `name`, or the Map's default for it.
pub(super) fn attr_or_default(
    attrs: &HashMap<String, Attr>,
    map: &Mapping,
    name: &str,
) -> Option<Attr> {
    if let Some(a) = attrs.get(name) {
        return Some(a.clone());
    }
    match map.attrs.get(name)? {
        ron::Value::Number(n) => Some(match n {
            ron::value::Number::F32(_) | ron::value::Number::F64(_) => Attr::Float(n.into_f64()),
            _ => Attr::Int(n.into_f64() as i64),
        }),
        ron::Value::String(s) => Some(Attr::Str(s.clone())),
        _ => None,
    }
}

/// A shape as the integers of a `shape` attribute.
fn shape_ints(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// Whether a `when`/`unless` condition holds: `"$N.dtype": "i32"` (or `"integer"`, `"float"`,
/// `"bool"`, or a list of these, any of which holds) on the dtype of input N (false when it
/// is absent), `"$N.run_time": true` when
/// input N is present and not a constant, any other key on the ONNX attribute of that name
/// (or the Map's default for it).
pub(super) fn condition(
    attrs: &HashMap<String, Attr>,
    map: &Mapping,
    inputs: &[Option<Val>],
    key: &str,
    expected: &ron::Value,
) -> bool {
    if let Some(index) = crate::rules::onnx::run_time_condition(key) {
        let run_time = matches!(inputs.get(index), Some(Some(v)) if v.constant().is_none());
        return matches!(expected, ron::Value::Bool(want) if *want == run_time);
    }
    match crate::rules::onnx::dtype_condition(key) {
        Some(index) => {
            let Some(Some(v)) = inputs.get(index) else {
                return false;
            };
            let holds = |want: &ron::Value| matches!(want, ron::Value::String(want) if crate::rules::onnx::dtype_matches(v.dtype(), want));
            match expected {
                ron::Value::Seq(any) => any.iter().any(holds),
                one => holds(one),
            }
        }
        None => matches(attr_or_default(attrs, map, key).as_ref(), expected),
    }
}

/// Whether an attribute value equals a condition's value.
pub(super) fn matches(value: Option<&Attr>, expected: &ron::Value) -> bool {
    match (value, expected) {
        (Some(Attr::Int(i)), ron::Value::Number(n)) => *i as f64 == n.into_f64(),
        (Some(Attr::Float(f)), ron::Value::Number(n)) => *f == n.into_f64(),
        (Some(Attr::Str(s)), ron::Value::String(e)) => s == e,
        _ => false,
    }
}
