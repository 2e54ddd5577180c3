/* attn_prefill_neon.c - the ARM64 NEON twins of the prefill attention row
 * primitives (attn_prefill.h), attn_prefill_avx2.c's scheme with each
 * 8-lane vector held as two float32x4: scores of 2 rows at a time over a
 * transposed key tile (eight 4-key accumulators each, products added
 * unfused in order of e as scores_ref does), attn_exp.h's polynomial exp
 * with 2^n built in the exponent bits, p.V of 2 rows x 32 of d at a time.
 */
#include "attn/attn_prefill_kernels.h"
#include "util/cpu.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "attn/attn_exp.h"

#include <arm_neon.h>

#define INLINE static inline __attribute__((always_inline))

_Static_assert(ATTN_PF_BK == 32, "eight 4-lane vectors per key tile");

/* R (1 or 2) rows: acc += q*k unfused, in order of e (scores_ref's). */
INLINE void scores_rows(const float *const *q, const float *kt, int d, float scale, float *s, const int R)
{
    float32x4_t a[2][8];
    for (int r = 0; r < R; r++)
        for (int u = 0; u < 8; u++) a[r][u] = vdupq_n_f32(0.0f);
    for (int e = 0; e < d; e++) {
        float32x4_t k[8];
        for (int u = 0; u < 8; u++) k[u] = vld1q_f32(kt + (size_t)e * ATTN_PF_BK + 4 * u);
        for (int r = 0; r < R; r++) {
            const float32x4_t qe = vdupq_n_f32(q[r][e]);
            for (int u = 0; u < 8; u++) a[r][u] = vaddq_f32(a[r][u], vmulq_f32(qe, k[u]));
        }
    }
    const float32x4_t sc = vdupq_n_f32(scale);
    for (int r = 0; r < R; r++)
        for (int u = 0; u < 8; u++) vst1q_f32(s + r * ATTN_PF_BK + 4 * u, vmulq_f32(a[r][u], sc));
}

static void scores_neon(const float *const *q, int nr, const float *kt, int d, float scale, float *s)
{
    for (int r0 = 0; r0 < nr; r0 += 2) {
        if (nr - r0 >= 2) scores_rows(q + r0, kt, d, scale, s + r0 * ATTN_PF_BK, 2);
        else scores_rows(q + r0, kt, d, scale, s + r0 * ATTN_PF_BK, 1);
    }
}

/* exp(x) for x <= 0, as attn_avx2.h's exp_neg8: 0 below -87. */
INLINE float32x4_t exp_neg4(float32x4_t x)
{
    const uint32x4_t normal = vcgeq_f32(x, vdupq_n_f32(ATTN_EXP_MIN));
    x = vmaxq_f32(x, vdupq_n_f32(ATTN_EXP_MIN));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(ATTN_EXP_LOG2E)));
    float32x4_t t = vfmsq_f32(x, n, vdupq_n_f32(ATTN_EXP_LN2_HI));
    t = vfmsq_f32(t, n, vdupq_n_f32(ATTN_EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(ATTN_EXP_C5);
    p = vfmaq_f32(vdupq_n_f32(ATTN_EXP_C4), p, t);
    p = vfmaq_f32(vdupq_n_f32(ATTN_EXP_C3), p, t);
    p = vfmaq_f32(vdupq_n_f32(ATTN_EXP_C2), p, t);
    p = vfmaq_f32(vdupq_n_f32(ATTN_EXP_C1), p, t);
    p = vfmaq_f32(vdupq_n_f32(ATTN_EXP_C0), p, t);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(r), normal));
}

/* x > acc ? x : acc per lane by a compare and a select (vmaxq_f32 would
 * return a NaN x); the lanes never hold a NaN, so vmaxvq_f32 reduces them */
static float rowmax_neon(const float *s, int nk, float m)
{
    float32x4_t acc = vdupq_n_f32(m);
    int k = 0;
    for (; k + 4 <= nk; k += 4) {
        const float32x4_t x = vld1q_f32(s + k);
        acc = vbslq_f32(vcgtq_f32(x, acc), x, acc);
    }
    float mx = vmaxvq_f32(acc);
    for (; k < nk; k++) mx = s[k] > mx ? s[k] : mx;
    return mx;
}

/* 8 lanes (lo: 0-3, hi: 4-7) summed in the AVX2 twin's order. */
static float expsum_neon(float *s, int nk, float m)
{
    const float32x4_t mv = vdupq_n_f32(m);
    float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
    int k = 0;
    for (; k + 8 <= nk; k += 8) {
        const float32x4_t p0 = exp_neg4(vsubq_f32(vld1q_f32(s + k), mv));
        const float32x4_t p1 = exp_neg4(vsubq_f32(vld1q_f32(s + k + 4), mv));
        vst1q_f32(s + k, p0);
        vst1q_f32(s + k + 4, p1);
        lo = vaddq_f32(lo, p0);
        hi = vaddq_f32(hi, p1);
    }
    float tail = 0;
    for (; k < nk; k++) { /* the tile's causal edge: same polynomial, one lane */
        s[k] = vgetq_lane_f32(exp_neg4(vdupq_n_f32(s[k] - m)), 0);
        tail += s[k];
    }
    const float32x4_t t = vaddq_f32(lo, hi); /* t_j = lane j + lane j+4 */
    return ((vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 2)) + (vgetq_lane_f32(t, 1) + vgetq_lane_f32(t, 3))) + tail;
}

/* R (1 or 2) rows x 32 of d per pass: o * c, then one fma per key in key
 * order; the last d % 32 columns as pv_ref. */
INLINE void pv_rows(const float *p, const float *v, int nk, int d, const float *c, float *const *o, const int R)
{
    int e = 0;
    for (; e + 32 <= d; e += 32) {
        float32x4_t acc[2][8];
        for (int r = 0; r < R; r++)
            for (int u = 0; u < 8; u++) acc[r][u] = vmulq_f32(vld1q_f32(o[r] + e + 4 * u), vdupq_n_f32(c[r]));
        for (int k = 0; k < nk; k++) {
            float32x4_t vr[8];
            for (int u = 0; u < 8; u++) vr[u] = vld1q_f32(v + (size_t)k * d + e + 4 * u);
            for (int r = 0; r < R; r++) {
                const float32x4_t pk = vdupq_n_f32(p[r * ATTN_PF_BK + k]);
                for (int u = 0; u < 8; u++) acc[r][u] = vfmaq_f32(acc[r][u], pk, vr[u]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int u = 0; u < 8; u++) vst1q_f32(o[r] + e + 4 * u, acc[r][u]);
    }
    for (int r = 0; r < R; r++)
        for (int f = e; f < d; f++) {
            float x = o[r][f] * c[r];
            for (int k = 0; k < nk; k++) x = __builtin_fmaf(p[r * ATTN_PF_BK + k], v[(size_t)k * d + f], x);
            o[r][f] = x;
        }
}

static void pv_neon(const float *p, int nr, const float *v, int nk, int d, const float *c, float *const *o)
{
    for (int r0 = 0; r0 < nr; r0 += 2) {
        if (nr - r0 >= 2) pv_rows(p + r0 * ATTN_PF_BK, v, nk, d, c + r0, o + r0, 2);
        else pv_rows(p + r0 * ATTN_PF_BK, v, nk, d, c + r0, o + r0, 1);
    }
}

const attn_pf_ops NEON_TWIN(attn_pf_ops) = { scores_neon, rowmax_neon, expsum_neon, pv_neon };
#else
typedef int attn_prefill_neon_unused; /* ISO C forbids an empty translation unit */
#endif
