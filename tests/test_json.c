/* test_json.c - the JSON reader on valid, escaped and hostile input, and
 * the string writer (escaping, UTF-8 repair, round trip through the reader).
 * Every parse gets an exact-size heap copy without a terminating NUL, so
 * the sanitizer run catches any read past the end. */
#include "util/json.h"
#include "test.h"

#include <stdint.h>

static json_doc *parse_n(const char *s, size_t n, int max_depth, char *err, size_t err_size)
{
    char *copy = malloc(n ? n : 1);
    if (!copy) return NULL;
    memcpy(copy, s, n);
    json_doc *d = json_parse(copy, n, max_depth, err, err_size);
    free(copy);
    return d;
}

static json_doc *parse(const char *s)
{
    char err[256];
    return parse_n(s, strlen(s), 0, err, sizeof err);
}

static int rejects(const char *s, size_t n)
{
    char err[256];
    err[0] = 0;
    json_doc *d = parse_n(s, n, 0, err, sizeof err);
    int ok = d == NULL && strncmp(err, "json: ", 6) == 0;
    json_free(d);
    return ok;
}

static void test_valid(void)
{
    json_doc *d = parse(" {\"a\": [1, -2.5e3, true, false, null, \"x\"], \"b\": {\"c\": \"d\"}, \"\": 0,"
                        " \"a\": \"second\"} \n");
    CHECK(d != NULL, "valid document rejected");
    if (!d) return;
    const json_value *r = json_root(d);
    CHECK(r->type == JSON_OBJECT && json_len(r) == 4, "root: type %d len %zu", r->type, json_len(r));
    const json_value *a = json_get(r, "a");
    CHECK(a && a->type == JSON_ARRAY && json_len(a) == 6, "a is the first of the duplicate keys");
    CHECK(json_at(a, 0)->type == JSON_NUMBER && json_at(a, 0)->u.number == 1.0, "a[0] = 1");
    CHECK(json_at(a, 1)->u.number == -2500.0, "a[1] = %g", json_at(a, 1)->u.number);
    CHECK(json_at(a, 2)->type == JSON_BOOL && json_at(a, 2)->u.boolean == 1, "a[2] = true");
    CHECK(json_at(a, 3)->type == JSON_BOOL && json_at(a, 3)->u.boolean == 0, "a[3] = false");
    CHECK(json_at(a, 4)->type == JSON_NULL, "a[4] = null");
    size_t len;
    CHECK(!strcmp(json_str(json_at(a, 5), &len), "x") && len == 1, "a[5] = \"x\"");
    CHECK(json_at(a, 6) == NULL, "out of range index gives NULL");
    CHECK(!strcmp(json_get_str(json_get(r, "b"), "c", NULL), "d"), "b.c = d");
    CHECK(json_get(r, "")->u.number == 0.0, "empty key");
    CHECK(json_get(r, "zz") == NULL, "absent key gives NULL");
    CHECK(json_get(a, "a") == NULL && json_at(r, 0) == NULL && json_str(r, NULL) == NULL,
          "accessors on the wrong type give NULL");
    CHECK(r->u.members[3].value.type == JSON_STRING, "members keep document order");
    json_free(d);

    /* numbers: the grammar's corners and a long one (heap copy path) */
    const char *nums[] = { "0", "-0", "1E+2", "1e-2", "0.5", "123456789012345678901234567890",
                           "1.0000000000000000000000000000000000000000000000000000000000000000000001" };
    const double want[] = { 0, -0.0, 100, 0.01, 0.5, 1.2345678901234568e29, 1.0 };
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        d = parse(nums[i]);
        CHECK(d && json_root(d)->type == JSON_NUMBER && json_root(d)->u.number == want[i], "number %s", nums[i]);
        json_free(d);
    }
    d = parse("1e-400"); /* underflow to 0 is not an error */
    CHECK(d && json_root(d)->u.number == 0.0, "1e-400 underflows to 0");
    json_free(d);
    d = parse("[]");
    CHECK(d && json_root(d)->type == JSON_ARRAY && json_len(json_root(d)) == 0, "empty array");
    json_free(d);
    d = parse("\xEF\xBB\xBF{}");
    CHECK(d && json_root(d)->type == JSON_OBJECT && json_len(json_root(d)) == 0, "BOM then empty object");
    json_free(d);
}

static void test_escapes(void)
{
    struct { const char *json, *want; size_t n; } cases[] = {
        { "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t", 8 },
        { "\"\\u0041\\u00e9\\u20AC\"", "A\xC3\xA9\xE2\x82\xAC", 6 },            /* 1, 2, 3 byte UTF-8 */
        { "\"\\uD83D\\uDE00\"", "\xF0\x9F\x98\x80", 4 },                          /* surrogate pair */
        { "\"\\uDBFF\\uDFFF\"", "\xF4\x8F\xBF\xBF", 4 },                          /* U+10FFFF */
        { "\"a\\u0000b\"", "a\0b", 3 },                                           /* embedded NUL */
        { "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"", "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14 },
        { "\"\"", "", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_doc *d = parse(cases[i].json);
        size_t len = 0;
        const char *s = d ? json_str(json_root(d), &len) : NULL;
        CHECK(s && len == cases[i].n && !memcmp(s, cases[i].want, len) && s[len] == 0, "escape case %zu: %s", i,
              cases[i].json);
        json_free(d);
    }
    json_doc *d = parse("{\"k\\u00e9y\": 1}");
    CHECK(d && json_get(json_root(d), "k\xC3\xA9y") != NULL, "escaped key is unescaped");
    json_free(d);
}

static void test_malformed(void)
{
    const char *bad[] = {
        "", " ", "[", "]", "{", "}", "[1,]", "[,1]", "{\"a\":1,}", "{a:1}", "{\"a\" 1}", "{\"a\":}", "{1:2}",
        "01", "-01", "1.", ".5", "-", "1e", "1e+", "+1", "[1 2]", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\u12G4\"",
        "\"\\uD800\"", "\"\\uDC00\"", "\"\\uD800\\u0041\"", "\"\\uD800x\"", "\"a\x01b\"", "\"\ttab\"", "tru", "nul",
        "falsey", "[1] x", "NaN", "Infinity", "-Infinity", "1e999", "-1e999", "\"\\", "\"\\\"", "{\"a\":1 \"b\":2}",
        "[1]]", "// c\n1", "'single'", "[\"a\"\"b\"]",
        "\"\xFF\"", "\"\xC0\xAF\"", "\"\xE0\x80\xAF\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"\xC3\"",
        "\"\xE2\x82\"", "\"\x80\"",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(rejects(bad[i], strlen(bad[i])), "malformed input %zu accepted: %s", i, bad[i]);
    CHECK(rejects("[1\0]", 4), "NUL byte outside a string");
    CHECK(rejects("\"a\0b\"", 5), "raw NUL inside a string");

    /* the message names the byte offset */
    char err[256];
    json_doc *d = parse_n("[1, 2, x]", 9, 0, err, sizeof err);
    CHECK(!d && strstr(err, "byte 7") != NULL, "error names the offset: %s", err);

    /* every proper prefix of a valid document is rejected */
    const char *doc = "{\"title\": \"Caf\\u00e9 \\uD83D\\uDE00\", \"n\": [1, -2.5e+3, true, null], \"o\": {}}";
    size_t n = strlen(doc);
    d = parse(doc);
    CHECK(d != NULL, "the base document parses");
    json_free(d);
    int all = 1;
    for (size_t k = 0; k < n; k++)
        if (!rejects(doc, k)) { all = 0; fprintf(stderr, "prefix of %zu bytes accepted\n", k); }
    CHECK(all, "truncated documents rejected");
}

static void test_depth(void)
{
    size_t n = 100000;
    char *s = malloc(2 * n);
    if (!s) { CHECK(0, "oom"); return; }
    for (size_t i = 0; i < n; i++) { s[i] = '['; s[2 * n - 1 - i] = ']'; }
    char err[256];
    /* JSON_DEFAULT_MAX_DEPTH levels are fine, one more is not */
    size_t lim = JSON_DEFAULT_MAX_DEPTH;
    json_doc *d = parse_n(s + n - lim, 2 * lim, 0, err, sizeof err);
    CHECK(d != NULL, "%zu levels rejected: %s", lim, err);
    json_free(d);
    d = parse_n(s + n - lim - 1, 2 * lim + 2, 0, err, sizeof err);
    CHECK(d == NULL && strstr(err, "nesting") != NULL, "%zu levels accepted", lim + 1);
    json_free(d);
    d = parse_n(s, 2 * n, 0, err, sizeof err);
    CHECK(d == NULL, "100000 levels accepted");
    json_free(d);
    d = parse_n(s, 2 * n, 1 << 30, err, sizeof err); /* a huge cap is clamped, not trusted */
    CHECK(d == NULL && strstr(err, "nesting deeper than 4096"), "huge max_depth clamped: %s", err);
    json_free(d);
    d = parse_n(s, n, 0, err, sizeof err); /* only openers */
    CHECK(d == NULL, "100000 unclosed brackets accepted");
    json_free(d);
    free(s);
    d = parse_n("[[[1]]]", 7, 3, err, sizeof err);
    CHECK(d != NULL, "3 levels at max_depth 3: %s", err);
    json_free(d);
    d = parse_n("[{\"a\":[[1]]}]", 13, 3, err, sizeof err);
    CHECK(d == NULL, "objects count toward the depth too");
    json_free(d);
}

/* Random byte mutations of a valid document: the parser must either reject
 * or return a consistent tree, never crash (checked under the sanitizers). */
static void test_mutations(void)
{
    const char *doc = "{\"data\": [{\"title\": \"Super_Bowl_50\", \"paragraphs\": [{\"context\": \"Caf\\u00e9 "
                      "\\\"x\\\"\", \"qas\": [{\"answers\": [{\"answer_start\": 177, \"text\": \"Denver\"}], "
                      "\"id\": \"56be\"}]}]}], \"version\": \"1.1\"}";
    size_t n = strlen(doc);
    char *buf = malloc(n);
    if (!buf) return;
    uint64_t x = 12345;
    int rounds = test_quick() ? 2000 : 20000, ok = 0, rejected = 0;
    for (int r = 0; r < rounds; r++) {
        memcpy(buf, doc, n);
        int edits = 1 + (int)(x % 3);
        for (int e = 0; e < edits; e++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(x >> 33) % n;
            static const char pool[] = "{}[]\",:\\u0e-+.tfn \x01\x80\xC3\xED\xFF";
            buf[at] = pool[(x >> 20) % (sizeof pool - 1)];
        }
        size_t len = n - (size_t)((x >> 40) % 4); /* sometimes truncated too */
        char err[128];
        json_doc *d = parse_n(buf, len, 0, err, sizeof err);
        if (d) {
            ok++;
            /* walk the top level: it must be self-consistent */
            const json_value *root = json_root(d);
            for (size_t i = 0; i < json_len(root); i++)
                if (root->type == JSON_OBJECT) (void)strlen(root->u.members[i].key);
        } else {
            rejected++;
        }
        json_free(d);
    }
    CHECK(ok + rejected == rounds && rejected > 0, "mutations: %d parsed, %d rejected", ok, rejected);
    free(buf);
}

static char *write_to_string(const char *s, size_t n, size_t *out_len)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    json_write_str(f, s, n);
    fclose(f);
    *out_len = len;
    return buf;
}

static void test_writer(void)
{
    size_t len;
    char *w = write_to_string("a\"b\\c\n\t\x01\x1f/\x7f", 11, &len);
    const char *want = "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f/\x7f\"";
    CHECK(w && !strcmp(w, want), "escaped: %s", w ? w : "(null)");
    free(w);
    w = write_to_string("caf\xC3\xA9 \xF0\x9F\x98\x80", 10, &len);
    CHECK(w && !strcmp(w, "\"caf\xC3\xA9 \xF0\x9F\x98\x80\""), "valid UTF-8 passes through: %s", w ? w : "");
    free(w);
    /* a cut multi-byte character, a lone continuation byte and 0xFF */
    w = write_to_string("ab\xE2\x82", 4, &len);
    CHECK(w && !strcmp(w, "\"ab\\ufffd\\ufffd\""), "truncated UTF-8 repaired: %s", w ? w : "");
    free(w);
    w = write_to_string("\x80x\xFF", 3, &len);
    CHECK(w && !strcmp(w, "\"\\ufffdx\\ufffd\""), "invalid bytes repaired: %s", w ? w : "");
    free(w);
    w = write_to_string("a\0b", 3, &len);
    CHECK(w && !strcmp(w, "\"a\\u0000b\""), "NUL escaped: %s", w ? w : "");
    free(w);

    /* round trip: every byte value 1..127 plus multi-byte text */
    char src[200];
    size_t n = 0;
    for (int c = 1; c < 128; c++) src[n++] = (char)c;
    memcpy(src + n, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 9);
    n += 9;
    w = write_to_string(src, n, &len);
    json_doc *d = w ? parse_n(w, len, 0, NULL, 0) : NULL;
    size_t back_len = 0;
    const char *back = d ? json_str(json_root(d), &back_len) : NULL;
    CHECK(back && back_len == n && !memcmp(back, src, n), "writer output parses back to the input");
    json_free(d);
    free(w);
}

/* json_find_duplicate: nested objects and arrays, keys equal byte for
 * byte only (\u0000 included), small objects and large (sorted) ones. */
static void test_duplicates(void)
{
    static const struct { const char *text, *dup; } cases[] = {
        { "{\"a\":1,\"b\":2}", NULL },
        { "{\"a\":1,\"a\":2}", "a" },
        { "[1,{\"x\":[{\"k\":1,\"K\":2}]},{\"y\":{\"k\":1,\"k\":2}}]", "k" },
        { "{\"a\\u0000b\":1,\"a\":2,\"a\\u0000c\":3}", NULL },
        { "{\"a\\u0000b\":1,\"a\\u0000b\":2}", "a" },
        { "{\"\\u00e9\":1,\"\xc3\xa9\":2}", "\xc3\xa9" }, /* an escape and the raw bytes: one key */
        { "\"top\"", NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_doc *d = parse(cases[i].text);
        CHECK(d != NULL, "case %zu did not parse", i);
        if (!d) continue;
        const json_member *m = NULL;
        const int rc = json_find_duplicate(json_root(d), &m);
        CHECK(rc == (cases[i].dup != NULL) && (!cases[i].dup || (m && !strcmp(m->key, cases[i].dup))),
              "case %zu: %d, '%s'", i, rc, m ? m->key : "(none)");
        json_free(d);
    }
    /* 2000 distinct keys, then the same with one repeated far apart */
    char *buf = malloc(64 * 2001);
    CHECK(buf != NULL, "out of memory");
    if (!buf) return;
    for (int rep = 0; rep < 2; rep++) {
        int n = sprintf(buf, "{");
        for (int i = 0; i < 2000; i++) n += sprintf(buf + n, "%s\"k%d\":%d", i ? "," : "", rep && i == 1999 ? 3 : i, i);
        sprintf(buf + n, "}");
        json_doc *d = parse(buf);
        const json_member *m = NULL;
        const int rc = d ? json_find_duplicate(json_root(d), &m) : -2;
        CHECK(rc == rep && (!rep || (m && !strcmp(m->key, "k3") && m->value.u.number == 1999)),
              "2000 keys, repeat %d: %d '%s'", rep, rc, m ? m->key : "(none)");
        json_free(d);
    }
    free(buf);
}

int main(void)
{
    test_valid();
    test_duplicates();
    test_escapes();
    test_malformed();
    test_depth();
    test_mutations();
    test_writer();
    return test_summary("test_json");
}
