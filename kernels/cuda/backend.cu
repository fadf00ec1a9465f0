/*
 * backend.cu - the CUDA backend (core/backend/gm_backend.h): the CUDA kernel table on device
 * memory, with its own stream, asynchronous copies on that stream, and the sticky error.
 *
 * Referencing gm_kernels_cuda here (a program that links the CUDA backend links the table) makes
 * a kernel without its CUDA twin a link error. Errors: every CUDA call goes through
 * GM_CUDA_CHECK, which records the first failure; gm_backend_status synchronizes the stream and
 * turns a recorded failure (or a failed synchronization) into the backend's sticky
 * GM_ERR_DEVICE, so a device fault stops a training run at the next step boundary.
 */
#include "common.cuh"
#include "gm_cuda.h"

#include <stdio.h>

extern "C" {
#include "gm_alloc.h"
#include "gm_backend.h"
}

static void *cuda_alloc(gm_backend *be, size_t bytes, gm_error *err) {
    void *p = gm_cuda_malloc(bytes);
    if (!p) {
        gm_error_set(err, GM_ERR_NOMEM, "cannot allocate %.1f MiB of CUDA memory", (double)bytes / 1048576.0);
        return NULL;
    }
    /* zero-filled as every backend's blocks (gm_arena_commit) */
    GM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, (cudaStream_t)be->stream));
    return p;
}

static void cuda_free(gm_backend *be, void *p) {
    GM_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)be->stream));
    gm_cuda_free(p);
}

/* Host buffers are pageable: the copies below complete before returning for uploads of small
 * staging buffers, and downloads synchronize, so the host can reuse or read them at once. */
static void cuda_upload(gm_backend *be, void *dst, const void *src, size_t bytes) {
    GM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)be->stream));
    GM_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)be->stream));
}

static void cuda_download(gm_backend *be, void *dst, const void *src, size_t bytes) {
    GM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)be->stream));
    GM_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)be->stream));
}

static void cuda_copy(gm_backend *be, void *dst, const void *src, size_t bytes) {
    GM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)be->stream));
}

static void cuda_memset(gm_backend *be, void *dst, int value, size_t bytes) {
    GM_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)be->stream));
}

static void cuda_synchronize(gm_backend *be) {
    GM_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)be->stream));
    GM_CUDA_CHECK(cudaGetLastError()); /* a failed kernel launch */
    char msg[512];
    if (gm_cuda_take_error(msg, sizeof msg)) gm_backend_set_error(be, GM_ERR_DEVICE, "%s", msg);
}

static void cuda_destroy(gm_backend *be) {
    if (be->stream) {
        cudaStreamSynchronize((cudaStream_t)be->stream);
        cudaStreamDestroy((cudaStream_t)be->stream);
    }
}

extern "C" gm_status gm_backend_cuda_new(int device, gm_backend **out, gm_error *err) {
    *out = NULL;
    int n = gm_cuda_device_count();
    if (device < 0 || device >= n)
        return gm_error_set(err, GM_ERR_DEVICE, "no CUDA device %d (this machine has %d)\n  hint: use device = \"cpu\"",
                            device, n);
    if (cudaSetDevice(device) != cudaSuccess)
        return gm_error_set(err, GM_ERR_DEVICE, "cannot select CUDA device %d", device);
    gm_backend *be = (gm_backend *)gm_calloc(1, sizeof *be);
    if (!be) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    cudaStream_t s = NULL;
    if (cudaStreamCreate(&s) != cudaSuccess) {
        gm_free(be);
        return gm_error_set(err, GM_ERR_DEVICE, "cannot create a CUDA stream on device %d", device);
    }
    gm_backend_init(be, "cuda", GM_DEVICE_CUDA, 1);
    be->host_visible = false;
    be->k = &gm_kernels_cuda;
    be->stream = s;
    be->blas = gm_cuda_blas(s);
    be->bf16_gemm = true; /* as PEFT on a GPU; compute = "f32" turns it off */
    be->iface.alloc = cuda_alloc;
    be->iface.free = cuda_free;
    be->iface.upload = cuda_upload;
    be->iface.download = cuda_download;
    be->iface.copy = cuda_copy;
    be->iface.memset = cuda_memset;
    be->iface.synchronize = cuda_synchronize;
    be->iface.destroy = cuda_destroy;
    *out = be;
    return GM_OK;
}
