/* bf16_avx2.h - vdpbf16ps emulated on 8 lanes, for the AVX2 twins of the
 * BF16 dot (quant_avx2.c) and GEMM tile (gemm_avx2.c): bf16 subnormal
 * inputs read as zero, per lane the odd element first, each fused
 * multiply-add's subnormal result flushed, as quant_ref.c and
 * gemm_panel_ref spell it out. Include only from a *_avx2.c file.
 */
#ifndef SPARQ_TENSOR_BF16_AVX2_H
#define SPARQ_TENSOR_BF16_AVX2_H

#include <immintrin.h>
#include <stdint.h>

/* v: a bf16 in the high half of each 32-bit lane, read as f32 with a
 * subnormal made a zero of its sign (like 0.0f * x). */
static inline __m256 bf16_daz8(__m256i v)
{
    __m256i exp = _mm256_and_si256(v, _mm256_set1_epi32(0x7f800000));
    __m256i zero_it = _mm256_andnot_si256(_mm256_set1_epi32((int)0x80000000u), _mm256_cmpeq_epi32(exp, _mm256_setzero_si256()));
    return _mm256_castsi256_ps(_mm256_andnot_si256(zero_it, v));
}

/* v, with a subnormal lane flushed to a zero of its sign. */
static inline __m256 ftz8(__m256 v)
{
    __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    return _mm256_andnot_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), tiny), v);
}

/* c + the products of the 16 bf16 pairs at a and b, lane l taking
 * elements 2l + 1 then 2l. */
static inline __m256 dpbf16x8(__m256 c, const uint16_t *a, const uint16_t *b)
{
    __m256i va = _mm256_loadu_si256((const __m256i *)(const void *)a);
    __m256i vb = _mm256_loadu_si256((const __m256i *)(const void *)b), hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 ao = bf16_daz8(_mm256_and_si256(va, hi)), bo = bf16_daz8(_mm256_and_si256(vb, hi));
    __m256 ae = bf16_daz8(_mm256_slli_epi32(va, 16)), be = bf16_daz8(_mm256_slli_epi32(vb, 16));
    c = ftz8(_mm256_fmadd_ps(ao, bo, c));
    return ftz8(_mm256_fmadd_ps(ae, be, c));
}

#endif
