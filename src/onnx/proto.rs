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

/// Why a model file, one of its tensors or an attribute cannot be read: one variant per kind
/// of problem, each with what its message names. The importer wraps these in its own
/// [`ImportError`](super::ImportError), which places them at the initializer, input or node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The model file could not be read at all (missing, not a regular file, too big).
    #[error("cannot read: {0}")]
    Read(String),
    /// The bytes are not a protobuf message of the kind expected (`what`: model or tensor).
    #[error("not a readable ONNX {what}: {message}")]
    Decode { what: &'static str, message: String },
    /// An ONNX element type fusebox has no dtype for (by `TensorProto.DataType` code).
    #[error("element type {} is not one fusebox has", type_name(*.code))]
    ElementType { code: i32 },
    #[error("dimension {0} is negative")]
    NegativeDimension(i64),
    /// A declared shape past [`MAX_ELEMENTS`] (or past `usize`).
    #[error("shape {dims:?} has more than {MAX_ELEMENTS} elements")]
    TooManyElements { dims: Vec<i64> },
    #[error("segmented tensors are not supported")]
    Segmented,
    /// The typed data fields hold another number of values than the shape declares.
    #[error("shape {dims:?} needs {count} values, the tensor holds {found}")]
    ValueCount {
        dims: Vec<i64>,
        count: usize,
        found: usize,
    },
    #[error("shape {dims:?} does not fit its values")]
    ShapeMismatch { dims: Vec<i64> },
    /// An integer stored in a wider field (int32_data, uint64_data) than its dtype holds.
    #[error("value {value} is outside the range of {dtype}")]
    OutOfRange { dtype: DType, value: i64 },
    /// `raw_data` (or an external file's slice) of another length than the shape needs.
    #[error("{count} {dtype} values need {needed} bytes of data, found {found}")]
    RawLength {
        count: usize,
        dtype: DType,
        needed: usize,
        found: usize,
    },
    /// An external-data entry (`offset`, `length`) that is not a byte count.
    #[error("external data {key} `{value}` is not a byte count")]
    ExternalNumber { key: String, value: String },
    #[error("external data without a `location`")]
    ExternalNoLocation,
    #[error("external data, but the model was not read from a file")]
    ExternalNoDirectory,
    /// A location that is absolute, empty or climbs with `..`.
    #[error(
        "external data location `{location}` must be a relative path inside the model's directory"
    )]
    ExternalPath { location: String },
    /// A location that resolves (through symbolic links) outside the model's directory.
    #[error("external data location `{location}` leaves the model's directory")]
    ExternalLeaves { location: String },
    /// The model's directory itself cannot be resolved.
    #[error("{dir}: {message}")]
    Directory { dir: String, message: String },
    /// Resolving, opening, seeking, reading or allocating for an external file failed.
    #[error("external data `{location}`: {message}")]
    ExternalIo { location: String, message: String },
    #[error("external data `{location}` declares {declared} bytes, the tensor needs {needed}")]
    ExternalLength {
        location: String,
        declared: u64,
        needed: usize,
    },
    #[error(
        "external data `{location}` is {size} bytes; {needed} bytes at offset {offset} do not fit"
    )]
    ExternalTooShort {
        location: String,
        size: u64,
        needed: usize,
        offset: u64,
    },
    /// The file ended (it shrank while read) before the tensor's bytes.
    #[error(
        "external data `{location}` ended after {read} of the {needed} bytes at offset {offset}"
    )]
    ExternalEnded {
        location: String,
        read: usize,
        needed: usize,
        offset: u64,
    },
    #[error("attribute `{name}` has an unknown type (code {code})")]
    AttributeCode { name: String, code: i32 },
    #[error("attribute `{name}` declares a tensor but holds none")]
    AttributeNoTensor { name: String },
    /// An attribute type fusebox does not read (graphs, sparse tensors, strings lists, …).
    #[error("attribute `{name}` is of type {kind}, which fusebox does not read")]
    AttributeType { name: String, kind: String },
    /// A tensor attribute whose tensor cannot be read.
    #[error("attribute `{name}`: {source}")]
    AttributeTensor {
        name: String,
        source: Box<ProtoError>,
    },
}

/// The fusebox dtype of an ONNX `TensorProto.DataType` code, or why there is none.
pub fn dtype_of(code: i32) -> Result<DType, ProtoError> {
    Ok(match code {
        1 => DType::F32,
        2 => DType::U8,
        3 => DType::I8,
        4 => DType::U16,
        5 => DType::I16,
        6 => DType::I32,
        12 => DType::U32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        16 => DType::BF16,
        other => return Err(ProtoError::ElementType { code: other }),
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
pub fn parse_model(bytes: &[u8]) -> Result<ModelProto, ProtoError> {
    ModelProto::parse_from_bytes(bytes).map_err(|e| ProtoError::Decode {
        what: "model",
        message: e.to_string(),
    })
}

/// Parses one serialized `TensorProto` (the `.pb` files of ONNX's test data sets).
pub fn parse_tensor(bytes: &[u8]) -> Result<TensorProto, ProtoError> {
    TensorProto::parse_from_bytes(bytes).map_err(|e| ProtoError::Decode {
        what: "tensor",
        message: e.to_string(),
    })
}

/// The element count of `dims`, refusing negative dimensions, overflow and sizes past
/// [`MAX_ELEMENTS`].
pub fn element_count(dims: &[i64]) -> Result<(Vec<usize>, usize), ProtoError> {
    let mut shape = Vec::with_capacity(dims.len());
    let mut count: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| ProtoError::NegativeDimension(d))?;
        count = count
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| ProtoError::TooManyElements {
                dims: dims.to_vec(),
            })?;
        shape.push(d);
    }
    Ok((shape, count))
}

/// Converts a tensor to a fusebox [`Tensor`]. `dir` is the model's directory, where external
/// data files are looked up.
pub fn to_tensor(t: &TensorProto, dir: Option<&Path>) -> Result<Tensor, ProtoError> {
    let dtype = dtype_of(t.data_type)?;
    let (shape, count) = element_count(&t.dims)?;
    if t.segment.is_some() {
        return Err(ProtoError::Segmented);
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
            // The narrower integers and bool are stored in int32_data too, uint32 in
            // uint64_data; a value outside the dtype's range is malformed.
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 | DType::Bool => {
                Elements::Ints(t.int32_data.iter().map(|&v| i64::from(v)).collect())
            }
            DType::U32 => Elements::Ints(
                t.uint64_data
                    .iter()
                    .map(|&v| i64::try_from(v).unwrap_or(i64::MAX))
                    .collect(),
            ),
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
        return Err(ProtoError::ValueCount {
            dims: t.dims.clone(),
            count,
            found: values.len(),
        });
    }
    if let (Elements::Ints(values), Some((lo, hi))) = (&values, dtype.int_range())
        && let Some(&bad) = values.iter().find(|&&v| v < lo || v > hi)
    {
        return Err(ProtoError::OutOfRange { dtype, value: bad });
    }
    let tensor = match values {
        Elements::Floats(values) => Tensor::from_values(dtype, &shape, values),
        Elements::Ints(values) => Tensor::from_ints(dtype, &shape, values),
    };
    tensor.ok_or_else(|| ProtoError::ShapeMismatch {
        dims: t.dims.clone(),
    })
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
        DType::Bool | DType::I8 | DType::U8 => 1,
        DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
        DType::I32 | DType::U32 | DType::F32 => 4,
        DType::I64 | DType::F64 => 8,
    }
}

/// Little-endian `raw_data` as elements; its length must be exactly `count` elements.
fn decode_raw(bytes: &[u8], dtype: DType, count: usize) -> Result<Elements, ProtoError> {
    let w = width(dtype);
    if bytes.len() != count * w {
        return Err(ProtoError::RawLength {
            count,
            dtype,
            needed: count * w,
            found: bytes.len(),
        });
    }
    let arr = |c: &[u8]| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..c.len()].copy_from_slice(c);
        a
    };
    let elements = bytes.chunks_exact(w).map(arr);
    Ok(match dtype {
        DType::Bool => Elements::Ints(elements.map(|a| i64::from(a[0] != 0)).collect()),
        DType::I8 => Elements::Ints(elements.map(|a| i64::from(a[0] as i8)).collect()),
        DType::U8 => Elements::Ints(elements.map(|a| i64::from(a[0])).collect()),
        DType::I16 => Elements::Ints(
            elements
                .map(|a| i64::from(i16::from_le_bytes([a[0], a[1]])))
                .collect(),
        ),
        DType::U16 => Elements::Ints(
            elements
                .map(|a| i64::from(u16::from_le_bytes([a[0], a[1]])))
                .collect(),
        ),
        DType::I32 => Elements::Ints(
            elements
                .map(|a| i64::from(i32::from_le_bytes([a[0], a[1], a[2], a[3]])))
                .collect(),
        ),
        DType::U32 => Elements::Ints(
            elements
                .map(|a| i64::from(u32::from_le_bytes([a[0], a[1], a[2], a[3]])))
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
fn read_external(
    t: &TensorProto,
    dir: Option<&Path>,
    needed: usize,
) -> Result<Vec<u8>, ProtoError> {
    let mut location = None;
    let mut offset: u64 = 0;
    let mut length: Option<u64> = None;
    for entry in &t.external_data {
        let number = |v: &str| {
            v.parse::<u64>().map_err(|_| ProtoError::ExternalNumber {
                key: entry.key.clone(),
                value: v.to_string(),
            })
        };
        match entry.key.as_str() {
            "location" => location = Some(entry.value.clone()),
            "offset" => offset = number(&entry.value)?,
            "length" => length = Some(number(&entry.value)?),
            _ => {}
        }
    }
    let location = location.ok_or(ProtoError::ExternalNoLocation)?;
    let dir = dir.ok_or(ProtoError::ExternalNoDirectory)?;
    let io = |message: String| ProtoError::ExternalIo {
        location: location.clone(),
        message,
    };
    let relative = Path::new(&location);
    if relative.as_os_str().is_empty()
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(ProtoError::ExternalPath {
            location: location.clone(),
        });
    }
    let path = dir.join(relative);
    // A symbolic link inside the directory may still point out of it: compare real paths.
    let real_dir = dir.canonicalize().map_err(|e| ProtoError::Directory {
        dir: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let real = path.canonicalize().map_err(|e| io(e.to_string()))?;
    if !real.starts_with(&real_dir) {
        return Err(ProtoError::ExternalLeaves {
            location: location.clone(),
        });
    }
    if let Some(length) = length
        && length != needed as u64
    {
        return Err(ProtoError::ExternalLength {
            location: location.clone(),
            declared: length,
            needed,
        });
    }
    // A regular file within the external-data limit, opened without blocking: a FIFO planted
    // as external data is refused, not waited on.
    let mut opened = crate::file_limits::open(&real, crate::file_limits::FileKind::OnnxExternal)
        .map_err(|e| io(e.to_string()))?;
    let size = opened.size;
    if offset
        .checked_add(needed as u64)
        .is_none_or(|end| end > size)
    {
        return Err(ProtoError::ExternalTooShort {
            location: location.clone(),
            size,
            needed,
            offset,
        });
    }
    let file = opened.file_mut();
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| io(e.to_string()))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(needed)
        .map_err(|_| io(format!("cannot allocate {needed} bytes")))?;
    // Exactly the tensor's bytes, however the file changes meanwhile.
    file.take(needed as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| io(e.to_string()))?;
    if bytes.len() != needed {
        return Err(ProtoError::ExternalEnded {
            location: location.clone(),
            read: bytes.len(),
            needed,
            offset,
        });
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
    Strs(Vec<String>),
    Tensor(Tensor),
}

/// Converts one attribute; `dir` is where a tensor attribute's external data lies.
pub fn attribute(a: &AttributeProto, dir: Option<&Path>) -> Result<Attr, ProtoError> {
    let kind = a
        .type_
        .enum_value()
        .map_err(|code| ProtoError::AttributeCode {
            name: a.name.clone(),
            code,
        })?;
    Ok(match kind {
        AttributeType::INT => Attr::Int(a.i),
        AttributeType::FLOAT => Attr::Float(f64::from(a.f)),
        AttributeType::INTS => Attr::Ints(a.ints.clone()),
        AttributeType::FLOATS => Attr::Floats(a.floats.iter().map(|&f| f64::from(f)).collect()),
        AttributeType::STRING => Attr::Str(String::from_utf8_lossy(&a.s).into_owned()),
        AttributeType::STRINGS => Attr::Strs(
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect(),
        ),
        AttributeType::TENSOR => match a.t.as_ref() {
            Some(t) => {
                Attr::Tensor(to_tensor(t, dir).map_err(|e| ProtoError::AttributeTensor {
                    name: a.name.clone(),
                    source: Box::new(e),
                })?)
            }
            None => {
                return Err(ProtoError::AttributeNoTensor {
                    name: a.name.clone(),
                });
            }
        },
        other => {
            return Err(ProtoError::AttributeType {
                name: a.name.clone(),
                kind: format!("{other:?}"),
            });
        }
    })
}

/// Reads a model file: the parsed model and its directory (for external data).
pub fn read_model(path: &Path) -> Result<ModelProto, ProtoError> {
    // A regular file of at most 2 GiB (protobuf's limit), opened without blocking.
    let bytes = crate::file_limits::read(path, crate::file_limits::FileKind::OnnxModel)
        .map_err(|e| ProtoError::Read(e.to_string()))?;
    parse_model(&bytes)
}
