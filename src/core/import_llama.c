/* import_llama.c - a KV cache prefilled by llama.cpp becomes a sparq KV file.
 *
 * The paper's "rent a GPU once, query at home": llama.cpp (any backend; the
 * state format does not depend on it) prefills a long document and saves
 * the sequence; here its keys and values are written, row by row, into a
 * KV file built in place (sparq_context_create_in_file), and the file is
 * finished with its indexes exactly as after sparq's own prefill. The keys
 * need no rework beyond undoing llama.cpp's Hadamard rotation of quantized
 * caches (llama_state.h): llama.cpp caches them after RoPE with the pairing
 * of the GGUF's architecture, which is what sparq's forward pass stores.
 */
#include "core/model.h"
#include "io/llama_state.h"
#include "util/err.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static int kv_type_of_state(int ggml_type)
{
    switch (ggml_type) {
    case QT_F16: return SPARQ_KV_F16;
    case QT_Q8_0: return SPARQ_KV_Q8_0;
    default: return SPARQ_KV_F32; /* f32, and bf16 (exact in f32, not in f16) */
    }
}

/* sqrt(sum (a-b)^2 / sum b^2) of the state's layer-0 rows (read with the
 * rotation chunk rot) against ours, own[n][width] */
static double rows_error(llst_file *f, int is_k, int rot, const float *own, int n, int64_t width, float *row)
{
    if (is_k) f->k_rot = rot;
    else f->v_rot = rot;
    double num = 0, den = 0;
    for (int p = 0; p < n; p++) {
        if (is_k) llst_k_row(f, 0, p, row);
        else llst_v_row(f, 0, p, row);
        for (int64_t e = 0; e < width; e++) {
            const double x = row[e] - own[(size_t)p * width + e];
            num += x * x;
            den += (double)own[(size_t)p * width + e] * own[(size_t)p * width + e];
        }
    }
    return den > 0 ? sqrt(num / den) : num > 0 ? INFINITY : 0;
}

/* The state does not say whether llama.cpp rotated its rows (it does for a
 * quantized cache since b8619, unless disabled) nor which model made it.
 * Layer 0's keys and values of the first tokens depend on nothing but the
 * weights, the tokens and RoPE: recompute them and keep the reading of the
 * state that matches; if none does, the state is another model's. */
static int match_first_rows(sparq_model *m, const sparq_context_params *p, llst_file *f, char *err, size_t err_size)
{
    const model_hparams *hp = &m->hp;
    const int d = hp->head_dim, n = f->n_cells < 16 ? (int)f->n_cells : 16;
    const int64_t width = (int64_t)hp->n_kv_head * d;
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = p->n_ctx; /* the same RoPE factors (longrope picks them by n_ctx) */
    cp.n_threads = p->n_threads;
    cp.kv_type = SPARQ_KV_F32;
    sparq_context *c = NULL;
    float *own = malloc((size_t)n * width * 2 * sizeof(float)), *row = malloc((size_t)width * sizeof(float));
    int rc = -1;
    if (!own || !row) {
        err_set(err, err_size, "import: out of memory");
        goto out;
    }
    if (sparq_context_create(m, &cp, &c, err, err_size)) goto out;
    if (sparq_eval(c, f->tokens, n, NULL)) {
        err_set(err, err_size, "import: %s", sparq_context_error(c));
        goto out;
    }
    for (int h = 0; h < hp->n_kv_head; h++) {
        const float *k = kv_k(&c->kv, 0, h), *v = kv_v(&c->kv, 0, h);
        for (int t = 0; t < n; t++) {
            memcpy(own + (size_t)t * width + (size_t)h * d, k + (size_t)t * d, (size_t)d * sizeof(float));
            memcpy(own + (size_t)(n + t) * width + (size_t)h * d, v + (size_t)t * d, (size_t)d * sizeof(float));
        }
    }
    for (int is_k = 1; is_k >= 0; is_k--) {
        const int rot = is_k ? llst_k_rot(f->k_type, d) : llst_v_rot(f->v_type, d);
        const float *ref = own + (is_k ? 0 : (size_t)n * width);
        const double plain = rows_error(f, is_k, 0, ref, n, width, row);
        const double rotated = rot ? rows_error(f, is_k, rot, ref, n, width, row) : INFINITY;
        const double best = plain < rotated ? plain : rotated;
        if (is_k) f->k_rot = plain <= rotated ? 0 : rot;
        else f->v_rot = plain <= rotated ? 0 : rot;
        /* a cache of this model differs by rounding (q8_0: ~1%); another
         * model's, or a wrong rotation, by ~100% */
        if (!(best < 0.1)) {
            err_set(err, err_size,
                    "import: the state's layer-0 %s of its first %d tokens differ from this model's by %.0f%% "
                    "(a state of another model, or of a context size on the other side of its original "
                    "context for scaled RoPE)",
                    is_k ? "keys" : "values", n, 100 * best);
            goto out;
        }
    }
    rc = 0;
out:
    sparq_context_free(c);
    free(own);
    free(row);
    return rc;
}

int sparq_import_llama_state(sparq_model *m, const sparq_context_params *p, const char *state_path,
                             const char *kv_path, const char *indexes, int kv_type, int64_t *n_out, char *err,
                             size_t err_size)
{
    if (n_out) *n_out = 0;
    llst_file f;
    if (llst_open(state_path, &f, err, err_size)) return -1;
    const model_hparams *hp = &m->hp;
    const int64_t width = (int64_t)hp->n_kv_head * hp->head_dim;
    int rc = -1;
    sparq_context *c = NULL;
    if (f.n_layer != hp->n_layer || f.n_embd_k != width || f.n_embd_v != width) {
        err_set(err, err_size,
                "import: the state has %d layers of %lld-wide keys and %lld-wide values; this model has %d layers "
                "of %lld (a state of another model)",
                f.n_layer, (long long)f.n_embd_k, (long long)f.n_embd_v, hp->n_layer, (long long)width);
        goto out;
    }
    if (f.n_tokens < f.n_cells) {
        err_set(err, err_size, "import: the state caches %lld positions but saved %lld token ids",
                (long long)f.n_cells, (long long)f.n_tokens);
        goto out;
    }
    sparq_context_params cp = *p;
    cp.kv_type = kv_type >= 0 ? kv_type : kv_type_of_state(f.k_type);
    /* room for a question and its answer after the document */
    if (cp.n_ctx == 0) cp.n_ctx = f.n_cells + 4096 > hp->n_ctx_train ? f.n_cells + 4096 : hp->n_ctx_train;
    if (cp.n_ctx < f.n_cells) {
        err_set(err, err_size, "import: the state holds %lld positions, more than the context %lld (-c)",
                (long long)f.n_cells, (long long)cp.n_ctx);
        goto out;
    }
    if (match_first_rows(m, &cp, &f, err, err_size)) goto out;
    /* token ids past the cached positions (a sampled token not yet fed)
     * have no keys: the file holds the cached ones */
    if (sparq_context_create_in_file(m, &cp, kv_path, f.tokens, f.n_cells, indexes, 0, &c, err, err_size)) goto out;
    int failed = 0;
#pragma omp parallel num_threads(c->n_threads) reduction(| : failed)
    {
        float *k = malloc((size_t)width * 2 * sizeof(float));
        if (!k) failed = 1;
/* by layer: each layer's V sums belong to one thread */
#pragma omp for schedule(dynamic, 1)
        for (int il = 0; il < hp->n_layer; il++) {
            if (!k) continue;
            float *v = k + width;
            for (int64_t pos = 0; pos < f.n_cells; pos++) {
                llst_k_row(&f, il, pos, k);
                llst_v_row(&f, il, pos, v);
                kv_write(&c->kv, il, pos, k, v);
            }
        }
        free(k);
    }
    if (failed) {
        err_set(err, err_size, "import: out of memory");
        goto out;
    }
    c->kv.n = f.n_cells;
    if (sparq_context_save_kv(c, kv_path, indexes, f.tokens, f.n_cells, err, err_size)) goto out;
    if (n_out) *n_out = f.n_cells;
    rc = 0;
out:
    sparq_context_free(c);
    llst_close(&f);
    return rc;
}
