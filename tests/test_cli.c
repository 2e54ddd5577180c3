/* test_cli.c - the `sparq` command as a user runs it: output on stdout,
 * errors as one line on stderr with a non-zero exit. Runs the binary from
 * $SPARQ_BUILD (default build/). */
#include "test.h"
#include "tensor/gguf.h"
#include "util/paths.h"
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[1024];
static char tmp[256];   /* a private directory (mkdtemp): parallel suites never collide */

/* tmp/name into buf. */
static const char *tpath(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmp, name);
    return buf;
}

/* Runs `sparq ARGS`, capturing stdout and stderr; returns the exit code. */
static int run(const char *args, char **out, char **err)
{
    char cmd[8192], o[512], e[512];
    tpath(o, sizeof o, "out.txt");
    tpath(e, sizeof e, "err.txt");
    snprintf(cmd, sizeof cmd, "timeout 60 %s %s >%s 2>%s", bin, args, o, e);
    int st = system(cmd);
    size_t n;
    *out = test_read_file(o, &n);
    *err = test_read_file(e, &n);
    if (!*out) *out = calloc(1, 1);
    if (!*err) *err = calloc(1, 1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void expect_error(const char *args, const char *needle, int code)
{
    char *out, *err;
    int rc = run(args, &out, &err);
    CHECK(code ? rc == code : rc != 0, "`sparq %s` exit %d", args, rc);
    CHECK(strstr(err, needle) != NULL, "`sparq %s` stderr should mention '%s': %s", args, needle, err);
    CHECK(strstr(err, "error") != NULL, "stderr starts with error: %s", err);
    CHECK(out[0] == 0, "nothing on stdout for `sparq %s`", args);
    free(out);
    free(err);
}

/* What used to block, decode garbage or fall back
 * silently now fails with one line. */
static void test_bad_inputs(const char *model)
{
    char p1[512], args[2048];
    /* a FIFO as -m, -f or --load-kv: refused at once instead of blocking */
    tpath(p1, sizeof p1, "fifo");
    CHECK(mkfifo(p1, 0600) == 0, "mkfifo");
    snprintf(args, sizeof args, "run -m %s -p hi", p1);
    expect_error(args, "not a regular file", 1);
    snprintf(args, sizeof args, "run -f %s", p1);
    expect_error(args, "not a regular file", 1);
    snprintf(args, sizeof args, "run -p hi --load-kv %s", p1);
    expect_error(args, "not a regular file", 1);
    unlink(p1);

    /* NaN in a weight: an error naming the position, not garbage and exit 0 */
    size_t n;
    uint8_t *buf = test_read_file(model, &n);
    gguf_file *g = NULL;
    char err[256];
    if (buf && gguf_parse(buf, n, &g, err, sizeof err) == 0) {
        const gguf_tensor *t = gguf_find_tensor(g, "output_norm.weight");
        CHECK(t && t->type == 0, "output_norm.weight is F32");
        if (t && t->type == 0) {
            const float nan = NAN;
            memcpy((uint8_t *)t->data, &nan, 4); /* data points into buf */
            tpath(p1, sizeof p1, "nan.gguf");
            FILE *f = fopen(p1, "wb");
            CHECK(f && fwrite(buf, 1, n, f) == n && fclose(f) == 0, "write nan model");
            snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 8 --temp 0", p1);
            char *out, *e;
            int rc = run(args, &out, &e);
            CHECK(rc == 1 && strstr(e, "non-finite logits at token position 4"), "NaN weights: exit %d: %s", rc, e);
            free(out);
            free(e);
            unlink(p1);
        }
        gguf_close(g);
    }
    free(buf);

    /* options that used to fall back or mean something else */
    static const char *const bad[][2] = {
        { "run -p hi --temp nan", "finite number" },
        { "run -p hi --temp -1", "temperature" },
        { "run -p hi --top-k -3", "--top-k" },
        { "run -p hi --top-p nan", "finite number" },
        { "run -p hi --top-p -0.5", "top-p" },
        { "run -p hi --min-p 2", "min-p" },
        { "run -p hi -c -1", "-c" },
        { "run -p hi -t -1", "-t" },
        { "run -p hi -b -7", "-b" },
        { "run -p hi --attn sparq --sparq-r 0", "--sparq-r" },
        { "run -p hi --attn sparq --sparq-k 0", "--sparq-k" },
        { "run -p hi --attn topk --topk-k 0", "--topk-k" },
        { "run -p hi --attn oracle --attn-k 0", "--attn-k" },
        { "run -p hi --attn streaming --attn-k 8 --n-sink 20", "--n-sink" },
        { "run -p hi --attn dense --sparq-r 4", "--sparq-r is an option of --attn sparq" },
        { "run -p hi --attn sparq --attn-k 4", "--attn-k is an option" },
        { "run -p hi --attn h2o --index ivf", "--index is an option of --attn topk" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out, *e;
        int rc = run(bad[i][0], &out, &e);
        CHECK(rc != 0 && strstr(e, "error") && strstr(e, bad[i][1]) && count_lines(e) == 1 && !out[0],
              "`%s`: exit %d, stderr '%s'", bad[i][0], rc, e);
        free(out);
        free(e);
    }
    /* where 0 is the convention, --help says so */
    char *out, *e;
    int rc = run("run --help", &out, &e);
    CHECK(rc == 0 && strstr(out, "threads (0 = the physical cores") && strstr(out, "(0 = 512") &&
              strstr(out, "(0 = the model's"), "help documents 0 = default");
    free(out);
    free(e);
    /* -t 0 and -b 0 work and mean all cores / 512 */
    rc = run("run -p 'Once upon a time' -n 4 --temp 0 -t 0 -b 0 --json", &out, &e);
    CHECK(rc == 0 && strstr(out, "\"n_batch\":512") && strstr(out, "\"tokens\":[432,383,286,261]"),
          "-t 0 -b 0: %s", out);
    free(out);
    free(e);

    /* item 10: a context that cannot be served fails at once, with the numbers */
    expect_error("run -p hi -c 2000000000", "attention scratch", 1);
    expect_error("run -p hi -c 1099511627776", "too large", 1);
    expect_error("run -p hi -c 2e9", "not a valid integer", 2);
}

/* A bare checkout: run from a directory with no ../shared beside it and
 * $SPARQ_MODEL_PATH unset, the default model is the repository's
 * models/stories260K.gguf, found beside the binary's directory. */
static void test_models_beside_binary(void)
{
    char cwd[512], abs_bin[4096], cmd[8192], o[600], e[600];
    if (!realpath(bin, abs_bin)) {
        CHECK(0, "realpath %s", bin);
        return;
    }
    tpath(cwd, sizeof cwd, "cwd"); /* tmp/cwd: its ../shared would be tmp/shared, which is absent */
    tpath(o, sizeof o, "bare_out.txt");
    tpath(e, sizeof e, "bare_err.txt");
    CHECK(mkdir(cwd, 0700) == 0, "mkdir %s", cwd);
    snprintf(cmd, sizeof cmd, "cd %s && test ! -e ../shared && env -u SPARQ_MODEL_PATH timeout 60 %s run "
             "-p 'Once upon a time' -n 8 --temp 0 --json >%s 2>%s", cwd, abs_bin, o, e);
    int st = system(cmd);
    size_t n;
    char *out = test_read_file(o, &n), *err = test_read_file(e, &n);
    const char *model = out ? strstr(out, "\"model\":\"") : NULL;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && model && strstr(model, "/models/stories260K.gguf\"") &&
              !strstr(out, "shared") && strstr(out, "\"tokens\":[432,383,286,261,"),
          "no ../shared, no SPARQ_MODEL_PATH: the default model from models/: %s %s", out ? out : "",
          err ? err : "");
    free(out);
    free(err);
    /* a name that is nowhere: the error lists where it looked */
    snprintf(cmd, sizeof cmd, "cd %s && env -u SPARQ_MODEL_PATH timeout 60 %s run -m nowhere.gguf -p hi >%s 2>%s",
             cwd, abs_bin, o, e);
    st = system(cmd);
    err = test_read_file(e, &n);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, "not found") &&
              strstr(err, "beside the binary"), "not found names the search path: %s", err ? err : "");
    free(err);
    /* A development layout is not built into the command: a model in
     * ../shared/models beside the working directory is found only when
     * SPARQ_MODEL_PATH names that directory. */
    char shared[512], smodels[600], link_path[700], abs_model[4096];
    tpath(shared, sizeof shared, "shared");
    snprintf(smodels, sizeof smodels, "%s/models", shared);
    snprintf(link_path, sizeof link_path, "%s/beside.gguf", smodels);
    if (!realpath("models/stories260K.gguf", abs_model)) {
        CHECK(0, "realpath models/stories260K.gguf");
    } else if (mkdir(shared, 0700) != 0 || mkdir(smodels, 0700) != 0 || symlink(abs_model, link_path) != 0) {
        CHECK(0, "cannot make %s", link_path);
    } else {
        snprintf(cmd, sizeof cmd, "cd %s && env -u SPARQ_MODEL_PATH timeout 60 %s run -m beside.gguf -p hi -n 1 "
                 ">%s 2>%s", cwd, abs_bin, o, e);
        st = system(cmd);
        err = test_read_file(e, &n);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, "not found"),
              "../shared/models is not searched without SPARQ_MODEL_PATH: exit %d %s",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, err ? err : "");
        free(err);
        snprintf(cmd, sizeof cmd, "cd %s && SPARQ_MODEL_PATH=../shared/models timeout 60 %s run -m beside.gguf "
                 "-p hi -n 1 >%s 2>%s", cwd, abs_bin, o, e);
        st = system(cmd);
        err = test_read_file(e, &n);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SPARQ_MODEL_PATH=../shared/models finds it: %s",
              err ? err : "");
        free(err);
    }
    unlink(link_path);
    rmdir(smodels);
    rmdir(shared);
    unlink(o);
    unlink(e);
    rmdir(cwd);
}

static int count_str(const char *s, const char *needle)
{
    int n = 0;
    for (const char *q = s; (q = strstr(q, needle)) != NULL; q++) n++;
    return n;
}

/* The JSON array "key":[...] of s as text (static buffer), or "". */
static const char *json_array(const char *s, const char *key)
{
    static char buf[4096];
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":[", key);
    const char *a = strstr(s, pat), *e = a ? strchr(a, ']') : NULL;
    buf[0] = 0;
    if (a && e && (size_t)(e - a) < sizeof buf) snprintf(buf, sizeof buf, "%.*s", (int)(e - a + 1), a);
    return buf;
}

/* --chat on a model without a chat template (stories260K): chatml, as
 * llama-cli falls back, said once on stderr; --chat-template overrides. */
static void test_chat_fallback(void)
{
    char *out, *e, *ref, *e2, want[4096], args[1024], in[512];
    int rc = run("run --chat -p 'Tell me a story' -n 6 --temp 0 -t 1 --json", &out, &e);
    int rc2 = run("run --chat --chat-template chatml -p 'Tell me a story' -n 6 --temp 0 -t 1 --json", &ref, &e2);
    snprintf(want, sizeof want, "%s", json_array(ref, "prompt_tokens"));
    CHECK(rc == 0 && rc2 == 0 && want[0] && strcmp(json_array(out, "prompt_tokens"), want) == 0 &&
              strcmp(json_array(out, "tokens"), json_array(ref, "tokens")) == 0,
          "--chat without a template is chatml: exit %d: %s | %s %s", rc, out, ref, e);
    CHECK(count_str(e, "no chat template; using chatml") == 1 && count_str(e2, "no chat template") == 0,
          "the fallback is said once, and not when --chat-template is given: '%s' '%s'", e, e2);
    free(out); free(e); free(ref); free(e2);
    /* another template given: no note, another prompt */
    rc = run("run --chat --chat-template llama3 -p 'Tell me a story' -n 2 --temp 0 -t 1 --json", &out, &e);
    CHECK(rc == 0 && !strstr(e, "no chat template") && strcmp(json_array(out, "prompt_tokens"), want) != 0,
          "--chat-template llama3 overrides: exit %d %s %s", rc, out, e);
    free(out); free(e);
    /* interactive, two turns: still one note */
    tpath(in, sizeof in, "turns.txt");
    FILE *f = fopen(in, "w");
    CHECK(f && fputs("Hello\nTell me more\n", f) >= 0 && fclose(f) == 0, "write %s", in);
    snprintf(args, sizeof args, "run --chat -n 4 --temp 0 -t 1 <%s", in);
    rc = run(args, &out, &e);
    CHECK(rc == 0 && count_str(e, "no chat template; using chatml") == 1 && count_str(e, "turn 2:") == 1,
          "interactive chat without a template: exit %d: %s", rc, e);
    free(out); free(e);
    unlink(in);
}

/* bench decode --plot draws tok/s against depth (it used to write nothing) */
static void test_bench_plot(const char *model)
{
    char png[512], gp[600], args[2048], *out, *e;
    tpath(png, sizeof png, "decode.png");
    snprintf(gp, sizeof gp, "%s.gp", png);
    snprintf(args, sizeof args, "bench decode -m %s --depth 0,64 --attn dense,streaming --attn-k 16 --fill random "
             "-n 2 --warmup 1 -t 1 --plot %s", model, png);
    int rc = run(args, &out, &e);
    size_t n_png = 0, n_gp = 0;
    char *img = test_read_file(png, &n_png), *script = test_read_file(gp, &n_gp);
    CHECK(rc == 0 && img && n_png > 1000 && script && strstr(script, "decode tokens/s") &&
              strstr(script, "'streaming k=16'") && !strstr(e, "warning"),
          "bench decode --plot: exit %d, png %zu bytes: %s", rc, n_png, e);
    free(img);
    free(script);
    free(out);
    free(e);
    unlink(png);
    unlink(gp);
}

/* run --json carries the run's settings and millisecond timings */
static void test_json_fields(void)
{
    char *out, *e;
    int rc = run("run -p 'Once upon a time' -n 4 --temp 0 -t 1 -c 128 --json", &out, &e);
    CHECK(rc == 0 && strstr(out, "\"n_ctx\":128,\"threads\":1,") && strstr(out, "\"load_ms\":") &&
              strstr(out, "\"prefill_ms\":") && strstr(out, "\"decode_ms\":") && strstr(out, "\"seed\":"),
          "json fields: %s", out);
    free(out);
    free(e);
}

/* Sampling options, stop strings, seeds, --version */
static void test_sampling_options(void)
{
    char *out, *e;
    /* -r: the text stops before the reverse prompt (greedy text is known) */
    int rc = run("run -p 'Once upon a time' -n 32 --temp 0 -r 'Lily' -r 'zzz'", &out, &e);
    CHECK(rc == 0 && strcmp(out, ", there was a little girl named \n") == 0 && strstr(e, "stopped: reverse prompt"),
          "-r: '%s' %s", out, e);
    free(out);
    free(e);
    /* a fixed seed repeats; the default seed is random and printed */
    char *a, *b;
    rc = run("run -p 'Once upon a time' -n 12 --seed 7 --json", &a, &e);
    free(e);
    rc |= run("run -p 'Once upon a time' -n 12 --seed 7 --json", &b, &e);
    free(e);
    const char *ta = strstr(a, "\"tokens\""), *tb = strstr(b, "\"tokens\"");
    CHECK(rc == 0 && ta && tb && strncmp(ta, tb, 60) == 0 && strstr(a, "\"seed\":7,"), "--seed 7 repeats");
    free(a);
    free(b);
    rc = run("run -p 'Once upon a time' -n 2 --json", &a, &e);
    free(e);
    rc |= run("run -p 'Once upon a time' -n 2 --json", &b, &e);
    free(e);
    const char *sa = strstr(a, "\"seed\":"), *sb = strstr(b, "\"seed\":");
    CHECK(rc == 0 && sa && sb && strtoull(sa + 7, NULL, 10) != strtoull(sb + 7, NULL, 10), "default seeds differ");
    free(a);
    free(b);
    /* a strong repeat penalty changes greedy text that repeats */
    rc = run("run -p 'Once upon a time' -n 48 --temp 0 --repeat-penalty 1.5 --json", &a, &e);
    free(e);
    rc |= run("run -p 'Once upon a time' -n 48 --temp 0 --json", &b, &e);
    free(e);
    CHECK(rc == 0 && strcmp(strstr(a, "\"tokens\""), strstr(b, "\"tokens\"")) != 0, "repeat penalty acts");
    free(a);
    free(b);
    /* -l / --logit-bias (llama.cpp's spelling): banning the greedy first
     * token (432, see main) changes the text and 432 never appears; a
     * large plus bias makes an id every greedy choice */
    rc = run("run -p 'Once upon a time' -n 8 --temp 0 --json -l 432-inf", &a, &e);
    /* 432 as an element of the tokens array, not as digits of a later
     * field (peak_rss_bytes 11538432 once made this fail) */
    const char *tk = strstr(a, "\"tokens\":[");
    char ids[512] = ",";
    if (tk) {
        const char *end = strchr(tk, ']');
        const size_t len = end ? (size_t)(end - tk) - 10 : 0;
        if (len < sizeof ids - 2) {
            memcpy(ids + 1, tk + 10, len); /* ",383,286,...," */
            ids[len + 1] = ',';
            ids[len + 2] = 0;
        }
    }
    CHECK(rc == 0 && tk && strlen(ids) > 2 && !strstr(ids, ",432,") && strstr(a, "\"stop\":\"n_predict\""),
          "-l 432-inf bans the greedy token: exit %d: %s %s", rc, a, e);
    free(a);
    free(e);
    rc = run("run -p 'Once upon a time' -n 4 --temp 0 --json --logit-bias=383+100 -l 17-2.5", &a, &e);
    CHECK(rc == 0 && strstr(a, "\"tokens\":[383,383,383,383]"), "--logit-bias=383+100: exit %d: %s %s", rc, a, e);
    free(a);
    free(e);
    rc = run("run -p 'Once upon a time' -n 16 --temp 1.5 --seed 3 --json -l 261-inf -l 432-inf", &a, &e);
    tk = strstr(a, "\"tokens\":[");
    CHECK(rc == 0 && tk && !strstr(tk, "[261,") && !strstr(tk, ",261,") && !strstr(tk, ",261]") &&
              !strstr(tk, "[432,") && !strstr(tk, ",432,") && !strstr(tk, ",432]"),
          "sampling at temp 1.5 never draws banned ids: %s", a);
    free(a);
    free(e);
    static const char *const bad_bias[][2] = {
        { "run -p hi -l 432", "TOKEN_ID+BIAS" },
        { "run -p hi -l abc+1", "TOKEN_ID+BIAS" },
        { "run -p hi -l 432+-1", "TOKEN_ID+BIAS" },
        { "run -p hi -l 432-nan", "TOKEN_ID+BIAS" },
        { "run -p hi -l -5+1", "TOKEN_ID+BIAS" },
        { "run -p hi -l 432+1x", "TOKEN_ID+BIAS" },
        { "run -p hi -l 432+inf", "+inf" },
        { "run -p hi -l 432-1e39", "too large" },
        { "run -p hi -l 512-inf", "outside the vocabulary [0, 512)" },
    };
    for (size_t i = 0; i < sizeof bad_bias / sizeof bad_bias[0]; i++) {
        rc = run(bad_bias[i][0], &out, &e);
        CHECK(rc == 2 && strncmp(e, "error: ", 7) == 0 && strstr(e, bad_bias[i][1]) && count_lines(e) == 1 && !out[0],
              "`%s`: exit %d, stderr '%s'", bad_bias[i][0], rc, e);
        free(out);
        free(e);
    }
    static const char *const cmds[] = { "--version", "run --version", "bench --version", "eval --version",
                                        "gen-model --version", "prefill --version", "stats --version",
                                        "bench-topk --version" };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        rc = run(cmds[i], &out, &e);
        CHECK(rc == 0 && strncmp(out, "sparq ", 6) == 0, "`sparq %s`: exit %d, '%s'", cmds[i], rc, out);
        free(out);
        free(e);
    }
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_cli");
    }
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_cli");
    }
    char *out, *err;
    snprintf(tmp, sizeof tmp, "/tmp/sparq_cli_XXXXXX");
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp failed");
        return test_summary("test_cli");
    }
    char p1[512], args[2048];

    /* greedy continuation: exactly llama-completion's text after the prompt */
    int rc = run("run -p 'Once upon a time' -n 32 --temp 0 -t 2", &out, &err);
    CHECK(rc == 0, "run exit %d: %s", rc, err);
    CHECK(strcmp(out, ", there was a little girl named Lily. She loved to play outside in the park. "
                      "One day, she saw\n") == 0, "stdout: '%s'", out);
    CHECK(strstr(err, "decode") && strstr(err, "tok/s") && strstr(err, "peak RSS"), "timing summary: %s", err);
    free(out); free(err);

    /* --json: one object with the prompt ids and generated ids */
    rc = run("run -p 'Once upon a time' -n 4 --temp 0 --json", &out, &err);
    CHECK(rc == 0, "json exit %d", rc);
    CHECK(out[0] == '{' && count_lines(out) == 1, "one JSON line: %s", out);
    CHECK(strstr(out, "\"prompt_tokens\":[1,403,407,261,378]") != NULL, "prompt ids: %s", out);
    CHECK(strstr(out, "\"tokens\":[432,383,286,261]") != NULL, "generated ids: %s", out);
    CHECK(strstr(out, "\"text\":\", there was a\"") != NULL, "text: %s", out);
    CHECK(strstr(out, "\"decode_tok_s\":") && strstr(out, "\"prefill_tok_s\":") &&
          strstr(out, "\"peak_rss_bytes\":") && strstr(out, "\"attn\":{\"policy\":\"dense\""), "fields: %s", out);
    free(out); free(err);

    /* --logits-out: prompt rows then one row per later step; -n 0 only the prompt */
    tpath(p1, sizeof p1, "logits.f32");
    snprintf(args, sizeof args, "run --prompt-tokens 1,403,407,261,378 -n 3 --temp 0 --logits-out %s", p1);
    rc = run(args, &out, &err);
    size_t n;
    float *rows = test_read_file(p1, &n);
    CHECK(rc == 0 && rows && n == (5 + 2) * 512 * 4, "logits rows: %zu bytes", n);
    free(rows); free(out); free(err);
    snprintf(args, sizeof args, "run --prompt-tokens 1,403,407 -n 0 --logits-out %s", p1);
    rc = run(args, &out, &err);
    rows = test_read_file(p1, &n);
    CHECK(rc == 0 && n == 3 * 512 * 4 && strcmp(out, "\n") == 0, "-n 0: %zu bytes, out '%s'", n, out);
    free(rows); free(out); free(err);
    unlink(p1);

    /* bad input: one line on stderr, non-zero exit, nothing on stdout */
    expect_error("run -p 'Once upon a time, there was a girl' -c 4", "context", 0);
    expect_error("run --frobnicate", "unknown option '--frobnicate'", 2);
    expect_error("run -n", "needs a value", 2);
    expect_error("run -n abc", "not a valid integer", 2);
    expect_error("run -m /nonexistent.gguf -p hi", "not found", 0);
    expect_error("run -m /nonexistent.gguf -p hi", "huggingface.co", 0);
    expect_error("run -p hi --attn magic", "unknown attention policy 'magic'", 0);
    expect_error("run -p hi --kv-type q4", "--kv-type", 2);
    expect_error("run -f /nonexistent/prompt.txt", "cannot read prompt file", 0);
    expect_error("run --prompt-tokens 1,99999", "outside the vocabulary", 0);
    expect_error("frobnicate", "unknown command", 2);
    tpath(p1, sizeof p1, "bad.gguf");
    FILE *f = fopen(p1, "wb");
    if (f) { fputs("GGUF this is not a model", f); fclose(f); }
    snprintf(args, sizeof args, "run -m %s -p hi", p1);
    expect_error(args, "gguf", 0);
    unlink(p1);

    test_bad_inputs(model);
    test_models_beside_binary();
    test_chat_fallback();
    test_bench_plot(model);
    test_json_fields();
    test_sampling_options();

    rc = run("run --help", &out, &err);
    CHECK(rc == 0 && strstr(out, "--sparq-r") && strstr(out, "--temp"), "help lists options");
    free(out); free(err);

    /* `prefill --help` gives --index once, with the default
     * prefill really uses (ivf), which the JSON of a run without it shows */
    rc = run("prefill --help", &out, &err);
    {
        int n_index = 0;
        for (const char *q = out; (q = strstr(q, "\n  --index ")) != NULL; q++) n_index++;
        const char *line = strstr(out, "\n  --index ");
        const char *eol = line ? strchr(line + 1, '\n') : NULL;
        const char *dflt = line ? strstr(line, "(default ivf)") : NULL;
        CHECK(rc == 0 && n_index == 1 && dflt && (!eol || dflt < eol) && !strstr(out, "default ivf;"),
              "prefill --help: one --index line with default ivf (%d lines): %s", n_index, out);
    }
    free(out); free(err);
    tpath(p1, sizeof p1, "ctx.kv");
    snprintf(args, sizeof args, "prefill -p 'Once upon a time' -c 64 --save-kv %s --json", p1);
    rc = run(args, &out, &err);
    CHECK(rc == 0 && strstr(out, "\"indexes\":\"ivf\""), "prefill default index: exit %d: %s %s", rc, out, err);
    free(out); free(err);
    snprintf(args, sizeof args, "prefill -p 'Once upon a time' -c 64 --save-kv %s --json --index exact,hnsw", p1);
    rc = run(args, &out, &err);
    CHECK(rc == 0 && strstr(out, "\"indexes\":\"exact,hnsw\""), "prefill --index LIST: exit %d: %s %s", rc, out,
          err);
    free(out); free(err);
    unlink(p1);

    /* `bench topk` is `bench-topk`: the same usage and options */
    rc = run("bench topk --help", &out, &err);
    CHECK(rc == 0 && strstr(out, "bench-topk") && strstr(out, "--index"), "bench topk --help: exit %d", rc);
    free(out); free(err);
    rc = run("bench nosuchmode", &out, &err);
    CHECK(rc != 0 && strstr(err, "topk"), "unknown bench mode lists topk: exit %d", rc);
    free(out); free(err);
    rmdir(tmp);
    return test_summary("test_cli");
}
