-- experiments/tuxpaint_animals.lua - real animal photos by coarse class through the whole image path.
--
-- Tux Paint's stamps (Debian tuxpaint-stamps-default; data_sources.md §2): photos of animals cut
-- out on a transparent background (PNG alpha, composited on white as Gemma 3's processor does),
-- median 196 x 161 pixels, filed by kind: animals/<class>/..., mammals further by family
-- (mammals/dogs/dog.png). The label is the folder directly below animals/, whatever lies between:
-- four classes, birds / mammals / fish / insects, as Tux Paint files them (its "fish" holds a
-- lobster, a shrimp and a seahorse; its "insects" a slug, a woodlouse and spiders). Left out:
-- the groups too small to learn and test (amphibians 2, dinosaur 1, lizards 1, marsupials 4,
-- shellfish 2 images), and the drawings among the photos (the cartoon/ and toys/ folders, 17
-- images, 11 of them insects'). What is left: 119 photos, birds 35, mammals 64, fish 11,
-- insects 9. Every 3rd image of a class, in path order, is held out for testing (38: 11 / 21 /
-- 3 / 3): a fixed split, stratified by class. Mammals are 21 of the 38 (55.3%): a model that
-- always answers "mammals" scores that, where chance is 25%. The run prints both counts.
--
-- The model is digits_vision.lua's: the real Gemma 3 270M (GGUF Q4_K_M, as stored, in f32) with a
-- new, untrained SigLIP-shaped tower (with_vision_tower; the same spec, so the same folder in the
-- cache): 2 encoder layers of width 128 over the image resized to 32 x 32 and taken as one patch,
-- one soft token per photo; LoRA on the tower's linears and the decoder's, the projector trained
-- fully. With 81 training photos an epoch is 11 steps of 8: 10 epochs, two learning rates, three
-- seeds (the split is fixed; the seed draws the adapters and the order of the examples).
-- TUXPAINT_ROOT names another folder of the same layout (tests/e2e/vision_tuxpaint.sh gives it a
-- few photos per class). README.md and docs/experiments.md give the measured accuracy.
local animals = data.image_folder {
  root = env("TUXPAINT_ROOT", "/usr/share/tuxpaint/stamps/animals"),
  labels = { "birds", "mammals", "fish", "insects" },
  exclude = { "cartoon", "toys" },
  test = 3,
}

return experiment {
  name  = "tuxpaint_animals",
  model = with_vision_tower {
    text = "gemma3-270m",
    hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 4, intermediate_size = 512,
    image_size = 32, patch_size = 32, mm_tokens_per_image = 1, seed = 1,
  },
  task  = classify { data = animals, prompt = "Which class of animal is this: birds, mammals, fish or insects?" },
  train = { epochs = 10, batch = 8, lr = 1e-3, rank = 8, alpha = 16, targets = "all-linear",
            vision_targets = "all-linear", modules_to_save = "multi_modal_projector",
            max_length = 64, warmup = 0.05, schedule = "cosine" },
  sweep = grid { lr = { 5e-4, 1e-3 } },
  seeds = { 1, 2, 3 },
  report = table { rows = { "rank" }, cols = { "lr" }, metric = "accuracy" },
}
