void fb_9f860011ecc4e7ba(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
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
    const float *p3 = (const float *)ptrs[3];
    const int64_t o3 = offsets[3];
    const int64_t s3_0 = strides[6];
    const float *p4 = (const float *)ptrs[4];
    const int64_t o4 = offsets[4];
    const int64_t s4_0 = strides[8];
    const float *p5 = (const float *)ptrs[5];
    const int64_t o5 = offsets[5];
    const float *p6 = (const float *)ptrs[6];
    const int64_t o6 = offsets[6];
    const int64_t s6_0 = strides[12];
    const float *p7 = (const float *)ptrs[7];
    const int64_t o7 = offsets[7];
    const int64_t s7_0 = strides[14];
    const float *p8 = (const float *)ptrs[8];
    const int64_t o8 = offsets[8];
    const int64_t s8_0 = strides[16];
    const float *p9 = (const float *)ptrs[9];
    const int64_t o9 = offsets[9];
    const float *p10 = (const float *)ptrs[10];
    const int64_t o10 = offsets[10];
    const int64_t s10_0 = strides[20];
    const float *p11 = (const float *)ptrs[11];
    const int64_t o11 = offsets[11];
    const int64_t s11_0 = strides[22];
    const float *p12 = (const float *)ptrs[12];
    const int64_t o12 = offsets[12];
    float *p13 = (float *)ptrs[13];
    const int64_t o13 = offsets[13];
    const int64_t s13_0 = strides[26];
    float *p14 = (float *)ptrs[14];
    const int64_t o14 = offsets[14];
    const int64_t s14_0 = strides[28];
    if (n0 > 0 && n1 > 0) {
        if (n0 == 1 || 0) {
            n1 *= n0;
            n0 = 1;
        }
    }
    const int64_t inner = n1;
    const int64_t outer = n0;
    const int64_t total = outer * inner;
    const int nt = total > 32768 ? omp_get_max_threads() : 1;
    #if defined(FB_AVX512)
    const int fbs = total * 60 > 33554432;
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
            const int64_t b2 = o2 + j0;
            const int64_t b3 = o3 + i0 * s3_0 + j0;
            const int64_t b4 = o4 + i0 * s4_0 + j0;
            const int64_t b5 = o5 + j0;
            const int64_t b6 = o6 + i0 * s6_0 + j0;
            const int64_t b7 = o7 + i0 * s7_0 + j0;
            const int64_t b8 = o8 + i0 * s8_0 + j0;
            const int64_t b9 = o9 + j0;
            const int64_t b10 = o10 + i0 * s10_0 + j0;
            const int64_t b11 = o11 + i0 * s11_0 + j0;
            const int64_t b12 = o12 + j0;
            const int64_t b13 = o13 + i0 * s13_0 + j0;
            const int64_t b14 = o14 + i0 * s14_0 + j0;
            float *d0 = p13 + b13;
            float *d1 = p14 + b14;
            float c9[2048] __attribute__((aligned(64)));
            float c37[2048] __attribute__((aligned(64)));
            #if defined(FB_AVX512)
            const int64_t jv = len - len % 16;
            const int st = fbs && (((uintptr_t)d0 | (uintptr_t)d1) & 63) == 0;
            #else
            const int64_t jv = 0;
            #endif
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                const __m512 v1 = _mm512_loadu_ps(&p1[b1 + j]);
                const __m512 v2 = _mm512_add_ps(v0, v1);
                const __m512 v3 = _mm512_loadu_ps(&p2[b2 + j]);
                const __m512 v4 = _mm512_add_ps(v2, v3);
                const __m512 v5 = _mm512_set1_ps((1e0f));
                const __m512 v6 = fbv_neg(v4);
                const __m512 v7 = fbv_expf_addend(v6);
                const __m512 v8 = _mm512_add_ps(v5, v7);
                const __m512 v9 = _mm512_div_ps(v5, v8);
                const __m512 v10 = _mm512_loadu_ps(&p3[b3 + j]);
                const __m512 v11 = _mm512_loadu_ps(&p4[b4 + j]);
                const __m512 v12 = _mm512_add_ps(v10, v11);
                const __m512 v13 = _mm512_loadu_ps(&p5[b5 + j]);
                const __m512 v14 = _mm512_add_ps(v12, v13);
                const __m512 v15 = fbv_neg(v14);
                const __m512 v16 = fbv_expf_addend(v15);
                const __m512 v17 = _mm512_add_ps(v5, v16);
                const __m512 v18 = _mm512_div_ps(v5, v17);
                const __m512 v19 = _mm512_loadu_ps(&p6[b6 + j]);
                const __m512 v20 = _mm512_mul_ps(v18, v19);
                const __m512 v21 = _mm512_loadu_ps(&p7[b7 + j]);
                const __m512 v22 = _mm512_loadu_ps(&p8[b8 + j]);
                const __m512 v23 = _mm512_add_ps(v21, v22);
                const __m512 v24 = _mm512_loadu_ps(&p9[b9 + j]);
                const __m512 v25 = _mm512_add_ps(v23, v24);
                const __m512 v26 = fbv_neg(v25);
                const __m512 v27 = fbv_expf_addend(v26);
                const __m512 v28 = _mm512_add_ps(v5, v27);
                const __m512 v29 = _mm512_div_ps(v5, v28);
                const __m512 v30 = _mm512_loadu_ps(&p10[b10 + j]);
                const __m512 v31 = _mm512_loadu_ps(&p11[b11 + j]);
                const __m512 v32 = _mm512_add_ps(v30, v31);
                const __m512 v33 = _mm512_loadu_ps(&p12[b12 + j]);
                const __m512 v34 = _mm512_add_ps(v32, v33);
                const __m512 v35 = fbv_tanhf(v34);
                const __m512 v36 = _mm512_mul_ps(v29, v35);
                const __m512 v37 = _mm512_add_ps(v20, v36);
                _mm512_store_ps(&c9[j], v9);
                _mm512_store_ps(&c37[j], v37);
                fbv_store(&d0[j], v37, st);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v0 = p0[b0 + j];
                const float v1 = p1[b1 + j];
                const float v2 = (v0 + v1);
                const float v3 = p2[b2 + j];
                const float v4 = (v2 + v3);
                const float v5 = (1e0f);
                const float v6 = (-v4);
                const float v7 = fb_expf_addend(v6);
                const float v8 = (v5 + v7);
                const float v9 = (v5 / v8);
                const float v10 = p3[b3 + j];
                const float v11 = p4[b4 + j];
                const float v12 = (v10 + v11);
                const float v13 = p5[b5 + j];
                const float v14 = (v12 + v13);
                const float v15 = (-v14);
                const float v16 = fb_expf_addend(v15);
                const float v17 = (v5 + v16);
                const float v18 = (v5 / v17);
                const float v19 = p6[b6 + j];
                const float v20 = (v18 * v19);
                const float v21 = p7[b7 + j];
                const float v22 = p8[b8 + j];
                const float v23 = (v21 + v22);
                const float v24 = p9[b9 + j];
                const float v25 = (v23 + v24);
                const float v26 = (-v25);
                const float v27 = fb_expf_addend(v26);
                const float v28 = (v5 + v27);
                const float v29 = (v5 / v28);
                const float v30 = p10[b10 + j];
                const float v31 = p11[b11 + j];
                const float v32 = (v30 + v31);
                const float v33 = p12[b12 + j];
                const float v34 = (v32 + v33);
                const float v35 = fb_tanhf(v34);
                const float v36 = (v29 * v35);
                const float v37 = (v20 + v36);
                c9[j] = v9;
                c37[j] = v37;
                d0[j] = v37;
            }
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v9 = _mm512_load_ps(&c9[j]);
                const __m512 v37 = _mm512_load_ps(&c37[j]);
                const __m512 v38 = fbv_tanhf(v37);
                const __m512 v39 = _mm512_mul_ps(v9, v38);
                fbv_store(&d1[j], v39, st);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v9 = c9[j];
                const float v37 = c37[j];
                const float v38 = fb_tanhf(v37);
                const float v39 = (v9 * v38);
                d1[j] = v39;
            }
            #if defined(FB_AVX512)
            if (st) _mm_sfence();
            #endif
        }
    }
}
