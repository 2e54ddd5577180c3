/* eval.h - the evaluation harness: one task example, one fidelity window or
 * one attention-statistics pass through a context and its attention policy.
 *
 * Everything here is greedy and deterministic. Each run starts by resetting
 * the context (sparq_context_reset), so its KV cache, policy state and
 * transfer counters describe that run alone; the counters are copied into
 * the result. The library never prints: sweep.h runs a task under many
 * settings and aggregates; the CLI (`sparq eval`, `sparq stats`) formats.
 *
 * Pieces (docs/ALGORITHMS.md "Evaluation tasks"; the SparQ authors' harness fixes the
 * lengths the paper leaves open):
 *   eval_truncate_left   keep the last tokens of a prompt that does not fit,
 *                        the leading BOS kept (the authors truncated from
 *                        the left with the tokenizer, specials re-added).
 *   eval_generate        greedy decoding with stop rules: a token budget,
 *                        end-of-generation tokens, a stop string, a full
 *                        context.
 *   eval_forced_nll      teacher forcing: prefill, then feed the target
 *                        tokens one decode step at a time (so the policy
 *                        acts on every scored token) and sum their NLL.
 *   eval_prepare / eval_run   one task example: tokenize, truncate to the
 *                        context, pick the generation length, run, score.
 *   eval_reference_run / eval_fidelity_run   a window of any text under
 *                        dense attention, then under a policy: per-token
 *                        KL(dense || policy) and top-1 agreement over
 *                        teacher-forced decode steps, and the number of
 *                        greedy tokens before the two generations diverge.
 *   eval_attn_stats      attention statistics of a real forward pass
 *                        (q kurtosis, SparQ top-k agreement for several r,
 *                        alpha vs the true top-k mass, entropy, keys holding
 *                        75% of the mass), measured at decode steps.
 *
 * Functions returning int return 0 on success, -1 with a one-line message in
 * err[err_size]. Results own their buffers; free them with the matching
 * _free (NULL and zeroed structs are no-ops).
 */
#ifndef SPARQ_EVAL_H
#define SPARQ_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"
#include "eval/eval_file.h"
#include "eval/tasks.h"

/* ---- building blocks ------------------------------------------------------ */

/* Shortens ids[0..n) in place to at most max_n tokens by dropping tokens
 * from the left. keep_first != 0 keeps ids[0] (the BOS) in front of the
 * kept tail. Returns the new length (n if it already fits). max_n >= 1;
 * with keep_first, max_n >= 2 keeps at least one token after the BOS. */
int64_t eval_truncate_left(int32_t *ids, int64_t n, int64_t max_n, int keep_first);

/* Tokenizes text[0..n) into a malloc'd array (*ids, caller frees).
 * Returns the token count, or -1 with a message. */
int64_t eval_tokenize(const sparq_model *m, const char *text, size_t n, int add_special,
                      int32_t **ids, char *err, size_t err_size);

/* Code points of the text the tokens ids[0..n) print as (their pieces
 * concatenated). */
int64_t eval_token_chars(const sparq_model *m, const int32_t *ids, int64_t n);

/* ---- greedy generation ------------------------------------------------------ */

typedef enum {
    EVAL_STOP_MAX_TOKENS,    /* generated max_tokens                         */
    EVAL_STOP_EOG,           /* the model produced an end-of-generation token */
    EVAL_STOP_STRING,        /* the text reached the stop string             */
    EVAL_STOP_CONTEXT_FULL,  /* no room for another token                     */
} eval_stop;

const char *eval_stop_name(eval_stop s);

typedef struct eval_gen_params {
    int         max_tokens;  /* tokens to generate at most (>= 0)              */
    int         stop_at_eog; /* stop at an end-of-generation token (kept in
                                tokens, its piece not in text)                 */
    const char *stop;        /* stop once text contains this (text is cut
                                before it); NULL or "" = none                  */
} eval_gen_params;

typedef struct eval_generation {
    int32_t *tokens;         /* [n_tokens] greedy ids, in order              */
    int      n_tokens;
    char    *text;           /* NUL-terminated concatenated pieces           */
    size_t   n_text;
    eval_stop stop;
    sparq_attn_stats attn;   /* transfer counters of the run                 */
} eval_generation;

/* Resets c, prefills prompt[0..n_prompt) (n_prompt >= 1) and generates
 * greedily (argmax, ties to the lowest id). The first token comes from the
 * prefill's logits; every later one needs a decode step through the policy. */
int eval_generate(sparq_context *c, const int32_t *prompt, int n_prompt, const eval_gen_params *p,
                  eval_generation *out, char *err, size_t err_size);
void eval_generation_free(eval_generation *g);

/* ---- teacher forcing ------------------------------------------------------- */

/* Resets c, prefills prompt, then scores target[0..n_target): nll[i] =
 * -log p(target[i] | prompt, target[0..i)) in nats, each target token after
 * the first fed by a decode step. Needs n_prompt + n_target - 1 <= n_ctx.
 * attn (may be NULL) receives the run's transfer counters. */
int eval_forced_nll(sparq_context *c, const int32_t *prompt, int n_prompt, const int32_t *target,
                    int n_target, double *nll, sparq_attn_stats *attn, char *err, size_t err_size);

/* ---- task examples ------------------------------------------------------------ */

/* eval_task_params (tasks.h): the generation budgets. */
eval_task_params eval_task_default_params(void);

/* An example ready to run: its prompt fitted to the context. */
typedef struct eval_prepared {
    const task_def *task;
    const task_example *ex;   /* borrowed: must outlive the prepared example  */
    int32_t *prompt;          /* [n_prompt] BOS + the prompt's last tokens     */
    int      n_prompt;
    int64_t  n_dropped;       /* tokens truncated from the left                */
    int32_t *target;          /* wikitext: [n_target] teacher-forced tokens    */
    int      n_target;
    int64_t  n_target_chars;  /* wikitext: code points the target covers       */
    int      n_gen;           /* tokens to generate (0 for wikitext)           */
    int      stop_at_eog;     /* from eval_task_params                         */
} eval_prepared;

/* Tokenizes ex for a context of n_ctx tokens: picks the generation length
 * (task->gen_tokens) or the teacher-forced target (TASK_RUN_FORCED), then
 * truncates the prompt from the left so prompt + generation fits. */
int eval_prepare(const sparq_model *m, int64_t n_ctx, const task_def *task, const task_example *ex,
                 const eval_task_params *p, eval_prepared *out, char *err, size_t err_size);
void eval_prepared_free(eval_prepared *pr);

/* Mean cache length S over the example's decode steps: what a transfer
 * ratio is aimed at. */
int64_t eval_prepared_mean_len(const eval_prepared *pr);

typedef struct eval_result {
    double  value;            /* the task metric for this example:
                                 squad/triviaqa/niah/kvret 1 or 0, cnndm ROUGE-L
                                 F1, wikitext bits per character, repetition
                                 characters before the first mismatch        */
    double  nll_sum;          /* wikitext: nats over the target               */
    int64_t n_chars;          /* wikitext: characters scored                  */
    int     n_generated;
    eval_stop stop;
    char   *output;           /* generated text (NUL-terminated), or NULL     */
    size_t  n_output;
    sparq_attn_stats attn;    /* transfer counters of the run                 */
} eval_result;

/* Runs a prepared example through c (whose policy is the one measured) and
 * scores it with the task's score method (or BPC when teacher-forced). */
int eval_run(sparq_context *c, const eval_prepared *pr, eval_result *out, char *err, size_t err_size);
void eval_result_free(eval_result *r);

/* ---- fidelity vs dense -------------------------------------------------------- */

/* What dense attention does on one window: logits after each of n_forced
 * teacher-forced decode steps (prompt prefilled, then cont[0..n_forced) fed
 * one at a time) and n_gen greedy tokens from the prompt (no stop rule). */
typedef struct eval_reference {
    int      n_vocab;
    int      n_forced;
    float   *logits;          /* [n_forced][n_vocab]                          */
    int      n_gen;
    int32_t *greedy;          /* [n_gen]                                      */
} eval_reference;

int eval_reference_run(sparq_context *c, const int32_t *prompt, int n_prompt, const int32_t *cont,
                       int n_forced, int n_gen, eval_reference *out, char *err, size_t err_size);
void eval_reference_free(eval_reference *r);

typedef struct eval_fidelity {
    int64_t n_steps;          /* teacher-forced decode steps compared         */
    double  kl_sum;           /* sum of KL(dense || policy) over them (nats)  */
    double  kl_max;
    int64_t n_top1_agree;     /* steps whose argmax tokens agree              */
    int64_t first_divergence; /* greedy tokens equal before the first
                                 difference (n_gen if none)                   */
    int64_t n_gen;
    sparq_attn_stats attn;    /* transfer counters, both runs summed          */
} eval_fidelity;

/* Adds one step's comparison (KL and top-1) of reference logits p against
 * test logits q to f. The arithmetic of eval_fidelity_run, exposed for tests. */
void eval_fidelity_step(eval_fidelity *f, const float *p, const float *q, int n_vocab);

/* Runs the same window through c and compares it with ref. c must have the
 * model and context size the reference was made with. */
int eval_fidelity_run(sparq_context *c, const eval_reference *ref, const int32_t *prompt,
                      int n_prompt, const int32_t *cont, eval_fidelity *out, char *err,
                      size_t err_size);

/* ---- attention statistics ------------------------------------------------------ */

#define EVAL_STATS_MAX_R 16

typedef struct eval_stats_params {
    int n_query;              /* decode steps measured (the text's last tokens) */
    int k;                    /* top-k size (clamped to S) (32)                 */
    int n_r;                  /* r values for top-k agreement (0: 1,2,4..d)     */
    int r[EVAL_STATS_MAX_R];
    int alpha_r;              /* r for alpha vs true mass (0: SparQ's d/4)      */
} eval_stats_params;

eval_stats_params eval_stats_default_params(void);

/* Per (layer, query head), means over the measured steps. */
typedef struct eval_head_stats {
    double kurtosis;          /* Fisher (excess) kurtosis of q's d components,
                                 per query vector, averaged over steps          */
    double kurtosis_pooled;   /* the same over all components of all steps     */
    double entropy;           /* of the exact attention weights, nats          */
    double keys75;            /* fewest keys holding >= 75% of the weight      */
    double keys75_frac;       /* the same over S                               */
    double topk_mass;         /* exact weight in the exact top-k               */
    double alpha;             /* SparQ's alpha (r = alpha_r): approximate weight
                                 of the approximate top-k                      */
    double alpha_abs_err;     /* mean |alpha - topk_mass|                      */
    double agreement[EVAL_STATS_MAX_R]; /* |top-k(approx) & top-k(exact)| / k  */
    int64_t n;                /* steps measured                                */
} eval_head_stats;

typedef struct eval_stats {
    int n_layer, n_head, n_kv_head, d;
    int k, alpha_r, n_r, r[EVAL_STATS_MAX_R];
    int64_t s_first, s_last;  /* cache lengths of the first and last step      */
    eval_head_stats *heads;   /* [n_layer][n_head]                             */
} eval_stats;

/* Resets c, prefills tokens[0 .. n - n_query), then feeds the last n_query
 * tokens one decode step at a time through c's own policy while an observer
 * records, for each layer and KV head, the queries and the cached keys:
 * exact scores q.K/sqrt(d), SparQ's approximate scores (the r largest
 * group-summed |q| components, temperature sqrt(d ||q[i1]||_1 / ||q||_1)),
 * and the statistics above. Needs 1 <= n_query < n <= n_ctx. */
int eval_attn_stats(sparq_context *c, const int32_t *tokens, int n, const eval_stats_params *p,
                    eval_stats *out, char *err, size_t err_size);
void eval_stats_free(eval_stats *s);

#endif
