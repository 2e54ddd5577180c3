/* bench_topk.h - top-k attention over a synthetic prefix of a real model
 * shape, decoded from a KV cache file (`sparq bench-topk`).
 *
 * For each index kind the command writes an N-token prefix (every layer
 * and KV head of the shape) with that kind's indexes as a KV cache file
 * (bench_topk_write: kvf_write_heads, K, V and the index images of each
 * head), then decodes `tokens` steps from it in a fresh process
 * (bench_topk_spawn running bench_topk_decode there, so its peak RSS is
 * the decode's alone): attention only, no weights. The decode measures
 * seconds per token (all layers' attention, the new token's K/V append
 * included), recall@k of the index against exact top-k on sampled (layer,
 * head) pairs, and whether every planted needle was retrieved.
 *
 * Synthetic data, per (layer, KV head), all from the seed:
 *   scales    s_j = exp(aniso z_j), z ~ N(0, 1), mean square 1: a few
 *             dimensions dominate, as in real keys and queries;
 *   keys      C cluster centres s * N(0, I); positions come in runs of 64
 *             from one random cluster (topics), key = centre + spread * s *
 *             noise (noise: sum of 4 uniforms, unit variance);
 *   values    the same noise, unscaled;
 *   queries   per query head and step an independent random cluster j:
 *             q = 4 (c_j / |c_j| + 0.5 noise / sqrt(d)), so the g heads of a
 *             group look at different places (the union an index scans for
 *             a group is about g times one head's);
 *   needles   M needles at evenly spread depths, each in its own (layer,
 *             head, query head) slot: key = c_j + beta u + spread * s * noise,
 *             u a unit vector orthogonal to its cluster's centre c_j and beta
 *             8 standard deviations of u . k over the keys plus 2; the slot's
 *             query is 4 (0.5 c_j / |c_j| + u + 0.5 noise / sqrt(d)) at every
 *             step, so the needle is its exact top-1 by a wide margin while
 *             staying inside its cluster (an inverted file can find it).
 * Peak RSS counts the file's pages the decode mapped (page cache, shared
 * and reclaimable) as well as private memory; anon bytes are the private
 * part at the end of the run.
 */
#ifndef SPARQ_BENCH_TOPK_H
#define SPARQ_BENCH_TOPK_H

#include <stdint.h>
#include <stdio.h>
#include "sparq.h"

/* A model shape the prefix imitates. */
typedef struct bench_topk_shape {
    const char *name;
    int n_layer, n_head, n_kv_head, d;
} bench_topk_shape;

/* The shape called name ("llama-3.2-1b", "llama-3-8b", "smollm2-135m",
 * "tiny"), or NULL. */
const bench_topk_shape *bench_topk_shape_find(const char *name);

/* The SPARQ_KEY_* of an index key type name (NULL: f16; "bf16", "i8" or
 * "int8"), or -1. */
int bench_topk_key_type(const char *name);

/* The data and the decode, as checked by the caller (shape found, P >= 2,
 * k, tokens, clusters >= 1, needles within the shape's slots, ...). */
typedef struct bench_topk_params {
    const bench_topk_shape *shape;
    int64_t  P;              /* prefix positions                          */
    int      clusters, needles;
    float    spread, aniso;
    uint64_t seed, qseed;    /* data; the decode steps' queries           */
    int      k, key_type;    /* positions per query head; SPARQ_KEY_*     */
    int      nlist, nprobe, ef; /* ivf / hnsw knobs (0: the defaults)     */
    int      tokens, warmup, threads, recall_heads;
} bench_topk_params;

/* The topk policy's parameters for index kind `kind`. */
sparq_attn_params bench_topk_attn_params(const bench_topk_params *p, const char *kind);

/* Whether the topk policy takes kind with these parameters at the shape's
 * head size: 0, or -1 with its message. */
int bench_topk_check(const bench_topk_params *p, const char *kind, char *err, size_t err_size);

/* Writes the prefix and kind's indexes to path (room for the decode's
 * steps); *build_s: index build seconds summed over heads. 0, or -1 with
 * a message. */
int bench_topk_write(const bench_topk_params *p, const char *kind, const char *path, double *build_s, char *err,
                     size_t err_size);

/* What a decode reports (passed as bytes through a pipe to the parent). */
typedef struct bench_topk_result {
    int     ok;
    double  s_per_token, s_first, s_open;
    double  recall;
    int64_t recall_hits, recall_total;
    int     needles_found, needles_total;
    int64_t elements, dense_elements; /* per token, all layers and heads */
    int     nominal;                  /* elements include a nominal index
                                         figure (hnsw: Faiss counts nothing) */
    double  index_seconds;            /* binding the file's indexes        */
    int64_t rss_anon, rss_file;       /* at the end: private memory, mapped file pages */
    int64_t majflt, read_bytes;       /* over the timed steps: major faults, bytes from disk */
    int     verified;
    char    err[256];
} bench_topk_result;

/* Decodes warmup + tokens steps from the file at path (written by
 * bench_topk_write with the same data parameters; a kept file of another
 * size or room is refused) with index kind `kind`. Fills *res (res->ok,
 * or res->err); returns 0 or -1. */
int bench_topk_decode(const bench_topk_params *p, const char *path, const char *kind, bench_topk_result *res);

/* Builds the argument vector of the child (args[0] is what is executed),
 * which must write its bench_topk_result to file descriptor fd; at most
 * BENCH_TOPK_MAX_ARGS entries plus the NULL. */
enum { BENCH_TOPK_MAX_ARGS = 47 };
typedef void (*bench_topk_child_args)(void *user, int fd, const char **args);

/* Runs the child build(user, fd, args) describes, reads its result into
 * *res and its peak RSS (bytes) into *peak_rss. 0, or -1 with a message
 * naming kind (also when the child died or reported a failure). */
int bench_topk_spawn(bench_topk_child_args build, void *user, const char *kind, bench_topk_result *res,
                     int64_t *peak_rss, char *err, size_t err_size);

#endif
