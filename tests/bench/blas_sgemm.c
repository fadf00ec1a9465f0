/*
 * blas_sgemm.c - one BLAS library's cblas_sgemm at the Gemma 3 270M's training shapes, to compare
 * libraries (docs/benchmarks.md, "CPU speed on a 2-core AMD EPYC": OpenBLAS against BLIS). For M
 * rows, each (N, K) of the model's linears and the LM head's 8,192-entry chunk: the forward
 * y = x W^T (NoTrans x Trans) and the input gradient dX = dY W (NoTrans x NoTrans), best of 6, in
 * GFLOP/s (2 M N K), then the time-weighted rate over all of them.
 *
 *   gcc -O2 -o /tmp/sgemm_openblas tests/bench/blas_sgemm.c -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp
 *   gcc -O2 -o /tmp/sgemm_blis tests/bench/blas_sgemm.c -I/usr/include/x86_64-linux-gnu/blis-openmp \
 *       -L/usr/lib/x86_64-linux-gnu/blis-openmp -lblis -Wl,-rpath,/usr/lib/x86_64-linux-gnu/blis-openmp  # libblis-openmp-dev
 *   for M in 128 512; do OMP_NUM_THREADS=2 /tmp/sgemm_openblas $M | tail -1; OMP_NUM_THREADS=2 /tmp/sgemm_blis $M | tail -1; done
 *
 * Not part of the build: a measuring aid, like the other files of tests/bench/.
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 512;
    /* (N, K) of the forward: q, k / v, o, gate / up, down, an LM-head chunk */
    static const int shapes[][2] = {{1024, 640}, {256, 640}, {640, 1024}, {2048, 640}, {640, 2048}, {8192, 640}};
    double flops = 0, seconds = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bwd = 0; bwd < 2; bwd++) {
            int N = bwd ? shapes[s][1] : shapes[s][0], K = bwd ? shapes[s][0] : shapes[s][1];
            float *x = malloc(sizeof(float) * (size_t)M * (size_t)K), *w = malloc(sizeof(float) * (size_t)N * (size_t)K),
                  *y = malloc(sizeof(float) * (size_t)M * (size_t)N);
            if (!x || !w || !y) {
                fprintf(stderr, "blas_sgemm: out of memory\n");
                return 1;
            }
            for (size_t i = 0; i < (size_t)M * (size_t)K; i++) x[i] = (float)(i % 7) * 0.1f;
            for (size_t i = 0; i < (size_t)N * (size_t)K; i++) w[i] = (float)(i % 5) * 0.1f;
            double best = 1e30;
            for (int r = 0; r < 6; r++) {
                double t = now_s();
                if (!bwd) /* y (M, N) = x (M, K) . W^T, W (N, K) */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
                else /* dX (M, N) = dY (M, K) . W, W (K, N) */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, x, K, w, N, 0.0f, y, N);
                t = now_s() - t;
                best = t < best ? t : best;
            }
            double f = 2.0 * M * N * K;
            flops += f, seconds += best;
            printf("%s M=%d N=%d K=%d %.1f GFLOP/s\n", bwd ? "dX " : "fwd", M, N, K, f / best / 1e9);
            free(x), free(w), free(y);
        }
    printf("time-weighted %.1f GFLOP/s\n", flops / seconds / 1e9);
    return 0;
}
