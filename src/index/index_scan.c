/* index_scan.c - what every blocked index kind (exact, ivf) shares, and
 * nothing kind-specific: the block scoring kernel, the top-k candidate
 * buffers, row packing into blocks of 16 keys, the block scan that counts
 * the bytes it reads, and the key-block sections of an image. Each kernel
 * has a plain-C `_ref` twin (the reference the tests compare with), an
 * AVX2 twin (index_avx2.c) and an AVX-512 one (index_avx512.c); the
 * un-suffixed name runs the twin of the level chosen at run time
 * (util/cpu.h).
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

size_t idx_elt_bytes(int key_type)
{
    switch (key_type) {
    case IDX_F32: return 4;
    case IDX_F16: case IDX_BF16: return 2;
    case IDX_I8: return 1;
    default: return 0;
    }
}

/* ---- block kernels ---------------------------------------------------------- */

ALWAYS_INLINE float key_at_ref(int kt, const void *blk, int64_t i)
{
    switch (kt) {
    case IDX_F16: return fp16_to_fp32(((const uint16_t *)blk)[i]);
    case IDX_BF16: return bf16_to_fp32(((const uint16_t *)blk)[i]);
    case IDX_I8: return (float)((const int8_t *)blk)[i];
    default: return ((const float *)blk)[i];
    }
}

void idx_block_scores_ref(int key_type, const void *blk, const float *scale16,
                          int d, const float *q, int g, float *out)
{
    for (int h = 0; h < g; h++)
        for (int r = 0; r < IDX_BLOCK; r++) {
            float acc = 0.0f;
            for (int j = 0; j < d; j++)
                acc += q[(size_t)h * d + j] * key_at_ref(key_type, blk, (int64_t)j * IDX_BLOCK + r);
            out[h * IDX_BLOCK + r] = key_type == IDX_I8 ? acc * scale16[r] : acc;
        }
}


/* ---- dispatch ---------------------------------------------------------------- */

const idx_kernels idx_kernels_ref = { idx_block_scores_ref, idx_topk_push16_ref, idx_pack_rows_ref,
                                      idx_assign_ref };

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

/* ---- top-k buffers ----------------------------------------------------------- */

/* The total order of candidates: higher score first, then lower id. Ids are
 * unique within a buffer, so this is strict and results are independent of
 * how the keys were split among threads. */
ALWAYS_INLINE int better(float sa, int32_t ia, float sb, int32_t ib)
{
    return sa > sb || (sa == sb && ia < ib);
}

ALWAYS_INLINE void swap2(float *s, int32_t *id, int64_t a, int64_t b)
{
    float ts = s[a];
    s[a] = s[b];
    s[b] = ts;
    int32_t ti = id[a];
    id[a] = id[b];
    id[b] = ti;
}

void idx_select(float *s, int32_t *id, int64_t n, int64_t m)
{
    if (m <= 0 || m >= n) return;
    int64_t lo = 0, hi = n - 1, kth = m - 1;
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (lo < hi) {
        /* random pivot: expected linear time whatever the input order */
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        swap2(s, id, lo + (int64_t)(rng % (uint64_t)(hi - lo + 1)), hi);
        float ps = s[hi];
        int32_t pi = id[hi];
        int64_t st = lo;
        for (int64_t i = lo; i < hi; i++)
            if (better(s[i], id[i], ps, pi)) swap2(s, id, i, st++);
        swap2(s, id, st, hi);
        if (st == kth) break;
        if (st < kth) lo = st + 1;
        else hi = st - 1;
    }
}

/* Heap sort, best first: a max-heap on "worse" pops the worst to the end. */
static void sift_down(float *s, int32_t *id, int64_t i, int64_t n)
{
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && better(s[c], id[c], s[c + 1], id[c + 1])) c++;
        if (!better(s[i], id[i], s[c], id[c])) return;
        swap2(s, id, i, c);
        i = c;
    }
}

static void sort_best_first(float *s, int32_t *id, int64_t n)
{
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_down(s, id, i, n);
    for (int64_t e = n - 1; e > 0; e--) {
        swap2(s, id, 0, e);
        sift_down(s, id, 0, e);
    }
}

void idx_topk_init(idx_topk *t, float *s, int32_t *id, int cap, int k)
{
    t->s = s;
    t->id = id;
    t->n = 0;
    t->cap = cap;
    t->k = k;
    t->thr = -INFINITY;
}

void idx_topk_shrink(idx_topk *t)
{
    if (t->n <= t->k) return;
    idx_select(t->s, t->id, t->n, t->k);
    t->n = t->k;
    float m = t->s[0];
    for (int i = 1; i < t->n; i++)
        if (t->s[i] < m) m = t->s[i];
    t->thr = m;
}

void idx_topk_push16_ref(idx_topk *t, const float *s16, const int32_t *ids16,
                         int32_t base, uint32_t valid)
{
    for (int r = 0; r < IDX_BLOCK; r++) {
        if (!(valid >> r & 1) || !(s16[r] >= t->thr)) continue;
        if (t->n == t->cap) {
            idx_topk_shrink(t);
            if (!(s16[r] >= t->thr)) continue;
        }
        t->s[t->n] = s16[r];
        t->id[t->n] = ids16 ? ids16[r] : base + r;
        t->n++;
    }
}


void idx_topk_push16(idx_topk *t, const float *s16, const int32_t *ids16,
                     int32_t base, uint32_t valid)
{
    tables[cpu_level_get()]->topk_push16(t, s16, ids16, base, valid);
}

void idx_topk_merge(idx_topk *dst, const idx_topk *src)
{
    for (int i = 0; i < src->n; i++) {
        if (!(src->s[i] >= dst->thr)) continue;
        if (dst->n == dst->cap) {
            idx_topk_shrink(dst);
            if (!(src->s[i] >= dst->thr)) continue;
        }
        dst->s[dst->n] = src->s[i];
        dst->id[dst->n] = src->id[i];
        dst->n++;
    }
}

void idx_topk_finish(idx_topk *t, int k_out, int32_t *ids, float *scores)
{
    idx_topk_shrink(t);
    sort_best_first(t->s, t->id, t->n);
    for (int r = 0; r < k_out; r++) {
        ids[r] = r < t->n ? t->id[r] : -1;
        scores[r] = r < t->n ? t->s[r] : -INFINITY;
    }
}

int idx_topk_cap(int64_t k, int64_t n)
{
    int64_t keff = k < n ? k : n;
    int64_t cap = 2 * keff + 32;
    if (cap > n + 32) cap = n + 32;  /* never more than everything */
    return (int)cap;
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

void idx_scan_ranges(const idx_index *ix, const float *q, int g, int k, int64_t n_ranges,
                     void (*range)(const idx_index *ix, const void *ctx, int64_t i, int64_t *b0,
                                   int64_t *b1, int64_t *n_rows),
                     const void *ctx, int n_thr, idx_scratch *s, int32_t *ids, float *scores)
{
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
            range(ix, ctx, i, &b0, &b1, &rows);
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

/* Quantises one row to int8 with scale max|x| / 127 (0 for an all-zero row). */
static float row_to_i8(const float *v, int d, int8_t *out)
{
    float amax = 0.0f;
    for (int j = 0; j < d; j++) amax = fmaxf(amax, fabsf(v[j]));
    float scale = amax / 127.0f;
    for (int j = 0; j < d; j++) {
        /* divide (not multiply by 1/scale): 1/scale overflows for tiny rows */
        float x = scale > 0.0f ? nearbyintf(v[j] / scale) : 0.0f;
        out[j] = (int8_t)(x > 127.0f ? 127 : x < -127.0f ? -127 : (int)x);
    }
    return scale;
}

void idx_pack_rows_ref(int key_type, const float *v, int64_t n, int d, void *dst, float *scales)
{
    int8_t row8[IDX_MAX_D];
    for (int64_t i = 0; i < n; i++) {
        const float *x = v + i * d;
        int64_t b = i / IDX_BLOCK, r = i % IDX_BLOCK;
        size_t o = (size_t)b * d * IDX_BLOCK + (size_t)r;
        switch (key_type) {
        case IDX_F16:
            for (int j = 0; j < d; j++) ((uint16_t *)dst)[o + (size_t)j * IDX_BLOCK] = fp32_to_fp16(x[j]);
            break;
        case IDX_BF16:
            for (int j = 0; j < d; j++) ((uint16_t *)dst)[o + (size_t)j * IDX_BLOCK] = fp32_to_bf16(x[j]);
            break;
        case IDX_I8:
            scales[i] = row_to_i8(x, d, row8);
            for (int j = 0; j < d; j++) ((int8_t *)dst)[o + (size_t)j * IDX_BLOCK] = row8[j];
            break;
        default:
            for (int j = 0; j < d; j++) ((float *)dst)[o + (size_t)j * IDX_BLOCK] = x[j];
            break;
        }
    }
}


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
