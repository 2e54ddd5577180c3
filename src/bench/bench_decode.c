/* bench_decode.c - `bench decode`: end-to-end tokens/s of the real decode
 * path at context depths (bench_run.h), and the context fill `bench
 * prefill` shares.
 *
 * For every KV type, thread count, number of sequences and policy
 * configuration, the depths are run in ascending order on the same
 * contexts (filled further at each depth), so depth 0 (always run) gives
 * the same policy's weights-only baseline; contexts are made anew when the
 * policy's parameters change with the depth (--sparq-ratio).
 */
#include "bench/bench_impl.h"
#include "util/err.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

enum { MAX_PARALLEL = 256 };

struct bench_decode_plan {
    const bench_opts *o;
    int64_t depths[BENCH_MAX_LIST + 1];   /* ascending, 0 first          */
    int64_t threads[BENCH_MAX_LIST], parallel[BENCH_MAX_LIST];
    int n_depth, n_threads, n_parallel;
    int64_t max_parallel, max_depth;
    const char *kv_names[4];              /* into kv_buf                  */
    char kv_buf[64];
    int kv_elems[4], n_kv;
    char names_buf[512], ratio_buf[256];  /* what cfg points into         */
    bench_pol_cfg cfg[BENCH_MAX_CFG];
    int n_cfg;
    int random_fill;
};

int bench_fill_context(sparq_context *c, int64_t depth, int random_fill, int n_vocab, uint64_t seed, char *err,
                       size_t err_size)
{
    int64_t pos = sparq_context_pos(c);
    if (depth <= pos) return 0;
    if (random_fill) {
        if (sparq_context_fill_random(c, depth - pos, seed + (uint64_t)pos)) goto fail;
        return 0;
    }
    enum { CHUNK = 4096 };
    int32_t *ids = malloc(CHUNK * sizeof *ids);
    if (!ids) {
        return err_set(err, err_size, "decode: out of memory");
    }
    while (pos < depth) {
        int n = depth - pos < CHUNK ? (int)(depth - pos) : CHUNK;
        /* a fixed pseudo-random token sequence (no BOS: timing only) */
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(((uint64_t)(pos + i) * 2654435761u + seed) % (uint64_t)n_vocab);
        if (sparq_eval(c, ids, n, NULL)) {
            free(ids);
            goto fail;
        }
        pos += n;
    }
    free(ids);
    return 0;
fail:
    err_set(err, err_size, "decode: fill to depth %lld: %s", (long long)depth, sparq_context_error(c));
    return -1;
}

/* Resident set size now, bytes (/proc/self/statm); -1 if unknown. */
static int64_t rss_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long long size = 0, res = -1;
    int ok = fscanf(f, "%lld %lld", &size, &res) == 2;
    fclose(f);
    return ok ? (int64_t)res * sysconf(_SC_PAGESIZE) : -1;
}

/* Peak resident set size of this process in bytes (-1 if unknown). */
static int64_t peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

/* Decodes warm-up then n timed steps from the contexts' current position
 * (the depth): one token each (sparq_eval), or, with nb > 1 sequences, one
 * sparq_decode_batch step for all of them, as the server decodes. Fills the
 * row's timing (a step), per-step transfer in bytes of the cache's element
 * type kv_elem summed over the sequences (counted: the contexts' own byte
 * counters; formula and dense: their element counts in the same bytes),
 * the aggregate tokens/s and memory. logits: nb x n_vocab. */
static int decode_point(sparq_context **ctxs, int nb, const sparq_model *m, const bench_opts *o, int64_t depth,
                        int kv_elem, double *t, float *logits, bench_row *row, char *err, size_t err_size)
{
    const int n_vocab = sparq_model_n_vocab(m), n = o->n_tokens;
    int32_t tok[MAX_PARALLEL];
    for (int b = 0; b < nb; b++) tok[b] = (int32_t)((depth * 31 + 7 + 101 * b) % n_vocab);
    for (int w = 0; w < o->warmup; w++)
        if (nb == 1 ? sparq_eval(ctxs[0], tok, 1, logits) : sparq_decode_batch(ctxs, tok, nb, logits)) goto fail;
    sparq_attn_stats s0 = { 0 }, s1 = { 0 }, x;
    for (int b = 0; b < nb; b++) {
        sparq_context_attn_stats(ctxs[b], &x);
        s0.bytes += x.bytes, s0.formula_elements += x.formula_elements, s0.dense_elements += x.dense_elements;
    }
    double total = 0;
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < nb; b++) tok[b] = (int32_t)((tok[b] * 1103515245u + 12345u) % (uint32_t)n_vocab);
        double t1 = bench_now();
        if (nb == 1 ? sparq_eval(ctxs[0], tok, 1, logits) : sparq_decode_batch(ctxs, tok, nb, logits)) goto fail;
        t[i] = (bench_now() - t1) * 1e6;
        total += t[i];
    }
    for (int b = 0; b < nb; b++) {
        sparq_context_attn_stats(ctxs[b], &x);
        s1.bytes += x.bytes, s1.formula_elements += x.formula_elements, s1.dense_elements += x.dense_elements;
    }
    bench_row_init(row, BENCH_DECODE);
    row->B = nb;
    row->H = sparq_model_n_head(m);
    row->kv_heads = sparq_model_n_kv_head(m);
    row->d = sparq_model_head_dim(m);
    row->S = row->depth = depth;
    row->inner = 1;
    bench_stats_of(t, n, t + n, &row->us);
    row->kv_elem = kv_elem;
    row->bytes_counted = (s1.bytes - s0.bytes) / n;
    row->bytes_formula = bench_kv_bytes(kv_elem, s1.formula_elements - s0.formula_elements) / n;
    row->bytes_dense = bench_kv_bytes(kv_elem, s1.dense_elements - s0.dense_elements) / n;
    row->theoretical_ratio = bench_ratio((double)row->bytes_formula, (double)row->bytes_dense);
    row->tok_s = nb * 1e6 / row->us.median;
    row->tok_s_mean = total > 0 ? (double)nb * n * 1e6 / total : NAN;
    row->rss = rss_now();
    row->peak_rss = peak_rss();
    return 0;
fail:
    for (int b = 0; b < nb; b++)
        if (sparq_context_error(ctxs[b])[0]) {
            return err_set(err, err_size, "decode at depth %lld: %s", (long long)depth, sparq_context_error(ctxs[b]));
        }
    return err_set(err, err_size, "decode at depth %lld: the step failed", (long long)depth);
}

static void free_contexts(sparq_context **ctxs, int n)
{
    for (int b = 0; b < n; b++) {
        sparq_context_free(ctxs[b]);
        ctxs[b] = NULL;
    }
}

int bench_decode_prepare(const bench_opts *o, bench_decode_plan **plan, char *err, size_t err_size)
{
    *plan = NULL;
    bench_decode_plan *pl = calloc(1, sizeof *pl);
    if (!pl) {
        return err_set(err, err_size, "out of memory");
    }
    pl->o = o;
    char def_t[16];
    snprintf(def_t, sizeof def_t, "%d", omp_get_num_procs());
    enum { M = BENCH_MAX_LIST };
    pl->n_depth = bench_int_list("--depth", o->depth, "0,4k", 0, (int64_t)1 << 31, pl->depths, M, err, err_size);
    pl->n_threads = pl->n_depth < 0 ? -1 : bench_int_list("-t", o->threads, def_t, 1, 1024, pl->threads, M, err,
                                                          err_size);
    if (pl->n_threads < 0) goto fail;
    pl->n_parallel = bench_int_list("-np", o->parallel, "1", 1, MAX_PARALLEL, pl->parallel, M, err, err_size);
    if (pl->n_parallel < 0) goto fail;
    pl->max_parallel = 1;
    for (int i = 0; i < pl->n_parallel; i++)
        pl->max_parallel = pl->parallel[i] > pl->max_parallel ? pl->parallel[i] : pl->max_parallel;
    pl->depths[pl->n_depth++] = 0; /* the weights-only baseline */
    pl->n_depth = bench_sort_unique(pl->depths, pl->n_depth);
    pl->max_depth = pl->depths[pl->n_depth - 1];
    pl->n_kv = bench_split_names(o->kv_type ? o->kv_type : "f16", pl->kv_buf, sizeof pl->kv_buf, pl->kv_names, 4,
                                 err, err_size);
    if (pl->n_kv < 0 || bench_kv_elem_list(pl->kv_names, pl->n_kv, pl->kv_elems, err, err_size)) goto fail;
    if (o->fill && strcmp(o->fill, "random") == 0) pl->random_fill = 1;
    else if (o->fill && strcmp(o->fill, "prefill") != 0) {
        err_set(err, err_size, "--fill must be prefill or random, not '%s'", o->fill);
        goto fail;
    }
    if (o->n_tokens < 1) {
        err_set(err, err_size, "-n must be >= 1");
        goto fail;
    }
    pl->n_cfg = bench_build_cfgs(o, pl->cfg, pl->names_buf, sizeof pl->names_buf, pl->ratio_buf,
                                 sizeof pl->ratio_buf, err, err_size);
    if (pl->n_cfg < 0) goto fail;
    *plan = pl;
    return 0;
fail:
    free(pl);
    return -1;
}

void bench_decode_plan_free(bench_decode_plan *plan) { free(plan); }

/* One series: configuration c with nb sequences at thread count index it
 * and KV type index ie, every depth in turn. dense_tok_s[depth index] is
 * set by the dense series (c == 0) and read by the others. */
typedef struct decode_series {
    const bench_decode_plan *pl;
    sparq_model *m;
    const char *model_name;
    int ie, it, nb, c;
    float *logits;         /* [max_parallel][n_vocab] */
    double *t;             /* [2 n_tokens]            */
    double *dense_tok_s;   /* [n_depth]               */
} decode_series;

/* The contexts for parameters p: kept while p stays the same and they are
 * not past the depth, else made anew. */
static int series_contexts(const decode_series *s, sparq_context **ctxs, const sparq_attn_params *p,
                           sparq_attn_params *cur, int64_t depth, int64_t n_ctx, char *err, size_t err_size)
{
    const bench_decode_plan *pl = s->pl;
    if (ctxs[0] && (!bench_same_params(p, cur) || sparq_context_pos(ctxs[0]) > depth)) free_contexts(ctxs, s->nb);
    if (ctxs[0]) return 0;
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = (int)pl->threads[s->it];
    cp.n_batch = pl->o->n_batch;
    cp.kv_type = bench_kv_type_of(pl->kv_names[s->ie]);
    cp.attn = *p;
    for (int b = 0; b < s->nb; b++)
        if (sparq_context_create(s->m, &cp, &ctxs[b], err, err_size)) return -1;
    *cur = *p;
    return 0;
}

/* The row of one depth after decode_point: names, parameters, the
 * weights/attention split and the speed-up over dense at that depth. */
static void series_row(const decode_series *s, bench_row *row, const sparq_attn_params *p, int id,
                       double *ms_weights)
{
    const bench_decode_plan *pl = s->pl;
    const bench_pol_cfg *cfg = &pl->cfg[s->c];
    snprintf(row->policy, sizeof row->policy, "%s", cfg->pol->name);
    snprintf(row->model, sizeof row->model, "%.63s", s->model_name);
    snprintf(row->fill, sizeof row->fill, "%s", pl->random_fill ? "random" : "prefill");
    bench_row_params(row, cfg->pol, p);
    row->threads = (int)pl->threads[s->it];
    if (pl->depths[id] == 0) *ms_weights = row->us.median / 1e3;
    row->ms_weights = *ms_weights;
    row->ms_attn = row->us.median / 1e3 - *ms_weights;
    if (row->ms_attn > 0) row->gbps = bench_gbps((double)row->bytes_counted, row->ms_attn * 1e3);
    if (s->c == 0) s->dense_tok_s[id] = row->tok_s;
    row->speedup_vs_dense = s->dense_tok_s[id] > 0 ? row->tok_s / s->dense_tok_s[id] : NAN;
}

static int run_series(const decode_series *s, bench_rows *rl, char *err, size_t err_size)
{
    const bench_decode_plan *pl = s->pl;
    const bench_opts *o = pl->o;
    const bench_pol_cfg *cfg = &pl->cfg[s->c];
    const int n_vocab = sparq_model_n_vocab(s->m), d = sparq_model_head_dim(s->m), nb = s->nb;
    const int warm = o->warmup > 0 ? o->warmup : 0;
    const int64_t n_ctx = pl->max_depth + warm + o->n_tokens + 8;
    sparq_context *ctxs[MAX_PARALLEL] = { 0 };
    sparq_attn_params cur = { 0 };
    double ms_weights = NAN;
    int rc = -1;
    for (int id = 0; id < pl->n_depth; id++) {
        const int64_t depth = pl->depths[id];
        sparq_attn_params p;
        char e[256];
        /* a ratio is aimed at the context the measured tokens see; where it
         * cannot be met (tiny depths) the largest depth's choice is used */
        if (bench_cfg_params(cfg, depth + warm + o->n_tokens, d, &p, e, sizeof e) &&
            bench_cfg_params(cfg, pl->max_depth + warm + o->n_tokens, d, &p, e, sizeof e)) {
            err_set(err, err_size, "%s: %s", cfg->pol->name, e);
            goto done;
        }
        if (series_contexts(s, ctxs, &p, &cur, depth, n_ctx, err, err_size)) goto done;
        double t0 = bench_now();
        /* each sequence its own tokens: caches that differ, as clients' do */
        for (int b = 0; b < nb; b++)
            if (bench_fill_context(ctxs[b], depth, pl->random_fill, n_vocab, o->seed + 7919 * (uint64_t)b, err,
                                   err_size))
                goto done;
        if (depth > 0)
            fprintf(o->log, "decode: %s fill of %d sequence(s) to depth %lld: %.1f s\n",
                    pl->random_fill ? "random" : "prefill", nb, (long long)depth, bench_now() - t0);
        bench_row *row = bench_rows_push(rl);
        if (!row) {
            err_set(err, err_size, "out of memory");
            goto done;
        }
        if (decode_point(ctxs, nb, s->m, o, depth, pl->kv_elems[s->ie], s->t, s->logits, row, err, err_size)) {
            rl->n--; /* nothing measured: not a row to report */
            goto done;
        }
        series_row(s, row, &p, id, &ms_weights);
        fprintf(o->log, "decode: %-9s r=%-3d k=%-5d np=%-3d depth=%-7lld t=%d %s: %8.2f tok/s  %7.3f ms/step "
                "(attn %.3f)  x%.2f\n", row->policy, row->r, row->k, nb, (long long)depth, row->threads,
                pl->kv_names[s->ie], row->tok_s, row->us.median / 1e3, row->ms_attn, row->speedup_vs_dense);
    }
    rc = 0;
done:
    free_contexts(ctxs, nb);
    return rc;
}

int bench_decode_run(const bench_decode_plan *pl, sparq_model *m, const char *model_name, bench_rows *rl,
                     char *err, size_t err_size)
{
    const int n_vocab = sparq_model_n_vocab(m);
    decode_series s = { .pl = pl, .m = m, .model_name = model_name };
    s.logits = malloc((size_t)pl->max_parallel * n_vocab * sizeof(float));
    s.t = malloc((size_t)pl->o->n_tokens * 2 * sizeof(double));
    double dense_tok_s[BENCH_MAX_LIST + 1];
    s.dense_tok_s = dense_tok_s;
    int rc = -1;
    if (!s.logits || !s.t) {
        err_set(err, err_size, "decode: out of memory");
        goto done;
    }
    for (s.ie = 0; s.ie < pl->n_kv; s.ie++)
        for (s.it = 0; s.it < pl->n_threads; s.it++)
            for (int inp = 0; inp < pl->n_parallel; inp++)
                for (s.c = 0; s.c < pl->n_cfg; s.c++) {
                    s.nb = (int)pl->parallel[inp];
                    if (run_series(&s, rl, err, err_size)) goto done;
                }
    rc = 0;
done:
    free(s.logits);
    free(s.t);
    return rc;
}
