/*
 * runtime.cu - CUDA devices, memory, copies, peak accounting, error reporting.
 */
#include "common.cuh"
#include "gm_cuda.h"

#include <atomic>
#include <stdio.h>

extern "C" {
#include "gm_device.h"
#include "gm_log.h"
}

static std::atomic<size_t> live_bytes{0}, peak_bytes{0};

/* The first failure since it was last taken: the CUDA backend turns it into its sticky error at
 * the next synchronization (core/backend/gm_backend.h), so a device error stops the run. */
static char first_error[512];
static std::atomic<int> have_error{0};

extern "C" void gm_cuda_record_error(const char *msg) {
    int expected = 0;
    if (have_error.compare_exchange_strong(expected, 1)) snprintf(first_error, sizeof first_error, "%s", msg);
}

extern "C" int gm_cuda_take_error(char *buf, size_t cap) {
    if (!have_error.load()) return 0;
    snprintf(buf, cap, "%s", first_error);
    have_error.store(0);
    return 1;
}

void gm_cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    char msg[512];
    snprintf(msg, sizeof msg, "CUDA error %s at %s:%d (%s)", cudaGetErrorString(e), file, line, what);
    gm_log(GM_LOG_ERROR, "%s", msg);
    gm_cuda_record_error(msg);
}

extern "C" int gm_cuda_probe(char *why, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) snprintf(why, cap, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError(); /* clear the "no device" error */
        return 0;
    }
    if (n == 0 && why) snprintf(why, cap, "the CUDA runtime reports no device");
    return n;
}

extern "C" int gm_cuda_device_count(void) { return gm_cuda_probe(NULL, 0); }

extern "C" const char *gm_cuda_device_name(void) {
    static char name[320];
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "none";
    snprintf(name, sizeof name, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / 1073741824.0);
    return name;
}

/* A size header in front of each block keeps live/peak byte counts exact. */
#define HDR 256

extern "C" void *gm_cuda_malloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes + HDR);
    if (e != cudaSuccess) {
        GM_CUDA_CHECK(e);
        return NULL;
    }
    size_t hdr[1] = {bytes};
    GM_CUDA_CHECK(cudaMemcpy(p, hdr, sizeof hdr, cudaMemcpyHostToDevice));
    size_t now = live_bytes.fetch_add(bytes) + bytes, pk = peak_bytes.load();
    while (now > pk && !peak_bytes.compare_exchange_weak(pk, now)) {}
    return (char *)p + HDR;
}

extern "C" void gm_cuda_free(void *p) {
    if (!p) return;
    char *raw = (char *)p - HDR;
    size_t hdr[1] = {0};
    GM_CUDA_CHECK(cudaMemcpy(hdr, raw, sizeof hdr, cudaMemcpyDeviceToHost));
    live_bytes.fetch_sub(hdr[0]);
    GM_CUDA_CHECK(cudaFree(raw));
}

extern "C" int gm_cuda_memcpy(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes) {
    cudaMemcpyKind k = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                               : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    cudaError_t e = cudaMemcpy(dst, src, bytes, k);
    GM_CUDA_CHECK(e);
    return e == cudaSuccess ? 0 : -1;
}

extern "C" int gm_cuda_sync(void) {
    cudaError_t e = cudaDeviceSynchronize();
    GM_CUDA_CHECK(e);
    return e == cudaSuccess ? 0 : -1;
}

extern "C" size_t gm_cuda_peak_bytes(void) { return peak_bytes.load(); }

void gm_cuda_blas_shutdown(void);
extern "C" void gm_cuda_shutdown(void) { gm_cuda_blas_shutdown(); }

/* Registers these functions with core/base/gm_device.c when the CUDA library is linked. */
static const gm_device_cuda_ops cuda_ops = {gm_cuda_device_count, gm_cuda_malloc, gm_cuda_free, gm_cuda_memcpy,
                                            gm_cuda_peak_bytes};
__attribute__((constructor)) static void register_cuda(void) { gm_device_register_cuda(&cuda_ops); }
