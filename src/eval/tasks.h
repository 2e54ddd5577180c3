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
 * Tasks (SPEC.md "Evaluation tasks"; the SparQ authors' code fills in the
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

typedef enum {
    TASK_SQUAD,
    TASK_TRIVIAQA,
    TASK_CNNDM,
    TASK_WIKITEXT,
    TASK_REPETITION,
    TASK_NIAH,
    TASK_KVRET,
    TASK_N_KINDS,
} task_kind;

/* "squad", "triviaqa", "cnndm", "wikitext", "repetition", "niah", "kvret". */
const char *task_kind_name(task_kind kind);

/* Parses a name above into *out; returns 0, or -1 if unknown. */
int task_kind_from_name(const char *name, task_kind *out);

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
    int niah_depths;            /* depths 0, 1/(n-1), ..., 1 (11)             */
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
} task_example;

typedef struct task_set task_set;

/* Loads the data of one task. Returns 0 and *out, or -1 (missing or
 * malformed data, bad parameters, out of memory). */
int task_open(task_set **out, task_kind kind, const task_params *params, char *err, size_t err_size);

/* task_close(NULL) is a no-op. */
void task_close(task_set *s);

task_kind task_set_kind(const task_set *s);

/* Number of examples (niah: lengths x depths). */
int64_t task_count(const task_set *s);

/* Builds example i (0 <= i < task_count). On failure *ex is left empty. */
int task_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size);

/* niah outside the grid: the needle at `depth` in [0, 1] of a haystack of
 * `budget` bytes, or - when the set's params have count_tokens - of the
 * longest haystack whose whole prompt has at most `budget` tokens. */
int task_niah_build(const task_set *s, double depth, int64_t budget, task_example *ex, char *err,
                    size_t err_size);

/* Frees what *ex owns and zeroes it; NULL is a no-op. */
void task_example_free(task_example *ex);

#endif
