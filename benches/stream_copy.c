/* The copy benches/peers.py measures its memory floor with: every core copies its own slice,
 * and the stores stream past the cache (no read for ownership of the destination), as the
 * stores of fusebox's CPU kernels do. NumPy's copy keeps the read for ownership on some
 * machines (glibc's memcpy streams only above a threshold set from the cache size), which
 * would make the floor look slower than what fusebox's kernels can reach.
 *
 * peers.py builds it with the C compiler fusebox uses (`cc -O2 -march=native -fopenmp
 * -shared -fPIC`) and calls it through ctypes.
 */
#include <stdint.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

void fb_stream_copy(float *dst, const float *src, int64_t n) {
    #pragma omp parallel
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        int64_t i = lo;
#if defined(__AVX512F__) || defined(__AVX__)
        /* Streaming stores need an aligned destination: copy up to the first 64-byte line. */
        for (; i < hi && ((uintptr_t)(dst + i) & 63) != 0; i++) dst[i] = src[i];
#if defined(__AVX512F__)
        for (; i + 16 <= hi; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#else
        for (; i + 8 <= hi; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#endif
        _mm_sfence();
#endif
        if (hi > i) memcpy(dst + i, src + i, (size_t)(hi - i) * sizeof(float));
    }
}
