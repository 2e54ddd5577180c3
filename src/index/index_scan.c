/* index_scan.c - what every blocked index kind (exact, ivf) shares, and
 * nothing kind-specific: the block scoring kernel, the top-k candidate
 * buffers, row packing into blocks of 16 keys, the block scan that counts
 * the bytes it reads, and the key-block sections of an image. Each kernel
 * has a plain-C `_ref` twin (the reference the tests compare with,
 * index_ref.c), an AVX2 twin (index_avx2.c) and an AVX-512 one
 * (index_avx512.c); the un-suffixed name runs the twin of the level chosen
 * at run time (util/cpu.h). The top-k buffers are index_topk.c's.
 *
 * Map:
 *   block kernels      idx_block_scores(_ref): 16 keys x g queries
 *   top-k buffers      idx_topk_*: threshold buffer + quickselect
 *   scanning           idx_scan_blocks (counts the rows it scores), idx_scan_ranges
 *                      (one threaded search over ranges of blocks)
 *   packing            idx_pack_rows(_ref): f32 rows -> [d][16] blocks
 *   key sections       idx_keys_layout / idx_keys_bind
 */
#include "util/err.h"
#include "index/index.h"
#include "tensor/quant.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- dispatch ---------------------------------------------------------------- */

static const idx_kernels *const tables[CPU_LEVELS] = {
    [CPU_REF] = &idx_kernels_ref,
#if defined(__x86_64__)
    [CPU_AVX2] = &idx_kernels_avx2,
    [CPU_AVX512] = &idx_kernels_avx512,
#else
    [CPU_AVX2] = &idx_kernels_ref,
    [CPU_AVX512] = &idx_kernels_ref,
#endif
    [CPU_NEON] = &idx_kernels_ref,
    [CPU_NEON_DOTPROD] = &idx_kernels_ref,
};

const idx_kernels *idx_kernels_at(cpu_level level) { return tables[level]; }

void idx_block_scores(int key_type, const void *blk, const float *scale16,
                      int d, const float *q, int g, float *out)
{
    tables[cpu_level_get()]->block_scores(key_type, blk, scale16, d, q, g, out);
}

void idx_topk_push16(idx_topk *t, const float *s16, const int32_t *ids16,
                     int32_t base, uint32_t valid)
{
    tables[cpu_level_get()]->topk_push16(t, s16, ids16, base, valid);
}

/* ---- scanning ----------------------------------------------------------------- */

uint64_t idx_row_bytes(const idx_index *ix)
{
    return (uint64_t)ix->d * idx_elt_bytes(ix->key_type) + (ix->scales ? 4 : 0) + (ix->ids ? 4 : 0);
}

uint64_t idx_scan_blocks(const idx_index *ix, int64_t b0, int64_t b1, int64_t n_rows,
                         const float *q, int g, idx_topk *tk, float *blk)
{
    const size_t bb = (size_t)ix->d * IDX_BLOCK * idx_elt_bytes(ix->key_type);
    const uint8_t *keys = ix->keys;
    const idx_kernels *kern = tables[cpu_level_get()];
    uint64_t rows = 0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t left = n_rows - (b - b0) * IDX_BLOCK;
        uint32_t valid = left >= IDX_BLOCK ? 0xffffu : (1u << left) - 1u;
        kern->block_scores(ix->key_type, keys + (size_t)b * bb,
                     ix->scales ? ix->scales + b * IDX_BLOCK : NULL, ix->d, q, g, blk);
        const int32_t *ids16 = ix->ids ? ix->ids + b * IDX_BLOCK : NULL;
        for (int h = 0; h < g; h++)
            kern->topk_push16(&tk[h], blk + h * IDX_BLOCK, ids16, (int32_t)(b * IDX_BLOCK), valid);
        /* the keys scored: a list's last block may hold padding rows, which
         * are not keys (their bytes are zeros the block load brings along) */
        rows += (uint64_t)__builtin_popcount(valid);
    }
    return rows * idx_row_bytes(ix);
}

/* Candidate buffers: n_thr x g of them, for k results. */
static void topk_begin(idx_scratch *s, const idx_index *ix, int n_thr, int g, int k)
{
    const int keff = k < ix->n ? k : (int)ix->n, cap = idx_topk_cap(k, ix->n);
    for (int t = 0; t < n_thr; t++)
        for (int h = 0; h < g; h++) {
            const size_t o = ((size_t)t * g + h) * (size_t)cap;
            idx_topk_init(&s->tk[(size_t)t * g + h], s->s + o, s->id + o, cap, keff);
        }
}

void idx_scan_ranges(const idx_index *ix, const float *q, int g, int k, const idx_ranges *ranges, int n_thr,
                     idx_scratch *s, int32_t *ids, float *scores)
{
    const int64_t n_ranges = ranges->n;
    if (n_thr > n_ranges) n_thr = (int)(n_ranges > 0 ? n_ranges : 1);
    topk_begin(s, ix, n_thr, g, k);
    uint64_t bytes = 0;
    /* ranges are taken dynamically, so a thread that shares its core with
     * other work does not hold the others up; the result does not depend
     * on which thread scanned what (the candidates' total order) */
#pragma omp parallel num_threads(n_thr) if (n_thr > 1) reduction(+ : bytes)
    {
        const int t = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_ranges; i++) {
            int64_t b0, b1, rows;
            ranges->at(ix, ranges->ctx, i, &b0, &b1, &rows);
            bytes += idx_scan_blocks(ix, b0, b1, rows, q, g, s->tk + (size_t)t * g,
                                     s->blk + (size_t)t * g * IDX_BLOCK);
        }
    }
    for (int h = 0; h < g; h++) {
        for (int t = 1; t < n_thr; t++) idx_topk_merge(&s->tk[h], &s->tk[(size_t)t * g + h]);
        idx_topk_finish(&s->tk[h], k, ids + (size_t)h * k, scores + (size_t)h * k);
    }
    s->cost_bytes += bytes;
}

int idx_blocked_reserve(idx_scratch *s, const idx_index *ix, int g, int k, int n_thr, char *err,
                        size_t err_size)
{
    const int64_t nl = ((int64_t)ix->nlist + 15) / 16 * 16; /* 0 without lists */
    return idx_scratch_grow(s, n_thr, g, idx_topk_cap(k, ix->n), nl, 0, err, err_size);
}

/* ---- packing ---------------------------------------------------------------------- */

void idx_pack_rows(int key_type, const float *v, int64_t n, int d, void *dst, float *scales)
{
    tables[cpu_level_get()]->pack_rows(key_type, v, n, d, dst, scales);
}

/* Points ix into a validated exact/ivf image; ix->owned is left alone. */

/* ---- key sections -------------------------------------------------------------------- */

int idx_keys_layout(const idx_header *h, size_t *end, size_t *off_keys, size_t *off_scales)
{
    const size_t elt = idx_elt_bytes((int)h->key_type);
    size_t kb;
    *off_scales = 0;
    if (h->d < 1 || h->d > IDX_MAX_D || elt == 0 || h->key_type == IDX_F32) return -1;
    if (__builtin_mul_overflow((size_t)h->d * IDX_BLOCK, elt, &kb)) return -1;
    if (idx_section(end, h->n_blocks, kb, off_keys)) return -1;
    if (h->key_type == IDX_I8 && idx_section(end, h->n_blocks, IDX_BLOCK * 4, off_scales)) return -1;
    return 0;
}

int idx_keys_check(const idx_header *h, char *err, size_t err_size)
{
    if (h->key_type != IDX_F16 && h->key_type != IDX_BF16 && h->key_type != IDX_I8)
        return err_set(err, err_size, "idx_deserialize: key type %u is not f16, bf16 or i8", h->key_type);
    if (h->hnsw_m || h->ef_search || h->ef_construction || h->max_level || h->entry_point)
        return err_set(err, err_size, "idx_deserialize: header fields of another index kind are set");
    return 0;
}

void idx_keys_bind(idx_index *ix, const idx_header *h, const uint8_t *img, size_t off_keys,
                   size_t off_scales)
{
    ix->key_type = (int)h->key_type;
    ix->d = (int)h->d;
    ix->n = h->n;
    ix->n_blocks = h->n_blocks;
    ix->keys = img + off_keys;
    ix->scales = h->key_type == IDX_I8 ? (const float *)(img + off_scales) : NULL;
}

int idx_keys_param_check(const idx_params *p, char *err, size_t err_size)
{
    if (p->key_type != IDX_F16 && p->key_type != IDX_BF16 && p->key_type != IDX_I8)
        return err_set(err, err_size, "idx_build: key type %d is not IDX_F16, IDX_BF16 or IDX_I8", p->key_type);
    return 0;
}
