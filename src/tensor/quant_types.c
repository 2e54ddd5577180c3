/* quant_types.c - the element-type table and half-precision conversions.
 *
 * Block sizes and bytes are ggml's (they fix how GGUF tensor sizes are
 * computed, so the GGUF reader can validate files with types we cannot
 * compute with: those load as "unsupported type X" at model creation).
 * has_kernels marks the weight types quant_to_float/quant_dot handle; Q8_1
 * and Q8_K are activation-only (quantise/dequantise, no dot).
 */
#include "tensor/quant_types.h"

#include <math.h>
#include <string.h>

#define QK  QUANT_QK
#define QKK QUANT_QKK

static const quant_traits traits_table[QT_COUNT] = {
    [QT_F32]     = { "F32",     1,   4,                QT_F32,     1 },
    [QT_F16]     = { "F16",     1,   2,                QT_F16,     1 },
    [QT_Q4_0]    = { "Q4_0",    QK,  2 + QK / 2,       QT_Q8_0,    1 },
    [QT_Q4_1]    = { "Q4_1",    QK,  4 + QK / 2,       QT_Q8_1,    1 },
    [QT_Q5_0]    = { "Q5_0",    QK,  2 + 4 + QK / 2,   QT_Q8_0,    1 },
    [QT_Q5_1]    = { "Q5_1",    QK,  4 + 4 + QK / 2,   QT_Q8_1,    1 },
    [QT_Q8_0]    = { "Q8_0",    QK,  2 + QK,           QT_Q8_0,    1 },
    [QT_Q8_1]    = { "Q8_1",    QK,  4 + QK,           QT_Q8_1,    0 },
    [QT_Q2_K]    = { "Q2_K",    QKK, 16 + 64 + 4,      QT_Q8_K,    1 },
    [QT_Q3_K]    = { "Q3_K",    QKK, 32 + 64 + 12 + 2, QT_Q8_K,    1 },
    [QT_Q4_K]    = { "Q4_K",    QKK, 4 + 12 + 128,     QT_Q8_K,    1 },
    [QT_Q5_K]    = { "Q5_K",    QKK, 4 + 12 + 32 + 128, QT_Q8_K,   1 },
    [QT_Q6_K]    = { "Q6_K",    QKK, 128 + 64 + 16 + 2, QT_Q8_K,   1 },
    [QT_Q8_K]    = { "Q8_K",    QKK, 4 + 256 + 32,     QT_Q8_K,    0 },
    [QT_IQ2_XXS] = { "IQ2_XXS", QKK, 2 + 64,           -1,         0 },
    [QT_IQ2_XS]  = { "IQ2_XS",  QKK, 2 + 64 + 8,       -1,         0 },
    [QT_IQ3_XXS] = { "IQ3_XXS", QKK, 2 + 96,           -1,         0 },
    [QT_IQ1_S]   = { "IQ1_S",   QKK, 2 + 32 + 16,      -1,         0 },
    [QT_IQ4_NL]  = { "IQ4_NL",  QK,  2 + 16,           QT_Q8_0,    1 },
    [QT_IQ3_S]   = { "IQ3_S",   QKK, 2 + 64 + 8 + 32 + 4, -1,      0 },
    [QT_IQ2_S]   = { "IQ2_S",   QKK, 2 + 64 + 16,      -1,         0 },
    [QT_IQ4_XS]  = { "IQ4_XS",  QKK, 2 + 2 + 4 + 128,  QT_Q8_K,    1 },
    [QT_I8]      = { "I8",      1,   1,                -1,         0 },
    [QT_I16]     = { "I16",     1,   2,                -1,         0 },
    [QT_I32]     = { "I32",     1,   4,                -1,         0 },
    [QT_I64]     = { "I64",     1,   8,                -1,         0 },
    [QT_F64]     = { "F64",     1,   8,                -1,         0 },
    [QT_IQ1_M]   = { "IQ1_M",   QKK, 32 + 16 + 8,      -1,         0 },
    [QT_BF16]    = { "BF16",    1,   2,                QT_BF16,    1 },
    [QT_TQ1_0]   = { "TQ1_0",   QKK, 2 + 4 * 13,       -1,         0 },
    [QT_TQ2_0]   = { "TQ2_0",   QKK, 2 + 64,           -1,         0 },
    [QT_MXFP4]   = { "MXFP4",   QK,  1 + 16,           -1,         0 },
};

const quant_traits *quant_traits_of(uint32_t type)
{
    if (type >= QT_COUNT || traits_table[type].name == NULL) return NULL;
    return &traits_table[type];
}

int quant_row_bytes(uint32_t type, int64_t n, size_t *out)
{
    const quant_traits *t = quant_traits_of(type);
    if (!t || n < 0 || n % t->block_size != 0) return -1;
    uint64_t blocks = (uint64_t)(n / t->block_size);
    if (blocks > SIZE_MAX / t->block_bytes) return -1;
    *out = (size_t)blocks * t->block_bytes;
    return 0;
}

float fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal man * 2^-24: shift the leading 1 up to bit 10 */
            int e = 0;
            while ((man & 0x400) == 0) { man <<= 1; e++; }
            bits = sign | ((uint32_t)(127 - 14 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) { /* inf, or nan made quiet like vcvtph2ps does */
        bits = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; nan keeps its top payload bits and becomes quiet,
 * as vcvtps2ph does. */
uint16_t fp32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520 (or inf): inf */
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half (units of 2^-24) or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* <= 2^-25 rounds to 0 */
        uint32_t e = ax >> 23, man = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* value = man * 2^(e-150) = (man >> shift) * 2^-24 */
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    /* normal: rebias the exponent, drop 13 mantissa bits; a carry out of the
     * mantissa correctly bumps the exponent */
    uint32_t r = (ax >> 13) - ((127 - 15) << 10);
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

float bf16_to_fp32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); /* quiet nan */
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}
