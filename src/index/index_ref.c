/* index_ref.c - the plain-C reference of every index kernel (the `_ref`
 * twins the tests compare with, and the level without SIMD) and the key
 * element size, below the dispatch in index_scan.c and the AVX2/AVX-512
 * twins, which call back into them for their tails.
 */
#include "index/index.h"
#include "tensor/quant.h"

#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

size_t idx_elt_bytes(int key_type)
{
    switch (key_type) {
    case IDX_F32: return 4;
    case IDX_F16: case IDX_BF16: return 2;
    case IDX_I8: return 1;
    default: return 0;
    }
}

/* ---- block kernels ---------------------------------------------------------- */

ALWAYS_INLINE float key_at_ref(int kt, const void *blk, int64_t i)
{
    switch (kt) {
    case IDX_F16: return fp16_to_fp32(((const uint16_t *)blk)[i]);
    case IDX_BF16: return bf16_to_fp32(((const uint16_t *)blk)[i]);
    case IDX_I8: return (float)((const int8_t *)blk)[i];
    default: return ((const float *)blk)[i];
    }
}

void idx_block_scores_ref(int key_type, const void *blk, const float *scale16,
                          int d, const float *q, int g, float *out)
{
    for (int h = 0; h < g; h++)
        for (int r = 0; r < IDX_BLOCK; r++) {
            float acc = 0.0f;
            for (int j = 0; j < d; j++)
                acc += q[(size_t)h * d + j] * key_at_ref(key_type, blk, (int64_t)j * IDX_BLOCK + r);
            out[h * IDX_BLOCK + r] = key_type == IDX_I8 ? acc * scale16[r] : acc;
        }
}

/* ---- packing ---------------------------------------------------------------------- */

/* Quantises one row to int8 with scale max|x| / 127 (0 for an all-zero row). */
static float row_to_i8(const float *v, int d, int8_t *out)
{
    float amax = 0.0f;
    for (int j = 0; j < d; j++) amax = fmaxf(amax, fabsf(v[j]));
    float scale = amax / 127.0f;
    for (int j = 0; j < d; j++) {
        /* divide (not multiply by 1/scale): 1/scale overflows for tiny rows */
        float x = scale > 0.0f ? nearbyintf(v[j] / scale) : 0.0f;
        out[j] = (int8_t)(x > 127.0f ? 127 : x < -127.0f ? -127 : (int)x);
    }
    return scale;
}

void idx_pack_rows_ref(int key_type, const float *v, int64_t n, int d, void *dst, float *scales)
{
    int8_t row8[IDX_MAX_D];
    for (int64_t i = 0; i < n; i++) {
        const float *x = v + i * d;
        int64_t b = i / IDX_BLOCK, r = i % IDX_BLOCK;
        size_t o = (size_t)b * d * IDX_BLOCK + (size_t)r;
        switch (key_type) {
        case IDX_F16:
            for (int j = 0; j < d; j++) ((uint16_t *)dst)[o + (size_t)j * IDX_BLOCK] = fp32_to_fp16(x[j]);
            break;
        case IDX_BF16:
            for (int j = 0; j < d; j++) ((uint16_t *)dst)[o + (size_t)j * IDX_BLOCK] = fp32_to_bf16(x[j]);
            break;
        case IDX_I8:
            scales[i] = row_to_i8(x, d, row8);
            for (int j = 0; j < d; j++) ((int8_t *)dst)[o + (size_t)j * IDX_BLOCK] = row8[j];
            break;
        default:
            for (int j = 0; j < d; j++) ((float *)dst)[o + (size_t)j * IDX_BLOCK] = x[j];
            break;
        }
    }
}

/* ---- assign (index_ivf.c) ---------------------------------------------------------- */

void idx_assign_ref(const float *x, int64_t n, int d, const float *c, const float *hn, int nc,
                    int32_t *label, float *best)
{
    for (int64_t i = 0; i < n; i++) {
        float bv = -INFINITY;
        int32_t bi = 0;
        for (int k = 0; k < nc; k++) {
            const float *ck = c + (size_t)(k / IDX_BLOCK) * d * IDX_BLOCK + k % IDX_BLOCK;
            float acc = 0.0f;
            for (int j = 0; j < d; j++) acc += x[i * d + j] * ck[(size_t)j * IDX_BLOCK];
            float s = acc - hn[k];
            if (s > bv) {
                bv = s;
                bi = k;
            }
        }
        label[i] = bi;
        best[i] = bv;
    }
}

const idx_kernels idx_kernels_ref = { idx_block_scores_ref, idx_topk_push16_ref, idx_pack_rows_ref,
                                      idx_assign_ref };
