#!/usr/bin/env python3
"""Reference audio and transformers outputs for tests/unit/test_audio.c (core/audio).

Writes tests/ref/audio/ (a generated stereo 44.1 kHz clip as WAV, FLAC and Ogg Vorbis) and
tests/ref/audio_ref.h5 (what soundfile + samplerate + Gemma3nAudioFeatureExtractor make of real and
generated audio), so the C test needs no Python. Run by hand with the peers venv (transformers
5.24, numpy 2.4) and three packages it lacks, installed beside it, not into it:

    pip install --no-deps --target /tmp/audiopkgs samplerate soundfile h5py cffi pycparser
    PYTHONPATH=/tmp/audiopkgs ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_audio_ref.py

Needs Debian's asterisk-core-sounds-en-wav (setup.sh installs it): two real recordings, 8 kHz
16-bit mono WAV, read from /usr/share/asterisk/sounds/en_US_f_Allison and not committed; their
sha256 is stored so the C test knows it reads the same bytes.

What the references are (the path a Python user takes):
    x, sr = soundfile.read(path, dtype="float32", always_2d=True)    # libsndfile 1.2.2, x / 32768
    mono  = x.mean(axis=1)                                          # float32
    y     = samplerate.resample(mono, 16000 / sr, "sinc_best")      # libsamplerate 0.2.2, src_simple
            (skipped when sr == 16000)
    out   = Gemma3nAudioFeatureExtractor()(list_of_clips)           # the defaults: padding "longest",
            max_length 480000, truncation, pad_to_multiple_of 128, input_features + input_features_mask

numpy runs its baseline x86-64-v2 loops here (NPY_DISABLE_CPU_FEATURES, set below): with its
AVX2/FMA loops the extractor's own output moves (see SIMD_TARGETS); both are measured.

Layout of audio_ref.h5 (datasets over 64 elements gzip-compressed; no timestamps):
  attrs: generator, version_*, converter ("sinc_best"), allison (the folder), numpy_disabled_dispatch,
         numpy_x86_v3_enabled (false), window_values_differing_default_dispatch
  /window f32 (512)                       the extractor's periodic Hann window, as numpy made it
  /clips/<file>/  attrs: sha256 (hex of the WAV file), src_rate, src_frames, src_channels
      samples16k f32 (n)                  soundfile -> mean -> samplerate
      mask u8 (T); attr T                 the extractor on samples16k alone (its features are the
                                          clip's row of /batch/features, first T frames: asserted)
  /batch/         attrs: files ("a,b"), max_abs_diff_default_dispatch (the same batch with numpy's SIMD
                  loops, made in a second process: the reference's own spread across CPUs)
      lens i64 (2); features f32 (2, T, 128); mask u8 (2, T)   the two clips as one batch
  /stereo/<file>/ attrs: src_rate, src_frames, src_channels (tests/ref/audio/<file>)
      samples16k f32 (n)
  /synth/         generated clips: sample k of a clip is ((s_k >> 16) - 32768) / 65536 with
                  s_0 = seed, s_{k+1} = (1664525 s_k + 1013904223) mod 2^32 (exact in f32; the C
                  test makes the same samples)
      lens i64 (N); seeds i64 (N); T i64 (N)              each clip alone through the extractor
      single_<i>/features f32 (T, 128) when T <= 16, and mask u8 (T), for every i
      long_head f32 (8, 128), long_tail f32 (4, 128)     the first and last frames of the
                                                          481,000-sample clip (truncated to 480,000)
      batch_lens i64 (3); batch_T; batch_mask u8 (3, T); batch_head f32 (3, 8, 128): the
                                                          481,000-, 1,000- and 960-sample clips
                                                          (the last with seed 2000) as a batch
"""
import hashlib
import os
import subprocess
import sys
import tempfile

# numpy's baseline loops (x86-64-v2: no AVX2, no FMA) for every ufunc, so that the reference does
# not depend on the CPU that makes it: numpy 2.4's AVX2/FMA float32 cos (the extractor's Hann
# window) differs from its baseline loop, which calls libm's cosf, in the last bit of 35 of the 512
# window values, and that moves the log-mels of bins ~60 dB under their frame's peak by up to 0.004
# (measured; stored as /batch max_abs_diff_default_dispatch). Must be set before numpy is imported.
SIMD_TARGETS = "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"
if "--default-dispatch" not in sys.argv:
    os.environ["NPY_DISABLE_CPU_FEATURES"] = SIMD_TARGETS

import h5py
import numpy as np
import samplerate
import soundfile
import transformers
from transformers.models.gemma3n.feature_extraction_gemma3n import Gemma3nAudioFeatureExtractor

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "audio_ref.h5")
AUD = os.path.join(HERE, "audio")
ALLISON = "/usr/share/asterisk/sounds/en_US_f_Allison"
CLIPS = ["hello-world.wav", "vm-goodbye.wav"]
CONVERTER = "sinc_best"

# generated clip lengths (samples at 16 kHz): around one frame (513 = frame + the unused 513th
# sample), around the 128-sample padding step, around the 480,000-sample maximum
SYNTH_LENS = [1, 300, 512, 513, 640, 1000, 1280, 1281, 479999, 480000, 480001, 481000]


def log(msg):
    print(f"make_audio_ref: {msg}", flush=True)


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def lcg_clip(n, seed):
    """n samples of the generator described at the top (uint32 arithmetic, exact in f32)."""
    out = np.empty(n, np.float32)
    s = seed & 0xFFFFFFFF
    for k in range(n):
        out[k] = np.float32(((s >> 16) - 32768) / 65536.0)
        s = (1664525 * s + 1013904223) & 0xFFFFFFFF
    return out


def load_16k(path):
    """The reference pipeline: soundfile -> mean of channels -> samplerate (sinc_best)."""
    x, sr = soundfile.read(path, dtype="float32", always_2d=True)
    mono = x.mean(axis=1, dtype=np.float32)
    if sr != 16000:
        mono = samplerate.resample(mono, 16000 / sr, CONVERTER)
    return np.ascontiguousarray(mono, np.float32), sr, x.shape[0], x.shape[1]


def make_stereo():
    """A stereo 44.1 kHz clip, 0.25 s: left a chirp 100 Hz -> 20 kHz (past 8 kHz, so the
    resampler's low-pass matters), right a 330 Hz tone plus generated noise; 16-bit PCM."""
    os.makedirs(AUD, exist_ok=True)
    sr, n = 44100, 11025
    t = np.arange(n) / sr
    f0, f1, dur = 100.0, 20000.0, n / sr
    left = 0.5 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) / (2 * dur) * t * t))
    right = 0.3 * np.sin(2 * np.pi * 330 * t) + 0.5 * lcg_clip(n, 7).astype(np.float64)
    pcm = np.round(np.stack([left, right], 1) * 32767).astype(np.int16)
    files = {"stereo44k.wav": dict(format="WAV", subtype="PCM_16"),
             "stereo44k.flac": dict(format="FLAC", subtype="PCM_16"),
             "stereo44k.ogg": dict(format="OGG", subtype="VORBIS")}
    for name, kw in files.items():
        path = os.path.join(AUD, name)
        # libsndfile draws an Ogg stream's serial number at random: a committed .ogg is kept (its
        # decoded samples, which the h5 holds, would be the same; only the bytes would change)
        if kw["format"] == "OGG" and os.path.exists(path):
            continue
        soundfile.write(path, pcm, sr, **kw)
    return sorted(files)


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
    """The window and the real clips' batch features with numpy's default (SIMD) loops."""
    fe = Gemma3nAudioFeatureExtractor()
    clips = [load_16k(os.path.join(ALLISON, n))[0] for n in CLIPS]
    feats, _ = extract(fe, clips)
    np.savez(out_npz, window=fe.window, features=feats)


def main():
    if "--default-dispatch" in sys.argv:
        default_dispatch(sys.argv[-1])
        return
    fe = Gemma3nAudioFeatureExtractor()
    assert (fe.frame_length, fe.hop_length, fe.fft_length, fe.feature_size) == (512, 160, 1024, 128)
    stereo = make_stereo()
    tmp = OUT + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        vers = {"python": sys.version.split()[0], "transformers": transformers.__version__, "numpy": np.__version__,
                "h5py": h5py.__version__, "soundfile": soundfile.__version__,
                "libsndfile": soundfile.__libsndfile_version__, "samplerate": samplerate.__version__,
                "libsamplerate": samplerate.__libsamplerate_version__}
        for k in sorted(vers):
            f.attrs[f"version_{k}"] = str(vers[k])
        from numpy._core._multiarray_umath import __cpu_features__
        f.attrs["numpy_disabled_dispatch"] = SIMD_TARGETS
        f.attrs["numpy_x86_v3_enabled"] = bool(__cpu_features__.get("X86_V3", False))
        f.attrs["generator"] = "tests/ref/make_audio_ref.py"
        f.attrs["converter"] = CONVERTER
        f.attrs["allison"] = ALLISON
        h5_dset(f, "window", fe.window, np.float32)

        # real clips, alone and as a batch
        g = h5_group(f, "clips")
        loaded, singles = [], []
        for name in CLIPS:
            path = os.path.join(ALLISON, name)
            y, sr, frames, ch = load_16k(path)
            feats, mask = extract(fe, [y])
            c = h5_group(g, name)
            c.attrs["sha256"] = sha256_file(path)
            c.attrs["src_rate"], c.attrs["src_frames"], c.attrs["src_channels"] = np.int64(sr), np.int64(frames), np.int64(ch)
            h5_dset(c, "samples16k", y, np.float32)
            # the features of each clip alone equal its row of /batch up to its own frame count
            # (checked here): the frames of a shorter clip never reach the batch's extra padding
            c.attrs["T"] = np.int64(feats.shape[1])
            h5_dset(c, "mask", mask[0], np.uint8)
            singles.append(feats[0])
            log(f"{name}: {frames} frames at {sr} Hz -> {y.size} samples at 16 kHz -> features {feats[0].shape}, "
                f"{int(mask[0].sum())} valid")
            loaded.append(y)
        b = h5_group(f, "batch")
        b.attrs["files"] = ",".join(CLIPS)
        feats, mask = extract(fe, loaded)
        h5_dset(b, "lens", [y.size for y in loaded], np.int64)
        h5_dset(b, "features", feats, np.float32)
        h5_dset(b, "mask", mask, np.uint8)
        for i, one in enumerate(singles):
            assert np.array_equal(one, feats[i][: one.shape[0]]), CLIPS[i]
        # the same with numpy's SIMD loops (another process: the dispatch is fixed at import)
        with tempfile.TemporaryDirectory() as td:
            npz = os.path.join(td, "simd.npz")
            env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
            subprocess.run([sys.executable, os.path.abspath(__file__), "--default-dispatch", npz], env=env, check=True)
            simd = np.load(npz)
            n_win = int((simd["window"] != fe.window).sum())
            spread = float(np.abs(simd["features"] - feats).max())
        b.attrs["max_abs_diff_default_dispatch"] = spread
        f.attrs["window_values_differing_default_dispatch"] = np.int64(n_win)
        log(f"numpy's default (SIMD) loops: {n_win} of 512 window values differ, batch features by up to {spread:.3g}")
        log(f"batch: features {feats.shape}, valid frames {mask.sum(1).tolist()}")

        # the generated stereo file, three containers
        g = h5_group(f, "stereo")
        for name in stereo:
            y, sr, frames, ch = load_16k(os.path.join(AUD, name))
            c = h5_group(g, name)
            c.attrs["src_rate"], c.attrs["src_frames"], c.attrs["src_channels"] = np.int64(sr), np.int64(frames), np.int64(ch)
            h5_dset(c, "samples16k", y, np.float32)
            log(f"{name}: {frames} x {ch} at {sr} Hz -> {y.size} samples at 16 kHz")

        # generated clips: lengths around the frame, the padding step and the maximum
        g = h5_group(f, "synth")
        seeds = [1000 + i for i in range(len(SYNTH_LENS))]
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
        # 960 = 6 x 160: frame 6 starts exactly where the clip ends (the mask's boundary)
        edge = lcg_clip(960, 2000)
        feats, mask = extract(fe, [long_clip, short, edge])
        h5_dset(g, "batch_lens", [long_clip.size, short.size, edge.size], np.int64)
        g.attrs["batch_T"] = np.int64(feats.shape[1])
        h5_dset(g, "batch_mask", mask, np.uint8)
        h5_dset(g, "batch_head", feats[:, :8], np.float32)
        log(f"synth batch: features {feats.shape}, valid frames {mask.sum(1).tolist()}")
    os.replace(tmp, OUT)
    total = os.path.getsize(OUT)
    for n in stereo:
        p = os.path.join(AUD, n)
        total += os.path.getsize(p)
        log(f"audio/{n}: {os.path.getsize(p)} bytes, sha256 {sha256_file(p)}")
    log(f"wrote audio_ref.h5: {os.path.getsize(OUT)} bytes, sha256 {sha256_file(OUT)}")
    log(f"total {total} bytes")


if __name__ == "__main__":
    main()
