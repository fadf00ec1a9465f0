/*
 * gm_results.h - one trial's results file (results/<experiment>/trial-<id>.h5), crash-safe,
 * its readers, and the merge of a folder of trial files into results/<experiment>.h5.
 *
 * A trial file holds what a trial produced: the resolved config, per-step metrics, evaluations
 * (accuracy, confusion matrix), planned and measured memory, data-set statistics and the final
 * LoRA adapter. The layout is documented for h5py/pandas users in results/README.md
 * (checklist: change that file, GM_RESULTS_VERSION and the readers below together):
 *   /                   attrs: format = "gemmarun-results", version = 1, experiment, trial_id,
 *                       trial_index, n_trials, status, reason, config_json, report_json,
 *                       swept_json, created_by, started_at, finished_at, wall_seconds
 *   /config             attrs: one per resolved config field (str, f64, i64; bool as i64 0/1)
 *   /metrics/<name>     f64 [n], appendable; every series has one entry per logged row
 *   /eval/<phase>       attrs accuracy, loss (f64), n_examples (i64), ...; datasets labels
 *                       (vlen UTF-8 str [K]), per_class_accuracy (f64 [K]), confusion (i64 [K,K],
 *                       rows = true class, columns = predicted); per test example (when the
 *                       runner recorded them): example_index, predictions, references (i64 [n],
 *                       0-based: position in the test set, predicted class, true class), the
 *                       paired data that tables' intervals and significance tests resample
 *   /memory             attrs planned_<kind> (bytes, i64), planned_total, measured_peak_rss, ...
 *   /data               attrs n_train, n_test, n_rejected, n_truncated (i64), rejections_json
 *   /adapter/<peft key> f32 datasets, the final LoRA weights
 *   /provenance         attrs (str): what produced the trial - model_sha256 and model_files,
 *                       data_sha256 (train and test, tokenized), gemmarun version and
 *                       git_commit, compiler and library versions, cpu, threads, device,
 *                       compute_dtype, command_line, set_overrides_json (lua/runner.lua)
 *
 * How: the file lives in memory (HDF5 core driver) between saves, and gm_results_save writes its
 * complete image with gm_h5_save_atomic (tmp + fsync + rename + fsync of the folder): a kill -9
 * at any instant leaves the previous complete file or the new one, never a torn one, and HDF5
 * never writes to the disk itself (HDF5 1.10.8 crashes at exit after a failed write; gm_h5.h).
 * Opening an existing trial file copies it into memory, so a resumed trial keeps its metrics.
 * Cost: the whole file is rewritten on each save; metrics are small (8 bytes per value) and the
 * adapter is put once at the end, so a save every logging step stays cheap.
 *
 * Ownership: gm_results_open returns an owned handle released by gm_results_free; setters copy
 * what they are given. Readers return gm_malloc'd arrays released by the matching _free.
 * Errors: every function returning gm_status writes a message starting with the file path into
 * err. GM_ERR_IO (cannot read/write/rename; disk full), GM_ERR_FORMAT (not HDF5, not a gemmarun
 * results file, another version, a damaged object), GM_ERR_INVALID (bad name or value from the
 * caller: names must be non-empty, without '/', not "." or ".."), GM_ERR_NOT_FOUND (folder
 * without trial files), GM_ERR_NOMEM. A failed setter leaves the file as it was, except that a
 * failed gm_results_append_row may have extended some series (the next save still writes a
 * valid file). Thread-safety: none (HDF5 is not thread-safe; gm_h5.h).
 */
#ifndef GM_RESULTS_H
#define GM_RESULTS_H

#include "gm_status.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GM_RESULTS_FORMAT "gemmarun-results"
#define GM_RESULTS_MERGED_FORMAT "gemmarun-results-merged"
#define GM_RESULTS_VERSION 1
/* rejections_json keeps at most this many entries (n_rejected keeps the true count): a data set
 * with thousands of unreadable files must not blow the attribute up. */
#define GM_RESULTS_MAX_REJECTIONS 100

typedef struct gm_results gm_results;

/* ---- open, save, free ------------------------------------------------------------------- */

/* Opens the trial file `path` for writing. Missing: a new in-memory file with format, version,
 * created_by ("gemmarun " GM_VERSION), status "running", reason "", started_at (now, ISO 8601
 * UTC) and empty /config, /metrics, /eval, /memory, /data, /adapter groups; nothing touches the
 * disk until gm_results_save. Present: loaded whole into memory (a resumed trial keeps its
 * earlier metrics; gm_results_resumed says so). A present file that is not a gemmarun results
 * file of this version (or not HDF5 at all, or damaged) is GM_ERR_FORMAT naming the path and
 * what is wrong; it is left as it is. *out: the owned handle, NULL on failure. */
gm_status gm_results_open(const char *path, gm_results **out, gm_error *err);

/* True if gm_results_open loaded an existing file. */
bool gm_results_resumed(const gm_results *r);

/* The path given to gm_results_open (borrowed, valid until gm_results_free). */
const char *gm_results_path(const gm_results *r);

/* Writes the whole file crash-safe (gm_h5_save_atomic): afterwards `path` holds exactly what
 * the handle holds now. On failure the previous file is untouched; the handle stays usable. */
gm_status gm_results_save(gm_results *r, gm_error *err);

/* Discards the in-memory file (unsaved changes are lost) and frees the handle. NULL: no-op. */
void gm_results_free(gm_results *r);

/* ---- root attributes -------------------------------------------------------------------- */

/* Sets a root attribute (replacing it). `format`, `version` and `created_by` are reserved
 * (GM_ERR_INVALID); `status` goes through gm_results_set_status. Known names keep their types:
 * trial_index and n_trials are i64, wall_seconds f64, the others strings (a value of another
 * type is GM_ERR_INVALID); names outside the documented list are accepted as given. */
gm_status gm_results_set_str(gm_results *r, const char *name, const char *value, gm_error *err);
gm_status gm_results_set_i64(gm_results *r, const char *name, int64_t value, gm_error *err);
gm_status gm_results_set_f64(gm_results *r, const char *name, double value, gm_error *err);

/* Sets `status` ("running", "completed", "failed", "interrupted"; others: GM_ERR_INVALID) and
 * `reason` (NULL: ""). A final status also sets finished_at to now ("running" clears it to
 * ""); set finished_at afterwards to store another time. */
gm_status gm_results_set_status(gm_results *r, const char *status, const char *reason,
                                gm_error *err);

/* The current time as ISO 8601 UTC ("2026-12-01T10:22:33Z") into buf (>= 21 bytes). */
void gm_results_now_iso(char *buf, int cap);

/* ---- config (one attribute of /config per resolved field) ------------------------------- */
gm_status gm_results_config_str(gm_results *r, const char *key, const char *v, gm_error *err);
gm_status gm_results_config_f64(gm_results *r, const char *key, double v, gm_error *err);
gm_status gm_results_config_i64(gm_results *r, const char *key, int64_t v, gm_error *err);
/* Stored as i64 0/1 (h5py and pandas see a plain integer). */
gm_status gm_results_config_bool(gm_results *r, const char *key, bool v, gm_error *err);

/* ---- metrics (/metrics/<name>, f64 series) ---------------------------------------------- */

/* Appends one logged row: values[i] to /metrics/names[i]. Every series always has one entry
 * per row, so the series form a table (pandas.DataFrame of equal-length columns): a series
 * missing from this row gets NaN, a new series is created padded with NaN for earlier rows.
 * A name given twice in one row is GM_ERR_INVALID. */
gm_status gm_results_append_row(gm_results *r, const char *const *names, const double *values,
                                int n, gm_error *err);

/* gm_results_append_row with a single series. */
gm_status gm_results_append(gm_results *r, const char *name, double value, gm_error *err);

/* Number of rows logged (the length of every series). */
int64_t gm_results_rows(const gm_results *r);

/* Cuts every series to its first `rows` entries (a trial resumed from a checkpoint older than
 * the last logged row drops the rows it will log again). rows >= gm_results_rows: no-op. */
gm_status gm_results_truncate(gm_results *r, int64_t rows, gm_error *err);

/* ---- evaluations (/eval/<phase>) --------------------------------------------------------- */

typedef struct gm_results_eval {
    double accuracy;           /* NAN: not stored */
    double loss;               /* NAN: not stored */
    int64_t n_examples;        /* < 0: not stored */
    int n_classes;             /* K; 0: no per-class data */
    const char *const *labels; /* (K) class names; may be NULL */
    const double *per_class;   /* (K) accuracy per true class; may be NULL */
    const int64_t *confusion;  /* (K, K) row-major, rows = true class; may be NULL */
    int64_t n_per_example;     /* n: length of the per-example lists; 0: none stored */
    const int64_t *example_index; /* (n) 0-based position of the example in the test set */
    const int64_t *predictions;   /* (n) predicted class, 0-based in [0, K); may be NULL */
    const int64_t *references;    /* (n) true class, 0-based in [0, K); may be NULL */
    /* (n) a generation evaluation's edit counts per example (transcription): word-level edit
     * distance of the answer to its reference and the reference's words; the same for phones.
     * Each may be NULL; counts are >= 0. */
    const int64_t *word_errors, *words, *phone_errors, *phones;
} gm_results_eval;

/* The per-example lists of an evaluation, each (n_per_example) int64 in /eval/<phase>/<name>,
 * in this order: example_index first (the others need it); the edit counts are named
 * example_word_errors, example_words, example_phone_errors, example_phones (the group's
 * attributes word_errors, words, ... are their totals). One table for the writer, the reader and
 * the Lua binding. */
#define GM_RESULTS_EX_LISTS 7
extern const char *const gm_results_ex_names[GM_RESULTS_EX_LISTS];

/* Writes (or replaces whole) the evaluation `phase` ("baseline", "final", ...). Per-example
 * lists need example_index (n_per_example > 0); a class outside [0, K) (K > 0), a negative
 * index or a negative count is GM_ERR_INVALID and nothing is written. */
gm_status gm_results_set_eval(gm_results *r, const char *phase, const gm_results_eval *e,
                              gm_error *err);

/* Sets one more f64 attribute of /eval/<phase> (macro F1, ...); creates the group if needed. */
gm_status gm_results_set_eval_f64(gm_results *r, const char *phase, const char *name, double v,
                                  gm_error *err);

/* ---- memory, data --------------------------------------------------------------------------
 * /memory attrs are i64 bytes: planned_<kind> (kind names without spaces: planned_base_weights,
 * planned_adapters, planned_gradients, planned_optimizer_state, planned_saved_activations, ...,
 * planned_total) and measured_peak_rss; other names are accepted as given. */
gm_status gm_results_set_memory(gm_results *r, const char *name, int64_t bytes, gm_error *err);

/* ---- provenance (/provenance attrs, strings) ---------------------------------------------- */
gm_status gm_results_set_provenance(gm_results *r, const char *name, const char *value, gm_error *err);

typedef struct gm_results_data {
    int64_t n_train, n_test, n_rejected, n_truncated;
    const char *rejections_json; /* JSON list of {"example": .., "reason": ".."}; NULL: "[]".
                                    Longer than GM_RESULTS_MAX_REJECTIONS: cut to that many */
} gm_results_data;

gm_status gm_results_set_data(gm_results *r, const gm_results_data *d, gm_error *err);

/* ---- adapter ----------------------------------------------------------------------------- */

/* Stores /adapter/<name> (f32, C order, ndim 1..4), replacing a tensor of that name. */
gm_status gm_results_put_tensor(gm_results *r, const char *name, const float *data, int ndim,
                                const int64_t *shape, gm_error *err);

/* ---- reading ------------------------------------------------------------------------------
 * Readers open files read-only and never modify them. A trial read from a merged file is the
 * same structure as one read from its trial file (minus the adapter unless merged with it). */

typedef enum gm_results_vkind {
    GM_RV_STR = 0,
    GM_RV_I64,
    GM_RV_F64,
    GM_RV_KIND_COUNT
} gm_results_vkind;

/* One attribute: a name and a scalar value. */
typedef struct gm_results_attr {
    char *name;
    gm_results_vkind kind;
    char *s;   /* GM_RV_STR */
    int64_t i; /* GM_RV_I64 */
    double f;  /* GM_RV_F64 */
} gm_results_attr;

typedef struct gm_results_attrs {
    gm_results_attr *a;
    int n;
} gm_results_attrs;

typedef struct gm_results_series {
    char *name;
    int64_t n;
    double *v; /* (n) */
} gm_results_series;

typedef struct gm_results_eval_read {
    char *phase;
    gm_results_attrs attrs; /* accuracy, loss, n_examples, ... */
    int n_classes;          /* K (0 when no per-class data was stored) */
    char **labels;          /* (K) or NULL */
    double *per_class;      /* (K) or NULL */
    int64_t *confusion;     /* (K, K) or NULL */
    int64_t n_per_example;  /* n (0 when none was stored) */
    int64_t *example_index; /* (n) or NULL */
    int64_t *predictions;   /* (n) or NULL */
    int64_t *references;    /* (n) or NULL */
    int64_t *word_errors, *words, *phone_errors, *phones; /* (n) or NULL */
} gm_results_eval_read;

/* The addresses of e's per-example lists in gm_results_ex_names' order. */
static inline void gm_results_eval_lists(const gm_results_eval *e, const int64_t *out[GM_RESULTS_EX_LISTS]) {
    const int64_t *v[GM_RESULTS_EX_LISTS] = {e->example_index, e->predictions, e->references, e->word_errors,
                                             e->words, e->phone_errors, e->phones};
    for (int i = 0; i < GM_RESULTS_EX_LISTS; i++) out[i] = v[i];
}
static inline void gm_results_eval_read_values(const gm_results_eval_read *e, const int64_t *out[GM_RESULTS_EX_LISTS]) {
    const int64_t *v[GM_RESULTS_EX_LISTS] = {e->example_index, e->predictions, e->references, e->word_errors,
                                             e->words, e->phone_errors, e->phones};
    for (int i = 0; i < GM_RESULTS_EX_LISTS; i++) out[i] = v[i];
}
static inline void gm_results_eval_read_lists(gm_results_eval_read *e, int64_t **out[GM_RESULTS_EX_LISTS]) {
    int64_t **v[GM_RESULTS_EX_LISTS] = {&e->example_index, &e->predictions, &e->references, &e->word_errors,
                                        &e->words, &e->phone_errors, &e->phones};
    for (int i = 0; i < GM_RESULTS_EX_LISTS; i++) out[i] = v[i];
}

typedef struct gm_results_tensor_info {
    char *name;
    int ndim;
    int64_t shape[4];
} gm_results_tensor_info;

typedef struct gm_results_trial {
    char *source;          /* file path, plus "#/trial/<name>" for a merged file */
    gm_results_attrs root; /* every root attribute */
    gm_results_attrs config;
    gm_results_series *metrics;
    int n_metrics;
    gm_results_eval_read *evals;
    int n_evals;
    gm_results_attrs memory;
    gm_results_attrs data;
    gm_results_attrs provenance;
    gm_results_tensor_info *adapter; /* names and shapes only (no weights) */
    int n_adapter;
} gm_results_trial;

/* Reads a trial file (*n = 1) or a merged file (*n = its number of trials, in trial_index
 * order). *out is a gm_malloc'd array released with gm_results_trials_free. A file of another
 * format is GM_ERR_FORMAT; a missing one GM_ERR_IO ("no such file"). */
gm_status gm_results_read(const char *path, gm_results_trial **out, int *n, gm_error *err);
void gm_results_trials_free(gm_results_trial *t, int n);

/* The attribute `name` of a list, or NULL. */
const gm_results_attr *gm_results_find(const gm_results_attrs *a, const char *name);

/* The trial files of a folder: regular files named trial-<id>.h5 where <id> has no '.' (so
 * trial-<id>.ckpt.h5 checkpoints and <name>.h5.tmp saves in flight are not listed), sorted by
 * name, as gm_malloc'd "dir/name" strings. A missing folder is GM_ERR_IO; an empty one *n = 0. */
gm_status gm_results_list(const char *dir, char ***out, int *n, gm_error *err);
void gm_results_list_free(char **paths, int n);

/* ---- comparing two trials ----------------------------------------------------------------- */

/* What gm_results_compare found. */
typedef struct gm_results_diff {
    int64_t n_compared;    /* datasets compared */
    int64_t n_differ;      /* of those, how many differ in any value (or shape, or are missing) */
    int64_t n_values;      /* values compared */
    double max_abs;        /* the largest |a - b| over all values (0 when identical) */
    char worst[1200];      /* the dataset with the largest difference (or the first missing) */
} gm_results_diff;

/* Compares the numbers two trial files hold, value by value: every dataset under /metrics,
 * /eval/<phase> (per-class accuracy, confusion, per-example lists) and /adapter of `a` (except
 * those whose name is in the NULL-terminated list `skip`, e.g. the machine's timings; may be
 * NULL) against
 * the same path in `b` (read as f64: f32 and i64 values are exact there; two NaNs are equal). A
 * dataset missing from b, or of another shape, counts as differing (max_abs = inf). Datasets
 * only b has are not looked at. Bit-identical trials give n_differ = 0. Errors: as the readers
 * (GM_ERR_IO, GM_ERR_FORMAT naming the file, GM_ERR_NOMEM). */
gm_status gm_results_compare(const char *a, const char *b, const char *const *skip,
                             gm_results_diff *d, gm_error *err);

/* ---- merging ----------------------------------------------------------------------------- */

/* Merges every trial file of `dir` (gm_results_list) into `out_path` (written crash-safe, replacing
 * it): /                  attrs format = "gemmarun-results-merged", version, experiment, n_trials,
 *                      created_by, merged_at, report_json and swept_json (of the first trial)
 *   /trials            table (compound dataset, PyTables TABLE attributes): one row per trial,
 *                      columns trial_id, trial_index, status, reason, seed (when configured),
 *                      each swept config field, <phase>_<attr> for every attribute of
 *                      /eval/final and /eval/baseline, wall_seconds, measured_peak_rss,
 *                      planned_total; `pandas.read_hdf(out_path, "trials")` reads it
 *   /trial/<file name without .h5>   the trial file's whole content (adapter only if
 *                      `with_adapters`), so gm_results_read of the merged file gives every trial
 * Missing values are NaN (float columns), "" (strings); an integer column with a missing value
 * becomes float. No trial files: GM_ERR_NOT_FOUND. A trial file that cannot be read stops the
 * merge (GM_ERR_FORMAT naming it) and leaves out_path untouched. */
gm_status gm_results_merge(const char *dir, const char *out_path, bool with_adapters,
                           gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_RESULTS_H */
