//! Values: drawing input elements, and deciding whether two results agree.

use super::*;

/// Random inputs for every input variable. `round` picks the flavour: 0 ordinary values,
/// 1 zeros of both signs and small exact values, 2 tiny and huge magnitudes, 3 with ±Inf and
/// NaN mixed in.
pub(super) fn draw_inputs(instance: &Instance, round: usize, rng: &mut ChaCha8Rng) -> Tensors {
    let flavour = round % 4;
    instance
        .tensors
        .iter()
        .filter(|(_, b)| b.constant.is_none())
        .map(|(var, b)| {
            let values = (0..numel(&b.ty.shape))
                .map(|_| draw_value(b.ty.dtype, flavour, rng))
                .collect();
            let t = Tensor::from_values(b.ty.dtype, &b.ty.shape, values)
                .expect("value count matches the shape");
            (var_name(*var), t)
        })
        .collect()
}

pub(super) fn draw_value(dtype: DType, flavour: usize, rng: &mut ChaCha8Rng) -> f64 {
    pub(super) const SIMPLE: [f64; 10] = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, 0.25];
    match dtype.category() {
        Category::Bool => f64::from(u8::from(rng.random_bool(0.5))),
        Category::Integer => {
            let (lo, hi) = dtype.int_range().unwrap_or((i64::MIN, i64::MAX));
            let (lo, hi) = (lo.max(-(1 << 40)) as f64, hi.min(1 << 40) as f64);
            // Values a narrow dtype cannot hold are rounded into it (truncated, saturated).
            let value = match flavour {
                0 => rng.random_range(-10..=10) as f64,
                1 => [0.0, 1.0, -1.0, 2.0, -2.0][rng.random_range(0..5)],
                // The ends of the range, where negation and addition wrap.
                _ if dtype != DType::I64 && rng.random_bool(0.15) => {
                    [lo, hi][rng.random_range(0..2)]
                }
                _ if rng.random_bool(0.4) => (rng.random_range(lo..=hi)).trunc(),
                _ => rng.random_range(-100..=100) as f64,
            };
            dtype.round(value)
        }
        Category::Float => {
            let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            match flavour {
                0 => rng.random_range(-3.0..3.0),
                1 if rng.random_bool(0.6) => SIMPLE[rng.random_range(0..SIMPLE.len())],
                1 => rng.random_range(-3.0..3.0),
                2 => match rng.random_range(0..10) {
                    0..3 => sign * smallest_normal(dtype) * rng.random_range(0.01..4.0),
                    3..6 => sign * largest_finite(dtype) * rng.random_range(0.25..1.0),
                    6 => sign * 0.0,
                    _ => sign * 10f64.powf(rng.random_range(-4.0..4.0)),
                },
                _ => match rng.random_range(0..8) {
                    0 => f64::INFINITY,
                    1 => f64::NEG_INFINITY,
                    2 => f64::NAN,
                    3..5 => SIMPLE[rng.random_range(0..SIMPLE.len())],
                    _ => rng.random_range(-3.0..3.0),
                },
            }
        }
    }
}

/// Values a counterexample is simplified toward, simplest first.
pub(super) fn simple_values(dtype: DType) -> &'static [f64] {
    match dtype.category() {
        Category::Bool => &[0.0, 1.0],
        Category::Integer => &[0.0, 1.0, -1.0, 2.0],
        Category::Float => &[0.0, 1.0, -1.0, 2.0, 0.5, 0.1],
    }
}

/// Unit roundoff: half the distance from 1 to the next value.
pub(super) fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        DType::F64 => 2f64.powi(-53),
        _ => 0.0,
    }
}

pub(super) fn smallest_normal(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-14),
        DType::BF16 | DType::F32 => 2f64.powi(-126),
        DType::F64 => f64::MIN_POSITIVE,
        _ => 1.0,
    }
}

/// Whether a float tensor holds a nonzero value below its dtype's smallest normal: a result
/// that underflowed gradually and kept only some of its significant bits.
pub(super) fn holds_subnormal(t: &Tensor) -> bool {
    if !t.dtype.is_float() {
        return false;
    }
    let normal = smallest_normal(t.dtype);
    t.floats().iter().any(|&x| x != 0.0 && x.abs() < normal)
}

pub(super) fn largest_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        DType::F32 => f64::from(f32::MAX),
        DType::F64 => f64::MAX,
        DType::Bool => 1.0,
        _ => dtype.int_range().map_or(1.0, |(_, hi)| hi as f64),
    }
}

/// How two results are compared.
///
/// Two sound forms of a computation round differently: `sum_to_size(a) + sum_to_size(b)` and
/// `sum_to_size(a + b)` differ by rounding errors as large as the *terms* (not the result)
/// when the sum cancels. So the tolerance of an element is
///
/// `2·u·(ops + 1)·(|left| + |right| + scale) + (ops + 1)·smallest_normal`
///
/// where `u` is the output dtype's unit roundoff (2⁻²⁴ for f32), `ops` the op applications of
/// both sides (each may round once), and `scale` the largest magnitude any value of either
/// side has at that element: a value whose shape broadcasts to the output's contributes
/// elementwise, any other (a value later reduced) contributes the sum of its magnitudes. For
/// f32 that is a few 1e-6 relative: an f32 → f16 → f32 round trip (error up to 2⁻¹² relative)
/// is caught, while reordered sums pass. Integer and bool results must be equal.
///
/// Non-finite values are compared exactly: NaN where the other side has NaN, infinities
/// equal. The one exception is overflow: where `scale` is within a factor 2 of the largest
/// finite value of a float dtype in play, a sound reordering can overflow on one side only,
/// so such elements are not compared.
///
/// The sign of zero is compared where it carries information: both sides exactly zero with
/// different signs fail when no side sums (`x + 0 ⇒ x` turns −0.0 into +0.0, and `1/x` tells
/// them apart). A zero sum's sign is the accumulator's convention (+0.0 + −0.0 is +0.0 in any
/// order), which no rule about sums could preserve, so it is ignored there.
///
/// A rule marked `finite_only` claims equality in real arithmetic: an element where either
/// side is infinite or NaN (a division by zero, an overflow) is outside that claim and is not
/// compared; every finite element still is. Real numbers have no signed zero, so the sign of
/// an exact zero is not compared either; and an instance where either side computes a value
/// that underflows into the subnormals (which keeps only some of its bits, an error a later
/// multiply by a huge value magnifies past any relative tolerance) is skipped as a whole.
pub(super) struct Comparison {
    pub(super) ops: usize,
    pub(super) sums: bool,
    pub(super) finite_only: bool,
}

impl Comparison {
    /// The first element that differs, if any.
    pub(super) fn first_difference<'a>(
        &self,
        l: &Tensor,
        r: &Tensor,
        values: impl Iterator<Item = &'a Tensor>,
    ) -> Option<Failure> {
        let shape = l.shape().to_vec();
        let mut scale = ArrayD::<f64>::zeros(IxDyn(&shape));
        let mut overflow_limit = f64::INFINITY;
        for v in values {
            if v.dtype.is_float() {
                overflow_limit = overflow_limit.min(0.5 * largest_finite(v.dtype));
            }
            let mag = v
                .floats()
                .mapv(|x| if x.is_finite() { x.abs() } else { 0.0 });
            if broadcasts_to(v.shape(), &shape) {
                if let Some(b) = mag.broadcast(IxDyn(&shape)) {
                    scale.zip_mut_with(&b, |s, &m| *s = s.max(m));
                }
            } else {
                let total: f64 = mag.iter().sum();
                scale.mapv_inplace(|s| s.max(total));
            }
        }
        if let (Data::Int(li), Data::Int(ri)) = (&l.data, &r.data) {
            // Integers are compared as integers: neighbours beyond 2^53 are different values.
            return li
                .indexed_iter()
                .zip(ri.iter())
                .find(|((_, a), b)| a != b)
                .map(|((index, &a), &b)| Failure::Value {
                    index: index.slice().to_vec(),
                    lhs: a as f64,
                    rhs: b as f64,
                    why: "integer results must be equal".into(),
                });
        }
        let (lf, rf) = (l.floats(), r.floats());
        for ((index, &a), (&b, &s)) in lf.indexed_iter().zip(rf.iter().zip(&scale)) {
            if let Some(why) = self.judge(l.dtype, a, b, s, overflow_limit) {
                return Some(Failure::Value {
                    index: index.slice().to_vec(),
                    lhs: a,
                    rhs: b,
                    why,
                });
            }
        }
        None
    }

    /// Why `a` (left) and `b` (right) differ, given the magnitude `scale` at their element;
    /// `None` when they agree.
    pub(super) fn judge(
        &self,
        dtype: DType,
        a: f64,
        b: f64,
        scale: f64,
        overflow: f64,
    ) -> Option<String> {
        let identical = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let non_finite = !a.is_finite() || !b.is_finite();
        let overflowed = non_finite && scale >= overflow;
        if identical || overflowed || (non_finite && self.finite_only) {
            return None;
        }
        if !dtype.is_float() {
            return (a != b).then(|| "integer and bool results must be equal".to_string());
        }
        if a.is_nan() || b.is_nan() {
            return Some("NaN on one side only".into());
        }
        if a.is_infinite() || b.is_infinite() {
            return Some("infinities must be equal".into());
        }
        if a == 0.0 && b == 0.0 {
            return (!self.sums && !self.finite_only)
                .then(|| "the sign of an exact zero changes".to_string());
        }
        let k = (self.ops + 1) as f64;
        let tol = 2.0 * unit_roundoff(dtype) * k * (a.abs() + b.abs() + scale)
            + k * smallest_normal(dtype);
        let diff = (a - b).abs();
        (diff > tol).then(|| format!("differs by {} (tolerance {})", number(diff), number(tol)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], values: &[f64]) -> Tensor {
        Tensor::from_values(DType::F32, shape, values.to_vec()).expect("shape fits")
    }

    fn differs(cmp: &Comparison, l: &Tensor, r: &Tensor, others: &[&Tensor]) -> Option<Failure> {
        let all: Vec<&Tensor> = [l, r].into_iter().chain(others.iter().copied()).collect();
        cmp.first_difference(l, r, all.into_iter())
    }

    const POINTWISE: Comparison = Comparison {
        ops: 2,
        sums: false,
        finite_only: false,
    };
    const SUMMING: Comparison = Comparison {
        ops: 3,
        sums: true,
        finite_only: false,
    };
    const REAL: Comparison = Comparison {
        ops: 3,
        sums: true,
        finite_only: true,
    };

    #[test]
    fn finite_only_rules_skip_non_finite_elements_but_not_finite_ones() {
        // sum([0, 1]) * -inf = -inf, but sum([0 * -inf, 1 * -inf]) = NaN: outside the claim.
        let l = f32s(&[2], &[f64::NEG_INFINITY, 3.0]);
        let r = f32s(&[2], &[f64::NAN, 3.0]);
        assert!(differs(&REAL, &l, &r, &[]).is_none());
        assert!(differs(&SUMMING, &l, &r, &[]).is_some());
        // A finite difference is still a difference.
        let r = f32s(&[2], &[f64::NAN, 3.5]);
        assert!(differs(&REAL, &l, &r, &[]).is_some());
    }

    #[test]
    fn an_f16_round_trip_is_beyond_f32_tolerance() {
        // 1.1 in f16 is 1.099609375: a relative change of 3.6e-4, where f32 rounding is 6e-8.
        let x = f32s(&[1], &[1.1]);
        let trip = f32s(&[1], &[1.099609375]);
        let failure = differs(&POINTWISE, &trip, &x, &[]).expect("caught");
        assert!(matches!(failure, Failure::Value { ref index, .. } if index == &[0]));
    }

    #[test]
    fn cancellation_in_a_sum_is_rounding_not_a_difference() {
        // a + b summed two ways: 1e8 + 1 - 1e8 is 0 in f32 one way and 1 the other. The terms
        // (1e8) set the scale, so a difference of 1 is within 2·2⁻²⁴·4·1e8 ≈ 48.
        let terms = f32s(&[3], &[1e8, 1.0, -1e8]);
        let zero = f32s(&[], &[0.0]);
        let one = f32s(&[], &[1.0]);
        assert_eq!(differs(&SUMMING, &zero, &one, &[&terms]), None);
        // Without the terms the same difference is real.
        assert!(differs(&SUMMING, &zero, &one, &[]).is_some());
    }

    #[test]
    fn signed_zeros_count_unless_a_sum_made_them() {
        let pos = f32s(&[2], &[0.0, 1.0]);
        let neg = f32s(&[2], &[-0.0, 1.0]);
        let failure = differs(&POINTWISE, &pos, &neg, &[]).expect("x + 0 is not x at -0.0");
        assert!(matches!(failure, Failure::Value { ref why, .. } if why.contains("sign")));
        assert_eq!(differs(&SUMMING, &pos, &neg, &[]), None);
    }

    #[test]
    fn nan_and_infinity_must_match_exactly() {
        let nan = f32s(&[2], &[f64::NAN, 2.0]);
        let zero = f32s(&[2], &[0.0, 2.0]);
        let failure = differs(&POINTWISE, &nan, &zero, &[]).expect("inf * 0 is NaN, not 0");
        assert!(matches!(failure, Failure::Value { ref why, .. } if why.contains("NaN")));
        assert_eq!(differs(&POINTWISE, &nan, &nan.clone(), &[]), None);
        let inf = f32s(&[1], &[f64::INFINITY]);
        let ninf = f32s(&[1], &[f64::NEG_INFINITY]);
        assert!(differs(&POINTWISE, &inf, &ninf, &[]).is_some());
    }

    #[test]
    fn overflow_near_the_largest_value_is_not_compared() {
        // Summed in another order, 2e38 + 2e38 - 2e38 overflows on one side only.
        let big = f32s(&[3], &[2e38, 2e38, -2e38]);
        let inf = f32s(&[], &[f64::INFINITY]);
        let finite = f32s(&[], &[2e38]);
        assert_eq!(differs(&SUMMING, &inf, &finite, &[&big]), None);
        // Far from overflow, an infinity on one side is a difference.
        let small = f32s(&[], &[2.0]);
        assert!(differs(&SUMMING, &inf, &small, &[]).is_some());
    }

    #[test]
    fn integers_must_be_equal() {
        let a = Tensor::from_values(DType::I32, &[2], vec![1.0, 2147483647.0]).expect("fits");
        let b = Tensor::from_values(DType::I32, &[2], vec![1.0, 2147483646.0]).expect("fits");
        assert!(differs(&POINTWISE, &a, &b, &[]).is_some());
        assert_eq!(differs(&POINTWISE, &a, &a.clone(), &[]), None);
    }

    #[test]
    fn numbers_print_as_written() {
        assert_eq!(number(2.0), "2");
        assert_eq!(number(-0.0), "-0.0");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(1e30), "1e30");
        assert_eq!(number(f64::NEG_INFINITY), "-inf");
        assert_eq!(number(f64::NAN), "NaN");
        let t = f32s(&[2, 2], &[1.0, -0.0, 0.5, 3.0]);
        assert_eq!(tensor_text(&t), "f32[2, 2] [[1, -0.0], [0.5, 3]]");
    }

    #[test]
    fn the_shape_pool_broadcasts_to_its_base() {
        let pool = shape_pool(&[2, 3]);
        for s in [&[2, 3][..], &[1, 3], &[2, 1], &[3], &[1], &[], &[1, 1]] {
            assert!(pool.iter().any(|p| p == s), "{s:?} in {pool:?}");
        }
        assert!(pool.iter().all(|p| broadcasts_to(p, &[2, 3])));
    }
}
