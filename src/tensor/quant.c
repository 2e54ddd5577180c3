/* quant.c - the un-suffixed quant entry points: each calls through the
 * kernel table of the level chosen at run time (util/cpu.h).
 *
 * quant_ref.c holds the reference kernels (the numerics specification),
 * quant_avx512.c / quant_avx2.c / quant_neon.c the SIMD twins; each SIMD entry point falls
 * back to the reference for types it has no kernel for. quant_types.c holds
 * the type table and the scalar half/bfloat16 conversions.
 */
#include "tensor/quant.h"
#include "tensor/quant_impl.h"
#include "util/cpu.h"

#include <assert.h>

/* n must be a whole number of blocks of a type with kernels (programming
 * errors: the model loader validates shapes and types up front). */
static inline void check_row(uint32_t type, int64_t n)
{
    const quant_traits *t = quant_traits_of(type);
    assert(t && n >= 0 && n % t->block_size == 0);
    (void)t;
    (void)n;
}

/* Every level has an entry: a level without its own twins runs the
 * reference. */
static const quant_kernels *const tables[CPU_LEVELS] = {
    [CPU_REF] = &quant_kernels_ref,
#if defined(__x86_64__)
    [CPU_AVX2] = &quant_kernels_avx2,
    [CPU_AVX512] = &quant_kernels_avx512,
#else
    [CPU_AVX2] = &quant_kernels_ref,
    [CPU_AVX512] = &quant_kernels_ref,
#endif
#if defined(__aarch64__)
    [CPU_NEON] = &quant_kernels_neon,
    [CPU_NEON_DOTPROD] = &quant_kernels_neondp,
#else
    [CPU_NEON] = &quant_kernels_ref,
    [CPU_NEON_DOTPROD] = &quant_kernels_ref,
#endif
};

const quant_kernels *quant_kernels_at(cpu_level level) { return tables[level]; }

static inline const quant_kernels *K(void) { return tables[cpu_level_get()]; }

const char *quant_simd_name(void) { return cpu_level_name(cpu_level_get()); }

void quant_to_float(uint32_t type, const void *src, float *dst, int64_t n)
{
    check_row(type, n);
    K()->to_float(type, src, dst, n);
}

int quant_from_float(uint32_t type, const float *src, void *dst, int64_t n)
{
    return K()->from_float(type, src, dst, n);
}

float quant_dot(uint32_t type, const void *w, const void *x, int64_t n)
{
    check_row(type, n);
    return K()->dot(type, w, x, n);
}

void quant_dot_rows(uint32_t type, const void *w, size_t w_stride, int nr,
                    const void *x, int64_t n, float *out)
{
    check_row(type, n);
    K()->dot_rows(type, w, w_stride, nr, x, n, out);
}

float dot_f32(const float *a, const float *b, int64_t n) { return K()->dot_f32(a, b, n); }
float dot_f16_f32(const uint16_t *a, const float *b, int64_t n) { return K()->dot_f16_f32(a, b, n); }
void axpy_f32(float *y, float a, const float *x, int64_t n) { K()->axpy_f32(y, a, x, n); }
void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) { K()->axpy_f16(y, a, x, n); }
void fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n) { K()->fp16_to_fp32_row(src, dst, n); }
void fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n) { K()->fp32_to_fp16_row(src, dst, n); }
