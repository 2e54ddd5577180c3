/* gemm_kernels.h - the packed layouts of the prefill GEMM (gemm.h has
 * the picture) and the micro-kernel twins that read them.
 *
 * What gemm.c (packing, dispatch) and the SIMD twins (gemm_avx2.c,
 * gemm_avx512.c, gemm_neon.c) both need: the tile sizes, the bytes and
 * offsets of packed rows and tokens, the plain-C reference panel and the
 * per-level kernel table. Defined in gemm_kernels.c; the twins include this
 * header, never gemm.h, so none of them depends on the dispatcher.
 */
#ifndef SPARQ_GEMM_KERNELS_H
#define SPARQ_GEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum { GEMM_MR = 4, GEMM_NT = 4, GEMM_GROUP = 16 };

/* How a weight type is packed: integer codes in 16-row groups, f32 rows
 * (F32, F16) or bf16 rows; NONE: no packed path. */
enum { GEMM_KIND_NONE = 0, GEMM_KIND_INT = 1, GEMM_KIND_F32 = 2, GEMM_KIND_BF16 = 3 };
int gemm_kind(uint32_t type);

/* Bytes per row of a packed panel (a group of GEMM_GROUP rows takes
 * GEMM_GROUP times this) and of one packed token (a multiple of 64). A panel
 * of nr rows takes gemm_row_bytes * nr rounded up to GEMM_GROUP rows. */
size_t gemm_row_bytes(uint32_t type, int64_t n);
size_t gemm_act_bytes(uint32_t type, int64_t n);

/* Where things are in the integer kind's packed blocks and tokens. */
typedef struct {
    int     bs;          /* elements per scale block (32 or 16)           */
    int     zp;          /* zero point of the codes                       */
    int     has_min;     /* a min per block (Q4_K, Q5_K)                  */
    int     scale_f16;   /* s[16] as f16 (Q8_0, Q4_0, IQ4_NL), else f32   */
    int64_t nb;          /* blocks per row                                */
    size_t  block_bytes; /* one block of a 16-row group                   */
    size_t  act_dx;      /* token: offsets of dx[nb], start[nb], sx[nb]   */
    size_t  act_start, act_sx, act_bytes;
} gemm_int_layout;

/* 0 and *l filled for an integer-kind type and a valid n, -1 otherwise. */
int gemm_int_layout_of(uint32_t type, int64_t n, gemm_int_layout *l);

/* 1 for the float kinds' BF16 row layout, 0 for f32 rows. */
int gemm_is_bf16(uint32_t type);

/* One level's kernels (gemm.c calls through the table of the level
 * running, gemm_kernels_at). The peak loops are NULL where the level has none. */
typedef struct gemm_kernels {
    int int_kinds, float_kinds; /* which kinds get packed tiles (gemm_supported) */
    void (*panel)(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n, float *out,
                  size_t ldo);
    double (*peak_int8)(int64_t iters, float *sink);
    double (*peak_f32)(int64_t iters, float *sink);
} gemm_kernels;
extern const gemm_kernels gemm_kernels_ref, gemm_kernels_avx2, gemm_kernels_avx512;
extern const gemm_kernels gemm_kernels_neon, gemm_kernels_neondp; /* gemm_neon.c's two builds */

/* The plain-C panel (gemm.h's gemm_panel, bit-identical to every twin). */
void gemm_panel_ref(uint32_t type, const void *rows, int nr, const void *acts, int nt, int64_t n,
                    float *out, size_t ldo);

#endif
