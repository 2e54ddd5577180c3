/* Random-row read rate of this machine: each of R regions of 2 MiB (one KV
 * head's K at 16384 positions x 128 B) has 1024 of its 16384 rows read, in
 * increasing order, with software prefetch 64 rows ahead (as the gather
 * kernel does); against reading 8 contiguous 32 KiB rows of each region (a
 * K^T r-slice scan). 2 threads (OpenMP), regions handed out dynamically. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
enum { ROWS = 16384, ROWB = 128, SEL = 1024, AHEAD = 64 };
int main(void)
{
    const size_t region = (size_t)ROWS * ROWB, nreg = 2048; /* 4 GiB */
    uint8_t *m = mmap(NULL, region * nreg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    madvise(m, region * nreg, MADV_HUGEPAGE);
    memset(m, 1, region * nreg);
    int32_t *sel = malloc(sizeof *sel * SEL * nreg);
    srand(1);
    for (size_t r = 0; r < nreg; r++) { /* 1024 distinct rows, increasing */
        int32_t *s = sel + r * SEL; int n = 0;
        for (int i = 0; i < ROWS && n < SEL; i++)
            if ((long)rand() % (ROWS - i) < SEL - n) s[n++] = i;
    }
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now(); float sink[2][16];
#pragma omp parallel num_threads(2)
        { __m512 acc = _mm512_setzero_ps();
#pragma omp for schedule(dynamic, 1)
            for (size_t r = 0; r < nreg; r++) {
                const uint8_t *b = m + ((r * 1009) % nreg) * region; const int32_t *s = sel + r * SEL;
                for (int j = 0; j < SEL; j++) {
                    if (j + AHEAD < SEL) { const uint8_t *p = b + (size_t)s[j + AHEAD] * ROWB; _mm_prefetch((const char *)p, _MM_HINT_T0); _mm_prefetch((const char *)p + 64, _MM_HINT_T0); }
                    const uint8_t *p = b + (size_t)s[j] * ROWB;
                    acc = _mm512_add_ps(acc, _mm512_add_ps(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 64)));
                }
            }
            _mm512_storeu_ps(sink[omp_get_thread_num()], acc);
        }
        double tg = now() - t0; t0 = now(); float sink2[2][16];
#pragma omp parallel num_threads(2)
        { __m512 acc2 = _mm512_setzero_ps();
#pragma omp for schedule(dynamic, 1)
            for (size_t r = 0; r < nreg; r++) {
                const uint8_t *b = m + ((r * 1009) % nreg) * region;
                for (int row = 0; row < 8; row++) { const uint8_t *p = b + (size_t)row * 5 * 32768;
                    for (size_t o = 0; o < 32768; o += 64) acc2 = _mm512_add_ps(acc2, _mm512_loadu_ps(p + o)); }
            }
            _mm512_storeu_ps(sink2[omp_get_thread_num()], acc2);
        }
        double ts = now() - t0;
        const float *x = sink[0], *y = sink2[0];
        const double bytes = (double)nreg * SEL * ROWB;
        printf("rep %d: random 128-B rows %.2f GB/s (%.1f ms for %.0f MB); 8 x 32 KiB rows %.2f GB/s (%.0f MB) [%g %g]\n", rep,
               bytes / tg * 1e-9, tg * 1e3, bytes * 1e-6, (double)nreg * 8 * 32768 / ts * 1e-9, nreg * 8 * 32768e-6, x[0], y[0]);
    }
    return 0;
}
