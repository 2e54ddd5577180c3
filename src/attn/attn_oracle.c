/* attn_oracle.c - exact top-k attention ("oracle" in SparQ's ablations).
 *
 * Exact scores for all S positions; keep the k positions with the largest
 * group-summed softmax weights; each head's softmax is renormalised over the
 * kept positions. The paper's oracle is hypothetical (it gets the top k for
 * free); this one really reads every key, so it is counted like FlexGen:
 * S*d (K) + k*d (V of the kept rows) + 2*d (k, v appended). k >= S: dense.
 */
#include "attn/attn.h"

static int oracle_resolve(sparq_attn_params *p, int d, char *err, size_t err_size)
{
    (void)d; /* k does not depend on the head size */
    return attn_exact_topk_resolve("oracle", p, err, err_size);
}

static int oracle_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    (void)state;
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view v = *kv;
    v.meter = &m;
    /* Keeping everything is dense attention; the dense kernel makes that
     * an identity to the last bit rather than to f32 rounding of the
     * renormalised selection. select_always takes the selecting path
     * anyway, so a test can hold that path to dense. */
    if (p->k >= kv->S && !step->trace && !p->select_always) attn_dense_group(&v, q, g, out, step->scratch->f);
    else attn_exact_topk_group(&v, q, g, p->k, 1, out, step->scratch, step->trace);
    if (step->counts) { /* measured by the kernels */
        step->counts->read += attn_meter_total(&m);
        step->counts->written += 2 * (int64_t)kv->d;
    }
    return 0;
}

const attn_policy attn_policy_oracle = {
    .name = "oracle",
    .summary = "exact top-k, renormalised",
    .in_all = 1,
    .needs = 0,
    .resolve = oracle_resolve,
    .scratch_floats = attn_exact_topk_scratch_floats,
    .attend = oracle_attend,
    .transfer_formula = attn_exact_topk_transfer,
};
