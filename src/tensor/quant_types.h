/* quant_types.h - tensor element types: ggml's type ids, their block sizes
 * and bytes (quant_traits) and the IEEE half / bfloat16 conversions.
 *
 * The lowest module of tensor/: the kernels (quant_impl.h), their dispatch
 * (quant.h), the GEMM and the GGUF reader all need these, and quant_types.c
 * needs nothing above it.
 */
#ifndef SPARQ_QUANT_TYPES_H
#define SPARQ_QUANT_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* Elements per block of the 32-element types and per K-quant super-block
 * (quant_impl.h's QK and QKK). */
enum { QUANT_QK = 32, QUANT_QKK = 256 };

enum {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7,
    QT_Q8_0 = 8, QT_Q8_1 = 9, QT_Q2_K = 10, QT_Q3_K = 11, QT_Q4_K = 12,
    QT_Q5_K = 13, QT_Q6_K = 14, QT_Q8_K = 15, QT_IQ2_XXS = 16, QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18, QT_IQ1_S = 19, QT_IQ4_NL = 20, QT_IQ3_S = 21, QT_IQ2_S = 22,
    QT_IQ4_XS = 23, QT_I8 = 24, QT_I16 = 25, QT_I32 = 26, QT_I64 = 27,
    QT_F64 = 28, QT_IQ1_M = 29, QT_BF16 = 30, QT_TQ1_0 = 34, QT_TQ2_0 = 35,
    QT_MXFP4 = 39,
    QT_COUNT = 40
};

typedef struct quant_traits {
    const char *name;      /* "Q8_0"; NULL for ids ggml never assigned      */
    int64_t block_size;    /* elements per block                            */
    size_t  block_bytes;   /* bytes per block                               */
    int     vec_dot_type;  /* activation type for dot products; -1: none    */
    int     has_kernels;   /* 1 if dequantize + dot product are implemented */
} quant_traits;

/* Traits of `type`, or NULL if the id is unknown (or was never assigned). */
const quant_traits *quant_traits_of(uint32_t type);

/* Bytes of a row of n elements; returns -1 if n is not a whole number of
 * blocks or the type is unknown, 0 on success. */
int quant_row_bytes(uint32_t type, int64_t n, size_t *out);

/* IEEE half / bfloat16 <-> float (round to nearest even, like ggml; the
 * half conversions equal F16C's vcvtph2ps / vcvtps2ph bit for bit,
 * including nan payloads). */
float    fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float    bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

#endif
