//! Device memory: size-bucketed free lists, and the typed buffers handed out from them.
//!
//! `cuMemAlloc` and `cuMemFree` are slow (and `cuMemFree` synchronizes the device), while a
//! program allocates the same sizes run after run and executable after executable. Freed
//! blocks therefore go back to a free list for their size bucket and are handed out again. A
//! size is rounded up to its bucket: powers of two up to 2 MiB (at least 512 bytes), then whole
//! 2 MiB pages, so a reused block wastes less than half of a small size and less than 2 MiB of
//! a large one.
//!
//! Reuse needs no events of its own because every operation of a device is ordered by its one
//! stream (see the [module docs](super); a run on a caller's stream is fenced into that order):
//! a block returned while queued work still uses it can only be touched again by work queued
//! after that work.

use super::DriverResult;
use super::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::buffer::Buffer;
use std::collections::HashMap;
use std::sync::Arc;

/// The smallest bucket: `cuMemAlloc` aligns to 256 bytes anyway, and tiny tensors are common.
const MIN_BUCKET: usize = 512;
/// Above this, sizes round up to whole pages of this size instead of powers of two.
const PAGE: usize = 2 << 20;

/// The bucket a request of `bytes` is served from (0 for an empty request, which takes no
/// memory at all).
pub fn bucket(bytes: usize) -> usize {
    match bytes {
        0 => 0,
        b if b <= MIN_BUCKET => MIN_BUCKET,
        b if b <= PAGE => b.next_power_of_two(),
        b => b.div_ceil(PAGE) * PAGE,
    }
}

/// Free device blocks by bucket, and counts of what the pool did.
#[derive(Debug, Default)]
pub struct Pool {
    free: HashMap<usize, Vec<u64>>,
    /// Bytes in free lists.
    pub idle_bytes: usize,
    /// Bytes handed out and not yet returned.
    pub live_bytes: usize,
    /// Requests served from a free list, and by a fresh allocation.
    pub reused: usize,
    pub allocated: usize,
}

impl Pool {
    /// A free block of exactly `bucket` bytes, if one is idle.
    pub fn take(&mut self, bucket: usize) -> Option<u64> {
        let ptr = self.free.get_mut(&bucket)?.pop()?;
        self.idle_bytes -= bucket;
        self.live_bytes += bucket;
        self.reused += 1;
        Some(ptr)
    }

    /// Records a fresh allocation of `bucket` bytes.
    pub fn note_allocated(&mut self, bucket: usize) {
        self.live_bytes += bucket;
        self.allocated += 1;
    }

    /// Returns a block to its free list.
    pub fn give(&mut self, bucket: usize, ptr: u64) {
        self.live_bytes -= bucket;
        self.idle_bytes += bucket;
        self.free.entry(bucket).or_default().push(ptr);
    }

    /// Empties every free list, returning the blocks (to be freed when memory runs short).
    pub fn drain(&mut self) -> Vec<u64> {
        self.idle_bytes = 0;
        self.free.drain().flat_map(|(_, ptrs)| ptrs).collect()
    }
}

/// A tensor's storage on the device: `shape` elements of `dtype` in their storage format
/// (f16/bf16 as 16-bit patterns, bool as bytes), contiguous. Dropping it returns the memory to
/// the device's pool.
pub struct DeviceBuffer {
    device: Arc<Device>,
    ptr: u64,
    bucket: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({} {:?} at {:#x} on device {})",
            self.dtype,
            self.shape,
            self.ptr,
            self.device.info().ordinal
        )
    }
}

impl DeviceBuffer {
    /// A buffer with unspecified contents.
    pub fn uninit(device: &Arc<Device>, dtype: DType, shape: &[usize]) -> Result<DeviceBuffer> {
        let bytes = crate::shape::numel(shape) * dtype.size_bytes();
        let (ptr, bucket) = device.alloc(bytes)?;
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            bucket,
            dtype,
            shape: shape.to_vec(),
        })
    }

    /// `bytes` bytes of untyped scratch memory.
    pub fn raw(device: &Arc<Device>, bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::uninit(device, DType::Bool, &[bytes])
    }

    /// A copy of `host` on the device. The copy is queued on the device's stream; `host` may
    /// be changed or dropped as soon as this returns (the driver stages pageable memory).
    pub fn upload(device: &Arc<Device>, host: &Buffer) -> Result<DeviceBuffer> {
        let mut buffer = DeviceBuffer::uninit(device, host.dtype, &host.shape)?;
        buffer.write(host)?;
        Ok(buffer)
    }

    /// Queues a copy of `host` (same dtype and shape) over the contents, e.g. new input
    /// values for a program whose CUDA graph was captured with this buffer.
    pub fn write(&mut self, host: &Buffer) -> Result<()> {
        if host.dtype != self.dtype || host.shape != self.shape {
            return Err(Error::backend(format!(
                "cannot copy a host buffer of {} {:?} into a device buffer of {} {:?}",
                host.dtype, host.shape, self.dtype, self.shape
            )));
        }
        if self.byte_len() == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: `host` holds `byte_len` initialised bytes; the destination block is at least
        // that large and owned by this buffer. Pageable memory is staged by the driver before
        // the call returns, so `host` may change afterwards.
        let bytes = unsafe { std::slice::from_raw_parts(host.as_ptr(), host.byte_len()) };
        unsafe {
            cudarc::driver::result::memcpy_htod_async(self.ptr, bytes, self.device.cu_stream())
        }
        .or_driver("copying to the device")
    }

    /// The contents, after everything queued before has finished (this waits for the device).
    pub fn download(&self) -> Result<Buffer> {
        let mut host = Buffer::zeroed(self.dtype, &self.shape);
        self.download_into(&mut host)?;
        self.device.synchronize()?;
        Ok(host)
    }

    /// Queues a copy of the contents into `host` (same dtype and shape). The copy is complete
    /// only after [`Device::synchronize`]; `host` must not be read or dropped before.
    pub(crate) fn download_into(&self, host: &mut Buffer) -> Result<()> {
        if host.dtype != self.dtype || host.shape != self.shape {
            return Err(Error::backend(format!(
                "cannot copy a device buffer of {} {:?} into a host buffer of {} {:?}",
                self.dtype, self.shape, host.dtype, host.shape
            )));
        }
        if self.byte_len() == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: `host` owns `byte_len` bytes (same dtype and shape as this buffer); the
        // caller keeps it alive and unread until the stream is synchronized.
        let bytes = unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr(), host.byte_len()) };
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(bytes, self.ptr, self.device.cu_stream())
        }
        .or_driver("copying an output to the host")
    }

    /// Queues a fill of every byte with `byte`: a poison pattern (0xFF makes every float a
    /// NaN), so an element no kernel writes shows up.
    pub fn fill_bytes(&mut self, byte: u8) -> Result<()> {
        if self.byte_len() == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: the block holds at least `byte_len` bytes and is owned by this buffer.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.ptr,
                byte,
                self.byte_len(),
                self.device.cu_stream(),
            )
        }
        .or_driver("filling a device buffer")
    }

    pub fn len(&self) -> usize {
        crate::shape::numel(&self.shape)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the elements take.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size_bytes()
    }

    /// The device address (0 for an empty buffer).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.device.release(self.ptr, self.bucket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_to_powers_of_two_then_pages() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 512);
        assert_eq!(bucket(512), 512);
        assert_eq!(bucket(513), 1024);
        assert_eq!(bucket(3000), 4096);
        assert_eq!(bucket(PAGE), PAGE);
        assert_eq!(bucket(PAGE + 1), 2 * PAGE);
        // 16 MiB + 1 byte: one more page, not the next power of two (32 MiB).
        assert_eq!(bucket((16 << 20) + 1), (16 << 20) + PAGE);
        for b in [1usize, 700, 5000, PAGE - 1, 3 * PAGE + 5] {
            assert!(bucket(b) >= b);
            assert_eq!(bucket(bucket(b)), bucket(b), "a bucket is its own bucket");
        }
    }

    #[test]
    fn freed_blocks_are_reused_by_exact_bucket() {
        let mut pool = Pool::default();
        assert_eq!(pool.take(1024), None);
        pool.note_allocated(1024);
        pool.give(1024, 0x1000);
        pool.note_allocated(2048);
        pool.give(2048, 0x2000);
        assert_eq!(pool.idle_bytes, 3072);
        assert_eq!(pool.live_bytes, 0);
        assert_eq!(pool.take(512), None, "a bigger idle block is not split");
        assert_eq!(pool.take(2048), Some(0x2000));
        assert_eq!(pool.take(2048), None);
        assert_eq!((pool.reused, pool.allocated), (1, 2));
        assert_eq!(pool.live_bytes, 2048);
        assert_eq!(pool.drain(), vec![0x1000]);
        assert_eq!(pool.idle_bytes, 0);
    }
}
