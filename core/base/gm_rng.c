/*
 * gm_rng.c - Philox4x32-10 (Salmon et al. 2011). Constants are the published round
 * multipliers and Weyl increments.
 */
#include "gm_rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void gm_philox(uint64_t key, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

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

float gm_rng_uniform_at(uint64_t key, uint64_t i) {
    uint32_t w[4];
    gm_philox(key, i, w);
    return (float)(w[0] >> 8) * (1.0f / 16777216.0f);
}
