/* cli_eval_prefill.c - `sparq eval prefill-fidelity`: the cache of a sparse
 * prefill against the exact one, teacher-forced over windows of a text at
 * several depths (eval/prefill_fidelity.h). Parses, calls, prints.
 *
 * stdout: a table, or with --json one JSON object per depth.
 */
#include "cli/cli.h"
#include "bench/bench.h"
#include "eval/prefill_fidelity.h"
#include "util/paths.h"
#include "util/textbuf.h"

#include <stdlib.h>
#include <string.h>

typedef struct pf_opts {
    const char *text, *depth;
    int forced, windows;
} pf_opts;

#define OFF(f) offsetof(pf_opts, f)
static const cli_opt pf_table[] = {
    { "-f", "--file", OPT_STR, OFF(text), "FILE",
      "the text (default data/text/tinyshakespeare_input.txt on the model path; repeated to reach the depth)" },
    { "--depth", NULL, OPT_STR, OFF(depth), "LIST", "tokens prefilled, e.g. 4k,16k,32k (the default)" },
    { "--forced", NULL, OPT_INT1, OFF(forced), "F", "teacher-forced tokens compared after the prefill (default 128)" },
    { "--windows", NULL, OPT_INT1, OFF(windows), "W", "windows per depth, spread over the text (default 4)" },
    { 0 },
};
#undef OFF

enum { MAX_DEPTHS = 16 };

static void on_window(void *user, int done, int total)
{
    fprintf(stderr, "  %s: window %d / %d\n", (const char *)user, done, total);
}

/* Everything the options say, parsed and checked. */
typedef struct pf_args {
    cli_model_opts       mo;
    pf_opts              po;
    cli_prefill_opts     pfo;
    sparq_prefill_params sp;       /* the sparse side                       */
    int                  kv_type;
    int64_t              depths[MAX_DEPTHS];
    int                  n_depth, F, W;
    char                 tpath[4096]; /* the text file                       */
} pf_args;

/* Parses and checks the options and finds the text. Returns -1 to go on,
 * else the exit status. */
static int pf_parse(int argc, char **argv, pf_args *a)
{
    memset(a, 0, sizeof *a);
    pf_opts *po = &a->po;
    cli_group groups[] = {
        { "prefill fidelity", pf_table, po },
        { "model", cli_model_table, &a->mo },
        { "prefill attention (the sparse side; default topk)", cli_prefill_table, &a->pfo },
    };
    const int parsed = cli_parse_command(groups, 3, argc, argv,
                                         "usage: sparq eval prefill-fidelity [-m MODEL] [-f TEXT] [--depth LIST] "
                                         "[--prefill-attn window|topk ...]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    char err[512];
    if (!a->pfo.mode) a->pfo.mode = "topk";
    if (cli_prefill_params(&a->pfo, &a->sp, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (a->sp.mode == SPARQ_PREFILL_EXACT || a->sp.mode == SPARQ_PREFILL_POLICY) {
        fprintf(stderr, "error: --prefill-attn %s: compare window or topk with the exact prefill\n",
                sparq_prefill_mode_name(a->sp.mode));
        return 2;
    }
    if ((a->kv_type = cli_model_kv_type(&a->mo, err, sizeof err)) < 0) { /* --kv-type, -ctk, -ctv */
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    a->n_depth = bench_parse_list(po->depth ? po->depth : "4k,16k,32k", a->depths, MAX_DEPTHS, err, sizeof err);
    if (a->n_depth < 0) {
        fprintf(stderr, "error: --depth: %s\n", err);
        return 2;
    }
    for (int i = 0; i < a->n_depth; i++)
        if (a->depths[i] < 2 || a->depths[i] > (1 << 30)) {
            fprintf(stderr, "error: --depth %lld: must be in [2, 2^30]\n", (long long)a->depths[i]);
            return 2;
        }
    a->F = po->forced ? po->forced : 128;
    a->W = po->windows ? po->windows : 4;
    const char *tname = po->text ? po->text : "data/text/tinyshakespeare_input.txt";
    if (po->text) {
        snprintf(a->tpath, sizeof a->tpath, "%s", po->text);
    } else if (path_find(tname, a->tpath, sizeof a->tpath)) {
        fprintf(stderr, "error: text '%s' not found on the model path; give one with -f FILE\n", tname);
        return 1;
    }
    if (cli_check_regular(a->tpath)) return 1;
    return -1;
}

/* One depth's result: a table row, or with --json one object. */
static void pf_print(const pf_args *a, const char *path, int repeated, int64_t depth, const eval_pf_result *r)
{
    const char *mode = sparq_prefill_mode_name(a->sp.mode);
    const sparq_prefill_params rp = sparq_prefill_resolve(&a->sp, depth + a->F); /* what ran */
    if (a->mo.json) {
        printf("{\"model\":");
        cli_json_str(stdout, path, strlen(path));
        printf(",\"text\":");
        cli_json_str(stdout, a->tpath, strlen(a->tpath));
        printf(",\"text_repeated\":%s,\"depth\":%lld,\"prefill_attn\":\"%s\",\"window\":%d,\"n_sink\":%d,"
               "\"k\":%d,\"nlist\":%d,\"nprobe\":%d,\"forced\":%d,\"windows\":%d,\"top1\":%.6f,"
               "\"top1_se\":%.6f,\"kl\":%.6g,\"kl_se\":%.6g,\"first_div\":%.2f,\"first_div_se\":%.2f,"
               "\"exact_s\":%.3f,\"sparse_s\":%.3f}\n",
               repeated ? "true" : "false", (long long)depth, mode, rp.window, rp.n_sink, rp.k, rp.nlist,
               rp.nprobe, a->F, a->W, r->top1, r->top1_se, r->kl, r->kl_se, r->first_div, r->first_div_se,
               r->exact_s, r->sparse_s);
    } else {
        printf("%8lld %8s %8.4f (%.4f) %11.5f (%.5f) %8.1f (%5.1f) %10.2f %10.2f\n", (long long)depth, mode,
               r->top1, r->top1_se, r->kl, r->kl_se, r->first_div, r->first_div_se, r->exact_s, r->sparse_s);
    }
    fflush(stdout);
}

/* Every depth on the model's tokens of the text. Returns the exit status. */
static int pf_run(const pf_args *a, sparq_model *m, const char *path, const char *text, size_t len)
{
    char err[512];
    int64_t need = 0;
    for (int i = 0; i < a->n_depth; i++) need = a->depths[i] + a->F > need ? a->depths[i] + a->F : need;
    need += (int64_t)(a->W - 1) * 64; /* windows at distinct offsets */
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    int n = 0;
    if (eval_pf_tokens(m, text, len, need, &ids, &n_ids, &n)) {
        fprintf(stderr, "error: cannot tokenize the text\n");
        return 1;
    }
    const int repeated = n < need;
    sparq_context_params cp = sparq_context_default_params();
    cp.kv_type = a->kv_type;
    cp.n_threads = a->mo.n_threads;
    cp.n_batch = a->mo.n_batch;
    fprintf(stderr, "prefill fidelity: %s, text %s (%d tokens%s), %s prefill against exact, %d forced tokens, "
                    "%d windows\n", path, a->tpath, n, repeated ? ", repeated to reach the depth" : "",
            sparq_prefill_mode_name(a->sp.mode), a->F, a->W);
    if (!a->mo.json)
        printf("%8s %8s %16s %20s %16s %10s %10s\n", "depth", "mode", "top1 (se)", "KL nats (se)",
               "first div (se)", "exact s", "sparse s");
    int rc = 0;
    for (int i = 0; i < a->n_depth && rc == 0; i++) {
        eval_pf_result r;
        char what[64];
        snprintf(what, sizeof what, "depth %lld", (long long)a->depths[i]);
        const eval_pf_setup su = {.base = &cp,
                                  .sparse = &a->sp,
                                  .N = (int)a->depths[i],
                                  .F = a->F,
                                  .n_windows = a->W,
                                  .progress = on_window,
                                  .user = what};
        if (eval_prefill_fidelity(m, &su, ids, n_ids, NULL, &r, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        } else {
            pf_print(a, path, repeated, a->depths[i], &r);
        }
    }
    free(ids);
    return rc;
}

int cli_eval_prefill(int argc, char **argv)
{
    pf_args a;
    const int st = pf_parse(argc, argv, &a);
    if (st >= 0) return st;
    size_t len = 0;
    char *text = text_read_file(a.tpath, &len);
    if (!text || len == 0 || len > (size_t)1 << 30) {
        fprintf(stderr, "error: cannot read the text '%s' (or it is empty or over 1 GiB)\n", a.tpath);
        free(text);
        return 1;
    }
    char path[4096];
    sparq_model *m = cli_load_model(&a.mo, path, sizeof path);
    const int rc = m ? pf_run(&a, m, path, text, len) : 1;
    free(text);
    sparq_model_free(m);
    return rc;
}
