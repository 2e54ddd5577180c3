#include "sparq.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv)
{
    /* drv model depth threads policy r k n */
    char err[256];
    sparq_model *m;
    if (sparq_model_load(argv[1], &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    const long depth = atol(argv[2]);
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = depth + 1024;
    cp.n_threads = atoi(argv[3]);
    cp.attn.policy = argv[4];
    cp.attn.r = atoi(argv[5]);
    cp.attn.k = atoi(argv[6]);
    cp.attn.l = -1;
    int n = atoi(argv[7]);
    sparq_context *c;
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    if (sparq_context_fill_random(c, depth, 7)) return 1;
    float *lg = malloc((size_t)sparq_model_n_vocab(m) * 4);
    int32_t tok = 5;
    for (int i = 0; i < 8; i++) sparq_eval(c, &tok, 1, lg);
    double *t = malloc(n * sizeof *t);
    for (int i = 0; i < n; i++) { double a = now(); sparq_eval(c, &tok, 1, lg); t[i] = now() - a; tok = (tok * 7 + 3) % 100 + 1; }
    /* median */
    for (int i = 0; i < n; i++) for (int j = i + 1; j < n; j++) if (t[j] < t[i]) { double x = t[i]; t[i] = t[j]; t[j] = x; }
    printf("%s %.3f ms/step median, %.1f tok/s (p10 %.3f p90 %.3f)\n", argv[4], t[n / 2] * 1e3, 1 / t[n / 2], t[n / 10] * 1e3, t[9 * n / 10] * 1e3);
    return 0;
}
