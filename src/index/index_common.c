/* index_common.c - what every index kind calls, below the kinds and their
 * registry (index.c), so that no kind calls back into the file that lists
 * it: the serialized image's framing (header, 64-byte sections), the thread
 * count, the search scratch's growth. Declared in index.h.
 */
#include "util/err.h"
#include "index/index.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

void idx_header_write(const idx_header *h, uint8_t *dst)
{
    memset(dst, 0, IDX_HEADER_BYTES);
    memcpy(dst, IDX_MAGIC, 8);
    put32(dst + 8, 1);
    put32(dst + 12, h->kind);
    put32(dst + 16, h->key_type);
    put32(dst + 20, h->d);
    put64(dst + 24, (uint64_t)h->n);
    put64(dst + 32, h->total_bytes);
    put64(dst + 40, (uint64_t)h->n_blocks);
    const int32_t f[7] = { h->nlist, h->nprobe, h->hnsw_m, h->ef_search,
                           h->ef_construction, h->max_level, h->entry_point };
    for (int i = 0; i < 7; i++) put32(dst + 48 + 4 * i, (uint32_t)f[i]);
}

/* Appends a section of `bytes` at the 64-aligned end; -1 on overflow. */
int idx_section(size_t *end, int64_t count, size_t elt, size_t *off)
{
    size_t bytes;
    if (count < 0 || __builtin_mul_overflow((size_t)count, elt, &bytes)) return -1;
    *off = align64(*end);
    if (*off < *end || __builtin_add_overflow(*off, bytes, end)) return -1;
    return 0;
}

uint8_t *idx_image_alloc(idx_header *h, size_t total, char *err, size_t err_size)
{
    uint8_t *img = aligned_alloc(64, align64(total));
    if (!img) {
        err_set(err, err_size, "idx_build: out of memory for a %zu-byte index", total);
        return NULL;
    }
    memset(img, 0, align64(total));
    h->total_bytes = total;
    idx_header_write(h, img);
    return img;
}

int idx_image_end(size_t end, size_t *total)
{
    *total = align64(end);
    return *total < end ? -1 : 0;
}

int idx_threads(int n_threads)
{
    int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
    return nt < 1 ? 1 : nt;
}

static void *alloc_array(int64_t count, size_t elt)
{
    size_t bytes;
    if (count < 0 || __builtin_mul_overflow((size_t)count, elt, &bytes)) return NULL;
    return malloc(bytes ? bytes : 1);
}

/* Replaces an array by a fresh one of count elements (contents not kept). */
#define REGROW(field, count)                                        \
    do {                                                            \
        void *q_ = alloc_array((count), sizeof *(field));           \
        if (!q_) goto oom;                                          \
        free(field);                                                \
        (field) = q_;                                               \
    } while (0)

int idx_scratch_grow(idx_scratch *s, int n_thr, int g, int cap, int64_t nl, int64_t hnsw_gk,
                     char *err, size_t err_size)
{
    if (n_thr > s->n_thr || g > s->g || cap > s->cap) {
        int T = n_thr > s->n_thr ? n_thr : s->n_thr, G = g > s->g ? g : s->g;
        int C = cap > s->cap ? cap : s->cap;
        s->n_thr = s->g = s->cap = 0; /* until every array has the new size */
        REGROW(s->s, (int64_t)T * G * C);
        REGROW(s->id, (int64_t)T * G * C);
        REGROW(s->tk, (int64_t)T * G);
        REGROW(s->blk, (int64_t)T * G * IDX_BLOCK);
        s->n_thr = T;
        s->g = G;
        s->cap = C;
    }
    if (nl > s->nl) {
        s->nl = 0;
        REGROW(s->ls, nl);
        REGROW(s->li, nl);
        REGROW(s->lmark, nl);
        s->nl = nl;
    }
    if (nl * g > s->ncs) {
        s->ncs = 0;
        REGROW(s->cs, nl * g);
        s->ncs = nl * g;
    }
    if (hnsw_gk > s->hk) {
        s->hk = 0;
        REGROW(s->hd, hnsw_gk);
        REGROW(s->hl, hnsw_gk);
        s->hk = hnsw_gk;
    }
    return 0;
oom:
    return err_set(err, err_size, "idx_search: out of memory for scratch (threads %d, g %d, cap %d, lists %lld)",
                n_thr, g, cap, (long long)nl);
}
