/* sweep.c - settings, ratio sweeps and the runs behind `sparq eval`
 * (contract in sweep.h).
 *
 * Map:
 *   eval_settings_make                          --attn list/all x --sweep
 *   eval_setting_params, fit_k                  a setting at cache length S
 *   eval_setting_label, note_params             what a setting used
 *   run_examples, run_fidelity, eval_sweep_run  the runs
 *   eval_rows_make                              aggregates
 */
#include "util/err.h"
#include "eval/sweep.h"

#include "attn/attn.h"
#include "attn/attn_params.h"
#include "eval/metrics.h"
#include "sparq_attn.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- settings ----------------------------------------------------------------------- */

static int split_list(const char *s, char items[][24], int max, char *err, size_t err_size)
{
    int n = 0;
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len == 0 || len >= 24 || n == max)
            return err_set(err, err_size, "bad list item in '%s' (at most %d items of < 24 characters)", s, max);
        memcpy(items[n], s, len);
        items[n++][len] = 0;
        s += len + (comma ? 1 : 0);
        if (comma && !*s) return err_set(err, err_size, "trailing comma in list");
    }
    return n;
}

int eval_settings_make(const char *attn, const char *sweep, eval_setting *set, int *n_set, char *err,
                       size_t err_size)
{
    enum { MAX_NAMES = 16 };
    char names[MAX_NAMES][24], vals[EVAL_MAX_SWEEP][24];
    int n_names = 0, n_vals = 0, kind = EVAL_SWEEP_NONE;
    *n_set = 0;
    if (strcmp(attn, "all") == 0) { /* the registry's comparison set */
        for (int i = 0; i < attn_policy_count() && n_names < MAX_NAMES; i++)
            if (attn_policy_at(i)->in_all) snprintf(names[n_names++], sizeof names[0], "%s", attn_policy_at(i)->name);
    } else if ((n_names = split_list(attn, names, MAX_NAMES, err, err_size)) < 0) {
        return -1;
    }
    for (int i = 0; i < n_names; i++) {
        sparq_attn_params p = sparq_attn_default_params();
        p.policy = names[i];
        if (sparq_attn_formula(&p, 1024, 64, 1, err, err_size) < 0) return -1;
    }
    if (sweep) {
        const char *eq = strchr(sweep, '=');
        if (!eq) return err_set(err, err_size, "--sweep '%s' must be ratio=LIST or k=LIST", sweep);
        if ((size_t)(eq - sweep) == 5 && strncmp(sweep, "ratio", 5) == 0) kind = EVAL_SWEEP_RATIO;
        else if ((size_t)(eq - sweep) == 1 && sweep[0] == 'k') kind = EVAL_SWEEP_K;
        else return err_set(err, err_size, "--sweep '%s': only ratio= and k= are known", sweep);
        if ((n_vals = split_list(eq + 1, vals, EVAL_MAX_SWEEP, err, err_size)) <= 0) {
            if (n_vals == 0) err_set(err, err_size, "--sweep '%s' has no values", sweep);
            return -1;
        }
    }
    /* every value is checked, whichever policies it applies to */
    double ratios[EVAL_MAX_SWEEP];
    int ks[EVAL_MAX_SWEEP];
    for (int v = 0; v < n_vals; v++) {
        if (kind == EVAL_SWEEP_RATIO && (ratios[v] = attn_parse_ratio(vals[v])) < 0)
            return err_set(err, err_size, "--sweep ratio '%.23s' must be a fraction in (0, 1], e.g. 1/8", vals[v]);
        if (kind == EVAL_SWEEP_K) {
            char *end;
            long k = strtol(vals[v], &end, 10);
            if (*end || k < 1 || k > INT32_MAX)
                return err_set(err, err_size, "--sweep k '%.23s' must be a positive integer", vals[v]);
            ks[v] = (int)k;
        }
    }
    int n = 0, n_swept = 0;
    for (int i = 0; i < n_names; i++) {
        const int swept = kind != EVAL_SWEEP_NONE && strcmp(names[i], "dense") != 0;
        n_swept += swept;
        for (int v = 0; v < (swept ? n_vals : 1); v++) {
            if (n == EVAL_MAX_SETTINGS) return err_set(err, err_size, "too many settings (at most %d)", EVAL_MAX_SETTINGS);
            eval_setting *s = &set[n++];
            memset(s, 0, sizeof *s);
            *n_set = n; /* the caller frees what was made */
            memcpy(s->policy, names[i], sizeof s->policy);
            s->sweep = swept ? kind : EVAL_SWEEP_NONE;
            s->k_min = s->l_min = INT32_MAX;
            s->k_max = s->l_max = -1;
            if (s->sweep == EVAL_SWEEP_RATIO) {
                s->ratio = ratios[v];
                snprintf(s->ratio_str, sizeof s->ratio_str, "%.23s", vals[v]);
            } else if (s->sweep == EVAL_SWEEP_K) {
                s->k = ks[v];
            }
        }
    }
    if (kind != EVAL_SWEEP_NONE && n_swept == 0)
        return err_set(err, err_size, "--sweep applies to the non-dense policies and --attn '%s' has none", attn);
    return 0;
}

void eval_setting_free(eval_setting *s)
{
    if (!s) return;
    free(s->value);
    free(s->kl);
    free(s->fdiv);
    free(s->grid_len);
    free(s->grid_depth);
    s->value = s->kl = s->fdiv = s->grid_depth = NULL;
    s->grid_len = NULL;
}

/* The largest k in [1, S] whose formula stays within budget; 0 if none. */
static int fit_k(sparq_attn_params p, int64_t S, int d, int g, double budget)
{
    char err[256];
    int64_t lo = 0, hi = S < INT32_MAX ? S : INT32_MAX;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        p.k = (int)mid;
        if (p.l > p.k) p.l = -1;
        const int64_t f = sparq_attn_formula(&p, S, d, g, err, sizeof err);
        if (f >= 0 && (double)f <= budget) lo = mid;
        else hi = mid - 1;
    }
    return (int)lo;
}

int eval_setting_params(const eval_setting *s, const eval_sweep_env *env, int64_t S, sparq_attn_params *out,
                        char *err, size_t err_size)
{
    if (env->base(env->base_user, s->policy, S, env->d, out, err, err_size)) return -1;
    if (s->sweep == EVAL_SWEEP_K) out->k = s->k;
    if (s->sweep != EVAL_SWEEP_RATIO) return 0;

    /* SparQ at the ratio, for SparQ itself and for --match k */
    int r = 0, k = 0;
    const int sparq_ok = attn_sparq_ratio(s->ratio, S, env->d, &r, &k) == 0;
    if (!sparq_ok)
        err_set(err, err_size, "--sparq-ratio %s is too small for context %lld and head size %d", s->ratio_str,
                (long long)S, env->d);
    if (strcmp(s->policy, "sparq") == 0 || env->match_k) {
        if (!sparq_ok) return 1;
        if (strcmp(s->policy, "sparq") == 0) {
            out->r = r;
            if (out->l < 0) out->l = k / 4;
        }
        out->k = k;
        return 0;
    }
    sparq_attn_params dp = sparq_attn_default_params();
    const double budget = s->ratio * (double)sparq_attn_formula(&dp, S, env->d, env->g, err, err_size);
    const int fk = fit_k(*out, S, env->d, env->g, budget * (1 + 1e-9));
    if (fk < 1) {
        err_set(err, err_size, "%s cannot transfer only %s of dense at S=%lld (d=%d): its formula exceeds the budget at k=1",
                s->policy, s->ratio_str, (long long)S, env->d);
        return 1;
    }
    out->k = fk;
    return 0;
}

void eval_setting_label(const eval_setting *s, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
#define ADD(...) n += (size_t)snprintf(buf + n, n < size ? size - n : 0, __VA_ARGS__)
    if (s->sweep == EVAL_SWEEP_RATIO) ADD("ratio=%s ", s->ratio_str);
    if (strcmp(s->policy, "dense") != 0 && s->k_max >= 0) {
        if (strcmp(s->policy, "sparq") == 0) ADD("r=%d ", s->r);
        if (s->k_min == s->k_max) ADD("k=%d ", s->k_min);
        else ADD("k=%d-%d ", s->k_min, s->k_max);
        if (strcmp(s->policy, "sparq") == 0 || strcmp(s->policy, "h2o") == 0) {
            if (s->l_min == s->l_max) ADD("l=%d ", s->l_min);
            else ADD("l=%d-%d ", s->l_min, s->l_max);
        }
    }
#undef ADD
    if (n > 0 && n <= size && buf[n - 1] == ' ') buf[n - 1] = 0;
    if (!buf[0]) snprintf(buf, size, "-");
}

/* Records the parameters a run used, the policy's own defaults filled in. */
static void note_params(eval_setting *s, const sparq_attn_params *p, int d)
{
    sparq_attn_params q = *p;
    char err[256];
    const attn_policy *pol = attn_policy_find(q.policy ? q.policy : "dense");
    if (!pol || pol->resolve(&q, d, err, sizeof err)) q = *p;
    s->r = q.r;
    if (q.k < s->k_min) s->k_min = q.k;
    if (q.k > s->k_max) s->k_max = q.k;
    if (q.l < s->l_min) s->l_min = q.l;
    if (q.l > s->l_max) s->l_max = q.l;
}

/* ---- running ------------------------------------------------------------------------ */

static int aborted(const eval_sweep *w)
{
    return w->cp.abort_flag && *w->cp.abort_flag;
}

static void say(const eval_sweep *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const eval_sweep *w, const char *fmt, ...)
{
    if (!w->note) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    w->note(w->user, line);
}

static int64_t count_prompt_tokens(void *ctx, const char *text, size_t n)
{
    return n > INT32_MAX ? -1 : sparq_tokenize(ctx, text, (int)n, 1, NULL, 0);
}

/* Room for n results in every setting (kl/fdiv for fidelity, the grid for
 * grid tasks). */
static int alloc_results(eval_setting *set, int n_set, int64_t n, int fidelity, int grid)
{
    const size_t m = (size_t)(n > 0 ? n : 1);
    for (int s = 0; s < n_set; s++) {
        eval_setting *st = &set[s];
        if (!(st->value = malloc(m * sizeof(double)))) return -1;
        if (fidelity && (!(st->kl = malloc(m * sizeof(double))) || !(st->fdiv = malloc(m * sizeof(double)))))
            return -1;
        if (grid && (!(st->grid_len = malloc(m * sizeof(int64_t))) || !(st->grid_depth = malloc(m * sizeof(double)))))
            return -1;
    }
    return 0;
}

/* A context for setting st at cache length S: 0 with *c (and *ap), 1 if
 * the setting cannot reach its budget (skipped: counted, reason kept), -1
 * on an error. */
static int setting_context(eval_setting *st, const eval_sweep *w, int64_t S, sparq_attn_params *ap,
                           sparq_context **c, char *err, size_t err_size)
{
    *c = NULL;
    const int rc = eval_setting_params(st, &w->env, S, ap, err, err_size);
    if (rc > 0) {
        st->n_skipped++;
        snprintf(st->skip_reason, sizeof st->skip_reason, "%.159s", err);
        return 1;
    }
    if (rc < 0) return -1;
    sparq_context_params cp = w->cp;
    cp.attn = *ap;
    return sparq_context_create(w->m, &cp, c, err, err_size) ? -1 : 0;
}

/* Records one finished run of st: its value, parameters and transfer. */
static void record(eval_setting *st, const eval_sweep *w, const sparq_attn_params *ap, double value,
                   const sparq_attn_stats *a)
{
    note_params(st, ap, w->env.d);
    st->value[st->n++] = value;
    st->attn.elements += a->elements;
    st->attn.dense_elements += a->dense_elements;
    st->attn.formula_elements += a->formula_elements;
    st->attn.nominal_elements += a->nominal_elements;
    st->attn.steps += a->steps;
}

/* One example under every setting. Returns 0, or -1 with err. */
static int run_example(const eval_sweep *w, const task_set *ts, int64_t i, eval_setting *set, int n_set,
                       eval_sweep_summary *sum, char *err, size_t err_size)
{
    task_example ex;
    eval_prepared pr;
    if (task_get(ts, i, &ex, err, err_size)) return -1;
    const eval_task_params ep = eval_task_default_params();
    if (eval_prepare(w->m, w->cp.n_ctx, w->task, &ex, &ep, &pr, err, err_size)) {
        task_example_free(&ex);
        return -1;
    }
    sum->n_prepared++;
    if (pr.n_dropped > 0) {
        sum->n_truncated++;
        sum->n_dropped += pr.n_dropped;
    }
    const int64_t S = w->ratio_len > 0 ? w->ratio_len : eval_prepared_mean_len(&pr);
    int rc = 0;
    for (int s = 0; s < n_set && !aborted(w) && rc == 0; s++) {
        eval_setting *st = &set[s];
        sparq_attn_params ap;
        sparq_context *c;
        eval_result r;
        const int sc = setting_context(st, w, S, &ap, &c, err, err_size);
        if (sc > 0) continue;
        if ((rc = sc) < 0) break;
        rc = eval_run(c, &pr, &r, err, err_size);
        sparq_context_free(c);
        if (rc) {
            if (aborted(w)) rc = 0; /* stopped mid-run: not an error, not a result */
            break;
        }
        if (st->grid_len) {
            st->grid_len[st->n] = ex.grid_length;
            st->grid_depth[st->n] = ex.grid_depth;
        }
        record(st, w, &ap, r.value, &r.attn);
        if (w->ran) {
            eval_sweep_note note = { st, i, &ex, &pr, &r, NULL };
            w->ran(w->user, &note);
        }
        eval_result_free(&r);
    }
    eval_prepared_free(&pr);
    task_example_free(&ex);
    return rc;
}

static int run_examples(const eval_sweep *w, task_set *ts, eval_setting *set, int n_set, eval_sweep_summary *sum,
                        char *err, size_t err_size)
{
    int64_t n = task_count(ts);
    if (w->limit > 0 && w->limit < n) n = w->limit;
    if (alloc_results(set, n_set, n, 0, w->task->grid)) return err_set(err, err_size, "out of memory");
    say(w, "eval %s: %lld examples x %d settings, context %lld", w->task->name, (long long)n, n_set,
        (long long)w->cp.n_ctx);
    for (int64_t i = 0; i < n && !aborted(w); i++) {
        if (w->progress) w->progress(w->user, "example", i, n);
        char msg[512];
        if (run_example(w, ts, i, set, n_set, sum, msg, sizeof msg))
            return err_set(err, err_size, "%s example %lld: %s", w->task->name, (long long)i, msg);
        if (!aborted(w)) sum->n_done++;
    }
    return 0;
}

static int run_fidelity(const eval_sweep *w, task_set *ts, eval_setting *set, int n_set, eval_sweep_summary *sum,
                        char *err, size_t err_size)
{
    task_example text;
    int32_t *ids = NULL, *win = NULL;
    sparq_context *dense = NULL;
    int rc = -1;
    if (task_get(ts, 0, &text, err, err_size)) return -1;
    const int64_t n_ids = eval_tokenize(w->m, text.prompt, text.n_prompt, 0, &ids, err, err_size);
    const int bos = sparq_token_bos(w->m);
    const int lead = bos >= 0 ? 1 : 0; /* each window starts with BOS */
    task_fid_layout L;
    if (n_ids < 0 || task_fidelity_layout(&w->tp, w->cp.n_ctx, n_ids, lead, &L, err, err_size)) goto done;
    int64_t n = L.n_windows;
    if (w->limit > 0 && w->limit < n) n = w->limit;
    const sparq_attn_params dp = sparq_attn_default_params();
    win = malloc((size_t)(L.prompt + L.forced) * sizeof *win);
    if (!win || alloc_results(set, n_set, n, 1, 0)) {
        err_set(err, err_size, "fidelity: out of memory");
        goto done;
    }
    sparq_context_params dcp = w->cp;
    dcp.attn = dp;
    if (sparq_context_create(w->m, &dcp, &dense, err, err_size)) goto done;
    say(w, "eval fidelity: %lld windows of %d prompt + %d forced tokens, %d greedy, x %d settings (%s)",
        (long long)n, L.prompt, L.forced, L.gen, n_set, text.id);
    const int64_t S = w->ratio_len > 0 ? w->ratio_len : (int64_t)(L.mean_len + 0.5);
    const int P = L.prompt;
    for (int64_t i = 0; i < n && !aborted(w); i++) {
        if (w->progress) w->progress(w->user, "window", i, n);
        if (lead) win[0] = bos;
        memcpy(win + lead, ids + i * L.stride, (size_t)L.stride * sizeof *win);
        eval_reference ref;
        if (eval_reference_run(dense, win, P, win + P, L.forced, L.gen, &ref, err, err_size)) {
            if (aborted(w)) break;
            goto done;
        }
        int frc = 0;
        for (int s = 0; s < n_set && !aborted(w) && frc == 0; s++) {
            eval_setting *st = &set[s];
            sparq_attn_params ap;
            sparq_context *c;
            eval_fidelity f;
            const int sc = setting_context(st, w, S, &ap, &c, err, err_size);
            if (sc > 0) continue;
            if ((frc = sc) < 0) break;
            frc = eval_fidelity_run(c, &ref, win, P, win + P, &f, err, err_size);
            sparq_context_free(c);
            if (frc) break;
            st->kl[st->n] = f.n_steps ? f.kl_sum / (double)f.n_steps : 0.0;
            st->fdiv[st->n] = (double)f.first_divergence;
            record(st, w, &ap, f.n_steps ? (double)f.n_top1_agree / (double)f.n_steps : 1.0, &f.attn);
            if (w->ran) {
                eval_sweep_note note = { st, i, NULL, NULL, NULL, &f };
                w->ran(w->user, &note);
            }
        }
        eval_reference_free(&ref);
        if (frc && !aborted(w)) goto done;
        if (frc) break;
        sum->n_done++;
    }
    rc = 0;
done:
    if (rc && strncmp(err, "fidelity:", 9) != 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", err);
        err_set(err, err_size, "fidelity: %s", msg);
    }
    sparq_context_free(dense);
    free(win);
    free(ids);
    task_example_free(&text);
    return rc;
}

int eval_sweep_run(const eval_sweep *w, eval_setting *set, int n_set, eval_sweep_summary *out, char *err,
                   size_t err_size)
{
    memset(out, 0, sizeof *out);
    /* fail early on bad attention options */
    for (int s = 0; s < n_set; s++) {
        sparq_attn_params ap;
        if (eval_setting_params(&set[s], &w->env, w->cp.n_ctx, &ap, err, err_size) < 0) return -1;
    }
    task_params tp = w->tp;
    tp.n_ctx = w->cp.n_ctx;
    tp.count_tokens = count_prompt_tokens;
    tp.count_ctx = w->m;
    task_set *ts = NULL;
    if (task_open(&ts, w->task, &tp, err, err_size)) return -1;
    const int rc = w->task->run == TASK_RUN_FIDELITY ? run_fidelity(w, ts, set, n_set, out, err, err_size)
                                                     : run_examples(w, ts, set, n_set, out, err, err_size);
    task_close(ts);
    return rc;
}

/* ---- aggregates --------------------------------------------------------------------- */

/* value - dense value per example (the same examples in the same order):
 * its standard error is far smaller than either row's when the examples
 * vary more than the policies do (BPC). */
static void add_delta(eval_row *r, const eval_setting *dense)
{
    const eval_setting *s = r->s;
    if (!dense || s == dense || s->kl || s->n < 1 || s->n != dense->n) return;
    double *d = malloc((size_t)s->n * sizeof *d);
    if (!d) return;
    for (int64_t i = 0; i < s->n; i++) d[i] = s->value[i] - dense->value[i];
    r->has_delta = 1;
    r->delta = metrics_mean(d, s->n);
    r->delta_se = metrics_stderr(d, s->n);
    free(d);
}

void eval_rows_make(const eval_setting *set, int n_set, eval_row *rows)
{
    const eval_setting *dense = NULL;
    for (int i = 0; i < n_set && !dense; i++)
        if (strcmp(set[i].policy, "dense") == 0) dense = &set[i];
    for (int i = 0; i < n_set; i++) {
        const eval_setting *s = &set[i];
        eval_row *r = &rows[i];
        memset(r, 0, sizeof *r);
        r->s = s;
        eval_setting_label(s, r->params, sizeof r->params);
        r->value = metrics_mean(s->value, s->n);
        r->stderr_ = metrics_stderr(s->value, s->n);
        r->transfer = s->attn.dense_elements > 0 ? (double)s->attn.elements / (double)s->attn.dense_elements : NAN;
        r->formula = s->attn.dense_elements > 0 ? (double)s->attn.formula_elements / (double)s->attn.dense_elements
                                                : NAN;
        if (s->kl) {
            r->kl = metrics_mean(s->kl, s->n);
            r->kl_se = metrics_stderr(s->kl, s->n);
            r->fdiv = metrics_mean(s->fdiv, s->n);
            r->fdiv_se = metrics_stderr(s->fdiv, s->n);
        }
        add_delta(r, dense);
    }
}
