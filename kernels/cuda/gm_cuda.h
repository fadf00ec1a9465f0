/*
 * gm_cuda.h - the C-callable CUDA runtime layer: devices, memory, streams, cuBLAS.
 *
 * Everything CUDA-specific that core/ needs goes through these extern "C" functions, so core/
 * stays plain C and the CPU-only build never sees a CUDA header.
 *
 * Ownership: gm_cuda_malloc'd blocks are freed with gm_cuda_free. The cuBLAS handle is created
 * on first use and lives until gm_cuda_shutdown.
 * Errors: functions return 0 / non-NULL on success; failures print the CUDA error string once
 * through gm_log and return -1 / NULL (callers turn that into GM_ERR_DEVICE).
 */
#ifndef GM_CUDA_H
#define GM_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int gm_cuda_device_count(void);
/* The devices there are; 0 with the CUDA runtime's reason in why (why may be NULL). */
int gm_cuda_probe(char *why, size_t cap);
void *gm_cuda_malloc(size_t bytes);
void gm_cuda_free(void *p);
/* dst_dev / src_dev: nonzero when that pointer is device memory. */
int gm_cuda_memcpy(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes);
int gm_cuda_sync(void);
size_t gm_cuda_peak_bytes(void);
void gm_cuda_shutdown(void);
/* Records a failure (the first one since the last gm_cuda_take_error wins); gm_cuda_check and
 * the cuBLAS wrappers call it. */
void gm_cuda_record_error(const char *msg);
/* Copies the recorded failure into buf and clears it; returns 1 if there was one. */
int gm_cuda_take_error(char *buf, size_t cap);
/* Name of the device 0 and its compute capability, for logs. */
const char *gm_cuda_device_name(void);

#ifdef __cplusplus
}
#endif
#endif /* GM_CUDA_H */
