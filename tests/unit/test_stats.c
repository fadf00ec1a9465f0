/*
 * test_stats.c - core/stats: t critical values against scipy, the percentile bootstrap against
 * the exact binomial quantiles it estimates, the paired bootstrap test's p-values (identical,
 * dominated, against McNemar's exact test) and its rejection rate under the null.
 */
#include "test_util.h"

#include "gm_rng.h"
#include "gm_stats.h"

#include <stdlib.h>

/* scipy.stats.t.ppf(0.975, df), scipy 1.10.1 (Debian 12's python3-scipy):
 * python3 -c "import scipy.stats as s; [print(d, repr(s.t.ppf(0.975, d))) for d in (...)]" */
static const struct { int df; double t; } SCIPY_T95[] = {
    {1, 12.706204736432095},  {2, 4.302652729911275},   {3, 3.182446305284263},
    {10, 2.2281388519649385}, {30, 2.0422724563012373}, {31, 2.0395134463964077},
    {40, 2.0210753829953374}, {50, 2.008559109715206},  {100, 1.9839715184496334},
    {1000, 1.9623390808264074},
};

/* The smallest k with P(Binomial(n, p) <= k) >= q, over n (the q-quantile's grid point). */
static int binom_quantile(int n, double p, double q) {
    double cdf = 0;
    for (int k = 0; k <= n; k++) {
        // pmf by lgamma: C(n,k) p^k (1-p)^(n-k)
        double lp = lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0) + k * log(p) +
                    (n - k) * log1p(-p);
        cdf += exp(lp);
        if (cdf >= q - 1e-12) return k;
    }
    return n;
}

/* The exact p-value the paired bootstrap estimates, for 0/1 systems on n examples where only a is
 * right on b of them and only b on c: the resampled differences are +1 X times and -1 Y times,
 * (X, Y, rest) ~ Multinomial(n; b/n, c/n, 1 - (b+c)/n), and p = P(|(X - Y)/n - D| >= |D|),
 * D = (b - c)/n. Summed over every (X, Y). */
static double exact_paired_p(int n, int b, int c) {
    double pb = (double)b / n, pc = (double)c / n, pr = 1 - pb - pc, D = (double)(b - c) / n;
    double p = 0;
    for (int x = 0; x <= n; x++)
        for (int y = 0; x + y <= n; y++) {
            if (fabs((double)(x - y) / n - D) < fabs(D) - 1e-12) continue;
            double lp = lgamma(n + 1.0) - lgamma(x + 1.0) - lgamma(y + 1.0) - lgamma(n - x - y + 1.0);
            lp += (x ? x * log(pb) : 0) + (y ? y * log(pc) : 0) + (n - x - y ? (n - x - y) * log(pr) : 0);
            p += exp(lp);
        }
    return p;
}

/* McNemar's exact two-sided p-value for b and c discordant pairs: 2 P(Bin(b+c, 1/2) <= min). */
static double mcnemar_exact(int b, int c) {
    int n = b + c, m = b < c ? b : c;
    double tail = 0;
    for (int k = 0; k <= m; k++)
        tail += exp(lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0) - n * log(2.0));
    return fmin(1.0, 2 * tail);
}

static void test_t95(void) {
    for (size_t i = 0; i < sizeof SCIPY_T95 / sizeof *SCIPY_T95; i++) {
        double t = gm_stats_t95(SCIPY_T95[i].df), want = SCIPY_T95[i].t;
        CHECK(fabs(t - want) <= TOL_T95_REL * want, "df %d: %.17g vs scipy %.17g", SCIPY_T95[i].df,
              t, want);
    }
    CHECK(isnan(gm_stats_t95(0)), "df 0 has no t");
}

static void test_bootstrap(void) {
    gm_error err = {0};
    double lo = 0, hi = 0;
    // a constant: the interval is the point
    double c[7] = {0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
    CHECK_OK(gm_stats_bootstrap_mean(c, 7, 1000, 1, &lo, &hi, &err), &err);
    CHECK(lo == 0.25 && hi == 0.25, "constant: [%g, %g]", lo, hi);
    // 0/1 data: the bounds are the binomial quantiles of Bin(n, k/n), divided by n
    const int ns[] = {40, 80, 400}, ks[] = {20, 54, 356};
    for (int t = 0; t < 3; t++) {
        int n = ns[t], k = ks[t];
        double *x = malloc((size_t)n * sizeof *x);
        for (int i = 0; i < n; i++) x[i] = i < k ? 1 : 0;
        CHECK_OK(gm_stats_bootstrap_mean(x, n, GM_STATS_RESAMPLES, 0, &lo, &hi, &err), &err);
        double p = (double)k / n;
        double qlo = binom_quantile(n, p, 0.025) / (double)n, qhi = binom_quantile(n, p, 0.975) / (double)n;
        CHECK(fabs(lo - qlo) <= TOL_BOOT_BINOMIAL_STEPS / n && fabs(hi - qhi) <= TOL_BOOT_BINOMIAL_STEPS / n,
              "%d/%d: bootstrap [%.4f, %.4f], binomial quantiles [%.4f, %.4f]", k, n, lo, hi, qlo, qhi);
        // deterministic in the seed
        double lo2, hi2;
        CHECK_OK(gm_stats_bootstrap_mean(x, n, GM_STATS_RESAMPLES, 0, &lo2, &hi2, &err), &err);
        CHECK(lo2 == lo && hi2 == hi, "same seed, same interval");
        free(x);
    }
    // bad input: named, nothing computed
    CHECK(gm_stats_bootstrap_mean(c, 0, 10, 0, &lo, &hi, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "no values"), "n = 0: %s", err.msg);
    c[3] = NAN;
    CHECK(gm_stats_bootstrap_mean(c, 7, 10, 0, &lo, &hi, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "value 3 is not finite"), "NaN: %s", err.msg);
}

/* a and b right (1) or wrong (0) on n examples: both right on `both`, only a on `b_only`... */
static void make_pair(double *a, double *b, int n, int both, int only_a, int only_b) {
    for (int i = 0; i < n; i++) {
        a[i] = i < both + only_a ? 1 : 0;
        b[i] = (i < both || (i >= both + only_a && i < both + only_a + only_b)) ? 1 : 0;
    }
}

static void test_paired(void) {
    gm_error err = {0};
    enum { N = 80 };
    double a[N], b[N], p = -1;
    make_pair(a, b, N, 30, 0, 0);
    CHECK_OK(gm_stats_paired_bootstrap(a, a, N, GM_STATS_RESAMPLES, 0, &p, &err), &err);
    CHECK(p == 1.0, "identical systems: p = %g", p);
    make_pair(a, b, N, 0, N, 0); // a right everywhere, b nowhere
    CHECK_OK(gm_stats_paired_bootstrap(a, b, N, GM_STATS_RESAMPLES, 0, &p, &err), &err);
    CHECK(p == 1.0 / (GM_STATS_RESAMPLES + 1), "a always right, b never: p = %g", p);
    // against McNemar's exact test, the standard for one pair of classifiers on one test set:
    // the same decision at alpha = 0.05 for clear cases on either side
    const int disc[][2] = {{20, 4}, {15, 2}, {12, 8}, {6, 4}, {10, 10}};
    for (int i = 0; i < 5; i++) {
        make_pair(a, b, N, 30, disc[i][0], disc[i][1]);
        CHECK_OK(gm_stats_paired_bootstrap(a, b, N, GM_STATS_RESAMPLES, 0, &p, &err), &err);
        double mc = mcnemar_exact(disc[i][0], disc[i][1]);
        CHECK((p < 0.05) == (mc < 0.05), "discordant %d/%d: bootstrap p %.4f, McNemar p %.4f",
              disc[i][0], disc[i][1], p, mc);
        // and the p-value it estimates, computed exactly, within the Monte Carlo error
        double ex = exact_paired_p(N, disc[i][0], disc[i][1]);
        double mc_err = TOL_BOOT_MC_SD * sqrt(fmax(0, ex * (1 - ex)) / GM_STATS_RESAMPLES) +
                        1.0 / GM_STATS_RESAMPLES;
        CHECK(fabs(p - ex) <= mc_err, "discordant %d/%d: bootstrap p %.5f, exact %.5f (+- %.5f)",
              disc[i][0], disc[i][1], p, ex, mc_err);
        printf("  discordant %2d vs %2d: paired bootstrap p = %.4f (exact %.4f), McNemar exact p = %.4f\n",
               disc[i][0], disc[i][1], p, ex, mc);
    }
    // under the null (two systems right with the same probability 0.7, independently per
    // example), a test at alpha = 0.05 rejects about 5% of the time
    gm_rng r = gm_rng_seed(2026, 14);
    int rejected = 0, sims = 400;
    enum { M = 100 };
    double x[M], y[M];
    for (int s = 0; s < sims; s++) {
        for (int i = 0; i < M; i++) {
            x[i] = gm_rng_uniform(&r) < 0.7f ? 1 : 0;
            y[i] = gm_rng_uniform(&r) < 0.7f ? 1 : 0;
        }
        CHECK_OK(gm_stats_paired_bootstrap(x, y, M, 2000, (uint64_t)s, &p, &err), &err);
        rejected += p < 0.05;
    }
    double rate = (double)rejected / sims;
    CHECK_NEAR(rate, 0.05, TOL_PAIRED_NULL_RATE_ABS, "rejection rate under the null");
    printf("  null: rejected %d of %d at alpha 0.05 (rate %.3f)\n", rejected, sims, rate);
    CHECK(gm_stats_paired_bootstrap(a, b, N, 0, 0, &p, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "resamples"), "0 resamples: %s", err.msg);
}

/* Ratios of sums (gm_stats_bootstrap_ratio, gm_stats_paired_bootstrap_ratio: word error rates,
 * errors over reference words): equal weights k give the mean's interval / k and the mean's
 * p-value (the same draws); a constant per-example ratio gives the point; every resample is a
 * weighted average of the examples' ratios, so the interval lies between their extremes, and a
 * heavy example pulls it to its own ratio where the mean of ratios would not; weights that are
 * not positive are refused by name. */
static void test_ratio(void) {
    gm_error err = {0};
    enum { N = 30 };
    double x[N], w[N], k[N], a[N], b[N];
    for (int i = 0; i < N; i++) x[i] = (i * 7) % 5, w[i] = 3, k[i] = 1 + (i * 5) % 9, a[i] = (i * 3) % 4, b[i] = (i * 5) % 3;
    double lo, hi, lo1, hi1, p, p1;
    CHECK_OK(gm_stats_bootstrap_ratio(x, w, N, 2000, 3, &lo, &hi, &err), &err);
    CHECK_OK(gm_stats_bootstrap_mean(x, N, 2000, 3, &lo1, &hi1, &err), &err);
    CHECK(fabs(lo - lo1 / 3) <= 1e-15 && fabs(hi - hi1 / 3) <= 1e-15, "equal weights 3: [%.17g, %.17g] vs the mean's / 3 "
          "[%.17g, %.17g]", lo, hi, lo1 / 3, hi1 / 3);
    CHECK_OK(gm_stats_paired_bootstrap_ratio(a, b, w, N, 2000, 3, &p, &err), &err);
    CHECK_OK(gm_stats_paired_bootstrap(a, b, N, 2000, 3, &p1, &err), &err);
    CHECK(p == p1, "equal weights: p %.6f, the mean's %.6f", p, p1);
    CHECK_OK(gm_stats_paired_bootstrap_ratio(a, a, k, N, 2000, 3, &p, &err), &err);
    CHECK(p == 1.0, "identical systems: p %g", p);
    for (int i = 0; i < N; i++) x[i] = 0.25 * k[i];
    CHECK_OK(gm_stats_bootstrap_ratio(x, k, N, 1000, 1, &lo, &hi, &err), &err);
    CHECK(fabs(lo - 0.25) < 1e-15 && fabs(hi - 0.25) < 1e-15, "constant ratio 0.25: [%.17g, %.17g]", lo, hi);
    /* one example of 100 words with 50 errors, 29 of 1 word without error: the ratio 50/129 = 0.39,
     * the mean of ratios 0.5/30 = 0.017 */
    for (int i = 0; i < N; i++) x[i] = i == 0 ? 50 : 0, k[i] = i == 0 ? 100 : 1;
    CHECK_OK(gm_stats_bootstrap_ratio(x, k, N, GM_STATS_RESAMPLES, 0, &lo, &hi, &err), &err);
    CHECK(lo >= 0 && hi <= 0.5 && lo < 50.0 / 129 && hi > 50.0 / 129 && hi > 0.3,
          "a heavy example: [%.4f, %.4f] around 50/129 = %.4f, within its ratios' range [0, 0.5]", lo, hi, 50.0 / 129);
    printf("  ratio of sums 50/129 = %.4f: bootstrap [%.4f, %.4f]\n", 50.0 / 129, lo, hi);
    k[4] = 0;
    CHECK(gm_stats_bootstrap_ratio(x, k, N, 10, 0, &lo, &hi, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "weight 4 is not a positive number"), "weight 0: %s", err.msg);
    CHECK(gm_stats_paired_bootstrap_ratio(a, b, k, N, 10, 0, &p, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "weight 4"), "weight 0 (paired): %s", err.msg);
}

int main(void) {
    test_t95();
    test_bootstrap();
    test_paired();
    test_ratio();
    return gm_test_finish();
}
