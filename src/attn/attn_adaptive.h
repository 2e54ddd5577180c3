/* attn_adaptive.h - SparQ's per-head adaptive k (docs/ALGORITHMS.md
 * "Per-head adaptive k"): the entropy of a head's approximate scores and
 * the allotment of a group's budget by those entropies.
 *
 * The top-k paper (Synk, Hoover et al., Appendix A.2) measures that the
 * entropy of an attention row predicts how many positions a task needs
 * (Pearson r = 0.85 across task categories) and varies k across layers, not
 * heads; it gives no per-head rule. The rule here is ours: k_h proportional
 * to the head's entropy, clamped, the group's total unchanged.
 */
#ifndef SPARQ_ATTN_ADAPTIVE_H
#define SPARQ_ATTN_ADAPTIVE_H

#include <stdint.h>

/* Shannon entropy (nats) of one head's softmax held as attn_kt_exp keeps
 * it: p_i = scale[i / ATTN_EXP_BLOCK] * e[i], i < n (zeros contribute 0).
 * Summed in double. */
double attn_scores_entropy(const float *e, const float *scale, int64_t n);

/* Splits `total` positions among g heads in proportion to their entropies
 * H[0..g) (each >= 0), each share clamped to [lo, hi], the shares summing to
 * exactly `total` (requires 1 <= lo <= hi and g*lo <= total <= g*hi):
 *   1. x_h = clamp(lambda * H_h, lo, hi) with lambda such that sum x_h =
 *      total (found by bisection; heads with H_h = 0 stay at lo). If even
 *      lambda -> infinity leaves the sum short (heads at zero entropy), the
 *      heads with H_h > 0 take hi and those at zero share the rest equally;
 *      when every H_h is 0 that is total / g each.
 *   2. k_h = floor(x_h), then the remaining positions one each to the heads
 *      with the largest fractional parts (ties: the lower head), never
 *      above hi.
 * Equal entropies give every head total / g when g divides it. Returns 0,
 * or -1 if the requirements do not hold. work: g doubles of scratch. */
int attn_adaptive_allot(const double *H, int g, int64_t total, int64_t lo, int64_t hi, int64_t *k,
                        double *work);

#endif
