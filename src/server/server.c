/* server.c - the HTTP side of `sparq serve` (libmicrohttpd, one thread per
 * connection): routing, authentication, body limits, and writing the OpenAI
 * response shapes, whole or as server-sent events. The untrusted bodies are
 * parsed and validated by request.c; generation happens in sched.c.
 *
 * Map:
 *   reply_* / err_reply       JSON and error responses
 *   parse_env                 what request.c's srv_parse_request needs
 *   write_completion / write_chunk               OpenAI shapes
 *   stream_reader             SSE: waits for the scheduler, emits chunks
 *   handle_generate           /v1/completions, /v1/chat/completions
 *   on_request                routing
 */
#include "server/request.h"
#include "util/json.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { EP_NONE, EP_COMPLETIONS, EP_CHAT };

typedef struct conn {
    srv_server  *s;
    text_buf     body;
    int          too_large;
    srv_request *r;             /* generation in flight (one reference)    */
    int          chat;
    char         id[48];
    long         created;
    int          fd;
    /* streaming */
    char        *out;           /* pending SSE bytes                       */
    size_t       out_len, out_off;
    size_t       sent_text;
    int          sent_toks, sent_role, finished;
} conn;

/* ---- responses --------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, int status, const char *ctype, const char *body,
                             size_t len, const char *extra_header, const char *extra_value)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, "Content-Type", ctype);
    if (extra_header) MHD_add_response_header(res, extra_header, extra_value);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, res);
    MHD_destroy_response(res);
    return rc;
}

static const char *err_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "server_overloaded";
    case 504: return "timeout_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* The OpenAI error object as a malloc'ed string. */
static char *err_json(int status, const char *code, const char *msg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fputs("{\"error\":{\"message\":", f);
    json_write_str(f, msg, strlen(msg));
    fprintf(f, ",\"type\":\"%s\",\"code\":", err_type(status));
    if (code) json_write_str(f, code, strlen(code));
    else fputs("null", f);
    fputs("}}", f);
    fclose(f);
    return buf;
}

static enum MHD_Result err_reply(struct MHD_Connection *c, int status, const char *code, const char *msg)
{
    char *b = err_json(status, code, msg);
    if (!b) return MHD_NO;
    enum MHD_Result rc = reply(c, status, "application/json", b, strlen(b),
                               status == 503 ? "Retry-After" : status == 405 ? "Allow" : NULL,
                               status == 503 ? "1" : "POST");
    free(b);
    return rc;
}

static enum MHD_Result json_reply(struct MHD_Connection *c, int status, char *buf, size_t len)
{
    enum MHD_Result rc = buf ? reply(c, status, "application/json", buf, len, NULL, NULL) : MHD_NO;
    free(buf);
    return rc;
}

/* ---- OpenAI shapes ---------------------------------------------------------------- */

static void write_piece(FILE *f, srv_server *s, int32_t id)
{
    char piece[256];
    int len = sparq_token_to_piece(s->model, id, piece, sizeof piece);
    if (len < 0) len = 0;
    if (len > (int)sizeof piece) len = sizeof piece;
    json_write_str(f, piece, (size_t)len);
}

static void write_bytes(FILE *f, srv_server *s, int32_t id)
{
    char piece[256];
    int len = sparq_token_to_piece(s->model, id, piece, sizeof piece);
    if (len < 0) len = 0;
    if (len > (int)sizeof piece) len = sizeof piece;
    fputc('[', f);
    for (int i = 0; i < len; i++) fprintf(f, "%s%d", i ? "," : "", (unsigned char)piece[i]);
    fputc(']', f);
}

static void write_lp(FILE *f, float lp)
{
    if (isnan(lp)) fputs("null", f);
    else fprintf(f, "%.9g", lp < -1e30f ? -1e30f : lp);
}

/* Log-probabilities of tokens [a, b) of r; base: text offset of the first
 * byte the client sees (completions' text_offset). */
static void write_logprobs(FILE *f, srv_server *s, const srv_request *r, int chat, int a, int b)
{
    if (r->logprobs < 0) {
        fputs("null", f);
        return;
    }
    if (chat) {
        fputs("{\"content\":[", f);
        for (int i = a; i < b; i++) {
            const srv_token *t = &r->toks[i];
            fprintf(f, "%s{\"token\":", i > a ? "," : "");
            write_piece(f, s, t->id);
            fputs(",\"logprob\":", f);
            write_lp(f, t->logprob);
            fputs(",\"bytes\":", f);
            write_bytes(f, s, t->id);
            fputs(",\"top_logprobs\":[", f);
            for (int k = 0; k < t->n_top; k++) {
                fprintf(f, "%s{\"token\":", k ? "," : "");
                write_piece(f, s, t->top_id[k]);
                fputs(",\"logprob\":", f);
                write_lp(f, t->top_lp[k]);
                fputs(",\"bytes\":", f);
                write_bytes(f, s, t->top_id[k]);
                fputc('}', f);
            }
            fputs("]}", f);
        }
        fputs("]}", f);
        return;
    }
    fputs("{\"tokens\":[", f);
    for (int i = a; i < b; i++) {
        if (i > a) fputc(',', f);
        write_piece(f, s, r->toks[i].id);
    }
    fputs("],\"token_logprobs\":[", f);
    for (int i = a; i < b; i++) {
        if (i > a) fputc(',', f);
        write_lp(f, r->toks[i].logprob);
    }
    fputs("],\"top_logprobs\":[", f);
    for (int i = a; i < b; i++) {
        const srv_token *t = &r->toks[i];
        fputs(i > a ? "," : "", f);
        if (isnan(t->logprob)) {
            fputs("null", f);
            continue;
        }
        fputc('{', f);
        for (int k = 0; k < t->n_top; k++) {
            if (k) fputc(',', f);
            write_piece(f, s, t->top_id[k]);
            fputc(':', f);
            write_lp(f, t->top_lp[k]);
        }
        fputc('}', f);
    }
    fputs("],\"text_offset\":[", f);
    for (int i = a; i < b; i++) fprintf(f, "%s%zu", i > a ? "," : "", r->toks[i].text_off);
    fputs("]}", f);
}

static void write_head(FILE *f, conn *k, const char *object)
{
    fprintf(f, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", k->id, object, k->created);
    json_write_str(f, k->s->cfg.model_id, strlen(k->s->cfg.model_id));
}

static void write_usage(FILE *f, const srv_request *r)
{
    fprintf(f, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", r->n_prompt,
            r->n_gen, r->n_prompt + r->n_gen);
}

/* The whole (non-streamed) reply. Lock held. */
static char *write_completion(conn *k, size_t *len)
{
    const srv_request *r = k->r;
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    write_head(f, k, k->chat ? "chat.completion" : "text_completion");
    fputs(",\"choices\":[{\"index\":0,", f);
    if (k->chat) {
        fputs("\"message\":{\"role\":\"assistant\",\"content\":", f);
        json_write_str(f, r->text.data ? r->text.data : "", r->text.len);
        fputs("},", f);
    } else {
        fputs("\"text\":", f);
        json_write_str(f, r->text.data ? r->text.data : "", r->text.len);
        fputc(',', f);
    }
    fputs("\"logprobs\":", f);
    write_logprobs(f, k->s, r, k->chat, 0, r->n_toks);
    fprintf(f, ",\"finish_reason\":\"%s\"}],", r->finish ? r->finish : "stop");
    write_usage(f, r);
    fputs("}", f);
    fclose(f);
    return buf;
}

/* One SSE event with text [a, b) and tokens [ta, tb); finish may be NULL.
 * Lock held. */
static void write_chunk(FILE *f, conn *k, size_t a, size_t b, int ta, int tb, const char *finish)
{
    const srv_request *r = k->r;
    fputs("data: ", f);
    write_head(f, k, k->chat ? "chat.completion.chunk" : "text_completion");
    fputs(",\"choices\":[{\"index\":0,", f);
    if (k->chat) {
        fputs("\"delta\":{", f);
        if (!k->sent_role) {
            fputs("\"role\":\"assistant\"", f);
            k->sent_role = 1;
            if (b > a || !finish) fputc(',', f);
        }
        if (b > a || !finish) {
            fputs("\"content\":", f);
            json_write_str(f, r->text.data ? r->text.data + a : "", b - a);
        }
        fputs("},", f);
    } else {
        fputs("\"text\":", f);
        json_write_str(f, r->text.data ? r->text.data + a : "", b - a);
        fputc(',', f);
    }
    fputs("\"logprobs\":", f);
    write_logprobs(f, k->s, r, k->chat, ta, tb);
    fputs(",\"finish_reason\":", f);
    if (finish) fprintf(f, "\"%s\"", finish);
    else fputs("null", f);
    fputs("}]", f);
    if (finish) {
        fputc(',', f);
        write_usage(f, r);
    }
    fputs("}\n\n", f);
}

/* ---- waiting for the scheduler -------------------------------------------------------- */

/* 1 if the peer closed its end (a read would return EOF or an error). */
static int peer_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = { fd, POLLIN | POLLRDHUP, 0 };
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char c;
    ssize_t got = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* Waits (lock held) until cond holds for r or the client goes away; then
 * marks r cancelled and returns -1. */
static int wait_for(conn *k, int (*cond)(const conn *))
{
    srv_server *s = k->s;
    while (!cond(k)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->progress, &s->lock, &ts);
        if (!cond(k) && peer_gone(k->fd)) {
            k->r->cancelled = 1;
            pthread_cond_signal(&s->wake_sched);
            return -1;
        }
    }
    return 0;
}

static int is_done(const conn *k) { return k->r->state == REQ_DONE; }
static int has_news(const conn *k)
{
    return k->r->state == REQ_DONE || k->r->text_ok > k->sent_text || k->r->n_ok_toks > k->sent_toks;
}
static int is_started(const conn *k) { return k->r->state == REQ_DONE || k->r->n_prompt_tokens > 0 || k->r->cancelled; }

/* The SSE body: blocks until the scheduler has something, then formats it. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    conn *k = cls;
    srv_server *s = k->s;
    (void)pos;
    while (k->out_off >= k->out_len) {
        free(k->out);
        k->out = NULL;
        k->out_len = k->out_off = 0;
        if (k->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&s->lock);
        if (wait_for(k, has_news)) {
            pthread_mutex_unlock(&s->lock);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        srv_request *r = k->r;
        FILE *f = open_memstream(&k->out, &k->out_len);
        if (!f) {
            pthread_mutex_unlock(&s->lock);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (r->state == REQ_DONE && r->err_status) {
            char *e = err_json(r->err_status, NULL, r->error);
            fprintf(f, "data: %s\n\ndata: [DONE]\n\n", e ? e : "{}");
            free(e);
            k->finished = 1;
        } else {
            const size_t b = r->text_ok;
            const int tb = r->n_ok_toks;
            if (b > k->sent_text || tb > k->sent_toks || (!k->sent_role && k->chat))
                write_chunk(f, k, k->sent_text, b, k->sent_toks, tb, NULL);
            k->sent_text = b;
            k->sent_toks = tb;
            if (r->state == REQ_DONE) {
                write_chunk(f, k, b, b, tb, tb, r->finish ? r->finish : "stop");
                fputs("data: [DONE]\n\n", f);
                k->finished = 1;
            }
        }
        pthread_mutex_unlock(&s->lock);
        fclose(f);
    }
    size_t n = k->out_len - k->out_off < max ? k->out_len - k->out_off : max;
    memcpy(buf, k->out + k->out_off, n);
    k->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { (void)cls; /* the conn is freed by on_completed */ }

/* ---- endpoints ------------------------------------------------------------------------------- */

/* What request.c needs of the server (srv_start has applied the defaults). */
static srv_parse_env parse_env(const srv_server *s)
{
    const srv_parse_env e = { s->model, s->cfg.n_ctx, s->cfg.max_prompt, s->cfg.attn, s->cfg.chat_template };
    return e;
}

static enum MHD_Result handle_generate(struct MHD_Connection *c, conn *k, int chat)
{
    srv_server *s = k->s;
    char err[512];
    srv_request *r = calloc(1, sizeof *r);
    int status = 400;
    const char *code = "invalid_request";
    if (!r) return err_reply(c, 500, NULL, "out of memory");
    r->refs = 1;
    const srv_parse_env env = parse_env(s);
    const int prc = srv_parse_request(&env, chat ? SRV_EP_CHAT : SRV_EP_COMPLETIONS, k->body.data, k->body.len, r,
                                      err, sizeof err);
    if (prc == SRV_PARSE_BAD_JSON) {
        srv_request_release(r);
        return err_reply(c, 400, "invalid_json", err);
    }
    if (prc == SRV_PARSE_TOO_LONG) code = "context_length_exceeded";
    if (prc) goto bad;
    r->deadline = srv_now() + s->cfg.timeout;

    k->chat = chat;
    k->r = r;
    pthread_mutex_lock(&s->lock);
    s->n_attached++;
    s->metrics.requests++;
    if (srv_submit(s, r)) {
        s->metrics.rejected++;
        const int stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        return err_reply(c, 503, "server_busy",
                         stopping ? "the server is shutting down" : "the queue is full; retry later");
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    k->fd = ci ? ci->connect_fd : -1;
    static const char *const alpha = "abcdefghijklmnopqrstuvwxyz0123456789";
    uint8_t rb[20];
    if (getrandom(rb, sizeof rb, 0) != (ssize_t)sizeof rb) memset(rb, 7, sizeof rb);
    int o_ = snprintf(k->id, sizeof k->id, "%s", chat ? "chatcmpl-" : "cmpl-");
    for (int i = 0; i < 20 && o_ + i + 1 < (int)sizeof k->id; i++) k->id[o_ + i] = alpha[rb[i] % 36], k->id[o_ + i + 1] = 0;
    k->created = (long)time(NULL);

    if (r->stream) { /* headers go out once the sequence started, so setup errors are still 4xx */
        if (wait_for(k, is_started)) {
            pthread_mutex_unlock(&s->lock);
            return MHD_NO;
        }
        if (r->state == REQ_DONE && r->err_status) {
            char *e = err_json(r->err_status, NULL, r->error);
            int st = r->err_status;
            pthread_mutex_unlock(&s->lock);
            enum MHD_Result rc = e ? reply(c, st, "application/json", e, strlen(e), NULL, NULL) : MHD_NO;
            free(e);
            return rc;
        }
        pthread_mutex_unlock(&s->lock);
        struct MHD_Response *res = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, k, stream_free);
        if (!res) return MHD_NO;
        MHD_add_response_header(res, "Content-Type", "text/event-stream");
        MHD_add_response_header(res, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, res);
        MHD_destroy_response(res);
        return rc;
    }
    if (wait_for(k, is_done)) {
        pthread_mutex_unlock(&s->lock);
        return MHD_NO; /* the client is gone */
    }
    if (r->err_status) {
        char *e = err_json(r->err_status, r->err_status == 504 ? "timeout" : NULL, r->error);
        int st = r->err_status;
        pthread_mutex_unlock(&s->lock);
        enum MHD_Result rc = e ? reply(c, st, "application/json", e, strlen(e), NULL, NULL) : MHD_NO;
        free(e);
        return rc;
    }
    size_t len = 0;
    char *body = write_completion(k, &len);
    pthread_mutex_unlock(&s->lock);
    return json_reply(c, 200, body, len);
bad:
    srv_request_release(r);
    pthread_mutex_lock(&s->lock);
    s->metrics.requests++;
    s->metrics.errors++;
    pthread_mutex_unlock(&s->lock);
    return err_reply(c, status, code, err);
}

static enum MHD_Result handle_tokenize(struct MHD_Connection *c, conn *k, int detok)
{
    srv_server *s = k->s;
    char err[512];
    srv_request r;
    memset(&r, 0, sizeof r);
    const srv_parse_env env = parse_env(s);
    const int prc = srv_parse_request(&env, detok ? SRV_EP_DETOKENIZE : SRV_EP_TOKENIZE, k->body.data, k->body.len,
                                      &r, err, sizeof err);
    int32_t *ids = r.prompt;
    const int n = r.n_prompt;
    if (prc) {
        free(ids);
        return err_reply(c, 400, prc == SRV_PARSE_BAD_JSON ? "invalid_json" : "invalid_request", err);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        free(ids);
        return MHD_NO;
    }
    if (!detok) {
        fputs("{\"tokens\":[", f);
        for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", ids[i]);
        fputs("]}", f);
    } else {
        text_buf t = { 0 };
        char piece[256];
        for (int i = 0; i < n; i++) {
            int pl = sparq_token_to_piece(s->model, ids[i], piece, sizeof piece);
            if (pl > (int)sizeof piece) pl = sizeof piece;
            if (pl > 0) text_append(&t, piece, (size_t)pl);
        }
        fputs("{\"content\":", f);
        json_write_str(f, t.data ? t.data : "", t.len);
        fputs("}", f);
        free(t.data);
    }
    fclose(f);
    free(ids);
    return json_reply(c, 200, buf, len);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *c, srv_server *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    pthread_mutex_lock(&s->lock);
    const srv_metrics m = s->metrics;
    const int queued = s->n_queued, active = s->n_active;
    pthread_mutex_unlock(&s->lock);
#define METRIC(name, type, help, fmt, val) \
    fprintf(f, "# HELP sparq_" name " " help "\n# TYPE sparq_" name " " type "\nsparq_" name " " fmt "\n", val)
    METRIC("requests_total", "counter", "Generation requests received.", "%lld", (long long)m.requests);
    METRIC("request_errors_total", "counter", "Generation requests that failed (4xx/5xx).", "%lld", (long long)m.errors);
    METRIC("requests_rejected_total", "counter", "Requests refused because the queue was full (503).", "%lld", (long long)m.rejected);
    METRIC("requests_cancelled_total", "counter", "Sequences cancelled by a client disconnect.", "%lld", (long long)m.cancelled);
    METRIC("queue_depth", "gauge", "Requests waiting for a slot.", "%d", queued);
    METRIC("active_sequences", "gauge", "Sequences being prefilled or decoded.", "%d", active);
    METRIC("prefill_tokens_total", "counter", "Prompt tokens prefilled.", "%lld", (long long)m.prefill_tokens);
    METRIC("decode_tokens_total", "counter", "Tokens decoded (batched steps).", "%lld", (long long)m.decode_tokens);
    METRIC("prefill_tokens_per_second", "gauge", "Prefill throughput while prefilling.", "%.3f",
           m.prefill_seconds > 0 ? m.prefill_tokens / m.prefill_seconds : 0.0);
    METRIC("decode_tokens_per_second", "gauge", "Aggregate decode throughput while decoding.", "%.3f",
           m.decode_seconds > 0 ? m.decode_tokens / m.decode_seconds : 0.0);
    METRIC("prefix_cache_hits_total", "counter", "Prompts that started from a cached prefix.", "%lld",
           (long long)m.prefix_hits);
    METRIC("prefix_cache_tokens_total", "counter", "Prompt tokens mapped from the prefix cache, not prefilled.",
           "%lld", (long long)m.prefix_tokens);
    METRIC("prefix_cache_waits_total", "counter", "Requests that waited for another sequence to prefill their prefix.",
           "%lld", (long long)m.prefix_waits);
    METRIC("prefill_tails_batched_total", "counter",
           "Prompts whose one uncached last token was prefilled with others' in one pass.", "%lld",
           (long long)m.tails_batched);
    METRIC("prefix_cache_entries", "gauge", "Prefixes in the cache.", "%lld", (long long)m.prefix_entries);
    METRIC("prefix_cache_bytes", "gauge", "Bytes the cached prefixes hold (one shared copy each).", "%lld",
           (long long)m.prefix_bytes);
    METRIC("prefix_cache_sequences", "gauge", "Sequences mapping a cached prefix now.", "%lld",
           (long long)m.prefix_users);
    METRIC("kv_dir_hits_total", "counter", "Prompts that started from a prefix file in --kv-dir.", "%lld",
           (long long)m.kv_dir_hits);
    METRIC("kv_dir_tokens_total", "counter", "Prompt tokens loaded from --kv-dir files, not prefilled.", "%lld",
           (long long)m.kv_dir_tokens);
    METRIC("kv_dir_writes_total", "counter", "Prefix files written to --kv-dir.", "%lld", (long long)m.kv_dir_writes);
    METRIC("kv_dir_evictions_total", "counter", "Files deleted from --kv-dir by this replica's size budget.", "%lld",
           (long long)m.kv_dir_evictions);
    METRIC("kv_dir_errors_total", "counter", "Prefix files that could not be written to --kv-dir.", "%lld",
           (long long)m.kv_dir_errors);
    METRIC("kv_dir_skipped_total", "counter", "Prefix files not written: the writer's queue was full.", "%lld",
           (long long)m.kv_dir_skipped);
    METRIC("kv_dir_pending", "gauge", "Prefix files queued for --kv-dir or being written now.", "%lld",
           (long long)m.kv_dir_pending);
#undef METRIC
    fprintf(f, "# HELP sparq_build_info The library version and the SIMD kernel level running.\n"
               "# TYPE sparq_build_info gauge\nsparq_build_info{version=\"%s\",cpu=\"%s\"} 1\n",
            sparq_version(), sparq_cpu_level());
    fputs("# HELP sparq_attn_bytes_read_total KV-cache bytes read and written by decode attention, by policy.\n"
          "# TYPE sparq_attn_bytes_read_total counter\n", f);
    for (int i = 0; i < SRV_MAX_POLICIES && sparq_attn_policy_name(i); i++)
        fprintf(f, "sparq_attn_bytes_read_total{policy=\"%s\"} %lld\n", sparq_attn_policy_name(i), (long long)m.attn_bytes[i]);
    fclose(f);
    enum MHD_Result rc = buf ? reply(c, 200, "text/plain; version=0.0.4", buf, len, NULL, NULL) : MHD_NO;
    free(buf);
    return rc;
}

static enum MHD_Result handle_models(struct MHD_Connection *c, srv_server *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    fputs("{\"object\":\"list\",\"data\":[{\"id\":", f);
    json_write_str(f, s->cfg.model_id, strlen(s->cfg.model_id));
    fprintf(f, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"sparq\"}]}", (long)time(NULL));
    fclose(f);
    return json_reply(c, 200, buf, len);
}

/* ---- routing --------------------------------------------------------------------------------- */

static int authorised(struct MHD_Connection *c, const srv_server *s)
{
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    const size_t a = strlen(h), b = strlen(s->cfg.api_key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(h[i] ^ s->cfg.api_key[i]); /* no early exit */
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv_server *s = cls;
    (void)version;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        k->s = s;
        k->fd = -1;
        *con_cls = k;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) k->too_large = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_large && k->body.len + *upload_size > s->cfg.max_body) k->too_large = 1;
        if (!k->too_large && text_append(&k->body, upload, *upload_size)) k->too_large = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    static const struct { const char *path, *method; int ep; } routes[] = {
        { "/v1/completions", "POST", 1 }, { "/v1/chat/completions", "POST", 2 }, { "/v1/models", "GET", 3 },
        { "/health", "GET", 4 }, { "/metrics", "GET", 5 }, { "/tokenize", "POST", 6 }, { "/detokenize", "POST", 7 },
        { "/completions", "POST", 1 }, { "/chat/completions", "POST", 2 }, { "/models", "GET", 3 },
    };
    int ep = 0;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !ep; i++) {
        if (strcmp(url, routes[i].path) != 0) continue;
        if (strcmp(method, routes[i].method) != 0) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s takes %s, not %.16s", url, routes[i].method, method);
            struct MHD_Response *res;
            char *b = err_json(405, "method_not_allowed", msg);
            if (!b || !(res = MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE))) {
                free(b);
                return MHD_NO;
            }
            MHD_add_response_header(res, "Content-Type", "application/json");
            MHD_add_response_header(res, "Allow", routes[i].method);
            enum MHD_Result rc = MHD_queue_response(c, 405, res);
            MHD_destroy_response(res);
            return rc;
        }
        ep = routes[i].ep;
    }
    if (!ep) {
        char msg[160];
        snprintf(msg, sizeof msg, "no endpoint %.100s", url);
        return err_reply(c, 404, "not_found", msg);
    }
    if (ep == 4) return reply(c, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL, NULL);
    if (!authorised(c, s)) return err_reply(c, 401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)");
    if (k->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes", s->cfg.max_body);
        return err_reply(c, 400, "body_too_large", msg);
    }
    switch (ep) {
    case 1: return handle_generate(c, k, 0);
    case 2: return handle_generate(c, k, 1);
    case 3: return handle_models(c, s);
    case 5: return handle_metrics(c, s);
    case 6: return handle_tokenize(c, k, 0);
    default: return handle_tokenize(c, k, 1);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    srv_server *s = cls;
    conn *k = *con_cls;
    (void)c;
    (void)why;
    if (!k) return;
    if (k->r) {
        pthread_mutex_lock(&s->lock);
        if (k->r->state != REQ_DONE) { /* the client left before the end */
            k->r->cancelled = 1;
            pthread_cond_signal(&s->wake_sched);
        }
        srv_request_release(k->r);
        s->n_attached--;
        pthread_cond_broadcast(&s->progress);
        pthread_mutex_unlock(&s->lock);
    }
    free(k->body.data);
    free(k->out);
    free(k);
    *con_cls = NULL;
}

/* ---- life cycle ------------------------------------------------------------------------------ */

srv_server *srv_start(sparq_model *m, const srv_config *cfg, char *err, size_t err_size)
{
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_size, "serve: out of memory");
        return NULL;
    }
    s->model = m;
    s->cfg = *cfg;
    s->n_vocab = sparq_model_n_vocab(m);
    s->t_start = srv_now();
    if (s->cfg.n_ctx <= 0) s->cfg.n_ctx = sparq_model_n_ctx_train(m);
    if (s->cfg.max_prompt <= 0 || s->cfg.max_prompt > s->cfg.n_ctx - 1) s->cfg.max_prompt = (int)(s->cfg.n_ctx - 1);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake_sched, NULL);
    pthread_cond_init(&s->progress, NULL);
    if (pthread_create(&s->sched, NULL, srv_sched_main, s) != 0) {
        snprintf(err, err_size, "serve: cannot start the scheduler thread");
        srv_stop(s, 0);
        return NULL;
    }
    s->sched_started = 1;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)cfg->port);
    if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) {
        snprintf(err, err_size, "serve: --host '%s' is not an IPv4 address", cfg->host);
        srv_stop(s, 0);
        return NULL;
    }
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL,
                                 (uint16_t)cfg->port, NULL, NULL, on_request, s,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->parallel + cfg->queue + 64),
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)256 * 1024,
                                 MHD_OPTION_END);
    if (!s->daemon) {
        snprintf(err, err_size, "serve: cannot listen on %s:%d (%s)", cfg->host, cfg->port, strerror(errno));
        srv_stop(s, 0);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    return s;
}

int srv_port(const srv_server *s) { return s->port; }

void srv_stop(srv_server *s, double grace)
{
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_signal(&s->wake_sched);
    const double until = srv_now() + grace;
    while ((s->n_active || s->n_queued) && srv_now() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->progress, &s->lock, &ts);
    }
    s->stopping = 2; /* cancel what is left */
    pthread_cond_signal(&s->wake_sched);
    pthread_mutex_unlock(&s->lock);
    if (s->sched_started) pthread_join(s->sched, NULL);
    /* every request is finished now; give their connections a moment to
     * send the end (a stream's [DONE], the error object) before closing */
    pthread_mutex_lock(&s->lock);
    const double close_by = srv_now() + 3.0;
    while (s->n_attached > 0 && srv_now() < close_by) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->progress, &s->lock, &ts);
    }
    pthread_mutex_unlock(&s->lock);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    pthread_cond_destroy(&s->progress);
    pthread_cond_destroy(&s->wake_sched);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
