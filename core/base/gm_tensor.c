/*
 * gm_tensor.c - view construction and queries.
 */
#include "gm_tensor.h"

#include "gm_status.h"

#include <stdio.h>
#include <string.h>

gm_tensor gm_tensor_make(gm_dtype dtype, gm_device device, int ndim, const int64_t *shape,
                         void *data) {
    GM_ASSERT(ndim >= 1 && ndim <= GM_MAX_DIMS);
    gm_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.device = device;
    t.ndim = ndim;
    t.data = data;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = s;
        s *= shape[i];
    }
    return t;
}

gm_tensor gm_tensor_1d(gm_dtype dtype, int64_t n, void *data) {
    return gm_tensor_make(dtype, GM_DEVICE_CPU, 1, &n, data);
}

gm_tensor gm_tensor_2d(gm_dtype dtype, int64_t rows, int64_t cols, void *data) {
    int64_t sh[2] = {rows, cols};
    return gm_tensor_make(dtype, GM_DEVICE_CPU, 2, sh, data);
}

int64_t gm_tensor_numel(const gm_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t gm_tensor_nbytes(const gm_tensor *t) {
    return gm_dtype_row_bytes(t->dtype, gm_tensor_numel(t));
}

bool gm_tensor_is_contiguous(const gm_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

void *gm_tensor_row(const gm_tensor *t, int64_t r) {
    GM_ASSERT(t->ndim == 2 && r >= 0 && r < t->shape[0]);
    return (char *)t->data + gm_dtype_row_bytes(t->dtype, t->stride[0]) * (size_t)r;
}

gm_tensor gm_tensor_rows(const gm_tensor *t, int64_t r0, int64_t n) {
    GM_ASSERT(t->ndim == 2 && r0 >= 0 && n >= 0 && r0 + n <= t->shape[0]);
    gm_tensor v = *t;
    v.shape[0] = n;
    v.data = (char *)t->data + gm_dtype_row_bytes(t->dtype, t->stride[0]) * (size_t)r0;
    return v;
}

const char *gm_tensor_describe(const gm_tensor *t, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s[", gm_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "]");
    return buf;
}

void gm_tensor_set_name(gm_tensor *t, const char *name) {
    snprintf(t->name, sizeof t->name, "%s", name);
}
