/* slots.c - llama-server's slot endpoints for `sparq serve`:
 *
 *   GET  /slots                         each slot: id, id_task, n_ctx,
 *                                       is_processing, params, next_token
 *   POST /slots/ID?action=save          {"filename": F}: the slot's cache
 *                                       (the last request's prompt and
 *                                       reply) to the KV file F in
 *                                       --slot-save-path
 *   POST /slots/ID?action=restore       {"filename": F}: that file becomes
 *                                       the slot's cache: the next request
 *                                       starting with its tokens goes to
 *                                       this slot and prefills only the rest
 *   POST /slots/ID?action=erase         drops the slot's cache
 *
 * The files are sparq KV files (docs/KVFILE.md) holding the token ids, not
 * llama.cpp states: `sparq import` converts llama-server's. A file name is
 * one plain name inside --slot-save-path (no '/', no "..", no control
 * bytes), so a client cannot reach another directory. The HTTP thread
 * validates and queues an action, the scheduler (which owns every cache)
 * runs it when the slot is idle, and the HTTP thread answers.
 */
#include "server/srv_internal.h"
#include "core/model.h"
#include "io/kvfile.h"
#include "util/err.h"
#include "util/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- GET /slots ---------------------------------------------------------------- */

static void write_slot(FILE *f, const srv_server *s, int i, const srv_slot_pub *p)
{
    const srv_request *r = p->r;
    sparq_sampler_params dp = sparq_sampler_default_params();
    const int used = p->used;
    const int n_gen = r ? r->n_gen : p->n_decoded;
    const int max_tokens = used ? p->max_tokens : -1;
    int nl = 0;
    if (r) nl = r->text.len && memchr(r->text.data, '\n', r->text.len) != NULL;
    fprintf(f, "%s{\"id\":%d,\"id_task\":%lld,\"n_ctx\":%lld,\"speculative\":false,\"is_processing\":%s,", i ? "," : "",
            i, used ? (long long)p->id_task : -1LL, (long long)s->cfg.n_ctx, r ? "true" : "false");
    fprintf(f,
            "\"params\":{\"n_predict\":%d,\"seed\":%llu,\"temperature\":%.9g,\"top_k\":%d,\"top_p\":%.9g,"
            "\"min_p\":%.9g,\"repeat_last_n\":-1,\"repeat_penalty\":%.9g,\"presence_penalty\":%.9g,"
            "\"frequency_penalty\":%.9g,\"max_tokens\":%d,\"n_keep\":0,\"n_discard\":0,\"ignore_eos\":%s,"
            "\"stream\":%s,\"n_probs\":%d,\"min_keep\":0,",
            max_tokens, (unsigned long long)(used ? p->seed : dp.seed), used ? p->temp : dp.temp,
            used ? p->top_k : dp.top_k, used ? p->top_p : dp.top_p, used ? p->min_p : dp.min_p,
            used ? p->rep_pen : dp.repeat_penalty, used ? p->pres_pen : dp.presence_penalty,
            used ? p->freq_pen : dp.frequency_penalty, max_tokens, used && p->ignore_eos ? "true" : "false",
            used && p->stream ? "true" : "false", used && p->n_probs > 0 ? p->n_probs : 0);
    fputs("\"stop\":[", f);
    for (int k = 0; r && k < r->n_stops; k++) {
        if (k) fputc(',', f);
        json_write_str(f, r->stops[k], strlen(r->stops[k]));
    }
    /* the sampler's order (sparq.h): bias, penalties, min-p, temperature, top-k, top-p */
    fputs("],\"samplers\":[\"logit_bias\",\"penalties\",\"min_p\",\"temperature\",\"top_k\",\"top_p\"]},", f);
    fprintf(f, "\"next_token\":{\"has_next_token\":%s,\"has_new_line\":%s,\"n_remain\":%d,\"n_decoded\":%d},",
            r ? "true" : "false", nl ? "true" : "false", r ? r->max_tokens - n_gen : -1, n_gen);
    fprintf(f, "\"sparq\":{\"n_cache\":%d", p->n_cache);
    if (r) {
        fputs(",\"attn\":", f);
        json_write_str(f, r->policy, strlen(r->policy));
    }
    fputs("}}", f);
}

char *srv_slots_json(srv_server *s, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    fputc('[', f);
    pthread_mutex_lock(&s->lock);
    for (int i = 0; s->slot_pub && i < s->cfg.parallel; i++) write_slot(f, s, i, &s->slot_pub[i]);
    pthread_mutex_unlock(&s->lock);
    fputc(']', f);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- POST /slots/ID?action=... --------------------------------------------------- */

/* A plain file name: 1..255 bytes, none of them '/', '\\' or a control
 * byte, no "..", not "." (so it names an entry of the directory itself). */
static int name_ok(const char *name, size_t n, char *err, size_t err_size)
{
    if (n == 0 || n > 255) {
        err_set(err, err_size, "\"filename\" must have 1 to 255 bytes, not %zu", n);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)name[i];
        if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) {
            err_set(err, err_size, "\"filename\" must be a plain file name: no '/', '\\\\' or control characters");
            return 0;
        }
    }
    if (strstr(name, "..") || !strcmp(name, ".")) {
        err_set(err, err_size, "\"filename\" must be a plain file name: no \"..\"");
        return 0;
    }
    return 1;
}

/* The slot number of id ("0", "12"): 0.. parallel-1, or -1. */
static int slot_id(const srv_server *s, const char *id)
{
    if (!id || !id[0] || strlen(id) > 9 || strspn(id, "0123456789") != strlen(id)) return -1;
    const long v = strtol(id, NULL, 10);
    return v < s->cfg.parallel ? (int)v : -1;
}

/* Queues a (lock not held), waits for the scheduler to finish it or for
 * the request's time limit; returns 0, or -1 if it never started (a 503
 * or 504 in a->status). */
static int run_action(srv_server *s, srv_slot_action *a)
{
    const double deadline = srv_now() + (s->cfg.timeout > 0 ? s->cfg.timeout : 600);
    pthread_mutex_lock(&s->lock);
    if (s->stopping) {
        pthread_mutex_unlock(&s->lock);
        a->status = 503;
        snprintf(a->error, sizeof a->error, "the server is shutting down");
        return -1;
    }
    srv_slot_action **tail = &s->actions;
    while (*tail) tail = &(*tail)->next;
    a->next = NULL;
    *tail = a;
    pthread_cond_signal(&s->wake_sched);
    while (!a->done) {
        /* a slot that stays busy past the limit: the action is withdrawn
         * unless the scheduler has it already (then it finishes soon) */
        if (!a->started && (srv_now() > deadline || s->stopping)) {
            for (srv_slot_action **p = &s->actions; *p; p = &(*p)->next)
                if (*p == a) {
                    *p = a->next;
                    break;
                }
            a->status = s->stopping ? 503 : 504;
            snprintf(a->error, sizeof a->error, "%s", s->stopping ? "the server is shutting down"
                                                                  : "the slot stayed busy past the time limit");
            pthread_mutex_unlock(&s->lock);
            return -1;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->progress, &s->lock, &ts);
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int srv_slot_request(srv_server *s, const char *id, const char *action, const char *body, size_t len, char **out,
                    size_t *out_len, const char **code, char *err, size_t err_size)
{
    static const char *const kinds[] = { [SLOT_SAVE] = "save", [SLOT_RESTORE] = "restore", [SLOT_ERASE] = "erase" };
    *code = "invalid_request";
    int kind = -1;
    for (int k = 0; action && k < 3; k++)
        if (!strcmp(action, kinds[k])) kind = k;
    if (kind < 0) {
        err_set(err, err_size, "?action= must be save, restore or erase");
        return 400;
    }
    const int slot = slot_id(s, id);
    if (slot < 0) {
        err_set(err, err_size, "no slot '%.40s': slots are 0 to %d", id ? id : "", s->cfg.parallel - 1);
        return 400;
    }
    if (kind != SLOT_ERASE && !s->cfg.slot_save_path) {
        *code = "not_supported";
        err_set(err, err_size, "this server does not save slots: start it with --slot-save-path DIR");
        return 501;
    }
    srv_slot_action *a = calloc(1, sizeof *a);
    if (!a) {
        err_set(err, err_size, "out of memory");
        return 500;
    }
    a->kind = kind;
    a->slot = slot;
    char name[256] = "";
    if (kind != SLOT_ERASE) {
        json_doc *d = json_parse(body ? body : "", len, 8, err, err_size);
        const json_value *root = d ? json_root(d) : NULL;
        const json_value *fn = root ? json_get(root, "filename") : NULL;
        size_t n = 0;
        const char *str = json_str(fn, &n);
        int ok = d != NULL;
        if (ok && root->type != JSON_OBJECT) {
            err_set(err, err_size, "the body must be a JSON object {\"filename\": NAME}");
            ok = 0;
        } else if (ok && !str) {
            err_set(err, err_size, fn ? "\"filename\" must be a string" : "\"filename\" is required");
            ok = 0;
        } else if (ok) {
            ok = name_ok(str, n, err, err_size); /* a NUL inside is a control byte */
        }
        if (ok) {
            memcpy(name, str, n + 1);
            snprintf(a->path, sizeof a->path, "%s/%s", s->cfg.slot_save_path, name);
        }
        json_free(d);
        if (!ok) {
            free(a);
            return 400;
        }
    }
    const double t0 = srv_now();
    run_action(s, a);
    const double ms = (srv_now() - t0) * 1e3;
    const int status = a->status;
    if (status != 200) {
        err_set(err, err_size, "%s", a->error);
        *code = status == 404 ? "file_not_found" : status == 503 ? "shutting_down" : status == 504 ? "timeout"
                : status >= 500 ? "slot_file_error" : "invalid_request";
        free(a);
        return status;
    }
    char *buf = NULL;
    FILE *f = open_memstream(&buf, out_len);
    if (!f) {
        free(a);
        err_set(err, err_size, "out of memory");
        return 500;
    }
    fprintf(f, "{\"id_slot\":%d,", slot);
    if (kind == SLOT_ERASE) {
        fprintf(f, "\"n_erased\":%lld}", (long long)a->n_tokens);
    } else {
        fputs("\"filename\":", f);
        json_write_str(f, name, strlen(name));
        if (kind == SLOT_SAVE)
            fprintf(f, ",\"n_saved\":%lld,\"n_written\":%lld,\"timings\":{\"save_ms\":%.3f}}", (long long)a->n_tokens,
                    (long long)a->bytes, ms);
        else
            fprintf(f, ",\"n_restored\":%lld,\"n_read\":%lld,\"timings\":{\"restore_ms\":%.3f}}", (long long)a->n_tokens,
                    (long long)a->bytes, ms);
    }
    free(a);
    if (fclose(f)) {
        free(buf);
        err_set(err, err_size, "out of memory");
        return 500;
    }
    *out = buf;
    return 200;
}

/* ---- the scheduler's side ------------------------------------------------------ */

sparq_context *srv_slot_load(srv_server *s, const char *path, int32_t **ids, int *n, int *status, char *err,
                             size_t err_size)
{
    *ids = NULL;
    *n = 0;
    *status = 400;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    /* only a regular file: a FIFO would block the scheduler, a symlink
     * could lead out of the directory */
    struct stat st;
    if (lstat(path, &st) != 0) {
        *status = errno == ENOENT ? 404 : 400;
        err_set(err, err_size, "no slot file '%s'%s%s", name, errno == ENOENT ? "" : ": ",
                errno == ENOENT ? "" : strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        err_set(err, err_size, "'%s' is not a regular file", name);
        return NULL;
    }
    kvf_fingerprint fp;
    model_fingerprint(s->model, &fp);
    kvf_file *kf = NULL;
    char msg[256];
    if (kvf_open(path, &fp, KVF_VERIFY_ALWAYS, &kf, msg, sizeof msg)) {
        err_set(err, err_size, "'%s' is no KV file of this model: %s", name, msg);
        return NULL;
    }
    const int64_t nt = kf->n_tokens;
    if (nt <= 0 || nt > s->cfg.n_ctx || !kf->tokens) {
        err_set(err, err_size, "'%s' holds %s (the context is %lld)", name,
                nt <= 0 || !kf->tokens ? "no token ids" : "more positions than a slot's context", (long long)s->cfg.n_ctx);
        kvf_close(kf);
        return NULL;
    }
    *ids = malloc((size_t)nt * sizeof **ids);
    if (*ids) memcpy(*ids, kf->tokens, (size_t)nt * sizeof **ids);
    kvf_close(kf);
    if (!*ids) {
        *status = 500;
        err_set(err, err_size, "out of memory");
        return NULL;
    }
    /* mapped, then copied into memory: the slot keeps no mapping of a file
     * that a later save may replace */
    sparq_context_params cp = sparq_context_default_params();
    cp.n_threads = 1;
    sparq_context *f = NULL, *c = NULL;
    if (sparq_context_load_kv(s->model, &cp, path, SPARQ_VERIFY_ALWAYS, &f, msg, sizeof msg) == 0) {
        cp.n_ctx = nt;
        cp.kv_type = s->cfg.kv_type;
        if (sparq_context_pos(f) != nt)
            snprintf(msg, sizeof msg, "it caches %lld positions for %lld token ids", (long long)sparq_context_pos(f),
                     (long long)nt);
        else if (sparq_context_create(s->model, &cp, &c, msg, sizeof msg) == 0 &&
                 sparq_context_copy_prefix(c, f, nt, msg, sizeof msg) != 0) {
            sparq_context_free(c);
            c = NULL;
        }
    }
    sparq_context_free(f);
    if (!c) {
        err_set(err, err_size, "cannot restore '%s': %s", name, msg);
        free(*ids);
        *ids = NULL;
        return NULL;
    }
    *n = (int)nt;
    *status = 200;
    return c;
}
