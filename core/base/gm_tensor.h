/*
 * gm_tensor.h - non-owning tensor views.
 *
 * A gm_tensor describes memory it does not own: dtype, device, up to 4 dims with shapes and
 * strides in *elements*, outermost dimension first (PyTorch/NumPy/HDF5 order, so reference
 * dumps need no transposition; GGUF's ne[] order is reversed on load). A Linear weight of
 * PyTorch shape [out, in] is a 2-D tensor {out, in}.
 *
 * Block-quantized dtypes (q4_k, ...) are addressed by rows: the innermost dim must be
 * contiguous and a multiple of the block size; strides of outer dims are still in logical
 * elements (a row of 640 q5_0 elements has stride 640 and occupies 440 bytes).
 *
 * Ownership: the memory belongs to an arena, a mapped file or a caller; views never free.
 * Errors: the helpers here assert on misuse (bugs); loaders validate shapes before building
 * views.
 */
#ifndef GM_TENSOR_H
#define GM_TENSOR_H

#include "gm_arena.h"
#include "gm_dtype.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GM_MAX_DIMS 4

typedef struct gm_tensor {
    gm_dtype dtype;
    gm_device device;
    int ndim;
    int64_t shape[GM_MAX_DIMS];  /* outermost first */
    int64_t stride[GM_MAX_DIMS]; /* in elements, outermost first */
    void *data;                  /* first element; NULL for a tensor that is only planned */
    char name[96];               /* canonical name, e.g. "layers.3.attn.q" (may be empty) */
} gm_tensor;

/* A contiguous view over `data` with the given shape. */
gm_tensor gm_tensor_make(gm_dtype dtype, gm_device device, int ndim, const int64_t *shape,
                         void *data);
/* Shorthand for 1-D and 2-D contiguous views. */
gm_tensor gm_tensor_1d(gm_dtype dtype, int64_t n, void *data);
gm_tensor gm_tensor_2d(gm_dtype dtype, int64_t rows, int64_t cols, void *data);

int64_t gm_tensor_numel(const gm_tensor *t);
/* Bytes of a contiguous tensor of this shape and dtype. */
size_t gm_tensor_nbytes(const gm_tensor *t);
bool gm_tensor_is_contiguous(const gm_tensor *t);

/* Pointer to row `r` of a 2-D tensor (any dtype, including block formats). */
void *gm_tensor_row(const gm_tensor *t, int64_t r);

/* Rows [r0, r0+n) of a 2-D tensor, as a view. */
gm_tensor gm_tensor_rows(const gm_tensor *t, int64_t r0, int64_t n);

/* "f32[1024, 640]" into buf; returns buf. */
const char *gm_tensor_describe(const gm_tensor *t, char *buf, size_t cap);

void gm_tensor_set_name(gm_tensor *t, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* GM_TENSOR_H */
