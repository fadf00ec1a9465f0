/*
 * gguf_build.c - test GGUF writer; see gguf_build.h.
 */
#include "gguf_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gb_free(gb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void gb_raw(gb *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "gguf_build: out of memory\n");
            abort();
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
}

void gb_u8(gb *b, uint8_t v) { gb_raw(b, &v, 1); }
void gb_u16(gb *b, uint16_t v) {
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    gb_raw(b, x, 2);
}
void gb_u32(gb *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    gb_raw(b, x, 4);
}
void gb_u64(gb *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    gb_raw(b, x, 8);
}
void gb_f32(gb *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    gb_u32(b, u);
}
void gb_f64(gb *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    gb_u64(b, u);
}
void gb_str(gb *b, const char *s) {
    size_t n = strlen(s);
    gb_u64(b, n);
    gb_raw(b, s, n);
}
void gb_header(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_raw(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
void gb_kv(gb *b, const char *key, uint32_t vtype) {
    gb_str(b, key);
    gb_u32(b, vtype);
}
void gb_kv_u32(gb *b, const char *key, uint32_t v) {
    gb_kv(b, key, 4);
    gb_u32(b, v);
}
void gb_kv_str(gb *b, const char *key, const char *v) {
    gb_kv(b, key, 8);
    gb_str(b, v);
}
void gb_arr(gb *b, uint32_t elem_type, uint64_t n) {
    gb_u32(b, elem_type);
    gb_u64(b, n);
}
void gb_tensor(gb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
               uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) gb_u64(b, ne[i]);
    gb_u32(b, type);
    gb_u64(b, offset);
}
void gb_pad(gb *b, size_t align) {
    static const uint8_t zeros[256];
    while (b->n % align) gb_raw(b, zeros, 1);
}

void gb_example(gb *b) {
    gb_header(b, 3, 1, 2);
    gb_kv_str(b, "general.architecture", "gemma3");
    gb_kv_u32(b, "general.alignment", 32);
    const uint64_t ne[2] = {4, 2};
    gb_tensor(b, "w", 2, ne, 0, 0);
    gb_pad(b, 32);
    for (int i = 0; i < 8; i++) gb_f32(b, (float)i);
}

void gb_rich(gb *b) {
    gb_header(b, 3, 3, 7);
    gb_kv_str(b, "general.architecture", "gemma3");
    gb_kv_u32(b, "general.alignment", 32);
    gb_kv_u32(b, "gemma3.block_count", 18);
    gb_kv(b, "gemma3.rope.freq_base", 6);
    gb_f32(b, 1e6f);
    gb_kv(b, "tokenizer.ggml.add_bos_token", 7);
    gb_u8(b, 1);
    gb_kv(b, "tokenizer.ggml.tokens", 9);
    gb_arr(b, 8, 3);
    gb_str(b, "<pad>");
    gb_str(b, "<eos>");
    gb_str(b, "hello");
    gb_kv(b, "tokenizer.ggml.token_type", 9);
    gb_arr(b, 5, 3);
    gb_u32(b, 3);
    gb_u32(b, 3);
    gb_u32(b, 1);
    const uint64_t ne_a[1] = {8}, ne_b[2] = {32, 2}, ne_c[1] = {256};
    gb_tensor(b, "a", 1, ne_a, 0, 0);     // 32 bytes
    gb_tensor(b, "b", 2, ne_b, 8, 32);    // 2 * 34 = 68 bytes -> padded to 96
    gb_tensor(b, "c", 1, ne_c, 12, 128);  // 144 bytes
    gb_pad(b, 32);
    for (int i = 0; i < 8; i++) gb_f32(b, (float)i * 0.5f);
    for (int r = 0; r < 2; r++) {
        gb_u16(b, 0x3c00); // d = 1.0
        for (int i = 0; i < 32; i++) gb_u8(b, (uint8_t)(int8_t)(i - 16 + r));
    }
    gb_pad(b, 32);
    gb_u16(b, 0x3c00); // d
    gb_u16(b, 0x3800); // dmin = 0.5
    for (int i = 0; i < 12; i++) gb_u8(b, (uint8_t)(0x11 * (i % 4) + 1));
    for (int i = 0; i < 128; i++) gb_u8(b, (uint8_t)(i * 37));
    gb_pad(b, 32);
}

int gb_write_file(const gb *b, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = b->n ? fwrite(b->p, 1, b->n, f) : 0; // an empty gb has no buffer
    int rc = fclose(f);
    return (w == b->n && rc == 0) ? 0 : -1;
}
