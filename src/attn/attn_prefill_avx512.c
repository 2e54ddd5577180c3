/* attn_prefill_avx512.c - the AVX-512 twins of the prefill attention row
 * primitives (attn_prefill.h): scores of up to 4 rows over a transposed
 * key tile (two 16-key accumulators each), a polynomial exp, p.V of up to
 * 4 rows over value rows.
 */
#include "attn/attn_kernels.h" /* ATTN_HAVE_AVX512 */
#include "attn/attn_prefill_kernels.h"

#ifdef ATTN_HAVE_AVX512
#include "attn/attn_avx512.h"

_Static_assert(ATTN_PF_BK == 32, "two 16-lane vectors per key tile");

#define INLINE static inline __attribute__((always_inline))

/* R rows against a 32-key tile: 2R accumulators, each kt vector loaded
 * once for all rows. acc += q*k unfused, in order of e (attn_scores'
 * order: the scores equal the decode kernels' bit for bit; on Zen 4 the
 * multiplies and adds go to separate pipes, as fast as fused). */
INLINE void scores_rows(const float *const *q, const float *kt, int d, float scale, float *s, const int R)
{
    __m512 a[ATTN_PF_R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int e = 0; e < d; e++) {
        const __m512 k0 = _mm512_load_ps(kt + (size_t)e * ATTN_PF_BK), k1 = _mm512_load_ps(kt + (size_t)e * ATTN_PF_BK + 16);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 qe = _mm512_set1_ps(q[r][e]);
            a[r][0] = _mm512_add_ps(a[r][0], _mm512_mul_ps(qe, k0));
            a[r][1] = _mm512_add_ps(a[r][1], _mm512_mul_ps(qe, k1));
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(s + r * ATTN_PF_BK, _mm512_mul_ps(a[r][0], sc));
        _mm512_storeu_ps(s + r * ATTN_PF_BK + 16, _mm512_mul_ps(a[r][1], sc));
    }
}

static void scores_avx512(const float *const *q, int nr, const float *kt, int d, float scale, float *s)
{
    switch (nr) {
    case 1: scores_rows(q, kt, d, scale, s, 1); break;
    case 2: scores_rows(q, kt, d, scale, s, 2); break;
    case 3: scores_rows(q, kt, d, scale, s, 3); break;
    default: scores_rows(q, kt, d, scale, s, 4); break;
    }
}

/* max_ps(x, acc) is x > acc ? x : acc per lane (a NaN x yields acc) */
static float rowmax_avx512(const float *s, int nk, float m)
{
    __m512 acc = _mm512_set1_ps(m);
    for (int k = 0; k < nk; k += 16) {
        const __mmask16 mk = tail_mask(nk - k);
        acc = _mm512_mask_max_ps(acc, mk, _mm512_maskz_loadu_ps(mk, s + k), acc);
    }
    return _mm512_reduce_max_ps(acc);
}

static float expsum_avx512(float *s, int nk, float m)
{
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int k = 0; k < nk; k += 16) {
        const __mmask16 mk = tail_mask(nk - k);
        const __m512 p = _mm512_maskz_mov_ps(mk, exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + k), mv)));
        _mm512_mask_storeu_ps(s + k, mk, p);
        sum = _mm512_add_ps(sum, p);
    }
    return _mm512_reduce_add_ps(sum);
}

/* R output rows x 64 of d in registers (4R accumulators); each value
 * vector is loaded once for all rows. Per row: o * c, then one fma per key
 * in key order (pv_ref's order). */
INLINE void pv_rows(const float *p, const float *v, int nk, int d, const float *c, float *const *o, const int R)
{
    for (int e = 0; e < d; e += 64) {
        __m512 acc[ATTN_PF_R][4];
        __mmask16 mk[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) mk[u] = tail_mask(d - e - 16 * u);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                acc[r][u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[u], o[r] + e + 16 * u), _mm512_set1_ps(c[r]));
        for (int k = 0; k < nk; k++) {
            const float *row = v + (size_t)k * d + e;
            __m512 vr[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) vr[u] = _mm512_maskz_loadu_ps(mk[u], row + 16 * u);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512 pk = _mm512_set1_ps(p[r * ATTN_PF_BK + k]);
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) acc[r][u] = _mm512_fmadd_ps(pk, vr[u], acc[r][u]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(o[r] + e + 16 * u, mk[u], acc[r][u]);
    }
}

static void pv_avx512(const float *p, int nr, const float *v, int nk, int d, const float *c, float *const *o)
{
    switch (nr) {
    case 1: pv_rows(p, v, nk, d, c, o, 1); break;
    case 2: pv_rows(p, v, nk, d, c, o, 2); break;
    case 3: pv_rows(p, v, nk, d, c, o, 3); break;
    default: pv_rows(p, v, nk, d, c, o, 4); break;
    }
}

const attn_pf_ops attn_pf_ops_avx512 = { scores_avx512, rowmax_avx512, expsum_avx512, pv_avx512 };
#else
typedef int attn_prefill_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
