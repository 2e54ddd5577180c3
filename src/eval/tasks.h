/* tasks.h - evaluation task builders: prompt text and gold references.
 *
 * One task_set per task holds its data file(s), loaded once; task_get
 * builds example i as a prompt plus reference(s). Everything random comes
 * from the explicit seed (xoshiro256** seeded by splitmix64, no global
 * state): the same seed, data and index always give the same example, and
 * example i does not depend on which other examples were built.
 *
 * Order: squad, wikitext and repetition data are ordered by source article,
 * so example i is item perm[i] of a seeded permutation (the first N examples
 * are then a random sample). triviaqa, cnndm and kvret files are already
 * random samples and are used in file order.
 *
 * Tasks (docs/ALGORITHMS.md "Evaluation tasks"; the SparQ authors' code fills in the
 * details the paper leaves open, noted as "authors"):
 *
 *   squad       SQuAD 1.1 dev (data/qa/squad/dev-v1.1.json, or its two parts
 *               dev-v1.1.part1of2.json + part2of2.json in that order).
 *               Prompt: the question's paragraph plus `squad_confusion` (7)
 *               other paragraphs drawn from the whole set without
 *               replacement (never the true paragraph; authors drew with
 *               replacement and could repeat it), shuffled, each
 *               "Title: {title}. Background: {context}" (underscores in
 *               titles become spaces), joined with "\n", then
 *               "\nFrom what you've just read about {title}, please answer
 *               the following questions." then
 *               "\nQuestion: {q1}\nAnswer: {a1}\nQuestion: {q}\nAnswer:".
 *               The shot (q1, a1) is a random other question on the same
 *               paragraph (if it has none, a random question of the whole
 *               set, as the authors fell back to), a1 its shortest answer
 *               (authors: min(answers, key=len)). Answers: the question's
 *               distinct answer texts. id: the SQuAD question id.
 *   triviaqa    data/qa/triviaqa/triviaqa_closedbook_sample_RAGE.json: a list
 *               of {"question", "answer"} (answer: a string, a list, or an
 *               object with "aliases"/"value"). Prompt: [context "\n"]
 *               "Question: {q}\nAnswer:", where context is the item's
 *               "context" string if it has one; the shipped sample is
 *               closed-book (no evidence documents), so its context is empty.
 *   cnndm       data/qa/cnn_dailymail/cnn_dailymail_test_first100.json:
 *               "Article: {article}\nSummary:", reference = highlights.
 *               Optional filter on article length (authors: 4000-8000
 *               characters; default here: no filter).
 *   wikitext    data/text/wikitext-2-raw_wiki.test.raw split into articles
 *               at top-level headings (lines " = Title = "; text before the
 *               first heading counts as one). Each article is
 *               cut into consecutive windows; a window is a prefill of at
 *               least `context_chars` (6000) characters that ends just
 *               before a whitespace character, and a reference that starts
 *               with that whitespace, has at least `reference_chars` (400)
 *               characters and ends before the next whitespace (or the
 *               article's end) - the authors' regex. The first window of an
 *               article is exactly the authors' example; further windows
 *               start at the next non-whitespace character after the
 *               previous reference. Prompt = prefill, answers[0] = reference
 *               (the caller teacher-forces at most 256 tokens of it). The
 *               authors used WikiText-103 train pages; the shipped file is
 *               WikiText-2 test (62 articles, 170 windows).
 *   repetition  data/text/tinyshakespeare_input.txt cut into contexts of at
 *               least `context_chars` (6000) characters ending before a
 *               whitespace character; each context into consecutive
 *               (excerpt >= `excerpt_chars` (128), continuation starting
 *               with whitespace, >= `reference_chars` (256)) pairs, as the
 *               authors' regexes do. Prompt = context + "\n" + excerpt,
 *               answers[0] = the continuation. id: character offset of the
 *               excerpt in the file.
 *   niah        Paul Graham essays (data/text/PaulGrahamEssays_all_sorted.txt,
 *               or the files of data/text/PaulGrahamEssays/ in name order),
 *               repeated as needed and cut after the last sentence end that
 *               fits the haystack budget (bytes, or tokens through
 *               count_tokens: then the longest such prompt that fits); the
 *               needle sentence goes in at the first sentence boundary
 *               (right after a '.' followed by whitespace) at or after
 *               depth * haystack length; depth 0 puts it first. Prompt =
 *               haystack-with-needle + "\n\nQuestion: What is the best thing
 *               to do in San Francisco?\nAnswer: The best thing to do in San
 *               Francisco is", answers[0] = "eat a sandwich and sit in Dolores
 *               Park on a sunny day" (the authors primed the answer the same
 *               way so that a base model's reply can be string-matched).
 *               Examples are a grid: niah_lengths x niah_depths.
 *   kvret       lost-in-the-middle key-value retrieval
 *               (data/qa/lost-in-the-middle/kv-retrieval-{75,140}_keys.jsonl.gz
 *               with kv_retrieval.prompt): the records formatted as in that
 *               repo's get_kv_retrieval_prompt, optionally with the gold
 *               record moved to kvret_gold_index. answers[0] = the gold
 *               value (score with metrics_contains_ci), gold_index = the
 *               gold key's position.
 *
 *   fidelity    any text (data/text/tinyshakespeare_input.txt by default):
 *               one example whose prompt is the whole text; the harness
 *               (sweep.h) cuts its tokens into windows and compares each
 *               policy with dense attention on them.
 *
 * Each task is a task_def (below) in its own file, task_NAME.c, listed in
 * tasks.c's registry; tasks.c holds the shared pieces (task_impl.h).
 *
 * Characters are Unicode code points. Functions returning int return 0 on
 * success and -1 with a one-line message in err[err_size]; a missing data
 * file is reported as "<task>: <file> not found in search path (...)".
 * A set is read-only after task_open: task_get / task_niah_build may run
 * on one set from several threads (count_tokens must then be thread-safe).
 */
#ifndef SPARQ_TASKS_H
#define SPARQ_TASKS_H

#include <stddef.h>
#include <stdint.h>

/* Counts the tokens of text[0..n) (used by niah to fit a token budget). */
typedef int64_t (*task_count_tokens_fn)(void *ctx, const char *text, size_t n);

typedef struct {
    uint64_t seed;              /* every random choice derives from this      */
    const char *path;           /* data file to use instead of the default    */
    int squad_confusion;        /* confusion paragraphs (7)                   */
    int kvret_keys;             /* 75 or 140                                  */
    int64_t kvret_gold_index;   /* move the gold record here; -1: as stored   */
    int64_t context_chars;      /* wikitext / repetition context (0: 6000)    */
    int64_t reference_chars;    /* 0: 400 (wikitext), 256 (repetition)        */
    int64_t excerpt_chars;      /* repetition excerpt (0: 128)                */
    int64_t cnndm_min_chars;    /* keep articles with at least this many      */
    int64_t cnndm_max_chars;    /* ... and at most this many (0: no bound)    */
    const int64_t *niah_lengths; /* haystack budgets: tokens if count_tokens  */
    int n_niah_lengths;          /* is set, else bytes (copied by task_open)  */
    const char *niah_length_list; /* or "A,B,.." token budgets (>= 8 each),   */
                                 /* parsed by task_open when niah_lengths is NULL */
    int64_t n_ctx;              /* context the prompts are for: niah's default
                                   grid when neither of the above is given    */
    int niah_depths;            /* depths 0, 1/(n-1), ..., 1 (11)             */
    int fid_prompt;             /* fidelity: prompt tokens per window (0: n_ctx - forced) */
    int fid_tokens;             /* fidelity: forced tokens (0: min(256, n_ctx/2)) */
    int fid_gen;                /* fidelity: greedy tokens (0: min(128, room)) */
    task_count_tokens_fn count_tokens; /* borrowed: count_ctx must outlive the set */
    void *count_ctx;
} task_params;

task_params task_default_params(void);

/* One built example. Every pointer is owned; free with task_example_free. */
typedef struct {
    char *id;
    char *prompt;               /* NUL-terminated UTF-8 */
    size_t n_prompt;            /* bytes */
    size_t n_context;           /* prompt[0..n_context) is the document part;
                                   the rest is the question (the "suffix" of
                                   top-k attention); == n_prompt if none */
    char **answers;             /* gold answers / reference continuation */
    int n_answers;
    double depth;               /* niah: needle offset / haystack bytes; else -1 */
    int64_t gold_index;         /* kvret: gold record position; else -1 */
    int64_t grid_length;        /* niah: the grid cell's budget; else 0   */
    double grid_depth;          /* niah: the grid cell's depth; else 0    */
} task_example;

/* Generation budgets, as the SparQ authors' harness set them (used by the
 * tasks' gen_tokens methods; eval_prepare passes them through). */
typedef struct eval_task_params {
    int qa_max_tokens;        /* squad, triviaqa: min(this, spare + answer) (30) */
    int qa_spare_tokens;      /* (5)                                           */
    int summary_max_tokens;   /* cnndm: min(this, reference tokens) (128)      */
    int repetition_max_tokens;/* repetition: min(this, reference tokens) (128) */
    int bpc_max_tokens;       /* wikitext: teacher-forced tokens (256; at most
                                 half the context)                             */
    int niah_spare_tokens;    /* niah: answer tokens + this (5)                */
    int kvret_spare_tokens;   /* kvret: answer tokens + this (10)              */
    int stop_at_eog;          /* generation stops at end-of-generation (1)     */
} eval_task_params;

typedef struct task_set task_set;

/* An option a task accepts (`sparq eval TASK --help` prints its table):
 * the value goes into task_params at `offset`. */
typedef enum { TASK_OPT_INT, TASK_OPT_I64, TASK_OPT_LIST } task_opt_type;
typedef struct task_option {
    const char   *name;       /* "--squad-confusion"                        */
    task_opt_type type;       /* INT: int, I64: int64_t, LIST: const char * */
    size_t        offset;     /* into task_params                           */
    int64_t       min;        /* smallest value accepted (INT, I64)         */
    const char   *metavar;
    const char   *help;       /* says the default                           */
} task_option;

/* How a task is run (eval.h / sweep.h): generated answers scored, the
 * reference teacher-forced, or any text compared with dense attention. */
typedef enum { TASK_RUN_GENERATE, TASK_RUN_FORCED, TASK_RUN_FIDELITY } task_run;

/* A task: one file task_NAME.c defines `const task_def task_def_NAME`, one
 * line in tasks.c's registry lists it. */
typedef struct task_def {
    const char *name;
    const char *summary;      /* one line for help                           */
    const char *metric;       /* name of an example's value ("accuracy", ..) */
    task_run    run;
    int         grid;         /* examples are a length x depth grid (niah)   */
    uint64_t    stream;       /* tag of its random streams (kept per task so
                                 a seed always gives the same examples)      */
    const task_option *options; /* terminated by a zero entry; NULL: none   */
    /* Loads the data into s (s->p holds the parameters) and sets
     * s->n_examples; on failure the set is closed by the caller. */
    int  (*open)(task_set *s, char *err, size_t err_size);
    /* Builds example i (0 <= i < n_examples) into *ex (initialised). */
    int  (*get)(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size);
    /* Frees s->priv (NULL when the task keeps nothing there). */
    void (*free_priv)(void *priv);
    /* TASK_RUN_GENERATE: tokens to generate for an example whose longest
     * answer has `longest` tokens. */
    int64_t (*gen_tokens)(const eval_task_params *p, int64_t longest);
    /* TASK_RUN_GENERATE: the example's value for the generated text; 0, or
     * -1 with a message (out of memory). */
    int  (*score)(const task_example *ex, const char *out, size_t n_out, double *value, char *err,
                  size_t err_size);
} task_def;

/* The registry: lookup by name (NULL if unknown), the tasks in order, and
 * their names joined by sep into buf (truncated to size; returns buf). */
const task_def *task_find(const char *name);
int task_def_count(void);
const task_def *task_def_at(int i);
const char *task_names(char *buf, size_t size, const char *sep);

/* Sets the option `o` (of some task's table) in p from the text `value`:
 * an integer >= o->min, or a list. Returns 0, or -1 with a one-line message
 * naming the option. */
int task_option_set(task_params *p, const task_option *o, const char *value, char *err, size_t err_size);
/* The option called `name` in t's table, or NULL. */
const task_option *task_option_find(const task_def *t, const char *name);

/* Loads the data of one task. Returns 0 and *out, or -1 (missing or
 * malformed data, bad parameters, out of memory). */
int task_open(task_set **out, const task_def *task, const task_params *params, char *err, size_t err_size);

/* task_close(NULL) is a no-op. */
void task_close(task_set *s);

/* Number of examples (niah: lengths x depths). */
int64_t task_count(const task_set *s);

/* Builds example i (0 <= i < task_count). On failure *ex is left empty. */
int task_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size);

/* niah outside the grid: the needle at `depth` in [0, 1] of a haystack of
 * `budget` bytes, or - when the set's params have count_tokens - of the
 * longest haystack whose whole prompt has at most `budget` tokens. */
int task_niah_build(const task_set *s, double depth, int64_t budget, task_example *ex, char *err,
                    size_t err_size);

/* fidelity's windows over a text of n_ids tokens for a context of n_ctx
 * (docs/EVALUATION.md): each window is `lead` BOS tokens (0 or 1) and
 * stride text tokens, of which the first prompt - lead are the prompt and
 * the next `forced` are teacher-forced; `gen` greedy tokens are compared
 * from the prompt. Defaults from p->fid_*. Returns 0, or -1 when a window
 * does not fit the context or the text. */
typedef struct task_fid_layout {
    int     prompt, forced, gen;
    int64_t stride, n_windows;
    double  mean_len;          /* mean cache length over a window's decode steps */
} task_fid_layout;
int task_fidelity_layout(const task_params *p, int64_t n_ctx, int64_t n_ids, int lead, task_fid_layout *out,
                         char *err, size_t err_size);

/* Frees what *ex owns and zeroes it; NULL is a no-op. */
void task_example_free(task_example *ex);

/* The tasks the registry knows (one file each). */
extern const task_def task_def_squad, task_def_triviaqa, task_def_cnndm, task_def_wikitext,
    task_def_repetition, task_def_niah, task_def_kvret, task_def_fidelity;

#endif
