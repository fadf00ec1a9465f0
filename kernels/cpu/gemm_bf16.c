/*
 * gemm_bf16.c - the CPU's bf16 GEMM with f32 accumulation, through oneDNN's matmul primitive.
 *
 * Why oneDNN (Debian libdnnl-dev 2.6): Debian 12's OpenBLAS 0.3.21 exports no bf16 GEMM (no
 * `sbgemm`), and oneDNN's brgemm matmul runs AVX512-BF16's vdpbf16ps (AMX where present) on our
 * row-major, strided operands without a weight reorder. Measured at the 270M's shapes on 2 cores of
 * an AVX512-BF16 Xeon (docs/benchmarks.md, "bf16 GEMM rates"): 166-175 GFLOP/s at M 256-512, N x K
 * 640 x 2048, 2048 x 640, 1024 x 640 - faster than OpenBLAS's sgemm on the SSE3 kernels it fell back
 * to there (63), slower than on its AVX-512 ones (265-309): why compute = "auto" is f32 on such a
 * CPU (kernels.h, gm_k_cpu_bf16_auto). A weight pre-packed into oneDNN's own layout gained under
 * 5%, so the weights stay as stored (bf16 rows, or panels of them dequantized). oneDNN is built on OpenMP here (libgomp), so it shares the one pool with OpenBLAS
 * and our loops (gm_kernels_set_threads sets its thread count).
 *
 * oneDNN is loaded with dlopen the first time a bf16 GEMM or the question "is bf16 native here?"
 * needs it, not linked: loading libdnnl makes 5.2 MB resident (its relocations) before it computes
 * anything, which an f32 run - the default on most CPUs - would pay for nothing (and its memory plan
 * would miss). The CPU's flags (cpuid) answer first; oneDNN confirms (it also honours
 * DNNL_MAX_CPU_ISA). Primitives are cached by shape (creating one costs about a millisecond); the
 * cache holds GEMM_CACHE entries and never evicts (a shape beyond it gets a primitive for that call
 * only), so a primitive in use on another thread is never destroyed. Without oneDNN (a build
 * without its header, libdnnl.so.2 not found at run time, or GEMMARUN_ONEDNN=0 in the environment)
 * or on any oneDNN failure, gm_cpu_gemm_bf16 returns false and the caller computes in f32.
 */
#include "kernels.h"

#include "gm_dtype.h"
#include "gm_omp.h"

#include <omp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_bf16.h"

void gm_cpu_to_bf16(uint16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols,
                    int n_threads) {
    GM_OMP_FOR(n_threads, rows * cols >= 65536, schedule(static), for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * ld_src;
        uint16_t *d = dst + r * ld_dst;
        for (int64_t c = 0; c < cols; c++) d[c] = gm_f32_to_bf16(s[c]);
    });
}

/* The CPU's own flags (cpuid): AVX512-BF16 (leaf 7 sub-leaf 1, EAX bit 5) or AMX-BF16 (leaf 7, EDX
 * bit 22), with AVX-512 state enabled by the OS (XCR0 bits 5-7). Checked before oneDNN is loaded. */
static bool cpu_has_bf16_flags(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7) return false;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!(c & (1u << 27))) return false; /* OSXSAVE */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xe6u) != 0xe6u) return false; /* SSE, AVX, opmask, ZMM state */
    unsigned a7, b7, c7, d7, a71, b71, c71, d71;
    __asm__ volatile("cpuid" : "=a"(a7), "=b"(b7), "=c"(c7), "=d"(d7) : "a"(7), "c"(0));
    __asm__ volatile("cpuid" : "=a"(a71), "=b"(b71), "=c"(c71), "=d"(d71) : "a"(7), "c"(1));
    (void)b7, (void)c7, (void)b71, (void)c71, (void)d71;
    return (a71 & (1u << 5)) || (d7 & (1u << 22));
#else
    return false;
#endif
}

static bool cpu_has_amx_flag(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    return (d & (1u << 22)) != 0;
#else
    return false;
#endif
}

#ifdef GM_HAVE_DNNL
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#define GEMM_CACHE 256

/* The oneDNN functions used, resolved from libdnnl.so.2 (dnnl_api_load). */
#define DNNL_FUNCS(X)                                                                                          \
    X(dnnl_get_effective_cpu_isa) X(dnnl_engine_create) X(dnnl_memory_desc_init_by_strides)                     \
    X(dnnl_matmul_desc_init) X(dnnl_primitive_attr_create) X(dnnl_post_ops_create) X(dnnl_post_ops_append_sum)   \
    X(dnnl_primitive_attr_set_post_ops) X(dnnl_primitive_desc_create) X(dnnl_primitive_create)                  \
    X(dnnl_primitive_desc_destroy) X(dnnl_post_ops_destroy) X(dnnl_primitive_attr_destroy)                      \
    X(dnnl_memory_create)                                                                                      \
    X(dnnl_stream_create) X(dnnl_primitive_execute) X(dnnl_stream_wait) X(dnnl_stream_destroy)                  \
    X(dnnl_memory_destroy) X(dnnl_primitive_destroy)

static struct {
#define X(f) __typeof__(f) *f;
    DNNL_FUNCS(X)
#undef X
} api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static bool api_ok;

static void dnnl_api_load(void) {
    /* GEMMARUN_ONEDNN=0: never load it (f32 only; the sanitizer run, tests/sanitizers/run.sh) */
    const char *off = getenv("GEMMARUN_ONEDNN");
    if (off && strcmp(off, "0") == 0) return;
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    bool ok = true;
#define X(f) ok = ok && (*(void **)&api.f = dlsym(h, #f)) != NULL;
    DNNL_FUNCS(X)
#undef X
    api_ok = ok;
}

/* oneDNN, loaded once; false when it cannot be. */
static bool dnnl_api(void) {
    pthread_once(&api_once, dnnl_api_load);
    return api_ok;
}

/* A primitive serves every M (DNNL_RUNTIME_DIM_VAL: oneDNN's gemm:jit, measured as fast as a
 * fixed-M brgemm at our shapes, 166-169 GFLOP/s): each one holds ~140 KB of generated code, so
 * one per batch shape would grow with the data; one per weight shape is a few dozen a model. */
typedef struct gemm_key {
    int64_t N, K, lda, ldb, ldc;
    int b_nk, accumulate;
} gemm_key;

static struct {
    pthread_mutex_t lock;
    dnnl_engine_t engine;
    int state; /* 0: not tried, 1: ready, -1: oneDNN unusable */
    int n;
    gemm_key key[GEMM_CACHE];
    dnnl_primitive_t prim[GEMM_CACHE];
} g_dnnl = {.lock = PTHREAD_MUTEX_INITIALIZER};

bool gm_k_cpu_bf16_native(void) {
    static int native = -1;
    if (native < 0)
        native = cpu_has_bf16_flags() && dnnl_api() && api.dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core_bf16;
    return native == 1;
}

bool gm_k_cpu_bf16_auto(void) {
    /* the rule from the CPU's flags first: on a CPU where "auto" is f32, oneDNN is never loaded */
    const char *force = getenv("GEMMARUN_BF16_AUTO"); /* kernels.h: the rule's override */
    bool forced = force && (strcmp(force, "0") == 0 || strcmp(force, "1") == 0);
    bool amd = false;
#if defined(__x86_64__)
    __builtin_cpu_init();
    amd = __builtin_cpu_is("amd");
#endif
    bool want = forced ? force[0] == '1' : cpu_has_bf16_flags() && (cpu_has_amx_flag() || amd);
    if (!want || !gm_k_cpu_bf16_native()) return false;
    return forced || !cpu_has_amx_flag() || api.dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core_amx || amd;
}

/* The descriptors of C (M, N) (+)= A (M, K) . B, B given as (K, N) with strides {1, ldb} (b_nk:
 * stored as N rows of K) or {ldb, 1}; M may be DNNL_RUNTIME_DIM_VAL. false on failure. */
static bool descs(const gemm_key *k, int64_t M, dnnl_memory_desc_t *a, dnnl_memory_desc_t *b, dnnl_memory_desc_t *c) {
    dnnl_dims_t ad = {M, k->K}, as = {k->lda, 1}, bd = {k->K, k->N}, cd = {M, k->N}, cs = {k->ldc, 1};
    dnnl_dims_t bs_nk = {1, k->ldb}, bs_kn = {k->ldb, 1};
    return api.dnnl_memory_desc_init_by_strides(a, 2, ad, dnnl_bf16, as) == dnnl_success &&
           api.dnnl_memory_desc_init_by_strides(b, 2, bd, dnnl_bf16, k->b_nk ? bs_nk : bs_kn) == dnnl_success &&
           api.dnnl_memory_desc_init_by_strides(c, 2, cd, dnnl_f32, cs) == dnnl_success;
}

/* The matmul primitive of key k for any M. NULL on failure. */
static dnnl_primitive_t create(const gemm_key *k) {
    dnnl_memory_desc_t a, b, c;
    if (!descs(k, DNNL_RUNTIME_DIM_VAL, &a, &b, &c)) return NULL;
    dnnl_matmul_desc_t md;
    if (api.dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) != dnnl_success) return NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    bool ok = api.dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && k->accumulate) /* C += A.B: oneDNN's sum post-op (scale 1) reads C before writing it */
        ok = api.dnnl_post_ops_create(&po) == dnnl_success && api.dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             api.dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (ok) ok = api.dnnl_primitive_desc_create(&pd, &md, attr, g_dnnl.engine, NULL) == dnnl_success;
    if (ok && api.dnnl_primitive_create(&p, pd) != dnnl_success) p = NULL;
    if (pd) api.dnnl_primitive_desc_destroy(pd);
    if (po) api.dnnl_post_ops_destroy(po);
    if (attr) api.dnnl_primitive_attr_destroy(attr);
    return p;
}

bool gm_cpu_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                      bool b_nk, float *c, int64_t ldc, bool accumulate) {
    gemm_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp: no stray padding bytes */
    key.N = N, key.K = K, key.lda = lda, key.ldb = ldb, key.ldc = ldc, key.b_nk = b_nk,
    key.accumulate = accumulate;
    dnnl_primitive_t p = NULL;
    bool cached = false;
    pthread_mutex_lock(&g_dnnl.lock);
    if (g_dnnl.state == 0)
        g_dnnl.state = dnnl_api() && api.dnnl_engine_create(&g_dnnl.engine, dnnl_cpu, 0) == dnnl_success ? 1 : -1;
    if (g_dnnl.state == 1) {
        for (int i = 0; i < g_dnnl.n && !p; i++)
            if (memcmp(&g_dnnl.key[i], &key, sizeof key) == 0) p = g_dnnl.prim[i], cached = true;
        if (!p && (p = create(&key)) && g_dnnl.n < GEMM_CACHE) {
            g_dnnl.key[g_dnnl.n] = key, g_dnnl.prim[g_dnnl.n++] = p;
            cached = true;
        }
    }
    dnnl_engine_t engine = g_dnnl.engine;
    pthread_mutex_unlock(&g_dnnl.lock);
    if (!p) return false;

    /* memory objects on the caller's buffers, with this call's M */
    dnnl_memory_desc_t amd, bmd, cmd;
    bool ok = descs(&key, M, &amd, &bmd, &cmd);
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    dnnl_stream_t stream = NULL;
    ok = ok && api.dnnl_memory_create(&ma, &amd, engine, (void *)a) == dnnl_success &&
         api.dnnl_memory_create(&mb, &bmd, engine, (void *)b) == dnnl_success &&
         api.dnnl_memory_create(&mc, &cmd, engine, c) == dnnl_success &&
         api.dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
        ok = api.dnnl_primitive_execute(p, stream, 3, args) == dnnl_success && api.dnnl_stream_wait(stream) == dnnl_success;
    }
    if (stream) api.dnnl_stream_destroy(stream);
    if (mc) api.dnnl_memory_destroy(mc);
    if (mb) api.dnnl_memory_destroy(mb);
    if (ma) api.dnnl_memory_destroy(ma);
    if (!cached) api.dnnl_primitive_destroy(p);
    return ok;
}

#else /* no oneDNN: the CPU computes in f32 */

bool gm_k_cpu_bf16_native(void) {
    (void)cpu_has_bf16_flags, (void)cpu_has_amx_flag;
    return false;
}
bool gm_k_cpu_bf16_auto(void) { return false; }

bool gm_cpu_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                      bool b_nk, float *c, int64_t ldc, bool accumulate) {
    (void)M, (void)N, (void)K, (void)a, (void)lda, (void)b, (void)ldb, (void)b_nk, (void)c, (void)ldc, (void)accumulate;
    return false;
}

#endif
