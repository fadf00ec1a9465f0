/*
 * gm_stats.c - t critical values, bootstrap intervals and paired bootstrap tests (gm_stats.h).
 */
#include "gm_stats.h"

#include "gm_alloc.h"
#include "gm_rng.h"

#include <math.h>
#include <stdlib.h>

/* scipy.stats.t.ppf(0.975, df) for df = 1..30 (scipy 1.10.1). */
static const double T95[31] = {
    NAN,
    12.706204736432095, 4.302652729911275,  3.182446305284263,  2.7764451051977987,
    2.5705818366147395, 2.4469118487916806, 2.3646242510102993, 2.3060041350333704,
    2.2621571627409915, 2.2281388519649385, 2.200985160082949,  2.1788128296634177,
    2.1603686564610127, 2.1447866879169273, 2.131449545559323,  2.1199052992210112,
    2.1098155778331806, 2.10092204024096,   2.093024054408263,  2.0859634472658364,
    2.079613844727662,  2.0738730679040147, 2.0686576104190406, 2.0638985616280205,
    2.059538552753294,  2.055529438642871,  2.0518305164802833, 2.048407141795244,
    2.045229642132703,  2.0422724563012373,
};

double gm_stats_t95(int64_t df) {
    if (df < 1) return NAN;
    if (df <= 30) return T95[df];
    // Abramowitz & Stegun 26.7.5: t_p(v) = z + g1/v + g2/v^2 + g3/v^3 + g4/v^4, z = the normal
    // quantile (here of 0.975)
    const double z = 1.959963984540054, v = (double)df;
    const double z2 = z * z, z3 = z2 * z, z5 = z3 * z2, z7 = z5 * z2, z9 = z7 * z2;
    const double g1 = (z3 + z) / 4;
    const double g2 = (5 * z5 + 16 * z3 + 3 * z) / 96;
    const double g3 = (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / 384;
    const double g4 = (79 * z9 + 776 * z7 + 1482 * z5 - 1920 * z3 - 945 * z) / 92160;
    return z + g1 / v + g2 / (v * v) + g3 / (v * v * v) + g4 / (v * v * v * v);
}

/* Draws from Philox four 32-bit words at a time; an index in [0, n) by the multiply-shift map
 * (Lemire, "Fast random integer generation in an interval", 2019, without the rejection step:
 * the bias, n / 2^32, is below 1e-5 for any test set we score). */
typedef struct draws {
    uint64_t key, counter;
    uint32_t w[4];
    int left;
} draws;

static inline int64_t draw_index(draws *d, int64_t n) {
    if (d->left == 0) {
        gm_philox(d->key, d->counter++, d->w);
        d->left = 4;
    }
    uint32_t u = d->w[--d->left];
    return (int64_t)(((uint64_t)u * (uint64_t)n) >> 32);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Type-7 quantile of sorted v[0..m). */
static double quantile7(const double *v, int64_t m, double q) {
    double h = (double)(m - 1) * q;
    int64_t i = (int64_t)floor(h);
    if (i >= m - 1) return v[m - 1];
    return v[i] + (h - (double)i) * (v[i + 1] - v[i]);
}

static gm_status check_args(const double *x, int64_t n, int64_t resamples, const char *what,
                            gm_error *err) {
    if (n < 1) return gm_error_set(err, GM_ERR_INVALID, "%s: no values to resample", what);
    if (resamples < 1)
        return gm_error_set(err, GM_ERR_INVALID, "%s: resamples must be >= 1", what);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return gm_error_set(err, GM_ERR_INVALID, "%s: value %lld is not finite", what,
                                (long long)i);
    return GM_OK;
}

/* Weights must be finite and > 0 (a ratio's denominators: every resample's sum is then > 0). */
static gm_status check_weights(const double *w, int64_t n, const char *what, gm_error *err) {
    for (int64_t i = 0; w && i < n; i++)
        if (!(isfinite(w[i]) && w[i] > 0))
            return gm_error_set(err, GM_ERR_INVALID, "%s: weight %lld is not a positive number", what, (long long)i);
    return GM_OK;
}

gm_status gm_stats_bootstrap_mean(const double *x, int64_t n, int64_t resamples, uint64_t seed,
                                  double *lo, double *hi, gm_error *err) {
    return gm_stats_bootstrap_ratio(x, NULL, n, resamples, seed, lo, hi, err);
}

gm_status gm_stats_bootstrap_ratio(const double *x, const double *w, int64_t n, int64_t resamples, uint64_t seed,
                                   double *lo, double *hi, gm_error *err) {
    GM_TRY(check_args(x, n, resamples, "bootstrap interval", err));
    GM_TRY(check_weights(w, n, "bootstrap interval", err));
    double *means = gm_malloc((size_t)resamples * sizeof *means);
    if (!means)
        return gm_error_set(err, GM_ERR_NOMEM, "bootstrap interval: out of memory (%lld resamples)",
                            (long long)resamples);
    draws d = {.key = seed};
    for (int64_t b = 0; b < resamples; b++) {
        double s = 0, sw = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t j = draw_index(&d, n);
            s += x[j], sw += w ? w[j] : 1.0;
        }
        means[b] = s / sw;
    }
    qsort(means, (size_t)resamples, sizeof *means, cmp_double);
    *lo = quantile7(means, resamples, 0.025);
    *hi = quantile7(means, resamples, 0.975);
    gm_free(means);
    return GM_OK;
}

gm_status gm_stats_paired_bootstrap(const double *a, const double *b, int64_t n,
                                    int64_t resamples, uint64_t seed, double *p, gm_error *err) {
    return gm_stats_paired_bootstrap_ratio(a, b, NULL, n, resamples, seed, p, err);
}

gm_status gm_stats_paired_bootstrap_ratio(const double *a, const double *b, const double *w, int64_t n,
                                          int64_t resamples, uint64_t seed, double *p, gm_error *err) {
    GM_TRY(check_args(a, n, resamples, "paired bootstrap test", err));
    GM_TRY(check_args(b, n, resamples, "paired bootstrap test", err));
    GM_TRY(check_weights(w, n, "paired bootstrap test", err));
    double *diff = gm_malloc((size_t)n * sizeof *diff);
    if (!diff)
        return gm_error_set(err, GM_ERR_NOMEM, "paired bootstrap test: out of memory (%lld examples)",
                            (long long)n);
    double D = 0, W = 0;
    for (int64_t i = 0; i < n; i++) D += (diff[i] = a[i] - b[i]), W += w ? w[i] : 1.0;
    D /= W;
    // |mean(d*) - D| >= |D| with a tolerance of rounding: sums of the same values in another
    // order may differ in the last bits, and a tie must count (identical systems: p = 1)
    const double tol = 1e-12 * (1 + fabs(D));
    draws d = {.key = seed};
    int64_t extreme = 0;
    for (int64_t r = 0; r < resamples; r++) {
        double s = 0, sw = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t j = draw_index(&d, n);
            s += diff[j], sw += w ? w[j] : 1.0;
        }
        if (fabs(s / sw - D) >= fabs(D) - tol) extreme++;
    }
    gm_free(diff);
    *p = (double)(1 + extreme) / (double)(resamples + 1);
    return GM_OK;
}
