/* cpu.c - feature detection and the one-time choice of the kernel level
 * (cpu.h). */
#include "util/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* the kernel's bit; older headers lack the name */
#endif
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cpu_level_chosen_ = -1;

static cpu_features feats;
static pthread_once_t feats_once = PTHREAD_ONCE_INIT, level_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
/* XCR0: which register states the OS saves on a context switch. */
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}
#endif

/* From cpuid and XCR0 directly (clang's __builtin_cpu_supports knows no
 * "f16c"): a feature counts only if the OS also saves its registers. */
static void detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const int osxsave = c >> 27 & 1, avx = c >> 28 & 1;
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const int ymm = avx && (xcr0 & 0x6) == 0x6;                 /* SSE + AVX state */
    const int zmm = ymm && (xcr0 & 0xe0) == 0xe0;               /* opmask, ZMM0-15 hi, ZMM16-31 */
    feats.fma = ymm && (c >> 12 & 1);
    feats.f16c = ymm && (c >> 29 & 1);
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned sub_leaves = a;
    feats.avx2 = ymm && (b >> 5 & 1);
    feats.bmi2 = b >> 8 & 1;
    feats.avx512f = zmm && (b >> 16 & 1);
    feats.avx512dq = zmm && (b >> 17 & 1);
    feats.avx512bw = zmm && (b >> 30 & 1);
    feats.avx512vl = zmm && (b >> 31 & 1);
    feats.avx512vnni = zmm && (c >> 11 & 1);
    if (sub_leaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        feats.avx512bf16 = zmm && (a >> 5 & 1);
    }
#elif defined(__aarch64__)
    feats.neon = 1; /* Advanced SIMD is part of every ARMv8-A core */
    /* the kernel reports sdot/udot only if it lets user space run them */
    feats.dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
}

const cpu_features *cpu_features_get(void)
{
    pthread_once(&feats_once, detect);
    return &feats;
}

int cpu_level_supported(cpu_level level)
{
    const cpu_features *f = cpu_features_get();
    const int avx2 = f->avx2 && f->fma && f->f16c && f->bmi2;
    switch (level) {
    case CPU_REF: return 1;
    case CPU_AVX2: return avx2;
    case CPU_AVX512:
        return avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni;
    case CPU_NEON: return f->neon;
    case CPU_NEON_DOTPROD: return f->neon && f->dotprod;
    default: return 0;
    }
}

cpu_level cpu_level_best(void)
{
    if (cpu_level_supported(CPU_NEON_DOTPROD)) return CPU_NEON_DOTPROD;
    if (cpu_level_supported(CPU_NEON)) return CPU_NEON;
    if (cpu_level_supported(CPU_AVX512)) return CPU_AVX512;
    if (cpu_level_supported(CPU_AVX2)) return CPU_AVX2;
    return CPU_REF;
}

static const char *const names[CPU_LEVELS] = { "ref", "avx2", "avx512", "neon", "neon+dotprod" };

const char *cpu_level_name(cpu_level level)
{
    return (unsigned)level < CPU_LEVELS ? names[level] : "?";
}

int cpu_level_parse(const char *name, cpu_level *out)
{
    for (int l = 0; l < CPU_LEVELS; l++)
        if (strcmp(name, names[l]) == 0) {
            *out = (cpu_level)l;
            return 0;
        }
    return -1;
}

char *cpu_features_str(char *buf, size_t size)
{
    const cpu_features *f = cpu_features_get();
    const struct { int on; const char *name; } all[] = {
        { f->avx2, "avx2" }, { f->fma, "fma" }, { f->f16c, "f16c" }, { f->bmi2, "bmi2" },
        { f->avx512f, "avx512f" }, { f->avx512bw, "avx512bw" }, { f->avx512vl, "avx512vl" },
        { f->avx512dq, "avx512dq" }, { f->avx512vnni, "avx512vnni" }, { f->avx512bf16, "avx512bf16" },
        { f->neon, "neon" }, { f->dotprod, "dotprod" },
    };
    size_t len = 0;
    if (size) buf[0] = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!all[i].on) continue;
        int w = snprintf(buf + len, size > len ? size - len : 0, "%s%s", len ? " " : "", all[i].name);
        if (w < 0 || (size_t)w >= (size > len ? size - len : 0)) break;
        len += (size_t)w;
    }
    return buf;
}

static void choose(void)
{
    cpu_level l = cpu_level_best();
    const char *env = getenv("SPARQ_CPU");
    if (env && *env) {
        cpu_level want;
        if (cpu_level_parse(env, &want)) {
            fprintf(stderr, "sparq: SPARQ_CPU=%s: unknown level (ref, avx2, avx512, neon, neon+dotprod)\n", env);
            exit(2);
        }
        if (!cpu_level_supported(want)) {
            char have[160];
            fprintf(stderr, "sparq: SPARQ_CPU=%s: this CPU cannot run the %s kernels (best here: %s; has: %s)\n",
                    env, env, cpu_level_name(l), cpu_features_str(have, sizeof have));
            exit(2);
        }
        l = want;
    }
    __atomic_store_n(&cpu_level_chosen_, (int)l, __ATOMIC_RELEASE);
}

cpu_level cpu_level_choose(void)
{
    pthread_once(&level_once, choose);
    return (cpu_level)__atomic_load_n(&cpu_level_chosen_, __ATOMIC_ACQUIRE);
}

/* ---- threads ---------------------------------------------------------- */

#define CPU_MAX_SETS 1024

int cpu_physical_cores(void)
{
    /* the sibling masks seen so far; a machine with more distinct cores
     * than this keeps counting but stops remembering (an overcount only
     * if masks repeat after that) */
    char seen[CPU_MAX_SETS][64];
    int n_seen = 0, n_cores = 0;
    for (int cpu = 0;; cpu++) {
        char path[96], mask[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", cpu);
        FILE *f = fopen(path, "r");
        if (!f) break;
        const int ok = fgets(mask, sizeof mask, f) != NULL;
        fclose(f);
        if (!ok) continue;
        mask[strcspn(mask, "\n")] = 0;
        int dup = 0;
        for (int i = 0; i < n_seen && !dup; i++) dup = strcmp(seen[i], mask) == 0;
        if (dup) continue;
        n_cores++;
        if (n_seen < CPU_MAX_SETS) snprintf(seen[n_seen++], sizeof seen[0], "%s", mask);
    }
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (n_cores <= 0) return online > 0 ? (int)online : 1;
    return online > 0 && online < n_cores ? (int)online : n_cores;
}
