-- experiments/quickstart.lua - the embedded default: what `gemmarun` runs with no arguments.
--
-- LoRA / QLoRA on the real Gemma 3 270M (base model, GGUF Q4_K_M; `gemmarun fetch gemma3-270m`)
-- for topic classification of real quotes from Debian's fortunes package (apt-get install
-- fortunes): which of 5 topic files a quote comes from. The split is fixed: for each topic, the
-- first 24 entries of at most 250 characters (file order) train, the next 16 test - 120 training
-- and 80 test examples. The model answers with the topic name; accuracy is by label scoring (the
-- highest logit among the five topic names' first tokens at the start of the answer).
--
-- First the zero-shot baseline (the base model, no fine-tuning), then a small sweep: learning
-- rate x base-weight precision (the Q4_K_M weights as stored, or re-quantized to NF4 as in QLoRA)
-- x 2 seeds = 8 trials of one epoch (30 steps of 4 examples), about 10 minutes on 2 cores.
-- Results: results/quickstart/ (one file per trial), results/quickstart.{h5,md,tex,csv}, plots.
-- Run it again and finished trials are kept; Ctrl-C checkpoints and the next run resumes.
local topics = data.fortunes {
  topics = { "computers", "food", "love", "science", "sports" },
  train = 24, test = 16, max_chars = 250,
}

return experiment {
  name = "quickstart",
  description = "Gemma 3 270M, LoRA rank 8 on all linear layers: fortunes topic classification",
  model = env("GEMMA_MODEL", "gemma3-270m"),
  task = classify {
    data = topics,
    prompt = "Which topic is this quote about? Answer with one word: computers, food, love, science or sports.",
  },
  train = { epochs = 1, batch = 4, rank = 8, alpha = 16, targets = "all-linear", max_length = 112,
            lr = 1e-3, schedule = "constant", checkpoint_every = 10 },
  sweep = grid { lr = { 3e-4, 1e-3 }, quant = { "stored", "nf4" } },
  seeds = { 1, 2 },
  report = table { rows = { "quant" }, cols = { "lr" }, metric = "accuracy" },
}
