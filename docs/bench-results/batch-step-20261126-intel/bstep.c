/* Times sparq_decode_batch: B contexts of one model at a depth, SparQ 1/8
 * (r = 8, k = 254, l = 63 at S = 4096, d = 64) or dense.
 *   bstep MODEL B DEPTH dense|sparq [STEPS] [random|real]
 * random (the default): every context filled with sparq_context_fill_random;
 * real: one context prefilled with DEPTH tokens of a text (TXT, default
 * ../shared/data/text/PaulGrahamEssays_all_sorted.txt) and copied into the B
 * contexts. FTZ=1 in the environment sets MXCSR FTZ/DAZ before the library
 * starts its threads. (Session 7 ran this as two files, bstep.c for random and
 * bstep2.c for real, the same code otherwise; merged here.) */
#include "sparq.h"
#include <pmmintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xmmintrin.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bstep MODEL B DEPTH dense|sparq [STEPS] [random|real]\n");
        return 2;
    }
    const char *path = argv[1], *pol = argv[4];
    const int B = atoi(argv[2]), depth = atoi(argv[3]), steps = argc > 5 ? atoi(argv[5]) : 20;
    const int real = argc > 6 && !strcmp(argv[6], "real");
    if (B < 1 || B > 64 || depth < 1 || steps < 1) return 2;
    if (getenv("FTZ")) {
        _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
        _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
    }
    char err[256];
    sparq_model *m;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    sparq_context_params p = sparq_context_default_params();
    p.n_ctx = depth + steps + 16;
    p.attn = sparq_attn_default_params();
    if (!strcmp(pol, "sparq")) {
        p.attn.policy = "sparq";
        p.attn.r = 8;
        p.attn.k = 254;
        p.attn.l = 63;
    }
    sparq_context *c[64], *src = NULL;
    int32_t tok[64], *ids = NULL;
    int n = depth;
    if (real) {
        const char *txt_path = getenv("TXT") ? getenv("TXT") : "../shared/data/text/PaulGrahamEssays_all_sorted.txt";
        FILE *f = fopen(txt_path, "rb");
        char *txt = malloc(1 << 22);
        ids = malloc(sizeof(int32_t) << 21);
        if (!f || !txt || !ids) return 1;
        const size_t nt = fread(txt, 1, (1 << 22) - 1, f);
        fclose(f);
        txt[nt] = 0;
        n = sparq_tokenize(m, txt, -1, 1, ids, 1 << 21);
        if (n > depth) n = depth;
        if (sparq_context_create(m, &p, &src, err, sizeof err)) return 1;
        const double a = now();
        if (sparq_eval(src, ids, n, NULL)) return 1;
        fprintf(stderr, "prefill %d tokens %.1f s\n", n, now() - a);
    }
    for (int i = 0; i < B; i++) {
        if (sparq_context_create(m, &p, &c[i], err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        if (real ? sparq_context_copy_prefix(c[i], src, n, err, sizeof err)
                 : sparq_context_fill_random(c[i], depth, (uint64_t)i + 1))
            return 1;
        tok[i] = real ? ids[i + 1] : 100 + i;
    }
    float *lg = malloc((size_t)B * sparq_model_n_vocab(m) * sizeof *lg);
    if (!lg) return 1;
    for (int w = 0; w < 2; w++) sparq_decode_batch(c, tok, B, lg);
    double mn = 1e9;
    const double t0 = now();
    for (int s = 0; s < steps; s++) {
        const double a = now();
        if (sparq_decode_batch(c, tok, B, lg)) return 1;
        const double d = now() - a;
        if (d < mn) mn = d;
    }
    const double t = now() - t0;
    printf("%sB=%d depth=%d %s: mean step %.1f ms, min %.1f ms, %.1f tok/s\n", real ? "REAL " : "", B, n, pol,
           t / steps * 1e3, mn * 1e3, B * steps / t);
    return 0;
}
