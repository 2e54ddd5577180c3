/* attn_prefill.h - tiled exact causal attention for a prefill batch.
 *
 * The decode-style prefill ran one pass over the whole cache per token, so
 * every key and value row was re-read for every query. Here a block of
 * queries (ATTN_PF_BQ tokens x the g heads of one KV head's group) meets
 * the keys one block of ATTN_PF_BK rows at a time, with an online softmax
 * (running max m and sum l per query row, f32), so each K/V tile is read
 * (and widened from f16) once per query block and the memory per thread is
 * O(tile), whatever the context length (flash-attention's scheme).
 *
 * Numerics: the same maths as attn_dense_group in another summation order
 * (and, in the AVX-512 twin, a polynomial exp about 2e-7 from expf).
 *
 * Queries: token t of the block, head j of the group at
 * q + t * q_stride + j * d; outputs in the same layout.
 */
#ifndef SPARQ_ATTN_PREFILL_H
#define SPARQ_ATTN_PREFILL_H

#include "attn/attn.h"

enum { ATTN_PF_BK = 32 };

/* Query tokens per block for group size g (rows = tokens x g near 32). */
int attn_prefill_bq(int g);

/* Scratch floats one call needs (per thread). */
size_t attn_prefill_scratch(int d, int g);

/* Causal attention of nt query tokens at positions pos0 .. pos0+nt-1 (token
 * t sees keys 0..pos0+t of kv, kv->S >= pos0 + nt) for the g heads of one
 * KV head. ml (may be NULL): receives the final running max and sum of
 * every row, ml[2 * (t * g + j)] = m, [.. + 1] = l, in units of the scaled
 * scores, for attn_prefill_colsum. */
void attn_prefill_block(const attn_kv_view *kv, int64_t pos0, int nt, const float *q, size_t q_stride,
                        int g, float *out, size_t out_stride, float *ml, float *scratch);
void attn_prefill_block_ref(const attn_kv_view *kv, int64_t pos0, int nt, const float *q, size_t q_stride,
                            int g, float *out, size_t out_stride, float *ml, float *scratch);

/* A part of the keys a query block sees: the contiguous positions [lo, hi)
 * (clipped causally per row, as attn_prefill_block does), or, when pos is
 * not NULL, the n positions pos[0..n) gathered (each older than every row
 * of the block: all visible). Sparse prefills (attn_pf_sparse.h) give a
 * block its sink, selected and window segments; a single segment
 * [0, pos0 + nt) is attn_prefill_block, bit for bit. */
typedef struct attn_pf_seg {
    int64_t        lo, hi;
    const int32_t *pos;
    int            n;
} attn_pf_seg;

/* attn_prefill_block over the keys of n_seg segments, in their order. */
void attn_prefill_block_segs(const attn_kv_view *kv, const attn_pf_seg *seg, int n_seg, int64_t pos0, int nt,
                             const float *q, size_t q_stride, int g, float *out, size_t out_stride,
                             float *scratch);
void attn_prefill_block_segs_ref(const attn_kv_view *kv, const attn_pf_seg *seg, int n_seg, int64_t pos0,
                                 int nt, const float *q, size_t q_stride, int g, float *out,
                                 size_t out_stride, float *scratch);

/* Column sums of the softmax weights (what H2O accumulates) for the keys
 * [k0, k0 + nk) (nk <= ATTN_PF_BK), over the n queries at pos0.. (token
 * t, head j, statistics ml from attn_prefill_block): colsum[k - k0] =
 * sum over rows that see key k of exp(s - m) / l. Key blocks are
 * independent, so threads split them without sharing a sum. */
void attn_prefill_colsum(const attn_kv_view *kv, int64_t k0, int nk, int64_t pos0, int n, const float *q,
                         size_t q_stride, int g, const float *ml, float *colsum, float *scratch);
void attn_prefill_colsum_ref(const attn_kv_view *kv, int64_t k0, int nk, int64_t pos0, int n,
                             const float *q, size_t q_stride, int g, const float *ml, float *colsum,
                             float *scratch);

/* ---- implementation detail (attn_prefill*.c) ----------------------------
 * The tile loops are written once (attn_prefill.c) over these row
 * primitives; the plain-C set is the reference, attn_prefill_avx512.c and
 * attn_prefill_avx2.c the SIMD twins. kt is a key tile transposed,
 * [d][ATTN_PF_BK]; v a value tile
 * [nk][d]. The primitives take up to ATTN_PF_R query rows at once, so one
 * load of a key or value vector serves them all (one row at a time they
 * were load-bound); each row's arithmetic is the same, in the same order,
 * whatever the rows beside it. */
enum { ATTN_PF_R = 4 };
typedef struct attn_pf_ops {
    /* s[r * ATTN_PF_BK + k] = scale * q[r] . key k, every k < ATTN_PF_BK */
    void (*scores)(const float *const *q, int nr, const float *kt, int d, float scale, float *s);
    /* s[k] = exp(s[k] - m), k < nk; returns their sum */
    float (*expsum)(float *s, int nk, float m);
    /* o[r] = o[r] * c[r] + sum_k p[r * ATTN_PF_BK + k] v[k], k < nk */
    void (*pv)(const float *p, int nr, const float *v, int nk, int d, const float *c, float *const *o);
} attn_pf_ops;
extern const attn_pf_ops attn_pf_ops_ref;
extern const attn_pf_ops attn_pf_ops_avx512;
extern const attn_pf_ops attn_pf_ops_avx2;
extern const attn_pf_ops attn_pf_ops_neon, attn_pf_ops_neondp; /* attn_prefill_neon.c's two builds */
/* The set `level` runs (util/cpu.h); the un-suffixed entry points use the
 * level chosen at run time. */
const attn_pf_ops *attn_pf_ops_at(cpu_level level);

#endif
