/*
 * gm_stats.h - the statistics behind the tables' uncertainty: Student t critical values, the
 * percentile bootstrap interval of a mean, and the paired bootstrap test of two systems scored
 * on the same test examples.
 *
 * Why these: a table cell pools a few seeds of one setting evaluated on one test set. With 3 or
 * more seeds the seed-to-seed spread is estimated by a t interval over the seeds' means; with
 * fewer it cannot be, and the uncertainty that remains measurable is the test set's own
 * sampling, estimated by resampling test examples (Efron & Tibshirani, "An Introduction to the
 * Bootstrap", 1993, ch. 13, the percentile interval). Two cells scored on the same examples are
 * compared pairwise: the per-example differences are resampled and the observed mean
 * difference is set against the resampled ones centred on it (ibid. §16.4; Koehn, "Statistical
 * significance tests for machine translation evaluation", EMNLP 2004, for its use on test
 * sets). lua/report.lua states the method and α under each table.
 *
 * Resampling is deterministic: draws come from Philox (core/base/gm_rng.h) keyed by `seed`, so
 * a table renders the same numbers every time.
 *
 * Ownership: callers own every array; nothing is kept. Errors: GM_ERR_INVALID for n < 1,
 * resamples < 1 or non-finite data (message names what), GM_ERR_NOMEM for the resample buffer
 * (8 bytes per resample).
 */
#ifndef GM_STATS_H
#define GM_STATS_H

#include "gm_status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Resamples used by the tables (Efron & Tibshirani ch. 13 suggest >= 1,000 for percentile
 * intervals; 10,000 keeps the Monte Carlo error of a 95% bound near 0.2% of the spread). */
#define GM_STATS_RESAMPLES 10000

/* t_{0.975, df}: the two-sided 95% critical value of Student's t with df >= 1 degrees of
 * freedom (a 95% interval of a mean of n values is mean ± t95(n-1) s / sqrt(n)). Tabulated for
 * df <= 30 (values of scipy.stats.t.ppf(0.975, df)), above by the Cornish-Fisher expansion of
 * Abramowitz & Stegun 26.7.5 (relative error < 1e-8 there). df < 1: NAN. */
double gm_stats_t95(int64_t df);

/* Percentile bootstrap 95% interval of the mean of x[0..n): `resamples` times, n values are
 * drawn from x with replacement and averaged; *lo and *hi are the 2.5% and 97.5% quantiles of
 * those means (linear interpolation between order statistics, Hyndman & Fan type 7, numpy's
 * default). Deterministic in (x, n, resamples, seed). */
gm_status gm_stats_bootstrap_mean(const double *x, int64_t n, int64_t resamples, uint64_t seed,
                                  double *lo, double *hi, gm_error *err);

/* The same for a ratio of sums, sum(x) / sum(w) (w > 0 per example: a corpus-level rate such as
 * the word error rate, errors over reference words, Koehn 2004's resampling of test sentences):
 * each resample draws n examples and takes sum(x*) / sum(w*). w NULL: every weight 1, the mean
 * (gm_stats_bootstrap_mean). GM_ERR_INVALID also for a weight that is not a positive number. */
gm_status gm_stats_bootstrap_ratio(const double *x, const double *w, int64_t n, int64_t resamples, uint64_t seed,
                                   double *lo, double *hi, gm_error *err);

/* Paired bootstrap test of H0: mean(a - b) = 0, two-sided. With d = a - b (per example, the
 * same examples in the same order) and D = mean(d): `resamples` times, n differences are drawn
 * with replacement; *p = (1 + #{|mean(d*) - D| >= |D|}) / (resamples + 1) (the +1s make it a
 * valid p-value, never 0). Identical a and b give p = 1. Deterministic like the above. */
gm_status gm_stats_paired_bootstrap(const double *a, const double *b, int64_t n,
                                    int64_t resamples, uint64_t seed, double *p, gm_error *err);

/* The same test for ratios of sums over shared weights w (both systems scored against the same
 * references: H0: sum(a) / sum(w) = sum(b) / sum(w)); D = sum(a - b) / sum(w) and each resample's
 * sum(a* - b*) / sum(w*). w NULL: gm_stats_paired_bootstrap. */
gm_status gm_stats_paired_bootstrap_ratio(const double *a, const double *b, const double *w, int64_t n,
                                          int64_t resamples, uint64_t seed, double *p, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_STATS_H */
