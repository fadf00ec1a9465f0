/*
 * gm_backend.c - the backend object, the CPU backend and the strict checking backend.
 *
 * The CPU backend is host memory from gm_malloc (so the counting / fault-injecting allocator of
 * gm_alloc.h sees it) with the CPU kernel table. The strict backend runs the same kernels on
 * memory the host cannot touch between calls: every block comes from mmap and is PROT_NONE
 * except while a kernel or a copy function runs (the kernel table is a set of wrappers,
 * generated from kernels.def, that open every live block, call the CPU kernel, and close them
 * again). Model code that dereferences backend memory from the host - a memcpy into an
 * activation, a loop over the logits, a kernel writing a host double - faults at once, which
 * is how tests/unit/test_backend.c proves the model code goes through the backend.
 *
 * gm_backend_open picks a backend by device name; for "cuda" it loads the CUDA module
 * (libgemmarun_cuda.so, kernels/cuda/module.cu) with dlopen, so the program itself never links
 * the CUDA runtime.
 */
#define _GNU_SOURCE
#include "gm_backend.h"

#include "gm_alloc.h"
#include "gm_device.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- generic ------------------------------------------------------------------------------ */

static void *mem_alloc(void *user, size_t bytes, gm_error *err) { return ((gm_backend *)user)->iface.alloc(user, bytes, err); }
static void mem_free(void *user, void *p) { ((gm_backend *)user)->iface.free(user, p); }

void gm_backend_init(gm_backend *be, const char *name, gm_device device, int n_threads) {
    be->name = name;
    be->device = device;
    be->n_threads = n_threads > 0 ? n_threads : 2;
    be->mem.alloc = mem_alloc;
    be->mem.free = mem_free;
    be->mem.user = be;
    be->error = GM_OK;
}

void gm_backend_free(gm_backend *be) {
    if (!be) return;
    if (be->iface.destroy) be->iface.destroy(be);
    gm_free(be);
}

void gm_backend_arena(gm_backend *be, gm_arena *a, const char *name) { gm_arena_init_mem(a, name, be->device, &be->mem); }

void gm_backend_upload(gm_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) be->iface.upload(be, dst, src, bytes);
}

void gm_backend_download(gm_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) be->iface.download(be, dst, src, bytes);
}

void gm_backend_copy(gm_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) be->iface.copy(be, dst, src, bytes);
}

void gm_backend_memset(gm_backend *be, void *dst, int value, size_t bytes) {
    if (bytes) be->iface.memset(be, dst, value, bytes);
}

gm_kctx gm_backend_kctx(const gm_backend *be, float *scratch, size_t scratch_floats) {
    gm_kctx c = {.n_threads = be->n_threads, .stream = be->stream, .scratch = scratch,
                 .scratch_floats = scratch_floats, .blas = be->blas, .bf16_gemm = be->bf16_gemm};
    return c;
}

void gm_backend_set_error(gm_backend *be, gm_status code, const char *fmt, ...) {
    if (be->error != GM_OK) return; /* the first failure is the cause; later ones follow from it */
    be->error = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(be->error_msg, sizeof be->error_msg, fmt, ap);
    va_end(ap);
}

void gm_backend_clear_error(gm_backend *be) {
    be->error = GM_OK;
    be->error_msg[0] = '\0';
}

gm_status gm_backend_status(gm_backend *be, gm_error *err) {
    if (be->iface.synchronize) be->iface.synchronize(be);
    if (be->error == GM_OK) return GM_OK;
    return gm_error_set(err, be->error, "%s backend: %s", be->name, be->error_msg);
}

/* ---- CPU ---------------------------------------------------------------------------------- */

static void *cpu_alloc(gm_backend *be, size_t bytes, gm_error *err) {
    (void)be;
    void *p = gm_malloc(bytes);
    if (!p) {
        gm_error_set(err, GM_ERR_NOMEM, "out of memory: cannot allocate %zu bytes (%.1f MiB) of host memory", bytes,
                     (double)bytes / 1048576.0);
        return NULL;
    }
    /* touch every page now: the resident memory reaches the plan at once (gm_arena_commit) */
    memset(p, 0, bytes);
    return p;
}

static void cpu_free(gm_backend *be, void *p) {
    (void)be;
    gm_free(p);
}

static void cpu_copy(gm_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}

static void cpu_memset(gm_backend *be, void *dst, int value, size_t bytes) {
    (void)be;
    memset(dst, value, bytes);
}

gm_status gm_backend_cpu_new(int n_threads, gm_backend **out, gm_error *err) {
    *out = NULL;
    gm_backend *be = gm_calloc(1, sizeof *be);
    if (!be) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    gm_backend_init(be, "cpu", GM_DEVICE_CPU, n_threads);
    be->host_visible = true;
    be->k = &gm_kernels_cpu;
    be->iface = (gm_backend_iface){.alloc = cpu_alloc, .free = cpu_free, .upload = cpu_copy, .download = cpu_copy,
                                   .copy = cpu_copy, .memset = cpu_memset, .synchronize = NULL, .destroy = NULL};
    *out = be;
    return GM_OK;
}

/* ---- strict ------------------------------------------------------------------------------- */

/* Live blocks of the strict backend (one process-wide list: the kernel wrappers have no backend
 * argument, only the kernel context). */
#define STRICT_MAX_BLOCKS 256
static struct strict_block {
    void *p;
    size_t bytes; /* mapped length (page multiple) */
} strict_blocks[STRICT_MAX_BLOCKS];
static int strict_open_depth;

static void strict_protect(int prot) {
    for (int i = 0; i < STRICT_MAX_BLOCKS; i++)
        if (strict_blocks[i].p) GM_ASSERT(mprotect(strict_blocks[i].p, strict_blocks[i].bytes, prot) == 0);
}

/* Opens every block for the duration of a kernel or a copy (nested calls keep them open). */
static void strict_open(void) {
    if (strict_open_depth++ == 0) strict_protect(PROT_READ | PROT_WRITE);
}

static void strict_close(void) {
    if (--strict_open_depth == 0) strict_protect(PROT_NONE);
}

static size_t page_round(size_t bytes) {
    size_t pg = 4096;
    return (bytes + pg - 1) / pg * pg;
}

static void *strict_alloc(gm_backend *be, size_t bytes, gm_error *err) {
    (void)be;
    int slot = -1;
    for (int i = 0; i < STRICT_MAX_BLOCKS && slot < 0; i++)
        if (!strict_blocks[i].p) slot = i;
    if (slot < 0) {
        gm_error_set(err, GM_ERR_NOMEM, "strict backend: more than %d live blocks", STRICT_MAX_BLOCKS);
        return NULL;
    }
    size_t len = page_round(bytes ? bytes : 1);
    /* anonymous mappings come zero-filled */
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        gm_error_set(err, GM_ERR_NOMEM, "strict backend: cannot map %.1f MiB", (double)len / 1048576.0);
        return NULL;
    }
    strict_blocks[slot].p = p;
    strict_blocks[slot].bytes = len;
    if (strict_open_depth > 0) GM_ASSERT(mprotect(p, len, PROT_READ | PROT_WRITE) == 0);
    return p;
}

static void strict_free(gm_backend *be, void *p) {
    (void)be;
    for (int i = 0; i < STRICT_MAX_BLOCKS; i++)
        if (strict_blocks[i].p == p) {
            munmap(p, strict_blocks[i].bytes);
            strict_blocks[i].p = NULL;
            return;
        }
    GM_ASSERT(!"strict backend: free of a block it did not allocate");
}

static void strict_copy(gm_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    strict_open();
    memmove(dst, src, bytes);
    strict_close();
}

static void strict_memset(gm_backend *be, void *dst, int value, size_t bytes) {
    (void)be;
    strict_open();
    memset(dst, value, bytes);
    strict_close();
}

/* Every pointer a kernel gets on the strict backend must be memory of it (a live block): the
 * host pointer that a CPU kernel would read anyway is a crash on a GPU. Each argument is checked
 * by type (C11 _Generic): activations and indices, the scratch of the kernel context, and each
 * buffer of a weight view; NULL passes (optional outputs, kv_end). */
static bool strict_owns(const void *p) {
    for (int i = 0; i < STRICT_MAX_BLOCKS; i++)
        if (strict_blocks[i].p && (const char *)p >= (const char *)strict_blocks[i].p &&
            (const char *)p < (const char *)strict_blocks[i].p + strict_blocks[i].bytes)
            return true;
    return false;
}

static void strict_ptr(const char *kernel, const char *arg, const void *p) {
    if (p && !strict_owns(p)) {
        fprintf(stderr, "strict backend: kernel %s got %s = %p, which is not memory of the backend (a host "
                        "pointer would crash on a GPU)\n", kernel, arg, p);
        GM_ASSERT(!"kernel argument outside the backend's memory");
    }
}

static void strict_wview(const char *kernel, const char *arg, const gm_wview *w) {
    strict_ptr(kernel, arg, w->data);
    strict_ptr(kernel, "its absmax_code", w->absmax_code);
    strict_ptr(kernel, "its absmax2", w->absmax2);
    strict_ptr(kernel, "its row_scale", w->row_scale);
}

static void strict_kctx(const char *kernel, const char *arg, const gm_kctx *c) {
    strict_ptr(kernel, "ctx->scratch", c->scratch);
    (void)arg;
}

static void strict_skip(const char *kernel, const char *arg, ...) { (void)kernel, (void)arg; }

#define STRICT_ARG(kernel, a)                                                                \
    _Generic((a), float *: strict_ptr, const float *: strict_ptr, int32_t *: strict_ptr,     \
             const int32_t *: strict_ptr, double *: strict_ptr, const gm_wview *: strict_wview, \
             const gm_kctx *: strict_kctx, default: strict_skip)(kernel, #a, a);
/* STRICT_ARG for each of up to 20 arguments (the longest kernel takes 19) */
#define STRICT_N(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, N, ...) N
#define STRICT_1(k, a) STRICT_ARG(k, a)
#define STRICT_2(k, a, ...) STRICT_ARG(k, a) STRICT_1(k, __VA_ARGS__)
#define STRICT_3(k, a, ...) STRICT_ARG(k, a) STRICT_2(k, __VA_ARGS__)
#define STRICT_4(k, a, ...) STRICT_ARG(k, a) STRICT_3(k, __VA_ARGS__)
#define STRICT_5(k, a, ...) STRICT_ARG(k, a) STRICT_4(k, __VA_ARGS__)
#define STRICT_6(k, a, ...) STRICT_ARG(k, a) STRICT_5(k, __VA_ARGS__)
#define STRICT_7(k, a, ...) STRICT_ARG(k, a) STRICT_6(k, __VA_ARGS__)
#define STRICT_8(k, a, ...) STRICT_ARG(k, a) STRICT_7(k, __VA_ARGS__)
#define STRICT_9(k, a, ...) STRICT_ARG(k, a) STRICT_8(k, __VA_ARGS__)
#define STRICT_10(k, a, ...) STRICT_ARG(k, a) STRICT_9(k, __VA_ARGS__)
#define STRICT_11(k, a, ...) STRICT_ARG(k, a) STRICT_10(k, __VA_ARGS__)
#define STRICT_12(k, a, ...) STRICT_ARG(k, a) STRICT_11(k, __VA_ARGS__)
#define STRICT_13(k, a, ...) STRICT_ARG(k, a) STRICT_12(k, __VA_ARGS__)
#define STRICT_14(k, a, ...) STRICT_ARG(k, a) STRICT_13(k, __VA_ARGS__)
#define STRICT_15(k, a, ...) STRICT_ARG(k, a) STRICT_14(k, __VA_ARGS__)
#define STRICT_16(k, a, ...) STRICT_ARG(k, a) STRICT_15(k, __VA_ARGS__)
#define STRICT_17(k, a, ...) STRICT_ARG(k, a) STRICT_16(k, __VA_ARGS__)
#define STRICT_18(k, a, ...) STRICT_ARG(k, a) STRICT_17(k, __VA_ARGS__)
#define STRICT_19(k, a, ...) STRICT_ARG(k, a) STRICT_18(k, __VA_ARGS__)
#define STRICT_20(k, a, ...) STRICT_ARG(k, a) STRICT_19(k, __VA_ARGS__)
#define STRICT_CAT(a, b) a##b
#define STRICT_PICK(n) STRICT_CAT(STRICT_, n)
#define STRICT_CHECK(k, ...)                                                                 \
    STRICT_PICK(STRICT_N(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1))(k, __VA_ARGS__)
#define STRICT_UNPAREN(...) __VA_ARGS__
#define STRICT_APPLY(k, args) STRICT_CHECK(k, STRICT_UNPAREN args)

#define GM_KERNEL(name, params, args)                                                        \
    static void strict_##name params {                                                       \
        STRICT_APPLY(#name, args)                                                            \
        strict_open();                                                                       \
        gm_k_##name##_cpu args;                                                              \
        strict_close();                                                                      \
    }
#include "kernels.def"
#undef GM_KERNEL

static const gm_kernel_table strict_kernels = {
#define GM_KERNEL(name, params, args) .name = strict_##name,
#include "kernels.def"
#undef GM_KERNEL
};

gm_status gm_backend_strict_new(int n_threads, gm_backend **out, gm_error *err) {
    *out = NULL;
    gm_backend *be = gm_calloc(1, sizeof *be);
    if (!be) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    gm_backend_init(be, "strict", GM_DEVICE_CPU, n_threads);
    be->host_visible = false;
    be->k = &strict_kernels;
    be->iface = (gm_backend_iface){.alloc = strict_alloc, .free = strict_free, .upload = strict_copy,
                                   .download = strict_copy, .copy = strict_copy, .memset = strict_memset,
                                   .synchronize = NULL, .destroy = NULL};
    *out = be;
    return GM_OK;
}

/* ---- opening a backend by device name; the CUDA module ------------------------------------- */

gm_status gm_backend_parse_device(const char *device, int *index, gm_error *err) {
    int idx = -1;
    bool ok = false;
    if (device && strcmp(device, "cpu") == 0) {
        ok = true;
    } else if (device && strcmp(device, "cuda") == 0) {
        idx = 0, ok = true;
    } else if (device && strncmp(device, "cuda:", 5) == 0 && device[5] >= '0' && device[5] <= '9') {
        char *end = NULL;
        long v = strtol(device + 5, &end, 10);
        ok = *end == '\0' && v >= 0 && v < 1024;
        idx = (int)v;
    }
    if (!ok)
        return gm_error_set(err, GM_ERR_INVALID, "unknown device \"%s\"\n  hint: use \"cpu\", \"cuda\" or \"cuda:N\" (GPU N)",
                            device ? device : "(none)");
    if (index) *index = idx;
    return GM_OK;
}

static const gm_cuda_module *cuda_module;

const gm_cuda_module *gm_cuda_module_get(gm_error *err) {
    if (cuda_module) return cuda_module;
    char path[4096];
    const char *env = getenv("GEMMARUN_CUDA_MODULE");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        /* beside the executable: build/gemmarun and build/libgemmarun_cuda.so */
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
        if (n <= 0) return gm_error_set(err, GM_ERR_DEVICE, "cannot find this program's folder (/proc/self/exe)"), NULL;
        path[n] = '\0';
        char *slash = strrchr(path, '/');
        snprintf(slash ? slash + 1 : path, 64, "libgemmarun_cuda.so");
    }
    if (access(path, F_OK) != 0) {
#ifdef GM_CUDA_MODULE_BUILT
        gm_error_set(err, GM_ERR_DEVICE,
                     "device \"cuda\": the CUDA module %s is missing\n"
                     "  hint: build the whole project (cmake --build build) so it lands beside gemmarun, or set "
                     "GEMMARUN_CUDA_MODULE to its path",
                     path);
#else
        gm_error_set(err, GM_ERR_UNSUPPORTED,
                     "device \"cuda\": this gemmarun was built without CUDA (no nvcc when it was configured)\n"
                     "  hint: install the CUDA toolkit and rebuild (cmake -S . -B build && cmake --build build), "
                     "or use device = \"cpu\"");
#endif
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        gm_error_set(err, GM_ERR_DEVICE, "device \"cuda\": cannot load the CUDA module %s: %s\n"
                     "  hint: the CUDA runtime and cuBLAS libraries must be on the library path (LD_LIBRARY_PATH), and the module "
                     "must come from the same build as this gemmarun",
                     path, dlerror());
        return NULL;
    }
    const gm_cuda_module *(*entry)(void) = (const gm_cuda_module *(*)(void))dlsym(h, "gm_cuda_module_entry");
    const gm_cuda_module *m = entry ? entry() : NULL;
    if (!m || m->abi != GM_CUDA_MODULE_ABI) {
        gm_error_set(err, GM_ERR_DEVICE, "device \"cuda\": %s is not a CUDA module of this build (%s)\n"
                     "  hint: rebuild the project so gemmarun and the module come from the same sources",
                     path, m ? "another interface version" : "no gm_cuda_module_entry");
        dlclose(h);
        return NULL;
    }
    cuda_module = m;
    return m;
}

gm_status gm_backend_probe(const char *device, gm_error *err) {
    int idx = -1;
    GM_TRY(gm_backend_parse_device(device, &idx, err));
    if (idx < 0) return GM_OK;
    gm_error local = {0};
    if (!err) err = &local;
    const gm_cuda_module *m = gm_cuda_module_get(err);
    if (!m) return err->code;
    char why[256] = "";
    int n = m->probe(why, sizeof why);
    if (n == 0)
        return gm_error_set(err, GM_ERR_DEVICE, "device \"%s\": no GPU found: %s\n  hint: run on a machine with an "
                            "NVIDIA GPU and its driver, or use device = \"cpu\"", device, why);
    if (idx >= n)
        return gm_error_set(err, GM_ERR_DEVICE, "device \"%s\": this machine has %d GPU%s (cuda:0%s)\n"
                            "  hint: pick one of them", device, n, n == 1 ? "" : "s", n == 1 ? "" : " .. cuda:N-1");
    return GM_OK;
}

gm_status gm_backend_device_memory(const char *device, size_t *peak, size_t *used, size_t *total, gm_error *err) {
    int idx = -1;
    *peak = *used = *total = 0;
    GM_TRY(gm_backend_parse_device(device, &idx, err));
    if (idx < 0) return gm_error_set(err, GM_ERR_INVALID, "device memory of \"cpu\": the process's resident memory is its own measure");
    GM_TRY(gm_backend_probe(device, err));
    size_t free_b = 0;
    if (cuda_module->mem_info(idx, &free_b, total) != 0)
        return gm_error_set(err, GM_ERR_DEVICE, "device \"%s\": cudaMemGetInfo failed", device);
    *used = *total - free_b;
    *peak = cuda_module->peak_bytes();
    return GM_OK;
}

gm_status gm_backend_open(const char *device, int n_threads, gm_backend **out, gm_error *err) {
    *out = NULL;
    int idx = -1;
    GM_TRY(gm_backend_parse_device(device, &idx, err));
    if (idx < 0) return gm_backend_cpu_new(n_threads, out, err);
    GM_TRY(gm_backend_probe(device, err));
    return cuda_module->backend_new(idx, out, err);
}
