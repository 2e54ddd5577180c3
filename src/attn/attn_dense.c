/* attn_dense.c - exact attention over every cached position (the reference).
 *
 * y_h = softmax(q_h K^T / sqrt(d)) V for the g heads of a group, each K and V
 * row read once for the whole group (attn_dense_group).
 * Transfer per step and KV head: 2*S*d reads (K, V) + 2*d written (this
 * step's k and v appended to the cache) = docs/ALGORITHMS.md's 2*S*d + 2*d. The reads
 * reported are what the kernels measured (attn_meter); the formula is
 * dense_transfer.
 */
#include "attn/attn.h"

static int dense_resolve(sparq_attn_params *p, int d, char *err, size_t err_size)
{
    (void)p; (void)d; (void)err; (void)err_size;
    return 0;
}

static size_t dense_scratch_floats(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)p; (void)d;
    return attn_pad16((size_t)g * (size_t)S);
}

static int dense_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    attn_trace *tr = step->trace;
    (void)state; (void)p;
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view v = *kv;
    v.meter = &m;
    attn_dense_group(&v, q, g, out, step->scratch->f);
    if (step->counts) {
        step->counts->read += attn_meter_total(&m);
        step->counts->written += 2 * (int64_t)kv->d;
    }
    if (tr) {
        if (tr->sel)
            for (int64_t i = 0; i < kv->S; i++) tr->sel[i] = (int32_t)i;
        tr->n_sel = kv->S;
        tr->n_i1 = 0;
        if (tr->alpha)
            for (int h = 0; h < g; h++) tr->alpha[h] = 1.0f;
    }
    return 0;
}

static int dense_n_parts(const sparq_attn_params *p, int64_t S)
{
    (void)p;
    return attn_dense_parts(S);
}

static int dense_attend_part(void *state, const sparq_attn_params *p, const attn_step *step, int part,
                             float *lse, const float *shared)
{
    (void)shared;
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    (void)state; (void)p;
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view v = *kv;
    v.meter = &m;
    attn_dense_part(&v, q, g, part, out, lse, step->scratch->f);
    if (step->counts) {
        step->counts->read += attn_meter_total(&m);
        if (part == 0) step->counts->written += 2 * (int64_t)kv->d; /* once per step */
    }
    return 0;
}

static int64_t dense_transfer(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)p; (void)g;
    return 2 * S * d + 2 * (int64_t)d;
}

const attn_policy attn_policy_dense = {
    .name = "dense",
    .summary = "every cached key and value",
    .in_all = 1,
    .needs = 0,
    .resolve = dense_resolve,
    .scratch_floats = dense_scratch_floats,
    .attend = dense_attend,
    .transfer_formula = dense_transfer,
    .n_parts = dense_n_parts,
    .attend_part = dense_attend_part,
};
