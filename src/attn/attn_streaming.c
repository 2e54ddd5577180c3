/* attn_streaming.c - LM-Infinite / StreamingLLM window (SparQ paper baseline).
 *
 * Reads the first n_sink positions (16 by default: "attention sinks") and
 * the most recent k - n_sink (the current token included); softmax over that
 * set. If k <= n_sink the sinks shrink to k - 1 so the current token is
 * always read. Transfer: 2*k*d (K, V rows) + 2*d (k, v appended), the
 * formula of docs/ALGORITHMS.md "Transfer formulas"; with k >= S every
 * position is read (dense).
 */
#include "attn/attn.h"
#include "util/err.h"

#include <stdio.h>

static int streaming_resolve(sparq_attn_params *p, int d, char *err, size_t err_size)
{
    (void)d;
    if (p->k == 0) p->k = 128;
    if (p->n_sink == 0) p->n_sink = 16;
    if (p->k < 1) {
        return err_set(err, err_size, "streaming: k=%d must be >= 1", p->k);
    }
    if (p->n_sink < 0) {
        return err_set(err, err_size, "streaming: n_sink=%d must be >= 0 (0 = 16)", p->n_sink);
    }
    return 0;
}

static size_t streaming_scratch_floats(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)d;
    const size_t kk = (size_t)(p->k < S ? p->k : S);
    return attn_pad16((size_t)g * kk) + attn_pad16(kk);
}

static int streaming_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    attn_trace *tr = step->trace;
    (void)state;
    const int64_t S = kv->S, k = p->k < S ? p->k : S;
    int32_t *sel = step->scratch->i;
    if (k == S) {
        for (int64_t i = 0; i < S; i++) sel[i] = (int32_t)i;
    } else {
        const int64_t sinks = p->n_sink < k ? p->n_sink : k - 1, recent = k - sinks;
        for (int64_t i = 0; i < sinks; i++) sel[i] = (int32_t)i;
        for (int64_t t = 0; t < recent; t++) sel[sinks + t] = (int32_t)(S - recent + t);
    }
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view v = *kv;
    v.meter = &m;
    attn_gather_group(&v, q, g, sel, k, out, step->scratch->f, NULL);
    if (step->counts) { /* measured by the kernels */
        step->counts->read += attn_meter_total(&m);
        step->counts->written += 2 * (int64_t)kv->d;
    }
    if (tr) {
        if (tr->sel)
            for (int64_t i = 0; i < k; i++) tr->sel[i] = sel[i];
        tr->n_sel = k;
        tr->n_i1 = 0;
        if (tr->alpha)
            for (int h = 0; h < g; h++) tr->alpha[h] = 1.0f;
    }
    return 0;
}

static int64_t streaming_transfer(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)g;
    const int64_t k = p->k < S ? p->k : S;
    return 2 * k * d + 2 * (int64_t)d;
}

const attn_policy attn_policy_streaming = {
    .name = "streaming",
    .summary = "sink positions + the most recent ones",
    .in_all = 1,
    .needs = 0,
    .resolve = streaming_resolve,
    .scratch_floats = streaming_scratch_floats,
    .attend = streaming_attend,
    .transfer_formula = streaming_transfer,
};
