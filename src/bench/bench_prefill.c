/* bench_prefill.c - `bench prefill` (prompt processing tokens/s and the
 * GFLOP/s it implies) and `bench peak` (the int8 / f32 peak and the
 * prefill GEMM tile's rate, their roofline); see bench_run.h.
 */
#include "bench/bench_run.h"
#include "core/model.h"
#include "tensor/gemm.h"
#include "tensor/quant.h"
#include "util/err.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Arithmetic of one prompt of n tokens after `depth`: 2 flops per weight
 * and token for the layer matrices, the LM head once (the last token's
 * logits, as llama-bench), and causal attention's q.k and p.v (2 x 2 x
 * head_dim flops per query head and visible key). */
static double prefill_gflop(const sparq_model *m, int64_t n, int64_t depth)
{
    const model_hparams *hp = &m->hp;
    double w = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        const weight *ws[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (int i = 0; i < 7; i++) w += (double)ws[i]->n_in * (double)ws[i]->n_out;
    }
    const double keys = (double)n * (double)depth + (double)n * (double)(n + 1) / 2;
    const double attn = 4.0 * hp->head_dim * hp->n_head * hp->n_layer * keys;
    const double head = 2.0 * (double)m->output.n_in * (double)m->output.n_out;
    return (2.0 * w * (double)n + attn + head) / 1e9;
}

/* Median, min and max of ms[0..n) (n <= BENCH_PP_MAX_REPS) into row. */
static void pp_stats(bench_pp_row *row, const double *ms, int n)
{
    double sorted[BENCH_PP_MAX_REPS];
    memcpy(sorted, ms, (size_t)n * sizeof *ms);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of samples */
        for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
            double x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    row->ms = bench_quantile_sorted(sorted, n, 0.5);
    row->ms_min = sorted[0];
    row->ms_max = sorted[n - 1];
    row->reps = n;
}

/* warmup + reps prompts ids[0..n) after refilling ctx to depth; the timed
 * ones' milliseconds in ms[0..reps). */
static int time_prompts(const bench_prefill_cfg *c, sparq_context *ctx, const int32_t *ids, int64_t n,
                        int64_t depth, int n_vocab, float *logits, double *ms, char *err, size_t err_size)
{
    for (int r = 0; r < c->warmup + c->reps; r++) {
        sparq_context_reset(ctx);
        if (bench_fill_context(ctx, depth, 0, n_vocab, 1, err, err_size)) return -1;
        double t0 = bench_now();
        if (sparq_eval(ctx, ids, (int)n, logits)) {
            return err_set(err, err_size, "prefill: %s", sparq_context_error(ctx));
        }
        if (r >= c->warmup) ms[r - c->warmup] = (bench_now() - t0) * 1e3;
    }
    return 0;
}

/* One point: a fresh context of `threads` threads, prompts of n tokens at
 * depth, into row. */
static int prefill_point(const bench_prefill_cfg *c, sparq_model *m, const char *model_name, int64_t n,
                         int64_t depth, int threads, int32_t *ids, float *logits, bench_pp_row *row, char *err,
                         size_t err_size)
{
    const int n_vocab = sparq_model_n_vocab(m);
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = depth + n + 8;
    cp.n_threads = threads;
    cp.n_batch = c->n_batch;
    cp.kv_type = c->kv_type;
    sparq_context *ctx = NULL;
    if (sparq_context_create(m, &cp, &ctx, err, err_size)) return -1;
    for (int64_t i = 0; i < n; i++) /* fixed pseudo-random tokens (no BOS: timing only) */
        ids[i] = (int32_t)(((uint64_t)(depth + i) * 2654435761u + 17) % (uint64_t)n_vocab);
    double ms[BENCH_PP_MAX_REPS];
    int rc = time_prompts(c, ctx, ids, n, depth, n_vocab, logits, ms, err, err_size);
    sparq_context_free(ctx);
    if (rc) return -1;
    memset(row, 0, sizeof *row);
    snprintf(row->test, sizeof row->test, "pp%lld", (long long)n);
    snprintf(row->model, sizeof row->model, "%.63s", model_name);
    const quant_traits *qt = quant_traits_of(m->layers[0].w_down.type);
    snprintf(row->type, sizeof row->type, "%s", qt && qt->name ? qt->name : "?");
    row->n_prompt = n;
    row->depth = depth;
    row->threads = threads;
    pp_stats(row, ms, c->reps);
    row->tok_s = (double)n / (row->ms / 1e3);
    row->gflop = prefill_gflop(m, n, depth);
    row->gflop_s = row->gflop / (row->ms / 1e3);
    return 0;
}

int bench_prefill_run(const bench_prefill_cfg *c, sparq_model *m, const char *model_name, bench_pp_row *rows,
                      int *n_rows, char *err, size_t err_size)
{
    *n_rows = 0;
    const int n_vocab = sparq_model_n_vocab(m);
    int64_t max_p = 0;
    for (int i = 0; i < c->n_prompts; i++) max_p = c->prompts[i] > max_p ? c->prompts[i] : max_p;
    int32_t *ids = malloc((size_t)max_p * sizeof *ids);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    int rc = -1;
    if (!ids || !logits) {
        err_set(err, err_size, "bench prefill: out of memory");
        goto done;
    }
    for (int it = 0; it < c->n_threads; it++)
        for (int id = 0; id < c->n_depths; id++)
            for (int ip = 0; ip < c->n_prompts; ip++) {
                bench_pp_row *row = &rows[*n_rows];
                if (prefill_point(c, m, model_name, c->prompts[ip], c->depths[id], (int)c->threads[it], ids, logits,
                                  row, err, err_size))
                    goto done;
                (*n_rows)++;
                fprintf(c->log, "prefill: pp%lld depth %lld t=%d: %.2f tok/s, %.1f GFLOP/s\n",
                        (long long)c->prompts[ip], (long long)c->depths[id], row->threads, row->tok_s, row->gflop_s);
            }
    rc = 0;
done:
    free(ids);
    free(logits);
    return rc;
}

/* ---- peak ------------------------------------------------------------------------- */

static const char *const peak_names[3] = { "int8-vnni", "f32-fma", "gemm-q8_0" };

enum { PR = 64, PT = 64, PN = 2048 }; /* the GEMM tile loop: rows, tokens, width */

/* One thread's prefill GEMM tile loop (what a prefill would run); the
 * operations done, 0 when the build has no Q8_0 GEMM, -1 when out of
 * memory. */
static double gemm_tile_loop(int64_t iters, float *sink)
{
    if (!gemm_supported(QT_Q8_0)) return 0;
    const size_t rb = gemm_row_bytes(QT_Q8_0, PN), ab = gemm_act_bytes(QT_Q8_0, PN), wrb = (size_t)PN / 32 * 34;
    uint8_t *w = calloc(PR, wrb), *pw = aligned_alloc(64, (PR * rb + 63) / 64 * 64), *pa = aligned_alloc(64, PT * ab);
    float *x = malloc(PN * sizeof(float)), *out = malloc(PR * PT * sizeof(float));
    double ops = -1;
    if (w && pw && pa && x && out) {
        for (int i = 0; i < PN; i++) x[i] = (float)((i * 37) % 11) - 5.0f;
        for (int i = 0; i < PR * (int)wrb; i++) w[i] = (uint8_t)(i * 13);
        for (int i = 0; i < PR * (int)wrb; i += 34) w[i + 1] = 0x20; /* f16 scale 2^-7ish */
        gemm_pack_rows(QT_Q8_0, w, wrb, PR, PN, pw);
        for (int t = 0; t < PT; t++) gemm_pack_act(QT_Q8_0, x, PN, pa + t * ab);
        const int64_t loops = iters / 20000 + 1;
        for (int64_t l = 0; l < loops; l++) gemm_panel(QT_Q8_0, pw, PR, pa, PT, PN, out, PR);
        *sink = out[0];
        ops = 2.0 * PR * PT * PN * (double)loops;
    }
    free(w); free(pw); free(pa); free(x); free(out);
    return ops;
}

/* Times loop `kind` (0 int8, 1 f32, 2 GEMM tile) on `threads` threads:
 * ms[0..reps), the operations of one run in *ops (0: not in this build).
 * -1 when out of memory. */
static int time_peak(int kind, int threads, int reps, int warmup, int64_t iters, double *ms, double *ops)
{
    *ops = 0;
    for (int r = 0; r < warmup + reps; r++) {
        double t0 = bench_now(), sum_ops = 0;
        int failed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum_ops, failed)
        {
            float sink = 0;
            if (kind == 0) sum_ops += gemm_peak_int8(iters, &sink);
            else if (kind == 1) sum_ops += gemm_peak_f32(iters, &sink);
            else {
                const double o = gemm_tile_loop(iters, &sink);
                if (o < 0) failed++;
                else sum_ops += o;
            }
            if (sink == 12345.678f) sum_ops += 1; /* keeps sink live */
        }
        if (failed) return -1;
        if (r >= warmup) ms[r - warmup] = (bench_now() - t0) * 1e3;
        *ops = sum_ops;
    }
    return 0;
}

int bench_peak_run(const int64_t *threads, int n_threads, int reps, int warmup, int64_t iters, FILE *log,
                   bench_pp_row *rows, int *n_rows, char *err, size_t err_size)
{
    *n_rows = 0;
    for (int it = 0; it < n_threads; it++)
        for (int kind = 0; kind < 3; kind++) {
            double ms[BENCH_PP_MAX_REPS], ops = 0;
            if (time_peak(kind, (int)threads[it], reps, warmup, iters, ms, &ops)) {
                return err_set(err, err_size, "bench peak: out of memory");
            }
            if (ops == 0) {
                fprintf(log, "bench peak: %s: this build has no such %s; skipped\n", peak_names[kind],
                        kind == 2 ? "prefill GEMM" : "AVX-512 loop");
                continue;
            }
            bench_pp_row *row = &rows[(*n_rows)++];
            memset(row, 0, sizeof *row);
            snprintf(row->test, sizeof row->test, "%s", peak_names[kind]);
            snprintf(row->model, sizeof row->model, "-");
            snprintf(row->type, sizeof row->type, "%s", kind == 1 ? "F32" : "Q8_0");
            row->threads = (int)threads[it];
            pp_stats(row, ms, reps);
            row->gflop = ops / 1e9;
            row->gflop_s = row->gflop / (row->ms / 1e3);
            row->tok_s = NAN;
            fprintf(log, "peak: %s t=%d: %.1f GOP/s\n", row->test, row->threads, row->gflop_s);
        }
    return 0;
}
