//! Typed host buffers: a tensor's elements in their storage format.
//!
//! The reference evaluator holds floats as f64 and integers as i64; kernels read and write the real storage
//! format (f16 and bf16 as 16-bit patterns, bool as one byte). A [`Buffer`] is that storage,
//! aligned to 64 bytes (it is backed by cache-line blocks): every dtype can be read in place,
//! a vector of 16 f32 never straddles two cache lines, and the CPU kernels' streaming stores,
//! which need 64-byte alignment, apply to whole buffers.

use crate::dtype::{Category, DType};
/// The error of an allocation that failed, as buffers report it.
pub use crate::tensor::AllocError;
use crate::tensor::{Data, Tensor};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

/// Elements of one dtype, in storage format.
#[derive(Debug)]
pub struct Buffer {
    pub dtype: DType,
    pub shape: Vec<usize>,
    blocks: Vec<Block>,
}

/// One cache line of storage; its alignment is the buffer's.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Block([u64; 8]);

/// Bytes per [`Block`].
const BLOCK_BYTES: usize = std::mem::size_of::<Block>();

/// `count` zeroed blocks; `None` when the allocator refuses (the caller reports it:
/// `handle_alloc_error` would abort the process).
fn zeroed_blocks(count: usize) -> Option<Vec<Block>> {
    new_blocks(count, None)
}

/// `count` blocks holding zeros, or a copy of `source` (of `count` blocks); `None` when the
/// allocator refuses.
///
/// A big buffer is advised onto huge pages ([`advise_huge_pages`]) before anything touches
/// it, then written: the writing is what faults its pages in (the system allocator zeroes
/// over-aligned memory itself in any case), so it faults in 2 MiB pages rather than 4 KiB
/// ones that the advice would only merge later, in the background. A copy is written once,
/// with the source's bytes, not zeroed first.
fn new_blocks(count: usize, source: Option<&[Block]>) -> Option<Vec<Block>> {
    debug_assert!(source.is_none_or(|s| s.len() == count));
    let layout = std::alloc::Layout::array::<Block>(count).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    let huge = layout.size() >= HUGE_PAGE_MIN_BYTES;
    // SAFETY: the layout has a non-zero size. A non-null result is `count` blocks with
    // `Block`'s alignment, allocated by the global allocator with exactly the layout `Vec`
    // uses for that capacity, so `from_raw_parts` may own and free it. Every byte is written
    // before the `Vec` exists: zeroed by the allocator or by `write_bytes`, or copied from
    // `source`, which holds `count` blocks and cannot overlap fresh memory; all-zero bytes
    // and copied blocks are valid `Block`s.
    unsafe {
        let ptr = if huge || source.is_some() {
            std::alloc::alloc(layout)
        } else {
            std::alloc::alloc_zeroed(layout)
        };
        if ptr.is_null() {
            return None;
        }
        if huge {
            advise_huge_pages(ptr, layout.size());
        }
        match source {
            Some(source) => {
                std::ptr::copy_nonoverlapping(source.as_ptr(), ptr as *mut Block, count)
            }
            None if huge => std::ptr::write_bytes(ptr, 0, layout.size()),
            None => {}
        }
        Some(Vec::from_raw_parts(ptr as *mut Block, count, count))
    }
}

/// Buffers of at least this many bytes ask for transparent huge pages: NumPy's threshold for
/// the same advice (4 MiB), below which a buffer spans too few 2 MiB pages to matter.
const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// Bytes of one transparent huge page on x86-64 and AArch64 Linux with 4 KiB base pages.
#[cfg(target_os = "linux")]
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks Linux to back the whole 2 MiB pages inside the `len` bytes at `ptr` with transparent
/// huge pages (`madvise(MADV_HUGEPAGE)`).
///
/// Why: kernels stream through big buffers, and with 4 KiB pages a 64 MiB operand costs
/// 16,384 TLB misses and page walks per pass. Where the system's THP mode is `madvise` (the
/// default of many distributions, and of the machines fusebox is measured on), memory gets
/// huge pages only when asked; NumPy asks for every array of 4 MiB or more, so a memory floor
/// measured with NumPy arrays has them. The advice changes no value; where it is refused
/// (THP off, another kernel) nothing else changes either, so its result is ignored.
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let start = ptr as usize;
        let first = start.next_multiple_of(HUGE_PAGE_BYTES);
        let last = (start + len) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
        if last > first {
            // SAFETY: [first, last) lies inside the allocation at `ptr` and is page-aligned;
            // MADV_HUGEPAGE only marks the range, it reads and writes no byte of it.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

impl Clone for Buffer {
    /// A copy in a buffer allocated as [`Buffer::try_zeroed`] allocates (so it gets the same
    /// alignment and page advice), written once with the source's bytes.
    fn clone(&self) -> Buffer {
        let blocks = new_blocks(self.blocks.len(), Some(&self.blocks)).unwrap_or_else(|| {
            panic!("cannot allocate {} bytes to copy a buffer", self.byte_len())
        });
        Buffer {
            dtype: self.dtype,
            shape: self.shape.clone(),
            blocks,
        }
    }
}

impl Buffer {
    /// A buffer of `shape` with unspecified (zeroed) contents; panics if it cannot be
    /// allocated. For sizes that come from user input use [`Buffer::try_zeroed`].
    pub fn zeroed(dtype: DType, shape: &[usize]) -> Buffer {
        Buffer::try_zeroed(dtype, shape).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A buffer of `shape` with zeroed contents, or an error naming the size when its byte
    /// count overflows or the allocator refuses it (rather than aborting the process).
    pub fn try_zeroed(dtype: DType, shape: &[usize]) -> Result<Buffer, AllocError> {
        let bytes = crate::shape::checked_numel(shape)
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| AllocError::BufferTooLarge {
                dtype,
                shape: shape.to_vec(),
            })?;
        let blocks =
            zeroed_blocks(bytes.div_ceil(BLOCK_BYTES)).ok_or_else(|| AllocError::Buffer {
                bytes,
                dtype,
                shape: shape.to_vec(),
            })?;
        Ok(Buffer {
            dtype,
            shape: shape.to_vec(),
            blocks,
        })
    }

    pub fn len(&self) -> usize {
        crate::shape::numel(&self.shape)
    }

    /// Fills this buffer (row-major over its shape) with the elements of `x`, of the same
    /// dtype, that the view `strided` addresses; `false`, with the buffer partly written, when
    /// the view addresses an element outside `x`.
    pub fn gather_from(&mut self, x: Elements<'_>, strided: &crate::shape::Strided) -> bool {
        let size = self.dtype.size_bytes();
        if x.dtype != self.dtype {
            return false;
        }
        let shape = self.shape.clone();
        let bytes = self.bytes_mut();
        for q in 0..crate::shape::numel(&shape) {
            let at = strided.element(&shape, q);
            let Some(from) = usize::try_from(at).ok().and_then(|e| e.checked_mul(size)) else {
                return false;
            };
            let Some(element) = x.bytes.get(from..from + size) else {
                return false;
            };
            bytes[q * size..(q + 1) * size].copy_from_slice(element);
        }
        true
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The zero padding `padding` of `x` (whose shape is `padding.source`) as a buffer of the
    /// padded shape: for a reader that cannot make the zeros as it reads. `None` where `x` is
    /// not that source.
    pub fn padded_from(
        x: Elements<'_>,
        padding: &crate::shape::Padding,
    ) -> Option<Result<Buffer, AllocError>> {
        if x.shape != padding.source.as_slice() {
            return None;
        }
        let mut buffer = match Buffer::try_zeroed(x.dtype, &padding.padded()) {
            Ok(b) => b,
            Err(e) => return Some(Err(e)),
        };
        let size = x.dtype.size_bytes();
        let bytes = buffer.bytes_mut();
        padding.for_each_row(|from, to, len| {
            bytes[to * size..(to + len) * size]
                .copy_from_slice(&x.bytes[from * size..(from + len) * size]);
        });
        Some(Ok(buffer))
    }

    /// Bytes the elements take (without the padding to a whole word).
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size_bytes()
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.blocks.as_ptr() as *const u8
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.blocks.as_mut_ptr() as *mut u8
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `blocks` owns at least `byte_len` initialised bytes; u8 has no alignment.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.byte_len()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.byte_len();
        // SAFETY: as in `bytes`, and the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len) }
    }

    /// The elements, borrowed.
    pub fn elements(&self) -> Elements<'_> {
        Elements {
            dtype: self.dtype,
            shape: &self.shape,
            bytes: self.bytes(),
        }
    }

    /// The elements, borrowed for writing.
    pub fn elements_mut(&mut self) -> ElementsMut<'_> {
        let (dtype, len) = (self.dtype, self.byte_len());
        // SAFETY: `blocks` owns at least `len` initialised bytes, uniquely borrowed; the shape
        // is a separate field.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len) };
        ElementsMut {
            dtype,
            shape: &self.shape,
            bytes,
        }
    }

    /// The elements as f32, when the dtype is f32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.elements().as_f32()
    }

    /// The elements as 16-bit patterns, when the dtype is f16 or bf16.
    pub fn as_u16(&self) -> Option<&[u16]> {
        self.elements().as_u16()
    }

    /// Stores f32 values (see [`ElementsMut::store_f32`]).
    pub fn store_f32(&mut self, values: &[f32]) -> bool {
        self.elements_mut().store_f32(values)
    }

    /// Element `i` as f64 (integers beyond 2^53 round to nearest: read integers with
    /// [`Buffer::get_int`]).
    pub fn get(&self, i: usize) -> f64 {
        self.elements().get(i)
    }

    /// Stores `v` rounded to the dtype ([`DType::round`]).
    pub fn set(&mut self, i: usize, v: f64) {
        self.elements_mut().set(i, v)
    }

    /// Element `i` of an integer buffer, exactly; other dtypes convert as a cast to i64.
    pub fn get_int(&self, i: usize) -> i64 {
        self.elements().get_int(i)
    }

    /// Stores integer `v` wrapped to an integer dtype (other dtypes round it to nearest).
    pub fn set_int(&mut self, i: usize, v: i64) {
        self.elements_mut().set_int(i, v)
    }

    /// The buffer of `t`; panics if it cannot be allocated (tests). Every path user input
    /// reaches uses [`Buffer::try_from_tensor`].
    pub fn from_tensor(t: &Tensor) -> Buffer {
        Buffer::try_from_tensor(t).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The buffer of `t`, or an error naming the size when it cannot be allocated.
    pub fn try_from_tensor(t: &Tensor) -> Result<Buffer, AllocError> {
        let mut b = Buffer::try_zeroed(t.dtype, t.shape())?;
        match &t.data {
            Data::Float(a) => {
                let a = a.as_standard_layout();
                b.elements_mut()
                    .store_f64(a.as_slice().expect("a standard-layout array is one slice"));
            }
            Data::Int(a) => {
                for (i, &v) in a.as_standard_layout().iter().enumerate() {
                    b.set_int(i, v);
                }
            }
        }
        Ok(b)
    }

    pub fn to_tensor(&self) -> Tensor {
        if self.dtype.category() == Category::Integer {
            let values: Vec<i64> = (0..self.len()).map(|i| self.get_int(i)).collect();
            let data = ArrayD::from_shape_vec(IxDyn(&self.shape), values).expect("shape matches");
            return Tensor::from_int_array(self.dtype, data);
        }
        let values = self.elements().to_f64_vec();
        let data = ArrayD::from_shape_vec(IxDyn(&self.shape), values).expect("shape matches");
        Tensor::from_array(self.dtype, data)
    }

    /// Overwrites every byte with `byte`: a poison pattern, so an element a kernel failed
    /// to write shows up (0xFF makes every float a NaN).
    pub fn fill_bytes(&mut self, byte: u8) {
        self.bytes_mut().fill(byte);
    }

    /// Copies the elements of `other` (same dtype and element count).
    pub fn copy_from(&mut self, other: &Buffer) {
        let n = self.byte_len().min(other.byte_len());
        self.bytes_mut()[..n].copy_from_slice(&other.bytes()[..n]);
    }
}

/// A tensor's elements in storage format, borrowed: from a [`Buffer`], or from memory a
/// kernel wrote (the executor hands matmul its operands this way, without copying them).
#[derive(Debug, Clone, Copy)]
pub struct Elements<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    bytes: &'a [u8],
}

/// [`Elements`] to write.
#[derive(Debug)]
pub struct ElementsMut<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    bytes: &'a mut [u8],
}

impl<'a> Elements<'a> {
    /// # Safety
    /// `ptr` must point at `numel(shape)` elements of `dtype`, aligned for the dtype and
    /// valid for reads, unchanged while the result lives.
    pub unsafe fn from_raw(dtype: DType, shape: &'a [usize], ptr: *const u8) -> Elements<'a> {
        let len = crate::shape::numel(shape) * dtype.size_bytes();
        // SAFETY: the caller's promise.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        Elements {
            dtype,
            shape,
            bytes,
        }
    }

    pub fn len(&self) -> usize {
        crate::shape::numel(self.shape)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as f32, when the dtype is f32.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        (self.dtype == DType::F32).then(|| {
            // SAFETY: storage holding `len` f32 values, aligned (buffers are 64-byte aligned).
            unsafe { std::slice::from_raw_parts(self.bytes.as_ptr() as *const f32, self.len()) }
        })
    }

    /// The elements as 16-bit patterns, when the dtype is f16 or bf16.
    pub fn as_u16(&self) -> Option<&'a [u16]> {
        matches!(self.dtype, DType::F16 | DType::BF16).then(|| {
            // SAFETY: as in `as_f32`, 16-bit values.
            unsafe { std::slice::from_raw_parts(self.bytes.as_ptr() as *const u16, self.len()) }
        })
    }

    /// Element `i` of an integer dtype, exactly; other dtypes convert as a cast to i64
    /// (bool as 0 or 1).
    pub fn get_int(&self, i: usize) -> i64 {
        let w = self.dtype.size_bytes();
        let e = &self.bytes[i * w..(i + 1) * w];
        match self.dtype {
            DType::I8 => i64::from(e[0] as i8),
            DType::U8 => i64::from(e[0]),
            DType::I16 => i64::from(i16::from_ne_bytes([e[0], e[1]])),
            DType::U16 => i64::from(u16::from_ne_bytes([e[0], e[1]])),
            DType::I32 => i64::from(i32::from_ne_bytes(e.try_into().expect("4 bytes"))),
            DType::U32 => i64::from(u32::from_ne_bytes(e.try_into().expect("4 bytes"))),
            DType::I64 => i64::from_ne_bytes(e.try_into().expect("8 bytes")),
            _ => self.get(i) as i64,
        }
    }

    /// Element `i` as f64 (exact for every dtype but i64 beyond 2^53, which rounds to
    /// nearest: read integers with [`Elements::get_int`]).
    pub fn get(&self, i: usize) -> f64 {
        let w = self.dtype.size_bytes();
        let e = &self.bytes[i * w..(i + 1) * w];
        match self.dtype {
            DType::Bool => f64::from(e[0]),
            DType::F16 => f16::from_bits(u16::from_ne_bytes([e[0], e[1]])).to_f64(),
            DType::BF16 => bf16::from_bits(u16::from_ne_bytes([e[0], e[1]])).to_f64(),
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 | DType::U32 => {
                self.get_int(i) as f64
            }
            DType::F32 => f64::from(f32::from_ne_bytes(e.try_into().expect("4 bytes"))),
            DType::I64 => i64::from_ne_bytes(e.try_into().expect("8 bytes")) as f64,
            DType::F64 => f64::from_ne_bytes(e.try_into().expect("8 bytes")),
        }
    }

    /// Every element as f64, as [`Elements::get`] reads each. The dtype is matched once,
    /// not per element: whole outputs of full-size graphs are read this way.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        if let Some(values) = self.as_f32() {
            return values.iter().map(|&v| f64::from(v)).collect();
        }
        match (self.dtype, self.as_u16()) {
            (DType::F16, Some(bits)) => bits.iter().map(|&b| f16::from_bits(b).to_f64()).collect(),
            (DType::BF16, Some(bits)) => {
                bits.iter().map(|&b| bf16::from_bits(b).to_f64()).collect()
            }
            _ => (0..self.len()).map(|i| self.get(i)).collect(),
        }
    }
}

impl<'a> ElementsMut<'a> {
    /// # Safety
    /// As [`Elements::from_raw`], valid for writes and not otherwise accessed while the
    /// result lives.
    pub unsafe fn from_raw(dtype: DType, shape: &'a [usize], ptr: *mut u8) -> ElementsMut<'a> {
        let len = crate::shape::numel(shape) * dtype.size_bytes();
        // SAFETY: the caller's promise.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        ElementsMut {
            dtype,
            shape,
            bytes,
        }
    }

    pub fn len(&self) -> usize {
        crate::shape::numel(self.shape)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first element's address, for code that writes the storage format itself (the CPU
    /// backend's GEMM); `len() * dtype.size_bytes()` bytes are writable from it.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }

    /// Stores integer `v`: wrapped to an integer dtype (an i32 keeps the low 32 bits, a u8 the
    /// low 8), rounded to nearest for the other dtypes.
    pub fn set_int(&mut self, i: usize, v: i64) {
        let w = self.dtype.size_bytes();
        let e = &mut self.bytes[i * w..(i + 1) * w];
        match self.dtype {
            DType::I8 | DType::U8 => e[0] = v as u8,
            DType::I16 | DType::U16 => e.copy_from_slice(&(v as u16).to_ne_bytes()),
            DType::I32 | DType::U32 => e.copy_from_slice(&(v as u32).to_ne_bytes()),
            DType::I64 => e.copy_from_slice(&v.to_ne_bytes()),
            _ => self.set(i, v as f64),
        }
    }

    /// Stores `v` rounded to the dtype ([`DType::round`]).
    pub fn set(&mut self, i: usize, v: f64) {
        let dtype = self.dtype;
        let w = dtype.size_bytes();
        let v = dtype.round(v);
        let e = &mut self.bytes[i * w..(i + 1) * w];
        match dtype {
            DType::Bool => e[0] = u8::from(v != 0.0),
            DType::F16 => e.copy_from_slice(&f16::from_f64(v).to_bits().to_ne_bytes()),
            DType::BF16 => e.copy_from_slice(&bf16::from_f64(v).to_bits().to_ne_bytes()),
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 | DType::U32 => {
                self.set_int(i, v as i64)
            }
            DType::F32 => e.copy_from_slice(&(v as f32).to_ne_bytes()),
            DType::I64 => e.copy_from_slice(&(v as i64).to_ne_bytes()),
            DType::F64 => e.copy_from_slice(&v.to_ne_bytes()),
        }
    }

    /// The elements as f32 to write, when the dtype is f32.
    fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        let len = self.len();
        (self.dtype == DType::F32).then(|| {
            // SAFETY: storage of `len` f32 values, aligned (buffers are 64-byte aligned),
            // uniquely borrowed.
            unsafe { std::slice::from_raw_parts_mut(self.bytes.as_mut_ptr() as *mut f32, len) }
        })
    }

    /// Stores `values` rounded to the dtype, as [`ElementsMut::set`] stores each, with the
    /// dtype matched once rather than per element (whole inputs are written this way).
    pub fn store_f64(&mut self, values: &[f64]) {
        let n = self.len().min(values.len());
        if let Some(dst) = self.as_f32_mut() {
            // `as f32` rounds to nearest even, keeps ±Inf and NaN, and overflows to ±Inf:
            // `DType::F32.round`.
            for (d, &v) in dst.iter_mut().zip(values) {
                *d = v as f32;
            }
            return;
        }
        match self.dtype {
            DType::F64 => {
                for (d, &v) in self.bytes.chunks_exact_mut(8).zip(values) {
                    d.copy_from_slice(&v.to_ne_bytes());
                }
            }
            _ => {
                for (i, &v) in values[..n].iter().enumerate() {
                    self.set(i, v);
                }
            }
        }
    }

    /// Stores f32 values (already exactly representable in the dtype, or rounded to it here
    /// to nearest even) when the dtype is f32, f16 or bf16; `false` for other dtypes.
    pub fn store_f32(&mut self, values: &[f32]) -> bool {
        let n = self.len().min(values.len());
        if let Some(dst) = self.as_f32_mut() {
            dst[..n].copy_from_slice(&values[..n]);
            return true;
        }
        let ptr = self.bytes.as_mut_ptr();
        match self.dtype {
            DType::F16 | DType::BF16 => {
                // SAFETY: aligned storage of `len` 16-bit values, uniquely borrowed.
                let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u16, n) };
                let half = self.dtype == DType::F16;
                for (d, &v) in dst.iter_mut().zip(values) {
                    *d = if half {
                        f16::from_f32(v).to_bits()
                    } else {
                        bf16::from_f32(v).to_bits()
                    };
                }
            }
            _ => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_round_trip() {
        for dtype in DType::ALL {
            let mut b = Buffer::zeroed(dtype, &[3]);
            for (i, v) in [1.5, -2.0, 0.0].into_iter().enumerate() {
                b.set(i, v);
            }
            let want = [dtype.round(1.5), dtype.round(-2.0), 0.0];
            let got: Vec<f64> = (0..3).map(|i| b.get(i)).collect();
            assert_eq!(got, want, "{dtype}");
        }
        let mut b = Buffer::zeroed(DType::F16, &[1]);
        b.set(0, 1.0);
        assert_eq!(u16::from_ne_bytes([b.bytes()[0], b.bytes()[1]]), 0x3C00);
    }

    /// The bulk conversions agree bit for bit with the per-element ones, for every dtype,
    /// on values that round, overflow, saturate or are not numbers.
    #[test]
    fn bulk_conversions_match_element_ones() {
        let values = [
            0.1,
            -0.0,
            1.0 + 2f64.powi(-11),
            70000.0,
            1e300,
            -1e300,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            3.7e9,
            -2.5,
            f64::from(f32::MAX) * 1.5,
        ];
        for dtype in DType::ALL {
            let mut one = Buffer::zeroed(dtype, &[values.len()]);
            for (i, &v) in values.iter().enumerate() {
                one.set(i, v);
            }
            let mut bulk = Buffer::zeroed(dtype, &[values.len()]);
            bulk.elements_mut().store_f64(&values);
            assert_eq!(one.bytes(), bulk.bytes(), "{dtype} store");
            let read: Vec<u64> = bulk
                .elements()
                .to_f64_vec()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let want: Vec<u64> = (0..values.len()).map(|i| bulk.get(i).to_bits()).collect();
            assert_eq!(read, want, "{dtype} read");
        }
    }

    /// A clone holds the source's bytes, for buffers below and above the huge-page size (a
    /// copy is written once, not zeroed first).
    #[test]
    fn clones_copy_every_byte() {
        for n in [37usize, (4 << 20) / 4 + 5] {
            let mut b = Buffer::zeroed(DType::F32, &[n]);
            for i in 0..n {
                b.set(i, i as f64 * 0.5 - 7.0);
            }
            let copy = b.clone();
            assert_eq!(copy.shape, b.shape);
            assert_eq!(copy.bytes(), b.bytes(), "{n}");
            assert_eq!(copy.as_ptr() as usize % 64, 0);
        }
    }

    /// A buffer of 4 MiB or more carries the huge-page advice on its whole 2 MiB pages: the
    /// kernel lists `hg` among the flags of the mapping that holds them (Linux's
    /// `/proc/self/smaps`), and a smaller buffer's mapping does not get it from us.
    #[cfg(target_os = "linux")]
    #[test]
    fn big_buffers_are_advised_onto_huge_pages() {
        fn flags_of(ptr: usize) -> String {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut inside = false;
            for line in smaps.lines() {
                let range = line.split_whitespace().next().unwrap_or("");
                if let Some((lo, hi)) = range.split_once('-')
                    && let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = lo <= ptr && ptr < hi;
                } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.to_string();
                }
            }
            panic!("no mapping holds {ptr:#x}")
        }
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            eprintln!("this kernel has no transparent huge pages: the advice is refused");
            return;
        }
        let big = Buffer::zeroed(DType::F32, &[3 << 20]);
        assert!(big.bytes().iter().all(|&x| x == 0));
        let page = (big.as_ptr() as usize).next_multiple_of(HUGE_PAGE_BYTES);
        let flags = flags_of(page);
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        let small = Buffer::zeroed(DType::F32, &[1 << 18]);
        let flags = flags_of(small.as_ptr() as usize);
        assert!(!flags.split_whitespace().any(|f| f == "hg"), "{flags}");
    }

    /// Every buffer starts on a cache line, from empty ones to ones big enough that the
    /// allocator maps fresh pages (whose start it would otherwise offset by its header), and
    /// comes zeroed.
    #[test]
    fn buffers_are_cache_line_aligned_and_zeroed() {
        for (dtype, n) in [
            (DType::F32, 0),
            (DType::F32, 1),
            (DType::F16, 33),
            (DType::Bool, 4097),
            (DType::F32, 1 << 22),
            (DType::F64, (1 << 20) + 3),
        ] {
            let b = Buffer::zeroed(dtype, &[n]);
            assert_eq!(b.as_ptr() as usize % 64, 0, "{dtype} x {n}");
            assert_eq!(b.byte_len(), n * dtype.size_bytes());
            assert!(b.bytes().iter().all(|&x| x == 0), "{dtype} x {n}");
            let copy = b.clone();
            assert_eq!(copy.as_ptr() as usize % 64, 0, "clone of {dtype} x {n}");
        }
    }

    #[test]
    fn allocation_failure_is_an_error_naming_the_size() {
        // More than any allocator grants (the layout itself is valid): an error, no abort.
        let e = Buffer::try_zeroed(DType::F64, &[1 << 47])
            .unwrap_err()
            .to_string();
        assert!(e.contains("1125899906842624 bytes"), "{e}");
        let e = Buffer::try_zeroed(DType::F64, &[1 << 62])
            .unwrap_err()
            .to_string();
        assert!(e.contains("too large"), "{e}");
    }
}
