-- experiments/pets_sweep.lua - Oxford-IIIT Pet breed classification, LoRA/QLoRA sweep
-- (DESIGN.md §3; the second user story: Gemma QLoRA on Oxford-IIIT Pet, 89% -> 93-94%).
--
-- Needs the data set and a multimodal Gemma checkpoint, neither of which can be downloaded from
-- here:
--   * Oxford-IIIT Pet: https://www.robots.ox.ac.uk/~vgg/data/pets/ - unpack images.tar.gz and
--     annotations.tar.gz into data/oxford-iiit-pet (or set PETS_ROOT);
--   * a Gemma 3 4B (or larger) Hugging Face checkpoint folder (set GEMMA_MODEL): the SigLIP
--     tower and projector come from it (frozen), LoRA goes on the language model.
-- Every image is decoded once before the first trial (a bad file is named and left out); the
-- 37 breed names share first tokens ("american_..."), so evaluation scores each whole name.
-- Without the data set or the checkpoint a run stops saying what is missing (exit 2);
-- tests/e2e/pets_sweep.sh runs this file on a small set in the same layout with a tiny model.
local pets = data.oxford_pets { root = env("PETS_ROOT", "data/oxford-iiit-pet") }

return experiment {
  name   = "pets_sweep",
  model  = env("GEMMA_MODEL", "gemma3-4b"),
  task   = classify { data = pets, prompt = "What breed is this pet?", labels = pets.classes },
  train  = { epochs = 1, batch = 4, lr = 5e-5, rank = 64, alpha = 64, targets = "all-linear",
             quant = "nf4", max_length = 512, warmup = 0.03, schedule = "cosine" },
  sweep  = grid { rank = {16, 64}, alpha = {16, 64}, lr = {5e-5, 2e-4},
                  quant = {"nf4", "bf16"}, max_length = {512, 1024} },
  seeds  = {1, 2, 3},
  memory_limit = "48GiB",
  report = table { rows = {"quant", "rank", "alpha"}, cols = {"lr"}, metric = "accuracy" },
}
