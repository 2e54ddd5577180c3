/* cpu.c - feature detection and the one-time choice of the kernel level
 * (cpu.h). */
#include "util/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cpu_level_chosen_ = -1;

static cpu_features feats;
static pthread_once_t feats_once = PTHREAD_ONCE_INIT, level_once = PTHREAD_ONCE_INIT;

static void detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* libgcc's detection checks XCR0 too: a feature the OS does not save
     * the registers of reads as absent */
    __builtin_cpu_init();
    feats.avx2 = __builtin_cpu_supports("avx2");
    feats.fma = __builtin_cpu_supports("fma");
    feats.f16c = __builtin_cpu_supports("f16c");
    feats.bmi2 = __builtin_cpu_supports("bmi2");
    feats.avx512f = __builtin_cpu_supports("avx512f");
    feats.avx512bw = __builtin_cpu_supports("avx512bw");
    feats.avx512vl = __builtin_cpu_supports("avx512vl");
    feats.avx512dq = __builtin_cpu_supports("avx512dq");
    feats.avx512vnni = __builtin_cpu_supports("avx512vnni");
    feats.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#elif defined(__aarch64__)
    feats.neon = 1; /* Advanced SIMD is part of every ARMv8-A core */
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
    case CPU_NEON: return 0; /* no NEON tables yet: never chosen */
    default: return 0;
    }
}

cpu_level cpu_level_best(void)
{
    if (cpu_level_supported(CPU_AVX512)) return CPU_AVX512;
    if (cpu_level_supported(CPU_AVX2)) return CPU_AVX2;
    return CPU_REF;
}

static const char *const names[CPU_LEVELS] = { "ref", "avx2", "avx512", "neon" };

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
        { f->neon, "neon" },
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
            fprintf(stderr, "sparq: SPARQ_CPU=%s: unknown level (ref, avx2, avx512)\n", env);
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
