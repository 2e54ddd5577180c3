/* task_repetition.c - Tiny Shakespeare: repeat an excerpt of the context;
 * scored by characters before the first mismatch (tasks.h). */
#include "util/err.h"
#include "eval/metrics.h"
#include "eval/task_impl.h"

#include <stdlib.h>
#include <string.h>

static int repetition_open(task_set *s, char *err, size_t err_size)
{
    if (task_text_open(s, "data/text/tinyshakespeare_input.txt", err, err_size)) return -1;
    int64_t C = s->p.context_chars > 0 ? s->p.context_chars : 6000;
    int64_t E = s->p.excerpt_chars > 0 ? s->p.excerpt_chars : 128;
    int64_t R = s->p.reference_chars > 0 ? s->p.reference_chars : 256;
    const char *t = s->text;
    size_t n = s->n_text, cs = 0;
    span_list l = { 0 };
    /* Contexts: "(.{C,}?)(?=\s|$)" repeatedly; each starts where the last
     * ended (on its whitespace). */
    for (;;) {
        size_t a = task_advance_chars(t, cs, n, C);
        if (a == SIZE_MAX) break;
        size_t ce = task_next_ws(t, a, n);
        size_t cur = cs, split, ref_end;
        while (split_prefill(t, cur, ce, E, R, &split, &ref_end) == 0) {
            if (span_push(&l, (text_span){ cs, ce, cur, split, ref_end })) {
                free(l.v);
                return err_set(err, err_size, "repetition: out of memory");
            }
            cur = ref_end;
        }
        if (ce >= n) break;
        cs = ce;
    }
    s->priv = l.v;
    s->n_examples = l.n;
    if (l.n == 0)
        return err_set(err, err_size,
                       "repetition: no context of %lld characters holds a %lld-character excerpt and a %lld-character "
                       "continuation (see --context-chars)",
                       (long long)C, (long long)E, (long long)R);
    return task_make_perm(s, l.n, err, err_size);
}

static int repetition_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const text_span *sp = (const text_span *)s->priv + s->perm[i];
    sbuf b = { 0 };
    sb_add(&b, s->text + sp->ctx_start, sp->ctx_end - sp->ctx_start);
    ex->n_context = b.n;
    sb_adds(&b, "\n");
    sb_add(&b, s->text + sp->ex_start, sp->ref_start - sp->ex_start);
    if (sb_finish(&b, ex, err, err_size)) return -1;
    ex->id = task_dup_printf("%zu", sp->ex_start);
    if (!ex->id || task_add_answer(ex, s->text + sp->ref_start, sp->ref_end - sp->ref_start))
        return err_set(err, err_size, "repetition: out of memory");
    return 0;
}

/* min(repetition_max_tokens, reference tokens). */
static int64_t repetition_gen_tokens(const eval_task_params *p, int64_t longest)
{
    return longest < p->repetition_max_tokens ? longest : p->repetition_max_tokens;
}

static int repetition_score(const task_example *ex, const char *out, size_t n_out, double *value, char *err,
                            size_t err_size)
{
    (void)err;
    (void)err_size;
    *value = (double)metrics_match_length(out, n_out, ex->answers[0], strlen(ex->answers[0]));
    return 0;
}

static const task_option repetition_options[] = {
    { "--context-chars", TASK_OPT_I64, offsetof(task_params, context_chars), 1, "N",
      "characters of context (default 6000)" },
    { 0 },
};

const task_def task_def_repetition = {
    .name = "repetition",
    .summary = "Tiny Shakespeare: repeat an excerpt of the context; characters matched",
    .metric = "match_chars",
    .run = TASK_RUN_GENERATE,
    .stream = 4,
    .options = repetition_options,
    .open = repetition_open,
    .get = repetition_get,
    .free_priv = free,
    .gen_tokens = repetition_gen_tokens,
    .score = repetition_score,
};
