-- tests/device/bench_cuda.lua - the gemmarun side of the GPU benchmark (issue 11 item 5), run by
-- tests/device/run.sh once per configuration (one process each: its own peak memory):
-- LoRA rank 16, alpha 32, on every linear layer (all-linear: q/k/v/o/gate/up/down, as the peer's
-- PEFT config), batch BENCH_BATCH of BENCH_MAX_LEN tokens (the chat examples are longer: each is
-- truncated to exactly max_length), activation checkpointing off, BENCH_STEPS optimizer steps,
-- on the device `device = "cuda"` selects. run.sh reads tokens/s per step and the memory from
-- the trial file (results/<name>/trial-*.h5) with h5py; the first step is the warm-up.
-- Settings from the environment (run.sh sets them):
--   GEMMA_MODEL        a Hugging Face folder (tests/device/make_checkpoints.py writes random ones)
--   BENCH_DATA         a chat JSONL; BENCH_TEST the (one-example) test file the runner evaluates
--   BENCH_MAX_LEN, BENCH_BATCH, BENCH_STEPS, BENCH_QUANT (stored = bf16 as in the file | nf4)
--   BENCH_NAME         the results folder's name
--   GM_BENCH_DEVICE    cuda (default) or cpu: cpu leaves the device field out (a CPU check of this
--                      file on a build without the field)
local dev = env("GM_BENCH_DEVICE", "cuda")
return experiment {
  name = env("BENCH_NAME", "bench_cuda"),
  description = "GPU benchmark: LoRA training step throughput (tests/device/run.sh)",
  model = env("GEMMA_MODEL", "gemma3-270m"),
  device = dev ~= "cpu" and dev or nil,
  task = sft { data = data.jsonl { train = env("BENCH_DATA", "bench.jsonl"), test = env("BENCH_TEST", "bench_test.jsonl") } },
  train = {
    rank = 16, alpha = 32, targets = "all-linear", dropout = 0,
    batch = math.tointeger(tonumber(env("BENCH_BATCH", "1"))),
    max_length = math.tointeger(tonumber(env("BENCH_MAX_LEN", "512"))),
    max_steps = math.tointeger(tonumber(env("BENCH_STEPS", "4"))),
    epochs = 1, lr = 1e-4, schedule = "constant", warmup = 0,
    quant = env("BENCH_QUANT", "stored"), checkpointing = false,
    checkpoint_every = 1000000, -- no resumable checkpoint inside the timed steps
  },
  seeds = { 1 },
  threads = math.tointeger(tonumber(env("BENCH_THREADS", "8"))),
  report = table { rows = { "quant" }, cols = { "max_length" }, metric = "tokens_per_s" },
}
