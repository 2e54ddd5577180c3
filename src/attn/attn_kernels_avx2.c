/* attn_kernels_avx2.c - the AVX2 (+FMA/F16C) twins of attn.h's kernels,
 * for the CPUs without AVX-512 (Intel since Alder Lake, AMD before Zen 4).
 *
 * Same signatures as the plain-C `_ref` kernels (attn_kernels_ref.c) and the
 * same results to f32 rounding; attn.c's table for the avx2 level points
 * here (tests/test_attn.c compares every pair over odd sizes at each level,
 * tests/test_cpu.c runs it at every level the CPU has). The structure is
 * attn_kernels_avx512.c's, scaled to 8 lanes and 16 vector registers: a
 * tile keeps 8 accumulators (two FMA pipes of latency 4 need 8 independent
 * chains), so each shape trades heads against rows or columns, HB x R = 8.
 *
 * Map of this file:
 *   helpers             loads of f16/f32/Q8_0 elements, whole and partial
 *   scores              q . K rows, a transpose-add tree per 8 sums
 *   softmax             in place
 *   weighted sums       V rows weighted by given weights, or by softmax(scores)
 *   K^T logits          SparQ's scores from r rows of K^T; the fused exp pass
 *   group sum, top-k    attn_scaled_head_sum, attn_topk_filter/_above/_kth_key/_partition
 *   gather              attn_gather_group
 */
#include "attn/attn_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "attn/attn_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* The tile functions take their shape as arguments that are constants at
 * every call site; forced inlining and unrolling turn their small arrays
 * of vectors into registers. */
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* ---- helpers ------------------------------------------------------------- */

/* Element type codes of the kernels' compile-time `f16` argument: 0 f32,
 * 1 f16, KQ8 Q8_0. */
enum { KQ8 = 2 };

/* Row units of a K/V row: elements (f16, f32) or bytes (Q8_0), so that
 * row * kv_row_units is where the row starts for ld8. */
static ALWAYS_INLINE int64_t kv_row_units(int d, const int f16)
{
    return f16 == KQ8 ? (int64_t)attn_q8_row_bytes(d) : d;
}

static ALWAYS_INLINE size_t kv_row_bytes(int d, const int f16)
{
    return f16 == KQ8 ? attn_q8_row_bytes(d) : (size_t)d * (f16 ? 2 : 4);
}

/* 8 elements from element j (a multiple of 8, so one Q8_0 block holds them
 * all) of the row starting at `at` row units. */
static ALWAYS_INLINE __m256 ld8(const void *p, int64_t at, int64_t j, const int f16)
{
    if (f16 == KQ8) {
        const uint8_t *blk = (const uint8_t *)p + at + (size_t)(j / ATTN_Q8_BLOCK) * ATTN_Q8_BLOCK_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        const __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + j % ATTN_Q8_BLOCK));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)p + at + j)));
    return _mm256_loadu_ps((const float *)p + at + j);
}

/* The first k (< 8) of those elements, the other lanes zero; nothing past
 * them is read (a row may end its allocation). */
static ALWAYS_INLINE __m256 ld8_part(const void *p, int64_t at, int64_t j, const int f16, int64_t k)
{
    if (k <= 0) return _mm256_setzero_ps();
    if (f16 == KQ8) {
        const uint8_t *blk = (const uint8_t *)p + at + (size_t)(j / ATTN_Q8_BLOCK) * ATTN_Q8_BLOCK_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        uint8_t tmp[16] = { 0 };
        memcpy(tmp, blk + 2 + j % ATTN_Q8_BLOCK, (size_t)k);
        const __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)tmp);
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    if (f16) {
        uint16_t tmp[8] = { 0 };
        memcpy(tmp, (const uint16_t *)p + at + j, (size_t)k * 2);
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)tmp));
    }
    return _mm256_maskload_ps((const float *)p + at + j, simd_lanes8(k));
}

/* k (<= 8) floats of x: whole vector or masked. */
static ALWAYS_INLINE __m256 ldf(const float *x, int64_t k)
{
    return k >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, simd_lanes8(k));
}

static ALWAYS_INLINE void stf(float *x, int64_t k, __m256 v)
{
    if (k >= 8) _mm256_storeu_ps(x, v);
    else if (k > 0) _mm256_maskstore_ps(x, simd_lanes8(k), v);
}

/* ---- scores --------------------------------------------------------------- */

/* Dot products of R rows (element offsets at[u]) with HB query heads,
 * R * HB = 12 accumulators (two FMA pipes of latency 4 want 8 chains; 12
 * leave room for the loads between them): lane[hh * R + u] = head hh .
 * row u. Each q chunk serves R rows, each converted K chunk HB heads. */
enum { SC_SLOTS = 12, SC_ROWS = 12 }; /* accumulators; rows per block (a multiple of every R) */

static ALWAYS_INLINE void scores_tile(const attn_kv_view *kv, const float *qh, const int HB, const int R,
                                      const int64_t *at, float lane[16], const int f16)
{
    const int d = kv->d, dfull = d & ~7;
    __m256 a[16];
    UNROLL for (int t = 0; t < 16; t++) a[t] = _mm256_setzero_ps();
    int j = 0;
    for (; j < dfull; j += 8)
        UNROLL for (int u = 0; u < R; u++) {
            const __m256 k = ld8(kv->K, at[u], j, f16);
            UNROLL for (int hh = 0; hh < HB; hh++)
                a[hh * R + u] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + (size_t)hh * d + j), k, a[hh * R + u]);
        }
    if (j < d)
        UNROLL for (int u = 0; u < R; u++) {
            const __m256 k = ld8_part(kv->K, at[u], j, f16, d - j);
            UNROLL for (int hh = 0; hh < HB; hh++)
                a[hh * R + u] = _mm256_fmadd_ps(ldf(qh + (size_t)hh * d + j, d - j), k, a[hh * R + u]);
        }
    _mm256_storeu_ps(lane, hsum8x8(a));
    _mm256_storeu_ps(lane + 8, hsum8x8(a + 8));
}

/* Scores of HB heads from h0 over rows [i0, i0+nb), nb <= SC_ROWS, R rows
 * per tile, written to s[(h0+hh)*n + i]. Rows past nb repeat a valid one
 * and are not stored. Returns the rows the tiles read. */
static ALWAYS_INLINE int scores_heads(const attn_kv_view *kv, const float *q, int h0, const int HB, const int R,
                                      const int32_t *rows, int64_t i0, int nb, float scale, float *s,
                                      int64_t n, const int f16)
{
    const float *qh = q + (size_t)h0 * kv->d;
    int read = 0;
    for (int r0 = 0; r0 < nb; r0 += R) {
        int64_t at[SC_ROWS];
        UNROLL for (int u = 0; u < R; u++) {
            const int64_t rr = r0 + u < nb ? i0 + r0 + u : i0;
            at[u] = (rows ? rows[rr] : rr) * kv_row_units(kv->d, f16);
        }
        float lane[16];
        scores_tile(kv, qh, HB, R, at, lane, f16);
        const int m = nb - r0 < R ? nb - r0 : R;
        for (int hh = 0; hh < HB; hh++)
            for (int u = 0; u < m; u++) s[(size_t)(h0 + hh) * n + i0 + r0 + u] = lane[hh * R + u] * scale;
        read += m;
    }
    return read;
}

/* Scores of all g heads for rows [i0, i0+nb), nb <= SC_ROWS. Returns the
 * rows the first head block read (the later ones find them in L1). */
static ALWAYS_INLINE int scores_rows(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                                     int64_t i0, int nb, float scale, float *s, int64_t n, const int f16)
{
    int h0 = 0, read = 0, x = 0;
    for (; h0 + 4 <= g; h0 += 4) {
        x = scores_heads(kv, q, h0, 4, 3, rows, i0, nb, scale, s, n, f16);
        if (h0 == 0) read = x;
    }
    switch (g - h0) {
    case 3: x = scores_heads(kv, q, h0, 3, 4, rows, i0, nb, scale, s, n, f16); break;
    case 2: x = scores_heads(kv, q, h0, 2, 6, rows, i0, nb, scale, s, n, f16); break;
    case 1: x = scores_heads(kv, q, h0, 1, 12, rows, i0, nb, scale, s, n, f16); break;
    default: return read;
    }
    return h0 == 0 ? x : read;
}

/* Gathered rows: K rows this far ahead are requested; rows below v_rows
 * also get their V row requested, for the weighted sum that follows.
 * Contiguous rows are requested stream_ahead_rows ahead, running on into V
 * (attn_prefetch.h). */
enum { SCORES_AHEAD = 64 };

static ALWAYS_INLINE void scores_avx2(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                                      int64_t n, float *s, int64_t v_rows, const int f16)
{
    const float scale = 1.0f / sqrtf((float)kv->d);
    const size_t row_bytes = kv_row_bytes(kv->d, f16);
    const int64_t ahead = rows ? SCORES_AHEAD : stream_ahead_rows(row_bytes);
    int64_t read = 0;
    if (rows) prefetch_rows(kv->K, rows, 0, n < ahead ? n : ahead, row_bytes);
    else prefetch_kv_stream(kv->K, kv->V, n, n, 0, ahead, row_bytes);
    for (int64_t i0 = 0; i0 < n; i0 += SC_ROWS) {
        const int nb = n - i0 < SC_ROWS ? (int)(n - i0) : SC_ROWS;
        if (rows) {
            const int64_t a = i0 + ahead, b = a + SC_ROWS < n ? a + SC_ROWS : n;
            prefetch_rows(kv->K, rows, a, b, row_bytes);
            if (i0 < v_rows) prefetch_rows(kv->V, rows, i0, i0 + nb, row_bytes);
        } else {
            prefetch_kv_stream(kv->K, kv->V, n, n, i0 + ahead, i0 + ahead + SC_ROWS, row_bytes);
        }
        read += scores_rows(kv, q, g, rows, i0, nb, scale, s, n, f16);
    }
    if (kv->meter) kv->meter->k += read * kv->d;
}

void attn_scores_avx2(const attn_kv_view *kv, const float *q, int g, const int32_t *rows, int64_t n, float *s)
{
    if (attn_q8i_applies(kv)) attn_scores_q8i_avx2(kv, q, g, rows, n, s);
    else if (kv->elem == KV_Q8_0) scores_avx2(kv, q, g, rows, n, s, 0, KQ8);
    else if (kv->elem == KV_F16) scores_avx2(kv, q, g, rows, n, s, 0, 1);
    else scores_avx2(kv, q, g, rows, n, s, 0, 0);
}

/* ---- softmax ---------------------------------------------------------------- */

void attn_softmax_avx2(float *s, int g, int64_t n)
{
    for (int h = 0; h < g; h++) {
        float *x = s + h * n;
        const __m256 mx = _mm256_set1_ps(max_of8(x, n));
        double sum = 0; /* per 128 vectors into double: f32 lanes would drift */
        for (int64_t i0 = 0; i0 < n; i0 += 1024) {
            __m256 vsum = _mm256_setzero_ps();
            for (int64_t i = i0; i < n && i < i0 + 1024; i += 8) {
                const int64_t k = n - i;
                __m256 e = exp_neg8(_mm256_sub_ps(ldf(x + i, k), mx));
                if (k < 8) e = _mm256_and_ps(e, _mm256_castsi256_ps(simd_lanes8(k)));
                stf(x + i, k, e);
                vsum = _mm256_add_ps(vsum, e);
            }
            sum += hsum8(vsum);
        }
        const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
        for (int64_t i = 0; i < n; i += 8) stf(x + i, n - i, _mm256_mul_ps(ldf(x + i, n - i), inv));
    }
}

/* ---- weighted sums ------------------------------------------------------------ */

/* out[h0..h0+HB)[j0..j0+8NV) += sum over rows i in [i0, i0+nb) of
 * wb[h*ws + i - i0] * V[i], HB * NV <= 8 accumulators in registers;
 * `masked` tiles (the last, when d is not a multiple of the width) load
 * and store with lane masks. Returns the V elements read: rows x columns. */
static ALWAYS_INLINE int64_t wsum_tile(const attn_kv_view *kv, const float *wb, int64_t ws, int h0, const int HB,
                                       const int NV, const int masked, const int32_t *rows, int64_t i0,
                                       int64_t nb, int j0, float *out, const int f16)
{
    const int d = kv->d;
    int64_t left[8];
    UNROLL for (int c = 0; c < NV; c++) left[c] = masked ? d - j0 - 8 * c : 8;
    float *o = out + (size_t)h0 * d + j0;
    const float *wh = wb + h0 * ws - i0;
    __m256 acc[4][8];
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int c = 0; c < NV; c++) acc[hh][c] = ldf(o + (size_t)hh * d + 8 * c, left[c] < 0 ? 0 : left[c]);
    int64_t i = i0;
    for (; i < i0 + nb; i++) {
        const int64_t at = (rows ? rows[i] : i) * kv_row_units(d, f16);
        __m256 v[8];
        UNROLL for (int c = 0; c < NV; c++)
            v[c] = masked ? (left[c] >= 8 ? ld8(kv->V, at, j0 + 8 * c, f16) : ld8_part(kv->V, at, j0 + 8 * c, f16, left[c]))
                          : ld8(kv->V, at, j0 + 8 * c, f16);
        UNROLL for (int hh = 0; hh < HB; hh++) {
            const __m256 wi = _mm256_broadcast_ss(wh + hh * ws + i);
            UNROLL for (int c = 0; c < NV; c++) acc[hh][c] = _mm256_fmadd_ps(wi, v[c], acc[hh][c]);
        }
    }
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int c = 0; c < NV; c++) stf(o + (size_t)hh * d + 8 * c, left[c], acc[hh][c]);
    return (i - i0) * (masked ? d - j0 : 8 * NV);
}

static ALWAYS_INLINE int64_t wsum_tiles(const attn_kv_view *kv, const float *wb, int64_t ws, int h0, const int HB,
                                        const int NV, const int32_t *rows, int64_t i0, int64_t nb, float *out,
                                        const int f16)
{
    int j0 = 0;
    int64_t read = 0;
    for (; j0 + 8 * NV <= kv->d; j0 += 8 * NV)
        read += wsum_tile(kv, wb, ws, h0, HB, NV, 0, rows, i0, nb, j0, out, f16);
    if (j0 < kv->d) read += wsum_tile(kv, wb, ws, h0, HB, NV, 1, rows, i0, nb, j0, out, f16);
    return read;
}

/* out[h] += sum over rows [i0, i0+nb) of wb[h*ws + i - i0] * V[i], all g
 * heads. Returns the V elements the first head block read. */
static ALWAYS_INLINE int64_t wsum_rows(const attn_kv_view *kv, const float *wb, int64_t ws, int g,
                                       const int32_t *rows, int64_t i0, int64_t nb, float *out, const int f16)
{
    int h0 = 0;
    int64_t read = 0, x = 0;
    for (; h0 + 4 <= g; h0 += 4) {
        x = wsum_tiles(kv, wb, ws, h0, 4, 2, rows, i0, nb, out, f16);
        if (h0 == 0) read = x;
    }
    switch (g - h0) {
    case 3: x = wsum_tiles(kv, wb, ws, h0, 3, 2, rows, i0, nb, out, f16); break;
    case 2: x = wsum_tiles(kv, wb, ws, h0, 2, 4, rows, i0, nb, out, f16); break;
    case 1: x = wsum_tiles(kv, wb, ws, h0, 1, 8, rows, i0, nb, out, f16); break;
    default: return read;
    }
    return h0 == 0 ? x : read;
}

enum { WSUM_BLOCK = 32 }; /* rows per block: their V stays in L1 across tiles */

static ALWAYS_INLINE void weighted_sum_avx2(const attn_kv_view *kv, const float *w, int g, const int32_t *rows,
                                            int64_t n, float *out, const int f16)
{
    const size_t row_bytes = kv_row_bytes(kv->d, f16);
    int64_t read = 0;
    memset(out, 0, (size_t)g * kv->d * sizeof *out);
    for (int64_t i0 = 0; i0 < n; i0 += WSUM_BLOCK) {
        const int64_t nb = n - i0 < WSUM_BLOCK ? n - i0 : WSUM_BLOCK;
        if (rows)
            prefetch_rows(kv->V, rows, i0 + WSUM_BLOCK, i0 + 2 * WSUM_BLOCK < n ? i0 + 2 * WSUM_BLOCK : n, row_bytes);
        read += wsum_rows(kv, w + i0, n, g, rows, i0, nb, out, f16);
    }
    if (kv->meter) kv->meter->v += read;
}

void attn_weighted_sum_avx2(const attn_kv_view *kv, const float *w, int g, const int32_t *rows, int64_t n,
                            float *out)
{
    if (kv->elem == KV_Q8_0) weighted_sum_avx2(kv, w, g, rows, n, out, KQ8);
    else if (kv->elem == KV_F16) weighted_sum_avx2(kv, w, g, rows, n, out, 1);
    else weighted_sum_avx2(kv, w, g, rows, n, out, 0);
}

/* Heads per pass of softmax_weighted_sum: their weights for one block of
 * rows live on the stack; more heads take more passes. */
enum { SWS_HEADS = 16 };

/* The weights of one block are exp(s - max) computed into wb just before
 * the block's V rows are read, and the row sums divide at the end: no
 * separate softmax passes over the g*n scores. */
static ALWAYS_INLINE void softmax_wsum_avx2(const attn_kv_view *kv, const float *s, int g, const int32_t *rows,
                                            int64_t n, float *out, float *lse, const int f16)
{
    const int d = kv->d;
    const size_t row_bytes = kv_row_bytes(d, f16);
    int64_t read = 0; /* V elements of the first pass (heads past SWS_HEADS re-read them) */
    for (int hc = 0; hc < g; hc += SWS_HEADS) {
        const int hn = g - hc < SWS_HEADS ? g - hc : SWS_HEADS;
        float mx[SWS_HEADS];
        double z[SWS_HEADS];
        float wb[SWS_HEADS * WSUM_BLOCK] __attribute__((aligned(32)));
        for (int hh = 0; hh < hn; hh++) {
            mx[hh] = max_of8(s + (size_t)(hc + hh) * n, n);
            z[hh] = 0;
        }
        float *o = out + (size_t)hc * d;
        memset(o, 0, (size_t)hn * d * sizeof *o);
        for (int64_t i0 = 0; i0 < n; i0 += WSUM_BLOCK) {
            const int64_t nb = n - i0 < WSUM_BLOCK ? n - i0 : WSUM_BLOCK;
            if (rows)
                prefetch_rows(kv->V, rows, i0 + WSUM_BLOCK, i0 + 2 * WSUM_BLOCK < n ? i0 + 2 * WSUM_BLOCK : n,
                               row_bytes);
            for (int hh = 0; hh < hn; hh++) {
                const float *x = s + (size_t)(hc + hh) * n + i0;
                __m256 mhi, mlo, zv = _mm256_setzero_ps();
                exp_shift8(mx[hh], &mhi, &mlo);
                UNROLL for (int u = 0; u < WSUM_BLOCK / 8; u++) {
                    const int64_t k = nb - 8 * u;
                    __m256 w = _mm256_setzero_ps();
                    if (k >= 8) w = exp_sub8(_mm256_loadu_ps(x + 8 * u), mhi, mlo);
                    else if (k > 0)
                        w = _mm256_and_ps(exp_sub8(ldf(x + 8 * u, k), mhi, mlo), _mm256_castsi256_ps(simd_lanes8(k)));
                    _mm256_store_ps(wb + hh * WSUM_BLOCK + 8 * u, w);
                    zv = _mm256_add_ps(zv, w);
                }
                z[hh] += hsum8(zv);
            }
            const int64_t nr = wsum_rows(kv, wb, WSUM_BLOCK, hn, rows, i0, nb, o, f16);
            if (hc == 0) read += nr;
        }
        for (int hh = 0; hh < hn; hh++) {
            if (lse) lse[hc + hh] = mx[hh] + (float)log(z[hh]);
            const __m256 inv = _mm256_set1_ps((float)(1.0 / z[hh]));
            float *oh = o + (size_t)hh * d;
            for (int j = 0; j < d; j += 8) stf(oh + j, d - j, _mm256_mul_ps(ldf(oh + j, d - j), inv));
        }
    }
    if (kv->meter) kv->meter->v += read;
}

void attn_softmax_weighted_sum_avx2(const attn_kv_view *kv, const float *s, int g, const int32_t *rows,
                                    int64_t n, float *out, float *lse)
{
    if (n <= 0) {
        memset(out, 0, (size_t)g * kv->d * sizeof *out);
        for (int h = 0; lse && h < g; h++) lse[h] = -INFINITY;
        return;
    }
    if (attn_q8i_applies(kv)) attn_softmax_weighted_sum_q8i_avx2(kv, s, g, rows, n, out, lse);
    else if (kv->elem == KV_Q8_0) softmax_wsum_avx2(kv, s, g, rows, n, out, lse, KQ8);
    else if (kv->elem == KV_F16) softmax_wsum_avx2(kv, s, g, rows, n, out, lse, 1);
    else softmax_wsum_avx2(kv, s, g, rows, n, out, lse, 0);
}

/* ---- K^T logits ------------------------------------------------------------------ */

/* K^T tiles: NV vectors of 8 positions for HB heads, HB * NV = 8
 * accumulators held over all r rows (HB 4 and 3: 16 positions, 2: 32,
 * 1: 64; every width divides ATTN_EXP_BLOCK and the 32 of a Q8_0 block).
 * KT_AHEAD: prefetch distance for K^T rows in positions (attn_kernels_avx512.c
 * says why into L2 and why this far). */
enum { KT_AHEAD = 512 };

static ALWAYS_INLINE int kt_nv(const int HB) { return HB >= 3 ? 2 : HB == 2 ? 4 : 8; }

/* Logits of HB heads h0.. at the 8NV positions from i (lanes at or past
 * `left` zero when `masked`): acc[hh][v] = sum_c qs[(h0+hh)*r + c] *
 * KT[comp[c]][i + 8v + lane]. `pf` (elements, 0 = none) requests the lines
 * that far ahead into L2. Returns the K^T rows it read (r). */
static ALWAYS_INLINE int kt_tile(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int h0,
                                 const int HB, int64_t i, int64_t left, const int masked, int64_t pf,
                                 __m256 acc[4][8], const int f16)
{
    const int NV = kt_nv(HB);
    const size_t es = f16 ? 2 : 4;
    /* the tile lies on one side of kt_split (a multiple of ATTN_EXP_BLOCK) */
    const int tail = kv->KT_tail && i >= kv->kt_split;
    const char *kt = (const char *)(tail ? kv->KT_tail : kv->KT);
    const int64_t stride = tail ? kv->kt_tail_stride : kv->kt_stride;
    if (tail) i -= kv->kt_split;
    const size_t row_bytes = attn_kv_row_bytes(f16 == KQ8 ? KV_Q8_0 : f16 ? KV_F16 : KV_F32, stride);
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int v = 0; v < NV; v++) acc[hh][v] = _mm256_setzero_ps();
    const float *qc = qs + (size_t)h0 * r;
    int c = 0;
    for (; c < r; c++) {
        const char *row = kt + (size_t)comp[c] * row_bytes;
        if (pf) { /* the lines of this tile's positions pf further on */
            const size_t ahead = f16 == KQ8 ? (size_t)(i + pf) / 32 * 34 : (size_t)(i + pf) * es;
            const size_t span = f16 == KQ8 ? ((size_t)NV * 8 * 34 + 31) / 32 : (size_t)NV * 8 * es;
            for (size_t o = 0; o < span; o += 64) _mm_prefetch(row + ahead + o, _MM_HINT_T1);
        }
        const int64_t at = f16 == KQ8 ? 0 : i;
        const int64_t j = f16 == KQ8 ? i : 0;
        __m256 v[8];
        UNROLL for (int u = 0; u < NV; u++)
            v[u] = masked ? (left - 8 * u >= 8 ? ld8(row, at, j + 8 * u, f16) : ld8_part(row, at, j + 8 * u, f16, left - 8 * u))
                          : ld8(row, at, j + 8 * u, f16);
        UNROLL for (int hh = 0; hh < HB; hh++) {
            const __m256 qv = _mm256_broadcast_ss(qc + (size_t)hh * r + c);
            UNROLL for (int u = 0; u < NV; u++) acc[hh][u] = _mm256_fmadd_ps(qv, v[u], acc[hh][u]);
        }
    }
    return c;
}

/* One block [i0, i0+len) of HB heads from h0: logits into s (row stride n).
 * Returns the K^T elements read: per tile, rows x positions. */
static ALWAYS_INLINE int64_t kt_logits_block(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                                             int h0, const int HB, int64_t n, int64_t i0, int64_t len, float *s,
                                             const int f16)
{
    const int NV = kt_nv(HB), W = 8 * NV;
    int64_t read = 0;
    for (int64_t i = i0; i < i0 + len; i += W) {
        const int64_t left = i0 + len - i, pf = i + KT_AHEAD < n ? KT_AHEAD : 0;
        __m256 acc[4][8];
        if (left >= W) read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 0, pf, acc, f16) * W;
        else read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 1, pf, acc, f16) * left;
        UNROLL for (int hh = 0; hh < HB; hh++)
            UNROLL for (int u = 0; u < NV; u++) stf(s + (size_t)(h0 + hh) * n + i + 8 * u, left - 8 * u, acc[hh][u]);
    }
    return read;
}

static ALWAYS_INLINE void kt_logits_avx2(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                                         int64_t n, float *s, const int f16)
{
    /* block-major: heads after the first four find the block's K^T lines
     * in cache (so only the first four's reads are counted) */
    int64_t read = 0;
    for (int64_t i0 = 0; i0 < n; i0 += ATTN_EXP_BLOCK) {
        const int64_t len = n - i0 < ATTN_EXP_BLOCK ? n - i0 : ATTN_EXP_BLOCK;
        int h0 = 0;
        int64_t e = 0;
        for (; h0 + 4 <= g; h0 += 4) {
            e = kt_logits_block(kv, qs, comp, r, h0, 4, n, i0, len, s, f16);
            if (h0 == 0) read += e;
        }
        switch (g - h0) {
        case 3: e = kt_logits_block(kv, qs, comp, r, h0, 3, n, i0, len, s, f16); break;
        case 2: e = kt_logits_block(kv, qs, comp, r, h0, 2, n, i0, len, s, f16); break;
        case 1: e = kt_logits_block(kv, qs, comp, r, h0, 1, n, i0, len, s, f16); break;
        default: continue;
        }
        if (h0 == 0) read += e;
    }
    if (kv->meter) kv->meter->kt += read;
}

void attn_kt_logits_avx2(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g, int64_t n,
                         float *s)
{
    if (kv->elem == KV_Q8_0) kt_logits_avx2(kv, qs, comp, r, g, n, s, KQ8);
    else if (kv->elem == KV_F16) kt_logits_avx2(kv, qs, comp, r, g, n, s, 1);
    else kt_logits_avx2(kv, qs, comp, r, g, n, s, 0);
}

/* x, or exactly 0 where x < ATTN_SCORE_MIN (attn_exp.h) */
static ALWAYS_INLINE __m256 score_flush8(__m256 x)
{
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(ATTN_SCORE_MIN), _CMP_GE_OQ), x);
}

/* attn_kt_exp for HB heads from h0 over block [i0, i0+len): logits into e
 * with their block maximum tracked on the way, then (block still in L1)
 * mrun/zrun (the heads' running max and sum of exp against it) updated and
 * the block exponentiated in place. lsum gets (add: adds) the heads' sum.
 * Returns the K^T elements read. */
static ALWAYS_INLINE int64_t kt_exp_block(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                                          int h0, const int HB, int64_t n, int64_t i0, int64_t len, float *e,
                                          float *lsum, int add, float *mrun, double *zrun, const int f16)
{
    const int NV = kt_nv(HB), W = 8 * NV;
    __m256 vmax[4];
    int64_t read = 0;
    UNROLL for (int hh = 0; hh < HB; hh++) vmax[hh] = _mm256_set1_ps(-INFINITY);
    for (int64_t i = i0; i < i0 + len; i += W) {
        const int64_t left = i0 + len - i, pf = i + KT_AHEAD < n ? KT_AHEAD : 0;
        __m256 acc[4][8];
        if (left >= W) read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 0, pf, acc, f16) * W;
        else read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 1, pf, acc, f16) * left;
        UNROLL for (int u = 0; u < NV; u++) {
            const int64_t k = left - 8 * u;
            if (k <= 0) break;
            const __m256 in = _mm256_castsi256_ps(simd_lanes8(k)), ninf = _mm256_set1_ps(-INFINITY);
            UNROLL for (int hh = 0; hh < HB; hh++) {
                stf(e + (size_t)(h0 + hh) * n + i + 8 * u, k, acc[hh][u]);
                vmax[hh] = _mm256_max_ps(k >= 8 ? acc[hh][u] : _mm256_blendv_ps(ninf, acc[hh][u], in), vmax[hh]);
            }
            if (lsum) {
                __m256 l = acc[0][u];
                UNROLL for (int hh = 1; hh < HB; hh++) l = _mm256_add_ps(l, acc[hh][u]);
                if (add) l = _mm256_add_ps(l, ldf(lsum + i + 8 * u, k));
                stf(lsum + i + 8 * u, k, l);
            }
        }
    }
    UNROLL for (int hh = 0; hh < HB; hh++) {
        const float bm = hmax8(vmax[hh]), mo = mrun[hh];
        const float mn = bm > mo ? bm : mo;
        if (mn > mo) zrun[hh] *= exp((double)mo - (double)mn); /* mo = -inf: 0 * 0 */
        mrun[hh] = mn;
        __m256 mhi, mlo, zv = _mm256_setzero_ps();
        exp_shift8(mn, &mhi, &mlo);
        float *x = e + (size_t)(h0 + hh) * n;
        int64_t i = i0;
        for (; i + 8 <= i0 + len; i += 8) {
            const __m256 w = exp_sub8(_mm256_loadu_ps(x + i), mhi, mlo);
            _mm256_storeu_ps(x + i, score_flush8(w));
            zv = _mm256_add_ps(zv, w);
        }
        if (i < i0 + len) {
            const int64_t k = i0 + len - i;
            const __m256 w = _mm256_and_ps(exp_sub8(ldf(x + i, k), mhi, mlo), _mm256_castsi256_ps(simd_lanes8(k)));
            stf(x + i, k, score_flush8(w));
            zv = _mm256_add_ps(zv, w);
        }
        zrun[hh] += hsum8(zv);
    }
    return read;
}

/* Heads whose running max and sum live on the stack; more take more passes. */
enum { KT_EXP_HEADS = 64 };

static ALWAYS_INLINE void kt_exp_avx2(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                                      int64_t n, float *e, float *scale, float *lsum, const int f16)
{
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    int64_t read = 0; /* K^T elements the first head block read (the rest: same lines, in cache) */
    for (int hc = 0; hc < g; hc += KT_EXP_HEADS) {
        const int hn = g - hc < KT_EXP_HEADS ? g - hc : KT_EXP_HEADS;
        float mrun[KT_EXP_HEADS];
        double zrun[KT_EXP_HEADS];
        for (int hh = 0; hh < hn; hh++) {
            mrun[hh] = -INFINITY;
            zrun[hh] = 0;
        }
        for (int64_t b = 0; b < nb; b++) {
            const int64_t i0 = b * ATTN_EXP_BLOCK;
            const int64_t len = n - i0 < ATTN_EXP_BLOCK ? n - i0 : ATTN_EXP_BLOCK;
            int h = 0;
            int64_t x = 0;
            for (; h + 4 <= hn; h += 4) {
                x = kt_exp_block(kv, qs, comp, r, hc + h, 4, n, i0, len, e, lsum, hc + h > 0, mrun + h, zrun + h, f16);
                if (hc + h == 0) read += x;
            }
            switch (hn - h) {
            case 3: x = kt_exp_block(kv, qs, comp, r, hc + h, 3, n, i0, len, e, lsum, hc + h > 0, mrun + h, zrun + h, f16); break;
            case 2: x = kt_exp_block(kv, qs, comp, r, hc + h, 2, n, i0, len, e, lsum, hc + h > 0, mrun + h, zrun + h, f16); break;
            case 1: x = kt_exp_block(kv, qs, comp, r, hc + h, 1, n, i0, len, e, lsum, hc + h > 0, mrun + h, zrun + h, f16); break;
            default: x = 0; break;
            }
            if (hc + h == 0) read += x;
            for (int hh = 0; hh < hn; hh++) scale[(size_t)(hc + hh) * nb + b] = mrun[hh];
        }
        /* the block maxima become exp(m_b - M) / Z, 8 blocks at a time */
        for (int hh = 0; hh < hn; hh++) {
            float *sc = scale + (size_t)(hc + hh) * nb;
            __m256 mhi, mlo;
            exp_shift8(mrun[hh], &mhi, &mlo);
            const __m256 inv = _mm256_set1_ps((float)(1.0 / zrun[hh]));
            for (int64_t b = 0; b < nb; b += 8) {
                const __m256 x = exp_sub8(ldf(sc + b, nb - b), mhi, mlo);
                stf(sc + b, nb - b, score_flush8(_mm256_mul_ps(x, inv)));
            }
        }
    }
    if (kv->meter) kv->meter->kt += read;
}

void attn_kt_exp_avx2(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g, int64_t n,
                      float *e, float *scale, float *lsum)
{
    if (kv->elem == KV_Q8_0) kt_exp_avx2(kv, qs, comp, r, g, n, e, scale, lsum, KQ8);
    else if (kv->elem == KV_F16) kt_exp_avx2(kv, qs, comp, r, g, n, e, scale, lsum, 1);
    else kt_exp_avx2(kv, qs, comp, r, g, n, e, scale, lsum, 0);
}

/* ---- group sum, top-k ----------------------------------------------------------------- */

/* 32 positions at a time, four independent FMA chains over the heads (one
 * at a time waits on FMA latency). ATTN_EXP_BLOCK % 32 == 0, so the 32
 * share one block scale. */
void attn_scaled_head_sum_avx2(const float *e, const float *scale, int g, int64_t n, int64_t m, float *out)
{
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    int64_t i = 0;
    for (; i + 32 <= m; i += 32) {
        const float *sc = scale + i / ATTN_EXP_BLOCK;
        __m256 a[4];
        UNROLL for (int u = 0; u < 4; u++) a[u] = _mm256_setzero_ps();
        for (int h = 0; h < g; h++) {
            const __m256 w = _mm256_broadcast_ss(sc + (size_t)h * nb);
            const float *eh = e + (size_t)h * n + i;
            UNROLL for (int u = 0; u < 4; u++) a[u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(eh + 8 * u), a[u]);
        }
        UNROLL for (int u = 0; u < 4; u++) _mm256_storeu_ps(out + i + 8 * u, a[u]);
    }
    for (; i < m; i += 8) {
        const int64_t k = m - i;
        const float *sc = scale + i / ATTN_EXP_BLOCK;
        __m256 a = _mm256_setzero_ps();
        for (int h = 0; h < g; h++) a = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + (size_t)h * nb), ldf(e + (size_t)h * n + i, k), a);
        stf(out + i, k, a);
    }
}

/* attn_topk_key of 8 floats (no NaN among them: the filter keeps none) */
static ALWAYS_INLINE __m256i topk_key8(__m256 x)
{
    __m256i b = _mm256_castps_si256(x);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    b = _mm256_andnot_si256(_mm256_cmpeq_epi32(b, sign), b); /* -0 -> +0 */
    return _mm256_xor_si256(b, _mm256_or_si256(_mm256_srai_epi32(b, 31), sign));
}

int64_t attn_topk_filter_avx2(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key)
{
    const __m256 vt = _mm256_set1_ps(t);
    const __m256i step = _mm256_set1_epi32(8);
    __m256i iv = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8, iv = _mm256_add_epi32(iv, step)) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, vt, _CMP_GE_OQ));
        if (!m) continue; /* most blocks hold no candidate */
        const int k = __builtin_popcount(m);
        _mm256_maskstore_epi32((int *)(idx + c), simd_lanes8(k), simd_compress8_epi32(iv, m));
        _mm256_maskstore_epi32((int *)(key + c), simd_lanes8(k), simd_compress8_epi32(topk_key8(v), m));
        c += k;
    }
    for (; i < n; i++)
        if (x[i] >= t) { /* NaN compares false: never kept */
            key[c] = attn_topk_key(x[i]);
            idx[c++] = (int32_t)i;
        }
    return c;
}

/* Unsigned order through signed compares: flip the top bit of both sides. */
static ALWAYS_INLINE __m256i flip(__m256i v) { return _mm256_xor_si256(v, _mm256_set1_epi32((int)0x80000000u)); }

int64_t attn_topk_above_avx2(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t, int32_t *idx)
{
    const __m256i vt = flip(_mm256_set1_epi32((int)t)), step = _mm256_set1_epi32(8);
    __m256i iv = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t c = 0, i = 0;
    for (; i + 8 <= m; i += 8, iv = _mm256_add_epi32(iv, step)) {
        const __m256i k8 = flip(_mm256_loadu_si256((const __m256i *)(const void *)(key + i)));
        const unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k8, vt)));
        if (!gt) continue;
        const __m256i v = pos ? _mm256_loadu_si256((const __m256i *)(const void *)(pos + i)) : iv;
        const int k = __builtin_popcount(gt);
        /* masked: idx may hold no more than the count (topk_emit's k) */
        _mm256_maskstore_epi32((int *)(idx + c), simd_lanes8(k), simd_compress8_epi32(v, gt));
        c += k;
    }
    for (; i < m; i++)
        if (key[i] > t) idx[c++] = pos ? pos[i] : (int32_t)i;
    return c;
}

int64_t attn_topk_partition_avx2(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out,
                                 int64_t *n_lo)
{
    const __m256i vp = flip(_mm256_set1_epi32((int)p));
    int64_t hi = 0, lo = m, i = 0;
    for (; i + 8 <= m; i += 8) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(key + i)), f = flip(v);
        const unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(f, vp)));
        const unsigned lt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(vp, f)));
        const int ng = __builtin_popcount(gt), nl = __builtin_popcount(lt);
        _mm256_maskstore_epi32((int *)(out + hi), simd_lanes8(ng), simd_compress8_epi32(v, gt));
        lo -= nl; /* the smaller keys fill the buffer from its end */
        _mm256_maskstore_epi32((int *)(out + lo), simd_lanes8(nl), simd_compress8_epi32(v, lt));
        hi += ng;
    }
    for (; i < m; i++) {
        if (key[i] > p) out[hi++] = key[i];
        else if (key[i] < p) out[--lo] = key[i];
    }
    *n_lo = m - lo;
    return hi;
}

static int64_t count_ge(const uint32_t *key, int64_t m, uint32_t t)
{
    /* key >= t  <=>  !(t > key), per lane -1 (true) or 0 subtracted */
    const __m256i vt = flip(_mm256_set1_epi32((int)t));
    __m256i c = _mm256_setzero_si256();
    int64_t i = 0, tail = 0;
    for (; i + 8 <= m; i += 8) {
        const __m256i lt = _mm256_cmpgt_epi32(vt, flip(_mm256_loadu_si256((const __m256i *)(const void *)(key + i))));
        c = _mm256_sub_epi32(c, _mm256_xor_si256(lt, _mm256_set1_epi32(-1)));
    }
    for (; i < m; i++) tail += key[i] >= t;
    /* lanes count at most m / 8 < 2^31 each; summed in 64 bits */
    int32_t l[8];
    _mm256_storeu_si256((__m256i *)(void *)l, c);
    int64_t s = tail;
    for (int u = 0; u < 8; u++) s += (uint32_t)l[u];
    return s;
}

uint32_t attn_topk_kth_key_avx2(const uint32_t *key, int64_t m, int64_t k)
{
    /* the answer lies between the smallest and the largest key */
    __m256i vlo = _mm256_set1_epi32(-1), vhi = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(key + i));
        vlo = _mm256_min_epu32(vlo, v);
        vhi = _mm256_max_epu32(vhi, v);
    }
    uint32_t l[8], h[8];
    _mm256_storeu_si256((__m256i *)(void *)l, vlo);
    _mm256_storeu_si256((__m256i *)(void *)h, vhi);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (int u = 0; u < 8; u++) {
        lo = l[u] < lo ? l[u] : lo;
        hi = h[u] > hi ? h[u] : hi;
    }
    for (; i < m; i++) {
        lo = key[i] < lo ? key[i] : lo;
        hi = key[i] > hi ? key[i] : hi;
    }
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2 + 1;
        if (count_ge(key, m, mid) >= k) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* ---- gather ------------------------------------------------------------------------ */

/* Two passes (all scores, then the softmax-weighted values), as the
 * AVX-512 twin: gathered V rows are requested into L2 while the scores
 * pass waits on K, so the second pass finds them there. */
void attn_gather_group_avx2(const attn_kv_view *kv, const float *q, int g, const int32_t *sel, int64_t n_sel,
                            float *out, float *scratch, float *lse)
{
    if (n_sel <= 0) {
        attn_gather_none(g, kv->d, out, lse);
        return;
    }
    /* V rows requested during the scores pass: up to 512 KiB, which stays in L2 */
    const size_t row_bytes = attn_kv_row_bytes(kv->elem, kv->d);
    const int64_t v_rows = sel ? (int64_t)(((size_t)512 << 10) / row_bytes) : 0;
    if (attn_q8i_applies(kv)) attn_scores_q8i_avx2(kv, q, g, sel, n_sel, scratch);
    else if (kv->elem == KV_Q8_0) scores_avx2(kv, q, g, sel, n_sel, scratch, v_rows, KQ8);
    else if (kv->elem == KV_F16) scores_avx2(kv, q, g, sel, n_sel, scratch, v_rows, 1);
    else scores_avx2(kv, q, g, sel, n_sel, scratch, v_rows, 0);
    attn_softmax_weighted_sum_avx2(kv, scratch, g, sel, n_sel, out, lse);
}

const attn_kernels attn_kernels_avx2 = {
    attn_topk_filter_avx2, attn_scores_avx2, attn_softmax_avx2, attn_weighted_sum_avx2,
    attn_kt_logits_avx2, attn_softmax_weighted_sum_avx2, attn_kt_exp_avx2,
    attn_scaled_head_sum_avx2, attn_topk_kth_key_avx2, attn_topk_above_avx2, attn_topk_partition_avx2,
    attn_gather_group_avx2,
};

#else
typedef int attn_kernels_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
