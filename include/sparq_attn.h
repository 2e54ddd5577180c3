/* sparq_attn.h - the decode-attention kernels on caller's arrays.
 *
 * Runs one decode step of an attention policy (dense, sparq, oracle,
 * flexgen, h2o, streaming; docs/ALGORITHMS.md) for ONE KV head and its g query heads,
 * on plain row-major f32 arrays, without a model or a KV cache. For tests,
 * benchmarks and Python (ctypes):
 *
 *   sparq_attn_params p = sparq_attn_default_params();
 *   p.policy = "sparq"; p.r = 32; p.k = 128; p.l = 0;
 *   sparq_attn_run(&p, SPARQ_KV_F32, q, K, NULL, V, NULL, S, d, g,
 *                  out, sel, &n_sel, i1, alpha, &elements, err, sizeof err);
 *
 * Layouts (C row-major, last index fastest):
 *   q      [g][d]   the group's queries (RoPE applied, not scaled)
 *   K, V   [S][d]   keys and values of positions 0..S-1; S-1 is the current token
 *   KT     [d][S]   K transposed, or NULL (then computed from K)
 *   v_mean [d]      the mean of V SparQ reallocates to, or NULL (then the mean
 *                   of V over the S rows). Pass it to use a mean over more
 *                   positions than S, e.g. when a mask hides a suffix.
 *   out    [g][d]   the attention output per query head
 *   sel    [S]      room for the positions the step read (unordered), or NULL
 *   i1     [d]      room for SparQ's r query components, or NULL
 *   alpha  [g]      SparQ's alpha per head; FlexGen's kept softmax mass;
 *                   1 for the policies that renormalise; or NULL
 * kv_type SPARQ_KV_F16 rounds K, V (and KT) to IEEE half first and runs the
 * f16 kernels, as a context with an f16 cache does.
 *
 * A stateful policy (h2o) starts from a fresh state: all scores zero.
 * *elements = elements of cache traffic the step counted (reads + writes),
 * which equals sparq_attn_formula() for the same arguments.
 * Returns 0, or -1 with a one-line message in err[err_size].
 */
#ifndef SPARQ_ATTN_PUBLIC_H
#define SPARQ_ATTN_PUBLIC_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"

#ifdef __cplusplus
extern "C" {
#endif

SPARQ_API int sparq_attn_run(const sparq_attn_params *p, int kv_type, const float *q, const float *K,
                   const float *KT, const float *V, const float *v_mean, int64_t S, int d, int g,
                   float *out, int32_t *sel, int64_t *n_sel, int32_t *i1, float *alpha,
                   int64_t *elements, char *err, size_t err_size);

/* The policy's transfer formula (docs/ALGORITHMS.md) (elements per step and KV head)
 * after filling p's defaults for head size d; -1 (and err) if p is invalid. */
SPARQ_API int64_t sparq_attn_formula(const sparq_attn_params *p, int64_t S, int d, int g, char *err,
                           size_t err_size);

#ifdef __cplusplus
}
#endif
#endif
