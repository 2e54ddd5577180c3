/* gemm.c - packing of weights and activations for the prefill tiles, the
 * plain-C reference micro-kernel and the dispatch (gemm.h). The AVX-512
 * micro-kernel is in gemm_avx512.c; it is bit-identical to the reference.
 */
#include "tensor/gemm.h"
#include "tensor/quant_impl.h"

#include <assert.h>
#include <float.h>
#include <string.h>

enum { KIND_NONE = 0, KIND_INT = 1, KIND_F32 = 2, KIND_BF16 = 3 };

static int kind_of(uint32_t type)
{
    switch (type) {
    case QT_Q8_0: case QT_Q4_0: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: return KIND_INT;
    case QT_F32: case QT_F16: return KIND_F32;
    case QT_BF16: return KIND_BF16;
    default: return KIND_NONE;
    }
}

/* Only where the SIMD tiles exist: without them (no AVX-512 build) the
 * plain-C tiles would be slower than quant_dot_rows' AVX2 kernels. */
int gemm_supported(uint32_t type)
{
#if defined(QUANT_SIMD_AVX512)
    return kind_of(type) != KIND_NONE;
#else
    (void)type;
    return 0;
#endif
}

static int64_t pad_to(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* Integer kind: codes [n_pad] | scale per 4 [n_pad/4] f32 | per 16 [ng_pad] f32. */
static int64_t int_npad(int64_t n) { return pad_to(n, GEMM_PAD); }
static int64_t int_ngpad(int64_t n) { return pad_to(int_npad(n) / 16, 16); }

size_t gemm_row_bytes(uint32_t type, int64_t n)
{
    if (kind_of(type) == KIND_F32) return (size_t)pad_to(n, 16) * sizeof(float);
    if (kind_of(type) == KIND_BF16) return (size_t)pad_to(n, 32) * sizeof(uint16_t);
    return (size_t)(2 * int_npad(n) + 4 * int_ngpad(n));
}

size_t gemm_act_bytes(uint32_t type, int64_t n) { return gemm_row_bytes(type, n); }

/* ---- packing ---------------------------------------------------------------- */

/* Scale of the 4-element lanes [e0, e0 + len) and offset of their
 * 16-element groups (len a multiple of 16). */
static inline void fill_scales(float *sw, float *mn, int64_t e0, int len, float scale, float off)
{
    for (int l = 0; l < len / 4; l++) sw[e0 / 4 + l] = scale;
    for (int g = 0; g < len / 16; g++) mn[e0 / 16 + g] = off;
}

/* Block-wise loops (no per-element index arithmetic): packing runs once per
 * batch over every weight, so it must cost little next to the products. */
static void pack_int_row(uint32_t type, const void *src, int64_t n, uint8_t *dst)
{
    const int64_t np = int_npad(n), ngp = int_ngpad(n);
    uint8_t *q = dst;
    float *sw = (float *)(dst + np), *mn = sw + np / 4;
    memset(q + n, 0, (size_t)(np - n)); /* padding: zero codes and scales */
    memset(sw + n / 4, 0, (size_t)(np - n)); /* (np - n) / 4 floats */
    memset(mn + n / 16, 0, (size_t)(ngp - n / 16) * sizeof(float));
    switch (type) {
    case QT_Q8_0: {
        const blk_q8_0 *b = src;
        for (int64_t i = 0; i < n / QK; i++, q += QK) {
            const float d = fp16_to_fp32(b[i].d);
            for (int j = 0; j < QK; j++) q[j] = (uint8_t)(b[i].qs[j] + 128);
            fill_scales(sw, mn, i * QK, QK, d, 128.0f * d);
        }
        break;
    }
    case QT_Q4_0: {
        const blk_q4_0 *b = src;
        for (int64_t i = 0; i < n / QK; i++, q += QK) {
            const float d = fp16_to_fp32(b[i].d);
            for (int j = 0; j < QK / 2; j++) {
                q[j] = b[i].qs[j] & 0xF;
                q[j + QK / 2] = b[i].qs[j] >> 4;
            }
            fill_scales(sw, mn, i * QK, QK, d, 8.0f * d);
        }
        break;
    }
    case QT_Q4_K:
    case QT_Q5_K: {
        const int five = type == QT_Q5_K;
        const uint8_t *base = src;
        const size_t bb = five ? sizeof(blk_q5_K) : sizeof(blk_q4_K);
        for (int64_t i = 0; i < n / QKK; i++) {
            const blk_q4_K *b4 = (const blk_q4_K *)(base + i * bb);
            const blk_q5_K *b5 = (const blk_q5_K *)(base + i * bb);
            const uint16_t dh = five ? b5->d : b4->d, mh = five ? b5->dmin : b4->dmin;
            const uint8_t *scales = five ? b5->scales : b4->scales, *qs = five ? b5->qs : b4->qs;
            const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(mh);
            /* 64 elements per 32 bytes of qs: low nibbles, then high */
            for (int c = 0; c < 4; c++, q += 64) {
                const uint8_t *v = qs + 32 * c;
                for (int l = 0; l < 32; l++) {
                    q[l] = v[l] & 0xF;
                    q[l + 32] = v[l] >> 4;
                }
                if (five)
                    for (int l = 0; l < 32; l++) {
                        q[l] += (uint8_t)(16 * ((b5->qh[l] >> (2 * c)) & 1));
                        q[l + 32] += (uint8_t)(16 * ((b5->qh[l] >> (2 * c + 1)) & 1));
                    }
                for (int j = 2 * c; j < 2 * c + 2; j++) {
                    int sc, m;
                    quant_k4_scale_min(scales, j, &sc, &m);
                    fill_scales(sw, mn, i * QKK + 32 * j, 32, d * (float)sc, dmin * (float)m);
                }
            }
        }
        break;
    }
    case QT_Q6_K: {
        const blk_q6_K *b = src;
        for (int64_t i = 0; i < n / QKK; i++) {
            const float d = fp16_to_fp32(b[i].d);
            /* element 128h + 32s + l: low nibble of ql[64h + l + 32(s&1)]
             * (high nibble when s >= 2), bits 2s..2s+1 of qh[32h + l] */
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < 4; s++, q += 32) {
                    const uint8_t *ql = b[i].ql + 64 * h + 32 * (s & 1), *qh = b[i].qh + 32 * h;
                    for (int l = 0; l < 32; l++)
                        q[l] = (uint8_t)(((ql[l] >> (4 * (s >> 1))) & 0xF) | (((qh[l] >> (2 * s)) & 3) << 4));
                }
            for (int g = 0; g < QKK / 16; g++) {
                const float ds = d * (float)b[i].scales[g];
                fill_scales(sw, mn, i * QKK + 16 * g, 16, ds, 32.0f * ds);
            }
        }
        break;
    }
    default: assert(0);
    }
}

void gemm_pack_rows(uint32_t type, const void *w, size_t w_stride, int nr, int64_t n, void *dst)
{
    const size_t rb = gemm_row_bytes(type, n);
    for (int r = 0; r < nr; r++) {
        const uint8_t *src = (const uint8_t *)w + (size_t)r * w_stride;
        uint8_t *out = (uint8_t *)dst + (size_t)r * rb;
        if (kind_of(type) == KIND_INT) {
            pack_int_row(type, src, n, out);
        } else if (kind_of(type) == KIND_BF16) {
            memcpy(out, src, (size_t)n * sizeof(uint16_t));
            memset(out + n * sizeof(uint16_t), 0, rb - (size_t)n * sizeof(uint16_t));
        } else {
            quant_to_float(type, src, (float *)out, n);
            memset(out + n * sizeof(float), 0, rb - (size_t)n * sizeof(float));
        }
    }
}

void gemm_pack_act(uint32_t type, const float *x, int64_t n, void *dst)
{
    const int vdt = quant_traits_of(type)->vec_dot_type;
    uint8_t *out = dst;
    memset(out, 0, gemm_act_bytes(type, n));
    if (kind_of(type) == KIND_BF16) {
        quant_from_float(QT_BF16, x, out, n);
        return;
    }
    if (kind_of(type) == KIND_F32) {
        float *y = (float *)out;
        if (vdt == QT_F32) {
            memcpy(y, x, (size_t)n * sizeof(float));
            return;
        }
        uint16_t h[256]; /* round through the vec_dot type in chunks */
        for (int64_t i = 0; i < n; i += 256) {
            const int64_t m = n - i < 256 ? n - i : 256;
            quant_from_float((uint32_t)vdt, x + i, h, m);
            quant_to_float((uint32_t)vdt, h, y + i, m);
        }
        return;
    }
    const int64_t np = int_npad(n);
    int8_t *xq = (int8_t *)out;
    float *sx = (float *)(out + np), *sb = sx + np / 4;
    if (vdt == QT_Q8_0) {
        for (int64_t i = 0; i < n / QK; i++) {
            blk_q8_0 b;
            quant_from_float(QT_Q8_0, x + i * QK, &b, QK);
            const float d = fp16_to_fp32(b.d);
            memcpy(xq + i * QK, b.qs, QK);
            for (int l = 0; l < QK / 4; l++) sx[i * (QK / 4) + l] = d;
            for (int g = 0; g < 2; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += b.qs[16 * g + j];
                sb[i * 2 + g] = d * (float)s;
            }
        }
    } else {
        assert(vdt == QT_Q8_K);
        for (int64_t i = 0; i < n / QKK; i++) {
            blk_q8_K b;
            quant_from_float(QT_Q8_K, x + i * QKK, &b, QKK);
            memcpy(xq + i * QKK, b.qs, QKK);
            for (int l = 0; l < QKK / 4; l++) sx[i * (QKK / 4) + l] = b.d;
            for (int g = 0; g < 16; g++) sb[i * 16 + g] = b.d * (float)b.bsums[g];
        }
    }
}

/* ---- reference micro-kernel ---------------------------------------------------- */

static float ref_int(const uint8_t *row, const uint8_t *act, int64_t n)
{
    const int64_t np = int_npad(n), ngp = int_ngpad(n);
    const float *sw = (const float *)(row + np), *mn = sw + np / 4;
    const int8_t *x = (const int8_t *)act;
    const float *sx = (const float *)(act + np), *sb = sx + np / 4;
    float acc[16] = { 0 }, am[16] = { 0 };
    for (int64_t k = 0; k < np; k += 64)
        for (int l = 0; l < 16; l++) {
            int32_t isum = 0;
            for (int j = 0; j < 4; j++) isum += (int32_t)row[k + 4 * l + j] * x[k + 4 * l + j];
            const float s = sw[k / 4 + l] * sx[k / 4 + l];
            acc[l] = fmaf((float)isum, s, acc[l]);
        }
    for (int64_t k = 0; k < ngp; k += 16)
        for (int l = 0; l < 16; l++) am[l] = fmaf(mn[k + l], sb[k + l], am[l]);
    return quant_hsum16(acc) - quant_hsum16(am);
}

static float ref_f32(const float *w, const float *x, int64_t n)
{
    float acc[16] = { 0 };
    for (int64_t k = 0; k < pad_to(n, 16); k += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(w[k + l], x[k + l], acc[l]);
    return quant_hsum16(acc);
}

/* BF16 x BF16 as vdpbf16ps computes it (the decode kernel's rounding):
 * subnormal inputs read as zero, per lane l of 32 elements the odd element
 * 2l+1 then 2l, each an fma whose subnormal result is flushed. */
static inline float bf16_daz(uint16_t h) { return (h & 0x7f80) == 0 ? 0.0f * bf16_to_fp32(h) : bf16_to_fp32(h); }
static inline float ftz(float f) { return fabsf(f) < FLT_MIN ? 0.0f * f : f; }

static float ref_bf16(const uint16_t *w, const uint16_t *x, int64_t n)
{
    float acc[16] = { 0 };
    for (int64_t k = 0; k < pad_to(n, 32); k += 32)
        for (int l = 0; l < 16; l++) {
            acc[l] = ftz(fmaf(bf16_daz(w[k + 2 * l + 1]), bf16_daz(x[k + 2 * l + 1]), acc[l]));
            acc[l] = ftz(fmaf(bf16_daz(w[k + 2 * l]), bf16_daz(x[k + 2 * l]), acc[l]));
        }
    return quant_hsum16(acc);
}

void gemm_tile_ref(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                   float *out, size_t ldo)
{
    const size_t rb = gemm_row_bytes(type, n);
    const int k = kind_of(type);
    assert(k != KIND_NONE && nr <= GEMM_MR && nt <= GEMM_NT);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) {
            const uint8_t *w = (const uint8_t *)rows + (size_t)r * rb, *x = (const uint8_t *)acts + (size_t)t * rb;
            out[(size_t)t * ldo + r] = k == KIND_INT    ? ref_int(w, x, n)
                                       : k == KIND_BF16 ? ref_bf16((const uint16_t *)w, (const uint16_t *)x, n)
                                                        : ref_f32((const float *)w, (const float *)x, n);
        }
}

void gemm_tile(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
               float *out, size_t ldo)
{
#if defined(QUANT_SIMD_AVX512)
    gemm_tile_avx512(type, rows, nr, acts, nt, n, out, ldo);
#else
    gemm_tile_ref(type, rows, nr, acts, nt, n, out, ldo);
#endif
}

void gemm_panel(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                float *out, size_t ldo)
{
    const size_t rb = gemm_row_bytes(type, n);
    for (int t0 = 0; t0 < nt; t0 += GEMM_NT)
        for (int r0 = 0; r0 < nr; r0 += GEMM_MR)
            gemm_tile(type, (const uint8_t *)rows + (size_t)r0 * rb, nr - r0 < GEMM_MR ? nr - r0 : GEMM_MR,
                      (const uint8_t *)acts + (size_t)t0 * rb, nt - t0 < GEMM_NT ? nt - t0 : GEMM_NT, n,
                      out + (size_t)t0 * ldo + r0, ldo);
}
