/* seq.c - a request's sequence in a scheduler slot (seq.h). */
#include "server/seq.h"
#include "server/docs.h"
#include "util/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void token_logprobs(const float *lg, int V, int32_t id, int n_top, srv_token *t)
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

void slot_finish(srv_server *s, slot *sl, const char *reason, int status, const char *msg)
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

int publish_token(slot *sl, int32_t id, const srv_token *lp, const char *piece, int len)
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

void slot_drop_kept(slot *sl)
{
    sparq_context_free(sl->kept);
    free(sl->kept_ids);
    sl->kept = NULL;
    sl->kept_ids = NULL;
    sl->n_kept = 0;
}

void slot_drop_spare(slot *sl)
{
    sparq_context_free(sl->spare);
    sl->spare = NULL;
}

/* The context a request runs in, as sparq_context_create takes it (a
 * document's is its KV file's, loaded instead). */
static sparq_context_params request_context_params(const srv_server *s, const srv_request *r)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = s->cfg.n_ctx;
    cp.n_threads = s->cfg.n_threads;
    cp.n_batch = s->cfg.n_batch;
    cp.kv_type = s->cfg.kv_type;
    cp.attn = r->attn;
    return cp;
}

void slot_release(srv_server *s, slot *sl, int idx)
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
    sparq_context *spare = sl->spare;
    if (sl->c && sl->spareable && sparq_context_reuse(sl->c, NULL)) { /* not a shared prefix's mapping */
        sparq_context_free(spare);
        spare = sl->c;
        sl->c = NULL;
    }
    sparq_context_free(sl->c);
    sparq_sampler_free(sl->smp);
    free(sl->logits);
    free(sl->prompt_logits);
    free(sl->hist);
    memset(sl, 0, sizeof *sl);
    sl->kept = kept;
    sl->kept_ids = kept_ids;
    sl->n_kept = n_kept;
    sl->spare = spare;
    if (s->slot_pub) {
        pthread_mutex_lock(&s->lock);
        s->slot_pub[idx].n_cache = n_kept;
        pthread_mutex_unlock(&s->lock);
    }
}

void slot_hist_push(slot *sl, const int32_t *ids, int n)
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

int req_shares(const srv_request *r)
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

void slot_reuse_prefix(srv_server *s, prefix_cache *pc, srv_kvdir *kd, slot *sl)
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

int kept_use(const slot *sl, const srv_request *r, int nb)
{
    if (!sl->kept || !req_shares(r)) return 0;
    const int lim = sl->n_kept < r->n_prompt - 1 ? sl->n_kept : r->n_prompt - 1;
    return lim > 0 ? pc_common_len(sl->kept_ids, r->prompt, lim) / nb * nb : 0;
}

int slot_reuse_kept(srv_server *s, slot *sl, int nb)
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

int slot_start(srv_server *s, slot *sl, char *err, size_t err_size)
{
    const srv_request *r = sl->r;
    const int V = s->n_vocab;
    sparq_context_params cp = request_context_params(s, r);
    if (r->doc >= 0) { /* the file itself, mapped (server/docs.h) */
        cp.n_ctx = 0;
        cp.prefill.mode = SPARQ_PREFILL_POLICY;
        /* its data was checked once, at start (srv_docs_open) */
        if (sparq_context_load_kv(s->model, &cp, s->cfg.docs[r->doc].path, SPARQ_VERIFY_META, &sl->c, err, err_size))
            return -1;
    } else if (sl->spare && sparq_context_reuse(sl->spare, &cp)) {
        sl->c = sl->spare;
        sl->spare = NULL;
        pthread_mutex_lock(&s->lock);
        s->metrics.contexts_reused++;
        pthread_mutex_unlock(&s->lock);
    } else {
        slot_drop_spare(sl); /* made for other parameters */
        if (sparq_context_create(s->model, &cp, &sl->c, err, err_size)) return -1;
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
        return err_set(err, err_size, "out of memory for a new sequence");
    }
    streamer_init(&sl->st, (const char *const *)r->stops, r->n_stops, 0);
    sl->keepable = s->cfg.slot_save_path && r->doc < 0;
    sl->spareable = r->doc < 0;
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

int slot_prefill_chunk(srv_server *s, slot *sl)
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

int slot_tail_batchable(const slot *sl)
{
    const srv_request *r = sl->r;
    return r->n_prompt > 1 && r->n_prompt - sl->fed == 1 && !sl->prompt_logits && sl->policy_ix >= 0 && r->doc < 0 &&
           sparq_attn_policy_observes_prefill(sl->policy_ix) == 0;
}

int slots_prefill_tails(srv_server *s, slot *const *sls, int n, sparq_context **cs, int32_t *tok, float *logits)
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

int publish_echo(srv_server *s, slot *sl)
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
