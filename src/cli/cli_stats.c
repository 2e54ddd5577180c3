/* cli_stats.c - `sparq stats`: attention statistics of a real forward pass.
 *
 * Tokenizes a text (BOS + its first tokens, up to the context), prefills all
 * but the last --n-query tokens and measures the last ones as decode steps
 * (eval_attn_stats): per layer and head the Fisher kurtosis of q, top-k
 * agreement between SparQ's approximate scores and the exact ones for
 * several r, SparQ's alpha against the true top-k mass, the attention
 * entropy and the number of keys holding 75% of the weight (SparQ paper,
 * Figure 4 and Appendix E). A table per layer (means over heads) on stdout,
 * per head with --heads; --json prints everything, per head.
 */
#include "cli/cli.h"
#include "eval/eval.h"
#include "util/paths.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct stats_opts {
    const char *file;
    int         n_query;
    int         k;
    const char *r_list;
    int         alpha_r;
    int         heads;
} stats_opts;

#define OFF(f) offsetof(stats_opts, f)
static const cli_opt stats_table[] = {
    { "-f", "--file", OPT_STR, OFF(file), "FILE", "text to run (default Tiny Shakespeare from the data path)" },
    { "--n-query", NULL, OPT_INT, OFF(n_query), "N", "decode steps measured: the text's last N tokens (default 64)" },
    { "--stats-k", NULL, OPT_INT, OFF(k), "K", "top-k size for agreement and mass (default 32)" },
    { "--r", NULL, OPT_STR, OFF(r_list), "R1,R2,..", "SparQ r values for top-k agreement (default 1,2,4,..,d)" },
    { "--alpha-r", NULL, OPT_INT, OFF(alpha_r), "R", "r for alpha vs true mass (default d/4)" },
    { "--heads", NULL, OPT_FLAG, OFF(heads), NULL, "also print one line per head" },
    { 0 },
};
#undef OFF

static int parse_r_list(const char *s, eval_stats_params *p)
{
    p->n_r = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20 || (*end && *end != ',') || p->n_r == EVAL_STATS_MAX_R) return -1;
        p->r[p->n_r++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return p->n_r > 0 ? 0 : -1;
}

/* Mean over the heads of one layer of the field at byte offset off. */
static double layer_mean(const eval_stats *st, int layer, size_t off)
{
    double sum = 0;
    for (int h = 0; h < st->n_head; h++)
        sum += *(const double *)((const char *)&st->heads[(size_t)layer * st->n_head + h] + off);
    return sum / st->n_head;
}

static double layer_agreement(const eval_stats *st, int layer, int ir)
{
    double sum = 0;
    for (int h = 0; h < st->n_head; h++) sum += st->heads[(size_t)layer * st->n_head + h].agreement[ir];
    return sum / st->n_head;
}

static void print_line(FILE *f, const char *name, const eval_head_stats *x, const eval_stats *st)
{
    fprintf(f, "%-8s %9.3f %9.3f %8.3f %8.1f %7.3f %9.3f %7.3f %9.3f", name, x->kurtosis, x->kurtosis_pooled,
            x->entropy, x->keys75,
            x->keys75_frac, x->topk_mass, x->alpha, x->alpha_abs_err);
    for (int i = 0; i < st->n_r; i++) fprintf(f, " %7.3f", x->agreement[i]);
    fputc('\n', f);
}

static void print_table(FILE *f, const eval_stats *st, int heads)
{
    fprintf(f, "attention statistics at decode steps S=%lld..%lld: k=%d, alpha at r=%d, head_dim %d\n",
            (long long)st->s_first, (long long)st->s_last, st->k, st->alpha_r, st->d);
    fprintf(f, "%-8s %9s %9s %8s %8s %7s %9s %7s %9s", "layer", "kurtosis", "kurt_pool", "entropy", "keys75",
            "frac75", "topk_mass", "alpha", "|a-mass|");
    for (int i = 0; i < st->n_r; i++) {
        char h[16];
        snprintf(h, sizeof h, "agr_r%d", st->r[i]);
        fprintf(f, " %7s", h);
    }
    fputc('\n', f);
    eval_head_stats all;
    memset(&all, 0, sizeof all);
    for (int l = 0; l < st->n_layer; l++) {
        eval_head_stats m;
        memset(&m, 0, sizeof m);
        m.kurtosis = layer_mean(st, l, offsetof(eval_head_stats, kurtosis));
        m.kurtosis_pooled = layer_mean(st, l, offsetof(eval_head_stats, kurtosis_pooled));
        m.entropy = layer_mean(st, l, offsetof(eval_head_stats, entropy));
        m.keys75 = layer_mean(st, l, offsetof(eval_head_stats, keys75));
        m.keys75_frac = layer_mean(st, l, offsetof(eval_head_stats, keys75_frac));
        m.topk_mass = layer_mean(st, l, offsetof(eval_head_stats, topk_mass));
        m.alpha = layer_mean(st, l, offsetof(eval_head_stats, alpha));
        m.alpha_abs_err = layer_mean(st, l, offsetof(eval_head_stats, alpha_abs_err));
        for (int i = 0; i < st->n_r; i++) m.agreement[i] = layer_agreement(st, l, i);
        char name[16];
        snprintf(name, sizeof name, "%d", l);
        print_line(f, name, &m, st);
        if (heads)
            for (int h = 0; h < st->n_head; h++) {
                snprintf(name, sizeof name, "  h%d", h);
                print_line(f, name, &st->heads[(size_t)l * st->n_head + h], st);
            }
        all.kurtosis += m.kurtosis / st->n_layer;
        all.kurtosis_pooled += m.kurtosis_pooled / st->n_layer;
        all.entropy += m.entropy / st->n_layer;
        all.keys75 += m.keys75 / st->n_layer;
        all.keys75_frac += m.keys75_frac / st->n_layer;
        all.topk_mass += m.topk_mass / st->n_layer;
        all.alpha += m.alpha / st->n_layer;
        all.alpha_abs_err += m.alpha_abs_err / st->n_layer;
        for (int i = 0; i < st->n_r; i++) all.agreement[i] += m.agreement[i] / st->n_layer;
    }
    print_line(f, "all", &all, st);
    fputs("kurtosis: Fisher, of each q's components, averaged; kurt_pool: of all steps' components together;\n"
          "entropy in nats; keys75: fewest keys holding 75% of the weight;\n"
          "topk_mass: exact weight in the exact top-k; alpha: SparQ's approximate weight of its own top-k;\n"
          "agr_rN: |top-k(approx, r=N) & top-k(exact)| / k\n", f);
}

static void print_json(FILE *f, const char *model, const char *text, int n_tokens, const eval_stats *st)
{
    fputs("{\"command\":\"stats\",\"model\":", f);
    cli_json_str(f, model, strlen(model));
    fputs(",\"file\":", f);
    cli_json_str(f, text, strlen(text));
    fprintf(f, ",\"tokens\":%d,\"s_first\":%lld,\"s_last\":%lld,\"k\":%d,\"alpha_r\":%d,\"head_dim\":%d,\"r\":[",
            n_tokens, (long long)st->s_first, (long long)st->s_last, st->k, st->alpha_r, st->d);
    for (int i = 0; i < st->n_r; i++) fprintf(f, "%s%d", i ? "," : "", st->r[i]);
    fputs("],\"heads\":[", f);
    for (int l = 0; l < st->n_layer; l++)
        for (int h = 0; h < st->n_head; h++) {
            const eval_head_stats *x = &st->heads[(size_t)l * st->n_head + h];
            fprintf(f, "%s\n{\"layer\":%d,\"head\":%d,\"kurtosis\":%.6g,\"kurtosis_pooled\":%.6g,\"entropy\":%.6g,\"keys75\":%.6g,"
                       "\"keys75_frac\":%.6g,\"topk_mass\":%.6g,\"alpha\":%.6g,\"alpha_abs_err\":%.6g,"
                       "\"steps\":%lld,\"agreement\":[",
                    l || h ? "," : "", l, h, x->kurtosis, x->kurtosis_pooled, x->entropy, x->keys75, x->keys75_frac, x->topk_mass,
                    x->alpha, x->alpha_abs_err, (long long)x->n);
            for (int i = 0; i < st->n_r; i++) fprintf(f, "%s%.6g", i ? "," : "", x->agreement[i]);
            fputs("]}", f);
        }
    fputs("]}\n", f);
}

int cli_stats(int argc, char **argv)
{
    cli_model_opts mo = { 0 };
    attn_opts ao;
    attn_opts_init(&ao);
    /* INT_MIN: not given (the parser refuses it as a value) */
    stats_opts so = { .n_query = INT_MIN, .k = INT_MIN, .alpha_r = INT_MIN };
    cli_group groups[] = {
        { "statistics", stats_table, &so },
        { "model", cli_model_table, &mo },
        { "attention (the policy the measured steps run through; default dense)", cli_attn_table, &ao },
    };
    const int n_groups = 3;
    char err[512], path[4096], text_path[4096];
    const int parsed = cli_parse_command(groups, n_groups, argc, argv,
                                         "usage: sparq stats [-m MODEL] [-f TEXT] [options]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    eval_stats_params sp = eval_stats_default_params();
    const struct { const char *name; int v; int *dst; } counts[] = {
        { "--n-query", so.n_query, &sp.n_query }, { "--stats-k", so.k, &sp.k }, { "--alpha-r", so.alpha_r, &sp.alpha_r },
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        if (counts[i].v == INT_MIN) continue;
        if (counts[i].v < 1) {
            fprintf(stderr, "error: %s must be >= 1, not %d\n", counts[i].name, counts[i].v);
            return 2;
        }
        *counts[i].dst = counts[i].v;
    }
    if (so.r_list && parse_r_list(so.r_list, &sp)) {
        fprintf(stderr, "error: --r '%s' must be up to %d positive integers, e.g. 1,2,4\n", so.r_list,
                EVAL_STATS_MAX_R);
        return 2;
    }
    int kv_type = cli_model_kv_type(&mo, err, sizeof err); /* --kv-type, -ctk, -ctv */
    if (kv_type < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    const char *name = so.file ? so.file : "data/text/tinyshakespeare_input.txt";
    if (path_find(name, text_path, sizeof text_path)) {
        fprintf(stderr, "error: text '%s' not found (searched %s)\n", name, path_search_description());
        return 1;
    }

    int rc = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    sparq_context *c = NULL;
    eval_stats st;
    memset(&st, 0, sizeof st);
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    if (!m) goto done;
    size_t n_text;
    if (eval_read_file(text_path, &text, &n_text, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = mo.n_ctx > 0 ? mo.n_ctx : sparq_model_n_ctx_train(m);
    cp.n_threads = mo.n_threads;
    cp.n_batch = mo.n_batch;
    cp.kv_type = kv_type;
    if (attn_opts_params(&ao, cp.n_ctx, sparq_model_head_dim(m), &cp.attn, err, sizeof err) ||
        sparq_context_create(m, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    int64_t n = eval_tokenize(m, text, n_text, 1, &ids, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (n > cp.n_ctx) n = cp.n_ctx; /* the text's beginning, as much as fits */
    if (n <= sp.n_query) {
        fprintf(stderr, "error: '%s' has %lld tokens; --n-query %d needs more\n", text_path, (long long)n,
                sp.n_query);
        goto done;
    }
    double t0 = cli_now();
    if (eval_attn_stats(c, ids, (int)n, &sp, &st, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    fprintf(stderr, "stats: %lld tokens of %s, %d measured decode steps, %.2f s\n", (long long)n, text_path,
            sp.n_query, cli_now() - t0);
    if (mo.json) print_json(stdout, path, text_path, (int)n, &st);
    else print_table(stdout, &st, so.heads);
    rc = 0;
done:
    eval_stats_free(&st);
    free(ids);
    free(text);
    sparq_context_free(c);
    sparq_model_free(m);
    return rc;
}
