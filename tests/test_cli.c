/* test_cli.c - the `sparq` command as a user runs it: output on stdout,
 * errors as one line on stderr with a non-zero exit. Runs the binary from
 * $SPARQ_BUILD (default build/). */
#include "test.h"
#include "util/paths.h"
#include <sys/wait.h>
#include <unistd.h>

static char bin[1024];

/* Runs `sparq ARGS`, capturing stdout and stderr; returns the exit code. */
static int run(const char *args, char **out, char **err)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >/tmp/sparq_cli_out.txt 2>/tmp/sparq_cli_err.txt", bin, args);
    int st = system(cmd);
    size_t n;
    *out = test_read_file("/tmp/sparq_cli_out.txt", &n);
    *err = test_read_file("/tmp/sparq_cli_err.txt", &n);
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
    rc = run("run --prompt-tokens 1,403,407,261,378 -n 3 --temp 0 --logits-out /tmp/sparq_cli_logits.f32", &out, &err);
    size_t n;
    float *rows = test_read_file("/tmp/sparq_cli_logits.f32", &n);
    CHECK(rc == 0 && rows && n == (5 + 2) * 512 * 4, "logits rows: %zu bytes", n);
    free(rows); free(out); free(err);
    rc = run("run --prompt-tokens 1,403,407 -n 0 --logits-out /tmp/sparq_cli_logits.f32", &out, &err);
    rows = test_read_file("/tmp/sparq_cli_logits.f32", &n);
    CHECK(rc == 0 && n == 3 * 512 * 4 && strcmp(out, "\n") == 0, "-n 0: %zu bytes, out '%s'", n, out);
    free(rows); free(out); free(err);
    unlink("/tmp/sparq_cli_logits.f32");

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
    FILE *f = fopen("/tmp/sparq_cli_bad.gguf", "wb");
    if (f) { fputs("GGUF this is not a model", f); fclose(f); }
    expect_error("run -m /tmp/sparq_cli_bad.gguf -p hi", "gguf", 0);
    unlink("/tmp/sparq_cli_bad.gguf");

    rc = run("run --help", &out, &err);
    CHECK(rc == 0 && strstr(out, "--sparq-r") && strstr(out, "--temp"), "help lists options");
    free(out); free(err);

    /* `bench topk` is `bench-topk`: the same usage and options */
    rc = run("bench topk --help", &out, &err);
    CHECK(rc == 0 && strstr(out, "bench-topk") && strstr(out, "--index"), "bench topk --help: exit %d", rc);
    free(out); free(err);
    rc = run("bench nosuchmode", &out, &err);
    CHECK(rc != 0 && strstr(err, "topk"), "unknown bench mode lists topk: exit %d", rc);
    free(out); free(err);
    return test_summary("test_cli");
}
