/*
 * table.c - the CPU kernel table, generated from kernels.def.
 */
#include "kernels.h"

const gm_kernel_table gm_kernels_cpu = {
#define GM_KERNEL(name, params, args) .name = gm_k_##name##_cpu,
#include "kernels.def"
#undef GM_KERNEL
};
