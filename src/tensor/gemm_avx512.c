/* gemm_avx512.c - the AVX-512 VNNI / FMA / BF16 micro-kernels of gemm.h,
 * one function per tile shape, bit-identical to gemm_panel_ref. Integer
 * kinds: 16 rows per vector lane set (no reductions); float kinds: 16 float
 * lanes per (row, token) reduced in _mm512_reduce_add_ps order
 * (= quant_hsum16).
 */
#include "tensor/gemm_kernels.h"
#include "tensor/quant_impl.h"

#if defined(QUANT_CAN_AVX512)

#include <assert.h>
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* Integer kind: RG groups of 16 rows x T tokens, BS-element blocks, with
 * or without mins (gemm.h has the layout). Per block each (group, token)
 * keeps an exact int32 vector of 16 row sums, started at the token's
 * -zp * sum(x); then three float steps fold it into the f32 accumulator.
 * With RG = 2 and T = 6 that is 12 + 12 accumulators, two weight vectors
 * and one broadcast: 27 of the 32 zmm registers, no spills. */
enum { INT_RG = 2, INT_NT = 6 };

INLINE void kern_int(const uint8_t *grp, size_t gstride, const uint8_t *acts, size_t ab, const gemm_int_layout *l,
                     float *out, size_t ldo, __mmask16 last_mask, const int RG, const int T, const int BS,
                     const int MIN, const int SF16)
{
    __m512 acc[INT_RG][INT_NT];
#pragma GCC unroll 2
    for (int g = 0; g < RG; g++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[g][t] = _mm512_setzero_ps();
    const int32_t *start[INT_NT];
    const float *dx[INT_NT], *sx[INT_NT];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        start[t] = (const int32_t *)(acts + t * ab + l->act_start);
        dx[t] = (const float *)(acts + t * ab + l->act_dx);
        sx[t] = (const float *)(acts + t * ab + l->act_sx);
    }
    const size_t bb = l->block_bytes;
    for (int64_t b = 0; b < l->nb; b++) {
        const uint8_t *blk = grp + b * bb, *xb = acts + b * BS;
        /* With one or two tokens (decode) the vpdpbusd of a block are one
         * chain each; odd k go to a second chain, added at the end (int32
         * sums are exact in any order, so the result is the same). */
        const int CHAINS = T <= 2 ? 2 : 1;
        __m512i ai[INT_RG][INT_NT], ai2[INT_RG][INT_NT];
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m512i st = _mm512_set1_epi32(start[t][b]);
#pragma GCC unroll 2
            for (int g = 0; g < RG; g++) {
                ai[g][t] = st;
                if (CHAINS == 2) ai2[g][t] = _mm512_setzero_si512();
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < BS / 4; k++) {
            __m512i w[INT_RG];
#pragma GCC unroll 2
            for (int g = 0; g < RG; g++) w[g] = _mm512_loadu_si512(blk + g * gstride + 64 * k);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                const __m512i x = _mm512_broadcastd_epi32(_mm_loadu_si32(xb + t * ab + 4 * k));
#pragma GCC unroll 2
                for (int g = 0; g < RG; g++) {
                    if (CHAINS == 2 && (k & 1)) ai2[g][t] = _mm512_dpbusd_epi32(ai2[g][t], w[g], x);
                    else ai[g][t] = _mm512_dpbusd_epi32(ai[g][t], w[g], x);
                }
            }
        }
        if (CHAINS == 2)
#pragma GCC unroll 6
            for (int t = 0; t < T; t++)
#pragma GCC unroll 2
                for (int g = 0; g < RG; g++) ai[g][t] = _mm512_add_epi32(ai[g][t], ai2[g][t]);
#pragma GCC unroll 2
        for (int g = 0; g < RG; g++) {
            const uint8_t *sc = blk + g * gstride + GEMM_GROUP * BS;
            const __m512 sw = SF16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc)) : _mm512_loadu_ps(sc);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++)
                acc[g][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ai[g][t]), sw), _mm512_set1_ps(dx[t][b]),
                                            acc[g][t]);
            if (MIN) {
                const __m512 mn = _mm512_loadu_ps(sc + 4 * GEMM_GROUP);
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) acc[g][t] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(sx[t][b]), acc[g][t]);
            }
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int g = 0; g < RG; g++)
            _mm512_mask_storeu_ps(out + t * ldo + GEMM_GROUP * g, g == RG - 1 ? last_mask : 0xFFFF, acc[g][t]);
}

typedef void (*int_fn)(const uint8_t *, size_t, const uint8_t *, size_t, const gemm_int_layout *, float *, size_t,
                       __mmask16);

#define INT_KERN(NAME, BS, MIN, SF16, RG, T)                                                               \
    static void NAME##_##RG##x##T(const uint8_t *w, size_t gs, const uint8_t *x, size_t ab,               \
                                  const gemm_int_layout *l, float *o, size_t ldo, __mmask16 m)            \
    {                                                                                                      \
        kern_int(w, gs, x, ab, l, o, ldo, m, RG, T, BS, MIN, SF16);                                        \
    }
#define INT_KERNS(NAME, BS, MIN, SF16)                                                                     \
    INT_KERN(NAME, BS, MIN, SF16, 1, 1) INT_KERN(NAME, BS, MIN, SF16, 1, 2)                                 \
    INT_KERN(NAME, BS, MIN, SF16, 1, 3) INT_KERN(NAME, BS, MIN, SF16, 1, 4)                                 \
    INT_KERN(NAME, BS, MIN, SF16, 1, 5) INT_KERN(NAME, BS, MIN, SF16, 1, 6)                                 \
    INT_KERN(NAME, BS, MIN, SF16, 2, 1) INT_KERN(NAME, BS, MIN, SF16, 2, 2)                                 \
    INT_KERN(NAME, BS, MIN, SF16, 2, 3) INT_KERN(NAME, BS, MIN, SF16, 2, 4)                                 \
    INT_KERN(NAME, BS, MIN, SF16, 2, 5) INT_KERN(NAME, BS, MIN, SF16, 2, 6)                                 \
    static const int_fn NAME##_tab[2][6] = {                                                               \
        { NAME##_1x1, NAME##_1x2, NAME##_1x3, NAME##_1x4, NAME##_1x5, NAME##_1x6 },                        \
        { NAME##_2x1, NAME##_2x2, NAME##_2x3, NAME##_2x4, NAME##_2x5, NAME##_2x6 },                        \
    };
INT_KERNS(b32, 32, 0, 0)  /* IQ4_XS */
INT_KERNS(b32h, 32, 0, 1) /* Q8_0, Q4_0, IQ4_NL: f16 scales */
INT_KERNS(b32m, 32, 1, 0) /* Q4_K, Q5_K */
INT_KERNS(b16, 16, 0, 0)  /* Q6_K */
_Static_assert(INT_RG == 2 && INT_NT == 6, "tables are 2 x 6");

static void panel_int(uint32_t type, const uint8_t *rows, int nr, const uint8_t *acts, int nt, int64_t n,
                      float *out, size_t ldo)
{
    gemm_int_layout l;
    if (gemm_int_layout_of(type, n, &l)) {
        assert(0);
        return;
    }
    const int_fn(*tab)[6] = l.bs == 16 ? b16_tab : l.has_min ? b32m_tab : l.scale_f16 ? b32h_tab : b32_tab;
    assert(l.bs == 32 || (l.bs == 16 && !l.has_min && !l.scale_f16));
    assert(!(l.has_min && l.scale_f16));
    const size_t gstride = (size_t)l.nb * l.block_bytes;
    const int ng = (nr + GEMM_GROUP - 1) / GEMM_GROUP;
    /* One or two tokens: one group at a time, so each thread reads one
     * sequential stream of rows (two measured slower for decode). */
    const int max_rg = nt <= 2 ? 1 : INT_RG;
    for (int t0 = 0; t0 < nt; t0 += INT_NT) {
        const int tt = nt - t0 < INT_NT ? nt - t0 : INT_NT;
        for (int g0 = 0; g0 < ng; g0 += max_rg) {
            const int rg = ng - g0 < max_rg ? ng - g0 : max_rg;
            const int last_rows = nr - (g0 + rg - 1) * GEMM_GROUP;
            const __mmask16 m = last_rows >= GEMM_GROUP ? 0xFFFF : (__mmask16)((1u << last_rows) - 1);
            tab[rg - 1][tt - 1](rows + g0 * gstride, gstride, acts + t0 * l.act_bytes, l.act_bytes, &l,
                                out + t0 * ldo + g0 * GEMM_GROUP, ldo, m);
        }
    }
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

typedef void (*f32_fn)(const uint8_t *, size_t, const uint8_t *, int64_t, float *, size_t);

#define SHAPE(R, T)                                                                                   \
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

/* Float kinds: GEMM_MR x GEMM_NT tiles over the rows stored one after
 * another (the panel's last group padded with zero rows). */
static void panel_float(uint32_t type, const uint8_t *rows, int nr, const uint8_t *acts, int nt, int64_t n,
                        float *out, size_t ldo)
{
    const size_t rb = gemm_row_bytes(type, n);
#if defined(__AVX512BF16__)
    if (gemm_is_bf16(type) && !cpu_features_get()->avx512bf16) {
        gemm_panel_ref(type, rows, nr, acts, nt, n, out, ldo);
        return;
    }
    const f32_fn(*tab)[4] = gemm_is_bf16(type) ? bf16_tab : f32_tab;
    const int64_t np = (int64_t)(rb / (gemm_is_bf16(type) ? sizeof(uint16_t) : sizeof(float)));
#else
    if (gemm_is_bf16(type)) {
        gemm_panel_ref(type, rows, nr, acts, nt, n, out, ldo);
        return;
    }
    const f32_fn(*tab)[4] = f32_tab;
    const int64_t np = (int64_t)(rb / sizeof(float));
#endif
    for (int t0 = 0; t0 < nt; t0 += GEMM_NT)
        for (int r0 = 0; r0 < nr; r0 += GEMM_MR)
            tab[(nr - r0 < GEMM_MR ? nr - r0 : GEMM_MR) - 1][(nt - t0 < GEMM_NT ? nt - t0 : GEMM_NT) - 1](
                rows + r0 * rb, rb, acts + t0 * rb, np, out + t0 * ldo + r0, ldo);
}

static void panel_avx512(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                       float *out, size_t ldo)
{
    gemm_int_layout l;
    if (gemm_int_layout_of(type, n, &l) == 0) panel_int(type, rows, nr, acts, nt, n, out, ldo);
    else panel_float(type, rows, nr, acts, nt, n, out, ldo);
}

static double peak_int8(int64_t iters, float *sink)
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

static double peak_f32(int64_t iters, float *sink)
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

const gemm_kernels gemm_kernels_avx512 = { 1, 1, panel_avx512, peak_int8, peak_f32 };

#else
typedef int gemm_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
