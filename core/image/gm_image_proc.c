/*
 * gm_image_proc.c - Gemma3ImageProcessorPil in C: Pillow's bilinear and bicubic resize, the numpy
 * rescale and normalization, pan & scan.
 *
 * The resize is Pillow 13's libImaging/Resample.c for 8-bit images restricted to what
 * `Image.resize(size, BILINEAR)` and `Image.resize(size, BICUBIC)` of an RGB image reach (a full
 * source box; the triangle filter, support 1, or the cubic convolution filter with a = -0.5,
 * support 2 - Gemma 4's processor resamples with BICUBIC), statement for statement where the
 * arithmetic is concerned: the filter weights are computed in double with the same expressions
 * in the same order, normalized by their sum, converted to fixed point (22 fraction bits), and
 * each pass accumulates `pixel * weight` in a 32-bit int that starts at one half and is shifted
 * and clipped to 8 bits. Any other order or precision
 * (floats, a 2D kernel, a single rounding) moves some pixels by one unit, and the point of this
 * file is the same bytes as PIL. fp contraction is off so that no FMA changes a weight.
 *
 * The processor's steps around it (transformers models/gemma3/image_processing_pil_gemma3.py and
 * image_processing_backends.PilBackend): crops for pan & scan are numpy slices of the decoded
 * image; each image is turned back into a PIL image, resized, then rescaled in float64 and cast to
 * float32 (image_transforms.rescale), then normalized in float32 (image_transforms.normalize).
 */
#include "gm_image.h"

#include "gm_alloc.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Resample.c: "8 bits for result. Filter can have negative areas. In one cases the sum of the
 * coefficients will be negative, in the other it will be more than 1.0. That is why we need two
 * extra bits for overflow and int type." */
#define PRECISION_BITS (32 - 8 - 2)

/* Resample.c bilinear_filter, support 1.0. */
static double bilinear_filter(double x) {
    if (x < 0.0) x = -x;
    if (x < 1.0) return 1.0 - x;
    return 0.0;
}

/* Resample.c bicubic_filter, support 2.0: Keys' cubic convolution with a = -0.5
 * (https://en.wikipedia.org/wiki/Bicubic_interpolation#Bicubic_convolution_algorithm), the same
 * expressions in the same order. Its lobes are negative, so weights and sums can leave 0..1. */
static double bicubic_filter(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

/* Resample.c struct filter: the function and its support at scale 1. */
typedef struct resample_filter {
    double (*filter)(double x);
    double support;
} resample_filter;

static const resample_filter FILTERS[] = {
    [GM_IMAGE_BILINEAR] = {bilinear_filter, 1.0},
    [GM_IMAGE_BICUBIC] = {bicubic_filter, 2.0},
};

/* Resample.c clip8: the accumulator's integer part clamped to 0..255 (its lookup table covers
 * -640..639 and saturates the same way). */
static inline uint8_t clip8(int in) {
    int v = in >> PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* The weights of one pass: out_size rows of ksize fixed-point weights; output pixel i reads
 * input pixels [bounds[2i], bounds[2i] + bounds[2i+1]). */
typedef struct coeffs {
    int ksize;
    int *bounds;  /* (out_size, 2) */
    int32_t *kk;  /* (out_size, ksize) */
} coeffs;

static void coeffs_free(coeffs *c) {
    gm_free(c->bounds), gm_free(c->kk);
    *c = (coeffs){0};
}

/* Resample.c precompute_coeffs + normalize_coeffs_8bpc for source interval [in0, in1) of an axis
 * of in_size pixels mapped onto out_size pixels. */
static gm_status precompute_coeffs(int in_size, float in0, float in1, int out_size, const resample_filter *filterp, coeffs *c,
                                   gm_error *err) {
    double support, scale, filterscale;
    int xx, x, ksize, xmin, xmax;
    /* prepare for horizontal stretch */
    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0) filterscale = 1.0;
    /* determine support size (length of resampling filter) */
    support = filterp->support * filterscale;
    /* maximum number of coeffs */
    ksize = (int)ceil(support) * 2 + 1;
    if (out_size > INT_MAX / (ksize * (int)sizeof(double)))
        return gm_error_set(err, GM_ERR_NOMEM, "image resize: %d -> %d pixels needs too many weights\nhint: resize in steps", in_size,
                            out_size);
    double *kk = gm_malloc((size_t)out_size * (size_t)ksize * sizeof(double));
    int *bounds = gm_malloc((size_t)out_size * 2 * sizeof(int));
    int32_t *ik = gm_malloc((size_t)out_size * (size_t)ksize * sizeof(int32_t));
    if (!kk || !bounds || !ik) {
        gm_free(kk), gm_free(bounds), gm_free(ik);
        return gm_error_set(err, GM_ERR_NOMEM, "image resize: out of memory for the weights of %d -> %d pixels\nhint: free memory",
                            in_size, out_size);
    }
    double inv_filterscale = 1.0 / filterscale;
    for (xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        xmin = (int)(center - support + 0.5); /* round */
        if (xmin < 0) xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = &kk[xx * ksize];
        for (x = 0; x < xmax; x++) {
            double w = filterp->filter((x + xmin - center + 0.5) * inv_filterscale);
            k[x] = w;
            ww += w;
        }
        if (ww != 0.0)
            for (x = 0; x < xmax; x++) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0; /* remaining values stay empty */
        bounds[xx * 2 + 0] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    /* normalize_coeffs_8bpc: to fixed point, rounding half away from zero */
    for (x = 0; x < out_size * ksize; x++)
        ik[x] = kk[x] < 0 ? (int32_t)(-0.5 + kk[x] * (1 << PRECISION_BITS)) : (int32_t)(0.5 + kk[x] * (1 << PRECISION_BITS));
    gm_free(kk);
    *c = (coeffs){.ksize = ksize, .bounds = bounds, .kk = ik};
    return GM_OK;
}

/* _ImagingResampleHorizontal_8bpc (3 bands): rows [y0, y0 + rows) of `in` (in_w wide) into
 * `out` (rows x out_w). */
static void resample_horizontal(uint8_t *out, int out_w, const uint8_t *in, int in_w, int y0, int rows, const coeffs *c) {
    for (int yy = 0; yy < rows; yy++) {
        const uint8_t *line = in + (size_t)(yy + y0) * (size_t)in_w * 3;
        uint8_t *lo = out + (size_t)yy * (size_t)out_w * 3;
        for (int xx = 0; xx < out_w; xx++) {
            int xmin = c->bounds[xx * 2 + 0], xmax = c->bounds[xx * 2 + 1];
            const int32_t *k = &c->kk[xx * c->ksize];
            int ss0 = 1 << (PRECISION_BITS - 1), ss1 = ss0, ss2 = ss0;
            for (int x = 0; x < xmax; x++) {
                ss0 += line[(x + xmin) * 3 + 0] * k[x];
                ss1 += line[(x + xmin) * 3 + 1] * k[x];
                ss2 += line[(x + xmin) * 3 + 2] * k[x];
            }
            lo[xx * 3 + 0] = clip8(ss0), lo[xx * 3 + 1] = clip8(ss1), lo[xx * 3 + 2] = clip8(ss2);
        }
    }
}

/* _ImagingResampleVertical_8bpc (3 bands): `in` (w wide) into `out` (out_h x w); the bounds
 * count rows of `in`. */
static void resample_vertical(uint8_t *out, int out_h, const uint8_t *in, int w, const coeffs *c) {
    const size_t stride = (size_t)w * 3;
    for (int yy = 0; yy < out_h; yy++) {
        int ymin = c->bounds[yy * 2 + 0], ymax = c->bounds[yy * 2 + 1];
        const int32_t *k = &c->kk[yy * c->ksize];
        uint8_t *lo = out + (size_t)yy * stride;
        for (size_t xx = 0; xx < stride; xx++) {
            int ss = 1 << (PRECISION_BITS - 1);
            for (int y = 0; y < ymax; y++) ss += in[(size_t)(y + ymin) * stride + xx] * k[y];
            lo[xx] = clip8(ss);
        }
    }
}

/* ImagingResampleInner with the full box (0, 0, in_w, in_h). Pillow 13 runs the vertical pass
 * first when the height shrinks by more than twice as many pixels as the width does
 * (2 * (in_w - w) < in_h - h, with h < in_h: Pillow PR #9549, "if height is scaled down
 * significantly more than width, resize vertically first"; the rule was read off Pillow 13.0.0's
 * output on 16,000 random cases, the C source of that release not being at hand), else the
 * horizontal pass first, over only the rows the vertical pass will read. The first pass rounds to
 * 8 bits, so the order changes pixels by one unit here and there. */
static gm_status resample(const gm_image *in, int w, int h, const resample_filter *filterp, gm_image *out, gm_error *err) {
    const int in_w = (int)in->w, in_h = (int)in->h;
    const bool need_h = w != in_w, need_v = h != in_h;
    const bool vertical_first = need_h && need_v && h < in_h && 2 * ((int64_t)in_w - w) < (int64_t)in_h - h;
    coeffs cv = {0}, ch = {0};
    uint8_t *tmp = NULL, *dst = NULL;
    gm_status s = precompute_coeffs(in_h, 0.0f, (float)in_h, h, filterp, &cv, err);
    if (s == GM_OK && need_h) s = precompute_coeffs(in_w, 0.0f, (float)in_w, w, filterp, &ch, err);
    if (s != GM_OK) goto done;
    if (!need_h && !need_v) {
        dst = gm_malloc((size_t)w * (size_t)h * 3);
        if (!dst) goto nomem;
        memcpy(dst, in->rgb, (size_t)w * (size_t)h * 3);
    } else if (vertical_first) {
        tmp = gm_malloc((size_t)in_w * (size_t)h * 3);
        dst = gm_malloc((size_t)w * (size_t)h * 3);
        if (!tmp || !dst) goto nomem;
        resample_vertical(tmp, h, in->rgb, in_w, &cv);
        resample_horizontal(dst, w, tmp, in_w, 0, h, &ch);
    } else {
        const uint8_t *src = in->rgb;
        if (need_h) {
            int ybox_first = cv.bounds[0], ybox_last = cv.bounds[h * 2 - 2] + cv.bounds[h * 2 - 1];
            for (int i = 0; i < h; i++) cv.bounds[i * 2] -= ybox_first; /* shift bounds for the vertical pass */
            tmp = gm_malloc((size_t)w * (size_t)(ybox_last - ybox_first) * 3);
            if (!tmp) goto nomem;
            resample_horizontal(tmp, w, in->rgb, in_w, ybox_first, ybox_last - ybox_first, &ch);
            src = tmp;
        }
        if (need_v) {
            dst = gm_malloc((size_t)w * (size_t)h * 3);
            if (!dst) goto nomem;
            resample_vertical(dst, h, src, w, &cv);
        } else {
            dst = tmp, tmp = NULL; /* no vertical change: the rows used are all rows */
        }
    }
    *out = (gm_image){.w = w, .h = h, .rgb = dst};
    dst = NULL;
    goto done;
nomem:
    s = gm_error_set(err, GM_ERR_NOMEM, "image resize: out of memory for %lld x %lld -> %d x %d\nhint: free memory", (long long)in->w,
                     (long long)in->h, w, h);
done:
    gm_free(tmp), gm_free(dst);
    coeffs_free(&cv), coeffs_free(&ch);
    return s;
}

gm_status gm_image_resize(const gm_image *in, int64_t w, int64_t h, gm_image_filter f, gm_image *out, gm_error *err) {
    GM_ASSERT(in && in->rgb && out);
    if ((unsigned)f >= sizeof FILTERS / sizeof *FILTERS)
        return gm_error_set(err, GM_ERR_INVALID, "image resize: unknown filter %d\nhint: use GM_IMAGE_BILINEAR or GM_IMAGE_BICUBIC", (int)f);
    const int64_t cap = 1 << 24; /* Resample.c works in int; 2^24 also keeps every float box edge exact */
    if (w < 1 || h < 1 || w > cap || h > cap || in->w < 1 || in->h < 1 || in->w > cap || in->h > cap)
        return gm_error_set(err, GM_ERR_INVALID, "image resize: %lld x %lld -> %lld x %lld: sizes must be 1..%lld\nhint: check the size",
                            (long long)in->w, (long long)in->h, (long long)w, (long long)h, (long long)cap);
    return resample(in, (int)w, (int)h, &FILTERS[f], out, err);
}

gm_status gm_image_resize_bilinear(const gm_image *in, int64_t w, int64_t h, gm_image *out, gm_error *err) {
    return gm_image_resize(in, w, h, GM_IMAGE_BILINEAR, out, err);
}

gm_status gm_image_crop(const gm_image *in, gm_image_rect r, gm_image *out, gm_error *err) {
    GM_ASSERT(in && in->rgb && out);
    if (r.w < 1 || r.h < 1 || r.x < 0 || r.y < 0 || r.x > in->w - r.w || r.y > in->h - r.h)
        return gm_error_set(err, GM_ERR_INVALID,
                            "image crop: rectangle %lld,%lld %lld x %lld is empty or not inside the %lld x %lld image\nhint: check the rectangle",
                            (long long)r.x, (long long)r.y, (long long)r.w, (long long)r.h, (long long)in->w, (long long)in->h);
    uint8_t *p = gm_malloc((size_t)(r.w * r.h * 3));
    if (!p) return gm_error_set(err, GM_ERR_NOMEM, "image crop: out of memory for %lld x %lld\nhint: free memory", (long long)r.w, (long long)r.h);
    for (int64_t y = 0; y < r.h; y++) memcpy(p + y * r.w * 3, in->rgb + ((r.y + y) * in->w + r.x) * 3, (size_t)(r.w * 3));
    *out = (gm_image){.w = r.w, .h = r.h, .rgb = p};
    return GM_OK;
}

/* ---- the processor ----------------------------------------------------------------------------- */

gm_image_opts gm_image_opts_gemma3(int64_t size) {
    return (gm_image_opts){
        .size = size,
        .rescale = 1.0 / 255.0, /* Python's 1 / 255, rescale_factor of BaseImageProcessor */
        .mean = {0.5f, 0.5f, 0.5f}, /* IMAGENET_STANDARD_MEAN */
        .std = {0.5f, 0.5f, 0.5f},  /* IMAGENET_STANDARD_STD */
        .pan_and_scan = false,
        .pas_min_crop_size = GM_IMAGE_PAS_MIN_CROP_SIZE,
        .pas_max_num_crops = GM_IMAGE_PAS_MAX_NUM_CROPS,
        .pas_min_ratio = GM_IMAGE_PAS_MIN_RATIO,
        .filter = GM_IMAGE_BILINEAR, /* PILImageResampling.BILINEAR */
    };
}

void gm_image_normalize(const gm_image *img, double rescale, const float mean[3], const float std[3], float *out) {
    const int64_t n = img->w * img->h;
    for (int c = 0; c < 3; c++) {
        float *o = out + c * n;
        for (int64_t i = 0; i < n; i++) {
            float v = (float)((double)img->rgb[i * 3 + c] * rescale); /* rescale: f64 product, cast to f32 */
            o[i] = (v - mean[c]) / std[c];                              /* normalize: f32 */
        }
    }
}

int64_t gm_image_pan_and_scan_crops(int64_t w, int64_t h, const gm_image_opts *o, gm_image_rect *crops, int64_t max) {
    GM_ASSERT(o && w >= 1 && h >= 1 && o->pas_min_crop_size >= 1 && o->pas_max_num_crops >= 1);
    int64_t ncw, nch;
    const double min_crop = (double)o->pas_min_crop_size;
    if (w >= h) { /* square or landscape */
        if ((double)w / (double)h < o->pas_min_ratio) return 0;
        ncw = (int64_t)floor((double)w / (double)h + 0.5); /* half round up */
        int64_t by_size = (int64_t)floor((double)w / min_crop);
        ncw = by_size < ncw ? by_size : ncw;
        ncw = ncw < 2 ? 2 : ncw;
        ncw = ncw > o->pas_max_num_crops ? o->pas_max_num_crops : ncw;
        nch = 1;
    } else { /* portrait */
        if ((double)h / (double)w < o->pas_min_ratio) return 0;
        nch = (int64_t)floor((double)h / (double)w + 0.5);
        int64_t by_size = (int64_t)floor((double)h / min_crop);
        nch = by_size < nch ? by_size : nch;
        nch = nch < 2 ? 2 : nch;
        nch = nch > o->pas_max_num_crops ? o->pas_max_num_crops : nch;
        ncw = 1;
    }
    int64_t cw = (int64_t)ceil((double)w / (double)ncw), chh = (int64_t)ceil((double)h / (double)nch);
    if ((cw < chh ? cw : chh) < o->pas_min_crop_size) return 0; /* crops too small */
    /* itertools.product(crop_positions_h, crop_positions_w); numpy cuts slices at the edge */
    int64_t n = 0;
    for (int64_t i = 0; i < nch; i++)
        for (int64_t j = 0; j < ncw; j++, n++) {
            if (n >= max) continue;
            int64_t x = cw * j < w ? cw * j : w, y = chh * i < h ? chh * i : h; /* a slice's start stops at the end */
            int64_t rw = w - x < cw ? w - x : cw, rh = h - y < chh ? h - y : chh;
            crops[n] = (gm_image_rect){.x = x, .y = y, .w = rw, .h = rh};
        }
    return n;
}

gm_status gm_image_aspect_size(int64_t w, int64_t h, int64_t patch, int64_t max_patches, int64_t pool, int64_t *tw,
                               int64_t *th, gm_error *err) {
    if (w < 1 || h < 1 || patch < 1 || pool < 1 || max_patches < pool * pool)
        return gm_error_set(err, GM_ERR_INVALID, "aspect-preserving size of a %lld x %lld image: bad parameters (patch %lld, "
                            "pooling %lld, %lld patches)", (long long)w, (long long)h, (long long)patch, (long long)pool,
                            (long long)max_patches);
    /* the processor's arithmetic, in Python floats (double) */
    double target_px = (double)max_patches * (double)(patch * patch), total_px = (double)h * (double)w;
    double factor = sqrt(target_px / total_px), ideal_h = factor * (double)h, ideal_w = factor * (double)w;
    int64_t mult = pool * patch;
    int64_t t_h = (int64_t)floor(ideal_h / (double)mult) * mult, t_w = (int64_t)floor(ideal_w / (double)mult) * mult;
    if (t_h == 0 && t_w == 0)
        return gm_error_set(err, GM_ERR_INVALID, "a %lld x %lld image resizes to 0 x 0 within %lld patches of %lld px (sides "
                            "multiples of %lld px)", (long long)w, (long long)h, (long long)max_patches, (long long)patch,
                            (long long)mult);
    int64_t max_side = (max_patches / (pool * pool)) * mult;
    if (t_h == 0) {
        t_h = mult;
        t_w = (int64_t)floor((double)w / (double)h) * mult;
        if (t_w > max_side) t_w = max_side;
    } else if (t_w == 0) {
        t_w = mult;
        t_h = (int64_t)floor((double)h / (double)w) * mult;
        if (t_h > max_side) t_h = max_side;
    }
    if ((double)t_h * (double)t_w > target_px)
        return gm_error_set(err, GM_ERR_INVALID, "a %lld x %lld image resizes to %lld x %lld, over %lld patches of %lld px",
                            (long long)w, (long long)h, (long long)t_w, (long long)t_h, (long long)max_patches,
                            (long long)patch);
    *tw = t_w, *th = t_h;
    return GM_OK;
}

/* Gemma 4's: the image alone at its aspect-preserving size (gm_image_aspect_size). */
static gm_status preprocess_aspect(const gm_image *img, const gm_image_opts *opts, gm_image_pixels *out, gm_error *err) {
    int64_t tw = 0, th = 0;
    GM_TRY(gm_image_aspect_size(img->w, img->h, opts->patch, opts->max_patches, opts->pool, &tw, &th, err));
    gm_image_pixels px = {.n = 1, .h = th, .w = tw};
    px.data = gm_malloc((size_t)(3 * th * tw) * sizeof(float));
    if (!px.data)
        return gm_error_set(err, GM_ERR_NOMEM, "image preprocessing: out of memory for 3 x %lld x %lld floats", (long long)th,
                            (long long)tw);
    gm_image sized = {0};
    gm_status s = GM_OK;
    if (tw == img->w && th == img->h) gm_image_normalize(img, opts->rescale, opts->mean, opts->std, px.data); /* as is */
    else if ((s = gm_image_resize(img, tw, th, opts->filter, &sized, err)) == GM_OK)
        gm_image_normalize(&sized, opts->rescale, opts->mean, opts->std, px.data);
    gm_image_free(&sized);
    if (s != GM_OK) {
        gm_image_pixels_free(&px);
        return s;
    }
    *out = px;
    return GM_OK;
}

gm_status gm_image_preprocess(const gm_image *img, const gm_image_opts *opts, gm_image_pixels *out, gm_error *err) {
    GM_ASSERT(img && img->rgb && opts && out);
    if (opts->max_patches > 0) {
        if (opts->pan_and_scan)
            return gm_error_set(err, GM_ERR_INVALID, "image preprocessing: pan & scan crops are Gemma 3's; the aspect-preserving "
                                "resize takes each image whole");
        if ((unsigned)opts->filter > GM_IMAGE_BICUBIC)
            return gm_error_set(err, GM_ERR_INVALID, "image preprocessing: unknown filter %d", (int)opts->filter);
        return preprocess_aspect(img, opts, out, err);
    }
    const int64_t S = opts->size;
    if (S < 1 || S > 16384 || (opts->pan_and_scan && (opts->pas_min_crop_size < 1 || opts->pas_max_num_crops < 1 ||
                                                       opts->pas_max_num_crops > GM_IMAGE_MAX_CROPS || !(opts->pas_min_ratio > 0))))
        return gm_error_set(err, GM_ERR_INVALID,
                            "image preprocessing: bad options (size %lld, pan & scan min crop %lld, max crops %lld, min ratio %g)\n"
                            "hint: size 1..16384, min crop >= 1, max crops 1..%d, min ratio > 0",
                            (long long)S, (long long)opts->pas_min_crop_size, (long long)opts->pas_max_num_crops, opts->pas_min_ratio,
                            GM_IMAGE_MAX_CROPS);
    if ((unsigned)opts->filter > GM_IMAGE_BICUBIC)
        return gm_error_set(err, GM_ERR_INVALID, "image preprocessing: unknown filter %d\nhint: GM_IMAGE_BILINEAR or GM_IMAGE_BICUBIC",
                            (int)opts->filter);
    gm_image_pixels px = {.size = S, .h = S, .w = S};
    if (opts->pan_and_scan) px.n_crops = gm_image_pan_and_scan_crops(img->w, img->h, opts, px.crops, GM_IMAGE_MAX_CROPS);
    for (int64_t i = 0; i < px.n_crops; i++)
        if (px.crops[i].w < 1 || px.crops[i].h < 1)
            return gm_error_set(err, GM_ERR_INVALID,
                                "image preprocessing: pan & scan of a %lld x %lld image gives an empty crop (min crop %lld, max crops %lld)\n"
                                "hint: use a larger pan_and_scan_min_crop_size",
                                (long long)img->w, (long long)img->h, (long long)opts->pas_min_crop_size, (long long)opts->pas_max_num_crops);
    px.n = 1 + px.n_crops;
    const size_t per = (size_t)(3 * S * S);
    px.data = gm_malloc(per * (size_t)px.n * sizeof(float));
    if (!px.data)
        return gm_error_set(err, GM_ERR_NOMEM, "image preprocessing: out of memory for %lld x 3 x %lld x %lld floats\nhint: free memory",
                            (long long)px.n, (long long)S, (long long)S);
    for (int64_t i = 0; i < px.n; i++) {
        gm_image crop = {0}, sized = {0};
        gm_status s = i == 0 ? GM_OK : gm_image_crop(img, px.crops[i - 1], &crop, err);
        if (s == GM_OK) s = gm_image_resize(i == 0 ? img : &crop, S, S, opts->filter, &sized, err);
        if (s == GM_OK) gm_image_normalize(&sized, opts->rescale, opts->mean, opts->std, px.data + per * (size_t)i);
        gm_image_free(&crop), gm_image_free(&sized);
        if (s != GM_OK) {
            gm_image_pixels_free(&px);
            return s;
        }
    }
    *out = px;
    return GM_OK;
}

gm_status gm_image_preprocess_file(const char *ref, const gm_image_limits *limits, const gm_image_opts *opts, gm_image_pixels *out,
                                   gm_error *err) {
    gm_image img = {0};
    GM_TRY(gm_image_load_ref(ref, limits, &img, err));
    gm_status s = gm_image_preprocess(&img, opts, out, err);
    if (s != GM_OK) gm_error_prefix(err, "%s", ref);
    gm_image_free(&img);
    return s;
}

void gm_image_pixels_free(gm_image_pixels *px) {
    if (!px) return;
    gm_free(px->data);
    *px = (gm_image_pixels){0};
}
