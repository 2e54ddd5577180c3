/* attn_prefill_kernels.h - the row primitives of the tiled prefill
 * (attn_prefill.h) and their per-level sets.
 *
 * The twins (attn_prefill_avx2.c, _avx512.c, _neon.c) include this header
 * and not attn_prefill.h: attn_prefill.c runs the tile loops and picks the
 * set of the level running, so the twins sit below it.
 */
#ifndef SPARQ_ATTN_PREFILL_KERNELS_H
#define SPARQ_ATTN_PREFILL_KERNELS_H

/* Keys per tile. */
enum { ATTN_PF_BK = 32 };

/* The tile loops are written once (attn_prefill.c) over these row
 * primitives; the plain-C set is the reference, attn_prefill_avx512.c and
 * attn_prefill_avx2.c the SIMD twins. kt is a key tile transposed,
 * [d][ATTN_PF_BK]; v a value tile
 * [nk][d]. The primitives take up to ATTN_PF_R query rows at once, so one
 * load of a key or value vector serves them all (one row at a time they
 * were load-bound); each row's arithmetic is the same, in the same order,
 * whatever the rows beside it. */
enum { ATTN_PF_R = 4 };
typedef struct attn_pf_ops {
    /* s[r * ATTN_PF_BK + k] = scale * q[r] . key k, every k < ATTN_PF_BK */
    void (*scores)(const float *const *q, int nr, const float *kt, int d, float scale, float *s);
    /* max(m, s[k] for k < nk), a NaN s[k] skipped: m < s[k] ? s[k] : m in
     * any order (a max is exact; only a zero's sign may differ, which no
     * later step sees). One row of 32 at a time in a scalar chain took
     * ~12% of an AVX2 prefill's attention at 4096 tokens. */
    float (*rowmax)(const float *s, int nk, float m);
    /* s[k] = exp(s[k] - m), k < nk; returns their sum */
    float (*expsum)(float *s, int nk, float m);
    /* o[r] = o[r] * c[r] + sum_k p[r * ATTN_PF_BK + k] v[k], k < nk */
    void (*pv)(const float *p, int nr, const float *v, int nk, int d, const float *c, float *const *o);
} attn_pf_ops;
extern const attn_pf_ops attn_pf_ops_ref;
extern const attn_pf_ops attn_pf_ops_avx512;
extern const attn_pf_ops attn_pf_ops_avx2;
extern const attn_pf_ops attn_pf_ops_neon, attn_pf_ops_neondp; /* attn_prefill_neon.c's two builds */

#endif
