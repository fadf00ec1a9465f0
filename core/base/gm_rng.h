/*
 * gm_rng.h - counter-based random numbers (Philox4x32-10), identical on CPU and GPU.
 *
 * Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps a
 * (key, counter) pair to 4 random 32-bit words with no hidden state, so element i of a stream
 * can be computed by any thread or device in any order: LoRA initialisation, dropout masks and
 * sampling give the same numbers whatever the thread count. A gm_rng is just (key, counter);
 * saving those two numbers in a checkpoint saves the RNG state exactly.
 *
 * Ownership: plain values. Errors: none.
 */
#ifndef GM_RNG_H
#define GM_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_rng {
    uint64_t key;      /* the seed (and stream id mixed in) */
    uint64_t counter;  /* next block of 4 words */
} gm_rng;

/* Four 32-bit words for (key, counter). */
void gm_philox(uint64_t key, uint64_t counter, uint32_t out[4]);

gm_rng gm_rng_seed(uint64_t seed, uint64_t stream);
/* Next 32 random bits (uses one word of a block; simple and stateless enough for our needs). */
uint32_t gm_rng_u32(gm_rng *r);
/* Uniform in [0, 1) with 24 random bits (exactly representable in f32). */
float gm_rng_uniform(gm_rng *r);
/* Uniform float in [0,1) for element `i` of stream (key): stateless; the same function as the
 * kernels' gm_philox_uniform (dropout masks), so host and device agree. */
float gm_rng_uniform_at(uint64_t key, uint64_t i);

#ifdef __cplusplus
}
#endif
#endif /* GM_RNG_H */
