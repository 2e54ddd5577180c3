/* test_cli_compat.c - llama-cli's habits in `sparq run`: its option
 * spellings with its meaning (-n -1, -s, -ctk/-ctv, -sys, -cnv/-no-cnv, -i,
 * -ub, -v), the options accepted for nothing on a CPU engine (-ngl,
 * --mlock, -fa, --no-warmup, --color) with one note each, `sparq -m M -p T`
 * without a command, --version's commit and SIMD level, and the generated
 * text's newline before the timing lines when stdout and stderr share a
 * pipe. Runs the binary from $SPARQ_BUILD (default build/) on
 * stories260K.gguf.
 */
#include "test.h"
#include "util/cpu.h"

#include <ctype.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[1024];
static char tmp[256];

/* Runs `sparq ARGS` (ARGS may end in a shell redirection of stdin),
 * capturing stdout and stderr; returns the exit code. */
static int run(const char *args, char **out, char **err)
{
    char cmd[8192], o[512], e[512];
    snprintf(o, sizeof o, "%s/out.txt", tmp);
    snprintf(e, sizeof e, "%s/err.txt", tmp);
    snprintf(cmd, sizeof cmd, "timeout 120 %s %s >%s 2>%s", bin, args, o, e);
    int st = system(cmd);
    size_t n;
    *out = test_read_file(o, &n);
    *err = test_read_file(e, &n);
    if (!*out) *out = calloc(1, 1);
    if (!*err) *err = calloc(1, 1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int count_str(const char *s, const char *needle)
{
    int n = 0;
    for (const char *q = s; (q = strstr(q, needle)) != NULL; q++) n++;
    return n;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The JSON array "key":[...] in s, copied into buf ("" if absent). */
static const char *json_array(const char *s, const char *key, char *buf, size_t size)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":[", key);
    const char *a = strstr(s, pat), *e = a ? strchr(a, ']') : NULL;
    buf[0] = 0;
    if (a && e && (size_t)(e - a) < size) snprintf(buf, size, "%.*s", (int)(e - a + 1), a);
    return buf;
}

static int json_count(const char *arr)
{
    if (strlen(arr) < 4) return 0;
    return count_str(arr, ",") + 1;
}

/* One line on stderr starting "error: " and naming `needle`, nothing on
 * stdout, exit code `code`. */
static void expect_error(const char *args, const char *needle, int code)
{
    char *out, *err;
    int rc = run(args, &out, &err);
    CHECK(rc == code && strncmp(err, "error: ", 7) == 0 && strstr(err, needle) && count_lines(err) == 1 && !out[0],
          "`sparq %s`: exit %d (want %d), stderr '%s' (want one line naming '%s'), stdout '%s'", args, rc, code, err,
          needle, out);
    free(out);
    free(err);
}

/* -n -1: generation goes on until the cache is full (here --ignore-eos,
 * so never an end of generation): -c 32 holds the 5 prompt tokens and 27
 * decoded ones, and the 28th sampled token is the last. */
static void test_n_minus_one(void)
{
    char *out, *err, a[4096];
    int rc = run("run -p 'Once upon a time' -n -1 --ignore-eos -c 32 --temp 0 -t 1 --json", &out, &err);
    json_array(out, "tokens", a, sizeof a);
    CHECK(rc == 0 && strstr(out, "\"stop\":\"context full\"") && json_count(a) == 28 && strstr(out, "\"n_ctx\":32,"),
          "-n -1 --ignore-eos -c 32: exit %d, %d tokens: %s %s", rc, json_count(a), out, err);
    free(out);
    free(err);
    rc = run("run -p 'Once upon a time' -n -1 --ignore-eos -c 32 --temp 0 -t 1", &out, &err);
    CHECK(rc == 0 && strstr(err, "stopped: context full") && strstr(err, "generated 28 tokens"),
          "-n -1 says why it stopped: exit %d: %s", rc, err);
    free(out);
    free(err);
    /* the same without -1: -n 8 stops at 8 */
    rc = run("run -p 'Once upon a time' -n 8 --ignore-eos -c 32 --temp 0 -t 1 --json", &out, &err);
    json_array(out, "tokens", a, sizeof a);
    CHECK(rc == 0 && json_count(a) == 8 && strstr(out, "\"stop\":\"n_predict\""), "-n 8: %s", out);
    free(out);
    free(err);
    expect_error("run -p hi -n -2", "-n -2", 2);
}

/* -s N is --seed N: the same sampled ids (the default seed is random, so
 * an ignored -s would differ), and another seed differs. */
static void test_seed(void)
{
    char *a, *b, *c, *e, ta[4096], tb[4096], tc[4096];
    int rc = run("run -p 'Once upon a time' -n 24 --temp 1.5 -t 1 --json -s 5", &a, &e);
    free(e);
    rc |= run("run -p 'Once upon a time' -n 24 --temp 1.5 -t 1 --json --seed 5", &b, &e);
    free(e);
    rc |= run("run -p 'Once upon a time' -n 24 --temp 1.5 -t 1 --json -s 6", &c, &e);
    free(e);
    json_array(a, "tokens", ta, sizeof ta);
    json_array(b, "tokens", tb, sizeof tb);
    json_array(c, "tokens", tc, sizeof tc);
    CHECK(rc == 0 && ta[0] && strcmp(ta, tb) == 0 && strstr(a, "\"seed\":5,"), "-s 5 == --seed 5: %s | %s", a, b);
    CHECK(rc == 0 && strcmp(ta, tc) != 0, "-s 6 samples other ids than -s 5: %s", tc);
    free(a);
    free(b);
    free(c);
}

/* -ctk/-ctv: the KV type, one for K and V. */
static void test_cache_types(void)
{
    expect_error("run -p hi -ctk q8_0 -ctv f16", "-ctk q8_0 and -ctv f16 differ", 2);
    expect_error("run -p hi --kv-type f32 -ctk q8_0", "--kv-type f32 and -ctk q8_0 differ", 2);
    expect_error("run -p hi -ctk q4_0", "-ctk must be f16, f32 or q8_0", 2);
    char *a, *b, *e, *e2, ta[4096], tb[4096];
    int rc = run("run -p 'Once upon a time' -n 16 --temp 0 -t 1 --json -v -ctk q8_0 -ctv q8_0", &a, &e);
    int rc2 = run("run -p 'Once upon a time' -n 16 --temp 0 -t 1 --json --kv-type q8_0", &b, &e2);
    CHECK(rc == 0 && rc2 == 0 && strstr(e, "| KV q8_0 |") &&
              strcmp(json_array(a, "tokens", ta, sizeof ta), json_array(b, "tokens", tb, sizeof tb)) == 0,
          "-ctk q8_0 -ctv q8_0 is --kv-type q8_0: %s | %s | %s", a, b, e);
    free(a);
    free(b);
    free(e);
    free(e2);
    rc = run("run -p 'Once upon a time' -n 2 --temp 0 -t 1 -v -ctv f32", &a, &e);
    CHECK(rc == 0 && strstr(e, "| KV f32 |"), "-ctv f32 alone sets the type: %s", e);
    free(a);
    free(e);
}

/* `sparq -m M -p T` is `sparq run -m M -p T`; unknown options are one line */
static void test_bare_command(void)
{
    char *a, *b, *e, *e2;
    int rc = run("-m stories260K.gguf -p 'Once upon a time' -n 16 --temp 0 -t 1", &a, &e);
    int rc2 = run("run -m stories260K.gguf -p 'Once upon a time' -n 16 --temp 0 -t 1", &b, &e2);
    CHECK(rc == 0 && rc2 == 0 && strcmp(a, b) == 0 && strncmp(a, ", there was a little girl", 25) == 0,
          "bare form == run: exit %d '%s' vs '%s' (%s)", rc, a, b, e);
    free(a);
    free(b);
    free(e);
    free(e2);
    rc = run("-p 'Once upon a time' -n 4 --temp 0 -t 1 --json", &a, &e);
    CHECK(rc == 0 && strstr(a, "\"tokens\":[432,383,286,261]"), "bare form, default model: %s %s", a, e);
    free(a);
    free(e);
    expect_error("-m stories260K.gguf --frobnicate", "unknown option '--frobnicate'", 2);
    expect_error("run -p hi --frobnicate", "unknown option '--frobnicate'", 2);
    expect_error("-p hi --flash-attn=maybe", "must be on, off or auto", 2);
    rc = run("--help", &a, &e);
    CHECK(rc == 0 && strstr(a, "sparq -m MODEL -p TEXT"), "sparq --help shows the bare form: %s", a);
    free(a);
    free(e);
}

/* -sys, -cnv, --conversation, -no-cnv, -i */
static void test_chat_spellings(void)
{
    char *a, *b, *e, *e2, ta[4096], tb[4096], ref_prompt[4096];
    /* -sys is --system, and implies the chat format */
    int rc = run("run -p 'Tell me a story' -sys 'You tell stories' -n 4 --temp 0 -t 1 --json", &a, &e);
    int rc2 = run("run --chat --chat-template chatml -p 'Tell me a story' --system 'You tell stories' -n 4 --temp 0 "
                  "-t 1 --json", &b, &e2);
    json_array(b, "prompt_tokens", ref_prompt, sizeof ref_prompt);
    CHECK(rc == 0 && rc2 == 0 && ref_prompt[0] &&
              strcmp(json_array(a, "prompt_tokens", ta, sizeof ta), ref_prompt) == 0,
          "-sys == --chat --system: %s | %s", a, b);
    free(a);
    free(e);
    free(e2);
    rc = run("run --system-prompt 'You tell stories' -cnv -p 'Tell me a story' -n 4 --temp 0 -t 1 --json", &a, &e);
    CHECK(rc == 0 && strcmp(json_array(a, "prompt_tokens", ta, sizeof ta), ref_prompt) == 0,
          "--system-prompt -cnv: %s", a);
    free(a);
    free(e);
    free(b);
    /* --conversation is --chat; -no-cnv is the plain completion */
    rc = run("run --conversation -p 'Tell me a story' -n 4 --temp 0 -t 1 --json", &a, &e);
    rc2 = run("run --chat -p 'Tell me a story' -n 4 --temp 0 -t 1 --json", &b, &e2);
    CHECK(rc == 0 && rc2 == 0 &&
              strcmp(json_array(a, "prompt_tokens", ta, sizeof ta), json_array(b, "prompt_tokens", tb, sizeof tb)) ==
                  0 && count_str(ta, ",") > 8,
          "--conversation == --chat: %s | %s", a, b);
    free(a);
    free(b);
    free(e);
    free(e2);
    rc = run("run -no-cnv -p 'Once upon a time' -n 4 --temp 0 -t 1 --json", &a, &e);
    CHECK(rc == 0 && strstr(a, "\"prompt_tokens\":[1,403,407,261,378]"), "-no-cnv: plain prompt: %s", a);
    free(a);
    free(e);
    expect_error("run -no-cnv --chat -p hi", "-no-cnv", 2);
    expect_error("run -no-cnv -sys x -p hi", "-no-cnv", 2);
    expect_error("run -i -f /dev/null", "-i reads the turns from stdin", 2);
    /* -i -p: the prompt is the first turn, then stdin's lines; the first
     * reply is the single-shot --chat reply to the same message */
    char in[512], args[1024];
    snprintf(in, sizeof in, "%s/turns.txt", tmp);
    FILE *f = fopen(in, "w");
    CHECK(f && fputs("And then?\n", f) >= 0 && fclose(f) == 0, "write %s", in);
    snprintf(args, sizeof args, "-i -p 'Tell me a story' -n 6 --temp 0 -t 1 <%s", in);
    rc = run(args, &a, &e);
    rc2 = run("run --chat -p 'Tell me a story' -n 6 --temp 0 -t 1", &b, &e2);
    const char *nl = strchr(a, '\n');
    CHECK(rc == 0 && rc2 == 0 && nl && strncmp(a, b, (size_t)(nl - a + 1)) == 0 && count_str(e, "turn 2:") == 1 &&
              count_str(e, "turn 3:") == 0 && strstr(e, "chat: 2 turns"),
          "-i -p: first turn the prompt, then stdin: exit %d '%s' vs '%s': %s", rc, a, b, e);
    free(a);
    free(b);
    free(e);
    free(e2);
    unlink(in);
}

/* Accepted for nothing: one note each, naming the option; the text is the
 * text without them. -ub sets the batch; -v prints the settings. */
static void test_accepted(void)
{
    char *base, *e;
    int rc = run("run -p 'Once upon a time' -n 8 --temp 0 -t 1", &base, &e);
    CHECK(rc == 0 && base[0], "baseline: %s", e);
    free(e);
    static const char *const opts[][2] = {
        { "-ngl 99", "-ngl 99: ignored" },
        { "--n-gpu-layers 33", "-ngl 33: ignored" },
        { "--mlock", "--mlock: ignored" },
        { "-fa", "--flash-attn on: ignored" },
        { "-fa off", "--flash-attn off: ignored" },
        { "--flash-attn=auto", "--flash-attn auto: ignored" },
        { "--no-warmup", "--no-warmup: ignored" },
        { "--color", "--color: ignored" },
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        char args[512], *out;
        /* the option first: -fa without a value must not take -p's */
        snprintf(args, sizeof args, "run %s -p 'Once upon a time' -n 8 --temp 0 -t 1", opts[i][0]);
        rc = run(args, &out, &e);
        CHECK(rc == 0 && strcmp(out, base) == 0 && count_str(e, "note: ") == 1 && count_str(e, opts[i][1]) == 1,
              "`%s`: exit %d, '%s', stderr '%s'", opts[i][0], rc, out, e);
        free(out);
        free(e);
    }
    free(base);
    /* -ub: the one batch there is; the smaller of -b and -ub */
    char *out;
    rc = run("run -p 'Once upon a time' -n 2 --temp 0 -t 1 --json -ub 3", &out, &e);
    CHECK(rc == 0 && strstr(out, "\"n_batch\":3,"), "-ub 3: %s %s", out, e);
    free(out);
    free(e);
    rc = run("run -p 'Once upon a time' -n 2 --temp 0 -t 1 --json -b 64 --ubatch-size 16", &out, &e);
    CHECK(rc == 0 && strstr(out, "\"n_batch\":16,"), "-b 64 -ub 16: %s %s", out, e);
    free(out);
    free(e);
    expect_error("run -p hi -ub 0", "-ub", 2);
    /* -v: the resolved settings; threads default to the physical cores */
    char want[128];
    snprintf(want, sizeof want, "| threads %d |", cpu_physical_cores());
    rc = run("run -p 'Once upon a time' -n 2 --temp 0 -v -c 64", &out, &e);
    CHECK(rc == 0 && strstr(e, "verbose: model ") && strstr(e, "stories260K.gguf | context 64 |") && strstr(e, want),
          "-v: want '%s': %s", want, e);
    free(out);
    free(e);
    rc = run("run --help", &out, &e);
    CHECK(rc == 0 && strstr(out, "0 = the physical cores") && strstr(out, "-ngl") && strstr(out, "-ctk") &&
              strstr(out, "-1: until end of generation"),
          "run --help: %s", out);
    free(out);
    free(e);
}

/* --version: the version, the commit it was built from (the Makefile's
 * $(BUILD)/git-commit, "unknown" outside git) and the SIMD level */
static void test_version(void)
{
    char *out, *e, path[1100], want[256];
    const char *b = getenv("SPARQ_BUILD");
    snprintf(path, sizeof path, "%s/git-commit", b ? b : "build");
    size_t n;
    char *commit = test_read_file(path, &n);
    if (commit) commit[strcspn(commit, "\n")] = 0;
    int rc = run("--version", &out, &e);
    snprintf(want, sizeof want, "(commit %s, cpu ", commit ? commit : "?");
    CHECK(rc == 0 && strncmp(out, "sparq ", 6) == 0 && commit && commit[0] && strstr(out, want) &&
              count_lines(out) == 1,
          "--version '%s' names the commit '%s'", out, commit ? commit : "(no git-commit file)");
    int hex = commit && (strcmp(commit, "unknown") == 0 || strlen(commit) >= 7);
    for (const char *q = commit; hex && q && *q && strcmp(commit, "unknown") != 0; q++) hex = isxdigit((unsigned char)*q);
    CHECK(hex, "the commit is a short hash or unknown: '%s'", commit ? commit : "");
    /* the level the kernels were chosen at, at run time */
    CHECK(strstr(out, "cpu ref)") || strstr(out, "cpu avx2)") || strstr(out, "cpu avx512)"),
          "--version names the kernels' level: %s", out);
    free(commit);
    free(out);
    free(e);
}

/* stdout and stderr into one pipe: the text's line ends before the
 * timing lines (the newline used to wait in stdout's buffer until exit) */
static void test_shared_pipe(void)
{
    char cmd[4096], path[512];
    snprintf(path, sizeof path, "%s/both.txt", tmp);
    snprintf(cmd, sizeof cmd, "timeout 60 %s run -p 'Once upon a time' -n 8 --temp 0 -t 1 2>&1 | cat >%s", bin, path);
    int st = system(cmd);
    size_t n;
    char *both = test_read_file(path, &n);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && both &&
              strncmp(both, ", there was a little girl\nprompt 5 tokens", 41) == 0,
          "shared pipe: '%s'", both ? both : "");
    free(both);
    unlink(path);
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_cli_compat");
    }
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_cli_compat");
    }
    snprintf(tmp, sizeof tmp, "/tmp/sparq_cli_compat_XXXXXX");
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp failed");
        return test_summary("test_cli_compat");
    }
    test_n_minus_one();
    test_seed();
    test_cache_types();
    test_bare_command();
    test_chat_spellings();
    test_accepted();
    test_version();
    test_shared_pipe();
    char p[600];
    snprintf(p, sizeof p, "%s/out.txt", tmp);
    unlink(p);
    snprintf(p, sizeof p, "%s/err.txt", tmp);
    unlink(p);
    rmdir(tmp);
    return test_summary("test_cli_compat");
}
