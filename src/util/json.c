/* json.c - strict JSON reader and string writer (see json.h).
 *
 * Map:
 *   arena_*        bump allocator owning every node and string of a document
 *   (UTF-8 checks and encoding: util/utf8.h; the reader validates, the writer repairs)
 *   parse_*        recursive descent; one function per grammar rule
 *   json_parse     entry point: BOM, value, trailing whitespace only
 *   accessors      json_get / json_at / json_str ...
 *   json_write_str the escaping writer
 *
 * Arrays and objects do not know their size until they close, so their
 * children are parsed onto two shared scratch stacks (values, members) and
 * copied into the arena in one piece when the closing bracket is seen.
 * Children are pushed by value and addressed by index, so growing a stack
 * never invalidates anything the parser still holds.
 */
#include "util/json.h"
#include "util/err.h"
#include "util/utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---------------------------------------------------------- */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    /* data follows, 16-byte aligned (the struct is 24 bytes; padded below) */
} arena_block;

#define ARENA_HDR ((sizeof(arena_block) + 15) & ~(size_t)15)
#define ARENA_MIN_BLOCK ((size_t)64 << 10)

struct json_doc {
    arena_block *blocks;
    json_value root;
};

static void *arena_alloc(json_doc *d, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    arena_block *b = d->blocks;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > ARENA_MIN_BLOCK ? size : ARENA_MIN_BLOCK;
        if (cap > SIZE_MAX - ARENA_HDR) return NULL;
        arena_block *nb = malloc(ARENA_HDR + cap);
        if (!nb) return NULL;
        nb->used = 0;
        nb->cap = cap;
        /* A dedicated block for a large request goes behind the current one
         * so the current block's free tail is not abandoned. */
        if (b && size > ARENA_MIN_BLOCK) {
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            d->blocks = nb;
        }
        b = nb;
    }
    void *p = (char *)b + ARENA_HDR + b->used;
    b->used += size;
    return p;
}

void json_free(json_doc *d)
{
    if (!d) return;
    arena_block *b = d->blocks;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(d);
}

/* ---- parser --------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t n, pos;
    int max_depth;
    json_doc *doc;
    json_value *vstack;  /* scratch: children of open arrays */
    size_t vn, vcap;
    json_member *mstack; /* scratch: members of open objects */
    size_t mn, mcap;
    char *err;
    size_t err_size;
    int failed;
} parser;

static int fail(parser *p, const char *fmt, ...)
{
    if (p->failed) return -1; /* keep the innermost (first) message */
    p->failed = 1;
    if (p->err && p->err_size) {
        int k = snprintf(p->err, p->err_size, "json: byte %zu: ", p->pos);
        if (k >= 0 && (size_t)k < p->err_size) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + k, p->err_size - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static int oom(parser *p)
{
    return fail(p, "out of memory");
}

static void skip_ws(parser *p)
{
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int hex4(parser *p, size_t at, unsigned *out)
{
    if (p->n - at < 4) return -1;
    unsigned v = 0;
    for (size_t i = 0; i < 4; i++) {
        char c = p->s[at + i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Parses a string at p->pos (which is at the opening quote) into arena
 * memory. The unescaped text is never longer than the raw text, so the
 * closing quote is found first and that span sized the allocation. */
static int parse_string(parser *p, const char **out, size_t *out_len)
{
    size_t start = ++p->pos; /* after the opening quote */
    size_t end = start;
    while (end < p->n && p->s[end] != '"') {
        if (p->s[end] == '\\') end++; /* skip the escaped character */
        end++;
    }
    if (end >= p->n) return fail(p, "unterminated string");
    char *buf = arena_alloc(p->doc, end - start + 1);
    if (!buf) return oom(p);
    size_t o = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) return fail(p, "control character 0x%02x in string", c);
        if (c >= 0x80) {
            size_t len = utf8_valid_len((const unsigned char *)p->s + p->pos, end - p->pos);
            if (!len) return fail(p, "invalid UTF-8 in string");
            memcpy(buf + o, p->s + p->pos, len);
            o += len;
            p->pos += len;
            continue;
        }
        if (c != '\\') {
            buf[o++] = (char)c;
            p->pos++;
            continue;
        }
        char e = p->s[p->pos + 1]; /* exists: the scan above kept end past it */
        switch (e) {
        case '"': buf[o++] = '"'; break;
        case '\\': buf[o++] = '\\'; break;
        case '/': buf[o++] = '/'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'n': buf[o++] = '\n'; break;
        case 'r': buf[o++] = '\r'; break;
        case 't': buf[o++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (p->pos + 6 > end || hex4(p, p->pos + 2, &cp))
                return fail(p, "bad \\u escape (need 4 hex digits)");
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, "lone low surrogate \\u%04X", cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->pos + 12 > end || p->s[p->pos + 6] != '\\' || p->s[p->pos + 7] != 'u' ||
                    hex4(p, p->pos + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return fail(p, "high surrogate \\u%04X not followed by a low surrogate", cp);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->pos += 6;
            }
            o += utf8_encode(cp, buf + o);
            p->pos += 6;
            continue;
        }
        default:
            return fail(p, "bad escape '\\%c'", (e >= 0x20 && e < 0x7f) ? e : '?');
        }
        p->pos += 2;
    }
    buf[o] = 0;
    p->pos = end + 1; /* past the closing quote */
    *out = buf;
    *out_len = o;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, double *out)
{
    size_t start = p->pos, i = p->pos;
    if (i < p->n && p->s[i] == '-') i++;
    if (i >= p->n || !is_digit(p->s[i])) return fail(p, "bad number");
    if (p->s[i] == '0') {
        i++;
        if (i < p->n && is_digit(p->s[i])) return fail(p, "leading zero in number");
    } else {
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    if (i < p->n && p->s[i] == '.') {
        i++;
        if (i >= p->n || !is_digit(p->s[i])) return fail(p, "no digit after decimal point");
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        i++;
        if (i < p->n && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->n || !is_digit(p->s[i])) return fail(p, "no digit in exponent");
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    /* strtod needs a terminated copy: the input may not be NUL-terminated. */
    size_t len = i - start;
    char small[64];
    char *tmp = len < sizeof small ? small : malloc(len + 1);
    if (!tmp) return oom(p);
    memcpy(tmp, p->s + start, len);
    tmp[len] = 0;
    errno = 0;
    double v = strtod(tmp, NULL);
    int range = errno == ERANGE && (v > 1.0 || v < -1.0); /* overflow; underflow to 0 is fine */
    if (tmp != small) free(tmp);
    if (range) return fail(p, "number out of range");
    *out = v;
    p->pos = i;
    return 0;
}

static int parse_literal(parser *p, const char *word, size_t len)
{
    if (p->n - p->pos < len || memcmp(p->s + p->pos, word, len) != 0)
        return fail(p, "unexpected character '%c'",
                    (p->s[p->pos] >= 0x20 && p->s[p->pos] < 0x7f) ? p->s[p->pos] : '?');
    p->pos += len;
    return 0;
}

static int parse_value(parser *p, json_value *out, int depth);

static int push_value(parser *p, const json_value *v)
{
    if (p->vn == p->vcap) {
        size_t cap = p->vcap ? p->vcap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *p->vstack) return oom(p);
        json_value *ns = realloc(p->vstack, cap * sizeof *ns);
        if (!ns) return oom(p);
        p->vstack = ns;
        p->vcap = cap;
    }
    p->vstack[p->vn++] = *v;
    return 0;
}

static int push_member(parser *p, const json_member *m)
{
    if (p->mn == p->mcap) {
        size_t cap = p->mcap ? p->mcap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *p->mstack) return oom(p);
        json_member *ns = realloc(p->mstack, cap * sizeof *ns);
        if (!ns) return oom(p);
        p->mstack = ns;
        p->mcap = cap;
    }
    p->mstack[p->mn++] = *m;
    return 0;
}

static int parse_array(parser *p, json_value *out, int depth)
{
    size_t base = p->vn;
    p->pos++; /* '[' */
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            json_value v;
            if (parse_value(p, &v, depth + 1) || push_value(p, &v)) return -1;
            skip_ws(p);
            if (p->pos >= p->n) return fail(p, "unterminated array");
            char c = p->s[p->pos++];
            if (c == ']') break;
            if (c != ',') { p->pos--; return fail(p, "expected ',' or ']' in array"); }
        }
    }
    size_t count = p->vn - base;
    json_value *items = NULL;
    if (count) {
        items = arena_alloc(p->doc, count * sizeof *items); /* count <= n: no overflow */
        if (!items) return oom(p);
        memcpy(items, p->vstack + base, count * sizeof *items);
    }
    p->vn = base;
    out->type = JSON_ARRAY;
    out->n = count;
    out->u.items = items;
    return 0;
}

static int parse_object(parser *p, json_value *out, int depth)
{
    size_t base = p->mn;
    p->pos++; /* '{' */
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            json_member m;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != '"') return fail(p, "expected a string key in object");
            if (parse_string(p, &m.key, &m.key_len)) return -1;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':') return fail(p, "expected ':' after object key");
            p->pos++;
            if (parse_value(p, &m.value, depth + 1) || push_member(p, &m)) return -1;
            skip_ws(p);
            if (p->pos >= p->n) return fail(p, "unterminated object");
            char c = p->s[p->pos++];
            if (c == '}') break;
            if (c != ',') { p->pos--; return fail(p, "expected ',' or '}' in object"); }
        }
    }
    size_t count = p->mn - base;
    json_member *members = NULL;
    if (count) {
        members = arena_alloc(p->doc, count * sizeof *members);
        if (!members) return oom(p);
        memcpy(members, p->mstack + base, count * sizeof *members);
    }
    p->mn = base;
    out->type = JSON_OBJECT;
    out->n = count;
    out->u.members = members;
    return 0;
}

static int parse_value(parser *p, json_value *out, int depth)
{
    skip_ws(p);
    if (p->pos >= p->n) return fail(p, "unexpected end of input");
    memset(out, 0, sizeof *out);
    char c = p->s[p->pos];
    switch (c) {
    case '{':
    case '[':
        if (depth >= p->max_depth) return fail(p, "nesting deeper than %d", p->max_depth);
        return c == '{' ? parse_object(p, out, depth) : parse_array(p, out, depth);
    case '"':
        out->type = JSON_STRING;
        return parse_string(p, &out->u.str, &out->n);
    case 't':
        out->type = JSON_BOOL;
        out->u.boolean = 1;
        return parse_literal(p, "true", 4);
    case 'f':
        out->type = JSON_BOOL;
        out->u.boolean = 0;
        return parse_literal(p, "false", 5);
    case 'n':
        out->type = JSON_NULL;
        return parse_literal(p, "null", 4);
    default:
        if (c == '-' || is_digit(c)) {
            out->type = JSON_NUMBER;
            return parse_number(p, &out->u.number);
        }
        return fail(p, "unexpected character '%c'", (c >= 0x20 && c < 0x7f) ? c : '?');
    }
}

json_doc *json_parse(const char *text, size_t n, int max_depth, char *err, size_t err_size)
{
    if (err && err_size) err[0] = 0;
    json_doc *d = calloc(1, sizeof *d);
    if (!d) {
        err_set(err, err_size, "json: out of memory");
        return NULL;
    }
    /* The parser recurses once per level: the cap bounds its stack use. */
    if (max_depth <= 0) max_depth = JSON_DEFAULT_MAX_DEPTH;
    if (max_depth > JSON_MAX_DEPTH) max_depth = JSON_MAX_DEPTH;
    parser p = { .s = text ? text : "", .n = text ? n : 0, .doc = d, .err = err, .err_size = err_size,
                 .max_depth = max_depth };
    if (p.n >= 3 && memcmp(p.s, "\xEF\xBB\xBF", 3) == 0) p.pos = 3; /* UTF-8 byte order mark */
    int rc = parse_value(&p, &d->root, 0);
    if (!rc) {
        skip_ws(&p);
        if (p.pos != p.n) rc = fail(&p, "trailing characters after the JSON value");
    }
    free(p.vstack);
    free(p.mstack);
    if (rc) {
        json_free(d);
        return NULL;
    }
    return d;
}

/* ---- accessors ------------------------------------------------------ */

const json_value *json_root(const json_doc *d)
{
    return d ? &d->root : NULL;
}

const json_value *json_get(const json_value *v, const char *key)
{
    if (!v || v->type != JSON_OBJECT || !key) return NULL;
    size_t klen = strlen(key);
    for (size_t i = 0; i < v->n; i++) {
        const json_member *m = &v->u.members[i];
        if (m->key_len == klen && memcmp(m->key, key, klen) == 0) return &m->value;
    }
    return NULL;
}

const json_value *json_at(const json_value *v, size_t i)
{
    if (!v || v->type != JSON_ARRAY || i >= v->n) return NULL;
    return &v->u.items[i];
}

size_t json_len(const json_value *v)
{
    if (!v || (v->type != JSON_ARRAY && v->type != JSON_OBJECT)) return 0;
    return v->n;
}

const char *json_str(const json_value *v, size_t *len)
{
    if (!v || v->type != JSON_STRING) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = v->n;
    return v->u.str;
}

const char *json_get_str(const json_value *obj, const char *key, size_t *len)
{
    return json_str(json_get(obj, key), len);
}

static int member_cmp(const void *a, const void *b)
{
    const json_member *x = *(const json_member *const *)a, *y = *(const json_member *const *)b;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    const int c = memcmp(x->key, y->key, x->key_len);
    if (c) return c;
    return x < y ? -1 : x > y; /* document order: the second of a pair is reported */
}

int json_find_duplicate(const json_value *v, const json_member **dup)
{
    *dup = NULL;
    if (!v) return 0;
    if (v->type == JSON_ARRAY) {
        for (size_t i = 0; i < v->n; i++) {
            const int rc = json_find_duplicate(&v->u.items[i], dup);
            if (rc) return rc;
        }
        return 0;
    }
    if (v->type != JSON_OBJECT) return 0;
    if (v->n >= 2 && v->n <= 16) { /* pairwise: no allocation for the usual small object */
        for (size_t i = 1; i < v->n; i++)
            for (size_t j = 0; j < i; j++)
                if (v->u.members[i].key_len == v->u.members[j].key_len &&
                    !memcmp(v->u.members[i].key, v->u.members[j].key, v->u.members[i].key_len)) {
                    *dup = &v->u.members[i];
                    return 1;
                }
    } else if (v->n > 16) { /* sorted: n log n however many members a client sends */
        const json_member **m = malloc(v->n * sizeof *m);
        if (!m) return -1;
        for (size_t i = 0; i < v->n; i++) m[i] = &v->u.members[i];
        qsort(m, v->n, sizeof *m, member_cmp);
        for (size_t i = 1; i < v->n && !*dup; i++)
            if (m[i]->key_len == m[i - 1]->key_len && !memcmp(m[i]->key, m[i - 1]->key, m[i]->key_len)) *dup = m[i];
        free(m);
        if (*dup) return 1;
    }
    for (size_t i = 0; i < v->n; i++) {
        const int rc = json_find_duplicate(&v->u.members[i].value, dup);
        if (rc) return rc;
    }
    return 0;
}

/* ---- writer --------------------------------------------------------- */

void json_write_str(FILE *f, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    fputc('"', f);
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c >= 0x80) {
            size_t len = utf8_valid_len(u + i, n - i);
            if (len) {
                fwrite(u + i, 1, len, f);
                i += len;
            } else {
                fputs("\\ufffd", f);
                i++;
            }
            continue;
        }
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (c < 0x20) fprintf(f, "\\u%04x", c);
            else fputc((int)c, f);
        }
        i++;
    }
    fputc('"', f);
}
