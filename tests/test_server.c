/* test_server.c - `sparq serve` end to end, started and stopped here on
 * 127.0.0.1 with a free port, every wait bounded.
 *
 *  - raw HTTP through a small socket client: health, malformed JSON, wrong
 *    method, unknown path, huge body, invalid UTF-8, huge numbers, wrong
 *    types, missing API key, /tokenize and /detokenize round trip, metrics;
 *  - greedy completions equal `sparq run`'s output for the same prompt and
 *    policy (the reference is the CLI, a separate code path);
 *  - the official openai npm client (tests/server/openai.test.mjs): shapes,
 *    streaming, logprobs, stop strings, chat, errors, and 16 concurrent
 *    streams with different policies each equal to the request alone;
 *  - a second server with one slot and no queue: a request beyond it gets
 *    503 + Retry-After; a client that disconnects mid-stream frees its slot
 *    (the next request is served long before the abandoned one would have
 *    finished, and the cancellation is counted);
 *  - fields the server does not implement (tools, suffix, misspelt
 *    names) and schema keywords outside the subset are 400s naming them; CORS headers
 *    on every answer and OPTIONS preflights without the API key;
 *  - n choices: equal at temperature 0, choice i == seed + i alone when
 *    sampled, usage over all, streamed per index; n past the slots is a 400;
 *  - prefill order and a waiting request's hang-up, on servers whose
 *    scheduler the test steps through a FIFO (SPARQ_TEST_PREFILL_GATE):
 *    no sleeps, the state each check is about is held, and a control
 *    run shows each check can fail;
 *  - SIGTERM: both servers exit with status 0.
 */
#include "sparq.h"
#include "test.h"
#include "test_proc.h"
#include "util/json.h"
#include "util/paths.h"
#include "util/textbuf.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char bin[1024];
static const char *key = "test-key-123";


/* ---- the server process ------------------------------------------------------ */

typedef proc_server server;

static int start_server(server *s, const char *args)
{
    const int rc = proc_server_start(s, bin, "server", args);
    if (rc) { /* counted here, so a caller's `if (start_server(..) == 0)` block is never skipped silently */
        test_n_fail++;
        fprintf(stderr, "FAIL %s:%d: server did not start (log %s): serve %s\n", __FILE__, __LINE__, s->log, args);
    }
    return rc;
}

static int stop_server(server *s) { return proc_server_stop(s); }

/* ---- a minimal HTTP client ---------------------------------------------------- */


static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

typedef struct resp {
    int   status;
    char *head, *body;   /* malloc'ed                                     */
} resp;

/* Reads until the server closes (Connection: close), at most 120 s. */
static int read_resp(int fd, resp *r)
{
    text_buf t = { 0 };
    char buf[8192];
    for (double t0 = now(); now() - t0 < 120;) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 1000) <= 0) continue;
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got <= 0) break;
        text_append(&t, buf, (size_t)got);
    }
    memset(r, 0, sizeof *r);
    if (!t.data || sscanf(t.data, "HTTP/1.%*d %d", &r->status) != 1) {
        free(t.data);
        return -1;
    }
    char *sep = strstr(t.data, "\r\n\r\n");
    r->body = strdup(sep ? sep + 4 : "");
    if (sep) *sep = 0;
    r->head = t.data;
    return 0;
}

/* One request; body may be NULL. auth: send the API key. */
static int http(int port, const char *method, const char *path, const char *body, size_t body_len, int auth, resp *r)
{
    int fd = dial(port);
    if (fd < 0) return -1;
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, auth ? "Authorization: Bearer " : "", auth ? key : "", auth ? "\r\n" : "",
                     body ? body_len : 0);
    int rc = send_all(fd, head, (size_t)n);
    if (!rc && body) send_all(fd, body, body_len); /* the server may answer early and close */
    rc = read_resp(fd, r);
    close(fd);
    return rc;
}

static void resp_free(resp *r)
{
    free(r->head);
    free(r->body);
}

/* The body is an OpenAI error object with a message containing want. */
static int is_error(const resp *r, const char *want)
{
    char err[256];
    json_doc *d = json_parse(r->body, strlen(r->body), 0, err, sizeof err);
    if (!d) return 0;
    const json_value *e = json_get(json_root(d), "error");
    const char *msg = json_get_str(e, "message", NULL);
    const json_value *type = json_get(e, "type"), *code = json_get(e, "code");
    int ok = msg && strstr(msg, want) && type && type->type == JSON_STRING && code;
    json_free(d);
    return ok;
}

static void expect_error(int port, const char *method, const char *path, const char *body, int auth, int status,
                         const char *want, const char *name)
{
    resp r;
    int rc = http(port, method, path, body, body ? strlen(body) : 0, auth, &r);
    CHECK(rc == 0, "%s: no response", name);
    if (rc) return;
    CHECK(r.status == status && is_error(&r, want), "%s: status %d body %s", name, r.status, r.body);
    resp_free(&r);
}

/* The "text" of a completion response (malloc'ed), or NULL. */
static char *completion_text(const char *body)
{
    char err[256];
    json_doc *d = json_parse(body, strlen(body), 0, err, sizeof err);
    if (!d) return NULL;
    size_t n = 0;
    const char *t = json_get_str(json_at(json_get(json_root(d), "choices"), 0), "text", &n);
    char *out = t ? strndup(t, n) : NULL;
    json_free(d);
    return out;
}

/* ---- `sparq run` as the reference ------------------------------------------------ */

typedef struct gcase {
    const char *prompt;
    const char *run_args;   /* the policy as sparq run options          */
    const char *json;       /* the same as the request's "sparq" field  */
    char       *text;       /* what sparq run printed                   */
} gcase;

static char *run_capture(const char *args)
{
    char out[64] = "/tmp/sparq_test_server_run_XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0) return NULL;
    close(fd);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s run %s >%s 2>/dev/null", bin, args, out);
    int st = system(cmd);
    size_t n;
    char *text = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ? test_read_file(out, &n) : NULL;
    unlink(out);
    if (text && n > 0 && text[n - 1] == '\n') text[n - 1] = 0; /* run ends its output with a newline */
    return text;
}

static void json_str_to(FILE *f, const char *s) { json_write_str(f, s, strlen(s)); }

/* A model without a chat template (stories260K) and no --chat-template:
 * /v1/chat/completions answers in chatml, as llama-server does, and the
 * log says so once. The reply equals `sparq run --chat --chat-template
 * chatml`'s, and two requests leave one note. */
static void chat_fallback(const char *model, const server *s)
{
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story\"}], "
                       "\"max_tokens\": 12, \"temperature\": 0}";
    char args[2048];
    snprintf(args, sizeof args, "-m %s --chat --chat-template chatml -p 'Tell me a story' -n 12 --temp 0 -t 1", model);
    char *want = run_capture(args);
    CHECK(want != NULL, "sparq run --chat --chat-template chatml failed");
    for (int i = 0; i < 2; i++) {
        resp r;
        int rc = http(s->port, "POST", "/v1/chat/completions", body, strlen(body), 1, &r);
        CHECK(rc == 0 && r.status == 200, "chat without a template: status %d %s", rc ? -1 : r.status,
              rc ? "" : r.body);
        if (rc) continue;
        char err[256];
        json_doc *d = json_parse(r.body, strlen(r.body), 0, err, sizeof err);
        size_t n = 0;
        const char *got = d ? json_get_str(json_get(json_at(json_get(json_root(d), "choices"), 0), "message"),
                                           "content", &n) : NULL;
        CHECK(got && want && strlen(want) == n && memcmp(got, want, n) == 0,
              "chat reply '%.*s' is sparq run --chat-template chatml's '%s'", got ? (int)n : 0, got ? got : "",
              want ? want : "");
        json_free(d);
        resp_free(&r);
    }
    free(want);
    size_t n;
    char *log = test_read_file(s->log, &n);
    int notes = 0;
    for (const char *q = log; q && (q = strstr(q, "no chat template; using chatml")) != NULL; q++) notes++;
    CHECK(notes == 1, "the chatml fallback is said once in the log (%d times): %s", notes, log ? log : "");
    free(log);
}

/* ---- the tests ------------------------------------------------------------------- */

static void raw_http(int port)
{
    resp r;
    /* a slow client: half a request, then silence, held open throughout */
    int slow = dial(port);
    const char *half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro";
    CHECK(slow >= 0 && send_all(slow, half, strlen(half)) == 0, "slow client connect");
    CHECK(http(port, "GET", "/health", NULL, 0, 0, &r) == 0 && r.status == 200 && strstr(r.body, "ok"), "health");
    resp_free(&r);
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\",", 1, 400, "json", "truncated JSON");
    expect_error(port, "POST", "/v1/completions", "[1,2,3]", 1, 400, "object", "array body");
    expect_error(port, "POST", "/v1/completions", "", 1, 400, "json", "empty body");
    expect_error(port, "GET", "/v1/completions", NULL, 1, 405, "POST", "wrong method");
    expect_error(port, "DELETE", "/v1/models", NULL, 1, 405, "GET", "wrong method on models");
    expect_error(port, "GET", "/v1/nothing", NULL, 1, 404, "no endpoint", "unknown path");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\"}", 0, 401, "API key", "no API key");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\"}", 1, 400, "UTF-8", "invalid UTF-8");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1e999}", 1, 400, "range",
                 "huge number");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 99999999999}", 1, 400,
                 "max_tokens", "huge max_tokens");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": -1}", 1, 400, "max_tokens",
                 "negative max_tokens");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"top_k\": 2.5}", 1, 400, "top_k",
                 "fractional top_k");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": 42}", 1, 400, "prompt", "prompt of a wrong type");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": [1, 99999999]}", 1, 400, "token",
                 "token id out of range");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"stream\": \"yes\"}", 1, 400, "stream",
                 "stream of a wrong type");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"stop\": [\"\"]}", 1, 400, "stop",
                 "empty stop string");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"sparq\": {\"attn\": \"sparq\", \"bogus\": 1}}",
                 1, 400, "unknown field", "unknown sparq field");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"sparq\": {\"attn\": \"sparq\", \"r\": 1000}}",
                 1, 400, "exceeds head size", "policy parameter rejected by the library");
    expect_error(port, "POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}",
                 1, 400, "role", "bad chat role");
    expect_error(port, "POST", "/v1/chat/completions", "{\"messages\": \"hi\"}", 1, 400, "messages", "bad messages");
    /* deep nesting, a body over the limit (65536 bytes here) */
    char deep[4096];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    expect_error(port, "POST", "/v1/completions", deep, 1, 400, "json", "deep nesting");
    const size_t big = 200000;
    char *huge = malloc(big + 1);
    if (huge) {
        memset(huge, ' ', big);
        memcpy(huge, "{\"prompt\": \"", 12);
        huge[big - 2] = '"';
        huge[big - 1] = '}';
        huge[big] = 0;
        CHECK(http(port, "POST", "/v1/completions", huge, big, 1, &r) == 0 && r.status == 413 &&
                  is_error(&r, "exceeds the limit"), "huge body: %d %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        free(huge);
    }
    /* tokenize and detokenize invert each other */
    CHECK(http(port, "POST", "/tokenize", "{\"content\": \"Once upon a time\"}", 31, 1, &r) == 0 && r.status == 200,
          "tokenize");
    char err[256];
    json_doc *d = r.body ? json_parse(r.body, strlen(r.body), 0, err, sizeof err) : NULL;
    const json_value *toks = json_get(d ? json_root(d) : NULL, "tokens");
    CHECK(toks && json_len(toks) >= 3, "tokenize: %s", r.body);
    if (toks) {
        char body[1024];
        int n = snprintf(body, sizeof body, "{\"tokens\": [");
        for (size_t i = 0; i < json_len(toks); i++)
            n += snprintf(body + n, sizeof body - n, "%s%d", i ? "," : "", (int)json_at(toks, i)->u.number);
        snprintf(body + n, sizeof body - n, "]}");
        resp r2;
        CHECK(http(port, "POST", "/detokenize", body, strlen(body), 1, &r2) == 0 && r2.status == 200 &&
                  strstr(r2.body, "Once upon a time"), "detokenize: %s", r2.body);
        resp_free(&r2);
    }
    json_free(d);
    resp_free(&r);
    CHECK(http(port, "GET", "/health", NULL, 0, 0, &r) == 0 && r.status == 200, "health beside a slow client");
    resp_free(&r);
    if (slow >= 0) close(slow);
}

/* A request written out whole (head and body), its response. */
static int raw_request(int port, const char *text, resp *r)
{
    int fd = dial(port);
    if (fd < 0) return -1;
    int rc = send_all(fd, text, strlen(text));
    if (!rc) rc = read_resp(fd, r);
    close(fd);
    return rc;
}

/* A POST with the key, its parsed JSON body (caller frees) and status. */
static json_doc *post_json(int port, const char *path, const char *body, int *status)
{
    resp r;
    *status = -1;
    if (http(port, "POST", path, body, strlen(body), 1, &r)) return NULL;
    *status = r.status;
    char err[256];
    json_doc *d = json_parse(r.body, strlen(r.body), 0, err, sizeof err);
    resp_free(&r);
    return d;
}

/* choices[i].text (or .message.content) of a parsed reply, or "" */
static const char *choice_text(const json_doc *d, size_t i)
{
    const json_value *c = json_at(json_get(json_root(d), "choices"), i);
    const char *t = json_get_str(c, "text", NULL);
    if (!t) t = json_get_str(json_get(c, "message"), "content", NULL);
    return t ? t : "";
}

static int usage_of(const json_doc *d, const char *what)
{
    const json_value *v = json_get(json_get(json_root(d), "usage"), what);
    return v && v->type == JSON_NUMBER ? (int)v->u.number : -1;
}

/* Fields the server does not implement are refused by name, never ignored
 * (a schema keyword too); "response_format": {"type": "text"} (the
 * default) passes. */
static void unsupported_fields(int port)
{
    const char *chat = "/v1/chat/completions";
    expect_error(port, "POST", chat,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, "
                 "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
                 "{\"type\": \"integer\", \"minimum\": 0}}}}", 1, 400, "unsupported keyword 'minimum'",
                 "response_format json_schema with an unsupported keyword");
    expect_error(port, "POST", chat,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, \"tools\": "
                 "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"auto\"}", 1, 400,
                 "tools is not supported", "tools");
    expect_error(port, "POST", chat,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, \"tool_choice\": "
                 "\"required\"}", 1, 400, "tool_choice is not supported", "tool_choice");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"suffix\": \"y\"}", 1, 400,
                 "suffix is not supported", "suffix");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"temprature\": 0}", 1, 400,
                 "unknown field 'temprature'", "misspelt field");
    expect_error(port, "POST", "/tokenize", "{\"content\": \"x\", \"with_pieces\": true}", 1, 400,
                 "with_pieces is not supported", "tokenize with_pieces");
    int st;
    json_doc *d = post_json(port, chat,
                            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, "
                            "\"response_format\": {\"type\": \"text\"}, \"tools\": [], \"tool_choice\": \"none\"}", &st);
    CHECK(st == 200 && d && json_len(json_get(json_root(d), "choices")) == 1, "response_format text: status %d", st);
    json_free(d);
}

/* CORS as llama-server: every answer may be read by a page of any origin;
 * a preflight on a route is answered without the API key. */
static void cors(int port)
{
    resp r;
    CHECK(http(port, "GET", "/health", NULL, 0, 0, &r) == 0 && strcasestr(r.head, "\r\nAccess-Control-Allow-Origin: *"),
          "CORS on /health: %s", r.head ? r.head : "");
    resp_free(&r);
    CHECK(http(port, "GET", "/v1/models", NULL, 0, 0, &r) == 0 && r.status == 401 &&
              strcasestr(r.head, "\r\nAccess-Control-Allow-Origin: *"),
          "CORS on a 401: %d %s", r.status, r.head ? r.head : "");
    resp_free(&r);
    CHECK(http(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1}", 32, 1, &r) == 0 &&
              r.status == 200 && strcasestr(r.head, "\r\nAccess-Control-Allow-Origin: *"),
          "CORS on a completion: %d %s", r.status, r.head ? r.head : "");
    resp_free(&r);
    static const char *const routes[] = { "/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize" };
    for (int i = 0; i < 4; i++) {
        char req[512];
        snprintf(req, sizeof req,
                 "OPTIONS %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nOrigin: http://localhost:5173\r\n"
                 "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type, "
                 "x-stainless-os\r\n\r\n", routes[i]);
        const int rc = raw_request(port, req, &r);
        const char *m = rc ? NULL : strcasestr(r.head, "\r\nAccess-Control-Allow-Methods:");
        const char *h = rc ? NULL : strcasestr(r.head, "\r\nAccess-Control-Allow-Headers:");
        CHECK(rc == 0 && (r.status == 204 || r.status == 200) && strcasestr(r.head, "\r\nAccess-Control-Allow-Origin: *") &&
                  m && strstr(m, "GET") && strstr(m, "POST") && strstr(m, "OPTIONS") && h && strcasestr(h, "Authorization") &&
                  strcasestr(h, "Content-Type") && strcasestr(h, "x-stainless-os"),
              "preflight %s (no API key): %d %s", routes[i], rc ? -1 : r.status, rc ? "" : r.head);
        if (!rc) resp_free(&r);
    }
    /* a header list that is not plain names is not echoed */
    CHECK(raw_request(port, "OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                            "Access-Control-Request-Headers: a;b\r\n\r\n", &r) == 0 &&
              r.status == 204 && !strstr(r.head, "a;b"),
          "preflight with odd headers: %d %s", r.status, r.head ? r.head : "");
    resp_free(&r);
    CHECK(raw_request(port, "OPTIONS /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &r) == 0 &&
              r.status == 404, "preflight on no route: %d", r.status);
    resp_free(&r);
    /* wrong methods still 405, naming OPTIONS too */
    CHECK(http(port, "GET", "/v1/completions", NULL, 0, 1, &r) == 0 && r.status == 405 &&
              strcasestr(r.head, "\r\nAllow: POST, OPTIONS"), "405 Allow: %s", r.head ? r.head : "");
    resp_free(&r);
}

/* n choices: each sampled with its own seed (seed + i, so choice i is what
 * seed + i alone gives), all equal at temperature 0; usage counts them all;
 * streamed, each choice's chunks carry its index. */
static void n_choices(int port)
{
    const char *C = "/v1/completions";
    int st, st1;
    json_doc *one = post_json(port, C, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 12, \"temperature\": 0}", &st1);
    json_doc *d = post_json(port, C, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 12, \"temperature\": 0, \"n\": 3}",
                            &st);
    const json_value *ch = d ? json_get(json_root(d), "choices") : NULL;
    int ok = st == 200 && st1 == 200 && one && json_len(ch) == 3;
    for (size_t i = 0; ok && i < 3; i++) {
        const json_value *ix = json_get(json_at(ch, i), "index");
        ok = ix && ix->type == JSON_NUMBER && ix->u.number == (double)i && !strcmp(choice_text(d, i), choice_text(one, 0));
    }
    CHECK(ok, "n 3 at temperature 0: three equal choices, index 0..2 (status %d)", st);
    CHECK(one && d && usage_of(d, "completion_tokens") == 3 * usage_of(one, "completion_tokens") &&
              usage_of(d, "prompt_tokens") == usage_of(one, "prompt_tokens") &&
              usage_of(d, "total_tokens") == usage_of(d, "prompt_tokens") + usage_of(d, "completion_tokens"),
          "n 3 usage: %d completion tokens, one choice %d", d ? usage_of(d, "completion_tokens") : -1,
          one ? usage_of(one, "completion_tokens") : -1);
    json_free(d);
    json_free(one);

    /* sampled: choice i == the request alone with seed 42 + i */
    const char *fmt = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 1, \"seed\": %d, \"n\": %d%s}";
    char body[256];
    snprintf(body, sizeof body, fmt, 42, 4, "");
    d = post_json(port, C, body, &st);
    int distinct = 0;
    for (int i = 0; i < 4 && d; i++) {
        snprintf(body, sizeof body, fmt, 42 + i, 1, "");
        one = post_json(port, C, body, &st1);
        CHECK(st == 200 && one && !strcmp(choice_text(d, (size_t)i), choice_text(one, 0)),
              "n 4 sampled: choice %d '%s' is seed %d alone '%s'", i, choice_text(d, (size_t)i), 42 + i,
              one ? choice_text(one, 0) : "");
        json_free(one);
        if (i && strcmp(choice_text(d, (size_t)i), choice_text(d, 0))) distinct = 1;
    }
    CHECK(d && distinct, "n 4 sampled: the choices are not all the same");
    /* streamed: the same texts, chunk by chunk under their index, one [DONE] */
    snprintf(body, sizeof body, fmt, 42, 4, ", \"stream\": true");
    resp r;
    text_buf got[4] = { { 0 } };
    int fins = 0, usages = 0, dones = 0, bad = 0;
    if (http(port, "POST", C, body, strlen(body), 1, &r) == 0) {
        for (char *ev = strstr(r.body, "data: "); ev; ev = strstr(ev + 1, "data: ")) {
            if (!strncmp(ev + 6, "[DONE]", 6)) {
                dones++;
                continue;
            }
            char *end = strstr(ev, "\n\n"), err[128];
            json_doc *e = end ? json_parse(ev + 6, (size_t)(end - ev - 6), 0, err, sizeof err) : NULL;
            const json_value *c0 = e ? json_at(json_get(json_root(e), "choices"), 0) : NULL;
            const json_value *ix = json_get(c0, "index");
            size_t n = 0;
            const char *t = json_get_str(c0, "text", &n);
            if (!ix || ix->type != JSON_NUMBER || ix->u.number < 0 || ix->u.number > 3 || !t) bad++;
            else text_append(&got[(int)ix->u.number], t, n);
            const json_value *fr = json_get(c0, "finish_reason");
            fins += fr && fr->type == JSON_STRING;
            usages += json_get(json_root(e), "usage") != NULL;
            json_free(e);
        }
        resp_free(&r);
    }
    CHECK(!bad && fins == 4 && usages == 1 && dones == 1, "n 4 streamed: %d bad events, %d finishes, %d usages, %d [DONE]",
          bad, fins, usages, dones);
    for (int i = 0; i < 4; i++) {
        CHECK(d && got[i].data && !strcmp(got[i].data, choice_text(d, (size_t)i)), "n 4 streamed: choice %d '%s' vs '%s'", i,
              got[i].data ? got[i].data : "", d ? choice_text(d, (size_t)i) : "");
        free(got[i].data);
    }
    json_free(d);
    /* chat too */
    d = post_json(port, "/v1/chat/completions",
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 6, \"temperature\": 0, \"n\": 2}",
                  &st);
    CHECK(st == 200 && d && json_len(json_get(json_root(d), "choices")) == 2 && !strcmp(choice_text(d, 0), choice_text(d, 1)),
          "chat n 2: status %d", st);
    json_free(d);
    expect_error(port, "POST", C, "{\"prompt\": \"x\", \"n\": 17}", 1, 400, "'n' must be an integer in [1, 16]", "n 17");
}

/* --timeout: a request that cannot finish in time ends with 504. */
static void request_timeout(const char *tiny)
{
    server s;
    char args[1024];
    snprintf(args, sizeof args, "-m %s -c 8192 -t 1 --timeout 1", tiny);
    CHECK(start_server(&s, args) == 0, "timeout server did not start");
    if (s.pid <= 0) return;
    const char *body = "{\"prompt\": [1, 2], \"max_tokens\": 8000, \"ignore_eos\": true, \"temperature\": 0}";
    resp r;
    const double t0 = now();
    int rc = http(s.port, "POST", "/v1/completions", body, strlen(body), 0, &r);
    const double dt = now() - t0;
    CHECK(rc == 0 && r.status == 504 && is_error(&r, "timed out") && dt < 30, "timeout: %d after %.1f s: %s",
          rc ? -1 : r.status, dt, rc ? "" : r.body);
    if (!rc) resp_free(&r);
    CHECK(stop_server(&s) == 0, "timeout server: SIGTERM did not end it cleanly");
}

/* Greedy requests against sparq run, and the case file for the node test. */
static int greedy_vs_run(int port, const char *model, gcase *cases, int n_cases, const char *expect_path)
{
    int ok_all = 1;
    for (int i = 0; i < n_cases; i++) {
        char args[2048];
        snprintf(args, sizeof args, "-m %s -c 256 -b 4 -t 1 -n 40 --temp 0 -p '%s' %s", model, cases[i].prompt,
                 cases[i].run_args);
        cases[i].text = run_capture(args);
        CHECK(cases[i].text != NULL, "sparq run %s failed", args);
        if (!cases[i].text) {
            ok_all = 0;
            continue;
        }
        /* the first 7 cases also go through raw HTTP here */
        if (i >= 7) continue;
        char body[2048];
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 40, \"temperature\": 0%s%s%s}",
                 cases[i].prompt, cases[i].json ? ", \"sparq\": " : "", cases[i].json ? cases[i].json : "", "");
        resp r;
        int rc = http(port, "POST", "/v1/completions", body, strlen(body), 1, &r);
        char *text = rc == 0 && r.status == 200 ? completion_text(r.body) : NULL;
        CHECK(text && strcmp(text, cases[i].text) == 0, "greedy %s: server %s vs sparq run %s", cases[i].run_args,
              text ? text : rc ? "(no response)" : r.body, cases[i].text);
        free(text);
        if (!rc) resp_free(&r);
    }
    /* logit_bias: the server's equals `sparq run -l` with the same biases,
     * and differs from the unbiased text (so the field is not ignored) */
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 256 -b 4 -t 1 -n 40 --temp 0 -p 'Once upon a time'", model);
    char *plain = run_capture(args);
    snprintf(args + strlen(args), sizeof args - strlen(args), " -l 432-100 -l 383+3");
    char *biased = run_capture(args);
    const char *bb = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"temperature\": 0, "
                     "\"logit_bias\": {\"432\": -100, \"383\": 3}}";
    resp r;
    int rc = http(port, "POST", "/v1/completions", bb, strlen(bb), 1, &r);
    char *text = rc == 0 && r.status == 200 ? completion_text(r.body) : NULL;
    CHECK(plain && biased && strcmp(plain, biased) != 0, "sparq run -l changes the text: '%s'", biased ? biased : "");
    CHECK(text && biased && strcmp(text, biased) == 0, "logit_bias: server '%s' vs sparq run -l '%s'",
          text ? text : rc ? "(no response)" : r.body, biased ? biased : "");
    free(text);
    free(plain);
    free(biased);
    if (!rc) resp_free(&r);

    FILE *f = fopen(expect_path, "w");
    if (!f) return -1;
    fputs("{\"cases\": [", f);
    for (int i = 0; i < n_cases; i++) {
        fprintf(f, "%s{\"prompt\": ", i ? ",\n" : "");
        json_str_to(f, cases[i].prompt);
        fprintf(f, ", \"max_tokens\": 40, \"sparq\": %s, \"text\": ", cases[i].json ? cases[i].json : "null");
        json_str_to(f, cases[i].text ? cases[i].text : "");
        fputc('}', f);
    }
    fputs("]}\n", f);
    fclose(f);
    return ok_all ? 0 : -1;
}

/* Runs the openai npm test; each of its "ok"/"not ok" lines is a check. */
static void node_tests(int port, const char *expect_path)
{
    const char *dir = "tests/server";
    struct stat st;
    /* the locked packages are installed by scripts/setup.sh (npm ci): a test
       run never reaches the registry */
    int have_modules = stat("tests/server/node_modules/openai", &st) == 0;
    CHECK(have_modules, "tests/server/node_modules is missing (scripts/setup.sh runs npm ci there)");
    if (!have_modules) return;
    char cmd[2048], out[64] = "/tmp/sparq_test_server_node_XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0) return;
    close(fd);
    snprintf(cmd, sizeof cmd, "cd %s && timeout 300 node openai.test.mjs http://127.0.0.1:%d/v1 %s %s >%s 2>&1", dir,
             port, key, expect_path, out);
    int rc = system(cmd);
    size_t n;
    char *text = test_read_file(out, &n);
    unlink(out);
    int pass = 0, fail = 0, summary = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "ok ", 3)) pass++;
        else if (!strncmp(line, "not ok ", 7)) {
            fail++;
            CHECK(0, "openai client: %s", line + 7);
        } else if (strstr(line, "openai: ")) summary = 1;
        else fprintf(stderr, "node: %s\n", line);
    }
    test_n_pass += pass;
    CHECK(summary && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "the node test did not finish (exit %d)", rc);
    CHECK(pass >= 40, "the node test ran only %d checks", pass);
    free(text);
}

/* One slot, no queue: 503 beyond it; a disconnect frees the slot. */
static void overload_and_disconnect(const char *tiny)
{
    server s;
    char args[1024];
    snprintf(args, sizeof args, "-m %s -c 8192 -t 1 --parallel 1 --queue 0 --api-key %s", tiny, key);
    CHECK(start_server(&s, args) == 0, "second server did not start");
    if (s.pid <= 0) return;
    /* a long stream: 8000 tokens, read one chunk, then hang up */
    int fd = dial(s.port);
    const char *body = "{\"prompt\": [1, 2, 3], \"max_tokens\": 8000, \"ignore_eos\": true, \"temperature\": 0, "
                       "\"stream\": true}";
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %zu\r\n\r\n%s",
                     key, strlen(body), body);
    CHECK(fd >= 0 && send_all(fd, head, (size_t)n) == 0, "long stream request");
    char buf[4096];
    ssize_t got = 0;
    for (double t0 = now(); fd >= 0 && got <= 0 && now() - t0 < 60;) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 500) > 0) got = recv(fd, buf, sizeof buf - 1, 0);
    }
    if (got > 0) buf[got] = 0;
    CHECK(got > 0 && strstr(buf, "200") && strstr(buf, "text/event-stream"), "stream started: %s", got > 0 ? buf : "");
    /* the only slot is busy and the queue holds nothing: 503 */
    resp r;
    int rc = http(s.port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", 33, 1, &r);
    CHECK(rc == 0 && r.status == 503 && strstr(r.head, "Retry-After") && is_error(&r, "queue"),
          "queue full: %d %s", rc ? -1 : r.status, rc ? "" : r.body);
    if (!rc) resp_free(&r);
    /* more choices than the server can ever hold: 400, not a 503 to retry */
    expect_error(s.port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", 1, 400,
                 "'n' is 2; this server holds at most 1", "n beyond --parallel + --queue");
    /* hang up mid-stream: the next request gets the slot soon */
    if (fd >= 0) close(fd);
    int served = 0;
    const double t0 = now();
    while (!served && now() - t0 < 30) {
        rc = http(s.port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", 33, 1, &r);
        if (rc == 0) {
            served = r.status == 200;
            resp_free(&r);
        }
        if (!served) usleep(100000);
    }
    CHECK(served, "no slot freed 30 s after the client disconnected");
    /* (the retries above may have been refused too: rejected >= 1) */
    rc = http(s.port, "GET", "/metrics", NULL, 0, 1, &r);
    const char *cn = rc ? NULL : strstr(r.body, "\nsparq_requests_cancelled_total ");
    const char *rj = rc ? NULL : strstr(r.body, "\nsparq_requests_rejected_total ");
    CHECK(cn && rj && atoi(cn + 32) == 1 && atoi(rj + 31) >= 1 && strstr(r.body, "# TYPE sparq_queue_depth gauge"),
          "metrics after the disconnect: %s", rc ? "" : r.body);
    {
        char info[128];
        snprintf(info, sizeof info, "\nsparq_build_info{version=\"%s\",cpu=\"%s\"} 1\n", sparq_version(),
                 sparq_cpu_level());
        CHECK(!rc && strstr(r.body, info), "metrics name the SIMD level (%s)", info + 1);
    }
    resp_free(&r);
    /* SIGTERM while a stream is running: it ends, the server exits 0 */
    fd = dial(s.port);
    if (fd >= 0) send_all(fd, head, (size_t)n);
    usleep(300000);
    CHECK(stop_server(&s) == 0, "second server: SIGTERM did not end it cleanly");
    if (fd >= 0) {
        resp rr;
        /* a stream that had started ends with [DONE]; one still waiting
         * for its prompt gets a 503 error object */
        CHECK(read_resp(fd, &rr) == 0 && (strstr(rr.body, "[DONE]") || (rr.status == 503 && is_error(&rr, "shutting down"))),
              "the stream running at SIGTERM was not ended: %d %s", rr.status, rr.body ? rr.body : "");
        if (rr.head) resp_free(&rr);
        close(fd);
    }
}

/* A metric's value from a /metrics body, or -1. */
static long long metric(int port, const char *name)
{
    resp r;
    if (http(port, "GET", "/metrics", NULL, 0, 1, &r)) return -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\nsparq_%s ", name);
    const char *p = strstr(r.body, pat);
    long long v = p ? atoll(p + strlen(pat)) : -1;
    resp_free(&r);
    return v;
}

/* --kv-dir files are written by the server's writer thread after the
 * answer that prefilled them may have returned: 0 once none is pending
 * (sparq_kv_dir_pending), -1 after 30 s. */
static int kv_settle(int port)
{
    for (double t0 = now(); now() - t0 < 30; usleep(20000))
        if (metric(port, "kv_dir_pending") == 0) return 0;
    return -1;
}

enum { DOC = 1024, NQ = 16 };

/* The body of question q about the document: token ids, greedy. */
static char *doc_request(const int32_t *doc, int n_doc, int q, int *n_suffix, const char *extra)
{
    text_buf t = { 0 };
    char num[32];
    text_append(&t, "{\"prompt\": [", 12);
    for (int i = 0; i < n_doc; i++) {
        int n = snprintf(num, sizeof num, "%s%d", i ? "," : "", doc[i]);
        text_append(&t, num, (size_t)n);
    }
    /* questions of 3..9 tokens, each starting differently */
    const int len = 3 + q % 7;
    uint32_t st = 977u * (uint32_t)(q + 1);
    for (int i = 0; i < len; i++) {
        st = st * 1664525u + 1013904223u;
        int n = snprintf(num, sizeof num, ",%d", i == 0 ? 40 + 7 * q : 3 + (int)(st >> 8) % 400);
        text_append(&t, num, (size_t)n);
    }
    char tail[256];
    int n = snprintf(tail, sizeof tail, "], \"max_tokens\": 8, \"temperature\": 0%s}", extra ? extra : "");
    text_append(&t, tail, (size_t)n);
    *n_suffix = len;
    return t.data;
}

/* 16 requests sent at once: every body's last byte goes out only once all
 * are nearly sent, so they reach the scheduler together. Texts into out. */
static void send_together(int port, char **bodies, int n, char **out, int *status)
{
    int fd[NQ];
    for (int q = 0; q < n; q++) {
        const size_t len = strlen(bodies[q]);
        char head[512];
        int hn = snprintf(head, sizeof head,
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer %s\r\n"
                          "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", key, len);
        fd[q] = dial(port);
        if (fd[q] >= 0 && (send_all(fd[q], head, (size_t)hn) || send_all(fd[q], bodies[q], len - 1))) {
            close(fd[q]);
            fd[q] = -1;
        }
    }
    for (int q = 0; q < n; q++)
        if (fd[q] >= 0) send_all(fd[q], bodies[q] + strlen(bodies[q]) - 1, 1);
    for (int q = 0; q < n; q++) {
        resp r;
        out[q] = NULL;
        status[q] = -1;
        if (fd[q] < 0) continue;
        if (read_resp(fd[q], &r) == 0) {
            status[q] = r.status;
            out[q] = r.status == 200 ? completion_text(r.body) : strdup(r.body);
            resp_free(&r);
        }
        close(fd[q]);
    }
}

/* The answers of n completion bodies sent one after another (the
 * references: each prompt alone). Texts into out (NULL on failure). */
static void answers_one_by_one(int port, char **bodies, int n, char **out, const char *what)
{
    for (int q = 0; q < n; q++) {
        resp r;
        out[q] = NULL;
        if (http(port, "POST", "/v1/completions", bodies[q], strlen(bodies[q]), 1, &r) == 0) {
            out[q] = r.status == 200 ? completion_text(r.body) : NULL;
            resp_free(&r);
        }
        CHECK(out[q] != NULL, "%s: prompt %d alone failed", what, q);
    }
}

/* In-flight sharing: 16 questions about one document sent at once cost
 * one prefill of the document plus the 16 questions, and each answer is
 * the one the question gets alone on a server without a prefix cache. */
static void shared_document(const char *model)
{
    int32_t doc[DOC];
    uint32_t st = 12345;
    doc[0] = 1; /* BOS */
    for (int i = 1; i < DOC; i++) {
        st = st * 1664525u + 1013904223u;
        doc[i] = 3 + (int)(st >> 8) % 480;
    }
    char *bodies[NQ], *alone[NQ], *together[NQ];
    int suffix[NQ], status[NQ], sum_suffix = 0;
    for (int q = 0; q < NQ; q++) {
        bodies[q] = doc_request(doc, DOC, q, &suffix[q], NULL);
        sum_suffix += suffix[q];
        alone[q] = together[q] = NULL;
    }
    server ref, srv;
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 1100 -b 16 -t 1 --parallel 1 --queue 4 --prefix-cache 0 --api-key %s", model, key);
    CHECK(start_server(&ref, args) == 0, "reference server did not start");
    if (ref.pid > 0) answers_one_by_one(ref.port, bodies, NQ, alone, "shared document");
    if (ref.pid > 0) {
        CHECK(metric(ref.port, "prefill_tokens_total") == (long long)NQ * DOC + sum_suffix,
              "without a cache every prompt is prefilled whole: %lld", metric(ref.port, "prefill_tokens_total"));
        CHECK(stop_server(&ref) == 0, "reference server: SIGTERM did not end it cleanly");
    }
    snprintf(args, sizeof args, "-m %s -c 1100 -b 16 -t 1 --parallel 16 --queue 32 --api-key %s", model, key);
    CHECK(start_server(&srv, args) == 0, "shared-document server did not start");
    if (srv.pid > 0) {
        send_together(srv.port, bodies, NQ, together, status);
        for (int q = 0; q < NQ; q++)
            CHECK(status[q] == 200 && together[q] && alone[q] && !strcmp(together[q], alone[q]),
                  "question %d together (%d) '%s' vs alone '%s'", q, status[q], together[q] ? together[q] : "",
                  alone[q] ? alone[q] : "");
        const long long pre = metric(srv.port, "prefill_tokens_total"), hits = metric(srv.port, "prefix_cache_hits_total");
        const long long waits = metric(srv.port, "prefix_cache_waits_total");
        CHECK(pre == DOC + sum_suffix, "prefilled %lld tokens; the document once and the questions are %d", pre,
              DOC + sum_suffix);
        CHECK(hits == NQ - 1 && metric(srv.port, "prefix_cache_tokens_total") == (long long)(NQ - 1) * DOC,
              "prefix hits %lld (want %d)", hits, NQ - 1);
        CHECK(waits >= 1 && waits <= NQ - 1, "requests that waited for the prefill: %lld", waits);
        CHECK(metric(srv.port, "prefix_cache_entries") >= 1 && metric(srv.port, "prefix_cache_sequences") == 0 &&
                  metric(srv.port, "prefix_cache_bytes") > 0, "prefix cache gauges after the requests");
        fprintf(stderr, "shared document: %lld tokens prefilled, %lld hits, %lld waited\n", pre, hits, waits);
        CHECK(stop_server(&srv) == 0, "shared-document server: SIGTERM did not end it cleanly");
    }
    for (int q = 0; q < NQ; q++) {
        free(bodies[q]);
        free(alone[q]);
        free(together[q]);
    }
}

/* Prompts the prefix cache holds all but the last token of (the same
 * prompts again): their one-token last chunks are prefilled together in
 * one pass (sparq_eval_prefill_batch), and every answer is still the one
 * the prompt gets alone on a server without a prefix cache. Two of the
 * eight ask for SparQ: the last chunk is exact attention whatever the
 * policy. */
static void warm_tails(const char *model)
{
    enum { NW = 8, LEN = 2 * 16 + 1 }; /* -b 16: cached 32, last chunk 1 */
    char *bodies[NW], *alone[NW], *cold[NW], *warm[NW];
    int status[NW];
    uint32_t st = 4242;
    for (int q = 0; q < NW; q++) {
        text_buf t = { 0 };
        char num[32];
        text_append(&t, "{\"prompt\": [1", 13);
        for (int i = 1; i < LEN; i++) {
            st = st * 1664525u + 1013904223u;
            int n = snprintf(num, sizeof num, ",%d", 3 + (int)(st >> 8) % 480);
            text_append(&t, num, (size_t)n);
        }
        const char *ext = q % 4 == 3 ? ", \"sparq\": {\"attn\": \"sparq\", \"ratio\": \"1/2\"}" : "";
        char tail[160];
        int n = snprintf(tail, sizeof tail, "], \"max_tokens\": 8, \"temperature\": 0%s}", ext);
        text_append(&t, tail, (size_t)n);
        bodies[q] = t.data;
        alone[q] = cold[q] = warm[q] = NULL;
    }
    server ref, srv;
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --parallel 1 --queue 16 --prefix-cache 0 --api-key %s", model, key);
    CHECK(start_server(&ref, args) == 0, "warm-tails reference server did not start");
    if (ref.pid > 0) answers_one_by_one(ref.port, bodies, NW, alone, "warm tails");
    if (ref.pid > 0) CHECK(stop_server(&ref) == 0, "warm-tails reference server: SIGTERM did not end it cleanly");
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 2 --parallel %d --queue 16 --api-key %s", model, NW, key);
    CHECK(start_server(&srv, args) == 0, "warm-tails server did not start");
    if (srv.pid > 0) {
        send_together(srv.port, bodies, NW, cold, status);
        const long long before = metric(srv.port, "prefill_tails_batched_total");
        send_together(srv.port, bodies, NW, warm, status);
        const long long batched = metric(srv.port, "prefill_tails_batched_total") - before;
        for (int q = 0; q < NW; q++)
            CHECK(status[q] == 200 && cold[q] && warm[q] && alone[q] && !strcmp(cold[q], alone[q]) &&
                      !strcmp(warm[q], alone[q]),
                  "warm tails: prompt %d cold '%s', warm (%d) '%s', alone '%s'", q, cold[q] ? cold[q] : "", status[q],
                  warm[q] ? warm[q] : "", alone[q] ? alone[q] : "");
        /* six ask for dense, two for SparQ: at most four land in a slot
         * whose last context had the other policy */
        const long long reused = metric(srv.port, "contexts_reused_total");
        CHECK(reused >= NW - 4 && reused <= NW, "warm tails: %lld requests ran in their slot's last context (want >= %d)",
              reused, NW - 4);
        CHECK(metric(srv.port, "prefix_cache_hits_total") >= NW && batched >= 2,
              "warm tails: %lld prefix hits, %lld last tokens prefilled together (want >= 2)",
              metric(srv.port, "prefix_cache_hits_total"), batched);
        fprintf(stderr, "warm tails: %lld of %d last tokens prefilled together\n", batched, NW);
        CHECK(stop_server(&srv) == 0, "warm-tails server: SIGTERM did not end it cleanly");
    }
    for (int q = 0; q < NW; q++) {
        free(bodies[q]);
        free(alone[q]);
        free(cold[q]);
        free(warm[q]);
    }
}

/* A completion of body on port: its text (malloc'ed) or NULL. */
static char *complete(int port, const char *body)
{
    resp r;
    if (http(port, "POST", "/v1/completions", body, strlen(body), 1, &r)) return NULL;
    char *t = r.status == 200 ? completion_text(r.body) : NULL;
    if (!t) fprintf(stderr, "completion: %d %s\n", r.status, r.body);
    resp_free(&r);
    return t;
}

/* "sparq": {"prefix_id": ...}: validated; a document named by one server
 * in --kv-dir is found by name by the next (whose prompts share only the
 * document with the stored one, so no token-named file could match), and
 * used up to the last chunk boundary the prompt shares with it; a prompt
 * under that name that does not start with it is a miss, not an error.
 * Answers equal those of a server without any cache. */
static void named_document(const char *model, int port)
{
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"sparq\": {\"prefix_id\": \"\"}}", 1, 400,
                 "prefix_id", "empty prefix_id");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"sparq\": {\"prefix_id\": 7}}", 1, 400,
                 "prefix_id", "prefix_id of a wrong type");
    expect_error(port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"sparq\": {\"prefix_id\": \"a\\u0001b\"}}", 1,
                 400, "printable", "unprintable prefix_id");
    char longid[300] = "{\"prompt\": \"x\", \"sparq\": {\"prefix_id\": \"";
    size_t at = strlen(longid);
    memset(longid + at, 'a', 129);
    snprintf(longid + at + 129, sizeof longid - at - 129, "\"}}");
    expect_error(port, "POST", "/v1/completions", longid, 1, 400, "128", "prefix_id of 129 characters");

    enum { D = 1000, NB = 16 }; /* not a multiple of NB: the name is used to 992 */
    int32_t doc[D], doc2[D];
    uint32_t st = 777;
    doc[0] = doc2[0] = 1;
    for (int i = 1; i < D; i++) {
        st = st * 1664525u + 1013904223u;
        doc[i] = 3 + (int)(st >> 8) % 480;
        doc2[i] = 3 + (int)(st >> 12) % 470;
    }
    static const char *ext[] = { ", \"sparq\": {\"prefix_id\": \"doc-1\"}", "",
                                 ", \"sparq\": {\"prefix_id\": \"doc-1\", \"attn\": \"sparq\", \"ratio\": \"1/2\"}" };
    /* A: doc + q0 named; B: doc + q1 named (sparq), C: doc + q2 unnamed;
     * E: doc2 + q3 under the same name */
    int sfx[4];
    char *body_a = doc_request(doc, D, 0, &sfx[0], ext[0]), *body_b = doc_request(doc, D, 1, &sfx[1], ext[2]);
    char *body_c = doc_request(doc, D, 2, &sfx[2], ext[1]), *body_e = doc_request(doc2, D, 3, &sfx[3], ext[0]);
    char *body_b0 = doc_request(doc, D, 1, &sfx[1], ", \"sparq\": {\"attn\": \"sparq\", \"ratio\": \"1/2\"}");
    char *ref[4] = { 0 }, *got[4] = { 0 };
    char dir[] = "/tmp/sparq_test_server_kvdir_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    server s;
    char args[2048];
    /* the reference: no cache at all */
    snprintf(args, sizeof args, "-m %s -c 1100 -b %d -t 1 --parallel 2 --prefix-cache 0 --api-key %s", model, NB, key);
    if (start_server(&s, args) == 0) {
        char *bodies[4] = { body_a, body_b, body_c, body_e };
        for (int i = 0; i < 4; i++) ref[i] = complete(s.port, bodies[i]);
        stop_server(&s);
    }
    CHECK(ref[0] && ref[1] && ref[2] && ref[3], "reference answers");
    /* 1: A names the document and leaves it in the directory */
    snprintf(args, sizeof args, "-m %s -c 1100 -b %d -t 1 --parallel 2 --kv-dir %s --api-key %s", model, NB, dir, key);
    if (start_server(&s, args) == 0) {
        got[0] = complete(s.port, body_a);
        CHECK(kv_settle(s.port) == 0, "the named document's write still pending after 30 s");
        CHECK(metric(s.port, "kv_dir_writes_total") == 1, "the named document was written to --kv-dir");
        stop_server(&s);
    }
    /* 2: B without the name finds no file (its cuts hold other tokens) */
    if (start_server(&s, args) == 0) {
        char *t = complete(s.port, body_b0);
        CHECK(t && ref[1] && !strcmp(t, ref[1]) && metric(s.port, "kv_dir_hits_total") == 0,
              "without prefix_id, no file matches the new question");
        free(t);
        stop_server(&s);
    }
    /* 3: B with the name maps the file's first 992 positions; C (no name)
     * then hits the memory entry; E names another document: a miss */
    if (start_server(&s, args) == 0) {
        got[1] = complete(s.port, body_b);
        const long long hits = metric(s.port, "kv_dir_hits_total"), toks = metric(s.port, "kv_dir_tokens_total");
        const long long pre1 = metric(s.port, "prefill_tokens_total");
        CHECK(hits == 1 && toks == D / NB * NB && pre1 == D + sfx[1] - D / NB * NB,
              "named file: %lld hits, %lld tokens, %lld prefilled", hits, toks, pre1);
        got[2] = complete(s.port, body_c);
        const long long pre2 = metric(s.port, "prefill_tokens_total");
        CHECK(metric(s.port, "prefix_cache_hits_total") == 1 && pre2 - pre1 == D + sfx[2] - D / NB * NB,
              "the named entry serves an unnamed prompt too: %lld prefilled", pre2 - pre1);
        got[3] = complete(s.port, body_e);
        const long long pre3 = metric(s.port, "prefill_tokens_total");
        CHECK(pre3 - pre2 == D + sfx[3] && metric(s.port, "prefix_cache_hits_total") == 1 &&
                  metric(s.port, "kv_dir_hits_total") == 1,
              "another document under the name is a miss: %lld prefilled", pre3 - pre2);
        stop_server(&s);
    }
    for (int i = 0; i < 4; i++) {
        CHECK(got[i] && ref[i] && !strcmp(got[i], ref[i]), "named document, request %d: '%s' vs '%s'", i,
              got[i] ? got[i] : "(none)", ref[i] ? ref[i] : "(none)");
        free(got[i]);
        free(ref[i]);
    }
    free(body_a);
    free(body_b);
    free(body_b0);
    free(body_c);
    free(body_e);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm %s", dir);
}

/* `serve --load-kv ID=PATH`: a document prefilled into its own KV file is
 * continued by requests that name it (the prompt is what follows it). Each
 * answer equals `sparq run --load-kv PATH --prefill-attn policy` with the
 * same policy, alone and with the others at once (a batch of contexts
 * mapped from one file); a bad spec or file stops the server at start with
 * one line; chat, a prompt past the file's room, or a name that is not a
 * document behave as documented. */
static void loaded_document(const char *model)
{
    char dir[] = "/tmp/sparq_test_server_doc_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char kv[128], bad[160], cmd[4096];
    snprintf(kv, sizeof kv, "%s/book.kv", dir);
    snprintf(cmd, sizeof cmd,
             "%s prefill -m %s -c 400 -t 1 --index ivf --save-kv %s -p 'Once upon a time, there was a little girl "
             "named Lily. She loved to play in the park with her dog Max. One day, Lily and Max found a big red ball "
             "under a tree. They played with it all day, and when the sun went down they went home happy.' >/dev/null 2>&1",
             bin, model, kv);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "prefill --save-kv of the document");
    static const struct { const char *run, *json; } pols[] = {
        { "", "" },
        { "--attn topk --topk-k 8", ", \"attn\": \"topk\", \"topk_k\": 8" },
        { "--attn sparq --sparq-r 2 --sparq-k 8", ", \"attn\": \"sparq\", \"r\": 2, \"k\": 8" },
        { "--attn streaming --attn-k 12 --n-sink 4", ", \"attn\": \"streaming\", \"attn_k\": 12, \"n_sink\": 4" },
    };
    enum { NP = sizeof pols / sizeof pols[0] };
    static const char *const qs[NP] = { " Then", " The next day, Lily", " Max", " She" };
    char *ref[NP] = { 0 }, *body[NP] = { 0 };
    for (int i = 0; i < NP; i++) {
        char args[2600];
        /* half the references read the file into memory first: nothing may change */
        snprintf(args, sizeof args, "-m %s --load-kv %s%s -t 1 --prefill-attn policy -p '%s' -n 24 --temp 0 %s",
                 model, kv, i % 2 ? " --kv-preload" : "", qs[i], pols[i].run);
        ref[i] = run_capture(args);
        CHECK(ref[i] && ref[i][0], "run --load-kv reference %d", i);
        size_t n = 0;
        FILE *f = open_memstream(&body[i], &n);
        if (f) {
            fputs("{\"prompt\": ", f);
            json_str_to(f, qs[i]);
            fprintf(f, ", \"max_tokens\": 24, \"temperature\": 0, \"sparq\": {\"prefix_id\": \"book\"%s}}", pols[i].json);
            fclose(f);
        }
    }
    server s;
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 512 -t 1 --parallel 4 --load-kv book=%s --kv-preload --api-key %s", model,
             kv, key);
    if (start_server(&s, args) == 0) {
        for (int i = 0; i < NP; i++) {
            char *t = body[i] ? complete(s.port, body[i]) : NULL;
            CHECK(t && ref[i] && !strcmp(t, ref[i]), "document, policy %d alone: '%s' vs run's '%s'", i,
                  t ? t : "(none)", ref[i] ? ref[i] : "(none)");
            free(t);
        }
        char *got[NP] = { 0 };
        int status[NP] = { 0 };
        send_together(s.port, body, NP, got, status);
        for (int i = 0; i < NP; i++) {
            const char *t = status[i] == 200 ? got[i] : NULL;
            CHECK(t && ref[i] && !strcmp(t, ref[i]), "document, policy %d with the others at once: '%s'", i,
                  got[i] ? got[i] : "(none)");
            free(got[i]);
        }
        /* the file holds 400 positions in all: no room for 400 more tokens (the server's own contexts have 512) */
        char big[8192] = "{\"prompt\": [";
        for (int i = 0; i < 400; i++) strcat(big, i ? ",5" : "5");
        strcat(big, "], \"sparq\": {\"prefix_id\": \"book\"}}");
        expect_error(s.port, "POST", "/v1/completions", big, 1, 400, "after the document", "prompt past the room");
        expect_error(s.port, "POST", "/v1/chat/completions",
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"sparq\": {\"prefix_id\": \"book\"}}",
                     1, 400, "not chat", "chat continuing a document");
        /* another name is the prefix cache's as before: the prompt stands alone */
        char *plain = complete(s.port, "{\"prompt\": \"Max\", \"max_tokens\": 8, \"temperature\": 0, "
                                       "\"sparq\": {\"prefix_id\": \"other\"}}");
        char rargs[1200];
        snprintf(rargs, sizeof rargs, "-m %s -c 512 -t 1 -p 'Max' -n 8 --temp 0", model);
        char *pref = run_capture(rargs);
        CHECK(plain && pref && !strcmp(plain, pref), "a name that is no document: '%s' vs '%s'", plain ? plain : "",
              pref ? pref : "");
        free(plain);
        free(pref);
        CHECK(stop_server(&s) == 0, "document server: SIGTERM did not end it cleanly");
    }
    /* bad specs and files: a one-line error at start, exit status 1 or 2 */
    snprintf(bad, sizeof bad, "%s/cut.kv", dir);
    snprintf(cmd, sizeof cmd, "head -c 3000 %s > %s", kv, bad);
    CHECK(system(cmd) == 0, "truncated copy");
    const char *specs[] = { "book", "=x", "book=/nonexistent/file.kv", "a=%s --load-kv a=%s", "cut=%s" };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        char spec[512];
        snprintf(spec, sizeof spec, specs[i], i == 4 ? bad : kv, kv);
        snprintf(cmd, sizeof cmd, "%s serve -m %s --port 0 --load-kv %s 2>%s/err.txt", bin, model, spec, dir);
        rc = system(cmd);
        char errf[200];
        snprintf(errf, sizeof errf, "%s/err.txt", dir);
        size_t n = 0;
        char *e = test_read_file(errf, &n);
        const char *line = e ? strstr(e, "error: ") : NULL;
        CHECK(WIFEXITED(rc) && (WEXITSTATUS(rc) == 1 || WEXITSTATUS(rc) == 2) && line && strstr(line, "load-kv"),
              "--load-kv %s: exit %d, '%s'", spec, WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, e ? e : "");
        free(e);
    }
    for (int i = 0; i < NP; i++) {
        free(ref[i]);
        free(body[i]);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm %s", dir);
}

/* --kv-dir writes leave the scheduler thread: 12 documents sent at once
 * all get their answers; each prefix either becomes a file or is counted
 * as skipped (the writer's queue was full), never an error; SIGTERM right
 * after the answers exits cleanly with the queued writes finished and no
 * temp file left; a second server on the directory loads every file and
 * gives the same answers. */
static void kv_dir_burst(const char *model)
{
    enum { N = 12, D = 200 };
    int32_t doc[D];
    char *bodies[N], *first[N], *again[N];
    int status[N], sfx;
    for (int k = 0; k < N; k++) {
        uint32_t st = 4242u + 31u * (uint32_t)k;
        doc[0] = 1;
        for (int i = 1; i < D; i++) {
            st = st * 1664525u + 1013904223u;
            doc[i] = 3 + (int)(st >> 8) % 480;
        }
        doc[1] = 3 + k; /* distinct from the first chunk on */
        bodies[k] = doc_request(doc, D, k, &sfx, NULL);
        first[k] = again[k] = NULL;
    }
    char dir[] = "/tmp/sparq_test_server_burst_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    server s;
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --parallel 8 --queue 16 --kv-dir %s --api-key %s", model, dir,
             key);
    long long skipped = -1, errors = -1;
    if (start_server(&s, args) == 0) {
        send_together(s.port, bodies, N, first, status);
        for (int k = 0; k < N; k++) CHECK(status[k] == 200 && first[k], "burst request %d: %d", k, status[k]);
        skipped = metric(s.port, "kv_dir_skipped_total");
        errors = metric(s.port, "kv_dir_errors_total");
        fprintf(stderr, "kv-dir burst: %lld written, %lld pending, %lld skipped at the last answer\n",
                metric(s.port, "kv_dir_writes_total"), metric(s.port, "kv_dir_pending"), skipped);
        CHECK(stop_server(&s) == 0, "burst server: SIGTERM did not end it cleanly");
    }
    int files = 0, other = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        const int kv = strlen(e->d_name) == 35 && !strcmp(e->d_name + 32, ".kv") &&
                       strspn(e->d_name, "0123456789abcdef") == 32;
        files += kv;
        other += !kv;
        if (!kv) fprintf(stderr, "kv-dir burst: left in the directory: %s\n", e->d_name);
    }
    if (d) closedir(d);
    CHECK(other == 0, "%d temp or other files left in the kv dir after SIGTERM", other);
    CHECK(errors == 0 && skipped >= 0 && files + skipped == N,
          "kv-dir burst: %d files + %lld skipped, expected %d (errors %lld)", files, skipped, N, errors);
    /* every file is complete and usable: a server without a memory cache
     * loads each one it finds, and answers the same */
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --kv-dir %s --api-key %s", model, dir, key);
    if (start_server(&s, args) == 0) {
        for (int k = 0; k < N; k++) {
            again[k] = complete(s.port, bodies[k]);
            CHECK(again[k] && first[k] && !strcmp(again[k], first[k]), "burst document %d again: '%s' vs '%s'", k,
                  again[k] ? again[k] : "", first[k] ? first[k] : "");
        }
        CHECK(metric(s.port, "kv_dir_hits_total") == files, "%lld files loaded, %d in the directory",
              metric(s.port, "kv_dir_hits_total"), files);
        CHECK(stop_server(&s) == 0, "burst reader: SIGTERM did not end it cleanly");
    }
    for (int k = 0; k < N; k++) {
        free(bodies[k]);
        free(first[k]);
        free(again[k]);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm -rf %s", dir);
}

/* The one KV file in dir: its name (35 chars + NUL) into name; 0 if exactly
 * one file is there (nothing else either), -1 otherwise. */
static int only_kv_file(const char *dir, char name[40])
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        snprintf(name, 40, "%.39s", e->d_name);
    }
    if (d) closedir(d);
    return n == 1 && strlen(name) == 35 && !strcmp(name + 32, ".kv") ? 0 : -1;
}

static int write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const int bad = fwrite(p, 1, n, f) != n;
    return fclose(f) || bad ? -1 : 0;
}

/* A --kv-dir file under a prompt's name whose stored tokens or data do not
 * match it - another document's file planted there, a byte flipped in the
 * stored token ids, a byte flipped in K - is not used (no hit, the whole
 * prompt prefilled, the answer a cold prefill's) and is removed: the
 * server then writes the prompt's own file there, which a later server
 * uses. Without the removal the bad file would stay and the name would
 * never cache its prompt again (a write is skipped while a file exists).
 * The control: the prompt's own file under the name is used. */
static void kv_dir_mismatch(const char *model)
{
    enum { D = 200 };
    int32_t doc[2][D];
    char *body[2], *ref[2] = { 0 }, dir[2][48], name[2][40] = { { 0 } }, args[2048], path[2][160];
    int n_prompt[2];
    for (int k = 0; k < 2; k++) {
        uint32_t st = 9001u + 77u * (uint32_t)k;
        doc[k][0] = 1;
        for (int i = 1; i < D; i++) {
            st = st * 1664525u + 1013904223u;
            doc[k][i] = 3 + (int)(st >> 8) % 480;
        }
        int sfx;
        body[k] = doc_request(doc[k], D, 5, &sfx, NULL);
        n_prompt[k] = D + sfx;
        snprintf(dir[k], sizeof dir[k], "/tmp/sparq_test_server_mism_XXXXXX");
        CHECK(mkdtemp(dir[k]) != NULL, "mkdtemp");
    }
    server s;
    /* each document alone, cold, into its own directory: the reference
     * answers and each document's own file */
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --kv-dir %s --api-key %s", model,
                 dir[k], key);
        if (start_server(&s, args) == 0) {
            ref[k] = complete(s.port, body[k]);
            CHECK(kv_settle(s.port) == 0 && metric(s.port, "kv_dir_writes_total") == 1 &&
                      metric(s.port, "kv_dir_hits_total") == 0,
                  "document %d: one file written, nothing loaded", k);
            CHECK(stop_server(&s) == 0, "mismatch writer %d: SIGTERM did not end it cleanly", k);
        }
        CHECK(only_kv_file(dir[k], name[k]) == 0, "document %d: one KV file in %s", k, dir[k]);
        snprintf(path[k], sizeof path[k], "%s/%s", dir[k], name[k]);
    }
    size_t n_good = 0, n_other = 0;
    unsigned char *good = test_read_file(path[1], &n_good), *other = test_read_file(path[0], &n_other);
    CHECK(ref[0] && ref[1] && good && other && n_good > 8192 && strcmp(name[0], name[1]) != 0,
          "the two documents' answers and files");
    if (!ref[0] || !ref[1] || !good || !other || n_good <= 8192) goto done;

    /* the header's meta_off (the stored token ids first) and k_off */
    uint64_t meta_off = 0, k_off = 0;
    memcpy(&meta_off, good + 128, 8);
    memcpy(&k_off, good + 144, 8);
    CHECK(meta_off >= 4096 && meta_off + 64 < n_good && k_off >= 4096 && k_off + 64 < n_good, "header offsets");
    if (meta_off < 4096 || meta_off + 64 >= n_good || k_off < 4096 || k_off + 64 >= n_good) goto done;
    unsigned char *bad_tok = malloc(n_good), *bad_k = malloc(n_good);
    CHECK(bad_tok && bad_k, "out of memory");
    if (!bad_tok || !bad_k) {
        free(bad_tok);
        free(bad_k);
        goto done;
    }
    memcpy(bad_tok, good, n_good);
    bad_tok[meta_off + 4 * 10] ^= 0x01; /* token id 10 */
    memcpy(bad_k, good, n_good);
    bad_k[k_off + 40] ^= 0x10; /* layer 0, head 0, position 0 */
    static const char *what[] = { "its own file (control)", "another document's file", "a flipped token byte",
                                  "a flipped K byte" };
    const unsigned char *plant[] = { good, other, bad_tok, bad_k };
    const size_t n_plant[] = { n_good, n_other, n_good, n_good };
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --kv-dir %s --api-key %s", model, dir[1],
             key);
    for (int c = 0; c < 4; c++) {
        CHECK(write_bytes(path[1], plant[c], n_plant[c]) == 0, "planting %s", what[c]);
        if (start_server(&s, args) != 0) continue;
        char *t = complete(s.port, body[1]);
        CHECK(t && !strcmp(t, ref[1]), "%s under the name: '%s' vs '%s'", what[c], t ? t : "(none)", ref[1]);
        free(t);
        const long long hits = metric(s.port, "kv_dir_hits_total"), pre = metric(s.port, "prefill_tokens_total");
        CHECK(kv_settle(s.port) == 0, "%s: a write still pending after 30 s", what[c]);
        const long long writes = metric(s.port, "kv_dir_writes_total");
        CHECK(stop_server(&s) == 0, "mismatch server (%s): SIGTERM did not end it cleanly", what[c]);
        size_t n_now = 0;
        unsigned char *now_b = test_read_file(path[1], &n_now);
        const int same_as_planted = now_b && n_now == n_plant[c] && !memcmp(now_b, plant[c], n_now);
        if (c == 0) { /* used: a hit, only the suffix prefilled, nothing written */
            CHECK(hits == 1 && pre < n_prompt[1] && writes == 0 && same_as_planted,
                  "%s: %lld hits, %lld of %d prefilled, %lld writes", what[c], hits, pre, n_prompt[1], writes);
        } else { /* not used, removed, and the prompt's own file written in its place */
            CHECK(hits == 0 && pre == n_prompt[1], "%s was used: %lld hits, %lld of %d prefilled", what[c], hits,
                  pre, n_prompt[1]);
            CHECK(writes == 1 && !same_as_planted, "%s was not removed: %lld writes, file %s", what[c], writes,
                  same_as_planted ? "unchanged" : now_b ? "replaced" : "gone");
        }
        free(now_b);
        if (c == 0) continue;
        /* what is there now is the prompt's own file: the next server uses it */
        if (start_server(&s, args) == 0) {
            t = complete(s.port, body[1]);
            CHECK(t && !strcmp(t, ref[1]) && metric(s.port, "kv_dir_hits_total") == 1,
                  "after %s: the rewritten file is not used: '%s'", what[c], t ? t : "(none)");
            free(t);
            CHECK(stop_server(&s) == 0, "mismatch reader: SIGTERM did not end it cleanly");
        }
    }
    free(bad_tok);
    free(bad_k);
done:
    free(good);
    free(other);
    for (int k = 0; k < 2; k++) {
        free(body[k]);
        free(ref[k]);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir[k]);
        CHECK(system(cmd) == 0, "rm -rf %s", dir[k]);
    }
}

/* Under a prefix_id, --kv-dir holds one document's file; a prompt of
 * another document under that name does not use it (no hit, prefilled
 * whole, the cold answer) and its own file replaces it, which the next
 * server uses for it. The control: the first document under the name is
 * served from the file. */
static void kv_dir_named_other(const char *model)
{
    enum { D = 200 };
    int32_t doc[2][D];
    char *body[2], *ref[2] = { 0 }, dir[] = "/tmp/sparq_test_server_named_XXXXXX", name[40] = { 0 }, args[2048],
                    path[160];
    int n_prompt[2];
    for (int k = 0; k < 2; k++) {
        uint32_t st = 5150u + 91u * (uint32_t)k;
        doc[k][0] = 1;
        for (int i = 1; i < D; i++) {
            st = st * 1664525u + 1013904223u;
            doc[k][i] = 3 + (int)(st >> 8) % 480;
        }
        int sfx;
        body[k] = doc_request(doc[k], D, 2 + k, &sfx, ", \"sparq\": {\"prefix_id\": \"shared-name\"}");
        n_prompt[k] = D + sfx;
    }
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --kv-dir %s --api-key %s", model, dir, key);
    server s;
    /* the cold answers, and document 0's file under the name */
    if (start_server(&s, args) == 0) {
        ref[0] = complete(s.port, body[0]);
        CHECK(kv_settle(s.port) == 0 && metric(s.port, "kv_dir_writes_total") == 1, "document 0's file written");
        CHECK(stop_server(&s) == 0, "named writer: SIGTERM did not end it cleanly");
    }
    CHECK(only_kv_file(dir, name) == 0, "one KV file in %s", dir);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n_first = 0;
    unsigned char *first = test_read_file(path, &n_first);
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --api-key %s", model, key);
    if (start_server(&s, args) == 0) { /* no kv-dir: document 1 cold */
        ref[1] = complete(s.port, body[1]);
        CHECK(stop_server(&s) == 0, "named reference: SIGTERM did not end it cleanly");
    }
    CHECK(ref[0] && ref[1] && first, "the cold answers and document 0's file");
    if (!ref[0] || !ref[1] || !first) goto done;
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --kv-dir %s --api-key %s", model, dir, key);
    /* control: document 0 under the name uses the file */
    if (start_server(&s, args) == 0) {
        char *t = complete(s.port, body[0]);
        CHECK(t && !strcmp(t, ref[0]) && metric(s.port, "kv_dir_hits_total") == 1 &&
                  metric(s.port, "prefill_tokens_total") < n_prompt[0],
              "document 0 under its name: not served from its file: '%s'", t ? t : "(none)");
        free(t);
        CHECK(stop_server(&s) == 0, "named control: SIGTERM did not end it cleanly");
    }
    /* document 1 under the name: a miss, and its file replaces document 0's */
    if (start_server(&s, args) == 0) {
        char *t = complete(s.port, body[1]);
        const long long hits = metric(s.port, "kv_dir_hits_total"), pre = metric(s.port, "prefill_tokens_total");
        CHECK(t && !strcmp(t, ref[1]) && hits == 0 && pre == n_prompt[1],
              "another document's file under the name was used: %lld hits, %lld of %d prefilled, '%s'", hits, pre,
              n_prompt[1], t ? t : "(none)");
        free(t);
        CHECK(kv_settle(s.port) == 0 && metric(s.port, "kv_dir_writes_total") == 1, "document 1's file not written");
        CHECK(stop_server(&s) == 0, "named replacer: SIGTERM did not end it cleanly");
    }
    size_t n_now = 0;
    unsigned char *now_b = test_read_file(path, &n_now);
    CHECK(now_b && !(n_now == n_first && !memcmp(now_b, first, n_now)), "document 0's file is still under the name");
    free(now_b);
    if (start_server(&s, args) == 0) {
        char *t = complete(s.port, body[1]);
        CHECK(t && !strcmp(t, ref[1]) && metric(s.port, "kv_dir_hits_total") == 1,
              "document 1 under the name: its own file not used: '%s'", t ? t : "(none)");
        free(t);
        CHECK(stop_server(&s) == 0, "named reader: SIGTERM did not end it cleanly");
    }
done:
    free(first);
    for (int k = 0; k < 2; k++) {
        free(body[k]);
        free(ref[k]);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm -rf %s", dir);
}

/* Sends a POST /v1/completions without waiting for the answer: the
 * connection, or -1. */
static int post_async(int port, const char *body)
{
    char head[512];
    int n = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Authorization: Bearer %s\r\nContent-Length: %zu\r\n\r\n", key, strlen(body));
    int fd = dial(port);
    if (fd >= 0 && (send_all(fd, head, (size_t)n) || send_all(fd, body, strlen(body)))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* A server on the tiny generated model with 64-token prefill chunks and
 * `parallel` slots; 0 if it started. */
static int start_tiny(server *s, const char *tiny, int parallel, const char *what)
{
    char args[1024];
    snprintf(args, sizeof args, "-m %s -c 8192 -b 64 -t 1 --parallel %d --api-key %s", tiny, parallel, key);
    const int rc = start_server(s, args);
    CHECK(rc == 0, "%s server did not start", what);
    return rc == 0 && s->pid > 0 ? 0 : -1;
}

/* A completion body whose prompt is "hello world " x repeats (about 9
 * tokens per repeat on the tiny model), then suffix. NULL: out of memory. */
static char *hello_body(int repeats, const char *suffix, int max_tokens)
{
    text_buf t = { 0 };
    text_append(&t, "{\"prompt\": \"", 12);
    for (int i = 0; i < repeats; i++) text_append(&t, "hello world ", 12);
    char tail[128];
    int n = snprintf(tail, sizeof tail, "%s\", \"max_tokens\": %d, \"temperature\": 0}", suffix, max_tokens);
    text_append(&t, tail, (size_t)n);
    return t.data;
}

/* ---- the prefill gate: order and state without the clock ---------------------
 * A server started with SPARQ_TEST_PREFILL_GATE (server.h) takes one byte
 * from a FIFO before each prefill chunk while the test holds the FIFO open:
 * a long prompt stays mid-prefill for as long as the test needs, on a fast
 * machine or a slow one, and the test lets chunks through one at a time,
 * reading each one's size from /metrics. Waits below are for evidence
 * (a metric, a log line) with a generous bound that only a failure hits. */

typedef struct gated {
    server s;
    char   fifo[96];
    int    w;      /* the FIFO's write end: the gate is shut while open */
} gated;

static int start_gated(gated *g, const char *tiny, int parallel, const char *what)
{
    g->w = -1;
    snprintf(g->fifo, sizeof g->fifo, "/tmp/sparq_test_gate_%d_%s", (int)getpid(), what);
    unlink(g->fifo);
    if (mkfifo(g->fifo, 0600)) {
        CHECK(0, "mkfifo %s: %s", g->fifo, strerror(errno));
        return -1;
    }
    setenv("SPARQ_TEST_PREFILL_GATE", g->fifo, 1);
    const int rc = start_tiny(&g->s, tiny, parallel, what);
    unsetenv("SPARQ_TEST_PREFILL_GATE");
    /* the scheduler opens the read end as it starts: until then ENXIO */
    for (double t0 = now(); !rc && g->w < 0 && now() - t0 < 30; usleep(10000))
        g->w = open(g->fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    CHECK(rc || g->w >= 0, "%s: the server did not open its prefill gate", what);
    if (!rc && g->w < 0) stop_server(&g->s);
    if (rc || g->w < 0) {
        unlink(g->fifo);
        return -1;
    }
    return 0;
}

/* Opens the gate for good (the server reads end of file). */
static void gate_open_all(gated *g)
{
    if (g->w >= 0) close(g->w);
    g->w = -1;
}

static int stop_gated(gated *g)
{
    gate_open_all(g); /* a scheduler held at the gate could not stop */
    unlink(g->fifo);
    return stop_server(&g->s);
}

/* Lets one prefill chunk through and returns its size in tokens (the rise
 * of prefill_tokens_total from *total, which is updated); 0 if nothing was
 * prefilling (no request active or queued: the byte stays for later), -1
 * if no evidence came in 60 s. */
static long long gate_step(gated *g, long long *total)
{
    if (write(g->w, "x", 1) != 1) return -1;
    for (double t0 = now(); now() - t0 < 60; usleep(2000)) {
        /* idle first, then the count: a chunk that ran before the server
         * went idle is in the count read after */
        const int idle = metric(g->s.port, "active_sequences") == 0 && metric(g->s.port, "queue_depth") == 0;
        const long long t = metric(g->s.port, "prefill_tokens_total");
        if (t > *total) {
            const long long d = t - *total;
            *total = t;
            return d;
        }
        if (idle) return 0;
    }
    return -1;
}

/* Polls until metric `name` reaches at least want: its value, or the last
 * seen after 60 s (only a failure waits that long). */
static long long await_metric(int port, const char *name, long long want)
{
    long long v = -1;
    for (double t0 = now(); now() - t0 < 60; usleep(2000))
        if ((v = metric(port, name)) >= want) break;
    return v;
}

/* Slots /slots reports processing, or -1. */
static int slots_processing(int port)
{
    resp r;
    if (http(port, "GET", "/slots", NULL, 0, 1, &r)) return -1;
    int n = 0;
    for (const char *p = r.body; (p = strstr(p, "\"is_processing\":true")) != NULL; p++) n++;
    resp_free(&r);
    return n;
}

/* usage.prompt_tokens of a completion response, or -1. */
static int prompt_tokens(const resp *r)
{
    const char *p = r->body ? strstr(r->body, "\"prompt_tokens\":") : NULL;
    return p ? atoi(p + 16) : -1;
}

/* One run: the long prompt L (about 2700 tokens, 40+ chunks) and the short
 * S, the second sent while the gate holds the first after one chunk; the
 * sizes of the chunks as they ran go to seq (at most max), their number is
 * returned (-1: a failure, reported). *n_long, *n_short: their prompt
 * tokens as the answers count them. */
static int gated_order(const char *tiny, int long_first, long long *seq, int max, int *n_long, int *n_short)
{
    gated g;
    if (start_gated(&g, tiny, 2, long_first ? "order" : "order-control")) return -1;
    char *body_l = hello_body(300, "", 1);
    const char *body_s = "{\"prompt\": \"The cat sat\", \"max_tokens\": 1, \"temperature\": 0}";
    int n = 0, fl = -1, fs = -1, ok = body_l != NULL;
    long long total = 0;
    CHECK(ok, "out of memory");
    if (ok) {
        int *first = long_first ? &fl : &fs, *second = long_first ? &fs : &fl;
        *first = post_async(g.s.port, long_first ? body_l : body_s);
        ok = *first >= 0 && await_metric(g.s.port, "active_sequences", 1) == 1 && /* admitted, held */
             (seq[n++] = gate_step(&g, &total)) > 0;                             /* its first chunk */
        CHECK(ok, "order: the first request's first chunk (%lld)", seq[0]);
        /* the second arrives and queues while the first is held at the gate */
        if (ok) *second = post_async(g.s.port, long_first ? body_s : body_l);
        /* long first: it queues behind the held scheduler; short first:
         * the short one is done and the long one admitted and held */
        ok = ok && *second >= 0 &&
             await_metric(g.s.port, long_first ? "queue_depth" : "active_sequences", 1) == 1;
        CHECK(ok, "order: the second request is queued while the first is held");
        /* both admitted, the long one still prefilling: the state the
         * order is about (in the control the short one is done by then) */
        if (ok && long_first) {
            seq[n++] = gate_step(&g, &total); /* the next round admits the short one */
            seq[n++] = gate_step(&g, &total);
            CHECK(seq[1] > 0 && seq[2] > 0 && slots_processing(g.s.port) == 2,
                  "order: the short prompt was admitted while the long one was prefilling");
        }
        while (ok && n < max) {
            const long long d = gate_step(&g, &total);
            CHECK(d >= 0, "order: a chunk let through did not run");
            if (d <= 0) break;
            seq[n++] = d;
        }
    }
    gate_open_all(&g);
    resp r;
    *n_long = *n_short = -1;
    for (int i = 0; i < 2; i++) {
        const int fd = i ? fs : fl;
        CHECK(fd >= 0 && read_resp(fd, &r) == 0 && r.status == 200, "order: the %s request answered",
              i ? "short" : "long");
        if (fd >= 0 && r.head) {
            *(i ? n_short : n_long) = prompt_tokens(&r);
            resp_free(&r);
        }
        if (fd >= 0) close(fd);
    }
    free(body_l);
    CHECK(stop_gated(&g) == 0, "order server: SIGTERM did not end it cleanly");
    return ok ? n : -1;
}

/* Whether the chunk sizes seq[0..n) are the long prompt's n_long tokens
 * in full chunks first, then the short one's n_short in one chunk. */
static int long_then_short(const long long *seq, int n, int n_long, int n_short)
{
    long long sum = 0;
    for (int i = 0; i + 1 < n; i++) sum += seq[i];
    return n >= 2 && sum == n_long && seq[n - 1] == n_short;
}

/* Prefill goes in admission order: a short prompt admitted while a long
 * one is prefilling is prefilled (so answered) after all of it - round
 * robin would run its chunk second and hold every long prompt's first
 * token back. The control admits the short one first, and the same check
 * must then say no. */
static void prefill_order(const char *tiny)
{
    long long seq[128], ctl[128];
    int nl = -1, ns = -1, cl = -1, cs = -1;
    const int n = gated_order(tiny, 1, seq, 128, &nl, &ns);
    if (n < 0) return;
    CHECK(nl > 64 * 30 && ns > 0 && ns < 64, "prompt sizes: long %d, short %d tokens", nl, ns);
    CHECK(long_then_short(seq, n, nl, ns), "the short prompt admitted second was prefilled before the long one "
          "ended (%d chunks: %lld %lld %lld ... %lld; long %d, short %d)", n, seq[0], seq[1], seq[2], seq[n - 1], nl, ns);
    const int m = gated_order(tiny, 0, ctl, 128, &cl, &cs);
    if (m < 0) return;
    CHECK(m >= 2 && ctl[0] == cs && !long_then_short(ctl, m, cl, cs),
          "control: admitted first, the short prompt is prefilled first and the check says so (%d chunks, first %lld)",
          m, m ? ctl[0] : -1);
}

/* Lines of the server's log holding `what`. */
static int log_count(const server *s, const char *what)
{
    size_t size;
    char *t = (char *)test_read_file(s->log, &size);
    int n = 0;
    for (const char *p = t; p && (p = strstr(p, what)) != NULL; p++) n++;
    free(t);
    return n;
}

/* A request waiting for another sequence's prefill leaves the queue as
 * soon as its client hangs up (counted as cancelled while the prefill it
 * waited for still runs: the gate holds it); the prefilling request is
 * unaffected; and a waiting request whose client stays (the control) is
 * not cancelled and is answered from the prefix it waited for. */
static void waiting_disconnect(const char *tiny)
{
    gated g;
    if (start_gated(&g, tiny, 4, "waiting")) return;
    /* ~1800 tokens (28 chunks); B and C share A's document */
    char *body_a = hello_body(200, "", 2), *body_b = hello_body(200, "again", 2), *body_c = hello_body(200, "more", 2);
    int fa = -1, fb = -1, fc = -1, ok = body_a && body_b && body_c;
    long long total = 0;
    CHECK(ok, "out of memory");
    if (ok) {
        fa = post_async(g.s.port, body_a);
        /* A admitted and held; then prefilling, held after one chunk */
        ok = fa >= 0 && await_metric(g.s.port, "active_sequences", 1) == 1 && gate_step(&g, &total) > 0;
        CHECK(ok, "waiting: A's first chunk");
    }
    if (ok) {
        fb = post_async(g.s.port, body_b);
        fc = post_async(g.s.port, body_c);
        ok = fb >= 0 && fc >= 0 && await_metric(g.s.port, "queue_depth", 2) == 2;
        CHECK(ok, "waiting: B and C queued");
    }
    if (ok) {
        /* the next round considers them: both wait for A's prefill */
        ok = gate_step(&g, &total) > 0 && await_metric(g.s.port, "prefix_cache_waits_total", 2) == 2;
        CHECK(ok && metric(g.s.port, "queue_depth") == 2 && metric(g.s.port, "active_sequences") == 1,
              "waiting: B and C wait for A's prefill");
    }
    if (ok) {
        close(fb);
        fb = -1;
        /* the server has seen B's client go (its log line), then a round
         * runs: B leaves the queue; A is still held at the gate */
        int seen = 0;
        for (double t0 = now(); now() - t0 < 60 && !seen; usleep(5000)) seen = log_count(&g.s, "cancel=client_closed") == 1;
        CHECK(seen, "waiting: the server did not log B's hang-up");
        const long long d = gate_step(&g, &total);
        const long long cancelled = await_metric(g.s.port, "requests_cancelled_total", 1);
        struct pollfd p = { fa, POLLIN, 0 };
        const int a_pending = poll(&p, 1, 0) == 0;
        CHECK(d > 0 && cancelled == 1 && metric(g.s.port, "active_sequences") == 1 && a_pending,
              "the waiting request left the queue while A prefilled: cancelled %lld, A pending %d", cancelled, a_pending);
        /* the control: C, whose client stays, still waits */
        CHECK(metric(g.s.port, "queue_depth") == 1 && metric(g.s.port, "requests_cancelled_total") == 1,
              "control: the waiting request whose client stayed is still queued");
    }
    gate_open_all(&g);
    resp r;
    int na = -1;
    CHECK(fa >= 0 && read_resp(fa, &r) == 0 && r.status == 200, "A after B left: %d", fa >= 0 ? r.status : -1);
    if (fa >= 0 && r.head) {
        na = prompt_tokens(&r);
        resp_free(&r);
    }
    CHECK(fc >= 0 && read_resp(fc, &r) == 0 && r.status == 200, "C answered: %d", fc >= 0 ? r.status : -1);
    if (fc >= 0 && r.head) resp_free(&r);
    /* C continued A's prefix; nothing of B was prefilled */
    const long long pre = metric(g.s.port, "prefill_tokens_total");
    CHECK(na > 1000 && metric(g.s.port, "prefix_cache_hits_total") == 1 && pre >= na && pre < na + 200,
          "only A's document was prefilled, once: %lld tokens, A %d", pre, na);
    for (int i = 0; i < 3; i++) {
        const int fd = i == 0 ? fa : i == 1 ? fb : fc;
        if (fd >= 0) close(fd);
    }
    free(body_a);
    free(body_b);
    free(body_c);
    CHECK(stop_gated(&g) == 0, "waiting server: SIGTERM did not end it cleanly");
}

int main(void)
{
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_server");
    }
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_server");
    }
    signal(SIGPIPE, SIG_IGN);
    server s;
    char args[2048];
    snprintf(args, sizeof args,
             "-m %s -c 256 -b 4 -t 1 --parallel 16 --queue 32 --api-key %s --chat-template chatml --max-body 65536", model,
             key);
    CHECK(start_server(&s, args) == 0, "server did not start");
    if (s.pid > 0) {
        raw_http(s.port);
        unsupported_fields(s.port);
        cors(s.port);
        n_choices(s.port);
        /* 16 cases: every policy, several prompts */
        static const char *prompts[] = { "Once upon a time", "The little dog", "Lily and Ben went to the park",
                                         "One day" };
        static const struct { const char *run, *json; } pols[] = {
            { "", NULL },
            { "--attn sparq --sparq-ratio 1/8", "{\"attn\": \"sparq\", \"ratio\": \"1/8\"}" },
            { "--attn sparq --sparq-r 2 --sparq-k 8", "{\"attn\": \"sparq\", \"r\": 2, \"k\": 8}" },
            { "--attn oracle --attn-k 8", "{\"attn\": \"oracle\", \"attn_k\": 8}" },
            { "--attn flexgen --attn-k 8", "{\"attn\": \"flexgen\", \"attn_k\": 8}" },
            { "--attn h2o --attn-k 12", "{\"attn\": \"h2o\", \"attn_k\": 12}" },
            { "--attn streaming --attn-k 12 --n-sink 4", "{\"attn\": \"streaming\", \"attn_k\": 12, \"n_sink\": 4}" },
            { "--attn topk --topk-k 8", "{\"attn\": \"topk\", \"topk_k\": 8}" },
        };
        gcase cases[16];
        for (int i = 0; i < 16; i++) {
            cases[i].prompt = prompts[i / 8 * 2 + (i % 2)];
            cases[i].run_args = pols[i % 8].run;
            cases[i].json = pols[i % 8].json;
            cases[i].text = NULL;
        }
        char expect[64] = "/tmp/sparq_test_server_expect_XXXXXX";
        int fd = mkstemp(expect);
        if (fd >= 0) close(fd);
        if (fd >= 0 && greedy_vs_run(s.port, model, cases, 16, expect) == 0) node_tests(s.port, expect);
        /* prompts were repeated with -b 4: later ones started from cached
         * prefixes, and every text above still matched sparq run's */
        resp r;
        int rc = http(s.port, "GET", "/metrics", NULL, 0, 1, &r);
        const char *hits = rc ? NULL : strstr(r.body, "\nsparq_prefix_cache_hits_total ");
        CHECK(hits && atoi(hits + 31) >= 8, "prefix cache hits: %s", rc ? "" : r.body);
        if (hits) fprintf(stderr, "prefix cache hits: %d\n", atoi(hits + 31));
        if (!rc) resp_free(&r);
        unlink(expect);
        for (int i = 0; i < 16; i++) free(cases[i].text);
        CHECK(stop_server(&s) == 0, "SIGTERM did not end the server cleanly");
    }
    shared_document(model);
    warm_tails(model);
    kv_dir_burst(model);
    kv_dir_mismatch(model);
    kv_dir_named_other(model);
    loaded_document(model);
    if (s.pid > 0) {
        /* validation needs a running server: a fresh one */
        snprintf(args, sizeof args, "-m %s -c 256 -t 1 --api-key %s", model, key);
        if (start_server(&s, args) == 0) {
            named_document(model, s.port);
            chat_fallback(model, &s);
            CHECK(stop_server(&s) == 0, "named-document server: SIGTERM did not end it cleanly");
        }
    }
    /* a model slow enough that one stream outlives the checks around it */
    char tiny[64];
    snprintf(tiny, sizeof tiny, "/tmp/sparq_test_server_tiny_%d.gguf", (int)getpid());
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s gen-model --shape tiny --type Q8_0 -c 8192 -o %s >/dev/null 2>&1", bin, tiny);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "gen-model tiny failed");
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 0) {
        overload_and_disconnect(tiny);
        waiting_disconnect(tiny);
        prefill_order(tiny);
        request_timeout(tiny);
    }
    unlink(tiny);
    return test_summary("test_server");
}
