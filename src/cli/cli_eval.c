/* cli_eval.c - `sparq eval TASK`: task metrics vs attention transfer.
 *
 * Map:
 *   options                 eval_table (+ the shared model and attention tables)
 *   settings                one per (policy, sweep value): how each becomes
 *                           sparq_attn_params for an example's cache length
 *   run_tasks               task examples: prepare once, run every setting
 *   run_fidelity            windows of a text: dense reference once, then
 *                           every setting against it
 *   output                  table, --json, --csv, --plot (gnuplot)
 *
 * A ratio sweep (--sweep ratio=1,1/2,...) targets, per example, the mean
 * cache length S of its decode steps (or --ratio-len): SparQ takes r and k
 * from --sparq-ratio's rule; a baseline takes the largest k whose SPEC.md
 * transfer formula stays within ratio x dense (--match transfer), or SparQ's
 * k at that ratio (--match k). Every row reports the transfer ratio actually
 * measured (sparq_context_attn_stats: elements / dense elements).
 *
 * stdout carries only the results; progress and errors go to stderr.
 */
#include "cli/cli.h"
#include "attn/attn.h"
#include "eval/eval.h"
#include "eval/metrics.h"
#include "util/paths.h"
#include "sparq_attn.h"
#include "eval/tasks.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct eval_opts {
    int64_t     limit;
    uint64_t    seed;
    const char *sweep;
    const char *match;
    int64_t     ratio_len;
    int         csv;
    const char *plot;
    const char *data;
    int         verbose;
    int         fid_prompt, fid_tokens, fid_gen;
    const char *niah_lengths;
    int         niah_depths;
    int64_t     context_chars;
    int         squad_confusion;
    int         kvret_keys;
    int64_t     kvret_gold;
} eval_opts;

#define OFF(f) offsetof(eval_opts, f)
static const cli_opt eval_table[] = {
    { "--limit", "-n", OPT_I64, OFF(limit), "N", "evaluate the first N examples / windows (default all)" },
    { "--seed", NULL, OPT_U64, OFF(seed), "N", "task seed: example order, SQuAD confusion paragraphs (default 0)" },
    { "--sweep", NULL, OPT_STR, OFF(sweep), "ratio=A,B|k=A,B",
      "one row per value for every non-dense policy, e.g. ratio=1,1/2,1/4,1/8" },
    { "--match", NULL, OPT_STR, OFF(match), "transfer|k",
      "ratio sweep, baselines: k from their transfer formula (default) or SparQ's k" },
    { "--ratio-len", NULL, OPT_I64, OFF(ratio_len), "S",
      "cache length a ratio is aimed at (default: each example's mean decode length)" },
    { "--csv", NULL, OPT_FLAG, OFF(csv), NULL, "print CSV instead of the table" },
    { "--plot", NULL, OPT_STR, OFF(plot), "FILE.png",
      "gnuplot: metric vs measured transfer ratio per policy (niah: depth x length heatmaps)" },
    { "--data", "-f", OPT_STR, OFF(data), "FILE",
      "task data file (fidelity: any text; default Tiny Shakespeare)" },
    { "--verbose", "-v", OPT_FLAG, OFF(verbose), NULL, "one line per example and setting on stderr" },
    { "--fid-prompt", NULL, OPT_INT, OFF(fid_prompt), "N",
      "fidelity: prompt tokens per window, BOS included (default context - forced)" },
    { "--fid-tokens", NULL, OPT_INT, OFF(fid_tokens), "N",
      "fidelity: teacher-forced tokens compared per window (default min(256, context/2))" },
    { "--fid-gen", NULL, OPT_INT, OFF(fid_gen), "N", "fidelity: greedy tokens compared (default min(128, room))" },
    { "--niah-lengths", NULL, OPT_STR, OFF(niah_lengths), "A,B,..",
      "niah: prompt lengths in tokens (default max(160, 1/4), 1/2, 3/4 of the context, context - 64)" },
    { "--niah-depths", NULL, OPT_INT, OFF(niah_depths), "N", "niah: needle depths 0..1 (default 11)" },
    { "--context-chars", NULL, OPT_I64, OFF(context_chars), "N",
      "wikitext/repetition: characters of context (default 6000)" },
    { "--squad-confusion", NULL, OPT_INT, OFF(squad_confusion), "N", "squad: confusion paragraphs (default 7)" },
    { "--kvret-keys", NULL, OPT_INT, OFF(kvret_keys), "75|140", "kvret: key-value pairs (default 75)" },
    { "--kvret-gold", NULL, OPT_I64, OFF(kvret_gold), "I", "kvret: move the gold pair to position I" },
    { 0 },
};
#undef OFF

/* Set by the SIGINT handler: stop after the current run, print what is done. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

/* ---- settings ------------------------------------------------------------------------ */

enum { SWEEP_NONE, SWEEP_RATIO, SWEEP_K };
enum { MAX_SETTINGS = 128, MAX_SWEEP = 32 };

typedef struct setting {
    char        policy[24];
    int         sweep;          /* SWEEP_*                                  */
    double      ratio;          /* SWEEP_RATIO target                       */
    char        ratio_str[24];
    int         k;              /* SWEEP_K value                            */
    /* results, one entry per example run */
    double     *value, *kl, *fdiv;
    int64_t     n, n_skipped;
    char        skip_reason[160];
    sparq_attn_stats attn;
    int         r, k_min, k_max, l_min, l_max;
    int64_t    *grid_len;       /* niah: cell of each example               */
    double     *grid_depth;
} setting;

static void setting_free(setting *s)
{
    free(s->value);
    free(s->kl);
    free(s->fdiv);
    free(s->grid_len);
    free(s->grid_depth);
}

/* "1/8", "0.125" or "1" -> 0.125; -1 if not a fraction in (0, 1]. */
static double parse_ratio(const char *s)
{
    char *end;
    double num = strtod(s, &end), den = 1;
    if (end == s) return -1;
    if (*end == '/') {
        const char *d = end + 1;
        den = strtod(d, &end);
        if (end == d) return -1;
    }
    if (*end || !(num > 0) || !(den > 0) || num / den > 1) return -1;
    return num / den;
}

static int split_list(const char *s, char items[][24], int max, char *err, size_t err_size)
{
    int n = 0;
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len == 0 || len >= 24 || n == max) {
            snprintf(err, err_size, "bad list item in '%s' (at most %d items of < 24 characters)", s, max);
            return -1;
        }
        memcpy(items[n], s, len);
        items[n++][len] = 0;
        s += len + (comma ? 1 : 0);
        if (comma && !*s) {
            snprintf(err, err_size, "trailing comma in list");
            return -1;
        }
    }
    return n;
}

/* Builds the settings from --attn (comma list or "all") and --sweep. */
static int make_settings(const char *attn, const char *sweep, setting *set, int *n_set, char *err,
                         size_t err_size)
{
    static const char *const all[] = { "dense", "sparq", "oracle", "flexgen", "h2o", "streaming" };
    char names[16][24], vals[MAX_SWEEP][24];
    int n_names = 0, n_vals = 0, kind = SWEEP_NONE;
    if (strcmp(attn, "all") == 0) {
        for (int i = 0; i < 6; i++) strcpy(names[n_names++], all[i]);
    } else if ((n_names = split_list(attn, names, 16, err, err_size)) < 0) {
        return -1;
    }
    for (int i = 0; i < n_names; i++) {
        sparq_attn_params p = sparq_attn_default_params();
        p.policy = names[i];
        if (sparq_attn_formula(&p, 1024, 64, 1, err, err_size) < 0) return -1;
    }
    if (sweep) {
        const char *eq = strchr(sweep, '=');
        if (!eq) {
            snprintf(err, err_size, "--sweep '%s' must be ratio=LIST or k=LIST", sweep);
            return -1;
        }
        if ((size_t)(eq - sweep) == 5 && strncmp(sweep, "ratio", 5) == 0) kind = SWEEP_RATIO;
        else if ((size_t)(eq - sweep) == 1 && sweep[0] == 'k') kind = SWEEP_K;
        else {
            snprintf(err, err_size, "--sweep '%s': only ratio= and k= are known", sweep);
            return -1;
        }
        if ((n_vals = split_list(eq + 1, vals, MAX_SWEEP, err, err_size)) <= 0) {
            if (n_vals == 0) snprintf(err, err_size, "--sweep '%s' has no values", sweep);
            return -1;
        }
    }
    int n = 0;
    for (int i = 0; i < n_names; i++) {
        const int swept = kind != SWEEP_NONE && strcmp(names[i], "dense") != 0;
        for (int v = 0; v < (swept ? n_vals : 1); v++) {
            if (n == MAX_SETTINGS) {
                snprintf(err, err_size, "too many settings (at most %d)", MAX_SETTINGS);
                return -1;
            }
            setting *s = &set[n++];
            memset(s, 0, sizeof *s);
            memcpy(s->policy, names[i], sizeof s->policy);
            s->sweep = swept ? kind : SWEEP_NONE;
            s->k_min = s->l_min = INT32_MAX;
            s->k_max = s->l_max = -1;
            if (s->sweep == SWEEP_RATIO) {
                s->ratio = parse_ratio(vals[v]);
                if (s->ratio < 0) {
                    snprintf(err, err_size, "--sweep ratio '%.23s' must be a fraction in (0, 1], e.g. 1/8", vals[v]);
                    return -1;
                }
                snprintf(s->ratio_str, sizeof s->ratio_str, "%.23s", vals[v]);
            } else if (s->sweep == SWEEP_K) {
                char *end;
                long k = strtol(vals[v], &end, 10);
                if (*end || k < 1 || k > INT32_MAX) {
                    snprintf(err, err_size, "--sweep k '%.23s' must be a positive integer", vals[v]);
                    return -1;
                }
                s->k = (int)k;
            }
        }
    }
    *n_set = n;
    return 0;
}

typedef struct run_env {
    const cli_attn_opts *attn;
    int match_k;             /* --match k                                   */
    int d, g;                /* head size, query heads per KV head          */
} run_env;

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

/* Parameters of setting s for an example whose decode steps average cache
 * length S. Returns 0, 1 if the setting cannot reach its budget (err says
 * why), -1 on a real error. */
static int setting_params(const setting *s, const run_env *env, int64_t S, sparq_attn_params *out,
                          char *err, size_t err_size)
{
    cli_attn_opts o = *env->attn;
    o.attn = s->policy;
    const int is_sparq = strcmp(s->policy, "sparq") == 0;
    if (s->sweep == SWEEP_K) o.k = o.attn_k = s->k;
    if (!is_sparq) o.ratio = NULL; /* --sparq-ratio is SparQ's alone */
    if (s->sweep != SWEEP_RATIO) return cli_attn_params(&o, S, env->d, out, err, err_size) ? -1 : 0;

    /* ratio sweep: SparQ through --sparq-ratio's rule at S */
    cli_attn_opts so = o;
    so.attn = "sparq";
    so.ratio = s->ratio_str;
    sparq_attn_params sp;
    const int sparq_ok = cli_attn_params(&so, S, env->d, &sp, err, err_size) == 0;
    if (is_sparq) {
        if (!sparq_ok) return 1;
        *out = sp;
        return 0;
    }
    o.ratio = NULL;
    if (cli_attn_params(&o, S, env->d, out, err, err_size)) return -1;
    if (env->match_k) {
        if (!sparq_ok) return 1;
        out->k = sp.k;
        return 0;
    }
    sparq_attn_params dp = sparq_attn_default_params();
    const double budget = s->ratio * (double)sparq_attn_formula(&dp, S, env->d, env->g, err, err_size);
    const int k = fit_k(*out, S, env->d, env->g, budget * (1 + 1e-9));
    if (k < 1) {
        snprintf(err, err_size, "%s cannot transfer only %s of dense at S=%lld (d=%d): its formula exceeds the budget at k=1",
                 s->policy, s->ratio_str, (long long)S, env->d);
        return 1;
    }
    out->k = k;
    return 0;
}

/* "ratio=1/8 r=1 k=20-24 l=5-6" */
static void setting_label(const setting *s, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
#define ADD(...) n += (size_t)snprintf(buf + n, n < size ? size - n : 0, __VA_ARGS__)
    if (s->sweep == SWEEP_RATIO) ADD("ratio=%s ", s->ratio_str);
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

static void note_params(setting *s, const sparq_attn_params *p, int d)
{
    sparq_attn_params q = *p; /* the policy's own defaults filled in, for the label */
    char err[256];
    const attn_policy *pol = attn_policy_find(q.policy ? q.policy : "dense");
    if (!pol || pol->resolve(&q, d, err, sizeof err)) q = *p;
    s->r = q.r;
    if (q.k < s->k_min) s->k_min = q.k;
    if (q.k > s->k_max) s->k_max = q.k;
    if (q.l < s->l_min) s->l_min = q.l;
    if (q.l > s->l_max) s->l_max = q.l;
}

/* ---- running ------------------------------------------------------------------------------ */

typedef struct shared {
    sparq_model         *m;
    const cli_model_opts *mo;
    int                  kv_type;
    int64_t              n_ctx;
    run_env              env;
    const eval_opts     *eo;
} shared;

static int make_context(const shared *sh, const sparq_attn_params *ap, sparq_context **c, char *err,
                        size_t err_size)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = sh->n_ctx;
    cp.n_threads = sh->mo->n_threads;
    cp.n_batch = sh->mo->n_batch;
    cp.kv_type = sh->kv_type;
    cp.attn = *ap;
    cp.abort_flag = &interrupted;
    return sparq_context_create(sh->m, &cp, c, err, err_size);
}

static void progress(const char *what, int64_t i, int64_t n)
{
    if (!isatty(2)) return;
    fprintf(stderr, "\r%s %lld / %lld", what, (long long)(i + 1), (long long)n);
    if (i + 1 == n) fputc('\n', stderr);
}

/* Prints a short one-line excerpt of s (control characters as spaces). */
static void excerpt(FILE *f, const char *s, size_t max)
{
    fputc('"', f);
    for (size_t i = 0; s && s[i] && i < max; i++) fputc((unsigned char)s[i] < ' ' ? ' ' : s[i], f);
    fputc('"', f);
}

static int64_t count_prompt_tokens(void *ctx, const char *text, size_t n)
{
    return n > INT32_MAX ? -1 : sparq_tokenize(ctx, text, (int)n, 1, NULL, 0);
}

/* Parses --niah-lengths, or the default grid for the context. */
static int niah_lengths(const shared *sh, int64_t *len, int *n_len, char *err, size_t err_size)
{
    if (!sh->eo->niah_lengths) {
        /* the answer is generated after the prompt; the shortest haystack
         * must leave room for the needle and the question (113 tokens with
         * stories260K's 512-token vocabulary) */
        const int64_t room = sh->n_ctx - 64, lo = sh->n_ctx / 4 > 160 ? sh->n_ctx / 4 : 160;
        const int64_t cand[4] = { lo, sh->n_ctx / 2, 3 * sh->n_ctx / 4, room };
        *n_len = 0;
        for (int i = 0; i < 4; i++)
            if (cand[i] >= 32 && cand[i] <= room && (*n_len == 0 || cand[i] > len[*n_len - 1]))
                len[(*n_len)++] = cand[i];
        if (*n_len == 0) {
            snprintf(err, err_size, "niah: context %lld is too small for a haystack", (long long)sh->n_ctx);
            return -1;
        }
        return 0;
    }
    char items[16][24];
    int n = split_list(sh->eo->niah_lengths, items, 16, err, err_size);
    if (n <= 0) {
        if (n == 0) snprintf(err, err_size, "--niah-lengths is empty");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char *end;
        long long v = strtoll(items[i], &end, 10);
        if (*end || v < 8) {
            snprintf(err, err_size, "--niah-lengths '%s' must be token counts >= 8", items[i]);
            return -1;
        }
        len[i] = v;
    }
    *n_len = n;
    return 0;
}

static int run_tasks(const shared *sh, task_kind kind, setting *set, int n_set, int64_t *n_examples,
                     int64_t *grid_lengths, int *n_grid_lengths, int *n_grid_depths)
{
    const eval_opts *eo = sh->eo;
    char err[512];
    task_params tp = task_default_params();
    tp.seed = eo->seed;
    tp.path = eo->data;
    if (eo->context_chars > 0) tp.context_chars = eo->context_chars;
    if (eo->squad_confusion > 0) tp.squad_confusion = eo->squad_confusion;
    if (eo->kvret_keys > 0) tp.kvret_keys = eo->kvret_keys;
    if (eo->kvret_gold >= 0) tp.kvret_gold_index = eo->kvret_gold;
    if (kind == TASK_NIAH) {
        if (niah_lengths(sh, grid_lengths, n_grid_lengths, err, sizeof err)) goto fail_msg;
        if (eo->niah_depths > 0) tp.niah_depths = eo->niah_depths;
        tp.niah_lengths = grid_lengths;
        tp.n_niah_lengths = *n_grid_lengths;
        tp.count_tokens = count_prompt_tokens;
        tp.count_ctx = sh->m;
        *n_grid_depths = tp.niah_depths;
    }
    task_set *ts = NULL;
    if (task_open(&ts, kind, &tp, err, sizeof err)) goto fail_msg;
    int64_t n = task_count(ts);
    if (eo->limit > 0 && eo->limit < n) n = eo->limit;
    for (int s = 0; s < n_set; s++) {
        set[s].value = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
        set[s].grid_len = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
        set[s].grid_depth = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
        if (!set[s].value || !set[s].grid_len || !set[s].grid_depth) {
            task_close(ts);
            snprintf(err, sizeof err, "out of memory");
            goto fail_msg;
        }
    }
    fprintf(stderr, "eval %s: %lld examples x %d settings, context %lld\n", task_kind_name(kind), (long long)n,
            n_set, (long long)sh->n_ctx);
    eval_task_params ep = eval_task_default_params();
    int64_t done = 0;
    for (int64_t i = 0; i < n && !interrupted; i++) {
        progress("example", i, n);
        task_example ex;
        eval_prepared pr;
        if (task_get(ts, i, &ex, err, sizeof err)) goto fail_task;
        if (eval_prepare(sh->m, sh->n_ctx, kind, &ex, &ep, &pr, err, sizeof err)) {
            task_example_free(&ex);
            goto fail_task;
        }
        const int64_t S = eo->ratio_len > 0 ? eo->ratio_len : eval_prepared_mean_len(&pr);
        for (int s = 0; s < n_set && !interrupted; s++) {
            setting *st = &set[s];
            sparq_attn_params ap;
            int pr_rc = setting_params(st, &sh->env, S, &ap, err, sizeof err);
            if (pr_rc < 0) goto fail_example;
            if (pr_rc > 0) {
                st->n_skipped++;
                snprintf(st->skip_reason, sizeof st->skip_reason, "%.159s", err);
                continue;
            }
            sparq_context *c = NULL;
            eval_result r;
            if (make_context(sh, &ap, &c, err, sizeof err)) goto fail_example;
            int rc = eval_run(c, &pr, &r, err, sizeof err);
            sparq_context_free(c);
            if (rc) {
                if (interrupted) break;
                goto fail_example;
            }
            note_params(st, &ap, sh->env.d);
            st->value[st->n] = r.value;
            st->grid_len[st->n] = kind == TASK_NIAH ? grid_lengths[i / tp.niah_depths] : 0;
            st->grid_depth[st->n] = kind == TASK_NIAH && tp.niah_depths > 1
                                        ? (double)(i % tp.niah_depths) / (tp.niah_depths - 1)
                                        : 0;
            st->n++;
            st->attn.elements += r.attn.elements;
            st->attn.dense_elements += r.attn.dense_elements;
            st->attn.formula_elements += r.attn.formula_elements;
            st->attn.steps += r.attn.steps;
            if (eo->verbose) {
                char lab[128];
                setting_label(st, lab, sizeof lab);
                fprintf(stderr, "[%s] %s %s: prompt %d (-%lld) value %.4g ", ex.id ? ex.id : "?", st->policy,
                        lab, pr.n_prompt, (long long)pr.n_dropped, r.value);
                if (r.output) excerpt(stderr, r.output, 80);
                fputc('\n', stderr);
            }
            eval_result_free(&r);
        }
        eval_prepared_free(&pr);
        task_example_free(&ex);
        done++;
        continue;
    fail_example:
        eval_prepared_free(&pr);
        task_example_free(&ex);
    fail_task:
        fprintf(stderr, "error: %s example %lld: %s\n", task_kind_name(kind), (long long)i, err);
        task_close(ts);
        return -1;
    }
    task_close(ts);
    *n_examples = done;
    return 0;
fail_msg:
    fprintf(stderr, "error: %s\n", err);
    return -1;
}

static int run_fidelity(const shared *sh, setting *set, int n_set, int64_t *n_windows)
{
    const eval_opts *eo = sh->eo;
    char err[512], path[4096];
    const char *name = eo->data ? eo->data : "data/text/tinyshakespeare_input.txt";
    if (path_find(name, path, sizeof path)) {
        fprintf(stderr, "error: fidelity: text '%s' not found (searched %s)\n", name, path_search_description());
        return -1;
    }
    char *text = NULL;
    size_t n_text = 0;
    int32_t *ids = NULL, *win = NULL;
    sparq_context *dense = NULL;
    int rc = -1;
    if (eval_read_file(path, &text, &n_text, err, sizeof err)) goto fail_msg;
    const int64_t n_ids = eval_tokenize(sh->m, text, n_text, 0, &ids, err, sizeof err);
    if (n_ids < 0) goto fail_msg;

    const int64_t n_ctx = sh->n_ctx;
    int F = eo->fid_tokens > 0 ? eo->fid_tokens : (int)(n_ctx / 2 < 256 ? n_ctx / 2 : 256);
    int P = eo->fid_prompt > 0 ? eo->fid_prompt : (int)(n_ctx - F);
    if (P < 2 || F < 1 || P + F > n_ctx) {
        fprintf(stderr, "error: fidelity: prompt %d + forced %d tokens must fit the context %lld (prompt >= 2)\n", P,
                F, (long long)n_ctx);
        goto done;
    }
    const int64_t room = n_ctx - P + 1;
    int G = eo->fid_gen > 0 ? eo->fid_gen : (int)(room < 128 ? room : 128);
    if (G > room) G = (int)room;
    const int bos = sparq_token_bos(sh->m);
    const int lead = bos >= 0 ? 1 : 0;    /* each window starts with BOS */
    const int64_t stride = P - lead + F;  /* text tokens per window */
    int64_t n = n_ids / stride;
    if (n < 1) {
        fprintf(stderr, "error: fidelity: '%s' has %lld tokens, a window needs %lld (see --fid-prompt/--fid-tokens)\n",
                path, (long long)n_ids, (long long)stride);
        goto done;
    }
    if (eo->limit > 0 && eo->limit < n) n = eo->limit;
    for (int s = 0; s < n_set; s++) {
        set[s].value = malloc((size_t)n * sizeof(double));
        set[s].kl = malloc((size_t)n * sizeof(double));
        set[s].fdiv = malloc((size_t)n * sizeof(double));
        if (!set[s].value || !set[s].kl || !set[s].fdiv) {
            snprintf(err, sizeof err, "out of memory");
            goto fail_msg;
        }
    }
    win = malloc((size_t)(P + F) * sizeof *win);
    sparq_attn_params dp = sparq_attn_default_params();
    if (!win) {
        snprintf(err, sizeof err, "out of memory");
        goto fail_msg;
    }
    if (make_context(sh, &dp, &dense, err, sizeof err)) goto fail_msg;
    fprintf(stderr, "eval fidelity: %lld windows of %d prompt + %d forced tokens, %d greedy, x %d settings (%s)\n",
            (long long)n, P, F, G, n_set, path);
    /* mean cache length over the decode steps: forced at P+1..P+F, greedy at P+1..P+G-1 */
    const double steps = (double)F + (G > 1 ? G - 1 : 0);
    const double mean_len = P + ((double)F * (F + 1) / 2 + (double)(G - 1) * G / 2) / (steps > 0 ? steps : 1);
    const int64_t S = eo->ratio_len > 0 ? eo->ratio_len : (int64_t)(mean_len + 0.5);
    int64_t done = 0;
    for (int64_t w = 0; w < n && !interrupted; w++) {
        progress("window", w, n);
        if (lead) win[0] = bos;
        memcpy(win + lead, ids + w * stride, (size_t)stride * sizeof *win);
        eval_reference ref;
        if (eval_reference_run(dense, win, P, win + P, F, G, &ref, err, sizeof err)) {
            if (interrupted) break;
            goto fail_msg;
        }
        for (int s = 0; s < n_set && !interrupted; s++) {
            setting *st = &set[s];
            sparq_attn_params ap;
            int pr_rc = setting_params(st, &sh->env, S, &ap, err, sizeof err);
            if (pr_rc > 0) {
                st->n_skipped++;
                snprintf(st->skip_reason, sizeof st->skip_reason, "%.159s", err);
                continue;
            }
            sparq_context *c = NULL;
            eval_fidelity f;
            if (pr_rc < 0 || make_context(sh, &ap, &c, err, sizeof err)) {
                eval_reference_free(&ref);
                goto fail_msg;
            }
            int frc = eval_fidelity_run(c, &ref, win, P, win + P, &f, err, sizeof err);
            sparq_context_free(c);
            if (frc) {
                eval_reference_free(&ref);
                if (interrupted) break;
                goto fail_msg;
            }
            note_params(st, &ap, sh->env.d);
            st->value[st->n] = f.n_steps ? (double)f.n_top1_agree / (double)f.n_steps : 1.0;
            st->kl[st->n] = f.n_steps ? f.kl_sum / (double)f.n_steps : 0.0;
            st->fdiv[st->n] = (double)f.first_divergence;
            st->n++;
            st->attn.elements += f.attn.elements;
            st->attn.dense_elements += f.attn.dense_elements;
            st->attn.formula_elements += f.attn.formula_elements;
            st->attn.steps += f.attn.steps;
            if (eo->verbose) {
                char lab[128];
                setting_label(st, lab, sizeof lab);
                fprintf(stderr, "[window %lld] %s %s: top1 %.4f kl %.3g (max %.3g) first divergence %lld / %lld\n",
                        (long long)w, st->policy, lab, st->value[st->n - 1], st->kl[st->n - 1], f.kl_max,
                        (long long)f.first_divergence, (long long)f.n_gen);
            }
        }
        eval_reference_free(&ref);
        done++;
    }
    *n_windows = done;
    rc = 0;
    goto done;
fail_msg:
    fprintf(stderr, "error: fidelity: %s\n", err);
done:
    sparq_context_free(dense);
    free(win);
    free(ids);
    free(text);
    return rc;
}

/* ---- output ------------------------------------------------------------------------------- */

typedef struct row {
    const setting *s;
    char    params[128];
    double  value, stderr_, transfer, formula;
    double  kl, kl_se, fdiv, fdiv_se;
    int     has_delta;      /* paired difference to the dense row's examples */
    double  delta, delta_se;
} row;

/* value - dense value per example (the same examples in the same order):
 * its standard error is far smaller than either row's when the examples
 * vary more than the policies do (BPC). */
static void add_delta(row *r, const setting *dense)
{
    const setting *s = r->s;
    if (!dense || s == dense || s->kl || s->n < 1 || s->n != dense->n) return;
    double *d = malloc((size_t)s->n * sizeof *d);
    if (!d) return;
    for (int64_t i = 0; i < s->n; i++) d[i] = s->value[i] - dense->value[i];
    r->has_delta = 1;
    r->delta = metrics_mean(d, s->n);
    r->delta_se = metrics_stderr(d, s->n);
    free(d);
}

static void make_row(const setting *s, row *r)
{
    memset(r, 0, sizeof *r);
    r->s = s;
    setting_label(s, r->params, sizeof r->params);
    r->value = metrics_mean(s->value, s->n);
    r->stderr_ = metrics_stderr(s->value, s->n);
    r->transfer = s->attn.dense_elements > 0 ? (double)s->attn.elements / (double)s->attn.dense_elements : NAN;
    r->formula = s->attn.dense_elements > 0 ? (double)s->attn.formula_elements / (double)s->attn.dense_elements : NAN;
    if (s->kl) {
        r->kl = metrics_mean(s->kl, s->n);
        r->kl_se = metrics_stderr(s->kl, s->n);
        r->fdiv = metrics_mean(s->fdiv, s->n);
        r->fdiv_se = metrics_stderr(s->fdiv, s->n);
    }
}

static const char *metric_name(const char *task)
{
    if (strcmp(task, "fidelity") == 0) return "top1_agreement";
    if (strcmp(task, "cnndm") == 0) return "rougeL_f1";
    if (strcmp(task, "wikitext") == 0) return "bpc";
    if (strcmp(task, "repetition") == 0) return "match_chars";
    return "accuracy";
}

static void json_num(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

static void print_json(FILE *f, const char *task, const char *model, int64_t n_ctx, const row *rows, int n)
{
    fputs("{\"command\":\"eval\",\"task\":", f);
    cli_json_str(f, task, strlen(task));
    fputs(",\"model\":", f);
    cli_json_str(f, model, strlen(model));
    fprintf(f, ",\"n_ctx\":%lld,\"rows\":[", (long long)n_ctx);
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        const setting *s = r->s;
        fputs(i ? ",\n{" : "\n{", f);
        fputs("\"task\":", f);
        cli_json_str(f, task, strlen(task));
        fputs(",\"policy\":", f);
        cli_json_str(f, s->policy, strlen(s->policy));
        fputs(",\"params\":", f);
        cli_json_str(f, r->params, strlen(r->params));
        fputs(",\"target_ratio\":", f);
        json_num(f, s->sweep == SWEEP_RATIO ? s->ratio : NAN);
        if (s->k_max >= 0) fprintf(f, ",\"r\":%d,\"k_min\":%d,\"k_max\":%d,\"l_min\":%d,\"l_max\":%d", s->r, s->k_min,
                                   s->k_max, s->l_min, s->l_max);
        fputs(",\"metric\":", f);
        cli_json_str(f, metric_name(task), strlen(metric_name(task)));
        fputs(",\"value\":", f);
        json_num(f, s->n ? r->value : NAN);
        fputs(",\"stderr\":", f);
        json_num(f, s->n ? r->stderr_ : NAN);
        fputs(",\"transfer_ratio\":", f);
        json_num(f, r->transfer);
        fputs(",\"formula_ratio\":", f);
        json_num(f, r->formula);
        fprintf(f, ",\"n\":%lld,\"decode_steps\":%lld", (long long)s->n, (long long)s->attn.steps);
        if (s->kl) {
            fputs(",\"kl_mean\":", f);
            json_num(f, s->n ? r->kl : NAN);
            fputs(",\"kl_stderr\":", f);
            json_num(f, s->n ? r->kl_se : NAN);
            fputs(",\"top1_agreement\":", f);
            json_num(f, s->n ? r->value : NAN);
            fputs(",\"first_divergence\":", f);
            json_num(f, s->n ? r->fdiv : NAN);
            fputs(",\"first_divergence_stderr\":", f);
            json_num(f, s->n ? r->fdiv_se : NAN);
        }
        if (r->has_delta) {
            fputs(",\"delta_vs_dense\":", f);
            json_num(f, r->delta);
            fputs(",\"delta_stderr\":", f);
            json_num(f, r->delta_se);
        }
        if (s->n_skipped) {
            fprintf(f, ",\"skipped\":%lld,\"skip_reason\":", (long long)s->n_skipped);
            cli_json_str(f, s->skip_reason, strlen(s->skip_reason));
        }
        if (s->grid_len && strcmp(task, "niah") == 0) {
            fputs(",\"grid\":[", f);
            for (int64_t j = 0; j < s->n; j++)
                fprintf(f, "%s{\"length\":%lld,\"depth\":%.4g,\"value\":%.4g}", j ? "," : "",
                        (long long)s->grid_len[j], s->grid_depth[j], s->value[j]);
            fputc(']', f);
        }
        fputc('}', f);
    }
    fputs("]}\n", f);
}

/* A CSV number, empty when there is none (a setting that never ran). */
static void csv_num(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, ",%.6g", v);
    else fputc(',', f);
}

static void print_csv(FILE *f, const char *task, const row *rows, int n)
{
    fputs("task,policy,params,metric,value,stderr,transfer_ratio,formula_ratio,n,kl_mean,kl_stderr,"
          "first_divergence,first_divergence_stderr,delta_vs_dense,delta_stderr\n", f);
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        const int ran = r->s->n > 0;
        fprintf(f, "%s,%s,\"%s\",%s", task, r->s->policy, r->params, metric_name(task));
        csv_num(f, ran ? r->value : NAN);
        csv_num(f, ran ? r->stderr_ : NAN);
        csv_num(f, r->transfer);
        csv_num(f, r->formula);
        fprintf(f, ",%lld", (long long)r->s->n);
        const int fid = r->s->kl && ran;
        csv_num(f, fid ? r->kl : NAN);
        csv_num(f, fid ? r->kl_se : NAN);
        csv_num(f, fid ? r->fdiv : NAN);
        csv_num(f, fid ? r->fdiv_se : NAN);
        csv_num(f, r->has_delta ? r->delta : NAN);
        csv_num(f, r->has_delta ? r->delta_se : NAN);
        fputc('\n', f);
    }
}

static void print_table(FILE *f, const char *task, const row *rows, int n)
{
    const int fid = n > 0 && rows[0].s->kl != NULL;
    int delta = 0;
    for (int i = 0; i < n; i++) delta |= rows[i].has_delta;
    fprintf(f, "%-10s %-10s %-28s %-15s %10s %9s %9s %5s", "task", "policy", "params", "metric", "value", "stderr",
            "transfer", "n");
    if (fid) fprintf(f, " %10s %9s %9s", "kl_mean", "kl_se", "first_div");
    if (delta) fprintf(f, " %10s %9s", "vs_dense", "vs_se");
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        if (r->s->n == 0) {
            fprintf(f, "%-10s %-10s %-28s %-15s %10s %9s %9s %5d   (%s)\n", task, r->s->policy, r->params,
                    metric_name(task), "n/a", "", "", 0, r->s->skip_reason[0] ? r->s->skip_reason : "not run");
            continue;
        }
        fprintf(f, "%-10s %-10s %-28s %-15s %10.4f %9.4f %9.4f %5lld", task, r->s->policy, r->params,
                metric_name(task), r->value, r->stderr_, r->transfer, (long long)r->s->n);
        if (fid) fprintf(f, " %10.4g %9.2g %9.2f", r->kl, r->kl_se, r->fdiv);
        if (r->has_delta) fprintf(f, " %+10.4f %9.4f", r->delta, r->delta_se);
        else if (delta) fprintf(f, " %10s %9s", "", "");
        if (r->s->n_skipped) fprintf(f, "  (%lld skipped)", (long long)r->s->n_skipped);
        fputc('\n', f);
    }
}

/* Runs argv quietly (output to /dev/null unless show); exit status, 127 if
 * it could not start. */
static int run_program(char *const argv[], int show)
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (!show && !freopen("/dev/null", "w", stdout)) _exit(127);
        if (!show && !freopen("/dev/null", "w", stderr)) _exit(127);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* gnuplot single-quoted string: a quote is doubled. */
static void gp_quote(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* Metric vs measured transfer ratio, one line per policy (Figure A1). */
static void plot_curves(FILE *f, const char *task, const char *model, const row *rows, int n)
{
    fputs("set title ", f);
    char title[512];
    snprintf(title, sizeof title, "%s: %s vs attention transfer (%s)", task, metric_name(task), model);
    gp_quote(f, title);
    fputs("\nset logscale x 2\nset xrange [*:1.1]\nset grid\nset key outside right top\n"
          "set xlabel 'measured transfer ratio (elements / dense)'\nset ylabel ", f);
    gp_quote(f, metric_name(task));
    fputs("\nset xtics ('1/32' 0.03125, '1/16' 0.0625, '1/8' 0.125, '1/4' 0.25, '1/2' 0.5, '1' 1)\n", f);
    const char *policies[MAX_SETTINGS];
    int n_pol = 0;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < n_pol && strcmp(policies[j], rows[i].s->policy) != 0) j++;
        if (j == n_pol) policies[n_pol++] = rows[i].s->policy;
    }
    for (int p = 0; p < n_pol; p++) {
        fprintf(f, "$p%d << EOD\n", p);
        for (int i = 0; i < n; i++)
            if (strcmp(rows[i].s->policy, policies[p]) == 0 && rows[i].s->n > 0 && isfinite(rows[i].transfer))
                fprintf(f, "%.6g %.6g %.6g\n", rows[i].transfer, rows[i].value, rows[i].stderr_);
        fputs("EOD\n", f);
    }
    fputs("plot ", f);
    for (int p = 0; p < n_pol; p++) {
        fprintf(f, "%s$p%d using 1:2:3 with yerrorlines lw 2 pt 7 lc %d title ", p ? ", \\\n  " : "", p, p + 1);
        gp_quote(f, policies[p]);
    }
    fputc('\n', f);
}

/* NIAH: one depth x length panel per setting, 1 = found (blue), 0 = missed (red). */
static void plot_niah(FILE *f, const char *model, const row *rows, int n)
{
    int cols = n < 3 ? n : 3, lines = (n + cols - 1) / cols;
    fprintf(f, "set multiplot layout %d,%d title ", lines, cols);
    char title[512];
    snprintf(title, sizeof title, "needle in a haystack (%s)", model);
    gp_quote(f, title);
    fputs("\nset palette defined (0 '#d73027', 0.5 '#ffffbf', 1 '#4575b4')\nset cbrange [0:1]\n"
          "set xlabel 'prompt tokens (budget)'\nset ylabel 'needle depth'\nset yrange [-0.1:1.1] reverse\n"
          "set offsets graph 0.1, graph 0.1, 0, 0\nunset key\n", f);
    for (int i = 0; i < n; i++) {
        const setting *s = rows[i].s;
        char t[256];
        snprintf(t, sizeof t, "%s %s (%.2f, x%.3f)", s->policy, rows[i].params, rows[i].value, rows[i].transfer);
        fputs("set title ", f);
        gp_quote(f, t);
        fputs("\nset xtics (", f); /* one tic per grid length */
        int n_tics = 0;
        for (int64_t j = 0; j < s->n; j++) {
            int64_t seen = 0;
            for (int64_t q = 0; q < j && !seen; q++) seen = s->grid_len[q] == s->grid_len[j];
            if (!seen) fprintf(f, "%s%lld", n_tics++ ? ", " : "", (long long)s->grid_len[j]);
        }
        fprintf(f, ")\n$g%d << EOD\n", i);
        for (int64_t j = 0; j < s->n; j++)
            fprintf(f, "%lld %.4g %.4g\n", (long long)s->grid_len[j], s->grid_depth[j], s->value[j]);
        fprintf(f, "EOD\nplot $g%d using 1:2:3 with points pt 5 ps 2.5 palette\n", i);
    }
    fputs("unset multiplot\n", f);
}

static int write_plot(const char *png, const char *task, const char *model, const row *rows, int n)
{
    size_t len = strlen(png);
    char *script = malloc(len + 4);
    if (!script) return -1;
    snprintf(script, len + 4, "%s.gp", png);
    char *check[] = { "gnuplot", "-e", "set terminal pngcairo", NULL };
    int have = run_program(check, 0);
    if (have == 127 || have < 0) {
        fprintf(stderr, "error: --plot needs gnuplot (scripts/setup.sh installs gnuplot-nox)\n");
        free(script);
        return -1;
    }
    FILE *f = fopen(script, "w");
    if (!f) {
        fprintf(stderr, "error: cannot write '%s'\n", script);
        free(script);
        return -1;
    }
    const int niah = strcmp(task, "niah") == 0;
    fprintf(f, "set terminal %s size %d,%d noenhanced\nset output ", have == 0 ? "pngcairo" : "png",
            niah ? 1200 : 1000, niah ? 400 * ((n + 2) / 3) : 650);
    gp_quote(f, png);
    fputc('\n', f);
    if (niah) plot_niah(f, model, rows, n);
    else plot_curves(f, task, model, rows, n);
    if (fclose(f) != 0) {
        fprintf(stderr, "error: writing '%s' failed\n", script);
        free(script);
        return -1;
    }
    char *argv[] = { "gnuplot", script, NULL };
    int st = run_program(argv, 1);
    if (st != 0) fprintf(stderr, "error: gnuplot %s failed (status %d)\n", script, st);
    else fprintf(stderr, "plot: %s (script %s)\n", png, script);
    free(script);
    return st == 0 ? 0 : -1;
}

/* ---- entry point ----------------------------------------------------------------------------- */

static const char usage_text[] =
    "usage: sparq eval TASK [-m MODEL] [--attn P1,P2,..|all] [--sweep ratio=1,1/2,1/4,1/8] [options]\n"
    "tasks: squad triviaqa cnndm wikitext repetition niah kvret fidelity\n"
    "  fidelity compares any text (-f FILE) under each policy with dense attention:\n"
    "  per-token KL(dense || policy), top-1 agreement, greedy tokens before divergence";

int cli_eval(int argc, char **argv)
{
    cli_model_opts mo = { 0 };
    cli_attn_opts ao;
    cli_attn_opts_init(&ao);
    eval_opts eo = { 0 };
    eo.kvret_gold = -1;
    cli_group groups[] = {
        { "evaluation", eval_table, &eo },
        { "model", cli_model_table, &mo },
        { "attention (--attn takes a comma-separated list, or all)", cli_attn_table, &ao },
    };
    const int n_groups = 3;
    char err[512], path[4096];
    char *pos[1];
    int n_pos;
    const int parsed = cli_parse_command(groups, n_groups, argc, argv,
                                         usage_text,
                                         pos, 1, &n_pos);
    if (parsed >= 0) return parsed;
    if (n_pos != 1) {
        fprintf(stderr, "error: eval needs a TASK (see sparq eval --help)\n");
        return 2;
    }
    const char *task = pos[0];
    task_kind kind = TASK_N_KINDS;
    const int fidelity = strcmp(task, "fidelity") == 0;
    if (!fidelity && task_kind_from_name(task, &kind)) {
        fprintf(stderr, "error: unknown task '%s' (squad triviaqa cnndm wikitext repetition niah kvret fidelity)\n",
                task);
        return 2;
    }
    int kv_type = cli_kv_type(mo.kv_type);
    if (kv_type < 0) {
        fprintf(stderr, "error: --kv-type must be f16 or f32, not '%s'\n", mo.kv_type);
        return 2;
    }
    if (mo.json + eo.csv > 1) {
        fprintf(stderr, "error: give only one of --json and --csv\n");
        return 2;
    }
    int match_k = 0;
    if (eo.match) {
        if (strcmp(eo.match, "k") == 0) match_k = 1;
        else if (strcmp(eo.match, "transfer") != 0) {
            fprintf(stderr, "error: --match must be transfer or k, not '%s'\n", eo.match);
            return 2;
        }
    }
    if (ao.ratio && eo.sweep) {
        fprintf(stderr, "error: give either --sparq-ratio or --sweep\n");
        return 2;
    }
    setting *set = calloc(MAX_SETTINGS, sizeof *set);
    int n_set = 0;
    if (!set) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    if (make_settings(ao.attn, eo.sweep, set, &n_set, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        free(set);
        return 2;
    }

    int rc = 1;
    row *rows = NULL;
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    if (!m) goto done;
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.m = m;
    sh.mo = &mo;
    sh.kv_type = kv_type;
    sh.n_ctx = mo.n_ctx > 0 ? mo.n_ctx : sparq_model_n_ctx_train(m);
    sh.env.attn = &ao;
    sh.env.match_k = match_k;
    sh.env.d = sparq_model_head_dim(m);
    sh.env.g = sparq_model_n_head(m) / sparq_model_n_kv_head(m);
    sh.eo = &eo;
    /* fail early on bad attention options */
    for (int s = 0; s < n_set; s++) {
        sparq_attn_params ap;
        if (setting_params(&set[s], &sh.env, sh.n_ctx, &ap, err, sizeof err) < 0) {
            fprintf(stderr, "error: %s\n", err);
            goto done;
        }
    }
    signal(SIGINT, on_sigint);
    int64_t n_done = 0, grid_lengths[16];
    int n_grid_lengths = 0, n_grid_depths = 0;
    double t0 = cli_now();
    int ok = fidelity ? run_fidelity(&sh, set, n_set, &n_done)
                      : run_tasks(&sh, kind, set, n_set, &n_done, grid_lengths, &n_grid_lengths, &n_grid_depths);
    if (ok != 0) goto done;
    if (interrupted) fprintf(stderr, "interrupted: reporting the %lld finished examples\n", (long long)n_done);
    fprintf(stderr, "eval: %.1f s\n", cli_now() - t0);
    rows = calloc((size_t)n_set, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    const setting *dense_set = NULL;
    for (int s = 0; s < n_set && !dense_set; s++)
        if (strcmp(set[s].policy, "dense") == 0) dense_set = &set[s];
    for (int s = 0; s < n_set; s++) {
        make_row(&set[s], &rows[s]);
        add_delta(&rows[s], dense_set);
        if (set[s].n_skipped)
            fprintf(stderr, "note: %s skipped %lld runs: %s\n", set[s].policy, (long long)set[s].n_skipped,
                    set[s].skip_reason);
    }
    if (mo.json) print_json(stdout, task, path, sh.n_ctx, rows, n_set);
    else if (eo.csv) print_csv(stdout, task, rows, n_set);
    else print_table(stdout, task, rows, n_set);
    fflush(stdout);
    rc = interrupted ? 130 : 0;
    if (eo.plot) {
        const char *base = strrchr(path, '/');
        if (write_plot(eo.plot, task, base ? base + 1 : path, rows, n_set)) rc = 1;
    }
done:
    free(rows);
    for (int s = 0; s < n_set; s++) setting_free(&set[s]);
    free(set);
    sparq_model_free(m);
    return rc;
}
