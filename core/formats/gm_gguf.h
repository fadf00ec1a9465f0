/*
 * gm_gguf.h - GGUF reader (llama.cpp's model format), memory-mapped.
 *
 * Parses the header, metadata key/values, tensor infos and alignment of a GGUF v2/v3 file
 * (formats.md §1.1-1.3) and validates everything before returning: magic, version, counts,
 * string lengths, value types, array element types, dims (<= 4, > 0 elements, no overflow),
 * tensor types (known to gm_dtype), row size a multiple of the block size, offsets aligned and
 * every tensor inside the file. Tensor data is never copied: gm_gguf_tensor.data points into the
 * mapping.
 *
 * Shapes are converted to our order: GGUF ne[] (innermost first) is reversed, so a PyTorch
 * [out, in] weight stored as ne = [in, out] appears here as shape {out, in}.
 *
 * Ownership: gm_gguf owns the mapping and every string/array index; all pointers returned by
 * the getters are borrowed and valid until gm_gguf_free.
 * Errors: gm_gguf_open returns GM_ERR_IO (cannot open/map), GM_ERR_FORMAT (malformed or
 * truncated; the message names the file, the byte offset and what was expected) or
 * GM_ERR_UNSUPPORTED (a ggml tensor type we do not decode, named by id and name). It never
 * crashes on any input (fuzzed by tests/fuzz/fuzz_gguf.c).
 */
#ifndef GM_GGUF_H
#define GM_GGUF_H

#include "gm_dtype.h"
#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GGUF metadata value types (formats.md §1.1). */
typedef enum gm_gguf_vtype {
    GM_GGUF_UINT8 = 0, GM_GGUF_INT8 = 1, GM_GGUF_UINT16 = 2, GM_GGUF_INT16 = 3,
    GM_GGUF_UINT32 = 4, GM_GGUF_INT32 = 5, GM_GGUF_FLOAT32 = 6, GM_GGUF_BOOL = 7,
    GM_GGUF_STRING = 8, GM_GGUF_ARRAY = 9, GM_GGUF_UINT64 = 10, GM_GGUF_INT64 = 11,
    GM_GGUF_FLOAT64 = 12, GM_GGUF_VTYPE_COUNT
} gm_gguf_vtype;

/* A length-delimited string inside the mapping (not NUL-terminated). */
typedef struct gm_strref {
    const char *p;
    uint64_t len;
} gm_strref;

typedef struct gm_gguf_kv {
    gm_strref key;
    gm_gguf_vtype type;      /* GM_GGUF_ARRAY for arrays */
    gm_gguf_vtype arr_type;  /* element type when type == GM_GGUF_ARRAY */
    uint64_t n;              /* element count (1 for scalars) */
    const uint8_t *data;     /* raw little-endian value (scalars, numeric arrays) */
    gm_strref *strs;         /* string value (n == 1) or string array elements; else NULL */
} gm_gguf_kv;

typedef struct gm_gguf_tensor {
    gm_strref name;
    char cname[80];          /* the name NUL-terminated (GGUF names are < 64 bytes) */
    gm_dtype dtype;
    uint32_t ggml_type;      /* the raw ggml type id as stored */
    int ndim;
    int64_t shape[4];        /* outermost first (reversed ne); entries >= ndim are 1 */
    uint64_t offset;         /* relative to the data section */
    size_t nbytes;
    const void *data;        /* inside the mapping */
} gm_gguf_tensor;

typedef struct gm_gguf gm_gguf;

/* Opens and validates `path`. */
gm_status gm_gguf_open(const char *path, gm_gguf **out, gm_error *err);

/* Parses a GGUF image already in memory (not copied: `buf` must outlive the result). `label`
 * names it in messages. Used by the fuzzer and by tests. */
gm_status gm_gguf_open_memory(const void *buf, size_t size, const char *label, gm_gguf **out,
                              gm_error *err);

void gm_gguf_free(gm_gguf *g);

/* ---- queries ---- */
const char *gm_gguf_path(const gm_gguf *g);
uint32_t gm_gguf_version(const gm_gguf *g);
uint32_t gm_gguf_alignment(const gm_gguf *g);
size_t gm_gguf_data_offset(const gm_gguf *g); /* absolute file offset of the data section */
size_t gm_gguf_file_size(const gm_gguf *g);

int64_t gm_gguf_n_kv(const gm_gguf *g);
const gm_gguf_kv *gm_gguf_kv_at(const gm_gguf *g, int64_t i);
const gm_gguf_kv *gm_gguf_find_kv(const gm_gguf *g, const char *key); /* NULL if absent */

/* Typed getters: return false if the key is absent or has an incompatible type.
 * get_int accepts any integer type (and bool); get_float accepts f32/f64 (and integers). */
bool gm_gguf_get_int(const gm_gguf *g, const char *key, int64_t *out);
bool gm_gguf_get_float(const gm_gguf *g, const char *key, double *out);
bool gm_gguf_get_bool(const gm_gguf *g, const char *key, bool *out);
bool gm_gguf_get_str(const gm_gguf *g, const char *key, gm_strref *out);
/* Array of strings (n elements). */
bool gm_gguf_get_str_array(const gm_gguf *g, const char *key, const gm_strref **out, uint64_t *n);
/* Numeric array: `elem_type` receives the element type; data is raw little-endian. */
bool gm_gguf_get_array(const gm_gguf *g, const char *key, gm_gguf_vtype *elem_type,
                       const void **data, uint64_t *n);

int64_t gm_gguf_n_tensors(const gm_gguf *g);
const gm_gguf_tensor *gm_gguf_tensor_at(const gm_gguf *g, int64_t i);
const gm_gguf_tensor *gm_gguf_find_tensor(const gm_gguf *g, const char *name); /* NULL if absent */

/* Name of a ggml type id ("q4_K", "iq2_xxs", ...) for messages, or "unknown". */
const char *gm_gguf_ggml_type_name(uint32_t ggml_type);

/* Name of a metadata value type ("uint32", "string", ...) for messages, or "unknown". Lets
 * callers say "key X has type string, expected an integer". */
const char *gm_gguf_vtype_name(gm_gguf_vtype t);

/* ---- writing ---- */

/* A GGUF v3 file being assembled: metadata in the order added, then tensors (data borrowed until
 * gm_gguf_write returns), each aligned to 32 bytes (general.alignment is not written: the default).
 * Errors while adding (out of memory, a name of 64 bytes or more, a dtype GGUF has no id for) are
 * kept and returned by gm_gguf_write, so callers add without checking each call.
 * Ownership: the writer copies keys, strings and names; gm_gguf_writer_free releases them. */
typedef struct gm_gguf_writer gm_gguf_writer;

gm_gguf_writer *gm_gguf_writer_new(void); /* NULL when out of memory */
void gm_gguf_writer_free(gm_gguf_writer *w);
void gm_gguf_set_str(gm_gguf_writer *w, const char *key, const char *value);
void gm_gguf_set_u32(gm_gguf_writer *w, const char *key, uint32_t value);
void gm_gguf_set_f32(gm_gguf_writer *w, const char *key, float value);
/* Copies a key/value read from another file (any type, arrays included), e.g. a base model's
 * tokenizer into a merged model. */
void gm_gguf_copy_kv(gm_gguf_writer *w, const gm_gguf_kv *kv);
/* A tensor of `shape` (outermost first, as everywhere in gemmarun; written as GGUF's reversed ne)
 * in `dtype` (f32, f16, bf16 or a block format; its bytes as gm_dtype_row_bytes gives them). */
void gm_gguf_add_tensor(gm_gguf_writer *w, const char *name, gm_dtype dtype, int ndim, const int64_t *shape,
                        const void *data);
/* Writes the file atomically (gm_write_file_atomic; the image is built in memory). Errors: the
 * first error of an add call, GM_ERR_NOMEM, GM_ERR_IO naming the path. */
gm_status gm_gguf_write(gm_gguf_writer *w, const char *path, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_GGUF_H */
