/*
 * fuzz_image.c - libFuzzer target for the image decoders (core/image: PNG through libpng, JPEG
 * through libjpeg, EXIF through libexif, the format sniffing, the orientation transposes) and the
 * preprocessing that follows a successful decode (resize, crops, normalization).
 *
 * Feeds each input to gm_image_decode with a 4-megapixel limit (decoding bombs are refused before
 * allocation; the limit keeps each run fast). A failure must leave a message and no image; a
 * success must give a non-empty image inside the limit, whose every byte is read (ASan sees a
 * short buffer), then preprocessed at a small size with pan & scan on: every output value must
 * be one of the 256 the normalization can produce, i.e. in [-1, 1]. Violations trap.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt; without
 * clang the same function is driven over the seed corpus (tests/fuzz/corpus_image, copies of
 * small fixtures of tests/ref/images written by tests/ref/make_image_ref.py) by fuzz_replay.c.
 */
#include "gm_image.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const gm_image_limits lim = {.max_pixels = 1 << 22};
    gm_error err = {0};
    gm_image img = {0};
    if (gm_image_decode(data, size, "fuzz", &lim, &img, &err) != GM_OK) {
        if (img.rgb != NULL || img.w != 0 || err.msg[0] == '\0') __builtin_trap(); /* failures leave a message, no image */
        if (strncmp(err.msg, "fuzz: ", 6) != 0) __builtin_trap();                   /* and name the input */
        return 0;
    }
    if (!img.rgb || img.w < 1 || img.h < 1 || img.w * img.h > lim.max_pixels) __builtin_trap();
    uint8_t x = 0;
    for (int64_t i = 0; i < img.w * img.h * 3; i++) x ^= img.rgb[i];
    sink ^= x;
    gm_image_opts o = gm_image_opts_gemma3(8);
    o.pan_and_scan = true, o.pas_min_crop_size = 4; /* crops even for small inputs */
    gm_image_pixels px = {0};
    if (gm_image_preprocess(&img, &o, &px, &err) == GM_OK) {
        if (px.n != 1 + px.n_crops || px.n_crops > o.pas_max_num_crops) __builtin_trap();
        for (int64_t i = 0; i < px.n * 3 * 8 * 8; i++)
            if (!(px.data[i] >= -1.0f && px.data[i] <= 1.0f)) __builtin_trap();
        gm_image_pixels_free(&px);
    } else if (err.code != GM_ERR_NOMEM && err.code != GM_ERR_INVALID) {
        __builtin_trap();
    }
    gm_image_free(&img);
    return 0;
}
