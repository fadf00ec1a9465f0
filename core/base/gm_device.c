/*
 * gm_device.c - host/CUDA memory dispatch. CUDA functions come from the table the CUDA library
 * registers (gm_device_register_cuda); without it CUDA requests fail cleanly.
 */
#include "gm_device.h"

#include "gm_alloc.h"

#include <string.h>

static const gm_device_cuda_ops *cuda;

void gm_device_register_cuda(const gm_device_cuda_ops *ops) { cuda = ops; }

const char *gm_device_name(gm_device d) { return d == GM_DEVICE_CUDA ? "cuda" : "cpu"; }

bool gm_device_cuda_available(void) { return cuda && cuda->device_count() > 0; }

static gm_status no_cuda(gm_error *err) {
    return gm_error_set(err, GM_ERR_DEVICE, "no CUDA device: %s\n  hint: use device = \"cpu\"",
                        cuda ? "the CUDA library found no GPU"
                             : "this program was built without the CUDA kernels (nvcc missing at configure time, or a "
                               "CPU-only program)");
}

gm_status gm_device_malloc(gm_device d, size_t bytes, void **out, gm_error *err) {
    *out = NULL;
    if (d == GM_DEVICE_CPU) {
        *out = gm_malloc(bytes);
        if (!*out)
            return gm_error_set(err, GM_ERR_NOMEM, "out of memory: cannot allocate %zu bytes (%.1f MiB) of "
                                "host memory", bytes, (double)bytes / 1048576.0);
        return GM_OK;
    }
    if (!gm_device_cuda_available()) return no_cuda(err);
    *out = cuda->malloc(bytes);
    if (!*out)
        return gm_error_set(err, GM_ERR_NOMEM, "out of CUDA memory: cannot allocate %zu bytes (%.1f MiB)", bytes,
                            (double)bytes / 1048576.0);
    return GM_OK;
}

void gm_device_free(gm_device d, void *p) {
    if (!p) return;
    if (d == GM_DEVICE_CPU) gm_free(p);
    else if (cuda) cuda->free(p);
}

gm_status gm_device_copy(gm_device dst_dev, void *dst, gm_device src_dev, const void *src, size_t bytes,
                         gm_error *err) {
    if (dst_dev == GM_DEVICE_CPU && src_dev == GM_DEVICE_CPU) {
        memmove(dst, src, bytes);
        return GM_OK;
    }
    if (!cuda) return no_cuda(err);
    if (cuda->memcpy(dst, dst_dev == GM_DEVICE_CUDA, src, src_dev == GM_DEVICE_CUDA, bytes) != 0)
        return gm_error_set(err, GM_ERR_DEVICE, "CUDA copy of %zu bytes failed", bytes);
    return GM_OK;
}

size_t gm_device_peak_bytes(gm_device d) {
    if (d == GM_DEVICE_CPU) return (size_t)gm_process_peak_rss();
    return cuda ? cuda->peak_bytes() : 0;
}
