/* context.c - a sequence's state: creating a context (fresh, or over a KV
 * cache file's prefix), saving its cache to a KV file, resetting it, and the
 * benchmark-only random fill. The forward pass that runs in it is forward.c.
 *
 * Map:
 *   sparq_context_create / _load_kv / _free   KV cache, scratch, attention policy
 *   sparq_context_reset / _reuse              the same context, a new sequence
 *   sparq_context_save_kv                     the cache and its indexes to a file
 *   model_fingerprint                         what a KV file must match to be reused
 *   sparq_context_fill_random                 synthetic keys/values for benchmarks
 */
#include "io/kvfile.h"
#include "core/context.h"
#include "core/model.h"
#include "attn/attn_params.h"
#include "attn/attn_pf_sparse.h"
#include "util/err.h"
#include "util/paths.h"
#include "util/cpu.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALIGN 64

static void *alloc_aligned(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = ALIGN;
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (posix_memalign(&p, ALIGN, bytes) != 0) return NULL;
    return p;
}

int sparq_attn_policy_count(void) { return attn_policy_count(); }

const char *sparq_attn_policy_name(int i)
{
    const attn_policy *p = attn_policy_at(i);
    return p ? p->name : NULL;
}

const char *sparq_attn_policy_summary(int i)
{
    const attn_policy *p = attn_policy_at(i);
    return p ? p->summary : NULL;
}

int sparq_attn_policy_observes_prefill(int i)
{
    const attn_policy *p = attn_policy_at(i);
    return p ? p->observe_prefill != NULL : -1;
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
    free(rs->attn_scratch); free(rs->attn_iscratch); free(rs->colsum); free(rs->attn_parts);
    free(rs->attn_shared); free(rs->attn_selected);
    memset(rs, 0, sizeof *rs);
}

static int run_state_alloc(sparq_context *c, char *err, size_t err_size)
{
    const model_hparams *hp = &c->model->hp;
    run_state *rs = &c->rs;
    const size_t nb = (size_t)rs->n_batch;
    const size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    const size_t kv_dim = (size_t)hp->n_kv_head * hp->head_dim;
    /* a vec_dot row (at most 4 bytes per element) or a packed GEMM token */
    rs->xq_row_bytes = (model_act_row_bytes(hp) + ALIGN - 1) / ALIGN * ALIGN;
    const int g = hp->n_head / hp->n_kv_head;
    size_t sf = c->policy->scratch_floats(&c->params.attn, c->kv.cap, hp->head_dim, g);
    size_t dense_sf = (size_t)g * (size_t)c->kv.cap + 64;
    rs->scratch_floats = (sf > dense_sf ? sf : dense_sf);
    rs->scratch_floats = (rs->scratch_floats + 15) / 16 * 16;

    /* The KV cache is reserved lazily (address space, pages committed as
     * tokens arrive), but the attention scratch grows with the context and
     * is allocated now: refuse a context whose scratch alone exceeds the
     * RAM, with the numbers, instead of failing later or swapping. */
    const double scratch = (double)c->n_threads * (double)rs->scratch_floats * 8.0 +
                           ((c->policy->needs & ATTN_NEEDS_COLSUM) ? (double)hp->n_kv_head * (double)c->kv.cap * 4.0 : 0.0);
    const double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (ram > 0 && scratch > ram) {
        return err_set(err, err_size, "context: %lld positions need %.1f GiB of attention scratch (%d threads), "
                       "more than the %.1f GiB of RAM: use a smaller -c", (long long)c->kv.cap,
                       scratch / 1073741824.0, c->n_threads, ram / 1073741824.0);
    }
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
    /* parts of a long decode step (attn_policy.n_parts) at the longest */
    const int max_parts = c->policy->attend_part ? c->policy->n_parts(&c->params.attn, c->kv.cap) : 1;
    rs->attn_max_parts = max_parts;
    if (max_parts > 1)
        rs->attn_parts = alloc_aligned((size_t)hp->n_kv_head * max_parts * ((size_t)g * hp->head_dim + g) *
                                       sizeof(float));
    const int staged = max_parts > 1 && c->policy->select;
    if (staged) {
        rs->shared_floats = attn_pad16(c->policy->shared_floats(&c->params.attn, c->kv.cap, hp->head_dim, g));
        rs->attn_shared = alloc_aligned((size_t)hp->n_kv_head * rs->shared_floats * sizeof(float));
        rs->attn_selected = alloc_aligned((size_t)hp->n_kv_head * sizeof(int));
    }
    if (!rs->x || !rs->xn || !rs->q || !rs->k || !rs->v || !rs->att || !rs->gate || !rs->up ||
        !rs->rope_cs || !rs->xq || !rs->logits || !rs->attn_scratch || !rs->attn_iscratch ||
        ((c->policy->needs & ATTN_NEEDS_COLSUM) && !rs->colsum) || (max_parts > 1 && !rs->attn_parts) ||
        (staged && (!rs->attn_shared || !rs->attn_selected))) {
        return err_set(err, err_size, "context: out of memory for scratch buffers (batch %d, ctx %lld)",
                       rs->n_batch, (long long)c->kv.cap);
    }
    return 0;
}

static void kvf_release(void *f) { kvf_close(f); }

/* kvf != NULL: the cache is the file's private mapping holding its prefix;
 * *kvf_taken tells whether the context now owns kvf (freed with it). */
static int context_create(sparq_model *m, const sparq_context_params *p, kvf_file *kvf, kvf_map *map,
                          int64_t map_n, int *kvf_taken, sparq_context **out, char *err, size_t err_size)
{
    *out = NULL;
    *kvf_taken = 0;
    sparq_context *c = calloc(1, sizeof *c);
    if (!c) {
        return err_set(err, err_size, "context: out of memory");
    }
    c->model = m;
    c->params = *p;
    const model_hparams *hp = &m->hp;
    if (p->n_ctx < 0 || p->n_threads < 0 || p->n_batch < 0) {
        err_set(err, err_size, "context: %s %lld must be >= 0 (0 = the default)",
                p->n_ctx < 0 ? "n_ctx" : p->n_threads < 0 ? "n_threads" : "n_batch",
                (long long)(p->n_ctx < 0 ? p->n_ctx : p->n_threads < 0 ? p->n_threads : p->n_batch));
        goto fail;
    }
    int64_t n_ctx = p->n_ctx > 0 ? p->n_ctx : hp->n_ctx_train;
    c->rope_factors = model_rope_factors(m, n_ctx);
    c->n_threads = p->n_threads > 0 ? p->n_threads : cpu_physical_cores();
    c->rs.n_batch = p->n_batch > 0 ? p->n_batch : 512;
    if (c->rs.n_batch > n_ctx) c->rs.n_batch = (int)n_ctx;
    if (p->kv_type != SPARQ_KV_F16 && p->kv_type != SPARQ_KV_F32 && p->kv_type != SPARQ_KV_Q8_0) {
        err_set(err, err_size, "context: unknown KV cache type %d", p->kv_type);
        goto fail;
    }
    const char *name = p->attn.policy ? p->attn.policy : "dense";
    c->policy = attn_policy_find(name);
    if (!c->policy) {
        char known[ATTN_NAMES_MAX];
        err_set(err, err_size, "context: unknown attention policy '%s' (known: %s)", name,
                attn_policy_names(known, sizeof known, ", "));
        goto fail;
    }
    c->params.attn.policy = c->policy->name;
    if (c->policy->resolve(&c->params.attn, hp->head_dim, err, err_size)) goto fail;
    unsigned needs = c->policy->needs;
    const int elem = p->kv_type == SPARQ_KV_F16 ? KV_F16 : p->kv_type == SPARQ_KV_Q8_0 ? KV_Q8_0 : KV_F32;
    /* the cache's shape; the storage is the KV file's when there is one */
    kv_borrow b = { .n_layer = hp->n_layer, .n_kv_head = hp->n_kv_head, .d = hp->head_dim, .cap = n_ctx,
                    .elem = elem, .with_kt = !!(needs & ATTN_NEEDS_KT),
                    .with_vsum = !!(needs & ATTN_NEEDS_VSUM) };
    if (kvf) {
        b.k = kvf->k;
        b.v = kvf->v;
        b.kt = kvf->kt;
        b.n = kvf->n;
        b.v_sum = kvf->v_sum;
        b.owner = kvf;
        b.owner_free = kvf_release;
        if (kv_create_borrowed(&c->kv, &b, err, err_size)) goto fail;
        *kvf_taken = 1;
    } else if (map) { /* built in place in the file being written (map_n positions there) */
        b.k = kvf_map_k(map);
        b.v = kvf_map_v(map);
        b.kt = kvf_map_kt(map);
        b.n = map_n;
        b.owner = map;
        b.owner_free = kvf_map_free;
        if (kv_create_borrowed(&c->kv, &b, err, err_size)) goto fail;
        *kvf_taken = 1;
    } else if (kv_create(&c->kv, hp->n_layer, hp->n_kv_head, hp->head_dim, n_ctx, elem,
                         !!(needs & ATTN_NEEDS_KT), !!(needs & ATTN_NEEDS_VSUM), err, err_size)) {
        goto fail;
    }
    attn_shape shape = { hp->n_layer, hp->n_kv_head, hp->n_head / hp->n_kv_head, hp->head_dim, n_ctx };
    if (c->policy->state_create && c->policy->state_create(&c->params.attn, &shape, &c->policy_state)) {
        err_set(err, err_size, "context: cannot create %s state for context %lld", c->policy->name,
                (long long)n_ctx);
        goto fail;
    }
    /* a loaded prefix is the prefix; its indexes serve a topk policy */
    if (kvf && c->policy->set_prefix) {
        c->policy->set_prefix(c->policy_state, &c->params.attn, kvf->n, &kvf->source);
        kvf_advise_random(kvf); /* the prefix is read a few gathered rows at a time */
    }
    if (p->prefill.mode != SPARQ_PREFILL_EXACT) {
        c->params.prefill = attn_pf_resolve(&p->prefill, n_ctx);
        if (attn_pf_check(&c->params.prefill, err, err_size)) goto fail;
    }
    if (p->prefill.mode == SPARQ_PREFILL_WINDOW || p->prefill.mode == SPARQ_PREFILL_TOPK) {
        if (c->policy->observe_prefill) { /* its state is the prompt's exact attention */
            err_set(err, err_size, "context: the %s policy observes the exact prefill; it cannot follow a "
                                   "sparse prefill", c->policy->name);
            goto fail;
        }
        if (attn_pf_sparse_create(&c->params.prefill, hp->n_layer, hp->n_kv_head, hp->head_dim,
                                  hp->n_head / hp->n_kv_head, c->n_threads, &c->pf, err, err_size))
            goto fail;
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
    return context_create(m, p, NULL, NULL, 0, &taken, out, err, err_size);
}

int sparq_context_create_in_file(sparq_model *m, const sparq_context_params *p, const char *path,
                                 const int32_t *tokens, int64_t n_prefix, const char *indexes, int flags,
                                 sparq_context **out, char *err, size_t err_size)
{
    *out = NULL;
    const model_hparams *hp = &m->hp;
    const int64_t n_ctx = p->n_ctx > 0 ? p->n_ctx : hp->n_ctx_train;
    if (!tokens || n_prefix < 1 || n_prefix > n_ctx) {
        return err_set(err, err_size, "context: a file of %lld positions (token ids %s) for a context of %lld",
                       (long long)n_prefix, tokens ? "given" : "missing", (long long)n_ctx);
    }
    const int vocab = hp->n_vocab;
    for (int64_t i = 0; i < n_prefix; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab) {
            return err_set(err, err_size, "context: token id %d at index %lld is outside [0, %d)", tokens[i], (long long)i,
                           vocab);
        }
    const char *name = p->attn.policy ? p->attn.policy : "dense";
    const attn_policy *pol = attn_policy_find(name);
    const int elem = p->kv_type == SPARQ_KV_F16 ? KV_F16 : p->kv_type == SPARQ_KV_Q8_0 ? KV_Q8_0 : KV_F32;
    /* K^T is stored only for f16/f32 caches whose policy reads it */
    const int with_kt = pol && (pol->needs & ATTN_NEEDS_KT) && elem != KV_Q8_0;
    if (pol && (pol->needs & ATTN_NEEDS_KT) && elem == KV_Q8_0) {
        return err_set(err, err_size, "context: a q8_0 cache in a file is stored without K^T; the %s policy needs it "
                                      "(use --kv-type f16, or another policy while prefilling)", pol->name);
    }
    const char *kinds[KVF_MAX_KINDS];
    const int n_kinds = kvf_parse_kinds(indexes, kinds, err, err_size);
    if (n_kinds < 0) return -1;
    kvf_fingerprint fp;
    model_fingerprint(m, &fp);
    const uint32_t tokens_crc = kvf_crc32c(0, tokens, (size_t)n_prefix * sizeof *tokens);
    kvf_writer *w = NULL;
    int64_t done = 0;
    const kvf_shape shape = {
        .elem = elem, .n = n_prefix, .cap = n_ctx, .with_kt = with_kt, .n_tokens = n_prefix, .kinds = indexes};
    if (flags & SPARQ_IN_FILE_RESUME) {
        const int r = kvf_writer_resume(path, &fp, &shape, tokens_crc, &w, &done, err, err_size);
        if (r < 0) return -1;
        if (r > 0) return 1; /* nothing to resume: err says why */
    } else if (kvf_writer_create(path, &fp, &shape, &w, err, err_size)) {
        return -1;
    }
    kvf_writer_tokens(w, tokens);
    /* an index image holds every key once as f16 with its id: about this */
    const int64_t images = (int64_t)n_kinds * hp->n_layer * hp->n_kv_head *
                           (n_prefix * ((int64_t)hp->head_dim * 2 + 4) + ((int64_t)1 << 20));
    kvf_map *map;
    if (kvf_writer_map(w, images, &map, err, err_size)) {
        kvf_writer_abort(w);
        return -1;
    }
    int taken = 0;
    if (context_create(m, p, NULL, map, done, &taken, out, err, err_size)) {
        if (!taken) kvf_map_free(map);
        kvf_writer_abort(w);
        return -1;
    }
    /* from here on an unfinished file holds work worth resuming */
    kvf_writer_keep(w, !!(flags & SPARQ_IN_FILE_KEEP));
    sparq_context *c = *out;
    c->kvw = w;
    c->kvw_n = n_prefix;
    c->kvw_crc = tokens_crc;
    snprintf(c->kvw_indexes, sizeof c->kvw_indexes, "%s", indexes ? indexes : "");
    if (kvf_writer_progress(w, tokens_crc, done)) {
        err_set(err, err_size, "context: cannot write to '%s.tmp': %s", path, strerror(errno));
        sparq_context_free(c);
        *out = NULL;
        return -1;
    }
    return 0;
}

void ctx_file_progress(sparq_context *c)
{
    /* only positions of the document count; a failed record only costs a resume */
    if (c->kvw && c->kv.n <= c->kvw_n) (void)kvf_writer_progress(c->kvw, c->kvw_crc, c->kv.n);
}

int sparq_context_load_kv(sparq_model *m, const sparq_context_params *p, const char *path,
                          int verify, sparq_context **out, char *err, size_t err_size)
{
    *out = NULL;
    kvf_fingerprint fp;
    model_fingerprint(m, &fp);
    kvf_file *f = NULL;
    if (path_check_regular(path, err, err_size)) return -1;
    if (kvf_open(path, &fp,
                 verify == SPARQ_VERIFY_ALWAYS ? KVF_VERIFY_ALWAYS
                 : verify == SPARQ_VERIFY_META ? KVF_VERIFY_META : KVF_VERIFY_AUTO,
                 &f, err, err_size))
        return -1;
    if (p->n_ctx > 0 && p->n_ctx != f->cap) {
        err_set(err, err_size, "load_kv: '%s' holds a cache of capacity %lld; the context size must be "
                "0 (the file's) or %lld, not %lld", path, (long long)f->cap, (long long)f->cap,
                (long long)p->n_ctx);
        kvf_close(f);
        return -1;
    }
    sparq_context_params pp = *p;
    pp.n_ctx = f->cap;
    pp.kv_type = f->elem == KV_F16 ? SPARQ_KV_F16 : f->elem == KV_Q8_0 ? SPARQ_KV_Q8_0 : SPARQ_KV_F32;
    int taken = 0;
    int rc = context_create(m, &pp, f, NULL, 0, &taken, out, err, err_size);
    if (rc && !taken) kvf_close(f);
    return rc;
}

int sparq_kv_preload(const char *path, void (*progress)(void *user, int64_t done, int64_t total), void *user,
                     char *err, size_t err_size)
{
    if (path_check_regular(path, err, err_size)) return -1;
    return kvf_preload(path, progress, user, err, err_size);
}

void sparq_context_free(sparq_context *c)
{
    if (!c) return;
    if (c->policy && c->policy->state_free) c->policy->state_free(c->policy_state);
    kv_free(&c->kv);
    kvf_writer_abort(c->kvw); /* a file never finished is removed, unless kept to resume */
    run_state_free(&c->rs);
    attn_pf_sparse_free(c->pf);
    free(c);
}

int64_t sparq_context_pos(const sparq_context *c) { return c->kv.n; }
int64_t sparq_context_n_ctx(const sparq_context *c) { return c->kv.cap; }
int sparq_context_n_threads(const sparq_context *c) { return c->n_threads; }
int sparq_context_n_batch(const sparq_context *c) { return c->rs.n_batch; }
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

/* Policy state restarts as after a reset (H2O's scores: every kept
 * position alive with score 0; topk: the cached positions become the
 * prefix at the next decode step, its index built again; a KV file's
 * prebuilt indexes are no longer offered). */
static int policy_restart(sparq_context *c)
{
    if (!c->policy->state_create) return 0;
    const model_hparams *hp = &c->model->hp;
    attn_shape shape = { hp->n_layer, hp->n_kv_head, hp->n_head / hp->n_kv_head, hp->head_dim, c->kv.cap };
    if (c->policy->state_free) c->policy->state_free(c->policy_state);
    c->policy_state = NULL;
    return c->policy->state_create(&c->params.attn, &shape, &c->policy_state);
}

void sparq_context_reset(sparq_context *c)
{
    kv_reset(&c->kv);
    if (c->pf) attn_pf_sparse_reset(c->pf);
    memset(&c->stats, 0, sizeof c->stats);
    policy_restart(c); /* policy state (e.g. H2O scores) restarts too */
}

int sparq_context_reuse(sparq_context *c, const sparq_context_params *p)
{
    if (!c || c->kvw || c->pf || c->kv.kv_borrowed || c->kv.kt_borrowed || (p && p->prefill.mode != SPARQ_PREFILL_EXACT))
        return 0;
    if (!p) goto reset;
    const model_hparams *hp = &c->model->hp;
    const int64_t n_ctx = p->n_ctx > 0 ? p->n_ctx : hp->n_ctx_train;
    const int n_threads = p->n_threads > 0 ? p->n_threads : cpu_physical_cores();
    int64_t n_batch = p->n_batch > 0 ? p->n_batch : 512;
    if (n_batch > n_ctx) n_batch = n_ctx;
    const int elem = p->kv_type == SPARQ_KV_F16 ? KV_F16 : p->kv_type == SPARQ_KV_Q8_0 ? KV_Q8_0 : KV_F32;
    if (p->n_ctx < 0 || p->n_threads < 0 || p->n_batch < 0 || n_ctx != c->kv.cap || n_threads != c->n_threads ||
        n_batch != c->rs.n_batch || p->kv_type != c->params.kv_type || elem != c->kv.elem)
        return 0;
    /* the policy's defaults filled in, as at creation, before comparing */
    sparq_attn_params a = p->attn;
    char err[256];
    if (attn_policy_find(a.policy ? a.policy : "dense") != c->policy) return 0;
    a.policy = c->policy->name;
    if (c->policy->resolve(&a, hp->head_dim, err, sizeof err) || !attn_params_equal(&a, &c->params.attn)) return 0;
    c->params.progress = p->progress;
    c->params.progress_user = p->progress_user;
    c->params.abort_flag = p->abort_flag;
reset:
    sparq_context_reset(c);
    if (c->policy->state_create && !c->policy_state) return 0; /* its restart ran out of memory */
    c->error[0] = 0;
    return 1;
}

int sparq_context_shift(sparq_context *c, int64_t n_keep, int64_t n_discard)
{
    const model_hparams *hp = &c->model->hp;
    c->error[0] = 0;
    if (n_keep < 0 || n_discard < 0 || n_keep + n_discard > c->kv.n) {
        return err_set(c->error, sizeof c->error, "context shift: keep %lld + discard %lld exceed the %lld cached positions",
                       (long long)n_keep, (long long)n_discard, (long long)c->kv.n);
    }
    if (n_discard == 0) return 0;
    /* the rotation by -n_discard: RoPE's angles, linear in the position,
     * without rope_attn_factor (the cached keys already carry it) */
    float *cs = malloc((size_t)(hp->rope_dim > 0 ? hp->rope_dim : 1) * sizeof *cs);
    if (!cs) {
        return err_set(c->error, sizeof c->error, "context shift: out of memory");
    }
    const double theta_scale = pow(hp->rope_base, -2.0 / (double)hp->rope_dim);
    double theta = -(double)n_discard;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        const double t = theta / (c->rope_factors ? c->rope_factors[i] : 1.0f) * hp->rope_freq_scale;
        cs[2 * i] = (float)cos(t);
        cs[2 * i + 1] = (float)sin(t);
        theta *= theta_scale;
    }
    int rc = kv_shift(&c->kv, n_keep, n_discard, cs, hp->rope_dim, c->model->arch->rope_type == ROPE_NEOX);
    free(cs);
    if (c->pf) attn_pf_sparse_reset(c->pf); /* its lists name the old positions */
    if (rc) {
        return err_set(c->error, sizeof c->error, "context shift: out of memory");
    }
    if (policy_restart(c)) {
        return err_set(c->error, sizeof c->error, "context shift: cannot create %s state again", c->policy->name);
    }
    return 0;
}

int sparq_context_fill_random(sparq_context *c, int64_t n, uint64_t seed)
{
    const model_hparams *hp = &c->model->hp;
    if (n < 0 || c->kv.n + n > c->kv.cap) {
        return err_set(c->error, sizeof c->error, "fill: %lld + %lld positions exceed the context %lld",
                       (long long)c->kv.n, (long long)n, (long long)c->kv.cap);
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

/* ---- fingerprints ---------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void model_fingerprint(const sparq_model *m, kvf_fingerprint *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->arch, sizeof out->arch, "%s", m->arch->name);
    const model_hparams *hp = &m->hp;
    out->n_layer = hp->n_layer;
    out->n_head = hp->n_head;
    out->n_kv_head = hp->n_kv_head;
    out->head_dim = hp->head_dim;
    out->n_embd = hp->n_embd;
    out->n_vocab = hp->n_vocab;
    uint64_t h = 0xcbf29ce484222325ull;
    const float hf[4] = { hp->rope_base, hp->rope_freq_scale, hp->rms_eps, 0.0f };
    const int32_t hi[3] = { hp->rope_dim, hp->n_ff, m->arch->rope_type };
    h = fnv(h, hf, sizeof hf);
    h = fnv(h, hi, sizeof hi);
    for (uint64_t t = 0; t < m->file->n_tensors; t++) {
        const gguf_tensor *tt = &m->file->tensors[t];
        h = fnv(h, tt->name.data, (size_t)tt->name.len);
        h = fnv(h, &tt->type, sizeof tt->type);
        h = fnv(h, &tt->n_dims, sizeof tt->n_dims);
        h = fnv(h, tt->ne, sizeof tt->ne);
        h = fnv(h, tt->data, tt->nbytes < 4096 ? (size_t)tt->nbytes : 4096);
    }
    out->model_hash = h ? h : 1; /* 0 means "synthetic" */
}

/* ---- saving to a KV file --------------------------------------------------- */

/* kvf_write_heads' rows: the cache's own, and its running v_sum as it is;
 * after a top-k sparse prefill, also its inverted file, which the ivf
 * image then packs instead of running k-means over the whole prefix. */
static int save_rows(void *user, int layer, int head, kvf_head_rows *out, char *err, size_t err_size)
{
    const sparq_context *c = user;
    const kv_cache *kv = &c->kv;
    kv_view(kv, layer, head, kv->n, &out->view);
    out->v_sum = out->view.v_sum;
    if (c->pf) {
        attn_pf_ivf ivf;
        const int r = attn_pf_sparse_ivf(c->pf, layer, head, &out->view, kv->n, &ivf, err, err_size);
        if (r < 0) return -1;
        if (r == 0) {
            out->owned = ivf.block;
            out->ivf_nlist = ivf.nlist;
            out->ivf_centroids = ivf.centroids;
            out->ivf_labels = ivf.labels;
        }
    }
    return 0;
}

int sparq_context_save_kv(sparq_context *c, const char *path, const char *indexes,
                          const int32_t *tokens, int64_t n_tokens, char *err, size_t err_size)
{
    return context_save_kv_as(c, path, NULL, indexes, tokens, n_tokens, err, err_size);
}

int context_save_kv_as(sparq_context *c, const char *path, const char *tmp, const char *indexes,
                       const int32_t *tokens, int64_t n_tokens, char *err, size_t err_size)
{
    const kv_cache *kv = &c->kv;
    if (tokens && n_tokens != kv->n)
        {
        return err_set(err, err_size, "save_kv: %lld token ids for %lld cached positions",
                       (long long)n_tokens, (long long)kv->n);
    }
    kvf_writer *w;
    if (c->kvw) { /* built in place: this file, finished now */
        if (strcmp(path, kvf_writer_path(c->kvw)) != 0 || tmp || kv->n != c->kvw_n || !tokens ||
            kvf_crc32c(0, tokens, (size_t)n_tokens * sizeof *tokens) != c->kvw_crc ||
            strcmp(indexes ? indexes : "", c->kvw_indexes) != 0) {
            return err_set(err, err_size, "save_kv: this context's cache is being built in '%s' for %lld positions "
                           "with indexes [%s]; it saves there, with those and its tokens", kvf_writer_path(c->kvw),
                           (long long)c->kvw_n,
                           c->kvw_indexes);
        }
        w = c->kvw;
        c->kvw = NULL; /* kvf_write_heads finishes or aborts it */
    } else {
        kvf_fingerprint fp;
        model_fingerprint(c->model, &fp);
        const kvf_shape shape = {.elem = kv->elem,
                                 .n = kv->n,
                                 .cap = kv->cap,
                                 .with_kt = kv->kt != NULL,
                                 .n_tokens = tokens ? kv->n : 0,
                                 .kinds = indexes};
        if (kvf_writer_create_as(path, tmp, &fp, &shape, &w, err, err_size)) return -1;
    }
    if (tokens) kvf_writer_tokens(w, tokens);
    return kvf_write_heads(w, c->n_threads, &c->params.attn, save_rows, (void *)c, NULL, err, err_size);
}

/* ---- shared prefixes (the server's prefix cache) ------------------------------ */

struct sparq_prefix {
    const sparq_model *model;
    kv_shared         *kv;
};

int sparq_prefix_create(const sparq_context *src, int64_t n, int64_t n_ctx, sparq_prefix **out, char *err,
                        size_t err_size)
{
    *out = NULL;
    if (!src || n_ctx < 0) {
        return err_set(err, err_size, "prefix: no source context, or a negative n_ctx");
    }
    sparq_prefix *p = calloc(1, sizeof *p);
    if (!p) {
        return err_set(err, err_size, "prefix: out of memory");
    }
    p->model = src->model;
    if (kv_shared_create(&src->kv, n, n_ctx ? n_ctx : src->kv.cap, &p->kv, err, err_size)) {
        free(p);
        return -1;
    }
    *out = p;
    return 0;
}

void sparq_prefix_free(sparq_prefix *p)
{
    if (!p) return;
    kv_shared_unref(p->kv); /* contexts mapping it hold their own references */
    free(p);
}

int64_t sparq_prefix_pos(const sparq_prefix *p) { return kv_shared_n(p->kv); }
int64_t sparq_prefix_n_ctx(const sparq_prefix *p) { return kv_shared_cap(p->kv); }
size_t  sparq_prefix_bytes(const sparq_prefix *p) { return kv_shared_bytes(p->kv); }
int     sparq_prefix_users(const sparq_prefix *p) { return kv_shared_users(p->kv); }

int sparq_context_attach_prefix(sparq_context *dst, const sparq_prefix *p, int64_t n, char *err, size_t err_size)
{
    if (!dst || !p || dst->model != p->model) {
        return err_set(err, err_size, "attach_prefix: the prefix and the context must be of one model");
    }
    if (dst->kv.n != 0 || dst->kv.cap != kv_shared_cap(p->kv) || dst->kv.elem != kv_shared_elem(p->kv) || n < 0 ||
        n > kv_shared_n(p->kv)) {
        return err_set(err, err_size, "attach_prefix: cannot attach %lld of %lld positions (capacity %lld) to a context "
                       "holding %lld of %lld (it must be empty, of the same capacity and KV type)", (long long)n,
                       (long long)kv_shared_n(p->kv), (long long)kv_shared_cap(p->kv), (long long)dst->kv.n,
                       (long long)dst->kv.cap);
    }
    if (dst->policy->observe_prefill) { /* as sparq_context_copy_prefix */
        return err_set(err, err_size, "attach_prefix: the %s policy observes the prefill; prefill instead", dst->policy->name);
    }
    /* a reset context that held as many positions has its own pages
     * committed: a copy into them is a memcpy, where mapping the prefix
     * would fault each of its pages in on first touch */
    if (!dst->kv.kv_borrowed && dst->kv.n_max >= n) return kv_copy_shared(&dst->kv, p->kv, n, dst->n_threads, err, err_size);
    kv_cache kv;
    if (kv_create_cow(&kv, p->kv, dst->kv.n_layer, dst->kv.n_kv_head, dst->kv.d, n, dst->kv.kt != NULL,
                      dst->kv.v_sum != NULL, err, err_size))
        return -1;
    kv_free(&dst->kv); /* the context's own (still empty) reservation */
    dst->kv = kv;
    return 0;
}
