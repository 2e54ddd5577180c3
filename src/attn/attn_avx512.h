/* attn_avx512.h - inline AVX-512 pieces the attention kernels share
 * (attn_kernels_avx512.c for decode, attn_prefill_avx512.c for prefill):
 * the tail mask and the softmax exp, written once so decode and prefill
 * round exactly alike. Include only under ATTN_HAVE_AVX512. */
#ifndef SPARQ_ATTN_AVX512_H
#define SPARQ_ATTN_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* The low min(left, 16) lanes (none when left <= 0). */
static inline __mmask16 tail_mask(int64_t left)
{
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* exp(x) for x <= 0 (softmax arguments, x - max): x = n ln2 + t with
 * |t| <= ln2/2 (ln2 in two parts, so t is exact to ~1e-10), e^t by a
 * degree-5 polynomial fitted by Remez exchange for minimax relative error
 * (7.5e-8), 2^n applied by scalef, which underflows gradually to 0. The
 * clamp keeps -inf from making inf - inf (e^-104 is 0 in f32 anyway).
 * About 2e-7 relative to expf. */
static inline __m512 exp_neg(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 t = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    t = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), t);
    __m512 p = _mm512_set1_ps(8.297655080e-03f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(4.191538199e-02f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.666757473e-01f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(4.999889485e-01f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(9.999996920e-01f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.000000072e+00f));
    return _mm512_scalef_ps(p, n);
}

#endif
