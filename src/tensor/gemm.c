/* gemm.c - packing of weights and activations for the prefill tiles, the
 * plain-C reference micro-kernel and the dispatch (gemm.h). The SIMD
 * micro-kernels are in gemm_avx512.c, gemm_avx2.c and gemm_neon.c; all are
 * bit-identical to the reference.
 */
#include "tensor/gemm.h"
#include "tensor/quant_impl.h"
#include "util/cpu.h"

#include <assert.h>
#include <float.h>
#include <string.h>

enum { KIND_NONE = 0, KIND_INT = 1, KIND_F32 = 2, KIND_BF16 = 3 };

static int kind_of(uint32_t type)
{
    switch (type) {
    case QT_Q8_0: case QT_Q4_0: case QT_IQ4_NL: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_XS:
        return KIND_INT;
    case QT_F32: case QT_F16: return KIND_F32;
    case QT_BF16: return KIND_BF16;
    default: return KIND_NONE;
    }
}

const gemm_kernels gemm_kernels_ref = { 0, 0, gemm_panel_ref, NULL, NULL };

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
    const int kind = kind_of(type);
    return kind == KIND_INT ? k->int_kinds : kind != KIND_NONE ? k->float_kinds : 0;
}

int gemm_is_bf16(uint32_t type) { return kind_of(type) == KIND_BF16; }

static int64_t pad_to(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int gemm_int_layout_of(uint32_t type, int64_t n, gemm_int_layout *l)
{
    if (kind_of(type) != KIND_INT || n <= 0 || n % quant_traits_of(type)->block_size) return -1;
    memset(l, 0, sizeof *l);
    l->bs = type == QT_Q6_K ? 16 : 32;
    l->zp = type == QT_Q4_0 ? 8 : type == QT_Q6_K ? 32 : (type == QT_Q4_K || type == QT_Q5_K) ? 0 : 128;
    l->has_min = type == QT_Q4_K || type == QT_Q5_K;
    l->scale_f16 = type == QT_Q8_0 || type == QT_Q4_0 || type == QT_IQ4_NL;
    l->nb = n / l->bs;
    l->block_bytes = (size_t)GEMM_GROUP * (size_t)(l->bs + (l->scale_f16 ? 2 : 4) + 4 * l->has_min);
    const size_t per_block = (size_t)pad_to(4 * l->nb, 64);
    l->act_dx = (size_t)pad_to(n, 64);
    l->act_start = l->act_dx + per_block;
    l->act_sx = l->act_start + per_block;
    l->act_bytes = l->act_sx + per_block;
    return 0;
}

size_t gemm_row_bytes(uint32_t type, int64_t n)
{
    gemm_int_layout l;
    if (kind_of(type) == KIND_F32) return (size_t)pad_to(n, 16) * sizeof(float);
    if (kind_of(type) == KIND_BF16) return (size_t)pad_to(n, 32) * sizeof(uint16_t);
    if (gemm_int_layout_of(type, n, &l)) return 0;
    return (size_t)l.nb * l.block_bytes / GEMM_GROUP;
}

size_t gemm_act_bytes(uint32_t type, int64_t n)
{
    gemm_int_layout l;
    if (kind_of(type) != KIND_INT) return gemm_row_bytes(type, n);
    return gemm_int_layout_of(type, n, &l) ? 0 : l.act_bytes;
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
    if (kind_of(type) == KIND_INT) {
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
        } else if (kind_of(type) == KIND_BF16) {
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

/* ---- reference micro-kernel ---------------------------------------------------- */

/* Row r (lane r of its group) times one packed token, in the order of the
 * SIMD kernel: per block the exact integer sum, then the float steps. */
static float ref_int(const gemm_int_layout *l, const uint8_t *grp, int r, const uint8_t *act)
{
    const int8_t *x = (const int8_t *)act;
    const float *dx = (const float *)(act + l->act_dx), *sx = (const float *)(act + l->act_sx);
    const int32_t *start = (const int32_t *)(act + l->act_start);
    float acc = 0;
    for (int64_t b = 0; b < l->nb; b++) {
        const uint8_t *blk = grp + (size_t)b * l->block_bytes;
        const uint8_t *sc = blk + (size_t)GEMM_GROUP * l->bs;
        int32_t isum = start[b];
        for (int k = 0; k < l->bs / 4; k++)
            for (int j = 0; j < 4; j++) isum += (int32_t)blk[64 * k + 4 * r + j] * x[b * l->bs + 4 * k + j];
        float sw, mw = 0;
        if (l->scale_f16) {
            uint16_t h;
            memcpy(&h, sc + 2 * r, 2);
            sw = fp16_to_fp32(h);
        } else {
            memcpy(&sw, sc + 4 * r, 4);
            if (l->has_min) memcpy(&mw, sc + 4 * (GEMM_GROUP + r), 4);
        }
        acc = fmaf((float)isum * sw, dx[b], acc);
        if (l->has_min) acc = fmaf(-mw, sx[b], acc);
    }
    return acc;
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

void gemm_panel_ref(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                    float *out, size_t ldo)
{
    const size_t rb = gemm_row_bytes(type, n), ab = gemm_act_bytes(type, n);
    const int k = kind_of(type);
    gemm_int_layout l;
    assert(k != KIND_NONE);
    if (k == KIND_INT && gemm_int_layout_of(type, n, &l)) {
        assert(0);
        return;
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) {
            const uint8_t *x = (const uint8_t *)acts + (size_t)t * ab;
            float *o = out + (size_t)t * ldo + r;
            if (k == KIND_INT) {
                *o = ref_int(&l, (const uint8_t *)rows + (size_t)(r / GEMM_GROUP * GEMM_GROUP) * rb, r % GEMM_GROUP, x);
                continue;
            }
            const uint8_t *w = (const uint8_t *)rows + (size_t)r * rb;
            *o = k == KIND_BF16 ? ref_bf16((const uint16_t *)w, (const uint16_t *)x, n)
                                : ref_f32((const float *)w, (const float *)x, n);
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
