/* cpu.h - the one run-time choice of SIMD kernels.
 *
 * The library is built for a portable baseline (x86-64-v2, ARMv8-A); only
 * the *_avx2.c and *_avx512.c files (x86-64) and the dot-product build of
 * the *_neon.c files (ARM64) are compiled for more (Makefile), and nothing
 * in them runs unless the CPU was found to have it. Every module
 * with SIMD twins publishes one const table of function pointers per level
 * (quant_kernels, gemm_kernels, attn_kernels, attn_pf_ops, idx_kernels,
 * fwd_kernels, bench_kernels) and indexes it by cpu_level_get(); a level without
 * twins in a module points at that module's reference table.
 *
 * The level is chosen once, on first use: the best the CPU supports, or the
 * one SPARQ_CPU names (ref, avx2, avx512, neon, neon+dotprod). Forcing a level the CPU lacks
 * prints one line to stderr and exits with status 2 rather than dying of
 * SIGILL in a kernel. After that first use nothing changes, so reading the
 * level is one load.
 *
 * Levels:
 *   ref     plain C, the numerics specification the twins must reproduce
 *   avx2    AVX2 + FMA + F16C (+ BMI2)
 *   avx512  avx2 plus AVX-512 F/BW/VL/DQ and VNNI (the int8 dot kernels
 *           are written around vpdpbusd); BF16 is a flag within the level
 *           (cpu_features()->avx512bf16), its kernels fall back without it
 *   neon    ARM64 Advanced SIMD (baseline on every ARMv8-A core)
 *   neon+dotprod  neon plus the ARMv8.2 int8 dot products (sdot/udot),
 *           where getauxval(AT_HWCAP) has HWCAP_ASIMDDP
 * The x86 levels are never supported on ARM64 and the ARM64 ones never
 * on x86; a module without twins for a level points at its reference.
 */
#ifndef SPARQ_UTIL_CPU_H
#define SPARQ_UTIL_CPU_H

#include <stddef.h>

typedef enum cpu_level {
    CPU_REF = 0,
    CPU_AVX2 = 1,
    CPU_AVX512 = 2,
    CPU_NEON = 3,
    CPU_NEON_DOTPROD = 4,
    CPU_LEVELS = 5
} cpu_level;

typedef struct cpu_features {
    int avx2, fma, f16c, bmi2;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    int neon, dotprod;
} cpu_features;

/* The Makefile compiles every *_neon.c twice, for baseline NEON and with
 * +dotprod; a name a *_neon.c file exports is written NEON_TWIN(name), so
 * the two builds define name_neon and name_neondp. */
#if defined(__ARM_FEATURE_DOTPROD)
#define NEON_TWIN(name) name##_neondp
#else
#define NEON_TWIN(name) name##_neon
#endif

/* What this CPU (and its OS: the register state must be enabled) offers;
 * detected once. */
const cpu_features *cpu_features_get(void);

/* 1 if every feature `level` needs is present. */
int cpu_level_supported(cpu_level level);

/* The best supported level (what runs when SPARQ_CPU is unset). */
cpu_level cpu_level_best(void);

/* "ref", "avx2", "avx512", "neon", "neon+dotprod". */
const char *cpu_level_name(cpu_level level);

/* Parses a level name; returns 0, or -1 for an unknown name. */
int cpu_level_parse(const char *name, cpu_level *out);

/* The features present, space-separated ("avx2 fma f16c bmi2 avx512f ...")
 * into buf; returns buf. */
char *cpu_features_str(char *buf, size_t size);

/* The level the kernels run at; chosen on the first call. */
cpu_level cpu_level_choose(void);
extern int cpu_level_chosen_; /* -1 until chosen; read it through cpu_level_get() */
static inline cpu_level cpu_level_get(void)
{
    /* the GCC builtin rather than <stdatomic.h>: C++ (the Faiss shim)
     * includes this header too */
    const int l = __atomic_load_n(&cpu_level_chosen_, __ATOMIC_ACQUIRE);
    return __builtin_expect(l >= 0, 1) ? (cpu_level)l : cpu_level_choose();
}


/* Physical cores, as llama.cpp counts them: the distinct
 * /sys/devices/system/cpu/cpuN/topology/thread_siblings_list sets (SMT siblings
 * share a core's execution units, so a second thread on one brings a
 * memory-bound decode nothing). Falls back to the online CPUs when /sys
 * says nothing. Always >= 1: the default thread count. */
int cpu_physical_cores(void);

#endif
