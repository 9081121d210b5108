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
