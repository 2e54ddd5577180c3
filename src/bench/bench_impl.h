/* bench_impl.h - what the timing runs (bench_attn.c, bench_membw.c,
 * bench_decode.c) share: the policy configurations a sweep runs, the
 * KV-type names and aligned buffers. Defined in bench_cfg.c (the membw
 * measurement in bench_membw.c); only bench files include this header.
 */
#ifndef SPARQ_BENCH_IMPL_H
#define SPARQ_BENCH_IMPL_H

#include "bench/bench_run.h"

#include <stddef.h>
#include <stdint.h>

enum { BENCH_MAX_CFG = 64 };

/* One policy with one parameter choice; ratio != NULL: SparQ r, k picked
 * per context length (attn_opts_params). */
typedef struct bench_pol_cfg {
    const attn_policy *pol;
    sparq_attn_params  p;
    const char        *ratio;
} bench_pol_cfg;

/* The configurations of --attn and its knobs (comma lists sweep), dense
 * first: every other row's speed-up is measured against it. names_buf and
 * ratio_buf hold the split names the configurations point into. Returns
 * the count, or -1 with a message. */
int bench_build_cfgs(const bench_opts *o, bench_pol_cfg *cfg, char *names_buf, size_t names_size,
                     char *ratio_buf, size_t ratio_size, char *err, size_t err_size);
/* Parameters of cfg for context S and head size d, defaults filled. */
int bench_cfg_params(const bench_pol_cfg *c, int64_t S, int d, sparq_attn_params *out, char *err, size_t err_size);
/* Fills row's r, k, l with the parameters that mean something for the policy. */
void bench_row_params(bench_row *row, const attn_policy *pol, const sparq_attn_params *p);

/* The SPARQ_KV_* of a --kv-type name (NULL: f16); -1 if unknown. */
int bench_kv_type_of(const char *name);
/* The attn.h element types of --kv-type's names; -1 naming a bad one. */
int bench_kv_elem_list(const char *const *names, int n, int *out, char *err, size_t err_size);

/* 64-byte aligned, size rounded up to 64 (free()); NULL when out of memory. */
void *bench_alloc64(size_t bytes);

/* Times `reps` sequential reads of `bytes` over `threads` threads, each
 * thread reading its share as `streams` interleaved sequential streams, into
 * row (a BENCH_MEMBW row). 0, or -1 with a message. */
int bench_measure_membw(int64_t bytes, int threads, int streams, int reps, int warmup, bench_row *row, char *err,
                        size_t err_size);

#endif
