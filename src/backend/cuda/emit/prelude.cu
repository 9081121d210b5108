/* fusebox CUDA prelude: conversions and rounding with the reference evaluator's semantics
   (DType::round), NaN-propagating min/max, vector memory access, and the reductions'
   warp/block combination and atomics. Compute is f32 for f16/bf16/f32 values and f64 for
   f64, integer and bool values; arithmetic in the kernels uses the __f*_rn/__d*_rn
   intrinsics, which are never contracted into fused multiply-adds whatever --fmad says. */
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define FBC_BLOCK 256

/* Storage -> compute. Both conversions are exact. */
__device__ __forceinline__ float fbc_h2f(__half x) { return __half2float(x); }
__device__ __forceinline__ float fbc_b2f(__nv_bfloat16 x) { return __bfloat162float(x); }

/* f32 -> f16 / bf16 storage, round to nearest even (cvt.rn): overflow gives Inf, NaN stays
   NaN, f16 subnormals are rounded correctly (NVRTC's default --ftz=false). */
__device__ __forceinline__ __half fbc_f2h(float x) { return __float2half_rn(x); }
__device__ __forceinline__ __nv_bfloat16 fbc_f2b(float x) { return __float2bfloat16_rn(x); }

/* f64 -> f32 rounded to odd: toward zero (cvt.rz, which gives FLT_MAX rather than Inf on
   overflow), with the last bit set if anything was lost. A second rounding of that to f16 or
   bf16 to nearest even equals rounding the double once. */
__device__ __forceinline__ float fbc_rto(double v) {
    const float t = __double2float_rz(v);
    const bool inexact = (double)t != v && v == v;
    return inexact ? __uint_as_float(__float_as_uint(t) | 1u) : t;
}

/* Round (held at compute precision) to f16, bf16, f32. */
__device__ __forceinline__ float fbc_rnd_fh(float x) { return fbc_h2f(fbc_f2h(x)); }
__device__ __forceinline__ float fbc_rnd_fb(float x) { return fbc_b2f(fbc_f2b(x)); }
__device__ __forceinline__ float fbc_rnd_dh(double x) { return fbc_h2f(fbc_f2h(fbc_rto(x))); }
__device__ __forceinline__ float fbc_rnd_db(double x) { return fbc_b2f(fbc_f2b(fbc_rto(x))); }
__device__ __forceinline__ float fbc_rnd_df(double x) { return __double2float_rn(x); }

/* Integer rounding: toward zero, saturating, NaN -> 0. Adding +0.0 turns -0 into +0, as the
   integer has no sign of zero. */
__device__ __forceinline__ double fbc_rnd_i32(double v) {
    double t = __dadd_rn(trunc(v), 0.0);
    t = t < -2147483648.0 ? -2147483648.0 : t;
    t = t > 2147483647.0 ? 2147483647.0 : t;
    return v != v ? 0.0 : t;
}
__device__ __forceinline__ double fbc_rnd_i64(double v) {
    double t = __dadd_rn(trunc(v), 0.0);
    t = t < -9223372036854775808.0 ? -9223372036854775808.0 : t;
    t = t > 9223372036854775808.0 ? 9223372036854775808.0 : t;
    return v != v ? 0.0 : t;
}
/* The same into [lo, hi], the range of a narrower integer dtype (i8 to u32). */
__device__ __forceinline__ double fbc_rnd_int(double v, double lo, double hi) {
    double t = __dadd_rn(trunc(v), 0.0);
    t = t < lo ? lo : t;
    t = t > hi ? hi : t;
    return v != v ? 0.0 : t;
}
/* A rounded i64 value held as double may be 2^63 (i64::MAX rounded up): saturate it. */
__device__ __forceinline__ long long fbc_d2i64(double v) {
    return v >= 9223372036854775808.0 ? 9223372036854775807LL : (long long)v;
}
__device__ __forceinline__ double fbc_rnd_bool(double v) { return v != 0.0 ? 1.0 : 0.0; }

/* min/max: NaN wins, and -0 orders below +0 (equal values differ at most in the sign of zero,
   which the bitwise or/and of their bits resolves). */
__device__ __forceinline__ float fbc_minf(float a, float b) {
    return (a != a || b != b) ? __fadd_rn(a, b)
         : (a < b ? a : (b < a ? b : __uint_as_float(__float_as_uint(a) | __float_as_uint(b))));
}
__device__ __forceinline__ float fbc_maxf(float a, float b) {
    return (a != a || b != b) ? __fadd_rn(a, b)
         : (a > b ? a : (b > a ? b : __uint_as_float(__float_as_uint(a) & __float_as_uint(b))));
}
__device__ __forceinline__ double fbc_mind(double a, double b) {
    return (a != a || b != b) ? __dadd_rn(a, b)
         : (a < b ? a : (b < a ? b : __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b))));
}
__device__ __forceinline__ double fbc_maxd(double a, double b) {
    return (a != a || b != b) ? __dadd_rn(a, b)
         : (a > b ? a : (b > a ? b : __longlong_as_double(__double_as_longlong(a) & __double_as_longlong(b))));
}

/* Vector access: W elements of T at an address aligned to the chunk (16 bytes, or the whole
   run if shorter), moved as whole chunks. */
template <int B> struct fbc_chunk;
template <> struct fbc_chunk<16> { typedef uint4 type; };
template <> struct fbc_chunk<8> { typedef uint2 type; };
template <> struct fbc_chunk<4> { typedef unsigned int type; };

template <typename T, int W>
__device__ __forceinline__ void fbc_vload(T (&dst)[W], const T *src) {
    constexpr int BYTES = W * (int)sizeof(T);
    constexpr int C = BYTES < 16 ? BYTES : 16;
    typedef typename fbc_chunk<C>::type chunk;
    const chunk *from = reinterpret_cast<const chunk *>(src);
#pragma unroll
    for (int c = 0; c < BYTES / C; ++c) {
        const chunk v = from[c];
        memcpy(reinterpret_cast<char *>(dst) + c * C, &v, C);
    }
}

template <typename T, int W>
__device__ __forceinline__ void fbc_vstore(T *dst, const T (&src)[W]) {
    constexpr int BYTES = W * (int)sizeof(T);
    constexpr int C = BYTES < 16 ? BYTES : 16;
    typedef typename fbc_chunk<C>::type chunk;
    chunk *to = reinterpret_cast<chunk *>(dst);
#pragma unroll
    for (int c = 0; c < BYTES / C; ++c) {
        chunk v;
        memcpy(&v, reinterpret_cast<const char *>(src) + c * C, C);
        to[c] = v;
    }
}

/* A row kernel's dynamic shared memory (its RowPath::Shared row cache), 16-byte aligned. */
__device__ __forceinline__ unsigned char *fbc_row_cache() {
    extern __shared__ __align__(16) unsigned char fbc_row_cache_bytes[];
    return fbc_row_cache_bytes;
}

/* The end of piece s (of `piece` elements) of [0, count), and its start, without overflow in
   the unsigned counter type U (count < half of U's range). */
template <typename U>
__device__ __forceinline__ U fbc_piece_start(U s, U piece, U count) {
    const U start = s * piece;
    return start < count ? start : count;
}
template <typename U>
__device__ __forceinline__ U fbc_piece_end(U start, U piece, U count) {
    return count - start < piece ? count : start + piece;
}

/* Whether an f32 partial sum is finite (x - x is 0 exactly then; NaN for Inf and NaN). */
__device__ __forceinline__ bool fbc_finitef(float x) { return __fsub_rn(x, x) == 0.0f; }
/* Whether a row's f32 divisor may be replaced by its reciprocal: |b| in [2^-126, 2^126], so
   1/b is a normal float (the bound of the IR's "Precision of row kernels"). */
__device__ __forceinline__ bool fbc_recip_ok(float b) {
    const float m = b < 0.0f ? -b : b;
    return m >= 1.17549435e-38f && m <= 8.50705917e37f;
}

/* Reduction combiners on f64 accumulators. Max orders -0 below +0 and lets NaN win, so it is
   commutative and associative: the result does not depend on the order of combination. */
__device__ __forceinline__ double fbc_sum2(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double fbc_max2(double a, double b) { return fbc_maxd(a, b); }
/* ... and on integer accumulators: the sum wraps (unsigned arithmetic, as signed overflow is
   undefined), the max is exact. */
__device__ __forceinline__ long long fbc_sum2(long long a, long long b) {
    return (long long)((unsigned long long)a + (unsigned long long)b);
}
__device__ __forceinline__ long long fbc_max2(long long a, long long b) { return a > b ? a : b; }

/* Combination of `v` over the `lanes` threads of an aligned group (1, 32, or a whole block of
   a multiple of 32 threads, at most FBC_BLOCK), in a fixed order; every thread of the group
   gets the result. A warp combines by xor butterfly (lane i adds lane i^m's value to its own,
   which is the same sum lane i^m forms, so all lanes agree); a block then combines its warps'
   results in warp order through shared memory. The whole block must call it together when
   lanes is the block, and each whole warp when 32. */
template <bool MAX, typename T>
__device__ __forceinline__ T fbc_group(T v, int lanes, T *smem) {
    if (lanes == 1) return v;
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) {
        const T w = __shfl_xor_sync(0xffffffffu, v, m);
        v = MAX ? fbc_max2(v, w) : fbc_sum2(v, w);
    }
    if (lanes == 32) return v;
    if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    v = smem[0];
    for (int w = 1; w < lanes / 32; ++w) v = MAX ? fbc_max2(v, smem[w]) : fbc_sum2(v, smem[w]);
    __syncthreads();
    return v;
}

/* Atomic max on an f64 accumulator, by compare-and-swap on its bits. Stops as soon as the
   stored value already is the maximum (bit for bit), so concurrent NaNs settle too. */
__device__ __forceinline__ void fbc_atomic_max(double *at, double x) {
    unsigned long long *bits = reinterpret_cast<unsigned long long *>(at);
    unsigned long long seen = *reinterpret_cast<volatile unsigned long long *>(bits);
    for (;;) {
        const unsigned long long want = __double_as_longlong(fbc_maxd(__longlong_as_double(seen), x));
        if (want == seen) return;
        const unsigned long long before = atomicCAS(bits, seen, want);
        if (before == seen) return;
        seen = before;
    }
}
