/* task_kvret.c - lost-in-the-middle key-value retrieval: find the value of
 * a key among 75 or 140 JSON records (tasks.h). */
#include "util/err.h"
#include "eval/metrics.h"
#include "eval/task_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* task_set.priv: the prompt template and a line index over the records. */
typedef struct {
    char *tmpl;
    size_t n_tmpl;
    size_t *lines;              /* [n_lines][2] offset, length in s->text */
} kvret_data;

static void kvret_free(void *priv)
{
    kvret_data *K = priv;
    free(K->tmpl);
    free(K->lines);
    free(K);
}

static int kvret_open(task_set *s, char *err, size_t err_size)
{
    if (s->p.kvret_keys != 75 && s->p.kvret_keys != 140)
        return err_set(err, err_size, "kvret: kvret_keys must be 75 or 140, not %d", s->p.kvret_keys);
    char path[TASK_PATH_MAX], name[128];
    const char *file = s->p.path;
    if (!file) {
        snprintf(name, sizeof name, "data/qa/lost-in-the-middle/kv-retrieval-%d_keys.jsonl.gz", s->p.kvret_keys);
        if (task_find_data("kvret", name, path, sizeof path, err, err_size)) return -1;
        file = path;
    }
    if (task_read_gz("kvret", file, &s->text, &s->n_text, err, err_size)) return -1;
    if (task_find_data("kvret", "data/qa/lost-in-the-middle/kv_retrieval.prompt", path, sizeof path, err, err_size))
        return -1;
    kvret_data *K = calloc(1, sizeof *K);
    if (!K) return err_set(err, err_size, "kvret: out of memory");
    s->priv = K;
    if (task_read_file("kvret", path, &K->tmpl, &K->n_tmpl, err, err_size)) return -1;
    while (K->n_tmpl > 0 && K->tmpl[K->n_tmpl - 1] == '\n') K->tmpl[--K->n_tmpl] = 0; /* rstrip("\n") */
    int64_t n = 0;
    for (size_t i = 0; i < s->n_text; i++) n += s->text[i] == '\n';
    K->lines = malloc((size_t)(n + 1) * 2 * sizeof *K->lines);
    if (!K->lines) return err_set(err, err_size, "kvret: out of memory");
    int64_t k = 0;
    size_t start = 0;
    for (size_t i = 0; i <= s->n_text; i++) {
        if (i < s->n_text && s->text[i] != '\n') continue;
        size_t e = i;
        while (e > start && (s->text[e - 1] == '\r' || s->text[e - 1] == ' ')) e--;
        if (e > start) {
            K->lines[2 * k] = start;
            K->lines[2 * k + 1] = e - start;
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
static int kv_format(const kvret_data *K, const json_value *recs, const int64_t *order, int64_t n, const char *key,
                     size_t key_len, sbuf *b, size_t *recs_end)
{
    *recs_end = 0;
    for (size_t t = 0; t < K->n_tmpl;) {
        const char *c = K->tmpl + t;
        size_t left = K->n_tmpl - t;
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

static int kvret_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    const kvret_data *K = s->priv;
    char jerr[200];
    json_doc *d = json_parse(s->text + K->lines[2 * i], K->lines[2 * i + 1], 8, jerr, sizeof jerr);
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
    if (kv_format(K, recs, order, n, key, key_len, &b, &recs_end)) {
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
    ex->id = task_dup_printf("kv%d-%lld", s->p.kvret_keys, (long long)i);
    if (!ex->id || task_add_answer(ex, val, val_len)) rc = err_set(err, err_size, "kvret: out of memory");
done:
    free(b.s);
    free(order);
    json_free(d);
    return rc;
}

/* The answer tokens + kvret_spare_tokens. */
static int64_t kvret_gen_tokens(const eval_task_params *p, int64_t longest)
{
    return p->kvret_spare_tokens + longest;
}

/* lost-in-the-middle's rule: the value appears in the output. */
static int kvret_score(const task_example *ex, const char *out, size_t n_out, double *value, char *err,
                       size_t err_size)
{
    (void)n_out;
    (void)err;
    (void)err_size;
    *value = metrics_contains_ci(out, ex->answers[0]);
    return 0;
}

static const task_option kvret_options[] = {
    { "--kvret-keys", TASK_OPT_INT, offsetof(task_params, kvret_keys), 1, "75|140", "key-value pairs (default 75)" },
    { "--kvret-gold", TASK_OPT_I64, offsetof(task_params, kvret_gold_index), 0, "I",
      "move the gold pair to position I (default: where the data has it)" },
    { 0 },
};

const task_def task_def_kvret = {
    .name = "kvret",
    .summary = "lost-in-the-middle key-value retrieval (75 or 140 keys); accuracy",
    .metric = "accuracy",
    .run = TASK_RUN_GENERATE,
    .stream = 6,
    .options = kvret_options,
    .open = kvret_open,
    .get = kvret_get,
    .free_priv = kvret_free,
    .gen_tokens = kvret_gen_tokens,
    .score = kvret_score,
};
