/* attn_avx2.h - inline AVX2 (+FMA) pieces the attention kernels share
 * (attn_kernels_avx2.c and attn_kernels_q8i_avx2.c for decode,
 * attn_prefill_avx2.c for prefill, core/forward_avx2.c's SiLU): the
 * softmax exps, horizontal sums and maxima and a row maximum (the
 * prefetches are attn_prefetch.h's). The exps are attn_avx512.h's, term for term,
 * with 2^n built in the exponent bits where AVX-512 has scalef: with the
 * argument clamped as there, 2^n is a normal float and the product is the
 * same float, so the AVX2 and AVX-512 levels round every weight alike.
 * Include only from a *_avx2.c file.
 */
#ifndef SPARQ_ATTN_AVX2_H
#define SPARQ_ATTN_AVX2_H

#include "attn/attn_exp.h"
#include "attn/attn_prefetch.h"
#include "util/simd_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* 2^n for integral n in [-126, 127] (a float), as the bits of a float. */
static inline __m256 pow2i8(__m256 n)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

/* exp(x) for x <= 0: attn_exp.h's reduction and polynomial; below -87 the
 * result is exactly 0, never a subnormal (attn_avx512.h's exp_neg says
 * why: Intel's microcode assists). The clamp keeps 2^n normal; NaN gives 0.
 * Up to x = 88.37 (n = 127) the exponent bits hold 2^n. */
static inline __m256 exp_neg8(__m256 x)
{
    const __m256 normal = _mm256_cmp_ps(x, _mm256_set1_ps(ATTN_EXP_MIN), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(ATTN_EXP_MIN));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 t = _mm256_fnmadd_ps(n, _mm256_set1_ps(ATTN_EXP_LN2_HI), x);
    t = _mm256_fnmadd_ps(n, _mm256_set1_ps(ATTN_EXP_LN2_LO), t);
    __m256 p = _mm256_set1_ps(ATTN_EXP_C5);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(ATTN_EXP_C4));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(ATTN_EXP_C3));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(ATTN_EXP_C2));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(ATTN_EXP_C1));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(ATTN_EXP_C0));
    return _mm256_and_ps(normal, _mm256_mul_ps(p, pow2i8(n)));
}

/* exp(x) for any x (core/forward_avx2.c's SiLU takes e^-x): exp_neg8's
 * with x also clamped above at 88.5, where 2^n reaches 2^128 and the result
 * is +inf (as scalef overflows in attn_avx512.h's exp_neg; from 88.38 on,
 * a little before expf does: the SiLU there is -0 instead of ~-3e-37). */
static inline __m256 exp_any8(__m256 x)
{
    return exp_neg8(_mm256_min_ps(x, _mm256_set1_ps(88.5f)));
}

/* exp(x - m) for x <= m as attn_avx512.h's exp_sub: 2^(x log2e - m log2e)
 * with m log2e in two parts (exp_shift8), 0 below 2^-125. */
static inline __m256 exp_sub8(__m256 x, __m256 mhi, __m256 mlo)
{
    __m256 a = _mm256_fmsub_ps(x, _mm256_set1_ps(1.44269504088896341f), mhi);
    a = _mm256_sub_ps(a, mlo);
    const __m256 normal = _mm256_cmp_ps(a, _mm256_set1_ps(ATTN_EXP2_MIN), _CMP_GE_OQ);
    a = _mm256_max_ps(a, _mm256_set1_ps(ATTN_EXP2_MIN));
    const __m256 n = _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(a, n);
    __m256 p = _mm256_set1_ps(1.327647198e-03f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.675541334e-03f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550713274e-02f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402211972e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931469671e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.000000072e+00f));
    return _mm256_and_ps(normal, _mm256_mul_ps(p, pow2i8(n)));
}

/* m log2e as hi + lo, for exp_sub8 (attn_avx512.h's exp_shift). */
static inline void exp_shift8(float m, __m256 *hi, __m256 *lo)
{
    const float l2e = 1.44269504088896341f, h = m * l2e;
    *hi = _mm256_set1_ps(h);
    *lo = _mm256_set1_ps(m > -INFINITY ? (float)((double)m * (double)l2e - (double)h) : 0.0f);
}

static inline float hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

/* A NaN lane loses to a number (max_ps returns its second operand when
 * one is NaN), as in the AVX-512 reductions. */
static inline float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    x = _mm_max_ps(_mm_movehl_ps(x, x), x);
    return _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(x), x));
}

/* Eight vectors -> one: lane u is the sum of the lanes of v[u] (a
 * transpose-add tree of hadds instead of eight separate reductions). */
static inline __m256 hsum8x8(const __m256 v[8])
{
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* max of x[0..n) (-inf when n <= 0); a NaN element is skipped. */
static inline float max_of8(const float *x, int64_t n)
{
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vmx = _mm256_max_ps(_mm256_loadu_ps(x + i), vmx);
    if (i < n) {
        const __m256i m = simd_lanes8(n - i);
        const __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x + i, m),
                                          _mm256_castsi256_ps(m));
        vmx = _mm256_max_ps(v, vmx);
    }
    return hmax8(vmx);
}

#endif
