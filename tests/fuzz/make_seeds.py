#!/usr/bin/env python3
"""Writes the GGUF fuzzer's seed corpus (tests/fuzz/corpus/). Standard library only.

Small valid files covering the parser's branches: the formats.md §1.1 worked example, every
metadata value type including string/bool/numeric arrays, several quantized tensor types,
version 2 without general.alignment, and a non-default alignment.
Files end in .seed, not .gguf, because .gitignore keeps *.gguf (model files) out of git.
Run from anywhere: python3 tests/fuzz/make_seeds.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

# ggml type id -> (block size, bytes per block), formats.md §1.3
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
        10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def build(kvs, tensors, version=3, align=32):
    """tensors: list of (name, ne list, ggml type); data is a deterministic byte pattern."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    offset, datas = 0, []
    for name, ne, t in tensors:
        bs, ts = GGML[t]
        n = ne[0] // bs * ts
        for d in ne[1:]:
            n *= d
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, offset)
        data = bytes((i * 37 + 11) & 0xFF for i in range(n))
        data += b"\0" * ((-len(data)) % align)
        datas.append(data)
        offset += len(data)
    out += b"\0" * ((-len(out)) % align)
    return out + b"".join(datas)


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {}
    seeds["example.seed"] = (  # formats.md §1.1, byte for byte
        b"GGUF" + struct.pack("<IQQ", 3, 1, 2)
        + kv("general.architecture", 8, s("gemma3")) + kv("general.alignment", 4, struct.pack("<I", 32))
        + s("w") + struct.pack("<IQQIQ", 2, 4, 2, 0, 0) + b"\0" * 16
        + struct.pack("<8f", *range(8)))
    assert len(seeds["example.seed"]) == 192
    all_types = [
        kv("u8", 0, b"\xc8"), kv("i8", 1, b"\xfb"), kv("u16", 2, struct.pack("<H", 60000)),
        kv("i16", 3, struct.pack("<h", -30000)), kv("u32", 4, struct.pack("<I", 7)),
        kv("i32", 5, struct.pack("<i", -7)), kv("f32", 6, struct.pack("<f", 1.5)),
        kv("bool", 7, b"\x01"), kv("str", 8, s("hello")), kv("u64", 10, struct.pack("<Q", 1 << 40)),
        kv("i64", 11, struct.pack("<q", -(1 << 40))), kv("f64", 12, struct.pack("<d", 3.25)),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 4) + s("<pad>") + s("<eos>") + s("") + s("<0x00>")),
        kv("tokenizer.ggml.scores", 9, struct.pack("<IQ4f", 6, 4, 0, -1, -2, -3)),
        kv("flags", 9, struct.pack("<IQ", 7, 3) + b"\x00\x01\x00"),
    ]
    seeds["strings.seed"] = build(all_types, [("e", [8], 1)])
    seeds["quant.seed"] = build(
        [kv("general.architecture", 8, s("gemma3")), kv("general.quantization_version", 4, struct.pack("<I", 2))],
        [("a", [8], 0), ("b", [32, 2], 8), ("c", [256], 12), ("d", [256], 14), ("e", [32], 6),
         ("f", [4], 30), ("g", [256, 1, 1, 1], 10), ("h", [256], 13)])
    seeds["v2_noalign.seed"] = build([kv("general.name", 8, s("x"))], [("t", [2, 2], 0)], version=2)
    seeds["align64.seed"] = build([kv("general.alignment", 4, struct.pack("<I", 64))],
                                  [("p", [4], 0), ("q", [32], 2)], align=64)
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
