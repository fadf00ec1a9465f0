/*
 * gm_device.c - host/CUDA memory dispatch; the only file of core/base that knows CUDA exists.
 */
#include "gm_device.h"

#include "gm_alloc.h"

#include <string.h>

#ifdef GM_HAVE_CUDA
#include "../../kernels/cuda/gm_cuda.h"
#endif

const char *gm_device_name(gm_device d) { return d == GM_DEVICE_CUDA ? "cuda" : "cpu"; }

bool gm_device_cuda_available(void) {
#ifdef GM_HAVE_CUDA
    return gm_cuda_device_count() > 0;
#else
    return false;
#endif
}

static gm_status no_cuda(gm_error *err) {
    return gm_error_set(err, GM_ERR_DEVICE,
                        "no CUDA device: this build %s\n  hint: use device = \"cpu\"",
#ifdef GM_HAVE_CUDA
                        "has CUDA but found no GPU"
#else
                        "was compiled without CUDA (nvcc was not found at configure time)"
#endif
    );
}

gm_status gm_device_malloc(gm_device d, size_t bytes, void **out, gm_error *err) {
    *out = NULL;
    if (d == GM_DEVICE_CPU) {
        *out = gm_malloc(bytes);
        if (!*out)
            return gm_error_set(err, GM_ERR_NOMEM, "cannot allocate %.1f MiB of host memory",
                                (double)bytes / 1048576.0);
        return GM_OK;
    }
#ifdef GM_HAVE_CUDA
    if (gm_cuda_device_count() <= 0) return no_cuda(err);
    *out = gm_cuda_malloc(bytes);
    if (!*out)
        return gm_error_set(err, GM_ERR_NOMEM, "cannot allocate %.1f MiB of CUDA memory",
                            (double)bytes / 1048576.0);
    return GM_OK;
#else
    return no_cuda(err);
#endif
}

void gm_device_free(gm_device d, void *p) {
    if (!p) return;
    if (d == GM_DEVICE_CPU) {
        gm_free(p);
        return;
    }
#ifdef GM_HAVE_CUDA
    gm_cuda_free(p);
#endif
}

gm_status gm_device_copy(gm_device dst_dev, void *dst, gm_device src_dev, const void *src,
                         size_t bytes, gm_error *err) {
    if (dst_dev == GM_DEVICE_CPU && src_dev == GM_DEVICE_CPU) {
        memmove(dst, src, bytes);
        return GM_OK;
    }
#ifdef GM_HAVE_CUDA
    if (gm_cuda_memcpy(dst, dst_dev == GM_DEVICE_CUDA, src, src_dev == GM_DEVICE_CUDA, bytes) != 0)
        return gm_error_set(err, GM_ERR_DEVICE, "CUDA copy of %zu bytes failed", bytes);
    return GM_OK;
#else
    return no_cuda(err);
#endif
}

size_t gm_device_peak_bytes(gm_device d) {
    if (d == GM_DEVICE_CPU) return (size_t)gm_process_peak_rss();
#ifdef GM_HAVE_CUDA
    return gm_cuda_peak_bytes();
#else
    return 0;
#endif
}
