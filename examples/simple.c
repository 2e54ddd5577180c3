/* simple.c - the smallest sparq program: greedy continuation of a prompt.
 *
 *   cc simple.c $(pkg-config --cflags --libs sparq) -o simple
 *   ./simple stories260K.gguf "Once upon a time" 32
 *
 * Prints what `sparq run -m MODEL -p PROMPT -n N --temp 0` prints. */
#include <sparq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT N\n", argv[0]);
        return 2;
    }
    const int n_predict = atoi(argv[3]);
    char err[512];
    sparq_model *m = NULL;
    if (sparq_model_load(argv[1], &m, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 512;
    sparq_context *c = NULL;
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        sparq_model_free(m);
        return 1;
    }
    const int n_vocab = sparq_model_n_vocab(m);
    int rc = 1;
    int32_t ids[512];
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    sparq_sampler_params sp = sparq_sampler_default_params();
    sp.temp = 0; /* greedy */
    sparq_sampler *s = sparq_sampler_create(&sp, n_vocab);
    int n = sparq_tokenize(m, argv[2], -1, 1, ids, 512);
    if (!logits || !s || n < 1 || n > 512) {
        fprintf(stderr, "error: out of memory or prompt too long\n");
        goto done;
    }
    if (sparq_eval(c, ids, n, logits)) {
        fprintf(stderr, "error: %s\n", sparq_context_error(c));
        goto done;
    }
    for (int i = 0; i < n_predict; i++) {
        int32_t id = sparq_sample(s, logits);
        if (sparq_token_is_eog(m, id)) break;
        char piece[256];
        int len = sparq_token_to_piece(m, id, piece, sizeof piece);
        if (len > 0) fwrite(piece, 1, (size_t)(len < (int)sizeof piece ? len : (int)sizeof piece), stdout);
        if (i + 1 < n_predict && sparq_eval(c, &id, 1, logits)) {
            fprintf(stderr, "error: %s\n", sparq_context_error(c));
            goto done;
        }
    }
    fputc('\n', stdout);
    rc = 0;
done:
    sparq_sampler_free(s);
    free(logits);
    sparq_context_free(c);
    sparq_model_free(m);
    return rc;
}
