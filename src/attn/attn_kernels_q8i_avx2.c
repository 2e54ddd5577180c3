/* attn_kernels_q8i_avx2.c - the AVX2 twins of the integer kernels for Q8_0
 * caches (attn.h, "integer kernels for Q8_0 caches"; plain-C twins in
 * attn_kernels_q8i_ref.c, AVX-512 VNNI ones in attn_kernels_q8i_avx512.c).
 *
 * AVX2 has no vpdpbusd; its byte product vpmaddubsw multiplies unsigned by
 * signed bytes and adds pairs into int16 with saturation, so each kernel
 * keeps its pairs below 2^15:
 *
 * Scores, 8 rows at a time (one lane per row): per row and 32-code block,
 * |k| times q carrying k's sign (vpsignb) pairs to at most 2 * 128 * 127 =
 * 32512, exact; vpmaddwd by ones widens to 8 int32 partial sums, and a
 * transpose-add tree (vphaddd) turns 8 rows' partials into one vector of
 * their block dots. The float steps are the reference's, in its order
 * (dot * (dk * dq) fused into the running sum, block by block), so the
 * scores are bit-identical to it.
 *
 * Weighted sum, 64 positions at a time: the u8 weights (up to 255) times
 * codes would saturate vpmaddubsw's pairs, so codes are widened to int16
 * and two positions' codes interleaved, and vpmaddwd against the two
 * positions' weights adds their products into each column's int32. The
 * columns come out permuted within 128-bit lanes and are put back per
 * block (one vperm2i128 pair) before the float FMA with sigma.
 */
#include "attn/attn_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "attn/attn_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

enum {
    MAX_NBK = ATTN_Q8I_MAX_D / ATTN_Q8_BLOCK, /* blocks per row              */
    HB_MAX = 4,                               /* query heads per pass        */
    SCORES_AHEAD = 256,                       /* K rows requested this far ahead */
    V_AHEAD = 2 * ATTN_Q8I_CHUNK,             /* V rows requested this far ahead */
};

/* The f16 scales at byte `at` of the 8 rows rp[0..8), as f32. */
static ALWAYS_INLINE __m256 scales8(const uint8_t *const *rp, size_t at)
{
    uint16_t h[8];
    UNROLL for (int u = 0; u < 8; u++) memcpy(&h[u], rp[u] + at, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
}

/* ---- scores ----------------------------------------------------------------- */

/* The int32 dot of one block's 32 codes k with the query's 32 codes q, as
 * 8 partial sums. */
static ALWAYS_INLINE __m256i dot32(__m256i k, __m256i ka, __m256i q)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ka, _mm256_sign_epi8(q, k)), _mm256_set1_epi16(1));
}

/* Scores of HB heads over the 8 rows rp: sc[hh] lane u = row u's score. */
static ALWAYS_INLINE void scores_tile(const uint8_t *const *rp, int nbk, const int8_t *qi, int d, const float *dqs,
                                      const int HB, __m256 sc[HB_MAX])
{
    UNROLL for (int hh = 0; hh < HB; hh++) sc[hh] = _mm256_setzero_ps();
    for (int b = 0; b < nbk; b++) {
        const size_t at = (size_t)b * ATTN_Q8_BLOCK_BYTES;
        __m256i qv[HB_MAX];
        UNROLL for (int hh = 0; hh < HB; hh++)
            qv[hh] = _mm256_loadu_si256((const __m256i *)(const void *)(qi + (size_t)hh * d + 32 * b));
        __m256i half[2][HB_MAX]; /* rows 0-3 and 4-7: [r0 r1 r2 r3 | r0 r1 r2 r3] partials */
        UNROLL for (int qd = 0; qd < 2; qd++) {
            __m256i t[2][HB_MAX];
            UNROLL for (int pr = 0; pr < 2; pr++) {
                const uint8_t *r0 = rp[4 * qd + 2 * pr], *r1 = rp[4 * qd + 2 * pr + 1];
                const __m256i k0 = _mm256_loadu_si256((const __m256i *)(const void *)(r0 + at + 2));
                const __m256i k1 = _mm256_loadu_si256((const __m256i *)(const void *)(r1 + at + 2));
                const __m256i a0 = _mm256_abs_epi8(k0), a1 = _mm256_abs_epi8(k1);
                UNROLL for (int hh = 0; hh < HB; hh++)
                    t[pr][hh] = _mm256_hadd_epi32(dot32(k0, a0, qv[hh]), dot32(k1, a1, qv[hh]));
            }
            UNROLL for (int hh = 0; hh < HB; hh++) half[qd][hh] = _mm256_hadd_epi32(t[0][hh], t[1][hh]);
        }
        const __m256 dk = scales8(rp, at);
        UNROLL for (int hh = 0; hh < HB; hh++) {
            const __m256i dot = _mm256_add_epi32(_mm256_permute2x128_si256(half[0][hh], half[1][hh], 0x20),
                                                 _mm256_permute2x128_si256(half[0][hh], half[1][hh], 0x31));
            sc[hh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dk, _mm256_set1_ps(dqs[hh * nbk + b])),
                                     sc[hh]);
        }
    }
}

static ALWAYS_INLINE void scores_q8i(const attn_kv_view *kv, const float *q, int g, const int32_t *rows, int64_t n,
                                     float *s, const int D)
{
    const int d = D ? D : kv->d, nbk = d / ATTN_Q8_BLOCK;
    const size_t rb = attn_q8_row_bytes(d);
    const float scale = 1.0f / sqrtf((float)d);
    const uint8_t *K = (const uint8_t *)kv->K;
    const int64_t vn = n < V_AHEAD ? n : V_AHEAD; /* V rows the K stream runs on into */
    int8_t qi[HB_MAX * ATTN_Q8I_MAX_D];
    float dqs[HB_MAX * MAX_NBK];
    int32_t corr[HB_MAX * MAX_NBK]; /* attn_q8i_query's offsets: the sign trick needs none */
    for (int h0 = 0; h0 < g; h0 += HB_MAX) {
        const int HB = g - h0 < HB_MAX ? g - h0 : HB_MAX;
        for (int hh = 0; hh < HB; hh++)
            attn_q8i_query(q + (size_t)(h0 + hh) * d, d, scale, qi + hh * d, dqs + hh * nbk, corr + hh * nbk);
        if (h0 == 0) {
            if (rows) prefetch_rows(K, rows, 0, n < SCORES_AHEAD ? n : SCORES_AHEAD, rb);
            else prefetch_kv_stream(K, kv->V, n, vn, 0, SCORES_AHEAD, rb);
        }
        for (int64_t i0 = 0; i0 < n; i0 += 8) {
            const int nb = n - i0 < 8 ? (int)(n - i0) : 8;
            if (h0 == 0) {
                const int64_t a = i0 + SCORES_AHEAD;
                /* past the last K row the stream runs on into the first V
                 * rows, which the weighted sum reads next */
                if (rows) prefetch_rows(K, rows, a, a + 8 < n ? a + 8 : n, rb);
                else prefetch_kv_stream(K, kv->V, n, vn, a, a + 8, rb);
            }
            const uint8_t *rp[8];
            for (int u = 0; u < 8; u++) { /* lanes past nb repeat a valid row, not stored */
                const int64_t rr = u < nb ? i0 + u : i0;
                rp[u] = K + (size_t)(rows ? rows[rr] : rr) * rb;
            }
            __m256 sc[HB_MAX];
            switch (HB) {
            case 4: scores_tile(rp, nbk, qi, d, dqs, 4, sc); break;
            case 3: scores_tile(rp, nbk, qi, d, dqs, 3, sc); break;
            case 2: scores_tile(rp, nbk, qi, d, dqs, 2, sc); break;
            default: scores_tile(rp, nbk, qi, d, dqs, 1, sc); break;
            }
            for (int hh = 0; hh < HB; hh++) {
                float *o = s + (size_t)(h0 + hh) * n + i0;
                if (nb == 8) _mm256_storeu_ps(o, sc[hh]);
                else _mm256_maskstore_ps(o, simd_lanes8(nb), sc[hh]);
            }
        }
    }
    if (kv->meter) kv->meter->k += n * d;
}

void attn_scores_q8i_avx2(const attn_kv_view *kv, const float *q, int g, const int32_t *rows, int64_t n, float *s)
{
    if (kv->d == 64) scores_q8i(kv, q, g, rows, n, s, 64);
    else if (kv->d == 128) scores_q8i(kv, q, g, rows, n, s, 128);
    else scores_q8i(kv, q, g, rows, n, s, 0);
}

/* ---- softmax-weighted sum ------------------------------------------------------- */

/* One chunk's weights for HB heads and every V block: u8 codes (as int16,
 * two positions per dword) and their step sigma. */
typedef struct wchunk {
    uint16_t ub[HB_MAX][MAX_NBK][ATTN_Q8I_CHUNK] __attribute__((aligned(32)));
    float sig[HB_MAX][MAX_NBK];
} wchunk;

/* p = exp(s - max) of the chunk's nc positions (zero past them) for HB
 * heads, their sum added to z; then per V block b, c = p * dv quantized to
 * codes against max c (attn.h): u = round(c * 255 / max c), NaN -> 255 as
 * in the reference. */
static ALWAYS_INLINE void prepare_chunk(const uint8_t *const *rp, int nc, const float *s, int64_t n, int64_t i0,
                                        int64_t h0, int nbk, const int HB, const __m256 *mhi, const __m256 *mlo,
                                        double *z, wchunk *w)
{
    __m256 p[HB_MAX][ATTN_Q8I_CHUNK / 8];
    UNROLL for (int hh = 0; hh < HB; hh++) {
        const float *x = s + (size_t)(h0 + hh) * n + i0;
        __m256 sum = _mm256_setzero_ps();
        UNROLL for (int v = 0; v < ATTN_Q8I_CHUNK / 8; v++) {
            const int k = nc - 8 * v;
            __m256 e = _mm256_setzero_ps();
            if (k >= 8) e = exp_sub8(_mm256_loadu_ps(x + 8 * v), mhi[hh], mlo[hh]);
            else if (k > 0)
                e = _mm256_and_ps(exp_sub8(_mm256_maskload_ps(x + 8 * v, simd_lanes8(k)), mhi[hh], mlo[hh]),
                                  _mm256_castsi256_ps(simd_lanes8(k)));
            p[hh][v] = e;
            sum = _mm256_add_ps(sum, e);
        }
        z[hh] += hsum8(sum);
    }
    for (int b = 0; b < nbk; b++) {
        const size_t at = (size_t)b * ATTN_Q8_BLOCK_BYTES;
        __m256 dv[ATTN_Q8I_CHUNK / 8];
        UNROLL for (int v = 0; v < ATTN_Q8I_CHUNK / 8; v++) dv[v] = scales8(rp + 8 * v, at);
        UNROLL for (int hh = 0; hh < HB; hh++) {
            __m256 c[ATTN_Q8I_CHUNK / 8], cm = _mm256_setzero_ps();
            UNROLL for (int v = 0; v < ATTN_Q8I_CHUNK / 8; v++) {
                c[v] = _mm256_mul_ps(p[hh][v], dv[v]);
                cm = _mm256_max_ps(c[v], cm); /* a NaN c loses, as in the reference's max */
            }
            const float cmax = hmax8(cm);
            w->sig[hh][b] = cmax / 255.0f;
            const __m256 inv = _mm256_set1_ps(cmax > 0 ? 255.0f / cmax : 0.0f);
            UNROLL for (int v = 0; v < ATTN_Q8I_CHUNK / 8; v += 2) {
                /* c * inv is in [0, 255] (+0.5 ulp) or NaN, which converts
                 * to 0x80000000: the unsigned min makes it 255 */
                const __m256i u0 = _mm256_min_epu32(_mm256_cvtps_epi32(_mm256_mul_ps(c[v], inv)), _mm256_set1_epi32(255));
                const __m256i u1 = _mm256_min_epu32(_mm256_cvtps_epi32(_mm256_mul_ps(c[v + 1], inv)), _mm256_set1_epi32(255));
                /* packus interleaves 128-bit lanes: put them back in order */
                const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(u0, u1), 0xd8);
                _mm256_store_si256((__m256i *)(void *)&w->ub[hh][b][8 * v], pk);
            }
        }
    }
}

/* out columns [32b, 32b + 32) of HB heads += the chunk's rows rp[0..64)
 * block b weighted by ub, times sig: 16 columns at a time, two positions
 * per vpmaddwd, 2 x HB accumulators. */
static ALWAYS_INLINE void wsum_block(const uint8_t *const *rp, int b, const int HB, const wchunk *w,
                                     float (*o)[ATTN_Q8I_MAX_D])
{
    const size_t at = (size_t)b * ATTN_Q8_BLOCK_BYTES + 2;
    UNROLL for (int half = 0; half < 2; half++) {
        __m256i acc[HB_MAX][2];
        UNROLL for (int hh = 0; hh < HB; hh++) acc[hh][0] = acc[hh][1] = _mm256_setzero_si256();
        for (int pi = 0; pi < ATTN_Q8I_CHUNK / 2; pi++) {
            const __m256i r0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(rp[2 * pi] + at + 16 * half)));
            const __m256i r1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(rp[2 * pi + 1] + at + 16 * half)));
            const __m256i lo = _mm256_unpacklo_epi16(r0, r1), hi = _mm256_unpackhi_epi16(r0, r1);
            UNROLL for (int hh = 0; hh < HB; hh++) {
                int32_t w2;
                memcpy(&w2, &w->ub[hh][b][2 * pi], 4);
                const __m256i wv = _mm256_set1_epi32(w2);
                acc[hh][0] = _mm256_add_epi32(acc[hh][0], _mm256_madd_epi16(lo, wv));
                acc[hh][1] = _mm256_add_epi32(acc[hh][1], _mm256_madd_epi16(hi, wv));
            }
        }
        /* acc 0: columns 0-3 | 8-11, acc 1: 4-7 | 12-15 */
        UNROLL for (int hh = 0; hh < HB; hh++) {
            const __m256 sv = _mm256_set1_ps(w->sig[hh][b]);
            float *op = o[hh] + 32 * b + 16 * half;
            const __m256i c0 = _mm256_permute2x128_si256(acc[hh][0], acc[hh][1], 0x20);
            const __m256i c1 = _mm256_permute2x128_si256(acc[hh][0], acc[hh][1], 0x31);
            _mm256_store_ps(op, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0), sv, _mm256_load_ps(op)));
            _mm256_store_ps(op + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1), sv, _mm256_load_ps(op + 8)));
        }
    }
}

static ALWAYS_INLINE void wsum_heads(const uint8_t *V, size_t rb, const int32_t *rows, int64_t n, const float *s,
                                     int64_t h0, int nbk, const int HB, const __m256 *mhi, const __m256 *mlo,
                                     double *z, wchunk *w, float (*o)[ATTN_Q8I_MAX_D])
{
    if (h0 == 0) {
        if (rows) prefetch_rows(V, rows, 0, n < V_AHEAD ? n : V_AHEAD, rb);
        else prefetch_span(V, 0, n < V_AHEAD ? n : V_AHEAD, rb);
    }
    for (int64_t i0 = 0; i0 < n; i0 += ATTN_Q8I_CHUNK) {
        const int nc = n - i0 < ATTN_Q8I_CHUNK ? (int)(n - i0) : ATTN_Q8I_CHUNK;
        if (h0 == 0) {
            const int64_t a = i0 + V_AHEAD, b = a + ATTN_Q8I_CHUNK < n ? a + ATTN_Q8I_CHUNK : n;
            if (rows) prefetch_rows(V, rows, a, b, rb);
            else if (a < b) prefetch_span(V, a, b, rb);
        }
        const uint8_t *rp[ATTN_Q8I_CHUNK];
        for (int i = 0; i < ATTN_Q8I_CHUNK; i++) { /* past nc: a valid row, weight 0 */
            const int64_t rr = i < nc ? i0 + i : i0;
            rp[i] = V + (size_t)(rows ? rows[rr] : rr) * rb;
        }
        prepare_chunk(rp, nc, s, n, i0, h0, nbk, HB, mhi, mlo, z, w);
        for (int b = 0; b < nbk; b++) wsum_block(rp, b, HB, w, o);
    }
}

static ALWAYS_INLINE void wsum_q8i(const attn_kv_view *kv, const float *s, int g, const int32_t *rows, int64_t n,
                                   float *out, float *lse, const int D)
{
    const int d = D ? D : kv->d, nbk = d / ATTN_Q8_BLOCK;
    const size_t rb = attn_q8_row_bytes(d);
    const uint8_t *V = (const uint8_t *)kv->V;
    memset(out, 0, (size_t)g * d * sizeof *out);
    if (n <= 0) {
        for (int h = 0; lse && h < g; h++) lse[h] = -INFINITY;
        return;
    }
    float o[HB_MAX][ATTN_Q8I_MAX_D] __attribute__((aligned(32)));
    wchunk w;
    for (int h0 = 0; h0 < g; h0 += HB_MAX) {
        const int HB = g - h0 < HB_MAX ? g - h0 : HB_MAX;
        __m256 mhi[HB_MAX], mlo[HB_MAX];
        double z[HB_MAX];
        float mx[HB_MAX];
        for (int hh = 0; hh < HB; hh++) {
            mx[hh] = max_of8(s + (size_t)(h0 + hh) * n, n);
            exp_shift8(mx[hh], &mhi[hh], &mlo[hh]);
            z[hh] = 0;
            memset(o[hh], 0, (size_t)d * sizeof(float));
        }
        switch (HB) {
        case 4: wsum_heads(V, rb, rows, n, s, h0, nbk, 4, mhi, mlo, z, &w, o); break;
        case 3: wsum_heads(V, rb, rows, n, s, h0, nbk, 3, mhi, mlo, z, &w, o); break;
        case 2: wsum_heads(V, rb, rows, n, s, h0, nbk, 2, mhi, mlo, z, &w, o); break;
        default: wsum_heads(V, rb, rows, n, s, h0, nbk, 1, mhi, mlo, z, &w, o); break;
        }
        for (int hh = 0; hh < HB; hh++) {
            const float invz = (float)(1.0 / z[hh]);
            if (lse) lse[h0 + hh] = mx[hh] + (float)log(z[hh]);
            float *oh = out + (size_t)(h0 + hh) * d;
            for (int j = 0; j < d; j++) oh[j] = o[hh][j] * invz;
        }
    }
    if (kv->meter) kv->meter->v += n * d;
}

void attn_softmax_weighted_sum_q8i_avx2(const attn_kv_view *kv, const float *s, int g, const int32_t *rows,
                                        int64_t n, float *out, float *lse)
{
    if (kv->d == 64) wsum_q8i(kv, s, g, rows, n, out, lse, 64);
    else if (kv->d == 128) wsum_q8i(kv, s, g, rows, n, out, lse, 128);
    else wsum_q8i(kv, s, g, rows, n, out, lse, 0);
}

#else
typedef int attn_kernels_q8i_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
