/* test_sampler.c - sampling: greedy is argmax (ties to the lowest id),
 * seeds reproduce, top-k/top-p restrict the support, and temperature-1
 * sampling follows the softmax distribution. */
#include "test.h"
#include "sparq.h"

#include <math.h>
#include <stdlib.h>

/* ---- a naive reference of the whole chain, written from the llama.cpp
 * definitions (not from sampler.c): the probability of each id ---------- */
static void naive_probs(const float *logits_in, int V, const int32_t *hist, int n_hist, float rp, float pres,
                        float freq, float temp, int top_k, float top_p, float min_p, double *prob)
{
    double l[64];
    for (int i = 0; i < V; i++) l[i] = logits_in[i];
    for (int id = 0; id < V; id++) {
        int cnt = 0;
        for (int j = 0; j < n_hist; j++) cnt += hist[j] == id;
        if (!cnt) continue;
        l[id] = l[id] <= 0 ? l[id] * rp : l[id] / rp;
        l[id] -= cnt * freq + pres;
    }
    double mx = -1e300;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    /* min-p on the untempered softmax, then temperature softmax */
    double z0 = 0, z = 0, p0[64], p[64];
    for (int i = 0; i < V; i++) z0 += exp(l[i] - mx);
    for (int i = 0; i < V; i++) p0[i] = exp(l[i] - mx) / z0;
    int keep[64];
    for (int i = 0; i < V; i++) keep[i] = p0[i] >= min_p * (1.0 / z0) - 1e-12;
    for (int i = 0; i < V; i++) z += keep[i] ? exp((l[i] - mx) / temp) : 0;
    for (int i = 0; i < V; i++) p[i] = keep[i] ? exp((l[i] - mx) / temp) / z : 0;
    /* rank by p (ties: lower id first), keep top_k, then the top-p prefix */
    int order[64], n = 0;
    for (int i = 0; i < V; i++) if (keep[i]) order[n++] = i;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (p[order[b]] > p[order[a]] || (p[order[b]] == p[order[a]] && order[b] < order[a])) {
                int t = order[a]; order[a] = order[b]; order[b] = t;
            }
    if (top_k > 0 && top_k < n) n = top_k;
    if (top_p > 0 && top_p < 1) {
        double cum = 0;
        for (int i = 0; i < n; i++) { cum += p[order[i]]; if (cum >= top_p) { n = i + 1; break; } }
    }
    double tot = 0;
    for (int i = 0; i < V; i++) prob[i] = 0;
    for (int i = 0; i < n; i++) tot += p[order[i]];
    for (int i = 0; i < n; i++) prob[order[i]] = p[order[i]] / tot;
}

static void test_chain_against_naive(void)
{
    enum { V = 12 };
    const float logits[V] = { 1.0f, 2.5f, -0.5f, 2.4f, 0.3f, -2.0f, 1.7f, 0.0f, 2.5f, -1.0f, 0.9f, 1.2f };
    const int32_t hist[] = { 1, 3, 3, 5, 8, 8, 8 };
    const int n_hist = (int)(sizeof hist / sizeof hist[0]);
    struct { float temp, top_p, min_p, rp, pres, freq; int top_k; } cases[] = {
        { 1.0f, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, 0 },
        { 0.7f, 0.9f, 0.05f, 1.1f, 0.2f, 0.1f, 0 },
        { 1.5f, 1.0f, 0.2f, 1.0f, 0.5f, 0.0f, 5 },
        { 1.0f, 0.8f, 0.0f, 2.0f, 0.0f, 0.3f, 6 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sparq_sampler_params p = { cases[c].temp, cases[c].top_k, cases[c].top_p, 99, cases[c].min_p,
                                   cases[c].rp, cases[c].pres, cases[c].freq, 64 };
        double want[V];
        naive_probs(logits, V, hist, n_hist, cases[c].rp, cases[c].pres, cases[c].freq, cases[c].temp,
                    cases[c].top_k, cases[c].top_p, cases[c].min_p, want);
        /* the window holds the history only: rebuild the sampler per draw
         * so the drawn id never joins it (each draw from the same law) */
        int counts[V] = { 0 };
        const int N = 40000;
        sparq_sampler *s = NULL;
        for (int i = 0; i < N; i++) {
            p.seed = 1000 + (uint64_t)i * 7919;
            s = sparq_sampler_create(&p, V);
            for (int j = 0; j < n_hist; j++) sparq_sampler_accept(s, hist[j]);
            counts[sparq_sample(s, logits)]++;
            sparq_sampler_free(s);
        }
        for (int i = 0; i < V; i++) {
            double sd = sqrt(N * want[i] * (1 - want[i]));
            CHECK(fabs(counts[i] - N * want[i]) <= 5 * sd + 2, "case %zu id %d: %d draws, naive %.1f", c, i,
                  counts[i], N * want[i]);
        }
        /* greedy after penalties = naive argmax of the penalised logits */
        p.temp = 0.0f;
        s = sparq_sampler_create(&p, V);
        for (int j = 0; j < n_hist; j++) sparq_sampler_accept(s, hist[j]);
        double pl[V];
        naive_probs(logits, V, hist, n_hist, cases[c].rp, cases[c].pres, cases[c].freq, 1e-3f, 0, 1.0f, 0.0f, pl);
        int best = 0;
        for (int i = 1; i < V; i++) if (pl[i] > pl[best]) best = i;
        CHECK(sparq_sample(s, logits) == best, "case %zu: greedy after penalties picks %d", c, best);
        sparq_sampler_free(s);
    }
    /* the window: only the last n ids count */
    sparq_sampler_params p = { 0.0f, 0, 1.0f, 1, 0.0f, 100.0f, 0.0f, 0.0f, 2 };
    sparq_sampler *s = sparq_sampler_create(&p, V);
    sparq_sampler_accept(s, 1); /* falls out of a window of 2 */
    sparq_sampler_accept(s, 8);
    sparq_sampler_accept(s, 3);
    CHECK(sparq_sample(s, logits) == 1, "id 1 left the window, 8 is penalised");
    sparq_sampler_free(s);
    /* bad parameters are refused, with a message */
    char err[128];
    sparq_sampler_params bad = sparq_sampler_default_params();
    bad.temp = NAN;
    CHECK(sparq_sampler_check(&bad, err, sizeof err) < 0 && !sparq_sampler_create(&bad, V), "NaN temp");
    bad = sparq_sampler_default_params();
    bad.top_k = -1;
    CHECK(sparq_sampler_check(&bad, err, sizeof err) < 0, "negative top-k");
    bad = sparq_sampler_default_params();
    bad.top_p = 1.5f;
    CHECK(sparq_sampler_check(&bad, err, sizeof err) < 0, "top-p > 1");
    /* random default seed: two samplers differ, and say which seed */
    sparq_sampler_params d = sparq_sampler_default_params();
    sparq_sampler *a = sparq_sampler_create(&d, V), *b = sparq_sampler_create(&d, V);
    CHECK(a && b && sparq_sampler_seed(a) != sparq_sampler_seed(b), "random seeds differ");
    sparq_sampler_free(a);
    sparq_sampler_free(b);
    d.seed = 5;
    a = sparq_sampler_create(&d, V);
    CHECK(a && sparq_sampler_seed(a) == 5, "a fixed seed is kept");
    sparq_sampler_free(a);
}

int main(void)
{
    test_chain_against_naive();
    enum { V = 8 };
    float logits[V] = { 0.5f, 2.0f, 2.0f, -1.0f, 1.0f, 0.0f, 1.5f, -3.0f };
    sparq_sampler_params p = { 0.0f, 0, 1.0f, 1, 0.0f, 0.0f, 0.0f, 0.0f, 0 }; /* no min-p, no penalties */
    sparq_sampler *s = sparq_sampler_create(&p, V);
    CHECK(s && sparq_sample(s, logits) == 1, "greedy picks the first maximum");
    sparq_sampler_free(s);

    /* top-k = 1 and tiny top-p are greedy whatever the temperature */
    p.temp = 5.0f;
    p.top_k = 1;
    s = sparq_sampler_create(&p, V);
    int ok = 1;
    for (int i = 0; i < 100; i++) ok &= sparq_sample(s, logits) == 1;
    CHECK(ok, "top-k 1");
    sparq_sampler_free(s);
    p.top_k = 0;
    p.top_p = 0.01f;
    p.temp = 1.0f;
    s = sparq_sampler_create(&p, V);
    ok = 1;
    for (int i = 0; i < 100; i++) ok &= sparq_sample(s, logits) == 1;
    CHECK(ok, "top-p 0.01");
    sparq_sampler_free(s);

    /* top-k = 3 only ever returns the three best ids {1, 2, 6} */
    p.top_k = 3;
    p.top_p = 1.0f;
    s = sparq_sampler_create(&p, V);
    ok = 1;
    for (int i = 0; i < 2000; i++) {
        int id = sparq_sample(s, logits);
        ok &= id == 1 || id == 2 || id == 6;
    }
    CHECK(ok, "top-k 3 support");
    sparq_sampler_free(s);

    /* same seed, same sequence; frequencies match softmax within 5 sigma */
    p.top_k = 0;
    p.seed = 1234;
    sparq_sampler *a = sparq_sampler_create(&p, V), *b = sparq_sampler_create(&p, V);
    int counts[V] = { 0 }, same = 1;
    const int N = 200000;
    for (int i = 0; i < N; i++) {
        int x = sparq_sample(a, logits);
        same &= x == sparq_sample(b, logits);
        counts[x]++;
    }
    CHECK(same, "seeded sequences identical");
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i]);
    for (int i = 0; i < V; i++) {
        double pi = exp(logits[i]) / z, sd = sqrt(N * pi * (1 - pi));
        CHECK(fabs(counts[i] - N * pi) <= 5 * sd + 1, "id %d: %d draws, expected %.0f", i, counts[i], N * pi);
    }
    sparq_sampler_free(a);
    sparq_sampler_free(b);
    sparq_sampler_free(NULL);
    return test_summary("test_sampler");
}
