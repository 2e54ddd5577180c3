/* bench_run.h - the timing runs behind `sparq bench`, one file per mode.
 *
 *   attn    (bench_attn.c) the decode attention operation alone, as the
 *           SparQ paper's microbenchmarks (section 6, appendix F): a KV
 *           cache of B sequences (one cache "layer" per batch element)
 *           filled with N(0,1) keys and values (bench_fill_kv: stored as
 *           each --kv-type stores them, Q8_0 blocks included; byte columns
 *           in that type's bytes), one call = every (b, kv_head) pair
 *           through policy->attend, spread over threads with OpenMP as the
 *           model's decode step does; warm-up, then timed repetitions with
 *           a fresh random query each.
 *   membw   (bench_membw.c) sequential read bandwidth (sum of a large f32
 *           array), so the attention rows can be stated as a share of the
 *           roofline.
 *   decode  (bench_decode.c) end-to-end tokens/s of the real decode path at
 *           context depths (as llama-bench -d), the cache filled by a real
 *           prefill of a synthetic token sequence or, with --fill random,
 *           by sparq_context_fill_random (timing only: outputs meaningless).
 *           Weights vs attention: the same policy's ms/token at depth 0 is
 *           the weights-only baseline, the rest is attributed to attention.
 *   prefill (bench_prefill.c) prompt processing tokens/s (pp N at depth D,
 *           as llama-bench -p N -d D) with the GFLOP/s it implies.
 *   peak    (bench_prefill.c) the machine's measured int8 (vpdpbusd) and
 *           f32 (FMA) peak and the prefill GEMM tile's rate, the roofline
 *           for the prefill rows.
 *
 * The command (src/cli/cli_bench.c) parses options into the structs below
 * and prints the rows; everything between is here. Progress lines go to
 * the FILE `log` the caller hands in (the command: stderr); nothing here
 * writes to stdout. A run that fails part-way keeps the rows it measured
 * (the caller reports them) and returns -1 with a one-line message.
 */
#ifndef SPARQ_BENCH_RUN_H
#define SPARQ_BENCH_RUN_H

#include <stdint.h>
#include <stdio.h>
#include "bench/bench.h"
#include "sparq.h"

/* Most values one comma list may hold. */
enum { BENCH_MAX_LIST = 64 };

/* ---- attn, membw, decode ----------------------------------------------------- */

/* The options of `bench attn | membw | decode`, as given: comma lists stay
 * text (bench_parse_list reads them, so the messages name the option);
 * NULL means the default the help states. */
typedef struct bench_opts {
    /* attn shapes (comma lists) */
    const char *B, *H, *kv_heads, *d, *S, *threads, *kv_type;
    int heavy, flush, membw, skip_dense;
    /* policies */
    const char *attn, *r, *k, *attn_k, *ratio, *select;
    int l, no_realloc, n_sink;
    /* repetition */
    int reps, warmup, min_sample_us;
    uint64_t seed;
    /* membw */
    int64_t size_mib;
    const char *streams;
    /* decode */
    const char *model, *depth, *fill, *parallel;
    int n_tokens, n_batch;
    int rounds;              /* --rounds: interleaved rounds of -n steps  */
    int use_mmap;            /* --mmap */
    int no_repack;           /* --no-repack */
    /* output */
    int json, csv;
    const char *plot, *title;
    FILE *log;               /* progress lines (the command: stderr)      */
} bench_opts;

/* The defaults the help states (l -1: k/4; reps 10, warmup 2, ...), log
 * stderr. */
void bench_opts_init(bench_opts *o);

/* A growable array of result rows (owned; bench_rows_free). */
typedef struct bench_rows { bench_row *v; int n, cap; } bench_rows;
/* A new row at the end (uninitialised), or NULL when out of memory. */
bench_row *bench_rows_push(bench_rows *rl);
void bench_rows_free(bench_rows *rl);

/* Each appends its rows to rl in the order measured; 0, or -1 with a
 * message (rows measured before the failure stay in rl). */
int bench_attn_run(const bench_opts *o, bench_rows *rl, char *err, size_t err_size);
int bench_membw_run(const bench_opts *o, bench_rows *rl, char *err, size_t err_size);

/* decode in two steps, so bad options are reported before the model is
 * loaded: bench_decode_prepare checks and resolves the options into *plan
 * (which keeps pointers into o: o must outlive it), bench_decode_run
 * measures every (KV type, threads, sequences, policy, depth) point on m,
 * whose file name (no directory) is model_name. */
typedef struct bench_decode_plan bench_decode_plan;
int  bench_decode_prepare(const bench_opts *o, bench_decode_plan **plan, char *err, size_t err_size);
int  bench_decode_run(const bench_decode_plan *plan, sparq_model *m, const char *model_name, bench_rows *rl,
                      char *err, size_t err_size);
void bench_decode_plan_free(bench_decode_plan *plan);

/* ---- prefill, peak ------------------------------------------------------------ */

/* One result line of `bench prefill` or `bench peak`. */
typedef struct bench_pp_row {
    char   test[32];     /* "pp512" / "int8-vnni" ...                  */
    char   model[64];
    char   type[16];     /* weight type of the FFN down matrix, or "-"  */
    int64_t n_prompt, depth;
    int    threads, reps;
    double ms, ms_min, ms_max;   /* per prompt (prefill) or per loop     */
    double tok_s, gflop, gflop_s;
} bench_pp_row;

enum { BENCH_PP_MAX_REPS = 64 };

/* What `bench prefill` measures: every thread count x depth x prompt
 * length (lists as parsed), reps (1..BENCH_PP_MAX_REPS) timed prompts after
 * warmup untimed ones, the cache reset and refilled to the depth (untimed)
 * before each, as llama-bench -d does. */
typedef struct bench_prefill_cfg {
    const int64_t *prompts, *depths, *threads;
    int n_prompts, n_depths, n_threads;
    int kv_type;             /* SPARQ_KV_F16 or SPARQ_KV_F32             */
    int n_batch, reps, warmup;
    FILE *log;
} bench_prefill_cfg;

/* Measures on m (file name model_name) into rows[0..*n_rows), room for
 * n_prompts x n_depths x n_threads. 0, or -1 with a message (the rows
 * measured so far stay). */
int bench_prefill_run(const bench_prefill_cfg *c, sparq_model *m, const char *model_name, bench_pp_row *rows,
                      int *n_rows, char *err, size_t err_size);

/* `bench peak`: for every thread count threads[0..n_threads) (ascending,
 * distinct), the int8 and f32 register-loop peak (each thread its own
 * loop, `iters` rounds) and one prefill GEMM tile loop (Q8_0, a 64-row
 * panel against 64 tokens of 2048) per thread, kernel only. A loop this
 * build lacks is skipped with a note on log. rows: room for 3 x
 * n_threads. 0, or -1 with a message (then no row is valid). */
int bench_peak_run(const int64_t *threads, int n_threads, int reps, int warmup, int64_t iters, FILE *log,
                   bench_pp_row *rows, int *n_rows, char *err, size_t err_size);

/* ---- shared by the runs ---------------------------------------------------------- */

double bench_now(void);      /* monotonic seconds */

/* A list option: bench_parse_list of s (def when s is NULL) into
 * out[0..max), every value in [lo, hi]. Returns the count, or -1 with a
 * message naming the option `name`. */
int bench_int_list(const char *name, const char *s, const char *def, int64_t lo, int64_t hi, int64_t *out, int max,
                   char *err, size_t err_size);
/* Sorts v[0..n) ascending and drops duplicates; returns the new count. */
int bench_sort_unique(int64_t *v, int n);

/* Brings the context to `depth` positions: a real prefill of a fixed
 * pseudo-random token sequence (seeded; no BOS: timing only), or random
 * keys and values (random_fill). 0, or -1 with a message. */
int bench_fill_context(sparq_context *c, int64_t depth, int random_fill, int n_vocab, uint64_t seed, char *err,
                       size_t err_size);

#endif
