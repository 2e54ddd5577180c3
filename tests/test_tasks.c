/* test_tasks.c - the evaluation task builders against the data in
 * ../shared/data. Structure is checked against an independent reading of
 * the same files (the SQuAD JSON walked here, raw text offsets, essays);
 * the SQuAD seed-0 example 0 is pinned after checking it by hand (and
 * against a Python re-implementation of the authors' format). Each task is
 * skipped when its data is absent. */
#include "util/json.h"
#include "eval/metrics.h"
#include "util/paths.h"
#include "eval/tasks.h"
#include "test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static int have(const char *name)
{
    char path[4096];
    if (path_find(name, path, sizeof path) == 0) return 1;
    char msg[512];
    snprintf(msg, sizeof msg, "%s not found in search path", name);
    test_skip(msg);
    return 0;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static int count_occ(const char *hay, const char *needle)
{
    int c = 0;
    size_t k = strlen(needle);
    for (const char *p = strstr(hay, needle); p; p = strstr(p + k, needle)) c++;
    return c;
}

static int is_space_byte(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Byte offset after k code points of s, or -1. */
static long advance_cp(const char *s, size_t n, long k)
{
    size_t i = 0;
    while (k-- > 0) {
        if (i >= n) return -1;
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    }
    return (long)i;
}

static int has_space(const char *s, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (is_space_byte((unsigned char)s[i])) return 1;
    return 0;
}

/* ---- squad --------------------------------------------------------------- */

typedef struct {
    char *fmt;          /* "Title: {title}. Background: {context}" */
    char *title;        /* underscores replaced */
    long q_begin, q_end;
} ref_para;

typedef struct {
    const json_value *qa;
    long para;
} ref_q;

static char *fmt_para(const char *title, size_t tl, const char *ctx, size_t cl)
{
    char *s = malloc(tl + cl + 32);
    if (!s) return NULL;
    int k = sprintf(s, "Title: ");
    memcpy(s + k, title, tl);
    for (size_t i = 0; i < tl; i++)
        if (s[k + i] == '_') s[k + i] = ' ';
    k += (int)tl;
    k += sprintf(s + k, ". Background: ");
    memcpy(s + k, ctx, cl);
    s[k + cl] = 0;
    return s;
}

static const char *shortest_answer(const json_value *qa)
{
    const json_value *ans = json_get(qa, "answers");
    const char *best = NULL;
    for (size_t k = 0; k < json_len(ans); k++) {
        const char *t = json_get_str(json_at(ans, k), "text", NULL);
        if (!best || strlen(t) < strlen(best)) best = t;
    }
    return best;
}

static void test_squad(void)
{
    if (!have("data/qa/squad/dev-v1.1.part1of2.json") || !have("data/qa/squad/dev-v1.1.part2of2.json")) return;

    /* The reference reading of the data: the two parts, walked here. */
    json_doc *docs[2] = { NULL, NULL };
    ref_para *paras = NULL;
    ref_q *qs = NULL;
    long np = 0, nq = 0;
    for (int d = 0; d < 2; d++) {
        char path[4096];
        path_find(d ? "data/qa/squad/dev-v1.1.part2of2.json" : "data/qa/squad/dev-v1.1.part1of2.json", path,
                  sizeof path);
        size_t n;
        char *text = test_read_file(path, &n);
        docs[d] = text ? json_parse(text, n, 0, NULL, 0) : NULL;
        free(text);
        CHECK(docs[d] != NULL, "SQuAD part %d parses", d + 1);
        if (!docs[d]) goto out;
    }
    paras = calloc(3000, sizeof *paras);
    qs = calloc(12000, sizeof *qs);
    if (!paras || !qs) goto out;
    for (int d = 0; d < 2; d++) {
        const json_value *data = json_get(json_root(docs[d]), "data");
        for (size_t a = 0; a < json_len(data); a++) {
            const json_value *art = json_at(data, a);
            size_t tl;
            const char *title = json_get_str(art, "title", &tl);
            const json_value *ps = json_get(art, "paragraphs");
            for (size_t p = 0; p < json_len(ps) && np < 3000; p++) {
                size_t cl;
                const char *ctx = json_get_str(json_at(ps, p), "context", &cl);
                const json_value *qas = json_get(json_at(ps, p), "qas");
                paras[np].fmt = fmt_para(title, tl, ctx, cl);
                paras[np].title = fmt_para(title, tl, "", 0); /* "Title: X. Background: " */
                paras[np].q_begin = nq;
                for (size_t q = 0; q < json_len(qas) && nq < 12000; q++) qs[nq++] = (ref_q){ json_at(qas, q), np };
                paras[np].q_end = nq;
                np++;
            }
        }
    }
    CHECK(np == 2067 && nq == 10570, "SQuAD dev: %ld paragraphs, %ld questions", np, nq);

    task_params p = task_default_params();
    task_set *s = NULL;
    char err[512];
    CHECK(task_open(&s, &task_def_squad, &p, err, sizeof err) == 0, "open squad: %s", err);
    if (!s) goto out;
    CHECK(task_count(s) == nq, "squad count %lld", (long long)task_count(s));

    int n_ex = test_quick() ? 12 : 60;
    unsigned slot_seen = 0; /* the slots where the true paragraph landed */
    for (int i = 0; i < n_ex; i++) {
        task_example ex;
        if (task_get(s, i, &ex, err, sizeof err)) { CHECK(0, "squad example %d: %s", i, err); continue; }
        long qi = -1;
        for (long k = 0; k < nq && qi < 0; k++)
            if (!strcmp(json_get_str(qs[k].qa, "id", NULL), ex.id)) qi = k;
        CHECK(qi >= 0, "example %d: id %s is a SQuAD question", i, ex.id);
        if (qi < 0) { task_example_free(&ex); continue; }
        const ref_para *P = &paras[qs[qi].para];
        const char *question = json_get_str(qs[qi].qa, "question", NULL);

        /* trailer: the question itself */
        char tail[1024];
        snprintf(tail, sizeof tail, "\nQuestion: %s\nAnswer:", question);
        CHECK(ends_with(ex.prompt, ex.n_prompt, tail), "example %d ends with its question", i);

        /* header: the true paragraph's title; n_context points at the shot */
        const char *title = P->title + 7; /* skip "Title: " */
        size_t title_len = strlen(title) - strlen(". Background: ");
        char head[1024];
        snprintf(head, sizeof head, "\nFrom what you've just read about %.*s, please answer the following questions.",
                 (int)title_len, title);
        CHECK(ex.n_context >= strlen(head) && !memcmp(ex.prompt + ex.n_context - strlen(head), head, strlen(head)),
              "example %d: header names the title", i);
        CHECK(starts_with(ex.prompt + ex.n_context, "\nQuestion: "), "example %d: the shot follows the header", i);
        CHECK(count_occ(ex.prompt, "\nFrom what you've just read about ") == 1, "one header");

        /* the 8 paragraphs: real, distinct, the true one exactly once */
        size_t body_len = ex.n_context - strlen(head);
        char *body = malloc(body_len + 1);
        memcpy(body, ex.prompt, body_len);
        body[body_len] = 0;
        CHECK(starts_with(body, "Title: ") && count_occ(body, "\nTitle: ") == 7, "example %d: 8 paragraphs", i);
        const char *seg[8];
        int nseg = 0;
        seg[nseg++] = body;
        for (char *c = strstr(body, "\nTitle: "); c && nseg < 8; c = strstr(c + 1, "\nTitle: ")) {
            *c = 0;
            seg[nseg++] = c + 1;
        }
        int all_real = nseg == 8, true_count = 0, distinct = 1;
        for (int a = 0; a < nseg; a++) {
            int found = 0;
            for (long k = 0; k < np && !found; k++) found = !strcmp(seg[a], paras[k].fmt);
            all_real &= found;
            if (!strcmp(seg[a], P->fmt)) slot_seen |= 1u << a;
            true_count += !strcmp(seg[a], P->fmt);
            for (int b = 0; b < a; b++) distinct &= strcmp(seg[a], seg[b]) != 0;
        }
        CHECK(all_real && distinct && true_count == 1, "example %d: paragraphs real %d distinct %d true x%d", i,
              all_real, distinct, true_count);
        free(body);

        /* the shot: another question on the same paragraph, shortest answer */
        const char *shot = ex.prompt + ex.n_context + strlen("\nQuestion: ");
        const char *shot_end = strstr(shot, "\nAnswer: ");
        int shot_ok = 0;
        if (shot_end) {
            const char *ans = shot_end + strlen("\nAnswer: ");
            const char *ans_end = strstr(ans, "\nQuestion: ");
            for (long k = P->q_begin; k < P->q_end && ans_end; k++) {
                const char *qt = json_get_str(qs[k].qa, "question", NULL);
                const char *sa = shortest_answer(qs[k].qa);
                if (k != qi && strlen(qt) == (size_t)(shot_end - shot) && !memcmp(qt, shot, strlen(qt)) &&
                    strlen(sa) == (size_t)(ans_end - ans) && !memcmp(sa, ans, strlen(sa)))
                    shot_ok = 1;
            }
        }
        CHECK(shot_ok || P->q_end - P->q_begin < 2, "example %d: the shot is another question of the paragraph", i);

        /* answers: the question's distinct answer texts */
        const json_value *ans = json_get(qs[qi].qa, "answers");
        int ans_ok = ex.n_answers >= 1;
        for (size_t k = 0; k < json_len(ans); k++) {
            int f = 0;
            for (int m = 0; m < ex.n_answers; m++) f |= !strcmp(ex.answers[m], json_get_str(json_at(ans, k), "text", NULL));
            ans_ok &= f;
        }
        CHECK(ans_ok && ex.n_answers <= (int)json_len(ans), "example %d: answers", i);
        CHECK(metrics_qa_match(ex.answers[0], (const char *const *)ex.answers, ex.n_answers) == 1,
              "a gold answer matches itself");
        task_example_free(&ex);
    }

    CHECK(__builtin_popcount(slot_seen) >= 4, "the true paragraph's slot is shuffled (slots 0x%02x)", slot_seen);

    /* pinned: seed 0, example 0 (checked by hand: question 5730035e... on
     * the Islamism paragraph "Roughly contemporaneous with Maududi ...", the
     * shot "The motto of the Muslim Brotherhood ..." is from that paragraph,
     * seven other real paragraphs, Islamism's is the fifth) */
    task_example e0, e0b, e5, e5b;
    if (task_get(s, 0, &e0, err, sizeof err) == 0) {
        const char *first200 =
            "Title: Kenya. Background: Tea, coffee, sisal, pyrethrum, corn, and wheat are grown in the fertile "
            "highlands, one of the most successful agricultural production regions in Africa. Livestock predominate";
        CHECK(strlen(first200) == 200, "pinned prefix is 200 chars");
        CHECK(!strncmp(e0.prompt, first200, 200), "seed 0 example 0 prefix:\n%.200s", e0.prompt);
        CHECK(e0.n_prompt == 6101 && e0.n_context == 5909, "seed 0 example 0: %zu bytes, context %zu", e0.n_prompt,
              e0.n_context);
        CHECK(!strcmp(e0.id, "5730035e04bcaa1900d77005"), "seed 0 example 0 id %s", e0.id);
        CHECK(ends_with(e0.prompt, e0.n_prompt, "\nFrom what you've just read about Islamism, please answer the "
                                                "following questions.\nQuestion: The motto of the Muslim Brotherhood "
                                                "specifies what as being their constitution?\nAnswer: Qur'an\nQuestion: "
                                                "What influence did Al Banna wish to eliminate from the Muslim world?"
                                                "\nAnswer:"),
              "seed 0 example 0 tail");
        CHECK(e0.n_answers == 2 && !strcmp(e0.answers[0], "imperialist") &&
                  !strcmp(e0.answers[1], "imperialist influence"),
              "seed 0 example 0 answers");
        /* determinism, and independence from the order of building */
        task_get(s, 5, &e5, err, sizeof err);
        for (int k = 1; k < 5; k++) {
            task_example t;
            if (task_get(s, k, &t, err, sizeof err) == 0) task_example_free(&t);
        }
        task_get(s, 0, &e0b, err, sizeof err);
        task_get(s, 5, &e5b, err, sizeof err);
        CHECK(e0b.n_prompt == e0.n_prompt && !memcmp(e0.prompt, e0b.prompt, e0.n_prompt), "example 0 rebuilt");
        CHECK(e5b.n_prompt == e5.n_prompt && !memcmp(e5.prompt, e5b.prompt, e5.n_prompt), "example 5 rebuilt");
        task_example_free(&e0);
        task_example_free(&e0b);
        task_example_free(&e5);
        task_example_free(&e5b);
    } else {
        CHECK(0, "squad example 0: %s", err);
    }
    task_example bad;
    CHECK(task_get(s, task_count(s), &bad, err, sizeof err) == -1 && strstr(err, "out of range"),
          "index past the end: %s", err);
    CHECK(bad.prompt == NULL && bad.n_answers == 0, "failed build leaves the example empty");
    task_close(s);
out:
    for (long k = 0; paras && k < np; k++) {
        free(paras[k].fmt);
        free(paras[k].title);
    }
    free(paras);
    free(qs);
    json_free(docs[0]);
    json_free(docs[1]);
}

/* ---- triviaqa, cnndm ----------------------------------------------------- */

static void test_triviaqa(void)
{
    if (!have("data/qa/triviaqa/triviaqa_closedbook_sample_RAGE.json")) return;
    task_set *s;
    char err[512];
    task_params p = task_default_params();
    CHECK(task_open(&s, &task_def_triviaqa, &p, err, sizeof err) == 0, "open triviaqa: %s", err);
    if (!s) return;
    CHECK(task_count(s) == 164, "triviaqa count %lld", (long long)task_count(s));
    task_example ex;
    if (task_get(s, 4, &ex, err, sizeof err) == 0) {
        CHECK(!strcmp(ex.prompt, "Question: In Shakespeare's 'Hamlet', what was the name of 'Hamlet's' mother?\nAnswer:"),
              "triviaqa prompt: %s", ex.prompt);
        CHECK(ex.n_context == 0, "closed book: no context");
        CHECK(ex.n_answers == 1 && !strcmp(ex.answers[0], "'GERTRUDE'"), "triviaqa answer");
        CHECK(metrics_qa_match(" Gertrude, Queen of Denmark", (const char *const *)ex.answers, ex.n_answers) == 1,
              "Gertrude matches 'GERTRUDE'");
        task_example_free(&ex);
    }
    task_close(s);
}

static void test_cnndm(void)
{
    if (!have("data/qa/cnn_dailymail/cnn_dailymail_test_first100.json")) return;
    task_set *s;
    char err[512];
    task_params p = task_default_params();
    CHECK(task_open(&s, &task_def_cnndm, &p, err, sizeof err) == 0, "open cnndm: %s", err);
    if (!s) return;
    CHECK(task_count(s) == 100, "cnndm count %lld", (long long)task_count(s));
    task_example ex;
    if (task_get(s, 0, &ex, err, sizeof err) == 0) {
        CHECK(starts_with(ex.prompt, "Article: (CNN)The Palestinian Authority officially became the 123rd member"),
              "cnndm prompt start");
        CHECK(ends_with(ex.prompt, ex.n_prompt, "\nSummary:") && ex.n_context == ex.n_prompt - 9, "cnndm prompt end");
        CHECK(!strcmp(ex.id, "f001ec5c4704938247d27a44948eebb37ae98d01"), "cnndm id %s", ex.id);
        CHECK(ex.n_answers == 1 && starts_with(ex.answers[0], "Membership gives the ICC jurisdiction"),
              "cnndm reference: %.60s", ex.answers[0]);
        metrics_rouge r;
        metrics_rouge_l(ex.answers[0], ex.answers[0], 1, &r);
        CHECK(r.f1 == 1.0, "a reference scores 1 against itself");
        task_example_free(&ex);
    }
    task_close(s);
    /* the authors' 4000-8000 character filter keeps 31 of the 100 */
    p.cnndm_min_chars = 4000;
    p.cnndm_max_chars = 8000;
    CHECK(task_open(&s, &task_def_cnndm, &p, err, sizeof err) == 0, "open cnndm filtered: %s", err);
    if (!s) return;
    CHECK(task_count(s) == 31, "filtered cnndm count %lld", (long long)task_count(s));
    int in_range = 1;
    for (int64_t i = 0; i < task_count(s); i++) {
        if (task_get(s, i, &ex, err, sizeof err)) { in_range = 0; continue; }
        int64_t c = metrics_utf8_chars(ex.prompt + 9, ex.n_context - 9);
        in_range &= c >= 4000 && c <= 8000;
        task_example_free(&ex);
    }
    CHECK(in_range, "filtered articles are 4000-8000 characters");
    task_close(s);
}

/* ---- wikitext ------------------------------------------------------------ */

static void test_wikitext(void)
{
    const char *name = "data/text/wikitext-2-raw_wiki.test.raw";
    if (!have(name)) return;
    char path[4096];
    path_find(name, path, sizeof path);
    size_t n;
    char *raw = test_read_file(path, &n);
    task_set *s, *s1;
    char err[512];
    task_params p = task_default_params();
    CHECK(raw && task_open(&s, &task_def_wikitext, &p, err, sizeof err) == 0, "open wikitext: %s", err);
    if (!raw || !s) { free(raw); return; }
    p.seed = 1;
    CHECK(task_open(&s1, &task_def_wikitext, &p, err, sizeof err) == 0, "open wikitext seed 1: %s", err);
    CHECK(task_count(s) == 170, "wikitext windows %lld", (long long)task_count(s));
    int ok = 1, article_starts = 0;
    for (int64_t i = 0; i < task_count(s); i++) {
        task_example ex;
        if (task_get(s, i, &ex, err, sizeof err)) { ok = 0; break; }
        size_t off = (size_t)strtoull(ex.id + strlen("wikitext-"), NULL, 10);
        const char *ref = ex.answers[0];
        size_t rl = strlen(ref), pl = ex.n_prompt;
        /* prefill then reference, contiguous in the file */
        int here = off + pl + rl <= n && !memcmp(raw + off, ex.prompt, pl) && !memcmp(raw + off + pl, ref, rl);
        /* the authors' rule: >= 6000 chars then up to the next whitespace;
         * the reference: whitespace + >= 399 chars up to whitespace */
        long p6000 = advance_cp(ex.prompt, pl, 6000), r400 = advance_cp(ref, rl, 400);
        int shape = p6000 >= 0 && !has_space(ex.prompt, (size_t)p6000, pl) && r400 >= 0 &&
                    is_space_byte((unsigned char)ref[0]) && !has_space(ref, (size_t)r400, rl) &&
                    (off + pl + rl == n || is_space_byte((unsigned char)raw[off + pl + rl]));
        if (!here || !shape) {
            fprintf(stderr, "wikitext example %lld: in file %d, shape %d\n", (long long)i, here, shape);
            ok = 0;
        }
        article_starts += (off == 0 || raw[off - 1] == '\n') && starts_with(ex.prompt, " = ") && ex.prompt[3] != '=';
        task_example_free(&ex);
    }
    CHECK(ok, "wikitext windows are contiguous prefill/reference pairs of the file");
    CHECK(article_starts == 49, "49 articles give the authors' first window (%d)", article_starts);
    if (s1) {
        task_example a, b;
        if (task_get(s, 0, &a, err, sizeof err) == 0 && task_get(s1, 0, &b, err, sizeof err) == 0) {
            CHECK(strcmp(a.id, b.id) != 0, "another seed gives another order");
            task_example_free(&a);
            task_example_free(&b);
        }
        task_close(s1);
    }
    task_close(s);
    free(raw);
}

/* ---- repetition ---------------------------------------------------------- */

static void test_repetition(void)
{
    const char *name = "data/text/tinyshakespeare_input.txt";
    if (!have(name)) return;
    char path[4096];
    path_find(name, path, sizeof path);
    size_t n;
    char *raw = test_read_file(path, &n);
    task_set *s;
    char err[512];
    task_params p = task_default_params();
    CHECK(raw && task_open(&s, &task_def_repetition, &p, err, sizeof err) == 0, "open repetition: %s", err);
    if (!raw || !s) { free(raw); return; }
    /* 2775 = the count of the authors' regexes on this file (checked in Python) */
    CHECK(task_count(s) == 2775, "repetition examples %lld", (long long)task_count(s));
    int ok = 1, step = test_quick() ? 37 : 1;
    for (int64_t i = 0; i < task_count(s); i += step) {
        task_example ex;
        if (task_get(s, i, &ex, err, sizeof err)) { ok = 0; break; }
        size_t off = (size_t)strtoull(ex.id, NULL, 10);
        const char *ctx = ex.prompt, *excerpt = ex.prompt + ex.n_context + 1, *ref = ex.answers[0];
        size_t cl = ex.n_context, el = ex.n_prompt - ex.n_context - 1, rl = strlen(ref);
        int good = ex.prompt[cl] == '\n' && off + el + rl <= n && !memcmp(raw + off, excerpt, el) &&
                   !memcmp(raw + off + el, ref, rl);
        /* excerpt and continuation lie inside the context, in order */
        char *both = malloc(el + rl + 1);
        memcpy(both, excerpt, el);
        memcpy(both + el, ref, rl);
        both[el + rl] = 0;
        char *ctx0 = malloc(cl + 1);
        memcpy(ctx0, ctx, cl);
        ctx0[cl] = 0;
        good &= strstr(ctx0, both) != NULL;
        good &= metrics_utf8_chars(excerpt, el) >= 128 && metrics_utf8_chars(ref, rl) >= 256 &&
                metrics_utf8_chars(ctx, cl) >= 6000 && is_space_byte((unsigned char)ref[0]);
        if (i % 500 == 0) good &= memmem(raw, n, ctx, cl) != NULL; /* the context is the file's text */
        if (!good) { fprintf(stderr, "repetition example %lld is malformed\n", (long long)i); ok = 0; }
        size_t lead = 0;
        while (lead < rl && is_space_byte((unsigned char)ref[lead])) lead++;
        CHECK(metrics_match_length(ref, rl, ref, rl) == metrics_utf8_chars(ref + lead, rl - lead),
              "the true continuation scores its length (less the stripped leading whitespace)");
        free(both);
        free(ctx0);
        task_example_free(&ex);
    }
    CHECK(ok, "repetition: prompt = context + \"\\n\" + excerpt, reference continues the excerpt");
    task_close(s);
    free(raw);
}

/* ---- niah ---------------------------------------------------------------- */

static const char *NEEDLE =
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";

static int64_t count_words(void *ctx, const char *text, size_t n)
{
    (void)ctx;
    int64_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_space_byte((unsigned char)text[i]) && (i == 0 || is_space_byte((unsigned char)text[i - 1]))) w++;
    return w;
}

static int niah_boundary(const char *h, size_t n, size_t i)
{
    return i >= 1 && i <= n && h[i - 1] == '.' && (i == n || is_space_byte((unsigned char)h[i]));
}

static void check_niah_example(const task_example *ex, const char *essays, size_t n_essays, double depth)
{
    const char *q = "\n\nQuestion: What is the best thing to do in San Francisco?\nAnswer: The best thing to do in San "
                    "Francisco is";
    CHECK(ends_with(ex->prompt, ex->n_prompt, q) && ex->n_context == ex->n_prompt - strlen(q), "niah question");
    CHECK(count_occ(ex->prompt, NEEDLE) == 1, "needle exactly once");
    CHECK(ex->n_answers == 1 && !strcmp(ex->answers[0], "eat a sandwich and sit in Dolores Park on a sunny day"),
          "niah answer");
    const char *at = strstr(ex->prompt, NEEDLE);
    if (!at) return;
    /* Take the needle (and the space joining it) out: the rest must be the
     * essays from the start, repeated as needed. */
    size_t pos = (size_t)(at - ex->prompt), nl = strlen(NEEDLE);
    char *hay = malloc(ex->n_context + 1);
    size_t h = 0;
    if (pos == 0) {
        memcpy(hay, ex->prompt + nl + 1, ex->n_context - nl - 1);
        h = ex->n_context - nl - 1;
    } else {
        memcpy(hay, ex->prompt, pos - 1);
        memcpy(hay + pos - 1, at + nl, ex->n_context - pos - nl);
        h = ex->n_context - nl - 1;
    }
    int same = 1;
    for (size_t i = 0; i < h && same; i++) same = hay[i] == essays[i % n_essays];
    CHECK(same, "the haystack is the essays' text");
    CHECK(h == 0 || hay[h - 1] == '.', "the haystack ends a sentence");
    size_t ins = pos == 0 ? 0 : pos - 1; /* insertion offset in the haystack */
    size_t target = (size_t)(depth * (double)h);
    /* ±one sentence: the first boundary at or after the target */
    int first = ins >= target || (depth == 0.0 && ins == 0);
    for (size_t i = target; i < ins && first; i++) first = !niah_boundary(hay, h, i);
    CHECK(first && (ins == 0 || niah_boundary(hay, h, ins)), "depth %.2f: needle at the next sentence boundary (%zu, target %zu)",
          depth, ins, target);
    CHECK(fabs(ex->depth - (h ? (double)ins / (double)h : 0.0)) < 1e-12, "reported depth %g", ex->depth);
    CHECK(ex->depth >= depth - 1e-12 && ex->depth - depth < 0.05, "depth %.2f achieved %.4f", depth, ex->depth);
    free(hay);
}

/* Without the single file, the essays directory (files in name order) is
 * used: a search-path entry holding only a link to that directory must give
 * the same haystack. */
static void test_niah_dir(const char *essays, size_t n_essays)
{
    char dir_path[4096], cwd[4096];
    if (path_find("data/text/PaulGrahamEssays", dir_path, sizeof dir_path) != 0) {
        test_skip("data/text/PaulGrahamEssays not found");
        return;
    }
    char real_dir[4096];
    if (!realpath(dir_path, real_dir) || !getcwd(cwd, sizeof cwd)) return;
    char root[] = "/tmp/sparq_niah_XXXXXX";
    if (!mkdtemp(root)) return;
    char d1[4200], d2[4200], link[4300];
    snprintf(d1, sizeof d1, "%s/data", root);
    snprintf(d2, sizeof d2, "%s/data/text", root);
    snprintf(link, sizeof link, "%s/data/text/PaulGrahamEssays", root);
    const char *env = getenv("SPARQ_MODEL_PATH");
    char *saved_env = env ? strdup(env) : NULL;
    if (mkdir(d1, 0700) == 0 && mkdir(d2, 0700) == 0 && symlink(real_dir, link) == 0 && chdir("/") == 0) {
        setenv("SPARQ_MODEL_PATH", root, 1);
        task_set *s;
        char err[512];
        task_params p = task_default_params();
        CHECK(task_open(&s, &task_def_niah, &p, err, sizeof err) == 0, "niah from the essays directory: %s", err);
        if (s) {
            task_example ex;
            if (task_niah_build(s, 0.3, 30000, &ex, err, sizeof err) == 0) {
                check_niah_example(&ex, essays, n_essays, 0.3);
                task_example_free(&ex);
            }
            task_close(s);
        }
        if (chdir(cwd) != 0) CHECK(0, "chdir back");
    }
    if (saved_env) setenv("SPARQ_MODEL_PATH", saved_env, 1);
    else unsetenv("SPARQ_MODEL_PATH");
    free(saved_env);
    unlink(link);
    rmdir(d2);
    rmdir(d1);
    rmdir(root);
}

/* The grid from --niah-lengths text and, without lengths, from the
 * context (docs/EVALUATION.md: max(160, n/4), n/2, 3n/4, n - 64); each
 * grid example reports its cell. */
static void test_niah_grid(void)
{
    if (!have("data/text/PaulGrahamEssays_all_sorted.txt")) return;
    task_set *s;
    char err[512];
    task_params p = task_default_params();
    p.niah_length_list = "300,2000";
    p.niah_depths = 3;
    if (task_open(&s, &task_def_niah, &p, err, sizeof err) == 0) {
        CHECK(task_count(s) == 6, "two lengths x three depths: %lld", (long long)task_count(s));
        const int64_t want_len[6] = { 300, 300, 300, 2000, 2000, 2000 };
        const double want_depth[6] = { 0, 0.5, 1, 0, 0.5, 1 };
        for (int i = 0; i < 6; i++) {
            task_example ex;
            if (task_get(s, i, &ex, err, sizeof err)) { CHECK(0, "niah %d: %s", i, err); continue; }
            CHECK(ex.grid_length == want_len[i] && ex.grid_depth == want_depth[i], "cell %d: %lld x %g", i,
                  (long long)ex.grid_length, ex.grid_depth);
            CHECK(ex.n_prompt <= (size_t)want_len[i] + 300, "byte budget %lld: %zu bytes", (long long)want_len[i],
                  ex.n_prompt);
            task_example_free(&ex);
        }
        task_close(s);
    } else {
        CHECK(0, "niah from a length list: %s", err);
    }
    p = task_default_params();
    p.n_ctx = 512;
    if (task_open(&s, &task_def_niah, &p, err, sizeof err) == 0) {
        CHECK(task_count(s) == 4 * 11, "default grid at 512: 4 lengths x 11 depths, %lld", (long long)task_count(s));
        const int64_t want[4] = { 160, 256, 384, 448 };
        for (int l = 0; l < 4; l++) {
            task_example ex;
            if (task_get(s, l * 11, &ex, err, sizeof err) == 0) {
                CHECK(ex.grid_length == want[l], "default length %d: %lld", l, (long long)ex.grid_length);
                task_example_free(&ex);
            }
        }
        task_close(s);
    } else {
        CHECK(0, "niah default grid: %s", err);
    }
    const char *const bad[] = { "0", "7", "300,", "300,x", "" };
    for (int i = 0; i < 5; i++) {
        p = task_default_params();
        p.niah_length_list = bad[i];
        CHECK(task_open(&s, &task_def_niah, &p, err, sizeof err) == -1 && strstr(err, "--niah-lengths"),
              "lengths '%s' refused: %s", bad[i], err);
    }
}

/* Options: parsed into task_params by the task's own table, below min refused. */
static void test_options(void)
{
    char err[256], names[256];
    task_params p = task_default_params();
    const task_option *o = task_option_find(&task_def_squad, "--squad-confusion");
    CHECK(o && task_option_set(&p, o, "0", err, sizeof err) == 0 && p.squad_confusion == 0, "confusion 0 is none");
    CHECK(o && task_option_set(&p, o, "-1", err, sizeof err) == -1 && strstr(err, "--squad-confusion"), "%s", err);
    CHECK(o && task_option_set(&p, o, "3x", err, sizeof err) == -1 && strstr(err, "not an integer"), "%s", err);
    CHECK(o && task_option_set(&p, o, "99999999999", err, sizeof err) == -1, "int overflow refused");
    CHECK(task_option_find(&task_def_squad, "--kvret-keys") == NULL, "kvret's option is not squad's");
    o = task_option_find(&task_def_wikitext, "--context-chars");
    CHECK(o && task_option_set(&p, o, "0", err, sizeof err) == -1, "context 0 refused");
    CHECK(o && task_option_set(&p, o, "5000000000", err, sizeof err) == 0 && p.context_chars == 5000000000LL,
          "context chars are 64-bit");
    CHECK(task_option_find(&task_def_repetition, "--context-chars") != NULL, "repetition shares --context-chars");
    o = task_option_find(&task_def_niah, "--niah-lengths");
    CHECK(o && task_option_set(&p, o, "100,200", err, sizeof err) == 0 && !strcmp(p.niah_length_list, "100,200"),
          "a list is kept as text");
    task_names(names, sizeof names, " ");
    for (int i = 0; i < task_def_count(); i++)
        CHECK(strstr(names, task_def_at(i)->name) != NULL && task_def_at(i)->metric && task_def_at(i)->summary,
              "task %d named, with a metric and summary", i);
    CHECK(!strcmp(names, "squad triviaqa cnndm wikitext repetition niah kvret fidelity"), "names: %s", names);
}

static void test_niah(void)
{
    const char *name = "data/text/PaulGrahamEssays_all_sorted.txt";
    if (!have(name)) return;
    char path[4096];
    path_find(name, path, sizeof path);
    size_t n_essays;
    char *essays = test_read_file(path, &n_essays);
    task_set *s;
    char err[512];
    int64_t lengths[2] = { 8000, 700000 }; /* the second repeats the essays */
    task_params p = task_default_params();
    p.niah_lengths = lengths;
    p.n_niah_lengths = 2;
    p.niah_depths = 5;
    CHECK(essays && task_open(&s, &task_def_niah, &p, err, sizeof err) == 0, "open niah: %s", err);
    if (!essays || !s) { free(essays); return; }
    lengths[0] = -1; /* the set keeps its own copy */
    CHECK(task_count(s) == 10, "niah grid 2 x 5");
    const double depths[] = { 0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0 };
    for (size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
        task_example ex;
        if (task_niah_build(s, depths[d], 20000, &ex, err, sizeof err)) { CHECK(0, "niah: %s", err); continue; }
        CHECK(ex.n_context <= 20000 + strlen(NEEDLE) + 1 && ex.n_context > 19000, "haystack about 20000 bytes");
        check_niah_example(&ex, essays, n_essays, depths[d]);
        task_example_free(&ex);
    }
    for (int64_t i = 0; i < task_count(s); i += test_quick() ? 4 : 1) {
        task_example ex;
        if (task_get(s, i, &ex, err, sizeof err)) { CHECK(0, "niah grid %lld: %s", (long long)i, err); continue; }
        check_niah_example(&ex, essays, n_essays, (double)(i % 5) / 4.0);
        CHECK(ex.n_context > (i < 5 ? 7000u : 699000u), "grid length");
        task_example_free(&ex);
    }
    task_close(s);

    /* a token budget through a callback (here: words) */
    p.count_tokens = count_words;
    p.n_niah_lengths = 0;
    CHECK(task_open(&s, &task_def_niah, &p, err, sizeof err) == 0, "open niah with a tokenizer: %s", err);
    if (s) {
        task_example ex;
        if (task_niah_build(s, 0.5, 1000, &ex, err, sizeof err) == 0) {
            int64_t w = count_words(NULL, ex.prompt, ex.n_prompt);
            CHECK(w <= 1000 && w > 950, "1000-word budget: %lld words", (long long)w);
            check_niah_example(&ex, essays, n_essays, 0.5);
            task_example_free(&ex);
        } else {
            CHECK(0, "niah with budget: %s", err);
        }
        CHECK(task_niah_build(s, 0.5, 10, &ex, err, sizeof err) == -1 && strstr(err, "cannot hold"),
              "too small a budget is an error: %s", err);
        CHECK(task_niah_build(s, 1.5, 1000, &ex, err, sizeof err) == -1, "depth outside [0, 1]");
        task_close(s);
    }
    test_niah_dir(essays, n_essays);
    free(essays);
}

/* ---- kvret --------------------------------------------------------------- */

static void check_kv(const task_example *ex, int n_keys, long want_gold)
{
    const char *v = ex->answers[0];
    CHECK(ex->n_answers == 1 && strlen(v) == 36, "gold value is a UUID");
    /* the key is named at the end; its record is in the JSON exactly once */
    const char *kq = strstr(ex->prompt + ex->n_context, "Key: \"");
    CHECK(kq != NULL && ends_with(ex->prompt, ex->n_prompt, "\"\nCorresponding value:"), "kv trailer");
    if (!kq) return;
    char key[64], rec[160];
    snprintf(key, sizeof key, "%.36s", kq + 6);
    snprintf(rec, sizeof rec, "\"%s\": \"%s\"", key, v);
    CHECK(count_occ(ex->prompt, rec) == 1, "gold record present once");
    CHECK(count_occ(ex->prompt, key) == 2, "gold key in the data and the question");
    CHECK(count_occ(ex->prompt, "\": \"") == n_keys, "%d records", n_keys);
    /* its position: records before it = ",\n" separators before it */
    const char *r = strstr(ex->prompt, rec);
    long before = 0;
    for (const char *c = strstr(ex->prompt, ",\n "); c && c < r; c = strstr(c + 1, ",\n ")) before++;
    CHECK(before == ex->gold_index, "gold_index %lld is the record's position %ld", (long long)ex->gold_index, before);
    if (want_gold >= 0) CHECK(ex->gold_index == want_gold, "gold moved to %ld", want_gold);
    CHECK(metrics_contains_ci(" Its value is " , v) == 0 && metrics_contains_ci(rec, v) == 1, "kv scoring");
}

static void test_kvret(void)
{
    if (!have("data/qa/lost-in-the-middle/kv-retrieval-75_keys.jsonl.gz") ||
        !have("data/qa/lost-in-the-middle/kv_retrieval.prompt"))
        return;
    task_set *s;
    char err[512];
    task_params p = task_default_params();
    CHECK(task_open(&s, &task_def_kvret, &p, err, sizeof err) == 0, "open kvret: %s", err);
    if (!s) return;
    CHECK(task_count(s) == 500, "kvret count %lld", (long long)task_count(s));
    task_example ex;
    for (int i = 0; i < 500; i += test_quick() ? 125 : 25) {
        if (task_get(s, i, &ex, err, sizeof err)) { CHECK(0, "kvret %d: %s", i, err); continue; }
        CHECK(starts_with(ex.prompt, "Extract the value corresponding to the specified key in the JSON object "
                                     "below.\n\nJSON data:\n{\""),
              "kv prompt head");
        check_kv(&ex, 75, -1);
        task_example_free(&ex);
    }
    task_close(s);
    const long golds[] = { 0, 37, 74 };
    for (int g = 0; g < 3; g++) {
        p.kvret_gold_index = golds[g];
        if (task_open(&s, &task_def_kvret, &p, err, sizeof err)) { CHECK(0, "kvret: %s", err); continue; }
        if (task_get(s, 3, &ex, err, sizeof err) == 0) {
            check_kv(&ex, 75, golds[g]);
            task_example_free(&ex);
        }
        task_close(s);
    }
    p.kvret_gold_index = 75;
    if (task_open(&s, &task_def_kvret, &p, err, sizeof err) == 0) {
        CHECK(task_get(s, 0, &ex, err, sizeof err) == -1 && strstr(err, "gold index"), "gold index past the end");
        task_close(s);
    }
    if (!test_quick() && have("data/qa/lost-in-the-middle/kv-retrieval-140_keys.jsonl.gz")) {
        p.kvret_gold_index = -1;
        p.kvret_keys = 140;
        CHECK(task_open(&s, &task_def_kvret, &p, err, sizeof err) == 0, "open kvret 140: %s", err);
        if (s) {
            if (task_get(s, 7, &ex, err, sizeof err) == 0) {
                check_kv(&ex, 140, -1);
                task_example_free(&ex);
            }
            task_close(s);
        }
    }
    p.kvret_keys = 76;
    CHECK(task_open(&s, &task_def_kvret, &p, err, sizeof err) == -1, "76 keys is not a data set");
}

/* ---- errors -------------------------------------------------------------- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_errors(void)
{
    for (int i = 0; i < task_def_count(); i++)
        CHECK(task_find(task_def_at(i)->name) == task_def_at(i), "kind name %d", i);
    CHECK(task_find("nope") == NULL, "unknown task name");

    /* missing data: away from ../shared, with no SPARQ_MODEL_PATH */
    char cwd[4096];
    const char *env = getenv("SPARQ_MODEL_PATH");
    char *saved_env = env ? strdup(env) : NULL;
    if (getcwd(cwd, sizeof cwd) && chdir("/") == 0) {
        unsetenv("SPARQ_MODEL_PATH");
        task_set *s;
        char err[512];
        task_params p = task_default_params();
        for (int i = 0; i < task_def_count(); i++) {
            err[0] = 0;
            int rc = task_open(&s, task_def_at(i), &p, err, sizeof err);
            CHECK(rc == -1 && s == NULL && strstr(err, "not found in search path") &&
                      starts_with(err, task_def_at(i)->name),
                  "%s without data: %s", task_def_at(i)->name, err);
        }
        if (chdir(cwd) != 0) CHECK(0, "chdir back");
        if (saved_env) setenv("SPARQ_MODEL_PATH", saved_env, 1);
    }
    free(saved_env);


    /* malformed files given by path */
    char tmp[] = "/tmp/sparq_test_tasks_XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) return;
    close(fd);
    task_set *s;
    char err[512];
    task_params p = task_default_params();
    p.path = tmp;
    write_file(tmp, "{\"data\": [{\"title\": \"T\", \"paragraphs\": [{\"context\": \"c\", \"qas\": [{\"question\"");
    CHECK(task_open(&s, &task_def_squad, &p, err, sizeof err) == -1 && strstr(err, "json: byte"), "truncated: %s", err);
    write_file(tmp, "{\"version\": \"1.1\"}");
    CHECK(task_open(&s, &task_def_squad, &p, err, sizeof err) == -1 && strstr(err, "\"data\""), "no data: %s", err);
    write_file(tmp, "{\"data\": [{\"title\": \"T\", \"paragraphs\": [{\"context\": 5, \"qas\": []}]}]}");
    CHECK(task_open(&s, &task_def_squad, &p, err, sizeof err) == -1 && strstr(err, "context"), "bad context: %s", err);
    /* a one-paragraph set: no confusion paragraphs and a fallback shot */
    write_file(tmp, "{\"data\": [{\"title\": \"A_B\", \"paragraphs\": [{\"context\": \"Ctx.\", \"qas\": ["
                    "{\"question\": \"Q1?\", \"id\": \"1\", \"answers\": [{\"text\": \"long one\"}, {\"text\": \"a1\"}]},"
                    "{\"question\": \"Q2?\", \"id\": \"2\", \"answers\": [{\"text\": \"a2\"}]}]}]}]}");
    if (task_open(&s, &task_def_squad, &p, err, sizeof err) == 0) {
        task_example ex;
        int found = 0;
        for (int i = 0; i < 2; i++) {
            if (task_get(s, i, &ex, err, sizeof err)) continue;
            if (!strcmp(ex.id, "2")) {
                found = 1;
                CHECK(!strcmp(ex.prompt, "Title: A B. Background: Ctx.\nFrom what you've just read about A B, please "
                                         "answer the following questions.\nQuestion: Q1?\nAnswer: a1\nQuestion: Q2?\nAnswer:"),
                      "tiny squad prompt:\n%s", ex.prompt);
            }
            task_example_free(&ex);
        }
        CHECK(found, "tiny squad has question 2");
        task_close(s);
    } else {
        CHECK(0, "tiny squad: %s", err);
    }
    write_file(tmp, "{\"question\": \"q\"}");
    CHECK(task_open(&s, &task_def_triviaqa, &p, err, sizeof err) == -1 && strstr(err, "not a JSON list"), "%s", err);
    write_file(tmp, "[{\"question\": \"Who?\", \"answer\": {\"value\": \"Me\", \"aliases\": [\"Me\", \"Myself\"]},"
                    " \"context\": \"Doc.\"}]");
    if (task_open(&s, &task_def_triviaqa, &p, err, sizeof err) == 0) {
        task_example ex;
        if (task_get(s, 0, &ex, err, sizeof err) == 0) {
            CHECK(!strcmp(ex.prompt, "Doc.\nQuestion: Who?\nAnswer:") && ex.n_context == 4, "triviaqa with context");
            CHECK(ex.n_answers == 2 && !strcmp(ex.answers[0], "Me") && !strcmp(ex.answers[1], "Myself"),
                  "value and aliases, duplicates dropped");
            task_example_free(&ex);
        }
        task_close(s);
    }
    write_file(tmp, "not gzip data at all");
    /* zlib reads non-gzip input as plain bytes: one line that is not JSON */
    if (task_open(&s, &task_def_kvret, &p, err, sizeof err) == 0) {
        task_example ex;
        CHECK(task_get(s, 0, &ex, err, sizeof err) == -1 && strstr(err, "json"), "kvret bad line: %s", err);
        task_close(s);
    }
    write_file(tmp, "{\"ordered_kv_records\": [[\"k1\", \"v1\"], [\"k2\", 3]], \"key\": \"k1\", \"value\": \"v1\"}\n"
                    "{\"ordered_kv_records\": [[\"k1\", \"v1\"]], \"key\": \"k9\", \"value\": \"v9\"}\n");
    if (task_open(&s, &task_def_kvret, &p, err, sizeof err) == 0) {
        task_example ex;
        CHECK(task_count(s) == 2, "two lines");
        CHECK(task_get(s, 0, &ex, err, sizeof err) == -1 && strstr(err, "pair"), "bad record: %s", err);
        CHECK(task_get(s, 1, &ex, err, sizeof err) == -1 && strstr(err, "gold"), "missing gold: %s", err);
        task_close(s);
    }
    unlink(tmp);
    task_close(NULL);
    task_example_free(NULL);
}

int main(void)
{
    test_errors();
    test_squad();
    test_triviaqa();
    test_cnndm();
    test_wikitext();
    test_repetition();
    test_niah();
    test_niah_grid();
    test_options();
    test_kvret();
    return test_summary("test_tasks");
}
