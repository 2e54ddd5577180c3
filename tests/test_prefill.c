/* test_prefill.c - tiled causal prefill attention (attn/attn_prefill.h)
 * against a naive causal attention written here: full score rows, softmax
 * in double, weighted sum in double, for f32 and f16 KV, odd lengths, a
 * cache already holding tokens (pos0 > 0), several group sizes g and head
 * sizes; and H2O's column sums against the naive softmax weights.
 */
#include "attn/attn_prefill.h"
#include "tensor/quant.h"
#include "test.h"

#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Naive: token t (position pos0 + t), head j; K, V as float (already
 * rounded through f16 when the cache is f16). */
static void naive(const float *K, const float *V, int d, int64_t pos0, int n, int g, const float *q,
                  double *out, double *colsum)
{
    const int64_t S = pos0 + n;
    double *w = malloc((size_t)S * sizeof *w);
    if (!w) return;
    for (int64_t s = 0; s < S; s++) colsum[s] = 0;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < g; j++) {
            const float *qi = q + ((size_t)t * g + j) * d;
            const int64_t vis = pos0 + t + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t s = 0; s < vis; s++) {
                double dot = 0;
                for (int e = 0; e < d; e++) dot += (double)qi[e] * K[s * d + e];
                w[s] = dot / sqrt((double)d);
                if (w[s] > mx) mx = w[s];
            }
            for (int64_t s = 0; s < vis; s++) sum += (w[s] = exp(w[s] - mx));
            double *o = out + ((size_t)t * g + j) * d;
            for (int e = 0; e < d; e++) o[e] = 0;
            for (int64_t s = 0; s < vis; s++) {
                colsum[s] += w[s] / sum;
                for (int e = 0; e < d; e++) o[e] += w[s] / sum * V[s * d + e];
            }
        }
    free(w);
}

typedef void (*block_fn)(const attn_kv_view *, const attn_pf_rows *, float *, float *);
typedef void (*colsum_fn)(const attn_kv_view *, int64_t, int, const attn_pf_rows *, const float *, float *, float *);

static void run_case(int f16, int d, int g, int64_t pos0, int n)
{
    const int64_t S = pos0 + n;
    float *K = malloc((size_t)S * d * sizeof(float)), *V = malloc((size_t)S * d * sizeof(float));
    uint16_t *Kh = malloc((size_t)S * d * 2), *Vh = malloc((size_t)S * d * 2);
    float *q = malloc((size_t)n * g * d * sizeof(float)), *out = malloc((size_t)n * g * d * sizeof(float));
    float *ml = malloc((size_t)n * g * 2 * sizeof(float)), *cs = malloc((size_t)(S + ATTN_PF_BK) * sizeof(float));
    double *ref = malloc((size_t)n * g * d * sizeof(double)), *rcs = malloc((size_t)S * sizeof(double));
    float *scratch = aligned_alloc(64, (attn_prefill_scratch(d, g) * sizeof(float) + 63) / 64 * 64);
    if (!K || !V || !Kh || !Vh || !q || !out || !ml || !cs || !ref || !rcs || !scratch) {
        CHECK(0, "out of memory");
        return;
    }
    for (int64_t i = 0; i < S * d; i++) {
        K[i] = 2.0f * unif(); /* scores of a few units: a peaked softmax */
        V[i] = unif();
        if (f16) {
            Kh[i] = fp32_to_fp16(K[i]);
            Vh[i] = fp32_to_fp16(V[i]);
            K[i] = fp16_to_fp32(Kh[i]);
            V[i] = fp16_to_fp32(Vh[i]);
        }
    }
    for (int64_t i = 0; i < (int64_t)n * g * d; i++) q[i] = 2.0f * unif();
    naive(K, V, d, pos0, n, g, q, ref, rcs);
    attn_kv_view kv = { 0 };
    kv.S = S;
    kv.d = d;
    kv.elem = f16 ? KV_F16 : KV_F32;
    kv.K = f16 ? (const void *)Kh : (const void *)K;
    kv.V = f16 ? (const void *)Vh : (const void *)V;
    const block_fn bf[2] = { attn_prefill_block_ref, attn_prefill_block };
    const colsum_fn cf[2] = { attn_prefill_colsum_ref, attn_prefill_colsum };
    const int bq = attn_prefill_bq(g);
    for (int simd = 0; simd < 2; simd++) {
        for (int t0 = 0; t0 < n; t0 += bq) {
            const int nt = n - t0 < bq ? n - t0 : bq;
            const attn_pf_rows b = attn_pf_rows_packed(pos0, t0, nt, g, d, q, out);
            bf[simd](&kv, &b, ml + (size_t)t0 * g * 2, scratch);
        }
        double worst = 0;
        for (int64_t i = 0; i < (int64_t)n * g * d; i++) {
            const double e = fabs(out[i] - ref[i]);
            if (e > worst) worst = e;
        }
        for (int64_t k0 = 0; k0 < S; k0 += ATTN_PF_BK) {
            const int nk = S - k0 < ATTN_PF_BK ? (int)(S - k0) : ATTN_PF_BK;
            const attn_pf_rows b = attn_pf_rows_packed(pos0, 0, n, g, d, q, NULL);
            cf[simd](&kv, k0, nk, &b, ml, cs + k0, scratch);
        }
        double worst_cs = 0, total = 0;
        for (int64_t s = 0; s < S; s++) {
            const double e = fabs(cs[s] - rcs[s]) / (1.0 + rcs[s]);
            if (e > worst_cs) worst_cs = e;
            total += cs[s];
        }
        CHECK(worst <= 2e-6, "%s f%d d=%d g=%d pos0=%lld n=%d: output max error %g", simd ? "simd" : "ref",
              f16 ? 16 : 32, d, g, (long long)pos0, n, worst);
        CHECK(worst_cs <= 2e-6, "%s f%d d=%d g=%d pos0=%lld n=%d: colsum max error %g", simd ? "simd" : "ref",
              f16 ? 16 : 32, d, g, (long long)pos0, n, worst_cs);
        /* every row's weights sum to one */
        CHECK_NEAR(total, (double)n * g, 1e-3 * n * g);
    }
    free(K); free(V); free(Kh); free(Vh); free(q); free(out); free(ml); free(cs); free(ref); free(rcs);
    free(scratch);
}

/* The SIMD exps never hand a subnormal to the FMAs (Intel cores take a
 * microcode assist for each: llama-3.2-1b's prefill at depth 2048 ran 3.9x
 * slower): e^x within 1e-6 of expf (so normal) for x >= -87, exactly 0
 * below, -inf included. The plain-C ops use expf, the reference. */
static void no_subnormal_weights(void)
{
    /* the level running (SPARQ_CPU or the CPU's best) */
    const attn_pf_ops *ops = attn_pf_ops_at(cpu_level_get());
    if (ops == &attn_pf_ops_ref) {
        test_skip("no prefill twins at SIMD level ref (the reference uses expf)");
        return;
    }
    enum { N = 301 };
    const float m = 3.5f;
    float s[N], in[N];
    for (int k = 0; k < N; k++) in[k] = s[k] = m - 0.7f * (float)k; /* x = s - m from 0 to -210 */
    in[N - 1] = s[N - 1] = -INFINITY;
    const float sum = ops->expsum(s, N, m);
    int bad_near = 0, bad_zero = 0, subnormal = 0;
    double want_sum = 0;
    for (int k = 0; k < N; k++) {
        const float x = in[k] - m;
        subnormal += fpclassify(s[k]) == FP_SUBNORMAL;
        if (x >= -87.0f) {
            const double e = exp((double)x);
            want_sum += e;
            bad_near += !(fabs(s[k] - e) <= 1e-6 * e);
        } else {
            bad_zero += s[k] != 0.0f;
        }
    }
    CHECK(subnormal == 0, "%d subnormal weights", subnormal);
    CHECK(bad_near == 0, "%d weights off expf above -87", bad_near);
    CHECK(bad_zero == 0, "%d weights not 0 below -87", bad_zero);
    CHECK_NEAR(sum, want_sum, 1e-6 * want_sum);
}

/* The level's row max equals the plain loop's on every length up to a
 * tile (the vector body and the tails), with the maximum in each place,
 * NaN scores (skipped), -inf and a running max above every score. */
static void row_max(void)
{
    const attn_pf_ops *ops = attn_pf_ops_at(cpu_level_get());
    if (ops == &attn_pf_ops_ref) {
        test_skip("no prefill twins at SIMD level ref");
        return;
    }
    float s[ATTN_PF_BK];
    int bad = 0, cases = 0;
    for (int nk = 1; nk <= ATTN_PF_BK; nk++)
        for (int at = 0; at < nk; at++)
            for (int kind = 0; kind < 4; kind++) {
                for (int k = 0; k < nk; k++) s[k] = -1.0f - 0.25f * (float)((k * 7) % 13);
                s[at] = 3.0f + (float)at;
                if (kind == 1) s[(at + 1) % nk] = NAN;
                if (kind == 2) s[(at + nk - 1) % nk] = -INFINITY;
                const float m = kind == 3 ? 100.0f : -INFINITY;
                float want = m;
                for (int k = 0; k < nk; k++) want = s[k] > want ? s[k] : want;
                const float got = ops->rowmax(s, nk, m);
                bad += !(got == want);
                cases++;
            }
    CHECK(bad == 0, "row max differs from the loop's in %d of %d cases", bad, cases);
}

int main(void)
{
    no_subnormal_weights();
    row_max();
    const int gs[] = { 1, 3, 4, 8 };
    for (int f16 = 0; f16 < 2; f16++)
        for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++) {
            run_case(f16, 64, gs[gi], 0, 1);
            run_case(f16, 64, gs[gi], 0, 77);
            run_case(f16, 48, gs[gi], 13, 45);
            run_case(f16, 128, gs[gi], 100, 33);
        }
    run_case(1, 64, 2, 0, test_quick() ? 200 : 700); /* many key tiles, causal edges inside tiles */
    return test_summary("test_prefill");
}
