/*
 * test_util.c - shared test helpers; see test_util.h.
 */
#include "test_util.h"

#include "gm_decoder.h"
#include "gm_train.h"
#include <math.h>

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

double gm_test_lse(const float *row, int64_t V) {
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; v++) mx = fmax(mx, (double)row[v]);
    for (int64_t v = 0; v < V; v++) z += exp((double)row[v] - mx);
    return mx + log(z);
}

double gm_test_rel_err(const float *got, const float *want, size_t n) {
    double mx = 1e-12, e = 0;
    for (size_t j = 0; j < n; j++) mx = fmax(mx, fabs(want[j])), e = fmax(e, fabs((double)got[j] - want[j]));
    return e / mx;
}

int gm_test_skip(const char *why) {
    printf("SKIPPED: %s\n0 passed, 0 failed\n", why);
    return 77;
}

int gm_test_skip_unless_ci(const char *why) {
    const char *ci = getenv("CI");
    if (ci && *ci && strcmp(ci, "0") != 0 && strcmp(ci, "false") != 0) {
        CHECK(0, "%s (CI is set: what would be skipped elsewhere is a failure here)", why);
        return gm_test_finish();
    }
    return gm_test_skip(why);
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

bool gm_test_contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

bool gm_test_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

double gm_test_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int gm_test_fork_and_kill(double delay, void (*child)(void *ctx, int fd), void *ctx, const char *what) {
    int fds[2];
    CHECK(pipe(fds) == 0, "%s: pipe", what);
    if (fds[0] < 0) return -1;
    fflush(NULL); // the child must not print the parent's buffered output again
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        child(ctx, fds[1]);
        _exit(0);
    }
    close(fds[1]);
    struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "%s: child died by SIGKILL (%d)", what, st);
    return fds[0];
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

#include "gm_alloc.h"

#include <hdf5.h>

void *gm_test_h5_read(const char *file, const char *dataset, int is_int, size_t *n, int64_t *dims, int *ndim) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    *n = 0;
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        CHECK(0, "cannot open reference file %s", file);
        return NULL;
    }
    hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
    if (d < 0) {
        H5Fclose(f);
        CHECK(0, "%s: no dataset %s", file, dataset);
        return NULL;
    }
    hid_t sp = H5Dget_space(d);
    int nd = H5Sget_simple_extent_ndims(sp);
    hsize_t dd[8] = {0};
    H5Sget_simple_extent_dims(sp, dd, NULL);
    size_t total = 1;
    for (int i = 0; i < nd; i++) {
        total *= (size_t)dd[i];
        if (dims && i < 4) dims[i] = (int64_t)dd[i];
    }
    if (ndim) *ndim = nd;
    void *buf = gm_malloc(total * (is_int == 2 ? 8 : is_int == 3 ? 1 : 4) + 8);
    hid_t mem = is_int == 2 ? H5T_NATIVE_DOUBLE : is_int == 3 ? H5T_NATIVE_UINT8 : is_int ? H5T_NATIVE_INT32 : H5T_NATIVE_FLOAT;
    herr_t rc = H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(f);
    if (rc < 0) {
        gm_free(buf);
        CHECK(0, "%s: cannot read %s", file, dataset);
        return NULL;
    }
    *n = total;
    return buf;
}

bool gm_test_h5_exists(const char *file, const char *path) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return false;
    htri_t e = H5Lexists(f, path, H5P_DEFAULT);
    H5Fclose(f);
    return e > 0;
}

bool gm_test_h5_attr_double(const char *file, const char *obj, const char *attr, double *out) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return false;
    bool ok = false;
    hid_t a = H5Aopen_by_name(f, obj, attr, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        ok = H5Aread(a, H5T_NATIVE_DOUBLE, out) >= 0;
        H5Aclose(a);
    }
    H5Fclose(f);
    return ok;
}

char *gm_test_h5_attr_string(const char *file, const char *obj, const char *attr) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return NULL;
    char *out = NULL;
    hid_t a = H5Aopen_by_name(f, obj, attr, H5P_DEFAULT, H5P_DEFAULT);
    hid_t ft = a >= 0 ? H5Aget_type(a) : -1;
    if (ft >= 0 && H5Tget_class(ft) == H5T_STRING) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_cset(mt, H5Tget_cset(ft)); /* h5py writes UTF-8; HDF5 does not convert between sets */
        if (H5Tis_variable_str(ft) > 0) {
            char *v = NULL;
            H5Tset_size(mt, H5T_VARIABLE);
            if (H5Aread(a, mt, &v) >= 0 && v) {
                size_t n = strlen(v);
                if ((out = gm_malloc(n + 1))) memcpy(out, v, n + 1);
                H5free_memory(v);
            }
        } else {
            size_t n = H5Tget_size(ft);
            H5Tset_size(mt, n + 1);
            if ((out = gm_calloc(n + 1, 1)) && H5Aread(a, mt, out) < 0) gm_free(out), out = NULL;
        }
        H5Tclose(mt);
    }
    if (ft >= 0) H5Tclose(ft);
    if (a >= 0) H5Aclose(a);
    H5Fclose(f);
    return out;
}

void gm_test_cached_logits(const gm_model *m, gm_backend *be, const gm_lora *lora, const int32_t *ids, int64_t T,
                           float *out) {
    gm_error err = {0};
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = 1, .ctx = T, .max_tokens = 1, .n_threads = 2, .adapter = lora, .backend = be};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) return;
    int64_t V = m->cfg.vocab_size;
    for (int64_t t = 0; t < T; t++) {
        CHECK_OK(gm_decoder_forward(st, &ids[t], 1, false, &err), &err);
        memcpy(out + t * V, st->logits, (size_t)V * sizeof(float));
    }
    gm_infer_free(st);
}

/* "<group>/layers.3.self_attn.q_proj.A" / "<group>/<word>.layers.0.self_attn.q_proj.linear.B" of a PEFT name. */
static const char *peft_key(const char *group, const char *peft_name, const char *tower, const char *word, char *buf,
                            size_t cap) {
    const char *p = strstr(peft_name, "layers."), *e = strstr(peft_name, ".lora_");
    bool t = strstr(peft_name, tower) != NULL;
    snprintf(buf, cap, "%s/%s%s%.*s.%s", group, t ? word : "", t ? "." : "", p && e ? (int)(e - p) : 0, p ? p : "",
             strstr(peft_name, ".lora_A.") ? "A" : "B");
    return buf;
}

int gm_test_peft_load(gm_trainer *tr, const char *file, const char *group, const char *tower, const char *word) {
    char *keys = gm_test_h5_attr_string(file, group, "peft_keys");
    CHECK(keys != NULL, "%s: %s has peft_keys", file, group);
    int np = 0, loaded = 0, unnamed = 0;
    const gm_train_param *pp = gm_trainer_params(tr, &np);
    for (int i = 0; keys && i < np; i++) {
        const char *hit = strstr(keys, pp[i].name);
        size_t ln = strlen(pp[i].name);
        if (!hit || (hit != keys && hit[-1] != '\n') || (hit[ln] != '\n' && hit[ln] != '\0'))
            if (unnamed++ < 3) CHECK(false, "%s is not one of PEFT's keys", pp[i].name);
        char key[400];
        size_t n = 0;
        float *v = gm_test_h5_read(file, peft_key(group, pp[i].name, tower, word, key, sizeof key), 0, &n, NULL, NULL);
        CHECK(v && (int64_t)n == pp[i].n, "%s: %zu values for %lld", key, n, (long long)pp[i].n);
        if (v && (int64_t)n == pp[i].n) gm_backend_upload(gm_trainer_backend(tr), pp[i].p, v, n * sizeof(float)), loaded++;
        gm_free(v);
    }
    CHECK(unnamed == 0, "%d trained tensors named unlike PEFT", unnamed);
    gm_free(keys);
    return loaded;
}

void gm_test_peft_grads(gm_trainer *tr, const char *file, const char *group, const char *tower, const char *word,
                        double worst[2][2], int seen[2]) {
    int np = 0;
    const gm_train_param *pp = gm_trainer_params(tr, &np);
    memset(worst, 0, 4 * sizeof(double));
    seen[0] = seen[1] = 0;
    for (int i = 0; i < np; i++) {
        int part = strstr(pp[i].name, tower) != NULL;
        for (int f64 = 0; f64 < 2; f64++) {
            char key[400];
            size_t n = 0, kl = strlen(peft_key(group, pp[i].name, tower, word, key, sizeof key));
            snprintf(key + kl, sizeof key - kl, "_grad%s", f64 ? "64" : "");
            float *want = f64 ? NULL : gm_test_h5_read(file, key, 0, &n, NULL, NULL);
            double *w64 = f64 ? gm_test_h5_read(file, key, 2, &n, NULL, NULL) : NULL;
            if (w64 && (int64_t)n == pp[i].n) { /* as f32: the error to resolve is far above its rounding */
                want = gm_malloc(n * sizeof(float));
                for (size_t j = 0; want && j < n; j++) want[j] = (float)w64[j];
            }
            if (want && (int64_t)n == pp[i].n) worst[f64][part] = fmax(worst[f64][part], gm_test_rel_err(pp[i].d, want, n));
            else CHECK(false, "%s: missing or %zu values", key, n);
            seen[part] += !f64;
            gm_free(want), gm_free(w64);
        }
    }
}

bool gm_test_make_tmpdir(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/gm_%s_XXXXXX", name);
    bool ok = mkdtemp(buf) != NULL;
    CHECK(ok, "cannot create a temporary folder %s: %s", buf, strerror(errno));
    return ok;
}

void gm_test_remove_tmpdir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}
