/* sweep.h - an evaluation over settings: every example of a task (or every
 * fidelity window) run under each (policy, sweep value) setting, with the
 * per-setting results the `sparq eval` command prints.
 *
 * Settings come from a policy list ("all" = the attention registry's
 * `in_all` policies) and an optional sweep: `k=A,B` sets the policies' k,
 * `ratio=1,1/2,..` aims each non-dense policy at a fraction of dense
 * attention's transfer for the example's mean decode cache length S (or a
 * fixed ratio_len): SparQ takes r and k from attn_sparq_ratio; a
 * baseline the largest k whose transfer formula (docs/ALGORITHMS.md) stays within the
 * budget (match_k = 0), or SparQ's k at that ratio (match_k = 1). A
 * setting that cannot reach its budget for an example is skipped for it,
 * with the reason kept. Every result carries the transfer actually counted
 * by the context (sparq_context_attn_stats).
 *
 * The library never prints: hooks report progress, notes and (for -v) each
 * run. Functions returning int return 0 or -1 with a one-line message.
 */
#ifndef SPARQ_EVAL_SWEEP_H
#define SPARQ_EVAL_SWEEP_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"
#include "eval/eval.h"
#include "eval/tasks.h"

enum { EVAL_SWEEP_NONE, EVAL_SWEEP_RATIO, EVAL_SWEEP_K };
enum { EVAL_MAX_SETTINGS = 128, EVAL_MAX_SWEEP = 32 };

typedef struct eval_setting {
    char        policy[24];
    int         sweep;          /* EVAL_SWEEP_*                             */
    double      ratio;          /* EVAL_SWEEP_RATIO target                  */
    char        ratio_str[24];
    int         k;              /* EVAL_SWEEP_K value                       */
    /* results, one entry per example run */
    double     *value, *kl, *fdiv; /* kl, fdiv: fidelity only              */
    int64_t     n, n_skipped;
    char        skip_reason[160];
    sparq_attn_stats attn;      /* summed over the runs                     */
    int         r, k_min, k_max, l_min, l_max; /* parameters used           */
    int64_t    *grid_len;       /* grid tasks (niah): cell of each run      */
    double     *grid_depth;
} eval_setting;

/* set[0..*n_set) from attn (a comma list or "all") and sweep (NULL, or
 * "ratio=LIST" / "k=LIST"); set has room for EVAL_MAX_SETTINGS. Unknown
 * policies are refused. */
int eval_settings_make(const char *attn, const char *sweep, eval_setting *set, int *n_set, char *err,
                       size_t err_size);
void eval_setting_free(eval_setting *s);

/* The user's parameters for `policy` at cache length S (head size d). */
typedef int (*eval_base_params_fn)(void *user, const char *policy, int64_t S, int d, sparq_attn_params *out,
                                   char *err, size_t err_size);

typedef struct eval_sweep_env {
    eval_base_params_fn base;
    void *base_user;
    int   match_k;              /* ratio sweep: baselines take SparQ's k     */
    int   d, g;                 /* head size, query heads per KV head        */
} eval_sweep_env;

/* Parameters of setting s for an example whose decode steps average cache
 * length S. Returns 0, 1 if the setting cannot reach its budget (err says
 * why), -1 on a real error. */
int eval_setting_params(const eval_setting *s, const eval_sweep_env *env, int64_t S, sparq_attn_params *out,
                        char *err, size_t err_size);

/* "ratio=1/8 r=1 k=20-24 l=5-6" (or "-"): the parameters a setting used. */
void eval_setting_label(const eval_setting *s, char *buf, size_t size);

/* One finished run, for the `ran` hook. */
typedef struct eval_sweep_note {
    const eval_setting   *set;
    int64_t               index;  /* example or window                      */
    const task_example   *ex;     /* example tasks, else NULL                */
    const eval_prepared  *pr;
    const eval_result    *res;
    const eval_fidelity  *fid;    /* fidelity windows, else NULL             */
} eval_sweep_note;

typedef struct eval_sweep {
    sparq_model         *m;
    sparq_context_params cp;     /* n_ctx, threads, batch, kv_type, abort_flag;
                                    attn is set per setting                   */
    eval_sweep_env       env;
    const task_def      *task;
    task_params          tp;     /* seed, data path, the task's options       */
    int64_t              limit;  /* examples / windows at most (0: all)       */
    int64_t              ratio_len; /* S a ratio is aimed at (0: per example) */
    /* hooks, each may be NULL */
    void *user;
    void (*note)(void *user, const char *line);
    void (*progress)(void *user, const char *what, int64_t i, int64_t n);
    void (*ran)(void *user, const eval_sweep_note *note);
} eval_sweep;

typedef struct eval_sweep_summary {
    int64_t n_done;              /* examples / windows finished              */
    int64_t n_truncated;         /* prompts truncated to fit the context     */
    int64_t n_dropped;           /* tokens those truncations dropped          */
    int64_t n_prepared;          /* prompts prepared                          */
} eval_sweep_summary;

/* Runs the task under every setting, filling their results. Stops early,
 * with what is done, when *cp.abort_flag is set. */
int eval_sweep_run(const eval_sweep *w, eval_setting *set, int n_set, eval_sweep_summary *out, char *err,
                   size_t err_size);

/* A setting's aggregate: means and standard errors over its runs. */
typedef struct eval_row {
    const eval_setting *s;
    char    params[128];        /* eval_setting_label                        */
    double  value, stderr_, transfer, formula;
    double  kl, kl_se, fdiv, fdiv_se;
    int     has_delta;          /* paired difference to the dense row         */
    double  delta, delta_se;
} eval_row;

/* rows[i] for set[i]; the paired delta against the first dense setting
 * (same examples in the same order), where there is one. */
void eval_rows_make(const eval_setting *set, int n_set, eval_row *rows);

#endif
