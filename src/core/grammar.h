/* grammar.h - GBNF grammars (llama.cpp's notation) compiled to rules, and
 * a pushdown matcher that says which byte strings may extend the text
 * accepted so far. The public side (sparq_grammar, the sampler hook) is in
 * include/sparq.h; this is what the sampler and json_schema.c use.
 *
 * A compiled grammar is a flat array of elements: each rule is its
 * alternatives, each a sequence of elements ending in GE_ALT (another
 * follows) or GE_END (the rule's last). Repetitions (* + ? {m,n}) and
 * groups become generated rules, so the matcher only knows sequences,
 * rule references and character classes over Unicode code points.
 *
 * The matcher holds a set of stacks of element positions (each stack one
 * way the input so far can be parsed; its top a character class, or empty
 * when the grammar is complete) and the bytes of an unfinished UTF-8
 * character. Left recursion is refused when compiling, so expanding a
 * stack always terminates. */
#ifndef SPARQ_GRAMMAR_H
#define SPARQ_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"

enum {
    GE_END = 0,    /* end of the rule's last alternative                    */
    GE_ALT,        /* end of an alternative, another follows                */
    GE_REF,        /* v: rule id                                            */
    GE_CHAR,       /* v: code point; starts a class (may be followed by     */
    GE_CHAR_NOT,   /*   RNG_UPPER / CHAR_ALT); CHAR_NOT: a negated class    */
    GE_RNG_UPPER,  /* v: upper end of the range begun by the element before */
    GE_CHAR_ALT,   /* v: another code point (or range start) of the class   */
    GE_ANY,        /* any code point                                        */
};

typedef struct { uint32_t type, v; } gelem;

struct sparq_grammar {
    gelem    *el;        /* [n_el] every rule, one after another      */
    uint32_t  n_el;
    uint32_t *rule_off;  /* [n_rules] first element of each rule      */
    char    **rule_name; /* [n_rules]                                 */
    uint32_t  n_rules;
    uint32_t  root;
};

typedef struct gmatcher gmatcher;

/* A matcher at the start of g (g must outlive it); NULL out of memory. */
gmatcher *gm_create(const sparq_grammar *g);
void      gm_free(gmatcher *m);
/* 1 if bytes[0..n) can follow what was accepted (n > 0), else 0. */
int       gm_allows(gmatcher *m, const uint8_t *bytes, size_t n);
/* Consumes bytes[0..n); 0, or -1 if they cannot follow (state unchanged). */
int       gm_accept(gmatcher *m, const uint8_t *bytes, size_t n);
/* 1 if the text accepted so far is a whole sentence of the grammar. */
int       gm_complete(const gmatcher *m);
/* Whether byte b may come next, for all 256 at once (a fast first-byte
 * filter before checking a token's whole string). */
void      gm_first_bytes(gmatcher *m, uint8_t allowed[256]);

/* JSON Schema (the subset json_schema.c documents) to GBNF text, malloc'ed;
 * NULL with a one-line message naming what is not supported. */
char *json_schema_to_gbnf(const char *schema, size_t n, char *err, size_t err_size);
/* The same from a parsed schema (util/json.h), for the server's requests. */
struct json_value;
char *json_schema_value_to_gbnf(const struct json_value *schema, char *err, size_t err_size);

#endif
