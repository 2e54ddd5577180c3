/* quant_ref.c - plain-C reference kernels: dequantise, quantise, dot.
 *
 * Map: element maps (to_float) | activation quantisers (Q8_0, Q8_1, Q8_K)
 * | weight quantisers (Q4_0, Q4_K, Q6_K) | dot products | f32/f16 helpers
 * | the _ref entry points (type switches).
 *
 * These are the specification the SIMD twins must reproduce bit for bit:
 * every float operation here is in the order ggml's x86 build performs it
 * (see quant_impl.h for the three accumulation schemes), and the products
 * that ggml's compiler contracts into an FMA are written as fmaf().
 */
#include "tensor/quant_impl.h"

#include <assert.h>
#include <float.h>

static inline float h2f(uint16_t h) { return fp16_to_fp32(h); }

/* Round to nearest, ties to even (what ggml's nearest_int and the x86
 * _mm256_round_ps(_MM_ROUND_NEAREST) both do). */
static inline int round_ne(float f) { return (int)rintf(f); }

/* ---------------------------------------------------------------- dequantise */

static void deq_q8_0(const blk_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d);
        for (int j = 0; j < QK; j++) y[i * QK + j] = b[i].qs[j] * d;
    }
}

static void deq_q8_1(const blk_q8_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d);
        for (int j = 0; j < QK; j++) y[i * QK + j] = b[i].qs[j] * d;
    }
}

static void deq_q4_0(const blk_q4_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = ((b[i].qs[j] & 0xF) - 8) * d;
            y[i * QK + j + QK / 2] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const blk_q4_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = fmaf((float)(b[i].qs[j] & 0xF), d, m);
            y[i * QK + j + QK / 2] = fmaf((float)(b[i].qs[j] >> 4), d, m);
        }
    }
}

static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void deq_q5_0(const blk_q5_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d);
        uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < QK / 2; j++) {
            int q0 = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[i * QK + j] = (q0 - 16) * d;
            y[i * QK + j + QK / 2] = (q1 - 16) * d;
        }
    }
}

static void deq_q5_1(const blk_q5_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d), m = h2f(b[i].m);
        uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < QK / 2; j++) {
            int q0 = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[i * QK + j] = fmaf((float)q0, d, m);
            y[i * QK + j + QK / 2] = fmaf((float)q1, d, m);
        }
    }
}

/* The K-quant element maps below are written per element (e = 0..255) so
 * they read like the layout comments in quant_impl.h. */

static inline int q2k_q(const blk_q2_K *b, int e)
{
    return (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

static void deq_q2_K(const blk_q2_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int g = 0; g < 16; g++) {
            float dl = d * (b[i].scales[g] & 0xF), ml = dmin * (b[i].scales[g] >> 4);
            for (int e = 16 * g; e < 16 * g + 16; e++) y[e] = fmaf(dl, (float)q2k_q(&b[i], e), -ml);
        }
    }
}

static inline int q3k_q(const blk_q3_K *b, int e)
{
    int lo = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    int hi = (b->hmask[e % 32] >> (e / 32)) & 1;
    return lo - (hi ? 0 : 4);
}

static void deq_q3_K(const blk_q3_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d);
        for (int g = 0; g < 16; g++) {
            float dl = d * quant_q3k_scale(b[i].scales, g);
            for (int e = 16 * g; e < 16 * g + 16; e++) y[e] = dl * q3k_q(&b[i], e);
        }
    }
}

static inline int q4k_q(const uint8_t *qs, int e)
{
    uint8_t v = qs[32 * (e / 64) + e % 32];
    return (e % 64) < 32 ? (v & 0xF) : (v >> 4);
}

static void deq_q4_K(const blk_q4_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            quant_k4_scale_min(b[i].scales, j, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            for (int e = 32 * j; e < 32 * j + 32; e++) y[e] = fmaf(d1, (float)q4k_q(b[i].qs, e), -m1);
        }
    }
}

static inline int q5k_q(const blk_q5_K *b, int e)
{
    return q4k_q(b->qs, e) + 16 * ((b->qh[e % 32] >> (e / 32)) & 1);
}

static void deq_q5_K(const blk_q5_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            quant_k4_scale_min(b[i].scales, j, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            for (int e = 32 * j; e < 32 * j + 32; e++) y[e] = fmaf(d1, (float)q5k_q(&b[i], e), -m1);
        }
    }
}

/* Q6_K element e: half h = e/128, quarter s = (e%128)/32, l = e%32; low
 * nibble from ql[64h + l + 32*(s&1)] (high nibble when s >= 2), two high
 * bits from qh[32h + l] bits 2s..2s+1; unsigned 0..63 (subtract 32). */
static inline int q6k_u(const blk_q6_K *b, int e)
{
    int h = e / 128, s = (e % 128) / 32, l = e % 32;
    uint8_t lo = b->ql[64 * h + l + 32 * (s & 1)];
    int q = s >= 2 ? (lo >> 4) : (lo & 0xF);
    return q | (((b->qh[32 * h + l] >> (2 * s)) & 3) << 4);
}

static void deq_q6_K(const blk_q6_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d);
        for (int e = 0; e < QKK; e++) y[e] = d * b[i].scales[e / 16] * (q6k_u(&b[i], e) - 32);
    }
}

static void deq_iq4_nl(const blk_iq4_nl *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK) {
        float d = h2f(b[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * quant_iq4nl_values[b[i].qs[j] & 0xF];
            y[j + QK / 2] = d * quant_iq4nl_values[b[i].qs[j] >> 4];
        }
    }
}

/* IQ4_XS element e: sub-block ib = e/32, nibble of qs[16ib + e%16], low
 * for e%32 < 16; the sub-block's float scale is rounded once, then times
 * the table value (ggml's order, so get_rows rows match bit for bit). */
static inline int iq4xs_q(const blk_iq4_xs *b, int e)
{
    uint8_t v = b->qs[16 * (e / 32) + e % 16];
    return quant_iq4nl_values[(e % 32) < 16 ? (v & 0xF) : (v >> 4)];
}

static void deq_iq4_xs(const blk_iq4_xs *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d);
        for (int ib = 0; ib < QKK / 32; ib++) {
            float dl = d * (float)quant_iq4xs_scale(&b[i], ib);
            for (int e = 32 * ib; e < 32 * ib + 32; e++) y[e] = dl * (float)iq4xs_q(&b[i], e);
        }
    }
}

static void deq_q8_K(const blk_q8_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; j < QKK; j++) y[i * QKK + j] = b[i].d * b[i].qs[j];
}

/* ------------------------------------------------- activation quantisers */

/* Q8_0 as ggml's x86 quantize_row_q8_0 (the activation path llama.cpp runs
 * on AVX hardware): multiplier 127/amax, round half to even. (ggml's scalar
 * reference uses 1/d and roundf instead; the two differ on rare ties.) */
static void quant_q8_0(const float *x, blk_q8_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)round_ne(x[j] * id);
    }
}

/* Q8_1: Q8_0 plus s = d * sum(q) (d before its f16 rounding). */
static void quant_q8_1(const float *x, blk_q8_1 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            y[i].qs[j] = (int8_t)round_ne(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = fp32_to_fp16(d);
        y[i].s = fp32_to_fp16(d * (float)sum);
    }
}

/* Q8_K as ggml's quantize_row_q8_K_ref (also its x86 path): scale from the
 * signed value of largest magnitude, -127/max, nearest-even. */
static void quant_q8_K(const float *x, blk_q8_K *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QKK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QKK; j++) {
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float iscale = -127.f / max;
        for (int j = 0; j < QKK; j++) {
            int v = round_ne(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ----------------------------------------------------- weight quantisers */

/* Q4_0 exactly as ggml's reference (what llama-quantize writes without an
 * importance matrix): d = max/-8 from the signed extreme, truncating +8.5. */
static void quant_q4_0(const float *x, blk_q4_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++) {
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        }
        float d = max / -8, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK / 2; j++) {
            /* product and offset as separate statements, so no compiler
             * fuses them (ggml's reference is built without FMA) */
            float v0 = x[j] * id, v1 = x[j + QK / 2] * id;
            int q0 = (int)(v0 + 8.5f), q1 = (int)(v1 + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Least-squares group fits for the K-quant writers (our own search, not
 * ggml's make_qkx2_quants: llama-quantize output is not reproduced byte for
 * byte, only its quality). Each tries 21 quantisation grids around the
 * natural one and keeps the least-squares refit with the smallest squared
 * error. */

/* x ~= a * L - m with L in 0..nmax and m >= 0; returns a, sets *m. */
static float fit_group_asym(const float *x, int n, int nmax, float *m_out)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    if (lo > 0.0f) lo = 0.0f;
    if (hi <= lo) {
        *m_out = -lo;
        return 0.0f;
    }
    float best_a = (hi - lo) / nmax, best_b = lo;
    double best_err = INFINITY;
    for (int k = -10; k <= 10; k++) {
        float iscale = (nmax + 0.1f * k) / (hi - lo);
        double sl = 0, sll = 0, sx = 0, sxl = 0;
        int L[QKK];
        for (int i = 0; i < n; i++) {
            L[i] = clampi(round_ne((x[i] - lo) * iscale), 0, nmax);
            sl += L[i];
            sll += (double)L[i] * L[i];
            sx += x[i];
            sxl += (double)x[i] * L[i];
        }
        double det = n * sll - sl * sl;
        if (det <= 0) continue;
        double a = (n * sxl - sx * sl) / det, b = (sx - a * sl) / n;
        if (b > 0) { /* the offset may only pull down */
            b = 0;
            a = sxl / sll;
        }
        if (a <= 0) continue;
        double err = 0;
        for (int i = 0; i < n; i++) {
            double e = x[i] - a * L[i] - b;
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_a = (float)a;
            best_b = (float)b;
        }
    }
    *m_out = -best_b;
    return best_a;
}

/* x ~= s * L with L in -nmax..nmax-1; s carries the sign that maps the
 * extreme element to -nmax. */
static float fit_group_sym(const float *x, int n, int nmax)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax == 0.0f) return 0.0f;
    float best = max / -nmax;
    double best_err = INFINITY;
    for (int k = -10; k <= 10; k++) {
        float iscale = -(nmax + 0.1f * k) / max;
        double sll = 0, sxl = 0;
        int L[QKK];
        for (int i = 0; i < n; i++) {
            L[i] = clampi(round_ne(x[i] * iscale), -nmax, nmax - 1);
            sll += (double)L[i] * L[i];
            sxl += (double)x[i] * L[i];
        }
        if (sll == 0) continue;
        double sc = sxl / sll, err = 0;
        for (int i = 0; i < n; i++) {
            double e = x[i] - sc * L[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best = (float)sc;
        }
    }
    return best;
}

/* Q4_K writer: per group of 32 a least-squares (scale, min) fit, the
 * super-scales map the largest group scale/min to 63, and every quant is
 * re-derived from the rounded scales. */
static void quant_q4_K(const float *x, blk_q4_K *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QKK) {
        float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            scale[j] = fit_group_asym(x + 32 * j, 32, 15, &mins[j]);
            max_scale = scale[j] > max_scale ? scale[j] : max_scale;
            max_min = mins[j] > max_min ? mins[j] : max_min;
        }
        float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.0f;
        float inv_min = max_min > 0 ? 63.f / max_min : 0.0f;
        memset(y[i].scales, 0, sizeof(y[i].scales));
        for (int j = 0; j < 8; j++) {
            int ls = clampi(round_ne(inv_scale * scale[j]), 0, 63);
            int lm = clampi(round_ne(inv_min * mins[j]), 0, 63);
            if (j < 4) {
                y[i].scales[j] |= (uint8_t)ls;
                y[i].scales[j + 4] |= (uint8_t)lm;
            } else {
                y[i].scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
                y[i].scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
                y[i].scales[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        y[i].d = fp32_to_fp16(max_scale / 63.f);
        y[i].dmin = fp32_to_fp16(max_min / 63.f);
        float d = h2f(y[i].d), dmin = h2f(y[i].dmin);
        uint8_t L[QKK];
        for (int j = 0; j < 8; j++) {
            int sc, m;
            quant_k4_scale_min(y[i].scales, j, &sc, &m);
            float dj = d * sc, mj = dmin * m;
            for (int l = 0; l < 32; l++)
                L[32 * j + l] = dj != 0.0f ? (uint8_t)clampi(round_ne((x[32 * j + l] + mj) / dj), 0, 15) : 0;
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

/* Q6_K writer: per group of 16 a least-squares symmetric fit, the
 * super-scale maps the largest group scale to -128, quants re-derived from
 * the rounded scales. */
static void quant_q6_K(const float *x, blk_q6_K *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QKK) {
        float scale[16], max_scale = 0.0f, max_abs = 0.0f;
        for (int g = 0; g < 16; g++) {
            scale[g] = fit_group_sym(x + 16 * g, 16, 32);
            if (fabsf(scale[g]) > max_abs) { max_abs = fabsf(scale[g]); max_scale = scale[g]; }
        }
        memset(&y[i], 0, sizeof(y[i]));
        if (max_abs == 0.0f) continue;
        float iscale = -128.f / max_scale;
        y[i].d = fp32_to_fp16(1 / iscale);
        for (int g = 0; g < 16; g++) y[i].scales[g] = (int8_t)clampi(round_ne(iscale * scale[g]), -128, 127);
        float d = h2f(y[i].d);
        uint8_t L[QKK];
        for (int e = 0; e < QKK; e++) {
            float dg = d * y[i].scales[e / 16];
            L[e] = (uint8_t)(dg != 0.0f ? clampi(round_ne(x[e] / dg), -32, 31) + 32 : 32);
        }
        for (int e = 0; e < QKK; e++) {
            int h = e / 128, s = (e % 128) / 32, l = e % 32;
            uint8_t *lo = &y[i].ql[64 * h + l + 32 * (s & 1)];
            *lo |= (uint8_t)(s >= 2 ? (L[e] & 0xF) << 4 : (L[e] & 0xF));
            y[i].qh[32 * h + l] |= (uint8_t)((L[e] >> 4) << (2 * s));
        }
    }
}

/* ---------------------------------------------------------- dot products */

/* LANES8 (quant_impl.h): lane k of a 32-element block = elements 4k..4k+3. */
static float dot_q8_0(const blk_q8_0 *w, const blk_q8_0 *x, int64_t nb)
{
    float acc[8] = { 0 };
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(w[i].d) * h2f(x[i].d);
        for (int k = 0; k < 8; k++) {
            int p = 0;
            for (int j = 4 * k; j < 4 * k + 4; j++) p += w[i].qs[j] * x[i].qs[j];
            acc[k] = fmaf(d, (float)p, acc[k]);
        }
    }
    return quant_hsum8(acc);
}

static float dot_q5_0(const blk_q5_0 *w, const blk_q8_0 *x, int64_t nb)
{
    float acc[8] = { 0 };
    int8_t q[QK];
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh = load_u32(w[i].qh);
        for (int j = 0; j < QK / 2; j++) {
            q[j] = (int8_t)(((w[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
            q[j + 16] = (int8_t)(((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
        float d = h2f(w[i].d) * h2f(x[i].d);
        for (int k = 0; k < 8; k++) {
            int p = 0;
            for (int j = 4 * k; j < 4 * k + 4; j++) p += q[j] * x[i].qs[j];
            acc[k] = fmaf(d, (float)p, acc[k]);
        }
    }
    return quant_hsum8(acc);
}

static float dot_q4_1(const blk_q4_1 *w, const blk_q8_1 *x, int64_t nb)
{
    float acc[8] = { 0 }, summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(w[i].d) * h2f(x[i].d);
        summs = fmaf(h2f(w[i].m), h2f(x[i].s), summs);
        for (int k = 0; k < 8; k++) {
            int p = 0;
            for (int j = 4 * k; j < 4 * k + 4; j++) {
                int q = j < 16 ? (w[i].qs[j] & 0xF) : (w[i].qs[j - 16] >> 4);
                p += q * x[i].qs[j];
            }
            acc[k] = fmaf(d, (float)p, acc[k]);
        }
    }
    return quant_hsum8(acc) + summs;
}

static float dot_q5_1(const blk_q5_1 *w, const blk_q8_1 *x, int64_t nb)
{
    float acc[8] = { 0 }, summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(w[i].d) * h2f(x[i].d);
        summs = fmaf(h2f(w[i].m), h2f(x[i].s), summs);
        uint32_t qh = load_u32(w[i].qh);
        for (int k = 0; k < 8; k++) {
            int p = 0;
            for (int j = 4 * k; j < 4 * k + 4; j++) {
                int q = (j < 16 ? (w[i].qs[j] & 0xF) : (w[i].qs[j - 16] >> 4)) | (((qh >> j) & 1) << 4);
                p += q * x[i].qs[j];
            }
            acc[k] = fmaf(d, (float)p, acc[k]);
        }
    }
    return quant_hsum8(acc) + summs;
}

/* ROW1: one integer sum per block, one float accumulator. */
static float dot_q4_0(const blk_q4_0 *w, const blk_q8_0 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK / 2; j++) {
            isum += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j];
            isum += ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
        }
        acc = fmaf((float)isum, h2f(w[i].d) * h2f(x[i].d), acc);
    }
    return acc;
}

/* IQ4_NL: ROW1 like Q4_0 (llama.cpp repacks it into the same 8-row
 * kernels on AVX2/AVX-512). */
static float dot_iq4_nl(const blk_iq4_nl *w, const blk_q8_0 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK / 2; j++) {
            isum += quant_iq4nl_values[w[i].qs[j] & 0xF] * x[i].qs[j];
            isum += quant_iq4nl_values[w[i].qs[j] >> 4] * x[i].qs[j + 16];
        }
        acc = fmaf((float)isum, h2f(w[i].d) * h2f(x[i].d), acc);
    }
    return acc;
}

static float dot_q4_K(const blk_q4_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0, imin = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, s = 0;
            quant_k4_scale_min(w[i].scales, j, &sc, &m);
            for (int e = 32 * j; e < 32 * j + 32; e++) s += q4k_q(w[i].qs, e) * x[i].qs[e];
            isum += sc * s;
            imin += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        acc = fmaf((float)isum, h2f(w[i].d) * x[i].d, acc);
        accm = fmaf((float)imin, h2f(w[i].dmin) * x[i].d, accm);
    }
    return acc - accm;
}

static float dot_q2_K(const blk_q2_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0, imin = 0;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) s += q2k_q(&w[i], e) * x[i].qs[e];
            isum += (w[i].scales[g] & 0xF) * s;
            imin += (w[i].scales[g] >> 4) * x[i].bsums[g];
        }
        acc = fmaf((float)isum, h2f(w[i].d) * x[i].d, acc);
        accm = fmaf((float)imin, h2f(w[i].dmin) * x[i].d, accm);
    }
    return acc - accm;
}

/* LANES8 over a super-block: lane (e % 32) / 4 gathers its elements from all
 * eight 32-element chunks, each times the scale of its group. */
static float dot_q3_K(const blk_q3_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc[8] = { 0 };
    for (int64_t i = 0; i < nb; i++) {
        int lane[8] = { 0 };
        for (int e = 0; e < QKK; e++)
            lane[(e % 32) / 4] += quant_q3k_scale(w[i].scales, e / 16) * q3k_q(&w[i], e) * x[i].qs[e];
        float d = x[i].d * h2f(w[i].d);
        for (int k = 0; k < 8; k++) acc[k] = fmaf(d, (float)lane[k], acc[k]);
    }
    return quant_hsum8(acc);
}

static float dot_q5_K(const blk_q5_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc[8] = { 0 }, summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int lane[8] = { 0 }, sc[8], m[8], imin = 0;
        for (int j = 0; j < 8; j++) {
            quant_k4_scale_min(w[i].scales, j, &sc[j], &m[j]);
            imin += m[j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        for (int e = 0; e < QKK; e++) lane[(e % 32) / 4] += sc[e / 32] * q5k_q(&w[i], e) * x[i].qs[e];
        float d = x[i].d * h2f(w[i].d), dmin = -x[i].d * h2f(w[i].dmin);
        summs = fmaf(dmin, (float)imin, summs);
        for (int k = 0; k < 8; k++) acc[k] = fmaf(d, (float)lane[k], acc[k]);
    }
    return quant_hsum8(acc) + summs;
}

/* Q6_K: the quants enter unsigned (0..63); lane k then subtracts
 * 32 * (scale * bsum) of groups 2k and 2k+1, as ggml's kernel does. */
static float dot_q6_K(const blk_q6_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc[8] = { 0 };
    for (int64_t i = 0; i < nb; i++) {
        int lane[8] = { 0 };
        for (int e = 0; e < QKK; e++) lane[(e % 32) / 4] += w[i].scales[e / 16] * q6k_u(&w[i], e) * x[i].qs[e];
        for (int k = 0; k < 8; k++)
            lane[k] -= 32 * (x[i].bsums[2 * k] * w[i].scales[2 * k] + x[i].bsums[2 * k + 1] * w[i].scales[2 * k + 1]);
        float d = x[i].d * h2f(w[i].d);
        for (int k = 0; k < 8; k++) acc[k] = fmaf(d, (float)lane[k], acc[k]);
    }
    return quant_hsum8(acc);
}

/* IQ4_XS: LANES8 over the super-block (llama.cpp does not repack it):
 * lane (e % 32) / 4 sums scale(e/32) * value * x over all sub-blocks. */
static float dot_iq4_xs(const blk_iq4_xs *w, const blk_q8_K *x, int64_t nb)
{
    float acc[8] = { 0 };
    for (int64_t i = 0; i < nb; i++) {
        int lane[8] = { 0 };
        for (int e = 0; e < QKK; e++)
            lane[(e % 32) / 4] += quant_iq4xs_scale(&w[i], e / 32) * iq4xs_q(&w[i], e) * x[i].qs[e];
        float d = h2f(w[i].d) * x[i].d;
        for (int k = 0; k < 8; k++) acc[k] = fmaf(d, (float)lane[k], acc[k]);
    }
    return quant_hsum8(acc);
}

/* F32x64 (ggml_vec_dot_f32 on AVX-512). */
static float dot_f32_x64(const float *a, const float *b, int64_t n)
{
    float acc[4][16] = { { 0 } };
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) acc[j][l] = fmaf(a[i + 16 * j + l], b[i + 16 * j + l], acc[j][l]);
    for (int l = 0; l < 16; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
        acc[0][l] += acc[1][l];
    }
    float s = quant_hsum16(acc[0]);
    /* leftovers as GCC compiles ggml's `sumf += x[i]*y[i]`: whole groups of
     * 8 as rounded products added in order, the last n % 8 fused */
    int64_t nf = np + ((n - np) & ~(int64_t)7);
    for (int64_t i = np; i < nf; i++) {
        float p = a[i] * b[i]; /* a separate statement: never contracted */
        s += p;
    }
    for (int64_t i = nf; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* F16 x F16: the same order; products of two halves are exact in f32, and
 * ggml adds the leftovers in double. */
static float dot_f16_x64(const uint16_t *a, const uint16_t *b, int64_t n)
{
    float acc[4][16] = { { 0 } };
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++)
                acc[j][l] = fmaf(h2f(a[i + 16 * j + l]), h2f(b[i + 16 * j + l]), acc[j][l]);
    for (int l = 0; l < 16; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
        acc[0][l] += acc[1][l];
    }
    double s = quant_hsum16(acc[0]);
    for (int64_t i = np; i < n; i++) s += (double)(h2f(a[i]) * h2f(b[i]));
    return (float)s;
}

/* vdpbf16ps treats bf16 subnormal inputs and f32 subnormal results as zero. */
static inline float bf16_daz(uint16_t h) { return (h & 0x7f80) == 0 ? 0.0f * bf16_to_fp32(h) : bf16_to_fp32(h); }
static inline float ftz(float f) { return fabsf(f) < FLT_MIN ? 0.0f * f : f; }

/* BF16 x BF16: two accumulators of 16 lanes over steps of 64; lane l of a
 * 32-element half takes elements 2l+1 then 2l (the vdpbf16ps order); the two
 * reductions and the leftovers are summed in double. */
static float dot_bf16_x64(const uint16_t *a, const uint16_t *b, int64_t n)
{
    float c[2][16] = { { 0 } };
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 16; l++) {
                int64_t e = i + 32 * h + 2 * l;
                c[h][l] = ftz(fmaf(bf16_daz(a[e + 1]), bf16_daz(b[e + 1]), c[h][l]));
                c[h][l] = ftz(fmaf(bf16_daz(a[e]), bf16_daz(b[e]), c[h][l]));
            }
    double s = 0.0;
    s += quant_hsum16(c[0]);
    s += quant_hsum16(c[1]);
    for (; i < n; i++) s += (double)(bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]));
    return (float)s;
}

/* ------------------------------------------------------ entry points */

void quant_to_float_ref(uint32_t type, const void *src, float *dst, int64_t n)
{
    const quant_traits *t = quant_traits_of(type);
    assert(t && n % t->block_size == 0);
    int64_t nb = n / t->block_size;
    switch (type) {
    case QT_F32:  memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case QT_F16:  fp16_to_fp32_row_ref(src, dst, n); break;
    case QT_BF16: for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(((const uint16_t *)src)[i]); break;
    case QT_Q8_0: deq_q8_0(src, dst, nb); break;
    case QT_Q8_1: deq_q8_1(src, dst, nb); break;
    case QT_Q4_0: deq_q4_0(src, dst, nb); break;
    case QT_Q4_1: deq_q4_1(src, dst, nb); break;
    case QT_Q5_0: deq_q5_0(src, dst, nb); break;
    case QT_Q5_1: deq_q5_1(src, dst, nb); break;
    case QT_Q2_K: deq_q2_K(src, dst, nb); break;
    case QT_Q3_K: deq_q3_K(src, dst, nb); break;
    case QT_Q4_K: deq_q4_K(src, dst, nb); break;
    case QT_Q5_K: deq_q5_K(src, dst, nb); break;
    case QT_Q6_K: deq_q6_K(src, dst, nb); break;
    case QT_Q8_K: deq_q8_K(src, dst, nb); break;
    case QT_IQ4_NL: deq_iq4_nl(src, dst, nb); break;
    case QT_IQ4_XS: deq_iq4_xs(src, dst, nb); break;
    default: assert(!"quant_to_float: type without kernels"); break;
    }
}

int quant_from_float_ref(uint32_t type, const float *src, void *dst, int64_t n)
{
    const quant_traits *t = quant_traits_of(type);
    if (!t || n < 0 || n % t->block_size != 0) return -1;
    int64_t nb = n / t->block_size;
    switch (type) {
    case QT_F32:  memcpy(dst, src, (size_t)n * sizeof(float)); return 0;
    case QT_F16:  fp32_to_fp16_row_ref(src, dst, n); return 0;
    case QT_BF16: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = fp32_to_bf16(src[i]); return 0;
    case QT_Q8_0: quant_q8_0(src, dst, nb); return 0;
    case QT_Q8_1: quant_q8_1(src, dst, nb); return 0;
    case QT_Q8_K: quant_q8_K(src, dst, nb); return 0;
    case QT_Q4_0: quant_q4_0(src, dst, nb); return 0;
    case QT_Q4_K: quant_q4_K(src, dst, nb); return 0;
    case QT_Q6_K: quant_q6_K(src, dst, nb); return 0;
    default: return -1;
    }
}

float quant_dot_ref(uint32_t type, const void *w, const void *x, int64_t n)
{
    const quant_traits *t = quant_traits_of(type);
    assert(t && n % t->block_size == 0);
    int64_t nb = n / t->block_size;
    switch (type) {
    case QT_F32:  return dot_f32_x64(w, x, n);
    case QT_F16:  return dot_f16_x64(w, x, n);
    case QT_BF16: return dot_bf16_x64(w, x, n);
    case QT_Q8_0: return dot_q8_0(w, x, nb);
    case QT_Q4_0: return dot_q4_0(w, x, nb);
    case QT_Q4_1: return dot_q4_1(w, x, nb);
    case QT_Q5_0: return dot_q5_0(w, x, nb);
    case QT_Q5_1: return dot_q5_1(w, x, nb);
    case QT_Q2_K: return dot_q2_K(w, x, nb);
    case QT_Q3_K: return dot_q3_K(w, x, nb);
    case QT_Q4_K: return dot_q4_K(w, x, nb);
    case QT_Q5_K: return dot_q5_K(w, x, nb);
    case QT_Q6_K: return dot_q6_K(w, x, nb);
    case QT_IQ4_NL: return dot_iq4_nl(w, x, nb);
    case QT_IQ4_XS: return dot_iq4_xs(w, x, nb);
    default: assert(!"quant_dot: type without kernels"); return 0.0f;
    }
}

void quant_dot_rows_ref(uint32_t type, const void *w, size_t w_stride, int nr,
                        const void *x, int64_t n, float *out)
{
    for (int r = 0; r < nr; r++) out[r] = quant_dot_ref(type, (const char *)w + (size_t)r * w_stride, x, n);
}

float dot_f32_ref(const float *a, const float *b, int64_t n) { return dot_f32_x64(a, b, n); }

/* f16 x f32 (attention keys against a float query): the F32x64 order with
 * the f16 operand widened; leftovers fma-accumulated in float. */
float dot_f16_f32_ref(const uint16_t *a, const float *b, int64_t n)
{
    float acc[4][16] = { { 0 } };
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) acc[j][l] = fmaf(h2f(a[i + 16 * j + l]), b[i + 16 * j + l], acc[j][l]);
    for (int l = 0; l < 16; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
        acc[0][l] += acc[1][l];
    }
    float s = quant_hsum16(acc[0]);
    for (int64_t i = np; i < n; i++) s = fmaf(h2f(a[i]), b[i], s);
    return s;
}

void axpy_f32_ref(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(x[i], a, y[i]);
}

void axpy_f16_ref(float *y, float a, const uint16_t *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(h2f(x[i]), a, y[i]);
}

void fp16_to_fp32_row_ref(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(src[i]);
}

void fp32_to_fp16_row_ref(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

const quant_kernels quant_kernels_ref = {
    quant_to_float_ref, quant_from_float_ref, quant_dot_ref, quant_dot_rows_ref,
    dot_f32_ref, dot_f16_f32_ref, axpy_f32_ref, axpy_f16_ref,
    fp16_to_fp32_row_ref, fp32_to_fp16_row_ref,
};
