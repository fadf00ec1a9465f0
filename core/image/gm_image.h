/*
 * gm_image.h - images in: a PNG or JPEG file decoded to 8-bit RGB, then preprocessed for Gemma 3's
 * vision tower exactly as Hugging Face's Gemma3ImageProcessorPil does.
 *
 * The reference is the Python path a user of transformers takes (transformers 5.24, Pillow 13.0):
 * `PIL.Image.open(path)`, `PIL.ImageOps.exif_transpose`, then the processor's
 * `image_transforms.convert_to_rgb` (any image with an alpha band or a tRNS transparency goes
 * through RGBA and `PIL.Image.alpha_composite` onto opaque white; the rest through
 * `Image.convert("RGB")`), `Image.resize((S, S), BILINEAR)` (or BICUBIC, Gemma 4's resample:
 * gm_image_opts.filter), rescale by 1/255, normalize with
 * mean 0.5 and std 0.5, channels first. Every step is reproduced bit for bit: decoded pixels equal
 * PIL's, resized pixels equal PIL's Resample.c, the f32 values equal the processor's
 * (tests/unit/test_image.c against tests/ref/image_ref.h5). Files are decoded by libpng and
 * libjpeg (the libraries PIL itself uses), the EXIF orientation is read with libexif, and the
 * format is recognised from the first bytes, never from the file name.
 *
 * Wherever a file is read for a data set or a prompt, an image reference may stand for it: a path,
 * or a path ending in a Media Fragments region "#xywh=X,Y,W,H" that selects a rectangle of the
 * decoded file (gm_image_ref_parse: a sprite sheet of many examples is one file).
 *
 * One deliberate difference: a 16-bit grayscale PNG, which PIL opens as mode "I;16" and clips to
 * 255 (almost every pixel turns white), keeps its high byte here, as PIL does for 16-bit RGB,
 * RGBA and gray+alpha PNGs.
 *
 * Ownership: a gm_image owns its `rgb` buffer (gm_malloc); gm_image_free releases it and clears
 * the struct. Functions that fill a gm_image or gm_image_pixels write it only on success (it is
 * untouched on failure) and the caller frees it. Nothing here keeps global state; every function
 * is reentrant.
 * Errors: functions returning gm_status write a message into `err` that names the file (or the
 * `name` given for a memory buffer), says what was wrong and ends with a "hint:" line:
 * GM_ERR_IO (missing or unreadable file), GM_ERR_FORMAT (corrupt or truncated data; libpng's and
 * libjpeg's warnings count as errors), GM_ERR_UNSUPPORTED (not PNG/JPEG - the message says what
 * it looks like: GIF, WebP, BMP, TIFF, ...), GM_ERR_LIMIT (more pixels than the limit; checked on
 * the header, before any pixel buffer is allocated), GM_ERR_INVALID (bad sizes or options; a
 * malformed image reference, or a region outside its image: the message names the reference),
 * GM_ERR_NOMEM. A failure never leaks.
 */
#ifndef GM_IMAGE_H
#define GM_IMAGE_H

#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* PIL's decompression-bomb threshold, `PIL.Image.MAX_IMAGE_PIXELS` = 1024 * 1024 * 1024 // 4 // 3
 * (a 24-bit image of 1 GiB). PIL only warns above it and refuses above twice it; we refuse above
 * it. The default of gm_image_limits.max_pixels. */
#define GM_IMAGE_MAX_PIXELS 89478485

/* Gemma 3's processor defaults (preprocessor_config.json of the Gemma 3 checkpoints, and
 * transformers' Gemma3ImageProcessorPil/Gemma3ProcessorKwargs): image side, and pan & scan. */
#define GM_IMAGE_GEMMA3_SIZE 896
#define GM_IMAGE_PAS_MIN_CROP_SIZE 256
#define GM_IMAGE_PAS_MAX_NUM_CROPS 4
#define GM_IMAGE_PAS_MIN_RATIO 1.2

/* An 8-bit RGB image: h rows of w pixels, top row first, each pixel R, G, B. Owns `rgb`
 * (w * h * 3 bytes, gm_malloc'd). */
typedef struct gm_image {
    int64_t w, h;
    uint8_t *rgb; /* (h, w, 3) */
} gm_image;

/* What a decoder may allocate. */
typedef struct gm_image_limits {
    int64_t max_pixels; /* width * height above this is GM_ERR_LIMIT; <= 0 means GM_IMAGE_MAX_PIXELS */
} gm_image_limits;

/* A rectangle of pixels: columns [x, x + w), rows [y, y + h). */
typedef struct gm_image_rect {
    int64_t x, y, w, h;
} gm_image_rect;

/* The resampling filter of gm_image_resize: Pillow's Image.BILINEAR or Image.BICUBIC. */
typedef enum gm_image_filter {
    GM_IMAGE_BILINEAR = 0, /* triangle filter, support 1 (Gemma 3's processor) */
    GM_IMAGE_BICUBIC = 1,  /* cubic convolution, a = -0.5, support 2 (Gemma 4's processor) */
} gm_image_filter;

/* The preprocessing of transformers' Gemma3ImageProcessorPil (its __call__ arguments). */
typedef struct gm_image_opts {
    int64_t size;            /* output side S: every image (and crop) is resized to S x S (896) */
    double rescale;          /* rescale_factor, 1/255 */
    float mean[3], std[3];   /* image_mean, image_std: 0.5 each */
    bool pan_and_scan;       /* do_pan_and_scan (the processor's default: off) */
    int64_t pas_min_crop_size;  /* pan_and_scan_min_crop_size (256) */
    int64_t pas_max_num_crops;  /* pan_and_scan_max_num_crops (4); >= 1 */
    double pas_min_ratio;       /* pan_and_scan_min_ratio_to_activate (1.2) */
    gm_image_filter filter;     /* resample of every resize: GM_IMAGE_BILINEAR (zero, Gemma 3's
                                   PILImageResampling.BILINEAR, what gm_image_opts_gemma3 sets) or
                                   GM_IMAGE_BICUBIC (Gemma 4's processor resamples with BICUBIC) */
    /* Gemma 4's aspect-preserving resize (Gemma4ImageProcessor), when max_patches > 0: each image
     * keeps its own size, the largest whose sides are multiples of pool x patch pixels within
     * max_patches patches (gm_image_aspect_size); size is then not used. No pan & scan. */
    int64_t max_patches, patch, pool;
} gm_image_opts;

/* The most crops gm_image_preprocess makes (opts.pas_max_num_crops above it is GM_ERR_INVALID). */
#define GM_IMAGE_MAX_CROPS 64

/* The f32 input of the vision tower: the original image, then its pan-and-scan crops. */
typedef struct gm_image_pixels {
    int64_t n;     /* 1 + n_crops */
    int64_t size;  /* S (0 with opts.max_patches: the image's own h x w below) */
    int64_t h, w;  /* the output's rows and columns: S x S, or the aspect-preserving size */
    int64_t n_crops;
    gm_image_rect crops[GM_IMAGE_MAX_CROPS]; /* the crops' rectangles in the decoded image (n_crops of them) */
    float *data;   /* (n, 3, h, w), gm_malloc'd */
} gm_image_pixels;

/* ---- decoding -------------------------------------------------------------------------------- */

/* Reads the PNG or JPEG file at `path` into *out (8-bit RGB, (h, w, 3)), converted exactly as
 * transformers sees it after `PIL.Image.open`: `ImageOps.exif_transpose` (EXIF Orientation 1-8
 * from the JPEG APP1 segment or the PNG eXIf chunk, read with libexif from IFD0; when IFD0 has no
 * Orientation, the XMP packet's tiff:Orientation, as PIL's Image.getexif does), then
 * `image_transforms.convert_to_rgb`: grayscale (1, 2, 4, 8 bits; values scaled as PIL's unpackers
 * L;2/L;4 do), palette, RGB; gray+alpha, RGBA, and any tRNS transparency (palette alpha, gray or
 * RGB colour key, compared as PIL compares them) composited onto opaque white with PIL's integer
 * `ImagingAlphaComposite` (libImaging/AlphaComposite.c); 16-bit samples keep their high byte
 * (PIL's RGB;16B/RGBA;16B/LA;16B rawmodes; for 16-bit gray see the header); interlaced PNGs;
 * grayscale, YCbCr and CMYK/YCCK JPEGs (CMYK read with Adobe's inverted polarity and converted by
 * PIL's `cmyk2rgb`, libImaging/Convert.c). The format comes from the first bytes of the file.
 * limits may be NULL (defaults). Errors: see the header; *out is untouched on failure. */
gm_status gm_image_load(const char *path, const gm_image_limits *limits, gm_image *out, gm_error *err);

/* gm_image_load of n bytes in memory (borrowed, read only); `name` stands for the file in
 * messages. */
gm_status gm_image_decode(const void *data, size_t n, const char *name, const gm_image_limits *limits,
                          gm_image *out, gm_error *err);

/* Releases img->rgb and zeroes *img. NULL and an already freed image are no-ops. */
void gm_image_free(gm_image *img);

/* "PNG", "JPEG", or what the first n bytes look like ("GIF", "WebP", "BMP", "TIFF", "HEIF/AVIF",
 * "JPEG 2000", "ICO", "PDF", "SVG/XML", "QOI", "Photoshop PSD", "an empty file"), or NULL when
 * unrecognised. Needs at most 12 bytes. */
const char *gm_image_sniff(const void *head, size_t n);

/* ---- image references: a file, or a region of one ------------------------------------------ */

/* The longest file path an image reference may name (bytes, with the terminating NUL). */
#define GM_IMAGE_PATH_MAX 4096

/* Splits an image reference into its file and region. A reference is a file path, optionally
 * followed by a W3C Media Fragments spatial fragment (https://www.w3.org/TR/media-frags/ §4.2.2):
 * `PATH#xywh=X,Y,W,H` or `PATH#xywh=pixel:X,Y,W,H`, X, Y, W, H unsigned decimal integers in
 * pixels of the decoded image (after EXIF orientation): columns [X, X + W), rows [Y, Y + H). Only
 * the text after the LAST '#' is looked at, and only when it starts with "xywh=": any other '#'
 * belongs to the path (file names may hold '#'), so "a#1.png" and "a.png#top" are plain paths.
 * Writes the path (NUL-terminated, at most cap bytes) and, when there is a fragment, *r with
 * *has_rect = true (else *has_rect = false and *r is untouched).
 * Errors, GM_ERR_INVALID naming the reference: an "xywh=" fragment that is not exactly four
 * whole numbers >= 0 separated by commas (signs, spaces, decimals, a missing or extra number), a
 * zero W or H, a value above 2^31 - 1, "percent:" units (not supported: give pixels), an empty
 * path, a path of cap bytes or more. (Media Fragments clips a region that overhangs the image;
 * gm_image_ref_check refuses it instead: a data set's cell is all there or it is a mistake.) */
gm_status gm_image_ref_parse(const char *ref, char *path, size_t cap, gm_image_rect *r, bool *has_rect, gm_error *err);

/* Checks that region r of reference `ref` (for the message) lies inside a w x h image: GM_OK, or
 * GM_ERR_INVALID naming the reference, the region's pixel ranges and the image's size. */
gm_status gm_image_ref_check(const char *ref, gm_image_rect r, int64_t w, int64_t h, gm_error *err);

/* The fragment of region r as gm_image_ref_parse reads it, in its one normalized spelling
 * "#xywh=X,Y,W,H" (no units, no leading zeros), into buf (cap bytes; 96 always suffice). Two
 * spellings of one region give the same text: the data's identity hashes this, not what was
 * written. */
void gm_image_ref_fragment(gm_image_rect r, char *buf, size_t cap);

/* gm_image_load of a reference: the file decoded whole (with `limits`: the decoder's work is the
 * file's, not the region's), then, for a region, gm_image_ref_check and the region copied out
 * (gm_image_crop). *out is the region (or the whole image); untouched on failure. Errors: those of
 * gm_image_ref_parse, gm_image_load, gm_image_ref_check; GM_ERR_NOMEM. */
gm_status gm_image_load_ref(const char *ref, const gm_image_limits *limits, gm_image *out, gm_error *err);

/* ---- geometry ---------------------------------------------------------------------------------- */

/* Copies the pixels of rectangle r of `in` into *out (r.w x r.h), as numpy slicing
 * `image[:, y:y+h, x:x+w]` does in Gemma3ImageProcessorPil.pan_and_scan. r must lie inside `in`
 * and be non-empty (else GM_ERR_INVALID). GM_ERR_NOMEM. */
gm_status gm_image_crop(const gm_image *in, gm_image_rect r, gm_image *out, gm_error *err);

/* Resizes `in` to w x h pixels as Pillow 13's `Image.resize((w, h), Image.BILINEAR)` (f =
 * GM_IMAGE_BILINEAR) or `Image.resize((w, h), Image.BICUBIC)` (f = GM_IMAGE_BICUBIC) does on an RGB
 * image, bit for bit (libImaging/Resample.c, ImagingResample with a full box). The two differ only
 * in the filter: Resample.c's bilinear_filter (triangle, support 1) or bicubic_filter (Keys' cubic
 * convolution with a = -0.5, support 2; its negative lobes can over- and undershoot, and the
 * results are clipped to 0..255). The filter's support is scaled by the reduction factor when
 * shrinking (antialiasing), each output pixel's weights over input pixels [xmin, xmin + xmax) are
 * normalized to sum 1 in double, turned
 * into fixed point with 22 fraction bits (PRECISION_BITS = 32 - 8 - 2) rounding half away from
 * zero, and two separable passes each round and clip to 8 bits: horizontal then vertical, except
 * that the vertical pass comes first when the height shrinks by more than twice as many pixels as
 * the width (2 * (in.w - w) < in.h - h; Pillow 13, PR #9549). Same size: a copy. w, h and the input
 * sides must be 1..2^24 and f one of the enum's values (else GM_ERR_INVALID); GM_ERR_NOMEM. */
gm_status gm_image_resize(const gm_image *in, int64_t w, int64_t h, gm_image_filter f, gm_image *out, gm_error *err);

/* gm_image_resize(in, w, h, GM_IMAGE_BILINEAR, out, err). */
gm_status gm_image_resize_bilinear(const gm_image *in, int64_t w, int64_t h, gm_image *out, gm_error *err);

/* ---- the processor ----------------------------------------------------------------------------- */

/* Gemma 3's options at side `size`: rescale 1/255, mean = std = 0.5, pan & scan off with its
 * parameters set to 256 / 4 / 1.2 (turn it on with opts.pan_and_scan = true). */
gm_image_opts gm_image_opts_gemma3(int64_t size);

/* The rescale and normalization of the processor's numpy backend into out (3, h, w) f32, channels
 * first: v = f32(f64(pixel) * rescale) (image_transforms.rescale upcasts to float64 and casts the
 * product to float32), then out = (v - mean[c]) / std[c] in f32 (image_transforms.normalize). The
 * same arithmetic and order, so the floats are identical. Cannot fail. */
void gm_image_normalize(const gm_image *img, double rescale, const float mean[3], const float std[3], float *out);

/* The crops of Gemma3ImageProcessorPil.pan_and_scan for a w x h image (models/gemma3/
 * image_processing_pil_gemma3.py): none unless the long side / short side >= pas_min_ratio; else
 * n = clamp(min(floor(ratio + 0.5), floor(long / pas_min_crop_size)), 2, pas_max_num_crops) crops
 * along the long side, each ceil(long / n) long (the last ones cut at the image's edge as numpy
 * slicing cuts them - with odd options even to nothing, which gm_image_preprocess refuses), none if
 * a crop's shorter side would be below pas_min_crop_size. Writes at most
 * `max` rectangles (left to right, or top to bottom) and returns how many there are (0 when pan &
 * scan does not apply). opts->pan_and_scan is not consulted. */
int64_t gm_image_pan_and_scan_crops(int64_t w, int64_t h, const gm_image_opts *opts, gm_image_rect *crops,
                                    int64_t max);

/* transformers' get_aspect_ratio_preserving_size (models/gemma4/image_processing_pil_gemma4.py) for a
 * w x h image: the largest th x tw with both sides multiples of pool x patch that holds at most
 * max_patches patches of patch x patch pixels, the aspect kept (a side that would round to 0
 * becomes one multiple, the other the ratio's multiples up to the budget's longest side). Into
 * *tw, *th. GM_ERR_INVALID (naming the sizes) where the processor raises: both sides round to 0,
 * or the result is over the budget. */
gm_status gm_image_aspect_size(int64_t w, int64_t h, int64_t patch, int64_t max_patches, int64_t pool, int64_t *tw,
                               int64_t *th, gm_error *err);

/* Gemma3ImageProcessorPil's pixel_values for one decoded image: the image itself, then (with
 * opts->pan_and_scan) its crops, each resized to S x S (gm_image_resize with opts->filter) and
 * normalized (gm_image_normalize) into out->data (n, 3, S, S); with opts->max_patches, Gemma 4's:
 * the image alone at gm_image_aspect_size (not resized when already that size, as the processor)
 * into (1, 3, h, w). GM_ERR_INVALID for bad options
 * (size < 1 or above 16384, pan & scan parameters < 1, more than GM_IMAGE_MAX_CROPS crops, an
 * unknown filter), GM_ERR_NOMEM. */
gm_status gm_image_preprocess(const gm_image *img, const gm_image_opts *opts, gm_image_pixels *out, gm_error *err);

/* gm_image_load_ref then gm_image_preprocess: `ref` is a file or a region of one. */
gm_status gm_image_preprocess_file(const char *ref, const gm_image_limits *limits, const gm_image_opts *opts,
                                   gm_image_pixels *out, gm_error *err);

/* Releases px->data and zeroes *px. NULL is a no-op. */
void gm_image_pixels_free(gm_image_pixels *px);

#ifdef __cplusplus
}
#endif
#endif /* GM_IMAGE_H */
