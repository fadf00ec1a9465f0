/*
 * gm_alloc.h - the one host allocator of gemmarun, with counters and fault injection.
 *
 * Every host allocation in core/, kernels/ and lua/ goes through gm_malloc/gm_calloc/
 * gm_realloc/gm_free, so that tests can count allocations (the memory planner promises zero
 * allocations inside the step loop) and inject failures (the N-th allocation returns NULL).
 * Large buffers are not allocated here piecemeal: they come from arenas (gm_arena.h) whose
 * single backing block is itself one gm_malloc.
 *
 * Ownership: the caller owns what gm_malloc returns and releases it with gm_free.
 * Errors: gm_malloc returns NULL on failure (callers turn that into GM_ERR_NOMEM);
 * gm_xmalloc is the must-succeed flavour for small fixed structures and asserts.
 * Thread-safety: counters are atomic; the allocator may be called from any thread.
 */
#ifndef GM_ALLOC_H
#define GM_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void *gm_malloc(size_t size);
void *gm_calloc(size_t n, size_t size);
void *gm_realloc(void *p, size_t size);
void gm_free(void *p);
char *gm_strdup(const char *s);
char *gm_strndup(const char *s, size_t n);

/* Must-succeed allocation for small fixed structures; asserts on failure. */
void *gm_xmalloc(size_t size);

/* Counters since process start (or the last gm_alloc_reset_counters). */
typedef struct gm_alloc_stats {
    uint64_t n_alloc;      /* successful gm_malloc/gm_calloc/gm_realloc calls */
    uint64_t n_free;       /* gm_free calls with a non-NULL pointer */
    uint64_t bytes_live;   /* bytes currently allocated through gm_malloc and friends */
    uint64_t bytes_peak;   /* high-water mark of bytes_live */
} gm_alloc_stats;

gm_alloc_stats gm_alloc_get_stats(void);
void gm_alloc_reset_counters(void);

/* Fault injection for tests (SQLite's two modes, https://sqlite.org/testing.html §3.1):
 * gm_alloc_fail_after: the n-th allocation from now (1-based) fails and returns NULL, the later
 * ones succeed ("transient"); gm_alloc_fail_from: the n-th and every later one fail
 * ("persistent": the error paths themselves get no memory). 0 disables either. */
void gm_alloc_fail_after(uint64_t n);
void gm_alloc_fail_from(uint64_t n);
/* True while the armed failure has not happened yet (the operation under test made fewer
 * allocations than n: a sweep over n is complete). */
bool gm_alloc_fail_pending(void);

/* Peak resident set size of this process in bytes (Linux VmHWM), or 0 if unknown. */
uint64_t gm_process_peak_rss(void);
/* Current resident set size in bytes (Linux VmRSS), or 0 if unknown. */
uint64_t gm_process_rss(void);
/* Resets the peak-RSS mark to the current RSS (Linux: "5" into /proc/self/clear_refs), so a
 * trial measures its own peak in a process that ran others before; first returns the heap's free
 * pages to the kernel (glibc's malloc_trim: what an earlier phase freed - a data set's text, a
 * previous trial's buffers - stops being resident). Returns false if the kernel does not allow
 * the reset (the peak then stays the process's). */
bool gm_process_reset_peak_rss(void);

#ifdef __cplusplus
}
#endif
#endif /* GM_ALLOC_H */
