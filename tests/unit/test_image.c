/*
 * test_image.c - core/image against Pillow 13 and transformers 5.24, bit for bit: decoded RGB of
 * every good fixture (PNG modes, JPEG colour spaces, EXIF/XMP orientations), Image.resize
 * BILINEAR at many sizes, Gemma3ImageProcessorPil's pixel_values (with and without pan & scan),
 * the pan & scan rectangles; the distance to the default torchvision processor (a measured bound);
 * every bad file's error (message names the file and the reason, nothing leaks), the pixel limit
 * checked before allocation, and allocation failures at every point.
 *
 * Reference: tests/ref/image_ref.h5 and tests/ref/images/, written by tests/ref/make_image_ref.py
 * (tests/ref/README.md). Large references are stored as the sha256 of their bytes; small ones as
 * arrays too, so a failure shows the first differing pixel.
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_image.h"

#include <hdf5.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

static char REF[1024];

/* ---- helpers ---------------------------------------------------------------------------------- */

static const char *img_path(const char *name) {
    static char buf[2048];
    snprintf(buf, sizeof buf, "%.1500s/tests/ref/images/%.300s", GM_SOURCE_DIR, name);
    return buf;
}

static int64_t attr_i(const char *obj, const char *name) {
    double v = -1;
    bool ok = gm_test_h5_attr_double(REF, obj, name, &v);
    CHECK(ok, "%s: no attribute %s on %s", REF, name, obj);
    return (int64_t)v;
}

/* The names in group `grp` (sorted by HDF5's name index), up to cap; returns the count. */
typedef struct names {
    int n, cap;
    char (*v)[128];
} names;

static herr_t collect(hid_t g, const char *name, const H5L_info_t *info, void *op) {
    names *ns = op;
    if (ns->n < ns->cap) snprintf(ns->v[ns->n++], 128, "%s", name);
    return 0;
}

static int list_group(const char *grp, char (*out)[128], int cap) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    names ns = {0, cap, out};
    hid_t f = H5Fopen(REF, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return 0;
    hid_t g = H5Gopen2(f, grp, H5P_DEFAULT);
    if (g >= 0) {
        hsize_t idx = 0;
        H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &ns);
        H5Gclose(g);
    }
    H5Fclose(f);
    CHECK(ns.n > 0, "%s: group %s is missing or empty (regenerate with tests/ref/make_image_ref.py)", REF, grp);
    return ns.n;
}

static void sha256(const void *p, size_t n, uint8_t out[32]) {
    unsigned len = 0;
    EVP_Digest(p, n, out, &len, EVP_sha256(), NULL);
}

/* Compares n bytes of ours with the reference group `grp`: its sha256 always, and its dataset
 * `ds` element by element when stored (elem bytes each: 1 = uint8 pixels, 4 = f32 bit patterns).
 * dims (h, w, c) only label the first difference. */
static bool check_bytes(const char *grp, const char *ds, const void *ours, size_t n, int elem, const char *what) {
    char path[512];
    size_t cnt = 0;
    snprintf(path, sizeof path, "%s/sha256", grp);
    int32_t *ref_hash = gm_test_h5_read(REF, path, 1, &cnt, NULL, NULL);
    uint8_t h[32];
    sha256(ours, n, h);
    bool ok = ref_hash && cnt == 32;
    for (int i = 0; ok && i < 32; i++) ok = h[i] == (uint8_t)ref_hash[i];
    gm_free(ref_hash);
    snprintf(path, sizeof path, "%s/%s", grp, ds);
    if (gm_test_h5_exists(REF, path)) {
        size_t m = 0;
        if (elem == 1) {
            int32_t *ref = gm_test_h5_read(REF, path, 1, &m, NULL, NULL);
            size_t first = SIZE_MAX, bad = 0;
            for (size_t i = 0; ref && i < m && i < n; i++)
                if (((const uint8_t *)ours)[i] != (uint8_t)ref[i]) bad++, first = first == SIZE_MAX ? i : first;
            CHECK(ref && m == n && bad == 0, "%s: %zu of %zu bytes differ from PIL; first at byte %zu: ours %d, PIL %d", what, bad, n,
                  first, first < n ? ((const uint8_t *)ours)[first] : -1, ref && first < m ? ref[first] : -1);
            gm_free(ref);
        } else {
            float *ref = gm_test_h5_read(REF, path, 0, &m, NULL, NULL);
            size_t first = SIZE_MAX, bad = 0;
            for (size_t i = 0; ref && i < m && i < n / 4; i++)
                if (memcmp((const float *)ours + i, ref + i, 4) != 0) bad++, first = first == SIZE_MAX ? i : first;
            CHECK(ref && m == n / 4 && bad == 0, "%s: %zu of %zu floats differ from transformers; first at %zu: ours %.9g, ref %.9g", what, bad,
                  n / 4, first, first < n / 4 ? (double)((const float *)ours)[first] : 0.0, ref && first < m ? (double)ref[first] : 0.0);
            gm_free(ref);
        }
    }
    CHECK(ok, "%s: sha256 of our %zu bytes differs from the reference's", what, n);
    return ok;
}

/* ---- decoding ------------------------------------------------------------------------------------ */

static char GOOD[64][128];
static int n_good;

static void test_decoded(void) {
    n_good = list_group("/decoded", GOOD, 64);
    CHECK(n_good >= 40, "only %d decoded references", n_good);
    for (int i = 0; i < n_good; i++) {
        char grp[256];
        snprintf(grp, sizeof grp, "/decoded/%.127s", GOOD[i]);
        gm_error err = {0};
        gm_image img = {0};
        gm_status s = gm_image_load(img_path(GOOD[i]), NULL, &img, &err);
        CHECK(s == GM_OK, "%s: %s", GOOD[i], err.msg);
        if (s != GM_OK) continue;
        int64_t w = attr_i(grp, "w"), h = attr_i(grp, "h");
        CHECK(img.w == w && img.h == h, "%s: %lld x %lld, PIL %lld x %lld", GOOD[i], (long long)img.w, (long long)img.h, (long long)w,
              (long long)h);
        if (img.w == w && img.h == h) check_bytes(grp, "rgb", img.rgb, (size_t)(w * h * 3), 1, GOOD[i]);
        gm_image_free(&img);
    }
    /* a buffer in memory decodes like the file */
    const char *names2[] = {"chelsea.png", "small_progressive.jpg", "interlaced_rgba16.png", "orient6.jpg"};
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(img_path(names2[i]), "rb");
        CHECK(f != NULL, "cannot open %s", names2[i]);
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        rewind(f);
        uint8_t *buf = malloc((size_t)n);
        size_t got = fread(buf, 1, (size_t)n, f);
        fclose(f);
        gm_error err = {0};
        gm_image a = {0}, b = {0};
        CHECK_OK(gm_image_decode(buf, got, names2[i], NULL, &a, &err), &err);
        CHECK_OK(gm_image_load(img_path(names2[i]), NULL, &b, &err), &err);
        CHECK(a.rgb && b.rgb && a.w == b.w && a.h == b.h && memcmp(a.rgb, b.rgb, (size_t)(a.w * a.h * 3)) == 0,
              "%s: decoded from memory differs from the file", names2[i]);
        gm_image_free(&a), gm_image_free(&b);
        gm_image_free(&a); /* twice: a no-op */
        free(buf);
    }
    gm_image_free(NULL);
}

/* ---- resize ------------------------------------------------------------------------------------- */

static void test_resize(void) {
    char cases[64][128];
    int n = list_group("/resize", cases, 64);
    for (int i = 0; i < n; i++) {
        char grp[256], src[128];
        snprintf(grp, sizeof grp, "/resize/%.127s", cases[i]);
        snprintf(src, sizeof src, "%.127s", cases[i]);
        *strrchr(src, '_') = '\0'; /* "<src>_<w>x<h>" */
        int64_t w = attr_i(grp, "w"), h = attr_i(grp, "h");
        gm_error err = {0};
        gm_image in = {0}, out = {0};
        if (strcmp(src, "tall_strip") == 0) {
            size_t m = 0;
            int64_t dims[4] = {0};
            int32_t *v = gm_test_h5_read(REF, "/resize_input/tall_strip", 1, &m, dims, NULL);
            if (!v) continue;
            in = (gm_image){.w = dims[1], .h = dims[0], .rgb = gm_malloc(m)};
            for (size_t j = 0; j < m; j++) in.rgb[j] = (uint8_t)v[j];
            gm_free(v);
        } else {
            gm_status s = gm_image_load(img_path(src), NULL, &in, &err);
            CHECK(s == GM_OK, "%s: %s", src, err.msg);
            if (s != GM_OK) continue;
        }
        gm_status s = gm_image_resize_bilinear(&in, w, h, &out, &err);
        CHECK(s == GM_OK, "resize %s: %s", cases[i], err.msg);
        if (s == GM_OK) {
            CHECK(out.w == w && out.h == h, "resize %s: got %lld x %lld", cases[i], (long long)out.w, (long long)out.h);
            char what[200];
            snprintf(what, sizeof what, "resize %s (%lld x %lld -> %lld x %lld)", src, (long long)in.w, (long long)in.h, (long long)w,
                     (long long)h);
            check_bytes(grp, "rgb", out.rgb, (size_t)(w * h * 3), 1, what);
        }
        gm_image_free(&in), gm_image_free(&out);
    }
    /* bad sizes */
    uint8_t px[3] = {1, 2, 3};
    gm_image one = {.w = 1, .h = 1, .rgb = px}, out = {0};
    gm_error err = {0};
    CHECK(gm_image_resize_bilinear(&one, 0, 5, &out, &err) == GM_ERR_INVALID && out.rgb == NULL, "resize to width 0 accepted");
    CHECK(gm_test_contains(err.msg, "0 x 5") && gm_test_contains(err.msg, "hint:"), "message: %s", err.msg);
    CHECK(gm_image_resize_bilinear(&one, 5, (int64_t)1 << 40, &out, &err) == GM_ERR_INVALID, "resize to 2^40 rows accepted");
}

/* ---- the processor ------------------------------------------------------------------------------ */

static void test_normalize_lut(void) {
    size_t m = 0;
    float *lut = gm_test_h5_read(REF, "/pixel_values/normalize_lut", 0, &m, NULL, NULL);
    if (!lut) return;
    uint8_t px[256 * 3];
    for (int i = 0; i < 256 * 3; i++) px[i] = (uint8_t)(i / 3);
    gm_image row = {.w = 256, .h = 1, .rgb = px};
    gm_image_opts o = gm_image_opts_gemma3(GM_IMAGE_GEMMA3_SIZE);
    float out[3 * 256];
    gm_image_normalize(&row, o.rescale, o.mean, o.std, out);
    int bad = 0;
    for (int c = 0; c < 3; c++)
        for (int u = 0; u < 256; u++) bad += memcmp(&out[c * 256 + u], &lut[u], 4) != 0;
    CHECK(m == 256 && bad == 0, "normalization: %d of 768 values differ from transformers' rescale+normalize", bad);
    gm_free(lut);
}

static void test_pixel_values(void) {
    char cases[64][128];
    int n = list_group("/pixel_values", cases, 64);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(cases[i], "normalize_lut") == 0) continue;
        char grp[256], src[128];
        snprintf(grp, sizeof grp, "/pixel_values/%.127s", cases[i]);
        int64_t S = attr_i(grp, "size"), nimg = attr_i(grp, "n"), ncrops = attr_i(grp, "num_crops"), pas = attr_i(grp, "pan_and_scan");
        /* "<src>_<S>" or "<src>_<S>_pas" */
        snprintf(src, sizeof src, "%.127s", cases[i]);
        if (pas) *strrchr(src, '_') = '\0';
        *strrchr(src, '_') = '\0';
        gm_image_opts o = gm_image_opts_gemma3(S);
        o.pan_and_scan = pas != 0;
        gm_image_pixels px = {0};
        gm_error err = {0};
        gm_status s = gm_image_preprocess_file(img_path(src), NULL, &o, &px, &err);
        CHECK(s == GM_OK, "%s: %s", cases[i], err.msg);
        if (s != GM_OK) continue;
        CHECK(px.n == nimg && px.n_crops == ncrops && px.size == S, "%s: %lld images (%lld crops), transformers %lld (%lld)", cases[i],
              (long long)px.n, (long long)px.n_crops, (long long)nimg, (long long)ncrops);
        if (px.n == nimg) check_bytes(grp, "values", px.data, (size_t)(px.n * 3 * S * S) * sizeof(float), 4, cases[i]);
        gm_image_pixels_free(&px);
        checked++;
    }
    CHECK(checked >= 40, "only %d pixel_values cases", checked);
}

static void test_pan_and_scan_rects(void) {
    size_t m = 0, k = 0;
    int32_t *sizes = gm_test_h5_read(REF, "/pan_and_scan/sizes", 1, &m, NULL, NULL);
    int32_t *minc = gm_test_h5_read(REF, "/pan_and_scan/min_crop", 1, &k, NULL, NULL);
    int32_t *maxc = gm_test_h5_read(REF, "/pan_and_scan/max_crops", 1, &k, NULL, NULL);
    double *ratio = gm_test_h5_read(REF, "/pan_and_scan/min_ratio", 2, &k, NULL, NULL);
    int32_t *count = gm_test_h5_read(REF, "/pan_and_scan/count", 1, &k, NULL, NULL);
    int32_t *rects = gm_test_h5_read(REF, "/pan_and_scan/rects", 1, &m, NULL, NULL);
    int with_crops = 0;
    for (size_t i = 0; sizes && minc && maxc && ratio && count && rects && i < k; i++) {
        gm_image_opts o = gm_image_opts_gemma3(GM_IMAGE_GEMMA3_SIZE);
        o.pas_min_crop_size = minc[i], o.pas_max_num_crops = maxc[i], o.pas_min_ratio = ratio[i];
        gm_image_rect r[GM_IMAGE_MAX_CROPS];
        int64_t w = sizes[2 * i], h = sizes[2 * i + 1];
        int64_t c = gm_image_pan_and_scan_crops(w, h, &o, r, GM_IMAGE_MAX_CROPS);
        bool ok = c == count[i];
        for (int64_t j = 0; ok && j < c; j++) {
            const int32_t *e = rects + (i * 8 + (size_t)j) * 4;
            ok = r[j].x == e[0] && r[j].y == e[1] && r[j].w == e[2] && r[j].h == e[3];
        }
        with_crops += c > 0;
        CHECK(ok, "pan & scan of %lld x %lld (min crop %d, max %d, ratio %g): %lld crops, transformers %d", (long long)w, (long long)h, minc[i],
              maxc[i], ratio[i], (long long)c, count[i]);
    }
    CHECK(k > 100 && with_crops > 50, "pan & scan table: %zu cases, %d with crops", k, with_crops);
    gm_free(sizes), gm_free(minc), gm_free(maxc), gm_free(ratio), gm_free(count), gm_free(rects);
    /* fewer slots than crops: the count is still returned, only `max` are written */
    gm_image_opts o = gm_image_opts_gemma3(GM_IMAGE_GEMMA3_SIZE);
    gm_image_rect one[1];
    CHECK(gm_image_pan_and_scan_crops(1000, 300, &o, one, 1) == 3 && one[0].w == 334, "pan & scan with one slot");
}

/* How far the PIL path is from transformers' default (torchvision) Gemma3ImageProcessor. */
static void test_torchvision_distance(void) {
    size_t m = 0, k = 0;
    float *lut = gm_test_h5_read(REF, "/torchvision/chelsea_896/lut", 0, &m, NULL, NULL);
    int32_t *diff = gm_test_h5_read(REF, "/torchvision/chelsea_896/diff", 1, &k, NULL, NULL);
    gm_image img = {0}, sized = {0};
    gm_image_pixels px = {0};
    gm_error err = {0};
    gm_image_opts o = gm_image_opts_gemma3(896);
    CHECK_OK(gm_image_load(img_path("chelsea.png"), NULL, &img, &err), &err);
    CHECK_OK(gm_image_resize_bilinear(&img, 896, 896, &sized, &err), &err);
    CHECK_OK(gm_image_preprocess(&img, &o, &px, &err), &err);
    if (lut && diff && sized.rgb && px.data && k == (size_t)3 * 896 * 896) {
        double worst = 0;
        size_t levels = 0;
        for (int c = 0; c < 3; c++)
            for (size_t i = 0; i < (size_t)896 * 896; i++) {
                int u = sized.rgb[i * 3 + c] + diff[c * 896 * 896 + i];
                float tv = lut[u < 0 ? 0 : u > 255 ? 255 : u], ours = px.data[c * 896 * 896 + i];
                double d = fabs((double)ours - (double)tv);
                worst = d > worst ? d : worst;
                levels += diff[c * 896 * 896 + i] != 0;
            }
        double recorded = -1;
        gm_test_h5_attr_double(REF, "/torchvision/chelsea_896", "max_abs_diff", &recorded);
        printf("torchvision Gemma3ImageProcessor vs ours, chelsea.png at 896: max |diff| %.9g (%zu of %zu values one 8-bit level "
               "apart)\n",
               worst, levels, k);
        CHECK(worst <= TOL_IMAGE_TORCHVISION_ABS, "torchvision distance %.9g above the bound %g", worst, TOL_IMAGE_TORCHVISION_ABS);
        CHECK(worst == recorded, "distance %.9g, the generator measured %.9g between the two transformers processors", worst, recorded);
    }
    gm_free(lut), gm_free(diff);
    gm_image_free(&img), gm_image_free(&sized), gm_image_pixels_free(&px);
}

/* ---- errors, limits, allocation failures ------------------------------------------------------------ */

static void test_bad_files(void) {
    static const struct {
        const char *file;
        gm_status code;
        const char *why, *why2;
    } bad[] = {
        {"bad/truncated.jpg", GM_ERR_FORMAT, "corrupt or truncated JPEG", "Premature end"},
        {"bad/truncated.png", GM_ERR_FORMAT, "corrupt or truncated PNG", "unexpected end of file"},
        {"bad/truncated_header.png", GM_ERR_FORMAT, "corrupt or truncated PNG", "unexpected end of file"},
        {"bad/corrupt.jpg", GM_ERR_FORMAT, "corrupt or truncated JPEG", "Corrupt JPEG data"},
        {"bad/corrupt.png", GM_ERR_FORMAT, "corrupt or truncated PNG", "IDAT"}, /* zlib notices before the CRC */
        {"bad/empty.png", GM_ERR_FORMAT, "empty file (0 bytes)", "hint:"},
        {"bad/image.gif", GM_ERR_UNSUPPORTED, "a GIF image, not PNG or JPEG", "convert"},
        {"bad/image.bmp", GM_ERR_UNSUPPORTED, "a BMP image", "convert"},
        {"bad/image.webp", GM_ERR_UNSUPPORTED, "a WebP image", "convert"},
        {"bad/image.tiff", GM_ERR_UNSUPPORTED, "a TIFF image", "convert"},
        {"bad/text.png", GM_ERR_UNSUPPORTED, "not a PNG or JPEG file", "54 68 69 73"},
        {"bad/huge.png", GM_ERR_LIMIT, "100000 x 100000", "89478485"},
        {"bad/huge.jpg", GM_ERR_LIMIT, "60000 x 60000", "89478485"},
        {"bad/huge_chunk.png", GM_ERR_FORMAT, "corrupt or truncated PNG", "chunk data is too large"},
        {"bad/no_such_file.png", GM_ERR_IO, "cannot open", "No such file"},
        {"bad", GM_ERR_IO, "is a folder", "hint:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[2048];
        snprintf(path, sizeof path, "%s", img_path(bad[i].file));
        uint64_t live = gm_alloc_get_stats().bytes_live;
        gm_alloc_reset_counters();
        gm_error err = {0};
        gm_image img = {0};
        gm_status s = gm_image_load(path, NULL, &img, &err);
        gm_alloc_stats st = gm_alloc_get_stats();
        CHECK(s == bad[i].code, "%s: %s, expected %s: %s", bad[i].file, gm_status_name(s), gm_status_name(bad[i].code), err.msg);
        CHECK(gm_test_contains(err.msg, path) && gm_test_contains(err.msg, bad[i].why) && gm_test_contains(err.msg, bad[i].why2) &&
                  gm_test_contains(err.msg, "hint:"),
              "%s: message lacks the path, '%s', '%s' or a hint: %s", bad[i].file, bad[i].why, bad[i].why2, err.msg);
        CHECK(img.rgb == NULL && img.w == 0 && img.h == 0, "%s: output written on failure", bad[i].file);
        CHECK(st.bytes_live == live, "%s: %llu bytes leaked", bad[i].file, (unsigned long long)(st.bytes_live - live));
        /* the size check comes before any pixel buffer: a few KiB of libpng state at most */
        CHECK(st.bytes_peak - live < (1u << 20), "%s: %llu bytes allocated before failing", bad[i].file,
              (unsigned long long)(st.bytes_peak - live));
    }
    /* the same from memory: a name stands for the file */
    gm_error err = {0};
    gm_image img = {0};
    CHECK(gm_image_decode("", 0, "clipboard", NULL, &img, &err) == GM_ERR_FORMAT && gm_test_contains(err.msg, "clipboard: empty file"),
          "empty buffer: %s", err.msg);
    CHECK(gm_image_decode("GIF89a\1\0\1\0", 10, "paste.gif", NULL, &img, &err) == GM_ERR_UNSUPPORTED &&
              gm_test_contains(err.msg, "paste.gif: this is a GIF image"),
          "GIF buffer: %s", err.msg);
    static const struct {
        char head[16]; /* zero-padded */
        const char *kind;
    } sn[] = {{"\x89PNG\r\n\x1a\n", "PNG"}, {"\xff\xd8\xff\xe0", "JPEG"}, {"RIFF\0\0\0\0WEBPVP8 ", "WebP"},
              {"\0\0\0\x1c" "ftypavif", "AVIF"}, {"\0\0\0\x18" "ftypheic", "HEIF"}, {"%PDF-1.7", "PDF"}, {"8BPS", "Photoshop PSD"}};
    for (size_t i = 0; i < sizeof sn / sizeof sn[0]; i++) {
        const char *k = gm_image_sniff(sn[i].head, 12);
        CHECK(k && strcmp(k, sn[i].kind) == 0, "sniff %s: %s", sn[i].kind, k ? k : "(null)");
    }
    CHECK(gm_image_sniff("hello world!", 12) == NULL, "sniff of text");
}

static void test_limits(void) {
    const char *files[] = {"chelsea.png", "chelsea.jpg", "interlaced.png"};
    for (int i = 0; i < 3; i++) {
        gm_image img = {0};
        gm_error err = {0};
        CHECK_OK(gm_image_load(img_path(files[i]), NULL, &img, &err), &err);
        int64_t px = img.w * img.h;
        gm_image_free(&img);
        /* exactly at the limit: fine; one pixel less: refused, before the (h, w, 3) buffer exists */
        gm_image_limits at = {.max_pixels = px}, below = {.max_pixels = px - 1};
        CHECK_OK(gm_image_load(img_path(files[i]), &at, &img, &err), &err);
        gm_image_free(&img);
        uint64_t live = gm_alloc_get_stats().bytes_live;
        gm_alloc_reset_counters();
        gm_status s = gm_image_load(img_path(files[i]), &below, &img, &err);
        gm_alloc_stats st = gm_alloc_get_stats();
        CHECK(s == GM_ERR_LIMIT && gm_test_contains(err.msg, "more than the limit"), "%s below its size: %s", files[i], err.msg);
        CHECK(st.bytes_peak - live < (uint64_t)px * 3, "%s: %llu bytes allocated before the limit was checked", files[i],
              (unsigned long long)(st.bytes_peak - live));
        CHECK(st.bytes_live == live, "%s: leak after the limit error", files[i]);
    }
    CHECK(GM_IMAGE_MAX_PIXELS == 1024 * 1024 * 1024 / 4 / 3, "GM_IMAGE_MAX_PIXELS is PIL's Image.MAX_IMAGE_PIXELS");
    double pil = 0;
    CHECK(gm_test_h5_attr_double(REF, "/", "pil_max_image_pixels", &pil) && pil == GM_IMAGE_MAX_PIXELS, "PIL's limit %g", pil);
}

/* Every allocation of a decode (libpng's included) and of the preprocessing fails in turn: each
 * run ends in GM_OK or GM_ERR_NOMEM, never anything else, and leaks nothing. */
static void test_alloc_failures(void) {
    const char *files[] = {"rgba.png", "interlaced_rgba16.png", "palette_trns.png", "orient6.png", "small.jpg", "orient8.jpg"};
    for (int i = 0; i < 6; i++) {
        int runs = 0, nomem = 0;
        for (uint64_t n = 1; n < 400; n++) {
            uint64_t live = gm_alloc_get_stats().bytes_live;
            gm_alloc_fail_after(n);
            gm_image img = {0};
            gm_image_pixels px = {0};
            gm_error err = {0};
            gm_image_opts o = gm_image_opts_gemma3(24);
            gm_status s = gm_image_preprocess_file(img_path(files[i]), NULL, &o, &px, &err);
            bool pending = gm_alloc_fail_pending();
            gm_alloc_fail_after(0);
            runs++;
            nomem += s == GM_ERR_NOMEM;
            CHECK(s == GM_OK || (s == GM_ERR_NOMEM && gm_test_contains(err.msg, "out of memory")),
                  "%s, allocation %llu failing: %s: %s", files[i], (unsigned long long)n, gm_status_name(s), err.msg);
            gm_image_pixels_free(&px);
            gm_image_free(&img);
            CHECK(gm_alloc_get_stats().bytes_live == live, "%s, allocation %llu failing: leak", files[i], (unsigned long long)n);
            if (pending) break; /* the run needed fewer than n allocations: all were covered */
        }
        CHECK(nomem > 0 && runs < 399, "%s: %d runs, %d out-of-memory", files[i], runs, nomem);
    }
}

static void test_api_errors(void) {
    gm_image img = {0}, out = {0};
    gm_error err = {0};
    CHECK_OK(gm_image_load(img_path("small.jpg"), NULL, &img, &err), &err);
    if (!img.rgb) return;
    CHECK(gm_image_crop(&img, (gm_image_rect){100, 0, 21, 10}, &out, &err) == GM_ERR_INVALID && out.rgb == NULL, "crop past the edge");
    CHECK(gm_image_crop(&img, (gm_image_rect){0, 0, 0, 10}, &out, &err) == GM_ERR_INVALID, "empty crop");
    CHECK_OK(gm_image_crop(&img, (gm_image_rect){100, 70, 20, 10}, &out, &err), &err);
    CHECK(out.w == 20 && out.h == 10 && memcmp(out.rgb, img.rgb + (70 * 120 + 100) * 3, 60) == 0, "crop contents");
    gm_image_free(&out);
    gm_image_opts o = gm_image_opts_gemma3(0);
    gm_image_pixels px = {0};
    CHECK(gm_image_preprocess(&img, &o, &px, &err) == GM_ERR_INVALID && px.data == NULL, "size 0 accepted");
    o = gm_image_opts_gemma3(32);
    o.pan_and_scan = true, o.pas_max_num_crops = 0;
    CHECK(gm_image_preprocess(&img, &o, &px, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "max crops"), "0 crops: %s", err.msg);
    o.pas_max_num_crops = 4;
    CHECK_OK(gm_image_preprocess(&img, &o, &px, &err), &err); /* 120 x 80: ratio 1.5, but crops of 60 < 256 */
    CHECK(px.n == 1 && px.n_crops == 0, "small image got %lld crops", (long long)px.n_crops);
    gm_image_pixels_free(&px);
    gm_image_pixels_free(NULL);
    gm_image_free(&img);
}

int main(void) {
    snprintf(REF, sizeof REF, "%s", gm_test_path("tests/ref/image_ref.h5"));
    if (!gm_test_file_exists(REF)) {
        CHECK(0, "missing %s (tests/ref/make_image_ref.py)", REF);
        return gm_test_finish();
    }
    double t0 = gm_test_now_s();
    test_decoded();
    test_resize();
    test_normalize_lut();
    test_pixel_values();
    test_pan_and_scan_rects();
    test_torchvision_distance();
    test_bad_files();
    test_limits();
    test_alloc_failures();
    test_api_errors();
    printf("test_image: %.1f s\n", gm_test_now_s() - t0);
    return gm_test_finish();
}
