# End-to-end: experiments/pets_sweep.lua unchanged on a Gemma 4 checkpoint (--set model=PATH, the
# story's command on the model it fine-tuned): the tiny random Gemma4ForConditionalGeneration of
# tests/ref/make_gemma4_vision_ref.py (a 2-layer vision tower with clipped linears; its
# preprocessor_config.json's budget of 70 soft tokens: each image resized, its aspect kept, to the
# largest grid of 12 px cells within 630 patches of 4 px) with a Gemma 4 tokenizer
# (tiny_gemma4_vision_chat), on the Oxford-IIIT Pet layout of real JPEGs (pets_layout; the 3:2 photos
# give 60 soft tokens each) with one 4:3 image (63 soft tokens). The runner counts each image's own
# tokens; the trial trains the language model's LoRA with the images through the tower, scores the
# 37 breeds, fits its plan; generation reads an image; an adapter on a clipped linear's wrapper and a
# budget the processor does not take are refused, naming why.
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
pets_layout "$SRC"
cp "$SRC/tests/ref/images/rgb16.png" pets/images/Abyssinian_1.jpg # a 64 x 48 PNG (read by its content): 84 x 108 px, 63 tokens
export PETS_ROOT=pets
MODEL="$SRC/tests/ref/tiny_gemma4_vision_chat"
SET=(--set model="$MODEL" --set rank=4 --set alpha=8 --set lr=1e-2 --set quant=bf16 --set max_length=124 --set seeds=1)
expect_run "pets_sweep.lua --dry-run on Gemma 4: 37 breeds, the vision tower and images in the plan" 0 \
  "model .*tiny_gemma4_vision_chat.*data: 37 training and 5 test examples.*trial  1 .*plan .*vision tower [0-9.]+ MiB.*images [0-9.]+ MiB" \
  -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --dry-run
# each image's own tokens: <|image> + 63 soft tokens + <image|> = 65 positions for the 4:3 image
expect_run "a max_length that cuts an image: its own 65 positions named (63 soft tokens + 2 markers)" 2 \
  "max_length = 60 cuts into image 1 \(pets/images/Abyssinian_1.jpg\), whose tokens span positions 5\.\.69 \(its prompt: 90 tokens\)" \
  -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set max_length=60 --dry-run
expect_run "a max_length without room for the longest breed name: the trial fails, saying so" 1 \
  "FAILED: example 0: its prompt \(87 tokens\) and a label \([0-9]+\) exceed max_length = 100" \
  -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set max_length=100
expect_run "vision_targets = q_proj on Gemma 4's tower: refused before any work, the clamps it would bypass named" 2 \
  "error: --set vision_targets=q_proj: train.vision_targets: target module 'q_proj': Gemma 4's vision tower wraps each linear in a Gemma4ClippableLinear.*target 'q_proj.linear'" \
  -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set vision_targets=q_proj
expect_run "pan_and_scan = true on Gemma 4: refused before any work (Gemma 3's processor's crops)" 2 \
  "error: --set pan_and_scan=true: train.pan_and_scan = true: pan & scan crops are Gemma 3's image processor's" \
  -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set pan_and_scan=true --dry-run
expect_run "modules_to_save on Gemma 4: refused before any work, quoting the value given" 2 \
  "error: --set modules_to_save=multi_modal_projector: train.modules_to_save = multi_modal_projector: .*Gemma 4's \(embed_vision\) is not trained" \
  -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set modules_to_save=multi_modal_projector --dry-run
rm -rf results
expect_run "pets_sweep.lua on Gemma 4: baseline, training, final accuracy, the table" 0 \
  "baseline accuracy.*final accuracy.*pets_sweep: accuracy.*written: results/pets_sweep.md" \
  -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}"
find_python "h5py, numpy"
if [ -n "$PY" ]; then
  expect_run "its results: 37 labels, a 37 x 37 confusion matrix over the 5 test images, the tower planned" 0 "^ok 5$" -- \
    "$PY" -c "
import glob, h5py
f = h5py.File(glob.glob('results/pets_sweep/trial-*.h5')[0], 'r')
ev = f['eval/final']
assert len(ev['labels']) == 37 and ev['confusion'].shape == (37, 37), (len(ev['labels']), ev['confusion'].shape)
assert f['memory'].attrs['planned_vision_tower'] > 0
print('ok', int(ev['confusion'][:].sum()))"
else
  skip_unless_ci "the results file's contents (h5py: run ./setup.sh)"
fi
expect_run "generate with the 4:3 image: 90 prompt tokens (63 soft tokens)" 0 "90 prompt tokens .* 3 new tokens" \
  -- "$GM" generate "$MODEL" --chat --image "pets/images/Abyssinian_1.jpg" "What breed is this pet?" --max-tokens 3
expect_run "generate with a 3:2 photo: 87 prompt tokens (60 soft tokens)" 0 "87 prompt tokens .* 3 new tokens" \
  -- "$GM" generate "$MODEL" --chat --image "pets/images/american_bulldog_1.jpg" "What breed is this pet?" --max-tokens 3
expect_run "vision_targets = q_proj.linear,o_proj.linear: the tower's adapters inside the clamps train too" 0 \
  "trial 1/1 .*final accuracy" -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set vision_targets=q_proj.linear,o_proj.linear
if [ -n "$PY" ]; then
  expect_run "its trial: the tower's adapters saved under PEFT's names (q_proj.linear), the loss falls, the plan fits" 0 "^ok 2$" -- \
    "$PY" -c "
import glob, h5py
fs = [h5py.File(p, 'r') for p in glob.glob('results/pets_sweep/trial-*.h5') if not p.endswith('.ckpt.h5')]
key = 'base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.lora_A.weight'
vt = [f for f in fs if key in f['adapter']]
assert len(fs) == 2 and len(vt) == 1, (len(fs), len(vt))
print('ok', len(fs))"
  expect_run "both trials: the loss falls, the measured peak within the plan's tolerance" 0 "^ok 2$" -- \
    trials_fall_and_fit results/pets_sweep 3
fi
# a budget Gemma 4's processor does not take, in the checkpoint's preprocessor_config.json
mkdir -p badbudget
for f in config.json model.safetensors tokenizer.json; do ln -s "$MODEL/$f" badbudget/; done
echo '{"max_soft_tokens": 100, "patch_size": 4, "pooling_kernel_size": 3}' > badbudget/preprocessor_config.json
expect_run "max_soft_tokens = 100: refused, the file and the budgets it may hold named" 2 \
  "badbudget/preprocessor_config.json: .*max_soft_tokens = 100: Gemma 4's image processor takes 70, 140, 280, 560 or 1120" \
  -- "$GM" generate badbudget --chat --image "pets/images/Abyssinian_1.jpg" "What breed?" --max-tokens 1
finish
