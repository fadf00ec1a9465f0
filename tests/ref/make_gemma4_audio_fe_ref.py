#!/usr/bin/env python3
"""Reference outputs of Gemma4AudioFeatureExtractor for tests/unit/test_audio.c (core/audio/gm_audio_fe.c,
GM_AUDIO_FE_GEMMA4).

Writes tests/ref/gemma4_audio_fe_ref.h5: what transformers 5.24's Gemma4AudioFeatureExtractor()
(models/gemma4/feature_extraction_gemma4.py, its defaults) makes of the inputs test_audio already
uses for Gemma 3n, so the C test needs no Python. Run by hand with the peers venv (transformers 5.24,
numpy 2.4) and h5py installed beside it, not into it:

    pip install --no-deps --target /tmp/h5 h5py
    PYTHONPATH=/tmp/h5 ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_gemma4_audio_fe_ref.py

Inputs (nothing is read from the network or the system's sound files):
  - the two real recordings' 16 kHz samples as tests/ref/audio_ref.h5 stores them
    (/clips/<file>/samples16k: Debian's asterisk-core-sounds-en-wav through soundfile + samplerate,
    make_audio_ref.py); their sha256 (of the f32 bytes) is stored so the C test knows it fed the same;
  - generated clips: sample k of a clip is ((s_k >> 16) - 32768) / 65536 with s_0 = seed,
    s_{k+1} = (1664525 s_k + 1013904223) mod 2^32 (make_audio_ref.py's lcg_clip: exact in f32; the
    C test makes the same samples).

numpy runs its baseline x86-64-v2 loops here (NPY_DISABLE_CPU_FEATURES, set below), as in
make_audio_ref.py, so the reference does not depend on the CPU that makes it; the real clips' batch
with numpy's default (SIMD) loops is made in a second process and its distance stored.

Layout of gemma4_audio_fe_ref.h5 (datasets over 64 elements gzip-compressed; no timestamps):
  attrs: generator, version_*, numpy_disabled_dispatch, source ("audio_ref.h5"),
         window_values_differing_default_dispatch
  /window f32 (320)                         the extractor's window (window_function(320) as f32)
  /clips/<file>/  attrs: sha256_samples (hex of the f32 samples' bytes), n (samples), T
      mask u8 (T)                           the extractor on the clip alone (its features are the
                                            clip's row of /batch/features, first T frames: asserted)
  /batch/  attrs: files ("a,b"), max_abs_diff_default_dispatch
      lens i64 (2); features f32 (2, T, 128); mask u8 (2, T)   the two clips as one batch
  /synth/
      lens i64 (N); seeds i64 (N); T i64 (N)                    each clip alone
      single_<i>/mask u8 (T) for every i; single_<i>/features f32 (T, 128) when T <= 16
      long_head f32 (8, 128), long_tail f32 (4, 128)           the 481,000-sample clip (cut to
                                                                480,000): first and last frames
      batch_lens i64 (3); attr batch_T; batch_mask u8 (3, T); batch_head f32 (3, 8, 128);
      batch_tail f32 (3, 4, 128)                               the 481,000-, 1,000- and
                                                                960-sample (seed 2000) clips as one
                                                                batch (the short rows' tails are
                                                                masked: zeros)
"""
import hashlib
import os
import subprocess
import sys
import tempfile

SIMD_TARGETS = "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"
if "--default-dispatch" not in sys.argv:
    os.environ["NPY_DISABLE_CPU_FEATURES"] = SIMD_TARGETS

import h5py
import numpy as np
import transformers
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gemma4_audio_fe_ref.h5")
SRC = os.path.join(HERE, "audio_ref.h5")
CLIPS = ["hello-world.wav", "vm-goodbye.wav"]

# generated clip lengths (samples at 16 kHz): around the first frame (the clip padded to 128, plus
# the 160 zeros of the left padding, against the 321-sample unfold), the mask's boundary (sample
# 160 t + 160), the 128-sample padding step and the 480,000-sample maximum
SYNTH_LENS = [1, 128, 129, 160, 161, 300, 320, 321, 480, 481, 1000, 1280, 1281, 479999, 480000, 480001, 481000]


def log(msg):
    print(f"make_gemma4_audio_fe_ref: {msg}", flush=True)


def lcg_clip(n, seed):
    """n samples of the generator described at the top (uint32 arithmetic, exact in f32)."""
    out = np.empty(n, np.float32)
    s = seed & 0xFFFFFFFF
    for k in range(n):
        out[k] = np.float32(((s >> 16) - 32768) / 65536.0)
        s = (1664525 * s + 1013904223) & 0xFFFFFFFF
    return out


def real_clips():
    with h5py.File(SRC, "r") as f:
        return [np.ascontiguousarray(f[f"clips/{n}/samples16k"][...], np.float32) for n in CLIPS]


def h5_group(parent, name):
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))


def h5_dset(group, name, arr, dtype):
    arr = np.ascontiguousarray(np.asarray(arr, dtype=dtype))
    kw = dict(compression="gzip", compression_opts=9) if arr.size > 64 else {}
    group.create_dataset(name, data=arr, track_times=False, **kw)


def extract(fe, clips):
    out = fe(clips)
    feats = np.stack(out["input_features"]).astype(np.float32)
    mask = np.stack(out["input_features_mask"]).astype(np.uint8)
    return feats, mask


def default_dispatch(out_npz):
    fe = Gemma4AudioFeatureExtractor()
    feats, _ = extract(fe, real_clips())
    np.savez(out_npz, window=fe.window, features=feats)


def main():
    if "--default-dispatch" in sys.argv:
        default_dispatch(sys.argv[-1])
        return
    fe = Gemma4AudioFeatureExtractor()
    assert (fe.frame_length, fe.hop_length, fe.fft_length, fe.feature_size) == (320, 160, 512, 128)
    assert fe.preemphasis == 0.0 and fe.dither == 0.0 and fe.per_bin_mean is None and fe.per_bin_stddev is None
    tmp = OUT + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        vers = {"python": sys.version.split()[0], "transformers": transformers.__version__, "numpy": np.__version__,
                "h5py": h5py.__version__}
        for k in sorted(vers):
            f.attrs[f"version_{k}"] = str(vers[k])
        f.attrs["numpy_disabled_dispatch"] = SIMD_TARGETS
        f.attrs["generator"] = "tests/ref/make_gemma4_audio_fe_ref.py"
        f.attrs["source"] = "audio_ref.h5"
        h5_dset(f, "window", fe.window, np.float32)

        # the real clips, alone and as a batch
        loaded = real_clips()
        g = h5_group(f, "clips")
        singles = []
        for name, y in zip(CLIPS, loaded):
            feats, mask = extract(fe, [y])
            c = h5_group(g, name)
            c.attrs["sha256_samples"] = hashlib.sha256(y.tobytes()).hexdigest()
            c.attrs["n"] = np.int64(y.size)
            c.attrs["T"] = np.int64(feats.shape[1])
            h5_dset(c, "mask", mask[0], np.uint8)
            singles.append((feats[0], mask[0]))
            log(f"{name}: {y.size} samples -> features {feats[0].shape}, {int(mask[0].sum())} valid")
        b = h5_group(f, "batch")
        b.attrs["files"] = ",".join(CLIPS)
        feats, mask = extract(fe, loaded)
        h5_dset(b, "lens", [y.size for y in loaded], np.int64)
        h5_dset(b, "features", feats, np.float32)
        h5_dset(b, "mask", mask, np.uint8)
        for i, (one, m) in enumerate(singles):
            T = one.shape[0]
            assert np.array_equal(one, feats[i][:T]) and np.array_equal(m, mask[i][:T]), CLIPS[i]
            assert not mask[i][T:].any(), CLIPS[i]
        with tempfile.TemporaryDirectory() as td:
            npz = os.path.join(td, "simd.npz")
            env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
            subprocess.run([sys.executable, os.path.abspath(__file__), "--default-dispatch", npz], env=env, check=True)
            simd = np.load(npz)
            n_win = int((simd["window"] != fe.window).sum())
            spread = float(np.abs(simd["features"] - feats).max())
        b.attrs["max_abs_diff_default_dispatch"] = spread
        f.attrs["window_values_differing_default_dispatch"] = np.int64(n_win)
        log(f"numpy's default (SIMD) loops: {n_win} of 320 window values differ, batch features by up to {spread:.3g}")
        log(f"batch: features {feats.shape}, valid frames {mask.sum(1).tolist()}")

        # generated clips
        g = h5_group(f, "synth")
        seeds = [3000 + i for i in range(len(SYNTH_LENS))]
        Ts = []
        long_clip = None
        for i, (n, seed) in enumerate(zip(SYNTH_LENS, seeds)):
            x = lcg_clip(n, seed)
            feats, mask = extract(fe, [x])
            T = feats.shape[1]
            Ts.append(T)
            c = h5_group(g, f"single_{i}")
            h5_dset(c, "mask", mask[0].reshape(T), np.uint8)
            if T <= 16:
                h5_dset(c, "features", feats[0].reshape(T, 128), np.float32)
            if n == 481000:
                long_clip = x
                h5_dset(g, "long_head", feats[0][:8], np.float32)
                h5_dset(g, "long_tail", feats[0][-4:], np.float32)
        h5_dset(g, "lens", SYNTH_LENS, np.int64)
        h5_dset(g, "seeds", seeds, np.int64)
        h5_dset(g, "T", Ts, np.int64)
        log(f"synth: lengths {SYNTH_LENS} -> T {Ts}")
        short = lcg_clip(1000, seeds[SYNTH_LENS.index(1000)])
        edge = lcg_clip(960, 2000)
        feats, mask = extract(fe, [long_clip, short, edge])
        h5_dset(g, "batch_lens", [long_clip.size, short.size, edge.size], np.int64)
        g.attrs["batch_T"] = np.int64(feats.shape[1])
        h5_dset(g, "batch_mask", mask, np.uint8)
        h5_dset(g, "batch_head", feats[:, :8], np.float32)
        h5_dset(g, "batch_tail", feats[:, -4:], np.float32)
        log(f"synth batch: features {feats.shape}, valid frames {mask.sum(1).tolist()}")
    os.replace(tmp, OUT)
    with open(OUT, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    log(f"wrote gemma4_audio_fe_ref.h5: {os.path.getsize(OUT)} bytes, sha256 {sha}")


if __name__ == "__main__":
    main()
