-- tests/bench/threads_logits.lua - do the real 270M's prompt logits depend on the thread count?
-- Prefill's GEMMs run in OpenBLAS, whose rounding can differ between 1 and 2 threads; where a
-- greedy margin is that thin, generated text moves with --threads (docs/benchmarks.md, "Decoding
-- takes the int8 dots by default"). Prints how many of the logits after every prompt position
-- differ and by how much:
--   build/gemmarun tests/bench/threads_logits.lua
local prompt = os.getenv("PROMPT") or "The capital of France is"
local res = {}
for _, th in ipairs({ 1, 2 }) do
  local m <close> = gm.load_model(os.getenv("GEMMA_MODEL") or "gemma3-270m", { threads = th })
  res[th] = m:logits(prompt, { all = true })
end
local differ, worst = 0, 0
for i = 1, #res[1] do
  local d = math.abs(res[1][i] - res[2][i])
  if d > 0 then differ = differ + 1 end
  if d > worst then worst = d end
end
print(string.format("%d of %d logits differ between 1 and 2 threads, by at most %.3g", differ, #res[1], worst))
