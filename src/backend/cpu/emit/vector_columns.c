#if defined(FB_AVX512)
/* Column accumulators: 16 lanes widened to double and combined with q[0..16], each lane by
   the operation the scalar loop applies (q += (double)v; fb_maxacc, which keeps x's NaN). */
static inline __m512d fbv_lo_pd(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d fbv_hi_pd(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
static inline void fbv_acc_sum(double *q, __m512 v) {
    _mm512_storeu_pd(q, _mm512_add_pd(_mm512_loadu_pd(q), fbv_lo_pd(v)));
    _mm512_storeu_pd(q + 8, _mm512_add_pd(_mm512_loadu_pd(q + 8), fbv_hi_pd(v)));
}
static inline __m512d fbv_maxacc(__m512d acc, __m512d x) {
    __mmask8 take = _mm512_cmp_pd_mask(x, acc, _CMP_GT_OQ) | _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_blend_pd(take, acc, x);
}
static inline void fbv_acc_max(double *q, __m512 v) {
    _mm512_storeu_pd(q, fbv_maxacc(_mm512_loadu_pd(q), fbv_lo_pd(v)));
    _mm512_storeu_pd(q + 8, fbv_maxacc(_mm512_loadu_pd(q + 8), fbv_hi_pd(v)));
}
#endif
