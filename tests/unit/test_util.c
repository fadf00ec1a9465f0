/*
 * test_util.c - shared test helpers; see test_util.h.
 */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int gm_test_passed, gm_test_failed;

double gm_check_close(const char *what, const float *a, const float *b, size_t n,
                      double abs_tol, double rel_tol) {
    double worst = 0, worst_excess = -1;
    size_t wi = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double lim = abs_tol + rel_tol * fabs((double)b[i]);
        if (!(d <= lim)) bad++;
        if (d > worst || d != d) {
            worst = d;
            wi = i;
        }
        if (d - lim > worst_excess) worst_excess = d - lim;
    }
    if (bad == 0) {
        gm_test_passed++;
    } else {
        gm_test_failed++;
        fprintf(stderr, "FAIL %s: %zu of %zu elements outside abs %.3g + rel %.3g; worst |diff| %.6g at [%zu]\n",
                what, bad, n, abs_tol, rel_tol, worst, wi);
        for (size_t i = 0; i < n && i < 6; i++)
            fprintf(stderr, "    [%zu] got %.7g want %.7g\n", i, (double)a[i], (double)b[i]);
        fprintf(stderr, "    [%zu] got %.7g want %.7g\n", wi, (double)a[wi], (double)b[wi]);
    }
    return worst;
}

int gm_test_finish(void) {
    printf("%d passed, %d failed\n", gm_test_passed, gm_test_failed);
    fflush(stdout);
    return gm_test_failed ? 1 : 0;
}

int gm_test_skip(const char *why) {
    printf("SKIPPED: %s\n0 passed, 0 failed\n", why);
    return 77;
}

const char *gm_test_path(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", GM_SOURCE_DIR, rel);
    return buf;
}

const char *gm_test_real_model(void) {
    static char buf[4096];
    const char *home = getenv("GEMMARUN_HOME");
    if (home && *home) {
        snprintf(buf, sizeof buf, "%s/models/gemma-3-270m-q4_k_m.gguf", home);
    } else {
        const char *h = getenv("HOME");
        snprintf(buf, sizeof buf, "%s/.cache/gemmarun/models/gemma-3-270m-q4_k_m.gguf", h ? h : ".");
    }
    if (access(buf, R_OK) != 0) {
        fprintf(stderr, "the real model is not in the cache: %s\n"
                        "  hint: run `gemmarun fetch gemma3-270m` (README command 1 does it)\n",
                buf);
        return NULL;
    }
    return buf;
}

float gm_test_rand(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    uint64_t r = x * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
