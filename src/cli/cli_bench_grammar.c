/* cli_bench_grammar.c - `sparq bench-grammar`: the cost of a grammar per
 * draw (bench_grammar), for comparing with a decode step of the same model
 * (`sparq bench`). A 128k vocabulary: `sparq gen-model` of llama-3.2-1b's
 * shape, e.g. `sparq bench-grammar -m llama-3.2-1b-random.gguf -j '{"type":"object"}'`. */
#include "bench/bench.h"
#include "cli/cli.h"
#include "util/textbuf.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *grammar_file, *json_schema;
    int steps;
    float temp;
    uint64_t seed;
} bg_opts;

#define OFF(f) offsetof(bg_opts, f)
static const cli_opt bg_table[] = {
    { "--grammar-file", NULL, OPT_STR, OFF(grammar_file), "FILE", "GBNF grammar" },
    { "-j", "--json-schema", OPT_STR, OFF(json_schema), "SCHEMA",
      "a JSON Schema (default, without --grammar-file: {\"type\":\"object\"}, OpenAI's json_object)" },
    { "-n", "--steps", OPT_INT1, OFF(steps), "N", "draws timed (default 200)" },
    { "--temp", NULL, OPT_FLOAT, OFF(temp), "T", "temperature (default 0: greedy)" },
    { "-s", "--seed", OPT_U64, OFF(seed), "N", "seed of the logits and the draws (default 1)" },
    { 0 },
};
#undef OFF

int cli_bench_grammar(int argc, char **argv)
{
    cli_model_opts mo = { 0 };
    bg_opts o = { NULL, NULL, 200, 0.0f, 1 };
    const cli_group groups[] = { { "model", cli_model_table, &mo }, { "grammar", bg_table, &o } };
    int rc = cli_parse_command(groups, 2, argc, argv, "usage: sparq bench-grammar [-m MODEL] [-j SCHEMA | --grammar-file FILE] [options]",
                               NULL, 0, NULL);
    if (rc >= 0) return rc;
    char path[4096], err[256];
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    if (!m) return 1;
    char *text = NULL;
    size_t text_len = 0;
    if (o.grammar_file && !(text = text_read_file(o.grammar_file, &text_len))) {
        fprintf(stderr, "error: cannot read '%s'\n", o.grammar_file);
        sparq_model_free(m);
        return 2;
    }
    sparq_grammar *g = text ? sparq_grammar_parse(text, err, sizeof err)
                            : sparq_grammar_from_json_schema(o.json_schema ? o.json_schema : "{\"type\":\"object\"}",
                                                             err, sizeof err);
    free(text);
    double uf = 0, ug = 0;
    rc = 0;
    if (!g) {
        fprintf(stderr, "error: %s\n", err);
        rc = 2;
    } else if (bench_grammar(m, g, o.steps, o.temp, o.seed, &uf, &ug, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        rc = 1;
    } else {
        printf("vocabulary %d, %d draws at temperature %g: free %.1f us/draw, grammar %.1f us/draw "
               "(+%.1f us; compare with a decode step of `sparq bench`)\n",
               sparq_model_n_vocab(m), o.steps, (double)o.temp, uf, ug, ug - uf);
    }
    sparq_grammar_free(g);
    sparq_model_free(m);
    return rc;
}
