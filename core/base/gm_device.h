/*
 * gm_device.h - where memory lives (host or CUDA) and how to move it.
 *
 * CUDA memory is reached through a table of functions that the CUDA library (kernels/cuda,
 * runtime.cu) registers when it is linked into a program. A program without it - the CPU-only
 * build, or `gemmarun` itself, which does not link the CUDA libraries while the decoder runs on
 * the CPU (they would cost ~150 MiB of resident memory for nothing) - gets GM_ERR_DEVICE with a
 * hint when it asks for GM_DEVICE_CUDA; it never crashes.
 *
 * Ownership: gm_device_malloc returns a block the caller frees with gm_device_free on the same
 * device. Errors: GM_ERR_NOMEM / GM_ERR_DEVICE with the size in the message.
 */
#ifndef GM_DEVICE_H
#define GM_DEVICE_H

#include "gm_arena.h"
#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

const char *gm_device_name(gm_device d);

/* CUDA memory functions, registered by the CUDA library (kernels/cuda/runtime.cu). */
typedef struct gm_device_cuda_ops {
    int (*device_count)(void);
    void *(*malloc)(size_t bytes);
    void (*free)(void *p);
    int (*memcpy)(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes);
    size_t (*peak_bytes)(void);
} gm_device_cuda_ops;
void gm_device_register_cuda(const gm_device_cuda_ops *ops);

/* True when this build has CUDA and a device is present. */
bool gm_device_cuda_available(void);

gm_status gm_device_malloc(gm_device d, size_t bytes, void **out, gm_error *err);
void gm_device_free(gm_device d, void *p);

/* Copies `bytes` between any two devices (host<->device, device<->device). */
gm_status gm_device_copy(gm_device dst_dev, void *dst, gm_device src_dev, const void *src,
                         size_t bytes, gm_error *err);

/* Device memory high-water mark since start (CUDA: bytes allocated through us; CPU: peak RSS). */
size_t gm_device_peak_bytes(gm_device d);

#ifdef __cplusplus
}
#endif
#endif /* GM_DEVICE_H */
