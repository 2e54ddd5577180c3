/* test_sampler.c - sampling: greedy is argmax (ties to the lowest id),
 * seeds reproduce, top-k/top-p restrict the support, temperature-1
 * sampling follows the softmax distribution, and the logit bias is added
 * before everything else (banned ids are never drawn). */
#include "test.h"
#include "sparq.h"

#include <float.h>
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

/* ---- logit bias, against a naive reference: logits + bias (summed per id,
 * -inf a ban) fed to naive_probs, i.e. the bias before every other stage -- */
static float lcg_uniform(uint64_t *st) /* [0, 1), independent of the library's RNG */
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(*st >> 40) / 16777216.0f;
}

static void naive_biased(const float *logits, int V, const int32_t *ids, const float *bias, int n, float *out)
{
    for (int i = 0; i < V; i++) out[i] = logits[i];
    for (int i = 0; i < n; i++) out[ids[i]] = bias[i] == -INFINITY ? -INFINITY : out[ids[i]] + bias[i];
}

static int naive_argmax(const float *l, int V)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

static void test_logit_bias(void)
{
    enum { V = 12 };
    const float logits[V] = { 1.0f, 2.5f, -0.5f, 2.4f, 0.3f, -2.0f, 1.7f, 0.0f, 2.5f, -1.0f, 0.9f, 1.2f };
    char err[160];

    /* greedy = argmax(logits + bias) over random lists (repeats, bans) */
    {
        enum { W = 64 };
        uint64_t st = 12345;
        int agree = 1, moved = 0;
        for (int trial = 0; trial < 300; trial++) {
            float lg[W], bl[W], bias[24];
            int32_t ids[24];
            for (int i = 0; i < W; i++) lg[i] = 8.0f * lcg_uniform(&st) - 4.0f;
            const int n = 1 + (int)(lcg_uniform(&st) * 23);
            for (int i = 0; i < n; i++) {
                ids[i] = (int32_t)(lcg_uniform(&st) * (i > 0 && lcg_uniform(&st) < 0.2f ? 1 : W));
                const float u = lcg_uniform(&st);
                bias[i] = u < 0.2f ? -INFINITY : u < 0.3f ? -100.0f : 10.0f * lcg_uniform(&st) - 5.0f;
            }
            naive_biased(lg, W, ids, bias, n, bl);
            sparq_sampler_params p = { 0.0f, 0, 1.0f, 1, 0.0f, 1.0f, 0.0f, 0.0f, 0 };
            sparq_sampler *s = sparq_sampler_create(&p, W);
            const int rc = s ? sparq_sampler_set_logit_bias(s, ids, bias, n, err, sizeof err) : -1;
            const int got = rc == 0 ? sparq_sample(s, lg) : -1, want = naive_argmax(bl, W);
            agree &= got == want;
            moved += want != naive_argmax(lg, W);
            sparq_sampler_free(s);
        }
        CHECK(agree, "greedy with a bias is argmax(logits + bias) in every trial");
        CHECK(moved > 50, "the trials exercise the bias (%d of 300 move the argmax)", moved);
    }

    /* a ban or -100 on the argmax (ids 1 and 8 tie at 2.5) moves it */
    sparq_sampler_params g = { 0.0f, 0, 1.0f, 1, 0.0f, 1.0f, 0.0f, 0.0f, 0 };
    sparq_sampler *s = sparq_sampler_create(&g, V);
    CHECK(s && sparq_sample(s, logits) == 1, "unbiased greedy: id 1");
    const int32_t top2[2] = { 1, 8 };
    const float ban2[2] = { -INFINITY, -100.0f };
    CHECK(sparq_sampler_set_logit_bias(s, top2, ban2, 1, err, sizeof err) == 0 && sparq_sample(s, logits) == 8,
          "-inf on id 1: the tie goes to id 8");
    CHECK(sparq_sampler_set_logit_bias(s, top2, ban2, 2, err, sizeof err) == 0 && sparq_sample(s, logits) == 3,
          "-inf on 1 and -100 on 8: id 3 (2.4)");
    const int32_t id0[1] = { 0 };
    const float up[1] = { 1.6f };
    CHECK(sparq_sampler_set_logit_bias(s, id0, up, 1, err, sizeof err) == 0 && sparq_sample(s, logits) == 0,
          "+1.6 on id 0 (1.0): it wins; the list was replaced, not appended to");
    CHECK(sparq_sampler_set_logit_bias(s, NULL, NULL, 0, err, sizeof err) == 0 && sparq_sample(s, logits) == 1,
          "n = 0 clears the bias");

    /* refused: out-of-vocabulary ids, NaN, +inf, n < 0, missing arrays,
     * banning everything; the sampler keeps its previous list */
    const int32_t ok_id[1] = { 1 };
    const float ok_b[1] = { -INFINITY };
    CHECK(sparq_sampler_set_logit_bias(s, ok_id, ok_b, 1, err, sizeof err) == 0, "ban id 1");
    struct { int32_t id; float b; const char *what; } bad[] = {
        { -1, 1.0f, "outside the vocabulary" }, { V, 1.0f, "outside the vocabulary" },
        { 3, NAN, "finite" }, { 3, INFINITY, "finite" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int32_t ids[2] = { 3, bad[i].id };
        const float b[2] = { 5.0f, bad[i].b };
        err[0] = 0;
        CHECK(sparq_sampler_set_logit_bias(s, ids, b, 2, err, sizeof err) == -1 && strstr(err, bad[i].what),
              "bad entry %zu refused: '%s'", i, err);
        CHECK(sparq_sample(s, logits) == 8, "after refusal %zu the old list (ban of id 1) still holds", i);
    }
    err[0] = 0;
    CHECK(sparq_sampler_set_logit_bias(s, ok_id, ok_b, -1, err, sizeof err) == -1 && err[0], "n < 0: '%s'", err);
    err[0] = 0;
    CHECK(sparq_sampler_set_logit_bias(s, NULL, ok_b, 1, err, sizeof err) == -1 && err[0], "NULL ids: '%s'", err);
    int32_t all[V + 1];
    float all_b[V + 1];
    for (int i = 0; i < V; i++) {
        all[i] = V - 1 - i;
        all_b[i] = -INFINITY;
    }
    all[V] = 4; /* a repeat: V + 1 entries, V distinct bans */
    all_b[V] = -INFINITY;
    err[0] = 0;
    CHECK(sparq_sampler_set_logit_bias(s, all, all_b, V + 1, err, sizeof err) == -1 && strstr(err, "every"),
          "banning every id refused: '%s'", err);
    CHECK(sparq_sample(s, logits) == 8, "after the ban-all refusal the old list still holds");
    all_b[5] = 0.0f; /* id V-1-5 = 6 stays allowed: every draw is 6 */
    CHECK(sparq_sampler_set_logit_bias(s, all, all_b, V + 1, err, sizeof err) == 0 && sparq_sample(s, logits) == 6,
          "all but id 6 banned: greedy 6");
    sparq_sampler_free(s);
    sparq_sampler_params hot = { 2.0f, 0, 1.0f, 3, 0.0f, 1.0f, 0.0f, 0.0f, 0 };
    s = sparq_sampler_create(&hot, V);
    int only6 = s && sparq_sampler_set_logit_bias(s, all, all_b, V + 1, err, sizeof err) == 0;
    for (int i = 0; only6 && i < 2000; i++) only6 &= sparq_sample(s, logits) == 6;
    CHECK(only6, "all but id 6 banned: every draw at temp 2 is 6");
    sparq_sampler_free(s);

    /* huge finite biases stay finite: FLT_MAX twice on id 9 makes it the
     * certain choice, greedy or not, instead of an inf - inf NaN */
    const int32_t big_id[2] = { 9, 9 };
    const float big[2] = { FLT_MAX, FLT_MAX };
    s = sparq_sampler_create(&hot, V);
    int nine = s && sparq_sampler_set_logit_bias(s, big_id, big, 2, err, sizeof err) == 0;
    for (int i = 0; nine && i < 200; i++) nine &= sparq_sample(s, logits) == 9;
    CHECK(nine, "FLT_MAX + FLT_MAX on id 9: every draw is 9");
    sparq_sampler_free(s);

    /* the whole chain with a bias (and penalties after it) follows the naive
     * law, and banned ids (-inf, or -100: p ~ e^-100) are never drawn */
    const int32_t hist[] = { 1, 3, 3, 5, 8, 8, 8 };
    const int n_hist = (int)(sizeof hist / sizeof hist[0]);
    /* ids 3 and 5 are in the window and change sign with the bias: the
     * repeat penalty divides or multiplies depending on the order */
    const int32_t bid[] = { 1, 4, 8, 10, 4, 6, 3, 5 };
    const float bval[] = { -INFINITY, 1.5f, -100.0f, 0.8f, 0.5f, -INFINITY, -3.0f, 4.0f };
    const int nb = (int)(sizeof bid / sizeof bid[0]);
    float bl[V];
    naive_biased(logits, V, bid, bval, nb, bl);
    struct { float temp, top_p, min_p, rp, pres, freq; int top_k; } cases[] = {
        { 1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0 },
        { 1.0f, 1.0f, 0.0f, 1.3f, 0.2f, 0.1f, 0 },
        { 0.8f, 0.9f, 0.05f, 1.1f, 0.0f, 0.3f, 6 },
        { 3.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 11 },
        { 1.0f, 1.0f, 0.0f, 2.5f, 0.0f, 0.0f, 0 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sparq_sampler_params p = { cases[c].temp, cases[c].top_k, cases[c].top_p, 0, cases[c].min_p,
                                   cases[c].rp, cases[c].pres, cases[c].freq, 64 };
        double want[V];
        naive_probs(bl, V, hist, n_hist, cases[c].rp, cases[c].pres, cases[c].freq, cases[c].temp,
                    cases[c].top_k, cases[c].top_p, cases[c].min_p, want);
        int counts[V] = { 0 };
        const int N = 30000;
        for (int i = 0; i < N; i++) {
            p.seed = 777 + (uint64_t)i * 104729;
            s = sparq_sampler_create(&p, V);
            for (int j = 0; j < n_hist; j++) sparq_sampler_accept(s, hist[j]);
            if (s && sparq_sampler_set_logit_bias(s, bid, bval, nb, err, sizeof err) == 0) counts[sparq_sample(s, logits)]++;
            sparq_sampler_free(s);
        }
        CHECK(counts[1] == 0 && counts[6] == 0 && counts[8] == 0, "case %zu: banned ids drawn %d %d %d times", c,
              counts[1], counts[6], counts[8]);
        for (int i = 0; i < V; i++) {
            double sd = sqrt(N * want[i] * (1 - want[i]));
            CHECK(fabs(counts[i] - N * want[i]) <= 5 * sd + 2, "bias case %zu id %d: %d draws, naive %.1f", c, i,
                  counts[i], N * want[i]);
        }
    }
    /* one long seeded run (the sampler's own RNG stream, no rebuilds) */
    s = sparq_sampler_create(&hot, V);
    int drawn[V] = { 0 };
    if (s && sparq_sampler_set_logit_bias(s, bid, bval, nb, err, sizeof err) == 0)
        for (int i = 0; i < 200000; i++) drawn[sparq_sample(s, logits)]++;
    CHECK(drawn[1] == 0 && drawn[6] == 0 && drawn[8] == 0 && drawn[4] > 0 && drawn[10] > 0,
          "temp 2, 200000 draws: banned ids never, the others yes (%d %d %d / %d %d)", drawn[1], drawn[6], drawn[8],
          drawn[4], drawn[10]);
    sparq_sampler_free(s);
}

/* Greedy picks what the one-line loop picks (naive_argmax: the first id of
 * the largest logit, a NaN never winning except at id 0) at sizes around the
 * sampler's 16 lanes and at a 128k vocabulary, over ties, -inf, signed
 * zeros and NaNs. */
static void test_greedy_argmax(void)
{
    const int sizes[] = { 1, 2, 15, 16, 17, 31, 32, 33, 47, 64, 100, 1000, 128256 };
    uint64_t st = 777;
    int agree = 1, cases = 0;
    char what[160] = "";
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        const int n = sizes[a];
        float *lg = malloc((size_t)n * sizeof *lg);
        sparq_sampler_params p = { 0.0f, 0, 1.0f, 1, 0.0f, 1.0f, 0.0f, 0.0f, 0 };
        sparq_sampler *s = sparq_sampler_create(&p, n);
        if (!lg || !s) {
            CHECK(0, "out of memory");
            free(lg);
            sparq_sampler_free(s);
            return;
        }
        for (int pat = 0; pat < 9; pat++)
            for (int trial = 0; trial < 4; trial++) {
                for (int i = 0; i < n; i++) {
                    const float u = lcg_uniform(&st);
                    switch (pat) {
                    case 0: lg[i] = 20.0f * u - 10.0f; break;                          /* distinct */
                    case 1: lg[i] = (float)(int)(4.0f * u); break;                     /* many ties */
                    case 2: lg[i] = u < 0.5f ? -INFINITY : 3.0f * u; break;            /* bans */
                    case 3: lg[i] = -INFINITY; break;                                  /* all banned */
                    case 4: lg[i] = u < 0.5f ? 0.0f : -0.0f; break;                    /* signed zeros */
                    case 5: lg[i] = u < 0.1f ? NAN : 5.0f * u; break;                  /* NaNs */
                    case 6: lg[i] = i == 0 ? NAN : 5.0f * u; break;                    /* NaN at id 0 */
                    case 7: lg[i] = i == n - 1 ? 100.0f : 5.0f * u; break;             /* max last */
                    default: lg[i] = i >= n - n % 16 && n % 16 ? 50.0f + u : u; break; /* max in the tail */
                    }
                }
                const int got = sparq_sample(s, lg), want = naive_argmax(lg, n);
                cases++;
                if (got != want && agree) {
                    agree = 0;
                    snprintf(what, sizeof what, "n %d pattern %d trial %d: %d, the loop %d", n, pat, trial, got, want);
                }
            }
        free(lg);
        sparq_sampler_free(s);
    }
    CHECK(agree, "greedy = the first id of the largest logit in all %d cases%s%s", cases, agree ? "" : "; first miss: ",
          what);
}

int main(void)
{
    test_chain_against_naive();
    test_logit_bias();
    test_greedy_argmax();
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
