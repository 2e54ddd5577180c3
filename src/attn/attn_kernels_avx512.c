/* attn_kernels_avx512.c - the AVX-512 twins of attn.h's kernels.
 *
 * Same signatures as the plain-C `_ref` kernels (attn_kernels_ref.c) and the
 * same results to f32 rounding; attn.c's dispatch picks these when the build
 * targets AVX-512 (tests/test_attn.c compares every pair over odd sizes).
 *
 * Map of this file:
 *   helpers             loads of f16/f32/Q8_0 rows, tail masks, exp, transpose-add
 *   scores              q . K rows, 16 rows per transpose-add tree
 *   softmax             in place
 *   weighted sums       V rows weighted by given weights, or by softmax(scores)
 *   K^T logits          SparQ's scores from r rows of K^T; the fused exp pass
 *   group sum, top-k    attn_scaled_head_sum, attn_topk_filter, _kth_key, _partition
 *   gather              attn_gather_group
 *
 * What bounds them: at g = 4 query heads per KV head every K or V element
 * read costs 4 FMAs and one conversion, so dense decode attention runs near
 * the core's FMA rate (one 16-lane FMA per cycle on Zen 4) as much as at
 * memory bandwidth; the kernels therefore convert each element once for
 * the whole group, keep partial sums in registers, and avoid extra passes.
 */
#include "attn/attn_kernels.h"

#ifdef ATTN_HAVE_AVX512
#include "attn/attn_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

/* The tile functions take their shape (heads per tile, masked or not, f16)
 * as arguments that are constants at every call site; forced inlining and
 * unrolling turn their small arrays of vectors into registers. */
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* 16 elements of a K/V row from `p` (f16 or f32), lanes outside m zero.
 * `f16` is a compile-time constant at every call site (the kernels below
 * are instantiated once per element type), so the branch folds away. */
static ALWAYS_INLINE __m512 ld16(const void *p, int64_t at, int f16, __mmask16 m)
{
    if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + at));
    return _mm512_maskz_loadu_ps(m, (const float *)p + at);
}

static ALWAYS_INLINE __m512 ld16_full(const void *p, int64_t at, int f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at)));
    return _mm512_loadu_ps((const float *)p + at);
}

/* Element type codes of the kernels' compile-time `f16` argument: 0 f32,
 * 1 f16, KQ8 Q8_0 (attn.h). */
enum { KQ8 = 2 };

/* 16 elements from element e (a multiple of 16, so one block holds them
 * all) of the Q8_0 row at `row`, lanes outside m zero: int8 widened and
 * scaled by the block's f16 scale. */
static ALWAYS_INLINE __m512 ld16_q8(const uint8_t *row, int64_t e, __mmask16 m)
{
    if (!m) return _mm512_setzero_ps(); /* past the row: not even its block's scale exists */
    const uint8_t *blk = row + (size_t)(e / ATTN_Q8_BLOCK) * ATTN_Q8_BLOCK_BYTES;
    uint16_t h;
    memcpy(&h, blk, 2);
    /* a partial block (the row's tail) is copied out: a short last block
     * may end the allocation, and ASan checks the whole 16-byte access of
     * a masked load */
    __m128i q;
    if (m == 0xffff) {
        q = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + e % ATTN_Q8_BLOCK));
    } else {
        uint8_t tmp[16] = { 0 };
        memcpy(tmp, blk + 2 + e % ATTN_Q8_BLOCK, (size_t)__builtin_popcount((unsigned)m));
        q = _mm_loadu_si128((const __m128i *)(const void *)tmp);
    }
    return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
}

/* Row units of a K/V row: elements (f16, f32) or bytes (Q8_0), so that
 * row * kv_row_units is where the row starts for ldrow. */
static ALWAYS_INLINE int64_t kv_row_units(int d, const int f16)
{
    return f16 == KQ8 ? (int64_t)attn_q8_row_bytes(d) : d;
}

/* 16 elements from element j of the row starting at `at` row units. */
static ALWAYS_INLINE __m512 ldrow(const void *p, int64_t at, int64_t j, const int f16, __mmask16 m)
{
    if (f16 == KQ8) return ld16_q8((const uint8_t *)p + at, j, m);
    return ld16(p, at + j, f16, m);
}

static ALWAYS_INLINE __m512 ldrow_full(const void *p, int64_t at, int64_t j, const int f16)
{
    if (f16 == KQ8) return ld16_q8((const uint8_t *)p + at, j, 0xffff);
    return ld16_full(p, at + j, f16);
}

static ALWAYS_INLINE size_t kv_row_bytes(int d, const int f16)
{
    return f16 == KQ8 ? attn_q8_row_bytes(d) : (size_t)d * (f16 ? 2 : 4);
}

/* Transpose-add tree: 16 vectors (one per row) -> one vector whose lane u
 * is the horizontal sum of row u, in 15 pair merges of 3 operations
 * instead of 16 separate reductions. tree2 merges 4 rows: lane 4b + u =
 * the sum of lanes 4b..4b+3 of row u. pair_sum merges two results of the
 * same shape (rows 0-3 and 4-7, then 0-7 and 8-15) by adding 128-bit
 * blocks pairwise. */
static ALWAYS_INLINE __m512 tree2(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512d xd = _mm512_castps_pd(x), yd = _mm512_castps_pd(y);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(xd, yd)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(xd, yd)));
}

static ALWAYS_INLINE __m512 pair_sum(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
}

/* ---- scores --------------------------------------------------------------- */

/* Dot products of 4 rows (element offsets at[u]) with HB <= 4 query heads,
 * reduced by the tree's first two levels into b[hh]. 16 accumulators and
 * the HB query chunks stay in registers, so each q chunk load serves 4
 * rows and each converted K chunk serves HB heads. */
static ALWAYS_INLINE void scores_quad(const attn_kv_view *kv, const float *qh, const int HB,
                                      const int64_t at[4], __m512 b[4], const int f16)
{
    const int d = kv->d, dfull = d & ~15;
    __m512 a[4][4];
    UNROLL for (int u = 0; u < 4; u++)
        UNROLL for (int hh = 0; hh < HB; hh++) a[u][hh] = _mm512_setzero_ps();
    int j = 0;
    for (; j < dfull; j += 16) {
        __m512 qv[4];
        /* the empty asm pins each q chunk in a register: otherwise gcc folds
         * the load into every FMA, 4 loads per chunk instead of one */
        UNROLL for (int hh = 0; hh < HB; hh++) {
            qv[hh] = _mm512_loadu_ps(qh + hh * d + j);
            __asm__("" : "+v"(qv[hh]));
        }
        UNROLL for (int u = 0; u < 4; u++) {
            const __m512 k = ldrow_full(kv->K, at[u], j, f16);
            UNROLL for (int hh = 0; hh < HB; hh++) a[u][hh] = _mm512_fmadd_ps(qv[hh], k, a[u][hh]);
        }
    }
    if (j < d) {
        const __mmask16 mt = tail_mask(d - j);
        __m512 qv[4];
        UNROLL for (int hh = 0; hh < HB; hh++) qv[hh] = _mm512_maskz_loadu_ps(mt, qh + hh * d + j);
        UNROLL for (int u = 0; u < 4; u++) {
            const __m512 k = ldrow(kv->K, at[u], j, f16, mt);
            UNROLL for (int hh = 0; hh < HB; hh++) a[u][hh] = _mm512_fmadd_ps(qv[hh], k, a[u][hh]);
        }
    }
    UNROLL for (int hh = 0; hh < HB; hh++) b[hh] = tree2(a[0][hh], a[1][hh], a[2][hh], a[3][hh]);
}

/* Scores of HB (<= 4) heads h0.. over one block of nb <= 16 rows starting
 * at i0, written to so[(h0+hh)*ss + u]. The tree runs as the quads finish,
 * so at most 8 partial vectors wait beside the 16 accumulators (no spills).
 * Lanes past nb reuse a valid row and are masked off at the store. Returns
 * the rows it scored (the quads' rows below nb). */
static ALWAYS_INLINE int scores_block(const attn_kv_view *kv, const float *q, int h0,
                                      const int HB, const int32_t *rows, int64_t i0, int nb,
                                      float scale, float *so, int64_t ss, const int f16)
{
    const int d = kv->d;
    const float *qh = q + (size_t)h0 * d;
    int scored = 0;
    __m512 c[2][4];
    UNROLL for (int half = 0; half < 2; half++) {
        __m512 b[2][4];
        UNROLL for (int qd = 0; qd < 2; qd++) {
            const int r0 = 8 * half + 4 * qd;
            if (r0 >= nb) { /* past the last row: nothing to compute */
                UNROLL for (int hh = 0; hh < HB; hh++) b[qd][hh] = _mm512_setzero_ps();
                continue;
            }
            int64_t at[4];
            UNROLL for (int u = 0; u < 4; u++) {
                const int64_t rr = r0 + u < nb ? i0 + r0 + u : i0;
                at[u] = (rows ? rows[rr] : rr) * kv_row_units(d, f16);
            }
            scores_quad(kv, qh, HB, at, b[qd], f16);
            scored += nb - r0 < 4 ? nb - r0 : 4;
        }
        UNROLL for (int hh = 0; hh < HB; hh++) c[half][hh] = pair_sum(b[0][hh], b[1][hh]);
    }
    const __mmask16 m = tail_mask(nb);
    UNROLL for (int hh = 0; hh < HB; hh++)
        _mm512_mask_storeu_ps(so + (h0 + hh) * ss, m,
                              _mm512_mul_ps(pair_sum(c[0][hh], c[1][hh]), _mm512_set1_ps(scale)));
    return scored;
}

/* Scores of all g heads for rows [i0, i0+nb), nb <= 16, written to
 * so[h*ss + (i - i0)]. Returns the rows the first head block scored (the
 * later blocks find the same rows in L1). */
static ALWAYS_INLINE int scores_rows16(const attn_kv_view *kv, const float *q, int g,
                                       const int32_t *rows, int64_t i0, int nb, float scale,
                                       float *so, int64_t ss, const int f16)
{
    int h0 = 0, scored = 0;
    for (; h0 + 4 <= g; h0 += 4) {
        const int n = scores_block(kv, q, h0, 4, rows, i0, nb, scale, so, ss, f16);
        if (h0 == 0) scored = n;
    }
    int n = 0;
    switch (g - h0) {
    case 3: n = scores_block(kv, q, h0, 3, rows, i0, nb, scale, so, ss, f16); break;
    case 2: n = scores_block(kv, q, h0, 2, rows, i0, nb, scale, so, ss, f16); break;
    case 1: n = scores_block(kv, q, h0, 1, rows, i0, nb, scale, so, ss, f16); break;
    default: break;
    }
    return h0 == 0 ? n : scored;
}

/* Gathered rows: K rows this far ahead are requested (a row is 4 lines at
 * d = 128 f16; 64 ahead beat 16 and 32). Rows below v_rows also get their V
 * row requested, for the weighted sum that follows. Contiguous rows are
 * requested stream_ahead_rows ahead, running on into V (attn_prefetch.h). */
enum { SCORES_AHEAD = 64 };

static ALWAYS_INLINE void scores_avx512(const attn_kv_view *kv, const float *q, int g,
                                        const int32_t *rows, int64_t n, float *s,
                                        int64_t v_rows, const int f16)
{
    const float scale = 1.0f / sqrtf((float)kv->d);
    const size_t row_bytes = kv_row_bytes(kv->d, f16);
    const int64_t ahead = rows ? SCORES_AHEAD : stream_ahead_rows(row_bytes);
    int64_t scored = 0; /* rows read, for kv->meter: one add per 16 rows */
    if (rows) prefetch_rows(kv->K, rows, 0, n < ahead ? n : ahead, row_bytes);
    else prefetch_kv_stream(kv->K, kv->V, n, n, 0, ahead, row_bytes);
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
        const int nb = n - i0 < 16 ? (int)(n - i0) : 16;
        if (rows) {
            const int64_t a = i0 + ahead, b = a + 16 < n ? a + 16 : n;
            prefetch_rows(kv->K, rows, a, b, row_bytes);
            if (i0 < v_rows) prefetch_rows(kv->V, rows, i0, i0 + nb, row_bytes);
        } else {
            prefetch_kv_stream(kv->K, kv->V, n, n, i0 + ahead, i0 + ahead + 16, row_bytes);
        }
        scored += scores_rows16(kv, q, g, rows, i0, nb, scale, s + i0, n, f16);
    }
    if (kv->meter) kv->meter->k += scored * kv->d;
}

void attn_scores_avx512(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                        int64_t n, float *s)
{
    if (attn_q8i_applies(kv)) {
        attn_scores_q8i_avx512(kv, q, g, rows, n, s);
        return;
    }
    if (kv->elem == KV_Q8_0) scores_avx512(kv, q, g, rows, n, s, 0, KQ8);
    else if (kv->elem == KV_F16) scores_avx512(kv, q, g, rows, n, s, 0, 1);
    else scores_avx512(kv, q, g, rows, n, s, 0, 0);
}

/* ---- softmax ---------------------------------------------------------------- */


void attn_softmax_avx512(float *s, int g, int64_t n)
{
    for (int h = 0; h < g; h++) {
        float *x = s + h * n;
        const __m512 mx = _mm512_set1_ps(max_of(x, n));
        double sum = 0; /* per 64 vectors into double: f32 lanes would drift */
        for (int64_t i0 = 0; i0 < n; i0 += 1024) {
            __m512 vsum = _mm512_setzero_ps();
            for (int64_t i = i0; i < n && i < i0 + 1024; i += 16) {
                const __mmask16 m = tail_mask(n - i);
                const __m512 e = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mx));
                _mm512_mask_storeu_ps(x + i, m, e);
                vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
            }
            sum += _mm512_reduce_add_ps(vsum);
        }
        const __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = tail_mask(n - i);
            _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
        }
    }
}

/* ---- weighted sums ------------------------------------------------------------ */

/* out[h0..h0+HB)[j0..j0+64) += sum over rows i in [i0, i0+nb) of
 * wb[h*ws + i - i0] * V[i]. The 64 output columns of HB <= 4 heads are 16
 * accumulators held in registers; `masked` tiles (the last, when
 * d % 64 != 0) load with lane masks. pf_n > 0: V is pf_n contiguous rows,
 * and each row visited has the row stream_ahead_rows on requested, one row
 * at a time: a block's rows requested at once stalled the loads behind them
 * (slower than no request at all), spread this way the 32k dense op ran
 * 8-12% faster (docs/bench-results/dense-prefetch-ab-2026-12-07-f26).
 * Returns the V elements it read: rows visited x the tile's columns. */
static ALWAYS_INLINE int64_t wsum_tile(const attn_kv_view *kv, const float *wb, int64_t ws, int h0,
                                       const int HB, const int masked, const int32_t *rows,
                                       int64_t i0, int64_t nb, int j0, float *out, int64_t pf_n,
                                       const int f16)
{
    const int d = kv->d;
    const size_t rb = kv_row_bytes(d, f16);
    const int64_t ahead = stream_ahead_rows(rb);
    __mmask16 mk[4];
    UNROLL for (int c = 0; c < 4; c++) mk[c] = !masked ? 0xffff : tail_mask(d - j0 - 16 * c);
    float *o = out + (size_t)h0 * d + j0;
    const float *wh = wb + h0 * ws - i0;
    __m512 acc[4][4];
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int c = 0; c < 4; c++)
            acc[hh][c] = _mm512_maskz_loadu_ps(mk[c], o + hh * d + 16 * c);
    int64_t i = i0;
    for (; i < i0 + nb; i++) {
        const int64_t at = (rows ? rows[i] : i) * kv_row_units(d, f16);
        if (i + ahead < pf_n) prefetch_span(kv->V, i + ahead, i + ahead + 1, rb);
        __m512 v[4];
        UNROLL for (int c = 0; c < 4; c++)
            v[c] = masked ? ldrow(kv->V, at, j0 + 16 * c, f16, mk[c])
                          : ldrow_full(kv->V, at, j0 + 16 * c, f16);
        UNROLL for (int hh = 0; hh < HB; hh++) {
            const __m512 wi = _mm512_set1_ps(wh[hh * ws + i]);
            UNROLL for (int c = 0; c < 4; c++) acc[hh][c] = _mm512_fmadd_ps(wi, v[c], acc[hh][c]);
        }
    }
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(o + hh * d + 16 * c, mk[c], acc[hh][c]);
    return (i - i0) * (masked ? d - j0 : 64);
}

/* The row's tiles; the first requests the rows ahead (pf_n), the later
 * find them in L1. */
static ALWAYS_INLINE int64_t wsum_tiles(const attn_kv_view *kv, const float *wb, int64_t ws, int h0,
                                        const int HB, const int32_t *rows, int64_t i0, int64_t nb,
                                        float *out, int64_t pf_n, const int f16)
{
    int j0 = 0;
    int64_t read = 0;
    for (; j0 + 64 <= kv->d; j0 += 64)
        read += wsum_tile(kv, wb, ws, h0, HB, 0, rows, i0, nb, j0, out, j0 ? 0 : pf_n, f16);
    if (j0 < kv->d) read += wsum_tile(kv, wb, ws, h0, HB, 1, rows, i0, nb, j0, out, j0 ? 0 : pf_n, f16);
    return read;
}

/* out[h] += sum over rows [i0, i0+nb) of wb[h*ws + i - i0] * V[i], all g heads;
 * pf_n as wsum_tile's (the first head block requests). Returns the V
 * elements the first head block read (the later blocks find the rows in L1). */
static ALWAYS_INLINE int64_t wsum_rows(const attn_kv_view *kv, const float *wb, int64_t ws, int g,
                                       const int32_t *rows, int64_t i0, int64_t nb, float *out,
                                       int64_t pf_n, const int f16)
{
    int h0 = 0;
    int64_t read = 0, n = 0;
    for (; h0 + 4 <= g; h0 += 4) {
        n = wsum_tiles(kv, wb, ws, h0, 4, rows, i0, nb, out, h0 ? 0 : pf_n, f16);
        if (h0 == 0) read = n;
    }
    n = 0;
    const int64_t pf = h0 ? 0 : pf_n;
    switch (g - h0) {
    case 3: n = wsum_tiles(kv, wb, ws, h0, 3, rows, i0, nb, out, pf, f16); break;
    case 2: n = wsum_tiles(kv, wb, ws, h0, 2, rows, i0, nb, out, pf, f16); break;
    case 1: n = wsum_tiles(kv, wb, ws, h0, 1, rows, i0, nb, out, pf, f16); break;
    default: break;
    }
    return h0 == 0 ? n : read;
}

enum { WSUM_BLOCK = 32 }; /* rows per block: their V stays in L1 across tiles */

static ALWAYS_INLINE void weighted_sum_avx512(const attn_kv_view *kv, const float *w, int g,
                                              const int32_t *rows, int64_t n, float *out,
                                              const int f16)
{
    const size_t row_bytes = kv_row_bytes(kv->d, f16);
    int64_t read = 0;
    memset(out, 0, (size_t)g * kv->d * sizeof *out);
    for (int64_t i0 = 0; i0 < n; i0 += WSUM_BLOCK) {
        const int64_t nb = n - i0 < WSUM_BLOCK ? n - i0 : WSUM_BLOCK;
        if (rows)
            prefetch_rows(kv->V, rows, i0 + WSUM_BLOCK,
                          i0 + 2 * WSUM_BLOCK < n ? i0 + 2 * WSUM_BLOCK : n, row_bytes);
        read += wsum_rows(kv, w + i0, n, g, rows, i0, nb, out, rows ? 0 : n, f16);
    }
    if (kv->meter) kv->meter->v += read;
}

void attn_weighted_sum_avx512(const attn_kv_view *kv, const float *w, int g,
                              const int32_t *rows, int64_t n, float *out)
{
    if (kv->elem == KV_Q8_0) weighted_sum_avx512(kv, w, g, rows, n, out, KQ8);
    else if (kv->elem == KV_F16) weighted_sum_avx512(kv, w, g, rows, n, out, 1);
    else weighted_sum_avx512(kv, w, g, rows, n, out, 0);
}

/* Heads per pass of softmax_weighted_sum: their weights for one block of
 * rows live on the stack (16 x 32 floats); more heads take more passes. */
enum { SWS_HEADS = 16 };

/* The weights of one block are exp(s - max) computed into wb just before
 * the block's V rows are read, and the row sums divide at the end: no
 * separate softmax passes over the g*n scores. */
static ALWAYS_INLINE void softmax_wsum_avx512(const attn_kv_view *kv, const float *s, int g,
                                              const int32_t *rows, int64_t n, float *out,
                                              float *lse, const int f16)
{
    const int d = kv->d;
    const size_t row_bytes = kv_row_bytes(d, f16);
    int64_t read = 0; /* V elements of the first pass (heads past SWS_HEADS re-read them) */
    for (int hc = 0; hc < g; hc += SWS_HEADS) {
        const int hn = g - hc < SWS_HEADS ? g - hc : SWS_HEADS;
        float mx[SWS_HEADS];
        double z[SWS_HEADS];
        float wb[SWS_HEADS * WSUM_BLOCK] __attribute__((aligned(64)));
        for (int hh = 0; hh < hn; hh++) {
            mx[hh] = max_of(s + (size_t)(hc + hh) * n, n);
            z[hh] = 0;
        }
        float *o = out + (size_t)hc * d;
        memset(o, 0, (size_t)hn * d * sizeof *o);
        for (int64_t i0 = 0; i0 < n; i0 += WSUM_BLOCK) {
            const int64_t nb = n - i0 < WSUM_BLOCK ? n - i0 : WSUM_BLOCK;
            if (rows)
                prefetch_rows(kv->V, rows, i0 + WSUM_BLOCK,
                              i0 + 2 * WSUM_BLOCK < n ? i0 + 2 * WSUM_BLOCK : n, row_bytes);
            const __mmask16 m0 = tail_mask(nb), m1 = tail_mask(nb - 16);
            for (int hh = 0; hh < hn; hh++) {
                const float *x = s + (size_t)(hc + hh) * n + i0;
                __m512 mhi, mlo;
                exp_shift(mx[hh], &mhi, &mlo);
                const __m512 w0 = _mm512_maskz_mov_ps(m0, exp_sub(_mm512_maskz_loadu_ps(m0, x), mhi, mlo));
                const __m512 w1 = _mm512_maskz_mov_ps(m1, exp_sub(_mm512_maskz_loadu_ps(m1, x + 16), mhi, mlo));
                _mm512_store_ps(wb + hh * WSUM_BLOCK, w0);
                _mm512_store_ps(wb + hh * WSUM_BLOCK + 16, w1);
                z[hh] += _mm512_reduce_add_ps(_mm512_add_ps(w0, w1));
            }
            const int64_t nr = wsum_rows(kv, wb, WSUM_BLOCK, hn, rows, i0, nb, o, rows || hc ? 0 : n, f16);
            if (hc == 0) read += nr;
        }
        for (int hh = 0; hh < hn; hh++) {
            if (lse) lse[hc + hh] = mx[hh] + (float)log(z[hh]);
            const __m512 inv = _mm512_set1_ps((float)(1.0 / z[hh]));
            for (int j = 0; j < d; j += 16) {
                const __mmask16 m = tail_mask(d - j);
                float *oj = o + (size_t)hh * d + j;
                _mm512_mask_storeu_ps(oj, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, oj), inv));
            }
        }
    }
    if (kv->meter) kv->meter->v += read;
}

void attn_softmax_weighted_sum_avx512(const attn_kv_view *kv, const float *s, int g,
                                      const int32_t *rows, int64_t n, float *out, float *lse)
{
    if (n <= 0) {
        memset(out, 0, (size_t)g * kv->d * sizeof *out);
        for (int h = 0; lse && h < g; h++) lse[h] = -INFINITY;
        return;
    }
    if (attn_q8i_applies(kv)) attn_softmax_weighted_sum_q8i_avx512(kv, s, g, rows, n, out, lse);
    else if (kv->elem == KV_Q8_0) softmax_wsum_avx512(kv, s, g, rows, n, out, lse, KQ8);
    else if (kv->elem == KV_F16) softmax_wsum_avx512(kv, s, g, rows, n, out, lse, 1);
    else softmax_wsum_avx512(kv, s, g, rows, n, out, lse, 0);
}

/* ---- K^T logits ------------------------------------------------------------------ */

/* K^T tile: KT_NV vectors of 16 positions. The accumulators (HB x KT_NV)
 * stay in registers over all r rows; each broadcast q value serves KT_NV
 * FMAs (a broadcast costs an FP slot beside the FMAs: 2 vectors measured
 * 15% slower). KT_AHEAD: prefetch distance for K^T rows in positions, far
 * enough to cover memory latency (1 KiB per row), near enough that the 16
 * rows' lines, which share L2 sets, are used before they are evicted
 * (256 and 1024 measured no better, none 50% slower). */
enum { KT_NV = 4, KT_TILE = 16 * KT_NV, KT_AHEAD = 512 };

/* Logits of HB <= 4 heads h0.. at the KT_TILE positions from i (lanes at
 * or past `left` zero when `masked`): acc[hh][v] = sum_c qs[(h0+hh)*r + c]
 * * KT[comp[c]][i + 16v + lane]. Each K^T row gives whole 64-byte lines
 * per tile, used as they arrive. K^T rows are usually a power of two apart
 * and share cache sets, so lines requested early into L1 would evict each
 * other; `pf` (elements, 0 = none) requests the lines that far ahead into
 * L2 instead. Returns the K^T rows it read (r). */
static ALWAYS_INLINE int kt_tile(const attn_kv_view *kv, const float *qs, const int32_t *comp,
                                 int r, int h0, const int HB, int64_t i, int64_t left,
                                 const int masked, int64_t pf, __m512 acc[4][KT_NV],
                                 const int f16)
{
    const size_t es = f16 ? 2 : 4;
    /* the tile lies on one side of kt_split (a multiple of ATTN_EXP_BLOCK) */
    const int tail = kv->KT_tail && i >= kv->kt_split;
    const char *kt = (const char *)(tail ? kv->KT_tail : kv->KT);
    const int64_t stride = tail ? kv->kt_tail_stride : kv->kt_stride;
    if (tail) i -= kv->kt_split;
    __mmask16 mk[KT_NV];
    UNROLL for (int v = 0; v < KT_NV; v++) mk[v] = masked ? tail_mask(left - 16 * v) : 0xffff;
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int v = 0; v < KT_NV; v++) acc[hh][v] = _mm512_setzero_ps();
    const float *qc = qs + (size_t)h0 * r;
    int c = 0;
    for (; c < r; c++) {
        __m512 v[KT_NV];
        if (f16 == KQ8) { /* i is a multiple of KT_TILE: whole blocks */
            const uint8_t *row = (const uint8_t *)kt + (size_t)comp[c] * attn_q8_row_bytes(stride);
            if (pf)
                UNROLL for (size_t o = 0; o < KT_TILE / 32 * 34; o += 64)
                    _mm_prefetch((const char *)row + (size_t)(i + pf) / 32 * 34 + o, _MM_HINT_T1);
            UNROLL for (int u = 0; u < KT_NV; u++) v[u] = ld16_q8(row, i + 16 * u, mk[u]);
        } else {
            const char *p = kt + ((size_t)comp[c] * (size_t)stride + (size_t)i) * es;
            if (pf)
                UNROLL for (size_t o = 0; o < KT_TILE * es; o += 64) _mm_prefetch(p + pf * es + o, _MM_HINT_T1);
            UNROLL for (int u = 0; u < KT_NV; u++)
                v[u] = masked ? ld16(p, 16 * u, f16, mk[u]) : ld16_full(p, 16 * u, f16);
        }
        UNROLL for (int hh = 0; hh < HB; hh++) {
            const __m512 qv = _mm512_set1_ps(qc[hh * r + c]);
            UNROLL for (int u = 0; u < KT_NV; u++) acc[hh][u] = _mm512_fmadd_ps(qv, v[u], acc[hh][u]);
        }
    }
    return c; /* K^T rows read */
}

/* One block [i0, i0+len) of HB heads from h0: logits into s (row stride n),
 * lanes past the end untouched. Returns the K^T elements read: per tile,
 * rows x positions. */
static ALWAYS_INLINE int64_t kt_logits_block(const attn_kv_view *kv, const float *qs,
                                             const int32_t *comp, int r, int h0, const int HB,
                                             int64_t n, int64_t i0, int64_t len, float *s,
                                             const int f16)
{
    int64_t read = 0;
    for (int64_t i = i0; i < i0 + len; i += KT_TILE) {
        const int64_t left = i0 + len - i, pf = i + KT_AHEAD < n ? KT_AHEAD : 0;
        __m512 acc[4][KT_NV];
        if (left >= KT_TILE) read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 0, pf, acc, f16) * KT_TILE;
        else read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 1, pf, acc, f16) * left;
        UNROLL for (int hh = 0; hh < HB; hh++)
            UNROLL for (int u = 0; u < KT_NV; u++)
                _mm512_mask_storeu_ps(s + (size_t)(h0 + hh) * n + i + 16 * u,
                                      tail_mask(left - 16 * u), acc[hh][u]);
    }
    return read;
}

static ALWAYS_INLINE void kt_logits_avx512(const attn_kv_view *kv, const float *qs,
                                           const int32_t *comp, int r, int g, int64_t n,
                                           float *s, const int f16)
{
    /* block-major: heads after the first four find the block's K^T lines
     * in cache instead of streaming K^T again (so only the first four's
     * reads are counted) */
    int64_t read = 0;
    for (int64_t i0 = 0; i0 < n; i0 += ATTN_EXP_BLOCK) {
        const int64_t len = n - i0 < ATTN_EXP_BLOCK ? n - i0 : ATTN_EXP_BLOCK;
        int h0 = 0;
        for (; h0 + 4 <= g; h0 += 4) {
            const int64_t e = kt_logits_block(kv, qs, comp, r, h0, 4, n, i0, len, s, f16);
            if (h0 == 0) read += e;
        }
        int64_t e = 0;
        switch (g - h0) {
        case 3: e = kt_logits_block(kv, qs, comp, r, h0, 3, n, i0, len, s, f16); break;
        case 2: e = kt_logits_block(kv, qs, comp, r, h0, 2, n, i0, len, s, f16); break;
        case 1: e = kt_logits_block(kv, qs, comp, r, h0, 1, n, i0, len, s, f16); break;
        default: break;
        }
        if (h0 == 0) read += e;
    }
    if (kv->meter) kv->meter->kt += read;
}

void attn_kt_logits_avx512(const attn_kv_view *kv, const float *qs, const int32_t *comp,
                           int r, int g, int64_t n, float *s)
{
    if (kv->elem == KV_Q8_0) kt_logits_avx512(kv, qs, comp, r, g, n, s, KQ8);
    else if (kv->elem == KV_F16) kt_logits_avx512(kv, qs, comp, r, g, n, s, 1);
    else kt_logits_avx512(kv, qs, comp, r, g, n, s, 0);
}

/* x, or exactly 0 where x < ATTN_SCORE_MIN (attn_exp.h) */
static ALWAYS_INLINE __m512 score_flush(__m512 x)
{
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(ATTN_SCORE_MIN), _CMP_GE_OQ), x);
}

/* attn_kt_exp for HB heads from h0 over block [i0, i0+len): logits into e
 * with their block maximum tracked on the way, then (block still in L1)
 * mrun/zrun (the heads' running max and sum of exp against it) updated and
 * the block exponentiated in place. lsum gets (add: adds) the heads' sum.
 * Returns the K^T elements read: per tile, rows x positions. */
static ALWAYS_INLINE int64_t kt_exp_block(const attn_kv_view *kv, const float *qs,
                                       const int32_t *comp, int r, int h0, const int HB,
                                       int64_t n, int64_t i0, int64_t len, float *e, float *lsum,
                                       int add, float *mrun, double *zrun, const int f16)
{
    __m512 vmax[4];
    int64_t read = 0;
    UNROLL for (int hh = 0; hh < HB; hh++) vmax[hh] = _mm512_set1_ps(-INFINITY);
    for (int64_t i = i0; i < i0 + len; i += KT_TILE) {
        const int64_t left = i0 + len - i, pf = i + KT_AHEAD < n ? KT_AHEAD : 0;
        __m512 acc[4][KT_NV];
        if (left >= KT_TILE) read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 0, pf, acc, f16) * KT_TILE;
        else read += (int64_t)kt_tile(kv, qs, comp, r, h0, HB, i, left, 1, pf, acc, f16) * left;
        __mmask16 mk[KT_NV];
        UNROLL for (int u = 0; u < KT_NV; u++) mk[u] = tail_mask(left - 16 * u);
        UNROLL for (int hh = 0; hh < HB; hh++)
            UNROLL for (int u = 0; u < KT_NV; u++) {
                _mm512_mask_storeu_ps(e + (size_t)(h0 + hh) * n + i + 16 * u, mk[u], acc[hh][u]);
                vmax[hh] = _mm512_mask_max_ps(vmax[hh], mk[u], vmax[hh], acc[hh][u]);
            }
        if (lsum)
            UNROLL for (int u = 0; u < KT_NV; u++) {
                __m512 l = acc[0][u];
                UNROLL for (int hh = 1; hh < HB; hh++) l = _mm512_add_ps(l, acc[hh][u]);
                if (add) l = _mm512_add_ps(l, _mm512_maskz_loadu_ps(mk[u], lsum + i + 16 * u));
                _mm512_mask_storeu_ps(lsum + i + 16 * u, mk[u], l);
            }
    }
    UNROLL for (int hh = 0; hh < HB; hh++) {
        const float bm = _mm512_reduce_max_ps(vmax[hh]), mo = mrun[hh];
        const float mn = bm > mo ? bm : mo;
        if (mn > mo) zrun[hh] *= exp((double)mo - (double)mn); /* mo = -inf: 0 * 0 */
        mrun[hh] = mn;
        __m512 mhi, mlo, zv = _mm512_setzero_ps();
        exp_shift(mn, &mhi, &mlo);
        float *x = e + (size_t)(h0 + hh) * n;
        int64_t i = i0;
        for (; i + 16 <= i0 + len; i += 16) {
            const __m512 w = exp_sub(_mm512_loadu_ps(x + i), mhi, mlo);
            _mm512_storeu_ps(x + i, score_flush(w));
            zv = _mm512_add_ps(zv, w);
        }
        if (i < i0 + len) {
            const __mmask16 m = tail_mask(i0 + len - i);
            const __m512 w = _mm512_maskz_mov_ps(m, exp_sub(_mm512_maskz_loadu_ps(m, x + i), mhi, mlo));
            _mm512_mask_storeu_ps(x + i, m, score_flush(w));
            zv = _mm512_add_ps(zv, w);
        }
        zrun[hh] += _mm512_reduce_add_ps(zv);
    }
    return read;
}

/* Heads whose running max and sum live on the stack; more take more passes. */
enum { KT_EXP_HEADS = 64 };

static ALWAYS_INLINE void kt_exp_avx512(const attn_kv_view *kv, const float *qs,
                                        const int32_t *comp, int r, int g, int64_t n, float *e,
                                        float *scale, float *lsum, const int f16)
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
            for (; h + 4 <= hn; h += 4) {
                const int64_t x = kt_exp_block(kv, qs, comp, r, hc + h, 4, n, i0, len, e, lsum,
                                               hc + h > 0, mrun + h, zrun + h, f16);
                if (hc + h == 0) read += x;
            }
            int64_t x = 0;
            switch (hn - h) {
            case 3: x = kt_exp_block(kv, qs, comp, r, hc + h, 3, n, i0, len, e, lsum, hc + h > 0,
                                     mrun + h, zrun + h, f16); break;
            case 2: x = kt_exp_block(kv, qs, comp, r, hc + h, 2, n, i0, len, e, lsum, hc + h > 0,
                                     mrun + h, zrun + h, f16); break;
            case 1: x = kt_exp_block(kv, qs, comp, r, hc + h, 1, n, i0, len, e, lsum, hc + h > 0,
                                     mrun + h, zrun + h, f16); break;
            default: break;
            }
            if (hc + h == 0) read += x;
            for (int hh = 0; hh < hn; hh++) scale[(size_t)(hc + hh) * nb + b] = mrun[hh];
        }
        /* the block maxima become exp(m_b - M) / Z, 16 blocks at a time */
        for (int hh = 0; hh < hn; hh++) {
            float *sc = scale + (size_t)(hc + hh) * nb;
            __m512 mhi, mlo;
            exp_shift(mrun[hh], &mhi, &mlo);
            const __m512 inv = _mm512_set1_ps((float)(1.0 / zrun[hh]));
            for (int64_t b = 0; b < nb; b += 16) {
                const __mmask16 m = tail_mask(nb - b);
                const __m512 x = exp_sub(_mm512_maskz_loadu_ps(m, sc + b), mhi, mlo);
                _mm512_mask_storeu_ps(sc + b, m, score_flush(_mm512_mul_ps(x, inv)));
            }
        }
    }
    if (kv->meter) kv->meter->kt += read;
}

void attn_kt_exp_avx512(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                        int g, int64_t n, float *e, float *scale, float *lsum)
{
    if (kv->elem == KV_Q8_0) kt_exp_avx512(kv, qs, comp, r, g, n, e, scale, lsum, KQ8);
    else if (kv->elem == KV_F16) kt_exp_avx512(kv, qs, comp, r, g, n, e, scale, lsum, 1);
    else kt_exp_avx512(kv, qs, comp, r, g, n, e, scale, lsum, 0);
}

/* ---- group sum, top-k ----------------------------------------------------------------- */

/* Group sums of 64 positions from i (lanes at or past m - i zero): four
 * independent FMA chains over the heads, so the g-long chains overlap
 * (one at a time waits on FMA latency: 2x slower). ATTN_EXP_BLOCK % 64 ==
 * 0, so the 64 share one block scale. */
static ALWAYS_INLINE void head_sum64(const float *e, const float *scale, int g, int64_t n,
                                     int64_t nb, int64_t i, int64_t left, __m512 a[4],
                                     __mmask16 mk[4])
{
    const float *sc = scale + i / ATTN_EXP_BLOCK;
    UNROLL for (int u = 0; u < 4; u++) {
        mk[u] = tail_mask(left - 16 * u);
        a[u] = _mm512_setzero_ps();
    }
    for (int h = 0; h < g; h++) {
        const __m512 w = _mm512_set1_ps(sc[h * nb]);
        const float *eh = e + h * n + i;
        UNROLL for (int u = 0; u < 4; u++)
            a[u] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mk[u], eh + 16 * u), a[u]);
    }
}

void attn_scaled_head_sum_avx512(const float *e, const float *scale, int g, int64_t n,
                                 int64_t m, float *out)
{
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    for (int64_t i = 0; i < m; i += 64) {
        __m512 a[4];
        __mmask16 mk[4];
        head_sum64(e, scale, g, n, nb, i, m - i, a, mk);
        UNROLL for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(out + i + 16 * u, mk[u], a[u]);
    }
}

/* attn_topk_key of 16 floats (no NaN among them: the filter keeps none) */
static ALWAYS_INLINE __m512i topk_key16(__m512 x)
{
    __m512i b = _mm512_castps_si512(x);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    b = _mm512_mask_mov_epi32(b, _mm512_cmpeq_epi32_mask(b, sign), _mm512_setzero_si512()); /* -0 -> +0 */
    return _mm512_xor_si512(b, _mm512_or_si512(_mm512_srai_epi32(b, 31), sign));
}

int64_t attn_topk_filter_avx512(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key)
{
    const __m512 vt = _mm512_set1_ps(t);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i iv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16, iv = _mm512_add_epi32(iv, step)) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 m = _mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ);
        if (!m) continue; /* most blocks hold no candidate */
        /* compress in a register, then a masked store: Zen 4 microcodes
         * the compress-to-memory form */
        const int k = __builtin_popcount(m);
        const __mmask16 out = (__mmask16)((1u << k) - 1);
        _mm512_mask_storeu_epi32(idx + c, out, _mm512_maskz_compress_epi32(m, iv));
        _mm512_mask_storeu_epi32(key + c, out, _mm512_maskz_compress_epi32(m, topk_key16(v)));
        c += k;
    }
    for (; i < n; i++)
        if (x[i] >= t) {
            key[c] = attn_topk_key(x[i]);
            idx[c++] = (int32_t)i;
        }
    return c;
}

int64_t attn_topk_partition_avx512(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out,
                                   int64_t *n_lo)
{
    const __m512i vp = _mm512_set1_epi32((int)p);
    int64_t hi = 0, lo = m;
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 mk = tail_mask(m - i);
        const __m512i v = _mm512_maskz_loadu_epi32(mk, key + i);
        const __mmask16 gt = _mm512_mask_cmpgt_epu32_mask(mk, v, vp);
        const __mmask16 lt = _mm512_mask_cmplt_epu32_mask(mk, v, vp);
        const int ng = __builtin_popcount(gt), nl = __builtin_popcount(lt);
        _mm512_mask_storeu_epi32(out + hi, (__mmask16)((1u << ng) - 1), _mm512_maskz_compress_epi32(gt, v));
        lo -= nl; /* the smaller keys fill the buffer from its end */
        _mm512_mask_storeu_epi32(out + lo, (__mmask16)((1u << nl) - 1), _mm512_maskz_compress_epi32(lt, v));
        hi += ng;
    }
    *n_lo = m - lo;
    return hi;
}

int64_t attn_topk_above_avx512(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t,
                               int32_t *idx)
{
    const __m512i vt = _mm512_set1_epi32((int)t), step = _mm512_set1_epi32(16);
    __m512i iv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t c = 0;
    for (int64_t i = 0; i < m; i += 16, iv = _mm512_add_epi32(iv, step)) {
        const __mmask16 mk = tail_mask(m - i);
        const __mmask16 gt = _mm512_mask_cmpgt_epu32_mask(mk, _mm512_maskz_loadu_epi32(mk, key + i), vt);
        if (!gt) continue;
        const __m512i v = pos ? _mm512_maskz_loadu_epi32(mk, pos + i) : iv;
        const int n = __builtin_popcount(gt); /* register compress + masked store, as the filter */
        _mm512_mask_storeu_epi32(idx + c, (__mmask16)((1u << n) - 1), _mm512_maskz_compress_epi32(gt, v));
        c += n;
    }
    return c;
}

static int64_t count_ge(const uint32_t *key, int64_t m, uint32_t t)
{
    const __m512i vt = _mm512_set1_epi32((int)t), one = _mm512_set1_epi32(1);
    __m512i c = _mm512_setzero_si512();
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 mk = tail_mask(m - i);
        const __mmask16 ge = _mm512_mask_cmpge_epu32_mask(mk, _mm512_maskz_loadu_epi32(mk, key + i), vt);
        c = _mm512_mask_add_epi32(c, ge, c, one);
    }
    return _mm512_reduce_add_epi32(c);
}

uint32_t attn_topk_kth_key_avx512(const uint32_t *key, int64_t m, int64_t k)
{
    /* the answer lies between the smallest and the largest key */
    __m512i vlo = _mm512_set1_epi32(-1), vhi = _mm512_setzero_si512();
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 mk = tail_mask(m - i);
        const __m512i v = _mm512_maskz_loadu_epi32(mk, key + i);
        vlo = _mm512_mask_min_epu32(vlo, mk, vlo, v);
        vhi = _mm512_mask_max_epu32(vhi, mk, vhi, v);
    }
    uint32_t lo = (uint32_t)_mm512_reduce_min_epu32(vlo), hi = (uint32_t)_mm512_reduce_max_epu32(vhi);
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2 + 1;
        if (count_ge(key, m, mid) >= k) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* ---- gather ------------------------------------------------------------------------ */

/* Two passes (all scores, then the softmax-weighted values) rather than one
 * with an online softmax: a fused version measured 2x slower once K and V
 * came from memory rather than L2, while each pass alone streams at
 * bandwidth. Gathered rows: the V rows are requested into L2 while the
 * scores pass waits on K, so the second pass finds them there. */
void attn_gather_group_avx512(const attn_kv_view *kv, const float *q, int g,
                              const int32_t *sel, int64_t n_sel, float *out, float *scratch, float *lse)
{
    if (n_sel <= 0) {
        attn_gather_none(g, kv->d, out, lse);
        return;
    }
    /* V rows requested during the scores pass: up to 512 KiB, which stays in L2 */
    const size_t row_bytes = attn_kv_row_bytes(kv->elem, kv->d);
    const int64_t v_rows = sel ? (int64_t)(((size_t)512 << 10) / row_bytes) : 0;
    if (attn_q8i_applies(kv)) attn_scores_q8i_avx512(kv, q, g, sel, n_sel, scratch);
    else if (kv->elem == KV_Q8_0) scores_avx512(kv, q, g, sel, n_sel, scratch, v_rows, KQ8);
    else if (kv->elem == KV_F16) scores_avx512(kv, q, g, sel, n_sel, scratch, v_rows, 1);
    else scores_avx512(kv, q, g, sel, n_sel, scratch, v_rows, 0);
    attn_softmax_weighted_sum_avx512(kv, scratch, g, sel, n_sel, out, lse);
}

const attn_kernels attn_kernels_avx512 = {
    attn_topk_filter_avx512, attn_scores_avx512, attn_softmax_avx512, attn_weighted_sum_avx512,
    attn_kt_logits_avx512, attn_softmax_weighted_sum_avx512, attn_kt_exp_avx512,
    attn_scaled_head_sum_avx512, attn_topk_kth_key_avx512, attn_topk_above_avx512, attn_topk_partition_avx512,
    attn_gather_group_avx512,
};

#else
typedef int attn_kernels_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
