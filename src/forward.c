/* forward.c - one sequence through the transformer: context creation,
 * batched prefill and single-token decode.
 *
 * Map:
 *   sparq_context_create / _free   KV cache, scratch, attention policy
 *   model_matmul(_group)           threaded W x, ggml-compatible numerics
 *   rms_norm, rope_*, silu         small pure kernels
 *   attend_prefill                 exact causal attention, no S x S matrix
 *   attend_decode                  one token through the attention policy
 *   forward                        the layer loop, reading like the maths
 *   sparq_eval / sparq_eval_all    batching, progress, abort
 */
#include "kvfile.h"
#include "model.h"
#include "quant.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN 64

static void *alloc_aligned(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = ALIGN;
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (posix_memalign(&p, ALIGN, bytes) != 0) return NULL;
    return p;
}

sparq_attn_params sparq_attn_default_params(void)
{
    sparq_attn_params p;
    memset(&p, 0, sizeof p);
    p.policy = "dense";
    p.l = -1;
    return p;
}

sparq_context_params sparq_context_default_params(void)
{
    sparq_context_params p;
    memset(&p, 0, sizeof p);
    p.kv_type = SPARQ_KV_F16;
    p.attn = sparq_attn_default_params();
    return p;
}

/* ---- context ------------------------------------------------------------ */

static void run_state_free(run_state *rs)
{
    free(rs->x); free(rs->xn); free(rs->q); free(rs->k); free(rs->v); free(rs->att);
    free(rs->gate); free(rs->up); free(rs->rope_cs); free(rs->xq); free(rs->logits);
    free(rs->attn_scratch); free(rs->attn_iscratch); free(rs->colsum);
    memset(rs, 0, sizeof *rs);
}

static int run_state_alloc(sparq_context *c, char *err, size_t err_size)
{
    const model_hparams *hp = &c->model->hp;
    run_state *rs = &c->rs;
    const size_t nb = (size_t)rs->n_batch;
    const size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    const size_t kv_dim = (size_t)hp->n_kv_head * hp->head_dim;
    size_t max_in = (size_t)hp->n_embd;
    if ((size_t)hp->n_ff > max_in) max_in = hp->n_ff;
    if (q_dim > max_in) max_in = q_dim;
    /* Any vec_dot type takes at most 4 bytes per element (F32). */
    rs->xq_row_bytes = (max_in * 4 + ALIGN - 1) / ALIGN * ALIGN;
    const int g = hp->n_head / hp->n_kv_head;
    size_t sf = c->policy->scratch_floats(&c->params.attn, c->kv.cap, hp->head_dim, g);
    size_t dense_sf = (size_t)g * (size_t)c->kv.cap + 64;
    rs->scratch_floats = (sf > dense_sf ? sf : dense_sf);
    rs->scratch_floats = (rs->scratch_floats + 15) / 16 * 16;

    rs->x = alloc_aligned(nb * hp->n_embd * sizeof(float));
    rs->xn = alloc_aligned(nb * hp->n_embd * sizeof(float));
    rs->q = alloc_aligned(nb * q_dim * sizeof(float));
    rs->k = alloc_aligned(nb * kv_dim * sizeof(float));
    rs->v = alloc_aligned(nb * kv_dim * sizeof(float));
    rs->att = alloc_aligned(nb * q_dim * sizeof(float));
    rs->gate = alloc_aligned(nb * hp->n_ff * sizeof(float));
    rs->up = alloc_aligned(nb * hp->n_ff * sizeof(float));
    rs->rope_cs = alloc_aligned(nb * hp->rope_dim * sizeof(float));
    rs->xq = alloc_aligned(nb * rs->xq_row_bytes);
    rs->logits = alloc_aligned(nb * hp->n_vocab * sizeof(float));
    rs->attn_scratch = alloc_aligned((size_t)c->n_threads * rs->scratch_floats * sizeof(float));
    rs->attn_iscratch = alloc_aligned((size_t)c->n_threads * rs->scratch_floats * sizeof(int32_t));
    if (c->policy->needs & ATTN_NEEDS_COLSUM)
        rs->colsum = alloc_aligned((size_t)hp->n_kv_head * c->kv.cap * sizeof(float));
    if (!rs->x || !rs->xn || !rs->q || !rs->k || !rs->v || !rs->att || !rs->gate || !rs->up ||
        !rs->rope_cs || !rs->xq || !rs->logits || !rs->attn_scratch || !rs->attn_iscratch ||
        ((c->policy->needs & ATTN_NEEDS_COLSUM) && !rs->colsum)) {
        snprintf(err, err_size, "context: out of memory for scratch buffers (batch %d, ctx %lld)",
                 rs->n_batch, (long long)c->kv.cap);
        return -1;
    }
    return 0;
}

static void kvf_release(void *f) { kvf_close(f); }

/* kvf != NULL: the cache is the file's private mapping holding its prefix;
 * *kvf_taken tells whether the context now owns kvf (freed with it). */
static int context_create(sparq_model *m, const sparq_context_params *p, kvf_file *kvf,
                          int *kvf_taken, sparq_context **out, char *err, size_t err_size)
{
    *out = NULL;
    *kvf_taken = 0;
    sparq_context *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, err_size, "context: out of memory");
        return -1;
    }
    c->model = m;
    c->params = *p;
    const model_hparams *hp = &m->hp;
    int64_t n_ctx = p->n_ctx > 0 ? p->n_ctx : hp->n_ctx_train;
    c->rope_factors = model_rope_factors(m, n_ctx);
    c->n_threads = p->n_threads > 0 ? p->n_threads : omp_get_num_procs();
    c->rs.n_batch = p->n_batch > 0 ? p->n_batch : 512;
    if (c->rs.n_batch > n_ctx) c->rs.n_batch = (int)n_ctx;
    if (p->kv_type != SPARQ_KV_F16 && p->kv_type != SPARQ_KV_F32) {
        snprintf(err, err_size, "context: unknown KV cache type %d", p->kv_type);
        goto fail;
    }
    const char *name = p->attn.policy ? p->attn.policy : "dense";
    c->policy = attn_policy_find(name);
    if (!c->policy) {
        snprintf(err, err_size, "context: unknown attention policy '%s' (known: %s)", name,
                 attn_policy_names());
        goto fail;
    }
    c->params.attn.policy = c->policy->name;
    if (c->policy->resolve(&c->params.attn, hp->head_dim, err, err_size)) goto fail;
    unsigned needs = c->policy->needs;
    const int elem = p->kv_type == SPARQ_KV_F16 ? KV_F16 : KV_F32;
    if (kvf) {
        if (kv_create_borrowed(&c->kv, hp->n_layer, hp->n_kv_head, hp->head_dim, n_ctx, elem, kvf->k,
                               kvf->v, kvf->kt, kvf->n, kvf->v_sum, !!(needs & ATTN_NEEDS_KT),
                               !!(needs & ATTN_NEEDS_VSUM), kvf, kvf_release, err,
                               err_size))
            goto fail;
        *kvf_taken = 1;
    } else if (kv_create(&c->kv, hp->n_layer, hp->n_kv_head, hp->head_dim, n_ctx, elem,
                         !!(needs & ATTN_NEEDS_KT), !!(needs & ATTN_NEEDS_VSUM), err, err_size)) {
        goto fail;
    }
    attn_shape shape = { hp->n_layer, hp->n_kv_head, hp->n_head / hp->n_kv_head, hp->head_dim, n_ctx };
    if (c->policy->state_create && c->policy->state_create(&c->params.attn, &shape, &c->policy_state)) {
        snprintf(err, err_size, "context: cannot create %s state for context %lld", c->policy->name,
                 (long long)n_ctx);
        goto fail;
    }
    /* a loaded prefix is the prefix; its indexes serve a topk policy */
    if (kvf && c->policy->set_prefix) {
        c->policy->set_prefix(c->policy_state, &c->params.attn, kvf->n, &kvf->source);
        kvf_advise_random(kvf); /* the prefix is read a few gathered rows at a time */
    }
    if (run_state_alloc(c, err, err_size)) goto fail;
    *out = c;
    return 0;
fail:
    sparq_context_free(c);
    return -1;
}

int sparq_context_create(sparq_model *m, const sparq_context_params *p,
                         sparq_context **out, char *err, size_t err_size)
{
    int taken;
    return context_create(m, p, NULL, &taken, out, err, err_size);
}

int sparq_context_load_kv(sparq_model *m, const sparq_context_params *p, const char *path,
                          int verify, sparq_context **out, char *err, size_t err_size)
{
    *out = NULL;
    kvf_fingerprint fp;
    kvf_model_fingerprint(m, &fp);
    kvf_file *f = NULL;
    if (kvf_open(path, &fp, verify == SPARQ_VERIFY_ALWAYS ? KVF_VERIFY_ALWAYS : KVF_VERIFY_AUTO,
                 &f, err, err_size))
        return -1;
    if (p->n_ctx > 0 && p->n_ctx != f->cap) {
        snprintf(err, err_size, "load_kv: '%s' holds a cache of capacity %lld; the context size must be "
                 "0 (the file's) or %lld, not %lld", path, (long long)f->cap, (long long)f->cap,
                 (long long)p->n_ctx);
        kvf_close(f);
        return -1;
    }
    sparq_context_params pp = *p;
    pp.n_ctx = f->cap;
    pp.kv_type = f->elem == KV_F16 ? SPARQ_KV_F16 : SPARQ_KV_F32;
    int taken = 0;
    int rc = context_create(m, &pp, f, &taken, out, err, err_size);
    if (rc && !taken) kvf_close(f);
    return rc;
}

void sparq_context_free(sparq_context *c)
{
    if (!c) return;
    if (c->policy && c->policy->state_free) c->policy->state_free(c->policy_state);
    kv_free(&c->kv);
    run_state_free(&c->rs);
    free(c);
}

int64_t sparq_context_pos(const sparq_context *c) { return c->kv.n; }
int64_t sparq_context_n_ctx(const sparq_context *c) { return c->kv.cap; }
const char *sparq_context_error(const sparq_context *c) { return c->error; }
void sparq_context_attn_stats(const sparq_context *c, sparq_attn_stats *out)
{
    *out = c->stats;
    if (c->policy->stats && c->policy_state) c->policy->stats(c->policy_state, out);
}

void sparq_context_mark_prefix(sparq_context *c)
{
    if (c->policy->set_prefix && c->policy_state)
        c->policy->set_prefix(c->policy_state, &c->params.attn, c->kv.n, NULL);
}

void sparq_context_reset(sparq_context *c)
{
    kv_reset(&c->kv);
    memset(&c->stats, 0, sizeof c->stats);
    if (c->policy->state_create) { /* policy state (e.g. H2O scores) restarts too */
        const model_hparams *hp = &c->model->hp;
        attn_shape shape = { hp->n_layer, hp->n_kv_head, hp->n_head / hp->n_kv_head, hp->head_dim, c->kv.cap };
        if (c->policy->state_free) c->policy->state_free(c->policy_state);
        c->policy_state = NULL;
        c->policy->state_create(&c->params.attn, &shape, &c->policy_state);
    }
}

int sparq_context_fill_random(sparq_context *c, int64_t n, uint64_t seed)
{
    const model_hparams *hp = &c->model->hp;
    if (n < 0 || c->kv.n + n > c->kv.cap) {
        snprintf(c->error, sizeof c->error, "fill: %lld + %lld positions exceed the context %lld",
                 (long long)c->kv.n, (long long)n, (long long)c->kv.cap);
        return -1;
    }
    const int kv_dim = hp->n_kv_head * hp->head_dim;
    const int64_t start = c->kv.n;
#pragma omp parallel num_threads(c->n_threads)
    {
        float *k = malloc((size_t)kv_dim * 2 * sizeof(float));
/* by layer: each layer's V sums belong to one thread */
#pragma omp for schedule(static)
        for (int il = 0; il < hp->n_layer; il++) {
            if (!k) continue;
            float *v = k + kv_dim;
            for (int64_t p = start; p < start + n; p++) {
                uint64_t st = seed ^ ((uint64_t)p * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)il << 56);
                for (int i = 0; i < 2 * kv_dim; i++) { /* sum of 4 uniforms, unit variance */
                    st = st * 6364136223846793005ull + 1442695040888963407ull;
                    uint64_t r = (st ^ (st >> 29)) * 0xBF58476D1CE4E5B9ull;
                    float s = 0;
                    for (int j = 0; j < 4; j++, r >>= 16) s += (float)(r & 0xffff) * (1.0f / 65536.0f);
                    k[i] = (s - 2.0f) * 1.7320508f;
                }
                kv_write(&c->kv, il, p, k, v);
            }
        }
        free(k);
    }
    c->kv.n += n;
    return 0;
}

/* ---- kernels ------------------------------------------------------------ */

/* Converts n activation rows to vec_dot type vdt (once per product group,
 * like ggml's vec_dot_type); returns the rows to feed the dot kernels. */
static const uint8_t *convert_activations(sparq_context *c, const float *in, int n, int64_t n_in,
                                          int vdt, size_t *x_stride)
{
    if (vdt == QT_F32) {
        *x_stride = (size_t)n_in * sizeof(float);
        return (const uint8_t *)in;
    }
    *x_stride = c->rs.xq_row_bytes;
    uint8_t *dst = c->rs.xq;
#pragma omp parallel for num_threads(c->n_threads) schedule(static) if (n > 1)
    for (int t = 0; t < n; t++)
        quant_from_float((uint32_t)vdt, in + (size_t)t * n_in, dst + (size_t)t * (*x_stride), n_in);
    return dst;
}

void model_matmul_group(sparq_context *c, const float *in, int n, int n_w, const weight *const *ws,
                        float *const *outs)
{
    assert(n_w >= 1 && n_w <= 4);
    const int vdt = quant_traits_of(ws[0]->type)->vec_dot_type;
    for (int i = 1; i < n_w; i++) { /* mixed activation types: one product at a time */
        if (quant_traits_of(ws[i]->type)->vec_dot_type != vdt) {
            for (int j = 0; j < n_w; j++) model_matmul_group(c, in, n, 1, ws + j, outs + j);
            return;
        }
    }
    const int64_t n_in = ws[0]->n_in;
    size_t x_stride;
    const uint8_t *xq = convert_activations(c, in, n, n_in, vdt, &x_stride);
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

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- attention ------------------------------------------------------------ */

static attn_scratch thread_scratch(sparq_context *c, int tid)
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
                w[s] = scale * (kv.elem == KV_F16
                                    ? dot_f16_f32((const uint16_t *)kv.K + s * d, q, d)
                                    : dot_f32((const float *)kv.K + s * d, q, d));
                if (w[s] > mx) mx = w[s];
            }
            for (int64_t s = 0; s < S; s++) sum += (w[s] = expf(w[s] - mx));
            for (int64_t s = 0; s < S; s++) colsum[s] += w[s] / sum;
        }
    }
    free(w);
}

/* Exact causal attention for n new tokens at pos0..pos0+n-1: each token and
 * KV head is one group-wide pass over the cache (no S x S matrix). */
static void attend_prefill(sparq_context *c, int il, int64_t pos0, int n)
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

/* One decode step through the policy, all KV heads of layer il. */
static void attend_decode(sparq_context *c, int il, int64_t pos)
{
    const model_hparams *hp = &c->model->hp;
    const int g = hp->n_head / hp->n_kv_head, d = hp->head_dim, n_kv = hp->n_kv_head;
    int64_t read = 0, written = 0;
#pragma omp parallel num_threads(c->n_threads) reduction(+ : read, written)
    {
        attn_scratch s = thread_scratch(c, omp_get_thread_num());
#pragma omp for schedule(static)
        for (int h = 0; h < n_kv; h++) {
            attn_kv_view kv;
            attn_counts cnt = { 0, 0 };
            kv_view(&c->kv, il, h, pos + 1, &kv);
            size_t off = (size_t)h * g * d;
            c->policy->attend(c->policy_state, &c->params.attn, il, h, &kv, c->rs.q + off, g,
                              c->rs.att + off, &s, &cnt);
            read += cnt.read;
            written += cnt.written;
        }
    }
    const attn_policy *dense = attn_policy_find("dense");
    c->stats.elements += read + written;
    c->stats.bytes += (read + written) * (int64_t)c->kv.elem_size;
    c->stats.dense_elements += n_kv * dense->transfer_formula(&c->params.attn, pos + 1, d, g);
    c->stats.formula_elements +=
        n_kv * (c->policy->transfer_formula_state
                    ? c->policy->transfer_formula_state(c->policy_state, &c->params.attn, il, pos + 1, d, g)
                    : c->policy->transfer_formula(&c->params.attn, pos + 1, d, g));
}

/* ---- the layer loop --------------------------------------------------------- */

/* decode: the step is a generation step (one token through the policy);
 * otherwise exact causal attention, whatever n is. */
static void forward(sparq_context *c, const int32_t *tokens, int n, int decode, float *logits,
                    int all_logits)
{
    const sparq_model *m = c->model;
    const model_hparams *hp = &m->hp;
    run_state *rs = &c->rs;
    const int E = hp->n_embd, hd = hp->head_dim;
    const size_t q_dim = (size_t)hp->n_head * hd, kv_dim = (size_t)hp->n_kv_head * hd;
    const int64_t pos0 = c->kv.n;

    for (int t = 0; t < n; t++) { /* token embeddings and rotation angles */
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        quant_to_float(m->tok_embd.type, row, rs->x + (size_t)t * E, E);
        rope_angles(rs->rope_cs + (size_t)t * hp->rope_dim, pos0 + t, hp, c->rope_factors);
    }

    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];

        /* attention block: x += Wo attn(rope(Wq xn), rope(Wk xn), Wv xn);
         * fused Q/K/V (phi3) arrive as three row views of one tensor */
        for (int t = 0; t < n; t++)
            rms_norm(rs->xn + (size_t)t * E, rs->x + (size_t)t * E, L->attn_norm, E, hp->rms_eps);
        const weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
        float *const qkv_out[3] = { rs->q, rs->k, rs->v };
        model_matmul_group(c, rs->xn, n, 3, qkv, qkv_out);
        for (int t = 0; t < n; t++) {
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
            kv_write(&c->kv, il, pos0 + t, k, v);
        }
        if (decode) attend_decode(c, il, pos0);
        else attend_prefill(c, il, pos0, n);
        model_matmul(c, rs->xn, rs->att, n, &L->wo);
        for (size_t i = 0; i < (size_t)n * E; i++) rs->x[i] += rs->xn[i];

        /* feed-forward block: x += Wdown (silu(Wgate xn) * Wup xn); phi3's
         * gate and up are the two halves of its ffn_up tensor */
        for (int t = 0; t < n; t++)
            rms_norm(rs->xn + (size_t)t * E, rs->x + (size_t)t * E, L->ffn_norm, E, hp->rms_eps);
        const weight *gate_up[2] = { &L->w_gate, &L->w_up };
        float *const gate_up_out[2] = { rs->gate, rs->up };
        model_matmul_group(c, rs->xn, n, 2, gate_up, gate_up_out);
        for (size_t i = 0; i < (size_t)n * hp->n_ff; i++) rs->gate[i] = silu(rs->gate[i]) * rs->up[i];
        model_matmul(c, rs->xn, rs->gate, n, &L->w_down);
        for (size_t i = 0; i < (size_t)n * E; i++) rs->x[i] += rs->xn[i];
    }
    c->kv.n += n;
    if (!logits) return;

    /* final norm and LM head, for the last row or every row */
    const int first = all_logits ? 0 : n - 1, rows = n - first;
    for (int t = first; t < n; t++)
        rms_norm(rs->xn + (size_t)(t - first) * E, rs->x + (size_t)t * E, m->output_norm, E, hp->rms_eps);
    model_matmul(c, logits, rs->xn, rows, &m->output);
}

static int eval(sparq_context *c, const int32_t *tokens, int n, float *logits, int all_logits)
{
    const int n_vocab = c->model->hp.n_vocab;
    c->error[0] = 0;
    if (n <= 0) {
        snprintf(c->error, sizeof c->error, "eval: no tokens");
        return -1;
    }
    if (c->kv.n + n > c->kv.cap) {
        snprintf(c->error, sizeof c->error,
                 "context full: %lld tokens in cache + %d new exceed the context size %lld (-c)",
                 (long long)c->kv.n, n, (long long)c->kv.cap);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            snprintf(c->error, sizeof c->error, "eval: token id %d at index %d is outside [0, %d)",
                     tokens[i], i, n_vocab);
            return -1;
        }
    }
    for (int done = 0; done < n;) {
        if (c->params.abort_flag && *c->params.abort_flag) {
            snprintf(c->error, sizeof c->error, "eval: aborted");
            return -1;
        }
        int nb = n - done < c->rs.n_batch ? n - done : c->rs.n_batch;
        int last = done + nb == n;
        float *out = NULL;
        if (all_logits) out = logits + (size_t)done * n_vocab;
        else if (last && logits) out = c->rs.logits;
        forward(c, tokens + done, nb, n == 1, out, all_logits);
        if (n == 1) c->stats.steps++;
        if (last && logits && !all_logits) memcpy(logits, c->rs.logits, (size_t)n_vocab * sizeof(float));
        done += nb;
        if (c->params.progress && n > 1) c->params.progress(c->params.progress_user, done, n);
    }
    return 0;
}

int sparq_eval(sparq_context *c, const int32_t *tokens, int n, float *logits)
{
    return eval(c, tokens, n, logits, 0);
}

int sparq_eval_all(sparq_context *c, const int32_t *tokens, int n, float *logits_all)
{
    return eval(c, tokens, n, logits_all, 1);
}
