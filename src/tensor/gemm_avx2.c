/* gemm_avx2.c - the AVX2 (+FMA) micro-kernels of gemm.h, for CPUs without
 * AVX-512, bit-identical to gemm_panel_ref: the integer kinds below, the
 * float kinds (F32/F16 rows widened, BF16 through an emulated vdpbf16ps)
 * further down.
 *
 * A 16-row group's vector of 4 codes x 16 rows is two ymm halves (rows
 * 0-7, 8-15). Without VNNI the 4-product sums come from vpmaddubsw (pairs
 * into int16) + vpmaddwd (pairs of those into int32), so the pair sums
 * must stay below 2^15:
 *   small codes (Q4_0, Q4_K, Q5_K, Q6_K: q <= 63): q * x directly, at most
 *     63 * 128 * 2, and the token's start (-zp * sum x) as in the reference;
 *   large codes (Q8_0, IQ4_NL, IQ4_XS: q = v + 128): the signed value
 *     v = q ^ 0x80 times x as |a| * (b with a's sign, vpsignb), where a is
 *     the one that cannot be -128 (whose sign flip would wrap): x for Q8_0
 *     activations (-127..127, so any weight byte of a file is exact), v for
 *     IQ4_XS (grid values -127..113 against Q8_K, which reaches -128); at
 *     most 128 * 127 * 2. sum(v * x) is the reference's start + sum(q * x)
 *     exactly, so the start is not added.
 * The float steps per block are the reference's, in its order.
 */
#include "tensor/gemm_kernels.h"
#include "tensor/quant_impl.h"

#if defined(QUANT_CAN_AVX2)
#include "tensor/bf16_avx2.h"

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* Tiles of NH 8-row halves of a 16-row group x T tokens. Prefill takes
 * one half x up to INT_NT tokens: 8 int32 accumulators, the half's codes
 * (and their absolute values), a broadcast token and a product fit the 16
 * ymm registers (the float accumulators, touched once a block, may live on
 * the stack), and each load of codes serves 8 tokens (the former whole
 * group x 2 tokens spilled its accumulators: prefill took ~1.3x as long).
 * One or two tokens (a decode step) take the whole group: it reads each
 * row's codes in one pass, which is what a memory-bound step needs. */
enum { INT_NT = 8, INT_NT_GROUP = 2 };

INLINE void kern_int(const uint8_t *blk0, const uint8_t *acts, size_t ab, const gemm_int_layout *l,
                     float *out, size_t ldo, int n_rows, int h0, const int T, const int BS, const int MIN,
                     const int SIGNED, const int SF16) /* 0: unsigned codes; 1: |v| * x signed by v; 2: |x| * v signed by x */
{
    const int NH = T <= INT_NT_GROUP ? 2 : 1; /* halves in the tile, from h0 */
    __m256 acc[2][INT_NT];
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 2
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[h][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < l->nb; b++) {
        const uint8_t *blk = blk0 + b * l->block_bytes, *xb = acts + b * BS;
        __m256i ai[2][INT_NT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m256i st = SIGNED ? _mm256_setzero_si256()
                                      : _mm256_set1_epi32(((const int32_t *)(acts + t * ab + l->act_start))[b]);
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++) ai[h][t] = st;
        }
#pragma GCC unroll 8
        for (int k = 0; k < BS / 4; k++) {
            __m256i w[2], wa[2];
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++) {
                w[h] = wa[h] = _mm256_loadu_si256((const __m256i *)(blk + 64 * k + 32 * (h0 + h)));
                if (SIGNED) w[h] = _mm256_xor_si256(w[h], flip);
                if (SIGNED == 1) wa[h] = _mm256_abs_epi8(w[h]);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                int32_t x4;
                memcpy(&x4, xb + t * ab + 4 * k, 4);
                const __m256i x = _mm256_set1_epi32(x4);
#pragma GCC unroll 2
                for (int h = 0; h < NH; h++) {
                    const __m256i p = SIGNED == 1   ? _mm256_maddubs_epi16(wa[h], _mm256_sign_epi8(x, w[h]))
                                      : SIGNED == 2 ? _mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(w[h], x))
                                                    : _mm256_maddubs_epi16(w[h], x);
                    ai[h][t] = _mm256_add_epi32(ai[h][t], _mm256_madd_epi16(p, ones));
                    /* keeps each sum a chain: gcc otherwise reassociates the
                     * unrolled block's products into a tree and spills */
                    __asm__("" : "+x"(ai[h][t]));
                }
            }
        }
        const uint8_t *sc = blk + GEMM_GROUP * BS;
#pragma GCC unroll 2
        for (int h = 0; h < NH; h++) {
            const __m256 sw = SF16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 16 * (h0 + h))))
                                   : _mm256_loadu_ps((const float *)sc + 8 * (h0 + h));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const float dx = ((const float *)(acts + t * ab + l->act_dx))[b];
                acc[h][t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ai[h][t]), sw), _mm256_set1_ps(dx),
                                            acc[h][t]);
            }
            if (MIN) {
                const __m256 mn = _mm256_loadu_ps((const float *)sc + GEMM_GROUP + 8 * (h0 + h));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const float sx = ((const float *)(acts + t * ab + l->act_sx))[b];
                    acc[h][t] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(sx), acc[h][t]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        if (n_rows == 8 * NH) {
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++) _mm256_storeu_ps(out + t * ldo + 8 * h, acc[h][t]);
        } else { /* the panel's last, partial group */
            float tmp[GEMM_GROUP];
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++) _mm256_storeu_ps(tmp + 8 * h, acc[h][t]);
            memcpy(out + t * ldo, tmp, (size_t)n_rows * sizeof(float));
        }
    }
}

/* (w, x, ab, l, out, ldo, n_rows, h): rows [8h, 8h + n_rows) of the group
 * for the half tiles (T > INT_NT_GROUP), all n_rows from 0 (h = 0) for the
 * whole-group ones */
typedef void (*int_fn)(const uint8_t *, const uint8_t *, size_t, const gemm_int_layout *, float *, size_t, int,
                       int);

/* One function per token count: T is a constant in each. */
#define INT_KERN(NAME, BS, MIN, SIGNED, SF16, T)                                                            \
    static void NAME##_##T(const uint8_t *w, const uint8_t *x, size_t ab, const gemm_int_layout *l, float *o, \
                           size_t ldo, int n_rows, int h)                                                    \
    {                                                                                                        \
        kern_int(w, x, ab, l, o, ldo, n_rows, h, T, BS, MIN, SIGNED, SF16);                                  \
    }
/* NAME_tab[T - 1]: the kernel for a tile of T tokens */
#define INT_KERNS(NAME, BS, MIN, SIGNED, SF16)                                                              \
    INT_KERN(NAME, BS, MIN, SIGNED, SF16, 1) INT_KERN(NAME, BS, MIN, SIGNED, SF16, 2)                       \
    INT_KERN(NAME, BS, MIN, SIGNED, SF16, 3) INT_KERN(NAME, BS, MIN, SIGNED, SF16, 4)                       \
    INT_KERN(NAME, BS, MIN, SIGNED, SF16, 5) INT_KERN(NAME, BS, MIN, SIGNED, SF16, 6)                       \
    INT_KERN(NAME, BS, MIN, SIGNED, SF16, 7) INT_KERN(NAME, BS, MIN, SIGNED, SF16, 8)                       \
    static const int_fn NAME##_tab[INT_NT] = { NAME##_1, NAME##_2, NAME##_3, NAME##_4,                       \
                                               NAME##_5, NAME##_6, NAME##_7, NAME##_8 };
INT_KERNS(s32, 32, 0, 1, 1)  /* Q8_0, IQ4_NL (f16 scales) */
INT_KERNS(x32, 32, 0, 2, 0)  /* IQ4_XS */
INT_KERNS(u32, 32, 0, 0, 1)  /* Q4_0 (f16 scales) */
INT_KERNS(u32m, 32, 1, 0, 0) /* Q4_K, Q5_K */
INT_KERNS(u16, 16, 0, 0, 0)  /* Q6_K */

/* ---- float kinds ----------------------------------------------------------
 * R x T tiles (R, T <= 2) over the rows stored one after another: the
 * reference's 16 lanes per (row, token) are two ymm accumulators, each lane
 * the same chain of fused multiply-adds, and quant_hsum16's tree sums
 * them, so the tiles are bit-identical to gemm_panel_ref. 2 x 2 x 2
 * accumulators, the tokens' and a row's vectors fill the 16 registers. */
enum { FLT_R = 2, FLT_T = 2 };

/* quant_hsum16 of the lanes of lo (0-7) and hi (8-15), in its order. */
INLINE float hsum16(__m256 lo, __m256 hi)
{
    const __m256 t = _mm256_add_ps(lo, hi);
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u)); /* u0 + u2, u1 + u3 */
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

/* F32 rows (n padded to 16) or, bf16 != 0, BF16 rows (padded to 32: per 32
 * elements lane l of the 16 takes pairs 2l + 1, 2l through the emulated
 * vdpbf16ps). */
INLINE void tile_float(const uint8_t *rows, size_t rb, const uint8_t *acts, int64_t n, float *out, size_t ldo,
                       const int R, const int T, const int bf16)
{
    __m256 acc[FLT_R][FLT_T][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    if (bf16) {
        const int64_t np = (n + 31) / 32 * 32;
        for (int64_t k = 0; k < np; k += 32)
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const uint16_t *w = (const uint16_t *)(const void *)(rows + r * rb) + k;
#pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    const uint16_t *x = (const uint16_t *)(const void *)(acts + t * rb) + k;
                    acc[r][t][0] = dpbf16x8(acc[r][t][0], w, x);
                    acc[r][t][1] = dpbf16x8(acc[r][t][1], w + 16, x + 16);
                }
            }
    } else {
        const int64_t np = (n + 15) / 16 * 16;
        for (int64_t k = 0; k < np; k += 16) {
            __m256 x[FLT_T][2];
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                x[t][0] = _mm256_loadu_ps((const float *)(const void *)(acts + t * rb) + k);
                x[t][1] = _mm256_loadu_ps((const float *)(const void *)(acts + t * rb) + k + 8);
            }
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m256 w0 = _mm256_loadu_ps((const float *)(const void *)(rows + r * rb) + k);
                const __m256 w1 = _mm256_loadu_ps((const float *)(const void *)(rows + r * rb) + k + 8);
#pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    acc[r][t][0] = _mm256_fmadd_ps(w0, x[t][0], acc[r][t][0]);
                    acc[r][t][1] = _mm256_fmadd_ps(w1, x[t][1], acc[r][t][1]);
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) out[t * ldo + r] = hsum16(acc[r][t][0], acc[r][t][1]);
}

static void panel_float(uint32_t type, const uint8_t *rows, int nr, const uint8_t *acts, int nt, int64_t n,
                        float *out, size_t ldo)
{
    const size_t rb = gemm_row_bytes(type, n);
    const int bf16 = gemm_is_bf16(type);
    for (int t0 = 0; t0 < nt; t0 += FLT_T)
        for (int r0 = 0; r0 < nr; r0 += FLT_R) {
            const int R = nr - r0 < FLT_R ? nr - r0 : FLT_R, T = nt - t0 < FLT_T ? nt - t0 : FLT_T;
            const uint8_t *w = rows + r0 * rb, *x = acts + t0 * rb;
            float *o = out + t0 * ldo + r0;
            if (bf16) {
                if (R == 2 && T == 2) tile_float(w, rb, x, n, o, ldo, 2, 2, 1);
                else if (R == 2) tile_float(w, rb, x, n, o, ldo, 2, 1, 1);
                else if (T == 2) tile_float(w, rb, x, n, o, ldo, 1, 2, 1);
                else tile_float(w, rb, x, n, o, ldo, 1, 1, 1);
            } else {
                if (R == 2 && T == 2) tile_float(w, rb, x, n, o, ldo, 2, 2, 0);
                else if (R == 2) tile_float(w, rb, x, n, o, ldo, 2, 1, 0);
                else if (T == 2) tile_float(w, rb, x, n, o, ldo, 1, 2, 0);
                else tile_float(w, rb, x, n, o, ldo, 1, 1, 0);
            }
        }
}

static void panel_avx2(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n, float *out,
                     size_t ldo)
{
    gemm_int_layout l;
    if (gemm_int_layout_of(type, n, &l)) {
        panel_float(type, rows, nr, acts, nt, n, out, ldo);
        return;
    }
    const int_fn *tab = type == QT_IQ4_XS ? x32_tab : l.zp == 128 ? s32_tab : l.bs == 16 ? u16_tab
                      : l.has_min ? u32m_tab : u32_tab;
    assert(l.zp == 128 ? l.bs == 32 && !l.has_min : l.zp <= 32);
    assert(l.scale_f16 == (type != QT_IQ4_XS && l.bs == 32 && !l.has_min));
    const size_t gstride = (size_t)l.nb * l.block_bytes;
    const int ng = (nr + GEMM_GROUP - 1) / GEMM_GROUP;
    for (int t0 = 0; t0 < nt; t0 += INT_NT) {
        const int tt = nt - t0 < INT_NT ? nt - t0 : INT_NT;
        const int halves = tt > INT_NT_GROUP; /* the tile covers one half, else the whole group */
        for (int g = 0; g < ng; g++) {
            const int n_rows = nr - g * GEMM_GROUP < GEMM_GROUP ? nr - g * GEMM_GROUP : GEMM_GROUP;
            for (int h = 0; h < (halves ? 2 : 1) && n_rows > 8 * h; h++) {
                const int nh = !halves ? n_rows : n_rows - 8 * h < 8 ? n_rows - 8 * h : 8;
                tab[tt - 1]((const uint8_t *)rows + g * gstride, (const uint8_t *)acts + t0 * l.act_bytes,
                            l.act_bytes, &l, out + t0 * ldo + g * GEMM_GROUP + 8 * h, ldo, nh, h);
            }
        }
    }
}

const gemm_kernels gemm_kernels_avx2 = { 1, 1, panel_avx2, NULL, NULL };

#else
typedef int gemm_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
