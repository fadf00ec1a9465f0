#!/usr/bin/env python3
"""Reference NF4 quantizations for tests/unit/test_quant.c: run bitsandbytes' own CPU code on a set
of float32 tensors and store what it produced in tests/ref/nf4_ref.h5 (committed, < 500 KB), so the
C test needs no Python.

What bitsandbytes computes (0.50.2, CPU), which core/quant/gm_quant.c reproduces bit for bit:
  quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4")
    -> packed nibbles, per-64-block absmax (f32), then offset = absmax.mean() (torch, f32) and
       quantize_blockwise(absmax - offset, blocksize=256) (native cquantize_blockwise_cpu_fp32)
       -> uint8 codes into the signed dynamic map + one f32 absmax2 per 256 blocks.
  dequantize_4bit(packed, state) -> the f32 tensor the kernels must reproduce.

Inputs are generated from a counter-based generator that the C test re-implements exactly
(splitmix64 of seed*2^32 + i; see gen_uniform), so even the 640x1024 tensor needs no stored input.
Small tensors also store their input (x) for readability.

Layout of nf4_ref.h5
  attrs: bnb_version, torch_version, cpu_capability, torch_threads (=1)
  tables/nf4_code (16 f32)           bnb get_4bit_type("nf4")
  tables/dynamic_map (256 f32)       bnb create_dynamic_map(signed=True)
  tensors/<name>/ attrs: n, seed, kind, scale, rows, cols; datasets:
     x (f32)                         the input, flattened row-major (kind "stored" and bell
                                     tensors up to 4096; larger bell tensors are regenerated)
     packed (u8, ceil(n/2))          bnb's packed codes (big tensor: first 4096 bytes only)
     absmax_code (u8, ceil(n/64))    nested codes
     absmax2 (f32, ceil(n/64/256))   nested absmax
     offset (f32, 1)                 mean of the first-level absmax
     absmax (f32, small only)        first-level absmax (before nesting)
     absmax_deq (f32, small only)    absmax as bnb reconstructs it (dynmap*absmax2 + offset)
     deq (f32, n, small only)        dequantize_4bit output
     packed_fnv, deq_fnv (u64, 1)    FNV-1a 64 of the full packed bytes / deq f32 bytes (all)
  mean/lengths (i64), mean/seeds (i64), mean/values (f32): torch.mean of generated positive
     vectors of many lengths (the nested offset), 1 torch thread.

Run: /opt/refvenv/bin/python tests/ref/make_quant_ref.py      (a few seconds; deterministic)
"""
import hashlib
import os

import h5py
import numpy as np
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F

U64 = np.uint64
M64 = (1 << 64) - 1


def splitmix64(z):
    """Vectorized splitmix64 finalizer on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
        return z ^ (z >> U64(31))


def gen_uniform(seed, n):
    """n float32 in [-1, 1): a = ((z >> 40) - 2^23) * 2^-23, z = splitmix64(seed * 2^32 + i).
    Every step is exact in float32, so C reproduces it bit for bit."""
    i = np.arange(n, dtype=np.uint64) + U64((seed << 32) & M64)
    z = splitmix64(i)
    k = (z >> U64(40)).astype(np.int64) - (1 << 23)
    return (k.astype(np.float32) * np.float32(1.0 / (1 << 23))).astype(np.float32)


def gen_bell(seed, n, scale):
    """Bell-shaped weights: ((a0 + a1) + (a2 + a3)) * scale over 4 consecutive uniforms, f32."""
    a = gen_uniform(seed, 4 * n).reshape(n, 4)
    s = (a[:, 0] + a[:, 1]) + (a[:, 2] + a[:, 3])
    return (s * np.float32(scale)).astype(np.float32)


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for byte in bytes(b):
        h ^= byte
        h = (h * 0x100000001B3) & M64
    return h


def h5_group(parent, name):
    """A group without object timestamps (so the file bytes depend only on the contents)."""
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))


def h5_dset(group, name, arr, dtype=None):
    arr = np.asarray(arr)
    group.create_dataset(name, data=np.ascontiguousarray(arr, dtype=dtype or arr.dtype),
                         track_times=False)


def nf4_midpoints():
    c = F.get_4bit_type("nf4", device="cpu").float().numpy()
    return ((c[:-1] + c[1:]) / np.float32(2)).astype(np.float32)


def make_tensors():
    """name -> (x float32 1-D, attrs). kind 'bell' tensors are regenerated in C from attrs."""
    T = {}

    def bell(name, seed, n, scale, rows=1, cols=None):
        T[name] = (gen_bell(seed, n, scale), dict(kind="bell", seed=seed, scale=scale, rows=rows,
                                                   cols=cols if cols else n))

    bell("n64", 1, 64, 0.05)
    bell("n4096", 2, 4096, 0.02)
    bell("n16448", 3, 64 * 256 + 64, 0.03)             # 257 blocks: crosses a nested group
    bell("w640x1024", 4, 640 * 1024, 0.02, 640, 1024)  # a 270M-sized linear; not stored
    bell("n1000", 5, 1000, 0.1)                        # partial last block of 40
    bell("n999", 6, 999, 0.1)                          # odd: the pad nibble
    bell("n100", 7, 100, 1.0)
    bell("n10", 8, 10, 0.5)                            # only a partial block

    # outliers: every 97th weight x50, a few large ones
    x = gen_bell(9, 8192, 0.02)
    x[::97] *= np.float32(50.0)
    x[[5, 1000, 4097, 8191]] = np.float32([3.0, -7.5, 0.25, -3.0])
    T["outliers"] = (x, dict(kind="stored", seed=9, scale=0.02))

    # zero blocks, subnormal-only block, negative-only block
    x = gen_bell(10, 1024, 0.05)
    x[3 * 64:4 * 64] = 0.0
    x[15 * 64:16 * 64] = 0.0                           # the last block too
    x[5 * 64:6 * 64] = np.float32(0.0)
    x[5 * 64 + 7] = np.float32(1e-40)                  # absmax subnormal: clamped to 1e-38
    x[5 * 64 + 9] = np.float32(-3e-41)
    x[7 * 64:8 * 64] = -np.abs(x[7 * 64:8 * 64])
    T["zero_blocks"] = (x, dict(kind="stored", seed=10, scale=0.05))

    # a partial last block that is all zero (its absmax is stored clamped to 1e-38)
    x = gen_bell(11, 1000, 0.05)
    x[960:] = 0.0
    T["tail_zero"] = (x, dict(kind="stored", seed=11, scale=0.05))

    # exact ties on the NF4 midpoints (bucketize sends a tie to the lower code) and their
    # neighbours one ulp away; block 1 scaled by 2 (exact), block 2 by 0.75 (inexact reciprocal)
    mid = nf4_midpoints()
    blk = np.zeros(64, dtype=np.float32)
    blk[0] = 1.0
    blk[1:16] = mid
    blk[16:31] = np.nextafter(mid, np.float32(2))
    blk[31:46] = np.nextafter(mid, np.float32(-2))
    blk[46:61] = -mid
    blk[61:64] = [-1.0, 0.0, -0.0]
    x = np.concatenate([blk, blk * np.float32(2), blk * np.float32(0.75)]).astype(np.float32)
    T["ties"] = (x, dict(kind="stored", seed=0, scale=1.0))
    return T


def gen_mean_vector(seed, n):
    """Positive absmax-like values: u*u*scale with u uniform in [0, 1) (f32, exact in C)."""
    a = gen_uniform(seed, n)
    u = ((a + np.float32(1)) * np.float32(0.5)).astype(np.float32)
    return (u * u * np.float32(0.125)).astype(np.float32)


def main():
    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "nf4_ref.h5")
    small_limit = 20000
    with h5py.File(out, "w", libver="earliest", track_order=False) as f:
        f.attrs["bnb_version"] = bnb.__version__
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        f.attrs["torch_threads"] = 1
        t = h5_group(f, "tables")
        h5_dset(t, "nf4_code", F.get_4bit_type("nf4", device="cpu").float().numpy(), np.float32)
        h5_dset(t, "dynamic_map", F.create_dynamic_map(signed=True).float().numpy(), np.float32)

        g = h5_group(f, "tensors")
        for name, (x, attrs) in make_tensors().items():
            n = x.size
            packed, st = F.quantize_4bit(torch.from_numpy(x.copy()), blocksize=64,
                                         compress_statistics=True, quant_type="nf4")
            # first-level absmax without nesting (same call, compress_statistics=False)
            _, st0 = F.quantize_4bit(torch.from_numpy(x.copy()), blocksize=64,
                                     compress_statistics=False, quant_type="nf4")
            deq = F.dequantize_4bit(packed, st, quant_type="nf4").float().reshape(-1).numpy()
            absmax_deq = (F.dequantize_blockwise(st.absmax, st.state2) + st.offset).numpy()
            pk = packed.reshape(-1).numpy().astype(np.uint8)
            h = h5_group(g, name)
            h.attrs["n"] = n
            for k in sorted(attrs):
                h.attrs[k] = attrs[k]
            small = n <= small_limit
            if n <= 4096 or attrs["kind"] == "stored":  # larger bell tensors: regenerated in C
                h5_dset(h, "x", x)
            h5_dset(h, "packed", pk if small else pk[:4096])
            if small:
                h5_dset(h, "deq", deq.astype(np.float32))
                h5_dset(h, "absmax", st0.absmax.numpy().astype(np.float32))
                h5_dset(h, "absmax_deq", absmax_deq.astype(np.float32))
            h5_dset(h, "absmax_code", st.absmax.numpy().astype(np.uint8))
            h5_dset(h, "absmax2", st.state2.absmax.numpy().astype(np.float32))
            h5_dset(h, "offset", np.asarray([st.offset.item()], dtype=np.float32))
            h5_dset(h, "packed_fnv", np.asarray([fnv1a64(pk.tobytes())], dtype=np.uint64))
            h5_dset(h, "deq_fnv", np.asarray([fnv1a64(deq.astype(np.float32).tobytes())],
                                                         dtype=np.uint64))
            assert st.state2.blocksize == 256 and st.blocksize == 64 and st.quant_type == "nf4"
            print(f"{name:12s} n={n:7d} blocks={st.absmax.numel():6d} offset={st.offset.item():.9g}")

        lengths = list(range(1, 301)) + [383, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 4096,
                                         4099, 10240, 16383, 16384, 20480, 32767, 32768, 65536,
                                         100003, 262144, 1 << 20, (1 << 24) + 1000]
        seeds = [1000 + i for i in range(len(lengths))]
        vals = []
        for n, s in zip(lengths, seeds):
            v = torch.from_numpy(gen_mean_vector(s, n))
            vals.append(v.mean().item())
        m = h5_group(f, "mean")
        h5_dset(m, "lengths", np.asarray(lengths, dtype=np.int64))
        h5_dset(m, "seeds", np.asarray(seeds, dtype=np.int64))
        h5_dset(m, "values", np.asarray(vals, dtype=np.float32))
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    with open(out, "rb") as fh:
        print("sha256", hashlib.sha256(fh.read()).hexdigest())


if __name__ == "__main__":
    main()
