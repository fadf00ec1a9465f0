/*
 * gm_image.c - PNG (libpng) and JPEG (libjpeg) files decoded into 8-bit RGB the way transformers
 * sees them after PIL opened them; the EXIF orientation read with libexif.
 *
 * How: the first bytes pick the decoder. Both decoders read from a FILE * (fopen, or fmemopen for
 * a buffer in memory), check the header's width x height against the limit before allocating
 * anything the size of the image, then convert row by row into the RGB output (a whole-image
 * buffer of native rows only for interlaced PNGs, whose passes revisit every row). The conversions
 * are PIL's, with PIL's integer arithmetic (each is named at its function): the mode PIL opens a
 * file in (PngImagePlugin._MODES, JpegImagePlugin's SOF handler), the unpacker of its rawmode
 * (libImaging/Unpack.c), then convert_to_rgb of transformers (image_transforms.py): any image
 * with an alpha band or a tRNS transparency is composited over opaque white by
 * ImagingAlphaComposite (libImaging/AlphaComposite.c), the others go through Image.convert("RGB")
 * (libImaging/Convert.c). ImageOps.exif_transpose's flip/rotation comes last; it commutes with the
 * per-pixel conversions, and turning 3-byte pixels is cheaper than turning PIL's 4-byte ones.
 *
 * Errors and setjmp: libpng and libjpeg report fatal errors through a callback that must not
 * return; ours longjmp back to the decoder function. Everything that must survive the jump (the
 * library handles, the buffers) lives in a `dec` struct of the caller's frame, not in locals of
 * the function that called setjmp, so nothing is indeterminate after the jump (C11 7.13.2.1), and
 * the caller releases it all on one path. Warnings count as errors (a truncated JPEG is only a
 * warning to libjpeg, which would pad it with gray): libjpeg's warnings longjmp at once (all of
 * libjpeg's memory is in pools that jpeg_destroy releases); libpng's are recorded and checked
 * after every libpng call, because a longjmp out of libpng's warning callback could skip frees.
 * libpng allocates through gm_malloc (counted, fault-injectable); libjpeg and libexif use their
 * own malloc, bounded by the header check (libjpeg) and the data size (libexif).
 *
 * Not reproduced (rare; each would need PIL's exact quirk): a 16-bit gray tRNS key is compared
 * with the full 16-bit sample (PIL compares its clipped 8-bit value); EXIF given in a PNG text chunk
 * "Raw profile type exif" and XMP in tEXt/zTXt (PIL reads both; we skip text chunks but iTXt);
 * several EXIF APP1 segments (PIL concatenates them; IFD0 comes from the first either way); EXIF
 * entries that libexif rejects as malformed but PIL still reads; APNG files whose default image is
 * not the first frame (libpng decodes the default image).
 *
 * Rejected: reading the whole file into memory first (a second copy of the compressed data for
 * nothing); libpng's own transformations for alpha, tRNS and 16 bits (png_set_strip_16 and
 * png_set_tRNS_to_alpha compare transparency differently from PIL; we need PIL's answer).
 */
#include "gm_image.h"

#include "gm_alloc.h"

#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <string.h>
#include <sys/stat.h>

#include <jerror.h> /* JERR_OUT_OF_MEMORY */
#include <jpeglib.h>
#include <libexif/exif-data.h>
#include <png.h>

/* A progressive JPEG may repeat scans without end; each one costs a pass over the whole
 * coefficient buffer. libjpeg-turbo's own tools and fuzzers stop at a few hundred (djpeg
 * -maxscans, TJPARAM_SCANLIMIT); real files have at most ~20. */
#define GM_JPEG_MAX_SCANS 1000

/* The largest ancillary PNG chunk read. libpng allocates a chunk's whole length before reading it
 * and only "benign"-errors a length over its chunk limit: as a warning it went on, and a 6 KB file
 * claiming a 750 MB eXIf made it allocate 750 MB (found by fuzz_image; benign errors are fatal
 * now). libpng's build default is 8,000,000; EXIF is capped at 64 KiB in JPEG, ICC profiles and
 * XMP packets are far below this. */
#define GM_PNG_MAX_CHUNK (16u << 20)

#define HINT_CORRUPT "hint: the file is damaged or incomplete; export or download it again"

/* ---- decoder state ----------------------------------------------------------------------------- */

typedef struct dec {
    const char *name;   /* the file, for messages */
    int64_t max_pixels;
    FILE *f;
    jmp_buf jb;         /* where the libraries' fatal-error callbacks jump */
    char msg[256];      /* the library's first error or warning */
    bool warned;        /* libpng warned (checked after each libpng call) */
    bool nomem;         /* an allocation failed inside the library */
    /* owned buffers, released by dec_release */
    uint8_t *out;       /* (h, w, 3) result */
    uint8_t *buf;       /* native rows: one row, or the whole image for interlaced PNGs */
    uint8_t **rows;     /* interlaced PNGs: row pointers into buf */
    int64_t w, h;
    int orientation;    /* EXIF orientation, 1..8 (other values: none) */
    /* libpng */
    png_structp png;
    png_infop info;
    /* libjpeg */
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr jerr;
    struct jpeg_progress_mgr progress;
    bool cinfo_live;
} dec;

static void dec_release(dec *d) {
    if (d->png) png_destroy_read_struct(&d->png, d->info ? &d->info : NULL, NULL);
    d->png = NULL, d->info = NULL;
    if (d->cinfo_live) jpeg_destroy_decompress(&d->cinfo);
    d->cinfo_live = false;
    gm_free(d->out), gm_free(d->buf), gm_free(d->rows);
    d->out = d->buf = NULL, d->rows = NULL;
}

static gm_status limit_error(const dec *d, int64_t w, int64_t h, gm_error *err) {
    return gm_error_set(err, GM_ERR_LIMIT,
                        "%s: %lld x %lld pixels (%lld), more than the limit of %lld pixels\n"
                        "hint: downscale the image first (the model sees it resized: Gemma 3 at %d x %d, Gemma 4 within "
                        "its soft-token budget); the limit is PIL's decompression-bomb limit, which transformers' image "
                        "processors also meet",
                        d->name, (long long)w, (long long)h, (long long)(w * h), (long long)d->max_pixels,
                        GM_IMAGE_GEMMA3_SIZE, GM_IMAGE_GEMMA3_SIZE);
}

static gm_status nomem_error(const dec *d, gm_error *err) {
    return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory decoding a %lld x %lld image\nhint: free memory or downscale the image",
                        d->name, (long long)d->w, (long long)d->h);
}

/* ---- PIL's pixel arithmetic -------------------------------------------------------------------- */

/* libImaging/ImagingUtils.h: x / 255 with rounding, for the sums below. */
#define SHIFTFORDIV255(a) ((((a) >> 8) + (a)) >> 8)

/* ImagingAlphaComposite(dst, src) with dst = opaque white, as transformers' convert_to_rgb calls
 * it (`Image.alpha_composite(Image.new("RGBA", size, (255, 255, 255, 255)), image)`), written
 * exactly as libImaging/AlphaComposite.c: 7 extra bits of precision, divisions rounded. */
static inline void over_white(uint8_t *o, uint32_t r, uint32_t g, uint32_t b, uint32_t a) {
    if (a == 0) {
        o[0] = o[1] = o[2] = 255;
        return;
    }
    const uint32_t dr = 255, dg = 255, db = 255, da = 255;
    uint32_t blend = da * (255 - a);
    uint32_t outa255 = a * 255 + blend;
    uint32_t coef1 = a * 255 * 255 * (1u << 7) / outa255;
    uint32_t coef2 = 255 * (1u << 7) - coef1;
    uint32_t tr = r * coef1 + dr * coef2, tg = g * coef1 + dg * coef2, tb = b * coef1 + db * coef2;
    o[0] = (uint8_t)(SHIFTFORDIV255(tr + (0x80u << 7)) >> 7);
    o[1] = (uint8_t)(SHIFTFORDIV255(tg + (0x80u << 7)) >> 7);
    o[2] = (uint8_t)(SHIFTFORDIV255(tb + (0x80u << 7)) >> 7);
}

/* CLIP8 and MULDIV255 of libImaging/ImagingUtils.h. */
static inline int clip8(int v) { return v <= 0 ? 0 : v < 256 ? v : 255; }
static inline int muldiv255(int a, int b) {
    int tmp = a * b + 128;
    return SHIFTFORDIV255(tmp);
}

/* PIL's CMYK -> RGB (libImaging/Convert.c cmyk2rgb) of one pixel stored as libjpeg returns it:
 * PIL opens every 4-component JPEG with rawmode "CMYK;I" ("assume adobe conventions",
 * JpegImagePlugin), which inverts the four bytes first. */
static inline void cmyk_inverted_to_rgb(uint8_t *o, const uint8_t *in) {
    int c = 255 - in[0], m = 255 - in[1], y = 255 - in[2], k = 255 - in[3];
    int nk = 255 - k;
    o[0] = (uint8_t)clip8(nk - muldiv255(c, nk));
    o[1] = (uint8_t)clip8(nk - muldiv255(m, nk));
    o[2] = (uint8_t)clip8(nk - muldiv255(y, nk));
}

/* ---- EXIF and XMP orientation ------------------------------------------------------------------ */

/* The Orientation tag (0x0112) of IFD0 in `data` (an APP1 payload starting "Exif\0\0"), read with
 * libexif; -1 when IFD0 has no such tag (or the data does not parse). PIL reads the same tag of
 * the same IFD (Image.getexif -> Exif.get(ExifTags.Base.Orientation)); a value that is not one
 * integer (a count other than 1, a non-integer type) transposes nothing there, here it reads 0. */
static int exif_orientation(const uint8_t *data, size_t n) {
    if (n < 6 || n > UINT_MAX) return -1;
    ExifData *ed = exif_data_new();
    if (!ed) return -1;
    /* no "fixing" of the data to the standard (it may add or drop tags), keep every tag */
    exif_data_unset_option(ed, EXIF_DATA_OPTION_FOLLOW_SPECIFICATION);
    exif_data_unset_option(ed, EXIF_DATA_OPTION_IGNORE_UNKNOWN_TAGS);
    exif_data_load_data(ed, data, (unsigned)n);
    int o = -1;
    ExifEntry *e = ed->ifd[EXIF_IFD_0] ? exif_content_get_entry(ed->ifd[EXIF_IFD_0], EXIF_TAG_ORIENTATION) : NULL;
    if (e) {
        ExifByteOrder bo = exif_data_get_byte_order(ed);
        o = 0;
        if (e->components == 1 && e->data) {
            if (e->format == EXIF_FORMAT_SHORT && e->size >= 2) o = exif_get_short(e->data, bo);
            else if (e->format == EXIF_FORMAT_SSHORT && e->size >= 2) o = exif_get_sshort(e->data, bo);
            else if (e->format == EXIF_FORMAT_LONG && e->size >= 4) o = (int)(exif_get_long(e->data, bo) & 0xffff);
            else if (e->format == EXIF_FORMAT_SLONG && e->size >= 4) o = (int)(exif_get_slong(e->data, bo) & 0xffff);
        }
    }
    exif_data_unref(ed);
    return o;
}

/* The XMP fallback of PIL's Image.getexif when IFD0 has no Orientation: the first match of
 * `tiff:Orientation(="|>)([0-9])` in the XMP packet (JPEG: APP1 "http://ns.adobe.com/xap/1.0/";
 * PNG: the iTXt "XML:com.adobe.xmp"). -1 when there is none. */
static int xmp_orientation(const char *s, size_t n) {
    static const char key[] = "tiff:Orientation";
    const size_t kl = sizeof key - 1;
    for (size_t i = 0; i + kl < n; i++) {
        if (memcmp(s + i, key, kl) != 0) continue;
        size_t j = i + kl;
        if (j + 1 < n && s[j] == '>' && s[j + 1] >= '0' && s[j + 1] <= '9') return s[j + 1] - '0';
        if (j + 2 < n && s[j] == '=' && s[j + 1] == '"' && s[j + 2] >= '0' && s[j + 2] <= '9') return s[j + 2] - '0';
    }
    return -1;
}

/* ImageOps.exif_transpose: the Image.transpose method of each orientation, as a map from output
 * pixel (x, y) to input pixel (sx, sy) of a W x H input:
 *   2 FLIP_LEFT_RIGHT (W-1-x, y)      3 ROTATE_180 (W-1-x, H-1-y)   4 FLIP_TOP_BOTTOM (x, H-1-y)
 *   5 TRANSPOSE (y, x)                6 ROTATE_270 (y, H-1-x)       7 TRANSVERSE (W-1-y, H-1-x)
 *   8 ROTATE_90 (W-1-y, x)            (5-8 swap the output's width and height)
 * Other values (1, 0, 9, ...) leave the image as it is. */
static gm_status apply_orientation(dec *d, gm_error *err) {
    int o = d->orientation;
    if (o < 2 || o > 8) return GM_OK;
    int64_t W = d->w, H = d->h, ow = o >= 5 ? H : W, oh = o >= 5 ? W : H;
    uint8_t *t = gm_malloc((size_t)(W * H * 3));
    if (!t) return nomem_error(d, err);
    for (int64_t y = 0; y < oh; y++) {
        for (int64_t x = 0; x < ow; x++) {
            int64_t sx, sy;
            switch (o) {
            case 2: sx = W - 1 - x, sy = y; break;
            case 3: sx = W - 1 - x, sy = H - 1 - y; break;
            case 4: sx = x, sy = H - 1 - y; break;
            case 5: sx = y, sy = x; break;
            case 6: sx = y, sy = H - 1 - x; break;
            case 7: sx = W - 1 - y, sy = H - 1 - x; break;
            default: sx = W - 1 - y, sy = x; break; /* 8 */
            }
            memcpy(t + (y * ow + x) * 3, d->out + (sy * W + sx) * 3, 3);
        }
    }
    gm_free(d->out);
    d->out = t, d->w = ow, d->h = oh;
    return GM_OK;
}

/* ---- PNG ----------------------------------------------------------------------------------------- */

static void png_err_fn(png_structp png, png_const_charp msg) {
    dec *d = png_get_error_ptr(png);
    if (!d->msg[0]) snprintf(d->msg, sizeof d->msg, "%s", msg);
    longjmp(d->jb, 1);
}

/* Recorded, then turned into an error after the libpng call returns (see the file comment). */
static void png_warn_fn(png_structp png, png_const_charp msg) {
    dec *d = png_get_error_ptr(png);
    if (!d->msg[0]) snprintf(d->msg, sizeof d->msg, "%s", msg);
    d->warned = true;
}

static png_voidp png_malloc_fn(png_structp png, png_alloc_size_t n) {
    void *p = gm_malloc(n);
    if (!p) ((dec *)png_get_mem_ptr(png))->nomem = true;
    return p;
}

static void png_free_fn(png_structp png, png_voidp p) { gm_free(p); }

static void png_read_fn(png_structp png, png_bytep data, size_t n) {
    dec *d = png_get_io_ptr(png);
    if (fread(data, 1, n, d->f) != n) png_error(png, "unexpected end of file");
}

/* How PIL reads one PNG (PngImagePlugin: mode, rawmode, info["transparency"]). */
typedef struct png_px {
    int ct, bd;                 /* colour type, bit depth */
    bool has_alpha;             /* transformers' convert_to_rgb composites: an alpha band or tRNS */
    bool trns;                  /* a tRNS chunk (gray / RGB colour key, palette alpha) */
    uint16_t key[3];            /* gray or RGB colour key, as stored (bit depth of the file) */
    uint8_t pal[256][3], alpha[256];
} png_px;

/* One row of native samples (after png_set_packing: one byte per sample below 8 bits, two
 * big-endian bytes at 16) into RGB. */
static void png_row_to_rgb(const png_px *p, const uint8_t *in, int64_t w, uint8_t *o) {
    const int hi = p->bd == 16 ? 2 : 1; /* bytes per sample; the high byte comes first */
    switch (p->ct) {
    case PNG_COLOR_TYPE_GRAY: {
        /* PIL: "1" (0/255), "L;2" (x 0x55), "L;4" (x 0x11), "L", "I;16B" (see the header) */
        const int scale = p->bd == 1 ? 255 : p->bd == 2 ? 0x55 : p->bd == 4 ? 0x11 : 1;
        for (int64_t x = 0; x < w; x++, o += 3) {
            uint32_t v = (uint32_t)(in[x * hi] * scale);
            if (!p->has_alpha) {
                o[0] = o[1] = o[2] = (uint8_t)v;
                continue;
            }
            /* Image.convert("RGBA") of a mode with info["transparency"] (ImagingConvertTransparent):
             * alpha 0 where the converted pixel equals the stored key, compared as PIL does - for 1-bit
             * files PIL stores the key as 255/0; for 2/4-bit ones it keeps the raw value and compares it
             * with the scaled pixel; 16-bit gray (our own decoding) compares the full 16-bit sample. */
            bool clear;
            if (p->bd == 16) clear = (uint32_t)((in[x * 2] << 8) | in[x * 2 + 1]) == p->key[0];
            else if (p->bd == 1) clear = v == (p->key[0] ? 255u : 0u);
            else clear = v == p->key[0];
            over_white(o, v, v, v, clear ? 0 : 255);
        }
        break;
    }
    case PNG_COLOR_TYPE_GRAY_ALPHA: /* PIL "LA", and "LA;16B" -> RGBA */
        for (int64_t x = 0; x < w; x++, o += 3) {
            uint32_t v = in[x * 2 * hi], a = in[x * 2 * hi + hi];
            over_white(o, v, v, v, a);
        }
        break;
    case PNG_COLOR_TYPE_RGB: /* PIL "RGB", "RGB;16B" (high bytes) */
        for (int64_t x = 0; x < w; x++, o += 3) {
            const uint8_t *s = in + x * 3 * hi;
            uint32_t r = s[0], g = s[hi], b = s[2 * hi];
            if (!p->has_alpha) {
                o[0] = (uint8_t)r, o[1] = (uint8_t)g, o[2] = (uint8_t)b;
                continue;
            }
            /* rgbT2a: the 8-bit pixel against the key as stored (16-bit keys of 16-bit files too) */
            bool clear = r == p->key[0] && g == p->key[1] && b == p->key[2];
            over_white(o, r, g, b, clear ? 0 : 255);
        }
        break;
    case PNG_COLOR_TYPE_RGB_ALPHA: /* PIL "RGBA", "RGBA;16B" */
        for (int64_t x = 0; x < w; x++, o += 3) {
            const uint8_t *s = in + x * 4 * hi;
            over_white(o, s[0], s[hi], s[2 * hi], s[3 * hi]);
        }
        break;
    default: /* PNG_COLOR_TYPE_PALETTE: PIL "P" (p2rgb), or p2rgba after putpalettealphas */
        for (int64_t x = 0; x < w; x++, o += 3) {
            const uint8_t *c = p->pal[in[x]];
            if (p->has_alpha) over_white(o, c[0], c[1], c[2], p->alpha[in[x]]);
            else o[0] = c[0], o[1] = c[1], o[2] = c[2];
        }
        break;
    }
}

/* The body of the PNG decoder; on any failure (returned or jumped) the caller releases d. */
static gm_status png_decode(dec *d, gm_error *err) {
    d->png = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, d, png_err_fn, png_warn_fn, d, png_malloc_fn, png_free_fn);
    if (!d->png) return nomem_error(d, err);
    d->info = png_create_info_struct(d->png);
    if (!d->info) return nomem_error(d, err);
    if (setjmp(d->jb)) {
        if (d->nomem) return nomem_error(d, err);
        return gm_error_set(err, GM_ERR_FORMAT, "%s: corrupt or truncated PNG: %s\n" HINT_CORRUPT, d->name, d->msg);
    }
#define PNG_CHECK()                                                                              \
    do {                                                                                         \
        if (d->warned) png_error(d->png, d->msg);                                                \
    } while (0)
    png_set_read_fn(d->png, d, png_read_fn);
    /* the pixel limit below is the one that counts (libpng's default stops at 1,000,000 x 1,000,000) */
    png_set_user_limits(d->png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
    /* ancillary chunks are read whole: at most GM_PNG_MAX_CHUNK bytes each (IDAT is streamed) */
    png_set_chunk_malloc_max(d->png, GM_PNG_MAX_CHUNK);
    /* libpng's "benign" errors (a chunk too large, a bad CRC on an ancillary chunk, too much or too
     * little image data, ...) are fatal at once, not warnings it carries on after */
    png_set_benign_errors(d->png, 0);
    /* PIL maps palette indices past the PLTE entries to black instead of failing */
    png_set_check_for_invalid_index(d->png, 0);
    /* Chunks PIL does not use for pixels: skip them unread (colour management, text but XMP, ...) */
    static const png_byte skip[] = "bKGD\0cHRM\0cICP\0gAMA\0hIST\0iCCP\0oFFs\0pCAL\0pHYs\0sBIT\0sCAL\0"
                                   "sPLT\0sRGB\0tEXt\0tIME\0zTXt";
    png_set_keep_unknown_chunks(d->png, PNG_HANDLE_CHUNK_NEVER, skip, (int)(sizeof skip / 5));
    png_read_info(d->png, d->info);
    PNG_CHECK();

    png_uint_32 w, h;
    int bd, ct, il;
    png_get_IHDR(d->png, d->info, &w, &h, &bd, &ct, &il, NULL, NULL);
    d->w = w, d->h = h;
    if ((int64_t)w * (int64_t)h > d->max_pixels) return limit_error(d, w, h, err);

    png_px pxs = {0}, *px = &pxs; /* (used on the normal path only, never after a longjmp) */
    px->ct = ct, px->bd = bd;
    if (ct == PNG_COLOR_TYPE_PALETTE) {
        /* the PLTE entries; indices past them are opaque black in PIL 13 (Image.convert of a "P"
         * image whose palette is shorter than its indices; libpng's index check is off above) */
        for (int i = 0; i < 256; i++) px->alpha[i] = 255;
        png_colorp pal = NULL;
        int npal = 0;
        if (png_get_PLTE(d->png, d->info, &pal, &npal))
            for (int i = 0; i < npal && i < 256; i++) px->pal[i][0] = pal[i].red, px->pal[i][1] = pal[i].green, px->pal[i][2] = pal[i].blue;
    }
    png_bytep trans_alpha = NULL;
    int num_trans = 0;
    png_color_16p trans_color = NULL;
    if (png_get_tRNS(d->png, d->info, &trans_alpha, &num_trans, &trans_color)) {
        px->trns = true;
        if (ct == PNG_COLOR_TYPE_PALETTE) {
            for (int i = 0; i < num_trans && i < 256; i++) px->alpha[i] = trans_alpha[i];
        } else if (trans_color) {
            if (ct == PNG_COLOR_TYPE_GRAY) px->key[0] = trans_color->gray;
            else px->key[0] = trans_color->red, px->key[1] = trans_color->green, px->key[2] = trans_color->blue;
        }
    }
    /* convert_to_rgb: `"A" in image.getbands() or image.info.get("transparency") is not None` */
    px->has_alpha = ct == PNG_COLOR_TYPE_GRAY_ALPHA || ct == PNG_COLOR_TYPE_RGB_ALPHA || px->trns;

    if (bd < 8) png_set_packing(d->png); /* one byte per sample, unscaled */
    int passes = png_set_interlace_handling(d->png);
    png_read_update_info(d->png, d->info);
    PNG_CHECK();
    size_t rowbytes = png_get_rowbytes(d->png, d->info);

    d->out = gm_malloc((size_t)w * h * 3);
    if (!d->out) return nomem_error(d, err);
    if (passes > 1) {
        /* Adam7: libpng fills every row in each of the 7 passes, so the whole image stays native */
        d->buf = gm_malloc(rowbytes * h);
        d->rows = gm_malloc(sizeof(uint8_t *) * h);
        if (!d->buf || !d->rows) return nomem_error(d, err);
        for (png_uint_32 y = 0; y < h; y++) d->rows[y] = d->buf + rowbytes * y;
        png_read_image(d->png, d->rows);
        PNG_CHECK();
        for (png_uint_32 y = 0; y < h; y++) png_row_to_rgb(px, d->rows[y], w, d->out + (size_t)y * w * 3);
    } else {
        d->buf = gm_malloc(rowbytes);
        if (!d->buf) return nomem_error(d, err);
        for (png_uint_32 y = 0; y < h; y++) {
            png_read_row(d->png, d->buf, NULL);
            PNG_CHECK();
            png_row_to_rgb(px, d->buf, w, d->out + (size_t)y * w * 3);
        }
    }
    /* the chunks after the image data (an eXIf or iTXt may be there; PIL's load() reads them too) */
    png_read_end(d->png, d->info);
    PNG_CHECK();
#undef PNG_CHECK

    /* Orientation: PNG eXIf holds the TIFF structure without the "Exif\0\0" of JPEG's APP1; PIL
     * prepends it (chunk_eXIf), so do we. */
    int o = -1;
    png_uint_32 nexif = 0;
    png_bytep exif = NULL;
    if (png_get_eXIf_1(d->png, d->info, &nexif, &exif) && exif && nexif > 0 && nexif < (1u << 26)) {
        uint8_t *e = gm_malloc(nexif + 6);
        if (!e) return nomem_error(d, err);
        memcpy(e, "Exif\0\0", 6);
        memcpy(e + 6, exif, nexif);
        o = exif_orientation(e, nexif + 6);
        gm_free(e);
    }
    if (o < 0) {
        png_textp text = NULL;
        int ntext = 0;
        png_get_text(d->png, d->info, &text, &ntext);
        for (int i = ntext - 1; i >= 0 && o < 0; i--) /* the last one wins in PIL's info dict */
            if (text[i].key && strcmp(text[i].key, "XML:com.adobe.xmp") == 0 && text[i].text) {
                size_t n = text[i].compression >= PNG_ITXT_COMPRESSION_NONE ? text[i].itxt_length : text[i].text_length;
                o = xmp_orientation(text[i].text, n);
                break;
            }
    }
    d->orientation = o;
    return GM_OK;
}

/* ---- JPEG ---------------------------------------------------------------------------------------- */

static void jpeg_error_exit_fn(j_common_ptr cinfo) {
    dec *d = cinfo->client_data;
    char buf[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, buf);
    if (!d->msg[0]) snprintf(d->msg, sizeof d->msg, "%s", buf);
    if (cinfo->err->msg_code == JERR_OUT_OF_MEMORY) d->nomem = true;
    longjmp(d->jb, 1);
}

/* Warnings (msg_level -1: corrupt data, premature end of file, ...) are errors; trace messages
 * (msg_level >= 0) are dropped. */
static void jpeg_emit_message_fn(j_common_ptr cinfo, int msg_level) {
    if (msg_level < 0) jpeg_error_exit_fn(cinfo);
}

static void jpeg_output_message_fn(j_common_ptr cinfo) { (void)cinfo; }

static void jpeg_progress_fn(j_common_ptr cinfo) {
    j_decompress_ptr c = (j_decompress_ptr)cinfo;
    if (c->input_scan_number > GM_JPEG_MAX_SCANS) {
        dec *d = cinfo->client_data;
        snprintf(d->msg, sizeof d->msg, "more than %d progressive scans", GM_JPEG_MAX_SCANS);
        longjmp(d->jb, 1);
    }
}

static gm_status jpeg_decode(dec *d, gm_error *err) {
    d->cinfo.err = jpeg_std_error(&d->jerr);
    d->jerr.error_exit = jpeg_error_exit_fn;
    d->jerr.emit_message = jpeg_emit_message_fn;
    d->jerr.output_message = jpeg_output_message_fn;
    d->cinfo.client_data = d;
    if (setjmp(d->jb)) {
        if (d->nomem) return nomem_error(d, err);
        return gm_error_set(err, GM_ERR_FORMAT, "%s: corrupt or truncated JPEG: %s\n" HINT_CORRUPT, d->name, d->msg);
    }
    d->cinfo_live = true; /* jpeg_destroy is safe even if the create below fails half-way */
    jpeg_create_decompress(&d->cinfo);
    d->progress.progress_monitor = jpeg_progress_fn;
    d->cinfo.progress = &d->progress;
    jpeg_stdio_src(&d->cinfo, d->f);
    jpeg_save_markers(&d->cinfo, JPEG_APP0 + 1, 0xFFFF); /* EXIF and XMP */
    jpeg_read_header(&d->cinfo, TRUE);
    d->w = d->cinfo.image_width, d->h = d->cinfo.image_height;
    if (d->w * d->h > d->max_pixels) return limit_error(d, d->w, d->h, err);

    /* PIL's modes by component count (JpegImagePlugin SOF): 1 "L", 3 "RGB" (libjpeg converts
     * YCbCr), 4 "CMYK" read as "CMYK;I" (libjpeg converts YCCK to CMYK). */
    int nc = d->cinfo.num_components;
    if (nc == 1) d->cinfo.out_color_space = JCS_GRAYSCALE;
    else if (nc == 3) d->cinfo.out_color_space = JCS_RGB;
    else if (nc == 4) d->cinfo.out_color_space = JCS_CMYK;
    else
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: a JPEG with %d colour components; only 1 (gray), 3 (YCbCr/RGB) and 4 (CMYK/YCCK) "
                            "are supported\nhint: convert it to an RGB JPEG or a PNG",
                            d->name, nc);

    /* The orientation, from the markers saved before the first scan: the first APP1 "Exif\0\0"
     * (PIL appends later ones to it, which leaves IFD0 as it is), else the XMP APP1's. */
    int o = -1;
    const char xmp_sig[] = "http://ns.adobe.com/xap/1.0/";
    const uint8_t *xmp = NULL;
    size_t nxmp = 0;
    for (jpeg_saved_marker_ptr m = d->cinfo.marker_list; m; m = m->next) {
        if (m->marker != JPEG_APP0 + 1 || !m->data) continue;
        if (o < 0 && m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0) o = exif_orientation(m->data, m->data_length);
        else if (m->data_length >= sizeof xmp_sig && memcmp(m->data, xmp_sig, sizeof xmp_sig) == 0)
            xmp = m->data + sizeof xmp_sig, nxmp = m->data_length - sizeof xmp_sig; /* the last one wins */
    }
    if (o < 0 && xmp) o = xmp_orientation((const char *)xmp, nxmp);
    d->orientation = o;

    jpeg_start_decompress(&d->cinfo);
    int64_t w = d->cinfo.output_width, h = d->cinfo.output_height, oc = d->cinfo.output_components;
    d->out = gm_malloc((size_t)(w * h * 3));
    d->buf = gm_malloc((size_t)(w * oc));
    if (!d->out || !d->buf) return nomem_error(d, err);
    while (d->cinfo.output_scanline < d->cinfo.output_height) {
        int64_t y = d->cinfo.output_scanline;
        JSAMPROW row = d->buf;
        if (jpeg_read_scanlines(&d->cinfo, &row, 1) != 1) /* cannot happen with a stdio source */
            return gm_error_set(err, GM_ERR_FORMAT, "%s: corrupt or truncated JPEG: no data for row %lld\n" HINT_CORRUPT, d->name,
                                (long long)y);
        uint8_t *o3 = d->out + y * w * 3;
        if (oc == 1) /* PIL l2rgb */
            for (int64_t x = 0; x < w; x++) o3[3 * x] = o3[3 * x + 1] = o3[3 * x + 2] = d->buf[x];
        else if (oc == 3)
            memcpy(o3, d->buf, (size_t)(w * 3));
        else
            for (int64_t x = 0; x < w; x++) cmyk_inverted_to_rgb(o3 + 3 * x, d->buf + 4 * x);
    }
    jpeg_finish_decompress(&d->cinfo);
    jpeg_destroy_decompress(&d->cinfo);
    d->cinfo_live = false;
    return GM_OK;
}

/* ---- format detection and the entry points ---------------------------------------------------- */

const char *gm_image_sniff(const void *head, size_t n) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    static const uint8_t jp2_sig[12] = {0, 0, 0, 12, 'j', 'P', ' ', ' ', '\r', '\n', 0x87, '\n'};
    const uint8_t *b = head;
    if (n == 0) return "an empty file";
    /* a prefix of the PNG signature is a truncated PNG: libpng says so */
    if (n >= 4 && memcmp(b, png_sig, n < 8 ? n : 8) == 0) return "PNG";
    if (n >= 2 && b[0] == 0xFF && b[1] == 0xD8) return "JPEG";
    if (n >= 6 && (memcmp(b, "GIF87a", 6) == 0 || memcmp(b, "GIF89a", 6) == 0)) return "GIF";
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) return "WebP";
    if (n >= 4 && (memcmp(b, "II*\0", 4) == 0 || memcmp(b, "MM\0*", 4) == 0)) return "TIFF";
    if (n >= 12 && memcmp(b + 4, "ftyp", 4) == 0) {
        if (memcmp(b + 8, "avif", 4) == 0 || memcmp(b + 8, "avis", 4) == 0) return "AVIF";
        if (memcmp(b + 8, "hei", 3) == 0 || memcmp(b + 8, "mif1", 4) == 0 || memcmp(b + 8, "msf1", 4) == 0) return "HEIF";
    }
    if ((n >= 12 && memcmp(b, jp2_sig, 12) == 0) || (n >= 4 && memcmp(b, "\xFF\x4F\xFF\x51", 4) == 0)) return "JPEG 2000";
    if (n >= 4 && memcmp(b, "\0\0\1\0", 4) == 0) return "ICO";
    if (n >= 4 && memcmp(b, "%PDF", 4) == 0) return "PDF";
    if (n >= 4 && memcmp(b, "qoif", 4) == 0) return "QOI";
    if (n >= 4 && memcmp(b, "8BPS", 4) == 0) return "Photoshop PSD";
    if ((n >= 5 && memcmp(b, "<?xml", 5) == 0) || (n >= 4 && memcmp(b, "<svg", 4) == 0)) return "SVG/XML";
    if (n >= 2 && b[0] == 'B' && b[1] == 'M') return "BMP";
    return NULL;
}

/* Sniffs the stream and runs its decoder; fills *out on success. */
static gm_status decode_stream(FILE *f, const char *name, const gm_image_limits *limits, gm_image *out, gm_error *err) {
    uint8_t head[16];
    size_t got = fread(head, 1, sizeof head, f);
    if (got == 0)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: empty file (0 bytes)\nhint: the file was not written completely; make or get it again", name);
    if (fseek(f, 0, SEEK_SET) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot seek: %s\nhint: pass a regular file", name, strerror(errno));
    const char *kind = gm_image_sniff(head, got);
    if (!kind)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: not a PNG or JPEG file (it starts with the bytes %02x %02x %02x %02x)\n"
                            "hint: gemmarun reads PNG and JPEG images; check that this is the file you meant",
                            name, head[0], got > 1 ? head[1] : 0, got > 2 ? head[2] : 0, got > 3 ? head[3] : 0);
    bool is_png = strcmp(kind, "PNG") == 0, is_jpeg = strcmp(kind, "JPEG") == 0;
    if (!is_png && !is_jpeg)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: this is a %s image, not PNG or JPEG\n"
                            "hint: convert it to PNG or JPEG first (e.g. ImageMagick: convert in.%s out.png)",
                            name, kind, strcmp(kind, "Photoshop PSD") == 0 ? "psd" : strcmp(kind, "JPEG 2000") == 0 ? "jp2" : kind);

    dec *d = gm_calloc(1, sizeof *d);
    if (!d) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory\nhint: free memory", name);
    d->name = name;
    d->max_pixels = limits && limits->max_pixels > 0 ? limits->max_pixels : GM_IMAGE_MAX_PIXELS;
    d->f = f;
    d->orientation = 1;
    gm_status s = is_png ? png_decode(d, err) : jpeg_decode(d, err);
    if (s == GM_OK) s = apply_orientation(d, err);
    if (s == GM_OK) {
        *out = (gm_image){.w = d->w, .h = d->h, .rgb = d->out};
        d->out = NULL;
    }
    dec_release(d);
    gm_free(d);
    return s;
}

gm_status gm_image_load(const char *path, const gm_image_limits *limits, gm_image *out, gm_error *err) {
    GM_ASSERT(path && out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot open: %s\nhint: check the path and the file's permissions", path,
                            strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return gm_error_set(err, GM_ERR_IO, "%s: is a folder, not an image file\nhint: give the path of a PNG or JPEG file", path);
    }
    gm_status s = decode_stream(f, path, limits, out, err);
    fclose(f);
    return s;
}

gm_status gm_image_decode(const void *data, size_t n, const char *name, const gm_image_limits *limits, gm_image *out,
                          gm_error *err) {
    GM_ASSERT(out && (data || n == 0));
    if (!name) name = "(image in memory)";
    if (n == 0)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: empty file (0 bytes)\nhint: the file was not written completely; make or get it again", name);
    FILE *f = fmemopen((void *)data, n, "rb"); /* read only: the buffer is never written */
    if (!f) return gm_error_set(err, GM_ERR_NOMEM, "%s: cannot open the buffer as a stream: %s\nhint: free memory", name, strerror(errno));
    gm_status s = decode_stream(f, name, limits, out, err);
    fclose(f);
    return s;
}

void gm_image_free(gm_image *img) {
    if (!img) return;
    gm_free(img->rgb);
    *img = (gm_image){0};
}

/* ---- image references ------------------------------------------------------------------------- */

/* One unsigned decimal integer of a fragment at *p (Media Fragments: 1*DIGIT), at most 2^31 - 1;
 * advances *p. False when there is none or it is too large. */
static bool ref_number(const char **p, int64_t *v) {
    const char *s = *p;
    int64_t x = 0;
    while (*s >= '0' && *s <= '9') {
        x = 10 * x + (*s - '0');
        if (x > INT32_MAX) return false;
        s++;
    }
    if (s == *p) return false;
    *p = s, *v = x;
    return true;
}

gm_status gm_image_ref_parse(const char *ref, char *path, size_t cap, gm_image_rect *r, bool *has_rect, gm_error *err) {
    GM_ASSERT(ref && path && cap > 0 && r && has_rect);
    /* the last '#' starts a fragment only when "xywh=" follows and no '/' does (a '#' in a folder
     * name is not a fragment): anything else is part of the file's name */
    const char *hash = strrchr(ref, '#');
    bool frag = hash && strncmp(hash + 1, "xywh=", 5) == 0 && !strchr(hash, '/');
    size_t n = frag ? (size_t)(hash - ref) : strlen(ref);
    if (n == 0)
        return gm_error_set(err, GM_ERR_INVALID, "image reference '%s': no file before the region\nhint: write PATH#xywh=X,Y,W,H", ref);
    if (n >= cap)
        return gm_error_set(err, GM_ERR_INVALID, "image reference '%.200s...': the path is %zu bytes, longer than %zu\nhint: use a shorter path",
                            ref, n, cap - 1);
    gm_image_rect q = {0};
    if (frag) {
        const char *p = hash + 6;
        if (strncmp(p, "percent:", 8) == 0)
            return gm_error_set(err, GM_ERR_INVALID,
                                "image reference '%s': percent regions are not supported\nhint: give the region in pixels: #xywh=X,Y,W,H", ref);
        if (strncmp(p, "pixel:", 6) == 0) p += 6;
        int64_t *v[4] = {&q.x, &q.y, &q.w, &q.h};
        bool ok = true;
        for (int i = 0; i < 4 && ok; i++) {
            ok = ref_number(&p, v[i]) && *p == (i < 3 ? ',' : '\0');
            if (i < 3) p++;
        }
        if (!ok)
            return gm_error_set(err, GM_ERR_INVALID,
                                "image reference '%s': malformed region '%s': expected #xywh=X,Y,W,H, four whole numbers of pixels "
                                "(at most 2147483647, no signs or spaces)\nhint: e.g. %.*s#xywh=0,0,20,20 is the 20 x 20 pixels at the top left",
                                ref, hash, (int)(n < 200 ? n : 200), ref);
        if (q.w == 0 || q.h == 0)
            return gm_error_set(err, GM_ERR_INVALID, "image reference '%s': the region is empty (width %lld, height %lld)\n"
                                "hint: W and H of #xywh=X,Y,W,H must be at least 1", ref, (long long)q.w, (long long)q.h);
    }
    memcpy(path, ref, n);
    path[n] = '\0';
    *has_rect = frag;
    if (frag) *r = q;
    return GM_OK;
}

gm_status gm_image_ref_check(const char *ref, gm_image_rect r, int64_t w, int64_t h, gm_error *err) {
    if (r.x >= 0 && r.y >= 0 && r.w >= 1 && r.h >= 1 && r.x <= w - r.w && r.y <= h - r.h) return GM_OK;
    return gm_error_set(err, GM_ERR_INVALID,
                        "image reference '%s': the region (columns %lld..%lld, rows %lld..%lld) is not inside the image, "
                        "which is %lld x %lld pixels\nhint: X + W must be at most %lld and Y + H at most %lld",
                        ref, (long long)r.x, (long long)(r.x + r.w - 1), (long long)r.y, (long long)(r.y + r.h - 1),
                        (long long)w, (long long)h, (long long)w, (long long)h);
}

void gm_image_ref_fragment(gm_image_rect r, char *buf, size_t cap) {
    snprintf(buf, cap, "#xywh=%lld,%lld,%lld,%lld", (long long)r.x, (long long)r.y, (long long)r.w, (long long)r.h);
}

gm_status gm_image_load_ref(const char *ref, const gm_image_limits *limits, gm_image *out, gm_error *err) {
    GM_ASSERT(ref && out);
    char path[GM_IMAGE_PATH_MAX];
    gm_image_rect r;
    bool has_rect = false;
    GM_TRY(gm_image_ref_parse(ref, path, sizeof path, &r, &has_rect, err));
    if (!has_rect) return gm_image_load(path, limits, out, err);
    gm_image img = {0};
    GM_TRY(gm_image_load(path, limits, &img, err));
    gm_status s = gm_image_ref_check(ref, r, img.w, img.h, err);
    if (s == GM_OK) s = gm_image_crop(&img, r, out, err);
    gm_image_free(&img);
    return s;
}
