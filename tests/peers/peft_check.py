#!/usr/bin/env python3
"""The PEFT side of the adapter round trips (tests/e2e/adapters_peft.sh), run in the peers venv
(tests/peers/setup.sh): real transformers + PEFT, float32, CPU, eager attention.

  peft_check.py compare --base BASE --adapter DIR --ids 2,5,7 --ours FILE --tol X [--last]
      PeftModel.from_pretrained(base, DIR) runs the ids; its logits are compared with FILE (ours:
      one number per line, position-major, T * V, or only the last position's V with --last).
      Passes when max |ours - PEFT| <= X and the adapter moves PEFT's own logits by more than
      EFFECT_FACTOR * X (so the comparison could fail: an adapter read as zero would be caught).
  peft_check.py make --base BASE --out DIR --r R --alpha A --targets q_proj,v_proj
                [--layers 0,2] [--rslora] [--dtype bfloat16] [--seed S] [--projector]
      PEFT itself makes a LoRA adapter with random A and B (init_lora_weights=False: B is not
      zero, so the adapter changes the output) and saves it with save_pretrained; --dtype stores
      the tensors in another dtype, as a bf16 training run would; --projector: on a multimodal
      base (Gemma3ForConditionalGeneration), the projector as modules_to_save, moved by N(0, 0.05)
      (the targets may name the vision tower's modules too: "q_proj,fc1" adapts both parts).

  peft_check.py merged --model DIR --ids 2,5,7 --ours FILE --ours-base FILE --tol X [--dtype bfloat16] [--last]
      A merged model folder (gemmarun export --format merged) loads in transformers
      (AutoModelForCausalLM, its weights in --dtype as config.json says); run in float32 its logits
      equal FILE (ours: the base with the adapter attached) within X, and the adapter moves ours
      by more than EFFECT_FACTOR * X against --ours-base (the base alone), so a merge that lost
      the adapter would fail.
      With --pixels FILE (as for vision): a multimodal merged folder, loaded as
      Gemma3ForConditionalGeneration with no missing, unexpected or mismatched weight and run on
      the ids with those images; with --base BASE (the multimodal base) also: the base's tower and
      projector put back move its logits by more than EFFECT_FACTOR * X (the merged image path
      counts: a tower adapter left unmerged or the base's projector kept would fail the comparison).
  peft_check.py tower --model DIR --ids 2,5,7 --ours FILE --tol X
      A text model with a new vision tower (gm.with_vision_tower: a Gemma3ForConditionalGeneration
      folder) loads in transformers with no missing or unexpected weight; the tower is drawn as
      transformers' own init draws it (normal(0, 0.02) linears, patch convolution, position
      embedding and - unlike transformers' zeros, gm_merged.h says why - the projector; zero biases
      and RMSNorm w; unit LayerNorm weights: each drawn tensor's mean and std within 5 standard
      errors of 0 and 0.02, the others exactly their constant); text-only, its logits equal FILE
      (ours) within X.
  peft_check.py vision --base BASE --adapter DIR --ids 2,509,511,511,511,511,510,7 --pixels FILE --ours FILE
                --tol X
      An adapter that trained the image path (LoRA on the vision tower, the projector as
      modules_to_save) on a multimodal base (Gemma3ForConditionalGeneration): PeftModel.from_pretrained
      loads it with no missing or unexpected key, the projector's saved weights in place; with the
      pixel values of FILE (one number per line: images x 3 x S x S) for the ids' image-token runs
      (token_type_ids marking them: each image seen whole) its logits equal --ours within X, and
      the adapter moves PEFT's own logits, and those of its image path alone (the same ids with
      the text adapters only), by more than EFFECT_FACTOR * X.
  peft_check.py audio --base BASE --adapter DIR --ids 2,431,471,...,470,7 --audio WAV --ours FILE --tol X
      An adapter that trained Gemma 3n's audio encoder (LoRA on its conformer, audio_targets) on a
      Gemma3nForConditionalGeneration base (its MobileNet-V5 vision tower not built: timm is not
      needed, no image is given): PeftModel.from_pretrained loads it with no missing or unexpected
      key; the clip WAV (16 kHz mono 16-bit: no resampling on either side) through
      Gemma3nAudioFeatureExtractor for the ids' run of audio soft tokens; its logits equal --ours
      within X, and the adapter moves PEFT's own logits, and so do its audio-encoder adapters alone
      (the same adapter with their B zeroed), by more than EFFECT_FACTOR * X. A Gemma 4 base
      (config.json's model_type "gemma4"): Gemma4ForConditionalGeneration and
      Gemma4AudioFeatureExtractor instead (its audio tower's LoRA inside the clipped linears).
  peft_check.py tokenizer --model DIR --cases FILE [--gguf FILE] [--chat TEXT --chat-ids FILE]
      AutoTokenizer.from_pretrained(DIR) encodes every text of FILE (tests/peers/tokens.lua: a
      JSON list of {text, ids}) to gemmarun's ids and decodes them back to the text; with --gguf
      transformers' own tokenizer of that GGUF gives the same ids too; with --chat the folder's
      chat template renders one user turn (with the generation prompt) to the ids in the file
      --chat-ids (comma-separated).

BASE: a Hugging Face folder, or a .gguf file (transformers' own GGUF loader dequantizes it to
float32, as gemmarun's kernels do block by block).
Prints one "ok"/"FAIL" line per check; exit status 1 when a check fails.
"""

import argparse
import json
import os
import struct
import sys

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

# The adapter must move the logits by more than this many tolerances for the comparison to count.
EFFECT_FACTOR = 10.0


def load_base(path):
    torch.manual_seed(0)
    torch.set_num_threads(2)
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    if path.endswith(".gguf"):
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path), **kw)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
    return model.eval()


def logits_of(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long))
    return out.logits[0].float().numpy()  # (T, V)


def report(ok, text):
    """Prints one check's line; returns 1 when it failed."""
    print(("ok    " if ok else "FAIL  ") + text)
    return 0 if ok else 1


def check_logits(what, ours, theirs, moved, moved_what, tol, V):
    """The three checks of a comparison of logits (flat, position-major): max |ours - theirs| <= tol;
    the adapter moves them (`moved`: with - without) by more than EFFECT_FACTOR * tol, so that an
    adapter read as zero would fail the first; the same argmax after the last position. Returns the
    number of failed checks."""
    diff, effect = float(np.max(np.abs(ours - theirs))), float(np.max(np.abs(moved)))
    same = int(np.argmax(ours[-V:])) == int(np.argmax(theirs[-V:]))
    moves = effect > EFFECT_FACTOR * tol
    return (report(diff <= tol, f"{what} = {diff:.3g} {'<=' if diff <= tol else '>'} {tol:g} over {ours.size} logits")
            + report(moves, f"the adapter moves {moved_what} by up to {effect:.3g} ({'>' if moves else 'not >'} "
                     f"{EFFECT_FACTOR:g} x the tolerance)")
            + report(same, f"{'same' if same else 'another'} next token after the last position"))


def cmd_compare(a):
    ids = [int(x) for x in a.ids.split(",")]
    base = load_base(a.base)
    plain = logits_of(base, ids)
    model = PeftModel.from_pretrained(base, a.adapter).eval()
    theirs = logits_of(model, ids)
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    if a.last:
        theirs, plain = theirs[-1:], plain[-1:]
    theirs, plain = theirs.reshape(-1).astype(np.float64), plain.reshape(-1).astype(np.float64)
    if ours.shape != theirs.shape:
        print(f"FAIL  {a.ours}: {ours.size} logits, PEFT gives {theirs.size}")
        return 1
    fails = check_logits("logits with the adapter: max |gemmarun - PEFT|", ours, theirs, theirs - plain, "PEFT's logits", a.tol,
                         base.config.vocab_size)
    return 1 if fails else 0


def cmd_vision(a):
    import warnings
    from safetensors.torch import load_file
    from transformers import Gemma3ForConditionalGeneration
    torch.manual_seed(0)
    torch.set_num_threads(2)
    fails = 0
    ids = torch.tensor([[int(x) for x in a.ids.split(",")]], dtype=torch.long)

    def base():
        return Gemma3ForConditionalGeneration.from_pretrained(a.base, dtype=torch.float32, attn_implementation="eager").eval()

    cfg = base().config
    S = cfg.vision_config.image_size
    pix = torch.tensor(np.loadtxt(a.pixels, dtype=np.float32).reshape(-1, 3, S, S))
    tt = (ids == cfg.image_token_id).long()

    def run(model):
        with torch.no_grad():
            return model(input_ids=ids, pixel_values=pix, token_type_ids=tt).logits[0].float().numpy().reshape(-1)

    plain = run(base())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base(), a.adapter).eval()
    bad = [str(w.message) for w in caught if "missing" in str(w.message).lower() or "unexpected" in str(w.message).lower()]
    fails += report(not bad, "PeftModel.from_pretrained: no missing or unexpected key" + ("" if not bad else ": " + bad[0][:300]))
    saved = load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    sd = model.state_dict()
    proj = [k for k in saved if "multi_modal_projector." in k]
    tower = [k for k in saved if "vision_tower." in k]
    placed = 0
    for k in proj:  # PEFT's live copy of a modules_to_save module: "<path>.modules_to_save.default.<param>"
        mod, _, param = k.rpartition(".")
        if mod.endswith("mm_soft_emb_norm"):
            mod, param = mod[: -len(".mm_soft_emb_norm")], "mm_soft_emb_norm." + param
        live = f"{mod}.modules_to_save.default.{param}"
        placed += live in sd and torch.equal(sd[live], saved[k])
    fails += report(len(proj) == 2 and placed == 2 and len(tower) > 0,
                    f"{len(tower)} tower LoRA tensors; the projector's {len(proj)} tensors loaded as modules_to_save ({placed} in place)")
    theirs = run(model)
    # the image path's share: PEFT with the adapter's text modules only
    text_only = get_peft_model(base(), LoraConfig(r=model.peft_config["default"].r,
                                                    lora_alpha=model.peft_config["default"].lora_alpha,
                                                    use_rslora=model.peft_config["default"].use_rslora,
                                                    target_modules=r"model\.language_model\.layers\.\d+\.(?:self_attn|mlp)\.\w+_proj"))
    text_sd = {k: v for k, v in saved.items() if "language_model." in k}
    from peft import set_peft_model_state_dict
    set_peft_model_state_dict(text_only, text_sd)
    image_effect = float(np.max(np.abs(theirs - run(text_only.eval()))))
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    if ours.shape != theirs.shape:
        print(f"FAIL  {a.ours}: {ours.size} logits, PEFT gives {theirs.size}")
        return 1
    fails += check_logits("logits with images and the adapter: max |gemmarun - PEFT|", ours, theirs.astype(np.float64),
                          theirs - plain, "PEFT's logits", a.tol, cfg.text_config.vocab_size)
    moves = image_effect > EFFECT_FACTOR * a.tol
    fails += report(moves, f"its image path (tower LoRA, projector) moves PEFT's logits by up to {image_effect:.3g} "
                    f"({'>' if moves else 'not >'} {EFFECT_FACTOR:g} x the tolerance)")
    return 1 if fails else 0


def cmd_merged(a):
    ids = [int(x) for x in a.ids.split(",")]
    fails = 0
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    with open(os.path.join(a.model, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    st = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[a.dtype]
    dtypes = sorted({v["dtype"] for v in header.values()})
    ok = cfg.get("dtype") == a.dtype and dtypes == [st]
    fails += report(ok, f"config.json says {a.dtype} and all {len(header)} tensors are {st}" if ok else
                    f"config.json dtype {cfg.get('dtype')}, tensors {dtypes}: expected {a.dtype} / {st}")
    torch.manual_seed(0)
    torch.set_num_threads(2)
    if a.pixels:
        return 1 if fails + merged_vision(a, ids) else 0
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    theirs = logits_of(model, ids)
    if a.last:
        theirs = theirs[-1:]
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    base = np.loadtxt(a.ours_base, dtype=np.float64).reshape(-1)
    theirs = theirs.reshape(-1).astype(np.float64)
    if ours.shape != theirs.shape or base.shape != ours.shape:
        print(f"FAIL  {a.ours}: {ours.size} logits, {a.ours_base}: {base.size}, transformers gives {theirs.size}")
        return 1
    fails += check_logits("merged model in transformers: max |gemmarun with the adapter - transformers|", ours, theirs, ours - base,
                          "the logits", a.tol, model.config.vocab_size)
    return 1 if fails else 0


def merged_vision(a, ids):
    """cmd_merged for a multimodal merged folder (--pixels): Gemma3ForConditionalGeneration loads it
    with no missing, unexpected or mismatched weight; with the images its logits equal --ours; with
    --base, putting the base's tower and projector back moves them by more than EFFECT_FACTOR x the
    tolerance (the merged image path - tower LoRA, trained projector - is in the folder and counts)."""
    from transformers import Gemma3ForConditionalGeneration

    def load(path, info=False):
        return Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                                              output_loading_info=info)

    fails = 0
    model, info = load(a.model, True)
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    n_tower = sum(1 for k in model.state_dict() if ".vision_tower." in k or ".multi_modal_projector." in k)
    fails += report(not bad and n_tower > 0, f"Gemma3ForConditionalGeneration loads every weight of the folder ({n_tower} of the "
                    "tower and projector), none missing or unexpected" if not bad else f"transformers' loading info: {bad}")
    cfg = model.config
    S = cfg.vision_config.image_size
    pix = torch.tensor(np.loadtxt(a.pixels, dtype=np.float32).reshape(-1, 3, S, S))
    t_ids = torch.tensor([ids], dtype=torch.long)
    tt = (t_ids == cfg.image_token_id).long()

    def run(m):
        with torch.no_grad():
            return m(input_ids=t_ids, pixel_values=pix, token_type_ids=tt).logits[0].float().numpy().reshape(-1)

    theirs = run(model).astype(np.float64)
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    base = np.loadtxt(a.ours_base, dtype=np.float64).reshape(-1)
    if ours.shape != theirs.shape or base.shape != ours.shape:
        print(f"FAIL  {a.ours}: {ours.size} logits, {a.ours_base}: {base.size}, transformers gives {theirs.size}")
        return 1
    fails += check_logits("merged multimodal model in transformers, with the image: max |gemmarun with the adapter - "
                          "transformers|", ours, theirs, ours - base, "the logits", a.tol, cfg.text_config.vocab_size)
    if a.base:
        b = load(a.base).eval()
        model.model.vision_tower.load_state_dict(b.model.vision_tower.state_dict())
        model.model.multi_modal_projector.load_state_dict(b.model.multi_modal_projector.state_dict())
        effect = float(np.max(np.abs(theirs - run(model))))
        moves = effect > EFFECT_FACTOR * a.tol
        fails += report(moves, f"its merged image path (tower LoRA, trained projector) moves transformers' logits by up to "
                        f"{effect:.3g} ({'>' if moves else 'not >'} {EFFECT_FACTOR:g} x the tolerance)")
    return fails


def cmd_tower(a):
    from safetensors.torch import load_file
    from transformers import Gemma3ForConditionalGeneration
    ids = [int(x) for x in a.ids.split(",")]
    fails = 0
    torch.set_num_threads(2)
    model, info = Gemma3ForConditionalGeneration.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager",
                                                                 output_loading_info=True)
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    fails += report(not bad, "transformers loads every weight of the folder, none missing or unexpected" if not bad else
                    f"transformers' loading info: {bad}")
    st = load_file(os.path.join(a.model, "model.safetensors"))
    wrong = []
    n_tower = 0
    for k, t in st.items():
        if not (k.startswith("vision_tower.") or k.startswith("multi_modal_projector.")):
            continue
        n_tower += 1
        if k.endswith(".bias") or "mm_soft_emb_norm" in k:
            ok = bool(torch.all(t == 0))
        elif "layer_norm" in k or "layernorm" in k:
            ok = bool(torch.all(t == 1))
        else:
            # 5 standard errors of the sample's mean and std for n draws of N(0, 0.02^2)
            n = t.numel()
            ok = abs(float(t.mean())) <= 5 * 0.02 / n ** 0.5 and abs(float(t.std()) - 0.02) <= 5 * 0.02 / (2 * n) ** 0.5
        if not ok:
            wrong.append(f"{k} (mean {float(t.mean()):.3g}, std {float(t.std()):.3g})")
    fails += report(n_tower > 0 and not wrong, f"the {n_tower} tower and projector tensors are drawn as transformers' init" if not wrong
                    else f"drawn otherwise: {wrong[:4]}")
    theirs = logits_of(model, ids).reshape(-1).astype(np.float64)
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    if ours.shape != theirs.shape:
        print(f"FAIL  {a.ours}: {ours.size} logits, transformers gives {theirs.size}")
        return 1
    diff = float(np.max(np.abs(ours - theirs)))
    fails += report(diff <= a.tol, f"text-only logits: max |gemmarun - transformers| = {diff:.3g} {'<=' if diff <= a.tol else '>'} "
                    f"{a.tol:g} over {ours.size} logits")
    return 1 if fails else 0


def cmd_tokenizer(a):
    from transformers import AutoTokenizer

    cases = json.load(open(a.cases))
    fails = 0
    tok = AutoTokenizer.from_pretrained(a.model)
    ref = None
    if a.gguf:
        ref = AutoTokenizer.from_pretrained(os.path.dirname(a.gguf) or ".", gguf_file=os.path.basename(a.gguf))
    bad = [c["text"] for c in cases if tok(c["text"])["input_ids"] != c["ids"]]
    if not bad:
        print(f"ok    the exported tokenizer ({type(tok).__name__}) gives gemmarun's ids on all {len(cases)} texts")
    else:
        fails += 1
        c = next(c for c in cases if c["text"] == bad[0])
        print(f"FAIL  the exported tokenizer differs on {len(bad)} of {len(cases)} texts, e.g. {bad[0]!r}: "
              f"{tok(bad[0])['input_ids'][:20]} vs gemmarun {c['ids'][:20]}")
    undec = [c["text"] for c in cases if tok.decode(c["ids"][1:]) != c["text"]]
    if not undec:
        print(f"ok    it decodes each back to its text")
    else:
        fails += 1
        print(f"FAIL  it decodes {len(undec)} texts to something else, e.g. {undec[0]!r} -> {tok.decode(next(c['ids'][1:] for c in cases if c['text'] == undec[0]))!r}")
    if ref is not None:
        bad = [c["text"] for c in cases if ref(c["text"])["input_ids"] != c["ids"]]
        if not bad:
            print(f"ok    transformers' own tokenizer of {os.path.basename(a.gguf)} gives the same ids on all {len(cases)} texts")
        else:
            fails += 1
            print(f"FAIL  transformers' tokenizer of the GGUF differs on {len(bad)} texts, e.g. {bad[0]!r}")
    if a.chat is not None:
        want = [int(x) for x in open(a.chat_ids).read().strip().split(",")]
        got = tok.apply_chat_template([{"role": "user", "content": a.chat}], add_generation_prompt=True, tokenize=True)
        got = list(got["input_ids"] if hasattr(got, "keys") else got)
        if got == want:
            print(f"ok    the folder's chat template renders a user turn to gemmarun's chat ids ({len(want)} tokens)")
        else:
            fails += 1
            print(f"FAIL  the folder's chat template gives {got[:24]}, gemmarun {want[:24]}")
    return 1 if fails else 0


def cmd_make(a):
    torch.manual_seed(a.seed)
    if a.projector:  # a multimodal base, its projector trained fully
        from transformers import Gemma3ForConditionalGeneration
        base = Gemma3ForConditionalGeneration.from_pretrained(a.base, dtype=torch.float32, attn_implementation="eager").eval()
    else:
        base = load_base(a.base)
    cfg = LoraConfig(
        r=a.r,
        lora_alpha=a.alpha,
        target_modules=a.targets.split(",") if "," in a.targets or a.targets.isidentifier() else a.targets,
        layers_to_transform=[int(x) for x in a.layers.split(",")] if a.layers else None,
        use_rslora=a.rslora,
        lora_dropout=0.0,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
        modules_to_save=["multi_modal_projector"] if a.projector else None,
    )
    model = get_peft_model(base, cfg)
    with torch.no_grad():  # the projector's trained copy moved off the base's
        for k, p in model.named_parameters():
            if "modules_to_save" in k:
                p.add_(torch.randn_like(p) * 0.05)
    if a.dtype != "float32":
        model = model.to(getattr(torch, a.dtype))
    model.save_pretrained(a.out)
    n = sum(1 for k in model.state_dict() if "lora_A" in k)
    print(f"ok    PEFT made a LoRA adapter: {n} modules, r={a.r}, alpha={a.alpha}, rslora={a.rslora}, {a.dtype}, in {a.out}")
    return 0


def load_gemma3n(path):
    """Gemma3nForConditionalGeneration from a folder whose vision_config needs timm's MobileNet-V5:
    an empty stand-in for the tower (never called: no image is given), as make_gemma3n_audio_ref.py
    builds the fixture."""
    from transformers import Gemma3nForConditionalGeneration
    from transformers.models.gemma3n import modeling_gemma3n

    class NoVisionTower(torch.nn.Module):
        pass

    real = modeling_gemma3n.AutoModel.from_config

    def from_config(cfg, **kw):
        return NoVisionTower() if getattr(cfg, "model_type", "") == "gemma3n_vision" else real(cfg, **kw)

    modeling_gemma3n.AutoModel.from_config = from_config
    try:
        return Gemma3nForConditionalGeneration.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    finally:
        modeling_gemma3n.AutoModel.from_config = real


def cmd_audio(a):
    import json
    import warnings
    import wave
    from safetensors.torch import load_file
    from transformers import Gemma3nAudioFeatureExtractor, Gemma4AudioFeatureExtractor, Gemma4ForConditionalGeneration
    g4 = json.load(open(os.path.join(a.base, "config.json"))).get("model_type") == "gemma4"
    load = (lambda p: Gemma4ForConditionalGeneration.from_pretrained(p, dtype=torch.float32, attn_implementation="eager")
            .eval()) if g4 else load_gemma3n
    torch.manual_seed(0)
    torch.set_num_threads(2)
    fails = 0
    ids = torch.tensor([[int(x) for x in a.ids.split(",")]], dtype=torch.long)
    with wave.open(a.audio, "rb") as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2, "a 16 kHz mono 16-bit WAV"
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    fx = (Gemma4AudioFeatureExtractor() if g4 else Gemma3nAudioFeatureExtractor())([x], return_tensors="pt")
    feats, mask = fx["input_features"], fx["input_features_mask"]

    def run(model):
        with torch.no_grad():
            return model(input_ids=ids, input_features=feats, input_features_mask=mask).logits[0].float().numpy().reshape(-1)

    plain = run(load(a.base))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(load(a.base), a.adapter).eval()
    bad = [str(w.message) for w in caught if "missing" in str(w.message).lower() or "unexpected" in str(w.message).lower()]
    fails += report(not bad, "PeftModel.from_pretrained: no missing or unexpected key" + ("" if not bad else ": " + bad[0][:300]))
    saved = load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    sd = model.state_dict()
    audio = [k for k in saved if ".audio_tower." in k]
    placed = sum(1 for k in audio if k.replace(".weight", ".default.weight") in sd
                 and torch.equal(sd[k.replace(".weight", ".default.weight")], saved[k]))
    fails += report(len(audio) > 0 and placed == len(audio),
                    f"{len(audio)} audio-encoder LoRA tensors of {len(saved)}, {placed} loaded in place")
    theirs = run(model)
    # the audio encoder's share: the same adapter with its encoder adapters' B zeroed
    with torch.no_grad():
        for k, p in model.named_parameters():
            if ".audio_tower." in k and "lora_B" in k:
                p.zero_()
    audio_effect = float(np.max(np.abs(theirs - run(model))))
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    if ours.shape != theirs.shape:
        print(f"FAIL  {a.ours}: {ours.size} logits, PEFT gives {theirs.size}")
        return 1
    fails += check_logits("logits with the clip and the adapter: max |gemmarun - PEFT|", ours, theirs.astype(np.float64),
                          theirs - plain, "PEFT's logits", a.tol, model.config.text_config.vocab_size)
    moves = audio_effect > EFFECT_FACTOR * a.tol
    fails += report(moves, f"its audio-encoder adapters move PEFT's logits by up to {audio_effect:.3g} "
                    f"({'>' if moves else 'not >'} {EFFECT_FACTOR:g} x the tolerance)")
    return 1 if fails else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--base", required=True)
    c.add_argument("--adapter", required=True)
    c.add_argument("--ids", required=True)
    c.add_argument("--ours", required=True)
    c.add_argument("--tol", type=float, required=True)
    c.add_argument("--last", action="store_true")
    m = sub.add_parser("make")
    m.add_argument("--base", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--r", type=int, default=4)
    m.add_argument("--alpha", type=float, default=8)
    m.add_argument("--targets", default="q_proj,v_proj")
    m.add_argument("--layers", default="")
    m.add_argument("--rslora", action="store_true")
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--projector", action="store_true")
    g = sub.add_parser("merged")
    g.add_argument("--model", required=True)
    g.add_argument("--ids", required=True)
    g.add_argument("--ours", required=True)
    g.add_argument("--ours-base", required=True)
    g.add_argument("--tol", type=float, required=True)
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--last", action="store_true")
    g.add_argument("--pixels", default="")
    g.add_argument("--base", default="")
    w = sub.add_parser("tower")
    w.add_argument("--model", required=True)
    w.add_argument("--ids", required=True)
    w.add_argument("--ours", required=True)
    w.add_argument("--tol", type=float, required=True)
    v = sub.add_parser("vision")
    v.add_argument("--base", required=True)
    v.add_argument("--adapter", required=True)
    v.add_argument("--ids", required=True)
    v.add_argument("--pixels", required=True)
    v.add_argument("--ours", required=True)
    v.add_argument("--tol", type=float, required=True)
    au = sub.add_parser("audio")
    au.add_argument("--base", required=True)
    au.add_argument("--adapter", required=True)
    au.add_argument("--ids", required=True)
    au.add_argument("--audio", required=True)
    au.add_argument("--ours", required=True)
    au.add_argument("--tol", type=float, required=True)
    t = sub.add_parser("tokenizer")
    t.add_argument("--model", required=True)
    t.add_argument("--cases", required=True)
    t.add_argument("--gguf", default="")
    t.add_argument("--chat", default=None)
    t.add_argument("--chat-ids", default="")
    a = p.parse_args()
    return {"compare": cmd_compare, "make": cmd_make, "merged": cmd_merged, "tower": cmd_tower, "tokenizer": cmd_tokenizer,
            "vision": cmd_vision, "audio": cmd_audio}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
