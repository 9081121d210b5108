#if defined(FB_AVX512)
/* e^x in the vector loops of relaxed row kernels (fusion.ron's `row_arithmetic: Relaxed`):
   the range reduction of fbv_exp_reduce, then e^r as one Horner chain of degree 5 whose two
   leading coefficients are 1, and 2^n by scalef. Two fused multiply-adds fewer than fbv_expf
   (no separate r^2, no final +1), for at most 2.2 ulp measured against f64 exp instead of
   1.05 (the IR contract states the bound; tests/rows.rs sweeps it). The clamps keep NaN and
   make scalef overflow to +Inf and underflow to +0 exactly where fbv_expf does. */
#define FB_EXPR_C5 0x1.10625p-7f
#define FB_EXPR_C4 0x1.572a64p-5f
#define FB_EXPR_C3 0x1.5557bp-3f
#define FB_EXPR_C2 0x1.fffdfcp-2f
static inline __m512 fbv_expf_row(__m512 x) {
    __m512 n, r = fbv_exp_reduce(_mm512_min_ps(fbv_f(FB_EXP_HI), _mm512_max_ps(fbv_f(FB_EXP_LO), x)), &n);
    __m512 p = _mm512_fmadd_ps(fbv_f(FB_EXPR_C5), r, fbv_f(FB_EXPR_C4));
    p = _mm512_fmadd_ps(p, r, fbv_f(FB_EXPR_C3));
    p = _mm512_fmadd_ps(p, r, fbv_f(FB_EXPR_C2));
    p = _mm512_fmadd_ps(p, r, fbv_f(1.0f));
    p = _mm512_fmadd_ps(p, r, fbv_f(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif
