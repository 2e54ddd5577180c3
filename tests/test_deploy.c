/* test_deploy.c - deploy/nginx/sparq.conf in front of three `sparq serve`
 * replicas, all on 127.0.0.1 with free ports, every wait bounded, every
 * process stopped at the end (also on failure).
 *
 * nginx (Debian's) runs unprivileged-style from a mkdtemp directory: its own
 * pid, logs and temp paths, `daemon off`, started and killed here; its
 * configuration is the deploy file itself, included with two small files
 * naming the replicas and the listen port.
 *
 * 30 questions about 3 documents (a shared prompt prefix of D tokens, D a
 * multiple of the batch size, so the prefix cache holds exactly the
 * document; a short question after it), sent with X-Document-Id from
 * concurrent clients:
 *  - phase A (3 requests, one per document) and B (12, 3 of them streamed):
 *    every answer equals that of a single `sparq serve` for the same prompt
 *    (greedy); all questions about a document went to one replica; each
 *    replica's /metrics show it prefilled each of its documents once
 *    (prefix-cache hits = its requests - its documents; prompt tokens
 *    prefilled = D per document + every prompt's question tokens); streams
 *    arrive as text/event-stream, not gzipped, with the same text;
 *  - phase C (15): the replica holding most documents is SIGKILLed while
 *    its scheduler is held at the test-only prefill gate
 *    (SPARQ_TEST_PREFILL_GATE), so requests are in flight there on any
 *    machine: a stream that has begun (headers and first token read), a
 *    request not streamed, and at least one phase-C question. What
 *    deploy/README.md promises is what the clients see: the unanswered
 *    ones are resent (X-Sparq-Upstream names the dead replica, then the
 *    one that answered) and get the reference answer in full - every
 *    phase-C question, none an error; the begun stream stays cut (200,
 *    a prefix of the reference, no [DONE]);
 *  - the replicas share a --kv-dir: each writes one file per document it
 *    prefilled; after the kill the survivors load the dead replica's
 *    documents from it (their prefilled tokens grow by the questions only:
 *    no document is prefilled twice across the cluster), and the directory
 *    holds only complete files (every checksum verified), no temp file;
 *  - --kv-dir-max: a replica with a 1 MiB budget stays within it, evicts the
 *    least recently used file first.
 * Without nginx: a failure when CI=true, a skip otherwise.
 */
#include "test.h"
#include "test_proc.h"
#include "sparq.h"
#include "util/json.h"
#include "util/paths.h"
#include "util/textbuf.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { N_REP = 3, N_DOC = 3, N_Q = 10, NB = 32, DOC_TOKENS = 256, MAX_TOKENS = 32 };


/* ---- processes ------------------------------------------------------------------ */

typedef struct proc {
    pid_t pid;
    int   port;
} proc;

/* Starts `sparq serve` with its log and port file in dir; waits for the port. */
static int start_server(proc *p, const char *bin, const char *dir, const char *name, const char *args)
{
    char log[PATH_MAX], port_file[PATH_MAX], cmd[3 * PATH_MAX + 4096];
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    snprintf(port_file, sizeof port_file, "%s/%s.port", dir, name);
    snprintf(cmd, sizeof cmd, "exec %s serve --port 0 --port-file %s %s >%s 2>&1", bin, port_file, args, log);
    p->port = 0;
    p->pid = fork();
    if (p->pid < 0) return -1;
    if (p->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return wait_port_file(&p->pid, port_file, &p->port, 20000);
}

/* sig, then wait up to 20 s; SIGKILL if it does not exit. Exit status or -1. */
static int stop_proc(proc *p, int sig)
{
    if (p->pid <= 0) return -1;
    kill(p->pid, sig);
    int st = 0;
    for (double t0 = now(); now() - t0 < 20;) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = -1;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(20000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = -1;
    return -1;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}


static const char *find_nginx(void)
{
    static const char *cands[] = { "/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx", "/usr/local/bin/nginx" };
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++)
        if (access(cands[i], X_OK) == 0) return cands[i];
    return NULL;
}

/* Writes nginx.conf (pid, logs, temp paths in dir; daemon off), the replica
 * list and the listen port, all around the deploy file; starts nginx. */
static int start_nginx(proc *p, const char *nginx, const char *dir, const char *deploy_conf, const proc *rep)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/sparq-replicas.conf", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < N_REP; i++) fprintf(f, "server 127.0.0.1:%d max_fails=1 fail_timeout=10s;\n", rep[i].port);
    fclose(f);
    for (int attempt = 0; attempt < 3; attempt++) { /* the free port may be taken meanwhile */
        p->port = free_port();
        snprintf(path, sizeof path, "%s/sparq-listen.conf", dir);
        if (p->port < 0 || !(f = fopen(path, "w"))) return -1;
        fprintf(f, "listen 127.0.0.1:%d;\n", p->port);
        fclose(f);
        snprintf(path, sizeof path, "%s/nginx.conf", dir);
        if (!(f = fopen(path, "w"))) return -1;
        fprintf(f,
                "daemon off;\nmaster_process on;\nworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log info;\n"
                "events { worker_connections 256; }\n"
                "http {\n  access_log %s/access.log;\n  client_body_temp_path %s/client_body;\n"
                "  proxy_temp_path %s/proxy;\n  fastcgi_temp_path %s/fastcgi;\n  uwsgi_temp_path %s/uwsgi;\n"
                "  scgi_temp_path %s/scgi;\n  include %s;\n}\n",
                dir, dir, dir, dir, dir, dir, dir, dir, deploy_conf);
        fclose(f);
        char cmd[4 * PATH_MAX];
        snprintf(cmd, sizeof cmd, "exec %s -p %s/ -c %s/nginx.conf -e %s/error.log >%s/nginx.out 2>&1", nginx, dir, dir,
                 dir, dir);
        p->pid = fork();
        if (p->pid < 0) return -1;
        if (p->pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        for (double t0 = now(); now() - t0 < 15;) {
            int st, fd = dial(p->port);
            if (fd >= 0) {
                close(fd);
                return 0;
            }
            if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
                p->pid = -1;
                break;
            }
            usleep(20000);
        }
        if (p->pid > 0) stop_proc(p, SIGTERM);
    }
    return -1;
}

/* ---- HTTP/1.1 client (Connection: close; chunked bodies decoded) -------------------- */

typedef struct resp {
    int   status;
    char *head, *body;
} resp;

/* The value of header name (case-insensitive) in head, copied to out. */
static int header(const char *head, const char *name, char *out, size_t n)
{
    const size_t nl = strlen(name);
    for (const char *p = head ? strstr(head, "\r\n") : NULL; p; p = strstr(p + 2, "\r\n")) {
        if (strncasecmp(p + 2, name, nl) == 0 && p[2 + nl] == ':') {
            const char *v = p + 3 + nl;
            while (*v == ' ') v++;
            size_t l = strcspn(v, "\r\n");
            if (l >= n) l = n - 1;
            memcpy(out, v, l);
            out[l] = 0;
            return 0;
        }
    }
    return -1;
}

/* Decodes a chunked body in place; 0, or -1 if it is cut or malformed
 * (a response that ends mid-chunk is incomplete). */
static int dechunk(char *b)
{
    char *in = b, *out = b;
    for (;;) {
        char *end;
        unsigned long n = strtoul(in, &end, 16);
        if (end == in || !(end = strstr(end, "\r\n"))) return -1;
        in = end + 2;
        if (n == 0) break;
        if (strlen(in) < n + 2 || in[n] != '\r') return -1;
        memmove(out, in, n);
        out += n;
        in += n + 2;
    }
    *out = 0;
    return 0;
}

static int http(int port, const char *method, const char *path, const char *extra, const char *body, resp *r)
{
    memset(r, 0, sizeof *r);
    int fd = dial(port);
    if (fd < 0) return -1;
    const size_t bl = body ? strlen(body) : 0;
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAccept-Encoding: gzip\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, extra ? extra : "", bl);
    text_buf t = { 0 };
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n || (bl && send(fd, body, bl, MSG_NOSIGNAL) != (ssize_t)bl)) {
        close(fd);
        return -1;
    }
    char buf[8192];
    int done = 0;
    for (double t0 = now(); now() - t0 < 60 && !done;) { /* bounded: a hang is a failure */
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 500) <= 0) continue;
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got <= 0) done = 1;
        else if (text_append(&t, buf, (size_t)got)) break;
    }
    close(fd);
    if (!done || !t.data || sscanf(t.data, "HTTP/1.%*d %d", &r->status) != 1) {
        free(t.data);
        return -1;
    }
    char *sep = strstr(t.data, "\r\n\r\n");
    r->body = strdup(sep ? sep + 4 : "");
    if (sep) *sep = 0;
    r->head = t.data;
    char te[64];
    if (r->body && !header(r->head, "Transfer-Encoding", te, sizeof te) && strstr(te, "chunked") && dechunk(r->body)) {
        free(r->body);
        r->body = NULL;
    }
    return r->body ? 0 : -1;
}

static void resp_free(resp *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static long long metric(int port, const char *name)
{
    resp r;
    if (http(port, "GET", "/metrics", NULL, NULL, &r)) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body, key);
    long long v = p ? atoll(p + strlen(key)) : -1;
    resp_free(&r);
    return v;
}

/* A replica writes --kv-dir files on its writer thread, possibly after
 * the answer that prefilled them returned: 0 once none is pending, -1
 * after 30 s. */
static int kv_settle(int port)
{
    for (double t0 = now(); now() - t0 < 30; usleep(20000))
        if (metric(port, "sparq_kv_dir_pending") == 0) return 0;
    return -1;
}

/* An OpenAI error object: {"error": {"message": "...", ...}}. */
static int is_error_object(const char *body)
{
    char err[256];
    json_doc *d = json_parse(body, strlen(body), 0, err, sizeof err);
    const char *msg = d ? json_get_str(json_get(json_root(d), "error"), "message", NULL) : NULL;
    int ok = msg && *msg;
    json_free(d);
    return ok;
}

/* text and finish_reason of a completion (non-streamed: one object;
 * streamed: the "data: " events up to [DONE]). 0 if complete. */
static int completion(const char *body, int stream, char **text)
{
    char err[256];
    text_buf t = { 0 };
    int finished = 0, done = !stream;
    const char *p = body;
    while (p && *p) {
        const char *obj = p;
        size_t n = strlen(p);
        if (stream) {
            const char *d = strstr(p, "data: ");
            if (!d) break;
            obj = d + 6;
            n = strcspn(obj, "\n");
            p = obj + n;
            if (n >= 6 && !strncmp(obj, "[DONE]", 6)) {
                done = 1;
                break;
            }
        } else {
            p = NULL;
        }
        json_doc *jd = json_parse(obj, n, 0, err, sizeof err);
        if (!jd) break;
        const json_value *c = json_at(json_get(json_root(jd), "choices"), 0);
        size_t tl = 0;
        const char *s = json_get_str(c, "text", &tl);
        if (s) text_append(&t, s, tl);
        if (json_get_str(c, "finish_reason", NULL)) finished = 1;
        json_free(jd);
    }
    *text = t.data ? t.data : strdup("");
    return finished && done ? 0 : -1;
}

/* ---- the workload ------------------------------------------------------------------ */

typedef struct job {
    int   doc, q, stream;
    char *body;              /* the request                                  */
    /* results */
    int   rc, status, complete, clean_error, gzip, sse;
    char *text;
    int   upstream;          /* replica index that answered (last tried), -1 */
    char  tried[256];        /* X-Sparq-Upstream: every replica nginx tried   */
} job;

static void run_job(job *j, int port, const proc *rep)
{
    char extra[128];
    snprintf(extra, sizeof extra, "X-Document-Id: doc-%d\r\n", j->doc);
    resp r;
    j->rc = http(port, "POST", "/v1/completions", extra, j->body, &r);
    j->upstream = -1;
    if (j->rc) return;
    j->status = r.status;
    char v[256];
    if (!header(r.head, "X-Sparq-Upstream", v, sizeof v)) {
        snprintf(j->tried, sizeof j->tried, "%s", v);
        const char *last = strrchr(v, ' ');
        last = last ? last + 1 : v;
        const char *colon = strrchr(last, ':');
        for (int i = 0; colon && i < N_REP; i++)
            if (atoi(colon + 1) == rep[i].port) j->upstream = i;
    }
    j->gzip = !header(r.head, "Content-Encoding", v, sizeof v) && strstr(v, "gzip");
    j->sse = !header(r.head, "Content-Type", v, sizeof v) && strstr(v, "text/event-stream");
    if (r.status == 200) j->complete = completion(r.body, j->stream, &j->text) == 0;
    else j->clean_error = r.status >= 400 && is_error_object(r.body);
    if (!j->complete && !j->clean_error)
        fprintf(stderr, "doc %d q %d: status %d body %.300s\n", j->doc, j->q, r.status, r.body);
    resp_free(&r);
}

typedef struct client {
    job       *jobs[32];
    int        n, port;
    const proc *rep;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    for (int i = 0; i < c->n; i++) run_job(c->jobs[i], c->port, c->rep);
    return NULL;
}

/* Runs jobs[n] from n_clients concurrent clients (job i on client i % n_clients). */
static void run_phase(job **jobs, int n, int n_clients, int port, const proc *rep)
{
    client cl[16];
    pthread_t th[16];
    for (int k = 0; k < n_clients; k++) cl[k] = (client){ .n = 0, .port = port, .rep = rep };
    for (int i = 0; i < n; i++) {
        client *c = &cl[i % n_clients];
        c->jobs[c->n++] = jobs[i];
    }
    int ok[16];
    for (int k = 0; k < n_clients; k++) ok[k] = pthread_create(&th[k], NULL, client_main, &cl[k]) == 0;
    for (int k = 0; k < n_clients; k++) {
        if (ok[k]) pthread_join(th[k], NULL);
        else client_main(&cl[k]); /* no thread: run them here, still bounded */
    }
}

typedef struct phase_arg {
    job **jobs;
    int   n, n_clients, port;
    const proc *rep;
    volatile int done;
} phase_arg;

static void *phase_main(void *arg)
{
    phase_arg *a = arg;
    run_phase(a->jobs, a->n, a->n_clients, a->port, a->rep);
    a->done = 1;
    return NULL;
}

/* Token ids of text via the reference server's /tokenize. */
static int tokenize(int port, const char *text, int add_special, int32_t *ids, int max)
{
    text_buf b = { 0 };
    char *esc = NULL;
    size_t el = 0;
    FILE *f = open_memstream(&esc, &el);
    if (!f) return -1;
    json_write_str(f, text, strlen(text));
    fclose(f);
    char head[64];
    snprintf(head, sizeof head, "{\"add_special\":%s,\"content\":", add_special ? "true" : "false");
    text_append(&b, head, strlen(head));
    text_append(&b, esc, el);
    text_append(&b, "}", 1);
    free(esc);
    resp r;
    int rc = http(port, "POST", "/tokenize", NULL, b.data, &r);
    free(b.data);
    if (rc) return -1;
    char err[256];
    json_doc *d = r.status == 200 ? json_parse(r.body, strlen(r.body), 0, err, sizeof err) : NULL;
    const json_value *t = d ? json_get(json_root(d), "tokens") : NULL;
    int n = -1;
    if (t && (int)json_len(t) <= max) {
        n = (int)json_len(t);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)json_at(t, (size_t)i)->u.number;
    }
    json_free(d);
    resp_free(&r);
    return n;
}

/* ---- phase C: requests held in flight ------------------------------------------- */

typedef struct job_arg {
    job        *j;
    int         port;
    const proc *rep;
} job_arg;

static void *job_main(void *arg)
{
    job_arg *a = arg;
    run_job(a->j, a->port, a->rep);
    return NULL;
}

/* Polls a replica's metric until it reaches want: its value, or the last
 * seen after 60 s (only a failure waits that long). */
static long long await_metric(int port, const char *name, long long want)
{
    long long v = -1;
    for (double t0 = now(); now() - t0 < 60; usleep(2000))
        if ((v = metric(port, name)) >= want) break;
    return v;
}

/* Sends a completion for document doc through port without reading the
 * answer: the connection, or -1. */
static int post_raw(int port, const char *body, int doc)
{
    char head[512];
    const int n = snprintf(head, sizeof head,
                           "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                           "X-Document-Id: doc-%d\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                           doc, strlen(body));
    const int fd = dial(port);
    if (fd >= 0 && (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n ||
                    send(fd, body, strlen(body), MSG_NOSIGNAL) != (ssize_t)strlen(body))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Appends what fd sends to t until the bytes after `after` hold `until`
 * (NULL: until the peer closes); 0, or -1 after 60 s or at a close first. */
static int read_until(int fd, text_buf *t, const char *until, const char *after)
{
    char buf[4096];
    for (double t0 = now(); now() - t0 < 60;) {
        const char *a = t->data && after ? strstr(t->data, after) : NULL;
        if (until && a && strstr(a, until)) return 0;
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 500) <= 0) continue;
        const ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got <= 0) return until ? -1 : 0;
        if (text_append(t, buf, (size_t)got)) return -1;
    }
    return -1;
}

/* Decodes the complete chunks of a chunked body that may be cut, in place. */
static void dechunk_prefix(char *b)
{
    char *in = b, *out = b;
    for (;;) {
        char *end;
        const unsigned long n = strtoul(in, &end, 16);
        if (end == in || !(end = strstr(end, "\r\n"))) break;
        if (n == 0 || strlen(end + 2) < n) break;
        memmove(out, end + 2, n);
        out += n;
        in = end + 2 + n;
        if (!strncmp(in, "\r\n", 2)) in += 2;
    }
    *out = 0;
}

static char *request_body(const int32_t *doc, int nd, const int32_t *q, int nq, int stream)
{
    text_buf b = { 0 };
    char num[32];
    text_append(&b, "{\"prompt\":[", 11);
    for (int i = 0; i < nd + nq; i++) {
        int l = snprintf(num, sizeof num, "%s%d", i ? "," : "", i < nd ? doc[i] : q[i - nd]);
        text_append(&b, num, (size_t)l);
    }
    int l = snprintf(num, sizeof num, "],\"max_tokens\":%d,", MAX_TOKENS);
    text_append(&b, num, (size_t)l);
    const char *rest = stream ? "\"temperature\":0,\"stream\":true}" : "\"temperature\":0}";
    text_append(&b, rest, strlen(rest));
    return b.data;
}

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_rf(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void print_log(const char *dir, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    size_t n;
    char *t = test_read_file(p, &n);
    if (t) fprintf(stderr, "--- %s (last 2000 bytes)\n%s\n", name, n > 2000 ? t + n - 2000 : t);
    free(t);
}

/* dir holds exactly n files named <32 hex>.kv (no temp or partial file),
 * each a valid KV file of DOC_TOKENS positions (every checksum verified). */
static void check_kv_dir(const char *dir, const char *model_path, int n)
{
    char err[256];
    sparq_model *m = NULL;
    if (sparq_model_load(model_path, &m, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    DIR *d = opendir(dir);
    CHECK(d != NULL, "opendir %s", dir);
    int files = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        const size_t l = strlen(e->d_name);
        CHECK(l == 35 && !strcmp(e->d_name + 32, ".kv") && strspn(e->d_name, "0123456789abcdef") == 32,
              "unexpected file in the kv dir: %s", e->d_name);
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        sparq_context_params cp = sparq_context_default_params();
        cp.n_threads = 1;
        sparq_context *c = NULL;
        const int rc = sparq_context_load_kv(m, &cp, p, SPARQ_VERIFY_ALWAYS, &c, err, sizeof err);
        CHECK(rc == 0 && sparq_context_pos(c) == DOC_TOKENS, "%s: %s", e->d_name, rc ? err : "wrong length");
        sparq_context_free(c);
        files++;
    }
    if (d) closedir(d);
    CHECK(files == n, "%d files in the kv dir, expected %d", files, n);
    sparq_model_free(m);
}

static long long dir_kv_bytes(const char *dir, int *n_files)
{
    DIR *d = opendir(dir);
    long long total = 0;
    *n_files = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[PATH_MAX + 256];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strstr(e->d_name, ".kv") && stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            total += st.st_size;
            ++*n_files;
        }
    }
    if (d) closedir(d);
    return total;
}

/* --kv-dir-max: one replica, 1 MiB of files, more documents than fit: after
 * every write the directory is within the budget, the least recently used
 * file went first (the first document, touched again, survives longer than
 * the second), the newest is there. */
static void kv_budget(const char *bin, const char *dir, const char *model, int32_t *doc, int nd)
{
    char kvdir[PATH_MAX], args[2048 + 2 * PATH_MAX];
    snprintf(kvdir, sizeof kvdir, "%s/kv-budget", dir);
    proc p = { -1, 0 };
    snprintf(args, sizeof args, "-m %s -c 512 -b %d -t 1 --prefix-cache 0 --kv-dir %s --kv-dir-max 1", model, NB, kvdir);
    CHECK(mkdir(kvdir, 0700) == 0 && start_server(&p, bin, dir, "budget", args) == 0, "budget replica did not start");
    if (p.pid <= 0) return;
    const int32_t first = doc[1];
    char path0[PATH_MAX + 256] = "", path1[PATH_MAX + 256] = "";
    int files = 0, ok = 1, k;
    for (k = 0; k < 64 && ok; k++) {
        doc[1] = (int32_t)(3 + k);             /* a different prefix each time */
        char *body = request_body(doc, nd, doc + nd, 1, 0);
        resp r;
        ok = body && http(p.port, "POST", "/v1/completions", NULL, body, &r) == 0 && r.status == 200;
        if (body && !ok) fprintf(stderr, "budget: request %d failed\n", k);
        if (body && r.head) resp_free(&r);
        free(body);
        CHECK(kv_settle(p.port) == 0, "budget: document %d's write still pending after 30 s", k);
        const long long bytes = dir_kv_bytes(kvdir, &files);
        ok = ok && bytes <= (1 << 20);
        CHECK(bytes <= (1 << 20), "after document %d the kv dir holds %lld bytes > 1 MiB", k, bytes);
        if (k == 1) { /* remember the first two files' names */
            DIR *d = opendir(kvdir);
            struct dirent *e;
            struct stat st0 = { 0 };
            while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.') continue;
                char q[PATH_MAX + 256];
                struct stat st;
                snprintf(q, sizeof q, "%s/%s", kvdir, e->d_name);
                if (stat(q, &st)) continue;
                if (!path0[0] || st.st_mtim.tv_sec < st0.st_mtim.tv_sec ||
                    (st.st_mtim.tv_sec == st0.st_mtim.tv_sec && st.st_mtim.tv_nsec < st0.st_mtim.tv_nsec)) {
                    strcpy(path1, path0);
                    strcpy(path0, q);
                    st0 = st;
                } else {
                    strcpy(path1, q);
                }
            }
            if (d) closedir(d);
        }
        if (k >= 1 && ok) { /* document 0 asked again: its file is the most recently used */
            doc[1] = 3;
            body = request_body(doc, nd, doc + nd, 1, 0);
            if (body && http(p.port, "POST", "/v1/completions", NULL, body, &r) == 0) resp_free(&r);
            free(body);
            CHECK(kv_settle(p.port) == 0, "budget: a write still pending after 30 s");
        }
        if (access(path1, F_OK) != 0 && path1[0]) break; /* the second one was evicted */
    }
    doc[1] = first;
    const long long ev = metric(p.port, "sparq_kv_dir_evictions_total"), hits = metric(p.port, "sparq_kv_dir_hits_total");
    fprintf(stderr, "budget: %d documents, %d files left, %lld evicted, %lld loaded\n", k + 1, files, ev, hits);
    CHECK(ok && ev >= 1, "no file was evicted after %d documents", k + 1);
    CHECK(path1[0] && access(path1, F_OK) != 0, "the second document's file is still there");
    CHECK(path0[0] && access(path0, F_OK) == 0, "the first document's file, used again after each write, was evicted");
    CHECK(hits >= k, "the repeated document was loaded from its file %lld times, expected >= %d", hits, k);
    CHECK(stop_proc(&p, SIGTERM) == 0, "budget replica did not exit cleanly");
}

int main(void)
{
    char model[1024], bin[1024], deploy_conf[PATH_MAX];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_deploy");
    }
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    const char *nginx = find_nginx();
    const char *ci = getenv("CI");
    if (!nginx) {
        if (ci && !strcmp(ci, "true")) CHECK(0, "nginx is not installed (scripts/setup.sh installs it)");
        else test_skip("nginx is not installed (make setup); the deploy test needs it");
        return test_summary("test_deploy");
    }
    if (access(bin, X_OK) != 0 || !realpath("deploy/nginx/sparq.conf", deploy_conf)) {
        CHECK(0, "%s or deploy/nginx/sparq.conf missing (run from the repository root)", bin);
        return test_summary("test_deploy");
    }
    signal(SIGPIPE, SIG_IGN);
    const double t_start = now();
    char dir[] = "/tmp/sparq_deploy_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return test_summary("test_deploy");
    }
    chmod(dir, 0755); /* nginx started as root runs its worker as nobody */
    proc ref = { -1, 0 }, rep[N_REP], ngx = { -1, 0 };
    for (int i = 0; i < N_REP; i++) rep[i] = (proc){ -1, 0 };
    job jobs[N_DOC * N_Q];
    memset(jobs, 0, sizeof jobs);
    int failed_start = 0;

    char args[2048];
    snprintf(args, sizeof args, "-m %s -c 512 -b %d -t 1 --parallel 4 --queue 32 --prefix-cache 16", model, NB);
    if (start_server(&ref, bin, dir, "reference", args)) failed_start = 1;
    char kvdir[PATH_MAX], rargs[2048 + 2 * PATH_MAX];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    if (mkdir(kvdir, 0700)) failed_start = 1;
    snprintf(rargs, sizeof rargs, "%s --kv-dir %s", args, kvdir);
    for (int i = 0; i < N_REP && !failed_start; i++) {
        char name[32], gate[PATH_MAX];
        snprintf(name, sizeof name, "replica%d", i);
        /* the test-only prefill gate (src/server/server.h): unused (no
         * writer) until phase C holds the replica it kills */
        snprintf(gate, sizeof gate, "%s/gate%d", dir, i);
        if (mkfifo(gate, 0600)) failed_start = 1;
        setenv("SPARQ_TEST_PREFILL_GATE", gate, 1);
        if (!failed_start && start_server(&rep[i], bin, dir, name, rargs)) failed_start = 1;
        unsetenv("SPARQ_TEST_PREFILL_GATE");
    }
    if (!failed_start && start_nginx(&ngx, nginx, dir, deploy_conf, rep)) {
        failed_start = 1;
        print_log(dir, "nginx.out");
        print_log(dir, "error.log");
    }
    CHECK(!failed_start, "could not start the reference, the replicas or nginx");
    if (failed_start) goto out;

    /* the prompts: document d's first DOC_TOKENS tokens (with BOS) + question q */
    static const char *names[N_DOC] = { "Tom", "Lily", "Ben" };
    static const char *things[N_DOC] = { "a red ball", "a big cake", "a little boat" };
    static const char *qs[N_Q] = { "What did", "Where did", "Why was", "Who saw", "When did",
                                   "What was", "How did", "Who had", "Where was", "What did the" };
    int32_t doc_ids[N_DOC][1024], q_ids[N_Q][64];
    int nq[N_Q];
    for (int d = 0; d < N_DOC; d++) {
        text_buf t = { 0 };
        char s[256];
        for (int k = 0; k < 24; k++) {
            int l = snprintf(s, sizeof s, "%s had %s. %s played with it in the park on day %d. ", names[d], things[d],
                             k % 2 ? "He" : "She", k + 1);
            text_append(&t, s, (size_t)l);
        }
        int n = tokenize(ref.port, t.data, 1, doc_ids[d], 1024);
        free(t.data);
        CHECK(n >= DOC_TOKENS, "document %d: %d tokens", d, n);
        if (n < DOC_TOKENS) goto out;
    }
    for (int q = 0; q < N_Q; q++) {
        char s[128];
        snprintf(s, sizeof s, "\nQ: %s %s do? A:", qs[q], names[q % N_DOC]);
        nq[q] = tokenize(ref.port, s, 0, q_ids[q], 64);
        /* at most NB: the prompt's cache cut is then exactly the document */
        CHECK(nq[q] >= 1 && nq[q] <= NB, "question %d: %d tokens", q, nq[q]);
        if (nq[q] < 1 || nq[q] > NB) goto out;
    }
    for (int d = 0; d < N_DOC; d++)
        for (int q = 0; q < N_Q; q++) {
            job *j = &jobs[d * N_Q + q];
            j->doc = d;
            j->q = q;
            j->stream = q == 1; /* one streamed question per document */
            j->body = request_body(doc_ids[d], DOC_TOKENS, q_ids[q], nq[q], j->stream);
        }

    /* the reference: one server, one request at a time */
    char *ref_text[N_DOC * N_Q] = { 0 };
    for (int i = 0; i < N_DOC * N_Q; i++) {
        resp r;
        char *nb = request_body(doc_ids[jobs[i].doc], DOC_TOKENS, q_ids[jobs[i].q], nq[jobs[i].q], 0);
        if (nb && !http(ref.port, "POST", "/v1/completions", NULL, nb, &r)) {
            if (r.status == 200 && completion(r.body, 0, &ref_text[i]) != 0) {
                free(ref_text[i]);
                ref_text[i] = NULL;
            }
            resp_free(&r);
        }
        free(nb);
        CHECK(ref_text[i] != NULL, "reference answer %d", i);
        if (!ref_text[i]) goto out_ref;
    }

    /* phase A: the first question about each document, concurrently */
    job *pa[N_DOC], *pb[12], *pc[15];
    for (int d = 0; d < N_DOC; d++) pa[d] = &jobs[d * N_Q];
    run_phase(pa, N_DOC, N_DOC, ngx.port, rep);
    /* phase B: questions 1..4, 4 clients */
    int n = 0;
    for (int q = 1; q <= 4; q++)
        for (int d = 0; d < N_DOC; d++) pb[n++] = &jobs[d * N_Q + q];
    run_phase(pb, n, 4, ngx.port, rep);

    int home[N_DOC], docs_on[N_REP] = { 0 };
    long long reqs_on[N_REP] = { 0 }, prefill_on[N_REP] = { 0 };
    for (int d = 0; d < N_DOC; d++) {
        home[d] = jobs[d * N_Q].upstream;
        CHECK(home[d] >= 0, "document %d: no X-Sparq-Upstream naming a replica", d);
        if (home[d] < 0) goto out_ref;
        docs_on[home[d]]++;
        for (int q = 0; q <= 4; q++) {
            job *j = &jobs[d * N_Q + q];
            CHECK(j->rc == 0 && j->status == 200 && j->complete, "doc %d q %d: rc %d status %d complete %d", d, q, j->rc,
                  j->status, j->complete);
            CHECK(j->upstream == home[d], "doc %d q %d went to replica %d, its first question to %d", d, q, j->upstream,
                  home[d]);
            CHECK(j->text && !strcmp(j->text, ref_text[d * N_Q + q]), "doc %d q %d: %s | reference: %s", d, q,
                  j->text ? j->text : "(none)", ref_text[d * N_Q + q]);
            if (j->stream) CHECK(j->sse && !j->gzip, "doc %d: stream sse %d gzip %d", d, j->sse, j->gzip);
            reqs_on[home[d]]++;
            /* the first question prefills the document and itself; the others only themselves */
            prefill_on[home[d]] += (q == 0 ? DOC_TOKENS : 0) + nq[q];
        }
    }
    for (int i = 0; i < N_REP; i++) /* the documents' files are written (before the kill below) */
        CHECK(kv_settle(rep[i].port) == 0, "replica %d: kv-dir writes still pending after 30 s", i);
    for (int i = 0; i < N_REP; i++) {
        const long long req = metric(rep[i].port, "sparq_requests_total"),
                        hits = metric(rep[i].port, "sparq_prefix_cache_hits_total"),
                        pre = metric(rep[i].port, "sparq_prefill_tokens_total");
        fprintf(stderr, "replica %d: %d documents, requests %lld, prefix-cache hits %lld, tokens prefilled %lld\n", i,
                docs_on[i], req, hits, pre);
        CHECK(req == reqs_on[i], "replica %d: %lld requests, expected %lld", i, req, reqs_on[i]);
        CHECK(hits == reqs_on[i] - docs_on[i], "replica %d: %lld prefix-cache hits, expected %lld", i, hits,
              reqs_on[i] - docs_on[i]);
        CHECK(pre == prefill_on[i], "replica %d: %lld tokens prefilled, expected %lld (each document once)", i, pre,
              prefill_on[i]);
        CHECK(metric(rep[i].port, "sparq_kv_dir_writes_total") == docs_on[i], "replica %d: kv-dir writes", i);
    }
    /* one complete file per document, nothing else, in the shared directory */
    check_kv_dir(kvdir, model, N_DOC);

    /* phase C: the busiest replica dies with requests in flight. Its
     * scheduler is held at its prefill gate, so at the SIGKILL, on any
     * machine:
     *  - stream S (a question about one of its documents) has begun: the
     *    client has read its headers and first token; the next decode
     *    step is held;
     *  - request N (not streamed, the same document) has reached it and
     *    has no answer;
     *  - questions 5..9 run from 5 clients; at least one about its
     *    documents has reached it too and is held.
     * deploy/README.md promises: a replica that resets the connection
     * before answering is skipped and the request resent (non_idempotent),
     * so N and every phase-C question get the complete reference answer,
     * from another replica, none an error; a response that has begun is
     * not resent, so S stays cut: 200, its first tokens, no [DONE]. */
    int victim = 0;
    for (int i = 1; i < N_REP; i++)
        if (docs_on[i] > docs_on[victim]) victim = i;
    int vdoc = 0;
    while (home[vdoc] != victim) vdoc++;
    char gate[PATH_MAX], vport[16];
    snprintf(gate, sizeof gate, "%s/gate%d", dir, victim);
    snprintf(vport, sizeof vport, ":%d", rep[victim].port);
    const int gw = open(gate, O_WRONLY | O_NONBLOCK | O_CLOEXEC); /* shuts the gate */
    CHECK(gw >= 0, "the victim's gate: %s", strerror(errno));
    if (gw < 0) goto out_ref;
    const long long before = metric(rep[victim].port, "sparq_requests_total");
    /* S: admitted and held; one byte lets its prefill through (the
     * document is in the prefix cache: one chunk, the question) */
    char *sbody = request_body(doc_ids[vdoc], DOC_TOKENS, q_ids[6], nq[6], 1);
    const int sfd = sbody ? post_raw(ngx.port, sbody, vdoc) : -1;
    free(sbody);
    int ok = sfd >= 0 && await_metric(rep[victim].port, "sparq_active_sequences", 1) == 1 && write(gw, "x", 1) == 1;
    text_buf sraw = { 0 };
    ok = ok && read_until(sfd, &sraw, "\n\n", "data: ") == 0;
    CHECK(ok, "stream S did not begin on the victim (%.200s)", sraw.data ? sraw.data : "");
    /* N reaches the victim and is held */
    job jn = jobs[vdoc * N_Q + 5];
    jn.text = NULL;
    pthread_t thn, th;
    job_arg ja = { &jn, ngx.port, rep };
    const int have_n = ok && pthread_create(&thn, NULL, job_main, &ja) == 0;
    ok = have_n && await_metric(rep[victim].port, "sparq_requests_total", before + 2) == before + 2;
    CHECK(ok, "request N did not reach the victim");
    n = 0;
    for (int q = 5; q < N_Q; q++)
        for (int d = 0; d < N_DOC; d++) pc[n++] = &jobs[d * N_Q + q];
    phase_arg pa_c = { pc, n, 5, ngx.port, rep, 0 };
    const int have_c = ok && pthread_create(&th, NULL, phase_main, &pa_c) == 0;
    ok = have_c && await_metric(rep[victim].port, "sparq_requests_total", before + 3) >= before + 3;
    CHECK(ok, "no phase-C question reached the victim");
    const long long held = metric(rep[victim].port, "sparq_active_sequences") + metric(rep[victim].port, "sparq_queue_depth");
    kill(rep[victim].pid, SIGKILL);
    waitpid(rep[victim].pid, NULL, 0);
    rep[victim].pid = -1;
    close(gw);
    fprintf(stderr, "killed replica %d holding %lld requests (S begun, N and phase-C questions waiting)\n", victim, held);
    CHECK(!ok || held >= 3, "the victim held %lld requests at the kill, expected S, N and a phase-C question", held);
    if (have_n) pthread_join(thn, NULL);
    if (have_c) pthread_join(th, NULL);
    /* S: cut, as promised */
    if (sfd >= 0) {
        read_until(sfd, &sraw, NULL, NULL); /* to the end */
        close(sfd);
    }
    char *sbody_part = sraw.data ? strstr(sraw.data, "\r\n\r\n") : NULL;
    char *stext = NULL;
    int sstatus = 0;
    if (sraw.data) sscanf(sraw.data, "HTTP/1.%*d %d", &sstatus);
    char te[64];
    if (sbody_part) {
        *sbody_part = 0; /* the head alone, for header() */
        if (!header(sraw.data, "Transfer-Encoding", te, sizeof te) && strstr(te, "chunked")) dechunk_prefix(sbody_part + 4);
        *sbody_part = '\r';
    }
    const int s_done = sbody_part && completion(sbody_part + 4, 1, &stext) == 0;
    const char *sref = ref_text[vdoc * N_Q + 6];
    CHECK(sstatus == 200 && sbody_part && !strstr(sbody_part, "[DONE]") && !s_done && stext && stext[0] &&
              !strncmp(stext, sref, strlen(stext)) && strlen(stext) < strlen(sref),
          "stream S after the kill: status %d, text '%s' (reference '%s'), [DONE] %s: not the promised cut stream",
          sstatus, stext ? stext : "(none)", sref, sbody_part && strstr(sbody_part, "[DONE]") ? "present" : "absent");
    free(stext);
    free(sraw.data);
    /* N: resent, answered in full by another replica */
    CHECK(jn.rc == 0 && jn.status == 200 && jn.complete && jn.text && !strcmp(jn.text, ref_text[vdoc * N_Q + 5]) &&
              jn.upstream >= 0 && jn.upstream != victim && strstr(jn.tried, vport),
          "request N in flight at the kill: rc %d status %d upstreams '%s' text %s | reference %s", jn.rc, jn.status,
          jn.tried, jn.text ? jn.text : "(none)", ref_text[vdoc * N_Q + 5]);
    free(jn.text);
    jn.text = NULL;
    int n_ok = 0, moved = 0, resent = 0;
    for (int i = 0; i < n; i++) {
        job *j = pc[i];
        const int okj = j->rc == 0 && j->complete && j->text && !strcmp(j->text, ref_text[j->doc * N_Q + j->q]) &&
                        j->upstream >= 0 && j->upstream != victim;
        CHECK(okj, "doc %d q %d after the kill: rc %d status %d upstreams '%s' text %s | reference %s", j->doc, j->q,
              j->rc, j->status, j->tried, j->text ? j->text : "(none)", ref_text[j->doc * N_Q + j->q]);
        n_ok += okj;
        moved += okj && home[j->doc] == victim;
        resent += okj && strstr(j->tried, vport) != NULL;
    }
    fprintf(stderr, "phase C: %d of %d answered in full, %d about the killed replica's documents, %d resent after "
            "trying it\n", n_ok, n, moved, resent);
    CHECK(moved == 5 * docs_on[victim] && resent >= 1,
          "phase C: %d questions about the killed replica's documents answered elsewhere (of %d), %d resent", moved,
          5 * docs_on[victim], resent);
    /* the survivors mapped the killed replica's documents from the shared
     * directory: across the cluster each document was prefilled once */
    long long kv_hits = 0;
    for (int i = 0; i < N_REP; i++) {
        if (i == victim) continue;
        long long expect = prefill_on[i];
        for (int k = 0; k < n; k++)
            if (pc[k]->upstream == i) expect += nq[pc[k]->q];
        if (jn.upstream == i) expect += nq[jn.q];
        const long long pre = metric(rep[i].port, "sparq_prefill_tokens_total");
        CHECK(pre == expect, "replica %d after the kill: %lld tokens prefilled, expected %lld (no document again)", i,
              pre, expect);
        kv_hits += metric(rep[i].port, "sparq_kv_dir_hits_total");
    }
    CHECK(kv_hits >= 1, "the survivors loaded no prefix file (%lld)", kv_hits);
    fprintf(stderr, "survivors: %lld prefixes loaded from the shared directory\n", kv_hits);
    check_kv_dir(kvdir, model, N_DOC);

    kv_budget(bin, dir, model, doc_ids[0], DOC_TOKENS);

    /* the survivors keep serving: nginx skips the dead one */
    resp r;
    int rc = http(ngx.port, "GET", "/metrics", NULL, NULL, &r);
    CHECK(rc == 0 && r.status == 404 && is_error_object(r.body), "/metrics through nginx: %d", rc ? -1 : r.status);
    if (!rc) resp_free(&r);

out_ref:
    for (int i = 0; i < N_DOC * N_Q; i++) free(ref_text[i]);
out:
    if (test_n_fail) {
        print_log(dir, "error.log");
        print_log(dir, "replica0.log");
    }
    if (ngx.pid > 0) CHECK(stop_proc(&ngx, SIGQUIT) == 0, "nginx did not exit cleanly");
    for (int i = 0; i < N_REP; i++)
        if (rep[i].pid > 0) CHECK(stop_proc(&rep[i], SIGTERM) == 0, "replica %d did not exit cleanly", i);
    if (ref.pid > 0) CHECK(stop_proc(&ref, SIGTERM) == 0, "the reference did not exit cleanly");
    for (int i = 0; i < N_DOC * N_Q; i++) {
        free(jobs[i].body);
        free(jobs[i].text);
    }
    rm_rf(dir);
    fprintf(stderr, "test_deploy: %.1f s\n", now() - t_start);
    return test_summary("test_deploy");
}
