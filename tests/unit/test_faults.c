/*
 * test_faults.c - fault injection in the spirit of SQLite's (https://sqlite.org/testing.html §3):
 *
 *   - Write failures. This program defines open, write, fsync, close and rename (so the calls
 *     made by core/base/gm_file.c, which writes every checkpoint, results file and table, land
 *     here and are forwarded as raw system calls). While armed, the k-th of those calls on a file
 *     in the test folder fails - ENOSPC, EIO, or a short write followed by ENOSPC (a disk filling
 *     up mid-write) - for every k, while a checkpoint, a trial results file and a merged results
 *     file are saved over a previous one. Each failed save must return GM_ERR_IO naming the file
 *     and the system's reason; the previous file must stay byte for byte (or, when only the final
 *     folder fsync failed, the new file be in place and the message say so); no .tmp is left; no
 *     descriptor, HDF5 id or byte is leaked; and the next save succeeds. A short write alone
 *     (a signal, a pipe, NFS) must be continued, not reported.
 *   - Allocation failures. The N-th allocation through gm_malloc fails - once ("transient") and
 *     from N on ("persistent") - for every N, while the tiny Gemma 3 loads (config.json,
 *     safetensors, tokenizer.json), while a trainer is built on it (f32 base with activation
 *     checkpointing and dropout; NF4 base), while conversations are tokenized, and while a trial
 *     file is reopened to resume. Each must end in GM_OK or GM_ERR_NOMEM with a message saying
 *     so, and give back every byte, descriptor and mapping; what succeeded despite the failure
 *     must give the clean run's loss bit for bit.
 *
 * kill -9 at random points of a whole sweep is tests/e2e/faults.sh.
 */
#define _GNU_SOURCE
#include "gm_alloc.h"
#include "gm_data.h"
#include "gm_h5.h"
#include "gm_model.h"
#include "gm_results.h"
#include "gm_tokenizer.h"
#include "gm_train.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the system-call door ------------------------------------------------------------------ */

enum io_mode { IO_ENOSPC, IO_EIO, IO_SHORT_THEN_ENOSPC, IO_SHORT, IO_N_MODES };
static const char *const io_mode_name[] = {"ENOSPC", "EIO", "short write, then ENOSPC", "short write"};

static char io_dir[512];          /* faults only for paths under this folder */
static size_t io_dir_len;
static int io_armed;              /* count and inject */
static long io_events, io_fail_at; /* events seen since arming; the one that fails (1-based) */
static enum io_mode io_mode;
static int io_enospc_next;        /* after a short write: the next write fails */
static char io_what[64];          /* which call got the fault, for messages */
static unsigned char our_fd[4096];

/* The test folder itself (the folder fsync'd after a rename) or a path under it. */
static int under_dir(const char *p) {
    return io_dir_len && (strncmp(p, io_dir, io_dir_len) == 0 ||
                          (strncmp(p, io_dir, io_dir_len - 1) == 0 && p[io_dir_len - 1] == '\0'));
}

/* Counts an event; 1 if this one must fail (errno set). */
static int io_event(const char *what) {
    long ev = ++io_events;
    if (ev != io_fail_at) return 0;
    snprintf(io_what, sizeof io_what, "%s", what);
    errno = io_mode == IO_EIO ? EIO : ENOSPC;
    return 1;
}

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    // what a save opens: the file it writes (O_WRONLY, O_CREAT) and the folder it syncs; reads
    // (HDF5 opening a trial file to merge it) are not faulted
    int ours = io_armed && under_dir(path) && (flags & (O_WRONLY | O_RDWR | O_CREAT | O_DIRECTORY));
    if (ours && io_mode != IO_SHORT && io_event("open")) return -1;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
    if (fd >= 0 && fd < (int)sizeof our_fd) our_fd[fd] = (unsigned char)(ours ? (flags & O_DIRECTORY ? 2 : 1) : 0);
    return fd;
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

ssize_t write(int fd, const void *buf, size_t n) {
    int ours = fd >= 0 && fd < (int)sizeof our_fd && our_fd[fd] && io_armed;
    if (ours) {
        if (io_enospc_next) {
            io_enospc_next = 0;
            errno = ENOSPC;
            return -1;
        }
        long ev = ++io_events;
        if (ev == io_fail_at) {
            snprintf(io_what, sizeof io_what, "write");
            if (io_mode == IO_SHORT || io_mode == IO_SHORT_THEN_ENOSPC) {
                size_t part = n > 1 ? n / 2 : n;
                io_enospc_next = io_mode == IO_SHORT_THEN_ENOSPC;
                return (ssize_t)syscall(SYS_write, fd, buf, part);
            }
            errno = io_mode == IO_EIO ? EIO : ENOSPC;
            return -1;
        }
    }
    return (ssize_t)syscall(SYS_write, fd, buf, n);
}

int fsync(int fd) {
    if (fd >= 0 && fd < (int)sizeof our_fd && our_fd[fd] && io_armed && io_mode != IO_SHORT && io_event("fsync"))
        return -1;
    return (int)syscall(SYS_fsync, fd);
}

int close(int fd) {
    int ours = fd >= 0 && fd < (int)sizeof our_fd ? our_fd[fd] : 0;
    if (ours) our_fd[fd] = 0;
    int rc = (int)syscall(SYS_close, fd); // the descriptor is released even when close reports an error
    if (ours && io_armed && io_mode != IO_SHORT && io_event(ours == 2 ? "close of the folder" : "close")) return -1;
    return rc;
}

int rename(const char *from, const char *to) {
    if (io_armed && under_dir(to) && io_mode != IO_SHORT && io_event("rename")) return -1;
    return (int)syscall(SYS_renameat, AT_FDCWD, from, AT_FDCWD, to);
}

static void io_arm(long fail_at, enum io_mode mode) {
    io_events = 0;
    io_fail_at = fail_at;
    io_mode = mode;
    io_enospc_next = 0;
    io_what[0] = '\0';
    io_armed = 1;
}
static void io_disarm(void) { io_armed = 0; }

/* ---- what a fault may not leave behind -------------------------------------------------------- */

static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Mappings of files whose path contains `needle` (a model's leaked mmap). */
static int mappings_of(const char *needle) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

typedef struct held {
    uint64_t bytes; /* through gm_malloc */
    int fds;        /* open file descriptors */
    int64_t h5;     /* HDF5 ids */
    int maps;       /* mappings of the fixtures' files (model weights) */
} held;
static held held_now(void) {
    return (held){gm_alloc_get_stats().bytes_live, open_fds(), gm_h5_open_objects(), mappings_of("/tests/ref/")};
}
static bool held_same(held a, held b) { return a.bytes == b.bytes && a.fds == b.fds && a.h5 == b.h5 && a.maps == b.maps; }

static char tmpdir[256];
static const char *in_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    *n = b && len >= 0 && fread(b, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
    fclose(f);
    return b;
}
static void put(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

/* ---- the tiny model, a batch, a trainer ------------------------------------------------------ */

#define TINY "tests/ref/tiny_gemma3_chat"
#define B_ 2
#define T_ 24

static int32_t batch_ids[B_ * T_], batch_tg[B_ * T_];
static gm_batch the_batch(void) {
    uint64_t st = 7;
    for (int i = 0; i < B_ * T_; i++) batch_ids[i] = 4 + (int32_t)((gm_test_rand(&st) + 1.0f) * 100.0f);
    for (int i = 0; i < B_ * T_; i++) batch_tg[i] = (i % T_) >= T_ / 2 && (i % T_) + 1 < T_ ? batch_ids[i + 1] : -1;
    return (gm_batch){.B = B_, .T = T_, .ids = batch_ids, .targets = batch_tg, .example_index = NULL};
}

static gm_train_opts tiny_opts(int variant) {
    gm_train_opts o = gm_train_opts_default();
    o.lora.rank = 4;
    o.batch = B_;
    o.max_length = T_;
    o.lr = 1e-2f;
    o.total_steps = 4;
    if (variant == 1) { // activation checkpointing and dropout (their own buffers and RNG)
        o.checkpointing = true;
        o.lora.dropout = 0.1f;
    } else if (variant == 2) { // NF4 base: the re-encoding arena and its statistics
        gm_quant_from_name("nf4", &o.quant, NULL);
    }
    gm_train_opts_resolve(&o);
    return o;
}

/* The loss of one training step from a fresh trainer (NAN on failure). */
static double step_loss(gm_trainer *tr) {
    gm_batch b = the_batch();
    gm_step_stats st;
    gm_error err = {0};
    if (gm_trainer_step(tr, &b, 1, &st, &err) != GM_OK) {
        fprintf(stderr, "step failed: %s\n", err.msg);
        return NAN;
    }
    return st.loss;
}

/* ===================================================================== write failures */

typedef struct save_target {
    const char *name;
    const char *path;
    /* saves the new content; the previous content is on disk before each call */
    gm_status (*save)(void *ctx, gm_error *err);
    /* 1: `path` holds the new content, 0: the previous one, -1: neither / unreadable */
    int (*which)(void *ctx);
    void *ctx;
} save_target;

/* Sweeps every call of a save with every mode. */
static void sweep_writes(const save_target *t) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", t->path);
    size_t n_prev;
    unsigned char *prev = slurp(t->path, &n_prev);
    CHECK(prev && n_prev > 0, "%s: a previous file to protect", t->name);
    if (!prev) return;
    gm_error err = {0};
    // a clean save's calls: how many faults there are to inject
    io_arm(0, IO_ENOSPC);
    gm_status s = t->save(t->ctx, &err);
    io_disarm();
    long n_events = io_events;
    CHECK(s == GM_OK && t->which(t->ctx) == 1 && n_events >= 5, "%s: clean save (%ld calls): %s", t->name, n_events,
          err.msg);
    int n_failed = 0, n_replaced_msg = 0, n_ok = 0;
    for (int m = 0; m < IO_N_MODES; m++) {
        for (long k = 1;; k++) {
            put(t->path, prev, n_prev); // the previous file, as the last good save left it
            unlink(tmp);
            held h0 = held_now();
            io_arm(k, (enum io_mode)m);
            memset(&err, 0, sizeof err);
            s = t->save(t->ctx, &err);
            io_disarm();
            if (io_events < k) { // every call has had its fault
                CHECK(s == GM_OK, "%s: the save after the sweep: %s", t->name, err.msg);
                break;
            }
            char what[160];
            snprintf(what, sizeof what, "%s: call %ld (%s) fails with %s", t->name, k, io_what, io_mode_name[m]);
            held h1 = held_now();
            CHECK(held_same(h0, h1), "%s: leaked %lld bytes, %d descriptors, %lld HDF5 ids, %d mappings", what,
                  (long long)(h1.bytes - h0.bytes), h1.fds - h0.fds, (long long)(h1.h5 - h0.h5), h1.maps - h0.maps);
            CHECK(!gm_test_file_exists(tmp), "%s: %s left behind", what, tmp);
            size_t n_now;
            unsigned char *now = slurp(t->path, &n_now);
            bool unchanged = now && n_now == n_prev && memcmp(now, prev, n_prev) == 0;
            free(now);
            if (strcmp(io_what, "close of the folder") == 0) { // after its fsync: nothing can be lost
                CHECK(s == GM_OK && t->which(t->ctx) == 1, "%s: ignored, the new file in place: %s", what, err.msg);
                n_ok++;
                continue;
            }
            if (m == IO_SHORT) {
                CHECK(s == GM_OK && t->which(t->ctx) == 1, "%s: a short write alone is continued: %s", what, err.msg);
                n_ok++;
                continue;
            }
            const char *reason = m == IO_EIO ? strerror(EIO) : strerror(ENOSPC);
            CHECK(s == GM_ERR_IO, "%s: %s (%s)", what, gm_status_name(s), err.msg);
            CHECK(gm_test_contains(err.msg, t->path) && gm_test_contains(err.msg, reason),
                  "%s: the message names the file and '%s': %s", what, reason, err.msg);
            if (gm_test_contains(err.msg, "was replaced, but")) { // only the folder's fsync failed
                CHECK(strcmp(io_what, "rename") != 0 && t->which(t->ctx) == 1,
                      "%s: 'replaced' and the new file is in place", what);
                n_replaced_msg++;
            } else {
                CHECK(unchanged, "%s: the previous file is byte for byte as it was (%s)", what, err.msg);
                CHECK(gm_test_contains(err.msg, "untouched"), "%s: the message says the previous file is untouched: %s",
                      what, err.msg);
            }
            n_failed++;
        }
    }
    // and the handle is still good: the next save puts the new content in place
    put(t->path, prev, n_prev);
    CHECK_OK(t->save(t->ctx, &err), &err);
    CHECK(t->which(t->ctx) == 1, "%s: a save after the faults writes the new file", t->name);
    printf("  %s: %ld calls per save; %d injected failures reported, %d of them after the rename "
           "(new file kept, said so); %d harmless (short writes continued, the folder's close)\n",
           t->name, n_events, n_failed, n_replaced_msg, n_ok);
    free(prev);
}

/* -- a checkpoint -- */
typedef struct ckpt_ctx {
    gm_trainer *tr, *reader;
    const char *path;
} ckpt_ctx;
static gm_status ckpt_save(void *c, gm_error *err) {
    ckpt_ctx *x = c;
    return gm_trainer_save(x->tr, x->path, 1, 222, 1.5, "{}", err);
}
static int ckpt_which(void *c) {
    ckpt_ctx *x = c;
    int64_t epoch = 0, pos = 0;
    gm_error err = {0};
    if (gm_trainer_load(x->reader, x->path, &epoch, &pos, &err) != GM_OK) return -1;
    return pos == 222 ? 1 : pos == 111 ? 0 : -1;
}

/* -- a trial results file -- */
typedef struct res_ctx {
    gm_results *r;
    const char *path;
    int64_t rows_new;
} res_ctx;
static gm_status res_save(void *c, gm_error *err) { return gm_results_save(((res_ctx *)c)->r, err); }
static int res_which(void *c) {
    res_ctx *x = c;
    gm_results *r = NULL;
    gm_error err = {0};
    // (opened through the door too: reads are not faulted)
    if (gm_results_open(x->path, &r, &err) != GM_OK) return -1;
    int64_t rows = gm_results_rows(r);
    gm_results_free(r);
    return rows == x->rows_new ? 1 : rows == x->rows_new - 1 ? 0 : -1;
}

/* -- the merged file of a folder -- */
typedef struct merge_ctx {
    const char *dir, *path;
} merge_ctx;
static gm_status merge_save(void *c, gm_error *err) {
    merge_ctx *x = c;
    return gm_results_merge(x->dir, x->path, true, err);
}
static int merge_which(void *c) {
    merge_ctx *x = c;
    gm_h5_file *f = NULL;
    gm_error err = {0};
    if (gm_h5_open(x->path, false, &f, &err) != GM_OK) return -1;
    // the new merge has two trials, the previous one
    int n = gm_h5_exists(f, "/trial/trial-b") ? 1 : gm_h5_exists(f, "/trial/trial-a") ? 0 : -1;
    gm_h5_close(&f, &err);
    return n;
}

static void test_write_faults(const gm_model *m) {
    gm_error err = {0};
    snprintf(io_dir, sizeof io_dir, "%s/", tmpdir);
    io_dir_len = strlen(io_dir);
    char path[600];

    // checkpoint: previous = data position 111, new = 222 after a step
    gm_train_opts o = tiny_opts(0);
    ckpt_ctx c = {NULL, NULL, in_dir(path, sizeof path, "run.ckpt.h5")};
    CHECK_OK(gm_trainer_new(m, &o, &c.tr, &err), &err);
    CHECK_OK(gm_trainer_new(m, &o, &c.reader, &err), &err);
    if (c.tr && c.reader) {
        CHECK_OK(gm_trainer_save(c.tr, c.path, 1, 111, 2.0, "{}", &err), &err);
        CHECK(!isnan(step_loss(c.tr)), "a step between the checkpoints");
        sweep_writes(&(save_target){"checkpoint", c.path, ckpt_save, ckpt_which, &c});
    }
    gm_trainer_free(c.tr);
    gm_trainer_free(c.reader);

    // trial results file: previous = 3 rows, new = 4
    char rpath[600];
    res_ctx r = {NULL, in_dir(rpath, sizeof rpath, "trial-a.h5"), 4};
    CHECK_OK(gm_results_open(r.path, &r.r, &err), &err);
    if (r.r) {
        for (int i = 0; i < 3; i++) CHECK_OK(gm_results_append(r.r, "loss", 3.0 - i, &err), &err);
        CHECK_OK(gm_results_set_status(r.r, "completed", NULL, &err), &err);
        CHECK_OK(gm_results_save(r.r, &err), &err);
        CHECK_OK(gm_results_append(r.r, "loss", 0.5, &err), &err);
        sweep_writes(&(save_target){"trial results file", r.path, res_save, res_which, &r});
        gm_results_free(r.r);
    }

    // merged file: previous = trial-a alone, new = trial-a and trial-b
    char mdir[600], mpath[600], bpath[700];
    in_dir(mdir, sizeof mdir, "exp");
    mkdir(mdir, 0755);
    snprintf(mpath, sizeof mpath, "%s/exp.h5", tmpdir);
    gm_results *a = NULL;
    snprintf(bpath, sizeof bpath, "%s/trial-a.h5", mdir);
    CHECK_OK(gm_results_open(bpath, &a, &err), &err);
    if (a) {
        CHECK_OK(gm_results_set_status(a, "completed", NULL, &err), &err);
        CHECK_OK(gm_results_save(a, &err), &err);
        gm_results_free(a);
    }
    CHECK_OK(gm_results_merge(mdir, mpath, true, &err), &err);
    snprintf(bpath, sizeof bpath, "%s/trial-b.h5", mdir);
    CHECK_OK(gm_results_open(bpath, &a, &err), &err);
    if (a) {
        // an evaluation with per-example lists: the merge's allocation sweep reads them too
        const char *labels[2] = {"no", "yes"};
        int64_t idx[3] = {0, 1, 2}, pred[3] = {0, 1, 1}, ref[3] = {0, 1, 0};
        gm_results_eval e = {.accuracy = 2.0 / 3, .loss = NAN, .n_examples = 3, .n_classes = 2,
                             .labels = labels, .n_per_example = 3, .example_index = idx,
                             .predictions = pred, .references = ref};
        CHECK_OK(gm_results_set_eval(a, "final", &e, &err), &err);
        CHECK_OK(gm_results_set_status(a, "completed", NULL, &err), &err);
        CHECK_OK(gm_results_save(a, &err), &err);
        gm_results_free(a);
    }
    sweep_writes(&(save_target){"merged results file", mpath, merge_save, merge_which, &(merge_ctx){mdir, mpath}});
    io_dir_len = 0;
}

/* ================================================================ allocation failures */

static bool op_pending; /* the armed failure had not happened when the operation returned */

/* Called by each operation right after the call under test: records whether the failure fired
 * and disarms, so that the checks after it run with working memory. */
static void settle(void) {
    op_pending = gm_alloc_fail_pending();
    gm_alloc_fail_after(0);
}

/* Runs op under a failure at every allocation in turn, in both modes, until it makes fewer
 * allocations than N. `op` returns its status and undoes what it built; `check` (may be NULL)
 * judges a success. */
typedef gm_status (*alloc_op)(void *ctx, gm_error *err);
static void sweep_allocs(const char *name, alloc_op op, void *ctx, const char *must_say) {
    for (int persistent = 0; persistent < 2; persistent++) {
        int n_nomem = 0, n_ok = 0;
        uint64_t n = 1;
        for (;; n++) {
            held h0 = held_now();
            gm_error err = {0};
            if (persistent) gm_alloc_fail_from(n); else gm_alloc_fail_after(n);
            gm_status s = op(ctx, &err);
            bool pending = op_pending;
            held h1 = held_now();
            const char *mode = persistent ? "from" : "at";
            CHECK(held_same(h0, h1), "%s, allocation failing %s %llu: leaked %lld bytes, %d descriptors, %lld HDF5 ids, "
                  "%d mappings", name, mode, (unsigned long long)n, (long long)(h1.bytes - h0.bytes), h1.fds - h0.fds,
                  (long long)(h1.h5 - h0.h5), h1.maps - h0.maps);
            CHECK(s == GM_OK || s == GM_ERR_NOMEM, "%s, allocation failing %s %llu: %s: %s", name, mode,
                  (unsigned long long)n, gm_status_name(s), err.msg);
            if (s == GM_ERR_NOMEM)
                CHECK(gm_test_contains(err.msg, "out of memory") && (!must_say || gm_test_contains(err.msg, must_say)),
                      "%s, allocation failing %s %llu: the message says 'out of memory'%s%s: %s", name, mode,
                      (unsigned long long)n, must_say ? " and names " : "", must_say ? must_say : "", err.msg);
            n_nomem += s == GM_ERR_NOMEM;
            n_ok += s == GM_OK;
            if (pending) break; // the operation made fewer than n allocations: all have failed once
            if (n > 200000) {
                CHECK(false, "%s: the sweep does not end", name);
                break;
            }
        }
        CHECK(n_nomem > 0, "%s: some injected failures were reported", name);
        printf("  %s, %s: %llu allocations failed in turn; %d reported out of memory, %d succeeded anyway "
               "(with the clean result)\n", name, persistent ? "persistent" : "transient", (unsigned long long)(n - 1),
               n_nomem, n_ok - 1);
    }
}

static double clean_loss[3];

/* -- model loading, then the loss of a step must be the clean one -- */
static gm_status op_load(void *ctx, gm_error *err) {
    gm_model *m = NULL;
    gm_status s = gm_model_load(gm_test_path(TINY), NULL, &m, err);
    settle();
    if (s != GM_OK) {
        CHECK(m == NULL, "a failed load returns no model");
        return s;
    }
    CHECK(m->tok != NULL, "a successful load has its tokenizer");
    gm_train_opts o = tiny_opts(0);
    gm_trainer *tr = NULL;
    gm_error e2 = {0};
    if (gm_trainer_new(m, &o, &tr, &e2) == GM_OK) {
        double l = step_loss(tr);
        CHECK(l == clean_loss[0], "a model loaded despite a failed allocation trains as the clean one (%.9g vs %.9g)", l,
              clean_loss[0]);
        gm_trainer_free(tr);
    } else {
        CHECK(false, "trainer on a model loaded despite a failed allocation: %s", e2.msg);
    }
    gm_model_free(m);
    return s;
}

/* -- trainer creation (variant in ctx) -- */
typedef struct tr_ctx {
    const gm_model *m;
    int variant;
} tr_ctx;
static gm_status op_trainer(void *ctx, gm_error *err) {
    tr_ctx *x = ctx;
    gm_train_opts o = tiny_opts(x->variant);
    gm_trainer *tr = NULL;
    gm_status s = gm_trainer_new(x->m, &o, &tr, err);
    settle();
    if (s != GM_OK) {
        CHECK(tr == NULL, "a failed trainer creation returns no trainer");
        return s;
    }
    double l = step_loss(tr);
    CHECK(l == clean_loss[x->variant], "a trainer built despite a failed allocation trains as the clean one (%.9g vs %.9g)",
          l, clean_loss[x->variant]);
    gm_trainer_free(tr);
    return s;
}

/* -- tokenizing conversations into a data set -- */
static gm_status op_dataset(void *ctx, gm_error *err) {
    const gm_model *m = ctx;
    gm_dataset ds;
    gm_dataset_init(&ds);
    static const gm_chat_msg chats[3][2] = {
        {{"user", "Which fruit is red?"}, {"assistant", "The cherry."}},
        {{"user", "A short note about the berry"}, {"assistant", "berry"}},
        {{"user", "And the apple?"}, {"assistant", "An apple a day keeps the doctor away."}},
    };
    gm_status s = GM_OK;
    for (int i = 0; i < 3 && s == GM_OK; i++) {
        int64_t n0 = ds.n;
        s = gm_dataset_add_chat(&ds, m->tok, chats[i], 2, 64, -1, err);
        if (s != GM_OK) CHECK(ds.n == n0, "a failed add leaves the data set as it was");
    }
    settle();
    if (s == GM_OK) CHECK(ds.n == 3 && ds.ex[2].n > 10, "three examples tokenized");
    gm_dataset_free(&ds);
    return s;
}

/* -- reopening a trial file to resume it -- */
static gm_status op_results_open(void *ctx, gm_error *err) {
    gm_results *r = NULL;
    gm_status s = gm_results_open((const char *)ctx, &r, err);
    settle();
    if (s == GM_OK) {
        CHECK(gm_results_resumed(r) && gm_results_rows(r) == 4, "a trial file reopened despite a failed allocation "
              "has its rows");
        gm_results_free(r);
    } else {
        CHECK(r == NULL, "a failed open returns no handle");
    }
    return s;
}

/* -- merging a folder of trial files (what `gemmarun table` reads) -- */
static gm_status op_merge(void *ctx, gm_error *err) {
    char out[700];
    snprintf(out, sizeof out, "%s/merged.h5", tmpdir);
    gm_status s = gm_results_merge((const char *)ctx, out, true, err);
    settle();
    if (s == GM_OK) CHECK(merge_which(&(merge_ctx){ctx, out}) == 1, "a merge done despite a failed allocation holds "
                          "both trials");
    else CHECK(!gm_test_file_exists(out), "a failed merge writes nothing");
    unlink(out);
    return s;
}

static void test_alloc_faults(const gm_model *m) {
    for (int v = 0; v < 3; v++) {
        gm_train_opts o = tiny_opts(v);
        gm_trainer *tr = NULL;
        gm_error err = {0};
        CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
        clean_loss[v] = tr ? step_loss(tr) : NAN;
        gm_trainer_free(tr);
        CHECK(isfinite(clean_loss[v]), "clean loss of variant %d", v);
    }
    sweep_allocs("loading the tiny Gemma 3 (config.json, safetensors, tokenizer.json)", op_load, NULL, NULL);
    sweep_allocs("creating a trainer (f32 base)", op_trainer, &(tr_ctx){m, 0}, NULL);
    sweep_allocs("creating a trainer (checkpointing, dropout)", op_trainer, &(tr_ctx){m, 1}, NULL);
    sweep_allocs("creating a trainer (NF4 base)", op_trainer, &(tr_ctx){m, 2}, NULL);
    sweep_allocs("tokenizing three conversations", op_dataset, (void *)m, NULL);
    char path[600];
    in_dir(path, sizeof path, "trial-a.h5");
    sweep_allocs("reopening a trial file to resume it", op_results_open, path, path);
    in_dir(path, sizeof path, "exp");
    sweep_allocs("merging a folder of two trial files", op_merge, path, NULL);
}

int main(void) {
    if (!gm_test_make_tmpdir("faults", tmpdir, sizeof tmpdir)) return gm_test_finish();
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path(TINY), NULL, &m, &err), &err);
    if (m) {
        test_write_faults(m);
        test_alloc_faults(m);
        gm_model_free(m);
    }
    gm_test_remove_tmpdir(tmpdir);
    return gm_test_finish();
}
