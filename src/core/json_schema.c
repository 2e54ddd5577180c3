/* json_schema.c - a JSON Schema to GBNF (grammar.h), for structured
 * output. The subset: type (one or a list of string, number, integer,
 * boolean, null, object, array), properties / required /
 * additionalProperties, items / minItems / maxItems, minLength /
 * maxLength, enum, const, anyOf / oneOf (oneOf as anyOf: exclusivity is not
 * enforced), nested to any depth; annotations (title, description,
 * default, examples, $schema, $id, $comment) are ignored. Any other
 * keyword is refused by name, so a request never silently gets output its
 * schema does not describe.
 *
 * Objects list their properties in the schema's order, each optional one
 * may be left out; no other property appears. Whitespace between tokens is
 * bounded (a model cannot spin on blanks forever), and so are numbers. */
#include "core/grammar.h"
#include "util/err.h"
#include "util/json.h"
#include "util/textbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SCHEMA_RULES = 100000, MAX_BOUND = 1024 };

typedef struct {
    text_buf out;
    int n_rules;
    int failed;
    char *err;
    size_t err_size;
} conv;

static int cfail(conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfail(conv *c, const char *fmt, ...)
{
    if (!c->failed) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        for (char *q = msg; *q; q++) /* names from the schema: keep the message one line */
            if ((unsigned char)*q < 0x20) *q = '?';
        err_set(c->err, c->err_size, "json_schema: %s", msg);
    }
    c->failed = 1;
    return -1;
}

static int emit(conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int emit(conv *c, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return cfail(c, "formatting failed");
    if ((size_t)n < sizeof small) return text_append(&c->out, small, (size_t)n) ? cfail(c, "out of memory") : 0;
    char *big = malloc((size_t)n + 1);
    if (!big) return cfail(c, "out of memory");
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = text_append(&c->out, big, (size_t)n) ? cfail(c, "out of memory") : 0;
    free(big);
    return rc;
}

/* s[0..n) as the body of a GBNF "literal" (its quotes excluded). */
static int emit_lit_bytes(conv *c, const char *s, size_t n)
{
    for (size_t i = 0; i < n && !c->failed; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') emit(c, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7F) emit(c, "\\x%02X", ch);
        else text_append(&c->out, (const char *)&s[i], 1) ? cfail(c, "out of memory") : 0;
    }
    return c->failed ? -1 : 0;
}

/* The compact JSON text of v, into t (for enum and const). */
static int json_text(const json_value *v, text_buf *t, int depth)
{
    char num[64];
    if (depth > JSON_MAX_DEPTH) return -1;
    switch (v->type) {
    case JSON_NULL: return text_append(t, "null", 4);
    case JSON_BOOL: return v->u.boolean ? text_append(t, "true", 4) : text_append(t, "false", 5);
    case JSON_NUMBER: {
        int n = snprintf(num, sizeof num, "%.17g", v->u.number);
        /* the shortest form that reads back the same: 0.1 not 0.10000000000000001 */
        for (int p = 1; p <= 17; p++) {
            char b[64];
            int m = snprintf(b, sizeof b, "%.*g", p, v->u.number);
            if (strtod(b, NULL) == v->u.number) {
                memcpy(num, b, (size_t)m + 1);
                n = m;
                break;
            }
        }
        return text_append(t, num, (size_t)n);
    }
    case JSON_STRING: {
        if (text_append(t, "\"", 1)) return -1;
        for (size_t i = 0; i < v->n; i++) {
            unsigned char ch = (unsigned char)v->u.str[i];
            int rc;
            if (ch == '"' || ch == '\\') {
                char e[2] = { '\\', (char)ch };
                rc = text_append(t, e, 2);
            } else if (ch == '\n') rc = text_append(t, "\\n", 2);
            else if (ch == '\t') rc = text_append(t, "\\t", 2);
            else if (ch == '\r') rc = text_append(t, "\\r", 2);
            else if (ch < 0x20) {
                snprintf(num, sizeof num, "\\u%04x", ch);
                rc = text_append(t, num, 6);
            } else rc = text_append(t, (const char *)&v->u.str[i], 1);
            if (rc) return -1;
        }
        return text_append(t, "\"", 1);
    }
    case JSON_ARRAY:
        if (text_append(t, "[", 1)) return -1;
        for (size_t i = 0; i < v->n; i++)
            if ((i && text_append(t, ",", 1)) || json_text(&v->u.items[i], t, depth + 1)) return -1;
        return text_append(t, "]", 1);
    case JSON_OBJECT:
        if (text_append(t, "{", 1)) return -1;
        for (size_t i = 0; i < v->n; i++) {
            json_value k = { .type = JSON_STRING, .n = v->u.members[i].key_len };
            k.u.str = v->u.members[i].key;
            if ((i && text_append(t, ",", 1)) || json_text(&k, t, depth + 1) || text_append(t, ":", 1) ||
                json_text(&v->u.members[i].value, t, depth + 1))
                return -1;
        }
        return text_append(t, "}", 1);
    }
    return -1;
}

/* A GBNF literal matching exactly the JSON text of v. */
static int emit_json_lit(conv *c, const json_value *v)
{
    text_buf t = { 0 };
    if (json_text(v, &t, 0)) {
        free(t.data);
        return cfail(c, "out of memory");
    }
    emit(c, "\"");
    emit_lit_bytes(c, t.data, t.len);
    free(t.data);
    return emit(c, "\"");
}

static int new_rule(conv *c)
{
    if (c->n_rules >= MAX_SCHEMA_RULES) return cfail(c, "schema too large");
    return c->n_rules++;
}

static const char *const known[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "enum", "const", "anyOf", "oneOf", "title", "description", "default", "examples", "$schema",
    "$id", "$comment", NULL,
};

static int get_bound(conv *c, const json_value *s, const char *key, long *out)
{
    const json_value *v = json_get(s, key);
    if (!v) return 0;
    if (v->type != JSON_NUMBER || v->u.number < 0 || v->u.number > MAX_BOUND || v->u.number != (long)v->u.number)
        return cfail(c, "'%s' must be an integer in [0, %d]", key, MAX_BOUND);
    *out = (long)v->u.number;
    return 0;
}

/* "{m,n}" or "*" for a repetition of at least lo, at most hi (-1: no limit). */
static void rep(char *buf, size_t n, long lo, long hi)
{
    if (lo == 0 && hi < 0) snprintf(buf, n, "*");
    else if (hi < 0) snprintf(buf, n, "{%ld,}", lo);
    else snprintf(buf, n, "{%ld,%ld}", lo, hi);
}

static int gen(conv *c, const json_value *s, int depth);

/* The rule for a value of one JSON type (t) under schema s. */
static int gen_type(conv *c, const json_value *s, const char *t, size_t tn, int depth)
{
    char r[48];
    if (tn == 6 && memcmp(t, "string", 6) == 0) {
        long lo = 0, hi = -1;
        if (get_bound(c, s, "minLength", &lo) || get_bound(c, s, "maxLength", &hi)) return -1;
        if (hi >= 0 && hi < lo) return cfail(c, "maxLength < minLength");
        int id = new_rule(c);
        if (id < 0) return -1;
        rep(r, sizeof r, lo, hi);
        emit(c, "r%d ::= \"\\\"\" jchar%s \"\\\"\" ws\n", id, r);
        return c->failed ? -1 : id;
    }
    const char *fixed = NULL;
    if (tn == 6 && memcmp(t, "number", 6) == 0) fixed = "jnumber";
    else if (tn == 7 && memcmp(t, "integer", 7) == 0) fixed = "jinteger";
    else if (tn == 7 && memcmp(t, "boolean", 7) == 0) fixed = "jboolean";
    else if (tn == 4 && memcmp(t, "null", 4) == 0) fixed = "jnull";
    if (fixed) {
        int id = new_rule(c);
        if (id < 0) return -1;
        emit(c, "r%d ::= %s\n", id, fixed);
        return c->failed ? -1 : id;
    }
    if (tn == 5 && memcmp(t, "array", 5) == 0) {
        long lo = 0, hi = -1;
        if (get_bound(c, s, "minItems", &lo) || get_bound(c, s, "maxItems", &hi)) return -1;
        if (hi >= 0 && hi < lo) return cfail(c, "maxItems < minItems");
        const json_value *items = json_get(s, "items");
        int item = items ? gen(c, items, depth + 1) : -1;
        if (items && item < 0) return -1;
        char ir[24];
        if (item >= 0) snprintf(ir, sizeof ir, "r%d", item);
        else snprintf(ir, sizeof ir, "jvalue");
        int id = new_rule(c);
        if (id < 0) return -1;
        if (hi == 0) emit(c, "r%d ::= \"[\" ws \"]\" ws\n", id);
        else {
            rep(r, sizeof r, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
            emit(c, "r%d ::= \"[\" ws (%s (\",\" ws %s)%s)%s \"]\" ws\n", id, ir, ir, r, lo > 0 ? "" : "?");
        }
        return c->failed ? -1 : id;
    }
    if (tn == 6 && memcmp(t, "object", 6) == 0) {
        const json_value *props = json_get(s, "properties"), *req = json_get(s, "required"),
                         *addl = json_get(s, "additionalProperties");
        if (props && props->type != JSON_OBJECT) return cfail(c, "'properties' must be an object");
        if (req && req->type != JSON_ARRAY) return cfail(c, "'required' must be an array");
        if (addl && addl->type != JSON_BOOL && addl->type != JSON_OBJECT)
            return cfail(c, "'additionalProperties' must be a boolean or a schema");
        for (size_t i = 0; req && i < req->n; i++) {
            const json_value *q = &req->u.items[i];
            if (q->type != JSON_STRING) return cfail(c, "'required' must list strings");
            if (!props || !json_get(props, q->u.str))
                return cfail(c, "required property '%.60s' is not in 'properties'", q->u.str);
        }
        if (!props || props->n == 0) {
            if (addl && addl->type == JSON_BOOL && !addl->u.boolean) {
                int id = new_rule(c);
                if (id < 0) return -1;
                emit(c, "r%d ::= \"{\" ws \"}\" ws\n", id);
                return c->failed ? -1 : id;
            }
            int val = addl && addl->type == JSON_OBJECT ? gen(c, addl, depth + 1) : -1;
            if (addl && addl->type == JSON_OBJECT && val < 0) return -1;
            char vr[24];
            if (val >= 0) snprintf(vr, sizeof vr, "r%d", val);
            else snprintf(vr, sizeof vr, "jvalue");
            int id = new_rule(c);
            if (id < 0) return -1;
            emit(c, "r%d ::= \"{\" ws (jstring \":\" ws %s (\",\" ws jstring \":\" ws %s)*)? \"}\" ws\n", id, vr, vr);
            return c->failed ? -1 : id;
        }
        if (addl && !(addl->type == JSON_BOOL && !addl->u.boolean))
            return cfail(c, "unsupported keyword 'additionalProperties' (other than false) beside 'properties'");
        const size_t n = props->n;
        int *val = malloc(n * sizeof *val);
        if (!val) return cfail(c, "out of memory");
        for (size_t i = 0; i < n; i++) {
            val[i] = gen(c, &props->u.members[i].value, depth + 1);
            if (val[i] < 0) {
                free(val);
                return -1;
            }
        }
        /* T_i: properties i.. with none written yet; S_i: after one was */
        int base = c->n_rules;
        for (size_t i = 0; i <= n; i++)
            if (new_rule(c) < 0 || new_rule(c) < 0) {
                free(val);
                return -1;
            }
        for (size_t i = 0; i < n; i++) {
            const json_member *m = &props->u.members[i];
            int required = 0;
            for (size_t k = 0; req && k < req->n; k++)
                required |= req->u.items[k].n == m->key_len && memcmp(req->u.items[k].u.str, m->key, m->key_len) == 0;
            json_value key = { .type = JSON_STRING, .n = m->key_len };
            key.u.str = m->key;
            const int T = base + 2 * (int)i, S = T + 1, T1 = T + 2, S1 = T + 3;
            emit(c, "r%d ::= ", T);
            emit_json_lit(c, &key);
            emit(c, " ws \":\" ws r%d r%d%s", val[i], S1, required ? "" : " | ");
            if (!required) emit(c, "r%d", T1);
            emit(c, "\nr%d ::= \",\" ws ", S);
            emit_json_lit(c, &key);
            emit(c, " ws \":\" ws r%d r%d%s", val[i], S1, required ? "" : " | ");
            if (!required) emit(c, "r%d", S1);
            emit(c, "\n");
        }
        emit(c, "r%d ::= \nr%d ::= \n", base + 2 * (int)n, base + 2 * (int)n + 1);
        free(val);
        int id = new_rule(c);
        if (id < 0) return -1;
        emit(c, "r%d ::= \"{\" ws r%d \"}\" ws\n", id, base);
        return c->failed ? -1 : id;
    }
    return cfail(c, "unsupported type '%.*s'", (int)(tn > 40 ? 40 : tn), t);
}

static int gen(conv *c, const json_value *s, int depth)
{
    if (depth > 64) return cfail(c, "schema nested deeper than 64");
    if (s->type == JSON_BOOL) { /* true: anything; false: nothing can match */
        if (!s->u.boolean) return cfail(c, "a 'false' schema admits no value");
        int id = new_rule(c);
        if (id < 0) return -1;
        emit(c, "r%d ::= jvalue\n", id);
        return c->failed ? -1 : id;
    }
    if (s->type != JSON_OBJECT) return cfail(c, "a schema must be an object or a boolean");
    for (size_t i = 0; i < s->n; i++) {
        int ok = 0;
        for (int k = 0; known[k] && !ok; k++) ok = strcmp(s->u.members[i].key, known[k]) == 0;
        if (!ok) return cfail(c, "unsupported keyword '%.60s'", s->u.members[i].key);
    }
    const json_value *en = json_get(s, "enum"), *cn = json_get(s, "const"), *any = json_get(s, "anyOf");
    if (!any) any = json_get(s, "oneOf");
    const json_value *type = json_get(s, "type");
    if (cn) {
        int id = new_rule(c);
        if (id < 0) return -1;
        emit(c, "r%d ::= ", id);
        emit_json_lit(c, cn);
        emit(c, " ws\n");
        return c->failed ? -1 : id;
    }
    if (en) {
        if (en->type != JSON_ARRAY || en->n == 0) return cfail(c, "'enum' must be a non-empty array");
        int id = new_rule(c);
        if (id < 0) return -1;
        emit(c, "r%d ::= (", id);
        for (size_t i = 0; i < en->n; i++) {
            if (i) emit(c, " | ");
            emit_json_lit(c, &en->u.items[i]);
        }
        emit(c, ") ws\n");
        return c->failed ? -1 : id;
    }
    if (any) {
        if (any->type != JSON_ARRAY || any->n == 0) return cfail(c, "'anyOf'/'oneOf' must be a non-empty array");
        if (type) return cfail(c, "unsupported keyword 'type' beside 'anyOf'/'oneOf'");
        int *alt = malloc(any->n * sizeof *alt);
        if (!alt) return cfail(c, "out of memory");
        for (size_t i = 0; i < any->n; i++)
            if ((alt[i] = gen(c, &any->u.items[i], depth + 1)) < 0) {
                free(alt);
                return -1;
            }
        int id = new_rule(c);
        if (id >= 0) {
            emit(c, "r%d ::= ", id);
            for (size_t i = 0; i < any->n; i++) emit(c, "%sr%d", i ? " | " : "", alt[i]);
            emit(c, "\n");
        }
        free(alt);
        return c->failed || id < 0 ? -1 : id;
    }
    if (!type) {
        if (json_get(s, "properties") || json_get(s, "required") || json_get(s, "additionalProperties"))
            return gen_type(c, s, "object", 6, depth);
        if (json_get(s, "items")) return gen_type(c, s, "array", 5, depth);
        int id = new_rule(c);
        if (id < 0) return -1;
        emit(c, "r%d ::= jvalue\n", id);
        return c->failed ? -1 : id;
    }
    if (type->type == JSON_STRING) return gen_type(c, s, type->u.str, type->n, depth);
    if (type->type != JSON_ARRAY || type->n == 0) return cfail(c, "'type' must be a string or a non-empty array");
    int *alt = malloc(type->n * sizeof *alt);
    if (!alt) return cfail(c, "out of memory");
    for (size_t i = 0; i < type->n; i++) {
        const json_value *t = &type->u.items[i];
        if (t->type != JSON_STRING || (alt[i] = gen_type(c, s, t->u.str, t->n, depth)) < 0) {
            free(alt);
            return t->type != JSON_STRING ? cfail(c, "'type' must list strings") : -1;
        }
    }
    int id = new_rule(c);
    if (id >= 0) {
        emit(c, "r%d ::= ", id);
        for (size_t i = 0; i < type->n; i++) emit(c, "%sr%d", i ? " | " : "", alt[i]);
        emit(c, "\n");
    }
    free(alt);
    return c->failed || id < 0 ? -1 : id;
}

/* The JSON pieces every schema grammar shares. Strings are JSON strings
 * (escapes included); numbers have at most 16 integer and fraction digits
 * and a 3-digit exponent. */
static const char json_base[] =
    "ws ::= [ \\t\\n]{0,4}\n"
    "jchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "jstring ::= \"\\\"\" jchar* \"\\\"\" ws\n"
    "jint ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "jinteger ::= jint ws\n"
    "jnumber ::= jint (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "jboolean ::= (\"true\" | \"false\") ws\n"
    "jnull ::= \"null\" ws\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | jboolean | jnull\n"
    "jobject ::= \"{\" ws (jstring \":\" ws jvalue (\",\" ws jstring \":\" ws jvalue)*)? \"}\" ws\n"
    "jarray ::= \"[\" ws (jvalue (\",\" ws jvalue)*)? \"]\" ws\n";

char *json_schema_value_to_gbnf(const json_value *schema, char *err, size_t err_size)
{
    conv c = { .err = err, .err_size = err_size };
    emit(&c, "%s", json_base);
    int top = gen(&c, schema, 0);
    if (top >= 0) emit(&c, "root ::= r%d\n", top);
    if (c.failed || top < 0) {
        free(c.out.data);
        return NULL;
    }
    return c.out.data;
}

char *json_schema_to_gbnf(const char *schema, size_t n, char *err, size_t err_size)
{
    char perr[160];
    json_doc *d = json_parse(schema, n, 0, perr, sizeof perr);
    if (!d) {
        err_set(err, err_size, "json_schema: not valid JSON (%s)", perr);
        return NULL;
    }
    char *out = json_schema_value_to_gbnf(json_root(d), err, err_size);
    json_free(d);
    return out;
}
