/* prefix_cache.h - the scheduler's prefix cache, owned by the scheduler
 * thread alone. An entry is a shared prefix (sparq_prefix: one read-only
 * copy in a memfd) holding the first n tokens of some prompt, n a multiple
 * of n_batch. A request whose prompt shares u >= n_batch tokens with an
 * entry's (u cut down to a multiple of n_batch, and short of the whole
 * prompt: its last token's logits are needed) maps the entry's first u
 * positions copy-on-write (sparq_context_attach_prefix) and prefills only
 * the rest, in the chunks it would have used: its logits stay
 * bit-identical. So one entry serves a document followed by any question.
 * Keyed by the tokens (one server = one model and KV type, so the
 * fingerprint is implicit); least recently used entries go when the budget
 * is exceeded, never one a live sequence maps (the mapping would keep its
 * pages anyway: the budget would lie). An entry may carry a document's
 * name ("sparq.prefix_id"). */
#ifndef SPARQ_SRV_PREFIX_CACHE_H
#define SPARQ_SRV_PREFIX_CACHE_H

#include "server/srv_internal.h"

typedef struct pc_entry {
    int32_t      *tokens;
    int           n;
    char         *id;       /* the document's name ("sparq.prefix_id") or NULL */
    sparq_prefix *p;
    double        used;
    size_t        bytes;
} pc_entry;

typedef struct prefix_cache {
    pc_entry *e;
    int       n, cap;
    size_t    bytes, budget;
    int       nb;          /* the prefill chunk: entries are cut at its multiples */
} prefix_cache;

/* Drops every entry. */
void pc_free(prefix_cache *pc);
/* Tokens a and b share, at most lim. */
int  pc_common_len(const int32_t *a, const int32_t *b, int lim);
/* The entry giving ids[n] the longest usable prefix (*use tokens), or -1. */
int  pc_find(const prefix_cache *pc, const int32_t *ids, int n, int *use);
/* The entry named id, or -1. */
int  pc_named(const prefix_cache *pc, const char *id);
/* Remembers the first n tokens of src's cache for contexts of capacity
 * n_ctx, unless an entry already holds them; id (or NULL) names it, if no
 * entry has that name. Returns the entry or -1. */
int  pc_insert(srv_server *s, prefix_cache *pc, const sparq_context *src, const int32_t *ids, int n, int64_t n_ctx,
               const char *id);
/* A request naming its document: the entry of that name holds what the
 * requests naming it have in common (the document, to a chunk boundary:
 * the first one stored its whole prompt's cut, question included), so it
 * shrinks to what this prompt shares with it; a prompt that does not start
 * with its first chunk has another document under that name now: the entry
 * loses the name (a miss; this prompt's prefix takes the name once
 * prefilled). */
void pc_name_check(prefix_cache *pc, const srv_request *r);
/* Maps the first u positions of entry i into the empty context c; 0 or -1.
 * A K^T built for it grows the entry: the budget follows. */
int  pc_attach(prefix_cache *pc, int i, sparq_context *c, int u);
/* The /metrics gauges of the cache. Lock held. */
void pc_publish(srv_server *s, const prefix_cache *pc);

#endif
