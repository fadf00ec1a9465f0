#!/usr/bin/env python3
"""Reference images and PIL/transformers outputs for tests/unit/test_image.c (core/image).

Writes tests/ref/images/ (good and bad image files) and tests/ref/image_ref.h5 (what Pillow and
transformers make of them), so the C test needs no Python. Run by hand:

    /opt/refvenv/bin/python tests/ref/make_image_ref.py

Needs pillow 13.0.0, transformers 5.24 (Gemma3ImageProcessorPil, Gemma3ImageProcessor), torch +
torchvision (the default processor), scikit-image (its real photo `chelsea.png`, committed as is),
h5py, numpy, and a C compiler with libjpeg headers (one file, ycck.jpg, is written by a 30-line
libjpeg program: no Python library writes YCCK JPEGs). Deterministic (fixed seeds, zlib and
libjpeg are deterministic, HDF5 without timestamps); prints the sha256 of everything it writes.

What the references are (the path a transformers user takes):
    im  = PIL.Image.open(path)
    im  = PIL.ImageOps.exif_transpose(im)                # load_image does the same
    rgb = transformers.image_transforms.convert_to_rgb(im, return_numpy=True)
    pixel_values = Gemma3ImageProcessorPil(size={"height": S, "width": S})(im, return_tensors="np")

Layout of image_ref.h5 (every dataset gzip-compressed; large arrays are stored as their sha256
only, the C test hashes its own output the same way - C order, native little-endian bytes):
  attrs: generator, version_*, pil_max_image_pixels (PIL's Image.MAX_IMAGE_PIXELS)
  /decoded/<file>/        attrs: w, h, pil_mode, orientation (what PIL's getexif says; 1 if none),
                          note (16-bit gray only)
      rgb  uint8 (h, w, 3)       when h*w*3 <= 100,000 bytes
      sha256 uint8 (32)          of the (h, w, 3) bytes, always
  /resize/<case>/         attrs: src (a /decoded/ name or "tall_strip"), w, h (output)
      rgb, sha256                Image.fromarray(decoded).resize((w, h), Image.BILINEAR)
  /resize_input/tall_strip uint8 (300, 2, 3): columns 200..201 of chelsea (taller than 100x its
                          width: Image.resize's vertical-first path)
  /pixel_values/<case>/   attrs: src, size, n, num_crops, pan_and_scan
      values float32 (n, 3, S, S) when small; sha256 of the float32 bytes, always
  /pixel_values/normalize_lut float32 (256): the processor's value for each 8-bit level (the
                          script checks pixel_values == lut[resized] bit for bit)
  /pan_and_scan/          the crop rectangles of Gemma3ImageProcessorPil.pan_and_scan for many
                          sizes and options, taken from the numpy views it returns:
      sizes int64 (N, 2) [w, h]; min_crop int64 (N); max_crops int64 (N); min_ratio f64 (N);
      count int64 (N); rects int64 (N, 8, 4) [x, y, w, h] (first `count` rows)
  /torchvision/chelsea_896/ the default (torchvision) Gemma3ImageProcessor on chelsea.png at 896:
      lut float32 (256)  its value for each 8-bit level (fused (x - 127.5) / 127.5 in f32);
      diff int8 (3, 896, 896)  its 8-bit resize minus PIL's; attrs max_abs_diff (vs the PIL
      processor), n_diff
"""
import hashlib
import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import h5py
import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image, ImageOps, PngImagePlugin
from transformers import Gemma3ImageProcessor, Gemma3ImageProcessorPil
from transformers.image_transforms import convert_to_rgb

import skimage

HERE = os.path.dirname(os.path.abspath(__file__))
IMG = os.path.join(HERE, "images")
OUT = os.path.join(HERE, "image_ref.h5")
CORPUS = os.path.join(HERE, "..", "fuzz", "corpus_image")
FULL_MAX_BYTES = 100_000
CHELSEA_SRC = os.path.join(os.path.dirname(skimage.__file__), "data", "chelsea.png")


def log(*a):
    print(*a, flush=True)


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---- a minimal PNG writer: what PIL cannot write (16-bit RGB/RGBA/LA, 2/4-bit gray, Adam7) ----


def _chunk(t, data):
    return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def _pack_row(row, bit_depth):
    row = np.asarray(row).reshape(-1)
    if bit_depth == 16:
        return row.astype(">u2").tobytes()
    if bit_depth == 8:
        return row.astype(np.uint8).tobytes()
    per = 8 // bit_depth
    out = bytearray((len(row) + per - 1) // per)
    for i, v in enumerate(row):
        out[i // per] |= int(v) << (8 - bit_depth * (i % per + 1))
    return bytes(out)


def write_png(path, arr, color_type, bit_depth, interlace=False, plte=None, trns=None, extra=b""):
    """arr: (H, W) or (H, W, C) samples already in the bit depth's range. Filter 0 on every row."""
    arr = np.asarray(arr)
    h, w = arr.shape[:2]
    raw = bytearray()
    for x0, y0, dx, dy in (ADAM7 if interlace else [(0, 0, 1, 1)]):
        sub = arr[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue  # an empty pass has no rows at all
        for row in sub:
            raw += b"\0" + _pack_row(row, bit_depth)
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, int(interlace)))
    if plte is not None:
        data += _chunk(b"PLTE", bytes(plte))
    if trns is not None:
        data += _chunk(b"tRNS", bytes(trns))
    data += extra + _chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + _chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


YCCK_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>
/* ycck in.raw W H out.jpg: CMYK bytes (W*H*4) -> a YCCK JPEG (Adobe transform 2), quality 90 */
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    int w = atoi(argv[2]), h = atoi(argv[3]);
    unsigned char *buf = malloc((size_t)w * h * 4);
    FILE *in = fopen(argv[1], "rb");
    if (!in || fread(buf, 1, (size_t)w * h * 4, in) != (size_t)w * h * 4) return 1;
    fclose(in);
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE *out = fopen(argv[4], "wb");
    jpeg_stdio_dest(&c, out);
    c.image_width = w, c.image_height = h, c.input_components = 4, c.in_color_space = JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_colorspace(&c, JCS_YCCK);
    jpeg_set_quality(&c, 90, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = buf + (size_t)c.next_scanline * w * 4;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    fclose(out);
    jpeg_destroy_compress(&c);
    free(buf);
    return 0;
}
"""


def write_ycck(path, cmyk_img):
    with tempfile.TemporaryDirectory() as t:
        src, exe, raw = os.path.join(t, "ycck.c"), os.path.join(t, "ycck"), os.path.join(t, "in.raw")
        with open(src, "w") as f:
            f.write(YCCK_C)
        subprocess.run(["cc", "-O1", src, "-o", exe, "-ljpeg"], check=True)
        # Adobe's convention stores CMYK inverted; PIL reads 4-component JPEGs that way ("CMYK;I")
        inv = 255 - np.asarray(cmyk_img, dtype=np.uint8)
        with open(raw, "wb") as f:
            f.write(inv.tobytes())
        w, h = cmyk_img.size
        subprocess.run([exe, raw, str(w), str(h), path], check=True)


def exif_bytes(orientation=None, make=None):
    ex = Image.Exif()
    if orientation is not None:
        ex[0x0112] = orientation
    if make is not None:
        ex[0x010F] = make
    return ex.tobytes()


def xmp_packet(orientation):
    return ('<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description rdf:about="" '
            f'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="{orientation}"/></rdf:RDF></x:xmpmeta>'
            '<?xpacket end="w"?>')


# ---- the fixture files ------------------------------------------------------------------------


def make_files():
    if os.path.isdir(IMG):
        shutil.rmtree(IMG)
    os.makedirs(os.path.join(IMG, "bad"))
    P = lambda n: os.path.join(IMG, n)  # noqa: E731
    rng = np.random.default_rng(20261202)

    shutil.copyfile(CHELSEA_SRC, P("chelsea.png"))  # 451 x 300 RGB, the real photo as shipped
    chelsea = Image.open(P("chelsea.png")).convert("RGB")
    small = chelsea.resize((120, 80), Image.LANCZOS)
    tiny = chelsea.crop((150, 40, 246, 112)).resize((64, 48), Image.LANCZOS)  # the cat's face
    face = chelsea.crop((160, 50, 232, 98)).resize((48, 32), Image.LANCZOS)
    sarr = np.asarray(small)

    good = ["chelsea.png"]

    def add(name):
        good.append(name)

    # JPEG
    chelsea.save(P("chelsea.jpg"), quality=90)
    add("chelsea.jpg")
    small.save(P("small.jpg"), quality=85)
    add("small.jpg")
    small.save(P("small_444.jpg"), quality=85, subsampling=0)
    add("small_444.jpg")
    small.save(P("small_422.jpg"), quality=85, subsampling=1)
    add("small_422.jpg")
    small.save(P("small_progressive.jpg"), quality=85, progressive=True)
    add("small_progressive.jpg")
    small.convert("L").save(P("gray.jpg"), quality=85)
    add("gray.jpg")
    small.convert("CMYK").save(P("cmyk.jpg"), quality=90)
    add("cmyk.jpg")
    write_ycck(P("ycck.jpg"), small.convert("CMYK"))
    add("ycck.jpg")
    with open(P("small.jpg"), "rb") as f:  # a JPEG named .png: the bytes decide
        open(P("jpeg_named.png"), "wb").write(f.read())
    add("jpeg_named.png")
    chelsea.resize((1000, 300), Image.LANCZOS).save(P("wide.jpg"), quality=90)  # pan & scan: 3 crops
    add("wide.jpg")
    chelsea.resize((300, 700), Image.LANCZOS).save(P("tall.jpg"), quality=90)  # pan & scan: 2 crops
    add("tall.jpg")
    # EXIF orientation 1..8 (JPEG APP1), non-square so that 5-8 swap the sides
    for k in range(1, 9):
        face.save(P(f"orient{k}.jpg"), quality=90, exif=exif_bytes(k))
        add(f"orient{k}.jpg")
    face.save(P("orient6.png"), exif=exif_bytes(6))  # PNG eXIf chunk
    add("orient6.png")
    # XMP: JPEG with an EXIF without Orientation plus an XMP saying 8; PNG with only an iTXt XMP (5)
    face.save(P("orient_xmp.jpg"), quality=90, exif=exif_bytes(make="gemmarun"), xmp=xmp_packet(8).encode())
    add("orient_xmp.jpg")
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp_packet(5))
    face.save(P("orient_xmp.png"), pnginfo=info)
    add("orient_xmp.png")

    # PNG, 8 bits and below
    small.convert("L").save(P("gray.png"))
    add("gray.png")
    la = Image.merge("LA", (small.convert("L"), Image.fromarray(
        np.clip(np.linspace(-30, 285, 120)[None, :] + rng.normal(0, 20, (80, 120)), 0, 255).astype(np.uint8))))
    la.save(P("gray_alpha.png"))
    add("gray_alpha.png")
    g = small.convert("L")
    key = int(np.bincount(np.asarray(g).ravel()).argmax())
    g.save(P("gray_trns.png"), transparency=key)
    add("gray_trns.png")
    small.convert("1").save(P("gray1.png"))
    add("gray1.png")
    write_png(P("gray4.png"), np.asarray(g) >> 4, 0, 4)
    add("gray4.png")
    # 2-bit gray with tRNS key 1: PIL compares the scaled pixel (0, 85, 170, 255) with the raw key
    write_png(P("gray2_trns.png"), np.asarray(g) >> 6, 0, 2, trns=struct.pack(">H", 1))
    add("gray2_trns.png")
    q = small.quantize(16).convert("RGB")
    qa = np.asarray(q).reshape(-1, 3)
    vals, counts = np.unique(qa, axis=0, return_counts=True)
    rgb_key = tuple(int(v) for v in vals[counts.argmax()])
    q.save(P("rgb_trns.png"), transparency=rgb_key)
    add("rgb_trns.png")
    pal = small.quantize(64)
    pal.save(P("palette.png"))
    add("palette.png")
    pal32 = small.quantize(32)
    pal32.save(P("palette_trns.png"), transparency=bytes((i * 8) % 256 for i in range(32)))
    add("palette_trns.png")
    pal32.save(P("palette_trns1.png"), transparency=3)
    add("palette_trns1.png")
    small.quantize(16).save(P("palette4.png"), bits=4)
    add("palette4.png")
    # a palette with fewer entries than the indices used: PIL's gray ramp beyond the PLTE
    idx = (np.asarray(g) >> 5).astype(np.uint8)  # 0..7
    write_png(P("palette_short.png"), idx, 3, 8, plte=bytes(np.asarray(pal.getpalette()[:12], np.uint8)))
    add("palette_short.png")
    yy, xx = np.mgrid[0:80, 0:120]
    alpha = np.clip(xx * 300 / 119 - 20 + rng.normal(0, 25, (80, 120)) + (yy % 16 == 0) * -300, 0, 255).astype(np.uint8)
    Image.merge("RGBA", (*small.split(), Image.fromarray(alpha))).save(P("rgba.png"))
    add("rgba.png")
    write_png(P("interlaced.png"), sarr, 2, 8, interlace=True)
    add("interlaced.png")
    write_png(P("interlaced_tiny.png"), np.asarray(g)[:5, :3], 0, 8, interlace=True)  # passes with no pixels
    add("interlaced_tiny.png")

    # PNG, 16 bits: a random low byte under the 8-bit value, so that taking the high byte (PIL's
    # RGB;16B) and rounding v/257 differ
    t = np.asarray(tiny).astype(np.uint16)
    low = rng.integers(0, 256, t.shape, dtype=np.uint16)
    t16 = (t << 8) | low
    a16 = ((np.clip(np.linspace(0, 255, 64)[None, :].repeat(48, 0) + rng.normal(0, 30, (48, 64)), 0, 255).astype(np.uint16) << 8)
           | rng.integers(0, 256, (48, 64), dtype=np.uint16))
    write_png(P("rgb16.png"), t16, 2, 16)
    add("rgb16.png")
    write_png(P("rgba16.png"), np.dstack([t16, a16]), 6, 16)
    add("rgba16.png")
    g16 = (np.asarray(tiny.convert("L")).astype(np.uint16) << 8) | rng.integers(0, 256, (48, 64), dtype=np.uint16)
    write_png(P("gray16.png"), g16, 0, 16)
    add("gray16.png")
    write_png(P("gray_alpha16.png"), np.dstack([g16, a16]), 4, 16)
    add("gray_alpha16.png")
    write_png(P("interlaced_rgba16.png"), np.dstack([t16, a16]), 6, 16, interlace=True)
    add("interlaced_rgba16.png")

    # bad files
    B = lambda n: os.path.join(IMG, "bad", n)  # noqa: E731
    jpg = open(P("small.jpg"), "rb").read()
    pngb = open(P("rgba.png"), "rb").read()
    open(B("truncated.jpg"), "wb").write(jpg[: len(jpg) * 6 // 10])
    open(B("truncated.png"), "wb").write(pngb[: len(pngb) * 6 // 10])
    open(B("truncated_header.png"), "wb").write(pngb[:20])
    open(B("empty.png"), "wb").write(b"")
    # corrupt entropy-coded data: 64 random bytes (no 0xFF, so no marker) in the middle of the scan
    sos = jpg.index(b"\xff\xda")
    mid = (sos + len(jpg)) // 2
    junk = bytes(rng.integers(0, 255, 64, dtype=np.uint8))
    open(B("corrupt.jpg"), "wb").write(jpg[:mid] + junk + jpg[mid + 64:])
    # a flipped byte inside the PNG's IDAT: its CRC no longer matches
    idat = pngb.index(b"IDAT")
    cp = bytearray(pngb)
    cp[idat + 100] ^= 0x55
    open(B("corrupt.png"), "wb").write(bytes(cp))
    small.save(B("image.gif"))
    small.save(B("image.bmp"))
    small.save(B("image.webp"), quality=80)
    small.save(B("image.tiff"))
    open(B("text.png"), "wb").write(b"This is not an image, whatever its name says.\n")
    # headers claiming absurd sizes (the pixels would not fit in memory): PNG 100000 x 100000
    row = zlib.compress(b"\0" * 301, 9)
    open(B("huge.png"), "wb").write(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
                                    + _chunk(b"IDAT", row) + _chunk(b"IEND", b""))
    # a small PNG whose eXIf chunk claims 1.5 GB (libpng would allocate it before reading)
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
    open(B("huge_chunk.png"), "wb").write(b"\x89PNG\r\n\x1a\n" + ihdr + struct.pack(">I", 0x60000000) + b"eXIfMM\0*" + b"\0" * 64)
    # JPEG: small.jpg with its SOF0 size patched to 60000 x 60000
    sof = jpg.index(b"\xff\xc0")
    hj = bytearray(jpg)
    hj[sof + 5: sof + 9] = struct.pack(">HH", 60000, 60000)
    open(B("huge.jpg"), "wb").write(bytes(hj))
    return good


# ---- references -----------------------------------------------------------------------------


def pil_reference(path):
    im = Image.open(path)
    mode = im.mode
    tr = ImageOps.exif_transpose(im)
    orientation = im.getexif().get(0x0112, 1)
    rgb = convert_to_rgb(tr, return_numpy=True)
    return im, tr, mode, int(orientation), np.ascontiguousarray(rgb, dtype=np.uint8)


def h5_group(parent, name):
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))


def h5_path(root, path):
    g = root
    for part in path.split("/"):
        if part:
            g = g[part] if part in g else h5_group(g, part)
    return g


def h5_dset(group, name, arr, dtype):
    arr = np.ascontiguousarray(np.asarray(arr, dtype=dtype))
    kw = dict(compression="gzip", compression_opts=9) if arr.size > 64 else {}
    group.create_dataset(name, data=arr, track_times=False, **kw)


def put_array(group, name, arr):
    """Stores sha256 of the C-order bytes, and the array itself when small."""
    arr = np.ascontiguousarray(arr)
    h5_dset(group, "sha256", np.frombuffer(hashlib.sha256(arr.tobytes()).digest(), np.uint8), np.uint8)
    if arr.nbytes <= FULL_MAX_BYTES:
        h5_dset(group, name, arr, arr.dtype)


LUT = np.array([(np.float32(np.float64(u) * (1 / 255)) - np.float32(0.5)) / np.float32(0.5) for u in range(256)], np.float32)


def pas_rects(w, h, min_crop, max_crops, min_ratio):
    """Rectangles of the numpy views Gemma3ImageProcessorPil.pan_and_scan returns."""
    proc = Gemma3ImageProcessorPil()
    img = np.zeros((3, h, w), np.uint8)
    crops = proc.pan_and_scan(img, min_crop, max_crops, min_ratio)
    base = img.__array_interface__["data"][0]
    out = []
    for i, c in enumerate(crops):
        if c.size == 0:
            # numpy does not move the data pointer of an empty slice: its start is where the
            # previous crop ended (crops run along one axis), which is what the slice asked for
            px, py, pw, ph = out[i - 1]
            out.append((px + pw, py, 0, c.shape[1]) if c.shape[2] == 0 else (px, py + ph, c.shape[2], 0))
            continue
        off = c.__array_interface__["data"][0] - base
        y, x = divmod(off, w)
        out.append((x, y, c.shape[2], c.shape[1]))
    return out


def main():
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    good = make_files()
    tmp = OUT + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        vers = {"python": sys.version.split()[0], "pillow": PIL.__version__, "transformers": transformers.__version__,
                "torch": torch.__version__, "torchvision": torchvision.__version__, "numpy": np.__version__,
                "h5py": h5py.__version__, "scikit_image": skimage.__version__}
        for k in sorted(vers):
            f.attrs[f"version_{k}"] = str(vers[k])
        f.attrs["generator"] = "tests/ref/make_image_ref.py"
        f.attrs["pil_max_image_pixels"] = np.int64(Image.MAX_IMAGE_PIXELS)
        f.attrs["chelsea_source_sha256"] = sha256_file(CHELSEA_SRC)

        decoded, transposed = {}, {}
        for name in sorted(good):
            im, tr, mode, orient, rgb = pil_reference(os.path.join(IMG, name))
            g = h5_path(f, f"decoded/{name}")
            g.attrs["w"], g.attrs["h"] = np.int64(rgb.shape[1]), np.int64(rgb.shape[0])
            g.attrs["pil_mode"], g.attrs["orientation"] = mode, np.int64(orient)
            if mode == "I;16":
                # PIL converts I;16 to RGB by clipping at 255; we keep the high byte instead
                raw = np.asarray(tr, dtype=np.uint16)
                hi = np.ascontiguousarray(np.repeat((raw >> 8).astype(np.uint8)[:, :, None], 3, axis=2))
                g.attrs["note"] = ("16-bit gray: reference = high byte (PIL clips I;16 to 255; "
                                   f"{float(np.mean(rgb != hi)):.3f} of PIL's values differ from it)")
                rgb = hi
            put_array(g, "rgb", rgb)
            decoded[name], transposed[name] = rgb, tr
            log(f"decoded {name}: {mode} {rgb.shape[1]}x{rgb.shape[0]} orientation {orient}")

        # resize: down, up, non-square, one axis only, same size; the tall strip (vertical first)
        cases = [("chelsea.png", 896, 896), ("chelsea.png", 224, 224), ("chelsea.png", 64, 48), ("chelsea.png", 37, 91),
                 ("chelsea.png", 451, 120), ("chelsea.png", 700, 300), ("chelsea.jpg", 896, 896), ("small.jpg", 300, 200),
                 ("small.jpg", 160, 40), ("small.jpg", 7, 5), ("small.jpg", 120, 80), ("small.jpg", 121, 80),
                 ("small.jpg", 120, 81), ("small.jpg", 1, 1), ("rgba.png", 32, 32), ("wide.jpg", 896, 896),
                 ("tall_strip", 2, 40), ("tall_strip", 1, 40), ("tall_strip", 5, 600)]
        strip = np.ascontiguousarray(decoded["chelsea.jpg"][:, 200:202])
        h5_dset(h5_path(f, "resize_input"), "tall_strip", strip, np.uint8)
        for src, w, h in cases:
            arr = strip if src == "tall_strip" else decoded[src]
            out = np.asarray(Image.fromarray(arr).resize((w, h), Image.BILINEAR))
            g = h5_path(f, f"resize/{src}_{w}x{h}")
            g.attrs["src"], g.attrs["w"], g.attrs["h"] = src, np.int64(w), np.int64(h)
            put_array(g, "rgb", out)

        # pixel_values of Gemma3ImageProcessorPil (given the exif-transposed PIL image, so its own
        # convert_to_rgb runs): chelsea at 896, every small file at 32, pan & scan of wide/tall
        h5_dset(h5_path(f, "pixel_values"), "normalize_lut", LUT, np.float32)
        pv_cases = [("chelsea.png", 896, False), ("chelsea.jpg", 896, False), ("wide.jpg", 896, True),
                    ("tall.jpg", 896, True), ("wide.jpg", 32, True), ("tall.jpg", 32, True), ("chelsea.png", 32, True)]
        pv_cases += [(n, 32, False) for n in sorted(good) if decoded[n].shape[0] * decoded[n].shape[1] <= 20000 and n != "gray16.png"]
        for src, S, pas in pv_cases:
            kw = dict(do_pan_and_scan=True, pan_and_scan_min_crop_size=256, pan_and_scan_max_num_crops=4,
                      pan_and_scan_min_ratio_to_activate=1.2) if pas else {}
            proc = Gemma3ImageProcessorPil(size={"height": S, "width": S})
            res = proc(images=transposed[src], return_tensors="np", **kw)
            pv = np.ascontiguousarray(res["pixel_values"], dtype=np.float32)
            ncrops = int(np.asarray(res["num_crops"]).ravel()[0]) if pas else 0
            # the processor saw exactly our decoded pixels: pixel_values = lut[resize(decoded crop)]
            rects = pas_rects(decoded[src].shape[1], decoded[src].shape[0], 256, 4, 1.2) if pas else []
            for i, r in enumerate([(0, 0, decoded[src].shape[1], decoded[src].shape[0])] + rects):
                x, y, w, h = r
                crop = np.ascontiguousarray(decoded[src][y:y + h, x:x + w])
                rs = np.asarray(Image.fromarray(crop).resize((S, S), Image.BILINEAR))
                assert np.array_equal(LUT[rs].transpose(2, 0, 1).view(np.uint32), pv[i].view(np.uint32)), (src, S, i)
            g = h5_path(f, f"pixel_values/{src}_{S}" + ("_pas" if pas else ""))
            g.attrs["src"], g.attrs["size"], g.attrs["n"] = src, np.int64(S), np.int64(pv.shape[0])
            g.attrs["num_crops"], g.attrs["pan_and_scan"] = np.int64(ncrops), np.int64(pas)
            put_array(g, "values", pv)
            log(f"pixel_values {src} S={S} pan&scan={pas}: {pv.shape}, {ncrops} crops")

        # pan & scan rectangles for many sizes and options
        sizes = [(451, 300), (1000, 300), (300, 700), (256, 256), (600, 500), (599, 500), (2000, 100), (5000, 1000),
                 (1024, 256), (1025, 256), (1023, 256), (4096, 1024), (100, 5000), (300, 1200), (513, 256), (512, 256),
                 (767, 256), (768, 256), (2560, 600), (1, 1), (3000, 2999), (896, 896), (1920, 1080), (1080, 1920),
                 (4000, 3000), (6000, 1000), (1000, 6000), (257, 700), (800, 255)]
        opts = [(256, 4, 1.2), (128, 8, 1.2), (256, 4, 2.0), (100, 3, 1.5), (1, 5, 1.0), (300, 2, 1.1)]
        rows = []
        for mc, mx, mr in opts:
            for w, h in sizes:
                rows.append((w, h, mc, mx, mr, pas_rects(w, h, mc, mx, mr)))
        g = h5_path(f, "pan_and_scan")
        h5_dset(g, "sizes", [[r[0], r[1]] for r in rows], np.int64)
        h5_dset(g, "min_crop", [r[2] for r in rows], np.int64)
        h5_dset(g, "max_crops", [r[3] for r in rows], np.int64)
        h5_dset(g, "min_ratio", [r[4] for r in rows], np.float64)
        h5_dset(g, "count", [len(r[5]) for r in rows], np.int64)
        rect = np.zeros((len(rows), 8, 4), np.int64)
        for i, r in enumerate(rows):
            assert len(r[5]) <= 8
            for j, rr in enumerate(r[5]):
                rect[i, j] = rr
        h5_dset(g, "rects", rect, np.int64)
        log(f"pan & scan rectangles: {len(rows)} cases, {sum(len(r[5]) > 0 for r in rows)} with crops")

        # the default torchvision-backed processor on chelsea at 896, against the PIL one
        tv = Gemma3ImageProcessor(size={"height": 896, "width": 896})
        tvv = tv(images=transposed["chelsea.png"], return_tensors="pt")["pixel_values"].numpy()[0]
        pil = Gemma3ImageProcessorPil(size={"height": 896, "width": 896})(images=transposed["chelsea.png"],
                                                                            return_tensors="np")["pixel_values"][0]
        mean = torch.tensor([0.5, 0.5, 0.5]) * (1.0 / (1 / 255))
        std = torch.tensor([0.5, 0.5, 0.5]) * (1.0 / (1 / 255))
        tv_lut = torchvision.transforms.v2.functional.normalize(
            torch.arange(256, dtype=torch.float32).reshape(1, 256, 1).repeat(3, 1, 1), mean.tolist(), std.tolist())[0, :, 0].numpy()
        tvu8 = np.round((tvv.astype(np.float64) * 0.5 + 0.5) * 255).astype(np.int64)
        assert np.array_equal(tv_lut[tvu8].view(np.uint32), tvv.view(np.uint32)), "torchvision values are not lut[u8]"
        pilu8 = np.asarray(Image.fromarray(decoded["chelsea.png"]).resize((896, 896), Image.BILINEAR)).transpose(2, 0, 1).astype(np.int64)
        diff = tvu8 - pilu8
        assert np.abs(diff).max() <= 127
        g = h5_path(f, "torchvision/chelsea_896")
        h5_dset(g, "lut", tv_lut, np.float32)
        h5_dset(g, "diff", diff, np.int8)
        g.attrs["max_abs_diff"] = np.float64(np.abs(tvv - pil).max())
        g.attrs["n_diff"] = np.int64(np.count_nonzero(diff))
        log(f"torchvision processor vs PIL processor, chelsea 896: max |diff| {np.abs(tvv - pil).max():.9g}, "
            f"{np.count_nonzero(diff)} of {diff.size} values on another 8-bit level")
    os.replace(tmp, OUT)

    # the fuzzer's seeds (tests/fuzz/fuzz_image.c): every fixture of at most 8 KiB, good and bad
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    os.makedirs(CORPUS)
    for root, _, files in os.walk(IMG):
        for n in sorted(files):
            p = os.path.join(root, n)
            if 0 < os.path.getsize(p) <= 8192:
                shutil.copyfile(p, os.path.join(CORPUS, ("bad_" if root.endswith("bad") else "") + n))

    total = 0
    for root, _, files in os.walk(IMG):
        for n in sorted(files):
            p = os.path.join(root, n)
            total += os.path.getsize(p)
            log(f"wrote {os.path.relpath(p, HERE)}: {os.path.getsize(p)} bytes, sha256 {sha256_file(p)}")
    total += os.path.getsize(OUT)
    for n in sorted(os.listdir(CORPUS)):
        total += os.path.getsize(os.path.join(CORPUS, n))
    log(f"wrote {len(os.listdir(CORPUS))} fuzz seeds to tests/fuzz/corpus_image")
    log(f"wrote image_ref.h5: {os.path.getsize(OUT)} bytes, sha256 {sha256_file(OUT)}")
    log(f"total {total} bytes")


if __name__ == "__main__":
    main()
