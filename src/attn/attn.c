/* attn.c - the pieces every policy shares, below the policies and their
 * registry (attn_registry.c), so no policy calls back into the file that
 * lists it.
 *
 * Map of this file:
 *   errors              attn_fail
 *   top-k selection     attn_topk_indices (O(n): sampled threshold, exact
 *                       threshold by quickselect on order keys)
 *   dispatch            the un-suffixed kernel names call the twin of the
 *                       level chosen at run time (attn_kernels tables,
 *                       attn_kernels.h: attn_kernels_ref.c, _avx2.c, ...)
 *   group attention     attn_dense_group, attn_gather_group
 *   exact top-k         attn_exact_topk_group (oracle, FlexGen)
 *
 * Decode attention is memory bound: the kernels read each K/V row once for
 * the whole GQA group (g query heads share one KV head), so g heads cost the
 * bytes of one. Scores for all rows are kept in scratch (g*n floats, which
 * stay in L2 for n up to ~32k) so softmax needs no second pass over K.
 */
#include "attn/attn.h"
#include "util/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int attn_fail(attn_scratch *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (s) err_setv(s->err, s->err_size, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- top-k selection ----------------------------------------------------- */

static inline float key_value(uint32_t k)
{
    const uint32_t b = k & 0x80000000u ? k & 0x7fffffffu : ~k;
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* idx[0..k) = the positions pos[j] (increasing; NULL: j itself) whose keys
 * beat the k-th key t, then those equal to t in increasing order until k:
 * ties go to the lower index. */
static void topk_emit(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t,
                      int64_t k, int32_t *idx)
{
    int64_t o = attn_topk_above(key, pos, m, t, idx);
    for (int64_t j = 0; j < m && o < k; j++)
        if (key[j] == t) idx[o++] = pos ? pos[j] : (int32_t)j;
}

/* The k-th largest of key[0..m) (1 <= k <= m) by quickselect: each pass
 * splits the keys around a pivot (attn_topk_partition) and keeps the side
 * holding the answer, about half, so the passes read ~2-3 m keys in all
 * where bisection on the answer reads 32 m. The pivot is the median of
 * three spread keys; inputs that defeat it (each pass keeping nearly all)
 * are bounded: after 64 passes the rest is bisected. buf0, buf1: m each. */
enum { SELECT_PASSES = 64, SELECT_SMALL = 16 };

static uint32_t median3(uint32_t a, uint32_t b, uint32_t c)
{
    if (a > b) { const uint32_t t = a; a = b; b = t; }
    return c <= a ? a : c >= b ? b : c;
}

uint32_t attn_topk_kth_select(const uint32_t *key, int64_t m, int64_t k, uint32_t *buf0,
                              uint32_t *buf1)
{
    const uint32_t *a = key;
    uint32_t *out = buf0, *other = buf1;
    for (int pass = 0; m > SELECT_SMALL; pass++) {
        if (pass == SELECT_PASSES) return attn_topk_kth_key(a, m, k);
        const uint32_t p = median3(a[m / 4], a[m / 2], a[m - 1 - m / 4]);
        int64_t n_lo;
        const int64_t n_hi = attn_topk_partition(a, m, p, out, &n_lo), n_eq = m - n_hi - n_lo;
        if (k <= n_hi) {
            a = out;
            m = n_hi;
        } else if (k <= n_hi + n_eq) {
            return p;
        } else {
            k -= n_hi + n_eq;
            a = out + (m - n_lo);
            m = n_lo;
        }
        uint32_t *t = out;
        out = other;
        other = t;
    }
    /* a few keys: the one with fewer than k above it and k or more at or above */
    for (int64_t i = 0; i < m; i++) {
        int64_t gt = 0, ge = 0;
        for (int64_t j = 0; j < m; j++) {
            gt += a[j] > a[i];
            ge += a[j] >= a[i];
        }
        if (gt < k && k <= ge) return a[i];
    }
    return a[0]; /* unreachable for 1 <= k <= m */
}

void attn_topk_indices(const float *x, int64_t n, int64_t k, int32_t *idx, int32_t *work)
{
    if (k <= 0) return;
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        return;
    }
    uint32_t *key = (uint32_t *)work; /* int32 storage, read as its unsigned twin */
    /* Long inputs: a threshold from an evenly spaced sample of 1024 values
     * cuts the candidates to about 2k + n/64 in one sequential pass, which
     * writes their positions to work[0..c) and their keys to work[n..n+c);
     * the exact k-th key is then found among them alone (a selection over
     * all n keys costs several passes). Up to k = n/8 (SparQ at a 1/8 transfer
     * ratio keeps k = S/16) the candidates stay under half of n, which
     * leaves work[c..2c) and work[n+c..n+2c) to the selection. */
    enum { SAMPLE = 1024 };
    if (n > 2 * SAMPLE && k <= n / 8) {
        for (int64_t j = 0; j < SAMPLE; j++) key[j] = attn_topk_key(x[j * n / SAMPLE]);
        const int64_t ks = 2 * ((k * SAMPLE + n - 1) / n) + 16;
        const float t = key_value(attn_topk_kth_select(key, SAMPLE, ks, key + SAMPLE, key + 2 * SAMPLE));
        if (t > -INFINITY) { /* (NaN ranks as -inf but never passes the filter) */
            uint32_t *ck = key + n;
            const int64_t c = attn_topk_filter(x, n, t, work, ck);
            /* >= k values are >= t, so the k-th best is >= t: all top k are in */
            if (c >= k && 2 * c <= n) {
                const uint32_t kth = attn_topk_kth_select(ck, c, k, key + c, ck + c);
                topk_emit(ck, work, c, kth, k, idx);
                return;
            }
        }
    }
    for (int64_t i = 0; i < n; i++) key[i] = attn_topk_key(x[i]);
    /* Short inputs (SparQ's r of d query components, every step of every
     * head): quickselect in buffers on the stack, 0.09 us at d = 64 where
     * bisection's 32 passes took 0.41 (Zen 5) */
    enum { STACK_SELECT = 512 };
    uint32_t kth;
    if (n <= STACK_SELECT) {
        uint32_t b0[STACK_SELECT], b1[STACK_SELECT];
        kth = attn_topk_kth_select(key, n, k, b0, b1);
    } else {
        kth = attn_topk_kth_key(key, n, k);
    }
    topk_emit(key, NULL, n, kth, k, idx);
}

/* ---- dispatch ------------------------------------------------------------ */

/* ARM64's two NEON tables are attn_kernels_neon.c's two builds. */
static const attn_kernels *const tables[CPU_LEVELS] = {
    [CPU_REF] = &attn_kernels_ref,
#if defined(__x86_64__)
    [CPU_AVX2] = &attn_kernels_avx2,
    [CPU_AVX512] = &attn_kernels_avx512,
#else
    [CPU_AVX2] = &attn_kernels_ref,
    [CPU_AVX512] = &attn_kernels_ref,
#endif
#if defined(__aarch64__)
    [CPU_NEON] = &attn_kernels_neon,
    [CPU_NEON_DOTPROD] = &attn_kernels_neondp,
#else
    [CPU_NEON] = &attn_kernels_ref,
    [CPU_NEON_DOTPROD] = &attn_kernels_ref,
#endif
};

const attn_kernels *attn_kernels_at(cpu_level level) { return tables[level]; }

static inline const attn_kernels *K(void) { return tables[cpu_level_get()]; }

int64_t attn_topk_filter(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key)
{
    return K()->topk_filter(x, n, t, idx, key);
}

void attn_scores(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                 int64_t n, float *s)
{
    K()->scores(kv, q, g, rows, n, s);
}

void attn_softmax(float *s, int g, int64_t n) { K()->softmax(s, g, n); }

void attn_weighted_sum(const attn_kv_view *kv, const float *w, int g, const int32_t *rows,
                       int64_t n, float *out)
{
    K()->weighted_sum(kv, w, g, rows, n, out);
}

void attn_kt_logits(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                    int g, int64_t n, float *s)
{
    K()->kt_logits(kv, qs, comp, r, g, n, s);
}

void attn_softmax_weighted_sum(const attn_kv_view *kv, const float *s, int g,
                               const int32_t *rows, int64_t n, float *out, float *lse)
{
    K()->softmax_weighted_sum(kv, s, g, rows, n, out, lse);
}

void attn_kt_exp(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                 int64_t n, float *e, float *scale, float *lsum)
{
    K()->kt_exp(kv, qs, comp, r, g, n, e, scale, lsum);
}

void attn_scaled_head_sum(const float *e, const float *scale, int g, int64_t n, int64_t m,
                          float *out)
{
    K()->scaled_head_sum(e, scale, g, n, m, out);
}

uint32_t attn_topk_kth_key(const uint32_t *key, int64_t m, int64_t k)
{
    return K()->topk_kth_key(key, m, k);
}

int64_t attn_topk_above(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t, int32_t *idx)
{
    return K()->topk_above(key, pos, m, t, idx);
}

int64_t attn_topk_partition(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out, int64_t *n_lo)
{
    return K()->topk_partition(key, m, p, out, n_lo);
}

/* ---- group attention ------------------------------------------------------ */

void attn_dense_part(const attn_kv_view *kv, const float *q, int g, int part, float *out,
                     float *lse, float *scratch)
{
    const int parts = attn_dense_parts(kv->S);
    const int64_t a = (int64_t)part * ATTN_PART, b = part == parts - 1 ? kv->S : a + ATTN_PART;
    const size_t rb = attn_kv_row_bytes(kv->elem, kv->d);
    attn_kv_view v = *kv; /* positions [a, b); the meter stays the caller's */
    v.S = b - a;
    v.K = (const uint8_t *)kv->K + (size_t)a * rb;
    v.V = (const uint8_t *)kv->V + (size_t)a * rb;
    v.KT = NULL;
    v.v_sum = NULL;
    attn_scores(&v, q, g, NULL, v.S, scratch);
    attn_softmax_weighted_sum(&v, scratch, g, NULL, v.S, out, lse);
}

void attn_merge_part(int g, int d, float *out, float *lse, const float *part_out,
                     const float *part_lse)
{
    for (int h = 0; h < g; h++) {
        const float l = lse[h], m = part_lse[h], mx = l > m ? l : m;
        if (mx == -INFINITY) continue; /* both empty */
        const float a = expf(l - mx), b = expf(m - mx), s = a + b, wa = a / s, wb = b / s;
        for (int j = 0; j < d; j++) out[h * d + j] = out[h * d + j] * wa + part_out[h * d + j] * wb;
        lse[h] = mx + logf(s);
    }
}

void attn_dense_group(const attn_kv_view *kv, const float *q, int g, float *out, float *scratch)
{
    const int parts = attn_dense_parts(kv->S);
    if (parts == 1) {
        attn_gather_group(kv, q, g, NULL, kv->S, out, scratch, NULL);
        return;
    }
    /* The scores of a part (< 2 ATTN_PART positions) take the front of the
     * g*S scratch floats; the running lse and one part's output fit behind
     * them (S minus the last part >= ATTN_PART > d + 2 positions). */
    const int d = kv->d;
    float *lse = scratch + (size_t)g * kv->S - (size_t)g * (d + 2), *part_lse = lse + g,
          *part_out = part_lse + g;
    attn_dense_part(kv, q, g, 0, out, lse, scratch);
    for (int p = 1; p < parts; p++) {
        attn_dense_part(kv, q, g, p, part_out, part_lse, scratch);
        attn_merge_part(g, d, out, lse, part_out, part_lse);
    }
}

void attn_gather_group(const attn_kv_view *kv, const float *q, int g,
                       const int32_t *sel, int64_t n_sel, float *out, float *scratch, float *lse)
{
    K()->gather_group(kv, q, g, sel, n_sel, out, scratch, lse);
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
    const size_t ni = attn_pad16(attn_topk_work(n)) + attn_pad16(kk);
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
    int32_t *work = scratch->i, *sel = work + attn_pad16(attn_topk_work((size_t)S));

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

int attn_exact_topk_resolve(const char *name, sparq_attn_params *p, char *err, size_t err_size)
{
    if (p->k == 0) p->k = 128;
    if (p->k < 1) return err_set(err, err_size, "%s: k=%d must be >= 1", name, p->k);
    return 0;
}

size_t attn_exact_topk_scratch_floats(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)d; /* the table's signature: the scratch does not depend on d */
    return attn_exact_topk_scratch(S, p->k, g);
}

int64_t attn_exact_topk_transfer(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)g; /* the group shares one read of K and of the kept V rows */
    const int64_t kk = p->k < S ? p->k : S;
    return S * d + kk * d + 2 * (int64_t)d;
}
