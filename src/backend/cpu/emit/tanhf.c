/* Past this |x|, tanh is 1 in f32 (shared with the AVX-512 helper). */
#define FB_TANH_CAP 9.5f
static inline float fb_tanhf(float x) {
    float a = fabsf(x);
    float z, r = fb_exp_reduce(2.0f * (a > FB_TANH_CAP ? FB_TANH_CAP : a), &z);
    float s = fb_exp_scale(z, 127u);
    float em = fmaf(s, fb_expf_poly(r), s - 1.0f);
    return copysignf(em / (em + 2.0f), x);
}
