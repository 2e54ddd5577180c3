/* task_cnndm.c - CNN/DailyMail summaries: "Article: ..\nSummary:", scored
 * by ROUGE-L F1 against the highlights (tasks.h). */
#include "util/err.h"
#include "eval/metrics.h"
#include "eval/task_impl.h"

#include <string.h>

/* Articles outside [cnndm_min_chars, cnndm_max_chars] are left out. */
static int cnndm_keep(const task_set *s, const json_value *it, size_t i, char *err, size_t err_size)
{
    size_t alen;
    const char *art = json_get_str(it, "article", &alen);
    if (!art || !json_get_str(it, "highlights", NULL))
        return err_set(err, err_size, "cnndm: item %zu lacks \"article\" or \"highlights\"", i);
    const int64_t chars = task_count_chars(art, 0, alen);
    if (s->p.cnndm_min_chars > 0 && chars < s->p.cnndm_min_chars) return 0;
    if (s->p.cnndm_max_chars > 0 && chars > s->p.cnndm_max_chars) return 0;
    return 1;
}

static int cnndm_open(task_set *s, char *err, size_t err_size)
{
    return task_list_open(s, "data/qa/cnn_dailymail/cnn_dailymail_test_first100.json", cnndm_keep, err, err_size);
}

static int cnndm_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const json_value *it = s->items[i];
    size_t alen, hlen, idlen;
    const char *art = json_get_str(it, "article", &alen);
    const char *hl = json_get_str(it, "highlights", &hlen);
    sbuf b = { 0 };
    sb_adds(&b, "Article: ");
    sb_add(&b, art, alen);
    ex->n_context = b.n;
    sb_adds(&b, "\nSummary:");
    if (sb_finish(&b, ex, err, err_size)) return -1;
    const char *id = json_get_str(it, "id", &idlen);
    ex->id = id ? task_dup_n(id, idlen) : task_dup_printf("cnndm-%lld", (long long)i);
    if (!ex->id || task_add_answer(ex, hl, hlen)) return err_set(err, err_size, "cnndm: out of memory");
    return 0;
}

/* min(summary_max_tokens, reference tokens). */
static int64_t cnndm_gen_tokens(const eval_task_params *p, int64_t longest)
{
    return longest < p->summary_max_tokens ? longest : p->summary_max_tokens;
}

static int cnndm_score(const task_example *ex, const char *out, size_t n_out, double *value, char *err,
                       size_t err_size)
{
    (void)n_out;
    metrics_rouge r;
    if (metrics_rouge_l(ex->answers[0], out, 1, &r)) return err_set(err, err_size, "cnndm: out of memory scoring");
    *value = r.f1;
    return 0;
}

const task_def task_def_cnndm = {
    .name = "cnndm",
    .summary = "CNN/DailyMail, first 100 test articles; ROUGE-L F1",
    .metric = "rougeL_f1",
    .run = TASK_RUN_GENERATE,
    .stream = 2,
    .open = cnndm_open,
    .get = cnndm_get,
    .gen_tokens = cnndm_gen_tokens,
    .score = cnndm_score,
};
