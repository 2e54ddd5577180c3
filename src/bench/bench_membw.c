/* bench_membw.c - `bench membw`: sequential read bandwidth, the roofline
 * the attention rows are stated against (bench_run.h).
 */
#include "bench/bench_impl.h"
#include "util/err.h"

#include <omp.h>
#include <stdlib.h>
#include <sys/mman.h>

/* The array sits in transparent huge pages, as the model's weights and the
 * KV cache do, so the TLB does not cap it below what decode reaches. Each
 * thread reads its share as `streams` interleaved sequential streams (4 KiB
 * from each in turn: more streams keep more prefetchers and DRAM banks
 * busy). */
int bench_measure_membw(int64_t bytes, int threads, int streams, int reps, int warmup, bench_row *row, char *err,
                        size_t err_size)
{
    const size_t huge = (size_t)2 << 20;
    const size_t n = (size_t)bytes / sizeof(float);
    float *x = NULL;
    const size_t alloc = (n * sizeof(float) + huge - 1) / huge * huge;
    if (posix_memalign((void **)&x, huge, alloc)) x = NULL;
    double *t = malloc((size_t)(reps > 0 ? reps : 1) * 2 * sizeof(double));
    if (!x || !t) {
        err_set(err, err_size, "membw: cannot allocate %lld MiB", (long long)(bytes >> 20));
        free(x);
        free(t);
        return -1;
    }
    madvise(x, alloc, MADV_HUGEPAGE); /* advice only: without it the read still works */
    /* first touch with the threads that will read (page placement) */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
    volatile float sink = 0;
    enum { BLOCK = 1024 }; /* floats per turn of a stream: 4 KiB */
    for (int rep = -warmup; rep < reps; rep++) {
        double t0 = bench_now();
        float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            const int nt = omp_get_num_threads(), id = omp_get_thread_num();
            const size_t chunk = (n / (size_t)nt + 15) / 16 * 16;
            size_t lo = (size_t)id * chunk, hi = lo + chunk < n ? lo + chunk : n;
            if (lo < hi) {
                const size_t len = hi - lo;
                const size_t part = (len / (size_t)streams + BLOCK - 1) / BLOCK * BLOCK;
                for (size_t off = 0; off < part; off += BLOCK)
                    for (int s = 0; s < streams; s++) {
                        const size_t a = (size_t)s * part + off;
                        if (a >= len) break;
                        const size_t m = len - a < BLOCK ? len - a : BLOCK;
                        total += bench_sum_f32(x + lo + a, m);
                    }
            }
        }
        double dt = bench_now() - t0;
        sink += total;
        if (rep >= 0) t[rep] = dt * 1e6;
    }
    (void)sink;
    bench_row_init(row, BENCH_MEMBW);
    if (streams == 1) snprintf(row->policy, sizeof row->policy, "read");
    else snprintf(row->policy, sizeof row->policy, "read-x%d", streams);
    row->threads = threads;
    row->kv_elem = KV_F32; /* the array read is f32 */
    bench_stats_of(t, reps, t + reps, &row->us);
    row->bytes_counted = (int64_t)(n * sizeof(float));
    row->gbps = bench_gbps((double)row->bytes_counted, row->us.median);
    free(x);
    free(t);
    return 0;
}

int bench_membw_run(const bench_opts *o, bench_rows *rl, char *err, size_t err_size)
{
    int64_t ts[BENCH_MAX_LIST], ss[BENCH_MAX_LIST];
    char def_t[32];
    snprintf(def_t, sizeof def_t, "1,%d", omp_get_num_procs());
    int nt = bench_int_list("-t", o->threads, def_t, 1, 1024, ts, BENCH_MAX_LIST, err, err_size);
    if (nt < 0) return -1;
    nt = bench_sort_unique(ts, nt);
    int ns = bench_int_list("--streams", o->streams, "1,4", 1, 64, ss, BENCH_MAX_LIST, err, err_size);
    if (ns < 0) return -1;
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < ns; j++) {
            bench_row *row = bench_rows_push(rl);
            if (!row) {
                return err_set(err, err_size, "out of memory");
            }
            if (bench_measure_membw(o->size_mib << 20, (int)ts[i], (int)ss[j], o->reps, o->warmup, row, err,
                                    err_size)) {
                rl->n--; /* nothing measured: not a row to report */
                return -1;
            }
            fprintf(o->log, "membw: %d thread(s), %d stream(s): %.2f GB/s\n", (int)ts[i], (int)ss[j], row->gbps);
        }
    return 0;
}
