/* attn_prefill_avx512.c - the AVX-512 twins of the prefill attention row
 * primitives (attn_prefill.h): scores over a transposed key tile (two
 * 16-key accumulators), a polynomial exp, p.V over value rows.
 */
#include "attn/attn_prefill.h"

#ifdef ATTN_HAVE_AVX512
#include "attn/attn_avx512.h"

_Static_assert(ATTN_PF_BK == 32, "two 16-lane vectors per key tile");

static void scores_avx512(const float *q, const float *kt, int d, int nk, float scale, float *s)
{
    /* acc += q*k unfused, in order of e (attn_scores' order: the scores
     * equal the decode kernels' bit for bit) */
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int e = 0; e < d; e++) {
        const __m512 qe = _mm512_set1_ps(q[e]);
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(qe, _mm512_load_ps(kt + (size_t)e * ATTN_PF_BK)));
        a1 = _mm512_add_ps(a1, _mm512_mul_ps(qe, _mm512_load_ps(kt + (size_t)e * ATTN_PF_BK + 16)));
    }
    const __m512 sc = _mm512_set1_ps(scale);
    _mm512_mask_storeu_ps(s, tail_mask(nk), _mm512_mul_ps(a0, sc));
    _mm512_mask_storeu_ps(s + 16, tail_mask(nk - 16), _mm512_mul_ps(a1, sc));
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

static void pv_avx512(const float *p, const float *v, int nk, int d, float c, float *o)
{
    const __m512 cv = _mm512_set1_ps(c);
    for (int e = 0; e < d; e += 64) { /* 4 accumulators of the output row in registers */
        __m512 acc[4];
        __mmask16 mk[4];
        for (int u = 0; u < 4; u++) {
            mk[u] = tail_mask(d - e - 16 * u);
            acc[u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[u], o + e + 16 * u), cv);
        }
        for (int k = 0; k < nk; k++) {
            const __m512 pk = _mm512_set1_ps(p[k]);
            const float *row = v + (size_t)k * d + e;
            for (int u = 0; u < 4; u++)
                acc[u] = _mm512_fmadd_ps(pk, _mm512_maskz_loadu_ps(mk[u], row + 16 * u), acc[u]);
        }
        for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(o + e + 16 * u, mk[u], acc[u]);
    }
}

const attn_pf_ops attn_pf_ops_avx512 = { scores_avx512, expsum_avx512, pv_avx512 };
#else
typedef int attn_prefill_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
