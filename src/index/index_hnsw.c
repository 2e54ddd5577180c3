/* index_hnsw.c - the hnsw kind: the C side of the Faiss IndexHNSWFlat shim.
 *
 * Faiss (C++) lives behind index_hnsw_faiss.cc, built only when Faiss is
 * installed (SPARQ_HAVE_FAISS). Without it every hnsw entry point fails with
 * "hnsw index not built: Faiss not available". This file owns the serialized
 * form (our header + raw graph arrays, see index.h) so that loading checks
 * every size against the buffer before Faiss allocates anything.
 * Only implements the methods of idx_kind_hnsw.
 *
 * Cost: Faiss does not say how many nodes a search visited, so the bytes a
 * search reports are nominal (g * max(ef, k) * 2M * (4d + 4)) and flagged
 * so (idx_scratch_cost).
 */
#include "util/err.h"
#include "index/index.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifdef SPARQ_HAVE_FAISS

/* Section offsets: keys, levels, offsets, neighbours; -1 on overflow. */
static int hnsw_layout(int64_t n, int d, int64_t n_nb, size_t off[4], size_t *total)
{
    size_t end = IDX_HEADER_BYTES;
    if (idx_section(&end, n, (size_t)d * 4, &off[0]) || idx_section(&end, n, 4, &off[1]) ||
        idx_section(&end, n + 1, 8, &off[2]) || idx_section(&end, n_nb, 4, &off[3]))
        return -1;
    return idx_image_end(end, total);
}

static int hnsw_build(const idx_params *p, const float *keys, int64_t N, int d, idx_index *ix,
                   char *err, size_t err_size)
{
    ix->key_type = IDX_F32;
    ix->d = d;
    ix->n = N;
    ix->hnsw_m = p->hnsw_m;
    ix->ef_search = p->ef_search;
    ix->ef_construction = p->ef_construction;
    return idx_faiss_hnsw_build(keys, N, d, p->hnsw_m, p->ef_construction, idx_threads(p->n_threads),
                                &ix->faiss, err, err_size);
}

static int hnsw_search(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
                       int n_thr, idx_scratch *s, int32_t *ids, float *scores, char *err, size_t err_size)
{
    int ef = sp->ef_search ? sp->ef_search : ix->ef_search;
    if (ef < k) ef = k;
    if (idx_faiss_hnsw_search(ix->faiss, q, g, k, ef, n_thr, s->hd, s->hl, err, err_size))
        return -1;
    /* nominal: each query visits about ef nodes and reads 2M links and their
     * f32 keys at level 0 */
    s->cost_bytes = (uint64_t)g * (uint64_t)ef * 2 * (uint64_t)ix->hnsw_m * (4 * (uint64_t)ix->d + 4);
    s->cost_nominal = 1;
    for (int64_t i = 0; i < (int64_t)g * k; i++) {
        int ok = s->hl[i] >= 0 && s->hl[i] < ix->n;
        ids[i] = ok ? (int32_t)s->hl[i] : -1;
        scores[i] = ok ? s->hd[i] : -INFINITY;
    }
    return 0;
}

static size_t hnsw_serialized_size(const idx_index *ix)
{
    idx_hnsw_parts p;
    size_t off[4], total;
    idx_faiss_hnsw_parts(ix->faiss, &p);
    return hnsw_layout(ix->n, ix->d, p.n_neighbors, off, &total) ? 0 : total;
}

static int hnsw_serialize(const idx_index *ix, uint8_t *dst, size_t n, char *err, size_t err_size)
{
    (void)n;
    idx_hnsw_parts p;
    size_t off[4], total;
    idx_faiss_hnsw_parts(ix->faiss, &p);
    if (hnsw_layout(ix->n, ix->d, p.n_neighbors, off, &total))
        return err_set(err, err_size, "idx_serialize: hnsw graph cannot be written");
    memset(dst, 0, total);
    idx_header h = { .kind = IDX_HNSW, .key_type = IDX_F32, .d = (uint32_t)ix->d, .n = ix->n,
                     .total_bytes = total, .n_blocks = p.n_neighbors, .hnsw_m = ix->hnsw_m,
                     .ef_search = ix->ef_search, .ef_construction = ix->ef_construction,
                     .max_level = p.max_level, .entry_point = p.entry_point };
    idx_header_write(&h, dst);
    memcpy(dst + off[0], p.keys, (size_t)ix->n * ix->d * sizeof(float));
    memcpy(dst + off[1], p.levels, (size_t)ix->n * 4);
    memcpy(dst + off[2], p.offsets, (size_t)(ix->n + 1) * 8);
    memcpy(dst + off[3], p.neighbors, (size_t)p.n_neighbors * 4);
    return 0;
}

static int hnsw_load(idx_index *ix, const idx_header *h, const uint8_t *src, size_t n, char *err,
                  size_t err_size)
{
    size_t off[4], total;
    if (h->key_type != IDX_F32)
        return err_set(err, err_size, "idx_deserialize: hnsw key type %u, expected f32", h->key_type);
    if (h->hnsw_m < 2 || h->hnsw_m > 256)
        return err_set(err, err_size, "idx_deserialize: hnsw M %d outside [2, 256]", h->hnsw_m);
    if (h->ef_search < 1 || h->ef_search > 100000 || h->ef_construction < 1 || h->ef_construction > 100000)
        return err_set(err, err_size, "idx_deserialize: hnsw efSearch %d / efConstruction %d outside [1, 100000]",
                    h->ef_search, h->ef_construction);
    if (h->nlist || h->nprobe)
        return err_set(err, err_size, "idx_deserialize: hnsw header carries ivf fields");
    if (hnsw_layout(h->n, (int)h->d, h->n_blocks, off, &total) || total != n)
        return err_set(err, err_size, "idx_deserialize: hnsw sections need %zu bytes, buffer has %zu", total, n);
    /* finite keys, as idx_build requires */
    const uint8_t *kp = src + off[0];
    for (int64_t i = 0; i < h->n * (int64_t)h->d; i++) {
        float v;
        memcpy(&v, kp + (size_t)i * 4, 4);
        if (!isfinite(v))
            return err_set(err, err_size, "idx_deserialize: hnsw key %lld is not finite", (long long)(i / h->d));
    }
    idx_hnsw_parts p = { .keys = src + off[0], .levels = src + off[1], .offsets = src + off[2],
                         .neighbors = src + off[3], .n_neighbors = h->n_blocks,
                         .max_level = h->max_level, .entry_point = h->entry_point };
    ix->key_type = IDX_F32;
    ix->d = (int)h->d;
    ix->n = h->n;
    ix->hnsw_m = h->hnsw_m;
    ix->ef_search = h->ef_search;
    ix->ef_construction = h->ef_construction;
    return idx_faiss_hnsw_from_parts(&p, h->n, (int)h->d, h->hnsw_m, h->ef_construction, &ix->faiss,
                                     err, err_size);
}

static void hnsw_release(idx_index *ix)
{
    if (ix->faiss) idx_faiss_hnsw_free(ix->faiss);
    ix->faiss = NULL;
}

#else /* !SPARQ_HAVE_FAISS */

#define NO_FAISS "hnsw index not built: Faiss not available"

static int hnsw_build(const idx_params *p, const float *keys, int64_t N, int d, idx_index *ix,
                      char *err, size_t err_size)
{
    (void)p; (void)keys; (void)N; (void)d; (void)ix;
    return err_set(err, err_size, NO_FAISS);
}

static int hnsw_search(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
                       int n_thr, idx_scratch *s, int32_t *ids, float *scores, char *err, size_t err_size)
{
    (void)ix; (void)q; (void)g; (void)k; (void)sp; (void)n_thr; (void)s; (void)ids; (void)scores;
    return err_set(err, err_size, NO_FAISS);
}

static size_t hnsw_serialized_size(const idx_index *ix)
{
    (void)ix;
    return 0;
}

static int hnsw_serialize(const idx_index *ix, uint8_t *dst, size_t n, char *err, size_t err_size)
{
    (void)ix; (void)dst; (void)n;
    return err_set(err, err_size, NO_FAISS);
}

static int hnsw_load(idx_index *ix, const idx_header *h, const uint8_t *src, size_t n, char *err,
                     size_t err_size)
{
    (void)ix; (void)h; (void)src; (void)n;
    return err_set(err, err_size, NO_FAISS);
}

static void hnsw_release(idx_index *ix)
{
    (void)ix;
}

#endif

static int hnsw_check(const idx_params *p, int64_t N, char *err, size_t err_size)
{
    (void)N;
    if (p->hnsw_m < 2 || p->hnsw_m > 256)
        return err_set(err, err_size, "idx_build: hnsw_m %d outside [2, 256]", p->hnsw_m);
    if (p->ef_construction < 1 || p->ef_construction > 100000)
        return err_set(err, err_size, "idx_build: ef_construction %d outside [1, 100000]", p->ef_construction);
    if (p->ef_search < 1 || p->ef_search > 100000)
        return err_set(err, err_size, "idx_build: ef_search %d outside [1, 100000]", p->ef_search);
    return 0;
}

static int hnsw_reserve(idx_scratch *s, const idx_index *ix, int g, int k, int n_thr, char *err,
                        size_t err_size)
{
    (void)ix; (void)n_thr;
    return idx_scratch_grow(s, 0, 0, 0, 0, (int64_t)g * k, err, err_size);
}

const idx_kind_ops idx_kind_hnsw = {
    .name = "hnsw",
    .id = IDX_HNSW,
    .in_place = 0, /* always copied into Faiss */
    .check = hnsw_check,
    .build = hnsw_build,
    .load = hnsw_load,
    .serialized_size = hnsw_serialized_size,
    .serialize = hnsw_serialize,
    .reserve = hnsw_reserve,
    .search = hnsw_search,
    .release = hnsw_release,
};
