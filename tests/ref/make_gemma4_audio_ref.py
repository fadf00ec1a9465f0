#!/usr/bin/env python3
"""Tiny random multimodal Gemma 4 (audio) reference for gemmarun (run by hand, never in CI).

Writes a Gemma4ForConditionalGeneration (transformers 5.24) with an audio tower (no vision tower) at
toy sizes, and what transformers computes with it on real speech:

  tests/ref/tiny_gemma4_audio/{config.json, generation_config.json, model.safetensors,
                               tokenizer.json, tokenizer_config.json}
        save_pretrained's files (float32 safetensors; the tower's clip buffers input_min / input_max /
        output_min / output_max are in model.safetensors, checked) and a tokenizer in Gemma 4's
        format: tiny_gemma4_vision_chat's (tests/ref/tiny_vision_tokenizer.json with Gemma 4's turn and
        image markers, ids 4, 5, 509-511) plus the three audio markers as special tokens: <|audio>
        (boa) 506, <audio|> (eoa) 507, <|audio|> (audio soft token) 508, above every id the BPE
        makes (0..425, checked); every added token is in model.vocab as well (as in Google's
        tokenizer.json), so that transformers gives each its id (checked: the tokenizers library
        numbers an added token missing from the vocabulary by its position, so to transformers
        tiny_gemma4_vision_chat's <|image|> is 432, not 511). tokenizer_config.json: add_bos_token,
        the bos / eos / pad / unk names, the markers as extra_special_tokens (so transformers'
        tokenizer has audio_token, boa_token, ...) and a chat_template (gemmarun's Gemma 4 template,
        gm_chat_gemma4_jinja, with an "audio" item rendered as <|audio|>; checked through
        apply_chat_template). The model reloads to the identical state and logits (checked).
  tests/ref/tiny_gemma4_audio_ref.h5
        /audio    features (2, 140, 128) f32 and mask (2, 140) uint8 (1 = valid): the input, copied from
                  tests/ref/gemma4_audio_fe_ref.h5 /batch (Gemma4AudioFeatureExtractor on hello-world.wav,
                  140 valid frames, and vm-goodbye.wav, 86 valid frames in the batch), fed as
                  input_features / input_features_mask (bool, True = valid); sscp (2, 35, 32): the
                  subsample_conv_projection's output (the conformer's input); layer_0, layer_1 (2, 35, 32):
                  each Gemma4AudioLayer's output; tower (2, 35, 24): the audio tower's last_hidden_state
                  (after output_proj; padding frames included, as transformers computes them);
                  count_samples (26,) int32 and count_tokens (26,) int32: clip lengths around every
                  boundary and the soft tokens Gemma4Processor gives each (_compute_audio_num_tokens,
                  asserted equal to replace_audio_token's count from the extractor's mask, capped at 750);
                  out_mask (2, 35) uint8: the tower's output attention_mask (1 = valid); n_tokens (2,)
                  int32: valid soft tokens per clip (35, 22), asserted equal to what
                  Gemma4Processor.replace_audio_token inserts for the clip's mask (and the tokenizer
                  turns that text into [506, 508 x n, 507]); soft (57, 64): get_audio_features'
                  pooler_output at the valid frames, clip 0's then clip 1's (what Gemma4Model scatters
                  into the prompt); clip_fractions (20, 2) f64: per clippable linear (attribute modules,
                  one name a line, forward order) the fraction of its input values and of its output
                  values the clamps move; attributes clamp_fraction (the share of the values met by the
                  gradient_clipping clamps at +-4 that they cut, all frames), min_clamp_margin (the
                  smallest distance of any such value to +-4, plain and LoRA forwards), min_clip_margin and
                  clip_sides_past_all_values (see below), max_abs_diff_no_clip (the tower's output
                  with every clip buffer -inf / +inf)
        /mm       input_ids (2, 48) int32: [BOS, 3 text, boa, 35 x audio, eoa, 7 text] with clip 0,
                  [BOS, 8 text, boa, 22 x audio, eoa, 15 text] with clip 1; logits (2, 48, 512) f32:
                  Gemma4ForConditionalGeneration(input_ids, input_features, input_features_mask), one
                  call, no cache; attributes max_abs_diff_no_audio (the same ids without the features:
                  the audio tokens embedded as pad), max_prob (no saturation)
        /lora_at  PEFT LoRA (r 4, alpha 8, dropout 0) on the language model's q/k/v/o/gate/up/down (the
                  KV-shared layers have no k/v) and on the audio tower's inner nn.Linear of every
                  clippable linear (".linear": feed_forward1/2.ffw_layer_1/2, self_attn.q/k/v_proj and
                  post, lconv1d.linear_start/linear_end; the clamps stay around the adapted linear),
                  nothing on relative_k_proj, output_proj, subsample_conv_projection or embed_audio;
                  A ~ U(-0.5, 0.5), B ~ N(0, 0.1^2) drawn in state-dict order from
                  torch.Generator(SEED_LORA); labels (2, 48) int32: the last 6 tokens of each sequence,
                  the rest -100 (transformers shifts); loss (1,) f64; for every adapted module
                  "layers.<l>.<module>" / "audio.layers.<l>.<module>.linear": .A, .B, .A_grad, .B_grad
                  (f32) and .A_grad64, .B_grad64 (f64: the same computed on a .double() copy, same A and
                  B); loss64 (1,) f64; attributes r, lora_alpha, seed, target_modules, peft_keys
                  (get_peft_model_state_dict's keys, one a line), peft_f32_grad_rel_err_vs_f64 (worst
                  max|g32 - g64| / max|g64| over the tensors). Note: transformers' Gemma 4 computes
                  RMSNorms and the RoPE tables in float32 even in a float64 model, so the *64 values
                  carry ~1e-7 relative rounding from those; its audio attention casts q, k and v to
                  float32 and cannot run in float64 at all (float64 queries times float32 keys), so
                  the float64 run uses the same forward in its input's dtype (audio_attention_in_dtype:
                  transformers' source without the casts; checked to give the same float32 logits).

Config: text = make_gemma4_ref.config("e") (6 layers, 4 sliding with window 4 + 2 full, per-layer
embeddings, the last 2 layers KV-shared, double-wide MLPs, soft-cap 30; use_bidirectional_attention
left None: audio tokens are causal); audio = Gemma4AudioConfig(hidden 32, 2 layers, 4 heads, silu,
subsampling_conv_channels [128, 4] (128 = the mel bins: input_proj_linear's in-dim is (C0 // 4) * C1 =
32 x 4), conv kernel 5, residual_weight 0.5, attention chunk 4, context left 7, right 0, logit cap 10,
clipped linears, gradient_clipping 4, eps 1e-6, output_proj_dims 24); no vision tower; audio token 508,
boa 506, eoa 507 (image 511, boi 509, eoi 510 as the tokenizer has them). The attention's context is
deliberately unlike the real configs' (chunk 12, left 13: chunk = left - 1): each frame sees itself and
the 5 frames before it (the mask: distance < left - 1 = 6) out of a block context of chunk + left - 1
+ right = 10 keys reaching 6 back, and the relative-position table has 10 // 2 + 1 = 6 rows, the
sin / cos of 5, 4, ..., 0; after transformers' _rel_shift the key d frames back (d = 1..6) gets the
row of d - 1 and the query's own frame no relative term at all (with chunk = left - 1 the key d back
gets the row of d, itself included), and that is what the fixture holds.

Weights, from torch.Generator(SEED_WEIGHTS) in named_parameters order then the buffers: language
model as make_gemma4_ref (linears N(0, 0.08^2), norms 1 + N(0, 0.1^2), embeddings N(0, 0.25^2),
layer_scalar U(0.5, 1.5)); audio tower: linears and convolutions N(0, 0.15^2), norm scales (RMSNorms
and the sub-sampling LayerNorms) 1 + N(0, 0.1^2), per_dim_scale N(0, 0.3^2), output_proj bias
N(0, 0.1^2); embed_audio.embedding_projection N(0, 1/24). Clip bounds (set_clip_bounds), clamp after
clamp in forward order, on the model and its LoRA copy together: each side starts at quantile u
(input: of the clamp's input; output: of its linear's output after the input clamp) of the values met
in the plain forward of the two clips (padding frames included), u ~ U(0.01, 0.06) from
torch.Generator(SEED_CLIP), and moves to the middle of the widest gap, among the 41 nearest ranks, of
the values met in the plain and the LoRA forwards, so no value lies near a bound (attribute
/audio/min_clip_margin, asserted > 1e-5: no clamp flips between float32 and float64 or between
implementations); where that gap is under 2e-4, the widest among 81, 161, ..., 1281 nearest; where
even that is under 2e-4 (silu's outputs pile up at its minimum, -0.2785: the low side of three
ffw_layer_2 inputs) the bound goes 1e-3 past every value, that side clipping nothing (attribute
/audio/clip_sides_past_all_values, one "<module> input min" a line). The fractions clipped in the
plain forward (asserted in [1%, 20%]) are /audio/clip_fractions.

Determinism: seeds fixed, 1 torch thread, deterministic algorithms, HDF5 without timestamps (arrays
over 4096 values gzip-compressed, level 9).

Needs torch, transformers 5.24, peft 0.21 and h5py, e.g. the peers venv (tests/peers/setup.sh):
  pip install --no-deps --target /tmp/h5 h5py
  PYTHONPATH=/tmp/h5 ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_gemma4_audio_ref.py
"""

import copy
import json
import os
import shutil
import sys
import types

os.environ.setdefault("TQDM_DISABLE", "1")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gemma4_ref as g4  # noqa: E402

import peft  # noqa: E402
import safetensors.torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration  # noqa: E402
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tiny_gemma4_audio")
REF = os.path.join(HERE, "tiny_gemma4_audio_ref.h5")
FE_REF = os.path.join(HERE, "gemma4_audio_fe_ref.h5")
SEED_WEIGHTS = 40501
SEED_CLIP = 40502
SEED_INPUTS = 40503
SEED_LORA = 40504

BOA, EOA, AUD = 506, 507, 508
BOI, EOI, IMG = 509, 510, 511
CLAMP = 4.0
T = 48

LORA_TARGETS = (r"model\.language_model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|"
                r"mlp\.(gate_proj|up_proj|down_proj))"
                r"|model\.audio_tower\.layers\.\d+\.(feed_forward[12]\.ffw_layer_[12]|"
                r"self_attn\.(q_proj|k_proj|v_proj|post)|lconv1d\.(linear_start|linear_end))\.linear")


# --- HDF5 without timestamps, sha256: make_ref.py's helpers ---------------------------------------

from make_ref import h5_attrs, h5_group, sha256_file, write_h5_atomically  # noqa: E402


def h5_dset(group, name, arr, dtype):
    arr = np.ascontiguousarray(np.asarray(arr), dtype=dtype)
    kw = dict(compression="gzip", compression_opts=9) if arr.size > 4096 else {}
    group.create_dataset(name, data=arr, track_times=False, **kw)


# --- model ------------------------------------------------------------------------------------------

def make_config():
    tc = g4.config("e")
    ac = Gemma4AudioConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, hidden_act="silu",
                           subsampling_conv_channels=[128, 4], conv_kernel_size=5, residual_weight=0.5,
                           attention_chunk_size=4, attention_context_left=7, attention_context_right=0,
                           attention_logit_cap=10.0, use_clipped_linears=True, gradient_clipping=CLAMP,
                           rms_norm_eps=1e-6, output_proj_dims=24)
    return Gemma4Config(text_config=tc, vision_config=None, audio_config=ac, audio_token_id=AUD,
                        boa_token_id=BOA, eoa_token_index=EOA, image_token_id=IMG, boi_token_id=BOI,
                        eoi_token_id=EOI)


def randomize(model):
    g = torch.Generator().manual_seed(SEED_WEIGHTS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".audio_tower." in name:
                if name.endswith("per_dim_scale"):
                    w = 0.3 * torch.randn(p.shape, generator=g)
                elif "norm" in name:
                    w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
                elif name.endswith("output_proj.bias"):
                    w = 0.1 * torch.randn(p.shape, generator=g)
                else:
                    assert name.endswith("weight") and p.dim() in (2, 3, 4), name
                    w = 0.15 * torch.randn(p.shape, generator=g)
            elif ".embed_audio." in name:
                assert name.endswith("embedding_projection.weight"), name
                w = torch.randn(p.shape, generator=g) * 24 ** -0.5
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


def make_model():
    m = Gemma4ForConditionalGeneration(make_config()).eval()
    randomize(m)
    return m


def tower_of(model):
    return model.get_base_model().model.audio_tower if hasattr(model, "get_base_model") else model.model.audio_tower


def gradient_clamps(model, feats, mask):
    """The values the tower's gradient_clipping clamps (torch.clamp with float bounds +-CLAMP; the clip
    buffers' clamps have tensor bounds) meet: (values cut, values met, smallest distance to +-CLAMP)."""
    real_clamp = torch.clamp
    st = [0, 0, float("inf")]

    def counting_clamp(x, *a, **kw):
        lo = a[0] if a else kw.get("min")
        if isinstance(lo, float):
            assert lo == -CLAMP and (a[1] if len(a) > 1 else kw.get("max")) == CLAMP, (a, kw)
            y = x.detach()
            st[0] += int((y.abs() > CLAMP).sum())
            st[1] += y.numel()
            st[2] = min(st[2], float((y.double().abs() - CLAMP).abs().min()))
        return real_clamp(x, *a, **kw)

    torch.clamp = counting_clamp
    try:
        with torch.no_grad():
            tower_of(model)(feats, mask)
    finally:
        torch.clamp = real_clamp
    # 8 clamps a layer: 2 in each feed-forward, 3 in the layer itself, 1 in the light convolution
    assert st[1] == feats.shape[0] * 35 * 32 * 8 * 2, st
    return st


# --- tokenizer -------------------------------------------------------------------------------------

AUDIO_MARKERS = ((BOA, "<|audio>"), (EOA, "<audio|>"), (AUD, "<|audio|>"))

# gemmarun's Gemma 4 chat template (core/text/gm_chat.c gm_chat_gemma4_jinja) with an "audio" item
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- for message in messages -%}\n"
    "    {%- if message['role'] == 'assistant' -%}\n"
    "        {%- set role = 'model' -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<|turn>' + role + '\n' }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- else -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<|image|>' }}\n"
    "            {%- elif item['type'] == 'audio' -%}\n"
    "                {{ '<|audio|>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<turn|>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{ '<|turn>model\n' }}\n"
    "{%- endif -%}\n")


def write_tokenizer(out):
    """tokenizer.json: tiny_gemma4_vision_chat's (make_gemma4_vision_ref.write_chat: the tiny multimodal
    tokenizer with Gemma 4's turn and image markers) plus the audio markers as special added tokens;
    tokenizer_config.json with the markers' names and the chat template."""
    with open(os.path.join(HERE, "tiny_vision_tokenizer.json")) as f:
        tok = json.load(f)
    rename = {"<start_of_turn>": "<|turn>", "<end_of_turn>": "<turn|>", "<start_of_image>": "<|image>",
              "<end_of_image>": "<image|>", "<image_soft_token>": "<|image|>"}
    for a in tok["added_tokens"]:
        a["content"] = rename.get(a["content"], a["content"])
    tok["model"]["vocab"] = {rename.get(k, k): v for k, v in tok["model"]["vocab"].items()}
    used = set(tok["model"]["vocab"].values()) | {a["id"] for a in tok["added_tokens"]}
    assert max(tok["model"]["vocab"].values()) < BOA and not used & {i for i, _ in AUDIO_MARKERS}, sorted(used)[-8:]
    base = next(a for a in tok["added_tokens"] if a["content"] == "<|image|>")
    tok["added_tokens"] += [dict(base, id=i, content=c) for i, c in AUDIO_MARKERS]
    tok["added_tokens"].sort(key=lambda a: a["id"])
    # every added token in model.vocab as well, as in Google's tokenizer.json: the tokenizers library
    # numbers an added token that is not in the vocabulary len(vocab), len(vocab) + 1, ... whatever
    # its "id" (tiny_gemma4_vision_chat's <|image|> 511 is 432 to transformers)
    for a in tok["added_tokens"]:
        assert tok["model"]["vocab"].setdefault(a["content"], a["id"]) == a["id"], a
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
           "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE,
           "clean_up_tokenization_spaces": False, "padding_side": "left", "spaces_between_special_tokens": False,
           "extra_special_tokens": {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
                                    "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>"},
           "tokenizer_class": "GemmaTokenizer"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")


def check_tokenizer(out, masks, n_tokens):
    """The tokenizer transformers loads from `out`: the markers' ids, the processor's expansion of each
    clip's audio token (Gemma4Processor.replace_audio_token on the clip's mask: n_tokens[i] soft
    tokens), and the chat template."""
    tk = transformers.AutoTokenizer.from_pretrained(out)
    with open(os.path.join(out, "tokenizer.json")) as f:
        added = json.load(f)["added_tokens"]
    assert tk.convert_tokens_to_ids([a["content"] for a in added]) == [a["id"] for a in added]
    assert (tk.audio_token, tk.boa_token, tk.eoa_token) == ("<|audio|>", "<|audio>", "<audio|>")
    assert tk.convert_tokens_to_ids(["<|audio>", "<audio|>", "<|audio|>"]) == [BOA, EOA, AUD]
    proc = types.SimpleNamespace(audio_token=tk.audio_token, boa_token=tk.boa_token, eoa_token=tk.eoa_token)
    for i, n in enumerate(n_tokens):
        text = Gemma4Processor.replace_audio_token(proc, {"input_features_mask": masks}, i)
        ids = tk(text, add_special_tokens=False)["input_ids"]
        assert ids == [BOA] + [AUD] * n + [EOA], (i, n, ids[:4], len(ids))
    msgs = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": " hello world "}]},
            {"role": "assistant", "content": "hi"}]
    text = tk.apply_chat_template(msgs, tokenize=False)
    assert text == "<bos><|turn>user\n<|audio|>hello world<turn|>\n<|turn>model\nhi<turn|>\n", repr(text)
    ids = tk(text, add_special_tokens=False)["input_ids"]
    assert ids[:2] == [2, 4] and ids.count(AUD) == 1 and ids.count(5) == 2, ids
    # the BPE alone never makes an audio / image marker id
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        s = "".join(chr(int(c)) for c in torch.randint(32, 127, (40,), generator=g))
        got = tk(s, add_special_tokens=False)["input_ids"]
        assert max(got) < 430, (s, got)


# --- reference computations ---------------------------------------------------------------------------

def mm_logits(model, ids, feats, mask):
    with torch.no_grad():
        return model(input_ids=ids, input_features=feats, input_features_mask=mask, use_cache=False).logits.float()


from make_vision_ref import random_lora  # noqa: E402  (A ~ U(-0.5, 0.5), B ~ N(0, 0.1^2) in state-dict order)
import gemma4_clip_ref as clip_ref  # noqa: E402  (the clipped linears: shared with make_gemma4_vision_ref.py)
from gemma4_clip_ref import clipped  # noqa: E402


def tower_run(feats, mask):
    """A forward of a model's (or its PEFT copy's) audio tower on the clips."""
    return lambda model: tower_of(model)(feats, mask)


def lora_model_of(model):
    """A copy of model under PEFT LoRA at the drawn A and B."""
    return clip_ref.lora_model_of(model, LORA_TARGETS, SEED_LORA, random_lora)


def short(k):
    i = k.index("layers.")
    tail = k[i:].replace(".lora_A.weight", "").replace(".lora_B.weight", "")
    return ("audio." if "audio_tower" in k else "") + tail


def audio_attention_in_dtype():
    """Gemma4AudioAttention.forward as transformers writes it, but in its input's dtype: transformers
    casts q, k, v to float32 (.float()) and takes the softmax in float32, which in a float64 model
    multiplies float32 keys by float64 queries (per_dim_scale is float64) and fails. For the float64
    run only (in float32 the two are the same code)."""
    import inspect
    import textwrap

    from transformers.models.gemma4 import modeling_gemma4 as mg
    src = textwrap.dedent(inspect.getsource(mg.Gemma4AudioAttention.forward))
    assert src.count(").float().view(hidden_shape)") == 3 and src.count("dim=-1, dtype=torch.float32)") == 1, src
    src = src.replace(").float().view(hidden_shape)", ").view(hidden_shape)").replace(
        "dim=-1, dtype=torch.float32)", "dim=-1)")
    ns = {}
    exec(compile(src, "<Gemma4AudioAttention.forward in its dtype>", "exec"), vars(mg), ns)
    return ns["forward"]


def lora_run(pm, ids, feats, mask, labels):
    keys = list(peft.get_peft_model_state_dict(pm).keys())
    named = dict(pm.named_parameters())
    lora = {k: named[k.replace(".lora_A.weight", ".lora_A.default.weight").replace(
        ".lora_B.weight", ".lora_B.default.weight")] for k in keys}
    trainable = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert len(trainable) == len(lora) == len(keys), (len(trainable), len(lora), len(keys))
    assert not any(s in k for k in keys for s in ("embed_audio", "relative_k_proj", "output_proj",
                                                   "subsample_conv_projection", "vision"))
    audio_keys = [k for k in keys if "audio_tower" in k]
    assert len(audio_keys) == 2 * 2 * 10 and all(".linear.lora_" in k for k in audio_keys), audio_keys
    assert any("language_model" in k for k in keys)
    out = pm(input_ids=ids, input_features=feats.to(pm.dtype), input_features_mask=mask, labels=labels,
             use_cache=False)
    out.loss.backward()
    res = {}
    for k, p in lora.items():
        which = "A" if ".lora_A." in k else "B"
        assert p.grad is not None and float(p.grad.abs().max()) > 0, k
        res[f"{short(k)}.{which}"] = (p.detach().clone(), p.grad.detach().clone())
    return float(out.loss.detach()), keys, res


# Clip lengths (samples at 16 kHz) around every boundary of the token count: no frame, the first
# frames, the stride-2 steps, the real clips, the 30 s cut and the 750 cap.
COUNT_LENS = [0, 1, 160, 161, 162, 320, 321, 480, 481, 640, 641, 800, 801, 960, 961, 1121, 1281, 13840, 22468,
              160000, 479839, 479840, 479999, 480000, 480001, 600000]


def audio_token_counts():
    """Soft tokens per clip length, as Gemma4Processor counts them two ways: _compute_audio_num_tokens
    (from the length) and replace_audio_token (from Gemma4AudioFeatureExtractor's mask of the clip,
    padded in a batch with a 30 s clip so the count does not depend on the clip's own padding);
    asserted equal, the first capped at audio_seq_length (750)."""
    import types
    from transformers import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
    fe = Gemma4AudioFeatureExtractor()
    proc = types.SimpleNamespace(feature_extractor=fe, audio_seq_length=750)
    tokens = []
    for n in COUNT_LENS:
        t = Gemma4Processor._compute_audio_num_tokens(proc, np.zeros(n, np.float32), 16000)
        if 161 <= n <= 600000:
            fx = fe([np.full(n, 0.01, np.float32), np.full(480000, 0.01, np.float32)], return_tensors="np")
            m = fx["input_features_mask"][0]
            for _ in range(2):
                m = m[::2][: (len(m) + 2 - 3) // 2 + 1]
            assert min(int(m.sum()), 750) == t, (n, int(m.sum()), t)
        tokens.append(int(t))
    return COUNT_LENS, tokens


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    transformers.utils.logging.set_verbosity_error()

    with h5py.File(FE_REF, "r") as f:
        feats = torch.from_numpy(f["batch/features"][:])
        mask_u8 = f["batch/mask"][:]
    assert feats.shape == (2, 140, 128) and feats.dtype == torch.float32 and mask_u8.dtype == np.uint8
    mask = torch.from_numpy(mask_u8.astype(bool))  # True = valid
    # valid frames come first; what transformers' feature extractor says for these clips
    assert mask_u8.sum(1).tolist() == [140, 86] and bool((mask_u8[1, :86] == 1).all()), mask_u8.sum(1)

    model = make_model()
    lora_model = lora_model_of(model)
    margin, crowded = clip_ref.set_clip_bounds([model, lora_model], tower_run(feats, mask), SEED_CLIP, k_max=640,
                                               min_gap=1e-4)
    print(f"clip bounds: every value at least {margin:.3g} from its bound (plain and LoRA forwards); "
          f"{len(crowded)} sides past every value: " + ", ".join(crowded))
    assert margin > 1e-5, margin
    fr = clip_ref.clip_fractions(model, tower_run(feats, mask))
    for n, (fi, fo) in fr.items():
        print(f"clip {n}: input {fi:.4f}, output {fo:.4f}")
        assert 0.01 <= fi <= 0.20 and 0.01 <= fo <= 0.20, (n, fi, fo)
    assert len(fr) == 20
    cut, met, cmargin = gradient_clamps(model, feats, mask)
    _, _, cmargin_lora = gradient_clamps(lora_model, feats, mask)
    cmargin = min(cmargin, cmargin_lora)
    clamp_fraction = cut / met
    print(f"gradient_clipping: {cut} of {met} values cut ({clamp_fraction:.4f}), nearest value {cmargin:.3g} "
          f"from +-{CLAMP}")
    assert 0.001 <= clamp_fraction <= 0.2 and cmargin > 1e-5, (clamp_fraction, cmargin)

    # the tower's stages
    tower = model.model.audio_tower
    stages = {}

    def keep(name, first=False):
        def hook(mod, args, out):
            stages.setdefault(name, (out[0] if first else out).detach().clone())
        return hook

    hooks = [tower.subsample_conv_projection.register_forward_hook(keep("sscp", first=True))]
    hooks += [lay.register_forward_hook(keep(f"layer_{i}")) for i, lay in enumerate(tower.layers)]
    with torch.no_grad():
        enc = tower(feats, mask, return_dict=True)
        feat_out = model.model.get_audio_features(feats, mask, return_dict=True)
    for h in hooks:
        h.remove()
    t2 = enc.last_hidden_state.shape[1]
    assert t2 == 35 and enc.last_hidden_state.shape == (2, t2, 24)
    assert all(stages[k].shape == (2, t2, 32) for k in ("sscp", "layer_0", "layer_1"))
    with torch.no_grad():
        assert torch.equal(tower.output_proj(stages["layer_1"]), enc.last_hidden_state)
    out_mask = enc.attention_mask
    assert out_mask.dtype == torch.bool and torch.equal(out_mask, mask[:, ::2][:, ::2])
    n_tokens = out_mask.sum(1).tolist()
    assert n_tokens == [35, 22], n_tokens
    count_lens, count_tokens = audio_token_counts()
    assert torch.equal(feat_out.last_hidden_state, enc.last_hidden_state)
    assert torch.equal(feat_out.pooler_output, model.model.embed_audio(inputs_embeds=enc.last_hidden_state))
    soft = feat_out.pooler_output[out_mask]
    assert soft.shape == (sum(n_tokens), 64)
    noclip = copy.deepcopy(model)
    with torch.no_grad():
        for _, m in clipped(noclip):
            m.input_min.fill_(-float("inf"))
            m.output_min.fill_(-float("inf"))
            m.input_max.fill_(float("inf"))
            m.output_max.fill_(float("inf"))
        diff_noclip = float((noclip.model.audio_tower(feats, mask).last_hidden_state - enc.last_hidden_state)
                            .abs().max())
    print(f"tower: sscp {tuple(stages['sscp'].shape)}, output {tuple(enc.last_hidden_state.shape)}, soft tokens "
          f"{n_tokens}; without the clip buffers the tower's output moves {diff_noclip:.4g}")
    assert diff_noclip > 1e-2

    # the prompts
    g = torch.Generator().manual_seed(SEED_INPUTS)

    def text(n):
        return torch.randint(3, BOA, (n,), generator=g).tolist()

    s0 = [2] + text(3) + [BOA] + [AUD] * n_tokens[0] + [EOA]
    s1 = [2] + text(8) + [BOA] + [AUD] * n_tokens[1] + [EOA]
    s0, s1 = s0 + text(T - len(s0)), s1 + text(T - len(s1))
    assert len(s0) - s0.index(EOA) == 8 and len(s1) - s1.index(EOA) == 16
    ids = torch.tensor([s0, s1])
    labels = torch.full_like(ids, -100)
    labels[:, -6:] = ids[:, -6:]

    logits = mm_logits(model, ids, feats, mask)
    with torch.no_grad():
        no_audio = model(input_ids=ids, use_cache=False).logits.float()
    diff_audio = float((logits - no_audio).abs().max())
    # the soft tokens go where the audio ids are: the same logits from inputs_embeds built by hand
    with torch.no_grad():
        lm = model.model.language_model
        llm_ids = torch.where(ids == AUD, 0, ids)
        emb = lm.embed_tokens(llm_ids)
        pad_emb = torch.where((ids == AUD)[..., None], lm.embed_tokens.weight[0], emb)
        per_layer = lm.get_per_layer_inputs(llm_ids, pad_emb)
        emb = emb.masked_scatter((ids == AUD)[..., None].expand_as(emb), soft)
        hid = lm(inputs_embeds=emb, per_layer_inputs=per_layer, use_cache=False).last_hidden_state
        cap = model.config.text_config.final_logit_softcapping
        by_hand = (torch.tanh(model.lm_head(hid) / cap) * cap).float()
    diff_hand = float((by_hand - logits).abs().max())
    max_prob = float(torch.softmax(logits, -1).max())
    print(f"mm: {tuple(ids.shape)}; the clips move the logits by {diff_audio:.4g}; soft tokens scattered by hand "
          f"{diff_hand:.3g}; max prob {max_prob:.4f}")
    assert diff_audio > 1e-2 and max_prob < 0.99 and diff_hand < 1e-5, (diff_audio, max_prob, diff_hand)

    # save, check the keys, reload
    shutil.rmtree(OUT, ignore_errors=True)
    model.save_pretrained(OUT, safe_serialization=True)
    write_tokenizer(OUT)
    check_tokenizer(OUT, mask, n_tokens)
    tensors = safetensors.torch.load_file(os.path.join(OUT, "model.safetensors"))
    for k in sorted(tensors):
        if "audio" in k and (".layers." not in k or ".layers.0." in k):
            print(f"  {k} {tuple(tensors[k].shape)} {tensors[k].dtype}")
    assert all(v.dtype == torch.float32 for v in tensors.values())
    assert not any("vision" in k for k in tensors)
    sd = model.state_dict()
    for n, m in clipped(model):
        for b in ("input_min", "input_max", "output_min", "output_max"):
            key = f"{n}.{b}"
            assert key in tensors and torch.equal(tensors[key], sd[key]) and bool(torch.isfinite(tensors[key])), key
    back = Gemma4ForConditionalGeneration.from_pretrained(OUT).eval()
    for (n1, p1), (n2, p2) in zip(sd.items(), back.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    assert torch.equal(mm_logits(back, ids, feats, mask), logits)

    # LoRA, f32 and f64
    loss, peft_keys, res = lora_run(lora_model, ids, feats, mask, labels)
    from transformers.models.gemma4.modeling_gemma4 import Gemma4AudioAttention
    real_forward = Gemma4AudioAttention.forward
    Gemma4AudioAttention.forward = audio_attention_in_dtype()
    try:
        assert torch.equal(mm_logits(model, ids, feats, mask), logits)  # the same code in float32
        loss64, keys64, res64 = lora_run(lora_model_of(model).double(), ids, feats, mask, labels)
    finally:
        Gemma4AudioAttention.forward = real_forward
    assert keys64 == peft_keys and list(res64) == list(res)
    worst = 0.0
    for k in res:
        assert torch.equal(res[k][0].double(), res64[k][0]), k
        g32, g64 = res[k][1].double(), res64[k][1]
        worst = max(worst, float((g32 - g64).abs().max() / g64.abs().max()))
        if os.environ.get("DEBUG_GRADS"):
            print(f"  {k}: {float((g32 - g64).abs().max() / g64.abs().max()):.3g}")
    n_audio = sum(1 for k in res if k.startswith("audio."))
    print(f"LoRA: loss {loss:.6f} (f64 {loss64:.9f}), {len(res)} adapter tensors ({n_audio} in the audio tower), "
          f"f32 grads {worst:.3g} from f64")

    def writer(f):
        h5_attrs(f, {"generator": "tests/ref/make_gemma4_audio_ref.py", "torch_num_threads": 1,
                     "version_torch": str(torch.__version__),
                     "version_transformers": str(transformers.__version__), "version_peft": str(peft.__version__)})
        a = h5_group(f, "audio")
        h5_dset(a, "features", feats.numpy(), np.float32)
        h5_dset(a, "mask", mask_u8, np.uint8)
        for k in ("sscp", "layer_0", "layer_1"):
            h5_dset(a, k, stages[k].numpy(), np.float32)
        h5_dset(a, "tower", enc.last_hidden_state.numpy(), np.float32)
        h5_dset(a, "out_mask", out_mask.numpy().astype(np.uint8), np.uint8)
        h5_dset(a, "n_tokens", np.array(n_tokens), np.int32)
        h5_dset(a, "count_samples", np.array(count_lens), np.int32)
        h5_dset(a, "count_tokens", np.array(count_tokens), np.int32)
        h5_dset(a, "soft", soft.numpy(), np.float32)
        h5_dset(a, "clip_fractions", np.array(list(fr.values())), np.float64)
        a["clip_fractions"].attrs["modules"] = "\n".join(fr)
        h5_attrs(a, {"clamp_fraction": clamp_fraction, "min_clamp_margin": cmargin, "min_clip_margin": margin,
                     "clip_sides_past_all_values": "\n".join(crowded), "max_abs_diff_no_clip": diff_noclip})
        m = h5_group(f, "mm")
        h5_dset(m, "input_ids", ids.numpy(), np.int32)
        h5_dset(m, "logits", logits.numpy(), np.float32)
        h5_attrs(m, {"max_abs_diff_no_audio": diff_audio, "max_prob": max_prob})
        lg = h5_group(f, "lora_at")
        h5_dset(lg, "labels", labels.numpy(), np.int32)
        h5_dset(lg, "loss", np.array([loss]), np.float64)
        h5_dset(lg, "loss64", np.array([loss64]), np.float64)
        for k, (val, grad) in res.items():
            h5_dset(lg, k, val.numpy(), np.float32)
            h5_dset(lg, k + "_grad", grad.numpy(), np.float32)
            h5_dset(lg, k + "_grad64", res64[k][1].numpy(), np.float64)
        h5_attrs(lg, {"r": 4, "lora_alpha": 8, "seed": SEED_LORA, "target_modules": LORA_TARGETS,
                      "peft_keys": "\n".join(peft_keys), "peft_f32_grad_rel_err_vs_f64": worst})

    write_h5_atomically(REF, writer)
    for p in [os.path.join(OUT, fn) for fn in sorted(os.listdir(OUT))] + [REF]:
        print(f"{sha256_file(p)}  {os.path.relpath(p, HERE)}")


if __name__ == "__main__":
    main()
