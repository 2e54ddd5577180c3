/* attn_params.c - attention options to sparq_attn_params (contract in
 * attn_params.h), the defaults and the public ratio arithmetic (sparq.h).
 *
 * Map:
 *   sparq_attn_default_params                  the defaults
 *   attn_parse_ratio, attn_sparq_ratio         a transfer ratio
 *   sparq_attn_params_from_ratio               the same, public
 *   attn_opts_init, attn_opts_params           options to parameters
 *   attn_params_equal                          one attention, asked twice
 */
#include "attn/attn_params.h"
#include "util/err.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sparq_attn_params sparq_attn_default_params(void)
{
    sparq_attn_params p;
    memset(&p, 0, sizeof p);
    p.policy = "dense";
    p.l = -1;
    return p;
}

static int same_name(const char *a, const char *b, const char *dflt)
{
    return strcmp(a ? a : dflt, b ? b : dflt) == 0;
}

int attn_params_equal(const sparq_attn_params *a, const sparq_attn_params *b)
{
    /* every field once: a field added to the struct must be added here */
    _Static_assert(offsetof(sparq_attn_params, k_min) + sizeof(int) == 2 * sizeof(const char *) + 15 * sizeof(int) &&
                       sizeof(sparq_attn_params) <= offsetof(sparq_attn_params, k_min) + sizeof(int) + sizeof(void *),
                   "sparq_attn_params changed: update attn_params_equal");
    return same_name(a->policy, b->policy, "dense") && same_name(a->index, b->index, "exact") && a->r == b->r &&
           a->k == b->k && a->l == b->l && a->select_logits == b->select_logits && a->no_realloc == b->no_realloc &&
           a->n_sink == b->n_sink && a->topk_schedule == b->topk_schedule && a->index_key_type == b->index_key_type &&
           a->ivf_nlist == b->ivf_nlist && a->ivf_nprobe == b->ivf_nprobe && a->hnsw_ef_search == b->hnsw_ef_search &&
           a->topk_check == b->topk_check && a->select_always == b->select_always && a->adaptive_k == b->adaptive_k &&
           a->k_min == b->k_min;
}

/* ---- ratios ------------------------------------------------------------------------- */

double attn_parse_ratio(const char *s)
{
    char *end;
    double num = strtod(s, &end), den = 1;
    if (end == s) return -1;
    if (*end == '/') {
        const char *d = end + 1;
        den = strtod(d, &end);
        if (end == d) return -1;
    }
    if (*end || !(num > 0) || !(den > 0) || num / den > 1) return -1;
    return num / den;
}

/* The paper's recipe spends the budget evenly: r = d*ratio (the S*r term),
 * then k takes what is left. */
int attn_sparq_ratio(double ratio, int64_t S, int d, int *r_out, int *k_out)
{
    double dense = 2.0 * (double)S * d + 2.0 * d;
    int r = (int)(d * ratio + 0.5);
    if (r < 1) r = 1;
    if (r > d) r = d;
    double left = ratio * dense - (double)S * r - 4.0 * d;
    int64_t k = (int64_t)(left / (2.0 * d));
    if (k < 1) return -1;
    if (k > S) k = S;
    *r_out = r;
    *k_out = (int)(k > INT_MAX ? INT_MAX : k);
    return 0;
}

int sparq_attn_params_from_ratio(sparq_attn_params *p, const char *ratio, int64_t n_ctx, int head_dim,
                                 const char *what, char *err, size_t err_size)
{
    if (!what) what = "ratio";
    const double x = ratio ? attn_parse_ratio(ratio) : -1;
    if (x < 0) {
        return err_set(err, err_size, "%s '%s' must be a fraction in (0, 1], e.g. 1/8", what, ratio ? ratio : "(null)");
    }
    if (!p->policy || strcmp(p->policy, "sparq") != 0) {
        return err_set(err, err_size, "%s needs --attn sparq", what);
    }
    if (n_ctx < 1 || head_dim < 1 || attn_sparq_ratio(x, n_ctx, head_dim, &p->r, &p->k)) {
        return err_set(err, err_size, "%s %s is too small for context %lld and head size %d", what, ratio,
                       (long long)n_ctx, head_dim);
    }
    if (p->l < 0) p->l = p->k / 4;
    return 0;
}

/* ---- options ------------------------------------------------------------------------ */

void attn_opts_init(attn_opts *o)
{
    memset(o, 0, sizeof *o);
    o->attn = "dense";
    o->l = -1;
}

int attn_opts_params(const attn_opts *o, int64_t S, int d, sparq_attn_params *out, char *err, size_t err_size)
{
    *out = sparq_attn_default_params();
    out->policy = o->attn;
    out->r = o->r;
    const int topk = strcmp(o->attn, "topk") == 0;
    out->k = strcmp(o->attn, "sparq") == 0 ? o->k : topk && o->topk_k ? o->topk_k : o->attn_k;
    out->index = o->index;
    out->ivf_nlist = o->ivf_nlist;
    out->ivf_nprobe = o->ivf_nprobe;
    out->hnsw_ef_search = o->hnsw_ef;
    out->topk_check = o->topk_check;
    if (o->schedule) {
        if (strcmp(o->schedule, "uniform") == 0) out->topk_schedule = SPARQ_TOPK_UNIFORM;
        else if (strcmp(o->schedule, "linear") == 0) out->topk_schedule = SPARQ_TOPK_LINEAR;
        else {
            return err_set(err, err_size, "--topk-schedule must be uniform or linear, not '%s'", o->schedule);
        }
    }
    if (o->key_type) {
        if (strcmp(o->key_type, "f16") == 0) out->index_key_type = SPARQ_KEY_F16;
        else if (strcmp(o->key_type, "bf16") == 0) out->index_key_type = SPARQ_KEY_BF16;
        else if (strcmp(o->key_type, "i8") == 0 || strcmp(o->key_type, "int8") == 0)
            out->index_key_type = SPARQ_KEY_I8;
        else {
            return err_set(err, err_size, "--index-key-type must be f16, bf16 or i8, not '%s'", o->key_type);
        }
    }
    out->l = o->l;
    out->no_realloc = o->no_realloc;
    if (o->k_min && !o->adaptive_k) {
        return err_set(err, err_size, "--sparq-k-min applies only with --sparq-adaptive-k");
    }
    out->adaptive_k = o->adaptive_k != 0;
    out->k_min = o->k_min;
    out->n_sink = o->n_sink;
    if (strcmp(o->attn, "streaming") == 0) { /* sinks are part of the k kept */
        const int sinks = o->n_sink > 0 ? o->n_sink : 16, k = o->attn_k > 0 ? o->attn_k : 128;
        if (sinks >= k) { /* the current token must fit beside the sinks */
            return err_set(err, err_size, "--n-sink %d must be smaller than the positions kept (--attn-k %d)", sinks, k);
        }
    }
    if (o->select) {
        if (strcmp(o->select, "probs") == 0) out->select_logits = 0;
        else if (strcmp(o->select, "logits") == 0) out->select_logits = 1;
        else {
            return err_set(err, err_size, "--sparq-select must be probs or logits, not '%s'", o->select);
        }
    }
    if (o->ratio) return sparq_attn_params_from_ratio(out, o->ratio, S, d, "--sparq-ratio", err, err_size);
    return 0;
}
