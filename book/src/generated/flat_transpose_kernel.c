void fb_ad3470741816b4a9(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    int64_t n0 = sizes[0];
    const float *p0 = (const float *)ptrs[0];
    const int64_t o0 = offsets[0];
    const int64_t s0_0 = strides[0];
    const int64_t c0_0 = strides[3];
    const int64_t m0_0_1 = strides[5];
    const int64_t t0_0_0 = strides[6];
    const int64_t t0_0_1 = strides[7];
    const int64_t d0_0_0 = m0_0_1;
    const float *p1 = (const float *)ptrs[1];
    const int64_t o1 = offsets[1];
    float *p2 = (float *)ptrs[2];
    const int64_t o2 = offsets[2];
    const int64_t inner = n0;
    const int64_t outer = 1;
    const int64_t total = outer * inner;
    const int nt = total > 32768 ? omp_get_max_threads() : 1;
    const int64_t nch = (inner + 2047) / 2048;
    const int64_t items = outer * nch;
    #pragma omp parallel for schedule(static) if(nt > 1)
    for (int64_t w = 0; w < items; w++) {
        const int64_t o = nch == 1 ? w : w / nch;
        const int64_t j0 = (w - o * nch) * 2048;
        const int64_t len = inner - j0 < 2048 ? inner - j0 : 2048;
        {
            const int64_t b0 = o0 + j0 * s0_0;
            const int64_t b1 = o1 + j0;
            const int64_t b2 = o2 + j0;
            float *d0 = p2 + b2;
            #pragma omp simd
            for (int64_t j = 0; j < len; j++) {
                const int64_t q0_0 = b0 + j * s0_0; const int64_t q0_1 = c0_0 + (q0_0 / d0_0_0) * t0_0_0 + (q0_0 % m0_0_1) * t0_0_1; const float v0 = p0[q0_1];
                const float v1 = p1[b1 + j];
                const float v2 = (v0 * v1);
                d0[j] = v2;
            }
        }
    }
}
