/* task_squad.c - SQuAD 1.1 dev, 1-shot with seeded confusion paragraphs
 * (format in tasks.h). */
#include "util/err.h"
#include "eval/task_impl.h"
#include "util/paths.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *title, *context;
    size_t title_len, context_len;
    int64_t q_begin, q_end;     /* its questions: qs[q_begin..q_end) */
} squad_para;

typedef struct {
    int64_t para;
    const json_value *qa;       /* {"question", "id", "answers": [{"text"}]} */
} squad_q;

/* The set's index over the JSON DOM (task_set.priv). */
typedef struct {
    squad_para *paras;
    int64_t n_paras;
    squad_q *qs;
    int64_t n_qs;
} squad_data;

/* SQuAD titles are Wikipedia page names: underscores stand for spaces. */
static void sb_add_title(sbuf *b, const char *s, size_t n)
{
    size_t start = b->n;
    sb_add(b, s, n);
    if (b->oom) return;
    for (size_t i = start; i < b->n; i++)
        if (b->s[i] == '_') b->s[i] = ' ';
}

/* Walks data[].paragraphs[].qas[] of every document; with fill = 0 only
 * counts (and validates), with fill = 1 writes paras/qs. */
static int squad_walk(const task_set *s, squad_data *S, int fill, int64_t *n_paras, int64_t *n_qs, char *err, size_t err_size)
{
    int64_t np = 0, nq = 0;
    for (int d = 0; d < 2 && s->docs[d]; d++) {
        const json_value *data = json_get(json_root(s->docs[d]), "data");
        if (!data || data->type != JSON_ARRAY)
            return err_set(err, err_size, "squad: file %d has no \"data\" array", d + 1);
        for (size_t a = 0; a < data->n; a++) {
            const json_value *art = json_at(data, a);
            size_t tlen;
            const char *title = json_get_str(art, "title", &tlen);
            const json_value *pars = json_get(art, "paragraphs");
            if (!title || !pars || pars->type != JSON_ARRAY)
                return err_set(err, err_size, "squad: data[%zu] lacks \"title\" or \"paragraphs\"", a);
            for (size_t pi = 0; pi < pars->n; pi++) {
                const json_value *par = json_at(pars, pi);
                size_t clen;
                const char *ctx = json_get_str(par, "context", &clen);
                const json_value *qas = json_get(par, "qas");
                if (!ctx || !qas || qas->type != JSON_ARRAY)
                    return err_set(err, err_size, "squad: data[%zu].paragraphs[%zu] lacks \"context\" or \"qas\"",
                                   a, pi);
                if (fill) S->paras[np] = (squad_para){ title, ctx, tlen, clen, nq, nq + (int64_t)qas->n };
                for (size_t qi = 0; qi < qas->n; qi++) {
                    const json_value *qa = json_at(qas, qi);
                    const json_value *ans = json_get(qa, "answers");
                    if (!json_get_str(qa, "question", NULL) || !ans || ans->type != JSON_ARRAY)
                        return err_set(err, err_size,
                                       "squad: data[%zu].paragraphs[%zu].qas[%zu] lacks \"question\" or \"answers\"",
                                       a, pi, qi);
                    for (size_t k = 0; k < ans->n; k++)
                        if (!json_get_str(json_at(ans, k), "text", NULL))
                            return err_set(err, err_size,
                                           "squad: data[%zu].paragraphs[%zu].qas[%zu].answers[%zu] has no \"text\"",
                                           a, pi, qi, k);
                    if (fill) S->qs[nq] = (squad_q){ np, qa };
                    nq++;
                }
                np++;
            }
        }
    }
    *n_paras = np;
    *n_qs = nq;
    return 0;
}

static void squad_free(void *priv)
{
    squad_data *S = priv;
    free(S->paras);
    free(S->qs);
    free(S);
}

static int squad_open(task_set *s, char *err, size_t err_size)
{
    char path[TASK_PATH_MAX];
    if (s->p.path) {
        if (!(s->docs[0] = task_parse_json_file("squad", s->p.path, err, err_size))) return -1;
    } else if (path_find("data/qa/squad/dev-v1.1.json", path, sizeof path) == 0) {
        if (!(s->docs[0] = task_parse_json_file("squad", path, err, err_size))) return -1;
    } else {
        static const char *const parts[2] = { "data/qa/squad/dev-v1.1.part1of2.json",
                                              "data/qa/squad/dev-v1.1.part2of2.json" };
        for (int i = 0; i < 2; i++) {
            if (task_find_data("squad", parts[i], path, sizeof path, err, err_size)) return -1;
            if (!(s->docs[i] = task_parse_json_file("squad", path, err, err_size))) return -1;
        }
    }
    squad_data *S = calloc(1, sizeof *S);
    if (!S) return err_set(err, err_size, "squad: out of memory");
    s->priv = S;
    int64_t np, nq;
    if (squad_walk(s, S, 0, &np, &nq, err, err_size)) return -1;
    if (np < 1 || nq < 1) return err_set(err, err_size, "squad: no questions in the data");
    S->paras = malloc((size_t)np * sizeof *S->paras);
    S->qs = malloc((size_t)nq * sizeof *S->qs);
    if (!S->paras || !S->qs) return err_set(err, err_size, "squad: out of memory");
    if (squad_walk(s, S, 1, &np, &nq, err, err_size)) return -1;
    S->n_paras = np;
    S->n_qs = nq;
    s->n_examples = nq;
    return task_make_perm(s, nq, err, err_size);
}

/* The shortest answer text of a question (the first of equal length), or
 * NULL if it has none. */
static const char *squad_short_answer(const squad_q *q, size_t *len)
{
    const json_value *ans = json_get(q->qa, "answers");
    const char *best = NULL;
    size_t best_len = 0;
    for (size_t k = 0; k < json_len(ans); k++) {
        size_t l;
        const char *t = json_get_str(json_at(ans, k), "text", &l);
        if (t && (!best || l < best_len)) { best = t; best_len = l; }
    }
    *len = best_len;
    return best;
}

static int squad_same_context(const squad_para *a, const squad_para *b)
{
    return a->context_len == b->context_len && memcmp(a->context, b->context, a->context_len) == 0 &&
           a->title_len == b->title_len && memcmp(a->title, b->title, a->title_len) == 0;
}

/* The prompt's paragraphs: the true one (slots[0] before shuffling) and up
 * to `want` others, distinct, drawn by a partial Fisher-Yates
 * over all paragraph indices (copies of the true text are skipped), then
 * shuffled. Returns the number of slots, or -1 on OOM. */
static int64_t squad_pick_paragraphs(const squad_data *S, int64_t para, int64_t want, task_rng *r, int64_t *slots)
{
    const squad_para *P = &S->paras[para];
    int64_t *cand = malloc((size_t)S->n_paras * sizeof *cand);
    if (!cand) return -1;
    for (int64_t k = 0; k < S->n_paras; k++) cand[k] = k;
    int64_t n = 0;
    slots[n++] = para;
    for (int64_t j = 0; j < S->n_paras && n < want + 1; j++) {
        int64_t pick = j + (int64_t)task_rng_below(r, (uint64_t)(S->n_paras - j));
        int64_t t = cand[j];
        cand[j] = cand[pick];
        cand[pick] = t;
        if (cand[j] != para && !squad_same_context(&S->paras[cand[j]], P)) slots[n++] = cand[j];
    }
    free(cand);
    for (int64_t k = n - 1; k > 0; k--) {
        int64_t j = (int64_t)task_rng_below(r, (uint64_t)k + 1);
        int64_t t = slots[k];
        slots[k] = slots[j];
        slots[j] = t;
    }
    return n;
}

/* The 1-shot example: a random other answered question on the same
 * paragraph, else (as the authors fell back to) one from the whole set. */
static const squad_q *squad_pick_shot(const squad_data *S, int64_t qi, task_rng *r)
{
    const squad_para *P = &S->paras[S->qs[qi].para];
    size_t alen;
    int64_t n_same = 0;
    for (int64_t k = P->q_begin; k < P->q_end; k++)
        if (k != qi && squad_short_answer(&S->qs[k], &alen)) n_same++;
    if (n_same > 0) {
        int64_t pick = (int64_t)task_rng_below(r, (uint64_t)n_same);
        for (int64_t k = P->q_begin; k < P->q_end; k++)
            if (k != qi && squad_short_answer(&S->qs[k], &alen) && pick-- == 0) return &S->qs[k];
    }
    for (int tries = 0; tries < 1000; tries++) {
        int64_t k = (int64_t)task_rng_below(r, (uint64_t)S->n_qs);
        if (k != qi && squad_short_answer(&S->qs[k], &alen)) return &S->qs[k];
    }
    return NULL;
}

static int squad_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const squad_data *S = s->priv;
    int64_t qi = s->perm[i];
    const squad_q *q = &S->qs[qi];
    const squad_para *P = &S->paras[q->para];
    task_rng r;
    task_rng_init(&r, s, qi);
    int64_t want = s->p.squad_confusion < 0 ? 0 : s->p.squad_confusion;
    if (want > S->n_paras - 1) want = S->n_paras - 1;
    int64_t *slots = malloc((size_t)(want + 1) * sizeof *slots);
    int64_t n_slots = slots ? squad_pick_paragraphs(S, q->para, want, &r, slots) : -1;
    if (n_slots < 0) {
        free(slots);
        return err_set(err, err_size, "squad: out of memory");
    }
    const squad_q *shot = squad_pick_shot(S, qi, &r);
    if (!shot) {
        free(slots);
        return err_set(err, err_size, "squad: no other answered question to use as the 1-shot example");
    }

    sbuf b = { 0 };
    for (int64_t k = 0; k < n_slots; k++) {
        const squad_para *c = &S->paras[slots[k]];
        if (k) sb_adds(&b, "\n");
        sb_adds(&b, "Title: ");
        sb_add_title(&b, c->title, c->title_len);
        sb_adds(&b, ". Background: ");
        sb_add(&b, c->context, c->context_len);
    }
    free(slots);
    sb_adds(&b, "\nFrom what you've just read about ");
    sb_add_title(&b, P->title, P->title_len);
    sb_adds(&b, ", please answer the following questions.");
    ex->n_context = b.n;
    size_t qlen, alen;
    const char *qtext = json_get_str(shot->qa, "question", &qlen);
    const char *atext = squad_short_answer(shot, &alen);
    sb_adds(&b, "\nQuestion: ");
    sb_add(&b, qtext, qlen);
    sb_adds(&b, "\nAnswer: ");
    sb_add(&b, atext, alen);
    qtext = json_get_str(q->qa, "question", &qlen);
    sb_adds(&b, "\nQuestion: ");
    sb_add(&b, qtext, qlen);
    sb_adds(&b, "\nAnswer:");
    if (sb_finish(&b, ex, err, err_size)) return -1;

    const json_value *ans = json_get(q->qa, "answers");
    for (size_t k = 0; k < json_len(ans); k++) {
        size_t l;
        const char *t = json_get_str(json_at(ans, k), "text", &l);
        if (task_add_answer(ex, t, l)) return err_set(err, err_size, "squad: out of memory");
    }
    size_t idlen;
    const char *id = json_get_str(q->qa, "id", &idlen);
    ex->id = id ? task_dup_n(id, idlen) : task_dup_printf("squad-%lld", (long long)qi);
    if (!ex->id) return err_set(err, err_size, "squad: out of memory");
    return 0;
}

static const task_option squad_options[] = {
    { "--squad-confusion", TASK_OPT_INT, offsetof(task_params, squad_confusion), 0, "N",
      "confusion paragraphs beside the true one (default 7; 0 = none)" },
    { 0 },
};

const task_def task_def_squad = {
    .name = "squad",
    .summary = "SQuAD 1.1 dev, 1-shot, confusion paragraphs; accuracy",
    .metric = "accuracy",
    .run = TASK_RUN_GENERATE,
    .stream = 0,
    .options = squad_options,
    .open = squad_open,
    .get = squad_get,
    .free_priv = squad_free,
    .gen_tokens = task_qa_gen_tokens,
    .score = task_score_qa,
};
