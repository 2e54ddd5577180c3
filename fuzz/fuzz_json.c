/* fuzz_json.c - libFuzzer harness for the JSON reader and string writer
 * (util/json.h; scripts/fuzz.sh).
 *
 * Parses the input with a small depth cap and walks the whole tree through
 * the public accessors; every string found is written back with
 * json_write_str, whose output must itself parse as one JSON string. An
 * error message must be one line. The whole tree is then written back as
 * JSON (strings and keys by json_write_str, numbers with 17 significant
 * digits, enough to name every double) and parsed again: the second tree
 * must equal the first - types, numbers to the bit, strings and keys byte
 * for byte (embedded NULs included), member order - so the reader and the
 * writer agree on every value either can express.
 */
#include "util/json.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void check_string_roundtrip(const char *s, size_t n)
{
    char buf[2048];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    if (!f) return;
    json_write_str(f, s, n < 200 ? n : 200); /* 200 bytes escape to at most 1200 */
    long w = ftell(f);
    fclose(f);
    if (w <= 0 || (size_t)w >= sizeof buf) abort();
    char err[128];
    json_doc *d = json_parse(buf, (size_t)w, 4, err, sizeof err);
    if (!d || json_root(d)->type != JSON_STRING) abort(); /* the writer wrote invalid JSON */
    json_free(d);
}

static uint64_t walk(const json_value *v, int depth)
{
    if (!v || depth > 64) return 0;
    uint64_t acc = (uint64_t)v->type;
    switch (v->type) {
    case JSON_STRING: {
        size_t n = 0;
        const char *s = json_str(v, &n);
        if (s && n) acc += (uint8_t)s[0] + (uint8_t)s[n - 1];
        if (s) check_string_roundtrip(s, n);
        break;
    }
    case JSON_NUMBER:
        acc += v->u.number > 0;
        break;
    case JSON_ARRAY:
        for (size_t i = 0; i < v->n; i++) acc += walk(json_at(v, i), depth + 1);
        break;
    case JSON_OBJECT:
        for (size_t i = 0; i < v->n; i++) {
            const json_member *m = &v->u.members[i];
            acc += m->key_len ? (uint8_t)m->key[0] : 0;
            acc += walk(&m->value, depth + 1);
        }
        acc += json_get(v, "text") != NULL;
        break;
    default:
        break;
    }
    return acc;
}

/* v as JSON text. Numbers: %.17g names every finite double exactly, and
 * the parser refuses a literal that overflows, so none is infinite. */
static void write_tree(FILE *f, const json_value *v)
{
    switch (v->type) {
    case JSON_NULL: fputs("null", f); break;
    case JSON_BOOL: fputs(v->u.boolean ? "true" : "false", f); break;
    case JSON_NUMBER:
        if (!isfinite(v->u.number)) abort();
        fprintf(f, "%.17g", v->u.number);
        break;
    case JSON_STRING: json_write_str(f, v->u.str, v->n); break;
    case JSON_ARRAY:
        fputc('[', f);
        for (size_t i = 0; i < v->n; i++) {
            if (i) fputc(',', f);
            write_tree(f, &v->u.items[i]);
        }
        fputc(']', f);
        break;
    case JSON_OBJECT:
        fputc('{', f);
        for (size_t i = 0; i < v->n; i++) {
            const json_member *m = &v->u.members[i];
            if (i) fputc(',', f);
            json_write_str(f, m->key, m->key_len);
            fputc(':', f);
            write_tree(f, &m->value);
        }
        fputc('}', f);
        break;
    }
}

static int same_tree(const json_value *a, const json_value *b)
{
    if (a->type != b->type || a->n != b->n) return 0;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return !a->u.boolean == !b->u.boolean;
    case JSON_NUMBER: return memcmp(&a->u.number, &b->u.number, sizeof a->u.number) == 0;
    case JSON_STRING: return memcmp(a->u.str, b->u.str, a->n) == 0;
    case JSON_ARRAY:
        for (size_t i = 0; i < a->n; i++)
            if (!same_tree(&a->u.items[i], &b->u.items[i])) return 0;
        return 1;
    case JSON_OBJECT:
        for (size_t i = 0; i < a->n; i++) {
            const json_member *x = &a->u.members[i], *y = &b->u.members[i];
            if (x->key_len != y->key_len || memcmp(x->key, y->key, x->key_len) != 0) return 0;
            if (!same_tree(&x->value, &y->value)) return 0;
        }
        return 1;
    }
    return 0;
}

/* parse -> write -> parse gives the same tree */
static void check_tree_roundtrip(const json_value *root, int max_depth)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) abort();
    write_tree(f, root);
    if (fclose(f) != 0 || !buf) abort();
    char err[256];
    json_doc *d = json_parse(buf, n, max_depth, err, sizeof err);
    if (!d) {
        fprintf(stderr, "fuzz_json: the written tree does not parse: %s\n", err);
        abort();
    }
    if (!same_tree(root, json_root(d))) {
        fprintf(stderr, "fuzz_json: the tree changed on a round trip through %.*s\n", (int)(n < 400 ? n : 400), buf);
        abort();
    }
    json_free(d);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    json_doc *d = json_parse((const char *)data, size, 32, err, sizeof err);
    if (!d) {
        if (memchr(err, '\n', strnlen(err, sizeof err))) abort(); /* errors are one line */
        return 0;
    }
    sink += walk(json_root(d), 0);
    check_tree_roundtrip(json_root(d), 32);
    json_free(d);
    return 0;
}
