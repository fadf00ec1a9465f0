/*
 * gguf_build.h - a tiny GGUF writer for tests: append header, key/values, tensor infos,
 * padding and data to a growable byte buffer, byte by byte as formats.md §1.1 lays them out.
 *
 * It writes exactly what it is told (no validation), so tests can also build broken files.
 * Ownership: the gb buffer owns its bytes (plain malloc, so the gm_alloc counters that tests
 * check for leaks only see the library's allocations); gb_free releases them.
 * Errors: allocation failure aborts the test program (test code only).
 */
#ifndef GM_TEST_GGUF_BUILD_H
#define GM_TEST_GGUF_BUILD_H

#include <stddef.h>
#include <stdint.h>

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

void gb_free(gb *b);
void gb_raw(gb *b, const void *data, size_t n);
void gb_u8(gb *b, uint8_t v);
void gb_u16(gb *b, uint16_t v);
void gb_u32(gb *b, uint32_t v);
void gb_u64(gb *b, uint64_t v);
void gb_f32(gb *b, float v);
void gb_f64(gb *b, double v);
/* GGUF string: u64 length + bytes, no NUL. */
void gb_str(gb *b, const char *s);
/* magic "GGUF", version, tensor count, kv count. */
void gb_header(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
/* Key and value type; the caller appends the value (or array header + elements). */
void gb_kv(gb *b, const char *key, uint32_t vtype);
void gb_kv_u32(gb *b, const char *key, uint32_t v);
void gb_kv_str(gb *b, const char *key, const char *v);
/* Array header: element type and count, after gb_kv(b, key, 9). */
void gb_arr(gb *b, uint32_t elem_type, uint64_t n);
/* Tensor info: name, n_dims, ne[0..n_dims-1] (ggml order, innermost first), type, offset. */
void gb_tensor(gb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
               uint64_t offset);
/* Zero padding up to a multiple of `align`. */
void gb_pad(gb *b, size_t align);

/* The worked example of formats.md §1.1: 192 bytes, data offset 160, one f32 tensor "w" with
 * ne = [4, 2] holding 0..7. */
void gb_example(gb *b);

/* A richer valid file (~1.3 KB): architecture, alignment 32, a u32, an f32, a bool, a string
 * array of 3 tokens, an i32 array, and tensors "a" (f32 [8]), "b" (q8_0 ne [32, 2]),
 * "c" (q4_K ne [256]) with deterministic data. */
void gb_rich(gb *b);

/* Writes the buffer to `path`; returns 0 on success. */
int gb_write_file(const gb *b, const char *path);

#endif /* GM_TEST_GGUF_BUILD_H */
