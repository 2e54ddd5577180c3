/* attn_kernels_ref.c - the plain-C reference twins of attn.h's kernels.
 *
 * One position (or one key) at a time, in the order the maths is written,
 * sums of many terms in double; K, V and K^T elements are read through
 * attn_kv_at (f32, f16 or Q8_0). They define what the SIMD twins
 * (attn_kernels_avx2.c, attn_kernels_avx512.c, attn_kernels_neon.c) must
 * compute (tests/test_attn.c compares each pair over odd sizes) and are
 * what SPARQ_CPU=ref runs.
 *
 * Map: scores | softmax | weighted sums | K^T logits | SparQ's fused exp and
 * group sum | top-k filter and k-th key | gather | the reference table.
 */
#include "attn/attn_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

void attn_scores_ref(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                     int64_t n, float *s)
{
    if (attn_q8i_applies(kv)) {
        attn_scores_q8i_ref(kv, q, g, rows, n, s);
        return;
    }
    const int d = kv->d;
    const float scale = 1.0f / sqrtf((float)d);
    int64_t read = 0; /* K elements of the rows visited, first head's pass */
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = rows ? rows[i] : i;
        for (int h = 0; h < g; h++) {
            float acc = 0;
            int j;
            for (j = 0; j < d; j++) acc += q[h * d + j] * attn_kv_at(kv->K, kv->elem, d, row, j);
            s[h * n + i] = acc * scale;
            if (h == 0) read += j;
        }
    }
    if (kv->meter) kv->meter->k += read;
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
    int64_t read = 0; /* V elements of the rows visited, first head's pass */
    memset(out, 0, (size_t)g * d * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = rows ? rows[i] : i;
        for (int h = 0; h < g; h++) {
            const float wi = w[h * n + i];
            int j;
            for (j = 0; j < d; j++)
                out[h * d + j] += wi * attn_kv_at(kv->V, kv->elem, d, row, j);
            if (h == 0) read += j;
        }
    }
    if (kv->meter) kv->meter->v += read;
}

void attn_softmax_weighted_sum_ref(const attn_kv_view *kv, const float *s, int g,
                                   const int32_t *rows, int64_t n, float *out, float *lse)
{
    if (attn_q8i_applies(kv)) {
        attn_softmax_weighted_sum_q8i_ref(kv, s, g, rows, n, out, lse);
        return;
    }
    const int d = kv->d;
    memset(out, 0, (size_t)g * d * sizeof *out);
    for (int h = 0; h < g; h++) {
        const float *x = s + h * n;
        float mx = -INFINITY;
        double z = 0;
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int64_t i = 0; i < n; i++) z += expf(x[i] - mx);
        if (lse) lse[h] = mx + (float)log(z);
        const float inv = (float)(1.0 / z);
        int64_t read = 0; /* V elements of the rows visited by this head */
        for (int64_t i = 0; i < n; i++) {
            const int64_t row = rows ? rows[i] : i;
            const float w = expf(x[i] - mx) * inv;
            int j;
            for (j = 0; j < d; j++) out[h * d + j] += w * attn_kv_at(kv->V, kv->elem, d, row, j);
            read += j;
        }
        if (h == 0 && kv->meter) kv->meter->v += read; /* the group's other heads: same rows */
    }
}

void attn_kt_logits_ref(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                        int g, int64_t n, float *s)
{
    memset(s, 0, (size_t)g * n * sizeof *s);
    int64_t read = 0; /* K^T elements: per component row, the positions visited */
    for (int c = 0; c < r; c++) {
        int64_t i;
        for (i = 0; i < n; i++) {
            int64_t col;
            const void *row = attn_kt_row(kv, comp[c], i, &col);
            const float kt = attn_kv_at(row, kv->elem, 0, 0, col);
            for (int h = 0; h < g; h++) s[h * n + i] += qs[h * r + c] * kt;
        }
        read += i;
    }
    if (kv->meter) kv->meter->kt += read;
}

void attn_kt_exp_ref(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                     int64_t n, float *e, float *scale, float *lsum)
{
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    attn_kt_logits_ref(kv, qs, comp, r, g, n, e); /* logits, exponentiated in place below */
    if (lsum)
        for (int64_t i = 0; i < n; i++) {
            float a = 0;
            for (int h = 0; h < g; h++) a += e[h * n + i];
            lsum[i] = a;
        }
    for (int h = 0; h < g; h++) {
        float *x = e + h * n, *sc = scale + h * nb, m = -INFINITY;
        for (int64_t b = 0; b < nb; b++) { /* running block maxima, kept in scale for now */
            const int64_t end = (b + 1) * ATTN_EXP_BLOCK < n ? (b + 1) * ATTN_EXP_BLOCK : n;
            for (int64_t i = b * ATTN_EXP_BLOCK; i < end; i++) m = x[i] > m ? x[i] : m;
            sc[b] = m;
        }
        double z = 0;
        for (int64_t i = 0; i < n; i++) {
            z += expf(x[i] - m);
            x[i] = attn_score_flush(expf(x[i] - sc[i / ATTN_EXP_BLOCK]));
        }
        for (int64_t b = 0; b < nb; b++) sc[b] = attn_score_flush((float)(expf(sc[b] - m) / z));
    }
}

void attn_scaled_head_sum_ref(const float *e, const float *scale, int g, int64_t n, int64_t m,
                              float *out)
{
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    for (int64_t i = 0; i < m; i++) {
        float a = 0;
        for (int h = 0; h < g; h++) a += scale[h * nb + i / ATTN_EXP_BLOCK] * e[h * n + i];
        out[i] = a;
    }
}

int64_t attn_topk_filter_ref(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key)
{
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] >= t) { /* NaN compares false: never kept */
            key[c] = attn_topk_key(x[i]);
            idx[c++] = (int32_t)i;
        }
    return c;
}

int64_t attn_topk_partition_ref(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out,
                                int64_t *n_lo)
{
    int64_t hi = 0, lo = m;
    for (int64_t i = 0; i < m; i++) {
        if (key[i] > p) out[hi++] = key[i];
        else if (key[i] < p) out[--lo] = key[i];
    }
    *n_lo = m - lo;
    return hi;
}

int64_t attn_topk_above_ref(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t,
                            int32_t *idx)
{
    int64_t c = 0;
    for (int64_t j = 0; j < m; j++)
        if (key[j] > t) idx[c++] = pos ? pos[j] : (int32_t)j;
    return c;
}

uint32_t attn_topk_kth_key_ref(const uint32_t *key, int64_t m, int64_t k)
{
    /* bisection on the answer: count(key >= t) falls as t grows */
    uint32_t lo = 0, hi = UINT32_MAX;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2 + 1;
        int64_t c = 0;
        for (int64_t i = 0; i < m; i++) c += key[i] >= mid;
        if (c >= k) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* ---- gather and the reference table ---------------------------------------- */

void attn_gather_group_ref(const attn_kv_view *kv, const float *q, int g,
                           const int32_t *sel, int64_t n_sel, float *out, float *scratch, float *lse)
{
    if (n_sel <= 0) {
        attn_gather_none(g, kv->d, out, lse);
        return;
    }
    attn_scores_ref(kv, q, g, sel, n_sel, scratch);
    attn_softmax_weighted_sum_ref(kv, scratch, g, sel, n_sel, out, lse);
}

const attn_kernels attn_kernels_ref = {
    attn_topk_filter_ref, attn_scores_ref, attn_softmax_ref, attn_weighted_sum_ref,
    attn_kt_logits_ref, attn_softmax_weighted_sum_ref, attn_kt_exp_ref, attn_scaled_head_sum_ref,
    attn_topk_kth_key_ref, attn_topk_above_ref, attn_topk_partition_ref, attn_gather_group_ref,
};
