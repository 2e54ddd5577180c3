/* index_avx512.c - the AVX-512 twins of the index kernels (index.h):
 * block scores of 16 keys x g queries, the top-k buffer's 16-lane push,
 * row packing into [d][16] blocks, nearest-centroid assignment. The
 * reference twins are in index_scan.c and index_ivf.c; idx_kernels_at
 * (index_scan.c) picks the set at run time.
 */
#include "index/index.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__F16C__) && defined(__FMA__)
#include "tensor/quant.h"

#include <immintrin.h>
#include <math.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

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
        idx_topk_shrink(t);
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

/* R rows x CB centroid blocks (compile-time constants at every call): per
 * dimension CB block loads and R broadcasts feed R*CB FMAs, enough reuse to
 * keep the FMA unit busy rather than the load ports. */
ALWAYS_INLINE void assign_tile(int R, int CB, const float *x, int d, const float *c,
                               const float *hn, int64_t cb0, __m512 *bv, __m512i *bi)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int b = 0; b < CB; b++) acc[r][b] = _mm512_setzero_ps();
    for (int j = 0; j < d; j++) {
        __m512 kc[4];
#pragma GCC unroll 4
        for (int b = 0; b < CB; b++) kc[b] = _mm512_loadu_ps(c + ((size_t)(cb0 + b) * d + j) * IDX_BLOCK);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 xb = _mm512_set1_ps(x[(size_t)r * d + j]);
#pragma GCC unroll 4
            for (int b = 0; b < CB; b++) acc[r][b] = _mm512_fmadd_ps(kc[b], xb, acc[r][b]);
        }
    }
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma GCC unroll 4
    for (int b = 0; b < CB; b++) {
        __m512 h = _mm512_loadu_ps(hn + (cb0 + b) * IDX_BLOCK);
        __m512i ib = _mm512_add_epi32(_mm512_set1_epi32((int)((cb0 + b) * IDX_BLOCK)), iota);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 s = _mm512_sub_ps(acc[r][b], h);
            __mmask16 m = _mm512_cmp_ps_mask(s, bv[r], _CMP_GT_OQ);
            bv[r] = _mm512_mask_mov_ps(bv[r], m, s);
            bi[r] = _mm512_mask_mov_epi32(bi[r], m, ib);
        }
    }
}

static void assign_avx512(const float *x, int64_t n, int d, const float *c, const float *hn, int nc,
                          int32_t *label, float *best)
{
    int64_t ncb = (nc + IDX_BLOCK - 1) / IDX_BLOCK;
    for (int64_t i = 0; i < n; i += 4) {
        int R = n - i < 4 ? (int)(n - i) : 4;
        const float *xi = x + i * d;
        __m512 bv[4];
        __m512i bi[4];
        for (int r = 0; r < 4; r++) {
            bv[r] = _mm512_set1_ps(-INFINITY);
            bi[r] = _mm512_setzero_si512();
        }
        int64_t cb = 0;
        if (R == 4) {
            for (; cb + 4 <= ncb; cb += 4) assign_tile(4, 4, xi, d, c, hn, cb, bv, bi);
            for (; cb < ncb; cb++) assign_tile(4, 1, xi, d, c, hn, cb, bv, bi);
        } else {
            for (int r = 0; r < R; r++) {
                for (cb = 0; cb + 4 <= ncb; cb += 4) assign_tile(1, 4, xi + (size_t)r * d, d, c, hn, cb, &bv[r], &bi[r]);
                for (; cb < ncb; cb++) assign_tile(1, 1, xi + (size_t)r * d, d, c, hn, cb, &bv[r], &bi[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            /* best value, then the smallest centroid holding it (as the ref) */
            float m = _mm512_reduce_max_ps(bv[r]);
            __mmask16 at = _mm512_cmp_ps_mask(bv[r], _mm512_set1_ps(m), _CMP_EQ_OQ);
            label[i + r] = _mm512_mask_reduce_min_epi32(at, bi[r]);
            if (!at) label[i + r] = 0;
            best[i + r] = m;
        }
    }
}

const idx_kernels idx_kernels_avx512 = { block_scores_avx512, topk_push16_avx512, pack_rows_avx512, assign_avx512 };

#else
typedef int index_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
