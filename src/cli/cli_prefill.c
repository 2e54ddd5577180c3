/* cli_prefill.c - `sparq prefill`: run a long context through the model once
 * and save its KV cache, with prebuilt top-k indexes, to a file that
 * `sparq run --load-kv FILE` maps back (docs/KVFILE.md).
 *
 * What would only fail after the long prefill (duplicate --index kinds, a
 * --save-kv path that cannot be written) is checked before it. The writing
 * itself is the library's (sparq_context_save_kv, io/kvfile.h).
 *
 * stdout: nothing, or one JSON object with --json; progress on stderr.
 */
#include "cli/cli.h"
#include "util/textbuf.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct prefill_opts {
    const char *prompt, *prompt_file, *save;
    const char *index;   /* kinds to store; NULL: the default, ivf */
    int progress, resume;
} prefill_opts;

#define OFF(f) offsetof(prefill_opts, f)
static const cli_opt prefill_table[] = {
    { "-f", "--file", OPT_STR, OFF(prompt_file), "FILE", "the context to prefill" },
    { "-p", "--prompt", OPT_STR, OFF(prompt), "TEXT", "the context as text (instead of -f)" },
    { "--save-kv", NULL, OPT_STR, OFF(save), "FILE", "KV cache file to write (required)" },
    /* here --index lists the kinds to store, not topk's one kind: the
     * attention group's --index row is left out, so --help gives one default */
    { "--index", NULL, OPT_STR, OFF(index), "LIST",
      "top-k indexes to build and store: comma list of exact|ivf|hnsw|sparq, or none (default ivf)" },
    { "--progress", NULL, OPT_FLAG, OFF(progress), NULL,
      "prefill progress on stderr even when it is not a terminal: a line after the first batch, "
      "every 5 s ($SPARQ_PROGRESS_SECONDS) and at the end, with tokens done / total, tok/s and ETA" },
    { "--resume", NULL, OPT_FLAG, OFF(resume), NULL,
      "continue the partial FILE.tmp that an interrupted prefill of the same model, context and options left "
      "(else start afresh, saying why)" },
    { 0 },
};
#undef OFF

/* Progress lines when asked for, and the peak of private memory, sampled
 * after every batch (the cache itself lives in the file's pages). */
typedef struct prefill_watch {
    cli_progress prog;
    int          print;
    int64_t      peak_anon;
} prefill_watch;

static void prefill_watch_cb(void *user, int64_t done, int64_t total)
{
    prefill_watch *w = user;
    const int64_t anon = cli_rss_anon();
    if (anon > w->peak_anon) w->peak_anon = anon;
    if (w->print) cli_prefill_progress(&w->prog, done, total);
}

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

int cli_prefill(int argc, char **argv)
{
    cli_model_opts mo = { 0 };
    attn_opts ao;
    attn_opts_init(&ao);
    prefill_opts po = { 0 };
    cli_prefill_opts pfo = { 0 };
    cli_opt attn_table[64]; /* cli_attn_table without its --index (topk's kind) */
    size_t n_attn = 0;
    for (const cli_opt *o = cli_attn_table; o->name && n_attn + 1 < sizeof attn_table / sizeof *attn_table; o++)
        if (strcmp(o->name, "--index") != 0) attn_table[n_attn++] = *o;
    memset(&attn_table[n_attn], 0, sizeof attn_table[n_attn]);
    cli_group groups[] = {
        { "prefill", prefill_table, &po },
        { "model", cli_model_table, &mo },
        { "attention", attn_table, &ao },
        { "prefill attention", cli_prefill_table, &pfo },
    };
    const int n_groups = 4;
    char err[512], path[4096];
    const int parsed = cli_parse_command(groups, n_groups, argc, argv,
                                         "usage: sparq prefill [-m MODEL] (-f FILE | -p TEXT) --save-kv OUT [--index LIST]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    if (!po.save) {
        fprintf(stderr, "error: --save-kv FILE is required\n");
        return 2;
    }
    if (!!po.prompt + !!po.prompt_file != 1) {
        fprintf(stderr, "error: give the context with exactly one of -f FILE and -p TEXT\n");
        return 2;
    }
    const int kv_type = cli_model_kv_type(&mo, err, sizeof err); /* --kv-type, -ctk, -ctv */
    if (kv_type < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    /* what would only fail after the long prefill is checked before it */
    const char *indexes;
    if (cli_kv_output(po.index, po.save, &indexes)) return 2;

    int rc = 1;
    sparq_model *m = NULL;
    sparq_context *c = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    m = cli_load_model(&mo, path, sizeof path);
    if (!m) goto done;
    size_t len = 0;
    if (po.prompt_file) {
        text = text_read_file(po.prompt_file, &len);
        if (!text) {
            fprintf(stderr, "error: cannot read context file '%s'\n", po.prompt_file);
            goto done;
        }
    } else {
        text = strdup(po.prompt);
        len = strlen(text);
    }
    int n = sparq_tokenize(m, text, (int)len, 1, NULL, 0);
    if (n <= 0 || !(ids = malloc((size_t)n * sizeof *ids)) || sparq_tokenize(m, text, (int)len, 1, ids, n) != n) {
        fprintf(stderr, "error: cannot tokenize the context\n");
        goto done;
    }
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = mo.n_ctx > 0 ? mo.n_ctx : sparq_model_n_ctx_train(m);
    cp.n_threads = mo.n_threads;
    cp.n_batch = mo.n_batch;
    cp.kv_type = kv_type;
    if (cli_prefill_params(&pfo, &cp.prefill, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (n >= cp.n_ctx) {
        fprintf(stderr, "error: the context has %d tokens but the cache holds %lld (-c); leave room for "
                        "the question and the answer\n", n, (long long)cp.n_ctx);
        goto done;
    }
    if (attn_opts_params(&ao, cp.n_ctx, sparq_model_head_dim(m), &cp.attn, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    prefill_watch watch = { .peak_anon = cli_rss_anon() };
    cli_progress_start(&watch.prog);
    cli_progress *const prog = &watch.prog;
    watch.print = prog->tty || po.progress;
    cp.progress = prefill_watch_cb;
    cp.progress_user = &watch;
    cp.abort_flag = &interrupted;
    /* the cache is built in the output file itself: no copy at the end, and
     * private memory does not grow with the context */
    int64_t resumed = 0;
    if (po.resume) {
        const int r = sparq_context_create_in_file(m, &cp, po.save, ids, n, indexes,
                                                   SPARQ_IN_FILE_KEEP | SPARQ_IN_FILE_RESUME, &c, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "error: %s\n", err);
            goto done;
        }
        if (r > 0) {
            fprintf(stderr, "resume: %s; starting afresh\n", err);
        } else {
            resumed = sparq_context_pos(c);
            fprintf(stderr, "resume: %lld of %d tokens already in '%s.tmp'\n", (long long)resumed, n, po.save);
        }
    }
    if (!c && sparq_context_create_in_file(m, &cp, po.save, ids, n, indexes, SPARQ_IN_FILE_KEEP, &c, err,
                                           sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    signal(SIGINT, on_sigint);
    cli_progress_start(prog);
    double t0 = cli_now();
    if (resumed < n && sparq_eval(c, ids + resumed, (int)(n - resumed), NULL)) {
        if (interrupted) { /* Ctrl-C: the eval stopped between batches; the partial file stays */
            const double t = cli_now() - t0;
            const int64_t done_pos = sparq_context_pos(c);
            fprintf(stderr, "%sinterrupted: prefill stopped after %lld of %d tokens (%.1f tok/s, %.0f ms); "
                            "'%s.tmp' holds them: the same command with --resume continues\n",
                    prog->tty ? "\n" : "", (long long)done_pos, n, t > 0 ? (done_pos - resumed) / t : 0.0, t * 1e3,
                    po.save);
            rc = 130;
            goto done;
        }
        fprintf(stderr, "error: %s\n", sparq_context_error(c));
        goto done;
    }
    double t_prefill = cli_now() - t0;
    fprintf(stderr, "prefill: %lld tokens in %.2f s (%.1f tok/s)%s; saving with indexes [%s]\n",
            (long long)(n - resumed), t_prefill, (n - resumed) / (t_prefill > 0 ? t_prefill : 1e-9),
            resumed ? " after the resumed ones" : "", indexes);
    t0 = cli_now();
    if (sparq_context_save_kv(c, po.save, indexes, ids, n, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    double t_save = cli_now() - t0;
    struct stat st;
    int64_t bytes = stat(po.save, &st) == 0 ? (int64_t)st.st_size : -1;
    int64_t disk = stat(po.save, &st) == 0 ? (int64_t)st.st_blocks * 512 : -1;
    const int64_t anon = cli_rss_anon();
    if (anon > watch.peak_anon) watch.peak_anon = anon;
    fprintf(stderr, "saved %s: %lld positions of %lld, %.1f MiB (%.1f MiB on disk) in %.2f s | peak RSS %.1f MiB, "
                    "peak private %.1f MiB\n",
            po.save, (long long)n, (long long)cp.n_ctx, bytes / 1048576.0, disk / 1048576.0, t_save,
            cli_peak_rss() / 1048576.0, watch.peak_anon / 1048576.0);
    if (mo.json) {
        printf("{\"model\":");
        cli_json_str(stdout, path, strlen(path));
        printf(",\"file\":");
        cli_json_str(stdout, po.save, strlen(po.save));
        printf(",\"tokens\":%d,\"n_ctx\":%lld,\"indexes\":", n, (long long)cp.n_ctx);
        cli_json_str(stdout, indexes, strlen(indexes));
        printf(",\"prefill_s\":%.4f,\"save_s\":%.4f,\"file_bytes\":%lld,\"disk_bytes\":%lld,"
               "\"peak_rss_bytes\":%lld,\"peak_private_bytes\":%lld,\"prefill_attn\":",
               t_prefill, t_save, (long long)bytes, (long long)disk, (long long)cli_peak_rss(),
               (long long)watch.peak_anon);
        const char *mode = sparq_prefill_mode_name(cp.prefill.mode);
        cli_json_str(stdout, mode, strlen(mode));
        printf(",\"kv_type\":");
        cli_json_str(stdout, mo.kv_type ? mo.kv_type : "f16", strlen(mo.kv_type ? mo.kv_type : "f16"));
        printf("}\n");
    }
    rc = 0;
done:
    free(ids);
    free(text);
    sparq_context_free(c);
    sparq_model_free(m);
    return rc;
}
