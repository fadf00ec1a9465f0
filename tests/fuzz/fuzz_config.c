/*
 * fuzz_config.c - libFuzzer target for config.json (gm_config_from_json: both key layouts, nested
 * text/vision/audio configs, rope parameters, layer types) and the validation every loader runs
 * after it (gm_config_validate).
 *
 * The input is taken as text (a NUL is appended). A parse that succeeds must leave a config the
 * validator can judge without crashing; one that fails must leave a message. Without clang the
 * same function is driven over the seed corpus by fuzz_replay.c.
 */
#include "gm_alloc.h"
#include "gm_config.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = gm_malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    gm_error err;
    gm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (gm_config_from_json(text, "fuzz", &cfg, &err) == GM_OK) {
        gm_error verr;
        if (gm_config_validate(&cfg, "fuzz", &verr) != GM_OK && verr.msg[0] == '\0') __builtin_trap();
    } else if (err.msg[0] == '\0') {
        __builtin_trap(); /* failures leave a message */
    }
    gm_free(text);
    return 0;
}
