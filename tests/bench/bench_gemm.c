/*
 * bench_gemm.c - this machine's GEMM rates at the Gemma 3 270M's training shapes, through the
 * CPU kernels as training calls them (gm_k_matmul_fwd_cpu / gm_k_matmul_bwd_input_cpu):
 *   f32     an f32 weight: OpenBLAS sgemm on the core it runs (printed; kernels.h, gm_kernels_startup)
 *   bf16    a bf16 weight multiplied as stored, x rounded to bf16 (gm_kctx.bf16_gemm, oneDNN)
 *   q8>f32  a Q8_0 weight, panels dequantized to f32, sgemm (the 270M's Q4_K_M file stores its
 *           640-wide linears as Q5_0 / Q8_0: 640 is no multiple of Q4_K's 256-wide blocks)
 *   q8>bf16 the same panels rounded to bf16, oneDNN (the stored base with compute = "bf16")
 * in GFLOP/s (2 M N K per GEMM), best of --repeat. The rates model FLOP utilisation is measured
 * against (docs/benchmarks.md). Peers' rates at the same shapes: tests/bench/peer_gemm.py.
 *
 *   build/tests/bench/bench_gemm [--threads 2] [--repeat 5] [--rows 512]
 */
#define _POSIX_C_SOURCE 200809L
#include "gm_alloc.h"
#include "gm_dtype.h"
#include "kernels.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0) - 0.5f;
}

typedef struct bench_w {
    gm_wview v;
    void *data;
} bench_w;

/* A weight (N, K) of `type` (f32, bf16 or Q8_0: random int8 blocks with a small f16 scale). */
static bench_w make_weight(gm_dtype type, int64_t N, int64_t K) {
    bench_w w;
    memset(&w, 0, sizeof w);
    const gm_dtype_info *ti = gm_dtype_get(type);
    size_t row = (size_t)(K / ti->block_size) * ti->type_size;
    w.data = gm_malloc(row * (size_t)N);
    unsigned char *p = w.data;
    if (type == GM_F32)
        for (int64_t i = 0; i < N * K; i++) ((float *)p)[i] = frand();
    else if (type == GM_BF16)
        for (int64_t i = 0; i < N * K; i++) ((uint16_t *)p)[i] = gm_f32_to_bf16(frand());
    else
        for (size_t i = 0; i < row * (size_t)N; i += ti->type_size) {
            for (size_t b = 0; b < ti->type_size; b++) p[i + b] = (unsigned char)(frand() * 256.0f + 128.0f);
            uint16_t d = gm_f32_to_f16(0.01f); /* Q8_0: the block's scale first */
            memcpy(p + i, &d, 2);
        }
    w.v = (gm_wview){type, w.data, row, N, K, NULL, NULL, 0.0f, NULL};
    return w;
}

int main(int argc, char **argv) {
    gm_kernels_startup(argv); /* as gemmarun itself */
    long threads = 2, repeat = 5, M = 512;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = strtol(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--threads") == 0) threads = v;
        else if (strcmp(argv[i], "--repeat") == 0) repeat = v;
        else if (strcmp(argv[i], "--rows") == 0) M = v;
        else {
            fprintf(stderr, "usage: bench_gemm [--threads N] [--repeat R] [--rows M]\n");
            return 2;
        }
    }
    if (threads < 1 || repeat < 1 || M < 8) {
        fprintf(stderr, "bench_gemm: --threads, --repeat >= 1, --rows >= 8\n");
        return 2;
    }
    /* the 270M's linears (q 1024 x 640, k/v 256 x 640, o 640 x 1024, gate/up 2048 x 640, down 640 x
     * 2048) and an LM-head chunk (8192 x 640), forward and dX */
    static const int64_t shapes[][2] = {{1024, 640}, {256, 640}, {640, 1024}, {2048, 640}, {640, 2048}, {8192, 640}};
    size_t staging_elems = GM_CPU_BF16_STAGING_BYTES / 2;
    uint16_t *staging = gm_malloc(staging_elems * 2);
    size_t scratch_floats = gm_k_matmul_scratch_floats(GM_Q8_0, 8192, 2048, (int)threads);
    float *scratch = gm_malloc(scratch_floats * sizeof(float));
    gm_kctx f32c = {.n_threads = (int)threads, .scratch = scratch, .scratch_floats = scratch_floats};
    gm_kctx bfc = f32c;
    bfc.bf16_gemm = true, bfc.bf16_staging = staging, bfc.bf16_staging_elems = staging_elems;
    gm_kernels_set_threads((int)threads);
    printf("%s\nbf16 native: %s; M = %ld rows, %ld threads, best of %ld, GFLOP/s\n\n", gm_blas_info(),
           gm_k_cpu_bf16_native() ? "yes" : "no", M, threads, repeat);
    printf("| GEMM | N x K | f32 | bf16 | q8>f32 | q8>bf16 |\n|---|---|---|---|---|---|\n");
    double sum[4] = {0}, flops_all = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bwd = 0; bwd <= 1; bwd++) {
            int64_t N = shapes[s][0], K = shapes[s][1];
            int64_t in = bwd ? N : K, out = bwd ? K : N;
            float *x = gm_malloc((size_t)(M * in) * 4), *y = gm_malloc((size_t)(M * out) * 4);
            for (int64_t i = 0; i < M * in; i++) x[i] = frand();
            bench_w w[3] = {make_weight(GM_F32, N, K), make_weight(GM_BF16, N, K), make_weight(GM_Q8_0, N, K)};
            const struct {
                const gm_kctx *c;
                int w;
            } runs[4] = {{&f32c, 0}, {&bfc, 1}, {&f32c, 2}, {&bfc, 2}};
            double gf[4];
            double flops = 2.0 * (double)M * (double)N * (double)K;
            for (int r = 0; r < 4; r++) {
                double best = 1e30;
                for (long k = 0; k <= repeat; k++) { /* k = 0: warm-up (oneDNN creates its primitive) */
                    double t = now_s();
                    if (bwd) gm_k_matmul_bwd_input_cpu(runs[r].c, y, x, &w[runs[r].w].v, M, 0.0f);
                    else gm_k_matmul_fwd_cpu(runs[r].c, y, x, &w[runs[r].w].v, M, 0.0f);
                    t = now_s() - t;
                    if (k > 0 && t < best) best = t;
                }
                gf[r] = flops / best / 1e9;
                sum[r] += best;
            }
            flops_all += flops;
            printf("| %s | %lld x %lld | %.0f | %.0f | %.0f | %.0f |\n", bwd ? "dX" : "fwd", (long long)N, (long long)K, gf[0],
                   gf[1], gf[2], gf[3]);
            for (int i = 0; i < 3; i++) gm_free(w[i].data);
            gm_free(x), gm_free(y);
        }
    printf("| **all** (time-weighted) | | **%.0f** | **%.0f** | **%.0f** | **%.0f** |\n", flops_all / sum[0] / 1e9,
           flops_all / sum[1] / 1e9, flops_all / sum[2] / 1e9, flops_all / sum[3] / 1e9);
    gm_free(staging), gm_free(scratch);
    return 0;
}
