/* cli_eval.c - `sparq eval TASK`: task metrics vs attention transfer.
 *
 * Parsing and printing only: the tasks (their options, data, prompts and
 * scores) are eval/tasks.h's registry, the settings, sweeps and runs are
 * eval/sweep.h (docs/EVALUATION.md says what they do).
 *
 * Map:
 *   options      eval_table, every task's own options (from its table), the
 *                shared model and attention tables
 *   hooks        progress, notes and -v lines from the runs
 *   output       table, --json, --csv, --plot (gnuplot)
 *   help         the generic page, or one task's page (`eval squad --help`)
 *
 * stdout carries only the results; progress and errors go to stderr.
 */
#include "cli/cli.h"
#include "attn/attn.h"
#include "eval/eval.h"
#include "eval/sweep.h"
#include "eval/tasks.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct eval_opts {
    const char *limit;          /* numbers as text: given or not is exact */
    uint64_t    seed;
    const char *sweep;
    const char *match;
    const char *ratio_len;
    int         csv;
    const char *plot;
    const char *data;
    int         verbose;
} eval_opts;

#define OFF(f) offsetof(eval_opts, f)
static const cli_opt eval_table[] = {
    { "--limit", "-n", OPT_STR, OFF(limit), "N", "evaluate the first N >= 1 examples / windows (default all)" },
    { "--seed", NULL, OPT_U64, OFF(seed), "N", "task seed: example order, SQuAD confusion paragraphs (default 0)" },
    { "--sweep", NULL, OPT_STR, OFF(sweep), "ratio=A,B|k=A,B",
      "one row per value for every non-dense policy, e.g. ratio=1,1/2,1/4,1/8" },
    { "--match", NULL, OPT_STR, OFF(match), "transfer|k",
      "ratio sweep, baselines: k from their transfer formula (default) or SparQ's k" },
    { "--ratio-len", NULL, OPT_STR, OFF(ratio_len), "S",
      "cache length S >= 1 a ratio is aimed at (default: each example's mean decode length)" },
    { "--csv", NULL, OPT_FLAG, OFF(csv), NULL, "print CSV instead of the table" },
    { "--plot", NULL, OPT_STR, OFF(plot), "FILE.png",
      "gnuplot: metric vs measured transfer ratio per policy (grid tasks: depth x length heatmaps)" },
    { "--data", "-f", OPT_STR, OFF(data), "FILE",
      "task data file (fidelity: any text; default Tiny Shakespeare)" },
    { "--verbose", "-v", OPT_FLAG, OFF(verbose), NULL, "one line per example and setting on stderr" },
    { 0 },
};
#undef OFF

/* Set by the SIGINT handler: stop after the current run, print what is done. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

/* ---- options -------------------------------------------------------------------------- */

enum { MAX_TASK_OPTS = 48 };

/* Every task's options as text, for one parse: a name shared by two tasks
 * (--context-chars) is one entry. value[i] is NULL unless given. */
typedef struct task_opts {
    cli_opt     opts[MAX_TASK_OPTS + 1];
    const char *value[MAX_TASK_OPTS];
    int         n;
} task_opts;

static void task_opts_init(task_opts *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < task_def_count(); i++)
        for (const task_option *o = task_def_at(i)->options; o && o->name; o++) {
            int seen = 0;
            for (int j = 0; j < t->n && !seen; j++) seen = strcmp(t->opts[j].name, o->name) == 0;
            if (seen || t->n == MAX_TASK_OPTS) continue;
            t->opts[t->n] = (cli_opt){ o->name, NULL, OPT_STR, (size_t)t->n * sizeof(const char *), o->metavar,
                                       o->help };
            t->n++;
        }
}

/* cli_opt rows for one task's own options (help). */
static int task_help_table(const task_def *t, cli_opt *out, int max)
{
    int n = 0;
    for (const task_option *o = t->options; o && o->name && n < max; o++)
        out[n++] = (cli_opt){ o->name, NULL, OPT_STR, 0, o->metavar, o->help };
    out[n] = (cli_opt){ 0 };
    return n;
}

/* The given task options into tp: each must be one of t's own and valid. */
static int apply_task_opts(const task_opts *to, const task_def *t, task_params *tp)
{
    char err[256];
    for (int i = 0; i < to->n; i++) {
        if (!to->value[i]) continue;
        const task_option *o = task_option_find(t, to->opts[i].name);
        if (!o) {
            fprintf(stderr, "error: %s is not an option of task %s (see sparq eval %s --help)\n", to->opts[i].name,
                    t->name, t->name);
            return -1;
        }
        if (task_option_set(tp, o, to->value[i], err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            return -1;
        }
    }
    return 0;
}

/* A count given as text: an integer >= 1; 0 if not given. */
static int positive_option(const char *name, const char *text, int64_t *out)
{
    *out = 0;
    if (!text) return 0;
    char *end;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno || v < 1) {
        fprintf(stderr, "error: %s must be a whole number >= 1, not '%s'\n", name, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* The user's attention options for one policy at S (eval_sweep_env.base):
 * --sparq-ratio is SparQ's alone. */
static int base_params(void *user, const char *policy, int64_t S, int d, sparq_attn_params *out, char *err,
                       size_t err_size)
{
    attn_opts o = *(const attn_opts *)user;
    o.attn = policy;
    if (strcmp(policy, "sparq") != 0) o.ratio = NULL;
    return attn_opts_params(&o, S, d, out, err, err_size);
}

/* ---- hooks ------------------------------------------------------------------------------ */

static void on_note(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "%s\n", line);
}

static void on_progress(void *user, const char *what, int64_t i, int64_t n)
{
    (void)user;
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

/* -v: one line per run. */
static void on_ran(void *user, const eval_sweep_note *n)
{
    (void)user;
    char lab[128];
    eval_setting_label(n->set, lab, sizeof lab);
    if (n->fid) {
        const eval_fidelity *f = n->fid;
        fprintf(stderr, "[window %lld] %s %s: top1 %.4f kl %.3g (max %.3g) first divergence %lld / %lld\n",
                (long long)n->index, n->set->policy, lab, n->set->value[n->set->n - 1], n->set->kl[n->set->n - 1],
                f->kl_max, (long long)f->first_divergence, (long long)f->n_gen);
        return;
    }
    fprintf(stderr, "[%s] %s %s: prompt %d (-%lld) value %.4g ", n->ex->id ? n->ex->id : "?", n->set->policy, lab,
            n->pr->n_prompt, (long long)n->pr->n_dropped, n->res->value);
    if (n->res->output) excerpt(stderr, n->res->output, 80);
    fputc('\n', stderr);
}

/* ---- output ------------------------------------------------------------------------------- */

static void json_num(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

static void print_json(FILE *f, const task_def *t, const char *model, int64_t n_ctx, const eval_row *rows, int n)
{
    const char *task = t->name;
    fputs("{\"command\":\"eval\",\"task\":", f);
    cli_json_str(f, task, strlen(task));
    fputs(",\"model\":", f);
    cli_json_str(f, model, strlen(model));
    fprintf(f, ",\"n_ctx\":%lld,\"rows\":[", (long long)n_ctx);
    for (int i = 0; i < n; i++) {
        const eval_row *r = &rows[i];
        const eval_setting *s = r->s;
        fputs(i ? ",\n{" : "\n{", f);
        fputs("\"task\":", f);
        cli_json_str(f, task, strlen(task));
        fputs(",\"policy\":", f);
        cli_json_str(f, s->policy, strlen(s->policy));
        fputs(",\"params\":", f);
        cli_json_str(f, r->params, strlen(r->params));
        fputs(",\"target_ratio\":", f);
        json_num(f, s->sweep == EVAL_SWEEP_RATIO ? s->ratio : NAN);
        if (s->k_max >= 0) fprintf(f, ",\"r\":%d,\"k_min\":%d,\"k_max\":%d,\"l_min\":%d,\"l_max\":%d", s->r, s->k_min,
                                   s->k_max, s->l_min, s->l_max);
        fputs(",\"metric\":", f);
        cli_json_str(f, t->metric, strlen(t->metric));
        fputs(",\"value\":", f);
        json_num(f, s->n ? r->value : NAN);
        fputs(",\"stderr\":", f);
        json_num(f, s->n ? r->stderr_ : NAN);
        fputs(",\"transfer_ratio\":", f);
        json_num(f, r->transfer);
        fputs(",\"formula_ratio\":", f);
        json_num(f, r->formula);
        /* false: part of the transfer is an estimate (topk hnsw: Faiss
         * reports no visits), not a count */
        fprintf(f, ",\"transfer_counted\":%s", s->attn.nominal_elements > 0 ? "false" : "true");
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
        if (s->grid_len) { /* grid tasks (niah) */
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

static void print_csv(FILE *f, const task_def *t, const eval_row *rows, int n)
{
    fputs("task,policy,params,metric,value,stderr,transfer_ratio,formula_ratio,n,kl_mean,kl_stderr,"
          "first_divergence,first_divergence_stderr,delta_vs_dense,delta_stderr\n", f);
    for (int i = 0; i < n; i++) {
        const eval_row *r = &rows[i];
        const int ran = r->s->n > 0;
        fprintf(f, "%s,%s,\"%s\",%s", t->name, r->s->policy, r->params, t->metric);
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

static void print_table(FILE *f, const task_def *t, const eval_row *rows, int n)
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
        const eval_row *r = &rows[i];
        if (r->s->n == 0) {
            fprintf(f, "%-10s %-10s %-28s %-15s %10s %9s %9s %5d   (%s)\n", t->name, r->s->policy, r->params,
                    t->metric, "n/a", "", "", 0, r->s->skip_reason[0] ? r->s->skip_reason : "not run");
            continue;
        }
        fprintf(f, "%-10s %-10s %-28s %-15s %10.4f %9.4f %9.4f %5lld", t->name, r->s->policy, r->params,
                t->metric, r->value, r->stderr_, r->transfer, (long long)r->s->n);
        if (fid) fprintf(f, " %10.4g %9.2g %9.2f", r->kl, r->kl_se, r->fdiv);
        if (r->has_delta) fprintf(f, " %+10.4f %9.4f", r->delta, r->delta_se);
        else if (delta) fprintf(f, " %10s %9s", "", "");
        if (r->s->n_skipped) fprintf(f, "  (%lld skipped)", (long long)r->s->n_skipped);
        if (r->s->attn.nominal_elements > 0) fputs("  (transfer partly nominal: hnsw)", f);
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
static void plot_curves(FILE *f, const task_def *t, const char *model, const eval_row *rows, int n)
{
    fputs("set title ", f);
    char title[512];
    snprintf(title, sizeof title, "%s: %s vs attention transfer (%.400s)", t->name, t->metric, model);
    gp_quote(f, title);
    fputs("\nset logscale x 2\nset xrange [*:1.1]\nset grid\nset key outside right top\n"
          "set xlabel 'measured transfer ratio (elements / dense)'\nset ylabel ", f);
    gp_quote(f, t->metric);
    fputs("\nset xtics ('1/32' 0.03125, '1/16' 0.0625, '1/8' 0.125, '1/4' 0.25, '1/2' 0.5, '1' 1)\n", f);
    const char *policies[EVAL_MAX_SETTINGS];
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
static void plot_niah(FILE *f, const char *model, const eval_row *rows, int n)
{
    int cols = n < 3 ? n : 3, lines = (n + cols - 1) / cols;
    fprintf(f, "set multiplot layout %d,%d title ", lines, cols);
    char title[512];
    snprintf(title, sizeof title, "needle in a haystack (%.480s)", model);
    gp_quote(f, title);
    fputs("\nset palette defined (0 '#d73027', 0.5 '#ffffbf', 1 '#4575b4')\nset cbrange [0:1]\n"
          "set xlabel 'prompt tokens (budget)'\nset ylabel 'needle depth'\nset yrange [-0.1:1.1] reverse\n"
          "set offsets graph 0.1, graph 0.1, 0, 0\nunset key\n", f);
    for (int i = 0; i < n; i++) {
        const eval_setting *s = rows[i].s;
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

static int write_plot(const char *png, const task_def *t, const char *model, const eval_row *rows, int n)
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
    const int niah = t->grid; /* a heatmap per setting */
    fprintf(f, "set terminal %s size %d,%d noenhanced\nset output ", have == 0 ? "pngcairo" : "png",
            niah ? 1200 : 1000, niah ? 400 * ((n + 2) / 3) : 650);
    gp_quote(f, png);
    fputc('\n', f);
    if (niah) plot_niah(f, model, rows, n);
    else plot_curves(f, t, model, rows, n);
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

/* ---- help ------------------------------------------------------------------------------- */

/* The generic page (t NULL: every task and its options) or one task's. */
static void print_help(const task_def *t, cli_group *groups, int n_groups)
{
    char usage[4096], all[ATTN_NAMES_MAX];
    size_t n = 0, na = 0;
    all[0] = 0;
    for (int i = 0; i < attn_policy_count(); i++)
        if (attn_policy_at(i)->in_all && na < sizeof all)
            na += (size_t)snprintf(all + na, sizeof all - na, "%s%s", na ? "," : "", attn_policy_at(i)->name);
#define ADD(...) n += (size_t)snprintf(usage + n, n < sizeof usage ? sizeof usage - n : 0, __VA_ARGS__)
    ADD("usage: sparq eval %s [-m MODEL] [--attn P1,P2,..|all] [--sweep ratio=1,1/2,1/4,1/8] [options]\n",
        t ? t->name : "TASK");
    if (t) {
        ADD("%s: %s\n", t->name, t->summary);
    } else {
        ADD("tasks (sparq eval TASK --help shows one task's options):\n");
        for (int i = 0; i < task_def_count(); i++)
            ADD("  %-12s %s\n", task_def_at(i)->name, task_def_at(i)->summary);
    }
    ADD("policies (--attn all = %s):\n", all);
    for (int i = 0; i < attn_policy_count(); i++)
        ADD("  %-12s %s%s", attn_policy_at(i)->name, attn_policy_at(i)->summary,
            i + 1 < attn_policy_count() ? "\n" : "");
#undef ADD
    enum { MAX_GROUPS = 24, MAX_ROWS = 8 };
    cli_opt rows[MAX_GROUPS][MAX_ROWS + 1];
    char titles[MAX_GROUPS][64];
    cli_group g[MAX_GROUPS];
    int ng = 0;
    if (!t) /* the generic page: the common groups first */
        for (int i = 0; i < n_groups && ng < MAX_GROUPS; i++) g[ng++] = groups[i];
    for (int i = 0; i < task_def_count() && ng < MAX_GROUPS; i++) {
        const task_def *d = task_def_at(i);
        if ((t && d != t) || task_help_table(d, rows[ng], MAX_ROWS) == 0) continue;
        snprintf(titles[ng], sizeof titles[ng], "%s options", d->name);
        g[ng] = (cli_group){ titles[ng], rows[ng], NULL };
        ng++;
    }
    if (t) /* a task's page: its own options first */
        for (int i = 0; i < n_groups && ng < MAX_GROUPS; i++) g[ng++] = groups[i];
    cli_print_help(stdout, usage, g, ng);
}

/* ---- entry point ----------------------------------------------------------------------------- */

/* Everything the options say, parsed and checked. */
typedef struct eval_args {
    cli_model_opts mo;
    attn_opts      ao;
    eval_opts      eo;
    task_opts      to;
    const task_def *t;
    int64_t        limit, ratio_len;
    int            kv_type, match_k;
    task_params    tp;
} eval_args;

/* Parses the options and finds the task. Returns -1 to go on, else the
 * exit status (0 after --help). */
static int eval_parse(int argc, char **argv, eval_args *a)
{
    memset(a, 0, sizeof *a);
    attn_opts_init(&a->ao);
    task_opts_init(&a->to);
    cli_group groups[] = {
        { "evaluation", eval_table, &a->eo },
        { "model", cli_model_table, &a->mo },
        { "attention (--attn takes a comma-separated list, or all)", cli_attn_table, &a->ao },
        { "task options", a->to.opts, a->to.value },
    };
    char err[512];
    char *pos[1];
    int n_pos = 0, help = 0;
    if (cli_parse(groups, 4, argc, argv, pos, 1, &n_pos, &help, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    a->t = n_pos == 1 ? task_find(pos[0]) : NULL;
    char names[256];
    if (n_pos == 1 && !a->t) {
        fprintf(stderr, "error: unknown task '%s' (%s)\n", pos[0], task_names(names, sizeof names, " "));
        return 2;
    }
    if (help) {
        print_help(a->t, groups, 3);
        return 0;
    }
    if (!a->t) {
        fprintf(stderr, "error: eval needs a TASK (see sparq eval --help)\n");
        return 2;
    }
    return -1;
}

/* The values and the options that exclude each other or would be
 * ignored. Returns -1 to go on, else the exit status. */
static int eval_check(eval_args *a)
{
    const eval_opts *eo = &a->eo;
    char err[512];
    if (positive_option("--limit", eo->limit, &a->limit) || positive_option("--ratio-len", eo->ratio_len, &a->ratio_len))
        return 2;
    a->tp = task_default_params();
    a->tp.seed = eo->seed;
    a->tp.path = eo->data;
    if (apply_task_opts(&a->to, a->t, &a->tp)) return 2;
    if ((a->kv_type = cli_model_kv_type(&a->mo, err, sizeof err)) < 0) { /* --kv-type, -ctk, -ctv */
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (a->mo.json + eo->csv > 1) {
        fprintf(stderr, "error: give only one of --json and --csv\n");
        return 2;
    }
    if (eo->match) {
        if (strcmp(eo->match, "k") == 0) a->match_k = 1;
        else if (strcmp(eo->match, "transfer") != 0) {
            fprintf(stderr, "error: --match must be transfer or k, not '%s'\n", eo->match);
            return 2;
        }
    }
    if (a->ao.ratio && eo->sweep) {
        fprintf(stderr, "error: give either --sparq-ratio or --sweep\n");
        return 2;
    }
    /* options that would otherwise be ignored */
    const int ratio_sweep = eo->sweep && strncmp(eo->sweep, "ratio=", 6) == 0;
    if (eo->match && !ratio_sweep) {
        fprintf(stderr, "error: --match applies to --sweep ratio=...\n");
        return 2;
    }
    if (eo->ratio_len && !ratio_sweep && !a->ao.ratio) {
        fprintf(stderr, "error: --ratio-len applies to --sweep ratio=... or --sparq-ratio\n");
        return 2;
    }
    return -1;
}

/* Runs every setting on the model (Ctrl-C stops after the current run);
 * the notes on stderr. *n_ctx: the context used. 0, or -1 with the error
 * printed. */
static int eval_cli_run(eval_args *a, sparq_model *m, eval_setting *set, int n_set, int64_t *n_ctx)
{
    char err[512];
    eval_sweep w;
    memset(&w, 0, sizeof w);
    w.task = a->t;
    w.tp = a->tp;
    w.env.match_k = a->match_k;
    w.m = m;
    w.cp = sparq_context_default_params();
    w.cp.n_ctx = a->mo.n_ctx > 0 ? a->mo.n_ctx : sparq_model_n_ctx_train(m);
    w.cp.n_threads = a->mo.n_threads;
    w.cp.n_batch = a->mo.n_batch;
    w.cp.kv_type = a->kv_type;
    w.cp.abort_flag = &interrupted;
    w.env.base = base_params;
    w.env.base_user = &a->ao;
    w.env.d = sparq_model_head_dim(m);
    w.env.g = sparq_model_n_head(m) / sparq_model_n_kv_head(m);
    w.limit = a->limit;
    w.ratio_len = a->ratio_len;
    w.note = on_note;
    w.progress = on_progress;
    if (a->eo.verbose) w.ran = on_ran;
    *n_ctx = w.cp.n_ctx;
    signal(SIGINT, on_sigint);
    eval_sweep_summary sum;
    double t0 = cli_now();
    if (eval_sweep_run(&w, set, n_set, &sum, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    if (interrupted) fprintf(stderr, "interrupted: reporting the %lld finished examples\n", (long long)sum.n_done);
    fprintf(stderr, "eval: %.1f s\n", cli_now() - t0);
    if (sum.n_truncated)
        fprintf(stderr,
                "note: %lld of %lld prompts were truncated from the left to fit the context of %lld tokens "
                "(%lld tokens dropped; -v shows each)\n",
                (long long)sum.n_truncated, (long long)sum.n_prepared, (long long)w.cp.n_ctx,
                (long long)sum.n_dropped);
    return 0;
}

/* The rows of the settings: skipped runs noted, the table (CSV, JSON) on
 * stdout, the plot. Returns the exit status. */
static int eval_report(const eval_args *a, const eval_setting *set, int n_set, const char *path, int64_t n_ctx)
{
    eval_row *rows = calloc((size_t)n_set, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    eval_rows_make(set, n_set, rows);
    for (int s = 0; s < n_set; s++)
        if (set[s].n_skipped)
            fprintf(stderr, "note: %s skipped %lld runs: %s\n", set[s].policy, (long long)set[s].n_skipped,
                    set[s].skip_reason);
    if (a->mo.json) print_json(stdout, a->t, path, n_ctx, rows, n_set);
    else if (a->eo.csv) print_csv(stdout, a->t, rows, n_set);
    else print_table(stdout, a->t, rows, n_set);
    fflush(stdout);
    int rc = interrupted ? 130 : 0;
    if (a->eo.plot) {
        const char *base = strrchr(path, '/');
        if (write_plot(a->eo.plot, a->t, base ? base + 1 : path, rows, n_set)) rc = 1;
    }
    free(rows);
    return rc;
}

int cli_eval(int argc, char **argv)
{
    /* the prefill's fidelity compares two caches, not decode policies: its own harness */
    if (argc >= 1 && strcmp(argv[0], "prefill-fidelity") == 0) return cli_eval_prefill(argc - 1, argv + 1);
    eval_args args, *a = &args;
    int rc = eval_parse(argc, argv, a);
    if (rc < 0) rc = eval_check(a);
    if (rc >= 0) return rc;
    char err[512], path[4096];
    eval_setting *set = calloc(EVAL_MAX_SETTINGS, sizeof *set);
    int n_set = 0;
    sparq_model *m = NULL;
    int64_t n_ctx = 0;
    if (!set) {
        fprintf(stderr, "error: out of memory\n");
        rc = 1;
    } else if (eval_settings_make(a->ao.attn, a->eo.sweep, set, &n_set, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        rc = 2;
    } else if (!(m = cli_load_model(&a->mo, path, sizeof path)) || eval_cli_run(a, m, set, n_set, &n_ctx)) {
        rc = 1;
    } else {
        rc = eval_report(a, set, n_set, path, n_ctx);
    }
    for (int s = 0; s < n_set; s++) eval_setting_free(&set[s]);
    free(set);
    sparq_model_free(m);
    return rc;
}
