/* grammar.c - GBNF parsing and compilation, and the pushdown matcher
 * (grammar.h). The notation is llama.cpp's GBNF: `name ::= alternatives`,
 * "literals", [classes] with ranges and ^, `.`, (groups), postfix * + ?
 * {m} {m,} {m,n}, # comments; a rule ends at a newline that is not inside
 * parentheses or right after `|`. The root rule is `root`. */
#include "core/grammar.h"
#include "util/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_RULES = 1 << 16,
    MAX_ELEMS = 1 << 22,
    MAX_REPEAT = 1024,      /* {m,n} bounds: each copy is a new element     */
    MAX_DEPTH = 4096,       /* stack depth: nesting a parse may reach       */
    MAX_STACKS = 512,       /* parses kept at once (ambiguous grammars)     */
    MAX_NEST = 200,         /* parentheses nesting in the grammar text      */
};

/* ---- compiling ------------------------------------------------------- */

typedef struct { gelem *e; uint32_t n, cap; } evec;

typedef struct {
    const char *src, *p;
    char *err;
    size_t err_size;
    int failed;
    evec *rules;      /* [n_rules] */
    char **names;     /* [n_rules] */
    uint8_t *defined; /* [n_rules] */
    uint32_t n_rules, cap_rules;
    size_t total;
    int depth;
} parser;

static int perr(parser *ps, const char *what)
{
    if (!ps->failed) {
        /* line and column of the failure, as a user looks for it */
        int line = 1, col = 1;
        for (const char *q = ps->src; q < ps->p && *q; q++) {
            if (*q == '\n') { line++; col = 1; } else col++;
        }
        err_set(ps->err, ps->err_size, "grammar: line %d, column %d: %s", line, col, what);
    }
    ps->failed = 1;
    return -1;
}

static int ev_push(parser *ps, evec *v, uint32_t type, uint32_t val)
{
    if (++ps->total > MAX_ELEMS) return perr(ps, "grammar too large");
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 16;
        gelem *ne = realloc(v->e, nc * sizeof *ne);
        if (!ne) return perr(ps, "out of memory");
        v->e = ne;
        v->cap = nc;
    }
    v->e[v->n].type = type;
    v->e[v->n].v = val;
    v->n++;
    return 0;
}

static int ev_append(parser *ps, evec *v, const gelem *e, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (ev_push(ps, v, e[i].type, e[i].v)) return -1;
    return 0;
}

/* The id of rule `name` (len bytes), created undefined if new; -1 on error. */
static int64_t rule_id(parser *ps, const char *name, size_t len)
{
    for (uint32_t i = 0; i < ps->n_rules; i++)
        if (strlen(ps->names[i]) == len && memcmp(ps->names[i], name, len) == 0) return i;
    if (ps->n_rules >= MAX_RULES) return perr(ps, "too many rules");
    if (ps->n_rules == ps->cap_rules) {
        uint32_t nc = ps->cap_rules ? ps->cap_rules * 2 : 16;
        evec *nr = realloc(ps->rules, nc * sizeof *nr);
        if (nr) ps->rules = nr;
        char **nn = realloc(ps->names, nc * sizeof *nn);
        if (nn) ps->names = nn;
        uint8_t *nd = realloc(ps->defined, nc);
        if (nd) ps->defined = nd;
        if (!nr || !nn || !nd) return perr(ps, "out of memory");
        ps->cap_rules = nc;
    }
    char *s = malloc(len + 1);
    if (!s) return perr(ps, "out of memory");
    memcpy(s, name, len);
    s[len] = 0;
    ps->names[ps->n_rules] = s;
    memset(&ps->rules[ps->n_rules], 0, sizeof ps->rules[0]);
    ps->defined[ps->n_rules] = 0;
    return ps->n_rules++;
}

/* A fresh rule for a group or repetition inside rule `base`. */
static int64_t new_rule(parser *ps, uint32_t base)
{
    char name[96];
    for (uint32_t k = ps->n_rules;; k++) {
        snprintf(name, sizeof name, "%.60s_%u", ps->names[base], (unsigned)k);
        int found = 0;
        for (uint32_t i = 0; i < ps->n_rules && !found; i++) found = strcmp(ps->names[i], name) == 0;
        if (!found) break;
    }
    int64_t id = rule_id(ps, name, strlen(name));
    if (id >= 0) ps->defined[id] = 1;
    return id;
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when `nl`. */
static void skip_space(parser *ps, int nl)
{
    for (;;) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) ps->p++;
        else if (c == '#') {
            while (*ps->p && *ps->p != '\n') ps->p++;
        } else break;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 character of the grammar text; -1 on a bad sequence. */
static int64_t read_utf8(parser *ps)
{
    const uint8_t *s = (const uint8_t *)ps->p;
    uint32_t c = s[0];
    int n = c < 0x80 ? 0 : c >= 0xC2 && c < 0xE0 ? 1 : c >= 0xE0 && c < 0xF0 ? 2 : c >= 0xF0 && c < 0xF5 ? 3 : -1;
    if (n < 0) return perr(ps, "invalid UTF-8 in the grammar");
    c = n == 0 ? c : n == 1 ? c & 0x1F : n == 2 ? c & 0x0F : c & 0x07;
    for (int i = 1; i <= n; i++) {
        if ((s[i] & 0xC0) != 0x80) return perr(ps, "invalid UTF-8 in the grammar");
        c = c << 6 | (s[i] & 0x3F);
    }
    ps->p += n + 1;
    return c;
}

/* A character of a literal or class, escapes decoded; -1 on error. */
static int64_t read_char(parser *ps)
{
    if (*ps->p == 0) return perr(ps, "unexpected end of the grammar");
    if (*ps->p != '\\') return read_utf8(ps);
    ps->p++;
    char e = *ps->p++;
    int nhex = 0;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return e;
    case 'x': nhex = 2; break;
    case 'u': nhex = 4; break;
    case 'U': nhex = 8; break;
    default: ps->p--; return perr(ps, "unknown escape");
    }
    uint32_t v = 0;
    for (int i = 0; i < nhex; i++) {
        int h = hexval(*ps->p);
        if (h < 0) return perr(ps, "bad hexadecimal escape");
        v = v << 4 | (uint32_t)h;
        ps->p++;
    }
    if (v > 0x10FFFF) return perr(ps, "escape beyond U+10FFFF");
    return v;
}

static int parse_alternatives(parser *ps, uint32_t rule, int nested);

static int parse_uint(parser *ps, uint32_t *out)
{
    if (!(*ps->p >= '0' && *ps->p <= '9')) return perr(ps, "expected a number");
    uint64_t v = 0;
    while (*ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (uint64_t)(*ps->p++ - '0');
        if (v > MAX_REPEAT) return perr(ps, "repetition count too large (at most 1024)");
    }
    *out = (uint32_t)v;
    return 0;
}

/* Replaces the last term seq[start..] by a rule repeating it min..max
 * times (max = UINT32_MAX: unbounded). */
static int repeat_term(parser *ps, uint32_t rule, evec *seq, uint32_t start, uint32_t min, uint32_t max)
{
    uint32_t tn = seq->n - start;
    gelem *term = malloc((tn ? tn : 1) * sizeof *term);
    if (!term) return perr(ps, "out of memory");
    memcpy(term, seq->e + start, tn * sizeof *term);
    seq->n = start;
    int rc = 0;
    for (uint32_t i = 0; i < min && !rc; i++) rc = ev_append(ps, seq, term, tn);
    if (!rc && max == UINT32_MAX) { /* T*: R ::= T R | (empty) */
        int64_t r = new_rule(ps, rule);
        rc = r < 0;
        if (!rc) {
            evec *rv = &ps->rules[r];
            rc = ev_append(ps, rv, term, tn) || ev_push(ps, rv, GE_REF, (uint32_t)r) || ev_push(ps, rv, GE_ALT, 0) ||
                 ev_push(ps, rv, GE_END, 0) || ev_push(ps, seq, GE_REF, (uint32_t)r);
        }
    } else if (!rc && max > min) { /* (T (T (...)?)?)?: nested optionals, no ambiguity */
        int64_t last = -1;
        for (uint32_t i = min; i < max && !rc; i++) {
            int64_t r = new_rule(ps, rule);
            rc = r < 0;
            if (rc) break;
            evec *rv = &ps->rules[r];
            rc = ev_append(ps, rv, term, tn) || (last >= 0 && ev_push(ps, rv, GE_REF, (uint32_t)last)) ||
                 ev_push(ps, rv, GE_ALT, 0) || ev_push(ps, rv, GE_END, 0);
            last = r;
        }
        if (!rc) rc = ev_push(ps, seq, GE_REF, (uint32_t)last);
    }
    free(term);
    return rc ? -1 : 0;
}

/* One alternative: a sequence of terms, into seq. */
static int parse_sequence(parser *ps, uint32_t rule, evec *seq, int nested)
{
    uint32_t last_start = UINT32_MAX;
    for (;;) {
        skip_space(ps, nested);
        char c = *ps->p;
        if (c == '"') {
            ps->p++;
            last_start = seq->n;
            while (*ps->p != '"') {
                if (*ps->p == 0 || *ps->p == '\n') return perr(ps, "unterminated literal");
                int64_t ch = read_char(ps);
                if (ch < 0 || ev_push(ps, seq, GE_CHAR, (uint32_t)ch)) return -1;
            }
            ps->p++;
            if (seq->n - last_start > 1) {
                /* a repetition applies to the whole literal: wrap it in a rule */
                if (*ps->p == '*' || *ps->p == '+' || *ps->p == '?' || *ps->p == '{') {
                    int64_t r = new_rule(ps, rule);
                    if (r < 0 || ev_append(ps, &ps->rules[r], seq->e + last_start, seq->n - last_start) ||
                        ev_push(ps, &ps->rules[r], GE_END, 0))
                        return -1;
                    seq->n = last_start;
                    if (ev_push(ps, seq, GE_REF, (uint32_t)r)) return -1;
                }
            }
        } else if (c == '[') {
            ps->p++;
            last_start = seq->n;
            uint32_t first = GE_CHAR;
            if (*ps->p == '^') {
                first = GE_CHAR_NOT;
                ps->p++;
            }
            int n = 0;
            while (*ps->p != ']') {
                if (*ps->p == 0) return perr(ps, "unterminated character class");
                int64_t lo = read_char(ps);
                if (lo < 0 || ev_push(ps, seq, n == 0 ? first : GE_CHAR_ALT, (uint32_t)lo)) return -1;
                if (ps->p[0] == '-' && ps->p[1] != ']' && ps->p[1] != 0) {
                    ps->p++;
                    int64_t hi = read_char(ps);
                    if (hi < 0) return -1;
                    if (hi < lo) return perr(ps, "character range upside down");
                    if (ev_push(ps, seq, GE_RNG_UPPER, (uint32_t)hi)) return -1;
                }
                n++;
            }
            if (n == 0) return perr(ps, "empty character class");
            ps->p++;
        } else if (c == '.') {
            ps->p++;
            last_start = seq->n;
            if (ev_push(ps, seq, GE_ANY, 0)) return -1;
        } else if (is_name_char(c)) {
            const char *s = ps->p;
            while (is_name_char(*ps->p)) ps->p++;
            const char *after = ps->p;
            skip_space(ps, 0);
            if (ps->p[0] == ':' && ps->p[1] == ':' && ps->p[2] == '=') { /* the next rule begins */
                if (nested) return perr(ps, "a rule definition inside parentheses");
                ps->p = s;
                return 0;
            }
            ps->p = after;
            int64_t r = rule_id(ps, s, (size_t)(after - s));
            last_start = seq->n;
            if (r < 0 || ev_push(ps, seq, GE_REF, (uint32_t)r)) return -1;
        } else if (c == '(') {
            if (++ps->depth > MAX_NEST) return perr(ps, "parentheses nested too deeply");
            ps->p++;
            int64_t r = new_rule(ps, rule);
            if (r < 0 || parse_alternatives(ps, (uint32_t)r, 1)) return -1;
            if (*ps->p != ')') return perr(ps, "expected ')'");
            ps->p++;
            ps->depth--;
            last_start = seq->n;
            if (ev_push(ps, seq, GE_REF, (uint32_t)r)) return -1;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last_start == UINT32_MAX) return perr(ps, "a repetition with nothing before it");
            ps->p++;
            uint32_t min = 0, max = UINT32_MAX;
            if (c == '+') min = 1;
            else if (c == '?') max = 1;
            else if (c == '{') {
                skip_space(ps, 0);
                if (parse_uint(ps, &min)) return -1;
                skip_space(ps, 0);
                max = min;
                if (*ps->p == ',') {
                    ps->p++;
                    skip_space(ps, 0);
                    max = UINT32_MAX;
                    if (*ps->p >= '0' && *ps->p <= '9' && parse_uint(ps, &max)) return -1;
                    skip_space(ps, 0);
                    if (max < min) return perr(ps, "repetition {m,n} with n < m");
                }
                if (*ps->p != '}') return perr(ps, "expected '}'");
                ps->p++;
            }
            if (repeat_term(ps, rule, seq, last_start, min, max)) return -1;
            last_start = UINT32_MAX;
        } else {
            return 0; /* | ) newline end: the caller decides */
        }
    }
}

/* Alternatives separated by |, into rule `rule` (which must be empty). */
static int parse_alternatives(parser *ps, uint32_t rule, int nested)
{
    evec seq = { 0 };
    for (;;) {
        seq.n = 0;
        if (parse_sequence(ps, rule, &seq, nested)) break;
        evec *rv = &ps->rules[rule]; /* after parse_sequence: rules may have moved */
        if (ev_append(ps, rv, seq.e, seq.n)) break;
        skip_space(ps, nested);
        if (*ps->p == '|') {
            ps->p++;
            if (ev_push(ps, &ps->rules[rule], GE_ALT, 0)) break;
            skip_space(ps, 1);
            continue;
        }
        if (ev_push(ps, &ps->rules[rule], GE_END, 0)) break;
        free(seq.e);
        return 0;
    }
    free(seq.e);
    return -1;
}

static int parse_rule(parser *ps)
{
    const char *s = ps->p;
    while (is_name_char(*ps->p)) ps->p++;
    if (ps->p == s) return perr(ps, "expected a rule name");
    size_t len = (size_t)(ps->p - s);
    skip_space(ps, 0);
    if (!(ps->p[0] == ':' && ps->p[1] == ':' && ps->p[2] == '=')) return perr(ps, "expected '::='");
    ps->p += 3;
    int64_t r = rule_id(ps, s, len);
    if (r < 0) return -1;
    if (ps->defined[r]) {
        ps->p = s;
        return perr(ps, "rule defined twice");
    }
    ps->defined[r] = 1;
    skip_space(ps, 0);
    if (parse_alternatives(ps, (uint32_t)r, 0)) return -1;
    skip_space(ps, 0);
    if (*ps->p != 0 && *ps->p != '\n') return perr(ps, *ps->p == ')' ? "unmatched ')'" : "unexpected character");
    return 0;
}

/* Rules that can match the empty string (fixpoint), then a search for a
 * rule that can reach itself without consuming a character: the matcher
 * would expand it forever. */
static int check_left_recursion(parser *ps)
{
    const uint32_t n = ps->n_rules;
    uint8_t *nullable = calloc(n, 1), *state = calloc(n, 1);
    uint32_t *stack = malloc((size_t)n * 2 * sizeof *stack);
    if (!nullable || !state || !stack) {
        free(nullable);
        free(state);
        free(stack);
        return perr(ps, "out of memory");
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < n; r++) {
            if (nullable[r]) continue;
            const evec *v = &ps->rules[r];
            int ok = 1, any = 0; /* ok: the alternative so far can be empty */
            for (uint32_t i = 0; i < v->n && !any; i++) {
                uint32_t t = v->e[i].type;
                if (t == GE_ALT || t == GE_END) {
                    any = ok;
                    ok = 1;
                } else if (t == GE_REF) ok = ok && nullable[v->e[i].v];
                else if (t != GE_RNG_UPPER && t != GE_CHAR_ALT) ok = 0;
            }
            if (any) nullable[r] = changed = 1;
        }
    }
    int rc = 0;
    /* iterative DFS over "left edges": 0 unseen, 1 on the path, 2 done */
    for (uint32_t start = 0; start < n && !rc; start++) {
        if (state[start]) continue;
        uint32_t sp = 0;
        stack[sp++] = start;
        stack[sp++] = 0;
        state[start] = 1;
        while (sp && !rc) {
            uint32_t r = stack[sp - 2], *at = &stack[sp - 1];
            const evec *v = &ps->rules[r];
            int pushed = 0;
            while (*at < v->n && !pushed) {
                /* is element *at at a left position: only nullable refs before it in its alternative */
                uint32_t i = *at, j = i;
                while (j > 0 && v->e[j - 1].type != GE_ALT && v->e[j - 1].type != GE_END) j--;
                int left = 1;
                for (uint32_t k = j; k < i && left; k++) left = v->e[k].type == GE_REF && nullable[v->e[k].v];
                (*at)++;
                if (left && v->e[i].type == GE_REF) {
                    uint32_t t = v->e[i].v;
                    if (state[t] == 1) {
                        char msg[160];
                        snprintf(msg, sizeof msg, "rule '%.60s' is left-recursive (unsupported)", ps->names[t]);
                        ps->p = ps->src;
                        rc = perr(ps, msg);
                    } else if (state[t] == 0) {
                        state[t] = 1;
                        stack[sp++] = t;
                        stack[sp++] = 0;
                        pushed = 1;
                    }
                }
            }
            if (!pushed && !rc) {
                state[r] = 2;
                sp -= 2;
            }
        }
    }
    free(nullable);
    free(state);
    free(stack);
    return rc;
}

void sparq_grammar_free(sparq_grammar *g)
{
    if (!g) return;
    for (uint32_t i = 0; i < g->n_rules; i++) free(g->rule_name[i]);
    free(g->rule_name);
    free(g->rule_off);
    free(g->el);
    free(g);
}

sparq_grammar *sparq_grammar_parse(const char *text, char *err, size_t err_size)
{
    if (!text) {
        err_set(err, err_size, "grammar: no text");
        return NULL;
    }
    parser ps = { .src = text, .p = text, .err = err, .err_size = err_size };
    sparq_grammar *g = NULL;
    for (;;) {
        skip_space(&ps, 1);
        if (*ps.p == 0) break;
        if (parse_rule(&ps)) break;
    }
    int64_t root = -1;
    if (!ps.failed) {
        for (uint32_t i = 0; i < ps.n_rules && root < 0; i++)
            if (strcmp(ps.names[i], "root") == 0) root = i;
        if (root < 0) perr(&ps, "no rule named 'root'");
    }
    for (uint32_t i = 0; i < ps.n_rules && !ps.failed; i++)
        if (!ps.defined[i]) {
            char msg[120];
            snprintf(msg, sizeof msg, "undefined rule '%.60s'", ps.names[i]);
            ps.p = ps.src;
            perr(&ps, msg);
        }
    if (!ps.failed) check_left_recursion(&ps);
    if (!ps.failed) {
        g = calloc(1, sizeof *g);
        if (g) {
            g->n_rules = ps.n_rules;
            g->root = (uint32_t)root;
            g->rule_off = malloc(ps.n_rules * sizeof *g->rule_off);
            g->el = malloc((ps.total + 1) * sizeof *g->el);
            g->rule_name = ps.names;
            ps.names = NULL;
        }
        if (!g || !g->rule_off || !g->el) {
            perr(&ps, "out of memory");
        } else {
            uint32_t at = 0;
            for (uint32_t i = 0; i < ps.n_rules; i++) {
                g->rule_off[i] = at;
                memcpy(g->el + at, ps.rules[i].e, ps.rules[i].n * sizeof *g->el);
                at += ps.rules[i].n;
            }
            g->n_el = at;
        }
    }
    for (uint32_t i = 0; i < ps.n_rules; i++) {
        free(ps.rules[i].e);
        if (ps.names) free(ps.names[i]);
    }
    free(ps.rules);
    free(ps.names);
    free(ps.defined);
    if (ps.failed) {
        if (g) g->rule_name = g->rule_name ? g->rule_name : NULL;
        sparq_grammar_free(g);
        return NULL;
    }
    return g;
}

sparq_grammar *sparq_grammar_from_json_schema(const char *schema, char *err, size_t err_size)
{
    if (!schema) {
        err_set(err, err_size, "json_schema: no schema");
        return NULL;
    }
    char *gbnf = json_schema_to_gbnf(schema, strlen(schema), err, err_size);
    if (!gbnf) return NULL;
    sparq_grammar *g = sparq_grammar_parse(gbnf, err, err_size);
    free(gbnf);
    return g;
}

/* ---- matching --------------------------------------------------------- */

/* An unfinished UTF-8 character: the bits so far, bytes still to come and
 * the sequence's whole length. */
typedef struct { uint32_t val, rem, len; } u8state;

/* A set of stacks: stack i is pool[off[i] .. off[i] + len[i]). */
typedef struct {
    uint32_t *pool;
    size_t    n_pool, cap_pool;
    uint32_t *off, *len;
    uint32_t  n, cap;
} sset;

struct gmatcher {
    const sparq_grammar *g;
    sset cur, a, b;
    u8state part;                 /* unfinished UTF-8 character          */
    uint32_t *tmp;                /* [MAX_DEPTH + 2] stack being built   */
    int oom;
};

static void sset_free(sset *s)
{
    free(s->pool);
    free(s->off);
    free(s->len);
}

/* Adds stack st[0..n) unless already there (or the set is full). */
static void sset_add(gmatcher *m, sset *s, const uint32_t *st, uint32_t n)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (s->len[i] == n && (n == 0 || memcmp(s->pool + s->off[i], st, n * sizeof *st) == 0)) return;
    if (s->n >= MAX_STACKS) return;
    if (s->n == s->cap) {
        uint32_t nc = s->cap ? s->cap * 2 : 8;
        uint32_t *no = realloc(s->off, nc * sizeof *no);
        if (no) s->off = no;
        uint32_t *nl = realloc(s->len, nc * sizeof *nl);
        if (nl) s->len = nl;
        if (!no || !nl) {
            m->oom = 1;
            return;
        }
        s->cap = nc;
    }
    if (s->n_pool + n > s->cap_pool) {
        size_t nc = s->cap_pool ? s->cap_pool * 2 : 64;
        while (nc < s->n_pool + n) nc *= 2;
        uint32_t *np = realloc(s->pool, nc * sizeof *np);
        if (!np) {
            m->oom = 1;
            return;
        }
        s->pool = np;
        s->cap_pool = nc;
    }
    if (n) memcpy(s->pool + s->n_pool, st, n * sizeof *st); /* an empty stack: pool may be NULL */
    s->off[s->n] = (uint32_t)s->n_pool;
    s->len[s->n] = n;
    s->n_pool += n;
    s->n++;
}

static int is_term(uint32_t t) { return t == GE_END || t == GE_ALT; }

/* Expands m->tmp[0..n) until every stack's top is a character class (or
 * the stack is empty), adding each to out. The entries at and above n are
 * scratch; entry n-1 is restored before returning. */
static void expand(gmatcher *m, sset *out, uint32_t n)
{
    const gelem *el = m->g->el;
    uint32_t *st = m->tmp;
    if (n == 0) {
        sset_add(m, out, st, 0);
        return;
    }
    const uint32_t p = st[n - 1];
    const uint32_t t = el[p].type;
    if (is_term(t)) {
        expand(m, out, n - 1);
        return;
    }
    if (t != GE_REF) {
        sset_add(m, out, st, n);
        return;
    }
    const uint32_t next = p + 1;
    uint32_t bn = n;
    if (is_term(el[next].type)) bn = n - 1;
    else st[n - 1] = next;
    if (bn + 1 > MAX_DEPTH) { /* deeper than any parse we follow: dropped */
        st[n - 1] = p;
        return;
    }
    uint32_t a = m->g->rule_off[el[p].v];
    for (;;) {
        if (is_term(el[a].type)) expand(m, out, bn); /* an empty alternative */
        else {
            st[bn] = a;
            expand(m, out, bn + 1);
        }
        while (!is_term(el[a].type)) a++;
        if (el[a].type == GE_END) break;
        a++;
    }
    st[n - 1] = p;
}

gmatcher *gm_create(const sparq_grammar *g)
{
    gmatcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    m->tmp = malloc((MAX_DEPTH + 2) * sizeof *m->tmp);
    if (!m->tmp) {
        gm_free(m);
        return NULL;
    }
    /* the root's alternatives, each a stack of one */
    uint32_t a = g->rule_off[g->root];
    for (;;) {
        if (is_term(g->el[a].type)) expand(m, &m->cur, 0);
        else {
            m->tmp[0] = a;
            expand(m, &m->cur, 1);
        }
        while (!is_term(g->el[a].type)) a++;
        if (g->el[a].type == GE_END) break;
        a++;
    }
    if (m->oom) {
        gm_free(m);
        return NULL;
    }
    return m;
}

void gm_free(gmatcher *m)
{
    if (!m) return;
    sset_free(&m->cur);
    sset_free(&m->a);
    sset_free(&m->b);
    free(m->tmp);
    free(m);
}

/* Does the class at el[p] admit code point c (lo == hi) or some code point
 * of [lo, hi] (an unfinished character; a negated class: unless one range
 * covers all of it)? *end gets the element after the class. */
static int class_admits(const gelem *el, uint32_t p, uint32_t lo, uint32_t hi, uint32_t *end)
{
    if (el[p].type == GE_ANY) {
        *end = p + 1;
        return 1;
    }
    const int neg = el[p].type == GE_CHAR_NOT;
    int hit = 0, cover = 0;
    uint32_t i = p;
    do {
        uint32_t a = el[i].v, b = a;
        if (el[i + 1].type == GE_RNG_UPPER) b = el[++i].v;
        hit |= a <= hi && lo <= b;
        cover |= a <= lo && hi <= b;
        i++;
    } while (el[i].type == GE_CHAR_ALT);
    *end = i;
    if (lo == hi) return neg ? !hit : hit;
    return neg ? !cover : hit;
}

/* One byte on set in -> out (cleared first); updates *val / *rem. */
static void step_byte(gmatcher *m, const sset *in, sset *out, uint8_t byte, u8state *u)
{
    out->n = 0;
    out->n_pool = 0;
    uint32_t v = u->val, r = u->rem, len = u->len;
    if (r == 0) {
        if (byte < 0x80) { v = byte; len = 1; }
        else if (byte >= 0xC2 && byte < 0xE0) { v = byte & 0x1F; r = 1; len = 2; }
        else if (byte >= 0xE0 && byte < 0xF0) { v = byte & 0x0F; r = 2; len = 3; }
        else if (byte >= 0xF0 && byte < 0xF5) { v = byte & 0x07; r = 3; len = 4; }
        else return;
    } else {
        if ((byte & 0xC0) != 0x80) return;
        v = v << 6 | (byte & 0x3Fu);
        r--;
    }
    uint32_t lo = v << (6 * r), hi = lo | ((1u << (6 * r)) - 1);
    /* only shortest forms, no surrogates: the code points a sequence of this
     * length may still become (an overlong '}' must not pass as one) */
    const uint32_t vmin = len == 1 ? 0 : len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    const uint32_t vmax = len == 1 ? 0x7F : len == 2 ? 0x7FF : len == 3 ? 0xFFFF : 0x10FFFF;
    lo = lo < vmin ? vmin : lo;
    hi = hi > vmax ? vmax : hi;
    if (len == 3 && lo >= 0xD800 && hi <= 0xDFFF) return;
    if (r == 0 && lo >= 0xD800 && lo <= 0xDFFF) return;
    if (lo > hi) return;
    u->val = v;
    u->rem = r;
    u->len = len;
    const gelem *el = m->g->el;
    for (uint32_t i = 0; i < in->n; i++) {
        const uint32_t n = in->len[i];
        if (n == 0) continue;
        const uint32_t *st = in->pool + in->off[i];
        uint32_t end;
        if (!class_admits(el, st[n - 1], lo, hi, &end)) continue;
        if (r > 0) { /* wait for the rest of the character */
            sset_add(m, out, st, n);
            continue;
        }
        memcpy(m->tmp, st, n * sizeof *st);
        m->tmp[n - 1] = end;
        expand(m, out, n);
    }
}

/* Runs bytes from the current state; the result is in *res (m->a or m->b). */
static sset *run(gmatcher *m, const uint8_t *bytes, size_t n, u8state *u)
{
    const sset *in = &m->cur;
    sset *out = &m->a;
    *u = m->part;
    for (size_t i = 0; i < n; i++) {
        step_byte(m, in, out, bytes[i], u);
        if (out->n == 0) return out;
        in = out;
        out = out == &m->a ? &m->b : &m->a;
    }
    return (sset *)in;
}

int gm_allows(gmatcher *m, const uint8_t *bytes, size_t n)
{
    if (n == 0) return 0;
    u8state u;
    return run(m, bytes, n, &u)->n > 0;
}

int gm_accept(gmatcher *m, const uint8_t *bytes, size_t n)
{
    if (n == 0) return 0;
    u8state u;
    sset *res = run(m, bytes, n, &u);
    if (res->n == 0) return -1;
    sset t = m->cur;
    m->cur = *res;
    *res = t;
    m->part = u;
    return 0;
}

int gm_complete(const gmatcher *m)
{
    if (m->part.rem) return 0;
    for (uint32_t i = 0; i < m->cur.n; i++)
        if (m->cur.len[i] == 0) return 1;
    return 0;
}

void gm_first_bytes(gmatcher *m, uint8_t allowed[256])
{
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        allowed[b] = (uint8_t)gm_allows(m, &c, 1);
    }
}
