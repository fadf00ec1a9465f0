#!/usr/bin/env python3
"""Tiny random multimodal Gemma 4 (vision) reference for gemmarun (run by hand, never in CI).

Writes a Gemma4ForConditionalGeneration (transformers 5.24) at toy sizes and what transformers
computes with it:

  tests/ref/tiny_gemma4_vision/{config.json, generation_config.json, model.safetensors,
                                preprocessor_config.json}
        save_pretrained's files (float32 safetensors; the tower's clip buffers input_min / input_max /
        output_min / output_max and std_bias / std_scale are in model.safetensors, checked), and
        Gemma4ImageProcessorPil(max_soft_tokens=70, patch_size=4, pooling_kernel_size=3)'s
        preprocessor_config.json. The model reloads to the identical state and logits (checked).
  tests/ref/tiny_gemma4_vision_ref.h5
        /vision   pixel_values01 (2, 3, 96, 96) f32: two smooth images (sums of random sinusoids,
                  clipped to [0, 1] and rounded to k/255, so they are exactly what the processor
                  makes of round(255 x) as uint8); pixel_values (2, 576, 48) f32 and
                  image_position_ids (2, 576, 2) int32: the processor's patch layout (patches of
                  4 x 4 pixels row-major, each (py, px, c) flattened; positions (x, y)), checked
                  equal to Gemma4ImageProcessorPil's output on the uint8 images (which pads to
                  630 patches at position (-1, -1); attribute max_abs_diff_padded_630: how far the
                  soft tokens of that padded input lie from the unpadded ones);
                  last_hidden_state (2, 576, 32): the tower's encoder output before pooling;
                  pooled (2, 64, 32): vision_tower's output (3 x 3 average pooling, * sqrt(32),
                  standardize); soft_tokens (2, 64, 64): get_image_features' pooler_output (after
                  embed_vision), what the decoder receives; clip_fractions (14, 2) f64: per clipped
                  linear (attribute modules, one name a line, forward order) the fraction of its
                  input values and of its output values that the clamps move; attribute
                  min_clip_margin (see below)
        /mm       input_ids (2, 84) int32: [BOS, 5 text, boi, 64 x image, eoi, 12 text] with image 0,
                  [BOS, 10 text, boi, 64 x image, eoi, 7 text] with image 1; mm_token_type_ids
                  (2, 84) int32 (1 at the image tokens); logits (2, 84, 512) f32 (one call, no
                  cache, the "vision" bidirectional mask on the sliding layers); logits_cached
                  (1, 84, 512): sequence 0 through transformers' cache, the first 80 tokens (images
                  included) as the prompt, then one token at a time; attributes
                  max_abs_diff_cached, max_abs_logit_diff_causal_only (no bidirectional mask: the
                  same call without mm_token_type_ids, checked identical to a copy with
                  use_bidirectional_attention=None), max_abs_diff_no_clip (every clip buffer
                  -inf / +inf), max_prob (no saturation)
        /lora_vt  PEFT LoRA (r 4, alpha 8, dropout 0) on the language model's q/k/v/o/gate/up/down
                  (the KV-shared layers have no k/v) and on the tower's inner nn.Linear of every
                  clippable linear (".linear": the clamps stay around the adapted linear), nothing
                  on embed_vision; A ~ U(-0.5, 0.5), B ~ N(0, 0.1^2) drawn in state-dict order from
                  torch.Generator(SEED_LORA); labels (2, 84) int32: the last 6 tokens of each
                  sequence, the rest -100 (transformers shifts); loss (1,) f64; for every adapted
                  module "layers.<l>.<module>" / "vision.layers.<l>.<module>.linear": .A, .B,
                  .A_grad, .B_grad (f32) and .A_grad64, .B_grad64 (f64: the same computed on a
                  .double() copy, same A and B); loss64 (1,) f64; attributes r, lora_alpha, seed,
                  target_modules, peft_keys (get_peft_model_state_dict's keys, one a line),
                  peft_f32_grad_rel_err_vs_f64 (worst max|g32 - g64| / max|g64| over the tensors).
                  Note: transformers' Gemma 4 computes RMSNorms, the vision pooler and the RoPE
                  tables in float32 even in a float64 model, so the *64 values carry ~1e-7 relative
                  rounding from those.
        /vision_rect  non-square images through the processor and the tower, from their own
                  torch.Generator(SEED_RECT) drawn after everything above (the model, the other
                  groups and their inputs are what they were without this group). src_<i> uint8
                  (h, w, 3), i = 0, 1, 2: smooth images as /vision's (sums of 4 random plane waves
                  per channel) of w x h 50 x 130 (tall), 200 x 64 (wide), 33 x 33 (small, upscaled).
                  Gemma4ImageProcessorPil(max_soft_tokens=70, patch_size=4, pooling_kernel_size=3)
                  on the three at once: size (3, 2) int32, each (h, w) after its aspect-ratio-
                  preserving resize (sides multiples of 12 px, at most 630 patches; PIL bicubic on
                  the uint8 image, checked); num_soft_tokens (3,) int32 (the processor's
                  num_soft_tokens_per_image); pixel_values_<i> (630, 48) f32 and
                  image_position_ids_<i> (630, 2) int32: its output, padded to 630 patches
                  (pixel 0, position (-1, -1)); resized_<i> (3, h_i, w_i) f32 in [0, 1]: the resized
                  image as the processor patchifies it (rebuilt from the unpadded patches, checked
                  equal to PIL's resize / 255). get_image_features on the batch of three (padded to
                  630): pooled_<i> (n_i, 32) f32: the vision tower's output (pooled, scaled,
                  standardized; before embed_vision) of image i; soft_tokens_<i> (n_i, 64) f32: its
                  pooler_output (the soft tokens); soft_tokens_alone_<i> (n_i, 64) f32: the same for
                  image i processed and run alone (batch of 1, padded to 630), asserted within 1e-5
                  of soft_tokens_<i> (attribute max_abs_diff_alone); attribute seed.

Config: text = make_gemma4_ref.config("e") (6 layers, 4 sliding with window 4 + 2 full,
per-layer embeddings, the last 2 layers KV-shared, double-wide MLPs, soft-cap 30) with
use_bidirectional_attention="vision"; vision = Gemma4VisionConfig(hidden 32, MLP 48, 2 layers,
2 heads of 16 (2 kv heads), patch 4, pooling 3, position_embedding_size 64, clipped linears,
standardize, eps 1e-6); no audio; image token 511, boi 509, eoi 510.

Weights, from torch.Generator(SEED_WEIGHTS) in named_parameters order then the buffers: language
model as make_gemma4_ref (linears N(0, 0.08^2), norms 1 + N(0, 0.1^2), embeddings N(0, 0.25^2),
layer_scalar U(0.5, 1.5)); tower linears N(0, 1/fan_in), tower norms 1 + N(0, 0.1^2),
position_embedding_table N(0, 0.5^2); embed_vision.embedding_projection N(0, 1/32); std_bias
N(0, 0.1^2), std_scale 1 + N(0, 0.1^2). Clip bounds (set_clip_bounds), clamp after clamp in forward
order, on the model and its LoRA copy together: each side starts at quantile u (input: of the
clamp's input; output: of its linear's output after the input clamp) of the values met in the
plain forward of the two images, u ~ U(0.01, 0.06) from torch.Generator(SEED_CLIP), and moves to
the middle of the widest gap, among the 41 nearest ranks, of the values met in the plain and the
LoRA forwards, so no value lies near a bound (attribute /vision/min_clip_margin, asserted > 1e-5:
no clamp flips between float32 and float64 or between implementations); the fractions clipped in
the plain forward (asserted in [1%, 20%]) are /vision/clip_fractions.

Determinism: seeds fixed, 1 torch thread, deterministic algorithms, HDF5 without timestamps (the
helpers of make_ref.py, copied: make_ref imports gguf, which the peers venv lacks).

Needs torch, transformers 5.24, peft 0.21, h5py and Pillow (the processor), e.g. the peers venv
(tests/peers/setup.sh):
  pip install --target /tmp/h5 h5py pillow
  PYTHONPATH=/tmp/h5 ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_gemma4_vision_ref.py
"""

import copy
import hashlib
import json
import os
import shutil
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gemma4_ref as g4  # noqa: E402

import peft  # noqa: E402
import safetensors.torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4VisionConfig  # noqa: E402
from transformers.models.gemma4.image_processing_pil_gemma4 import (  # noqa: E402
    Gemma4ImageProcessorPil, convert_image_to_patches)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tiny_gemma4_vision")
REF = os.path.join(HERE, "tiny_gemma4_vision_ref.h5")
SEED_WEIGHTS = 40401
SEED_CLIP = 40402
SEED_INPUTS = 40403
SEED_LORA = 40404
SEED_RECT = 40405
RECT_WH = ((50, 130), (200, 64), (33, 33))   # (w, h): tall, wide, small square

BOI, EOI, IMG = 509, 510, 511
S, PATCH, POOL = 96, 4, 3
NP = (S // PATCH) ** 2           # 576 patches
NS = NP // POOL ** 2             # 64 soft tokens
T, PROMPT = 84, 80

LORA_TARGETS = (r"model\.language_model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|"
                r"mlp\.(gate_proj|up_proj|down_proj))"
                r"|model\.vision_tower\.encoder\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|"
                r"mlp\.(gate_proj|up_proj|down_proj))\.linear")


# --- HDF5 without timestamps, sha256: make_ref.py's helpers ---------------------------------------

from make_ref import h5_attrs, h5_dset, h5_group, sha256_file, write_h5_atomically  # noqa: E402


# --- model ------------------------------------------------------------------------------------------

def make_config(bidirectional="vision"):
    tc = g4.config("e")
    tc.use_bidirectional_attention = bidirectional
    vc = Gemma4VisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=2, head_dim=16, patch_size=PATCH, pooling_kernel_size=POOL,
                            position_embedding_size=64, use_clipped_linears=True, standardize=True,
                            rms_norm_eps=1e-6)
    return Gemma4Config(text_config=tc, vision_config=vc, audio_config=None, image_token_id=IMG,
                        boi_token_id=BOI, eoi_token_id=EOI)


def randomize(model):
    g = torch.Generator().manual_seed(SEED_WEIGHTS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".vision_tower." in name:
                if name.endswith("position_embedding_table"):
                    w = 0.5 * torch.randn(p.shape, generator=g)
                elif "norm" in name:
                    w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
                else:
                    assert p.dim() == 2, name
                    w = torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5
            elif ".embed_vision." in name:
                assert name.endswith("embedding_projection.weight"), name
                w = torch.randn(p.shape, generator=g) * 32 ** -0.5
            else:
                assert ".language_model." in name, name
                if "norm" in name:
                    w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
                elif "embed_tokens" in name:
                    w = 0.25 * torch.randn(p.shape, generator=g)
                else:
                    w = 0.08 * torch.randn(p.shape, generator=g)
            p.copy_(w)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif name.endswith("std_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("std_scale"):
                b.copy_(1.0 + 0.1 * torch.randn(b.shape, generator=g))


def make_model():
    m = Gemma4ForConditionalGeneration(make_config()).eval()
    randomize(m)
    return m


# --- inputs -----------------------------------------------------------------------------------------

def smooth_images(g):
    """Two (3, S, S) images in [0, 1]: per channel 0.5 + a sum of 4 random plane waves (1 to 4 cycles
    across the image), clipped, rounded to k/255."""
    u8 = torch.stack([torch.from_numpy(smooth_image(g, S, S)).permute(2, 0, 1) for _ in range(2)])
    return (u8.double() / 255).float(), u8


def patchify(pix01):
    patches = np.stack([convert_image_to_patches(im, PATCH) for im in pix01.numpy()])
    n = S // PATCH
    gx, gy = np.meshgrid(np.arange(n), np.arange(n), indexing="xy")
    pos = np.stack([gx, gy], axis=-1).reshape(n * n, 2)
    return torch.from_numpy(patches), torch.from_numpy(np.stack([pos, pos])).long()


def check_processor(u8, patches, pos, proc):
    out = proc([im.permute(1, 2, 0).numpy() for im in u8], return_tensors="pt")
    pv, pp = out["pixel_values"], out["image_position_ids"]
    assert list(out["num_soft_tokens_per_image"]) == [NS, NS], out["num_soft_tokens_per_image"]
    max_patches = 70 * POOL ** 2
    assert pv.shape == (2, max_patches, 3 * PATCH ** 2) and pp.shape == (2, max_patches, 2), (pv.shape, pp.shape)
    assert torch.equal(pv[:, :NP].float(), patches), float((pv[:, :NP].float() - patches).abs().max())
    assert torch.equal(pp[:, :NP].long(), pos)
    assert bool((pp[:, NP:] == -1).all()) and bool((pv[:, NP:] == 0).all())
    return pv.float(), pp.long()


def smooth_image(g, h, w):
    """One (h, w, 3) uint8 image made as smooth_images' (0.5 + 4 random plane waves per channel, 1 to 4
    cycles across each side, clipped, rounded to k/255), at h x w."""
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float64) / h, torch.arange(w, dtype=torch.float64) / w,
                            indexing="ij")
    img = torch.zeros(3, h, w, dtype=torch.float64)
    for c in range(3):
        acc = torch.full((h, w), 0.5, dtype=torch.float64)
        for _ in range(4):
            fx, fy = (torch.rand(2, generator=g, dtype=torch.float64) * 6 - 3).tolist()
            ph, amp = torch.rand(2, generator=g, dtype=torch.float64).tolist()
            acc += (0.1 + 0.25 * amp) * torch.sin(2 * np.pi * (fx * xx + fy * yy + ph))
        img[c] = acc
    return torch.round(img.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()


def unpatchify(patches, h, w):
    """(n, 48) patches in (py, px, c) order, row-major over the (h/4, w/4) grid -> (3, h, w)."""
    gh, gw = h // PATCH, w // PATCH
    return patches.reshape(gh, gw, PATCH, PATCH, 3).transpose(4, 0, 2, 1, 3).reshape(3, h, w)


def vision_rect(model, proc):
    """/vision_rect: non-square images through the processor and get_image_features (see the docstring)."""
    from PIL import Image
    g = torch.Generator().manual_seed(SEED_RECT)
    srcs = [smooth_image(g, h, w) for w, h in RECT_WH]
    out = proc(srcs, return_tensors="pt")
    pv, pp = out["pixel_values"].float(), out["image_position_ids"].long()
    ns = [int(n) for n in out["num_soft_tokens_per_image"]]
    max_patches = 70 * POOL ** 2
    assert pv.shape == (3, max_patches, 3 * PATCH ** 2) and pp.shape == (3, max_patches, 2), (pv.shape, pp.shape)
    res = {"src": srcs, "ns": ns, "pv": pv, "pp": pp, "size": [], "resized": []}
    for i, src in enumerate(srcs):
        npch = ns[i] * POOL ** 2
        valid = (pp[i] != -1).all(-1)
        assert int(valid.sum()) == npch and bool(valid[:npch].all()), i
        assert bool((pp[i, npch:] == -1).all()) and bool((pv[i, npch:] == 0).all()), i
        gw, gh = int(pp[i, :npch, 0].max()) + 1, int(pp[i, :npch, 1].max()) + 1
        h, w = gh * PATCH, gw * PATCH
        assert gh * gw == npch and h % (PATCH * POOL) == 0 and w % (PATCH * POOL) == 0, (i, h, w)
        assert h * w <= max_patches * PATCH ** 2 and (h, w) != src.shape[:2]
        gx, gy = np.meshgrid(np.arange(gw), np.arange(gh), indexing="xy")
        assert np.array_equal(pp[i, :npch].numpy(), np.stack([gx, gy], -1).reshape(npch, 2)), i
        img = unpatchify(pv[i, :npch].numpy(), h, w)
        assert np.array_equal(np.stack([convert_image_to_patches(img, PATCH)]), pv[i:i + 1, :npch].numpy())
        pil = np.asarray(Image.fromarray(src).resize((w, h), Image.BICUBIC)).transpose(2, 0, 1)
        assert np.array_equal(img, (pil.astype(np.float32) / np.float32(255)).astype(np.float32)) or \
            np.array_equal(img, (pil.astype(np.float64) / 255).astype(np.float32)), i
        res["size"].append((h, w))
        res["resized"].append(img)
    with torch.no_grad():
        feats = model.model.get_image_features(pv, pp, return_dict=True)
        pooled = feats.last_hidden_state
        soft = list(feats.pooler_output)
        alone = []
        for i, src in enumerate(srcs):
            o = proc([src], return_tensors="pt")
            assert torch.equal(o["pixel_values"][0].float(), pv[i]) and torch.equal(o["image_position_ids"][0].long(), pp[i])
            alone.append(model.model.get_image_features(o["pixel_values"].float(), o["image_position_ids"].long(),
                                                        return_dict=True).pooler_output[0])
    assert pooled.shape == (sum(ns), 32) and [t.shape for t in soft] == [(n, 64) for n in ns], (pooled.shape, ns)
    assert torch.equal(torch.cat(soft), model.model.embed_vision(inputs_embeds=pooled))
    res["pooled"] = list(torch.split(pooled, ns))
    res["soft"], res["alone"] = soft, alone
    res["diff_alone"] = max(float((a - b).abs().max()) for a, b in zip(alone, soft))
    assert res["diff_alone"] < 1e-5, res["diff_alone"]
    return res


# --- reference computations ---------------------------------------------------------------------------

def mm_logits(model, ids, patches, pos, tt):
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=patches, image_position_ids=pos, mm_token_type_ids=tt,
                     use_cache=False).logits.float()


def logits_cached(model, ids, patches, pos, tt):
    with torch.no_grad():
        out = model(input_ids=ids[:, :PROMPT], pixel_values=patches, image_position_ids=pos,
                    mm_token_type_ids=tt[:, :PROMPT], use_cache=True)
        parts, cache = [out.logits], out.cache
        for t in range(PROMPT, ids.shape[1]):
            # as prepare_inputs_for_generation: no mm_token_type_ids after the prefill
            out = model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            parts.append(out.logits)
            cache = out.cache
    return torch.cat(parts, dim=1).float()


from make_vision_ref import random_lora  # noqa: E402  (A ~ U(-0.5, 0.5), B ~ N(0, 0.1^2) in state-dict order)
import gemma4_clip_ref as clip_ref  # noqa: E402  (the clipped linears: shared with make_gemma4_audio_ref.py)
from gemma4_clip_ref import clipped  # noqa: E402


def tower_run(pix, pos):
    """A forward of a model's (or its PEFT copy's) vision tower on the patches."""
    def run(model):
        tower = model.get_base_model().model.vision_tower if hasattr(model, "get_base_model") else model.model.vision_tower
        tower(pixel_values=pix, pixel_position_ids=pos)
    return run


def lora_model_of(model):
    """A copy of model under PEFT LoRA at the drawn A and B."""
    return clip_ref.lora_model_of(model, LORA_TARGETS, SEED_LORA, random_lora)


def short(k):
    i = k.index("layers.")
    tail = k[i:].replace(".lora_A.weight", "").replace(".lora_B.weight", "")
    return ("vision." if "vision_tower" in k else "") + tail


def lora_run(pm, ids, patches, pos, tt, labels):
    keys = list(peft.get_peft_model_state_dict(pm).keys())
    named = dict(pm.named_parameters())
    lora = {k: named[k.replace(".lora_A.weight", ".lora_A.default.weight").replace(
        ".lora_B.weight", ".lora_B.default.weight")] for k in keys}
    trainable = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert len(trainable) == len(lora) == len(keys), (len(trainable), len(lora), len(keys))
    assert not any("embed_vision" in k or "audio" in k for k in keys)
    assert any("vision_tower" in k for k in keys) and any("language_model" in k for k in keys)
    out = pm(input_ids=ids, pixel_values=patches, image_position_ids=pos, mm_token_type_ids=tt, labels=labels,
             use_cache=False)
    out.loss.backward()
    res = {}
    for k, p in lora.items():
        which = "A" if ".lora_A." in k else "B"
        assert p.grad is not None and float(p.grad.abs().max()) > 0, k
        res[f"{short(k)}.{which}"] = (p.detach().clone(), p.grad.detach().clone())
    return float(out.loss.detach()), keys, res


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    transformers.utils.logging.set_verbosity_error()

    g = torch.Generator().manual_seed(SEED_INPUTS)
    pix01, u8 = smooth_images(g)
    patches, pos = patchify(pix01)
    proc = Gemma4ImageProcessorPil(max_soft_tokens=70, patch_size=PATCH, pooling_kernel_size=POOL)
    pv630, pp630 = check_processor(u8, patches, pos, proc)

    def text(n):
        return torch.randint(3, BOI, (n,), generator=g).tolist()

    s0 = [2] + text(5) + [BOI] + [IMG] * NS + [EOI]
    s1 = [2] + text(10) + [BOI] + [IMG] * NS + [EOI]
    s0, s1 = s0 + text(T - len(s0)), s1 + text(T - len(s1))
    ids = torch.tensor([s0, s1])
    tt = (ids == IMG).long()
    labels = torch.full_like(ids, -100)
    labels[:, -6:] = ids[:, -6:]

    model = make_model()
    lora_model = lora_model_of(model)
    margin, _ = clip_ref.set_clip_bounds([model, lora_model], tower_run(patches, pos), SEED_CLIP)
    print(f"clip bounds: every value at least {margin:.3g} from its bound (plain and LoRA forwards)")
    assert margin > 1e-5, margin
    fr = clip_ref.clip_fractions(model, tower_run(patches, pos))
    for n, (fi, fo) in fr.items():
        print(f"clip {n}: input {fi:.4f}, output {fo:.4f}")
        assert 0.01 <= fi <= 0.20 and 0.01 <= fo <= 0.20, (n, fi, fo)
    assert len(fr) == 14

    # the tower, its pooled output, the soft tokens
    enc = {}

    def keep_first(mod, args, out):  # the encoder's output before pooling (first call only)
        enc.setdefault("x", out.last_hidden_state.detach().clone())

    h = model.model.vision_tower.encoder.register_forward_hook(keep_first)
    with torch.no_grad():
        pooled = model.model.vision_tower(pixel_values=patches, pixel_position_ids=pos).last_hidden_state
        soft = torch.stack(model.model.get_image_features(patches, pos, return_dict=True).pooler_output)
        soft630 = torch.stack(model.model.get_image_features(pv630, pp630, return_dict=True).pooler_output)
    h.remove()
    last = enc["x"]
    pooled = pooled.reshape(2, NS, 32)
    assert last.shape == (2, NP, 32) and soft.shape == (2, NS, 64), (last.shape, soft.shape)
    diff_pad = float((soft630 - soft).abs().max())
    assert diff_pad < 1e-4, diff_pad

    logits = mm_logits(model, ids, patches, pos, tt)
    with torch.no_grad():
        causal = model(input_ids=ids, pixel_values=patches, image_position_ids=pos, use_cache=False).logits.float()
    uni = Gemma4ForConditionalGeneration(make_config(bidirectional=None)).eval()
    uni.load_state_dict(model.state_dict())
    causal_b = mm_logits(uni, ids, patches, pos, tt)
    assert torch.equal(causal, causal_b), float((causal - causal_b).abs().max())
    diff_causal = float((logits - causal).abs().max())
    noclip = copy.deepcopy(model)
    with torch.no_grad():
        for _, m in clipped(noclip):
            m.input_min.fill_(-float("inf"))
            m.output_min.fill_(-float("inf"))
            m.input_max.fill_(float("inf"))
            m.output_max.fill_(float("inf"))
    diff_noclip = float((logits - mm_logits(noclip, ids, patches, pos, tt)).abs().max())
    max_prob = float(torch.softmax(logits, -1).max())
    cached = logits_cached(model, ids[:1], patches[:1], pos[:1], tt[:1])
    diff_cached = float((cached - logits[:1]).abs().max())
    print(f"causal-only {diff_causal:.4g}, no clip {diff_noclip:.4g}, max prob {max_prob:.4f}, "
          f"cached {diff_cached:.3g}, padded-630 soft tokens {diff_pad:.3g}")
    assert diff_cached < 1e-4 and max_prob < 0.99 and diff_causal > 1e-2 and diff_noclip > 1e-2

    # save, check the keys, reload
    shutil.rmtree(OUT, ignore_errors=True)
    model.save_pretrained(OUT, safe_serialization=True)
    proc.save_pretrained(OUT)
    tensors = safetensors.torch.load_file(os.path.join(OUT, "model.safetensors"))
    for k in sorted(tensors):
        if "vision" in k and (".layers." not in k or ".layers.0." in k):
            print(f"  {k} {tuple(tensors[k].shape)} {tensors[k].dtype}")
    assert all(v.dtype == torch.float32 for v in tensors.values())
    sd = model.state_dict()
    for n, m in clipped(model):
        for b in ("input_min", "input_max", "output_min", "output_max"):
            key = f"{n}.{b}"
            assert key in tensors and torch.equal(tensors[key], sd[key]) and bool(torch.isfinite(tensors[key])), key
    for b in ("std_bias", "std_scale"):
        assert torch.equal(tensors[f"model.vision_tower.{b}"], sd[f"model.vision_tower.{b}"])
    back = Gemma4ForConditionalGeneration.from_pretrained(OUT).eval()
    for (n1, p1), (n2, p2) in zip(sd.items(), back.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    assert torch.equal(mm_logits(back, ids, patches, pos, tt), logits)

    # LoRA, f32 and f64
    loss, peft_keys, res = lora_run(lora_model, ids, patches, pos, tt, labels)
    loss64, keys64, res64 = lora_run(lora_model_of(model).double(), ids, patches, pos, tt, labels)
    assert keys64 == peft_keys and list(res64) == list(res)
    worst = 0.0
    for k in res:
        assert torch.equal(res[k][0].double(), res64[k][0]), k
        g32, g64 = res[k][1].double(), res64[k][1]
        worst = max(worst, float((g32 - g64).abs().max() / g64.abs().max()))
        if os.environ.get("DEBUG_GRADS"):
            print(f"  {k}: {float((g32 - g64).abs().max() / g64.abs().max()):.3g}")
    print(f"LoRA: loss {loss:.6f} (f64 {loss64:.9f}), {len(res)} adapter tensors, f32 grads {worst:.3g} from f64")

    # non-square images (their own generator, drawn last: nothing above changes)
    rect = vision_rect(model, proc)
    for (w0, h0), (h, w), n in zip(RECT_WH, rect["size"], rect["ns"]):
        print(f"vision_rect: {w0} x {h0} (w x h) -> {w} x {h}, {h // PATCH * (w // PATCH)} patches, {n} soft tokens")
    print(f"vision_rect: alone vs batched soft tokens {rect['diff_alone']:.3g}")

    def writer(f):
        h5_attrs(f, {"generator": "tests/ref/make_gemma4_vision_ref.py", "torch_num_threads": 1,
                     "version_torch": str(torch.__version__),
                     "version_transformers": str(transformers.__version__), "version_peft": str(peft.__version__)})
        v = h5_group(f, "vision")
        h5_dset(v, "pixel_values01", pix01.numpy(), np.float32)
        h5_dset(v, "pixel_values", patches.numpy(), np.float32)
        h5_dset(v, "image_position_ids", pos.numpy(), np.int32)
        h5_dset(v, "last_hidden_state", last.numpy(), np.float32)
        h5_dset(v, "pooled", pooled.numpy(), np.float32)
        h5_dset(v, "soft_tokens", soft.numpy(), np.float32)
        h5_dset(v, "clip_fractions", np.array(list(fr.values())), np.float64)
        h5_attrs(v, {"max_abs_diff_padded_630": diff_pad, "min_clip_margin": margin})
        v["clip_fractions"].attrs["modules"] = "\n".join(fr)
        m = h5_group(f, "mm")
        h5_dset(m, "input_ids", ids.numpy(), np.int32)
        h5_dset(m, "mm_token_type_ids", tt.numpy(), np.int32)
        h5_dset(m, "logits", logits.numpy(), np.float32)
        h5_dset(m, "logits_cached", cached.numpy(), np.float32)
        h5_attrs(m, {"max_abs_logit_diff_causal_only": diff_causal, "max_abs_diff_no_clip": diff_noclip,
                     "max_prob": max_prob, "max_abs_diff_cached": diff_cached})
        lg = h5_group(f, "lora_vt")
        h5_dset(lg, "labels", labels.numpy(), np.int32)
        h5_dset(lg, "loss", np.array([loss]), np.float64)
        h5_dset(lg, "loss64", np.array([loss64]), np.float64)
        for k, (val, grad) in res.items():
            h5_dset(lg, k, val.numpy(), np.float32)
            h5_dset(lg, k + "_grad", grad.numpy(), np.float32)
            h5_dset(lg, k + "_grad64", res64[k][1].numpy(), np.float64)
        h5_attrs(lg, {"r": 4, "lora_alpha": 8, "seed": SEED_LORA, "target_modules": LORA_TARGETS,
                      "peft_keys": "\n".join(peft_keys), "peft_f32_grad_rel_err_vs_f64": worst})
        vr = h5_group(f, "vision_rect")
        for i in range(len(RECT_WH)):
            h5_dset(vr, f"src_{i}", rect["src"][i], np.uint8)
        h5_dset(vr, "size", np.array(rect["size"]), np.int32)
        h5_dset(vr, "num_soft_tokens", np.array(rect["ns"]), np.int32)
        for i in range(len(RECT_WH)):
            h5_dset(vr, f"pixel_values_{i}", rect["pv"][i].numpy(), np.float32)
            h5_dset(vr, f"image_position_ids_{i}", rect["pp"][i].numpy(), np.int32)
            h5_dset(vr, f"resized_{i}", rect["resized"][i], np.float32)
            h5_dset(vr, f"pooled_{i}", rect["pooled"][i].numpy(), np.float32)
            h5_dset(vr, f"soft_tokens_{i}", rect["soft"][i].numpy(), np.float32)
            h5_dset(vr, f"soft_tokens_alone_{i}", rect["alone"][i].numpy(), np.float32)
        h5_attrs(vr, {"seed": SEED_RECT, "max_abs_diff_alone": rect["diff_alone"]})

    write_h5_atomically(REF, writer)
    for p in [os.path.join(OUT, fn) for fn in sorted(os.listdir(OUT))] + [REF]:
        print(f"{sha256_file(p)}  {os.path.relpath(p, HERE)}")
    write_chat()


def write_chat():
    """tests/ref/tiny_gemma4_vision_chat/: the model (links) with a tokenizer in Gemma 4's format: the tiny
    multimodal test tokenizer (tests/ref/tiny_vision_tokenizer.json, ids 509-511 for the image tokens)
    with Gemma 4's marker texts (<|turn> <turn|>, <|image> <image|> <|image|>; same ids), so gemmarun
    renders Gemma 4's turns and image blocks for it."""
    out = os.path.join(HERE, "tiny_gemma4_vision_chat")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(HERE, "tiny_vision_tokenizer.json")) as f:
        tok = json.load(f)
    rename = {"<start_of_turn>": "<|turn>", "<end_of_turn>": "<turn|>", "<start_of_image>": "<|image>",
              "<end_of_image>": "<image|>", "<image_soft_token>": "<|image|>"}
    for a in tok["added_tokens"]:
        a["content"] = rename.get(a["content"], a["content"])
    tok["model"]["vocab"] = {rename.get(k, k): v for k, v in tok["model"]["vocab"].items()}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    for fn in ("config.json", "model.safetensors", "preprocessor_config.json"):
        link = os.path.join(out, fn)
        if not os.path.islink(link):
            os.symlink(os.path.join("..", "tiny_gemma4_vision", fn), link)


if __name__ == "__main__":
    main()
