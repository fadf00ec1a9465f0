#!/usr/bin/env python3
"""Reference rows for tests/unit/test_gguf_model.c: dequantize a few rows of a few tensors of
the real Gemma 3 270M Q4_K_M GGUF with gguf-py (llama.cpp's own Python package) and store them
in tests/ref/real_dequant_rows.h5 (committed, ~80 KB), so the C test needs no Python.

Layout: one group per tensor, named by its GGUF name, holding
  rows      int64 (n)         the row indices (rows of the PyTorch-order [out, in] matrix)
  values    float32 (n, cols) the dequantized rows
  attribute ggml_type (int)   the tensor's ggml type id, checked by the C test
Covers every type in the file: Q8_0, Q5_0, Q4_K, Q6_K and F32.

Run: /opt/refvenv/bin/python tests/ref/make_dequant_ref.py [model.gguf]
(default model: ~/.cache/gemmarun/models/gemma-3-270m-q4_k_m.gguf)
"""
import os
import sys

import h5py
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

# tensor -> rows; first/last rows plus a few in between (105 = <start_of_turn>).
PICKS = {
    "token_embd.weight": [0, 2, 105, 106, 262143],
    "blk.0.attn_q.weight": [0, 511, 1023],
    "blk.5.attn_k.weight": [0, 255],
    "blk.0.attn_output.weight": [0, 639],
    "blk.0.ffn_down.weight": [0, 639],
    "blk.2.ffn_down.weight": [0, 100],
    "blk.17.attn_v.weight": [0, 255],
    "output_norm.weight": [0],
}


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/gemmarun/models/gemma-3-270m-q4_k_m.gguf")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real_dequant_rows.h5")
    reader = GGUFReader(model)
    by_name = {t.name: t for t in reader.tensors}
    with h5py.File(out, "w") as f:
        for name, rows in PICKS.items():
            t = by_name[name]
            raw = np.asarray(t.data)
            if raw.ndim == 1:  # a 1-D tensor is one row
                raw = raw.reshape(1, -1)
            # dequantize only the picked rows (each raw row is one row of blocks)
            vals = np.stack([dequantize(raw[r], t.tensor_type).reshape(-1) for r in rows])
            g = f.create_group(name)
            g.create_dataset("rows", data=np.asarray(rows, dtype=np.int64))
            g.create_dataset("values", data=vals.astype(np.float32))
            g.attrs["ggml_type"] = np.int32(int(t.tensor_type))
            print(f"{name}: {t.tensor_type.name} rows {rows} -> {vals.shape}")
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main()
