void fb_29636aeccb211f1d(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    int64_t n0 = sizes[0];
    int64_t n1 = sizes[1];
    const float *p0 = (const float *)ptrs[0];
    const int64_t o0 = offsets[0];
    const int64_t s0_0 = strides[0];
    float *p1 = (float *)ptrs[1];
    const int64_t o1 = offsets[1];
    const int64_t s1_0 = strides[2];
    const int64_t inner = n1;
    const int64_t outer = n0;
    const int64_t total = outer * inner;
    const int nt = total > 32768 ? omp_get_max_threads() : 1;
    #pragma omp parallel for schedule(static) if(nt > 1)
    for (int64_t o = 0; o < outer; o++) {
        const int64_t i0 = o;
        const int64_t len = inner;
        const int64_t b0 = o0 + i0 * s0_0;
        const int64_t b1 = o1 + i0 * s1_0;
        float m1 = -INFINITY;
        int nan1 = 0;
        #pragma omp simd reduction(max:m1) reduction(|:nan1)
        for (int64_t j = 0; j < len; j++) {
            const float v0 = p0[b0 + j];
            m1 = v0 > m1 ? v0 : m1;
            nan1 |= v0 != v0;
        }
        const float r1 = (float)(nan1 ? (double)NAN : (double)m1);
        double s4 = 0.0;
        #pragma omp simd reduction(+:s4)
        for (int64_t j = 0; j < len; j++) {
            const float v0 = p0[b0 + j];
            const float v1 = r1;
            const float v2 = (v0 - v1);
            const float v3 = fb_expf(v2);
            s4 += (double)v3;
        }
        const float r4 = (float)s4;
        #pragma omp simd
        for (int64_t j = 0; j < len; j++) {
            const float v0 = p0[b0 + j];
            const float v1 = r1;
            const float v2 = (v0 - v1);
            const float v3 = fb_expf(v2);
            const float v4 = r4;
            const float v5 = (v3 / v4);
            p1[b1 + j] = v5;
        }
    }
}
