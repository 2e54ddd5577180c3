/* attn_kernels_q8i_ref.c - the plain-C twins of the integer kernels for
 * Q8_0 caches (attn.h, "integer kernels for Q8_0 caches").
 *
 * One position at a time, in the order attn.h writes the maths: integer
 * sums exact, the float steps (block scale products, fused multiply-adds in
 * block order, one flush per 64 positions) exactly as the AVX-512 twins
 * round them, so the scores of the two are bit-identical
 * (tests/test_kvq8.c). The softmax-weighted sum uses expf where the AVX-512
 * twin uses its polynomial (2e-7 apart), which may move a weight across a
 * rounding boundary of its u8 code: the test bounds that difference.
 */
#include "attn/attn_kernels.h"

#include <math.h>
#include <string.h>

void attn_q8i_query(const float *q, int d, float scale, int8_t *qi, float *dqs, int32_t *corr)
{
    for (int b = 0; b < d / ATTN_Q8_BLOCK; b++) {
        const float *x = q + b * ATTN_Q8_BLOCK;
        float amax = 0;
        for (int j = 0; j < ATTN_Q8_BLOCK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float dq = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < ATTN_Q8_BLOCK; j++) {
            float v = nearbyintf(x[j] * inv);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            qi[b * ATTN_Q8_BLOCK + j] = (int8_t)v;
            sum += (int8_t)v;
        }
        dqs[b] = dq * scale;
        corr[b] = 128 * sum;
    }
}

static float q8_scale(const uint8_t *blk)
{
    uint16_t h;
    memcpy(&h, blk, 2);
    return fp16_to_fp32(h);
}

void attn_scores_q8i_ref(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                         int64_t n, float *s)
{
    const int d = kv->d, nbk = d / ATTN_Q8_BLOCK;
    const size_t rb = attn_q8_row_bytes(d);
    const float scale = 1.0f / sqrtf((float)d);
    int8_t qi[ATTN_Q8I_MAX_D];
    float dqs[ATTN_Q8I_MAX_D / ATTN_Q8_BLOCK];
    int32_t corr[ATTN_Q8I_MAX_D / ATTN_Q8_BLOCK];
    for (int h = 0; h < g; h++) {
        attn_q8i_query(q + (size_t)h * d, d, scale, qi, dqs, corr);
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *r = (const uint8_t *)kv->K + (size_t)(rows ? rows[i] : i) * rb;
            float acc = 0;
            for (int b = 0; b < nbk; b++) {
                const uint8_t *blk = r + (size_t)b * ATTN_Q8_BLOCK_BYTES;
                int32_t dot = 0;
                /* the product through int16 (exact: |k q| <= 2^14): gcc 12 turns an
                 * int8 x int8 dot loop into vpdpbusd, which takes one side as
                 * unsigned (wrong sums; found by tests/test_kvq8.c) */
                for (int j = 0; j < ATTN_Q8_BLOCK; j++)
                    dot += (int16_t)((int8_t)blk[2 + j] * qi[b * ATTN_Q8_BLOCK + j]);
                acc = fmaf((float)dot, q8_scale(blk) * dqs[b], acc);
            }
            s[h * n + i] = acc;
        }
    }
    if (kv->meter) kv->meter->k += n * d;
}

void attn_softmax_weighted_sum_q8i_ref(const attn_kv_view *kv, const float *s, int g,
                                       const int32_t *rows, int64_t n, float *out, float *lse)
{
    const int d = kv->d, nbk = d / ATTN_Q8_BLOCK;
    const size_t rb = attn_q8_row_bytes(d);
    memset(out, 0, (size_t)g * d * sizeof *out);
    for (int h = 0; h < g; h++) {
        const float *x = s + h * n;
        float *o = out + (size_t)h * d, mx = -INFINITY;
        double z = 0;
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int64_t i0 = 0; i0 < n; i0 += ATTN_Q8I_CHUNK) {
            const int nc = n - i0 < ATTN_Q8I_CHUNK ? (int)(n - i0) : ATTN_Q8I_CHUNK;
            float p[ATTN_Q8I_CHUNK];
            for (int i = 0; i < nc; i++) z += p[i] = expf(x[i0 + i] - mx);
            for (int b = 0; b < nbk; b++) {
                float c[ATTN_Q8I_CHUNK], cmax = 0;
                for (int i = 0; i < nc; i++) {
                    const uint8_t *r = (const uint8_t *)kv->V + (size_t)(rows ? rows[i0 + i] : i0 + i) * rb;
                    c[i] = p[i] * q8_scale(r + (size_t)b * ATTN_Q8_BLOCK_BYTES);
                    cmax = c[i] > cmax ? c[i] : cmax;
                }
                const float sigma = cmax / 255.0f, inv = cmax > 0 ? 255.0f / cmax : 0.0f;
                int32_t acc[ATTN_Q8_BLOCK] = { 0 };
                for (int i = 0; i < nc; i++) {
                    const uint8_t *blk = (const uint8_t *)kv->V +
                                         (size_t)(rows ? rows[i0 + i] : i0 + i) * rb +
                                         (size_t)b * ATTN_Q8_BLOCK_BYTES;
                    float u = nearbyintf(c[i] * inv);
                    u = u >= 0 && u <= 255 ? u : 255; /* NaN -> 255, as the AVX-512 conversion saturates */
                    for (int j = 0; j < ATTN_Q8_BLOCK; j++) acc[j] += (int32_t)u * (int8_t)blk[2 + j];
                }
                for (int j = 0; j < ATTN_Q8_BLOCK; j++)
                    o[b * ATTN_Q8_BLOCK + j] = fmaf((float)acc[j], sigma, o[b * ATTN_Q8_BLOCK + j]);
            }
        }
        const float invz = (float)(1.0 / z);
        for (int j = 0; j < d; j++) o[j] *= invz;
        if (lse) lse[h] = mx + (float)log(z);
    }
    if (kv->meter) kv->meter->v += n * d;
}
