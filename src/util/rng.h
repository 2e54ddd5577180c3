/* rng.h - the one splitmix64 (Steele, Lea and Flood's SplittableRandom
 * step; Vigna's constants): a 64-bit state advanced by the golden ratio and
 * mixed. Every seeded stream in the project (synthetic models, benchmark
 * data, k-means sampling, evaluation examples) is this sequence, so a seed
 * means the same numbers everywhere and no state is global: the caller
 * owns the uint64_t.
 */
#ifndef SPARQ_UTIL_RNG_H
#define SPARQ_UTIL_RNG_H

#include <stdint.h>

#define RNG_GOLDEN 0x9E3779B97F4A7C15ull /* 2^64 / golden ratio, odd */

/* splitmix64's finaliser: a bijection of 64-bit words that spreads every
 * input bit over the output (also a hash of a combined key). */
static inline uint64_t rng_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The next number of the stream whose state is *state (any value, 0
 * included). */
static inline uint64_t rng_splitmix64(uint64_t *state)
{
    return rng_mix64(*state += RNG_GOLDEN);
}

#endif
