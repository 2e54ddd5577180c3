/* test_cpu.c - the run-time choice of SIMD kernels (util/cpu.h).
 *
 *  1. detection and levels: the best level is supported, levels nest
 *     (avx512 implies avx2 implies ref), names round-trip, the level
 *     running is SPARQ_CPU's or the best;
 *  2. every module's table exists at every level with every kernel set;
 *  3. `sparq --version` names the level; SPARQ_CPU forcing a level this CPU
 *     lacks (or an unknown name) is a one-line error and exit 2, not SIGILL;
 *  4. the kernel-twin tests (and the golden logits) run again at every
 *     other level this CPU supports, through SPARQ_CPU, and pass: each
 *     compares that level's twins with the reference (the suite itself
 *     ran them at the level chosen for it).
 */
#include "attn/attn.h"
#include "attn/attn_prefill.h"
#include "bench/bench.h"
#include "core/forward_kernels.h"
#include "index/index.h"
#include "tensor/gemm.h"
#include "tensor/quant_impl.h"
#include "util/cpu.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *build_dir(void)
{
    const char *b = getenv("SPARQ_BUILD");
    return b && *b ? b : "build";
}

/* What starts the build's programs: empty, or an emulator for a cross
 * build (make test-arm64 sets "qemu-aarch64-static -L /usr/aarch64-linux-gnu",
 * as no binfmt_misc handler may be registered). */
static const char *runner(void)
{
    const char *r = getenv("SPARQ_TEST_RUNNER");
    return r ? r : "";
}

/* Runs `cmd` through the shell; its stdout+stderr into *out (malloc'd). */
static int run_cmd(const char *cmd, char **out)
{
    char full[1024];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    *out = NULL;
    if (!p) return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        pclose(p);
        return -1;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = 0;
    *out = buf;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void test_levels(void)
{
    const cpu_features *f = cpu_features_get();
    CHECK(f == cpu_features_get(), "features detected once");
    CHECK(cpu_level_supported(CPU_REF), "ref runs everywhere");
    CHECK(cpu_level_supported(cpu_level_best()), "the best level is supported");
    CHECK(!cpu_level_supported(CPU_AVX512) || cpu_level_supported(CPU_AVX2), "avx512 implies avx2");
    CHECK(!cpu_level_supported(CPU_AVX2) || (f->avx2 && f->fma && f->f16c && f->bmi2), "avx2 needs its features");
    CHECK(!cpu_level_supported(CPU_AVX512) ||
              (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni),
          "avx512 needs its features");
    CHECK(!cpu_level_supported(CPU_NEON_DOTPROD) || cpu_level_supported(CPU_NEON), "neon+dotprod implies neon");
    CHECK(!cpu_level_supported(CPU_NEON_DOTPROD) || f->dotprod, "neon+dotprod needs dotprod");
    CHECK(!(cpu_level_supported(CPU_NEON) && cpu_level_supported(CPU_AVX2)), "x86 and ARM64 levels exclude each other");
#if defined(__aarch64__)
    CHECK(cpu_level_supported(CPU_NEON), "NEON is baseline on ARM64");
#else
    CHECK(!cpu_level_supported(CPU_NEON), "NEON only on ARM64");
#endif
    for (int l = 0; l < CPU_LEVELS; l++) {
        cpu_level back;
        CHECK(cpu_level_parse(cpu_level_name((cpu_level)l), &back) == 0 && back == (cpu_level)l,
              "level %d round-trips through its name", l);
    }
    cpu_level x;
    CHECK(cpu_level_parse("sse9", &x) == -1, "unknown name");
    const char *env = getenv("SPARQ_CPU");
    const cpu_level now = cpu_level_get();
    if (env && *env) CHECK(strcmp(cpu_level_name(now), env) == 0, "running at SPARQ_CPU=%s, got %s", env,
                           cpu_level_name(now));
    else CHECK(now == cpu_level_best(), "running at the best level %s, got %s", cpu_level_name(cpu_level_best()),
               cpu_level_name(now));
    CHECK(cpu_level_get() == now, "the level does not change");
    CHECK(strcmp(quant_simd_name(), cpu_level_name(now)) == 0, "quant_simd_name is the level");
    char buf[256];
    fprintf(stderr, "cpu: running %s, best %s, features: %s\n", cpu_level_name(now),
            cpu_level_name(cpu_level_best()), cpu_features_str(buf, sizeof buf));
    char tiny[8];
    cpu_features_str(tiny, sizeof tiny);
    CHECK(strlen(tiny) < sizeof tiny, "features string truncated safely");
}

static void test_tables(void)
{
    for (int l = 0; l < CPU_LEVELS; l++) {
        const cpu_level lv = (cpu_level)l;
        const quant_kernels *q = quant_kernels_at(lv);
        CHECK(q && q->to_float && q->from_float && q->dot && q->dot_rows && q->dot_f32 && q->dot_f16_f32 &&
                  q->axpy_f32 && q->axpy_f16 && q->fp16_to_fp32_row && q->fp32_to_fp16_row,
              "quant table at %s", cpu_level_name(lv));
        const gemm_kernels *g = gemm_kernels_at(lv);
        CHECK(g && g->panel && (!g->float_kinds || g->int_kinds), "gemm table at %s", cpu_level_name(lv));
        const attn_kernels *a = attn_kernels_at(lv);
        CHECK(a && a->topk_filter && a->scores && a->softmax && a->weighted_sum && a->kt_logits &&
                  a->softmax_weighted_sum && a->kt_exp && a->scaled_head_sum && a->topk_kth_key &&
                  a->topk_above && a->topk_partition && a->gather_group,
              "attn table at %s", cpu_level_name(lv));
        const attn_pf_ops *p = attn_pf_ops_at(lv);
        CHECK(p && p->scores && p->rowmax && p->expsum && p->pv, "prefill ops at %s", cpu_level_name(lv));
        const idx_kernels *ix = idx_kernels_at(lv);
        CHECK(ix && ix->block_scores && ix->topk_push16 && ix->pack_rows && ix->assign, "index table at %s",
              cpu_level_name(lv));
        CHECK(fwd_kernels_at(lv) && fwd_kernels_at(lv)->silu_mul_row, "forward table at %s", cpu_level_name(lv));
        CHECK(bench_kernels_at(lv) && bench_kernels_at(lv)->sum_f32, "bench table at %s", cpu_level_name(lv));
    }
    /* the reference level runs the reference everywhere */
    CHECK(quant_kernels_at(CPU_REF) == &quant_kernels_ref && gemm_kernels_at(CPU_REF) == &gemm_kernels_ref &&
              attn_kernels_at(CPU_REF) == &attn_kernels_ref && attn_pf_ops_at(CPU_REF) == &attn_pf_ops_ref &&
              idx_kernels_at(CPU_REF) == &idx_kernels_ref && fwd_kernels_at(CPU_REF) == &fwd_kernels_ref &&
              bench_kernels_at(CPU_REF) == &bench_kernels_ref,
          "ref tables are the reference kernels");
    CHECK(gemm_kernels_at(CPU_REF)->peak_int8 == NULL && gemm_kernels_at(CPU_REF)->int_kinds == 0,
          "no packed GEMM at ref");
#if defined(__x86_64__)
    CHECK(quant_kernels_at(CPU_AVX2) == &quant_kernels_avx2 && quant_kernels_at(CPU_AVX512) == &quant_kernels_avx512,
          "x86 levels have their quant twins");
    CHECK(attn_kernels_at(CPU_AVX512) == &attn_kernels_avx512 && attn_kernels_at(CPU_AVX2) == &attn_kernels_avx2 &&
              attn_pf_ops_at(CPU_AVX2) == &attn_pf_ops_avx2,
          "x86 levels have their attention twins");
    CHECK(idx_kernels_at(CPU_AVX2) == &idx_kernels_avx2 && idx_kernels_at(CPU_AVX512) == &idx_kernels_avx512,
          "x86 levels have their index twins");
    CHECK(fwd_kernels_at(CPU_AVX2) == &fwd_kernels_avx2 && fwd_kernels_at(CPU_AVX512) == &fwd_kernels_avx512,
          "x86 levels have their SiLU twins");
    CHECK(bench_kernels_at(CPU_AVX2) == &bench_kernels_avx2 && bench_kernels_at(CPU_AVX512) == &bench_kernels_avx512,
          "x86 levels have their read-bandwidth twins");
#endif
}

static void test_cli(void)
{
    char cmd[512], *out;
    snprintf(cmd, sizeof cmd, "%s %s/sparq --version", runner(), build_dir());
    int rc = run_cmd(cmd, &out);
    char want[64];
    snprintf(want, sizeof want, "cpu %s)", cpu_level_name(cpu_level_get()));
    CHECK(rc == 0 && out && strncmp(out, "sparq ", 6) == 0 && strstr(out, want), "`%s`: exit %d, '%s'", cmd, rc,
          out ? out : "");
    free(out);
    for (int l = 0; l < CPU_LEVELS; l++) {
        const char *name = cpu_level_name((cpu_level)l);
        snprintf(cmd, sizeof cmd, "SPARQ_CPU='%s' %s %s/sparq --version", name, runner(), build_dir());
        rc = run_cmd(cmd, &out);
        if (cpu_level_supported((cpu_level)l)) {
            snprintf(want, sizeof want, "cpu %s)", name);
            CHECK(rc == 0 && out && strstr(out, want), "`%s`: exit %d, '%s'", cmd, rc, out ? out : "");
        } else {
            CHECK(rc == 2 && out && strstr(out, "SPARQ_CPU") && strstr(out, "cannot run") && count_lines(out) == 1,
                  "`%s` on a CPU without it: exit %d, '%s'", cmd, rc, out ? out : "");
        }
        free(out);
    }
    snprintf(cmd, sizeof cmd, "SPARQ_CPU=sse9 %s %s/sparq --version", runner(), build_dir());
    rc = run_cmd(cmd, &out);
    CHECK(rc == 2 && out && strstr(out, "unknown level") && count_lines(out) == 1, "`%s`: exit %d, '%s'", cmd, rc,
          out ? out : "");
    free(out);
}

/* SPARQ_TEST_LEVELS (space-separated level names), when set, limits the
 * other levels run below: under emulation (make test-arm64) every program
 * costs minutes, and the plain-C level there is the code x86 checks. */
static int level_wanted(const char *name)
{
    const char *only = getenv("SPARQ_TEST_LEVELS");
    if (!only || !*only) return 1;
    const size_t len = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += len)
        if ((p == only || p[-1] == ' ') && (p[len] == 0 || p[len] == ' ')) return 1;
    return 0;
}

/* The kernel-twin tests (each compares the level running with the
 * reference) and the golden logits, at every other supported level. */
static void test_other_levels(void)
{
    static const char *const progs[] = { "test_quant", "test_gemm", "test_attn", "test_kvq8", "test_prefill",
                                          "test_index", "test_bench", "test_model" };
    const cpu_level now = cpu_level_get();
    int ran = 0;
    for (int l = 0; l < CPU_LEVELS; l++) {
        if (l == (int)now || !cpu_level_supported((cpu_level)l)) continue;
        const char *name = cpu_level_name((cpu_level)l);
        if (!level_wanted(name)) continue;
        for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
            /* test_bench starts build/sparq itself, which only works
             * natively; its kernels have no ARM64 twin */
            if (*runner() && strcmp(progs[i], "test_bench") == 0) continue;
            char cmd[512], *out, line[128];
            /* under emulation, the programs the cross build made (the
             * Makefile's ARM64_TESTS); natively every one must be there */
            snprintf(cmd, sizeof cmd, "%s/tests/%s", build_dir(), progs[i]);
            if (*runner() && access(cmd, X_OK) != 0) continue;
            snprintf(cmd, sizeof cmd, "SPARQ_CPU='%s' %s %s/tests/%s", name, runner(), build_dir(), progs[i]);
            const int rc = run_cmd(cmd, &out);
            snprintf(line, sizeof line, "%s: ", progs[i]);
            const char *sum = out ? strstr(out, line) : NULL;
            const char *last = sum;
            while (last && (last = strstr(last + 1, line))) sum = last;
            CHECK(rc == 0 && sum && strstr(sum, " 0 failed"), "%s at %s: exit %d\n%s", progs[i], name, rc,
                  out ? out : "");
            if (strcmp(progs[i], "test_quant") == 0) {
                char k[64];
                snprintf(k, sizeof k, "kernels: %s\n", name);
                CHECK(out && strstr(out, k), "test_quant ran the %s kernels", name);
            }
            if (sum) {
                const char *e = strchr(sum, '\n');
                fprintf(stderr, "  SPARQ_CPU=%s %.*s\n", name, (int)(e ? e - sum : (long)strlen(sum)), sum);
            }
            free(out);
            ran++;
        }
    }
    if (!ran) test_skip("other levels: this CPU supports no SIMD level besides the one running (ref)");
}

int main(void)
{
    test_levels();
    test_tables();
    test_cli();
    test_other_levels();
    return test_summary("test_cpu");
}
