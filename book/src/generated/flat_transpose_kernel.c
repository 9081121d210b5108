void fb_d217f6890ff1539d(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    int64_t n0 = sizes[0];
    int64_t n1 = sizes[1];
    const float *p0 = (const float *)ptrs[0];
    const int64_t o0 = offsets[0];
    const int64_t s0_0 = strides[0];
    const int64_t s0_1 = strides[1];
    const float *p1 = (const float *)ptrs[1];
    const int64_t o1 = offsets[1];
    const int64_t s1_0 = strides[2];
    float *p2 = (float *)ptrs[2];
    const int64_t o2 = offsets[2];
    const int64_t s2_0 = strides[4];
    if (n0 > 0 && n1 > 0) {
        if (n0 == 1 || (s0_0 == s0_1 * n1 && s1_0 == n1 && s2_0 == n1)) {
            n1 *= n0;
            n0 = 1;
        }
    }
    const int64_t inner = n1;
    const int64_t outer = n0;
    const int64_t total = outer * inner;
    const int nt = total > 32768 ? omp_get_max_threads() : 1;
    if (outer >= 64 * (int64_t)nt) {
        const int64_t tc = (s0_1 * 4) % 4096 == 0 ? 16 : 256;
        #pragma omp parallel for schedule(static) if(nt > 1)
        for (int64_t ob = 0; ob < outer; ob += 16) {
            const int64_t oe = outer - ob < 16 ? outer : ob + 16;
            for (int64_t j0 = 0; j0 < inner; j0 += tc) {
                const int64_t len = inner - j0 < tc ? inner - j0 : tc;
                for (int64_t o = ob; o < oe; o++) {
                    const int64_t i0 = o;
                    {
                        const int64_t b0 = o0 + i0 * s0_0 + j0 * s0_1;
                        const int64_t b1 = o1 + i0 * s1_0 + j0;
                        const int64_t b2 = o2 + i0 * s2_0 + j0;
                        float *d0 = p2 + b2;
                        #pragma omp simd
                        for (int64_t j = 0; j < len; j++) {
                            const float v0 = p0[b0 + j * s0_1];
                            const float v1 = p1[b1 + j];
                            const float v2 = (v0 * v1);
                            d0[j] = v2;
                        }
                    }
                }
            }
        }
    }
    else {
        const int64_t nch = (inner + 2047) / 2048;
        const int64_t items = outer * nch;
        #pragma omp parallel for schedule(static) if(nt > 1)
        for (int64_t w = 0; w < items; w++) {
            const int64_t o = nch == 1 ? w : w / nch;
            const int64_t j0 = (w - o * nch) * 2048;
            const int64_t len = inner - j0 < 2048 ? inner - j0 : 2048;
            const int64_t i0 = o;
            {
                const int64_t b0 = o0 + i0 * s0_0 + j0 * s0_1;
                const int64_t b1 = o1 + i0 * s1_0 + j0;
                const int64_t b2 = o2 + i0 * s2_0 + j0;
                float *d0 = p2 + b2;
                #pragma omp simd
                for (int64_t j = 0; j < len; j++) {
                    const float v0 = p0[b0 + j * s0_1];
                    const float v1 = p1[b1 + j];
                    const float v2 = (v0 * v1);
                    d0[j] = v2;
                }
            }
        }
    }
}
