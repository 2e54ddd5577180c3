/* index_exact.c - the exact kind: every key is scored.
 *
 * Build packs the keys into blocks of 16 (index_scan.c); a search splits the
 * blocks over threads, each keeping its own top-k candidates, then merges.
 * Image: header, keys [n_blocks][d][16], i8 only: scales f32 [n_blocks*16]
 * (index.h). Only implements the methods of idx_kind_exact.
 */
#include "util/err.h"
#include "index/index.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Section offsets of an exact image; -1 on overflow. */
static int exact_layout(const idx_header *h, size_t *off_keys, size_t *off_scales, size_t *total)
{
    size_t end = IDX_HEADER_BYTES;
    if (idx_keys_layout(h, &end, off_keys, off_scales)) return -1;
    return idx_image_end(end, total);
}

static int exact_check(const idx_params *p, int64_t N, char *err, size_t err_size)
{
    (void)N;
    return idx_keys_param_check(p, err, err_size);
}

static int exact_load(idx_index *ix, const idx_header *h, const uint8_t *img, size_t n, char *err,
                      size_t err_size)
{
    size_t ok, os, total = 0;
    if (idx_keys_check(h, err, err_size)) return -1;
    if (h->nlist || h->nprobe)
        return err_set(err, err_size, "idx_deserialize: header fields of another index kind are set");
    const int64_t min_blocks = (h->n + IDX_BLOCK - 1) / IDX_BLOCK;
    if (h->n_blocks != min_blocks)
        return err_set(err, err_size, "idx_deserialize: exact index of %lld keys with %lld blocks, expected %lld",
                       (long long)h->n, (long long)h->n_blocks, (long long)min_blocks);
    if (exact_layout(h, &ok, &os, &total) != 0 || total != n)
        return err_set(err, err_size, "idx_deserialize: sections need %zu bytes, buffer has %zu", total, n);
    idx_keys_bind(ix, h, img, ok, os);
    return 0;
}

static int exact_build(const idx_params *p, const float *keys, int64_t N, int d, idx_index *ix,
                       char *err, size_t err_size)
{
    idx_header h = { .kind = IDX_EXACT, .key_type = (uint32_t)p->key_type, .d = (uint32_t)d,
                     .n = N, .n_blocks = (N + IDX_BLOCK - 1) / IDX_BLOCK };
    size_t ok, os, total;
    if (exact_layout(&h, &ok, &os, &total))
        return err_set(err, err_size, "idx_build: index of %lld keys x %d does not fit in memory",
                       (long long)N, d);
    uint8_t *img = idx_image_alloc(&h, total, err, err_size);
    if (!img) return -1;
    float *scales = p->key_type == IDX_I8 ? (float *)(img + os) : NULL;
    /* rows are independent: pack in parallel over whole blocks */
    int nt = idx_threads(p->n_threads);
    int64_t nb = h.n_blocks;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = b * IDX_BLOCK, rn = N - r0 < IDX_BLOCK ? N - r0 : IDX_BLOCK;
        idx_pack_rows(p->key_type, keys + r0 * d, rn, d,
                      img + ok + (size_t)b * d * IDX_BLOCK * idx_elt_bytes(p->key_type),
                      scales ? scales + r0 : NULL);
    }
    ix->owned = img;
    ix->image = img;
    ix->image_bytes = total;
    return exact_load(ix, &h, img, total, err, err_size);
}

/* Threads take chunks of blocks dynamically, so a thread that shares its
 * core with other work does not hold the others up; the result does not
 * depend on which thread scanned what (total order). */
#define EXACT_CHUNK 256 /* blocks: 4096 keys, 512 KB of f16 at d = 64 */

static int exact_search(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
                        int nt, idx_scratch *s, int32_t *ids, float *scores, char *err, size_t err_size)
{
    (void)sp; (void)err; (void)err_size;
    int64_t nb = ix->n_blocks, nch = (nb + EXACT_CHUNK - 1) / EXACT_CHUNK;
    if (nt > nch) nt = (int)nch;
    idx_topk_begin(s, ix, nt, g, k);
    uint64_t bytes = 0;
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(+ : bytes)
    {
        int t = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < nch; c++) {
            int64_t b0 = c * EXACT_CHUNK, b1 = b0 + EXACT_CHUNK < nb ? b0 + EXACT_CHUNK : nb;
            bytes += idx_scan_blocks(ix, b0, b1, ix->n - b0 * IDX_BLOCK, q, g, s->tk + (size_t)t * g,
                                     s->blk + (size_t)t * g * IDX_BLOCK);
        }
    }
    idx_topk_end(s, nt, g, k, ids, scores);
    s->cost_bytes = bytes;
    return 0;
}

const idx_kind_ops idx_kind_exact = {
    .name = "exact",
    .id = IDX_EXACT,
    .in_place = 1,
    .check = exact_check,
    .build = exact_build,
    .load = exact_load,
    .serialized_size = NULL, /* the image itself */
    .serialize = NULL,
    .reserve = idx_blocked_reserve,
    .search = exact_search,
    .release = NULL,
};
