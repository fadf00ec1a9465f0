#!/usr/bin/env python3
"""Seed corpora for the safetensors, config.json and tokenizer.json fuzzers (run by hand from the
repository root; standard library only; deterministic):

  tests/fuzz/corpus_safetensors/  small valid files (f32/bf16/f16/i8 tensors, metadata, empty
                                  and zero-size tensors, alignment padding in the header)
  tests/fuzz/corpus_config/       the tiny fixtures' config.json files (new and legacy key
                                  layouts, the 9k-vocabulary one) and a multimodal wrapper
                                  (Gemma3ForConditionalGeneration with text_config/vision_config)
  tests/fuzz/corpus_tokenizer/    tests/ref/tiny_tokenizer.json and a minimal BPE tokenizer.json
"""
import json
import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "fuzz")


def st_file(tensors, metadata=None, pad_to=8):
    """safetensors bytes: 8-byte little-endian header length, JSON header, data."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % pad_to)
    return struct.pack("<Q", len(h)) + h + data


def write(sub, name, data):
    d = os.path.join(OUT, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)
    write("corpus_safetensors", "f32_2x3.seed", st_file({"w": ("F32", [2, 3], f32)}, {"format": "pt"}))
    write("corpus_safetensors", "mixed.seed", st_file({
        "model.embed_tokens.weight": ("BF16", [4, 2], bytes(range(16))),
        "model.norm.weight": ("F16", [2], b"\x00\x3c\x00\xc0"),
        "q": ("I8", [3], b"\x01\xff\x7f"),
        "scalar": ("F32", [], struct.pack("<f", 2.5)),
        "empty": ("F32", [0, 4], b""),
    }, {"format": "pt", "note": "seed"}))
    write("corpus_safetensors", "no_metadata.seed", st_file({"a": ("F64", [1], struct.pack("<d", 1.0))}))
    write("corpus_safetensors", "empty_header.seed", st_file({}))
    big = struct.pack("<160f", *[(i % 17) * 0.25 - 2 for i in range(160)])
    write("corpus_safetensors", "two_large.seed", st_file({"a.weight": ("F32", [40, 4], big),
                                                          "b.weight": ("BF16", [8, 40], bytes(640))}))

    os.makedirs(os.path.join(OUT, "corpus_config"), exist_ok=True)
    for src, name in (("tiny_gemma3", "tiny.json"), ("tiny_gemma3_legacy", "legacy.json"),
                      ("tiny_gemma3_v9k", "v9k.json")):
        shutil.copyfile(os.path.join(ROOT, "tests", "ref", src, "config.json"), os.path.join(OUT, "corpus_config", name))
    with open(os.path.join(ROOT, "tests", "ref", "tiny_gemma3", "config.json")) as f:
        text = json.load(f)
    wrap = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
            "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27, "intermediate_size": 4304,
                              "num_attention_heads": 16, "image_size": 896, "patch_size": 14},
            "text_config": text}
    write("corpus_config", "multimodal.json", json.dumps(wrap, indent=1).encode())

    os.makedirs(os.path.join(OUT, "corpus_tokenizer"), exist_ok=True)
    shutil.copyfile(os.path.join(ROOT, "tests", "ref", "tiny_tokenizer.json"),
                    os.path.join(OUT, "corpus_tokenizer", "tiny.json"))
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "▁": 4, "a": 5, "b": 6, "▁a": 7, "ab": 8, "<0x41>": 9}
    mini = {
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<pad>", "special": True, "normalized": False, "lstrip": False,
                          "rstrip": False, "single_word": False},
                         {"id": 2, "content": "<bos>", "special": True, "normalized": False, "lstrip": False,
                          "rstrip": False, "single_word": False}],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                                                     {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [["▁", "a"], ["a", "b"]]},
    }
    write("corpus_tokenizer", "mini.json", json.dumps(mini, ensure_ascii=False, indent=1).encode())


if __name__ == "__main__":
    main()
