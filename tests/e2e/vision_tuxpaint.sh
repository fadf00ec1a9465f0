# End-to-end: experiments/tuxpaint_animals.lua - real animal photos (Tux Paint's stamps, Debian
# tuxpaint-stamps-default) by coarse class through the real Gemma 3 270M with a new vision tower:
#   - on the installed stamps (--dry-run): the four classes read from their folders and every
#     folder below them (mammals/dogs/dog.png is a mammal), the drawings (cartoon/, toys/) and the
#     small groups left out and named, each class's fixed train/test split, the majority share;
#   - on a few photos per class copied in the same layout (TUXPAINT_ROOT), one epoch: the
#     baseline, training of the tower's LoRA, the projector and the decoder's LoRA, the final
#     accuracy, the results file, the table and the confusion matrix PNG.
# The tower is vision_tower.sh's (the same spec: the same folder in the cache).
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
STAMPS=/usr/share/tuxpaint/stamps/animals
EXP="$SRC/experiments/tuxpaint_animals.lua"
if [ ! -d "$STAMPS" ]; then
  skip_unless_ci "tuxpaint_animals.lua: $STAMPS is missing (Debian tuxpaint-stamps-default; setup.sh installs it)"
  finish
  exit
fi
REAL=$(real_model) || { fail=$((fail + 1)); echo "FAIL  the real model is missing"; finish; exit; }
# the whole set: 119 photos in four classes, every 3rd of a class held out
expect_run "the installed stamps: four classes from their folders and the folders below them, split per class" 0 \
  "data.image_folder: $STAMPS: examples per label \(train/test, every 3rd of a label's is a test example\): birds 24/11, mammals 43/21, fish 8/3, insects 6/3; the most frequent, mammals, is 21 of the 38 test examples \(55.3%\)" \
  -- "$GM" "$EXP" --dry-run
expect_run "... the small groups and the drawings left out, named; 81 training and 38 test photos, 6 trials" 0 \
  "left out: label folders not in labels: amphibians, dinosaur, lizards, marsupials, shellfish; 5 folders named cartoon or toys \(exclude\).*data: 81 training and 38 test examples, labels birds, mammals, fish, insects.*trial  6 " \
  -- "$GM" "$EXP" --dry-run
# a few photos per class in the same layout: 3 per class (mammals 4, from three families' folders),
# every 3rd a test photo; a drawing and a marsupial that must be left out
few=(birds/crow.png birds/owl.png birds/penguin.png birds/cartoon/tux.png
     mammals/elephant.png mammals/dogs/dog.png mammals/cats/tiger.png mammals/bovines/cow.png mammals/bears/cartoon/teddy_bear.png
     fish/clownfish.png fish/lionfish.png fish/seahorse.png
     insects/bee.png insects/fly.png insects/mantis.png insects/cartoon/butterfly.png
     marsupials/koala.png)
for f in "${few[@]}"; do mkdir -p "animals/$(dirname "$f")" && cp "$STAMPS/$f" "animals/$f"; done
RUN=(env TUXPAINT_ROOT=animals "$GM" "$EXP" --set lr=1e-3 --set seeds=1 --set epochs=1)
expect_run "a few photos per class: mammals counted from the folders below mammals/, the drawings and koala left out" 0 \
  "birds 2/1, mammals 3/1, fish 2/1, insects 2/1; the most frequent, birds, is 1 of the 4 test examples \(25.0%\); left out: label folders not in labels: marsupials; 3 folders named cartoon \(exclude\).*data: 9 training and 4 test examples.*trial  1 " \
  -- "${RUN[@]}" --dry-run
expect_run "tuxpaint_animals.lua: trains the tower's LoRA, the projector and the decoder's LoRA; scores the 4 test photos" 0 \
  "baseline accuracy.*step 2/2.*final .*accuracy" -- "${RUN[@]}"
expect_run "... its results file, the table and the confusion matrix" 0 "^ok$" -- bash -c "
  ls results/tuxpaint_animals/trial-*.h5 >/dev/null && grep -q 'tuxpaint_animals: accuracy' results/tuxpaint_animals.md &&
  ls results/tuxpaint_animals_confusion_1_final.png >/dev/null && echo ok"
finish
