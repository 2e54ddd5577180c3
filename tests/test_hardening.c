/* test_hardening.c - what a hostile file system or client must not do to
 * sparq, each check bounded in time (a hang is a failure, never a stuck
 * test):
 *
 *  - a FIFO, a directory or a device where a file is read (the GGUF
 *    loader, KV files, prompt files, .gz evaluation data, `serve --api-key-file`, `run -f`,
 *    `run --load-kv`, `serve -m`) is refused at once with a one-line error;
 *  - a FIFO under a KV file's name in `serve --kv-dir` is left alone and
 *    the request is served (prefilled) instead of hanging the scheduler;
 *  - a symlink planted at a KV writer's temp name (`--kv-dir`'s per-writer
 *    name, `prefill --save-kv`'s FILE.tmp) never lets the writer change
 *    the file it points to;
 *  - HTTP: a duplicate key is a 400 naming it; paths with %00 or a raw
 *    NUL are 400s; 404/405/413/401 are JSON error objects; a wrong API key
 *    or a declared body over the limit is answered from the head alone
 *    (the body is never sent here, and the answer comes at once);
 *  - past --max-conns / --max-conns-per-ip a 503 error object, not a
 *    reset; a head trickling in is cut at --read-timeout;
 *  - one log line per request on stderr (status, route, tokens, time,
 *    cancel reason), also for a head libmicrohttpd refused itself (431:
 *    its HTML, the one error body that is not ours); a client's cancellation counts in
 *    sparq_requests_cancelled_total, not in sparq_request_errors_total.
 */
#include "test.h"
#include "test_proc.h"
#include "eval/task_impl.h"
#include "io/kvfile.h"
#include "tensor/gguf.h"
#include "util/json.h"
#include "util/paths.h"
#include "util/textbuf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char bin[1024];
static const char *key = "test-key-123";

/* ---- bounded children ----------------------------------------------------------- */

/* Waits up to secs for child pid: its exit status, or -1 after killing it
 * (it hung). */
static int wait_child(pid_t pid, double secs)
{
    int st = 0;
    for (double t0 = now(); now() - t0 < secs; usleep(10000))
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* Runs `sparq ARGS` with output to a file: the exit status (-1: killed
 * after secs) and the output (malloc'ed) in *out. */
static int run_sparq(const char *args, double secs, char **out)
{
    char log[] = "/tmp/sparq_test_hardening_run_XXXXXX";
    const int fd = mkstemp(log);
    *out = NULL;
    if (fd < 0) return -2;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s %s </dev/null", bin, args);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd);
    const int rc = pid > 0 ? wait_child(pid, secs) : -2;
    size_t n;
    *out = test_read_file(log, &n);
    unlink(log);
    return rc;
}

/* ---- the server process ------------------------------------------------------ */

typedef proc_server server;

static int start_server(server *s, const char *args)
{
    const int rc = proc_server_start(s, bin, "hardening", args);
    CHECK(rc == 0, "server did not start (log %s): serve %s", s->log, args);
    return rc;
}

/* SIGTERM, then the exit status (-1 if it hangs for 20 s: then killed);
 * the log (malloc'ed) in *log if log is not NULL. */
static int stop_server(server *s, char **log)
{
    if (log) *log = NULL;
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    const int rc = wait_child(s->pid, 20);
    s->pid = -1;
    size_t n;
    if (log) *log = test_read_file(s->log, &n);
    unlink(s->port_file);
    unlink(s->log);
    return rc;
}

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
    int    status;
    char  *head, *body;
    double secs;        /* until the server closed */
} resp;

/* Reads until the server closes, at most secs: 0, or -1 if nothing came
 * (or no status line). */
static int read_resp(int fd, resp *r, double secs)
{
    text_buf t = { 0 };
    char buf[8192];
    const double t0 = now();
    int closed = 0;
    while (!closed && now() - t0 < secs) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got <= 0) closed = 1;
        else text_append(&t, buf, (size_t)got);
    }
    memset(r, 0, sizeof *r);
    r->secs = now() - t0;
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

static void resp_free(resp *r)
{
    free(r->head);
    free(r->body);
    r->head = r->body = NULL;
}

/* Sends raw bytes (head and maybe body) and reads the answer within secs. */
static int raw(int port, const char *data, size_t len, double secs, resp *r)
{
    memset(r, 0, sizeof *r);
    const int fd = dial(port);
    if (fd < 0) return -1;
    int rc = send_all(fd, data, len);
    rc = read_resp(fd, r, secs) || rc;
    close(fd);
    return rc ? -1 : 0;
}

/* One request with the API key, answered within secs. */
static int http_t(int port, const char *method, const char *path, const char *body, double secs, resp *r)
{
    char head[1024];
    const size_t blen = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, key, blen);
    text_buf t = { 0 };
    text_append(&t, head, (size_t)n);
    if (body) text_append(&t, body, blen);
    const int rc = t.data ? raw(port, t.data, t.len, secs, r) : -1;
    free(t.data);
    return rc;
}

static int http(int port, const char *method, const char *path, const char *body, resp *r)
{
    return http_t(port, method, path, body, 120, r);
}

/* The body is an OpenAI error object with a message containing want. */
static int is_error(const resp *r, const char *want)
{
    char err[256];
    if (!r->body) return 0;
    json_doc *d = json_parse(r->body, strlen(r->body), 0, err, sizeof err);
    if (!d) return 0;
    const json_value *e = json_get(json_root(d), "error");
    const char *msg = json_get_str(e, "message", NULL);
    const json_value *type = json_get(e, "type"), *code = json_get(e, "code");
    int ok = msg && strstr(msg, want) && type && type->type == JSON_STRING && code;
    json_free(d);
    return ok;
}

static long long metric(int port, const char *name)
{
    resp r;
    if (http(port, "GET", "/metrics", NULL, &r)) return -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\nsparq_%s ", name);
    const char *p = r.body ? strstr(r.body, pat) : NULL;
    long long v = p ? atoll(p + strlen(pat)) : -1;
    resp_free(&r);
    return v;
}

/* ---- files that are not files ---------------------------------------------------- */

/* In a child, so a blocking open is a failure here and not a stuck test:
 * which = 0 gguf_open, 1 kvf_open, 2 text_read_file, 3 sparq_model_load,
 * 4 task_read_gz (the evaluation's .gz data).
 * The child exits 0 if path was refused with "regular" in the message. */
static int refused_in_child(int which, const char *path)
{
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        char err[512] = "";
        int rc = -1;
        if (which == 0) {
            gguf_file *g = NULL;
            rc = gguf_open(path, &g, err, sizeof err);
            gguf_close(g);
        } else if (which == 1) {
            kvf_file *f = NULL;
            kvf_fingerprint fp;
            kvf_synthetic_fingerprint(&fp, 1, 1, 1, 8);
            rc = kvf_open(path, &fp, KVF_VERIFY_AUTO, &f, err, sizeof err);
            kvf_close(f);
        } else if (which == 2) {
            size_t n;
            char *t = text_read_file(path, &n);
            rc = t ? 0 : -1;
            snprintf(err, sizeof err, "regular");
            free(t);
        } else if (which == 3) {
            sparq_model *m = NULL;
            rc = sparq_model_load(path, &m, err, sizeof err);
            if (m) sparq_model_free(m);
        } else {
            char *t = NULL;
            size_t n;
            rc = task_read_gz("test", path, &t, &n, err, sizeof err);
            free(t);
        }
        _exit(rc != 0 && (strstr(err, "regular") || strstr(err, "directory")) && !strchr(err, '\n') ? 0 : 1);
    }
    return pid > 0 ? wait_child(pid, 10) : -2;
}

static void library_refuses_non_files(void)
{
    char dir[] = "/tmp/sparq_test_hardening_fifo_XXXXXX", fifo[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(fifo, sizeof fifo, "%s/f", dir);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    static const char *const what[] = { "gguf_open", "kvf_open", "text_read_file", "sparq_model_load", "task_read_gz" };
    const char *paths[] = { fifo, dir, "/dev/null" };
    for (int w = 0; w < 5; w++)
        for (int p = 0; p < 3; p++) {
            const int rc = refused_in_child(w, paths[p]);
            CHECK(rc == 0, "%s('%s'): %s", what[w], paths[p],
                  rc == -1 ? "hung (killed after 10 s)" : "not refused as a non-regular file");
        }
    unlink(fifo);
    rmdir(dir);
}

/* The command line: each refused within 20 s with a one-line error. */
static void cli_refuses_non_files(const char *model)
{
    char dir[] = "/tmp/sparq_test_hardening_cli_XXXXXX", fifo[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(fifo, sizeof fifo, "%s/f", dir);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    char cases[5][1200];
    snprintf(cases[0], sizeof cases[0], "serve -m %s -t 1 --port 0 --api-key-file %s", model, fifo);
    snprintf(cases[1], sizeof cases[1], "serve -m %s -t 1 --port 0 --api-key-file %s", model, dir);
    snprintf(cases[2], sizeof cases[2], "run -m %s -t 1 -n 1 -f %s", model, fifo);
    snprintf(cases[3], sizeof cases[3], "run -m %s -t 1 -n 1 --load-kv %s", model, fifo);
    snprintf(cases[4], sizeof cases[4], "serve -m %s -t 1 --port 0", fifo);
    for (int i = 0; i < 5; i++) {
        char *out = NULL;
        const int rc = run_sparq(cases[i], 20, &out);
        const char *line = out ? strstr(out, "error") : NULL;
        CHECK(rc > 0 && rc < 128 && line && strstr(line, "not a regular file") && strchr(line, '\n') &&
                  !strchr(strchr(line, '\n') + 1, '\n'),
              "sparq %s: exit %d (-1: hung), output: %s", cases[i], rc, out ? out : "(none)");
        free(out);
    }
    unlink(fifo);
    rmdir(dir);
}

/* ---- --kv-dir ------------------------------------------------------------------- */

/* A completion body whose prompt is n token ids drawn from seed. */
static char *doc_body(uint32_t seed, int n)
{
    text_buf t = { 0 };
    text_append(&t, "{\"prompt\": [1", 13);
    for (int i = 1; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        char num[16];
        int k = snprintf(num, sizeof num, ",%d", 3 + (int)(seed >> 8) % 480);
        text_append(&t, num, (size_t)k);
    }
    text_append(&t, "], \"max_tokens\": 4, \"temperature\": 0}", 38);
    return t.data;
}

static char *completion_text(const resp *r)
{
    char err[256];
    if (r->status != 200 || !r->body) return NULL;
    json_doc *d = json_parse(r->body, strlen(r->body), 0, err, sizeof err);
    if (!d) return NULL;
    size_t n = 0;
    const char *t = json_get_str(json_at(json_get(json_root(d), "choices"), 0), "text", &n);
    char *out = t ? strndup(t, n) : NULL;
    json_free(d);
    return out;
}

static int kv_settle(int port)
{
    for (double t0 = now(); now() - t0 < 30; usleep(20000))
        if (metric(port, "kv_dir_pending") == 0) return 0;
    return -1;
}

/* The names of the KV files in dir (up to max), their count. */
static int kv_names(const char *dir, char names[][40], int max)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strlen(e->d_name) == 35 && !strcmp(e->d_name + 32, ".kv") && n < max)
            snprintf(names[n++], 40, "%s", e->d_name);
    if (d) closedir(d);
    return n;
}

/* Serves body once on a fresh server over dir: the answer's text. */
static char *serve_once(const char *args, const char *body, int *files_written)
{
    server s;
    char *text = NULL;
    if (start_server(&s, args)) return NULL;
    resp r;
    if (http(s.port, "POST", "/v1/completions", body, &r) == 0) {
        text = completion_text(&r);
        resp_free(&r);
    }
    CHECK(kv_settle(s.port) == 0, "kv-dir writes did not settle");
    if (files_written) *files_written = (int)metric(s.port, "kv_dir_writes_total");
    CHECK(stop_server(&s, NULL) == 0, "server: SIGTERM did not end it cleanly");
    return text;
}

/* A FIFO where a KV file should be: the request is prefilled and answered
 * the same; the FIFO stays. */
static void kv_dir_fifo(const char *model)
{
    char dir[] = "/tmp/sparq_test_hardening_kvfifo_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char args[2048], names[8][40], p[128];
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --kv-dir %s --api-key %s", model, dir, key);
    char *body = doc_body(777, 200);
    int written = 0;
    char *ref = body ? serve_once(args, body, &written) : NULL;
    const int n = kv_names(dir, names, 8);
    CHECK(ref && n >= 1 && written == n, "the first server wrote %d KV files (%d counted)", n, written);
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        CHECK(unlink(p) == 0 && mkfifo(p, 0600) == 0, "FIFO at %s", p);
    }
    server s;
    if (n >= 1 && start_server(&s, args) == 0) {
        resp r;
        const int rc = http_t(s.port, "POST", "/v1/completions", body, 30, &r);
        char *text = rc == 0 ? completion_text(&r) : NULL;
        CHECK(text && !strcmp(text, ref), "a FIFO in --kv-dir: %s", rc ? "no answer in 30 s" : r.body);
        free(text);
        if (!rc) resp_free(&r);
        CHECK(metric(s.port, "kv_dir_hits_total") == 0, "a FIFO counted as a KV hit");
        char *log = NULL;
        CHECK(stop_server(&s, &log) == 0, "FIFO server: SIGTERM did not end it cleanly (it hung)");
        CHECK(log && strstr(log, "not a regular file"), "the FIFO is not reported: %s", log ? log : "");
        free(log);
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, names[0]);
        CHECK(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was removed or replaced");
    }
    free(ref);
    free(body);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm %s", dir);
}

/* A victim file with known bytes; 1 if it still holds them. */
static const char victim_text[] = "precious: not a KV file\n";
static int victim_intact(const char *path)
{
    size_t n;
    char *t = test_read_file(path, &n);
    const int ok = t && n == strlen(victim_text) && !memcmp(t, victim_text, n);
    free(t);
    return ok;
}

static int write_victim(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(victim_text, f);
    return fclose(f);
}

/* Symlinks to a victim at every temp name a writer of this process will
 * use: its KV file still comes out as a regular file, the victim keeps its
 * bytes. */
static void kv_dir_symlinks(const char *model)
{
    char dir[] = "/tmp/sparq_test_hardening_kvlink_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char victim[128], args[2048], names[8][40], p[512];
    snprintf(victim, sizeof victim, "%s.victim", dir);
    CHECK(write_victim(victim) == 0, "victim");
    snprintf(args, sizeof args, "-m %s -c 256 -b 16 -t 1 --prefix-cache 0 --kv-dir %s --api-key %s", model, dir, key);
    char *body = doc_body(4242, 200);
    char *ref = body ? serve_once(args, body, NULL) : NULL;
    const int n = kv_names(dir, names, 8);
    CHECK(ref && n >= 1, "the first server wrote %d KV files", n);
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    server s;
    if (n >= 1 && start_server(&s, args) == 0) {
        /* the writer's name: DIR/.NAME.PID.SEQ.part (older builds wrote
         * NAME.part.tmp first): links at both, for the first few writes */
        int planted = 0;
        for (int i = 0; i < n; i++)
            for (unsigned seq = 0; seq < 4; seq++)
                for (int tmp = 0; tmp < 2; tmp++) {
                    snprintf(p, sizeof p, "%s/.%s.%ld.%u.part%s", dir, names[i], (long)s.pid, seq, tmp ? ".tmp" : "");
                    planted += symlink(victim, p) == 0;
                }
        CHECK(planted == n * 8, "planted %d symlinks", planted);
        resp r;
        const int rc = http(s.port, "POST", "/v1/completions", body, &r);
        char *text = rc == 0 ? completion_text(&r) : NULL;
        CHECK(text && !strcmp(text, ref), "answer beside planted links: %s", rc ? "none" : r.body);
        free(text);
        if (!rc) resp_free(&r);
        CHECK(kv_settle(s.port) == 0, "kv-dir writes did not settle");
        const long long errors = metric(s.port, "kv_dir_errors_total"), writes = metric(s.port, "kv_dir_writes_total");
        CHECK(stop_server(&s, NULL) == 0, "symlink server: SIGTERM did not end it cleanly");
        CHECK(victim_intact(victim), "the victim behind a planted temp-name symlink was overwritten");
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, names[0]);
        CHECK(lstat(p, &st) == 0 && S_ISREG(st.st_mode) && errors == 0 && writes >= 1,
              "the KV file is not a regular file written anew (errors %lld, writes %lld)", errors, writes);
    }
    /* prefill --save-kv FILE writes FILE.tmp first: a link there too */
    char out[256], tmp[272];
    snprintf(out, sizeof out, "%s/saved.kv", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    CHECK(symlink(victim, tmp) == 0, "symlink %s", tmp);
    snprintf(args, sizeof args, "prefill -m %s -t 1 -p 'Once upon a time' --save-kv %s", model, out);
    char *log = NULL;
    const int rc = run_sparq(args, 60, &log);
    struct stat st;
    CHECK(rc == 0 && lstat(out, &st) == 0 && S_ISREG(st.st_mode), "prefill --save-kv beside a planted link: exit %d: %s",
          rc, log ? log : "");
    CHECK(victim_intact(victim), "prefill --save-kv wrote through the symlink at FILE.tmp");
    free(log);
    free(ref);
    free(body);
    unlink(victim);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm %s", dir);
}

/* ---- HTTP ------------------------------------------------------------------------ */

/* The log line of the request that matches all of the given parts, or NULL. */
static const char *log_line(const char *log, const char *a, const char *b, const char *c)
{
    for (const char *p = log ? strstr(log, "serve: request ") : NULL; p; p = strstr(p + 1, "serve: request ")) {
        const char *end = strchr(p, '\n');
        if (!end) return NULL;
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(end - p), p);
        if (strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c))) return p;
    }
    return NULL;
}

static void http_hardening(const char *model)
{
    server s;
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 256 -t 1 --api-key %s --max-body 65536", model, key);
    if (start_server(&s, args)) return;
    resp r;
    /* a key twice */
    CHECK(http(s.port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1, \"max_tokens\": 500}", &r) == 0 &&
              r.status == 400 && is_error(&r, "duplicate key \"max_tokens\""),
          "duplicate key: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    /* NUL in the path, encoded or raw: never /health */
    static const char *const nul_paths[] = { "/health%00", "/health%00x", "/v1/models%00/x" };
    for (int i = 0; i < 3; i++) {
        CHECK(http(s.port, "GET", nul_paths[i], NULL, &r) == 0 && r.status == 400 && is_error(&r, "NUL"),
              "GET %s: %d %s", nul_paths[i], r.status, r.body ? r.body : "");
        resp_free(&r);
    }
    static const char raw_nul[] = "GET /health\0x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    CHECK(raw(s.port, raw_nul, sizeof raw_nul - 1, 10, &r) == 0 && r.status == 400 && is_error(&r, "NUL"),
          "a raw NUL in the path: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    CHECK(http(s.port, "GET", "/health?x=%00", NULL, &r) == 0 && r.status == 200, "%%00 in the query is not the path");
    resp_free(&r);
    /* the error statuses the server sends are JSON error objects */
    CHECK(http(s.port, "GET", "/nowhere", NULL, &r) == 0 && r.status == 404 && is_error(&r, "no endpoint"),
          "404: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    CHECK(http(s.port, "PUT", "/v1/completions", NULL, &r) == 0 && r.status == 405 && is_error(&r, "POST") &&
              strstr(r.head, "Allow: POST"),
          "405: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    /* refused from the head: the body is never sent, the answer must not
     * wait for it (the old code waited for the whole declared body) */
    static const char wrong_key[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
                                    "Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n";
    CHECK(raw(s.port, wrong_key, sizeof wrong_key - 1, 5, &r) == 0 && r.status == 401 && is_error(&r, "API key") &&
              r.secs < 5,
          "wrong key with a body to come: %d after %.1f s", r.status, r.secs);
    resp_free(&r);
    static const char huge[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-key-123\r\n"
                               "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n";
    CHECK(raw(s.port, huge, sizeof huge - 1, 5, &r) == 0 && r.status == 413 && is_error(&r, "exceeds the limit") &&
              r.secs < 5,
          "declared body over the limit: %d after %.1f s", r.status, r.secs);
    resp_free(&r);
    /* a chunked body (no Content-Length) over the limit: 413 at its end */
    {
        text_buf t = { 0 };
        const char *h = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
                        "test-key-123\r\nTransfer-Encoding: chunked\r\n\r\n";
        text_append(&t, h, strlen(h));
        char chunk[8192 + 16];
        const int hn = snprintf(chunk, sizeof chunk, "2000\r\n");
        memset(chunk + hn, ' ', 8192);
        memcpy(chunk + hn + 8192, "\r\n", 2);
        for (int i = 0; i < 10; i++) text_append(&t, chunk, (size_t)hn + 8194);
        text_append(&t, "0\r\n\r\n", 5);
        CHECK(t.data && raw(s.port, t.data, t.len, 20, &r) == 0 && r.status == 413 && is_error(&r, "exceeds"),
              "chunked body over the limit: %d %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        free(t.data);
    }
    /* headers over libmicrohttpd's memory limit: it answers 431 itself
     * (HTML; 0.9.75 has no hook for its own error bodies), before our
     * handler runs; the request is still logged */
    {
        const size_t big = 300 * 1024;
        char *h = malloc(big + 128);
        CHECK(h != NULL, "out of memory");
        if (h) {
            int hn = snprintf(h, 128, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
            memset(h + hn, 'a', big);
            memcpy(h + hn + big, "\r\n\r\n", 4);
            CHECK(raw(s.port, h, (size_t)hn + big + 4, 10, &r) == 0 && (r.status == 431 || r.status == 413),
                  "over-size headers: %d", r.status);
            resp_free(&r);
            free(h);
        }
    }
    /* one completion, for its log line */
    CHECK(http(s.port, "POST", "/v1/completions", "{\"prompt\": [1, 2, 3], \"max_tokens\": 3, \"temperature\": 0, "
                                                  "\"ignore_eos\": true}", &r) == 0 && r.status == 200,
          "completion: %d", r.status);
    resp_free(&r);
    char *log = NULL;
    CHECK(stop_server(&s, &log) == 0, "SIGTERM did not end the server cleanly");
    CHECK(log_line(log, "route=/v1/completions", "status=400", "method=POST"), "no log line of the 400");
    CHECK(log_line(log, "route=/health", "status=400", "method=GET"), "no log line of the NUL path");
    CHECK(log_line(log, "route=- ", "status=404", NULL), "no log line of the 404 (the path itself is not logged)");
    CHECK(log_line(log, "status=405", "method=PUT", NULL), "no log line of the 405");
    CHECK(log_line(log, "status=401", NULL, NULL), "no log line of the 401");
    CHECK(log_line(log, "status=413", NULL, NULL), "no log line of the 413");
    CHECK(log_line(log, "status=200 tokens_in=3 tokens_out=3", "completion=cmpl-", " ms="),
          "no log line of the completion");
    CHECK(log_line(log, "status=0 ", "cancel=bad_head", NULL), "no log line of the over-size head");
    int lines = 0;
    for (const char *p = log ? strstr(log, "serve: request ") : NULL; p; p = strstr(p + 1, "serve: request ")) lines++;
    CHECK(lines == 13, "%d request log lines for 13 requests:\n%s", lines, log ? log : "");
    free(log);
}

/* Connections past --max-conns (or --max-conns-per-ip from one address)
 * get a 503 error object at once, not a reset; a request whose head
 * trickles in a byte at a time is cut at --read-timeout (libmicrohttpd's
 * own timeout counts idle time only, so it never fires for such a
 * client). */
static void connection_limits(const char *model)
{
    server s;
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 256 -t 1 --max-conns 3 --read-timeout 2", model);
    if (start_server(&s, args) == 0) {
        int idle[3];
        for (int i = 0; i < 3; i++) idle[i] = dial(s.port);
        usleep(200000);
        resp r;
        static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        CHECK(raw(s.port, health, sizeof health - 1, 5, &r) == 0 && r.status == 503 &&
                  is_error(&r, "too many open connections") && strstr(r.head, "Retry-After") && r.secs < 3,
              "a 4th connection past --max-conns 3: %d after %.1f s", r.status, r.secs);
        resp_free(&r);
        for (int i = 0; i < 3; i++)
            if (idle[i] >= 0) close(idle[i]);
        usleep(200000);
        CHECK(raw(s.port, health, sizeof health - 1, 5, &r) == 0 && r.status == 200, "served again: %d", r.status);
        resp_free(&r);
        /* the request line, then a header byte every 0.2 s */
        const int fd = dial(s.port);
        const char *line = "GET /health HTTP/1.1\r\nHost: x\r\n";
        CHECK(fd >= 0 && send_all(fd, line, strlen(line)) == 0, "slow client");
        const double t0 = now();
        double cut = -1;
        for (int i = 0; fd >= 0 && cut < 0 && now() - t0 < 10; i++) {
            const char c = "X-Slow: 1\r\n"[i % 11];
            if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) cut = now() - t0;
            struct pollfd p = { fd, POLLIN, 0 };
            char b;
            if (cut < 0 && poll(&p, 1, 200) > 0 && recv(fd, &b, 1, 0) <= 0) cut = now() - t0;
        }
        if (fd >= 0) close(fd);
        CHECK(cut > 1 && cut < 6, "a head trickling in for 10 s: cut after %.1f s (-1: never)", cut);
        char *log = NULL;
        CHECK(stop_server(&s, &log) == 0, "SIGTERM did not end the server cleanly");
        CHECK(log_line(log, "route=/health", "status=503", NULL), "no log line of the 503");
        CHECK(log_line(log, "status=0 ", "cancel=read_timeout", NULL), "no log line of the cut request:\n%s",
              log ? log : "");
        free(log);
    }
    snprintf(args, sizeof args, "-m %s -c 256 -t 1 --max-conns-per-ip 2", model);
    if (start_server(&s, args) == 0) {
        int idle[2];
        for (int i = 0; i < 2; i++) idle[i] = dial(s.port);
        usleep(200000);
        resp r;
        static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        CHECK(raw(s.port, health, sizeof health - 1, 5, &r) == 0 && r.status == 503 && is_error(&r, "your address"),
              "a 3rd connection from one address past --max-conns-per-ip 2: %d", r.status);
        resp_free(&r);
        for (int i = 0; i < 2; i++)
            if (idle[i] >= 0) close(idle[i]);
        CHECK(stop_server(&s, NULL) == 0, "SIGTERM did not end the server cleanly");
    }
}

/* A client that leaves mid-stream: cancelled, not an error; logged so. */
static void cancel_counted_apart(const char *tiny)
{
    server s;
    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 8192 -t 1 --parallel 1 --api-key %s", tiny, key);
    if (start_server(&s, args)) return;
    const char *body = "{\"prompt\": [1, 2, 3], \"max_tokens\": 8000, \"ignore_eos\": true, \"temperature\": 0, "
                       "\"stream\": true}";
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %zu\r\n\r\n%s",
                     key, strlen(body), body);
    int fd = dial(s.port);
    CHECK(fd >= 0 && send_all(fd, head, (size_t)n) == 0, "stream request");
    char buf[4096];
    ssize_t got = 0;
    for (double t0 = now(); fd >= 0 && got <= 0 && now() - t0 < 60;) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 200) > 0) got = recv(fd, buf, sizeof buf - 1, 0);
    }
    CHECK(got > 0, "the stream did not start");
    if (fd >= 0) close(fd);
    long long cancelled = 0;
    for (double t0 = now(); now() - t0 < 30 && cancelled < 1; usleep(50000))
        cancelled = metric(s.port, "requests_cancelled_total");
    const long long errors = metric(s.port, "request_errors_total");
    CHECK(cancelled == 1 && errors == 0, "a client's disconnect: cancelled %lld, errors %lld", cancelled, errors);
    char *log = NULL;
    CHECK(stop_server(&s, &log) == 0, "SIGTERM did not end the server cleanly");
    CHECK(log_line(log, "route=/v1/completions", "status=200", "cancel=client_closed"),
          "no log line of the cancelled stream:\n%s", log ? log : "");
    free(log);
}

int main(void)
{
    char model[1024];
    signal(SIGPIPE, SIG_IGN);
    library_refuses_non_files();
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_hardening");
    }
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_hardening");
    }
    cli_refuses_non_files(model);
    http_hardening(model);
    connection_limits(model);
    kv_dir_fifo(model);
    kv_dir_symlinks(model);
    char tiny[64], cmd[1200];
    snprintf(tiny, sizeof tiny, "/tmp/sparq_test_hardening_tiny_%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s gen-model --shape tiny --type Q8_0 -c 8192 -o %s >/dev/null 2>&1", bin, tiny);
    const int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "gen-model tiny failed");
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 0) cancel_counted_apart(tiny);
    unlink(tiny);
    return test_summary("test_hardening");
}
