/* index_exact.c - the exact index, the scan kernels and top-k buffers every
 * kind shares, the serialized image, and the kind-independent entry points.
 *
 * Map:
 *   block kernels      idx_block_scores(_ref): 16 keys x g queries
 *   top-k buffers      idx_topk_*: threshold buffer + quickselect
 *   image              header, section layout, packing, binding, validation
 *   scratch            idx_scratch_*
 *   exact              build = pack; search = threads over block ranges
 *   entry points       idx_build / idx_search / idx_(de)serialize / idx_free
 */
#include "util/err.h"
#include "index/index.h"
#include "tensor/quant.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

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

#ifdef __AVX512F__
/* One dimension j of the 16 keys of a block, as f32. */
ALWAYS_INLINE __m512 load_keys16(int kt, const void *blk, int64_t j)
{
    switch (kt) {
    case IDX_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)blk + j * 16)));
    case IDX_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)blk + j * 16))), 16));
    case IDX_I8:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)((const int8_t *)blk + j * 16))));
    default:
        return _mm512_loadu_ps((const float *)blk + j * 16);
    }
}

/* G (<= 8) queries against one block; kt and G are compile-time constants at
 * every call site so the accumulators live in registers. A accumulators per
 * query (dimensions j mod A) keep enough independent FMAs in flight: 4 when
 * G <= 2, else 2. */
ALWAYS_INLINE void block_g_avx512(int kt, int G, const void *blk, const float *scale16,
                                  int d, const float *q, float *out)
{
    const int A = G <= 2 ? 4 : 2;
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int h = 0; h < G; h++)
#pragma GCC unroll 4
        for (int a = 0; a < A; a++) acc[h][a] = _mm512_setzero_ps();
    int j = 0;
    for (; j + A <= d; j += A) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int a = 0; a < A; a++) kv[a] = load_keys16(kt, blk, j + a);
#pragma GCC unroll 8
        for (int h = 0; h < G; h++) {
            const float *qh = q + (size_t)h * d + j;
#pragma GCC unroll 4
            for (int a = 0; a < A; a++) acc[h][a] = _mm512_fmadd_ps(kv[a], _mm512_set1_ps(qh[a]), acc[h][a]);
        }
    }
    for (; j < d; j++) {
        __m512 k0 = load_keys16(kt, blk, j);
#pragma GCC unroll 8
        for (int h = 0; h < G; h++)
            acc[h][0] = _mm512_fmadd_ps(k0, _mm512_set1_ps(q[(size_t)h * d + j]), acc[h][0]);
    }
    __m512 sc = kt == IDX_I8 ? _mm512_loadu_ps(scale16) : _mm512_set1_ps(1.0f);
#pragma GCC unroll 8
    for (int h = 0; h < G; h++) {
        __m512 r = _mm512_add_ps(acc[h][0], acc[h][1]);
        if (A == 4) r = _mm512_add_ps(r, _mm512_add_ps(acc[h][2], acc[h][3]));
        if (kt == IDX_I8) r = _mm512_mul_ps(r, sc);
        _mm512_storeu_ps(out + h * IDX_BLOCK, r);
    }
}

#define BLOCK_G_CASES(KT)                                                            \
    switch (G) {                                                                     \
    case 1: block_g_avx512(KT, 1, blk, scale16, d, qq, oo); break;                   \
    case 2: block_g_avx512(KT, 2, blk, scale16, d, qq, oo); break;                   \
    case 3: block_g_avx512(KT, 3, blk, scale16, d, qq, oo); break;                   \
    case 4: block_g_avx512(KT, 4, blk, scale16, d, qq, oo); break;                   \
    case 5: block_g_avx512(KT, 5, blk, scale16, d, qq, oo); break;                   \
    case 6: block_g_avx512(KT, 6, blk, scale16, d, qq, oo); break;                   \
    case 7: block_g_avx512(KT, 7, blk, scale16, d, qq, oo); break;                   \
    default: block_g_avx512(KT, 8, blk, scale16, d, qq, oo); break;                  \
    }

static void block_scores_avx512(int key_type, const void *blk, const float *scale16,
                                int d, const float *q, int g, float *out)
{
    for (int h0 = 0; h0 < g; h0 += 8) {
        int G = g - h0 < 8 ? g - h0 : 8;
        const float *qq = q + (size_t)h0 * d;
        float *oo = out + h0 * IDX_BLOCK;
        switch (key_type) {
        case IDX_F16: BLOCK_G_CASES(IDX_F16); break;
        case IDX_BF16: BLOCK_G_CASES(IDX_BF16); break;
        case IDX_I8: BLOCK_G_CASES(IDX_I8); break;
        default: BLOCK_G_CASES(IDX_F32); break;
        }
    }
}
#define BLOCK_SCORES block_scores_avx512
#else
#define BLOCK_SCORES idx_block_scores_ref
#endif

void idx_block_scores(int key_type, const void *blk, const float *scale16,
                      int d, const float *q, int g, float *out)
{
    BLOCK_SCORES(key_type, blk, scale16, d, q, g, out);
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

/* Keeps the best k and raises the threshold to the k-th best score. */
static void topk_shrink(idx_topk *t)
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
            topk_shrink(t);
            if (!(s16[r] >= t->thr)) continue;
        }
        t->s[t->n] = s16[r];
        t->id[t->n] = ids16 ? ids16[r] : base + r;
        t->n++;
    }
}

#ifdef __AVX512F__
/* Compress in registers and store 16 lanes: Zen 4's compress-to-memory is
 * microcoded and slow. Needs n + 16 <= cap, which shrinking guarantees
 * (cap >= k + 32). */
static void topk_push16_avx512(idx_topk *t, const float *s16, const int32_t *ids16,
                               int32_t base, uint32_t valid)
{
    __m512 s = _mm512_loadu_ps(s16);
    __mmask16 m = _mm512_mask_cmp_ps_mask((__mmask16)valid, s, _mm512_set1_ps(t->thr), _CMP_GE_OQ);
    if (!m) return;
    if (t->n + IDX_BLOCK > t->cap) {
        topk_shrink(t);
        m = _mm512_mask_cmp_ps_mask(m, s, _mm512_set1_ps(t->thr), _CMP_GE_OQ);
        if (!m) return;
    }
    __m512i id = ids16 ? _mm512_loadu_si512(ids16)
                       : _mm512_add_epi32(_mm512_set1_epi32(base),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                            10, 11, 12, 13, 14, 15));
    _mm512_storeu_ps(t->s + t->n, _mm512_maskz_compress_ps(m, s));
    _mm512_storeu_si512(t->id + t->n, _mm512_maskz_compress_epi32(m, id));
    t->n += __builtin_popcount((unsigned)m);
}
#define TOPK_PUSH16 topk_push16_avx512
#else
#define TOPK_PUSH16 idx_topk_push16_ref
#endif

void idx_topk_push16(idx_topk *t, const float *s16, const int32_t *ids16,
                     int32_t base, uint32_t valid)
{
    TOPK_PUSH16(t, s16, ids16, base, valid);
}

void idx_topk_merge(idx_topk *dst, const idx_topk *src)
{
    for (int i = 0; i < src->n; i++) {
        if (!(src->s[i] >= dst->thr)) continue;
        if (dst->n == dst->cap) {
            topk_shrink(dst);
            if (!(src->s[i] >= dst->thr)) continue;
        }
        dst->s[dst->n] = src->s[i];
        dst->id[dst->n] = src->id[i];
        dst->n++;
    }
}

void idx_topk_finish(idx_topk *t, int k_out, int32_t *ids, float *scores)
{
    topk_shrink(t);
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

void idx_scan_blocks(const idx_index *ix, int64_t b0, int64_t b1, int64_t n_rows,
                     const float *q, int g, idx_topk *tk, float *blk)
{
    const size_t bb = (size_t)ix->d * IDX_BLOCK * idx_elt_bytes(ix->key_type);
    const uint8_t *keys = ix->keys;
    for (int64_t b = b0; b < b1; b++) {
        int64_t left = n_rows - (b - b0) * IDX_BLOCK;
        uint32_t valid = left >= IDX_BLOCK ? 0xffffu : (1u << left) - 1u;
        BLOCK_SCORES(ix->key_type, keys + (size_t)b * bb,
                     ix->scales ? ix->scales + b * IDX_BLOCK : NULL, ix->d, q, g, blk);
        const int32_t *ids16 = ix->ids ? ix->ids + b * IDX_BLOCK : NULL;
        for (int h = 0; h < g; h++)
            TOPK_PUSH16(&tk[h], blk + h * IDX_BLOCK, ids16, (int32_t)(b * IDX_BLOCK), valid);
    }
}

/* ---- the serialized image ------------------------------------------------------ */

static const char MAGIC[8] = { 'S', 'P', 'Q', 'I', 'N', 'D', 'X', '1' };

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

void idx_header_write(const idx_header *h, uint8_t *dst)
{
    memset(dst, 0, IDX_HEADER_BYTES);
    memcpy(dst, MAGIC, 8);
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

static int header_read(idx_header *h, const uint8_t *src, size_t n, char *err, size_t err_size)
{
    if (n < IDX_HEADER_BYTES)
        return err_set(err, err_size, "idx_deserialize: %zu bytes is shorter than the %d-byte header",
                    n, IDX_HEADER_BYTES);
    if (memcmp(src, MAGIC, 8) != 0)
        return err_set(err, err_size, "idx_deserialize: bad magic (not a sparq index)");
    uint32_t ver = get32(src + 8);
    if (ver != 1) return err_set(err, err_size, "idx_deserialize: version %u, expected 1", ver);
    h->kind = get32(src + 12);
    h->key_type = get32(src + 16);
    h->d = get32(src + 20);
    h->n = (int64_t)get64(src + 24);
    h->total_bytes = get64(src + 32);
    h->n_blocks = (int64_t)get64(src + 40);
    int32_t f[7];
    for (int i = 0; i < 7; i++) f[i] = (int32_t)get32(src + 48 + 4 * i);
    h->nlist = f[0]; h->nprobe = f[1]; h->hnsw_m = f[2]; h->ef_search = f[3];
    h->ef_construction = f[4]; h->max_level = f[5]; h->entry_point = f[6];
    for (int i = 76; i < IDX_HEADER_BYTES; i++)
        if (src[i]) return err_set(err, err_size, "idx_deserialize: reserved header byte %d is not zero", i);
    if (h->kind != IDX_EXACT && h->kind != IDX_IVF && h->kind != IDX_HNSW)
        return err_set(err, err_size, "idx_deserialize: unknown index kind %u", h->kind);
    if (h->d < 1 || h->d > IDX_MAX_D)
        return err_set(err, err_size, "idx_deserialize: key dimension %u outside [1, %d]", h->d, IDX_MAX_D);
    if (h->n < 1 || h->n > INT32_MAX)
        return err_set(err, err_size, "idx_deserialize: key count %lld outside [1, %d]",
                    (long long)h->n, INT32_MAX);
    if (h->total_bytes != n)
        return err_set(err, err_size, "idx_deserialize: header says %llu bytes, buffer has %zu",
                    (unsigned long long)h->total_bytes, n);
    return 0;
}

/* Appends a section of `bytes` at the 64-aligned end; -1 on overflow. */
static int section(size_t *end, int64_t count, size_t elt, size_t *off)
{
    size_t bytes;
    if (count < 0 || __builtin_mul_overflow((size_t)count, elt, &bytes)) return -1;
    *off = align64(*end);
    if (*off < *end || __builtin_add_overflow(*off, bytes, end)) return -1;
    return 0;
}

int idx_layout(const idx_header *h, size_t off[IDX_N_SECTIONS], size_t *total)
{
    size_t end = IDX_HEADER_BYTES, elt = idx_elt_bytes((int)h->key_type), kb;
    memset(off, 0, IDX_N_SECTIONS * sizeof off[0]);
    if (h->d < 1 || h->d > IDX_MAX_D || elt == 0 || h->key_type == IDX_F32) return -1;
    if (__builtin_mul_overflow((size_t)h->d * IDX_BLOCK, elt, &kb)) return -1;
    if (h->kind == IDX_IVF) {
        if (h->nlist < 1) return -1;
        int64_t ncb = ((int64_t)h->nlist + 15) / 16;
        if (section(&end, ncb, (size_t)h->d * IDX_BLOCK * 4, &off[2]) ||
            section(&end, (int64_t)h->nlist + 1, 8, &off[3]) ||
            section(&end, h->nlist, 8, &off[4]) ||
            section(&end, h->nlist, 4, &off[6]) ||
            section(&end, h->n_blocks, IDX_BLOCK * 4, &off[5]))
            return -1;
    } else if (h->kind != IDX_EXACT) {
        return -1;
    }
    if (section(&end, h->n_blocks, kb, &off[0])) return -1;
    if (h->key_type == IDX_I8 && section(&end, h->n_blocks, IDX_BLOCK * 4, &off[1])) return -1;
    *total = align64(end);
    return *total < end ? -1 : 0;
}

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

#ifdef __AVX512F__
/* One full block: gather dimension j of the 16 rows, convert, store the 16
 * values contiguously. Rounding is the scalar code's (round to nearest even
 * for f16 / bf16 / i8), so the bytes are identical to the ref's. */
static void pack_block_avx512(int kt, const float *v, int d, uint8_t *dst, float *scales)
{
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i rows = _mm512_mullo_epi32(iota, _mm512_set1_epi32(d));
    __m512 sc = _mm512_setzero_ps();
    if (kt == IDX_I8) {
        __m512 amax = _mm512_setzero_ps();
        for (int j = 0; j < d; j++)
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(j)), v, 4)));
        sc = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
        _mm512_storeu_ps(scales, sc);
    }
    __mmask16 nz = _mm512_cmp_ps_mask(sc, _mm512_setzero_ps(), _CMP_GT_OQ);
    for (int j = 0; j < d; j++) {
        __m512 col = _mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(j)), v, 4);
        switch (kt) {
        case IDX_F16:
            _mm256_storeu_si256((__m256i *)(dst + (size_t)j * 32),
                                _mm512_cvtps_ph(col, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            break;
        case IDX_BF16: { /* x + 0x7fff + lsb, high half: round to nearest even */
            __m512i x = _mm512_castps_si512(col);
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
            x = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
            _mm256_storeu_si256((__m256i *)(dst + (size_t)j * 32), _mm512_cvtepi32_epi16(x));
            break;
        }
        case IDX_I8: {
            __m512 qv = _mm512_maskz_div_ps(nz, col, sc);
            qv = _mm512_roundscale_ps(qv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            qv = _mm512_min_ps(_mm512_max_ps(qv, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            _mm_storeu_si128((__m128i *)(dst + (size_t)j * 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(qv)));
            break;
        }
        default:
            _mm512_storeu_ps((float *)dst + (size_t)j * 16, col);
            break;
        }
    }
}

static void pack_rows_avx512(int key_type, const float *v, int64_t n, int d, void *dst, float *scales)
{
    size_t bb = (size_t)d * IDX_BLOCK * idx_elt_bytes(key_type);
    int64_t full = n / IDX_BLOCK;
    for (int64_t b = 0; b < full; b++)
        pack_block_avx512(key_type, v + b * IDX_BLOCK * d, d, (uint8_t *)dst + (size_t)b * bb,
                          scales ? scales + b * IDX_BLOCK : NULL);
    if (n > full * IDX_BLOCK)
        idx_pack_rows_ref(key_type, v + full * IDX_BLOCK * d, n - full * IDX_BLOCK, d,
                          (uint8_t *)dst + (size_t)full * bb, scales ? scales + full * IDX_BLOCK : NULL);
}
#define PACK_ROWS pack_rows_avx512
#else
#define PACK_ROWS idx_pack_rows_ref
#endif

void idx_pack_rows(int key_type, const float *v, int64_t n, int d, void *dst, float *scales)
{
    PACK_ROWS(key_type, v, n, d, dst, scales);
}

/* Points ix into a validated exact/ivf image; ix->owned is left alone. */
static int bind_image(idx_index *ix, const idx_header *h, const uint8_t *img, size_t n,
                      char *err, size_t err_size)
{
    size_t off[IDX_N_SECTIONS], total;
    if (h->key_type != IDX_F16 && h->key_type != IDX_BF16 && h->key_type != IDX_I8)
        return err_set(err, err_size, "idx_deserialize: key type %u is not f16, bf16 or i8", h->key_type);
    if (h->hnsw_m || h->ef_search || h->ef_construction || h->max_level || h->entry_point ||
        (h->kind == IDX_EXACT && (h->nlist || h->nprobe)))
        return err_set(err, err_size, "idx_deserialize: header fields of another index kind are set");
    int64_t min_blocks = (h->n + IDX_BLOCK - 1) / IDX_BLOCK;
    if (h->kind == IDX_EXACT && h->n_blocks != min_blocks)
        return err_set(err, err_size, "idx_deserialize: exact index of %lld keys with %lld blocks, expected %lld",
                    (long long)h->n, (long long)h->n_blocks, (long long)min_blocks);
    if (h->kind == IDX_IVF) {
        if (h->nlist < 1 || h->nlist > h->n)
            return err_set(err, err_size, "idx_deserialize: nlist %d outside [1, %lld]", h->nlist, (long long)h->n);
        if (h->nprobe < 1 || h->nprobe > h->nlist)
            return err_set(err, err_size, "idx_deserialize: nprobe %d outside [1, %d]", h->nprobe, h->nlist);
        if (h->n_blocks < min_blocks || h->n_blocks > min_blocks + h->nlist)
            return err_set(err, err_size, "idx_deserialize: %lld blocks for %lld keys in %d lists",
                        (long long)h->n_blocks, (long long)h->n, h->nlist);
    }
    if (idx_layout(h, off, &total) != 0 || total != n)
        return err_set(err, err_size, "idx_deserialize: sections need %zu bytes, buffer has %zu", total, n);
    ix->kind = (int)h->kind;
    ix->key_type = (int)h->key_type;
    ix->d = (int)h->d;
    ix->n = h->n;
    ix->n_blocks = h->n_blocks;
    ix->keys = img + off[0];
    ix->scales = h->key_type == IDX_I8 ? (const float *)(img + off[1]) : NULL;
    ix->image = img;
    ix->image_bytes = n;
    if (h->kind == IDX_IVF) {
        ix->nlist = h->nlist;
        ix->nprobe = h->nprobe;
        ix->centroids = (const float *)(img + off[2]);
        ix->list_off = (const int64_t *)(img + off[3]);
        ix->list_n = (const int64_t *)(img + off[4]);
        ix->ids = (const int32_t *)(img + off[5]);
        ix->list_bonus = (const float *)(img + off[6]);
        return idx_ivf_check(ix, err, err_size);
    }
    return 0;
}

int idx_bind_image(idx_index *ix, const uint8_t *img, size_t n, char *err, size_t err_size)
{
    idx_header h;
    if (header_read(&h, img, n, err, err_size)) return -1;
    return bind_image(ix, &h, img, n, err, err_size);
}

/* ---- scratch ---------------------------------------------------------------------- */

idx_scratch *idx_scratch_create(void)
{
    return calloc(1, sizeof(idx_scratch));
}

void idx_scratch_free(idx_scratch *s)
{
    if (!s) return;
    free(s->s); free(s->id); free(s->tk); free(s->blk);
    free(s->cs); free(s->ls); free(s->li); free(s->lmark);
    free(s->hd); free(s->hl);
    free(s);
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

int idx_scratch_reserve(idx_scratch *s, const idx_index *ix, int g, int k, int n_threads,
                        char *err, size_t err_size)
{
    if (!s || !ix || g < 1 || g > IDX_MAX_G || k < 1)
        return err_set(err, err_size, "idx_scratch_reserve: bad arguments (g=%d, k=%d)", g, k);
    if (ix->kind == IDX_HNSW)
        return idx_scratch_grow(s, 0, 0, 0, 0, (int64_t)g * k, err, err_size);
    int64_t nl = ix->kind == IDX_IVF ? ((int64_t)ix->nlist + 15) / 16 * 16 : 0;
    return idx_scratch_grow(s, idx_threads(n_threads), g, idx_topk_cap(k, ix->n), nl, 0, err, err_size);
}

/* ---- exact ------------------------------------------------------------------------ */

uint8_t *idx_image_alloc(idx_header *h, size_t off[IDX_N_SECTIONS], char *err, size_t err_size)
{
    size_t total;
    if (idx_layout(h, off, &total) != 0) {
        err_set(err, err_size, "idx_build: index of %lld keys x %u does not fit in memory",
             (long long)h->n, h->d);
        return NULL;
    }
    uint8_t *img = aligned_alloc(64, total);
    if (!img) {
        err_set(err, err_size, "idx_build: out of memory for a %zu-byte index", total);
        return NULL;
    }
    memset(img, 0, total);
    h->total_bytes = total;
    idx_header_write(h, img);
    return img;
}

static int exact_build(const idx_params *p, const float *keys, int64_t N, int d, idx_index *ix,
                       char *err, size_t err_size)
{
    idx_header h = { .kind = IDX_EXACT, .key_type = (uint32_t)p->key_type, .d = (uint32_t)d,
                     .n = N, .n_blocks = (N + IDX_BLOCK - 1) / IDX_BLOCK };
    size_t off[IDX_N_SECTIONS];
    uint8_t *img = idx_image_alloc(&h, off, err, err_size);
    if (!img) return -1;
    float *scales = p->key_type == IDX_I8 ? (float *)(img + off[1]) : NULL;
    /* rows are independent: pack in parallel over whole blocks */
    int nt = idx_threads(p->n_threads);
    int64_t nb = h.n_blocks;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = b * IDX_BLOCK, rn = N - r0 < IDX_BLOCK ? N - r0 : IDX_BLOCK;
        idx_pack_rows(p->key_type, keys + r0 * d, rn, d,
                      img + off[0] + (size_t)b * d * IDX_BLOCK * idx_elt_bytes(p->key_type),
                      scales ? scales + r0 : NULL);
    }
    ix->owned = img;
    return idx_bind_image(ix, img, h.total_bytes, err, err_size);
}

/* Threads take chunks of blocks dynamically, so a thread that shares its
 * core with other work does not hold the others up; the result does not
 * depend on which thread scanned what (total order). */
#define EXACT_CHUNK 256 /* blocks: 4096 keys, 512 KB of f16 at d = 64 */

static void exact_search(const idx_index *ix, const float *q, int g, int nt, idx_scratch *s,
                         int32_t *ids, float *scores, int k)
{
    int64_t nb = ix->n_blocks, nch = (nb + EXACT_CHUNK - 1) / EXACT_CHUNK;
    if (nt > nch) nt = (int)nch;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int t = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < nch; c++) {
            int64_t b0 = c * EXACT_CHUNK, b1 = b0 + EXACT_CHUNK < nb ? b0 + EXACT_CHUNK : nb;
            idx_scan_blocks(ix, b0, b1, ix->n - b0 * IDX_BLOCK, q, g, s->tk + (size_t)t * g,
                            s->blk + (size_t)t * g * IDX_BLOCK);
        }
    }
    for (int h = 0; h < g; h++) {
        for (int t = 1; t < nt; t++) idx_topk_merge(&s->tk[h], &s->tk[(size_t)t * g + h]);
        idx_topk_finish(&s->tk[h], k, ids + (size_t)h * k, scores + (size_t)h * k);
    }
}

/* ---- entry points ------------------------------------------------------------------- */

idx_params idx_default_params(void)
{
    idx_params p = {
        .kind = "exact", .key_type = IDX_F16, .nlist = 0, .nprobe = 0, .n_iter = 10,
        .n_train = 0, .seed = 0x5eed5eedull, .hnsw_m = 16, .ef_construction = 40,
        .ef_search = 64, .n_threads = 0,
    };
    return p;
}

static int parse_kind(const char *kind)
{
    if (!kind) return 0;
    if (strcmp(kind, "exact") == 0) return IDX_EXACT;
    if (strcmp(kind, "ivf") == 0) return IDX_IVF;
    if (strcmp(kind, "hnsw") == 0) return IDX_HNSW;
    return 0;
}

static int check_params(const idx_params *p, int kind, const float *keys, int64_t N, int d,
                        char *err, size_t err_size)
{
    if (!kind) return err_set(err, err_size, "idx_build: unknown index kind '%s' (exact|ivf|hnsw)",
                           p->kind ? p->kind : "(null)");
    if (!keys) return err_set(err, err_size, "idx_build: keys is NULL");
    if (N < 1 || N > INT32_MAX)
        return err_set(err, err_size, "idx_build: key count %lld outside [1, %d]", (long long)N, INT32_MAX);
    if (d < 1 || d > IDX_MAX_D)
        return err_set(err, err_size, "idx_build: key dimension %d outside [1, %d]", d, IDX_MAX_D);
    if (kind != IDX_HNSW && p->key_type != IDX_F16 && p->key_type != IDX_BF16 && p->key_type != IDX_I8)
        return err_set(err, err_size, "idx_build: key type %d is not IDX_F16, IDX_BF16 or IDX_I8", p->key_type);
    if (p->n_threads < 0 || p->n_threads > 4096)
        return err_set(err, err_size, "idx_build: n_threads %d outside [0, 4096]", p->n_threads);
    if (kind == IDX_IVF) {
        if (p->nlist < 0 || p->nlist > N)
            return err_set(err, err_size, "idx_build: nlist %d outside [0, %lld]", p->nlist, (long long)N);
        if (p->nprobe < 0) return err_set(err, err_size, "idx_build: nprobe %d is negative", p->nprobe);
        if (p->n_iter < 0 || p->n_iter > 1000)
            return err_set(err, err_size, "idx_build: n_iter %d outside [0, 1000]", p->n_iter);
        if (p->n_train < 0 || p->n_train > N)
            return err_set(err, err_size, "idx_build: n_train %lld outside [0, %lld]",
                        (long long)p->n_train, (long long)N);
        if (p->n_train > 0 && p->n_train < p->nlist)
            return err_set(err, err_size, "idx_build: n_train %lld is below nlist %d",
                        (long long)p->n_train, p->nlist);
    }
    if (kind == IDX_HNSW) {
        if (p->hnsw_m < 2 || p->hnsw_m > 256)
            return err_set(err, err_size, "idx_build: hnsw_m %d outside [2, 256]", p->hnsw_m);
        if (p->ef_construction < 1 || p->ef_construction > 100000)
            return err_set(err, err_size, "idx_build: ef_construction %d outside [1, 100000]", p->ef_construction);
        if (p->ef_search < 1 || p->ef_search > 100000)
            return err_set(err, err_size, "idx_build: ef_search %d outside [1, 100000]", p->ef_search);
    }
    /* non-finite keys would poison k-means and the graph; refuse them for all
     * kinds so the contract is the same */
    for (int64_t i = 0; i < N * d; i++)
        if (!isfinite(keys[i]))
            return err_set(err, err_size, "idx_build: key %lld, component %lld is not finite",
                        (long long)(i / d), (long long)(i % d));
    return 0;
}

int idx_build(const idx_params *p, const float *keys, int64_t N, int d, idx_index **out,
              char *err, size_t err_size)
{
    if (!out) return err_set(err, err_size, "idx_build: out is NULL");
    *out = NULL;
    if (!p) return err_set(err, err_size, "idx_build: params is NULL");
    int kind = parse_kind(p->kind);
    if (check_params(p, kind, keys, N, d, err, err_size)) return -1;
    idx_index *ix = calloc(1, sizeof *ix);
    if (!ix) return err_set(err, err_size, "idx_build: out of memory");
    int rc = kind == IDX_EXACT ? exact_build(p, keys, N, d, ix, err, err_size)
           : kind == IDX_IVF   ? idx_ivf_build(p, keys, N, d, ix, err, err_size)
                               : idx_hnsw_build(p, keys, N, d, ix, err, err_size);
    if (rc) {
        idx_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}

void idx_free(idx_index *ix)
{
    if (!ix) return;
    if (ix->kind == IDX_HNSW) idx_hnsw_free(ix);
    free(ix->owned);
    free(ix);
}

int     idx_kind(const idx_index *ix)  { return ix->kind; }
int64_t idx_count(const idx_index *ix) { return ix->n; }
int     idx_dim(const idx_index *ix)   { return ix->d; }
int     idx_nlist(const idx_index *ix) { return ix->kind == IDX_IVF ? ix->nlist : 0; }

int idx_search(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
               idx_scratch *s, int32_t *ids, float *scores, char *err, size_t err_size)
{
    if (!ix || !q || !ids || !scores) return err_set(err, err_size, "idx_search: NULL argument");
    if (g < 1 || g > IDX_MAX_G) return err_set(err, err_size, "idx_search: g %d outside [1, %d]", g, IDX_MAX_G);
    if (k < 1) return err_set(err, err_size, "idx_search: k %d is not positive", k);
    idx_search_params d0 = { 0 };
    if (!sp) sp = &d0;
    if (sp->nprobe < 0 || sp->ef_search < 0 || sp->n_threads < 0)
        return err_set(err, err_size, "idx_search: negative search parameter");
    int nt = idx_threads(sp->n_threads);
    idx_scratch *tmp = NULL;
    if (!s) {
        s = tmp = idx_scratch_create();
        if (!s) return err_set(err, err_size, "idx_search: out of memory");
    }
    int rc = idx_scratch_reserve(s, ix, g, k, nt, err, err_size);
    if (rc == 0) {
        if (ix->kind == IDX_HNSW) {
            rc = idx_hnsw_search(ix, q, g, k, sp->ef_search ? sp->ef_search : ix->ef_search, nt, s,
                                 ids, scores, err, err_size);
        } else {
            int keff = k < ix->n ? k : (int)ix->n, cap = idx_topk_cap(k, ix->n);
            for (int t = 0; t < nt; t++)
                for (int h = 0; h < g; h++) {
                    size_t o = ((size_t)t * g + h) * (size_t)cap;
                    idx_topk_init(&s->tk[(size_t)t * g + h], s->s + o, s->id + o, cap, keff);
                }
            if (ix->kind == IDX_IVF) {
                int np = sp->nprobe ? sp->nprobe : ix->nprobe;
                rc = idx_ivf_search(ix, q, g, k, np < ix->nlist ? np : ix->nlist, nt, s, ids, scores);
            } else {
                exact_search(ix, q, g, nt, s, ids, scores, k);
            }
        }
    }
    idx_scratch_free(tmp);
    return rc;
}

size_t idx_serialized_size(const idx_index *ix)
{
    if (!ix) return 0;
    return ix->kind == IDX_HNSW ? idx_hnsw_serialized_size(ix) : ix->image_bytes;
}

int idx_serialize(const idx_index *ix, void *dst, size_t n, char *err, size_t err_size)
{
    if (!ix || !dst) return err_set(err, err_size, "idx_serialize: NULL argument");
    size_t need = idx_serialized_size(ix);
    if (n < need) return err_set(err, err_size, "idx_serialize: buffer of %zu bytes, need %zu", n, need);
    if (ix->kind == IDX_HNSW && idx_hnsw_serialize(ix, dst))
        return err_set(err, err_size, "idx_serialize: hnsw graph cannot be written");
    if (ix->kind == IDX_HNSW) return 0;
    memcpy(dst, ix->image, need);
    return 0;
}

int idx_deserialize(const void *src, size_t n, idx_index **out, char *err, size_t err_size)
{
    if (!out) return err_set(err, err_size, "idx_deserialize: out is NULL");
    *out = NULL;
    if (!src) return err_set(err, err_size, "idx_deserialize: src is NULL");
    idx_header h;
    if (header_read(&h, src, n, err, err_size)) return -1;
    idx_index *ix = calloc(1, sizeof *ix);
    if (!ix) return err_set(err, err_size, "idx_deserialize: out of memory");
    int rc;
    if (h.kind == IDX_HNSW) {
        ix->kind = IDX_HNSW;
        rc = idx_hnsw_load(ix, &h, src, n, err, err_size);
    } else if ((uintptr_t)src % 64 == 0) {
        rc = bind_image(ix, &h, src, n, err, err_size);
    } else {
        /* typed access needs alignment: work on an aligned private copy */
        uint8_t *copy = aligned_alloc(64, align64(n));
        if (!copy) {
            rc = err_set(err, err_size, "idx_deserialize: out of memory copying %zu bytes", n);
        } else {
            memcpy(copy, src, n);
            ix->owned = copy;
            rc = bind_image(ix, &h, copy, n, err, err_size);
        }
    }
    if (rc) {
        idx_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}
