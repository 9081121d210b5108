//! Tensors as the reference evaluator holds them, and their `.npy` files.
//!
//! Integer tensors (`i32`, `i64`) hold their elements as `i64`, every other dtype as `f64`
//! already rounded to the tensor's dtype: f64 holds every f32, f16, bf16 and bool value
//! exactly, and i64 holds every integer value exactly, so each tensor has one exact
//! representation and the only rounding is the one each op's dtype implies. Integers never
//! pass through f64 on their way through the evaluator: an `i64` beyond 2^53 keeps every bit,
//! and integer arithmetic wraps as NumPy's does.

use crate::dtype::{Category, DType};
use crate::shape::{Shape, numel};
use ndarray::{ArrayD, IxDyn};
use rand::{Rng, RngExt, SeedableRng};
use std::borrow::Cow;
use std::io::{BufReader, BufWriter};
use std::path::Path;

/// An allocation the system refused, named by its size: values come from user input, and an
/// abort is never the answer to one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The elements of a value of `shape`.
    #[error("cannot allocate {bytes} bytes for a value of shape {shape:?}")]
    Value { bytes: usize, shape: Shape },
    /// The room computing a value of `shape` takes (see [`probe_allocation`]).
    #[error("cannot allocate the {bytes} bytes that computing a value of shape {shape:?} takes")]
    WorkingSet { bytes: usize, shape: Shape },
    /// A runtime buffer whose byte count overflows.
    #[error("a {dtype} buffer of shape {shape:?} is too large")]
    BufferTooLarge { dtype: DType, shape: Shape },
    /// A runtime buffer.
    #[error("cannot allocate {bytes} bytes for a {dtype} buffer of shape {shape:?}")]
    Buffer {
        bytes: usize,
        dtype: DType,
        shape: Shape,
    },
}

/// Why a `.npy` file cannot be read or written: the problem, after the file's name.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct NpyError {
    /// The file as messages name it (as the user wrote it, or its path).
    pub file: String,
    pub problem: NpyProblem,
}

/// What is wrong with a `.npy` file.
#[derive(Debug, thiserror::Error)]
pub enum NpyProblem {
    /// Not a file fusebox reads as a value file (see [`crate::file_limits`]).
    #[error(transparent)]
    File(crate::file_limits::FileError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(
        "the header length field says {header_len} bytes, more than the {MAX_NPY_HEADER} a .npy header may take"
    )]
    HeaderTooLong { header_len: u64 },
    #[error("the header length field says {header_len} bytes but the file has only {size}")]
    HeaderPastEnd { header_len: u64, size: u64 },
    #[error(
        "the header's shape has {rank} axes, more than {}, the most a shape may have",
        crate::shape::MAX_RANK
    )]
    TooManyAxes { rank: usize },
    #[error("shape {dims:?} in the header is too large for any array")]
    TooLarge { dims: Vec<usize> },
    /// npyz cannot parse it.
    #[error("not a readable .npy file: {0}")]
    Unreadable(std::io::Error),
    #[error("Fortran-ordered arrays are not supported; save with np.ascontiguousarray")]
    Fortran,
    #[error("structured arrays are not supported")]
    Structured,
    #[error("shape {shape:?} needs {needed} bytes of data but the file holds {have}")]
    Truncated {
        shape: Shape,
        needed: usize,
        have: u64,
    },
    #[error("data does not match shape {shape:?}")]
    Mismatch { shape: Shape },
    /// The dtype's NumPy description (`|u1`).
    #[error("unsupported .npy dtype {0}; use bool, int32, int64, float16, float32 or float64")]
    UnsupportedDType(String),
}

/// Why a value read from a file cannot serve an input as declared (see
/// [`Tensor::into_declared`]); `file` names the value as messages do (``"`w.npy`"``).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeclaredError {
    /// Another kind of value (bool, integer, float) than the input declares.
    #[error(
        "{file} holds {held} values but input `{input}` is declared {declared}; a value file \
         must hold the kind of value its input declares (bool, integer or float): convert it \
         first (NumPy's `astype`) if that is what you mean"
    )]
    Kind {
        file: String,
        held: DType,
        input: String,
        declared: DType,
    },
    #[error("{file}: {error}")]
    Alloc { file: String, error: AllocError },
    /// A value (element `index`) that the declared dtype cannot hold.
    #[error(
        "{file} holds {value} (element {index}), outside the range of {declared}, the dtype \
         input `{input}` declares"
    )]
    Range {
        file: String,
        value: String,
        index: usize,
        declared: DType,
        input: String,
    },
}

/// A tensor's elements: `Int` exactly for the integer dtypes, `Float` for the others.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// Floats and bools (0 or 1), each exactly representable in the tensor's dtype.
    Float(ArrayD<f64>),
    /// `i32` and `i64` values, each within the tensor's dtype (an `i32` tensor holds only
    /// values in `i32`'s range).
    Int(ArrayD<i64>),
}

impl Data {
    pub fn shape(&self) -> &[usize] {
        match self {
            Data::Float(a) => a.shape(),
            Data::Int(a) => a.shape(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Data::Float(a) => a.len(),
            Data::Int(a) => a.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dtype-tagged array.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    /// The elements; `Data::Int` exactly when `dtype` is an integer type.
    pub data: Data,
}

/// `v` in `dtype`'s range by two's-complement wrap-around (an `i32` keeps the low 32 bits, as
/// NumPy's `astype` does); identity for `i64` and for non-integer dtypes.
pub fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I8 => i64::from(v as i8),
        DType::U8 => i64::from(v as u8),
        DType::I16 => i64::from(v as i16),
        DType::U16 => i64::from(v as u16),
        DType::I32 => i64::from(v as i32),
        DType::U32 => i64::from(v as u32),
        _ => v,
    }
}

/// An integer converted to a non-integer `dtype`: to the nearest f64 (the one rounding for
/// f64; ties to even), then rounded to `dtype`. Going through f64 rounds only once in effect:
/// f64's 53 bits are more than twice f32's 24 plus 2, so the second rounding cannot differ
/// from rounding the integer directly.
pub fn int_to_float(dtype: DType, v: i64) -> f64 {
    dtype.round(v as f64)
}

/// A float or bool value converted to an integer `dtype` as a cast does: truncated toward
/// zero and saturated, NaN becoming 0 ([`DType::round`]).
pub fn float_to_int(dtype: DType, v: f64) -> i64 {
    match dtype {
        DType::I8 => i64::from(v as i8),
        DType::U8 => i64::from(v as u8),
        DType::I16 => i64::from(v as i16),
        DType::U16 => i64::from(v as u16),
        DType::I32 => i64::from(v as i32),
        DType::U32 => i64::from(v as u32),
        _ => v as i64,
    }
}

impl Tensor {
    /// Builds a tensor, rounding each value to `dtype` (integer dtypes truncate and saturate,
    /// see [`float_to_int`]); `None` if the value count does not match the shape.
    pub fn from_values(dtype: DType, shape: &[usize], values: Vec<f64>) -> Option<Tensor> {
        let data = ArrayD::from_shape_vec(IxDyn(shape), values).ok()?;
        Some(Tensor::from_array(dtype, data))
    }

    /// Builds a tensor of integers, wrapping each to `dtype` (see [`Tensor::from_int_array`]);
    /// `None` if the value count does not match the shape.
    pub fn from_ints(dtype: DType, shape: &[usize], values: Vec<i64>) -> Option<Tensor> {
        let data = ArrayD::from_shape_vec(IxDyn(shape), values).ok()?;
        Some(Tensor::from_int_array(dtype, data))
    }

    /// Rounds every element of `data` to `dtype`. Aborts like any allocation if an integer
    /// `dtype` needs a new array the system refuses; paths that user input reaches use
    /// [`Tensor::try_from_array`].
    pub fn from_array(dtype: DType, data: ArrayD<f64>) -> Tensor {
        Tensor::try_from_array(dtype, data).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Rounds every element of `data` to `dtype`; an error names the size of the integer
    /// array an integer `dtype` needs, if the system refuses it (floats round in place).
    pub fn try_from_array(dtype: DType, mut data: ArrayD<f64>) -> Result<Tensor, AllocError> {
        if dtype.category() == Category::Integer {
            return Ok(Tensor {
                dtype,
                data: Data::Int(try_map(&data, |v| float_to_int(dtype, v))?),
            });
        }
        // f32, the common case, with its rounding spelled out so that the loop is a plain
        // conversion rather than a dtype match per element.
        match dtype {
            DType::F64 => {}
            DType::F32 => data.mapv_inplace(|v| v as f32 as f64),
            _ => data.mapv_inplace(|v| dtype.round(v)),
        }
        Ok(Tensor {
            dtype,
            data: Data::Float(data),
        })
    }

    /// Converts exact integers to `dtype` (see [`Tensor::try_from_int_array`]); aborts like
    /// any allocation if a non-integer `dtype` needs an array the system refuses.
    pub fn from_int_array(dtype: DType, data: ArrayD<i64>) -> Tensor {
        Tensor::try_from_int_array(dtype, data).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Converts exact integers to `dtype`: wrapping for integer dtypes (in place), rounding to
    /// nearest for floats, `v != 0` for bool; an error names the size of the float array a
    /// non-integer `dtype` needs, if the system refuses it.
    pub fn try_from_int_array(dtype: DType, mut data: ArrayD<i64>) -> Result<Tensor, AllocError> {
        Ok(match dtype.category() {
            Category::Integer => {
                if dtype != DType::I64 {
                    data.mapv_inplace(|v| wrap_int(dtype, v));
                }
                Tensor {
                    dtype,
                    data: Data::Int(data),
                }
            }
            _ => Tensor {
                dtype,
                data: Data::Float(try_map(&data, |v| int_to_float(dtype, v))?),
            },
        })
    }

    pub fn scalar(dtype: DType, value: f64) -> Tensor {
        Tensor::from_array(dtype, ArrayD::from_elem(IxDyn(&[]), value))
    }

    pub fn shape(&self) -> &[usize] {
        self.data.shape()
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements as f64: borrowed for floats and bools; for integers a converted copy,
    /// rounded to nearest beyond 2^53 (for statistics and tolerant comparisons, never for
    /// arithmetic on integer values).
    pub fn floats(&self) -> Cow<'_, ArrayD<f64>> {
        match &self.data {
            Data::Float(a) => Cow::Borrowed(a),
            Data::Int(a) => Cow::Owned(a.mapv(|v| v as f64)),
        }
    }

    /// The elements of a float or bool tensor, to modify in place; `None` for integers (whose
    /// elements are [`Data::Int`]).
    pub fn floats_mut(&mut self) -> Option<&mut ArrayD<f64>> {
        match &mut self.data {
            Data::Float(a) => Some(a),
            Data::Int(_) => None,
        }
    }

    /// The elements as exact integers: borrowed for integer dtypes; for bools 0 and 1; for
    /// floats converted as a cast to `i64` does (truncated, saturated, NaN → 0).
    pub fn ints(&self) -> Cow<'_, ArrayD<i64>> {
        match &self.data {
            Data::Int(a) => Cow::Borrowed(a),
            Data::Float(a) => Cow::Owned(a.mapv(|v| float_to_int(DType::I64, v))),
        }
    }

    /// Values in row-major order as f64 (integers beyond 2^53 rounded, see [`Tensor::floats`]).
    pub fn values(&self) -> Vec<f64> {
        self.floats().iter().copied().collect()
    }

    /// Values in row-major order as exact integers (see [`Tensor::ints`]).
    pub fn int_values(&self) -> Vec<i64> {
        self.ints().iter().copied().collect()
    }

    /// This tensor converted to `dtype` as the `cast` op converts: integers wrap to a
    /// narrower integer type and round to nearest into a float, floats truncate and saturate
    /// into an integer type (NaN → 0), bool is `v != 0`. The converted copy is allocated
    /// fallibly: an error names its size where the system refuses it (values come from user
    /// input, and an abort is never the answer to one).
    pub fn cast(&self, dtype: DType) -> Result<Tensor, AllocError> {
        if dtype == self.dtype {
            return self.try_clone();
        }
        match &self.data {
            Data::Int(a) => Tensor::try_from_int_array(dtype, try_map(a, |v| v)?),
            Data::Float(a) => Tensor::try_from_array(dtype, try_map(a, |v| v)?),
        }
    }

    /// This tensor in `dtype`, converted as [`Tensor::cast`] converts, without a copy when it
    /// already has that dtype.
    pub fn into_dtype(self, dtype: DType) -> Result<Tensor, AllocError> {
        if dtype == self.dtype {
            return Ok(self);
        }
        match self.data {
            Data::Int(a) => Tensor::try_from_int_array(dtype, a),
            Data::Float(a) => Tensor::try_from_array(dtype, a),
        }
    }

    /// A copy, or an error naming its size when the system refuses the allocation.
    pub fn try_clone(&self) -> Result<Tensor, AllocError> {
        Ok(Tensor {
            dtype: self.dtype,
            data: match &self.data {
                Data::Int(a) => Data::Int(try_map(a, |v| v)?),
                Data::Float(a) => Data::Float(try_map(a, |v| v)?),
            },
        })
    }

    /// The same elements rearranged by `f`, which must not look at values (a layout op).
    pub fn map_layout<E>(
        &self,
        f_float: impl FnOnce(&ArrayD<f64>) -> Result<ArrayD<f64>, E>,
        f_int: impl FnOnce(&ArrayD<i64>) -> Result<ArrayD<i64>, E>,
    ) -> Result<Tensor, E> {
        Ok(Tensor {
            dtype: self.dtype,
            data: match &self.data {
                Data::Float(a) => Data::Float(f_float(a)?),
                Data::Int(a) => Data::Int(f_int(a)?),
            },
        })
    }

    /// Reads a `.npy` file (little- or big-endian bool, i32, i64, f16, f32 or f64). The file
    /// must be a regular file of at most [`crate::file_limits::MAX_NPY_FILE`] bytes: a FIFO or
    /// a link to a device is refused, not read without end.
    pub fn read_npy(path: &Path) -> Result<Tensor, NpyError> {
        Tensor::read_npy_named(path, &path.display().to_string())
    }

    /// [`Tensor::read_npy`], with errors naming the file `name` (how the user wrote it, where
    /// `path` is where it was found).
    pub fn read_npy_named(path: &Path, name: &str) -> Result<Tensor, NpyError> {
        let fail = |problem: NpyProblem| NpyError {
            file: name.to_string(),
            problem,
        };
        let mut opened = crate::file_limits::open(path, crate::file_limits::FileKind::Npy)
            .map_err(|e| fail(NpyProblem::File(e)))?;
        let size = opened.size;
        let file = opened.file_mut();
        let data_bytes = check_npy_header(file, size).map_err(fail)?;
        check_npy_shape(file).map_err(fail)?;
        let npy = npyz::NpyFile::new(BufReader::new(opened))
            .map_err(|e| fail(NpyProblem::Unreadable(e)))?;
        if npy.order() != npyz::Order::C {
            return Err(fail(NpyProblem::Fortran));
        }
        let shape: Shape = npy.shape().iter().map(|&d| d as usize).collect();
        let npyz::DType::Plain(ty) = npy.dtype() else {
            return Err(fail(NpyProblem::Structured));
        };
        // npyz reserves room for every element before reading any: a header that promises
        // more data than the file holds must fail here, not in the allocator.
        let needed =
            crate::shape::checked_numel(&shape).and_then(|n| n.checked_mul(ty.num_bytes()?));
        if let (Some(have), Some(needed)) = (data_bytes, needed)
            && (needed as u64) > have
        {
            return Err(fail(NpyProblem::Truncated {
                shape,
                needed,
                have,
            }));
        }
        use npyz::TypeChar as C;
        let read_err = |e: std::io::Error| fail(NpyProblem::Io(e));
        let mismatch = || {
            fail(NpyProblem::Mismatch {
                shape: shape.clone(),
            })
        };
        // Integers go straight to exact storage: every i64 is read, none refused or rounded.
        let ints = |dtype: DType, values: Vec<i64>| {
            Tensor::from_ints(dtype, &shape, values).ok_or_else(mismatch)
        };
        let (dtype, values): (DType, Vec<f64>) = match (ty.type_char(), ty.size_field()) {
            (C::Bool, 1) => (
                DType::Bool,
                npy.into_vec::<bool>()
                    .map_err(read_err)?
                    .into_iter()
                    .map(|b| if b { 1.0 } else { 0.0 })
                    .collect(),
            ),
            (C::Int, 1) => {
                let raw = npy.into_vec::<i8>().map_err(read_err)?;
                return ints(DType::I8, raw.into_iter().map(i64::from).collect());
            }
            (C::Int, 2) => {
                let raw = npy.into_vec::<i16>().map_err(read_err)?;
                return ints(DType::I16, raw.into_iter().map(i64::from).collect());
            }
            (C::Int, 4) => {
                let raw = npy.into_vec::<i32>().map_err(read_err)?;
                return ints(DType::I32, raw.into_iter().map(i64::from).collect());
            }
            (C::Uint, 1) => {
                let raw = npy.into_vec::<u8>().map_err(read_err)?;
                return ints(DType::U8, raw.into_iter().map(i64::from).collect());
            }
            (C::Uint, 2) => {
                let raw = npy.into_vec::<u16>().map_err(read_err)?;
                return ints(DType::U16, raw.into_iter().map(i64::from).collect());
            }
            (C::Uint, 4) => {
                let raw = npy.into_vec::<u32>().map_err(read_err)?;
                return ints(DType::U32, raw.into_iter().map(i64::from).collect());
            }
            (C::Int, 8) => return ints(DType::I64, npy.into_vec::<i64>().map_err(read_err)?),
            (C::Float, 2) => (
                DType::F16,
                npy.into_vec::<half::f16>()
                    .map_err(read_err)?
                    .into_iter()
                    .map(f64::from)
                    .collect(),
            ),
            (C::Float, 4) => (
                DType::F32,
                npy.into_vec::<f32>()
                    .map_err(read_err)?
                    .into_iter()
                    .map(f64::from)
                    .collect(),
            ),
            (C::Float, 8) => (DType::F64, npy.into_vec::<f64>().map_err(read_err)?),
            _ => {
                return Err(fail(NpyProblem::UnsupportedDType(
                    npyz::DType::Plain(ty.clone()).descr(),
                )));
            }
        };
        Tensor::from_values(dtype, &shape, values).ok_or_else(mismatch)
    }

    /// This value, read from a value file, as the value of input `input` declared `dtype`;
    /// `file` names the file in messages (``"`w.npy`"``, ``"stored value `w.npy`"``).
    ///
    /// Within a kind of value (bool, integer, float) the file converts: integers exactly, so a
    /// value outside the declared type's range is refused rather than wrapped, and floats by
    /// rounding, so a finite value beyond the declared type's range is refused rather than made
    /// infinite (an `f32` file serves a `bf16` input: NumPy has no bf16). Across kinds it is
    /// refused: a float file for an integer input would be truncated without a word (NaN → 0,
    /// 1e20 → `i64::MAX`), an integer file for a bool input would lose every value but zero.
    pub fn into_declared(
        self,
        dtype: DType,
        file: &str,
        input: &str,
    ) -> Result<Tensor, DeclaredError> {
        if self.dtype == dtype {
            return Ok(self);
        }
        if self.dtype.category() != dtype.category() {
            return Err(DeclaredError::Kind {
                file: file.to_string(),
                held: self.dtype,
                input: input.to_string(),
                declared: dtype,
            });
        }
        let converted = self.cast(dtype).map_err(|error| DeclaredError::Alloc {
            file: file.to_string(),
            error,
        })?;
        let lost = match (&self.data, &converted.data) {
            (Data::Int(from), Data::Int(to)) => from
                .iter()
                .zip(to.iter())
                .position(|(a, b)| a != b)
                .map(|i| (i, from.iter().nth(i).map(i64::to_string))),
            (Data::Float(from), Data::Float(to)) => from
                .iter()
                .zip(to.iter())
                .position(|(a, b)| a.is_finite() && !b.is_finite())
                .map(|i| (i, from.iter().nth(i).map(|v| format!("{v:e}")))),
            _ => None,
        };
        if let Some((index, Some(value))) = lost {
            return Err(DeclaredError::Range {
                file: file.to_string(),
                value,
                index,
                declared: dtype,
                input: input.to_string(),
            });
        }
        Ok(converted)
    }

    /// Writes a `.npy` file NumPy reads natively: bf16, which NumPy lacks, is written as
    /// float32 (exactly, every bf16 value is an f32 value).
    pub fn write_npy(&self, path: &Path) -> Result<(), NpyError> {
        let err = |e: std::io::Error| NpyError {
            file: path.display().to_string(),
            problem: NpyProblem::Io(e),
        };
        let file = std::fs::File::create(path).map_err(err)?;
        let shape: Vec<u64> = self.shape().iter().map(|&d| d as u64).collect();
        let out = BufWriter::new(file);
        if let Data::Int(ints) = &self.data {
            let ints = ints.iter().copied();
            return match self.dtype {
                // A tensor holds only values of its dtype, so the narrowing is exact.
                DType::I8 => write_values(out, &shape, ints.map(|v| v as i8)),
                DType::U8 => write_values(out, &shape, ints.map(|v| v as u8)),
                DType::I16 => write_values(out, &shape, ints.map(|v| v as i16)),
                DType::U16 => write_values(out, &shape, ints.map(|v| v as u16)),
                DType::I32 => write_values(out, &shape, ints.map(|v| v as i32)),
                DType::U32 => write_values(out, &shape, ints.map(|v| v as u32)),
                _ => write_values(out, &shape, ints),
            }
            .map_err(err);
        }
        let floats = self.floats();
        let values = floats.iter().copied();
        match self.dtype {
            DType::Bool => write_values(out, &shape, values.map(|v| v != 0.0)),
            // Only a hand-built tensor pairs an integer dtype with floats: convert as a cast.
            DType::I8 => write_values(out, &shape, values.map(|v| v as i8)),
            DType::U8 => write_values(out, &shape, values.map(|v| v as u8)),
            DType::I16 => write_values(out, &shape, values.map(|v| v as i16)),
            DType::U16 => write_values(out, &shape, values.map(|v| v as u16)),
            DType::I32 => write_values(out, &shape, values.map(|v| v as i32)),
            DType::U32 => write_values(out, &shape, values.map(|v| v as u32)),
            DType::I64 => write_values(out, &shape, values.map(|v| v as i64)),
            DType::F16 => write_values(out, &shape, values.map(half::f16::from_f64)),
            DType::BF16 | DType::F32 => write_values(out, &shape, values.map(|v| v as f32)),
            DType::F64 => write_values(out, &shape, values),
        }
        .map_err(err)
    }

    /// Deterministic random values for `dtype` and `shape`: floats uniform in [-3, 3] (wide
    /// enough to exercise both tails of sigmoid and tanh, small enough not to overflow exp in
    /// f16), integers in [-10, 10] ([0, 20] unsigned), bools fair. Aborts like any allocation if the system
    /// refuses the values; `--random-inputs` uses [`Tensor::try_random`].
    pub fn random(dtype: DType, shape: &[usize], rng: &mut impl Rng) -> Tensor {
        Tensor::try_random(dtype, shape, rng).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::random`], or an error naming the size when the system refuses the values.
    pub fn try_random(
        dtype: DType,
        shape: &[usize],
        rng: &mut impl Rng,
    ) -> Result<Tensor, AllocError> {
        let len = numel(shape);
        if dtype.category() == Category::Integer {
            let mut values = try_vec(len, shape)?;
            // Unsigned dtypes draw from 0 to 20 instead.
            let low = if dtype.is_unsigned() { 0i32 } else { -10 };
            values.extend((0..len).map(|_| i64::from(rng.random_range(low..=low + 20))));
            return Tensor::try_from_int_array(dtype, shaped(shape, values));
        }
        let mut values = try_vec(len, shape)?;
        values.extend((0..len).map(|_| match dtype.category() {
            Category::Bool => f64::from(u8::from(rng.random::<bool>())),
            _ => rng.random_range(-3.0..=3.0),
        }));
        Tensor::try_from_array(dtype, shaped(shape, values))
    }
}

/// An empty vector with room for the `len` elements of a value of `shape`, or an error naming
/// the size when the system refuses the allocation (where `Vec::with_capacity` would abort
/// the process).
pub fn try_vec<T>(len: usize, shape: &[usize]) -> Result<Vec<T>, AllocError> {
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|_| AllocError::Value {
            bytes: len.saturating_mul(size_of::<T>()),
            shape: shape.to_vec(),
        })?;
    Ok(values)
}

/// Asks the system for `bytes` of address space and gives it straight back: an error naming
/// the size when it is refused. The reference evaluator probes each op's working set so
/// before computing it, so that the allocations inside the op (ndarray's, which abort on
/// failure) find the room there; untouched, the probe costs no memory.
pub fn probe_allocation(bytes: usize, shape: &[usize]) -> Result<(), AllocError> {
    let mut room: Vec<u8> = Vec::new();
    room.try_reserve_exact(bytes)
        .map_err(|_| AllocError::WorkingSet {
            bytes,
            shape: shape.to_vec(),
        })
}

/// `values` (row-major, as many as `shape` holds) as an array of `shape`.
fn shaped<T>(shape: &[usize], values: Vec<T>) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(shape), values).expect("as many values as the shape holds")
}

/// `f` of every element of `a`, in a new row-major array allocated fallibly (see
/// [`try_vec`]); `ndarray`'s `mapv` would abort where the system refuses the allocation.
pub fn try_map<A: Copy, B>(
    a: &ArrayD<A>,
    mut f: impl FnMut(A) -> B,
) -> Result<ArrayD<B>, AllocError> {
    let mut values = try_vec(a.len(), a.shape())?;
    match a.as_slice() {
        Some(slice) => values.extend(slice.iter().map(|&v| f(v))),
        None => values.extend(a.iter().map(|&v| f(v))),
    }
    Ok(shaped(a.shape(), values))
}

/// The most bytes a `.npy` header may take. NumPy's own reader refuses headers over 10 000
/// bytes by default; npyz allocates whatever the length field says before reading, so a
/// 13-byte file claiming a 4 GiB header must be refused here.
const MAX_NPY_HEADER: u64 = 1 << 16;

/// Checks a `.npy` file's preamble (magic, version, header length) against the file's size
/// (`size`, from the open handle), then rewinds. Returns how many bytes follow the header (the
/// data), or `None` when the preamble is not one this check reads (npyz then reports the file
/// as unreadable).
fn check_npy_header(file: &mut std::fs::File, size: u64) -> Result<Option<u64>, NpyProblem> {
    use std::io::{Read, Seek};
    let mut head = Vec::new();
    file.by_ref().take(12).read_to_end(&mut head)?;
    file.rewind()?;
    if head.len() < 10 || !head.starts_with(b"\x93NUMPY") {
        return Ok(None);
    }
    let (prefix, header_len) = match head[6] {
        1 => (10u64, u64::from(u16::from_le_bytes([head[8], head[9]]))),
        2 | 3 if head.len() == 12 => (
            12,
            u64::from(u32::from_le_bytes([head[8], head[9], head[10], head[11]])),
        ),
        _ => return Ok(None),
    };
    if header_len > MAX_NPY_HEADER {
        return Err(NpyProblem::HeaderTooLong { header_len });
    }
    let data_start = prefix + header_len;
    if data_start > size {
        return Err(NpyProblem::HeaderPastEnd { header_len, size });
    }
    Ok(Some(size - data_start))
}

/// Refuses a `.npy` header whose shape has no representable element count, then rewinds.
///
/// npyz multiplies the header's dims unchecked, which panics on overflow in debug builds, so
/// such a header must not reach it. Headers this scan cannot read are left to npyz to reject.
fn check_npy_shape(file: &mut std::fs::File) -> Result<(), NpyProblem> {
    use std::io::{Read, Seek};
    let mut head = Vec::new();
    file.by_ref().take(1 << 16).read_to_end(&mut head)?;
    file.rewind()?;
    let text = String::from_utf8_lossy(&head);
    let Some(at) = text.find("'shape'").or_else(|| text.find("\"shape\"")) else {
        return Ok(());
    };
    let rest = &text[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        return Ok(());
    };
    if close < open {
        return Ok(());
    }
    let dims: Option<Vec<usize>> = rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_end_matches('L').parse().ok())
        .collect();
    match dims {
        Some(dims) if dims.len() > crate::shape::MAX_RANK => {
            Err(NpyProblem::TooManyAxes { rank: dims.len() })
        }
        Some(dims) if crate::shape::checked_numel(&dims).is_none() => {
            Err(NpyProblem::TooLarge { dims })
        }
        _ => Ok(()),
    }
}

/// A seeded generator for reproducible random inputs.
pub fn seeded_rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

fn write_values<T: npyz::AutoSerialize>(
    out: impl std::io::Write,
    shape: &[u64],
    values: impl Iterator<Item = T>,
) -> std::io::Result<()> {
    use npyz::WriterBuilder;
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(out)
        .begin_nd()?;
    writer.extend(values)?;
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trips_every_dtype() {
        let dir = std::env::temp_dir().join(format!("fusebox-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for dtype in DType::ALL {
            let values = vec![1.5, -0.0, 3.0, 0.0, -2.0, 1.0];
            let t = Tensor::from_values(dtype, &[2, 3], values).unwrap();
            let path = dir.join(format!("{dtype}.npy"));
            t.write_npy(&path).unwrap();
            let back = Tensor::read_npy(&path).unwrap();
            let expected_dtype = if dtype == DType::BF16 {
                DType::F32
            } else {
                dtype
            };
            assert_eq!(back.dtype, expected_dtype);
            assert_eq!(back.shape(), &[2, 3]);
            assert_eq!(back.values(), t.values(), "{dtype}");
        }
        let empty = Tensor::from_values(DType::F32, &[0, 4], vec![]).unwrap();
        empty.write_npy(&dir.join("empty.npy")).unwrap();
        assert_eq!(
            Tensor::read_npy(&dir.join("empty.npy")).unwrap().shape(),
            &[0, 4]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// i64 values beyond 2^53 used to be refused on reading: every i64, the extremes
    /// included, must come back bit for bit, and an i32 file keeps its extremes too.
    #[test]
    fn npy_i64_extremes_round_trip() {
        let dir = std::env::temp_dir().join(format!("fusebox-npy-ints-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = vec![i64::MIN, i64::MAX, (1 << 53) + 1, -(1 << 53) - 1, 0, -1];
        let t = Tensor::from_ints(DType::I64, &[2, 3], big.clone()).unwrap();
        let path = dir.join("i64.npy");
        t.write_npy(&path).unwrap();
        let back = Tensor::read_npy(&path).unwrap();
        assert_eq!(back.dtype, DType::I64);
        assert_eq!(back.int_values(), big);
        let small = vec![i64::from(i32::MIN), i64::from(i32::MAX), -7];
        let t = Tensor::from_ints(DType::I32, &[3], small.clone()).unwrap();
        t.write_npy(&dir.join("i32.npy")).unwrap();
        assert_eq!(
            Tensor::read_npy(&dir.join("i32.npy")).unwrap().int_values(),
            small
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Casts between integer widths wrap (NumPy's `astype`), floats truncate and saturate
    /// into integers, and integers round to nearest into floats.
    #[test]
    fn casts_follow_numpy_between_integers() {
        let t = Tensor::from_ints(
            DType::I64,
            &[3],
            vec![(1 << 32) + 5, i64::MAX, -(1 << 31) - 1],
        )
        .unwrap();
        assert_eq!(
            t.cast(DType::I32).unwrap().int_values(),
            vec![5, -1, i64::from(i32::MAX)]
        );
        let f = Tensor::from_values(DType::F64, &[3], vec![-2.7, 1e300, f64::NAN]).unwrap();
        assert_eq!(
            f.cast(DType::I32).unwrap().int_values(),
            vec![-2, i64::from(i32::MAX), 0]
        );
        let odd = Tensor::from_ints(DType::I64, &[1], vec![(1 << 53) + 1]).unwrap();
        assert_eq!(odd.cast(DType::F64).unwrap().values(), vec![2f64.powi(53)]);
    }

    #[test]
    fn garbage_npy_is_an_error() {
        let path = std::env::temp_dir().join(format!("fusebox-bad-{}.npy", std::process::id()));
        std::fs::write(&path, b"\x93NUMPY\x01\x00garbage").unwrap();
        assert!(Tensor::read_npy(&path).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
