/* task_triviaqa.c - closed-book TriviaQA: "Question: ..\nAnswer:" (tasks.h). */
#include "util/err.h"
#include "eval/task_impl.h"

#include <string.h>

static int triviaqa_keep(const task_set *s, const json_value *it, size_t i, char *err, size_t err_size)
{
    (void)s;
    if (!json_get_str(it, "question", NULL))
        return err_set(err, err_size, "triviaqa: item %zu has no \"question\"", i);
    return 1;
}

static int triviaqa_open(task_set *s, char *err, size_t err_size)
{
    return task_list_open(s, "data/qa/triviaqa/triviaqa_closedbook_sample_RAGE.json", triviaqa_keep, err,
                          err_size);
}

/* Answers of a TriviaQA item: "answer" (string, list, or {"aliases", "value"})
 * or "answers" (list). */
static int triviaqa_answers(const json_value *it, task_example *ex)
{
    const json_value *a = json_get(it, "answer");
    if (!a) a = json_get(it, "answers");
    if (a && a->type == JSON_OBJECT) {
        const json_value *v = json_get(a, "value");
        size_t l;
        const char *t = json_str(v, &l);
        if (t && task_add_answer(ex, t, l)) return -1;
        a = json_get(a, "aliases");
    }
    if (a && a->type == JSON_STRING) return task_add_answer(ex, a->u.str, a->n);
    for (size_t k = 0; k < json_len(a); k++) {
        size_t l;
        const char *t = json_str(json_at(a, k), &l);
        if (t && task_add_answer(ex, t, l)) return -1;
    }
    return 0;
}

static int triviaqa_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const json_value *it = s->items[i];
    sbuf b = { 0 };
    size_t clen, qlen;
    const char *ctx = json_get_str(it, "context", &clen);
    if (ctx && clen) {
        sb_add(&b, ctx, clen);
        ex->n_context = b.n;
        sb_adds(&b, "\n");
    }
    const char *q = json_get_str(it, "question", &qlen);
    sb_adds(&b, "Question: ");
    sb_add(&b, q, qlen);
    sb_adds(&b, "\nAnswer:");
    if (sb_finish(&b, ex, err, err_size)) return -1;
    if (triviaqa_answers(it, ex)) return err_set(err, err_size, "triviaqa: out of memory");
    size_t idlen;
    const char *id = json_get_str(it, "question_id", &idlen);
    if (!id) id = json_get_str(it, "id", &idlen);
    ex->id = id ? task_dup_n(id, idlen) : task_dup_printf("triviaqa-%lld", (long long)i);
    if (!ex->id) return err_set(err, err_size, "triviaqa: out of memory");
    return 0;
}

const task_def task_def_triviaqa = {
    .name = "triviaqa",
    .summary = "TriviaQA closed-book sample (164 questions); accuracy",
    .metric = "accuracy",
    .run = TASK_RUN_GENERATE,
    .stream = 1,
    .open = triviaqa_open,
    .get = triviaqa_get,
    .gen_tokens = task_qa_gen_tokens,
    .score = task_score_qa,
};
