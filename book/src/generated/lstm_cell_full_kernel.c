void fb_895d74fe9efd81bb(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    int64_t n0 = sizes[0];
    int64_t n1 = sizes[1];
    const float *p0 = (const float *)ptrs[0];
    const int64_t o0 = offsets[0];
    const int64_t s0_0 = strides[0];
    const float *p1 = (const float *)ptrs[1];
    const int64_t o1 = offsets[1];
    const int64_t s1_0 = strides[2];
    const float *p2 = (const float *)ptrs[2];
    const int64_t o2 = offsets[2];
    const int64_t s2_0 = strides[4];
    const float *p3 = (const float *)ptrs[3];
    const int64_t o3 = offsets[3];
    const int64_t s3_0 = strides[6];
    const float *p4 = (const float *)ptrs[4];
    const int64_t o4 = offsets[4];
    const int64_t s4_0 = strides[8];
    float *p5 = (float *)ptrs[5];
    const int64_t o5 = offsets[5];
    const int64_t s5_0 = strides[10];
    float *p6 = (float *)ptrs[6];
    const int64_t o6 = offsets[6];
    const int64_t s6_0 = strides[12];
    if (n0 > 0 && n1 > 0) {
        if (n0 == 1 || (s0_0 == n1 && s1_0 == n1 && s2_0 == n1 && s3_0 == n1 && s4_0 == n1 && s5_0 == n1 && s6_0 == n1)) {
            n1 *= n0;
            n0 = 1;
        }
    }
    const int64_t inner = n1;
    const int64_t outer = n0;
    const int64_t total = outer * inner;
    const int nt = total > 32768 ? omp_get_max_threads() : 1;
    #if defined(FB_AVX512)
    const int fbs = total * 28 > 33554432;
    #endif
    const int64_t nch = (inner + 2047) / 2048;
    const int64_t items = outer * nch;
    #pragma omp parallel for schedule(static) if(nt > 1)
    for (int64_t w = 0; w < items; w++) {
        const int64_t o = nch == 1 ? w : w / nch;
        const int64_t j0 = (w - o * nch) * 2048;
        const int64_t len = inner - j0 < 2048 ? inner - j0 : 2048;
        const int64_t i0 = o;
        {
            const int64_t b0 = o0 + i0 * s0_0 + j0;
            const int64_t b1 = o1 + i0 * s1_0 + j0;
            const int64_t b2 = o2 + i0 * s2_0 + j0;
            const int64_t b3 = o3 + i0 * s3_0 + j0;
            const int64_t b4 = o4 + i0 * s4_0 + j0;
            const int64_t b5 = o5 + i0 * s5_0 + j0;
            const int64_t b6 = o6 + i0 * s6_0 + j0;
            float *d0 = p5 + b5;
            float *d1 = p6 + b6;
            float c5[2048] __attribute__((aligned(64)));
            float c21[2048] __attribute__((aligned(64)));
            #if defined(FB_AVX512)
            const int64_t jv = len - len % 16;
            const int st = fbs && (((uintptr_t)d0 | (uintptr_t)d1) & 63) == 0;
            #else
            const int64_t jv = 0;
            #endif
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                const __m512 v1 = _mm512_set1_ps((1e0f));
                const __m512 v2 = fbv_neg(v0);
                const __m512 v3 = fbv_expf_addend(v2);
                const __m512 v4 = _mm512_add_ps(v1, v3);
                const __m512 v5 = _mm512_div_ps(v1, v4);
                const __m512 v6 = _mm512_loadu_ps(&p1[b1 + j]);
                const __m512 v7 = fbv_neg(v6);
                const __m512 v8 = fbv_expf_addend(v7);
                const __m512 v9 = _mm512_add_ps(v1, v8);
                const __m512 v10 = _mm512_div_ps(v1, v9);
                const __m512 v11 = _mm512_loadu_ps(&p2[b2 + j]);
                const __m512 v12 = _mm512_mul_ps(v10, v11);
                const __m512 v13 = _mm512_loadu_ps(&p3[b3 + j]);
                const __m512 v14 = fbv_neg(v13);
                const __m512 v15 = fbv_expf_addend(v14);
                const __m512 v16 = _mm512_add_ps(v1, v15);
                const __m512 v17 = _mm512_div_ps(v1, v16);
                const __m512 v18 = _mm512_loadu_ps(&p4[b4 + j]);
                const __m512 v19 = fbv_tanhf(v18);
                const __m512 v20 = _mm512_mul_ps(v17, v19);
                const __m512 v21 = _mm512_add_ps(v12, v20);
                _mm512_store_ps(&c5[j], v5);
                _mm512_store_ps(&c21[j], v21);
                fbv_store(&d0[j], v21, st);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v0 = p0[b0 + j];
                const float v1 = (1e0f);
                const float v2 = (-v0);
                const float v3 = fb_expf_addend(v2);
                const float v4 = (v1 + v3);
                const float v5 = (v1 / v4);
                const float v6 = p1[b1 + j];
                const float v7 = (-v6);
                const float v8 = fb_expf_addend(v7);
                const float v9 = (v1 + v8);
                const float v10 = (v1 / v9);
                const float v11 = p2[b2 + j];
                const float v12 = (v10 * v11);
                const float v13 = p3[b3 + j];
                const float v14 = (-v13);
                const float v15 = fb_expf_addend(v14);
                const float v16 = (v1 + v15);
                const float v17 = (v1 / v16);
                const float v18 = p4[b4 + j];
                const float v19 = fb_tanhf(v18);
                const float v20 = (v17 * v19);
                const float v21 = (v12 + v20);
                c5[j] = v5;
                c21[j] = v21;
                d0[j] = v21;
            }
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v5 = _mm512_load_ps(&c5[j]);
                const __m512 v21 = _mm512_load_ps(&c21[j]);
                const __m512 v22 = fbv_tanhf(v21);
                const __m512 v23 = _mm512_mul_ps(v5, v22);
                fbv_store(&d1[j], v23, st);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v5 = c5[j];
                const float v21 = c21[j];
                const float v22 = fb_tanhf(v21);
                const float v23 = (v5 * v22);
                d1[j] = v23;
            }
            #if defined(FB_AVX512)
            if (st) _mm_sfence();
            #endif
        }
    }
}
