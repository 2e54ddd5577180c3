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

int cli_eval_prefill(int argc, char **argv)
{
    cli_model_opts mo = { 0 };
    pf_opts po = { 0 };
    cli_prefill_opts pfo = { 0 };
    cli_group groups[] = {
        { "prefill fidelity", pf_table, &po },
        { "model", cli_model_table, &mo },
        { "prefill attention (the sparse side; default topk)", cli_prefill_table, &pfo },
    };
    const int parsed = cli_parse_command(groups, 3, argc, argv,
                                         "usage: sparq eval prefill-fidelity [-m MODEL] [-f TEXT] [--depth LIST] "
                                         "[--prefill-attn window|topk ...]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    char err[512], path[4096], tpath[4096];
    if (!pfo.mode) pfo.mode = "topk";
    sparq_prefill_params sp;
    if (cli_prefill_params(&pfo, &sp, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (sp.mode == SPARQ_PREFILL_EXACT || sp.mode == SPARQ_PREFILL_POLICY) {
        fprintf(stderr, "error: --prefill-attn %s: compare window or topk with the exact prefill\n",
                sparq_prefill_mode_name(sp.mode));
        return 2;
    }
    sparq_context_params cp = sparq_context_default_params();
    cp.kv_type = cli_model_kv_type(&mo, err, sizeof err); /* --kv-type, -ctk, -ctv */
    if (cp.kv_type < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    int64_t depths[MAX_DEPTHS];
    const int n_depth = bench_parse_list(po.depth ? po.depth : "4k,16k,32k", depths, MAX_DEPTHS, err, sizeof err);
    if (n_depth < 0) {
        fprintf(stderr, "error: --depth: %s\n", err);
        return 2;
    }
    for (int i = 0; i < n_depth; i++)
        if (depths[i] < 2 || depths[i] > (1 << 30)) {
            fprintf(stderr, "error: --depth %lld: must be in [2, 2^30]\n", (long long)depths[i]);
            return 2;
        }
    const int F = po.forced ? po.forced : 128, W = po.windows ? po.windows : 4;
    const char *tname = po.text ? po.text : "data/text/tinyshakespeare_input.txt";
    if (po.text) {
        snprintf(tpath, sizeof tpath, "%s", po.text);
    } else if (path_find(tname, tpath, sizeof tpath)) {
        fprintf(stderr, "error: text '%s' not found on the model path; give one with -f FILE\n", tname);
        return 1;
    }
    if (cli_check_regular(tpath)) return 1;
    size_t len = 0;
    char *text = text_read_file(tpath, &len);
    if (!text || len == 0 || len > (size_t)1 << 30) {
        fprintf(stderr, "error: cannot read the text '%s' (or it is empty or over 1 GiB)\n", tpath);
        free(text);
        return 1;
    }
    int rc = 1;
    int32_t *ids = NULL;
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    if (!m) goto done;
    const int n = sparq_tokenize(m, text, (int)len, 1, NULL, 0);
    int64_t need = 0;
    for (int i = 0; i < n_depth; i++) need = depths[i] + F > need ? depths[i] + F : need;
    need += (int64_t)(W - 1) * 64; /* windows at distinct offsets */
    if (n <= 1 || !(ids = malloc((size_t)(need > n ? need : n) * sizeof *ids)) ||
        sparq_tokenize(m, text, (int)len, 1, ids, n) != n) {
        fprintf(stderr, "error: cannot tokenize the text\n");
        goto done;
    }
    int64_t n_ids = n;
    const int repeated = n_ids < need;
    while (n_ids < need) { /* the text again, without its BOS */
        const int64_t take = need - n_ids < n - 1 ? need - n_ids : n - 1;
        memcpy(ids + n_ids, ids + 1, (size_t)take * sizeof *ids);
        n_ids += take;
    }
    cp.n_threads = mo.n_threads;
    cp.n_batch = mo.n_batch;
    fprintf(stderr, "prefill fidelity: %s, text %s (%d tokens%s), %s prefill against exact, %d forced tokens, "
                    "%d windows\n", path, tpath, n, repeated ? ", repeated to reach the depth" : "",
            sparq_prefill_mode_name(sp.mode), F, W);
    if (!mo.json)
        printf("%8s %8s %16s %20s %16s %10s %10s\n", "depth", "mode", "top1 (se)", "KL nats (se)",
               "first div (se)", "exact s", "sparse s");
    for (int i = 0; i < n_depth; i++) {
        eval_pf_result r;
        char what[64];
        snprintf(what, sizeof what, "depth %lld", (long long)depths[i]);
        if (eval_prefill_fidelity(m, &cp, &sp, ids, n_ids, (int)depths[i], F, W, NULL, &r, on_window, what, err,
                                  sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            goto done;
        }
        const char *mode = sparq_prefill_mode_name(sp.mode);
        const sparq_prefill_params rp = sparq_prefill_resolve(&sp, depths[i] + F); /* what ran */
        if (mo.json) {
            printf("{\"model\":");
            cli_json_str(stdout, path, strlen(path));
            printf(",\"text\":");
            cli_json_str(stdout, tpath, strlen(tpath));
            printf(",\"text_repeated\":%s,\"depth\":%lld,\"prefill_attn\":\"%s\",\"window\":%d,\"n_sink\":%d,"
                   "\"k\":%d,\"nlist\":%d,\"nprobe\":%d,\"forced\":%d,\"windows\":%d,\"top1\":%.6f,"
                   "\"top1_se\":%.6f,\"kl\":%.6g,\"kl_se\":%.6g,\"first_div\":%.2f,\"first_div_se\":%.2f,"
                   "\"exact_s\":%.3f,\"sparse_s\":%.3f}\n",
                   repeated ? "true" : "false", (long long)depths[i], mode, rp.window, rp.n_sink, rp.k, rp.nlist,
                   rp.nprobe, F, W, r.top1, r.top1_se, r.kl, r.kl_se, r.first_div, r.first_div_se, r.exact_s,
                   r.sparse_s);
        } else {
            printf("%8lld %8s %8.4f (%.4f) %11.5f (%.5f) %8.1f (%5.1f) %10.2f %10.2f\n", (long long)depths[i], mode,
                   r.top1, r.top1_se, r.kl, r.kl_se, r.first_div, r.first_div_se, r.exact_s, r.sparse_s);
        }
        fflush(stdout);
    }
    rc = 0;
done:
    free(ids);
    free(text);
    sparq_model_free(m);
    return rc;
}
