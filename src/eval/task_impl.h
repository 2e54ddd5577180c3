/* task_impl.h - what the task files (task_NAME.c) share: the task set, the
 * seeded random streams, a string builder and the text and file helpers.
 * Defined in task_impl.c; only task files include this header (the
 * registry, tasks.c, does not: it is above the task files).
 */
#ifndef SPARQ_TASK_IMPL_H
#define SPARQ_TASK_IMPL_H

#include "eval/tasks.h"
#include "util/json.h"

#include <stddef.h>
#include <stdint.h>

#define TASK_PATH_MAX 4096

/* A loaded task. The generic fields cover what several tasks hold; a task
 * keeps anything else in priv (freed by its free_priv). */
struct task_set {
    const task_def *def;
    task_params p;
    char *text;                 /* raw text: wikitext, repetition, niah, kvret, fidelity */
    size_t n_text;
    json_doc *docs[2];          /* JSON data (squad's two parts, triviaqa, cnndm) */
    const json_value **items;   /* list tasks: the examples' objects */
    int64_t *perm;              /* example order; NULL = identity */
    int64_t n_examples;
    void *priv;                 /* the task's own data */
};

/* ---- random numbers: xoshiro256** seeded by splitmix64 (util/rng.h) ----- */

typedef struct {
    uint64_t s[4];
} task_rng;

/* Independent generator for example `item` of task set s (item -1: the
 * set's permutation), so example i never depends on the others. */
void task_rng_init(task_rng *r, const task_set *s, int64_t item);
/* Uniform in [0, n), n > 0, without modulo bias. */
uint64_t task_rng_below(task_rng *r, uint64_t n);
/* s->perm = a seeded random permutation of 0..n-1; returns 0 or -1 (OOM,
 * message "<task>: out of memory"). */
int task_make_perm(task_set *s, int64_t n, char *err, size_t err_size);

/* ---- string builder ----------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
    int oom;                    /* set once an append failed; checked once */
} sbuf;

void sb_add(sbuf *b, const char *s, size_t n);
void sb_adds(sbuf *b, const char *s);
/* Hands the built string to ex->prompt (or reports OOM and frees it). */
int sb_finish(sbuf *b, task_example *ex, char *err, size_t err_size);

/* An empty example: no strings, depth and gold_index -1. */
void task_example_init(task_example *ex);
char *task_dup_n(const char *s, size_t n);
char *task_dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Adds a copy of s[0..n) to the answers unless it is already there; -1 OOM. */
int task_add_answer(task_example *ex, const char *s, size_t n);

/* ---- text --------------------------------------------------------------- */

/* Python's \s for the characters that occur in these files (ASCII). */
int task_is_ws(unsigned char c);
/* Byte position after k code points from pos, or SIZE_MAX if s[pos..end)
 * has fewer. */
size_t task_advance_chars(const char *s, size_t pos, size_t end, int64_t k);
int64_t task_count_chars(const char *s, size_t from, size_t to);
size_t task_next_ws(const char *s, size_t pos, size_t end);

/* A prefill/continuation split of one text (wikitext, repetition). */
typedef struct {
    size_t ctx_start, ctx_end;  /* repetition: the context; wikitext: the article */
    size_t ex_start;            /* excerpt (repetition) / prefill (wikitext) start */
    size_t ref_start, ref_end;  /* the continuation */
} text_span;

typedef struct {
    text_span *v;
    int64_t n, cap;
} span_list;

int span_push(span_list *l, text_span sp);
/* The authors' "(.{P}.*?)(\s.{R-1}.*?)(?=\s|$)" from pos inside [.., end):
 * prefill [pos, *split) of >= P chars ending before whitespace, continuation
 * [*split, *ref_end) of >= R chars. Returns 0, or -1 if there is no match. */
int split_prefill(const char *t, size_t pos, size_t end, int64_t P, int64_t R, size_t *split, size_t *ref_end);

/* ---- shared scoring (squad, triviaqa) ---------------------------------- */

/* value = 1 if the output, normalised, starts with a normalised answer. */
int task_score_qa(const task_example *ex, const char *out, size_t n_out, double *value, char *err,
                  size_t err_size);
/* min(qa_max_tokens, qa_spare_tokens + the longest answer). */
int64_t task_qa_gen_tokens(const eval_task_params *p, int64_t longest);

/* ---- files -------------------------------------------------------------- */

/* path = `name` found on the search path, or -1 with "<task>: <name> not
 * found in search path (...)". */
int task_find_data(const char *task, const char *name, char *path, size_t path_size, char *err,
                   size_t err_size);
int task_read_file(const char *task, const char *path, char **out, size_t *n_out, char *err,
                   size_t err_size);
int task_read_gz(const char *task, const char *path, char **out, size_t *n_out, char *err,
                 size_t err_size);
json_doc *task_parse_json_file(const char *task, const char *path, char *err, size_t err_size);
/* s->text = the file s->p.path, or else `default_name` from the search path. */
int task_text_open(task_set *s, const char *default_name, char *err, size_t err_size);
/* s->docs[0] = the JSON list in s->p.path or `default_name`; s->items = its
 * entries for which keep(s, item, index) returns 1 (0 skips it, -1 stops
 * with its message). */
int task_list_open(task_set *s, const char *default_name,
                   int (*keep)(const task_set *s, const json_value *it, size_t i, char *err, size_t err_size),
                   char *err, size_t err_size);

#endif
