/* attn_avx512.h - inline AVX-512 pieces the attention kernels share
 * (attn_kernels_avx512.c and attn_kernels_q8i_avx512.c for decode,
 * attn_prefill_avx512.c for prefill): the tail mask, the softmax exps, a
 * row max, written once so decode and prefill round exactly alike (the
 * prefetches are attn_prefetch.h's). Include only under ATTN_HAVE_AVX512. */
#ifndef SPARQ_ATTN_AVX512_H
#define SPARQ_ATTN_AVX512_H

#include "attn/attn_exp.h"
#include "attn/attn_prefetch.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* The low min(left, 16) lanes (none when left <= 0). */
static inline __mmask16 tail_mask(int64_t left)
{
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* exp(x), made for x <= 0 (softmax arguments, x - max; SiLU's e^-x in
 * core/forward.c uses it for any sign: scalef overflows to inf): x = n ln2
 * + t with |t| <= ln2/2, e^t by attn_exp.h's polynomial, 2^n applied by
 * scalef. About 2e-7 relative to expf. Below x = -87 the result is exactly
 * 0, never a subnormal: e^-87 is 1.6e-38, nothing beside the row's largest
 * weight (1), and Intel cores take a microcode assist for every subnormal
 * an FMA reads or writes (with FTZ/DAZ off, as a library must leave them):
 * subnormal weights made llama-3.2-1b's prefill at depth 2048 3.9x slower
 * on a Xeon (docs/bench-results/HISTORY.md). The clamp keeps -inf from making
 * inf - inf; NaN gives 0. */
static inline __m512 exp_neg(__m512 x)
{
    const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(ATTN_EXP_MIN), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(ATTN_EXP_MIN));
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
    return _mm512_maskz_scalef_ps(normal, p, n);
}

/* exp(x - m) for x <= m, as 2^(x log2e - m log2e): one FMA (x log2e exact
 * in it) minus the low part of m log2e (mlo, see exp_shift), so the
 * argument is as exact as x - m would be; then 2^n by scalef and 2^f,
 * |f| <= 1/2, by the same minimax polynomial as exp_neg rescaled (7.5e-8).
 * Two fewer multiplies than exp_neg(x - m), where the FMA pipes are the
 * bottleneck. About 2e-7 relative to expf(x - m). */
static inline __m512 exp_sub(__m512 x, __m512 mhi, __m512 mlo)
{
    __m512 a = _mm512_fmsub_ps(x, _mm512_set1_ps(1.44269504088896341f), mhi);
    a = _mm512_sub_ps(a, mlo);
    /* 0 below 2^-125 (p(f) 2^n >= 2^-125.5 stays normal; see exp_neg) */
    const __mmask16 normal = _mm512_cmp_ps_mask(a, _mm512_set1_ps(ATTN_EXP2_MIN), _CMP_GE_OQ);
    a = _mm512_max_ps(a, _mm512_set1_ps(ATTN_EXP2_MIN));
    const __m512 n = _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(a, n);
    __m512 p = _mm512_set1_ps(1.327647198e-03f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.675541334e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550713274e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402211972e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931469671e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.000000072e+00f));
    return _mm512_maskz_scalef_ps(normal, p, n);
}

/* m log2e as hi + lo (hi the f32 product, lo its rounding error, from
 * double), for exp_sub. log2e is the f32 constant exp_sub multiplies by. */
static inline void exp_shift(float m, __m512 *hi, __m512 *lo)
{
    const float l2e = 1.44269504088896341f, h = m * l2e;
    *hi = _mm512_set1_ps(h);
    *lo = _mm512_set1_ps(m > -INFINITY ? (float)((double)m * (double)l2e - (double)h) : 0.0f);
}

/* max of x[0..n) (-inf when n <= 0). */
static inline float max_of(const float *x, int64_t n)
{
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
                                                      tail_mask(n - i), x + i));
    return _mm512_reduce_max_ps(vmx);
}

#endif
