/* cli.h - the command-line front end: option tables and subcommands.
 *
 * The CLI is only a client of the library (include/sparq.h and the module
 * headers). One table per option group drives both parsing and --help;
 * a subcommand combines the groups it needs.
 */
#ifndef SPARQ_CLI_H
#define SPARQ_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "sparq.h"
#include "attn/attn_params.h"

/* Counts are range-checked at parse: OPT_INT1 refuses 0 and negatives (0
 * would silently mean "the default"), OPT_INT0 / OPT_I64_0 refuse
 * negatives (the help says what 0 means). OPT_FLOAT never accepts NaN or
 * Inf. OPT_STRS appends to a cli_strs (repeatable option). */
/* OPT_ONOFF: an optional on|off|auto after the name (llama.cpp's -fa):
 * taken when the next argument is one of those, else "on". */
typedef enum { OPT_STR, OPT_INT, OPT_I64, OPT_U64, OPT_FLOAT, OPT_FLAG, OPT_INT1, OPT_INT0, OPT_I64_0,
               OPT_STRS, OPT_ONOFF } cli_opt_kind;

#define CLI_STRS_MAX 16
typedef struct cli_strs { const char *v[CLI_STRS_MAX]; int n; } cli_strs;

typedef struct cli_opt {
    const char  *name;      /* "-m" or "--model"                          */
    const char  *alias;     /* second spelling or NULL                    */
    cli_opt_kind kind;
    size_t       offset;    /* into the group's struct                    */
    const char  *metavar;   /* "FILE"; NULL for flags                     */
    const char  *help;
} cli_opt;

/* "sparq VERSION (commit C, SIMD S)": printed by `sparq --version` and
 * `sparq CMD --version`; the commit is the checkout's it was built from
 * ("unknown" outside git), the SIMD level the one compiled in. */
void cli_print_version(FILE *f);
/* "VERSION (commit C)": the same build, as `sparq serve` reports it in
 * /props ("build_info"). A string constant. */
const char *cli_build_info(void);

typedef struct cli_group {
    const char    *title;   /* section in --help                          */
    const cli_opt *opts;    /* terminated by a zero entry                 */
    void          *base;    /* struct the offsets point into              */
} cli_group;

/* Parses argv[0..argc) into the groups. Positional arguments are collected
 * into pos[0..*n_pos) (at most max_pos). "-h"/"--help" sets *help.
 * Returns 0, or -1 with a one-line message. */
/* The start of every subcommand: cli_parse, then the error on stderr or
 * the help (usage line and the groups' options) on stdout. Returns -1 to
 * go on, else the exit status: 2 after an error, 0 after --help. pos and
 * n_pos may be NULL when max_pos is 0. */
int cli_parse_command(const cli_group *groups, int n_groups, int argc, char **argv, const char *usage,
                      char **pos, int max_pos, int *n_pos);

int cli_parse(const cli_group *groups, int n_groups, int argc, char **argv,
              char **pos, int max_pos, int *n_pos, int *help, char *err, size_t err_size);
void cli_print_help(FILE *f, const char *usage, const cli_group *groups, int n_groups);

/* Options shared by every subcommand that loads a model. */
typedef struct cli_model_opts {
    const char *model;      /* -m; default: stories260K.gguf on the path  */
    int64_t     n_ctx;      /* -c                                         */
    int         n_threads;  /* -t                                         */
    int         n_batch;    /* -b                                         */
    const char *kv_type;    /* --kv-type f16|f32                          */
    const char *cache_type_k, *cache_type_v; /* -ctk / -ctv (llama.cpp)   */
    int         json;       /* --json                                     */
    int         use_mmap;   /* --mmap (--no-mmap: the default, accepted)  */
    int         no_mmap;
    int         no_repack;  /* -nr/--no-repack                           */
} cli_model_opts;
extern const cli_opt cli_model_table[];

/* The KV type of --kv-type, -ctk and -ctv together: K and V share one type
 * here, so different ones are an error. Returns the SPARQ_KV_* or -1 with
 * a message. */
int cli_model_kv_type(const cli_model_opts *o, char *err, size_t err_size);

/* What a command that writes a KV file (prefill, import) checks before its
 * long work: the index kinds of --index (NULL: ivf; "none": no index) into
 * *indexes, and that the --save-kv path can be written. 0, or 2 with the
 * error printed. */
int cli_kv_output(const char *index, const char *save, const char **indexes);

/* llama-cli / llama-server options accepted for their habits: -ngl,
 * --mlock, -fa, --no-warmup, --color do nothing on this CPU engine (one
 * note each on stderr says so); -ub sets the one batch size sparq has;
 * -v prints the resolved settings. */
typedef struct cli_compat_opts {
    const char *ngl;        /* -ngl N                                     */
    const char *flash_attn; /* -fa [on|off|auto]                          */
    int mlock, no_warmup, color, verbose;
    int ubatch;             /* -ub N                                      */
} cli_compat_opts;
extern const cli_opt cli_compat_table[];

/* Prints the notes and folds -ub into mo->n_batch. */
void cli_compat_apply(const cli_compat_opts *c, cli_model_opts *mo);

/* Attention policy options (run, bench, eval, serve): the table fills an
 * attn_opts (attn/attn_params.h), which attn_opts_params turns into
 * library parameters, as the server does for a request's "sparq" object. */
extern const cli_opt cli_attn_table[];

/* Prefill attention options (run, prefill, eval): --prefill-attn and its
 * knobs (sparq.h, sparq_prefill_params). */
typedef struct cli_prefill_opts {
    const char *mode;       /* --prefill-attn exact|window|topk           */
    int window, n_sink, k;  /* --prefill-window --prefill-sink --prefill-k */
    int nlist, nprobe;      /* --prefill-nlist --prefill-nprobe           */
} cli_prefill_opts;
extern const cli_opt cli_prefill_table[];
/* Library parameters from the options; a knob of a mode not chosen is an
 * error (it would be ignored). 0, or -1 with a message. */
int cli_prefill_params(const cli_prefill_opts *o, sparq_prefill_params *out, char *err, size_t err_size);

/* The options the user gave that the policy --attn does not read, as an
 * error ("--sparq-r is a sparq option; --attn is dense"): for commands that
 * run one policy. Returns 0 or -1 with message. */
int cli_attn_check_policy(const attn_opts *o, char *err, size_t err_size);

/* Resolves -m (or the default model) through the search path and loads
 * it; on failure prints the error (with download advice) and returns NULL. */
sparq_model *cli_load_model(const cli_model_opts *o, char *path_out, size_t path_size);

/* The chat template to use: `given` (--chat-template) if set, else NULL
 * (the model's own) when the model has a recognised one, else "chatml"
 * with a note on stderr, as llama-cli and llama-server fall back. */
const char *cli_chat_template(const sparq_model *m, const char *given);

/* 0 if path is a regular file or absent; else prints "error: 'P' is a
 * FIFO, not a regular file" and returns -1 (a FIFO would block). */
int cli_check_regular(const char *path);

/* KV type from its name; -1 if unknown. */
int cli_kv_type(const char *name);

/* Prefill progress on stderr, the user pointer of
 * sparq_context_params.progress. On a terminal one line rewritten in place
 * after every batch; otherwise (a log file, a pipe) a whole line after
 * the first batch, then every `interval` seconds and at the end, so a long prompt shows it is moving
 * without filling the log. Each gives tokens done / total, the rate since
 * cli_progress_start and the ETA at that rate. */
typedef struct cli_progress {
    int    tty;            /* stderr is a terminal                        */
    double interval;       /* seconds between lines when not a tty        */
    double t0, t_last;     /* start of this prefill, last line printed    */
    int    lines;          /* lines printed since cli_progress_start      */
} cli_progress;

/* Starts timing a prefill: call right before the sparq_eval it watches.
 * The interval is $SPARQ_PROGRESS_SECONDS if set (>= 0), else 5 s. */
void cli_progress_start(cli_progress *p);
void cli_prefill_progress(void *user, int64_t done, int64_t total);
/* The same for reading a file (bytes done / total, MB/s, ETA). */
void cli_read_progress(void *user, int64_t done, int64_t total);

/* Private (anonymous) resident memory of this process now, in bytes (-1
 * if unknown): what a cache mapped from a file does not count in. */
int64_t cli_rss_anon(void);
/* Peak resident set size of this process in bytes. */
int64_t cli_peak_rss(void);
double  cli_now(void);      /* monotonic seconds */

/* Writes s as a JSON string literal (quotes and escapes). */
void cli_json_str(FILE *f, const char *s, size_t n);

/* Subcommands: argc/argv start after the subcommand name. */
int cli_run(int argc, char **argv);
int cli_gen_model(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_bench_grammar(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_eval_prefill(int argc, char **argv); /* eval prefill-fidelity */
int cli_stats(int argc, char **argv);
int cli_prefill(int argc, char **argv);
int cli_import(int argc, char **argv);
int cli_topk(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_embed(int argc, char **argv);

#endif
