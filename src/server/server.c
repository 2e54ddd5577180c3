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
 *   handle_page / props       GET / (the chat page, webui.h), GET /props
 *   handle_slots / _action    GET /slots, POST /slots/ID?action= (slots.c)
 *   on_request                routing
 */
#include "server/server.h"
#include "server/request.h"
#include "server/webui.h"
#include "util/err.h"
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

enum { EP_NONE, EP_COMPLETIONS, EP_CHAT, EP_MODELS, EP_HEALTH, EP_METRICS, EP_TOKENIZE, EP_DETOKENIZE, EP_PREFLIGHT,
       EP_PAGE, EP_PROPS, EP_EMBEDDINGS, EP_SLOTS, EP_SLOT_ACTION };

typedef struct conn {
    srv_server  *s;
    struct MHD_Connection *mc;
    text_buf     body;
    int          too_large;
    int          started;       /* the access handler has seen the headers  */
    int          nul_in_path;   /* the raw path holds %00                   */
    int          cut;           /* the read deadline passed (the watchdog)  */
    const char  *raw_uri;       /* on_uri's view of the request target ...  */
    size_t       raw_len;       /* ... and its length as a C string         */
    int          status;        /* the HTTP status queued (0: none)         */
    double       t0;            /* when the request line arrived            */
    unsigned long long seq;     /* this process's request number            */
    char         method[12], route[24];
    srv_request *r;             /* generation in flight: rs[0]              */
    srv_request *rs[SRV_MAX_N]; /* its n choices, one reference each        */
    int          n_rs;
    int          chat;
    char         id[48];
    long         created;
    int          fd;
    /* streaming, per choice */
    char        *out;           /* pending SSE bytes                       */
    size_t       out_len, out_off;
    size_t       sent_text[SRV_MAX_N];
    int          sent_toks[SRV_MAX_N], sent_role[SRV_MAX_N], sent_finish[SRV_MAX_N];
    int          finished;      /* [DONE] written                           */
} conn;

/* One open connection (libmicrohttpd's socket context), in the server's
 * list from accept to close: what the connection limits count and what
 * the watchdog cuts when a request takes too long to arrive. [lock] */
typedef struct srv_sock {
    struct srv_sock *prev, *next;
    int      fd;
    uint32_t addr;              /* the peer's IPv4 address (network order)  */
    double   t0;                /* when the current request began to arrive */
    int      reading;           /* 1 until its head and body are in         */
    int      cut;               /* the watchdog shut it down                */
} srv_sock;

/* ---- responses --------------------------------------------------------------- */

/* Every response goes out here, so the request log knows its status. */
static enum MHD_Result queue(conn *k, int status, struct MHD_Response *res)
{
    /* browsers (a web UI on another origin) may read every answer, errors
     * included, as from llama-server; the API key still guards the routes */
    MHD_add_response_header(res, "Access-Control-Allow-Origin", "*");
    const enum MHD_Result rc = MHD_queue_response(k->mc, (unsigned)status, res);
    if (rc == MHD_YES) k->status = status;
    return rc;
}

static enum MHD_Result reply(conn *k, int status, const char *ctype, const char *body,
                             size_t len, const char *extra_header, const char *extra_value)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, "Content-Type", ctype);
    if (extra_header) MHD_add_response_header(res, extra_header, extra_value);
    enum MHD_Result rc = queue(k, status, res);
    MHD_destroy_response(res);
    return rc;
}

static const char *err_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "server_overloaded";
    case 501: return "not_supported_error";
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

static enum MHD_Result err_reply(conn *k, int status, const char *code, const char *msg)
{
    char *b = err_json(status, code, msg);
    if (!b) return MHD_NO;
    enum MHD_Result rc = reply(k, status, "application/json", b, strlen(b),
                               status == 503 ? "Retry-After" : status == 405 ? "Allow" : NULL,
                               status == 503 ? "1" : "POST");
    free(b);
    return rc;
}

static enum MHD_Result json_reply(conn *k, int status, char *buf, size_t len)
{
    enum MHD_Result rc = buf ? reply(k, status, "application/json", buf, len, NULL, NULL) : MHD_NO;
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

/* The prompt is counted once, the completion tokens of every choice. */
static void write_usage(FILE *f, const conn *k)
{
    int gen = 0;
    for (int i = 0; i < k->n_rs; i++) gen += k->rs[i]->n_gen;
    const int prompt = k->rs[0]->n_prompt;
    fprintf(f, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", prompt, gen,
            prompt + gen);
}

/* llama-server's "timings" (the first choice's prompt; the tokens of
 * every choice over the longest decode), then sparq's report on its
 * attention: the KV elements decode attention read, what dense attention
 * reads for the same steps, and their ratio (null before any decode
 * step). Every choice is done. Lock held. */
static void write_timings(FILE *f, const conn *k)
{
    const srv_request *r0 = k->rs[0];
    int gen = 0;
    double dec = 0;
    int64_t rd = 0, dn = 0;
    for (int i = 0; i < k->n_rs; i++) {
        const srv_request *r = k->rs[i];
        gen += r->n_gen;
        if (r->t_prefilled > 0 && r->t_done > r->t_prefilled && r->t_done - r->t_prefilled > dec)
            dec = r->t_done - r->t_prefilled;
        rd += r->kv_read;
        dn += r->kv_dense;
    }
    const int pn = r0->n_prompt_tokens - r0->n_cached;
    const double pms = r0->t_admit > 0 && r0->t_prefilled > r0->t_admit ? (r0->t_prefilled - r0->t_admit) * 1e3 : 0;
    const double gms = dec * 1e3;
    fprintf(f, "\"timings\":{\"cache_n\":%d,\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.3f,"
               "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,\"predicted_per_token_ms\":%.3f,"
               "\"predicted_per_second\":%.3f},",
            r0->n_cached, pn, pms, pn > 0 ? pms / pn : 0.0, pms > 0 ? pn / pms * 1e3 : 0.0, gen, gms,
            gen > 0 ? gms / gen : 0.0, gms > 0 ? gen / gms * 1e3 : 0.0);
    fputs("\"sparq\":{\"attn\":", f);
    json_write_str(f, r0->policy, strlen(r0->policy));
    fprintf(f, ",\"kv_read\":%lld,\"kv_dense\":%lld,\"kv_read_fraction\":", (long long)rd, (long long)dn);
    if (dn > 0) fprintf(f, "%.6f}", (double)rd / (double)dn);
    else fputs("null}", f);
}

/* The whole (non-streamed) reply. Lock held. */
static char *write_completion(conn *k, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    write_head(f, k, k->chat ? "chat.completion" : "text_completion");
    fputs(",\"choices\":[", f);
    for (int i = 0; i < k->n_rs; i++) {
        const srv_request *r = k->rs[i];
        fprintf(f, "%s{\"index\":%d,", i ? "," : "", i);
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
        fprintf(f, ",\"finish_reason\":\"%s\"}", r->finish ? r->finish : "stop");
    }
    fputs("],", f);
    write_usage(f, k);
    fputc(',', f);
    write_timings(f, k);
    fputs("}", f);
    fclose(f);
    return buf;
}

/* One SSE event of choice i with text [a, b) and tokens [ta, tb); finish
 * may be NULL; usage: the whole request's usage and timings, on its last
 * event. Lock held. */
static void write_chunk(FILE *f, conn *k, int i, size_t a, size_t b, int ta, int tb, const char *finish, int usage)
{
    const srv_request *r = k->rs[i];
    fputs("data: ", f);
    write_head(f, k, k->chat ? "chat.completion.chunk" : "text_completion");
    fprintf(f, ",\"choices\":[{\"index\":%d,", i);
    if (k->chat) {
        fputs("\"delta\":{", f);
        if (!k->sent_role[i]) {
            fputs("\"role\":\"assistant\"", f);
            k->sent_role[i] = 1;
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
    if (usage) {
        fputc(',', f);
        write_usage(f, k);
        fputc(',', f);
        write_timings(f, k);
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
            for (int i = 0; i < k->n_rs; i++) k->rs[i]->cancelled = 1;
            pthread_cond_signal(&s->wake_sched);
            return -1;
        }
    }
    return 0;
}

/* Stops the choices still running (another one failed). Lock held. */
static void cancel_rest(conn *k)
{
    for (int i = 0; i < k->n_rs; i++)
        if (k->rs[i]->state != REQ_DONE) k->rs[i]->cancelled = 1;
    pthread_cond_signal(&k->s->wake_sched);
}

/* The first failed choice, or NULL. */
static const srv_request *failed(const conn *k)
{
    for (int i = 0; i < k->n_rs; i++)
        if (k->rs[i]->state == REQ_DONE && k->rs[i]->err_status) return k->rs[i];
    return NULL;
}
static int is_done(const conn *k)
{
    if (failed(k)) return 1; /* the whole request fails with it */
    for (int i = 0; i < k->n_rs; i++)
        if (k->rs[i]->state != REQ_DONE) return 0;
    return 1;
}
static int has_news(const conn *k)
{
    for (int i = 0; i < k->n_rs; i++) {
        const srv_request *r = k->rs[i];
        if ((r->state == REQ_DONE && !k->sent_finish[i]) || r->text_ok > k->sent_text[i] ||
            r->n_ok_toks > k->sent_toks[i])
            return 1;
    }
    return 0;
}
/* The stream's headers wait for the first choice to start (or any to
 * fail): later choices may wait for a slot while the first one streams. */
static int is_started(const conn *k)
{
    return failed(k) || k->r->state == REQ_DONE || k->r->n_prompt_tokens > 0 || k->r->cancelled;
}

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
        FILE *f = open_memstream(&k->out, &k->out_len);
        if (!f) {
            pthread_mutex_unlock(&s->lock);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        const srv_request *bad = failed(k);
        if (bad) { /* one choice failed: the request ends with its error; the others stop */
            char *e = err_json(bad->err_status, NULL, bad->error);
            fprintf(f, "data: %s\n\ndata: [DONE]\n\n", e ? e : "{}");
            free(e);
            k->finished = 1;
            cancel_rest(k);
        } else {
            int n_fin = 0;
            for (int i = 0; i < k->n_rs; i++) n_fin += k->sent_finish[i];
            for (int i = 0; i < k->n_rs; i++) {
                const srv_request *r = k->rs[i];
                if (k->sent_finish[i]) continue;
                const size_t b = r->text_ok;
                const int tb = r->n_ok_toks;
                if (b > k->sent_text[i] || tb > k->sent_toks[i] || (!k->sent_role[i] && k->chat))
                    write_chunk(f, k, i, k->sent_text[i], b, k->sent_toks[i], tb, NULL, 0);
                k->sent_text[i] = b;
                k->sent_toks[i] = tb;
                if (r->state == REQ_DONE) { /* the usage goes with the last choice to end */
                    write_chunk(f, k, i, b, b, tb, tb, r->finish ? r->finish : "stop", ++n_fin == k->n_rs);
                    k->sent_finish[i] = 1;
                }
            }
            if (n_fin == k->n_rs) {
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
    const srv_parse_env e = { s->model,    s->cfg.n_ctx, s->cfg.max_prompt, s->cfg.attn, s->cfg.chat_template,
                              s->cfg.docs, s->cfg.n_docs };
    return e;
}

static enum MHD_Result handle_generate(conn *k, int chat)
{
    srv_server *s = k->s;
    char err[512];
    srv_request *r = calloc(1, sizeof *r);
    int status = 400;
    const char *code = "invalid_request";
    if (!r) return err_reply(k, 500, NULL, "out of memory");
    r->refs = 1;
    const srv_parse_env env = parse_env(s);
    const int prc = srv_parse_request(&env, chat ? SRV_EP_CHAT : SRV_EP_COMPLETIONS, k->body.data, k->body.len, r,
                                      err, sizeof err);
    if (prc == SRV_PARSE_BAD_JSON) {
        srv_request_release(r);
        return err_reply(k, 400, "invalid_json", err);
    }
    if (prc == SRV_PARSE_TOO_LONG) code = "context_length_exceeded";
    if (prc) goto bad;
    /* every choice is a sequence of its own: n beyond what the server can
     * hold at once could never be admitted */
    if (r->n > s->cfg.parallel + s->cfg.queue) {
        err_set(err, sizeof err, "'n' is %d; this server holds at most %d sequences (--parallel + --queue)", r->n,
                s->cfg.parallel + s->cfg.queue);
        goto bad;
    }
    r->deadline = srv_now() + s->cfg.timeout;
    srv_request *rs[SRV_MAX_N] = { r };
    for (int i = 1; i < r->n; i++) {
        /* seed + i: choice 0 is what n = 1 gives; the others differ (at
         * temperature 0 all equal it) */
        if (!(rs[i] = srv_request_clone(r, r->seed + (uint64_t)i))) {
            for (int j = 1; j < i; j++) srv_request_release(rs[j]);
            err_set(err, sizeof err, "out of memory");
            status = 500;
            code = NULL;
            goto bad;
        }
    }

    k->chat = chat;
    k->r = r;
    memcpy(k->rs, rs, sizeof rs);
    k->n_rs = r->n;
    pthread_mutex_lock(&s->lock);
    s->n_attached++;
    s->metrics.requests++;
    /* all choices or none: a request never runs with part of its n */
    if (s->stopping || s->n_queued + s->n_active + k->n_rs > s->cfg.parallel + s->cfg.queue) {
        s->metrics.rejected++;
        const int stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        return err_reply(k, 503, "server_busy",
                         stopping ? "the server is shutting down" : "the queue is full; retry later");
    }
    for (int i = 0; i < k->n_rs; i++) srv_submit(s, k->rs[i]); /* room checked above, under the same lock */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(k->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
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
        const srv_request *bad = failed(k);
        if (bad) {
            char *e = err_json(bad->err_status, NULL, bad->error);
            int st = bad->err_status;
            cancel_rest(k);
            pthread_mutex_unlock(&s->lock);
            enum MHD_Result rc = e ? reply(k, st, "application/json", e, strlen(e), NULL, NULL) : MHD_NO;
            free(e);
            return rc;
        }
        pthread_mutex_unlock(&s->lock);
        struct MHD_Response *res = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, k, stream_free);
        if (!res) return MHD_NO;
        MHD_add_response_header(res, "Content-Type", "text/event-stream");
        MHD_add_response_header(res, "Cache-Control", "no-cache");
        enum MHD_Result rc = queue(k, MHD_HTTP_OK, res);
        MHD_destroy_response(res);
        return rc;
    }
    if (wait_for(k, is_done)) {
        pthread_mutex_unlock(&s->lock);
        return MHD_NO; /* the client is gone */
    }
    const srv_request *bad = failed(k);
    if (bad) {
        char *e = err_json(bad->err_status, bad->err_status == 504 ? "timeout" : NULL, bad->error);
        int st = bad->err_status;
        cancel_rest(k);
        pthread_mutex_unlock(&s->lock);
        enum MHD_Result rc = e ? reply(k, st, "application/json", e, strlen(e), NULL, NULL) : MHD_NO;
        free(e);
        return rc;
    }
    size_t len = 0;
    char *body = write_completion(k, &len);
    pthread_mutex_unlock(&s->lock);
    return json_reply(k, 200, body, len);
bad:
    srv_request_release(r);
    pthread_mutex_lock(&s->lock);
    s->metrics.requests++;
    s->metrics.errors++;
    pthread_mutex_unlock(&s->lock);
    return err_reply(k, status, code, err);
}

static enum MHD_Result handle_tokenize(conn *k, int detok)
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
        return err_reply(k, 400, prc == SRV_PARSE_BAD_JSON ? "invalid_json" : "invalid_request", err);
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
    return json_reply(k, 200, buf, len);
}

static enum MHD_Result handle_embeddings(conn *k)
{
    char err[512] = "", *out = NULL;
    size_t len = 0;
    const int status = srv_embeddings(k->s, k->body.data, k->body.len, &out, &len, err, sizeof err);
    if (status == 200) return json_reply(k, 200, out, len);
    return err_reply(k, status, status == 501 ? "not_supported" : status == 400 ? "invalid_request" : NULL, err);
}

/* GET /slots[?fail_on_no_slot=1] (slots.c): 503 with that flag when every
 * slot is busy, as llama-server. */
static enum MHD_Result handle_slots(conn *k)
{
    srv_server *s = k->s;
    if (s->cfg.no_slots)
        return err_reply(k, 501, "not_supported", "this server does not list its slots (started with --no-slots)");
    const char *fail = MHD_lookup_connection_value(k->mc, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot");
    if (fail && strcmp(fail, "0") != 0) {
        pthread_mutex_lock(&s->lock);
        int idle = 0;
        for (int i = 0; i < s->cfg.parallel; i++) idle += !s->slot_pub[i].r;
        pthread_mutex_unlock(&s->lock);
        if (!idle) return err_reply(k, 503, "no_slot_available", "no slot available");
    }
    size_t len = 0;
    char *b = srv_slots_json(s, &len);
    return json_reply(k, 200, b, len);
}

/* POST /slots/ID?action=save|restore|erase (slots.c) */
static enum MHD_Result handle_slot_action(conn *k, const char *url)
{
    char err[512] = "", *out = NULL;
    size_t len = 0;
    const char *code = NULL;
    const char *action = MHD_lookup_connection_value(k->mc, MHD_GET_ARGUMENT_KIND, "action");
    const int st = srv_slot_request(k->s, url + 7, action, k->body.data, k->body.len, &out, &len, &code, err, sizeof err);
    if (st == 200) return json_reply(k, 200, out, len);
    return err_reply(k, st, code, err);
}

static enum MHD_Result handle_metrics(conn *k)
{
    srv_server *s = k->s;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    pthread_mutex_lock(&s->lock);
    const srv_metrics m = s->metrics;
    const int queued = s->n_queued, active = s->n_active, socks = s->n_socks, attached = s->n_attached;
    pthread_mutex_unlock(&s->lock);
#define METRIC(name, type, help, fmt, val) \
    fprintf(f, "# HELP sparq_" name " " help "\n# TYPE sparq_" name " " type "\nsparq_" name " " fmt "\n", val)
    METRIC("requests_total", "counter", "Generation requests received.", "%lld", (long long)m.requests);
    METRIC("request_errors_total", "counter", "Generation requests that failed (4xx/5xx; not client cancellations).",
           "%lld", (long long)m.errors);
    METRIC("requests_rejected_total", "counter", "Requests refused because the queue was full (503).", "%lld", (long long)m.rejected);
    METRIC("requests_cancelled_total", "counter", "Generation requests cancelled by their client (a disconnect), apart from errors.", "%lld", (long long)m.cancelled);
    METRIC("queue_depth", "gauge", "Requests waiting for a slot.", "%d", queued);
    METRIC("active_sequences", "gauge", "Sequences being prefilled or decoded.", "%d", active);
    /* what a connection or handler that never ends would leave behind:
     * both return to their idle values (1: this scrape; 0) when it is quiet */
    METRIC("open_connections", "gauge", "Client connections open now, this scrape's own included.", "%d", socks);
    METRIC("requests_in_flight", "gauge", "Generation requests whose client connection is still open.", "%d", attached);
    METRIC("prefill_tokens_total", "counter", "Prompt tokens prefilled.", "%lld", (long long)m.prefill_tokens);
    METRIC("decode_tokens_total", "counter", "Tokens decoded (batched steps).", "%lld", (long long)m.decode_tokens);
    METRIC("prefill_tokens_per_second", "gauge", "Prefill throughput while prefilling.", "%.3f",
           m.prefill_seconds > 0 ? m.prefill_tokens / m.prefill_seconds : 0.0);
    METRIC("decode_tokens_per_second", "gauge", "Aggregate decode throughput while decoding.", "%.3f",
           m.decode_seconds > 0 ? m.decode_tokens / m.decode_seconds : 0.0);
    METRIC("prefix_cache_hits_total", "counter", "Prompts that started from a cached prefix.", "%lld",
           (long long)m.prefix_hits);
    METRIC("prefix_cache_tokens_total", "counter", "Prompt tokens mapped or copied from the prefix cache, not prefilled.",
           "%lld", (long long)m.prefix_tokens);
    METRIC("prefix_cache_waits_total", "counter", "Requests that waited for another sequence to prefill their prefix.",
           "%lld", (long long)m.prefix_waits);
    METRIC("contexts_reused_total", "counter",
           "Requests that ran in their slot's previous context, reset (its memory already committed).", "%lld",
           (long long)m.contexts_reused);
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
    enum MHD_Result rc = buf ? reply(k, 200, "text/plain; version=0.0.4", buf, len, NULL, NULL) : MHD_NO;
    free(buf);
    return rc;
}

static enum MHD_Result handle_models(conn *k)
{
    srv_server *s = k->s;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    fputs("{\"object\":\"list\",\"data\":[{\"id\":", f);
    json_write_str(f, s->cfg.model_id, strlen(s->cfg.model_id));
    fprintf(f, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"sparq\"}]}", (long)time(NULL));
    fclose(f);
    return json_reply(k, 200, buf, len);
}

/* The chat page: a fresh nonce per copy, named by the policy sent with
 * it; revalidated on every visit, so an upgraded binary's page is the one
 * that talks to its API. */
static enum MHD_Result handle_page(conn *k)
{
    char nonce[SRV_WEBUI_NONCE_LEN + 1], csp[512];
    size_t len = 0;
    char *page = srv_webui_page(nonce, &len);
    if (!page) return err_reply(k, 500, NULL, "cannot prepare the page (out of memory or no randomness)");
    srv_webui_csp(nonce, csp, sizeof csp);
    struct MHD_Response *res = MHD_create_response_from_buffer(len, page, MHD_RESPMEM_MUST_FREE);
    if (!res) {
        free(page);
        return MHD_NO;
    }
    MHD_add_response_header(res, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(res, "Content-Security-Policy", csp);
    MHD_add_response_header(res, "Cache-Control", "no-cache");
    MHD_add_response_header(res, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(res, "X-Frame-Options", "DENY");
    MHD_add_response_header(res, "Referrer-Policy", "no-referrer");
    enum MHD_Result rc = queue(k, 200, res);
    MHD_destroy_response(res);
    return rc;
}

static enum MHD_Result handle_props(conn *k)
{
    size_t len = 0;
    char *buf = srv_props_json(k->s, &len);
    return buf ? json_reply(k, 200, buf, len) : err_reply(k, 500, NULL, "out of memory");
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

/* Starts (1) or stops (0) the read deadline of k's connection; notes in
 * k whether the watchdog had cut it. */
static void sock_reading(conn *k, int reading)
{
    const union MHD_ConnectionInfo *si = MHD_get_connection_info(k->mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_sock *so = si ? si->socket_context : NULL;
    if (!so) return;
    pthread_mutex_lock(&k->s->lock);
    k->cut |= so->cut;
    so->reading = reading;
    so->t0 = srv_now();
    pthread_mutex_unlock(&k->s->lock);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    srv_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        srv_sock *so = calloc(1, sizeof *so);
        *socket_context = so;
        if (!so) return; /* neither limited nor watched: the daemon's hard limit still holds */
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        so->fd = fi ? fi->connect_fd : -1;
        if (ai && ai->client_addr && ai->client_addr->sa_family == AF_INET)
            so->addr = ((const struct sockaddr_in *)(const void *)ai->client_addr)->sin_addr.s_addr;
        so->reading = 1;
        so->t0 = srv_now();
        pthread_mutex_lock(&s->lock);
        so->next = s->socks;
        if (s->socks) s->socks->prev = so;
        s->socks = so;
        s->n_socks++;
        pthread_mutex_unlock(&s->lock);
        return;
    }
    srv_sock *so = *socket_context;
    if (!so) return;
    /* libmicrohttpd closes the socket after this returns: once out of the
     * list (under the lock) the watchdog can no longer touch its fd */
    pthread_mutex_lock(&s->lock);
    if (so->prev) so->prev->next = so->next;
    else s->socks = so->next;
    if (so->next) so->next->prev = so->prev;
    s->n_socks--;
    pthread_mutex_unlock(&s->lock);
    free(so);
    *socket_context = NULL;
}

/* libmicrohttpd's connection timeout counts idle time only: a client that
 * sends its head (or body) one byte every few seconds holds a connection,
 * and with one thread per connection a thread, for as long as it likes.
 * This thread shuts down (the socket, not the fd: libmicrohttpd still owns
 * and closes it) every connection whose request has not fully arrived
 * read_timeout seconds after it began. */
static void *watchdog_main(void *arg)
{
    srv_server *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        const double now = srv_now();
        for (srv_sock *so = s->socks; so; so = so->next)
            if (so->reading && !so->cut && so->fd >= 0 && now - so->t0 > s->cfg.read_timeout) {
                shutdown(so->fd, SHUT_RDWR);
                so->cut = 1;
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->wake_watchdog, &s->lock, &ts);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static conn *conn_new(srv_server *s)
{
    conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->s = s;
    k->fd = -1;
    k->t0 = srv_now();
    pthread_mutex_lock(&s->lock);
    k->seq = ++s->n_requests;
    pthread_mutex_unlock(&s->lock);
    return k;
}

static enum MHD_Result body_too_large(conn *k)
{
    char msg[128];
    snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes", k->s->cfg.max_body);
    return err_reply(k, 413, "body_too_large", msg);
}

/* The access handler's first call for a request (the head is complete, no
 * byte of the body has been read): everything that can be decided from
 * the head is answered now, so a client that is refused (unknown path,
 * wrong method, no API key, a declared body over the limit) never makes
 * the server read, let alone buffer, its body. libmicrohttpd then closes
 * the connection instead of reading the rest. Returns MHD_YES with nothing
 * queued when the request goes on to its body. */
/* A CORS preflight (OPTIONS on a route): what a browser needs before the
 * real request. It carries no credentials, so it is answered without the
 * API key; the request that follows still needs it. The headers asked for
 * are allowed when they are plain header names (the openai package adds
 * its own x-stainless-* ones). */
static enum MHD_Result preflight(conn *k)
{
    char allow_headers[1100] = "Authorization, Content-Type";
    const char *want = MHD_lookup_connection_value(k->mc, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    if (want) {
        const size_t n = strlen(want);
        int ok = n > 0 && n <= 1024;
        for (size_t i = 0; ok && i < n; i++) {
            const unsigned char c = (unsigned char)want[i];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                 c == '_' || c == ',' || c == ' ';
        }
        if (ok) snprintf(allow_headers + 27, sizeof allow_headers - 27, ", %s", want);
    }
    struct MHD_Response *res = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(res, "Access-Control-Allow-Headers", allow_headers);
    MHD_add_response_header(res, "Access-Control-Max-Age", "86400");
    enum MHD_Result rc = queue(k, 204, res);
    MHD_destroy_response(res);
    return rc;
}

static enum MHD_Result on_head(conn *k, const char *url, const char *method, int ep, const char *allow)
{
    srv_server *s = k->s;
    if (k->nul_in_path) return err_reply(k, 400, "invalid_request", "the path holds a NUL byte (%00)");
    const int is_preflight = ep == EP_PREFLIGHT;
    if (!ep && !allow) {
        char msg[160];
        snprintf(msg, sizeof msg, "no endpoint %.100s", url);
        return err_reply(k, 404, "not_found", msg);
    }
    if (allow) {
        char msg[128];
        snprintf(msg, sizeof msg, "%.60s takes %s, not %.16s", url, allow, method);
        char *b = err_json(405, "method_not_allowed", msg);
        struct MHD_Response *res;
        if (!b || !(res = MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE))) {
            free(b);
            return MHD_NO;
        }
        char allow_opts[32];
        snprintf(allow_opts, sizeof allow_opts, "%s, OPTIONS", allow);
        MHD_add_response_header(res, "Content-Type", "application/json");
        MHD_add_response_header(res, "Allow", allow_opts);
        enum MHD_Result rc = queue(k, 405, res);
        MHD_destroy_response(res);
        return rc;
    }
    /* past the connection limits: a 503 the client can act on, while
     * libmicrohttpd's own (higher) limit would only reset the connection */
    int n_socks = 0, from_addr = 0;
    const union MHD_ConnectionInfo *si = MHD_get_connection_info(k->mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const srv_sock *me = si ? si->socket_context : NULL;
    pthread_mutex_lock(&s->lock);
    n_socks = s->n_socks;
    if (me && s->cfg.max_conns_per_ip > 0)
        for (const srv_sock *o = s->socks; o; o = o->next) from_addr += o->addr == me->addr;
    pthread_mutex_unlock(&s->lock);
    if (n_socks > s->cfg.max_conns || (s->cfg.max_conns_per_ip > 0 && from_addr > s->cfg.max_conns_per_ip))
        return err_reply(k, 503, "too_many_connections",
                         n_socks > s->cfg.max_conns ? "too many open connections; retry later"
                                                    : "too many open connections from your address; retry later");
    if (is_preflight) return preflight(k);
    /* the page itself holds no secret: it asks for the key the API wants */
    if (ep != EP_HEALTH && ep != EP_PAGE && !authorised(k->mc, s))
        return err_reply(k, 401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)");
    const char *cl = MHD_lookup_connection_value(k->mc, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) k->too_large = 1;
    if (k->too_large) return body_too_large(k);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv_server *s = cls;
    conn *k = *con_cls;
    if (!k) { /* on_uri could not allocate */
        if (!(k = conn_new(s))) return MHD_NO;
        *con_cls = k;
    }
    k->mc = c;
    static const struct { const char *path, *method; int ep; } routes[] = {
        { "/v1/completions", "POST", EP_COMPLETIONS }, { "/v1/chat/completions", "POST", EP_CHAT },
        { "/v1/models", "GET", EP_MODELS }, { "/health", "GET", EP_HEALTH }, { "/metrics", "GET", EP_METRICS },
        { "/tokenize", "POST", EP_TOKENIZE }, { "/detokenize", "POST", EP_DETOKENIZE },
        { "/completions", "POST", EP_COMPLETIONS }, { "/chat/completions", "POST", EP_CHAT },
        { "/models", "GET", EP_MODELS }, { "/", "GET", EP_PAGE }, { "/index.html", "GET", EP_PAGE },
        { "/props", "GET", EP_PROPS }, { "/v1/embeddings", "POST", EP_EMBEDDINGS },
        { "/embeddings", "POST", EP_EMBEDDINGS }, { "/slots", "GET", EP_SLOTS },
    };
    int ep = EP_NONE;
    const char *allow = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !ep && !allow; i++) {
        if (strcmp(url, routes[i].path) != 0) continue;
        if (!strcmp(method, "OPTIONS")) ep = EP_PREFLIGHT;
        else if (strcmp(method, routes[i].method) != 0) allow = routes[i].method;
        else ep = routes[i].ep;
    }
    if (!ep && !allow && !strncmp(url, "/slots/", 7)) { /* /slots/ID?action=... */
        if (!strcmp(method, "OPTIONS")) ep = EP_PREFLIGHT;
        else if (strcmp(method, "POST") != 0) allow = "POST";
        else ep = EP_SLOT_ACTION;
    }
    if (!k->started) {
        k->started = 1;
        /* A NUL byte sent as is: libmicrohttpd 0.9.75 parses the request
         * line in place, the target from url up to the NUL it wrote over
         * the space before the version, so a target that ends (as a C
         * string) before that NUL held one. Checked only when the pointers
         * show that layout; otherwise nothing is concluded. */
        if (k->raw_uri == url && version > url && (size_t)(version - url) < ((size_t)1 << 20) &&
            (size_t)(version - url) > k->raw_len + 1)
            k->nul_in_path = 1;
        /* the log names the route, never the client's own path */
        snprintf(k->route, sizeof k->route, "%s", ep || allow ? url : "-");
        snprintf(k->method, sizeof k->method, "%s", method);
        for (char *m = k->method; *m; m++)
            if (*m < 'A' || *m > 'Z') *m = '?';
        return on_head(k, url, method, ep, allow);
    }
    if (*upload_size) {
        if (!k->too_large && k->body.len + *upload_size > s->cfg.max_body) k->too_large = 1;
        if (!k->too_large && text_append(&k->body, upload, *upload_size)) k->too_large = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->too_large) return body_too_large(k); /* a chunked body without a Content-Length */
    sock_reading(k, 0); /* all of it is in: the read deadline no longer applies */
    /* the watchdog cut it as its last bytes came in: it is logged as cut,
     * and must not go on to be served into a closed socket (and then be
     * counted as a client's cancellation) */
    if (k->cut) return MHD_NO;
    switch (ep) {
    case EP_COMPLETIONS: return handle_generate(k, 0);
    case EP_CHAT: return handle_generate(k, 1);
    case EP_MODELS: return handle_models(k);
    case EP_HEALTH: return reply(k, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL, NULL);
    case EP_METRICS: return handle_metrics(k);
    case EP_TOKENIZE: return handle_tokenize(k, 0);
    case EP_DETOKENIZE: return handle_tokenize(k, 1);
    case EP_PAGE: return handle_page(k);
    case EP_PROPS: return handle_props(k);
    case EP_EMBEDDINGS: return handle_embeddings(k);
    case EP_SLOTS: return handle_slots(k);
    case EP_SLOT_ACTION: return handle_slot_action(k, url);
    default: return MHD_YES; /* a preflight: answered from its head */
    }
}

/* A request's one log line, on stderr when it ends, whatever its outcome:
 * what it was, its status, tokens in and out, its time, and why it ended
 * early if it did. A response never queued (the client left, or the
 * scheduler's answer came after it did) is logged as 499, nginx's status
 * for a client that closed first; a head libmicrohttpd refused before our
 * handler saw it (over-size headers: its own 431) as status 0, bad_head. */
static void log_request(const conn *k, enum MHD_RequestTerminationCode why)
{
    const srv_request *r = k->r;
    const char *cancel = NULL;
    int status = k->status, n_gen = 0;
    /* the choices of one request: a failure explains their end before a
     * cancellation does (a failed choice cancels the others) */
    for (int i = 0; i < k->n_rs; i++) {
        const srv_request *c = k->rs[i];
        n_gen += c->n_gen;
        if (c->cancelled && !cancel) cancel = "client_closed";
    }
    for (int i = 0; i < k->n_rs; i++) {
        if (k->rs[i]->err_status == 504) cancel = "timeout";
        else if (k->rs[i]->err_status == 503) cancel = "shutdown"; /* admitted, then the server stopped */
    }
    if (why != MHD_REQUEST_TERMINATED_COMPLETED_OK && !cancel)
        cancel = why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? "idle_timeout"
                 : why == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? "shutdown" : "client_closed";
    if (k->cut) cancel = "read_timeout";
    else if (!k->started) cancel = "bad_head"; /* status 0: libmicrohttpd answered (431, ...) or closed */
    else if (!status) status = 499;
    char line[384];
    const int n = snprintf(line, sizeof line,
                           "serve: request id=%llu%s%s method=%s route=%s status=%d tokens_in=%d tokens_out=%d "
                           "ms=%.1f%s%s\n",
                           k->seq, k->id[0] ? " completion=" : "", k->id, k->method[0] ? k->method : "-",
                           k->route[0] ? k->route : "-", status, r ? r->n_prompt : 0, n_gen,
                           (srv_now() - k->t0) * 1000.0, cancel ? " cancel=" : "", cancel ? cancel : "");
    if (n > 0) fputs(line, stderr); /* one write: lines of concurrent requests do not interleave */
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    srv_server *s = cls;
    conn *k = *con_cls;
    if (!k) return;
    k->mc = c;
    sock_reading(k, 1); /* a kept-alive connection waits for its next request: on the clock again */
    if (k->r) {
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < k->n_rs; i++)
            if (k->rs[i]->state != REQ_DONE) { /* the client left before the end */
                k->rs[i]->cancelled = 1;
                pthread_cond_signal(&s->wake_sched);
            }
        log_request(k, why);
        for (int i = 0; i < k->n_rs; i++) srv_request_release(k->rs[i]);
        s->n_attached--;
        pthread_cond_broadcast(&s->progress);
        pthread_mutex_unlock(&s->lock);
    } else {
        log_request(k, why); /* no generation: another endpoint, a refused head, or one libmicrohttpd refused */
    }
    free(k->body.data);
    free(k->out);
    free(k);
    *con_cls = NULL;
}

/* Called once the request line has arrived, before the headers: the raw
 * path, before libmicrohttpd decodes it into the C string the handler
 * sees, where "/health%00x" would end at the NUL and pass as "/health".
 * The conn made here is the request's *con_cls from the start. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)c;
    conn *k = conn_new(cls);
    if (!k) return NULL;
    const char *q = strchr(uri, '?');
    const size_t path_len = q ? (size_t)(q - uri) : strlen(uri);
    for (size_t i = 0; i + 2 < path_len; i++)
        if (uri[i] == '%' && uri[i + 1] == '0' && uri[i + 2] == '0') k->nul_in_path = 1;
    k->raw_uri = uri;
    k->raw_len = strlen(uri);
    return k;
}

/* ---- life cycle ------------------------------------------------------------------------------ */

srv_server *srv_start(sparq_model *m, const srv_config *cfg, char *err, size_t err_size)
{
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(err, err_size, "serve: out of memory");
        return NULL;
    }
    s->model = m;
    s->cfg = *cfg;
    s->n_vocab = sparq_model_n_vocab(m);
    s->t_start = srv_now();
    if (s->cfg.n_ctx <= 0) s->cfg.n_ctx = sparq_model_n_ctx_train(m);
    if (s->cfg.max_prompt <= 0 || s->cfg.max_prompt > s->cfg.n_ctx - 1) s->cfg.max_prompt = (int)(s->cfg.n_ctx - 1);
    if (s->cfg.max_conns <= 0) s->cfg.max_conns = cfg->parallel + cfg->queue + 64;
    if (s->cfg.max_conns_per_ip < 0) s->cfg.max_conns_per_ip = 0;
    if (!(s->cfg.read_timeout > 0)) s->cfg.read_timeout = 30;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake_sched, NULL);
    pthread_cond_init(&s->progress, NULL);
    pthread_cond_init(&s->wake_watchdog, NULL);
    s->slot_pub = calloc((size_t)(cfg->parallel > 0 ? cfg->parallel : 1), sizeof *s->slot_pub);
    if (!s->slot_pub || pthread_create(&s->sched, NULL, srv_sched_main, s) != 0) {
        err_set(err, err_size, "serve: cannot start the scheduler thread");
        srv_stop(s, 0);
        return NULL;
    }
    s->sched_started = 1;
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
        err_set(err, err_size, "serve: cannot start the watchdog thread");
        srv_stop(s, 0);
        return NULL;
    }
    s->watchdog_started = 1;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)cfg->port);
    if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) {
        err_set(err, err_size, "serve: --host '%s' is not an IPv4 address", cfg->host);
        srv_stop(s, 0);
        return NULL;
    }
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL,
                                 (uint16_t)cfg->port, NULL, NULL, on_request, s,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                 /* beyond ours, so a client past ours gets a 503, not a reset */
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->cfg.max_conns + 32),
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                 (unsigned)(s->cfg.max_conns_per_ip ? s->cfg.max_conns_per_ip + 8 : 0),
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)256 * 1024,
                                 MHD_OPTION_END);
    if (!s->daemon) {
        err_set(err, err_size, "serve: cannot listen on %s:%d (%s)", cfg->host, cfg->port, strerror(errno));
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
    pthread_cond_signal(&s->wake_watchdog);
    pthread_mutex_unlock(&s->lock);
    if (s->sched_started) pthread_join(s->sched, NULL);
    if (s->watchdog_started) pthread_join(s->watchdog, NULL);
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
    pthread_cond_destroy(&s->wake_watchdog);
    pthread_mutex_destroy(&s->lock);
    free(s->slot_pub);
    free(s);
}
