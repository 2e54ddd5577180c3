/* gemm.h - weight x activation tiles for prefill (many tokens at once).
 *
 * Decode multiplies each weight row by one token and is bound by reading the
 * weights; prefill multiplies it by hundreds and should be bound by
 * arithmetic. quant_dot_rows cannot get there: every call re-reads a token's
 * activations and reduces to a scalar per (row, token). Here a tile of up to
 * GEMM_MR rows x GEMM_NT tokens is computed per call with all its
 * accumulators in registers, so each loaded weight vector serves GEMM_NT
 * tokens and each activation vector GEMM_MR rows.
 *
 * Both operands are first rewritten ("packed") into one layout per kind:
 *
 *   integer kind (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): a weight row becomes
 *     unsigned codes q[e] (0..255) with w[e] = sw[e/4] * q[e] - mn[e/16]:
 *     a float scale per 4 elements (the block's or group's scale, repeated)
 *     and a float offset per 16 (Q8_0: q = w+128, mn = 128 d; Q4_0: mn =
 *     8 d; Q4_K/Q5_K: the group's d*sc and dmin*m; Q6_K: mn = 32 d sc). The
 *     activations are the vec_dot type's int8 codes (Q8_0 or Q8_K, quantised
 *     exactly as for quant_dot) with sx[e/4] = their block scale and sb[g] =
 *     scale * sum of the 16 codes of group g. Then
 *       dot = sum_lanes sw*sx*(sum of 4 u8*s8 products) - sum_g mn_g*sb_g,
 *     the 4-product integer sums being one vpdpbusd lane.
 *   float kind (F32, F16): both rows widened to f32 (activations first
 *     rounded to the vec_dot type, so every product equals quant_dot's).
 *   BF16: both rows stay bf16 and meet in vdpbf16ps (its rounding: odd
 *     element first, subnormals flushed), as the decode kernel does.
 *
 * Numerics: the integer parts are exact; against quant_dot only the float
 * rounding and summation order differ (|diff| ~ 1e-6 relative), which the
 * golden logits tolerate (tests/test_model.c). The _ref micro-kernel and the
 * SIMD one are bit-identical (16 float lanes, fmaf, quant_hsum16).
 *
 * Lengths are padded to GEMM_PAD elements with zero codes and scales, so any
 * row length the weight type allows works. Packed rows are 64-byte aligned
 * when the buffer is.
 */
#ifndef SPARQ_GEMM_H
#define SPARQ_GEMM_H

#include <stddef.h>
#include <stdint.h>

enum { GEMM_MR = 4, GEMM_NT = 4, GEMM_PAD = 64 };

/* 1 if weights of this type have a packed GEMM path in this build (AVX-512
 * builds only; the packing and gemm_tile_ref work everywhere). */
int gemm_supported(uint32_t type);

/* Bytes of one packed weight row / one packed activation row of n elements
 * (multiples of 64). */
size_t gemm_row_bytes(uint32_t type, int64_t n);
size_t gemm_act_bytes(uint32_t type, int64_t n);

/* Packs nr weight rows (stride w_stride bytes) into dst (nr * row_bytes). */
void gemm_pack_rows(uint32_t type, const void *w, size_t w_stride, int nr, int64_t n, void *dst);

/* Packs one token's activations x[n] for weights of `type`: quantised to
 * the type's vec_dot type exactly as quant_from_float does, then laid out
 * as above. dst: act_bytes. */
void gemm_pack_act(uint32_t type, const float *x, int64_t n, void *dst);

/* out[t * ldo + r] = dot(row r, token t) for r < nr <= GEMM_MR, t < nt <=
 * GEMM_NT; rows and acts are packed (row_bytes / act_bytes apart). */
void gemm_tile(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
               float *out, size_t ldo);
void gemm_tile_ref(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                   float *out, size_t ldo);

/* The whole product for a range of rows: out[t * ldo + r] for r in
 * [0, nr), t in [0, nt), the nr rows packed in `rows`, the nt tokens in
 * `acts`. Loops tokens in tiles of GEMM_NT outside rows in tiles of
 * GEMM_MR, so a token tile stays in L1 while the packed rows (sized by the
 * caller to stay in L2) stream past it. */
void gemm_panel(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                float *out, size_t ldo);

/* Peak-rate loops for `sparq bench peak`: `iters` rounds of 12 independent
 * vpdpbusd (int8: 128 ops each, 64 multiply-adds) or 16 vfmadd (f32: 32
 * flops each) on zmm registers; returns the operations done, 0 when the
 * build has no such instructions. The result is consumed via *sink so the
 * loop cannot be removed. */
double gemm_peak_int8(int64_t iters, float *sink);
double gemm_peak_f32(int64_t iters, float *sink);

/* Implementation detail shared with gemm_avx512.c. */
void gemm_tile_avx512(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                      float *out, size_t ldo);

#endif
