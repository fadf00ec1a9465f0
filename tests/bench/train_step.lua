-- tests/bench/train_step.lua - one training configuration on the real Gemma 3 270M: step time,
-- the memory plan computed from the config alone (gm.plan, as `gemmarun plan` prints it) and the
-- process's measured peak RSS, as one Markdown table row:
-- | quant | ckpt | rank | batch | max_length | step s | planned MiB | measured MiB | difference | Run by tests/bench/bench_train.sh, once per
-- configuration (peak RSS is per process). Settings come from the environment:
--   QUANT (stored|f32|bf16|nf4|int8), CKPT (0|1), RANK, MAX_LEN, BATCH, STEPS, THREADS, COMPUTE (auto|bf16|f32)
local quant = env("QUANT", "stored")
local ckpt = env("CKPT", "0") == "1"
local rank = math.tointeger(tonumber(env("RANK", "16")))
local max_len = math.tointeger(tonumber(env("MAX_LEN", "256")))
local batch = math.tointeger(tonumber(env("BATCH", "1")))
local steps = math.tointeger(tonumber(env("STEPS", "4")))
local compute = env("COMPUTE", "auto")

local m <close> = gm.load_model(env("GEMMA_MODEL", "gemma3-270m"))
local ds <close> = gm.dataset(m)
-- responses long enough to fill max_length: several fortunes joined, truncated by add_chat
local f = gm.fortunes("science", { max_chars = 2000 })
local k = 1
for i = 1, batch * steps + batch do
  local parts = {}
  for j = 1, 12 do parts[j] = f[(k + j) % #f + 1] end
  k = k + 12
  assert(ds:add_chat({ { role = "user", content = "Tell me about science." },
                       { role = "assistant", content = table.concat(parts, "\n") } }, { max_length = max_len }))
end
local opts = { rank = rank, alpha = 2 * rank, targets = "all-linear", quant = quant,
  batch = batch, max_length = max_len, checkpointing = ckpt, lr = 1e-4, steps = steps + 1,
  compute = compute }
local plan = gm.plan(env("GEMMA_MODEL", "gemma3-270m"), opts) -- from the config alone
local tr <close> = m:trainer(opts)
local planned = plan.total
local times = {}
local supervised = 0
for s = 0, steps do
  local idx = {}
  for b = 1, batch do idx[b] = s * batch + b end
  local t0 = gm.clock()
  local st = tr:step(ds, idx)
  if s > 0 then times[#times + 1] = gm.clock() - t0 end -- step 0 is the warm-up (page faults)
  assert(st.tokens > 0)
  if s > 0 then supervised = supervised + st.tokens end
end
table.sort(times)
-- a real run writes resumable checkpoints: its in-memory image is part of the peak
tr:save("results/bench/train_step.ckpt.h5", { epoch = 0, pos = steps })
gm.remove_checkpoint("results/bench/train_step.ckpt.h5")
local peak = gm.peak_rss()
print(string.format("| %-6s | %-3s | %d | %d | %d | %.2f | %.1f | %.1f | %+.1f%% |",
  quant, ckpt and "on" or "off", rank, batch, max_len, times[(#times + 1) // 2], planned / 2^20, peak / 2^20,
  100 * (peak - planned) / planned))
-- for tests/bench/bench_speed.py: supervised positions a step (the LM head's FLOPs), the compute dtype
if env("SUPERVISED", "0") == "1" then
  print(string.format("supervised %d compute %s", supervised // steps, gm.compute_dtype(compute, "cpu")))
end
