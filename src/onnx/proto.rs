//! Reading ONNX protobuf: the model file, its tensors (inline or in external data files) and
//! node attributes, turned into fusebox values.
//!
//! A model file is untrusted. Every size it declares is checked against the bytes that are
//! really there before anything is allocated from it, external-data paths must name a file
//! inside the model's directory (after symbolic links are resolved), and element types fusebox
//! does not have are refused by name.

use crate::dtype::DType;
use crate::tensor::Tensor;
use onnx_protobuf::{
    AttributeProto, Message, ModelProto, TensorProto, attribute_proto::AttributeType,
};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

/// The most elements one tensor of a model may hold: a declared shape past this is refused
/// before anything is allocated for it (the reference evaluator's limit is of the same order).
pub const MAX_ELEMENTS: usize = 1 << 28;

/// The fusebox dtype of an ONNX `TensorProto.DataType` code, or why there is none.
pub fn dtype_of(code: i32) -> Result<DType, String> {
    Ok(match code {
        1 => DType::F32,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        16 => DType::BF16,
        other => {
            return Err(format!(
                "element type {} is not one fusebox has",
                type_name(other)
            ));
        }
    })
}

/// The ONNX spelling of a data type code, for messages.
pub fn type_name(code: i32) -> String {
    let name = match code {
        0 => "UNDEFINED",
        1 => "FLOAT",
        2 => "UINT8",
        3 => "INT8",
        4 => "UINT16",
        5 => "INT16",
        6 => "INT32",
        7 => "INT64",
        8 => "STRING",
        9 => "BOOL",
        10 => "FLOAT16",
        11 => "DOUBLE",
        12 => "UINT32",
        13 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        16 => "BFLOAT16",
        17 => "FLOAT8E4M3FN",
        18 => "FLOAT8E4M3FNUZ",
        19 => "FLOAT8E5M2",
        20 => "FLOAT8E5M2FNUZ",
        21 => "UINT4",
        22 => "INT4",
        23 => "FLOAT4E2M1",
        24 => "FLOAT8E8M0",
        25 => "UINT2",
        26 => "INT2",
        _ => return format!("code {code}"),
    };
    name.to_string()
}

/// Parses a model from its bytes; a truncated or malformed file is an error, never a panic
/// (the protobuf reader checks every declared length against what is left).
pub fn parse_model(bytes: &[u8]) -> Result<ModelProto, String> {
    ModelProto::parse_from_bytes(bytes).map_err(|e| format!("not a readable ONNX model: {e}"))
}

/// Parses one serialized `TensorProto` (the `.pb` files of ONNX's test data sets).
pub fn parse_tensor(bytes: &[u8]) -> Result<TensorProto, String> {
    TensorProto::parse_from_bytes(bytes).map_err(|e| format!("not a readable ONNX tensor: {e}"))
}

/// The element count of `dims`, refusing negative dimensions, overflow and sizes past
/// [`MAX_ELEMENTS`].
pub fn element_count(dims: &[i64]) -> Result<(Vec<usize>, usize), String> {
    let mut shape = Vec::with_capacity(dims.len());
    let mut count: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| format!("dimension {d} is negative"))?;
        count = count
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| format!("shape {dims:?} has more than {MAX_ELEMENTS} elements"))?;
        shape.push(d);
    }
    Ok((shape, count))
}

/// Converts a tensor to a fusebox [`Tensor`]. `dir` is the model's directory, where external
/// data files are looked up.
pub fn to_tensor(t: &TensorProto, dir: Option<&Path>) -> Result<Tensor, String> {
    let dtype = dtype_of(t.data_type)?;
    let (shape, count) = element_count(&t.dims)?;
    if t.segment.is_some() {
        return Err("segmented tensors are not supported".into());
    }
    let external = t.data_location.value() == 1;
    let values = if external {
        let bytes = read_external(t, dir, count * width(dtype))?;
        decode_raw(&bytes, dtype, count)?
    } else if !t.raw_data.is_empty() {
        decode_raw(&t.raw_data, dtype, count)?
    } else {
        match dtype {
            DType::F32 => Elements::Floats(t.float_data.iter().map(|&v| v as f64).collect()),
            DType::F64 => Elements::Floats(t.double_data.clone()),
            DType::I64 => Elements::Ints(t.int64_data.clone()),
            DType::I32 | DType::Bool => {
                Elements::Ints(t.int32_data.iter().map(|&v| i64::from(v)).collect())
            }
            // Half-precision values are stored as their bit patterns in int32_data.
            DType::F16 => Elements::Floats(
                t.int32_data
                    .iter()
                    .map(|&v| half::f16::from_bits(v as u16).to_f64())
                    .collect(),
            ),
            DType::BF16 => Elements::Floats(
                t.int32_data
                    .iter()
                    .map(|&v| half::bf16::from_bits(v as u16).to_f64())
                    .collect(),
            ),
        }
    };
    if values.len() != count {
        return Err(format!(
            "shape {:?} needs {count} values, the tensor holds {}",
            t.dims,
            values.len()
        ));
    }
    let tensor = match values {
        Elements::Floats(values) => Tensor::from_values(dtype, &shape, values),
        Elements::Ints(values) => Tensor::from_ints(dtype, &shape, values),
    };
    tensor.ok_or_else(|| format!("shape {:?} does not fit its values", t.dims))
}

/// A tensor's elements as stored: integers (and bools) exactly as `i64`, never through `f64`,
/// which would round an `int64` beyond 2^53.
enum Elements {
    Floats(Vec<f64>),
    Ints(Vec<i64>),
}

impl Elements {
    fn len(&self) -> usize {
        match self {
            Elements::Floats(v) => v.len(),
            Elements::Ints(v) => v.len(),
        }
    }
}

/// Bytes per element in `raw_data`.
fn width(dtype: DType) -> usize {
    match dtype {
        DType::Bool => 1,
        DType::F16 | DType::BF16 => 2,
        DType::I32 | DType::F32 => 4,
        DType::I64 | DType::F64 => 8,
    }
}

/// Little-endian `raw_data` as elements; its length must be exactly `count` elements.
fn decode_raw(bytes: &[u8], dtype: DType, count: usize) -> Result<Elements, String> {
    let w = width(dtype);
    if bytes.len() != count * w {
        return Err(format!(
            "{count} {} values need {} bytes of data, found {}",
            dtype,
            count * w,
            bytes.len()
        ));
    }
    let arr = |c: &[u8]| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..c.len()].copy_from_slice(c);
        a
    };
    let elements = bytes.chunks_exact(w).map(arr);
    Ok(match dtype {
        DType::Bool => Elements::Ints(elements.map(|a| i64::from(a[0] != 0)).collect()),
        DType::I32 => Elements::Ints(
            elements
                .map(|a| i64::from(i32::from_le_bytes([a[0], a[1], a[2], a[3]])))
                .collect(),
        ),
        DType::I64 => Elements::Ints(elements.map(i64::from_le_bytes).collect()),
        DType::F16 => Elements::Floats(
            elements
                .map(|a| half::f16::from_le_bytes([a[0], a[1]]).to_f64())
                .collect(),
        ),
        DType::BF16 => Elements::Floats(
            elements
                .map(|a| half::bf16::from_le_bytes([a[0], a[1]]).to_f64())
                .collect(),
        ),
        DType::F32 => Elements::Floats(
            elements
                .map(|a| f64::from(f32::from_le_bytes([a[0], a[1], a[2], a[3]])))
                .collect(),
        ),
        DType::F64 => Elements::Floats(elements.map(f64::from_le_bytes).collect()),
    })
}

/// Reads an external-data tensor's bytes: `location` relative to the model's directory and
/// inside it, `offset` and `length` within the file, `length` (when given) equal to `needed`.
fn read_external(t: &TensorProto, dir: Option<&Path>, needed: usize) -> Result<Vec<u8>, String> {
    let mut location = None;
    let mut offset: u64 = 0;
    let mut length: Option<u64> = None;
    for entry in &t.external_data {
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("external data {} `{v}` is not a byte count", entry.key))
        };
        match entry.key.as_str() {
            "location" => location = Some(entry.value.clone()),
            "offset" => offset = number(&entry.value)?,
            "length" => length = Some(number(&entry.value)?),
            _ => {}
        }
    }
    let location = location.ok_or("external data without a `location`")?;
    let dir = dir.ok_or("external data, but the model was not read from a file")?;
    let relative = Path::new(&location);
    if relative.as_os_str().is_empty()
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(format!(
            "external data location `{location}` must be a relative path inside the model's directory"
        ));
    }
    let path = dir.join(relative);
    // A symbolic link inside the directory may still point out of it: compare real paths.
    let real_dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let real = path
        .canonicalize()
        .map_err(|e| format!("external data `{location}`: {e}"))?;
    if !real.starts_with(&real_dir) {
        return Err(format!(
            "external data location `{location}` leaves the model's directory"
        ));
    }
    if let Some(length) = length
        && length != needed as u64
    {
        return Err(format!(
            "external data `{location}` declares {length} bytes, the tensor needs {needed}"
        ));
    }
    // A regular file within the external-data limit, opened without blocking: a FIFO planted
    // as external data is refused, not waited on.
    let mut opened = crate::file_limits::open(&real, crate::file_limits::FileKind::OnnxExternal)
        .map_err(|e| format!("external data `{location}`: {e}"))?;
    let size = opened.size;
    if offset
        .checked_add(needed as u64)
        .is_none_or(|end| end > size)
    {
        return Err(format!(
            "external data `{location}` is {size} bytes; {needed} bytes at offset {offset} do not fit"
        ));
    }
    let file = opened.file_mut();
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("external data `{location}`: {e}"))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(needed)
        .map_err(|_| format!("external data `{location}`: cannot allocate {needed} bytes"))?;
    // Exactly the tensor's bytes, however the file changes meanwhile.
    file.take(needed as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("external data `{location}`: {e}"))?;
    if bytes.len() != needed {
        return Err(format!(
            "external data `{location}` ended after {} of the {needed} bytes at offset {offset}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// A node attribute, as the importer uses it.
#[derive(Debug, Clone)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Str(String),
    Tensor(Tensor),
}

/// Converts one attribute; `dir` is where a tensor attribute's external data lies.
pub fn attribute(a: &AttributeProto, dir: Option<&Path>) -> Result<Attr, String> {
    let kind = a
        .type_
        .enum_value()
        .map_err(|code| format!("attribute `{}` has an unknown type (code {code})", a.name))?;
    Ok(match kind {
        AttributeType::INT => Attr::Int(a.i),
        AttributeType::FLOAT => Attr::Float(f64::from(a.f)),
        AttributeType::INTS => Attr::Ints(a.ints.clone()),
        AttributeType::FLOATS => Attr::Floats(a.floats.iter().map(|&f| f64::from(f)).collect()),
        AttributeType::STRING => Attr::Str(String::from_utf8_lossy(&a.s).into_owned()),
        AttributeType::TENSOR => match a.t.as_ref() {
            Some(t) => {
                Attr::Tensor(to_tensor(t, dir).map_err(|e| format!("attribute `{}`: {e}", a.name))?)
            }
            None => {
                return Err(format!(
                    "attribute `{}` declares a tensor but holds none",
                    a.name
                ));
            }
        },
        other => {
            return Err(format!(
                "attribute `{}` is of type {other:?}, which fusebox does not read",
                a.name
            ));
        }
    })
}

/// Reads a model file: the parsed model and its directory (for external data).
pub fn read_model(path: &Path) -> Result<ModelProto, String> {
    // A regular file of at most 2 GiB (protobuf's limit), opened without blocking.
    let bytes = crate::file_limits::read(path, crate::file_limits::FileKind::OnnxModel)
        .map_err(|e| format!("cannot read: {e}"))?;
    parse_model(&bytes)
}
