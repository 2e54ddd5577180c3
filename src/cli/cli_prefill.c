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

/* Everything the options say, parsed and checked. */
typedef struct pf_args {
    cli_model_opts   mo;
    attn_opts        ao;
    prefill_opts     po;
    cli_prefill_opts pfo;
    int              kv_type;
    const char      *indexes;  /* the kinds to store ("" for none)          */
} pf_args;

/* What one prefill holds (pf_free releases it). */
typedef struct pf_state {
    const pf_args *a;
    char           path[4096];
    sparq_model   *m;
    sparq_context *c;
    char          *text;
    int32_t       *ids;       /* the context's tokens [n]                  */
    int            n;
    int64_t        resumed;   /* tokens a --resume found already done      */
    sparq_context_params cp;
    prefill_watch  watch;
} pf_state;

/* Parses the options and checks what would only fail after the long
 * prefill. Returns -1 to go on, else the exit status. */
static int pf_parse(int argc, char **argv, pf_args *a)
{
    memset(a, 0, sizeof *a);
    attn_opts_init(&a->ao);
    cli_opt attn_table[64]; /* cli_attn_table without its --index (topk's kind) */
    size_t n_attn = 0;
    for (const cli_opt *o = cli_attn_table; o->name && n_attn + 1 < sizeof attn_table / sizeof *attn_table; o++)
        if (strcmp(o->name, "--index") != 0) attn_table[n_attn++] = *o;
    memset(&attn_table[n_attn], 0, sizeof attn_table[n_attn]);
    cli_group groups[] = {
        { "prefill", prefill_table, &a->po },
        { "model", cli_model_table, &a->mo },
        { "attention", attn_table, &a->ao },
        { "prefill attention", cli_prefill_table, &a->pfo },
    };
    char err[512];
    const int parsed = cli_parse_command(groups, 4, argc, argv,
                                         "usage: sparq prefill [-m MODEL] (-f FILE | -p TEXT) --save-kv OUT [--index LIST]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    if (!a->po.save) {
        fprintf(stderr, "error: --save-kv FILE is required\n");
        return 2;
    }
    if (!!a->po.prompt + !!a->po.prompt_file != 1) {
        fprintf(stderr, "error: give the context with exactly one of -f FILE and -p TEXT\n");
        return 2;
    }
    if ((a->kv_type = cli_model_kv_type(&a->mo, err, sizeof err)) < 0) { /* --kv-type, -ctk, -ctv */
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    /* what would only fail after the long prefill is checked before it */
    if (cli_kv_output(a->po.index, a->po.save, &a->indexes)) return 2;
    return -1;
}

/* The model and the context's tokens. 0, or -1 with the error printed. */
static int pf_load(pf_state *st)
{
    const prefill_opts *po = &st->a->po;
    st->m = cli_load_model(&st->a->mo, st->path, sizeof st->path);
    if (!st->m) return -1;
    size_t len = 0;
    if (po->prompt_file) {
        st->text = text_read_file(po->prompt_file, &len);
        if (!st->text) {
            fprintf(stderr, "error: cannot read context file '%s'\n", po->prompt_file);
            return -1;
        }
    } else {
        st->text = strdup(po->prompt);
        len = strlen(st->text);
    }
    const int n = sparq_tokenize(st->m, st->text, (int)len, 1, NULL, 0);
    if (n <= 0 || !(st->ids = malloc((size_t)n * sizeof *st->ids)) ||
        sparq_tokenize(st->m, st->text, (int)len, 1, st->ids, n) != n) {
        fprintf(stderr, "error: cannot tokenize the context\n");
        return -1;
    }
    st->n = n;
    return 0;
}

/* The context's parameters (progress and the peak of private memory
 * watched, Ctrl-C stops between batches) and the context, built in the
 * output file itself: no copy at the end, and private memory does not
 * grow with the context. With --resume, a partial file continues. 0, or
 * -1 with the error printed. */
static int pf_context(pf_state *st)
{
    const pf_args *a = st->a;
    sparq_context_params *cp = &st->cp;
    char err[512];
    *cp = sparq_context_default_params();
    cp->n_ctx = a->mo.n_ctx > 0 ? a->mo.n_ctx : sparq_model_n_ctx_train(st->m);
    cp->n_threads = a->mo.n_threads;
    cp->n_batch = a->mo.n_batch;
    cp->kv_type = a->kv_type;
    if (cli_prefill_params(&a->pfo, &cp->prefill, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    if (st->n >= cp->n_ctx) {
        fprintf(stderr, "error: the context has %d tokens but the cache holds %lld (-c); leave room for "
                        "the question and the answer\n", st->n, (long long)cp->n_ctx);
        return -1;
    }
    if (attn_opts_params(&a->ao, cp->n_ctx, sparq_model_head_dim(st->m), &cp->attn, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    st->watch.peak_anon = cli_rss_anon();
    cli_progress_start(&st->watch.prog);
    st->watch.print = st->watch.prog.tty || a->po.progress;
    cp->progress = prefill_watch_cb;
    cp->progress_user = &st->watch;
    cp->abort_flag = &interrupted;
    const char *save = a->po.save;
    if (a->po.resume) {
        const int r = sparq_context_create_in_file(st->m, cp, save, st->ids, st->n, a->indexes,
                                                   SPARQ_IN_FILE_KEEP | SPARQ_IN_FILE_RESUME, &st->c, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "error: %s\n", err);
            return -1;
        }
        if (r > 0) {
            fprintf(stderr, "resume: %s; starting afresh\n", err);
        } else {
            st->resumed = sparq_context_pos(st->c);
            fprintf(stderr, "resume: %lld of %d tokens already in '%s.tmp'\n", (long long)st->resumed, st->n, save);
        }
    }
    if (!st->c && sparq_context_create_in_file(st->m, cp, save, st->ids, st->n, a->indexes, SPARQ_IN_FILE_KEEP,
                                               &st->c, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    return 0;
}

/* The prefill of what is not in the file yet. 0 (*t_prefill its
 * seconds), 130 after a Ctrl-C (the partial file kept), 1 on an error. */
static int pf_eval(pf_state *st, double *t_prefill)
{
    cli_progress *const prog = &st->watch.prog;
    signal(SIGINT, on_sigint);
    cli_progress_start(prog);
    const double t0 = cli_now();
    if (st->resumed < st->n && sparq_eval(st->c, st->ids + st->resumed, (int)(st->n - st->resumed), NULL)) {
        if (interrupted) { /* Ctrl-C: the eval stopped between batches; the partial file stays */
            const double t = cli_now() - t0;
            const int64_t done_pos = sparq_context_pos(st->c);
            fprintf(stderr, "%sinterrupted: prefill stopped after %lld of %d tokens (%.1f tok/s, %.0f ms); "
                            "'%s.tmp' holds them: the same command with --resume continues\n",
                    prog->tty ? "\n" : "", (long long)done_pos, st->n,
                    t > 0 ? (done_pos - st->resumed) / t : 0.0, t * 1e3, st->a->po.save);
            return 130;
        }
        fprintf(stderr, "error: %s\n", sparq_context_error(st->c));
        return 1;
    }
    *t_prefill = cli_now() - t0;
    return 0;
}

/* The --json object. */
static void pf_print_json(const pf_state *st, double t_prefill, double t_save, int64_t bytes, int64_t disk)
{
    const pf_args *a = st->a;
    printf("{\"model\":");
    cli_json_str(stdout, st->path, strlen(st->path));
    printf(",\"file\":");
    cli_json_str(stdout, a->po.save, strlen(a->po.save));
    printf(",\"tokens\":%d,\"n_ctx\":%lld,\"indexes\":", st->n, (long long)st->cp.n_ctx);
    cli_json_str(stdout, a->indexes, strlen(a->indexes));
    printf(",\"prefill_s\":%.4f,\"save_s\":%.4f,\"file_bytes\":%lld,\"disk_bytes\":%lld,"
           "\"peak_rss_bytes\":%lld,\"peak_private_bytes\":%lld,\"prefill_attn\":",
           t_prefill, t_save, (long long)bytes, (long long)disk, (long long)cli_peak_rss(),
           (long long)st->watch.peak_anon);
    const char *mode = sparq_prefill_mode_name(st->cp.prefill.mode);
    cli_json_str(stdout, mode, strlen(mode));
    printf(",\"kv_type\":");
    const char *kv = a->mo.kv_type ? a->mo.kv_type : "f16";
    cli_json_str(stdout, kv, strlen(kv));
    printf("}\n");
}

/* Saves the file with its indexes and reports (stderr; --json on
 * stdout). 0, or 1 with the error printed. */
static int pf_save(pf_state *st, double t_prefill)
{
    const pf_args *a = st->a;
    const char *save = a->po.save;
    char err[512];
    const int64_t done_n = st->n - st->resumed;
    fprintf(stderr, "prefill: %lld tokens in %.2f s (%.1f tok/s)%s; saving with indexes [%s]\n",
            (long long)done_n, t_prefill, done_n / (t_prefill > 0 ? t_prefill : 1e-9),
            st->resumed ? " after the resumed ones" : "", a->indexes);
    const double t0 = cli_now();
    if (sparq_context_save_kv(st->c, save, a->indexes, st->ids, st->n, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    const double t_save = cli_now() - t0;
    struct stat sb;
    const int64_t bytes = stat(save, &sb) == 0 ? (int64_t)sb.st_size : -1;
    const int64_t disk = stat(save, &sb) == 0 ? (int64_t)sb.st_blocks * 512 : -1;
    const int64_t anon = cli_rss_anon();
    if (anon > st->watch.peak_anon) st->watch.peak_anon = anon;
    fprintf(stderr, "saved %s: %lld positions of %lld, %.1f MiB (%.1f MiB on disk) in %.2f s | peak RSS %.1f MiB, "
                    "peak private %.1f MiB\n",
            save, (long long)st->n, (long long)st->cp.n_ctx, bytes / 1048576.0, disk / 1048576.0, t_save,
            cli_peak_rss() / 1048576.0, st->watch.peak_anon / 1048576.0);
    if (a->mo.json) pf_print_json(st, t_prefill, t_save, bytes, disk);
    return 0;
}

int cli_prefill(int argc, char **argv)
{
    pf_args a;
    const int parsed = pf_parse(argc, argv, &a);
    if (parsed >= 0) return parsed;
    pf_state st;
    memset(&st, 0, sizeof st);
    st.a = &a;
    int rc = 1;
    double t_prefill = 0;
    if (pf_load(&st) == 0 && pf_context(&st) == 0 && (rc = pf_eval(&st, &t_prefill)) == 0)
        rc = pf_save(&st, t_prefill);
    free(st.ids);
    free(st.text);
    sparq_context_free(st.c);
    sparq_model_free(st.m);
    return rc;
}
