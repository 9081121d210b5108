/* fusebox's CPU GEMM: C = A @ B for f32 products, A and B read through row and column strides
   (so a transposed operand costs nothing) as f32, f16 or bf16, rounded as the product demands
   while they are packed, multiplied in f32, and stored as f32, f16 or bf16, rounded once.

   The structure is the BLIS one, sized for an AVX-512 core with a 1 MB L2 and a 32-48 KB L1:
   the output is cut into MC x NC blocks, which OpenMP threads share; a block's product is the
   sum over KC-deep slices of K, each slice packing an MC x KC piece of A (MR-row strips) and
   a KC x NC piece of B (NR-column strips) into contiguous buffers, and running an MR x NR
   register-blocked microkernel over every strip pair (bf16 pairs on `vdpbf16ps` where both
   operands are bf16 values and the target has AVX512-BF16). A thread keeps the packed A of a
   whole row block, where it is small, for the next blocks it takes of the same rows. A block
   accumulates in an f32 tile that stays in L2; once its last slice is added, it is stored, or
   handed to a fused epilogue (bias, activation, residual: a generated kernel run on the tile
   while it is in cache, see fb_gemm_epilogue below).

   Argument ABI (the kernel ABI's four arrays, see fusebox_gemm below):
     sizes   = { batches, M, K, N, a dtype, b dtype, c dtype,
                 a rounding 1, a rounding 2, b rounding 1, b rounding 2 }
     strides = { A row, A column, B row, B column, C row, C column } (elements)
     offsets = { per batch: A offset, B offset, C offset } (elements)
     ptrs    = { A, B, C, status, epilogue, packed B, sub-axes, padding, image }
   status points to an int64 that receives 0, or 1 where a thread could not allocate its
   buffers (nothing is then guaranteed about C). epilogue is NULL, or an fb_gemm_epilogue.
   packed B is NULL, or an fb_gemm_packed_b the caller keeps across the calls of one run that
   multiply by the same right-hand matrix (an RNN's recurrent weights, once per step): the
   first call packs all of B into it and the later ones read it from there.
   sub-axes is NULL, or an fb_gemm_split: operand axes read through several strides each (the
   im2col matrix of a convolution, whose rows are the channels and kernel offsets and whose
   columns are the output positions, read from the image itself); the strides of such an axis
   above are then unused.
   image is NULL, or an fb_gemm_image: B is a convolution's windows over an f32 image that
   is never materialized padded (see fb_gemm_image); B's column sub-axes and per-matrix
   offsets are then in the image's terms, and its row stride or sub-axes unused.
   padding is NULL, or an fb_gemm_pad: B reads a zero padding of its buffer (a convolution's
   padded image, never written). Its offsets are then the buffer's, and element (k, c) is zero
   unless, on every padded axis p, lo[p] <= rows[p](k) + cols[p](c) < hi[p], the coordinates
   B's row and column sub-axes reach along p (fb_gemm_pad's own sub-axes, whose strides are
   coordinate steps); only such elements are read. B then has sub-axes on both its axes.
   dtype codes: 0 f32, 1 f16, 2 bf16. A rounding is a dtype an operand element is rounded to
   after it is read (0 for none): an absorbed cast first, then the product's dtype. */

#define FB_GEMM_MR 8
#define FB_GEMM_NR 48
#define FB_GEMM_KC 256
#define FB_GEMM_MC 128
#define FB_GEMM_NC 384
/* Packed B of a whole K x NC column block is kept (and reused by the blocks below it) while it
   is at most this many floats; a larger one is packed one KC slice at a time. */
#define FB_GEMM_B_KEEP (8 << 20)
/* Packed A of a whole MC x K row block is kept (and reused by the next blocks the same thread
   takes of the same rows: a Linear's activations beside each column block of the weight, a
   convolution's weights beside every image of the batch) while it is at most this many
   floats; a larger one is packed one KC slice at a time. */
#define FB_GEMM_A_KEEP (1 << 18)

static inline float fb_gemm_load(const void *p, int64_t dtype, int64_t i) {
    switch (dtype) {
    case 1: return fb_h2f(((const uint16_t *)p)[i]);
    case 2: return fb_b2f(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline float fb_gemm_round(float x, int64_t dtype) {
    switch (dtype) {
    case 1: return fb_rnd_fh(x);
    case 2: return fb_rnd_fb(x);
    default: return x;
    }
}

/* The padded axes an operand reads (see fb_gemm_pad): per axis, the valid coordinate range
   and tables of the coordinates its rows and columns reach. */
#define FB_GEMM_PAD 4
typedef struct {
    int64_t n, lo[FB_GEMM_PAD], hi[FB_GEMM_PAD];
    const int64_t *rc[FB_GEMM_PAD], *cc[FB_GEMM_PAD];
} fb_gemm_zeros;

/* An operand as the packers read it: element (r, c) lies at origin + r * rs + c * cs, or where
   the operand has sub-axes, at origin + rt[r] + ct[c] (tables of the row and column offsets,
   NULL for an axis read through its one stride); over a padding, only where `zeros` says. */
typedef struct {
    const void *p;
    int64_t dtype, rs, cs, round1, round2;
    const int64_t *rt, *ct;
    const fb_gemm_zeros *zeros;
    /* Added to every offset before it meets p: a batch matrix's first element, which over a
       padding may lie before the buffer (only the elements read are inside it). */
    int64_t origin;
} fb_gemm_operand;

static inline int64_t fb_gemm_row_at(const fb_gemm_operand *o, int64_t r) { return o->rt ? o->rt[r] : r * o->rs; }
static inline int64_t fb_gemm_col_at(const fb_gemm_operand *o, int64_t c) { return o->ct ? o->ct[c] : c * o->cs; }

/* The element at offset `at` at f32, rounded as the product demands. */
static inline float fb_gemm_elem_at(const fb_gemm_operand *o, int64_t at) {
    float v = fb_gemm_load(o->p, o->dtype, o->origin + at);
    return fb_gemm_round(fb_gemm_round(v, o->round1), o->round2);
}

/* Element (r, c) at f32, rounded as the product demands. */
static inline float fb_gemm_elem(const fb_gemm_operand *o, int64_t r, int64_t c) {
    return fb_gemm_elem_at(o, fb_gemm_row_at(o, r) + fb_gemm_col_at(o, c));
}

/* What the packers' vector copies do to each value on the way: nothing, round it to bf16, or
   swap the two bf16 halves of a 32-bit word (a pair of bf16 values along K, as vdpbf16ps
   reads them: k = 2p in the high half). */
enum { FB_GEMM_AS_IS, FB_GEMM_TO_BF16, FB_GEMM_SWAP_HALVES };

/* How the vector copies may read operand `o`: f32 values through plain strides, used as they
   are (FB_GEMM_AS_IS) or rounded to bf16 and to nothing else (FB_GEMM_TO_BF16: rounding to
   bf16 twice is rounding once); -1 for anything else (f16 or bf16 storage, an f16 rounding,
   sub-axes). */
static inline int fb_gemm_f32_copy(const fb_gemm_operand *o) {
    if (o->dtype != 0 || o->rt || o->ct) return -1;
    if (!o->round1 && !o->round2) return FB_GEMM_AS_IS;
    return (o->round1 | o->round2) == 2 ? FB_GEMM_TO_BF16 : -1;
}

/* An operand axis read through sub-axes: n (size, stride) pairs, outermost first, n = 0 for
   an axis read through its one stride. fb_gemm_split holds A's rows and columns, then B's. */
#define FB_GEMM_SUB 8
typedef struct {
    int64_t n, size[FB_GEMM_SUB], stride[FB_GEMM_SUB];
} fb_gemm_axis;
typedef struct {
    fb_gemm_axis axes[4];
} fb_gemm_split;
typedef struct {
    int64_t n, lo[FB_GEMM_PAD], hi[FB_GEMM_PAD];
    fb_gemm_axis rows[FB_GEMM_PAD], cols[FB_GEMM_PAD];
} fb_gemm_pad;

/* floor(a / b) for b > 0. */
static inline int64_t fb_gemm_floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* The positions t in [0, n) of a run of columns whose coordinate on each padded axis p is
   z->rc[p][k] + start[p] + t * step[p] that lie inside every axis's range: [*t0, *t1). */
static void fb_gemm_valid_run(const fb_gemm_zeros *z, int64_t k, const int64_t *start, const int64_t *step, int64_t n,
                              int64_t *t0, int64_t *t1) {
    int64_t lo_t = 0, hi_t = n;
    for (int64_t p = 0; p < z->n; p++) {
        const int64_t v = z->rc[p][k] + start[p], s = step[p];
        const int64_t lo = z->lo[p] - v, hi = z->hi[p] - v; /* need lo <= t * s < hi */
        int64_t a, b;
        if (s == 0) {
            a = lo <= 0 && 0 < hi ? 0 : n;
            b = n;
        } else if (s == 1) {
            /* A unit step (a stride-1 convolution's positions): no division. */
            a = lo;
            b = hi;
        } else if (s > 0) {
            a = lo <= 0 ? 0 : (lo + s - 1) / s;
            b = hi >= n * s ? n : hi <= 0 ? 0 : (hi + s - 1) / s;
        } else {
            /* t * s < hi  <=>  t > -hi / -s;  lo <= t * s  <=>  t <= -lo / -s */
            a = fb_gemm_floor_div(-hi, -s) + 1;
            b = fb_gemm_floor_div(-lo, -s) + 1;
        }
        if (a > lo_t) lo_t = a;
        if (b < hi_t) hi_t = b;
    }
    if (hi_t < lo_t) hi_t = lo_t;
    *t0 = lo_t;
    *t1 = hi_t;
}

/* The offsets of an axis's `len` indices through its sub-axes (row-major), into `t`. */
static void fb_gemm_axis_table(const fb_gemm_axis *x, int64_t len, int64_t *t) {
    int64_t at[FB_GEMM_SUB] = {0}, off = 0;
    for (int64_t i = 0; i < len; i++) {
        t[i] = off;
        for (int64_t d = x->n - 1; d >= 0; d--) {
            off += x->stride[d];
            if (++at[d] < x->size[d]) break;
            off -= x->stride[d] * x->size[d];
            at[d] = 0;
        }
    }
}

#if defined(__AVX512F__)
/* Eight f32 values rounded to bf16 (nearest, ties to even; a NaN stays a quiet NaN), as f32:
   fb_rnd_fb on each lane. */
static inline __m256 fb_gemm_rnd_fb8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x), high = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), high);
    const __m256i q = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), high);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif

/* The `n` values at `dst` rounded as the product demands of operand `o` (after they were read
   at f32): eight at a time where that is bf16 alone (AMP's casts of f32 activations; the
   scalar loop had made packing a bf16 convolution's windows two thirds of its time). */
static inline void fb_gemm_round_run(const fb_gemm_operand *o, float *dst, int64_t n) {
    if (!o->round1 && !o->round2) return;
    int64_t i = 0;
#if defined(__AVX512F__)
    if ((o->round1 | o->round2) == 2)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, fb_gemm_rnd_fb8(_mm256_loadu_ps(dst + i)));
#endif
    for (; i < n; i++) dst[i] = fb_gemm_round(fb_gemm_round(dst[i], o->round1), o->round2);
}

/* Reads `n` consecutive elements of a row (column stride 1) into `dst` at f32: one loop per
   dtype, so each vectorizes. */
static inline __attribute__((always_inline)) void fb_gemm_load_run(const fb_gemm_operand *o, int64_t start, int64_t n, float *dst) {
    if (o->dtype == 0) {
        /* Runs are short (a strip is 48 columns): vectors, the last one overlapping the one
           before, rather than a call to memcpy per run. */
        const float *s = (const float *)o->p + (o->origin + start);
        int64_t i = 0;
#if defined(__AVX512F__)
        if (n >= 16) {
            for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(s + i));
            if (i < n) _mm512_storeu_ps(dst + n - 16, _mm512_loadu_ps(s + n - 16));
            i = n;
        } else if (n >= 8) {
            const __m256 lo = _mm256_loadu_ps(s), hi = _mm256_loadu_ps(s + n - 8);
            _mm256_storeu_ps(dst, lo);
            _mm256_storeu_ps(dst + n - 8, hi);
            i = n;
        }
#endif
        for (; i < n; i++) dst[i] = s[i];
    } else if (o->dtype == 1) {
        const uint16_t *s = (const uint16_t *)o->p + (o->origin + start);
        int64_t i = 0;
#if defined(__AVX512F__)
        /* The hardware conversion, exact like fb_h2f (which GCC does not vectorize). */
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#endif
        for (; i < n; i++) dst[i] = fb_h2f(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)o->p + (o->origin + start);
        for (int64_t i = 0; i < n; i++) dst[i] = fb_b2f(s[i]);
    }
    fb_gemm_round_run(o, dst, n);
}

/* Reads `n` elements `step` apart (a strided convolution's output positions) into `dst` at
   f32: one loop per dtype, as fb_gemm_load_run. */
static inline void fb_gemm_load_strided(const fb_gemm_operand *o, int64_t start, int64_t n, int64_t step, float *dst) {
    if (o->dtype == 0) {
        const float *s = (const float *)o->p + (o->origin + start);
        int64_t i = 0;
#if defined(__AVX512F__)
        if (step == 2) {
            /* A stride-2 convolution's positions: the even lanes of two vectors, while the
               second vector ends within the run, then the end of the run from its last value
               backwards (masked loads and stores were slower here), short runs one by one. */
            if (n >= 17) {
                const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
                for (; i + 17 <= n; i += 16) {
                    const __m512 lo = _mm512_loadu_ps(s + 2 * i), hi = _mm512_loadu_ps(s + 2 * i + 16);
                    _mm512_storeu_ps(dst + i, _mm512_permutex2var_ps(lo, even, hi));
                }
                /* The last 16 positions again, as the odd lanes of the 32 values that end on the
                   run's last one (they start inside the run, since n >= 17): no load past the
                   run, no masked access, a store over values already written. */
                if (i < n) {
                    const float *e = s + 2 * n - 33;
                    const __m512 lo = _mm512_loadu_ps(e), hi = _mm512_loadu_ps(e + 16);
                    _mm512_storeu_ps(dst + n - 16, _mm512_permutex2var_ps(lo, odd, hi));
                    i = n;
                }
            } else if (n >= 9) {
                /* The first 8 positions (even lanes of 16 values from the start) and the last 8
                   (odd lanes of the 16 that end on the run's last value). */
                const __m256 a0 = _mm256_loadu_ps(s), a1 = _mm256_loadu_ps(s + 8);
                const __m256 b0 = _mm256_loadu_ps(s + 2 * n - 17), b1 = _mm256_loadu_ps(s + 2 * n - 9);
                const __m256 first = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
                const __m256 last = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
                _mm256_storeu_ps(dst, first);
                _mm256_storeu_ps(dst + n - 8, last);
                i = n;
            }
        }
#endif
        for (; i < n; i++) dst[i] = s[i * step];
    } else {
        const uint16_t *s = (const uint16_t *)o->p + (o->origin + start);
        if (o->dtype == 1)
            for (int64_t i = 0; i < n; i++) dst[i] = fb_h2f(s[i * step]);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = fb_b2f(s[i * step]);
    }
    fb_gemm_round_run(o, dst, n);
}

#if defined(__AVX512F__)
static inline __m256 fb_gemm_swap_halves8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(u, 16), _mm256_srli_epi32(u, 16)));
}

/* Eight runs of 32-bit values, `rs` apart, each `kc` long, transposed into `d`: value k of run
   r goes to d[k * ld + r], with `mode` (FB_GEMM_AS_IS ...) applied on the way. Eight values of
   each run at a time, as an 8 x 8 transpose in registers. This is how a row-major A becomes
   MR-row strips (of f32 values, or of bf16 pairs) and a transposed B (a `Linear`'s weight)
   NR-column strips: packing was a fifth of a large product's time when each value went
   through a scalar store of its own. */
static void fb_gemm_transpose8(const float *src, int64_t rs, int64_t kc, float *d, int64_t ld, int mode) {
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        const float *p = src + k;
        __m256 r0 = _mm256_loadu_ps(p), r1 = _mm256_loadu_ps(p + rs), r2 = _mm256_loadu_ps(p + 2 * rs),
               r3 = _mm256_loadu_ps(p + 3 * rs), r4 = _mm256_loadu_ps(p + 4 * rs), r5 = _mm256_loadu_ps(p + 5 * rs),
               r6 = _mm256_loadu_ps(p + 6 * rs), r7 = _mm256_loadu_ps(p + 7 * rs);
        if (mode == FB_GEMM_TO_BF16) {
            r0 = fb_gemm_rnd_fb8(r0), r1 = fb_gemm_rnd_fb8(r1), r2 = fb_gemm_rnd_fb8(r2), r3 = fb_gemm_rnd_fb8(r3);
            r4 = fb_gemm_rnd_fb8(r4), r5 = fb_gemm_rnd_fb8(r5), r6 = fb_gemm_rnd_fb8(r6), r7 = fb_gemm_rnd_fb8(r7);
        } else if (mode == FB_GEMM_SWAP_HALVES) {
            r0 = fb_gemm_swap_halves8(r0), r1 = fb_gemm_swap_halves8(r1), r2 = fb_gemm_swap_halves8(r2);
            r3 = fb_gemm_swap_halves8(r3), r4 = fb_gemm_swap_halves8(r4), r5 = fb_gemm_swap_halves8(r5);
            r6 = fb_gemm_swap_halves8(r6), r7 = fb_gemm_swap_halves8(r7);
        }
        /* Pairs of rows interleaved, then quads, then the two 128-bit halves exchanged. */
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float *o = d + k * ld;
        _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(o + ld, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(o + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(o + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(o + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(o + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(o + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(o + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
    for (; k < kc; k++)
        for (int64_t r = 0; r < 8; r++) {
            /* Read and written as bits (the source may be bf16 pairs). */
            uint32_t w;
            memcpy(&w, src + r * rs + k, 4);
            if (mode == FB_GEMM_SWAP_HALVES) w = (w << 16) | (w >> 16);
            else if (mode == FB_GEMM_TO_BF16) w = fb_f2u(fb_rnd_fb(fb_u2f(w)));
            memcpy(d + k * ld + r, &w, 4);
        }
}
#endif

/* A's rows [r0, r0 + rows) and columns [k0, k0 + kc) into MR-row strips: strip s holds, for
   each k, MR consecutive values of rows s*MR.. (rows past the end are zero, so the microkernel
   always runs whole strips; they only ever reach output rows that are never stored). */
static void fb_gemm_pack_a(const fb_gemm_operand *a, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                           float *dst) {
    const int copy = fb_gemm_f32_copy(a);
    for (int64_t s = 0; s < rows; s += FB_GEMM_MR) {
        int64_t h = rows - s < FB_GEMM_MR ? rows - s : FB_GEMM_MR;
        float *d = dst + s * kc;
        const float *first = copy >= 0 ? (const float *)a->p + (a->origin + (r0 + s) * a->rs + k0 * a->cs) : NULL;
#if defined(__AVX512F__)
        if (copy >= 0 && h == FB_GEMM_MR && a->cs == 1) {
            fb_gemm_transpose8(first, a->rs, kc, d, FB_GEMM_MR, copy);
            continue;
        }
#endif
        if (copy == FB_GEMM_AS_IS && h == FB_GEMM_MR && a->rs == 1) {
            /* A transposed operand: each k's eight rows are neighbours. */
            for (int64_t k = 0; k < kc; k++) memcpy(d + k * FB_GEMM_MR, first + k * a->cs, FB_GEMM_MR * sizeof(float));
            continue;
        }
        if (h < FB_GEMM_MR)
            memset(d, 0, (size_t)(kc * FB_GEMM_MR) * sizeof(float));
        if (a->rt || a->ct) {
            for (int64_t r = 0; r < h; r++) {
                const int64_t base = fb_gemm_row_at(a, r0 + s + r);
                for (int64_t k = 0; k < kc; k++) d[k * FB_GEMM_MR + r] = fb_gemm_elem_at(a, base + fb_gemm_col_at(a, k0 + k));
            }
        } else if (a->cs == 1) {
            float run[FB_GEMM_KC];
            for (int64_t r = 0; r < h; r++) {
                fb_gemm_load_run(a, (r0 + s + r) * a->rs + k0, kc, run);
                for (int64_t k = 0; k < kc; k++) d[k * FB_GEMM_MR + r] = run[k];
            }
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int64_t r = 0; r < h; r++)
                    d[k * FB_GEMM_MR + r] = fb_gemm_elem(a, r0 + s + r, k0 + k);
        }
    }
}

/* B's rows [k0, k0 + kc) and columns [c0, c0 + cols) into NR-column strips: strip s holds,
   for each k, NR consecutive values of columns s*NR.. (zero past the end, as for A). */
static void fb_gemm_pack_b(const fb_gemm_operand *b, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                           float *dst) {
    for (int64_t s = 0; s < cols; s += FB_GEMM_NR) {
        int64_t w = cols - s < FB_GEMM_NR ? cols - s : FB_GEMM_NR;
        float *d = dst + s * kc;
        if (b->rt || b->ct) {
            /* Sub-axes: the strip's columns as runs at a constant step (a row of an image's
               output positions is one run, at the convolution's stride), found once and then
               read for every k. Run i is columns [start[i], start[i + 1]) from offset off[i];
               over a padding, its coordinates on padded axis p are zs[i][p] + t * zt[i][p]
               (a run also breaks where those stop being a progression), so that each k cuts
               it into zeros, the elements read, and zeros. */
            const fb_gemm_zeros *z = b->zeros;
            const int64_t np = z ? z->n : 0;
            int64_t start[FB_GEMM_NR + 1], off[FB_GEMM_NR], step[FB_GEMM_NR];
            int64_t zs[FB_GEMM_NR][FB_GEMM_PAD], zt[FB_GEMM_NR][FB_GEMM_PAD];
            int64_t runs = 0;
            for (int64_t c = 0; c < w; c++) {
                const int64_t col = c0 + s + c, at = fb_gemm_col_at(b, col);
                if (runs > 0 && c - start[runs - 1] == 1) {
                    step[runs - 1] = at - off[runs - 1];
                    for (int64_t p = 0; p < np; p++) zt[runs - 1][p] = z->cc[p][col] - zs[runs - 1][p];
                }
                int extends = runs > 0 && at == off[runs - 1] + (c - start[runs - 1]) * step[runs - 1];
                for (int64_t p = 0; extends && p < np; p++)
                    extends = z->cc[p][col] == zs[runs - 1][p] + (c - start[runs - 1]) * zt[runs - 1][p];
                if (extends) continue;
                start[runs] = c;
                off[runs] = at;
                step[runs] = 1;
                for (int64_t p = 0; p < np; p++) {
                    zs[runs][p] = z->cc[p][col];
                    zt[runs][p] = 0;
                }
                runs++;
            }
            start[runs] = w;
            /* Where a run is whole: the row coordinates v on each padded axis p for which
               every column of run i is inside, whole_lo[p][i] <= v < whole_hi[p][i]. */
            int64_t whole_lo[FB_GEMM_PAD][FB_GEMM_NR], whole_hi[FB_GEMM_PAD][FB_GEMM_NR];
            const int64_t *rc[FB_GEMM_PAD] = {NULL};
            for (int64_t p = 0; p < np; p++) {
                rc[p] = z->rc[p] + k0;
                for (int64_t i = 0; i < runs; i++) {
                    const int64_t last = zs[i][p] + (start[i + 1] - start[i] - 1) * zt[i][p];
                    const int64_t low = zt[i][p] < 0 ? last : zs[i][p], high = zt[i][p] < 0 ? zs[i][p] : last;
                    whole_lo[p][i] = z->lo[p] - low;
                    whole_hi[p][i] = z->hi[p] - high;
                }
            }
            for (int64_t k = 0; k < kc; k++) {
                const int64_t base = fb_gemm_row_at(b, k0 + k);
                float *row = d + k * FB_GEMM_NR;
                for (int64_t i = 0; i < runs; i++) {
                    const int64_t n = start[i + 1] - start[i];
                    float *dst = row + start[i];
                    int whole = 1;
                    for (int64_t p = 0; p < np; p++)
                        whole &= (rc[p][k] >= whole_lo[p][i]) & (rc[p][k] < whole_hi[p][i]);
                    if (whole) {
                        if (step[i] == 1)
                            fb_gemm_load_run(b, base + off[i], n, dst);
                        else
                            fb_gemm_load_strided(b, base + off[i], n, step[i], dst);
                        continue;
                    }
                    int64_t t0, t1;
                    fb_gemm_valid_run(z, k0 + k, zs[i], zt[i], n, &t0, &t1);
                    for (int64_t t = 0; t < t0; t++) dst[t] = 0.0f;
                    if (step[i] == 1)
                        fb_gemm_load_run(b, base + off[i] + t0, t1 - t0, dst + t0);
                    else
                        fb_gemm_load_strided(b, base + off[i] + t0 * step[i], t1 - t0, step[i], dst + t0);
                    for (int64_t t = t1; t < n; t++) dst[t] = 0.0f;
                }
                for (int64_t c = w; c < FB_GEMM_NR; c++) row[c] = 0.0f;
            }
        } else if (b->cs == 1) {
            for (int64_t k = 0; k < kc; k++) {
                fb_gemm_load_run(b, (k0 + k) * b->rs + c0 + s, w, d + k * FB_GEMM_NR);
                for (int64_t c = w; c < FB_GEMM_NR; c++) d[k * FB_GEMM_NR + c] = 0.0f;
            }
        } else if (b->rs == 1) {
            /* A transposed B: columns are contiguous runs along k. */
            float run[FB_GEMM_KC];
            if (w < FB_GEMM_NR)
                memset(d, 0, (size_t)(kc * FB_GEMM_NR) * sizeof(float));
            int64_t c = 0;
#if defined(__AVX512F__)
            const int copy = fb_gemm_f32_copy(b);
            if (copy >= 0) {
                const float *first = (const float *)b->p + (b->origin + k0 + (c0 + s) * b->cs);
                for (; c + 8 <= w; c += 8) fb_gemm_transpose8(first + c * b->cs, b->cs, kc, d + c, FB_GEMM_NR, copy);
            }
#endif
            for (; c < w; c++) {
                fb_gemm_load_run(b, (c0 + s + c) * b->cs + k0, kc, run);
                for (int64_t k = 0; k < kc; k++) d[k * FB_GEMM_NR + c] = run[k];
            }
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int64_t c = 0; c < FB_GEMM_NR; c++)
                    d[k * FB_GEMM_NR + c] = c < w ? fb_gemm_elem(b, k0 + k, c0 + s + c) : 0.0f;
        }
    }
}

#if defined(__AVX512F__)
/* The 8 x 48 accumulator tile both AVX-512 microkernels hold in 24 zmm registers (c<row><part>):
   declared zero, and at the end added to the slices already in `c` when `acc`, then stored. */
#define FB_ROW_ZERO(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps(), c##r##2 = _mm512_setzero_ps();
#define FB_TILE_ZERO FB_ROW_ZERO(0) FB_ROW_ZERO(1) FB_ROW_ZERO(2) FB_ROW_ZERO(3) \
    FB_ROW_ZERO(4) FB_ROW_ZERO(5) FB_ROW_ZERO(6) FB_ROW_ZERO(7)
#define FB_ROW_STORE(r) { float *row = c + (r) * ldc; \
        if (acc) { c##r##0 = _mm512_add_ps(c##r##0, _mm512_loadu_ps(row)); \
                   c##r##1 = _mm512_add_ps(c##r##1, _mm512_loadu_ps(row + 16)); \
                   c##r##2 = _mm512_add_ps(c##r##2, _mm512_loadu_ps(row + 32)); } \
        _mm512_storeu_ps(row, c##r##0); _mm512_storeu_ps(row + 16, c##r##1); _mm512_storeu_ps(row + 32, c##r##2); }
#define FB_TILE_STORE FB_ROW_STORE(0) FB_ROW_STORE(1) FB_ROW_STORE(2) FB_ROW_STORE(3) \
    FB_ROW_STORE(4) FB_ROW_STORE(5) FB_ROW_STORE(6) FB_ROW_STORE(7)

/* One k step of the tile: B's 48 values of row k at `row` times A's 8 values at `a`, added to
   the accumulators. */
#define FB_FMA(r) { __m512 ar = _mm512_set1_ps(a[r]); \
        c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0); \
        c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1); \
        c##r##2 = _mm512_fmadd_ps(ar, b2, c##r##2); }
#define FB_TILE_STEP(row) { \
        const __m512 b0 = _mm512_loadu_ps(row), b1 = _mm512_loadu_ps((row) + 16), b2 = _mm512_loadu_ps((row) + 32); \
        FB_FMA(0) FB_FMA(1) FB_FMA(2) FB_FMA(3) FB_FMA(4) FB_FMA(5) FB_FMA(6) FB_FMA(7) }

/* The MR x NR = 8 x 48 microkernel: 24 zmm accumulators, three B vectors and one broadcast A
   value live per k step (28 of the 32 registers). `acc` adds the tile's earlier slices. */
static inline void fb_gemm_micro(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                                 int64_t ldc, int acc) {
    FB_TILE_ZERO
    for (int64_t k = 0; k < kc; k++, a += FB_GEMM_MR, b += FB_GEMM_NR) FB_TILE_STEP(b)
    FB_TILE_STORE
}

/* The microkernel reading B where it lies rather than packed (see fb_gemm_direct_span): the
   NR columns of row k start at b + koff[k], contiguous. */
static inline void fb_gemm_micro_direct(int64_t kc, const float *restrict a, const float *b, const int64_t *koff,
                                        float *restrict c, int64_t ldc, int acc) {
    FB_TILE_ZERO
    for (int64_t k = 0; k < kc; k++, a += FB_GEMM_MR) FB_TILE_STEP(b + koff[k])
    FB_TILE_STORE
}
#undef FB_TILE_STEP
#undef FB_FMA
#else
/* The portable microkernel: the same tile in plain C, which the compiler vectorizes for
   whatever the target has. */
static inline void fb_gemm_micro(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                                 int64_t ldc, int acc) {
    float t[FB_GEMM_MR][FB_GEMM_NR];
    for (int r = 0; r < FB_GEMM_MR; r++)
        for (int j = 0; j < FB_GEMM_NR; j++) t[r][j] = 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        for (int r = 0; r < FB_GEMM_MR; r++)
            for (int j = 0; j < FB_GEMM_NR; j++) t[r][j] += a[r] * b[j];
        a += FB_GEMM_MR;
        b += FB_GEMM_NR;
    }
    for (int r = 0; r < FB_GEMM_MR; r++)
        for (int j = 0; j < FB_GEMM_NR; j++) c[r * ldc + j] = acc ? c[r * ldc + j] + t[r][j] : t[r][j];
}
#endif

#if defined(__AVX512BF16__)
/* Products whose operands are both bf16 values (a bf16 product, or bf16 operands of an f32 one)
   run on `vdpbf16ps`, which multiplies pairs of bf16 values along K at twice the f32 FMA rate.
   Each packed strip (k-major, `width` values per k, all exact in bf16) is rewritten in place as
   k-pairs: one 32-bit word per (pair, column) holding k = 2p in its high half and 2p + 1 in its
   low half (zero past an odd K's end, in both operands, so the pad adds 0 * 0). The instruction
   adds the high halves' product first, then the low halves', each rounded to nearest even, and
   a product of two bf16 values is exact in f32: so the sum takes the f32 microkernel's steps
   in its order, k ascending, and the two paths agree bit for bit, except that `vdpbf16ps`
   reads bf16 subnormals as zero and flushes subnormal results. In place is sound: word
   p*width + c is written after its two floats are read, and every float still to be read lies
   above it. */
static void fb_gemm_pairs(float *strip, int64_t kc, int64_t width) {
    uint32_t *words = (uint32_t *)(void *)strip;
    for (int64_t p = 0; p < (kc + 1) / 2; p++)
        for (int64_t c = 0; c < width; c++) {
            uint32_t lo, hi = 0;
            memcpy(&lo, strip + 2 * p * width + c, 4);
            if (2 * p + 1 < kc) memcpy(&hi, strip + (2 * p + 1) * width + c, 4);
            uint32_t w = (lo & 0xffff0000u) | (hi >> 16);
            memcpy(words + p * width + c, &w, 4);
        }
}

/* Direct pair packing of an operand stored as bf16 with unit column stride and no rounding
   (the common case: no f32 strip to rewrite). A: the word at row r, columns k0+2p.. is the pair
   itself. B: rows k0+2p and k0+2p+1 interleaved column by column. */
static int fb_gemm_direct_pairs(const fb_gemm_operand *o) {
    return o->dtype == 2 && o->cs == 1 && !o->rt && !o->ct && o->round1 == 0 && o->round2 == 0;
}

static void fb_gemm_pack_a_pairs(const fb_gemm_operand *a, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                                 uint32_t *dst) {
    const int64_t kp = (kc + 1) / 2;
    for (int64_t s = 0; s < rows; s += FB_GEMM_MR) {
        int64_t h = rows - s < FB_GEMM_MR ? rows - s : FB_GEMM_MR;
        uint32_t *d = dst + s * kc; /* strips start where the f32 strips would */
#if defined(__AVX512F__)
        if (h == FB_GEMM_MR) {
            /* The rows' whole pairs are 32-bit words in a row: transposed as f32 strips are. */
            const uint16_t *first = (const uint16_t *)a->p + (a->origin + (r0 + s) * a->rs + k0);
            if ((a->rs & 1) == 0) {
                fb_gemm_transpose8((const float *)(const void *)first, a->rs / 2, kc / 2, (float *)(void *)d,
                                       FB_GEMM_MR, FB_GEMM_SWAP_HALVES);
                if (kc & 1)
                    for (int64_t r = 0; r < FB_GEMM_MR; r++)
                        d[(kp - 1) * FB_GEMM_MR + r] = (uint32_t)first[r * a->rs + kc - 1] << 16;
                continue;
            }
        }
#endif
        for (int64_t r = 0; r < FB_GEMM_MR; r++) {
            if (r >= h) {
                for (int64_t p = 0; p < kp; p++) d[p * FB_GEMM_MR + r] = 0;
                continue;
            }
            const uint16_t *row = (const uint16_t *)a->p + (a->origin + (r0 + s + r) * a->rs + k0);
            for (int64_t p = 0; p < kc / 2; p++) {
                uint32_t w;
                memcpy(&w, row + 2 * p, 4);
                d[p * FB_GEMM_MR + r] = (w << 16) | (w >> 16);
            }
            if (kc & 1) d[(kp - 1) * FB_GEMM_MR + r] = (uint32_t)row[kc - 1] << 16;
        }
    }
}

static void fb_gemm_pack_b_pairs(const fb_gemm_operand *b, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                                 uint32_t *dst) {
    const int64_t kp = (kc + 1) / 2;
    for (int64_t s = 0; s < cols; s += FB_GEMM_NR) {
        int64_t w = cols - s < FB_GEMM_NR ? cols - s : FB_GEMM_NR;
        uint32_t *d = dst + s * kc;
        for (int64_t p = 0; p < kp; p++) {
            const uint16_t *lo = (const uint16_t *)b->p + (b->origin + (k0 + 2 * p) * b->rs + c0 + s);
            const uint16_t *hi = lo + b->rs;
            uint32_t *o = d + p * FB_GEMM_NR;
            if (2 * p + 1 < kc)
                for (int64_t c = 0; c < w; c++) o[c] = ((uint32_t)lo[c] << 16) | hi[c];
            else
                for (int64_t c = 0; c < w; c++) o[c] = (uint32_t)lo[c] << 16;
            for (int64_t c = w; c < FB_GEMM_NR; c++) o[c] = 0;
        }
    }
}

static inline void fb_gemm_micro_bf16(int64_t kc, const uint32_t *restrict a, const uint32_t *restrict b,
                                      float *restrict c, int64_t ldc, int acc) {
    FB_TILE_ZERO
    for (int64_t p = 0; p < (kc + 1) / 2; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16),
                 b2 = (__m512bh)_mm512_loadu_si512(b + 32);
#define FB_DOT(r) { __m512bh ar = (__m512bh)_mm512_set1_epi32((int)a[r]); \
        c##r##0 = _mm512_dpbf16_ps(c##r##0, ar, b0); \
        c##r##1 = _mm512_dpbf16_ps(c##r##1, ar, b1); \
        c##r##2 = _mm512_dpbf16_ps(c##r##2, ar, b2); }
        FB_DOT(0) FB_DOT(1) FB_DOT(2) FB_DOT(3) FB_DOT(4) FB_DOT(5) FB_DOT(6) FB_DOT(7)
#undef FB_DOT
        a += FB_GEMM_MR;
        b += FB_GEMM_NR;
    }
    FB_TILE_STORE
}
#endif

static void fb_gemm_store(const float *tile, int64_t ldt, int64_t rows, int64_t cols, void *out, int64_t dtype,
                          int64_t rsc, int64_t csc, int64_t r0, int64_t c0) {
    for (int64_t r = 0; r < rows; r++) {
        const float *t = tile + r * ldt;
        int64_t base = (r0 + r) * rsc + c0 * csc;
        if (dtype == 0) {
            float *o = (float *)out + base;
            if (csc == 1) memcpy(o, t, (size_t)cols * sizeof(float));
            else for (int64_t c = 0; c < cols; c++) o[c * csc] = t[c];
        } else if (dtype == 1) {
            uint16_t *o = (uint16_t *)out + base;
            for (int64_t c = 0; c < cols; c++) o[c * csc] = fb_f2h(t[c]);
        } else {
            uint16_t *o = (uint16_t *)out + base;
            for (int64_t c = 0; c < cols; c++) o[c * csc] = fb_f2b(t[c]);
        }
    }
}

/* A fused epilogue: a generated kernel (the kernel ABI of lower::ir::Launch, no index-map
   stages and no ranges) over the product's shape [batch.., M, N] whose argument `product`
   reads the product, with its launch for that whole shape. On each finished tile the GEMM
   runs the kernel over the tile alone: sizes 1 on the batch axes and the tile's rows and
   columns on the last two, every argument's offset moved to the tile's first point, the
   product argument pointed at the f32 tile itself (an f32 product), or at the tile rounded to
   the product's dtype in a per-thread scratch (row stride = the tile's columns). The product
   itself is stored as well only where `store_product` asks (something else reads it). */
typedef void (*fb_gemm_kernel)(const int64_t *, const int64_t *, const int64_t *, void *const *);

/* A reduction ending an epilogue (a bias gradient: the column sums of what the epilogue
   computes from the product). The kernel's form run per tile merges its tile's part of each
   result, unrounded, into accumulators of 8 bytes (double, or int64 for integers) laid out as
   the result's buffer: `span` of them, starting from the bits `identity`. Tiles at different
   coordinates along the reduced axes (bit d of `reduced`: domain axis d) share result
   elements, so each such coordinate has a block of its own: no two threads touch one
   accumulator, and the blocks are merged in one order whatever thread ran which tile. */
typedef struct {
    int64_t arg, span, identity, reduced;
} fb_gemm_reduction;

typedef struct {
    fb_gemm_kernel kernel;
    int64_t rank, args, product, store_product;
    const int64_t *sizes;   /* rank */
    const int64_t *strides; /* args x rank */
    const int64_t *offsets; /* args */
    void *const *ptrs;      /* args */
    /* With reductions: `kernel` is the form run per tile, `finish` merges the blocks and
       stores the results, with sizes followed by (blocks, span) per reduction and pointers
       followed by each reduction's first block. */
    fb_gemm_kernel finish;
    int64_t reductions;
    const fb_gemm_reduction *reduction; /* reductions */
    /* Where the batch's matrices are multiplied as one tall matrix (the caller folded them):
       the rows of each, else 0. A tile's rows then run as their parts in each matrix. */
    int64_t fold_rows;
} fb_gemm_epilogue;

/* The blocks of accumulators of an epilogue's reductions for one call: per reduction its
   first block's place in `acc` (in accumulators) and block count, and the tiling that says
   which block a tile's part goes to. */
typedef struct {
    int64_t *first, *count;
    unsigned char *acc;
    int64_t mb, nb;
} fb_gemm_blocks;

/* The block of reduction r for the tile at batch coordinates `at`, row block ib, column block
   jb: the tile's coordinates along the reduced axes, in row-major order. */
static int64_t fb_gemm_block(const fb_gemm_epilogue *e, const fb_gemm_blocks *b, int64_t r, const int64_t *at,
                             int64_t ib, int64_t jb) {
    const int64_t rank = e->rank, reduced = e->reduction[r].reduced;
    int64_t block = 0;
    for (int64_t d = 0; d < rank - 2; d++)
        if (reduced >> d & 1) block = block * e->sizes[d] + at[d];
    if (reduced >> (rank - 2) & 1) block = block * b->mb + ib;
    if (reduced >> (rank - 1) & 1) block = block * b->nb + jb;
    return block;
}

/* Allocates and fills with their identities the blocks of `e`'s reductions over a product of
   mb x nb tiles per batch matrix. Returns 0 where memory runs out (nothing is then held). */
static int fb_gemm_blocks_new(const fb_gemm_epilogue *e, int64_t mb, int64_t nb, fb_gemm_blocks *b) {
    const int64_t n = e->reductions, rank = e->rank;
    b->mb = mb;
    b->nb = nb;
    b->first = (int64_t *)malloc((size_t)(2 * n) * sizeof(int64_t));
    b->acc = NULL;
    if (!b->first) return 0;
    b->count = b->first + n;
    int64_t total = 0;
    for (int64_t r = 0; r < n; r++) {
        const int64_t reduced = e->reduction[r].reduced;
        int64_t count = 1;
        for (int64_t d = 0; d < rank - 2; d++)
            if (reduced >> d & 1) count *= e->sizes[d];
        if (reduced >> (rank - 2) & 1) count *= mb;
        if (reduced >> (rank - 1) & 1) count *= nb;
        b->first[r] = total;
        b->count[r] = count;
        total += count * e->reduction[r].span;
    }
    b->acc = (unsigned char *)malloc((size_t)(total > 0 ? total : 1) * 8);
    if (!b->acc) {
        free(b->first);
        return 0;
    }
    for (int64_t r = 0; r < n; r++) {
        const int64_t end = b->first[r] + b->count[r] * e->reduction[r].span;
        for (int64_t i = b->first[r]; i < end; i++) memcpy(b->acc + 8 * i, &e->reduction[r].identity, 8);
    }
    return 1;
}

/* Every result of `e`'s reductions from its blocks, through the kernel's `finish`. */
static void fb_gemm_blocks_finish(const fb_gemm_epilogue *e, fb_gemm_blocks *b) {
    const int64_t rank = e->rank, args = e->args, n = e->reductions;
    int64_t sizes[rank + 2 * n];
    void *ptrs[args + n];
    for (int64_t d = 0; d < rank; d++) sizes[d] = e->sizes[d];
    for (int64_t a = 0; a < args; a++) ptrs[a] = e->ptrs[a];
    for (int64_t r = 0; r < n; r++) {
        sizes[rank + 2 * r] = b->count[r];
        sizes[rank + 2 * r + 1] = e->reduction[r].span;
        ptrs[args + r] = b->acc + 8 * b->first[r];
    }
    e->finish(sizes, e->strides, e->offsets, (void *const *)ptrs);
}

/* The epilogue over the rows x cols tile at row r0 (row block ib), column c0 (column block jb)
   of batch matrix bi; its reductions' parts into `blocks`. */
static void fb_gemm_epilogue_part(const fb_gemm_epilogue *e, const fb_gemm_blocks *blocks, const float *tile,
                                  int64_t ldt, int64_t rows, int64_t cols, int64_t c_dtype, void *scratch,
                                  int64_t bi, int64_t r0, int64_t c0, int64_t ib, int64_t jb);

/* fb_gemm_epilogue_part over a tile of the product, in each batch matrix the tile holds rows
   of when the batch was folded into one tall matrix (`fold_rows`). */
static void fb_gemm_epilogue_tile(const fb_gemm_epilogue *e, const fb_gemm_blocks *blocks, const float *tile,
                                  int64_t ldt, int64_t rows, int64_t cols, int64_t c_dtype, void *scratch,
                                  int64_t bi, int64_t r0, int64_t c0, int64_t ib, int64_t jb) {
    const int64_t fold = e->fold_rows;
    if (fold <= 0) {
        fb_gemm_epilogue_part(e, blocks, tile, ldt, rows, cols, c_dtype, scratch, bi, r0, c0, ib, jb);
        return;
    }
    for (int64_t r = r0; r < r0 + rows;) {
        const int64_t in = r % fold, n = fold - in < r0 + rows - r ? fold - in : r0 + rows - r;
        fb_gemm_epilogue_part(e, blocks, tile + (r - r0) * ldt, ldt, n, cols, c_dtype, scratch, r / fold, in, c0, ib,
                              jb);
        r += n;
    }
}

static void fb_gemm_epilogue_part(const fb_gemm_epilogue *e, const fb_gemm_blocks *blocks, const float *tile,
                                  int64_t ldt, int64_t rows, int64_t cols, int64_t c_dtype, void *scratch,
                                  int64_t bi, int64_t r0, int64_t c0, int64_t ib, int64_t jb) {
    const int64_t rank = e->rank, args = e->args, p = e->product;
    int64_t at[rank], sizes[rank], strides[args * rank], offsets[args];
    void *ptrs[args];
    /* An f32 product is read from the tile itself; another is rounded into the scratch. */
    const int64_t pitch = c_dtype == 0 ? ldt : cols;
    if (c_dtype != 0) fb_gemm_store(tile, ldt, rows, cols, scratch, c_dtype, cols, 1, 0, 0);
    int64_t rest = bi;
    for (int64_t d = rank - 3; d >= 0; d--) {
        at[d] = rest % e->sizes[d];
        rest /= e->sizes[d];
        sizes[d] = 1;
    }
    at[rank - 2] = r0;
    at[rank - 1] = c0;
    sizes[rank - 2] = rows;
    sizes[rank - 1] = cols;
    for (int64_t a = 0; a < args; a++) {
        int64_t off = e->offsets[a];
        for (int64_t d = 0; d < rank; d++) {
            const int64_t s = e->strides[a * rank + d];
            strides[a * rank + d] = s;
            off += at[d] * s;
        }
        offsets[a] = off;
        ptrs[a] = e->ptrs[a];
    }
    for (int64_t d = 0; d < rank; d++) strides[p * rank + d] = 0;
    strides[p * rank + rank - 2] = rows > 1 ? pitch : 0;
    strides[p * rank + rank - 1] = cols > 1 ? 1 : 0;
    offsets[p] = 0;
    ptrs[p] = c_dtype == 0 ? (void *)tile : scratch;
    for (int64_t r = 0; r < e->reductions; r++) {
        const fb_gemm_reduction *red = &e->reduction[r];
        const int64_t block = blocks->first[r] + fb_gemm_block(e, blocks, r, at, ib, jb) * red->span;
        ptrs[red->arg] = blocks->acc + 8 * block;
    }
    e->kernel(sizes, strides, offsets, (void *const *)ptrs);
}

/* A right-hand matrix packed whole, kept by the caller across calls (ptrs[5]). `data` has room
   for `floats` floats, 64-byte aligned; `key` says what it holds when `valid`: B's address,
   strides, dtype and roundings, K, N, the column block width and whether it is packed in bf16
   pairs. The caller clears `valid` whenever B's contents may have changed (each run). Column
   block jb (of nc columns) starts at jb * K * nc and is laid out as the per-call packing lays
   out a kept block: KC slices one after another, each of ldt / NR strips. */
typedef struct {
    float *data;
    int64_t floats;
    int64_t valid;
    int64_t key[10];
} fb_gemm_packed_b;

/* Slice [k0, k0 + kc) of columns [c0, c0 + cols) of B packed into `dst`, as the microkernel
   reads it (in bf16 pairs with `pairs`). */
static void fb_gemm_pack_b_slice(const fb_gemm_operand *b, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                                 float *dst, int pairs) {
#if defined(__AVX512BF16__)
    if (pairs) {
        if (fb_gemm_direct_pairs(b))
            fb_gemm_pack_b_pairs(b, k0, kc, c0, cols, (uint32_t *)(void *)dst);
        else {
            fb_gemm_pack_b(b, k0, kc, c0, cols, dst);
            for (int64_t j = 0; j < cols; j += FB_GEMM_NR) fb_gemm_pairs(dst + j * kc, kc, FB_GEMM_NR);
        }
        return;
    }
#else
    (void)pairs;
#endif
    fb_gemm_pack_b(b, k0, kc, c0, cols, dst);
}

/* Per-thread packing and tile buffers, kept across calls (OpenMP's threads live as long as
   the process) and grown when a larger product needs more. */
static _Thread_local float *fb_gemm_buf;
static _Thread_local size_t fb_gemm_cap;

static float *fb_gemm_scratch(size_t floats) {
    if (floats > fb_gemm_cap) {
        free(fb_gemm_buf);
        size_t bytes = (floats * sizeof(float) + 63) & ~(size_t)63;
        fb_gemm_buf = (float *)aligned_alloc(64, bytes);
        fb_gemm_cap = fb_gemm_buf ? floats : 0;
    }
    return fb_gemm_buf;
}

static int64_t fb_gemm_round_up(int64_t x, int64_t q) { return (x + q - 1) / q * q; }

/* B read where it lies. A stride-1 convolution's B (rows: channel and kernel offset; columns:
   output positions) reads its padded image at offset rows(k) + cols(c), and cols(c) = oh * Wp +
   ow runs through every offset from 0 to the last but the Wp - W between one output row's end
   and the next row's start. Taken as V "virtual" columns at unit stride (those few extra ones
   computed and dropped), each row of an NR-column strip is NR contiguous floats of the image:
   the microkernel loads them from there (fb_gemm_micro_direct), and B is never packed (packing
   the image's windows was a sixth of a ResNet block's time). Returns V where the column
   offsets `ct` rise and V exceeds N by at most a quarter (any V with `any`), else 0. */
static int64_t fb_gemm_direct_span(const int64_t *ct, int64_t N, int any) {
    if (!ct || N < (any ? 1 : FB_GEMM_NR)) return 0;
    for (int64_t c = 1; c < N; c++)
        if (ct[c] <= ct[c - 1]) return 0;
    const int64_t span = ct[N - 1] - ct[0] + 1;
    return any || span <= N + N / 4 ? span : 0;
}

/* A convolution's B read from its image without building the padded image (stride 1) or its
   phase split (stride s, see phases.rs). In the split buffer such a B would be read from,
   element (k, c) of batch matrix bi lies at outer index outer[k] + offsets[bi] and quotient
   offset offset[k] + ct[c], where the outer index counts (axes before `first`, phase on each
   axis from `first` on) row-major over (padded[..first], factors[first..]) and the quotient
   offset counts the quotient coordinates row-major over ceil(padded[a] / factors[a]) for a
   >= first (`inner` of them). So for one column block and one K slice, B reads a few runs of
   that space, one per outer index its rows reach: the GEMM copies them from the image into a
   per-thread slab (zeros where they fall in the padding), which stays in L2 while every
   strip reads it, rather than packing the windows (a sixth of a ResNet block's time, a
   quarter of a strided convolution's) from a padded image built in memory for each call. */
#define FB_GEMM_IMAGE 8
typedef struct {
    int64_t rank, first, inner, outers;
    int64_t source[FB_GEMM_IMAGE], before[FB_GEMM_IMAGE], after[FB_GEMM_IMAGE], factors[FB_GEMM_IMAGE];
    const int64_t *outer, *offset; /* K each */
} fb_gemm_image;

/* Quotient offsets [lo, lo + n) of outer index O of `g`'s split image, read from the image
   `src`, into dst: each run along the last axis one strided copy between zeros. */
static void fb_gemm_image_row(const fb_gemm_image *g, const float *src, int64_t O, int64_t lo, int64_t n, float *dst) {
    const int64_t rank = g->rank, t = g->first, last = rank - 1;
    const int64_t *f = g->factors, *source = g->source, *before = g->before;
    int64_t padded[FB_GEMM_IMAGE], qs[FB_GEMM_IMAGE], phase[FB_GEMM_IMAGE], pitch[FB_GEMM_IMAGE];
    int64_t step = 1, base = 0, rest = O;
    int inside = O >= 0 && O < g->outers;
    for (int64_t a = rank - 1; a >= 0; a--) {
        padded[a] = before[a] + source[a] + g->after[a];
        qs[a] = a >= t ? (padded[a] + f[a] - 1) / f[a] : padded[a];
        pitch[a] = step;
        step *= source[a];
    }
    for (int64_t a = last; a >= t; a--) {
        phase[a] = rest % f[a];
        rest /= f[a];
    }
    for (int64_t a = t - 1; a >= 0; a--) {
        const int64_t x = rest % padded[a] - before[a];
        rest /= padded[a];
        inside &= x >= 0 && x < source[a];
        base += x * pitch[a];
    }
    const fb_gemm_operand image = {src, 0, 0, 0, 0, 0, NULL, NULL, NULL, 0};
    for (int64_t pos = lo, end = lo + n; pos < end;) {
        float *d = dst + (pos - lo);
        if (!inside || pos < 0 || pos >= g->inner) {
            const int64_t stop = !inside || pos >= g->inner ? end : (end < 0 ? end : 0);
            memset(d, 0, (size_t)(stop - pos) * sizeof(float));
            pos = stop;
            continue;
        }
        const int64_t ql = pos % qs[last], run = end - pos < qs[last] - ql ? end - pos : qs[last] - ql;
        int64_t at = base, r = pos / qs[last];
        int ok = 1;
        for (int64_t a = last - 1; a >= t; a--) {
            const int64_t x = (r % qs[a]) * f[a] + phase[a] - before[a];
            r /= qs[a];
            ok &= x >= 0 && x < source[a];
            at += x * pitch[a];
        }
        /* Along the last axis, element i of the run is image element (ql + i) f + phase - before. */
        const int64_t fl = f[last], shift = phase[last] - before[last];
        int64_t i0 = -fb_gemm_floor_div(shift, fl) - ql, i1 = -fb_gemm_floor_div(shift - source[last], fl) - ql;
        i0 = !ok || i0 < 0 ? (ok ? 0 : run) : (i0 > run ? run : i0);
        i1 = !ok || i1 < i0 ? i0 : (i1 > run ? run : i1);
        memset(d, 0, (size_t)i0 * sizeof(float));
        if (i1 > i0) {
            const int64_t x0 = (ql + i0) * fl + shift;
            if (fl == 1)
                memcpy(d + i0, src + at + x0, (size_t)(i1 - i0) * sizeof(float));
            else
                fb_gemm_load_strided(&image, at + x0, i1 - i0, fl, d + i0);
        }
        memset(d + i1, 0, (size_t)(run - i1) * sizeof(float));
        pos += run;
    }
}

/* The first column whose virtual column (ct[c] - ct[0]) is at least v. */
static int64_t fb_gemm_first_column(const int64_t *ct, int64_t N, int64_t v) {
    int64_t lo = 0, hi = N;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (ct[mid] - ct[0] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* A tile over virtual columns from v0 (see fb_gemm_direct_span) with its columns [cf, cl)
   moved to the front of each row, in order, so that it reads as the tile of those columns.
   Runs of neighbouring columns move together; each moves left (ct rises by at least 1 per
   column), over columns already moved or dropped. */
static void fb_gemm_compact(float *tile, int64_t ldt, int64_t rows, const int64_t *ct, int64_t cf, int64_t cl,
                            int64_t v0) {
    for (int64_t c = cf; c < cl;) {
        int64_t e = c + 1;
        while (e < cl && ct[e] == ct[e - 1] + 1) e++;
        const int64_t from = ct[c] - ct[0] - v0, to = c - cf;
        if (from != to)
            for (int64_t r = 0; r < rows; r++)
                memmove(tile + r * ldt + to, tile + r * ldt + from, (size_t)(e - c) * sizeof(float));
        c = e;
    }
}

void fusebox_gemm(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    const int64_t batches = sizes[0], M = sizes[1], K = sizes[2], N = sizes[3];
    *(int64_t *)ptrs[3] = 0;
    if (batches <= 0 || M <= 0 || N <= 0) {
        /* No tile: an epilogue's reductions are their identities (a mean of nothing NaN). */
        const fb_gemm_epilogue *e = (const fb_gemm_epilogue *)ptrs[4];
        fb_gemm_blocks none = {0};
        if (e && e->reductions > 0) {
            if (!fb_gemm_blocks_new(e, 0, 0, &none)) {
                *(int64_t *)ptrs[3] = 1;
                return;
            }
            fb_gemm_blocks_finish(e, &none);
            free(none.acc);
            free(none.first);
        }
        return;
    }
    const int64_t c_dtype = sizes[6];
    const int64_t rsc = strides[4], csc = strides[5];
    /* The offsets of the operand axes read through sub-axes: A's rows and columns, B's. */
    const fb_gemm_split *split = (const fb_gemm_split *)ptrs[6];
    int64_t *tables[4] = {NULL, NULL, NULL, NULL};
    const int64_t lens[4] = {M, K, K, N};
    for (int i = 0; split && i < 4; i++) {
        /* B's rows over an image are its outer indices and quotient offsets instead. */
        if (split->axes[i].n <= 0 || lens[i] <= 0 || (i == 2 && ptrs[8])) continue;
        tables[i] = (int64_t *)malloc((size_t)lens[i] * sizeof(int64_t));
        if (!tables[i]) {
            for (int j = 0; j < i; j++) free(tables[j]);
            *(int64_t *)ptrs[3] = 1;
            return;
        }
        fb_gemm_axis_table(&split->axes[i], lens[i], tables[i]);
    }

    /* The dtype each operand's values are exact in after its roundings: both bf16 (code 2)
       lets the product run on bf16 pairs where the CPU has them. */
    const int64_t a_exact = sizes[8] ? sizes[8] : (sizes[7] ? sizes[7] : sizes[4]);
    const int64_t b_exact = sizes[10] ? sizes[10] : (sizes[9] ? sizes[9] : sizes[5]);
#if defined(__AVX512BF16__)
    const int pairs = a_exact == 2 && b_exact == 2;
#else
    const int pairs = 0;
    (void)pairs;
    (void)a_exact;
    (void)b_exact;
#endif
    /* B read where it lies (fb_gemm_direct_span): f32 values used as they are, no padding to
       read as zeros, not packed in pairs; N is then the virtual column count for the
       blocking, and a tile's columns are virtual ones until it is finished. */
    const fb_gemm_image *image = (const fb_gemm_image *)ptrs[8];
    int64_t span = image ? fb_gemm_direct_span(tables[3], N, 1) : 0;
    if (image && span == 0) {
        /* The caller promises rising columns (phases.rs); nothing else can read the image. */
        for (int i = 0; i < 4; i++) free(tables[i]);
        *(int64_t *)ptrs[3] = 1;
        return;
    }
#if defined(__AVX512F__)
    if (!image && !pairs && sizes[5] == 0 && !sizes[9] && !sizes[10] && !(ptrs[7] && ((const fb_gemm_pad *)ptrs[7])->n > 0))
        span = fb_gemm_direct_span(tables[3], N, 0);
    if (span > 0 && !image && !tables[2] && K > 0) {
        tables[2] = (int64_t *)malloc((size_t)K * sizeof(int64_t));
        if (!tables[2]) {
            for (int i = 0; i < 4; i++) free(tables[i]);
            *(int64_t *)ptrs[3] = 1;
            return;
        }
        for (int64_t k = 0; k < K; k++) tables[2][k] = k * strides[2];
    }
#endif
    const int direct = span > 0;
    const int64_t NV = direct ? span : N;

    /* Blocks: MC rows (fewer for a short A), NC columns, narrower column blocks when that
       gives the threads too few. */
    int threads = omp_get_max_threads();
    double work = (double)batches * (double)M * (double)N * (double)(K > 0 ? K : 1);
    if (work < 262144.0) threads = 1;
    const int64_t mc = M < FB_GEMM_MC ? fb_gemm_round_up(M, FB_GEMM_MR) : FB_GEMM_MC;
    const int64_t mb = (M + mc - 1) / mc;
    /* As many column blocks as NC-wide ones need, of even width (784 columns as 288, 288
       and 208 rather than 384, 384 and a block of 16 that fills a third of its strip).
       Over an image, wider blocks (four NC wide, or a tile of 2 MC x NC floats where A is
       short): each block's slabs repeat the rows its windows share with the next block's,
       and the copies are what an image's block costs beyond its arithmetic (a ResNet block
       4-5% faster at twice NC, a strided convolution of 128 channels 6-8% at four times). */
    const int64_t wide = 2 * FB_GEMM_NC * (FB_GEMM_MC / mc > 1 ? FB_GEMM_MC / mc : 1);
    const int64_t nc_max = image ? (wide > 4 * FB_GEMM_NC ? wide : 4 * FB_GEMM_NC) : FB_GEMM_NC;
    int64_t nb = (NV + nc_max - 1) / nc_max;
    int64_t nc = fb_gemm_round_up((NV + nb - 1) / nb, FB_GEMM_NR);
    nb = (NV + nc - 1) / nc;
    if (threads > 1 && batches * mb * nb < 4 * threads) {
        /* At least four blocks per thread where N allows (blocks of two strips or more), so
           that a thread the OS preempts holds up little of the product: blocks are handed out
           dynamically. */
        int64_t want = (4 * threads + batches * mb - 1) / (batches * mb);
        nc = fb_gemm_round_up((NV + want - 1) / want, FB_GEMM_NR);
        if (nc < 2 * FB_GEMM_NR) nc = 2 * FB_GEMM_NR;
        if (nc > fb_gemm_round_up(NV, FB_GEMM_NR)) nc = fb_gemm_round_up(NV, FB_GEMM_NR);
        nb = (NV + nc - 1) / nc;
    }
    const int64_t items = batches * mb * nb;
    const int64_t kc_max = K < FB_GEMM_KC ? K : FB_GEMM_KC;
    /* Slices of even depth, a multiple of 8 (a convolution's K = 576 as 3 x 192, not 256,
       256 and 64, whose tile is loaded and stored again for a quarter of the work); at most
       KC deep, and none empty. */
    const int64_t least = K > 0 ? (K + FB_GEMM_KC - 1) / FB_GEMM_KC : 0;
    const int64_t kcs = least > 0 ? fb_gemm_round_up((K + least - 1) / least, 8) : FB_GEMM_KC;
    const int64_t slices = K > 0 ? (K + kcs - 1) / kcs : 0;
    /* Kept only where a thread may reuse it: below another row block. */
    const int keep_b = !direct && mb > 1 && K * nc <= FB_GEMM_B_KEEP;
    const int keep_a = K * mc <= FB_GEMM_A_KEEP;
    const size_t a_floats = (size_t)(mc * (keep_a ? K : kc_max)), b_floats = (size_t)((keep_b ? K : kc_max) * nc);
    const size_t tile_floats = (size_t)(mc * nc);
    const fb_gemm_epilogue *epilogue = (const fb_gemm_epilogue *)ptrs[4];
    /* The epilogue's scratch holds a tile in the product's dtype (f16 or bf16). */
    const size_t scratch_floats = epilogue && c_dtype != 0 ? tile_floats : 0;
    int failed = 0;

    /* B's padded axes: the coordinates its rows and columns reach along each. */
    const fb_gemm_pad *pad = (const fb_gemm_pad *)ptrs[7];
    fb_gemm_zeros zeros = {0};
    int64_t *coords = NULL;
    if (pad && pad->n > 0) {
        zeros.n = pad->n < FB_GEMM_PAD ? pad->n : FB_GEMM_PAD;
        coords = (int64_t *)malloc((size_t)(zeros.n * (K + N) + 1) * sizeof(int64_t));
        if (!coords) {
            for (int i = 0; i < 4; i++) free(tables[i]);
            *(int64_t *)ptrs[3] = 1;
            return;
        }
        for (int64_t p = 0; p < zeros.n; p++) {
            int64_t *rc = coords + p * (K + N), *cc = rc + K;
            fb_gemm_axis_table(&pad->rows[p], K, rc);
            fb_gemm_axis_table(&pad->cols[p], N, cc);
            zeros.lo[p] = pad->lo[p];
            zeros.hi[p] = pad->hi[p];
            zeros.rc[p] = rc;
            zeros.cc[p] = cc;
        }
    }
    const fb_gemm_zeros *b_zeros = coords ? &zeros : NULL;
    /* Over an image (fb_gemm_image): per K slice, the outer indices its rows reach, in order
       of first use (slot q of slice s at slab_outer[s * kcs + q], slice_slots[s] of them);
       per row, where it reads its slab: slot * pitch + its quotient offset less the least. */
    int64_t *slab_outer = NULL, *slab_koff = NULL, *slice_slots = NULL;
    int64_t slab_pitch = 0, slab_low = 0, slab_rows = 0;
    if (image && K > 0) {
        int64_t high = image->offset[0];
        slab_low = image->offset[0];
        for (int64_t k = 1; k < K; k++) {
            if (image->offset[k] < slab_low) slab_low = image->offset[k];
            if (image->offset[k] > high) high = image->offset[k];
        }
        slab_pitch = fb_gemm_round_up(nc + high - slab_low, 16);
        slab_outer = (int64_t *)malloc((size_t)(2 * K + slices) * sizeof(int64_t));
        if (!slab_outer) {
            for (int i = 0; i < 4; i++) free(tables[i]);
            free(coords);
            *(int64_t *)ptrs[3] = 1;
            return;
        }
        slab_koff = slab_outer + K;
        slice_slots = slab_koff + K;
        for (int64_t sl = 0; sl < slices; sl++) {
            const int64_t k0 = sl * kcs, kc = K - k0 < kcs ? K - k0 : kcs;
            int64_t n = 0;
            for (int64_t k = k0; k < k0 + kc; k++) {
                int64_t q = 0;
                while (q < n && slab_outer[k0 + q] != image->outer[k]) q++;
                if (q == n) slab_outer[k0 + n++] = image->outer[k];
                slab_koff[k] = q * slab_pitch + image->offset[k] - slab_low;
            }
            slice_slots[sl] = n;
            if (n > slab_rows) slab_rows = n;
        }
    }
    const size_t slab_floats = (size_t)(slab_rows * slab_pitch);
    /* The epilogue's reductions' accumulators. */
    fb_gemm_blocks blocks = {0};
    if (epilogue && epilogue->reductions > 0 && !fb_gemm_blocks_new(epilogue, mb, nb, &blocks)) {
        for (int i = 0; i < 4; i++) free(tables[i]);
        free(coords);
        free(slab_outer);
        *(int64_t *)ptrs[3] = 1;
        return;
    }

    /* The whole of B from the caller's cache, packed there now unless it holds it already:
       for one matrix (or a batch sharing one), where it fits. */
    fb_gemm_packed_b *cache = (fb_gemm_packed_b *)ptrs[5];
    int shared_b = 1;
    for (int64_t bi = 1; bi < batches; bi++) shared_b &= offsets[3 * bi + 1] == offsets[1];
    const float *cached = NULL;
    if (cache && shared_b && !tables[2] && !tables[3] && K > 0 && cache->data && cache->floats >= K * fb_gemm_round_up(N, FB_GEMM_NR)) {
        const int64_t key[10] = {(int64_t)(intptr_t)ptrs[1] + offsets[1] * (sizes[5] == 0 ? 4 : 2),
                                 strides[2], strides[3], sizes[5], sizes[9], sizes[10], K, N, nc, pairs};
        int same = cache->valid;
        for (int i = 0; i < 10; i++) same &= cache->key[i] == key[i];
        if (!same) {
            const fb_gemm_operand b = {(const char *)ptrs[1] + offsets[1] * (sizes[5] == 0 ? 4 : 2), sizes[5],
                                       strides[2], strides[3], sizes[9], sizes[10]};
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(dynamic, 1)
            for (int64_t item = 0; item < nb * slices; item++) {
                const int64_t jb = item / slices, s = item % slices;
                const int64_t c0 = jb * nc, cols = N - c0 < nc ? N - c0 : nc;
                const int64_t k0 = s * kcs, kc = K - k0 < kcs ? K - k0 : kcs;
                fb_gemm_pack_b_slice(&b, k0, kc, c0, cols, cache->data + jb * K * nc + k0 * fb_gemm_round_up(cols, FB_GEMM_NR),
                                     pairs);
            }
            for (int i = 0; i < 10; i++) cache->key[i] = key[i];
            cache->valid = 1;
        }
        cached = cache->data;
    }

#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : failed)
    {
        float *buf = fb_gemm_scratch(a_floats + b_floats + tile_floats + scratch_floats + slab_floats);
        if (!buf) {
            failed = 1;
        } else {
            float *pa = buf, *pb = buf + a_floats, *tile = pb + b_floats;
            float *slab = tile + tile_floats + scratch_floats;
            /* The (batch, column block) whose whole packed B `pb` holds, if keep_b; the row
               block and A matrix (its first element) whose whole packed A `pa` holds, if
               keep_a. */
            int64_t packed_for = -1, a_rows_for = -1, a_origin_for = 0;
#pragma omp for schedule(dynamic, 1)
            for (int64_t item = 0; item < items; item++) {
                /* Row blocks run fastest, so a thread's consecutive blocks tend to share B. */
                const int64_t ib = item % mb, jb = (item / mb) % nb, bi = item / (mb * nb);
                const int64_t r0 = ib * mc, c0 = jb * nc;
                const int64_t rows = M - r0 < mc ? M - r0 : mc, cols = NV - c0 < nc ? NV - c0 : nc;
                const int64_t ldt = fb_gemm_round_up(cols, FB_GEMM_NR);
                const fb_gemm_operand a = {(const char *)ptrs[0] + 0, sizes[4], strides[0], strides[1], sizes[7], sizes[8],
                                           tables[0], tables[1], NULL};
                const fb_gemm_operand b = {(const char *)ptrs[1] + 0, sizes[5], strides[2], strides[3], sizes[9], sizes[10],
                                           tables[2], tables[3], b_zeros};
                fb_gemm_operand ab = a, bb = b;
                ab.origin = offsets[3 * bi];
                bb.origin = offsets[3 * bi + 1];
                const int reuse = cached || (keep_b && packed_for == bi * nb + jb);
                const int reuse_a = keep_a && a_rows_for == ib && a_origin_for == ab.origin;
                const int64_t whole_rows = fb_gemm_round_up(rows, FB_GEMM_MR);
                if (slices == 0)
                    memset(tile, 0, (size_t)(whole_rows * ldt) * sizeof(float));
                for (int64_t s = 0; s < slices; s++) {
                    const int64_t k0 = s * kcs, kc = K - k0 < kcs ? K - k0 : kcs;
                    float *pbs = cached ? (float *)cached + jb * K * nc + k0 * ldt : keep_b ? pb + k0 * ldt : pb;
                    float *pas = keep_a ? pa + k0 * whole_rows : pa;
#if defined(__AVX512BF16__)
                    if (pairs) {
                        if (!reuse && fb_gemm_direct_pairs(&bb))
                            fb_gemm_pack_b_pairs(&bb, k0, kc, c0, cols, (uint32_t *)(void *)pbs);
                        else if (!reuse) {
                            fb_gemm_pack_b(&bb, k0, kc, c0, cols, pbs);
                            for (int64_t j = 0; j < cols; j += FB_GEMM_NR) fb_gemm_pairs(pbs + j * kc, kc, FB_GEMM_NR);
                        }
                        if (!reuse_a && fb_gemm_direct_pairs(&ab))
                            fb_gemm_pack_a_pairs(&ab, r0, rows, k0, kc, (uint32_t *)(void *)pas);
                        else if (!reuse_a) {
                            fb_gemm_pack_a(&ab, r0, rows, k0, kc, pas);
                            for (int64_t i = 0; i < rows; i += FB_GEMM_MR) fb_gemm_pairs(pas + i * kc, kc, FB_GEMM_MR);
                        }
                        for (int64_t i = 0; i < rows; i += FB_GEMM_MR)
                            for (int64_t j = 0; j < cols; j += FB_GEMM_NR)
                                fb_gemm_micro_bf16(kc, (const uint32_t *)(const void *)(pas + i * kc),
                                                   (const uint32_t *)(const void *)(pbs + j * kc), tile + i * ldt + j,
                                                   ldt, s > 0);
                        continue;
                    }
#endif
                    if (direct) {
                        /* B where it lies (the image, or its slab for this block and slice),
                           row k at bv + koff[k] + the block's virtual column. Whole strips
                           straight from there; a last narrower strip (whose NR floats per row
                           would reach past B's last element) packed, as every strip is
                           without AVX-512. */
                        const float *bv;
                        const int64_t *koff;
                        if (image) {
                            const int64_t *outer = slab_outer + s * kcs;
                            for (int64_t q = 0; q < slice_slots[s]; q++)
                                fb_gemm_image_row(image, (const float *)ptrs[1], outer[q] + bb.origin,
                                                  c0 + slab_low, slab_pitch, slab + q * slab_pitch);
                            bv = slab;
                            koff = slab_koff + k0;
                        } else {
                            bv = (const float *)ptrs[1] + (bb.origin + tables[3][0] + c0);
                            koff = tables[2] + k0;
                        }
                        if (!reuse_a) fb_gemm_pack_a(&ab, r0, rows, k0, kc, pas);
#if defined(__AVX512F__)
                        const int64_t whole = cols / FB_GEMM_NR * FB_GEMM_NR;
                        /* Strip by strip of B, each read by every strip of A while it is in
                           L1 (the image's rows are not where the prefetcher looks; A's
                           packed strips are, and come from L2). */
                        for (int64_t j = 0; j < whole; j += FB_GEMM_NR)
                            for (int64_t i = 0; i < rows; i += FB_GEMM_MR)
                                fb_gemm_micro_direct(kc, pas + i * kc, bv + j, koff, tile + i * ldt + j, ldt, s > 0);
#else
                        const int64_t whole = 0;
#endif
                        for (int64_t j = whole; j < cols; j += FB_GEMM_NR) {
                            for (int64_t k = 0; k < kc; k++) {
                                float *d = pbs + k * FB_GEMM_NR;
                                for (int64_t t = 0; t < FB_GEMM_NR; t++) d[t] = j + t < cols ? bv[koff[k] + j + t] : 0.0f;
                            }
                            for (int64_t i = 0; i < rows; i += FB_GEMM_MR)
                                fb_gemm_micro(kc, pas + i * kc, pbs, tile + i * ldt + j, ldt, s > 0);
                        }
                        continue;
                    }
                    if (!reuse) fb_gemm_pack_b(&bb, k0, kc, c0, cols, pbs);
                    if (!reuse_a) fb_gemm_pack_a(&ab, r0, rows, k0, kc, pas);
                    for (int64_t i = 0; i < rows; i += FB_GEMM_MR)
                        for (int64_t j = 0; j < cols; j += FB_GEMM_NR)
                            fb_gemm_micro(kc, pas + i * kc, pbs + j * kc, tile + i * ldt + j, ldt, s > 0);
                }
                packed_for = keep_b ? bi * nb + jb : -1;
                a_rows_for = keep_a ? ib : -1;
                a_origin_for = ab.origin;
                /* The tile's columns: over virtual ones, the real columns among them. */
                int64_t first = c0, width = cols;
                if (direct) {
                    first = fb_gemm_first_column(tables[3], N, c0);
                    width = fb_gemm_first_column(tables[3], N, c0 + cols) - first;
                    fb_gemm_compact(tile, ldt, rows, tables[3], first, first + width, c0);
                    if (width == 0) continue;
                }
                char *out = (char *)ptrs[2] + offsets[3 * bi + 2] * (c_dtype == 0 ? 4 : 2);
                if (!epilogue || epilogue->store_product)
                    fb_gemm_store(tile, ldt, rows, width, out, c_dtype, rsc, csc, r0, first);
                if (epilogue)
                    fb_gemm_epilogue_tile(epilogue, &blocks, tile, ldt, rows, width, c_dtype, tile + tile_floats, bi, r0,
                                          first, ib, jb);
            }
        }
    }
    if (blocks.acc) {
        if (!failed) fb_gemm_blocks_finish(epilogue, &blocks);
        free(blocks.acc);
        free(blocks.first);
    }
    for (int i = 0; i < 4; i++) free(tables[i]);
    free(coords);
    free(slab_outer);
    *(int64_t *)ptrs[3] = failed;
}

/* A padded copy of a tensor (a convolution's image inside its zero border) into a buffer of
   zeros, its rows copied by the threads: sizes = {rank >= 1, element bytes, source shape,
   zeros before, zeros after (rank each)}; ptrs = {source, destination}. Row r of the source
   (a point of every axis but the last) goes to its place among the padded rows. */
void fusebox_pad_rows(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    (void)strides;
    (void)offsets;
    const int64_t rank = sizes[0], size = sizes[1];
    const int64_t *source = sizes + 2, *before = source + rank, *after = before + rank;
    const int64_t last = rank - 1, len = source[last] * size;
    int64_t rows = 1;
    for (int64_t d = 0; d < last; d++) rows *= source[d];
    if (len == 0 || rows == 0) return;
    const char *src = (const char *)ptrs[0];
    char *dst = (char *)ptrs[1];
#pragma omp parallel for schedule(static) if (rows * len > (1 << 20))
    for (int64_t r = 0; r < rows; r++) {
        /* Row r's coordinates on the outer axes, innermost first, placed in the padded shape. */
        int64_t rest = r, at = before[last], step = before[last] + source[last] + after[last];
        for (int64_t d = last - 1; d >= 0; d--) {
            at += (rest % source[d] + before[d]) * step;
            rest /= source[d];
            step *= before[d] + source[d] + after[d];
        }
        memcpy(dst + at * size, src + r * len, (size_t)len);
    }
}
