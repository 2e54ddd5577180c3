/* test_embed.c - sparq_embed against llama.cpp's embeddings of the same
 * GGUF (tests/data/llamacpp/embed/, made by llama-server --embedding
 * --pooling P; README.md there has the commands), and the identities that
 * tie the poolings and norms together.
 *
 * Tolerance: llama.cpp and sparq run the same f32/f16 arithmetic in a
 * different order (its matmuls accumulate in other blocks), so a vector is
 * accepted when its cosine with llama.cpp's is >= 0.9999 and no component
 * differs by more than 1e-3 of the vector's largest magnitude (raw) or
 * 1e-3 absolute (unit vectors).
 */
#include "test.h"
#include "sparq.h"
#include "util/json.h"

#include <stdint.h>

enum { MAX_TOK = 256 };

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0;
}

static double max_abs(const float *a, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

static double max_diff(const float *a, const float *b, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) m = fabs((double)a[i] - b[i]) > m ? fabs((double)a[i] - b[i]) : m;
    return m;
}

static sparq_context *new_ctx(sparq_model *m, int n_batch)
{
    char err[256];
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 1;
    cp.n_batch = n_batch;
    sparq_context *c = NULL;
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) fprintf(stderr, "context: %s\n", err);
    return c;
}

/* One golden file: every input's tokens and embedding compared with
 * sparq's, in one prefill and in prefill chunks of 3 tokens. */
static void check_golden(sparq_model *m, const char *model_name, const char *file)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "tests/data/llamacpp/embed/%s-%s.json", model_name, file);
    size_t len;
    char *text = test_read_file(path, &len);
    CHECK(text != NULL, "cannot read %s (part of the repository)", path);
    if (!text) return;
    json_doc *d = json_parse(text, len, 0, err, sizeof err);
    CHECK(d != NULL, "%s: %s", path, err);
    if (!d) { free(text); return; }
    const json_value *root = json_root(d);
    const int pooling = sparq_pooling_find(json_get_str(root, "pooling", NULL));
    const json_value *nv = json_get(root, "normalize");
    const int norm = nv && nv->type == JSON_NUMBER ? (int)nv->u.number : -3;
    const json_value *inputs = json_get(root, "inputs"), *toks = json_get(root, "tokens"),
                     *embs = json_get(root, "embeddings");
    CHECK(pooling > 0 && norm > -3 && json_len(inputs) > 0 && json_len(inputs) == json_len(toks) &&
              json_len(inputs) == json_len(embs), "%s: malformed", path);
    const int E = sparq_model_n_embd(m);
    float *got = malloc((size_t)E * sizeof *got), *got3 = malloc((size_t)E * sizeof *got3),
          *want = malloc((size_t)E * sizeof *want);
    sparq_context *c = new_ctx(m, 512), *c3 = new_ctx(m, 3);
    CHECK(got && got3 && want && c && c3, "setup");
    for (size_t k = 0; got && got3 && want && c && c3 && k < json_len(inputs); k++) {
        const char *in = json_str(json_at(inputs, k), NULL);
        int32_t ids[MAX_TOK];
        const int n = sparq_tokenize(m, in, -1, 1, ids, MAX_TOK);
        const json_value *tk = json_at(toks, k), *ev = json_at(embs, k);
        int same = n == (int)json_len(tk);
        for (int i = 0; same && i < n; i++) same = ids[i] == (int32_t)json_at(tk, (size_t)i)->u.number;
        CHECK(same, "%s: input %zu tokenizes differently from llama.cpp (%d vs %zu tokens)", path, k, n, json_len(tk));
        CHECK((int)json_len(ev) == E, "%s: input %zu: %zu components, the model has %d", path, k, json_len(ev), E);
        if (!same || (int)json_len(ev) != E) continue;
        for (int i = 0; i < E; i++) want[i] = (float)json_at(ev, (size_t)i)->u.number;
        CHECK(sparq_embed(c, ids, n, pooling, norm, got) == 0, "%s", sparq_context_error(c));
        CHECK(sparq_embed(c3, ids, n, pooling, norm, got3) == 0, "%s", sparq_context_error(c3));
        const double cs = cosine(got, want, E), md = max_diff(got, want, E);
        const double tol = norm < 0 ? 1e-3 * max_abs(want, E) : 1e-3;
        CHECK(cs >= 0.9999 && md <= tol, "%s: input %zu: cosine %.7f, max |diff| %.3g (tol %.3g)", path, k, cs, md,
              tol);
        CHECK(cosine(got3, want, E) >= 0.9999 && max_diff(got3, want, E) <= tol,
              "%s: input %zu in chunks of 3: cosine %.7f, max |diff| %.3g", path, k, cosine(got3, want, E),
              max_diff(got3, want, E));
        fprintf(stderr, "%s %-5s norm %2d input %zu: %2d tokens, cosine %.8f, max |diff| %.2e (max |x| %.3g)\n",
                model_name, sparq_pooling_name(pooling), norm, k, n, cs, md, max_abs(want, E));
    }
    sparq_context_free(c);
    sparq_context_free(c3);
    free(got);
    free(got3);
    free(want);
    json_free(d);
    free(text);
}

/* Poolings are views of the per-token states (none): mean their average,
 * cls the first row, last the last; the norms do what they say. */
static void check_identities(sparq_model *m)
{
    const int E = sparq_model_n_embd(m);
    int32_t ids[MAX_TOK];
    const int n = sparq_tokenize(m, "One day, a girl named Lily found a needle in her room.", -1, 1, ids, MAX_TOK);
    sparq_context *c = new_ctx(m, 512);
    float *rows = malloc((size_t)n * E * sizeof *rows), *v = malloc((size_t)E * sizeof *v);
    CHECK(c && rows && v && n > 4, "setup");
    if (!c || !rows || !v || n <= 4) goto out;
    CHECK(sparq_embed(c, ids, n, SPARQ_POOLING_NONE, -1, rows) == 0, "%s", sparq_context_error(c));
    CHECK(sparq_context_pos(c) == n, "the tokens stay cached: pos %lld", (long long)sparq_context_pos(c));
    CHECK(sparq_embed(c, ids, n, SPARQ_POOLING_MEAN, -1, v) == 0, "%s", sparq_context_error(c));
    double worst = 0;
    for (int i = 0; i < E; i++) {
        double s = 0;
        for (int t = 0; t < n; t++) s += rows[(size_t)t * E + i];
        worst = fabs(s / n - v[i]) > worst ? fabs(s / n - v[i]) : worst;
    }
    CHECK(worst <= 1e-6 * (1 + max_abs(v, E)), "mean is the rows' average: max |diff| %g", worst);
    CHECK(sparq_embed(c, ids, n, SPARQ_POOLING_CLS, -1, v) == 0 && !memcmp(v, rows, (size_t)E * sizeof *v),
          "cls is the first row");
    CHECK(sparq_embed(c, ids, n, SPARQ_POOLING_LAST, -1, v) == 0 &&
              !memcmp(v, rows + (size_t)(n - 1) * E, (size_t)E * sizeof *v), "last is the last row");
    const double raw_max = max_abs(rows + (size_t)(n - 1) * E, E);
    for (int p = 0; p <= 3; p++) {
        CHECK(sparq_embed(c, ids, n, SPARQ_POOLING_LAST, p, v) == 0, "%s", sparq_context_error(c));
        double s = 0;
        for (int i = 0; i < E; i++) s += p == 0 ? 0 : pow(fabs(v[i]), p);
        if (p == 0) CHECK_NEAR(max_abs(v, E), 32760.0, 0.05);
        else CHECK_NEAR(pow(s, 1.0 / p), 1.0, 1e-5);
        const float *raw = rows + (size_t)(n - 1) * E;
        CHECK(cosine(v, raw, E) > 0.999999, "norm %d keeps the direction", p);
    }
    CHECK(raw_max > 0, "a non-zero state");
    /* pooling none normalises each row on its own */
    CHECK(sparq_embed(c, ids, n, SPARQ_POOLING_NONE, 2, rows) == 0, "%s", sparq_context_error(c));
    for (int t = 0; t < n; t++) {
        double s = 0;
        for (int i = 0; i < E; i++) s += (double)rows[(size_t)t * E + i] * rows[(size_t)t * E + i];
        CHECK_NEAR(sqrt(s), 1.0, 1e-5);
    }
out:
    free(rows);
    free(v);
    sparq_context_free(c);
}

static void check_errors(sparq_model *m)
{
    const int E = sparq_model_n_embd(m);
    float *v = malloc((size_t)E * 200 * sizeof *v);
    sparq_context *c = new_ctx(m, 512);
    int32_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = 1 + i % 100;
    CHECK(v && c, "setup");
    if (!v || !c) goto out;
    CHECK(sparq_embed(c, ids, 0, SPARQ_POOLING_MEAN, 2, v) == -1 && strstr(sparq_context_error(c), "no tokens"),
          "no tokens: %s", sparq_context_error(c));
    CHECK(sparq_embed(c, ids, 129, SPARQ_POOLING_MEAN, 2, v) == -1 && strstr(sparq_context_error(c), "context size"),
          "too long: %s", sparq_context_error(c));
    CHECK(sparq_embed(c, ids, 128, SPARQ_POOLING_MEAN, 2, v) == 0, "exactly the context: %s", sparq_context_error(c));
    CHECK(sparq_embed(c, ids, 4, 7, 2, v) == -1 && strstr(sparq_context_error(c), "pooling"), "bad pooling: %s",
          sparq_context_error(c));
    ids[2] = sparq_model_n_vocab(m);
    CHECK(sparq_embed(c, ids, 4, SPARQ_POOLING_MEAN, 2, v) == -1 && strstr(sparq_context_error(c), "outside"),
          "bad id: %s", sparq_context_error(c));
    CHECK(sparq_pooling_find("mean") == SPARQ_POOLING_MEAN && sparq_pooling_find("none") == SPARQ_POOLING_NONE &&
              sparq_pooling_find("rank") == -1 && sparq_pooling_find(NULL) == -1 && !sparq_pooling_name(4) &&
              !sparq_pooling_name(-1) && !strcmp(sparq_pooling_name(SPARQ_POOLING_LAST), "last"),
          "pooling names");
out:
    free(v);
    sparq_context_free(c);
}

int main(void)
{
    static const char *const models[] = { "stories260K", "tiny-d64" };
    static const char *const files[] = { "mean-l2", "mean-raw", "cls-l2", "cls-raw", "last-l2", "last-raw" };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[256], err[256];
        snprintf(path, sizeof path, "models/%s.gguf", models[i]);
        sparq_model *m = NULL;
        CHECK(sparq_model_load(path, &m, err, sizeof err) == 0, "%s", err);
        if (!m) continue;
        for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) check_golden(m, models[i], files[f]);
        if (i == 0) {
            check_identities(m);
            check_errors(m);
        }
        sparq_model_free(m);
    }
    return test_summary("test_embed");
}
