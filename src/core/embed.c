/* embed.c - sentence embeddings: a prompt's final hidden states (after the
 * output norm, what the LM head would read), pooled over its tokens and
 * normalised, as llama.cpp computes them for --embedding --pooling
 * mean|cls|last with --embd-normalize N. Attention is the model's own
 * (causal), as llama.cpp keeps it for decoder models. */
#include "core/forward.h"
#include "core/model.h"
#include "util/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const pooling_names[] = { [SPARQ_POOLING_NONE] = "none", [SPARQ_POOLING_MEAN] = "mean", [SPARQ_POOLING_CLS] = "cls",
                                             [SPARQ_POOLING_LAST] = "last" };
enum { N_POOLING = sizeof pooling_names / sizeof pooling_names[0] };

const char *sparq_pooling_name(int pooling)
{
    return pooling >= 0 && pooling < N_POOLING ? pooling_names[pooling] : NULL;
}

int sparq_pooling_find(const char *name)
{
    for (int i = 0; name && i < N_POOLING; i++)
        if (pooling_names[i] && !strcmp(name, pooling_names[i])) return i;
    return -1;
}

int sparq_model_n_embd(const sparq_model *m) { return m->hp.n_embd; }

/* x /= its norm: -1 none, 0 the largest |x| over 32760 (int16 range), 1
 * the sum of |x|, 2 the euclidean length, p > 2 the p-norm; a zero norm
 * gives zeros (llama.cpp's common_embd_normalize does the same). */
static void normalize(float *x, int n, int norm)
{
    double sum = 0;
    if (norm < 0) return;
    if (norm == 0) {
        for (int i = 0; i < n; i++) sum = fabs(x[i]) > sum ? fabs(x[i]) : sum;
        sum /= 32760.0;
    } else if (norm == 2) {
        for (int i = 0; i < n; i++) sum += (double)x[i] * x[i];
        sum = sqrt(sum);
    } else {
        for (int i = 0; i < n; i++) sum += pow(fabs(x[i]), norm);
        sum = pow(sum, 1.0 / norm);
    }
    const double scale = sum > 0 ? 1.0 / sum : 0.0;
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] * scale);
}

int sparq_embed(sparq_context *c, const int32_t *tokens, int n, int pooling, int normalize_p, float *out)
{
    const int E = c->model->hp.n_embd;
    c->error[0] = 0;
    if (!sparq_pooling_name(pooling)) {
        return err_set(c->error, sizeof c->error, "embed: unknown pooling %d (none, mean, cls or last)", pooling);
    }
    if (n <= 0) {
        return err_set(c->error, sizeof c->error, "embed: no tokens");
    }
    if (n > c->kv.cap) {
        return err_set(c->error, sizeof c->error, "embed: %d tokens exceed the context size %lld", n, (long long)c->kv.cap);
    }
    float *hidden = malloc((size_t)n * E * sizeof *hidden);
    if (!hidden) {
        return err_set(c->error, sizeof c->error, "embed: out of memory for %d hidden states", n);
    }
    sparq_context_reset(c);
    if (ctx_eval_hidden(c, tokens, n, hidden)) {
        free(hidden);
        return -1;
    }
    if (pooling == SPARQ_POOLING_NONE) {
        memcpy(out, hidden, (size_t)n * E * sizeof *out);
    } else if (pooling == SPARQ_POOLING_MEAN) {
        for (int i = 0; i < E; i++) {
            double s = 0;
            for (int t = 0; t < n; t++) s += hidden[(size_t)t * E + i];
            out[i] = (float)(s / n);
        }
    } else {
        const int t = pooling == SPARQ_POOLING_CLS ? 0 : n - 1;
        memcpy(out, hidden + (size_t)t * E, (size_t)E * sizeof *out);
    }
    free(hidden);
    const int rows = pooling == SPARQ_POOLING_NONE ? n : 1;
    for (size_t i = 0; i < (size_t)rows * E; i++) {
        if (!isfinite(out[i])) {
            return err_set(c->error, sizeof c->error, "embed: non-finite hidden state (row %zu, component %zu)", i / E,
                           i % E);
        }
    }
    for (int r = 0; r < rows; r++) normalize(out + (size_t)r * E, E, normalize_p);
    return 0;
}
