/*
 * gm_file.h - writing whole files so that a crash or a full disk never leaves a torn one.
 *
 * Every file gemmarun writes as a whole - checkpoints and results files (their HDF5 images,
 * core/store/gm_h5.h), tables and reports (gm.write_text) - goes through gm_write_file_atomic:
 * the bytes go to <path>.tmp in the same folder, are fsync'd, rename()d onto `path`, and the
 * folder is fsync'd (formats.md §7.3; the same order as SQLite's rollback journal and LMDB's
 * meta page: data durable before the name points at it). rename() within one folder is atomic
 * on POSIX file systems, so at every instant `path` holds the previous complete file or the new
 * one; a kill leaves at most a stray <path>.tmp, which the next save truncates and renames.
 *
 * Ownership: the data stays the caller's. Errors: GM_ERR_IO with a message that starts with the
 * path and gives the system's reason (ENOSPC, EFBIG, EIO, EACCES, EROFS ...) and which step
 * failed (create, write after N of M bytes, fsync, close, rename); GM_ERR_NOMEM. A failure
 * before the rename removes the .tmp and leaves `path` untouched (the message says so); a
 * failure of the final folder fsync means the new file is in place but may not survive a power
 * cut (the message says that too). Short writes are continued; EINTR is retried. Saves to one
 * path must not run concurrently (they share <path>.tmp). Fault-injected in tests/unit/
 * test_faults.c (every open, write, fsync, close and rename failing in turn).
 */
#ifndef GM_FILE_H
#define GM_FILE_H

#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes n bytes to `path` (created or truncated, mode 0644), fsync'd when `durable`. On failure
 * `path` may hold part of the data and is the caller's to remove. */
gm_status gm_write_file(const char *path, const void *data, size_t n, bool durable, gm_error *err);

/* Crash-safe replacement of `path` by n bytes (above). */
gm_status gm_write_file_atomic(const char *path, const void *data, size_t n, gm_error *err);

/* One piece of a file written from several buffers (borrowed). */
typedef struct gm_file_part {
    const void *data;
    size_t n;
} gm_file_part;

/* gm_write_file / gm_write_file_atomic of the concatenation of n_parts buffers, written in
 * order without joining them: a large file (a merged model's tensors) needs no second copy in
 * memory. */
gm_status gm_write_file_parts(const char *path, const gm_file_part *parts, int n_parts, bool durable, gm_error *err);
gm_status gm_write_file_atomic_parts(const char *path, const gm_file_part *parts, int n_parts, gm_error *err);

/* The first entry of folder `dir` (other than . and ..) whose name is not among allowed[0..n),
 * into found (cut to cap; "" when there is none or `dir` does not exist): what an export that may
 * replace only its own earlier files must not touch. Errors: GM_ERR_IO when `dir` exists but
 * cannot be read. */
gm_status gm_folder_foreign(const char *dir, const char *const *allowed, int n, char *found, size_t cap, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_FILE_H */
