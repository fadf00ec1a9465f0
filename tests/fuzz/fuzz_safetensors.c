/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader (the 8-byte header length, the
 * JSON header through cJSON, dtypes, shapes and data offsets).
 *
 * Feeds each input to gm_safetensors_open_memory; when it parses, every tensor's byte range must
 * lie inside the image and match its dtype and shape, and every tensor must be found by its
 * name. Invariants that must hold for any accepted file trap. Without clang the same function is
 * driven over the seed corpus by fuzz_replay.c.
 */
#include "gm_safetensors.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gm_error err;
    gm_safetensors *st = NULL;
    if (gm_safetensors_open_memory(data, size, "fuzz", &st, &err) != GM_OK) {
        if (st != NULL || err.msg[0] == '\0') __builtin_trap(); /* failures leave a message */
        return 0;
    }
    for (int64_t i = 0; i < gm_safetensors_n_tensors(st); i++) {
        const gm_st_tensor *t = gm_safetensors_tensor_at(st, i);
        const uint8_t *p = t->data;
        if (t->ndim < 0 || t->ndim > 8) __builtin_trap();
        uint64_t elems = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) __builtin_trap();
            elems *= (uint64_t)t->shape[d];
        }
        if (t->nbytes != elems * (uint64_t)gm_dtype_get(t->dtype)->type_size) __builtin_trap(); /* shape x dtype */
        if (t->nbytes) {
            if (p < data || p + t->nbytes > data + size) __builtin_trap(); /* inside the image */
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
        if (gm_safetensors_find(st, t->name) != t) __builtin_trap(); /* names are unique */
    }
    (void)gm_safetensors_metadata(st, "format");
    gm_safetensors_free(st);
    return 0;
}
