#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint32_t fb_f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float fb_u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static inline uint64_t fb_d2u(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static inline double fb_u2d(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }

/* f16 bits -> float, exact. Normal numbers rebias the exponent; subnormals are built as
   2^-14 * (1 + m/1024) - 2^-14, which never touches a float subnormal (so DAZ cannot matter);
   Inf and NaN keep their payload. */
static inline float fb_h2f(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t e = em & 0x0f800000u;
    uint32_t normal = em + (112u << 23);
    uint32_t sub = fb_f2u(fb_u2f(em + (113u << 23)) - 0x1p-14f);
    uint32_t r = e == 0x0f800000u ? (em | 0x7f800000u) : (e == 0 ? sub : normal);
    return fb_u2f(r | ((uint32_t)(h & 0x8000u) << 16));
}

/* float -> f16 bits, round to nearest even; overflow gives Inf, NaN stays NaN. Results that
   are f16 subnormals are rounded by the FPU: adding 0.5 aligns the f16 quantum 2^-24 with the
   last bit of the float. Normal results round on the bits directly. */
static inline uint16_t fb_f2h(float x) {
    uint32_t f = fb_f2u(x);
    uint32_t sign = (f >> 16) & 0x8000u;
    f &= 0x7fffffffu;
    uint32_t big = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
    uint32_t sub = fb_f2u(fb_u2f(f) + 0.5f) - (126u << 23);
    uint32_t normal = (f - (112u << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
    uint32_t o = f >= 0x47800000u ? big : (f < 0x38800000u ? sub : normal);
    return (uint16_t)(o | sign);
}

/* bf16 bits -> float, exact. */
static inline float fb_b2f(uint16_t b) { return fb_u2f((uint32_t)b << 16); }

/* float -> bf16 bits, round to nearest even; NaN stays NaN (quieted). */
static inline uint16_t fb_f2b(float x) {
    uint32_t f = fb_f2u(x);
    uint32_t r = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    return (uint16_t)(x != x ? ((f >> 16) | 0x40u) : r);
}

/* double -> float rounded to odd: toward zero, with the last bit set if anything was lost.
   Rounding that to f16 or bf16 to nearest even gives the correctly rounded result of the
   double, as if rounded once. */
static inline float fb_rto(double v) {
    float n = (float)v;
    double nd = (double)n;
    uint32_t inexact = (uint32_t)((nd != v) & (v == v));
    uint32_t away = (uint32_t)(fabs(nd) > fabs(v));
    return fb_u2f((fb_f2u(n) - (inexact & away)) | inexact);
}

static inline float fb_rnd_fh(float x) { return fb_h2f(fb_f2h(x)); }
static inline float fb_rnd_fb(float x) { return fb_b2f(fb_f2b(x)); }
static inline float fb_rnd_dh(double x) { return fb_h2f(fb_f2h(fb_rto(x))); }
static inline float fb_rnd_db(double x) { return fb_b2f(fb_f2b(fb_rto(x))); }

/* trunc and floor. GCC only vectorizes the libm ones under -fno-trapping-math, so they are
   spelled out: below 2^52 (2^23 for float), adding and subtracting 2^52 rounds |x| to an
   integer; stepping down where that rounded up truncates. Larger magnitudes, Inf and NaN are
   already integral (or NaN) and pass through; copysign keeps the sign of zero. */
static inline double fb_trunc(double x) {
    double a = fabs(x);
    double r = (a + 0x1p52) - 0x1p52;
    r = r > a ? r - 1.0 : r;
    return copysign(a < 0x1p52 ? r : a, x);
}
static inline float fb_truncf(float x) {
    float a = fabsf(x);
    float r = (a + 0x1p23f) - 0x1p23f;
    r = r > a ? r - 1.0f : r;
    return copysignf(a < 0x1p23f ? r : a, x);
}
static inline double fb_floor(double x) { double t = fb_trunc(x); return t > x ? t - 1.0 : t; }
static inline float fb_floorf(float x) { float t = fb_truncf(x); return t > x ? t - 1.0f : t; }

/* Integer rounding: toward zero, saturating, NaN -> 0. Adding +0.0 turns -0 into +0, as the
   integer has no sign of zero. */
static inline double fb_rnd_i32(double v) {
    double t = fb_trunc(v) + 0.0;
    t = t < -2147483648.0 ? -2147483648.0 : t;
    t = t > 2147483647.0 ? 2147483647.0 : t;
    return v != v ? 0.0 : t;
}
static inline double fb_rnd_i64(double v) {
    double t = fb_trunc(v) + 0.0;
    t = t < -0x1p63 ? -0x1p63 : t;
    t = t > 0x1p63 ? 0x1p63 : t;
    return v != v ? 0.0 : t;
}
/* The same into [lo, hi], the range of a narrower integer dtype (i8 to u32). */
static inline double fb_rnd_int(double v, double lo, double hi) {
    double t = fb_trunc(v) + 0.0;
    t = t < lo ? lo : t;
    t = t > hi ? hi : t;
    return v != v ? 0.0 : t;
}
/* A rounded i64 value held as double may be 2^63 (i64::MAX rounded up): saturate it. */
static inline int64_t fb_d2i64(double v) { return v >= 0x1p63 ? INT64_MAX : (int64_t)v; }
/* A coordinate clamped into the non-empty range [start, end): range loads read there. */
static inline int64_t fb_clamp_index(int64_t c, int64_t start, int64_t end) {
    return c < start ? start : (c >= end ? end - 1 : c);
}

/* min/max: NaN wins (as a + b), and -0 orders below +0 (equal values differ only in the sign
   of zero, which the bitwise or/and of their bits resolves). Written as masks rather than
   nested conditionals, which compilers turn into branches: a pooling window's comparisons
   follow the data, and mispredicted branches made a max pool three times slower on real
   weights than on random ones (benches/RESULTS.md, 2026-11-29, session 7). */
static inline float fb_minf(float a, float b) {
    uint32_t ua = fb_f2u(a), ub = fb_f2u(b);
    uint32_t lt = 0u - (uint32_t)(a < b), gt = 0u - (uint32_t)(b < a), nan = 0u - (uint32_t)(a != a || b != b);
    uint32_t r = (ua & lt) | (ub & gt) | ((ua | ub) & ~(lt | gt));
    return fb_u2f((r & ~nan) | (fb_f2u(a + b) & nan));
}
static inline float fb_maxf(float a, float b) {
    uint32_t ua = fb_f2u(a), ub = fb_f2u(b);
    uint32_t gt = 0u - (uint32_t)(a > b), lt = 0u - (uint32_t)(b > a), nan = 0u - (uint32_t)(a != a || b != b);
    uint32_t r = (ua & gt) | (ub & lt) | ((ua & ub) & ~(gt | lt));
    return fb_u2f((r & ~nan) | (fb_f2u(a + b) & nan));
}
static inline double fb_mind(double a, double b) {
    uint64_t ua = fb_d2u(a), ub = fb_d2u(b);
    uint64_t lt = 0u - (uint64_t)(a < b), gt = 0u - (uint64_t)(b < a), nan = 0u - (uint64_t)(a != a || b != b);
    uint64_t r = (ua & lt) | (ub & gt) | ((ua | ub) & ~(lt | gt));
    return fb_u2d((r & ~nan) | (fb_d2u(a + b) & nan));
}
static inline double fb_maxd(double a, double b) {
    uint64_t ua = fb_d2u(a), ub = fb_d2u(b);
    uint64_t gt = 0u - (uint64_t)(a > b), lt = 0u - (uint64_t)(b > a), nan = 0u - (uint64_t)(a != a || b != b);
    uint64_t r = (ua & gt) | (ub & lt) | ((ua & ub) & ~(gt | lt));
    return fb_u2d((r & ~nan) | (fb_d2u(a + b) & nan));
}

/* Max accumulation: once a NaN is in, it stays. */
static inline double fb_maxacc(double acc, double x) { return (x > acc || x != x) ? x : acc; }

/* The constants of exp, shared with the AVX-512 helpers (which must compute the same bits):
   the polynomial q, log2(e), the 1.5 2^23 rounding shift, ln2 in two parts (negated high
   part), and the input clamps (the addend variant's lower one). */
#define FB_EXP_Q4 0x1.6bebf2p-10f
#define FB_EXP_Q3 0x1.1227f6p-7f
#define FB_EXP_Q2 0x1.555674p-5f
#define FB_EXP_Q1 0x1.5554bp-3f
#define FB_EXP_Q0 0x1.fffffep-2f
#define FB_LOG2E 0x1.715476p+0f
#define FB_EXP_SHIFT 0x1.8p23f
#define FB_LN2_NEG_HI -0x1.62e43p-1f
#define FB_LN2_LO 0x1.05c61p-29f
#define FB_EXP_LO -104.0f
#define FB_EXP_ADDEND_LO -87.0f
#define FB_EXP_HI 89.0f
static inline float fb_expf_poly(float r) {
    float q = fmaf(r, FB_EXP_Q4, FB_EXP_Q3);
    q = fmaf(q, r, FB_EXP_Q2);
    q = fmaf(q, r, FB_EXP_Q1);
    q = fmaf(q, r, FB_EXP_Q0);
    return fmaf(q, r * r, r);
}
/* x = n ln2 + r: returns r; *z gets x log2(e) + 1.5 2^23, whose low bits hold n. */
static inline float fb_exp_reduce(float x, float *z) {
    float zz = fmaf(x, FB_LOG2E, FB_EXP_SHIFT);
    float n = zz - FB_EXP_SHIFT;
    *z = zz;
    return fmaf(n, FB_LN2_LO, fmaf(n, FB_LN2_NEG_HI, x));
}
/* 2^(n + bias - 127) for the n held in z; a normal float while n + bias is in [1, 254]. */
static inline float fb_exp_scale(float z, uint32_t bias) {
    return fb_u2f((fb_f2u(z) + (bias - 0x4b400000u)) << 23);
}
static inline float fb_expf_addend(float x) {
    float lo = x < FB_EXP_ADDEND_LO ? FB_EXP_ADDEND_LO : x;
    float z, r = fb_exp_reduce(lo > FB_EXP_HI ? FB_EXP_HI : lo, &z);
    float s = fb_exp_scale(z, 126u);
    return fmaf(s, fb_expf_poly(r), s) * 2.0f;
}
static inline float fb_expf(float x) {
    float lo = x < FB_EXP_LO ? FB_EXP_LO : x;
    float z, r = fb_exp_reduce(lo > FB_EXP_HI ? FB_EXP_HI : lo, &z);
    int32_t n = (int32_t)(fb_f2u(z) - 0x4b400000u);
    int32_t n1 = n < -100 ? -100 : (n > 127 ? 127 : n);
    float s1 = fb_u2f((uint32_t)(n1 + 127) << 23);
    float s2 = fb_u2f((uint32_t)(n - n1 + 127) << 23);
    return fmaf(s1, fb_expf_poly(r), s1) * s2;
}

/* Past this |x|, tanh is 1 in f32 (shared with the AVX-512 helper). */
#define FB_TANH_CAP 9.5f
static inline float fb_tanhf(float x) {
    float a = fabsf(x);
    float z, r = fb_exp_reduce(2.0f * (a > FB_TANH_CAP ? FB_TANH_CAP : a), &z);
    float s = fb_exp_scale(z, 127u);
    float em = fmaf(s, fb_expf_poly(r), s - 1.0f);
    return copysignf(em / (em + 2.0f), x);
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define FB_AVX512 1
/* Streaming stores write whole cache lines without reading them first (no read for
   ownership) and bypass the cache: a third less traffic for a kernel that only writes its
   outputs, but a loss for outputs read again while still cached, so only large launches
   stream (`fbs` in the kernel). */
static inline void fbv_store(float *p, __m512 v, int stream) {
    if (stream) {
        _mm512_stream_ps(p, v);
    } else {
        _mm512_storeu_ps(p, v);
    }
}
static inline __m512 fbv_f(float x) { return _mm512_set1_ps(x); }
static inline __m512 fbv_neg(__m512 x) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}
/* 1.0f where the comparison holds, else +0.0f, as the scalar `(a < b) ? 1.0f : 0.0f`. */
static inline __m512 fbv_bool(__mmask16 m) { return _mm512_maskz_mov_ps(m, _mm512_set1_ps(1.0f)); }
/* c != 0 ? a : b, with NaN != 0 as in C. */
static inline __m512 fbv_select(__m512 c, __m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(c, _mm512_setzero_ps(), _CMP_NEQ_UQ), b, a);
}
/* min/max as fb_minf/fb_maxf: NaN wins (as a + b), -0 orders below +0 (equal values merge
   their sign bits). */
static inline __m512 fbv_min(__m512 a, __m512 b) {
    __m512 eq = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
    __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(b, a, _CMP_LT_OQ), eq, b);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), r, a);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), r, _mm512_add_ps(a, b));
}
static inline __m512 fbv_max(__m512 a, __m512 b) {
    __m512 eq = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
    __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(b, a, _CMP_GT_OQ), eq, b);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), r, a);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), r, _mm512_add_ps(a, b));
}
/* f16 and bf16 storage, as fb_h2f/fb_f2h/fb_b2f/fb_f2b: the hardware conversions are exact
   and round to nearest even (overflow to Inf, subnormals exact); a NaN keeps its payload's
   top bits where the scalar helpers write the canonical quiet NaN, which is still a NaN. */
static inline __m512 fbv_h2f(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 fbv_bits_b2f(__m256i b) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}
static inline __m512 fbv_b2f(const uint16_t *p) {
    return fbv_bits_b2f(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m256i fbv_f2h(__m512 x) {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline __m256i fbv_f2b(__m512 x) {
    __m512i f = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(f, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(f, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(f, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, q));
}
static inline __m512 fbv_rnd_fh(__m512 x) { return _mm512_cvtph_ps(fbv_f2h(x)); }
static inline __m512 fbv_rnd_fb(__m512 x) { return fbv_bits_b2f(fbv_f2b(x)); }
/* 16 halves are 32 bytes: aligned for streaming whenever the row of floats would be. */
static inline void fbv_store_bits(uint16_t *p, __m256i h, int stream) {
    if (stream) {
        _mm256_stream_si256((__m256i *)p, h);
    } else {
        _mm256_storeu_si256((__m256i *)p, h);
    }
}
static inline void fbv_store_h(uint16_t *p, __m512 v, int stream) { fbv_store_bits(p, fbv_f2h(v), stream); }
static inline void fbv_store_b(uint16_t *p, __m512 v, int stream) { fbv_store_bits(p, fbv_f2b(v), stream); }
#endif

#if defined(FB_AVX512)
static inline __m512 fbv_expf_poly(__m512 r) {
    __m512 q = _mm512_fmadd_ps(r, fbv_f(FB_EXP_Q4), fbv_f(FB_EXP_Q3));
    q = _mm512_fmadd_ps(q, r, fbv_f(FB_EXP_Q2));
    q = _mm512_fmadd_ps(q, r, fbv_f(FB_EXP_Q1));
    q = _mm512_fmadd_ps(q, r, fbv_f(FB_EXP_Q0));
    return _mm512_fmadd_ps(q, _mm512_mul_ps(r, r), r);
}
/* x = n ln2 + r: returns r and sets *n, as fb_exp_reduce. */
static inline __m512 fbv_exp_reduce(__m512 x, __m512 *n) {
    __m512 nn = _mm512_sub_ps(_mm512_fmadd_ps(x, fbv_f(FB_LOG2E), fbv_f(FB_EXP_SHIFT)), fbv_f(FB_EXP_SHIFT));
    *n = nn;
    return _mm512_fmadd_ps(nn, fbv_f(FB_LN2_LO), _mm512_fmadd_ps(nn, fbv_f(FB_LN2_NEG_HI), x));
}
/* e^x for x clamped to [lo, FB_EXP_HI]; max(lo, x) and min(hi, x) return x when it is NaN. */
static inline __m512 fbv_expf_from(__m512 x, float lo) {
    __m512 n, r = fbv_exp_reduce(_mm512_min_ps(fbv_f(FB_EXP_HI), _mm512_max_ps(fbv_f(lo), x)), &n);
    return _mm512_scalef_ps(_mm512_add_ps(fbv_expf_poly(r), fbv_f(1.0f)), n);
}
static inline __m512 fbv_expf(__m512 x) { return fbv_expf_from(x, FB_EXP_LO); }
static inline __m512 fbv_expf_addend(__m512 x) { return fbv_expf_from(x, FB_EXP_ADDEND_LO); }
#endif

#if defined(FB_AVX512)
static inline __m512 fbv_tanhf(__m512 x) {
    __m512 a = _mm512_min_ps(fbv_f(FB_TANH_CAP), _mm512_abs_ps(x));
    __m512 n, r = fbv_exp_reduce(_mm512_add_ps(a, a), &n);
    __m512 s = _mm512_scalef_ps(fbv_f(1.0f), n);
    __m512 em = _mm512_fmadd_ps(s, fbv_expf_poly(r), _mm512_sub_ps(s, fbv_f(1.0f)));
    __m512 t = _mm512_div_ps(em, _mm512_add_ps(em, fbv_f(2.0f)));
    /* copysign(t, x): the sign bit from x, the rest from t. */
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(t), _mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff), 0xe4));
}
#endif

void fb_895d74fe9efd81bb(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    int64_t n0 = sizes[0];
    int64_t n1 = sizes[1];
    const float *p0 = (const float *)ptrs[0];
    const int64_t o0 = offsets[0];
    const int64_t s0_0 = strides[0];
    const float *p1 = (const float *)ptrs[1];
    const int64_t o1 = offsets[1];
    const int64_t s1_0 = strides[2];
    const float *p2 = (const float *)ptrs[2];
    const int64_t o2 = offsets[2];
    const int64_t s2_0 = strides[4];
    const float *p3 = (const float *)ptrs[3];
    const int64_t o3 = offsets[3];
    const int64_t s3_0 = strides[6];
    const float *p4 = (const float *)ptrs[4];
    const int64_t o4 = offsets[4];
    const int64_t s4_0 = strides[8];
    float *p5 = (float *)ptrs[5];
    const int64_t o5 = offsets[5];
    const int64_t s5_0 = strides[10];
    float *p6 = (float *)ptrs[6];
    const int64_t o6 = offsets[6];
    const int64_t s6_0 = strides[12];
    if (n0 > 0 && n1 > 0) {
        if (n0 == 1 || (s0_0 == n1 && s1_0 == n1 && s2_0 == n1 && s3_0 == n1 && s4_0 == n1 && s5_0 == n1 && s6_0 == n1)) {
            n1 *= n0;
            n0 = 1;
        }
    }
    const int64_t inner = n1;
    const int64_t outer = n0;
    const int64_t total = outer * inner;
    const int nt = total > 32768 ? omp_get_max_threads() : 1;
    #if defined(FB_AVX512)
    const int fbs = total * 28 > 33554432;
    #endif
    const int64_t nch = (inner + 2047) / 2048;
    const int64_t items = outer * nch;
    #pragma omp parallel for schedule(static) if(nt > 1)
    for (int64_t w = 0; w < items; w++) {
        const int64_t o = nch == 1 ? w : w / nch;
        const int64_t j0 = (w - o * nch) * 2048;
        const int64_t len = inner - j0 < 2048 ? inner - j0 : 2048;
        const int64_t i0 = o;
        {
            const int64_t b0 = o0 + i0 * s0_0 + j0;
            const int64_t b1 = o1 + i0 * s1_0 + j0;
            const int64_t b2 = o2 + i0 * s2_0 + j0;
            const int64_t b3 = o3 + i0 * s3_0 + j0;
            const int64_t b4 = o4 + i0 * s4_0 + j0;
            const int64_t b5 = o5 + i0 * s5_0 + j0;
            const int64_t b6 = o6 + i0 * s6_0 + j0;
            float *d0 = p5 + b5;
            float *d1 = p6 + b6;
            float c5[2048] __attribute__((aligned(64)));
            float c21[2048] __attribute__((aligned(64)));
            #if defined(FB_AVX512)
            const int64_t jv = len - len % 16;
            const int st = fbs && (((uintptr_t)d0 | (uintptr_t)d1) & 63) == 0;
            #else
            const int64_t jv = 0;
            #endif
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                const __m512 v1 = _mm512_set1_ps((1e0f));
                const __m512 v2 = fbv_neg(v0);
                const __m512 v3 = fbv_expf_addend(v2);
                const __m512 v4 = _mm512_add_ps(v1, v3);
                const __m512 v5 = _mm512_div_ps(v1, v4);
                const __m512 v6 = _mm512_loadu_ps(&p1[b1 + j]);
                const __m512 v7 = fbv_neg(v6);
                const __m512 v8 = fbv_expf_addend(v7);
                const __m512 v9 = _mm512_add_ps(v1, v8);
                const __m512 v10 = _mm512_div_ps(v1, v9);
                const __m512 v11 = _mm512_loadu_ps(&p2[b2 + j]);
                const __m512 v12 = _mm512_mul_ps(v10, v11);
                const __m512 v13 = _mm512_loadu_ps(&p3[b3 + j]);
                const __m512 v14 = fbv_neg(v13);
                const __m512 v15 = fbv_expf_addend(v14);
                const __m512 v16 = _mm512_add_ps(v1, v15);
                const __m512 v17 = _mm512_div_ps(v1, v16);
                const __m512 v18 = _mm512_loadu_ps(&p4[b4 + j]);
                const __m512 v19 = fbv_tanhf(v18);
                const __m512 v20 = _mm512_mul_ps(v17, v19);
                const __m512 v21 = _mm512_add_ps(v12, v20);
                _mm512_store_ps(&c5[j], v5);
                _mm512_store_ps(&c21[j], v21);
                fbv_store(&d0[j], v21, st);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v0 = p0[b0 + j];
                const float v1 = (1e0f);
                const float v2 = (-v0);
                const float v3 = fb_expf_addend(v2);
                const float v4 = (v1 + v3);
                const float v5 = (v1 / v4);
                const float v6 = p1[b1 + j];
                const float v7 = (-v6);
                const float v8 = fb_expf_addend(v7);
                const float v9 = (v1 + v8);
                const float v10 = (v1 / v9);
                const float v11 = p2[b2 + j];
                const float v12 = (v10 * v11);
                const float v13 = p3[b3 + j];
                const float v14 = (-v13);
                const float v15 = fb_expf_addend(v14);
                const float v16 = (v1 + v15);
                const float v17 = (v1 / v16);
                const float v18 = p4[b4 + j];
                const float v19 = fb_tanhf(v18);
                const float v20 = (v17 * v19);
                const float v21 = (v12 + v20);
                c5[j] = v5;
                c21[j] = v21;
                d0[j] = v21;
            }
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v5 = _mm512_load_ps(&c5[j]);
                const __m512 v21 = _mm512_load_ps(&c21[j]);
                const __m512 v22 = fbv_tanhf(v21);
                const __m512 v23 = _mm512_mul_ps(v5, v22);
                fbv_store(&d1[j], v23, st);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v5 = c5[j];
                const float v21 = c21[j];
                const float v22 = fb_tanhf(v21);
                const float v23 = (v5 * v22);
                d1[j] = v23;
            }
            #if defined(FB_AVX512)
            if (st) _mm_sfence();
            #endif
        }
    }
}
