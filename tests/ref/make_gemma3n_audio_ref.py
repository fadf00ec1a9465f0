#!/usr/bin/env python3
"""Tiny random Gemma 3n with a real audio encoder, for gemmarun's audio encoder (run by hand, never in CI).

Writes tests/ref/tiny_gemma3n_audio/{config.json, model.safetensors}: a Gemma3nForConditionalGeneration
(transformers 5.24) whose text decoder is tests/ref/tiny_gemma3n's (read from it: run
make_gemma3n_ref.py first), with a tiny Gemma3nAudioEncoder (2 conformer blocks of width 32, 4 heads,
chunks of 6 frames with 6 frames of left and 2 of right context, light convolution kernel 5, the
sub-sampling convolutions (8, 4) channels, 4x reduction), the audio embedder, and the vision embedder
(hard tokens only: the MobileNet-V5 tower is not built - timm is not installed and gemmarun has no
such encoder). The multimodal vocabularies sit at the top of the tiny text vocabulary of 512 as they
do in the real one (262,400), above every id the tiny tokenizer's BPE makes (0..429): vision ids
432..469 (<end_of_image> 432, <image_soft_token> 433), audio ids 470..511 (<end_of_audio> 470,
<audio_soft_token> 471, 511 the padding of soft tokens: text vocab - 1, as in the real model);
<start_of_image> 430 and <start_of_audio> 431 are text ids, as 255,999 and 256,000 are; all of them
past the 400-row per-layer table (row 0), as in the real model. 188 audio soft tokens per clip, as in the real config.
tokenizer.json is tests/ref/tiny_tokenizer.json with those six special tokens added.

And tests/ref/tiny_gemma3n_audio_ref.h5, from real speech: the log-mel features of Debian's
hello-world.wav and vm-goodbye.wav as one batch (tests/ref/audio_ref.h5 /batch, made by
make_audio_ref.py from the real recordings):

  /features (2, 138, 128) f32, /features_mask (2, 138) u8     the encoder's input (1 = valid frame)
  /sscp     (2, 35, 32) f32     the sub-sampling convolutions' projection (the conformer's input)
  /block_<i> (2, 35, 32) f32    each conformer block's output
  /encoder  (2, 9, 32) f32      the encoder's last_hidden_state (reduced 4x, padding frames zeroed)
  /encoder_mask (2, 9) u8       1 = padding (transformers' audio_mel_mask)
  /soft     (2, 188, 64) f32     the soft tokens as Gemma3nModel puts them into the prompt: the
                                embedder's output, padding frames and the extra positions up to 188
                                replaced by the embedding of the last audio id (511)
  /ids      (2, T) int32        two prompts, each with one clip (boa, 12 x audio id, eoa) and text,
                                ids of both multimodal ranges among the text
  /logits   (2, T, 512) f32     Gemma3nForConditionalGeneration's logits of ids with the clips
  attrs     clamp_fraction (share of pre-clamp values the gradient_clipping of 4 cut in the
            encoder: the clamps are exercised), max_abs_diff_no_audio (how far the logits move
            with the soft tokens replaced by the padding embedding), max_prob
  /lora/{labels, loss, loss64, weights/*, grads/*, grads64/*}   PEFT LoRA (rank 4, alpha 8) on the
            audio conformer's linears (ffw_layer_1/2, q/k/v_proj, post, linear_start/end) and the
            decoder's q/k/v/o_proj at drawn A and B (0.2 N(0, 1)): the loss of /ids with the clips,
            every position after <end_of_audio> supervised (labels -100 elsewhere), and every
            adapter's gradient under PEFT's saved names; *64: the same in float64 (the exact values
            the f32 ones round); attr peft_f32_grad_rel_err_vs_f64

Every parameter of the encoder and embedders is drawn from torch.Generator seeded SEED (named_parameters
order): linears and convolutions N(0, 0.15^2), norm scales 1 + N(0, 0.1^2), per_dim_scale N(0, 0.3^2),
embeddings N(0, 0.5^2).

Needs the peers venv (tests/peers/setup.sh) plus h5py:
  PYTHONPATH=/tmp/h5 ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_gemma3n_audio_ref.py
"""
import hashlib
import json
import os

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import Gemma3nAudioConfig, Gemma3nConfig, Gemma3nForConditionalGeneration
from transformers.models.gemma3n import modeling_gemma3n

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "tiny_gemma3n")
OUT = os.path.join(HERE, "tiny_gemma3n_audio")
REF = os.path.join(HERE, "tiny_gemma3n_audio_ref.h5")
SEED = 11
SOFT = 188
CLAMP = 4.0


def config():
    with open(os.path.join(TEXT, "config.json")) as fh:
        text = json.load(fh)
    # room for a clip's 188 soft tokens and some text (default RoPE: the positions' own angles, the
    # logits of the first 128 positions unchanged)
    text["max_position_embeddings"] = 1024
    audio = Gemma3nAudioConfig(
        vocab_size=42, vocab_offset=470, input_feat_size=128, hidden_size=32, rms_norm_eps=1e-6,
        gradient_clipping=CLAMP, conf_attention_chunk_size=6, conf_attention_context_left=7,
        conf_attention_context_right=2, conf_attention_logit_cap=50.0, conf_num_attention_heads=4,
        conf_num_hidden_layers=2, conf_conv_kernel_size=5, conf_reduction_factor=4, conf_residual_weight=0.5,
        sscp_conv_channel_size=(8, 4), sscp_conv_group_norm_eps=1e-3,
        sscp_conv_kernel_size=((3, 3), (3, 3)), sscp_conv_stride_size=((2, 2), (2, 2)))
    vision = {"vocab_size": 38, "vocab_offset": 432, "hidden_size": 32, "rms_norm_eps": 1e-6}
    return Gemma3nConfig(text_config=text, audio_config=audio.to_dict(), vision_config=vision,
                         audio_soft_tokens_per_image=SOFT, vision_soft_tokens_per_image=4,
                         boi_token_id=430, eoi_token_id=432, image_token_id=433,
                         boa_token_id=431, eoa_token_id=470, audio_token_id=471)


SPECIALS = [(430, "<start_of_image>"), (431, "<start_of_audio>"), (432, "<end_of_image>"), (433, "<image_soft_token>"),
            (470, "<end_of_audio>"), (471, "<audio_soft_token>")]


def write_tokenizer(path):
    with open(os.path.join(HERE, "tiny_tokenizer.json")) as fh:
        tok = json.load(fh)
    base = tok["added_tokens"][0]
    for i, content in SPECIALS:
        tok["added_tokens"].append(dict(base, id=i, content=content))
    with open(path, "w") as fh:
        json.dump(tok, fh, ensure_ascii=False)


class NoVisionTower(torch.nn.Module):
    """Stands in for the MobileNet-V5 tower (timm): never called, holds no weights."""


def build():
    real = modeling_gemma3n.AutoModel.from_config

    def from_config(cfg, **kw):
        if getattr(cfg, "model_type", "") == "gemma3n_vision":
            return NoVisionTower()
        return real(cfg, **kw)

    modeling_gemma3n.AutoModel.from_config = from_config
    try:
        model = Gemma3nForConditionalGeneration(config()).eval()
    finally:
        modeling_gemma3n.AutoModel.from_config = real
    text = load_file(os.path.join(TEXT, "model.safetensors"))
    sd = {k.replace("model.", "model.language_model.", 1): v for k, v in text.items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all(k.startswith(("model.audio_tower.", "model.embed_audio.", "model.embed_vision.", "lm_head."))
               for k in missing), missing
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(("model.audio_tower.", "model.embed_audio.", "model.embed_vision.")):
                continue
            if name.endswith("per_dim_scale"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embedding.weight" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model


def prompts():
    """Two prompts of one clip each (<start_of_audio>, 188 soft tokens, <end_of_audio>), ids of both
    multimodal ranges also among the text, as <end_of_image> would be."""
    a = [2, 17, 99, 431] + [471] * SOFT + [470, 45, 445, 432, 120, 8]
    b = [2, 431] + [471] * SOFT + [470, 511, 77, 3, 440, 490, 64, 5]
    return torch.tensor([a, b])


AUDIO_TARGETS = ["ffw_layer_1", "ffw_layer_2", "q_proj", "k_proj", "v_proj", "post", "linear_start", "linear_end",
                 "o_proj"]


def lora_grads(model, ids, feats, valid, dtype):
    """PEFT LoRA at drawn A and B on a copy of the model in `dtype`: the loss of ids with the clips
    and every adapter's gradient, under PEFT's saved names."""
    import copy

    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(copy.deepcopy(model).to(dtype), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                  target_modules=AUDIO_TARGETS))
    pm.eval()
    g = torch.Generator().manual_seed(SEED + 2)
    weights = {}
    with torch.no_grad():
        for name, p in sorted(pm.named_parameters()):
            if "lora_" in name:
                p.copy_((0.2 * torch.randn(p.shape, generator=g)).to(dtype))
                weights[name.replace(".default", "")] = p.detach().clone()
    labels = torch.full_like(ids, -100)
    for b in range(ids.shape[0]):
        eoa = int((ids[b] == 470).nonzero()[0])
        labels[b, eoa + 1:] = ids[b, eoa + 1:]
    # transformers' audio attention takes its softmax in float32 even on a float64 model, where the
    # float64 finfo.min of a query that sees no key (the padded clip's last frames) becomes -inf:
    # NaN. In float64 the softmax stays float64 here (the float32 run's semantics: a uniform row).
    real_softmax = torch.nn.functional.softmax

    def softmax(x, dim=None, dtype=None, **kw):
        return real_softmax(x, dim=dim, **kw) if x.dtype == torch.float64 else real_softmax(x, dim=dim, dtype=dtype, **kw)

    torch.nn.functional.softmax = softmax
    try:
        out = pm(input_ids=ids, input_features=feats.to(dtype), input_features_mask=valid, labels=labels, use_cache=False)
        out.loss.backward()
    finally:
        torch.nn.functional.softmax = real_softmax
    grads = {name.replace(".default", ""): p.grad.detach().clone() for name, p in pm.named_parameters()
             if "lora_" in name and p.grad is not None}
    return float(out.loss), labels, weights, grads


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build()
    with h5py.File(os.path.join(HERE, "audio_ref.h5"), "r") as f:
        feats = torch.from_numpy(f["batch/features"][:])
        valid = torch.from_numpy(f["batch/mask"][:].astype(bool))
    tower = model.model.audio_tower
    stages, clamped = {}, [0, 0]

    def keep(name):
        return lambda mod, inp, out: stages.__setitem__(name, out.detach().clone())

    hooks = [tower.subsample_conv_projection.register_forward_hook(keep("sscp"))]
    for i, blk in enumerate(tower.conformer):
        hooks.append(blk.register_forward_hook(keep(f"block_{i}")))
    real_clamp = torch.clamp

    def counting_clamp(x, *a, **kw):
        clamped[0] += int(((x > CLAMP) | (x < -CLAMP)).sum())
        clamped[1] += x.numel()
        return real_clamp(x, *a, **kw)

    with torch.no_grad():
        torch.clamp = counting_clamp
        try:
            enc = tower(feats, ~valid, return_dict=True)
        finally:
            torch.clamp = real_clamp
        for h in hooks:
            h.remove()
        soft = model.model.embed_audio(inputs_embeds=enc.last_hidden_state)
        pad = model.model.embed_audio(input_ids=torch.tensor([[511]]))  # text vocab - 1
        soft = torch.where(enc.audio_mel_mask.unsqueeze(-1), pad, soft)
        soft = torch.cat([soft, pad.expand(soft.shape[0], SOFT - soft.shape[1], soft.shape[2])], dim=1)
        ids = prompts()
        logits = model(input_ids=ids, input_features=feats, input_features_mask=valid, use_cache=False).logits.float()
        silent = model(input_ids=ids, input_features=torch.full_like(feats, -11.5), input_features_mask=valid,
                       use_cache=False).logits.float()
    diff_audio = float((logits - silent).abs().max())
    max_prob = float(torch.softmax(logits, -1).max())
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "config.json"), "w") as fh:
        fh.write(model.config.to_json_string())
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if not k.startswith("lm_head.")}
    save_file(tensors, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    tok = os.path.join(OUT, "tokenizer.json")
    if os.path.lexists(tok):
        os.remove(tok)
    write_tokenizer(tok)
    with h5py.File(REF, "w", track_order=True) as f:
        f.create_dataset("features", data=feats.numpy().astype(np.float32))
        f.create_dataset("features_mask", data=valid.numpy().astype(np.uint8))
        for k in ["sscp"] + [f"block_{i}" for i in range(len(tower.conformer))]:
            f.create_dataset(k, data=stages[k].numpy().astype(np.float32))
        f.create_dataset("encoder", data=enc.last_hidden_state.numpy().astype(np.float32))
        f.create_dataset("encoder_mask", data=enc.audio_mel_mask.numpy().astype(np.uint8))
        f.create_dataset("soft", data=soft.numpy().astype(np.float32))
        f.create_dataset("ids", data=ids.numpy().astype(np.int32))
        f.create_dataset("logits", data=logits.numpy().astype(np.float32))
        loss, labels, weights, grads = lora_grads(model, ids, feats, valid, torch.float32)
        loss64, _, _, grads64 = lora_grads(model, ids, feats, valid, torch.float64)
        f.create_dataset("lora/labels", data=labels.numpy().astype(np.int32))
        f.create_dataset("lora/loss", data=np.array([loss], dtype=np.float32))
        f.create_dataset("lora/loss64", data=np.array([loss64], dtype=np.float64))
        worst = 0.0
        for k in sorted(weights):
            f.create_dataset("lora/weights/" + k, data=weights[k].numpy().astype(np.float32))
        for k in sorted(grads):
            f.create_dataset("lora/grads/" + k, data=grads[k].numpy().astype(np.float32))
            g64 = grads64[k].numpy().astype(np.float64)
            f.create_dataset("lora/grads64/" + k, data=g64)
            worst = max(worst, float(np.abs(grads[k].numpy().astype(np.float64) - g64).max() / np.abs(g64).max()))
        assert all(np.isfinite(grads64[k].numpy()).all() for k in grads64), "float64 gradients not finite"
        f.attrs["peft_f32_grad_rel_err_vs_f64"] = worst
        n_audio = sum(1 for k in grads if ".audio_tower." in k)
        print(f"LoRA: loss {loss:.6f} (f64 {loss64:.9f}), {len(grads)} adapter gradients ({n_audio} in the audio "
              f"tower); PEFT's f32 gradients lie {worst:.3g} (relative) from float64")
        f.attrs["clamp_fraction"] = clamped[0] / max(clamped[1], 1)
        f.attrs["max_abs_diff_no_audio"] = diff_audio
        f.attrs["max_prob"] = max_prob
    print(f"encoder {tuple(enc.last_hidden_state.shape)}, padding frames {enc.audio_mel_mask.sum(1).tolist()}; "
          f"clamped {clamped[0]} of {clamped[1]} values; the clips move the logits by {diff_audio:.3g}; "
          f"max probability {max_prob:.3f}")
    for p in [os.path.join(OUT, "config.json"), os.path.join(OUT, "model.safetensors"), tok, REF]:
        with open(p, "rb") as fh:
            print(f"{hashlib.sha256(fh.read()).hexdigest()}  {os.path.relpath(p, HERE)}")


if __name__ == "__main__":
    main()
