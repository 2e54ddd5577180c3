/* seq.h - a request's sequence in one of the scheduler's slots: its
 * context and sampler, its prefill (chunked as `sparq run` does, or
 * started from a cached prefix: the prefix cache, a --kv-dir file, or the
 * slot's kept cache), and what it publishes to its request (tokens, text
 * through core/streamer.h, log-probabilities, the finish). The scheduler
 * thread (sched.c) alone calls these; "lock held" means srv_server.lock.
 */
#ifndef SPARQ_SRV_SEQ_H
#define SPARQ_SRV_SEQ_H

#include "server/srv_internal.h"
#include "server/kvdir.h"
#include "server/prefix_cache.h"
#include "core/streamer.h"

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
    /* the last request's context, reset, for the next: its pages stay
     * committed, so the next prefill or prefix copy faults none in (a
     * fresh mapping's first touch is slow on some virtual machines) */
    sparq_context *spare;
    int            spareable;    /* c is the slot's own (not a document's)  */
} slot;

/* Log-softmax of logits at id, and the n most likely tokens. */
void token_logprobs(const float *lg, int V, int32_t id, int n_top, srv_token *t);
/* The request in sl is done: reason ("stop", "length"), and with a
 * non-zero status failed with msg; its text all final, its attention's
 * counters copied. Lock held. */
void slot_finish(srv_server *s, slot *sl, const char *reason, int status, const char *msg);
/* Appends a generated token's piece through the slot's streamer, which
 * applies the stop strings and says how much text is final (not a
 * possible start of a stop string, not a cut UTF-8 character); the tokens
 * whose text is all final are too. Returns 1 if a stop string ended the
 * reply, -1 on OOM. */
int publish_token(slot *sl, int32_t id, const srv_token *lp, const char *piece, int len);
/* The slot's kept cache goes (slot_release keeps it otherwise). */
void slot_drop_kept(slot *sl);
/* The slot's spare context goes (at shutdown). */
void slot_drop_spare(slot *sl);
/* The request's context and sampler go; with keepable its cache becomes the
 * slot's kept one (positions whose ids are known), replacing the last. */
void slot_release(srv_server *s, slot *sl, int idx);
/* Appends id to the ids sl's cache holds; on failure the slot keeps no
 * cache (an unknown id must never be saved). */
void slot_hist_push(slot *sl, const int32_t *ids, int n);
/* Whether r can start from a cached prefix: not with echo and logprobs
 * (every prompt position's logits are needed), not with a policy that
 * observes the prefill (h2o). */
int req_shares(const srv_request *r);
/* A cached prefix of the prompt goes into the new context: the longest of
 * the in-memory entries and, with --kv-dir, the file of the document's
 * name (prefix_id) or the files of its cuts (longest first, only those
 * longer than the memory's). A file's prefix enters the memory cache and
 * is mapped from there (copied in without a cache). */
void slot_reuse_prefix(srv_server *s, prefix_cache *pc, srv_kvdir *kd, slot *sl);
/* Positions of sl's kept cache that r can start from: what they share, cut
 * to a multiple of nb and short of r's last token (whose logits are
 * needed), as for the prefix cache; 0 if none. */
int kept_use(const slot *sl, const srv_request *r, int nb);
/* The new context of sl starts from its slot's kept cache when that gives
 * a start (kept_use): copied, so the logits are those of a full prefill.
 * 1 if it did. */
int slot_reuse_kept(srv_server *s, slot *sl, int nb);
/* Creates the request's context and sampler; 0, or -1 with the message. */
int slot_start(srv_server *s, slot *sl, char *err, size_t err_size);
/* One prefill chunk of sl's prompt: n_batch tokens from where it stopped,
 * the same boundaries `sparq run` uses. Returns 0 or -1 (message in ctx). */
int slot_prefill_chunk(srv_server *s, slot *sl);
/* A prompt whose only unfed token is its last, of a policy that does not
 * observe the prefill and with no per-token prompt logits wanted: its last
 * chunk can go with others' through sparq_eval_prefill_batch (what
 * slot_prefill_chunk would compute, bit for bit). */
int slot_tail_batchable(const slot *sl);
/* The one-token last chunks of n slots (slot_tail_batchable) in one pass
 * over the weights. Returns 0, or -1 (every slot's message in its ctx). */
int slots_prefill_tails(srv_server *s, slot *const *sls, int n, sparq_context **cs, int32_t *tok, float *logits);
/* Echo: the prompt's text (and its tokens' log-probabilities) opens the
 * reply, final at once. Lock held. */
int publish_echo(srv_server *s, slot *sl);

#endif
