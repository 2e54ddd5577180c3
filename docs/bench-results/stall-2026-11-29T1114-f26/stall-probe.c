/* stall-probe.c - does the guest stall while nothing else runs? Two threads
 * (one per vCPU) repeat a fixed slice of work - compute (a dependent FMA
 * chain) and memory (random 64-byte reads over 1 GiB of huge pages) - and
 * record each slice's wall time. A slice taking several times the median
 * is time the vCPU did not run or memory did not answer.
 * usage: stall-probe SECONDS  (prints a summary per thread and mode, and every
 * slice over 5x its median with its time since start) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double t_start, secs;
enum { MAXS = 2000000 };
typedef struct { int cpu; double *dt, *at; int n; uint32_t *mem; size_t words; volatile double sink; } arg;

static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

static void *run(void *p)
{
    arg *a = p;
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(a->cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s);
    uint64_t x = 88172645463325252ull + a->cpu;
    double acc = 1.0;
    while (now() - t_start < secs && a->n < MAXS) {
        const double t0 = now();
        if (a->n % 2 == 0) { /* compute: ~0.5 ms of dependent FMAs */
            for (int i = 0; i < 400000; i++) acc = acc * 0.9999999 + 1e-9;
        } else {             /* memory: 4096 dependent-free random reads */
            uint32_t s2 = 0;
            for (int i = 0; i < 4096; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; s2 += a->mem[(x >> 11) % a->words]; }
            acc += s2;
        }
        const double t1 = now();
        a->dt[a->n] = t1 - t0; a->at[a->n] = t0 - t_start; a->n++;
    }
    a->sink = acc;
    return NULL;
}

int main(int argc, char **argv)
{
    secs = argc > 1 ? atof(argv[1]) : 60;
    const size_t bytes = (size_t)1 << 30;
    uint32_t *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 1;
    madvise(mem, bytes, MADV_HUGEPAGE);
    memset(mem, 1, bytes);
    arg a[2];
    pthread_t th[2];
    t_start = now();
    for (int i = 0; i < 2; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i].cpu = i; a[i].mem = mem; a[i].words = bytes / 4;
        a[i].dt = malloc(MAXS * sizeof(double)); a[i].at = malloc(MAXS * sizeof(double));
        pthread_create(&th[i], NULL, run, &a[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        for (int mode = 0; mode < 2; mode++) {
            int m = 0;
            double *v = malloc(MAXS * sizeof(double));
            for (int j = mode; j < a[i].n; j += 2) v[m++] = a[i].dt[j];
            qsort(v, m, sizeof *v, cmp);
            const double med = v[m / 2];
            double lost = 0; int slow = 0;
            for (int j = mode; j < a[i].n; j += 2)
                if (a[i].dt[j] > 5 * med) { slow++; lost += a[i].dt[j] - med; }
            printf("cpu %d %s: %d slices, median %.3f ms, p99 %.3f ms, p99.9 %.3f ms, max %.1f ms; %d over 5x median, %.1f ms lost (%.2f%% of %.0f s)\n",
                   i, mode ? "memory " : "compute", m, med * 1e3, v[(int)(m * 0.99)] * 1e3, v[(int)(m * 0.999)] * 1e3, v[m - 1] * 1e3,
                   slow, lost * 1e3, 100 * lost / secs, secs);
            for (int j = mode, shown = 0; j < a[i].n && shown < 15; j += 2)
                if (a[i].dt[j] > 20 * med) { printf("  at %.2f s: %.1f ms\n", a[i].at[j], a[i].dt[j] * 1e3); shown++; }
            free(v);
        }
    return 0;
}
