/* test_bench_prefill.c - `sparq bench prefill`, `bench peak` and `bench membw` as a
 * user runs them (binary from $SPARQ_BUILD, default build/) on the tiny
 * model: the shape of their JSON and CSV output and the arithmetic that
 * ties its columns together (tok/s = n / time, GFLOP/s = GFLOP / time, the
 * depth adding exactly the attention flops of the extra keys).
 */
#include "test.h"
#include "sparq.h"
#include "tensor/quant.h"
#include "util/json.h"
#include "util/paths.h"

#include <sys/wait.h>
#include <unistd.h>

static char bin[1024];
static char tmpdir[] = "/tmp/sparq_bench_pp_XXXXXX"; /* mkdtemp: suites may run at once */

static int run(const char *args, char **out)
{
    char cmd[4096], path[256];
    snprintf(path, sizeof path, "%s/out.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s/err.txt", bin, args, path, tmpdir);
    int st = system(cmd);
    size_t n;
    *out = test_read_file(path, &n);
    if (!*out) *out = calloc(1, 1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static double num(const json_value *row, const char *key);

/* bench membw: one row per (threads, streams), the stream count in the row's
 * name, a bandwidth that is the bytes over the median time; a nonsense
 * stream count is refused. */
static void test_membw(void)
{
    char *out, err[256];
    CHECK(run("bench membw --size 16 -t 1 --streams 1,4 --reps 3 --warmup 1 --json", &out) == 0, "bench membw exits 0");
    json_doc *d = json_parse(out, strlen(out), 0, err, sizeof err);
    CHECK(d != NULL, "bench membw --json is JSON: %s", err);
    if (d) {
        const json_value *root = json_root(d);
        CHECK(root->type == JSON_ARRAY && json_len(root) == 2, "2 rows, got %zu", json_len(root));
        for (size_t i = 0; i < json_len(root); i++) {
            const json_value *r = json_at(root, i);
            const char *pol = json_get_str(r, "policy", NULL);
            CHECK(pol && strcmp(pol, i == 0 ? "read" : "read-x4") == 0, "row %zu: %s", i, pol ? pol : "?");
            CHECK(num(r, "bytes_counted") == 16 << 20, "row %zu: 16 MiB read", i);
            CHECK_NEAR(num(r, "gbps"), num(r, "bytes_counted") / (num(r, "median_us") * 1e3),
                       1e-3 * num(r, "gbps"));
        }
        json_free(d);
    }
    free(out);
    CHECK(run("bench membw --size 16 --streams 0", &out) != 0, "--streams 0 is refused");
    free(out);
}

static double num(const json_value *row, const char *key)
{
    const json_value *v = json_get(row, key);
    return v && v->type == JSON_NUMBER ? v->u.number : NAN;
}

static void test_prefill(const char *model)
{
    char args[2048], *out, err[256];
    snprintf(args, sizeof args, "bench prefill -m %s -p 16,33 -d 0,8 -t 1 -r 2 --warmup 0 --json", model);
    CHECK(run(args, &out) == 0, "bench prefill exits 0");
    json_doc *d = json_parse(out, strlen(out), 0, err, sizeof err);
    CHECK(d != NULL, "bench prefill --json is JSON: %s", err);
    if (!d) { free(out); return; }
    const json_value *root = json_root(d);
    CHECK(root->type == JSON_ARRAY && json_len(root) == 4, "4 rows (2 depths x 2 prompts), got %zu", json_len(root));
    sparq_model *m = NULL;
    CHECK(sparq_model_load(model, &m, err, sizeof err) == 0, "load: %s", err);
    double g[2][2] = { { NAN, NAN }, { NAN, NAN } };
    for (size_t i = 0; m && i < json_len(root); i++) {
        const json_value *r = json_at(root, i);
        const double n = num(r, "n_prompt"), dep = num(r, "n_depth"), ms = num(r, "ms");
        char want[16];
        snprintf(want, sizeof want, "pp%d", (int)n);
        const char *test = json_get_str(r, "test", NULL);
        CHECK(test && strcmp(test, want) == 0, "row %zu test %s, want %s", i, test ? test : "(none)", want);
        CHECK((n == 16 || n == 33) && (dep == 0 || dep == 8), "row %zu: n_prompt %g, n_depth %g", i, n, dep);
        CHECK(num(r, "threads") == 1 && num(r, "reps") == 2, "row %zu: threads and reps as asked", i);
        CHECK(ms > 0 && num(r, "ms_min") <= ms && ms <= num(r, "ms_max"), "row %zu: min <= median <= max", i);
        CHECK_NEAR(num(r, "tok_s"), n / (ms / 1e3), 1e-3 * num(r, "tok_s") + 0.05);
        CHECK_NEAR(num(r, "gflop_s"), num(r, "gflop") / (ms / 1e3), 1e-3 * num(r, "gflop_s") + 1e-3);
        const char *model_name = json_get_str(r, "model", NULL);
        CHECK(model_name && strcmp(model_name, "stories260K.gguf") == 0, "row %zu: model name", i);
        g[n == 33][dep == 8] = num(r, "gflop");
    }
    if (m) {
        /* 8 more keys for each of the n queries: 2 (q.k) + 2 (p.v) flops x head_dim per query head */
        const double per_key = 4.0 * sparq_model_head_dim(m) * sparq_model_n_head(m) * sparq_model_n_layer(m) / 1e9;
        CHECK_NEAR(g[0][1] - g[0][0], per_key * 16 * 8, 1e-12);
        CHECK_NEAR(g[1][1] - g[1][0], per_key * 33 * 8, 1e-12);
        CHECK(g[1][0] > 2 * g[0][0], "33 tokens cost more than twice 16 (weights + quadratic attention)");
        sparq_model_free(m);
    }
    json_free(d);
    free(out);

    snprintf(args, sizeof args, "bench prefill -m %s -p 8 -t 1 -r 1 --warmup 0 --csv", model);
    CHECK(run(args, &out) == 0, "bench prefill --csv exits 0");
    const char *header = "test,model,type,n_prompt,n_depth,threads,reps,ms,ms_min,ms_max,tok_s,gflop,gflop_s\n";
    CHECK(strncmp(out, header, strlen(header)) == 0, "csv header: %.90s", out);
    const char *line2 = strchr(out, '\n');
    int commas = 0;
    for (const char *p = line2 ? line2 + 1 : ""; *p && *p != '\n'; p++) commas += *p == ',';
    CHECK(line2 && strncmp(line2 + 1, "pp8,stories260K.gguf,F32,8,0,1,1,", 33) == 0 && commas == 12,
          "csv row: %s", line2 ? line2 + 1 : "(none)");
    free(out);

    CHECK(run("bench prefill -m /nonexistent.gguf -p 8", &out) != 0, "a missing model fails");
    free(out);
    snprintf(args, sizeof args, "bench prefill -m %s -r 0", model);
    CHECK(run(args, &out) == 2 && out[0] == 0, "-r 0 is a usage error");
    free(out);
}

static void test_peak(void)
{
    char *out, err[256];
    CHECK(run("bench peak --iters 2000 -r 1 -t 1 --json", &out) == 0, "bench peak exits 0");
    {
        char p[256], want[64], *e;
        size_t n;
        snprintf(p, sizeof p, "%s/err.txt", tmpdir);
        snprintf(want, sizeof want, "bench peak: cpu %s\n", quant_simd_name());
        e = test_read_file(p, &n);
        CHECK(e && strstr(e, want), "bench peak names the SIMD level: %s", e ? e : "(no stderr)");
        free(e);
    }
    json_doc *d = json_parse(out, strlen(out), 0, err, sizeof err);
    CHECK(d != NULL, "bench peak --json is JSON: %s", err);
    if (!d) { free(out); return; }
    const json_value *root = json_root(d);
    if (strcmp(quant_simd_name(), "avx512") == 0) {
        const char *names[] = { "int8-vnni", "f32-fma", "gemm-q8_0" };
        CHECK(json_len(root) == 3, "three peak rows, got %zu", json_len(root));
        for (size_t i = 0; i < json_len(root) && i < 3; i++) {
            const json_value *r = json_at(root, i);
            const char *t = json_get_str(r, "test", NULL);
            CHECK(t && strcmp(t, names[i]) == 0, "peak row %zu is %s", i, names[i]);
            CHECK(num(r, "gflop_s") > 0 && num(r, "gflop") > 0, "peak row %zu has a rate", i);
            const json_value *ts = json_get(r, "tok_s");
            CHECK(ts && ts->type == JSON_NULL, "peak rows have no tok/s (null)");
        }
        /* the 12 x 2000 vpdpbusd of 128 ops each */
        CHECK_NEAR(num(json_at(root, 0), "gflop"), 12.0 * 2000 * 128 / 1e9, 1e-12);
    } else if (strcmp(quant_simd_name(), "avx2") == 0) { /* no AVX-512 loops; the AVX2 GEMM */
        const char *t = json_len(root) == 1 ? json_get_str(json_at(root, 0), "test", NULL) : NULL;
        CHECK(t && strcmp(t, "gemm-q8_0") == 0 && num(json_at(root, 0), "gflop_s") > 0,
              "AVX2: the gemm-q8_0 row only, got %zu rows", json_len(root));
    } else {
        CHECK(json_len(root) == 0, "no SIMD: no peak rows");
    }
    json_free(d);
    free(out);
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_bench_prefill");
    }
    if (!mkdtemp(tmpdir)) {
        CHECK(0, "mkdtemp failed");
        return test_summary("test_bench_prefill");
    }
    test_membw();
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
    } else {
        test_prefill(model);
        test_peak();
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_summary("test_bench_prefill");
}
