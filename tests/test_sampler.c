/* test_sampler.c - sampling: greedy is argmax (ties to the lowest id),
 * seeds reproduce, top-k/top-p restrict the support, and temperature-1
 * sampling follows the softmax distribution. */
#include "test.h"
#include "sparq.h"

int main(void)
{
    enum { V = 8 };
    float logits[V] = { 0.5f, 2.0f, 2.0f, -1.0f, 1.0f, 0.0f, 1.5f, -3.0f };
    sparq_sampler_params p = { 0.0f, 0, 1.0f, 1 };
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
