/*
 * gm_arena.c - bump arenas; see gm_arena.h for the two-pass protocol.
 */
#include "gm_arena.h"

#include "gm_alloc.h"
#include "gm_device.h"

#include <string.h>

const char *gm_mem_kind_name(gm_mem_kind k) {
    static const char *names[GM_MEM_KIND_COUNT] = {
        "base weights", "adapters", "gradients", "optimizer state",
        "saved activations", "kv cache", "largest transient", "workspace"};
    return (unsigned)k < GM_MEM_KIND_COUNT ? names[k] : "?";
}

void gm_arena_init(gm_arena *a, const char *name, gm_device device) {
    memset(a, 0, sizeof *a);
    a->name = name;
    a->device = device;
}

void gm_arena_init_mem(gm_arena *a, const char *name, gm_device device, const gm_arena_mem *mem) {
    gm_arena_init(a, name, device);
    a->mem = mem;
}

void *gm_arena_alloc(gm_arena *a, size_t bytes, gm_mem_kind kind) {
    size_t n = (bytes + GM_ARENA_ALIGN - 1) / GM_ARENA_ALIGN * GM_ARENA_ALIGN;
    GM_ASSERT((unsigned)kind < GM_MEM_KIND_COUNT);
    a->by_kind[kind] += n;
    if (!a->committed) {
        a->used += n;
        return NULL;
    }
    GM_ASSERT(a->used + n <= a->capacity);
    void *p = a->base + a->used;
    a->used += n;
    return p;
}

gm_status gm_arena_commit(gm_arena *a, gm_error *err) {
    GM_ASSERT(!a->committed);
    size_t size = a->used ? a->used : GM_ARENA_ALIGN;
    void *p = NULL;
    gm_status s = GM_OK;
    if (a->mem) {
        p = a->mem->alloc(a->mem->user, size, err);
        if (!p) s = err && err->code != GM_OK ? err->code : GM_ERR_NOMEM;
    } else {
        s = gm_device_malloc(a->device, size, &p, err);
    }
    if (s != GM_OK) {
        gm_error_prefix(err, "arena '%s' (%.1f MiB)", a->name ? a->name : "?",
                        (double)size / 1048576.0);
        return s;
    }
    /* Touch every page now (zero-fill on the host): the resident memory reaches the plan at once
     * and never depends on which examples a step draws, and a kernel that over-commits memory
     * fails here, at start-up, instead of hours into a run. */
    if (a->device == GM_DEVICE_CPU && !a->mem) memset(p, 0, size); /* a backend's blocks come zeroed */
    a->base = p;
    a->capacity = size;
    a->committed = true;
    gm_arena_reset(a);
    return GM_OK;
}

void gm_arena_reset(gm_arena *a) {
    a->used = 0;
    memset(a->by_kind, 0, sizeof a->by_kind);
}

void gm_arena_free(gm_arena *a) {
    if (!a) return;
    if (a->committed && a->base) {
        if (a->mem) a->mem->free(a->mem->user, a->base);
        else gm_device_free(a->device, a->base);
    }
    const char *name = a->name;
    gm_device dev = a->device;
    const gm_arena_mem *mem = a->mem;
    memset(a, 0, sizeof *a);
    a->name = name;
    a->device = dev;
    a->mem = mem;
}
