/* gemm_neon.c - the ARM64 NEON micro-kernels of gemm.h for the integer
 * kinds, bit-identical to gemm_panel_ref.
 *
 * A 16-row group's 64 bytes of 4 codes x 16 rows are four 16-byte vectors
 * (rows 0-3, 4-7, 8-11, 12-15); one 4-byte group of a token's codes,
 * repeated in every lane, meets them in an int8 dot product: sdot with
 * +dotprod (quant_neon.c's two builds), widening multiplies and pairwise
 * adds without. Both are signed x signed, so the codes enter as signed
 * bytes:
 *   small codes (Q4_0, Q4_K, Q5_K, Q6_K: q <= 63) as they are, starting
 *     from the token's start (-zp * sum x) as the reference does;
 *   large codes (Q8_0, IQ4_NL, IQ4_XS: q = v + 128) as v = q ^ 0x80, whose
 *     sum(v * x) is the reference's start + sum(q * x) exactly.
 * The integer sums are exact either way; the float steps per block are the
 * reference's, in its order.
 */
#include "tensor/gemm_kernels.h"
#include "tensor/quant_impl.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

enum { NT = 2 }; /* tokens per tile: 4 row quads x 2 tokens x (int + float) = 16 of 32 registers */

/* acc lane r += sum_j w[4r + j] * x4[j] */
INLINE int32x4_t dot4_bcast(int32x4_t acc, int8x16_t w, int8x16_t x4)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, x4);
#else
    int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x4)));
    int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, x4));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}

INLINE void kern_int(const uint8_t *blk0, const uint8_t *acts, size_t ab, const gemm_int_layout *l, float *out,
                     size_t ldo, int n_rows, const int T, const int BS, const int MIN, const int SIGNED,
                     const int SF16)
{
    float32x4_t acc[4][NT];
    for (int h = 0; h < 4; h++)
        for (int t = 0; t < T; t++) acc[h][t] = vdupq_n_f32(0.0f);
    const uint8x16_t flip = vdupq_n_u8(0x80);
    for (int64_t b = 0; b < l->nb; b++) {
        const uint8_t *blk = blk0 + b * l->block_bytes, *xb = acts + b * BS;
        int32x4_t ai[4][NT];
        for (int t = 0; t < T; t++) {
            const int32x4_t st = SIGNED ? vdupq_n_s32(0)
                                        : vdupq_n_s32(((const int32_t *)(acts + t * ab + l->act_start))[b]);
            for (int h = 0; h < 4; h++) ai[h][t] = st;
        }
        for (int k = 0; k < BS / 4; k++) {
            int8x16_t w[4];
            for (int h = 0; h < 4; h++) {
                uint8x16_t v = vld1q_u8(blk + 64 * k + 16 * h);
                w[h] = vreinterpretq_s8_u8(SIGNED ? veorq_u8(v, flip) : v);
            }
            for (int t = 0; t < T; t++) {
                int32_t x4;
                memcpy(&x4, xb + t * ab + 4 * k, 4);
                const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(x4));
                for (int h = 0; h < 4; h++) ai[h][t] = dot4_bcast(ai[h][t], w[h], x);
            }
        }
        const uint8_t *sc = blk + GEMM_GROUP * BS;
        for (int h = 0; h < 4; h++) {
            float32x4_t sw;
            if (SF16) {
                uint16x4_t s16;
                memcpy(&s16, sc + 8 * h, 8);
                sw = vcvt_f32_f16(vreinterpret_f16_u16(s16));
            } else {
                sw = vld1q_f32((const float *)sc + 4 * h);
            }
            for (int t = 0; t < T; t++) {
                const float dx = ((const float *)(acts + t * ab + l->act_dx))[b];
                /* fma((float)isum * s, dx, acc): the product rounded first */
                const float32x4_t p = vmulq_f32(vcvtq_f32_s32(ai[h][t]), sw);
                acc[h][t] = vfmaq_f32(acc[h][t], p, vdupq_n_f32(dx));
            }
            if (MIN) {
                const float32x4_t mn = vld1q_f32((const float *)sc + GEMM_GROUP + 4 * h);
                for (int t = 0; t < T; t++) {
                    const float sx = ((const float *)(acts + t * ab + l->act_sx))[b];
                    acc[h][t] = vfmsq_f32(acc[h][t], mn, vdupq_n_f32(sx)); /* fma(-m, sx, acc) */
                }
            }
        }
    }
    for (int t = 0; t < T; t++) {
        float tmp[GEMM_GROUP];
        for (int h = 0; h < 4; h++) vst1q_f32(tmp + 4 * h, acc[h][t]);
        memcpy(out + t * ldo, tmp, (size_t)n_rows * sizeof(float)); /* the last group may be partial */
    }
}

typedef void (*int_fn)(const uint8_t *, const uint8_t *, size_t, const gemm_int_layout *, float *, size_t, int);

#define INT_KERN(NAME, BS, MIN, SIGNED, SF16, T)                                                             \
    static void NAME##_##T(const uint8_t *w, const uint8_t *x, size_t ab, const gemm_int_layout *l, float *o, \
                           size_t ldo, int n_rows)                                                           \
    {                                                                                                        \
        kern_int(w, x, ab, l, o, ldo, n_rows, T, BS, MIN, SIGNED, SF16);                                     \
    }
#define INT_KERNS(NAME, BS, MIN, SIGNED, SF16)                                                               \
    INT_KERN(NAME, BS, MIN, SIGNED, SF16, 1) INT_KERN(NAME, BS, MIN, SIGNED, SF16, 2)                        \
    static const int_fn NAME##_tab[2] = { NAME##_1, NAME##_2 };
INT_KERNS(s32h, 32, 0, 1, 1)  /* Q8_0, IQ4_NL (f16 scales) */
INT_KERNS(s32f, 32, 0, 1, 0)  /* IQ4_XS */
INT_KERNS(u32, 32, 0, 0, 1)   /* Q4_0 (f16 scales) */
INT_KERNS(u32m, 32, 1, 0, 0)  /* Q4_K, Q5_K */
INT_KERNS(u16, 16, 0, 0, 0)   /* Q6_K */

static void panel_neon(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n, float *out,
                       size_t ldo)
{
    gemm_int_layout l;
    if (gemm_int_layout_of(type, n, &l)) { /* float kinds: no NEON tiles (gemm_supported says so) */
        gemm_panel_ref(type, rows, nr, acts, nt, n, out, ldo);
        return;
    }
    const int_fn *tab = type == QT_IQ4_XS ? s32f_tab : l.zp == 128 ? s32h_tab : l.bs == 16 ? u16_tab
                      : l.has_min ? u32m_tab : u32_tab;
    assert(l.zp == 128 ? l.bs == 32 && !l.has_min : l.zp <= 32);
    assert(l.scale_f16 == (type != QT_IQ4_XS && l.bs == 32 && !l.has_min));
    const size_t gstride = (size_t)l.nb * l.block_bytes;
    const int ng = (nr + GEMM_GROUP - 1) / GEMM_GROUP;
    for (int t0 = 0; t0 < nt; t0 += NT) {
        const int tt = nt - t0 < NT ? nt - t0 : NT;
        for (int g = 0; g < ng; g++) {
            const int n_rows = nr - g * GEMM_GROUP < GEMM_GROUP ? nr - g * GEMM_GROUP : GEMM_GROUP;
            tab[tt - 1]((const uint8_t *)rows + g * gstride, (const uint8_t *)acts + t0 * l.act_bytes, l.act_bytes,
                        &l, out + t0 * ldo + g * GEMM_GROUP, ldo, n_rows);
        }
    }
}

const gemm_kernels NEON_TWIN(gemm_kernels) = { 1, 0, panel_neon, NULL, NULL };

#else
typedef int neon_unused; /* ISO C forbids an empty translation unit */
#endif /* __aarch64__ */
