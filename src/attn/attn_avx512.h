/* attn_avx512.h - inline AVX-512 pieces the attention kernels share
 * (attn_kernels_avx512.c for decode, attn_prefill_avx512.c for prefill):
 * the tail mask and the softmax exp, written once so decode and prefill
 * round exactly alike. Include only under ATTN_HAVE_AVX512. */
#ifndef SPARQ_ATTN_AVX512_H
#define SPARQ_ATTN_AVX512_H

#include "attn/attn_exp.h"

#include <immintrin.h>
#include <stdint.h>

/* The low min(left, 16) lanes (none when left <= 0). */
static inline __mmask16 tail_mask(int64_t left)
{
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* exp(x), made for x <= 0 (softmax arguments, x - max; SiLU's e^-x in
 * core/forward.c uses it for any sign: scalef overflows to inf): x = n ln2
 * + t with |t| <= ln2/2, e^t by attn_exp.h's polynomial, 2^n applied by
 * scalef, which underflows gradually to 0. The clamp keeps -inf from making
 * inf - inf (e^-104 is 0 in f32 anyway). About 2e-7 relative to expf. */
static inline __m512 exp_neg(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(ATTN_EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 t = _mm512_fnmadd_ps(n, _mm512_set1_ps(ATTN_EXP_LN2_HI), x);
    t = _mm512_fnmadd_ps(n, _mm512_set1_ps(ATTN_EXP_LN2_LO), t);
    __m512 p = _mm512_set1_ps(ATTN_EXP_C5);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(ATTN_EXP_C4));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(ATTN_EXP_C3));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(ATTN_EXP_C2));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(ATTN_EXP_C1));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(ATTN_EXP_C0));
    return _mm512_scalef_ps(p, n);
}

#endif
