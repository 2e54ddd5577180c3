/* attn_prefill_avx2.c - the AVX2 (+FMA) twins of the prefill attention row
 * primitives (attn_prefill.h) for CPUs without AVX-512: scores of 2 rows
 * at a time over a transposed key tile (four 8-key accumulators each),
 * attn_avx2.h's polynomial exp (decode's, so both round alike),
 * p.V of 2 rows x 32 of d at a time. Per row the reference's order.
 */
#include "attn/attn_prefill_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include "attn/attn_avx2.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

_Static_assert(ATTN_PF_BK == 32, "four 8-lane vectors per key tile");

/* R (1 or 2) rows: acc += q*k unfused, in order of e (scores_ref's). */
INLINE void scores_rows(const float *const *q, const float *kt, int d, float scale, float *s, const int R)
{
    __m256 a[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) a[r][u] = _mm256_setzero_ps();
    for (int e = 0; e < d; e++) {
        __m256 k[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) k[u] = _mm256_load_ps(kt + (size_t)e * ATTN_PF_BK + 8 * u);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const __m256 qe = _mm256_set1_ps(q[r][e]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) a[r][u] = _mm256_add_ps(a[r][u], _mm256_mul_ps(qe, k[u]));
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) _mm256_storeu_ps(s + r * ATTN_PF_BK + 8 * u, _mm256_mul_ps(a[r][u], sc));
}

static void scores_avx2(const float *const *q, int nr, const float *kt, int d, float scale, float *s)
{
    for (int r0 = 0; r0 < nr; r0 += 2) {
        if (nr - r0 >= 2) scores_rows(q + r0, kt, d, scale, s + r0 * ATTN_PF_BK, 2);
        else scores_rows(q + r0, kt, d, scale, s + r0 * ATTN_PF_BK, 1);
    }
}

/* max_ps(x, acc) is x > acc ? x : acc per lane (a NaN x yields acc) */
static float rowmax_avx2(const float *s, int nk, float m)
{
    __m256 acc = _mm256_set1_ps(m);
    int k = 0;
    for (; k + 8 <= nk; k += 8) acc = _mm256_max_ps(_mm256_loadu_ps(s + k), acc);
    float mx = hmax8(acc);
    for (; k < nk; k++) mx = s[k] > mx ? s[k] : mx;
    return mx;
}

static float expsum_avx2(float *s, int nk, float m)
{
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= nk; k += 8) {
        const __m256 p = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + k), mv));
        _mm256_storeu_ps(s + k, p);
        sum = _mm256_add_ps(sum, p);
    }
    float lanes[8], tail = 0;
    _mm256_storeu_ps(lanes, sum);
    for (; k < nk; k++) { /* the tile's causal edge: same polynomial, one lane */
        float x[8] = { s[k] - m };
        _mm256_storeu_ps(x, exp_neg8(_mm256_loadu_ps(x)));
        s[k] = x[0];
        tail += x[0];
    }
    return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7])) + tail;
}

/* R (1 or 2) rows x 32 of d per pass (d a multiple of 16 here; the rest by
 * the reference): o * c, then one fma per key in key order. */
INLINE void pv_rows(const float *p, const float *v, int nk, int d, const float *c, float *const *o, const int R)
{
    int e = 0;
    for (; e + 32 <= d; e += 32) {
        __m256 acc[2][4];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                acc[r][u] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + e + 8 * u), _mm256_set1_ps(c[r]));
        for (int k = 0; k < nk; k++) {
            __m256 vr[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) vr[u] = _mm256_loadu_ps(v + (size_t)k * d + e + 8 * u);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m256 pk = _mm256_set1_ps(p[r * ATTN_PF_BK + k]);
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) acc[r][u] = _mm256_fmadd_ps(pk, vr[u], acc[r][u]);
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) _mm256_storeu_ps(o[r] + e + 8 * u, acc[r][u]);
    }
    for (int r = 0; r < R; r++) /* d not a multiple of 32: the last columns as pv_ref */
        for (int f = e; f < d; f++) {
            float x = o[r][f] * c[r];
            for (int k = 0; k < nk; k++) x = __builtin_fmaf(p[r * ATTN_PF_BK + k], v[(size_t)k * d + f], x);
            o[r][f] = x;
        }
}

static void pv_avx2(const float *p, int nr, const float *v, int nk, int d, const float *c, float *const *o)
{
    for (int r0 = 0; r0 < nr; r0 += 2) {
        if (nr - r0 >= 2) pv_rows(p + r0 * ATTN_PF_BK, v, nk, d, c + r0, o + r0, 2);
        else pv_rows(p + r0 * ATTN_PF_BK, v, nk, d, c + r0, o + r0, 1);
    }
}

const attn_pf_ops attn_pf_ops_avx2 = { scores_avx2, rowmax_avx2, expsum_avx2, pv_avx2 };
#else
typedef int attn_prefill_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
