/* test_embed_server.c - `sparq serve --embedding`: /v1/embeddings end to
 * end, a server started here on 127.0.0.1 with a free port.
 *
 *  - a string and an array of strings give llama-server's shape (object
 *    "list", data[i].index/object/embedding, model, usage) and vectors
 *    equal, float for float, to sparq_embed's in this process (the same
 *    tokens, pooling, norm, batch and one thread); usage counts the tokens
 *    with BOS, as llama-server's did for the same inputs (28); `sparq
 *    embed --json` prints the same vectors;
 *  - the vectors match llama.cpp's (tests/data/llamacpp/embed/; cosine >=
 *    0.9999, max |diff| <= 1e-3 for unit vectors, 1e-3 of the largest
 *    component for raw ones), and "embd_normalize": -1 gives the raw ones;
 *  - --pooling last serves the last token's vector;
 *  - bad requests are 400s with an OpenAI error object: empty string, empty
 *    array, a number, a non-string in the array, no input, an input past
 *    --max-prompt, more than 256 inputs, unknown fields, an unknown
 *    encoding_format, a bad embd_normalize, malformed JSON;
 *  - the official openai npm client (tests/server/embeddings.test.mjs):
 *    its default base64 request, decoded, and a float one give the same
 *    vectors, and an empty input is its BadRequestError;
 *  - without --embedding: 501 not_supported_error naming --embeddings, as
 *    llama-server answers; --pooling none or an unknown name: exit 2.
 */
#include "sparq.h"
#include "test.h"
#include "test_proc.h"
#include "util/json.h"
#include "util/textbuf.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

static char bin[1024];

typedef proc_server server;

static int start_server(server *s, const char *args)
{
    const int rc = proc_server_start(s, bin, "embed", args);
    CHECK(rc == 0, "server did not start (log %s): serve %s", s->log, args);
    return rc;
}

static int stop_server(server *s) { return proc_server_stop(s); }

/* POST path with body; the status and the malloc'ed body, or -1. */
static int post(int port, const char *path, const char *body, char **out)
{
    *out = NULL;
    int fd = dial(port);
    if (fd < 0) return -1;
    char head[512];
    const size_t bl = strlen(body);
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n", path, bl);
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n || send(fd, body, bl, MSG_NOSIGNAL) != (ssize_t)bl) {
        close(fd);
        return -1;
    }
    text_buf t = { 0 };
    char buf[8192];
    for (double t0 = now(); now() - t0 < 120;) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 1000) <= 0) continue;
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got <= 0) break;
        text_append(&t, buf, (size_t)got);
    }
    close(fd);
    int status = -1;
    char *sep = t.data ? strstr(t.data, "\r\n\r\n") : NULL;
    if (!t.data || sscanf(t.data, "HTTP/1.%*d %d", &status) != 1 || !sep) {
        free(t.data);
        return -1;
    }
    *out = strdup(sep + 4);
    free(t.data);
    return status;
}

/* The request gets status and an OpenAI error object whose message holds want. */
static void expect_error(int port, const char *body, int status, const char *type, const char *want)
{
    char *out = NULL, err[256];
    const int st = post(port, "/v1/embeddings", body, &out);
    json_doc *d = out ? json_parse(out, strlen(out), 0, err, sizeof err) : NULL;
    const json_value *e = d ? json_get(json_root(d), "error") : NULL;
    const char *msg = json_get_str(e, "message", NULL), *ty = json_get_str(e, "type", NULL);
    CHECK(st == status && msg && strstr(msg, want) && ty && !strcmp(ty, type), "%.80s: status %d body %.300s", body,
          st, out ? out : "(none)");
    json_free(d);
    free(out);
}

typedef struct golden {
    const json_doc *doc;
    const json_value *inputs, *embeddings;
} golden;

static json_doc *golden_load(const char *path, golden *g)
{
    size_t n;
    char *text = test_read_file(path, &n), err[256];
    json_doc *d = text ? json_parse(text, n, 0, err, sizeof err) : NULL;
    free(text);
    CHECK(d, "cannot read %s", path);
    if (!d) return NULL;
    g->doc = d;
    g->inputs = json_get(json_root(d), "inputs");
    g->embeddings = json_get(json_root(d), "embeddings");
    CHECK(json_len(g->inputs) == 3 && json_len(g->embeddings) == 3, "%s: three inputs", path);
    return d;
}

/* The request's input field: the golden inputs [first, first + count) as
 * an array (or the one string when as_string). malloc'ed. */
static char *input_json(const golden *g, int first, int count, int as_string)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fputs(as_string ? "" : "[", f);
    for (int i = first; i < first + count; i++) {
        size_t sl;
        const char *s = json_str(json_at(g->inputs, (size_t)i), &sl);
        if (i > first) fputc(',', f);
        json_write_str(f, s ? s : "", s ? sl : 0);
    }
    fputs(as_string ? "" : "]", f);
    fclose(f);
    return buf;
}

/* One response checked against sparq_embed (exact) and the golden vectors
 * (close). norm: the request's; first..: which golden inputs it holds. */
static void check_response(sparq_model *m, const char *resp, const golden *g, int first, int count, int pooling,
                           int norm, int want_tokens)
{
    char err[256];
    json_doc *d = json_parse(resp, strlen(resp), 0, err, sizeof err);
    CHECK(d, "response is not JSON: %.200s", resp);
    if (!d) return;
    const json_value *o = json_root(d), *data = json_get(o, "data"), *usage = json_get(o, "usage");
    const char *obj = json_get_str(o, "object", NULL);
    CHECK(obj && !strcmp(obj, "list") && json_get_str(o, "model", NULL), "shape: %.200s", resp);
    CHECK((int)json_len(data) == count, "%zu items, want %d", json_len(data), count);
    const json_value *pt = json_get(usage, "prompt_tokens"), *tt = json_get(usage, "total_tokens");
    CHECK(pt && tt && pt->u.number == want_tokens && tt->u.number == want_tokens, "usage: want %d tokens: %.300s",
          want_tokens, resp);
    const int E = sparq_model_n_embd(m);
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 1;
    cp.n_batch = 4;
    sparq_context *c = NULL;
    CHECK(sparq_context_create(m, &cp, &c, err, sizeof err) == 0, "context: %s", err);
    float *mine = malloc((size_t)E * sizeof *mine);
    for (int k = 0; c && mine && k < count && k < (int)json_len(data); k++) {
        const json_value *item = json_at(data, (size_t)k), *vec = json_get(item, "embedding"),
                         *idx = json_get(item, "index"), *want = json_at(g->embeddings, (size_t)(first + k));
        const char *io = json_get_str(item, "object", NULL);
        CHECK(idx && idx->u.number == k && io && !strcmp(io, "embedding"), "item %d shape", k);
        CHECK((int)json_len(vec) == E && (int)json_len(want) == E, "item %d: %zu components", k, json_len(vec));
        if ((int)json_len(vec) != E || (int)json_len(want) != E) continue;
        int32_t ids[64];
        const char *text = json_str(json_at(g->inputs, (size_t)(first + k)), NULL);
        const int n = sparq_tokenize(m, text, -1, 1, ids, 64);
        CHECK(n > 0 && n <= 64 && sparq_embed(c, ids, n, pooling, norm, mine) == 0, "embed: %s", sparq_context_error(c));
        int same = 1;
        double ab = 0, aa = 0, bb = 0, md = 0, big = 0;
        for (int i = 0; i < E; i++) {
            const float got = (float)json_at(vec, (size_t)i)->u.number;
            const double w = json_at(want, (size_t)i)->u.number;
            same &= got == mine[i];
            ab += got * w;
            aa += (double)got * got;
            bb += w * w;
            md = fmax(md, fabs(got - w));
            big = fmax(big, fabs(w));
        }
        CHECK(same, "item %d differs from sparq_embed's vector", k);
        const double cs = ab / sqrt(aa * bb), tol = norm == 2 ? 1e-3 : 1e-3 * big;
        CHECK(cs >= 0.9999 && md <= tol, "item %d vs llama.cpp: cosine %.7f max |diff| %.3g", k, cs, md);
    }
    free(mine);
    sparq_context_free(c);
    json_free(d);
}

/* `sparq embed --json` of the golden inputs (one a line of a file), or NULL. */
static char *cli_embed(const char *model, const golden *g, const char *pooling)
{
    char in[] = "/tmp/sparq_test_embed_in_XXXXXX";
    const int fd = mkstemp(in);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    for (size_t i = 0; f && i < json_len(g->inputs); i++) fprintf(f, "%s\n", json_str(json_at(g->inputs, i), NULL));
    if (f) fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s embed -m %s -t 1 -b 4 --pooling %s -f %s --json 2>/dev/null", bin, model, pooling, in);
    FILE *p = popen(cmd, "r");
    text_buf t = { 0 };
    char buf[4096];
    size_t got;
    while (p && (got = fread(buf, 1, sizeof buf, p)) > 0) text_append(&t, buf, got);
    const int st = p ? pclose(p) : -1;
    unlink(in);
    CHECK(st == 0 && t.data, "sparq embed failed: %s", cmd);
    if (st) {
        free(t.data);
        return NULL;
    }
    return t.data;
}

/* The "embedding" arrays of two responses are equal, value for value. */
static int same_vectors(const char *a, const char *b)
{
    char err[256];
    json_doc *da = json_parse(a, strlen(a), 0, err, sizeof err), *db = json_parse(b, strlen(b), 0, err, sizeof err);
    const json_value *x = da ? json_get(json_root(da), "data") : NULL, *y = db ? json_get(json_root(db), "data") : NULL;
    int same = x && y && json_len(x) == json_len(y) && json_len(x) > 0;
    for (size_t i = 0; same && i < json_len(x); i++) {
        const json_value *u = json_get(json_at(x, i), "embedding"), *v = json_get(json_at(y, i), "embedding");
        same = json_len(u) == json_len(v) && json_len(u) > 0;
        for (size_t j = 0; same && j < json_len(u); j++) same = json_at(u, j)->u.number == json_at(v, j)->u.number;
    }
    json_free(da);
    json_free(db);
    return same;
}

/* The official openai npm client (tests/server/embeddings.test.mjs): its
 * default base64 request and a float one give the vectors of float_resp,
 * the server's float answer for inputs (a JSON array). */
static void node_client(int port, const char *inputs, const char *float_resp)
{
    struct stat st;
    if (stat("tests/server/node_modules/openai", &st) != 0) {
        /* first run: install the locked packages (cached by npm afterwards) */
        int rc = system("cd tests/server && timeout 300 npm ci --prefer-offline --no-audit --no-fund >/dev/null 2>&1");
        CHECK(rc == 0, "npm ci in tests/server failed (needs the npm registry once, or its cache)");
        if (rc) return;
    }
    char exp[] = "/tmp/sparq_test_embed_exp_XXXXXX", out[] = "/tmp/sparq_test_embed_node_XXXXXX";
    const int fd = mkstemp(exp), fo = mkstemp(out);
    if (fd < 0 || fo < 0) return;
    close(fo);
    FILE *f = fdopen(fd, "w");
    const char *brace = strrchr(float_resp, '}');
    if (!f || !brace) return;
    /* the response with "inputs" added before its closing brace */
    fprintf(f, "%.*s,\"inputs\":%s}", (int)(brace - float_resp), float_resp, inputs);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cd tests/server && timeout 300 node embeddings.test.mjs http://127.0.0.1:%d/v1 %s >%s 2>&1",
             port, exp, out);
    const int rc = system(cmd);
    size_t n;
    char *text = test_read_file(out, &n);
    unlink(exp);
    unlink(out);
    int pass = 0, summary = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "ok ", 3)) pass++;
        else if (!strncmp(line, "not ok ", 7)) CHECK(0, "openai client: %s", line + 7);
        else if (strstr(line, "embeddings: ")) summary = 1;
        else fprintf(stderr, "node: %s\n", line);
    }
    test_n_pass += pass;
    CHECK(summary && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "the node test did not finish (exit %d)", rc);
    CHECK(pass >= 9, "the node test ran only %d checks", pass);
    free(text);
}

static void embed_requests(sparq_model *m, const char *model, int port, int pooling, const char *tag)
{
    char path[160], body[4096];
    golden g, graw;
    snprintf(path, sizeof path, "tests/data/llamacpp/embed/stories260K-%s-l2.json", tag);
    json_doc *d = golden_load(path, &g);
    snprintf(path, sizeof path, "tests/data/llamacpp/embed/stories260K-%s-raw.json", tag);
    json_doc *draw = golden_load(path, &graw);
    if (!d || !draw) {
        json_free(d);
        json_free(draw);
        return;
    }
    static const int n_tok[3] = { 5, 21, 2 }; /* llama-server's tokens for the golden inputs, BOS included */
    char *in = input_json(&g, 0, 1, 1), *out = NULL;
    snprintf(body, sizeof body, "{\"input\":%s,\"model\":\"x\"}", in ? in : "\"\"");
    CHECK(post(port, "/v1/embeddings", body, &out) == 200, "string input: %.300s", out ? out : "");
    if (out) check_response(m, out, &g, 0, 1, pooling, 2, n_tok[0]);
    free(out);
    free(in);
    in = input_json(&g, 0, 3, 0);
    snprintf(body, sizeof body, "{\"input\":%s}", in ? in : "[]");
    CHECK(post(port, "/v1/embeddings", body, &out) == 200, "array input: %.300s", out ? out : "");
    if (out) check_response(m, out, &g, 0, 3, pooling, 2, n_tok[0] + n_tok[1] + n_tok[2]);
    char *cli = cli_embed(model, &g, tag);
    CHECK(out && cli && same_vectors(out, cli), "/v1/embeddings differs from sparq embed --json --pooling %s", tag);
    free(cli);
    if (out && pooling == SPARQ_POOLING_MEAN) node_client(port, in ? in : "[]", out);
    free(out);
    snprintf(body, sizeof body, "{\"input\":%s,\"embd_normalize\":-1,\"encoding_format\":\"float\"}", in ? in : "[]");
    CHECK(post(port, "/embeddings", body, &out) == 200, "raw: %.300s", out ? out : "");
    if (out) check_response(m, out, &graw, 0, 3, pooling, -1, n_tok[0] + n_tok[1] + n_tok[2]);
    free(out);
    free(in);
    json_free(d);
    json_free(draw);
}

static void bad_requests(int port)
{
    expect_error(port, "{\"input\":\"\"}", 400, "invalid_request_error", "empty string");
    expect_error(port, "{\"input\":[]}", 400, "invalid_request_error", "empty array");
    expect_error(port, "{\"input\":5}", 400, "invalid_request_error", "string or an array of strings");
    expect_error(port, "{\"input\":[\"Lily\",3]}", 400, "invalid_request_error", "input 1 is not");
    expect_error(port, "{\"input\":[[1,2]]}", 400, "invalid_request_error", "string or an array of strings");
    expect_error(port, "{\"model\":\"x\"}", 400, "invalid_request_error", "'input' is required");
    expect_error(port, "{\"input\":\"Lily\",\"dimensions\":8}", 400, "invalid_request_error", "dimensions");
    expect_error(port, "{\"input\":\"Lily\",\"temperature\":1}", 400, "invalid_request_error", "unknown field");
    expect_error(port, "{\"input\":\"Lily\",\"encoding_format\":\"binary\"}", 400, "invalid_request_error", "base64");
    expect_error(port, "{\"input\":\"Lily\",\"embd_normalize\":0.5}", 400, "invalid_request_error", "embd_normalize");
    expect_error(port, "{\"input\":\"Lily\",\"input\":\"Ben\"}", 400, "invalid_request_error", "twice");
    expect_error(port, "{\"input\":", 400, "invalid_request_error", "json");
    expect_error(port, "[\"Lily\"]", 400, "invalid_request_error", "object");
    /* --max-prompt 40: 60 words are more tokens than that */
    text_buf t = { 0 };
    text_append(&t, "{\"input\":\"", 10);
    for (int i = 0; i < 60; i++) text_append(&t, "dog ", 4);
    text_append(&t, "\"}", 3);
    expect_error(port, t.data, 400, "invalid_request_error", "the limit is 40");
    free(t.data);
    text_buf many = { 0 };
    text_append(&many, "{\"input\":[", 10);
    for (int i = 0; i < 257; i++) text_append(&many, i ? ",\"a\"" : "\"a\"", i ? 4 : 3);
    text_append(&many, "]}", 3);
    expect_error(port, many.data, 400, "invalid_request_error", "more than 256");
    free(many.data);
}

static void bad_flags(const char *model)
{
    static const char *const pools[] = { "none", "rank", "avg" };
    for (int i = 0; i < 3; i++) {
        char cmd[2200];
        snprintf(cmd, sizeof cmd, "%s serve -m %s --port 0 --embedding --pooling %s >/dev/null 2>&1", bin, model,
                 pools[i]);
        const int st = system(cmd);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--pooling %s: status %d", pools[i], st);
    }
}

int main(void)
{
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_embed_server");
    }
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_embed_server");
    }
    signal(SIGPIPE, SIG_IGN);
    sparq_model *m = NULL;
    char err[256], args[2048];
    CHECK(sparq_model_load(model, &m, err, sizeof err) == 0, "load: %s", err);
    if (!m) return test_summary("test_embed_server");
    static const struct { const char *flags, *tag; int pooling; } runs[] = {
        { "--embedding", "mean", SPARQ_POOLING_MEAN }, /* mean is the default */
        { "--embeddings --pooling last", "last", SPARQ_POOLING_LAST },
    };
    for (int r = 0; r < 2; r++) {
        server s;
        snprintf(args, sizeof args, "-m %s -c 64 -b 4 -t 1 --max-prompt 40 %s", model, runs[r].flags);
        if (start_server(&s, args) == 0) {
            embed_requests(m, model, s.port, runs[r].pooling, runs[r].tag);
            if (r == 0) bad_requests(s.port);
            CHECK(stop_server(&s) == 0, "server exit status");
        }
    }
    server s;
    snprintf(args, sizeof args, "-m %s -c 64 -t 1", model);
    if (start_server(&s, args) == 0) {
        expect_error(s.port, "{\"input\":\"Lily\"}", 501, "not_supported_error", "--embeddings");
        CHECK(stop_server(&s) == 0, "server exit status");
    }
    bad_flags(model);
    sparq_model_free(m);
    return test_summary("test_embed_server");
}
