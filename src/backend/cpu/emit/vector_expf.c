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
