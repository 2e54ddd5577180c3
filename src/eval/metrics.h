/* metrics.h - scores for the evaluation tasks (docs/ALGORITHMS.md "Evaluation tasks").
 *
 *   QA (SQuAD, TriviaQA, needle)  metrics_qa_match: SQuAD answer
 *                                 normalisation, then "the normalised output
 *                                 starts with a normalised gold answer".
 *   key-value retrieval           metrics_contains_ci (lost-in-the-middle's
 *                                 rule: the value appears in the output).
 *   CNN/DailyMail                 metrics_rouge_l: sentence-level ROUGE-L F1
 *                                 with rouge_score's tokenisation and its
 *                                 Porter stemmer (NLTK's variant, as
 *                                 rouge_score uses; the original 1980
 *                                 algorithm is available too).
 *   WikiText                      metrics_bpc, metrics_nll, metrics_utf8_chars.
 *   repetition                    metrics_match_length.
 *   fidelity vs dense             metrics_kl_logits, metrics_argmax,
 *                                 metrics_common_prefix.
 *   aggregation                   metrics_mean, metrics_stderr.
 *
 * Text is UTF-8. Answer normalisation lowercases ASCII, Latin-1, Latin
 * Extended-A, Greek and Cyrillic and knows the common Unicode space and
 * punctuation blocks; other code points count as letters and keep their
 * case. On SQuAD dev's 56k answers, questions and context sentences this
 * equals the official normalize_answer on all but one (a polytonic Greek
 * capital). ROUGE tokens are ASCII [a-z0-9] as in
 * rouge_score (which only differs for the rare characters that Python
 * lowercases into ASCII, e.g. U+212A KELVIN SIGN). "Characters" are Unicode
 * code points, as Python's len() counts them.
 *
 * Functions that allocate return NULL / -1 only when out of memory.
 */
#ifndef SPARQ_METRICS_H
#define SPARQ_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* ---- question answering ------------------------------------------------ */

/* SQuAD's normalize_answer: lowercase, drop ASCII punctuation, drop the
 * words a/an/the, collapse whitespace runs to one space and trim.
 * Returns a malloc'd NUL-terminated string (caller frees) or NULL. */
char *metrics_normalize_answer(const char *s, size_t n);

/* 1 if normalize(output) starts with normalize(answers[i]) for some answer
 * whose normalised form is non-empty, 0 if none does, -1 out of memory. */
int metrics_qa_match(const char *output, const char *const *answers, int n_answers);

/* 1 if `needle` occurs in `haystack` ignoring ASCII case, else 0. */
int metrics_contains_ci(const char *haystack, const char *needle);

/* ---- ROUGE-L ------------------------------------------------------------ */

typedef enum {
    METRICS_PORTER_NLTK,     /* nltk PorterStemmer() default mode: rouge_score */
    METRICS_PORTER_ORIGINAL, /* Porter (1980) exactly as published             */
} metrics_porter_mode;

/* Stems word[0..n) (lowercase a-z; other bytes are treated as consonants)
 * in place and returns the new length (never longer than n). */
size_t metrics_porter_stem(char *word, size_t n, metrics_porter_mode mode);

typedef struct {
    double precision, recall, f1;
} metrics_rouge;

/* rouge_score's RougeScorer(["rougeL"], use_stemmer).score(reference,
 * prediction): tokens = lowercase, [^a-z0-9]+ -> space, split, stem words
 * longer than 3 characters; LCS over tokens; P = lcs/|pred|, R = lcs/|ref|,
 * F1 = 2PR/(P+R) (all 0 if either side has no tokens). Time is
 * O(|ref| * |pred|) tokens, memory O(|pred|). Returns 0, or -1 out of memory. */
int metrics_rouge_l(const char *reference, const char *prediction, int use_stemmer,
                    metrics_rouge *out);

/* ---- language modelling ------------------------------------------------- */

/* Number of code points in s[0..n) (bytes that are not UTF-8 continuation
 * bytes). */
int64_t metrics_utf8_chars(const char *s, size_t n);

/* -log softmax(logits)[target] in nats, computed stably in double. */
double metrics_nll(const float *logits, int64_t n_vocab, int64_t target);

/* Bits per character: sum_nll_nats * log2(e) / n_chars (0 if n_chars <= 0). */
double metrics_bpc(double sum_nll_nats, int64_t n_chars);

/* ---- repetition --------------------------------------------------------- */

/* Characters (code points) of `generated` that equal `reference` before the
 * first mismatch, after stripping leading whitespace from both (as the
 * SparQ authors' evaluate_match_length did). A generation that stops early
 * scores its own length. */
int64_t metrics_match_length(const char *generated, size_t n_generated,
                             const char *reference, size_t n_reference);

/* ---- fidelity ----------------------------------------------------------- */

/* KL(softmax(p) || softmax(q)) in nats over n entries, log-softmax in
 * double with the max subtracted. Entries with p = -inf contribute 0; an
 * entry with finite p and q = -inf makes the result +inf; NaN if either
 * side has no finite entry or a +inf / NaN logit. */
double metrics_kl_logits(const float *p_logits, const float *q_logits, int64_t n);

/* Index of the largest entry (the first on ties; -1 if n <= 0). Top-1
 * agreement of two logit vectors is argmax(p) == argmax(q). */
int64_t metrics_argmax(const float *x, int64_t n);

/* Number of leading positions where two token sequences agree (greedy
 * tokens generated before the first divergence). */
int64_t metrics_common_prefix(const int32_t *a, int64_t n_a, const int32_t *b, int64_t n_b);

/* ---- aggregation -------------------------------------------------------- */

/* Mean of x[0..n) (0 if n <= 0). */
double metrics_mean(const double *x, int64_t n);

/* Standard error of the mean: sample standard deviation (n - 1 in the
 * denominator) / sqrt(n); 0 if n < 2. */
double metrics_stderr(const double *x, int64_t n);

#endif
