/* kvcache.h - the per-sequence key/value cache.
 *
 * Layout, per layer and KV head, positions contiguous so one head's keys are
 * one sequential read:
 *   k, v  [n_layer][n_kv_head][cap][d]     element f16 (default), f32 or
 *                                          Q8_0 (rows of blocks, attn.h)
 *   kt    [n_layer][n_kv_head][d][kt_len]  K transposed, only when a policy
 *                                          asks (SparQ reads r of its rows);
 *                                          Q8_0 blocks run along positions;
 *                                          kt_len >= cap (kv_kt_len)
 *   v_sum [n_layer][n_kv_head][d]          f32 running sum of V (SparQ)
 * Storage is reserved with mmap(MAP_NORESERVE): capacity costs address
 * space, not memory, and pages are committed as tokens arrive, so
 * appending is O(d) per head and never moves existing data.
 * kv_create_borrowed instead uses storage owned by someone else, e.g. a
 * private mapping of a KV cache file (kvfile.h) holding a prefix: reads
 * come from the file page by page, writes go to private pages.
 */
#ifndef SPARQ_KVCACHE_H
#define SPARQ_KVCACHE_H

#include <stddef.h>
#include <stdint.h>
#include "attn/attn.h"

struct kv_shared;

typedef struct kv_cache {
    int     n_layer, n_kv_head, d;
    int64_t cap;            /* positions reserved                          */
    int64_t n;              /* positions written (the same for all layers) */
    int64_t n_max;          /* most positions held before the last reset:
                             * own pages already committed, so copying into
                             * them costs no page faults                    */
    int     elem;           /* KV_F32, KV_F16 or KV_Q8_0                   */
    size_t  elem_size;      /* whole bytes: 4, 2, or 1 for Q8_0 (really
                             * 34/32: kv_bytes_of counts its bytes)       */
    size_t  row_bytes;      /* one K or V row: attn_kv_row_bytes(elem, d) */
    int64_t kt_len;         /* positions a row of kt is laid out for: cap,
                             * or more for a stride kv_kt_len prefers     */
    size_t  kt_row_bytes;   /* one row of kt: attn_kv_row_bytes(elem,
                             * kt_len - kt_split)                         */
    size_t  kt_head_bytes;  /* d rows of kt                               */
    /* A cache over a shared prefix reads K^T columns [0, kt_split) from
     * the prefix's own K^T (kt_pre: rows of kt_pre_len columns, read-only)
     * and keeps columns [kt_split, cap) in kt, rows packed at kt_row_bytes,
     * so appending a position writes a few private pages, not one shared
     * page per K^T row (each copied on write). kt_split is a multiple of
     * ATTN_EXP_BLOCK; 0 and kt_pre NULL otherwise. kt is reserved at full
     * width either way, so dropping the split needs no allocation. */
    const uint8_t *kt_pre;
    int64_t kt_pre_len;
    int64_t kt_split;
    /* a copied prefix (kv_copy_shared) whose K^T is read in place: the
     * shared prefix kt_pre points into, held until the split is dropped */
    struct kv_shared *kt_ref;
    float   *kt_part;       /* Q8_0 K^T: f32 keys of the newest block     */
    int64_t *kt_part_blk;   /* [n_layer] block held in kt_part, or -1     */
    uint8_t *k, *v;         /* see layout above                            */
    uint8_t *kt;            /* NULL unless with_kt                         */
    float   *v_sum;         /* NULL unless with_vsum                       */
    size_t  kv_bytes, kt_bytes; /* sizes of the k (= v) and kt mappings    */
    /* kv_create_borrowed: k, v (and kt when kt_borrowed) are the caller's;
     * kv_free calls owner_free(owner) when both are set. */
    int     kv_borrowed, kt_borrowed;
    void   *owner;
    void  (*owner_free)(void *owner);
} kv_cache;

/* Reserves a cache; returns 0, or -1 with a message (e.g. address space). */
int  kv_create(kv_cache *c, int n_layer, int n_kv_head, int d, int64_t cap, int elem,
               int with_kt, int with_vsum, char *err, size_t err_size);
void kv_free(kv_cache *c);

/* Positions a K^T row of a fresh cache of cap positions is laid out for:
 * cap, padded for f16 and f32 to an odd number of 64-byte lines. SparQ
 * reads r rows of K^T side by side, and rows an even number of lines
 * apart a little above 64 KiB made that pass 1.7-2.1x slower on a Zen 5
 * guest (docs/bench-results/kt-stride-2026-12-07-f26); odd counts never
 * did. Q8_0 rows (34-byte blocks) did not show it and stay at cap. */
int64_t kv_kt_len(int elem, int64_t cap);

/* Storage someone else owns that a cache may run over (kv_create_borrowed). */
typedef struct kv_borrow {
    int          n_layer, n_kv_head, d;
    int64_t      cap;        /* positions the storage has room for           */
    int          elem;       /* KV_F32, KV_F16 or KV_Q8_0                    */
    uint8_t     *k, *v;      /* [n_layer][n_kv_head][cap][d] rows            */
    uint8_t     *kt;         /* [n_layer][n_kv_head][d][cap] K^T, or NULL    */
    int64_t      n;          /* positions k and v already hold               */
    const float *v_sum;      /* [n_layer][n_kv_head][d] f32 sum of V over the
                              * n positions, or NULL                         */
    int          with_kt;    /* the cache keeps K^T (ATTN_NEEDS_KT)          */
    int          with_vsum;  /* the cache keeps the sum of V (ATTN_NEEDS_VSUM) */
    void        *owner;      /* handed to owner_free by kv_free, or NULL     */
    void       (*owner_free)(void *owner);
} kv_borrow;

/* A cache over b's storage. with_kt without kt reserves a K^T and fills its
 * first n columns from k (Q8_0: K^T blocks are quantized from K's already
 * rounded rows); with_vsum copies v_sum or, if NULL, sums v in position
 * order as kv_write does. On success the cache owns b->owner (kv_free
 * calls owner_free(owner)); on failure (-1 and a message) the caller keeps
 * it. */
int  kv_create_borrowed(kv_cache *c, const kv_borrow *b, char *err, size_t err_size);

/* ---- shared read-only prefixes ---------------------------------------------
 * kv_shared holds the first n positions of a cache, laid out exactly as a
 * cache of capacity cap (k, v, and K^T once a user needs it), in one memfd
 * mapped MAP_SHARED by its creator. kv_create_cow gives a cache a
 * MAP_PRIVATE mapping of it: the prefix pages are the memfd's pages (one
 * physical copy however many caches map it), pages the cache writes past
 * the prefix become private (copy on write). v_sum is computed once and
 * copied (it is small). Reference counted: every cache mapping it holds a
 * reference, so kv_shared_unref by its owner never pulls pages from under
 * a live cache. K^T is src's when it has one (Q8_0: when n is a multiple
 * of 32), else built from K in the shared memory by the first user that
 * asks for it (under the object's mutex; for Q8_0 then from K's rounded
 * rows, as kv_create_borrowed does), never written afterwards. */
typedef struct kv_shared kv_shared;

/* A shared copy of src's first n positions for caches of capacity cap
 * (n <= src->n, n <= cap). 0, or -1 with a message. */
int     kv_shared_create(const kv_cache *src, int64_t n, int64_t cap, kv_shared **out, char *err, size_t err_size);
void    kv_shared_unref(kv_shared *s);
int64_t kv_shared_n(const kv_shared *s);
int64_t kv_shared_cap(const kv_shared *s);
int     kv_shared_elem(const kv_shared *s);
/* Bytes of the shared memory holding data (K and V rows, K^T once built). */
size_t  kv_shared_bytes(const kv_shared *s);
/* Caches currently mapping s. */
int     kv_shared_users(const kv_shared *s);
/* A cache over a private (copy-on-write) mapping of s holding its first
 * n <= kv_shared_n(s) positions; shape must match s's. with_kt maps the
 * shared K^T (built first if no user needed it yet); with_vsum copies or
 * sums V. On failure c is zeroed. */
int     kv_create_cow(kv_cache *c, kv_shared *s, int n_layer, int n_kv_head, int d, int64_t n,
                      int with_kt, int with_vsum, char *err, size_t err_size);

/* Copies s's first n <= kv_shared_n(s) positions into c, an empty cache of
 * its own storage and of s's shape, with n_threads threads: K and V rows,
 * the V sums, and K^T as kv_create_cow shows it (whole blocks read in place
 * from s, built there first if no user needed it yet, c a user of s until
 * its reset or free; the rest copied). Where c's pages are committed (a
 * reset cache that held n positions) this is a memcpy; a fresh private
 * mapping of s instead costs a page fault per 4 KiB page on first touch,
 * which some hypervisors make slow (a shadow page-table entry each). 0,
 * or -1 with a message (c unchanged). */
int     kv_copy_shared(kv_cache *c, kv_shared *s, int64_t n, int n_threads, char *err, size_t err_size);

/* Stores position `pos` of `layer`: k[n_kv_head][d], v[n_kv_head][d]
 * (f32; rounded to the cache element type). Updates kt and v_sum. The
 * caller advances c->n once every layer has been written. */
void kv_write(kv_cache *c, int layer, int64_t pos, const float *k, const float *v);

/* Bytes of `elements` cache elements (Q8_0: 34 per 32, rounded up). */
int64_t kv_bytes_of(const kv_cache *c, int64_t elements);

/* Pointers to the first element of a head's rows. */
const void *kv_k(const kv_cache *c, int layer, int head);
const void *kv_v(const kv_cache *c, int layer, int head);

/* The attention view of (layer, head) over positions [0, S). */
void kv_view(const kv_cache *c, int layer, int head, int64_t S, attn_kv_view *out);

/* Context shift: drops positions [n_keep, n_keep + n_discard) and moves
 * the later ones down by n_discard, rotating each moved key by the angles
 * cs[rope_dim/2][cos, sin] (RoPE of position -n_discard, no magnitude
 * scale) over its first rope_dim components, NEOX pairing (i, i+half) if
 * neox else (2i, 2i+1). K^T columns follow; V sums are summed again.
 * Q8_0: moved keys are dequantized, rotated and quantized again, and K^T
 * blocks from n_keep's on are rebuilt from K's rows.
 * Returns 0, or -1 on bad arguments / out of memory (cache unchanged). */
int kv_shift(kv_cache *c, int64_t n_keep, int64_t n_discard, const float *cs, int rope_dim, int neox);

/* Forgets every position (memory stays reserved; sums are zeroed). */
void kv_reset(kv_cache *c);

#endif
