/* bench_attn.c - `bench attn`: the decode attention operation alone
 * (bench_run.h), every policy configuration at every shape, context length
 * and thread count, on a cache filled once per shape for the largest S
 * that fits in memory.
 */
#include "bench/bench_impl.h"
#include "util/err.h"
#include "util/sysmem.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef struct attn_job {
    const attn_policy *pol;
    void *state;
    const sparq_attn_params *p;
    const kv_cache *kv;
    int B, kvh, g, threads;
    int64_t S;
    const float *q;       /* [B][kvh][g][d] */
    float *out;           /* [B][kvh][g][d] */
    float *sf;            /* [threads][n_scratch] */
    int32_t *si;          /* [threads][n_scratch] */
    size_t n_scratch;
    attn_counts *counts;  /* [B * kvh] */
    char err[256];        /* the first failing call's message */
} attn_job;

/* One benchmark call: every (b, kv_head) pair through the policy, pairs
 * spread over the threads as the model's decode step spreads KV heads.
 * Returns 0, or -1 with the first failure's message in j->err. */
static int attn_call(attn_job *j)
{
    const int pairs = j->B * j->kvh, d = j->kv->d;
    int failed = 0;
#pragma omp parallel num_threads(j->threads)
    {
        const int tid = omp_get_thread_num();
        char e[256] = "";
        attn_scratch s = { .f = j->sf + (size_t)tid * j->n_scratch, .n_f = j->n_scratch,
                           .i = j->si + (size_t)tid * j->n_scratch, .err = e, .err_size = sizeof e };
#pragma omp for schedule(static)
        for (int i = 0; i < pairs; i++) {
            const int b = i / j->kvh, h = i % j->kvh;
            attn_kv_view v;
            kv_view(j->kv, b, h, j->S, &v);
            const size_t off = (size_t)i * j->g * d;
            j->counts[i].read = j->counts[i].written = 0;
            const attn_step step = { .layer = b, .kv_head = h, .kv = &v, .q = j->q + off, .g = j->g,
                                     .out = j->out + off, .scratch = &s, .counts = &j->counts[i] };
            if (j->pol->attend(j->state, j->p, &step)) {
#pragma omp critical(attn_call_error)
                if (!failed) {
                    failed = 1;
                    err_set(j->err, sizeof j->err, "%s", e[0] ? e : "failed");
                }
            }
        }
    }
    return failed ? -1 : 0;
}

typedef struct attn_point {
    int B, H, kvh, d, threads, kv_elem;
    int64_t S;
} attn_point;

/* Times one policy configuration at one point; fills row (without the
 * speed-up, which the caller sets against its dense row). */
static int measure_attn(const bench_opts *o, const kv_cache *kv, const attn_policy *pol,
                        const sparq_attn_params *p, const attn_point *pt, float *flush_buf,
                        size_t flush_n, bench_row *row, char *err, size_t err_size)
{
    const int g = pt->H / pt->kvh, d = pt->d, pairs = pt->B * pt->kvh;
    const size_t nq = (size_t)pt->B * pt->H * d;
    size_t n_scratch = attn_pad16(pol->scratch_floats(p, pt->S, d, g));
    attn_job j = { .pol = pol, .p = p, .kv = kv, .B = pt->B, .kvh = pt->kvh, .g = g,
                   .threads = pt->threads, .S = pt->S, .n_scratch = n_scratch };
    float *q = bench_alloc64(nq * sizeof(float)), *out = bench_alloc64(nq * sizeof(float));
    j.sf = bench_alloc64((size_t)pt->threads * n_scratch * sizeof(float));
    j.si = bench_alloc64((size_t)pt->threads * n_scratch * sizeof(int32_t));
    j.counts = malloc((size_t)pairs * sizeof *j.counts);
    double *t = malloc((size_t)o->reps * 2 * sizeof(double));
    int rc = -1;
    if (!q || !out || !j.sf || !j.si || !j.counts || !t) {
        err_set(err, err_size, "attn: out of memory (scratch %zu floats x %d threads)", n_scratch, pt->threads);
        goto done;
    }
    if (pol->state_create) {
        attn_shape shape = { pt->B, pt->kvh, g, d, kv->cap };
        if (pol->state_create(p, &shape, &j.state)) {
            err_set(err, err_size, "attn: cannot create %s state for %lld positions", pol->name,
                    (long long)kv->cap);
            goto done;
        }
    }
    j.q = q;
    j.out = out;
    bench_rng rng;
    bench_rng_seed(&rng, o->seed * 0x9E3779B97F4A7C15ull + 12345);

    /* warm-up: the first call's counts are the bytes a call moves; the
     * last one's time sets how many calls make one sample */
    double t_call = 0;
    int64_t counted = 0;
    for (int w = 0; w < (o->warmup > 0 ? o->warmup : 1); w++) {
        bench_query(&rng, q, pt->B * pt->H, d, o->heavy);
        double t0 = bench_now();
        if (attn_call(&j)) {
            err_set(err, err_size, "attn: %s: %s", pol->name, j.err);
            goto done;
        }
        t_call = (bench_now() - t0) * 1e6;
        if (w == 0) counted = bench_counted_bytes(j.counts, pairs, pt->kv_elem);
    }
    int inner = t_call > 0 ? (int)ceil(o->min_sample_us / t_call) : 1;
    if (inner < 1 || o->flush) inner = 1;
    if (inner > 10000) inner = 10000;
    volatile float sink = 0;
    int call_failed = 0;
    for (int rep = 0; rep < o->reps; rep++) {
        bench_query(&rng, q, pt->B * pt->H, d, o->heavy);
        if (flush_buf) sink += bench_sum_f32(flush_buf, flush_n);
        double t0 = bench_now();
        for (int i = 0; i < inner; i++) call_failed |= attn_call(&j);
        t[rep] = (bench_now() - t0) * 1e6 / inner;
        sink += out[0];
    }
    (void)sink;
    if (call_failed) {
        err_set(err, err_size, "attn: %s: %s", pol->name, j.err);
        goto done;
    }

    bench_row_init(row, BENCH_ATTN);
    snprintf(row->policy, sizeof row->policy, "%s", pol->name);
    row->B = pt->B;
    row->H = pt->H;
    row->kv_heads = pt->kvh;
    row->d = d;
    row->S = pt->S;
    bench_row_params(row, pol, p);
    row->threads = pt->threads;
    row->kv_elem = pt->kv_elem;
    row->heavy_query = o->heavy;
    row->inner = inner;
    bench_stats_of(t, o->reps, t + o->reps, &row->us);
    row->bytes_counted = counted;
    row->bytes_formula = bench_formula_bytes(pol, p, pt->S, d, g, pairs, pt->kv_elem);
    row->bytes_dense = bench_formula_bytes(attn_policy_find("dense"), p, pt->S, d, g, pairs, pt->kv_elem);
    row->gbps = bench_gbps((double)counted, row->us.median);
    row->theoretical_ratio = bench_ratio((double)row->bytes_formula, (double)row->bytes_dense);
    rc = 0;
done:
    if (j.state && pol->state_free) pol->state_free(j.state);
    free(q);
    free(out);
    free(j.sf);
    free(j.si);
    free(j.counts);
    free(t);
    return rc;
}

typedef struct bw_ref { int threads; double gbps; } bw_ref;

static double bw_for(const bw_ref *bw, int n_bw, int threads)
{
    for (int i = 0; i < n_bw; i++)
        if (bw[i].threads == threads) return bw[i].gbps;
    return NAN;
}

/* What every shape of an attn sweep shares. */
typedef struct attn_sweep {
    const bench_opts *o;
    const int64_t *S;      /* ascending */
    int n_S;
    const int64_t *threads;
    int n_threads;
    const bench_pol_cfg *cfg;    /* cfg[0] is dense */
    int n_cfg;
    unsigned needs;        /* union of the policies' cache needs */
    const bw_ref *bw;
    int n_bw;
    float *flush;          /* NULL unless --flush */
    size_t flush_n;
} attn_sweep;

/* Every policy at every thread count on one cache, S ascending. */
static int sweep_S(const attn_sweep *w, kv_cache *kv, attn_point pt, int n_fit, const char *kv_name,
                   bench_rows *rl, char *err, size_t err_size)
{
    int64_t filled = 0;
    for (int iS = 0; iS < n_fit; iS++) {
        pt.S = w->S[iS];
        double t0 = bench_now();
        if (bench_fill_kv(kv, filled, pt.S, w->o->seed, omp_get_num_procs())) {
            return err_set(err, err_size, "attn: out of memory filling the cache");
        }
        if (pt.S - filled > 65536)
            fprintf(w->o->log, "attn: filled %lld positions in %.1f s\n", (long long)(pt.S - filled), bench_now() - t0);
        filled = pt.S;
        for (int it = 0; it < w->n_threads; it++) {
            pt.threads = (int)w->threads[it];
            double dense_us = NAN;
            for (int c = w->o->skip_dense ? 1 : 0; c < w->n_cfg; c++) {
                sparq_attn_params p;
                char e[256];
                if (bench_cfg_params(&w->cfg[c], pt.S, pt.d, &p, e, sizeof e)) {
                    fprintf(w->o->log, "attn: skipping %s at S=%lld d=%d: %s\n", w->cfg[c].pol->name,
                            (long long)pt.S, pt.d, e);
                    continue;
                }
                bench_row *row = bench_rows_push(rl);
                if (!row) {
                    return err_set(err, err_size, "out of memory");
                }
                if (measure_attn(w->o, kv, w->cfg[c].pol, &p, &pt, w->flush, w->flush_n, row, err, err_size)) {
                    rl->n--; /* nothing measured: not a row to report */
                    return -1;
                }
                if (c == 0) dense_us = row->us.median;
                row->speedup_vs_dense = bench_speedup(dense_us, row->us.median);
                double ref = bw_for(w->bw, w->n_bw, pt.threads);
                if (ref > 0) row->pct_bw = 100.0 * row->gbps / ref;
                fprintf(w->o->log, "attn: %-9s r=%-3d k=%-5d B=%d H=%d kv=%d d=%d S=%-7lld t=%d %s: %10.1f us  "
                        "%6.2f GB/s  x%.2f (theory x%.2f)\n", row->policy, row->r, row->k, pt.B, pt.H, pt.kvh,
                        pt.d, (long long)pt.S, pt.threads, kv_name, row->us.median, row->gbps,
                        row->speedup_vs_dense, 1.0 / row->theoretical_ratio);
            }
        }
    }
    return 0;
}

/* One shape (B, H, KV heads, d, element type): a cache for the largest S
 * that fits in memory, then the S sweep on it. */
static int sweep_shape(const attn_sweep *w, attn_point pt, const char *kv_name, bench_rows *rl, char *err,
                       size_t err_size)
{
    if (pt.H % pt.kvh != 0) {
        fprintf(w->o->log, "attn: skipping H=%d kv-heads=%d (H must be a multiple of the KV heads)\n", pt.H, pt.kvh);
        return 0;
    }
    /* K, V (and K^T) of every sequence, keeping 30% of the available
     * memory for everything else */
    const int with_kt = !!(w->needs & ATTN_NEEDS_KT);
    const double per_pos = (double)pt.B * pt.kvh * (double)attn_kv_row_bytes(pt.kv_elem, pt.d) * (2 + with_kt);
    const int64_t avail = sysmem_available();
    int n_fit = w->n_S;
    if (avail > 0)
        while (n_fit > 0 && per_pos * (double)w->S[n_fit - 1] > 0.7 * (double)avail) n_fit--;
    for (int i = n_fit; i < w->n_S; i++)
        fprintf(w->o->log, "attn: skipping S=%lld for B=%d kv-heads=%d d=%d %s: needs %.1f GiB, %.1f GiB available\n",
                (long long)w->S[i], pt.B, pt.kvh, pt.d, kv_name, per_pos * (double)w->S[i] / (1 << 30),
                (double)avail / (1 << 30));
    if (n_fit == 0) return 0;
    kv_cache kv;
    if (kv_create(&kv, pt.B, pt.kvh, pt.d, w->S[n_fit - 1], pt.kv_elem, with_kt,
                  !!(w->needs & ATTN_NEEDS_VSUM), err, err_size))
        return -1;
    int rc = sweep_S(w, &kv, pt, n_fit, kv_name, rl, err, err_size);
    kv_free(&kv);
    return rc;
}

/* --membw: the read bandwidth of every thread count, the best of one and
 * four streams per thread (the roofline %bw is stated against); its rows
 * go to rl. */
static int roofline(const bench_opts *o, const int64_t *ts, int nt, bw_ref *bw, int *n_bw, bench_rows *rl,
                    char *err, size_t err_size)
{
    for (int i = 0; i < nt; i++) {
        bw[*n_bw].threads = (int)ts[i];
        bw[*n_bw].gbps = 0;
        for (int streams = 1; streams <= 4; streams += 3) {
            bench_row *row = bench_rows_push(rl);
            if (!row) {
                return err_set(err, err_size, "out of memory");
            }
            if (bench_measure_membw((int64_t)512 << 20, (int)ts[i], streams, 5, 1, row, err, err_size)) {
                rl->n--; /* nothing measured: not a row to report */
                return -1;
            }
            if (row->gbps > bw[*n_bw].gbps) bw[*n_bw].gbps = row->gbps;
            fprintf(o->log, "membw: %d thread(s), %d stream(s): %.2f GB/s\n", (int)ts[i], streams, row->gbps);
        }
        (*n_bw)++;
    }
    return 0;
}

int bench_attn_run(const bench_opts *o, bench_rows *rl, char *err, size_t err_size)
{
    enum { M = BENCH_MAX_LIST };
    int64_t Bs[M], Hs[M], KVs[M], ds[M], Ss[M], ts[M];
    const char *kv_names[4];
    char kv_buf[64], names_buf[512], ratio_buf[256];
    char def_t[16];
    snprintf(def_t, sizeof def_t, "%d", omp_get_num_procs());
    int nB = bench_int_list("--B", o->B, "1", 1, 4096, Bs, M, err, err_size);
    int nH = nB < 0 ? -1 : bench_int_list("--H", o->H, "32", 1, 4096, Hs, M, err, err_size);
    int nKV = nH < 0 ? -1 : bench_int_list("--kv-heads", o->kv_heads, "8", 1, 4096, KVs, M, err, err_size);
    int nd = nKV < 0 ? -1 : bench_int_list("--d", o->d, "128", 1, 1024, ds, M, err, err_size);
    int nS = nd < 0 ? -1 : bench_int_list("--S", o->S, "1k,4k,16k,32k", 1, (int64_t)1 << 31, Ss, M, err, err_size);
    int nt = nS < 0 ? -1 : bench_int_list("-t", o->threads, def_t, 1, 1024, ts, M, err, err_size);
    if (nt < 0) return -1;
    nS = bench_sort_unique(Ss, nS);
    int nkv = bench_split_names(o->kv_type ? o->kv_type : "f16", kv_buf, sizeof kv_buf, kv_names, 4, err, err_size);
    if (nkv < 0) return -1;
    int kv_elems[4];
    if (bench_kv_elem_list(kv_names, nkv, kv_elems, err, err_size)) return -1;
    bench_pol_cfg cfg[BENCH_MAX_CFG];
    int ncfg = bench_build_cfgs(o, cfg, names_buf, sizeof names_buf, ratio_buf, sizeof ratio_buf, err, err_size);
    if (ncfg < 0) return -1;
    bw_ref bw[BENCH_MAX_LIST];
    attn_sweep w = { .o = o, .S = Ss, .n_S = nS, .threads = ts, .n_threads = nt, .cfg = cfg, .n_cfg = ncfg,
                     .bw = bw, .flush_n = (size_t)64 << 20 >> 2 };
    for (int c = 0; c < ncfg; c++) w.needs |= cfg[c].pol->needs;

    if (o->membw && roofline(o, ts, nt, bw, &w.n_bw, rl, err, err_size)) return -1;
    if (o->flush) {
        if (!(w.flush = bench_alloc64(w.flush_n * sizeof(float)))) {
            return err_set(err, err_size, "--flush: cannot allocate 64 MiB");
        }
        memset(w.flush, 0, w.flush_n * sizeof(float));
    }
    int rc = 0;
    for (int ie = 0; ie < nkv && rc == 0; ie++)
        for (int iB = 0; iB < nB && rc == 0; iB++)
            for (int iH = 0; iH < nH && rc == 0; iH++)
                for (int iK = 0; iK < nKV && rc == 0; iK++)
                    for (int id = 0; id < nd && rc == 0; id++) {
                        attn_point pt = { (int)Bs[iB], (int)Hs[iH], (int)KVs[iK], (int)ds[id], 0,
                                          kv_elems[ie], 0 };
                        rc = sweep_shape(&w, pt, kv_names[ie], rl, err, err_size);
                    }
    free(w.flush);
    return rc;
}

