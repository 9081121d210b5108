//! One ATen node spelled as ONNX nodes: the first entry of the ATen table whose conditions
//! hold, its templates instantiated with the node's arguments. Numbers and integer lists the
//! ONNX ops take as inputs become initializers; operands are cast where the entry promotes.

use super::fx::{self, FxNode, FxRef};
use crate::dtype::DType;
use crate::rules::aten::{AtenMap, AtenTable, Promote, split_reference};
use half::{bf16, f16};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, NodeProto, TensorProto};
use serde_json::Value as Json;
use std::collections::HashMap;

/// Why a node could not be spelled; the caller locates it at the node.
pub type Spelled<T = ()> = std::result::Result<T, String>;

/// The ONNX graph being written: nodes, initializers, and the type of every value so far.
#[derive(Default)]
pub struct Speller {
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
    pub types: HashMap<String, (DType, Vec<usize>)>,
}

/// What one template node's references resolve against.
struct Site<'n> {
    node: &'n FxNode,
    /// The dtype numbers and promoted operands take (`None`: operands as they are, numbers in
    /// the output's dtype).
    promoted: Option<DType>,
    out: (DType, &'n [usize]),
}

impl Speller {
    /// Spells `node` with the first entry of `table` for its op whose conditions hold.
    pub fn node(&mut self, node: &FxNode, table: &AtenTable) -> Spelled {
        let map = select(node, table)?;
        let used_max = match &node.used {
            // Saturating: a file may name output `usize::MAX`, which is refused just below.
            Some(used) => used.iter().max().map_or(0, |&u| u.saturating_add(1)),
            None => node.outputs.len(),
        };
        if used_max > map.outputs {
            return Err(format!(
                "the graph reads output {} of `{}`, and fusebox computes only its first {}",
                used_max - 1,
                node.target,
                map.outputs
            ));
        }
        let first = node
            .outputs
            .first()
            .ok_or_else(|| format!("`{}` has no outputs", node.target))?;
        let out = (
            fx::dtype(&first.dtype, &node.name).map_err(|e| e.to_string())?,
            first.shape.as_slice(),
        );
        let promoted = match map.promote {
            Promote::None => None,
            Promote::Out => Some(out.0),
            Promote::Common => {
                let common = node
                    .common
                    .as_deref()
                    .ok_or("the operands' common dtype was not given")?;
                Some(fx::dtype(common, &node.name).map_err(|e| e.to_string())?)
            }
        };
        let site = Site {
            node,
            promoted,
            out,
        };
        let mut local: HashMap<&str, String> = HashMap::new();
        let last = map.nodes.len() - 1;
        for (n, template) in map.nodes.iter().enumerate() {
            let keep = template.when.iter().all(|(k, v)| holds(node, k, v))
                && (template.unless.is_empty()
                    || !template.unless.iter().all(|(k, v)| holds(node, k, v)));
            let outputs: Vec<String> = if n == last {
                let count = node.outputs.len().min(map.outputs);
                (0..count)
                    .map(|index| {
                        FxRef {
                            node: node.name.clone(),
                            index,
                        }
                        .value_name()
                    })
                    .collect()
            } else {
                vec![format!(
                    "{}.{}",
                    node.name,
                    template.name.clone().unwrap_or_else(|| n.to_string())
                )]
            };
            if !keep {
                // A node left out stands for its first input.
                let first = template
                    .inputs
                    .first()
                    .ok_or("a node left out has no input to stand for")?;
                let value = self
                    .input(&site, &local, first)?
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                if n == last {
                    self.push(node, "Identity", vec![value], outputs, Vec::new());
                } else if let Some(name) = &template.name {
                    local.insert(name, value);
                }
                continue;
            }
            let mut inputs = Vec::new();
            for written in &template.inputs {
                inputs.extend(self.input(&site, &local, written)?);
            }
            // Trailing absent inputs are left off, as ONNX writers do.
            while inputs.last().is_some_and(String::is_empty) {
                inputs.pop();
            }
            let attrs = template
                .attrs
                .iter()
                .filter_map(|(key, value)| attribute(&site, key, value).transpose())
                .collect::<Spelled<Vec<_>>>()?;
            if let Some(name) = &template.name {
                local.insert(name, outputs[0].clone());
            }
            self.push(node, &template.op, inputs, outputs, attrs);
        }
        for (index, ty) in node.outputs.iter().enumerate() {
            let dtype = fx::dtype(&ty.dtype, &node.name).map_err(|e| e.to_string())?;
            self.types.insert(
                FxRef {
                    node: node.name.clone(),
                    index,
                }
                .value_name(),
                (dtype, ty.shape.clone()),
            );
        }
        Ok(())
    }

    fn push(
        &mut self,
        at: &FxNode,
        op: &str,
        inputs: Vec<String>,
        outputs: Vec<String>,
        attrs: Vec<AttributeProto>,
    ) {
        let mut proto = NodeProto::new();
        proto.name = at.name.clone();
        proto.op_type = op.to_string();
        proto.input = inputs;
        proto.output = outputs;
        proto.attribute = attrs;
        self.nodes.push(proto);
    }

    /// The value names an input reference stands for (several for a list of tensors, `""`
    /// for an absent optional input).
    fn input(
        &mut self,
        site: &Site,
        local: &HashMap<&str, String>,
        written: &str,
    ) -> Spelled<Vec<String>> {
        if written.is_empty() {
            return Ok(vec![String::new()]);
        }
        if let Some(value) = local.get(written) {
            return Ok(vec![value.clone()]);
        }
        if let Some(int) = written
            .strip_suffix(".i64")
            .and_then(|i| i.parse::<i64>().ok())
        {
            // A literal integer list of one: axes (`"-1.i64"`).
            let name = format!("{}.literal", site.node.name);
            return Ok(vec![self.ints(&name, &[int], true)]);
        }
        if let Ok(number) = written.parse::<f64>() {
            // A literal number: a constant, as a number argument is.
            let dtype = site.promoted.unwrap_or(site.out.0);
            let name = format!("{}.literal", site.node.name);
            return Ok(vec![self.scalar(&name, dtype, number)?]);
        }
        let (name, form, fallback) =
            split_reference(written).ok_or_else(|| format!("`{written}` is not a reference"))?;
        let node = site.node;
        let prefix = format!("{}.{name}", node.name);
        if form == Some("shape") {
            let shape = if name == "out" {
                site.out.1.to_vec()
            } else {
                let arg = node.args.get(name).unwrap_or(&Json::Null);
                let r =
                    FxRef::of(arg).ok_or_else(|| format!("argument `{name}` is not a tensor"))?;
                let (_, shape) = self
                    .types
                    .get(&r.value_name())
                    .ok_or_else(|| format!("`{}` is not a value of the graph", r.node))?;
                shape.clone()
            };
            let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            return Ok(vec![self.ints(&prefix, &dims, true)]);
        }
        let arg = argument(node, name, fallback)?;
        let arg = &arg;
        match form {
            Some("i64") | Some("scalar") => {
                let ints = integers(arg).ok_or_else(|| {
                    format!("argument `{name}` is not an integer or a list of them")
                })?;
                Ok(vec![self.ints(&prefix, &ints, form == Some("i64"))])
            }
            Some(other) => Err(format!("`.{other}` is not a form an input takes")),
            None => {
                let dtype = site.promoted.unwrap_or(site.out.0);
                match arg {
                    Json::Null => Ok(vec![String::new()]),
                    Json::Number(n) => Ok(vec![self.scalar(
                        &prefix,
                        dtype,
                        n.as_f64().unwrap_or(f64::NAN),
                    )?]),
                    Json::Bool(b) => Ok(vec![self.scalar(
                        &prefix,
                        dtype,
                        f64::from(u8::from(*b)),
                    )?]),
                    Json::Array(items) => items
                        .iter()
                        .enumerate()
                        .map(|(k, item)| self.operand(site, &format!("{prefix}{k}"), item))
                        .collect(),
                    _ => match fx::number(arg) {
                        Some(value) => Ok(vec![self.scalar(&prefix, dtype, value)?]),
                        None => Ok(vec![self.operand(site, &prefix, arg)?]),
                    },
                }
            }
        }
    }

    /// A tensor operand, cast to the promoted dtype where the entry promotes.
    fn operand(&mut self, site: &Site, name: &str, arg: &Json) -> Spelled<String> {
        let r = FxRef::of(arg).ok_or_else(|| format!("`{arg}` is not a tensor"))?;
        let value = r.value_name();
        let (dtype, shape) = self
            .types
            .get(&value)
            .cloned()
            .ok_or_else(|| format!("`{}` is not a value of the graph", r.node))?;
        match site.promoted {
            Some(to) if to != dtype => {
                let cast = format!("{name}.cast");
                let mut attr = AttributeProto::new();
                attr.name = "to".into();
                attr.type_ = AttributeType::INT.into();
                attr.i = onnx_code(to);
                self.push(
                    site.node,
                    "Cast",
                    vec![value],
                    vec![cast.clone()],
                    vec![attr],
                );
                self.types.insert(cast.clone(), (to, shape));
                Ok(cast)
            }
            _ => Ok(value),
        }
    }

    /// An int64 initializer holding `ints`, 1-D when `vector`, else 0-D (one int).
    fn ints(&mut self, name: &str, ints: &[i64], vector: bool) -> String {
        let shape = if vector { vec![ints.len()] } else { Vec::new() };
        let bytes = ints.iter().flat_map(|i| i.to_le_bytes()).collect();
        self.initializer(name, DType::I64, shape, bytes)
    }

    /// A 0-D initializer of `dtype` holding `value`.
    fn scalar(&mut self, name: &str, dtype: DType, value: f64) -> Spelled<String> {
        let bytes = encode(dtype, value)
            .ok_or_else(|| format!("a number of dtype {} is not supported here", dtype.name()))?;
        Ok(self.initializer(name, dtype, Vec::new(), bytes))
    }

    /// Adds an initializer (under a fresh name if `name` is taken) and returns its name.
    pub fn initializer(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    ) -> String {
        let mut unique = name.to_string();
        let mut k = 1;
        while self.types.contains_key(&unique) {
            unique = format!("{name}#{k}");
            k += 1;
        }
        let mut t = TensorProto::new();
        t.name = unique.clone();
        t.data_type = onnx_code(dtype) as i32;
        t.dims = shape.iter().map(|&d| d as i64).collect();
        t.raw_data = bytes;
        self.initializers.push(t);
        self.types.insert(unique.clone(), (dtype, shape));
        unique
    }
}

/// Argument `name` of `node`; where it is None (or an empty list) and the reference has a
/// fallback (after `|`), the fallback: a number, or another argument (`$NAME`).
fn argument(node: &FxNode, name: &str, fallback: Option<&str>) -> Spelled<Json> {
    let arg = node.args.get(name).cloned().unwrap_or(Json::Null);
    let empty = arg.is_null() || arg.as_array().is_some_and(Vec::is_empty);
    match fallback {
        Some(f) if empty => match f.strip_prefix('$') {
            Some(other) => Ok(node.args.get(other).cloned().unwrap_or(Json::Null)),
            None => f
                .parse::<f64>()
                .map(Json::from)
                .map_err(|_| format!("fallback `{f}` is not a number")),
        },
        _ => Ok(arg),
    }
}

/// The first entry for `node`'s op whose conditions hold, or why there is none.
fn select<'t>(node: &FxNode, table: &'t AtenTable) -> Spelled<&'t AtenMap> {
    let entries = table.entries(&node.target);
    if entries.is_empty() {
        return Err(format!("`{}` has no entry in the ATen table", node.target));
    }
    entries
        .into_iter()
        .find(|m| {
            m.when.iter().all(|(k, v)| holds(node, k, v))
                && (m.unless.is_empty() || !m.unless.iter().all(|(k, v)| holds(node, k, v)))
        })
        .ok_or_else(|| {
            let args: Vec<String> = node
                .args
                .iter()
                .filter(|(_, v)| FxRef::of(v).is_none())
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!(
                "no entry of `{}` applies to its arguments ({})",
                node.target,
                args.join(", ")
            )
        })
}

/// Whether argument `key` of `node` has the condition's value (`()`: left as None).
fn holds(node: &FxNode, key: &str, expected: &ron::Value) -> bool {
    let arg = node.args.get(key).unwrap_or(&Json::Null);
    match (arg, expected) {
        (Json::Null, ron::Value::Unit) => true,
        (Json::Number(n), ron::Value::Number(e)) => n.as_f64() == Some(e.into_f64()),
        (Json::Bool(b), ron::Value::Bool(e)) => b == e,
        (Json::String(s), ron::Value::String(e)) => s == e,
        _ => false,
    }
}

/// An attribute from a template's literal or reference; `None` where it refers to an
/// argument left as None (the ONNX default applies).
fn attribute(site: &Site, key: &str, value: &ron::Value) -> Spelled<Option<AttributeProto>> {
    let mut attr = AttributeProto::new();
    attr.name = key.to_string();
    let reference = match value {
        ron::Value::String(s) if s.starts_with('$') => s,
        literal => return Ok(Some(literal_attribute(attr, literal)?)),
    };
    let (name, form, fallback) = split_reference(reference).ok_or("not a reference")?;
    if form == Some("dtype") {
        let dtype = if name == "out" {
            site.out.0
        } else {
            let arg = site
                .node
                .args
                .get(name)
                .and_then(fx::dtype_arg)
                .ok_or_else(|| format!("argument `{name}` is not a dtype"))?;
            fx::dtype(arg, &site.node.name).map_err(|e| e.to_string())?
        };
        return Ok(Some(int_attribute(attr, onnx_code(dtype))));
    }
    let arg = argument(site.node, name, fallback)?;
    if arg.is_null() {
        return Ok(None);
    }
    let ints = || {
        integers(&arg)
            .ok_or_else(|| format!("argument `{name}` is not an integer or a list of them"))
    };
    Ok(Some(match form {
        Some("positive") => {
            let rank = site.out.1.len() as i64;
            let axes = ints()?
                .into_iter()
                .map(|a| if a < 0 { a + rank } else { a })
                .collect();
            ints_attribute(attr, axes)
        }
        Some("twice") => {
            let once = ints()?;
            ints_attribute(attr, once.iter().chain(&once).copied().collect())
        }
        Some("axis") => int_attribute(attr, -(ints()?.len() as i64)),
        Some(other) => return Err(format!("`.{other}` is not a form an attribute takes")),
        None => match &arg {
            Json::Bool(b) => int_attribute(attr, i64::from(*b)),
            Json::Number(n) => match n.as_i64() {
                Some(i) => int_attribute(attr, i),
                None => float_attribute(attr, n.as_f64().unwrap_or(f64::NAN)),
            },
            Json::String(s) => {
                attr.type_ = AttributeType::STRING.into();
                attr.s = s.as_bytes().to_vec();
                attr
            }
            Json::Array(_) => match integers(&arg) {
                Some(ints) => ints_attribute(attr, ints),
                None => {
                    let floats = arg
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(Json::as_f64)
                        .collect::<Option<Vec<f64>>>();
                    let floats = floats
                        .ok_or_else(|| format!("argument `{name}` is not a list of numbers"))?;
                    attr.type_ = AttributeType::FLOATS.into();
                    attr.floats = floats.into_iter().map(|f| f as f32).collect();
                    attr
                }
            },
            _ => return Err(format!("argument `{name}` cannot be an attribute")),
        },
    }))
}

fn literal_attribute(attr: AttributeProto, literal: &ron::Value) -> Spelled<AttributeProto> {
    Ok(match literal {
        ron::Value::Bool(b) => int_attribute(attr, i64::from(*b)),
        ron::Value::Number(n) => match n {
            ron::value::Number::F32(_) | ron::value::Number::F64(_) => {
                float_attribute(attr, n.into_f64())
            }
            _ => int_attribute(attr, n.into_f64() as i64),
        },
        ron::Value::String(s) => {
            let mut attr = attr;
            attr.type_ = AttributeType::STRING.into();
            attr.s = s.as_bytes().to_vec();
            attr
        }
        ron::Value::Seq(items) => {
            let ints = items
                .iter()
                .map(|v| match v {
                    ron::Value::Number(n) => Some(n.into_f64() as i64),
                    _ => None,
                })
                .collect::<Option<Vec<i64>>>()
                .ok_or("a literal list attribute holds integers")?;
            ints_attribute(attr, ints)
        }
        other => return Err(format!("{other:?} is not an attribute value")),
    })
}

fn int_attribute(mut attr: AttributeProto, i: i64) -> AttributeProto {
    attr.type_ = AttributeType::INT.into();
    attr.i = i;
    attr
}

fn float_attribute(mut attr: AttributeProto, f: f64) -> AttributeProto {
    attr.type_ = AttributeType::FLOAT.into();
    attr.f = f as f32;
    attr
}

fn ints_attribute(mut attr: AttributeProto, ints: Vec<i64>) -> AttributeProto {
    attr.type_ = AttributeType::INTS.into();
    attr.ints = ints;
    attr
}

/// An int, or a list of ints (an integral float counts: PyTorch writes some sizes so).
fn integers(arg: &Json) -> Option<Vec<i64>> {
    let one = |v: &Json| {
        v.as_i64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
    };
    match arg {
        Json::Array(items) => items.iter().map(one).collect(),
        other => one(other).map(|i| vec![i]),
    }
}

/// The ONNX `TensorProto.DataType` code of a dtype.
pub fn onnx_code(dtype: DType) -> i64 {
    (1..=16)
        .find(|&code| crate::onnx::proto::dtype_of(code).ok() == Some(dtype))
        .map_or(0, i64::from)
}

/// `value` in `dtype`'s little-endian storage, as ONNX's raw data holds it.
fn encode(dtype: DType, value: f64) -> Option<Vec<u8>> {
    let int = || crate::tensor::float_to_int(dtype, value);
    Some(match dtype {
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
        DType::F16 => f16::from_f64(value).to_bits().to_le_bytes().to_vec(),
        // Rounded by `DType::round` first: `half`'s `bf16::from_f64` (2.7) drops the f64's low
        // 32 bits before rounding, so a value just above a tie rounds down.
        DType::BF16 => bf16::from_f64(DType::BF16.round(value))
            .to_bits()
            .to_le_bytes()
            .to_vec(),
        DType::Bool => vec![u8::from(value != 0.0)],
        DType::I8 | DType::U8 => vec![int() as u8],
        DType::I16 | DType::U16 => (int() as u16).to_le_bytes().to_vec(),
        DType::I32 | DType::U32 => (int() as u32).to_le_bytes().to_vec(),
        DType::I64 => int().to_le_bytes().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_has_an_onnx_code_that_reads_back() {
        for dtype in DType::ALL {
            let code = onnx_code(dtype);
            assert_eq!(crate::onnx::proto::dtype_of(code as i32).ok(), Some(dtype));
        }
    }

    /// bf16 constants round to nearest: a value just above the halfway point between two
    /// bf16 values rounds up, however small the excess (1 + 2^-8 is the tie between 1 and
    /// 1 + 2^-7; `half`'s own `from_f64` rounds these down).
    #[test]
    fn bf16_constants_just_above_a_tie_round_up() {
        let up = 0x3f81u16.to_le_bytes().to_vec();
        for excess in [2f64.powi(-23), 2f64.powi(-40), 2f64.powi(-50)] {
            assert_eq!(
                encode(DType::BF16, 1.0 + 2f64.powi(-8) + excess),
                Some(up.clone())
            );
        }
        // The tie itself goes to the even neighbour, 1.
        assert_eq!(
            encode(DType::BF16, 1.0 + 2f64.powi(-8)),
            Some(0x3f80u16.to_le_bytes().to_vec())
        );
    }

    #[test]
    fn numbers_are_stored_in_their_dtype() {
        assert_eq!(encode(DType::F32, 0.5), Some(0.5f32.to_le_bytes().to_vec()));
        assert_eq!(
            encode(DType::BF16, 1.0),
            Some(0x3f80u16.to_le_bytes().to_vec())
        );
        assert_eq!(
            encode(DType::I64, -3.0),
            Some((-3i64).to_le_bytes().to_vec())
        );
        assert_eq!(encode(DType::Bool, 2.0), Some(vec![1]));
    }
}
