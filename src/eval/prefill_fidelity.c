/* prefill_fidelity.c - exact against sparse prefill on windows of a text
 * (prefill_fidelity.h). */
#include "eval/prefill_fidelity.h"
#include "eval/metrics.h"
#include "util/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int eval_pf_tokens(const sparq_model *m, const char *text, size_t len, int64_t need, int32_t **ids, int64_t *n_ids,
                   int *n_text)
{
    *ids = NULL;
    const int n = *n_text = sparq_tokenize(m, text, (int)len, 1, NULL, 0);
    int32_t *v = NULL;
    if (n <= 1 || !(v = malloc((size_t)(need > n ? need : n) * sizeof *v)) ||
        sparq_tokenize(m, text, (int)len, 1, v, n) != n) {
        free(v);
        return -1;
    }
    int64_t have = n;
    while (have < need) { /* the text again, without its BOS */
        const int64_t take = need - have < n - 1 ? need - have : n - 1;
        memcpy(v + have, v + 1, (size_t)take * sizeof *v);
        have += take;
    }
    *ids = v;
    *n_ids = have;
    return 0;
}

void eval_mean_se(const double *x, int n, double *mean, double *se)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    const double m = n > 0 ? s / n : 0;
    double v = 0;
    for (int i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    *se = n > 1 ? sqrt(v / (n - 1) / n) : 0;
}

/* One window: both prefills, then F teacher-forced steps in lockstep. */
static int run_window(sparq_context *ce, sparq_context *cs, const int32_t *ids, int N, int F, float *le, float *ls,
                      int V, eval_pf_window *w, char *err, size_t err_size)
{
    sparq_context_reset(ce);
    sparq_context_reset(cs);
    double t0 = now_s();
    if (sparq_eval(ce, ids, N, le)) return err_set(err, err_size, "exact prefill: %s", sparq_context_error(ce));
    w->exact_s = now_s() - t0;
    t0 = now_s();
    if (sparq_eval(cs, ids, N, ls)) return err_set(err, err_size, "sparse prefill: %s", sparq_context_error(cs));
    w->sparse_s = now_s() - t0;
    int agree = 0;
    double kl = 0;
    w->kl_max = 0;
    w->first_div = F;
    /* the prefill's own last row is not compared: it is the sparse
     * attention's output, not a read of the cache; step i feeds ids[N + i]
     * through dense decode attention over each cache */
    for (int i = 0; i < F; i++) {
        if (sparq_eval(ce, &ids[N + i], 1, le) || sparq_eval(cs, &ids[N + i], 1, ls))
            return err_set(err, err_size, "forced step %d: %s", i, sparq_context_error(ce));
        const double k = metrics_kl_logits(le, ls, V);
        const int same = metrics_argmax(le, V) == metrics_argmax(ls, V);
        kl += k;
        if (k > w->kl_max) w->kl_max = k;
        agree += same;
        if (!same && w->first_div == F) w->first_div = i;
    }
    w->top1 = (double)agree / F;
    w->kl = kl / F;
    return 0;
}

int eval_prefill_fidelity(sparq_model *m, const eval_pf_setup *su, const int32_t *ids, int64_t n_ids,
                          eval_pf_window *win, eval_pf_result *out, char *err, size_t err_size)
{
    const int N = su->N, F = su->F, n_windows = su->n_windows;
    memset(out, 0, sizeof *out);
    if (N < 2 || F < 1 || n_windows < 1)
        return err_set(err, err_size, "prefill fidelity: %d prefilled, %d forced tokens, %d windows", N, F,
                       n_windows);
    if (n_ids < (int64_t)N + F)
        return err_set(err, err_size, "prefill fidelity: the text has %lld tokens, a window needs %d + %d",
                       (long long)n_ids, N, F);
    sparq_context_params pe = *su->base, ps = *su->base;
    pe.n_ctx = ps.n_ctx = (int64_t)N + F;
    memset(&pe.prefill, 0, sizeof pe.prefill);
    ps.prefill = *su->sparse;
    sparq_context *ce = NULL, *cs = NULL;
    const int V = sparq_model_n_vocab(m);
    float *le = malloc((size_t)V * sizeof *le), *ls = malloc((size_t)V * sizeof *ls);
    double *a = malloc((size_t)n_windows * 3 * sizeof *a);
    eval_pf_window *w = win ? win : calloc((size_t)n_windows, sizeof *w);
    int rc = -1;
    if (!le || !ls || !a || !w) {
        err_set(err, err_size, "prefill fidelity: out of memory");
        goto done;
    }
    if (sparq_context_create(m, &pe, &ce, err, err_size) || sparq_context_create(m, &ps, &cs, err, err_size))
        goto done;
    const int64_t span = n_ids - ((int64_t)N + F);
    for (int i = 0; i < n_windows; i++) {
        w[i].offset = n_windows > 1 ? span * i / (n_windows - 1) : 0;
        if (run_window(ce, cs, ids + w[i].offset, N, F, le, ls, V, &w[i], err, err_size)) goto done;
        a[i] = w[i].top1;
        a[n_windows + i] = w[i].kl;
        a[2 * n_windows + i] = w[i].first_div;
        out->exact_s += w[i].exact_s / n_windows;
        out->sparse_s += w[i].sparse_s / n_windows;
        if (su->progress) su->progress(su->user, i + 1, n_windows);
    }
    out->n_windows = n_windows;
    eval_mean_se(a, n_windows, &out->top1, &out->top1_se);
    eval_mean_se(a + n_windows, n_windows, &out->kl, &out->kl_se);
    eval_mean_se(a + 2 * n_windows, n_windows, &out->first_div, &out->first_div_se);
    rc = 0;
done:
    sparq_context_free(ce);
    sparq_context_free(cs);
    if (w != win) free(w);
    free(a);
    free(le);
    free(ls);
    return rc;
}
