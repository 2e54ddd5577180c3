/* forward_avx2.c - the AVX2 twin of the forward pass's SiLU
 * (forward_kernels.h). */
#include "core/forward_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include "attn/attn_avx2.h"

/* gate[i] = silu(gate[i]) * up[i], i < n, e^-x by attn_avx2.h's exp_any8
 * (the softmax's polynomial, about 2e-7 from expf), as the AVX-512 twin:
 * every element is computed the same way wherever it sits (the tail by a
 * masked vector), so prefill, decode and batched decode agree bit for
 * bit. Large -x: inf, x / inf = -0. */
void silu_mul_row_avx2(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_any8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 r = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(r, _mm256_loadu_ps(up + i)));
    }
    if (i < n) {
        const __m256i m = simd_lanes8(n - i);
        const __m256 x = _mm256_maskload_ps(gate + i, m);
        const __m256 e = exp_any8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 r = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_maskstore_ps(gate + i, m, _mm256_mul_ps(r, _mm256_maskload_ps(up + i, m)));
    }
}

const fwd_kernels fwd_kernels_avx2 = { silu_mul_row_avx2 };

#else
typedef int forward_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
