/* attn_flexgen.c - FlexGen-style top-k attention (SparQ paper baseline).
 *
 * Exact softmax over all S positions; keep the k largest group-summed
 * weights and zero the rest WITHOUT renormalising, then multiply by V
 * (Graphcore's sparse_softmax_fixed_k; the golden "exact_topk" cases).
 * Transfer: S*d (K) + k*d (V of the kept rows) + 2*d (k, v appended) =
 * docs/ALGORITHMS.md "Transfer formulas": S*d + k*d + 2*d. With k >= S it is dense attention.
 */
#include "attn/attn.h"

static int flexgen_resolve(sparq_attn_params *p, int d, char *err, size_t err_size)
{
    (void)d; /* k does not depend on the head size */
    return attn_exact_topk_resolve("flexgen", p, err, err_size);
}

static int flexgen_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    (void)state;
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view v = *kv;
    v.meter = &m;
    attn_exact_topk_group(&v, q, g, p->k, 0, out, step->scratch, step->trace);
    if (step->counts) { /* measured by the kernels: K of every row, V of the kept */
        step->counts->read += attn_meter_total(&m);
        step->counts->written += 2 * (int64_t)kv->d;
    }
    return 0;
}

const attn_policy attn_policy_flexgen = {
    .name = "flexgen",
    .summary = "exact scores, top-k values, no renormalisation",
    .in_all = 1,
    .needs = 0,
    .resolve = flexgen_resolve,
    .scratch_floats = attn_exact_topk_scratch_floats,
    .attend = flexgen_attend,
    .transfer_formula = attn_exact_topk_transfer,
};
