/*
 * gm_alloc.c - counting host allocator.
 *
 * Each block carries a 64-byte header holding its size, so gm_free can keep bytes_live exact
 * without a side table; 64 keeps the user pointer aligned for AVX-512 loads.
 */
#include "gm_alloc.h"

#include "gm_status.h"

#include <stdatomic.h>
#include <stdio.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>

#define HDR 64

static _Atomic uint64_t n_alloc, n_free, bytes_live, bytes_peak, fail_countdown;
static _Atomic int fail_persist, fail_active; /* persistent mode; armed and already fired */

static int should_fail(void) {
    if (atomic_load(&fail_active)) return 1;
    uint64_t c = atomic_load(&fail_countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &c, c - 1)) {
            if (c == 1 && atomic_load(&fail_persist)) atomic_store(&fail_active, 1);
            return c == 1;
        }
    }
    return 0;
}

static void account(int64_t delta) {
    if (delta >= 0) {
        uint64_t now = atomic_fetch_add(&bytes_live, (uint64_t)delta) + (uint64_t)delta;
        uint64_t peak = atomic_load(&bytes_peak);
        while (now > peak && !atomic_compare_exchange_weak(&bytes_peak, &peak, now)) {}
    } else {
        atomic_fetch_sub(&bytes_live, (uint64_t)(-delta));
    }
}

void *gm_malloc(size_t size) {
    if (size > SIZE_MAX - HDR || should_fail()) return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, HDR, size + HDR) != 0) return NULL;
    *(size_t *)raw = size;
    atomic_fetch_add(&n_alloc, 1);
    account((int64_t)size);
    return (char *)raw + HDR;
}

void *gm_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = gm_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void gm_free(void *p) {
    if (!p) return;
    char *raw = (char *)p - HDR;
    account(-(int64_t) * (size_t *)raw);
    atomic_fetch_add(&n_free, 1);
    free(raw);
}

void *gm_realloc(void *p, size_t size) {
    if (!p) return gm_malloc(size);
    size_t old = *(size_t *)((char *)p - HDR);
    void *q = gm_malloc(size);
    if (!q) return NULL;
    memcpy(q, p, old < size ? old : size);
    gm_free(p);
    return q;
}

char *gm_strndup(const char *s, size_t n) {
    char *d = gm_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *gm_strdup(const char *s) { return gm_strndup(s, strlen(s)); }

void *gm_xmalloc(size_t size) {
    void *p = gm_malloc(size);
    GM_ASSERT(p != NULL);
    return p;
}

gm_alloc_stats gm_alloc_get_stats(void) {
    gm_alloc_stats s = {atomic_load(&n_alloc), atomic_load(&n_free), atomic_load(&bytes_live),
                        atomic_load(&bytes_peak)};
    return s;
}

void gm_alloc_reset_counters(void) {
    atomic_store(&n_alloc, 0);
    atomic_store(&n_free, 0);
    atomic_store(&bytes_peak, atomic_load(&bytes_live));
}

void gm_alloc_fail_after(uint64_t n) {
    atomic_store(&fail_active, 0);
    atomic_store(&fail_persist, 0);
    atomic_store(&fail_countdown, n);
}

void gm_alloc_fail_from(uint64_t n) {
    atomic_store(&fail_active, 0);
    atomic_store(&fail_persist, n > 0);
    atomic_store(&fail_countdown, n);
}

bool gm_alloc_fail_pending(void) { return atomic_load(&fail_countdown) > 0; }

static uint64_t status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0) {
            v = strtoull(line + kl, NULL, 10) * 1024u;
            break;
        }
    }
    fclose(f);
    return v;
}

uint64_t gm_process_peak_rss(void) { return status_kib("VmHWM:"); }
uint64_t gm_process_rss(void) { return status_kib("VmRSS:"); }

bool gm_process_reset_peak_rss(void) {
#ifdef __GLIBC__
    malloc_trim(0); /* the heap's free pages back to the kernel first: not the next phase's */
#endif
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}
