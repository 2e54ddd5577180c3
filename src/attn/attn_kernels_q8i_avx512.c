/* attn_kernels_q8i_avx512.c - the AVX-512 VNNI twins of the integer kernels
 * for Q8_0 caches (attn.h, "integer kernels for Q8_0 caches"; plain-C twins
 * in attn_kernels_q8i_ref.c).
 *
 * Why integers: widening each int8 code to f32 costs a load-convert, a
 * convert and a scale per 16 codes before the group's FMAs, so a Q8_0 cache
 * read that way ran slower than f16 although it is half the bytes. Here one
 * vpdpbusd multiplies 64 codes by 64 others and adds them in fours:
 *
 * Scores, 16 rows at a time: four rows' 64 codes (two blocks) are
 * interleaved by dword (two unpack levels), so vector k holds, in 128-bit
 * lane L, dword 4L + k of each of the four rows; vpdpbusd against the query
 * dword 4L + k broadcast in lane L leaves per lane the partial sum of dwords
 * 4L..4L+3, i.e. lanes 0-1 block 0 and lanes 2-3 block 1. Two shuffle
 * levels then give per block one vector of 16 row sums, which the block
 * scales turn into floats. K codes are made unsigned by flipping their top
 * bit (k + 128, vpdpbusd's unsigned operand); 128 * sum(q) per block is
 * subtracted back exactly.
 *
 * Weighted sum, 64 positions at a time: the softmax weights times each V
 * block's scale are quantized to u8 (attn.h); four positions' V codes are
 * interleaved by byte, so a dword of a vector holds one column's four
 * codes and vpdpbusd against the four positions' weights adds them into
 * that column. The columns come out permuted (lane L, vector m, dword e is
 * column 16L + 4m + e of the 64) and are put back once at the end. A
 * chunk's weights (exp, scales, quantization: a long dependency chain) are
 * prepared while the chunk before it is summed.
 *
 * Memory: the hardware prefetcher alone leaves these kernels waiting
 * (68-byte rows; 15 GB/s without software prefetch against 26-33 with it,
 * 2 threads over 256k rows, bench-results/q8i-kernel-steps-20261126.txt),
 * so every line is requested ahead,
 * and the K stream runs on into the first V rows.
 */
#include "attn/attn_kernels.h"

#ifdef ATTN_HAVE_Q8I_AVX512
#include "attn/attn_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

enum {
    PAIR_BYTES = 2 * ATTN_Q8_BLOCK_BYTES,       /* two blocks: 64 codes      */
    MAX_CH = ATTN_Q8I_MAX_D / 64,               /* 64-code chunks per row    */
    MAX_NBK = ATTN_Q8I_MAX_D / ATTN_Q8_BLOCK,   /* blocks per row            */
    HB_MAX = 4,                                 /* query heads per pass      */
};

/* The 64 codes of the two blocks starting at `pair` (scale, 32 codes,
 * scale, 32 codes). */
static ALWAYS_INLINE __m512i ld_codes64(const uint8_t *pair)
{
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(pair + 2));
    const __m256i hi = _mm256_loadu_si256((const __m256i *)(const void *)(pair + 2 + ATTN_Q8_BLOCK_BYTES));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* The rows a tile reads: consecutive from `base` (rb bytes apart) when
 * `contig` (a compile-time constant at every call), else the pointers rp[]
 * (gathered rows, and the last partial tile, whose missing rows repeat a
 * valid one). Consecutive rows need no pointer table, which showed in
 * profiles of the weighted sum. */
typedef struct rowset {
    const uint8_t *base;
    size_t rb;
    const uint8_t *const *rp;
} rowset;

static ALWAYS_INLINE const uint8_t *row_at(const rowset *rs, int i, const int contig)
{
    return contig ? rs->base + (size_t)i * rs->rb : rs->rp[i];
}

/* The f16 scales at byte `at` of rows i0..i0+15, as f32. Scalar loads: on
 * Zen 4 the gather instructions measured slower. */
static ALWAYS_INLINE __m512 scales16(const rowset *rs, int i0, size_t at, const int contig)
{
    uint16_t h[16] __attribute__((aligned(32)));
    UNROLL for (int u = 0; u < 16; u++) memcpy(&h[u], row_at(rs, i0 + u, contig) + at, 2);
    return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)h));
}

/* scales16 packed in integer registers first (four scales per 64-bit word
 * by shifts, then two inserts), which keeps the shuffle pipes for the
 * score tile's unpacks: 8% faster scores (bench-results/
 * q8i-kernel-steps-20261126.txt). In the weighted sum, where the scales are
 * read a chunk ahead, it measured slower than scales16. */
static ALWAYS_INLINE __m512 scales16_gpr(const rowset *rs, int i0, size_t at, const int contig)
{
    uint64_t w[4];
    UNROLL for (int j = 0; j < 4; j++) {
        uint64_t x = 0;
        UNROLL for (int u = 0; u < 4; u++) {
            uint16_t h;
            memcpy(&h, row_at(rs, i0 + 4 * j + u, contig) + at, 2);
            x |= (uint64_t)h << (16 * u);
        }
        w[j] = x;
    }
    __m128i lo = _mm_cvtsi64_si128((long long)w[0]), hi = _mm_cvtsi64_si128((long long)w[2]);
    lo = _mm_insert_epi64(lo, (long long)w[1], 1);
    hi = _mm_insert_epi64(hi, (long long)w[3], 1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* ---- scores ----------------------------------------------------------------- */

/* qv[4c + k], lane L: dword 4L + k of the query's chunk c, four times. */
static void query_vectors(const int8_t *qi, int nch, __m512i *qv)
{
    for (int c = 0; c < nch; c++) {
        const __m512i x = _mm512_loadu_si512((const void *)(qi + 64 * c));
        for (int k = 0; k < 4; k++) {
            const __m512i idx = _mm512_setr_epi32(k, k, k, k, 4 + k, 4 + k, 4 + k, 4 + k, 8 + k, 8 + k,
                                                  8 + k, 8 + k, 12 + k, 12 + k, 12 + k, 12 + k);
            qv[4 * c + k] = _mm512_permutexvar_epi32(idx, x);
        }
    }
}

/* Scores of HB heads over the 16 rows of rs: sc[hh] lane u = row u's score. */
static ALWAYS_INLINE void scores_tile(const rowset *rs, const int contig, int nch, const __m512i *qv, const float *dqs,
                                      const int32_t *corr, const int HB, __m512 sc[HB_MAX])
{
    const int nbk = 2 * nch;
    const __m512i top = _mm512_set1_epi8((char)0x80);
    UNROLL for (int hh = 0; hh < HB; hh++) sc[hh] = _mm512_setzero_ps();
    for (int c = 0; c < nch; c++) {
        __m512i A[HB_MAX][4];
        UNROLL for (int qd = 0; qd < 4; qd++) {
            __m512i R[4];
            UNROLL for (int a = 0; a < 4; a++)
                R[a] = _mm512_xor_si512(ld_codes64(row_at(rs, 4 * qd + a, contig) + (size_t)c * PAIR_BYTES), top);
            const __m512i t0 = _mm512_unpacklo_epi32(R[0], R[1]), t1 = _mm512_unpackhi_epi32(R[0], R[1]);
            const __m512i t2 = _mm512_unpacklo_epi32(R[2], R[3]), t3 = _mm512_unpackhi_epi32(R[2], R[3]);
            const __m512i u[4] = { _mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                                   _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3) };
            UNROLL for (int hh = 0; hh < HB; hh++) {
                const __m512i *qh = qv + ((size_t)hh * nch + c) * 4;
                __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], qh[0]);
                acc = _mm512_dpbusd_epi32(acc, u[1], qh[1]);
                acc = _mm512_dpbusd_epi32(acc, u[2], qh[2]);
                A[hh][qd] = _mm512_dpbusd_epi32(acc, u[3], qh[3]);
            }
        }
        const __m512 dk0 = scales16_gpr(rs, 0, (size_t)c * PAIR_BYTES, contig);
        const __m512 dk1 = scales16_gpr(rs, 0, (size_t)c * PAIR_BYTES + ATTN_Q8_BLOCK_BYTES, contig);
        UNROLL for (int hh = 0; hh < HB; hh++) {
            /* lanes: [blk0 rows 0-3, blk1 rows 0-3, blk0 rows 4-7, blk1 rows 4-7], then rows 8-15 */
            const __m512i x = _mm512_add_epi32(_mm512_shuffle_i32x4(A[hh][0], A[hh][1], 0x88),
                                               _mm512_shuffle_i32x4(A[hh][0], A[hh][1], 0xdd));
            const __m512i y = _mm512_add_epi32(_mm512_shuffle_i32x4(A[hh][2], A[hh][3], 0x88),
                                               _mm512_shuffle_i32x4(A[hh][2], A[hh][3], 0xdd));
            const int b = hh * nbk + 2 * c;
            const __m512i s0 = _mm512_sub_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_set1_epi32(corr[b]));
            const __m512i s1 = _mm512_sub_epi32(_mm512_shuffle_i32x4(x, y, 0xdd), _mm512_set1_epi32(corr[b + 1]));
            sc[hh] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dk0, _mm512_set1_ps(dqs[b])), sc[hh]);
            sc[hh] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dk1, _mm512_set1_ps(dqs[b + 1])), sc[hh]);
        }
    }
}

enum { SCORES_AHEAD = 256 }; /* rows requested this far ahead */

/* V rows requested this far ahead: two chunks, because prepare_chunk reads
 * the next chunk's scales a chunk early (one chunk left it waiting on
 * memory; four measured slower again). */
enum { V_AHEAD = 2 * ATTN_Q8I_CHUNK };

/* D: the head size when a compile-time constant (0: kv->d), so that the
 * row stride is an immediate and the 16 row addresses need no registers. */
static ALWAYS_INLINE void scores_q8i(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                                     int64_t n, float *s, const int D)
{
    const int d = D ? D : kv->d, nch = d / 64, nbk = d / ATTN_Q8_BLOCK;
    const size_t rb = attn_q8_row_bytes(d);
    const float scale = 1.0f / sqrtf((float)d);
    const uint8_t *K = (const uint8_t *)kv->K;
    const int64_t vn = n < V_AHEAD ? n : V_AHEAD; /* V rows the K stream runs on into */
    int8_t qi[HB_MAX * ATTN_Q8I_MAX_D] __attribute__((aligned(64)));
    float dqs[HB_MAX * MAX_NBK];
    int32_t corr[HB_MAX * MAX_NBK];
    __m512i qv[HB_MAX * MAX_CH * 4];
    for (int h0 = 0; h0 < g; h0 += HB_MAX) {
        const int HB = g - h0 < HB_MAX ? g - h0 : HB_MAX;
        for (int hh = 0; hh < HB; hh++) {
            attn_q8i_query(q + (size_t)(h0 + hh) * d, d, scale, qi + hh * d, dqs + hh * nbk, corr + hh * nbk);
            query_vectors(qi + hh * d, nch, qv + (size_t)hh * nch * 4);
        }
        if (h0 == 0) {
            if (rows) prefetch_rows(K, rows, 0, n < SCORES_AHEAD ? n : SCORES_AHEAD, rb);
            else prefetch_kv_stream(K, kv->V, n, vn, 0, SCORES_AHEAD, rb);
        }
        for (int64_t i0 = 0; i0 < n; i0 += 16) {
            const int nb = n - i0 < 16 ? (int)(n - i0) : 16;
            if (h0 == 0) {
                const int64_t a = i0 + SCORES_AHEAD;
                /* past the last K row, the stream goes on into the first V
                 * rows: the weighted sum reads them next (attn_dense_part) */
                if (rows) prefetch_rows(K, rows, a, a + 16 < n ? a + 16 : n, rb);
                else prefetch_kv_stream(K, kv->V, n, vn, a, a + 16, rb);
            }
            const uint8_t *rp[16];
            rowset rs = { K + (size_t)i0 * rb, rb, rp };
            const int contig = !rows && nb == 16;
            if (!contig)
                for (int u = 0; u < 16; u++) { /* lanes past nb repeat a valid row, masked at the store */
                    const int64_t rr = u < nb ? i0 + u : i0;
                    rp[u] = K + (size_t)(rows ? rows[rr] : rr) * rb;
                }
            __m512 sc[HB_MAX];
#define SCORES_TILE(hb)                                                           \
    do {                                                                          \
        if (contig) scores_tile(&rs, 1, nch, qv, dqs, corr, hb, sc);              \
        else scores_tile(&rs, 0, nch, qv, dqs, corr, hb, sc);                     \
    } while (0)
            switch (HB) {
            case 4: SCORES_TILE(4); break;
            case 3: SCORES_TILE(3); break;
            case 2: SCORES_TILE(2); break;
            default: SCORES_TILE(1); break;
            }
#undef SCORES_TILE
            const __mmask16 m = tail_mask(nb);
            for (int hh = 0; hh < HB; hh++) _mm512_mask_storeu_ps(s + (size_t)(h0 + hh) * n + i0, m, sc[hh]);
        }
    }
    if (kv->meter) kv->meter->k += n * d;
}

void attn_scores_q8i_avx512(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                            int64_t n, float *s)
{
    if (kv->d == 64) scores_q8i(kv, q, g, rows, n, s, 64);
    else if (kv->d == 128) scores_q8i(kv, q, g, rows, n, s, 128);
    else scores_q8i(kv, q, g, rows, n, s, 0);
}

/* ---- softmax-weighted sum ------------------------------------------------------- */

/* acc + vpdpbusd(a, b) on 256-bit vectors. GCC 12 copied each
 * loop-carried accumulator to a scratch register and back around the
 * intrinsic (two moves per vpdpbusd in wsum_block's loop); in asm the
 * accumulator is updated in place. */
static ALWAYS_INLINE __m256i dpbusd256(__m256i acc, __m256i a, __m256i b)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* The 64 rows of rs, block at byte `at` of each (32 codes), weighted by
 * ub[hh][b][...] and added to o[hh] times sig[hh][b]: per group of four rows
 * the codes are interleaved by byte (a dword = one column's four codes) and
 * vpdpbusd adds them times the four rows' weights, broadcast from one dword.
 * 256-bit vectors, one block each: a block's weights are one broadcast,
 * where 512-bit vectors spanning two blocks needed a permute per group and
 * head. The accumulators go into o here, where HB is a constant, so that
 * they stay in registers. */
static ALWAYS_INLINE void wsum_block(const rowset *rs, const int contig, size_t at,
                                     const uint8_t (*ub)[MAX_NBK][ATTN_Q8I_CHUNK], int b, const int HB,
                                     const float (*sig)[MAX_NBK], float (*o)[ATTN_Q8I_MAX_D])
{
    __m256i acc[HB_MAX][4];
    UNROLL for (int hh = 0; hh < HB; hh++)
        UNROLL for (int m = 0; m < 4; m++) acc[hh][m] = _mm256_setzero_si256();
    for (int grp = 0; grp < ATTN_Q8I_CHUNK / 4; grp++) {
        __m256i R[4];
        UNROLL for (int a = 0; a < 4; a++)
            R[a] = _mm256_loadu_si256((const __m256i *)(const void *)(row_at(rs, 4 * grp + a, contig) + at));
        const __m256i x0 = _mm256_unpacklo_epi8(R[0], R[1]), x1 = _mm256_unpackhi_epi8(R[0], R[1]);
        const __m256i x2 = _mm256_unpacklo_epi8(R[2], R[3]), x3 = _mm256_unpackhi_epi8(R[2], R[3]);
        const __m256i v[4] = { _mm256_unpacklo_epi16(x0, x2), _mm256_unpackhi_epi16(x0, x2),
                               _mm256_unpacklo_epi16(x1, x3), _mm256_unpackhi_epi16(x1, x3) };
        UNROLL for (int hh = 0; hh < HB; hh++) {
            int32_t w4;
            memcpy(&w4, &ub[hh][b][4 * grp], 4);
            const __m256i w = _mm256_set1_epi32(w4);
            UNROLL for (int m = 0; m < 4; m++) acc[hh][m] = dpbusd256(acc[hh][m], w, v[m]);
        }
    }
    UNROLL for (int hh = 0; hh < HB; hh++) {
        const __m256 sv = _mm256_set1_ps(sig[hh][b]);
        UNROLL for (int m = 0; m < 4; m++) {
            float *op = o[hh] + 32 * b + 8 * m;
            _mm256_store_ps(op, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[hh][m]), sv, _mm256_load_ps(op)));
        }
    }
}

/* The maxima of four vectors at once (one shuffle tree instead of four):
 * 128-bit lane L of the result holds max(mL) in each of its four floats.
 * Like the twin's running maximum, a NaN lane loses to a number. */
static ALWAYS_INLINE __m512 hmax4(__m512 m0, __m512 m1, __m512 m2, __m512 m3)
{
    const __m512 x01 = _mm512_max_ps(_mm512_shuffle_f32x4(m0, m1, 0x44), _mm512_shuffle_f32x4(m0, m1, 0xee));
    const __m512 x23 = _mm512_max_ps(_mm512_shuffle_f32x4(m2, m3, 0x44), _mm512_shuffle_f32x4(m2, m3, 0xee));
    __m512 y = _mm512_max_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xdd));
    y = _mm512_max_ps(y, _mm512_permute_ps(y, 0x4e));
    return _mm512_max_ps(y, _mm512_permute_ps(y, 0xb1));
}

/* Weights of one 64-position chunk and V block b for HB heads: c = p * dv
 * quantized to u8 codes ub[hh][b] against max c, sig[hh][b] = max c / 255
 * (attn.h). The HB maxima are reduced together and divided as one vector. */
static ALWAYS_INLINE void quantize_weights(const __m512 (*p)[4], const __m512 dv[4], int b, const int HB,
                                           uint8_t (*ub)[MAX_NBK][ATTN_Q8I_CHUNK], float (*sig)[MAX_NBK])
{
    __m512 c[HB_MAX][4], cm[HB_MAX];
    UNROLL for (int hh = 0; hh < HB; hh++) {
        UNROLL for (int v = 0; v < 4; v++) c[hh][v] = _mm512_mul_ps(p[hh][v], dv[v]);
        cm[hh] = _mm512_max_ps(_mm512_max_ps(c[hh][0], c[hh][1]), _mm512_max_ps(c[hh][2], c[hh][3]));
    }
    UNROLL for (int hh = HB; hh < HB_MAX; hh++) cm[hh] = cm[0];
    const __m512 mx = hmax4(cm[0], cm[1], cm[2], cm[3]);
    float sg[16] __attribute__((aligned(64))), inv[16] __attribute__((aligned(64)));
    _mm512_store_ps(sg, _mm512_div_ps(mx, _mm512_set1_ps(255.0f)));
    _mm512_store_ps(inv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(mx, _mm512_setzero_ps(), _CMP_GT_OQ),
                                             _mm512_set1_ps(255.0f), mx));
    UNROLL for (int hh = 0; hh < HB; hh++) {
        sig[hh][b] = sg[4 * hh];
        const __m512 iv = _mm512_set1_ps(inv[4 * hh]);
        /* c * inv is in [0, 255] (+0.5 ulp) or NaN, which converts to
         * 0x80000000 and saturates to 255, as in the twin */
        UNROLL for (int v = 0; v < 4; v++)
            _mm_store_si128((__m128i *)(void *)&ub[hh][b][16 * v],
                            _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(c[hh][v], iv))));
    }
}


/* One chunk's rows and weights, prepared a chunk ahead of their sum. */
typedef struct wchunk {
    const uint8_t *rp[ATTN_Q8I_CHUNK]; /* the rows when not contiguous      */
    rowset rs;
    int contig;
    uint8_t ub[HB_MAX][MAX_NBK][ATTN_Q8I_CHUNK] __attribute__((aligned(64)));
    float sig[HB_MAX][MAX_NBK];
} wchunk;

/* The rows of the chunk at i0 and its weights for HB heads: p = exp(s - max)
 * (zero past the end), added to the per-lane sums z, then quantize_weights
 * per V block. Its dependency chain (exp, the maxima, a division, the
 * stores wsum_block reloads) is long; the caller runs it one chunk ahead so
 * that it overlaps the previous chunk's sums instead of stalling them
 * (5% faster in cache, bench-results/q8i-kernel-steps-20261126.txt). */
static ALWAYS_INLINE void prepare_chunk(const uint8_t *V, size_t rb, const int32_t *rows, int64_t n,
                                        int64_t i0, const float *s, int64_t h0, int nbk, const int HB,
                                        const __m512 *mhi, const __m512 *mlo, __m512d *zlo, __m512d *zhi,
                                        wchunk *w)
{
    const int nc = n - i0 < ATTN_Q8I_CHUNK ? (int)(n - i0) : ATTN_Q8I_CHUNK;
    w->rs = (rowset){ V + (size_t)i0 * rb, rb, w->rp };
    w->contig = !rows && nc == ATTN_Q8I_CHUNK;
    if (!w->contig)
        for (int i = 0; i < ATTN_Q8I_CHUNK; i++) { /* past nc: a valid row, weight 0 */
            const int64_t rr = i < nc ? i0 + i : i0;
            w->rp[i] = V + (size_t)(rows ? rows[rr] : rr) * rb;
        }
    __m512 p[HB_MAX][4];
    UNROLL for (int hh = 0; hh < HB; hh++) {
        const float *x = s + (size_t)(h0 + hh) * n + i0;
        UNROLL for (int v = 0; v < 4; v++) {
            const __mmask16 m = tail_mask(nc - 16 * v);
            p[hh][v] = _mm512_maskz_mov_ps(m, exp_sub(_mm512_maskz_loadu_ps(m, x + 16 * v), mhi[hh], mlo[hh]));
        }
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(p[hh][0], p[hh][1]), _mm512_add_ps(p[hh][2], p[hh][3]));
        zlo[hh] = _mm512_add_pd(zlo[hh], _mm512_cvtps_pd(_mm512_castps512_ps256(sum)));
        zhi[hh] = _mm512_add_pd(zhi[hh], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1))));
    }
    for (int b = 0; b < nbk; b++) {
        const size_t at = (size_t)b * ATTN_Q8_BLOCK_BYTES;
        __m512 dv[4];
        UNROLL for (int v = 0; v < 4; v++)
            dv[v] = w->contig ? scales16(&w->rs, 16 * v, at, 1) : scales16(&w->rs, 16 * v, at, 0);
        quantize_weights((const __m512(*)[4])p, dv, b, HB, w->ub, w->sig);
    }
}

/* The weighted sums of HB heads (the switch makes HB a constant). */
static ALWAYS_INLINE void wsum_heads(const uint8_t *V, size_t rb, const int32_t *rows, int64_t n,
                                     const float *s, int64_t h0, int nbk, const int HB, const __m512 *mhi,
                                     const __m512 *mlo, __m512d *zlo, __m512d *zhi, wchunk w[2],
                                     float (*o)[ATTN_Q8I_MAX_D])
{
    if (h0 == 0) {
        if (rows) prefetch_rows(V, rows, 0, n < V_AHEAD ? n : V_AHEAD, rb);
        else prefetch_span(V, 0, n < V_AHEAD ? n : V_AHEAD, rb);
    }
    prepare_chunk(V, rb, rows, n, 0, s, h0, nbk, HB, mhi, mlo, zlo, zhi, &w[0]);
    for (int64_t i0 = 0, c = 0; i0 < n; i0 += ATTN_Q8I_CHUNK, c ^= 1) {
        if (h0 == 0) {
            const int64_t a = i0 + V_AHEAD, b = a + ATTN_Q8I_CHUNK < n ? a + ATTN_Q8I_CHUNK : n;
            if (rows) prefetch_rows(V, rows, a, b, rb);
            else if (a < b) prefetch_span(V, a, b, rb);
        }
        if (i0 + ATTN_Q8I_CHUNK < n)
            prepare_chunk(V, rb, rows, n, i0 + ATTN_Q8I_CHUNK, s, h0, nbk, HB, mhi, mlo, zlo, zhi, &w[c ^ 1]);
        const wchunk *cur = &w[c];
        const uint8_t(*ub)[MAX_NBK][ATTN_Q8I_CHUNK] = (const uint8_t(*)[MAX_NBK][ATTN_Q8I_CHUNK])cur->ub;
        const float(*sig)[MAX_NBK] = (const float(*)[MAX_NBK])cur->sig;
        for (int b = 0; b < nbk; b++) {
            const size_t at = (size_t)b * ATTN_Q8_BLOCK_BYTES + 2;
            if (cur->contig) wsum_block(&cur->rs, 1, at, ub, b, HB, sig, o);
            else wsum_block(&cur->rs, 0, at, ub, b, HB, sig, o);
        }
    }
}

static ALWAYS_INLINE void wsum_q8i(const attn_kv_view *kv, const float *s, int g, const int32_t *rows,
                                   int64_t n, float *out, float *lse, const int D)
{
    const int d = D ? D : kv->d, nbk = d / ATTN_Q8_BLOCK;
    const size_t rb = attn_q8_row_bytes(d);
    const uint8_t *V = (const uint8_t *)kv->V;
    memset(out, 0, (size_t)g * d * sizeof *out);
    if (n <= 0) {
        for (int h = 0; lse && h < g; h++) lse[h] = -INFINITY;
        return;
    }
    /* o: per head and block, vector m lane L dword e is column 16L + 4m + e
     * of the block, kept at 8m + 4L + e */
    float o[HB_MAX][ATTN_Q8I_MAX_D] __attribute__((aligned(64)));
    wchunk w[2];
    for (int h0 = 0; h0 < g; h0 += HB_MAX) {
        const int HB = g - h0 < HB_MAX ? g - h0 : HB_MAX;
        __m512 mhi[HB_MAX], mlo[HB_MAX];
        __m512d zlo[HB_MAX], zhi[HB_MAX]; /* sum of p per lane, in double */
        float mx[HB_MAX];
        for (int hh = 0; hh < HB; hh++) {
            mx[hh] = max_of(s + (size_t)(h0 + hh) * n, n);
            exp_shift(mx[hh], &mhi[hh], &mlo[hh]);
            zlo[hh] = zhi[hh] = _mm512_setzero_pd();
            memset(o[hh], 0, (size_t)d * sizeof(float));
        }
        switch (HB) {
        case 4: wsum_heads(V, rb, rows, n, s, h0, nbk, 4, mhi, mlo, zlo, zhi, w, o); break;
        case 3: wsum_heads(V, rb, rows, n, s, h0, nbk, 3, mhi, mlo, zlo, zhi, w, o); break;
        case 2: wsum_heads(V, rb, rows, n, s, h0, nbk, 2, mhi, mlo, zlo, zhi, w, o); break;
        default: wsum_heads(V, rb, rows, n, s, h0, nbk, 1, mhi, mlo, zlo, zhi, w, o); break;
        }
        for (int hh = 0; hh < HB; hh++) { /* o[32b + 8m + 4L + e] is column 32b + 16L + 4m + e */
            const double z = _mm512_reduce_add_pd(_mm512_add_pd(zlo[hh], zhi[hh]));
            const float invz = (float)(1.0 / z);
            if (lse) lse[h0 + hh] = mx[hh] + (float)log(z);
            float *oh = out + (size_t)(h0 + hh) * d;
            for (int b = 0; b < nbk; b++)
                for (int m = 0; m < 4; m++)
                    for (int L = 0; L < 2; L++)
                        for (int e = 0; e < 4; e++)
                            oh[32 * b + 16 * L + 4 * m + e] = o[hh][32 * b + 8 * m + 4 * L + e] * invz;
        }
    }
    if (kv->meter) kv->meter->v += n * d;
}

void attn_softmax_weighted_sum_q8i_avx512(const attn_kv_view *kv, const float *s, int g,
                                          const int32_t *rows, int64_t n, float *out, float *lse)
{
    if (kv->d == 64) wsum_q8i(kv, s, g, rows, n, out, lse, 64);
    else if (kv->d == 128) wsum_q8i(kv, s, g, rows, n, out, lse, 128);
    else wsum_q8i(kv, s, g, rows, n, out, lse, 0);
}

#else
typedef int attn_kernels_q8i_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
