# End-to-end: images through `gemmarun` (issue 10) on the tiny multimodal Gemma 3 with a tokenizer
# (tests/ref/tiny_gemma3_vision_chat: a random SigLIP tower, the projector and the tiny Gemma 3 of
# tests/ref/make_vision_ref.py) and real photos (tests/ref/images: scikit-image's chelsea.png and
# files derived from it, tests/ref/make_image_ref.py):
#   - sft{} on a chat JSONL whose user turns hold {"type": "image", "path": ...} parts (paths
#     relative to the JSONL file, one or two images per conversation): trains, evaluates, writes
#     its results file and the table;
#   - classify{} on data.image_folder{}: the same, with labels from the folder names and images
#     anywhere below them; what in a label folder is not an example (another file, a link back to
#     a folder read) is listed; `labels` keeps and orders label folders, `exclude` leaves folders
#     below them out (both named in the run's summary, each label's train/test counts); a label
#     with test examples only, or only in excluded folders, a label folder that is not there, and
#     malformed labels / exclude are refused;
#   - an unusable image (corrupt, truncated, not an image) is named with its example and reason,
#     the run goes on without it; a file that does not exist likewise;
#   - the same data on a text-only model stops before any work, naming the image and the model;
#   - `generate --image` on the multimodal model; its errors (text-only model, a truncated file);
#   - classify{} on data.image_grid{} (a sprite sheet written here, cut into cells): each label's
#     train/test cells as split and capped, a couple of steps; a cell size that does not tile the
#     sheet or whose rows the labels cannot share is exit 2 naming the sheet's size; a missing
#     sheet is named; OpenCV's digits.png (when opencv-doc is installed) cut into 400/100 per digit;
#   - image references with a region ("file#xywh=X,Y,W,H") in `generate --image`, and one outside
#     its file refused with the file's size;
#   - vision_targets and modules_to_save: the tower's adapters and the projector train, land in
#     the trial file under PEFT's keys; that adapter reads back: `generate --adapter --image` runs
#     the image through them, a text-only model refuses it, the GGUF exports (adapter and merged)
#     refuse it by name, and the PEFT export loads in real PEFT on the multimodal base with
#     gemmarun's logits for the same ids and pixel values (tests/peers/peft_check.py vision); a
#     text module as a tower target is refused with the tower's module names;
#   - the merged export (--format merged) of that adapter is the whole multimodal model (tower
#     LoRA merged, the trained projector): gemmarun and transformers (Gemma3ForConditionalGeneration,
#     no missing or unexpected key) give the adapter's logits with the image within
#     TOL_MERGED_PEER_TINY_ABS, and its merged image path moves them (peft_check.py merged
#     --pixels); a text-only adapter's merged folder keeps the base's tower;
#   - model_adapter = that trial: the run takes vision_targets and modules_to_save from the
#     adapter; stating others is refused, naming the adapter's.
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
IMG="$SRC/tests/ref/images"
mkdir -p data/pics
cp "$IMG"/small.jpg "$IMG"/gray.jpg "$IMG"/wide.jpg "$IMG"/tall.jpg "$IMG"/palette.png "$IMG"/rgba.png data/pics/
cp "$IMG"/bad/truncated.jpg data/pics/ 2>/dev/null || head -c 600 "$IMG/small.jpg" > data/pics/truncated.jpg
printf 'GIF89a not really' > data/pics/fake.gif.png
pics=(small.jpg gray.jpg wide.jpg tall.jpg palette.png rgba.png)
for i in $(seq 1 24); do
  a=${pics[$((i % 6))]}
  b=${pics[$(((i + 1) % 6))]}
  if [ $((i % 4)) -eq 0 ]; then
    content="[{\"type\": \"image\", \"path\": \"pics/$a\"}, {\"type\": \"image\", \"path\": \"pics/$b\"}, {\"type\": \"text\", \"text\": \"Compare them.\"}]"
  else
    content="[{\"type\": \"image\", \"path\": \"pics/$a\"}, {\"type\": \"text\", \"text\": \"What is this?\"}]"
  fi
  echo "{\"messages\": [{\"role\": \"user\", \"content\": $content}, {\"role\": \"assistant\", \"content\": \"Picture $i is $a\"}]}"
done > data/chat.jsonl
# unusable images: each conversation is named with its file and the reason
echo '{"messages": [{"role": "user", "content": [{"type": "image", "path": "pics/truncated.jpg"}, {"type": "text", "text": "?"}]}, {"role": "assistant", "content": "x"}]}' >> data/chat.jsonl
echo '{"messages": [{"role": "user", "content": [{"type": "image", "path": "pics/fake.gif.png"}, {"type": "text", "text": "?"}]}, {"role": "assistant", "content": "x"}]}' >> data/chat.jsonl
echo '{"messages": [{"role": "user", "content": [{"type": "image", "path": "pics/missing.jpg"}, {"type": "text", "text": "?"}]}, {"role": "assistant", "content": "x"}]}' >> data/chat.jsonl
mk() { # NAME MODEL TASK
  cat > "$1.lua" <<LUA
return experiment {
  name = "$1",
  model = "$2",
  task = $3,
  train = { epochs = 1, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 64, schedule = "constant", warmup = 0 },
  seeds = {1},
}
LUA
}
VIS="$SRC/tests/ref/tiny_gemma3_vision_chat"
mk chat "$VIS" 'sft { data = data.jsonl { train = "data/chat.jsonl", test_fraction = 0.25 } }'
expect_run "sft on chat with image parts: trains and evaluates" 0 "final loss" -- "$GM" chat.lua
expect_run "the unusable images are named with their reason" 0 "truncated\.jpg.*(truncat|premature|corrupt)" -- "$GM" chat.lua --dry-run
expect_run "a results file and the table" 0 "trial-[0-9a-f]+\.h5" -- ls results/chat
out=$("$GM" chat.lua --dry-run 2>&1)
for f in fake.gif.png missing.jpg; do
  case "$out" in *"$f"*) pass=$((pass + 1)); echo "ok    --dry-run names $f" ;;
  *) fail=$((fail + 1)); echo "FAIL  --dry-run does not name $f"; echo "$out" | tail -5 ;; esac
done
find_python "h5py"
if [ -n "$PY" ]; then
  expect_run "the trial file keeps every rejected image with its reason" 0 "^ok 3$" -- "$PY" -c "
import glob, h5py, json
d = h5py.File(glob.glob('results/chat/trial-*.h5')[0], 'r')['data']
rej = json.loads(d.attrs['rejections_json'])
names = [r['example'] + ': ' + r['reason'] for r in rej]
assert int(d.attrs['n_rejected']) >= 3 and all(any(f in n for n in names) for f in ('truncated.jpg', 'fake.gif.png', 'missing.jpg')), names
print('ok', sum(1 for n in names if 'pics/' in n))"
else
  skip_unless_ci "the trial file's rejections (h5py: run ./setup.sh)"
fi
# classify on an image folder (labels from the folder names; their first tokens differ)
mkdir -p folder/color folder/gray
cp "$IMG"/small.jpg "$IMG"/wide.jpg "$IMG"/tall.jpg "$IMG"/palette.png "$IMG"/rgba.png "$IMG"/orient3.jpg folder/color/
cp "$IMG"/gray.jpg "$IMG"/gray.png "$IMG"/gray16.png "$IMG"/gray_alpha.png "$IMG"/gray4.png "$IMG"/gray1.png folder/gray/
mk pics "$VIS" 'classify { data = data.image_folder { root = "folder", test = 3 }, prompt = "Is this photo in color?" }'
expect_run "classify on data.image_folder: baseline, training, accuracy" 0 "accuracy" -- "$GM" pics.lua
# an image anywhere below a label folder counts for it; what is not an example is listed; a
# folder met again through a link is read once; labels keeps and orders label folders, exclude
# leaves folders below them out; a label with test examples only is refused
mkdir -p folder/color/nested/deeper folder/other && cp "$IMG"/small.jpg folder/color/nested/deeper/ && echo notes > folder/gray/notes.txt
ln -s .. folder/color/nested/loop && cp "$IMG"/gray.jpg folder/other/
expect_run "an image in a folder below a label counts for it (color 5 + 2 test, gray 4 + 2, other 1 + 0); a link back is read once; a non-image listed" 0 \
  "data.image_folder: folder: examples per label \(train/test, every 3rd of a label's is a test example\): color 5/2, gray 4/2, other 1/0.*2 entries of the label folders not read:.*folder/color/nested/loop: a link to a folder already read \(folder/color\).*folder/gray/notes.txt: not a .png or .jpg image" \
  -- "$GM" pics.lua --dry-run
mk sel "$VIS" 'classify { data = data.image_folder { root = "folder", test = 3, labels = { "gray", "color" }, exclude = { "deeper" } }, prompt = "?" }'
expect_run "labels: those folders in that order, the others named; exclude: a folder below a label left out, named" 0 \
  "gray 4/2, color 4/2; the most frequent, gray, is 2 of the 4 test examples \(50.0%\); left out: label folders not in labels: other; 1 folder named deeper \(exclude\).*data: 8 training and 4 test examples, labels gray, color" \
  -- "$GM" sel.lua --dry-run
# the most frequent label's share is said again on what is left after unusable images: b's test
# image b3 is text named .jpg (every 3rd of a label's is a test example: a3, b3, b6)
mkdir -p share/a share/b && for i in 1 2 3; do cp "$IMG"/small.jpg share/a/a$i.jpg; done
for i in 1 2 4 5 6; do cp "$IMG"/gray.jpg share/b/b$i.jpg; done && echo "not an image" > share/b/b3.jpg
mk share "$VIS" 'classify { data = data.image_folder { root = "share", test = 3 }, prompt = "?" }'
expect_run "an unusable test image: the most frequent label's share counted again on what is left" 0 \
  "a 2/1, b 4/2; the most frequent, b, is 2 of the 3 test examples \(66.7%\).*b3\.jpg.*what is left: the most frequent, a, is 1 of the 2 test examples \(50.0%\)" \
  -- "$GM" share.lua --dry-run
mkdir -p only_nested/a/sub only_nested/b && cp "$IMG"/small.jpg only_nested/a/sub/ && cp "$IMG"/gray.jpg "$IMG"/gray.png only_nested/b/
mk excl "$VIS" 'classify { data = data.image_folder { root = "only_nested", exclude = { "sub" } }, prompt = "?" }'
expect_run "a label whose images are all in excluded folders: exit 2, named" 2 \
  "data.image_folder: only_nested/a \(label 'a'\) has no .png or .jpg image outside the excluded folders" -- "$GM" excl.lua --dry-run
mk miss "$VIS" 'classify { data = data.image_folder { root = "folder", labels = { "color", "sepia" } }, prompt = "?" }'
expect_run "labels naming a folder that is not there: exit 2, with the folders there" 2 \
  "data.image_folder: labels lists 'sepia', but folder/sepia is not a folder \(the folders there: color, gray, other\)" -- "$GM" miss.lua --dry-run
mk slash "$VIS" 'classify { data = data.image_folder { root = "folder", labels = { "color", "gray/x" } }, prompt = "?" }'
expect_run "labels: a path instead of a folder name: exit 2" 2 'data.image_folder: labels\[2\] = "gray/x": must be a folder name' -- "$GM" slash.lua --dry-run
mk twice "$VIS" 'classify { data = data.image_folder { root = "folder", labels = { "color", "gray", "color" } }, prompt = "?" }'
expect_run "labels: a folder listed twice: exit 2" 2 "data.image_folder: labels lists 'color' twice \(labels\[1\] and labels\[3\]\)" -- "$GM" twice.lua --dry-run
mk exstr "$VIS" 'classify { data = data.image_folder { root = "folder", exclude = "cartoon" }, prompt = "?" }'
expect_run "exclude: not a list: exit 2" 2 "data.image_folder: exclude must be a non-empty list of folder names" -- "$GM" exstr.lua --dry-run
rm -r folder/color/nested folder/other folder/gray/notes.txt
mkdir -p split/train/a split/train/b split/test/a split/test/b split/test/c
for l in a b; do cp "$IMG"/small.jpg "$IMG"/gray.jpg split/train/$l/; cp "$IMG"/wide.jpg split/test/$l/; done
cp "$IMG"/tall.jpg split/test/c/
sed -e 's/root = "folder", test = 3/root = "split"/' -e 's/name = "pics"/name = "split"/' pics.lua > split.lua
expect_run "a label with test examples but no training example: refused, naming the folders" 2 \
  "label 'c' has test examples but no training example \(split/train/c is missing or empty\)" -- "$GM" split.lua --dry-run
# the image path trained too: LoRA on two of the tower's linears, the projector fully
cat > pics_vt.lua <<LUA
return experiment {
  name = "pics_vt",
  model = "$VIS",
  task = classify { data = data.image_folder { root = "folder", test = 3 }, prompt = "Is this photo in color?" },
  train = { epochs = 2, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 64, schedule = "constant", warmup = 0,
            vision_targets = { "q_proj", "fc1" }, modules_to_save = "multi_modal_projector" },
  seeds = {1},
}
LUA
expect_run "classify with vision_targets and modules_to_save: trains and evaluates" 0 "final accuracy" -- "$GM" pics_vt.lua
if [ -n "$PY" ]; then
  expect_run "its trial file holds the tower's adapters and the trained projector under PEFT's keys" 0 "^ok 8 2$" -- "$PY" -c "
import glob, h5py
a = h5py.File(glob.glob('results/pics_vt/trial-*.h5')[0], 'r')['adapter']
tower = [k for k in a if k.startswith('base_model.model.model.vision_tower.encoder.layers.')]
proj = [k for k in a if k.startswith('base_model.model.model.multi_modal_projector.')]
assert all(('q_proj' in k or 'fc1' in k) for k in tower), tower
assert a['base_model.model.model.multi_modal_projector.mm_input_projection_weight'].shape == (32, 64)
print('ok', len(tower), len(proj))"
  # the plan counts the trained image path (its adapters, moments, saved activations): the
  # trial's measured peak stays within 5% of it (not checked under ASan, whose shadow memory counts)
  expect_run "that trial's peak memory is within $(tol TOL_PLAN_PEAK_REL) of its plan" 0 "^ok" -- "$PY" -c "
import glob, h5py, os
m = h5py.File(glob.glob('results/pics_vt/trial-*.h5')[0], 'r')['memory'].attrs
p, r = float(m['planned_total']), float(m['measured_peak_rss'])
assert os.environ.get('GM_SANITIZE') or abs(r - p) <= $(tol TOL_PLAN_PEAK_REL) * p, (r, p)
print('ok', r, p)"
else
  skip_unless_ci "the trial file's tower and projector tensors (h5py: run ./setup.sh)"
fi
# that adapter read back: generation runs the image through its tower adapters and projector
expect_run "generate --adapter of that run with --image: the tower's adapters and the projector read back" 0 \
  "adapter .*pics_vt.*46 modules \(vision tower's included\), trained projector" -- \
  "$GM" generate "$VIS" --adapter results/pics_vt --chat --image "$IMG/small.jpg" "What is it?" --max-tokens 2
expect_run "the same adapter on a text-only model: refused, saying it trained an image path the model lacks" 2 \
  "pics_vt.*trained the image path \(LoRA on the vision tower and the projector\), which this model lacks: .*tiny_gemma3_chat has no vision tower" -- \
  "$GM" generate "$SRC/tests/ref/tiny_gemma3_chat" --adapter results/pics_vt "Hi" --max-tokens 2
expect_run "export --format gguf of it: refused (llama.cpp adapters carry no vision tower)" 2 \
  "trained the image path.*llama.cpp LoRA adapter carries no vision tower or projector" -- \
  "$GM" export results/pics_vt vt.gguf --format gguf
expect_run "export --format merged of it as a GGUF: refused (llama.cpp keeps the tower in an mmproj file), naming the ways out" 2 \
  "pics_vt/trial-[0-9a-f]+\.h5: the adapter trained the image path .*a merged GGUF holds the text decoder only, and llama.cpp keeps the tower and projector in a separate mmproj file.*hint: export --format merged into a folder .*or --format peft" -- \
  "$GM" export results/pics_vt vt_merged.gguf --format merged
expect_run "export --format peft of it: the tower's modules and the projector (modules_to_save)" 0 \
  "46 LoRA modules \(4 on the vision tower\) and the trained projector" -- "$GM" export results/pics_vt vt_peft --format peft
# gemmarun's logits with an image (random pixel values, the same file for PEFT) through that
# adapter, and PEFT's on the exported folder: equal within the adapters' peer tolerance, and the
# image path (tower LoRA, projector) moves PEFT's logits by more than 10x that
awk 'BEGIN { srand(7); for (i = 0; i < 3 * 56 * 56; i++) printf "%.6f\n", rand() * 2 - 1 }' > pix.txt
VT_IDS=2,15,27,509,511,511,511,511,510,100,31,7,300
expect_run "m:logits with pixels through that adapter" 0 "wrote 6656 logits" -- \
  env MODEL="$VIS" IDS=$VT_IDS OUT=results/vt_logits.txt ADAPTER=results/pics_vt PIXELS=pix.txt "$GM" "$SRC/tests/peers/logits.lua"
# the same adapter merged into the multimodal base (export --format merged, f32): the whole
# Gemma3ForConditionalGeneration - the decoder and the tower with their LoRA merged, the trained
# projector - read back by gemmarun gives the adapter's logits with the image within
# TOL_MERGED_PEER_TINY_ABS (the merge moves only the order of f32 additions), and transformers
# likewise (below, with the peers)
TOLM=$(tol TOL_MERGED_PEER_TINY_ABS)
expect_run "m:logits with pixels on the base alone" 0 "wrote 6656 logits" -- \
  env MODEL="$VIS" IDS=$VT_IDS OUT=results/vt_base.txt PIXELS=pix.txt "$GM" "$SRC/tests/peers/logits.lua"
expect_run "export --format merged of it: the multimodal model with the tower's adapters merged and the trained projector" 0 \
  "merged trial 1 .* 46 of 119 weights carry the adapter \(4 of the vision tower's\), the projector is the trained one; f32.*in Python: Gemma3ForConditionalGeneration.from_pretrained\(\"vt_merged\"\)" -- \
  "$GM" export results/pics_vt vt_merged --format merged --dtype f32
# close_logits OURS MERGED BASE: "ok" when the merged folder's logits (MERGED) are within TOLM of the
# adapter's (OURS) over all 6656, and the adapter moves them (OURS - BASE) by more than 10 x TOLM
close_logits() {
  awk -v tol="$TOLM" 'FILENAME == ARGV[1] { a[FNR] = $1; next }
    FILENAME == ARGV[2] { d = $1 - a[FNR]; if (d < 0) d = -d; if (d > md) md = d; n++; next }
    { e = $1 - a[FNR]; if (e < 0) e = -e; if (e > me) me = e }
    END { printf "%s %.3g over %d logits; the adapter moves them by %.3g\n", (n == 6656 && md <= tol && me > 10 * tol) ? "ok" : "FAIL", md, n, me }' "$@"
}
env MODEL=vt_merged IDS=$VT_IDS OUT=results/vt_merged.txt PIXELS=pix.txt "$GM" "$SRC/tests/peers/logits.lua" >/dev/null 2>&1
expect_run "gemmarun reads the merged folder: with the image, the adapter's logits within $TOLM" 0 "^ok " -- \
  close_logits results/vt_logits.txt results/vt_merged.txt results/vt_base.txt
# a text-only adapter (the chat run: LoRA on the decoder) on the multimodal base keeps the tower
expect_run "export --format merged of a text-only adapter on the multimodal base: the tower and projector kept" 0 \
  "of results/chat .*: 42 of 119 weights carry the adapter; f32.*Gemma3ForConditionalGeneration" -- \
  "$GM" export results/chat chat_merged --format merged --dtype f32
env MODEL="$VIS" IDS=$VT_IDS OUT=results/chat_logits.txt ADAPTER=results/chat PIXELS=pix.txt "$GM" "$SRC/tests/peers/logits.lua" >/dev/null 2>&1
env MODEL=chat_merged IDS=$VT_IDS OUT=results/chat_merged.txt PIXELS=pix.txt "$GM" "$SRC/tests/peers/logits.lua" >/dev/null 2>&1
expect_run "... read back by gemmarun: with the image, that adapter's logits within $TOLM" 0 "^ok " -- \
  close_logits results/chat_logits.txt results/chat_merged.txt results/vt_base.txt
# the PEFT export read back by gemmarun: the same logits, bit for bit (f32 both ways)
expect_run "the PEFT export read back (tower LoRA, modules_to_save): the trial's logits with the image, bit for bit" 0 "^same$" -- \
  sh -c "env MODEL='$VIS' IDS=$VT_IDS OUT=results/vt_back.txt ADAPTER=vt_peft PIXELS=pix.txt '$GM' '$SRC/tests/peers/logits.lua' >/dev/null && cmp results/vt_logits.txt results/vt_back.txt && echo same"
expect_run "that folder without modules_to_save in its config: refused, naming the projector's tensor" 2 \
  "mm_input_projection_weight' is the projector trained fully, but adapter_config.json's modules_to_save does not list multi_modal_projector" -- \
  sh -c "mkdir -p vt_nomts && cp vt_peft/adapter_model.safetensors vt_nomts/ && sed 's/\"multi_modal_projector\"//' vt_peft/adapter_config.json > vt_nomts/adapter_config.json && '$GM' generate '$VIS' --adapter vt_nomts hi --max-tokens 1"
peers_python
if [ -n "$PEERS" ]; then
  TOL=$(tol TOL_ADAPTER_PEER_TINY_ABS)
  expect_run "PEFT loads the exported folder on the multimodal base (no missing key) and gives gemmarun's logits with the image within $TOL" 0 \
    "ok +logits with images and the adapter.*ok +its image path \(tower LoRA, projector\) moves PEFT's logits" -- \
    "$PEERS" "$SRC/tests/peers/peft_check.py" vision --base "$VIS" --adapter vt_peft --ids $VT_IDS --pixels pix.txt \
    --ours results/vt_logits.txt --tol "$TOL"
  expect_run "transformers loads the merged multimodal folder (no missing or unexpected key) and gives gemmarun's logits with the adapter within $TOLM" 0 \
    "ok +config.json says float32 and all 119 tensors are F32.*ok +Gemma3ForConditionalGeneration loads every weight of the folder \(39 of the tower and projector\).*ok +merged multimodal model in transformers, with the image.*ok +the adapter moves the logits.*ok +same next token.*ok +its merged image path \(tower LoRA, trained projector\) moves transformers' logits" -- \
    "$PEERS" "$SRC/tests/peers/peft_check.py" merged --model vt_merged --ids $VT_IDS --pixels pix.txt --base "$VIS" \
    --ours results/vt_logits.txt --ours-base results/vt_base.txt --tol "$TOLM"
  expect_run "... and the text-only adapter's merged folder, the tower as the base's" 0 \
    "ok +Gemma3ForConditionalGeneration loads every weight.*ok +merged multimodal model in transformers, with the image.*ok +the adapter moves the logits" -- \
    "$PEERS" "$SRC/tests/peers/peft_check.py" merged --model chat_merged --ids $VT_IDS --pixels pix.txt \
    --ours results/chat_logits.txt --ours-base results/vt_base.txt --tol "$TOLM"
  # an adapter PEFT itself made on the multimodal base: q_proj of both parts, fc1 of the tower,
  # the projector as modules_to_save; gemmarun reads its folder and gives PEFT's logits
  expect_run "PEFT makes an image-path adapter (q_proj,fc1, modules_to_save)" 0 "PEFT made a LoRA adapter" -- \
    "$PEERS" "$SRC/tests/peers/peft_check.py" make --base "$VIS" --out vt_made --r 4 --alpha 8 --targets q_proj,fc1 --projector --seed 3
  expect_run "m:logits with pixels through PEFT's folder" 0 "wrote 6656 logits" -- \
    env MODEL="$VIS" IDS=$VT_IDS OUT=results/vt_made.txt ADAPTER=vt_made PIXELS=pix.txt "$GM" "$SRC/tests/peers/logits.lua"
  expect_run "that folder in gemmarun gives PEFT's logits with the image within $TOL" 0 \
    "ok +logits with images and the adapter.*ok +its image path \(tower LoRA, projector\) moves PEFT's logits" -- \
    "$PEERS" "$SRC/tests/peers/peft_check.py" vision --base "$VIS" --adapter vt_made --ids $VT_IDS --pixels pix.txt \
    --ours results/vt_made.txt --tol "$TOL"
else
  skip_unless_ci "the image-path adapter through real PEFT (the peers venv: tests/peers/setup.sh)"
fi
# model_adapter = that adapter (its PEFT export): the run takes the image path it trained
# (vision_targets, modules_to_save) with its LoRA shape, its baseline is pics_vt's final evaluation
# and its first loss (same seed, same first batch) is below pics_vt's first
sed -e 's/name = "pics_vt"/name = "vt_cont", model_adapter = env("ADAPTER", "vt_peft")/' -e 's/rank = 4, alpha = 8, //' -e 's/epochs = 2/epochs = 1/' \
    -e '/vision_targets = /d' -e 's/schedule = "constant", warmup = 0,/schedule = "constant", warmup = 0 },/' pics_vt.lua > vt_cont.lua
expect_run "model_adapter with a trained image path, vision_targets / modules_to_save left out: trains from it" 0 \
  "starting from the adapter vt_peft.*final accuracy" -- "$GM" vt_cont.lua
expect_run "... taking the adapter's shape and image path, pics_vt's final evaluation as its baseline, a lower first loss" 0 \
  "shape rank=4 alpha=8 .*image path vision_targets=q_proj,fc1 modules_to_save=multi_modal_projector.*baseline = trial 1's final.*first loss lower.*provenance model_adapter=vt_peft" \
  -- env SRC=results/pics_vt SRC_INDEX=1 CONT=results/vt_cont CONT_INDEX=1 "$GM" "$SRC/tests/e2e/start_check.lua"
sed 's/max_length = 64,/max_length = 64, vision_targets = { "fc1", "q_proj" }, modules_to_save = "multi_modal_projector",/' vt_cont.lua > vt_same.lua
expect_run "... stating the adapter's own image path is accepted" 0 "trial +1 .*vision tower" -- "$GM" vt_same.lua --dry-run
sed 's/max_length = 64,/max_length = 64, vision_targets = "q_proj",/' vt_cont.lua > vt_less.lua
expect_run "stated vision_targets that miss some of its tower adapters: refused by the dry run, naming one and the adapter's" 2 \
  "vt_less.lua:[0-9]+: model_adapter results/pics_vt has an adapter on model.vision_tower.encoder.layers.0.mlp.fc1, which train.vision_targets = q_proj does not select: remove train.vision_targets \(the adapter decides it\) or set q_proj,fc1" \
  -- env ADAPTER=results/pics_vt "$GM" vt_less.lua --dry-run
sed 's/max_length = 64,/max_length = 64, vision_targets = "q_proj,fc1,k_proj",/' vt_cont.lua > vt_more.lua
expect_run "... and ones that select more" 2 \
  "train.vision_targets = q_proj,fc1,k_proj selects model.vision_tower.encoder.layers.0.self_attn.k_proj, which model_adapter vt_peft has no adapter for" \
  -- "$GM" vt_more.lua --dry-run
sed 's/max_length = 64,/max_length = 64, modules_to_save = "none",/' vt_cont.lua > vt_noproj.lua
expect_run "a stated modules_to_save other than the adapter's: refused, naming both" 2 \
  "train.modules_to_save = none, but model_adapter vt_peft has modules_to_save = multi_modal_projector: remove train.modules_to_save \(the adapter decides it\) or set multi_modal_projector" \
  -- "$GM" vt_noproj.lua --dry-run
sed 's/seeds = /sweep = grid { modules_to_save = { "none", "multi_modal_projector" } }, seeds = /' vt_cont.lua > vt_sweep.lua
expect_run "... and sweeping it" 2 "grid.modules_to_save: the adapter's modules_to_save is fixed by model_adapter \(vt_peft\)" -- "$GM" vt_sweep.lua --dry-run
sed -e 's/name = "vt_cont"/name = "vt_text"/' -e 's|task = classify.*|task = sft { data = data.jsonl { train = "data/text.jsonl", test_fraction = 0.34 } },|' vt_cont.lua > vt_text.lua
for i in 1 2 3 4 5 6; do echo "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi $i\"}, {\"role\": \"assistant\", \"content\": \"Hello $i\"}]}"; done > data/text.jsonl
expect_run "that adapter on data without images: refused, saying why" 2 \
  "model_adapter vt_peft trained the image path \(vision_targets = q_proj,fc1, modules_to_save = multi_modal_projector\), which continues training only on data with images" \
  -- "$GM" vt_text.lua --dry-run
sed -e 's/"q_proj", "fc1"/"gate_proj"/' -e 's/name = "pics_vt"/name = "pics_vt_bad"/' pics_vt.lua > pics_vt_bad.lua
expect_run "vision_targets naming a text module: refused with the tower's module names" 2 "vision_targets.*gate_proj.*fc1" -- "$GM" pics_vt_bad.lua
# generation with images (greedy, a few tokens), and its errors
expect_run "generate --image (two photos) on the multimodal model" 0 "prompt tokens at .* new tokens" -- \
  "$GM" generate "$VIS" --chat --image "$IMG/small.jpg" --image "$IMG/palette.png" "Compare them." --max-tokens 4
# pan & scan: wide.jpg (1000 x 300) with its 3 crops, each a block of soft tokens, and the processor's
# sentence around them (ids checked against transformers in test_vision): 94 prompt tokens, 27 without
expect_run "generate --image --pan-and-scan: the image and its 3 crops in the prompt" 0 "^gemmarun: 94 prompt tokens" -- \
  "$GM" generate "$VIS" --chat --image "$SRC/tests/ref/images/wide.jpg" --pan-and-scan "What is it?" --max-tokens 2
expect_run "generate --image without --pan-and-scan: the image alone" 0 "^gemmarun: 27 prompt tokens" -- \
  "$GM" generate "$VIS" --chat --image "$SRC/tests/ref/images/wide.jpg" "What is it?" --max-tokens 2
expect_run "generate --pan-and-scan without --image: refused" 2 "--pan-and-scan crops the --image files; there is none" -- \
  "$GM" generate "$VIS" --pan-and-scan "What is it?"
expect_run "generate --image on a text-only model: refused, naming both" 2 "--image .*small.jpg: .*tiny_gemma3_chat: it has no vision tower \(a text-only model cannot read images\)" -- \
  "$GM" generate "$SRC/tests/ref/tiny_gemma3_chat" --chat --image "$IMG/small.jpg" "What is it?"
expect_run "generate --image with a truncated file: named, with the reason" 2 "truncated.jpg: .*(truncated|Premature)" -- \
  "$GM" generate "$VIS" --chat --image data/pics/truncated.jpg "What is it?"
# the same data on a text-only model: stopped before any work, naming the image and the model
mk text "$SRC/tests/ref/tiny_gemma3_chat" 'sft { data = data.jsonl { train = "data/chat.jsonl", test_fraction = 0.25 } }'
expect_run "images on a text-only model: refused, naming the image and the model" 2 "has images.*pics/.*no vision tower" -- "$GM" text.lua
[ ! -e results/text ] && { pass=$((pass + 1)); echo "ok    nothing written for the refused run"; } || { fail=$((fail + 1)); echo "FAIL  results/text exists"; }
# data.image_grid: a 72 x 24 grayscale sheet of 6 x 4 cells (12 columns, 6 rows; 2 rows per label),
# written with Python's zlib (a PNG is a signature and three chunks)
if command -v python3 >/dev/null; then
  python3 - grid.png <<'PY'
import struct, sys, zlib
W, H = 72, 24
raw = b"".join(bytes([0] + [((y // 8) * 100 + (x * 7 + y * 13) % 50) & 255 for x in range(W)]) for y in range(H))
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 0, 0, 0, 0))
                              + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
PY
  cat > grid.lua <<LUA
return experiment {
  name = "grid",
  model = "$VIS",
  task = classify { data = data.image_grid { path = env("SHEET", "grid.png"), cell = CELL, labels = { "red", "green", "blue" },
                                             split = 4, train = 5 },
                    prompt = "Which colour?" },
  train = { epochs = 1, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 64, schedule = "constant", warmup = 0, max_steps = 2 },
  seeds = {1},
}
LUA
  sed 's/CELL/{ 6, 4 }/' grid.lua > grid_ok.lua
  # 24 cells per label; every 4th tests (6), the other 18 train, capped at 5
  expect_run "classify on data.image_grid: each label's train/test cells as split and capped, 2 steps" 0 \
    "grid.png is 72 x 24 pixels: 6 rows x 12 columns of 6 x 4 cells, 2 rows per label; per label \(rows of its cells used, train/test\): red rows 0-1 5/6, green rows 2-3 5/6, blue rows 4-5 5/6.*step 2/2.*final accuracy.*over the 18 test examples" \
    -- "$GM" grid_ok.lua
  sed 's/CELL/7/' grid.lua > grid_bad.lua
  expect_run "data.image_grid, a cell size that does not tile the sheet: exit 2 with the sheet's size" 2 \
    "grid_bad.lua:[0-9]+: data.image_grid: grid.png is 72 x 24 pixels, which cells of 7 x 7 do not tile \(10 columns of 7 leave 2 pixels\)" -- "$GM" grid_bad.lua --dry-run
  sed 's/CELL/{ 6, 6 }/' grid.lua > grid_rows.lua
  expect_run "data.image_grid, rows the labels cannot share: exit 2 with the sheet's size" 2 \
    "data.image_grid: grid.png is 72 x 24 pixels: 4 rows of 6-pixel cells, which 3 labels cannot share evenly" -- "$GM" grid_rows.lua --dry-run
  expect_run "data.image_grid, a missing sheet: named" 2 "data.image_grid: nothere.png does not exist" -- env SHEET=nothere.png "$GM" grid_ok.lua --dry-run
  DIGITS=/usr/share/doc/opencv-doc/examples/data/digits.png
  sed -e 's/CELL/20/' -e 's/labels = { "red", "green", "blue" }/labels = { "0", "1", "2", "3", "4", "5", "6", "7", "8", "9" }/' \
    -e 's/split = 4, train = 5/split = 5/' grid.lua > digits.lua
  if [ -r "$DIGITS" ]; then
    expect_run "OpenCV's digits.png: 5,000 cells, 400 train / 100 test per digit, checked in --dry-run" 0 \
      "per label \(rows of its cells used, train/test\): 0 rows 0-4 400/100, 1 rows 5-9 400/100, 2 rows 10-14 400/100, 3 rows 15-19 400/100, 4 rows 20-24 400/100, 5 rows 25-29 400/100, 6 rows 30-34 400/100, 7 rows 35-39 400/100, 8 rows 40-44 400/100, 9 rows 45-49 400/100.*data: 4000 training and 1000 test examples" \
      -- env SHEET="$DIGITS" "$GM" digits.lua --dry-run
  else
    expect_run "OpenCV's digits.png missing: the message names Debian's opencv-doc" 2 "does not exist: it comes with Debian's opencv-doc package" \
      -- env SHEET="$DIGITS" "$GM" digits.lua --dry-run
    skip_unless_ci "data.image_grid on OpenCV's digits.png (apt-get install opencv-doc)"
  fi
else
  skip_unless_ci "data.image_grid (python3 writes its sheet: run ./setup.sh)"
fi
# image references with a region in generate --image; one outside the file (small.jpg: 120 x 80)
expect_run "generate --image FILE#xywh=X,Y,W,H (a region of a photo)" 0 "prompt tokens at .* new tokens" -- \
  "$GM" generate "$VIS" --chat --image "$IMG/small.jpg#xywh=40,20,60,40" "What is it?" --max-tokens 2
expect_run "generate --image with a region outside the file: refused, naming the reference and the file's size" 2 \
  "small.jpg#xywh=100,0,50,50': the region \(columns 100..149, rows 0..49\) is not inside the image, which is 120 x 80 pixels" -- \
  "$GM" generate "$VIS" --chat --image "$IMG/small.jpg#xywh=100,0,50,50" "What is it?" --max-tokens 2
finish
