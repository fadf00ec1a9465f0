/*
 * bench_forward.c - forward-pass speed of a model on CPU: prefill of a T-token prompt (logits of
 * the last position only, as in generation) and token-by-token decoding, with peak memory.
 *
 *   build/tests/bench/bench_forward MODEL [--tokens 128] [--threads 2] [--repeat 3] [--decode 32] [--int8-dot 1]
 * (--int8-dot 1: decoding with the int8 dots, gm_infer_opts.int8_dot, as `gemmarun generate` does by
 * default; 0, this bench's default: the f32 dots of `generate --dot f32`)
 *
 * The prompt is T token ids drawn deterministically from the vocabulary's ordinary range, so
 * the number does not depend on a tokenizer. Reports the best of --repeat runs (the first run
 * also pays for page faults of the memory-mapped weights, which is reported separately).
 * Used by tests/bench/bench_forward.sh, which runs a peer (transformers) in the same session.
 */
#define _POSIX_C_SOURCE 200809L
#include "gm_alloc.h"
#include "gm_decoder.h"
#include "gm_fetch.h"
#include "gm_model.h"
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    gm_kernels_startup(argv); /* as gemmarun itself (kernels/kernels.h) */
    if (argc < 2) {
        fprintf(stderr, "usage: bench_forward MODEL [--tokens T] [--threads N] [--repeat R] [--decode D] [--int8-dot 0|1]\n");
        return 2;
    }
    long T = 128, threads = 2, repeat = 3, decode = 32, int8_dot = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        long v = strtol(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--tokens") == 0) T = v;
        else if (strcmp(argv[i], "--threads") == 0) threads = v;
        else if (strcmp(argv[i], "--repeat") == 0) repeat = v;
        else if (strcmp(argv[i], "--decode") == 0) decode = v;
        else if (strcmp(argv[i], "--int8-dot") == 0) int8_dot = v;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    gm_error err = {0};
    char path[1200];
    if (gm_resolve_model(argv[1], path, sizeof path, &err) != GM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    gm_model_opts mo = {.load_tokenizer = false};
    gm_model *m = NULL;
    if (gm_model_load(path, &mo, &m, &err) != GM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = 1, .ctx = T + decode, .max_tokens = T, .n_threads = (int)threads, .int8_dot = int8_dot != 0};
    if (gm_infer_new(m, &io, &st, &err) != GM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t *ids = malloc((size_t)T * sizeof(int32_t));
    uint64_t s = 12345;
    for (long i = 0; i < T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = i == 0 ? m->cfg.bos_id : (int32_t)(1000 + (s >> 33) % 200000);
    }
    double best = 1e30, first = 0, best_dec = 1e30;
    for (long r = 0; r < repeat; r++) {
        gm_infer_reset(st);
        double t0 = now_s();
        if (gm_decoder_forward(st, ids, T, false, &err) != GM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double dt = now_s() - t0;
        if (r == 0) first = dt;
        if (dt < best) best = dt;
        t0 = now_s();
        for (long d = 0; d < decode; d++) {
            int32_t tok = ids[d % T];
            if (gm_decoder_forward(st, &tok, 1, false, &err) != GM_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        }
        double dd = now_s() - t0;
        if (decode > 0 && dd < best_dec) best_dec = dd;
    }
    printf("gemmarun  prefill %ld tokens: %.3f s best of %ld (%.1f tokens/s; first run %.3f s)\n", T, best, repeat,
           (double)T / best, first);
    if (decode > 0)
        printf("gemmarun  decode %ld tokens: %.1f tokens/s%s\n", decode, (double)decode / best_dec, int8_dot ? " (int8 dots)" : "");
    printf("gemmarun  threads %ld, peak RSS %.0f MiB (weights memory-mapped: %.0f MiB)\n", threads,
           (double)gm_process_peak_rss() / 1048576.0, (double)m->mapped_bytes / 1048576.0);
    free(ids);
    gm_infer_free(st);
    gm_model_free(m);
    return 0;
}
