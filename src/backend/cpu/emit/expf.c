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
