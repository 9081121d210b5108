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
