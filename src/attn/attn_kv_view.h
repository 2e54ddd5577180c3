/* attn_kv_view.h - what a KV cache holds for one (layer, KV head), as the
 * attention kernels and policies read it: element types, the Q8_0 row
 * layout, the view itself and the meter its readers count into.
 *
 * The lowest module of attn/: the kernels (attn_kernels.h), the policies,
 * the prefill and the KV cache all read views, and none of them is below
 * another, so the view and its layout helpers live here rather than in
 * attn.h, where every kernel twin would depend on the dispatcher.
 */
#ifndef SPARQ_ATTN_KV_VIEW_H
#define SPARQ_ATTN_KV_VIEW_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "tensor/quant.h"

enum { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2 };   /* element type of K, V and K^T */

/* KV_Q8_0 rows: a row of len elements is ceil(len / 32) blocks, block b
 * holding elements [32b, min(32b + 32, len)) as an f16 scale followed by
 * one int8 per element (x = scale * q), so a full block is ggml's 34-byte
 * block_q8_0 and a short last block (head size not a multiple of 32) takes
 * 2 + its length bytes. K and V rows run along the head dimension, K^T rows
 * (one per component) along positions. A dequantized value is an f16 times
 * an int8: exactly representable in f32. */
enum { ATTN_Q8_BLOCK = 32, ATTN_Q8_BLOCK_BYTES = 34 };

static inline size_t attn_q8_row_bytes(int64_t len)
{
    return (size_t)(2 * ((len + ATTN_Q8_BLOCK - 1) / ATTN_Q8_BLOCK) + len);
}

/* Bytes of one row of len elements of type elem. */
static inline size_t attn_kv_row_bytes(int elem, int64_t len)
{
    return elem == KV_Q8_0 ? attn_q8_row_bytes(len) : (size_t)len * (elem == KV_F16 ? 2 : 4);
}

/* Element i of a Q8_0 row. */
static inline float attn_q8_at(const uint8_t *row, int64_t i)
{
    const uint8_t *b = row + (size_t)(i / ATTN_Q8_BLOCK) * ATTN_Q8_BLOCK_BYTES;
    uint16_t h;
    memcpy(&h, b, 2);
    return fp16_to_fp32(h) * (float)(int8_t)b[2 + i % ATTN_Q8_BLOCK];
}

/* Element (row, col) of a matrix of elem whose rows are len elements. */
static inline float attn_kv_at(const void *base, int elem, int64_t len, int64_t row, int64_t col)
{
    if (elem == KV_Q8_0) return attn_q8_at((const uint8_t *)base + (size_t)row * attn_q8_row_bytes(len), col);
    if (elem == KV_F16) return fp16_to_fp32(((const uint16_t *)base)[row * len + col]);
    return ((const float *)base)[row * len + col];
}

/* Q8_0 row of n elements (layout above): per block scale = max|x| / 127,
 * q = round(x / scale); an all-zero block stores scale 0. */
void attn_q8_quantize_row(const float *x, int64_t n, uint8_t *out);
/* Elements [0, n) of row `row` (rows of len elements) widened to f32. */
void attn_kv_row_f32(const void *base, int elem, int64_t len, int64_t row, int64_t n, float *out);

/* What the kernels measured they read of the cache, in elements of its
 * type (v_sum: f32 values). Each kernel adds, once per loop, the rows its
 * row loop visited times the components its tiles covered, so a kernel
 * that skipped or repeated rows shows in the count (tests/test_attn.c
 * compares it with the formula of docs/ALGORITHMS.md
 * "Transfer formulas"). Rows are counted for a group's
 * first query head: the group's other heads read the same rows from cache
 * (one row serves the group, attn.c). */
typedef struct attn_meter {
    int64_t k;      /* K elements: rows scored x d                      */
    int64_t v;      /* V elements: rows weighted x d                    */
    int64_t kt;     /* K^T elements: component rows x positions         */
    int64_t v_sum;  /* f32 running-sum values read                      */
} attn_meter;

static inline int64_t attn_meter_total(const attn_meter *m)
{
    return m->k + m->v + m->kt + m->v_sum;
}

/* What the KV cache holds for one (layer, kv_head), positions 0..S-1, the
 * current token (position S-1) already appended. */
typedef struct attn_kv_view {
    int64_t     S;         /* positions, current one included             */
    int         d;         /* head size                                   */
    int         elem;      /* KV_F32, KV_F16 or KV_Q8_0                   */
    const void *K;         /* [S][d], rows attn_kv_row_bytes(elem, d)     */
    const void *V;         /* [S][d]                                      */
    const void *KT;        /* [d][kt_stride]: K transposed, or NULL        */
    int64_t     kt_stride; /* elements between rows of KT (Q8_0: each row
                            * is kt_stride elements, attn_q8_row_bytes)   */
    const float *v_sum;    /* [d] f32 sum of V over all S, or NULL        */
    attn_meter  *meter;    /* kernels add what they read here, or NULL:
                            * policies point it at their own per-call
                            * meter (a copy of the view), so a view from
                            * kv_view or a positional initialiser has it
                            * NULL                                        */
    /* K^T in two pieces (a cache over a shared prefix: the prefix's
     * columns are read where the prefix keeps them, the cache's own in
     * its own memory, so appending a position never writes a shared
     * page). When KT_tail is set, column i >= kt_split of row c is column
     * i - kt_split of row c of KT_tail (rows kt_tail_stride elements);
     * KT holds the columns below. kt_split is a multiple of
     * ATTN_EXP_BLOCK, so no block or tile of the kernels straddles it.
     * NULL / 0 (a positional initialiser's default): one piece.       */
    const void *KT_tail;
    int64_t     kt_split;
    int64_t     kt_tail_stride;
} attn_kv_view;

/* Key rows [a, b) of a view widened to f32, malloc'ed [b - a][d]; NULL
 * when out of memory (index builds and the sparse prefill's k-means). */
float *attn_kv_keys_f32(const attn_kv_view *kv, int64_t a, int64_t b);

/* K^T row c of a view and the column of position i in it (i and the
 * returned column are relative to that row's start). */
static inline const void *attn_kt_row(const attn_kv_view *kv, int c, int64_t i, int64_t *col)
{
    if (kv->KT_tail && i >= kv->kt_split) {
        *col = i - kv->kt_split;
        return (const uint8_t *)kv->KT_tail + (size_t)c * attn_kv_row_bytes(kv->elem, kv->kt_tail_stride);
    }
    *col = i;
    return (const uint8_t *)kv->KT + (size_t)c * attn_kv_row_bytes(kv->elem, kv->kt_stride);
}

#endif
