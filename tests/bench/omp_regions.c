/*
 * omp_regions.c - counts the OpenMP parallel regions a program enters (libgomp's GOMP_parallel,
 * which `#pragma omp parallel` and OpenBLAS's OpenMP build both call), by LD_PRELOAD; the count
 * goes to stderr when the program exits. How docs/benchmarks.md ("Short spins") counted decoding's
 * regions a token (the difference of two runs over the tokens decoded):
 *
 *   gcc -shared -fPIC -O2 -o /tmp/omp_regions.so tests/bench/omp_regions.c -ldl
 *   M=$(build/gemmarun fetch gemma3-270m)
 *   for d in 0 100; do LD_PRELOAD=/tmp/omp_regions.so build/tests/bench/bench_forward "$M" \
 *     --tokens 8 --threads 2 --repeat 1 --decode $d --int8-dot 1; done
 *
 * Not part of the build: a measuring aid, like the other files of tests/bench/.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

static long n_regions;

void GOMP_parallel(void (*fn)(void *), void *data, unsigned n_threads, unsigned flags) {
    static void (*real)(void (*)(void *), void *, unsigned, unsigned);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "GOMP_parallel");
    n_regions++;
    real(fn, data, n_threads, flags);
}

__attribute__((destructor)) static void report(void) { fprintf(stderr, "omp_regions: %ld parallel regions\n", n_regions); }
