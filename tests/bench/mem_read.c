/*
 * mem_read.c - how fast the CPU threads can read memory: the ceiling for decoding, which reads
 * every weight once a token (docs/benchmarks.md, "Fused projections": 246 MB a token for the
 * Q4_K_M 270M). Reads a 256 MiB buffer with 32-byte AVX2 loads, split among the OpenMP threads,
 * 5 times, and prints GB/s for each pass.
 *
 *   gcc -O2 -mavx2 -fopenmp -o /tmp/mem_read tests/bench/mem_read.c
 *   OMP_NUM_THREADS=2 /tmp/mem_read
 *
 * Not part of the build: a measuring aid, like the other files of tests/bench/.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    size_t n = (size_t)256 << 20;
    uint8_t *a = aligned_alloc(64, n);
    if (!a) {
        fprintf(stderr, "mem_read: cannot allocate %zu bytes\n", n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) a[i] = (uint8_t)i; /* touched: the pages exist before timing */
    for (int pass = 0; pass < 5; pass++) {
        double t = omp_get_wtime();
        long long sum = 0; /* printed, so the loads are not optimized away */
#pragma omp parallel for reduction(+ : sum)
        for (size_t i = 0; i < n; i += 64) {
            __m256i v = _mm256_add_epi64(_mm256_load_si256((const __m256i *)(a + i)),
                                         _mm256_load_si256((const __m256i *)(a + i + 32)));
            sum += _mm256_extract_epi64(v, 0);
        }
        t = omp_get_wtime() - t;
        printf("%.1f GB/s (%d threads; checksum %lld)\n", (double)n / t / 1e9, omp_get_max_threads(), sum);
    }
    free(a);
    return 0;
}
