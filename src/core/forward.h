/* forward.h - the forward pass's entry points inside core (forward.c);
 * the public ones (sparq_eval, sparq_decode_batch, ...) are in sparq.h.
 *
 * forward.c runs in the contexts context.c makes and calls context.h;
 * context.c never calls back into the forward pass.
 */
#ifndef SPARQ_FORWARD_H
#define SPARQ_FORWARD_H

#include <stdint.h>
#include "core/model.h"

/* The weight-times-activations product out[n][n_out] = in[n][n_in] W^T,
 * with activations converted to W's vec_dot type (ggml numerics). */
void model_matmul(sparq_context *c, float *out, const float *in, int n, const weight *w);
/* Several products of the same input (q/k/v, gate/up) in one parallel
 * loop: outs[i][n][ws[i]->n_out] = in ws[i]^T, 1 <= n_w <= 4. */
void model_matmul_group(sparq_context *c, const float *in, int n, int n_w, const weight *const *ws,
                        float *const *outs);

/* A prefill of n tokens (exact attention, in n_batch chunks) that writes
 * each token's final hidden state after the output norm to
 * hidden[n][n_embd] and computes no logits (forward.c; embed.c pools it).
 * 0, or -1 with the message in c->error. */
int ctx_eval_hidden(sparq_context *c, const int32_t *tokens, int n, float *hidden);

/* Checks logits[rows][n_vocab] (positions first_pos...) are finite; else
 * -1 with "non-finite logits at token position P" in c->error. O(n_vocab)
 * per row, in 16 lanes (one running sum took 104 us per row at a 128k
 * vocabulary, 1.7 ms of a 16-sequence decode step; 9 us so). */
int ctx_check_logits(sparq_context *c, const float *logits, int rows, int64_t first_pos);

#endif
