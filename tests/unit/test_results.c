/*
 * test_results.c - trial results files (core/store/gm_results) and their Lua bindings.
 *
 * Round trip of every field (root attributes, config of every type, metrics with NaN padding,
 * evaluations with labels/per-class/confusion, memory, data with the rejection cap, adapter
 * tensors); reopen-and-append (a resumed trial keeps its metrics) and truncation; corrupt,
 * truncated and foreign files give GM_ERR_FORMAT naming the file; merge of several trial files
 * (the /trials table read back with H5TB, every trial readable from the merged file); kill -9 of
 * a child that appends a row and saves in a loop: after every kill the file opens and holds
 * exactly the rows of the last completed save (or of the one in flight if its rename landed),
 * never a torn file. Then the Lua side: gm.results / gm.results_read / gm.results_merge / path
 * rule / gm.plot (the PNG is decoded again with libpng by gm.plot itself: size 1024x640; a
 * confusion matrix: square, its cells drawn, bad matrices and labels refused by name).
 *
 * Leaves a sample trial file and a merged file for a manual h5py/pandas check at
 * $GM_TEST_RESULTS_OUT (default <build>/test_results_sample/).
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_h5.h"
#include "gm_lua.h"
#include "gm_results.h"

#include <errno.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <lauxlib.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];
static int64_t h5_baseline;

static const char *in_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static void check_no_leaks(const char *where) {
    int64_t n = gm_h5_open_objects();
    CHECK(n == h5_baseline, "%s: %lld HDF5 ids open, baseline %lld", where, (long long)n,
          (long long)h5_baseline);
}

static const gm_results_attr *attr(const gm_results_attrs *a, const char *name) {
    return gm_results_find(a, name);
}

static bool attr_str(const gm_results_attrs *a, const char *name, const char *want) {
    const gm_results_attr *v = gm_results_find(a, name);
    return v && v->kind == GM_RV_STR && strcmp(v->s, want) == 0;
}

static bool attr_i64(const gm_results_attrs *a, const char *name, int64_t want) {
    const gm_results_attr *v = gm_results_find(a, name);
    return v && v->kind == GM_RV_I64 && v->i == want;
}

static bool attr_f64(const gm_results_attrs *a, const char *name, double want) {
    const gm_results_attr *v = gm_results_find(a, name);
    return v && v->kind == GM_RV_F64 && v->f == want;
}

static const gm_results_series *series(const gm_results_trial *t, const char *name) {
    for (int i = 0; i < t->n_metrics; i++)
        if (strcmp(t->metrics[i].name, name) == 0) return &t->metrics[i];
    return NULL;
}

static const gm_results_eval_read *eval(const gm_results_trial *t, const char *phase) {
    for (int i = 0; i < t->n_evals; i++)
        if (strcmp(t->evals[i].phase, phase) == 0) return &t->evals[i];
    return NULL;
}

/* ================================================================= round trip + resume */

static const char *const LABELS[3] = {"Abyssinian", "Bengal", "chat noir ü"};

/* Fills a results handle with one value of every kind; trial `k` varies the numbers. */
static void fill_trial(gm_results *r, int k, const char *status, const char *reason) {
    gm_error err = {0};
    char id[32];
    snprintf(id, sizeof id, "t%03d", k);
    CHECK_OK(gm_results_set_str(r, "experiment", "unit_sweep", &err), &err);
    CHECK_OK(gm_results_set_str(r, "trial_id", id, &err), &err);
    CHECK_OK(gm_results_set_i64(r, "trial_index", k, &err), &err);
    CHECK_OK(gm_results_set_i64(r, "n_trials", 4, &err), &err);
    CHECK_OK(gm_results_set_str(r, "config_json", "{\"lr\":0.0001,\"quant\":\"nf4\"}", &err), &err);
    CHECK_OK(gm_results_set_str(r, "report_json",
                                "{\"rows\":[\"quant\"],\"cols\":[\"lr\"],\"metric\":\"accuracy\"}",
                                &err),
             &err);
    CHECK_OK(gm_results_set_str(r, "swept_json", "[\"lr\",\"quant\",\"seed\"]", &err), &err);
    CHECK_OK(gm_results_set_i64(r, "wall_seconds", 12, &err), &err); // integer into an f64 field
    CHECK_OK(gm_results_config_f64(r, "lr", k % 2 ? 1e-4 : 2e-4, &err), &err);
    CHECK_OK(gm_results_config_str(r, "quant", k < 3 ? "nf4" : "bf16", &err), &err);
    CHECK_OK(gm_results_config_i64(r, "seed", k, &err), &err);
    CHECK_OK(gm_results_config_i64(r, "rank", 16, &err), &err);
    CHECK_OK(gm_results_config_bool(r, "checkpointing", true, &err), &err);
    for (int step = 1; step <= 5; step++) {
        const char *names[3] = {"step", "loss", "lr"};
        double v[3] = {step, 3.0 / step + k, 1e-4};
        CHECK_OK(gm_results_append_row(r, names, v, step < 4 ? 2 : 3, &err), &err);
    }
    double pc[3] = {0.5 + 0.01 * k, 1, 0.75};
    int64_t conf[9] = {1, 1, 0, 0, 3, 0, 0, 1, 3};
    gm_results_eval fin = {.accuracy = 0.8 + 0.01 * k,
                           .loss = 0.5,
                           .n_examples = 9,
                           .n_classes = 3,
                           .labels = LABELS,
                           .per_class = pc,
                           .confusion = conf};
    gm_results_eval base = {.accuracy = 0.6, .loss = NAN, .n_examples = 9};
    CHECK_OK(gm_results_set_eval(r, "final", &fin, &err), &err);
    CHECK_OK(gm_results_set_eval(r, "baseline", &base, &err), &err);
    CHECK_OK(gm_results_set_memory(r, "planned_base_weights", 1000 + k, &err), &err);
    CHECK_OK(gm_results_set_memory(r, "planned_total", 5000 + k, &err), &err);
    CHECK_OK(gm_results_set_memory(r, "measured_peak_rss", 6000 + k, &err), &err);
    // 150 rejections: the stored list keeps GM_RESULTS_MAX_REJECTIONS
    char *rej = gm_malloc(150 * 64 + 8);
    size_t len = 0;
    len += (size_t)sprintf(rej + len, "[");
    for (int i = 0; i < 150; i++)
        len += (size_t)sprintf(rej + len, "%s{\"example\":%d,\"reason\":\"too long\"}",
                               i ? "," : "", i);
    sprintf(rej + len, "]");
    gm_results_data d = {
        .n_train = 100, .n_test = 9, .n_rejected = 150, .n_truncated = 2, .rejections_json = rej};
    CHECK_OK(gm_results_set_data(r, &d, &err), &err);
    gm_free(rej);
    float a[2 * 3] = {1, 2, 3, 4, 5, (float)k};
    int64_t shape[2] = {2, 3};
    CHECK_OK(gm_results_put_tensor(r,
                                   "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                                   a, 2, shape, &err),
             &err);
    CHECK_OK(gm_results_set_status(r, status, reason, &err), &err);
}

static void test_roundtrip(const char *sample_dir) {
    gm_error err = {0};
    char path[640]; // sample_dir (< 600) + the file name
    snprintf(path, sizeof path, "%s/trial-t001.h5", sample_dir);
    unlink(path);
    gm_results *r = NULL;
    CHECK_OK(gm_results_open(path, &r, &err), &err);
    if (!r) return;
    CHECK(!gm_results_resumed(r), "a new file is not resumed");
    CHECK(!gm_test_file_exists(path), "nothing on disk before the first save");
    fill_trial(r, 1, "completed", NULL);
    // the replaced eval and tensor: set twice, the second wins
    double pc[3] = {0.25, 1, 0.75};
    int64_t conf[9] = {1, 3, 0, 0, 4, 0, 0, 1, 3};
    int64_t ex_idx[4] = {0, 1, 2, 5}, ex_pred[4] = {0, 2, 1, 1}, ex_ref[4] = {0, 2, 2, 1};
    gm_results_eval fin = {.accuracy = 0.75,
                           .loss = 0.5,
                           .n_examples = 12,
                           .n_classes = 3,
                           .labels = LABELS,
                           .per_class = pc,
                           .confusion = conf,
                           .n_per_example = 4,
                           .example_index = ex_idx,
                           .predictions = ex_pred,
                           .references = ex_ref};
    // per-example lists out of range are refused, the eval left as it was
    ex_pred[1] = 3;
    CHECK(gm_results_set_eval(r, "final", &fin, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "example 1: class out of range"),
          "a predicted class outside [0, K): %s", err.msg);
    ex_pred[1] = 2;
    fin.example_index = NULL;
    CHECK(gm_results_set_eval(r, "final", &fin, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "need example_index"),
          "predictions without example_index: %s", err.msg);
    fin.example_index = ex_idx;
    CHECK_OK(gm_results_set_eval(r, "final", &fin, &err), &err);
    CHECK_OK(gm_results_set_eval_f64(r, "final", "macro_f1", 0.7, &err), &err);
    // bad inputs are refused and change nothing
    CHECK(gm_results_set_str(r, "format", "x", &err) == GM_ERR_INVALID, "format is reserved");
    CHECK(gm_results_set_str(r, "trial_index", "x", &err) == GM_ERR_INVALID, "typed attribute");
    CHECK(gm_results_set_str(r, "config_json", "{oops", &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "JSON"),
          "config_json must be JSON: %s", err.msg);
    CHECK(gm_results_set_status(r, "done", NULL, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "completed"),
          "unknown status: %s", err.msg);
    CHECK(gm_results_config_str(r, "a/b", "x", &err) == GM_ERR_INVALID, "config key with '/'");
    const char *dup[2] = {"loss", "loss"};
    double dv[2] = {1, 2};
    CHECK(gm_results_append_row(r, dup, dv, 2, &err) == GM_ERR_INVALID, "name twice in a row");
    CHECK(gm_results_rows(r) == 5, "rows %lld", (long long)gm_results_rows(r));
    CHECK(gm_results_set_memory(r, "planned base weights", 1, &err) == GM_ERR_INVALID,
          "spaces in memory names");
    CHECK_OK(gm_results_save(r, &err), &err);
    CHECK(gm_test_file_exists(path), "saved");
    gm_results_free(r);
    check_no_leaks("roundtrip write");

    gm_results_trial *t = NULL;
    int n = 0;
    CHECK_OK(gm_results_read(path, &t, &n, &err), &err);
    CHECK(n == 1, "one trial, got %d", n);
    if (n != 1) return;
    const gm_results_trial *x = &t[0];
    CHECK(attr_str(&x->root, "format", GM_RESULTS_FORMAT) && attr_i64(&x->root, "version", 1),
          "format/version");
    CHECK(attr_str(&x->root, "created_by", "gemmarun " GM_VERSION), "created_by");
    CHECK(attr_str(&x->root, "experiment", "unit_sweep") &&
              attr_str(&x->root, "trial_id", "t001") && attr_i64(&x->root, "trial_index", 1) &&
              attr_i64(&x->root, "n_trials", 4),
          "identity");
    CHECK(attr_str(&x->root, "status", "completed") && attr_str(&x->root, "reason", ""), "status");
    CHECK(attr_f64(&x->root, "wall_seconds", 12.0), "wall_seconds as f64");
    const gm_results_attr *st = attr(&x->root, "started_at"), *fi = attr(&x->root, "finished_at");
    CHECK(st && st->kind == GM_RV_STR && strlen(st->s) == 20 && st->s[10] == 'T' &&
              st->s[19] == 'Z',
          "started_at ISO 8601 UTC: %s", st ? st->s : "(none)");
    CHECK(fi && fi->kind == GM_RV_STR && strlen(fi->s) == 20, "finished_at set by completed");
    CHECK(attr_str(&x->root, "swept_json", "[\"lr\",\"quant\",\"seed\"]"), "swept_json");
    CHECK(attr_f64(&x->config, "lr", 1e-4) && attr_str(&x->config, "quant", "nf4") &&
              attr_i64(&x->config, "seed", 1) && attr_i64(&x->config, "checkpointing", 1),
          "config of every type");
    const gm_results_series *step = series(x, "step"), *loss = series(x, "loss"),
                            *lr = series(x, "lr");
    CHECK(step && loss && lr && step->n == 5 && loss->n == 5 && lr->n == 5, "three series of 5");
    if (step && loss && lr && lr->n == 5) {
        CHECK(step->v[4] == 5 && loss->v[0] == 4.0 && loss->v[2] == 2.0, "series values");
        CHECK(isnan(lr->v[0]) && isnan(lr->v[2]) && lr->v[3] == 1e-4, "lr padded with NaN");
    }
    const gm_results_eval_read *e = eval(x, "final"), *b = eval(x, "baseline");
    CHECK(e && e->n_classes == 3 && attr_f64(&e->attrs, "accuracy", 0.75) &&
              attr_i64(&e->attrs, "n_examples", 12) && attr_f64(&e->attrs, "macro_f1", 0.7),
          "final eval (replaced) attributes");
    if (e && e->n_classes == 3 && e->labels && e->per_class && e->confusion) {
        CHECK(strcmp(e->labels[2], LABELS[2]) == 0, "UTF-8 label: %s", e->labels[2]);
        CHECK(e->per_class[0] == 0.25 && e->confusion[1] == 3 && e->confusion[4] == 4,
              "per-class and confusion (row-major, true x predicted)");
    }
    CHECK(e && e->n_per_example == 4 && e->example_index && e->predictions && e->references &&
              e->example_index[3] == 5 && e->predictions[1] == 2 && e->references[2] == 2,
          "per-example lists read back");
    CHECK(b && b->n_per_example == 0 && !b->example_index, "no per-example lists where none were set");
    CHECK(b && attr_f64(&b->attrs, "accuracy", 0.6) && !attr(&b->attrs, "loss") &&
              b->n_classes == 0,
          "baseline without loss or per-class data");
    CHECK(attr_i64(&x->memory, "planned_total", 5001) &&
              attr_i64(&x->memory, "measured_peak_rss", 6001),
          "memory");
    CHECK(attr_i64(&x->data, "n_rejected", 150) && attr_i64(&x->data, "n_truncated", 2), "data");
    const gm_results_attr *rj = attr(&x->data, "rejections_json");
    int entries = 0;
    for (const char *p = rj ? rj->s : ""; (p = strstr(p, "\"example\"")); p++) entries++;
    CHECK(entries == GM_RESULTS_MAX_REJECTIONS, "rejections capped at %d, got %d",
          GM_RESULTS_MAX_REJECTIONS, entries);
    CHECK(x->n_adapter == 1 && x->adapter[0].ndim == 2 && x->adapter[0].shape[0] == 2 &&
              x->adapter[0].shape[1] == 3,
          "adapter tensor listed with its shape");
    gm_results_trials_free(t, n);
    check_no_leaks("roundtrip read");

    // resume: reopen, append, save; earlier rows stay
    CHECK_OK(gm_results_open(path, &r, &err), &err);
    if (!r) return;
    CHECK(gm_results_resumed(r) && gm_results_rows(r) == 5, "resumed with 5 rows");
    CHECK_OK(gm_results_set_status(r, "running", NULL, &err), &err);
    const char *names[2] = {"step", "grad_norm"};
    double v[2] = {6, 0.5};
    CHECK_OK(gm_results_append_row(r, names, v, 2, &err), &err);
    CHECK_OK(gm_results_append(r, "step", 7, &err), &err);
    CHECK_OK(gm_results_save(r, &err), &err);
    gm_results_free(r);
    CHECK_OK(gm_results_read(path, &t, &n, &err), &err);
    if (n == 1) {
        step = series(&t[0], "step");
        loss = series(&t[0], "loss");
        const gm_results_series *gn = series(&t[0], "grad_norm");
        CHECK(step && step->n == 7 && step->v[0] == 1 && step->v[6] == 7, "step kept and extended");
        CHECK(loss && loss->n == 7 && loss->v[0] == 4.0 && isnan(loss->v[5]),
              "loss kept, NaN after");
        CHECK(gn && gn->n == 7 && isnan(gn->v[4]) && gn->v[5] == 0.5, "new series padded");
        CHECK(attr_str(&t[0].root, "status", "running") && attr_str(&t[0].root, "finished_at", ""),
              "running again clears finished_at");
        CHECK(eval(&t[0], "final") && t[0].n_adapter == 1, "evals and adapter survive a resume");
    }
    gm_results_trials_free(t, n);
    // truncate: back to 3 rows, append one
    CHECK_OK(gm_results_open(path, &r, &err), &err);
    if (!r) return;
    CHECK_OK(gm_results_truncate(r, 3, &err), &err);
    CHECK_OK(gm_results_append(r, "step", 4, &err), &err);
    CHECK(gm_results_rows(r) == 4, "rows after truncate + append");
    CHECK_OK(gm_results_save(r, &err), &err);
    gm_results_free(r);
    CHECK_OK(gm_results_read(path, &t, &n, &err), &err);
    if (n == 1) {
        step = series(&t[0], "step");
        loss = series(&t[0], "loss");
        CHECK(step && step->n == 4 && step->v[3] == 4 && loss && loss->n == 4 && isnan(loss->v[3]),
              "truncated to 3, then one row");
    }
    gm_results_trials_free(t, n);
    // leave a completed sample for the h5py check
    CHECK_OK(gm_results_open(path, &r, &err), &err);
    if (r) {
        CHECK_OK(gm_results_set_status(r, "completed", NULL, &err), &err);
        CHECK_OK(gm_results_save(r, &err), &err);
        gm_results_free(r);
    }
    check_no_leaks("resume");
}

/* ================================================================= errors */

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static void test_errors(const char *good) {
    gm_error err = {0};
    char path[600];
    gm_results *r = NULL;
    // not HDF5 at all
    in_dir(path, sizeof path, "garbage.h5");
    write_bytes(path, "this is not an HDF5 file, just text\n", 36);
    CHECK(gm_results_open(path, &r, &err) == GM_ERR_FORMAT && !r && gm_test_contains(err.msg, path),
          "garbage: %s", err.msg);
    gm_results_trial *t = NULL;
    int n = 0;
    CHECK(gm_results_read(path, &t, &n, &err) == GM_ERR_FORMAT && !t && gm_test_contains(err.msg, path),
          "garbage read: %s", err.msg);
    // a torn file: the first half of a valid one
    FILE *f = fopen(good, "rb");
    char buf[1 << 16];
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    in_dir(path, sizeof path, "torn.h5");
    write_bytes(path, buf, got / 2);
    CHECK(gm_results_open(path, &r, &err) == GM_ERR_FORMAT && !r && gm_test_contains(err.msg, path),
          "torn (%zu of %zu bytes): %s", got / 2, got, err.msg);
    // another HDF5 file (a checkpoint-like file without our format attribute)
    in_dir(path, sizeof path, "other.h5");
    gm_h5_file *h = NULL;
    CHECK_OK(gm_h5_create(path, &h, &err), &err);
    if (h) {
        gm_h5_attr_set_str(h, "/", "format", "gemmarun-checkpoint", &err);
        gm_h5_close(&h, &err);
    }
    CHECK(gm_results_open(path, &r, &err) == GM_ERR_FORMAT &&
              gm_test_contains(err.msg, "gemmarun-checkpoint"),
          "foreign format: %s", err.msg);
    // missing file: read says so (open would create it)
    in_dir(path, sizeof path, "missing.h5");
    CHECK(gm_results_read(path, &t, &n, &err) == GM_ERR_IO && gm_test_contains(err.msg, "no such file"),
          "missing: %s", err.msg);
    CHECK(gm_results_open(tmpdir, &r, &err) == GM_ERR_IO && gm_test_contains(err.msg, "folder"),
          "a folder: %s", err.msg);
    // a save into a folder that does not exist fails cleanly, the handle stays usable
    in_dir(path, sizeof path, "no/such/dir/trial-x.h5");
    CHECK_OK(gm_results_open(path, &r, &err), &err);
    if (r) {
        CHECK(gm_results_save(r, &err) == GM_ERR_IO && gm_test_contains(err.msg, "no/such/dir"),
              "save into a missing folder: %s", err.msg);
        CHECK_OK(gm_results_append(r, "loss", 1, &err), &err);
        gm_results_free(r);
    }
    char **paths = NULL;
    CHECK(gm_results_list(path, &paths, &n, &err) == GM_ERR_IO, "list of a missing folder");
    check_no_leaks("errors");
}

/* ================================================================= merge */

static void test_merge(const char *sample_dir, const char *merged) {
    gm_error err = {0};
    char dir[600], path[700];
    in_dir(dir, sizeof dir, "merge");
    mkdir(dir, 0755);
    // trials 1..4: 1-2 nf4, 3 bf16 failed, 4 bf16; written in reverse order
    for (int k = 4; k >= 1; k--) {
        snprintf(path, sizeof path, "%s/trial-t%03d.h5", dir, k);
        gm_results *r = NULL;
        CHECK_OK(gm_results_open(path, &r, &err), &err);
        if (!r) return;
        fill_trial(r, k, k == 3 ? "failed" : "completed",
                   k == 3 ? "out of memory at step 3" : NULL);
        if (k == 4) CHECK_OK(gm_results_config_str(r, "lr", "n/a", &err), &err); // a string lr
        CHECK_OK(gm_results_save(r, &err), &err);
        gm_results_free(r);
    }
    snprintf(path, sizeof path, "%s/ckpt-000010.h5", dir); // not trial files: not listed
    write_bytes(path, "x", 1);
    snprintf(path, sizeof path, "%s/trial-t001.ckpt.h5", dir);
    write_bytes(path, "x", 1);
    snprintf(path, sizeof path, "%s/trial-t009.h5.tmp", dir);
    write_bytes(path, "x", 1);
    char **paths = NULL;
    int np = 0;
    CHECK_OK(gm_results_list(dir, &paths, &np, &err), &err);
    CHECK(np == 4 && paths && gm_test_contains(paths[0], "trial-t001.h5") &&
              gm_test_contains(paths[3], "trial-t004.h5"),
          "list: 4 trial files in name order (got %d)", np);
    gm_results_list_free(paths, np);
    CHECK_OK(gm_results_merge(dir, merged, false, &err), &err);
    check_no_leaks("merge");

    // the table, read with H5TB like any PyTables reader would
    hid_t fid = H5Fopen(merged, H5F_ACC_RDONLY, H5P_DEFAULT);
    CHECK(fid >= 0, "merged file opens");
    if (fid < 0) return;
    hsize_t nfields = 0, nrecords = 0;
    CHECK(H5TBget_table_info(fid, "trials", &nfields, &nrecords) >= 0 && nrecords == 4,
          "table of 4 rows (%llu fields)", (unsigned long long)nfields);
    char **fnames = calloc(nfields, sizeof *fnames);
    for (hsize_t i = 0; i < nfields; i++) fnames[i] = calloc(256, 1);
    size_t *sizes = calloc(nfields, sizeof *sizes), *offs = calloc(nfields, sizeof *offs), rs = 0;
    H5TBget_field_info(fid, "trials", fnames, sizes, offs, &rs);
    char joined[4096] = "";
    for (hsize_t i = 0; i < nfields; i++) {
        strcat(joined, fnames[i]);
        strcat(joined, ",");
    }
    CHECK(strcmp(joined, "trial_id,trial_index,status,reason,seed,lr,quant,final_accuracy,"
                         "final_loss,final_n_examples,baseline_accuracy,baseline_n_examples,"
                         "wall_seconds,measured_peak_rss,planned_total,") == 0,
          "columns: %s", joined);
    double acc[4] = {0};
    int64_t idx[4] = {0};
    size_t o0 = 0, o1 = 0;
    CHECK(H5TBread_fields_name(fid, "trials", "final_accuracy", 0, 4, sizeof(double), &o0,
                               (size_t[]){sizeof(double)}, acc) >= 0 &&
              H5TBread_fields_name(fid, "trials", "trial_index", 0, 4, sizeof(int64_t), &o1,
                                   (size_t[]){sizeof(int64_t)}, idx) >= 0,
          "read columns");
    CHECK(idx[0] == 1 && idx[3] == 4 && fabs(acc[0] - 0.81) < 1e-12 && fabs(acc[3] - 0.84) < 1e-12,
          "rows in trial order: %lld %lld, %g %g", (long long)idx[0], (long long)idx[3], acc[0],
          acc[3]);
    for (hsize_t i = 0; i < nfields; i++) free(fnames[i]);
    free(fnames);
    free(sizes);
    free(offs);
    H5Fclose(fid);

    gm_results_trial *t = NULL;
    int n = 0;
    CHECK_OK(gm_results_read(merged, &t, &n, &err), &err);
    CHECK(n == 4, "every trial readable from the merged file (%d)", n);
    if (n == 4) {
        CHECK(attr_i64(&t[0].root, "trial_index", 1) && attr_str(&t[2].root, "status", "failed") &&
                  attr_str(&t[2].root, "reason", "out of memory at step 3"),
              "trial order and status");
        CHECK(series(&t[1], "loss") && series(&t[1], "loss")->n == 5, "metrics in the merged file");
        CHECK(t[0].n_adapter == 0, "adapters left out of the merge by default");
        CHECK(eval(&t[3], "final") && eval(&t[3], "final")->n_classes == 3,
              "evals in the merged file");
        CHECK(gm_test_contains(t[0].source, "#/trial/trial-t001"), "source names the group: %s",
              t[0].source);
    }
    gm_results_trials_free(t, n);
    gm_results *r = NULL;
    CHECK(gm_results_open(merged, &r, &err) == GM_ERR_FORMAT && gm_test_contains(err.msg, "merged"),
          "a merged file is not a trial file: %s", err.msg);
    // with adapters
    snprintf(path, sizeof path, "%s/merged_with_adapters.h5", sample_dir);
    CHECK_OK(gm_results_merge(dir, path, true, &err), &err);
    CHECK_OK(gm_results_read(path, &t, &n, &err), &err);
    CHECK(n == 4 && t[0].n_adapter == 1, "adapters merged on request");
    gm_results_trials_free(t, n);
    unlink(path);
    // a corrupt trial file stops the merge and leaves the previous merged file
    snprintf(path, sizeof path, "%s/trial-zzz.h5", dir);
    write_bytes(path, "garbage", 7);
    struct stat before, after;
    stat(merged, &before);
    CHECK(gm_results_merge(dir, merged, false, &err) == GM_ERR_FORMAT &&
              gm_test_contains(err.msg, "trial-zzz"),
          "corrupt trial in merge: %s", err.msg);
    stat(merged, &after);
    CHECK(before.st_ino == after.st_ino, "merged file untouched");
    unlink(path);
    in_dir(path, sizeof path, "empty");
    mkdir(path, 0755);
    CHECK(gm_results_merge(path, merged, false, &err) == GM_ERR_NOT_FOUND, "empty folder: %s",
          err.msg);
    check_no_leaks("merge read");
}

/* ================================================================= kill -9 */

typedef struct kill_msg {
    int64_t rows;
    int32_t done; // 0: saving a file with `rows` rows, 1: that save returned GM_OK
    int32_t pad;
} kill_msg;

#define KILL_TENSOR (256 * 1024) // 1 MiB of adapter: every save writes a real image

static double kill_value(int64_t row, int col) { return (double)row * 1.5 + col; }

/* The child: resumes the file, then appends a row and saves, forever. */
static void kill_child(const char *path, int fd) {
    gm_error e = {0};
    gm_results *r = NULL;
    if (gm_results_open(path, &r, &e) != GM_OK) {
        fprintf(stderr, "child open failed: %s\n", e.msg);
        _exit(3);
    }
    float *w = calloc(KILL_TENSOR, sizeof(float));
    int64_t shape[1] = {KILL_TENSOR};
    for (;;) {
        int64_t row = gm_results_rows(r);
        const char *names[3] = {"step", "loss", "lr"};
        double v[3] = {kill_value(row, 0), kill_value(row, 1), kill_value(row, 2)};
        for (int i = 0; i < KILL_TENSOR; i++) w[i] = (float)(row + i);
        if (gm_results_append_row(r, names, v, 3, &e) != GM_OK ||
            gm_results_set_i64(r, "n_trials", row + 1, &e) != GM_OK ||
            gm_results_put_tensor(r, "w", w, 1, shape, &e) != GM_OK) {
            fprintf(stderr, "child update failed: %s\n", e.msg);
            _exit(3);
        }
        kill_msg m = {row + 1, 0, 0};
        if (write(fd, &m, sizeof m) != sizeof m) _exit(2);
        if (gm_results_save(r, &e) != GM_OK) {
            fprintf(stderr, "child save failed: %s\n", e.msg);
            _exit(3);
        }
        m.done = 1;
        if (write(fd, &m, sizeof m) != sizeof m) _exit(2);
    }
}

/* kill_child through gm_test_fork_and_kill's (ctx, fd) signature */
static void kill_child_run(void *ctx, int fd) { kill_child(ctx, fd); }

/* The file holds a complete table of `rows` rows whose values are those of kill_value. */
static bool kill_verify(const char *path, int64_t *rows, char *why, size_t cap) {
    gm_error err = {0};
    gm_results_trial *t = NULL;
    int n = 0;
    *rows = -1;
    if (gm_results_read(path, &t, &n, &err) != GM_OK) {
        snprintf(why, cap, "%s", err.msg);
        return false;
    }
    bool ok = n == 1 && t[0].n_metrics == 3;
    const gm_results_attr *nt = ok ? attr(&t[0].root, "n_trials") : NULL;
    for (int c = 0; ok && c < 3; c++) {
        const gm_results_series *s = &t[0].metrics[c];
        int col = strcmp(s->name, "step") == 0 ? 0 : strcmp(s->name, "loss") == 0 ? 1 : 2;
        if (c == 0) *rows = s->n;
        ok = s->n == *rows;
        for (int64_t i = 0; ok && i < s->n; i++) ok = s->v[i] == kill_value(i, col);
    }
    ok = ok && nt && nt->kind == GM_RV_I64 && nt->i == *rows && t[0].n_adapter == 1;
    if (!ok) snprintf(why, cap, "values differ (rows %lld)", (long long)*rows);
    gm_results_trials_free(t, n);
    return ok;
}

static void test_kill9(void) {
    char path[600], tmp[700], why[1600];
    in_dir(path, sizeof path, "trial-killed.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    // how long one cycle takes: a short run of the child, timed from the parent
    gm_error err = {0};
    gm_results *r = NULL;
    CHECK_OK(gm_results_open(path, &r, &err), &err);
    float *w = calloc(KILL_TENSOR, sizeof(float));
    int64_t shape[1] = {KILL_TENSOR};
    double t0 = gm_test_now_s();
    CHECK_OK(gm_results_put_tensor(r, "w", w, 1, shape, &err), &err);
    CHECK_OK(gm_results_set_i64(r, "n_trials", 0, &err), &err);
    CHECK_OK(gm_results_save(r, &err), &err);
    double t_cycle = gm_test_now_s() - t0;
    free(w);
    gm_results_free(r);
    printf("kill -9: one save of a %.1f MiB trial file takes %.4f s\n",
           (double)KILL_TENSOR * 4 / 1048576.0, t_cycle);
    int64_t prev = 0; // rows the file held after the previous kill
    int torn = 0, mid = 0, landed = 0, tmp_left = 0, kills = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    double budget0 = gm_test_now_s();
    for (int life = 1; life <= 40; life++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        // from before the child's first save (its open + copy) to ~40 cycles in
        double delay = 0.001 + (double)(rng % 10000) / 10000.0 * 40 * t_cycle;
        char what[32];
        snprintf(what, sizeof what, "life %d", life);
        int rfd = gm_test_fork_and_kill(delay, kill_child_run, (void *)path, what);
        kills++;
        int64_t last_done = -1, in_flight = -1;
        kill_msg m;
        while (read(rfd, &m, sizeof m) == (ssize_t)sizeof m) {
            if (m.done)
                last_done = m.rows, in_flight = -1;
            else
                in_flight = m.rows;
        }
        close(rfd);
        tmp_left += gm_test_file_exists(tmp);
        mid += in_flight >= 0;
        int64_t rows = -1;
        bool ok = kill_verify(path, &rows, why, sizeof why);
        int64_t expect = last_done >= 0 ? last_done : prev;
        ok = ok && (rows == expect || (in_flight >= 0 && rows == in_flight));
        if (!ok) torn++;
        CHECK(ok, "life %d (delay %.3f s): %lld rows, expected %lld or %lld: %s", life, delay,
              (long long)rows, (long long)expect, (long long)in_flight, why);
        if (ok && in_flight >= 0 && rows == in_flight) landed++;
        if (ok) prev = rows;
        if (life >= 20 && gm_test_now_s() - budget0 > 10.0) break;
    }
    printf("kill -9: %d kills, %d torn; %d landed mid-save (%d already renamed), %d left a "
           "stray .tmp; the file grew to %lld rows over the kills (each life resumed it)\n",
           kills, torn, mid, landed, tmp_left, (long long)prev);
    CHECK(mid > 0, "some kills landed mid-save (else the test proves little)");
    CHECK(prev > 0, "the children made progress across kills");
    check_no_leaks("kill -9");
}

/* ================================================================= Lua */

/* Runs a chunk in a fresh sandboxed state with `results_root`; returns the error text or NULL. */
static char *run_lua(const char *results_root, const char *src) {
    gm_lua_opts lo = {.allow_os = false, .n_threads = 1};
    lua_State *L = NULL;
    gm_error err = {0};
    if (gm_lua_new(&lo, &L, &err) != GM_OK) return strdup(err.msg);
    gm_lua_set_results_root(L, results_root);
    char *res = NULL;
    if (gm_lua_run_string(L, src, strlen(src), "=test", &err) != GM_OK) res = strdup(err.msg);
    gm_lua_close(L);
    return res;
}

static const char LUA_CODE[] =
    "local r = gm.results(root .. '/exp/trial-a.h5')\n"
    "r:set{experiment='exp', trial_id='a', trial_index=1, n_trials=2, status='running',\n"
    "      report_json={rows={'quant'}, cols={'lr'}, metric='accuracy'}, "
    "swept_json={'lr','quant'}}\n"
    "r:set_config{lr=1e-4, quant='nf4', rank=16, checkpointing=true}\n"
    "r:append{step=1, loss=2.5}\n"
    "r:append{step=2, loss=2.0, lr=1e-4}\n"
    "r:set_eval('final', {accuracy=0.75, loss=0.5, n_examples=4, labels={'a','b'},\n"
    "                      per_class={0.5, 1.0}, confusion={{1,1},{0,2}}, perplexity=1.65})\n"
    "local okb, eb = pcall(r.set_eval, r, 'bad', {accuracy=0.5, note='x'})\n"
    "assert(not okb and eb:find('note'), 'non-numeric extra key refused: ' .. tostring(eb))\n"
    "r:set_memory{planned={['base weights']=100, adapters=5, total=105}, measured_peak_rss=200}\n"
    "r:set_data{n_train=10, n_test=4, n_rejected=1, n_truncated=0,\n"
    "           rejections={{example=3, reason='too long'}}}\n"
    "r:set{status='completed', wall_seconds=1.5}\n"
    "r:save(); r:close()\n"
    "local t = gm.results_read(root .. '/exp/trial-a.h5')\n"
    "assert(t.status == 'completed' and t.trial_index == 1, 'root')\n"
    "assert(t.config.checkpointing == true and t.config.rank == 16 and t.config.quant == 'nf4', "
    "'config')\n"
    "assert(#t.metrics.loss == 2 and t.metrics.lr[1] ~= t.metrics.lr[1], 'metrics, NaN pad')\n"
    "assert(t.eval.final.accuracy == 0.75 and t.eval.final.confusion[1][2] == 1, 'eval')\n"
    "assert(t.eval.final.labels[2] == 'b' and t.eval.final.per_class[1] == 0.5, 'labels')\n"
    "assert(t.eval.final.perplexity == 1.65 and t.eval.bad == nil, 'extra eval attribute')\n"
    "assert(t.memory.planned_base_weights == 100 and t.memory.planned_total == 105, 'memory')\n"
    "assert(t.data.rejections[1].reason == 'too long', 'data')\n"
    "assert(t.report.rows[1] == 'quant' and t.swept[2] == 'quant', 'json decoded')\n"
    "local missing, why = gm.results_read(root .. '/exp/none.h5')\n"
    "assert(missing == nil and why:find('no such file'), 'missing file is nil, msg')\n"
    "local list = gm.results_list(root .. '/exp')\n"
    "assert(#list == 1 and list[1]:find('trial%-a.h5$'), 'list')\n"
    "gm.results_merge(root .. '/exp', root .. '/exp.h5')\n"
    "local all = gm.results_read_all(root .. '/exp.h5')\n"
    "assert(#all == 1 and all[1].trial_id == 'a', 'read_all merged')\n"
    "local info = gm.plot{file = root .. '/p.png', title = 'loss', xlabel = 'step', ylabel = "
    "'loss',\n"
    "  series = {{label = 'a', x = {1,2,3}, y = {3,2,1.5}}, {label = 'b', x = {1,2,3}, y = "
    "{2.5,2,1}}}}\n"
    "assert(info.width == 1024 and info.height == 640, 'png size')\n"
    /* confusion matrices: a square PNG (1024 px up to 29 short names), shaded cells; the third
     * row has no examples (no share: grey, no division by zero) */
    "local ci = gm.plot{file = root .. '/c3.png', kind = 'confusion', title = 'trial 1: final',\n"
    "  labels = {'a', 'b', 'c'}, matrix = {{5, 1, 0}, {2, 7, 1}, {0, 0, 0}}}\n"
    "assert(ci.width == 1024 and ci.height == 1024, 'confusion png size ' .. ci.width .. 'x' .. ci.height)\n"
    "assert(ci.ink > 0.3 and ci.ink < 0.9, 'confusion: the cells are drawn, ink ' .. ci.ink)\n"
    "local zero = {}\n"
    "for i = 1, 3 do zero[i] = {0, 0, 0} end\n"
    "assert(gm.plot{file = root .. '/c0.png', kind = 'confusion', labels = {'a', 'b', 'c'}, matrix = zero}.ink > 0.3,\n"
    "  'an all-zero matrix draws')\n"
    /* 37 long names (Oxford Pets' breeds are up to 26 characters): a larger square page */
    "local L37, M37 = {}, {}\n"
    "for i = 1, 37 do L37[i] = 'staffordshire_bull_terrier_' .. i; M37[i] = {}\n"
    "  for j = 1, 37 do M37[i][j] = i == j and 40 or (i + j) % 7 == 0 and 3 or 0 end end\n"
    "local c37 = gm.plot{file = root .. '/c37.png', kind = 'confusion', labels = L37, matrix = M37}\n"
    "assert(c37.width == c37.height and c37.width > 1024 and c37.width <= 4096, 'K = 37: ' .. c37.width)\n"
    "assert(c37.ink > 0.15, 'K = 37 ink ' .. c37.ink)\n"
    "local function plot_err(spec, want)\n"
    "  spec.file, spec.kind = spec.file or root .. '/bad.png', spec.kind or 'confusion'\n"
    "  local ok, e = pcall(gm.plot, spec)\n"
    "  assert(not ok and tostring(e):find(want), 'want /' .. want .. '/, got ' .. tostring(e))\n"
    "end\n"
    "plot_err({labels = {'a', 'b', 'c'}, matrix = {{1, 2}, {3, 4}}}, \"'matrix' has 2 rows but 'labels' names 3\")\n"
    "plot_err({labels = {'a', 'b'}, matrix = {{1, 2}, {3, 4, 5}}}, 'matrix%[2%] has 3 counts but .labels. names 2')\n"
    "plot_err({labels = {'a', 'b'}, matrix = {{1, 2}, 3}}, 'matrix%[2%] must be a list of 2 counts')\n"
    "plot_err({labels = {'a', 'b'}, matrix = {{1, -1}, {3, 4}}}, 'matrix%[1%]%[2%] must be a whole number >= 0')\n"
    "plot_err({labels = {'a', 'b'}, matrix = {{1, 2}, {0.5, 4}}}, 'matrix%[2%]%[1%] must be a whole number >= 0.*0%.5')\n"
    "plot_err({labels = {'a', 'b'}, matrix = {{1, 2}, {0/0, 4}}}, 'matrix%[2%]%[1%] must be a whole number')\n"
    "plot_err({labels = {'a', 'b'}, matrix = {{1, 'x'}, {3, 4}}}, 'matrix%[1%]%[2%] must be a whole number')\n"
    "plot_err({labels = {}, matrix = {}}, \"'labels' is empty\")\n"
    "plot_err({labels = {'a', 2}, matrix = {{1, 2}, {3, 4}}}, 'labels%[2%] must be a string')\n"
    "plot_err({labels = {'a'}}, \"needs 'matrix'\")\n"
    "plot_err({matrix = {{1}}}, \"needs 'labels'\")\n"
    "plot_err({labels = {'a'}, matrix = {{1}}, series = {}}, \"'series' is not an option of kind 'confusion'\")\n"
    "plot_err({kind = 'lines', matrix = {{1}}, series = {{x = {1}, y = {1}}}}, \"'matrix' belongs to kind 'confusion'\")\n"
    "assert(not gm.file_exists(root .. '/bad.png') and not gm.file_exists(root .. '/bad.png.tmp'), 'no file left')\n"
    /* path refusals are usage errors (exit 2): {usage = true, msg = "file:line: ..."} */
    "local ok, e = pcall(gm.results, '/etc/trial-x.h5')\n"
    "assert(not ok and e.usage and e.msg:find('results folder'), 'outside the root: ' .. tostring(e.msg))\n"
    "ok, e = pcall(gm.results, root .. '/../x/trial-x.h5')\n"
    "assert(not ok and e.usage and e.msg:find('%.%.'), 'dot-dot: ' .. tostring(e.msg))\n"
    "ok, e = pcall(gm.write_text, root .. '/../x.md', 'x')\n"
    "assert(not ok, 'write_text outside')\n"
    "gm.write_text(root .. '/sub/t.md', 'hello')\n"
    "local m <close> = gm.load_model(model_path)\n"
    "local tr <close> = m:trainer{rank = 4, alpha = 8, targets = 'q_proj,v_proj', steps = 1, "
    "max_length = 16, batch = 1}\n"
    "local ra = gm.results(root .. '/exp/trial-adapter.h5')\n"
    "local nt = ra:put_adapter(tr)\n"
    "ra:save(); ra:close()\n"
    "local ta = gm.results_read(root .. '/exp/trial-adapter.h5')\n"
    "assert(nt > 0 and #ta.adapter == nt, 'adapter tensors: ' .. nt .. ' vs ' .. #ta.adapter)\n"
    "local A = ta.adapter[1]\n"
    "assert(A.name:find('^base_model%.model%.model%.layers%.0%.') and "
    "A.name:find('lora_A.weight$'), A.name)\n"
    "assert(A.shape[1] == 4, 'lora_A is (rank, in): ' .. A.shape[1])\n"
    "ok, e = pcall(function() r:append{loss=1} end)\n"
    "assert(not ok and e:find('closed'), 'use after close')\n"
    "ok, e = pcall(function() local q = gm.results(root .. '/exp/trial-b.h5'); q:set{bogus=1} "
    "end)\n"
    "assert(not ok and e:find('bogus'), 'strict keys: ' .. tostring(e))\n";

static void test_lua(void) {
    char root[600];
    in_dir(root, sizeof root, "lua_results");
    char final_src[sizeof LUA_CODE + 1400];
    snprintf(final_src, sizeof final_src, "local root = '%s'\nlocal model_path = '%s'\n%s", root,
             gm_test_path("tests/ref/tiny_gemma3"), LUA_CODE);
    char *e = run_lua(root, final_src);
    CHECK(e == NULL, "Lua results API: %s", e ? e : "");
    free(e);
    char p[700];
    snprintf(p, sizeof p, "%s/sub/t.md", root);
    FILE *f = fopen(p, "r");
    char buf[16] = "";
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
        fclose(f);
    }
    CHECK(strcmp(buf, "hello") == 0, "write_text wrote the file");
    check_no_leaks("lua");
}

int main(void) {
    if (!gm_test_make_tmpdir("results", tmpdir, sizeof tmpdir)) return gm_test_finish();
    gm_h5_silence();
    h5_baseline = gm_h5_open_objects();
    char sample_dir[600], merged[700], trial[700];
    const char *env = getenv("GM_TEST_RESULTS_OUT");
    snprintf(sample_dir, sizeof sample_dir, "%s",
             env && env[0] ? env : GM_BINARY_DIR "/test_results_sample");
    mkdir(sample_dir, 0755);
    snprintf(merged, sizeof merged, "%s/merged.h5", sample_dir);
    snprintf(trial, sizeof trial, "%s/trial-t001.h5", sample_dir);

    double t0 = gm_test_now_s();
    test_roundtrip(sample_dir);
    test_errors(trial);
    test_merge(sample_dir, merged);
    test_kill9();
    test_lua();
    printf("total %.1f s; samples for h5py/pandas: %s, %s\n", gm_test_now_s() - t0, trial, merged);

    gm_test_remove_tmpdir(tmpdir);
    return gm_test_finish();
}
