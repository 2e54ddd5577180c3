/* naive_forward.h - a plain double-precision transformer forward pass read
 * straight from a parsed GGUF's F32 tensors, for tests to hold the engine
 * against. It shares nothing with src/forward.c: no quantization, no KV
 * cache, no threads, no batching; each step written the obvious way.
 *
 * What it covers (each taken from the file when present):
 *   Q/K/V      separate attn_{q,k,v}.weight, or fused attn_qkv.weight whose
 *              rows are [q; k; v]; biases attn_{q,k,v}.bias or attn_qkv.bias
 *   q/k norm   per-head RMSNorm attn_{q,k}_norm.weight (qwen3)
 *   RoPE       the first rope_dim dims of each head; NEOX pairs (i, i+n/2)
 *              or normal pairs (2i, 2i+1); angle pos * base^(-2i/n) / f_i
 *              with optional divisors f (llama3 / longrope tables); cos and
 *              sin times attn_factor (longrope's magnitude scaling)
 *   attention  causal, grouped-query, softmax(q.k / sqrt(hd)) over all
 *              earlier positions (no sliding window)
 *   FFN        silu(gate) * up: separate ffn_gate / ffn_up, or fused ffn_up
 *              with 2*n_ff rows, gate first (llama.cpp's swiglu)
 *   output     output.weight, or token_embd.weight when tied
 *
 * Usage: nf_model r; nf_open(&r, gguf); (adjust r.rope_factors etc.);
 *        nf_forward(&r, tokens, n, logits[n][n_vocab]).
 * Also: nf_file_open / nf_file_close to do that on a file by path,
 * nf_max_diff / nf_rms to compare logits, nf_edit_copy to write a copy of
 * a GGUF with some F32 tensors changed (the tests' patched files), and
 * nf_engine_logits: the other side of the comparison, sparq's own logits
 * through the public API.
 */
#ifndef SPARQ_NAIVE_FORWARD_H
#define SPARQ_NAIVE_FORWARD_H

#include "tensor/gguf.h"
#include "sparq.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct nf_model {
    const gguf_file *f;
    int n_embd, n_layer, n_head, n_kv, hd, n_ff, n_vocab, rope_dim;
    int neox;                   /* 1: pairs (i, i + rope_dim/2)              */
    double eps, base, attn_factor;
    const float *rope_factors;  /* [rope_dim/2] angle divisors or NULL; the
                                   caller picks (nf_open takes rope_freqs)   */
} nf_model;

/* An F32 tensor of exactly n elements, or NULL. */
static inline const float *nf_tensor(const nf_model *r, const char *name, int64_t n)
{
    const gguf_tensor *t = gguf_find_tensor(r->f, name);
    if (!t || t->type != 0) return NULL;
    int64_t total = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) total *= t->ne[i];
    return total == n ? t->data : NULL;
}

static inline const float *nf_layer(const nf_model *r, int il, const char *suffix, int64_t n)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return nf_tensor(r, name, n);
}

static inline int64_t nf_meta_int(const gguf_file *f, const char *arch, const char *key, int64_t def)
{
    char k[128];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return gguf_get_int(f, k, &v) == 1 ? v : def;
}

static inline double nf_meta_float(const gguf_file *f, const char *arch, const char *key, double def)
{
    char k[128];
    double v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return gguf_get_float(f, k, &v) == 1 ? v : def;
}

/* Reads the hyper-parameters; 0, or -1 if the file lacks one. */
static inline int nf_open(nf_model *r, const gguf_file *f)
{
    gguf_str a;
    char arch[32];
    memset(r, 0, sizeof *r);
    if (gguf_get_str(f, "general.architecture", &a) != 1 || a.len >= sizeof arch) return -1;
    snprintf(arch, sizeof arch, "%.*s", (int)a.len, a.data);
    r->f = f;
    r->n_embd = (int)nf_meta_int(f, arch, "embedding_length", 0);
    r->n_layer = (int)nf_meta_int(f, arch, "block_count", 0);
    r->n_head = (int)nf_meta_int(f, arch, "attention.head_count", 0);
    r->n_kv = (int)nf_meta_int(f, arch, "attention.head_count_kv", r->n_head);
    r->hd = (int)nf_meta_int(f, arch, "attention.key_length", r->n_head ? r->n_embd / r->n_head : 0);
    r->rope_dim = (int)nf_meta_int(f, arch, "rope.dimension_count", r->hd);
    r->n_ff = (int)nf_meta_int(f, arch, "feed_forward_length", 0);
    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    r->n_vocab = te ? (int)te->ne[1] : 0;
    r->neox = strcmp(arch, "llama") != 0; /* llama.cpp's rope type per arch */
    r->eps = nf_meta_float(f, arch, "attention.layer_norm_rms_epsilon", 1e-5);
    r->base = nf_meta_float(f, arch, "rope.freq_base", 10000.0);
    r->attn_factor = nf_meta_float(f, arch, "rope.scaling.attn_factor", 1.0);
    r->rope_factors = nf_tensor(r, "rope_freqs.weight", r->rope_dim / 2);
    return r->n_embd && r->n_layer && r->n_head && r->hd && r->n_ff && r->n_vocab ? 0 : -1;
}

static inline void nf_rmsnorm(double *out, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * s * (w ? w[i] : 1.0);
}

/* y[n_out] = W x (+ b), W row-major [n_out][n_in] */
static inline void nf_matvec(double *y, const float *W, const float *b, const double *x, int n_out, int n_in)
{
    for (int o = 0; o < n_out; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < n_in; i++) s += (double)W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

static inline void nf_rope(const nf_model *r, double *v, int pos)
{
    const int half = r->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double th = pos * pow(r->base, -2.0 * i / r->rope_dim);
        if (r->rope_factors) th /= r->rope_factors[i];
        const double c = cos(th) * r->attn_factor, s = sin(th) * r->attn_factor;
        const int ia = r->neox ? i : 2 * i, ib = r->neox ? i + half : 2 * i + 1;
        const double a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = a * s + b * c;
    }
}

/* One layer's matrices as plain pointers, fused tensors split by rows. */
typedef struct nf_layer_w {
    const float *an, *fn, *wq, *wk, *wv, *wo, *wg, *wu, *wd, *bq, *bk, *bv, *qn, *kn;
} nf_layer_w;

static inline int nf_layer_weights(const nf_model *r, int il, nf_layer_w *w)
{
    const int64_t E = r->n_embd, qd = (int64_t)r->n_head * r->hd, kvd = (int64_t)r->n_kv * r->hd, F = r->n_ff;
    memset(w, 0, sizeof *w);
    w->an = nf_layer(r, il, "attn_norm.weight", E);
    w->fn = nf_layer(r, il, "ffn_norm.weight", E);
    w->wo = nf_layer(r, il, "attn_output.weight", E * qd);
    w->wd = nf_layer(r, il, "ffn_down.weight", E * F);
    const float *qkv = nf_layer(r, il, "attn_qkv.weight", (qd + 2 * kvd) * E);
    if (qkv) {
        w->wq = qkv, w->wk = qkv + qd * E, w->wv = qkv + (qd + kvd) * E;
        const float *b = nf_layer(r, il, "attn_qkv.bias", qd + 2 * kvd);
        if (b) w->bq = b, w->bk = b + qd, w->bv = b + qd + kvd;
    } else {
        w->wq = nf_layer(r, il, "attn_q.weight", qd * E);
        w->wk = nf_layer(r, il, "attn_k.weight", kvd * E);
        w->wv = nf_layer(r, il, "attn_v.weight", kvd * E);
        w->bq = nf_layer(r, il, "attn_q.bias", qd);
        w->bk = nf_layer(r, il, "attn_k.bias", kvd);
        w->bv = nf_layer(r, il, "attn_v.bias", kvd);
    }
    w->qn = nf_layer(r, il, "attn_q_norm.weight", r->hd);
    w->kn = nf_layer(r, il, "attn_k_norm.weight", r->hd);
    w->wg = nf_layer(r, il, "ffn_gate.weight", F * E);
    if (w->wg) {
        w->wu = nf_layer(r, il, "ffn_up.weight", F * E);
    } else {
        const float *gu = nf_layer(r, il, "ffn_up.weight", 2 * F * E);
        if (gu) w->wg = gu, w->wu = gu + F * E;
    }
    return w->an && w->fn && w->wo && w->wd && w->wq && w->wk && w->wv && w->wg && w->wu ? 0 : -1;
}

/* logits[n][n_vocab] for tokens[n] at positions 0..n-1; 0, or -1 when a
 * tensor is missing or not F32, or memory runs out. */
static inline int nf_forward(const nf_model *r, const int32_t *tokens, int n, float *logits)
{
    const int E = r->n_embd, hd = r->hd, qd = r->n_head * hd, kvd = r->n_kv * hd, F = r->n_ff;
    const int big = E > F ? (E > r->n_vocab ? E : r->n_vocab) : (F > r->n_vocab ? F : r->n_vocab);
    double *x = calloc((size_t)n * E, sizeof *x), *xn = malloc((size_t)big * sizeof *xn);
    double *q = malloc((size_t)n * qd * sizeof *q), *k = malloc((size_t)n * kvd * sizeof *k);
    double *v = malloc((size_t)n * kvd * sizeof *v), *att = malloc((size_t)qd * sizeof *att);
    double *g = malloc((size_t)F * sizeof *g), *u = malloc((size_t)F * sizeof *u);
    double *y = malloc((size_t)big * sizeof *y), *p = malloc((size_t)n * sizeof *p);
    int rc = -1;
    const float *emb = nf_tensor(r, "token_embd.weight", (int64_t)E * r->n_vocab);
    const float *out_w = nf_tensor(r, "output.weight", (int64_t)E * r->n_vocab);
    const float *out_norm = nf_tensor(r, "output_norm.weight", E);
    if (!x || !xn || !q || !k || !v || !att || !g || !u || !y || !p || !emb || !out_norm) goto done;
    if (!out_w) out_w = emb; /* tied */
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = emb[(size_t)tokens[t] * E + i];
    for (int il = 0; il < r->n_layer; il++) {
        nf_layer_w w;
        if (nf_layer_weights(r, il, &w)) goto done;
        for (int t = 0; t < n; t++) { /* q, k, v of every position */
            double *qt = q + (size_t)t * qd, *kt = k + (size_t)t * kvd, *vt = v + (size_t)t * kvd;
            nf_rmsnorm(xn, x + (size_t)t * E, w.an, E, r->eps);
            nf_matvec(qt, w.wq, w.bq, xn, qd, E);
            nf_matvec(kt, w.wk, w.bk, xn, kvd, E);
            nf_matvec(vt, w.wv, w.bv, xn, kvd, E);
            for (int h = 0; h < r->n_head; h++) {
                if (w.qn) nf_rmsnorm(qt + h * hd, qt + h * hd, w.qn, hd, r->eps);
                nf_rope(r, qt + h * hd, t);
            }
            for (int h = 0; h < r->n_kv; h++) {
                if (w.kn) nf_rmsnorm(kt + h * hd, kt + h * hd, w.kn, hd, r->eps);
                nf_rope(r, kt + h * hd, t);
            }
        }
        for (int t = 0; t < n; t++) { /* causal attention, then Wo */
            for (int h = 0; h < r->n_head; h++) {
                const int kh = h / (r->n_head / r->n_kv);
                const double *qh = q + (size_t)t * qd + h * hd;
                double mx = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += qh[i] * k[(size_t)s * kvd + kh * hd + i];
                    p[s] = d / sqrt((double)hd);
                    mx = fmax(mx, p[s]);
                }
                for (int s = 0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += p[s] / sum * v[(size_t)s * kvd + kh * hd + i];
                    att[h * hd + i] = a;
                }
            }
            nf_matvec(y, w.wo, NULL, att, E, qd);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += y[i];
        }
        for (int t = 0; t < n; t++) { /* SwiGLU feed-forward */
            nf_rmsnorm(xn, x + (size_t)t * E, w.fn, E, r->eps);
            nf_matvec(g, w.wg, NULL, xn, F, E);
            nf_matvec(u, w.wu, NULL, xn, F, E);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            nf_matvec(y, w.wd, NULL, g, E, F);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += y[i];
        }
    }
    for (int t = 0; t < n; t++) {
        nf_rmsnorm(xn, x + (size_t)t * E, out_norm, E, r->eps);
        nf_matvec(y, out_w, NULL, xn, r->n_vocab, E);
        for (int i = 0; i < r->n_vocab; i++) logits[(size_t)t * r->n_vocab + i] = (float)y[i];
    }
    rc = 0;
done:
    free(x); free(xn); free(q); free(k); free(v); free(att); free(g); free(u); free(y); free(p);
    return rc;
}

/* ---- comparing and patching ---------------------------------------------- */

static inline double nf_max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* root mean square of a - b (of a alone when b is NULL) */
static inline double nf_rms(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (b ? b[i] : 0);
        s += d * d;
    }
    return sqrt(s / (double)n);
}

/* Called for every F32 tensor of the copy with its name (NUL-terminated)
 * and writable data; returns 1 if it changed the tensor, else 0. */
typedef int (*nf_edit_fn)(const char *name, const gguf_tensor *t, float *data, void *user);

/* Writes the file at src to dst with edit applied; returns the number of
 * tensors changed, or -1 if src cannot be parsed or dst written. */
static inline int nf_edit_copy(const char *src, const char *dst, nf_edit_fn edit, void *user)
{
    size_t size;
    uint8_t *buf = test_read_file(src, &size);
    gguf_file *f = NULL;
    char err[256];
    int changed = 0;
    if (!buf || gguf_parse(buf, size, &f, err, sizeof err)) {
        free(buf);
        return -1;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        if (t->type == 0) /* views into buf, our own copy: writable */
            changed += edit(name, t, (float *)(buf + ((const uint8_t *)t->data - buf)), user);
    }
    gguf_close(f);
    FILE *o = fopen(dst, "wb");
    if (!o || fwrite(buf, 1, size, o) != size) changed = -1;
    if (o) fclose(o);
    free(buf);
    return changed;
}

/* ---- files and the engine ------------------------------------------------- */

/* A GGUF read into memory with its reference model. */
typedef struct nf_file {
    uint8_t   *img;
    gguf_file *gf;
    nf_model   r;
} nf_file;

/* 0, or -1 (a failed CHECK) if the file cannot be read as a model; call
 * nf_file_close either way. */
static inline int nf_file_open(nf_file *nf, const char *path)
{
    size_t size;
    char msg[256];
    memset(nf, 0, sizeof *nf);
    nf->img = test_read_file(path, &size);
    if (!nf->img || gguf_parse(nf->img, size, &nf->gf, msg, sizeof msg) || nf_open(&nf->r, nf->gf)) {
        CHECK(0, "reference cannot read %s", path);
        return -1;
    }
    return 0;
}

static inline void nf_file_close(nf_file *nf)
{
    gguf_close(nf->gf);
    free(nf->img);
}

/* sparq's logits [n][n_vocab] of tokens at positions 0.. (F32 KV cache, one
 * thread, a context of n_ctx): all rows from one prefill, or (one_by_one)
 * one decode step per token. NULL (a failed CHECK) on failure; *n_vocab,
 * unless NULL, gets the row length. */
static inline float *nf_engine_logits(const char *path, const int32_t *tokens, int n, int64_t n_ctx,
                                      int one_by_one, int *n_vocab)
{
    char err[512];
    sparq_model *m = NULL;
    sparq_context *c = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load %s: %s", path, err);
        return NULL;
    }
    const int V = sparq_model_n_vocab(m);
    if (n_vocab) *n_vocab = V;
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 1;
    cp.kv_type = SPARQ_KV_F32;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    int rc = !logits || sparq_context_create(m, &cp, &c, err, sizeof err);
    for (int t = 0; !rc && one_by_one && t < n; t++) rc = sparq_eval(c, tokens + t, 1, logits + (size_t)t * V);
    if (!rc && !one_by_one) rc = sparq_eval_all(c, tokens, n, logits);
    if (rc) {
        CHECK(0, "eval %s: %s", path, c ? sparq_context_error(c) : err);
        free(logits);
        logits = NULL;
    }
    sparq_context_free(c);
    sparq_model_free(m);
    return logits;
}

#endif
