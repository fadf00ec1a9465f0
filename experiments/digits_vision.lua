-- experiments/digits_vision.lua - real handwritten digits through the whole image path.
--
-- OpenCV's digits.png (Debian opencv-doc; data_sources.md §2): 5,000 real handwritten digits,
-- 20 x 20 pixels, 500 per class, each class filling 5 rows of a 100 x 50 grid. Every 5th cell of
-- a class is held out for testing (100 per class), the rest train (400); `train` / `test` below
-- take the first 200 / 50 of each (DIGITS_TRAIN / DIGITS_TEST change them) so that the sweep runs
-- in about 20 minutes on 2 cores.
--
-- No pretrained tower small enough to train here can be downloaded, so the model is the real
-- Gemma 3 270M (GGUF Q4_K_M, its weights as stored, in f32) with a new, untrained SigLIP-shaped
-- tower (with_vision_tower: written once into the cache, 1 GB): 2 encoder layers of width 128 over
-- a 32 x 32 image taken as one 32-pixel patch, so each digit is one soft token. The projector trains
-- fully (modules_to_save), with LoRA on the tower's linears and the decoder's. (With 16 tokens of
-- 4-pixel patches, 2 x 2-pooled, the untrained tower gave chance, 10.0%, after 126 steps where one
-- token gave 29%: the decoder learns to read one token much sooner.)
-- README.md and docs/experiments.md give the measured accuracy; tests/e2e/vision_tower.sh runs
-- this file on a few digits.
-- a count from the environment, or the default; anything but a whole number >= 1 is an error
local function count(name, default)
  local v = env(name, default)
  local n = math.tointeger(tonumber(v))
  if not n or n < 1 then error(string.format("%s = %q: give a whole number >= 1", name, v), 0) end
  return n
end

local digits = data.image_grid {
  path = env("DIGITS_PNG", "/usr/share/doc/opencv-doc/examples/data/digits.png"),
  cell = 20,
  labels = { "0", "1", "2", "3", "4", "5", "6", "7", "8", "9" },
  split = 5,
  train = count("DIGITS_TRAIN", "200"),
  test = count("DIGITS_TEST", "50"),
}

return experiment {
  name  = "digits_vision",
  model = with_vision_tower {
    text = "gemma3-270m",
    hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 4, intermediate_size = 512,
    image_size = 32, patch_size = 32, mm_tokens_per_image = 1, seed = 1,
  },
  task  = classify { data = digits, prompt = "Which digit is this?" },
  train = { epochs = 2, batch = 8, lr = 1e-3, rank = 8, alpha = 16, targets = "all-linear",
            vision_targets = "all-linear", modules_to_save = "multi_modal_projector",
            max_length = 64, warmup = 0.05, schedule = "cosine" },
  sweep = grid { lr = { 1e-3, 2e-3 } },
  seeds = { 1 },
  report = table { rows = { "rank" }, cols = { "lr" }, metric = "accuracy" },
}
