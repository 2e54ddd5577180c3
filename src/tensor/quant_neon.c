/* quant_neon.c - ARM64 Advanced SIMD twins of the reference kernels.
 *
 * Bit-identical to quant_ref.c, like the x86 twins: integer lanes are exact
 * (so any integer order will do) and every float operation follows the
 * reference's order (quant_impl.h's LANES8 / ROW1 / F32x64 contract, with
 * 8 float lanes held as two float32x4 and 16 as four). Types without a
 * kernel here (and the activation quantisers, O(n) against the O(n * rows)
 * dots) use the reference.
 *
 * The Makefile compiles this file twice: for baseline ARMv8-A, where the
 * four-byte lane sums come from widening multiplies and pairwise adds, and
 * with +dotprod (quant_kernels_neondp), where one sdot gives them.
 *
 * Map: helpers | f16/f32 rows | float dots | 32-element quants | K-quants |
 * entry points.
 */
#include "tensor/quant_impl.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

/* ------------------------------------------------------------- helpers */

static inline float h2f(uint16_t h) { return fp16_to_fp32(h); }

/* Lane k = sum of the products of bytes 4k..4k+3 (ggml's lane layout). */
static inline int32x4_t dot4_i8(int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    /* products fit int16 (|a*b| <= 2^14); pairs widen to int32 */
    int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));
    return vpaddq_s32(lo, hi);
#endif
}

/* 8 float lanes: lo = lanes 0-3, hi = lanes 4-7. */
typedef struct { float32x4_t lo, hi; } f8;

static inline f8 f8_zero(void) { return (f8){ vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) }; }

/* acc[k] = fma(d, (float)lane_k, acc[k]) */
static inline f8 lanes_fma(float d, int32x4_t lo, int32x4_t hi, f8 acc)
{
    const float32x4_t vd = vdupq_n_f32(d);
    acc.lo = vfmaq_f32(acc.lo, vcvtq_f32_s32(lo), vd);
    acc.hi = vfmaq_f32(acc.hi, vcvtq_f32_s32(hi), vd);
    return acc;
}

/* quant_hsum8's order: r_i = a_i + a_{i+4}, then (r0 + r2) + (r1 + r3). */
static inline float hsum8(f8 a)
{
    float32x4_t r = vaddq_f32(a.lo, a.hi);
    float32x2_t t = vadd_f32(vget_low_f32(r), vget_high_f32(r));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* ---------------------------------------------------------- f16/f32 rows */

static inline float32x4_t load_f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

void NEON_TWIN(fp16_to_fp32_row)(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(dst + i, load_f16x4(src + i));
        vst1q_f32(dst + i + 4, load_f16x4(src + i + 4));
    }
    for (; i < n; i++) dst[i] = h2f(src[i]);
}

void NEON_TWIN(fp32_to_fp16_row)(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) /* round to nearest even: the FPCR default */
        vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

void NEON_TWIN(axpy_f32)(float *y, float a, const float *x, int64_t n)
{
    const float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), vld1q_f32(x + i), va));
    for (; i < n; i++) y[i] = fmaf(x[i], a, y[i]);
}

void NEON_TWIN(axpy_f16)(float *y, float a, const uint16_t *x, int64_t n)
{
    const float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), load_f16x4(x + i), va));
    for (; i < n; i++) y[i] = fmaf(h2f(x[i]), a, y[i]);
}

/* ---------------------------------------------------------- float dots */

/* F32x64: acc[j][q] holds lanes 4q..4q+3 of accumulator j. */
typedef struct { float32x4_t v[4][4]; } acc64;

static inline void acc64_zero(acc64 *a)
{
    for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) a->v[j][q] = vdupq_n_f32(0.0f);
}

/* (a0 + a2) + (a1 + a3) lane by lane, then quant_hsum16's halving. */
static inline float acc64_reduce(const acc64 *a)
{
    float32x4_t s[4];
    for (int q = 0; q < 4; q++)
        s[q] = vaddq_f32(vaddq_f32(a->v[0][q], a->v[2][q]), vaddq_f32(a->v[1][q], a->v[3][q]));
    float32x4_t u = vaddq_f32(vaddq_f32(s[0], s[2]), vaddq_f32(s[1], s[3]));
    float32x2_t t = vadd_f32(vget_low_f32(u), vget_high_f32(u));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

float NEON_TWIN(dot_f32)(const float *a, const float *b, int64_t n)
{
    acc64 acc;
    acc64_zero(&acc);
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int q = 0; q < 4; q++) {
                const int64_t o = i + 16 * j + 4 * q;
                acc.v[j][q] = vfmaq_f32(acc.v[j][q], vld1q_f32(a + o), vld1q_f32(b + o));
            }
    float s = acc64_reduce(&acc);
    int64_t nf = np + ((n - np) & ~(int64_t)7); /* leftovers: see dot_f32_x64 in quant_ref.c */
    for (int64_t i = np; i < nf; i++) {
        float p = a[i] * b[i]; /* a separate statement: never contracted */
        s += p;
    }
    for (int64_t i = nf; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

float NEON_TWIN(dot_f16_f32)(const uint16_t *a, const float *b, int64_t n)
{
    acc64 acc;
    acc64_zero(&acc);
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int q = 0; q < 4; q++) {
                const int64_t o = i + 16 * j + 4 * q;
                acc.v[j][q] = vfmaq_f32(acc.v[j][q], load_f16x4(a + o), vld1q_f32(b + o));
            }
    float s = acc64_reduce(&acc);
    for (int64_t i = np; i < n; i++) s = fmaf(h2f(a[i]), b[i], s);
    return s;
}

static float dot_f16(const uint16_t *a, const uint16_t *b, int64_t n)
{
    acc64 acc;
    acc64_zero(&acc);
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int q = 0; q < 4; q++) {
                const int64_t o = i + 16 * j + 4 * q;
                acc.v[j][q] = vfmaq_f32(acc.v[j][q], load_f16x4(a + o), load_f16x4(b + o));
            }
    double s = acc64_reduce(&acc);
    for (int64_t i = np; i < n; i++) s += (double)(h2f(a[i]) * h2f(b[i]));
    return (float)s;
}

/* ------------------------------------------------- 32-element quants */

static float dot_q8_0(const blk_q8_0 *w, const blk_q8_0 *x, int64_t nb)
{
    f8 acc = f8_zero();
    for (int64_t i = 0; i < nb; i++) {
        int32x4_t lo = dot4_i8(vld1q_s8(w[i].qs), vld1q_s8(x[i].qs));
        int32x4_t hi = dot4_i8(vld1q_s8(w[i].qs + 16), vld1q_s8(x[i].qs + 16));
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), lo, hi, acc);
    }
    return hsum8(acc);
}

/* Integer dot of a Q4_0 block (nibble - 8) with a Q8_0 block. */
static inline int q4_0_isum(const blk_q4_0 *w, const blk_q8_0 *x)
{
    const uint8x16_t v = vld1q_u8(w->qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
    return vaddvq_s32(vaddq_s32(dot4_i8(lo, vld1q_s8(x->qs)), dot4_i8(hi, vld1q_s8(x->qs + 16))));
}

static float dot_q4_0(const blk_q4_0 *w, const blk_q8_0 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) acc = fmaf((float)q4_0_isum(w + i, x + i), h2f(w[i].d) * h2f(x[i].d), acc);
    return acc;
}

/* ------------------------------------------------------------ K-quants */

static inline void k4_unpack(const uint8_t *s, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a[3];
    memcpy(a, s, 12);
    uint32_t v[4] = { a[0] & 0x3f3f3f3fu, (a[2] & 0x0f0f0f0fu) | ((a[0] >> 6) & 0x03030303u) << 4,
                      a[1] & 0x3f3f3f3fu, ((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 6) & 0x03030303u) << 4 };
    memcpy(sc, v, 8);
    memcpy(mn, v + 2, 8);
}

/* sum_j mn[j] * (bsums[2j] + bsums[2j+1]) */
static inline int k4_min_sum(const uint8_t mn[8], const int16_t *bsums)
{
    const int16x8_t pair = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8)); /* |sum| <= 2 * 16 * 128 */
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    return vaddvq_s32(vaddq_s32(vmull_s16(vget_low_s16(pair), vget_low_s16(m)), vmull_high_s16(pair, m)));
}

static float dot_q4_K(const blk_q4_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc = 0.0f, accm = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        k4_unpack(w[i].scales, sc, mn);
        int32x4_t lanes = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++) {
            const int8_t *q8 = x[i].qs + 64 * c;
            const uint8x16_t v0 = vld1q_u8(w[i].qs + 32 * c), v1 = vld1q_u8(w[i].qs + 32 * c + 16);
            int32x4_t lo = vaddq_s32(dot4_i8(vreinterpretq_s8_u8(vandq_u8(v0, m4)), vld1q_s8(q8)),
                                     dot4_i8(vreinterpretq_s8_u8(vandq_u8(v1, m4)), vld1q_s8(q8 + 16)));
            int32x4_t hi = vaddq_s32(dot4_i8(vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), vld1q_s8(q8 + 32)),
                                     dot4_i8(vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)), vld1q_s8(q8 + 48)));
            lanes = vmlaq_n_s32(lanes, lo, sc[2 * c]);
            lanes = vmlaq_n_s32(lanes, hi, sc[2 * c + 1]);
        }
        const int isum = vaddvq_s32(lanes);
        const int imin = k4_min_sum(mn, x[i].bsums);
        acc = fmaf((float)isum, h2f(w[i].d) * x[i].d, acc);
        accm = fmaf((float)imin, h2f(w[i].dmin) * x[i].d, accm);
    }
    return acc - accm;
}

/* Q6_K, LANES8: lane k of each 32-element chunk (elements 4k..4k+3; lanes
 * 0-3 are the chunk's first group of 16, 4-7 its second) times the group's
 * scale, minus 32 * (bsums[2k] sc[2k] + bsums[2k+1] sc[2k+1]) as the x86
 * kernel folds the value offset in. */
static float dot_q6_K(const blk_q6_K *w, const blk_q8_K *x, int64_t nb)
{
    f8 acc = f8_zero();
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *sc = w[i].scales;
        int32x4_t lanes_lo = vdupq_n_s32(0), lanes_hi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++)
            for (int part = 0; part < 2; part++) { /* bytes 0-15, 16-31 of each 32-byte row */
                const int o = 16 * part;
                const uint8x16_t l0 = vld1q_u8(w[i].ql + 64 * h + o), l1 = vld1q_u8(w[i].ql + 64 * h + 32 + o);
                const uint8x16_t H = vld1q_u8(w[i].qh + 32 * h + o);
                const uint8x16_t q[4] = {
                    vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(H, m3), 4)),
                    vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H, 2), m3), 4)),
                    vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H, 4), m3), 4)),
                    vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(H, 6), 4)),
                };
                for (int s = 0; s < 4; s++) {
                    const int g = 8 * h + 2 * s + part;
                    int32x4_t d = dot4_i8(vreinterpretq_s8_u8(q[s]), vld1q_s8(x[i].qs + 128 * h + 32 * s + o));
                    if (part) lanes_hi = vmlaq_n_s32(lanes_hi, d, sc[g]);
                    else lanes_lo = vmlaq_n_s32(lanes_lo, d, sc[g]);
                }
            }
        /* corr lane k = bsums[2k] sc[2k] + bsums[2k+1] sc[2k+1] */
        const int16x8_t s16a = vmovl_s8(vld1_s8(sc)), s16b = vmovl_s8(vld1_s8(sc + 8));
        const int16x8_t b0 = vld1q_s16(x[i].bsums), b1 = vld1q_s16(x[i].bsums + 8);
        int32x4_t c_lo = vpaddq_s32(vmull_s16(vget_low_s16(b0), vget_low_s16(s16a)), vmull_high_s16(b0, s16a));
        int32x4_t c_hi = vpaddq_s32(vmull_s16(vget_low_s16(b1), vget_low_s16(s16b)), vmull_high_s16(b1, s16b));
        lanes_lo = vsubq_s32(lanes_lo, vshlq_n_s32(c_lo, 5));
        lanes_hi = vsubq_s32(lanes_hi, vshlq_n_s32(c_hi, 5));
        acc = lanes_fma(x[i].d * h2f(w[i].d), lanes_lo, lanes_hi, acc);
    }
    return hsum8(acc);
}

/* -------------------------------------------------------- entry points */

void NEON_TWIN(quant_to_float)(uint32_t type, const void *src, float *dst, int64_t n)
{
    if (type == QT_F16) NEON_TWIN(fp16_to_fp32_row)(src, dst, n);
    else quant_to_float_ref(type, src, dst, n);
}

int NEON_TWIN(quant_from_float)(uint32_t type, const float *src, void *dst, int64_t n)
{
    if (type == QT_F16) {
        NEON_TWIN(fp32_to_fp16_row)(src, dst, n);
        return 0;
    }
    return quant_from_float_ref(type, src, dst, n);
}

float NEON_TWIN(quant_dot)(uint32_t type, const void *w, const void *x, int64_t n)
{
    switch (type) {
    case QT_F32:  return NEON_TWIN(dot_f32)(w, x, n);
    case QT_F16:  return dot_f16(w, x, n);
    case QT_Q8_0: return dot_q8_0(w, x, n / QK);
    case QT_Q4_0: return dot_q4_0(w, x, n / QK);
    case QT_Q4_K: return dot_q4_K(w, x, n / QKK);
    case QT_Q6_K: return dot_q6_K(w, x, n / QKK);
    default:      return quant_dot_ref(type, w, x, n);
    }
}

void NEON_TWIN(quant_dot_rows)(uint32_t type, const void *w, size_t w_stride, int nr,
                               const void *x, int64_t n, float *out)
{
    for (int r = 0; r < nr; r++) out[r] = NEON_TWIN(quant_dot)(type, (const char *)w + (size_t)r * w_stride, x, n);
}

const quant_kernels NEON_TWIN(quant_kernels) = {
    NEON_TWIN(quant_to_float), NEON_TWIN(quant_from_float), NEON_TWIN(quant_dot), NEON_TWIN(quant_dot_rows),
    NEON_TWIN(dot_f32), NEON_TWIN(dot_f16_f32), NEON_TWIN(axpy_f32), NEON_TWIN(axpy_f16),
    NEON_TWIN(fp16_to_fp32_row), NEON_TWIN(fp32_to_fp16_row),
};

#else
typedef int neon_unused; /* ISO C forbids an empty translation unit */
#endif /* __aarch64__ */
