/* bench_cfg.c - what the timing runs share (bench_run.h, bench_impl.h):
 * options and row lists, list options, the policy configurations a sweep
 * runs, KV-type names, the clock.
 */
#include "bench/bench_impl.h"
#include "attn/attn_params.h"
#include "util/err.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void bench_opts_init(bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->l = -1;
    o->reps = 10;
    o->warmup = 2;
    o->min_sample_us = 1000;
    o->seed = 1;
    o->size_mib = 1024;
    o->n_tokens = 32;
    o->rounds = 1;
    o->log = stderr;
}

bench_row *bench_rows_push(bench_rows *rl)
{
    if (rl->n == rl->cap) {
        int cap = rl->cap ? rl->cap * 2 : 32;
        bench_row *v = realloc(rl->v, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        rl->v = v;
        rl->cap = cap;
    }
    return &rl->v[rl->n++];
}

void bench_rows_free(bench_rows *rl)
{
    free(rl->v);
    rl->v = NULL;
    rl->n = rl->cap = 0;
}

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int bench_sort_unique(int64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || v[i] != v[m - 1]) v[m++] = v[i];
    return m;
}

int bench_int_list(const char *name, const char *s, const char *def, int64_t lo, int64_t hi, int64_t *out, int max,
                   char *err, size_t err_size)
{
    char e[256];
    int n = bench_parse_list(s ? s : def, out, max, e, sizeof e);
    if (n < 0) {
        return err_set(err, err_size, "%s: %s", name, e);
    }
    for (int i = 0; i < n; i++)
        if (out[i] < lo || out[i] > hi) {
            return err_set(err, err_size, "%s: %lld is outside [%lld, %lld]", name, (long long)out[i],
                           (long long)lo, (long long)hi);
        }
    return n;
}

void *bench_alloc64(size_t bytes)
{
    void *p = NULL;
    bytes = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

/* ---- policy configurations ------------------------------------------------------ */

int bench_build_cfgs(const bench_opts *o, bench_pol_cfg *cfg, char *names_buf, size_t names_size,
                     char *ratio_buf, size_t ratio_size, char *err, size_t err_size)
{
    const char *names[BENCH_MAX_CFG], *ratios[BENCH_MAX_LIST];
    int64_t rs[BENCH_MAX_LIST], ks[BENCH_MAX_LIST], aks[BENCH_MAX_LIST];
    int n_names = bench_split_names(o->attn ? o->attn : "dense,sparq", names_buf, names_size, names,
                                    BENCH_MAX_CFG, err, err_size);
    if (n_names < 0) return -1;
    int n_r = bench_int_list("--sparq-r", o->r, "0", 0, 4096, rs, BENCH_MAX_LIST, err, err_size);
    int n_k = n_r < 0 ? -1 : bench_int_list("--sparq-k", o->k, "128", 1, INT32_MAX, ks, BENCH_MAX_LIST, err, err_size);
    int n_ak = n_k < 0 ? -1
                       : bench_int_list("--attn-k", o->attn_k, "128", 1, INT32_MAX, aks, BENCH_MAX_LIST, err,
                                        err_size);
    if (n_ak < 0) return -1;
    int n_ratio = 0;
    if (o->ratio && (n_ratio = bench_split_names(o->ratio, ratio_buf, ratio_size, ratios, BENCH_MAX_LIST, err,
                                                 err_size)) < 0)
        return -1;
    int select_logits = 0;
    if (o->select) {
        if (strcmp(o->select, "logits") == 0) select_logits = 1;
        else if (strcmp(o->select, "probs") != 0) {
            return err_set(err, err_size, "--sparq-select must be probs or logits, not '%s'", o->select);
        }
    }
    int n = 0;
    /* dense first: every other row's speed-up is measured against it */
    cfg[n].pol = attn_policy_find("dense");
    cfg[n].p = sparq_attn_default_params();
    cfg[n].p.policy = "dense";
    cfg[n].ratio = NULL;
    n++;
    for (int i = 0; i < n_names; i++) {
        const attn_policy *pol = attn_policy_find(names[i]);
        if (!pol) {
            char known[ATTN_NAMES_MAX];
            return err_set(err, err_size, "--attn: unknown policy '%s' (known: %s)", names[i],
                           attn_policy_names(known, sizeof known, ", "));
        }
        if (strcmp(pol->name, "dense") == 0) continue;
        sparq_attn_params base = sparq_attn_default_params();
        base.policy = pol->name;
        base.l = o->l;
        base.select_logits = select_logits;
        base.no_realloc = o->no_realloc;
        base.n_sink = o->n_sink;
        int is_sparq = strcmp(pol->name, "sparq") == 0;
        int n_a = is_sparq ? (n_ratio ? n_ratio : n_r) : n_ak;
        int n_b = is_sparq && !n_ratio ? n_k : 1;
        for (int a = 0; a < n_a; a++)
            for (int b = 0; b < n_b; b++) {
                if (n >= BENCH_MAX_CFG) {
                    return err_set(err, err_size, "too many policy configurations (max %d)", BENCH_MAX_CFG);
                }
                cfg[n].pol = pol;
                cfg[n].p = base;
                cfg[n].ratio = NULL;
                if (is_sparq && n_ratio) cfg[n].ratio = ratios[a];
                else if (is_sparq) { cfg[n].p.r = (int)rs[a]; cfg[n].p.k = (int)ks[b]; }
                else cfg[n].p.k = (int)aks[a];
                n++;
            }
    }
    return n;
}

int bench_cfg_params(const bench_pol_cfg *c, int64_t S, int d, sparq_attn_params *out, char *err, size_t err_size)
{
    *out = c->p;
    if (c->ratio) {
        attn_opts ao;
        attn_opts_init(&ao);
        ao.attn = "sparq";
        ao.ratio = c->ratio;
        ao.l = c->p.l;
        ao.no_realloc = c->p.no_realloc;
        ao.select = c->p.select_logits ? "logits" : "probs";
        if (attn_opts_params(&ao, S, d, out, err, err_size)) return -1;
    }
    return c->pol->resolve(out, d, err, err_size);
}

void bench_row_params(bench_row *row, const attn_policy *pol, const sparq_attn_params *p)
{
    int sparq = strcmp(pol->name, "sparq") == 0, dense = strcmp(pol->name, "dense") == 0;
    row->r = sparq ? p->r : 0;
    row->k = dense ? 0 : p->k;
    row->l = (sparq || strcmp(pol->name, "h2o") == 0) && p->l > 0 ? p->l : 0;
}

/* ---- KV types ------------------------------------------------------------------- */

int bench_kv_type_of(const char *name)
{
    if (!name || strcmp(name, "f16") == 0) return SPARQ_KV_F16;
    if (strcmp(name, "f32") == 0) return SPARQ_KV_F32;
    if (strcmp(name, "q8_0") == 0) return SPARQ_KV_Q8_0;
    return -1;
}

int bench_kv_elem_list(const char *const *names, int n, int *out, char *err, size_t err_size)
{
    for (int i = 0; i < n; i++) {
        const int t = bench_kv_type_of(names[i]);
        if (t < 0) {
            return err_set(err, err_size, "--kv-type: '%s' is not f16, f32 or q8_0", names[i]);
        }
        out[i] = t == SPARQ_KV_F32 ? KV_F32 : t == SPARQ_KV_Q8_0 ? KV_Q8_0 : KV_F16;
    }
    return 0;
}
