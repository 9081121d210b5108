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
