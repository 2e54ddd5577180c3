/* sparq_attn.h - the decode-attention kernels on caller's arrays.
 *
 * Runs one decode step of an attention policy (dense, sparq, oracle,
 * flexgen, h2o, streaming; docs/ALGORITHMS.md) for ONE KV head and its g query heads,
 * on plain row-major f32 arrays, without a model or a KV cache. For tests,
 * benchmarks and Python (ctypes):
 *
 *   sparq_attn_params p = sparq_attn_default_params();
 *   p.policy = "sparq"; p.r = 32; p.k = 128; p.l = 0;
 *   sparq_attn_io io = { .kv_type = SPARQ_KV_F32, .S = S, .d = d, .g = g,
 *                        .q = q, .K = K, .V = V, .out = out };
 *   if (sparq_attn_run(&p, &io, err, sizeof err)) ...;   (then io.elements)
 *
 * The arrays of sparq_attn_io (C row-major, last index fastest):
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
 * The call sets io->n_sel (positions in sel) and io->elements (elements of
 * cache traffic the step counted, reads + writes), which equals
 * sparq_attn_formula() for the same arguments.
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

/* One KV head's step: its shape, the arrays it reads and the room it writes
 * (layouts above). Plain pointers and integers, so ctypes can fill it. */
typedef struct sparq_attn_io {
    int kv_type;        /* SPARQ_KV_F32 or SPARQ_KV_F16 */
    int d, g;           /* head size, query heads of the KV head */
    int64_t S;          /* positions, the current one included */
    const float *q, *K, *KT, *V, *v_mean; /* KT and v_mean may be NULL */
    float *out;
    int32_t *sel;       /* may be NULL */
    int32_t *i1;        /* may be NULL */
    float *alpha;       /* may be NULL */
    int64_t n_sel;      /* set by the call */
    int64_t elements;   /* set by the call */
} sparq_attn_io;

SPARQ_API int sparq_attn_run(const sparq_attn_params *p, sparq_attn_io *io, char *err, size_t err_size);

/* The policy's transfer formula (docs/ALGORITHMS.md) (elements per step and KV head)
 * after filling p's defaults for head size d; -1 (and err) if p is invalid. */
SPARQ_API int64_t sparq_attn_formula(const sparq_attn_params *p, int64_t S, int d, int g, char *err,
                           size_t err_size);

#ifdef __cplusplus
}
#endif
#endif
