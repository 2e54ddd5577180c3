/* test_cli_chat.c - `sparq gen-model` for the qwen2 / qwen3 architectures,
 * and `sparq run --chat` as an interactive multi-turn session. Runs the
 * binary from $SPARQ_BUILD (default build/) on tiny models it generates in
 * /tmp.
 *
 * gen-model: the files load through the public API with the architecture
 * and hyper-parameters of their shape, and their logits equal the naive
 * double-precision forward pass of tests/naive_forward.h (Q/K/V biases,
 * per-head q/k RMSNorm, NEOX RoPE, GQA, tied output). A copy with the biases
 * zeroed (qwen2) or the q/k norms set to one (qwen3) has a reference far
 * from those logits, and sparq follows it to that reference: the extra
 * tensors are read and used. Q8_0 files of the same seed stay close to F32.
 *
 * chat: user turns on stdin, one per line. Each reply must equal a single-
 * shot run (--prompt-tokens) on the whole conversation so far, written here
 * as ChatML token ids by hand - reusing the KV cache across turns must be
 * the same as prefilling everything again - and the second turn must
 * evaluate only its new tokens.
 */
#include "test.h"
#include "tensor/gguf.h"
#include "naive_forward.h"
#include "sparq.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char bin[1024];

/* ---- running the binary --------------------------------------------------- */

static char out_path[64], err_path[64], in_path[64];

static int make_temp(char *path, size_t size, const char *stem)
{
    snprintf(path, size, "/tmp/%s_XXXXXX", stem);
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

/* Runs `sparq ARGS` with stdin from `input` (NULL: /dev/null); captures
 * stdout and stderr (caller frees) and returns the exit code. */
static int run(const char *args, const char *input, char **out, char **err)
{
    char cmd[8192];
    if (input) {
        FILE *f = fopen(in_path, "wb");
        if (f) { fputs(input, f); fclose(f); }
    }
    snprintf(cmd, sizeof cmd, "%s %s <%s >%s 2>%s", bin, args, input ? in_path : "/dev/null", out_path, err_path);
    int st = system(cmd);
    size_t n;
    *out = test_read_file(out_path, &n);
    *err = test_read_file(err_path, &n);
    if (!*out) *out = calloc(1, 1);
    if (!*err) *err = calloc(1, 1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The ids of the "tokens":[...] array of run --json output; returns count. */
static int json_ids(const char *json, const char *key, int32_t *ids, int max)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":[", key);
    const char *s = strstr(json, pat);
    if (!s) return -1;
    s += strlen(pat);
    int n = 0;
    while (*s && *s != ']') {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) return -1;
        if (n < max) ids[n] = (int32_t)v;
        n++;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* ---- gen-model ------------------------------------------------------------- */

/* What a patched copy changes: qwen2's biases zeroed, or qwen3's q/k norm
 * weights set to one (tests/naive_forward.h is the reference for both). */
enum { PATCH_ZERO_BIAS = 1, PATCH_UNIT_QK_NORM = 2 };

typedef struct shape_case {
    const char *shape, *arch;
    int n_head, n_kv, hd, n_vocab;
    int patch_flag;         /* what the patched copy changes */
} shape_case;

static const shape_case shape_cases[] = {
    { "tiny-qwen2", "qwen2", 4, 2, 64, 1024, PATCH_ZERO_BIAS },
    { "tiny-qwen3", "qwen3", 8, 4, 64, 1024, PATCH_UNIT_QK_NORM },
};

static int patch_tensor(const char *name, const gguf_tensor *t, float *d, void *user)
{
    const int flag = *(const int *)user;
    const int hit = flag == PATCH_ZERO_BIAS ? strstr(name, ".bias") != NULL
                                            : strstr(name, "attn_q_norm") || strstr(name, "attn_k_norm");
    if (!hit) return 0;
    for (int64_t j = 0; j < t->ne[0]; j++) d[j] = flag == PATCH_ZERO_BIAS ? 0.0f : 1.0f;
    return 1;
}

/* The naive forward's logits of tokens in the GGUF at path; NULL on failure. */
static float *naive_logits(const char *path, const int32_t *tokens, int n)
{
    nf_file nf;
    float *logits = NULL;
    if (!nf_file_open(&nf, path)) {
        logits = malloc((size_t)n * nf.r.n_vocab * sizeof *logits);
        if (logits && nf_forward(&nf.r, tokens, n, logits)) {
            free(logits);
            logits = NULL;
        }
    }
    nf_file_close(&nf);
    return logits;
}

static void test_gen_model_case(const shape_case *sc)
{
    char f32[64], q8[64], patched[64], args[512];
    char *out, *err;
    if (make_temp(f32, sizeof f32, "sparq_genm") || make_temp(q8, sizeof q8, "sparq_genm") ||
        make_temp(patched, sizeof patched, "sparq_genm")) {
        CHECK(0, "mkstemp");
        return;
    }
    snprintf(args, sizeof args, "gen-model --shape %s --type F32 --seed 7 -o %s", sc->shape, f32);
    int rc = run(args, NULL, &out, &err);
    CHECK(rc == 0 && strstr(err, sc->arch), "%s F32: exit %d: %s", sc->shape, rc, err);
    free(out); free(err);
    snprintf(args, sizeof args, "gen-model --shape %s --type Q8_0 --seed 7 -o %s", sc->shape, q8);
    rc = run(args, NULL, &out, &err);
    CHECK(rc == 0, "%s Q8_0: exit %d: %s", sc->shape, rc, err);
    free(out); free(err);

    /* what the public API reports */
    const char *files[2] = { f32, q8 };
    int32_t toks[7];
    int n_tok = 0;
    for (int fi = 0; fi < 2; fi++) {
        sparq_model *m = NULL;
        char msg[512];
        if (sparq_model_load(files[fi], &m, msg, sizeof msg)) {
            CHECK(0, "%s: %s", files[fi], msg);
            continue;
        }
        CHECK(strcmp(sparq_model_arch(m), sc->arch) == 0, "arch %s", sparq_model_arch(m));
        CHECK(sparq_model_n_layer(m) == 2 && sparq_model_n_head(m) == sc->n_head &&
              sparq_model_n_kv_head(m) == sc->n_kv && sparq_model_head_dim(m) == sc->hd &&
              sparq_model_n_vocab(m) == sc->n_vocab && sparq_model_n_ctx_train(m) == 4096,
              "%s hparams: layers %d heads %d/%d hd %d vocab %d ctx %lld", sc->shape, sparq_model_n_layer(m),
              sparq_model_n_head(m), sparq_model_n_kv_head(m), sparq_model_head_dim(m), sparq_model_n_vocab(m),
              (long long)sparq_model_n_ctx_train(m));
        /* Qwen's vocabulary layout: ... <|endoftext|> <|im_start|> <|im_end|> */
        const int V = sc->n_vocab;
        CHECK(sparq_token_bos(m) == V - 3 && sparq_token_eos(m) == V - 1 && sparq_token_is_eog(m, V - 1) &&
              !sparq_token_is_eog(m, V - 2), "specials: bos %d eos %d", sparq_token_bos(m), sparq_token_eos(m));
        const char *text = "hello world, the quick brown fox";
        int n = sparq_tokenize(m, text, -1, 1, toks, 7);
        CHECK(n > 7 && toks[0] != V - 3, "BPE text: %d ids, no BOS (add_bos false), first %d", n, toks[0]);
        int32_t all[64];
        n = sparq_tokenize(m, text, -1, 1, all, 64);
        char back[256] = "";
        size_t len = 0;
        for (int i = 0; i < n && n <= 64; i++) {
            int l = sparq_token_to_piece(m, all[i], back + len, (int)(sizeof back - 1 - len));
            if (l > 0) len += (size_t)l;
        }
        back[len] = 0;
        CHECK(strcmp(back, text) == 0, "round trip '%s'", back);
        sparq_chat_msg msg1 = { "user", "hi" };
        int32_t cids[16];
        int nc = sparq_chat_tokenize(m, NULL, &msg1, 1, 1, cids, 16, msg, sizeof msg);
        CHECK(nc > 4 && cids[0] == V - 2, "template read from the file (ChatML): %d ids, first %d", nc,
              nc > 0 ? cids[0] : -1);
        n_tok = 7;
        sparq_model_free(m);
    }
    if (n_tok != 7) goto cleanup;
    toks[3] = sc->n_vocab - 2; /* a special token in the middle too */

    /* logits against the reference, and a patched copy against the
     * reference of the patched copy */
    int flag = sc->patch_flag;
    const int changed = nf_edit_copy(f32, patched, patch_tensor, &flag);
    CHECK(changed == (flag == PATCH_ZERO_BIAS ? 6 : 4), "patched %d tensors", changed);
    const size_t nl = (size_t)n_tok * sc->n_vocab;
    float *ref = naive_logits(f32, toks, n_tok), *ref_p = changed > 0 ? naive_logits(patched, toks, n_tok) : NULL;
    float *got = nf_engine_logits(f32, toks, n_tok, 64, 0, NULL), *got_q8 = nf_engine_logits(q8, toks, n_tok, 64, 0, NULL);
    if (ref && ref_p && got && got_q8) {
        double d = nf_max_diff(got, ref, nl), scale = nf_rms(ref, NULL, nl);
        CHECK(d < 1e-4, "%s F32 logits vs naive forward: max |diff| %.3g (logit rms %.3g)", sc->shape, d, scale);
        double dp = nf_max_diff(ref_p, ref, nl);
        CHECK(dp > 0.05, "%s: the %s must matter (%.3g)", sc->shape,
              flag == PATCH_ZERO_BIAS ? "biases" : "q/k norms", dp);
        int all_finite = 1;
        for (size_t i = 0; i < nl; i++) all_finite &= isfinite(got_q8[i]);
        double dq = nf_rms(got_q8, got, nl);
        CHECK(all_finite && dq < 0.1 * scale, "%s Q8_0 vs F32: rms diff %.3g, logit rms %.3g", sc->shape, dq,
              scale);
        float *got_p = nf_engine_logits(patched, toks, n_tok, 64, 0, NULL);
        if (got_p) {
            double e = nf_max_diff(got_p, ref_p, nl);
            CHECK(e < 1e-4, "%s patched file vs patched reference: %.3g", sc->shape, e);
            CHECK(nf_max_diff(got_p, got, nl) > 0.05, "%s: patching moved sparq's logits", sc->shape);
        }
        free(got_p);
    } else {
        CHECK(0, "%s: reference or sparq forward failed", sc->shape);
    }
    free(ref); free(ref_p); free(got); free(got_q8);
cleanup:
    unlink(f32);
    unlink(q8);
    unlink(patched);
}

static void test_gen_model(void)
{
    for (size_t i = 0; i < sizeof shape_cases / sizeof shape_cases[0]; i++) test_gen_model_case(&shape_cases[i]);
    char *out, *err;
    int rc = run("gen-model --shape qwen9 -o /tmp/sparq_never.gguf", NULL, &out, &err);
    CHECK(rc == 2 && strstr(err, "qwen2.5-0.5b") && strstr(err, "qwen3-0.6b") && strstr(err, "tiny-qwen3"),
          "unknown shape: exit %d: %s", rc, err);
    CHECK(access("/tmp/sparq_never.gguf", F_OK) != 0, "no file written");
    free(out); free(err);
}

/* ---- interactive chat -------------------------------------------------------- */

typedef struct ids_buf { int32_t v[512]; int n; } ids_buf;

static void push_id(ids_buf *b, int32_t id) { if (b->n < 512) b->v[b->n++] = id; }

static void push_text(ids_buf *b, const sparq_model *m, const char *s)
{
    int n = sparq_tokenize(m, s, -1, 0, b->v + b->n, 512 - b->n);
    if (n > 0) b->n += n < 512 - b->n ? n : 512 - b->n;
}

/* ChatML, written out: <|im_start|>ROLE\nCONTENT<|im_end|>\n */
static void push_msg(ids_buf *b, const sparq_model *m, const char *role, const char *content)
{
    const int V = sparq_model_n_vocab(m);
    char text[512];
    snprintf(text, sizeof text, "%s\n%s", role, content);
    push_id(b, V - 2);
    push_text(b, m, text);
    push_id(b, V - 1);
    push_text(b, m, "\n");
}

static void push_open(ids_buf *b, const sparq_model *m)
{
    push_id(b, sparq_model_n_vocab(m) - 2);
    push_text(b, m, "assistant\n");
}

/* Greedy single-shot reply to ids; returns its ids (EOG included) in r. */
static void single_shot(const char *model, const ids_buf *ids, ids_buf *r, const char *n_predict)
{
    char args[8192];
    int len = snprintf(args, sizeof args, "run -m %s -n %s --temp 0 -t 1 --json --prompt-tokens ", model, n_predict);
    for (int i = 0; i < ids->n && len < (int)sizeof args - 16; i++)
        len += snprintf(args + len, sizeof args - (size_t)len, "%s%d", i ? "," : "", ids->v[i]);
    char *out, *err;
    int rc = run(args, NULL, &out, &err);
    r->n = json_ids(out, "tokens", r->v, 512);
    CHECK(rc == 0 && r->n >= 1, "single-shot: exit %d, %d ids: %s", rc, r->n, err);
    if (r->n < 0) r->n = 0;
    free(out); free(err);
}

/* The reply's text as printed (an end-of-generation token prints nothing). */
static void reply_text(const sparq_model *m, const ids_buf *r, char *buf, size_t size)
{
    size_t len = 0;
    for (int i = 0; i < r->n && !sparq_token_is_eog(m, r->v[i]); i++) {
        int l = sparq_token_to_piece(m, r->v[i], buf + len, (int)(size - 1 - len));
        if (l > 0 && len + (size_t)l < size) len += (size_t)l;
    }
    buf[len] = 0;
}

static int turn_prefill(const char *err, int turn)
{
    char pat[32];
    snprintf(pat, sizeof pat, "turn %d: prefill ", turn);
    const char *s = strstr(err, pat);
    return s ? atoi(s + strlen(pat)) : -1;
}


/* ---- a child with pipes, for Ctrl-C (SIGINT) tests ---------------------------- */

typedef struct child {
    pid_t pid;
    int   in, out, err;          /* our ends                                  */
    char  obuf[1 << 16], ebuf[1 << 16];
    size_t olen, elen;
    int   out_eof, err_eof;
} child;

static int spawn(child *ch, char *const argv[])
{
    int pi[2], po[2], pe[2];
    if (pipe(pi) || pipe(po) || pipe(pe)) return -1;
    memset(ch, 0, sizeof *ch);
    ch->pid = fork();
    if (ch->pid < 0) return -1;
    if (ch->pid == 0) {
        dup2(pi[0], 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(pi[1]); close(po[0]); close(pe[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pi[0]); close(po[1]); close(pe[1]);
    ch->in = pi[1];
    ch->out = po[0];
    ch->err = pe[0];
    return 0;
}

/* Reads what is there (stderr only if read_err) for up to ms; keeps the
 * last 64 KiB of each stream. Returns once `want` appears in stderr (if
 * given), the streams end, or time runs out; 1 if `want` was seen. */
static int pump(child *ch, int ms, const char *want, int read_err)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (want && strstr(ch->ebuf, want)) return 1;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int left = ms - (int)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0 || (ch->out_eof && (ch->err_eof || !read_err))) return want ? strstr(ch->ebuf, want) != NULL : 0;
        struct pollfd p[2] = { { ch->out_eof ? -1 : ch->out, POLLIN, 0 },
                               { ch->err_eof || !read_err ? -1 : ch->err, POLLIN, 0 } };
        if (poll(p, 2, left) <= 0) continue;
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
            char *buf = i ? ch->ebuf : ch->obuf;
            size_t *len = i ? &ch->elen : &ch->olen;
            char tmp[4096];
            ssize_t n = read(i ? ch->err : ch->out, tmp, sizeof tmp);
            if (n <= 0) { *(i ? &ch->err_eof : &ch->out_eof) = 1; continue; }
            if (*len + (size_t)n >= sizeof ch->obuf) { /* keep the tail */
                size_t drop = *len + (size_t)n - sizeof ch->obuf / 2;
                if (drop > *len) drop = *len;
                memmove(buf, buf + drop, *len - drop);
                *len -= drop;
            }
            memcpy(buf + *len, tmp, (size_t)n);
            *len += (size_t)n;
            buf[*len] = 0;
        }
    }
}

/* Waits for the child (killing it after ms); its exit code, or 128+sig. */
static int reap(child *ch, int ms)
{
    close(ch->in);
    pump(ch, ms, NULL, 1);
    int st = 0;
    if (waitpid(ch->pid, &st, WNOHANG) == 0) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, &st, 0);
    }
    close(ch->out);
    close(ch->err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Ctrl-C in a prefill, during a reply and at the prompt; and a
 * chat longer than the context (context shift). */
static void test_interactive(const char *model, const sparq_model *m)
{
    char args[1024], *out, *err;
    /* six turns through a 96-position context: shifts instead of an error */
    const char *turns = "hello there\nwhat is the time\nand the weather\ntell me more\nwhy is that\nthank you\n";
    snprintf(args, sizeof args, "run -m %s --chat -c 96 -n 24 --temp 0 --ignore-eos --keep 4", model);
    int rc = run(args, turns, &out, &err);
    int n_turns = 0;
    for (const char *q = err; (q = strstr(q, "turn ")) != NULL; q++) n_turns += q[5] >= '1' && q[5] <= '9';
    CHECK(rc == 0 && strstr(err, "context shift: dropped") && n_turns >= 6 && strstr(err, "chat: 6 turns"),
          "chat with context shift: exit %d: %s", rc, err);
    free(out); free(err);
    snprintf(args, sizeof args, "run -m %s --chat -c 96 -n 24 --temp 0 --ignore-eos --no-context-shift", model);
    rc = run(args, turns, &out, &err);
    CHECK(rc == 1 && strstr(err, "positions but the context has"), "--no-context-shift: exit %d: %s", rc, err);
    free(out); free(err);

    /* Ctrl-C during a prefill: a clean line with the timings, exit 130. The
     * progress lines (--progress, one per batch of 1) outgrow the pipe, so
     * the child is certainly still prefilling when the signal comes. */
    char prompt_path[64];
    if (make_temp(prompt_path, sizeof prompt_path, "sparq_chat_prompt") == 0) {
        FILE *f = fopen(prompt_path, "wb");
        char text[32768] = "";
        while (strlen(text) < sizeof text - 64 &&
               sparq_tokenize(m, text, -1, 1, NULL, 0) < 3600)
            strcat(text, "hello world again ");
        if (f) { fputs(text, f); fclose(f); }
        char *argv[] = { bin, "run", "-m", (char *)model, "-f", prompt_path, "-c", "4096", "-b", "1", "-n", "4",
                         "-t", "1", "--progress", NULL };
        child ch;
        if (spawn(&ch, argv) == 0) {
            int seen = pump(&ch, 20000, "prefill: ", 1);
            kill(ch.pid, SIGINT);
            rc = reap(&ch, 20000);
            CHECK(seen && rc == 130 && strstr(ch.ebuf, "\ninterrupted: prefill stopped after") &&
                      strstr(ch.ebuf, "tok/s") && !strstr(ch.ebuf, "error"),
                  "Ctrl-C in prefill: exit %d, stderr tail: %s", rc, ch.elen > 300 ? ch.ebuf + ch.elen - 300 : ch.ebuf);
        }
        unlink(prompt_path);
    }

    /* chat: Ctrl-C in an endless reply returns to the prompt; two at the
     * prompt end the session with exit 0 and the timings */
    char *argv[] = { bin, "run", "-m", (char *)model, "--chat", "-n", "1000000", "--ignore-eos", "--temp", "0",
                     "-c", "256", "-t", "1", NULL };
    child ch;
    if (spawn(&ch, argv) == 0) {
        CHECK(write(ch.in, "hello there\n", 12) == 12, "write turn");
        int replying = 0;
        for (int i = 0; i < 200 && !replying; i++) { /* the reply has started */
            pump(&ch, 50, NULL, 1);
            replying = ch.olen > 20;
        }
        kill(ch.pid, SIGINT);
        int back = pump(&ch, 20000, "turn 1:", 1);
        kill(ch.pid, SIGINT);
        int cleared = pump(&ch, 20000, "^C", 1);
        /* still alive: a second turn is answered (then stopped again) */
        CHECK(write(ch.in, "and now\n", 8) == 8, "write turn 2");
        size_t before = ch.olen;
        for (int i = 0; i < 200 && ch.olen < before + 20; i++) pump(&ch, 50, NULL, 1);
        kill(ch.pid, SIGINT);
        int back2 = pump(&ch, 20000, "turn 2:", 1);
        kill(ch.pid, SIGINT);
        pump(&ch, 20000, "^C", 1);
        kill(ch.pid, SIGINT);
        rc = reap(&ch, 20000);
        CHECK(replying && back && cleared && back2 && rc == 0 && strstr(ch.ebuf, "stopped: interrupted") &&
                  strstr(ch.ebuf, "chat: 2 turns"),
              "Ctrl-C in chat: replying %d back %d cleared %d back2 %d exit %d: %s", replying, back, cleared, back2, rc,
              ch.ebuf);
    }
}

static void test_chat(void)
{
    char model[64], args[1024];
    char *out, *err;
    if (make_temp(model, sizeof model, "sparq_chatm")) {
        CHECK(0, "mkstemp");
        return;
    }
    /* seed 2: its replies vary enough that a conversation missing the
     * reply's closing gives another second reply (checked below) */
    snprintf(args, sizeof args, "gen-model --shape tiny-qwen3 --type F32 --seed 2 -o %s", model);
    int rc = run(args, NULL, &out, &err);
    free(out); free(err);
    sparq_model *m = NULL;
    char msg[512];
    if (rc != 0 || sparq_model_load(model, &m, msg, sizeof msg)) {
        CHECK(0, "chat model: exit %d", rc);
        unlink(model);
        return;
    }
    const char *sys = "Be brief.", *u1 = "hello there", *u2 = "what is the time in the city";

    /* the conversation, as the single-shot references see it */
    ids_buf t1 = { .n = 0 }, r1, t2, r2;
    push_msg(&t1, m, "system", sys);
    push_msg(&t1, m, "user", u1);
    push_open(&t1, m);
    single_shot(model, &t1, &r1, "8");
    const int eog1 = r1.n > 0 && sparq_token_is_eog(m, r1.v[r1.n - 1]);
    t2 = t1;
    for (int i = 0; i < r1.n - eog1; i++) push_id(&t2, r1.v[i]);
    push_id(&t2, sparq_model_n_vocab(m) - 1); /* the reply's closing: <|im_end|>\n */
    push_text(&t2, m, "\n");
    push_msg(&t2, m, "user", u2);
    push_open(&t2, m);
    single_shot(model, &t2, &r2, "8");
    /* the comparison below can fail: without the closing, reply 2 differs */
    ids_buf t2_bad = t1, r2_bad;
    for (int i = 0; i < r1.n - eog1; i++) push_id(&t2_bad, r1.v[i]);
    push_msg(&t2_bad, m, "user", u2);
    push_open(&t2_bad, m);
    single_shot(model, &t2_bad, &r2_bad, "8");
    CHECK(r2_bad.n != r2.n || memcmp(r2_bad.v, r2.v, (size_t)r2.n * sizeof *r2.v) != 0,
          "reply 2 depends on the turn boundary");
    char want[2100], a[1024], b[1024];
    reply_text(m, &r1, a, sizeof a);
    reply_text(m, &r2, b, sizeof b);
    snprintf(want, sizeof want, "%s\n%s\n", a, b);

    /* the same conversation typed on stdin (a blank line in between is skipped) */
    snprintf(args, sizeof args, "run -m %s --chat --chat-template chatml --system '%s' -n 8 --temp 0 -t 1", model, sys);
    char input[256];
    snprintf(input, sizeof input, "%s\n\n%s\n", u1, u2);
    rc = run(args, input, &out, &err);
    CHECK(rc == 0, "chat exit %d: %s", rc, err);
    CHECK(strcmp(out, want) == 0, "two replies equal the single-shot runs:\n got  '%s'\n want '%s'", out, want);
    /* turn 2 evaluates only what is new: the previous reply's token that had
     * no forward pass yet (when -n cut it), the closing and the new turn */
    const int cached = t1.n + (r1.n - eog1) - (eog1 ? 0 : 1);
    CHECK(turn_prefill(err, 1) == t1.n && turn_prefill(err, 2) == t2.n - cached,
          "prefills %d and %d, want %d and %d: %s", turn_prefill(err, 1), turn_prefill(err, 2), t1.n,
          t2.n - cached, err);
    CHECK(strstr(err, "> ") == NULL && strstr(err, "error") == NULL, "no prompt marker off a tty: %s", err);
    free(out); free(err);

    /* -p is still one turn, with the same tokens as the hand-written ChatML */
    snprintf(args, sizeof args, "run -m %s --chat --chat-template chatml --system '%s' -p '%s' -n 8 --temp 0 -t 1 --json",
             model, sys, u1);
    rc = run(args, NULL, &out, &err);
    ids_buf p1;
    p1.n = json_ids(out, "prompt_tokens", p1.v, 512);
    CHECK(rc == 0 && p1.n == t1.n && memcmp(p1.v, t1.v, (size_t)t1.n * sizeof *t1.v) == 0,
          "--chat -p renders ChatML as written here (%d vs %d ids)", p1.n, t1.n);
    free(out); free(err);

    /* EOF at once: nothing to say, exit 0 */
    snprintf(args, sizeof args, "run -m %s --chat --chat-template chatml -n 8 --temp 0 -t 1", model);
    rc = run(args, "", &out, &err);
    CHECK(rc == 0 && out[0] == 0, "empty stdin: exit %d, out '%s'", rc, out);
    free(out); free(err);

    /* a turn that does not fit: one error line, non-zero exit, the first reply kept */
    snprintf(args, sizeof args, "run -m %s --chat --chat-template chatml --system '%s' -n 8 --temp 0 -t 1 -c %d",
             model, sys, t1.n + 12);
    char long_turn[1024];
    snprintf(long_turn, sizeof long_turn, "%s\n", u1);
    for (int i = 0; i < 40; i++) strcat(long_turn, "more words ");
    strcat(long_turn, "\n");
    rc = run(args, long_turn, &out, &err);
    CHECK(rc != 0 && strstr(err, "error: turn 2 needs") && strstr(err, "context"), "overflow: exit %d: %s", rc, err);
    snprintf(want, sizeof want, "%s\n", a);
    CHECK(strcmp(out, want) == 0, "first reply printed: '%s'", out);
    free(out); free(err);

    /* interactive output is text only */
    snprintf(args, sizeof args, "run -m %s --chat --json", model);
    rc = run(args, "hi\n", &out, &err);
    CHECK(rc == 2 && strstr(err, "--json") && out[0] == 0, "interactive --json: exit %d: %s", rc, err);
    free(out); free(err);

    test_interactive(model, m);
    sparq_model_free(m);
    unlink(model);
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_cli_chat");
    }
    if (make_temp(out_path, sizeof out_path, "sparq_chat_out") || make_temp(err_path, sizeof err_path, "sparq_chat_err") ||
        make_temp(in_path, sizeof in_path, "sparq_chat_in")) {
        CHECK(0, "mkstemp");
        return test_summary("test_cli_chat");
    }
    test_gen_model();
    test_chat();
    unlink(out_path);
    unlink(err_path);
    unlink(in_path);
    return test_summary("test_cli_chat");
}
