#!/usr/bin/env python3
"""Pillow's BICUBIC resize for tests/unit/test_image.c (core/image gm_image_resize, GM_IMAGE_BICUBIC).

Gemma 4's image processor (transformers 5.24, models/gemma4/image_processing_pil_gemma4.py) resizes
with PILImageResampling.BICUBIC; this writes what `Image.resize((w, h), Image.BICUBIC)` makes of two
of the fixtures that tests/ref/make_image_ref.py wrote (and whose decoded pixels image_ref.h5 holds,
so the C test decodes them itself): tests/ref/image_bicubic_ref.h5, a few KB. Run by hand:

    PYTHONPATH=<pillow 13.0.0, h5py> python3 tests/ref/make_image_bicubic_ref.py

Needs pillow 13.0.0 (the resize order rule of Pillow 13, see gm_image_proc.c), h5py, numpy; no
transformers: the inputs are RGB files with no orientation, for which transformers'
load_image + convert_to_rgb is `Image.open(path).convert("RGB")`, and the script checks that the
decoded pixels are image_ref.h5's /decoded/<file> (so the C decoder's output is the input here).
Deterministic (HDF5 without timestamps); prints the sha256 of what it writes.

Layout of image_bicubic_ref.h5 (one group per input file: HDF5 groups cost ~2 KB each):
  attrs: generator, version_*
  /resize_bicubic/<src>/           src: a file in tests/ref/images
      sizes  int64 (n, 2)          output w, h of each case
      sha256 uint8 (n, 32)         of each case's (h, w, 3) output bytes, C order
      rgb_<w>x<h> uint8 (h, w, 3)  the output itself when h*w*3 <= FULL_MAX_BYTES (a failure then
                                   names the first differing byte)
The cases: up, down and non-square targets, one axis up and the other down, one axis only, the
vertical-first order (2 * (in_w - w) < in_h - h), 1 x 1, and Gemma's 896 x 896 / 224 x 224.
"""
import hashlib
import os
import sys

import h5py
import numpy as np
import PIL
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
IMG = os.path.join(HERE, "images")
OUT = os.path.join(HERE, "image_bicubic_ref.h5")
IMAGE_REF = os.path.join(HERE, "image_ref.h5")
FULL_MAX_BYTES = 2048

CASES = [
    ("small.jpg", 300, 200),   # up 2.5x, same aspect
    ("small.jpg", 29, 17),     # down, non-square ratio
    ("small.jpg", 7, 5),       # down by 17x: the support widens to 34 input pixels
    ("small.jpg", 160, 40),    # width up, height down
    ("small.jpg", 50, 150),    # width down, height up
    ("small.jpg", 121, 80),    # one axis only (horizontal)
    ("small.jpg", 120, 81),    # one axis only (vertical)
    ("small.jpg", 118, 20),    # vertical pass first: 2 * (120 - 118) < 80 - 20
    ("small.jpg", 1, 1),
    ("small.jpg", 120, 80),    # same size: a copy
    ("chelsea.png", 896, 896), # Gemma's side, up
    ("chelsea.png", 224, 224), # down
    ("chelsea.png", 440, 100), # vertical pass first: 2 * (451 - 440) < 300 - 100
]


def log(msg):
    print(msg, file=sys.stderr)


def sha256_file(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def h5_group(parent, name):
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))


def h5_dset(group, name, arr):
    # contiguous, uncompressed: a chunked dataset's index costs more than gzip saves on these sizes
    group.create_dataset(name, data=np.ascontiguousarray(arr), track_times=False)


def decoded(name):
    rgb = np.ascontiguousarray(np.asarray(Image.open(os.path.join(IMG, name)).convert("RGB")), dtype=np.uint8)
    with h5py.File(IMAGE_REF, "r") as f:
        want = bytes(np.asarray(f[f"decoded/{name}/sha256"], np.uint8))
    assert hashlib.sha256(rgb.tobytes()).digest() == want, f"{name}: PIL's pixels are not image_ref.h5's /decoded/{name}"
    return rgb


def main():
    assert PIL.__version__ == "13.0.0", f"needs pillow 13.0.0, not {PIL.__version__}"
    inputs = {src: decoded(src) for src in sorted({c[0] for c in CASES})}
    tmp = OUT + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        vers = {"python": sys.version.split()[0], "pillow": PIL.__version__, "numpy": np.__version__, "h5py": h5py.__version__}
        for k in sorted(vers):
            f.attrs[f"version_{k}"] = str(vers[k])
        f.attrs["generator"] = "tests/ref/make_image_bicubic_ref.py"
        top = h5_group(f, "resize_bicubic")
        rows = {src: ([], []) for src in inputs}
        for src, w, h in CASES:
            out = np.ascontiguousarray(np.asarray(Image.fromarray(inputs[src]).resize((w, h), Image.BICUBIC)), dtype=np.uint8)
            assert out.shape == (h, w, 3)
            # the filter matters: BILINEAR differs (except for the copy)
            bil = np.asarray(Image.fromarray(inputs[src]).resize((w, h), Image.BILINEAR))
            ndiff = int(np.count_nonzero(out != bil))
            assert ndiff > 0 or (w, h) == inputs[src].shape[1::-1], (src, w, h)
            rows[src][0].append((w, h))
            rows[src][1].append(np.frombuffer(hashlib.sha256(out.tobytes()).digest(), np.uint8))
            if out.nbytes <= FULL_MAX_BYTES:
                g = top[src] if src in top else h5_group(top, src)
                h5_dset(g, f"rgb_{w}x{h}", out)
            log(f"{src} {inputs[src].shape[1]}x{inputs[src].shape[0]} -> {w}x{h}: {ndiff} of {out.size} bytes differ from BILINEAR")
        for src in sorted(rows):
            g = top[src] if src in top else h5_group(top, src)
            h5_dset(g, "sizes", np.array(rows[src][0], np.int64))
            h5_dset(g, "sha256", np.stack(rows[src][1]))
    os.replace(tmp, OUT)
    log(f"wrote image_bicubic_ref.h5: {os.path.getsize(OUT)} bytes, sha256 {sha256_file(OUT)}")


if __name__ == "__main__":
    main()
