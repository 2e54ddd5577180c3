/* gemm_kernels.c - the packed layouts of gemm_kernels.h and the plain-C
 * reference micro-kernel (its table is what SPARQ_CPU=ref runs). The SIMD
 * twins and the dispatch (gemm.c) are built on these; nothing here calls
 * either.
 */
#include "tensor/gemm_kernels.h"
#include "tensor/quant_impl.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

int gemm_kind(uint32_t type)
{
    switch (type) {
    case QT_Q8_0: case QT_Q4_0: case QT_IQ4_NL: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_XS:
        return GEMM_KIND_INT;
    case QT_F32: case QT_F16: return GEMM_KIND_F32;
    case QT_BF16: return GEMM_KIND_BF16;
    default: return GEMM_KIND_NONE;
    }
}

int gemm_is_bf16(uint32_t type) { return gemm_kind(type) == GEMM_KIND_BF16; }

static int64_t pad_to(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int gemm_int_layout_of(uint32_t type, int64_t n, gemm_int_layout *l)
{
    if (gemm_kind(type) != GEMM_KIND_INT || n <= 0 || n % quant_traits_of(type)->block_size) return -1;
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
    if (gemm_kind(type) == GEMM_KIND_F32) return (size_t)pad_to(n, 16) * sizeof(float);
    if (gemm_kind(type) == GEMM_KIND_BF16) return (size_t)pad_to(n, 32) * sizeof(uint16_t);
    if (gemm_int_layout_of(type, n, &l)) return 0;
    return (size_t)l.nb * l.block_bytes / GEMM_GROUP;
}

size_t gemm_act_bytes(uint32_t type, int64_t n)
{
    gemm_int_layout l;
    if (gemm_kind(type) != GEMM_KIND_INT) return gemm_row_bytes(type, n);
    return gemm_int_layout_of(type, n, &l) ? 0 : l.act_bytes;
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
    const int k = gemm_kind(type);
    gemm_int_layout l;
    assert(k != GEMM_KIND_NONE);
    if (k == GEMM_KIND_INT && gemm_int_layout_of(type, n, &l)) {
        assert(0);
        return;
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) {
            const uint8_t *x = (const uint8_t *)acts + (size_t)t * ab;
            float *o = out + (size_t)t * ldo + r;
            if (k == GEMM_KIND_INT) {
                *o = ref_int(&l, (const uint8_t *)rows + (size_t)(r / GEMM_GROUP * GEMM_GROUP) * rb, r % GEMM_GROUP, x);
                continue;
            }
            const uint8_t *w = (const uint8_t *)rows + (size_t)r * rb;
            *o = k == GEMM_KIND_BF16 ? ref_bf16((const uint16_t *)w, (const uint16_t *)x, n)
                                : ref_f32((const float *)w, (const float *)x, n);
        }
}

const gemm_kernels gemm_kernels_ref = { 0, 0, gemm_panel_ref, NULL, NULL };
