/* quant_impl.h - private to the quant module (quant*.c and tests/test_quant.c).
 *
 * Block layouts (bit-compatible with ggml, so GGUF tensor data is used in
 * place), the helpers that unpack packed scales, the reductions that fix the
 * floating-point summation order, and the per-ISA entry points that quant.c
 * dispatches to.
 *
 * Numerics contract ("ggml x86 order"). llama.cpp on an AVX2/AVX-512 machine
 * does not compute a quantised dot product as sum_blocks(sumi * d); each
 * kernel keeps a fixed set of float accumulators. We reproduce that order
 * exactly, in the plain-C reference and in the SIMD twins, so the two are
 * bit-identical and both equal llama.cpp's decode-path matmul for the same
 * inputs:
 *   LANES8  8 float lanes; lane k of a block holds the integer dot of the
 *           elements with (e % 32) / 4 == k (times per-group scales for the
 *           K-quants); acc[k] = fma(d_block, (float)lane_k, acc[k]); the
 *           result is hsum8(acc) (+ a scalar fma-accumulated min term for
 *           Q4_1, Q5_1, Q5_K).           Q8_0, Q5_0, Q4_1, Q5_1, Q3_K, Q5_K, Q6_K,
 *                                        IQ4_XS (per-sub-block scale - 32)
 *   ROW1    one float accumulator per row (llama.cpp repacks these types
 *           into 8-row interleaved blocks): acc = fma((float)isum_block,
 *           d_w * d_x, acc), mins in a second accumulator subtracted at the
 *           end.                         Q4_0, Q4_K, Q2_K, IQ4_NL
 *   F32x64  4 accumulators x 16 lanes over steps of 64 elements,
 *           (a0+a2)+(a1+a3), then a halving 16-lane reduction; leftovers
 *           are added one by one.        F32, F16 (products exact), BF16
 *           (two 16-lane accumulators fed by vdpbf16ps: odd element first).
 *
 * Build: these files rely on the compiler not contracting a*b+c into an
 * FMA where they do not ask for one (fmaf / _mm*_fmadd_ps): GCC with
 * -std=c11 (the Makefile) implies -ffp-contract=off, clang only contracts
 * within one expression and the code keeps such products in their own
 * statements. tests/test_quant.c checks one case that would change.
 */
#ifndef SPARQ_QUANT_IMPL_H
#define SPARQ_QUANT_IMPL_H

#include "tensor/quant_types.h"
#include "util/cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK   QUANT_QK   /* elements per block of the 32-element types  */
#define QKK  QUANT_QKK  /* elements per K-quant super-block            */

typedef struct { uint16_t d; int8_t  qs[QK]; }                  blk_q8_0;
typedef struct { uint16_t d, s; int8_t qs[QK]; }                blk_q8_1; /* s = d * sum(qs) */
typedef struct { uint16_t d; uint8_t qs[QK / 2]; }              blk_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; }           blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } blk_q5_1;

/* Q2_K: 16 groups of 16; scales[g] = scale (low nibble) | min (high nibble);
 * 2-bit quants, element e at qs[32*(e/128) + e%32] bits 2*((e%128)/32). */
typedef struct { uint8_t scales[QKK / 16]; uint8_t qs[QKK / 4]; uint16_t d, dmin; } blk_q2_K;
/* Q3_K: 16 groups of 16 with 6-bit signed (offset 32) scales packed in 12
 * bytes; 2 low bits as in Q2_K; the third bit is hmask[e%32] bit e/32 and an
 * unset bit means -4. */
typedef struct { uint8_t hmask[QKK / 8]; uint8_t qs[QKK / 4]; uint8_t scales[12]; uint16_t d; } blk_q3_K;
/* Q4_K: 8 groups of 32 with 6-bit scale and min packed in 12 bytes; element
 * e at qs[32*(e/64) + e%32], low nibble if e%64 < 32. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QKK / 2]; } blk_q4_K;
/* Q5_K: Q4_K plus a fifth bit, qh[e%32] bit e/32. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QKK / 8]; uint8_t qs[QKK / 2]; } blk_q5_K;
/* Q6_K: 16 groups of 16 with int8 scales; 4 low bits in ql, 2 high bits in
 * qh, value offset 32 (see quant_ref.c for the element map). */
typedef struct { uint8_t ql[QKK / 2]; uint8_t qh[QKK / 4]; int8_t scales[QKK / 16]; uint16_t d; } blk_q6_K;
/* IQ4_NL: like Q4_0 (element j in the low nibble of qs[j], j+16 in the
 * high one) but a nibble indexes the 16-entry table quant_iq4nl_values
 * instead of meaning nibble - 8. */
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } blk_iq4_nl;
/* IQ4_XS: 8 sub-blocks of 32 with a 6-bit scale each (low 4 bits: nibble
 * ib%2 of scales_l[ib/2]; high 2 bits: bits 2ib..2ib+1 of scales_h),
 * value d * (scale - 32) * table[nibble]; sub-block ib packs its nibbles
 * in qs[16ib..16ib+15] as IQ4_NL does. */
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[QKK / 64]; uint8_t qs[QKK / 2]; } blk_iq4_xs;
/* Q8_K: activation type of the K-quants: f32 scale, bsums[g] = sum of the
 * 16 quants of group g. */
typedef struct { float d; int8_t qs[QKK]; int16_t bsums[QKK / 16]; } blk_q8_K;

_Static_assert(sizeof(blk_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(blk_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(blk_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(blk_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(blk_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(blk_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(blk_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(blk_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(blk_q8_K) == 292, "q8_K layout");
_Static_assert(sizeof(blk_iq4_nl) == 18, "iq4_nl layout");
_Static_assert(sizeof(blk_iq4_xs) == 136, "iq4_xs layout");

/* The non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl):
 * denser near zero, where trained weights cluster. */
static const int8_t quant_iq4nl_values[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                               1, 13, 25, 38, 53, 69, 89, 113 };

/* Signed scale (-32..31) of sub-block ib (0..7) of an IQ4_XS block. */
static inline int quant_iq4xs_scale(const blk_iq4_xs *b, int ib)
{
    int lo = (b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    int hi = (b->scales_h >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

/* 6-bit scale and min of group j (0..7) of a Q4_K/Q5_K block. */
static inline void quant_k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Signed 6-bit scale (-32..31) of group i (0..15) of a Q3_K block. */
static inline int quant_q3k_scale(const uint8_t *s, int i)
{
    int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
    int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* The horizontal sum of 8 lanes in the order of ggml's hsum_float_8. */
static inline float quant_hsum8(const float a[8])
{
    float r0 = a[0] + a[4], r1 = a[1] + a[5], r2 = a[2] + a[6], r3 = a[3] + a[7];
    return (r0 + r2) + (r1 + r3);
}

/* Halving reduction of 16 lanes (the order of _mm512_reduce_add_ps). */
static inline float quant_hsum16(const float a[16])
{
    float t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) u[i] = t[i] + t[i + 4];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

/* The plain-C twins of quant.h's kernels (quant_ref.c): the definition of
 * what every SIMD twin computes, bit for bit. */
void fp16_to_fp32_row_ref(const uint16_t *src, float *dst, int64_t n);
void fp32_to_fp16_row_ref(const float *src, uint16_t *dst, int64_t n);
void quant_to_float_ref(uint32_t type, const void *src, float *dst, int64_t n);
int quant_from_float_ref(uint32_t type, const float *src, void *dst, int64_t n);
float quant_dot_ref(uint32_t type, const void *w, const void *x, int64_t n);
void quant_dot_rows_ref(uint32_t type, const void *w, size_t w_stride, int nr,
                        const void *x, int64_t n, float *out);
float dot_f32_ref(const float *a, const float *b, int64_t n);
float dot_f16_f32_ref(const uint16_t *a, const float *b, int64_t n);
void axpy_f32_ref(float *y, float a, const float *x, int64_t n);
void axpy_f16_ref(float *y, float a, const uint16_t *x, int64_t n);

/* Per-ISA entry points. Each falls back to the _ref kernel for any type it
 * does not implement, so quant.c only chooses the ISA. */
void  quant_to_float_avx512(uint32_t type, const void *src, float *dst, int64_t n);
int   quant_from_float_avx512(uint32_t type, const float *src, void *dst, int64_t n);
float quant_dot_avx512(uint32_t type, const void *w, const void *x, int64_t n);
void  quant_dot_rows_avx512(uint32_t type, const void *w, size_t w_stride, int nr,
                            const void *x, int64_t n, float *out);
float dot_f32_avx512(const float *a, const float *b, int64_t n);
float dot_f16_f32_avx512(const uint16_t *a, const float *b, int64_t n);
void  axpy_f32_avx512(float *y, float a, const float *x, int64_t n);
void  axpy_f16_avx512(float *y, float a, const uint16_t *x, int64_t n);
void  fp16_to_fp32_row_avx512(const uint16_t *src, float *dst, int64_t n);
void  fp32_to_fp16_row_avx512(const float *src, uint16_t *dst, int64_t n);

void  quant_to_float_avx2(uint32_t type, const void *src, float *dst, int64_t n);
int   quant_from_float_avx2(uint32_t type, const float *src, void *dst, int64_t n);
float quant_dot_avx2(uint32_t type, const void *w, const void *x, int64_t n);
void  quant_dot_rows_avx2(uint32_t type, const void *w, size_t w_stride, int nr,
                          const void *x, int64_t n, float *out);
float dot_f32_avx2(const float *a, const float *b, int64_t n);
float dot_f16_f32_avx2(const uint16_t *a, const float *b, int64_t n);
void  axpy_f32_avx2(float *y, float a, const float *x, int64_t n);
void  axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n);
void  fp16_to_fp32_row_avx2(const uint16_t *src, float *dst, int64_t n);
void  fp32_to_fp16_row_avx2(const float *src, uint16_t *dst, int64_t n);

/* What the compiler may use in this file: the twins' files are compiled
 * for their instruction set (Makefile), everything else for the baseline.
 * Which twins run is chosen at run time (quant_kernels_at). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#define QUANT_CAN_AVX512 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QUANT_CAN_AVX2 1
#endif

/* One level's kernels; quant.c's un-suffixed functions call through the
 * table of the level util/cpu.h chose. */
typedef struct quant_kernels {
    void  (*to_float)(uint32_t type, const void *src, float *dst, int64_t n);
    int   (*from_float)(uint32_t type, const float *src, void *dst, int64_t n);
    float (*dot)(uint32_t type, const void *w, const void *x, int64_t n);
    void  (*dot_rows)(uint32_t type, const void *w, size_t w_stride, int nr, const void *x, int64_t n,
                      float *out);
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    float (*dot_f16_f32)(const uint16_t *a, const float *b, int64_t n);
    void  (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void  (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    void  (*fp16_to_fp32_row)(const uint16_t *src, float *dst, int64_t n);
    void  (*fp32_to_fp16_row)(const float *src, uint16_t *dst, int64_t n);
} quant_kernels;
extern const quant_kernels quant_kernels_ref, quant_kernels_avx2, quant_kernels_avx512;
/* ARM64: quant_neon.c built for baseline NEON and with +dotprod (Makefile) */
extern const quant_kernels quant_kernels_neon, quant_kernels_neondp;

#endif
