/* forward_avx512.c - the AVX-512 twin of the forward pass's SiLU
 * (forward_kernels.h). */
#include "core/forward_kernels.h"
#include "attn/attn.h"

#ifdef ATTN_HAVE_AVX512
#include "attn/attn_avx512.h"

/* gate[i] = silu(gate[i]) * up[i], i < n, e^-x by the softmax's exp_neg
 * (attn_avx512.h; about 2e-7 from expf, and ggml's vector SiLU
 * approximates too): the scalar expf was ~5% of a small model's prefill.
 * Every element is computed the same way wherever it sits (the tail by a
 * masked vector), so prefill, decode and batched decode agree bit for
 * bit. Large -x: inf, x / inf = -0. */
void silu_mul_row_avx512(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, gate + i);
        const __m512 e = exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 r = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

const fwd_kernels fwd_kernels_avx512 = { silu_mul_row_avx512 };

#else
typedef int forward_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
