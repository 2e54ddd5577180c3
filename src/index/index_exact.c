/* index_exact.c - the exact kind: every key is scored.
 *
 * Build packs the keys into blocks of 16 (index_scan.c); a search splits the
 * blocks over threads, each keeping its own top-k candidates, then merges.
 * Image: header, keys [n_blocks][d][16], i8 only: scales f32 [n_blocks*16]
 * (index.h). Only implements the methods of idx_kind_exact.
 */
#include "util/err.h"
#include "index/index.h"

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

/* Threads take chunks of blocks (index_scan.c's idx_scan_ranges). */
#define EXACT_CHUNK 256 /* blocks: 4096 keys, 512 KB of f16 at d = 64 */

static void exact_range(const idx_index *ix, const void *ctx, int64_t c, int64_t *b0, int64_t *b1,
                        int64_t *n_rows)
{
    (void)ctx;
    *b0 = c * EXACT_CHUNK;
    *b1 = *b0 + EXACT_CHUNK < ix->n_blocks ? *b0 + EXACT_CHUNK : ix->n_blocks;
    *n_rows = ix->n - *b0 * IDX_BLOCK;
}

static int exact_search(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
                        int nt, idx_scratch *s, int32_t *ids, float *scores, char *err, size_t err_size)
{
    (void)sp; (void)err; (void)err_size;
    const int64_t nch = (ix->n_blocks + EXACT_CHUNK - 1) / EXACT_CHUNK;
    const idx_ranges chunks = {.n = nch, .at = exact_range, .ctx = NULL};
    idx_scan_ranges(ix, q, g, k, &chunks, nt, s, ids, scores);
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
