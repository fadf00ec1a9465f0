#!/usr/bin/env python3
"""Reads a checkpoint written by gemmarun (gm_ckpt_save) with h5py, prints its layout and checks
that Python sees what docs/checkpoints.md promises: string attributes come back as `str`,
integers as numpy int64/uint64, tensors as little-endian float32 datasets under /adapter and
/optimizer/{m,v}, named by their PEFT keys. Also reads the per-step metrics file written by the
same test (gm_h5_append_*: chunked, gzip+shuffle, maxshape=(None,)) and turns it into a pandas
DataFrame.

The files come from the C test (tests/unit/test_checkpoint.c), which keeps them at
$GM_TEST_CKPT_OUT (default <build>/test_checkpoint_sample.h5) and <that>.metrics.h5.
The tensor values are checked against the test's own pattern (re-implemented below), so a
silent transposition or type conversion would show.

Run by hand, never by CI:
  GM_TEST_CKPT_OUT=/tmp/ck.h5 build-store/tests/test_checkpoint
  /opt/refvenv/bin/python tests/ref/check_checkpoint_h5py.py /tmp/ck.h5
Needs h5py and numpy; pandas optional (pip install pandas into /opt/refvenv).
Exit status 0 when every check passes.
"""
import json
import os
import sys

import h5py
import numpy as np

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}")


def pattern(seed, t, b, n):
    """tests/unit/test_checkpoint.c pattern(): exact in f32 (24-bit integers / 4096)."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    h ^= np.uint64((seed * 40503 + (t * 3 + b) * 977) & 0xFFFFFFFF)
    h ^= h >> np.uint64(13)
    return ((h & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(1 / 4096) - np.float32(2048))


def show_attrs(obj, indent):
    for k, v in obj.attrs.items():
        text = repr(v) if not isinstance(v, str) or len(v) < 70 else repr(v[:67] + "...")
        print(f"{indent}@{k} = {text}  ({type(v).__module__}.{type(v).__name__})")


def show(name, obj):
    depth = name.count("/")
    indent = "  " * (depth + 1)
    if isinstance(obj, h5py.Group):
        print(f"{indent}{name.split('/')[-1]}/")
    else:
        print(f"{indent}{name.split('/')[-1]}  shape={obj.shape} dtype={obj.dtype.str} "
              f"chunks={obj.chunks} compression={obj.compression} maxshape={obj.maxshape}")
    show_attrs(obj, indent + "  ")


def check_checkpoint(path):
    print(f"== checkpoint {path}  (h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version})")
    with h5py.File(path, "r") as f:
        print("  /")
        show_attrs(f, "    ")
        f.visititems(show)
        a = f.attrs
        check(isinstance(a["format"], str) and a["format"] == "gemmarun-checkpoint",
              "format is str")
        check(isinstance(a["config_json"], str), "config_json is str")
        check(isinstance(a["created_by"], str) and a["created_by"].startswith("gemmarun "),
              "created_by")
        cfg = json.loads(a["config_json"])
        print(f"  config_json parses: {cfg}")
        check(cfg["note"] == 'naïve ✓ "quoted"', "non-ASCII text survives")
        check(a["version"] == 1 and a["version"].dtype == np.int64, "version int64 == 1")
        seed = 7  # the sample is fixture_init(&c, 7, true)
        check(a["step"] == 1234 + seed and a["epoch"] == 2 and a["data_pos"] == 987654321,
              "step/epoch/data_pos")
        check(a["rng_seed"].dtype == np.uint64 and int(a["rng_seed"]) == 2**64 - 1 - seed,
              "rng_seed as uint64 (u64 max - 7)")
        check(int(a["rng_counter"]) == 2**63 + 5, "rng_counter above int64 max")
        check(a["loss"] == 2.302585092994046 + seed, "loss f64 exact")
        check(sorted(f.keys()) == ["adapter", "optimizer"], "root groups")
        names = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                 "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "extra.scale"]
        shapes = [(4, 16), (16, 4), (3, 2, 2)]
        for t, (name, shape) in enumerate(zip(names, shapes)):
            for b, grp in enumerate(["adapter", "optimizer/m", "optimizer/v"]):
                key = f"{grp}/{name}"
                if t == 2 and b > 0:
                    check(key not in f, f"{key} absent (saved without moments)")
                    continue
                d = f[key]
                check(d.dtype.str == "<f4" and d.shape == shape, f"{key}: <f4 {shape}")
                want = pattern(seed, t, b, int(np.prod(shape))).reshape(shape)
                if t == 0 and b == 0:
                    want.flat[0:4] = [-0.0, np.nan, np.inf, np.float32(1e-45)]
                if t == 0 and b == 1:
                    want.flat[0] = np.float32(-3.4028235e38)
                got = d[()]
                same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
                check(same, f"{key}: values bit-identical to what the C test saved")
        print(f"  {len(f['adapter'])} adapter tensors, {len(f['optimizer/m'])} first moments, "
              f"{len(f['optimizer/v'])} second moments; values bit-identical to the C side")


def check_metrics(path):
    print(f"== metrics {path}")
    with h5py.File(path, "r") as f:
        show_attrs(f, "    ")
        f.visititems(show)
        check(isinstance(f.attrs["run"], str), "run attribute is str")
        loss, step, lr = f["metrics/loss"], f["metrics/step"], f["metrics/lr"]
        check(loss.maxshape == (None,) and loss.chunks == (1024,) and loss.compression == "gzip"
              and loss.shuffle, "loss: chunks (1024,), gzip, shuffle, maxshape (None,)")
        check(lr.chunks == (256,), "lr: chunk 256 as created")
        n = loss.shape[0]
        i = np.arange(n)
        check(n == 2500 and step.dtype.str == "<i8" and np.array_equal(step[()], i + 1),
              "2500 steps, int64 1..2500")
        check(np.array_equal(loss[()], 5.0 / (1.0 + 0.01 * i)), "loss values exact")
        try:
            import pandas as pd
        except ImportError:
            print("  (pandas not installed: DataFrame step skipped)")
            return
        df = pd.DataFrame({k: f["metrics"][k][()] for k in ("step", "loss", "lr")})
        print(f"  pandas {pd.__version__} DataFrame from the series:")
        print("    " + df.tail(3).to_string().replace("\n", "\n    "))
        check(len(df) == 2500 and df["loss"].iloc[-1] == 5.0 / (1.0 + 0.01 * 2499), "DataFrame")


def main():
    default = os.environ.get("GM_TEST_CKPT_OUT") or "build/test_checkpoint_sample.h5"
    path = sys.argv[1] if len(sys.argv) > 1 else default
    check_checkpoint(path)
    metrics = path + ".metrics.h5"
    if os.path.exists(metrics):
        check_metrics(metrics)
    else:
        print(f"(no {metrics}: metrics check skipped)")
    print("OK: h5py reads the gemmarun checkpoint and metrics" if failures == 0
          else f"{failures} check(s) FAILED")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
