/* fuzz_grammar.c - libFuzzer harness for the GBNF parser, the JSON Schema
 * converter and the grammar matcher (core/grammar.h; scripts/fuzz.sh).
 *
 * The input is TEXT [\0 BYTES]: TEXT is compiled as GBNF, or, when it
 * starts with '{', also as a JSON Schema; a compiled grammar then matches
 * BYTES one at a time and whole, which must agree. An error message must
 * be one line.
 */
#include "core/grammar.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void run(const sparq_grammar *g, const uint8_t *b, size_t n)
{
    gmatcher *a = gm_create(g), *w = gm_create(g);
    if (!a || !w) {
        gm_free(a);
        gm_free(w);
        return;
    }
    uint8_t first[256];
    gm_first_bytes(a, first);
    size_t i = 0;
    for (; i < n; i++) {
        int ok = gm_allows(a, b + i, 1);
        if (i == 0 && ok != first[b[0]]) abort(); /* the table is the one-byte answer */
        if (ok != (gm_accept(a, b + i, 1) == 0)) abort(); /* allows and accept agree */
        if (!ok) break;
    }
    /* the whole prefix at once is accepted iff byte by byte it was */
    if (n > 0) {
        int whole = gm_accept(w, b, i == n ? n : i + 1) == 0;
        if (whole != (i == n)) abort();
        if (whole && gm_complete(w) != gm_complete(a)) abort();
    }
    gm_free(a);
    gm_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    size_t tl = strlen(text);
    const uint8_t *rest = tl < size ? data + tl + 1 : NULL;
    size_t rn = tl < size ? size - tl - 1 : 0;
    if (rn > 256) rn = 256;
    char err[256];
    err[0] = 0;
    sparq_grammar *g = sparq_grammar_parse(text, err, sizeof err);
    if (!g && (!err[0] || strchr(err, '\n'))) abort();
    if (g) run(g, rest, rn);
    sparq_grammar_free(g);
    if (text[0] == '{') {
        err[0] = 0;
        g = sparq_grammar_from_json_schema(text, err, sizeof err);
        if (!g && (!err[0] || strchr(err, '\n'))) abort();
        if (g) run(g, rest, rn);
        sparq_grammar_free(g);
    }
    free(text);
    return 0;
}
