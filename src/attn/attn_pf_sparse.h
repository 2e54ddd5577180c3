/* attn_pf_sparse.h - sparse prefill attention (sparq.h, sparq_prefill_params).
 *
 * Exact causal attention over N tokens reads O(N^2) keys: at a million
 * tokens, days of arithmetic on two cores. Here each query block of the
 * tiled prefill (attn_prefill.h) sees
 *   - the sinks: positions [0, n_sink), which take a large share of the
 *     attention in trained models (StreamingLLM);
 *   - the window: positions [lo, now), lo = pos0 - window rounded down to a
 *     key tile, so every row sees at least `window` positions before it;
 *   - with topk, the selected: the k older positions (in [n_sink, lo)) of
 *     highest q . k for the block's mean query of each head, the union over
 *     the group's heads. One selection serves the block's rows (rows of one
 *     block sit next to each other in the text), so its cost is a few
 *     vectors per block, not per token.
 * Older keys are found through an inverted file per (layer, KV head) that
 * grows with the prefill: until it holds 16 x nlist keys they are all
 * scanned; then k-means centroids are trained once on them (index_ivf's
 * k-means), and from then on each key is assigned to its nearest centroid
 * when it leaves the windows, its position appended to that list. A block
 * scans the nprobe lists whose centroids score highest for any of its mean
 * queries, plus the positions that left the window since the chunk began.
 * Keys are read from the KV cache, never copied: the lists hold positions.
 *
 * Identities: a window reaching the sinks, or a selection that takes every
 * older position (k at least their number), runs the exact tile pass over
 * [0, now): bit for bit the exact prefill.
 */
#ifndef SPARQ_ATTN_PF_SPARSE_H
#define SPARQ_ATTN_PF_SPARSE_H

#include "attn/attn.h"
#include "attn/attn_prefill.h"
#include "sparq.h"

typedef struct attn_pf_sparse attn_pf_sparse;

/* p with its zero fields replaced by the defaults for a cache of cap
 * positions (sparq.h). */
sparq_prefill_params attn_pf_resolve(const sparq_prefill_params *p, int64_t cap);
/* Checks resolved parameters: 0, or -1 with a message naming the field. */
int attn_pf_check(const sparq_prefill_params *p, char *err, size_t err_size);

/* State for n_layer x n_kv_head heads of size d, groups of g query heads,
 * and n_threads threads calling attn_pf_sparse_block at once. p resolved.
 * 0, or -1 with a message (out of memory). */
int  attn_pf_sparse_create(const sparq_prefill_params *p, int n_layer, int n_kv_head, int d, int g,
                           int n_threads, attn_pf_sparse **out, char *err, size_t err_size);
void attn_pf_sparse_free(attn_pf_sparse *s);
/* Forgets every position (a context reset or a shift): the index restarts. */
void attn_pf_sparse_reset(attn_pf_sparse *s);
const sparq_prefill_params *attn_pf_sparse_params(const attn_pf_sparse *s);

/* The first window position of a query block starting at pos0. */
int64_t attn_pf_window_lo(const sparq_prefill_params *p, int64_t pos0);

/* Before the blocks of a chunk starting at pos0 run: adds (layer, head)'s
 * positions older than the chunk's first window to its index (training
 * it once enough are there). kv: the head's cache, at least pos0
 * positions. Heads may grow from several threads at once. 0, or -1 with
 * a message (out of memory). */
int attn_pf_sparse_grow(attn_pf_sparse *s, int layer, int head, const attn_kv_view *kv, int64_t pos0,
                        char *err, size_t err_size);

/* An inverted file as attn_pf_sparse_ivf exports it: centroids
 * [nlist][d] and labels [n] (the list of each position) inside one
 * malloc'ed block, which the caller frees. */
typedef struct attn_pf_ivf {
    void    *block;
    float   *centroids;
    int32_t *labels;
    int      nlist;
} attn_pf_ivf;

/* The inverted file grown for (layer, head), for the KV file's ivf image
 * (attn_topk_ivf_image_preset), with the list of each of the first n
 * positions (those never added - the sinks, the last window - assigned
 * now). 0; 1 when there is no trained index (not topk, or too few keys;
 * out->block NULL); -1 with a message. */
int attn_pf_sparse_ivf(const attn_pf_sparse *s, int layer, int head, const attn_kv_view *kv, int64_t n,
                       attn_pf_ivf *out, char *err, size_t err_size);

/* Whether a query block starting at pos (and every earlier one) sees every
 * earlier position: then callers may take any exact path. */
int attn_pf_sparse_exact(const attn_pf_sparse *s, int64_t pos);

/* One query block b of (layer, head) through its sinks, selected keys and
 * window, on scratch slot `thread` < n_threads and the tile scratch of
 * attn_prefill_scratch. *n_keys (may be NULL) receives the keys the
 * block's rows saw at most (for statistics). */
void attn_pf_sparse_block(attn_pf_sparse *s, int thread, int layer, int head, const attn_kv_view *kv,
                          const attn_pf_rows *b, float *scratch, int64_t *n_keys);

#endif
