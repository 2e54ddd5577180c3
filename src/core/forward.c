/* forward.c - the transformer forward pass: one sequence's batched prefill
 * and single-token decode, and one decode step for many sequences at once
 * (sparq_decode_batch). The contexts it runs in are made in context.c,
 * which never calls back into this file (forward.h, context.h).
 *
 * Map:
 *   model_matmul(_group)           threaded W x, ggml-compatible numerics
 *   rms_norm, rope_*, silu_mul_row small pure kernels
 *   attend_prefill                 exact causal attention, no S x S matrix
 *   attend_decode_many             one token through the attention policy,
 *                                  for one sequence or a batch
 *   forward                        the layer loop, reading like the maths
 *   ctx_check_logits               non-finite logits become an error
 *   sparq_eval / sparq_eval_all    batching, progress, abort
 *   sparq_decode_batch             one token for each of B sequences, one
 *                                  pass over the weights, batch-invariant
 */
#include "core/forward.h"
#include "core/context.h"
#include "core/model.h"
#include "attn/attn_prefill.h"
#include "attn/attn_pf_sparse.h"
#include "core/forward_kernels.h"
#include "tensor/gemm.h"
#include "tensor/quant.h"
#include "util/err.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- kernels ------------------------------------------------------------ */

/* Converts n activation rows to vec_dot type vdt (once per product group,
 * like ggml's vec_dot_type) into dst, row_bytes apart; returns the rows to
 * feed the dot kernels (in itself for F32) and their stride. */
static const uint8_t *convert_activations(int nt, uint8_t *dst, size_t row_bytes, const float *in, int n,
                                          int64_t n_in, int vdt, size_t *x_stride)
{
    if (vdt == QT_F32) {
        *x_stride = (size_t)n_in * sizeof(float);
        return (const uint8_t *)in;
    }
    *x_stride = row_bytes;
#pragma omp parallel for num_threads(nt) schedule(static) if (n > 1)
    for (int t = 0; t < n; t++)
        quant_from_float((uint32_t)vdt, in + (size_t)t * n_in, dst + (size_t)t * (*x_stride), n_in);
    return dst;
}

/* Panel p of matmul_tiles' list: the products' panels of pr rows one
 * after another (first[i] = index of product i's first panel). */
static void run_panel(int64_t p, const int64_t *first, int pr, size_t rb, const weight *const *ws,
                      const uint8_t *acts, int n, float *const *outs, uint8_t *panel)
{
    int i = 0;
    while (p >= first[i + 1]) i++;
    const weight *w = ws[i];
    const int64_t r0 = (p - first[i]) * pr;
    const int nr = (int)(w->n_out - r0 < pr ? w->n_out - r0 : pr);
    const uint8_t *rows = (const uint8_t *)w->packed + (size_t)r0 * rb;
    if (!w->packed) {
        gemm_pack_rows(w->type, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, nr, w->n_in,
                       panel);
        rows = panel;
    }
    gemm_panel(w->type, rows, nr, acts, n, w->n_in, outs[i] + r0, (size_t)w->n_out);
}

/* Products through packed tiles (tensor/gemm.h): every token's activations
 * are packed once, then each panel of rows (sized to stay in L2) meets all
 * tokens in register tiles. Rows come packed from the load (weight.packed,
 * model_repack.c) or are packed per panel into a per-thread buffer. The
 * panels of all products form one parallel loop. acts: room for n packed
 * tokens (model_act_row_bytes each), or NULL to allocate. Returns -1 if a
 * type has no tiles or memory is short, never when every weight is packed
 * and acts is given; the caller then takes the row-chunk path. */
static int matmul_tiles(int nt, uint8_t *acts, const float *in, int n, int n_w, const weight *const *ws,
                        float *const *outs)
{
    for (int i = 0; i < n_w; i++)
        if (!ws[i]->packed && !gemm_supported(ws[i]->type)) return -1;
    for (int i = 1; i < n_w; i++) {
        if (ws[i]->type != ws[0]->type) {
            /* the activation packing depends on the weight type (Q4_K_M
             * mixes Q4_K and Q6_K in one group): one product at a time;
             * on failure the caller recomputes them all */
            for (int j = 0; j < n_w; j++)
                if (matmul_tiles(nt, acts, in, n, 1, ws + j, outs + j)) return -1;
            return 0;
        }
    }
    int all_packed = 1;
    for (int i = 0; i < n_w; i++) all_packed &= ws[i]->packed != NULL;
    const int64_t n_in = ws[0]->n_in;
    const size_t ab = gemm_act_bytes(ws[0]->type, n_in), rb = gemm_row_bytes(ws[0]->type, n_in);
    if (!ab || !rb) return -1;
    /* Few tokens (a decode step, a batch of sequences): every panel is read
     * once, small panels share the rows evenly between the threads. Many
     * (prefill): whole pairs of 16-row groups up to a quarter of the L2, so
     * a panel stays there while the token tiles stream past it; a lone group
     * runs at half the tiles' reuse of each activation broadcast. */
    enum { PANEL_BYTES = 256 * 1024, FEW_TOKENS = 6 };
    int pr = 4 * GEMM_GROUP;
    if (n > FEW_TOKENS) {
        pr = (int)(PANEL_BYTES / rb) / (2 * GEMM_GROUP) * (2 * GEMM_GROUP);
        if (pr < 2 * GEMM_GROUP) pr = 2 * GEMM_GROUP;
        if (pr > 128) pr = 128;
    }
    uint8_t *own_acts = NULL, *panels = NULL;
    if (!acts) acts = own_acts = aligned_alloc(64, (size_t)n * ab);
    if (!all_packed) panels = aligned_alloc(64, ((size_t)nt * pr * rb + 63) / 64 * 64); /* rb: 34 bytes a weight for Q8_0 */
    if (!acts || (!all_packed && !panels)) {
        free(own_acts);
        free(panels);
        return -1;
    }
    int64_t first[5] = { 0 };
    for (int i = 0; i < n_w; i++) first[i + 1] = first[i] + (ws[i]->n_out + pr - 1) / pr;
    /* The tokens are packed before the panels start; few tokens (a decode
     * step: a few microseconds of work) by this thread alone, so no team
     * waits on a barrier for them (one barrier less per product, 121 a
     * token for smollm2). */
#pragma omp parallel for num_threads(nt) schedule(static) if (n > FEW_TOKENS)
    for (int t = 0; t < n; t++) gemm_pack_act(ws[0]->type, in + (size_t)t * n_in, n_in, acts + (size_t)t * ab);
#pragma omp parallel num_threads(nt)
    {
        uint8_t *panel = panels ? panels + (size_t)omp_get_thread_num() * pr * rb : NULL;
        /* Few tokens: each thread one contiguous range of panels, i.e. one
         * sequential stream from DRAM (interleaved panels measured slower);
         * many: panels handed out as threads free up. */
        if (n <= FEW_TOKENS) {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < first[n_w]; p++) run_panel(p, first, pr, rb, ws, acts, n, outs, panel);
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t p = 0; p < first[n_w]; p++) run_panel(p, first, pr, rb, ws, acts, n, outs, panel);
        }
    }
    free(own_acts);
    free(panels);
    return 0;
}

/* 1 if the products of a group must run one at a time: their activations
 * differ (vec_dot types), or some read weights repacked at load and others
 * not. */
static int group_splits(int n_w, const weight *const *ws)
{
    const int vdt = quant_traits_of(ws[0]->type)->vec_dot_type;
    for (int i = 1; i < n_w; i++)
        if (quant_traits_of(ws[i]->type)->vec_dot_type != vdt || !ws[i]->packed != !ws[0]->packed) return 1;
    return 0;
}

/* Weights repacked at load take the tiles at every n, so a token's result
 * never depends on n or on what shares its batch. acts: n rows of
 * model_act_row_bytes scratch, so nothing is allocated and it cannot fail. */
static void matmul_repacked(int nt, uint8_t *acts, const float *in, int n, int n_w, const weight *const *ws,
                            float *const *outs)
{
    const int rc = matmul_tiles(nt, acts, in, n, n_w, ws, outs);
    assert(rc == 0);
    (void)rc;
}

void model_matmul_group(sparq_context *c, const float *in, int n, int n_w, const weight *const *ws,
                        float *const *outs)
{
    assert(n_w >= 1 && n_w <= 4);
    if (group_splits(n_w, ws)) {
        for (int j = 0; j < n_w; j++) model_matmul_group(c, in, n, 1, ws + j, outs + j);
        return;
    }
    if (ws[0]->packed) {
        matmul_repacked(c->n_threads, c->rs.xq, in, n, n_w, ws, outs);
        return;
    }
    const int vdt = quant_traits_of(ws[0]->type)->vec_dot_type;
    /* Packing every weight once per call costs about what the row-chunk
     * path spends on a few dozen tokens: below that, short prompts (chat
     * turns) stay on it. Measured under load (pp4..pp64, smollm2 Q8_0, 1
     * thread): chunks faster at 32 tokens, tiles at 64; retune when quiet. */
    enum { GEMM_MIN_TOKENS = 48 };
    if (n >= GEMM_MIN_TOKENS && matmul_tiles(c->n_threads, NULL, in, n, n_w, ws, outs) == 0) return;
    const int64_t n_in = ws[0]->n_in;
    size_t x_stride;
    const uint8_t *xq = convert_activations(c->n_threads, c->rs.xq, c->rs.xq_row_bytes, in, n, n_in, vdt, &x_stride);
    /* Rows in chunks of 16: a chunk stays in L1 while every token's
     * activations stream past it. The chunks of all products form one
     * parallel loop, so q/k/v (or gate/up) cost one barrier, not three. */
    enum { CHUNK = 16 };
    int64_t first_chunk[5] = { 0 };
    for (int i = 0; i < n_w; i++) first_chunk[i + 1] = first_chunk[i] + (ws[i]->n_out + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(c->n_threads) schedule(static)
    for (int64_t ch = 0; ch < first_chunk[n_w]; ch++) {
        int i = 0;
        while (ch >= first_chunk[i + 1]) i++;
        const weight *w = ws[i];
        const int64_t r0 = (ch - first_chunk[i]) * CHUNK;
        const int nr = (int)(w->n_out - r0 < CHUNK ? w->n_out - r0 : CHUNK);
        const uint8_t *rows = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
        float tmp[CHUNK];
        if (n == 1) {
            /* Decode: each row streams from DRAM once. One row at a time
             * keeps one sequential stream the hardware prefetcher follows;
             * the four-row kernels interleave four streams and measured at
             * less than half the read bandwidth here (Q8_0, 1 thread). */
            for (int r = 0; r < nr; r++) outs[i][r0 + r] = quant_dot(w->type, rows + (size_t)r * w->row_bytes, xq, n_in);
            continue;
        }
        for (int t = 0; t < n; t++) {
            quant_dot_rows(w->type, rows, w->row_bytes, nr, xq + (size_t)t * x_stride, n_in, tmp);
            memcpy(outs[i] + (size_t)t * w->n_out + r0, tmp, (size_t)nr * sizeof(float));
        }
    }
}

void model_matmul(sparq_context *c, float *out, const float *in, int n, const weight *w)
{
    model_matmul_group(c, in, n, 1, &w, &out);
}

/* out = x / rms(x) * w; the sum of squares in double, as ggml does. */
static void rms_norm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* cos/sin of every rotated pair at position pos: cs[2i], cs[2i+1]. The
 * angle is advanced by repeated multiplication in float, like ggml, so our
 * rotations match llama.cpp's to the last bit. Both are scaled by the
 * attention factor (1 except longrope), which scales q.k by its square. */
static void rope_angles(float *cs, int64_t pos, const model_hparams *hp, const float *freq_factors)
{
    const float theta_scale = powf(hp->rope_base, -2.0f / (float)hp->rope_dim);
    const float mscale = hp->rope_attn_factor;
    float theta = (float)pos;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        float t = theta / (freq_factors ? freq_factors[i] : 1.0f) * hp->rope_freq_scale;
        cs[2 * i] = cosf(t) * mscale;
        cs[2 * i + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

static void rope_head(float *x, const float *cs, int rope_dim, int type)
{
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const int a = type == ROPE_NEOX ? i : 2 * i;
        const int b = type == ROPE_NEOX ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b], c = cs[2 * i], s = cs[2 * i + 1];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/* The reference SiLU (scalar expf); the AVX2 and AVX-512 levels run a
 * vector exp instead (about 2e-7 from expf). */
void silu_mul_row_ref(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

const fwd_kernels fwd_kernels_ref = { silu_mul_row_ref };

static const fwd_kernels *const fwd_tables[CPU_LEVELS] = {
    [CPU_REF] = &fwd_kernels_ref,
#if defined(__x86_64__)
    [CPU_AVX2] = &fwd_kernels_avx2,
    [CPU_AVX512] = &fwd_kernels_avx512,
#else
    [CPU_AVX2] = &fwd_kernels_ref,
    [CPU_AVX512] = &fwd_kernels_ref,
#endif
    [CPU_NEON] = &fwd_kernels_ref,
    [CPU_NEON_DOTPROD] = &fwd_kernels_ref,
};

const fwd_kernels *fwd_kernels_at(cpu_level level) { return fwd_tables[level]; }

static void silu_mul_row(float *gate, const float *up, int64_t n)
{
    fwd_tables[cpu_level_get()]->silu_mul_row(gate, up, n);
}

/* ---- attention ------------------------------------------------------------ */

static attn_scratch thread_scratch(const sparq_context *c, int tid)
{
    attn_scratch s;
    s.f = c->rs.attn_scratch + (size_t)tid * c->rs.scratch_floats;
    s.i = c->rs.attn_iscratch + (size_t)tid * c->rs.scratch_floats;
    s.n_f = c->rs.scratch_floats;
    return s;
}

/* Sum over the batch's queries and the group's heads of the attention
 * weights each key position received (what H2O accumulates). */
static void prefill_colsum(sparq_context *c, int il, int h, int64_t pos0, int n, float *colsum)
{
    const model_hparams *hp = &c->model->hp;
    const int g = hp->n_head / hp->n_kv_head, d = hp->head_dim;
    const size_t q_dim = (size_t)hp->n_head * d;
    const float scale = 1.0f / sqrtf((float)d);
    attn_kv_view kv;
    kv_view(&c->kv, il, h, pos0 + n, &kv);
    memset(colsum, 0, (size_t)(pos0 + n) * sizeof(float));
    float *w = malloc((size_t)(pos0 + n) * sizeof(float));
    if (!w) return;
    for (int t = 0; t < n; t++) {
        const int64_t S = pos0 + t + 1;
        for (int j = 0; j < g; j++) {
            const float *q = c->rs.q + t * q_dim + ((size_t)h * g + j) * d;
            float mx = -INFINITY, sum = 0;
            for (int64_t s = 0; s < S; s++) {
                if (kv.elem == KV_Q8_0) {
                    float a = 0;
                    for (int e = 0; e < d; e++) a += q[e] * attn_kv_at(kv.K, KV_Q8_0, d, s, e);
                    w[s] = scale * a;
                } else {
                    w[s] = scale * (kv.elem == KV_F16 ? dot_f16_f32((const uint16_t *)kv.K + s * d, q, d)
                                                      : dot_f32((const float *)kv.K + s * d, q, d));
                }
                if (w[s] > mx) mx = w[s];
            }
            for (int64_t s = 0; s < S; s++) sum += (w[s] = expf(w[s] - mx));
            for (int64_t s = 0; s < S; s++) colsum[s] += w[s] / sum;
        }
    }
    free(w);
}

/* Prefill chunks of at most this many tokens take attend_prefill_rows:
 * the tiles widen every K/V tile to f32 for a handful of queries (at depth
 * 4096 a one-token chunk spent most of its time there, e.g. the uncached
 * last token of a prompt the server's prefix cache holds), and have only
 * n_kv_head units to share between the threads. */
#ifndef PREFILL_ROWS_MAX
#define PREFILL_ROWS_MAX 16
#endif

/* Each token and KV head one group-wide pass over the cache, as a decode
 * step's dense attention: short chunks (PREFILL_ROWS_MAX), and the
 * fallback when attend_prefill cannot get its scratch. */
static void attend_prefill_rows(sparq_context *c, int il, int64_t pos0, int n)
{
    const model_hparams *hp = &c->model->hp;
    const int g = hp->n_head / hp->n_kv_head, d = hp->head_dim, n_kv = hp->n_kv_head;
    const size_t q_dim = (size_t)hp->n_head * d;
#pragma omp parallel num_threads(c->n_threads)
    {
        attn_scratch s = thread_scratch(c, omp_get_thread_num());
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int t = n - 1; t >= 0; t--) /* longest rows first balances threads */
            for (int h = 0; h < n_kv; h++) {
                attn_kv_view kv;
                kv_view(&c->kv, il, h, pos0 + t + 1, &kv);
                size_t off = t * q_dim + (size_t)h * g * d;
                attn_dense_group(&kv, c->rs.q + off, g, c->rs.att + off, s.f);
            }
    }
    if (c->policy->observe_prefill) {
        const int colsum = (c->policy->needs & ATTN_NEEDS_COLSUM) != 0;
#pragma omp parallel for num_threads(c->n_threads) schedule(dynamic, 1)
        for (int h = 0; h < n_kv; h++) {
            float *cs = colsum ? c->rs.colsum + (size_t)h * c->kv.cap : NULL;
            if (cs) prefill_colsum(c, il, h, pos0, n, cs);
            attn_kv_view kv;
            kv_view(&c->kv, il, h, pos0 + n, &kv);
            c->policy->observe_prefill(c->policy_state, &c->params.attn, il, h, &kv, cs);
        }
    }
}

/* Exact causal attention for n new tokens at pos0..pos0+n-1, tiled
 * (attn/attn_prefill.h): units of (query block, KV head), the longest rows
 * first so the threads finish together. H2O's column sums reuse the rows'
 * final softmax statistics: one more q.k pass over key tiles, split across
 * threads by key block (each thread owns its columns), no p.V. */
static int attend_prefill(sparq_context *c, int il, int64_t pos0, int n)
{
    const model_hparams *hp = &c->model->hp;
    const int g = hp->n_head / hp->n_kv_head, d = hp->head_dim, n_kv = hp->n_kv_head;
    const size_t q_dim = (size_t)hp->n_head * d;
    const int observe = c->policy->observe_prefill != NULL;
    const int colsum = observe && (c->policy->needs & ATTN_NEEDS_COLSUM) != 0;
    const size_t sf = (attn_prefill_scratch(d, g) + 15) / 16 * 16;
    float *scratch = aligned_alloc(64, (size_t)c->n_threads * sf * sizeof(float));
    float *ml = colsum ? malloc((size_t)n_kv * n * g * 2 * sizeof(float)) : NULL;
    if (!scratch || (colsum && !ml)) {
        free(scratch);
        free(ml);
        if (c->pf) {
            return err_set(c->error, sizeof c->error, "prefill: out of memory for attention scratch");
        }
        attend_prefill_rows(c, il, pos0, n);
        return 0;
    }
    int failed = 0;
    const int bq = attn_prefill_bq(g), n_qb = (n + bq - 1) / bq;
    const int64_t S = pos0 + n, n_kb = (S + ATTN_PF_BK - 1) / ATTN_PF_BK;
#pragma omp parallel num_threads(c->n_threads)
    {
        float *s = scratch + (size_t)omp_get_thread_num() * sf;
        if (c->pf) { /* the older keys of each head's index, before its blocks */
#pragma omp for schedule(dynamic, 1)
            for (int h = 0; h < n_kv; h++) {
                attn_kv_view kv;
                kv_view(&c->kv, il, h, S, &kv);
                char e[160];
                if (attn_pf_sparse_grow(c->pf, il, h, &kv, pos0, e, sizeof e)) {
#pragma omp critical(pf_error)
                    if (!failed) err_set(c->error, sizeof c->error, "%s", e);
                    failed = 1;
                }
            }
        }
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int qb = n_qb - 1; qb >= 0; qb--)
            for (int h = 0; h < n_kv; h++) {
                const int t0 = qb * bq, nt = n - t0 < bq ? n - t0 : bq;
                attn_kv_view kv;
                kv_view(&c->kv, il, h, S, &kv);
                const size_t off = (size_t)t0 * q_dim + (size_t)h * g * d;
                const attn_pf_rows b = {.pos0 = pos0 + t0,
                                        .nt = nt,
                                        .g = g,
                                        .q = c->rs.q + off,
                                        .q_stride = q_dim,
                                        .out = c->rs.att + off,
                                        .out_stride = q_dim};
                if (c->pf)
                    attn_pf_sparse_block(c->pf, omp_get_thread_num(), il, h, &kv, &b, s, NULL);
                else
                    attn_prefill_block(&kv, &b, ml ? ml + ((size_t)h * n + t0) * g * 2 : NULL, s);
            }
        if (colsum) {
#pragma omp for schedule(dynamic, 4) collapse(2)
            for (int h = 0; h < n_kv; h++)
                for (int64_t kb = 0; kb < n_kb; kb++) {
                    const int64_t k0 = kb * ATTN_PF_BK;
                    const int nk = (int)(S - k0 < ATTN_PF_BK ? S - k0 : ATTN_PF_BK);
                    attn_kv_view kv;
                    kv_view(&c->kv, il, h, S, &kv);
                    const attn_pf_rows b = {
                        .pos0 = pos0, .nt = n, .g = g, .q = c->rs.q + (size_t)h * g * d, .q_stride = q_dim};
                    attn_prefill_colsum(&kv, k0, nk, &b, ml + (size_t)h * n * g * 2,
                                        c->rs.colsum + (size_t)h * c->kv.cap + k0, s);
                }
        }
        if (observe) {
#pragma omp for schedule(dynamic, 1)
            for (int h = 0; h < n_kv; h++) {
                attn_kv_view kv;
                kv_view(&c->kv, il, h, S, &kv);
                c->policy->observe_prefill(c->policy_state, &c->params.attn, il, h, &kv,
                                           colsum ? c->rs.colsum + (size_t)h * c->kv.cap : NULL);
            }
        }
    }
    free(scratch);
    free(ml);
    return failed ? -1 : 0;
}

/* One decode step through the policy, all KV heads of layer il, for nc
 * contexts at once (a batched step) or one. A policy that splits long
 * steps (attn_policy.n_parts) gets (KV head, part) tasks, merged per head
 * in order afterwards, which gives what its attend gives as a whole;
 * otherwise one task per KV head. A policy whose parts need one decision
 * over every position first (select: SparQ's top-k) gets one select task
 * per KV head ahead of all parts, and finish after the merge; a part waits
 * only for its own head's select, so while one thread selects for the
 * last head the others read the parts of the heads already selected. The
 * tasks of all contexts share the threads (smollm2's 3 KV heads alone
 * would idle one of 2 cores a third of the time); a task computes the
 * same on whichever thread runs it, so a context's output does not depend
 * on the others. Context i's query is in its rs.q, its output goes to
 * rs.att, its new token is at pos[i]; nt threads, at most any context's
 * n_threads (each has scratch for those). Returns 0, or -1 with each
 * failing context's first message in its error. */
enum { ATTEND_MANY_MAX = 256 }; /* contexts per call: sparq_decode_batch splits larger batches */

/* Context c's step of KV head h at position pos (kv: its view), into out. */
static attn_step decode_step(const sparq_context *c, int il, int h, const attn_kv_view *kv, float *out,
                             attn_scratch *s, attn_counts *cnt)
{
    const int g = c->model->hp.n_head / c->model->hp.n_kv_head, d = c->model->hp.head_dim;
    return (attn_step){ .layer = il, .kv_head = h, .kv = kv, .q = c->rs.q + (size_t)h * g * d, .g = g,
                        .out = out, .scratch = s, .counts = cnt, .trace = NULL };
}

/* Spins a thread that waits for another's select (tens of us) */
static inline void spin_pause(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void decode_failed(sparq_context *c, int *failed, int il, int h, const char *err)
{
#pragma omp critical(attend_decode_error)
    if (!*failed) {
        __atomic_store_n(failed, 1, __ATOMIC_RELAXED); /* parts of other heads read it as they start */
        err_set(c->error, sizeof c->error, "attention (%s), layer %d, kv head %d: %.200s", c->policy->name, il, h,
                err[0] ? err : "failed");
    }
}

/* Context c's select for KV head h at position pos, unless a thread has
 * taken it already; with wait, returns only once it is done (the part
 * calling reads what it leaves). Whichever thread comes first runs it, so
 * no order of handing out the tasks can leave a part waiting on a select
 * nobody runs. */
static void select_once(sparq_context *c, int il, int h, int64_t pos, attn_scratch *s, int *failed,
                        int64_t *read, int wait)
{
    int *state = &c->rs.attn_selected[h], idle = 0; /* 0 pending, 1 running, 2 done */
    if (__atomic_compare_exchange_n(state, &idle, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        attn_kv_view kv;
        attn_counts cnt = { 0, 0 };
        kv_view(&c->kv, il, h, pos + 1, &kv);
        const attn_step step = decode_step(c, il, h, &kv, NULL, s, &cnt);
        s->err[0] = 0;
        if (c->policy->select(c->policy_state, &c->params.attn, &step,
                              c->rs.attn_shared + (size_t)h * c->rs.shared_floats))
            decode_failed(c, failed, il, h, s->err);
#pragma omp atomic
        *read += cnt.read;
        __atomic_store_n(state, 2, __ATOMIC_RELEASE);
        return;
    }
    while (wait && __atomic_load_n(state, __ATOMIC_ACQUIRE) != 2) spin_pause();
}

static int attend_decode_many(sparq_context *const *cs, int nc, int il, const int64_t *pos, int nt, int exact)
{
    assert(nc >= 1 && nc <= ATTEND_MANY_MAX);
    const model_hparams *hp = &cs[0]->model->hp;
    const int g = hp->n_head / hp->n_kv_head, d = hp->head_dim, n_kv = hp->n_kv_head;
    const size_t part_floats = (size_t)g * d + (size_t)g; /* a part's out[g][d], lse[g] */
    int parts[ATTEND_MANY_MAX], failed[ATTEND_MANY_MAX], staged[ATTEND_MANY_MAX];
    int64_t first[ATTEND_MANY_MAX + 1], first_sel[ATTEND_MANY_MAX + 1];
    int64_t read[ATTEND_MANY_MAX], written[ATTEND_MANY_MAX];
    first[0] = first_sel[0] = 0;
    /* A staged step pays for its selects running first, each a barrier to
     * its head's parts (a batch of 16 sequences ran slower that way);
     * with 4 or more KV heads a thread the heads alone keep the threads
     * busy, and attend gives the same bits in one task. */
    const int stage = nc * n_kv < 4 * nt;
    for (int i = 0; i < nc; i++) {
        sparq_context *c = cs[i];
        parts[i] = !exact && c->rs.attn_parts ? c->policy->n_parts(&c->params.attn, pos[i] + 1) : 1;
        /* attend computes what the parts do, in turn: SparQ with k >= S
         * below the capacity can have more (dense) parts than room here */
        if (parts[i] > c->rs.attn_max_parts || (parts[i] > 1 && c->policy->select && !stage)) parts[i] = 1;
        staged[i] = parts[i] > 1 && c->policy->select;
        first[i + 1] = first[i] + (int64_t)n_kv * parts[i];
        first_sel[i + 1] = first_sel[i] + (staged[i] ? n_kv : 0);
        failed[i] = 0;
        read[i] = written[i] = 0;
        if (staged[i]) memset(c->rs.attn_selected, 0, (size_t)n_kv * sizeof *c->rs.attn_selected);
    }
    /* Every task of a thread works in one scratch, the batch's largest (each
     * context sizes its own for its capacity and policy, and a larger one
     * serves a smaller need): it stays in L2 from task to task, where each
     * sequence's own would come from memory every time (SparQ's g x S
     * scores are 196 KB a task for smollm2 at 16k). */
    const sparq_context *big = cs[0];
    for (int i = 1; i < nc; i++)
        if (cs[i]->rs.scratch_floats > big->rs.scratch_floats) big = cs[i];
#pragma omp parallel num_threads(nt)
    {
        char err[256] = "";
        attn_scratch s = thread_scratch(big, omp_get_thread_num());
        s.err = err;
        s.err_size = sizeof err;
        /* Tasks handed out as threads free up: the tasks are alike, but the
         * threads are not (on a shared host one vCPU ran them ~30% slower,
         * and a static half left the other waiting a quarter of the step).
         * The selects first, then every part, in one loop: a thread that
         * finishes a select goes on to parts of heads already selected. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < first_sel[nc] + first[nc]; task++) {
            if (task < first_sel[nc]) {
                int i = 0;
                while (task >= first_sel[i + 1]) i++;
                select_once(cs[i], il, (int)(task - first_sel[i]), pos[i], &s, &failed[i], &read[i], 0);
                continue;
            }
            const int64_t pt = task - first_sel[nc];
            int i = 0;
            while (pt >= first[i + 1]) i++;
            sparq_context *c = cs[i];
            const int t = (int)(pt - first[i]), h = t / parts[i], p = t % parts[i];
            if (staged[i]) {
                select_once(c, il, h, pos[i], &s, &failed[i], &read[i], 1);
                if (__atomic_load_n(&failed[i], __ATOMIC_RELAXED)) continue; /* no selection to attend over */
            }
            err[0] = 0;
            attn_kv_view kv;
            attn_counts cnt = { 0, 0 };
            kv_view(&c->kv, il, h, pos[i] + 1, &kv);
            const size_t off = (size_t)h * g * d;
            float *po = parts[i] > 1 ? c->rs.attn_parts + (size_t)t * part_floats : NULL;
            int rc = 0;
            if (exact) /* a one-token prefill chunk: attend_prefill_rows' computation */
                attn_dense_group(&kv, c->rs.q + off, g, c->rs.att + off, s.f);
            else if (parts[i] > 1) {
                const attn_step step = decode_step(c, il, h, &kv, po, &s, &cnt);
                rc = c->policy->attend_part(c->policy_state, &c->params.attn, &step, p, po + (size_t)g * d,
                                            staged[i] ? c->rs.attn_shared + (size_t)h * c->rs.shared_floats
                                                       : NULL);
            } else {
                const attn_step step = decode_step(c, il, h, &kv, c->rs.att + off, &s, &cnt);
                rc = c->policy->attend(c->policy_state, &c->params.attn, &step);
            }
            if (rc) decode_failed(c, &failed[i], il, h, err);
#pragma omp atomic
            read[i] += cnt.read;
#pragma omp atomic
            written[i] += cnt.written;
        }
#pragma omp for schedule(static)
        for (int64_t ih = 0; ih < (int64_t)nc * n_kv; ih++) {
            const int i = (int)(ih / n_kv), h = (int)(ih % n_kv);
            if (parts[i] == 1 || failed[i]) continue;
            sparq_context *c = cs[i];
            float *p0 = c->rs.attn_parts + (size_t)h * parts[i] * part_floats;
            float *out = c->rs.att + (size_t)h * g * d, *lse = p0 + (size_t)g * d; /* part 0's, merged into */
            memcpy(out, p0, (size_t)g * d * sizeof *out);
            for (int p = 1; p < parts[i]; p++) {
                const float *pp = p0 + (size_t)p * part_floats;
                attn_merge_part(g, d, out, lse, pp, pp + (size_t)g * d);
            }
            if (staged[i]) {
                attn_kv_view kv;
                attn_counts cnt = { 0, 0 };
                kv_view(&c->kv, il, h, pos[i] + 1, &kv);
                const attn_step step = decode_step(c, il, h, &kv, out, &s, &cnt);
                c->policy->finish(c->policy_state, &c->params.attn, &step,
                                  c->rs.attn_shared + (size_t)h * c->rs.shared_floats);
#pragma omp atomic
                read[i] += cnt.read;
#pragma omp atomic
                written[i] += cnt.written;
            }
        }
    }
    int any_failed = 0;
    const attn_policy *dense = attn_policy_find("dense");
    for (int i = 0; i < nc; i++) {
        sparq_context *c = cs[i];
        any_failed |= failed[i];
        if (failed[i] || exact) continue; /* a prefill is not a decode step's traffic */
        c->stats.elements += read[i] + written[i];
        c->stats.bytes += kv_bytes_of(&c->kv, read[i] + written[i]);
        c->stats.dense_elements += n_kv * dense->transfer_formula(&c->params.attn, pos[i] + 1, d, g);
        c->stats.formula_elements +=
            n_kv * (c->policy->transfer_formula_state
                        ? c->policy->transfer_formula_state(c->policy_state, &c->params.attn, il, pos[i] + 1, d, g)
                        : c->policy->transfer_formula(&c->params.attn, pos[i] + 1, d, g));
    }
    return any_failed ? -1 : 0;
}

/* ---- logits check ---------------------------------------------------------- */

int ctx_check_logits(sparq_context *c, const float *logits, int rows, int64_t first_pos)
{
    const size_t V = (size_t)c->model->hp.n_vocab;
    for (int r = 0; r < rows; r++) {
        const float *x = logits + (size_t)r * V;
        /* inf * 0 and NaN * 0 are NaN, which stays in its lane's sum; 16
         * lanes so that the loop vectorises (one running sum was a chain of
         * dependent adds, ~0.15 ms per row at a 128k vocabulary) */
        float lane[16] = { 0 };
        size_t i = 0;
        for (; i + 16 <= V; i += 16)
            for (int l = 0; l < 16; l++) lane[l] += x[i + l] * 0.0f;
        for (; i < V; i++) lane[0] += x[i] * 0.0f;
        float acc = 0.0f;
        for (int l = 0; l < 16; l++) acc += lane[l];
        if (acc == 0.0f) continue;
        size_t bad = 0;
        while (bad < V && isfinite(x[bad])) bad++;
        return err_set(c->error, sizeof c->error, "non-finite logits at token position %lld (logit %zu is %g): "
                       "the model's weights or activations hold NaN/Inf", (long long)(first_pos + r), bad,
                       bad < V ? (double)x[bad] : 0.0);
    }
    return 0;
}

/* ---- the layer loop --------------------------------------------------------- */

/* for (i = 0; i < count; i++) body, on all threads when par (a prefill's
 * per-token loops, so no serial phase idles the other cores between the
 * products), inline otherwise: an OpenMP region costs ~1 us even when its
 * if() clause is false, and a decode step would pass ~180 of them. */
#define FOR_ROWS(par, i, count, ...)                                                   \
    do {                                                                               \
        if (par) {                                                                     \
            _Pragma("omp parallel for num_threads(c->n_threads) schedule(static)")     \
            for (int64_t i = 0; i < (int64_t)(count); i++) { __VA_ARGS__; }            \
        } else {                                                                       \
            for (int64_t i = 0; i < (int64_t)(count); i++) { __VA_ARGS__; }            \
        }                                                                              \
    } while (0)

/* Biases, optional q/k norms and RoPE of token t's q and k (before kv_write). */
static void qk_finish(const sparq_context *c, const layer_weights *L, int64_t t)
{
    const sparq_model *m = c->model;
    const model_hparams *hp = &m->hp;
    const run_state *rs = &c->rs;
    const int hd = hp->head_dim;
    const size_t q_dim = (size_t)hp->n_head * hd, kv_dim = (size_t)hp->n_kv_head * hd;
    float *q = rs->q + t * q_dim, *k = rs->k + t * kv_dim, *v = rs->v + t * kv_dim;
    /* each bias is optional on its own, as in llama.cpp */
    for (size_t i = 0; L->bq && i < q_dim; i++) q[i] += L->bq[i];
    for (size_t i = 0; L->bk && i < kv_dim; i++) k[i] += L->bk[i];
    for (size_t i = 0; L->bv && i < kv_dim; i++) v[i] += L->bv[i];
    const float *cs = rs->rope_cs + (size_t)t * hp->rope_dim;
    for (int h = 0; h < hp->n_head; h++) {
        if (L->q_norm) rms_norm(q + h * hd, q + h * hd, L->q_norm, hd, hp->rms_eps);
        rope_head(q + h * hd, cs, hp->rope_dim, m->arch->rope_type);
    }
    for (int h = 0; h < hp->n_kv_head; h++) {
        if (L->k_norm) rms_norm(k + h * hd, k + h * hd, L->k_norm, hd, hp->rms_eps);
        rope_head(k + h * hd, cs, hp->rope_dim, m->arch->rope_type);
    }
}

/* decode: the step is a generation step (one token through the policy);
 * otherwise exact causal attention, whatever n is. hidden (or NULL):
 * [n][n_embd], every token's final hidden state after the output norm,
 * what the LM head reads (embeddings pool it). */
static int forward(sparq_context *c, const int32_t *tokens, int n, int decode, float *logits,
                   int all_logits, float *hidden)
{
    const sparq_model *m = c->model;
    const model_hparams *hp = &m->hp;
    run_state *rs = &c->rs;
    const int E = hp->n_embd;
    const size_t kv_dim = (size_t)hp->n_kv_head * hp->head_dim;
    const int64_t pos0 = c->kv.n;

    const int par = n > 1;
    FOR_ROWS(par, t, n, /* token embeddings and rotation angles */
             quant_to_float(m->tok_embd.type,
                            (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes,
                            rs->x + (size_t)t * E, E);
             rope_angles(rs->rope_cs + (size_t)t * hp->rope_dim, pos0 + t, hp, c->rope_factors));

    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];

        /* attention block: x += Wo attn(rope(Wq xn), rope(Wk xn), Wv xn);
         * fused Q/K/V (phi3) arrive as three row views of one tensor */
        FOR_ROWS(par, t, n, rms_norm(rs->xn + (size_t)t * E, rs->x + (size_t)t * E, L->attn_norm, E, hp->rms_eps));
        const weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
        float *const qkv_out[3] = { rs->q, rs->k, rs->v };
        model_matmul_group(c, rs->xn, n, 3, qkv, qkv_out);
        FOR_ROWS(par, t, n, qk_finish(c, L, t));
        for (int t = 0; t < n; t++) /* in order: the cache's running V sum depends on it */
            kv_write(&c->kv, il, pos0 + t, rs->k + t * kv_dim, rs->v + t * kv_dim);
        if (decode) {
            if (attend_decode_many(&c, 1, il, &pos0, c->n_threads, 0)) return -1; /* the cache's n is unchanged */
        } else if (n <= PREFILL_ROWS_MAX && !c->policy->observe_prefill &&
                   (!c->pf || attn_pf_sparse_exact(c->pf, pos0 + n - 1))) {
            attend_prefill_rows(c, il, pos0, n);
        } else if (attend_prefill(c, il, pos0, n)) {
            return -1;
        }
        model_matmul(c, rs->xn, rs->att, n, &L->wo);
        FOR_ROWS(par, i, (size_t)n * E, rs->x[i] += rs->xn[i]);

        /* feed-forward block: x += Wdown (silu(Wgate xn) * Wup xn); phi3's
         * gate and up are the two halves of its ffn_up tensor */
        FOR_ROWS(par, t, n, rms_norm(rs->xn + (size_t)t * E, rs->x + (size_t)t * E, L->ffn_norm, E, hp->rms_eps));
        const weight *gate_up[2] = { &L->w_gate, &L->w_up };
        float *const gate_up_out[2] = { rs->gate, rs->up };
        model_matmul_group(c, rs->xn, n, 2, gate_up, gate_up_out);
        FOR_ROWS(par, t, n, silu_mul_row(rs->gate + (size_t)t * hp->n_ff, rs->up + (size_t)t * hp->n_ff, hp->n_ff));
        model_matmul(c, rs->xn, rs->gate, n, &L->w_down);
        FOR_ROWS(par, i, (size_t)n * E, rs->x[i] += rs->xn[i]);
    }
    c->kv.n += n;
    if (hidden) {
        FOR_ROWS(par, t, n, rms_norm(hidden + (size_t)t * E, rs->x + (size_t)t * E, m->output_norm, E, hp->rms_eps));
    }
    if (!logits) return 0;

    /* final norm and LM head, for the last row or every row */
    const int first = all_logits ? 0 : n - 1, rows = n - first;
    for (int t = first; t < n; t++)
        rms_norm(rs->xn + (size_t)(t - first) * E, rs->x + (size_t)t * E, m->output_norm, E, hp->rms_eps);
    model_matmul(c, logits, rs->xn, rows, &m->output);
    return 0;
}

/* prefill: exact attention even for a single token (a prompt's last chunk) */
static int eval(sparq_context *c, const int32_t *tokens, int n, float *logits, int all_logits,
                int prefill, float *hidden)
{
    const int n_vocab = c->model->hp.n_vocab;
    c->error[0] = 0;
    if (n <= 0) {
        return err_set(c->error, sizeof c->error, "eval: no tokens");
    }
    if (c->kv.n + n > c->kv.cap) {
        return err_set(c->error, sizeof c->error,
                       "context full: %lld tokens in cache + %d new exceed the context size %lld (-c)",
                       (long long)c->kv.n, n, (long long)c->kv.cap);
    }
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return err_set(c->error, sizeof c->error, "eval: token id %d at index %d is outside [0, %d)",
                           tokens[i], i, n_vocab);
        }
    }
    for (int done = 0; done < n;) {
        if (c->params.abort_flag && *c->params.abort_flag) {
            return err_set(c->error, sizeof c->error, "eval: aborted");
        }
        /* SPARQ_PREFILL_POLICY: one token at a time, each a decode step */
        const int stepwise = c->params.prefill.mode == SPARQ_PREFILL_POLICY && !prefill;
        int nb = stepwise ? 1 : n - done < c->rs.n_batch ? n - done : c->rs.n_batch;
        int last = done + nb == n;
        float *out = NULL;
        if (all_logits) out = logits + (size_t)done * n_vocab;
        else if (last && logits) out = c->rs.logits;
        const int decode = (n == 1 && !prefill) || stepwise;
        if (forward(c, tokens + done, nb, decode, out, all_logits,
                    hidden ? hidden + (size_t)done * c->model->hp.n_embd : NULL))
            return -1;
        if (out && ctx_check_logits(c, out, all_logits ? nb : 1, all_logits ? c->kv.n - nb : c->kv.n - 1))
            return -1; /* NaN/Inf weights or activations: say where, never decode garbage */
        if (decode) c->stats.steps++;
        if (last && logits && !all_logits) memcpy(logits, c->rs.logits, (size_t)n_vocab * sizeof(float));
        done += nb;
        ctx_file_progress(c);
        if (c->params.progress && n > 1 && (!stepwise || last)) c->params.progress(c->params.progress_user, done, n);
    }
    return 0;
}

int sparq_eval(sparq_context *c, const int32_t *tokens, int n, float *logits)
{
    return eval(c, tokens, n, logits, 0, 0, NULL);
}

int sparq_eval_prefill(sparq_context *c, const int32_t *tokens, int n, float *logits)
{
    return eval(c, tokens, n, logits, 0, 1, NULL);
}

int sparq_eval_prefill_all(sparq_context *c, const int32_t *tokens, int n, float *logits_all)
{
    return eval(c, tokens, n, logits_all, 1, 1, NULL);
}

int sparq_eval_all(sparq_context *c, const int32_t *tokens, int n, float *logits_all)
{
    return eval(c, tokens, n, logits_all, 1, 0, NULL);
}

int ctx_eval_hidden(sparq_context *c, const int32_t *tokens, int n, float *hidden)
{
    return eval(c, tokens, n, NULL, 0, 1, hidden);
}

/* ---- batched decode ------------------------------------------------------- */

/* The B-row activations of one batched step (allocated per call). */
typedef struct batch_rows {
    float   *x, *xn, *q, *k, *v, *att, *gate, *up;
    int64_t *pos;           /* each sequence's new position           */
    uint8_t *xq;
    size_t   xq_row_bytes;
} batch_rows;

/* outs[i][t][n_out] = W_i in[t] for the n rows of the batch, computed
 * exactly as a lone decode step computes it (model_matmul_group with
 * n == 1), so a sequence's result does not depend on its batch. Packed
 * weights: one GEMM of the n tokens, whose tiles give each (row, token) the
 * same operations at any n. Others: one quant_dot per (row, token), with
 * the rows as the outer loop, so each row is read from memory once per step
 * and meets every sequence's activations while it sits in L1. */
static void batch_matmul_group(int n_threads, batch_rows *b, const float *in, int n, int n_w,
                               const weight *const *ws, float *const *outs)
{
    if (group_splits(n_w, ws)) {
        for (int j = 0; j < n_w; j++) batch_matmul_group(n_threads, b, in, n, 1, ws + j, outs + j);
        return;
    }
    if (ws[0]->packed) {
        matmul_repacked(n_threads, b->xq, in, n, n_w, ws, outs);
        return;
    }
    const int vdt = quant_traits_of(ws[0]->type)->vec_dot_type;
    const int64_t n_in = ws[0]->n_in;
    size_t x_stride;
    const uint8_t *xq = convert_activations(n_threads, b->xq, b->xq_row_bytes, in, n, n_in, vdt, &x_stride);
    enum { CHUNK = 16 };
    int64_t first_chunk[5] = { 0 };
    for (int i = 0; i < n_w; i++) first_chunk[i + 1] = first_chunk[i] + (ws[i]->n_out + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t ch = 0; ch < first_chunk[n_w]; ch++) {
        int i = 0;
        while (ch >= first_chunk[i + 1]) i++;
        const weight *w = ws[i];
        const int64_t r0 = (ch - first_chunk[i]) * CHUNK;
        const int nr = (int)(w->n_out - r0 < CHUNK ? w->n_out - r0 : CHUNK);
        for (int r = 0; r < nr; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + r) * w->row_bytes;
            for (int t = 0; t < n; t++)
                outs[i][(size_t)t * w->n_out + r0 + r] = quant_dot(w->type, row, xq + (size_t)t * x_stride, n_in);
        }
    }
}

static void batch_matmul(int n_threads, batch_rows *b, float *out, const float *in, int n, const weight *w)
{
    batch_matmul_group(n_threads, b, in, n, 1, &w, &out);
}

static void batch_rows_free(batch_rows *b)
{
    free(b->x); free(b->xn); free(b->q); free(b->k); free(b->v); free(b->att);
    free(b->gate); free(b->up); free(b->xq); free(b->pos);
}

static int batch_rows_alloc(batch_rows *b, const model_hparams *hp, int n)
{
    memset(b, 0, sizeof *b);
    const size_t N = (size_t)n, q_dim = (size_t)hp->n_head * hp->head_dim;
    const size_t kv_dim = (size_t)hp->n_kv_head * hp->head_dim;
    b->xq_row_bytes = model_act_row_bytes(hp);
    b->x = malloc(N * hp->n_embd * sizeof(float));
    b->xn = malloc(N * hp->n_embd * sizeof(float));
    b->q = malloc(N * q_dim * sizeof(float));
    b->k = malloc(N * kv_dim * sizeof(float));
    b->v = malloc(N * kv_dim * sizeof(float));
    b->att = malloc(N * q_dim * sizeof(float));
    b->gate = malloc(N * hp->n_ff * sizeof(float));
    b->up = malloc(N * hp->n_ff * sizeof(float));
    b->pos = malloc(N * sizeof *b->pos);
    if (posix_memalign((void **)&b->xq, 64, N * b->xq_row_bytes)) b->xq = NULL;
    if (!b->x || !b->xn || !b->q || !b->k || !b->v || !b->att || !b->gate || !b->up || !b->xq || !b->pos) {
        batch_rows_free(b);
        return -1;
    }
    return 0;
}

/* Puts msg into every context's error (the caller may look at any). */
static int batch_fail(sparq_context **ctxs, int n, const char *msg)
{
    for (int i = 0; i < n; i++)
        if (ctxs[i] && ctxs[i]->error != msg) err_set(ctxs[i]->error, sizeof ctxs[i]->error, "%s", msg);
    return -1;
}

static int decode_batch(sparq_context **ctxs, const int32_t *tokens, int n, float *logits, int exact)
{
    char msg[256];
    if (n <= 0 || !ctxs || !tokens || !ctxs[0]) return -1;
    const sparq_model *m = ctxs[0]->model;
    const model_hparams *hp = &m->hp;
    for (int i = 0; i < n; i++) {
        const sparq_context *c = ctxs[i];
        if (!c || c->model != m) {
            snprintf(msg, sizeof msg, "decode_batch: context %d %s", i, c ? "belongs to another model" : "is NULL");
            return batch_fail(ctxs, i, msg);
        }
        for (int j = 0; j < i; j++)
            if (ctxs[j] == c) {
                snprintf(msg, sizeof msg, "decode_batch: contexts %d and %d are the same sequence", j, i);
                return batch_fail(ctxs, n, msg);
            }
        if (c->kv.n + 1 > c->kv.cap) {
            snprintf(msg, sizeof msg, "context full: sequence %d has %lld tokens in a context of %lld", i,
                     (long long)c->kv.n, (long long)c->kv.cap);
            return batch_fail(ctxs, n, msg);
        }
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            snprintf(msg, sizeof msg, "decode_batch: token id %d of sequence %d is outside [0, %d)", tokens[i],
                     i, hp->n_vocab);
            return batch_fail(ctxs, n, msg);
        }
        if (exact && c->policy->observe_prefill) { /* its state needs the prefill's own attention */
            snprintf(msg, sizeof msg, "eval_prefill_batch: sequence %d's policy (%s) observes the prefill; "
                     "use sparq_eval_prefill", i, c->policy->name);
            return batch_fail(ctxs, n, msg);
        }
    }
    batch_rows b;
    if (batch_rows_alloc(&b, hp, n)) return batch_fail(ctxs, n, "decode_batch: out of memory");
    for (int i = 0; i < n; i++) ctxs[i]->error[0] = 0;
    const int nt = ctxs[0]->n_threads;
    int nt_attn = nt; /* attention uses each context's per-thread scratch */
    for (int i = 0; i < n; i++) {
        if (ctxs[i]->n_threads < nt_attn) nt_attn = ctxs[i]->n_threads;
        b.pos[i] = ctxs[i]->kv.n;
    }
    const int E = hp->n_embd, hd = hp->head_dim;
    const size_t q_dim = (size_t)hp->n_head * hd, kv_dim = (size_t)hp->n_kv_head * hd;
    int rc = 0;

    for (int t = 0; t < n; t++) { /* embeddings; each sequence's angles at its own position */
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        quant_to_float(m->tok_embd.type, row, b.x + (size_t)t * E, E);
        rope_angles(ctxs[t]->rs.rope_cs, ctxs[t]->kv.n, hp, ctxs[t]->rope_factors);
    }
    for (int il = 0; il < hp->n_layer && !rc; il++) {
        const layer_weights *L = &m->layers[il];
        for (int t = 0; t < n; t++)
            rms_norm(b.xn + (size_t)t * E, b.x + (size_t)t * E, L->attn_norm, E, hp->rms_eps);
        const weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
        float *const qkv_out[3] = { b.q, b.k, b.v };
        batch_matmul_group(nt, &b, b.xn, n, 3, qkv, qkv_out);
        /* per sequence: the same row operations as forward(), then each
         * sequence's own attention policy over its own cache, all at once.
         * Threads share the sequences: storing a position writes one K^T
         * column, d scattered cache lines per KV head (a miss each);
         * handed out one by one, as the attention tasks below are */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (n > 1)
        for (int t = 0; t < n; t++) {
            sparq_context *c = ctxs[t];
            float *q = b.q + t * q_dim, *k = b.k + t * kv_dim, *v = b.v + t * kv_dim;
            for (size_t i = 0; L->bq && i < q_dim; i++) q[i] += L->bq[i];
            for (size_t i = 0; L->bk && i < kv_dim; i++) k[i] += L->bk[i];
            for (size_t i = 0; L->bv && i < kv_dim; i++) v[i] += L->bv[i];
            for (int h = 0; h < hp->n_head; h++) {
                if (L->q_norm) rms_norm(q + h * hd, q + h * hd, L->q_norm, hd, hp->rms_eps);
                rope_head(q + h * hd, c->rs.rope_cs, hp->rope_dim, m->arch->rope_type);
            }
            for (int h = 0; h < hp->n_kv_head; h++) {
                if (L->k_norm) rms_norm(k + h * hd, k + h * hd, L->k_norm, hd, hp->rms_eps);
                rope_head(k + h * hd, c->rs.rope_cs, hp->rope_dim, m->arch->rope_type);
            }
            kv_write(&c->kv, il, c->kv.n, k, v);
            memcpy(c->rs.q, q, q_dim * sizeof(float));
        }
        for (int t0 = 0; t0 < n && !rc; t0 += ATTEND_MANY_MAX) {
            const int nc = n - t0 < ATTEND_MANY_MAX ? n - t0 : ATTEND_MANY_MAX;
            if (attend_decode_many(ctxs + t0, nc, il, b.pos + t0, nt_attn, exact)) {
                int f = t0;
                while (f < t0 + nc - 1 && !ctxs[f]->error[0]) f++;
                rc = batch_fail(ctxs, n, ctxs[f]->error);
            }
        }
        for (int t = 0; t < n && !rc; t++) memcpy(b.att + t * q_dim, ctxs[t]->rs.att, q_dim * sizeof(float));
        if (rc) break;
        batch_matmul(nt, &b, b.xn, b.att, n, &L->wo);
        for (size_t i = 0; i < (size_t)n * E; i++) b.x[i] += b.xn[i];
        for (int t = 0; t < n; t++)
            rms_norm(b.xn + (size_t)t * E, b.x + (size_t)t * E, L->ffn_norm, E, hp->rms_eps);
        const weight *gate_up[2] = { &L->w_gate, &L->w_up };
        float *const gate_up_out[2] = { b.gate, b.up };
        batch_matmul_group(nt, &b, b.xn, n, 2, gate_up, gate_up_out);
        for (int t = 0; t < n; t++) silu_mul_row(b.gate + (size_t)t * hp->n_ff, b.up + (size_t)t * hp->n_ff, hp->n_ff);
        batch_matmul(nt, &b, b.xn, b.gate, n, &L->w_down);
        for (size_t i = 0; i < (size_t)n * E; i++) b.x[i] += b.xn[i];
    }
    if (!rc) {
        for (int t = 0; t < n; t++) {
            ctxs[t]->kv.n++;
            if (!exact) ctxs[t]->stats.steps++;
        }
        if (logits) {
            for (int t = 0; t < n; t++)
                rms_norm(b.xn + (size_t)t * E, b.x + (size_t)t * E, m->output_norm, E, hp->rms_eps);
            batch_matmul(nt, &b, logits, b.xn, n, &m->output);
            /* as in eval: NaN/Inf logits are an error naming the position */
            for (int t = 0; t < n && !rc; t++)
                rc = ctx_check_logits(ctxs[t], logits + (size_t)t * hp->n_vocab, 1, ctxs[t]->kv.n - 1);
        }
    }
    batch_rows_free(&b);
    return rc;
}

int sparq_decode_batch(sparq_context **ctxs, const int32_t *tokens, int n, float *logits)
{
    return decode_batch(ctxs, tokens, n, logits, 0);
}

int sparq_eval_prefill_batch(sparq_context **ctxs, const int32_t *tokens, int n, float *logits)
{
    return decode_batch(ctxs, tokens, n, logits, 1);
}
