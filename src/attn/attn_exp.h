/* attn_exp.h - the constants of the softmax exp shared by the SIMD kernels
 * (attn_avx512.h's exp_neg, attn_avx2.h's exp_neg8 and exp_sub8), so that every
 * build rounds the same polynomial: x = n ln2 + t with ln2 in two parts (t
 * exact to ~1e-10), e^t by a degree-5 polynomial fitted by Remez exchange
 * for minimax relative error (7.5e-8), about 2e-7 relative to expf. */
#ifndef SPARQ_ATTN_EXP_H
#define SPARQ_ATTN_EXP_H

/* The exps return exactly 0 below ATTN_EXP_MIN (e^-87 = 1.6e-38, still
 * normal; in log2 units 2^-125 for exp_sub), never a subnormal: Intel
 * cores take a microcode assist for each one an FMA reads or writes. */
#define ATTN_EXP_MIN    (-87.0f)
#define ATTN_EXP2_MIN   (-125.0f)
/* SparQ's approximate scores are a product, scale[h][block] * e[h][i]
 * (attn_kt_exp), summed over a group's heads: each factor is stored as
 * exactly 0 below 2^-63, so every product is 0 or at least 2^-126, a
 * normal float. A probability below 2^-63 never decides a top-k that
 * matters, and without the flush a long context whose logits spread wide
 * (far blocks, spiky heads) made the group sums 9% of a batched decode
 * step in microcode assists. */
#define ATTN_SCORE_MIN  0x1p-63f
#define ATTN_EXP_LOG2E  1.44269504088896341f
#define ATTN_EXP_LN2_HI 0.693145751953125f
#define ATTN_EXP_LN2_LO 1.428606765330187045e-06f
/* e^t = ((((C5 t + C4) t + C3) t + C2) t + C1) t + C0 */
#define ATTN_EXP_C5 8.297655080e-03f
#define ATTN_EXP_C4 4.191538199e-02f
#define ATTN_EXP_C3 1.666757473e-01f
#define ATTN_EXP_C2 4.999889485e-01f
#define ATTN_EXP_C1 9.999996920e-01f
#define ATTN_EXP_C0 1.000000072e+00f

#endif
