/* fbc_2e944c7633540472: rank 2, row kernel: 3 passes over each row, one block per row
   p0: load f32 [strided, unit]
   p1: store f32 [strided, unit]
*/
struct fbc_2e944c7633540472_params {
    const float *p0;
    float *p1;
    long long n[2];
    long long s[2][2];
    long long o[2];
    long long vec;
};

template <typename I, typename U>
__device__ __forceinline__ void fbc_2e944c7633540472_p3_body(const fbc_2e944c7633540472_params &p) {
    const I n0 = (I)p.n[0];
    const I n1 = (I)p.n[1];
    const I o0 = (I)p.o[0];
    const I s0_0 = (I)p.s[0][0];
    const I o1 = (I)p.o[1];
    const I s1_0 = (I)p.s[1][0];
    const U rows = (U)n0;
    const int threads = (int)blockDim.x;
    const I tid = (I)threadIdx.x;
    __shared__ double smem[FBC_BLOCK / 32];
    /* one block per row; its threads share the row's elements */
    for (U row = (U)blockIdx.x; row < rows; row += (U)gridDim.x) {
        const I i0 = (I)row;
        const I rb0 = o0 + i0 * s0_0;
        const I rb1 = o1 + i0 * s1_0;
        /* the row in registers, moved in 16-byte vectors */
        float c0[4][4];
        #pragma unroll
        for (int g = 0; g < 4; ++g) {
            const I j0 = ((I)g * (I)threads + tid) * (I)4;
            if (j0 < n1) {
                fbc_vload(c0[g], p.p0 + rb0 + j0);
            }
        }
        float m1 = (-__int_as_float(0x7f800000));
        #pragma unroll
        for (int g = 0; g < 4; ++g) {
            const I j0 = ((I)g * (I)threads + tid) * (I)4;
            if (j0 < n1) {
                #pragma unroll
                for (int l = 0; l < 4; ++l) {
                    const float v0 = c0[g][l];
                    m1 = fbc_maxf(m1, v0);
                }
            }
        }
        double a1 = fbc_group<true>((double)m1, threads, smem);
        (void)a1;
        const float r1 = fbc_rnd_df(a1);
        double a4 = (0e0);
        float f4 = 0.0f;
        #pragma unroll
        for (int g = 0; g < 4; ++g) {
            const I j0 = ((I)g * (I)threads + tid) * (I)4;
            if (j0 < n1) {
                #pragma unroll
                for (int l = 0; l < 4; ++l) {
                    const float v0 = c0[g][l];
                    const float v1 = r1;
                    const float v2 = __fsub_rn(v0, v1);
                    const float v3 = expf(v2);
                    c0[g][l] = v3;
                    f4 = __fadd_rn(f4, v3);
                }
            }
        }
        if (fbc_finitef(f4)) {
            a4 = fbc_sum2(a4, (double)f4);
        }
        else {
            /* the f32 partial overflowed or met a NaN: the same elements in f64 */
            #pragma unroll
            for (int g = 0; g < 4; ++g) {
                const I j0 = ((I)g * (I)threads + tid) * (I)4;
                if (j0 < n1) {
                    #pragma unroll
                    for (int l = 0; l < 4; ++l) {
                        const float v3 = c0[g][l];
                        a4 = fbc_sum2(a4, (double)v3);
                    }
                }
            }
        }
        a4 = fbc_group<false>(a4, threads, smem);
        const float r4 = fbc_rnd_df(a4);
        float rc5 = 1.0f;
        bool rk5 = false;
        {
            const float v4 = r4;
            rk5 = fbc_recip_ok(v4);
            rc5 = __fdiv_rn(1.0f, v4);
        }
        #pragma unroll
        for (int g = 0; g < 4; ++g) {
            const I j0 = ((I)g * (I)threads + tid) * (I)4;
            if (j0 < n1) {
                float y0[4];
                #pragma unroll
                for (int l = 0; l < 4; ++l) {
                    const float v3 = c0[g][l];
                    const float v4 = r4;
                    const float v5 = rk5 ? __fmul_rn(v3, rc5) : __fdiv_rn(v3, v4);
                    y0[l] = v5;
                }
                fbc_vstore(p.p1 + rb1 + j0, y0);
            }
        }
    }
}
extern "C" __global__ void __launch_bounds__(FBC_BLOCK, 6) fbc_2e944c7633540472_p3_i32(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p3_body<int, unsigned int>(p); }
extern "C" __global__ void __launch_bounds__(FBC_BLOCK, 6) fbc_2e944c7633540472_p3_i64(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p3_body<long long, unsigned long long>(p); }

template <typename I, typename U>
__device__ __forceinline__ void fbc_2e944c7633540472_p2_body(const fbc_2e944c7633540472_params &p) {
    const I n0 = (I)p.n[0];
    const I n1 = (I)p.n[1];
    const I o0 = (I)p.o[0];
    const I s0_0 = (I)p.s[0][0];
    const I o1 = (I)p.o[1];
    const I s1_0 = (I)p.s[1][0];
    const U rows = (U)n0;
    const int threads = (int)blockDim.x;
    const I tid = (I)threadIdx.x;
    __shared__ double smem[FBC_BLOCK / 32];
    /* one block per row; its threads share the row's elements */
    for (U row = (U)blockIdx.x; row < rows; row += (U)gridDim.x) {
        const I i0 = (I)row;
        const I rb0 = o0 + i0 * s0_0;
        const I rb1 = o1 + i0 * s1_0;
        /* the row in registers, element by element */
        float c0[4][4];
        #pragma unroll
        for (int s = 0; s < 16; ++s) {
            const I i1 = (I)s * (I)threads + tid;
            if (i1 < n1) {
                c0[s / 4][s % 4] = p.p0[rb0 + i1];
            }
        }
        float m1 = (-__int_as_float(0x7f800000));
        #pragma unroll
        for (int s = 0; s < 16; ++s) {
            const I i1 = (I)s * (I)threads + tid;
            if (i1 < n1) {
                const float v0 = c0[s / 4][s % 4];
                m1 = fbc_maxf(m1, v0);
            }
        }
        double a1 = fbc_group<true>((double)m1, threads, smem);
        (void)a1;
        const float r1 = fbc_rnd_df(a1);
        double a4 = (0e0);
        float f4 = 0.0f;
        #pragma unroll
        for (int s = 0; s < 16; ++s) {
            const I i1 = (I)s * (I)threads + tid;
            if (i1 < n1) {
                const float v0 = c0[s / 4][s % 4];
                const float v1 = r1;
                const float v2 = __fsub_rn(v0, v1);
                const float v3 = expf(v2);
                c0[s / 4][s % 4] = v3;
                f4 = __fadd_rn(f4, v3);
            }
        }
        if (fbc_finitef(f4)) {
            a4 = fbc_sum2(a4, (double)f4);
        }
        else {
            /* the f32 partial overflowed or met a NaN: the same elements in f64 */
            #pragma unroll
            for (int s = 0; s < 16; ++s) {
                const I i1 = (I)s * (I)threads + tid;
                if (i1 < n1) {
                    const float v3 = c0[s / 4][s % 4];
                    a4 = fbc_sum2(a4, (double)v3);
                }
            }
        }
        a4 = fbc_group<false>(a4, threads, smem);
        const float r4 = fbc_rnd_df(a4);
        float rc5 = 1.0f;
        bool rk5 = false;
        {
            const float v4 = r4;
            rk5 = fbc_recip_ok(v4);
            rc5 = __fdiv_rn(1.0f, v4);
        }
        #pragma unroll
        for (int s = 0; s < 16; ++s) {
            const I i1 = (I)s * (I)threads + tid;
            if (i1 < n1) {
                const I b1 = rb1 + i1;
                const float v3 = c0[s / 4][s % 4];
                const float v4 = r4;
                const float v5 = rk5 ? __fmul_rn(v3, rc5) : __fdiv_rn(v3, v4);
                p.p1[b1] = v5;
            }
        }
    }
}
extern "C" __global__ void __launch_bounds__(FBC_BLOCK) fbc_2e944c7633540472_p2_i32(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p2_body<int, unsigned int>(p); }
extern "C" __global__ void __launch_bounds__(FBC_BLOCK) fbc_2e944c7633540472_p2_i64(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p2_body<long long, unsigned long long>(p); }

template <typename I, typename U>
__device__ __forceinline__ void fbc_2e944c7633540472_p1_body(const fbc_2e944c7633540472_params &p) {
    const I n0 = (I)p.n[0];
    const I n1 = (I)p.n[1];
    const I o0 = (I)p.o[0];
    const I s0_0 = (I)p.s[0][0];
    const I o1 = (I)p.o[1];
    const I s1_0 = (I)p.s[1][0];
    const U rows = (U)n0;
    const int threads = (int)blockDim.x;
    __shared__ double smem[FBC_BLOCK / 32];
    /* one block per row; its threads share the row's elements */
    for (U row = (U)blockIdx.x; row < rows; row += (U)gridDim.x) {
        const I i0 = (I)row;
        const I rb0 = o0 + i0 * s0_0;
        const I rb1 = o1 + i0 * s1_0;
        /* the row in shared memory after its first reading */
        unsigned char *const cache = fbc_row_cache();
        float *const sh0 = reinterpret_cast<float *>(cache);
        float m1 = (-__int_as_float(0x7f800000));
        for (U j = (U)threadIdx.x; j < (U)n1; j += (U)threads) {
            const I i1 = (I)j;
            const I b0 = rb0 + i1;
            const float e0 = p.p0[b0];
            sh0[i1] = e0;
            const float v0 = e0;
            m1 = fbc_maxf(m1, v0);
        }
        double a1 = fbc_group<true>((double)m1, threads, smem);
        (void)a1;
        const float r1 = fbc_rnd_df(a1);
        double a4 = (0e0);
        for (U j0 = (U)threadIdx.x; j0 < (U)n1; j0 += (U)threads * (U)16) {
            float f4 = 0.0f;
            for (int s = 0; s < 16; ++s) {
                const U j = j0 + (U)s * (U)threads;
                if (j >= (U)n1) break;
                const I i1 = (I)j;
                const float v0 = sh0[i1];
                const float v1 = r1;
                const float v2 = __fsub_rn(v0, v1);
                const float v3 = expf(v2);
                sh0[i1] = v3;
                f4 = __fadd_rn(f4, v3);
            }
            if (fbc_finitef(f4)) {
                a4 = fbc_sum2(a4, (double)f4);
            }
            else {
                /* the f32 partial overflowed or met a NaN: the same elements in f64 */
                for (int s = 0; s < 16; ++s) {
                    const U j = j0 + (U)s * (U)threads;
                    if (j >= (U)n1) break;
                    const I i1 = (I)j;
                    const float v3 = sh0[i1];
                    a4 = fbc_sum2(a4, (double)v3);
                }
            }
        }
        a4 = fbc_group<false>(a4, threads, smem);
        const float r4 = fbc_rnd_df(a4);
        float rc5 = 1.0f;
        bool rk5 = false;
        {
            const float v4 = r4;
            rk5 = fbc_recip_ok(v4);
            rc5 = __fdiv_rn(1.0f, v4);
        }
        for (U j = (U)threadIdx.x; j < (U)n1; j += (U)threads) {
            const I i1 = (I)j;
            const I b1 = rb1 + i1;
            const float v3 = sh0[i1];
            const float v4 = r4;
            const float v5 = rk5 ? __fmul_rn(v3, rc5) : __fdiv_rn(v3, v4);
            p.p1[b1] = v5;
        }
    }
}
extern "C" __global__ void __launch_bounds__(FBC_BLOCK) fbc_2e944c7633540472_p1_i32(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p1_body<int, unsigned int>(p); }
extern "C" __global__ void __launch_bounds__(FBC_BLOCK) fbc_2e944c7633540472_p1_i64(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p1_body<long long, unsigned long long>(p); }

template <typename I, typename U>
__device__ __forceinline__ void fbc_2e944c7633540472_p0_body(const fbc_2e944c7633540472_params &p) {
    const I n0 = (I)p.n[0];
    const I n1 = (I)p.n[1];
    const I o0 = (I)p.o[0];
    const I s0_0 = (I)p.s[0][0];
    const I o1 = (I)p.o[1];
    const I s1_0 = (I)p.s[1][0];
    const U rows = (U)n0;
    const int threads = (int)blockDim.x;
    __shared__ double smem[FBC_BLOCK / 32];
    /* one block per row; its threads share the row's elements */
    for (U row = (U)blockIdx.x; row < rows; row += (U)gridDim.x) {
        const I i0 = (I)row;
        const I rb0 = o0 + i0 * s0_0;
        const I rb1 = o1 + i0 * s1_0;
        /* every pass reads the row from global memory */
        float m1 = (-__int_as_float(0x7f800000));
        for (U j = (U)threadIdx.x; j < (U)n1; j += (U)threads) {
            const I i1 = (I)j;
            const I b0 = rb0 + i1;
            const float v0 = p.p0[b0];
            m1 = fbc_maxf(m1, v0);
        }
        double a1 = fbc_group<true>((double)m1, threads, smem);
        (void)a1;
        const float r1 = fbc_rnd_df(a1);
        double a4 = (0e0);
        for (U j0 = (U)threadIdx.x; j0 < (U)n1; j0 += (U)threads * (U)16) {
            float f4 = 0.0f;
            for (int s = 0; s < 16; ++s) {
                const U j = j0 + (U)s * (U)threads;
                if (j >= (U)n1) break;
                const I i1 = (I)j;
                const I b0 = rb0 + i1;
                const float v0 = p.p0[b0];
                const float v1 = r1;
                const float v2 = __fsub_rn(v0, v1);
                const float v3 = expf(v2);
                f4 = __fadd_rn(f4, v3);
            }
            if (fbc_finitef(f4)) {
                a4 = fbc_sum2(a4, (double)f4);
            }
            else {
                /* the f32 partial overflowed or met a NaN: the same elements in f64 */
                for (int s = 0; s < 16; ++s) {
                    const U j = j0 + (U)s * (U)threads;
                    if (j >= (U)n1) break;
                    const I i1 = (I)j;
                    const I b0 = rb0 + i1;
                    const float v0 = p.p0[b0];
                    const float v1 = r1;
                    const float v2 = __fsub_rn(v0, v1);
                    const float v3 = expf(v2);
                    a4 = fbc_sum2(a4, (double)v3);
                }
            }
        }
        a4 = fbc_group<false>(a4, threads, smem);
        const float r4 = fbc_rnd_df(a4);
        float rc5 = 1.0f;
        bool rk5 = false;
        {
            const float v4 = r4;
            rk5 = fbc_recip_ok(v4);
            rc5 = __fdiv_rn(1.0f, v4);
        }
        for (U j = (U)threadIdx.x; j < (U)n1; j += (U)threads) {
            const I i1 = (I)j;
            const I b0 = rb0 + i1;
            const I b1 = rb1 + i1;
            const float v0 = p.p0[b0];
            const float v1 = r1;
            const float v2 = __fsub_rn(v0, v1);
            const float v3 = expf(v2);
            const float v4 = r4;
            const float v5 = rk5 ? __fmul_rn(v3, rc5) : __fdiv_rn(v3, v4);
            p.p1[b1] = v5;
        }
    }
}
extern "C" __global__ void __launch_bounds__(FBC_BLOCK) fbc_2e944c7633540472_p0_i32(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p0_body<int, unsigned int>(p); }
extern "C" __global__ void __launch_bounds__(FBC_BLOCK) fbc_2e944c7633540472_p0_i64(const fbc_2e944c7633540472_params p) { fbc_2e944c7633540472_p0_body<long long, unsigned long long>(p); }
