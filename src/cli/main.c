/* main.c - the `sparq` entry point: dispatch to a subcommand. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

typedef struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} subcommand;

static const subcommand subcommands[] = {
    { "run", cli_run, "generate text from a prompt" },
    { "gen-model", cli_gen_model, "write a random-weight GGUF of a real model shape" },
    { "bench", cli_bench, "benchmarks: attention op, memory bandwidth, decode tok/s" },
    { "eval", cli_eval, "task metrics and fidelity vs dense, per policy and transfer ratio" },
    { "stats", cli_stats, "attention statistics of a forward pass (q kurtosis, top-k agreement, ...)" },
    { "prefill", cli_prefill, "prefill a context once and save its KV cache (and indexes) to a file" },
    { "import", cli_import, "a llama.cpp saved sequence state to a KV cache file (with indexes)" },
    { "embed", cli_embed, "text embeddings (pooled hidden states) as llama-embedding computes them" },
    { "serve", cli_serve, "OpenAI-compatible HTTP server with continuous batching" },
    { "bench-grammar", cli_bench_grammar, "the cost per token of grammar-constrained sampling (structured output)" },
    { "bench-topk", cli_topk, "top-k attention over a synthetic N-token prefix decoded from a KV file" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: sparq COMMAND [options]   (sparq COMMAND --help for its options)\n"
               "       sparq -m MODEL -p TEXT [options]   (no command: run, as llama-cli)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-10s %s\n", subcommands[i].name, subcommands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    for (int i = 1; i < argc; i++) /* every command, before its own dispatch */
        if (strcmp(argv[i], "--version") == 0) {
            cli_print_version(stdout);
            return 0;
        }
    /* options first and no command: llama-cli's habit, `run` */
    if (argv[1][0] == '-' && argv[1][1]) return cli_run(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(argv[1], subcommands[i].name) == 0) return subcommands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
