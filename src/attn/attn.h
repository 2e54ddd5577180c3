/* attn.h - the one narrow interface every attention policy implements.
 *
 * A policy decides which cached positions one decode step reads, for one
 * layer and one KV head with its g query heads (GQA group). Prefill is always
 * exact dense causal attention (model.c); only decode steps call `attend`.
 *
 * Adding a policy = one new file attn_NAME.c defining `const attn_policy
 * attn_policy_NAME` plus one line in attn_registry.c's registry.
 *
 * Threading: the model calls attend() concurrently for different
 * (layer, kv_head) pairs, each call with its own scratch; a policy's
 * per-sequence state must therefore be partitioned by (layer, kv_head).
 *
 * Below this header, and including neither it nor each other in a circle:
 * attn_kv_view.h (the cache view and its layouts) and attn_kernels.h (the
 * kernel twins and their tables); attn.c dispatches to those tables.
 */
#ifndef SPARQ_ATTN_H
#define SPARQ_ATTN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "attn/attn_kernels.h"
#include "sparq.h"
#include "util/cpu.h"

/* Elements a step touched; bytes = elements x element size of the cache.
 * read is measured (attn_meter, and the index scan's own count); written is
 * what the cache's append of this step stores (k, v, and SparQ's v_sum
 * update), which happens outside the policy and is declared by it. */
typedef struct attn_counts {
    int64_t read;
    int64_t written;
} attn_counts;

/* Model shape a policy's state is sized for. */
typedef struct attn_shape {
    int     n_layer;
    int     n_kv_head;
    int     g;             /* query heads per KV head                     */
    int     d;             /* head size                                   */
    int64_t n_ctx;         /* cache capacity                              */
} attn_shape;

/* Per-call scratch owned by the caller: at least scratch_floats(...) f32
 * values, 64-byte aligned, never shared between concurrent calls. */
typedef struct attn_scratch {
    float  *f;
    size_t  n_f;
    int32_t *i;            /* int32 scratch of the same count             */
    char   *err;           /* room for attend()'s error message, or NULL  */
    size_t  err_size;
} attn_scratch;

/* Writes a one-line message to s->err (when there is room) and returns -1:
 * `return attn_fail(scratch, "...", ...);` in a policy's attend(). */
int attn_fail(attn_scratch *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* What one decode step selected, for tests and the public kernel API.
 * Every pointer may be NULL (that item is then not reported). */
typedef struct attn_trace {
    int32_t *sel;          /* [S] room: positions read, unordered           */
    int64_t  n_sel;        /* out: entries written to sel                   */
    int32_t *i1;           /* [d] room: SparQ's query components            */
    int      n_i1;         /* out: entries written to i1 (r; 0 elsewhere)   */
    float   *alpha;        /* [g]: SparQ alpha, FlexGen's kept softmax mass, */
                           /*      1 for policies that renormalise          */
} attn_trace;

/* Prebuilt per-(layer, kv_head) indexes over a prefix, e.g. in a mapped KV
 * cache file (kvfile.h): find returns the stored image of `kind` ("exact",
 * "ivf", "hnsw", "sparq") and its size, or NULL. */
typedef struct attn_index_source {
    const void *(*find)(const void *user, int layer, int kv_head, const char *kind,
                        size_t *bytes);
    const void *user;
} attn_index_source;

/* Bits of attn_policy.needs: what the KV cache must maintain. */
enum {
    ATTN_NEEDS_KT      = 1u << 0,  /* position-contiguous K^T copy        */
    ATTN_NEEDS_VSUM    = 1u << 1,  /* running f32 sum of V                */
    ATTN_NEEDS_COLSUM  = 1u << 2,  /* prefill reports attention col sums  */
};

/* One decode step of one (layer, KV head): what attend and attend_part
 * get beside the policy's state and parameters. The caller owns every
 * pointer; the policy writes out, scratch, counts and trace only. */
typedef struct attn_step {
    int                 layer;
    int                 kv_head;
    const attn_kv_view *kv;
    const float        *q;       /* [g][d] the group's queries (RoPE applied, unscaled) */
    int                 g;       /* query heads per KV head                     */
    float              *out;     /* [g][d] the attention output                 */
    attn_scratch       *scratch; /* the caller's, never shared between calls    */
    attn_counts        *counts;  /* elements read and written are added here    */
    struct attn_trace  *trace;   /* what the step selected, or NULL (attend_part
                                  * ignores it)                                 */
} attn_step;

typedef struct attn_policy {
    const char *name;
    const char *summary;   /* one line for --help: what a decode step reads */
    int         in_all;    /* part of `--attn all` (the SparQ paper's comparison) */
    unsigned    needs;
    /* Fills defaults (p fields left 0/-1) for head size d and validates;
     * returns 0 or -1 with a one-line message. */
    int  (*resolve)(sparq_attn_params *p, int d, char *err, size_t err_size);
    /* Per-sequence state (NULL allowed for stateless policies). */
    int  (*state_create)(const sparq_attn_params *p, const attn_shape *shape, void **state);
    void (*state_free)(void *state);
    /* Optional: after each prefill batch, per (layer, kv_head): the cache
     * view and (if ATTN_NEEDS_COLSUM) colsum[S], the sum over the batch's
     * queries of the group's attention weights for each key position. */
    void (*observe_prefill)(void *state, const sparq_attn_params *p, int layer,
                            int kv_head, const attn_kv_view *kv, const float *colsum);
    /* f32 and int32 scratch values attend() needs for S positions. */
    size_t (*scratch_floats)(const sparq_attn_params *p, int64_t S, int d, int g);
    /* One decode step: step->q[g][d] (RoPE applied, unscaled) ->
     * step->out[g][d]; step->trace (may be NULL) reports what the step
     * selected (tests, sparq_attn_run). Returns 0, or -1 with a one-line
     * message in step->scratch->err (attn_fail): a policy never falls back
     * silently. */
    int  (*attend)(void *state, const sparq_attn_params *p, const attn_step *step);
    /* The transfer formula (docs/ALGORITHMS.md "Transfer formulas", elements) for one step of one KV head. */
    int64_t (*transfer_formula)(const sparq_attn_params *p, int64_t S, int d, int g);
    /* Optional (policies that index a prefix: topk): positions [0, n_prefix)
     * are the prefix from now on; src (may be NULL) offers prebuilt indexes
     * and must stay valid while the state uses it. Not concurrent with
     * attend. Without a call the policy picks its own boundary. */
    void (*set_prefix)(void *state, const sparq_attn_params *p, int64_t n_prefix,
                       const attn_index_source *src);
    /* Optional: the transfer formula when it depends on the state (topk:
     * prefix length, the layer's budget); used instead of transfer_formula
     * for decode steps when present. */
    int64_t (*transfer_formula_state)(const void *state, const sparq_attn_params *p, int layer,
                                      int64_t S, int d, int g);
    /* Optional: adds the policy's own counters (topk: recall, index time). */
    void (*stats)(const void *state, sparq_attn_stats *out);
    /* Optional, with attend_part: a step over S positions in n_parts(p, S)
     * independent parts (1: attend as a whole), so the model can share one
     * KV head's step between threads. attend_part computes part `part` into
     * step->out[g][d] and lse[g] for attn_merge_part (merged in order by the
     * caller); merging every part must give exactly attend's output. */
    int  (*n_parts)(const sparq_attn_params *p, int64_t S);
    int  (*attend_part)(void *state, const sparq_attn_params *p, const attn_step *step, int part,
                        float *lse, const float *shared);
    /* Optional, all three together, for a step whose parts need one
     * decision over every position first (SparQ's top-k). The caller keeps
     * shared_floats(p, S, d, g) floats per (sequence, KV head) for the
     * step, calls select once, then attend_part for every part (any order,
     * any thread) with the same shared, merges the parts in order and calls
     * finish on the merged step->out. Without them attend_part gets
     * shared = NULL. */
    size_t (*shared_floats)(const sparq_attn_params *p, int64_t S, int d, int g);
    int  (*select)(void *state, const sparq_attn_params *p, const attn_step *step, float *shared);
    void (*finish)(void *state, const sparq_attn_params *p, const attn_step *step, const float *shared);
} attn_policy;

/* Registry lookup by name; NULL if unknown. */
const attn_policy *attn_policy_find(const char *name);
/* The registry in order (help lists, `--attn all`): i < attn_policy_count(). */
int attn_policy_count(void);
const attn_policy *attn_policy_at(int i);
/* The registered names joined by sep into buf (truncated to size); returns
 * buf. ATTN_NAMES_MAX is room for them all. */
enum { ATTN_NAMES_MAX = 256 };
const char *attn_policy_names(char *buf, size_t size, const char *sep);

/* Dense decode attention over one KV head for its g queries, reading each
 * key/value row once for the whole group. Shared by policies that fall back
 * to dense. scratch: at least g*S floats. */
void attn_dense_group(const attn_kv_view *kv, const float *q, int g, float *out, float *scratch);

/* Long dense steps in parts. A dense step over S >= 2 * ATTN_PART positions
 * runs as attn_dense_parts(S) = S / ATTN_PART parts of ATTN_PART positions
 * (the last takes the rest): each a softmax over its positions with its
 * log-sum-exp, merged in order by attn_merge_part. The parts are
 * independent, so the model spreads one KV head over threads (three KV heads
 * on two cores left one core idle for half of every long step), and
 * attn_dense_group computes the same parts one after the other: the same
 * bits either way, on any number of threads, alone or in a batch. */
enum { ATTN_PART = 4096 };

static inline int attn_dense_parts(int64_t S)
{
    return S < 2 * ATTN_PART ? 1 : (int)(S / ATTN_PART);
}

/* Part `part` (< attn_dense_parts(kv->S)): out[g][d] the softmax-weighted V
 * over its positions, lse[g] the log-sum-exp of its scores. scratch: at
 * least g * (2 * ATTN_PART - 1) floats. */
void attn_dense_part(const attn_kv_view *kv, const float *q, int g, int part, float *out,
                     float *lse, float *scratch);
/* (out, lse) <- the softmax over both position sets, from (out, lse) and the
 * next part's (part_out, part_lse). */
void attn_merge_part(int g, int d, float *out, float *lse, const float *part_out,
                     const float *part_lse);

/* Gathered attention over positions sel[0..n_sel) (any order):
 * out[h] = softmax(q_h . K[sel] / sqrt(d)) V[sel]; scratch >= g*n_sel.
 * lse (NULL: not wanted) gets each head's log-sum-exp of its scores, -inf
 * over no rows (attn_merge_part). */
void attn_gather_group(const attn_kv_view *kv, const float *q, int g,
                       const int32_t *sel, int64_t n_sel, float *out, float *scratch, float *lse);

/* O(S) selection of the k largest values of x[0..n) (k <= n): writes their
 * indices to idx[0..k) in no particular order. Ties broken toward the lower
 * index. work: attn_topk_work(n) int32 values. */
void attn_topk_indices(const float *x, int64_t n, int64_t k, int32_t *idx, int32_t *work);

/* attn_topk_indices' work for n values: the candidates' positions and keys,
 * and the selection's two buffers beside them (attn.c). */
static inline size_t attn_topk_work(size_t n) { return 2 * n; }

/* The k-th largest of key[0..m) (1 <= k <= m), as attn_topk_kth_key, by
 * quickselect over attn_topk_partition; buf0 and buf1 hold m keys each
 * (key is not written). */
uint32_t attn_topk_kth_select(const uint32_t *key, int64_t m, int64_t k, uint32_t *buf0,
                              uint32_t *buf1);

/* ---- kernel building blocks (attn_kernels_ref.c, attn_kernels_avx2.c,
 * attn_kernels_avx512.c, attn_kernels_neon.c) - rows: positions to read,
 * or NULL for 0..n-1. Every kernel has a plain-C `_ref` twin and `_avx2`
 * and `_avx512` twins with the same signature (the NEON table has its own
 * for the f32/f16 kernels), gathered in the attn_kernels tables
 * (attn_kernels.h, which the twins include instead of this header); the
 * un-suffixed name runs the table of the level chosen at run time
 * (util/cpu.h).
 * Elements read: attn_scores and attn_weighted_sum n*d each,
 * attn_kt_logits n*r; each twin measures them into kv->meter (K, V or
 * K^T) when it is set. */

/* s[h*n + i] = (q_h . K[row_i]) / sqrt(d), for h < g, i < n. */
void attn_scores(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                 int64_t n, float *s);
/* In place, per head h < g: s[h*n .. h*n+n) = softmax(s[h*n .. h*n+n)). */
void attn_softmax(float *s, int g, int64_t n);
/* out[h*d + j] = sum_i w[h*n + i] * V[row_i][j]. */
void attn_weighted_sum(const attn_kv_view *kv, const float *w, int g, const int32_t *rows,
                       int64_t n, float *out);
/* SparQ step 2 from K^T rows: s[h*n + i] = sum_{c<r} qs[h*r + c] * KT[comp[c]][i]
 * for i < n (needs kv->KT). */
void attn_kt_logits(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                    int g, int64_t n, float *s);

/* Top-k's candidate pass: writes the i with x[i] >= t (NaN never) to idx
 * in increasing order and their attn_topk_key to key (same order); returns
 * their count. */
int64_t attn_topk_filter(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key);

/* out[h*d + j] = sum_i softmax(s[h*n .. h*n+n))_i * V[row_i][j]: attn_softmax
 * then attn_weighted_sum in one pass, the weights never stored (s is only
 * read). lse (NULL: not wanted) gets each head's log sum_i exp(s_i), which
 * merges softmaxes over disjoint position sets (attn_merge_part). Elements
 * read: n*d. */
void attn_softmax_weighted_sum(const attn_kv_view *kv, const float *s, int g,
                               const int32_t *rows, int64_t n, float *out, float *lse);

/* SparQ step 2 in one pass over K^T (needs kv->KT): per head h < g the logits
 *   l_h[i] = sum_{c<r} qs[h*r + c] * KT[comp[c]][i],  i < n,
 * go through softmax in blocks of ATTN_EXP_BLOCK positions, each block
 * exponentiated while in L1 against the running maximum m_b (the max of
 * l_h over blocks 0..b) and rescaled only at the end. With nb =
 * ceil(n / ATTN_EXP_BLOCK) and M the overall max:
 *   e[h*n + i]       = exp(l_h[i] - m_b)                    (b = i / ATTN_EXP_BLOCK)
 *   scale[h*nb + b]  = exp(m_b - M) / sum_i exp(l_h[i] - M)
 * so softmax(l_h)_i = scale[h*nb + b] * e[h*n + i], except that each of
 * e and scale is stored as exactly 0 where below ATTN_SCORE_MIN (2^-63,
 * attn_score_flush), so their products are 0 or normal floats.
 * lsum, unless NULL, gets sum_h l_h[i] (SparQ's select_logits score).
 * Elements read: n*r. */
void attn_kt_exp(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                 int64_t n, float *e, float *scale, float *lsum);

/* out[i] = sum_{h<g} scale[h*nb + i / ATTN_EXP_BLOCK] * e[h*n + i] for
 * i < m <= n, nb = ceil(n / ATTN_EXP_BLOCK): attn_kt_exp's softmax rows
 * summed over the group. */
void attn_scaled_head_sum(const float *e, const float *scale, int g, int64_t n, int64_t m,
                          float *out);

/* Top-k's exact threshold: the largest t with #{i < m : key[i] >= t} >= k
 * (1 <= k <= m), i.e. the k-th largest key. Keys order floats (attn.c). */
uint32_t attn_topk_kth_key(const uint32_t *key, int64_t m, int64_t k);

/* Quickselect's pass: the keys of key[0..m) above p to out[0..n_hi), those
 * below p to out[m - n_lo..m), each side in no particular order (those
 * equal to p, m - n_hi - n_lo of them, are not written); returns n_hi. */
int64_t attn_topk_partition(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out, int64_t *n_lo);

/* Top-k's emit pass: writes pos[j] (pos NULL: j) for the j < m with
 * key[j] > t to idx in increasing j; returns their count. */
int64_t attn_topk_above(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t,
                        int32_t *idx);

/* The table `level` runs (its own twins or, without them, the reference):
 * the dispatch above, here and not in attn_kernels.h, so no twin sees it. */
const attn_kernels *attn_kernels_at(cpu_level level);

/* Exact scores for all S positions, keep the k (<= S used) positions with
 * the largest group-summed softmax weights; renorm != 0 renormalises each
 * head's softmax over them (oracle), renorm == 0 keeps the weights as they
 * are (FlexGen). Reads S*d of K and min(k,S)*d of V. Scratch: at least
 * attn_exact_topk_scratch(S, k, g) floats and int32s. trace may be NULL. */
size_t attn_exact_topk_scratch(int64_t S, int64_t k, int g);
void attn_exact_topk_group(const attn_kv_view *kv, const float *q, int g, int64_t k, int renorm,
                           float *out, attn_scratch *scratch, attn_trace *trace);
/* The policy-table entries the two exact top-k policies (flexgen, oracle)
 * share: k defaults to 128 and must be >= 1 (name: the policy, for the
 * message); their scratch; their transfer, S*d (K) + min(k,S)*d (V of the
 * kept rows) + 2*d (k, v appended). */
int     attn_exact_topk_resolve(const char *name, sparq_attn_params *p, char *err, size_t err_size);
size_t  attn_exact_topk_scratch_floats(const sparq_attn_params *p, int64_t S, int d, int g);
int64_t attn_exact_topk_transfer(const sparq_attn_params *p, int64_t S, int d, int g);

/* out[i] = sum_{h<g} x[h*n + i]: a group's per-head rows summed. */
void attn_sum_heads(const float *x, int g, int64_t n, float *out);

/* IEEE half -> float: tensor/quant.h's fp16_to_fp32, the one converter
 * (NaN made quiet as F16C does); this name stays for existing callers. */
static inline float attn_f16_to_f32(uint16_t h) { return fp16_to_fp32(h); }

/* Scratch layout helper: n rounded up to 16 floats (64 bytes). */
static inline size_t attn_pad16(size_t n) { return (n + 15) & ~(size_t)15; }

/* ---- top-k attention's prefix indexes (attn_topk.c) -------------------- */

/* The budget of `layer` (0..n_layer-1) under p (resolved): p->k everywhere,
 * or with SPARQ_TOPK_LINEAR a non-decreasing ramp k_l ~ 2k(l+1)/(L+1), at
 * least 1, with the same total n_layer * k (exact unless k is so small
 * that the floor of 1 per layer forbids it). */
int attn_topk_layer_k(const sparq_attn_params *p, int n_layer, int layer);
/* Builds the index of `kind` over positions [0, n) of kv and returns its
 * serialized image (*image: 64-byte aligned, release with free()): for
 * exact/ivf/hnsw idx_serialize's layout (index.h), built with p's
 * index_key_type and ivf_nlist; for "sparq" K^T (layout in attn_topk.c).
 * n_threads: build threads (0 = all). Returns 0, or -1 with a message. */
int attn_topk_index_image(const sparq_attn_params *p, const char *kind, const attn_kv_view *kv,
                          int64_t n, int n_threads, void **image, size_t *bytes, char *err,
                          size_t err_size);
/* The ivf image of the first n keys of kv packed into lists already made
 * (a sparse prefill's growing inverted file): nlist centroids [nlist][d]
 * and the list of every key, labels[n]; no k-means, no second pass. */
int attn_topk_ivf_image_preset(const sparq_attn_params *p, const attn_kv_view *kv, int64_t n, int nlist,
                               const float *centroids, const int32_t *labels, void **image, size_t *bytes,
                               char *err, size_t err_size);
/* The selection step of one decode step alone (what attend uses): for each
 * query head h its layer's k best prefix positions by the index, ids[h*k +
 * r] (rank order for exact/ivf/hnsw; -1 pads a short result). Returns k,
 * 0 when the step is dense (k >= prefix), or -1 if the index is missing.
 * ids: room for g * attn_topk_layer_k(...) values. */
int attn_topk_select(void *state, const sparq_attn_params *p, int layer, int kv_head,
                     const attn_kv_view *kv, const float *q, int g, int32_t *ids,
                     attn_scratch *scratch);

/* The policies the registry knows (one file each). */
extern const attn_policy attn_policy_dense, attn_policy_sparq, attn_policy_oracle,
    attn_policy_flexgen, attn_policy_h2o, attn_policy_streaming, attn_policy_topk;

#endif
