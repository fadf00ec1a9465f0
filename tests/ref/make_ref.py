#!/usr/bin/env python3
"""Reference-fixture generator for gemmarun (run by hand, never in CI).

Writes the fixtures the C tests compare against, all computed with the Hugging Face `transformers`
implementation of Gemma 3 (used as a library; no model code lives here) in float32 on the CPU:

  --only tiny   tests/ref/tiny_gemma3/{config.json,model.safetensors}         random tiny model, f32,
                                                                               current config format
                tests/ref/tiny_gemma3_legacy/{config.json,model.safetensors}  random tiny model, bf16,
                                                                               legacy config field names
                tests/ref/tiny_gemma3_ref.h5                                   reference outputs of both
  --only real   tests/ref/gemma3_270m_ref.h5     reference outputs of the real Gemma 3 270M, weights
                                                  dequantized from the Q4_K_M GGUF (see --gguf)
  --only all    both (default)

Usage:  /opt/refvenv/bin/python tests/ref/make_ref.py [--only tiny|real|all] [--gguf PATH]
The HDF5 layout and every semantic detail the C code must match are documented in
tests/ref/README.md; the comments below say why each step is done the way it is.

Determinism: every random draw comes from an explicitly seeded generator, torch runs with one
thread and deterministic algorithms, datasets and groups are written with object-time tracking
off (`track_times=False`, and a group-creation property list with obj_track_times off), and
attributes hold no dates or paths. Running the script twice on the same machine and package
versions gives byte-identical files (the script's last step prints their sha256 so it is easy
to check). Other CPUs / torch builds may differ in the last bits of float results.
"""

import argparse
import copy
import gc
import hashlib
import json
import os
import sys
import time

# transformers' GGUF loader draws a plain tqdm progress bar; keep the log readable.
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:  # only the real model's reference reads GGUF files; other scripts import the helpers below
    import gguf
except ImportError:
    gguf = None
import h5py
import safetensors
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig
from transformers import GenerationConfig

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GGUF = os.path.expanduser("~/.cache/gemmarun/models/gemma-3-270m-q4_k_m.gguf")
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# ----------------------------------------------------------------------------------------------
# Seeds (all fixed). Each consumer gets its own seed so that changing one part of the fixture
# does not shift the random streams of the others.
# ----------------------------------------------------------------------------------------------
SEED_TINY_WEIGHTS = 20250301         # tiny_gemma3 weights
SEED_TINY_LEGACY_WEIGHTS = 20250302  # tiny_gemma3_legacy weights ("its own weights")
SEED_TINY_INPUTS = 20250303          # input_ids of /tiny and /tiny_legacy
SEED_PROBE_IDS = 20250304            # random part of /probe_ids of the 270M file

# Standard deviations of the random re-initialisation of the tiny models.
STD_EMBED = 1.0   # embedding (also the tied LM head): std 1
STD_NORM = 0.3    # every RMSNorm weight (zero-centred; effective scale 1+w), so "1+w" is visible
# Linear layers: std 1/sqrt(fan_in), which keeps activations O(1) through the layers so that
# attention patterns, GQA and the MLP all contribute visibly to the output.

# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


def log(*a):
    print(*a, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def quiet_transformers():
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def setup_torch():
    # One thread: float reductions in GEMMs can depend on how the work is split across threads,
    # so a fixed thread count makes the output independent of the machine's core count.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # nothing should draw from the global RNG, but pin it anyway


def versions():
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": (getattr(gguf, "__version__", None) or _dist_version("gguf")) if gguf else None,
        "safetensors": safetensors.__version__,
        "h5py": h5py.__version__,
        "numpy": np.__version__,
    }


def _dist_version(name):
    from importlib.metadata import version

    return version(name)


# --- HDF5 writing without timestamps -----------------------------------------------------------
# h5py datasets take track_times=False directly. Groups have no such argument in the high-level
# API, so they are created through the low-level API with a group-creation property list whose
# object-time tracking is switched off. With these, the file bytes depend only on the contents.


def h5_group(parent, name):
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    gid = h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl)
    return h5py.Group(gid)


def h5_dset(group, name, arr, dtype):
    arr = np.ascontiguousarray(np.asarray(arr), dtype=dtype)
    group.create_dataset(name, data=arr, track_times=False)


def h5_attrs(obj, d):
    # Attributes are written in sorted key order so the file layout does not depend on dict order.
    for k in sorted(d):
        v = d[k]
        obj.attrs[k] = v


def write_h5_atomically(path, writer):
    """Writes via a temporary file and renames, so an interrupted run leaves no half file."""
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        writer(f)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Shared reference computations
# ----------------------------------------------------------------------------------------------


class LayerOutputRecorder:
    """Forward hooks on every decoder layer that record its raw output (the residual stream after
    the layer, BEFORE the final norm). HF's own `output_hidden_states` does not contain the raw
    output of the last layer (its last entry is replaced by the normed state), so this fills the gap.
    """

    def __init__(self, model):
        self.outs = []
        self.handles = [layer.register_forward_hook(self._hook) for layer in model.model.layers]

    def _hook(self, module, inputs, output):
        self.outs.append((output[0] if isinstance(output, tuple) else output).detach().clone())

    def remove(self):
        for h in self.handles:
            h.remove()


def greedy_generate(model, input_ids, n_new):
    """Greedy continuation with `model.generate`, exactly `n_new` tokens (no EOS stopping).

    Returns (tokens [B, n_new] int64, raw step logits [n_new, B, V] float32).
    eos_token_id=None disables stopping (and with it the min-length processor, so no logits
    processor at all touches the scores); max_new_tokens=min_new_tokens=n_new pins the length.
    The raw (unprocessed) logits come from output_logits=True.
    """
    gen_cfg = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=n_new,
        min_new_tokens=n_new,
        eos_token_id=None,
        pad_token_id=model.config.pad_token_id,
        bos_token_id=model.config.bos_token_id,
        output_logits=True,
        return_dict_in_generate=True,
        use_cache=True,
    )
    attn = torch.ones_like(input_ids)  # explicit: never let generate infer a mask from pad ids
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attn, generation_config=gen_cfg)
    seq = out.sequences[:, input_ids.shape[1]:]
    assert seq.shape[1] == n_new, f"generate returned {seq.shape[1]} tokens, expected {n_new}"
    step_logits = torch.stack([lg.float() for lg in out.logits], 0)  # [n_new, B, V]
    # Greedy means argmax of the raw logits at every step; check it (guards against any hidden
    # logits processor or sampling default sneaking in).
    assert torch.equal(step_logits.argmax(-1).T, seq), "generate did not pick the argmax"
    return seq, step_logits


def top2_margin(logits):
    """top1 - top2 along the last axis."""
    t2 = torch.topk(logits, 2, dim=-1).values
    return t2[..., 0] - t2[..., 1]


def check_greedy_against_full_forward(model, prompt_ids, gen, step_logits):
    """Re-runs the whole sequence (prompt + generated) in one forward pass without a KV cache and
    compares with the incremental (KV-cached) logits of generate. Returns (max |diff| of the
    logits, number of steps whose argmax differs). The C tests face the same prefill-vs-decode
    difference, so this number is a useful tolerance hint."""
    full = torch.cat([prompt_ids, gen], 1)
    with torch.no_grad():
        lg = model(full, use_cache=False).logits.float()  # [B, T+n, V]
    T = prompt_ids.shape[1]
    n = gen.shape[1]
    lg_steps = lg[:, T - 1:T - 1 + n, :].transpose(0, 1)  # [n, B, V]
    maxdiff = (lg_steps - step_logits).abs().max().item()
    mism = int((lg_steps.argmax(-1) != step_logits.argmax(-1)).sum().item())
    return maxdiff, mism


# ----------------------------------------------------------------------------------------------
# (a) Tiny random Gemma 3
# ----------------------------------------------------------------------------------------------

TINY_LAYER_TYPES = ["sliding_attention"] * 5 + ["full_attention"]  # layer 5 global (pattern 6)
TINY_COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    sliding_window=4,
    query_pre_attn_scalar=24,  # deliberately != head_dim (16): scale is 24**-0.5, not 16**-0.5
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
TINY_B, TINY_T = 2, 12
TINY_PREFIX, TINY_NEW = 4, 8


def tiny_config_new(linear_factor_on_full=None):
    """Gemma3TextConfig in the current format (explicit layer_types + per-layer-type rope_parameters).

    linear_factor_on_full: if given, the full-attention layers use linear RoPE scaling with that
    factor (what a legacy `rope_scaling: {rope_type: linear, factor: 8}` means for Gemma 3); the
    sliding layers never scale.
    """
    full = {"rope_type": "default", "rope_theta": 1_000_000.0}
    if linear_factor_on_full is not None:
        full = {"rope_type": "linear", "factor": float(linear_factor_on_full), "rope_theta": 1_000_000.0}
    return Gemma3TextConfig(
        **TINY_COMMON,
        layer_types=list(TINY_LAYER_TYPES),
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": full,
        },
        attn_implementation="eager",
    )


def tiny_legacy_config_dict():
    """config.json in the OLD field names, as Gemma 3 configs on the hub were written by
    transformers 4.50-4.5x (e.g. gemma-3-1b-it's config.json; the 4b/12b/27b text_config has the
    same keys plus rope_scaling linear x8). No layer_types, no rope_parameters."""
    d = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "cache_implementation": "hybrid",
        "head_dim": TINY_COMMON["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": TINY_COMMON["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": TINY_COMMON["intermediate_size"],
        "max_position_embeddings": TINY_COMMON["max_position_embeddings"],
        "num_attention_heads": TINY_COMMON["num_attention_heads"],
        "num_hidden_layers": TINY_COMMON["num_hidden_layers"],
        "num_key_value_heads": TINY_COMMON["num_key_value_heads"],
        "query_pre_attn_scalar": TINY_COMMON["query_pre_attn_scalar"],
        "rms_norm_eps": TINY_COMMON["rms_norm_eps"],
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window": TINY_COMMON["sliding_window"],
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0.dev0",
        "use_cache": True,
        "vocab_size": TINY_COMMON["vocab_size"],
    }
    return dict(sorted(d.items()))


def randomize_tiny(model, seed, round_to_bf16):
    """Re-initialises every parameter from a seeded generator, in sorted-name order.

    embed_tokens ~ N(0, 1) (tied: it is also the LM head), every *norm.weight ~ N(0, 0.3),
    every Linear ~ N(0, 1/fan_in). If round_to_bf16, the values are rounded to bf16 (RNE, torch's
    conversion) and kept in f32, so the f32 model computes exactly on the bf16 weights upcast.
    """
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())  # tied lm_head is not listed separately
    assert "lm_head.weight" not in params
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if name.endswith("embed_tokens.weight"):
                std = STD_EMBED
            elif name.endswith("norm.weight"):
                std = STD_NORM
            else:
                assert p.dim() == 2, name
                std = p.shape[1] ** -0.5
            w = torch.randn(p.shape, generator=g, dtype=torch.float32) * std
            if round_to_bf16:
                w = w.to(torch.bfloat16).to(torch.float32)
            p.copy_(w)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def tiny_reference(model):
    """All reference tensors for one tiny variant (model in f32 eval mode)."""
    rng = np.random.default_rng(SEED_TINY_INPUTS)
    # Random ids in [4, 512): avoid 0 (pad) so nothing could ever be mistaken for padding, and
    # 1/2/3 (eos/bos/unk) for cleanliness. Same ids for both variants.
    ids_np = rng.integers(4, TINY_COMMON["vocab_size"], size=(TINY_B, TINY_T))
    ids = torch.from_numpy(ids_np).long()

    rec = LayerOutputRecorder(model)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, use_cache=False)
        base = model.model(ids, use_cache=False).last_hidden_state
    rec.remove()
    layer_out = rec.outs[:TINY_COMMON["num_hidden_layers"]]  # first forward's hooks only
    hs = out.hidden_states
    L = TINY_COMMON["num_hidden_layers"]

    # Document-by-assertion what HF's hidden_states tuple holds (transformers 5.x capture_outputs):
    #   [0]      = scaled embedding  E[ids] * sqrt(D)   (the input of layer 0)
    #   [i]      = raw output of decoder layer i-1, for i = 1 .. L-1
    #   [L]      = FINAL NORMED state (== last_hidden_state); the raw output of layer L-1 is
    #              NOT in the tuple (it is `layer_out[L-1]` in the fixture).
    assert len(hs) == L + 1
    scale = model.model.embed_tokens.embed_scale.to(torch.float32)
    assert torch.equal(hs[0], model.model.embed_tokens.weight[ids] * scale)
    for i in range(1, L):
        assert torch.equal(hs[i], layer_out[i - 1]), i
    assert torch.equal(hs[L], base)
    assert torch.equal(model.model.norm(layer_out[L - 1]), base)
    with torch.no_grad():
        assert torch.equal(model.lm_head(base), out.logits)

    gen, step_logits = greedy_generate(model, ids[:, :TINY_PREFIX], TINY_NEW)
    margin = top2_margin(step_logits).T  # [B, n]
    kv_diff, kv_mism = check_greedy_against_full_forward(model, ids[:, :TINY_PREFIX], gen, step_logits)
    return {
        "input_ids": ids_np.astype(np.int32),
        "logits": out.logits.float().numpy(),
        "hidden_last": base.float().numpy(),
        "hidden_states": torch.stack(hs, 0).float().numpy(),
        "layer_out": torch.stack(layer_out, 0).float().numpy(),
        "greedy": gen.numpy().astype(np.int32),
        "greedy_margin": margin.float().numpy(),
        "greedy_logits": step_logits.transpose(0, 1).float().numpy(),  # [B, n, V]
        "_kv_diff": kv_diff,
        "_kv_mism": kv_mism,
    }


def make_tiny():
    t0 = time.time()
    out_dir = os.path.join(HERE, "tiny_gemma3")
    leg_dir = os.path.join(HERE, "tiny_gemma3_legacy")
    refs = {}

    # --- variant 1: current config format, f32 weights ------------------------------------
    cfg = tiny_config_new()
    model = Gemma3ForCausalLM(cfg).eval()
    randomize_tiny(model, SEED_TINY_WEIGHTS, round_to_bf16=False)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)  # writes config.json + model.safetensors (f32, no lm_head key)
    _drop_extra_files(out_dir)
    # Round trip through from_pretrained: the saved files must reproduce the in-memory model bit
    # for bit (catches e.g. an init hook touching the padding row or the norms on load).
    reloaded = Gemma3ForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    assert reloaded.config.layer_types == TINY_LAYER_TYPES
    ref = tiny_reference(reloaded)
    ref_mem = tiny_reference(model)
    for k in ("logits", "hidden_states", "greedy"):
        assert np.array_equal(ref[k], ref_mem[k]), k
    refs["tiny"] = (ref, {"model_dir": "tiny_gemma3", "weights_dtype": "float32", "seed": SEED_TINY_WEIGHTS})
    del model, reloaded

    # --- variant 2: legacy config field names, bf16 weights --------------------------------
    # The reference is computed from a model built with the EQUIVALENT new-style config
    # (linear RoPE scaling x8 on the full-attention layers only; sliding layers theta 1e4 and no
    # scaling) in f32, with the bf16 weights upcast to f32. Separately, the legacy directory is
    # loaded by transformers itself (from_pretrained on the legacy config.json, dtype f32): its
    # parsed config must equal the explicit one and its outputs must be bit-identical. That proves
    # the legacy fields mean what the C loader should make them mean.
    cfg_new = tiny_config_new(linear_factor_on_full=8.0)
    model = Gemma3ForCausalLM(cfg_new).eval()
    randomize_tiny(model, SEED_TINY_LEGACY_WEIGHTS, round_to_bf16=True)
    os.makedirs(leg_dir, exist_ok=True)
    # bf16 safetensors (values exact: pre-rounded). Save from a deep copy: `.to(bfloat16)` would
    # also cast the non-persistent RoPE inv_freq buffers, and casting the model back to f32 would
    # not restore them (this silently changed the logits in a first version of this script).
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(leg_dir)
    _drop_extra_files(leg_dir)
    with open(os.path.join(leg_dir, "config.json"), "w") as f:
        json.dump(tiny_legacy_config_dict(), f, indent=2)
        f.write("\n")
    _check_safetensors_dtype(os.path.join(leg_dir, "model.safetensors"), "BF16")

    leg_cfg = AutoConfig.from_pretrained(leg_dir)
    assert leg_cfg.layer_types == TINY_LAYER_TYPES, leg_cfg.layer_types
    want_rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    assert leg_cfg.rope_parameters == want_rope, leg_cfg.rope_parameters
    assert cfg_new.rope_parameters == want_rope, cfg_new.rope_parameters
    leg_model = Gemma3ForCausalLM.from_pretrained(leg_dir, dtype=torch.float32, attn_implementation="eager").eval()
    # The RoPE tables transformers built from the legacy file: full layers inv_freq = default/8.
    rot = leg_model.model.rotary_emb
    assert torch.equal(rot.full_attention_inv_freq * 8.0, _default_inv_freq(1e6, 16)), "full != default/8"
    assert torch.equal(rot.sliding_attention_inv_freq, _default_inv_freq(1e4, 16)), "sliding scaled?"
    ref = tiny_reference(model)
    ref_leg = tiny_reference(leg_model)
    for k in ("logits", "hidden_states", "layer_out", "greedy"):
        assert np.array_equal(ref[k], ref_leg[k]), f"legacy config load differs in {k}"
    # Sanity: the scaling matters here (otherwise the fixture could not catch a missing factor).
    model_noscale = Gemma3ForCausalLM(tiny_config_new()).eval()
    model_noscale.load_state_dict(model.state_dict())
    d_noscale = np.abs(tiny_reference(model_noscale)["logits"] - ref["logits"]).max()
    assert d_noscale > 1e-3, d_noscale
    refs["tiny_legacy"] = (
        ref,
        {
            "model_dir": "tiny_gemma3_legacy",
            "weights_dtype": "bfloat16 (computed in float32 from the upcast weights)",
            "seed": SEED_TINY_LEGACY_WEIGHTS,
            "max_abs_logit_diff_if_rope_scaling_ignored": float(d_noscale),
        },
    )

    path = os.path.join(HERE, "tiny_gemma3_ref.h5")

    def writer(f):
        h5_attrs(f, _root_attrs())
        for gname in ("tiny", "tiny_legacy"):
            ref, attrs = refs[gname]
            g = h5_group(f, gname)
            attrs = dict(attrs)
            attrs["greedy_prefix_len"] = TINY_PREFIX
            attrs["kv_cache_vs_full_forward_max_abs_logit_diff"] = float(ref["_kv_diff"])
            h5_attrs(g, attrs)
            h5_dset(g, "input_ids", ref["input_ids"], np.int32)
            h5_dset(g, "logits", ref["logits"], np.float32)
            h5_dset(g, "hidden_last", ref["hidden_last"], np.float32)
            h5_dset(g, "hidden_states", ref["hidden_states"], np.float32)
            h5_dset(g, "layer_out", ref["layer_out"], np.float32)
            h5_dset(g, "greedy", ref["greedy"], np.int32)
            h5_dset(g, "greedy_margin", ref["greedy_margin"], np.float32)
            h5_dset(g, "greedy_logits", ref["greedy_logits"], np.float32)

    write_h5_atomically(path, writer)
    for gname in ("tiny", "tiny_legacy"):
        ref = refs[gname][0]
        log(f"[tiny] /{gname}: greedy={ref['greedy'].tolist()} min margin={ref['greedy_margin'].min():.4f} "
            f"kv-vs-full max|dlogit|={ref['_kv_diff']:.3g} argmax mismatches={ref['_kv_mism']}")
    log(f"[tiny] legacy: max|dlogit| if the x8 scaling were ignored = {refs['tiny_legacy'][1]['max_abs_logit_diff_if_rope_scaling_ignored']:.4f}")
    log(f"[tiny] wrote {path} in {time.time() - t0:.1f} s")
    return [os.path.join(out_dir, "config.json"), os.path.join(out_dir, "model.safetensors"),
            os.path.join(leg_dir, "config.json"), os.path.join(leg_dir, "model.safetensors"), path]


def _default_inv_freq(base, dim):
    # Same formula the reference spec gives (gemma_architecture.md §1.5), computed independently.
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))


def _drop_extra_files(d):
    # save_pretrained also writes generation_config.json; the fixture is config.json +
    # model.safetensors only (from_pretrained derives the generation config from config.json).
    for fn in os.listdir(d):
        if fn not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, fn))


def _check_safetensors_dtype(path, want):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
    dts = {v["dtype"] for k, v in hdr.items() if k != "__metadata__"}
    assert dts == {want}, dts


def _root_attrs():
    a = {f"version_{k}": str(v) for k, v in versions().items()}
    a["generator"] = "tests/ref/make_ref.py"
    a["torch_num_threads"] = 1
    return a


# ----------------------------------------------------------------------------------------------
# (b) Real Gemma 3 270M from the Q4_K_M GGUF
# ----------------------------------------------------------------------------------------------

# GGUF (llama.cpp) tensor name -> HF Gemma3ForCausalLM name (gemma_architecture.md §5.3).
GGUF_TO_HF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
}
GGUF_TO_HF_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

REAL_CONFIG = dict(
    vocab_size=262144,
    hidden_size=640,
    intermediate_size=2048,
    num_hidden_layers=18,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    sliding_window=512,
    query_pre_attn_scalar=256,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)

# The Carl Sagan fortune from fortune-mod's /usr/share/games/fortunes/science (record 93 when the
# file is split on "%\n"), verbatim with its line breaks, double spaces and the tab-indented
# attribution (the file's final newline dropped). Embedded here so regeneration does not depend on
# the fortunes package. 130 tokens with BOS.
P3_TEXT = (
    "At the heart of science is an essential tension between two seemingly\n"
    "contradictory attitudes -- an openness to new ideas, no matter how bizarre\n"
    "or counterintuitive they may be, and the most ruthless skeptical scrutiny\n"
    "of all ideas, old and new.  This is how deep truths are winnowed from deep\n"
    "nonsense.  Of course, scientists make mistakes in trying to understand the\n"
    "world, but there is a built-in error-correcting mechanism:  The collective\n"
    "enterprise of creative thinking and skeptical thinking together keeps the\n"
    "field on track.\n"
    "\t\t-- Carl Sagan, \"The Fine Art of Baloney Detection\""
)

PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "<start_of_turn>user\nWrite a short poem about the sea.<end_of_turn>\n<start_of_turn>model\n",
    P3_TEXT,
    "Once upon a time, in a small village,",
]
REAL_TOPK = 32
REAL_NPROBE = 1024
REAL_NEW = 48

# Tokenizer test vectors from shared/reference/formats.md §2.5 (measured with the real HF
# Gemma 3 tokenizer.json); the GGUF-built tokenizer must reproduce them before we trust it.
TOKENIZER_VECTORS = [
    ("Hello world", True, [2, 9259, 1902]),
    ("Hello  world", True, [2, 9259, 138, 12392]),
    ("hello\n\nworld", True, [2, 23391, 108, 12392]),
    ("<start_of_turn>user\nHi<end_of_turn>\n", True, [2, 105, 2364, 107, 10979, 106, 107]),
    ("1234567", True, [2, 236770, 236778, 236800, 236812, 236810, 236825, 236832]),
    ("naïve café", True, [2, 1789, 238527, 560, 33443]),
    ("\t\tx", True, [2, 255969, 236781]),
    ("\U00013000", False, [478, 385, 366, 366]),
    ("The quick brown fox jumps over the lazy dog.", False,
     [818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761]),
    ("<start_of_turn>model\n", False, [105, 4368, 107]),
]


def gguf_field(reader, key):
    return reader.fields[key].contents()


def load_gguf_state_dict(path):
    """Dequantizes every tensor of the GGUF to f32 with gguf-py and returns an HF state dict.

    Shapes: a GGUF tensor with ne = [ne0, ne1] (ne0 = contiguous) dequantizes to a numpy array of
    shape [ne1, ne0], which is already PyTorch's [out, in] for a Linear (and [V, D] for the
    embedding). Norms: the converter stored 1+w; HF's Gemma3RMSNorm multiplies by (1+w), so we
    subtract 1 in f32 and assert that adding 1 back in f32 reproduces the stored value exactly,
    i.e. HF's (1 + (w-1)) equals the GGUF scale bit for bit and nothing is lost.
    """
    reader = gguf.GGUFReader(path)
    sd = {}
    types = {}
    n_norm = 0
    for t in reader.tensors:
        if t.name in GGUF_TO_HF_GLOBAL:
            hf = GGUF_TO_HF_GLOBAL[t.name]
        else:
            blk, idx, base, suffix = t.name.split(".")
            assert blk == "blk" and suffix == "weight", t.name
            hf = f"model.layers.{int(idx)}.{GGUF_TO_HF_BLOCK[base]}.weight"
        ne = [int(x) for x in t.shape]
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.array(w, dtype=np.float32, copy=True).reshape(list(reversed(ne)))
        if t.name.endswith("norm.weight"):
            w1 = w - np.float32(1.0)
            assert np.array_equal(w1 + np.float32(1.0), w), f"(w-1)+1 != w in f32 for {t.name}"
            w = w1
            n_norm += 1
        assert hf not in sd, hf
        sd[hf] = torch.from_numpy(w)
        types[t.name] = t.tensor_type.name
    meta = {
        k: gguf_field(reader, k)
        for k in reader.fields
        if k.startswith("gemma3.") or k in ("general.architecture", "general.file_type")
    }
    return sd, types, n_norm, meta


def build_real_model(sd):
    cfg = Gemma3TextConfig(
        **REAL_CONFIG,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
        attn_implementation="eager",
    )
    # Normal construction (its random init is overwritten below), then a strict load of exactly
    # the GGUF tensors plus the tied head (the same tensor under the second name).
    model = Gemma3ForCausalLM(cfg)
    sd = dict(sd)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=True)
    assert not missing and not unexpected
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.eval()
    return model


def make_real(gguf_path):
    t_start = time.time()
    assert os.path.exists(gguf_path), f"missing {gguf_path}"
    sha = sha256_file(gguf_path)
    assert sha == GGUF_SHA256, f"unexpected GGUF sha256 {sha}"

    t0 = time.time()
    sd, types, n_norm, meta = load_gguf_state_dict(gguf_path)
    log(f"[real] dequantized {len(sd)} tensors ({n_norm} norms shifted by -1) in {time.time() - t0:.1f} s")
    # The GGUF's own hyper-parameters must agree with the config we build.
    assert meta["general.architecture"] == "gemma3"
    assert meta["gemma3.context_length"] == REAL_CONFIG["max_position_embeddings"]
    assert meta["gemma3.embedding_length"] == REAL_CONFIG["hidden_size"]
    assert meta["gemma3.block_count"] == REAL_CONFIG["num_hidden_layers"]
    assert meta["gemma3.feed_forward_length"] == REAL_CONFIG["intermediate_size"]
    assert meta["gemma3.attention.head_count"] == REAL_CONFIG["num_attention_heads"]
    assert meta["gemma3.attention.head_count_kv"] == REAL_CONFIG["num_key_value_heads"]
    assert meta["gemma3.attention.key_length"] == REAL_CONFIG["head_dim"]
    assert meta["gemma3.attention.value_length"] == REAL_CONFIG["head_dim"]
    assert meta["gemma3.attention.sliding_window"] == REAL_CONFIG["sliding_window"]
    assert meta["gemma3.rope.freq_base"] == 1_000_000.0
    assert np.float32(meta["gemma3.attention.layer_norm_rms_epsilon"]) == np.float32(1e-6)
    assert "gemma3.rope.scaling.type" not in meta  # no RoPE scaling for the 270M

    t0 = time.time()
    model = build_real_model(sd)
    log(f"[real] built Gemma3ForCausalLM f32 in {time.time() - t0:.1f} s")

    # --- tokenizer: transformers builds it from the GGUF metadata -----------------------------
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    for text, special, want in TOKENIZER_VECTORS:
        got = tok(text, add_special_tokens=special)["input_ids"]
        assert got == want, f"tokenizer mismatch on {text!r}: {got} != {want}"
    prompt_ids = []
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=True)["input_ids"]  # prepends <bos>=2; parses <start_of_turn>
        assert ids[0] == 2 and ids[1] != 2, ids[:3]
        prompt_ids.append(ids)
    assert prompt_ids[2][:4] == [2, 105, 2364, 107]  # <bos> <start_of_turn> user \n

    # --- per-prompt forward + greedy -----------------------------------------------------------
    results = []
    top1_all = set()
    for pi, ids in enumerate(prompt_ids):
        t0 = time.time()
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            logits = model(x, use_cache=False).logits[0].float()  # [T, V]
        lse = torch.logsumexp(logits.double(), dim=-1)  # f64 LSE of the f32 logits
        top = torch.topk(logits, REAL_TOPK, dim=-1)  # sorted descending
        top1_all.update(top.indices[:, 0].tolist())
        gen, step_logits = greedy_generate(model, x, REAL_NEW)
        margin = top2_margin(step_logits[:, 0, :])
        g_lse = torch.logsumexp(step_logits[:, 0, :].double(), dim=-1)
        g_top = torch.topk(step_logits[:, 0, :], REAL_TOPK, dim=-1)
        kv_diff, kv_mism = check_greedy_against_full_forward(model, x, gen, step_logits)
        # The first greedy step and the prompt's last-position logits are the same quantity
        # (prefill): they must agree closely.
        d_first = (step_logits[0, 0] - logits[-1]).abs().max().item()
        text = tok.decode(gen[0].tolist(), skip_special_tokens=False)
        dt = time.time() - t0
        results.append(dict(ids=ids, logits=logits, lse=lse, top=top, gen=gen[0], margin=margin,
                            g_lse=g_lse, g_top=g_top,
                            text=text, kv_diff=kv_diff, kv_mism=kv_mism, d_first=d_first, secs=dt))
        log(f"[real] P{pi}: T={len(ids)} {dt:.1f} s  min greedy margin={margin.min().item():.4f} "
            f"kv-vs-full max|dlogit|={kv_diff:.3g} argmax mismatches={kv_mism} "
            f"prefill-vs-generate-step0 max|dlogit|={d_first:.3g}")
        log(f"[real] P{pi} greedy text: {text!r}")

    # --- probe ids: 0..9, every prompt position's top-1 id, then random ids (seeded) -----------
    base = set(range(10)) | top1_all
    assert len(base) <= REAL_NPROBE
    rng = np.random.default_rng(SEED_PROBE_IDS)
    rest = np.setdiff1d(np.arange(REAL_CONFIG["vocab_size"]), np.array(sorted(base)))
    extra = rng.choice(rest, size=REAL_NPROBE - len(base), replace=False)
    probe_ids = np.sort(np.concatenate([np.array(sorted(base)), extra])).astype(np.int32)
    assert len(np.unique(probe_ids)) == REAL_NPROBE
    probe_idx = torch.from_numpy(probe_ids.astype(np.int64))

    # --- cross-check: transformers' own GGUF loader ---------------------------------------------
    hf_gguf = _crosscheck_hf_gguf_loader(gguf_path, model, prompt_ids, results)

    path = os.path.join(HERE, "gemma3_270m_ref.h5")

    def writer(f):
        attrs = _root_attrs()
        attrs.update({
            "gguf_file": os.path.basename(gguf_path),
            "gguf_sha256": sha,
            "probe_seed": SEED_PROBE_IDS,
            "embed_scale_f32": float(model.model.embed_tokens.embed_scale.item()),
            "hf_config_json": json.dumps(model.config.to_diff_dict(), sort_keys=True),
            "hf_gguf_loader": hf_gguf["status"],
            "hf_gguf_loader_max_abs_logit_diff": hf_gguf["logit_diff"],
            "hf_gguf_loader_max_abs_weight_diff": hf_gguf["weight_diff"],
            "tensor_types_json": json.dumps(types, sort_keys=True),
        })
        h5_attrs(f, attrs)
        h5_dset(f, "probe_ids", probe_ids, np.int32)
        for pi, r in enumerate(results):
            g = h5_group(f, f"p{pi}")
            h5_attrs(g, {
                "text": PROMPTS[pi],
                "greedy_text": r["text"],
                "kv_cache_vs_full_forward_max_abs_logit_diff": float(r["kv_diff"]),
                "kv_cache_vs_full_forward_argmax_mismatches": int(r["kv_mism"]),
            })
            h5_dset(g, "input_ids", np.array(r["ids"]), np.int32)
            h5_dset(g, "lse", r["lse"].numpy(), np.float64)
            h5_dset(g, "top_ids", r["top"].indices.numpy(), np.int32)
            h5_dset(g, "top_logits", r["top"].values.numpy(), np.float32)
            h5_dset(g, "probe_logits", r["logits"][:, probe_idx].numpy(), np.float32)
            h5_dset(g, "greedy", r["gen"].numpy(), np.int32)
            h5_dset(g, "greedy_margin", r["margin"].numpy(), np.float32)
            h5_dset(g, "greedy_lse", r["g_lse"].numpy(), np.float64)
            h5_dset(g, "greedy_top_ids", r["g_top"].indices.numpy(), np.int32)
            h5_dset(g, "greedy_top_logits", r["g_top"].values.numpy(), np.float32)

    write_h5_atomically(path, writer)
    size = os.path.getsize(path)
    assert size < 3 * 1024 * 1024, size
    log(f"[real] transformers GGUF loader: {hf_gguf['status']}; max|dlogit|={hf_gguf['logit_diff']}, "
        f"max|dweight|={hf_gguf['weight_diff']}")
    log(f"[real] wrote {path} ({size} bytes) in {time.time() - t_start:.1f} s total")
    return [path]


def _crosscheck_hf_gguf_loader(gguf_path, model, prompt_ids, results):
    """Loads the GGUF with transformers' own loader (from_pretrained(gguf_file=...)) and compares
    weights and logits with ours. Purely a cross-check of the name mapping / norm shift /
    reshape; the fixture never depends on it."""
    res = {"status": "not run", "logit_diff": -1.0, "weight_diff": -1.0}
    try:
        t0 = time.time()
        hf = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
            dtype=torch.float32, attn_implementation="eager").eval()
        ours = model.state_dict()
        theirs = hf.state_dict()
        assert set(ours) == set(theirs), set(ours) ^ set(theirs)
        wd = max((ours[k].float() - theirs[k].float()).abs().max().item() for k in ours)
        ld = 0.0
        for ids, r in zip(prompt_ids, results):
            with torch.no_grad():
                lg = hf(torch.tensor([ids]), use_cache=False).logits[0].float()
            ld = max(ld, (lg - r["logits"]).abs().max().item())
        # (no timing in the stored status: the file must not depend on how fast the machine is)
        log(f"[real] transformers GGUF loader + comparison took {time.time() - t0:.0f} s")
        res = {"status": f"ok ({type(hf).__name__})", "logit_diff": float(ld),
               "weight_diff": float(wd)}
        del hf, theirs
    except Exception as e:  # noqa: BLE001 -- record, never fail the fixture on this
        res["status"] = f"failed: {type(e).__name__}: {e}"[:500]
    gc.collect()
    return res


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["tiny", "real", "all"], default="all")
    ap.add_argument("--gguf", default=DEFAULT_GGUF, help="Gemma 3 270M Q4_K_M GGUF (sha256 checked)")
    args = ap.parse_args()
    quiet_transformers()
    setup_torch()
    t0 = time.time()
    log("versions: " + json.dumps(versions()))
    written = []
    if args.only in ("tiny", "all"):
        written += make_tiny()
    if args.only in ("real", "all"):
        written += make_real(args.gguf)
    log(f"total wall time {time.time() - t0:.1f} s")
    for p in written:
        log(f"  {os.path.relpath(p, os.path.dirname(HERE))}  {os.path.getsize(p):>9d} B  sha256 {sha256_file(p)}")


if __name__ == "__main__":
    main()
