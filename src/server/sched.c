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
 * Map:
 *   publish_token      text through core/streamer.h (stop strings, held-back
 *                      bytes), log-probs
 *   slot_start/finish  a request's context and its release
 *   pc_*               the prefix cache (prefix_cache.c): prompt prefixes cut
 *                      at multiples of n_batch, one shared copy each, mapped
 *                      copy-on-write into new contexts (LRU, budget); named
 *                      by prefix_id
 *   wait_target        in-flight sharing: a queued request waits for the
 *                      sequence prefilling its prefix (pc_serve_waiters)
 *   kv_*               --kv-dir: the same prefixes as files shared with
 *                      other replicas (kvdir.c), written by a writer thread
 *                      (kv_writer.c)
 *   slot_pick / kept   --slot-save-path: a slot keeps its last cache, which
 *                      /slots/ID?action=save|restore|erase (slots.c) writes,
 *                      replaces or drops; a request goes to the free slot
 *                      whose cache it continues
 *   srv_sched_main     the loop
 */
#include "server/srv_internal.h"
#include "server/kv_writer.h"
#include "server/prefix_cache.h"
#include "core/streamer.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>


double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

typedef struct slot {
    srv_request   *r;
    sparq_context *c;
    sparq_sampler *smp;
    float         *logits;       /* [V] the next token's distribution       */
    float         *prompt_logits;/* echo + logprobs: [n_prompt][V]          */
    int            fed;          /* prompt tokens in the cache              */
    int            cached;       /* of those, mapped from a cached prefix   */
    int            chunks;       /* prefill chunks run for this request     */
    int            ready;        /* logits are fresh                        */
    streamer       st;           /* the generated text: stop strings, what is
                                  * final (starts after an echoed prompt)   */
    int            policy_ix;
    int            id_stale;     /* --kv-dir holds another document under the
                                  * request's prefix_id: replace it        */
    double         t_prefill;    /* seconds spent prefilling                */
    uint64_t       admitted;     /* admission order: prefill goes oldest first */
    /* --slot-save-path: a slot keeps its last cache (llama-server's slots
     * do), which /slots/ID?action=save writes and restore replaces */
    int            keepable;     /* this request's cache is kept at its end */
    int32_t       *hist;         /* [n_hist] the ids c caches, in order     */
    int            n_hist, cap_hist;
    sparq_context *kept;         /* the slot's cache between requests       */
    int32_t       *kept_ids;     /* [n_kept] its ids                        */
    int            n_kept;
} slot;

/* ---- sampling ------------------------------------------------------------- */

/* Log-softmax of logits at id, and the n most likely tokens. */
static void token_logprobs(const float *lg, int V, int32_t id, int n_top, srv_token *t)
{
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
    const float lse = mx + (float)log(sum);
    t->logprob = lg[id] - lse;
    t->n_top = 0;
    if (n_top > SRV_MAX_TOP) n_top = SRV_MAX_TOP;
    if (n_top > V) n_top = V;
    for (int v = 0; v < V; v++) { /* insertion into a short sorted list */
        int k = t->n_top;
        if (k == n_top && !(lg[v] > lg[t->top_id[k - 1]])) continue;
        if (k < n_top) t->n_top++;
        else k--;
        while (k > 0 && lg[v] > lg[t->top_id[k - 1]]) {
            t->top_id[k] = t->top_id[k - 1];
            k--;
        }
        t->top_id[k] = v;
    }
    for (int k = 0; k < t->n_top; k++) t->top_lp[k] = lg[t->top_id[k]] - lse;
}

/* ---- publishing (lock held) ----------------------------------------------------- */

static void finish(srv_server *s, slot *sl, const char *reason, int status, const char *msg)
{
    srv_request *r = sl->r;
    r->finish = reason;
    if (status) {
        r->err_status = status;
        snprintf(r->error, sizeof r->error, "%s", msg);
        s->metrics.errors += status != 499; /* a client's cancellation is counted apart, not as a failure */
    }
    r->state = REQ_DONE;
    r->text_ok = streamer_flush(&sl->st, &r->text); /* held-back bytes too: nothing follows */
    r->n_ok_toks = r->n_toks;
    r->t_done = srv_now();
    if (sl->c) { /* what the reply reports of its attention (a copy of counters: cheap) */
        sparq_attn_stats st;
        sparq_context_attn_stats(sl->c, &st);
        r->kv_read = st.elements;
        r->kv_dense = st.dense_elements;
    }
}

/* Records token id (log-probs lp, or none) whose piece starts at text
 * offset off. 0 or -1 (out of memory). */
static int push_token(srv_request *r, int32_t id, const srv_token *lp, size_t off)
{
    srv_token t;
    if (lp) t = *lp;
    else {
        memset(&t, 0, sizeof t);
        t.logprob = NAN;
    }
    t.id = id;
    t.text_off = off;
    if (r->n_toks == r->cap_toks) {
        int cap = r->cap_toks ? 2 * r->cap_toks : 64;
        srv_token *p = realloc(r->toks, (size_t)cap * sizeof *p);
        if (!p) return -1;
        r->toks = p;
        r->cap_toks = cap;
    }
    r->toks[r->n_toks++] = t;
    return 0;
}

/* Appends a generated token's piece through the slot's streamer, which
 * applies the stop strings and says how much text is final (not a
 * possible start of a stop string, not a cut UTF-8 character); the tokens
 * whose text is all final are too. Returns 1 if a stop string ended the
 * reply, -1 on OOM. */
static int publish_token(slot *sl, int32_t id, const srv_token *lp, const char *piece, int len)
{
    srv_request *r = sl->r;
    const size_t old = r->text.len;
    const int hit = streamer_feed(&sl->st, &r->text, piece, len > 0 ? (size_t)len : 0);
    if (hit < 0 || push_token(r, id, lp, old)) return -1;
    if (hit) return 1;
    if (sl->st.ok > r->text_ok) r->text_ok = sl->st.ok;
    while (r->n_ok_toks < r->n_toks) {
        const srv_token *n = &r->toks[r->n_ok_toks];
        size_t end = r->n_ok_toks + 1 < r->n_toks ? r->toks[r->n_ok_toks + 1].text_off : r->text.len;
        if (end > r->text_ok && n->text_off < end) break;
        r->n_ok_toks++;
    }
    return 0;
}

/* ---- slots ------------------------------------------------------------------ */

/* The slot's kept cache goes (slot_release keeps it otherwise). */
static void slot_drop_kept(slot *sl)
{
    sparq_context_free(sl->kept);
    free(sl->kept_ids);
    sl->kept = NULL;
    sl->kept_ids = NULL;
    sl->n_kept = 0;
}

/* The request's context and sampler go; with keepable its cache becomes the
 * slot's kept one (positions whose ids are known), replacing the last. */
static void slot_release(srv_server *s, slot *sl, int idx)
{
    if (sl->c) {
        sparq_attn_stats st;
        sparq_context_attn_stats(sl->c, &st);
        pthread_mutex_lock(&s->lock);
        if (sl->policy_ix >= 0) s->metrics.attn_bytes[sl->policy_ix] += st.bytes;
        pthread_mutex_unlock(&s->lock);
    }
    if (sl->c && sl->keepable && sl->hist) {
        const int64_t pos = sparq_context_pos(sl->c);
        slot_drop_kept(sl);
        sl->kept = sl->c;
        sl->kept_ids = sl->hist;
        sl->n_kept = (int)(pos < sl->n_hist ? pos : sl->n_hist);
        sl->c = NULL;
        sl->hist = NULL;
    }
    sparq_context *kept = sl->kept;
    int32_t *kept_ids = sl->kept_ids;
    const int n_kept = sl->n_kept;
    sparq_context_free(sl->c);
    sparq_sampler_free(sl->smp);
    free(sl->logits);
    free(sl->prompt_logits);
    free(sl->hist);
    memset(sl, 0, sizeof *sl);
    sl->kept = kept;
    sl->kept_ids = kept_ids;
    sl->n_kept = n_kept;
    if (s->slot_pub) {
        pthread_mutex_lock(&s->lock);
        s->slot_pub[idx].n_cache = n_kept;
        pthread_mutex_unlock(&s->lock);
    }
}

/* Appends id to the ids sl's cache holds; on failure the slot keeps no
 * cache (an unknown id must never be saved). */
static void slot_hist_push(slot *sl, const int32_t *ids, int n)
{
    if (!sl->keepable) return;
    if (sl->n_hist + n > sl->cap_hist) {
        int cap = sl->cap_hist ? sl->cap_hist : 256;
        while (cap < sl->n_hist + n) cap *= 2;
        int32_t *h = realloc(sl->hist, (size_t)cap * sizeof *h);
        if (!h) {
            sl->keepable = 0;
            return;
        }
        sl->hist = h;
        sl->cap_hist = cap;
    }
    memcpy(sl->hist + sl->n_hist, ids, (size_t)n * sizeof *ids);
    sl->n_hist += n;
}

/* Whether r can start from a cached prefix: not with echo and logprobs
 * (every prompt position's logits are needed), not with a policy that
 * observes the prefill (h2o). */
static int req_shares(const srv_request *r)
{
    if (r->doc >= 0) return 0; /* its prompt is no prefix of anything: it follows the document */
    if (r->echo && r->logprobs >= 0) return 0;
    for (int i = 0; sparq_attn_policy_name(i); i++)
        if (!strcmp(sparq_attn_policy_name(i), r->policy)) return sparq_attn_policy_observes_prefill(i) == 0;
    return 0;
}

/* A prefix file's first n positions go into sl's context: through the
 * memory cache (mapped from there), or copied without one. 0 or -1. */
static int use_file(srv_server *s, prefix_cache *pc, slot *sl, sparq_context *f, int n, const char *id)
{
    char err[256];
    int ok = 0;
    if (pc->budget) {
        const int j = pc_insert(s, pc, f, sl->r->prompt, n, sparq_context_n_ctx(sl->c), id);
        ok = j >= 0 && !pc_attach(pc, j, sl->c, n);
    }
    if (!ok) ok = !sparq_context_copy_prefix(sl->c, f, n, err, sizeof err);
    sparq_context_free(f);
    if (!ok) return -1;
    sl->fed = n;
    pthread_mutex_lock(&s->lock);
    s->metrics.kv_dir_hits++;
    s->metrics.kv_dir_tokens += n;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* A cached prefix of the prompt goes into the new context: the longest of
 * the in-memory entries and, with --kv-dir, the file of the document's
 * name (prefix_id) or the files of its cuts (longest first, only those
 * longer than the memory's). A file's prefix enters the memory cache and
 * is mapped from there (copied in without a cache). */
static void slot_reuse_prefix(srv_server *s, prefix_cache *pc, srv_kvdir *kd, slot *sl)
{
    const srv_request *r = sl->r;
    if ((!pc->budget && !kd) || !req_shares(r)) return;
    const char *id = r->prefix_id[0] ? r->prefix_id : NULL;
    if (id && pc->budget) pc_name_check(pc, r);
    int use = 0;
    if (pc->budget) pc_find(pc, r->prompt, r->n_prompt, &use);
    const int nb = pc->nb;
    if (kd && id && pc_named(pc, id) < 0) {
        int fu = 0;
        sparq_context *f = kvdir_load_named(kd, s->model, id, r->prompt, r->n_prompt, nb, &fu, &sl->id_stale);
        if (f && fu > use) {
            if (!use_file(s, pc, sl, f, fu, id)) return;
        } else {
            sparq_context_free(f);
        }
    }
    for (int cut = (r->n_prompt - 1) / nb * nb; kd && cut > use; cut -= nb) {
        sparq_context *f = kvdir_load(kd, s->model, r->prompt, cut);
        if (f && !use_file(s, pc, sl, f, cut, NULL)) return;
    }
    /* found again: a file's insertion may have evicted entries */
    const int i = pc->budget ? pc_find(pc, r->prompt, r->n_prompt, &use) : -1;
    if (i < 0 || pc_attach(pc, i, sl->c, use)) return;
    sl->fed = use;
    pthread_mutex_lock(&s->lock);
    s->metrics.prefix_hits++;
    s->metrics.prefix_tokens += use;
    pthread_mutex_unlock(&s->lock);
}

/* ---- slots' kept caches (--slot-save-path) -------------------------------------- */

/* Positions of sl's kept cache that r can start from: what they share, cut
 * to a multiple of nb and short of r's last token (whose logits are
 * needed), as for the prefix cache; 0 if none. */
static int kept_use(const slot *sl, const srv_request *r, int nb)
{
    if (!sl->kept || !req_shares(r)) return 0;
    const int lim = sl->n_kept < r->n_prompt - 1 ? sl->n_kept : r->n_prompt - 1;
    return lim > 0 ? pc_common_len(sl->kept_ids, r->prompt, lim) / nb * nb : 0;
}

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

/* The new context of sl starts from its slot's kept cache when that gives
 * a start (kept_use): copied, so the logits are those of a full prefill.
 * 1 if it did. */
static int slot_reuse_kept(srv_server *s, slot *sl, int nb)
{
    char err[256];
    const int use = kept_use(sl, sl->r, nb);
    if (use <= 0) return 0;
    if (sparq_context_copy_prefix(sl->c, sl->kept, use, err, sizeof err)) {
        fprintf(stderr, "serve: slot cache: %s\n", err);
        return 0;
    }
    sl->fed = use;
    pthread_mutex_lock(&s->lock);
    s->metrics.prefix_hits++;
    s->metrics.prefix_tokens += use;
    pthread_mutex_unlock(&s->lock);
    return 1;
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
            snprintf(err, err_size, "slot %d holds no cache to save (no request has run there since it was "
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

/* Creates the request's context and sampler; 0, or -1 with the message. */
static int slot_start(srv_server *s, slot *sl, char *err, size_t err_size)
{
    const srv_request *r = sl->r;
    const int V = s->n_vocab;
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = s->cfg.n_ctx;
    cp.n_threads = s->cfg.n_threads;
    cp.n_batch = s->cfg.n_batch;
    cp.kv_type = s->cfg.kv_type;
    cp.attn = r->attn;
    if (r->doc >= 0) { /* the file itself, mapped (server/docs.h) */
        cp.n_ctx = 0;
        cp.prefill.mode = SPARQ_PREFILL_POLICY;
        /* its data was checked once, at start (srv_docs_open) */
        if (sparq_context_load_kv(s->model, &cp, s->cfg.docs[r->doc].path, SPARQ_VERIFY_META, &sl->c, err, err_size))
            return -1;
    } else if (sparq_context_create(s->model, &cp, &sl->c, err, err_size)) {
        return -1;
    }
    sparq_sampler_params sp = sparq_sampler_default_params();
    sp.temp = r->temp;
    sp.top_k = r->top_k;
    sp.top_p = r->top_p;
    sp.seed = r->seed;
    sp.min_p = r->min_p;
    sp.repeat_penalty = r->rep_pen;
    sp.presence_penalty = r->pres_pen;
    sp.frequency_penalty = r->freq_pen;
    sp.penalty_last_n = -1; /* every generated token (the prompt is not accepted) */
    if (sparq_sampler_check(&sp, err, err_size)) return -1;
    sl->smp = sparq_sampler_create(&sp, V);
    /* ids were checked against the vocabulary when parsed; this cannot fail otherwise */
    if (sl->smp && r->n_bias && sparq_sampler_set_logit_bias(sl->smp, r->bias_ids, r->bias, r->n_bias, err, err_size))
        return -1;
    if (sl->smp && r->grammar && sparq_sampler_set_grammar(sl->smp, s->model, r->grammar, err, err_size)) return -1;
    sl->logits = malloc((size_t)V * sizeof(float));
    if (r->echo && r->logprobs >= 0)
        sl->prompt_logits = malloc((size_t)r->n_prompt * V * sizeof(float));
    if (!sl->smp || !sl->logits || (r->echo && r->logprobs >= 0 && !sl->prompt_logits)) {
        snprintf(err, err_size, "out of memory for a new sequence");
        return -1;
    }
    streamer_init(&sl->st, (const char *const *)r->stops, r->n_stops, 0);
    sl->keepable = s->cfg.slot_save_path && r->doc < 0;
    slot_hist_push(sl, r->prompt, r->n_prompt);
    sl->policy_ix = -1;
    for (int i = 0; i < SRV_MAX_POLICIES && sparq_attn_policy_name(i); i++)
        if (strcmp(sparq_attn_policy_name(i), r->attn.policy ? r->attn.policy : "dense") == 0) sl->policy_ix = i;
    return 0;
}

/* sl's prompt advanced by a chunk of nb tokens; after its last, the slot
 * is ready (its logits those of the prompt's last token). */
static void slot_chunk_done(const srv_server *s, slot *sl, int nb)
{
    const srv_request *r = sl->r;
    sl->fed += nb;
    sl->chunks++;
    if (sl->fed < r->n_prompt) return;
    if (sl->prompt_logits)
        memcpy(sl->logits, sl->prompt_logits + (size_t)(r->n_prompt - 1) * s->n_vocab, (size_t)s->n_vocab * sizeof(float));
    sl->ready = 1;
}

/* One prefill chunk of sl's prompt: n_batch tokens from where it stopped,
 * the same boundaries `sparq run` uses. Returns 0 or -1 (message in ctx). */
static int slot_prefill_chunk(srv_server *s, slot *sl)
{
    const srv_request *r = sl->r;
    const int V = s->n_vocab;
    const int nb_max = s->cfg.n_batch > 0 ? s->cfg.n_batch : 512;
    int nb = r->n_prompt - sl->fed < nb_max ? r->n_prompt - sl->fed : nb_max;
    const int last = sl->fed + nb == r->n_prompt;
    int rc;
    if (r->n_prompt == 1) { /* a one-token prompt is a decode step, as in sparq_eval */
        rc = sparq_eval(sl->c, r->prompt, 1, sl->prompt_logits ? sl->prompt_logits : sl->logits);
    } else if (r->doc >= 0) { /* after a document: token by token through the policy (docs.h) */
        rc = sl->prompt_logits ? sparq_eval_all(sl->c, r->prompt + sl->fed, nb, sl->prompt_logits + (size_t)sl->fed * V)
                               : sparq_eval(sl->c, r->prompt + sl->fed, nb, last ? sl->logits : NULL);
    } else if (sl->prompt_logits) {
        rc = sparq_eval_prefill_all(sl->c, r->prompt + sl->fed, nb, sl->prompt_logits + (size_t)sl->fed * V);
    } else {
        rc = sparq_eval_prefill(sl->c, r->prompt + sl->fed, nb, last ? sl->logits : NULL);
    }
    if (rc) return -1;
    slot_chunk_done(s, sl, nb);
    return 0;
}

/* A prompt whose only unfed token is its last, of a policy that does not
 * observe the prefill and with no per-token prompt logits wanted: its last
 * chunk can go with others' through sparq_eval_prefill_batch (what
 * slot_prefill_chunk would compute, bit for bit). */
static int slot_tail_batchable(const slot *sl)
{
    const srv_request *r = sl->r;
    return r->n_prompt > 1 && r->n_prompt - sl->fed == 1 && !sl->prompt_logits && sl->policy_ix >= 0 && r->doc < 0 &&
           sparq_attn_policy_observes_prefill(sl->policy_ix) == 0;
}

/* The one-token last chunks of n slots (slot_tail_batchable) in one pass
 * over the weights. Returns 0, or -1 (every slot's message in its ctx). */
static int slots_prefill_tails(srv_server *s, slot *const *sls, int n, sparq_context **cs, int32_t *tok,
                               float *logits)
{
    for (int i = 0; i < n; i++) {
        cs[i] = sls[i]->c;
        tok[i] = sls[i]->r->prompt[sls[i]->fed];
    }
    if (sparq_eval_prefill_batch(cs, tok, n, logits)) return -1;
    for (int i = 0; i < n; i++) {
        memcpy(sls[i]->logits, logits + (size_t)i * s->n_vocab, (size_t)s->n_vocab * sizeof(float));
        slot_chunk_done(s, sls[i], 1);
    }
    return 0;
}

/* Echo: the prompt's text (and its tokens' log-probabilities) opens the
 * reply, final at once. Lock held. */
static int publish_echo(srv_server *s, slot *sl)
{
    srv_request *r = sl->r;
    const int V = s->n_vocab;
    const int bos = sparq_token_bos(s->model);
    char piece[256];
    for (int i = 0; i < r->n_prompt; i++) {
        if (i == 0 && r->prompt[0] == bos) continue;
        int len = sparq_token_to_piece(s->model, r->prompt[i], piece, sizeof piece);
        if (len > (int)sizeof piece) len = sizeof piece;
        srv_token t;
        memset(&t, 0, sizeof t);
        t.logprob = NAN;
        if (sl->prompt_logits && i > 0) token_logprobs(sl->prompt_logits + (size_t)(i - 1) * V, V, r->prompt[i], r->logprobs, &t);
        const size_t off = r->text.len;
        if ((len > 0 && text_append(&r->text, piece, (size_t)len)) ||
            push_token(r, r->prompt[i], sl->prompt_logits ? &t : NULL, off))
            return -1;
    }
    /* the prompt is no reply: stop strings are looked for after it */
    streamer_init(&sl->st, (const char *const *)r->stops, r->n_stops, r->text.len);
    r->text_ok = r->text.len;
    r->n_ok_toks = r->n_toks;
    return 0;
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

void *srv_sched_main(void *arg)
{
    srv_server *s = arg;
    const int P = s->cfg.parallel, V = s->n_vocab;
    slot *slots = calloc((size_t)P, sizeof *slots);
    float *blogits = malloc((size_t)P * V * sizeof(float));
    sparq_context **bc = malloc((size_t)P * sizeof *bc);
    int32_t *btok = malloc((size_t)P * sizeof *btok);
    int *bslot = malloc((size_t)P * sizeof *bslot);
    slot **chunk_slots = malloc((size_t)P * sizeof *chunk_slots);
    int gate = gate_open(s->cfg.prefill_gate);
    uint64_t n_admitted = 0;
    char err[512], piece[256];
    prefix_cache pc = { NULL, 0, 0, 0, s->cfg.prefix_cache_bytes, s->cfg.n_batch > 0 ? s->cfg.n_batch : 512 };
    srv_kvdir kvd, *kd = NULL;
    kv_writer kvw;
    if (s->cfg.kv_dir) {
        kvdir_init(&kvd, s->cfg.kv_dir, s->cfg.kv_dir_bytes, s->model, s->cfg.kv_type);
        kd = &kvd;
        kv_writer_start(&kvw, s, kd);
    }
    pthread_mutex_lock(&s->lock);
    if (!slots || !blogits || !bc || !btok || !bslot || !chunk_slots) {
        fprintf(stderr, "serve: out of memory for %d slots\n", P);
        s->stopping = 2;
    }
    for (;;) {
        /* cancellations and timeouts; admissions */
        const double now = srv_now();
        int active = 0;
        for (int i = 0; slots && i < P; i++) {
            srv_request *r = slots[i].r;
            if (!r) continue;
            if (r->state != REQ_DONE) {
                if (s->stopping == 2) finish(s, &slots[i], "stop", 503, "the server is shutting down");
                else if (r->cancelled) { finish(s, &slots[i], "stop", 499, "cancelled"); s->metrics.cancelled++; }
                else if (now > r->deadline) finish(s, &slots[i], "length", 504, "request timed out");
            }
            if (r->state == REQ_DONE) {
                if (s->slot_pub) {
                    s->slot_pub[i].r = NULL;
                    s->slot_pub[i].n_decoded = r->n_gen;
                }
                srv_request_release(r);
                slots[i].r = NULL;
                s->n_active--;
                pthread_mutex_unlock(&s->lock);
                slot_release(s, &slots[i], i);
                pthread_mutex_lock(&s->lock);
                continue;
            }
            active++;
        }
        /* admissions, in queue order; a request whose prompt another
         * sequence is prefilling waits for it, the rest go past it */
        int n_free = 0;
        for (int i = 0; slots && i < P; i++) n_free += !slots[i].r;
        if (slots && n_free && s->queue_head && s->stopping < 2) pc_serve_waiters(s, &pc, slots, P);
        for (srv_request *r = slots ? s->queue_head : NULL, *prev = NULL, *next; r && s->stopping < 2; r = next) {
            next = r->next;
            const int gone = r->cancelled, late = now > r->deadline;
            int i = -1, want = 0;
            if (!gone && !late) {
                if (!n_free) break;
                i = slot_pick(slots, P, r, pc.nb);
                const int j = wait_target(&pc, slots, P, r, &want);
                if (j >= 0 && slots[j].fed < want) {
                    if (!r->waited) s->metrics.prefix_waits++;
                    r->waited = 1;
                    prev = r;
                    continue;
                }
            }
            if (prev) prev->next = next;
            else s->queue_head = next;
            if (s->queue_tail == r) s->queue_tail = prev;
            s->n_queued--;
            if (gone || late) { /* left while queued (or waiting): answered now */
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
            slots[i].r = r;
            slots[i].admitted = n_admitted++;
            slot_publish(s, i, r, slots[i].admitted);
            n_free--;
            active++;
        }
        pc_publish(s, &pc);
        while (s->stopping == 2 && s->queue_head) { /* shutdown: drop the queue */
            srv_request *r = s->queue_head;
            s->queue_head = r->next;
            if (!s->queue_head) s->queue_tail = NULL;
            s->n_queued--;
            r->err_status = 503;
            snprintf(r->error, sizeof r->error, "the server is shutting down");
            r->state = REQ_DONE;
            srv_request_release(r);
        }
        if (slots && s->actions) slot_actions_run(s, slots);
        pthread_cond_broadcast(&s->progress);
        if (!active) {
            if (s->stopping) break;
            pthread_cond_wait(&s->wake_sched, &s->lock);
            continue;
        }
        pthread_mutex_unlock(&s->lock);

        /* new sequences get their context */
        for (int i = 0; i < P; i++) {
            slot *sl = &slots[i];
            if (!sl->r || sl->c) continue;
            if (slot_start(s, sl, err, sizeof err)) {
                pthread_mutex_lock(&s->lock);
                finish(s, sl, "stop", 400, err);
                pthread_mutex_unlock(&s->lock);
            } else {
                if (!slot_reuse_kept(s, sl, pc.nb)) slot_reuse_prefix(s, &pc, kd, sl);
                sl->cached = sl->fed;
                if (sl->kept) { /* the slot's cache is this request's from now on */
                    slot_drop_kept(sl);
                    pthread_mutex_lock(&s->lock);
                    s->slot_pub[i].n_cache = 0;
                    pthread_mutex_unlock(&s->lock);
                }
            }
        }
        /* Prefill chunks in admission order, oldest first, until this
         * iteration has fed n_batch tokens (at least one chunk): round robin
         * would hold every first token back until all prompts are nearly
         * done; in admission order the first request answers after its own
         * prefill (the last no later). The budget lets many short chunks
         * (the uncached tails of prompts the prefix cache holds) start
         * together instead of one per decode step, while a long prompt
         * still takes one chunk per step and never stalls the running
         * streams for more than that. A prompt that took several chunks
         * ends the round when it completes, so its first token comes out
         * before anything admitted after it. A chunk's boundaries are the
         * sequence's own (slot_prefill_chunk), so the budget never changes
         * what a sequence computes. */
        const int prefill_budget = s->cfg.n_batch > 0 ? s->cfg.n_batch : 512;
        int prefill_fed = 0;
        for (;;) {
            slot *oldest = NULL;
            for (int i = 0; i < P; i++) {
                slot *sl = &slots[i];
                if (!sl->r || !sl->c || sl->ready || sl->r->state == REQ_DONE) continue;
                if (!oldest || sl->admitted < oldest->admitted) oldest = sl;
            }
            if (!oldest || prefill_fed >= prefill_budget) break;
            /* The oldest's chunk; when it is a prompt's one uncached last
             * token (a prefix-cache hit), every other such tail joins it in
             * one pass over the weights instead of one pass each. */
            int nc = 0;
            chunk_slots[nc++] = oldest;
            if (slot_tail_batchable(oldest))
                for (int i = 0; i < P; i++) {
                    slot *sl = &slots[i];
                    if (sl != oldest && sl->r && sl->c && !sl->ready && sl->r->state != REQ_DONE && slot_tail_batchable(sl))
                        chunk_slots[nc++] = sl;
                }
            gate_pass(&gate);
            const double t0 = srv_now();
            const int fed0 = prefill_fed;
            int rc;
            if (nc > 1) {
                rc = slots_prefill_tails(s, chunk_slots, nc, bc, btok, blogits);
                if (!rc) prefill_fed += nc;
            } else {
                const int f = oldest->fed;
                rc = slot_prefill_chunk(s, oldest);
                prefill_fed += oldest->fed - f;
            }
            const double t1 = srv_now();
            /* failed, or a long prompt's last chunk */
            const int end_round = rc || (nc == 1 && oldest->chunks > 1 && oldest->ready);
            for (int k = 0; k < nc; k++) {
                slot *sl = chunk_slots[k];
                if (!rc && sl->ready && (pc.budget || kd)) { /* remember the prompt, cut at a chunk boundary */
                    const int cut = (sl->r->n_prompt - 1) / pc.nb * pc.nb;
                    const char *id = sl->r->prefix_id[0] && req_shares(sl->r) ? sl->r->prefix_id : NULL;
                    if (cut > 0 && pc.budget) pc_insert(s, &pc, sl->c, sl->r->prompt, cut, sparq_context_n_ctx(sl->c), id);
                    if (cut > 0 && kd) kv_save_prefix(s, &kvw, sl->c, sl->r->prompt, cut, id, sl->id_stale);
                }
            }
            pthread_mutex_lock(&s->lock);
            s->metrics.prefill_tokens += prefill_fed - fed0;
            s->metrics.prefill_seconds += t1 - t0;
            if (nc > 1 && !rc) s->metrics.tails_batched += nc;
            for (int k = 0; k < nc; k++) {
                slot *sl = chunk_slots[k];
                if (rc) finish(s, sl, "stop", 500, sparq_context_error(sl->c));
                else if (sl->ready) {
                    sl->r->n_prompt_tokens = sl->r->n_prompt; /* what the request sent, as llama-server counts */
                    sl->r->n_cached = sl->cached;
                    sl->r->t_prefilled = t1;
                    if (sl->r->echo && publish_echo(s, sl)) finish(s, sl, "stop", 500, "out of memory");
                }
            }
            pthread_mutex_unlock(&s->lock);
            if (end_round) break;
        }
        /* sample one token for every ready sequence; decode them together */
        int nb = 0;
        for (int i = 0; i < P; i++) {
            slot *sl = &slots[i];
            srv_request *r = sl->r;
            if (!r || !sl->ready || r->state == REQ_DONE) continue;
            if (r->max_tokens == 0) { /* echo only (loglikelihood scoring) */
                pthread_mutex_lock(&s->lock);
                finish(s, sl, "length", 0, NULL);
                pthread_mutex_unlock(&s->lock);
                continue;
            }
            /* the library sampler `sparq run` uses, set up in slot_start */
            const int32_t id = sparq_sample(sl->smp, sl->logits);
            srv_token lp, *lpp = NULL;
            if (r->logprobs >= 0) {
                token_logprobs(sl->logits, V, id, r->logprobs, &lp);
                lpp = &lp;
            }
            const int eog = !r->ignore_eos && sparq_token_is_eog(s->model, id);
            int len = eog ? 0 : sparq_token_to_piece(s->model, id, piece, sizeof piece);
            if (len > (int)sizeof piece) len = sizeof piece;
            pthread_mutex_lock(&s->lock);
            if (eog) {
                finish(s, sl, "stop", 0, NULL);
            } else {
                r->n_gen++;
                int st = publish_token(sl, id, lpp, piece, len < 0 ? 0 : len);
                if (st < 0) finish(s, sl, "stop", 500, "out of memory");
                else if (st > 0) finish(s, sl, "stop", 0, NULL);
                else if (r->n_gen >= r->max_tokens) finish(s, sl, "length", 0, NULL);
                else if (sparq_context_pos(sl->c) >= sparq_context_n_ctx(sl->c)) finish(s, sl, "length", 0, NULL);
                else {
                    bc[nb] = sl->c;
                    btok[nb] = id;
                    bslot[nb++] = i;
                }
            }
            pthread_mutex_unlock(&s->lock);
        }
        if (nb > 0) {
            if (gate >= 0) { /* the tokens just sampled go out before the gate holds the step */
                pthread_mutex_lock(&s->lock);
                pthread_cond_broadcast(&s->progress);
                pthread_mutex_unlock(&s->lock);
                gate_pass(&gate);
            }
            const double t0 = srv_now();
            int rc = sparq_decode_batch(bc, btok, nb, blogits);
            const double t1 = srv_now();
            for (int j = 0; j < nb && !rc; j++) {
                memcpy(slots[bslot[j]].logits, blogits + (size_t)j * V, (size_t)V * sizeof(float));
                slot_hist_push(&slots[bslot[j]], &btok[j], 1);
            }
            pthread_mutex_lock(&s->lock);
            s->metrics.decode_tokens += nb;
            s->metrics.decode_seconds += t1 - t0;
            for (int j = 0; j < nb && rc; j++) finish(s, &slots[bslot[j]], "stop", 500, sparq_context_error(bc[j]));
            pthread_mutex_unlock(&s->lock);
        }
        pthread_mutex_lock(&s->lock);
    }
    while (s->actions) { /* never run: the server stops */
        srv_slot_action *a = s->actions;
        s->actions = a->next;
        a->status = 503;
        snprintf(a->error, sizeof a->error, "the server is shutting down");
        a->done = 1;
    }
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->lock);
    if (kd) kv_writer_stop(&kvw); /* its queued files are written before the server stops */
    for (int i = 0; slots && i < P; i++) {
        slot_release(s, &slots[i], i);
        slot_drop_kept(&slots[i]);
    }
    pc_free(&pc);
    free(slots);
    free(blogits);
    free(chunk_slots);
    if (gate >= 0) close(gate);
    free(bc);
    free(btok);
    free(bslot);
    return NULL;
}
