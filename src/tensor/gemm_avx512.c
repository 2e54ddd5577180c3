/* gemm_avx512.c - the AVX-512 VNNI / FMA micro-kernels of gemm.h, one per
 * tile shape (1..GEMM_MR rows x 1..GEMM_NT tokens), bit-identical to
 * gemm_tile_ref: 16 float lanes per (row, token), one vpdpbusd per 64
 * codes, the reductions in _mm512_reduce_add_ps order (= quant_hsum16).
 */
#include "tensor/gemm.h"
#include "tensor/quant_impl.h"

#if defined(QUANT_SIMD_AVX512)

#include <assert.h>
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* R x T tile over packed integer rows (see gemm.h for the layout). */
INLINE void tile_int(const uint8_t *rows, size_t rb, const uint8_t *acts, int64_t np, int64_t ngp,
                     float *out, size_t ldo, const int R, const int T)
{
    __m512 acc[GEMM_MR][GEMM_NT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < np; k += 64) {
        __m512i x[GEMM_NT];
        __m512 sx[GEMM_NT];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            x[t] = _mm512_load_si512(acts + t * rb + k);
            sx[t] = _mm512_load_ps((const float *)(acts + t * rb + np) + k / 4);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512i w = _mm512_load_si512(rows + r * rb + k);
            const __m512 sw = _mm512_load_ps((const float *)(rows + r * rb + np) + k / 4);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x[t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(sw, sx[t]), acc[r][t]);
            }
        }
    }
    float dot[GEMM_MR][GEMM_NT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            dot[r][t] = _mm512_reduce_add_ps(acc[r][t]);
            acc[r][t] = _mm512_setzero_ps();
        }
    for (int64_t k = 0; k < ngp; k += 16) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 mn = _mm512_load_ps((const float *)(rows + r * rb + 2 * np) + k);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_fmadd_ps(mn, _mm512_load_ps((const float *)(acts + t * rb + 2 * np) + k), acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[t * ldo + r] = dot[r][t] - _mm512_reduce_add_ps(acc[r][t]);
}

/* R x T tile over f32 rows (n padded to 16 with zeros). */
INLINE void tile_f32(const uint8_t *rows, size_t rb, const uint8_t *acts, int64_t np, float *out, size_t ldo,
                     const int R, const int T)
{
    __m512 acc[GEMM_MR][GEMM_NT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < np; k += 16) {
        __m512 x[GEMM_NT];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) x[t] = _mm512_load_ps((const float *)(acts + t * rb) + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 w = _mm512_load_ps((const float *)(rows + r * rb) + k);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(w, x[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}

typedef void (*int_fn)(const uint8_t *, size_t, const uint8_t *, int64_t, int64_t, float *, size_t);
typedef void (*f32_fn)(const uint8_t *, size_t, const uint8_t *, int64_t, float *, size_t);

#define SHAPE(R, T)                                                                                   \
    static void int_##R##x##T(const uint8_t *w, size_t rb, const uint8_t *x, int64_t np, int64_t ngp, \
                              float *o, size_t ldo)                                                  \
    {                                                                                                 \
        tile_int(w, rb, x, np, ngp, o, ldo, R, T);                                                    \
    }                                                                                                 \
    static void f32_##R##x##T(const uint8_t *w, size_t rb, const uint8_t *x, int64_t np, float *o,    \
                              size_t ldo)                                                             \
    {                                                                                                 \
        tile_f32(w, rb, x, np, o, ldo, R, T);                                                         \
    }
SHAPE(1, 1) SHAPE(1, 2) SHAPE(1, 3) SHAPE(1, 4)
SHAPE(2, 1) SHAPE(2, 2) SHAPE(2, 3) SHAPE(2, 4)
SHAPE(3, 1) SHAPE(3, 2) SHAPE(3, 3) SHAPE(3, 4)
SHAPE(4, 1) SHAPE(4, 2) SHAPE(4, 3) SHAPE(4, 4)

static const int_fn int_tab[4][4] = {
    { int_1x1, int_1x2, int_1x3, int_1x4 }, { int_2x1, int_2x2, int_2x3, int_2x4 },
    { int_3x1, int_3x2, int_3x3, int_3x4 }, { int_4x1, int_4x2, int_4x3, int_4x4 },
};
static const f32_fn f32_tab[4][4] = {
    { f32_1x1, f32_1x2, f32_1x3, f32_1x4 }, { f32_2x1, f32_2x2, f32_2x3, f32_2x4 },
    { f32_3x1, f32_3x2, f32_3x3, f32_3x4 }, { f32_4x1, f32_4x2, f32_4x3, f32_4x4 },
};
_Static_assert(GEMM_MR == 4 && GEMM_NT == 4, "tables are 4 x 4");

void gemm_tile_avx512(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                      float *out, size_t ldo)
{
    assert(nr >= 1 && nr <= GEMM_MR && nt >= 1 && nt <= GEMM_NT);
    const size_t rb = gemm_row_bytes(type, n);
    if (type == QT_F32 || type == QT_F16 || type == QT_BF16) {
        f32_tab[nr - 1][nt - 1](rows, rb, acts, (int64_t)(rb / sizeof(float)), out, ldo);
    } else {
        const int64_t np = (n + GEMM_PAD - 1) / GEMM_PAD * GEMM_PAD;
        const int64_t ngp = (int64_t)(rb - 2 * (size_t)np) / 4;
        int_tab[nr - 1][nt - 1](rows, rb, acts, np, ngp, out, ldo);
    }
}

#else
typedef int gemm_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
