/* attn_kernels_neon.c - ARM64 NEON twins of the decode-attention kernels
 * (attn.h): scores, softmax, weighted sums, the fused softmax-weighted sum
 * and the gather of selected rows that SparQ and the other top-k policies
 * end with, and SparQ's K^T scans, for f32 and f16 caches.
 *
 * Like the AVX-512 twins they sum in vector lanes rather than in the
 * reference's order and take e^x from attn_exp.h's polynomial (exactly 0
 * below e^-87, never subnormal), so they agree with the reference to the
 * tolerance tests/test_attn.c holds every twin to (1e-5 relative), not bit
 * for bit; softmax denominators are summed in double as the reference
 * does. SparQ's K^T scans (logits, the fused blockwise exp, the scaled
 * group sum) are here too; a Q8_0 cache and the top-k selection run the
 * reference kernels (the table at the end says which).
 *
 * A cache row is read once per group: its f16 elements are widened in
 * chunks of ROW_CHUNK into a buffer on the stack that every head of the
 * group then uses. Element counts go to kv->meter as the reference counts
 * them.
 */
#include "attn/attn_kernels.h"
#include "attn/attn_exp.h"
#include "util/cpu.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

enum { ROW_CHUNK = 256, HEADS = 16, WBLOCK = 64 };

/* e^x for x <= 0 (attn_avx512.h's exp_neg): x = n ln2 + t, e^t by the
 * degree-5 polynomial, times 2^n built in the exponent bits; exactly 0
 * below ATTN_EXP_MIN, where 2^n would leave the normal range. */
static inline float32x4_t exp_neg4(float32x4_t x)
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
    /* n in [-126, 0] here (and a little above 0 for x > 0, still exact) */
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(r), normal));
}

/* e^x of one value, the same polynomial (the tails of the vector loops) */
static inline float exp_neg1(float x) { return vgetq_lane_f32(exp_neg4(vdupq_n_f32(x)), 0); }

static inline float max_of(const float *x, int64_t n)
{
    float32x4_t m = vdupq_n_f32(-INFINITY);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxq_f32(m, vld1q_f32(x + i));
    float r = vmaxvq_f32(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* Elements [c, c + m) of a cache row as f32: in place for f32, widened
 * into buf for f16. */
static inline const float *row_f32(const void *base, int elem, int d, int64_t row, int64_t c, int64_t m,
                                   float *buf)
{
    if (elem == KV_F32) return (const float *)base + row * d + c;
    const uint16_t *h = (const uint16_t *)base + row * d + c;
    int64_t j = 0;
    for (; j + 4 <= m; j += 4) vst1q_f32(buf + j, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + j))));
    for (; j < m; j++) buf[j] = fp16_to_fp32(h[j]);
    return buf;
}

static inline float dot(const float *a, const float *b, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(a + j), vld1q_f32(b + j));
        a1 = vfmaq_f32(a1, vld1q_f32(a + j + 4), vld1q_f32(b + j + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(a + j + 8), vld1q_f32(b + j + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(a + j + 12), vld1q_f32(b + j + 12));
    }
    for (; j + 4 <= n; j += 4) a0 = vfmaq_f32(a0, vld1q_f32(a + j), vld1q_f32(b + j));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3)));
    for (; j < n; j++) s = fmaf(a[j], b[j], s);
    return s;
}

/* y += a * x */
static inline void axpy(float *y, float a, const float *x, int64_t n)
{
    const float32x4_t va = vdupq_n_f32(a);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) vst1q_f32(y + j, vfmaq_f32(vld1q_f32(y + j), vld1q_f32(x + j), va));
    for (; j < n; j++) y[j] = fmaf(x[j], a, y[j]);
}

void NEON_TWIN(attn_scores)(const attn_kv_view *kv, const float *q, int g, const int32_t *rows, int64_t n,
                            float *s)
{
    if (kv->elem != KV_F32 && kv->elem != KV_F16) {
        attn_scores_ref(kv, q, g, rows, n, s);
        return;
    }
    const int d = kv->d;
    const float scale = 1.0f / sqrtf((float)d);
    float buf[ROW_CHUNK];
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = rows ? rows[i] : i;
        for (int h = 0; h < g; h++) s[h * n + i] = 0.0f;
        for (int64_t c = 0; c < d; c += ROW_CHUNK) {
            const int64_t m = d - c < ROW_CHUNK ? d - c : ROW_CHUNK;
            const float *k = row_f32(kv->K, kv->elem, d, row, c, m, buf);
            for (int h = 0; h < g; h++) s[h * n + i] += dot(q + (int64_t)h * d + c, k, m);
        }
        for (int h = 0; h < g; h++) s[h * n + i] *= scale;
    }
    if (kv->meter) kv->meter->k += n * d;
}

/* One head: x = e^(x - max) in place; returns the sum, in double. */
static double exp_row(float *x, int64_t n)
{
    const float mx = max_of(x, n);
    const float32x4_t vm = vdupq_n_f32(mx);
    float64x2_t z = vdupq_n_f64(0.0);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp_neg4(vsubq_f32(vld1q_f32(x + i), vm));
        vst1q_f32(x + i, e);
        z = vaddq_f64(z, vaddq_f64(vcvt_f64_f32(vget_low_f32(e)), vcvt_high_f64_f32(e)));
    }
    double sum = vaddvq_f64(z);
    for (; i < n; i++) sum += (x[i] = exp_neg1(x[i] - mx));
    return sum;
}

void NEON_TWIN(attn_softmax)(float *s, int g, int64_t n)
{
    for (int h = 0; h < g; h++) {
        float *x = s + h * n;
        const float inv = (float)(1.0 / exp_row(x, n));
        const float32x4_t vi = vdupq_n_f32(inv);
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_f32(vld1q_f32(x + i), vi));
        for (; i < n; i++) x[i] *= inv;
    }
}

void NEON_TWIN(attn_weighted_sum)(const attn_kv_view *kv, const float *w, int g, const int32_t *rows, int64_t n,
                                  float *out)
{
    if (kv->elem != KV_F32 && kv->elem != KV_F16) {
        attn_weighted_sum_ref(kv, w, g, rows, n, out);
        return;
    }
    const int d = kv->d;
    float buf[ROW_CHUNK];
    memset(out, 0, (size_t)g * d * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = rows ? rows[i] : i;
        for (int64_t c = 0; c < d; c += ROW_CHUNK) {
            const int64_t m = d - c < ROW_CHUNK ? d - c : ROW_CHUNK;
            const float *v = row_f32(kv->V, kv->elem, d, row, c, m, buf);
            for (int h = 0; h < g; h++) axpy(out + (int64_t)h * d + c, w[h * n + i], v, m);
        }
    }
    if (kv->meter) kv->meter->v += n * d;
}

/* Heads [h0, h0 + hn) (hn <= HEADS): per block of WBLOCK positions their
 * e^(s - max) into a stack buffer, each V row then widened once for all
 * of them; out scaled by 1 / sum at the end. */
static void smws_heads(const attn_kv_view *kv, const float *s, int h0, int hn, const int32_t *rows, int64_t n,
                       float *out, float *lse)
{
    const int d = kv->d;
    float mx[HEADS], w[HEADS][WBLOCK], buf[ROW_CHUNK];
    double z[HEADS];
    for (int h = 0; h < hn; h++) {
        mx[h] = max_of(s + (int64_t)(h0 + h) * n, n);
        z[h] = 0.0;
    }
    for (int64_t b0 = 0; b0 < n; b0 += WBLOCK) {
        const int64_t bn = n - b0 < WBLOCK ? n - b0 : WBLOCK;
        for (int h = 0; h < hn; h++) {
            const float *x = s + (int64_t)(h0 + h) * n + b0;
            const float32x4_t vm = vdupq_n_f32(mx[h]);
            float64x2_t zz = vdupq_n_f64(0.0);
            int64_t i = 0;
            for (; i + 4 <= bn; i += 4) {
                const float32x4_t e = exp_neg4(vsubq_f32(vld1q_f32(x + i), vm));
                vst1q_f32(w[h] + i, e);
                zz = vaddq_f64(zz, vaddq_f64(vcvt_f64_f32(vget_low_f32(e)), vcvt_high_f64_f32(e)));
            }
            z[h] += vaddvq_f64(zz);
            for (; i < bn; i++) z[h] += (w[h][i] = exp_neg1(x[i] - mx[h]));
        }
        for (int64_t i = 0; i < bn; i++) {
            const int64_t row = rows ? rows[b0 + i] : b0 + i;
            for (int64_t c = 0; c < d; c += ROW_CHUNK) {
                const int64_t m = d - c < ROW_CHUNK ? d - c : ROW_CHUNK;
                const float *v = row_f32(kv->V, kv->elem, d, row, c, m, buf);
                for (int h = 0; h < hn; h++) axpy(out + (int64_t)(h0 + h) * d + c, w[h][i], v, m);
            }
        }
    }
    for (int h = 0; h < hn; h++) {
        if (lse) lse[h0 + h] = mx[h] + (float)log(z[h]);
        const float inv = (float)(1.0 / z[h]);
        float *o = out + (int64_t)(h0 + h) * d;
        for (int j = 0; j < d; j++) o[j] *= inv;
    }
}

void NEON_TWIN(attn_softmax_weighted_sum)(const attn_kv_view *kv, const float *s, int g, const int32_t *rows,
                                          int64_t n, float *out, float *lse)
{
    if (kv->elem != KV_F32 && kv->elem != KV_F16) {
        attn_softmax_weighted_sum_ref(kv, s, g, rows, n, out, lse);
        return;
    }
    memset(out, 0, (size_t)g * kv->d * sizeof *out);
    for (int h0 = 0; h0 < g; h0 += HEADS) smws_heads(kv, s, h0, g - h0 < HEADS ? g - h0 : HEADS, rows, n, out, lse);
    if (kv->meter) kv->meter->v += n * kv->d; /* the group's heads share the rows */
}

void NEON_TWIN(attn_gather_group)(const attn_kv_view *kv, const float *q, int g, const int32_t *sel, int64_t n_sel,
                                  float *out, float *scratch, float *lse)
{
    if (n_sel <= 0) {
        attn_gather_none(g, kv->d, out, lse);
        return;
    }
    NEON_TWIN(attn_scores)(kv, q, g, sel, n_sel, scratch);
    NEON_TWIN(attn_softmax_weighted_sum)(kv, scratch, g, sel, n_sel, out, lse);
}

/* ---- SparQ's K^T scans ---------------------------------------------------- */

/* s[h*n + i] = sum_c qs[h*r + c] KT[comp[c]][i]: per block of KBLOCK
 * positions, each component's K^T run widened once and added into every
 * head's block of s (which stays in L1), components in the reference's
 * order (products added unfused, as it does). */
enum { KBLOCK = 64 };

static void kt_logits_f(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g, int64_t n,
                        float *s)
{
    float buf[KBLOCK];
    memset(s, 0, (size_t)g * n * sizeof *s);
    for (int64_t b0 = 0, bn; b0 < n; b0 += bn) {
        bn = n - b0 < KBLOCK ? n - b0 : KBLOCK;
        if (kv->KT_tail && b0 < kv->kt_split && b0 + bn > kv->kt_split) bn = kv->kt_split - b0; /* not across */
        for (int c = 0; c < r; c++) {
            int64_t col;
            const void *row = attn_kt_row(kv, comp[c], b0, &col);
            const float *k = row_f32(row, kv->elem, 0, 0, col, bn, buf);
            for (int h = 0; h < g; h++) {
                const float32x4_t w = vdupq_n_f32(qs[h * r + c]);
                float *o = s + h * n + b0;
                int64_t i = 0;
                for (; i + 4 <= bn; i += 4) vst1q_f32(o + i, vaddq_f32(vld1q_f32(o + i), vmulq_f32(w, vld1q_f32(k + i))));
                for (; i < bn; i++) {
                    const float p = qs[h * r + c] * k[i];
                    o[i] += p;
                }
            }
        }
    }
    if (kv->meter) kv->meter->kt += n * r;
}

void NEON_TWIN(attn_kt_logits)(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                               int64_t n, float *s)
{
    if (kv->elem != KV_F32 && kv->elem != KV_F16) attn_kt_logits_ref(kv, qs, comp, r, g, n, s);
    else kt_logits_f(kv, qs, comp, r, g, n, s);
}

static inline float32x4_t score_flush4(float32x4_t x)
{
    const uint32x4_t keep = vcgeq_f32(x, vdupq_n_f32(ATTN_SCORE_MIN));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(x), keep));
}

void NEON_TWIN(attn_kt_exp)(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g, int64_t n,
                            float *e, float *scale, float *lsum)
{
    if (kv->elem != KV_F32 && kv->elem != KV_F16) {
        attn_kt_exp_ref(kv, qs, comp, r, g, n, e, scale, lsum);
        return;
    }
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    kt_logits_f(kv, qs, comp, r, g, n, e); /* logits, exponentiated in place below */
    if (lsum) {
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            float32x4_t a = vdupq_n_f32(0.0f);
            for (int h = 0; h < g; h++) a = vaddq_f32(a, vld1q_f32(e + h * n + i));
            vst1q_f32(lsum + i, a);
        }
        for (; i < n; i++) {
            float a = 0;
            for (int h = 0; h < g; h++) a += e[h * n + i];
            lsum[i] = a;
        }
    }
    for (int h = 0; h < g; h++) {
        float *x = e + h * n, *sc = scale + h * nb, m = -INFINITY;
        for (int64_t b = 0; b < nb; b++) { /* running block maxima, kept in scale for now */
            const int64_t at = b * ATTN_EXP_BLOCK, len = n - at < ATTN_EXP_BLOCK ? n - at : ATTN_EXP_BLOCK;
            const float bm = max_of(x + at, len);
            m = bm > m ? bm : m;
            sc[b] = m;
        }
        float64x2_t zz = vdupq_n_f64(0.0);
        double z = 0;
        for (int64_t b = 0; b < nb; b++) {
            const int64_t at = b * ATTN_EXP_BLOCK, len = n - at < ATTN_EXP_BLOCK ? n - at : ATTN_EXP_BLOCK;
            const float32x4_t vm = vdupq_n_f32(m), vb = vdupq_n_f32(sc[b]);
            int64_t i = at;
            for (; i + 4 <= at + len; i += 4) {
                const float32x4_t v = vld1q_f32(x + i), p = exp_neg4(vsubq_f32(v, vm));
                zz = vaddq_f64(zz, vaddq_f64(vcvt_f64_f32(vget_low_f32(p)), vcvt_high_f64_f32(p)));
                vst1q_f32(x + i, score_flush4(exp_neg4(vsubq_f32(v, vb))));
            }
            for (; i < at + len; i++) {
                z += exp_neg1(x[i] - m);
                x[i] = attn_score_flush(exp_neg1(x[i] - sc[b]));
            }
        }
        z += vaddvq_f64(zz);
        for (int64_t b = 0; b < nb; b++) sc[b] = attn_score_flush((float)(expf(sc[b] - m) / z));
    }
}

void NEON_TWIN(attn_scaled_head_sum)(const float *e, const float *scale, int g, int64_t n, int64_t m, float *out)
{
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    memset(out, 0, (size_t)m * sizeof *out);
    for (int64_t b = 0; b * ATTN_EXP_BLOCK < m; b++) {
        const int64_t at = b * ATTN_EXP_BLOCK, end = m - at < ATTN_EXP_BLOCK ? m : at + ATTN_EXP_BLOCK;
        for (int h = 0; h < g; h++) { /* heads in order, products added unfused: the reference's sums */
            const float sc = scale[h * nb + b];
            const float32x4_t vs = vdupq_n_f32(sc);
            const float *x = e + h * n;
            int64_t i = at;
            for (; i + 4 <= end; i += 4) vst1q_f32(out + i, vaddq_f32(vld1q_f32(out + i), vmulq_f32(vs, vld1q_f32(x + i))));
            for (; i < end; i++) {
                const float p = sc * x[i];
                out[i] += p;
            }
        }
    }
}

const attn_kernels NEON_TWIN(attn_kernels) = {
    attn_topk_filter_ref, NEON_TWIN(attn_scores), NEON_TWIN(attn_softmax), NEON_TWIN(attn_weighted_sum),
    NEON_TWIN(attn_kt_logits), NEON_TWIN(attn_softmax_weighted_sum), NEON_TWIN(attn_kt_exp),
    NEON_TWIN(attn_scaled_head_sum),
    attn_topk_kth_key_ref, attn_topk_above_ref, attn_topk_partition_ref, NEON_TWIN(attn_gather_group),
};

#else
typedef int attn_kernels_neon_unused; /* ISO C forbids an empty translation unit */
#endif /* __aarch64__ */
