# End-to-end: experiments/pets_sweep.lua itself - the command our users type - on a small data set
# in Oxford-IIIT Pet's official layout (images/<Breed>_<n>.jpg, annotations/trainval.txt and
# test.txt; real JPEG files: the photos of tests/ref/images, written by PIL through libjpeg) with
# the tiny multimodal Gemma 3 (tests/ref/tiny_gemma3_vision_chat), the sweep cut to one point by
# --set: the zero-shot baseline, training, whole-label scoring of the 37 breeds (their names share
# first tokens), the HDF5 results, the table and the confusion matrices as PNG. Then the data
# set's errors: a missing annotation file, a class id out of range and a name that contradicts its
# class id each stop the run naming the file (and line), before any work, and the results already
# written stay as they were; a breed whose only training image is missing is named with that image.
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
pets_layout "$SRC"
export PETS_ROOT=pets GEMMA_MODEL="$SRC/tests/ref/tiny_gemma3_vision_chat"
SET=(--set rank=4 --set alpha=8 --set lr=1e-2 --set quant=bf16 --set max_length=96 --set seeds=1)
expect_run "pets_sweep.lua --dry-run: 37 breeds, whole-label scoring, the plan" 0 \
  "whole label.*data: 37 training and 5 test examples.*trial  1 .*plan .*images [0-9.]+ MiB" -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --dry-run
# the file as shipped names the built-in size gemma3-4b: its dry run plans every trial from the name,
# the SigLIP tower's share itemized (weights, activations of 4 images, pixel staging)
expect_run "pets_sweep.lua --dry-run from the gemma3-4b size: the vision tower in every plan" 0 \
  "96 trials.*model gemma3-4b.*trial  1 .*plan .*vision tower [0-9.]+ GiB.*images [0-9.]+ MiB.*trial 96 .*vision tower" -- \
  env GEMMA_MODEL=gemma3-4b "$GM" "$SRC/experiments/pets_sweep.lua" --dry-run
# a built-in size tokenizes nothing, but the images' soft tokens alone must leave room for text
expect_run "pets_sweep.lua --dry-run from gemma3-4b: a max_length the image tokens fill is an error in the file" 2 \
  "--set max_length=200: train.max_length = 200 leaves no room for text beside 1 image \(256 soft tokens \+ 2 markers each = 258 positions" -- \
  env GEMMA_MODEL=gemma3-4b "$GM" "$SRC/experiments/pets_sweep.lua" --dry-run --set max_length=200
# the job script of docs/scaling.md: 96 trials in 8 arrays by memory request, --max-parallel 16
# shared 2 per array (--print plans a built-in size, as --dry-run does; nothing is submitted)
expect_run "submit --slurm --print for pets_sweep.lua from gemma3-4b: 96 trials, 8 arrays by memory" 0 \
  "trial  1  [0-9a-f]+  alpha=16 lr=5e-05 max_length=512 quant=nf4 rank=16 seed=1  plan [0-9.]+ GiB -> --mem=[0-9]+M.*96 of 96 trials pending \(0 done\); 8 arrays \(one per memory request\), 8 CPUs per trial, at most 16 at once \(2 \+ 2 \+ 2 \+ 2 \+ 2 \+ 2 \+ 2 \+ 2 by array\).*a8=\\\$\(sbatch --parsable --array=22-24,46-48,70-72,94-96%2 .*--dependency=afterany:\\\$a1:\\\$a2:\\\$a3:\\\$a4:\\\$a5:\\\$a6:\\\$a7:\\\$a8.*not submitted" -- \
  env GEMMA_MODEL=gemma3-4b "$GM" submit "$SRC/experiments/pets_sweep.lua" --slurm --partition gpu --cpus-per-trial 8 --max-parallel 16 --print
# --max-parallel below the number of memory requests: neighbouring requests merge (the larger for
# both) until each array can run one
expect_run "submit --print --max-parallel 4: the 8 requests merged into 4 arrays, one task each" 0 \
  "96 of 96 trials pending \(0 done\); 4 arrays \(one per memory request\), 2 CPUs per trial, at most 4 at once \(1 \+ 1 \+ 1 \+ 1 by array\).*a1=\\\$\(sbatch --parsable --array=1-9,25-33,49-57,73-81%1 --mem=[0-9]+M .*a4=\\\$\(sbatch --parsable --array=22-24,46-48,70-72,94-96%1 --mem=[0-9]+M" -- \
  env GEMMA_MODEL=gemma3-4b "$GM" submit "$SRC/experiments/pets_sweep.lua" --slurm --max-parallel 4 --print
rm -rf results/pets_sweep
expect_run "pets_sweep.lua: baseline, training, final accuracy, the table" 0 \
  "baseline accuracy.*final accuracy.*pets_sweep: accuracy.*written: results/pets_sweep.md.*results/pets_sweep_confusion_1_final\.png" -- "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}"
# the trial's confusion matrices, baseline and final, drawn: a PNG (signature, ends in IEND), a
# square page (IHDR, big-endian at bytes 16..23) of at least 1024 px for the 37 breeds
confusion_png() {
  local f=$1 sig w h
  [ -s "$f" ] || { echo "missing $f"; return 1; }
  sig=$(od -An -tx1 -N8 "$f" | tr -d ' \n')
  [ "$sig" = "89504e470d0a1a0a" ] || { echo "$f: not a PNG ($sig)"; return 1; }
  w=$((16#$(od -An -tx1 -j16 -N4 "$f" | tr -d ' \n'))) h=$((16#$(od -An -tx1 -j20 -N4 "$f" | tr -d ' \n')))
  { [ "$w" = "$h" ] && [ "$w" -ge 1024 ]; } || { echo "$f: ${w}x$h, not a square of >= 1024 px"; return 1; }
  [ "$(tail -c 8 "$f" | od -An -tx1 | tr -d ' \n')" = "49454e44ae426082" ] || { echo "$f: no IEND chunk at the end"; return 1; }
  echo "$f ${w}x$h ok"
}
for ph in baseline final; do
  expect_run "the $ph confusion matrix as PNG (37 x 37, square)" 0 "ok$" -- confusion_png "results/pets_sweep_confusion_1_$ph.png"
done
find_python "h5py, numpy"
if [ -n "$PY" ]; then
  expect_run "the trial's results: 37 labels, a 37 x 37 confusion matrix over the 5 test images" 0 "^ok 5$" -- "$PY" -c "
import glob, h5py
f = h5py.File(glob.glob('results/pets_sweep/trial-*.h5')[0], 'r')
ev = f['eval/final']
assert len(ev['labels']) == 37 and ev['confusion'].shape == (37, 37), (len(ev['labels']), ev['confusion'].shape)
print('ok', int(ev['confusion'][:].sum()))"
else
  skip_unless_ci "the results file's contents (h5py: run ./setup.sh)"
fi
# pan & scan (Gemma 3's processor's do_pan_and_scan): wide.jpg (1000 x 300) is seen with its 3
# crops, tall.jpg with 2, each crop 4 more soft tokens and the processor's sentence around them
# (the ids are checked against transformers in test_vision): max_length 96 no longer holds the
# wide image's example; at 128 a second trial trains on the longer data
expect_run "pan_and_scan = true --dry-run: the crops' tokens counted (an example of 100 tokens at max_length 96)" 0 \
  "max_length 96 \(pan & scan\) rejects [0-9]+ examples? while tokenizing \(first: pets/annotations/trainval.txt:[0-9]+: the prompt takes 100 tokens" -- \
  "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set pan_and_scan=true --dry-run
expect_run "pan_and_scan = true: a second trial trains and evaluates" 0 "trial 1/1  [0-9a-f]+ .*final accuracy" -- \
  "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}" --set pan_and_scan=true --set max_length=128
if [ -n "$PY" ]; then
  expect_run "its trial file: pan_and_scan recorded, other training data, the image path planned for the crops too" 0 "^ok$" -- "$PY" -c "
import glob, h5py
fs = [h5py.File(p, 'r') for p in glob.glob('results/pets_sweep/trial-*.h5')]
pas = [f for f in fs if f['config'].attrs['pan_and_scan'] == 1]
plain = [f for f in fs if f['config'].attrs['pan_and_scan'] == 0]
assert len(pas) == 1 and len(plain) == 1, (len(pas), len(plain))
a, b = pas[0], plain[0]
assert a['provenance'].attrs['data_train_sha256'] != b['provenance'].attrs['data_train_sha256'], 'same data with and without'
# a micro-batch of 4 examples: up to 4 x (1 + 3 crops) = 16 images through the tower, 4 without
for k in ('planned_vision_tower', 'planned_images'):
    assert a['memory'].attrs[k] > b['memory'].attrs[k], (k, a['memory'].attrs[k], b['memory'].attrs[k])
print('ok')"
fi
sum_before=$(sha256sum results/pets_sweep.h5 | cut -d' ' -f1)
# the data set's errors, each before any work
cp pets/annotations/test.txt test.keep
echo "Abyssinian_2 38 1 1" >> pets/annotations/test.txt
expect_run "a class id out of range: file and line" 2 "pets/annotations/test.txt:6: class id 38 is outside 1\.\.37" -- \
  "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}"
cp test.keep pets/annotations/test.txt
echo "Bengal_2 1 1 1" >> pets/annotations/test.txt
expect_run "a name against its class id: file and line" 2 "test.txt:6: image Bengal_2 has class id 1 \(Abyssinian\), but its name says Bengal" -- \
  "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}"
cp test.keep pets/annotations/test.txt
echo "Abyssinian_1 1 1 1" >> pets/annotations/test.txt
expect_run "an image in both splits: both lines named" 2 "test.txt:6: image Abyssinian_1 is listed again \(first at pets/annotations/trainval.txt:1\): an image in both splits" -- \
  "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}"
cp test.keep pets/annotations/test.txt
mv pets/images/beagle_1.jpg beagle.keep
expect_run "a breed whose only training image is missing: the label and the image named" 2 \
  "classify.labels: 'beagle' has no example in the data \(its examples' images could not be used: pets/annotations/trainval.txt:5: .*beagle_1.jpg" -- \
  "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}"
mv beagle.keep pets/images/beagle_1.jpg
rm pets/annotations/test.txt
expect_run "a missing annotation file: named" 2 "pets/annotations/test.txt: .*annotations.tar.gz" -- \
  "$GM" "$SRC/experiments/pets_sweep.lua" "${SET[@]}"
[ "$(sha256sum results/pets_sweep.h5 | cut -d' ' -f1)" = "$sum_before" ] && { pass=$((pass + 1)); echo "ok    results/pets_sweep.h5 unchanged by the refused runs"; } \
  || { fail=$((fail + 1)); echo "FAIL  results/pets_sweep.h5 changed"; }
finish
