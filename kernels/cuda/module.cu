/*
 * module.cu - the entry point of the CUDA module (libgemmarun_cuda.so), which `gemmarun` loads
 * at run time when a run asks for device = "cuda" (gm_backend_open, core/backend/gm_backend.c).
 *
 * Why a module and not a link: linking cuBLAS and the CUDA runtime into the program costs every
 * CPU run ~150 MiB of resident memory at start-up, and a program linked against libcudart does not
 * start at all on a machine without it. The module is the same objects as gm_kernels_cuda (the
 * static library the tests link), built position-independent; its references into core/ (the
 * backend base, errors, allocation, logs) resolve against the program, which exports its symbols.
 *
 * Ownership: the table is static. Errors: probe() fills `why` with the CUDA runtime's own reason
 * when it finds no device (no driver, no GPU, a driver older than the runtime).
 */
#include "common.cuh"
#include "gm_cuda.h"

#include <stdio.h>

extern "C" {
#include "gm_backend.h"
}

static int probe(char *why, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, cap, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        return 0;
    }
    if (n == 0) snprintf(why, cap, "the CUDA runtime reports no device");
    return n;
}

static int mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
    if (cudaSetDevice(device) != cudaSuccess) return -1;
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : -1;
}

static const char *device_name(int device) {
    static char name[320];
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "unknown";
    snprintf(name, sizeof name, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / 1073741824.0);
    return name;
}

static const gm_cuda_module module = {GM_CUDA_MODULE_ABI, probe, device_name, mem_info, gm_backend_cuda_new,
                                      gm_cuda_peak_bytes};

extern "C" __attribute__((visibility("default"))) const gm_cuda_module *gm_cuda_module_entry(void) {
    return &module;
}
