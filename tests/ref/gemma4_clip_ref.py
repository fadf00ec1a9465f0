"""Gemma 4's clipped linears in the fixture scripts (make_gemma4_vision_ref.py,
make_gemma4_audio_ref.py; run by hand, never in CI): finding them, setting their clamp bounds where
no value lies near a bound, the share of values each clamp moves, and the model's PEFT LoRA copy.

A tower forward is the caller's `run(model)` (model: the plain model or its PEFT copy)."""
import copy

import peft
import torch
from transformers.models.gemma4.modeling_gemma4 import Gemma4ClippableLinear


def clipped(model):
    """(name, module) of every Gemma4ClippableLinear of model, in forward (registration) order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Gemma4ClippableLinear)]


def clamp_values(model, run, target, io):
    """The values clamp `target` (index into clipped()) meets in run(model): its input ("in") or its
    linear's output after the input clamp ("out"), as float64."""
    _, m = clipped(model)[target]
    got = {}

    def keep(x):  # (a hook that returns None: it changes nothing)
        got.setdefault("x", x.detach().double().flatten())

    if io == "in":
        h = m.register_forward_pre_hook(lambda mod, args: keep(args[0]))
    else:
        h = m.linear.register_forward_hook(lambda mod, args, out: keep(out))
    with torch.no_grad():
        run(model)
    h.remove()
    return got["x"]


def set_clip_bounds(models, run, seed, k=20, k_max=None, min_gap=0.0):
    """Sets every clip buffer of each of `models` (the model, and its PEFT copy with the drawn LoRA
    adapters) to the same values, clamp after clamp in forward order: for each side a quantile u of
    the values the model's clamp meets, u ~ U(0.01, 0.06) from torch.Generator(seed), moved to the
    middle of the widest gap, among the 2k + 1 nearest ranks, of the values that clamp meets in all of
    `models` (so no value lies near a bound: no flip between float32 and float64 or between
    implementations); where that gap is under 2 min_gap, among the 4k + 1, 8k + 1, ... nearest (k at
    most k_max); where none of those is 2 min_gap wide either (the values crowd: silu's outputs piled
    at its minimum, -0.2785), the bound goes 10 min_gap past every value (that side clips nothing).
    min_gap 0 (the default): the first gap, as the vision fixture was made. Returns the smallest
    distance of any value to its bound and the sides so placed ("<module> input min", ...)."""
    k_max = k if k_max is None else k_max
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mm in models:
            for _, m in clipped(mm):
                for b, v in (("input_min", -1), ("input_max", 1), ("output_min", -1), ("output_max", 1)):
                    getattr(m, b).fill_(v * float("inf"))
    margin, crowded = float("inf"), []
    for j in range(len(clipped(models[0]))):
        for io in ("in", "out"):
            vals = [clamp_values(mm, run, j, io) for mm in models]
            union = torch.cat(vals).sort().values
            u = 0.01 + 0.05 * torch.rand(2, generator=g, dtype=torch.float64)
            lo_hi = []
            for q in (u[0], 1 - u[1]):
                t = torch.quantile(vals[0], q)
                i = int(torch.searchsorted(union, t))
                kk = k
                while True:  # widened where the values crowd
                    lo, hi = max(i - kk, 0), min(i + kk, len(union) - 1)
                    gaps = union[lo + 1:hi + 1] - union[lo:hi]
                    w = int(gaps.argmax())
                    if float(gaps[w]) / 2 >= min_gap or kk >= k_max:
                        break
                    kk *= 2
                if float(gaps[w]) / 2 >= min_gap:
                    lo_hi.append(float((union[lo + w] + union[lo + w + 1]) / 2))
                    margin = min(margin, float(gaps[w]) / 2)
                else:  # no room anywhere near: past every value, that side clips nothing
                    lo_hi.append(float(union[0] - 10 * min_gap if q < 0.5 else union[-1] + 10 * min_gap))
                    margin = min(margin, 10 * min_gap)
                    crowded.append(f"{clipped(models[0])[j][0]} {io}put {'min' if q < 0.5 else 'max'}")
            with torch.no_grad():
                for mm in models:
                    m = clipped(mm)[j][1]
                    (m.input_min if io == "in" else m.output_min).fill_(lo_hi[0])
                    (m.input_max if io == "in" else m.output_max).fill_(lo_hi[1])
    return margin, crowded


def clip_fractions(model, run):
    """{module name: [share of its inputs the input clamp moves, share of its linear's outputs the
    output clamp moves]} in run(model)."""
    fr, handles = {}, []

    def pre(name):
        def hook(mod, args):
            x = args[0]
            fr.setdefault(name, [None, None])[0] = float(((x < mod.input_min) | (x > mod.input_max)).double().mean())
        return hook

    def post(name, owner):
        def hook(mod, args, out):
            fr[name][1] = float(((out < owner.output_min) | (out > owner.output_max)).double().mean())
        return hook

    for n, m in clipped(model):
        handles.append(m.register_forward_pre_hook(pre(n)))
        handles.append(m.linear.register_forward_hook(post(n, m)))
    with torch.no_grad():
        run(model)
    for h in handles:
        h.remove()
    return fr


def lora_model_of(model, targets, seed, random_lora):
    """A copy of model under PEFT LoRA (r 4, alpha 8, dropout 0) on `targets`, its A and B drawn by
    random_lora(pm, seed) (make_vision_ref.random_lora)."""
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets)
    pm = peft.get_peft_model(copy.deepcopy(model), lcfg)
    pm.eval()  # dropout is 0 anyway
    random_lora(pm, seed)
    return pm
