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

#if defined(__AVX512BF16__)
/* R x T tile over bf16 rows (n padded to 32): one vdpbf16ps per 32. */
INLINE void tile_bf16(const uint8_t *rows, size_t rb, const uint8_t *acts, int64_t np, float *out, size_t ldo,
                      const int R, const int T)
{
    __m512 acc[GEMM_MR][GEMM_NT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < np; k += 32) {
        __m512bh x[GEMM_NT];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) x[t] = (__m512bh)_mm512_load_si512((const uint16_t *)(acts + t * rb) + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512bh w = (__m512bh)_mm512_load_si512((const uint16_t *)(rows + r * rb) + k);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w, x[t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}
#define BF16_SHAPE(R, T)                                                                              \
    static void bf16_##R##x##T(const uint8_t *w, size_t rb, const uint8_t *x, int64_t np, float *o,   \
                               size_t ldo)                                                            \
    {                                                                                                 \
        tile_bf16(w, rb, x, np, o, ldo, R, T);                                                        \
    }
#else
#define BF16_SHAPE(R, T)
#endif

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
    }                                                                                                 \
    BF16_SHAPE(R, T)
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
#if defined(__AVX512BF16__)
static const f32_fn bf16_tab[4][4] = {
    { bf16_1x1, bf16_1x2, bf16_1x3, bf16_1x4 }, { bf16_2x1, bf16_2x2, bf16_2x3, bf16_2x4 },
    { bf16_3x1, bf16_3x2, bf16_3x3, bf16_3x4 }, { bf16_4x1, bf16_4x2, bf16_4x3, bf16_4x4 },
};
#endif
_Static_assert(GEMM_MR == 4 && GEMM_NT == 4, "tables are 4 x 4");

void gemm_tile_avx512(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                      float *out, size_t ldo)
{
    assert(nr >= 1 && nr <= GEMM_MR && nt >= 1 && nt <= GEMM_NT);
    const size_t rb = gemm_row_bytes(type, n);
    if (type == QT_BF16) {
#if defined(__AVX512BF16__)
        bf16_tab[nr - 1][nt - 1](rows, rb, acts, (int64_t)(rb / sizeof(uint16_t)), out, ldo);
#else
        gemm_tile_ref(type, rows, nr, acts, nt, n, out, ldo);
#endif
    } else if (type == QT_F32 || type == QT_F16) {
        f32_tab[nr - 1][nt - 1](rows, rb, acts, (int64_t)(rb / sizeof(float)), out, ldo);
    } else {
        const int64_t np = (n + GEMM_PAD - 1) / GEMM_PAD * GEMM_PAD;
        const int64_t ngp = (int64_t)(rb - 2 * (size_t)np) / 4;
        int_tab[nr - 1][nt - 1](rows, rb, acts, np, ngp, out, ldo);
    }
}

double gemm_peak_int8(int64_t iters, float *sink)
{
    /* inline asm: with the intrinsic GCC copies every accumulator twice
     * per round (vpdpbusd overwrites its source), which halves the rate */
    __m512i a0 = _mm512_set1_epi32(0), a1 = _mm512_set1_epi32(1), a2 = _mm512_set1_epi32(2),
            a3 = _mm512_set1_epi32(3), a4 = _mm512_set1_epi32(4), a5 = _mm512_set1_epi32(5),
            a6 = _mm512_set1_epi32(6), a7 = _mm512_set1_epi32(7), a8 = _mm512_set1_epi32(8),
            a9 = _mm512_set1_epi32(9), a10 = _mm512_set1_epi32(10), a11 = _mm512_set1_epi32(11);
    const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-5);
    for (int64_t k = 0; k < iters; k++)
        __asm__("vpdpbusd %[y], %[x], %[a0]\n\tvpdpbusd %[y], %[x], %[a1]\n\t"
                "vpdpbusd %[y], %[x], %[a2]\n\tvpdpbusd %[y], %[x], %[a3]\n\t"
                "vpdpbusd %[y], %[x], %[a4]\n\tvpdpbusd %[y], %[x], %[a5]\n\t"
                "vpdpbusd %[y], %[x], %[a6]\n\tvpdpbusd %[y], %[x], %[a7]\n\t"
                "vpdpbusd %[y], %[x], %[a8]\n\tvpdpbusd %[y], %[x], %[a9]\n\t"
                "vpdpbusd %[y], %[x], %[a10]\n\tvpdpbusd %[y], %[x], %[a11]"
                : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4), [a5] "+v"(a5),
                  [a6] "+v"(a6), [a7] "+v"(a7), [a8] "+v"(a8), [a9] "+v"(a9), [a10] "+v"(a10), [a11] "+v"(a11)
                : [x] "v"(x), [y] "v"(y));
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    *sink = (float)_mm512_reduce_add_epi32(s);
    return (double)iters * 12 * 128;
}

double gemm_peak_f32(int64_t iters, float *sink)
{
    __m512 a[16];
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t k = 0; k < iters; k++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    }
    __m512 s = a[0];
#pragma GCC unroll 16
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, a[i]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * 16 * 32;
}

#else
double gemm_peak_int8(int64_t iters, float *sink) { (void)iters; *sink = 0; return 0; }
double gemm_peak_f32(int64_t iters, float *sink) { (void)iters; *sink = 0; return 0; } /* ISO C forbids an empty translation unit */
#endif
