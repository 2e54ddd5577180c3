/* attn_prefill.c - tiled causal attention for prefill (attn_prefill.h): the
 * tile loops, once, over the row primitives; the plain-C primitives (the
 * reference twin); the dispatch.
 */
#include "attn/attn_prefill.h"
#include "attn/attn_exp.h"
#include "tensor/quant.h"

#include <math.h>
#include <string.h>

int attn_prefill_bq(int g) { return g >= 128 ? 1 : 128 / g; }

/* KT [d][BK] | V [BK][d] | s [R][BK] | O [rows][d] | m, l [rows] */
size_t attn_prefill_scratch(int d, int g)
{
    const size_t rows = (size_t)attn_prefill_bq(g) * g;
    return 2 * (size_t)d * ATTN_PF_BK + ATTN_PF_R * ATTN_PF_BK + rows * d + 2 * rows;
}

/* Key rows widened to f32: transposed into kt, as rows into v. The rows
 * are [k0, k0 + nk), or pos[0..nk) when pos is not NULL (gathered keys). */
static void load_tile(const attn_kv_view *kv, int64_t k0, const int32_t *pos, int nk, float *kt, float *v)
{
    const int d = kv->d;
    for (int k = 0; k < nk; k++) {
        float *row = v + (size_t)k * d; /* K row first, through v as staging */
        attn_kv_row_f32(kv->K, kv->elem, d, pos ? pos[k] : k0 + k, d, row);
        for (int e = 0; e < d; e++) kt[(size_t)e * ATTN_PF_BK + k] = row[e];
    }
    for (int e = 0; e < d && nk < ATTN_PF_BK; e++) /* tail keys read as zeros */
        memset(kt + (size_t)e * ATTN_PF_BK + nk, 0, (ATTN_PF_BK - nk) * sizeof(float));
    if (kv->elem == KV_Q8_0 || pos) /* Q8_0 rows have their own scales: one at a time */
        for (int k = 0; k < nk; k++) attn_kv_row_f32(kv->V, kv->elem, d, pos ? pos[k] : k0 + k, d, v + (size_t)k * d);
    else if (kv->elem == KV_F16) fp16_to_fp32_row((const uint16_t *)kv->V + k0 * d, v, (int64_t)nk * d);
    else memcpy(v, (const float *)kv->V + k0 * d, (size_t)nk * d * sizeof(float));
}

static void block_run(const attn_pf_ops *op, const attn_kv_view *kv, const attn_pf_seg *seg, int n_seg,
                      const attn_pf_rows *b, float *ml, float *scratch)
{
    const int64_t pos0 = b->pos0;
    const int nt = b->nt, g = b->g;
    const float *q = b->q;
    const size_t q_stride = b->q_stride;
    const int d = kv->d, rows = nt * g;
    const float scale = 1.0f / sqrtf((float)d);
    float *kt = scratch, *v = kt + (size_t)d * ATTN_PF_BK, *s = v + (size_t)d * ATTN_PF_BK;
    float *o = s + ATTN_PF_R * ATTN_PF_BK, *m = o + (size_t)rows * d, *l = m + rows;
    memset(o, 0, (size_t)rows * d * sizeof(float));
    for (int i = 0; i < rows; i++) {
        m[i] = -INFINITY;
        l[i] = 0;
    }
    const int64_t end = pos0 + nt; /* keys any row of the block sees */
    /* tiles in segment order; a contiguous segment's tiles start at its lo,
     * so one segment [0, end) is the exact pass */
    for (int si = 0; si < n_seg; si++) {
        const int32_t *spos = seg[si].pos;
        const int64_t lim = spos ? seg[si].n : seg[si].hi < end ? seg[si].hi : end;
        for (int64_t k0 = spos ? 0 : seg[si].lo; k0 < lim; k0 += ATTN_PF_BK) {
            const int nk = (int)(lim - k0 < ATTN_PF_BK ? lim - k0 : ATTN_PF_BK);
            const int32_t *gpos = spos ? spos + k0 : NULL;
            load_tile(kv, k0, gpos, nk, kt, v);
            /* rows i = t * g + j, ATTN_PF_R at a time; a row sees a prefix
             * of the tile (causal), its other weights are set to 0 */
            for (int i0 = 0; i0 < rows; i0 += ATTN_PF_R) {
                const int nr = rows - i0 < ATTN_PF_R ? rows - i0 : ATTN_PF_R;
                const float *qr[ATTN_PF_R];
                float *orow[ATTN_PF_R], c[ATTN_PF_R];
                int nki[ATTN_PF_R], any = 0;
                for (int r = 0; r < nr; r++) {
                    const int i = i0 + r, t = i / g, j = i % g;
                    /* gathered keys are all older than the block's rows */
                    const int64_t vis = gpos ? nk : pos0 + t + 1 - k0;
                    nki[r] = vis <= 0 ? 0 : vis < nk ? (int)vis : nk;
                    any |= nki[r] > 0;
                    qr[r] = q + (size_t)t * q_stride + (size_t)j * d;
                    orow[r] = o + (size_t)i * d;
                }
                if (!any) continue;
                op->scores(qr, nr, kt, d, scale, s);
                for (int r = 0; r < nr; r++) {
                    const int i = i0 + r;
                    float *sr = s + r * ATTN_PF_BK;
                    if (nki[r] == 0) { /* nothing visible here yet: o and l unchanged */
                        c[r] = 1.0f;
                        memset(sr, 0, nk * sizeof(float));
                        continue;
                    }
                    const float mx = op->rowmax(sr, nki[r], m[i]);
                    /* the old sums' rescale; 0 below e^-87, as the kernels'
                     * exps (attn_avx512.h: no subnormals reach the FMAs) */
                    c[r] = m[i] == -INFINITY || m[i] - mx < ATTN_EXP_MIN ? 0.0f : mx == m[i] ? 1.0f : expf(m[i] - mx);
                    const float sum = op->expsum(sr, nki[r], mx);
                    l[i] = l[i] * c[r] + sum;
                    m[i] = mx;
                    for (int k = nki[r]; k < nk; k++) sr[k] = 0;
                }
                op->pv(s, nr, v, nk, d, c, orow);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < g; j++) {
            const int i = t * g + j;
            const float inv = 1.0f / l[i];
            float *dst = b->out + (size_t)t * b->out_stride + (size_t)j * d;
            for (int e = 0; e < d; e++) dst[e] = o[(size_t)i * d + e] * inv;
            if (ml) {
                ml[2 * i] = m[i];
                ml[2 * i + 1] = l[i];
            }
        }
}

static void colsum_run(const attn_pf_ops *op, const attn_kv_view *kv, int64_t k0, int nk, const attn_pf_rows *b,
                       const float *ml, float *colsum, float *scratch)
{
    const int64_t pos0 = b->pos0;
    const int n = b->nt, g = b->g;
    const float *q = b->q;
    const size_t q_stride = b->q_stride;
    const int d = kv->d;
    const float scale = 1.0f / sqrtf((float)d);
    float *kt = scratch, *v = kt + (size_t)d * ATTN_PF_BK, *s = v + (size_t)d * ATTN_PF_BK;
    memset(colsum, 0, (size_t)nk * sizeof(float));
    load_tile(kv, k0, NULL, nk, kt, v);
    for (int t = k0 > pos0 ? (int)(k0 - pos0) : 0; t < n; t++) {
        const int64_t vis = pos0 + t + 1 - k0;
        const int nki = vis < nk ? (int)vis : nk;
        for (int j = 0; j < g; j++) {
            const int i = t * g + j;
            const float *qr = q + (size_t)t * q_stride + (size_t)j * d;
            op->scores(&qr, 1, kt, d, scale, s);
            op->expsum(s, nki, ml[2 * i]);
            const float inv = 1.0f / ml[2 * i + 1];
            for (int k = 0; k < nki; k++) colsum[k] += s[k] * inv;
        }
    }
}

/* ---- plain-C primitives (the reference) ---------------------------------------- */

static void scores_ref(const float *const *q, int nr, const float *kt, int d, float scale, float *s)
{
    /* acc += q*k, unfused, in order of e, then * scale: attn_scores' order,
     * so the scores equal the decode kernels' bit for bit */
    for (int r = 0; r < nr; r++) {
        float *sr = s + r * ATTN_PF_BK;
        for (int k = 0; k < ATTN_PF_BK; k++) sr[k] = 0;
        for (int e = 0; e < d; e++)
            for (int k = 0; k < ATTN_PF_BK; k++) {
                const float p = q[r][e] * kt[(size_t)e * ATTN_PF_BK + k];
                sr[k] += p;
            }
        for (int k = 0; k < ATTN_PF_BK; k++) sr[k] *= scale;
    }
}

static float rowmax_ref(const float *s, int nk, float m)
{
    for (int k = 0; k < nk; k++) m = s[k] > m ? s[k] : m;
    return m;
}

static float expsum_ref(float *s, int nk, float m)
{
    float sum = 0;
    for (int k = 0; k < nk; k++) sum += (s[k] = expf(s[k] - m));
    return sum;
}

static void pv_ref(const float *p, int nr, const float *v, int nk, int d, const float *c, float *const *o)
{
    for (int r = 0; r < nr; r++) {
        for (int e = 0; e < d; e++) o[r][e] *= c[r];
        for (int k = 0; k < nk; k++)
            for (int e = 0; e < d; e++) o[r][e] = fmaf(p[r * ATTN_PF_BK + k], v[(size_t)k * d + e], o[r][e]);
    }
}

const attn_pf_ops attn_pf_ops_ref = { scores_ref, rowmax_ref, expsum_ref, pv_ref };

/* ---- entry points ----------------------------------------------------------------- */

static const attn_pf_ops *const pf_tables[CPU_LEVELS] = {
    [CPU_REF] = &attn_pf_ops_ref,
#if defined(__x86_64__)
    [CPU_AVX2] = &attn_pf_ops_avx2,
    [CPU_AVX512] = &attn_pf_ops_avx512,
#else
    [CPU_AVX2] = &attn_pf_ops_ref,
    [CPU_AVX512] = &attn_pf_ops_ref,
#endif
#if defined(__aarch64__)
    [CPU_NEON] = &attn_pf_ops_neon,
    [CPU_NEON_DOTPROD] = &attn_pf_ops_neondp,
#else
    [CPU_NEON] = &attn_pf_ops_ref,
    [CPU_NEON_DOTPROD] = &attn_pf_ops_ref,
#endif
};

const attn_pf_ops *attn_pf_ops_at(cpu_level level) { return pf_tables[level]; }

#define PF_BEST (pf_tables[cpu_level_get()])

void attn_prefill_block(const attn_kv_view *kv, const attn_pf_rows *b, float *ml, float *scratch)
{
    const attn_pf_seg all = { 0, b->pos0 + b->nt, NULL, 0 };
    block_run(PF_BEST, kv, &all, 1, b, ml, scratch);
}

void attn_prefill_block_segs(const attn_kv_view *kv, const attn_pf_seg *seg, int n_seg, const attn_pf_rows *b,
                             float *scratch)
{
    block_run(PF_BEST, kv, seg, n_seg, b, NULL, scratch);
}

void attn_prefill_block_segs_ref(const attn_kv_view *kv, const attn_pf_seg *seg, int n_seg, const attn_pf_rows *b,
                                 float *scratch)
{
    block_run(&attn_pf_ops_ref, kv, seg, n_seg, b, NULL, scratch);
}

void attn_prefill_block_ref(const attn_kv_view *kv, const attn_pf_rows *b, float *ml, float *scratch)
{
    const attn_pf_seg all = { 0, b->pos0 + b->nt, NULL, 0 };
    block_run(&attn_pf_ops_ref, kv, &all, 1, b, ml, scratch);
}

void attn_prefill_colsum(const attn_kv_view *kv, int64_t k0, int nk, const attn_pf_rows *b, const float *ml,
                         float *colsum, float *scratch)
{
    colsum_run(PF_BEST, kv, k0, nk, b, ml, colsum, scratch);
}

void attn_prefill_colsum_ref(const attn_kv_view *kv, int64_t k0, int nk, const attn_pf_rows *b, const float *ml,
                             float *colsum, float *scratch)
{
    colsum_run(&attn_pf_ops_ref, kv, k0, nk, b, ml, colsum, scratch);
}
