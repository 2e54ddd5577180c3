/* model.c - loading a llama-family GGUF: architecture table, hyper-
 * parameters, and weight views, each validated before use.
 *
 * Map:
 *   arch_table / arch_find     one row per supported architecture
 *   read_hparams               <arch>.* metadata -> model_hparams
 *   bind_matrix / bind_vector  tensor lookup + shape/type checks
 *   bind_layer, row_view       one block's tensors; fused ones as row views
 *   bind_rope_factors          rope_freqs, or the longrope tables
 *   model_rope_factors         which table a context uses
 *   check_all_used             no tensor of the file left unbound
 *   sparq_model_load           the whole load, one cleanup path
 */
#include "core/chat.h"
#include "core/model.h"
#include "util/err.h"
#include "util/paths.h"
#include "tensor/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* phi3 (Phi-3/3.5 mini and medium, Phi-4): fused Q/K/V and gate/up
 * tensors, NEOX RoPE (as llama.cpp rotates it), optional longrope factors.
 * Its files carry phi3.attention.sliding_window (2047 for Phi-3-mini-4k),
 * but llama.cpp deliberately disables Phi SWA (llama.cpp PR 13676) and
 * attends over the whole context; sparq ignores the key too, so its
 * outputs stay those of llama.cpp at every context length. */
static const arch_desc arch_table[] = {
    /* name     rope       bias  qk_norm  fused_qkv  fused_gate_up  rope factors */
    { "llama",  ROPE_NORM, 0,    0,       0,         0,             ROPE_FACTORS_FREQS },
    { "qwen2",  ROPE_NEOX, 1,    0,       0,         0,             ROPE_FACTORS_FREQS },
    { "qwen3",  ROPE_NEOX, 0,    1,       0,         0,             ROPE_FACTORS_FREQS },
    { "phi3",   ROPE_NEOX, 0,    0,       1,         1,             ROPE_FACTORS_LONGROPE },
};

const arch_desc *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (strcmp(arch_table[i].name, name) == 0) return &arch_table[i];
    return NULL;
}

static void arch_names(char *buf, size_t n)
{
    buf[0] = 0;
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", i ? ", " : "", arch_table[i].name);
    }
}

/* ---- hyper-parameters -------------------------------------------------- */

typedef struct loader {
    const gguf_file *f;
    const char *arch;
    char *err;
    size_t err_size;
    uint8_t *used;           /* [f->n_tensors]: bound by some weight view  */
} loader;

/* A tensor by name, marked as used by the model (check_all_used). */
static const gguf_tensor *find_tensor(loader *L, const char *name)
{
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (t && L->used) L->used[t - L->f->tensors] = 1;
    return t;
}

/* Reads integer key "<arch>.<suffix>" into *out within [lo, hi]; absent
 * keys take `def` (def < 0 means required). */
static int arch_int(loader *L, const char *suffix, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    int r = gguf_get_int(L->f, key, out);
    if (r < 0) {
        return err_set(L->err, L->err_size, "model: key %s is not an integer", key);
    }
    if (r == 0) {
        if (def < 0) {
            return err_set(L->err, L->err_size, "model: required key %s is missing", key);
        }
        *out = def;
    }
    if (*out < lo || *out > hi) {
        return err_set(L->err, L->err_size, "model: %s = %lld is outside [%lld, %lld]", key,
                       (long long)*out, (long long)lo, (long long)hi);
    }
    return 0;
}

static int arch_float(loader *L, const char *suffix, double def, double lo, double hi, float *out)
{
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    int r = gguf_get_float(L->f, key, &v);
    if (r < 0) {
        return err_set(L->err, L->err_size, "model: key %s is not a number", key);
    }
    if (r == 0) v = def;
    if (!(v >= lo && v <= hi)) {
        return err_set(L->err, L->err_size, "model: %s = %g is outside [%g, %g]", key, v, lo, hi);
    }
    *out = (float)v;
    return 0;
}

static int read_hparams(loader *L, const arch_desc *arch, model_hparams *hp)
{
    int64_t embd, layers, heads, kv_heads, ff, ctx, hd, rope_dim;
    if (arch_int(L, "embedding_length", -1, 1, 1 << 16, &embd) ||
        arch_int(L, "block_count", -1, 1, 1024, &layers) ||
        arch_int(L, "attention.head_count", -1, 1, 1024, &heads) ||
        arch_int(L, "attention.head_count_kv", heads, 1, heads, &kv_heads) ||
        arch_int(L, "feed_forward_length", -1, 1, 1 << 20, &ff) ||
        arch_int(L, "context_length", 2048, 1, INT64_C(1) << 32, &ctx) ||
        arch_int(L, "attention.key_length", embd / heads, 2, 1024, &hd) ||
        arch_int(L, "rope.dimension_count", hd, 2, hd, &rope_dim))
        return -1;
    if (heads % kv_heads != 0) {
        return err_set(L->err, L->err_size, "model: %lld heads is not a multiple of %lld KV heads",
                       (long long)heads, (long long)kv_heads);
    }
    int64_t vlen;
    if (arch_int(L, "attention.value_length", hd, hd, hd, &vlen)) return -1;
    if (hd % 2 || rope_dim % 2) {
        return err_set(L->err, L->err_size, "model: head size %lld and rope dims %lld must be even",
                       (long long)hd, (long long)rope_dim);
    }
    hp->n_embd = (int)embd;
    hp->n_layer = (int)layers;
    hp->n_head = (int)heads;
    hp->n_kv_head = (int)kv_heads;
    hp->n_ff = (int)ff;
    hp->n_ctx_train = ctx;
    hp->head_dim = (int)hd;
    hp->rope_dim = (int)rope_dim;
    if (arch_float(L, "attention.layer_norm_rms_epsilon", 1e-5, 0, 1, &hp->rms_eps) ||
        arch_float(L, "rope.freq_base", 10000.0, 1e-3, 1e12, &hp->rope_base) ||
        /* any arch, as in llama.cpp; only longrope files carry it */
        arch_float(L, "rope.scaling.attn_factor", 1.0, 1e-3, 1e3, &hp->rope_attn_factor) ||
        arch_int(L, "rope.scaling.original_context_length", ctx, 1, INT64_C(1) << 32, &hp->n_ctx_orig))
        return -1;
    /* Linear RoPE scaling: positions are multiplied by 1/factor. */
    hp->rope_freq_scale = 1.0f;
    char key[128];
    gguf_str st;
    snprintf(key, sizeof key, "%s.rope.scaling.type", L->arch);
    int has_type = gguf_get_str(L->f, key, &st) == 1;
    float factor = 1.0f;
    if (arch_float(L, "rope.scaling.factor", 1.0, 1e-6, 1e6, &factor)) return -1;
    /* phi3's graph in llama.cpp treats "longrope" like "linear": the long
     * and short factor tables do the work (see model_rope_factors). */
    const int longrope = arch->rope_factors == ROPE_FACTORS_LONGROPE && has_type && gguf_str_eq(st, "longrope");
    if (has_type && (gguf_str_eq(st, "linear") || longrope)) {
        hp->rope_freq_scale = 1.0f / factor;
    } else if (has_type && !gguf_str_eq(st, "none") && !gguf_str_eq(st, "llama3")) {
        char shown[64];
        return err_set(L->err, L->err_size, "model: unsupported %s '%s' (linear, llama3 and none are%s)",
                       key, gguf_str_show(st, shown, sizeof shown),
                       arch->rope_factors == ROPE_FACTORS_LONGROPE ? ", and longrope" : "");
    }
    return 0;
}

/* ---- tensors ------------------------------------------------------------ */

static const gguf_tensor *need_tensor(loader *L, const char *name)
{
    const gguf_tensor *t = find_tensor(L, name);
    if (!t) err_set(L->err, L->err_size, "model: required tensor '%s' is missing", name);
    return t;
}

static int bind_matrix(loader *L, const char *name, int64_t n_in, int64_t n_out, weight *w,
                       int required)
{
    const gguf_tensor *t = find_tensor(L, name);
    memset(w, 0, sizeof *w);
    if (!t) {
        if (!required) return 0;
        return err_set(L->err, L->err_size, "model: required tensor '%s' is missing", name);
    }
    if (t->n_dims > 2 || t->ne[0] != n_in || t->ne[1] != n_out) {
        return err_set(L->err, L->err_size, "model: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)n_in, (long long)n_out);
    }
    const quant_traits *qt = quant_traits_of(t->type);
    if (!qt || !qt->has_kernels) {
        return err_set(L->err, L->err_size, "model: tensor '%s' has type %s, which sparq does not support yet",
                       name, qt ? qt->name : "unknown");
    }
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    quant_row_bytes(t->type, n_in, &w->row_bytes);
    snprintf(w->name, sizeof w->name, "%s", name);
    return 0;
}

static int bind_vector(loader *L, const char *name, int64_t n, const float **out, int required)
{
    const gguf_tensor *t = find_tensor(L, name);
    *out = NULL;
    if (!t) {
        if (!required) return 0;
        return err_set(L->err, L->err_size, "model: required tensor '%s' is missing", name);
    }
    if (t->n_dims != 1 || t->ne[0] != n || t->type != QT_F32) {
        const quant_traits *qt = quant_traits_of(t->type);
        return err_set(L->err, L->err_size, "model: tensor '%s' must be F32 [%lld], is %s [%lld]",
                       name, (long long)n, qt ? qt->name : "?", (long long)t->ne[0]);
    }
    if (((uintptr_t)t->data & 3) != 0) {
        return err_set(L->err, L->err_size, "model: tensor '%s' is not 4-byte aligned", name);
    }
    *out = t->data;
    return 0;
}

/* Rows [r0, r0 + n) of a bound matrix as a matrix of their own: rows are
 * whole quantization blocks, so a row range is a valid weight. */
static weight row_view(const weight *w, int64_t r0, int64_t n, const char *part)
{
    weight v = *w;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    v.n_out = n;
    snprintf(v.name, sizeof v.name, "%.50s[%s]", w->name, part);
    return v;
}

/* phi3's attn_qkv.weight: q rows, then k, then v, so the product is the
 * concatenation [q | k | v] llama.cpp splits into views. The optional
 * attn_qkv.bias is split the same way. */
static int bind_fused_qkv(loader *L, int il, int64_t n_embd, int64_t q_dim, int64_t kv_dim,
                          layer_weights *lw)
{
    char name[96];
    weight qkv;
    const float *b;
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
    if (bind_matrix(L, name, n_embd, q_dim + 2 * kv_dim, &qkv, 1)) return -1;
    lw->wq = row_view(&qkv, 0, q_dim, "q");
    lw->wk = row_view(&qkv, q_dim, kv_dim, "k");
    lw->wv = row_view(&qkv, q_dim + kv_dim, kv_dim, "v");
    snprintf(name, sizeof name, "blk.%d.attn_qkv.bias", il);
    if (bind_vector(L, name, q_dim + 2 * kv_dim, &b, 0)) return -1;
    if (b) lw->bq = b, lw->bk = b + q_dim, lw->bv = b + q_dim + kv_dim;
    return 0;
}

static int bind_layer(loader *L, const sparq_model *m, int il, layer_weights *lw)
{
    const model_hparams *hp = &m->hp;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_kv_head * hp->head_dim;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, il), name)
    if (bind_vector(L, NAME("attn_norm.weight"), hp->n_embd, &lw->attn_norm, 1) ||
        bind_matrix(L, NAME("attn_output.weight"), q_dim, hp->n_embd, &lw->wo, 1) ||
        bind_vector(L, NAME("ffn_norm.weight"), hp->n_embd, &lw->ffn_norm, 1) ||
        bind_matrix(L, NAME("ffn_down.weight"), hp->n_ff, hp->n_embd, &lw->w_down, 1))
        return -1;
    /* like llama.cpp, a fused-QKV arch also takes separate q/k/v tensors */
    if (m->arch->fused_qkv && gguf_find_tensor(L->f, NAME("attn_qkv.weight"))) {
        if (bind_fused_qkv(L, il, hp->n_embd, q_dim, kv_dim, lw)) return -1;
    } else if (m->arch->fused_qkv && !gguf_find_tensor(L->f, NAME("attn_q.weight"))) {
        return err_set(L->err, L->err_size, "model: block %d has neither attn_qkv.weight nor attn_q/k/v.weight", il);
    } else {
        int bias = m->arch->has_qkv_bias;
        if (bind_matrix(L, NAME("attn_q.weight"), hp->n_embd, q_dim, &lw->wq, 1) ||
            bind_matrix(L, NAME("attn_k.weight"), hp->n_embd, kv_dim, &lw->wk, 1) ||
            bind_matrix(L, NAME("attn_v.weight"), hp->n_embd, kv_dim, &lw->wv, 1) ||
            bind_vector(L, NAME("attn_q.bias"), q_dim, &lw->bq, bias) ||
            bind_vector(L, NAME("attn_k.bias"), kv_dim, &lw->bk, bias) ||
            bind_vector(L, NAME("attn_v.bias"), kv_dim, &lw->bv, bias))
            return -1;
    }
    if (m->arch->fused_gate_up) {
        /* ffn_up.weight [2*n_ff][n_embd]: the first n_ff rows go through
         * SiLU and multiply the second n_ff (ggml_swiglu, not swapped) */
        weight gu;
        if (bind_matrix(L, NAME("ffn_up.weight"), hp->n_embd, 2 * (int64_t)hp->n_ff, &gu, 1)) return -1;
        lw->w_gate = row_view(&gu, 0, hp->n_ff, "gate");
        lw->w_up = row_view(&gu, hp->n_ff, hp->n_ff, "up");
    } else if (bind_matrix(L, NAME("ffn_gate.weight"), hp->n_embd, hp->n_ff, &lw->w_gate, 1) ||
               bind_matrix(L, NAME("ffn_up.weight"), hp->n_embd, hp->n_ff, &lw->w_up, 1)) {
        return -1;
    }
    int qkn = m->arch->has_qk_norm;
    if (bind_vector(L, NAME("attn_q_norm.weight"), hp->head_dim, &lw->q_norm, qkn) ||
        bind_vector(L, NAME("attn_k_norm.weight"), hp->head_dim, &lw->k_norm, qkn))
        return -1;
#undef NAME
    return 0;
}

/* The per-frequency RoPE divisors of the arch's kind (both optional). */
static int bind_rope_factors(loader *L, sparq_model *m)
{
    const int n = m->hp.rope_dim / 2;
    if (m->arch->rope_factors == ROPE_FACTORS_FREQS)
        return bind_vector(L, "rope_freqs.weight", n, &m->rope_freqs, 0);
    if (gguf_find_tensor(L->f, "rope_freqs.weight")) { /* llama.cpp rejects it here too */
        return err_set(L->err, L->err_size, "model: tensor 'rope_freqs.weight' is not used by %s files "
                       "(rope_factors_long/short are)", m->arch->name);
    }
    if (bind_vector(L, "rope_factors_short.weight", n, &m->rope_short, 0) ||
        bind_vector(L, "rope_factors_long.weight", n, &m->rope_long, 0))
        return -1;
    if (!m->rope_short != !m->rope_long) {
        return err_set(L->err, L->err_size, "model: longrope needs both rope_factors_short and rope_factors_long; "
                       "the file has only %s", m->rope_short ? "the short table" : "the long table");
    }
    return 0;
}

const float *model_rope_factors(const sparq_model *m, int64_t n_ctx)
{
    if (!m->rope_long) return m->rope_freqs;
    /* llama.cpp's rule (llama_model::get_rope_factors): the long table once
     * the context exceeds the original training length, compared after
     * llama.cpp rounds the context up to a multiple of 256. The choice is
     * per context, not per position: a 128k context uses the long factors
     * from its first token. */
    const int64_t padded = (n_ctx + 255) / 256 * 256;
    return padded > m->hp.n_ctx_orig ? m->rope_long : m->rope_short;
}

/* Every tensor of the file must have been bound: one the forward pass does
 * not use would be silently ignored (a block past block_count, an
 * attn_output.bias, MoE experts in a "llama" file), and the output would be
 * that of another model. llama.cpp refuses such files too ("wrong number of
 * tensors"). */
static int check_all_used(loader *L, const sparq_model *m)
{
    for (uint64_t i = 0; i < L->f->n_tensors; i++) {
        if (L->used[i]) continue;
        const gguf_str nm = L->f->tensors[i].name;
        char shown[96];
        gguf_str_show(nm, shown, sizeof shown);
        unsigned long blk = 0;
        char name[80], tail;
        snprintf(name, sizeof name, "%.*s", (int)(nm.len < 79 ? nm.len : 79), nm.data);
        if (sscanf(name, "blk.%lu.%c", &blk, &tail) == 2 && blk >= (unsigned long)m->hp.n_layer) {
            err_set(L->err, L->err_size, "model: tensor '%s' is in block %lu but %s.block_count is %d",
                    shown, blk, m->arch->name, m->hp.n_layer);
        } else {
            err_set(L->err, L->err_size, "model: tensor '%s' is not used by the %s architecture "
                    "(an unsupported variant?)", shown, m->arch->name);
        }
        return -1;
    }
    return 0;
}

sparq_model_params sparq_model_default_params(void)
{
    sparq_model_params p = { 0 };
    return p;
}

/* model.h: piece_blob / piece_off / piece_eog. 0, or -1 out of memory. */
static int build_pieces(sparq_model *m)
{
    const int n = m->hp.n_vocab;
    char buf[256];
    size_t total = 0;
    m->piece_off = malloc(((size_t)n + 1) * sizeof *m->piece_off);
    m->piece_eog = malloc((size_t)n ? (size_t)n : 1);
    if (!m->piece_off || !m->piece_eog) return -1;
    for (int i = 0; i < n; i++) {
        int len = tok_decode(m->tok, i, buf, sizeof buf);
        total += len > 0 ? (size_t)len : 0;
        m->piece_eog[i] = (uint8_t)(tok_is_eog(m->tok, i) != 0);
    }
    if (total >= UINT32_MAX) return -1;
    m->piece_blob = malloc(total ? total : 1);
    if (!m->piece_blob) return -1;
    uint32_t at = 0;
    for (int i = 0; i < n; i++) {
        m->piece_off[i] = at;
        int len = tok_decode(m->tok, i, buf, sizeof buf);
        if (len > (int)sizeof buf) { /* a rare long piece: decode into the blob directly */
            tok_decode(m->tok, i, m->piece_blob + at, len);
        } else if (len > 0) {
            memcpy(m->piece_blob + at, buf, (size_t)len);
        }
        at += len > 0 ? (uint32_t)len : 0;
    }
    m->piece_off[n] = at;
    return 0;
}

int sparq_model_load(const char *path, sparq_model **out, char *err, size_t err_size)
{
    sparq_model_params p = sparq_model_default_params();
    return sparq_model_load_params(path, &p, out, err, err_size);
}

int sparq_model_load_params(const char *path, const sparq_model_params *p, sparq_model **out,
                            char *err, size_t err_size)
{
    *out = NULL;
    loader L = { NULL, NULL, err, err_size, NULL };
    /* a bare name ("stories260K.gguf") is looked up on the model search
     * path (paths.h), as the command does, so a program linked against an
     * installed library finds the installed default model */
    char found[4096];
    if (path && !strchr(path, '/') && path_find(path, found, sizeof found) == 0) path = found;
    if (path_check_regular(path, err, err_size)) return -1;
    sparq_model *m = calloc(1, sizeof *m);
    if (!m) {
        return err_set(err, err_size, "model: out of memory");
    }
    if (gguf_open_mode(path, p->use_mmap ? GGUF_OPEN_MMAP : GGUF_OPEN_AUTO, &m->file, err, err_size)) goto fail;
    L.f = m->file;

    gguf_str arch;
    if (gguf_get_str(m->file, "general.architecture", &arch) != 1) {
        err_set(err, err_size, "model: %s has no general.architecture string", path);
        goto fail;
    }
    char arch_name[64];
    snprintf(arch_name, sizeof arch_name, "%.*s", (int)(arch.len < 63 ? arch.len : 63), arch.data);
    m->arch = arch.len < 63 && strlen(arch_name) == arch.len ? arch_find(arch_name) : NULL;
    if (!m->arch) {
        char names[128], shown[96];
        arch_names(names, sizeof names);
        err_set(err, err_size, "model: unknown architecture '%s' (supported: %s)",
                gguf_str_show(arch, shown, sizeof shown), names);
        goto fail;
    }
    L.arch = m->arch->name;
    if (read_hparams(&L, m->arch, &m->hp)) goto fail;

    if (tok_create_from_gguf(m->file, &m->tok, err, err_size)) goto fail;

    L.used = calloc(m->file->n_tensors ? (size_t)m->file->n_tensors : 1, 1);
    if (!L.used) {
        err_set(err, err_size, "model: out of memory");
        goto fail;
    }
    const gguf_tensor *te = need_tensor(&L, "token_embd.weight");
    if (!te) goto fail;
    if (te->n_dims > 2 || te->ne[0] < 1 || te->ne[1] < 1 || te->ne[1] >= (1 << 24)) {
        err_set(err, err_size, "model: tensor 'token_embd.weight' has shape [%lld, %lld], expected "
                "[%d, n_vocab] with n_vocab in 1..%d", (long long)te->ne[0], (long long)te->ne[1],
                m->hp.n_embd, (1 << 24) - 1);
        goto fail;
    }
    m->hp.n_vocab = (int)te->ne[1];
    if (bind_matrix(&L, "token_embd.weight", m->hp.n_embd, te->ne[1], &m->tok_embd, 1)) goto fail;
    /* one embedding row per token, as llama.cpp requires: a row without a
     * token would be an id that prints nothing, a token without a row an
     * id that cannot be embedded */
    if (tok_n_vocab(m->tok) != m->hp.n_vocab) {
        err_set(err, err_size, "model: the tokenizer has %d tokens but token_embd.weight has %d rows",
                tok_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    if (build_pieces(m)) {
        err_set(err, err_size, "model: out of memory for the token pieces");
        goto fail;
    }
    if (bind_vector(&L, "output_norm.weight", m->hp.n_embd, &m->output_norm, 1)) goto fail;
    if (bind_matrix(&L, "output.weight", m->hp.n_embd, m->hp.n_vocab, &m->output, 0)) goto fail;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    if (bind_rope_factors(&L, m)) goto fail;

    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) {
        err_set(err, err_size, "model: out of memory");
        goto fail;
    }
    for (int il = 0; il < m->hp.n_layer; il++)
        if (bind_layer(&L, m, il, &m->layers[il])) goto fail;
    if (check_all_used(&L, m)) goto fail;
    if (!p->no_repack && model_repack(m, err, err_size)) goto fail;
    free(L.used);
    *out = m;
    return 0;
fail:
    free(L.used);
    sparq_model_free(m);
    return -1;
}

void sparq_model_free(sparq_model *m)
{
    if (!m) return;
    model_repack_free(m);
    free(m->layers);
    free(m->piece_blob);
    free(m->piece_off);
    free(m->piece_eog);
    tok_free(m->tok);
    gguf_close(m->file);
    free(m);
}

int sparq_model_n_vocab(const sparq_model *m) { return m->hp.n_vocab; }
int sparq_model_n_layer(const sparq_model *m) { return m->hp.n_layer; }
int sparq_model_n_head(const sparq_model *m) { return m->hp.n_head; }
int sparq_model_n_kv_head(const sparq_model *m) { return m->hp.n_kv_head; }
int sparq_model_head_dim(const sparq_model *m) { return m->hp.head_dim; }
int64_t sparq_model_n_ctx_train(const sparq_model *m) { return m->hp.n_ctx_train; }
const char *sparq_model_arch(const sparq_model *m) { return m->arch->name; }

int sparq_tokenize(const sparq_model *m, const char *text, int len, int add_special,
                   int32_t *ids, int max_ids)
{
    size_t n = len < 0 ? strlen(text) : (size_t)len;
    return tok_encode(m->tok, text, n, add_special, ids, max_ids);
}

int sparq_token_to_piece(const sparq_model *m, int32_t id, char *buf, int buf_size)
{
    return tok_decode(m->tok, id, buf, buf_size);
}

int sparq_token_bos(const sparq_model *m) { return tok_bos(m->tok); }
int sparq_token_eos(const sparq_model *m) { return tok_eos(m->tok); }
int sparq_token_is_eog(const sparq_model *m, int32_t id) { return tok_is_eog(m->tok, id); }

const char *sparq_model_chat_template(const sparq_model *m)
{
    gguf_str jinja;
    if (!m || gguf_get_str(m->file, "tokenizer.chat_template", &jinja) != 1) return NULL;
    return chat_template_detect(jinja.data, (size_t)jinja.len);
}

int sparq_chat_tokenize(const sparq_model *m, const char *tmpl, const sparq_chat_msg *msgs,
                        int n_msgs, int add_assistant, int32_t *ids, int max_ids,
                        char *err, size_t err_size)
{
    const char *name = tmpl ? chat_template_canonical(tmpl) : sparq_model_chat_template(m);
    if (!name) {
        return err_set(err, err_size, tmpl ? "chat: unknown template '%s' (known: %s)"
                                            : "chat: the model has no recognised tokenizer.chat_template%s; "
                                              "choose one with --chat-template (%s)",
                       tmpl ? tmpl : "", chat_template_names());
    }
    int len = chat_render(name, msgs, n_msgs, add_assistant, NULL, 0);
    char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (!text) {
        return err_set(err, err_size, "chat: out of memory");
    }
    chat_render(name, msgs, n_msgs, add_assistant, text, (size_t)len + 1);
    int n = chat_tokenize(m->tok, name, text, (size_t)len, ids, max_ids);
    free(text);
    if (n < 0) err_set(err, err_size, "chat: cannot tokenize the conversation");
    return n;
}
