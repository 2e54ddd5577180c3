/* quant.h - tensor element types, (de)quantisation and dot-product kernels.
 *
 * Type ids are ggml's (GGUF stores them), so a file's type field indexes the
 * table directly. Block layouts are bit-compatible with ggml's:
 *   Q8_0  { f16 d; int8 qs[32]; }                          34 B / 32
 *   Q4_0  { f16 d; uint8 qs[16]; }                         18 B / 32
 *   Q4_1  { f16 d, m; uint8 qs[16]; }                      20 B / 32
 *   Q5_0  { f16 d; uint8 qh[4]; uint8 qs[16]; }            22 B / 32
 *   Q5_1  { f16 d, m; uint8 qh[4]; uint8 qs[16]; }         24 B / 32
 *   Q8_1  { f16 d, s; int8 qs[32]; }                       36 B / 32
 *   Q2_K .. Q6_K, Q8_K: super-blocks of 256 (see quant_impl.h)
 *   IQ4_NL { f16 d; uint8 qs[16]; }  nibbles index a 16-value grid  18 B / 32
 *   IQ4_XS { f16 d; u16 scales_h; uint8 scales_l[4]; uint8 qs[128]; }
 *          8 x 32 with 6-bit scales, the IQ4_NL grid               136 B / 256
 *
 * Matrix-vector products follow ggml's numerics: the activation row is first
 * converted to the weight type's `vec_dot_type` (Q8_0 for Q4_0/Q5_0/Q8_0/
 * IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants and IQ4_XS, F16 for F16,
 * BF16 for BF16, F32 for F32) and the dot product is then taken block by block. Reproducing that
 * is what makes our logits match llama.cpp's to ~1e-5 instead of ~0.3.
 *
 * Exactness: activation quantisation and every dot product reproduce
 * llama.cpp's x86 (AVX2/AVX-512) decode path bit for bit - including its
 * float accumulation order, and for Q4_0/Q4_K/Q2_K the order of its
 * repacked ("CPU_REPACK") kernels; see quant_impl.h. Checked against
 * llama.cpp's own ggml for every type here, random data, many lengths.
 *
 * Kernel twins: every `quant_*` function below has a plain-C `_ref` twin with
 * the same signature (declared with the SIMD twins in quant_impl.h, which
 * the twins include instead of this header); the un-suffixed one runs the
 * twin of the level chosen at run time (util/cpu.h: the best the CPU has,
 * or SPARQ_CPU). Type ids, traits and the half conversions are
 * quant_types.h, below both. The twins
 * are bit-identical (tests/test_quant.c compares them with zero tolerance).
 *
 * All functions are thread-safe (no state); n must be a whole number of
 * blocks of a type with kernels (asserted).
 */
#ifndef SPARQ_QUANT_H
#define SPARQ_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "tensor/quant_types.h"
#include "util/cpu.h"

/* n halves <-> floats: quant_types.h's scalar conversions, row at a time. */
void fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n);
void fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n);

/* Dequantise n elements (n a multiple of the block size) of a row. */
void quant_to_float(uint32_t type, const void *src, float *dst, int64_t n);

/* Quantise n floats into `type` (any vec_dot type: F32, F16, BF16, Q8_0,
 * Q8_1, Q8_K; and Q4_0, Q8_0, Q4_K, Q6_K for writing synthetic models).
 * Returns 0, or -1 if this type cannot be written (or n is not a whole
 * number of blocks).
 *   Q8_0/Q8_1/Q8_K: ggml's activation quantisers on x86 (Q8_0: 127/amax,
 *     round half to even; llama-quantize's Q8_0 differs on rare ties).
 *   Q4_0: byte-identical to llama-quantize (no imatrix).
 *   Q4_K, Q6_K: our least-squares group fits; same error as llama-quantize
 *     on Gaussian weights (not the same bytes). */
int quant_from_float(uint32_t type, const float *src, void *dst, int64_t n);

/* Dot product of one weight row `w` (type) with one activation row `x`
 * already converted to traits(type)->vec_dot_type, n elements. */
float quant_dot(uint32_t type, const void *w, const void *x, int64_t n);

/* The same for nr weight rows (row stride w_stride bytes) against one x:
 * out[i] = dot(w + i*w_stride, x), each bit-identical to quant_dot. The
 * prefill loop, where a chunk of rows stays in cache while many tokens'
 * x pass over it: the AVX-512 set runs Q8_0, Q4_0 and IQ4_NL four rows at a time
 * sharing each load of x (their per-block work is small); the K-quants and
 * float types go row by row. Rows streamed from DRAM once (decode) are
 * faster through quant_dot one by one (see model_matmul_group).
 * Single-threaded: callers split rows across threads. */
void quant_dot_rows(uint32_t type, const void *w, size_t w_stride, int nr,
                    const void *x, int64_t n, float *out);

/* Plain f32/f16 helpers the attention kernels share. dot_f32 is
 * quant_dot(QT_F32) (ggml's summation order); dot_f16_f32 uses the same
 * order with the f16 operand widened exactly. The SIMD and _ref versions
 * of all of these are bit-identical. */
float dot_f32(const float *a, const float *b, int64_t n);
float dot_f16_f32(const uint16_t *a, const float *b, int64_t n);
/* y += a * x  for x in f32 / f16, one fma per element */
void axpy_f32(float *y, float a, const float *x, int64_t n);
void axpy_f16(float *y, float a, const uint16_t *x, int64_t n);

/* "avx512", "avx2" or "ref": the level the un-suffixed functions run
 * (util/cpu.h, chosen at run time). */
const char *quant_simd_name(void);

/* The kernel table `level` runs (quant_impl.h; its own twins or, without
 * them, the reference): the dispatch, here and not beside the twins. */
struct quant_kernels;
const struct quant_kernels *quant_kernels_at(cpu_level level);

#endif
