/* Times two compiled row kernels (softmax or layernorm, as `fusebox bench --backend cpu`
 * leaves them in its cache) beside a streaming copy of the same bytes, alternating the three in one
 * process so that they share the machine's state. On a loaded machine the one-thread CPU time
 * (`cpu` = 1, OMP_NUM_THREADS=1) is the figure that survives; wall time (`cpu` = 0) is what the
 * threads see.
 *
 *   gcc -O2 -mavx512f -fopenmp -o harness benches/row_kernel_harness.c -ldl
 *   FUSEBOX_CACHE_DIR=/tmp/a fusebox bench --backend cpu --iters 1 examples/softmax.ron
 *   OMP_NUM_THREADS=1 ./harness softmax 4096 4096 15 1 /tmp/a/<hash>.so fb_<name> B.so fb_<name>
 *
 * Arguments: softmax|layernorm, rows, row length, runs, cpu, then the .so and function name of
 * kernel A and of kernel B. Softmax's kernel takes x and y ([rows, n], row-major); layernorm's
 * x, gamma, beta ([n], broadcast over rows) and y. Inputs are uniform in [-3, 3].
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <omp.h>
#include <immintrin.h>
typedef void (*kfn)(const int64_t *, const int64_t *, const int64_t *, void *const *);
static double now(int cpu) { struct timespec t; clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec * 1e-6; }
static kfn load(const char *so, const char *name) {
    void *h = dlopen(so, RTLD_NOW);
    kfn f = h ? (kfn)dlsym(h, name) : NULL;
    if (!f) { fprintf(stderr, "%s\n", dlerror()); exit(1); }
    return f;
}
/* The copy the floor is measured with: 64-byte loads and non-temporal stores, as the kernels
 * store their outputs (glibc's memcpy of 64 MiB uses ordinary stores here, which read each
 * destination line first and so move a third more bytes than the kernels do). */
static void stream_copy(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n && ((uintptr_t)(d + i) & 63); i++) d[i] = s[i];
    for (; i + 64 <= n; i += 64) _mm512_stream_si512((void *)(d + i), _mm512_loadu_si512((const void *)(s + i)));
    _mm_sfence();
    for (; i < n; i++) d[i] = s[i];
}
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    /* See the header comment for the arguments. */
    if (argc != 10) { fprintf(stderr, "usage: %s softmax|layernorm rows n runs cpu A.so A_fn B.so B_fn\n", argv[0]); return 1; }
    int ln = !strcmp(argv[1], "layernorm");
    int64_t R = atoll(argv[2]), N = atoll(argv[3]); int reps = atoi(argv[4]), cpu = atoi(argv[5]);
    if (R < 1 || N < 1 || reps < 1 || reps > 200) { fprintf(stderr, "rows, n >= 1; 1 <= runs <= 200\n"); return 1; }
    kfn k[2] = {load(argv[6], argv[7]), load(argv[8], argv[9])};
    size_t bytes = (size_t)R * N * 4;
    float *x = aligned_alloc(64, bytes), *y = aligned_alloc(64, bytes), *g = aligned_alloc(64, N * 4), *b = aligned_alloc(64, N * 4), *c = aligned_alloc(64, bytes);
    srand(1); for (int64_t i = 0; i < R * N; i++) x[i] = (rand() / (float)RAND_MAX) * 6 - 3;
    for (int64_t i = 0; i < N; i++) { g[i] = 1 + i * 1e-4f; b[i] = 0.5f; }
    memset(y, 0, bytes); memset(c, 0, bytes);
    int64_t sizes[2] = {R, N}, offs[4] = {0, 0, 0, 0};
    int64_t st_s[4] = {N, 1, N, 1}, st_l[8] = {N, 1, 0, 1, 0, 1, N, 1};
    void *p_s[2] = {x, y}, *p_l[4] = {x, g, b, y};
    double t[3][200];
    for (int r = 0; r < reps; r++) {
        for (int v = 0; v < 3; v++) {
            double t0 = now(cpu);
            if (v == 2) {
                #pragma omp parallel
                { int n = omp_get_num_threads(), i = omp_get_thread_num(); size_t lo = bytes / n * i, hi = i == n - 1 ? bytes : bytes / n * (i + 1); stream_copy((char *)c + lo, (char *)x + lo, hi - lo); }
            } else if (ln) k[v](sizes, st_l, offs, p_l); else k[v](sizes, st_s, offs, p_s);
            t[v][r] = now(cpu) - t0;
        }
    }
    const char *nm[3] = {"A", "B", "copy"};
    double med[3];
    for (int v = 0; v < 3; v++) { qsort(t[v], reps, sizeof(double), cmp); med[v] = t[v][reps / 2]; }
    for (int v = 0; v < 3; v++)
        printf("%s [%lld,%lld] %s %s: min %.3f ms (%.2fx copy) median %.3f ms (%.2fx) ns/elem(min) %.3f\n", argv[1], (long long)R, (long long)N, cpu ? "1thr-cpu" : "wall", nm[v], t[v][0], t[v][0] / t[2][0], med[v], med[v] / med[2], t[v][0] * 1e6 / (R * N));
    return 0;
}
