/* task_impl.c - what the task files share (task_impl.h) and the task
 * set's public entry points (tasks.h): below the registry (tasks.c), which
 * names the task files, while the task files call only this file.
 *
 * Map:
 *   defaults       task_default_params
 *   task_rng_*     xoshiro256** seeded by splitmix64; a stream per example
 *   sb_*           growable string builder (one OOM flag, checked once)
 *   text helpers   code-point stepping, whitespace, spans
 *   files          search path, plain and .gz reading, JSON lists
 *   task_*         the public entry points: open, get, close
 */
#include "util/err.h"
#include "eval/task_impl.h"

#include "eval/eval_file.h"
#include "eval/metrics.h"
#include "util/textbuf.h"
#include "util/paths.h"
#include "util/rng.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(SPARQ_HAVE_ZLIB)
#include <zlib.h>
#endif

/* ---- defaults ------------------------------------------------------------ */

task_params task_default_params(void)
{
    task_params p;
    memset(&p, 0, sizeof p);
    p.squad_confusion = 7;
    p.kvret_keys = 75;
    p.kvret_gold_index = -1;
    p.niah_depths = 11;
    return p;
}

/* ---- random numbers ----------------------------------------------------- */

static void rng_seed(task_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed;
    uint64_t h = rng_splitmix64(&x);
    x = h ^ (stream * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 4; i++) r->s[i] = rng_splitmix64(&x);
}

static uint64_t rotl(uint64_t v, int k)
{
    return (v << k) | (v >> (64 - k));
}

static uint64_t rng_next(task_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

void task_rng_init(task_rng *r, const task_set *s, int64_t item)
{
    /* streams separate the permutation and each example */
    rng_seed(r, s->p.seed, (s->def->stream << 56) ^ (uint64_t)(item + 1));
}

/* Uniform in [0, n), n > 0, without modulo bias: values below 2^64 mod n
 * are rejected so the rest is a whole number of copies of [0, n). */
uint64_t task_rng_below(task_rng *r, uint64_t n)
{
    uint64_t t = (0 - n) % n, v;
    do v = rng_next(r);
    while (v < t);
    return v % n;
}

/* Fisher-Yates. */
int task_make_perm(task_set *s, int64_t n, char *err, size_t err_size)
{
    int64_t *perm = malloc((size_t)(n > 0 ? n : 1) * sizeof *perm);
    if (!perm) return err_set(err, err_size, "%s: out of memory", s->def->name);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    task_rng r;
    task_rng_init(&r, s, -1);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)task_rng_below(&r, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    s->perm = perm;
    return 0;
}

/* ---- string builder ----------------------------------------------------- */

void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    text_buf t = { b->s, b->n, b->cap }; /* text_append grows it */
    if (n > SIZE_MAX / 2 - b->n || text_append(&t, s, n)) {
        b->oom = 1;
        return;
    }
    b->s = t.data;
    b->n = t.len;
    b->cap = t.cap;
}

void sb_adds(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* Hands the built string to the example (or reports OOM). */
int sb_finish(sbuf *b, task_example *ex, char *err, size_t err_size)
{
    if (b->oom || !b->s) {
        free(b->s);
        return err_set(err, err_size, "tasks: out of memory building a prompt");
    }
    ex->prompt = b->s;
    ex->n_prompt = b->n;
    return 0;
}

char *task_dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *task_dup_printf(const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return task_dup_n(tmp, strlen(tmp));
}

/* Adds a copy of s[0..n) to the answers unless it is already there
 * (SQuAD lists the same span once per annotator); -1 on OOM. */
int task_add_answer(task_example *ex, const char *s, size_t n)
{
    for (int k = 0; k < ex->n_answers; k++)
        if (strlen(ex->answers[k]) == n && !memcmp(ex->answers[k], s, n)) return 0;
    char **na = realloc(ex->answers, (size_t)(ex->n_answers + 1) * sizeof *na);
    if (!na) return -1;
    ex->answers = na;
    char *d = task_dup_n(s, n);
    if (!d) return -1;
    ex->answers[ex->n_answers++] = d;
    return 0;
}

void task_example_init(task_example *ex)
{
    memset(ex, 0, sizeof *ex);
    ex->depth = -1.0;
    ex->gold_index = -1;
}

void task_example_free(task_example *ex)
{
    if (!ex) return;
    free(ex->id);
    free(ex->prompt);
    for (int i = 0; i < ex->n_answers; i++) free(ex->answers[i]);
    free(ex->answers);
    task_example_init(ex);
}

/* ---- text helpers ------------------------------------------------------- */

/* Python's \s for the characters that occur in these files (ASCII). */
int task_is_ws(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* Byte position after `k` code points from pos, or SIZE_MAX if s[pos..end)
 * has fewer. */
size_t task_advance_chars(const char *s, size_t pos, size_t end, int64_t k)
{
    while (k > 0) {
        if (pos >= end) return SIZE_MAX;
        pos++;
        while (pos < end && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
        k--;
    }
    return pos;
}

int64_t task_count_chars(const char *s, size_t from, size_t to)
{
    int64_t c = 0;
    for (size_t i = from; i < to; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

size_t task_next_ws(const char *s, size_t pos, size_t end)
{
    while (pos < end && !task_is_ws((unsigned char)s[pos])) pos++;
    return pos;
}

int span_push(span_list *l, text_span sp)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 256;
        text_span *nv = realloc(l->v, (size_t)cap * sizeof *nv);
        if (!nv) return -1;
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = sp;
    return 0;
}

/* The authors' "(.{P}.*?)(\s.{R-1}.*?)(?=\s|$)" from `pos` inside [.., end):
 * prefill [pos, *split) of >= P chars ending before whitespace, continuation
 * [*split, *ref_end) of >= R chars ending before whitespace or at `end`.
 * Returns 0, or -1 if there is no such match (then no later one either:
 * a later start leaves fewer characters). */
int split_prefill(const char *t, size_t pos, size_t end, int64_t P, int64_t R, size_t *split,
                         size_t *ref_end)
{
    size_t a = task_advance_chars(t, pos, end, P);
    if (a == SIZE_MAX) return -1;
    size_t p = task_next_ws(t, a, end);
    if (p >= end) return -1;
    size_t q = task_advance_chars(t, p, end, R);
    if (q == SIZE_MAX) return -1;
    *split = p;
    *ref_end = task_next_ws(t, q, end);
    return 0;
}

/* ---- shared scoring ---------------------------------------------------- */

/* 1 if the generated text, normalised, starts with a normalised answer. */
int task_score_qa(const task_example *ex, const char *out, size_t n_out, double *value, char *err,
                  size_t err_size)
{
    (void)n_out;
    const int hit = metrics_qa_match(out, (const char *const *)ex->answers, ex->n_answers);
    if (hit < 0) return err_set(err, err_size, "qa: out of memory scoring");
    *value = hit > 0;
    return 0;
}

/* min(qa_max_tokens, qa_spare_tokens + the longest answer). */
int64_t task_qa_gen_tokens(const eval_task_params *p, int64_t longest)
{
    const int64_t n = p->qa_spare_tokens + longest;
    return n < p->qa_max_tokens ? n : p->qa_max_tokens;
}

/* ---- files -------------------------------------------------------------- */

int task_find_data(const char *task, const char *name, char *path, size_t path_size, char *err,
                     size_t err_size)
{
    if (path_find(name, path, path_size) == 0) return 0;
    return err_set(err, err_size, "%s: %s not found in search path (%s)", task, name, path_search_description());
}

int task_read_file(const char *task, const char *path, char **out, size_t *n_out, char *err, size_t err_size)
{
    char msg[512];
    if (eval_read_file(path, out, n_out, msg, sizeof msg) == 0) return 0;
    return err_set(err, err_size, "%s: %s", task, msg);
}

#if !defined(SPARQ_HAVE_ZLIB)
/* A build without zlib (a cross build whose sysroot lacks it, Makefile). */
int task_read_gz(const char *task, const char *path, char **out, size_t *n_out, char *err, size_t err_size)
{
    *out = NULL;
    *n_out = 0;
    return err_set(err, err_size, "%s: cannot read %s: this sparq was built without zlib", task, path);
}
#else
int task_read_gz(const char *task, const char *path, char **out, size_t *n_out, char *err, size_t err_size)
{
    *out = NULL;
    *n_out = 0;
    /* a FIFO or device here would block gzopen: open it ourselves */
    char why[300];
    const int fd = path_open_regular(path, O_RDONLY, why, sizeof why);
    if (fd < 0) return err_set(err, err_size, "%s: %s", task, why);
    gzFile g = gzdopen(fd, "rb");
    if (!g) {
        close(fd);
        return err_set(err, err_size, "%s: cannot open %s", task, path);
    }
    size_t cap = 1 << 22, n = 0;
    char *buf = malloc(cap);
    int rc = 0;
    while (buf) {
        if (cap - 1 - n < (1u << 20)) {
            if (cap >= EVAL_MAX_FILE_BYTES) { /* a gz bomb */
                rc = err_set(err, err_size, "%s: %s inflates past %llu bytes", task, path,
                             (unsigned long long)EVAL_MAX_FILE_BYTES);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        int got = gzread(g, buf + n, 1u << 20);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(g, &zerr);
            rc = err_set(err, err_size, "%s: %s: gzip error: %s", task, path, msg ? msg : "unknown");
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    gzclose(g);
    if (!buf) return err_set(err, err_size, "%s: out of memory reading %s", task, path);
    if (rc) { free(buf); return rc; }
    buf[n] = 0;
    *out = buf;
    *n_out = n;
    return 0;
}
#endif

json_doc *task_parse_json_file(const char *task, const char *path, char *err, size_t err_size)
{
    size_t n;
    char *text;
    if (task_read_file(task, path, &text, &n, err, err_size)) return NULL;
    char jerr[200];
    json_doc *d = json_parse(text, n, 64, jerr, sizeof jerr);
    if (!d) {
        err_set(err, err_size, "%s: %s: %s", task, path, jerr);
        free(text);
        return NULL;
    }
    /* The DOM copies every string, so the raw text is no longer needed. */
    free(text);
    return d;
}

/* s->p.path, or default_name found on the search path (into path). */
static const char *data_file(const task_set *s, const char *default_name, char *path, size_t path_size, char *err,
                             size_t err_size)
{
    if (s->p.path) return s->p.path;
    return task_find_data(s->def->name, default_name, path, path_size, err, err_size) ? NULL : path;
}

int task_text_open(task_set *s, const char *default_name, char *err, size_t err_size)
{
    char path[TASK_PATH_MAX];
    const char *file = data_file(s, default_name, path, sizeof path, err, err_size);
    return file ? task_read_file(s->def->name, file, &s->text, &s->n_text, err, err_size) : -1;
}

int task_list_open(task_set *s, const char *default_name,
                   int (*keep)(const task_set *s, const json_value *it, size_t i, char *err, size_t err_size),
                   char *err, size_t err_size)
{
    const char *task = s->def->name;
    char path[TASK_PATH_MAX];
    const char *file = data_file(s, default_name, path, sizeof path, err, err_size);
    if (!file || !(s->docs[0] = task_parse_json_file(task, file, err, err_size))) return -1;
    const json_value *root = json_root(s->docs[0]);
    if (root->type != JSON_ARRAY) return err_set(err, err_size, "%s: %s is not a JSON list", task, file);
    s->items = malloc((root->n ? root->n : 1) * sizeof *s->items);
    if (!s->items) return err_set(err, err_size, "%s: out of memory", task);
    int64_t n = 0;
    for (size_t i = 0; i < root->n; i++) {
        const json_value *it = json_at(root, i);
        const int k = keep(s, it, i, err, err_size);
        if (k < 0) return -1;
        if (k) s->items[n++] = it;
    }
    s->n_examples = n;
    return 0;
}

/* ---- public entry points ------------------------------------------------ */

void task_close(task_set *s)
{
    if (!s) return;
    if (s->priv && s->def->free_priv) s->def->free_priv(s->priv);
    free(s->text);
    json_free(s->docs[0]);
    json_free(s->docs[1]);
    free(s->items);
    free(s->perm);
    free(s);
}

int64_t task_count(const task_set *s)
{
    return s ? s->n_examples : 0;
}

int task_open(task_set **out, const task_def *task, const task_params *params, char *err, size_t err_size)
{
    *out = NULL;
    if (!task || !task->open) return err_set(err, err_size, "tasks: no task to open");
    task_set *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, err_size, "tasks: out of memory");
    s->def = task;
    s->p = params ? *params : task_default_params();
    if (task->open(s, err, err_size)) {
        task_close(s);
        return -1;
    }
    s->p.path = NULL; /* borrowed; not needed after loading */
    s->p.niah_length_list = NULL;
    *out = s;
    return 0;
}

int task_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    task_example_init(ex);
    if (!s) return err_set(err, err_size, "tasks: no task set");
    if (i < 0 || i >= s->n_examples)
        return err_set(err, err_size, "%s: example %lld out of range [0, %lld)", s->def->name, (long long)i,
                       (long long)s->n_examples);
    const int rc = s->def->get(s, i, ex, err, err_size);
    if (rc) task_example_free(ex);
    return rc;
}
