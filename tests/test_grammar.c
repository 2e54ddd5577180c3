/* test_grammar.c - GBNF parsing and errors, the matcher against strings
 * whose membership is known by hand, JSON Schema conversion, and
 * constrained generation with stories260K: every output parses (util/json,
 * not the grammar engine) and passes a schema validator written here;
 * greedy under a grammar that admits the free answer is the free answer. */
#include "sparq.h"
#include "core/grammar.h"
#include "util/json.h"
#include "test.h"

#include <stdint.h>

static int matches(const sparq_grammar *g, const char *s)
{
    gmatcher *m = gm_create(g);
    if (!m) return -1;
    int ok = gm_accept(m, (const uint8_t *)s, strlen(s)) == 0 && gm_complete(m);
    gm_free(m);
    return ok;
}

/* s is a prefix of some sentence (byte by byte, as tokens arrive) */
static int prefix_ok(const sparq_grammar *g, const char *s)
{
    gmatcher *m = gm_create(g);
    if (!m) return -1;
    int ok = 1;
    for (size_t i = 0; s[i] && ok; i++) ok = gm_accept(m, (const uint8_t *)s + i, 1) == 0;
    gm_free(m);
    return ok;
}

static void test_gbnf(void)
{
    char err[256];
    static const struct { const char *gbnf, *yes[6], *no[6]; } cases[] = {
        { "root ::= \"a\" [0-9]+ (\"x\" | \"yz\")?", { "a1", "a12x", "a0yz", NULL }, { "a", "ax", "a1y", "a1xx", "b1", NULL } },
        { "root ::= item (\",\" item)*\nitem ::= [a-c]{1,2} # comment\n", { "a", "ab,c", "cc,cc,a", NULL },
          { "", "abc", "a,", ",a", NULL } },
        { "root ::= [^\"\\\\]* \"!\"", { "!", "hi there!", NULL }, { "hi\"!", "no", NULL } },
        { "root ::= [α-ω]+ \".\"", { "αβω.", NULL }, { "a.", "α", NULL } },
        { "root ::= . .", { "ab", "éx", "€€", NULL }, { "a", "abc", NULL } },
        { "root ::= x{2} \"-\" x{0,3}\nx ::= \"ab\"", { "abab-", "abab-ababab", NULL }, { "ab-", "abab-abababab", NULL } },
        { "root ::= \"ab\"* | \"q\"", { "", "abab", "q", NULL }, { "a", "aba", "qq", NULL } },
        { "root ::= \"\\x41\\u00e9\\n\"", { "A\xc3\xa9\n", NULL }, { "A", NULL } },
        { "root ::= a |\n  b\na ::= \"1\"\nb ::= ( \"2\"\n | \"3\" )", { "1", "2", "3", NULL }, { "4", "12", NULL } },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sparq_grammar *g = sparq_grammar_parse(cases[k].gbnf, err, sizeof err);
        CHECK(g != NULL, "case %zu parses: %s", k, err);
        if (!g) continue;
        for (int i = 0; cases[k].yes[i]; i++)
            CHECK(matches(g, cases[k].yes[i]) == 1, "case %zu accepts '%s'", k, cases[k].yes[i]);
        for (int i = 0; cases[k].no[i]; i++)
            CHECK(matches(g, cases[k].no[i]) == 0, "case %zu refuses '%s'", k, cases[k].no[i]);
        sparq_grammar_free(g);
    }
    /* a partial UTF-8 character is a possible prefix only if a class can take it */
    sparq_grammar *g = sparq_grammar_parse("root ::= [α-ω]+", err, sizeof err);
    CHECK(g && prefix_ok(g, "\xce") == 1 && prefix_ok(g, "\xc3") == 0 && prefix_ok(g, "\xff") == 0,
          "UTF-8 lead bytes");
    sparq_grammar_free(g);
    /* only shortest forms: an overlong '}' (F0 80 81 BD) or a surrogate is not a character */
    g = sparq_grammar_parse("root ::= .*", err, sizeof err);
    CHECK(g && prefix_ok(g, "\xF0\x90\x80\x80") == 1 && prefix_ok(g, "\xF0\x80") == 0 &&
              prefix_ok(g, "\xE0\x80") == 0 && prefix_ok(g, "\xED\xA0") == 0 && prefix_ok(g, "\xC0\xBD") == 0 &&
              prefix_ok(g, "\xF4\x90") == 0 && matches(g, "\xE2\x82") == 0 && matches(g, "\xE2\x82\xAC") == 1,
          "UTF-8 validity");
    sparq_grammar_free(g);

    static const struct { const char *gbnf, *msg; } bad[] = {
        { "root ::= \"abc", "unterminated literal" },
        { "root ::= [a-", "unterminated character class" },
        { "root ::= foo", "undefined rule 'foo'" },
        { "start ::= \"a\"", "no rule named 'root'" },
        { "root ::= root \"a\" | \"b\"", "left-recursive" },
        { "root ::= x \"a\"\nx ::= \"\" | root", "left-recursive" },
        { "root ::= (\"a\"", "expected ')'" },
        { "root ::= \"a\" )", "unmatched ')'" },
        { "root ::= \"a\"{3,1}", "n < m" },
        { "root ::= *", "nothing before it" },
        { "root ::= \"a\"\nroot ::= \"b\"", "defined twice" },
        { "root = \"a\"", "expected '::='" },
        { "root ::= \"\\q\"", "unknown escape" },
        { "root ::= [z-a]", "upside down" },
        { "root ::= \"a\"{2000}", "too large" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        err[0] = 0;
        sparq_grammar *b = sparq_grammar_parse(bad[k].gbnf, err, sizeof err);
        CHECK(b == NULL && strstr(err, bad[k].msg) && strstr(err, "line "), "bad %zu: '%s' -> '%s'", k, bad[k].gbnf,
              err);
        sparq_grammar_free(b);
    }
}

/* ---- an independent validator for the schema subset ------------------ */

static int validate(const json_value *v, const json_value *s);

static int equal(const json_value *a, const json_value *b)
{
    if (a->type != b->type || (a->type != JSON_BOOL && a->type != JSON_NUMBER && a->n != b->n)) return 0;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return a->u.boolean == b->u.boolean;
    case JSON_NUMBER: return a->u.number == b->u.number;
    case JSON_STRING: return memcmp(a->u.str, b->u.str, a->n) == 0;
    case JSON_ARRAY:
        for (size_t i = 0; i < a->n; i++)
            if (!equal(&a->u.items[i], &b->u.items[i])) return 0;
        return 1;
    case JSON_OBJECT:
        for (size_t i = 0; i < a->n; i++) {
            const json_value *o = json_get(b, a->u.members[i].key);
            if (!o || !equal(&a->u.members[i].value, o)) return 0;
        }
        return 1;
    }
    return 0;
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static int type_ok(const json_value *v, const char *t)
{
    if (!strcmp(t, "string")) return v->type == JSON_STRING;
    if (!strcmp(t, "number")) return v->type == JSON_NUMBER;
    if (!strcmp(t, "integer")) return v->type == JSON_NUMBER && v->u.number == (double)(long long)v->u.number;
    if (!strcmp(t, "boolean")) return v->type == JSON_BOOL;
    if (!strcmp(t, "null")) return v->type == JSON_NULL;
    if (!strcmp(t, "array")) return v->type == JSON_ARRAY;
    if (!strcmp(t, "object")) return v->type == JSON_OBJECT;
    return 0;
}

static int validate(const json_value *v, const json_value *s)
{
    const json_value *x;
    if ((x = json_get(s, "const")) && !equal(v, x)) return 0;
    if ((x = json_get(s, "enum"))) {
        int any = 0;
        for (size_t i = 0; i < x->n; i++) any |= equal(v, &x->u.items[i]);
        if (!any) return 0;
    }
    if ((x = json_get(s, "anyOf"))) {
        int any = 0;
        for (size_t i = 0; i < x->n; i++) any |= validate(v, &x->u.items[i]);
        if (!any) return 0;
    }
    if ((x = json_get(s, "type"))) {
        if (x->type == JSON_STRING && !type_ok(v, x->u.str)) return 0;
        if (x->type == JSON_ARRAY) {
            int any = 0;
            for (size_t i = 0; i < x->n; i++) any |= type_ok(v, x->u.items[i].u.str);
            if (!any) return 0;
        }
    }
    if (v->type == JSON_STRING) {
        size_t n = utf8_chars(v->u.str, v->n);
        if ((x = json_get(s, "minLength")) && n < x->u.number) return 0;
        if ((x = json_get(s, "maxLength")) && n > x->u.number) return 0;
    }
    if (v->type == JSON_ARRAY) {
        if ((x = json_get(s, "minItems")) && v->n < x->u.number) return 0;
        if ((x = json_get(s, "maxItems")) && v->n > x->u.number) return 0;
        if ((x = json_get(s, "items")))
            for (size_t i = 0; i < v->n; i++)
                if (!validate(&v->u.items[i], x)) return 0;
    }
    if (v->type == JSON_OBJECT) {
        const json_value *props = json_get(s, "properties"), *req = json_get(s, "required"),
                         *addl = json_get(s, "additionalProperties");
        for (size_t i = 0; req && i < req->n; i++)
            if (!json_get(v, req->u.items[i].u.str)) return 0;
        for (size_t i = 0; i < v->n; i++) {
            const json_value *ps = props ? json_get(props, v->u.members[i].key) : NULL;
            if (ps && !validate(&v->u.members[i].value, ps)) return 0;
            if (!ps && addl && addl->type == JSON_BOOL && !addl->u.boolean) return 0;
            if (!ps && addl && addl->type == JSON_OBJECT && !validate(&v->u.members[i].value, addl)) return 0;
        }
        const json_member *dup;
        if (json_find_duplicate(v, &dup) != 0) return 0;
    }
    return 1;
}

static void test_schema_errors(void)
{
    char err[256];
    static const struct { const char *schema, *msg; } bad[] = {
        { "{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":3}}}", "'minimum'" },
        { "{\"$ref\":\"#/defs/x\"}", "'$ref'" },
        { "{\"type\":\"date\"}", "unsupported type 'date'" },
        { "{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}", "required property 'x'" },
        { "{\"type\":", "not valid JSON" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        err[0] = 0;
        sparq_grammar *g = sparq_grammar_from_json_schema(bad[k].schema, err, sizeof err);
        CHECK(!g && strstr(err, bad[k].msg), "schema %zu: '%s'", k, err);
        sparq_grammar_free(g);
    }
    /* the converter's output by itself: known sentences in and out */
    sparq_grammar *g = sparq_grammar_from_json_schema(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"enum\":[\"x\",2,null]},"
        "\"c\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":2}},\"required\":[\"b\"]}",
        err, sizeof err);
    CHECK(g != NULL, "schema: %s", err);
    if (g) {
        const char *yes[] = { "{\"b\":\"x\"}", "{\"a\":-12,\"b\":2}", "{ \"a\": 0, \"b\": null, \"c\": [true, false] }",
                              "{\"b\":2,\"c\":[]}", NULL };
        const char *no[] = { "{}", "{\"a\":1}", "{\"b\":3}", "{\"b\":\"x\",\"c\":[true,true,true]}",
                             "{\"b\":\"x\",\"a\":1}", "{\"a\":1.5,\"b\":2}", "{\"b\":\"x\",}", NULL };
        for (int i = 0; yes[i]; i++) CHECK(matches(g, yes[i]) == 1, "accepts %s", yes[i]);
        for (int i = 0; no[i]; i++) CHECK(matches(g, no[i]) == 0, "refuses %s", no[i]);
        sparq_grammar_free(g);
    }
}

/* ---- generation ------------------------------------------------------ */

static int generate(sparq_model *m, sparq_context *c, const char *prompt, sparq_sampler *smp, int max_tokens,
                    sparq_generation *g)
{
    const int V = sparq_model_n_vocab(m);
    int32_t ids[64];
    int n = sparq_tokenize(m, prompt, -1, 1, ids, 64);
    float *logits = malloc((size_t)V * sizeof *logits);
    sparq_context_reset(c);
    int rc = !logits || n < 1 || n > 64 || sparq_eval(c, ids, n, logits) ? -1 : 0;
    if (!rc) {
        sparq_generate_params p = sparq_generate_default_params();
        p.max_tokens = max_tokens;
        p.sampler = smp;
        rc = sparq_generate(c, logits, &p, g);
    }
    free(logits);
    return rc;
}

static void test_generation(const char *name)
{
    char path[1024], err[256];
    if (path_find(name, path, sizeof path)) {
        char why[256];
        snprintf(why, sizeof why, "%s not found on the model path (reference data)", name);
        test_skip(why);
        return;
    }
    sparq_model *m = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load: %s", err);
        return;
    }
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 1024;
    cp.n_threads = 1;
    sparq_context *c = NULL;
    CHECK(sparq_context_create(m, &cp, &c, err, sizeof err) == 0, "context: %s", err);
    if (!c) {
        sparq_model_free(m);
        return;
    }
    const int V = sparq_model_n_vocab(m);

    /* greedy under a grammar that admits the free answer is that answer */
    sparq_generation free_g, con_g;
    CHECK(generate(m, c, "Once upon a time", NULL, 24, &free_g) == 0, "free greedy");
    char *lit = malloc(free_g.n_text * 4 + 64);
    size_t L = 0;
    L += (size_t)sprintf(lit, "root ::= \"");
    for (size_t i = 0; i < free_g.n_text; i++) {
        unsigned char ch = (unsigned char)free_g.text[i];
        L += (size_t)(ch == '"' || ch == '\\' || ch < 0x20 ? sprintf(lit + L, "\\x%02X", ch) : sprintf(lit + L, "%c", ch));
    }
    sprintf(lit + L, "\" [a-z .,]*");
    const char *admit[] = { "root ::= .*", lit };
    for (int k = 0; k < 2; k++) {
        sparq_grammar *g = sparq_grammar_parse(admit[k], err, sizeof err);
        CHECK(g != NULL, "admitting grammar %d: %s", k, err);
        sparq_sampler_params sp = sparq_sampler_default_params();
        sp.temp = 0;
        sparq_sampler *smp = sparq_sampler_create(&sp, V);
        CHECK(smp && g && sparq_sampler_set_grammar(smp, m, g, err, sizeof err) == 0, "set grammar: %s", err);
        if (smp && g && generate(m, c, "Once upon a time", smp, 24, &con_g) == 0) {
            CHECK(con_g.n_tokens == free_g.n_tokens &&
                      !memcmp(con_g.tokens, free_g.tokens, (size_t)free_g.n_tokens * sizeof *con_g.tokens),
                  "grammar %d: greedy '%s' vs free '%s'", k, con_g.text, free_g.text);
            sparq_generation_free(&con_g);
        }
        sparq_sampler_free(smp);
        sparq_grammar_free(g);
    }
    free(lit);
    sparq_generation_free(&free_g);

    /* a grammar that excludes the free answer changes it, within itself */
    sparq_grammar *g = sparq_grammar_parse("root ::= \" \" [0-9]{3} \" cats\"", err, sizeof err);
    sparq_sampler_params sp = sparq_sampler_default_params();
    sp.temp = 0;
    sparq_sampler *smp = sparq_sampler_create(&sp, V);
    CHECK(g && smp && sparq_sampler_set_grammar(smp, m, g, err, sizeof err) == 0, "digits grammar");
    if (g && smp && generate(m, c, "Once upon a time", smp, 40, &con_g) == 0) {
        CHECK(con_g.stop == SPARQ_STOP_EOG && matches(g, con_g.text) == 1 && sparq_sampler_grammar_done(smp),
              "digits: '%s' stop %d", con_g.text, con_g.stop);
        sparq_generation_free(&con_g);
    }
    sparq_sampler_free(smp);
    sparq_grammar_free(g);

    /* schemas x seeds x temperatures: each output parses and validates */
    static const char *schemas[] = {
        "{\"type\":\"object\"}",
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
        "\"age\":{\"type\":\"integer\"},\"happy\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":[\"red\",\"green\",1.5]},"
        "\"n\":{\"type\":[\"number\",\"null\"]},\"k\":{\"const\":\"x\\\"y\"}},\"required\":[\"c\",\"k\"],"
        "\"additionalProperties\":false},\"minItems\":1,\"maxItems\":3}",
        "{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,"
        "\"maxLength\":5},\"maxItems\":4},\"inner\":{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":["
        "{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}},\"required\":[\"v\"]}},"
        "\"required\":[\"tags\",\"inner\"]}",
    };
    const float temps[] = { 0.0f, 0.7f, 1.5f };
    int n_done = 0, n_runs = 0;
    for (size_t si = 0; si < sizeof schemas / sizeof schemas[0]; si++) {
        g = sparq_grammar_from_json_schema(schemas[si], err, sizeof err);
        CHECK(g != NULL, "schema %zu: %s", si, err);
        json_doc *sd = json_parse(schemas[si], strlen(schemas[si]), 0, err, sizeof err);
        for (int ti = 0; g && sd && ti < 3; ti++)
            for (uint64_t seed = 1; seed <= (temps[ti] > 0 ? 4u : 1u); seed++) {
                sp = sparq_sampler_default_params();
                sp.temp = temps[ti];
                sp.seed = seed;
                smp = sparq_sampler_create(&sp, V);
                if (!smp || sparq_sampler_set_grammar(smp, m, g, err, sizeof err)) {
                    CHECK(0, "sampler: %s", err);
                    sparq_sampler_free(smp);
                    continue;
                }
                if (generate(m, c, "Once upon a time", smp, 600, &con_g) == 0) {
                    n_runs++;
                    /* a generation cut by max_tokens is a prefix the grammar still admits */
                    if (con_g.stop == SPARQ_STOP_EOG) {
                        n_done++;
                        json_doc *d = json_parse(con_g.text, con_g.n_text, 0, err, sizeof err);
                        CHECK(d && validate(json_root(d), json_root(sd)),
                              "schema %zu temp %g seed %llu: '%s' (%s)", si, (double)temps[ti],
                              (unsigned long long)seed, con_g.text, d ? "invalid" : err);
                        json_free(d);
                    } else {
                        CHECK(con_g.stop == SPARQ_STOP_MAX_TOKENS && prefix_ok(g, con_g.text) == 1,
                              "schema %zu: cut output outside the grammar: '%s'", si, con_g.text);
                    }
                    sparq_generation_free(&con_g);
                } else {
                    CHECK(0, "generate: %s", sparq_context_error(c));
                }
                sparq_sampler_free(smp);
            }
        json_free(sd);
        sparq_grammar_free(g);
    }
    /* the bounded schemas (all but the first) always end within 600 tokens */
    CHECK(n_done >= n_runs - 9 && n_done > 0, "%d of %d generations ended", n_done, n_runs);
    fprintf(stderr, "%s: constrained generations: %d of %d complete\n", name, n_done, n_runs);
    sparq_context_free(c);
    sparq_model_free(m);
}

int main(void)
{
    test_gbnf();
    test_schema_errors();
    test_generation("stories260K.gguf");
    test_generation("tiny-d64.gguf"); /* another vocabulary, real head geometry */
    return test_summary("test_grammar");
}
