/* eval.c - the evaluation harness (contract in eval.h).
 *
 * Map:
 *   set_err                       small helper
 *   eval_truncate_left ...        tokens: truncation, tokenizing, characters
 *   eval_generate                 greedy decoding with stop rules
 *   eval_forced_nll               teacher forcing
 *   eval_prepare / eval_run       task examples: lengths, truncation, scoring
 *   eval_reference_run, eval_fidelity_*   dense vs policy on one window
 *   stats_tap_*, eval_attn_stats  attention statistics through an observer
 *                                 wrapped around the context's policy
 *
 * Only the statistics pass looks inside the context (model.h): it swaps the
 * context's policy for an observer that calls the real policy first (so the
 * forward pass is unchanged) and then measures the queries and keys it was
 * given. Everything else uses the public API.
 */
#include "util/err.h"
#include "eval/eval.h"
#include "util/textbuf.h"

#include "attn/attn.h"
#include "eval/metrics.h"
#include "core/model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void attn_stats_add(sparq_attn_stats *acc, const sparq_attn_stats *x)
{
    acc->elements += x->elements;
    acc->dense_elements += x->dense_elements;
    acc->formula_elements += x->formula_elements;
    acc->bytes += x->bytes;
    acc->steps += x->steps;
}

/* ---- tokens --------------------------------------------------------------------- */

int64_t eval_truncate_left(int32_t *ids, int64_t n, int64_t max_n, int keep_first)
{
    if (max_n < 1) max_n = 1;
    if (n <= max_n) return n;
    if (keep_first && max_n >= 2) {
        memmove(ids + 1, ids + (n - (max_n - 1)), (size_t)(max_n - 1) * sizeof *ids);
        return max_n;
    }
    memmove(ids, ids + (n - max_n), (size_t)max_n * sizeof *ids);
    return max_n;
}

int64_t eval_tokenize(const sparq_model *m, const char *text, size_t n, int add_special,
                      int32_t **ids, char *err, size_t err_size)
{
    *ids = NULL;
    if (n > INT_MAX) return err_set(err, err_size, "tokenize: text of %zu bytes is too long", n);
    int count = sparq_tokenize(m, text, (int)n, add_special, NULL, 0);
    if (count < 0) return err_set(err, err_size, "tokenize: cannot tokenize %zu bytes of text", n);
    int32_t *buf = malloc(((size_t)count + 1) * sizeof *buf);
    if (!buf) return err_set(err, err_size, "tokenize: out of memory for %d tokens", count);
    if (sparq_tokenize(m, text, (int)n, add_special, buf, count) != count) {
        free(buf);
        return err_set(err, err_size, "tokenize: token count changed between calls");
    }
    *ids = buf;
    return count;
}

/* Tokens of s without special tokens; -1 on failure. */
static int64_t count_tokens(const sparq_model *m, const char *s)
{
    size_t n = strlen(s);
    if (n > INT_MAX) return -1;
    return sparq_tokenize(m, s, (int)n, 0, NULL, 0);
}

int64_t eval_token_chars(const sparq_model *m, const int32_t *ids, int64_t n)
{
    int64_t chars = 0;
    char piece[256];
    for (int64_t i = 0; i < n; i++) {
        int len = sparq_token_to_piece(m, ids[i], piece, sizeof piece);
        if (len > (int)sizeof piece) len = sizeof piece;
        /* a byte-fallback piece is one raw byte: counting the bytes that are
         * not UTF-8 continuations per piece equals counting the whole text */
        if (len > 0) chars += metrics_utf8_chars(piece, (size_t)len);
    }
    return chars;
}

/* ---- greedy generation ------------------------------------------------------------ */

const char *eval_stop_name(eval_stop s)
{
    switch (s) {
    case EVAL_STOP_MAX_TOKENS: return "max_tokens";
    case EVAL_STOP_EOG: return "end_of_generation";
    case EVAL_STOP_STRING: return "stop_string";
    case EVAL_STOP_CONTEXT_FULL: return "context_full";
    }
    return "?";
}

void eval_generation_free(eval_generation *g)
{
    if (!g) return;
    free(g->tokens);
    free(g->text);
    memset(g, 0, sizeof *g);
}

int eval_generate(sparq_context *c, const int32_t *prompt, int n_prompt, const eval_gen_params *p,
                  eval_generation *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const int n_vocab = sparq_model_n_vocab(c->model);
    if (n_prompt < 1) return err_set(err, err_size, "generate: empty prompt");
    if (p->max_tokens < 0) return err_set(err, err_size, "generate: max_tokens %d < 0", p->max_tokens);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    if (!logits) return err_set(err, err_size, "generate: out of memory");
    sparq_context_reset(c);
    if (sparq_eval(c, prompt, n_prompt, logits)) {
        err_set(err, err_size, "generate: prefill of %d tokens: %s", n_prompt, sparq_context_error(c));
        free(logits);
        return -1;
    }
    /* the loop is the library's (sparq_generate), greedy: no sampler */
    sparq_generate_params gp = sparq_generate_default_params();
    gp.max_tokens = p->max_tokens;
    gp.ignore_eog = !p->stop_at_eog;
    const char *stops[1] = { p->stop };
    gp.stop = stops;
    gp.n_stop = p->stop && p->stop[0] ? 1 : 0;
    sparq_generation g;
    int rc = sparq_generate(c, logits, &gp, &g);
    free(logits);
    if (rc) return err_set(err, err_size, "generate: %s", sparq_context_error(c));
    if (g.stop == SPARQ_STOP_ABORTED) { /* an interrupted run has no metric */
        sparq_generation_free(&g);
        return err_set(err, err_size, "generate: eval: aborted");
    }
    out->tokens = g.tokens;
    out->n_tokens = g.n_tokens;
    out->text = g.text;
    out->n_text = g.n_text;
    out->stop = g.stop == SPARQ_STOP_EOG            ? EVAL_STOP_EOG
                : g.stop == SPARQ_STOP_STRING       ? EVAL_STOP_STRING
                : g.stop == SPARQ_STOP_CONTEXT_FULL ? EVAL_STOP_CONTEXT_FULL
                                                    : EVAL_STOP_MAX_TOKENS;
    sparq_context_attn_stats(c, &out->attn);
    return 0;
}

/* ---- teacher forcing ---------------------------------------------------------------- */

int eval_forced_nll(sparq_context *c, const int32_t *prompt, int n_prompt, const int32_t *target,
                    int n_target, double *nll, sparq_attn_stats *attn, char *err, size_t err_size)
{
    const int n_vocab = sparq_model_n_vocab(c->model);
    if (n_prompt < 1 || n_target < 1)
        return err_set(err, err_size, "forced: %d prompt and %d target tokens (need >= 1 each)",
                       n_prompt, n_target);
    if ((int64_t)n_prompt + n_target - 1 > sparq_context_n_ctx(c))
        return err_set(err, err_size, "forced: %d prompt + %d target tokens exceed the context %lld",
                       n_prompt, n_target, (long long)sparq_context_n_ctx(c));
    for (int i = 0; i < n_target; i++)
        if (target[i] < 0 || target[i] >= n_vocab)
            return err_set(err, err_size, "forced: target token %d at %d is outside [0, %d)", target[i],
                           i, n_vocab);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    if (!logits) return err_set(err, err_size, "forced: out of memory");
    sparq_context_reset(c);
    int rc = 0;
    if (sparq_eval(c, prompt, n_prompt, logits)) {
        rc = err_set(err, err_size, "forced: prefill of %d tokens: %s", n_prompt, sparq_context_error(c));
    } else {
        nll[0] = metrics_nll(logits, n_vocab, target[0]);
        for (int i = 1; i < n_target; i++) {
            if (sparq_eval(c, &target[i - 1], 1, logits)) {
                rc = err_set(err, err_size, "forced: step %d: %s", i, sparq_context_error(c));
                break;
            }
            nll[i] = metrics_nll(logits, n_vocab, target[i]);
        }
    }
    if (attn) sparq_context_attn_stats(c, attn);
    free(logits);
    return rc;
}

/* ---- task examples --------------------------------------------------------------------- */

eval_task_params eval_task_default_params(void)
{
    eval_task_params p;
    p.qa_max_tokens = 30;
    p.qa_spare_tokens = 5;
    p.summary_max_tokens = 128;
    p.repetition_max_tokens = 128;
    p.bpc_max_tokens = 256;
    p.niah_spare_tokens = 5;
    p.kvret_spare_tokens = 10;
    p.stop_at_eog = 1;
    return p;
}

void eval_prepared_free(eval_prepared *pr)
{
    if (!pr) return;
    free(pr->prompt);
    free(pr->target);
    memset(pr, 0, sizeof *pr);
}

/* WikiText: the prompt and reference are tokenized together, so the scored
 * tokens are the text's own tokenization; the prompt is the longest common
 * prefix of that and the prompt's own encoding (one token shorter when a
 * token straddles the boundary). */
static int prepare_forced(const sparq_model *m, int64_t n_ctx, const task_example *ex,
                          const eval_task_params *p, eval_prepared *out, char *err, size_t err_size)
{
    const char *ref = ex->answers[0], *name = out->task->name;
    const size_t n_ref = strlen(ref);
    int32_t *pids = NULL, *full = NULL;
    char *joined = malloc(ex->n_prompt + n_ref + 1);
    if (!joined) return err_set(err, err_size, "%s: out of memory", name);
    memcpy(joined, ex->prompt, ex->n_prompt);
    memcpy(joined + ex->n_prompt, ref, n_ref + 1);
    int rc = -1;
    int64_t np = eval_tokenize(m, ex->prompt, ex->n_prompt, 1, &pids, err, err_size);
    int64_t nf = np < 0 ? -1 : eval_tokenize(m, joined, ex->n_prompt + n_ref, 1, &full, err, err_size);
    if (nf < 0) goto done;
    const int64_t cp = metrics_common_prefix(pids, np, full, nf);
    if (cp < 1) {
        err_set(err, err_size, "%s: prompt and reference tokenize with no common prefix", name);
        goto done;
    }
    int64_t n_target = nf - cp;
    if (n_target > p->bpc_max_tokens) n_target = p->bpc_max_tokens;
    if (n_target > n_ctx / 2) n_target = n_ctx / 2; /* keep half the context for the prefill */
    if (n_target < 1) {
        err_set(err, err_size, "%s: the reference adds no tokens", name);
        goto done;
    }
    const int64_t max_prompt = n_ctx - n_target + 1;
    if (max_prompt < 2) {
        err_set(err, err_size, "%s: context %lld too small for %lld teacher-forced tokens",
                name, (long long)n_ctx, (long long)n_target);
        goto done;
    }
    out->target = malloc((size_t)n_target * sizeof *out->target);
    if (!out->target) {
        err_set(err, err_size, "%s: out of memory", name);
        goto done;
    }
    memcpy(out->target, full + cp, (size_t)n_target * sizeof *full);
    out->n_target = (int)n_target;
    out->n_target_chars = eval_token_chars(m, out->target, n_target);
    const int keep_bos = full[0] == sparq_token_bos(m);
    const int64_t kept = eval_truncate_left(full, cp, max_prompt, keep_bos);
    out->n_dropped = cp - kept;
    out->n_prompt = (int)kept;
    out->prompt = full; /* its first `kept` entries are the prompt */
    full = NULL;
    rc = 0;
done:
    free(joined);
    free(pids);
    free(full);
    return rc;
}

int eval_prepare(const sparq_model *m, int64_t n_ctx, const task_def *task, const task_example *ex,
                 const eval_task_params *p, eval_prepared *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    out->task = task;
    out->ex = ex;
    out->stop_at_eog = p->stop_at_eog;
    const char *name = task->name;
    if (ex->n_answers < 1 || !ex->answers || !ex->answers[0])
        return err_set(err, err_size, "%s: example %s has no answer/reference", name, ex->id ? ex->id : "?");
    if (n_ctx > INT_MAX) n_ctx = INT_MAX;
    if (task->run == TASK_RUN_FORCED) {
        if (prepare_forced(m, n_ctx, ex, p, out, err, err_size)) {
            eval_prepared_free(out);
            return -1;
        }
        return 0;
    }
    if (task->run != TASK_RUN_GENERATE || !task->gen_tokens || !task->score)
        return err_set(err, err_size, "%s: not a task of single examples", name);
    int64_t longest = 0;
    for (int i = 0; i < ex->n_answers; i++) {
        int64_t t = count_tokens(m, ex->answers[i]);
        if (t < 0) return err_set(err, err_size, "%s: cannot tokenize an answer", name);
        if (t > longest) longest = t;
    }
    int64_t n_gen = task->gen_tokens(p, longest);
    if (n_gen < 1) n_gen = 1;
    const int64_t max_prompt = n_ctx - n_gen + 1; /* n_gen tokens need n_gen - 1 more positions */
    if (max_prompt < 2)
        return err_set(err, err_size, "%s: context %lld too small to generate %lld tokens", name,
                       (long long)n_ctx, (long long)n_gen);
    int32_t *ids = NULL;
    int64_t n = eval_tokenize(m, ex->prompt, ex->n_prompt, 1, &ids, err, err_size);
    if (n < 0) return -1;
    if (n == 0) {
        free(ids);
        return err_set(err, err_size, "%s: empty prompt and no BOS token", name);
    }
    const int64_t kept = eval_truncate_left(ids, n, max_prompt, ids[0] == sparq_token_bos(m));
    out->prompt = ids;
    out->n_prompt = (int)kept;
    out->n_dropped = n - kept;
    out->n_gen = (int)n_gen;
    return 0;
}

int64_t eval_prepared_mean_len(const eval_prepared *pr)
{
    /* decode steps see S = n_prompt + 1 .. n_prompt + steps */
    const int64_t steps = pr->task->run == TASK_RUN_FORCED ? pr->n_target - 1 : pr->n_gen - 1;
    if (steps <= 0) return pr->n_prompt;
    return pr->n_prompt + (steps + 1) / 2;
}

void eval_result_free(eval_result *r)
{
    if (!r) return;
    free(r->output);
    memset(r, 0, sizeof *r);
}

int eval_run(sparq_context *c, const eval_prepared *pr, eval_result *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const task_example *ex = pr->ex;
    const char *name = pr->task->name;
    if (pr->task->run == TASK_RUN_FORCED) {
        double *nll = malloc((size_t)pr->n_target * sizeof *nll);
        if (!nll) return err_set(err, err_size, "%s: out of memory", name);
        int rc = eval_forced_nll(c, pr->prompt, pr->n_prompt, pr->target, pr->n_target, nll, &out->attn,
                                 err, err_size);
        if (rc == 0) {
            for (int i = 0; i < pr->n_target; i++) out->nll_sum += nll[i];
            out->n_chars = pr->n_target_chars;
            out->value = metrics_bpc(out->nll_sum, out->n_chars);
        }
        free(nll);
        return rc;
    }
    eval_gen_params gp = { pr->n_gen, pr->stop_at_eog, NULL };
    eval_generation g;
    if (eval_generate(c, pr->prompt, pr->n_prompt, &gp, &g, err, err_size)) return -1;
    const int rc = pr->task->score(ex, g.text, g.n_text, &out->value, err, err_size);
    out->n_generated = g.n_tokens;
    out->stop = g.stop;
    out->attn = g.attn;
    out->output = g.text;
    out->n_output = g.n_text;
    g.text = NULL;
    eval_generation_free(&g);
    if (rc) eval_result_free(out);
    return rc;
}

/* ---- fidelity vs dense ------------------------------------------------------------------ */

void eval_reference_free(eval_reference *r)
{
    if (!r) return;
    free(r->logits);
    free(r->greedy);
    memset(r, 0, sizeof *r);
}

/* Resets c, prefills prompt and feeds cont[0..n) one decode step at a time;
 * row i of logits (or the single row if stride is 0) receives the logits
 * after cont[i]. each(i, row) is called after every step when set. */
typedef void (*forced_step_fn)(void *user, int i, const float *logits);
static int run_forced(sparq_context *c, const int32_t *prompt, int n_prompt, const int32_t *cont, int n,
                      float *logits, size_t stride, forced_step_fn each, void *user, char *err,
                      size_t err_size)
{
    sparq_context_reset(c);
    if (sparq_eval(c, prompt, n_prompt, NULL))
        return err_set(err, err_size, "fidelity: prefill of %d tokens: %s", n_prompt, sparq_context_error(c));
    for (int i = 0; i < n; i++) {
        float *row = logits + (size_t)i * stride;
        if (sparq_eval(c, &cont[i], 1, row))
            return err_set(err, err_size, "fidelity: step %d: %s", i, sparq_context_error(c));
        if (each) each(user, i, row);
    }
    return 0;
}

int eval_reference_run(sparq_context *c, const int32_t *prompt, int n_prompt, const int32_t *cont,
                       int n_forced, int n_gen, eval_reference *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const int n_vocab = sparq_model_n_vocab(c->model);
    if (n_prompt < 1 || n_forced < 0 || n_gen < 0)
        return err_set(err, err_size, "fidelity: %d prompt, %d forced, %d generated tokens", n_prompt,
                       n_forced, n_gen);
    if ((int64_t)n_prompt + (n_forced > n_gen - 1 ? n_forced : n_gen - 1) > sparq_context_n_ctx(c))
        return err_set(err, err_size, "fidelity: %d prompt + %d forced / %d generated tokens exceed the context %lld",
                       n_prompt, n_forced, n_gen, (long long)sparq_context_n_ctx(c));
    out->n_vocab = n_vocab;
    out->logits = malloc(((size_t)n_forced * n_vocab + 1) * sizeof *out->logits);
    if (!out->logits) return err_set(err, err_size, "fidelity: out of memory for %d x %d logits", n_forced, n_vocab);
    if (run_forced(c, prompt, n_prompt, cont, n_forced, out->logits, (size_t)n_vocab, NULL, NULL, err, err_size))
        goto fail;
    out->n_forced = n_forced;
    eval_gen_params gp = { n_gen, 0, NULL };
    eval_generation g;
    if (eval_generate(c, prompt, n_prompt, &gp, &g, err, err_size)) goto fail;
    out->greedy = g.tokens;
    out->n_gen = g.n_tokens;
    g.tokens = NULL;
    eval_generation_free(&g);
    return 0;
fail:
    eval_reference_free(out);
    return -1;
}

void eval_fidelity_step(eval_fidelity *f, const float *p, const float *q, int n_vocab)
{
    const double kl = metrics_kl_logits(p, q, n_vocab);
    f->kl_sum += kl;
    if (f->n_steps == 0 || kl > f->kl_max) f->kl_max = kl;
    f->n_top1_agree += metrics_argmax(p, n_vocab) == metrics_argmax(q, n_vocab);
    f->n_steps++;
}

typedef struct fid_ctx {
    eval_fidelity        *f;
    const eval_reference *ref;
} fid_ctx;

static void fid_each(void *user, int i, const float *logits)
{
    fid_ctx *x = user;
    eval_fidelity_step(x->f, x->ref->logits + (size_t)i * x->ref->n_vocab, logits, x->ref->n_vocab);
}

int eval_fidelity_run(sparq_context *c, const eval_reference *ref, const int32_t *prompt,
                      int n_prompt, const int32_t *cont, eval_fidelity *out, char *err,
                      size_t err_size)
{
    memset(out, 0, sizeof *out);
    if (sparq_model_n_vocab(c->model) != ref->n_vocab)
        return err_set(err, err_size, "fidelity: reference has %d logits, model %d", ref->n_vocab,
                       sparq_model_n_vocab(c->model));
    float *logits = malloc((size_t)ref->n_vocab * sizeof *logits);
    if (!logits) return err_set(err, err_size, "fidelity: out of memory");
    fid_ctx x = { out, ref };
    int rc = run_forced(c, prompt, n_prompt, cont, ref->n_forced, logits, 0, fid_each, &x, err, err_size);
    free(logits);
    if (rc) return -1;
    sparq_attn_stats st;
    sparq_context_attn_stats(c, &st);
    eval_gen_params gp = { ref->n_gen, 0, NULL };
    eval_generation g;
    if (eval_generate(c, prompt, n_prompt, &gp, &g, err, err_size)) return -1;
    out->n_gen = ref->n_gen;
    out->first_divergence = metrics_common_prefix(ref->greedy, ref->n_gen, g.tokens, g.n_tokens);
    out->attn = st;
    attn_stats_add(&out->attn, &g.attn);
    eval_generation_free(&g);
    return 0;
}

/* ---- attention statistics --------------------------------------------------------------- */

eval_stats_params eval_stats_default_params(void)
{
    eval_stats_params p;
    memset(&p, 0, sizeof p);
    p.n_query = 64;
    p.k = 32;
    return p;
}

void eval_stats_free(eval_stats *s)
{
    if (!s) return;
    free(s->heads);
    memset(s, 0, sizeof *s);
}

/* The observer wrapped around the context's policy during the measured
 * decode steps. Calls for different KV heads of one layer run concurrently;
 * each KV head has its own work area and writes only its own heads' sums. */
typedef struct stats_tap {
    const attn_policy *inner;
    void              *inner_state;
    eval_stats        *out;
    int                g;
    float             *work;   /* [n_kv_head][work_floats]  */
    int32_t           *iwork;  /* [n_kv_head][iwork_ints]   */
    size_t             work_floats, iwork_ints;
    int64_t            stride; /* max(tokens, d): length of each work array */
    double            *pow_sums; /* [n_layer * n_head][4]: sums of q, q^2, q^3, q^4 */
} stats_tap;

/* Fisher kurtosis of x[0..n): m4 / m2^2 - 3 with population moments. */
static double kurtosis(const float *x, int n)
{
    double mu = 0, m2 = 0, m4 = 0;
    for (int i = 0; i < n; i++) mu += x[i];
    mu /= n;
    for (int i = 0; i < n; i++) {
        double e = x[i] - mu, e2 = e * e;
        m2 += e2;
        m4 += e2 * e2;
    }
    m2 /= n;
    m4 /= n;
    return m2 > 0 ? m4 / (m2 * m2) - 3.0 : 0.0;
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* In place: x[0..n) = softmax(x) (double accumulation). */
static void softmax_inplace(float *x, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (x[i] = expf(x[i] - mx));
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

/* sh[i] = sum_c q[comp[c]] K[i][comp[c]] (approximate logits, unscaled). */
static void approx_logits(const float *Kf, int64_t S, int d, const float *q, const int32_t *comp, int r,
                          float *sh)
{
    for (int64_t i = 0; i < S; i++) {
        const float *k = Kf + i * d;
        float s = 0;
        for (int c = 0; c < r; c++) s += q[comp[c]] * k[comp[c]];
        sh[i] = s;
    }
}

static int stats_tap_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    stats_tap *t = state;
    if (t->inner->attend(t->inner_state, p, step)) return -1;
    const int layer = step->layer, kv_head = step->kv_head, g = step->g;
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;

    eval_stats *st = t->out;
    const int64_t S = kv->S;
    const int d = kv->d, n_r = st->n_r;
    const int64_t kk = st->k < S ? st->k : S;
    /* work (N = stride >= S, d): Kf [N][d] | s, prob, sh, sorted [N] | absq [d] */
    const int64_t N = t->stride;
    float *Kf = t->work + (size_t)kv_head * t->work_floats;
    float *s = Kf + (size_t)N * d, *prob = s + N, *sh = prob + N, *sorted = sh + N, *absq = sorted + N;
    /* iwork: idx_e, idx_a [N], top-k work [attn_topk_work(N)], mark [N] |
     * comps [n_r + 1][d]; mark is all zero between calls */
    int32_t *idx_e = t->iwork + (size_t)kv_head * t->iwork_ints;
    int32_t *idx_a = idx_e + N, *twork = idx_a + N;
    int32_t *mark = twork + attn_topk_work((size_t)N), *comps = mark + N;

    for (int64_t i = 0; i < S; i++) /* the keys in f32, whatever the cache holds */
        for (int j = 0; j < d; j++)
            Kf[i * d + j] = attn_kv_at(kv->K, kv->elem, d, i, j);
    /* SparQ step 1 for the group: the r largest of sum_h |q_h[j]|, for every
     * r measured (row n_r is alpha_r) */
    for (int j = 0; j < d; j++) {
        absq[j] = 0;
        for (int h = 0; h < g; h++) absq[j] += fabsf(q[h * d + j]);
    }
    for (int ir = 0; ir <= n_r; ir++) {
        const int r = ir < n_r ? st->r[ir] : st->alpha_r;
        attn_topk_indices(absq, d, r, comps + ir * d, twork);
    }
    const float scale = 1.0f / sqrtf((float)d);
    for (int h = 0; h < g; h++) {
        const float *qh = q + h * d;
        eval_head_stats *hs = &st->heads[(size_t)layer * st->n_head + (size_t)kv_head * g + h];
        hs->kurtosis += kurtosis(qh, d);
        double *ps = t->pow_sums + 4 * ((size_t)layer * st->n_head + (size_t)kv_head * g + h);
        for (int j = 0; j < d; j++) {
            const double x = qh[j], x2 = x * x;
            ps[0] += x;
            ps[1] += x2;
            ps[2] += x2 * x;
            ps[3] += x2 * x2;
        }
        /* exact weights, entropy, keys holding 75% */
        for (int64_t i = 0; i < S; i++) {
            float dot = 0;
            for (int j = 0; j < d; j++) dot += qh[j] * Kf[i * d + j];
            s[i] = dot * scale;
            prob[i] = s[i];
        }
        softmax_inplace(prob, S);
        double ent = 0;
        for (int64_t i = 0; i < S; i++)
            if (prob[i] > 0) ent -= prob[i] * log((double)prob[i]);
        hs->entropy += ent;
        memcpy(sorted, prob, (size_t)S * sizeof *sorted);
        qsort(sorted, (size_t)S, sizeof *sorted, cmp_desc);
        double cum = 0;
        int64_t n75 = 0;
        while (n75 < S && cum < 0.75) cum += sorted[n75++];
        hs->keys75 += (double)n75;
        hs->keys75_frac += (double)n75 / (double)S;
        /* the exact top-k and its mass */
        attn_topk_indices(s, S, kk, idx_e, twork);
        double mass = 0;
        for (int64_t i = 0; i < kk; i++) {
            mass += prob[idx_e[i]];
            mark[idx_e[i]] = 1;
        }
        hs->topk_mass += mass;
        /* top-k agreement of the approximate scores, per r */
        for (int ir = 0; ir < n_r; ir++) {
            approx_logits(Kf, S, d, qh, comps + ir * d, st->r[ir], sh);
            attn_topk_indices(sh, S, kk, idx_a, twork);
            int64_t both = 0;
            for (int64_t i = 0; i < kk; i++) both += mark[idx_a[i]] == 1;
            hs->agreement[ir] += (double)both / (double)kk;
        }
        for (int64_t i = 0; i < kk; i++) mark[idx_e[i]] = 0;
        /* alpha: SparQ's approximate softmax (temperature
         * sqrt(d ||q[i1]||_1 / ||q||_1)) summed over its own top-k */
        const int32_t *ca = comps + n_r * d;
        double l1 = 0, l1s = 0;
        for (int j = 0; j < d; j++) l1 += fabsf(qh[j]);
        for (int c = 0; c < st->alpha_r; c++) l1s += fabsf(qh[ca[c]]);
        const float inv_tau = l1s > 0 ? (float)(1.0 / sqrt(d * l1s / l1)) : 1.0f;
        approx_logits(Kf, S, d, qh, ca, st->alpha_r, sh);
        for (int64_t i = 0; i < S; i++) sh[i] *= inv_tau;
        attn_topk_indices(sh, S, kk, idx_a, twork);
        softmax_inplace(sh, S);
        double alpha = 0;
        for (int64_t i = 0; i < kk; i++) alpha += sh[idx_a[i]];
        hs->alpha += alpha;
        hs->alpha_abs_err += fabs(alpha - mass);
        hs->n++;
    }
    return 0;
}

int eval_attn_stats(sparq_context *c, const int32_t *tokens, int n, const eval_stats_params *p,
                    eval_stats *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const model_hparams *hp = &c->model->hp;
    const int d = hp->head_dim, g = hp->n_head / hp->n_kv_head;
    if (p->n_query < 1 || p->n_query >= n || n > sparq_context_n_ctx(c))
        return err_set(err, err_size, "stats: need 1 <= n_query (%d) < tokens (%d) <= context (%lld)",
                       p->n_query, n, (long long)sparq_context_n_ctx(c));
    if (p->k < 1) return err_set(err, err_size, "stats: k=%d must be >= 1", p->k);
    if (p->n_r < 0 || p->n_r > EVAL_STATS_MAX_R)
        return err_set(err, err_size, "stats: %d r values (at most %d)", p->n_r, EVAL_STATS_MAX_R);
    out->n_layer = hp->n_layer;
    out->n_head = hp->n_head;
    out->n_kv_head = hp->n_kv_head;
    out->d = d;
    out->k = p->k;
    out->alpha_r = p->alpha_r > 0 ? p->alpha_r : (d / 4 >= 1 ? d / 4 : 1);
    if (p->n_r > 0) {
        out->n_r = p->n_r;
        memcpy(out->r, p->r, sizeof out->r);
    } else { /* 1, 2, 4, ... and d itself */
        for (int r = 1; r < d && out->n_r < EVAL_STATS_MAX_R - 1; r *= 2) out->r[out->n_r++] = r;
        out->r[out->n_r++] = d;
    }
    if (out->alpha_r > d) return err_set(err, err_size, "stats: alpha r=%d exceeds head size %d", out->alpha_r, d);
    for (int i = 0; i < out->n_r; i++)
        if (out->r[i] < 1 || out->r[i] > d)
            return err_set(err, err_size, "stats: r=%d must be in [1, %d]", out->r[i], d);

    stats_tap tap = { c->policy, c->policy_state, out, g, NULL, NULL, 0, 0, n > d ? n : d, NULL };
    tap.work_floats = (size_t)tap.stride * d + 4 * (size_t)tap.stride + (size_t)d;
    tap.iwork_ints = 3 * (size_t)tap.stride + attn_topk_work((size_t)tap.stride) + (size_t)(out->n_r + 1) * d;
    out->heads = calloc((size_t)hp->n_layer * hp->n_head, sizeof *out->heads);
    tap.pow_sums = calloc((size_t)hp->n_layer * hp->n_head * 4, sizeof *tap.pow_sums);
    tap.work = malloc((size_t)hp->n_kv_head * tap.work_floats * sizeof *tap.work);
    tap.iwork = calloc((size_t)hp->n_kv_head * tap.iwork_ints, sizeof *tap.iwork); /* mark starts 0 */
    int rc = 0;
    if (!out->heads || !tap.work || !tap.iwork || !tap.pow_sums) {
        rc = err_set(err, err_size, "stats: out of memory for %d tokens", n);
        goto done;
    }
    const int n_pre = n - p->n_query;
    sparq_context_reset(c);
    if (sparq_eval(c, tokens, n_pre, NULL)) {
        rc = err_set(err, err_size, "stats: prefill of %d tokens: %s", n_pre, sparq_context_error(c));
        goto done;
    }
    /* decode through the observer: same policy, same state, plus measurement */
    attn_policy observer = *c->policy;
    observer.attend = stats_tap_attend;
    observer.observe_prefill = NULL;
    observer.state_create = NULL;
    observer.state_free = NULL;
    c->policy = &observer;
    c->policy_state = &tap;
    for (int i = n_pre; i < n && rc == 0; i++)
        if (sparq_eval(c, &tokens[i], 1, NULL))
            rc = err_set(err, err_size, "stats: decode step at %d: %s", i, sparq_context_error(c));
    c->policy = tap.inner;
    c->policy_state = tap.inner_state;
    if (rc) goto done;
    out->s_first = n_pre + 1;
    out->s_last = n;
    for (size_t i = 0; i < (size_t)hp->n_layer * hp->n_head; i++) {
        eval_head_stats *h = &out->heads[i];
        if (h->n == 0) continue;
        const double inv = 1.0 / (double)h->n;
        h->kurtosis *= inv;
        /* central moments of the pooled components from their power sums */
        const double *ps = tap.pow_sums + 4 * i, N = (double)h->n * d;
        const double mu = ps[0] / N, e2 = ps[1] / N, e3 = ps[2] / N, e4 = ps[3] / N;
        const double m2 = e2 - mu * mu, m4 = e4 - 4 * mu * e3 + 6 * mu * mu * e2 - 3 * mu * mu * mu * mu;
        h->kurtosis_pooled = m2 > 0 ? m4 / (m2 * m2) - 3.0 : 0.0;
        h->entropy *= inv;
        h->keys75 *= inv;
        h->keys75_frac *= inv;
        h->topk_mass *= inv;
        h->alpha *= inv;
        h->alpha_abs_err *= inv;
        for (int r = 0; r < out->n_r; r++) h->agreement[r] *= inv;
    }
done:
    free(tap.work);
    free(tap.iwork);
    free(tap.pow_sums);
    if (rc) eval_stats_free(out);
    return rc;
}
