/* sampler.c - next-token choice from logits: greedy, temperature, top-k,
 * top-p. The sampler owns its RNG (xorshift64*), seeded explicitly. */
#include "sparq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float p; int32_t id; } prob_id;

struct sparq_sampler {
    sparq_sampler_params p;
    int      n_vocab;
    uint64_t rng;
    prob_id *buf;            /* [n_vocab] */
};

sparq_sampler_params sparq_sampler_default_params(void)
{
    sparq_sampler_params p = { 0.8f, 40, 0.95f, 42 };
    return p;
}

sparq_sampler *sparq_sampler_create(const sparq_sampler_params *p, int n_vocab)
{
    if (n_vocab <= 0) return NULL;
    sparq_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->buf = malloc((size_t)n_vocab * sizeof *s->buf);
    if (!s->buf) {
        free(s);
        return NULL;
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ? p->seed : 0x9E3779B97F4A7C15ull; /* xorshift must not start at 0 */
    return s;
}

void sparq_sampler_free(sparq_sampler *s)
{
    if (!s) return;
    free(s->buf);
    free(s);
}

static float rng_uniform(uint64_t *state) /* [0, 1) */
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int by_prob_desc(const void *a, const void *b)
{
    const prob_id *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

static int32_t argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i; /* ties go to the lowest id */
    return best;
}

int32_t sparq_sample(sparq_sampler *s, const float *logits)
{
    const int n = s->n_vocab;
    if (s->p.temp <= 0.0f) return argmax(logits, n);
    float mx = logits[argmax(logits, n)], sum = 0.0f;
    for (int i = 0; i < n; i++) {
        s->buf[i].id = i;
        s->buf[i].p = expf((logits[i] - mx) / s->p.temp);
        sum += s->buf[i].p;
    }
    for (int i = 0; i < n; i++) s->buf[i].p /= sum;
    /* Sorting the whole vocabulary costs ~1 ms at 128k: negligible next to
     * a forward pass, and it keeps top-k and top-p one simple code path. */
    qsort(s->buf, (size_t)n, sizeof *s->buf, by_prob_desc);
    int keep = n;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < keep; i++) {
            cum += s->buf[i].p;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    float total = 0.0f;
    for (int i = 0; i < keep; i++) total += s->buf[i].p;
    float r = rng_uniform(&s->rng) * total, acc = 0.0f;
    for (int i = 0; i < keep; i++) {
        acc += s->buf[i].p;
        if (r < acc) return s->buf[i].id;
    }
    return s->buf[keep - 1].id;
}
