/*
 * gm_backend.h - where a model runs: a kernel table plus the memory it computes on.
 *
 * A backend is the one object model code talks to for compute and memory, in the spirit of
 * ggml's ggml-backend.h: the kernel table (kernels/kernels.def), allocation of its memory,
 * host <-> backend copies, memset, synchronize, the execution context (threads, stream, BLAS
 * handle) and a sticky error. Model code (core/arch, core/train, core/model) never dereferences
 * backend memory from the host: it calls kernels on it, and moves data across with
 * gm_backend_upload / gm_backend_download. Memory that a backend lets the host read in place
 * (gm_backend_host_ptr, e.g. the CPU backend) may be used without a copy by I/O code
 * (checkpoints, results), as ggml's buffer_is_host does; everything else goes through the copies.
 *
 * Three backends exist:
 *   - the CPU backend (gm_backend_cpu_new): host memory, the CPU kernels, OpenMP threads;
 *   - the strict backend (gm_backend_strict_new): the CPU kernels on memory the host cannot
 *     touch between kernel calls (PROT_NONE pages, opened only inside kernels and the copy
 *     functions), so any stray host access by model code crashes at once - a test device;
 *   - the CUDA backend (gm_backend_cuda_new, kernels/cuda/backend.cu, CUDA builds only).
 *
 * Arenas (gm_arena.h) are laid out as usual and committed on a backend with gm_backend_arena;
 * the block comes zero-filled from the backend's allocator.
 *
 * Ownership: gm_backend_*_new returns an owned backend that the caller frees with
 * gm_backend_free after every arena committed on it has been freed. The kernel table is static.
 * Errors: allocation returns GM_ERR_NOMEM / GM_ERR_DEVICE with the size. Copies, memset and kernel
 * launches cannot return an error at the call (CUDA runs them asynchronously): a failure is
 * recorded as the backend's sticky error, and gm_backend_status (which synchronizes) turns it
 * into a gm_status with the message; it stays set until gm_backend_clear_error, so a broken
 * device stops a run instead of being logged and ignored.
 * Thread-safety: one backend per thread of control.
 */
#ifndef GM_BACKEND_H
#define GM_BACKEND_H

#include "gm_arena.h"
#include "gm_status.h"
#include "kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_backend gm_backend;

/* The functions a backend implements (all receive the backend itself). */
typedef struct gm_backend_iface {
    /* zero-filled block of `bytes`, or NULL (then *err explains) */
    void *(*alloc)(gm_backend *be, size_t bytes, gm_error *err);
    void (*free)(gm_backend *be, void *p);
    void (*upload)(gm_backend *be, void *dst, const void *src, size_t bytes);   /* host -> backend */
    void (*download)(gm_backend *be, void *dst, const void *src, size_t bytes); /* backend -> host */
    void (*copy)(gm_backend *be, void *dst, const void *src, size_t bytes);     /* backend -> backend */
    void (*memset)(gm_backend *be, void *dst, int value, size_t bytes);
    void (*synchronize)(gm_backend *be);
    void (*destroy)(gm_backend *be);
} gm_backend_iface;

struct gm_backend {
    const char *name;             /* "cpu", "strict", "cuda" */
    gm_device device;             /* where its memory is (the strict backend: GM_DEVICE_CPU) */
    bool host_visible;            /* the host may read and write its memory in place (CPU) */
    const gm_kernel_table *k;     /* the kernels, called with a gm_kctx from gm_backend_kctx */
    int n_threads;                /* CPU threads for kernels and BLAS */
    void *stream;                 /* cudaStream_t (CUDA), NULL otherwise */
    void *blas;                   /* cublasHandle_t bound to the stream (CUDA), NULL otherwise */
    bool bf16_gemm;               /* kernels' GEMMs on non-f32 weights in bf16 (gm_kctx.bf16_gemm; CUDA
                                     only: its default is on, the training option compute = "f32"
                                     and parity tests turn it off) */
    gm_backend_iface iface;
    gm_arena_mem mem;             /* the allocator gm_backend_arena gives arenas */
    gm_status error;              /* sticky: GM_OK until something failed */
    char error_msg[512];
    void *impl;                   /* backend-private state */
};

/* ---- create / destroy ------------------------------------------------------------------- */

/* The CPU backend with n_threads threads (< 1: 2). Never fails for lack of a device. */
gm_status gm_backend_cpu_new(int n_threads, gm_backend **out, gm_error *err);

/* The strict checking backend: CPU kernels on memory that is PROT_NONE between kernel calls
 * (see the file comment). Slow (two mprotect calls per live block per kernel); for tests. */
gm_status gm_backend_strict_new(int n_threads, gm_backend **out, gm_error *err);

#ifdef GM_HAVE_CUDA
/* The CUDA backend on device `device` (kernels/cuda/backend.cu): its own stream and cuBLAS
 * handle, cudaMalloc'd memory. GM_ERR_DEVICE when there is no such device. */
gm_status gm_backend_cuda_new(int device, gm_backend **out, gm_error *err);
#endif

/* The backend for a device by name: "cpu" (n_threads threads), "cuda" or "cuda:N" (GPU N; the
 * CUDA module is loaded on first use, see gm_cuda_module). Errors (GM_ERR_INVALID for an unknown
 * name; GM_ERR_UNSUPPORTED for a build without CUDA; GM_ERR_DEVICE when the module cannot be
 * loaded or finds no GPU) name the device, the reason and what to do. */
gm_status gm_backend_open(const char *device, int n_threads, gm_backend **out, gm_error *err);

/* Whether gm_backend_open(device) would find its device, without creating a context: GM_OK for
 * "cpu" and for a GPU that the CUDA module sees; gm_backend_open's errors otherwise. */
gm_status gm_backend_probe(const char *device, gm_error *err);

/* Checks a device name without opening it: GM_OK for "cpu", "cuda", "cuda:N" (N >= 0); *index
 * (may be NULL) receives N (0 for "cuda", -1 for "cpu"). */
gm_status gm_backend_parse_device(const char *device, int *index, gm_error *err);

/* Memory of the device `device` names: *peak the high-water mark of what gemmarun allocated there
 * (gm_cuda_peak_bytes), *used its total less its free memory (cudaMemGetInfo: every process and
 * context on it), *total its size. "cpu": GM_ERR_INVALID (use gm_process_peak_rss). Errors as
 * gm_backend_probe's. */
gm_status gm_backend_device_memory(const char *device, size_t *peak, size_t *used, size_t *total, gm_error *err);

/* ---- the CUDA module ---------------------------------------------------------------------- */

/* `gemmarun` does not link CUDA: kernels/cuda is also built as a module, libgemmarun_cuda.so
 * beside the executable (or the file named by $GEMMARUN_CUDA_MODULE), loaded with dlopen the
 * first time a run asks for device "cuda" (kernels/cuda/module.cu says why). Its one exported
 * symbol, gm_cuda_module_entry, returns this table. */
#define GM_CUDA_MODULE_ABI 1

/* The CUDA backend hands cuBLAS a workspace of its own (cublasSetWorkspace), so it is part of the
 * allocator's high-water mark and of the plan: 32 MiB, the size the cuBLAS documentation
 * recommends for Hopper (cublasSetWorkspace; 4 MiB for earlier GPUs - the larger one for all). */
#define GM_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
/* ... and converts f32 activations to bf16 for its bf16 GEMMs (gm_kctx.bf16_gemm) in a staging
 * buffer of its own, allocated with the cuBLAS handle and planned like the workspace: 32 MiB
 * (16 Mi elements: a 16384 x 1024 activation at once, larger ones in row chunks). */
#define GM_CUDA_BF16_STAGING_BYTES ((size_t)32 << 20)
/* What the CUDA backend's libraries hold beside the arenas: both of the above. */
#define GM_CUDA_LIBRARY_BYTES (GM_CUBLAS_WORKSPACE_BYTES + GM_CUDA_BF16_STAGING_BYTES)
typedef struct gm_cuda_module {
    int abi;                                    /* GM_CUDA_MODULE_ABI of the module's build */
    int (*probe)(char *why, size_t cap);        /* devices; 0 with the runtime's reason in why */
    int (*mem_info)(int device, size_t *free_bytes, size_t *total_bytes); /* cudaMemGetInfo; 0 ok */
    gm_status (*backend_new)(int device, gm_backend **out, gm_error *err);
    size_t (*peak_bytes)(void);                 /* high-water mark of cudaMalloc'd bytes */
} gm_cuda_module;

/* The loaded CUDA module, loading it on first call (not thread-safe: call from the main thread).
 * NULL with the reason in err: GM_ERR_UNSUPPORTED when the build has no module (built without
 * the CUDA toolkit), GM_ERR_DEVICE when dlopen fails (the message has dlerror's text, e.g. a
 * missing libcudart) or its ABI differs. The module stays loaded until the process exits. */
const gm_cuda_module *gm_cuda_module_get(gm_error *err);

/* For backend implementations: fills the common fields of a zeroed backend (name, device,
 * threads, the arena allocator that calls iface.alloc / iface.free, no error). */
void gm_backend_init(gm_backend *be, const char *name, gm_device device, int n_threads);

/* Frees the backend (NULL is a no-op). Arenas committed on it must be freed first. */
void gm_backend_free(gm_backend *be);

/* ---- memory ----------------------------------------------------------------------------- */

/* Starts a measuring arena whose commit allocates from the backend (gm_arena.h protocol). */
void gm_backend_arena(gm_backend *be, gm_arena *a, const char *name);

/* host -> backend, backend -> host, backend -> backend copies of `bytes` (0 is a no-op). */
void gm_backend_upload(gm_backend *be, void *dst, const void *src, size_t bytes);
void gm_backend_download(gm_backend *be, void *dst, const void *src, size_t bytes);
void gm_backend_copy(gm_backend *be, void *dst, const void *src, size_t bytes);
void gm_backend_memset(gm_backend *be, void *dst, int value, size_t bytes);

/* The host address of backend memory p when the host may read and write it in place (CPU
 * backend), else NULL (strict, CUDA): callers then stage through upload/download. */
static inline void *gm_backend_host_ptr(const gm_backend *be, const void *p) {
    return be->host_visible ? (void *)(uintptr_t)p : NULL;
}

/* ---- execution and errors --------------------------------------------------------------- */

/* The kernel context of this backend with the caller's scratch (floats, backend memory). */
gm_kctx gm_backend_kctx(const gm_backend *be, float *scratch, size_t scratch_floats);

/* Waits for queued work, then returns the sticky error (GM_OK if none) with its message. */
gm_status gm_backend_status(gm_backend *be, gm_error *err);

/* Records a failure as the sticky error (the first one wins). */
void gm_backend_set_error(gm_backend *be, gm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void gm_backend_clear_error(gm_backend *be);

#ifdef __cplusplus
}
#endif
#endif /* GM_BACKEND_H */
