/* kvcache.h - the per-sequence key/value cache.
 *
 * Layout, per layer and KV head, positions contiguous so one head's keys are
 * one sequential read:
 *   k, v  [n_layer][n_kv_head][cap][d]     element f16 (default) or f32
 *   kt    [n_layer][n_kv_head][d][cap]     K transposed, only when a policy
 *                                          asks (SparQ reads r of its rows)
 *   v_sum [n_layer][n_kv_head][d]          f32 running sum of V (SparQ)
 * Storage is reserved with mmap(MAP_NORESERVE): capacity costs address
 * space, not memory, and pages are committed as tokens arrive, so
 * appending is O(d) per head and never moves existing data.
 */
#ifndef SPARQ_KVCACHE_H
#define SPARQ_KVCACHE_H

#include <stddef.h>
#include <stdint.h>
#include "attn.h"

typedef struct kv_cache {
    int     n_layer, n_kv_head, d;
    int64_t cap;            /* positions reserved                          */
    int64_t n;              /* positions written (the same for all layers) */
    int     elem;           /* KV_F32 or KV_F16                            */
    size_t  elem_size;
    uint8_t *k, *v;         /* see layout above                            */
    uint8_t *kt;            /* NULL unless with_kt                         */
    float   *v_sum;         /* NULL unless with_vsum                       */
    size_t  kv_bytes, kt_bytes; /* sizes of the k (= v) and kt mappings    */
} kv_cache;

/* Reserves a cache; returns 0, or -1 with a message (e.g. address space). */
int  kv_create(kv_cache *c, int n_layer, int n_kv_head, int d, int64_t cap, int elem,
               int with_kt, int with_vsum, char *err, size_t err_size);
void kv_free(kv_cache *c);

/* Stores position `pos` of `layer`: k[n_kv_head][d], v[n_kv_head][d]
 * (f32; rounded to the cache element type). Updates kt and v_sum. The
 * caller advances c->n once every layer has been written. */
void kv_write(kv_cache *c, int layer, int64_t pos, const float *k, const float *v);

/* Pointers to the first element of a head's rows. */
const void *kv_k(const kv_cache *c, int layer, int head);
const void *kv_v(const kv_cache *c, int layer, int head);

/* The attention view of (layer, head) over positions [0, S). */
void kv_view(const kv_cache *c, int layer, int head, int64_t S, attn_kv_view *out);

/* Forgets every position (memory stays reserved; sums are zeroed). */
void kv_reset(kv_cache *c);

#endif
