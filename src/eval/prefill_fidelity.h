/* prefill_fidelity.h - how close a sparse prefill's cache is to the exact
 * one (sparq.h, sparq_prefill_params).
 *
 * One window of a text: its first N tokens are prefilled twice, exactly and
 * sparsely, into two contexts of the same model; then the text's next F
 * tokens are fed to both one decode step at a time (dense decode attention
 * in both, so the caches are the only difference) and the logits of each
 * step are compared: top-1 agreement, KL(exact || sparse) in nats, and the
 * first step whose top-1 differs. (The prefill's own last row is not: it
 * is the sparse attention's output, not a read of the cache.) Several windows at different offsets give
 * means with standard errors across windows.
 */
#ifndef SPARQ_PREFILL_FIDELITY_H
#define SPARQ_PREFILL_FIDELITY_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"

typedef struct eval_pf_window {
    int64_t offset;       /* first token of the window in the text            */
    double  top1;         /* fraction of the F steps whose argmax agree       */
    double  kl;           /* mean KL(exact || sparse) over the F steps, nats  */
    double  kl_max;
    int     first_div;    /* first disagreeing step (F if none)               */
    double  exact_s, sparse_s; /* prefill seconds                             */
} eval_pf_window;

typedef struct eval_pf_result {
    int    n_windows;
    double top1, top1_se;      /* means over windows, standard errors         */
    double kl, kl_se;
    double first_div, first_div_se;
    double exact_s, sparse_s;  /* mean prefill seconds                        */
} eval_pf_result;

/* What one measurement compares: n_windows windows of N prefilled and F
 * forced tokens. base: the contexts' parameters (n_ctx is set to N + F;
 * base->prefill is ignored: one context is exact, the other uses sparse).
 * progress (may be NULL) is called with user after each window. */
typedef struct eval_pf_setup {
    const sparq_context_params *base;
    const sparq_prefill_params *sparse;
    int                         N, F, n_windows;
    void                      (*progress)(void *user, int done, int total);
    void                       *user;
} eval_pf_setup;

/* Runs the windows of su spread evenly over ids[n_ids] (at least N + F
 * tokens; windows may overlap when the text is short). win[n_windows]
 * receives each window (may be NULL). 0, or -1 with a message. */
int eval_prefill_fidelity(sparq_model *m, const eval_pf_setup *su, const int32_t *ids, int64_t n_ids,
                          eval_pf_window *win, eval_pf_result *out, char *err, size_t err_size);

/* The tokens the windows are drawn from: text[len] tokenized (BOS first),
 * then the text again without its BOS until there are at least `need`.
 * *ids (malloc'ed) holds *n_ids tokens, *n_text of them one copy of the
 * text. 0, or -1 when the text has no token but BOS, cannot be tokenized
 * or memory runs out. */
int eval_pf_tokens(const sparq_model *m, const char *text, size_t len, int64_t need, int32_t **ids, int64_t *n_ids,
                   int *n_text);

/* Mean and standard error of x[0..n) (se 0 when n < 2). */
void eval_mean_se(const double *x, int n, double *mean, double *se);

#endif
