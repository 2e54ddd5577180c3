/* attn_params.h - attention options as the user writes them, turned into
 * sparq_attn_params: one place for the command's --attn... options and the
 * server's "sparq" request object, which name the same knobs.
 *
 * The options are what a person types (names of schedules, key types, a
 * transfer ratio "1/8"); attn_opts_params checks them and fills the
 * library's parameters, with one-line messages that name the command's
 * options (the server answers with the same words). The ratio arithmetic
 * behind them is public: sparq_attn_params_from_ratio (sparq.h).
 */
#ifndef SPARQ_ATTN_PARAMS_H
#define SPARQ_ATTN_PARAMS_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"

/* Attention policy options (run, bench, eval, serve and a request's
 * "sparq" object); 0 / NULL is "not given". */
typedef struct attn_opts {
    const char *attn;       /* --attn                                     */
    int r, k, l;            /* --sparq-r --sparq-k --sparq-l              */
    int attn_k;             /* --attn-k (baselines' budget)               */
    const char *select;     /* --sparq-select probs|logits                */
    int no_realloc;         /* --sparq-no-realloc                         */
    int adaptive_k;         /* --sparq-adaptive-k                         */
    int k_min;              /* --sparq-k-min (adaptive k's floor)         */
    const char *ratio;      /* --sparq-ratio 1/8                          */
    int n_sink;             /* --n-sink                                   */
    const char *index;      /* --index exact|ivf|hnsw|sparq (topk)        */
    int topk_k;             /* --topk-k                                   */
    const char *schedule;   /* --topk-schedule uniform|linear             */
    int ivf_nlist, ivf_nprobe, hnsw_ef; /* --ivf-nlist --ivf-nprobe --hnsw-ef */
    const char *key_type;   /* --index-key-type f16|bf16|i8               */
    int topk_check;         /* --topk-check                               */
} attn_opts;

/* 1 when a and b ask for the same attention (names compared as strings,
 * NULL as the default), 0 otherwise. */
int attn_params_equal(const sparq_attn_params *a, const sparq_attn_params *b);

/* Nothing given: dense attention, l = -1 (the policy's default). */
void attn_opts_init(attn_opts *o);

/* Turns the options into library parameters; S is the context length the
 * ratio is aimed at and d the head size. Returns 0 or -1 with message. */
int attn_opts_params(const attn_opts *o, int64_t S, int d, sparq_attn_params *out, char *err, size_t err_size);

/* "1/8", "0.125" or "1" -> 0.125; -1 if not a fraction in (0, 1]. */
double attn_parse_ratio(const char *s);

/* SparQ at a transfer ratio (S*r + 2*k*d + 4*d against dense's 2*S*d +
 * 2*d): r = max(1, round(d * ratio)), then the largest k <= S whose total
 * stays within ratio x dense. Returns 0, or -1 if not even k = 1 fits. */
int attn_sparq_ratio(double ratio, int64_t S, int d, int *r, int *k);

#endif
