/*
 * gm_h5.h - the thin HDF5 layer under checkpoints and experiment results files.
 *
 * Files are opened and closed here; everything inside one is addressed by an object path
 * ("/adapter/<name>", "/metrics/loss"). What it writes reads cleanly in h5py and pandas
 * (formats.md §7.1): explicit little-endian file types, C-order shapes (outermost first, as
 * gm_tensor), string attributes as variable-length UTF-8 (h5py returns `str`), default library
 * version bounds (so a crashed writer leaves no "file is open for write" flag, formats.md §7.2).
 * Appendable 1-D series (per-step loss logs) are chunked, shuffle+deflate(4), with unlimited
 * max size, grown with H5Dset_extent + a hyperslab write; h5py reports maxshape=(None,).
 * Extending it: a compound "table" dataset (pandas.read_hdf) would be one more pair of
 * functions here beside the series ones, built on gm_h5_raw_id + H5TB (hdf5_hl is linked).
 *
 * Two kinds of files. Disk files (gm_h5_create/gm_h5_open) are read and written by HDF5 itself.
 * Memory files (gm_h5_create_memory) never touch the disk through HDF5: gm_h5_save_atomic puts
 * a complete image in place with our own write + fsync + rename, so a reader (or a resumed run)
 * sees either the previous snapshot or the new one, never a torn file, and no file lock is held
 * between snapshots. Write checkpoints and logs that must survive crashes and disk-full that
 * way. Why: HDF5 1.10.8 cannot recover from a failed write during a flush or close of a disk
 * file: its metadata cache stays broken ("slist already enabled?"), every later flush and close
 * fails, and the library's atexit clean-up then crashes the process (SIGSEGV), even when the
 * file is never closed (measured here with ENOSPC; fixed upstream by HDFGroup/hdf5 PR #2291;
 * h5py issue #914 is the same crash). Errors are still reported first; the crash comes at exit.
 *
 * Ownership: gm_h5_create/gm_h5_open/gm_h5_create_memory return an owned handle that
 * gm_h5_close releases (the
 * handle keeps a copy of the path for messages). Every other function borrows the handle and
 * the caller's buffers; the functions that return memory say so (gm_malloc'd, gm_free it).
 * Errors: functions return gm_status and write a message into the caller's gm_error that starts
 * with the file path, names the object, and ends with the HDF5 error-stack text where HDF5
 * failed ("... : HDF5: <innermost cause> <- <outer> ..."). HDF5's own automatic printing to
 * stderr is switched off by every entry point. Codes: GM_ERR_IO (HDF5 or OS call failed),
 * GM_ERR_NOT_FOUND (object or attribute missing), GM_ERR_FORMAT (not HDF5, or an object of
 * another type/kind than asked), GM_ERR_INVALID (bad argument, shape differs from the one
 * expected), GM_ERR_UNSUPPORTED (dtype without an HDF5 mapping here), GM_ERR_NOMEM.
 * Thread-safety: none. Debian's serial libhdf5 is not thread-safe: all gm_h5 calls (and any
 * other HDF5 use in the process) must come from one thread at a time.
 */
#ifndef GM_H5_H
#define GM_H5_H

#include "gm_dtype.h"  // gm_dtype
#include "gm_status.h" // gm_status, gm_error

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GM_H5_MAX_DIMS 4

typedef struct gm_h5_file gm_h5_file;

/* ---- files ------------------------------------------------------------------------------ */

/* Creates (truncating any existing file) `path` for writing. *out receives an owned handle, or
 * NULL on failure. */
gm_status gm_h5_create(const char *path, gm_h5_file **out, gm_error *err);

/* Opens an existing file, read-only unless `writable`. A missing file is GM_ERR_IO ("no such
 * file"), a file without the HDF5 signature GM_ERR_FORMAT ("not an HDF5 file"). */
gm_status gm_h5_open(const char *path, bool writable, gm_h5_file **out, gm_error *err);

/* Creates an HDF5 file that lives in memory only (HDF5 core driver, no backing store); `name`
 * labels it in messages (usually the path it will be saved to). gm_h5_save_atomic and
 * gm_h5_write_image put it on disk, as often as wanted; gm_h5_close discards it. HDF5 never
 * touches the disk for such a file, so disk errors come from our own write(2)/fsync(2) as plain
 * errno values. `size_hint`: the expected final size in bytes (0: unknown); when right, HDF5
 * allocates its buffer once (else it grows in 1 MiB steps). */
gm_status gm_h5_create_memory(const char *name, size_t size_hint, gm_h5_file **out,
                              gm_error *err);

/* Crash-safe snapshot of a memory file (formats.md §7.3): the complete image goes to
 * <path>.tmp (same folder), is fsync'd, rename()d onto `path`, and the folder is fsync'd. At
 * every instant `path` holds the previous complete file or the new one; a kill leaves at most
 * a stray <path>.tmp, which the next save overwrites. On failure before the rename the .tmp is
 * removed and `path` is untouched (the message says so); a failure of the final folder fsync
 * says that the new file is in place but may not survive a power cut. The memory file stays
 * open and unchanged (keep appending, save again). Memory: a second copy of the image while it
 * is written. Saves to one path must not run concurrently (they share <path>.tmp).
 * Errors: GM_ERR_IO (errno text: ENOSPC, EFBIG, EIO, EACCES), GM_ERR_NOMEM, GM_ERR_INVALID (not
 * a memory file). */
gm_status gm_h5_save_atomic(gm_h5_file *f, const char *path, gm_error *err);

/* The plain write under gm_h5_save_atomic: the complete current image of a memory file to
 * `path` (created or truncated), fsync'd when `durable`. On failure `path` may hold part of the
 * image and is the caller's to remove. Errors as gm_h5_save_atomic. */
gm_status gm_h5_write_image(gm_h5_file *f, const char *path, bool durable, gm_error *err);

/* The HDF5 library's version as "major.minor.release" into buf (results provenance). */
void gm_h5_library_version(char *buf, size_t cap);

/* Closes the series kept open and the file (for a disk file HDF5 writes what it still buffers;
 * a memory file is discarded) and frees the handle; sets *f to NULL. A failure here is
 * GM_ERR_IO and, for a disk file being written, means the file is damaged (and see above: HDF5
 * 1.10.8 will crash at exit after a failed write). gm_h5_close(NULL or &NULL) is a no-op. */
gm_status gm_h5_close(gm_h5_file **f, gm_error *err);

/* Disk files: H5Fflush(global), cached series chunks included: after it, the file on disk is
 * consistent and survives the process being killed (formats.md §7.2: an unflushed
 * default-libver file is lost whole; a kill *during* a flush can still damage it). It does not
 * fsync: data may still be in the OS page cache if the machine itself crashes. Memory files:
 * settles HDF5's caches into the image (nothing reaches the disk; use gm_h5_save_atomic). */
gm_status gm_h5_flush(gm_h5_file *f, gm_error *err);

/* The path given at create/open (borrowed, valid until gm_h5_close). */
const char *gm_h5_path(const gm_h5_file *f);

/* The raw hid_t of the file (as int64_t, which is what hid_t is in HDF5 1.10), for HDF5 calls
 * this layer does not wrap. Borrowed: do not close it. */
int64_t gm_h5_raw_id(const gm_h5_file *f);

/* Number of HDF5 identifiers open in the whole process: files, groups, datasets, attributes
 * (H5Fget_obj_count) plus datatypes, dataspaces and property lists. The library's predefined
 * types and default property lists are counted too, so compare two counts (before/after) rather
 * than with zero. Tests use it to prove every path closes what it opened. */
int64_t gm_h5_open_objects(void);

/* ---- groups and listing ----------------------------------------------------------------- */

/* Creates the group `path` and any missing groups above it. An existing group is success; an
 * existing object of another kind is GM_ERR_FORMAT. */
gm_status gm_h5_group_create(gm_h5_file *f, const char *path, gm_error *err);

/* True if every component of `path` exists and the last one is an object (group, dataset).
 * Never fails: an unreadable path counts as absent. */
bool gm_h5_exists(gm_h5_file *f, const char *path);

typedef enum gm_h5_kind {
    GM_H5_GROUP = 0,
    GM_H5_DATASET,
    GM_H5_OTHER, /* named datatype, soft/external link */
    GM_H5_KIND_COUNT
} gm_h5_kind;

typedef struct gm_h5_child {
    char *name;      /* link name (not a full path), gm_malloc'd */
    gm_h5_kind kind;
} gm_h5_child;

/* Lists the links in group `path` in name order. *out is a gm_malloc'd array of *n entries
 * (NULL when empty) released with gm_h5_list_free. On failure *out = NULL, *n = 0. */
gm_status gm_h5_list(gm_h5_file *f, const char *path, gm_h5_child **out, int *n, gm_error *err);
void gm_h5_list_free(gm_h5_child *children, int n);

/* ---- scalar attributes ------------------------------------------------------------------
 * `obj` is the group or dataset carrying the attribute ("/" for the file's root). Setting
 * replaces an existing attribute of that name. File types: i64 -> H5T_STD_I64LE,
 * u64 -> H5T_STD_U64LE, f64 -> H5T_IEEE_F64LE, str -> variable-length UTF-8 (no size limit:
 * the text lives in the global heap, not the 64 KiB object header).
 * Getters: a missing attribute is GM_ERR_NOT_FOUND; one of another class (a string read as a
 * number) or out of range (a negative value read as u64) is GM_ERR_FORMAT. Integer getters
 * accept any integer width; get_f64 also accepts integers. */
gm_status gm_h5_attr_set_i64(gm_h5_file *f, const char *obj, const char *name, int64_t v,
                             gm_error *err);
gm_status gm_h5_attr_set_u64(gm_h5_file *f, const char *obj, const char *name, uint64_t v,
                             gm_error *err);
gm_status gm_h5_attr_set_f64(gm_h5_file *f, const char *obj, const char *name, double v,
                             gm_error *err);
gm_status gm_h5_attr_set_str(gm_h5_file *f, const char *obj, const char *name, const char *v,
                             gm_error *err);

gm_status gm_h5_attr_get_i64(gm_h5_file *f, const char *obj, const char *name, int64_t *out,
                             gm_error *err);
gm_status gm_h5_attr_get_u64(gm_h5_file *f, const char *obj, const char *name, uint64_t *out,
                             gm_error *err);
gm_status gm_h5_attr_get_f64(gm_h5_file *f, const char *obj, const char *name, double *out,
                             gm_error *err);
/* Reads a string attribute (variable or fixed length) into a gm_malloc'd, NUL-terminated copy
 * (*out; NULL on failure). */
gm_status gm_h5_attr_get_str(gm_h5_file *f, const char *obj, const char *name, char **out,
                             gm_error *err);

/* ---- whole datasets ---------------------------------------------------------------------
 * dtype is one of GM_F32, GM_F64, GM_I32, GM_I64 (others: GM_ERR_UNSUPPORTED); memory is
 * native and C-contiguous, `ndim` 0..GM_H5_MAX_DIMS (0 = scalar), dims may be 0. */

/* Creates dataset `path` (missing groups above it are created) and writes `data`, stored
 * contiguous, uncompressed. An existing object at `path` is GM_ERR_INVALID (HDF5 cannot give
 * the space of a deleted dataset back, so silently replacing would grow the file). */
gm_status gm_h5_write(gm_h5_file *f, const char *path, gm_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, gm_error *err);

/* Shape and element type of dataset `path`. *dtype is GM_DTYPE_COUNT for a type with no
 * gm_dtype here (strings, compounds, f16 ...). Missing: GM_ERR_NOT_FOUND; a group:
 * GM_ERR_FORMAT. */
gm_status gm_h5_dataset_info(gm_h5_file *f, const char *path, gm_dtype *dtype, int *ndim,
                             int64_t shape[GM_H5_MAX_DIMS], gm_error *err);

/* Reads the whole dataset into `data`, whose shape the caller states: it must equal the file's
 * exactly (else GM_ERR_INVALID, message with both shapes) and `data` is untouched. The stored
 * type must be of the same class (float/integer) as `dtype`; HDF5 converts widths. */
gm_status gm_h5_read(gm_h5_file *f, const char *path, gm_dtype dtype, int ndim,
                     const int64_t *shape, void *data, gm_error *err);

/* ---- appendable 1-D series (per-step logs) ----------------------------------------------
 * Layout: 1-D, maxshape unlimited, chunked `chunk` elements (0: 1024, i.e. 8 KiB of f64),
 * shuffle + deflate(4) (gzip: readable everywhere, unlike lzf). dtype GM_F64 or GM_I64. */

/* Creates an empty series (missing groups above it are created). */
gm_status gm_h5_series_create(gm_h5_file *f, const char *path, gm_dtype dtype, int64_t chunk,
                              gm_error *err);

/* Appends `n` values to series `path`, creating it (default chunk) when missing. The series
 * must be 1-D, extendible, and of the same class (float/integer) as `dtype`. The handle keeps up
 * to 16 series open between appends (closed by gm_h5_close), so a per-step append costs a few
 * microseconds and the last chunk is compressed once, not on every append. Appended values are
 * durable only after gm_h5_flush or gm_h5_close. */
gm_status gm_h5_append(gm_h5_file *f, const char *path, gm_dtype dtype, const void *values,
                       int64_t n, gm_error *err);
gm_status gm_h5_append_f64(gm_h5_file *f, const char *path, double value, gm_error *err);
gm_status gm_h5_append_i64(gm_h5_file *f, const char *path, int64_t value, gm_error *err);

/* ---- error bridge ----------------------------------------------------------------------- */

/* Switches off HDF5's automatic error printing (process-wide; idempotent). Every gm_h5 entry
 * point calls it; call it yourself before using HDF5 directly. */
void gm_h5_silence(void);

/* Writes the printf-style message, then ": HDF5: " and the current HDF5 error stack (innermost
 * cause first, " <- " between frames, truncated to fit) into `err`; returns `code`. Call it
 * right after the failing HDF5 call: the next HDF5 API call clears the stack. */
gm_status gm_h5_error_set(gm_error *err, gm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif /* GM_H5_H */
