/* batch.c - what a server needs beyond one sequence's forward pass:
 * copying a cached prompt prefix from one context into a fresh one (the
 * server's prefix cache). sparq_decode_batch itself lives in forward.c,
 * beside the kernels a lone decode step uses, so both stay the same code.
 */
#include "core/model.h"
#include "tensor/quant.h"
#include "util/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sparq_context_copy_prefix(sparq_context *dst, const sparq_context *src, int64_t n, char *err, size_t err_size)
{
    if (!dst || !src || dst == src || dst->model != src->model) {
        return err_set(err, err_size, "copy_prefix: the contexts must be two of one model");
    }
    if (dst->kv.n != 0 || n < 0 || n > src->kv.n || n > dst->kv.cap || dst->kv.elem != src->kv.elem) {
        return err_set(err, err_size, "copy_prefix: cannot copy %lld of %lld positions into a context holding %lld of %lld "
                       "(KV types must match)", (long long)n, (long long)src->kv.n, (long long)dst->kv.n,
                       (long long)dst->kv.cap);
    }
    if (dst->policy->observe_prefill) { /* e.g. H2O's scores come from the prefill's attention */
        return err_set(err, err_size, "copy_prefix: the %s policy observes the prefill; prefill instead", dst->policy->name);
    }
    const kv_cache *s = &src->kv;
    const int d = s->d, nh = s->n_kv_head;
    float *k = malloc((size_t)2 * nh * d * sizeof(float));
    if (!k) {
        return err_set(err, err_size, "copy_prefix: out of memory");
    }
    float *v = k + (size_t)nh * d;
    /* rewritten through kv_write, position by position: K^T and the V sums
     * of dst come out exactly as its own prefill would have made them
     * (stored values round-trip through f32 unchanged) */
    for (int il = 0; il < s->n_layer; il++) {
        for (int64_t p = 0; p < n; p++) {
            for (int h = 0; h < nh; h++) {
                attn_kv_row_f32(kv_k(s, il, h), s->elem, d, p, d, k + (size_t)h * d);
                attn_kv_row_f32(kv_v(s, il, h), s->elem, d, p, d, v + (size_t)h * d);
            }
            kv_write(&dst->kv, il, p, k, v);
        }
    }
    free(k);
    dst->kv.n = n;
    return 0;
}
