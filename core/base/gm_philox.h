/*
 * gm_philox.h - Philox4x32-10 as a header-only function usable from C and CUDA device code, so
 * the CPU and GPU draw identical numbers for the same (key, counter) (Salmon et al., "Parallel
 * random numbers: as easy as 1, 2, 3", SC 2011; constants are the published round multipliers
 * and Weyl increments).
 */
#ifndef GM_PHILOX_H
#define GM_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define GM_HD static __host__ __device__ __forceinline__
#else
#define GM_HD static inline
#endif

GM_HD void gm_philox4x32(uint64_t key, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Uniform in [0, 1) with 24 random bits for element i of stream `key` (one Philox call gives
 * four elements: i / 4 is the counter, i % 4 the word). */
GM_HD float gm_philox_uniform(uint64_t key, uint64_t i) {
    uint32_t w[4];
    gm_philox4x32(key, i >> 2, w);
    return (float)(w[i & 3] >> 8) * (1.0f / 16777216.0f);
}

#endif /* GM_PHILOX_H */
