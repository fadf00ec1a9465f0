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
 * Ownership: the table is static. Errors: its probe (gm_cuda_probe, runtime.cu) fills `why` with
 * the CUDA runtime's own reason when it finds no device (no driver, no GPU, a driver older than
 * the runtime).
 */
#include "common.cuh"
#include "gm_cuda.h"

extern "C" {
#include "gm_backend.h"
}

static int mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
    if (cudaSetDevice(device) != cudaSuccess) return -1;
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : -1;
}

static const gm_cuda_module module = {GM_CUDA_MODULE_ABI, gm_cuda_probe, mem_info, gm_backend_cuda_new, gm_cuda_peak_bytes};

extern "C" __attribute__((visibility("default"))) const gm_cuda_module *gm_cuda_module_entry(void) {
    return &module;
}
