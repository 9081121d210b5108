//! Convolutions through cuDNN: a product that reads its image through a convolution's windows
//! (the importer's im2col matrix, absorbed as a view) runs as one `cudnnConvolutionForward`
//! instead of a gather of that matrix and a GEMM.
//!
//! The im2col matrix of a `k×k` convolution is `k²` times its image: gathered into memory it
//! costs a write and a read of that many bytes before cuBLAS starts, which on a GPU is most
//! of a convolution's time (in bf16, several times its arithmetic). cuDNN reads the image in
//! place, as the CPU GEMM does ([`crate::backend::cpu`]'s slabs).
//!
//! # Recognition
//!
//! The program says nothing about convolutions: the importer writes them as slices, a concat
//! and a matmul, and the partition absorbs the slices into the product's right-hand view.
//! [`recognize`] reads the geometry back from that view alone: each of B's row sub-axes must
//! move along one axis of the (padded) image — the channels by 1, then each spatial axis by its
//! dilation, in order —, each column sub-axis along one spatial axis by its stride, in order,
//! the batch matrices must step through the images and groups of channels, and A must be the
//! weight `[M, C/groups, k…]` read row after row. Whatever does not read so (a window that
//! starts inside the image, a padding cuDNN cannot express because it is wider on one side
//! than the output needs, a tensor of 2^31 elements or more, whose strides cuDNN's `int`s
//! cannot hold) is left to the gather and cuBLAS, which run every product. cuDNN pads symmetrically, so a padding is taken as `before` on both sides
//! where that gives the same output size: the windows then read the same elements (and zeros).
//!
//! # Arithmetic
//!
//! f32 convolutions run with `CUDNN_FMA_MATH` (no TF32, as the GEMMs run without it), bf16
//! ones on tensor cores with f32 accumulation (f16 ones stay GEMMs for now: [`convolves`]),
//! the result rounded once to the output dtype. The image, weight and output share one dtype; operands that need a rounding (an
//! absorbed AMP cast) are converted first, as for cuBLAS. The algorithm is cuDNN's heuristic
//! choice among deterministic ones whose workspace fits [`MAX_WORKSPACE`].

use super::device::CuStream;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::matmul::StridedProduct;
use crate::shape::{Coordinates, Padding};
use cudarc::cudnn::result as cudnn;
use cudarc::cudnn::sys;
use std::ffi::{c_int, c_void};

/// The most workspace one convolution's algorithm may use.
pub const MAX_WORKSPACE: usize = 256 << 20;

/// A convolution as cuDNN takes it: `image` `[N, C, spatial…]` (contiguous), a weight
/// `[out_channels, C/groups, kernel…]` (contiguous), an output `[N, out_channels, out…]`
/// (contiguous), and per spatial axis the padding on both sides, stride and dilation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    pub image: Vec<usize>,
    pub out_channels: usize,
    pub groups: usize,
    pub kernel: Vec<usize>,
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub out: Vec<usize>,
}

impl ConvGeometry {
    /// The weight's shape.
    pub fn weight(&self) -> Vec<usize> {
        let mut shape = vec![self.out_channels, self.image[1] / self.groups];
        shape.extend(&self.kernel);
        shape
    }

    /// The output's shape.
    pub fn output(&self) -> Vec<usize> {
        let mut shape = vec![self.image[0], self.out_channels];
        shape.extend(&self.out);
        shape
    }

    /// Whether cuDNN's descriptors can describe it: every tensor under 2^31 elements (their
    /// strides are C `int`s).
    pub fn fits_cudnn(&self) -> bool {
        let limit = 1usize << 31;
        [self.image.clone(), self.weight(), self.output()]
            .iter()
            .all(|shape| {
                shape
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .is_some_and(|n| n < limit)
            })
    }

    /// The geometry with at least two spatial axes (a unit one put first): cuDNN's
    /// descriptors take 4-D to 5-D tensors.
    pub fn at_least_2d(&self) -> ConvGeometry {
        let mut g = self.clone();
        while g.kernel.len() < 2 {
            g.image.insert(2, 1);
            for field in [&mut g.kernel, &mut g.strides, &mut g.dilations, &mut g.out] {
                field.insert(0, 1);
            }
            g.pads.insert(0, 0);
        }
        g
    }
}

/// Per sub-axis longer than one of `sub_axes` (with `steps`, its steps along each padded
/// axis), the axis it moves along, its size and its step there; `None` unless each moves
/// along one axis, each past `after` and past the one before it.
fn rising(
    sub_axes: &[(usize, i64)],
    steps: &[Vec<i64>],
    after: usize,
) -> Option<Vec<(usize, usize, usize)>> {
    let mut last = after;
    let mut out = Vec::with_capacity(sub_axes.len());
    for (&(n, _), steps) in sub_axes.iter().zip(steps) {
        if n == 1 {
            continue;
        }
        let (axis, step) = Coordinates::single_axis(steps)?;
        if axis <= last {
            return None;
        }
        out.push((axis, n, step));
        last = axis;
    }
    Some(out)
}

/// `sub_axes` ((size, stride) pairs over the row-major offsets of `padded`) with each sub-axis
/// that runs along one axis past its end cut where it wraps into the axis before: the
/// partition merges neighbouring sub-axes whose strides chain (a kernel spanning the whole
/// padded height makes the channel and kernel-row axes one), and [`recognize`] reads one axis
/// per sub-axis. A sub-axis that moves along no single axis is left as it is (and refused).
fn unmerged(sub_axes: &[(usize, i64)], padded: &[usize]) -> Vec<(usize, i64)> {
    let place = crate::shape::Strided::contiguous(padded).strides;
    let mut out = Vec::with_capacity(sub_axes.len());
    for &(mut n, mut stride) in sub_axes {
        let mut pieces = Vec::new();
        loop {
            // The axis a positive stride moves along alone: a multiple of its place, short of
            // the place of the axis before.
            let axis = (0..padded.len()).find(|&a| {
                stride > 0 && stride % place[a] == 0 && (a == 0 || stride < place[a - 1])
            });
            let Some(a) = axis.filter(|&a| a > 0 && n > 1) else {
                break;
            };
            let step = (stride / place[a]) as usize;
            let fits = (n - 1) * step < padded[a];
            let wraps = padded[a].is_multiple_of(step) && n.is_multiple_of(padded[a] / step);
            if fits || !wraps {
                break;
            }
            let inner = padded[a] / step;
            pieces.push((inner, stride));
            (n, stride) = (n / inner, place[a - 1]);
        }
        pieces.push((n, stride));
        out.extend(pieces.into_iter().rev());
    }
    out
}

/// The convolution `product` computes, whose right-hand operand reads `padding`'s padded
/// image (`[N, C, spatial…]`, offsets over the padded shape) through sub-axes and whose
/// left-hand operand is read as stored; `None` where it is not one cuDNN runs as it is (see
/// the module's comment).
pub fn recognize(product: &StridedProduct, padding: &Padding) -> Option<ConvGeometry> {
    let rank = padding.source.len();
    if !(3..=5).contains(&rank) || product.a_split.is_some() {
        return None;
    }
    let spatial = rank - 2;
    let padded = padding.padded();
    let (rows, cols) = match &product.b_split {
        Some([rows, cols]) => (unmerged(rows, &padded), unmerged(cols, &padded)),
        None => (
            unmerged(&[(product.inner, product.b_strides[0])], &padded),
            unmerged(&[(product.cols, product.b_strides[1])], &padded),
        ),
    };
    let sub: Vec<(usize, i64)> = rows.iter().chain(&cols).copied().collect();
    let first = padding.coordinates(product.offsets.first()?.1, &sub)?;
    let (row_steps, col_steps) = first.steps.split_at(rows.len());
    // Rows: channels by 1, then kernel offsets by their dilations, axes rising.
    let (mut per_group, mut kernel, mut dilations) = (1usize, vec![1; spatial], vec![1; spatial]);
    for (axis, n, step) in rising(&rows, row_steps, 0)? {
        match axis {
            1 if step == 1 => per_group = n,
            a if a >= 2 => (kernel[a - 2], dilations[a - 2]) = (n, step),
            _ => return None,
        }
    }
    // Columns: output positions by their strides, spatial axes rising.
    let (mut out, mut strides) = (vec![1; spatial], vec![1; spatial]);
    for (axis, n, step) in rising(&cols, col_steps, 1)? {
        (out[axis - 2], strides[axis - 2]) = (n, step);
    }
    let (images, channels) = (padding.source[0], padding.source[1]);
    if !channels.is_multiple_of(per_group) || first.start[0] != 0 || first.start[1] != 0 {
        return None;
    }
    let groups = channels / per_group;
    let inner = per_group * kernel.iter().product::<usize>();
    if product.inner != inner || product.cols != out.iter().product::<usize>() {
        return None;
    }
    // cuDNN's symmetric padding: `before` less where the first window starts, giving the
    // same output size.
    let mut pads = Vec::with_capacity(spatial);
    for a in 0..spatial {
        let pad = padding.before[a + 2] as i64 - first.start[a + 2];
        let span = ((kernel[a] - 1) * dilations[a] + 1) as i64;
        let room = padding.source[a + 2] as i64 + 2 * pad - span;
        if pad < 0 || room < 0 {
            return None;
        }
        // One output position along an axis says nothing of its stride: any past the room
        // left after the first window gives one.
        if out[a] == 1 {
            strides[a] = room as usize + 1;
        }
        if (room / strides[a] as i64 + 1) as usize != out[a] {
            return None;
        }
        pads.push(pad as usize);
    }
    // Batches: image `i / groups`, group `i % groups`; A the weight read row after row.
    let place = crate::shape::Strided::contiguous(&padded).strides;
    let (b0, rows_per_group) = (product.offsets[0].1, product.rows);
    if product.offsets.len() != images * groups || product.a_strides != [inner as i64, 1] {
        return None;
    }
    let batches_step = product.offsets.iter().enumerate().all(|(i, &(a, b))| {
        let (image, group) = ((i / groups) as i64, (i % groups) as i64);
        a == group * (rows_per_group * inner) as i64
            && b == b0 + image * place[0] + group * per_group as i64 * place[1]
    });
    let geometry = batches_step.then(|| ConvGeometry {
        image: padding.source.clone(),
        out_channels: rows_per_group * groups,
        groups,
        kernel,
        pads,
        strides,
        dilations,
        out,
    });
    geometry.filter(ConvGeometry::fits_cudnn)
}

/// The dtypes cuDNN convolves here: image, weight and output alike, accumulated in f32. f16
/// is left out until a GPU has run `gpu_convolutions_match_their_definition` with it (the
/// session that wrote this had run f32 and bf16): its convolutions stay im2col GEMMs, which
/// cuBLAS runs in f16 as checked on the GPU. [`Dnn::prepare`] describes f16 already.
pub fn convolves(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16)
}

/// A cuDNN handle of one device.
pub struct Dnn {
    handle: sys::cudnnHandle_t,
}

// SAFETY: a cuDNN handle may be used from any thread as long as calls on it are serialized;
// the device keeps its `Dnn` behind a mutex.
unsafe impl Send for Dnn {}

/// A failed cuDNN call, naming what was being done.
fn dnn_error(what: &str, error: cudnn::CudnnError) -> Error {
    Error::backend(format!("cuDNN: {what}: {error:?}"))
}

fn data_type(dtype: DType) -> Result<sys::cudnnDataType_t> {
    Ok(match dtype {
        DType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::BF16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        other => return Err(Error::backend(format!("cuDNN convolves no {other}"))),
    })
}

/// `usize`s as cuDNN's `int`s.
fn ints(values: &[usize]) -> Result<Vec<c_int>> {
    values
        .iter()
        .map(|&v| {
            c_int::try_from(v).map_err(|_| Error::backend(format!("{v} is past cuDNN's int")))
        })
        .collect()
}

/// A convolution's descriptors and algorithm, made once when an executable is built.
pub struct ConvCall {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    /// The algorithm's workspace, bytes.
    pub workspace: usize,
}

// SAFETY: descriptors are plain host structures, used under the device's `Dnn` mutex.
unsafe impl Send for ConvCall {}
unsafe impl Sync for ConvCall {}

impl Drop for ConvCall {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Dnn::prepare` and is destroyed once; a null
        // one (creation failed midway) is skipped. A failure here cannot be reported.
        unsafe {
            if !self.x.is_null() {
                let _ = cudnn::destroy_tensor_descriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = cudnn::destroy_tensor_descriptor(self.y);
            }
            if !self.w.is_null() {
                let _ = cudnn::destroy_filter_descriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = cudnn::destroy_convolution_descriptor(self.conv);
            }
        }
    }
}

/// Contiguous strides of `shape`, as cuDNN's ints.
fn packed_strides(shape: &[usize]) -> Result<Vec<c_int>> {
    ints(
        &crate::shape::Strided::contiguous(shape)
            .strides
            .iter()
            .map(|&s| s as usize)
            .collect::<Vec<_>>(),
    )
}

impl Dnn {
    /// Creates the handle (the context must be current).
    pub(super) fn new() -> Result<Dnn> {
        let handle = cudnn::create_handle().map_err(|e| dnn_error("creating a handle", e))?;
        Ok(Dnn { handle })
    }

    /// The descriptors of `geometry` over `dtype` and the algorithm to run it with.
    pub(super) fn prepare(&mut self, geometry: &ConvGeometry, dtype: DType) -> Result<ConvCall> {
        let g = geometry.at_least_2d();
        let ty = data_type(dtype)?;
        let mut call = ConvCall {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            algo: sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            workspace: 0,
        };
        let tensor = |shape: &[usize]| -> Result<sys::cudnnTensorDescriptor_t> {
            let desc = cudnn::create_tensor_descriptor()
                .map_err(|e| dnn_error("creating a tensor descriptor", e))?;
            let (dims, strides) = (ints(shape)?, packed_strides(shape)?);
            // SAFETY: a live descriptor; `dims` and `strides` hold `dims.len()` ints each.
            unsafe {
                cudnn::set_tensornd_descriptor(
                    desc,
                    ty,
                    dims.len() as c_int,
                    dims.as_ptr(),
                    strides.as_ptr(),
                )
            }
            .map_err(|e| {
                // SAFETY: the descriptor made above, not handed out.
                let _ = unsafe { cudnn::destroy_tensor_descriptor(desc) };
                dnn_error(&format!("describing a tensor {shape:?}"), e)
            })?;
            Ok(desc)
        };
        call.x = tensor(&g.image)?;
        call.y = tensor(&g.output())?;
        call.w = cudnn::create_filter_descriptor()
            .map_err(|e| dnn_error("creating a filter descriptor", e))?;
        let weight = ints(&g.weight())?;
        // SAFETY: a live descriptor and `weight.len()` ints.
        unsafe {
            cudnn::set_filternd_descriptor(
                call.w,
                ty,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                weight.len() as c_int,
                weight.as_ptr(),
            )
        }
        .map_err(|e| dnn_error(&format!("describing a weight {:?}", g.weight()), e))?;
        call.conv = cudnn::create_convolution_descriptor()
            .map_err(|e| dnn_error("creating a convolution descriptor", e))?;
        let (pads, strides, dilations) = (ints(&g.pads)?, ints(&g.strides)?, ints(&g.dilations)?);
        let groups = c_int::try_from(g.groups).map_err(|_| Error::backend("too many groups"))?;
        // f32 on FMA units only (no TF32); f16 and bf16 on tensor cores, accumulating in f32.
        let math = match dtype {
            DType::F32 => sys::cudnnMathType_t::CUDNN_FMA_MATH,
            _ => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        };
        // SAFETY: a live descriptor and `pads.len()` ints in each array.
        let described = unsafe {
            cudnn::set_convolutionnd_descriptor(
                call.conv,
                pads.len() as c_int,
                pads.as_ptr(),
                strides.as_ptr(),
                dilations.as_ptr(),
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
            .and_then(|()| cudnn::set_convolution_group_count(call.conv, groups))
            .and_then(|()| cudnn::set_convolution_math_type(call.conv, math))
        };
        described.map_err(|e| dnn_error(&format!("describing the convolution {geometry:?}"), e))?;
        let (algo, workspace) = self.algorithm(&call, math)?;
        (call.algo, call.workspace) = (algo, workspace);
        Ok(call)
    }

    /// cuDNN's heuristic choice for `call`: the first deterministic algorithm of the math
    /// `math` allows whose workspace fits [`MAX_WORKSPACE`].
    fn algorithm(
        &mut self,
        call: &ConvCall,
        math: sys::cudnnMathType_t,
    ) -> Result<(sys::cudnnConvolutionFwdAlgo_t, usize)> {
        const ASKED: usize = 16;
        let mut found: c_int = 0;
        // SAFETY: plain data, overwritten by cuDNN up to `found` entries.
        let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; ASKED] = unsafe { std::mem::zeroed() };
        // SAFETY: a live handle and descriptors; `perf` holds ASKED entries.
        unsafe {
            cudnn::get_convolution_forward_algorithm(
                self.handle,
                call.x,
                call.w,
                call.conv,
                call.y,
                ASKED as c_int,
                &mut found,
                perf.as_mut_ptr(),
            )
        }
        .map_err(|e| dnn_error("choosing an algorithm", e))?;
        let allowed = |m: sys::cudnnMathType_t| match math {
            sys::cudnnMathType_t::CUDNN_FMA_MATH => {
                matches!(m, sys::cudnnMathType_t::CUDNN_FMA_MATH)
            }
            _ => !matches!(
                m,
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
            ),
        };
        for p in &perf[..(found.max(0) as usize).min(ASKED)] {
            let usable = p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                && p.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC
                && allowed(p.mathType);
            if !usable {
                continue;
            }
            // SAFETY: a live handle and descriptors.
            let bytes = unsafe {
                cudnn::get_convolution_forward_workspace_size(
                    self.handle,
                    call.x,
                    call.w,
                    call.conv,
                    call.y,
                    p.algo,
                )
            };
            if let Ok(bytes) = bytes
                && bytes <= MAX_WORKSPACE
            {
                return Ok((p.algo, bytes));
            }
        }
        Err(Error::backend(format!(
            "cuDNN offers no deterministic {math:?} algorithm within {MAX_WORKSPACE} bytes of workspace for this convolution"
        )))
    }

    /// Queues `call` on `stream`: `y = conv(x, w)`, with `workspace` of at least
    /// `call.workspace` bytes.
    pub(super) fn forward(
        &mut self,
        stream: CuStream,
        call: &ConvCall,
        (x, w, y): (u64, u64, u64),
        workspace: u64,
    ) -> Result<()> {
        // SAFETY: a live handle and stream.
        unsafe { cudnn::set_stream(self.handle, stream as _) }
            .map_err(|e| dnn_error("setting the stream", e))?;
        let (one, zero) = (1f32, 0f32);
        // SAFETY: the descriptors describe the buffers at `x`, `w` and `y` (contiguous, of
        // the shapes and dtype they were made from, which the plan sized), the workspace is at
        // least `call.workspace` bytes, and every buffer outlives the queued work.
        unsafe {
            cudnn::convolution_forward(
                self.handle,
                &one as *const f32 as *const c_void,
                call.x,
                x as *const c_void,
                call.w,
                w as *const c_void,
                call.conv,
                call.algo,
                workspace as *mut c_void,
                call.workspace,
                &zero as *const f32 as *const c_void,
                call.y,
                y as *mut c_void,
            )
        }
        .map_err(|e| dnn_error("queueing a convolution", e))
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once. A failure here cannot be reported.
        let _ = unsafe { cudnn::destroy_handle(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x3 convolution at `stride` and dilation 1 over a [2, 4, 5, 6] image in 2 groups,
    /// padded by 1, as the im2col product's B over the padded [2, 4, 7, 8] image (rows
    /// (channel, kh, kw), columns (oh, ow)), 3 output channels per group, `out` positions.
    fn grouped(stride: i64, out: [usize; 2]) -> (StridedProduct, Padding) {
        let padding = Padding {
            source: vec![2, 4, 5, 6],
            before: vec![0, 0, 1, 1],
            after: vec![0, 0, 1, 1],
        };
        let offsets = (0..4)
            .map(|i| ((i % 2) * 3 * 18, (i / 2) * 224 + (i % 2) * 2 * 56))
            .collect();
        let product = StridedProduct {
            batch: vec![2, 2],
            rows: 3,
            inner: 18,
            cols: out[0] * out[1],
            a_strides: [18, 1],
            b_strides: [1, stride],
            offsets,
            a_split: None,
            b_split: Some([
                vec![(2, 56), (3, 8), (3, 1)],
                vec![(out[0], 8 * stride), (out[1], stride)],
            ]),
        };
        (product, padding)
    }

    #[test]
    fn a_grouped_padded_convolution_is_read_back_from_its_windows() {
        for (stride, out) in [(1, [5, 6]), (2, [3, 3])] {
            let (product, padding) = grouped(stride, out);
            let g = recognize(&product, &padding).unwrap();
            assert_eq!(
                g,
                ConvGeometry {
                    image: vec![2, 4, 5, 6],
                    out_channels: 6,
                    groups: 2,
                    kernel: vec![3, 3],
                    pads: vec![1, 1],
                    strides: vec![stride as usize; 2],
                    dilations: vec![1, 1],
                    out: out.to_vec(),
                }
            );
            assert_eq!(g.weight(), [6, 2, 3, 3]);
            assert_eq!(g.output(), [2, 6, out[0], out[1]]);
        }
    }

    /// What cuDNN cannot run as the view reads it is refused: a padding wider after than the
    /// output needs on the height (5 rows of output where cuDNN's symmetric padding gives 4),
    /// a weight read per image (A's offsets moving with the batch), a group that steps by
    /// something else than its channels, kernel offsets out of order.
    #[test]
    fn what_cudnn_would_read_otherwise_is_refused() {
        let (product, mut padding) = grouped(1, [5, 6]);
        padding.before[2] = 0;
        padding.after[2] = 2;
        assert_eq!(recognize(&product, &padding), None);
        let (mut product, padding) = grouped(1, [5, 6]);
        product.offsets[2].0 += 1;
        assert_eq!(recognize(&product, &padding), None);
        let (mut product, padding) = grouped(1, [5, 6]);
        product.offsets[1].1 += 56;
        assert_eq!(recognize(&product, &padding), None);
        let (mut product, padding) = grouped(1, [5, 6]);
        product.b_split.as_mut().unwrap()[0].swap(1, 2);
        assert_eq!(recognize(&product, &padding), None);
    }

    /// Sub-axes merged because their strides chain are cut where they wrap: channels with a
    /// kernel as tall as the padded image, output rows with output columns spanning a whole
    /// row; a sub-axis that fits, or moves along no single axis, stays.
    #[test]
    fn merged_sub_axes_are_cut_where_they_wrap() {
        let padded = [2, 2, 6, 64];
        // Two channels x three kernel rows at dilation 2 (6 = the padded height).
        assert_eq!(unmerged(&[(6, 128)], &padded), [(2, 384), (3, 128)]);
        // Two output rows x 64 output columns at stride 1.
        assert_eq!(unmerged(&[(128, 1)], &padded), [(2, 64), (64, 1)]);
        // Three kernel columns fit in a row.
        assert_eq!(unmerged(&[(3, 2)], &padded), [(3, 2)]);
        // A stride along two axes at once is left for `recognize` to refuse.
        assert_eq!(unmerged(&[(4, 65)], &padded), [(4, 65)]);
    }

    #[test]
    fn a_1d_geometry_gets_a_unit_height_for_cudnn() {
        let g = ConvGeometry {
            image: vec![1, 3, 10],
            out_channels: 4,
            groups: 1,
            kernel: vec![3],
            pads: vec![1],
            strides: vec![2],
            dilations: vec![1],
            out: vec![5],
        };
        let g2 = g.at_least_2d();
        assert_eq!(g2.image, [1, 3, 1, 10]);
        assert_eq!(g2.kernel, [1, 3]);
        assert_eq!(g2.output(), [1, 4, 1, 5]);
        assert!(g2.fits_cudnn());
        let huge = ConvGeometry {
            image: vec![1 << 16, 1 << 10, 32],
            ..g.clone()
        };
        assert!(!huge.fits_cudnn());
        assert_eq!(
            (g2.pads, g2.strides, g2.dilations),
            (vec![0, 1], vec![1, 2], vec![1, 1])
        );
    }
}
