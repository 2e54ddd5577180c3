/* bench_avx2.c - the AVX2 twin of bench membw's read kernel (bench.h);
 * bench_kernels_at picks it at run time. */
#include "bench/bench.h"

#if defined(__AVX2__)
#include <immintrin.h>

/* Four independent accumulators keep the adds off the critical path, so the
 * loop runs at the speed memory delivers 64-byte lines (two per step). */
float bench_sum_f32_avx2(const float *x, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    float r = _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    for (; i < n; i++) r += x[i];
    return r;
}

const bench_kernels bench_kernels_avx2 = { bench_sum_f32_avx2 };

#else
typedef int bench_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
