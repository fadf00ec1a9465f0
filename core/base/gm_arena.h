/*
 * gm_arena.h - plan-then-allocate-once bump arenas (host or device).
 *
 * Design: a component lays out its buffers with one "layout" function that calls
 * gm_arena_alloc for every buffer. It is called twice: first on an arena in *measuring* mode,
 * where gm_arena_alloc returns NULL and only adds up sizes (per memory kind, for the memory
 * table), then gm_arena_commit makes the one allocation, and the same layout function runs
 * again to hand out real pointers. Nothing else allocates after that [llm.c size tables,
 * ggml gallocr reserve]. gm_arena_reset lets the same block be laid out again.
 *
 * Ownership: the arena owns its block; pointers it returns are valid until gm_arena_free or
 * gm_arena_reset. gm_arena_free on a zeroed or measuring arena is a no-op.
 * Errors: gm_arena_commit returns GM_ERR_NOMEM (with the size and arena name) or
 * GM_ERR_DEVICE; gm_arena_alloc past capacity is a bug (asserts): layouts must be
 * deterministic between the two passes.
 */
#ifndef GM_ARENA_H
#define GM_ARENA_H

#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gm_device { GM_DEVICE_CPU = 0, GM_DEVICE_CUDA = 1 } gm_device;

/* What a buffer is for; the memory planner reports totals per kind. */
typedef enum gm_mem_kind {
    GM_MEM_WEIGHTS = 0,  /* base model weights (converted copies; mmapped ones are not here) */
    GM_MEM_ADAPTERS,     /* trainable LoRA parameters */
    GM_MEM_GRADS,        /* their gradients */
    GM_MEM_OPTIMIZER,    /* AdamW moments */
    GM_MEM_ACTIVATIONS,  /* activations saved for backward */
    GM_MEM_KV_CACHE,     /* key/value cache for generation */
    GM_MEM_TRANSIENT,    /* largest short-lived buffer (attention scores, LM-head chunk) */
    GM_MEM_WORKSPACE,    /* scratch reused by every layer (dequantized weight panels ...) */
    GM_MEM_KIND_COUNT
} gm_mem_kind;

const char *gm_mem_kind_name(gm_mem_kind k);

/* Where a committed arena's block comes from when it is not plain host/CUDA memory: a backend's
 * allocator (core/backend/gm_backend.h). alloc returns a zero-filled block or NULL with *err
 * set. */
typedef struct gm_arena_mem {
    void *(*alloc)(void *user, size_t bytes, gm_error *err);
    void (*free)(void *user, void *p);
    void *user;
} gm_arena_mem;

/* Alignment of every buffer handed out (bytes): a cache line, and enough for AVX-512/CUDA. */
#define GM_ARENA_ALIGN 64

typedef struct gm_arena {
    const char *name;     /* for messages, not owned (string literal) */
    gm_device device;
    uint8_t *base;        /* NULL while measuring */
    size_t capacity;      /* bytes of the committed block */
    size_t used;          /* bytes handed out (or measured) so far */
    size_t by_kind[GM_MEM_KIND_COUNT];
    bool committed;
    const gm_arena_mem *mem; /* NULL: gm_device_malloc on `device` */
} gm_arena;

/* Starts a measuring pass. */
void gm_arena_init(gm_arena *a, const char *name, gm_device device);
/* Same, for an arena whose block comes from `mem` (a backend's allocator; borrowed, must outlive
 * the arena) on `device`. */
void gm_arena_init_mem(gm_arena *a, const char *name, gm_device device, const gm_arena_mem *mem);

/* Reserves `bytes` (rounded up to GM_ARENA_ALIGN). Measuring: returns NULL. Committed:
 * returns the buffer (uninitialized). */
void *gm_arena_alloc(gm_arena *a, size_t bytes, gm_mem_kind kind);

/* Allocates the measured size once (host arenas are zero-filled, so every page is resident from
 * the start) and rewinds so the layout can run again. */
gm_status gm_arena_commit(gm_arena *a, gm_error *err);

/* Rewinds a committed arena (keeps the block). */
void gm_arena_reset(gm_arena *a);

void gm_arena_free(gm_arena *a);

#ifdef __cplusplus
}
#endif
#endif /* GM_ARENA_H */
