for (int64_t o = 0; o < outer; o++) {
    const int64_t i0 = o;
    if (i0 < re0) {
        {
            const int64_t b0 = o0 + i0 * s0_0 + j0;
            const int64_t b1 = o1 + i0 * s1_0 + j0;
            if (pf) for (int64_t l = 0; l < len; l += 16) __builtin_prefetch((const void *)((uintptr_t)(p0 + b0 + l) + (uintptr_t)(4 * s0_0 * 4)));
            const int64_t kb0 = 0 + j0;
            #if defined(FB_AVX512)
            const int64_t jv = len - len % 16;
            #else
            const int64_t jv = 0;
            #endif
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
                const __m512 v1 = fbv_tanhf(v0);
                fbv_acc_sum(&q0[kb0 + j], v1);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v0 = p0[b0 + j];
                const float v1 = fb_tanhf(v0);
                q0[kb0 + j] += (double)v1;
            }
        }
    }
    else {
        {
            const int64_t b0 = o0 + i0 * s0_0 + j0;
            const int64_t b1 = o1 + i0 * s1_0 + j0;
            if (pf) for (int64_t l = 0; l < len; l += 16) __builtin_prefetch((const void *)((uintptr_t)(p1 + b1 + l) + (uintptr_t)(4 * s1_0 * 4)));
            const int64_t kb0 = 0 + j0;
            #if defined(FB_AVX512)
            const int64_t jv = len - len % 16;
            #else
            const int64_t jv = 0;
            #endif
            #if defined(FB_AVX512)
            for (int64_t j = 0; j < jv; j += 16) {
                const __m512 v0 = _mm512_loadu_ps(&p1[b1 + j]);
                const __m512 v1 = fbv_expf(v0);
                fbv_acc_sum(&q0[kb0 + j], v1);
            }
            #endif
            #pragma omp simd
            for (int64_t j = jv; j < len; j++) {
                const float v0 = p1[b1 + j];
                const float v1 = fb_expf(v0);
                q0[kb0 + j] += (double)v1;
            }
        }
    }
}

void fb_0d45cd77d319b0c3(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    if (!(sizes[2] == 0 && sizes[3] == sizes[4] && sizes[5] == sizes[0])) {
        fb_0d45cd77d319b0c3_c(sizes, strides, offsets, ptrs);
        return;
    }
    fb_0d45cd77d319b0c3_n(sizes, strides, offsets, ptrs);
}
