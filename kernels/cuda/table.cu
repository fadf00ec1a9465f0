/*
 * table.cu - the CUDA kernel table, generated from kernels.def (a missing twin fails to link).
 */
#include "common.cuh"

extern "C" const gm_kernel_table gm_kernels_cuda = {
#define GM_KERNEL(name, params, args) gm_k_##name##_cuda,
#include "kernels.def"
#undef GM_KERNEL
};
