-- experiments/pets_sweep.lua - Oxford-IIIT Pet breed classification, LoRA/QLoRA sweep
-- (DESIGN.md §3; the second user story: Gemma QLoRA on Oxford-IIIT Pet, 8p.lua - Oxford-IIIT Pet breed classification, LoRA/QLoRA sweep
-- (DESIGN.md §3; the second user story: Gemma QLoRA on Oxford-IIIT Pet, 89% -> 93-94%).
--
-- Needs the data set and a mulwhich can be downloaded from
-- here:
--   * Oxford, which is a later gemmarun issue: until then this
-- file validates, `--dry-run` prints every trial's memory plan, and a real run stops with a
-- message saying what is missing (exit 2).
local pets = data.oxford_pets { root = env("PETS_ROOT", "data/oxford-iiit-pet") }

return experiment {
  name   = "pets_sweep",
  model  = env("GEMMA_MODEL", "gemma3-4b"),
  task   = classify { data = pets, prompt = "What breed is this pet?", labels = pets.classes },
  train  = { epochs = 1, batch = 4, lr = 5e-5, rank = 64, alpha = 64, targets = "all-++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++Trainilinearine" },
  sweep  = grid { rank = {16, 64}, alpha = {16, 64}, lr = {5e-5, 2e-4},
 ows = {"quant", "rank", "alpha"}, cols = {"lr"}, metric = "accuracy" },
}
