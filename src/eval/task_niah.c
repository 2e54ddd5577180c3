/* task_niah.c - needle in a haystack: the needle sentence at a depth of
 * Paul Graham essays cut to a length (tasks.h). */
#include "util/err.h"
#include "eval/task_impl.h"
#include "util/paths.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NIAH_MAX_LENGTHS = 16 };

static const char NIAH_NEEDLE[] =
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
static const char NIAH_QUESTION[] =
    "\n\nQuestion: What is the best thing to do in San Francisco?\nAnswer: The best thing to do in San Francisco is";
static const char NIAH_ANSWER[] = "eat a sandwich and sit in Dolores Park on a sunny day";

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The essays directory: every *.txt file in name order, concatenated. */
static int niah_read_dir(task_set *s, const char *dir, char *err, size_t err_size)
{
    DIR *d = opendir(dir);
    if (!d) return err_set(err, err_size, "niah: cannot open %s", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".txt")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) { rc = -1; break; }
            names = nn;
        }
        if (!(names[n] = task_dup_n(e->d_name, l))) { rc = -1; break; }
        n++;
    }
    closedir(d);
    if (rc) {
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        return err_set(err, err_size, "niah: out of memory");
    }
    qsort(names, n, sizeof *names, cmp_str);
    sbuf b = { 0 };
    for (size_t i = 0; i < n && !rc; i++) {
        char path[TASK_PATH_MAX];
        int k = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (k < 0 || (size_t)k >= sizeof path) {
            rc = err_set(err, err_size, "niah: path too long: %s/%s", dir, names[i]);
            break;
        }
        char *text;
        size_t len;
        rc = task_read_file("niah", path, &text, &len, err, err_size);
        if (!rc) {
            sb_add(&b, text, len);
            free(text);
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc) { free(b.s); return -1; }
    if (b.oom || b.n == 0) {
        free(b.s);
        return err_set(err, err_size, b.oom ? "niah: out of memory" : "niah: no .txt essays in %s", dir);
    }
    s->text = b.s;
    s->n_text = b.n;
    return 0;
}

/* niah's default grid for a context of n_ctx tokens: max(160, n_ctx/4),
 * n_ctx/2, 3n_ctx/4, n_ctx - 64 (the answer is generated after the prompt;
 * the shortest haystack must leave room for the needle and the question:
 * 113 tokens with stories260K's 512-token vocabulary). */
static int niah_default_lengths(int64_t n_ctx, int64_t *len, int *n_len, char *err, size_t err_size)
{
    const int64_t room = n_ctx - 64, lo = n_ctx / 4 > 160 ? n_ctx / 4 : 160;
    const int64_t cand[4] = { lo, n_ctx / 2, 3 * n_ctx / 4, room };
    *n_len = 0;
    for (int i = 0; i < 4; i++)
        if (cand[i] >= 32 && cand[i] <= room && (*n_len == 0 || cand[i] > len[*n_len - 1]))
            len[(*n_len)++] = cand[i];
    if (*n_len == 0) return err_set(err, err_size, "niah: context %lld is too small for a haystack", (long long)n_ctx);
    return 0;
}

/* "A,B,.." token budgets, each >= 8, at most NIAH_MAX_LENGTHS. */
static int niah_parse_lengths(const char *s, int64_t *len, int *n_len, char *err, size_t err_size)
{
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        const long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 8 || (*end && *end != ','))
            return err_set(err, err_size, "niah: --niah-lengths '%s' must be token counts >= 8, e.g. 256,512", s);
        if (n == NIAH_MAX_LENGTHS)
            return err_set(err, err_size, "niah: --niah-lengths has more than %d lengths", NIAH_MAX_LENGTHS);
        len[n++] = v;
        if (!*end) break;
        p = end + 1;
    }
    *n_len = n;
    return 0;
}

static int niah_open(task_set *s, char *err, size_t err_size)
{
    char path[TASK_PATH_MAX];
    if (s->p.path) {
        if (task_read_file("niah", s->p.path, &s->text, &s->n_text, err, err_size)) return -1;
    } else if (path_find("data/text/PaulGrahamEssays_all_sorted.txt", path, sizeof path) == 0) {
        if (task_read_file("niah", path, &s->text, &s->n_text, err, err_size)) return -1;
    } else {
        if (task_find_data("niah", "data/text/PaulGrahamEssays", path, sizeof path, err, err_size)) return -1;
        if (niah_read_dir(s, path, err, err_size)) return -1;
    }
    if (s->n_text == 0) return err_set(err, err_size, "niah: the haystack text is empty");
    int depths = s->p.niah_depths > 0 ? s->p.niah_depths : 11;
    s->p.niah_depths = depths;
    int64_t given[NIAH_MAX_LENGTHS];
    const int64_t *lengths = s->p.niah_lengths;
    int n_lengths = lengths ? s->p.n_niah_lengths : 0;
    if (!lengths && s->p.niah_length_list) {
        if (niah_parse_lengths(s->p.niah_length_list, given, &n_lengths, err, err_size)) return -1;
        lengths = given;
    } else if (!lengths && s->p.n_ctx > 0) {
        if (niah_default_lengths(s->p.n_ctx, given, &n_lengths, err, err_size)) return -1;
        lengths = given;
    }
    if (n_lengths > 0) {
        int64_t *own = malloc((size_t)n_lengths * sizeof *own);
        if (!own) return err_set(err, err_size, "niah: out of memory");
        memcpy(own, lengths, (size_t)n_lengths * sizeof *own);
        s->priv = own;
        s->n_examples = (int64_t)n_lengths * depths;
    }
    s->p.niah_lengths = s->priv;
    s->p.n_niah_lengths = n_lengths;
    return 0;
}

/* A sentence boundary: right after a '.' that is followed by whitespace
 * (or ends the haystack). */
static int niah_is_boundary(const char *h, size_t n, size_t i)
{
    return i >= 1 && i <= n && h[i - 1] == '.' && (i == n || task_is_ws((unsigned char)h[i]));
}

/* Appends the prompt for a haystack of (about) `hay` bytes to b: the essays
 * repeated and cut at a code-point boundary, the needle at the first
 * sentence boundary at or after depth * length, then the question.
 * *at = insertion offset in the haystack, *n_hay = haystack bytes,
 * *n_context = prompt bytes before the question. Returns -1 on OOM. */
static int niah_prompt(const task_set *s, size_t hay, double depth, sbuf *b, size_t *at, size_t *n_hay,
                       size_t *n_context)
{
    /* text[n % n_text] is the first byte left out. Cut after the last
     * sentence end that fits, so the question never follows half a word;
     * failing that (no '.' at all), at least not inside a character. */
    const char *t = s->text;
    size_t n = hay, nt = s->n_text;
    while (n > 0 && !(t[(n - 1) % nt] == '.' && task_is_ws((unsigned char)t[n % nt]))) n--;
    if (n == 0) {
        n = hay;
        while (n > 0 && ((unsigned char)t[n % nt] & 0xC0) == 0x80) n--;
    }
    sbuf h = { 0 };
    while (h.n < n && !h.oom) sb_add(&h, t, n - h.n < nt ? n - h.n : nt);
    if (h.oom) {
        free(h.s);
        return -1;
    }
    size_t target = (size_t)(depth * (double)n);
    if (target > n) target = n;
    size_t i = target;
    if (i > 0)
        while (i < n && !niah_is_boundary(h.s, n, i)) i++;
    if (i == 0) {
        sb_adds(b, NIAH_NEEDLE);
        if (n) sb_adds(b, " ");
        sb_add(b, h.s ? h.s : "", n);
    } else {
        sb_add(b, h.s, i);
        sb_adds(b, " ");
        sb_adds(b, NIAH_NEEDLE);
        sb_add(b, h.s + i, n - i);
    }
    free(h.s);
    *n_context = b->n;
    sb_adds(b, NIAH_QUESTION);
    *at = i;
    *n_hay = n;
    return b->oom ? -1 : 0;
}

/* Token count of the prompt for a haystack of `hay` bytes (-1 on OOM). */
static int64_t niah_tokens(const task_set *s, size_t hay, double depth)
{
    sbuf b = { 0 };
    size_t at, n_hay, nc;
    int64_t t = -1;
    if (niah_prompt(s, hay, depth, &b, &at, &n_hay, &nc) == 0) t = s->p.count_tokens(s->p.count_ctx, b.s, b.n);
    free(b.s);
    return t;
}

int task_niah_build(const task_set *s, double depth, int64_t budget, task_example *ex, char *err, size_t err_size)
{
    task_example_init(ex);
    if (!s || s->def != &task_def_niah) return err_set(err, err_size, "niah: not a niah task set");
    if (!(depth >= 0.0 && depth <= 1.0)) return err_set(err, err_size, "niah: depth %g is outside [0, 1]", depth);
    if (budget < 0) return err_set(err, err_size, "niah: negative budget %lld", (long long)budget);
    size_t hay = (size_t)budget;
    if (s->p.count_tokens) {
        /* Largest haystack whose prompt fits: double until it does not,
         * then bisect. The size chosen was always measured to fit. */
        int64_t t = niah_tokens(s, 0, depth);
        if (t < 0) return err_set(err, err_size, "niah: out of memory");
        if (t > budget)
            return err_set(err, err_size, "niah: %lld tokens cannot hold the needle and question (%lld tokens)",
                           (long long)budget, (long long)t);
        size_t lo = 0, hi = 256;
        for (;;) {
            t = niah_tokens(s, hi, depth);
            if (t < 0) return err_set(err, err_size, "niah: out of memory");
            if (t > budget) break;
            lo = hi;
            if (hi >= ((size_t)1 << 34)) break; /* 16 GiB of text: stop growing */
            hi *= 2;
        }
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            t = niah_tokens(s, mid, depth);
            if (t < 0) return err_set(err, err_size, "niah: out of memory");
            if (t <= budget) lo = mid;
            else hi = mid;
        }
        hay = lo;
    }
    sbuf b = { 0 };
    size_t at, n_hay, nc;
    if (niah_prompt(s, hay, depth, &b, &at, &n_hay, &nc)) {
        free(b.s);
        return err_set(err, err_size, "niah: out of memory");
    }
    if (sb_finish(&b, ex, err, err_size)) return -1;
    ex->n_context = nc;
    ex->depth = n_hay ? (double)at / (double)n_hay : 0.0;
    ex->id = task_dup_printf("niah-%zu-%.3f", n_hay, depth);
    if (!ex->id || task_add_answer(ex, NIAH_ANSWER, sizeof NIAH_ANSWER - 1)) {
        task_example_free(ex);
        return err_set(err, err_size, "niah: out of memory");
    }
    return 0;
}

static int niah_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const int depths = s->p.niah_depths;
    const int64_t li = i / depths, di = i % depths;
    const double depth = depths > 1 ? (double)di / (double)(depths - 1) : 0.0;
    if (task_niah_build(s, depth, s->p.niah_lengths[li], ex, err, err_size)) return -1;
    ex->grid_length = s->p.niah_lengths[li];
    ex->grid_depth = depth;
    return 0;
}

/* The answer tokens + niah_spare_tokens. */
static int64_t niah_gen_tokens(const eval_task_params *p, int64_t longest)
{
    return p->niah_spare_tokens + longest;
}

/* 1 if the output, after leading whitespace, starts with the answer (the
 * authors' needle rule: re.match(r"^\s*" + answer)). */
static int niah_score(const task_example *ex, const char *out, size_t n_out, double *value, char *err,
                      size_t err_size)
{
    (void)n_out;
    (void)err;
    (void)err_size;
    const char *answer = ex->answers[0];
    while (*out == ' ' || (*out >= '\t' && *out <= '\r')) out++;
    *value = strncmp(out, answer, strlen(answer)) == 0;
    return 0;
}

static const task_option niah_options[] = {
    { "--niah-lengths", TASK_OPT_LIST, offsetof(task_params, niah_length_list), 0, "A,B,..",
      "prompt lengths in tokens, each >= 8 (default max(160, 1/4), 1/2, 3/4 of the context, context - 64)" },
    { "--niah-depths", TASK_OPT_INT, offsetof(task_params, niah_depths), 1, "N",
      "needle depths 0..1 (default 11)" },
    { 0 },
};

const task_def task_def_niah = {
    .name = "niah",
    .summary = "needle in a haystack of Paul Graham essays, depth x length grid; accuracy",
    .metric = "accuracy",
    .run = TASK_RUN_GENERATE,
    .grid = 1,
    .stream = 5,
    .options = niah_options,
    .open = niah_open,
    .get = niah_get,
    .free_priv = free,
    .gen_tokens = niah_gen_tokens,
    .score = niah_score,
};
