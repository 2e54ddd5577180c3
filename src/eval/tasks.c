/* tasks.c - evaluation task builders (see tasks.h for each task's format).
 *
 * Map:
 *   rng_*          xoshiro256** seeded by splitmix64; a stream per example
 *   sbuf_*         growable string builder (one OOM flag, checked once)
 *   text helpers   code-point stepping, whitespace, file and .gz reading
 *   squad_*        load (index paragraphs/questions over the JSON DOM), build
 *   triviaqa_*, cnndm_*      load, build
 *   wikitext_*, repetition_* split into spans at open, build from spans
 *   niah_*         haystack, needle placement, token-budget search
 *   kvret_*        line index over the decompressed JSONL, build per line
 *   task_*         the public entry points
 */
#include "util/err.h"
#include "eval/tasks.h"

#include "util/json.h"
#include "util/paths.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define PATH_MAX_LEN 4096
#define MAX_FILE_BYTES ((size_t)1 << 31) /* refuse bigger inputs (and gz bombs) */

static const char *const kind_names[TASK_N_KINDS] = {
    "squad", "triviaqa", "cnndm", "wikitext", "repetition", "niah", "kvret",
};

static const char NIAH_NEEDLE[] =
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
static const char NIAH_QUESTION[] =
    "\n\nQuestion: What is the best thing to do in San Francisco?\nAnswer: The best thing to do in San Francisco is";
static const char NIAH_ANSWER[] = "eat a sandwich and sit in Dolores Park on a sunny day";

/* ---- errors ------------------------------------------------------------ */

/* ---- random numbers ----------------------------------------------------- */

typedef struct {
    uint64_t s[4];
} rng_t;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Independent generator for (seed, stream): streams separate the
 * permutation and each example, so example i never depends on others. */
static void rng_init(rng_t *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed;
    uint64_t h = splitmix64(&x);
    x = h ^ (stream * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t v, int k)
{
    return (v << k) | (v >> (64 - k));
}

static uint64_t rng_next(rng_t *r)
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

/* Uniform in [0, n), n > 0, without modulo bias: values below 2^64 mod n
 * are rejected so the rest is a whole number of copies of [0, n). */
static uint64_t rng_below(rng_t *r, uint64_t n)
{
    uint64_t t = (0 - n) % n, v;
    do v = rng_next(r);
    while (v < t);
    return v % n;
}

static uint64_t stream_id(task_kind kind, int64_t item)
{
    return ((uint64_t)kind << 56) ^ (uint64_t)(item + 1);
}

/* perm[0..n) = a seeded random permutation of 0..n-1 (Fisher-Yates). */
static int64_t *make_perm(int64_t n, uint64_t seed, task_kind kind)
{
    int64_t *perm = malloc((size_t)(n > 0 ? n : 1) * sizeof *perm);
    if (!perm) return NULL;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    rng_t r;
    rng_init(&r, seed, stream_id(kind, -1));
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    return perm;
}

/* ---- string builder ----------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (n > SIZE_MAX - b->n - 1) { b->oom = 1; return; }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 2) { b->oom = 1; return; }
            cap *= 2;
        }
        char *ns = realloc(b->s, cap);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_adds(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* SQuAD titles are Wikipedia page names: underscores stand for spaces. */
static void sb_add_title(sbuf *b, const char *s, size_t n)
{
    size_t start = b->n;
    sb_add(b, s, n);
    if (b->oom) return;
    for (size_t i = start; i < b->n; i++)
        if (b->s[i] == '_') b->s[i] = ' ';
}

/* Hands the built string to the example (or reports OOM). */
static int sb_finish(sbuf *b, task_example *ex, char *err, size_t err_size)
{
    if (b->oom || !b->s) {
        free(b->s);
        return err_set(err, err_size, "tasks: out of memory building a prompt");
    }
    ex->prompt = b->s;
    ex->n_prompt = b->n;
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static char *dup_printf(const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return dup_n(tmp, strlen(tmp));
}

/* Adds a copy of s[0..n) to the answers unless it is already there
 * (SQuAD lists the same span once per annotator); -1 on OOM. */
static int add_answer(task_example *ex, const char *s, size_t n)
{
    for (int k = 0; k < ex->n_answers; k++)
        if (strlen(ex->answers[k]) == n && !memcmp(ex->answers[k], s, n)) return 0;
    char **na = realloc(ex->answers, (size_t)(ex->n_answers + 1) * sizeof *na);
    if (!na) return -1;
    ex->answers = na;
    char *d = dup_n(s, n);
    if (!d) return -1;
    ex->answers[ex->n_answers++] = d;
    return 0;
}

static void example_init(task_example *ex)
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
    example_init(ex);
}

/* ---- text helpers ------------------------------------------------------- */

/* Python's \s for the characters that occur in these files (ASCII). */
static int is_ws(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* Byte position after `k` code points from pos, or SIZE_MAX if s[pos..end)
 * has fewer. */
static size_t advance_chars(const char *s, size_t pos, size_t end, int64_t k)
{
    while (k > 0) {
        if (pos >= end) return SIZE_MAX;
        pos++;
        while (pos < end && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
        k--;
    }
    return pos;
}

static int64_t count_chars(const char *s, size_t from, size_t to)
{
    int64_t c = 0;
    for (size_t i = from; i < to; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static size_t next_ws(const char *s, size_t pos, size_t end)
{
    while (pos < end && !is_ws((unsigned char)s[pos])) pos++;
    return pos;
}

static int find_data(const char *task, const char *name, char *path, size_t path_size, char *err,
                     size_t err_size)
{
    if (path_find(name, path, path_size) == 0) return 0;
    return err_set(err, err_size, "%s: %s not found in search path (%s)", task, name, path_search_description());
}

static int read_file(const char *task, const char *path, char **out, size_t *n_out, char *err, size_t err_size)
{
    *out = NULL;
    *n_out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, err_size, "%s: cannot open %s", task, path);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap - 1) {
            if (cap >= MAX_FILE_BYTES) {
                fclose(f);
                free(buf);
                return err_set(err, err_size, "%s: %s is larger than %zu bytes", task, path, MAX_FILE_BYTES);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) return err_set(err, err_size, "%s: out of memory reading %s", task, path);
    if (bad) { free(buf); return err_set(err, err_size, "%s: read error on %s", task, path); }
    buf[n] = 0;
    *out = buf;
    *n_out = n;
    return 0;
}

static int read_gz(const char *task, const char *path, char **out, size_t *n_out, char *err, size_t err_size)
{
    *out = NULL;
    *n_out = 0;
    gzFile g = gzopen(path, "rb");
    if (!g) return err_set(err, err_size, "%s: cannot open %s", task, path);
    size_t cap = 1 << 22, n = 0;
    char *buf = malloc(cap);
    int rc = 0;
    while (buf) {
        if (cap - 1 - n < (1u << 20)) {
            if (cap >= MAX_FILE_BYTES) {
                rc = err_set(err, err_size, "%s: %s inflates past %zu bytes", task, path, MAX_FILE_BYTES);
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

static json_doc *parse_json_file(const char *task, const char *path, char *err, size_t err_size)
{
    size_t n;
    char *text;
    if (read_file(task, path, &text, &n, err, err_size)) return NULL;
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

/* ---- the set ------------------------------------------------------------ */

typedef struct {
    const char *title, *context;
    size_t title_len, context_len;
    int64_t q_begin, q_end;     /* its questions: qs[q_begin..q_end) */
} squad_para;

typedef struct {
    int64_t para;
    const json_value *qa;       /* {"question", "id", "answers": [{"text"}]} */
} squad_q;

typedef struct {
    size_t ctx_start, ctx_end;  /* repetition: the context; wikitext: unused */
    size_t ex_start;            /* excerpt (repetition) / prefill (wikitext) start */
    size_t ref_start, ref_end;  /* the continuation */
} text_span;

struct task_set {
    task_kind kind;
    task_params p;
    int64_t *niah_lengths;      /* owned copy of p.niah_lengths */
    char *text;                 /* raw text: wikitext, repetition, niah, kvret */
    size_t n_text;
    char *tmpl;                 /* kvret prompt template */
    size_t n_tmpl;
    json_doc *docs[2];
    squad_para *paras;
    int64_t n_paras;
    squad_q *qs;
    int64_t n_qs;
    const json_value **items;   /* triviaqa / cnndm examples */
    text_span *spans;
    size_t *lines;              /* kvret: [n_lines][2] offset, length */
    int64_t *perm;              /* example order; NULL = identity */
    int64_t n_examples;
};

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

const char *task_kind_name(task_kind kind)
{
    return (kind >= 0 && kind < TASK_N_KINDS) ? kind_names[kind] : "?";
}

int task_kind_from_name(const char *name, task_kind *out)
{
    for (int k = 0; k < TASK_N_KINDS; k++)
        if (name && !strcmp(name, kind_names[k])) {
            *out = (task_kind)k;
            return 0;
        }
    return -1;
}

void task_close(task_set *s)
{
    if (!s) return;
    free(s->niah_lengths);
    free(s->text);
    free(s->tmpl);
    json_free(s->docs[0]);
    json_free(s->docs[1]);
    free(s->paras);
    free(s->qs);
    free(s->items);
    free(s->spans);
    free(s->lines);
    free(s->perm);
    free(s);
}

task_kind task_set_kind(const task_set *s)
{
    return s->kind;
}

int64_t task_count(const task_set *s)
{
    return s ? s->n_examples : 0;
}

/* ---- squad -------------------------------------------------------------- */

/* Walks data[].paragraphs[].qas[] of every document; with fill = 0 only
 * counts (and validates), with fill = 1 writes paras/qs. */
static int squad_walk(task_set *s, int fill, int64_t *n_paras, int64_t *n_qs, char *err, size_t err_size)
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
                if (fill) s->paras[np] = (squad_para){ title, ctx, tlen, clen, nq, nq + (int64_t)qas->n };
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
                    if (fill) s->qs[nq] = (squad_q){ np, qa };
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

static int squad_open(task_set *s, char *err, size_t err_size)
{
    char path[PATH_MAX_LEN];
    if (s->p.path) {
        if (!(s->docs[0] = parse_json_file("squad", s->p.path, err, err_size))) return -1;
    } else if (path_find("data/qa/squad/dev-v1.1.json", path, sizeof path) == 0) {
        if (!(s->docs[0] = parse_json_file("squad", path, err, err_size))) return -1;
    } else {
        static const char *const parts[2] = { "data/qa/squad/dev-v1.1.part1of2.json",
                                              "data/qa/squad/dev-v1.1.part2of2.json" };
        for (int i = 0; i < 2; i++) {
            if (find_data("squad", parts[i], path, sizeof path, err, err_size)) return -1;
            if (!(s->docs[i] = parse_json_file("squad", path, err, err_size))) return -1;
        }
    }
    int64_t np, nq;
    if (squad_walk(s, 0, &np, &nq, err, err_size)) return -1;
    if (np < 1 || nq < 1) return err_set(err, err_size, "squad: no questions in the data");
    s->paras = malloc((size_t)np * sizeof *s->paras);
    s->qs = malloc((size_t)nq * sizeof *s->qs);
    if (!s->paras || !s->qs) return err_set(err, err_size, "squad: out of memory");
    if (squad_walk(s, 1, &np, &nq, err, err_size)) return -1;
    s->n_paras = np;
    s->n_qs = nq;
    s->n_examples = nq;
    if (!(s->perm = make_perm(nq, s->p.seed, s->kind))) return err_set(err, err_size, "squad: out of memory");
    return 0;
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
static int64_t squad_pick_paragraphs(const task_set *s, int64_t para, int64_t want, rng_t *r, int64_t *slots)
{
    const squad_para *P = &s->paras[para];
    int64_t *cand = malloc((size_t)s->n_paras * sizeof *cand);
    if (!cand) return -1;
    for (int64_t k = 0; k < s->n_paras; k++) cand[k] = k;
    int64_t n = 0;
    slots[n++] = para;
    for (int64_t j = 0; j < s->n_paras && n < want + 1; j++) {
        int64_t pick = j + (int64_t)rng_below(r, (uint64_t)(s->n_paras - j));
        int64_t t = cand[j];
        cand[j] = cand[pick];
        cand[pick] = t;
        if (cand[j] != para && !squad_same_context(&s->paras[cand[j]], P)) slots[n++] = cand[j];
    }
    free(cand);
    for (int64_t k = n - 1; k > 0; k--) {
        int64_t j = (int64_t)rng_below(r, (uint64_t)k + 1);
        int64_t t = slots[k];
        slots[k] = slots[j];
        slots[j] = t;
    }
    return n;
}

/* The 1-shot example: a random other answered question on the same
 * paragraph, else (as the authors fell back to) one from the whole set. */
static const squad_q *squad_pick_shot(const task_set *s, int64_t qi, rng_t *r)
{
    const squad_para *P = &s->paras[s->qs[qi].para];
    size_t alen;
    int64_t n_same = 0;
    for (int64_t k = P->q_begin; k < P->q_end; k++)
        if (k != qi && squad_short_answer(&s->qs[k], &alen)) n_same++;
    if (n_same > 0) {
        int64_t pick = (int64_t)rng_below(r, (uint64_t)n_same);
        for (int64_t k = P->q_begin; k < P->q_end; k++)
            if (k != qi && squad_short_answer(&s->qs[k], &alen) && pick-- == 0) return &s->qs[k];
    }
    for (int tries = 0; tries < 1000; tries++) {
        int64_t k = (int64_t)rng_below(r, (uint64_t)s->n_qs);
        if (k != qi && squad_short_answer(&s->qs[k], &alen)) return &s->qs[k];
    }
    return NULL;
}

static int squad_build(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    int64_t qi = s->perm[i];
    const squad_q *q = &s->qs[qi];
    const squad_para *P = &s->paras[q->para];
    rng_t r;
    rng_init(&r, s->p.seed, stream_id(s->kind, qi));
    int64_t want = s->p.squad_confusion < 0 ? 0 : s->p.squad_confusion;
    if (want > s->n_paras - 1) want = s->n_paras - 1;
    int64_t *slots = malloc((size_t)(want + 1) * sizeof *slots);
    int64_t n_slots = slots ? squad_pick_paragraphs(s, q->para, want, &r, slots) : -1;
    if (n_slots < 0) {
        free(slots);
        return err_set(err, err_size, "squad: out of memory");
    }
    const squad_q *shot = squad_pick_shot(s, qi, &r);
    if (!shot) {
        free(slots);
        return err_set(err, err_size, "squad: no other answered question to use as the 1-shot example");
    }

    sbuf b = { 0 };
    for (int64_t k = 0; k < n_slots; k++) {
        const squad_para *c = &s->paras[slots[k]];
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
        if (add_answer(ex, t, l)) return err_set(err, err_size, "squad: out of memory");
    }
    size_t idlen;
    const char *id = json_get_str(q->qa, "id", &idlen);
    ex->id = id ? dup_n(id, idlen) : dup_printf("squad-%lld", (long long)qi);
    if (!ex->id) return err_set(err, err_size, "squad: out of memory");
    return 0;
}

/* ---- triviaqa and cnndm: a JSON list of objects -------------------------- */

static int list_open(task_set *s, const char *task, const char *default_name, char *err, size_t err_size)
{
    char path[PATH_MAX_LEN];
    const char *file = s->p.path;
    if (!file) {
        if (find_data(task, default_name, path, sizeof path, err, err_size)) return -1;
        file = path;
    }
    if (!(s->docs[0] = parse_json_file(task, file, err, err_size))) return -1;
    const json_value *root = json_root(s->docs[0]);
    if (root->type != JSON_ARRAY) return err_set(err, err_size, "%s: %s is not a JSON list", task, file);
    s->items = malloc((root->n ? root->n : 1) * sizeof *s->items);
    if (!s->items) return err_set(err, err_size, "%s: out of memory", task);
    int64_t n = 0;
    for (size_t i = 0; i < root->n; i++) {
        const json_value *it = json_at(root, i);
        if (s->kind == TASK_TRIVIAQA) {
            if (!json_get_str(it, "question", NULL))
                return err_set(err, err_size, "%s: item %zu has no \"question\"", task, i);
        } else {
            size_t alen;
            const char *art = json_get_str(it, "article", &alen);
            if (!art || !json_get_str(it, "highlights", NULL))
                return err_set(err, err_size, "%s: item %zu lacks \"article\" or \"highlights\"", task, i);
            int64_t chars = count_chars(art, 0, alen);
            if (s->p.cnndm_min_chars > 0 && chars < s->p.cnndm_min_chars) continue;
            if (s->p.cnndm_max_chars > 0 && chars > s->p.cnndm_max_chars) continue;
        }
        s->items[n++] = it;
    }
    s->n_examples = n;
    return 0;
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
        if (t && add_answer(ex, t, l)) return -1;
        a = json_get(a, "aliases");
    }
    if (a && a->type == JSON_STRING) return add_answer(ex, a->u.str, a->n);
    for (size_t k = 0; k < json_len(a); k++) {
        size_t l;
        const char *t = json_str(json_at(a, k), &l);
        if (t && add_answer(ex, t, l)) return -1;
    }
    return 0;
}

static int triviaqa_build(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
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
    ex->id = id ? dup_n(id, idlen) : dup_printf("triviaqa-%lld", (long long)i);
    if (!ex->id) return err_set(err, err_size, "triviaqa: out of memory");
    return 0;
}

static int cnndm_build(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
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
    ex->id = id ? dup_n(id, idlen) : dup_printf("cnndm-%lld", (long long)i);
    if (!ex->id || add_answer(ex, hl, hlen)) return err_set(err, err_size, "cnndm: out of memory");
    return 0;
}

/* ---- wikitext and repetition: spans of one text -------------------------- */

typedef struct {
    text_span *v;
    int64_t n, cap;
} span_list;

static int span_push(span_list *l, text_span sp)
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
static int split_prefill(const char *t, size_t pos, size_t end, int64_t P, int64_t R, size_t *split,
                         size_t *ref_end)
{
    size_t a = advance_chars(t, pos, end, P);
    if (a == SIZE_MAX) return -1;
    size_t p = next_ws(t, a, end);
    if (p >= end) return -1;
    size_t q = advance_chars(t, p, end, R);
    if (q == SIZE_MAX) return -1;
    *split = p;
    *ref_end = next_ws(t, q, end);
    return 0;
}

static int text_open(task_set *s, const char *task, const char *default_name, char *err, size_t err_size)
{
    char path[PATH_MAX_LEN];
    const char *file = s->p.path;
    if (!file) {
        if (find_data(task, default_name, path, sizeof path, err, err_size)) return -1;
        file = path;
    }
    return read_file(task, file, &s->text, &s->n_text, err, err_size);
}

/* A top-level WikiText heading line: " = Title = " (not " = = Sub = = "). */
static int wiki_is_title(const char *t, size_t pos, size_t n)
{
    return n - pos >= 4 && t[pos] == ' ' && t[pos + 1] == '=' && t[pos + 2] == ' ' && t[pos + 3] != '=';
}

static int wikitext_open(task_set *s, char *err, size_t err_size)
{
    if (text_open(s, "wikitext", "data/text/wikitext-2-raw_wiki.test.raw", err, err_size)) return -1;
    int64_t P = s->p.context_chars > 0 ? s->p.context_chars : 6000;
    int64_t R = s->p.reference_chars > 0 ? s->p.reference_chars : 400;
    const char *t = s->text;
    size_t n = s->n_text;
    span_list l = { 0 };
    /* Articles start at heading lines (a line start followed by " = X");
     * text before the first heading (or a file without any) is one too. */
    size_t art = 0;
    for (size_t pos = 1; pos <= n; pos++) {
        int boundary = pos == n || (t[pos - 1] == '\n' && wiki_is_title(t, pos, n));
        if (!boundary) continue;
        size_t cur = art, split, ref_end;
        while (split_prefill(t, cur, pos, P, R, &split, &ref_end) == 0) {
            if (span_push(&l, (text_span){ art, pos, cur, split, ref_end })) {
                free(l.v);
                return err_set(err, err_size, "wikitext: out of memory");
            }
            cur = ref_end;
            while (cur < pos && is_ws((unsigned char)t[cur])) cur++;
        }
        art = pos;
    }
    s->spans = l.v;
    s->n_examples = l.n;
    if (l.n == 0)
        return err_set(err, err_size, "wikitext: no article has %lld + %lld characters", (long long)P, (long long)R);
    if (!(s->perm = make_perm(l.n, s->p.seed, s->kind))) return err_set(err, err_size, "wikitext: out of memory");
    return 0;
}

static int wikitext_build(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const text_span *sp = &s->spans[s->perm[i]];
    sbuf b = { 0 };
    sb_add(&b, s->text + sp->ex_start, sp->ref_start - sp->ex_start);
    if (sb_finish(&b, ex, err, err_size)) return -1;
    ex->n_context = ex->n_prompt;
    ex->id = dup_printf("wikitext-%zu", sp->ex_start);
    if (!ex->id || add_answer(ex, s->text + sp->ref_start, sp->ref_end - sp->ref_start))
        return err_set(err, err_size, "wikitext: out of memory");
    return 0;
}

static int repetition_open(task_set *s, char *err, size_t err_size)
{
    if (text_open(s, "repetition", "data/text/tinyshakespeare_input.txt", err, err_size)) return -1;
    int64_t C = s->p.context_chars > 0 ? s->p.context_chars : 6000;
    int64_t E = s->p.excerpt_chars > 0 ? s->p.excerpt_chars : 128;
    int64_t R = s->p.reference_chars > 0 ? s->p.reference_chars : 256;
    const char *t = s->text;
    size_t n = s->n_text, cs = 0;
    span_list l = { 0 };
    /* Contexts: "(.{C,}?)(?=\s|$)" repeatedly; each starts where the last
     * ended (on its whitespace). */
    for (;;) {
        size_t a = advance_chars(t, cs, n, C);
        if (a == SIZE_MAX) break;
        size_t ce = next_ws(t, a, n);
        size_t cur = cs, split, ref_end;
        while (split_prefill(t, cur, ce, E, R, &split, &ref_end) == 0) {
            if (span_push(&l, (text_span){ cs, ce, cur, split, ref_end })) {
                free(l.v);
                return err_set(err, err_size, "repetition: out of memory");
            }
            cur = ref_end;
        }
        if (ce >= n) break;
        cs = ce;
    }
    s->spans = l.v;
    s->n_examples = l.n;
    if (l.n == 0) return err_set(err, err_size, "repetition: the text has fewer than %lld characters", (long long)C);
    if (!(s->perm = make_perm(l.n, s->p.seed, s->kind))) return err_set(err, err_size, "repetition: out of memory");
    return 0;
}

static int repetition_build(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const text_span *sp = &s->spans[s->perm[i]];
    sbuf b = { 0 };
    sb_add(&b, s->text + sp->ctx_start, sp->ctx_end - sp->ctx_start);
    ex->n_context = b.n;
    sb_adds(&b, "\n");
    sb_add(&b, s->text + sp->ex_start, sp->ref_start - sp->ex_start);
    if (sb_finish(&b, ex, err, err_size)) return -1;
    ex->id = dup_printf("%zu", sp->ex_start);
    if (!ex->id || add_answer(ex, s->text + sp->ref_start, sp->ref_end - sp->ref_start))
        return err_set(err, err_size, "repetition: out of memory");
    return 0;
}

/* ---- niah --------------------------------------------------------------- */

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
        if (!(names[n] = dup_n(e->d_name, l))) { rc = -1; break; }
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
        char path[PATH_MAX_LEN];
        int k = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (k < 0 || (size_t)k >= sizeof path) {
            rc = err_set(err, err_size, "niah: path too long: %s/%s", dir, names[i]);
            break;
        }
        char *text;
        size_t len;
        rc = read_file("niah", path, &text, &len, err, err_size);
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

static int niah_open(task_set *s, char *err, size_t err_size)
{
    char path[PATH_MAX_LEN];
    if (s->p.path) {
        if (read_file("niah", s->p.path, &s->text, &s->n_text, err, err_size)) return -1;
    } else if (path_find("data/text/PaulGrahamEssays_all_sorted.txt", path, sizeof path) == 0) {
        if (read_file("niah", path, &s->text, &s->n_text, err, err_size)) return -1;
    } else {
        if (find_data("niah", "data/text/PaulGrahamEssays", path, sizeof path, err, err_size)) return -1;
        if (niah_read_dir(s, path, err, err_size)) return -1;
    }
    if (s->n_text == 0) return err_set(err, err_size, "niah: the haystack text is empty");
    int depths = s->p.niah_depths > 0 ? s->p.niah_depths : 11;
    s->p.niah_depths = depths;
    if (s->p.n_niah_lengths > 0 && s->p.niah_lengths) {
        s->niah_lengths = malloc((size_t)s->p.n_niah_lengths * sizeof *s->niah_lengths);
        if (!s->niah_lengths) return err_set(err, err_size, "niah: out of memory");
        memcpy(s->niah_lengths, s->p.niah_lengths, (size_t)s->p.n_niah_lengths * sizeof *s->niah_lengths);
        s->n_examples = (int64_t)s->p.n_niah_lengths * depths;
    }
    s->p.niah_lengths = s->niah_lengths;
    return 0;
}

/* A sentence boundary: right after a '.' that is followed by whitespace
 * (or ends the haystack). */
static int niah_is_boundary(const char *h, size_t n, size_t i)
{
    return i >= 1 && i <= n && h[i - 1] == '.' && (i == n || is_ws((unsigned char)h[i]));
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
    while (n > 0 && !(t[(n - 1) % nt] == '.' && is_ws((unsigned char)t[n % nt]))) n--;
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
    example_init(ex);
    if (!s || s->kind != TASK_NIAH) return err_set(err, err_size, "niah: not a niah task set");
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
    ex->id = dup_printf("niah-%zu-%.3f", n_hay, depth);
    if (!ex->id || add_answer(ex, NIAH_ANSWER, sizeof NIAH_ANSWER - 1)) {
        task_example_free(ex);
        return err_set(err, err_size, "niah: out of memory");
    }
    return 0;
}

/* ---- kvret -------------------------------------------------------------- */

static int kvret_open(task_set *s, char *err, size_t err_size)
{
    if (s->p.kvret_keys != 75 && s->p.kvret_keys != 140)
        return err_set(err, err_size, "kvret: kvret_keys must be 75 or 140, not %d", s->p.kvret_keys);
    char path[PATH_MAX_LEN], name[128];
    const char *file = s->p.path;
    if (!file) {
        snprintf(name, sizeof name, "data/qa/lost-in-the-middle/kv-retrieval-%d_keys.jsonl.gz", s->p.kvret_keys);
        if (find_data("kvret", name, path, sizeof path, err, err_size)) return -1;
        file = path;
    }
    if (read_gz("kvret", file, &s->text, &s->n_text, err, err_size)) return -1;
    if (find_data("kvret", "data/qa/lost-in-the-middle/kv_retrieval.prompt", path, sizeof path, err, err_size))
        return -1;
    if (read_file("kvret", path, &s->tmpl, &s->n_tmpl, err, err_size)) return -1;
    while (s->n_tmpl > 0 && s->tmpl[s->n_tmpl - 1] == '\n') s->tmpl[--s->n_tmpl] = 0; /* rstrip("\n") */
    int64_t n = 0;
    for (size_t i = 0; i < s->n_text; i++) n += s->text[i] == '\n';
    s->lines = malloc((size_t)(n + 1) * 2 * sizeof *s->lines);
    if (!s->lines) return err_set(err, err_size, "kvret: out of memory");
    int64_t k = 0;
    size_t start = 0;
    for (size_t i = 0; i <= s->n_text; i++) {
        if (i < s->n_text && s->text[i] != '\n') continue;
        size_t e = i;
        while (e > start && (s->text[e - 1] == '\r' || s->text[e - 1] == ' ')) e--;
        if (e > start) {
            s->lines[2 * k] = start;
            s->lines[2 * k + 1] = e - start;
            k++;
        }
        start = i + 1;
    }
    s->n_examples = k;
    if (k == 0) return err_set(err, err_size, "kvret: %s has no records", file);
    return 0;
}

/* One record of ordered_kv_records: a [key, value] pair of strings. */
static int kv_pair(const json_value *rec, const char **k, size_t *kl, const char **v, size_t *vl)
{
    if (json_len(rec) != 2 || rec->type != JSON_ARRAY) return -1;
    *k = json_str(json_at(rec, 0), kl);
    *v = json_str(json_at(rec, 1), vl);
    return (*k && *v) ? 0 : -1;
}

/* str.format over the template: {formatted_kv_records} (the records in
 * `order`, formatted as lost-in-the-middle's get_kv_retrieval_prompt does),
 * {key}, and the escapes {{ and }}. *recs_end = bytes up to the records'
 * end. Returns 0, or -1 for an unknown field. */
static int kv_format(const task_set *s, const json_value *recs, const int64_t *order, int64_t n, const char *key,
                     size_t key_len, sbuf *b, size_t *recs_end)
{
    *recs_end = 0;
    for (size_t t = 0; t < s->n_tmpl;) {
        const char *c = s->tmpl + t;
        size_t left = s->n_tmpl - t;
        if (left >= 2 && (!memcmp(c, "{{", 2) || !memcmp(c, "}}", 2))) {
            sb_add(b, c, 1);
            t += 2;
        } else if (left >= 22 && !memcmp(c, "{formatted_kv_records}", 22)) {
            for (int64_t r = 0; r < n; r++) {
                const char *k, *v;
                size_t kl, vl;
                kv_pair(json_at(recs, (size_t)order[r]), &k, &kl, &v, &vl);
                sb_adds(b, r == 0 ? "{\"" : " \"");
                sb_add(b, k, kl);
                sb_adds(b, "\": \"");
                sb_add(b, v, vl);
                sb_adds(b, r != n - 1 ? "\",\n" : "\"}");
            }
            *recs_end = b->n;
            t += 22;
        } else if (left >= 5 && !memcmp(c, "{key}", 5)) {
            sb_add(b, key, key_len);
            t += 5;
        } else if (*c == '{' || *c == '}') {
            return -1;
        } else {
            sb_add(b, c, 1);
            t++;
        }
    }
    return 0;
}

static int kvret_build(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    char jerr[200];
    json_doc *d = json_parse(s->text + s->lines[2 * i], s->lines[2 * i + 1], 8, jerr, sizeof jerr);
    if (!d) return err_set(err, err_size, "kvret: line %lld: %s", (long long)i + 1, jerr);
    const json_value *root = json_root(d);
    const json_value *recs = json_get(root, "ordered_kv_records");
    size_t key_len, val_len;
    const char *key = json_get_str(root, "key", &key_len);
    const char *val = json_get_str(root, "value", &val_len);
    int64_t n = (int64_t)json_len(recs), gold = -1;
    int rc = 0;
    int64_t *order = NULL;
    sbuf b = { 0 };
    if (!recs || recs->type != JSON_ARRAY || !key || !val || n < 1) {
        rc = err_set(err, err_size, "kvret: line %lld lacks \"ordered_kv_records\", \"key\" or \"value\"",
                     (long long)i + 1);
        goto done;
    }
    for (int64_t r = 0; r < n; r++) {
        const char *k, *v;
        size_t kl, vl;
        if (kv_pair(json_at(recs, (size_t)r), &k, &kl, &v, &vl)) {
            rc = err_set(err, err_size, "kvret: line %lld: record %lld is not a [key, value] pair of strings",
                         (long long)i + 1, (long long)r);
            goto done;
        }
        if (gold < 0 && kl == key_len && vl == val_len && !memcmp(k, key, kl) && !memcmp(v, val, vl)) gold = r;
    }
    if (gold < 0) {
        rc = err_set(err, err_size, "kvret: line %lld: the gold [key, value] is not among the records",
                     (long long)i + 1);
        goto done;
    }
    if (s->p.kvret_gold_index >= n) {
        rc = err_set(err, err_size, "kvret: gold index %lld is past the %lld records",
                     (long long)s->p.kvret_gold_index, (long long)n);
        goto done;
    }
    /* order[]: record indices with the gold one moved (list.pop + insert) */
    order = malloc((size_t)n * sizeof *order);
    if (!order) {
        rc = err_set(err, err_size, "kvret: out of memory");
        goto done;
    }
    int64_t at = s->p.kvret_gold_index >= 0 ? s->p.kvret_gold_index : gold;
    for (int64_t r = 0, src = 0; r < n; r++) {
        if (r == at) {
            order[r] = gold;
            continue;
        }
        if (src == gold) src++;
        order[r] = src++;
    }
    size_t recs_end;
    if (kv_format(s, recs, order, n, key, key_len, &b, &recs_end)) {
        rc = err_set(err, err_size, "kvret: unknown field in the prompt template");
        goto done;
    }
    if (sb_finish(&b, ex, err, err_size)) {
        b.s = NULL; /* sb_finish freed it */
        rc = -1;
        goto done;
    }
    b.s = NULL; /* now owned by ex */
    ex->n_context = recs_end;
    ex->gold_index = at;
    ex->id = dup_printf("kv%d-%lld", s->p.kvret_keys, (long long)i);
    if (!ex->id || add_answer(ex, val, val_len)) rc = err_set(err, err_size, "kvret: out of memory");
done:
    free(b.s);
    free(order);
    json_free(d);
    return rc;
}

/* ---- public entry points ------------------------------------------------ */

int task_open(task_set **out, task_kind kind, const task_params *params, char *err, size_t err_size)
{
    *out = NULL;
    if (kind < 0 || kind >= TASK_N_KINDS) return err_set(err, err_size, "tasks: unknown task kind %d", (int)kind);
    task_set *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, err_size, "tasks: out of memory");
    s->kind = kind;
    s->p = params ? *params : task_default_params();
    int rc;
    switch (kind) {
    case TASK_SQUAD: rc = squad_open(s, err, err_size); break;
    case TASK_TRIVIAQA:
        rc = list_open(s, "triviaqa", "data/qa/triviaqa/triviaqa_closedbook_sample_RAGE.json", err, err_size);
        break;
    case TASK_CNNDM:
        rc = list_open(s, "cnndm", "data/qa/cnn_dailymail/cnn_dailymail_test_first100.json", err, err_size);
        break;
    case TASK_WIKITEXT: rc = wikitext_open(s, err, err_size); break;
    case TASK_REPETITION: rc = repetition_open(s, err, err_size); break;
    case TASK_NIAH: rc = niah_open(s, err, err_size); break;
    case TASK_KVRET: rc = kvret_open(s, err, err_size); break;
    default: rc = -1;
    }
    if (rc) {
        task_close(s);
        return -1;
    }
    s->p.path = NULL; /* borrowed; not needed after loading */
    *out = s;
    return 0;
}

int task_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    example_init(ex);
    if (!s) return err_set(err, err_size, "tasks: no task set");
    if (i < 0 || i >= s->n_examples)
        return err_set(err, err_size, "%s: example %lld out of range [0, %lld)", task_kind_name(s->kind), (long long)i,
                       (long long)s->n_examples);
    int rc;
    switch (s->kind) {
    case TASK_SQUAD: rc = squad_build(s, i, ex, err, err_size); break;
    case TASK_TRIVIAQA: rc = triviaqa_build(s, i, ex, err, err_size); break;
    case TASK_CNNDM: rc = cnndm_build(s, i, ex, err, err_size); break;
    case TASK_WIKITEXT: rc = wikitext_build(s, i, ex, err, err_size); break;
    case TASK_REPETITION: rc = repetition_build(s, i, ex, err, err_size); break;
    case TASK_NIAH: {
        int depths = s->p.niah_depths;
        int64_t li = i / depths, di = i % depths;
        double depth = depths > 1 ? (double)di / (double)(depths - 1) : 0.0;
        return task_niah_build(s, depth, s->niah_lengths[li], ex, err, err_size);
    }
    case TASK_KVRET: rc = kvret_build(s, i, ex, err, err_size); break;
    default: rc = err_set(err, err_size, "tasks: unknown task kind");
    }
    if (rc) task_example_free(ex);
    return rc;
}
