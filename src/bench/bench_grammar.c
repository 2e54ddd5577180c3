/* bench_grammar.c - what a grammar adds to a draw (bench.h). */
#include "bench/bench.h"
#include "util/err.h"

#include <stdlib.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int bench_grammar(const sparq_model *m, const sparq_grammar *g, int steps, float temp, uint64_t seed,
                  double *us_free, double *us_grammar, char *err, size_t err_size)
{
    const int V = sparq_model_n_vocab(m);
    if (steps < 1) return err_set(err, err_size, "steps %d must be >= 1", steps);
    sparq_sampler_params sp = sparq_sampler_default_params();
    sp.temp = temp;
    sp.seed = seed;
    sparq_sampler *fs = sparq_sampler_create(&sp, V), *gs = sparq_sampler_create(&sp, V);
    float *logits = malloc((size_t)V * sizeof *logits);
    int rc = 0;
    if (!fs || !gs || !logits) rc = err_set(err, err_size, "out of memory");
    if (!rc && sparq_sampler_set_grammar(gs, m, g, err, err_size)) rc = -1;
    double tf = 0, tg = 0;
    uint64_t x = seed ? seed : 1;
    for (int s = 0; s < steps && !rc; s++) {
        for (int i = 0; i < V; i++) { /* xorshift64*: a sum of two uniforms, roughly bell-shaped */
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            uint64_t r = x * 0x2545F4914F6CDD1Dull;
            logits[i] = (float)((r >> 40) & 0xFFFF) / 4096.0f + (float)(r >> 56) / 32.0f;
        }
        double t0 = now_us();
        sparq_sample(fs, logits);
        double t1 = now_us();
        int32_t id = sparq_sample(gs, logits);
        double t2 = now_us();
        tf += t1 - t0;
        tg += t2 - t1;
        if (sparq_sampler_grammar_done(gs) || id == sparq_token_eos(m))
            rc = sparq_sampler_set_grammar(gs, m, g, err, err_size); /* start over */
    }
    *us_free = tf / steps;
    *us_grammar = tg / steps;
    sparq_sampler_free(fs);
    sparq_sampler_free(gs);
    free(logits);
    return rc;
}
