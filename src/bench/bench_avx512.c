/* bench_avx512.c - the AVX-512 twin of bench membw's read kernel
 * (bench.h); bench_kernels_at picks it at run time. */
#include "bench/bench.h"

#if defined(__AVX512F__)
#include <immintrin.h>

/* Four independent accumulators keep the adds off the critical path, so the
 * loop runs at the speed memory delivers 64-byte lines. */
float bench_sum_f32_avx512(const float *x, size_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(m, x + i));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

const bench_kernels bench_kernels_avx512 = { bench_sum_f32_avx512 };

#else
typedef int bench_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
