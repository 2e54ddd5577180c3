/* index_avx2.c - the AVX2 (+FMA/F16C) twins of the index kernels (index.h)
 * for CPUs without AVX-512: block scores of 16 keys x g queries, the top-k
 * buffer's 16-lane push, row packing into [d][16] blocks, nearest-centroid
 * assignment. The reference twins are in index_scan.c and index_ivf.c;
 * index_avx512.c has the same kernels at 16 lanes. A block's 16 keys are
 * two 8-lane vectors here; every tile keeps 8 accumulators (two FMA pipes
 * of latency 4), trading queries against dimensions or rows.
 */
#include "index/index.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "tensor/quant.h"
#include "util/simd_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* Keys 8h..8h+7 of dimension j of a block, as f32. */
ALWAYS_INLINE __m256 load_keys8(int kt, const void *blk, int64_t j, int h)
{
    const int64_t e = j * IDX_BLOCK + 8 * h;
    switch (kt) {
    case IDX_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)blk + e)));
    case IDX_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)blk + e))), 16));
    case IDX_I8:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)((const int8_t *)blk + e))));
    default:
        return _mm256_loadu_ps((const float *)blk + e);
    }
}

/* G (<= 4) queries against one block; kt and G are compile-time constants
 * at every call site. A accumulator pairs per query (dimensions j mod A):
 * 4 for one query, 2 for two, so that 8 FMA chains are in flight. */
ALWAYS_INLINE void block_g_avx2(int kt, int G, const void *blk, const float *scale16, int d, const float *q,
                                float *out)
{
    const int A = G == 1 ? 4 : G == 2 ? 2 : 1;
    __m256 acc[4][4][2];
    UNROLL for (int h = 0; h < G; h++)
        UNROLL for (int a = 0; a < A; a++) acc[h][a][0] = acc[h][a][1] = _mm256_setzero_ps();
    int j = 0;
    for (; j + A <= d; j += A) {
        UNROLL for (int a = 0; a < A; a++) {
            const __m256 k0 = load_keys8(kt, blk, j + a, 0), k1 = load_keys8(kt, blk, j + a, 1);
            UNROLL for (int h = 0; h < G; h++) {
                const __m256 qv = _mm256_broadcast_ss(q + (size_t)h * d + j + a);
                acc[h][a][0] = _mm256_fmadd_ps(k0, qv, acc[h][a][0]);
                acc[h][a][1] = _mm256_fmadd_ps(k1, qv, acc[h][a][1]);
            }
        }
    }
    for (; j < d; j++) {
        const __m256 k0 = load_keys8(kt, blk, j, 0), k1 = load_keys8(kt, blk, j, 1);
        UNROLL for (int h = 0; h < G; h++) {
            const __m256 qv = _mm256_broadcast_ss(q + (size_t)h * d + j);
            acc[h][0][0] = _mm256_fmadd_ps(k0, qv, acc[h][0][0]);
            acc[h][0][1] = _mm256_fmadd_ps(k1, qv, acc[h][0][1]);
        }
    }
    UNROLL for (int h = 0; h < G; h++)
        UNROLL for (int u = 0; u < 2; u++) {
            __m256 r = acc[h][0][u];
            if (A >= 2) r = _mm256_add_ps(r, acc[h][1][u]);
            if (A == 4) r = _mm256_add_ps(r, _mm256_add_ps(acc[h][2][u], acc[h][3][u]));
            if (kt == IDX_I8) r = _mm256_mul_ps(r, _mm256_loadu_ps(scale16 + 8 * u));
            _mm256_storeu_ps(out + h * IDX_BLOCK + 8 * u, r);
        }
}

#define BLOCK_G_CASES(KT)                                                    \
    switch (G) {                                                             \
    case 1: block_g_avx2(KT, 1, blk, scale16, d, qq, oo); break;             \
    case 2: block_g_avx2(KT, 2, blk, scale16, d, qq, oo); break;             \
    case 3: block_g_avx2(KT, 3, blk, scale16, d, qq, oo); break;             \
    default: block_g_avx2(KT, 4, blk, scale16, d, qq, oo); break;            \
    }

static void block_scores_avx2(int key_type, const void *blk, const float *scale16, int d, const float *q, int g,
                              float *out)
{
    for (int h0 = 0; h0 < g; h0 += 4) {
        const int G = g - h0 < 4 ? g - h0 : 4;
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

/* The lanes of valid whose score passes the threshold (NaN never). */
ALWAYS_INLINE unsigned pass16(const float *s16, float thr, uint32_t valid)
{
    const __m256 t = _mm256_set1_ps(thr);
    const unsigned lo = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s16), t, _CMP_GE_OQ));
    const unsigned hi = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s16 + 8), t, _CMP_GE_OQ));
    return (lo | hi << 8) & valid;
}

/* Compress in registers, two halves of 8, each stored whole: needs
 * n + 16 <= cap, which shrinking guarantees (cap >= k + 32). */
static void topk_push16_avx2(idx_topk *t, const float *s16, const int32_t *ids16, int32_t base, uint32_t valid)
{
    unsigned m = pass16(s16, t->thr, valid);
    if (!m) return;
    if (t->n + IDX_BLOCK > t->cap) {
        idx_topk_shrink(t);
        m = pass16(s16, t->thr, m);
        if (!m) return;
    }
    UNROLL for (int h = 0; h < 2; h++) {
        const unsigned mh = m >> (8 * h) & 255;
        if (!mh) continue;
        const __m256 s = _mm256_loadu_ps(s16 + 8 * h);
        const __m256i id = ids16 ? _mm256_loadu_si256((const __m256i *)(const void *)(ids16 + 8 * h))
                                 : _mm256_add_epi32(_mm256_set1_epi32(base + 8 * h),
                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_storeu_ps(t->s + t->n, simd_compress8_ps(s, mh));
        _mm256_storeu_si256((__m256i *)(void *)(t->id + t->n), simd_compress8_epi32(id, mh));
        t->n += __builtin_popcount(mh);
    }
}

/* The 8x8 transpose of rows r[0..8): out[u] lane v = r[v] lane u. */
ALWAYS_INLINE void transpose8(const __m256 r[8], __m256 out[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    out[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    out[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    out[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    out[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    out[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    out[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    out[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    out[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* bf16 of 8 floats as tensor/quant_types.c's fp32_to_bf16: round to
 * nearest even, a NaN made quiet. */
ALWAYS_INLINE __m128i bf16x8(__m256 v)
{
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(64)), nan);
    /* values fit 16 bits: the unsigned saturating pack is exact */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* i8 codes of 8 values against their rows' scales sc (0 where the scale
 * is 0), as index_scan.c's row_to_i8: divide, round to nearest even,
 * clamp to +-127; as 8 bytes. */
ALWAYS_INLINE __m128i i8x8(__m256 v, __m256 sc)
{
    const __m256 nz = _mm256_cmp_ps(sc, _mm256_setzero_ps(), _CMP_GT_OQ);
    __m256 x = _mm256_and_ps(nz, _mm256_div_ps(v, sc));
    x = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    const __m256i i = _mm256_cvtps_epi32(x);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    return _mm_packs_epi16(w, w);
}

/* One full block of 16 rows: dimensions 8 at a time, each 8 rows x 8
 * dimensions transposed in registers and converted column by column.
 * Rounding is the scalar code's (nearest even), so the bytes are the
 * reference's; dimensions past the last multiple of 8 go one by one. */
static void pack_block_avx2(int kt, const float *v, int d, uint8_t *dst, float *scales)
{
    float sc[IDX_BLOCK] = { 0 };
    if (kt == IDX_I8) {
        for (int r = 0; r < IDX_BLOCK; r++) {
            const float *x = v + (size_t)r * d;
            __m256 amax = _mm256_setzero_ps();
            const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
            int j = 0;
            for (; j + 8 <= d; j += 8) amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs), amax);
            float m[8];
            _mm256_storeu_ps(m, amax);
            float a = 0.0f;
            for (int u = 0; u < 8; u++) a = fmaxf(a, m[u]);
            for (; j < d; j++) a = fmaxf(a, fabsf(x[j]));
            sc[r] = a / 127.0f;
            scales[r] = sc[r];
        }
    }
    const size_t es = idx_elt_bytes(kt);
    int j = 0;
    for (; j + 8 <= d; j += 8)
        UNROLL for (int h = 0; h < 2; h++) {
            __m256 rw[8], col[8];
            UNROLL for (int u = 0; u < 8; u++) rw[u] = _mm256_loadu_ps(v + (size_t)(8 * h + u) * d + j);
            transpose8(rw, col);
            const __m256 sch = _mm256_loadu_ps(sc + 8 * h);
            UNROLL for (int u = 0; u < 8; u++) {
                uint8_t *o = dst + ((size_t)(j + u) * IDX_BLOCK + 8 * h) * es;
                switch (kt) {
                case IDX_F16:
                    _mm_storeu_si128((__m128i *)(void *)o, _mm256_cvtps_ph(col[u], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                    break;
                case IDX_BF16: _mm_storeu_si128((__m128i *)(void *)o, bf16x8(col[u])); break;
                case IDX_I8: _mm_storel_epi64((__m128i *)(void *)o, i8x8(col[u], sch)); break;
                default: _mm256_storeu_ps((float *)(void *)o, col[u]); break;
                }
            }
        }
    for (; j < d; j++)
        for (int r = 0; r < IDX_BLOCK; r++) {
            const float x = v[(size_t)r * d + j];
            const size_t e = (size_t)j * IDX_BLOCK + (size_t)r;
            switch (kt) {
            case IDX_F16: ((uint16_t *)dst)[e] = fp32_to_fp16(x); break;
            case IDX_BF16: ((uint16_t *)dst)[e] = fp32_to_bf16(x); break;
            case IDX_I8: {
                float y = sc[r] > 0.0f ? nearbyintf(x / sc[r]) : 0.0f;
                y = fminf(fmaxf(y, -127.0f), 127.0f);
                ((int8_t *)dst)[e] = (int8_t)(int)y;
                break;
            }
            default: ((float *)dst)[e] = x; break;
            }
        }
}

static void pack_rows_avx2(int key_type, const float *v, int64_t n, int d, void *dst, float *scales)
{
    const size_t bb = (size_t)d * IDX_BLOCK * idx_elt_bytes(key_type);
    const int64_t full = n / IDX_BLOCK;
    for (int64_t b = 0; b < full; b++)
        pack_block_avx2(key_type, v + b * IDX_BLOCK * d, d, (uint8_t *)dst + (size_t)b * bb,
                        scales ? scales + b * IDX_BLOCK : NULL);
    if (n > full * IDX_BLOCK)
        idx_pack_rows_ref(key_type, v + full * IDX_BLOCK * d, n - full * IDX_BLOCK, d, (uint8_t *)dst + (size_t)full * bb,
                          scales ? scales + full * IDX_BLOCK : NULL);
}

/* R (<= 4) rows against centroid block cb (16 centroids, two vectors):
 * 2R accumulators, one load pair per dimension serving R rows. The
 * scores s = x.c - |c|^2/2 update each row's per-lane best (bv, bi, kept
 * in memory: too many for the registers). A strict > keeps the earlier
 * block on a tie, as the reference keeps the lower centroid. */
ALWAYS_INLINE void assign_tile(int R, const float *x, int d, const float *c, const float *hn, int64_t cb,
                               float (*bv)[IDX_BLOCK], int32_t (*bi)[IDX_BLOCK])
{
    __m256 acc[4][2];
    UNROLL for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float *cc = c + (size_t)cb * d * IDX_BLOCK;
    for (int j = 0; j < d; j++) {
        const __m256 k0 = _mm256_loadu_ps(cc + (size_t)j * IDX_BLOCK), k1 = _mm256_loadu_ps(cc + (size_t)j * IDX_BLOCK + 8);
        UNROLL for (int r = 0; r < R; r++) {
            const __m256 xb = _mm256_broadcast_ss(x + (size_t)r * d + j);
            acc[r][0] = _mm256_fmadd_ps(k0, xb, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(k1, xb, acc[r][1]);
        }
    }
    UNROLL for (int u = 0; u < 2; u++) {
        const __m256 h = _mm256_loadu_ps(hn + cb * IDX_BLOCK + 8 * u);
        const __m256i ib = _mm256_add_epi32(_mm256_set1_epi32((int)(cb * IDX_BLOCK + 8 * u)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        UNROLL for (int r = 0; r < R; r++) {
            const __m256 s = _mm256_sub_ps(acc[r][u], h), b = _mm256_loadu_ps(bv[r] + 8 * u);
            const __m256 gt = _mm256_cmp_ps(s, b, _CMP_GT_OQ);
            _mm256_storeu_ps(bv[r] + 8 * u, _mm256_blendv_ps(b, s, gt));
            const __m256i bo = _mm256_loadu_si256((const __m256i *)(const void *)(bi[r] + 8 * u));
            _mm256_storeu_si256((__m256i *)(void *)(bi[r] + 8 * u), _mm256_blendv_epi8(bo, ib, _mm256_castps_si256(gt)));
        }
    }
}

static void assign_avx2(const float *x, int64_t n, int d, const float *c, const float *hn, int nc, int32_t *label,
                        float *best)
{
    const int64_t ncb = (nc + IDX_BLOCK - 1) / IDX_BLOCK;
    for (int64_t i = 0; i < n; i += 4) {
        const int R = n - i < 4 ? (int)(n - i) : 4;
        const float *xi = x + i * d;
        float bv[4][IDX_BLOCK];
        int32_t bi[4][IDX_BLOCK];
        for (int r = 0; r < 4; r++)
            for (int u = 0; u < IDX_BLOCK; u++) {
                bv[r][u] = -INFINITY;
                bi[r][u] = 0;
            }
        for (int64_t cb = 0; cb < ncb; cb++) {
            switch (R) {
            case 4: assign_tile(4, xi, d, c, hn, cb, bv, bi); break;
            case 3: assign_tile(3, xi, d, c, hn, cb, bv, bi); break;
            case 2: assign_tile(2, xi, d, c, hn, cb, bv, bi); break;
            default: assign_tile(1, xi, d, c, hn, cb, bv, bi); break;
            }
        }
        for (int r = 0; r < R; r++) {
            /* best value, then the smallest centroid holding it (as the ref) */
            float m = -INFINITY;
            for (int u = 0; u < IDX_BLOCK; u++) m = bv[r][u] > m ? bv[r][u] : m;
            int32_t l = INT32_MAX;
            for (int u = 0; u < IDX_BLOCK; u++)
                if (bv[r][u] == m && bi[r][u] < l) l = bi[r][u];
            label[i + r] = l == INT32_MAX ? 0 : l;
            best[i + r] = m;
        }
    }
}

const idx_kernels idx_kernels_avx2 = { block_scores_avx2, topk_push16_avx2, pack_rows_avx2, assign_avx2 };

#else
typedef int index_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
