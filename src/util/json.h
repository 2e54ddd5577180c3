/* json.h - a small, strict JSON reader (DOM) and a string writer.
 *
 * The reader treats its input as hostile: it follows RFC 8259 exactly
 * (no comments, no trailing commas, no NaN, no leading zeros, no control
 * characters inside strings), validates UTF-8, caps nesting depth, and
 * never reads past the buffer it is given (the buffer need not be
 * NUL-terminated). Strings are unescaped on parse, \uXXXX included, with a
 * surrogate pair becoming one 4-byte UTF-8 sequence; a lone surrogate is an
 * error. "\u0000" is allowed and kept, so always use the stored length.
 *
 * Everything a document holds (nodes, strings) lives in one arena owned by
 * the json_doc and freed by json_free; pointers returned by the accessors
 * stay valid until then. Object members keep document order; duplicate
 * keys are kept and json_get returns the first.
 *
 *   json_doc *d = json_parse(buf, n, 0, err, sizeof err);
 *   const json_value *title = json_get(json_root(d), "title");
 *   size_t len; const char *s = json_str(title, &len);
 *   json_free(d);
 *
 * The writer (json_write_str) emits one quoted, escaped JSON string and is
 * what the CLI uses for machine-readable output.
 */
#ifndef SPARQ_JSON_H
#define SPARQ_JSON_H

#include <stddef.h>
#include <stdio.h>

#define JSON_DEFAULT_MAX_DEPTH 256
#define JSON_MAX_DEPTH 4096 /* larger requests are clamped (recursion bound) */

typedef enum {
    JSON_NULL,
    JSON_BOOL,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json_value  json_value;
typedef struct json_member json_member;
typedef struct json_doc    json_doc;

struct json_value {
    json_type type;
    size_t n;                  /* string: bytes (NUL excluded); array: items; object: members */
    union {
        int boolean;
        double number;
        const char *str;       /* NUL-terminated, may hold '\0' itself (\u0000): use n */
        const json_value *items;      /* [n] */
        const json_member *members;   /* [n], document order */
    } u;
};

struct json_member {
    const char *key;           /* unescaped, NUL-terminated */
    size_t key_len;
    json_value value;
};

/* Parses text[0..n). max_depth caps array/object nesting (<= 0: the
 * default, JSON_DEFAULT_MAX_DEPTH; at most JSON_MAX_DEPTH). Returns the document, or NULL with
 * "json: byte <offset>: <what>" in err on malformed input or NULL with an
 * out-of-memory message. Caller frees with json_free. */
json_doc *json_parse(const char *text, size_t n, int max_depth, char *err, size_t err_size);

/* json_free(NULL) is a no-op. */
void json_free(json_doc *d);

/* The top-level value (never NULL for a parsed document). */
const json_value *json_root(const json_doc *d);

/* Member `key` of an object, or NULL if v is not an object or lacks it. */
const json_value *json_get(const json_value *v, const char *key);

/* Element i of an array, or NULL if v is not an array or i is out of range. */
const json_value *json_at(const json_value *v, size_t i);

/* Items of an array / members of an object; 0 for anything else. */
size_t json_len(const json_value *v);

/* The string of a string value (length in *len if len != NULL), or NULL if
 * v is NULL or not a string. */
const char *json_str(const json_value *v, size_t *len);

/* Convenience: json_str(json_get(obj, key), len). */
const char *json_get_str(const json_value *obj, const char *key, size_t *len);

/* Looks through v and everything inside it for an object with two members
 * of the same key (byte for byte, "\u0000" included): 1 with *dup the
 * later of the two, 0 if there is none, -1 out of memory. For input whose
 * meaning must not depend on which of two values a reader takes (a server
 * request: first wins here, last in other parsers). */
int json_find_duplicate(const json_value *v, const json_member **dup);

/* Writes s[0..n) to f as one JSON string literal: quotes, backslash and
 * control characters escaped (\n, \t, ... or \u00XX). Valid UTF-8 passes
 * through; each byte of an invalid UTF-8 sequence becomes \ufffd, because
 * model output can end inside a multi-byte character and the file must stay
 * valid JSON. */
void json_write_str(FILE *f, const char *s, size_t n);

#endif
