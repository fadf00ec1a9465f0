#!/usr/bin/env bash
# Adapters out and in through real PEFT (issue 13): `gemmarun export` writes a trial's adapter as a
# PEFT adapter folder that PeftModel.from_pretrained loads on the same base with the same logits,
# or as a GGUF LoRA file equal to what llama.cpp's converter makes of that folder;
# an adapter PEFT itself made (rsLoRA, a subset of modules and layers, bf16) gives PEFT's logits in
# gemmarun; export --best takes the trial the report ranks first; bad adapters get clear errors.
# The tiny random Gemma 3 with a tokenizer (tests/ref/tiny_gemma3_chat); the real 270M's round
# trip is in generate_real.sh. PEFT comes from the peers venv (tests/peers/setup.sh, run by CI).
set -u
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
BASE=$SRC/tests/ref/tiny_gemma3_chat
TOL=$(tol TOL_ADAPTER_PEER_TINY_ABS)
IDS=2,15,27,100,31,7,300
cd "$TMP" || exit 1
tiny_fixture "$SRC" 8

# logits NAME [ADAPTER [TRIAL]]: gemmarun's logits after every token of $IDS into results/NAME.txt
logits() {
  MODEL=${MODEL:-$BASE} IDS=$IDS OUT=results/$1.txt ADAPTER=${2:-} TRIAL=${3:-} "$GM" "$SRC/tests/peers/logits.lua" >/dev/null 2>&1
}

# four trials (2 lr x 2 seeds, 8 epochs: the two lr give different accuracies), and one more with
# an adapter on two modules of two layers
expect_run "the tiny sweep trains" 0 "written: results/tiny.md" -- env EPOCHS=8 "$GM" tiny.lua
sed -e 's/name = "tiny"/name = "tiny_sub"/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' \
    -e 's/max_length = 64,/max_length = 64, targets = "q_proj,v_proj", layers = {0, 1}, rslora = true,/' \
    -e 's/seeds = {1, 2},/seeds = {1},/' tiny.lua > tiny_sub.lua
expect_run "a trial adapting q_proj and v_proj of layers 0 and 1 (rsLoRA) trains" 0 "written: results/tiny_sub.md" -- env EPOCHS=8 "$GM" tiny_sub.lua
# and one whose adapters are no product of modules and layers (q_proj of layer 0, v_proj of layer 3):
# exported with a regular expression as target_modules
sed -e 's/name = "tiny"/name = "tiny_rx"/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' -e 's/seeds = {1, 2},/seeds = {1},/' \
    -e 's/max_length = 64,/max_length = 64, targets = [[.*layers\\.0\\.self_attn\\.q_proj|.*layers\\.3\\.self_attn\\.v_proj]],/' \
    tiny.lua > tiny_rx.lua
expect_run "a trial adapting q_proj of layer 0 and v_proj of layer 3 trains" 0 "written: results/tiny_rx.md" -- env EPOCHS=8 "$GM" tiny_rx.lua
expect_run "its export names exactly those two modules by a regular expression" 0 "model\\\\.layers\\\\.\(\?:0\)\\\\.self_attn\\\\.q_proj\|model\\\\.layers\\\\.\(\?:3\)\\\\.self_attn\\\\.v_proj" \
  -- bash -c "'$GM' export results/tiny_rx rx >/dev/null && python3 -c \"import json; print(json.load(open('rx/adapter_config.json'))['target_modules'])\""

# ---- export ----------------------------------------------------------------------------------
expect_run "export --trial 3 writes a PEFT adapter folder" 0 \
  "exported trial 3 \([0-9a-f]+\) of results/tiny: 42 LoRA modules, rank 4, alpha 8, as a PEFT adapter: out3/adapter_config.json, out3/adapter_model.safetensors" \
  -- "$GM" export results/tiny --trial 3 out3
# the file's tensors and config as PEFT writes them (checked with the standard library only)
check=$(python3 - <<'EOF'
import json, struct
b = open("out3/adapter_model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__", {})
c = json.load(open("out3/adapter_config.json"))
a = h["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
B = h["base_model.model.model.layers.5.mlp.down_proj.lora_B.weight"]
ok = (len(h) == 84 and meta == {"format": "pt"} and a["dtype"] == "F32" and a["shape"] == [4, 64] and B["shape"] == [64, 4]
      and n % 8 == 0 and c["peft_type"] == "LORA" and c["task_type"] == "CAUSAL_LM" and c["r"] == 4 and c["lora_alpha"] == 8
      and c["use_rslora"] is False and c["layers_to_transform"] is None
      and sorted(c["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
print("good" if ok else f"bad: {len(h)} tensors, meta {meta}, {a}, {B}, config {c}")
EOF
)
[ "$check" = good ] && { pass=$((pass + 1)); echo "ok    adapter_model.safetensors: 84 F32 tensors under PEFT's keys; adapter_config.json: LORA, r 4, alpha 8, the 7 modules"; } \
  || { fail=$((fail + 1)); echo "FAIL  the exported files: $check"; }
# what gemmarun reads back from the export is the trial's adapter, bit for bit
logits trial3 results/tiny 3; logits export3 out3; logits base
cmp -s results/trial3.txt results/export3.txt && ! cmp -s results/trial3.txt results/base.txt \
  && { pass=$((pass + 1)); echo "ok    the exported folder read back gives the trial's logits bit for bit (and not the base model's)"; } \
  || { fail=$((fail + 1)); echo "FAIL  logits of the exported folder differ from the trial's (or equal the base model's)"; }

expect_run "export of the sub-module trial: a module list and layers_to_transform" 0 "2 \(q_proj, v_proj\) x 2 layers" -- bash -c "
  '$GM' export results/tiny_sub sub >/dev/null && python3 -c \"
import json; c = json.load(open('sub/adapter_config.json'))
assert sorted(c['target_modules']) == ['q_proj', 'v_proj'] and c['layers_to_transform'] == [0, 1] and c['use_rslora'] is True, c
print('2 (q_proj, v_proj) x 2 layers')\""

# ---- --best --------------------------------------------------------------------------------
# the expected trial, from the trial files themselves: the lr whose trials' mean final accuracy is
# highest, then its trial with the highest accuracy
want=$(/usr/bin/python3 - <<'EOF'
import collections, glob, json, h5py
cells = collections.defaultdict(list)
for p in glob.glob("results/tiny/trial-*.h5"):
    with h5py.File(p) as f:
        cells[json.loads(f.attrs["config_json"])["lr"]].append((float(f["eval/final"].attrs["accuracy"]), -int(f.attrs["trial_index"])))
best = max(cells, key=lambda k: sum(a for a, _ in cells[k]) / len(cells[k]))
print(-max(cells[best])[1])
EOF
)
expect_run "export --best takes trial $want (the best lr's best seed) and says why" 0 \
  "best cell by accuracy \(final evaluation, higher is better\): lr=[0-9.]+, mean [0-9.]+ over 2 trials; its best trial: $want .*exported trial $want " \
  -- "$GM" export results/tiny --best outbest
expect_run "export --best with --trial is refused" 2 "give --best or --trial, not both" -- "$GM" export results/tiny --best --trial 1 x
expect_run "export without --trial from a folder of several trials lists them" 2 "holds 4 trials: give --trial INDEX or ID \(1 \(" \
  -- "$GM" export results/tiny x
expect_run "export --format other is refused" 2 "--format onnx: unknown format \(known: peft" -- "$GM" export results/tiny --trial 1 --format onnx x
expect_run "export --format gguf wants a .gguf file name" 2 "give OUT as a .gguf file name" -- "$GM" export results/tiny --trial 1 --format gguf x
expect_run "export --format gguf writes a llama.cpp adapter file" 0 "42 LoRA modules, rank 4, alpha 8, as a llama.cpp LoRA adapter: t3.gguf" \
  -- "$GM" export results/tiny --trial 3 --format gguf t3.gguf
expect_run "... an rsLoRA trial's" 0 "4 LoRA modules, rank 4, alpha 8 \(rsLoRA\), as a llama.cpp LoRA adapter: sub.gguf" \
  -- "$GM" export results/tiny_sub --format gguf sub.gguf

# ---- through real PEFT -----------------------------------------------------------------------
peers_python
if [ -z "$PEERS" ]; then
  skip_unless_ci "PEFT round trips: no Python with torch, transformers and peft (tests/peers/setup.sh installs them)"
else
  expect_run "PEFT loads the exported adapter on the same base: the same logits within $TOL" 0 \
    "ok +logits with the adapter.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$BASE" --adapter out3 --ids $IDS --ours results/trial3.txt --tol "$TOL"
  logits sub results/tiny_sub
  logits rx results/tiny_rx
  expect_run "... and the regular-expression adapter (2 modules)" 0 "ok +logits with the adapter.*ok +the adapter moves" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$BASE" --adapter rx --ids $IDS --ours results/rx.txt --tol "$TOL"
  expect_run "... and the sub-module adapter (2 modules x 2 layers)" 0 "ok +logits with the adapter.*ok +the adapter moves" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$BASE" --adapter sub --ids $IDS --ours results/sub.txt --tol "$TOL"
  # PEFT's own adapter: rsLoRA, q/v/down on layers 0, 2, 5, random B, saved in bf16
  expect_run "PEFT makes an adapter (rsLoRA, 3 modules x 3 layers, bf16)" 0 "ok +PEFT made a LoRA adapter: 9 modules" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" make --base "$BASE" --out made --r 6 --alpha 12 --targets q_proj,v_proj,down_proj \
       --layers 0,2,5 --rslora --dtype bfloat16
  logits made made
  expect_run "gemmarun applies PEFT's adapter with PEFT's logits within $TOL" 0 "ok +logits with the adapter.*ok +the adapter moves" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$BASE" --adapter made --ids $IDS --ours results/made.txt --tol "$TOL"
  expect_run "generate --adapter PEFT_FOLDER" 0 "." -- "$GM" generate "$BASE" --adapter made "a short note" --max-tokens 4
  # PEFT's exclude_modules takes modules out of target_modules' selection (q/v but not layer 0's q)
  "$PEERS" - "$BASE" <<'EOF' >/dev/null 2>&1
import sys, torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                             exclude_modules=["model.layers.0.self_attn.q_proj"])).save_pretrained("excl")
EOF
  logits excl excl
  expect_run "an adapter with exclude_modules (11 modules) gives PEFT's logits" 0 "ok +logits with the adapter.*ok +the adapter moves" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$BASE" --adapter excl --ids $IDS --ours results/excl.txt --tol "$TOL"
  # the GGUF adapter is what llama.cpp's own converter makes of the PEFT export (its copy in the
  # peers venv, tests/peers/setup.sh): the same keys and alpha, the same 84 tensors bit for bit;
  # the rsLoRA adapter carries alpha * sqrt(r) (llama.cpp scales by alpha / r and has no rsLoRA)
  CONV=$(dirname "$PEERS")/../share/llama.cpp/convert_lora_to_gguf.py
  if [ ! -r "$CONV" ]; then
    skip_unless_ci "the GGUF adapter against llama.cpp's convert_lora_to_gguf.py: not in $(dirname "$PEERS")/../share/llama.cpp"
  else
    "$PEERS" "$CONV" --base "$BASE" --outtype f32 --outfile conv3.gguf out3 > conv.log 2>&1
    cat > same_gguf.py <<'EOF'
import sys, gguf, numpy as np
a, b = gguf.GGUFReader(sys.argv[1]), gguf.GGUFReader(sys.argv[2])
kv = lambda r: {k: f.contents() for k, f in r.fields.items() if k.split(".")[0] in ("general", "adapter") and k != "general.name"}
ka, kb = kv(a), kv(b)
kb.pop("general.quantization_version", None)
ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
bad = [n for n in ta if n not in tb or list(ta[n].shape) != list(tb[n].shape) or ta[n].tensor_type != tb[n].tensor_type
       or not np.array_equal(np.asarray(ta[n].data), np.asarray(tb[n].data))]
ok = ka == kb and set(ta) == set(tb) and not bad
print(f"same: {len(ta)} tensors, {ka}" if ok else f"differ: ours {ka} vs {kb}; tensors {sorted(set(ta) ^ set(tb))[:4]} {bad[:4]}")
sub = {k: f.contents() for k, f in gguf.GGUFReader(sys.argv[3]).fields.items()}
print(f"rslora alpha {sub['adapter.lora.alpha']:g}")
EOF
    expect_run "our GGUF adapter equals llama.cpp's converter's output bit for bit; rsLoRA alpha 8 x sqrt(4) = 16" 0 \
      "same: 84 tensors, \{'general.architecture': 'gemma3', 'general.type': 'adapter', 'adapter.type': 'lora', 'adapter.lora.alpha': 8.0\}.*rslora alpha 16" \
      -- "$PEERS" same_gguf.py t3.gguf conv3.gguf sub.gguf
  fi
fi

# ---- merged models ----------------------------------------------------------------------------
# the base with trial 3's adapter merged in, as a Hugging Face folder: transformers loads it (f32:
# the logits of gemmarun with the adapter attached, within TOL_MERGED_PEER_TINY_ABS; bf16, the
# default: within the weights' bf16 rounding), and so does gemmarun; the tokenizer is the base's
TOLM=$(tol TOL_MERGED_PEER_TINY_ABS)
expect_run "export --format merged --dtype f32 writes a Hugging Face folder" 0 \
  "merged trial 3 \([0-9a-f]+\) of results/tiny with its base .*tiny_gemma3_chat \(kept as it is\): 42 of 80 weights carry the adapter; f32, 1.0 MiB.*written: m3/model.safetensors, config.json, generation_config.json; tokenizer: copied \(with Gemma 3's chat template\)" \
  -- "$GM" export results/tiny --trial 3 --format merged --dtype f32 m3
expect_run "... bf16 by default (OUT given as m3b/, as a shell completes a folder)" 0 "42 of 80 weights carry the adapter; bf16, 0.5 MiB" -- "$GM" export results/tiny --trial 3 --format merged m3b/
expect_run "... the base's tokenizer.json copied as it is" 0 "^same$" -- bash -c "cmp -s m3/tokenizer.json '$BASE/tokenizer.json' && echo same"
MODEL=m3 logits m3
expect_run "gemmarun loads the merged folder: the logits of the base with the adapter attached within $TOLM" 0 "^ok " -- python3 -c "
a = [float(x) for x in open('results/trial3.txt')]; b = [float(x) for x in open('results/m3.txt')]
base = [float(x) for x in open('results/base.txt')]
d = max(abs(x - y) for x, y in zip(a, b)); e = max(abs(x - y) for x, y in zip(a, base))
print(('ok ' if len(a) == len(b) == 3584 and d <= $TOLM and e > 10 * $TOLM else 'FAIL ') + f'{d:.3g} over {len(a)} logits; the adapter moves them by {e:.3g}')"
expect_run "a merged GGUF from a Hugging Face base is refused with the way out" 2 \
  "a merged GGUF is written from a GGUF base.*convert that folder with llama.cpp's convert_hf_to_gguf.py" \
  -- "$GM" export results/tiny --trial 3 --format merged m3.gguf
expect_run "--dtype q8_0 for a folder is refused, naming what it takes" 2 "--dtype q8_0: a merged Hugging Face folder takes bf16 \(the default\) or f32" \
  -- "$GM" export results/tiny --trial 3 --format merged --dtype q8_0 m3q
expect_run "--dtype without --format merged is refused" 2 "--dtype is for --format merged" -- "$GM" export results/tiny --trial 3 --dtype f32 m3q
expect_run "--dtype f16 for a folder is refused with the reason (float16 overflows Gemma's activations)" 2 \
  "--dtype f16: a merged Hugging Face folder takes bf16 \(the default\) or f32 \(Gemma's activations overflow in float16" \
  -- "$GM" export results/tiny --trial 3 --format merged --dtype f16 m3q
expect_run "a file as the merged folder is refused" 2 "m3.txt exists and is not a folder" -- bash -c "touch m3.txt && '$GM' export results/tiny --trial 3 --format merged m3.txt"
# what OUT holds is never mixed or lost: not into a PEFT adapter's folder (transformers would apply
# it on top of the merged weights), not a PEFT adapter into a merged folder, never over the base;
# an earlier export is replaced whole, by way of OUT.partial
expect_run "a merged model into a PEFT adapter's folder is refused" 2 \
  "out3 holds adapter_.*, which is not a file of a merged model: export into a new or empty folder \(what is there is kept\)" \
  -- "$GM" export results/tiny --trial 3 --format merged out3
expect_run "a PEFT adapter into a merged model's folder is refused" 2 "m3 holds .*, which is not a file of a PEFT adapter" \
  -- "$GM" export results/tiny --trial 3 m3
cp -rL "$BASE" basecopy
expect_run "the base model's own folder as OUT is refused, the base kept" 2 "basecopy is the base model's folder: give another folder \(the base is kept\)" \
  -- "$GM" export results/tiny --trial 3 --format merged --base basecopy basecopy/
expect_run "... bit for bit" 0 "^kept$" -- bash -c "cmp -s basecopy/model.safetensors '$BASE/model.safetensors' && echo kept"
expect_run "an earlier export is replaced whole (trial 1 over trial 3), nothing partial left" 0 "^mr: 5 files, trial 1's$" -- bash -c "
  '$GM' export results/tiny --trial 3 --format merged mr >/dev/null && '$GM' export results/tiny --trial 1 --format merged mr >/dev/null &&
  '$GM' export results/tiny --trial 1 --format merged m1b >/dev/null &&
  cmp -s mr/model.safetensors m1b/model.safetensors && ! ls -d mr.partial mr.old 2>/dev/null && echo \"mr: \$(ls mr | wc -l) files, trial 1's\""
expect_run "OUT given as ../ from a subfolder is written where it says" 0 "^ok$" -- bash -c "
  mkdir -p sub && cd sub && '$GM' export ../results/tiny --trial 3 --format merged ../m3up >/dev/null && cmp -s ../m3up/model.safetensors ../m3b/model.safetensors && echo ok"
if [ -n "$PEERS" ]; then
  expect_run "transformers loads the merged f32 folder: the same logits within $TOLM" 0 \
    "ok +config.json says float32 and all 80 tensors are F32.*ok +merged model in transformers.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" merged --model m3 --ids $IDS --ours results/trial3.txt --ours-base results/base.txt --tol "$TOLM"
  expect_run "... and the bf16 folder within $(tol TOL_MERGED_BF16_TINY_ABS) (bf16 weights)" 0 \
    "ok +config.json says bfloat16 and all 80 tensors are BF16.*ok +merged model in transformers.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" merged --model m3b --dtype bfloat16 --ids $IDS --ours results/trial3.txt \
       --ours-base results/base.txt --tol "$(tol TOL_MERGED_BF16_TINY_ABS)"
  expect_run "... and its chat template (Gemma 3's: the base has none) renders a turn in transformers" 0 \
    "^<bos><start_of_turn>user.hi<end_of_turn>.<start_of_turn>model.\$" -- "$PEERS" -c "
from transformers import AutoTokenizer
print(AutoTokenizer.from_pretrained('m3').apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True, tokenize=False).replace(chr(10), '.'))"
  MODEL=m3b logits m3b
  expect_run "... where transformers and gemmarun read the bf16 folder alike (within $TOLM)" 0 \
    "ok +merged model in transformers" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" merged --model m3b --dtype bfloat16 --ids $IDS --ours results/m3b.txt --ours-base results/base.txt --tol "$TOLM"
fi

# ---- model_adapter: training that starts from an adapter ----------------------------------------
# The tiny sweep's trial 3, exported as a PEFT folder (out3), is where a new experiment starts:
# its LoRA shape is the adapter's (rank 4, alpha 8, every linear), its baseline evaluation is
# trial 3's final one prediction for prediction, and its first step's loss (same seed and lr, so the
# same first batch) is below the loss trial 3 started from.
cat > cfg3.lua <<'EOF'
for _, p in ipairs(gm.results_list("results/tiny")) do
  local t = gm.results_read(p)
  if t.trial_index == 3 then print(string.format("lr=%s seed=%d", gm.json_encode(t.config.lr), t.config.seed)) end
end
EOF
read -r LR3 SEED3 <<<"$("$GM" cfg3.lua | sed 's/lr=\([^ ]*\) seed=\(.*\)/\1 \2/')"
sed -e 's/name = "tiny"/name = "cont"/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' -e "s/seeds = {1, 2},/seeds = {$SEED3},/" \
    -e "s/lr = 1e-2, rank = 4, alpha = 8,/lr = $LR3,/" -e 's|model = \(.*\),$|model = \1, model_adapter = "out3",|' tiny.lua > cont.lua
expect_run "an experiment with model_adapter = a PEFT folder trains from it (lr $LR3, seed $SEED3)" 0 \
  "starting from the adapter out3.*baseline accuracy.*written: results/cont.md" -- env EPOCHS=2 "$GM" cont.lua
expect_run "... with the adapter's shape, trial 3's final evaluation as its baseline, and a lower first loss" 0 \
  "shape rank=4 alpha=8 rslora=false targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj.*baseline = trial 3's final on 6 examples \(which differs from the base model's\).*first loss lower.*provenance model_adapter=out3" \
  -- env SRC=results/tiny SRC_INDEX=3 CONT=results/cont CONT_INDEX=1 "$GM" "$SRC/tests/e2e/start_check.lua"
expect_run "... its table names the baseline as the adapter's" 0 "baseline \(model_adapter\)" -- cat results/cont.md
expect_run "a results folder of one trial works as model_adapter too (--set): its 2 modules by a regular expression" 0 \
  "starting from the adapter results/tiny_rx/trial-.*written: results/cont_rx.md" \
  -- env EPOCHS=1 "$GM" cont.lua --set name=cont_rx --set model_adapter=results/tiny_rx
sed 's/max_length = 64,/max_length = 64, rank = 2,/' cont.lua > cont_r.lua
expect_run "a stated rank other than the adapter's is refused, naming both" 2 \
  "train.rank = 2, but model_adapter out3 has rank = 4: remove train.rank \(the adapter decides it\) or set 4" -- "$GM" cont_r.lua --dry-run
sed 's/max_length = 64,/max_length = 64, targets = "q_proj",/' cont.lua > cont_t.lua
expect_run "stated targets that miss some of its modules are refused, by the dry run too" 2 \
  "cont_t.lua:[0-9]+: model_adapter out3 has an adapter on model.layers.0.self_attn.k_proj, which train.targets / train.layers do not select" \
  -- env EPOCHS=1 "$GM" cont_t.lua --set name=cont_t --dry-run
expect_run "... and by a run, before any work" 2 "model_adapter out3 has an adapter on model.layers.0.self_attn.k_proj" \
  -- env EPOCHS=1 "$GM" cont_t.lua --set name=cont_t
expect_run "... and leave nothing" 0 "^none$" -- bash -c "ls -d results/cont_t 2>/dev/null || echo none"
sed 's/seeds = /sweep = grid { alpha = {8, 16} }, seeds = /' cont.lua > cont_s.lua
expect_run "sweeping the adapter's shape is refused" 2 "grid.alpha: the adapter's alpha is fixed by model_adapter \(out3\); it cannot be swept" -- "$GM" cont_s.lua --dry-run
expect_run "a model_adapter that does not exist is named" 2 "model_adapter = nowhere: nowhere: no such file" \
  -- "$GM" cont.lua --set model_adapter=nowhere --dry-run
# the adapter's sha256 is in the provenance: the trial reproduces bit for bit; once the file has
# changed, a rerun says the kept trial started from another adapter, and reproduce refuses
expect_run "a trial that started from an adapter reproduces bit for bit" 0 "bit-identical" -- env EPOCHS=2 "$GM" reproduce results/cont
cp -r out3 out3.kept && printf ' ' >> out3/adapter_config.json
expect_run "after the adapter file changed, a rerun keeps the trial and says so" 0 \
  "done \(kept; started from another adapter than out3 is now: sha256 [0-9a-f]+\.\.\. then, [0-9a-f]+\.\.\. now" -- env EPOCHS=2 "$GM" cont.lua
expect_run "... and reproduce refuses, naming it" 2 "the adapter it started from \(out3\): sha256 [0-9a-f]+\.\.\. stored, [0-9a-f]+\.\.\. now" \
  -- env EPOCHS=2 "$GM" reproduce results/cont
rm -rf out3 && mv out3.kept out3

# ---- bad adapters: each a clear error naming what is wrong -------------------------------------
bad() { rm -rf "$1"; cp -r out3 "$1"; }
# another base: the 2-layer, 32-wide tiny model; the sub-module adapter's layer 0 q_proj does not fit
expect_run "an adapter for another base: the tensor and both shapes" 2 \
  "adapter of model.layers.0.self_attn.q_proj: .*sub/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' is 4 x 64; this model needs 4 x 32 \(an adapter for another base model\?\)" \
  -- env MODEL="$SRC/tests/ref/tiny_gemma3_v9k" IDS=2,3 OUT=results/x.txt ADAPTER=sub "$GM" "$SRC/tests/peers/logits.lua"
expect_run "an adapter with layers the base does not have" 2 "the file has an adapter on model.layers.2.mlp.down_proj, but this model has 2 layers \(an adapter for another base model\?\)" \
  -- env MODEL="$SRC/tests/ref/tiny_gemma3_v9k" IDS=2,3 OUT=results/x.txt ADAPTER=out3 "$GM" "$SRC/tests/peers/logits.lua"
# edit_st DIR drop KEY | rename OLD NEW | nan KEY: rewrites DIR/adapter_model.safetensors (stdlib only)
cat > edit_st.py <<'EOF'
import json, struct, sys
d, op, args = sys.argv[1], sys.argv[2], sys.argv[3:]
p = d + "/adapter_model.safetensors"
b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
out, parts, off = {}, [], 0
for k, v in h.items():
    if k == "__metadata__": out[k] = v; continue
    if op == "drop" and k == args[0]: continue
    s, e = v["data_offsets"]; chunk = bytearray(data[s:e])
    if op == "nan" and k == args[0]: chunk[0:4] = struct.pack("<f", float("nan"))
    name = args[1] if op == "rename" and k == args[0] else k
    parts.append(bytes(chunk)); out[name] = dict(v, data_offsets=[off, off + e - s]); off += e - s
hj = json.dumps(out).encode(); hj += b" " * (-len(hj) % 8)
open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(parts))
EOF
bad missing; python3 edit_st.py missing drop base_model.model.model.layers.2.mlp.up_proj.lora_B.weight
expect_run "a missing key is named" 2 "tensor 'base_model.model.model.layers.2.mlp.up_proj.lora_A.weight' has no partner: missing key 'base_model.model.model.layers.2.mlp.up_proj.lora_B.weight'" \
  -- "$GM" generate "$BASE" --adapter missing "hi" --max-tokens 1
bad rank; sed -i 's/"r":[[:space:]]*4/"r": 8/' rank/adapter_config.json
expect_run "a rank mismatch names the tensor" 2 "tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' is 4 x 64; this model needs 8 x 64 \(a rank other than the config's r\)" \
  -- "$GM" generate "$BASE" --adapter rank "hi" --max-tokens 1
bad dora; sed -i 's/"use_dora":[[:space:]]*false/"use_dora": true/' dora/adapter_config.json
expect_run "a DoRA adapter is refused by name" 2 "dora/adapter_config.json: \"use_dora\": true: DoRA adapters are not supported" \
  -- "$GM" generate "$BASE" --adapter dora "hi" --max-tokens 1
bad pickle; mv pickle/adapter_model.safetensors pickle/adapter_model.bin
expect_run "adapter_model.bin (a pickle) is refused with the way out" 2 "adapter_model.bin \(a PyTorch pickle.*safe_serialization=True" \
  -- "$GM" generate "$BASE" --adapter pickle "hi" --max-tokens 1
Q0=base_model.model.model.layers.0.self_attn.q_proj
bad vision; V0=base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj
python3 edit_st.py vision rename $Q0.lora_A.weight $V0.lora_A.weight; python3 edit_st.py vision rename $Q0.lora_B.weight $V0.lora_B.weight
expect_run "a tensor off the text decoder (a vision tower's layers.0) is named, not applied to layer 0" 2 \
  "tensor 'base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj.lora_A.weight' is LoRA on a vision tower, which this model lacks" \
  -- "$GM" generate "$BASE" --adapter vision "hi" --max-tokens 1
bad nan; python3 edit_st.py nan nan $Q0.lora_B.weight
expect_run "a NaN in an adapter tensor is named" 2 "tensor model.layers.0.self_attn.q_proj.lora_B.weight holds a non-finite value|tensor $Q0.lora_B.weight holds a non-finite value" \
  -- "$GM" generate "$BASE" --adapter nan "hi" --max-tokens 1
bad pissa; sed -i 's/"init_lora_weights":[[:space:]]*true/"init_lora_weights": "pissa"/' pissa/adapter_config.json
expect_run "a PiSSA adapter (it changed the base weights) is refused" 2 "\"init_lora_weights\": \"pissa\" initializes by changing the base weights" \
  -- "$GM" generate "$BASE" --adapter pissa "hi" --max-tokens 1
bad seltm; python3 -c "import json; p='seltm/adapter_config.json'; c=json.load(open(p)); c['target_modules']=['k_proj']; json.dump(c, open(p, 'w'))"
expect_run "tensors on modules target_modules does not select are refused (PEFT would ignore them)" 2 \
  "the file has an adapter on model.layers.0.[a-z_.]+, which adapter_config.json's target_modules / layers_to_transform do not select" \
  -- "$GM" generate "$BASE" --adapter seltm "hi" --max-tokens 1
bad sellt; python3 -c "import json; p='sellt/adapter_config.json'; c=json.load(open(p)); c['layers_to_transform']=[0]; json.dump(c, open(p, 'w'))"
expect_run "... and tensors on layers layers_to_transform leaves out" 2 "the file has an adapter on model.layers.1.[a-z_.]+, which adapter_config.json's target_modules / layers_to_transform do not select" \
  -- "$GM" generate "$BASE" --adapter sellt "hi" --max-tokens 1
bad rsstr; python3 -c "import json; p='rsstr/adapter_config.json'; c=json.load(open(p)); c['use_rslora']='true'; json.dump(c, open(p, 'w'))"
expect_run "use_rslora that is not a boolean is refused" 2 "\"use_rslora\" must be true or false" -- "$GM" generate "$BASE" --adapter rsstr "hi" --max-tokens 1
expect_run "a PEFT folder's file given instead of the folder" 2 "give the PEFT adapter's folder \(the one holding adapter_config.json and adapter_model.safetensors\), not one of its files" \
  -- "$GM" generate "$BASE" --adapter out3/adapter_model.safetensors "hi" --max-tokens 1
expect_run "a GGUF adapter given to --adapter" 2 "t3.gguf is a GGUF file: gemmarun reads adapters from results folders" \
  -- "$GM" generate "$BASE" --adapter t3.gguf "hi" --max-tokens 1
# where Lua may write: m:save_adapter outside the results folder is refused like gm.write_text; the
# export command writes its OUT, which the user named
cat > escape.lua <<EOF
local m <close> = gm.load_model("$BASE")
m:save_adapter("$TMP/escaped", { adapter = "results/tiny", trial = 1 })
EOF
expect_run "m:save_adapter outside the results folder is refused (the sandbox's write rule)" 2 "save_adapter: .*escaped is outside the results folder" \
  -- "$GM" escape.lua
[ ! -e "$TMP/escaped" ] && { pass=$((pass + 1)); echo "ok    ... and nothing was written"; } || { fail=$((fail + 1)); echo "FAIL  $TMP/escaped was written"; }
expect_run "export into a folder of trial files is refused" 2 "results/tiny holds trial files: export into a folder of its own" \
  -- "$GM" export results/tiny --trial 1 results/tiny
# a long path (1,500 bytes: beyond the 1,300 the first version cut paths to) is written whole
long=$(printf 'd%.0s' $(seq 1 200)); deep="$long/$long/$long/$long/$long/$long/$long/out"
mkdir -p "$(dirname "$deep")"
expect_run "export to a 1,500-byte path writes both files under their names" 0 "ok" \
  -- bash -c "'$GM' export results/tiny --trial 3 '$deep' >/dev/null && [ -s '$deep/adapter_config.json' ] && [ -s '$deep/adapter_model.safetensors' ] && echo ok"
expect_run "--trial with a PEFT folder is refused" 2 "is a PEFT adapter folder \(one adapter\); --trial picks a trial" \
  -- "$GM" generate "$BASE" --adapter out3 --trial 2 "hi" --max-tokens 1

finish
