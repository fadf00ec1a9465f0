/*
 * gm_safetensors.h - safetensors reader (single file or sharded Hugging Face folder), mmapped.
 *
 * Layout (formats.md §4.1): u64 LE header length N, N bytes of JSON (parsed with cJSON), then
 * the byte buffer. Validation as the reference Rust reader: header starts with '{', N <= 100 MB,
 * every entry has a known dtype, a shape, data_offsets [begin, end) with
 * end - begin == numel * size, offsets tile the buffer exactly, and the buffer ends at EOF.
 * A folder is opened through model.safetensors.index.json ("weight_map": name -> shard file)
 * or, without an index, its single model.safetensors (formats.md §4.2).
 *
 * Shapes are stored outermost first, as in PyTorch (no reversal).
 *
 * Ownership: gm_safetensors owns the mappings, the parsed names and the index; tensor pointers
 * are borrowed and valid until gm_safetensors_free.
 * Errors: GM_ERR_IO (missing file/folder), GM_ERR_FORMAT (the message names the file and the
 * entry: "model.safetensors: tensor 'x': data_offsets [0, 12) do not match f32[4, 4] (64
 * bytes)"), GM_ERR_UNSUPPORTED (a dtype such as F8_E4M3 we do not handle).
 */
#ifndef GM_SAFETENSORS_H
#define GM_SAFETENSORS_H

#include "gm_dtype.h"
#include "gm_status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_st_tensor {
    char *name;           /* owned by the gm_safetensors */
    gm_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;     /* inside a mapping */
    size_t nbytes;
    int shard;            /* index of the file it came from */
} gm_st_tensor;

typedef struct gm_safetensors gm_safetensors;

/* `path` is a .safetensors file, a model.safetensors.index.json, or a folder holding either. */
gm_status gm_safetensors_open(const char *path, gm_safetensors **out, gm_error *err);

/* Parses one safetensors image in memory (not copied). For tests and fuzzing. */
gm_status gm_safetensors_open_memory(const void *buf, size_t size, const char *label,
                                     gm_safetensors **out, gm_error *err);

void gm_safetensors_free(gm_safetensors *st);

int64_t gm_safetensors_n_tensors(const gm_safetensors *st);
const gm_st_tensor *gm_safetensors_tensor_at(const gm_safetensors *st, int64_t i);
const gm_st_tensor *gm_safetensors_find(const gm_safetensors *st, const char *name);
/* Value of a "__metadata__" entry of the first shard, or NULL. */
const char *gm_safetensors_metadata(const gm_safetensors *st, const char *key);
/* Number of files the tensors come from (1 for a single .safetensors file). */
int gm_safetensors_n_shards(const gm_safetensors *st);
/* Path of shard i (for messages). */
const char *gm_safetensors_shard_path(const gm_safetensors *st, int shard);

/* ---- writing ---- */

/* One tensor to write: its name, dtype (a scalar dtype: F32, F16, BF16, F64, I8..I64), shape
 * (outermost first) and bytes (numel * element size, little-endian), borrowed. */
typedef struct gm_st_write_tensor {
    const char *name;
    gm_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
} gm_st_write_tensor;

/* Writes a single .safetensors file (formats.md §4.1) at `path`, atomically (gm_write_file_atomic):
 * the header lists the tensors in name order, as the reference writer does, with data_offsets in
 * that order, padded with spaces to a multiple of 8 bytes; `meta` (n_meta key/value pairs, both
 * strings, may be NULL) becomes "__metadata__". The whole file is built in memory (adapters and
 * exported models are written a file at a time).
 * Errors: GM_ERR_INVALID (a block dtype, a duplicate or empty name, more than 8 dims),
 * GM_ERR_NOMEM, GM_ERR_IO naming the path. */
gm_status gm_safetensors_write(const char *path, const gm_st_write_tensor *t, int n, const char *const *meta, int n_meta,
                               gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_SAFETENSORS_H */
