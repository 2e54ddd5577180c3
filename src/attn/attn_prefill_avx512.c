/* attn_prefill_avx512.c - the AVX-512 twins of the prefill attention row
 * primitives (attn_prefill.h): scores over a transposed key tile (two
 * 16-key accumulators), a polynomial exp, p.V over value rows.
 */
#include "attn/attn_prefill.h"

#ifdef ATTN_HAVE_AVX512
#include <immintrin.h>

_Static_assert(ATTN_PF_BK == 32, "two 16-lane vectors per key tile");

/* exp(x) for x <= 0: the polynomial of attn_kernels_avx512.c's exp_neg
 * (x = n ln2 + t, degree-5 minimax e^t, 2^n by scalef), about 2e-7
 * relative to expf. */
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

static inline __mmask16 lanes(int left) { return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1); }

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
    _mm512_mask_storeu_ps(s, lanes(nk), _mm512_mul_ps(a0, sc));
    _mm512_mask_storeu_ps(s + 16, lanes(nk - 16), _mm512_mul_ps(a1, sc));
}

static float expsum_avx512(float *s, int nk, float m)
{
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int k = 0; k < nk; k += 16) {
        const __mmask16 mk = lanes(nk - k);
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
            mk[u] = lanes(d - e - 16 * u);
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
