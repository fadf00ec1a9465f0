/*
 * test_checkpoint.c - the HDF5 layer (gm_h5) and training checkpoints (gm_checkpoint).
 *
 * gm_h5: attributes of every kind (including a 256 KiB string and non-ASCII text), datasets of
 * every dtype and rank 0..4, listing, appendable series, the error bridge (HDF5 stack text in
 * the message), and no HDF5 identifier left open by any path.
 * gm_checkpoint: bit-exact round trip (NaN, -0, denormals, u64 extremes), every load error
 * with a message naming the file and the tensor, atomic overwrite under an open reader,
 * "disk full" (RLIMIT_FSIZE) in a child, kill -9 of a child saving 50 MB checkpoints in a
 * loop (the file at <path> must always load completely as one of the saves), and allocation
 * failure injection through save, load and read_config.
 *
 * Leaves two files for tests/ref/check_checkpoint_h5py.py: a small checkpoint at
 * $GM_TEST_CKPT_OUT (default <build>/test_checkpoint_sample.h5) and a metrics file next to it
 * (<same>.metrics.h5, per-step series appended one value at a time).
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_checkpoint.h"
#include "gm_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];
static int64_t h5_baseline; // gm_h5_open_objects() with no file open

static const char *in_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static void check_no_leaks(const char *where) {
    int64_t files = (int64_t)H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
    CHECK(files == 0, "%s: %lld HDF5 file objects still open", where, (long long)files);
    int64_t n = gm_h5_open_objects();
    CHECK(n == h5_baseline, "%s: %lld HDF5 ids open, baseline %lld", where, (long long)n,
          (long long)h5_baseline);
}

/* ================================================================================== gm_h5 */

static void test_h5_attrs(void) {
    char path[512];
    in_dir(path, sizeof path, "attrs.h5");
    gm_error err = {0};
    gm_h5_file *f = NULL;
    CHECK_OK(gm_h5_create(path, &f, &err), &err);
    if (!f) return;
    CHECK(strcmp(gm_h5_path(f), path) == 0, "path kept");
    CHECK_OK(gm_h5_group_create(f, "/a/b/c", &err), &err); // intermediates
    CHECK_OK(gm_h5_group_create(f, "/a/b", &err), &err);   // existing group: fine
    CHECK(gm_h5_exists(f, "/a") && gm_h5_exists(f, "/a/b/c") && gm_h5_exists(f, "/"), "exists");
    CHECK(!gm_h5_exists(f, "/nope") && !gm_h5_exists(f, "/nope/deeper/still"), "absent paths");

    CHECK_OK(gm_h5_attr_set_i64(f, "/", "i", INT64_MIN, &err), &err);
    CHECK_OK(gm_h5_attr_set_u64(f, "/", "u", UINT64_MAX, &err), &err);
    CHECK_OK(gm_h5_attr_set_f64(f, "/a/b", "d", 0.1, &err), &err);
    CHECK_OK(gm_h5_attr_set_str(f, "/", "s", "naïve ✓ \"quoted\"", &err), &err);
    CHECK_OK(gm_h5_attr_set_str(f, "/", "empty", "", &err), &err);
    CHECK_OK(gm_h5_attr_set_i64(f, "/", "small", 7, &err), &err);
    // a config far larger than the 64 KiB object-header limit: vlen text lives in the heap
    size_t big_n = 256 * 1024;
    char *big = malloc(big_n + 1);
    for (size_t i = 0; i < big_n; i++) big[i] = (char)('a' + i % 26);
    big[big_n] = '\0';
    CHECK_OK(gm_h5_attr_set_str(f, "/", "big", big, &err), &err);
    // replacing an attribute changes its value and type
    CHECK_OK(gm_h5_attr_set_i64(f, "/", "replaced", 1, &err), &err);
    CHECK_OK(gm_h5_attr_set_str(f, "/", "replaced", "now a string", &err), &err);
    gm_status s = gm_h5_attr_set_i64(f, "/missing", "x", 1, &err);
    CHECK(s == GM_ERR_NOT_FOUND && gm_test_contains(err.msg, "/missing"), "attr on missing object: %s",
          err.msg);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    CHECK(f == NULL, "close clears the handle");

    CHECK_OK(gm_h5_open(path, false, &f, &err), &err);
    if (!f) {
        free(big);
        return;
    }
    int64_t i = 0;
    uint64_t u = 0;
    double d = 0;
    char *str = NULL;
    CHECK_OK(gm_h5_attr_get_i64(f, "/", "i", &i, &err), &err);
    CHECK(i == INT64_MIN, "i64 %lld", (long long)i);
    CHECK_OK(gm_h5_attr_get_u64(f, "/", "u", &u, &err), &err);
    CHECK(u == UINT64_MAX, "u64 %llu", (unsigned long long)u);
    CHECK_OK(gm_h5_attr_get_f64(f, "/a/b", "d", &d, &err), &err);
    CHECK(d == 0.1, "f64 %.17g", d);
    CHECK_OK(gm_h5_attr_get_f64(f, "/", "small", &d, &err), &err);
    CHECK(d == 7.0, "int read as f64: %g", d);
    CHECK_OK(gm_h5_attr_get_u64(f, "/", "small", &u, &err), &err);
    CHECK(u == 7, "non-negative i64 read as u64");
    CHECK_OK(gm_h5_attr_get_str(f, "/", "s", &str, &err), &err);
    CHECK(str && strcmp(str, "naïve ✓ \"quoted\"") == 0, "utf-8 string: %s", str ? str : "");
    gm_free(str);
    CHECK_OK(gm_h5_attr_get_str(f, "/", "empty", &str, &err), &err);
    CHECK(str && str[0] == '\0', "empty string");
    gm_free(str);
    CHECK_OK(gm_h5_attr_get_str(f, "/", "big", &str, &err), &err);
    CHECK(str && strcmp(str, big) == 0, "256 KiB string attribute round trip");
    gm_free(str);
    CHECK_OK(gm_h5_attr_get_str(f, "/", "replaced", &str, &err), &err);
    CHECK(str && strcmp(str, "now a string") == 0, "replaced attribute");
    gm_free(str);

    // errors: missing, wrong class, out of range
    s = gm_h5_attr_get_i64(f, "/", "absent", &i, &err);
    CHECK(s == GM_ERR_NOT_FOUND && gm_test_contains(err.msg, path) && gm_test_contains(err.msg, "'absent'"),
          "missing attribute: %s", err.msg);
    s = gm_h5_attr_get_i64(f, "/", "s", &i, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "not an integer"), "string as int: %s", err.msg);
    s = gm_h5_attr_get_str(f, "/", "i", &str, &err);
    CHECK(s == GM_ERR_FORMAT && str == NULL && gm_test_contains(err.msg, "not a string"),
          "int as string: %s", err.msg);
    s = gm_h5_attr_get_u64(f, "/", "i", &u, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "negative"), "negative as u64: %s", err.msg);
    s = gm_h5_attr_get_i64(f, "/", "u", &i, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "does not fit"), "u64 max as i64: %s", err.msg);
    // a read-only file refuses writes with the HDF5 stack text in the message
    s = gm_h5_attr_set_i64(f, "/", "ro", 1, &err);
    CHECK(s == GM_ERR_IO && gm_test_contains(err.msg, "HDF5: "), "write to read-only file: %s", err.msg);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    free(big);
    check_no_leaks("attributes");
}

static void test_h5_datasets(void) {
    char path[512];
    in_dir(path, sizeof path, "dsets.h5");
    gm_error err = {0};
    gm_h5_file *f = NULL;
    CHECK_OK(gm_h5_create(path, &f, &err), &err);
    if (!f) return;
    float f32[2 * 3];
    double f64[5];
    int32_t i32[2 * 2 * 3];
    int64_t i64[1 * 2 * 1 * 3];
    uint64_t st = 42;
    for (int i = 0; i < 6; i++) f32[i] = gm_test_rand(&st);
    f32[1] = -0.0f;
    f32[2] = NAN;
    f32[3] = 1e-45f; // smallest denormal
    for (int i = 0; i < 5; i++) f64[i] = 1.0 / (i + 3);
    for (int i = 0; i < 12; i++) i32[i] = i * 1000003 - 7;
    for (int i = 0; i < 6; i++) i64[i] = (int64_t)1 << (10 * i);
    double scalar = 2.5;
    const int64_t s32[] = {2, 3}, s64[] = {5}, si32[] = {2, 2, 3}, si64[] = {1, 2, 1, 3},
                  sempty[] = {0, 4};
    CHECK_OK(gm_h5_write(f, "/t/f32", GM_F32, 2, s32, f32, &err), &err);
    CHECK_OK(gm_h5_write(f, "/t/f64", GM_F64, 1, s64, f64, &err), &err);
    CHECK_OK(gm_h5_write(f, "/t/deep/i32", GM_I32, 3, si32, i32, &err), &err);
    CHECK_OK(gm_h5_write(f, "/t/i64", GM_I64, 4, si64, i64, &err), &err);
    CHECK_OK(gm_h5_write(f, "/t/scalar", GM_F64, 0, NULL, &scalar, &err), &err);
    CHECK_OK(gm_h5_write(f, "/t/empty", GM_F32, 2, sempty, NULL, &err), &err);
    CHECK_OK(gm_h5_attr_set_str(f, "/t/f32", "note", "attribute on a dataset", &err), &err);
    gm_status s = gm_h5_write(f, "/t/f32", GM_F32, 2, s32, f32, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "already exists"), "rewrite: %s", err.msg);
    s = gm_h5_write(f, "/t/bf16", GM_BF16, 2, s32, f32, &err);
    CHECK(s == GM_ERR_UNSUPPORTED && gm_test_contains(err.msg, "bf16"), "bf16: %s", err.msg);
    const int64_t s5[] = {1, 1, 1, 1, 1};
    s = gm_h5_write(f, "/t/rank5", GM_F32, 5, s5, f32, &err);
    CHECK(s == GM_ERR_INVALID, "rank 5: %s", err.msg);
    s = gm_h5_group_create(f, "/t/f32", &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "dataset exists"), "group over dataset: %s",
          err.msg);

    // listing: name order, kinds
    gm_h5_child *kids = NULL;
    int n = 0;
    CHECK_OK(gm_h5_list(f, "/t", &kids, &n, &err), &err);
    const char *want[] = {"deep", "empty", "f32", "f64", "i64", "scalar"};
    CHECK(n == 6, "6 children, got %d", n);
    for (int i = 0; i < n && i < 6; i++) {
        CHECK(strcmp(kids[i].name, want[i]) == 0, "child %d: %s", i, kids[i].name);
        CHECK(kids[i].kind == (i == 0 ? GM_H5_GROUP : GM_H5_DATASET), "kind of %s", kids[i].name);
    }
    gm_h5_list_free(kids, n);
    s = gm_h5_list(f, "/t/f32", &kids, &n, &err);
    CHECK(s == GM_ERR_FORMAT && kids == NULL && n == 0, "list a dataset: %s", err.msg);
    s = gm_h5_list(f, "/zzz", &kids, &n, &err);
    CHECK(s == GM_ERR_NOT_FOUND, "list missing: %s", err.msg);
    CHECK_OK(gm_h5_close(&f, &err), &err);

    // read back, bit-exact
    CHECK_OK(gm_h5_open(path, false, &f, &err), &err);
    if (!f) return;
    float rf32[6];
    double rf64[5], rscalar = 0;
    int32_t ri32[12];
    int64_t ri64[6];
    CHECK_OK(gm_h5_read(f, "/t/f32", GM_F32, 2, s32, rf32, &err), &err);
    CHECK(memcmp(rf32, f32, sizeof f32) == 0, "f32 bit-exact (NaN, -0, denormal)");
    CHECK_OK(gm_h5_read(f, "/t/f64", GM_F64, 1, s64, rf64, &err), &err);
    CHECK(memcmp(rf64, f64, sizeof f64) == 0, "f64 bit-exact");
    CHECK_OK(gm_h5_read(f, "/t/deep/i32", GM_I32, 3, si32, ri32, &err), &err);
    CHECK(memcmp(ri32, i32, sizeof i32) == 0, "i32 exact");
    CHECK_OK(gm_h5_read(f, "/t/i64", GM_I64, 4, si64, ri64, &err), &err);
    CHECK(memcmp(ri64, i64, sizeof i64) == 0, "i64 exact");
    CHECK_OK(gm_h5_read(f, "/t/scalar", GM_F64, 0, NULL, &rscalar, &err), &err);
    CHECK(rscalar == 2.5, "scalar dataset");
    CHECK_OK(gm_h5_read(f, "/t/empty", GM_F32, 2, sempty, NULL, &err), &err);
    gm_dtype dt;
    int nd;
    int64_t shape[4];
    CHECK_OK(gm_h5_dataset_info(f, "/t/i64", &dt, &nd, shape, &err), &err);
    CHECK(dt == GM_I64 && nd == 4 && shape[0] == 1 && shape[1] == 2 && shape[2] == 1 &&
          shape[3] == 3, "info i64 (1, 2, 1, 3)");
    CHECK_OK(gm_h5_dataset_info(f, "/t/scalar", &dt, &nd, shape, &err), &err);
    CHECK(dt == GM_F64 && nd == 0, "info scalar");

    // shape mismatch: both shapes, buffer untouched
    float untouched[6] = {9, 9, 9, 9, 9, 9};
    const int64_t s23t[] = {3, 2};
    s = gm_h5_read(f, "/t/f32", GM_F32, 2, s23t, untouched, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "(2, 3)") && gm_test_contains(err.msg, "(3, 2)") &&
          gm_test_contains(err.msg, "/t/f32") && gm_test_contains(err.msg, path), "shape mismatch: %s", err.msg);
    CHECK(untouched[0] == 9 && untouched[5] == 9, "buffer untouched on mismatch");
    s = gm_h5_read(f, "/t/f32", GM_F32, 1, s64, untouched, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "(5)"), "rank mismatch: %s", err.msg);
    s = gm_h5_read(f, "/t/f32", GM_I32, 2, s32, ri32, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "f32"), "f32 read as i32: %s", err.msg);
    s = gm_h5_read(f, "/t/nope", GM_F32, 2, s32, rf32, &err);
    CHECK(s == GM_ERR_NOT_FOUND && gm_test_contains(err.msg, "/t/nope"), "missing dataset: %s", err.msg);
    s = gm_h5_read(f, "/t/deep", GM_F32, 2, s32, rf32, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "not a dataset"), "group as dataset: %s",
          err.msg);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    check_no_leaks("datasets");
}

/* Per-step series: one value per append, as a training loop would, made durable every 100
 * steps: a disk file by gm_h5_flush, or a memory file by gm_h5_save_atomic (the snapshot
 * variant's file is kept, at metrics_path, for the h5py check). */
static void test_h5_series(const char *metrics_path, bool snapshot) {
    gm_error err = {0};
    gm_h5_file *f = NULL;
    const int N = 2500;
    if (snapshot)
        CHECK_OK(gm_h5_create_memory(metrics_path, 0, &f, &err), &err);
    else
        CHECK_OK(gm_h5_create(metrics_path, &f, &err), &err);
    if (!f) return;
    CHECK_OK(gm_h5_attr_set_str(f, "/", "run", "test_checkpoint series", &err), &err);
    CHECK_OK(gm_h5_series_create(f, "/metrics/lr", GM_F64, 256, &err), &err);
    double t0 = gm_test_now_s();
    gm_status first_bad = GM_OK;
    for (int i = 0; i < N; i++) {
        gm_status s = gm_h5_append_i64(f, "/metrics/step", i + 1, &err);
        if (s == GM_OK) s = gm_h5_append_f64(f, "/metrics/loss", 5.0 / (1.0 + 0.01 * i), &err);
        double lr = 1e-4 * (i < 100 ? i / 100.0 : 1); // warm-up, then constant
        if (s == GM_OK) s = gm_h5_append_f64(f, "/metrics/lr", lr, &err);
        if (s == GM_OK && (i + 1) % 100 == 0)
            s = snapshot ? gm_h5_save_atomic(f, metrics_path, &err) : gm_h5_flush(f, &err);
        if (s != GM_OK && first_bad == GM_OK) {
            first_bad = s;
            CHECK(false, "append %d: %s", i, err.msg);
        }
    }
    double dt = gm_test_now_s() - t0;
    printf("series (%s): %d steps x 3 appends + %d %s in %.3f s\n",
           snapshot ? "memory file" : "disk file", N, N / 100,
           snapshot ? "atomic snapshots" : "flushes", dt);
    double batch[3] = {1, 2, 3};
    CHECK_OK(gm_h5_append(f, "/metrics/batch", GM_F64, batch, 3, &err), &err);
    CHECK_OK(gm_h5_append(f, "/metrics/batch", GM_F64, batch, 0, &err), &err);
    gm_status s = gm_h5_append_i64(f, "/metrics/loss", 1, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "holds floats"), "i64 into f64 series: %s",
          err.msg);
    const int64_t one[] = {1};
    CHECK_OK(gm_h5_write(f, "/fixed", GM_F64, 1, one, batch, &err), &err);
    s = gm_h5_append_f64(f, "/fixed", 1, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "appendable"), "append to fixed: %s", err.msg);
    s = gm_h5_series_create(f, "/metrics/bad", GM_F32, 0, &err);
    CHECK(s == GM_ERR_UNSUPPORTED, "f32 series: %s", err.msg);
    if (snapshot) {
        CHECK_OK(gm_h5_save_atomic(f, metrics_path, &err), &err);
    } else {
        s = gm_h5_save_atomic(f, metrics_path, &err);
        CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "memory"), "snapshot of a disk file: %s",
              err.msg);
    }
    CHECK_OK(gm_h5_close(&f, &err), &err);

    CHECK_OK(gm_h5_open(metrics_path, false, &f, &err), &err);
    if (!f) return;
    gm_dtype dt_;
    int nd;
    int64_t shape[4];
    CHECK_OK(gm_h5_dataset_info(f, "/metrics/loss", &dt_, &nd, shape, &err), &err);
    CHECK(dt_ == GM_F64 && nd == 1 && shape[0] == N, "loss series length %lld",
          (long long)shape[0]);
    double *loss = malloc(sizeof(double) * (size_t)N);
    int64_t *step = malloc(sizeof(int64_t) * (size_t)N);
    const int64_t sn[] = {N};
    CHECK_OK(gm_h5_read(f, "/metrics/loss", GM_F64, 1, sn, loss, &err), &err);
    CHECK_OK(gm_h5_read(f, "/metrics/step", GM_I64, 1, sn, step, &err), &err);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (loss[i] != 5.0 / (1.0 + 0.01 * i) || step[i] != i + 1) bad++;
    CHECK(bad == 0, "%d series values differ", bad);
    free(loss);
    free(step);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    check_no_leaks("series");
}

/* More series than the handle keeps open (16): appends rotate through the cache, evicting. */
static void test_h5_series_many(void) {
    char path[512];
    in_dir(path, sizeof path, "many.h5");
    gm_error err = {0};
    gm_h5_file *f = NULL;
    CHECK_OK(gm_h5_create(path, &f, &err), &err);
    if (!f) return;
    enum { SERIES = 20, STEPS = 50 };
    int bad = 0;
    char name[64];
    for (int step = 0; step < STEPS; step++)
        for (int k = 0; k < SERIES; k++) {
            snprintf(name, sizeof name, "/m/s%02d", k);
            bad += gm_h5_append_f64(f, name, k * 1000 + step, &err) != GM_OK;
        }
    CHECK(bad == 0, "%d appends failed: %s", bad, err.msg);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    CHECK_OK(gm_h5_open(path, false, &f, &err), &err);
    if (!f) return;
    double v[STEPS];
    const int64_t sh[] = {STEPS};
    for (int k = 0; k < SERIES; k++) {
        snprintf(name, sizeof name, "/m/s%02d", k);
        CHECK_OK(gm_h5_read(f, name, GM_F64, 1, sh, v, &err), &err);
        for (int step = 0; step < STEPS; step++) bad += v[step] != k * 1000 + step;
    }
    CHECK(bad == 0, "%d values differ after rotating through the series cache", bad);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    check_no_leaks("many series");
}

static void test_h5_errors(void) {
    gm_error err = {0};
    gm_h5_file *f = NULL;
    char path[512];
    gm_status s = gm_h5_create("/nonexistent-dir-gm/x.h5", &f, &err);
    printf("create in a missing folder: %s\n", err.msg);
    CHECK(s == GM_ERR_IO && f == NULL && gm_test_contains(err.msg, "/nonexistent-dir-gm/x.h5") &&
          gm_test_contains(err.msg, "HDF5: ") && gm_test_contains(err.msg, "No such file or directory"),
          "create in a missing folder: %s", err.msg);
    s = gm_h5_open(in_dir(path, sizeof path, "none.h5"), false, &f, &err);
    CHECK(s == GM_ERR_IO && gm_test_contains(err.msg, "no such file") && gm_test_contains(err.msg, path),
          "open missing: %s", err.msg);
    in_dir(path, sizeof path, "text.h5");
    FILE *t = fopen(path, "w");
    fputs("this is not HDF5\n", t);
    fclose(t);
    s = gm_h5_open(path, false, &f, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "not an HDF5 file") && gm_test_contains(err.msg, path),
          "open text: %s", err.msg);
    s = gm_h5_open(tmpdir, false, &f, &err);
    CHECK(s == GM_ERR_IO && gm_test_contains(err.msg, "directory"), "open a folder: %s", err.msg);
    CHECK_OK(gm_h5_close(NULL, &err), &err);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    // a truncated HDF5 file: signature present, the rest missing
    char good[512];
    in_dir(good, sizeof good, "trunc_src.h5");
    CHECK_OK(gm_h5_create(good, &f, &err), &err);
    float x[1024] = {0};
    const int64_t sh[] = {1024};
    CHECK_OK(gm_h5_write(f, "/x", GM_F32, 1, sh, x, &err), &err);
    CHECK_OK(gm_h5_close(&f, &err), &err);
    in_dir(path, sizeof path, "trunc.h5");
    CHECK(truncate(good, 1000) == 0 && rename(good, path) == 0, "truncate");
    s = gm_h5_open(path, false, &f, &err);
    printf("open truncated: %s\n", err.msg);
    CHECK(s == GM_ERR_IO && gm_test_contains(err.msg, "HDF5: ") && gm_test_contains(err.msg, path),
          "open truncated: %s", err.msg);
    check_no_leaks("errors");
}

/* A log kept as a memory file and snapshotted with gm_h5_save_atomic: the disk "fills up"
 * (RLIMIT_FSIZE: writes past the limit fail with EFBIG) between two snapshots. The failed save
 * reports GM_ERR_IO, leaves the previous snapshot and no .tmp, the log keeps working, and the
 * process exits cleanly: it ends with exit(), so HDF5's atexit clean-up runs (after a failed
 * write to a *disk* file, HDF5 1.10.8 crashes right there; see gm_h5.h). */
static void test_h5_snapshot_disk_full(void) {
    char path[512], tmp[600];
    in_dir(path, sizeof path, "snap_log.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        gm_error e = {0};
        gm_h5_file *f = NULL;
        int bad = 0;
        if (gm_h5_create_memory(path, 0, &f, &e) != GM_OK) exit(2);
        for (int i = 0; i < 100; i++) bad += gm_h5_append_f64(f, "/metrics/loss", i, &e) != GM_OK;
        bad += gm_h5_save_atomic(f, path, &e) != GM_OK;
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {16 * 1024, 16 * 1024};
        setrlimit(RLIMIT_FSIZE, &rl);
        static double big[1 << 16]; // 512 KiB more, uncompressed: the image exceeds the limit
        const int64_t bsh[] = {1 << 16};
        bad += gm_h5_write(f, "/big", GM_F64, 1, bsh, big, &e) != GM_OK;
        gm_status s = gm_h5_save_atomic(f, path, &e);
        printf("  snapshot on a full disk: %s: %s\n", gm_status_name(s), e.msg);
        bool ok = s == GM_ERR_IO && gm_test_contains(e.msg, "untouched") && !gm_test_file_exists(tmp);
        for (int i = 0; i < 10; i++) bad += gm_h5_append_f64(f, "/metrics/loss", i, &e) != GM_OK;
        ok = ok && gm_h5_close(&f, &e) == GM_OK && gm_h5_open_objects() == h5_baseline;
        // the previous snapshot is whole
        gm_h5_file *r = NULL;
        double loss[100];
        const int64_t sh[] = {100};
        ok = ok && gm_h5_open(path, false, &r, &e) == GM_OK &&
             gm_h5_read(r, "/metrics/loss", GM_F64, 1, sh, loss, &e) == GM_OK && loss[99] == 99;
        gm_h5_close(&r, NULL);
        fflush(stdout);
        exit(ok && bad == 0 ? 0 : 1); // exit(), not _exit(): HDF5's atexit clean-up runs
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "snapshot on a full disk: GM_ERR_IO, previous "
          "snapshot whole, clean exit (status %d, signal %d)", st,
          WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* ============================================================================ checkpoints */

#define PEFT(layer, mod, ab)                                                                  \
    "base_model.model.model.layers." #layer ".self_attn." #mod ".lora_" #ab ".weight"

typedef struct fixture {
    gm_ckpt_tensor t[3];
    float *buf[3][3]; // [tensor][data, m, v]
    gm_ckpt c;
} fixture;

/* Three tensors: (4, 16) with moments, (16, 4) with moments, (3, 2, 2) without. Values are a
 * function of (seed, tensor, buffer, index), so a load can be checked against any seed. */
static float pattern(uint32_t seed, int t, int b, size_t i) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (seed * 40503u + (uint32_t)(t * 3 + b) * 977u);
    h ^= h >> 13;
    return (float)(h & 0xFFFFFF) * (1.0f / 4096.0f) - 2048.0f; // exact in f32 (24 bits)
}

static size_t numel(const gm_ckpt_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static void fixture_init(fixture *fx, uint32_t seed, bool fill) {
    memset(fx, 0, sizeof *fx);
    const char *names[3] = {PEFT(0, q_proj, A), PEFT(0, q_proj, B), "extra.scale"};
    const int nds[3] = {2, 2, 3};
    const int64_t shapes[3][4] = {{4, 16}, {16, 4}, {3, 2, 2}};
    for (int i = 0; i < 3; i++) {
        gm_ckpt_tensor *t = &fx->t[i];
        t->name = names[i];
        t->ndim = nds[i];
        memcpy(t->shape, shapes[i], sizeof t->shape);
        size_t n = numel(t);
        for (int b = 0; b < (i < 2 ? 3 : 1); b++) {
            fx->buf[i][b] = malloc(n * sizeof(float));
            for (size_t j = 0; j < n; j++)
                fx->buf[i][b][j] = fill ? pattern(seed, i, b, j) : 777.0f;
        }
        t->data = fx->buf[i][0];
        t->m = fx->buf[i][1];
        t->v = fx->buf[i][2];
    }
    if (fill) { // values a float round trip must keep bit for bit
        fx->buf[0][0][0] = -0.0f;
        fx->buf[0][0][1] = NAN;
        fx->buf[0][0][2] = INFINITY;
        fx->buf[0][0][3] = 1e-45f;
        fx->buf[0][1][0] = -3.4028235e38f;
    }
    fx->c.step = fill ? 1234 + (int64_t)seed : -1;
    fx->c.epoch = fill ? 2 : -1;
    fx->c.data_pos = fill ? 987654321 : -1;
    fx->c.rng_seed = fill ? UINT64_MAX - seed : 0;
    fx->c.rng_counter = fill ? ((uint64_t)1 << 63) + 5 : 0;
    fx->c.loss = fill ? 2.302585092994046 + (double)seed : -1;
    fx->c.config_json = "{\"model\": \"gemma3-270m\", \"lora\": {\"r\": 8, \"alpha\": 16}, "
                        "\"note\": \"naïve ✓ \\\"quoted\\\"\"}";
    fx->c.n_tensors = 3;
    fx->c.tensors = fx->t;
}

static void fixture_free(fixture *fx) {
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 3; b++) free(fx->buf[i][b]);
}

static bool fixture_same(const fixture *a, const fixture *b) {
    if (a->c.step != b->c.step || a->c.epoch != b->c.epoch || a->c.data_pos != b->c.data_pos ||
        a->c.rng_seed != b->c.rng_seed || a->c.rng_counter != b->c.rng_counter ||
        memcmp(&a->c.loss, &b->c.loss, sizeof(double)) != 0)
        return false;
    for (int i = 0; i < 3; i++)
        for (int b_ = 0; b_ < 3; b_++) {
            if (!a->buf[i][b_] != !b->buf[i][b_]) return false;
            if (a->buf[i][b_] &&
                memcmp(a->buf[i][b_], b->buf[i][b_], numel(&a->t[i]) * sizeof(float)) != 0)
                return false;
        }
    return true;
}

static void test_ckpt_roundtrip(const char *sample_path) {
    gm_error err = {0};
    char path[512], tmp[600];
    in_dir(path, sizeof path, "rt.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fixture a, b;
    fixture_init(&a, 1, true);
    fixture_init(&b, 0, false);
    CHECK_OK(gm_ckpt_save(path, &a.c, &err), &err);
    CHECK(!gm_test_file_exists(tmp), "no .tmp after a successful save");
    CHECK_OK(gm_ckpt_load(path, &b.c, &err), &err);
    CHECK(fixture_same(&a, &b), "round trip is bit-exact (scalars, tensors, moments)");
    char *cfg = NULL;
    CHECK_OK(gm_ckpt_read_config(path, &cfg, &err), &err);
    CHECK(cfg && strcmp(cfg, a.c.config_json) == 0, "config JSON: %s", cfg ? cfg : "(null)");
    gm_free(cfg);

    // loading a subset, and without moments, is fine
    fixture c;
    fixture_init(&c, 0, false);
    c.t[0].m = c.t[0].v = NULL;
    c.c.n_tensors = 1;
    CHECK_OK(gm_ckpt_load(path, &c.c, &err), &err);
    CHECK(memcmp(c.buf[0][0], a.buf[0][0], 64 * sizeof(float)) == 0 && c.buf[0][1][0] == 777.0f,
          "subset load reads only what was asked");
    fixture_free(&c);

    // the layout as documented
    gm_h5_file *f = NULL;
    CHECK_OK(gm_h5_open(path, false, &f, &err), &err);
    if (f) {
        char *s = NULL;
        CHECK_OK(gm_h5_attr_get_str(f, "/", "format", &s, &err), &err);
        CHECK(s && strcmp(s, "gemmarun-checkpoint") == 0, "format attribute");
        gm_free(s);
        CHECK_OK(gm_h5_attr_get_str(f, "/", "created_by", &s, &err), &err);
        CHECK(s && strncmp(s, "gemmarun ", 9) == 0, "created_by: %s", s ? s : "");
        gm_free(s);
        CHECK(gm_h5_exists(f, "/adapter/" PEFT(0, q_proj, A)) &&
              gm_h5_exists(f, "/optimizer/m/" PEFT(0, q_proj, B)) &&
              gm_h5_exists(f, "/optimizer/v/" PEFT(0, q_proj, A)) &&
              gm_h5_exists(f, "/adapter/extra.scale") &&
              !gm_h5_exists(f, "/optimizer/m/extra.scale"),
              "datasets where gm_checkpoint.h says");
        gm_h5_child *kids = NULL;
        int n = 0;
        CHECK_OK(gm_h5_list(f, "/", &kids, &n, &err), &err);
        CHECK(n == 2 && strcmp(kids[0].name, "adapter") == 0 &&
              strcmp(kids[1].name, "optimizer") == 0,
              "root holds adapter and optimizer only (%d)", n);
        gm_h5_list_free(kids, n);
        gm_h5_close(&f, NULL);
    }
    // a NULL config is stored as "{}"
    a.c.config_json = NULL;
    CHECK_OK(gm_ckpt_save(path, &a.c, &err), &err);
    CHECK_OK(gm_ckpt_read_config(path, &cfg, &err), &err);
    CHECK(cfg && strcmp(cfg, "{}") == 0, "NULL config -> {}");
    gm_free(cfg);

    // the sample for tests/ref/check_checkpoint_h5py.py
    fixture_init(&c, 7, true);
    CHECK_OK(gm_ckpt_save(sample_path, &c.c, &err), &err);
    printf("sample checkpoint kept at %s\n", sample_path);
    fixture_free(&c);
    fixture_free(&a);
    fixture_free(&b);
    check_no_leaks("roundtrip");
}

static void expect_load_fail(const char *what, const char *path, gm_ckpt *c, gm_status want,
                             const char *w1, const char *w2, const char *w3) {
    gm_error err = {0};
    gm_status s = gm_ckpt_load(path, c, &err);
    CHECK(s == want, "%s: got %s, want %s: %s", what, gm_status_name(s), gm_status_name(want),
          err.msg);
    CHECK(gm_test_contains(err.msg, path), "%s: message names the file: %s", what, err.msg);
    const char *words[3] = {w1, w2, w3};
    for (int i = 0; i < 3; i++)
        if (words[i])
            CHECK(gm_test_contains(err.msg, words[i]), "%s: message should contain '%s': %s", what,
                  words[i], err.msg);
    printf("  %-18s %s\n", what, err.msg);
}

static void test_ckpt_load_errors(void) {
    gm_error err = {0};
    char path[512], p2[512];
    fixture a, b;
    fixture_init(&a, 3, true);
    fixture_init(&b, 0, false);
    printf("load errors:\n");
    expect_load_fail("missing file", in_dir(path, sizeof path, "absent.h5"), &b.c, GM_ERR_IO,
                     "no such file", NULL, NULL);
    in_dir(path, sizeof path, "text.ckpt");
    FILE *t = fopen(path, "w");
    fputs("{\"not\": \"hdf5\"}\n", t);
    fclose(t);
    expect_load_fail("not HDF5", path, &b.c, GM_ERR_FORMAT, "not an HDF5 file", NULL, NULL);

    gm_h5_file *f = NULL;
    in_dir(path, sizeof path, "other.h5");
    CHECK_OK(gm_h5_create(path, &f, &err), &err);
    const int64_t sh[] = {2};
    double two[2] = {1, 2};
    if (f) {
        CHECK_OK(gm_h5_write(f, "/data", GM_F64, 1, sh, two, &err), &err);
        CHECK_OK(gm_h5_close(&f, &err), &err);
    }
    expect_load_fail("HDF5, no format", path, &b.c, GM_ERR_FORMAT, "not a gemmarun checkpoint",
                     NULL, NULL);
    char *cfg = NULL;
    gm_status s = gm_ckpt_read_config(path, &cfg, &err);
    CHECK(s == GM_ERR_FORMAT && cfg == NULL, "read_config of a non-checkpoint: %s", err.msg);
    CHECK_OK(gm_h5_open(path, true, &f, &err), &err);
    if (f) {
        CHECK_OK(gm_h5_attr_set_str(f, "/", "format", "pandas", &err), &err);
        gm_h5_close(&f, NULL);
    }
    expect_load_fail("other format", path, &b.c, GM_ERR_FORMAT, "'pandas'", NULL, NULL);
    CHECK_OK(gm_h5_open(path, true, &f, &err), &err);
    if (f) {
        CHECK_OK(gm_h5_attr_set_str(f, "/", "format", "gemmarun-checkpoint", &err), &err);
        CHECK_OK(gm_h5_attr_set_i64(f, "/", "version", 1, &err), &err);
        gm_h5_close(&f, NULL);
    }
    expect_load_fail("no step attribute", path, &b.c, GM_ERR_FORMAT, "'step'", "missing", NULL);

    in_dir(path, sizeof path, "v2.h5");
    CHECK_OK(gm_ckpt_save(path, &a.c, &err), &err);
    CHECK_OK(gm_h5_open(path, true, &f, &err), &err);
    if (f) {
        CHECK_OK(gm_h5_attr_set_i64(f, "/", "version", 2, &err), &err);
        gm_h5_close(&f, NULL);
    }
    expect_load_fail("wrong version", path, &b.c, GM_ERR_FORMAT, "version 2", "version 1", NULL);

    in_dir(path, sizeof path, "good.h5");
    CHECK_OK(gm_ckpt_save(path, &a.c, &err), &err);
    // missing tensor: caller asks for one the file lacks; nothing is written into the caller's
    // buffers or scalars
    gm_ckpt_tensor extra[4];
    memcpy(extra, b.t, sizeof b.t);
    float ebuf[8];
    extra[3] = (gm_ckpt_tensor){
        .name = PEFT(5, v_proj, A), .data = ebuf, .ndim = 2, .shape = {2, 4}};
    gm_ckpt wider = b.c;
    wider.tensors = extra;
    wider.n_tensors = 4;
    expect_load_fail("missing tensor", path, &wider, GM_ERR_FORMAT, PEFT(5, v_proj, A),
                     "/adapter/", "missing");
    CHECK(wider.step == -1 && b.buf[0][0][0] == 777.0f, "failed load leaves scalars and buffers");
    // missing moment (extra.scale was saved without m/v)
    float em[12];
    b.t[2].m = em;
    expect_load_fail("missing moment", path, &b.c, GM_ERR_FORMAT, "extra.scale", "/optimizer/m/",
                     "without optimizer state");
    b.t[2].m = NULL;
    // shape mismatch: file (4, 16), caller (8, 16)
    float big[8 * 16];
    gm_ckpt_tensor sm[1] = {{.name = PEFT(0, q_proj, A), .data = big, .ndim = 2, .shape = {8, 16}}};
    gm_ckpt shaped = b.c;
    shaped.tensors = sm;
    shaped.n_tensors = 1;
    expect_load_fail("shape mismatch", path, &shaped, GM_ERR_FORMAT, PEFT(0, q_proj, A),
                     "(4, 16)", "(8, 16)");
    sm[0].ndim = 1;
    sm[0].shape[0] = 64;
    expect_load_fail("rank mismatch", path, &shaped, GM_ERR_FORMAT, "(4, 16)", "(64)", NULL);
    // a tensor stored as f64 instead of f32
    in_dir(p2, sizeof p2, "f64.h5");
    CHECK_OK(gm_ckpt_save(p2, &a.c, &err), &err);
    CHECK_OK(gm_h5_open(p2, true, &f, &err), &err);
    if (f) {
        CHECK_OK(gm_h5_write(f, "/adapter/" PEFT(9, o_proj, A), GM_F64, 1, sh, two, &err), &err);
        gm_h5_close(&f, NULL);
    }
    gm_ckpt_tensor wt[1] = {{.name = PEFT(9, o_proj, A), .data = big, .ndim = 1, .shape = {2}}};
    shaped.tensors = wt;
    expect_load_fail("f64 tensor", p2, &shaped, GM_ERR_FORMAT, "f64", "f32", NULL);

    // bad tensor lists are caller errors
    gm_ckpt_tensor bad[2] = {{.name = "a/b", .data = big, .ndim = 1, .shape = {1}},
                             {.name = "x", .data = big, .ndim = 1, .shape = {1}}};
    gm_ckpt bc = {.n_tensors = 1, .tensors = bad};
    s = gm_ckpt_save(path, &bc, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "a/b"), "name with '/': %s", err.msg);
    bad[0].name = "x";
    bc.n_tensors = 2;
    s = gm_ckpt_save(path, &bc, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "twice"), "duplicate name: %s", err.msg);
    s = gm_ckpt_save("/nonexistent-dir-gm/ck.h5", &a.c, &err);
    CHECK(s == GM_ERR_IO && gm_test_contains(err.msg, "/nonexistent-dir-gm/ck.h5") &&
          gm_test_contains(err.msg, "No such file or directory"), "save into a missing folder: %s",
          err.msg);
    // after all that, the good file still loads
    CHECK_OK(gm_ckpt_load(path, &b.c, &err), &err);
    CHECK(fixture_same(&a, &b), "good checkpoint intact");
    fixture_free(&a);
    fixture_free(&b);
    check_no_leaks("load errors");
}

/* Overwrite: the new file replaces the old by rename (new inode), while a reader that opened
 * the old file keeps reading the complete old contents. */
static void test_ckpt_overwrite(void) {
    gm_error err = {0};
    char path[512], tmp[600];
    in_dir(path, sizeof path, "over.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fixture a, b, r;
    fixture_init(&a, 10, true);
    fixture_init(&b, 11, true);
    fixture_init(&r, 0, false);
    CHECK_OK(gm_ckpt_save(path, &a.c, &err), &err);
    struct stat s1, s2;
    stat(path, &s1);
    gm_h5_file *reader = NULL;
    CHECK_OK(gm_h5_open(path, false, &reader, &err), &err);
    // a stray .tmp from an earlier crash is simply overwritten
    FILE *junk = fopen(tmp, "w");
    fputs("torn leftovers", junk);
    fclose(junk);
    CHECK_OK(gm_ckpt_save(path, &b.c, &err), &err);
    CHECK(!gm_test_file_exists(tmp), "stray .tmp replaced and renamed away");
    stat(path, &s2);
    CHECK(s1.st_ino != s2.st_ino, "overwrite is a rename onto the path (new inode)");
    if (reader) {
        float got[64];
        const int64_t sh[] = {4, 16};
        CHECK_OK(gm_h5_read(reader, "/adapter/" PEFT(0, q_proj, A), GM_F32, 2, sh, got, &err),
                 &err);
        CHECK(memcmp(got, a.buf[0][0], sizeof got) == 0,
              "open reader still sees the old file whole");
        int64_t step = 0;
        CHECK_OK(gm_h5_attr_get_i64(reader, "/", "step", &step, &err), &err);
        CHECK(step == a.c.step, "old reader: old step");
        gm_h5_close(&reader, NULL);
    }
    CHECK_OK(gm_ckpt_load(path, &r.c, &err), &err);
    CHECK(fixture_same(&b, &r), "new opens see the new checkpoint");
    fixture_free(&a);
    fixture_free(&b);
    fixture_free(&r);
    check_no_leaks("overwrite");
}

/* "Disk full": a child limited by RLIMIT_FSIZE (writes past the limit fail with EFBIG) saves
 * a checkpoint bigger than the limit over an existing one. */
static void test_ckpt_disk_full(void) {
    gm_error err = {0};
    char path[512], tmp[600];
    in_dir(path, sizeof path, "full.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fixture a;
    fixture_init(&a, 20, true);
    CHECK_OK(gm_ckpt_save(path, &a.c, &err), &err);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {256 * 1024, 256 * 1024};
        setrlimit(RLIMIT_FSIZE, &rl);
        size_t n = 1 << 20; // 4 MiB > the limit
        float *big = calloc(n, sizeof(float));
        gm_ckpt_tensor t = {.name = "big", .data = big, .ndim = 1, .shape = {(int64_t)n}};
        gm_ckpt c = {.step = 99, .n_tensors = 1, .tensors = &t};
        gm_error e = {0};
        gm_status s = gm_ckpt_save(path, &c, &e);
        int64_t open_ids = gm_h5_open_objects();
        printf("  disk full: %s: %s\n  HDF5 ids open after it: %lld (baseline %lld)\n",
               gm_status_name(s), e.msg, (long long)open_ids, (long long)h5_baseline);
        fflush(stdout);
        // exit(), not _exit(): HDF5's atexit clean-up runs and would crash on a half-closed file
        exit(s == GM_ERR_IO && gm_test_contains(e.msg, path) && open_ids == h5_baseline ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "disk-full save fails with GM_ERR_IO and closes "
          "every HDF5 id (status %d)", st);
    CHECK(!gm_test_file_exists(tmp), "failed save removed its .tmp");
    fixture r;
    fixture_init(&r, 0, false);
    CHECK_OK(gm_ckpt_load(path, &r.c, &err), &err);
    CHECK(fixture_same(&a, &r), "previous checkpoint intact after a failed save");
    fixture_free(&a);
    fixture_free(&r);
}

/* ---- kill -9 during save ------------------------------------------------------------------ */

#define KILL_TENSORS 4
#define KILL_ROWS 1024
#define KILL_COLS 1024 // 4 tensors x (data, m, v) x 4 MiB = 48 MiB per save

typedef struct kill_buf {
    float *b[KILL_TENSORS][3];
    gm_ckpt_tensor t[KILL_TENSORS];
    char names[KILL_TENSORS][96];
    gm_ckpt c;
} kill_buf;

static void kill_init(kill_buf *k) {
    memset(k, 0, sizeof *k);
    for (int i = 0; i < KILL_TENSORS; i++) {
        snprintf(k->names[i], sizeof k->names[i],
                 "base_model.model.model.layers.%d.mlp.down_proj.lora_A.weight", i);
        for (int b = 0; b < 3; b++) k->b[i][b] = malloc(sizeof(float) * KILL_ROWS * KILL_COLS);
        k->t[i] = (gm_ckpt_tensor){.name = k->names[i], .data = k->b[i][0], .m = k->b[i][1],
                                   .v = k->b[i][2], .ndim = 2, .shape = {KILL_ROWS, KILL_COLS}};
    }
    k->c.n_tensors = KILL_TENSORS;
    k->c.tensors = k->t;
}

static void kill_free(kill_buf *k) {
    for (int i = 0; i < KILL_TENSORS; i++)
        for (int b = 0; b < 3; b++) free(k->b[i][b]);
}

static uint32_t kill_value(int64_t save, int t, int b, size_t i) {
    return ((uint32_t)i * 2654435761u) ^ ((uint32_t)save * 0x9E3779B9u + (uint32_t)(t * 3 + b));
}

static void kill_fill(kill_buf *k, int64_t save) {
    for (int t = 0; t < KILL_TENSORS; t++)
        for (int b = 0; b < 3; b++) {
            uint32_t *u = (uint32_t *)k->b[t][b]; // any 32-bit pattern, NaNs included
            for (size_t i = 0; i < (size_t)KILL_ROWS * KILL_COLS; i++)
                u[i] = kill_value(save, t, b, i);
        }
    k->c.step = save;
    k->c.epoch = save / 7;
    k->c.data_pos = save * 3;
    k->c.rng_seed = (uint64_t)save * 0x9E3779B97F4A7C15ull;
    k->c.rng_counter = (uint64_t)save << 20;
    k->c.loss = 1.0 / (double)(save + 1);
}

/* Every value of the loaded checkpoint is that of save number c.step. */
static bool kill_verify(const kill_buf *k) {
    int64_t s = k->c.step;
    if (k->c.epoch != s / 7 || k->c.data_pos != s * 3 ||
        k->c.rng_seed != (uint64_t)s * 0x9E3779B97F4A7C15ull ||
        k->c.rng_counter != (uint64_t)s << 20 || k->c.loss != 1.0 / (double)(s + 1))
        return false;
    for (int t = 0; t < KILL_TENSORS; t++)
        for (int b = 0; b < 3; b++) {
            const uint32_t *u = (const uint32_t *)k->b[t][b];
            for (size_t i = 0; i < (size_t)KILL_ROWS * KILL_COLS; i++)
                if (u[i] != kill_value(s, t, b, i)) return false;
        }
    return true;
}

typedef struct kill_msg {
    int64_t save;
    int32_t done; // 0: starting this save, 1: it returned GM_OK
    int32_t pad;
} kill_msg;

/* The child: saves 1000*life + 1, +2, ... in a loop, telling the parent before and after each. */
static void kill_child(const char *path, int fd, int life) {
    kill_buf k;
    kill_init(&k);
    for (int64_t save = 1000 * (int64_t)life + 1;; save++) {
        kill_fill(&k, save);
        kill_msg m = {save, 0, 0};
        if (write(fd, &m, sizeof m) != sizeof m) _exit(2);
        gm_error e = {0};
        if (gm_ckpt_save(path, &k.c, &e) != GM_OK) {
            fprintf(stderr, "child save failed: %s\n", e.msg);
            _exit(3);
        }
        m.done = 1;
        if (write(fd, &m, sizeof m) != sizeof m) _exit(2);
    }
}

/* kill_child through gm_test_fork_and_kill's (ctx, fd) signature */
typedef struct kill_ctx {
    const char *path;
    int life;
} kill_ctx;
static void kill_child_run(void *ctx, int fd) {
    const kill_ctx *k = ctx;
    kill_child(k->path, fd, k->life);
}

static void test_ckpt_kill9(void) {
    gm_error err = {0};
    char path[512], tmp[600];
    in_dir(path, sizeof path, "killed.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    kill_buf k;
    kill_init(&k);
    // the checkpoint that exists before the first kill, and how long one save takes here
    double t0 = gm_test_now_s();
    kill_fill(&k, 0);
    double t_fill = gm_test_now_s() - t0;
    t0 = gm_test_now_s();
    CHECK_OK(gm_ckpt_save(path, &k.c, &err), &err);
    double t_save = gm_test_now_s() - t0;
    t0 = gm_test_now_s();
    CHECK_OK(gm_ckpt_load(path, &k.c, &err), &err);
    double t_load = gm_test_now_s() - t0;
    CHECK(kill_verify(&k) && k.c.step == 0, "initial checkpoint verifies");
    // the child's cycle: fill the buffers (test only), then save
    double t_cycle = t_fill + t_save;
    printf("kill -9: one 48 MiB save takes %.3f s (the child's fill + save %.3f s), a load "
           "%.3f s\n", t_save, t_cycle, t_load);

    const int KILLS = 30;
    int64_t prev = 0; // the save the file held after the previous kill
    int torn = 0, mid_save = 0, tmp_left = 0, new_in_flight = 0, kept_prev = 0, hit_first = 0;
    uint64_t rng = 0x1234567;
    double budget0 = gm_test_now_s();
    int kills = 0;
    for (int life = 1; life <= KILLS; life++) {
        // delays from 0 to 2.5 child cycles: kills land before the first save ends, between
        // saves, and inside later saves (HDF5 writing, fsync, rename)
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        double frac = (double)(rng % 10000) / 10000.0;
        double delay = 0.002 + frac * 2.5 * t_cycle;
        char what[32];
        snprintf(what, sizeof what, "life %d", life);
        kill_ctx kc = {path, life};
        int rfd = gm_test_fork_and_kill(delay, kill_child_run, &kc, what);
        kills++;
        // what the child reported: the last completed save, and the one in flight if any
        int64_t last_done = -1, in_flight = -1;
        kill_msg m;
        while (read(rfd, &m, sizeof m) == (ssize_t)sizeof m) {
            if (m.done) {
                last_done = m.save;
                in_flight = -1;
            } else {
                in_flight = m.save;
            }
        }
        close(rfd);
        bool had_tmp = gm_test_file_exists(tmp);
        tmp_left += had_tmp;
        mid_save += in_flight >= 0;
        hit_first += last_done < 0;
        // the file at <path> must load completely as one of the saves: the last completed one
        // (or the previous life's if none completed), or the one in flight if its rename landed
        for (int t = 0; t < KILL_TENSORS; t++)
            for (int b = 0; b < 3; b++) memset(k.b[t][b], 0xAB, 16);
        gm_status s = gm_ckpt_load(path, &k.c, &err);
        int64_t expect_old = last_done >= 0 ? last_done : prev;
        bool ok = s == GM_OK && kill_verify(&k) &&
                  (k.c.step == expect_old || (in_flight >= 0 && k.c.step == in_flight));
        if (!ok) torn++;
        CHECK(ok, "life %d (delay %.3f s): load %s, step %lld, expected %lld or %lld: %s", life,
              delay, gm_status_name(s), (long long)k.c.step, (long long)expect_old,
              (long long)in_flight, s == GM_OK ? "values differ" : err.msg);
        if (ok && k.c.step == in_flight) new_in_flight++;
        if (ok && last_done < 0 && k.c.step == prev) kept_prev++;
        if (ok) prev = k.c.step;
        check_no_leaks("kill -9 load");
        // the test keeps to its time budget on slow disks: at least 20 kills, then stop at 10 s
        if (life >= 20 && gm_test_now_s() - budget0 > 10.0) {
            printf("kill -9: stopping after %d kills (time budget)\n", life);
            break;
        }
    }
    printf("kill -9: %d kills, %d torn; %d landed mid-save (%d of them already renamed), %d "
           "before the child's first save completed (%d kept the previous file), %d left a "
           "stray .tmp\n", kills, torn, mid_save, new_in_flight, hit_first, kept_prev, tmp_left);
    CHECK(mid_save > 0, "some kills landed mid-save (else the test proves little)");
    // a stray .tmp is harmless: the next save replaces it and removes it by renaming
    kill_fill(&k, 77);
    CHECK_OK(gm_ckpt_save(path, &k.c, &err), &err);
    CHECK(!gm_test_file_exists(tmp), "no .tmp after the next save");
    CHECK_OK(gm_ckpt_load(path, &k.c, &err), &err);
    CHECK(k.c.step == 77 && kill_verify(&k), "save after the kills");
    kill_free(&k);
}

/* ---- allocation failure injection ------------------------------------------------------- */

static void test_ckpt_alloc_failures(void) {
    gm_error err = {0};
    char path[512], tmp[600];
    in_dir(path, sizeof path, "oom.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fixture a, b, r;
    fixture_init(&a, 30, true);
    fixture_init(&b, 31, true);
    fixture_init(&r, 0, false);
    CHECK_OK(gm_ckpt_save(path, &a.c, &err), &err);
    uint64_t live0 = gm_alloc_get_stats().bytes_live;
    int n_save = 0, n_load = 0, n_cfg = 0;
    // save: every allocation in turn fails; the old file stays, no .tmp, no leak
    for (uint64_t n = 1; n < 1000; n++) {
        gm_alloc_fail_after(n);
        gm_status s = gm_ckpt_save(path, &b.c, &err);
        gm_alloc_fail_after(0);
        CHECK(s == GM_OK || s == GM_ERR_NOMEM, "save, alloc %llu fails: %s: %s",
              (unsigned long long)n, gm_status_name(s), err.msg);
        CHECK(!gm_test_file_exists(tmp), "save, alloc %llu fails: .tmp left", (unsigned long long)n);
        CHECK(gm_alloc_get_stats().bytes_live == live0, "save, alloc %llu fails: leak",
              (unsigned long long)n);
        check_no_leaks("save under allocation failure");
        gm_status l = gm_ckpt_load(path, &r.c, &err);
        CHECK(l == GM_OK && fixture_same(s == GM_OK ? &b : &a, &r),
              "after save with alloc %llu failing, the file holds the %s checkpoint",
              (unsigned long long)n, s == GM_OK ? "new" : "old");
        if (s == GM_OK) break;
        n_save++;
    }
    // load and read_config
    fixture_free(&r);
    for (uint64_t n = 1; n < 1000; n++) {
        fixture_init(&r, 0, false); // (buffers of the previous r freed below)
        gm_alloc_fail_after(n);
        gm_status s = gm_ckpt_load(path, &r.c, &err);
        gm_alloc_fail_after(0);
        CHECK(s == GM_OK || s == GM_ERR_NOMEM, "load, alloc %llu fails: %s: %s",
              (unsigned long long)n, gm_status_name(s), err.msg);
        CHECK(s == GM_OK || r.c.step == -1, "failed load leaves scalars");
        CHECK(gm_alloc_get_stats().bytes_live == live0, "load, alloc %llu fails: leak",
              (unsigned long long)n);
        check_no_leaks("load under allocation failure");
        bool done = s == GM_OK;
        if (done) CHECK(fixture_same(&b, &r), "load after injection passes");
        fixture_free(&r);
        if (done) break;
        n_load++;
    }
    for (uint64_t n = 1; n < 100; n++) {
        char *cfg = NULL;
        gm_alloc_fail_after(n);
        gm_status s = gm_ckpt_read_config(path, &cfg, &err);
        gm_alloc_fail_after(0);
        CHECK((s == GM_OK && cfg) || (s == GM_ERR_NOMEM && !cfg), "read_config, alloc %llu: %s",
              (unsigned long long)n, err.msg);
        gm_free(cfg);
        CHECK(gm_alloc_get_stats().bytes_live == live0, "read_config, alloc %llu: leak",
              (unsigned long long)n);
        check_no_leaks("read_config under allocation failure");
        if (s == GM_OK) break;
        n_cfg++;
    }
    // gm_h5_list grows its array and copies names
    gm_h5_file *f = NULL;
    CHECK_OK(gm_h5_open(path, false, &f, &err), &err);
    int n_list = 0;
    for (uint64_t n = 1; f && n < 100; n++) {
        gm_h5_child *kids = NULL;
        int nk = 0;
        gm_alloc_fail_after(n);
        gm_status s = gm_h5_list(f, "/adapter", &kids, &nk, &err);
        gm_alloc_fail_after(0);
        CHECK(s == GM_OK || (s == GM_ERR_NOMEM && !kids && nk == 0), "list, alloc %llu: %s",
              (unsigned long long)n, err.msg);
        gm_h5_list_free(kids, nk);
        if (s == GM_OK) break;
        n_list++;
    }
    gm_h5_close(&f, NULL);
    CHECK(gm_alloc_get_stats().bytes_live == live0, "list: leak");
    check_no_leaks("list under allocation failure");
    printf("allocation failures injected: save %d, load %d, read_config %d, list %d points, "
           "all clean\n", n_save, n_load, n_cfg, n_list);
    CHECK(n_save >= 3 && n_load >= 3, "injection reached several points");
    fixture_free(&a);
    fixture_free(&b);
}

int main(void) {
    if (!gm_test_make_tmpdir("ckpt", tmpdir, sizeof tmpdir)) return gm_test_finish();
    gm_h5_silence();
    h5_baseline = gm_h5_open_objects();
    char sample[600], metrics[700];
    const char *env = getenv("GM_TEST_CKPT_OUT");
    snprintf(sample, sizeof sample, "%s",
             env && env[0] ? env : GM_BINARY_DIR "/test_checkpoint_sample.h5");
    snprintf(metrics, sizeof metrics, "%s.metrics.h5", sample);

    double t0 = gm_test_now_s();
    test_h5_attrs();
    test_h5_datasets();
    char disk_log[512];
    test_h5_series(in_dir(disk_log, sizeof disk_log, "disk_log.h5"), false);
    test_h5_series(metrics, true);
    test_h5_series_many();
    test_h5_errors();
    test_h5_snapshot_disk_full();
    test_ckpt_roundtrip(sample);
    test_ckpt_load_errors();
    test_ckpt_overwrite();
    test_ckpt_disk_full();
    test_ckpt_alloc_failures();
    test_ckpt_kill9();
    printf("total %.1f s\n", gm_test_now_s() - t0);

    gm_test_remove_tmpdir(tmpdir);
    return gm_test_finish();
}
