/* cli_run.c - `sparq run`: prompt in, continuation out.
 *
 * stdout carries only the generated text (or one JSON object with --json);
 * timings, progress and errors go to stderr.
 */
#include "cli.h"
#include "textbuf.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct run_opts {
    const char *prompt;        /* -p */
    const char *prompt_file;   /* -f */
    const char *prompt_tokens; /* --prompt-tokens 1,2,3 */
    int         n_predict;     /* -n */
    float       temp;
    int         top_k;
    float       top_p;
    uint64_t    seed;
    const char *logits_out;
    int         ignore_eos;
    int         chat;          /* --chat / -cnv */
    const char *chat_template;
    const char *system;
    const char *load_kv;       /* --load-kv FILE */
    int         verify_kv;     /* --verify-kv */
} run_opts;

#define OFF(f) offsetof(run_opts, f)
static const cli_opt run_table[] = {
    { "-p", "--prompt", OPT_STR, OFF(prompt), "TEXT", "prompt text" },
    { "-f", "--file", OPT_STR, OFF(prompt_file), "FILE", "read the prompt from FILE" },
    { "--prompt-tokens", NULL, OPT_STR, OFF(prompt_tokens), "ID,ID,...", "prompt as token ids (no BOS added)" },
    { "-n", "--n-predict", OPT_INT, OFF(n_predict), "N", "tokens to generate (default 128; 0: only evaluate the prompt)" },
    { "--temp", NULL, OPT_FLOAT, OFF(temp), "T", "temperature (0 = greedy; default 0.8)" },
    { "--top-k", NULL, OPT_INT, OFF(top_k), "K", "top-k sampling (0 = off; default 40)" },
    { "--top-p", NULL, OPT_FLOAT, OFF(top_p), "P", "top-p sampling (1 = off; default 0.95)" },
    { "--seed", NULL, OPT_U64, OFF(seed), "N", "sampling seed (default 42)" },
    { "--logits-out", NULL, OPT_STR, OFF(logits_out), "FILE",
      "write float32 logits [n_rows][n_vocab] of every prompt position and generation step" },
    { "--ignore-eos", NULL, OPT_FLAG, OFF(ignore_eos), NULL, "do not stop at end-of-generation tokens" },
    { "--chat", "-cnv", OPT_FLAG, OFF(chat), NULL,
      "treat the prompt as a user message in the model's chat format" },
    { "--chat-template", NULL, OPT_STR, OFF(chat_template), "NAME",
      "llama3 | chatml | mistral | gemma (default: from the model)" },
    { "--system", NULL, OPT_STR, OFF(system), "TEXT", "system message for --chat" },
    { "--load-kv", NULL, OPT_STR, OFF(load_kv), "FILE",
      "start from a saved KV cache (sparq prefill --save-kv); the prompt continues it" },
    { "--verify-kv", NULL, OPT_FLAG, OFF(verify_kv), NULL,
      "check the data checksums of --load-kv even when the file is over 1 GiB" },
    { 0 },
};
#undef OFF

/* The one piece of global state: set by the SIGINT handler. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }


/* Parses "1,2,3" into a malloc'ed array; returns count or -1. */
static int parse_ids(const char *s, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) { free(ids); return -1; }
        if (n == cap) {
            int32_t *bigger = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!bigger) { free(ids); return -1; }
            ids = bigger;
        }
        ids[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    *out = ids;
    return n;
}

static int write_rows(FILE *f, const float *rows, size_t n_rows, int n_vocab)
{
    return fwrite(rows, sizeof(float) * (size_t)n_vocab, n_rows, f) == n_rows ? 0 : -1;
}

int cli_run(int argc, char **argv)
{
    cli_model_opts mo = { 0 };
    cli_attn_opts ao;
    cli_attn_opts_init(&ao);
    run_opts ro = { 0 };
    ro.n_predict = 128;
    ro.temp = 0.8f;
    ro.top_k = 40;
    ro.top_p = 0.95f;
    ro.seed = 42;
    cli_group groups[] = {
        { "generation", run_table, &ro },
        { "model", cli_model_table, &mo },
        { "attention", cli_attn_table, &ao },
    };
    const int n_groups = 3;
    char err[512], path[4096];
    char *pos[1];
    int n_pos, help;
    if (cli_parse(groups, n_groups, argc, argv, pos, 0, &n_pos, &help, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (help) {
        cli_print_help(stdout, "usage: sparq run [-m MODEL] (-p TEXT | -f FILE | --prompt-tokens IDS) [options]",
                       groups, n_groups);
        return 0;
    }
    int kv_type = cli_kv_type(mo.kv_type);
    if (kv_type < 0) {
        fprintf(stderr, "error: --kv-type must be f16 or f32, not '%s'\n", mo.kv_type);
        return 2;
    }
    if (!!ro.prompt + !!ro.prompt_file + !!ro.prompt_tokens > 1) {
        fprintf(stderr, "error: give only one of -p, -f and --prompt-tokens\n");
        return 2;
    }
    if (ro.n_predict < 0) {
        fprintf(stderr, "error: -n must be >= 0\n");
        return 2;
    }

    int rc = 1;
    sparq_model *m = NULL;
    sparq_context *c = NULL;
    sparq_sampler *smp = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    FILE *lf = NULL;
    text_buf out = { 0 };
    int32_t *gen = NULL;

    m = cli_load_model(&mo, path, sizeof path);
    if (!m) goto done;
    const int n_vocab = sparq_model_n_vocab(m);

    /* the prompt, as token ids */
    int n_prompt;
    if (ro.prompt_tokens) {
        n_prompt = parse_ids(ro.prompt_tokens, &ids);
        if (n_prompt <= 0) {
            fprintf(stderr, "error: --prompt-tokens must be comma-separated token ids\n");
            goto done;
        }
    } else {
        size_t len = 0;
        if (ro.prompt_file) {
            text = text_read_file(ro.prompt_file, &len);
            if (!text) {
                fprintf(stderr, "error: cannot read prompt file '%s'\n", ro.prompt_file);
                goto done;
            }
        } else {
            text = strdup(ro.prompt ? ro.prompt : "");
            len = strlen(text);
        }
        if (ro.chat || ro.chat_template) {
            sparq_chat_msg msgs[2] = { { "system", ro.system }, { "user", text } };
            const sparq_chat_msg *first = ro.system ? msgs : msgs + 1;
            int n_msgs = ro.system ? 2 : 1;
            n_prompt = sparq_chat_tokenize(m, ro.chat_template, first, n_msgs, 1, NULL, 0, err, sizeof err);
            if (n_prompt < 0) {
                fprintf(stderr, "error: %s\n", err);
                goto done;
            }
            if (!(ids = malloc((size_t)(n_prompt + 1) * sizeof *ids)) ||
                sparq_chat_tokenize(m, ro.chat_template, first, n_msgs, 1, ids, n_prompt, err, sizeof err) != n_prompt) {
                fprintf(stderr, "error: cannot tokenize the chat prompt\n");
                goto done;
            }
        } else {
            const int bos = ro.load_kv ? 0 : 1; /* a loaded cache already began the sequence */
            n_prompt = sparq_tokenize(m, text, (int)len, bos, NULL, 0);
            if (n_prompt < 0 || !(ids = malloc((size_t)(n_prompt + 1) * sizeof *ids)) ||
                sparq_tokenize(m, text, (int)len, bos, ids, n_prompt) != n_prompt) {
                fprintf(stderr, "error: cannot tokenize the prompt\n");
                goto done;
            }
        }
    }
    if (n_prompt == 0) {
        fprintf(stderr, "error: the prompt is empty and the model adds no BOS token\n");
        goto done;
    }
    for (int i = 0; i < n_prompt; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            fprintf(stderr, "error: prompt token %d is outside the vocabulary [0, %d)\n", ids[i], n_vocab);
            goto done;
        }

    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = mo.n_ctx > 0 ? mo.n_ctx : ro.load_kv ? 0 : sparq_model_n_ctx_train(m);
    cp.n_threads = mo.n_threads;
    cp.n_batch = mo.n_batch;
    cp.kv_type = kv_type;
    if (!ro.load_kv && n_prompt > cp.n_ctx) {
        fprintf(stderr, "error: the prompt has %d tokens but the context holds %lld (-c)\n", n_prompt,
                (long long)cp.n_ctx);
        goto done;
    }
    if (cli_attn_params(&ao, cp.n_ctx > 0 ? cp.n_ctx : sparq_model_n_ctx_train(m), sparq_model_head_dim(m),
                        &cp.attn, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (isatty(2)) cp.progress = cli_prefill_progress;
    cp.abort_flag = &interrupted;
    if (ro.load_kv) {
        double tl = cli_now();
        if (sparq_context_load_kv(m, &cp, ro.load_kv, ro.verify_kv ? SPARQ_VERIFY_ALWAYS : SPARQ_VERIFY_AUTO,
                                  &c, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            goto done;
        }
        fprintf(stderr, "loaded %s: %lld cached positions, capacity %lld (%.2f s)\n", ro.load_kv,
                (long long)sparq_context_pos(c), (long long)sparq_context_n_ctx(c), cli_now() - tl);
        if (sparq_context_pos(c) + n_prompt > sparq_context_n_ctx(c)) {
            fprintf(stderr, "error: the prompt has %d tokens but the loaded cache has room for %lld more\n",
                    n_prompt, (long long)(sparq_context_n_ctx(c) - sparq_context_pos(c)));
            goto done;
        }
    } else if (sparq_context_create(m, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    sparq_sampler_params sp = { ro.temp, ro.top_k, ro.top_p, ro.seed };
    smp = sparq_sampler_create(&sp, n_vocab);
    logits = malloc((size_t)n_prompt * n_vocab * sizeof(float));
    gen = malloc(((size_t)ro.n_predict + 1) * sizeof *gen);
    if (!smp || !logits || !gen) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    if (ro.logits_out && !(lf = fopen(ro.logits_out, "wb"))) {
        fprintf(stderr, "error: cannot write '%s'\n", ro.logits_out);
        goto done;
    }
    signal(SIGINT, on_sigint);

    /* prefill */
    double t0 = cli_now();
    int ok = lf ? sparq_eval_all(c, ids, n_prompt, logits) : sparq_eval(c, ids, n_prompt, logits);
    double t_prefill = cli_now() - t0;
    if (ok != 0) {
        fprintf(stderr, "error: %s\n", sparq_context_error(c));
        goto done;
    }
    const float *last = lf ? logits + (size_t)(n_prompt - 1) * n_vocab : logits;
    if (lf && write_rows(lf, logits, (size_t)n_prompt, n_vocab)) {
        fprintf(stderr, "error: writing '%s' failed\n", ro.logits_out);
        goto done;
    }
    if (lf) memmove(logits, last, (size_t)n_vocab * sizeof(float));

    /* decode */
    int n_gen = 0;
    const char *stop = NULL;
    double t1 = cli_now();
    char piece[256];
    while (n_gen < ro.n_predict) {
        if (interrupted) { stop = "interrupted"; break; }
        if (sparq_context_pos(c) >= sparq_context_n_ctx(c)) { stop = "context full"; break; }
        int32_t id = sparq_sample(smp, logits);
        gen[n_gen++] = id;
        if (!ro.ignore_eos && sparq_token_is_eog(m, id)) { stop = "end of generation"; break; }
        int len = sparq_token_to_piece(m, id, piece, sizeof piece);
        if (len > (int)sizeof piece) len = sizeof piece;
        if (len > 0) {
            if (text_append(&out, piece, (size_t)len)) { fprintf(stderr, "error: out of memory\n"); goto done; }
            if (!mo.json) { fwrite(piece, 1, (size_t)len, stdout); fflush(stdout); }
        }
        if (n_gen == ro.n_predict) break; /* the last token needs no forward pass */
        if (sparq_context_pos(c) >= sparq_context_n_ctx(c)) { stop = "context full"; break; }
        if (sparq_eval(c, &id, 1, logits)) {
            fprintf(stderr, "\nerror: %s\n", sparq_context_error(c));
            goto done;
        }
        if (lf && write_rows(lf, logits, 1, n_vocab)) {
            fprintf(stderr, "error: writing '%s' failed\n", ro.logits_out);
            goto done;
        }
    }
    double t_decode = cli_now() - t1;
    int n_decoded = n_gen > 0 ? n_gen - 1 : 0; /* forward passes in the decode loop */
    if (!mo.json) fputc('\n', stdout);

    sparq_attn_stats st;
    sparq_context_attn_stats(c, &st);
    double prefill_tps = t_prefill > 0 ? n_prompt / t_prefill : 0;
    double decode_tps = t_decode > 0 && n_decoded > 0 ? n_decoded / t_decode : 0;
    int64_t rss = cli_peak_rss();
    double ratio = st.dense_elements > 0 ? (double)st.elements / (double)st.dense_elements : 1.0;
    if (stop) fprintf(stderr, "stopped: %s\n", stop);
    fprintf(stderr, "prompt %d tokens, prefill %.1f tok/s | generated %d tokens, decode %.2f tok/s | peak RSS %.1f MiB\n",
            n_prompt, prefill_tps, n_gen, decode_tps, rss / 1048576.0);
    fprintf(stderr, "attention %s: %lld elements read+written over %lld decode steps, %.4f of dense\n",
            cp.attn.policy ? cp.attn.policy : "dense", (long long)st.elements, (long long)st.steps, ratio);
    if (st.recall_total > 0)
        fprintf(stderr, "topk: recall@k vs exact top-k %.4f (%lld / %lld), index build/load %.2f s\n",
                (double)st.recall_hits / (double)st.recall_total, (long long)st.recall_hits,
                (long long)st.recall_total, st.index_seconds);

    if (mo.json) {
        printf("{\"model\":");
        cli_json_str(stdout, path, strlen(path));
        printf(",\"prompt_tokens\":[");
        for (int i = 0; i < n_prompt; i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("],\"tokens\":[");
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
        printf("],\"text\":");
        cli_json_str(stdout, out.data ? out.data : "", out.len);
        printf(",\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"peak_rss_bytes\":%lld",
               prefill_tps, decode_tps, (long long)rss);
        printf(",\"attn\":{\"policy\":\"%s\",\"elements\":%lld,\"dense_elements\":%lld,"
               "\"formula_elements\":%lld,\"ratio\":%.6f,\"r\":%d,\"k\":%d,\"l\":%d}",
               cp.attn.policy ? cp.attn.policy : "dense", (long long)st.elements,
               (long long)st.dense_elements, (long long)st.formula_elements, ratio,
               cp.attn.r, cp.attn.k, cp.attn.l);
        if (st.recall_total > 0)
            printf(",\"recall_at_k\":%.6f,\"recall_hits\":%lld,\"recall_total\":%lld",
                   (double)st.recall_hits / (double)st.recall_total, (long long)st.recall_hits,
                   (long long)st.recall_total);
        printf(",\"index_s\":%.4f", st.index_seconds);
        printf(",\"stop\":");
        const char *why = stop ? stop : "n_predict";
        cli_json_str(stdout, why, strlen(why));
        printf("}\n");
    }
    rc = interrupted ? 130 : 0;
done:
    if (lf && fclose(lf) != 0 && rc == 0) {
        fprintf(stderr, "error: writing '%s' failed\n", ro.logits_out);
        rc = 1;
    }
    free(out.data);
    free(gen);
    free(logits);
    free(ids);
    free(text);
    sparq_sampler_free(smp);
    sparq_context_free(c);
    sparq_model_free(m);
    return rc;
}
