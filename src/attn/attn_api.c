/* attn_api.c - sparq_attn.h: one policy step on caller's arrays.
 *
 * Builds the attn_kv_view a KV cache would provide (f32 or f16 copies, K^T,
 * the running sum of V), a throwaway policy state and scratch, and calls the
 * policy's attend_traced. Nothing here is on the model's hot path.
 */
#include "sparq_attn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"
#include "util/err.h"

/* float -> IEEE half, round to nearest even (what the cache stores). */
static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
    if (ax >= 0x477ff000u) return sign | 0x7c00u;  /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                         /* below 2^-14: subnormal half */
        if (ax <= 0x33000000u) return sign;         /* <= 2^-25: rounds to 0 */
        const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e, q = m >> shift, rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        return sign | (uint16_t)(q + (rem > half || (rem == half && (q & 1))));
    }
    const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

static int resolve_params(const sparq_attn_params *p, int d, sparq_attn_params *out,
                          const attn_policy **pol, char *err, size_t err_size)
{
    if (p) {
        *out = *p;
    } else {
        memset(out, 0, sizeof *out);
        out->l = -1;
    }
    *pol = attn_policy_find(out->policy);
    if (!*pol) {
        char known[ATTN_NAMES_MAX];
        return err_set(err, err_size, "attn: unknown policy '%s' (known: %s)", out->policy,
                       attn_policy_names(known, sizeof known, ", "));
    }
    return (*pol)->resolve(out, d, err, err_size);
}

int64_t sparq_attn_formula(const sparq_attn_params *p, int64_t S, int d, int g, char *err,
                           size_t err_size)
{
    sparq_attn_params pp;
    const attn_policy *pol;
    if (d < 1 || g < 1 || S < 1) {
        return err_set(err, err_size, "attn: bad shape S=%lld d=%d g=%d", (long long)S, d, g);
    }
    if (resolve_params(p, d, &pp, &pol, err, err_size)) return -1;
    return pol->transfer_formula(&pp, S, d, g);
}

/* dst = src (f32) in the cache's element type; n elements. */
static void *store_copy(const float *src, size_t n, int f16)
{
    if (!f16) {
        float *dst = malloc(n * sizeof *dst);
        if (dst) memcpy(dst, src, n * sizeof *dst);
        return dst;
    }
    uint16_t *dst = malloc(n * sizeof *dst);
    if (dst)
        for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
    return dst;
}

static float stored_value(const void *base, size_t at, int f16)
{
    return f16 ? fp16_to_fp32(((const uint16_t *)base)[at]) : ((const float *)base)[at];
}

int sparq_attn_run(const sparq_attn_params *p, sparq_attn_io *io, char *err, size_t err_size)
{
    if (!io) return err_set(err, err_size, "attn_run: io is required");
    const int kv_type = io->kv_type, d = io->d, g = io->g;
    const int64_t S = io->S;
    const float *q = io->q, *K = io->K, *KT = io->KT, *V = io->V, *v_mean = io->v_mean;
    float *out = io->out;
    io->n_sel = 0;
    io->elements = 0;
    if (!q || !K || !V || !out) {
        return err_set(err, err_size, "attn_run: q, K, V and out are required");
    }
    if (S < 1 || S > INT32_MAX || d < 1 || d > 65536 || g < 1 || g > 4096) {
        return err_set(err, err_size, "attn_run: bad shape S=%lld d=%d g=%d (need 1 <= S < 2^31, "
                       "1 <= d <= 65536, 1 <= g <= 4096)", (long long)S, d, g);
    }
    if ((size_t)S > SIZE_MAX / 8 / (size_t)d / (size_t)g) {
        return err_set(err, err_size, "attn_run: S=%lld x d=%d x g=%d overflows", (long long)S, d, g);
    }
    if (kv_type != SPARQ_KV_F32 && kv_type != SPARQ_KV_F16) {
        return err_set(err, err_size, "attn_run: kv_type=%d is not f32 (0) or f16 (1)", kv_type);
    }
    sparq_attn_params pp;
    const attn_policy *pol;
    if (resolve_params(p, d, &pp, &pol, err, err_size)) return -1;

    const int f16 = kv_type == SPARQ_KV_F16;
    const size_t n = (size_t)S * (size_t)d;
    int rc = -1;
    void *state = NULL, *kbuf = NULL, *vbuf = NULL, *ktbuf = NULL;
    float *vsum = NULL, *fs = NULL, *alpha_buf = NULL;
    int32_t *is = NULL, *sel_buf = NULL, *i1_buf = NULL;

    kbuf = store_copy(K, n, f16);
    vbuf = store_copy(V, n, f16);
    if (KT) {
        ktbuf = store_copy(KT, n, f16);
    } else if (kbuf) { /* transpose what is stored, so K^T == K exactly */
        ktbuf = malloc(n * (f16 ? 2 : 4));
        if (ktbuf)
            for (int64_t s = 0; s < S; s++)
                for (int j = 0; j < d; j++) {
                    const size_t from = (size_t)s * d + j, to = (size_t)j * S + s;
                    if (f16) ((uint16_t *)ktbuf)[to] = ((const uint16_t *)kbuf)[from];
                    else ((float *)ktbuf)[to] = ((const float *)kbuf)[from];
                }
    }
    vsum = malloc((size_t)d * sizeof *vsum);
    sel_buf = malloc((size_t)S * sizeof *sel_buf);
    i1_buf = malloc((size_t)d * sizeof *i1_buf);
    alpha_buf = malloc((size_t)g * sizeof *alpha_buf);
    const size_t n_scr = pol->scratch_floats(&pp, S, d, g);
    const size_t scr_bytes = attn_pad16(n_scr ? n_scr : 1) * sizeof(float);
    void *pf = NULL, *pi = NULL; /* 64-byte aligned, as attn_scratch asks */
    if (posix_memalign(&pf, 64, scr_bytes) == 0) fs = pf;
    if (posix_memalign(&pi, 64, scr_bytes) == 0) is = pi;
    if (!kbuf || !vbuf || !ktbuf || !vsum || !sel_buf || !i1_buf || !alpha_buf || !fs || !is) {
        err_set(err, err_size, "attn_run: out of memory for S=%lld d=%d", (long long)S, d);
        goto done;
    }
    for (int j = 0; j < d; j++) { /* the view carries a sum; the kernel divides by S */
        double a = 0;
        if (v_mean) a = (double)v_mean[j] * (double)S;
        else
            for (int64_t s = 0; s < S; s++) a += stored_value(vbuf, (size_t)s * d + j, f16);
        vsum[j] = (float)a;
    }
    if (pol->state_create) {
        attn_shape shape = { 1, 1, g, d, S };
        if (pol->state_create(&pp, &shape, &state)) {
            err_set(err, err_size, "attn_run: cannot create %s state for S=%lld", pol->name,
                    (long long)S);
            goto done;
        }
    }

    attn_kv_view kv = { S, d, f16 ? KV_F16 : KV_F32, kbuf, vbuf, ktbuf, S, vsum, NULL, NULL, 0, 0 };
    char step_err[256] = "";
    attn_scratch scr = { fs, n_scr, is, step_err, sizeof step_err };
    attn_counts cnt = { 0, 0 };
    attn_trace tr = { sel_buf, 0, i1_buf, 0, alpha_buf };
    const attn_step step = { .layer = 0, .kv_head = 0, .kv = &kv, .q = q, .g = g, .out = out,
                             .scratch = &scr, .counts = &cnt, .trace = &tr };
    if (pol->attend(state, &pp, &step)) {
        err_set(err, err_size, "attn_run: %s: %s", pol->name, step_err[0] ? step_err : "failed");
        goto done;
    }
    if (io->sel) memcpy(io->sel, sel_buf, (size_t)tr.n_sel * sizeof *io->sel);
    io->n_sel = tr.n_sel;
    if (io->i1) memcpy(io->i1, i1_buf, (size_t)tr.n_i1 * sizeof *io->i1);
    if (io->alpha) memcpy(io->alpha, alpha_buf, (size_t)g * sizeof *io->alpha);
    io->elements = cnt.read + cnt.written;
    rc = 0;
done:
    if (state && pol->state_free) pol->state_free(state);
    free(kbuf); free(vbuf); free(ktbuf); free(vsum); free(fs); free(is);
    free(sel_buf); free(i1_buf); free(alpha_buf);
    return rc;
}
