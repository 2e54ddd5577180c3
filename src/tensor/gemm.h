/* gemm.h - weight x activation products for prefill (many tokens at once).
 *
 * Decode multiplies each weight row by one token and is bound by reading the
 * weights; prefill multiplies it by hundreds and should be bound by
 * arithmetic. quant_dot_rows cannot get there: every call re-reads a token's
 * activations and reduces to a scalar per (row, token). Here both operands
 * are first rewritten ("packed") into a layout made for register tiles, then
 * a panel of rows (sized by the caller to stay in L2) meets every token.
 *
 * Integer kind (Q8_0, Q4_0, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS). A weight is
 * w = s_b * (q - zp) - m_b with unsigned codes q (0..255), a float scale s_b
 * and (Q4_K/Q5_K only) a float min m_b per block b of `bs` elements (32;
 * Q6_K 16, its scale granularity) and a zero point zp fixed by the type
 * (Q8_0 and the IQ4 grids 128, Q4_0 8, Q6_K 32, Q4_K/Q5_K 0). Sixteen rows
 * are interleaved, block by block:
 *
 *   block b of a group: codes [bs/4][16 rows][4] | s[16] | m[16] f32
 *
 * s is the file's f16 scale where the type stores one per block (Q8_0,
 * Q4_0, IQ4_NL), so a packed Q8_0 matrix takes exactly the file's bytes
 * (decode streams it from DRAM: model_repack.c); computed scales (the K
 * kinds, IQ4_XS) are f32. Blocks are then 544 bytes apart, not whole cache
 * lines, and the kernels load them unaligned.
 *
 * so one 64-byte vector holds 4 consecutive codes of each of 16 rows and a
 * vpdpbusd against 4 codes of one token broadcast to every lane advances 16
 * dot products at once, in exact int32. A token's activations are the
 * vec_dot type's int8 codes (Q8_0 or Q8_K, quantised exactly as for
 * quant_dot), then per block: the scale dx_b, the integer start
 * -zp * sum(codes) and dx_b * sum(codes). Per (row, token, block):
 *
 *   isum = -zp * sum(x) + sum(q * x)          (int32, exact)
 *   acc  = fma((float)isum * s_b, dx_b, acc)  then, with mins,
 *   acc  = fma(-m_b, dx_b * sum(x), acc)
 *
 * Eight vpdpbusd per 32-element block share three float operations, and
 * the 16 results of a row group are one vector store: no horizontal sums.
 *
 * Float kind (F32, F16): rows widened to f32, activations rounded to the
 * vec_dot type first (so every product equals quant_dot's); BF16: both stay
 * bf16 and meet in vdpbf16ps (its rounding: odd element first, subnormals
 * flushed), as the decode kernel does. Rows are stored one after another and
 * computed in tiles of GEMM_MR rows x GEMM_NT tokens reduced per lane.
 *
 * Numerics: the integer parts are exact; against quant_dot only the float
 * rounding and summation order differ (|diff| ~ 1e-6 relative), which the
 * golden logits tolerate (tests/test_model.c). gemm_panel_ref (plain C) and
 * gemm_panel (SIMD) are bit-identical.
 */
#ifndef SPARQ_GEMM_H
#define SPARQ_GEMM_H

#include "tensor/gemm_kernels.h"
#include "util/cpu.h"

#include <stddef.h>
#include <stdint.h>

/* 1 if weights of this type have a packed GEMM path at the level running
 * (util/cpu.h): every kind at avx512 and avx2 (gemm_avx2.c), the integer
 * kinds at neon (gemm_neon.c), none at ref; the packing and gemm_panel_ref
 * work everywhere. */
int gemm_supported(uint32_t type);

/* Packs nr weight rows (stride w_stride bytes) into dst, padding the last
 * group with zero rows. dst: 64-byte aligned, room for nr rounded up to
 * GEMM_GROUP rows. */
void gemm_pack_rows(uint32_t type, const void *w, size_t w_stride, int nr, int64_t n, void *dst);

/* Packs one token's activations x[n] for weights of `type`: quantised to
 * the type's vec_dot type exactly as quant_from_float does, then laid out
 * as above. dst: 64-byte aligned, act_bytes. */
void gemm_pack_act(uint32_t type, const float *x, int64_t n, void *dst);

/* The whole product of a packed panel: out[t * ldo + r] = dot(row r, token
 * t) for r < nr, t < nt; the tokens packed act_bytes apart. Loops tokens in
 * tiles outside rows, so a token tile stays in L1 while the panel streams
 * past it from L2. gemm_panel_ref (gemm_kernels.h) is the plain-C twin
 * (bit-identical). */
void gemm_panel(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                float *out, size_t ldo);

/* Peak-rate loops for `sparq bench peak`: `iters` rounds of 12 independent
 * vpdpbusd (int8: 128 ops each, 64 multiply-adds) or 16 vfmadd (f32: 32
 * flops each) on zmm registers; returns the operations done, 0 when the
 * level running has no such instructions. The result is consumed via *sink so the
 * loop cannot be removed. */
double gemm_peak_int8(int64_t iters, float *sink);
double gemm_peak_f32(int64_t iters, float *sink);

/* The kernel table `level` runs (gemm_kernels.h): the dispatch, here and
 * not in gemm_kernels.h, so no SIMD twin sees it. */
const gemm_kernels *gemm_kernels_at(cpu_level level);

#endif
