/* task_wikitext.c - WikiText-2 windows scored by bits per character of a
 * teacher-forced reference (tasks.h; eval.c runs TASK_RUN_FORCED). */
#include "util/err.h"
#include "eval/task_impl.h"

#include <stdlib.h>
#include <string.h>

/* A top-level WikiText heading line: " = Title = " (not " = = Sub = = "). */
static int wiki_is_title(const char *t, size_t pos, size_t n)
{
    return n - pos >= 4 && t[pos] == ' ' && t[pos + 1] == '=' && t[pos + 2] == ' ' && t[pos + 3] != '=';
}

static int wikitext_open(task_set *s, char *err, size_t err_size)
{
    if (task_text_open(s, "data/text/wikitext-2-raw_wiki.test.raw", err, err_size)) return -1;
    int64_t P = s->p.context_chars > 0 ? s->p.context_chars : 6000;
    int64_t R = s->p.reference_chars > 0 ? s->p.reference_chars : 400;
    const char *t = s->text;
    size_t n = s->n_text;
    span_list l = { 0 };
    /* Articles start at heading lines (a line start followed by " = X");
     * text before the first heading (or a file without any) is one too. */
    size_t art = 0;
    for (size_t pos = 1; pos <= n; pos++) {
        int boundary = pos == n || (t[pos - 1] == '\n' && wiki_is_title(t, pos, n));
        if (!boundary) continue;
        size_t cur = art, split, ref_end;
        while (split_prefill(t, cur, pos, P, R, &split, &ref_end) == 0) {
            if (span_push(&l, (text_span){ art, pos, cur, split, ref_end })) {
                free(l.v);
                return err_set(err, err_size, "wikitext: out of memory");
            }
            cur = ref_end;
            while (cur < pos && task_is_ws((unsigned char)t[cur])) cur++;
        }
        art = pos;
    }
    s->priv = l.v;
    s->n_examples = l.n;
    if (l.n == 0)
        return err_set(err, err_size, "wikitext: no article has %lld + %lld characters", (long long)P, (long long)R);
    return task_make_perm(s, l.n, err, err_size);
}

static int wikitext_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const text_span *sp = (const text_span *)s->priv + s->perm[i];
    sbuf b = { 0 };
    sb_add(&b, s->text + sp->ex_start, sp->ref_start - sp->ex_start);
    if (sb_finish(&b, ex, err, err_size)) return -1;
    ex->n_context = ex->n_prompt;
    ex->id = task_dup_printf("wikitext-%zu", sp->ex_start);
    if (!ex->id || task_add_answer(ex, s->text + sp->ref_start, sp->ref_end - sp->ref_start))
        return err_set(err, err_size, "wikitext: out of memory");
    return 0;
}

static const task_option wikitext_options[] = {
    { "--context-chars", TASK_OPT_I64, offsetof(task_params, context_chars), 1, "N",
      "characters of context (default 6000)" },
    { 0 },
};

const task_def task_def_wikitext = {
    .name = "wikitext",
    .summary = "WikiText-2 test, >= 6000-character contexts; bits per character (teacher-forced)",
    .metric = "bpc",
    .run = TASK_RUN_FORCED,
    .stream = 3,
    .options = wikitext_options,
    .open = wikitext_open,
    .get = wikitext_get,
    .free_priv = free,
};
