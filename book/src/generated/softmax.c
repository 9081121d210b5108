void fb_67a3dc72fbca878f(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
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
    #if defined(FB_AVX512)
    const int fbs = total * 8 > 33554432;
    #endif
    const int64_t rpad = inner <= 524288 ? (inner + 15) / 16 * 16 : 0;
    const int64_t rbytes = rpad * (int64_t)(sizeof(float));
    const int keep = rpad > 0 && rbytes <= 524288;
    #pragma omp parallel if(nt > 1)
    {
        char *scratch = keep ? (char *)aligned_alloc(64, (size_t)rbytes * 1) : NULL;
        float *c3 = scratch ? (float *)(scratch + 0) : NULL;
        float *pc3 = c3;
        int pend = 0;
        int l_st = 0;
        (void)l_st;
        float l_r4 = 0;
        float l_rc5 = 0;
        int l_rk5 = 0;
        int64_t l_b1 = 0;
        #pragma omp for schedule(static) nowait
        for (int64_t o = 0; o < outer; o++) {
            const int64_t i0 = o;
            const int64_t len = inner;
            const int64_t b0 = o0 + i0 * s0_0;
            const int64_t b1 = o1 + i0 * s1_0;
            #if defined(FB_AVX512)
            const int64_t jv = len - len % 16;
            const int pf = o + 1 < outer && len * 4 <= 524288;
            const int64_t q0 = o + 1;
            const int64_t nb0 = pf ? o0 + q0 * s0_0 - b0 : 0;
            #else
            const int64_t jv = 0;
            #endif
            float m1 = -INFINITY;
            int nan1 = 0;
            #if defined(FB_AVX512)
            {
                __m512 vm1 = _mm512_set1_ps(-INFINITY);
                __m512 vm1_1 = _mm512_set1_ps(-INFINITY);
                __m512 vm1_2 = _mm512_set1_ps(-INFINITY);
                __m512 vm1_3 = _mm512_set1_ps(-INFINITY);
                __mmask16 vn1 = 0;
                int64_t j = 0;
                for (; j + 64 <= jv; j += 64) {
                    const int64_t j0 = j;
                    {
                        const int64_t j = j0 + 0;
                        const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                        vm1 = _mm512_max_ps(v0, vm1);
                        vn1 |= _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q);
                    }
                    {
                        const int64_t j = j0 + 16;
                        const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                        vm1_1 = _mm512_max_ps(v0, vm1_1);
                        vn1 |= _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q);
                    }
                    {
                        const int64_t j = j0 + 32;
                        const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                        vm1_2 = _mm512_max_ps(v0, vm1_2);
                        vn1 |= _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q);
                    }
                    {
                        const int64_t j = j0 + 48;
                        const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                        vm1_3 = _mm512_max_ps(v0, vm1_3);
                        vn1 |= _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q);
                    }
                }
                for (; j < jv; j += 16) {
                    const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                    vm1 = _mm512_max_ps(v0, vm1);
                    vn1 |= _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q);
                }
                vm1 = _mm512_max_ps(vm1_3, _mm512_max_ps(vm1_2, _mm512_max_ps(vm1_1, vm1)));
                m1 = _mm512_reduce_max_ps(vm1);
                nan1 = vn1 != 0;
            }
            #endif
            #pragma omp simd reduction(max:m1) reduction(|:nan1)
            for (int64_t j = jv; j < len; j++) {
                const float v0 = p0[b0 + j];
                m1 = v0 > m1 ? v0 : m1;
                nan1 |= v0 != v0;
            }
            const float r1 = (float)(nan1 ? (double)NAN : (double)m1);
            double s4 = 0.0;
            if (c3) {
                #if defined(FB_AVX512)
                {
                    __m512d vs4 = _mm512_setzero_pd();
                    __m512d vt4 = _mm512_setzero_pd();
                    for (int64_t jb = 0; jb < jv; jb += 256) {
                        const int64_t je = jv - jb > 256 ? jb + 256 : jv;
                        __m512 vf4 = _mm512_setzero_ps();
                        for (int64_t j = jb; j < je; j += 16) {
                            _mm_prefetch((const char *)&p0[b0 + nb0 + j], _MM_HINT_T1);
                            if (pend) {
                                const float r4 = l_r4;
                                const float rc5 = l_rc5;
                                const int rk5 = l_rk5;
                                const int64_t b1 = l_b1;
                                const float *c3 = pc3;
                                float *d0 = p1 + b1;
                                const int st = l_st;
                                const __m512 v3 = _mm512_load_ps(&c3[j]);
                                const __m512 v4 = _mm512_set1_ps(r4);
                                const __m512 v5 = rk5 ? _mm512_mul_ps(v3, _mm512_set1_ps(rc5)) : _mm512_div_ps(v3, v4);
                                fbv_store(&d0[j], v5, st);
                            }
                            const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                            const __m512 v1 = _mm512_set1_ps(r1);
                            const __m512 v2 = _mm512_sub_ps(v0, v1);
                            const __m512 v3 = fbv_expf_row(v2);
                            _mm512_store_ps(&c3[j], v3);
                            vf4 = _mm512_add_ps(vf4, v3);
                        }
                        if ((_mm512_cmp_ps_mask(_mm512_sub_ps(vf4, vf4), _mm512_setzero_ps(), _CMP_EQ_OQ)) == 0xFFFF) {
                            vs4 = _mm512_add_pd(vs4, _mm512_cvtps_pd(_mm512_castps512_ps256(vf4)));
                            vt4 = _mm512_add_pd(vt4, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(vf4), 1))));
                        }
                        else {
                            for (int64_t j = jb; j < je; j += 16) {
                                const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                                const __m512 v1 = _mm512_set1_ps(r1);
                                const __m512 v2 = _mm512_sub_ps(v0, v1);
                                const __m512 v3 = fbv_expf_row(v2);
                                vs4 = _mm512_add_pd(vs4, _mm512_cvtps_pd(_mm512_castps512_ps256(v3)));
                                vt4 = _mm512_add_pd(vt4, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v3), 1))));
                            }
                        }
                    }
                    s4 = _mm512_reduce_add_pd(_mm512_add_pd(vs4, vt4));
                }
                #endif
                if (pend) {
                    {
                        const float r4 = l_r4;
                        const float rc5 = l_rc5;
                        const int rk5 = l_rk5;
                        const int64_t b1 = l_b1;
                        const float *c3 = pc3;
                        #pragma omp simd
                        for (int64_t j = jv; j < len; j++) {
                            const float v3 = c3[j];
                            const float v4 = r4;
                            const float v5 = rk5 ? (v3 * rc5) : (v3 / v4);
                            p1[b1 + j] = v5;
                        }
                    }
                    #if defined(FB_AVX512)
                    if (l_st) _mm_sfence();
                    #endif
                    pend = 0;
                }
                #pragma omp simd reduction(+:s4)
                for (int64_t j = jv; j < len; j++) {
                    const float v0 = p0[b0 + j];
                    const float v1 = r1;
                    const float v2 = (v0 - v1);
                    const float v3 = fb_expf(v2);
                    c3[j] = v3;
                    s4 += (double)v3;
                }
            }
            else {
                #if defined(FB_AVX512)
                {
                    __m512d vs4 = _mm512_setzero_pd();
                    __m512d vt4 = _mm512_setzero_pd();
                    for (int64_t jb = 0; jb < jv; jb += 256) {
                        const int64_t je = jv - jb > 256 ? jb + 256 : jv;
                        __m512 vf4 = _mm512_setzero_ps();
                        for (int64_t j = jb; j < je; j += 16) {
                            _mm_prefetch((const char *)&p0[b0 + nb0 + j], _MM_HINT_T1);
                            const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                            const __m512 v1 = _mm512_set1_ps(r1);
                            const __m512 v2 = _mm512_sub_ps(v0, v1);
                            const __m512 v3 = fbv_expf_row(v2);
                            vf4 = _mm512_add_ps(vf4, v3);
                        }
                        if ((_mm512_cmp_ps_mask(_mm512_sub_ps(vf4, vf4), _mm512_setzero_ps(), _CMP_EQ_OQ)) == 0xFFFF) {
                            vs4 = _mm512_add_pd(vs4, _mm512_cvtps_pd(_mm512_castps512_ps256(vf4)));
                            vt4 = _mm512_add_pd(vt4, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(vf4), 1))));
                        }
                        else {
                            for (int64_t j = jb; j < je; j += 16) {
                                const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                                const __m512 v1 = _mm512_set1_ps(r1);
                                const __m512 v2 = _mm512_sub_ps(v0, v1);
                                const __m512 v3 = fbv_expf_row(v2);
                                vs4 = _mm512_add_pd(vs4, _mm512_cvtps_pd(_mm512_castps512_ps256(v3)));
                                vt4 = _mm512_add_pd(vt4, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v3), 1))));
                            }
                        }
                    }
                    s4 = _mm512_reduce_add_pd(_mm512_add_pd(vs4, vt4));
                }
                #endif
                #pragma omp simd reduction(+:s4)
                for (int64_t j = jv; j < len; j++) {
                    const float v0 = p0[b0 + j];
                    const float v1 = r1;
                    const float v2 = (v0 - v1);
                    const float v3 = fb_expf(v2);
                    s4 += (double)v3;
                }
            }
            const float r4 = (float)s4;
            float rc5 = 1.0f;
            int rk5 = 0;
            {
                const float v4 = r4;
                rk5 = fabsf(v4) >= 0x1p-126f && fabsf(v4) <= 0x1p126f;
                rc5 = 1.0f / v4;
            }
            if (c3) {
                l_r4 = r4;
                l_rc5 = rc5;
                l_rk5 = rk5;
                l_b1 = b1;
                #if defined(FB_AVX512)
                {
                    float *d0 = p1 + b1;
                    const int st = fbs && (((uintptr_t)d0) & 63) == 0;
                    l_st = st;
                }
                #endif
                pend = 1;
            }
            else {
                #if defined(FB_AVX512)
                {
                    float *d0 = p1 + b1;
                    const int st = 0;
                    for (int64_t j = 0; j < jv; j += 16) {
                        const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                        const __m512 v1 = _mm512_set1_ps(r1);
                        const __m512 v2 = _mm512_sub_ps(v0, v1);
                        const __m512 v3 = fbv_expf_row(v2);
                        const __m512 v4 = _mm512_set1_ps(r4);
                        const __m512 v5 = rk5 ? _mm512_mul_ps(v3, _mm512_set1_ps(rc5)) : _mm512_div_ps(v3, v4);
                        fbv_store(&d0[j], v5, st);
                    }
                    if (st) _mm_sfence();
                }
                #endif
                #pragma omp simd
                for (int64_t j = jv; j < len; j++) {
                    const float v0 = p0[b0 + j];
                    const float v1 = r1;
                    const float v2 = (v0 - v1);
                    const float v3 = fb_expf(v2);
                    const float v4 = r4;
                    const float v5 = rk5 ? (v3 * rc5) : (v3 / v4);
                    p1[b1 + j] = v5;
                }
            }
        }
        if (pend) {
            const int64_t len = inner;
            #if defined(FB_AVX512)
            const int64_t jv = len - len % 16;
            for (int64_t j = 0; j < jv; j += 16) {
                const float r4 = l_r4;
                const float rc5 = l_rc5;
                const int rk5 = l_rk5;
                const int64_t b1 = l_b1;
                const float *c3 = pc3;
                float *d0 = p1 + b1;
                const int st = l_st;
                const __m512 v3 = _mm512_load_ps(&c3[j]);
                const __m512 v4 = _mm512_set1_ps(r4);
                const __m512 v5 = rk5 ? _mm512_mul_ps(v3, _mm512_set1_ps(rc5)) : _mm512_div_ps(v3, v4);
                fbv_store(&d0[j], v5, st);
            }
            #else
            const int64_t jv = 0;
            #endif
            {
                const float r4 = l_r4;
                const float rc5 = l_rc5;
                const int rk5 = l_rk5;
                const int64_t b1 = l_b1;
                const float *c3 = pc3;
                #pragma omp simd
                for (int64_t j = jv; j < len; j++) {
                    const float v3 = c3[j];
                    const float v4 = r4;
                    const float v5 = rk5 ? (v3 * rc5) : (v3 / v4);
                    p1[b1 + j] = v5;
                }
            }
            #if defined(FB_AVX512)
            if (l_st) _mm_sfence();
            #endif
        }
        free(scratch);
    }
}
