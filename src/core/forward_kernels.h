/* forward_kernels.h - the forward pass's own elementwise kernels, one table
 * per level (util/cpu.h): forward.c calls through the table of the level
 * running; forward_avx2.c and forward_avx512.c hold the SIMD twins.
 */
#ifndef SPARQ_FORWARD_KERNELS_H
#define SPARQ_FORWARD_KERNELS_H

#include "util/cpu.h"

#include <stdint.h>

typedef struct fwd_kernels {
    /* gate[i] = silu(gate[i]) * up[i], i < n */
    void (*silu_mul_row)(float *gate, const float *up, int64_t n);
} fwd_kernels;

extern const fwd_kernels fwd_kernels_ref, fwd_kernels_avx2, fwd_kernels_avx512;
const fwd_kernels *fwd_kernels_at(cpu_level level);

void silu_mul_row_ref(float *gate, const float *up, int64_t n);
void silu_mul_row_avx2(float *gate, const float *up, int64_t n);
void silu_mul_row_avx512(float *gate, const float *up, int64_t n);

#endif
