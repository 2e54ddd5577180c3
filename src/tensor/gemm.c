/* gemm.c - packing of weights and activations for the prefill tiles and
 * the dispatch (gemm.h). The layout and the plain-C reference micro-kernel
 * are gemm_kernels.c, below both this file and the SIMD micro-kernels
 * (gemm_avx512.c, gemm_avx2.c, gemm_neon.c), which are bit-identical to it.
 */
#include "tensor/gemm.h"
#include "tensor/gemm_kernels.h"
#include "tensor/quant.h"
#include "tensor/quant_impl.h"
#include "util/cpu.h"

#include <assert.h>
#include <string.h>

static const gemm_kernels *const tables[CPU_LEVELS] = {
    [CPU_REF] = &gemm_kernels_ref,
#if defined(__x86_64__)
    [CPU_AVX2] = &gemm_kernels_avx2,
    [CPU_AVX512] = &gemm_kernels_avx512,
#else
    [CPU_AVX2] = &gemm_kernels_ref,
    [CPU_AVX512] = &gemm_kernels_ref,
#endif
#if defined(__aarch64__)
    [CPU_NEON] = &gemm_kernels_neon,
    [CPU_NEON_DOTPROD] = &gemm_kernels_neondp,
#else
    [CPU_NEON] = &gemm_kernels_ref,
    [CPU_NEON_DOTPROD] = &gemm_kernels_ref,
#endif
};

const gemm_kernels *gemm_kernels_at(cpu_level level) { return tables[level]; }

/* Only where SIMD kernels exist: elsewhere the plain-C panels would be
 * slower than quant_dot_rows' kernels. */
int gemm_supported(uint32_t type)
{
    const gemm_kernels *k = tables[cpu_level_get()];
    const int kind = gemm_kind(type);
    return kind == GEMM_KIND_INT ? k->int_kinds : kind != GEMM_KIND_NONE ? k->float_kinds : 0;
}

/* ---- packing ---------------------------------------------------------------- */

/* Decodes weight block i of a row (QK or QKK elements) into codes q[], and
 * per bs-element block its scale s[] and min m[], as gemm.h defines them.
 * Returns the elements decoded. Block-wise loops (no per-element index
 * arithmetic): packing runs once per batch over every weight. */
static int decode_block(uint32_t type, const void *row, int64_t i, uint8_t *q, float *s, float *m, uint16_t *s16)
{
    switch (type) {
    case QT_Q8_0: {
        const blk_q8_0 *b = (const blk_q8_0 *)row + i;
        for (int j = 0; j < QK; j++) q[j] = (uint8_t)(b->qs[j] + 128);
        s[0] = fp16_to_fp32(b->d);
        s16[0] = b->d;
        return QK;
    }
    case QT_Q4_0: case QT_IQ4_NL: {
        /* same nibble order; IQ4_NL's nibble indexes the grid (code +128) */
        const int nl = type == QT_IQ4_NL;
        const blk_q4_0 *b = (const blk_q4_0 *)row + i;
        for (int j = 0; j < QK / 2; j++) {
            const int lo = b->qs[j] & 0xF, hi = b->qs[j] >> 4;
            q[j] = (uint8_t)(nl ? quant_iq4nl_values[lo] + 128 : lo);
            q[j + QK / 2] = (uint8_t)(nl ? quant_iq4nl_values[hi] + 128 : hi);
        }
        s[0] = fp16_to_fp32(b->d);
        s16[0] = b->d;
        return QK;
    }
    case QT_Q4_K: case QT_Q5_K: {
        const int five = type == QT_Q5_K;
        const uint8_t *base = (const uint8_t *)row + (size_t)i * (five ? sizeof(blk_q5_K) : sizeof(blk_q4_K));
        const blk_q4_K *b4 = (const blk_q4_K *)base;
        const blk_q5_K *b5 = (const blk_q5_K *)base;
        const uint8_t *scales = five ? b5->scales : b4->scales, *qs = five ? b5->qs : b4->qs;
        const float d = fp16_to_fp32(five ? b5->d : b4->d), dmin = fp16_to_fp32(five ? b5->dmin : b4->dmin);
        /* 64 elements per 32 bytes of qs: low nibbles, then high */
        for (int c = 0; c < 4; c++) {
            const uint8_t *v = qs + 32 * c;
            uint8_t *o = q + 64 * c;
            for (int l = 0; l < 32; l++) {
                o[l] = v[l] & 0xF;
                o[l + 32] = v[l] >> 4;
            }
            if (five)
                for (int l = 0; l < 32; l++) {
                    o[l] += (uint8_t)(16 * ((b5->qh[l] >> (2 * c)) & 1));
                    o[l + 32] += (uint8_t)(16 * ((b5->qh[l] >> (2 * c + 1)) & 1));
                }
        }
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            quant_k4_scale_min(scales, j, &sc, &mn);
            s[j] = d * (float)sc;
            m[j] = dmin * (float)mn;
        }
        return QKK;
    }
    case QT_Q6_K: {
        const blk_q6_K *b = (const blk_q6_K *)row + i;
        const float d = fp16_to_fp32(b->d);
        /* element 128h + 32s + l: low nibble of ql[64h + l + 32(s&1)]
         * (high nibble when s >= 2), bits 2s..2s+1 of qh[32h + l] */
        for (int h = 0; h < 2; h++)
            for (int sb = 0; sb < 4; sb++) {
                const uint8_t *ql = b->ql + 64 * h + 32 * (sb & 1), *qh = b->qh + 32 * h;
                uint8_t *o = q + 128 * h + 32 * sb;
                for (int l = 0; l < 32; l++)
                    o[l] = (uint8_t)(((ql[l] >> (4 * (sb >> 1))) & 0xF) | (((qh[l] >> (2 * sb)) & 3) << 4));
            }
        for (int g = 0; g < QKK / 16; g++) s[g] = d * (float)b->scales[g];
        return QKK;
    }
    case QT_IQ4_XS: {
        const blk_iq4_xs *b = (const blk_iq4_xs *)row + i;
        const float d = fp16_to_fp32(b->d);
        for (int ib = 0; ib < QKK / 32; ib++) {
            for (int j = 0; j < 16; j++) {
                q[32 * ib + j] = (uint8_t)(quant_iq4nl_values[b->qs[16 * ib + j] & 0xF] + 128);
                q[32 * ib + j + 16] = (uint8_t)(quant_iq4nl_values[b->qs[16 * ib + j] >> 4] + 128);
            }
            s[ib] = d * (float)quant_iq4xs_scale(b, ib);
        }
        return QKK;
    }
    default: assert(0); return 0;
    }
}

/* One row into lane r of an interleaved 16-row group. */
static void pack_int_row(uint32_t type, const gemm_int_layout *l, const void *src, int64_t n, int r, uint8_t *grp)
{
    uint8_t q[QKK];
    float s[QKK / 16], m[QKK / 16];
    uint16_t s16[1] = { 0 };
    for (int64_t i = 0, e = 0; e < n; i++) {
        const int cnt = decode_block(type, src, i, q, s, m, s16);
        for (int e0 = 0; e0 < cnt; e0 += l->bs) {
            uint8_t *blk = grp + (size_t)((e + e0) / l->bs) * l->block_bytes;
            for (int k = 0; k < l->bs / 4; k++) memcpy(blk + 64 * k + 4 * r, q + e0 + 4 * k, 4);
            uint8_t *sc = blk + (size_t)GEMM_GROUP * l->bs;
            if (l->scale_f16) { /* one block per decode_block call: s16[0] */
                memcpy(sc + 2 * r, s16, 2);
                continue;
            }
            memcpy(sc + 4 * r, &s[e0 / l->bs], 4);
            if (l->has_min) memcpy(sc + 4 * (GEMM_GROUP + r), &m[e0 / l->bs], 4);
        }
        e += cnt;
    }
}

void gemm_pack_rows(uint32_t type, const void *w, size_t w_stride, int nr, int64_t n, void *dst)
{
    const size_t rb = gemm_row_bytes(type, n);
    const int nr_pad = (nr + GEMM_GROUP - 1) / GEMM_GROUP * GEMM_GROUP;
    if (gemm_kind(type) == GEMM_KIND_INT) {
        gemm_int_layout l;
        if (gemm_int_layout_of(type, n, &l)) {
            assert(0);
            return;
        }
        for (int g = 0; g < nr_pad; g += GEMM_GROUP) {
            uint8_t *grp = (uint8_t *)dst + (size_t)g * rb;
            if (nr - g < GEMM_GROUP) memset(grp, 0, GEMM_GROUP * rb); /* padding rows: zero codes and scales */
            for (int r = 0; r < GEMM_GROUP && g + r < nr; r++)
                pack_int_row(type, &l, (const uint8_t *)w + (size_t)(g + r) * w_stride, n, r, grp);
        }
        return;
    }
    for (int r = 0; r < nr_pad; r++) {
        uint8_t *out = (uint8_t *)dst + (size_t)r * rb;
        const uint8_t *src = (const uint8_t *)w + (size_t)r * w_stride;
        size_t used = 0;
        if (r >= nr) {
        } else if (gemm_kind(type) == GEMM_KIND_BF16) {
            used = (size_t)n * sizeof(uint16_t);
            memcpy(out, src, used);
        } else {
            used = (size_t)n * sizeof(float);
            quant_to_float(type, src, (float *)out, n);
        }
        memset(out + used, 0, rb - used);
    }
}

void gemm_pack_act(uint32_t type, const float *x, int64_t n, void *dst)
{
    const int vdt = quant_traits_of(type)->vec_dot_type;
    uint8_t *out = dst;
    memset(out, 0, gemm_act_bytes(type, n));
    if (gemm_kind(type) == GEMM_KIND_BF16) {
        quant_from_float(QT_BF16, x, out, n);
        return;
    }
    if (gemm_kind(type) == GEMM_KIND_F32) {
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
    gemm_int_layout l;
    if (gemm_int_layout_of(type, n, &l)) {
        assert(0);
        return;
    }
    int8_t *xq = (int8_t *)out;
    float *dx = (float *)(out + l.act_dx), *sx = (float *)(out + l.act_sx);
    int32_t *start = (int32_t *)(out + l.act_start);
    const int per = vdt == QT_Q8_0 ? QK : QKK;
    for (int64_t i = 0; i < n / per; i++) {
        float d;
        if (vdt == QT_Q8_0) {
            blk_q8_0 b;
            quant_from_float(QT_Q8_0, x + i * QK, &b, QK);
            d = fp16_to_fp32(b.d);
            memcpy(xq + i * QK, b.qs, QK);
        } else {
            assert(vdt == QT_Q8_K);
            blk_q8_K b;
            quant_from_float(QT_Q8_K, x + i * QKK, &b, QKK);
            d = b.d;
            memcpy(xq + i * QKK, b.qs, QKK);
        }
        for (int64_t bk = i * per / l.bs; bk < (i + 1) * per / l.bs; bk++) {
            int32_t sum = 0;
            for (int j = 0; j < l.bs; j++) sum += xq[bk * l.bs + j];
            dx[bk] = d;
            start[bk] = -l.zp * sum;
            sx[bk] = d * (float)sum;
        }
    }
}

void gemm_panel(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                float *out, size_t ldo)
{
    tables[cpu_level_get()]->panel(type, rows, nr, acts, nt, n, out, ldo);
}

double gemm_peak_int8(int64_t iters, float *sink)
{
    const gemm_kernels *k = tables[cpu_level_get()];
    *sink = 0;
    return k->peak_int8 ? k->peak_int8(iters, sink) : 0;
}

double gemm_peak_f32(int64_t iters, float *sink)
{
    const gemm_kernels *k = tables[cpu_level_get()];
    *sink = 0;
    return k->peak_f32 ? k->peak_f32(iters, sink) : 0;
}
