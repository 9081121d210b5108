use super::*;
use crate::backend::cpu::compiler::CompilerConfig;
use crate::dag::Value;
use crate::runtime::buffer::Buffer;
use rand::{RngExt, SeedableRng};

#[test]
fn operands_are_rounded_only_where_not_already_exact() {
    use DType::*;
    // Already exact in the product's dtype: read as is.
    assert_eq!(operand_plan(F32, None, F32), Some([0, 0, 0]));
    assert_eq!(operand_plan(BF16, None, BF16), Some([2, 0, 0]));
    assert_eq!(operand_plan(F16, Some(F32), F32), Some([1, 0, 0]));
    // Narrowed by the product or by the cast, once.
    assert_eq!(operand_plan(F32, None, F16), Some([0, 1, 0]));
    assert_eq!(operand_plan(F32, Some(BF16), BF16), Some([0, 2, 0]));
    assert_eq!(operand_plan(F32, Some(BF16), F32), Some([0, 2, 0]));
    // Two different narrowings, in order.
    assert_eq!(operand_plan(F16, Some(BF16), F16), Some([1, 2, 1]));
    assert_eq!(operand_plan(F32, Some(F16), BF16), Some([0, 1, 2]));
    // What the GEMM cannot read.
    assert_eq!(operand_plan(F64, None, F32), None);
    assert_eq!(operand_plan(F32, Some(F64), F32), None);
    assert_eq!(operand_plan(I32, None, F32), None);
    assert_eq!(operand_plan(F32, None, F64), None);
}

/// Runs `call` on whole buffers; panics (a test failure) if the GEMM reports a failure.
///
/// # Safety
/// As [`Gemm::call`]: `call` addresses only elements inside `a`, `b` and `out`.
unsafe fn call_on(gemm: &Gemm, call: &Call, a: &Buffer, b: &Buffer, out: &mut Buffer) {
    // SAFETY: the caller's promise.
    unsafe {
        gemm.call(
            call,
            [a.as_ptr() as *const c_void, b.as_ptr() as *const c_void],
            out.as_mut_ptr() as *mut c_void,
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    }
    .unwrap();
}

fn gemm() -> Gemm {
    Gemm::new(&Compiler::new(CompilerConfig::from_env())).expect("the GEMM compiles")
}

/// Random values of `dtype` (rounded to it), with a NaN and an Inf planted.
fn random(dtype: DType, len: usize, seed: u64) -> Buffer {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut buf = Buffer::zeroed(dtype, &[len]);
    for i in 0..len {
        buf.set(i, rng.random_range(-2.0..2.0));
    }
    if len > 2 {
        buf.set(rng.random_range(0..len), f64::NAN);
        buf.set(rng.random_range(0..len), f64::INFINITY);
    }
    buf
}

/// The matrix `rows x cols` that `buf` holds at `strides`, as a contiguous buffer.
fn gather(buf: &Buffer, rows: usize, cols: usize, strides: [usize; 2]) -> Buffer {
    let mut out = Buffer::zeroed(buf.dtype, &[rows, cols]);
    for r in 0..rows {
        for c in 0..cols {
            out.set(r * cols + c, buf.get(r * strides[0] + c * strides[1]));
        }
    }
    out
}

/// Operands read through any row and column strides (column-major, padded rows, every other
/// column) and an output written through padded rows give the product of the contiguous
/// operands, as the interpreter's `matrixmultiply` path computes it.
#[test]
fn strided_and_transposed_operands_give_the_contiguous_product() {
    let gemm = gemm();
    let (m, k, n) = (37usize, 300usize, 101usize);
    let layouts: [([usize; 2], [usize; 2]); 4] = [
        ([k, 1], [n, 1]),             // row-major
        ([1, m], [1, k]),             // both transposed (column-major)
        ([k + 3, 1], [2 * n + 1, 2]), // padded rows, every other column
        ([2, 2 * m], [1, k + 7]),     // strided columns, transposed B with padding
    ];
    for (dtype, out_dtype) in [
        (DType::F32, DType::F32),
        (DType::BF16, DType::BF16),
        (DType::F16, DType::F32),
    ] {
        for (i, &(sa, sb)) in layouts.iter().enumerate() {
            let span = |s: [usize; 2], r: usize, c: usize| (r - 1) * s[0] + (c - 1) * s[1] + 1;
            let a = random(dtype, span(sa, m, k), i as u64);
            let b = random(dtype, span(sb, k, n), 100 + i as u64);
            let op = MatMulOperand::stored(Value::Input(0));
            let mut want = Buffer::zeroed(out_dtype, &[m, n]);
            let (ac, bc) = (gather(&a, m, k, sa), gather(&b, k, n, sb));
            matmul::matmul(&ac, &op, &bc, &op, &mut want).unwrap();

            let ldc = n + 5;
            let mut got = Buffer::zeroed(out_dtype, &[m * ldc]);
            let call = Call {
                sizes: call_sizes([1, m, k, n], dtype, out_dtype),
                strides: [sa[0], sa[1], sb[0], sb[1], ldc, 1].map(|s| s as i64),
                offsets: vec![0, 0, 0],
                split: None,
                zeros: None,
                image: None,
            };
            // SAFETY: the strides address elements below `span` of each buffer; the output
            // has m rows of `ldc`.
            unsafe { call_on(&gemm, &call, &a, &b, &mut got) };
            // Padding between output rows is never written.
            for r in 0..m {
                for c in n..ldc {
                    assert_eq!(got.get(r * ldc + c), 0.0, "padding written");
                }
            }
            let got = gather(&got, m, n, [ldc, 1]);
            let scale = (0..m * n)
                .map(|i| want.get(i).abs())
                .filter(|v| v.is_finite())
                .fold(0.0, f64::max);
            let rtol = if out_dtype == DType::BF16 { 1e-2 } else { 1e-5 };
            for i in 0..m * n {
                let (x, y) = (got.get(i), want.get(i));
                let same = (x.is_nan() && y.is_nan())
                    || x == y
                    || (x - y).abs() <= rtol * (y.abs() + scale);
                assert!(same, "{dtype} layout {i}: [{i}] {x} vs {y}");
            }
        }
    }
}

/// f32 operands that the product rounds to bf16 (an absorbed cast: AMP's `Linear` in bf16)
/// give the bits of the same product of the operands rounded beforehand: the packers round
/// eight values at a time while transposing a row-major A and a transposed B, to nearest with
/// ties to even, NaN kept. Values are drawn so that many lie halfway between two bf16 values.
#[test]
fn operands_rounded_to_bf16_while_packed_give_the_rounded_operands_product() {
    let gemm = gemm();
    let (m, k, n) = (37usize, 300usize, 101usize);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut draw = |len: usize| {
        let mut buf = Buffer::zeroed(DType::F32, &[len]);
        for i in 0..len {
            // A bf16 value plus 0, a half or a quarter of its last place, either sign.
            let base = half::bf16::from_f32(rng.random_range(-2.0f32..2.0)).to_bits() as u32;
            let bits = (base << 16) | [0u32, 0x8000, 0x4000, 0xc000][rng.random_range(0..4usize)];
            buf.set(i, f32::from_bits(bits) as f64);
        }
        buf.set(len / 3, f64::NAN);
        buf.set(len / 2, f64::INFINITY);
        buf
    };
    let (a, b) = (draw(m * k), draw(k * n));
    let (ar, br) = (rounded_to_bf16(&a), rounded_to_bf16(&b));
    // B transposed: stored [n, k].
    let run = |a: &Buffer, b: &Buffer, round: i64| {
        let mut out = Buffer::zeroed(DType::F32, &[m * n]);
        let call = one_product(
            [1, m as i64, k as i64, n as i64, 0, 0, 0, round, 0, round, 0],
            [k as i64, 1, 1, k as i64, n as i64, 1],
        );
        // SAFETY: an m x k row-major A, a k x n B stored as n rows of k, an m x n output.
        unsafe { call_on(&gemm, &call, a, b, &mut out) };
        out
    };
    assert_same_bits(&run(&a, &b, 2), &run(&ar, &br, 0), "rounded while packed");
}

/// A left-hand matrix shared by a batch (a convolution's weights beside each image) whose row
/// blocks, K slices and column blocks the threads take in turn: each thread packs a row block
/// of A once and reuses it for the next blocks it takes of the same rows, so a reuse that kept
/// the wrong rows, the wrong matrix or the wrong slice shows in the product. The right-hand
/// matrices are read row-major and transposed (a `Linear`'s weight, packed by transposes of
/// 8 x 8 blocks), with a width that leaves a partial strip and a partial group of 8.
#[test]
fn a_left_hand_matrix_packed_once_serves_every_block_of_its_rows() {
    let gemm = gemm();
    let (batches, m, k, n) = (3usize, 203usize, 300usize, 437usize);
    for (dtype, out_dtype) in [(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        for (label, sb) in [("row-major B", [n, 1]), ("transposed B", [1, k])] {
            let a = random(dtype, m * k, 7);
            let b = random(dtype, batches * k * n, 8);
            let mut want = Buffer::zeroed(out_dtype, &[batches * m * n]);
            let op = MatMulOperand::stored(Value::Input(0));
            let ac = gather(&a, m, k, [k, 1]);
            for i in 0..batches {
                let mut bi = Buffer::zeroed(dtype, &[k * n]);
                for e in 0..k * n {
                    bi.set(e, b.get(i * k * n + e));
                }
                let bc = gather(&bi, k, n, sb);
                let mut one = Buffer::zeroed(out_dtype, &[m, n]);
                matmul::matmul(&ac, &op, &bc, &op, &mut one).unwrap();
                for e in 0..m * n {
                    want.set(i * m * n + e, one.get(e));
                }
            }
            let call = Call {
                sizes: call_sizes([batches, m, k, n], dtype, out_dtype),
                strides: [k as i64, 1, sb[0] as i64, sb[1] as i64, n as i64, 1],
                // A's offset is the same for every batch matrix.
                offsets: (0..batches)
                    .flat_map(|i| [0, (i * k * n) as i64, (i * m * n) as i64])
                    .collect(),
                split: None,
                zeros: None,
                image: None,
            };
            let mut got = Buffer::zeroed(out_dtype, &[batches * m * n]);
            // SAFETY: A spans m x k, each batch's B k x n at its offset, C m x n per batch.
            unsafe { call_on(&gemm, &call, &a, &b, &mut got) };
            assert_close(&got, &want, out_dtype, &format!("{dtype} {label}"));
        }
    }
}

/// A product of bf16 values gives the same f32 bits whether its operands are stored as bf16
/// (the `vdpbf16ps` pair path, where the CPU has it) or as f32 (the f32 microkernel): the pairs
/// are packed so that both add the same products in the same order. Odd K ends on a half pair.
#[test]
fn bf16_pairs_give_the_f32_paths_bits() {
    let gemm = gemm();
    // A's rows `lda` apart: odd (pairs read one by one), and even with an odd K (whole pairs
    // read as 32-bit words, transposed eight rows at a time, the last half pair alone).
    for (m, k, n, lda) in [
        (37usize, 301usize, 101usize, 301usize),
        (37, 301, 101, 302),
        (8, 1, 48, 1),
        (130, 520, 400, 520),
    ] {
        let a = random(DType::BF16, m * lda, 7);
        let b = random(DType::BF16, k * n, 8);
        let widen = |x: &Buffer| {
            let mut w = Buffer::zeroed(DType::F32, &[x.len()]);
            (0..x.len()).for_each(|i| w.set(i, x.get(i)));
            w
        };
        let (a32, b32) = (widen(&a), widen(&b));
        let run = |a: &Buffer, b: &Buffer, code: i64| {
            let mut out = Buffer::zeroed(DType::F32, &[m * n]);
            let call = one_product(
                [1, m as i64, k as i64, n as i64, code, code, 0, 0, 0, 0, 0],
                [lda as i64, 1, n as i64, 1, n as i64, 1],
            );
            // SAFETY: m rows of lda (at least k), a contiguous k x n and m x n in buffers of
            // those sizes.
            unsafe { call_on(&gemm, &call, a, b, &mut out) };
            out
        };
        let what = format!("{m}x{k}x{n}, rows {lda} apart");
        assert_same_bits(&run(&a, &b, 2), &run(&a32, &b32, 0), &what);
    }
}

/// A batch sharing its right-hand matrix folds into one tall product where its left-hand
/// matrices follow one another row after row (or are single rows at any step: a sequence read
/// transposed, as `nn.TransformerEncoderLayer` exported by dynamo multiplies); not where the
/// right-hand matrices differ or the left-hand ones leave gaps.
#[test]
fn batches_sharing_a_matrix_fold_into_one_product() {
    let product = |rows, a_row: i64, offsets: Vec<(i64, i64)>| StridedProduct {
        batch: vec![offsets.len()],
        rows,
        inner: 8,
        cols: 5,
        a_strides: [a_row, 1],
        b_strides: [5, 1],
        offsets,
        a_split: None,
        b_split: None,
    };
    // [4, 3, 8] @ [8, 5]: rows of 8, matrices 24 apart.
    let folded = fold_batches(&product(3, 8, (0..4).map(|i| (24 * i, 0)).collect())).unwrap();
    assert_eq!(
        (folded.rows, folded.a_strides, folded.offsets),
        (12, [8, 1], vec![(0, 0)])
    );
    // [128, 1, 768]-style single rows 768 apart (the batch axis outside the row's).
    let folded =
        fold_batches(&product(1, 98304, (0..128).map(|i| (768 * i, 0)).collect())).unwrap();
    assert_eq!((folded.rows, folded.a_strides), (128, [768, 1]));
    // Distinct right-hand matrices, a gap between matrices, one matrix: no fold.
    assert!(fold_batches(&product(3, 8, (0..4).map(|i| (24 * i, 40 * i)).collect())).is_none());
    assert!(fold_batches(&product(3, 8, (0..4).map(|i| (32 * i, 0)).collect())).is_none());
    assert!(fold_batches(&product(3, 8, vec![(0, 0)])).is_none());
}

/// Graph input `input` as an operand read through `view`.
fn read_through(input: usize, view: crate::lower::OperandView) -> MatMulOperand {
    MatMulOperand {
        view: Some(view),
        ..MatMulOperand::stored(Value::Input(input))
    }
}

/// An operand view whose axes are each a group of strided sub-axes (`fine`, `counts`) over a
/// buffer, and that operand gathered contiguously by hand (row-major over the sub-axes).
fn split_view(
    buf: &Buffer,
    shape: &[usize],
    offset: i64,
    fine: &[(usize, i64)],
    counts: &[usize],
) -> (crate::lower::OperandView, Buffer) {
    let sizes: Vec<usize> = fine.iter().map(|&(n, _)| n).collect();
    let mut gathered = Buffer::zeroed(buf.dtype, shape);
    for q in 0..gathered.len() {
        let (mut rest, mut at) = (q, offset);
        for &(n, s) in fine.iter().rev() {
            at += (rest % n) as i64 * s;
            rest /= n;
        }
        gathered.set(q, buf.get(at as usize));
    }
    let view = crate::lower::OperandView {
        padding: None,
        shape: shape.to_vec(),
        strided: crate::shape::Strided {
            offset,
            strides: fine.iter().map(|&(_, s)| s).collect(),
        },
        split: Some(crate::shape::SplitAxes {
            fine: sizes,
            counts: counts.to_vec(),
        }),
    };
    (view, gathered)
}

/// Operands read through sub-axes (an im2col matrix read from the windows of a batch of
/// images, at unit and at doubled column steps; a left-hand matrix whose rows and columns are
/// each two strided axes) give the product of the same operands gathered contiguously, in
/// f32, f16 into f32, and bf16 (the pairs path where the CPU has it), across column blocks
/// and K slices.
#[test]
fn operands_read_through_sub_axes_give_the_gathered_product() {
    let gemm = gemm();
    let (c, h, w) = (5usize, 21usize, 40usize);
    let image = (c * h * w) as i64;
    for (dtype, out_dtype) in [
        (DType::F32, DType::F32),
        (DType::F16, DType::F32),
        (DType::BF16, DType::BF16),
    ] {
        // Windows: K = C x 3 x 3 (dilation 2 across), N = 9 x 17 output positions, at column
        // step 1 and 2; a batch of 2 images.
        for step in [1i64, 2] {
            let images = random(dtype, 2 * c * h * w, 3 + step as u64);
            let fine = [
                (2, image),
                (c, (h * w) as i64),
                (3, w as i64),
                (3, 2),
                (9, 2 * w as i64),
                (17, step),
            ];
            let (k, n) = (c * 9, 9 * 17);
            let (bv, bg) = split_view(&images, &[2, k, n], 1, &fine, &[1, 3, 2]);
            let m = 70;
            let a = random(dtype, m * k, 9);
            let a_op = MatMulOperand::stored(Value::Input(0));
            let b_op = read_through(1, bv);
            let mut a_shaped = a.clone();
            a_shaped.shape = vec![m, k];
            gemm_agrees(
                &gemm,
                [(&a_shaped, &a_op), (&images, &b_op)],
                [(&a_shaped, &a_op), (&bg, &a_op)],
                (out_dtype, &[2, m, n]),
                &format!("{dtype} windows step {step}"),
            );
        }
        // A: rows (3 x 11, strides 700 and 3), columns (20 x 30, strides 1 and 33).
        let (m, k, n) = (33usize, 600usize, 50usize);
        let buf = random(dtype, 3000, 11);
        let fine = [(3, 700), (11, 3), (20, 1), (30, 33)];
        let (av, ag) = split_view(&buf, &[m, k], 2, &fine, &[2, 2]);
        let b = random(dtype, k * n, 12);
        let mut b_shaped = b.clone();
        b_shaped.shape = vec![k, n];
        let stored = MatMulOperand::stored(Value::Input(1));
        let a_op = read_through(0, av);
        gemm_agrees(
            &gemm,
            [(&buf, &a_op), (&b_shaped, &stored)],
            [(&ag, &stored), (&b_shaped, &stored)],
            (out_dtype, &[m, n]),
            &format!("{dtype} split rows and columns"),
        );
    }
}

/// Windows read from a zero padding of a batch of images (a padded convolution: padding on
/// both spatial axes, uneven, at column steps 1 and 2) give the product of the windows of the
/// padded images built by hand: the packers make the zeros. A left operand read through a
/// padding (built before the product) does too.
#[test]
fn operands_read_through_a_padding_give_the_padded_product() {
    let gemm = gemm();
    // Output rows of 26 and, at step 2, of 16 positions: the packers' runs of every length
    // class (whole vectors and a tail from the end, two half vectors, one by one).
    for (c, h, w) in [(3usize, 13usize, 50usize), (2, 9, 30)] {
        let padding = crate::shape::Padding {
            source: vec![2, c, h, w],
            before: vec![0, 0, 1, 2],
            after: vec![0, 0, 2, 1],
        };
        let padded = padding.padded();
        let (hp, wp) = (padded[2], padded[3]);
        for (dtype, out_dtype) in [
            (DType::F32, DType::F32),
            (DType::F16, DType::F32),
            (DType::BF16, DType::BF16),
        ] {
            let images = random(dtype, 2 * c * h * w, 21);
            let mut shaped = images.clone();
            shaped.shape = padding.source.clone();
            let built = Buffer::padded_from(shaped.elements(), &padding)
                .unwrap()
                .unwrap();
            for step in [1usize, 2] {
                let (oh, ow) = ((hp - 3) / step + 1, (wp - 3) / step + 1);
                let fine = [
                    (2, (c * hp * wp) as i64),
                    (c, (hp * wp) as i64),
                    (3, wp as i64),
                    (3, 1),
                    (oh, (step * wp) as i64),
                    (ow, step as i64),
                ];
                let (k, n) = (c * 9, oh * ow);
                let (mut bv, bg) = split_view(&built, &[2, k, n], 0, &fine, &[1, 3, 2]);
                bv.padding = Some(padding.clone());
                let m = 20;
                let mut a = random(dtype, m * k, 22);
                a.shape = vec![m, k];
                let a_op = MatMulOperand::stored(Value::Input(0));
                let b_op = read_through(1, bv);
                gemm_agrees(
                    &gemm,
                    [(&a, &a_op), (&shaped, &b_op)],
                    [(&a, &a_op), (&bg, &a_op)],
                    (out_dtype, &[2, m, n]),
                    &format!("{dtype} padded windows step {step}"),
                );
                if dtype == DType::F32 {
                    // An absorbed cast to bf16 (AMP), rounded while the windows are packed,
                    // gives the bits of the windows of an image rounded beforehand.
                    let rounded = rounded_to_bf16(&shaped);
                    let cast = MatMulOperand {
                        cast: Some(DType::BF16),
                        ..b_op.clone()
                    };
                    let product = |b: &Buffer, b_op: &MatMulOperand| {
                        let mut out = Buffer::zeroed(DType::F32, &[2, m, n]);
                        gemm.matmul(a.elements(), &a_op, b.elements(), b_op, out.elements_mut())
                            .unwrap();
                        out
                    };
                    let what = format!("bf16 cast of padded windows step {step}");
                    assert_same_bits(&product(&shaped, &cast), &product(&rounded, &b_op), &what);
                }
                // The same windows as the left operand, transposed: [2, n, k] through the padding.
                let mut av = b_op.view.clone().unwrap();
                av.shape = vec![2, n, k];
                av.split = Some(crate::shape::SplitAxes {
                    fine: vec![2, oh, ow, c, 3, 3],
                    counts: vec![1, 2, 3],
                });
                let order = [0, 4, 5, 1, 2, 3];
                av.strided.strides = order.iter().map(|&i| fine[i].1).collect();
                let left = read_through(0, av);
                let mut b = random(dtype, k * m, 23);
                b.shape = vec![k, m];
                gemm_agrees(
                    &gemm,
                    [(&shaped, &left), (&b, &a_op)],
                    [(&shaped, &left), (&b, &a_op)],
                    (out_dtype, &[2, n, m]),
                    &format!("{dtype} padded left step {step}"),
                );
            }
        }
    }
}

/// The GEMM's product of `operands` within its tolerance of the portable product
/// ([`matmul::matmul`]) of `reference` (the same operands, read another way or not), both of
/// `dtype` and `shape`.
fn gemm_agrees(
    gemm: &Gemm,
    operands: [(&Buffer, &MatMulOperand); 2],
    reference: [(&Buffer, &MatMulOperand); 2],
    (dtype, shape): (DType, &[usize]),
    what: &str,
) {
    let [(ra, ra_op), (rb, rb_op)] = reference;
    let mut want = Buffer::zeroed(dtype, shape);
    matmul::matmul(ra, ra_op, rb, rb_op, &mut want).unwrap();
    let [(a, a_op), (b, b_op)] = operands;
    let mut got = Buffer::zeroed(dtype, shape);
    gemm.matmul(a.elements(), a_op, b.elements(), b_op, got.elements_mut())
        .unwrap();
    assert_close(&got, &want, dtype, what);
}

/// `got` within the GEMM's tolerance of `want` (NaN where it is NaN).
fn assert_close(got: &Buffer, want: &Buffer, dtype: DType, what: &str) {
    let scale = (0..want.len())
        .map(|i| want.get(i).abs())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let rtol = if dtype == DType::BF16 { 1e-2 } else { 1e-5 };
    for i in 0..want.len() {
        let (x, y) = (got.get(i), want.get(i));
        let same =
            (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= rtol * (y.abs() + scale);
        assert!(same, "{what}: [{i}] {x} vs {y}");
    }
}

/// A call of one matrix product (no batch, no sub-axes, no padding).
fn one_product(sizes: [i64; 11], strides: [i64; 6]) -> Call {
    Call {
        sizes,
        strides,
        offsets: vec![0, 0, 0],
        split: None,
        zeros: None,
        image: None,
    }
}

/// `got` and `want` hold the same bits (NaN where the other is NaN).
fn assert_same_bits(got: &Buffer, want: &Buffer, what: &str) {
    for i in 0..want.len() {
        let (x, y) = (got.get(i), want.get(i));
        assert!(
            (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits(),
            "{what} [{i}]: {x} vs {y}"
        );
    }
}

/// The sizes of a call of `batches` products `m x k` by `k x n` of two operands stored as
/// `dtype`, for a product of `out_dtype` (the operands rounded as it demands).
fn call_sizes([batches, m, k, n]: [usize; 4], dtype: DType, out_dtype: DType) -> [i64; 11] {
    let plan = operand_plan(dtype, None, out_dtype).unwrap();
    let out = code(out_dtype).unwrap();
    [
        batches as i64,
        m as i64,
        k as i64,
        n as i64,
        plan[0],
        plan[0],
        out,
        plan[1],
        plan[2],
        plan[1],
        plan[2],
    ]
}

/// `x`'s values rounded to bf16 ([`DType::round`], to nearest with ties to even), kept in
/// `x`'s dtype and shape: operands whose product needs no rounding of its own.
fn rounded_to_bf16(x: &Buffer) -> Buffer {
    let mut r = x.clone();
    for i in 0..r.len() {
        r.set(i, DType::BF16.round(x.get(i)));
    }
    r
}
