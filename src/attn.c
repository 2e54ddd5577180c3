/* attn.c - the policy registry and the kernels every policy shares.
 *
 * Map of this file:
 *   registry            attn_policy_find / attn_policy_names
 *   half floats         attn_f16_to_f32
 *   top-k selection     attn_topk_indices (O(n): sampled threshold + quickselect)
 *   reference kernels   attn_*_ref: plain C, one position at a time
 *   AVX-512 kernels     attn_*_avx512: same signatures, same results to f32 rounding
 *   dispatch            the un-suffixed names pick the fastest twin compiled in
 *   group attention     attn_dense_group, attn_gather_group
 *
 * Decode attention is memory bound: the kernels read each K/V row once for
 * the whole GQA group (g query heads share one KV head), so g heads cost the
 * bytes of one. Scores for all rows are kept in scratch (g*n floats, which
 * stay in L2 for n up to ~32k) so softmax needs no second pass over K.
 */
#include "attn.h"

#include <math.h>
#include <string.h>

#ifdef ATTN_HAVE_AVX512
#include <immintrin.h>
#endif

/* ---- registry ------------------------------------------------------------ */

static const attn_policy *const registry[] = {
    &attn_policy_dense,  &attn_policy_sparq, &attn_policy_oracle,
    &attn_policy_flexgen, &attn_policy_h2o,  &attn_policy_streaming,
};
#define N_REGISTRY ((int)(sizeof registry / sizeof registry[0]))

const attn_policy *attn_policy_find(const char *name)
{
    if (!name) name = "dense";
    for (int i = 0; i < N_REGISTRY; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

const char *attn_policy_names(void) { return "dense, sparq, oracle, flexgen, h2o, streaming"; }

/* ---- half floats --------------------------------------------------------- */

float attn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);          /* inf / nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);  /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;                                        /* +-0 */
    } else {                                                /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float kv_elem(const void *base, int elem, int64_t at)
{
    return elem == KV_F16 ? attn_f16_to_f32(((const uint16_t *)base)[at])
                          : ((const float *)base)[at];
}

/* ---- top-k selection ----------------------------------------------------- */

/* NaN ranks last so a poisoned score can never displace a real one. */
static inline float topk_key(float v) { return v != v ? -INFINITY : v; }

/* Total order: larger value first, then lower index. */
static inline int ranks_before(const float *x, int32_t a, int32_t b)
{
    float xa = topk_key(x[a]), xb = topk_key(x[b]);
    return xa > xb || (xa == xb && a < b);
}

/* Min-heap (by ranks_before) of the k best seen so far; the fallback when
 * quickselect's pivots keep going wrong. O(m log k). */
static void heap_sift(const float *x, int32_t *h, int64_t k, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && ranks_before(x, h[w], h[l])) w = l;
        if (r < k && ranks_before(x, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static void select_top_heap(const float *x, int32_t *w, int64_t m, int64_t k)
{
    for (int64_t i = k / 2 - 1; i >= 0; i--) heap_sift(x, w, k, i);
    for (int64_t i = k; i < m; i++)
        if (ranks_before(x, w[i], w[0])) {
            int32_t t = w[0]; w[0] = w[i]; w[i] = t;
            heap_sift(x, w, k, 0);
        }
}

/* Reorders w[0..m) so that w[0..k) are the k best (0 < k < m).
 * Hoare quickselect, median-of-3 pivots; the order is total, so every
 * partition is clean and the result does not depend on input order. */
static void select_top(const float *x, int32_t *w, int64_t m, int64_t k)
{
    int64_t lo = 0, hi = m - 1, budget = 64;
    for (int64_t t = m; t > 1; t >>= 1) budget += 2;
    while (lo < hi) {
        if (--budget < 0) { /* adversarial input: finish in O(n log k) */
            select_top_heap(x, w + lo, hi - lo + 1, k - lo);
            return;
        }
        int64_t mid = lo + (hi - lo) / 2;
        if (ranks_before(x, w[mid], w[lo])) { int32_t t = w[mid]; w[mid] = w[lo]; w[lo] = t; }
        if (ranks_before(x, w[hi], w[lo])) { int32_t t = w[hi]; w[hi] = w[lo]; w[lo] = t; }
        if (ranks_before(x, w[hi], w[mid])) { int32_t t = w[hi]; w[hi] = w[mid]; w[mid] = t; }
        const int32_t p = w[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (ranks_before(x, w[i], p)) i++;
            while (ranks_before(x, p, w[j])) j--;
            if (i <= j) {
                int32_t t = w[i]; w[i] = w[j]; w[j] = t;
                i++; j--;
            }
        }
        /* [lo..j] rank before or equal p, [i..hi] after or equal. */
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

void attn_topk_indices(const float *x, int64_t n, int64_t k, int32_t *idx, int32_t *work)
{
    if (k <= 0) return;
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        return;
    }
    int64_t m = n;
    /* Long inputs: a threshold from an evenly spaced sample of 1024 values
     * cuts the candidates to about 2k + n/64 in one sequential pass. */
    enum { SAMPLE = 1024 };
    if (n > 8 * SAMPLE && k <= n / 32) {
        for (int64_t j = 0; j < SAMPLE; j++) work[j] = (int32_t)(j * n / SAMPLE);
        int64_t ks = 2 * ((k * SAMPLE + n - 1) / n) + 16;
        select_top(x, work, SAMPLE, ks);
        int64_t best = 0; /* the ks-th best of the sample is the threshold */
        for (int64_t j = 1; j < ks; j++)
            if (ranks_before(x, work[best], work[j])) best = j;
        const float t = topk_key(x[work[best]]);
        if (t > -INFINITY) { /* (NaN ranks as -inf but never passes the filter) */
            const int64_t c = attn_topk_filter(x, n, t, work);
            /* >= k values are >= t, so the k-th best is >= t: all top k are in */
            m = c >= k ? c : n;
        }
    }
    if (m == n)
        for (int64_t i = 0; i < n; i++) work[i] = (int32_t)i;
    if (k < m) select_top(x, work, m, k);
    memcpy(idx, work, (size_t)k * sizeof *idx);
}

/* ---- reference kernels --------------------------------------------------- */

int64_t attn_topk_filter_ref(const float *x, int64_t n, float t, int32_t *idx)
{
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] >= t) idx[c++] = (int32_t)i; /* NaN compares false: never kept */
    return c;
}

void attn_scores_ref(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                     int64_t n, float *s)
{
    const int d = kv->d;
    const float scale = 1.0f / sqrtf((float)d);
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = rows ? rows[i] : i;
        for (int h = 0; h < g; h++) {
            float acc = 0;
            for (int j = 0; j < d; j++) acc += q[h * d + j] * kv_elem(kv->K, kv->elem, row * d + j);
            s[h * n + i] = acc * scale;
        }
    }
}

void attn_softmax_ref(float *s, int g, int64_t n)
{
    for (int h = 0; h < g; h++) {
        float *x = s + h * n, mx = -INFINITY;
        double sum = 0; /* one running f32 sum over 32k terms would drift ~1e-5 */
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int64_t i = 0; i < n; i++) sum += (x[i] = expf(x[i] - mx));
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) x[i] *= inv;
    }
}

void attn_weighted_sum_ref(const attn_kv_view *kv, const float *w, int g, const int32_t *rows,
                           int64_t n, float *out)
{
    const int d = kv->d;
    memset(out, 0, (size_t)g * d * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = rows ? rows[i] : i;
        for (int h = 0; h < g; h++) {
            const float wi = w[h * n + i];
            for (int j = 0; j < d; j++)
                out[h * d + j] += wi * kv_elem(kv->V, kv->elem, row * d + j);
        }
    }
}

void attn_kt_logits_ref(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                        int g, int64_t n, float *s)
{
    memset(s, 0, (size_t)g * n * sizeof *s);
    for (int c = 0; c < r; c++) {
        const int64_t base = (int64_t)comp[c] * kv->kt_stride;
        for (int64_t i = 0; i < n; i++) {
            const float kt = kv_elem(kv->KT, kv->elem, base + i);
            for (int h = 0; h < g; h++) s[h * n + i] += qs[h * r + c] * kt;
        }
    }
}

/* ---- AVX-512 kernels ----------------------------------------------------- */
#ifdef ATTN_HAVE_AVX512

/* The tile functions take their shape (heads per tile, masked or not, f16)
 * as arguments that are constants at every call site; forced inlining and
 * unrolling turn their small arrays of vectors into registers. */
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* 16 elements of a K/V row from `p` (f16 or f32), lanes outside m zero.
 * `f16` is a compile-time constant at every call site (the kernels below
 * are instantiated once per element type), so the branch folds away. */
static ALWAYS_INLINE __m512 ld16(const void *p, int64_t at, int f16, __mmask16 m)
{
    if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + at));
    return _mm512_maskz_loadu_ps(m, (const float *)p + at);
}

static ALWAYS_INLINE __m512 ld16_full(const void *p, int64_t at, int f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at)));
    return _mm512_loadu_ps((const float *)p + at);
}

static inline __mmask16 tail_mask(int64_t left)
{
    return left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
}

/* exp(x) for x <= 88.7: 2^n * poly(r), r = x - n ln2 in [-ln2/2, ln2/2];
 * degree-7 Taylor (truncation 5e-9 relative), scalef applies 2^n with
 * correct gradual underflow. About 2 ulp against expf. */
static inline __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-120.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Lane j of the result = horizontal sum of v[j], for 16 vectors: a
 * transpose-and-add tree (15 adds) instead of 16 separate reductions. Each
 * level adds pairs of vectors after interleaving them, so every 128-bit
 * block carries partial sums of twice as many rows as before. */
static inline __m512 hsum16x16(const __m512 *v)
{
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

/* Scores of HB (<= 4) heads h0.. over one block of <= 16 rows. Rows go in
 * fours: 4 rows x HB heads of accumulators plus HB query chunks stay in
 * registers, so each q chunk load serves 4 rows. Lanes past nb reuse a valid
 * row and are masked off at the store. */
static ALWAYS_INLINE void scores_block(const attn_kv_view *kv, const float *q, int h0,
                                       const int HB, const int32_t *rows, int64_t i0, int nb,
                                       float scale, float *so, int64_t ss, const int f16)
{
    enum { R = 4 }; /* rows sharing each q chunk: 4 x 4 accumulators + 4 q */
    const int d = kv->d, dfull = d & ~15;
    const __mmask16 mt = tail_mask(d - dfull);
    const float *qh = q + (size_t)h0 * d;
    __m512 t[4][16];
    for (int r0 = 0; r0 < 16; r0 += R) {
        int64_t at[R];
        UNROLL for (int u = 0; u < R; u++) {
            const int64_t rr = r0 + u < nb ? i0 + r0 + u : i0;
            at[u] = (rows ? rows[rr] : rr) * d;
        }
        __m512 a[R][4];
        UNROLL for (int u = 0; u < R; u++)
            UNROLL for (int hh = 0; hh < HB; hh++) a[u][hh] = _mm512_setzero_ps();
        int j = 0;
        for (; j < dfull; j += 16) {
            __m512 qv[4];
            /* the empty asm pins each q chunk in a register: otherwise gcc folds
             * the load into every FMA, R loads per chunk instead of one */
            UNROLL for (int hh = 0; hh < HB; hh++) {
                qv[hh] = _mm512_loadu_ps(qh + hh * d + j);
                __asm__("" : "+v"(qv[hh]));
            }
            UNROLL for (int u = 0; u < R; u++) {
                const __m512 k = ld16_full(kv->K, at[u] + j, f16);
                UNROLL for (int hh = 0; hh < HB; hh++)
                    a[u][hh] = _mm512_fmadd_ps(qv[hh], k, a[u][hh]);
            }
        }
        if (j < d) {
            __m512 qv[4];
            UNROLL for (int hh = 0; hh < HB; hh++)
                qv[hh] = _mm512_maskz_loadu_ps(mt, qh + hh * d + j);
            UNROLL for (int u = 0; u < R; u++) {
                const __m512 k = ld16(kv->K, at[u] + j, f16, mt);
                UNROLL for (int hh = 0; hh < HB; hh++)
                    a[u][hh] = _mm512_fmadd_ps(qv[hh], k, a[u][hh]);
            }
        }
        UNROLL for (int u = 0; u < R; u++)
            UNROLL for (int hh = 0; hh < HB; hh++) t[hh][r0 + u] = a[u][hh];
    }
    const __mmask16 m = tail_mask(nb);
    UNROLL for (int hh = 0; hh < HB; hh++)
        _mm512_mask_storeu_ps(so + (h0 + hh) * ss, m,
                              _mm512_mul_ps(hsum16x16(t[hh]), _mm512_set1_ps(scale)));
}

/* Scores of all g heads for rows [i0, i0+nb), nb <= 16, written to
 * so[h*ss + (i - i0)]. */
static ALWAYS_INLINE void scores_rows16(const attn_kv_view *kv, const float *q, int g,
                                        const int32_t *rows, int64_t i0, int nb, float scale,
                                        float *so, int64_t ss, const int f16)
{
    int h0 = 0;
    for (; h0 + 4 <= g; h0 += 4) scores_block(kv, q, h0, 4, rows, i0, nb, scale, so, ss, f16);
    switch (g - h0) {
    case 3: scores_block(kv, q, h0, 3, rows, i0, nb, scale, so, ss, f16); break;
    case 2: scores_block(kv, q, h0, 2, rows, i0, nb, scale, so, ss, f16); break;
    case 1: scores_block(kv, q, h0, 1, rows, i0, nb, scale, so, ss, f16); break;
    default: break;
    }
}

static ALWAYS_INLINE void prefetch_rows(const void *base, const int32_t *rows, int64_t from,
                                        int64_t to, size_t row_bytes)
{
    for (int64_t i = from; i < to; i++)
        for (size_t b = 0; b < row_bytes; b += 64)
            _mm_prefetch((const char *)base + (size_t)rows[i] * row_bytes + b, _MM_HINT_T0);
}

static ALWAYS_INLINE void scores_avx512(const attn_kv_view *kv, const float *q, int g,
                                        const int32_t *rows, int64_t n, float *s, const int f16)
{
    const float scale = 1.0f / sqrtf((float)kv->d);
    const size_t row_bytes = (size_t)kv->d * (f16 ? 2 : 4);
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
        const int nb = n - i0 < 16 ? (int)(n - i0) : 16;
        if (rows) /* gathered rows: start the next block's loads early */
            prefetch_rows(kv->K, rows, i0 + 16, i0 + 32 < n ? i0 + 32 : n, row_bytes);
        scores_rows16(kv, q, g, rows, i0, nb, scale, s + i0, n, f16);
    }
}

void attn_scores_avx512(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                        int64_t n, float *s)
{
    if (kv->elem == KV_F16) scores_avx512(kv, q, g, rows, n, s, 1);
    else scores_avx512(kv, q, g, rows, n, s, 0);
}

int64_t attn_topk_filter_avx512(const float *x, int64_t n, float t, int32_t *idx)
{
    const __m512 vt = _mm512_set1_ps(t);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i iv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16, iv = _mm512_add_epi32(iv, step)) {
        const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vt, _CMP_GE_OQ);
        if (!m) continue; /* most blocks hold no candidate */
        /* compress in a register, then a masked store: Zen 4 microcodes
         * the compress-to-memory form */
        const int k = __builtin_popcount(m);
        _mm512_mask_storeu_epi32(idx + c, (__mmask16)((1u << k) - 1),
                                 _mm512_maskz_compress_epi32(m, iv));
        c += k;
    }
    for (; i < n; i++)
        if (x[i] >= t) idx[c++] = (int32_t)i;
    return c;
}

void attn_softmax_avx512(float *s, int g, int64_t n)
{
    for (int h = 0; h < g; h++) {
        float *x = s + h * n;
        __m512 vmx = _mm512_set1_ps(-INFINITY);
        for (int64_t i = 0; i < n; i += 16)
            vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
                                                          tail_mask(n - i), x + i));
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = tail_mask(n - i);
            const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mx));
            _mm512_mask_storeu_ps(x + i, m, e);
            vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
        }
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = tail_mask(n - i);
            _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
        }
    }
}

/* out[h0..h0+HB)[j0..j0+64) += sum over rows i in [i0, i0+nb) of
 * wb[h*ws + i - i0] * V[i]. The 64 output columns of HB <= 4 heads are 16
 * accumulators held in registers; `masked` tiles (the last, when
 * d % 64 != 0) load with lane masks. */
static ALWAYS_INLINE void wsum_tile(const attn_kv_view *kv, const float *wb, int64_t ws, int h0,
                                    const int HB, const int masked, const int32_t *rows,
                                    int64_t i0, int64_t nb, int j0, float *out, const int f16)
{
    const int d = kv->d;
    __mmask16 mk[4];
    UNROLL for (int c = 0; c < 4; c++) {
        const int left = d - j0 - 16 * c;
        mk[c] = !masked ? 0xffff : left <= 0 ? 0 : tail_mask(left);
    }
    float *o = out + (size_t)h0 * d + j0;
    const float *wh = wb + h0 * ws - i0;
    __m512 acc[4][4];
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int c = 0; c < 4; c++)
            acc[hh][c] = _mm512_maskz_loadu_ps(mk[c], o + hh * d + 16 * c);
    for (int64_t i = i0; i < i0 + nb; i++) {
        const int64_t at = (rows ? rows[i] : i) * d + j0;
        __m512 v[4];
        UNROLL for (int c = 0; c < 4; c++)
            v[c] = masked ? ld16(kv->V, at + 16 * c, f16, mk[c])
                          : ld16_full(kv->V, at + 16 * c, f16);
        UNROLL for (int hh = 0; hh < HB; hh++) {
            const __m512 wi = _mm512_set1_ps(wh[hh * ws + i]);
            UNROLL for (int c = 0; c < 4; c++) acc[hh][c] = _mm512_fmadd_ps(wi, v[c], acc[hh][c]);
        }
    }
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(o + hh * d + 16 * c, mk[c], acc[hh][c]);
}

static ALWAYS_INLINE void wsum_tiles(const attn_kv_view *kv, const float *wb, int64_t ws, int h0,
                                     const int HB, const int32_t *rows, int64_t i0, int64_t nb,
                                     float *out, const int f16)
{
    int j0 = 0;
    for (; j0 + 64 <= kv->d; j0 += 64)
        wsum_tile(kv, wb, ws, h0, HB, 0, rows, i0, nb, j0, out, f16);
    if (j0 < kv->d) wsum_tile(kv, wb, ws, h0, HB, 1, rows, i0, nb, j0, out, f16);
}

/* out[h] += sum over rows [i0, i0+nb) of wb[h*ws + i - i0] * V[i], all g heads. */
static ALWAYS_INLINE void wsum_rows(const attn_kv_view *kv, const float *wb, int64_t ws, int g,
                                    const int32_t *rows, int64_t i0, int64_t nb, float *out,
                                    const int f16)
{
    int h0 = 0;
    for (; h0 + 4 <= g; h0 += 4) wsum_tiles(kv, wb, ws, h0, 4, rows, i0, nb, out, f16);
    switch (g - h0) {
    case 3: wsum_tiles(kv, wb, ws, h0, 3, rows, i0, nb, out, f16); break;
    case 2: wsum_tiles(kv, wb, ws, h0, 2, rows, i0, nb, out, f16); break;
    case 1: wsum_tiles(kv, wb, ws, h0, 1, rows, i0, nb, out, f16); break;
    default: break;
    }
}

static ALWAYS_INLINE void weighted_sum_avx512(const attn_kv_view *kv, const float *w, int g,
                                              const int32_t *rows, int64_t n, float *out,
                                              const int f16)
{
    const int d = kv->d;
    const size_t row_bytes = (size_t)d * (f16 ? 2 : 4);
    enum { BLOCK = 32 }; /* rows per block: their V stays in L1 across tiles */
    memset(out, 0, (size_t)g * d * sizeof *out);
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
        const int64_t nb = n - i0 < BLOCK ? n - i0 : BLOCK;
        if (rows)
            prefetch_rows(kv->V, rows, i0 + BLOCK, i0 + 2 * BLOCK < n ? i0 + 2 * BLOCK : n,
                          row_bytes);
        wsum_rows(kv, w + i0, n, g, rows, i0, nb, out, f16);
    }
}

void attn_weighted_sum_avx512(const attn_kv_view *kv, const float *w, int g,
                              const int32_t *rows, int64_t n, float *out)
{
    if (kv->elem == KV_F16) weighted_sum_avx512(kv, w, g, rows, n, out, 1);
    else weighted_sum_avx512(kv, w, g, rows, n, out, 0);
}

/* Two passes (all scores, then all weighted values) rather than one with an
 * online softmax: a fused version measured 2x slower once K and V came
 * from memory rather than L2, while each pass alone streams at bandwidth. */
void attn_gather_group_avx512(const attn_kv_view *kv, const float *q, int g,
                              const int32_t *sel, int64_t n_sel, float *out, float *scratch)
{
    if (n_sel <= 0) {
        memset(out, 0, (size_t)g * kv->d * sizeof *out);
        return;
    }
    attn_scores_avx512(kv, q, g, sel, n_sel, scratch);
    attn_softmax_avx512(scratch, g, n_sel);
    attn_weighted_sum_avx512(kv, scratch, g, sel, n_sel, out);
}

/* Logits of HB <= 4 heads over positions [i0, i0+nb) (nb <= KT_BLOCK),
 * accumulated in place in s, which stays in L1 for the block. The r rows of
 * K^T go four at a time, each a contiguous run of nb positions. Why not all
 * r rows per 64-position tile: K^T rows are kt_stride apart, usually a
 * power of two, so r rows at the same offset share one L1/L2 set and
 * evict each other; four at a time fit the ways. `prefetch`: request the
 * runs KT_AHEAD groups on (a group takes about as long to compute as its
 * 4 KB take to arrive, so one group ahead is too late). */
enum { KT_BLOCK = 512, KT_AHEAD = 4 };

static ALWAYS_INLINE void kt_block(const attn_kv_view *kv, const float *qs, const int32_t *comp,
                                   int r, int h0, const int HB, int64_t i0, int64_t nb,
                                   int64_t n, float *s, int prefetch, const int f16)
{
    const size_t es = f16 ? 2 : 4;
    const char *kt = (const char *)kv->KT;
    float *o = s + (size_t)h0 * n + i0;
    for (int c0 = 0; c0 < r; c0 += 4) {
        const int cr = r - c0 < 4 ? r - c0 : 4;
        const char *p[4];
        __m512 qv[4][4];
        UNROLL for (int u = 0; u < 4; u++) {
            /* a short last group repeats a row with a zero weight */
            const int c = u < cr ? c0 + u : c0;
            p[u] = kt + ((size_t)comp[c] * (size_t)kv->kt_stride + (size_t)i0) * es;
            UNROLL for (int hh = 0; hh < HB; hh++)
                qv[hh][u] = u < cr ? _mm512_set1_ps(qs[(h0 + hh) * r + c]) : _mm512_setzero_ps();
        }
        if (prefetch) { /* KT_AHEAD groups on, possibly in the next block */
            int64_t pi0 = i0;
            int pc = c0 + 4 * KT_AHEAD;
            while (pc >= r) { pc -= (r + 3) & ~3; pi0 += KT_BLOCK; }
            if (pi0 < n) {
                const int64_t pnb = n - pi0 < KT_BLOCK ? n - pi0 : KT_BLOCK;
                for (int u = 0; u < 4 && pc + u < r; u++) {
                    const size_t at = (size_t)comp[pc + u] * (size_t)kv->kt_stride + (size_t)pi0;
                    const char *nx = kt + at * es;
                    for (size_t bo = 0; bo < (size_t)pnb * es; bo += 64)
                        _mm_prefetch(nx + bo, _MM_HINT_T0);
                }
            }
        }
        int64_t j = 0;
        for (; j + 16 <= nb; j += 16) {
            __m512 v[4];
            UNROLL for (int u = 0; u < 4; u++) v[u] = ld16_full(p[u], j, f16);
            UNROLL for (int hh = 0; hh < HB; hh++) {
                __m512 acc = c0 ? _mm512_loadu_ps(o + hh * n + j) : _mm512_setzero_ps();
                UNROLL for (int u = 0; u < 4; u++) acc = _mm512_fmadd_ps(qv[hh][u], v[u], acc);
                _mm512_storeu_ps(o + hh * n + j, acc);
            }
        }
        if (j < nb) {
            const __mmask16 m = tail_mask(nb - j);
            __m512 v[4];
            UNROLL for (int u = 0; u < 4; u++) v[u] = ld16(p[u], j, f16, m);
            UNROLL for (int hh = 0; hh < HB; hh++) {
                __m512 acc = c0 ? _mm512_maskz_loadu_ps(m, o + hh * n + j) : _mm512_setzero_ps();
                UNROLL for (int u = 0; u < 4; u++) acc = _mm512_fmadd_ps(qv[hh][u], v[u], acc);
                _mm512_mask_storeu_ps(o + hh * n + j, m, acc);
            }
        }
    }
}

static ALWAYS_INLINE void kt_logits_avx512(const attn_kv_view *kv, const float *qs,
                                           const int32_t *comp, int r, int g, int64_t n,
                                           float *s, const int f16)
{
    for (int64_t i0 = 0; i0 < n; i0 += KT_BLOCK) {
        const int64_t nb = n - i0 < KT_BLOCK ? n - i0 : KT_BLOCK;
        /* head groups after the first find the block's rows in L2 */
        int h0 = 0;
        for (; h0 + 4 <= g; h0 += 4) kt_block(kv, qs, comp, r, h0, 4, i0, nb, n, s, !h0, f16);
        switch (g - h0) {
        case 3: kt_block(kv, qs, comp, r, h0, 3, i0, nb, n, s, !h0, f16); break;
        case 2: kt_block(kv, qs, comp, r, h0, 2, i0, nb, n, s, !h0, f16); break;
        case 1: kt_block(kv, qs, comp, r, h0, 1, i0, nb, n, s, !h0, f16); break;
        default: break;
        }
    }
}

void attn_kt_logits_avx512(const attn_kv_view *kv, const float *qs, const int32_t *comp,
                           int r, int g, int64_t n, float *s)
{
    if (kv->elem == KV_F16) kt_logits_avx512(kv, qs, comp, r, g, n, s, 1);
    else kt_logits_avx512(kv, qs, comp, r, g, n, s, 0);
}

#define ATTN_BEST(fn) fn##_avx512
#else
#define ATTN_BEST(fn) fn##_ref
#endif

/* ---- dispatch ------------------------------------------------------------ */

int64_t attn_topk_filter(const float *x, int64_t n, float t, int32_t *idx)
{
    return ATTN_BEST(attn_topk_filter)(x, n, t, idx);
}

void attn_scores(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                 int64_t n, float *s)
{
    ATTN_BEST(attn_scores)(kv, q, g, rows, n, s);
}

void attn_softmax(float *s, int g, int64_t n) { ATTN_BEST(attn_softmax)(s, g, n); }

void attn_weighted_sum(const attn_kv_view *kv, const float *w, int g, const int32_t *rows,
                       int64_t n, float *out)
{
    ATTN_BEST(attn_weighted_sum)(kv, w, g, rows, n, out);
}

void attn_kt_logits(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                    int g, int64_t n, float *s)
{
    ATTN_BEST(attn_kt_logits)(kv, qs, comp, r, g, n, s);
}

/* ---- group attention ------------------------------------------------------ */

void attn_dense_group(const attn_kv_view *kv, const float *q, int g, float *out, float *scratch)
{
    attn_gather_group(kv, q, g, NULL, kv->S, out, scratch);
}

void attn_gather_group_ref(const attn_kv_view *kv, const float *q, int g,
                           const int32_t *sel, int64_t n_sel, float *out, float *scratch)
{
    if (n_sel <= 0) {
        memset(out, 0, (size_t)g * kv->d * sizeof *out);
        return;
    }
    attn_scores_ref(kv, q, g, sel, n_sel, scratch);
    attn_softmax_ref(scratch, g, n_sel);
    attn_weighted_sum_ref(kv, scratch, g, sel, n_sel, out);
}

void attn_gather_group(const attn_kv_view *kv, const float *q, int g,
                       const int32_t *sel, int64_t n_sel, float *out, float *scratch)
{
    ATTN_BEST(attn_gather_group)(kv, q, g, sel, n_sel, out, scratch);
}

void attn_sum_heads(const float *x, int g, int64_t n, float *out)
{
    memcpy(out, x, (size_t)n * sizeof *out);
    for (int h = 1; h < g; h++) /* head-major so the loop vectorises */
        for (int64_t i = 0; i < n; i++) out[i] += x[h * n + i];
}

/* ---- exact top-k (oracle, FlexGen) ---------------------------------------- */

size_t attn_exact_topk_scratch(int64_t S, int64_t k, int g)
{
    const size_t n = (size_t)S, kk = (size_t)(k < S ? k : S);
    const size_t nf = attn_pad16((size_t)g * n) + attn_pad16(n) + attn_pad16((size_t)g * kk) +
                      attn_pad16((size_t)g);
    const size_t ni = attn_pad16(n) + attn_pad16(kk);
    return nf > ni ? nf : ni;
}

void attn_exact_topk_group(const attn_kv_view *kv, const float *q, int g, int64_t k, int renorm,
                           float *out, attn_scratch *scratch, attn_trace *tr)
{
    const int64_t S = kv->S, kk = k < S ? k : S;
    float *P = scratch->f;                            /* [g][S] exact softmax    */
    float *score = P + attn_pad16((size_t)g * S);     /* [S] group sum           */
    float *w = score + attn_pad16((size_t)S);         /* [g][kk] kept weights    */
    float *mass = w + attn_pad16((size_t)g * kk);     /* [g]                     */
    int32_t *work = scratch->i, *sel = work + attn_pad16((size_t)S);

    attn_scores(kv, q, g, NULL, S, P);
    attn_softmax(P, g, S);
    attn_sum_heads(P, g, S, score);
    attn_topk_indices(score, S, kk, sel, work);
    for (int h = 0; h < g; h++) {
        float m = 0;
        for (int64_t j = 0; j < kk; j++) m += (w[h * kk + j] = P[h * S + sel[j]]);
        mass[h] = m;
        if (renorm) { /* softmax over the kept set = the kept weights / their mass */
            const float inv = 1.0f / m;
            for (int64_t j = 0; j < kk; j++) w[h * kk + j] *= inv;
        }
    }
    attn_weighted_sum(kv, w, g, sel, kk, out);
    if (tr) {
        if (tr->sel) memcpy(tr->sel, sel, (size_t)kk * sizeof *sel);
        tr->n_sel = kk;
        tr->n_i1 = 0;
        if (tr->alpha)
            for (int h = 0; h < g; h++) tr->alpha[h] = renorm ? 1.0f : mass[h];
    }
}
