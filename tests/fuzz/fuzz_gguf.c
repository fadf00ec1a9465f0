/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Feeds each input to gm_gguf_open_memory; when it parses, touches every byte range the
 * reader hands out (kv values, string array entries, first and last byte of each tensor) and
 * looks every key and tensor up by name, so an out-of-bounds view shows up under ASan rather
 * than in a later consumer. Invariants that must hold for any accepted file trap.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt; without
 * clang the same function is driven over the seed corpus by fuzz_replay.c.
 */
#include "gm_gguf.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink; // keeps the touching reads from being optimised away

static void touch(const void *p, size_t n, const uint8_t *lo, size_t size) {
    const uint8_t *b = p;
    if (n == 0) return;
    if (b < lo || b + n > lo + size) __builtin_trap(); // a view outside the image
    sink ^= b[0];
    sink ^= b[n - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gm_error err;
    gm_gguf *g = NULL;
    if (gm_gguf_open_memory(data, size, "fuzz", &g, &err) != GM_OK) {
        if (g != NULL || err.msg[0] == '\0') __builtin_trap(); // failures leave a message
        return 0;
    }
    char key[256];
    for (int64_t i = 0; i < gm_gguf_n_kv(g); i++) {
        const gm_gguf_kv *kv = gm_gguf_kv_at(g, i);
        touch(kv->key.p, (size_t)kv->key.len, data, size);
        if (kv->strs)
            for (uint64_t j = 0; j < kv->n; j++)
                touch(kv->strs[j].p, (size_t)kv->strs[j].len, data, size);
        if (kv->key.len < sizeof key && !memchr(kv->key.p, 0, (size_t)kv->key.len)) {
            memcpy(key, kv->key.p, (size_t)kv->key.len);
            key[kv->key.len] = '\0';
            if (gm_gguf_find_kv(g, key) != kv) __builtin_trap(); // keys are unique
            int64_t iv;
            double dv;
            bool bv;
            gm_strref sv;
            (void)gm_gguf_get_int(g, key, &iv);
            (void)gm_gguf_get_float(g, key, &dv);
            (void)gm_gguf_get_bool(g, key, &bv);
            (void)gm_gguf_get_str(g, key, &sv);
            const gm_strref *sa;
            const void *ad;
            uint64_t an;
            gm_gguf_vtype at;
            if (gm_gguf_get_str_array(g, key, &sa, &an) && an > 0)
                touch(sa[an - 1].p, (size_t)sa[an - 1].len, data, size);
            if (gm_gguf_get_array(g, key, &at, &ad, &an) && an > 0) touch(ad, 1, data, size);
        }
    }
    for (int64_t i = 0; i < gm_gguf_n_tensors(g); i++) {
        const gm_gguf_tensor *t = gm_gguf_tensor_at(g, i);
        touch(t->data, t->nbytes, data, size);
        if (t->ndim < 1 || t->ndim > 4 || t->nbytes == 0) __builtin_trap();
        if (!memchr(t->cname, 0, t->name.len) && gm_gguf_find_tensor(g, t->cname) != t)
            __builtin_trap();
    }
    gm_gguf_free(g);
    return 0;
}
