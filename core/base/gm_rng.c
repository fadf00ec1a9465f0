/*
 * gm_rng.c - sequential and stateless draws on top of Philox4x32-10 (gm_philox.h).
 */
#include "gm_rng.h"

#include "gm_philox.h"

void gm_philox(uint64_t key, uint64_t counter, uint32_t out[4]) { gm_philox4x32(key, counter, out); }

gm_rng gm_rng_seed(uint64_t seed, uint64_t stream) {
    /* splitmix64 of (seed, stream) so nearby seeds give unrelated keys */
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    gm_rng r = {z, 0};
    return r;
}

uint32_t gm_rng_u32(gm_rng *r) {
    uint32_t w[4];
    gm_philox(r->key, r->counter++, w);
    return w[0];
}

float gm_rng_uniform(gm_rng *r) { return (float)(gm_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

float gm_rng_uniform_at(uint64_t key, uint64_t i) { return gm_philox_uniform(key, i); }
