/* sched.c - the scheduler thread of `sparq serve`: continuous batching.
 *
 * Each round: drop cancelled or timed-out sequences, admit queued requests
 * into free slots (a fresh context each, with the request's attention
 * policy), run one prefill chunk of the oldest admitted sequence still
 * prefilling (first come, first served, as llama-server), then sample
 * one token for every sequence whose logits are ready and decode all of
 * them in one sparq_decode_batch step. Prefill chunks are the context's
 * n_batch tokens from the start of the prompt whatever the load, and the
 * batched step is batch-invariant, so each request's tokens are exactly
 * what `sparq run` gives for the same prompt, policy and sampling.
 *
 * Map (what a sequence does is seq.c's; the caches are prefix_cache.c's
 * and, on disk, kvdir.c's, written by kv_writer.c):
 *   slot_pick / slot_publish  --slot-save-path: a request goes to the free
 *                      slot whose kept cache it continues; GET /slots
 *   slot_actions_run   /slots/ID?action=save|restore|erase (slots.c) on an
 *                      idle slot's kept cache
 *   wait_target        in-flight sharing: a queued request waits for the
 *                      sequence prefilling its prefix (pc_serve_waiters)
 *   gate_*             the tests' prefill gate
 *   srv_sched_main     the loop: sched_reap, sched_admit (lock held), then
 *                      sched_start, sched_prefill, sched_decode
 */
#include "server/srv_internal.h"
#include "server/kv_writer.h"
#include "server/prefix_cache.h"
#include "server/seq.h"
#include "util/err.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int srv_submit(srv_server *s, srv_request *r)
{
    /* queued or admitted but not yet counted active: all wait for a slot */
    if (s->stopping || s->n_queued + s->n_active >= s->cfg.parallel + s->cfg.queue) return -1;
    r->refs++;
    r->state = REQ_QUEUED;
    r->next = NULL;
    if (s->queue_tail) s->queue_tail->next = r;
    else s->queue_head = r;
    s->queue_tail = r;
    s->n_queued++;
    pthread_cond_signal(&s->wake_sched);
    return 0;
}

/* ---- slots (--slot-save-path) -------------------------------------------- */

/* The free slot for r (one is free): the one whose kept cache gives it the
 * longest start (a restored slot), else the first that keeps none, else
 * the first free one (as llama-server, by prompt similarity). */
static int slot_pick(const slot *slots, int P, const srv_request *r, int nb)
{
    int best = -1, best_use = 0, empty = -1, first = -1;
    for (int i = 0; i < P; i++) {
        if (slots[i].r) continue;
        if (first < 0) first = i;
        if (!slots[i].kept && empty < 0) empty = i;
        const int u = kept_use(&slots[i], r, nb);
        if (u > best_use) {
            best_use = u;
            best = i;
        }
    }
    return best >= 0 ? best : empty >= 0 ? empty : first;
}

/* What GET /slots shows of the request admitted into slot i. Lock held. */
static void slot_publish(srv_server *s, int i, const srv_request *r, uint64_t task)
{
    if (!s->slot_pub) return;
    srv_slot_pub *p = &s->slot_pub[i];
    const int n_cache = p->n_cache;
    memset(p, 0, sizeof *p);
    p->r = r;
    p->used = 1;
    p->id_task = task;
    p->temp = r->temp;
    p->top_p = r->top_p;
    p->min_p = r->min_p;
    p->rep_pen = r->rep_pen;
    p->pres_pen = r->pres_pen;
    p->freq_pen = r->freq_pen;
    p->top_k = r->top_k;
    p->max_tokens = r->max_tokens;
    p->ignore_eos = r->ignore_eos;
    p->stream = r->stream;
    p->n_probs = r->logprobs;
    p->seed = r->seed;
    p->n_cache = n_cache;
}

/* Runs one slot action on the idle slot sl (lock not held); the result
 * goes into a (under the lock, by the caller). */
static void slot_action_exec(srv_server *s, slot *sl, srv_slot_action *a, int *status, char *err, size_t err_size,
                             int64_t *n_tokens, int64_t *bytes)
{
    *status = 200;
    *n_tokens = 0;
    *bytes = 0;
    err[0] = 0;
    if (a->kind == SLOT_ERASE) {
        *n_tokens = sl->n_kept;
        slot_drop_kept(sl);
    } else if (a->kind == SLOT_SAVE) {
        struct stat st;
        if (!sl->kept || sl->n_kept <= 0) {
            *status = 400;
            err_set(err, err_size, "slot %d holds no cache to save (no request has run there since it was "
                    "erased or the server started)", a->slot);
        } else if (sparq_context_save_kv(sl->kept, a->path, NULL, sl->kept_ids, sl->n_kept, err, err_size)) {
            *status = 500;
        } else {
            *n_tokens = sl->n_kept;
            *bytes = stat(a->path, &st) == 0 ? (int64_t)st.st_size : 0;
        }
    } else {
        int32_t *ids = NULL;
        int n = 0;
        sparq_context *c = srv_slot_load(s, a->path, &ids, &n, status, err, err_size);
        if (c) {
            struct stat st;
            slot_drop_kept(sl);
            sl->kept = c;
            sl->kept_ids = ids;
            sl->n_kept = n;
            *n_tokens = n;
            *bytes = stat(a->path, &st) == 0 ? (int64_t)st.st_size : 0;
        }
    }
}

/* Runs the queued slot actions whose slot is idle; an action on a busy slot
 * waits for it. Lock held; dropped while an action runs. */
static void slot_actions_run(srv_server *s, slot *slots)
{
    for (;;) {
        srv_slot_action *a = s->actions, **link = &s->actions;
        while (a && slots[a->slot].r) {
            link = &a->next;
            a = a->next;
        }
        if (!a) return;
        *link = a->next; /* out of the queue: the HTTP thread waits on done */
        a->started = 1;
        pthread_mutex_unlock(&s->lock);
        char err[sizeof a->error];
        int status;
        int64_t n_tokens, bytes;
        slot_action_exec(s, &slots[a->slot], a, &status, err, sizeof err, &n_tokens, &bytes);
        pthread_mutex_lock(&s->lock);
        s->slot_pub[a->slot].n_cache = slots[a->slot].n_kept;
        a->status = status;
        a->n_tokens = n_tokens;
        a->bytes = bytes;
        snprintf(a->error, sizeof a->error, "%s", err);
        a->done = 1;
        pthread_cond_broadcast(&s->progress);
    }
}

/* In-flight sharing: the running sequence whose prompt shares a longer
 * prefix with r's (at a multiple of n_batch) than the cache holds, or -1;
 * *want is that prefix's length. While the sequence is still prefilling
 * it, r waits in the queue; once it has (fed >= want), pc_serve_waiters
 * puts those positions into the cache and r maps them: concurrent requests
 * about one document prefill it once, whatever their questions. A decoding
 * sequence still holds its prompt's positions as prefilled (the server
 * never shifts a context). Lock held (reads the slots' requests; slots are
 * the scheduler's). */
static int wait_target(const prefix_cache *pc, const slot *slots, int P, const srv_request *r, int *want)
{
    *want = 0;
    if (!pc->budget || !req_shares(r)) return -1;
    int best = -1, have;
    pc_find(pc, r->prompt, r->n_prompt, &have);
    *want = have;
    for (int j = 0; j < P; j++) {
        const slot *sl = &slots[j];
        if (!sl->r || sl->r->state == REQ_DONE || sl->r->cancelled) continue;
        const int lim = r->n_prompt - 1 < sl->r->n_prompt ? r->n_prompt - 1 : sl->r->n_prompt;
        const int w = pc_common_len(r->prompt, sl->r->prompt, lim) / pc->nb * pc->nb;
        if (w > *want) {
            *want = w;
            best = j;
        }
    }
    return best;
}

/* Puts into the cache what waiting requests wait for once their sequence
 * has prefilled it. Called with the lock held; drops it while copying. */
static void pc_serve_waiters(srv_server *s, prefix_cache *pc, slot *slots, int P)
{
    enum { MAX_PENDING = 16 };
    int pj[MAX_PENDING], pw[MAX_PENDING], np = 0;
    for (const srv_request *r = s->queue_head; r && np < MAX_PENDING; r = r->next) {
        int want;
        const int j = wait_target(pc, slots, P, r, &want);
        if (j < 0 || !slots[j].c || slots[j].fed < want) continue;
        int dup = 0;
        for (int k = 0; k < np; k++) dup |= pj[k] == j && pw[k] == want;
        if (!dup) {
            pj[np] = j;
            pw[np++] = want;
        }
    }
    if (!np) return;
    pthread_mutex_unlock(&s->lock);
    for (int k = 0; k < np; k++)
        pc_insert(s, pc, slots[pj[k]].c, slots[pj[k]].r->prompt, pw[k], sparq_context_n_ctx(slots[pj[k]].c), NULL);
    pthread_mutex_lock(&s->lock);
}

/* ---- the loop ---------------------------------------------------------------- */

/* The tests' prefill gate (srv_config.prefill_gate): the FIFO's read end,
 * opened without waiting for a writer, or -1. */
static int gate_open(const char *path)
{
    if (!path) return -1;
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fcntl(fd, F_SETFL, 0) < 0) { /* blocking reads from here on */
        fprintf(stderr, "serve: prefill gate %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Before a prefill chunk or a decode step: one byte from the gate while a
 * writer holds it open (bytes written before are used first); none while
 * no writer does (end of file), so a test can shut it again by opening it.
 * A read error drops the gate. */
static void gate_pass(int *fd)
{
    if (*fd < 0) return;
    char b;
    ssize_t got;
    do got = read(*fd, &b, 1);
    while (got < 0 && errno == EINTR);
    if (got < 0) {
        close(*fd);
        *fd = -1;
    }
}

/* What the loop owns: the slots, the batched step's buffers, the caches. */
typedef struct sched {
    srv_server     *s;
    int             P, V;
    slot           *slots;       /* [P]                                      */
    float          *blogits;     /* [P][V] a batched step's logits           */
    sparq_context **bc;          /* [P] a batched step's contexts            */
    int32_t        *btok;        /* [P] its tokens                           */
    int            *bslot;       /* [P] their slots                          */
    slot          **chunk;       /* [P] the slots of one prefill pass        */
    int             gate;        /* the tests' prefill gate, or -1           */
    uint64_t        n_admitted;
    prefix_cache    pc;
    srv_kvdir       kvd, *kd;    /* kd: &kvd with --kv-dir, else NULL        */
    kv_writer       kvw;
} sched;

/* Allocates what the loop needs; 0, or -1 (out of memory: the loop only
 * answers what is queued). */
static int sched_init(sched *q, srv_server *s)
{
    memset(q, 0, sizeof *q);
    const int P = s->cfg.parallel, V = s->n_vocab;
    q->s = s;
    q->P = P;
    q->V = V;
    q->slots = calloc((size_t)P, sizeof *q->slots);
    q->blogits = malloc((size_t)P * V * sizeof(float));
    q->bc = malloc((size_t)P * sizeof *q->bc);
    q->btok = malloc((size_t)P * sizeof *q->btok);
    q->bslot = malloc((size_t)P * sizeof *q->bslot);
    q->chunk = malloc((size_t)P * sizeof *q->chunk);
    q->gate = gate_open(s->cfg.prefill_gate);
    q->pc.budget = s->cfg.prefix_cache_bytes;
    q->pc.nb = s->cfg.n_batch > 0 ? s->cfg.n_batch : 512;
    if (s->cfg.kv_dir) {
        kvdir_init(&q->kvd, s->cfg.kv_dir, s->cfg.kv_dir_bytes, s->model, s->cfg.kv_type);
        q->kd = &q->kvd;
        kv_writer_start(&q->kvw, s, q->kd);
    }
    if (!q->slots || !q->blogits || !q->bc || !q->btok || !q->bslot || !q->chunk) {
        fprintf(stderr, "serve: out of memory for %d slots\n", P);
        return -1;
    }
    return 0;
}

static void sched_free(sched *q)
{
    if (q->kd) kv_writer_stop(&q->kvw); /* its queued files are written before the server stops */
    for (int i = 0; q->slots && i < q->P; i++) {
        slot_release(q->s, &q->slots[i], i);
        slot_drop_kept(&q->slots[i]);
        slot_drop_spare(&q->slots[i]);
    }
    pc_free(&q->pc);
    free(q->slots);
    free(q->blogits);
    free(q->chunk);
    if (q->gate >= 0) close(q->gate);
    free(q->bc);
    free(q->btok);
    free(q->bslot);
}

/* Ends the sequences cancelled, timed out or cut by a shutdown, and frees
 * the slots of those done. Lock held (dropped while a slot is released).
 * Returns the sequences still running. */
static int sched_reap(sched *q, double now)
{
    srv_server *s = q->s;
    int active = 0;
    for (int i = 0; q->slots && i < q->P; i++) {
        srv_request *r = q->slots[i].r;
        if (!r) continue;
        if (r->state != REQ_DONE) {
            if (s->stopping == 2) slot_finish(s, &q->slots[i], "stop", 503, "the server is shutting down");
            else if (r->cancelled) {
                slot_finish(s, &q->slots[i], "stop", 499, "cancelled");
                s->metrics.cancelled++;
            } else if (now > r->deadline) slot_finish(s, &q->slots[i], "length", 504, "request timed out");
        }
        if (r->state == REQ_DONE) {
            q->slots[i].r = NULL;
            s->n_active--;
            pthread_mutex_unlock(&s->lock);
            slot_release(s, &q->slots[i], i); /* publishes the cache it keeps (n_cache) */
            pthread_mutex_lock(&s->lock);
            /* idle in /slots only now: a client that sees the slot idle sees
             * the cache it kept, not the 0 of the request that took it */
            if (s->slot_pub) {
                s->slot_pub[i].r = NULL;
                s->slot_pub[i].n_decoded = r->n_gen;
            }
            srv_request_release(r);
            continue;
        }
        active++;
    }
    return active;
}

/* Takes r (at prev->next, or the head) out of the queue. Lock held. */
static void queue_unlink(srv_server *s, srv_request *r, srv_request *prev)
{
    if (prev) prev->next = r->next;
    else s->queue_head = r->next;
    if (s->queue_tail == r) s->queue_tail = prev;
    s->n_queued--;
}

/* Admissions, in queue order, into the free slots; a request whose prompt
 * another sequence is prefilling waits for it, the rest go past it; one
 * that left while queued (or waiting) is answered now. Lock held (dropped
 * while waiters' prefixes are cached). Returns the requests admitted. */
static int sched_admit(sched *q, double now)
{
    srv_server *s = q->s;
    if (!q->slots || s->stopping == 2) return 0;
    int n_free = 0, admitted = 0;
    for (int i = 0; i < q->P; i++) n_free += !q->slots[i].r;
    if (n_free && s->queue_head) pc_serve_waiters(s, &q->pc, q->slots, q->P);
    for (srv_request *r = s->queue_head, *prev = NULL, *next; r; r = next) {
        next = r->next;
        const int gone = r->cancelled, late = now > r->deadline;
        int i = -1, want = 0;
        if (!gone && !late) {
            if (!n_free) break;
            i = slot_pick(q->slots, q->P, r, q->pc.nb);
            const int j = wait_target(&q->pc, q->slots, q->P, r, &want);
            if (j >= 0 && q->slots[j].fed < want) {
                if (!r->waited) s->metrics.prefix_waits++;
                r->waited = 1;
                prev = r;
                continue;
            }
        }
        queue_unlink(s, r, prev);
        if (gone || late) {
            r->err_status = gone ? 499 : 504;
            snprintf(r->error, sizeof r->error, "%s", gone ? "cancelled" : "request timed out");
            r->finish = gone ? "stop" : "length";
            r->state = REQ_DONE;
            s->metrics.errors += !gone;
            s->metrics.cancelled += gone;
            srv_request_release(r);
            continue;
        }
        s->n_active++;
        r->state = REQ_RUNNING;
        r->t_admit = now;
        q->slots[i].r = r;
        q->slots[i].admitted = q->n_admitted++;
        slot_publish(s, i, r, q->slots[i].admitted);
        n_free--;
        admitted++;
    }
    return admitted;
}

/* Shutdown: what is still queued is answered 503. Lock held. */
static void sched_drop_queue(srv_server *s)
{
    while (s->queue_head) {
        srv_request *r = s->queue_head;
        queue_unlink(s, r, NULL);
        r->err_status = 503;
        snprintf(r->error, sizeof r->error, "the server is shutting down");
        r->state = REQ_DONE;
        srv_request_release(r);
    }
}

/* New sequences get their context, started from a cached prefix when one
 * fits. Lock not held. */
static void sched_start(sched *q)
{
    srv_server *s = q->s;
    char err[512];
    for (int i = 0; i < q->P; i++) {
        slot *sl = &q->slots[i];
        if (!sl->r || sl->c) continue;
        if (slot_start(s, sl, err, sizeof err)) {
            pthread_mutex_lock(&s->lock);
            slot_finish(s, sl, "stop", 400, err);
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        if (!slot_reuse_kept(s, sl, q->pc.nb)) slot_reuse_prefix(s, &q->pc, q->kd, sl);
        sl->cached = sl->fed;
        if (sl->kept) { /* the slot's cache is this request's from now on */
            slot_drop_kept(sl);
            pthread_mutex_lock(&s->lock);
            s->slot_pub[i].n_cache = 0;
            pthread_mutex_unlock(&s->lock);
        }
    }
}

/* A sequence still prefilling (admitted, with a context, logits not yet
 * ready, not done). */
static int prefilling(const slot *sl)
{
    return sl->r && sl->c && !sl->ready && sl->r->state != REQ_DONE;
}

/* One prefill pass starting with the oldest's chunk: when that is a
 * prompt's one uncached last token (a prefix-cache hit), every other such
 * tail joins it in one pass over the weights instead of one pass each.
 * Returns the pass's result (0 or -1), *n its slots (in q->chunk), *fed
 * the prompt tokens it fed. */
static int prefill_pass(sched *q, slot *oldest, int *n, int *fed)
{
    int nc = 0, rc;
    q->chunk[nc++] = oldest;
    if (slot_tail_batchable(oldest))
        for (int i = 0; i < q->P; i++) {
            slot *sl = &q->slots[i];
            if (sl != oldest && prefilling(sl) && slot_tail_batchable(sl)) q->chunk[nc++] = sl;
        }
    if (nc > 1) {
        rc = slots_prefill_tails(q->s, q->chunk, nc, q->bc, q->btok, q->blogits);
        *fed = rc ? 0 : nc;
    } else {
        const int f = oldest->fed;
        rc = slot_prefill_chunk(q->s, oldest);
        *fed = oldest->fed - f;
    }
    *n = nc;
    return rc;
}

/* After a pass: the prompts it completed go into the prefix cache and
 * --kv-dir (cut at a chunk boundary), and their requests learn they are
 * prefilled (echo publishes the prompt); a failure ends its requests. */
static void prefill_done(sched *q, int nc, int rc, int fed, double t0, double t1)
{
    srv_server *s = q->s;
    const prefix_cache *pc = &q->pc;
    for (int k = 0; k < nc && !rc && (pc->budget || q->kd); k++) {
        slot *sl = q->chunk[k];
        if (!sl->ready) continue;
        const int cut = (sl->r->n_prompt - 1) / pc->nb * pc->nb;
        const char *id = sl->r->prefix_id[0] && req_shares(sl->r) ? sl->r->prefix_id : NULL;
        if (cut > 0 && pc->budget) pc_insert(s, &q->pc, sl->c, sl->r->prompt, cut, sparq_context_n_ctx(sl->c), id);
        if (cut > 0 && q->kd) kv_save_prefix(s, &q->kvw, sl->c, sl->r->prompt, cut, id, sl->id_stale);
    }
    pthread_mutex_lock(&s->lock);
    s->metrics.prefill_tokens += fed;
    s->metrics.prefill_seconds += t1 - t0;
    if (nc > 1 && !rc) s->metrics.tails_batched += nc;
    for (int k = 0; k < nc; k++) {
        slot *sl = q->chunk[k];
        if (rc) slot_finish(s, sl, "stop", 500, sparq_context_error(sl->c));
        else if (sl->ready) {
            sl->r->n_prompt_tokens = sl->r->n_prompt; /* what the request sent, as llama-server counts */
            sl->r->n_cached = sl->cached;
            sl->r->t_prefilled = t1;
            if (sl->r->echo && publish_echo(s, sl)) slot_finish(s, sl, "stop", 500, "out of memory");
        }
    }
    pthread_mutex_unlock(&s->lock);
}

/* Prefill chunks in admission order, oldest first, until this round has
 * fed n_batch tokens (at least one chunk): round robin would hold every
 * first token back until all prompts are nearly done; in admission order
 * the first request answers after its own prefill (the last no later).
 * The budget lets many short chunks (the uncached tails of prompts the
 * prefix cache holds) start together instead of one per decode step,
 * while a long prompt still takes one chunk per step and never stalls the
 * running streams for more than that. A prompt that took several chunks
 * ends the round when it completes, so its first token comes out before
 * anything admitted after it. A chunk's boundaries are the sequence's own
 * (slot_prefill_chunk), so the budget never changes what a sequence
 * computes. Lock not held. */
static void sched_prefill(sched *q)
{
    const int budget = q->s->cfg.n_batch > 0 ? q->s->cfg.n_batch : 512;
    int fed_round = 0;
    for (;;) {
        slot *oldest = NULL;
        for (int i = 0; i < q->P; i++)
            if (prefilling(&q->slots[i]) && (!oldest || q->slots[i].admitted < oldest->admitted)) oldest = &q->slots[i];
        if (!oldest || fed_round >= budget) break;
        gate_pass(&q->gate);
        const double t0 = srv_now();
        int nc, fed;
        const int rc = prefill_pass(q, oldest, &nc, &fed);
        const double t1 = srv_now();
        fed_round += fed;
        /* failed, or a long prompt's last chunk */
        const int end_round = rc || (nc == 1 && oldest->chunks > 1 && oldest->ready);
        prefill_done(q, nc, rc, fed, t0, t1);
        if (end_round) break;
    }
}

/* Samples the next token of ready slot i and publishes it; a sequence that
 * goes on joins the batched step (q->bc/btok/bslot, *nb of them). Lock
 * not held. */
static void sample_one(sched *q, int i, int *nb)
{
    srv_server *s = q->s;
    slot *sl = &q->slots[i];
    srv_request *r = sl->r;
    char piece[256];
    if (r->max_tokens == 0) { /* echo only (loglikelihood scoring) */
        pthread_mutex_lock(&s->lock);
        slot_finish(s, sl, "length", 0, NULL);
        pthread_mutex_unlock(&s->lock);
        return;
    }
    /* the library sampler `sparq run` uses, set up in slot_start */
    const int32_t id = sparq_sample(sl->smp, sl->logits);
    srv_token lp, *lpp = NULL;
    if (r->logprobs >= 0) {
        token_logprobs(sl->logits, q->V, id, r->logprobs, &lp);
        lpp = &lp;
    }
    const int eog = !r->ignore_eos && sparq_token_is_eog(s->model, id);
    int len = eog ? 0 : sparq_token_to_piece(s->model, id, piece, sizeof piece);
    if (len > (int)sizeof piece) len = sizeof piece;
    pthread_mutex_lock(&s->lock);
    if (eog) {
        slot_finish(s, sl, "stop", 0, NULL);
    } else {
        r->n_gen++;
        const int rc = publish_token(sl, id, lpp, piece, len < 0 ? 0 : len);
        if (rc < 0) slot_finish(s, sl, "stop", 500, "out of memory");
        else if (rc > 0) slot_finish(s, sl, "stop", 0, NULL);
        else if (r->n_gen >= r->max_tokens) slot_finish(s, sl, "length", 0, NULL);
        else if (sparq_context_pos(sl->c) >= sparq_context_n_ctx(sl->c)) slot_finish(s, sl, "length", 0, NULL);
        else {
            q->bc[*nb] = sl->c;
            q->btok[*nb] = id;
            q->bslot[(*nb)++] = i;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

/* One token for every ready sequence, then one batched decode step for
 * those that go on. Lock not held. */
static void sched_decode(sched *q)
{
    srv_server *s = q->s;
    int nb = 0;
    for (int i = 0; i < q->P; i++) {
        const slot *sl = &q->slots[i];
        if (sl->r && sl->ready && sl->r->state != REQ_DONE) sample_one(q, i, &nb);
    }
    if (nb == 0) return;
    if (q->gate >= 0) { /* the tokens just sampled go out before the gate holds the step */
        pthread_mutex_lock(&s->lock);
        pthread_cond_broadcast(&s->progress);
        pthread_mutex_unlock(&s->lock);
        gate_pass(&q->gate);
    }
    const double t0 = srv_now();
    const int rc = sparq_decode_batch(q->bc, q->btok, nb, q->blogits);
    const double t1 = srv_now();
    for (int j = 0; j < nb && !rc; j++) {
        memcpy(q->slots[q->bslot[j]].logits, q->blogits + (size_t)j * q->V, (size_t)q->V * sizeof(float));
        slot_hist_push(&q->slots[q->bslot[j]], &q->btok[j], 1);
    }
    pthread_mutex_lock(&s->lock);
    s->metrics.decode_tokens += nb;
    s->metrics.decode_seconds += t1 - t0;
    for (int j = 0; j < nb && rc; j++) slot_finish(s, &q->slots[q->bslot[j]], "stop", 500, sparq_context_error(q->bc[j]));
    pthread_mutex_unlock(&s->lock);
}

/* Slot actions still queued when the server stops are answered 503. Lock
 * held. */
static void sched_drop_actions(srv_server *s)
{
    while (s->actions) {
        srv_slot_action *a = s->actions;
        s->actions = a->next;
        a->status = 503;
        snprintf(a->error, sizeof a->error, "the server is shutting down");
        a->done = 1;
    }
}

/* The loop: under the lock, reap and admit (and run slot actions), then
 * wait if nothing runs; else, without it, start new sequences, prefill,
 * and decode. */
void *srv_sched_main(void *arg)
{
    srv_server *s = arg;
    sched q;
    const int ok = sched_init(&q, s) == 0;
    pthread_mutex_lock(&s->lock);
    if (!ok) s->stopping = 2;
    for (;;) {
        const double now = srv_now();
        int active = sched_reap(&q, now);
        active += sched_admit(&q, now);
        pc_publish(s, &q.pc);
        if (s->stopping == 2) sched_drop_queue(s);
        if (q.slots && s->actions) slot_actions_run(s, q.slots);
        pthread_cond_broadcast(&s->progress);
        if (!active) {
            if (s->stopping) break;
            pthread_cond_wait(&s->wake_sched, &s->lock);
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        sched_start(&q);
        sched_prefill(&q);
        sched_decode(&q);
        pthread_mutex_lock(&s->lock);
    }
    sched_drop_actions(s); /* never run: the server stops */
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->lock);
    sched_free(&q);
    return NULL;
}
