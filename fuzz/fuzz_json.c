/* fuzz_json.c - libFuzzer harness for the JSON reader and string writer
 * (util/json.h; scripts/fuzz.sh).
 *
 * Parses the input with a small depth cap and walks the whole tree through
 * the public accessors; every string found is written back with
 * json_write_str, whose output must itself parse as one JSON string. An
 * error message must be one line.
 */
#include "util/json.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    json_doc *d = json_parse((const char *)data, size, 32, err, sizeof err);
    if (!d) {
        if (memchr(err, '\n', strnlen(err, sizeof err))) abort(); /* errors are one line */
        return 0;
    }
    sink += walk(json_root(d), 0);
    json_free(d);
    return 0;
}
