/*
 * test_image.c - core/image against Pillow 13 and transformers 5.24, bit for bit: decoded RGB of
 * every good fixture (PNG modes, JPEG colour spaces, EXIF/XMP orientations), Image.resize
 * BILINEAR at many sizes and BICUBIC (Gemma 4's resample) at a few, Gemma3ImageProcessorPil's pixel_values (with and without pan & scan),
 * the pan & scan rectangles; the distance to the default torchvision processor (a measured bound);
 * every bad file's error (message names the file and the reason, nothing leaks), the pixel limit
 * checked before allocation, and allocation failures at every point. Image references: the
 * "#xywh=X,Y,W,H" region parser (valid, malformed, '#' in plain names), the crop after EXIF
 * orientation, regions outside their file, a region's identity (sha256 of the file's bytes and the
 * normalized fragment), the check cache, and the batch loader on regions of one sheet (timed on
 * OpenCV's digits.png when opencv-doc is installed).
 *
 * Reference: tests/ref/image_ref.h5 and tests/ref/images/, written by tests/ref/make_image_ref.py
 * (tests/ref/README.md); tests/ref/image_bicubic_ref.h5 by tests/ref/make_image_bicubic_ref.py. Large references are stored as the sha256 of their bytes; small ones as
 * arrays too, so a failure shows the first differing pixel.
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_data.h"
#include "gm_image.h"

#include <hdf5.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int list_group_in(const char *file, const char *grp, char (*out)[128], int cap) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    names ns = {0, cap, out};
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return 0;
    hid_t g = H5Gopen2(f, grp, H5P_DEFAULT);
    if (g >= 0) {
        hsize_t idx = 0;
        H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &ns);
        H5Gclose(g);
    }
    H5Fclose(f);
    CHECK(ns.n > 0, "%s: group %s is missing or empty (regenerate with its tests/ref/make_image*_ref.py)", file, grp);
    return ns.n;
}

static int list_group(const char *grp, char (*out)[128], int cap) { return list_group_in(REF, grp, out, cap); }

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

/* Image.resize((w, h), Image.BICUBIC) (Gemma 4's resample) against tests/ref/image_bicubic_ref.h5
 * (tests/ref/make_image_bicubic_ref.py): per input file, the output sizes and the sha256 of each
 * output, the small outputs themselves. Up, down, non-square, one axis up and one down, one axis
 * only, the vertical-first order, 1 x 1, a copy. Then gm_image_preprocess with opts.filter =
 * GM_IMAGE_BICUBIC resizes with it, and an unknown filter is refused. */
static void test_resize_bicubic(void) {
    char ref[1024];
    snprintf(ref, sizeof ref, "%s", gm_test_path("tests/ref/image_bicubic_ref.h5"));
    CHECK(gm_test_file_exists(ref), "missing %s (tests/ref/make_image_bicubic_ref.py)", ref);
    char srcs[8][128];
    int nsrc = gm_test_file_exists(ref) ? list_group_in(ref, "/resize_bicubic", srcs, 8) : 0, checked = 0, differs_from_bilinear = 0;
    for (int i = 0; i < nsrc; i++) {
        char path[512];
        size_t ns = 0, nh = 0;
        snprintf(path, sizeof path, "/resize_bicubic/%.127s/sizes", srcs[i]);
        int32_t *sizes = gm_test_h5_read(ref, path, 1, &ns, NULL, NULL);
        snprintf(path, sizeof path, "/resize_bicubic/%.127s/sha256", srcs[i]);
        int32_t *hashes = gm_test_h5_read(ref, path, 1, &nh, NULL, NULL);
        gm_error err = {0};
        gm_image in = {0};
        gm_status s = gm_image_load(img_path(srcs[i]), NULL, &in, &err);
        CHECK(s == GM_OK, "%s: %s", srcs[i], err.msg);
        CHECK(sizes && hashes && ns % 2 == 0 && nh == ns / 2 * 32, "%s: bad sizes/sha256 in %s", srcs[i], ref);
        for (size_t c = 0; s == GM_OK && sizes && hashes && nh == ns / 2 * 32 && c < ns / 2; c++) {
            int64_t w = sizes[2 * c], h = sizes[2 * c + 1];
            char what[256];
            snprintf(what, sizeof what, "bicubic resize %.127s (%lld x %lld -> %lld x %lld)", srcs[i], (long long)in.w, (long long)in.h, (long long)w,
                     (long long)h);
            gm_image out = {0}, bil = {0};
            gm_status r = gm_image_resize(&in, w, h, GM_IMAGE_BICUBIC, &out, &err);
            CHECK(r == GM_OK && out.w == w && out.h == h, "%s: %s", what, err.msg);
            if (r != GM_OK) continue;
            const size_t n = (size_t)(w * h * 3);
            /* the stored pixels, when small: the first differing byte */
            snprintf(path, sizeof path, "/resize_bicubic/%.127s/rgb_%lldx%lld", srcs[i], (long long)w, (long long)h);
            if (gm_test_h5_exists(ref, path)) {
                size_t m = 0, bad = 0, first = SIZE_MAX;
                int32_t *want = gm_test_h5_read(ref, path, 1, &m, NULL, NULL);
                for (size_t j = 0; want && j < m && j < n; j++)
                    if (out.rgb[j] != (uint8_t)want[j]) bad++, first = first == SIZE_MAX ? j : first;
                CHECK(want && m == n && bad == 0, "%s: %zu of %zu bytes differ from PIL; first at byte %zu (pixel %zu, %zu): ours %d, PIL %d", what,
                      bad, n, first, first / 3 % (size_t)w, first / 3 / (size_t)w, first < n ? out.rgb[first] : -1,
                      want && first < m ? want[first] : -1);
                gm_free(want);
            }
            /* every case: sha256 of the bytes */
            uint8_t hsh[32];
            sha256(out.rgb, n, hsh);
            bool ok = true;
            for (int j = 0; j < 32; j++) ok = ok && hsh[j] == (uint8_t)hashes[c * 32 + j];
            CHECK(ok, "%s: sha256 of our %zu bytes differs from Pillow's Image.BICUBIC", what, n);
            checked++;
            /* and the filter is not bilinear's */
            CHECK_OK(gm_image_resize(&in, w, h, GM_IMAGE_BILINEAR, &bil, &err), &err);
            differs_from_bilinear += bil.rgb && memcmp(bil.rgb, out.rgb, n) != 0;
            gm_image_free(&out), gm_image_free(&bil);
        }
        gm_free(sizes), gm_free(hashes);
        gm_image_free(&in);
    }
    CHECK(checked >= 12 && differs_from_bilinear >= 11, "only %d bicubic cases checked (%d differ from bilinear)", checked, differs_from_bilinear);

    /* the processor with opts.filter: pixel_values = normalize(resize bicubic); the default (zero)
     * is bilinear */
    gm_error err = {0};
    gm_image img = {0}, sized = {0};
    CHECK_OK(gm_image_load(img_path("small.jpg"), NULL, &img, &err), &err);
    gm_image_opts o = gm_image_opts_gemma3(48);
    CHECK(o.filter == GM_IMAGE_BILINEAR, "Gemma 3's options resize bilinear");
    o.filter = GM_IMAGE_BICUBIC;
    gm_image_pixels px = {0};
    float *want = malloc(3 * 48 * 48 * sizeof(float));
    if (img.rgb) CHECK_OK(gm_image_preprocess(&img, &o, &px, &err), &err);
    if (img.rgb) CHECK_OK(gm_image_resize(&img, 48, 48, GM_IMAGE_BICUBIC, &sized, &err), &err);
    if (sized.rgb) gm_image_normalize(&sized, o.rescale, o.mean, o.std, want);
    CHECK(px.data && sized.rgb && memcmp(px.data, want, 3 * 48 * 48 * sizeof(float)) == 0, "preprocess with GM_IMAGE_BICUBIC");
    gm_image_pixels_free(&px), gm_image_free(&sized);
    /* unknown filters */
    o.filter = (gm_image_filter)2;
    gm_status s = img.rgb ? gm_image_preprocess(&img, &o, &px, &err) : GM_ERR_INVALID;
    CHECK(s == GM_ERR_INVALID && px.data == NULL && gm_test_contains(err.msg, "unknown filter 2"), "preprocess, filter 2: %s", err.msg);
    s = img.rgb ? gm_image_resize(&img, 4, 4, (gm_image_filter)-1, &sized, &err) : GM_ERR_INVALID;
    CHECK(s == GM_ERR_INVALID && sized.rgb == NULL && gm_test_contains(err.msg, "unknown filter -1") && gm_test_contains(err.msg, "hint:"),
          "resize, filter -1: %s", err.msg);
    free(want);
    gm_image_free(&img);
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

/* ---- image references ------------------------------------------------------------------------ */

/* The parser: what is a region, what is a plain path, and what is refused with the reference named. */
static void test_ref_parse(void) {
    char path[64];
    gm_image_rect r;
    bool has = false;
    gm_error err = {0};
    static const struct { const char *ref, *path; gm_image_rect r; } good[] = {
        {"a/b.png#xywh=1,2,3,4", "a/b.png", {1, 2, 3, 4}},
        {"a/b.png#xywh=pixel:1,2,3,4", "a/b.png", {1, 2, 3, 4}},
        {"s.png#xywh=0020,0,20,020", "s.png", {20, 0, 20, 20}},          /* leading zeros: still digits */
        {"x#1.png#xywh=0,0,2147483647,1", "x#1.png", {0, 0, 2147483647, 1}}, /* a '#' in the name, then a region */
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        has = false;
        CHECK_OK(gm_image_ref_parse(good[i].ref, path, sizeof path, &r, &has, &err), &err);
        CHECK(has && strcmp(path, good[i].path) == 0 && r.x == good[i].r.x && r.y == good[i].r.y && r.w == good[i].r.w &&
                  r.h == good[i].r.h,
              "%s -> '%s' %lld,%lld,%lld,%lld", good[i].ref, path, (long long)r.x, (long long)r.y, (long long)r.w, (long long)r.h);
    }
    /* not a fragment: a '#' that belongs to the file's name */
    static const char *plain[] = {"a.png", "a#1.png", "a.png#top", "a.png#xywh", "#notes.png", "dir#xywh=1/file.png", "a.png#XYWH=1,2,3,4"};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        has = true;
        r = (gm_image_rect){7, 7, 7, 7};
        CHECK_OK(gm_image_ref_parse(plain[i], path, sizeof path, &r, &has, &err), &err);
        CHECK(!has && strcmp(path, plain[i]) == 0 && r.x == 7, "%s is a plain path: got '%s' has_rect %d", plain[i], path, has);
    }
    /* malformed regions: GM_ERR_INVALID naming the reference, outputs untouched */
    static const struct { const char *ref, *why; } bad[] = {
        {"s.png#xywh=1,2,3", "expected #xywh=X,Y,W,H"},  {"s.png#xywh=1,2,3,4,5", "expected #xywh=X,Y,W,H"},
        {"s.png#xywh=-1,0,2,2", "no signs"},              {"s.png#xywh=+1,0,2,2", "no signs"},
        {"s.png#xywh=1.5,0,2,2", "whole numbers"},        {"s.png#xywh= 1,0,2,2", "no signs or spaces"},
        {"s.png#xywh=1,0,2,2 ", "whole numbers"},         {"s.png#xywh=", "expected #xywh=X,Y,W,H"},
        {"s.png#xywh=a,b,c,d", "whole numbers"},          {"s.png#xywh=1,,2,2", "whole numbers"},
        {"s.png#xywh=2147483648,0,1,1", "at most 2147483647"}, {"s.png#xywh=0,0,0,5", "the region is empty"},
        {"s.png#xywh=0,0,5,0", "the region is empty"},    {"s.png#xywh=percent:0,0,50,50", "percent regions are not supported"},
        {"#xywh=0,0,1,1", "no file before the region"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        has = false;
        strcpy(path, "untouched");
        gm_status s = gm_image_ref_parse(bad[i].ref, path, sizeof path, &r, &has, &err);
        CHECK(s == GM_ERR_INVALID && !has && strcmp(path, "untouched") == 0 && gm_test_contains(err.msg, bad[i].ref) &&
                  gm_test_contains(err.msg, bad[i].why),
              "%s: %s: %s", bad[i].ref, gm_status_name(s), err.msg);
    }
    /* a path that does not fit the caller's buffer */
    char small[8];
    CHECK(gm_image_ref_parse("abcdefgh.png#xywh=0,0,1,1", small, sizeof small, &r, &has, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "longer than 7"),
          "long path: %s", err.msg);
    char frag[96];
    gm_image_ref_fragment((gm_image_rect){20, 0, 20, 20}, frag, sizeof frag);
    CHECK(strcmp(frag, "#xywh=20,0,20,20") == 0, "fragment %s", frag);
}

/* sha256 of n bytes of a file, then `more`, as hex. */
static void sha_file_plus(const char *path, const char *more, char hex[65]) {
    FILE *f = fopen(path, "rb");
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    unsigned char buf[4096], md[32];
    size_t n;
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(c, buf, n);
    if (f) fclose(f);
    EVP_DigestUpdate(c, more, strlen(more));
    unsigned int len = 0;
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Loading a region: the crop of the oriented image; outside the image: refused with its size;
 * a file whose name holds '#'; the processor on a region; gm_image_check's identity and cache. */
static void test_ref_load(void) {
    gm_error err = {0};
    char ref[2300];
    gm_image full = {0}, cell = {0}, want = {0};
    /* after EXIF orientation: orient6.jpg is stored landscape and decodes portrait */
    CHECK_OK(gm_image_load(img_path("orient6.jpg"), NULL, &full, &err), &err);
    if (!full.rgb) return;
    gm_image_rect r = {full.w - 7, full.h - 5, 7, 5}; /* the bottom-right corner, inside only once rotated */
    snprintf(ref, sizeof ref, "%s#xywh=%lld,%lld,7,5", img_path("orient6.jpg"), (long long)r.x, (long long)r.y);
    CHECK_OK(gm_image_load_ref(ref, NULL, &cell, &err), &err);
    CHECK_OK(gm_image_crop(&full, r, &want, &err), &err);
    CHECK(cell.rgb && want.rgb && cell.w == 7 && cell.h == 5 && memcmp(cell.rgb, want.rgb, 7 * 5 * 3) == 0,
          "orient6.jpg region: %lld x %lld, pixels %s", (long long)cell.w, (long long)cell.h,
          cell.rgb && want.rgb && memcmp(cell.rgb, want.rgb, 105) == 0 ? "equal" : "differ");
    gm_image_free(&cell), gm_image_free(&want);
    /* one column too far: the reference and the decoded size are named */
    snprintf(ref, sizeof ref, "%s#xywh=%lld,0,8,5", img_path("orient6.jpg"), (long long)(full.w - 7));
    char size[64];
    snprintf(size, sizeof size, "%lld x %lld pixels", (long long)full.w, (long long)full.h);
    gm_status s = gm_image_load_ref(ref, NULL, &cell, &err);
    CHECK(s == GM_ERR_INVALID && cell.rgb == NULL && gm_test_contains(err.msg, ref) && gm_test_contains(err.msg, size),
          "region past the edge: %s: %s", gm_status_name(s), err.msg);
    char sha[65];
    int64_t w = 0, h = 0;
    s = gm_image_check(NULL, ref, sha, &w, &h, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, size), "gm_image_check, region past the edge: %s", err.msg);
    gm_image_free(&full);

    /* a plain file whose name holds '#' (and one that looks like a fragment but has a '/' after) */
    char dir[256], named[512], sub[512];
    if (gm_test_make_tmpdir("image_ref", dir, sizeof dir)) {
        snprintf(named, sizeof named, "%s/x#1.png", dir);
        snprintf(sub, sizeof sub, "%s/d#xywh=1", dir);
        FILE *in = fopen(img_path("palette.png"), "rb"), *out = fopen(named, "wb");
        char buf[4096];
        size_t n;
        while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
        if (in) fclose(in);
        if (out) fclose(out);
        gm_image a = {0}, b = {0};
        CHECK_OK(gm_image_load_ref(named, NULL, &a, &err), &err);
        CHECK_OK(gm_image_load(img_path("palette.png"), NULL, &b, &err), &err);
        CHECK(a.rgb && b.rgb && a.w == b.w && a.h == b.h && memcmp(a.rgb, b.rgb, (size_t)(a.w * a.h * 3)) == 0, "x#1.png read as a plain file");
        gm_image_free(&a);
        snprintf(ref, sizeof ref, "%s#xywh=1,1,2,2", named);
        CHECK_OK(gm_image_load_ref(ref, NULL, &a, &err), &err);
        CHECK(a.rgb && a.w == 2 && a.h == 2 && memcmp(a.rgb, b.rgb + (1 * b.w + 1) * 3, 6) == 0, "region of x#1.png");
        gm_image_free(&a), gm_image_free(&b);
        unlink(named);
        gm_test_remove_tmpdir(dir);
    }

    /* the processor on a region equals the processor on the cropped image */
    gm_image_opts o = gm_image_opts_gemma3(24);
    gm_image_pixels p1 = {0}, p2 = {0};
    snprintf(ref, sizeof ref, "%s#xywh=10,20,40,30", img_path("small.jpg"));
    CHECK_OK(gm_image_preprocess_file(ref, NULL, &o, &p1, &err), &err);
    CHECK_OK(gm_image_load(img_path("small.jpg"), NULL, &full, &err), &err);
    if (full.rgb) CHECK_OK(gm_image_crop(&full, (gm_image_rect){10, 20, 40, 30}, &cell, &err), &err);
    if (cell.rgb) CHECK_OK(gm_image_preprocess(&cell, &o, &p2, &err), &err);
    CHECK(p1.data && p2.data && memcmp(p1.data, p2.data, 3 * 24 * 24 * sizeof(float)) == 0, "preprocess_file of a region");
    gm_image_pixels_free(&p1), gm_image_pixels_free(&p2);
    gm_image_free(&cell), gm_image_free(&full);

    /* identity: sha256(file bytes || normalized fragment); another spelling of the region hashes
     * the same, another region differently, the file alone as its bytes; a cache gives the same */
    gm_image_check_cache *cache = gm_image_check_cache_new();
    CHECK(cache != NULL, "cache");
    char want_sha[65], file_sha[65], sha2[65], sha3[65];
    sha_file_plus(img_path("small.jpg"), "#xywh=10,20,40,30", want_sha);
    sha_file_plus(img_path("small.jpg"), "", file_sha);
    for (int pass = 0; pass < 2; pass++) {
        gm_image_check_cache *c = pass ? cache : NULL;
        CHECK_OK(gm_image_check(c, ref, sha, &w, &h, &err), &err);
        CHECK(strcmp(sha, want_sha) == 0 && w == 120 && h == 80, "region sha %s (want %s), size %lld x %lld (the file's)", sha, want_sha,
              (long long)w, (long long)h);
        snprintf(ref, sizeof ref, "%s#xywh=pixel:010,20,40,030", img_path("small.jpg"));
        CHECK_OK(gm_image_check(c, ref, sha2, &w, &h, &err), &err);
        snprintf(ref, sizeof ref, "%s#xywh=11,20,40,30", img_path("small.jpg"));
        CHECK_OK(gm_image_check(c, ref, sha3, &w, &h, &err), &err);
        CHECK(strcmp(sha2, want_sha) == 0 && strcmp(sha3, want_sha) != 0, "another spelling: same sha; another region: another");
        CHECK_OK(gm_image_check(c, img_path("small.jpg"), sha, &w, &h, &err), &err);
        CHECK(strcmp(sha, file_sha) == 0, "plain file: its bytes' sha256");
        snprintf(ref, sizeof ref, "%s#xywh=10,20,40,30", img_path("small.jpg"));
    }
    /* a missing file: the same error on every reference to it, from the cache too */
    for (int i = 0; i < 2; i++) {
        s = gm_image_check(cache, "/nonexistent/sheet.png#xywh=0,0,1,1", sha, &w, &h, &err);
        CHECK(s == GM_ERR_IO && gm_test_contains(err.msg, "/nonexistent/sheet.png: cannot open"), "missing sheet, time %d: %s", i, err.msg);
    }
    gm_image_check_cache_free(cache);
    gm_image_check_cache_free(NULL);
}

/* gm_batch_images on regions of one sheet (and a plain file between them): each image equals the
 * processor on its cell; then, with OpenCV's digits.png, the cost of validating its 5,000 cells
 * and of one batch of 8 cells (printed; the bounds are generous for a loaded 2-core machine). */
static void test_ref_batch(void) {
    gm_error err = {0};
    const int64_t S = 16;
    char refs[4][2300];
    snprintf(refs[0], sizeof refs[0], "%s#xywh=0,0,20,20", img_path("small.jpg"));
    snprintf(refs[1], sizeof refs[1], "%s#xywh=100,60,20,20", img_path("small.jpg"));
    snprintf(refs[2], sizeof refs[2], "%s", img_path("palette.png"));
    snprintf(refs[3], sizeof refs[3], "%s#xywh=20,0,20,20", img_path("small.jpg"));
    gm_dataset ds;
    gm_dataset_init(&ds);
    gm_example ex[4] = {0};
    char *imgs[4] = {refs[0], refs[1], refs[2], refs[3]};
    for (int i = 0; i < 4; i++) ex[i].images = &imgs[i], ex[i].n_images = 1;
    ds.ex = ex, ds.n = 4;
    int64_t idx[5] = {0, 1, 2, 3, 1}, n = 0;
    float *px = calloc(5 * 3 * S * S, sizeof(float));
    CHECK_OK(gm_batch_images(&ds, idx, 5, S, 5, px, NULL, &n, &err), &err);
    CHECK(n == 5, "%lld images", (long long)n);
    gm_image_opts o = gm_image_opts_gemma3(S);
    for (int b = 0; b < 5; b++) {
        gm_image_pixels one = {0};
        CHECK_OK(gm_image_preprocess_file(refs[idx[b]], NULL, &o, &one, &err), &err);
        CHECK(one.data && memcmp(one.data, px + b * 3 * S * S, (size_t)(3 * S * S) * sizeof(float)) == 0, "batch image %d (%s)", b, refs[idx[b]]);
        gm_image_pixels_free(&one);
    }
    /* a region outside its file: named, with the file's size */
    snprintf(refs[3], sizeof refs[3], "%s#xywh=110,0,20,20", img_path("small.jpg"));
    gm_status s = gm_batch_images(&ds, idx, 4, S, 5, px, NULL, &n, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, refs[3]) && gm_test_contains(err.msg, "120 x 80 pixels"), "batch, bad region: %s", err.msg);
    free(px);

    const char *digits = "/usr/share/doc/opencv-doc/examples/data/digits.png";
    if (!gm_test_file_exists(digits)) {
        printf("skip  timing on %s (Debian's opencv-doc is not installed)\n", digits);
        return;
    }
    gm_image_check_cache *cache = gm_image_check_cache_new();
    double t0 = gm_test_now_s();
    char sha[65];
    int64_t w = 0, h = 0;
    int bad = 0;
    for (int i = 0; i < 5000; i++) {
        snprintf(refs[0], sizeof refs[0], "%s#xywh=%d,%d,20,20", digits, (i % 100) * 20, (i / 100) * 20);
        bad += gm_image_check(cache, refs[0], sha, &w, &h, &err) != GM_OK;
    }
    double t_check = gm_test_now_s() - t0;
    gm_image_check_cache_free(cache);
    CHECK(bad == 0 && w == 2000 && h == 1000, "digits.png: %d cells refused (%s), %lld x %lld", bad, err.msg, (long long)w, (long long)h);
    CHECK(t_check < 5.0, "checking digits.png's 5,000 cells took %.2f s", t_check);
    /* one batch of 8 cells of the sheet at Gemma 3's 896 x 896 */
    const int64_t S2 = GM_IMAGE_GEMMA3_SIZE, B = 8;
    char bref[8][200];
    char *bimgs[8];
    gm_example bex[8] = {0};
    for (int i = 0; i < B; i++) {
        snprintf(bref[i], sizeof bref[i], "%s#xywh=%d,%d,20,20", digits, (i * 37 % 100) * 20, (i * 7 % 50) * 20);
        bimgs[i] = bref[i], bex[i].images = &bimgs[i], bex[i].n_images = 1;
    }
    gm_dataset bds = {.ex = bex, .n = B};
    int64_t bidx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *bpx = malloc((size_t)(B * 3 * S2 * S2) * sizeof(float));
    t0 = gm_test_now_s();
    CHECK_OK(gm_batch_images(&bds, bidx, B, S2, B, bpx, NULL, &n, &err), &err);
    double t_batch = gm_test_now_s() - t0;
    gm_image sheet = {0};
    t0 = gm_test_now_s();
    CHECK_OK(gm_image_load(digits, NULL, &sheet, &err), &err);
    double t_decode = gm_test_now_s() - t0;
    gm_image_free(&sheet);
    free(bpx);
    printf("digits.png: 5,000 cells checked in %.3f s; a batch of 8 cells at %lld x %lld in %.3f s (one decode of the sheet: %.3f s)\n",
           t_check, (long long)S2, (long long)S2, t_batch, t_decode);
    CHECK(t_batch < 8 * t_decode + 2.0, "a batch of 8 cells took %.2f s, a decode %.3f s", t_batch, t_decode);
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
    test_resize_bicubic();
    test_normalize_lut();
    test_pixel_values();
    test_pan_and_scan_rects();
    test_torchvision_distance();
    test_bad_files();
    test_limits();
    test_alloc_failures();
    test_api_errors();
    test_ref_parse();
    test_ref_load();
    test_ref_batch();
    printf("test_image: %.1f s\n", gm_test_now_s() - t0);
    return gm_test_finish();
}
