/* attn_kv_view.c - the layout helpers of attn_kv_view.h: Q8_0 rows
 * quantized and widened, key rows of a view copied out as f32.
 */
#include "attn/attn_kv_view.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void attn_q8_quantize_row(const float *x, int64_t n, uint8_t *out)
{
    for (int64_t b0 = 0; b0 < n; b0 += ATTN_Q8_BLOCK) {
        const int nb = n - b0 < ATTN_Q8_BLOCK ? (int)(n - b0) : ATTN_Q8_BLOCK;
        float amax = 0;
        for (int i = 0; i < nb; i++) amax = fabsf(x[b0 + i]) > amax ? fabsf(x[b0 + i]) : amax;
        /* quantize against the stored (f16-rounded) scale, so q * scale is
         * the nearest value the block can hold */
        const uint16_t h = fp32_to_fp16(amax / 127.0f);
        const float sc = fp16_to_fp32(h), inv = sc > 0 ? 1.0f / sc : 0.0f;
        uint8_t *blk = out + (size_t)(b0 / ATTN_Q8_BLOCK) * ATTN_Q8_BLOCK_BYTES;
        memcpy(blk, &h, 2);
        for (int i = 0; i < nb; i++) {
            float v = roundf(x[b0 + i] * inv);
            v = v > 127 ? 127 : v < -127 ? -127 : v; /* f16 rounding may shrink sc */
            blk[2 + i] = (uint8_t)(int8_t)v;
        }
    }
}

float *attn_kv_keys_f32(const attn_kv_view *kv, int64_t a, int64_t b)
{
    const int64_t n = b - a;
    if (n < 0 || (size_t)n > SIZE_MAX / sizeof(float) / (size_t)kv->d) return NULL;
    float *x = malloc((size_t)(n ? n : 1) * kv->d * sizeof *x);
    if (!x) return NULL;
    if (kv->elem == KV_Q8_0) /* per-row scales: row by row */
        for (int64_t i = 0; i < n; i++) attn_kv_row_f32(kv->K, kv->elem, kv->d, a + i, kv->d, x + i * kv->d);
    else if (kv->elem == KV_F16) fp16_to_fp32_row((const uint16_t *)kv->K + a * kv->d, x, n * kv->d);
    else memcpy(x, (const float *)kv->K + a * kv->d, (size_t)n * kv->d * sizeof *x);
    return x;
}

void attn_kv_row_f32(const void *base, int elem, int64_t len, int64_t row, int64_t n, float *out)
{
    if (elem == KV_F16) fp16_to_fp32_row((const uint16_t *)base + row * len, out, n);
    else if (elem == KV_F32) memcpy(out, (const float *)base + row * len, (size_t)n * sizeof *out);
    else {
        const uint8_t *r = (const uint8_t *)base + (size_t)row * attn_q8_row_bytes(len);
        for (int64_t b0 = 0; b0 < n; b0 += ATTN_Q8_BLOCK) {
            const uint8_t *blk = r + (size_t)(b0 / ATTN_Q8_BLOCK) * ATTN_Q8_BLOCK_BYTES;
            uint16_t h;
            memcpy(&h, blk, 2);
            const float sc = fp16_to_fp32(h);
            const int64_t nb = n - b0 < ATTN_Q8_BLOCK ? n - b0 : ATTN_Q8_BLOCK;
            for (int64_t i = 0; i < nb; i++) out[b0 + i] = sc * (float)(int8_t)blk[2 + i];
        }
    }
}
