#!/usr/bin/env python3
"""LoRA / QLoRA training reference for gemmarun (run by hand, never in CI).

Writes tests/ref/lora_ref.h5: what Hugging Face PEFT (LoRA, "all-linear") computes on the tiny random
Gemma 3 in tests/ref/tiny_gemma3_lora/ (f32 safetensors), once on the f32 base and once on a
bitsandbytes NF4 (double-quantized) base, on the CPU. tiny_gemma3_lora/ is tests/ref/tiny_gemma3/
with its embedding (= the tied LM head) scaled by EMBED_SCALE, written here: with tiny_gemma3's
N(0,1) embedding the model put ~all probability on one token (loss ~57 nats, top probability
>= 1 - 1.4e-7 on every target), so a cross-entropy that dropped every non-max term would still
have matched. Scaled, the loss is near ln V and no target is saturated (asserted below).

  /f32/...  /nf4/...   init  : PEFT's default LoRA init (A kaiming-uniform, B = 0), torch.manual_seed(0)
                       grad  : loss, logits and every LoRA gradient for random A and B (seed 1)
                       steps : 10 AdamW steps (linear warmup schedule, grad clipping) on the full batch
                       accum : the same 10 steps as 2 micro-batches x gradient accumulation 2
  /f32/rslora          use_rslora=True, r=8, alpha=16: loss + gradients for random A and B
  /f32/dropout         lora_dropout=0.1 evaluated in eval mode (dropout off): equals /f32/grad/loss
  /multichunk          a second random Gemma 3 (tests/ref/tiny_gemma3_v9k/, written here: vocabulary
                       9,000 > one LM-head chunk of 8,192 columns) on 2 x 300 tokens, 558 targets >
                       one chunk of 512 rows: loss + gradients for random A and B, then 3 AdamW steps
                       from them, so the trainer's multi-chunk online log-sum-exp meets PEFT
  /nf4/quant, /nf4/... the exact NF4 quantization state of every quantized Linear, the NF4 and
                       nested (dynamic 8-bit) code tables, a verification of the dequantization
                       formula against bitsandbytes, and one extra tensor that spans several
                       nested (256-block) groups.

Usage:  /opt/refvenv/bin/python tests/ref/make_lora_ref.py [--out PATH]
Layout and semantics: tests/ref/README.md, section "make_lora_ref.py".

Determinism: seeds fixed, torch pinned to 1 thread with deterministic algorithms, HDF5 objects
written without timestamps, attributes in sorted order and free of paths/dates: two runs give
byte-identical files (the script prints the sha256).

bitsandbytes-on-CPU trap (checked below): `bnb.nn.Linear4bit.forward` on a CPU with AVX512-BF16,
when the module is in eval mode and the input does not require grad, REPACKS the weight in place
into a CPU-specific layout and from then on computes in bf16 (`gemv_4bit` CPU kernel), even in
train mode. All NF4 computations here therefore run with the model in train mode (lora_dropout is
0, Gemma 3 has no other dropout), and the script asserts that no module was repacked.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bitsandbytes as bnb  # noqa: E402
import bitsandbytes.functional as bnbF  # noqa: E402
import h5py  # noqa: E402
import peft  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from transformers import BitsAndBytesConfig, Gemma3ForCausalLM, get_linear_schedule_with_warmup  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC_MODEL_DIR = os.path.join(HERE, "tiny_gemma3")
MODEL_DIR = os.path.join(HERE, "tiny_gemma3_lora")
MC_MODEL_DIR = os.path.join(HERE, "tiny_gemma3_v9k")
EMBED_SCALE = 0.1              # tiny_gemma3_lora = tiny_gemma3 with embedding x EMBED_SCALE
MAX_TOP_PROB = 0.5             # de-saturation: no supervised target's top probability above this

# ---------------------------------------------------------------------------------------------
# Fixed choices (all recorded in the file)
# ---------------------------------------------------------------------------------------------
SEED_DATA = 20250401           # numpy generator for the token ids
SEED_INIT = 0                  # torch.manual_seed before get_peft_model (PEFT default init)
SEED_RANDOM_AB = 1             # torch.Generator for the random A/B of grad/, rslora/, dropout/
SEED_QUANT_EXTRA = 20250402    # torch.Generator for the extra NF4 test tensor

B, T = 4, 16
LENGTHS = [16, 13, 11, 9]      # real (non-pad) length of each sequence; right padding with id 0
PROMPT_LENS = [5, 3, 6, 2]     # labels = -100 on positions < prompt_len (and on padding)
PAD_ID = 0
VOCAB = 512

LORA_R, LORA_ALPHA = 4, 8
RSLORA_R, RSLORA_ALPHA = 8, 16
A_RANGE = 0.5                  # random A ~ U(-0.5, 0.5)
B_STD = 0.1                    # random B ~ N(0, 0.1^2)

N_STEPS = 10
LR, BETAS, EPS, WD = 2e-3, (0.9, 0.999), 1e-8, 0.01
WARMUP = 2
MAX_GRAD_NORM = 1.0
MICRO_BATCHES = [[0, 1], [2, 3]]

# /multichunk: vocabulary and supervised rows above one LM-head chunk (gm_train.h GM_LM_VOCAB 8192,
# GM_LM_ROWS 512)
MC_SEED_WEIGHTS = 20251202
MC_SEED_DATA = 20251203
MC_VOCAB = 9000
MC_B, MC_T = 2, 300
MC_LENGTHS = [300, 290]
MC_PROMPT_LENS = [10, 20]
MC_EMBED_STD = 0.1
MC_STEPS, MC_WARMUP = 3, 0

NF4_BLOCK, NESTED_BLOCK = 64, 256
QUANT_EXTRA_SHAPE = (40, 832)  # 33280 elements = 520 NF4 blocks = 3 nested groups (256, 256, 8)
W_STORED_MODULE = "model.layers.0.self_attn.q_proj"


def log(*a):
    print(*a, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def setup_torch():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def versions():
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "bitsandbytes": bnb.__version__,
        "safetensors": safetensors.__version__,
        "h5py": h5py.__version__,
        "numpy": np.__version__,
    }


# --- HDF5 writing without timestamps (same helpers as make_ref.py) ----------------------------


def h5_group(parent, name):
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    gid = h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl)
    return h5py.Group(gid)


def h5_path(root, path):
    """Returns the group at 'a/b/c' below root, creating missing levels without timestamps."""
    g = root
    for part in path.split("/"):
        if not part:
            continue
        g = g[part] if part in g else h5_group(g, part)
    return g


def h5_dset(group, name, arr, dtype):
    arr = np.asarray(arr, dtype=dtype)
    if arr.ndim:  # 0-d stays a true HDF5 scalar (np.ascontiguousarray would make it shape (1,))
        arr = np.ascontiguousarray(arr)
    group.create_dataset(name, data=arr, track_times=False)


def h5_attrs(obj, d):
    for k in sorted(d):
        obj.attrs[k] = d[k]


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def make_data(seed=SEED_DATA, shape=(B, T), lengths=LENGTHS, prompt_lens=PROMPT_LENS, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    nb, nt = shape
    ids = np.full((nb, nt), PAD_ID, dtype=np.int64)
    mask = np.zeros((nb, nt), dtype=np.int64)
    labels = np.full((nb, nt), -100, dtype=np.int64)
    for b in range(nb):
        n, p = lengths[b], prompt_lens[b]
        ids[b, :n] = rng.integers(4, vocab, size=n)
        mask[b, :n] = 1
        labels[b, p:n] = ids[b, p:n]
    # supervised shifted targets: labels[:, 1:] != -100 (position 0 is never a target)
    n_sup = int((labels[:, 1:] != -100).sum())
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "labels": torch.from_numpy(labels),
        "n_supervised": n_sup,
    }


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def save_model_dir(out_dir, config_bytes, weights):
    """config.json as given + model.safetensors (deterministic: sorted keys, fixed metadata)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "wb") as f:
        f.write(config_bytes)
    safetensors.torch.save_file({k: weights[k].contiguous() for k in sorted(weights)},
                                os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def make_lora_model_dir():
    """tests/ref/tiny_gemma3_lora: tiny_gemma3 with its embedding (tied LM head) x EMBED_SCALE."""
    with open(os.path.join(SRC_MODEL_DIR, "config.json"), "rb") as f:
        cfg = f.read()
    w = safetensors.torch.load_file(os.path.join(SRC_MODEL_DIR, "model.safetensors"))
    w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"] * np.float32(EMBED_SCALE)
    save_model_dir(MODEL_DIR, cfg, w)


def make_mc_model_dir():
    """tests/ref/tiny_gemma3_v9k: a random Gemma 3 with a 9,000-entry vocabulary (2 layers, width 32).
    Weights: embedding N(0, MC_EMBED_STD^2), norms N(0, 0.3^2) (effective scale 1 + w), Linears
    N(0, 1/fan_in), from torch.Generator(MC_SEED_WEIGHTS) in named_parameters order."""
    from transformers import Gemma3TextConfig
    cfg = Gemma3TextConfig(
        vocab_size=MC_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, rms_norm_eps=1e-6, sliding_window=16,
        max_position_embeddings=512, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}},
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2, attn_implementation="eager")
    model = Gemma3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(MC_SEED_WEIGHTS)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "embed_tokens" in n:
                p.copy_(torch.randn(p.shape, generator=g) * MC_EMBED_STD)
            elif "norm" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        with open(os.path.join(d, "config.json"), "rb") as f:
            cfg_bytes = f.read()
    w = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_model_dir(MC_MODEL_DIR, cfg_bytes, w)


def load_base(kind, model_dir=MODEL_DIR):
    common = dict(dtype=torch.float32, attn_implementation="eager")
    if kind == "f32":
        m = Gemma3ForCausalLM.from_pretrained(model_dir, **common)
    elif kind == "nf4":
        q = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
            bnb_4bit_quant_storage=torch.uint8,
        )
        m = Gemma3ForCausalLM.from_pretrained(MODEL_DIR, quantization_config=q, device_map="cpu", **common)
    else:
        raise ValueError(kind)
    # Train mode from the start (see the module docstring: eval mode would make bnb repack the
    # NF4 weights for its bf16 CPU kernel). Gemma 3 has no dropout, so train == eval numerically.
    m.train()
    assert m.config.attention_dropout == 0.0
    return m


def lora_config(r=LORA_R, alpha=LORA_ALPHA, dropout=0.0, rslora=False):
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules="all-linear",
        bias="none",
        use_rslora=rslora,
        task_type="CAUSAL_LM",
    )


def make_peft(base, cfg, seed=SEED_INIT):
    torch.manual_seed(seed)
    pm = get_peft_model(base, cfg)
    pm.train()
    return pm


def adapter_params(pm):
    """{state-dict key (as saved in adapter_model.safetensors): live nn.Parameter}, in state-dict order."""
    sd = get_peft_model_state_dict(pm)
    named = dict(pm.named_parameters())
    out = {}
    for k in sd:
        # live parameter names carry the adapter name: ...lora_A.default.weight
        live = k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        p = named[live]
        assert p.requires_grad, live
        out[k] = p
    trainable = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert len(trainable) == len(out), "only the LoRA A/B matrices may be trainable"
    return out


def saved_keys(pm):
    """Keys save_pretrained really writes into adapter_model.safetensors."""
    with tempfile.TemporaryDirectory() as d:
        pm.save_pretrained(d)
        st = safetensors.torch.load_file(os.path.join(d, "adapter_model.safetensors"))
        with open(os.path.join(d, "adapter_config.json")) as f:
            cfg = json.load(f)
    return list(st.keys()), {k: tuple(v.shape) for k, v in st.items()}, cfg


def snapshot(params):
    return {k: p.detach().clone() for k, p in params.items()}


def load_weights(params, weights):
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(weights[k])


def random_ab(params, seed=SEED_RANDOM_AB):
    """A ~ U(-0.5, 0.5) as (torch.rand - 0.5), B ~ N(0,1)*0.1, drawn from one torch.Generator(seed)
    in state-dict key order (one draw of the full tensor shape per key)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, p in params.items():
        if ".lora_A." in k:
            w = torch.rand(p.shape, generator=g, dtype=torch.float32) * (2 * A_RANGE) - A_RANGE
        else:
            assert ".lora_B." in k
            w = torch.randn(p.shape, generator=g, dtype=torch.float32) * B_STD
        out[k] = w
    return out


def forward_loss(pm, data, rows=None, num_items=None):
    ids, mask, labels = data["input_ids"], data["attention_mask"], data["labels"]
    if rows is not None:
        ids, mask, labels = ids[rows], mask[rows], labels[rows]
    kw = {}
    if num_items is not None:
        kw["num_items_in_batch"] = torch.tensor(num_items)
    out = pm(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False, **kw)
    return out.loss, out.logits


def max_target_prob(logits, labels):
    """Largest softmax probability at any supervised position (saturation check)."""
    lg = logits.double()[:, :-1].reshape(-1, logits.shape[-1])
    keep = labels[:, 1:].reshape(-1) != -100
    return float(torch.softmax(lg[keep], -1).max())


def manual_loss_f64(logits, labels, denom=None):
    """HF ForCausalLMLoss recomputed in f64 (check only)."""
    lg = logits.double()[:, :-1].reshape(-1, logits.shape[-1])
    tg = labels[:, 1:].reshape(-1)
    keep = tg != -100
    lp = torch.log_softmax(lg[keep], -1)
    nll = -lp[torch.arange(int(keep.sum())), tg[keep]]
    return float(nll.sum() / (denom if denom is not None else keep.sum()))


def grads_of(params):
    return {k: p.grad.detach().clone() for k, p in params.items()}


def zero_grads(params):
    for p in params.values():
        p.grad = None


def train_steps(pm, params, data, accum, n_steps=N_STEPS, warmup=WARMUP):
    """n_steps AdamW steps as HF Trainer does them. Returns (loss[n], lr[n], grad_norm[n], final weights)."""
    plist = list(params.values())
    opt = torch.optim.AdamW(plist, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=n_steps)
    losses, lrs, norms = [], [], []
    for _ in range(n_steps):
        zero_grads(params)
        if not accum:
            loss, _ = forward_loss(pm, data)
            loss.backward()
            total = float(loss.detach())
        else:
            # HF Trainer with num_items_in_batch: each micro-batch loss = sum of its token losses /
            # supervised tokens of the whole accumulated batch; no further division by accum steps.
            n_items = data["n_supervised"]
            total = 0.0
            for rows in MICRO_BATCHES:
                loss, _ = forward_loss(pm, data, rows=rows, num_items=n_items)
                loss.backward()
                total += float(loss.detach())
        lrs.append(opt.param_groups[0]["lr"])
        gn = torch.nn.utils.clip_grad_norm_(plist, max_norm=MAX_GRAD_NORM)
        norms.append(float(gn))
        losses.append(total)
        opt.step()
        sched.step()
    zero_grads(params)
    return np.array(losses), np.array(lrs), np.array(norms), snapshot(params)


# ---------------------------------------------------------------------------------------------
# NF4
# ---------------------------------------------------------------------------------------------


def nf4_state(mod):
    """Raw NF4 quantization state of a bnb Linear4bit (double quant)."""
    w = mod.weight
    qs = w.quant_state
    assert qs.quant_type == "nf4" and qs.blocksize == NF4_BLOCK and qs.nested
    assert qs.state2.blocksize == NESTED_BLOCK and qs.dtype == torch.float32
    assert not getattr(qs, "packing_format_for_cpu", False), "weight was repacked for the bf16 CPU kernel"
    assert w.dtype == torch.uint8
    return {
        "packed": w.data.reshape(-1).numpy().copy(),
        "absmax_code": qs.absmax.numpy().copy(),
        "absmax2": qs.state2.absmax.numpy().copy(),
        "offset": np.float32(qs.offset.item()),
        "shape": tuple(qs.shape),
        "code": qs.code.numpy().copy(),
        "nested_code": qs.state2.code.numpy().copy(),
        "qs": qs,
    }


def dequant_formula(st, nf4, nested_code):
    """The documented formula, numpy f32, each operation rounded to f32 in this order:
         s_b = nested_code[absmax_code[b]] * absmax2[b // 256]   (f32 multiply)
         a_b = s_b + offset                                       (f32 add)
         w_e = nf4[nibble_e] * a_b                                (f32 multiply)
       element e lives in byte e//2, even e in the HIGH nibble; block b = e // 64 (flattened row-major)."""
    packed = st["packed"]
    n = int(np.prod(st["shape"]))
    nib = np.empty(packed.size * 2, dtype=np.uint8)
    nib[0::2] = packed >> 4
    nib[1::2] = packed & 0x0F
    nib = nib[:n]
    nb = st["absmax_code"].size
    b = np.arange(nb)
    s = nested_code[st["absmax_code"]].astype(np.float32) * st["absmax2"][b // NESTED_BLOCK].astype(np.float32)
    a = (s + np.float32(st["offset"])).astype(np.float32)
    e = np.arange(n)
    w = nf4[nib].astype(np.float32) * a[e // NF4_BLOCK]
    return w.astype(np.float32).reshape(st["shape"]), a


def _ceil_log2(x):
    return 1 if x <= 2 else int(x - 1).bit_length()


def _multi_row_sum(rows):
    """torch aten/src/ATen/native/cpu/SumKernel.cpp multi_row_sum: 4-level cascade over axis 0."""
    f = np.float32
    size, nl = rows.shape[0], 4
    lp = max(4, _ceil_log2(size) // nl)
    step, lmask = 1 << lp, (1 << lp) - 1
    acc = np.zeros((nl,) + rows.shape[1:], f)
    i = 0
    while i + step <= size:
        for _ in range(step):
            acc[0] = (acc[0] + rows[i]).astype(f)
            i += 1
        for j in range(1, nl):
            acc[j] = (acc[j] + acc[j - 1]).astype(f)
            acc[j - 1] = 0
            if i & (lmask << (j * lp)):
                break
    while i < size:
        acc[0] = (acc[0] + rows[i]).astype(f)
        i += 1
    for j in range(1, nl):
        acc[0] = (acc[0] + acc[j]).astype(f)
    return acc[0]


def torch_sum_f32(x, lanes=8):
    """Bit-exact replica of torch's 1-thread CPU float32 sum of a contiguous 1-D tensor
    (vectorized_inner_sum: Vectorized<float> of 8 lanes - the AVX2 kernel, which torch also
    dispatches on AVX512 CPUs -, row_sum with 4 interleaved accumulators + multi_row_sum cascade;
    then scalar tail, then the 8 lanes added in order). Checked against torch below."""
    f = np.float32
    x = np.asarray(x, f).reshape(-1)
    n = x.size
    vs = n // lanes
    if vs == 0:  # scalar path: 4 interleaved accumulators
        si = n // 4
        p = _multi_row_sum(x[:si * 4].reshape(si, 4)) if si else np.zeros(4, f)
        for i in range(si * 4, n):
            p[0] = f(p[0] + x[i])
        for k in range(1, 4):
            p[0] = f(p[0] + p[k])
        return f(p[0])
    vec = x[:vs * lanes].reshape(vs, lanes)
    si = vs // 4
    p = _multi_row_sum(vec[:si * 4].reshape(si, 4, lanes)) if si else np.zeros((4, lanes), f)
    for i in range(si * 4, vs):
        p[0] = (p[0] + vec[i]).astype(f)
    for k in range(1, 4):
        p[0] = (p[0] + p[k]).astype(f)
    fin = f(0)
    for k in range(vs * lanes, n):
        fin = f(fin + x[k])
    for lane in range(lanes):
        fin = f(fin + p[0][lane])
    return fin


def quantize_replica(w, nf4, nested_code):
    """numpy re-implementation of bnb 0.50 CPU quantize_4bit(compress_statistics=True) (check only).

    Level 1 (bitsandbytes/backends/default/ops.py quantize_4bit): absmax_b = max|x| over 64;
    scaled = clamp(x * f32(1/absmax_b), -1, 1); q = bucketize(scaled, midpoints) (a value exactly on
    a midpoint goes to the lower index); pack (q[2i] << 4) | q[2i+1].
    Level 2 (functional.quantize_4bit, then bnb's native CPU quantize_blockwise, csrc/cpu_ops.cpp
    quantize_cpu_impl + build_quantize_lut in bnb >= 0.50): offset = torch f32 mean of absmax =
    f32(torch_sum_f32(absmax) / n_blocks); d = f32(absmax - offset); per group of 256:
    absmax2 = max|d|, inv = f32(1 / absmax2), v = clamp(f32(d * inv), -1, 1),
    j = trunc(f32(f32(f32(v + 1) * 0.5) * 65535) + 0.5)  (a 16-bit bin), code = lut[j] where
    lut[i] = #{k : mid[k] < f32(-1 + f32(2*i) / 65535)}, mid[k] = f32(0.5 * f32(c[k] + c[k+1])),
    c = the 256-entry dynamic map. NOTE: this LUT is NOT the exact nearest code: values within ~1/65535
    of a midpoint (and everything near 0, where the map is finer than the bins) can get a neighbour."""
    x = w.reshape(-1).astype(np.float32)
    n = x.size
    nb = -(-n // NF4_BLOCK)
    xp = np.zeros(nb * NF4_BLOCK, np.float32)
    xp[:n] = x
    blk = xp.reshape(nb, NF4_BLOCK)
    absmax = np.abs(blk).max(1).astype(np.float32)
    inv = (np.float32(1.0) / np.maximum(absmax, np.float32(1e-38))).astype(np.float32)
    scaled = np.clip(blk * inv[:, None], -1, 1).astype(np.float32).reshape(-1)[:n]
    mid = ((nf4[:-1] + nf4[1:]) / np.float32(2)).astype(np.float32)
    q = np.searchsorted(mid, scaled, side="left").astype(np.uint8)
    if q.size % 2:
        q = np.append(q, np.uint8(0))
    packed = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    offset = np.float32(torch_sum_f32(absmax) / np.float32(absmax.size))
    d = (absmax - offset).astype(np.float32)
    ng = -(-nb // NESTED_BLOCK)
    absmax2 = np.array([np.abs(d[g * NESTED_BLOCK:(g + 1) * NESTED_BLOCK]).max() for g in range(ng)], np.float32)
    f = np.float32
    c = nested_code.astype(f)
    mid = (f(0.5) * (c[:-1] + c[1:]).astype(f)).astype(f)
    grid = (f(-1.0) + ((f(2.0) * np.arange(65536).astype(f)).astype(f) / f(65535)).astype(f)).astype(f)
    lut = np.searchsorted(mid, grid, side="left").astype(np.uint8)
    inv = (f(1.0) / absmax2).astype(f)[np.arange(nb) // NESTED_BLOCK]
    v = np.clip((d * inv).astype(f), f(-1), f(1)).astype(f)
    j = (((((v + f(1)).astype(f) * f(0.5)).astype(f) * f(65535)).astype(f) + f(0.5)).astype(f)).astype(np.int64)
    idx = lut[j]
    return {"packed": packed, "absmax_code": idx, "absmax2": absmax2, "offset": offset}


def replica_matches(st, rep):
    return {
        "packed": bool(np.array_equal(st["packed"], rep["packed"])),
        "absmax_code": bool(np.array_equal(st["absmax_code"], rep["absmax_code"])),
        "absmax2": bool(np.array_equal(st["absmax2"].view(np.uint32), rep["absmax2"].view(np.uint32))),
        "offset": bool(np.float32(st["offset"]).view(np.uint32) == np.float32(rep["offset"]).view(np.uint32)),
    }


def max_abs_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0


def nf4_quant_section(base, f32_weights, out):
    """Quantization state of every Linear4bit + dequant/matmul checks. Fills out[...]."""
    mods = {n: m for n, m in base.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    plain = sorted(n for n, m in base.named_modules() if type(m) is torch.nn.Linear)
    assert plain == ["lm_head"], plain
    names = list(mods)  # module order
    nf4 = None
    nested_code = None
    quant = {}
    max_diff = 0.0
    all_bit_exact = True
    replica = {"packed": True, "absmax_code": True, "absmax2": True, "offset": True}
    requant_equal = True
    for name in names:
        st = nf4_state(mods[name])
        if nf4 is None:
            nf4, nested_code = st["code"], st["nested_code"]
        assert np.array_equal(nf4, st["code"]) and np.array_equal(nested_code, st["nested_code"])
        # bitsandbytes' own dequantization (the path the training forward/backward uses)
        ref = bnbF.dequantize_4bit(mods[name].weight.data, st["qs"]).numpy()
        mine, _ = dequant_formula(st, nf4, nested_code)
        exact = np.array_equal(mine.view(np.uint32), ref.view(np.uint32))
        all_bit_exact &= exact
        max_diff = max(max_diff, max_abs_diff(mine, ref))
        # same bytes as quantizing the f32 checkpoint weight with bnb's public API?
        w = f32_weights[name + ".weight"]
        pq, qs2 = bnbF.quantize_4bit(w.clone(), blocksize=NF4_BLOCK, compress_statistics=True, quant_type="nf4",
                                     quant_storage=torch.uint8)
        requant_equal &= (np.array_equal(pq.reshape(-1).numpy(), st["packed"])
                          and np.array_equal(qs2.absmax.numpy(), st["absmax_code"])
                          and np.array_equal(qs2.state2.absmax.numpy(), st["absmax2"])
                          and float(qs2.offset) == float(st["offset"]))
        rm = replica_matches(st, quantize_replica(w.numpy(), nf4, nested_code))
        for k in replica:
            replica[k] &= rm[k]
        quant[name] = {"st": st, "w": w.numpy() if name == W_STORED_MODULE else None}
    # extra tensor spanning 3 nested groups (the model's tensors have <= 128 blocks = 1 group)
    g = torch.Generator().manual_seed(SEED_QUANT_EXTRA)
    wx = torch.randn(QUANT_EXTRA_SHAPE, generator=g, dtype=torch.float32) * 0.05
    wx.view(-1)[::997] *= 8.0  # a few outliers so the block scales vary a lot
    pq, qsx = bnbF.quantize_4bit(wx.clone(), blocksize=NF4_BLOCK, compress_statistics=True, quant_type="nf4",
                                 quant_storage=torch.uint8)
    stx = {
        "packed": pq.reshape(-1).numpy().copy(), "absmax_code": qsx.absmax.numpy().copy(),
        "absmax2": qsx.state2.absmax.numpy().copy(), "offset": np.float32(qsx.offset.item()),
        "shape": QUANT_EXTRA_SHAPE,
    }
    assert np.array_equal(qsx.state2.code.numpy(), nested_code) and np.array_equal(qsx.code.numpy(), nf4)
    refx = bnbF.dequantize_4bit(pq, qsx).numpy()
    minex, _ = dequant_formula(stx, nf4, nested_code)
    exact_x = np.array_equal(minex.view(np.uint32), refx.view(np.uint32))
    rmx = replica_matches(stx, quantize_replica(wx.numpy(), nf4, nested_code))
    assert stx["absmax2"].size == 3
    out.update(dict(nf4=nf4, nested_code=nested_code, quant=quant, names=names,
                    dequant_max_diff=max(max_diff, max_abs_diff(minex, refx)),
                    dequant_bit_exact=bool(all_bit_exact and exact_x), requant_equal=bool(requant_equal),
                    replica=replica, replica_extra=rmx,
                    extra=dict(w=wx.numpy(), st=stx, dequant=refx)))
    assert all_bit_exact and exact_x, "dequantization formula is not bit-exact"
    return mods


def check_linear4bit_matmul(mods, data_x):
    """Does the Linear4bit forward (train mode) equal F.linear(x, dequant(W)) bit for bit, and is
    the backward grad_x = grad_y @ dequant(W)? Returns (fwd max diff, bwd max diff)."""
    fwd = 0.0
    bwd = 0.0
    for name in (W_STORED_MODULE, "model.layers.3.mlp.down_proj"):
        mod = mods[name]
        assert mod.training
        st = nf4_state(mod)
        W = torch.from_numpy(dequant_formula(st, st["code"], st["nested_code"])[0])
        x = data_x(mod.in_features).requires_grad_(True)
        y = mod(x)
        gy = torch.ones_like(y) * 0.5 + torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape) * 1e-3
        y.backward(gy)
        y_ref = torch.nn.functional.linear(x.detach(), W)
        gx_ref = torch.matmul(gy, W)
        fwd = max(fwd, float((y.detach() - y_ref).abs().max()))
        bwd = max(bwd, float((x.grad - gx_ref).abs().max()))
    return fwd, bwd


# ---------------------------------------------------------------------------------------------
# Experiments per base
# ---------------------------------------------------------------------------------------------


def run_base(kind, data, f32_weights):
    t0 = time.time()
    res = {"kind": kind}
    base = load_base(kind)
    if kind == "nf4":
        # non-quantized parameters (embedding = tied head, norms) must be the checkpoint's exactly
        for n, p in base.named_parameters():
            if p.dtype == torch.float32:
                assert torch.equal(p, f32_weights[n]), n
        mods = nf4_quant_section(base, f32_weights, res)
        g = torch.Generator().manual_seed(7)
        fwd, bwd = check_linear4bit_matmul(mods, lambda k: torch.randn(3, 5, k, generator=g))
        res["matmul_fwd_diff"], res["matmul_bwd_diff"] = fwd, bwd
        assert fwd == 0.0 and bwd == 0.0, (fwd, bwd)
        for m in mods.values():
            m.zero_grad(set_to_none=True)

    pm = make_peft(base, lora_config())
    params = adapter_params(pm)
    keys, shapes, saved_cfg = saved_keys(pm)
    # adapter_model.safetensors lists its keys sorted; same names as get_peft_model_state_dict
    assert sorted(keys) == sorted(params), "save_pretrained keys differ from get_peft_model_state_dict keys"
    keys = list(params)  # keep state-dict (module) order
    res["keys"] = keys
    res["shapes"] = {k: list(v) for k, v in shapes.items()}
    # target_modules is a set inside PEFT: its saved order depends on Python's string hashing
    saved_cfg["target_modules"] = sorted(saved_cfg["target_modules"])
    res["saved_config"] = saved_cfg
    res["target_modules"] = sorted(pm.peft_config["default"].target_modules)
    res["targeted_module_names"] = list(pm.targeted_module_names)
    scalings = {float(m.scaling["default"]) for m in pm.modules() if isinstance(m, LoraLayer)}
    assert scalings == {LORA_ALPHA / LORA_R}, scalings
    res["lora_layer_types"] = sorted({type(m).__module__ + "." + type(m).__qualname__
                                      for m in pm.modules() if isinstance(m, LoraLayer)})

    # 1. init
    init = snapshot(params)
    res["init"] = init

    # 2. grad with random A, B
    wr = random_ab(params)
    load_weights(params, wr)
    zero_grads(params)
    loss, logits = forward_loss(pm, data)
    loss.backward()
    res["grad"] = dict(weights=wr, loss=float(loss.detach()), grads=grads_of(params),
                       logits=logits.detach().float().numpy(),
                       loss_f64_check=manual_loss_f64(logits.detach(), data["labels"]),
                       max_top_prob=max_target_prob(logits.detach(), data["labels"]))
    assert res["grad"]["max_top_prob"] < MAX_TOP_PROB, ("saturated", res["grad"]["max_top_prob"])
    zero_grads(params)

    # 3. steps
    load_weights(params, init)
    res["steps"] = dict(zip(("loss", "lr", "grad_norm", "final"), train_steps(pm, params, data, accum=False)))

    # 4. accum
    load_weights(params, init)
    res["accum"] = dict(zip(("loss", "lr", "grad_norm", "final"), train_steps(pm, params, data, accum=True)))
    fa, fs = res["accum"]["final"], res["steps"]["final"]
    res["accum"]["max_abs_diff_final"] = max(float((fa[k] - fs[k]).abs().max()) for k in fa)
    res["accum"]["max_abs_diff_loss"] = max_abs_diff(res["accum"]["loss"], res["steps"]["loss"])
    res["accum"]["max_abs_diff_grad_norm"] = max_abs_diff(res["accum"]["grad_norm"], res["steps"]["grad_norm"])

    if kind == "nf4":
        for n, m in pm.named_modules():
            if isinstance(m, bnb.nn.Linear4bit):
                assert not getattr(m.weight.quant_state, "packing_format_for_cpu", False), n
    res["seconds"] = time.time() - t0
    return res


def run_multichunk():
    """PEFT on tiny_gemma3_v9k: loss + grads at random A/B, then MC_STEPS AdamW steps from them."""
    data = make_data(MC_SEED_DATA, (MC_B, MC_T), MC_LENGTHS, MC_PROMPT_LENS, MC_VOCAB)
    assert data["n_supervised"] > 512, data["n_supervised"]
    base = load_base("f32", MC_MODEL_DIR)
    pm = make_peft(base, lora_config())
    params = adapter_params(pm)
    wr = random_ab(params)
    load_weights(params, wr)
    zero_grads(params)
    loss, logits = forward_loss(pm, data)
    loss.backward()
    res = dict(data=data, weights=wr, loss=float(loss.detach()), grads=grads_of(params),
               loss_f64_check=manual_loss_f64(logits.detach(), data["labels"]),
               max_top_prob=max_target_prob(logits.detach(), data["labels"]),
               keys=list(params))
    assert res["max_top_prob"] < MAX_TOP_PROB, res["max_top_prob"]
    zero_grads(params)
    load_weights(params, wr)
    res["steps"] = dict(zip(("loss", "lr", "grad_norm", "final"),
                            train_steps(pm, params, data, accum=False, n_steps=MC_STEPS, warmup=MC_WARMUP)))
    return res


def run_rslora(data):
    base = load_base("f32")
    pm = make_peft(base, lora_config(r=RSLORA_R, alpha=RSLORA_ALPHA, rslora=True))
    params = adapter_params(pm)
    scal = {float(m.scaling["default"]) for m in pm.modules() if isinstance(m, LoraLayer)}
    assert len(scal) == 1
    scaling = scal.pop()
    assert scaling == RSLORA_ALPHA / math.sqrt(RSLORA_R), scaling
    wr = random_ab(params)
    load_weights(params, wr)
    loss, logits = forward_loss(pm, data)
    loss.backward()
    return dict(weights=wr, loss=float(loss.detach()), grads=grads_of(params), scaling=scaling,
                shapes={k: list(p.shape) for k, p in params.items()})


def run_dropout(data, grad_loss):
    base = load_base("f32")
    pm = make_peft(base, lora_config(dropout=0.1))
    params = adapter_params(pm)
    drops = {type(m).__name__ for n, m in pm.named_modules() if n.endswith("lora_dropout.default")}
    assert drops == {"Dropout"}, drops
    load_weights(params, random_ab(params))
    pm.eval()  # f32 base: eval mode is safe (no bnb modules)
    with torch.no_grad():
        loss, _ = forward_loss(pm, data)
    loss = float(loss)
    return dict(loss_eval=loss, equal=(loss == grad_loss))


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def write_tensors(g, d):
    for k in d:
        h5_dset(g, k, d[k].numpy() if torch.is_tensor(d[k]) else d[k], np.float32)


def write_base(f, res):
    kind = res["kind"]
    root = h5_path(f, kind)
    h5_attrs(root, {
        "base": "f32 safetensors weights" if kind == "f32" else
                "NF4 double-quant (bnb, blocksize 64, nested 256, compute f32) for every Linear except lm_head",
        "scaling": np.float64(LORA_ALPHA / LORA_R),
        "lora_layer_types": json.dumps(res["lora_layer_types"]),
    })
    write_tensors(h5_path(root, "init"), res["init"])

    gr = h5_path(root, "grad")
    h5_dset(gr, "loss", np.float64(res["grad"]["loss"]), np.float64)
    h5_dset(gr, "logits", res["grad"]["logits"], np.float32)
    write_tensors(h5_path(gr, "weights"), res["grad"]["weights"])
    write_tensors(h5_path(gr, "grads"), res["grad"]["grads"])
    h5_attrs(gr, {"loss_recomputed_f64_from_logits": np.float64(res["grad"]["loss_f64_check"]),
                  "max_target_top_probability": np.float64(res["grad"]["max_top_prob"]),
                  "random_ab": f"torch.Generator().manual_seed({SEED_RANDOM_AB}); for each key in state-dict "
                               f"order: lora_A = torch.rand(shape)*{2 * A_RANGE} - {A_RANGE}; "
                               f"lora_B = torch.randn(shape)*{B_STD}"})

    for name in ("steps", "accum"):
        s = res[name]
        g = h5_path(root, name)
        h5_dset(g, "loss", s["loss"], np.float64)
        h5_dset(g, "lr", s["lr"], np.float64)
        h5_dset(g, "grad_norm", s["grad_norm"], np.float64)
        write_tensors(h5_path(g, "final"), s["final"])
        if name == "accum":
            h5_attrs(g, {"max_abs_diff_final_vs_steps": np.float64(s["max_abs_diff_final"]),
                         "max_abs_diff_loss_vs_steps": np.float64(s["max_abs_diff_loss"]),
                         "max_abs_diff_grad_norm_vs_steps": np.float64(s["max_abs_diff_grad_norm"]),
                         "micro_batches": json.dumps(MICRO_BATCHES)})

    if kind == "nf4":
        h5_dset(root, "code", res["nf4"], np.float32)
        h5_dset(root, "nested_code", res["nested_code"], np.float32)
        h5_dset(root, "dequant_check_max_abs_diff", np.float64(res["dequant_max_diff"]), np.float64)
        h5_attrs(root, {
            "dequant_bit_exact": np.int32(res["dequant_bit_exact"]),
            "dequant_formula": "w[e] = f32(nf4[nib(e)] * f32(f32(nested_code[absmax_code[b]] * absmax2[b//256]) "
                               "+ offset)), b = e//64, nib(e) = packed[e//2] >> 4 if e even else packed[e//2] & 15",
            "quantized_equals_bnb_quantize_4bit_of_f32_weight": np.int32(res["requant_equal"]),
            "quantize_replica_matches_model": json.dumps(res["replica"], sort_keys=True),
            "quantize_replica_matches_extra": json.dumps(res["replica_extra"], sort_keys=True),
            "linear4bit_fwd_vs_linear_dequant_max_abs_diff": np.float64(res["matmul_fwd_diff"]),
            "linear4bit_bwd_vs_matmul_dequant_max_abs_diff": np.float64(res["matmul_bwd_diff"]),
            "quantized_modules": json.dumps(res["names"]),
        })
        qg = h5_path(root, "quant")
        for name in res["names"]:
            st = res["quant"][name]["st"]
            g = h5_path(qg, name)
            h5_dset(g, "packed", st["packed"], np.uint8)
            h5_dset(g, "absmax_code", st["absmax_code"], np.uint8)
            h5_dset(g, "absmax2", st["absmax2"], np.float32)
            h5_dset(g, "offset", st["offset"], np.float32)
            h5_attrs(g, {"shape": np.array(st["shape"], np.int64)})
            if res["quant"][name]["w"] is not None:
                h5_dset(g, "w", res["quant"][name]["w"], np.float32)
        ex = res["extra"]
        g = h5_path(root, "quant_extra")
        h5_dset(g, "w", ex["w"], np.float32)
        h5_dset(g, "packed", ex["st"]["packed"], np.uint8)
        h5_dset(g, "absmax_code", ex["st"]["absmax_code"], np.uint8)
        h5_dset(g, "absmax2", ex["st"]["absmax2"], np.float32)
        h5_dset(g, "offset", ex["st"]["offset"], np.float32)
        h5_dset(g, "dequant", ex["dequant"], np.float32)
        h5_attrs(g, {"shape": np.array(QUANT_EXTRA_SHAPE, np.int64),
                     "how": f"w = torch.randn({QUANT_EXTRA_SHAPE}, generator=Generator(seed {SEED_QUANT_EXTRA}))*0.05, "
                            "w.view(-1)[::997] *= 8; bitsandbytes.functional.quantize_4bit(w, blocksize=64, "
                            "compress_statistics=True, quant_type='nf4'); dequant = bnb dequantize_4bit"})


def write_multichunk(f, mc):
    g = h5_path(f, "multichunk")
    d = mc["data"]
    h5_attrs(g, {"model_dir": "tests/ref/tiny_gemma3_v9k", "vocab_size": np.int32(MC_VOCAB),
                 "lengths": np.array(MC_LENGTHS, np.int32), "prompt_lengths": np.array(MC_PROMPT_LENS, np.int32),
                 "n_supervised": np.int32(d["n_supervised"]), "seed_data": np.int64(MC_SEED_DATA),
                 "seed_weights": np.int64(MC_SEED_WEIGHTS),
                 "why": "vocabulary 9000 > GM_LM_VOCAB 8192 and supervised rows > GM_LM_ROWS 512: the trainer's "
                        "LM head runs in 2 x 2 chunks with an online log-sum-exp"})
    h5_dset(g, "input_ids", d["input_ids"].numpy(), np.int32)
    h5_dset(g, "attention_mask", d["attention_mask"].numpy(), np.int32)
    h5_dset(g, "labels", d["labels"].numpy(), np.int32)
    gr = h5_path(g, "grad")
    h5_dset(gr, "loss", np.float64(mc["loss"]), np.float64)
    write_tensors(h5_path(gr, "weights"), mc["weights"])
    write_tensors(h5_path(gr, "grads"), mc["grads"])
    h5_attrs(gr, {"loss_recomputed_f64_from_logits": np.float64(mc["loss_f64_check"]),
                  "max_target_top_probability": np.float64(mc["max_top_prob"])})
    st = h5_path(g, "steps")
    h5_dset(st, "loss", mc["steps"]["loss"], np.float64)
    h5_dset(st, "lr", mc["steps"]["lr"], np.float64)
    h5_dset(st, "grad_norm", mc["steps"]["grad_norm"], np.float64)
    write_tensors(h5_path(st, "final"), mc["steps"]["final"])
    h5_attrs(st, {"how": f"{MC_STEPS} steps from grad/weights, the same AdamW / clipping as /f32/steps, "
                         f"get_linear_schedule_with_warmup(warmup={MC_WARMUP}, total={MC_STEPS})"})


def write_file(path, data, results, rslora, dropout, mc):
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    f32 = results["f32"]
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        attrs = {f"version_{k}": str(v) for k, v in versions().items()}
        attrs.update({
            "generator": "tests/ref/make_lora_ref.py",
            "model_dir": "tests/ref/tiny_gemma3_lora",
            "embed_scale_vs_tiny_gemma3": np.float64(EMBED_SCALE),
            "torch_num_threads": np.int32(torch.get_num_threads()),
            "lora_config": json.dumps(dict(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                           target_modules="all-linear", bias="none", use_rslora=False,
                                           init_lora_weights=True, task_type="CAUSAL_LM"), sort_keys=True),
            "target_modules_resolved": json.dumps(f32["target_modules"]),
            "targeted_module_names": json.dumps(f32["targeted_module_names"]),
            "adapter_keys": json.dumps(f32["keys"]),
            "adapter_shapes": json.dumps([f32["shapes"][k] for k in f32["keys"]]),
            "adapter_config_json": json.dumps({k: f32["saved_config"][k] for k in sorted(f32["saved_config"])
                                               if k not in ("base_model_name_or_path",)}, default=str),
            "seed_init": np.int32(SEED_INIT),
            "seed_random_ab": np.int32(SEED_RANDOM_AB),
            "seed_data": np.int64(SEED_DATA),
            "optimizer": f"torch.optim.AdamW(lr={LR}, betas={BETAS}, eps={EPS}, weight_decay={WD}) over the LoRA "
                         f"params (state-dict order); get_linear_schedule_with_warmup(warmup={WARMUP}, "
                         f"total={N_STEPS}); clip_grad_norm_(max_norm={MAX_GRAD_NORM}) before each step; "
                         "scheduler.step() after optimizer.step()",
            "lengths": np.array(LENGTHS, np.int32),
            "prompt_lengths": np.array(PROMPT_LENS, np.int32),
            "n_supervised": np.int32(data["n_supervised"]),
        })
        h5_attrs(f, attrs)
        h5_dset(f, "input_ids", data["input_ids"].numpy(), np.int32)
        h5_dset(f, "attention_mask", data["attention_mask"].numpy(), np.int32)
        h5_dset(f, "labels", data["labels"].numpy(), np.int32)
        for kind in ("f32", "nf4"):
            write_base(f, results[kind])
        g = h5_path(f, "f32/rslora")
        h5_dset(g, "loss", np.float64(rslora["loss"]), np.float64)
        write_tensors(h5_path(g, "weights"), rslora["weights"])
        write_tensors(h5_path(g, "grads"), rslora["grads"])
        h5_attrs(g, {"r": np.int32(RSLORA_R), "lora_alpha": np.int32(RSLORA_ALPHA), "use_rslora": np.int32(1),
                     "scaling": np.float64(rslora["scaling"])})
        g = h5_path(f, "f32/dropout")
        h5_dset(g, "loss_eval", np.float64(dropout["loss_eval"]), np.float64)
        h5_attrs(g, {"lora_dropout": np.float64(0.1), "equals_grad_loss": np.int32(dropout["equal"])})
        write_multichunk(f, mc)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "lora_ref.h5"))
    args = ap.parse_args()
    t0 = time.time()
    setup_torch()
    make_lora_model_dir()
    make_mc_model_dir()
    data = make_data()
    f32_weights = safetensors.torch.load_file(os.path.join(MODEL_DIR, "model.safetensors"))
    results = {k: run_base(k, data, f32_weights) for k in ("f32", "nf4")}
    assert results["f32"]["keys"] == results["nf4"]["keys"]
    assert results["f32"]["target_modules"] == results["nf4"]["target_modules"]
    for k in results["f32"]["init"]:
        assert torch.equal(results["f32"]["init"][k], results["nf4"]["init"][k]), k
    rslora = run_rslora(data)
    dropout = run_dropout(data, results["f32"]["grad"]["loss"])
    mc = run_multichunk()
    write_file(args.out, data, results, rslora, dropout, mc)

    f32, nf4 = results["f32"], results["nf4"]
    log(f"versions: {versions()}")
    log(f"target modules: {f32['target_modules']}  ({len(f32['targeted_module_names'])} modules, "
        f"{len(f32['keys'])} tensors); layer types {f32['lora_layer_types']} / {nf4['lora_layer_types']}")
    log(f"first keys: {f32['keys'][:2]}")
    log(f"n_supervised {data['n_supervised']}")
    for r in (f32, nf4):
        log(f"[{r['kind']}] grad/loss {r['grad']['loss']!r} (f64 recomputation {r['grad']['loss_f64_check']!r})")
        log(f"[{r['kind']}] steps/loss {r['steps']['loss'].tolist()}")
        log(f"[{r['kind']}] steps/lr {r['steps']['lr'].tolist()}")
        log(f"[{r['kind']}] steps/grad_norm {r['steps']['grad_norm'].tolist()}")
        log(f"[{r['kind']}] accum/loss {r['accum']['loss'].tolist()}")
        log(f"[{r['kind']}] accum-vs-steps max|diff| final {r['accum']['max_abs_diff_final']:.3g}, "
            f"loss {r['accum']['max_abs_diff_loss']:.3g}, grad_norm {r['accum']['max_abs_diff_grad_norm']:.3g}; "
            f"{r['seconds']:.1f} s")
    log(f"[nf4] dequant bit-exact {nf4['dequant_bit_exact']} (max diff {nf4['dequant_max_diff']}), "
        f"HF-loaded == bnb quantize_4bit(f32 w): {nf4['requant_equal']}, replica {nf4['replica']} "
        f"extra {nf4['replica_extra']}, Linear4bit fwd/bwd vs dequant f32 matmul: "
        f"{nf4['matmul_fwd_diff']} / {nf4['matmul_bwd_diff']}")
    for r in (f32, nf4):
        log(f"[{r['kind']}] largest top probability at a target {r['grad']['max_top_prob']:.4f} (ln V = {math.log(VOCAB):.4f})")
    log(f"multichunk: n_supervised {mc['data']['n_supervised']}, loss {mc['loss']!r} (f64 {mc['loss_f64_check']!r}, "
        f"ln V = {math.log(MC_VOCAB):.4f}), largest top probability {mc['max_top_prob']:.4f}; "
        f"steps/loss {mc['steps']['loss'].tolist()}")
    for dd in (MODEL_DIR, MC_MODEL_DIR):
        for fn in ("config.json", "model.safetensors"):
            pth = os.path.join(dd, fn)
            log(f"wrote {os.path.relpath(pth, HERE)}: {os.path.getsize(pth)} bytes, sha256 {sha256_file(pth)}")
    log(f"rslora: scaling {rslora['scaling']!r} loss {rslora['loss']!r}")
    log(f"dropout: eval loss {dropout['loss_eval']!r} equals grad/loss: {dropout['equal']}")
    log(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, sha256 {sha256_file(args.out)}")
    log(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
