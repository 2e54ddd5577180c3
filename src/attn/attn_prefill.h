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
#include "attn/attn_prefill_kernels.h"


/* Query tokens per block for group size g (rows = tokens x g near 32). */
int attn_prefill_bq(int g);

/* Scratch floats one call needs (per thread). */
size_t attn_prefill_scratch(int d, int g);

/* A block of query rows: nt tokens at positions pos0 .. pos0+nt-1, each
 * with the g query heads of one KV head. Row (t, j) is q + t * q_stride +
 * j * d; its output goes to out + t * out_stride + j * d (out unused by
 * attn_prefill_colsum). */
typedef struct attn_pf_rows {
    int64_t      pos0;
    int          nt, g;
    const float *q;
    size_t       q_stride;
    float       *out;
    size_t       out_stride;
} attn_pf_rows;

/* The nt tokens from token t0 of q and out packed as [tokens][g][d] (both
 * strides g * d; out may be NULL), at positions pos0 + t0 on. */
static inline attn_pf_rows attn_pf_rows_packed(int64_t pos0, int t0, int nt, int g, int d, const float *q,
                                               float *out)
{
    const size_t stride = (size_t)g * d;
    return (attn_pf_rows){.pos0 = pos0 + t0,
                          .nt = nt,
                          .g = g,
                          .q = q + (size_t)t0 * stride,
                          .q_stride = stride,
                          .out = out ? out + (size_t)t0 * stride : NULL,
                          .out_stride = stride};
}

/* Causal attention of the rows of b (token t sees keys 0..pos0+t of kv,
 * kv->S >= pos0 + nt). ml (may be NULL): receives the final running max and
 * sum of every row, ml[2 * (t * g + j)] = m, [.. + 1] = l, in units of the
 * scaled scores, for attn_prefill_colsum. */
void attn_prefill_block(const attn_kv_view *kv, const attn_pf_rows *b, float *ml, float *scratch);
void attn_prefill_block_ref(const attn_kv_view *kv, const attn_pf_rows *b, float *ml, float *scratch);

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
void attn_prefill_block_segs(const attn_kv_view *kv, const attn_pf_seg *seg, int n_seg, const attn_pf_rows *b,
                             float *scratch);
void attn_prefill_block_segs_ref(const attn_kv_view *kv, const attn_pf_seg *seg, int n_seg, const attn_pf_rows *b,
                                 float *scratch);

/* Column sums of the softmax weights (what H2O accumulates) for the keys
 * [k0, k0 + nk) (nk <= ATTN_PF_BK), over the rows of b (any number of
 * tokens; token t, head j, statistics ml from attn_prefill_block):
 * colsum[k - k0] = sum over rows that see key k of exp(s - m) / l. Key
 * blocks are independent, so threads split them without sharing a sum. */
void attn_prefill_colsum(const attn_kv_view *kv, int64_t k0, int nk, const attn_pf_rows *b, const float *ml,
                         float *colsum, float *scratch);
void attn_prefill_colsum_ref(const attn_kv_view *kv, int64_t k0, int nk, const attn_pf_rows *b, const float *ml,
                             float *colsum, float *scratch);

/* The row primitives' set `level` runs (attn_prefill_kernels.h; util/cpu.h):
 * the dispatch, here and not beside the twins, so no twin sees it. The
 * un-suffixed entry points use the level chosen at run time. */
const attn_pf_ops *attn_pf_ops_at(cpu_level level);

#endif
