/* bench_decode.c - `bench decode`: end-to-end tokens/s of the real decode
 * path at context depths (bench_run.h), and the context fill `bench
 * prefill` shares.
 *
 * For every KV type, thread count, number of sequences and policy
 * configuration, the depths are run in ascending order on the same
 * contexts (filled further at each depth), so depth 0 (always run) gives
 * the same policy's weights-only baseline; contexts are made anew when the
 * policy's parameters change with the depth (--sparq-ratio). With
 * --rounds R > 1 every policy's contexts are kept at once and the policies
 * take turns, R rounds of -n steps at each depth (run_rounds).
 */
#include "bench/bench_impl.h"
#include "attn/attn_params.h"
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

/* The attention counters of nb contexts, summed. */
static sparq_attn_stats attn_totals(sparq_context **ctxs, int nb)
{
    sparq_attn_stats sum = { 0 }, x;
    for (int b = 0; b < nb; b++) {
        sparq_context_attn_stats(ctxs[b], &x);
        sum.bytes += x.bytes, sum.formula_elements += x.formula_elements, sum.dense_elements += x.dense_elements;
    }
    return sum;
}

/* Decodes n steps from the contexts' current position: one token each
 * (sparq_eval), or, with nb > 1 sequences, one sparq_decode_batch step for
 * all of them, as the server decodes. The tokens follow from seed; with t,
 * t[0..n) gets each step's microseconds and *total their sum (t NULL: an
 * untimed warm-up). logits: nb x n_vocab. 0, or -1 with a message. */
static int decode_steps(sparq_context **ctxs, int nb, int n_vocab, int n, int64_t seed, double *t, double *total,
                        float *logits, char *err, size_t err_size)
{
    int32_t tok[MAX_PARALLEL];
    for (int b = 0; b < nb; b++) tok[b] = (int32_t)((seed * 31 + 7 + 101 * b) % n_vocab);
    for (int i = 0; i < n; i++) {
        if (t)
            for (int b = 0; b < nb; b++) tok[b] = (int32_t)((tok[b] * 1103515245u + 12345u) % (uint32_t)n_vocab);
        double t1 = bench_now();
        if (nb == 1 ? sparq_eval(ctxs[0], tok, 1, logits) : sparq_decode_batch(ctxs, tok, nb, logits)) goto fail;
        if (!t) continue;
        t[i] = (bench_now() - t1) * 1e6;
        *total += t[i];
    }
    return 0;
fail:
    for (int b = 0; b < nb; b++)
        if (sparq_context_error(ctxs[b])[0]) {
            return err_set(err, err_size, "decode at position %lld: %s", (long long)sparq_context_pos(ctxs[b]),
                           sparq_context_error(ctxs[b]));
        }
    return err_set(err, err_size, "decode at position %lld: the step failed", (long long)sparq_context_pos(ctxs[0]));
}

/* The row of n timed steps t[0..n) at depth (work: n more doubles):
 * timing (a step), per-step transfer in bytes of the cache's element type
 * kv_elem summed over the sequences (counted: the contexts' own byte
 * counters s1 - s0; formula and dense: their element counts in the same
 * bytes), the aggregate tokens/s and memory. */
static void decode_row(bench_row *row, const sparq_model *m, int nb, int64_t depth, int kv_elem, const double *t,
                       int n, double *work, double total, const sparq_attn_stats *s0, const sparq_attn_stats *s1)
{
    bench_row_init(row, BENCH_DECODE);
    row->B = nb;
    row->H = sparq_model_n_head(m);
    row->kv_heads = sparq_model_n_kv_head(m);
    row->d = sparq_model_head_dim(m);
    row->S = row->depth = depth;
    row->inner = 1;
    bench_stats_of(t, n, work, &row->us);
    row->kv_elem = kv_elem;
    row->bytes_counted = (s1->bytes - s0->bytes) / n;
    row->bytes_formula = bench_kv_bytes(kv_elem, s1->formula_elements - s0->formula_elements) / n;
    row->bytes_dense = bench_kv_bytes(kv_elem, s1->dense_elements - s0->dense_elements) / n;
    row->theoretical_ratio = bench_ratio((double)row->bytes_formula, (double)row->bytes_dense);
    row->tok_s = nb * 1e6 / row->us.median;
    row->tok_s_mean = total > 0 ? (double)nb * n * 1e6 / total : NAN;
    row->rss = rss_now();
    row->peak_rss = peak_rss();
}

/* Warm-up then o->n_tokens timed steps from the contexts' depth, into row. */
static int decode_point(sparq_context **ctxs, int nb, const sparq_model *m, const bench_opts *o, int64_t depth,
                        int kv_elem, double *t, float *logits, bench_row *row, char *err, size_t err_size)
{
    const int n = o->n_tokens, n_vocab = sparq_model_n_vocab(m);
    double total = 0;
    if (decode_steps(ctxs, nb, n_vocab, o->warmup, depth, NULL, NULL, logits, err, err_size)) return -1;
    const sparq_attn_stats s0 = attn_totals(ctxs, nb); /* the warm-up is not the row's traffic */
    if (decode_steps(ctxs, nb, n_vocab, n, depth, t, &total, logits, err, err_size)) return -1;
    const sparq_attn_stats s1 = attn_totals(ctxs, nb);
    decode_row(row, m, nb, depth, kv_elem, t, n, t + n, total, &s0, &s1);
    return 0;
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
    if (o->n_tokens < 1 || o->n_tokens > (1 << 20)) {
        err_set(err, err_size, "-n must be in [1, 1048576], not %d", o->n_tokens);
        goto fail;
    }
    if (o->rounds < 1 || (int64_t)o->rounds * o->n_tokens > (1 << 20)) {
        err_set(err, err_size, "--rounds must be >= 1 with --rounds x -n <= 1048576, not %d x %d", o->rounds,
                o->n_tokens);
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
    if (ctxs[0] && (!attn_params_equal(p, cur) || sparq_context_pos(ctxs[0]) > depth)) free_contexts(ctxs, s->nb);
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

static void log_row(const decode_series *s, const bench_row *row)
{
    fprintf(s->pl->o->log, "decode: %-9s r=%-3d k=%-5d np=%-3d depth=%-7lld t=%d %s: %8.2f tok/s  %7.3f ms/step "
            "(attn %.3f)  x%.2f\n", row->policy, row->r, row->k, row->B, (long long)row->depth, row->threads,
            s->pl->kv_names[s->ie], row->tok_s, row->us.median / 1e3, row->ms_attn, row->speedup_vs_dense);
}

/* Parameters of configuration c for decoding at depth: a ratio is aimed at
 * the context the measured tokens see; where it cannot be met (tiny
 * depths) the largest depth's choice is used. */
static int depth_params(const bench_decode_plan *pl, int c, int64_t depth, int d, sparq_attn_params *p, char *err,
                        size_t err_size)
{
    const bench_opts *o = pl->o;
    const int64_t measured = (int64_t)(o->warmup > 0 ? o->warmup : 0) + (int64_t)o->rounds * o->n_tokens;
    char e[256];
    if (bench_cfg_params(&pl->cfg[c], depth + measured, d, p, e, sizeof e) &&
        bench_cfg_params(&pl->cfg[c], pl->max_depth + measured, d, p, e, sizeof e)) {
        return err_set(err, err_size, "%s: %s", pl->cfg[c].pol->name, e);
    }
    return 0;
}

/* Fills nb contexts to depth, each sequence its own tokens: caches that
 * differ, as clients' do. */
static int fill_contexts(const decode_series *s, sparq_context **ctxs, int64_t depth, char *err, size_t err_size)
{
    const bench_decode_plan *pl = s->pl;
    const double t0 = bench_now();
    for (int b = 0; b < s->nb; b++)
        if (bench_fill_context(ctxs[b], depth, pl->random_fill, sparq_model_n_vocab(s->m),
                               pl->o->seed + 7919 * (uint64_t)b, err, err_size))
            return -1;
    if (depth > 0)
        fprintf(pl->o->log, "decode: %s fill of %d sequence(s) to depth %lld: %.1f s\n",
                pl->random_fill ? "random" : "prefill", s->nb, (long long)depth, bench_now() - t0);
    return 0;
}

/* One configuration's depths, one after another (--rounds 1). */
static int run_series(const decode_series *s, bench_rows *rl, char *err, size_t err_size)
{
    const bench_decode_plan *pl = s->pl;
    const bench_opts *o = pl->o;
    const int d = sparq_model_head_dim(s->m), nb = s->nb;
    const int warm = o->warmup > 0 ? o->warmup : 0;
    const int64_t n_ctx = pl->max_depth + warm + o->n_tokens + 8;
    sparq_context *ctxs[MAX_PARALLEL] = { 0 };
    sparq_attn_params cur = { 0 };
    double ms_weights = NAN;
    int rc = -1;
    for (int id = 0; id < pl->n_depth; id++) {
        const int64_t depth = pl->depths[id];
        sparq_attn_params p;
        if (depth_params(pl, s->c, depth, d, &p, err, err_size) ||
            series_contexts(s, ctxs, &p, &cur, depth, n_ctx, err, err_size) || fill_contexts(s, ctxs, depth, err, err_size))
            goto done;
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
        log_row(s, row);
    }
    rc = 0;
done:
    free_contexts(ctxs, nb);
    return rc;
}

/* --rounds R > 1: every configuration's contexts at once, filled to each
 * depth in turn, then R rounds that each decode -n steps with every
 * configuration in turn, so what drifts during a run (clock, memory state,
 * other load) falls on all of them alike instead of on whichever ran
 * last. A row's statistics cover its R x n steps; the log shows each
 * round's medians. s->c is unused. */
static int run_rounds(const decode_series *s, bench_rows *rl, char *err, size_t err_size)
{
    const bench_decode_plan *pl = s->pl;
    const bench_opts *o = pl->o;
    const int nc = pl->n_cfg, nb = s->nb, R = o->rounds, n = o->n_tokens;
    const int n_vocab = sparq_model_n_vocab(s->m), d = sparq_model_head_dim(s->m);
    const int warm = o->warmup > 0 ? o->warmup : 0;
    const int64_t n_ctx = pl->max_depth + warm + (int64_t)R * n + 8, per = (int64_t)R * n;
    sparq_context **ctxs = calloc((size_t)nc * nb, sizeof *ctxs);
    sparq_attn_params *cur = calloc((size_t)nc, sizeof *cur), *p = calloc((size_t)nc, sizeof *p);
    sparq_attn_stats *s0 = calloc((size_t)nc, sizeof *s0);
    double *t = malloc(((size_t)nc + 1) * per * sizeof *t), *total = calloc((size_t)nc, sizeof *total);
    double *ms_weights = malloc((size_t)nc * sizeof *ms_weights);
    int rc = -1;
    if (!ctxs || !cur || !p || !s0 || !t || !total || !ms_weights) {
        err_set(err, err_size, "decode: out of memory for %d configurations x %d rounds", nc, R);
        goto done;
    }
    double *work = t + (size_t)nc * per;
    for (int c = 0; c < nc; c++) ms_weights[c] = NAN;
    for (int id = 0; id < pl->n_depth; id++) {
        const int64_t depth = pl->depths[id];
        for (int c = 0; c < nc; c++) {
            if (depth_params(pl, c, depth, d, &p[c], err, err_size) ||
                series_contexts(s, ctxs + (size_t)c * nb, &p[c], &cur[c], depth, n_ctx, err, err_size) ||
                fill_contexts(s, ctxs + (size_t)c * nb, depth, err, err_size) ||
                decode_steps(ctxs + (size_t)c * nb, nb, n_vocab, o->warmup, depth, NULL, NULL, s->logits, err, err_size))
                goto done;
            s0[c] = attn_totals(ctxs + (size_t)c * nb, nb); /* after the warm-up, as decode_point */
            total[c] = 0;
        }
        for (int r = 0; r < R; r++) {
            fprintf(o->log, "decode: np=%d depth=%lld round %d/%d:", nb, (long long)depth, r + 1, R);
            for (int c = 0; c < nc; c++) {
                double *tr = t + (size_t)c * per + (size_t)r * n;
                if (decode_steps(ctxs + (size_t)c * nb, nb, n_vocab, n, depth + (int64_t)r * n + 1, tr, &total[c],
                                 s->logits, err, err_size))
                    goto done;
                bench_stats st;
                bench_stats_of(tr, n, work, &st);
                fprintf(o->log, " %s %.3f ms", pl->cfg[c].pol->name, st.median / 1e3);
            }
            fprintf(o->log, "\n");
        }
        for (int c = 0; c < nc; c++) {
            bench_row *row = bench_rows_push(rl);
            if (!row) {
                err_set(err, err_size, "out of memory");
                goto done;
            }
            const sparq_attn_stats s1 = attn_totals(ctxs + (size_t)c * nb, nb);
            decode_row(row, s->m, nb, depth, pl->kv_elems[s->ie], t + (size_t)c * per, (int)per, work, total[c], &s0[c],
                       &s1);
            decode_series sc = *s;
            sc.c = c;
            series_row(&sc, row, &p[c], id, &ms_weights[c]);
            log_row(&sc, row);
        }
    }
    rc = 0;
done:
    for (int c = 0; ctxs && c < nc; c++) free_contexts(ctxs + (size_t)c * nb, nb);
    free(ctxs);
    free(cur);
    free(p);
    free(s0);
    free(t);
    free(total);
    free(ms_weights);
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
            for (int inp = 0; inp < pl->n_parallel; inp++) {
                s.nb = (int)pl->parallel[inp];
                if (pl->o->rounds > 1 && run_rounds(&s, rl, err, err_size)) goto done;
                for (s.c = 0; pl->o->rounds == 1 && s.c < pl->n_cfg; s.c++)
                    if (run_series(&s, rl, err, err_size)) goto done;
            }
    rc = 0;
done:
    free(s.logits);
    free(s.t);
    return rc;
}
