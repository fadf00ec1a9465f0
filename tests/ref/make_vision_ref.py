#!/usr/bin/env python3
"""Multimodal Gemma 3 reference for gemmarun (run by hand, never in CI).

Writes a tiny random Gemma3ForConditionalGeneration (a tiny SigLIP vision tower, the multimodal
projector, the tiny Gemma 3 text decoder of make_ref.py) and what transformers computes with it:

  tests/ref/tiny_gemma3_vision{,_newkeys,_t5}/{config.json,model.safetensors}
        the same f32 weights in the three key layouts a loader meets (gemma_architecture.md §5.2):
          tiny_gemma3_vision          the hub's original files: language_model.model.*,
                                      vision_tower.vision_model.*, multi_modal_projector.*
          tiny_gemma3_vision_newkeys  the converters' layout: model.language_model.*,
                                      model.vision_tower.vision_model.*, model.multi_modal_projector.*
          tiny_gemma3_vision_t5       what transformers 5.24's save_pretrained writes:
                                      language_model.model.*, vision_tower.* (no vision_model.),
                                      multi_modal_projector.*
        transformers loads each to the identical model (checked here)
  tests/ref/tiny_vision_ref.h5
        /vision   pixel_values (2, 3, S, S) random in [-1, 1]; last_hidden_state (2, P, Cv) of the
                  tower (after post_layernorm); image_features (2, 4, C) after the projector
                  (4x4 patches average-pooled 2x2, RMSNorm, projection)
        /mm       three sequences (B = 3, T = 20) through the whole model: one image, two images,
                  and text only; input_ids, token_type_ids, pixel_values of the 3 images in
                  order, logits (3, T, V); attribute max_abs_logit_diff_causal_only: how far the
                  logits move when the image tokens do not see each other bidirectionally
                  (token_type_ids dropped), so the bidirectional mask is visible in the fixture
        /lora     PEFT LoRA (r 4, alpha 8) on every linear of the language model only (the tower
                  and projector frozen), random A ~ U(-0.5, 0.5) and B ~ N(0, 0.1^2) drawn in
                  state-dict order from torch.Generator(SEED_LORA); labels = the last 6 tokens of
                  each /mm sequence except image tokens (transformers shifts them: position t
                  predicts t + 1); loss (mean over the 14 supervised predictions), and for every
                  adapted module
                  "layers.<l>.<module>" its A, B and their gradients (A_grad, B_grad)
        /lora_vt  the same batch with PEFT LoRA (r 4, alpha 8; A, B drawn as /lora's from
                  SEED_LORA + 1) on the language model's q_proj, v_proj, down_proj and on every
                  linear of the tower (q/k/v/out_proj, fc1, fc2: "vision.layers.<l>.<module>"), and
                  modules_to_save = ["multi_modal_projector"] (the projector trained fully):
                  loss, A, B and gradients, the projector's gradients
                  ("projector.mm_input_projection_weight_grad", "projector.mm_soft_emb_norm.weight_
                  grad"), and attribute peft_keys: get_peft_model_state_dict's keys, one a line
                  (the names PEFT saves the adapter under)

Tiny config: text = make_ref.py's TINY_COMMON (vocab 512, hidden 64, 6 layers, 5 sliding + 1 full,
sliding window 4, 4 heads / 2 kv heads, head_dim 16); vision: image 56, patch 14 (4 x 4 = 16
patches), hidden 32, 2 layers, 4 heads (head_dim 8), MLP 48, gelu_pytorch_tanh, LayerNorm eps 1e-6;
mm_tokens_per_image 4; boi 509, eoi 510, image token 511. Weights: text as make_ref.py (embedding
N(0, 0.1^2) here, so no logit saturates), vision Linear / conv N(0, 1/fan_in), biases N(0, 0.1^2),
LayerNorm weights 1 + N(0, 0.1^2) and biases N(0, 0.1^2), position embedding N(0, 0.5^2),
projector weight N(0, 1/32), soft-embedding RMSNorm weight N(0, 0.3^2).

Usage:  /opt/refvenv/bin/python tests/ref/make_vision_ref.py
Determinism: seeds fixed, 1 torch thread, HDF5 written without timestamps (make_ref.py's helpers).
"""

import json
import os
import shutil
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_ref as mr  # noqa: E402

import peft  # noqa: E402
import safetensors.torch  # noqa: E402
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig  # noqa: E402

HERE = mr.HERE
SEED_WEIGHTS = 20251201
SEED_INPUTS = 20251202
SEED_LORA = 20251203

VISION = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_channels=3,
    image_size=56,
    patch_size=14,
    hidden_act="gelu_pytorch_tanh",
    layer_norm_eps=1e-6,
    attention_dropout=0.0,
    vision_use_head=False,
)
MM_TOKENS = 4
BOI, EOI, IMG = 509, 510, 511


def make_config():
    text = dict(mr.TINY_COMMON)
    tc = Gemma3TextConfig(
        **text,
        layer_types=list(mr.TINY_LAYER_TYPES),
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
    )
    vc = SiglipVisionConfig(**VISION)
    cfg = Gemma3Config(text_config=tc.to_dict(), vision_config=vc.to_dict(), mm_tokens_per_image=MM_TOKENS,
                       boi_token_index=BOI, eoi_token_index=EOI, image_token_index=IMG)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    return cfg


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if "language_model" in name:
                if name.endswith("embed_tokens.weight"):
                    w = torch.randn(p.shape, generator=g) * 0.1
                elif name.endswith("norm.weight"):
                    w = torch.randn(p.shape, generator=g) * mr.STD_NORM
                else:
                    w = torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5
            elif "multi_modal_projector" in name:
                if name.endswith("mm_input_projection_weight"):
                    w = torch.randn(p.shape, generator=g) * p.shape[0] ** -0.5
                else:
                    w = torch.randn(p.shape, generator=g) * mr.STD_NORM
            else:  # vision tower
                if "position_embedding" in name:
                    w = torch.randn(p.shape, generator=g) * 0.5
                elif "layer_norm" in name or "post_layernorm" in name:
                    w = torch.randn(p.shape, generator=g) * 0.1
                    if name.endswith(".weight"):
                        w = w + 1.0
                elif name.endswith(".bias"):
                    w = torch.randn(p.shape, generator=g) * 0.1
                else:
                    fan_in = int(np.prod(p.shape[1:]))
                    w = torch.randn(p.shape, generator=g) * fan_in ** -0.5
            p.copy_(w.to(torch.float32))


LAYOUTS = {
    # directory suffix: (save_pretrained prefix, replacement) pairs, first match wins
    "": (("vision_tower.", "vision_tower.vision_model."),),
    "_newkeys": (("language_model.model.", "model.language_model."),
                 ("vision_tower.", "model.vision_tower.vision_model."),
                 ("multi_modal_projector.", "model.multi_modal_projector."),
                 ("language_model.lm_head.", "lm_head.")),
    "_t5": (),
}


def renamed(k, rules):
    for old, new in rules:
        if k.startswith(old):
            return new + k[len(old):]
    return k


def random_lora(pm, seed):
    """Random A ~ U(-0.5, 0.5) and B ~ N(0, 0.1^2) (a nonzero B, so every gradient is nonzero) on the
    LoRA tensors of PEFT model pm, drawn in state-dict order; returns {PEFT key: live parameter}."""
    named = dict(pm.named_parameters())
    g = torch.Generator().manual_seed(seed)
    out = {}
    with torch.no_grad():
        for k in peft.get_peft_model_state_dict(pm):
            if ".lora_" not in k:
                continue
            live = named[k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")]
            if ".lora_A." in k:
                live.copy_(torch.rand(live.shape, generator=g) - 0.5)
            else:
                live.copy_(torch.randn(live.shape, generator=g) * 0.1)
            out[k] = live
    return out


def image_block(n):
    return [BOI] + [IMG] * n + [EOI]


def main():
    mr.setup_torch()
    mr.quiet_transformers()
    cfg = make_config()
    model = Gemma3ForConditionalGeneration(cfg).eval()
    randomize(model, SEED_WEIGHTS)

    tmp_dir = os.path.join(HERE, "tiny_gemma3_vision_save.tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(tmp_dir, safe_serialization=True)
    tensors = safetensors.torch.load_file(os.path.join(tmp_dir, "model.safetensors"))
    assert any(k.startswith("language_model.model.") for k in tensors), sorted(tensors)[:5]
    assert any(k.startswith("vision_tower.embeddings.") for k in tensors), sorted(tensors)[:5]
    dirs = []
    for suffix, rules in LAYOUTS.items():
        d = os.path.join(HERE, "tiny_gemma3_vision" + suffix)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        safetensors.torch.save_file({renamed(k, rules): v for k, v in sorted(tensors.items())},
                                    os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(os.path.join(tmp_dir, "config.json"), os.path.join(d, "config.json"))
        other = Gemma3ForConditionalGeneration.from_pretrained(d, attn_implementation="eager").eval()
        for (n1, p1), (n2, p2) in zip(model.state_dict().items(), other.state_dict().items()):
            assert n1 == n2 and torch.equal(p1, p2), (d, n1)
        dirs.append(d)
    shutil.rmtree(tmp_dir)

    g = torch.Generator().manual_seed(SEED_INPUTS)
    S = VISION["image_size"]
    P = (S // VISION["patch_size"]) ** 2
    with torch.no_grad():
        # tower + projector on two images
        pix = torch.rand((2, 3, S, S), generator=g) * 2 - 1
        vt = model.model.vision_tower(pixel_values=pix).last_hidden_state
        feats = model.model.get_image_features(pix, return_dict=True).pooler_output
        assert vt.shape == (2, P, VISION["hidden_size"]) and feats.shape == (2, MM_TOKENS, 64)

        # three sequences of T = 20: one image, two images (the second right after text), text only
        def text(n):
            return torch.randint(3, BOI, (n,), generator=g).tolist()

        s1 = [2] + text(3) + image_block(MM_TOKENS) + text(10)
        s2 = [2] + text(1) + image_block(MM_TOKENS) + text(2) + image_block(MM_TOKENS) + text(4)
        s3 = [2] + text(19)
        assert len(s1) == len(s2) == len(s3) == 20, (len(s1), len(s2), len(s3))
        ids = torch.tensor([s1, s2, s3])
        tt = (ids == IMG).long()
        mm_pix = torch.rand((3, 3, S, S), generator=g) * 2 - 1
        logits = model(input_ids=ids, pixel_values=mm_pix, token_type_ids=tt).logits
        causal = model(input_ids=ids, pixel_values=mm_pix).logits
        diff_causal = float((logits - causal).abs().max())
        # the text-only row through the multimodal model = the same row alone
        alone = model(input_ids=ids[2:3]).logits
        assert float((alone - logits[2:3]).abs().max()) < 1e-5
        pmax = float(torch.softmax(logits, -1).max())
    mr.log(f"causal-only logit diff {diff_causal:.4f}, max probability {pmax:.4f}")
    assert diff_causal > 1e-2 and pmax < 0.99

    # PEFT LoRA on the language model's linears, with the images
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                           target_modules=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)")
    pm = peft.get_peft_model(model, lcfg)
    pm.train()
    lora_params = random_lora(pm, SEED_LORA)
    trainable = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert len(trainable) == len(lora_params) and all("language_model" in n for n in trainable), trainable[:3]
    labels = torch.full_like(ids, -100)
    labels[:, -6:] = ids[:, -6:]
    labels[ids == IMG] = -100  # image tokens are given, never predicted (as Hugging Face recipes mask them)
    out = pm(input_ids=ids, pixel_values=mm_pix, token_type_ids=tt, labels=labels)
    out.loss.backward()
    lora_loss = float(out.loss)
    mr.log(f"lora loss {lora_loss:.6f}, {len(lora_params)} LoRA tensors")

    def short(k):  # base_model.model.<...>.language_model.layers.3.self_attn.q_proj.lora_A.weight -> layers.3.self_attn.q_proj
        i = k.index("layers.")
        tail = k[i:].replace(".lora_A.weight", "").replace(".lora_B.weight", "")
        return ("vision." if "vision_tower" in k else "") + tail

    # PEFT LoRA on the tower's linears too (and fewer language-model modules), the projector
    # trained fully (modules_to_save), on a fresh copy of the same weights
    vt_model = Gemma3ForConditionalGeneration.from_pretrained(dirs[0], attn_implementation="eager").eval()
    vcfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, modules_to_save=["multi_modal_projector"],
                           target_modules=r"(.*language_model.*\.(q_proj|v_proj|down_proj))|"
                                          r"(.*vision_tower.*\.(q_proj|k_proj|v_proj|out_proj|fc1|fc2))")
    vm = peft.get_peft_model(vt_model, vcfg)
    vm.train()
    vt_keys = list(peft.get_peft_model_state_dict(vm).keys())
    vt_lora = random_lora(vm, SEED_LORA + 1)
    proj = {n.split(".modules_to_save.default.")[1]: p for n, p in vm.named_parameters()
            if p.requires_grad and ".modules_to_save.default." in n}
    assert sorted(proj) == ["mm_input_projection_weight", "mm_soft_emb_norm.weight"], sorted(proj)
    assert any("vision_tower" in k for k in vt_lora) and any("language_model" in k for k in vt_lora)
    vout = vm(input_ids=ids, pixel_values=mm_pix, token_type_ids=tt, labels=labels)
    vout.loss.backward()
    vt_loss = float(vout.loss)
    mr.log(f"tower + projector loss {vt_loss:.6f}, {len(vt_lora)} LoRA tensors, saved keys e.g. {vt_keys[0]}")

    path = os.path.join(HERE, "tiny_vision_ref.h5")

    def writer(f):
        mr.h5_attrs(f, {"generator": "tests/ref/make_vision_ref.py", "torch_num_threads": 1,
                        **{f"version_{k}": str(v) for k, v in mr.versions().items()}})
        v = mr.h5_group(f, "vision")
        mr.h5_dset(v, "pixel_values", pix.numpy(), np.float32)
        mr.h5_dset(v, "last_hidden_state", vt.numpy(), np.float32)
        mr.h5_dset(v, "image_features", feats.numpy(), np.float32)
        m = mr.h5_group(f, "mm")
        mr.h5_dset(m, "input_ids", ids.numpy(), np.int32)
        mr.h5_dset(m, "token_type_ids", tt.numpy(), np.int32)
        mr.h5_dset(m, "pixel_values", mm_pix.numpy(), np.float32)
        mr.h5_dset(m, "logits", logits.numpy(), np.float32)
        mr.h5_attrs(m, {"max_abs_logit_diff_causal_only": diff_causal, "max_probability": pmax})
        lg = mr.h5_group(f, "lora")
        mr.h5_dset(lg, "labels", labels.numpy(), np.int32)
        mr.h5_dset(lg, "loss", np.array([lora_loss]), np.float64)
        mr.h5_attrs(lg, {"r": 4, "lora_alpha": 8, "seed": SEED_LORA})
        for k, p in lora_params.items():
            which = "A" if ".lora_A." in k else "B"
            mr.h5_dset(lg, f"{short(k)}.{which}", p.detach().numpy(), np.float32)
            mr.h5_dset(lg, f"{short(k)}.{which}_grad", p.grad.numpy(), np.float32)

        vg = mr.h5_group(f, "lora_vt")
        mr.h5_dset(vg, "loss", np.array([vt_loss]), np.float64)
        mr.h5_attrs(vg, {"r": 4, "lora_alpha": 8, "seed": SEED_LORA + 1, "target_modules": vcfg.target_modules,
                         "modules_to_save": "multi_modal_projector", "peft_keys": "\n".join(vt_keys)})
        for k, p in vt_lora.items():
            which = "A" if ".lora_A." in k else "B"
            mr.h5_dset(vg, f"{short(k)}.{which}", p.detach().numpy(), np.float32)
            mr.h5_dset(vg, f"{short(k)}.{which}_grad", p.grad.numpy(), np.float32)
        for n, p in proj.items():
            mr.h5_dset(vg, f"projector.{n}_grad", p.grad.numpy(), np.float32)

    mr.write_h5_atomically(path, writer)
    for p in [path] + [os.path.join(d, f) for d in dirs for f in ("config.json", "model.safetensors")]:
        mr.log(f"{mr.sha256_file(p)}  {os.path.relpath(p, HERE)}")


if __name__ == "__main__":
    main()
